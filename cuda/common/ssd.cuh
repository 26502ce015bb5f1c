// common/ssd.cuh: what the Mamba-2 SSD families share (cuda/ssd.cu forward, cuda/ssd_bwd.cu
// backward): the parameter block, the tile constants, the chunk prologue (dt', cum, seg of one
// chunk), the warp-level tensor-core product over f32 shared-memory operands, and the chunk-output
// product y_pre = C.H^T (carried state) + W x (intra-chunk) for one 64 x 64 tile. The math and the
// decomposition are stated at the top of cuda/ssd.cu.
#pragma once

#if !defined(FS_DTYPE) || !defined(FS_CHUNK)
#error "the host prelude must define FS_DTYPE and FS_CHUNK"
#endif

#include "common/copy.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"

using namespace fs;

// One by-value parameter block for the three kernels (sizeof 488). Strides in elements; the last
// dimension of x, z, out, B and C is contiguous (checked by the host).
struct SsdParams {
    const void* x;        // (batch, seqlen, nheads, headdim) FS_DTYPE
    const void* dt;       // (batch, seqlen, nheads), dtype dt_dtype
    const void* A;        // (nheads,), dtype A_dtype
    const void* B;        // (batch, seqlen, ngroups, dstate) FS_DTYPE
    const void* C;        // (batch, seqlen, ngroups, dstate) FS_DTYPE
    const void* D;        // (nheads,) or (nheads, headdim), dtype D_dtype, or null
    const void* z;        // like x, or null
    const void* dt_bias;  // (nheads,), dtype bias_dtype, or null
    const void* init;     // (batch, nheads, headdim, dstate), dtype init_dtype, or null
    const int* seq_idx;   // (batch, seqlen) int32, or null
    void* out;            // like x
    float* states;        // workspace (batch, nchunks, nheads, headdim, dstate) fp32, contiguous
    float* decay;         // workspace (batch, nheads, nchunks) fp32, contiguous
    float* final_states;  // (batch, nheads, headdim, dstate) fp32, or null
    i64 batch, seqlen, nheads, headdim, ngroups, dstate, nchunks;
    i64 x_s[3], dt_s[3], B_s[3], C_s[3], z_s[3], out_s[3];  // (batch, seqlen, head or group)
    i64 init_s[4], final_s[4];
    i64 seq_s[2], D_s[2];  // D: (head, channel); channel stride 0 for a (nheads,) D
    i64 A_s, bias_s;
    float dt_min, dt_max;
    int dt_dtype, A_dtype, D_dtype, bias_dtype, init_dtype;
    // 1: fp32 x and B whose rows start 16-byte aligned and hold a multiple of 4 elements:
    // ssd_chunk_state loads them 16 bytes at a time (set by the backward's recompute; 0 on forwards)
    int vec_xb;
    int has_D, has_z, has_dt_bias, has_init, has_seq, has_final, softplus;
    // 1: fp32 data that came from 16-bit tensors (exact in tf32): the products of ssd_chunk_state
    // may round their operands to tf32 once instead of 3xTF32 (set by the second backward path's
    // recompute only; 0 on every forward call)
    int tf32x1;
};
static_assert(sizeof(SsdParams) == 488, "SsdParams layout changed: update the host mirror");

constexpr int DT = FS_DTYPE;
constexpr int kQ = FS_CHUNK;
constexpr int kThreads = 128;
constexpr int kTile = 64;  // rows and columns of an output tile; rows 16w .. 16w+15 belong to warp w
constexpr int kK = 32;     // reduction step staged in shared memory (positions or states)
constexpr int kPassThreads = 256;
static_assert(kQ == 64 || kQ == 128 || kQ == 256, "FS_CHUNK: 64, 128 or 256");

// A small array's element in the dtype given at run time (0 fp16, 1 bf16, 2 fp32): uniform branch.
__device__ __forceinline__ float ld_any(const void* base, i64 idx, int code) {
    if (code == 2) return ldg_f32<2>(base, idx);
    if (code == 1) return ldg_f32<1>(base, idx);
    return ldg_f32<0>(base, idx);
}

__device__ __forceinline__ int seq_at(const SsdParams& p, i64 b, i64 t) {
    return __ldg(p.seq_idx + b * p.seq_s[0] + t * p.seq_s[1]);
}

// acc[NT][4] += A (16 x K) * B (K x 8 NT) for one warp; a(m, k), b(k, n) read f32 operands (shared
// memory). Fragments per mma.cuh: lane 4g + t. fp16/bf16: m16n8k16, operands rounded by pack2;
// fp32: m16n8k8 3xTF32 (A split once per k step, B split per mma).
template <int K, int NT, class FA, class FB>
__device__ __forceinline__ void warp_mma(float (&acc)[NT][4], const FA& a, const FB& b) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    if constexpr (DT == 2) {
#pragma unroll
        for (int k0 = 0; k0 < K; k0 += 8) {
            const float af[4] = {a(g, k0 + t), a(g + 8, k0 + t), a(g, k0 + t + 4), a(g + 8, k0 + t + 4)};
            u32 hi[4], lo[4];
            split4(af, hi, lo);
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_3xtf32(acc[j], hi, lo, b(k0 + t, 8 * j + g), b(k0 + t + 4, 8 * j + g));
        }
    } else {
#pragma unroll
        for (int k0 = 0; k0 < K; k0 += 16) {
            const int k = k0 + 2 * t;
            const u32 af[4] = {pack2<DT>(a(g, k), a(g, k + 1)), pack2<DT>(a(g + 8, k), a(g + 8, k + 1)),
                               pack2<DT>(a(g, k + 8), a(g, k + 9)), pack2<DT>(a(g + 8, k + 8), a(g + 8, k + 9))};
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const int n = 8 * j + g;
                mma16<DT>(acc[j], af, pack2<DT>(b(k, n), b(k + 1, n)), pack2<DT>(b(k + 8, n), b(k + 9, n)));
            }
        }
    }
}

// warp_mma with a run-time choice for fp32 data: `fast` rounds each operand to tf32 once (one
// m16n8k8 per tile instead of three); 16-bit data ignores it.
template <int K, int NT, class FA, class FB>
__device__ __forceinline__ void warp_mma_q(float (&acc)[NT][4], const FA& a, const FB& b, bool fast) {
    if constexpr (DT == 2) {
        if (fast) {
            const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
            for (int k0 = 0; k0 < K; k0 += 8) {
                const u32 af[4] = {to_tf32(a(g, k0 + t)), to_tf32(a(g + 8, k0 + t)), to_tf32(a(g, k0 + t + 4)),
                                   to_tf32(a(g + 8, k0 + t + 4))};
#pragma unroll
                for (int j = 0; j < NT; ++j) {
                    const int n = 8 * j + g;
                    mma_tf32(acc[j], af, to_tf32(b(k0 + t, n)), to_tf32(b(k0 + t + 4, n)));
                }
            }
            return;
        }
    }
    warp_mma<K, NT>(acc, a, b);
}

// Row (within the 64-row tile) and column (within 8 NT columns) of accumulator element acc[j][e].
__device__ __forceinline__ int acc_row(int e) { return 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int acc_col(int j, int e) { return 8 * j + 2 * (threadIdx.x & 3) + (e & 1); }

// A lane's kQ/32 dt values at positions c0 + lane * kQ/32 + i (clamped to len - 1: every address
// is inside the sequence), in dt's dtype DTC: every load issued before any value is used.
template <int DTC>
__device__ __forceinline__ void lane_dt(float (&raw)[kQ / 32], const SsdParams& p, i64 b, i64 h, i64 c0, int len,
                                        int lane) {
    constexpr int kPer = kQ / 32;
    const i64 base = b * p.dt_s[0] + h * p.dt_s[2];
#pragma unroll
    for (int i = 0; i < kPer; ++i) raw[i] = ldg_f32<DTC>(p.dt, base + (c0 + min(lane * kPer + i, len - 1)) * p.dt_s[1]);
}

// lane_dt in dt's run-time dtype (the branch taken once, outside the loads).
__device__ __forceinline__ void lane_dt_any(float (&raw)[kQ / 32], const SsdParams& p, i64 b, i64 h, i64 c0, int len,
                                            int lane) {
    if (p.dt_dtype == 2) lane_dt<2>(raw, p, b, h, c0, len, lane);
    else if (p.dt_dtype == 1) lane_dt<1>(raw, p, b, h, c0, len, lane);
    else lane_dt<0>(raw, p, b, h, c0, len, lane);
}

// D at a thread's 16 epilogue columns p0 + 8 jn + t2 + u (0 at or past hd, or without D), in D's
// dtype DTC, all 16 loads in flight at once (each in its own branch went one at a time).
template <int DTC>
__device__ __forceinline__ void lane_d_typed(float (&dv)[8][2], const SsdParams& p, i64 h, int p0, int hd, int t2) {
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int col = 8 * jn + t2 + u;
            const float v = ldg_f32<DTC>(p.D, h * p.D_s[0] + (p0 + min(col, hd - 1)) * p.D_s[1]);
            dv[jn][u] = col < hd ? v : 0.f;
        }
}
// A compile-time flag for a generic lambda's argument (`[&](auto f) { constexpr bool k = decltype(f)::value; }`),
// so one body serves a checked and an unchecked instantiation.
template <bool B>
struct Flag {
    static constexpr bool value = B;
};

// D at channel col of head h: one load in D's run-time dtype (0 without D or where !valid). The
// second-path scans stage a tile's 64 of these in shared memory, one load a thread.
__device__ __forceinline__ float channel_d(const SsdParams& p, i64 h, int col, bool valid) {
    return p.has_D && valid ? ld_any(p.D, h * p.D_s[0] + col * p.D_s[1], p.D_dtype) : 0.f;
}
__device__ __forceinline__ void lane_d(float (&dv)[8][2], const SsdParams& p, i64 h, int p0, int hd, int t2) {
    if (!p.has_D) {
#pragma unroll
        for (int jn = 0; jn < 8; ++jn) dv[jn][0] = dv[jn][1] = 0.f;
    } else if (p.D_s[1] == 0) {  // one D a head (nheads,): one load, not 16
        const float v = channel_d(p, h, 0, true);
#pragma unroll
        for (int jn = 0; jn < 8; ++jn)
#pragma unroll
            for (int u = 0; u < 2; ++u) dv[jn][u] = 8 * jn + t2 + u < hd ? v : 0.f;
    } else if (p.D_dtype == 2) {
        lane_d_typed<2>(dv, p, h, p0, hd, t2);
    } else if (p.D_dtype == 1) {
        lane_d_typed<1>(dv, p, h, p0, hd, t2);
    } else {
        lane_d_typed<0>(dv, p, h, p0, hd, t2);
    }
}

// The scan of warp_chunk_prologue from a lane's raw dt values (raw[i] at position lane kQ/32 + i,
// any value past len) and the head's A and dt_bias (0 without): dt' in d, cum in cs, seg in sg.
__device__ __forceinline__ void warp_chunk_scan(const SsdParams& p, i64 b, i64 c0, int len, int lane, float A, float bias,
                                                const float (&raw)[kQ / 32], float (&d)[kQ / 32], float (&cs)[kQ / 32],
                                                int (&sg)[kQ / 32]) {
    constexpr int kPer = kQ / 32;
    float run = 0.f;
    int srun = 0;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int pos = lane * kPer + i;
        float v = 0.f;
        int start = 0;
        if (pos < len) {
            const i64 t = c0 + pos;
            v = raw[i] + bias;
            if (p.softplus) v = softplus(v);
            v = fminf(fmaxf(v, p.dt_min), p.dt_max);
            if (p.has_seq) start = seq_at(p, b, t) != (t > 0 ? seq_at(p, b, t - 1) : 0);
        }
        d[i] = v;
        run += v * A;
        cs[i] = run;
        srun += start;
        sg[i] = srun;
    }
    float tot = run;
    int stot = srun;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const float o = __shfl_up_sync(0xffffffffu, tot, off);
        const int so = __shfl_up_sync(0xffffffffu, stot, off);
        if (lane >= off) {
            tot += o;
            stot += so;
        }
    }
    const float ex = tot - run;
    const int sex = stot - srun;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        cs[i] += ex;
        sg[i] += sex;
    }
}

// A head's A and dt_bias (0 without) as floats.
__device__ __forceinline__ float head_A(const SsdParams& p, i64 h) { return ld_any(p.A, h * p.A_s, p.A_dtype); }
__device__ __forceinline__ float head_bias(const SsdParams& p, i64 h) {
    return p.has_dt_bias ? ld_any(p.dt_bias, h * p.bias_s, p.bias_dtype) : 0.f;
}

// One warp's share of chunk_prologue: lane `lane` gets positions lane * kQ/32 + i (i < kQ/32) in
// registers (dt' in d, cum in cs, seg in sg), the warp-wide prefix already added. The dt loads go
// first, all in flight at once (lane_dt, the dtype chosen once): with each load inside its
// position's branch (and ld_any's dtype branch) each waited for the one before.
__device__ __forceinline__ void warp_chunk_prologue(const SsdParams& p, i64 b, i64 h, i64 c0, int len, int lane,
                                                    float (&d)[kQ / 32], float (&cs)[kQ / 32], int (&sg)[kQ / 32]) {
    float raw[kQ / 32];
    lane_dt_any(raw, p, b, h, c0, len, lane);
    warp_chunk_scan(p, b, c0, len, lane, head_A(p, h), head_bias(p, h), raw, d, cs, sg);
}

// ---- the chunk prologue of kPrepHeads heads a CTA (ssd2_chunk_prep, ssd_bwd_prologue) -------------
// dt's rows are nheads elements apart, so a warp reading one head's positions touched a 32-byte
// sector per element (16x the useful bytes through L2 in 16 bits) and one-warp CTAs over every
// (batch, head, chunk) ran in more than one wave. A CTA of kPrepThreads instead reads dt for
// kPrepHeads consecutive heads at once (thread t: head t % kPrepHeads, positions t / kPrepHeads +
// (kPrepThreads / kPrepHeads) k; a warp's load covers 4 positions x 8 heads, 16-32 contiguous
// bytes each, every load in flight), transposes them through shared memory (s_raw, kPrepHeads rows
// of kLdRaw floats), and warp w scans heads w and w + kPrepWarps from it.
constexpr int kPrepHeads = 8;
constexpr int kPrepThreads = 128;
constexpr int kPrepWarps = kPrepThreads / 32;
constexpr int kLdRaw = kQ + 4;  // s_raw's row pitch: the transposing stores hit 32 distinct banks
static_assert(kPrepHeads == 2 * kPrepWarps, "each warp scans two heads");

// A thread's dt loads (see above), addresses clamped into the sequence and the heads (the caller's
// h), in dt's dtype DTC.
template <int DTC>
__device__ __forceinline__ void prep_dt(float (&raw)[kQ * kPrepHeads / kPrepThreads], const SsdParams& p, i64 b,
                                        i64 h, i64 c0, int len) {
    constexpr int kStep = kPrepThreads / kPrepHeads;
    const i64 base = b * p.dt_s[0] + h * p.dt_s[2];
#pragma unroll
    for (int k = 0; k < kQ * kPrepHeads / kPrepThreads; ++k)
        raw[k] = ldg_f32<DTC>(p.dt, base + (c0 + min((int)threadIdx.x / kPrepHeads + kStep * k, len - 1)) * p.dt_s[1]);
}

// dt of heads h0 .. h0 + kPrepHeads - 1 of chunk c0 / kQ, batch row b, into s_raw (row hh: head
// h0 + hh, kQ positions; rows of heads past nheads hold the last head's values), and the A / dt_bias
// of the calling warp's two heads (h0 + warp, h0 + warp + kPrepWarps; clamped to the last head),
// for a CTA of kPrepThreads. s_raw: kPrepHeads * kLdRaw floats, 16-byte aligned. Ends with a
// __syncthreads.
__device__ __forceinline__ void heads_dt_to_smem(const SsdParams& p, i64 b, i64 h0, i64 c0, int len, float* s_raw,
                                                 float& A0, float& A1, float& bias0, float& bias1) {
    constexpr int kLoads = kQ * kPrepHeads / kPrepThreads, kStep = kPrepThreads / kPrepHeads;
    const int warp = threadIdx.x >> 5;
    const int hh = threadIdx.x % kPrepHeads;
    const i64 hl = min(h0 + hh, p.nheads - 1);  // this thread's load head (clamped: its values unused)
    float raw[kLoads];
    if (p.dt_dtype == 2) prep_dt<2>(raw, p, b, hl, c0, len);
    else if (p.dt_dtype == 1) prep_dt<1>(raw, p, b, hl, c0, len);
    else prep_dt<0>(raw, p, b, hl, c0, len);
    // the warp's two heads' A and dt_bias, in flight with dt
    const i64 ha = min(h0 + warp, p.nheads - 1), hb = min(h0 + warp + kPrepWarps, p.nheads - 1);
    A0 = head_A(p, ha), A1 = head_A(p, hb), bias0 = head_bias(p, ha), bias1 = head_bias(p, hb);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) s_raw[hh * kLdRaw + (int)threadIdx.x / kPrepHeads + kStep * k] = raw[k];
    __syncthreads();
}

// N consecutive floats from src (16-byte aligned when N % 4 == 0, else 8-byte) by vector loads.
template <int N>
__device__ __forceinline__ void load_run(const float* src, float (&v)[N]) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N; i += 4) {
            const float4 t = *(const float4*)(src + i);
            v[i] = t.x, v[i + 1] = t.y, v[i + 2] = t.z, v[i + 3] = t.w;
        }
    } else {
        static_assert(N % 2 == 0, "runs of an even length");
#pragma unroll
        for (int i = 0; i < N; i += 2) {
            const float2 t = *(const float2*)(src + i);
            v[i] = t.x, v[i + 1] = t.y;
        }
    }
}

// A lane's kQ/32 raw dt values (positions lane kQ/32 + i) of s_raw's row hw (heads_dt_to_smem).
__device__ __forceinline__ void warp_head_raw(const float* s_raw, int hw, int lane, float (&r)[kQ / 32]) {
    // (8-byte aligned at least: kLdRaw and kQ/32 even)
    load_run(s_raw + hw * kLdRaw + lane * (kQ / 32), r);
}

// The chunk prologue of heads h0 .. h0 + kPrepHeads - 1 (those < nheads) of chunk c0 / kQ, batch
// row b, for a CTA of kPrepThreads: emit(h, d, cs, sg) is called by the whole warp for each of its
// heads (dt', cum, seg of the lane's positions lane kQ/32 + i, as warp_chunk_prologue gives them).
// s_raw: kPrepHeads * kLdRaw floats of shared memory, 16-byte aligned. Contains a __syncthreads.
template <class Emit>
__device__ __forceinline__ void heads_chunk_prologue(const SsdParams& p, i64 b, i64 h0, i64 c0, float* s_raw, Emit&& emit) {
    constexpr int kPer = kQ / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    float A0, A1, bias0, bias1;
    heads_dt_to_smem(p, b, h0, c0, len, s_raw, A0, A1, bias0, bias1);
#pragma unroll  // (k constant in each copy: a select on a run-time k put A / bias in local memory)
    for (int k = 0; k < 2; ++k) {
        const int hw = warp + kPrepWarps * k;
        const i64 h = h0 + hw;
        if (h >= p.nheads) break;  // uniform per warp
        float r[kPer], d[kPer], cs[kPer];
        int sg[kPer];
        warp_head_raw(s_raw, hw, lane, r);
        warp_chunk_scan(p, b, c0, len, lane, k ? A1 : A0, k ? bias1 : bias0, r, d, cs, sg);
        emit(h, d, cs, sg);
    }
}

// A chunk record of the lane's positions in the warp's shared row rec (3 kQ floats): [0, kQ) first,
// [kQ, 2 kQ) cum, [2 kQ, 3 kQ) seg (int bits); ends with __syncwarp (the row is then the warp's).
__device__ __forceinline__ void warp_stage_record(float* rec, int lane, const float (&first)[kQ / 32],
                                                  const float (&cs)[kQ / 32], const int (&sg)[kQ / 32]) {
#pragma unroll
    for (int i = 0; i < kQ / 32; ++i) {
        const int pos = lane * (kQ / 32) + i;
        rec[pos] = first[i];
        rec[kQ + pos] = cs[i];
        rec[2 * kQ + pos] = __int_as_float(sg[i]);
    }
    __syncwarp();
}

// n floats (a multiple of 4; both sides 16-byte aligned) copied by the warp in 16-byte pieces.
__device__ __forceinline__ void warp_copy16(float* dst, const float* src, int n, int lane) {
    for (int j = lane; j < n / 4; j += 32) ((float4*)dst)[j] = ((const float4*)src)[j];
}

// The chunk's dt', cum (inclusive cumulative sum of dt' A) and seg, positions 0..kQ-1 (those past
// the sequence's end get dt' = 0 and repeat the last cum / seg). Warp 0: each lane scans kQ/32
// consecutive positions, then the lanes' totals are scanned with shuffles. Ends with __syncthreads.
__device__ __forceinline__ void chunk_prologue(const SsdParams& p, i64 b, i64 h, i64 c0, int len, float* s_dt,
                                               float* s_cum, int* s_seg) {
    constexpr int kPer = kQ / 32;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        float d[kPer], cs[kPer];
        int sg[kPer];
        warp_chunk_prologue(p, b, h, c0, len, lane, d, cs, sg);
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            s_dt[lane * kPer + i] = d[i];
            s_cum[lane * kPer + i] = cs[i];
            s_seg[lane * kPer + i] = sg[i];
        }
    }
    __syncthreads();
}

__device__ __forceinline__ float ex(float v) { return ex2(v * kLog2e); }

template <int NT>
__device__ __forceinline__ void clear(float (&acc)[NT][4]) {
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.f;
}

// y_pre (before D and z) for rows m0 .. m0+63 of chunk c and channels p0 .. p0+63, into acc (warp w
// owns rows 16w .. 16w+15 as in acc_row / acc_col): the carried state's C.H^T and, for each 64-wide
// block of source positions s <= l, C B^T masked and scaled into W (shared memory), then W x. The
// chunk prologue (s_dt, s_cum, s_seg) must have run; every thread of the block calls this.
__device__ __forceinline__ void chunk_output(const SsdParams& p, i64 b, i64 h, i64 c, int m0, int p0, int len,
                                             const float* s_dt, const float* s_cum, const int* s_seg,
                                             float (&acc)[8][4]) {
    constexpr int kLd = kK + 4, kLdw = kTile + 4;
    // s_c (64 rows l x 32 states) and s_k (64 rows s x 32 states) while C B^T is formed; then the
    // same bytes hold s_w (64 rows l x 64 columns s) for W x.
    __shared__ __align__(16) float s_ck[2 * kTile * kLd];
    __shared__ float s_x[kTile][kLdw];  // C H^T: states k x channels p; W x: positions s x channels p
    float* s_c = s_ck;
    float* s_k = s_ck + kTile * kLd;
    float* s_w = s_ck;
    static_assert(kTile * kLdw <= 2 * kTile * kLd, "s_w must fit in s_ck");
    const i64 g = h / (p.nheads / p.ngroups);
    const i64 c0 = c * kQ;
    const int w16 = 16 * (threadIdx.x >> 5);
    const i64 cb_base = b * p.C_s[0] + g * p.C_s[2];
    const i64 bb_base = b * p.B_s[0] + g * p.B_s[2];

    clear(acc);

    // y_l += [seg_l == 0] exp(cum_l) C_l . H_c (skipped when H_c is 0: first chunk, no initial states)
    if (c > 0 || p.has_init) {
        const float* H = p.states + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
        for (int n0 = 0; n0 < p.dstate; n0 += kK) {
            for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
                const int r = i / kK, k = i % kK, l = m0 + r;
                float cv = 0.f;
                if (l < len && n0 + k < p.dstate && s_seg[l] == 0)
                    cv = ex(s_cum[l]) * ldg_f32<DT>(p.C, cb_base + (c0 + l) * p.C_s[1] + n0 + k);
                s_c[r * kLd + k] = cv;
            }
            for (int i = threadIdx.x; i < kK * kTile; i += kThreads) {
                const int k = i / kTile, col = i % kTile;
                float hv = 0.f;
                if (n0 + k < p.dstate && p0 + col < p.headdim) hv = H[(i64)(p0 + col) * p.dstate + n0 + k];
                s_x[k][col] = hv;
            }
            __syncthreads();
            warp_mma<kK, 8>(acc, [&](int m, int k) { return s_c[(w16 + m) * kLd + k]; },
                            [&](int k, int n) { return s_x[k][n]; });
            __syncthreads();
        }
    }

    // y_l += sum_{s <= l} W[l, s] x_s, W = (C_l . B_s) exp(cum_l - cum_s) dt'_s on the same sequence
    for (int s0 = 0; s0 <= m0; s0 += kTile) {
        float cb[8][4];
        clear(cb);
        for (int n0 = 0; n0 < p.dstate; n0 += kK) {
            for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
                const int r = i / kK, k = i % kK;
                const bool nk = n0 + k < p.dstate;
                s_c[r * kLd + k] = nk && m0 + r < len ? ldg_f32<DT>(p.C, cb_base + (c0 + m0 + r) * p.C_s[1] + n0 + k) : 0.f;
                s_k[r * kLd + k] = nk && s0 + r < len ? ldg_f32<DT>(p.B, bb_base + (c0 + s0 + r) * p.B_s[1] + n0 + k) : 0.f;
            }
            __syncthreads();
            warp_mma<kK, 8>(cb, [&](int m, int k) { return s_c[(w16 + m) * kLd + k]; },
                            [&](int k, int n) { return s_k[n * kLd + k]; });
            __syncthreads();
        }
        // mask and scale in registers, then W to shared memory (each warp its own 16 rows)
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = acc_row(e), col = acc_col(j, e), l = m0 + r, s = s0 + col;
                float w = 0.f;
                if (s <= l && l < len && s_seg[l] == s_seg[s]) w = cb[j][e] * ex(s_cum[l] - s_cum[s]) * s_dt[s];
                s_w[r * kLdw + col] = w;
            }
        for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
            const int r = i / kTile, col = i % kTile, s = s0 + r;
            float xv = 0.f;
            if (s < len && p0 + col < p.headdim)
                xv = ldg_f32<DT>(p.x, b * p.x_s[0] + (c0 + s) * p.x_s[1] + h * p.x_s[2] + p0 + col);
            s_x[r][col] = xv;
        }
        __syncthreads();
        warp_mma<kTile, 8>(acc, [&](int m, int k) { return s_w[(w16 + m) * kLdw + k]; },
                           [&](int k, int n) { return s_x[k][n]; });
        __syncthreads();
    }

}
