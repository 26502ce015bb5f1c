// Mamba-2 SSD chunked scan, backward: every input's gradient from dout (and dfinal_states).
//
// Notation of cuda/ssd.cu (chunk of kQ positions, cum_l the in-chunk cumulative sum of dt' A, seg_l
// the sequence starts in the chunk at or before l, H_c the state entering chunk c, f_c its decay).
// g = dout * silu(z) is the gradient reaching y = y_pre + D x, y_pre the SSM term:
//   y_pre_l = e_l C_l.H_c + sum_{s<=l} (C_l.B_s) decay(l,s) dt'_s x_s,
//   e_l = [seg_l == 0] exp(cum_l), decay(l,s) = [seg_l == seg_s] exp(cum_l - cum_s),
//   H_{c+1} = f_c H_c + sum_s v_s dt'_s x_s B_s^T,  v_s = [seg_s == seg_end] exp(cum_end - cum_s).
// Gradients, per chunk (dS_c = dL/dH_{c+1}, G_c = dL/dH_c):
//   G_c   = L_c + f_c dS_c, dS_c = G_{c+1} (dS_last = dfinal), L_c = sum_l e_l g_l C_l^T;
//           dinitial_states = G_0; df_c = <dS_c, H_c>
//   dx_s  = dt'_s (dxu_intra_s + dxu_state_s) + D g_s,
//           dxu_intra_s = sum_{l>=s} (B_s.C_l) decay(l,s) g_l,  dxu_state_s = v_s dS_c B_s
//   dC_l  = sum_heads [ sum_{s<=l} dCB[l,s] B_s + e_l H_c^T g_l ],   dCB[l,s] = (g_l.x_s) decay(l,s) dt'_s
//   dB_s  = sum_heads [ sum_{l>=s} dCB[l,s] C_l + v_s dt'_s dS_c^T x_s ]
//   d cum: with R_l = g_l.y_pre_l, X1_s = x_s.dxu_intra_s, X2_s = x_s.dxu_state_s, the gradient of
//          dt'_k A (the reverse in-chunk cumsum of d cum) is
//          da_k = sum_{l>=k} (R_l - dt'_l X1_l) + sum_{s<k} dt'_s X2_s + df_c f_c   (first path)
//          R_l - dt'_l X1_l nearly cancel; the second path sums the same intra-chunk terms as
//          da_k = sum_{l>=k} R_state_l + sum_{l>=k>s} r[l,s] + sum_{s<k} dt'_s X2_s + df_c f_c,
//          r[l,s] = dCB[l,s] (C_l.B_s) per head, R_state_l = e_l g_l.(C_l H_c): every term once
//   ddt'_k = X1_k + X2_k + A da_k;  dA = sum da_k dt'_k;  then the clamp mask and the softplus
//          derivative give ddt; ddt_bias = sum ddt; dD = sum g x; dz = dout (y_pre + D x) silu'(z).
//
// Launches (after the forward's ssd_chunk_state + ssd_state_passing recompute H_c and f_c into the
// fp32 workspaces `states` / `decay`), all 128 threads = 4 warps with warp w owning rows
// 16w .. 16w+15 of each 64 x 64 tile, unless said otherwise:
//   ssd_bwd_chunk_out     grid (nchunks * kQ/64, ceil(headdim/64), batch*nheads): y_pre tile (the
//                         forward's chunk_output), then dz, R_l partial per 64-channel tile, dD partial
//   ssd_bwd_chunk_dstate  grid (nchunks, p tiles * n tiles, batch*nheads): L_c (64 x 64 tile of
//                         g^T (e C), positions 32 per step)
//   ssd_bwd_state_passing grid (ceil(headdim*dstate/256), batch*nheads), 256 threads: one state
//                         element per thread, chunks in reverse: dS_c over L_c, df_c partials per
//                         warp, dinit
//   ssd_bwd_chunk_dx      grid (nchunks * kQ/64, p tiles, batch*nheads): rows s, channels p; per
//                         64-block of l >= s: B C^T (dstate 32 per step), mask, times g; then
//                         (v B) dS^T; epilogue dx, X1 / X2 partials per channel tile
//   ssd_bwd_chunk_dc/db   grid (nchunks * kQ/64, n tiles, batch*ngroups): rows l (dC) / s (dB),
//                         states n; the group's heads summed in registers (deterministic): per head
//                         and per 64-block of the other position, g x^T over headdim (32 per step),
//                         mask and scale, times B (dC) / C (dB); then the carried / state term
//   ssd_bwd_dt            grid (nchunks, batch*nheads), one warp: da (suffix / prefix warp scans),
//                         ddt with the dt processing, dA and ddt_bias partials per chunk
//   ssd_bwd_reduce        grid (nheads), 256 threads: dA, ddt_bias, dD summed over batch and
//                         chunks in a fixed order (no float atomics: bitwise deterministic)
// Tensor cores (warp_mma of common/ssd.cuh) do every product over positions, channels or states.

#include "common/ssd.cuh"
#include "common/ssd_tiles.cuh"
#if FS_SSD_STATE_WGMMA
#include "common/tma.cuh"
#endif

// By-value parameter block of the backward kernels (sizeof 912): the forward's, then the
// gradients and the fp32 scratch (allocated by the host, stream-ordered). Strides in elements.
struct SsdBwdParams {
    SsdParams f;          // inputs; f.states = H_c, f.decay = f_c (recomputed)
    const void* dout;     // like x, FS_DTYPE
    const void* dfinal;   // (batch, nheads, headdim, dstate), dtype dfinal_dtype, or null
    void* dx;             // like x
    void* ddt;            // like dt (f.dt_dtype)
    void* dA;             // (nheads,) f.A_dtype
    void* dB;             // like B
    void* dC;             // like C
    void* dD;             // like D (f.D_dtype), or null
    void* dz;             // like z, or null
    void* dbias;          // like dt_bias (f.bias_dtype), or null
    void* dinit;          // like initial_states (f.init_dtype), or null
    float* dstates;       // (batch, nchunks, nheads, headdim, dstate): L_c, then dS_c
    float* rowdot;        // (batch*nheads, seqlen, 4): R_l per 64-channel tile
    float* x1;            // (batch*nheads, seqlen, 4): X1_s per channel tile
    float* x2;            // (batch*nheads, seqlen, 4): X2_s per channel tile
    float* dfpart;        // (batch*nheads, npass_tiles, nchunks): df_c per warp of the state passing
    float* ddpart;        // (batch*nheads, nlblocks, headdim): dD per 64-row block, or null
    float* dapart;        // (batch*nheads, nchunks)
    float* dbpart;        // (batch*nheads, nchunks)
    i64 dout_s[3], dfinal_s[4], dx_s[3], ddt_s[3], dB_s[3], dC_s[3], dz_s[3], dinit_s[4], dD_s[2];
    i64 dA_s, dbias_s;
    i64 npass_tiles, nlblocks;
    int dfinal_dtype, has_dfinal, ptiles, d_per_channel;  // D (nheads, headdim) vs (nheads,)
    // The second path's workspaces (section 8; null on the first path):
    float* cb;    // (batch, nchunks, ngroups, kQ, kQ): C_l . B_s, lower 64 x 64 blocks only
    float* dcb;   // dcb_splits such arrays: dCB[l, s] summed over one share of the group's heads
    float* pdt;   // (batch*nheads, nchunks, kQ): dt' (0 past the sequence's end)
    float* pcum;  // the same: cum
    int* pseg;    // (batch, nchunks, kQ): seg
    // 1: products may round their fp32 operands to tf32 once (the call's data came from 16-bit
    // tensors, exact in tf32) instead of the 3xTF32 split; 16-bit kernels ignore it
    int tf32x1;
    // 1: x, dout, z rows (vec_x) / B, C rows (vec_bc) start 16-byte aligned and hold a multiple of
    // 4 elements (fp32 data): 16-byte loads; 0: element loads
    int vec_x, vec_bc;
    int dcb_splits;  // ssd_bwd_dcb's head shares per group (each its own dcb array); >= 1
    // The second path's stable da (section 8): per (batch*nheads, nchunks, kPairs2) a record of
    // 128 floats from ssd_bwd_dcb (null on the first path); rowdot then holds R_state_l (the
    // carried state's part of g_l . y_pre_l) per 64-state tile, stiles of them (dstate <= 256)
    float* strad;
    int stiles;
    // 1: the reverse state passing takes 4 consecutive state elements per thread (16-byte
    // accesses; headdim * dstate a multiple of 4, the scratch 16-byte aligned), 0: one
    int pass_vec;
    // chunk_dc16 / _db16's head shares (section 8h): each (row block, state tile)'s head loop
    // split over that many CTAs (1: not split), each leaving an fp32 partial in share_part[share]
    // (batch, seqlen, ngroups, dstate), summed in share order by ssd_bwd_share_sum_dc / _db
    float* share_part;
    int dcdb_shares;
    // 1: states16 is the forward's kept H_c (SsdBwdArgs::kept on the host): nothing recomputed
    // H_c or f_c (f.states is null, f.decay the forward's), and the reverse state passing reads
    // its df sums' H_c from states16 instead of writing it there
    int kept;
    // 16-bit calls: H_c and dS_c rounded to the input dtype by the reverse state passing (the
    // layout of states / dstates), loaded by cp.async into chunk_dc16 / _db16 / _dx16's operand
    // tiles (null otherwise); vec_states16: their rows are 16-byte aligned (dstate % 8 == 0)
    u16* states16;
    u16* dstates16;
    int vec_states16;
    // 0: no carried state (one chunk, no initial or final state): a 16-bit call then skips the
    // chunk states, L_c and the reverse state passing, and ssd_bwd_dt takes df_c = 0 without
    // reading f_c or the df partials
    int terms;
    // 1: dB and dC are dense (batch, seqlen, ngroups, dstate) rows, 8-byte aligned, and their
    // element count a multiple of 4: the share sums take 4 elements a thread (16-byte partial
    // loads, one 8-byte store, no index arithmetic); the host sizes their grid by it
    int sum_vec, pad3_;
};
static_assert(sizeof(SsdBwdParams) == 1032, "SsdBwdParams layout changed: update the host mirror");

constexpr int kMBlocks = kQ / kTile;
constexpr int kTiles = 4;  // channel tiles of 64 (headdim <= 256): the row partials' last dimension

// v as an element of a small array whose dtype is known at run time (0 fp16, 1 bf16, 2 fp32).
__device__ __forceinline__ void st_any(void* base, i64 idx, int code, float v) {
    if (code == 2) {
        st_f32<2>(base, idx, v);
    } else if (code == 1) {
        st_f32<1>(base, idx, v);
    } else {
        st_f32<0>(base, idx, v);
    }
}

__device__ __forceinline__ float ld_x(const SsdParams& p, i64 b, i64 t, i64 h, int pp) {
    return ldg_f32<DT>(p.x, b * p.x_s[0] + t * p.x_s[1] + h * p.x_s[2] + pp);
}

// g = dout * silu(z) (dout without z): the gradient of y = y_pre + D x.
__device__ __forceinline__ float ld_g(const SsdBwdParams& q, i64 b, i64 t, i64 h, int pp) {
    float g = ldg_f32<DT>(q.dout, b * q.dout_s[0] + t * q.dout_s[1] + h * q.dout_s[2] + pp);
    if (q.f.has_z) g *= silu(ldg_f32<DT>(q.f.z, b * q.f.z_s[0] + t * q.f.z_s[1] + h * q.f.z_s[2] + pp));
    return g;
}

// Sum of v over the block (blockDim.x a multiple of 32, at most 32 warps), in a fixed order: the
// result in thread 0. Every thread calls it; s_red holds one float per warp.
__device__ __forceinline__ float block_sum(float v, float* s_red) {
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    const int w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) s_red[w] = v;
    __syncthreads();
    float tot = 0.f;
    if (threadIdx.x == 0)
        for (int i = 0; i < nw; ++i) tot += s_red[i];
    __syncthreads();
    return tot;
}

// Row partials of a 64 x 64 accumulator tile: rs[0] for row acc_row(0), rs[1] for acc_row(2), summed
// over the quad's lanes (they share the rows); lane t == 0 writes rows < len to dst[(c0 + row) * 4].
__device__ __forceinline__ void store_rows(float (&rs)[2], float* dst, i64 c0, int m0, int len) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        const float v = quad_sum(rs[i]);
        const int row = m0 + acc_row(2 * i);
        if ((threadIdx.x & 3) == 0 && row < len) dst[(c0 + row) * kTiles] = v;
    }
}

// One step of store_dd's reduce-scatter: of v[0 .. 2 N), a lane keeps the N values of its half
// (bit 2 N of the lane: the upper half) in v[0 .. N), plus its partner's (lane ^ 2 N) same half.
template <int N>
__device__ __forceinline__ void halve_sum(float (&v)[16], int lane) {
    const bool upper = lane & (2 * N);
#pragma unroll
    for (int k = 0; k < N; ++k) {
        const float keep = upper ? v[k + N] : v[k], send = upper ? v[k] : v[k + N];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * N);
    }
}

// dD partial of a 64-row block: dd[j][i] (this thread's sum over its rows of g x for column
// acc_col(j, i)) summed over the warp's rows by shuffles, then over the 4 warps in order (s_dd),
// into ddpart[p0 + col] for the columns < headdim. Every thread calls it.
// The warp's sum halves its values at each step (a reduce-scatter over the 8 lanes of one column
// quad: at xor 16 a lane keeps the 8 values of its half and sends the other 8, at xor 8 4, at
// xor 4 2), so lane l ends with the sums of columns 8 j + 2 (l % 4) + {0, 1}, j = 4 b4 + 2 b3 + b2
// (b_k: bit k of l): 14 shuffles instead of 48 (ncu, ssd_bwd_chunk_dx16 on the H200, 2026-11-29:
// the 48-shuffle chains held ~9% of its stall samples; dx16 509.4-509.7 -> 500.4-501.3 us in one
// lease). tests/test_ssd_bwd_dd_model.py replays the lane mapping on the CPU.
__device__ __forceinline__ void store_dd(float (&dd)[8][2], float (*s_dd)[kTile], float* ddpart, int p0, int headdim) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float v[16];  // v[2 j + i] = dd[j][i]
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        v[2 * j] = dd[j][0];
        v[2 * j + 1] = dd[j][1];
    }
    halve_sum<8>(v, lane);
    halve_sum<4>(v, lane);
    halve_sum<2>(v, lane);
    const int j = 4 * ((lane >> 4) & 1) + 2 * ((lane >> 3) & 1) + ((lane >> 2) & 1);
    *(float2*)&s_dd[w][8 * j + 2 * (lane & 3)] = make_float2(v[0], v[1]);
    __syncthreads();
    for (int col = threadIdx.x; col < kTile; col += kThreads) {
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < kThreads / 32; ++i) v += s_dd[i][col];
        if (p0 + col < headdim) ddpart[p0 + col] = v;
    }
}

// The dD partial of a row block with no rows (a tail chunk's): zero.
__device__ __forceinline__ void zero_dd(float* ddpart, int p0, int headdim) {
    for (int i = threadIdx.x; i < kTile; i += kThreads)
        if (p0 + i < headdim) ddpart[p0 + i] = 0.f;
}

// ---- helpers of the second path (section 8) ---------------------------------------------------------
constexpr int kNb2 = kQ / kTile;
constexpr int kPairs2 = kNb2 * (kNb2 + 1) / 2;
constexpr int kLd2 = kK + 4;     // fp32 pitch of a 32-wide tile: fragment reads hit distinct banks
constexpr int kLdw2 = kTile + 4;  // of a 64-wide tile

// s[r * ld + k] = f(r, k) for a 64 x kK tile: rows 0..63, columns k0 .. k0 + kK - 1 of the source.
// vec (fp32 data): f4(r, k) gives columns k .. k + 3 at once (16-byte loads; the caller zeroes
// groups past the valid rows / columns, whole since the column count is a multiple of 4); else
// f1(r, k), one element.
template <class F4, class F1>
__device__ __forceinline__ void fill_rows(float* s, bool vec, const F4& f4, const F1& f1) {
    if (DT == 2 && vec) {
        constexpr int kPer = kK / 4;
#pragma unroll
        for (int i = threadIdx.x; i < kTile * kPer; i += kThreads) {
            const int r = i / kPer, k = (i % kPer) * 4;
            *(float4*)(s + r * kLd2 + k) = f4(r, k);
        }
    } else {
        for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
            const int r = i / kK, k = i % kK;
            s[r * kLd2 + k] = f1(r, k);
        }
    }
}

__device__ __forceinline__ float4 scale4(float4 v, float f) { return make_float4(v.x * f, v.y * f, v.z * f, v.w * f); }
__device__ __forceinline__ float4 zero4() { return make_float4(0.f, 0.f, 0.f, 0.f); }

// 4 channels pp .. pp + 3 of x (row t, head h) / of g = dout * silu(z), vector path
__device__ __forceinline__ float4 ld_x4(const SsdParams& p, i64 b, i64 t, i64 h, int pp) {
    return ldg4_f32<DT>(p.x, b * p.x_s[0] + t * p.x_s[1] + h * p.x_s[2] + pp);
}
__device__ __forceinline__ float4 ld_g4(const SsdBwdParams& q, i64 b, i64 t, i64 h, int pp) {
    float4 g = ldg4_f32<DT>(q.dout, b * q.dout_s[0] + t * q.dout_s[1] + h * q.dout_s[2] + pp);
    if (q.f.has_z) {
        const float4 z = ldg4_f32<DT>(q.f.z, b * q.f.z_s[0] + t * q.f.z_s[1] + h * q.f.z_s[2] + pp);
        g = make_float4(g.x * silu(z.x), g.y * silu(z.y), g.z * silu(z.z), g.w * silu(z.w));
    }
    return g;
}

// The prologue records (dt', cum, seg) of (b, h, c) from the second path's workspaces
// (ssd_bwd_prologue): this thread's positions i = threadIdx.x + kThreads k, every load issued before
// the first use(i, dt', cum, seg). (A strided loop of load -> store waited one memory round trip
// per position: ~8% of ssd_bwd_chunk_dx16's stall samples at b8 L2048, ncu on the H200, 2026-11-29.)
template <typename Use>
__device__ __forceinline__ void prologue_records(const SsdBwdParams& q, i64 b, i64 h, i64 c, Use&& use) {
    constexpr int kPer = (kQ + kThreads - 1) / kThreads;
    const SsdParams& p = q.f;
    const i64 pro = ((b * p.nheads + h) * p.nchunks + c) * kQ;
    const int* seg = q.pseg + (b * p.nchunks + c) * kQ;
    float dt[kPer], cum[kPer];
    int sg[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
        const int i = threadIdx.x + k * kThreads;
        if (kQ % kThreads == 0 || i < kQ) {
            dt[k] = q.pdt[pro + i];
            cum[k] = q.pcum[pro + i];
            sg[k] = seg[i];
        }
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
        const int i = threadIdx.x + k * kThreads;
        if (kQ % kThreads == 0 || i < kQ) use(i, dt[k], cum[k], sg[k]);
    }
}

// The chunk prologue of (b, h, c) into shared memory; ends with __syncthreads.
__device__ __forceinline__ void load_prologue(const SsdBwdParams& q, i64 b, i64 h, i64 c, float* s_dt, float* s_cum,
                                              int* s_seg) {
    prologue_records(q, b, h, c, [&](int i, float dt, float cum, int sg) {
        s_dt[i] = dt;
        s_cum[i] = cum;
        s_seg[i] = sg;
    });
    __syncthreads();
}

// 64 rows (p0 + r, r < rows) x 32 states (n0 ..) of a (.., dstate) fp32 state matrix (H_c or dS_c,
// row-major [p][n]) into s (pitch kLd2): coalesced along n (the first path read it along p).
__device__ __forceinline__ void fill_state_rows(float* s, const float* S, i64 dstate, int p0, int rows, int n0) {
    const int nv = (int)dstate - n0;
    fill_rows(
        s, (dstate & 3) == 0,
        [&](int r, int k) { return r < rows && k < nv ? *(const float4*)(S + (i64)(p0 + r) * dstate + n0 + k) : zero4(); },
        [&](int r, int k) { return r < rows && k < nv ? S[(i64)(p0 + r) * dstate + n0 + k] : 0.f; });
}

// chunk_output (common/ssd.cuh) for the second path: C . H^T with H read along its rows, and W
// built from the CB workspace instead of C B^T per head and source block. Same contract: rows m0 ..
// m0 + 63 of chunk c, channels p0 .. p0 + 63, into acc; the prologue arrays loaded.
__device__ __forceinline__ void chunk_output2(const SsdBwdParams& q, i64 b, i64 h, i64 c, int m0, int p0, int len,
                                              const float* s_dt, const float* s_cum, const int* s_seg,
                                              float (&acc)[8][4]) {
    const SsdParams& p = q.f;
    // C . H^T: s_a (64 rows l x 32 states) and s_h (64 rows p x 32 states); W x: s_w (64 rows l x
    // 64 s), s_x (64 rows s x 64 channels p), over the same bytes
    __shared__ __align__(16) float s_buf[2 * kTile * kLdw2];
    float* s_a = s_buf;
    float* s_h = s_buf + kTile * kLd2;
    float* s_w = s_buf;
    float* s_x = s_buf + kTile * kLdw2;
    const i64 g = h / (p.nheads / p.ngroups);
    const i64 c0 = c * kQ;
    const int w16 = 16 * (threadIdx.x >> 5);
    // 1xTF32 for 16-bit data: on this path y_pre feeds dz only (the d cum sums take the stable
    // straddle form, section 8c). The first path's R_l = g_l . y_pre_l was set against dt'_l X1_l,
    // which nearly cancel: tf32 rounding there showed as 1.4% of dA (H100, 2026-11-24)
    const bool fast = q.tf32x1;
    const int hd = (int)p.headdim - p0, rows_l = len - m0;
    const i64 cbase = b * p.C_s[0] + g * p.C_s[2];
    clear(acc);

    // y_l += [seg_l == 0] exp(cum_l) C_l . H_c (skipped when H_c is 0: first chunk, no initial states)
    if (c > 0 || p.has_init) {
        const float* H = p.states + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
        for (int n0 = 0; n0 < p.dstate; n0 += kK) {
            const int nv = (int)p.dstate - n0;
            fill_rows(
                s_a, q.vec_bc,
                [&](int r, int k) {
                    const int l = m0 + r;
                    return r < rows_l && k < nv && s_seg[l] == 0
                               ? scale4(ldg4_f32<DT>(p.C, cbase + (c0 + l) * p.C_s[1] + n0 + k), ex(s_cum[l]))
                               : zero4();
                },
                [&](int r, int k) {
                    const int l = m0 + r;
                    return r < rows_l && k < nv && s_seg[l] == 0
                               ? ex(s_cum[l]) * ldg_f32<DT>(p.C, cbase + (c0 + l) * p.C_s[1] + n0 + k)
                               : 0.f;
                });
            fill_state_rows(s_h, H, p.dstate, p0, hd, n0);
            __syncthreads();
            warp_mma_q<kK, 8>(acc, [&](int m, int k) { return s_a[(w16 + m) * kLd2 + k]; },
                              [&](int k, int n) { return s_h[n * kLd2 + k]; }, fast);
            __syncthreads();
        }
    }

    // y_l += sum_{s <= l} W[l, s] x_s, W = CB[l, s] exp(cum_l - cum_s) dt'_s on the same sequence
    const float* cb = q.cb + (((b * p.nchunks + c) * p.ngroups + g) * kQ + m0) * kQ;
    for (int s0 = 0; s0 <= m0; s0 += kTile) {
        for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
            const int r = e / kTile, col = e % kTile, l = m0 + r, s = s0 + col;
            float w = 0.f;
            if (s <= l && l < len && s_seg[l] == s_seg[s]) w = cb[(i64)r * kQ + s] * ex(s_cum[l] - s_cum[s]) * s_dt[s];
            s_w[r * kLdw2 + col] = w;
        }
        const int rows_s = len - s0;
        for (int e = threadIdx.x; e < kTile * kTile / 4; e += kThreads) {
            const int r = e / (kTile / 4), col = (e % (kTile / 4)) * 4;
            float4 v = zero4();
            if (r < rows_s) {
                const i64 xi = b * p.x_s[0] + (c0 + s0 + r) * p.x_s[1] + h * p.x_s[2] + p0 + col;
                if (DT == 2 && q.vec_x) {
                    if (col < hd) v = ldg4_f32<DT>(p.x, xi);
                } else {
                    v.x = col < hd ? ldg_f32<DT>(p.x, xi) : 0.f;
                    v.y = col + 1 < hd ? ldg_f32<DT>(p.x, xi + 1) : 0.f;
                    v.z = col + 2 < hd ? ldg_f32<DT>(p.x, xi + 2) : 0.f;
                    v.w = col + 3 < hd ? ldg_f32<DT>(p.x, xi + 3) : 0.f;
                }
            }
            *(float4*)(s_x + r * kLdw2 + col) = v;
        }
        __syncthreads();
        warp_mma_q<kTile, 8>(acc, [&](int m, int k) { return s_w[(w16 + m) * kLdw2 + k]; },
                             [&](int k, int n) { return s_x[k * kLdw2 + n]; }, fast);
        __syncthreads();
    }
}

// ---- 1. y_pre again: dz, R_l, dD partials --------------------------------------------------------
template <bool kSecond>
__device__ __forceinline__ void chunk_out(const SsdBwdParams& q) {
    const SsdParams& p = q.f;
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    __shared__ __align__(8) float s_dd[kThreads / 32][kTile];
    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const i64 c = blockIdx.x / kMBlocks;
    const int m0 = (blockIdx.x % kMBlocks) * kTile, p0 = blockIdx.y * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    float* ddpart = q.ddpart + ((i64)blockIdx.z * q.nlblocks + blockIdx.x) * p.headdim;
    if (m0 >= len) {  // a tail chunk's empty row block: its dD partial is zero
        if (p.has_D && !kSecond) zero_dd(ddpart, p0, (int)p.headdim);
        return;
    }
    float acc[8][4];
    if constexpr (kSecond) {
        load_prologue(q, b, h, c, s_dt, s_cum, s_seg);
        chunk_output2(q, b, h, c, m0, p0, len, s_dt, s_cum, s_seg, acc);
    } else {
        chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
        chunk_output(p, b, h, c, m0, p0, len, s_dt, s_cum, s_seg, acc);
    }

    // the second path (run only with z) keeps dz: its da does not use R_l, dD comes from chunk_dx2
    float rs[2] = {0.f, 0.f};
    float dd[8][2];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        dd[j][0] = 0.f;
        dd[j][1] = 0.f;
    }
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int l = m0 + acc_row(e), pp = p0 + acc_col(j, e);
            if (l >= len || pp >= p.headdim) continue;
            const i64 t = c0 + l;
            const float y = acc[j][e];
            const float go = ldg_f32<DT>(q.dout, b * q.dout_s[0] + t * q.dout_s[1] + h * q.dout_s[2] + pp);
            float g = go, xv = 0.f, yd = y;
            if (p.has_D) {
                xv = ld_x(p, b, t, h, pp);
                yd += ld_any(p.D, h * p.D_s[0] + pp * p.D_s[1], p.D_dtype) * xv;
            }
            if (p.has_z) {
                const float zv = ldg_f32<DT>(p.z, b * p.z_s[0] + t * p.z_s[1] + h * p.z_s[2] + pp);
                const float sg = sigmoid(zv);
                g = go * zv * sg;
                st_f32<DT>(q.dz, b * q.dz_s[0] + t * q.dz_s[1] + h * q.dz_s[2] + pp,
                           go * yd * sg * (1.f + zv * (1.f - sg)));
            }
            rs[e >> 1] += g * y;
            dd[j][e & 1] += g * xv;
        }
    if constexpr (kSecond) return;
    store_rows(rs, q.rowdot + (i64)blockIdx.z * p.seqlen * kTiles + blockIdx.y, c0, m0, len);
    if (p.has_D) store_dd(dd, s_dd, ddpart, p0, (int)p.headdim);
}

extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_out(const SsdBwdParams q) { chunk_out<false>(q); }
extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd_bwd_chunk_out2(const SsdBwdParams q) { chunk_out<true>(q); }

// ---- 2. L_c = sum_l e_l g_l C_l^T ----------------------------------------------------------------
// Tiles at pitch kTile + 8: the A fragment (read along its columns) and B fragment reads hit 8 t + g
// distinct banks. e_l once per position; fp32 rows by 16-byte loads where q.vec_x / q.vec_bc allow.
extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dstate(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    constexpr int kLdt = kTile + 8;
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    __shared__ __align__(16) float s_g[kK][kLdt];  // positions l x head channels p
    __shared__ __align__(16) float s_c[kK][kLdt];  // positions l x states n, times e_l

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads, c = blockIdx.x;
    const i64 g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + kTile - 1) / kTile);
    const int p0 = (blockIdx.y / ntn) * kTile, n0 = (blockIdx.y % ntn) * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (q.strad != nullptr) {
        load_prologue(q, b, h, c, s_dt, s_cum, s_seg);
    } else {
        chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    }
    // s_dt becomes e_l = [seg_l == 0] exp(cum_l) (dt' is not used here)
    for (int l = threadIdx.x; l < kQ; l += kThreads) s_dt[l] = l < len && s_seg[l] == 0 ? ex(s_cum[l]) : 0.f;
    __syncthreads();
    const float* s_e = s_dt;
    const int w16 = 16 * (threadIdx.x >> 5);
    const int hd = (int)p.headdim - p0, nv = (int)p.dstate - n0;
    const i64 cbase = b * p.C_s[0] + g * p.C_s[2];
    const bool vg = DT == 2 && q.vec_x, vc = DT == 2 && q.vec_bc;

    float acc[8][4];
    clear(acc);
    for (int s0 = 0; s0 < len; s0 += kK) {
        for (int i = threadIdx.x; i < kK * kTile / 4; i += kThreads) {
            const int r = i / (kTile / 4), col = (i % (kTile / 4)) * 4, l = s0 + r;
            const float e = l < len ? s_e[l] : 0.f;
            float4 gv = zero4(), cv = zero4();
            if (e != 0.f) {
                const i64 t = c0 + l;
                if (vg) {
                    if (col < hd) gv = ld_g4(q, b, t, h, p0 + col);
                } else {
                    gv = make_float4(col < hd ? ld_g(q, b, t, h, p0 + col) : 0.f,
                                     col + 1 < hd ? ld_g(q, b, t, h, p0 + col + 1) : 0.f,
                                     col + 2 < hd ? ld_g(q, b, t, h, p0 + col + 2) : 0.f,
                                     col + 3 < hd ? ld_g(q, b, t, h, p0 + col + 3) : 0.f);
                }
                const i64 ci = cbase + t * p.C_s[1] + n0 + col;
                if (vc) {
                    if (col < nv) cv = scale4(ldg4_f32<DT>(p.C, ci), e);
                } else {
                    cv = make_float4(col < nv ? e * ldg_f32<DT>(p.C, ci) : 0.f,
                                     col + 1 < nv ? e * ldg_f32<DT>(p.C, ci + 1) : 0.f,
                                     col + 2 < nv ? e * ldg_f32<DT>(p.C, ci + 2) : 0.f,
                                     col + 3 < nv ? e * ldg_f32<DT>(p.C, ci + 3) : 0.f);
                }
            }
            *(float4*)(&s_g[r][col]) = gv;
            *(float4*)(&s_c[r][col]) = cv;
        }
        __syncthreads();
        // 1xTF32 for 16-bit data on the second path (L_c feeds no cancelling sum there)
        warp_mma_q<kK, 8>(acc, [&](int m, int k) { return s_g[k][w16 + m]; }, [&](int k, int n) { return s_c[k][n]; },
                          q.tf32x1 && q.strad != nullptr);
        __syncthreads();
    }
    const i64 base = ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int pp = p0 + acc_row(e), nn = n0 + acc_col(j, e);
            if (pp < p.headdim && nn < p.dstate) q.dstates[base + (i64)pp * p.dstate + nn] = acc[j][e];
        }
}

// ---- 3. reverse state passing: dS_c, df_c partials, dinitial_states ------------------------------
// kE consecutive state elements per thread (4 with q.pass_vec: 16-byte loads and stores, 1
// otherwise), chunks in reverse, kGroup chunks' L, H and decay loaded before any of their slots is
// written (kGroup kE loads of each in flight per thread); G = dL / dH_{c+1} carried in registers.
// The df_c partial of each warp (its 32 kE elements' G H, summed by the thread then by shuffles)
// goes to dfpart[(bh, 8 * tile + warp, c)] (q.npass_tiles counts those partials), summed by
// ssd_bwd_dt in a fixed order: no block-wide barrier per chunk. H100 b8 L2048 80 x 64, state 128
// (2026-11-27): 370 us with one element a thread (504 MB moved: ~180 us of bandwidth).
// With the 16-bit copies (q.states16: the 16-bit kernels read dS_c only from q.dstates16) the
// fp32 dS_c is not stored: 84 MB of the 420 MB a b8 L2048 call moves through this kernel.
// kKept (q.kept): H_c from the forward's 16-bit copy (q.states16) instead of the fp32 recompute,
// and no 16-bit H_c stored. A template parameter, not a run-time branch: with the choice inside
// the unrolled chunk loop the loads of a group no longer issued together (H200: 122 -> 168 us).
template <int kE, bool kKept>
__device__ __forceinline__ void reverse_state_passing(const SsdBwdParams& q) {
    const SsdParams& p = q.f;
    constexpr int kWarps = kPassThreads / 32;
    constexpr int kGroup = 4;
    const i64 pn = p.headdim * p.dstate;
    const i64 e0 = ((i64)blockIdx.x * kPassThreads + threadIdx.x) * kE;
    const bool valid = e0 < pn;  // kE = 4: pn is a multiple of 4, so the whole group is
    const i64 b = blockIdx.y / p.nheads, h = blockIdx.y % p.nheads;
    float G[kE];  // dL / dH_{c+1} while chunk c is visited
#pragma unroll
    for (int u = 0; u < kE; ++u) {
        G[u] = 0.f;
        if (valid && q.has_dfinal) {
            const i64 pp = (e0 + u) / p.dstate, nn = (e0 + u) % p.dstate;
            G[u] = ld_any(q.dfinal, b * q.dfinal_s[0] + h * q.dfinal_s[1] + pp * q.dfinal_s[2] + nn * q.dfinal_s[3],
                          q.dfinal_dtype);
        }
    }
    const float* decay = p.decay + (b * p.nheads + h) * p.nchunks;
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float* dfpart = q.dfpart + ((i64)blockIdx.y * q.npass_tiles + (i64)blockIdx.x * kWarps + w) * p.nchunks;
    const i64 step = p.nheads * pn;  // from one chunk's slot to the next
    i64 idx = ((b * p.nchunks + p.nchunks - 1) * p.nheads + h) * pn + e0;
    for (i64 c0 = p.nchunks - 1; c0 >= 0; c0 -= kGroup, idx -= kGroup * step) {
        float L[kGroup][kE], H[kGroup][kE], d[kGroup];
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
            const bool in = valid && c0 - k >= 0;
            if constexpr (kE == 4) {
                const float4 l4 = in ? *(const float4*)(q.dstates + idx - k * step) : zero4();
                L[k][0] = l4.x, L[k][1] = l4.y, L[k][2] = l4.z, L[k][3] = l4.w;
            } else {
                L[k][0] = in ? q.dstates[idx - k * step] : 0.f;
            }
#if FS_DTYPE != 2
            if constexpr (kKept) {  // the forward's 16-bit H_c
                if constexpr (kE == 4) {
                    const uint2 h4 = in ? *(const uint2*)(q.states16 + idx - k * step) : make_uint2(0u, 0u);
                    const float2 lo = unpack2<DT>(h4.x), hi = unpack2<DT>(h4.y);
                    H[k][0] = lo.x, H[k][1] = lo.y, H[k][2] = hi.x, H[k][3] = hi.y;
                } else {
                    H[k][0] = in ? half_to_f32<DT>(q.states16[idx - k * step]) : 0.f;
                }
            } else
#endif
            {
                if constexpr (kE == 4) {
                    const float4 h4 = in ? *(const float4*)(p.states + idx - k * step) : zero4();
                    H[k][0] = h4.x, H[k][1] = h4.y, H[k][2] = h4.z, H[k][3] = h4.w;
                } else {
                    H[k][0] = in ? p.states[idx - k * step] : 0.f;
                }
            }
            d[k] = c0 - k >= 0 ? decay[c0 - k] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
            const i64 c = c0 - k;
            if (c < 0) break;  // uniform across the block
            float part = 0.f;
            if (valid) {
#pragma unroll
                for (int u = 0; u < kE; ++u) part += G[u] * H[k][u];
                if (!q.states16) {  // (with the 16-bit copies nothing reads the fp32 dS_c)
                    if constexpr (kE == 4) {
                        *(float4*)(q.dstates + idx - k * step) = make_float4(G[0], G[1], G[2], G[3]);
                    } else {
                        q.dstates[idx - k * step] = G[0];
                    }
                }
#if FS_DTYPE != 2
                if (q.states16) {  // the 16-bit kernels' copies of H_c (unless kept) and dS_c (the same roundings)
                    if constexpr (kE == 4) {
                        if constexpr (!kKept)
                            *(uint2*)(q.states16 + idx - k * step) =
                                make_uint2(pack2<DT>(H[k][0], H[k][1]), pack2<DT>(H[k][2], H[k][3]));
                        *(uint2*)(q.dstates16 + idx - k * step) = make_uint2(pack2<DT>(G[0], G[1]), pack2<DT>(G[2], G[3]));
                    } else {
                        if constexpr (!kKept) q.states16[idx - k * step] = (u16)pack2<DT>(H[k][0], 0.f);
                        q.dstates16[idx - k * step] = (u16)pack2<DT>(G[0], 0.f);
                    }
                }
#endif
#pragma unroll
                for (int u = 0; u < kE; ++u) G[u] = L[k][u] + d[k] * G[u];
            }
#pragma unroll
            for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
            if (lane == 0) dfpart[c] = part;
        }
    }
    if (valid && p.has_init) {
#pragma unroll
        for (int u = 0; u < kE; ++u) {
            const i64 pp = (e0 + u) / p.dstate, nn = (e0 + u) % p.dstate;
            st_any(q.dinit, b * q.dinit_s[0] + h * q.dinit_s[1] + pp * q.dinit_s[2] + nn * q.dinit_s[3], p.init_dtype,
                   G[u]);
        }
    }
}

extern "C" __global__ void __launch_bounds__(kPassThreads) ssd_bwd_state_passing(const SsdBwdParams q) {
#if FS_DTYPE != 2
    if (q.kept) {
        if (q.pass_vec) {
            reverse_state_passing<4, true>(q);
        } else {
            reverse_state_passing<1, true>(q);
        }
        return;
    }
#endif
    if (q.pass_vec) {
        reverse_state_passing<4, false>(q);
    } else {
        reverse_state_passing<1, false>(q);
    }
}

// ---- 4. dx, X1, X2 -------------------------------------------------------------------------------
// kSecond: B_s . C_l from the CB workspace (transposed) instead of per head and l-block, dS read
// along its rows, the prologue from its workspace.
template <bool kSecond>
__device__ __forceinline__ void chunk_dx(const SsdBwdParams& q) {
    const SsdParams& p = q.f;
    // kLdt: pitch of a 64-wide tile whose fragment reads walk its rows (t) and columns (g):
    // 8 t + g distinct banks
    constexpr int kLd = kK + 4, kLdw = kTile + 4, kLdt = kTile + 8;
    static_assert(kTile * kLdt <= 2 * kTile * kLd, "s_w (second path) must fit in s_bc");
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    // s_b (64 rows s x 32 states) and s_c (64 rows l x 32 states) while B C^T is formed; then the
    // same bytes hold s_w (first path: 64 rows s x 64 columns l, pitch kLdw; second: 64 rows l x
    // 64 columns s, pitch kLdt, read transposed as the A operand).
    __shared__ __align__(16) float s_bc[2 * kTile * kLd];
    __shared__ __align__(16) float s_x[kTile][kLdt];  // g: positions l x channels p; dS^T: states k x channels p
    __shared__ __align__(8) float s_dd[kThreads / 32][kTile];      // second path: the dD partial's per-warp sums
    __shared__ float s_v[kTile];                      // second path: v_s of this block's rows
    float* s_b = s_bc;
    float* s_c = s_bc + kTile * kLd;
    float* s_w = s_bc;

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const i64 c = blockIdx.x / kMBlocks;
    const int m0 = (blockIdx.x % kMBlocks) * kTile, p0 = blockIdx.y * kTile;
    const i64 g = h / (p.nheads / p.ngroups);
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    // the second path's dD partial per 64-row block (the first path's is chunk_out's)
    float* ddpart = kSecond && p.has_D ? q.ddpart + ((i64)blockIdx.z * q.nlblocks + blockIdx.x) * p.headdim : nullptr;
    if (m0 >= len) {
        if (ddpart) zero_dd(ddpart, p0, (int)p.headdim);
        return;
    }
    if constexpr (kSecond) {
        load_prologue(q, b, h, c, s_dt, s_cum, s_seg);
    } else {
        chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    }
    const int w16 = 16 * (threadIdx.x >> 5);
    const i64 cb_base = b * p.C_s[0] + g * p.C_s[2];
    const i64 bb_base = b * p.B_s[0] + g * p.B_s[2];
    // X1 / X2: on the first path they feed d cum sums that nearly cancel (see chunk_output2), so
    // 3xTF32; on the second they enter ddt' = X1 + X2 + A da and da's X2 prefix as plain terms
    const bool fast = kSecond && q.tf32x1;

    float acc_i[8][4], acc_s[8][4];
    clear(acc_i);
    clear(acc_s);
    // dxu_intra_s = sum_{l >= s} (B_s.C_l) decay(l, s) g_l
    for (int l0 = m0; l0 < len; l0 += kTile) {
        if constexpr (kSecond) {
            // s_w[l][s] = CB[l, s] decay(l, s) (block (l0, m0) of the workspace), 4 columns s per
            // thread: 16-byte loads along s and 16-byte shared stores
            const float* cb = q.cb + (((b * p.nchunks + c) * p.ngroups + g) * kQ + l0) * kQ + m0;
            for (int e = threadIdx.x; e < kTile * kTile / 4; e += kThreads) {
                const int lr = e / (kTile / 4), sc = (e % (kTile / 4)) * 4, l = l0 + lr;
                float4 w = zero4();
                if (l < len) {
                    const float4 v = *(const float4*)(cb + (i64)lr * kQ + sc);
                    const float cl = s_cum[l];
                    const int sl = s_seg[l];
                    auto one = [&](float cbv, int u) {
                        const int s = m0 + sc + u;
                        return s <= l && s_seg[s] == sl ? cbv * ex(cl - s_cum[s]) : 0.f;
                    };
                    w = make_float4(one(v.x, 0), one(v.y, 1), one(v.z, 2), one(v.w, 3));
                }
                *(float4*)(s_w + lr * kLdt + sc) = w;
            }
        } else {
        float bc[8][4];
        clear(bc);
        for (int n0 = 0; n0 < p.dstate; n0 += kK) {
            for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
                const int r = i / kK, k = i % kK;
                const bool nk = n0 + k < p.dstate;
                s_b[r * kLd + k] = nk && m0 + r < len ? ldg_f32<DT>(p.B, bb_base + (c0 + m0 + r) * p.B_s[1] + n0 + k) : 0.f;
                s_c[r * kLd + k] = nk && l0 + r < len ? ldg_f32<DT>(p.C, cb_base + (c0 + l0 + r) * p.C_s[1] + n0 + k) : 0.f;
            }
            __syncthreads();
            warp_mma<kK, 8>(bc, [&](int m, int k) { return s_b[(w16 + m) * kLd + k]; },
                            [&](int k, int n) { return s_c[n * kLd + k]; });
            __syncthreads();
        }
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = acc_row(e), col = acc_col(j, e), s = m0 + r, l = l0 + col;
                float w = 0.f;
                if (s <= l && l < len && s_seg[l] == s_seg[s]) w = bc[j][e] * ex(s_cum[l] - s_cum[s]);
                s_w[r * kLdw + col] = w;
            }
        }
        const int hd = (int)p.headdim - p0;
        if (DT == 2 && kSecond && q.vec_x) {  // 16-byte rows of g (hd a multiple of 4)
            for (int i = threadIdx.x; i < kTile * kTile / 4; i += kThreads) {
                const int r = i / (kTile / 4), col = (i % (kTile / 4)) * 4, l = l0 + r;
                *(float4*)(&s_x[r][col]) = l < len && col < hd ? ld_g4(q, b, c0 + l, h, p0 + col) : zero4();
            }
        } else {
            for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
                const int r = i / kTile, col = i % kTile, l = l0 + r;
                s_x[r][col] = l < len && col < hd ? ld_g(q, b, c0 + l, h, p0 + col) : 0.f;
            }
        }
        __syncthreads();
        if constexpr (kSecond) {
            warp_mma_q<kTile, 8>(acc_i, [&](int m, int k) { return s_w[k * kLdt + w16 + m]; },
                                 [&](int k, int n) { return s_x[k][n]; }, fast);
        } else {
            warp_mma_q<kTile, 8>(acc_i, [&](int m, int k) { return s_w[(w16 + m) * kLdw + k]; },
                                 [&](int k, int n) { return s_x[k][n]; }, fast);
        }
        __syncthreads();
    }
    // dxu_state_s = v_s dS_c B_s (dS of the last chunk is dfinal: zero without it)
    if (c < p.nchunks - 1 || q.has_dfinal) {
        const float* dS = q.dstates + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
        const float cum_end = s_cum[len - 1];
        const int seg_end = s_seg[len - 1];
        if constexpr (kSecond) {  // v_s once per row (the first path forms it per element)
            if (threadIdx.x < kTile) {
                const int s = m0 + threadIdx.x;
                s_v[threadIdx.x] = s < len && s_seg[s] == seg_end ? ex(cum_end - s_cum[s]) : 0.f;
            }
            __syncthreads();
        }
        for (int n0 = 0; n0 < p.dstate; n0 += kK) {
            if constexpr (kSecond) {
                // element loads: the 16-byte path's unrolled loads (acc_i and acc_s live) spill
                // at the 128-register bound
                const int nv = (int)p.dstate - n0;
                fill_rows(
                    s_b, false, [&](int, int) { return zero4(); },
                    [&](int r, int k) {
                        return s_v[r] != 0.f && k < nv ? s_v[r] * ldg_f32<DT>(p.B, bb_base + (c0 + m0 + r) * p.B_s[1] + n0 + k)
                                                       : 0.f;
                    });
            } else {
                for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
                    const int r = i / kK, k = i % kK, s = m0 + r;
                    float bv = 0.f;
                    if (s < len && n0 + k < p.dstate && s_seg[s] == seg_end)
                        bv = ex(cum_end - s_cum[s]) * ldg_f32<DT>(p.B, bb_base + (c0 + s) * p.B_s[1] + n0 + k);
                    s_b[r * kLd + k] = bv;
                }
            }
            if constexpr (kSecond) {
                float* s_h = s_c;  // rows p x 32 states (pitch kLd == kLd2)
                fill_state_rows(s_h, dS, p.dstate, p0, (int)p.headdim - p0, n0);
                __syncthreads();
                warp_mma_q<kK, 8>(acc_s, [&](int m, int k) { return s_b[(w16 + m) * kLd + k]; },
                                  [&](int k, int n) { return s_h[n * kLd + k]; }, fast);
            } else {
                for (int i = threadIdx.x; i < kK * kTile; i += kThreads) {
                    const int k = i / kTile, col = i % kTile;
                    s_x[k][col] = n0 + k < p.dstate && p0 + col < p.headdim ? dS[(i64)(p0 + col) * p.dstate + n0 + k] : 0.f;
                }
                __syncthreads();
                warp_mma<kK, 8>(acc_s, [&](int m, int k) { return s_b[(w16 + m) * kLd + k]; },
                                [&](int k, int n) { return s_x[k][n]; });
            }
            __syncthreads();
        }
    }
    float r1[2] = {0.f, 0.f}, r2[2] = {0.f, 0.f};
    float dd[8][2];
#pragma unroll
    for (int j = 0; j < 8; ++j) dd[j][0] = dd[j][1] = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int s = m0 + acc_row(e), pp = p0 + acc_col(j, e);
            if (s >= len || pp >= p.headdim) continue;
            const i64 t = c0 + s;
            const float xv = ld_x(p, b, t, h, pp);
            float dx = s_dt[s] * (acc_i[j][e] + acc_s[j][e]);
            if (p.has_D) {
                const float gv = ld_g(q, b, t, h, pp);
                dx += ld_any(p.D, h * p.D_s[0] + pp * p.D_s[1], p.D_dtype) * gv;
                dd[j][e & 1] += gv * xv;
            }
            st_f32<DT>(q.dx, b * q.dx_s[0] + t * q.dx_s[1] + h * q.dx_s[2] + pp, dx);
            r1[e >> 1] += xv * acc_i[j][e];
            r2[e >> 1] += xv * acc_s[j][e];
        }
    const i64 row0 = (i64)blockIdx.z * p.seqlen * kTiles + blockIdx.y;
    store_rows(r1, q.x1 + row0, c0, m0, len);
    store_rows(r2, q.x2 + row0, c0, m0, len);
    if constexpr (kSecond) {
        if (ddpart) store_dd(dd, s_dd, ddpart, p0, (int)p.headdim);
    }
}

extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dx(const SsdBwdParams q) { chunk_dx<false>(q); }
extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd_bwd_chunk_dx2(const SsdBwdParams q) { chunk_dx<true>(q); }

// ---- 5. dC (kDB false) and dB (kDB true), the group's heads summed ------------------------------
// Rows r of the tile are positions l (dC) or s (dB); "other" positions o run over s <= l (dC) or
// l >= s (dB). Per head: dW[r, o] = (row operand_r . other operand_o) over headdim, with g as the
// row operand of dC and x that of dB; masked and scaled to dCB (or its transpose); times B_o (dC)
// or C_o (dB). Then dC += e_l g_l^T H_c, dB += v_s dt'_s x_s^T dS_c (channels 32 per step).
template <bool kDB>
__device__ __forceinline__ void chunk_dcdb(const SsdBwdParams& q) {
    const SsdParams& p = q.f;
    constexpr int kLd = kK + 4, kLdw = kTile + 4;
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    __shared__ __align__(16) float s_ab[2 * kTile * kLd];  // row and other operands, then s_w
    __shared__ float s_x[kTile][kLdw];                     // B / C tile: positions o x states n
    float* s_a = s_ab;
    float* s_o = s_ab + kTile * kLd;
    float* s_w = s_ab;

    const i64 b = blockIdx.z / p.ngroups, g = blockIdx.z % p.ngroups;
    const i64 hpg = p.nheads / p.ngroups;
    const i64 c = blockIdx.x / kMBlocks;
    const int m0 = (blockIdx.x % kMBlocks) * kTile, n0 = blockIdx.y * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (m0 >= len) return;
    const int w16 = 16 * (threadIdx.x >> 5);
    const void* M = kDB ? p.C : p.B;  // the matrix the masked dCB multiplies
    const i64 m_base = kDB ? b * p.C_s[0] + g * p.C_s[2] : b * p.B_s[0] + g * p.B_s[2];
    const i64 m_t = kDB ? p.C_s[1] : p.B_s[1];

    float acc[8][4];
    clear(acc);
    for (i64 hh = 0; hh < hpg; ++hh) {
        const i64 h = g * hpg + hh;
        __syncthreads();  // the previous head's readers of the prologue arrays are done
        chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
        const int o_begin = kDB ? m0 : 0, o_end = kDB ? len : m0 + 1;
        for (int o0 = o_begin; o0 < o_end; o0 += kTile) {
            float dw[8][4];
            clear(dw);
            for (int k0 = 0; k0 < p.headdim; k0 += kK) {
                for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
                    const int r = i / kK, k = i % kK, pk = k0 + k;
                    const bool in = pk < p.headdim;
                    const int rr = m0 + r, oo = o0 + r;
                    float av = 0.f, ov = 0.f;
                    if (in && rr < len) av = kDB ? ld_x(p, b, c0 + rr, h, pk) : ld_g(q, b, c0 + rr, h, pk);
                    if (in && oo < len) ov = kDB ? ld_g(q, b, c0 + oo, h, pk) : ld_x(p, b, c0 + oo, h, pk);
                    s_a[r * kLd + k] = av;
                    s_o[r * kLd + k] = ov;
                }
                __syncthreads();
                warp_mma<kK, 8>(dw, [&](int m, int k) { return s_a[(w16 + m) * kLd + k]; },
                                [&](int k, int n) { return s_o[n * kLd + k]; });
                __syncthreads();
            }
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int r = acc_row(e), col = acc_col(j, e);
                    const int l = kDB ? o0 + col : m0 + r, s = kDB ? m0 + r : o0 + col;
                    float w = 0.f;
                    if (s <= l && l < len && s_seg[l] == s_seg[s]) w = dw[j][e] * ex(s_cum[l] - s_cum[s]) * s_dt[s];
                    s_w[r * kLdw + col] = w;
                }
            for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
                const int r = i / kTile, col = i % kTile, o = o0 + r;
                s_x[r][col] = o < len && n0 + col < p.dstate ? ldg_f32<DT>(M, m_base + (c0 + o) * m_t + n0 + col) : 0.f;
            }
            __syncthreads();
            warp_mma<kTile, 8>(acc, [&](int m, int k) { return s_w[(w16 + m) * kLdw + k]; },
                               [&](int k, int n) { return s_x[k][n]; });
            __syncthreads();
        }
        // dC: e_l g_l^T H_c (H_c = 0 in chunk 0 without initial states); dB: v_s dt'_s x_s^T dS_c
        // (dS of the last chunk = dfinal, zero without it)
        const bool term = kDB ? (c < p.nchunks - 1 || q.has_dfinal) : (c > 0 || p.has_init);
        if (term) {
            const float* S = (kDB ? q.dstates : p.states) + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
            const float cum_end = s_cum[len - 1];
            const int seg_end = s_seg[len - 1];
            for (int k0 = 0; k0 < p.headdim; k0 += kK) {
                for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
                    const int r = i / kK, k = i % kK, pk = k0 + k, rr = m0 + r;
                    float av = 0.f;
                    if (pk < p.headdim && rr < len) {
                        if (kDB) {
                            if (s_seg[rr] == seg_end) av = ex(cum_end - s_cum[rr]) * s_dt[rr] * ld_x(p, b, c0 + rr, h, pk);
                        } else if (s_seg[rr] == 0) {
                            av = ex(s_cum[rr]) * ld_g(q, b, c0 + rr, h, pk);
                        }
                    }
                    s_a[r * kLd + k] = av;
                }
                for (int i = threadIdx.x; i < kK * kTile; i += kThreads) {
                    const int k = i / kTile, col = i % kTile;
                    s_x[k][col] = k0 + k < p.headdim && n0 + col < p.dstate ? S[(i64)(k0 + k) * p.dstate + n0 + col] : 0.f;
                }
                __syncthreads();
                warp_mma<kK, 8>(acc, [&](int m, int k) { return s_a[(w16 + m) * kLd + k]; },
                                [&](int k, int n) { return s_x[k][n]; });
                __syncthreads();
            }
        }
    }
    void* out = kDB ? q.dB : q.dC;
    // scalars, not a pointer into the parameter block (which would put it on the stack)
    const i64 os0 = kDB ? q.dB_s[0] : q.dC_s[0], os1 = kDB ? q.dB_s[1] : q.dC_s[1];
    const i64 os2 = kDB ? q.dB_s[2] : q.dC_s[2];
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = m0 + acc_row(e), nn = n0 + acc_col(j, e);
            if (r < len && nn < p.dstate) st_f32<DT>(out, b * os0 + (c0 + r) * os1 + g * os2 + nn, acc[j][e]);
        }
}

extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dc(const SsdBwdParams q) { chunk_dcdb<false>(q); }
extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_db(const SsdBwdParams q) { chunk_dcdb<true>(q); }

// The intra-chunk part of da on the second path, per position k = lane * kPer + i of one (chunk,
// head): sum over l >= k > s of r[l, s] (r = dCB_head . CB, section 8d), assembled from the
// records `rec` of ssd_bwd_dcb (kPairs2 of kRec floats, pair (i, j) at i (i + 1) / 2 + j) in a
// fixed order. For k in 64-block bk: the in-block sum of the diagonal record, the exclusive prefix
// (inside bk) of the column sums of the blocks (li > bk, bk), the inclusive suffix (inside bk) of the
// row sums of the blocks (bk, sj < bk), and the totals of the blocks (li, sj) with sj < bk < li.
// Blocks at or past len have no record (never written): loaded with the others, never used.
constexpr int kRec = 2 * kTile;  // a block's record: column sums, then row sums
__device__ __forceinline__ void straddle_da(const float* rec, int len, int lane, float (&st)[kQ / 32]) {
    constexpr int kPer = kQ / 32;
    constexpr int kLanes = kTile / kPer;  // lanes of one 64-block: 8 (chunk 256), 16, 32 (chunk 64)
    const int nb = (len + kTile - 1) / kTile;
    const int bk = lane * kPer / kTile, kk0 = lane * kPer % kTile;
    auto at = [&](int li, int sj) { return rec + (li * (li + 1) / 2 + sj) * kRec; };
    // Every record value the lane needs is loaded before any is used (kPer-runs by vector loads),
    // the terms outside the sums masked to 0 and added in the same order (the same sums), blocks at
    // or past len read but never used (unwritten scratch). The loads had sat in runtime loops and
    // branches, one round trip after another.
    float vb[kNb2 > 2 ? kNb2 * (kNb2 - 1) / 2 - (kNb2 - 1) : 1][kTile / 32];  // the between blocks
    {
        int n = 0;
#pragma unroll
        for (int li = 2; li < kNb2; ++li)
#pragma unroll
            for (int sj = 0; sj + 2 <= li; ++sj, ++n)
#pragma unroll
                for (int u = 0; u < kTile / 32; ++u) vb[n][u] = at(li, sj)[lane + 32 * u];
    }
    // block m of the lane's 64-block bk: m > bk the column sums of block (m, bk), m < bk the row sums
    // of block (bk, m), m == bk the diagonal record's column sums
    float vm[kNb2][kPer];
#pragma unroll
    for (int m = 0; m < kNb2; ++m)
        load_run(m > bk ? at(m, bk) + kk0 : m < bk ? at(bk, m) + kTile + kk0 : at(bk, bk) + kk0, vm[m]);
    // the totals of blocks with at least one block between their rows and columns
    float between = 0.f;
    {
        int n = 0;
#pragma unroll
        for (int li = 2; li < kNb2; ++li)
#pragma unroll
            for (int sj = 0; sj + 2 <= li; ++sj, ++n) {
                float v = 0.f;
#pragma unroll
                for (int u = 0; u < kTile / 32; ++u) v += vb[n][u];
                if (li >= nb) v = 0.f;  // (uniform) an unwritten block
#pragma unroll
                for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
                if (sj < bk && bk < li) between += v;
            }
    }
    float col[kPer], row[kPer];
    float ct = 0.f, rt = 0.f;
    const bool live = bk < nb;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        float cs = 0.f, rs = 0.f, dg = 0.f;
#pragma unroll
        for (int m = 0; m < kNb2; ++m) {
            cs += m > bk && m < nb ? vm[m][i] : 0.f;
            rs += m < bk && live ? vm[m][i] : 0.f;
            if (m == bk && live) dg = vm[m][i];
        }
        st[i] = dg + between;
        col[i] = cs;
        row[i] = rs;
        ct += cs;
        rt += rs;
    }
    // segmented scans over the lanes of the block: inclusive prefix of ct, inclusive suffix of rt
    const int seg_lane = lane & (kLanes - 1);
#pragma unroll
    for (int off = 1; off < kLanes; off *= 2) {
        const float o1 = __shfl_up_sync(0xffffffffu, ct, off, kLanes);
        const float o2 = __shfl_down_sync(0xffffffffu, rt, off, kLanes);
        if (seg_lane >= off) ct += o1;
        if (seg_lane + off < kLanes) rt += o2;
    }
    float before = __shfl_up_sync(0xffffffffu, ct, 1, kLanes);   // columns of earlier lanes
    float after = __shfl_down_sync(0xffffffffu, rt, 1, kLanes);  // rows of later lanes
    if (seg_lane == 0) before = 0.f;
    if (seg_lane == kLanes - 1) after = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {  // columns s < k: exclusive
        st[i] += before;
        before += col[i];
    }
#pragma unroll
    for (int i = kPer - 1; i >= 0; --i) {  // rows l >= k: inclusive
        after += row[i];
        st[i] += after;
    }
}

// ---- 6. da, ddt, dA and ddt_bias partials (one warp per chunk and head) ---------------------------
// The first n (1 .. kTiles) of a position's kTiles tile partials (a 16-byte aligned row), summed in
// tile order from 0.
__device__ __forceinline__ float tile_sum(const float* row, int n) {
    static_assert(kTiles == 4, "one float4 per position");
    const float4 v = *(const float4*)row;
    float s = 0.f + v.x;
    if (n > 1) s += v.y;
    if (n > 2) s += v.z;
    if (n > 3) s += v.w;
    return s;
}

// One warp's (batch b, head h, chunk c) of ssd_bwd_dt from the lane's raw dt values: ddt' of the
// lane's positions into ddt_row (kQ floats of shared memory, positions < len), the chunk's dA and
// ddt_bias partials into dapart / dbpart.
__device__ __forceinline__ void dt_head(const SsdBwdParams& q, i64 b, i64 h, i64 c, int len, int lane, float A,
                                        float bias, const float (&raw)[kQ / 32], float* ddt_row) {
    const SsdParams& p = q.f;
    constexpr int kPer = kQ / 32;
    const i64 bh = b * p.nheads + h;
    const i64 c0 = c * kQ;
    const float* rowdot = q.rowdot + bh * p.seqlen * kTiles;
    const float* x1 = q.x1 + bh * p.seqlen * kTiles;
    const float* x2 = q.x2 + bh * p.seqlen * kTiles;
    const bool stable = q.strad != nullptr;  // the second path
    // Every load of the lane's positions first (a position's kTiles tile partials are one 16-byte
    // row: one load each; tiles past the used ones are never written, so they are masked, and the
    // sums keep tile order), addresses clamped into the chunk: with the loads in each position's
    // branch, positions went one round trip at a time.
    float s1[kPer], s2[kPer], rd[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const i64 t = c0 + min(lane * kPer + i, len - 1);
        s1[i] = tile_sum(x1 + t * kTiles, q.ptiles);
        s2[i] = tile_sum(x2 + t * kTiles, q.ptiles);
    }
    // R_state_l on the second path (zero while H_c is), R_l on the first
    const bool need_rd = !stable || c > 0 || p.has_init;
    const int rd_tiles = stable ? q.stiles : q.ptiles;
#pragma unroll
    for (int i = 0; i < kPer; ++i) rd[i] = 0.f;
    if (need_rd) {
#pragma unroll
        for (int i = 0; i < kPer; ++i) rd[i] = tile_sum(rowdot + (c0 + min(lane * kPer + i, len - 1)) * kTiles, rd_tiles);
    }
    float d[kPer], pre[kPer], x12[kPer], a1[kPer], a2[kPer];
    bool inside[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int pos = lane * kPer + i;
        d[i] = pre[i] = x12[i] = a1[i] = a2[i] = 0.f;
        inside[i] = false;
        if (pos < len) {
            float v = raw[i] + bias;
            pre[i] = v;
            if (p.softplus) v = softplus(v);
            inside[i] = v >= p.dt_min && v <= p.dt_max;
            v = fminf(fmaxf(v, p.dt_min), p.dt_max);
            d[i] = v;
            x12[i] = s1[i] + s2[i];
            a2[i] = v * s2[i];  // summed over s < k
            if (stable) {  // R_state_l: summed over l >= k
                a1[i] = rd[i];
            } else {  // R_l - dt'_l X1_l, summed over l >= k
                a1[i] = rd[i] - v * s1[i];
            }
        }
    }
    // df_c f_c: the chunk's decay gradient (element-tile partials summed in a fixed order)
    const float f = q.terms ? p.decay[bh * p.nchunks + c] : 0.f;
    float dfs = 0.f;
    if (f != 0.f)
        for (i64 k = lane; k < q.npass_tiles; k += 32) dfs += q.dfpart[(bh * q.npass_tiles + k) * p.nchunks + c];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) dfs += __shfl_xor_sync(0xffffffffu, dfs, off);
    // suffix sums of a1 (inclusive) and prefix sums of a2 (exclusive) over the chunk's positions
    float t1 = 0.f, t2 = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        t1 += a1[i];
        t2 += a2[i];
    }
    float suf = t1, pref = t2;
#pragma unroll
    for (int off = 1; off < 32; off *= 2) {
        const float o1 = __shfl_down_sync(0xffffffffu, suf, off);
        const float o2 = __shfl_up_sync(0xffffffffu, pref, off);
        if (lane + off < 32) suf += o1;
        if (lane >= off) pref += o2;
    }
    float run1 = suf - t1;  // sum of a1 over later lanes
    float run2 = pref - t2;  // sum of a2 over earlier lanes
    float da[kPer];
#pragma unroll
    for (int i = kPer - 1; i >= 0; --i) {
        run1 += a1[i];
        da[i] = run1;
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        da[i] += run2 + dfs * f;
        run2 += a2[i];
    }
    if (stable) {
        float st[kPer];
        straddle_da(q.strad + (bh * p.nchunks + c) * kPairs2 * kRec, len, lane, st);
#pragma unroll
        for (int i = 0; i < kPer; ++i) da[i] += st[i];
    }
    float dA = 0.f, db = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int pos = lane * kPer + i;
        if (pos >= len) continue;
        dA += da[i] * d[i];
        float v = inside[i] ? x12[i] + da[i] * A : 0.f;
        if (p.softplus && pre[i] <= 20.f) v *= sigmoid(pre[i]);
        ddt_row[pos] = v;
        db += v;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) {
        dA += __shfl_xor_sync(0xffffffffu, dA, off);
        db += __shfl_xor_sync(0xffffffffu, db, off);
    }
    if (lane == 0) {
        q.dapart[bh * p.nchunks + c] = dA;
        q.dbpart[bh * p.nchunks + c] = db;
    }
}

// Grid (nchunks, ceil(nheads / kPrepHeads), batch), kPrepThreads: dt of 8 heads read together and
// transposed through s_raw (heads_dt_to_smem, as the chunk prologues do), each warp runs dt_head for
// two heads, leaving ddt' in its head's s_raw row in place of dt (each lane rewrites only its own
// positions), and the CTA stores ddt' in dt's layout with the loads' pattern (a warp's store covers
// 4 positions x 8 heads). One warp a CTA per (batch, head, chunk) read dt and stored ddt' at a
// stride of nheads elements (2 useful bytes a 32-byte sector in 16 bits).
extern "C" __global__ void __launch_bounds__(kPrepThreads) ssd_bwd_dt(const SsdBwdParams q) {
    constexpr int kPer = kQ / 32, kLoads = kQ * kPrepHeads / kPrepThreads, kStep = kPrepThreads / kPrepHeads;
    const SsdParams& p = q.f;
    __shared__ __align__(16) float s_raw[kPrepHeads * kLdRaw];
    const i64 b = blockIdx.z, c = blockIdx.x, h0 = (i64)blockIdx.y * kPrepHeads, c0 = c * kQ;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    float A0, A1, bias0, bias1;
    heads_dt_to_smem(p, b, h0, c0, len, s_raw, A0, A1, bias0, bias1);
#pragma unroll  // (k constant in each copy: see heads_chunk_prologue)
    for (int k = 0; k < 2; ++k) {
        const int hw = warp + kPrepWarps * k;
        if (h0 + hw < p.nheads) {  // uniform per warp; every thread reaches the barrier below
            float r[kPer];
            warp_head_raw(s_raw, hw, lane, r);
            dt_head(q, b, h0 + hw, c, len, lane, k ? A1 : A0, k ? bias1 : bias0, r, s_raw + hw * kLdRaw);
        }
    }
    __syncthreads();
    const int hh = threadIdx.x % kPrepHeads;
    if (h0 + hh >= p.nheads) return;
    const i64 base = b * q.ddt_s[0] + (h0 + hh) * q.ddt_s[2];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) {
        const int pos = (int)threadIdx.x / kPrepHeads + kStep * k;
        if (pos < len) st_any(q.ddt, base + (c0 + pos) * q.ddt_s[1], p.dt_dtype, s_raw[hh * kLdRaw + pos]);
    }
}

// ---- 7. dA, ddt_bias, dD over batch and chunks (fixed order) -------------------------------------
extern "C" __global__ void __launch_bounds__(kPassThreads) ssd_bwd_reduce(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    __shared__ float s_red[kPassThreads / 32];
    const i64 h = blockIdx.x;
    const i64 n = p.batch * p.nchunks;
    float a = 0.f, bsum = 0.f;
    for (i64 i = threadIdx.x; i < n; i += kPassThreads) {
        const i64 idx = ((i / p.nchunks) * p.nheads + h) * p.nchunks + i % p.nchunks;
        a += q.dapart[idx];
        bsum += q.dbpart[idx];
    }
    a = block_sum(a, s_red);
    bsum = block_sum(bsum, s_red);
    if (threadIdx.x == 0) {
        st_any(q.dA, h * q.dA_s, p.A_dtype, a);
        if (p.has_dt_bias) st_any(q.dbias, h * q.dbias_s, p.bias_dtype, bsum);
    }
    if (!p.has_D) return;
    // dD: the partials of (batch, live l-block) m = 0 .. M - 1 per channel, summed by `slices`
    // threads per channel (each m = its slice + slices k, eight loads in flight), then the slices
    // in order (a serial loop per channel took 105 us at b8 L2048 80 x 64 on the H100, 27 at b32
    // L60; four loads in flight over every l-block, 13 us at b32 L60: the last chunk's l-blocks
    // past seqlen hold zeros (zero_dd) and are not read)
    __syncthreads();  // s_red's block sums are done before s_dd (below) is written
    __shared__ float s_dd[kPassThreads];
    const int hd = (int)p.headdim;  // <= 256 (kTiles)
    const int slices = max(1, kPassThreads / hd);
    const i64 tail = p.seqlen - (p.nchunks - 1) * kQ;
    const i64 live = q.nlblocks - (kNb2 - (tail + kTile - 1) / kTile);  // l-blocks of a batch row
    const i64 M = p.batch * live;
    const int sl = threadIdx.x / hd, pp = threadIdx.x % hd;
    if (sl < slices) {
        // partial m = sl + (kIn k + u) slices goes to v[u], k rising (the sums and their order as
        // before); (bb, lb) = (m / live, m % live) is carried from one m to the next by subtraction
        // (a 64-bit division and remainder by the run-time live per load had held the kernel:
        // 36 us at b8 L2048 on the H200 for 1.3 M floats), and the kIn loads of a step issue
        // before their adds (absent ones read as 0)
        constexpr int kIn = 8;
        float v[kIn];
#pragma unroll
        for (int u = 0; u < kIn; ++u) v[u] = 0.f;
        const i64 row = p.nheads * q.nlblocks * p.headdim;  // from batch row bb to bb + 1
        const float* base = q.ddpart + h * q.nlblocks * p.headdim + pp;
        i64 bb = sl / live, lb = sl % live;  // (once)
        for (i64 m = sl; m < M; m += kIn * slices) {
            float x[kIn];
#pragma unroll
            for (int u = 0; u < kIn; ++u) {
                x[u] = m + u * slices < M ? base[bb * row + lb * p.headdim] : 0.f;
                lb += slices;
                while (lb >= live) lb -= live, ++bb;
            }
#pragma unroll
            for (int u = 0; u < kIn; ++u) v[u] += x[u];
        }
        s_dd[threadIdx.x] = ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
    }
    __syncthreads();
    const bool per_channel = q.d_per_channel;
    float dsum = 0.f;
    if (threadIdx.x < hd) {
        float v = 0.f;
        for (int k = 0; k < slices; ++k) v += s_dd[k * hd + threadIdx.x];
        if (per_channel) st_any(q.dD, h * q.dD_s[0] + threadIdx.x * q.dD_s[1], p.D_dtype, v);
        dsum = v;
    }
    if (!per_channel) {
        dsum = block_sum(dsum, s_red);
        if (threadIdx.x == 0) st_any(q.dD, h * q.dD_s[0], p.D_dtype, dsum);
    }
}

// ==== 8. Second path (the default; FLASHSCAN_SSD_BWD=1 the first): dC and dB from a dCB formed once
// per group, da in a form without cancellation ======================================================
// The first path's chunk_dc / chunk_db form each head's g x^T (64 x 64 over headdim) again in both
// kernels and for every 64-state tile (4 times), each CTA walking the group's heads one after the
// other with a chunk prologue per head; its da subtracts dt'_l X1_l from R_l, so y_pre and X1 need
// 3xTF32. Here:
//   ssd_bwd_prologue  grid (nchunks, batch*nheads), one warp: the chunk prologue once per (batch,
//                     head, chunk) into q.pdt / q.pcum (and q.pseg, head 0)
//   ssd_bwd_cb        grid (nchunks * kPairs, ngroups, batch): one lower 64 x 64 block (l-block i,
//                     s-block j <= i) of CB = C_l . B_s (over dstate) into q.cb
//   ssd_bwd_dcb       grid (nchunks * kPairs, ngroups * dcb_splits, batch): the same block of
//                     dCB[l, s] = sum_heads (g_l . x_s) exp(cum_l - cum_s) dt'_s (over headdim)
//                     over one share of the group's heads, masked (s <= l, same sequence, inside
//                     the chunk); fp32 workspaces. The shares (80 heads: 5 of 16) cut each CTA's
//                     serial head loop: one share per group took 1.66 ms at the shape below. Per
//                     head it also leaves the block's straddle record of r = dCB_head . CB (8c)
//   ssd_bwd_chunk_out2 only with z: y_pre for dz (1xTF32)
//   ssd_bwd_chunk_dx2 dx, X1, X2 and the dD partials (1xTF32)
//   ssd_bwd_chunk_dc2 / _db2  grid (nchunks * kNb, n tiles, batch*ngroups): rows l (dC) / s (dB),
//                     64 states; the intra-chunk part as plain products over the dCB blocks
//                     (dC = dCB B over s-blocks <= i, dB = dCB^T C over l-blocks >= i, the shares
//                     summed as the blocks load, in a fixed order), then the
//                     state term per head (the only head loop left: one K = headdim product each;
//                     dC2 leaves R_state per head and state tile)
//   ssd_bwd_dt        da from R_state, the straddle records (straddle_da), X2 and df
// A 16-bit call without z runs on its own fp16 / bf16 tensors (the host's rule, ops::ssd_bwd::
// runs_16bit): sections 8f-8i in place of chunk_dx2, dcb, dc2, db2 and chunk_dstate (16-bit
// operand tiles; the chunk states and C B^T recomputed on cuda/ssd_fwd2.cu's kernels, so
// ssd_bwd_cb does not run): 9.2 -> 4.7 ms of forward+backward kernels at the shape below (H100,
// benches/results/2026-11-27-h100-ssd-bwd-16bit/), 3.7 ms without the float32 copies
// (benches/results/2026-11-27-h100-ssd-bwd-own16/).
// 128 threads = 4 warps, warp w owns rows 16w .. 16w + 15 of each 64 x 64 tile (acc_row / acc_col).
// fp32 data (fp32 calls, and 16-bit calls with z as fp32 copies) loads 16-byte rows when
// q.vec_x / q.vec_bc allow, and with q.tf32x1 rounds operands to tf32 once instead of 3xTF32.
// A 16-bit call's error then stays within 2^-11 of each term's own size: nothing cancels after
// the rounding (tools/ssd_da_model.py models the straddle sums' float32 accumulation).
// PREDICTION (b8 L2048 nheads 80 headdim 64 dstate 128 ngroups 1 chunk 256, 1xTF32; the first
// path's dc + db take 36.0 ms there): the g x^T products are 27 GFLOP (lower blocks) once, the state
// terms 2 x 21 GFLOP; ~0.4 ms cb_dcb, ~0.5 ms each of dc2 / db2 (load- and latency-bound, not mma).
// MEASURED (H100, 2026-11-24, benches/results/2026-11-24-h100-ssd-bwd2/): cb_dcb 1.25 ms (1.66 with
// one head share per group), dc2 0.95, db2 1.02 (the first path's dc + db: 35.9 ms); chunk_out2 3.9
// and chunk_dx2 4.2 ms (3xTF32, ~18.75-25% occupancy, latency-bound per ncu); forward+backward
// 17.2 ms of kernels against 58.6 on the first path (Triton 3.5 ms in the same lease).
// 2026-11-27, the stable da (benches/results/2026-11-27-h100-ssd-bwd-stable-da/). PREDICTED: no
// chunk_out2 without z (-3.9 ms), chunk_dx2 1xTF32 (-0.6, as measured on 2026-11-24), +~0.3 for
// the straddle records and R_state: ~12.5 ms. MEASURED: 16.6 -> 12.5 ms of kernels (dx2 3.55,
// dcb 1.28 with the records, dc2 1.29 with R_state); then the shared-memory layouts, 16-byte
// loads and four loads in flight in the state passings that ncu pointed to: 9.2 ms (dx2 2.5,
// dc2 1.3, dcb 1.3, db2 0.73, the recompute's chunk state 0.47 and state passing 0.39).

// ---- 8a. the chunk prologue, once per (batch, head, chunk) ------------------------------------------
// Grid (nchunks, ceil(nheads / kPrepHeads), batch), kPrepThreads: heads_chunk_prologue
// (common/ssd.cuh: dt read for 8 heads at once, each warp scanning two) as ssd2_chunk_prep does; a
// warp stages its head's dt' and cum (and, for head 0, seg) in its own s_rec row and stores them by
// 16-byte coalesced stores (pdt / pcum / pseg rows are kQ floats, 16-byte aligned scratch slots).
// One warp a CTA over every (batch, head, chunk), each lane loading its own positions of one head,
// took 19.9 us on the H100 at b8 L2048 80 heads chunk 256 (2026-11-28).
extern "C" __global__ void __launch_bounds__(kPrepThreads, 8) ssd_bwd_prologue(const SsdBwdParams q) {
    constexpr int kPer = kQ / 32;
    const SsdParams& p = q.f;
    __shared__ __align__(16) float s_raw[kPrepHeads * kLdRaw];
    __shared__ __align__(16) float s_rec[kPrepWarps][3 * kQ];
    const i64 b = blockIdx.z, c = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    heads_chunk_prologue(p, b, (i64)blockIdx.y * kPrepHeads, c * kQ, s_raw,
                         [&](i64 h, const float(&d)[kPer], const float(&cs)[kPer], const int(&sg)[kPer]) {
                             const float* rec = s_rec[warp];
                             warp_stage_record(s_rec[warp], lane, d, cs, sg);
                             const i64 o = ((b * p.nheads + h) * p.nchunks + c) * kQ;
                             warp_copy16(q.pdt + o, rec, kQ, lane);
                             warp_copy16(q.pcum + o, rec + kQ, kQ, lane);
                             if (h == 0) warp_copy16((float*)q.pseg + (b * p.nchunks + c) * kQ, rec + 2 * kQ, kQ, lane);
                             __syncwarp();  // the row is rewritten for the warp's next head
                         });
}

// ---- 8b. CB = C_l . B_s, one lower 64 x 64 block per CTA -----------------------------------------
// Pair index -> (i, j), j <= i: blockIdx.x % kPairs2 == i (i + 1) / 2 + j.
__device__ __forceinline__ void block_pair(int& i, int& j) {
    j = blockIdx.x % kPairs2;
    i = 0;
    while (j > i) j -= ++i;
}

extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd_bwd_cb(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    __shared__ __align__(16) float s_a[kTile * kLd2];  // rows l: C
    __shared__ __align__(16) float s_o[kTile * kLd2];  // rows s: B
    int i, j;
    block_pair(i, j);
    const i64 c = blockIdx.x / kPairs2, g = blockIdx.y, b = blockIdx.z;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    const int m0 = i * kTile, s0 = j * kTile;
    if (m0 >= len) return;  // a tail chunk's unused blocks (never read)
    const int rows_l = len - m0, rows_s = len - s0;
    const int w16 = 16 * (threadIdx.x >> 5);
    const i64 blk = (((b * p.nchunks + c) * p.ngroups + g) * kQ + m0) * kQ + s0;
    float acc[8][4];
    clear(acc);
    const i64 cbase = b * p.C_s[0] + g * p.C_s[2], bbase = b * p.B_s[0] + g * p.B_s[2];
    for (int n0 = 0; n0 < p.dstate; n0 += kK) {
        const int nv = (int)p.dstate - n0;
        fill_rows(
            s_a, q.vec_bc,
            [&](int r, int k) { return r < rows_l && k < nv ? ldg4_f32<DT>(p.C, cbase + (c0 + m0 + r) * p.C_s[1] + n0 + k) : zero4(); },
            [&](int r, int k) { return r < rows_l && k < nv ? ldg_f32<DT>(p.C, cbase + (c0 + m0 + r) * p.C_s[1] + n0 + k) : 0.f; });
        fill_rows(
            s_o, q.vec_bc,
            [&](int r, int k) { return r < rows_s && k < nv ? ldg4_f32<DT>(p.B, bbase + (c0 + s0 + r) * p.B_s[1] + n0 + k) : zero4(); },
            [&](int r, int k) { return r < rows_s && k < nv ? ldg_f32<DT>(p.B, bbase + (c0 + s0 + r) * p.B_s[1] + n0 + k) : 0.f; });
        __syncthreads();
        warp_mma_q<kK, 8>(acc, [&](int m, int k) { return s_a[(w16 + m) * kLd2 + k]; },
                          [&](int k, int n) { return s_o[n * kLd2 + k]; }, q.tf32x1);
        __syncthreads();
    }
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = acc_row(2 * hh), col = acc_col(jn, 0);
            *(float2*)(q.cb + blk + (i64)r * kQ + col) = make_float2(acc[jn][2 * hh], acc[jn][2 * hh + 1]);
        }
}

// One step of a halving exchange over v[0 .. 2 kHalf): lanes with bit (2 kHalf) set keep the upper
// half, the others the lower, each adding its xor partner's copy of the half it keeps, into
// v[0 .. kHalf). (A compile-time step: a runtime half would index v dynamically, i.e. locally.)
template <int kHalf>
__device__ __forceinline__ void halve(float (&v)[16], int lane) {
    const bool up = lane & (2 * kHalf);
#pragma unroll
    for (int k = 0; k < kHalf; ++k) {
        const float send = up ? v[k] : v[k + kHalf];
        const float keep = up ? v[k + kHalf] : v[k];
        v[k] = keep + __shfl_xor_sync(0xffffffffu, send, 2 * kHalf);
    }
}

// ---- 8c. the stable da's partials of one head's block: r = dCB_head . CB -----------------------------
// rv holds r[l, s] of a 64 x 64 block in the accumulator layout (zero where masked). Writes rec (kRec
// floats, read by straddle_da): an off-diagonal block (l-block above its s-block) its column sums
// over l (rec[s]) and row sums over s (rec[64 + l]); the diagonal block rec[k] = sum over l >= k > s
// inside it (each row's exclusive prefix over s across the quad's lanes and the 8 column tiles, kept
// where l >= k, then summed over l as a column). Column sums: the 8 row groups of a warp by a halving
// exchange (each xor step keeps half of the values), then the 4 warps in order through s_col. Every
// sum in a fixed order: bitwise deterministic. Every thread calls it; rv is overwritten.
__device__ __forceinline__ void straddle_record(float (&rv)[8][4], bool diag, float* rec, float (*s_col)[kTile]) {
    const unsigned full = 0xffffffffu;
    const int lane = threadIdx.x & 31, t = lane & 3, w = threadIdx.x >> 5;
    if (diag) {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = acc_row(2 * hh);
            float run = 0.f;
#pragma unroll
            for (int jn = 0; jn < 8; ++jn) {
                const float a = rv[jn][2 * hh], pair = a + rv[jn][2 * hh + 1];
                float incl = pair;
                float o = __shfl_up_sync(full, incl, 1, 4);
                if (t >= 1) incl += o;
                o = __shfl_up_sync(full, incl, 2, 4);
                if (t >= 2) incl += o;
                float excl = __shfl_up_sync(full, incl, 1, 4);
                if (t == 0) excl = 0.f;
                const float tot = __shfl_sync(full, incl, 3, 4);
                const int col = acc_col(jn, 0);
                const float p0 = run + excl;
                rv[jn][2 * hh] = r >= col ? p0 : 0.f;
                rv[jn][2 * hh + 1] = r >= col + 1 ? p0 + a : 0.f;
                run += tot;
            }
        }
    } else {
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            float v = 0.f;
#pragma unroll
            for (int jn = 0; jn < 8; ++jn) v += rv[jn][2 * hh] + rv[jn][2 * hh + 1];
            v = quad_sum(v);
            if (t == 0) rec[kTile + acc_row(2 * hh)] = v;
        }
    }
    float v[16];  // index 2 jn + c: column acc_col(jn, c), this thread's two rows summed
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int c = 0; c < 2; ++c) v[2 * jn + c] = rv[jn][c] + rv[jn][c + 2];
    halve<8>(v, lane);  // xor 16, 8, 4: lane bit 4, 3, 2
    halve<4>(v, lane);
    halve<2>(v, lane);
    // v[0], v[1]: index 8 (lane bit 4) + 4 (bit 3) + 2 (bit 2) + c, i.e. jn = lane >> 2 (the group g)
    const int col = 8 * (lane >> 2) + 2 * t;
    s_col[w][col] = v[0];
    s_col[w][col + 1] = v[1];
    __syncthreads();
    if (threadIdx.x < kTile) {
        float sum = 0.f;
#pragma unroll
        for (int k = 0; k < kThreads / 32; ++k) sum += s_col[k][threadIdx.x];
        rec[threadIdx.x] = sum;
    }
}

// ---- 8d. the head-summed dCB, and each head's straddle record, one lower 64 x 64 block per CTA ------
// What ssd_bwd_dcb and ssd_bwd_dcb16 (8g) share:
// s_cb (pitch kLdw2) = the CB block at cb (rows l = m0 .., columns s = s0 ..) with the mask of r:
// s <= l, same sequence, both inside the chunk. 16-byte loads along s.
__device__ __forceinline__ void load_masked_cb(const float* cb, const int* seg, int m0, int s0, int len, float* s_cb) {
    for (int e = threadIdx.x; e < kTile * kTile / 4; e += kThreads) {
        const int r = e / (kTile / 4), col = (e % (kTile / 4)) * 4, l = m0 + r;
        const float4 v = *(const float4*)(cb + (i64)r * kQ + col);
        const int sl = seg[min(l, kQ - 1)], s = s0 + col;
        auto keep = [&](int u) { return l < len && s + u < len && s + u <= l && seg[s + u] == sl; };
        *(float4*)(s_cb + r * kLdw2 + col) =
            make_float4(keep(0) ? v.x : 0.f, keep(1) ? v.y : 0.f, keep(2) ? v.z : 0.f, keep(3) ? v.w : 0.f);
    }
}

// One head's g x^T block dw (accumulator layout) scaled to its dCB share, exp(cum_l - cum_s) dt'_s
// where s <= l (below: every element of an off-diagonal block), added into acc; dw then holds
// r[l, s] = that share times CB (straddle_record's input). s_cl: cum of rows l; s_cs, s_ds: cum
// and dt' of columns s (this head's).
__device__ __forceinline__ void scale_head(float (&dw)[8][4], float (&acc)[8][4], bool below, const float* s_cl,
                                           const float* s_cs, const float* s_ds, const float* s_cb) {
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = acc_row(e), col = acc_col(jn, e);
            // exp only where s <= l: cum is per chunk, so cum_l - cum_s has no sign guarantee above
            float v = 0.f;
            if (below || col <= r) v = dw[jn][e] * ex(s_cl[r] - s_cs[col]) * s_ds[col];
            acc[jn][e] += v;
            dw[jn][e] = v * s_cb[r * kLdw2 + col];  // r[l, s] of this head
        }
}

// scale_head for a block strictly below the diagonal (every s < l) with the decay factored at the
// s-block's last column ref: exp(cum_l - cum_s) dt'_s = a_l b_s, a_l = exp(cum_l - cum_ref) (this
// thread's two rows, arow), b_s = exp(cum_ref - cum_s) dt'_s (s_b, once per head by 64 threads):
// two FMUL an element where scale_head takes a FADD, FMUL, MUFU and two FMUL (ssd_bwd_dcb16; both
// factors <= 1 where A <= 0, as in ssd2_chunk_scan's accumulate_cbf_x).
__device__ __forceinline__ void scale_head_below(float (&dw)[8][4], float (&acc)[8][4], const float (&arow)[2],
                                                 const float* s_b, const float* s_cb) {
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
        const float2 bs = *(const float2*)(s_b + acc_col(jn, 0));
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = acc_row(e), col = acc_col(jn, e);
            const float v = dw[jn][e] * arow[e >> 1] * ((e & 1) ? bs.y : bs.x);
            acc[jn][e] += v;
            dw[jn][e] = v * s_cb[r * kLdw2 + col];  // r[l, s] of this head
        }
    }
}

// The block's dCB share (acc) into out (rows l = m0 .., pitch kQ), masked: same sequence, both
// inside the chunk (loaded rows past len are zero already).
__device__ __forceinline__ void store_masked_dcb(const float (&acc)[8][4], float* out, const int* seg, int m0, int s0,
                                                 int len) {
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = acc_row(2 * hh), col = acc_col(jn, 0), l = m0 + r, s = s0 + col;
            const int sl = seg[min(l, kQ - 1)];
            const bool ok0 = l < len && s < len && seg[s] == sl;
            const bool ok1 = l < len && s + 1 < len && seg[s + 1] == sl;
            *(float2*)(out + (i64)r * kQ + col) = make_float2(ok0 ? acc[jn][2 * hh] : 0.f, ok1 ? acc[jn][2 * hh + 1] : 0.f);
        }
}

extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd_bwd_dcb(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    __shared__ __align__(16) float s_a[kTile * kLd2];    // rows l: g
    __shared__ __align__(16) float s_o[kTile * kLd2];    // rows s: x
    __shared__ __align__(16) float s_cb[kTile * kLdw2];  // this block of CB, masked (rows l, columns s)
    __shared__ float s_col[kThreads / 32][kTile];        // straddle_record's column partials
    __shared__ float s_cl[kTile], s_cs[kTile], s_ds[kTile];  // this head: cum of rows l; cum, dt' of columns s
    int i, j;
    block_pair(i, j);
    const i64 c = blockIdx.x / kPairs2, g = blockIdx.y / q.dcb_splits, b = blockIdx.z;
    const int share = blockIdx.y % q.dcb_splits;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    const int m0 = i * kTile, s0 = j * kTile;
    if (m0 >= len) return;  // a tail chunk's unused blocks (never read)
    const int rows_l = len - m0, rows_s = len - s0;
    const bool fast = q.tf32x1;
    const int w16 = 16 * (threadIdx.x >> 5);
    const i64 blk = (((b * p.nchunks + c) * p.ngroups + g) * kQ + m0) * kQ + s0;
    const int pair = blockIdx.x % kPairs2;
    const int* seg = q.pseg + (b * p.nchunks + c) * kQ;
    load_masked_cb(q.cb + blk, seg, m0, s0, len, s_cb);

    const i64 split_stride = p.batch * p.nchunks * p.ngroups * kQ * kQ;  // one share's dcb array
    float acc[8][4];
    clear(acc);
    // dCB[l, s] = sum over the share's heads of (g_l . x_s) exp(cum_l - cum_s) dt'_s, s <= l
    const i64 hpg = p.nheads / p.ngroups;
    const i64 per = (hpg + q.dcb_splits - 1) / q.dcb_splits;
    const i64 h_end = min(hpg, (share + 1) * per);
    for (i64 hh = share * per; hh < h_end; ++hh) {
        const i64 h = g * hpg + hh;
        const i64 pro = ((b * p.nheads + h) * p.nchunks + c) * kQ;
        __syncthreads();  // the previous head's scaling has read s_cl / s_cs / s_ds (and s_col)
        if (threadIdx.x < kTile) {
            s_cl[threadIdx.x] = q.pcum[pro + m0 + threadIdx.x];
        } else {
            const int k = threadIdx.x - kTile;
            s_cs[k] = q.pcum[pro + s0 + k];
            s_ds[k] = q.pdt[pro + s0 + k];
        }
        float dw[8][4];
        clear(dw);
        for (int k0 = 0; k0 < p.headdim; k0 += kK) {
            const int kv = (int)p.headdim - k0;
            fill_rows(
                s_a, q.vec_x,
                [&](int r, int k) { return r < rows_l && k < kv ? ld_g4(q, b, c0 + m0 + r, h, k0 + k) : zero4(); },
                [&](int r, int k) { return r < rows_l && k < kv ? ld_g(q, b, c0 + m0 + r, h, k0 + k) : 0.f; });
            fill_rows(
                s_o, q.vec_x,
                [&](int r, int k) { return r < rows_s && k < kv ? ld_x4(p, b, c0 + s0 + r, h, k0 + k) : zero4(); },
                [&](int r, int k) { return r < rows_s && k < kv ? ld_x(p, b, c0 + s0 + r, h, k0 + k) : 0.f; });
            __syncthreads();
            warp_mma_q<kK, 8>(dw, [&](int m, int k) { return s_a[(w16 + m) * kLd2 + k]; },
                              [&](int k, int n) { return s_o[n * kLd2 + k]; }, fast);
            __syncthreads();
        }
        scale_head(dw, acc, i > j, s_cl, s_cs, s_ds, s_cb);
        straddle_record(dw, i == j, q.strad + ((b * p.nheads + h) * p.nchunks + c) * kPairs2 * kRec + pair * kRec,
                        s_col);
    }
    store_masked_dcb(acc, q.dcb + share * split_stride + blk, seg, m0, s0, len);
}

// ---- 8e. dC (kDB false) and dB (kDB true) from the dCB blocks, then the per-head state term ----------
template <bool kDB>
__device__ __forceinline__ void chunk_dcdb2(const SsdBwdParams& q) {
    const SsdParams& p = q.f;
    // kLdt: the pitch at which fragment reads that walk a tile's rows by t and columns by g hit
    // 8 t + g distinct banks (the dB operand read transposed, every B operand)
    constexpr int kLdt = kTile + 8;
    __shared__ __align__(16) float s_w[kTile * kLdt];  // dCB block [l][s] (pitch kLdw2 for dC, kLdt for dB); then A rows
    __shared__ __align__(16) float s_m[kTile * kLdt];  // B / C rows o x states n; then S rows p x states n
    __shared__ float s_f[kTile];                        // the state term's row factors (this head)

    const i64 b = blockIdx.z / p.ngroups, g = blockIdx.z % p.ngroups;
    const i64 hpg = p.nheads / p.ngroups;
    const i64 c = blockIdx.x / kNb2;
    const int i = blockIdx.x % kNb2, m0 = i * kTile, n0 = blockIdx.y * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (m0 >= len) return;
    const bool fast = q.tf32x1;
    const int w16 = 16 * (threadIdx.x >> 5);
    const int nv = (int)p.dstate - n0;  // valid state columns of the tile
    const void* M = kDB ? p.C : p.B;
    const i64 m_base = kDB ? b * p.C_s[0] + g * p.C_s[2] : b * p.B_s[0] + g * p.B_s[2];
    const i64 m_t = kDB ? p.C_s[1] : p.B_s[1];
    const float* dcb = q.dcb + ((b * p.nchunks + c) * p.ngroups + g) * kQ * kQ;
    const i64 split_stride = p.batch * p.nchunks * p.ngroups * kQ * kQ;
    // s_w[r * pitch + col] = dCB[l0 + r, s0 + col] over a 64 x 64 block (rows l), the head
    // shares summed in order; 16-byte loads along s
    auto load_dcb = [&](int l0, int s0, int pitch) {
        for (int e = threadIdx.x; e < kTile * kTile / 4; e += kThreads) {
            const int r = e / (kTile / 4), col = (e % (kTile / 4)) * 4;
            const i64 off = (i64)(l0 + r) * kQ + s0 + col;
            float4 v = *(const float4*)(dcb + off);
            for (int k = 1; k < q.dcb_splits; ++k) {
                const float4 u = *(const float4*)(dcb + k * split_stride + off);
                v = make_float4(v.x + u.x, v.y + u.y, v.z + u.z, v.w + u.w);
            }
            *(float4*)(s_w + r * pitch + col) = v;
        }
    };

    float acc[8][4];
    clear(acc);
    // intra-chunk: dC rows l: sum_{s-blocks j <= i} dCB[l, s] B_s; dB rows s: sum_{l-blocks j >= i} dCB[l, s] C_l
    const int j_begin = kDB ? i : 0, j_end = kDB ? (len + kTile - 1) / kTile : i + 1;
    for (int jb = j_begin; jb < j_end; ++jb) {
        const int o0 = jb * kTile;
        if (kDB) {
            load_dcb(o0, m0, kLdt);  // s_w[l][s] (pitch kLdt), read transposed as the A operand
        } else {
            load_dcb(m0, o0, kLdw2);  // s_w[l][s] (pitch kLdw2), rows l the A operand's rows
        }
        for (int e = threadIdx.x; e < kTile * kTile; e += kThreads) {
            const int r = e / kTile, col = e % kTile, o = o0 + r;
            s_m[r * kLdt + col] = o < len && col < nv ? ldg_f32<DT>(M, m_base + (c0 + o) * m_t + n0 + col) : 0.f;
        }
        __syncthreads();
        if constexpr (kDB) {
            warp_mma_q<kTile, 8>(acc, [&](int m, int k) { return s_w[k * kLdt + w16 + m]; },
                                 [&](int k, int n) { return s_m[k * kLdt + n]; }, fast);
        } else {
            warp_mma_q<kTile, 8>(acc, [&](int m, int k) { return s_w[(w16 + m) * kLdw2 + k]; },
                                 [&](int k, int n) { return s_m[k * kLdt + n]; }, fast);
        }
        __syncthreads();
    }

    // state term, per head: dC += e_l g_l^T H_c (H_c = 0 in chunk 0 without initial states);
    // dB += v_s dt'_s x_s^T dS_c (dS of the last chunk = dfinal, zero without it). dC also leaves
    // each head's R_state_l = sum_n C_ln (e_l g_l^T H_c)_ln over this tile's states in rowdot
    // (column blockIdx.y), the carried state's part of da (ssd_bwd_dt)
    const bool term = kDB ? (c < p.nchunks - 1 || q.has_dfinal) : (c > 0 || p.has_init);
    if (term) {
        const int rows = len - m0;
        const int* seg = q.pseg + (b * p.nchunks + c) * kQ;
        const int seg_end = seg[len - 1];
        float* s_a = s_w;  // rows r x channels k (pitch kLd2): s_w[0, 2304)
        float* s_s = s_m;  // channels k x states n (pitch kLdt): s_m[0, 2304)
        // dC: this tile's C (rows l, states n) for every head's R_state, in the halves of s_w / s_m
        // the state term leaves free: rows 0..31 at s_w + 2304, rows 32..63 at s_m + 2304 (pitch kLdt)
        constexpr int kHalf = kK * kLdt;
        static_assert(kTile * kLd2 <= kHalf && kHalf + kK * kLdt <= kTile * kLdt, "C rows must fit beside s_a / s_s");
        auto c_at = [&](int r, int col) { return (r < kK ? s_w : s_m) + kHalf + (r % kK) * kLdt + col; };
        if constexpr (!kDB) {
            const i64 c_row = b * p.C_s[0] + g * p.C_s[2];
            for (int e = threadIdx.x; e < kTile * kTile / 4; e += kThreads) {
                const int r = e / (kTile / 4), col = (e % (kTile / 4)) * 4;
                const i64 ci = c_row + (c0 + m0 + r) * p.C_s[1] + n0 + col;
                float4 v = zero4();
                if (r < rows) {
                    if (DT == 2 && q.vec_bc) {
                        if (col < nv) v = ldg4_f32<DT>(p.C, ci);
                    } else {
                        v = make_float4(col < nv ? ldg_f32<DT>(p.C, ci) : 0.f, col + 1 < nv ? ldg_f32<DT>(p.C, ci + 1) : 0.f,
                                        col + 2 < nv ? ldg_f32<DT>(p.C, ci + 2) : 0.f,
                                        col + 3 < nv ? ldg_f32<DT>(p.C, ci + 3) : 0.f);
                    }
                }
                *(float4*)c_at(r, col) = v;
            }
        }
        for (i64 hh = 0; hh < hpg; ++hh) {
            const i64 h = g * hpg + hh;
            const i64 pro = ((b * p.nheads + h) * p.nchunks + c) * kQ;
            if (threadIdx.x < kTile) {
                const int r = threadIdx.x, l = m0 + r;
                float f = 0.f;
                if (r < rows) {
                    if (kDB) {
                        if (seg[l] == seg_end) f = ex(q.pcum[pro + len - 1] - q.pcum[pro + l]) * q.pdt[pro + l];
                    } else if (seg[l] == 0) {
                        f = ex(q.pcum[pro + l]);
                    }
                }
                s_f[r] = f;
            }
            __syncthreads();
            const float* S = (kDB ? q.dstates : p.states) + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
            float ah[8][4];  // dC: this head's term alone
            if constexpr (!kDB) clear(ah);
            for (int k0 = 0; k0 < p.headdim; k0 += kK) {
                const int kv = (int)p.headdim - k0;
                if (kDB) {
                    fill_rows(
                        s_a, q.vec_x,
                        [&](int r, int k) { return r < rows && k < kv ? scale4(ld_x4(p, b, c0 + m0 + r, h, k0 + k), s_f[r]) : zero4(); },
                        [&](int r, int k) { return r < rows && k < kv ? s_f[r] * ld_x(p, b, c0 + m0 + r, h, k0 + k) : 0.f; });
                } else {
                    fill_rows(
                        s_a, q.vec_x,
                        [&](int r, int k) { return r < rows && k < kv ? scale4(ld_g4(q, b, c0 + m0 + r, h, k0 + k), s_f[r]) : zero4(); },
                        [&](int r, int k) { return r < rows && k < kv ? s_f[r] * ld_g(q, b, c0 + m0 + r, h, k0 + k) : 0.f; });
                }
                if ((p.dstate & 3) == 0) {  // fp32 workspace rows: 16-byte loads (nv a multiple of 4)
                    for (int e = threadIdx.x; e < kK * kTile / 4; e += kThreads) {
                        const int k = e / (kTile / 4), col = (e % (kTile / 4)) * 4;
                        *(float4*)(s_s + k * kLdt + col) =
                            k < kv && col < nv ? *(const float4*)(S + (i64)(k0 + k) * p.dstate + n0 + col) : zero4();
                    }
                } else {
                    for (int e = threadIdx.x; e < kK * kTile; e += kThreads) {
                        const int k = e / kTile, col = e % kTile;
                        s_s[k * kLdt + col] = k < kv && col < nv ? S[(i64)(k0 + k) * p.dstate + n0 + col] : 0.f;
                    }
                }
                __syncthreads();
                const auto fa = [&](int m, int k) { return s_a[(w16 + m) * kLd2 + k]; };
                const auto fb = [&](int k, int n) { return s_s[k * kLdt + n]; };
                if constexpr (kDB) {
                    warp_mma_q<kK, 8>(acc, fa, fb, fast);
                } else {
                    warp_mma_q<kK, 8>(ah, fa, fb, fast);
                }
                __syncthreads();
            }
            if constexpr (!kDB) {
                float rs[2] = {0.f, 0.f};
#pragma unroll
                for (int jn = 0; jn < 8; ++jn)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        rs[e >> 1] += *c_at(acc_row(e), acc_col(jn, e)) * ah[jn][e];
                        acc[jn][e] += ah[jn][e];
                    }
                store_rows(rs, q.rowdot + (b * p.nheads + h) * p.seqlen * kTiles + blockIdx.y, c0, m0, len);
            }
        }
    }
    void* out = kDB ? q.dB : q.dC;
    const i64 os0 = kDB ? q.dB_s[0] : q.dC_s[0], os1 = kDB ? q.dB_s[1] : q.dC_s[1];
    const i64 os2 = kDB ? q.dB_s[2] : q.dC_s[2];
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int r = m0 + acc_row(e), col = acc_col(jn, e);
            if (r < len && col < nv) st_f32<DT>(out, b * os0 + (c0 + r) * os1 + g * os2 + n0 + col, acc[jn][e]);
        }
}

extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dc2(const SsdBwdParams q) { chunk_dcdb2<false>(q); }
extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd_bwd_chunk_db2(const SsdBwdParams q) { chunk_dcdb2<true>(q); }

// ---- 8f. dx, X1, X2 and the dD partials on 16-bit operand tiles (the fp16 / bf16 builds) -------------
// ssd_bwd_chunk_dx2's outputs from the call's own 16-bit tensors (calls without z: load_g16; the
// params' x, B, dout and dx are the 16-bit tensors, vec_x / vec_bc then mean 16-byte rows of 16-bit
// data, headdim / dstate multiples of 8); the prologue and CB workspaces, dS_c, the row and dD
// partials are fp32 scratch as on the fp32 path. So dx is written once in x's
// dtype (no fp32 dx and no cast back) and the products run m16n8k16 on ldmatrix tiles, the way
// ssd2_chunk_scan forms W x (cuda/ssd_fwd2.cu), transposed, instead of 1xTF32 on fp32 shared memory
// with scalar fragment loads (chunk_dx2: 2.5 ms at b8 L2048 80 x 64, state 128 on the H100, 9.1
// cycles per issued instruction, 1.0 G warp instructions; benches/results/2026-11-27-h100-ssd-bwd-
// stable-da). Same grid and work split as chunk_dx2: (nchunks * kQ/64, ceil(headdim/64),
// batch*nheads), rows s (positions m0 ..) x channels p0 .., warp w rows 16w .. 16w + 15, one
// accumulator acc[8][4]:
//   1. the carried state's term (chunks with a dS_c): acc = B_s . dS_c^T over dstate, 32 states a
//      step (B and 16-bit dS_c tiles by cp.async), rows then scaled by v_s;
//      X2 = x . acc (x's tile landed with the first group)
//   2. the intra-chunk term (g = dout) over the l-blocks from the last one down to the diagonal (g tiles
//      double-buffered; the diagonal's stays for the epilogue): acc += W^T g, W^T[s, l] = CB[l, s]
//      2^(cl2_l - cl2_s) [l >= s, same sequence], built in registers from scalar loads of the CB
//      block read transposed (per load the 8 lanes of one t read 8 consecutive s: whole 32-byte
//      sectors), in the accumulator layout = the A layout of the mma (accumulate_wtg)
//   3. epilogue: dx = dt'_s acc + D g_s, X1 = x . acc - X2, the dD partial sum_s g x
// Positions past the chunk's end: their g rows are zero (tile zero fill), their CB rows zero and
// their cum the last position's (W finite), their own rows never stored.
// Tried and dropped (H100, b8 L2048, 2026-11-28, benches/results/2026-11-28-h100-ssd-small-kernels/):
// two heads of a group per CTA (B tile and CB block once for both; 168 registers, 3 CTAs an SM)
// 587 -> 643 us; the CB block staged through shared memory by cp.async and read transposed
// 585 -> 606; dx staged in shared memory for 16-byte stores 585 -> 603. ncu at 700 us (clocks
// locked): 25% occupancy, 0.48 issued a cycle per scheduler, 25% excess global sectors.
// Tried and dropped (H200, 2026-11-29, benches/results/2026-11-29-h200-ssd-scan-factored/): the
// blocks above the diagonal with the decay factored as ssd2_chunk_scan's (one FMUL an element)
// 546 -> 545 us; the CB columns refilled in registers as each pair is consumed 545 -> 570 (16-32
// bytes of spills); the diagonal block's warps skipping the k16 steps with every l < s 545 -> 550.
// MEASURED (H200, 2026-11-29 stop 30, benches/results/2026-11-29-h200-ssd-epilogues/): the
// epilogue's x / g reads issued before their first use, whole tiles without checks, and one D
// load for a per-head D (lane_d; 16 with their 64-bit index products before): 544 -> 523 us
// (predicted ~500, from the same change in ssd2_chunk_scan's epilogue: 416 -> 361 us); then its
// prologue records loaded before their first use (prologue_records; a strided load -> store loop
// had waited a round trip per position, ~8% of the stall samples): 519.5-519.9 -> 507.1-507.5 us
// (predicted ~505) in a later lease.
#if FS_DTYPE != 2
// acc += W^T g for the 64 x 64 block of l-block l0 (g's tile at lane address gb, .trans B operand):
// the A fragment of k16 step kk from the n8 columns 2 kk, 2 kk + 1 of cbv (CB[l, s] at row s = s_of,
// column l = l0 + 8 jn + t2 + (e & 1)). kMasked = false: a block strictly above the diagonal of a
// call without seq_idx (every l > s, one sequence).
template <bool kMasked>
__device__ __forceinline__ void accumulate_wtg(float (&acc)[8][4], const float (&cbv)[8][4], int l0, const int (&s_of)[2],
                                               const float (&cs2)[2], const int (&seg_s)[2], const float* s_c2,
                                               const int* s_seg, u32 gb) {
    const int t2 = 2 * (threadIdx.x & 3);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        float wv[2][4];
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            const int jn = 2 * kk + u, l = l0 + 8 * jn + t2;  // l even: 8-byte reads
            const float2 cl = *(const float2*)(s_c2 + l);
            int2 sg = make_int2(0, 0);
            if constexpr (kMasked) sg = *(const int2*)(s_seg + l);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int hh = e >> 1, odd = e & 1;
                const float w = cbv[jn][e] * ex2((odd ? cl.y : cl.x) - cs2[hh]);
                if constexpr (kMasked) {
                    wv[u][e] = l + odd >= s_of[hh] && (odd ? sg.y : sg.x) == seg_s[hh] ? w : 0.f;
                } else {
                    wv[u][e] = w;
                }
            }
        }
        u32 a[4];
        acc_to_a<DT>(a, wv[0], wv[1]);
        mma_row<8, true>(acc, a, gb + kk * 16 * kLd64 * 2, 16 * 2);
    }
}

// g = dout of positions t0 .. t0 + rows - 1, channels p0 .. p0 + hd - 1, into a 64 x 64 tile s (zero
// elsewhere), by cp.async (vec) or element loads; the caller commits. The 16-bit kernels run only for
// calls without z (the host's rule, ops::ssd_bwd: with z, g = dout silu(z) rounded to 16 bits for the
// mma put an fp16 ddt_bias at 1.1x its limit in one matrix draw, 2026-11-27), so g is dout itself.
__device__ __forceinline__ void load_g16(const SsdBwdParams& q, u16* s, i64 b, i64 h, i64 t0, int rows, int p0, int hd) {
    const u16* gd = (const u16*)q.dout + b * q.dout_s[0] + t0 * q.dout_s[1] + h * q.dout_s[2] + p0;
    load_tile<kRows, 64, kLd64>(s, gd, q.dout_s[1], rows, hd, q.vec_x);
}
#endif

extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd_bwd_chunk_dx16(const SsdBwdParams q) {
#if FS_DTYPE != 2
    const SsdParams& p = q.f;
    __shared__ __align__(16) float s_dt[kQ];
    __shared__ __align__(16) float s_c2[kQ];  // cum log2 e
    __shared__ __align__(16) int s_seg[kQ];
    __shared__ __align__(16) u16 s_g[2][kRows * kLd64];  // g: positions l x channels p
    __shared__ __align__(16) u16 s_x[kRows * kLd64];     // x: positions s x channels p
    __shared__ __align__(16) u16 s_b[kRows * kLd32];     // B: positions s x 32 states (state term, even steps)
    __shared__ __align__(16) u16 s_h[2][kRows * kLd32];  // dS_c: channels p x 32 states (step parity)
    __shared__ __align__(8) float s_dd[kThreads / 32][kTile];
    static_assert(kRows * kLd32 <= kRows * kLd64, "the odd steps' B tile lives in s_g[1]");

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const i64 c = blockIdx.x / kMBlocks;
    const int m = blockIdx.x % kMBlocks, m0 = m * kTile, p0 = blockIdx.y * kTile;
    const i64 g = h / (p.nheads / p.ngroups);
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    const int hd = (int)p.headdim - p0;
    float* ddpart = p.has_D ? q.ddpart + ((i64)blockIdx.z * q.nlblocks + blockIdx.x) * p.headdim : nullptr;
    if (m0 >= len) {
        if (ddpart) zero_dd(ddpart, p0, (int)p.headdim);
        return;
    }
    const int last = (len - 1) / kTile;  // the last l-block holding positions
    // group 0: x (for X2 and the epilogue) and the first g tile (l-block `last`), in flight during
    // the prologue and the state term
    const u16* gx = (const u16*)p.x + b * p.x_s[0] + (c0 + m0) * p.x_s[1] + h * p.x_s[2] + p0;
    load_tile<kRows, 64, kLd64>(s_x, gx, p.x_s[1], len - m0, hd, q.vec_x);
    load_g16(q, s_g[0], b, h, c0 + last * kTile, len - last * kTile, p0, hd);
    cp_async_commit();
    prologue_records(q, b, h, c, [&](int i, float dt, float cum, int sg) {
        s_dt[i] = dt;
        s_c2[i] = cum * kLog2e;
        s_seg[i] = sg;
    });
    __syncthreads();
    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5), t2 = 2 * (lane & 3);
    const int r0 = w16 + (lane >> 2);  // this thread's rows r0, r0 + 8 of the tile
    int s_of[2], seg_s[2];
    float cs2[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        s_of[hh] = m0 + r0 + 8 * hh;
        const int sc = min(s_of[hh], len - 1);
        cs2[hh] = s_c2[sc];
        seg_s[hh] = s_seg[sc];
    }

    float acc[8][4];
    clear(acc);
    float r2[2] = {0.f, 0.f};
    // 1. dxu_state_s = v_s dS_c B_s (dS of the last chunk is dfinal: zero without it)
    if (c < p.nchunks - 1 || q.has_dfinal) {
        const u16* dS = q.dstates16 + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate + (i64)p0 * p.dstate;
        const u16* gb = (const u16*)p.B + b * p.B_s[0] + (c0 + m0) * p.B_s[1] + g * p.B_s[2];
        const int ds = (int)p.dstate;
        // two stages: step k + 1's tiles in flight while step k's land (one stage left each
        // step's load latency exposed, dstate / 32 times a CTA). The odd steps' B tile sits in
        // s_g[1], which the intra part first fills after this loop's last barrier.
        auto sb = [&](int st) { return st ? s_g[1] : s_b; };  // (an array of the two spilled to the stack)
        const int nsteps = (ds + 31) / 32;
        auto load = [&](int k, int st) {
            // B rows s x states n0 .. n0 + 31; dS_c rows p0 + r (r < hd) x the same states (16-bit,
            // rounded by the reverse state passing)
            const int n0 = 32 * k;
            load_tile<kRows, 32, kLd32>(sb(st), gb + n0, p.B_s[1], len - m0, ds - n0, q.vec_bc);
            load_tile<kRows, 32, kLd32>(s_h[st], dS + n0, p.dstate, hd, ds - n0, q.vec_states16);
            cp_async_commit();
        };
        load(0, 0);
        for (int k = 0; k < nsteps; ++k) {
            next_stage(k, nsteps, load);  // (the first step also waits for group 0)
            const u32 a_base = smem_u32(sb(k & 1) + w16 * kLd32 + lane_a(lane, kLd32));
            const u32 b_base = smem_u32(s_h[k & 1] + lane_bn(lane, kLd32));
#pragma unroll
            for (int kk = 0; kk < 2; ++kk) {
                u32 a[4];
                ldsm_x4(a, a_base + kk * 32);
                mma_row<8, false>(acc, a, b_base + kk * 32, 16 * kLd32 * 2);
            }
            __syncthreads();
        }
        const float cl2_end = s_c2[len - 1];
        const int seg_end = s_seg[len - 1];
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int s = s_of[hh];
            const float v = s < len && seg_s[hh] == seg_end ? ex2(cl2_end - cs2[hh]) : 0.f;
            const int r = r0 + 8 * hh;
#pragma unroll
            for (int jn = 0; jn < 8; ++jn) {
                acc[jn][2 * hh] *= v;
                acc[jn][2 * hh + 1] *= v;
                const float2 xv = unpack2<DT>(*(const u32*)(s_x + r * kLd64 + 8 * jn + t2));
                r2[hh] += xv.x * acc[jn][2 * hh] + xv.y * acc[jn][2 * hh + 1];
            }
        }
    }

    // 2. dxu_intra_s = sum_{l >= s} (B_s.C_l) decay(l, s) g_l, l-blocks last .. m
    // CB[l, s] of block (l-block i, s-block m) for this thread: cbb[(64 i + 8 jn + odd) kQ + 8 hh]
    const float* cbb = q.cb + ((b * p.nchunks + c) * p.ngroups + g) * kQ * kQ + (i64)t2 * kQ + m0 + r0;
    const u32 gb_lane = lane_bt(lane, kLd64) * 2;
    const bool fast = !p.has_seq;
    const int nblk = last - m + 1;
#pragma unroll 1
    for (int k = 0; k < nblk; ++k) {
        const int i = last - k;
        // the CB block into registers before waiting on g
        const float* cbp = cbb + (i64)i * kTile * kQ;
        float cbv[8][4];
#pragma unroll
        for (int jn = 0; jn < 8; ++jn)
#pragma unroll
            for (int e = 0; e < 4; ++e) cbv[jn][e] = __ldg(cbp + (8 * jn + (e & 1)) * kQ + 8 * (e >> 1));
        // step k + 1 is l-block i - 1 < last: whole
        next_stage(k, nblk, [&](int, int st) {
            load_g16(q, s_g[st], b, h, c0 + (i - 1) * kTile, kTile, p0, hd);
            cp_async_commit();
        });
        const u32 gbs = smem_u32(s_g[k & 1]) + gb_lane;
        if (fast && i > m)
            accumulate_wtg<false>(acc, cbv, i * kTile, s_of, cs2, seg_s, s_c2, s_seg, gbs);
        else
            accumulate_wtg<true>(acc, cbv, i * kTile, s_of, cs2, seg_s, s_c2, s_seg, gbs);
        if (k + 1 < nblk) __syncthreads();  // stage k & 1 is refilled by the next iteration
    }

    // 3. epilogue: g of the rows s from the diagonal block's tile (the last one loaded). Every
    // shared-memory read is issued before the first use (behind per-element column checks each
    // waited alone, as in ssd2_chunk_scan's epilogue); a whole tile (64 rows and channels, aligned
    // dx rows) takes no checks.
    const u16* s_gd = s_g[(nblk - 1) & 1];
    float dv[8][2];
    lane_d(dv, p, h, p0, hd, t2);
    float dd[8][2], rt[2] = {0.f, 0.f};
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) dd[jn][0] = dd[jn][1] = 0.f;
    u32 xw[2][8], gw[2][8];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int jn = 0; jn < 8; ++jn) {  // (rows and columns past the valid ones were zero-filled)
            const int off = (r0 + 8 * hh) * kLd64 + 8 * jn + t2;
            xw[hh][jn] = *(const u32*)(s_x + off);
            gw[hh][jn] = *(const u32*)(s_gd + off);
        }
    auto epilogue = [&](auto full) {
        constexpr bool kFull = decltype(full)::value;
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = r0 + 8 * hh, s = m0 + r;
            if (!kFull && s >= len) continue;
            const float dts = s_dt[s];
            u16* const o16 = (u16*)q.dx + b * q.dx_s[0] + (c0 + s) * q.dx_s[1] + h * q.dx_s[2] + p0;
#pragma unroll
            for (int jn = 0; jn < 8; ++jn) {
                const int col = 8 * jn + t2;
                if (!kFull && col >= hd) continue;
                const float2 xv = unpack2<DT>(xw[hh][jn]);
                const float2 gv = unpack2<DT>(gw[hh][jn]);
                const float a0 = acc[jn][2 * hh], a1 = acc[jn][2 * hh + 1];
                rt[hh] += xv.x * a0 + xv.y * a1;
                dd[jn][0] += gv.x * xv.x;
                dd[jn][1] += gv.y * xv.y;
                const float v0 = dts * a0 + dv[jn][0] * gv.x, v1 = dts * a1 + dv[jn][1] * gv.y;
                if (kFull || q.vec_x) {
                    *(u32*)(o16 + col) = pack2<DT>(v0, v1);
                } else {
                    o16[col] = f32_to_half<DT>(v0);
                    if (col + 1 < hd) o16[col + 1] = f32_to_half<DT>(v1);
                }
            }
        }
    };
    if (q.vec_x && hd >= kTile && m0 + kTile <= len) epilogue(Flag<true>{});
    else epilogue(Flag<false>{});
    float r1[2] = {rt[0] - r2[0], rt[1] - r2[1]};
    const i64 row0 = (i64)blockIdx.z * p.seqlen * kTiles + blockIdx.y;
    store_rows(r1, q.x1 + row0, c0, m0, len);
    store_rows(r2, q.x2 + row0, c0, m0, len);
    if (ddpart) store_dd(dd, s_dd, ddpart, p0, (int)p.headdim);
#endif
}

// ---- 8g. ssd_bwd_dcb on 16-bit operand tiles (the fp16 / bf16 builds) ---------------------------------
// ssd_bwd_dcb's outputs (the head-summed dCB block of one share, each head's straddle record) from
// the call's own 16-bit g and x (as for ssd_bwd_chunk_dx16): per head
// and 64-channel step, g (rows l) and x (rows s) arrive as 16-bit tiles by cp.async and g x^T runs
// m16n8k16 from ldmatrix (A = g [l][p], B = x [s][p], both non-transposed), where ssd_bwd_dcb loads
// fp32 copies into fp32 shared memory and runs 1xTF32 (1.29 ms at b8 L2048 80 x 64 on the H100,
// 2026-11-27). One stage of tiles: the next (head, step)'s loads are issued as soon as every warp
// has read the current one, so they fly under the head's scaling and straddle record, with the
// next head's cum / dt' rows in the same cp.async group. Grid, masks,
// sums and their order as ssd_bwd_dcb (the same reduction order over heads). Blocks below the
// diagonal scale each head's g x^T by a_l b_s, the decay factored at the s-block's last column
// (scale_head_below; b_s formed once per head by 64 threads): H200 2026-11-29, b8 L2048 80 x 64,
// 344.4-344.9 -> 329.9-333.9 us (predicted ~300: the MUFU and its chain were a third of what
// held it; benches/results/2026-11-29-h200-ssd-scan-factored/).
extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd_bwd_dcb16(const SsdBwdParams q) {
#if FS_DTYPE != 2
    const SsdParams& p = q.f;
    __shared__ __align__(16) u16 s_g[kRows * kLd64];      // rows l: g, 64 channels
    __shared__ __align__(16) u16 s_x[kRows * kLd64];      // rows s: x, 64 channels
    __shared__ __align__(16) float s_cb[kTile * kLdw2];   // this block of CB, masked (rows l, columns s)
    __shared__ float s_col[kThreads / 32][kTile];         // straddle_record's column partials
    // per head (parity): cum of the rows l, cum and dt' of the columns s (16-byte cp.async)
    __shared__ __align__(16) float s_cl[2][kTile];
    __shared__ __align__(16) float s_cs[2][kTile];
    __shared__ __align__(16) float s_ds[2][kTile];
    __shared__ __align__(16) float s_bs[2][kTile];  // below the diagonal: b_s (scale_head_below)
    int i, j;
    block_pair(i, j);
    const i64 c = blockIdx.x / kPairs2, g = blockIdx.y / q.dcb_splits, b = blockIdx.z;
    const int share = blockIdx.y % q.dcb_splits;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    const int m0 = i * kTile, s0 = j * kTile;
    if (m0 >= len) return;  // a tail chunk's unused blocks (never read)
    const int rows_l = len - m0, rows_s = len - s0;
    const i64 blk = (((b * p.nchunks + c) * p.ngroups + g) * kQ + m0) * kQ + s0;
    const int pair = blockIdx.x % kPairs2;
    const int* seg = q.pseg + (b * p.nchunks + c) * kQ;
    const i64 hpg = p.nheads / p.ngroups;
    const i64 per = (hpg + q.dcb_splits - 1) / q.dcb_splits;
    const i64 h_begin = share * per, h_end = min(hpg, (share + 1) * per);
    const int nks = (int)((p.headdim + 63) / 64);  // 64-channel steps per head

    // the tiles of (head hh, step ks) and, at a head's first step, its cum / dt' rows
    auto issue = [&](i64 hh, int ks) {
        const i64 h = g * hpg + hh;
        const int k0 = 64 * ks, kv = (int)p.headdim - k0;
        load_g16(q, s_g, b, h, c0 + m0, rows_l, k0, kv);
        const u16* gx = (const u16*)p.x + b * p.x_s[0] + (c0 + s0) * p.x_s[1] + h * p.x_s[2] + k0;
        load_tile<kRows, 64, kLd64>(s_x, gx, p.x_s[1], rows_s, kv, q.vec_x);
        if (ks == 0) {  // in the same group: a thread's global loads here held its warp until they landed
            const i64 pro = ((b * p.nheads + h) * p.nchunks + c) * kQ;
            const int par = (int)(hh & 1), u = threadIdx.x & 15;
            if (threadIdx.x < 16) cp_async_ca<16>(smem_u32(s_cl[par] + 4 * u), q.pcum + pro + m0 + 4 * u, 16);
            else if (threadIdx.x < 32) cp_async_ca<16>(smem_u32(s_cs[par] + 4 * u), q.pcum + pro + s0 + 4 * u, 16);
            else if (threadIdx.x < 48) cp_async_ca<16>(smem_u32(s_ds[par] + 4 * u), q.pdt + pro + s0 + 4 * u, 16);
        }
        cp_async_commit();
    };
    if (h_begin < h_end) issue(h_begin, 0);
    load_masked_cb(q.cb + blk, seg, m0, s0, len, s_cb);

    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5);
    const u32 a_base = smem_u32(s_g + w16 * kLd64 + lane_a(lane, kLd64));
    const u32 b_base = smem_u32(s_x + lane_bn(lane, kLd64));
    const i64 split_stride = p.batch * p.nchunks * p.ngroups * kQ * kQ;  // one share's dcb array
    float acc[8][4];
    clear(acc);
    // dCB[l, s] = sum over the share's heads of (g_l . x_s) exp(cum_l - cum_s) dt'_s, s <= l
    for (i64 hh = h_begin; hh < h_end; ++hh) {
        float dw[8][4];
        clear(dw);
        const int par = (int)(hh & 1);
        for (int ks = 0; ks < nks; ++ks) {
            cp_async_wait<0>();
            __syncthreads();  // the stage (and at ks 0 the head's cum / dt' rows) is visible
            // below the diagonal: the head's b_s (the barrier ending this step publishes it; the
            // other parity's, read by the previous head's scaling, is not touched)
            if (i > j && ks == 0 && threadIdx.x < kTile)
                s_bs[par][threadIdx.x] = ex(s_cs[par][kTile - 1] - s_cs[par][threadIdx.x]) * s_ds[par][threadIdx.x];
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                u32 a[4];
                ldsm_x4(a, a_base + kk * 32);
                mma_row<8, false>(dw, a, b_base + kk * 32, 16 * kLd64 * 2);
            }
            __syncthreads();  // every warp has read the stage: the next one may overwrite it
            const bool head_done = ks + 1 == nks;  // one call site: issue inlined once here
            const i64 nh = head_done ? hh + 1 : hh;
            if (nh < h_end) issue(nh, head_done ? 0 : ks + 1);
        }
        const i64 h = g * hpg + hh;
        if (i > j) {
            const float cref = s_cs[par][kTile - 1];
            const float arow[2] = {ex(s_cl[par][acc_row(0)] - cref), ex(s_cl[par][acc_row(2)] - cref)};
            scale_head_below(dw, acc, arow, s_bs[par], s_cb);
        } else {
            scale_head(dw, acc, false, s_cl[par], s_cs[par], s_ds[par], s_cb);
        }
        straddle_record(dw, i == j, q.strad + ((b * p.nheads + h) * p.nchunks + c) * kPairs2 * kRec + pair * kRec,
                        s_col);
    }
    store_masked_dcb(acc, q.dcb + share * split_stride + blk, seg, m0, s0, len);
#endif
}

// ---- 8h. chunk_dc2 / chunk_db2 on 16-bit operand tiles (the fp16 / bf16 builds) ----------------------
// chunk_dcdb2's dC / dB (and dC's R_state) from the call's own 16-bit B, C, x and dout (calls without
// z), m16n8k16 on ldmatrix tiles instead of 1xTF32 on fp32 copies
// (dc2 1.31 ms, db2 0.74 at b8 L2048 80 x 64 on the H100, 2026-11-27). Grid and work split as
// chunk_dcdb2: (nchunks * kQ/64, ceil(dstate/64), batch*ngroups), rows m0 .. (l for dC, s for dB) x
// states n0 .., warp w rows 16w .. 16w + 15:
//   intra: acc += dCB B (dC, over s-blocks <= i) / dCB^T C (dB, over l-blocks >= i): the dCB block's
//          splits summed in fp32 by 16-byte rows, rounded to 16 bits into shared memory, A by
//          ldmatrix (dB .trans); the B / C tile by cp.async, .trans operand
//   state term, per head: ah = g H_c (dC) / x dS_c (dB) over headdim (64 channels a stage: the
//          16-bit g / x tile and the 16-bit state rows (q.states16 / q.dstates16, rounded by the
//          reverse state passing) and the head's cum / dt rows by cp.async; kDcdbStages buffers,
//          the next stages in flight under the mma), then
//          acc += f ah with the head's row factor f (e_l, or v_s dt'_s) in fp32, each thread its
//          two rows' from the staged cum / dt rows; dC also leaves
//          R_state_l = sum_n C_ln (f ah)_ln per head (rowdot)
// Head shares (q.dcdb_shares, the host's dcdb_shares: grid y = (share, state tile)): each CTA runs
// one share of the group's heads in the state term, share 0 also the intra part, and stores its
// fp32 partial (share_part); ssd_bwd_share_sum_dc / _db add the shares in order and write dC / dB
// in their dtype. One share (q.dcdb_shares == 1) stores dC / dB itself and the host launches no sum
// (the real-time shape's two sums took 2.5 us each on the H100). At b8 L2048 80 heads, state 128 the unsplit grid was 512 CTAs walking 80 heads
// each: 1.3-1.9 waves, 70% of issue cycles without an eligible warp (ncu, 2026-11-27); 4 shares
// took dc16 / db16 from 464 / 487 to 362 / 284 us (+ 21 + 21 us of sums; H100, 2026-11-27). A
// call without a state term (one chunk, no initial or final state) runs one share. db16 is bounded to 3 CTAs per SM: the share code took it from 168
// to 208 registers under NVRTC 13.0 (168 with the bound, no stack).
#if FS_DTYPE != 2
// Stages of the state term's loop: three where an SM has 228 KB of shared memory (sm_90 / sm_100:
// 3 CTAs an SM, as the 168 registers allow, at 57-67 KB each), two elsewhere. s_m / s_s live in
// dynamic shared memory, 2 x kDcdbStages x kRows x kLd64 16-bit values (the host's dcdb16_smem).
#if FS_ARCH == 90 || FS_ARCH == 100 || FS_ARCH == 103
constexpr int kDcdbStages = 3;
#else
constexpr int kDcdbStages = 2;
#endif
template <bool kDB>
__device__ __forceinline__ void chunk_dcdb16(const SsdBwdParams& q) {
    const SsdParams& p = q.f;
    extern __shared__ __align__(16) u16 s_dyn16[];
    // intra: B / C rows o x states (stage 0); then g / x rows x channels, a stage each
    u16 (*s_m)[kRows * kLd64] = reinterpret_cast<u16 (*)[kRows * kLd64]>(s_dyn16);
    u16 (*s_s)[kRows * kLd64] = s_m + kDcdbStages;  // the state term's state rows p x states n (16-bit)
    __shared__ __align__(16) u16 s_c[kRows * kLd64];     // dC: this tile's C rows l x states n (R_state)
    __shared__ __align__(16) float s_fr[kDcdbStages][2][kTile];  // a head's cum / dt rows for its row factors
    __shared__ float s_fe[kDcdbStages];                  // dB: the head's cum at the chunk's last position

    const i64 b = blockIdx.z / p.ngroups, g = blockIdx.z % p.ngroups;
    const i64 hpg = p.nheads / p.ngroups;
    const i64 c = blockIdx.x / kNb2;
    const int ntn = (int)((p.dstate + kTile - 1) / kTile);
    const int n_tile = blockIdx.y % ntn, share = blockIdx.y / ntn;  // grid y = (share, state tile)
    const int i = blockIdx.x % kNb2, m0 = i * kTile, n0 = n_tile * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (m0 >= len) return;
    const int nv = (int)p.dstate - n0;  // valid state columns of the tile
    // this share's heads of the group: [h_lo, h_hi) (all of them without a split)
    const int nsh = q.dcdb_shares, per_share = (int)((hpg + nsh - 1) / nsh);
    const int h_lo = min((int)hpg, share * per_share), h_hi = min((int)hpg, h_lo + per_share);
    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5), t2 = 2 * (lane & 3);
    const int r0 = w16 + (lane >> 2);
    const i64 m_t = kDB ? p.C_s[1] : p.B_s[1];
    const u16* gm = (const u16*)(kDB ? p.C : p.B) + b * (kDB ? p.C_s[0] : p.B_s[0]) + g * (kDB ? p.C_s[2] : p.B_s[2]) +
                    (c0 * m_t + n0);
    const float* dcb = q.dcb + ((b * p.nchunks + c) * p.ngroups + g) * kQ * kQ;
    const i64 split_stride = p.batch * p.nchunks * p.ngroups * kQ * kQ;
    const u32 lbt = lane_bt(lane, kLd64) * 2;  // .trans B operand lane offset (bytes)

    float acc[8][4];
    clear(acc);
    // the intra-chunk part in share 0 only. The dCB block (rows l x columns s; dB takes the block
    // below its s-block) is read by 16-byte rows, its head splits summed in fp32 in split order,
    // rounded to 16 bits into s_s[0] (free until the state term); A fragments by ldmatrix, dB's
    // .trans (A = block^T). (Fragment-order fp32 loads, 32 a thread a split with a 256-byte stride
    // for dB, made this part ~25 us of both kernels at the real-time shape on the H100.)
    const int j_begin = kDB ? i : 0, j_end = share > 0 ? j_begin : kDB ? (len + kTile - 1) / kTile : i + 1;
    const u32 a_intra = kDB ? smem_u32(s_s[0] + w16 + lane_at(lane, kLd64)) : smem_u32(s_s[0] + w16 * kLd64 + lane_a(lane, kLd64));
    for (int jb = j_begin; jb < j_end; ++jb) {
        const int o0 = jb * kTile;
        load_tile<kRows, 64, kLd64>(s_m[0], gm + o0 * m_t, m_t, len - o0, nv, q.vec_bc);
        cp_async_commit();
        const float* blk = dcb + (kDB ? (i64)o0 * kQ + m0 : (i64)m0 * kQ + o0);
#pragma unroll
        for (int u = 0; u < kRows * 16 / kThreads; ++u) {
            const int e = threadIdx.x + u * kThreads, r = e / 16, k = (e % 16) * 4;
            float4 v = *(const float4*)(blk + (i64)r * kQ + k);
            for (int sp = 1; sp < q.dcb_splits; ++sp) {
                const float4 w = *(const float4*)(blk + sp * split_stride + (i64)r * kQ + k);
                v.x += w.x;
                v.y += w.y;
                v.z += w.z;
                v.w += w.w;
            }
            *(uint2*)(s_s[0] + r * kLd64 + k) = make_uint2(pack2<DT>(v.x, v.y), pack2<DT>(v.z, v.w));
        }
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            u32 a[4];
            if constexpr (kDB) ldsm_x4_trans(a, a_intra + kk * 16 * kLd64 * 2);
            else ldsm_x4(a, a_intra + kk * 32);
            mma_row<8, true>(acc, a, smem_u32(s_m[0]) + lbt + kk * 16 * kLd64 * 2, 16 * 2);
        }
        __syncthreads();
    }

    const bool term = (kDB ? (c < p.nchunks - 1 || q.has_dfinal) : (c > 0 || p.has_init)) && h_hi > h_lo;
    if (term) {
        const int rows = len - m0;
        const int* seg = q.pseg + (b * p.nchunks + c) * kQ;
        const int seg_end = seg[len - 1];
        if constexpr (!kDB) {  // C rows of this tile for R_state (waited with the first stage)
            const u16* gc = (const u16*)p.C + b * p.C_s[0] + (c0 + m0) * p.C_s[1] + g * p.C_s[2] + n0;
            load_tile<kRows, 64, kLd64>(s_c, gc, p.C_s[1], rows, nv, q.vec_bc);
            cp_async_commit();
        }
        // Stages (head hh, 64-channel step ks), kDcdbStages buffers: stage t + kDcdbStages - 1's A
        // tile and state rows (H_c / dS_c in 16 bits, from the reverse state passing) by cp.async,
        // issued after stage t's barrier into the buffer stage t - 1 read, land under the mma of
        // stages t .. (kDcdbStages - 1 stages of loads in flight; an empty group past the last).
        // stage t: this share's head h_lo + t / nks (local head t / nks), channel step t % nks
        const int nks = (int)((p.headdim + 63) / 64);
        const int nstages = (h_hi - h_lo) * nks;
        const i64 a_t = kDB ? p.x_s[1] : q.dout_s[1];
        auto issue = [&](int t, int buf) {
            const i64 h = g * hpg + h_lo + t / nks;
            const int k0 = 64 * (t % nks);
            if (t % nks == nks - 1) {  // the head's last stage: its cum / dt rows for the row factors
                const i64 pro = ((b * p.nheads + h) * p.nchunks + c) * kQ;
                const int u = threadIdx.x;
                if (u < 16) cp_async_ca<16>(smem_u32(s_fr[buf][0] + 4 * u), q.pcum + pro + m0 + 4 * u, 16);
                else if (kDB && u < 32) cp_async_ca<16>(smem_u32(s_fr[buf][1] + 4 * (u - 16)), q.pdt + pro + m0 + 4 * (u - 16), 16);
                else if (kDB && u == 32) cp_async_ca<4>(smem_u32(&s_fe[buf]), q.pcum + pro + len - 1, 4);
            }
            const u16* ga = kDB ? (const u16*)p.x + b * p.x_s[0] + (c0 + m0) * p.x_s[1] + h * p.x_s[2]
                                : (const u16*)q.dout + b * q.dout_s[0] + (c0 + m0) * q.dout_s[1] + h * q.dout_s[2];
            load_tile<kRows, 64, kLd64>(s_m[buf], ga + k0, a_t, rows, (int)p.headdim - k0, q.vec_x);
            // state rows p = k0 + r x states n0 .. (zero past headdim / dstate)
            const u16* S = (kDB ? q.dstates16 : q.states16) + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
            load_tile<kRows, 64, kLd64>(s_s[buf], S + (i64)k0 * p.dstate + n0, p.dstate, (int)p.headdim - k0, nv,
                                        q.vec_states16);
            cp_async_commit();
        };
        // this thread's rows r0, r0 + 8 of the tile: inside the chunk and on the sequence whose
        // factor is not zero (dB: the last position's; dC: the first's)
        bool row_ok[2];
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const int r = r0 + 8 * h2;
            row_ok[h2] = r < rows && (kDB ? seg[m0 + r] == seg_end : seg[m0 + r] == 0);
        }
        first_stages_n<kDcdbStages>(nstages, issue);
        float ah[8][4];
        for (int t = 0; t < nstages; ++t) {
            const int buf = t % kDcdbStages, ks = t % nks;
            const i64 hh = t / nks;
            cp_async_wait<kDcdbStages - 2>();
            __syncthreads();  // stage t landed; every warp is past stage t - 1 (its buffers free)
            const int tn = t + kDcdbStages - 1;
            if (tn < nstages) issue(tn, tn % kDcdbStages);
            else cp_async_commit();
            if (ks == 0) clear(ah);
            const u32 a_base = smem_u32(s_m[buf] + w16 * kLd64 + lane_a(lane, kLd64));
            const u32 sb = smem_u32(s_s[buf]) + lbt;
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                u32 a[4];
                ldsm_x4(a, a_base + kk * 32);
                mma_row<8, true>(ah, a, sb + kk * 16 * kLd64 * 2, 16 * 2);
            }
            if (ks == nks - 1) {  // the head's term: acc += f ah (dC: R_state too)
                // its row factors, each thread its two rows' from the stage's cum / dt rows (a
                // few threads' global loads between the stages left the others at the barrier)
                float rs[2] = {0.f, 0.f};
#pragma unroll
                for (int h2 = 0; h2 < 2; ++h2) {
                    const int r = r0 + 8 * h2;
                    float f = 0.f;
                    if (row_ok[h2]) f = kDB ? ex(s_fe[buf] - s_fr[buf][0][r]) * s_fr[buf][1][r] : ex(s_fr[buf][0][r]);
#pragma unroll
                    for (int jn = 0; jn < 8; ++jn) {
                        const float a0 = f * ah[jn][2 * h2], a1 = f * ah[jn][2 * h2 + 1];
                        if constexpr (!kDB) {
                            const float2 cv = unpack2<DT>(*(const u32*)(s_c + r * kLd64 + 8 * jn + t2));
                            rs[h2] += cv.x * a0 + cv.y * a1;
                        }
                        acc[jn][2 * h2] += a0;
                        acc[jn][2 * h2 + 1] += a1;
                    }
                }
                if constexpr (!kDB) {
                    const i64 h = g * hpg + h_lo + hh;
                    store_rows(rs, q.rowdot + (b * p.nheads + h) * p.seqlen * kTiles + n_tile, c0, m0, len);
                }
            }
        }
    }
    // this share's fp32 partial (every row < len and state < dstate, zeros included); the sum
    // kernel writes the gradient in its dtype. (A second store path, straight into the 16-bit
    // dB / dC, took db16 from 168 to 214 registers under NVRTC 13.0 before the 16-bit states; with
    // them it costs none: 168 / 168, no stack, NVRTC 13.0, 2026-11-28.)
    if (q.dcdb_shares == 1) {  // one share: the gradient itself, in its dtype (no sum kernel)
        void* out = kDB ? q.dB : q.dC;
        const i64 os1 = kDB ? q.dB_s[1] : q.dC_s[1];
        const i64 o = b * (kDB ? q.dB_s[0] : q.dC_s[0]) + (c0 + m0) * os1 + g * (kDB ? q.dB_s[2] : q.dC_s[2]) + n0;
#pragma unroll
        for (int jn = 0; jn < 8; ++jn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = acc_row(e), col = acc_col(jn, e);
                if (m0 + r < len && col < nv) st_f32<DT>(out, o + r * os1 + col, acc[jn][e]);
            }
        return;
    }
    // (pairs as 8-byte stores where dstate is even: 4-byte stores used 13 of every 32-byte sector)
    float* part = q.share_part + (((share * p.batch + b) * p.seqlen + c0) * p.ngroups + g) * p.dstate + n0;
    const bool pair = (p.dstate & 1) == 0;
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int h2 = 0; h2 < 2; ++h2) {
            const int r = m0 + acc_row(2 * h2), col = acc_col(jn, 0);
            if (r >= len || col >= nv) continue;
            float* o = part + (i64)r * p.ngroups * p.dstate + col;
            if (pair) {
                *(float2*)o = make_float2(acc[jn][2 * h2], acc[jn][2 * h2 + 1]);
            } else {
                o[0] = acc[jn][2 * h2];
                if (col + 1 < nv) o[1] = acc[jn][2 * h2 + 1];
            }
        }
}

// dC / dB: the shares' partials summed in share order (launched for two or more, at most
// kMaxShares), in the gradient's dtype. q.sum_vec (dense rows): 4 elements a thread, every share's
// 16-byte load issued before the first add (a run-time trip count had kept them one round trip at a
// time), the 4 sums stored as one 8-byte group, the same sums in the same order (bitwise the one-
// element form); grid ceil(elements / (4 kPassThreads)). Else one element a thread through the
// strides; grid ceil(elements / kPassThreads).
constexpr int kMaxShares = 8;
template <bool kDB>
__device__ __forceinline__ void share_sum(const SsdBwdParams& q) {
    const SsdParams& p = q.f;
    const i64 n = p.batch * p.seqlen * p.ngroups * p.dstate;
    if (q.sum_vec) {
        const i64 e = ((i64)blockIdx.x * kPassThreads + threadIdx.x) * 4;
        if (e >= n) return;
        float4 part[kMaxShares];
#pragma unroll
        for (int k = 0; k < kMaxShares; ++k)
            part[k] = k < q.dcdb_shares ? *(const float4*)(q.share_part + k * n + e) : zero4();
        float4 v = zero4();
#pragma unroll
        for (int k = 0; k < kMaxShares; ++k)
            if (k < q.dcdb_shares) v.x += part[k].x, v.y += part[k].y, v.z += part[k].z, v.w += part[k].w;
        u16* out = (u16*)(kDB ? q.dB : q.dC) + e;
        *(uint2*)out = make_uint2(pack2<DT>(v.x, v.y), pack2<DT>(v.z, v.w));
        return;
    }
    const i64 e = (i64)blockIdx.x * kPassThreads + threadIdx.x;
    if (e >= n) return;
    float v = 0.f;
    for (int k = 0; k < q.dcdb_shares; ++k) v += q.share_part[k * n + e];
    const i64 nn = e % p.dstate, g = (e / p.dstate) % p.ngroups, t = (e / (p.dstate * p.ngroups)) % p.seqlen;
    const i64 b = e / (p.dstate * p.ngroups * p.seqlen);
    void* out = kDB ? q.dB : q.dC;
    const i64 os0 = kDB ? q.dB_s[0] : q.dC_s[0], os1 = kDB ? q.dB_s[1] : q.dC_s[1];
    const i64 os2 = kDB ? q.dB_s[2] : q.dC_s[2];
    st_f32<DT>(out, b * os0 + t * os1 + g * os2 + nn, v);
}
#endif

// dC takes 202 registers under NVRTC 13.0 (the H100 machine's; 13.2 chooses 168): two CTAs per
// SM, 12.5% occupancy, 70% of issue cycles idle under ncu (2026-11-27). Bounding it to three CTAs
// (168 registers, 8 bytes of stack) made it slower on the H100, 464 -> 534-546 us at b8 L2048:
// not kept.
extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dc16(const SsdBwdParams q) {
#if FS_DTYPE != 2
    chunk_dcdb16<false>(q);
#endif
}
extern "C" __global__ void __launch_bounds__(kThreads, 3) ssd_bwd_chunk_db16(const SsdBwdParams q) {
#if FS_DTYPE != 2
    chunk_dcdb16<true>(q);
#endif
}
extern "C" __global__ void __launch_bounds__(kPassThreads) ssd_bwd_share_sum_dc(const SsdBwdParams q) {
#if FS_DTYPE != 2
    share_sum<false>(q);
#endif
}
extern "C" __global__ void __launch_bounds__(kPassThreads) ssd_bwd_share_sum_db(const SsdBwdParams q) {
#if FS_DTYPE != 2
    share_sum<true>(q);
#endif
}

// ---- 8i. L_c on 16-bit operand tiles (the fp16 / bf16 builds) ---------------------------------------
// ssd_bwd_chunk_dstate's L_c = sum_l e_l g_l^T C_l, e_l = [seg_l == 0] exp(cum_l), from the call's own
// 16-bit dout (calls without z: g = dout) and C, the way ssd2_chunk_state forms S_c (cuda/ssd_fwd2.cu)
// instead of 1xTF32 on fp32 copies with scalar fragment loads. Grid (nchunks, ceil(headdim/64) *
// ceil(dstate/128), batch*nheads): channels p0 .. p0 + 63 x states n0 .. n0 + 127 per CTA, warp w
// channels 16w .. 16w + 15, acc[16][4]; K = the chunk's positions, 32 a step in kStateStages cp.async stages
// (common/ssd_tiles.cuh weighted_state_product, ssd2_chunk_state's loop). A = g^T by ldmatrix .trans,
// its k columns (positions) scaled by e_l in fp32, then rounded to 16 bits once or split into a hi / lo
// pair of 16-bit values (two mma on the same B fragments: ~16 significant bits where one bf16
// rounding keeps 8; the fp32 kernel rounds it to tf32, 11). B = C by .trans.
// e_l from the prologue records (q.pcum / q.pseg, ssd_bwd_prologue). L_c into q.dstates (fp32), as
// ssd_bwd_chunk_dstate leaves it for the reverse state passing.
// Two entries, one product each: ssd_bwd_chunk_dstate16 rounds the scaled g once (one mma, 8
// significant bits in bf16, as Triton's dstates kernel; the default: on the H200, 149.5 against
// 170.9 us at b8 L2048, worst ddt / dA / ddt_bias error ratios over 40 seeded cases 0.30 / 0.28 /
// 0.66 against the split's 0.30 / 0.25 / 0.74), ssd_bwd_chunk_dstate16_hilo takes the
// hi / lo pair (FLASHSCAN_SSD_DSTATE_HILO=1). Both products in one kernel behind a runtime flag cost
// the split's form 171 -> 181 us at b8 L2048 (NVRTC's register choice under the shared bound).
// The dout / C tiles in StateStep's stages, as ssd2_chunk_state's (common/ssd_tiles.cuh). On sm_90a
// the one-rounding product runs on wgmma as ssd2_chunk_state's (C in swizzled stages, state_product):
// 149.3 -> 127.3-128.7 us at b8 L2048 on the H200 (2026-11-29, stop 31), then 64 positions a step in
// two stages (54 KB static, four CTAs an SM at 128 registers: FS_STATE_BOUNDS) 129.8-130.0 ->
// 122.2-123.5 (stop 32); the hi / lo pair stays on mma.sync (32 a step, kStateStages).
template <bool kHiLo>
__device__ __forceinline__ void chunk_dstate16(const SsdBwdParams& q) {
#if FS_DTYPE != 2
    const SsdParams& p = q.f;
    __shared__ __align__(8) float s_e[kQ];
    constexpr bool kWg = kStateWg && !kHiLo;  // the hi / lo pair stays on mma.sync
    using SS = StateStep<kWg>;                 // positions a step, stages
    __shared__ __align__(16) u16 s_g[SS::kStages][SS::kPos * kLd64];  // positions l x channels p
    __shared__ StateBTiles<kWg> s_ct;                               // positions l x states n
    u16* const s_c = s_ct.base();

    const i64 bh = blockIdx.z, b = bh / p.nheads, h = bh % p.nheads, c = blockIdx.x;
    const i64 g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + 127) / 128);
    const int p0 = (blockIdx.y / ntn) * 64, n0 = (blockIdx.y % ntn) * 128;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    const int hd = (int)p.headdim - p0, ds = (int)p.dstate - n0;  // valid columns of the tiles
    const u16* gd = (const u16*)q.dout + b * q.dout_s[0] + c0 * q.dout_s[1] + h * q.dout_s[2] + p0;
    const u16* gc = (const u16*)p.C + b * p.C_s[0] + c0 * p.C_s[1] + g * p.C_s[2] + n0;
    auto load = [&](int k, int st) {
        const int k0 = SS::kPos * k;
        load_tile<SS::kPos, 64, kLd64>(s_g[st], gd + k0 * q.dout_s[1], q.dout_s[1], len - k0, hd, q.vec_x);
        load_state_b<kWg>(s_c + st * StateBTiles<kWg>::kStage, gc + k0 * p.C_s[1], p.C_s[1], len - k0, ds, q.vec_bc);
        cp_async_commit();
    };
    const int nsteps = (len + SS::kPos - 1) / SS::kPos;
    first_stages_n<SS::kStages>(nsteps, load);  // in flight while e_l is formed
    {
        const i64 pro = (bh * p.nchunks + c) * kQ;
        const int* seg = q.pseg + (b * p.nchunks + c) * kQ;
        for (int l = threadIdx.x; l < kQ; l += kThreads) s_e[l] = l < len && seg[l] == 0 ? ex(q.pcum[pro + l]) : 0.f;
        // (the first __syncthreads of the loop publishes s_e)
    }
    float acc[16][4];
    clear(acc);
    state_product<kHiLo, kWg>(acc, &s_g[0][0], s_c, s_e, nsteps, load);
    // (the hi / lo form keeps the checked store: the whole-tile one took it to 130 registers, 3 CTAs an SM)
    store_state_tile<!kHiLo>(q.dstates + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate, acc, p0, hd,
                             n0, ds, p.dstate);
#endif
}
extern "C" __global__ void FS_STATE_BOUNDS ssd_bwd_chunk_dstate16(const SsdBwdParams q) {
    chunk_dstate16<false>(q);
}
extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dstate16_hilo(const SsdBwdParams q) {
    chunk_dstate16<true>(q);
}

// ---- 8j. L_c and the reverse state passing in one kernel (sm_90a) ----------------------------------
// Why: ssd_bwd_chunk_dstate16 writes every L_c in fp32 (168 MB at b8 L2048 80 heads x 64, state 128)
// and ssd_bwd_state_passing reads them back beside the kept 16-bit H_c to write the 16-bit dS_c:
// 120 + 93 us on the H200 (2026-12-04, benches/results/2026-12-04-h200-ssd-state-pass, call 7).
// The forward's ssd2_chunk_state_pass (cuda/ssd_fwd2.cu) in reverse: one CTA per (batch, head,
// 64 x 128 tile) walks the head's chunks from the last to the first with G = dL/dH_{c+1} in the
// wgmma accumulator (dfinal_states, or zero, to start). At chunk c's first step it stores dS_c = G
// (16-bit, q.dstates16: what dx16 / dc16 / db16 read), adds each warp's df_c partial <G, H_c> over
// its 16 rows into dfpart (H_c, the forward's kept 16-bit state, by TMA into s_h), scales G by f_c
// and then accumulates L_c = sum_l e_l g_l^T C_l onto it (weighted_state_step_wg: a = dout, b = C,
// w = e, e_l = exp(cum_l) from the prologue's records); after chunk 0, dinitial_states = G. So L_c
// never leaves the SM and the fp32 dS_c / L_c workspace is not allocated.
// Grid (batch * nheads, ceil(headdim / 64) * ceil(dstate / 128)), 128 threads (warp w rows p 16w ..
// 16w + 15 of the tile, acc[16][4] as ssd2_chunk_state_pass's). Steps of kSpPos positions run flat
// over the chunks in processing order j = nc - 1 - c (the last chunk, maybe short, first: it alone
// has fewer than kBsSpc steps) through kBsStages TMA stages that thread 0 fills (dout one 64-channel
// box, C two 64-state boxes, zero fill past the tensors' ends); chunk c's record (cum, kQ floats of
// q.pcum) rides on its first step's mbarrier into s_rec[j & 1], turned into e in place. H_c comes
// on its own mbarrier into one 16 KB buffer, issued once every thread has read H_{c+1} (chunk
// c + 1's first step): in flight during chunk c + 1's steps.
// Two stages (one step in flight during a step's product), not the forward's three: with s_h the
// three would take 55 KB, four CTAs an SM (640 CTAs of b8 80 heads 1.2 waves); two take 43 KB and
// 96 registers, five an SM, one wave.
// When it runs (src/ops/ssd_bwd_state_pass.rs): 16-bit calls with the forward's kept H_c (kept),
// a carried state, no seq_idx (e_l and f_c without resets), dout / C / H_c rows TMA can address, the
// one-rounding L_c (not FLASHSCAN_SSD_DSTATE_HILO), unless FLASHSCAN_SSD_BWD_STATE_PASS=0.
// Written and checked on the CPU (2026-12-04: NVRTC 13.0 / 13.5 builds at 96 registers, its SASS,
// tests/test_ssd_bwd_pass_model.py's replay of its ring and arithmetic); predicted ~120-130 us
// against the pair's 120 + 93 at b8 L2048 on the H200 (the forward twin's 123-125 against 115 + 66).
// MEASURED 2026-12-05 (H200, benches/results/2026-12-05-h200-ssd-pending/): 141.3 us against the
// pair's 120.8 + 93.4 in one lease, the fp32 L_c workspace (168 MB there) not allocated, its own
// tests passing. 2026-12-05, second lease (benches/results/2026-12-05-h200-ssd-bwd-state-pass/): the
// full SSD GPU suite with it and memcheck / racecheck / synccheck clean; 140.5-141.3 us, the SSD
// step 1829-1835 against the pair's 1907-1915 us: the default since.
#if FS_SSD_STATE_WGMMA && FS_DTYPE != 2
constexpr int kSpPos = 32, kBsStages = 2, kBsCtas = 5;
constexpr int kBsSpc = kQ / kSpPos;         // steps of a whole chunk
constexpr int kSpBox = kSpPos * 128;        // bytes of one kSpPos x 64 16-bit box
constexpr int kBsStageBytes = 3 * kSpBox;   // dout, then C's two 64-state blocks
constexpr int kBsHBytes = 2 * kRows * 128;  // H_c: two 64 x 64 16-bit boxes, swizzled
constexpr int kBsRecBytes = kQ * 4;         // a record: cum
static_assert(kBsStageBytes % 1024 == 0 && kBsHBytes % 1024 == 0, "swizzled boxes start 1024-aligned");

// The kernel's one parameter (host mirror: SsdBwdSpParams in src/ops/ssd_bwd_state_pass.rs).
struct SsdBwdSpParams {
    fs::TensorMap tm_g;  // dout (headdim, nheads, seqlen, batch), box 64 x 1 x kSpPos x 1
    fs::TensorMap tm_c;  // C (dstate, ngroups, seqlen, batch), box 64 x 1 x kSpPos x 1
    fs::TensorMap tm_h;  // the kept 16-bit H_c (dstate, headdim, nheads, batch * nchunks), box 64 x 64
    SsdBwdParams q;
};

extern "C" __global__ void __launch_bounds__(kThreads, kBsCtas)
    ssd_bwd_dstate_pass(const __grid_constant__ SsdBwdSpParams P) {
    const SsdBwdParams& q = P.q;
    const SsdParams& p = q.f;
    static_assert(kBsSpc >= kBsStages, "a record buffer is reloaded only after its chunk's last step");
    __shared__ __align__(16) float s_rec[2][kQ];  // chunk j's record at s_rec[j & 1]: cum, then e
    __shared__ __align__(128) unsigned char s_raw[kBsStages * kBsStageBytes + kBsHBytes + 1024];
    __shared__ __align__(8) unsigned long long s_full[kBsStages];
    __shared__ __align__(8) unsigned long long s_hbar;
    unsigned char* const s_st = align_smem_1024(s_raw);
    unsigned char* const s_h = s_st + kBsStages * kBsStageBytes;
    const u32 full0 = smem_u32(&s_full[0]), hbar = smem_u32(&s_hbar);

    const i64 bh = blockIdx.x, b = bh / p.nheads, h = bh % p.nheads;
    const i64 g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + 127) / 128);
    const int p0 = (blockIdx.y / ntn) * 64, n0 = (blockIdx.y % ntn) * 128;
    const int hd = (int)p.headdim - p0, ds = (int)p.dstate - n0;  // valid columns of the tile
    const int nc = (int)p.nchunks;
    const int last_len = (int)(p.seqlen - (i64)(nc - 1) * kQ);
    const int first_steps = (last_len + kSpPos - 1) / kSpPos;  // the last chunk's, visited first
    const int nsteps = first_steps + (nc - 1) * kBsSpc;
    // (a tile of <= 64 states reads neither C's nor H's second block: those columns are never used)
    const bool two = ds > 64;
    // step t -> processing index j (chunk nc - 1 - j) and step k of that chunk
    auto step_of = [&](int t, int& j, int& k) {
        if (t < first_steps) {
            j = 0, k = t;
        } else {
            const int u = t - first_steps;
            j = 1 + u / kBsSpc, k = u - (j - 1) * kBsSpc;
        }
    };
    auto issue = [&](int t) {  // thread 0: step t into stage t % kBsStages
        if (t >= nsteps) return;
        int j, k;
        step_of(t, j, k);
        const int c = nc - 1 - j, st = t % kBsStages;
        const u32 bar = full0 + 8 * st, dst = smem_u32(s_st + st * kBsStageBytes);
        const int s0 = c * kQ + k * kSpPos;
        mbar_arrive_expect_tx(bar, (two ? 3 : 2) * kSpBox + (k == 0 ? kBsRecBytes : 0));
        if (k == 0) bulk_load(smem_u32(s_rec[j & 1]), q.pcum + (bh * nc + c) * kQ, kBsRecBytes, bar);
        tma_load_4d(dst, &P.tm_g, p0, (int)h, s0, (int)b, bar);
        tma_load_4d(dst + kSpBox, &P.tm_c, n0, (int)g, s0, (int)b, bar);
        if (two) tma_load_4d(dst + 2 * kSpBox, &P.tm_c, n0 + 64, (int)g, s0, (int)b, bar);
    };
    auto issue_h = [&](int c) {  // thread 0: H_c's tile into s_h
        mbar_arrive_expect_tx(hbar, (two ? 2 : 1) * kRows * 128);
        tma_load_4d(smem_u32(s_h), &P.tm_h, n0, p0, (int)h, (int)(b * nc + c), hbar);
        if (two) tma_load_4d(smem_u32(s_h) + kRows * 128, &P.tm_h, n0 + 64, p0, (int)h, (int)(b * nc + c), hbar);
    };
    if (threadIdx.x == 0) {
#pragma unroll
        for (int st = 0; st < kBsStages; ++st) mbar_init(full0 + 8 * st, 1);
        mbar_init(hbar, 1);
        mbar_init_fence();
        tma_prefetch_map(&P.tm_g);
        tma_prefetch_map(&P.tm_c);
        tma_prefetch_map(&P.tm_h);
        issue_h(nc - 1);
#pragma unroll
        for (int t = 0; t < kBsStages - 1; ++t) issue(t);
    }

    float acc[16][4];  // G: dfinal_states (or zero), then G <- f_c G + L_c chunk by chunk
    load_state_acc(acc, q.has_dfinal, q.dfinal, q.dfinal_s, q.dfinal_dtype, b, h, p0, hd, n0, ds);
    float(&d)[64] = *reinterpret_cast<float(*)[64]>(&acc[0][0]);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    // this warp's df partials: dfpart[(bh, 4 tile + warp, c)] (q.npass_tiles = tiles * 4 of them)
    float* const dfpart = q.dfpart + (bh * q.npass_tiles + (i64)blockIdx.y * (kThreads / 32) + w) * nc;
    for (int t = 0; t < nsteps; ++t) {
        // every thread is done with step t - 1's stage (and the barriers' initialisation is visible)
        __syncthreads();
        if (threadIdx.x == 0) issue(t + kBsStages - 1);  // into the stage step t - 1 read
        int j, k;
        step_of(t, j, k);
        const int c = nc - 1 - j, st = t % kBsStages;
        if (k == 0) {
            const float f = p.decay[bh * nc + c];  // (issued before the waits)
            // dS_c = G, as ssd_bwd_state_passing leaves it for dx16 / dc16 / db16
            store_h16_tile(q.dstates16 + ((b * nc + c) * p.nheads + h) * p.headdim * p.dstate, acc, p0, hd, n0, ds,
                           p.dstate);
            // df_c's partial <G, H_c> over this warp's rows (zeros past the tile's valid rows and
            // columns on both sides: TMA's fill, G's sums of zero-filled operands)
            mbar_wait(hbar, j & 1);
            float part = 0.f;
#pragma unroll
            for (int jn = 0; jn < 16; ++jn) {
                if (jn >= 8 && !two) break;  // (uniform; acc's columns 64.. hold no state there)
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) {
                    const float2 hv =
                        unpack2<DT>(*(const u32*)(s_h + swz_offset(kRows, acc_row(2 * hh), acc_col(jn, 0))));
                    part += acc[jn][2 * hh] * hv.x + acc[jn][2 * hh + 1] * hv.y;
                }
            }
#pragma unroll
            for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
            if (lane == 0) dfpart[c] = part;
#pragma unroll
            for (int i = 0; i < 64; ++i) d[i] *= f;
            mbar_wait(full0 + 8 * st, (t / kBsStages) & 1);  // step t's boxes and chunk c's record
            float* const r = s_rec[j & 1];
            const int len = (int)min((i64)kQ, p.seqlen - (i64)c * kQ);
            // cum -> e in place, each thread its own positions (chunk j + 2's record reuses the
            // buffer only after chunk j's last step: its load is issued past a later barrier)
            for (int l = threadIdx.x; l < kQ; l += kThreads) r[l] = l < len ? ex(r[l]) : 0.f;
            fence_proxy_async();  // (the bulk copy of chunk j + 2's record writes over these)
            __syncthreads();      // the weights; every thread's reads of s_h
            if (threadIdx.x == 0 && c > 0) issue_h(c - 1);
        } else {
            mbar_wait(full0 + 8 * st, (t / kBsStages) & 1);  // step t's boxes
        }
        const unsigned char* stage = s_st + st * kBsStageBytes;
        weighted_state_step_wg<kSpPos, true>(d, (const u16*)stage, (const u16*)(stage + kSpBox),
                                             s_rec[j & 1] + kSpPos * k);
    }
    if (p.has_init)
#pragma unroll
        for (int jn = 0; jn < 16; ++jn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int pp = acc_row(e), nn = acc_col(jn, e);
                if (pp < hd && nn < ds)
                    st_any(q.dinit, b * q.dinit_s[0] + h * q.dinit_s[1] + (p0 + pp) * q.dinit_s[2] + (n0 + nn) * q.dinit_s[3],
                           p.init_dtype, acc[jn][e]);
            }
}
#endif
