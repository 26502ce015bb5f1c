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
//          da_k = sum_{l>=k} (R_l - dt'_l X1_l) + sum_{s<k} dt'_s X2_s + df_c f_c
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
//                         element per thread, chunks in reverse: dS_c over L_c, df_c partials, dinit
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
    float* dfpart;        // (batch*nheads, npass_tiles, nchunks): df_c per element tile
    float* ddpart;        // (batch*nheads, nlblocks, headdim): dD per 64-row block, or null
    float* dapart;        // (batch*nheads, nchunks)
    float* dbpart;        // (batch*nheads, nchunks)
    i64 dout_s[3], dfinal_s[4], dx_s[3], ddt_s[3], dB_s[3], dC_s[3], dz_s[3], dinit_s[4], dD_s[2];
    i64 dA_s, dbias_s;
    i64 npass_tiles, nlblocks;
    int dfinal_dtype, has_dfinal, ptiles, d_per_channel;  // D (nheads, headdim) vs (nheads,)
};
static_assert(sizeof(SsdBwdParams) == 912, "SsdBwdParams layout changed: update the host mirror");

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

// ---- 1. y_pre again: dz, R_l, dD partials --------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_out(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    __shared__ float s_dd[kThreads / 32][kTile];
    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const i64 c = blockIdx.x / kMBlocks;
    const int m0 = (blockIdx.x % kMBlocks) * kTile, p0 = blockIdx.y * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    float* ddpart = q.ddpart + ((i64)blockIdx.z * q.nlblocks + blockIdx.x) * p.headdim;
    if (m0 >= len) {  // a tail chunk's empty row block: its dD partial is zero
        if (p.has_D)
            for (int i = threadIdx.x; i < kTile; i += kThreads)
                if (p0 + i < p.headdim) ddpart[p0 + i] = 0.f;
        return;
    }
    chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    float acc[8][4];
    chunk_output(p, b, h, c, m0, p0, len, s_dt, s_cum, s_seg, acc);

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
    store_rows(rs, q.rowdot + (i64)blockIdx.z * p.seqlen * kTiles + blockIdx.y, c0, m0, len);
    if (p.has_D) {
        const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
        for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                float v = dd[j][i];
                v += __shfl_xor_sync(0xffffffffu, v, 4);
                v += __shfl_xor_sync(0xffffffffu, v, 8);
                v += __shfl_xor_sync(0xffffffffu, v, 16);
                if (lane < 4) s_dd[w][8 * j + 2 * lane + i] = v;
            }
        __syncthreads();
        for (int col = threadIdx.x; col < kTile; col += kThreads) {
            float v = 0.f;
#pragma unroll
            for (int i = 0; i < kThreads / 32; ++i) v += s_dd[i][col];
            if (p0 + col < p.headdim) ddpart[p0 + col] = v;
        }
    }
}

// ---- 2. L_c = sum_l e_l g_l C_l^T ----------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dstate(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    __shared__ float s_g[kK][kTile + 4];  // positions l x head channels p
    __shared__ float s_c[kK][kTile + 4];  // positions l x states n, times e_l

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads, c = blockIdx.x;
    const i64 g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + kTile - 1) / kTile);
    const int p0 = (blockIdx.y / ntn) * kTile, n0 = (blockIdx.y % ntn) * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    const int w16 = 16 * (threadIdx.x >> 5);

    float acc[8][4];
    clear(acc);
    for (int s0 = 0; s0 < len; s0 += kK) {
        for (int i = threadIdx.x; i < kK * kTile; i += kThreads) {
            const int r = i / kTile, col = i % kTile, l = s0 + r;
            float gv = 0.f, cv = 0.f;
            if (l < len && s_seg[l] == 0) {
                const i64 t = c0 + l;
                if (p0 + col < p.headdim) gv = ld_g(q, b, t, h, p0 + col);
                if (n0 + col < p.dstate)
                    cv = ex(s_cum[l]) * ldg_f32<DT>(p.C, b * p.C_s[0] + t * p.C_s[1] + g * p.C_s[2] + n0 + col);
            }
            s_g[r][col] = gv;
            s_c[r][col] = cv;
        }
        __syncthreads();
        warp_mma<kK, 8>(acc, [&](int m, int k) { return s_g[k][w16 + m]; }, [&](int k, int n) { return s_c[k][n]; });
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
extern "C" __global__ void __launch_bounds__(kPassThreads) ssd_bwd_state_passing(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    __shared__ float s_red[kPassThreads / 32];
    const i64 pn = p.headdim * p.dstate;
    const i64 e = (i64)blockIdx.x * kPassThreads + threadIdx.x;
    const bool valid = e < pn;
    const i64 b = blockIdx.y / p.nheads, h = blockIdx.y % p.nheads;
    const i64 pp = valid ? e / p.dstate : 0, nn = valid ? e % p.dstate : 0;
    float G = 0.f;  // dL / dH_{c+1} while chunk c is visited
    if (valid && q.has_dfinal)
        G = ld_any(q.dfinal, b * q.dfinal_s[0] + h * q.dfinal_s[1] + pp * q.dfinal_s[2] + nn * q.dfinal_s[3],
                   q.dfinal_dtype);
    const float* decay = p.decay + (b * p.nheads + h) * p.nchunks;
    float* dfpart = q.dfpart + ((i64)blockIdx.y * q.npass_tiles + blockIdx.x) * p.nchunks;
    for (i64 c = p.nchunks - 1; c >= 0; --c) {
        const i64 idx = ((b * p.nchunks + c) * p.nheads + h) * pn + e;
        float part = 0.f;
        if (valid) {
            const float L = q.dstates[idx];
            part = G * p.states[idx];
            q.dstates[idx] = G;
            G = L + decay[c] * G;
        }
        const float tot = block_sum(part, s_red);
        if (threadIdx.x == 0) dfpart[c] = tot;
    }
    if (valid && p.has_init)
        st_any(q.dinit, b * q.dinit_s[0] + h * q.dinit_s[1] + pp * q.dinit_s[2] + nn * q.dinit_s[3], p.init_dtype, G);
}

// ---- 4. dx, X1, X2 -------------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd_bwd_chunk_dx(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    constexpr int kLd = kK + 4, kLdw = kTile + 4;
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    // s_b (64 rows s x 32 states) and s_c (64 rows l x 32 states) while B C^T is formed; then the
    // same bytes hold s_w (64 rows s x 64 columns l).
    __shared__ __align__(16) float s_bc[2 * kTile * kLd];
    __shared__ float s_x[kTile][kLdw];  // g: positions l x channels p; dS^T: states k x channels p
    float* s_b = s_bc;
    float* s_c = s_bc + kTile * kLd;
    float* s_w = s_bc;

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const i64 c = blockIdx.x / kMBlocks;
    const int m0 = (blockIdx.x % kMBlocks) * kTile, p0 = blockIdx.y * kTile;
    const i64 g = h / (p.nheads / p.ngroups);
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (m0 >= len) return;
    chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    const int w16 = 16 * (threadIdx.x >> 5);
    const i64 cb_base = b * p.C_s[0] + g * p.C_s[2];
    const i64 bb_base = b * p.B_s[0] + g * p.B_s[2];

    float acc_i[8][4], acc_s[8][4];
    clear(acc_i);
    clear(acc_s);
    // dxu_intra_s = sum_{l >= s} (B_s.C_l) decay(l, s) g_l
    for (int l0 = m0; l0 < len; l0 += kTile) {
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
        for (int i = threadIdx.x; i < kTile * kTile; i += kThreads) {
            const int r = i / kTile, col = i % kTile, l = l0 + r;
            s_x[r][col] = l < len && p0 + col < p.headdim ? ld_g(q, b, c0 + l, h, p0 + col) : 0.f;
        }
        __syncthreads();
        warp_mma<kTile, 8>(acc_i, [&](int m, int k) { return s_w[(w16 + m) * kLdw + k]; },
                           [&](int k, int n) { return s_x[k][n]; });
        __syncthreads();
    }
    // dxu_state_s = v_s dS_c B_s (dS of the last chunk is dfinal: zero without it)
    if (c < p.nchunks - 1 || q.has_dfinal) {
        const float* dS = q.dstates + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
        const float cum_end = s_cum[len - 1];
        const int seg_end = s_seg[len - 1];
        for (int n0 = 0; n0 < p.dstate; n0 += kK) {
            for (int i = threadIdx.x; i < kTile * kK; i += kThreads) {
                const int r = i / kK, k = i % kK, s = m0 + r;
                float bv = 0.f;
                if (s < len && n0 + k < p.dstate && s_seg[s] == seg_end)
                    bv = ex(cum_end - s_cum[s]) * ldg_f32<DT>(p.B, bb_base + (c0 + s) * p.B_s[1] + n0 + k);
                s_b[r * kLd + k] = bv;
            }
            for (int i = threadIdx.x; i < kK * kTile; i += kThreads) {
                const int k = i / kTile, col = i % kTile;
                s_x[k][col] = n0 + k < p.dstate && p0 + col < p.headdim ? dS[(i64)(p0 + col) * p.dstate + n0 + k] : 0.f;
            }
            __syncthreads();
            warp_mma<kK, 8>(acc_s, [&](int m, int k) { return s_b[(w16 + m) * kLd + k]; },
                            [&](int k, int n) { return s_x[k][n]; });
            __syncthreads();
        }
    }
    float r1[2] = {0.f, 0.f}, r2[2] = {0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int s = m0 + acc_row(e), pp = p0 + acc_col(j, e);
            if (s >= len || pp >= p.headdim) continue;
            const i64 t = c0 + s;
            const float xv = ld_x(p, b, t, h, pp);
            float dx = s_dt[s] * (acc_i[j][e] + acc_s[j][e]);
            if (p.has_D) dx += ld_any(p.D, h * p.D_s[0] + pp * p.D_s[1], p.D_dtype) * ld_g(q, b, t, h, pp);
            st_f32<DT>(q.dx, b * q.dx_s[0] + t * q.dx_s[1] + h * q.dx_s[2] + pp, dx);
            r1[e >> 1] += xv * acc_i[j][e];
            r2[e >> 1] += xv * acc_s[j][e];
        }
    const i64 row0 = (i64)blockIdx.z * p.seqlen * kTiles + blockIdx.y;
    store_rows(r1, q.x1 + row0, c0, m0, len);
    store_rows(r2, q.x2 + row0, c0, m0, len);
}

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

// ---- 6. da, ddt, dA and ddt_bias partials (one warp per chunk and head) ---------------------------
extern "C" __global__ void __launch_bounds__(32) ssd_bwd_dt(const SsdBwdParams q) {
    const SsdParams& p = q.f;
    constexpr int kPer = kQ / 32;
    const int lane = threadIdx.x;
    const i64 bh = blockIdx.y, b = bh / p.nheads, h = bh % p.nheads, c = blockIdx.x;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    const float A = ld_any(p.A, h * p.A_s, p.A_dtype);
    const float bias = p.has_dt_bias ? ld_any(p.dt_bias, h * p.bias_s, p.bias_dtype) : 0.f;
    const float* rowdot = q.rowdot + bh * p.seqlen * kTiles;
    const float* x1 = q.x1 + bh * p.seqlen * kTiles;
    const float* x2 = q.x2 + bh * p.seqlen * kTiles;
    float d[kPer], pre[kPer], x12[kPer], a1[kPer], a2[kPer];
    bool inside[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int pos = lane * kPer + i;
        d[i] = pre[i] = x12[i] = a1[i] = a2[i] = 0.f;
        inside[i] = false;
        if (pos < len) {
            const i64 t = c0 + pos;
            float v = ld_any(p.dt, b * p.dt_s[0] + t * p.dt_s[1] + h * p.dt_s[2], p.dt_dtype) + bias;
            pre[i] = v;
            if (p.softplus) v = softplus(v);
            inside[i] = v >= p.dt_min && v <= p.dt_max;
            v = fminf(fmaxf(v, p.dt_min), p.dt_max);
            float rd = 0.f, s1 = 0.f, s2 = 0.f;
            for (int k = 0; k < q.ptiles; ++k) {
                rd += rowdot[t * kTiles + k];
                s1 += x1[t * kTiles + k];
                s2 += x2[t * kTiles + k];
            }
            d[i] = v;
            x12[i] = s1 + s2;
            a1[i] = rd - v * s1;  // summed over l >= k
            a2[i] = v * s2;       // summed over s < k
        }
    }
    // df_c f_c: the chunk's decay gradient (element-tile partials summed in a fixed order)
    const float f = p.decay[bh * p.nchunks + c];
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
    float dA = 0.f, db = 0.f;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
        const int pos = lane * kPer + i;
        if (pos >= len) continue;
        const i64 t = c0 + pos;
        dA += da[i] * d[i];
        float v = inside[i] ? x12[i] + da[i] * A : 0.f;
        if (p.softplus && pre[i] <= 20.f) v *= sigmoid(pre[i]);
        st_any(q.ddt, b * q.ddt_s[0] + t * q.ddt_s[1] + h * q.ddt_s[2], p.dt_dtype, v);
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
    const bool per_channel = q.d_per_channel;
    float dsum = 0.f;
    for (i64 pp = threadIdx.x; pp < p.headdim; pp += kPassThreads) {
        float v = 0.f;
        for (i64 bb = 0; bb < p.batch; ++bb) {
            const float* part = q.ddpart + (bb * p.nheads + h) * q.nlblocks * p.headdim + pp;
            for (i64 lb = 0; lb < q.nlblocks; ++lb) v += part[lb * p.headdim];
        }
        if (per_channel) st_any(q.dD, h * q.dD_s[0] + pp * q.dD_s[1], p.D_dtype, v);
        dsum += v;
    }
    if (!per_channel) {
        dsum = block_sum(dsum, s_red);
        if (threadIdx.x == 0) st_any(q.dD, h * q.dD_s[0], p.D_dtype, dsum);
    }
}
