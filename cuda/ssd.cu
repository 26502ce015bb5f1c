// Mamba-2 SSD chunked scan, forward (mamba_ssm's mamba_chunk_scan_combined semantics).
//
// Per batch b, head h (group g = h / (nheads / ngroups)), position t, with dt' the processed dt
// (dt + dt_bias, softplus if asked, clamped to [dt_min, dt_max]) and H the (headdim x dstate) state:
//   H_t = keep_t exp(dt'_t A_h) H_{t-1} + dt'_t x_t B_t^T,  y_t = H_t C_t (+ D x_t) (* silu(z_t))
// keep_t = 0 where seq_idx changes (the id before t = 0 is 0: initial states belong to id 0).
//
// SSD's block decomposition over chunks of kQ = FS_CHUNK positions, cum_l = in-chunk cumulative sum
// of dt' A, seg_l = number of sequence starts in the chunk at or before l (0: still the sequence that
// was running when the chunk began):
//   1. ssd_chunk_state    S_c = sum_s [seg_s == seg_end] exp(cum_end - cum_s) dt'_s x_s B_s^T
//                          and the chunk's decay f_c = [seg_end == 0] exp(cum_end)
//   2. ssd_state_passing  H_c (state entering chunk c) = f_{c-1} H_{c-1} + S_{c-1}, H_0 = initial
//                          states; overwrites S_c with H_c in the fp32 workspace; writes final states
//   3. ssd_chunk_scan     y_l = sum_{s<=l, seg_s == seg_l} (C_l.B_s) exp(cum_l - cum_s) dt'_s x_s
//                              + [seg_l == 0] exp(cum_l) C_l . H_c,   then D, z and the store
// The three products of 1 and 3 (x^T (w B), C B^T masked, W x and C H^T) run on tensor cores
// (mma.sync m16n8k16 fp16/bf16 with f32 accumulate; fp32 data as 3xTF32 m16n8k8, ~fp32 accurate),
// their operands staged in shared memory as f32 and rounded to the input type as fragments are
// built (the masked W = C B^T * decay * dt and the fp32 states enter the 16-bit products rounded,
// as in mamba_ssm's Triton kernels).
//
// Work split (128 threads = 4 warps; warp w owns rows 16w .. 16w + 15 of every 64-row tile):
//   ssd_chunk_state   grid (nchunks, ceil(headdim/64) * ceil(dstate/64), batch * nheads): a 64 x 64
//                     tile (head channels p x states n) of S_c; K = the chunk's positions, 32 per step
//   ssd_state_passing grid (ceil(headdim * dstate / 256), batch * nheads), 256 threads: one state
//                     element per thread, sequential over chunks
//   ssd_chunk_scan    grid (nchunks * kQ / 64, ceil(headdim/64), batch * nheads): 64 positions l x
//                     64 head channels p of y; C.H^T over dstate (32 per step), then for each 64-wide
//                     block of source positions s <= l: C B^T (dstate 32 per step), mask and scale
//                     in registers, W to shared memory, W x.
//
// Compile-time constants (host prelude): FS_DTYPE (x, z, B, C, out: 0 fp16, 1 bf16, 2 fp32),
// FS_CHUNK (64, 128 or 256). dt, A, D, dt_bias and initial states may be any float dtype (read by
// a runtime dtype code: they are small), seq_idx int32.

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
    int dt_dtype, A_dtype, D_dtype, bias_dtype, init_dtype, pad0_;
    int has_D, has_z, has_dt_bias, has_init, has_seq, has_final, softplus, pad_;
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

// Row (within the 64-row tile) and column (within 8 NT columns) of accumulator element acc[j][e].
__device__ __forceinline__ int acc_row(int e) { return 16 * (threadIdx.x >> 5) + ((threadIdx.x & 31) >> 2) + 8 * (e >> 1); }
__device__ __forceinline__ int acc_col(int j, int e) { return 8 * j + 2 * (threadIdx.x & 3) + (e & 1); }

// The chunk's dt', cum (inclusive cumulative sum of dt' A) and seg, positions 0..kQ-1 (those past
// the sequence's end get dt' = 0 and repeat the last cum / seg). Warp 0: each lane scans kQ/32
// consecutive positions, then the lanes' totals are scanned with shuffles. Ends with __syncthreads.
__device__ __forceinline__ void chunk_prologue(const SsdParams& p, i64 b, i64 h, i64 c0, int len, float* s_dt,
                                               float* s_cum, int* s_seg) {
    constexpr int kPer = kQ / 32;
    if (threadIdx.x < 32) {
        const int lane = threadIdx.x;
        const float A = ld_any(p.A, h * p.A_s, p.A_dtype);
        const float bias = p.has_dt_bias ? ld_any(p.dt_bias, h * p.bias_s, p.bias_dtype) : 0.f;
        float d[kPer], cs[kPer];
        int sg[kPer];
        float run = 0.f;
        int srun = 0;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
            const int pos = lane * kPer + i;
            float v = 0.f;
            int start = 0;
            if (pos < len) {
                const i64 t = c0 + pos;
                v = ld_any(p.dt, b * p.dt_s[0] + t * p.dt_s[1] + h * p.dt_s[2], p.dt_dtype) + bias;
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
            s_dt[lane * kPer + i] = d[i];
            s_cum[lane * kPer + i] = cs[i] + ex;
            s_seg[lane * kPer + i] = sg[i] + sex;
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

// ---- 1. chunk states ---------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd_chunk_state(const SsdParams p) {
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    __shared__ float s_x[kK][kTile + 4];  // positions s x head channels p
    __shared__ float s_b[kK][kTile + 4];  // positions s x states n, times [seg_s == seg_end] exp(cum_end - cum_s) dt'_s

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads, c = blockIdx.x;
    const i64 g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + kTile - 1) / kTile);
    const int p0 = (blockIdx.y / ntn) * kTile, n0 = (blockIdx.y % ntn) * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    const float cum_end = s_cum[len - 1];
    const int seg_end = s_seg[len - 1];
    const int w16 = 16 * (threadIdx.x >> 5);

    float acc[8][4];
    clear(acc);
    for (int s0 = 0; s0 < len; s0 += kK) {
        for (int i = threadIdx.x; i < kK * kTile; i += kThreads) {
            const int r = i / kTile, col = i % kTile, s = s0 + r;
            float xv = 0.f, bv = 0.f;
            if (s < len) {
                const i64 t = c0 + s;
                if (p0 + col < p.headdim) xv = ldg_f32<DT>(p.x, b * p.x_s[0] + t * p.x_s[1] + h * p.x_s[2] + p0 + col);
                if (n0 + col < p.dstate && s_seg[s] == seg_end) {
                    const float w = ex(cum_end - s_cum[s]) * s_dt[s];
                    bv = w * ldg_f32<DT>(p.B, b * p.B_s[0] + t * p.B_s[1] + g * p.B_s[2] + n0 + col);
                }
            }
            s_x[r][col] = xv;
            s_b[r][col] = bv;
        }
        __syncthreads();
        warp_mma<kK, 8>(acc, [&](int m, int k) { return s_x[k][w16 + m]; }, [&](int k, int n) { return s_b[k][n]; });
        __syncthreads();
    }
    const i64 base = ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int pp = p0 + acc_row(e), nn = n0 + acc_col(j, e);
            if (pp < p.headdim && nn < p.dstate) p.states[base + (i64)pp * p.dstate + nn] = acc[j][e];
        }
    if (blockIdx.y == 0 && threadIdx.x == 0)
        p.decay[(b * p.nheads + h) * p.nchunks + c] = seg_end == 0 ? ex(cum_end) : 0.f;
}

// ---- 2. state passing --------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kPassThreads) ssd_state_passing(const SsdParams p) {
    const i64 pn = p.headdim * p.dstate;
    const i64 e = (i64)blockIdx.x * kPassThreads + threadIdx.x;
    if (e >= pn) return;
    const i64 b = blockIdx.y / p.nheads, h = blockIdx.y % p.nheads;
    const i64 pp = e / p.dstate, nn = e % p.dstate;
    float H = 0.f;
    if (p.has_init)
        H = ld_any(p.init, b * p.init_s[0] + h * p.init_s[1] + pp * p.init_s[2] + nn * p.init_s[3], p.init_dtype);
    const float* decay = p.decay + (b * p.nheads + h) * p.nchunks;
    for (i64 c = 0; c < p.nchunks; ++c) {
        const i64 idx = ((b * p.nchunks + c) * p.nheads + h) * pn + e;
        const float S = p.states[idx];
        p.states[idx] = H;
        H = decay[c] * H + S;
    }
    if (p.has_final) p.final_states[b * p.final_s[0] + h * p.final_s[1] + pp * p.final_s[2] + nn * p.final_s[3]] = H;
}

// ---- 3. chunk outputs --------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd_chunk_scan(const SsdParams p) {
    constexpr int kLd = kK + 4, kLdw = kTile + 4;
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    // s_c (64 rows l x 32 states) and s_k (64 rows s x 32 states) while C B^T is formed; then the
    // same bytes hold s_w (64 rows l x 64 columns s) for W x.
    __shared__ __align__(16) float s_ck[2 * kTile * kLd];
    __shared__ float s_x[kTile][kLdw];  // C H^T: states k x channels p; W x: positions s x channels p
    float* s_c = s_ck;
    float* s_k = s_ck + kTile * kLd;
    float* s_w = s_ck;
    static_assert(kTile * kLdw <= 2 * kTile * kLd, "s_w must fit in s_ck");

    constexpr int kMBlocks = kQ / kTile;
    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const i64 c = blockIdx.x / kMBlocks;
    const int m0 = (blockIdx.x % kMBlocks) * kTile, p0 = blockIdx.y * kTile;
    const i64 g = h / (p.nheads / p.ngroups);
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (m0 >= len) return;  // uniform per block: a tail chunk's empty row blocks
    chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    const int w16 = 16 * (threadIdx.x >> 5);
    const i64 cb_base = b * p.C_s[0] + g * p.C_s[2];
    const i64 bb_base = b * p.B_s[0] + g * p.B_s[2];

    float acc[8][4];
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

    // epilogue: D x, silu(z) gate, store
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int l = m0 + acc_row(e), pp = p0 + acc_col(j, e);
            if (l >= len || pp >= p.headdim) continue;
            const i64 t = c0 + l;
            float v = acc[j][e];
            if (p.has_D) {
                const float xv = ldg_f32<DT>(p.x, b * p.x_s[0] + t * p.x_s[1] + h * p.x_s[2] + pp);
                v += ld_any(p.D, h * p.D_s[0] + pp * p.D_s[1], p.D_dtype) * xv;
            }
            if (p.has_z) v *= silu(ldg_f32<DT>(p.z, b * p.z_s[0] + t * p.z_s[1] + h * p.z_s[2] + pp));
            st_f32<DT>(p.out, b * p.out_s[0] + t * p.out_s[1] + h * p.out_s[2] + pp, v);
        }
}
