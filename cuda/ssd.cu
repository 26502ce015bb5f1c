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

#include "common/ssd.cuh"

// ---- 1. chunk states ---------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd_chunk_state(const SsdParams p) {
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    // pitch kTile + 8: the A fragment (read along its columns) and the B fragment hit 8 t + g distinct banks
    __shared__ __align__(16) float s_x[kK][kTile + 8];  // positions s x head channels p
    __shared__ __align__(16) float s_b[kK][kTile + 8];  // positions s x states n, times [seg_s == seg_end] exp(cum_end - cum_s) dt'_s

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
    __syncthreads();  // every thread has read cum_end / seg_end
    // s_dt becomes the per-position weight [seg_s == seg_end] exp(cum_end - cum_s) dt'_s (once, not per element)
    for (int s = threadIdx.x; s < kQ; s += kThreads) s_dt[s] = s < len && s_seg[s] == seg_end ? ex(cum_end - s_cum[s]) * s_dt[s] : 0.f;
    __syncthreads();

    float acc[8][4];
    clear(acc);
    const bool vec = DT == 2 && p.vec_xb;  // then headdim - p0 and dstate - n0 are multiples of 4
    for (int s0 = 0; s0 < len; s0 += kK) {
        if (vec) {
            for (int i = threadIdx.x; i < kK * kTile / 4; i += kThreads) {
                const int r = i / (kTile / 4), col = (i % (kTile / 4)) * 4, s = s0 + r;
                float4 xv = make_float4(0.f, 0.f, 0.f, 0.f), bv = xv;
                // plain 16-byte loads: ldg4_f32's __ldg form took an 8-byte stack frame (sm_80, chunk 256)
                if (s < len) {
                    const i64 t = c0 + s;
                    if (p0 + col < p.headdim) xv = *(const float4*)((const float*)p.x + b * p.x_s[0] + t * p.x_s[1] + h * p.x_s[2] + p0 + col);
                    const float w = s_dt[s];
                    if (n0 + col < p.dstate && w != 0.f) {
                        bv = *(const float4*)((const float*)p.B + b * p.B_s[0] + t * p.B_s[1] + g * p.B_s[2] + n0 + col);
                        bv = make_float4(w * bv.x, w * bv.y, w * bv.z, w * bv.w);
                    }
                }
                *(float4*)(&s_x[r][col]) = xv;
                *(float4*)(&s_b[r][col]) = bv;
            }
        } else {
            for (int i = threadIdx.x; i < kK * kTile; i += kThreads) {
                const int r = i / kTile, col = i % kTile, s = s0 + r;
                float xv = 0.f, bv = 0.f;
                if (s < len) {
                    const i64 t = c0 + s;
                    if (p0 + col < p.headdim) xv = ldg_f32<DT>(p.x, b * p.x_s[0] + t * p.x_s[1] + h * p.x_s[2] + p0 + col);
                    const float w = s_dt[s];
                    if (n0 + col < p.dstate && w != 0.f) bv = w * ldg_f32<DT>(p.B, b * p.B_s[0] + t * p.B_s[1] + g * p.B_s[2] + n0 + col);
                }
                s_x[r][col] = xv;
                s_b[r][col] = bv;
            }
        }
        __syncthreads();
        warp_mma_q<kK, 8>(acc, [&](int m, int k) { return s_x[k][w16 + m]; }, [&](int k, int n) { return s_b[k][n]; },
                          p.tf32x1);
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
    // kGroup chunks' S (and decays) loaded before any of their H is stored (the compiler cannot
    // move a load above a store to the same array): kGroup loads in flight per thread, not one.
    // One element per thread, so latency-bound: 0.56 ms at b8 L2048 80 x 64 x 128 with one load
    // in flight (H100, 2026-11-27)
    constexpr int kGroup = 4;
    const i64 step = p.nheads * pn;
    i64 idx = (b * p.nchunks * p.nheads + h) * pn + e;
    for (i64 c0 = 0; c0 < p.nchunks; c0 += kGroup, idx += kGroup * step) {
        float S[kGroup], d[kGroup];
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
            const bool in = c0 + k < p.nchunks;
            S[k] = in ? p.states[idx + k * step] : 0.f;
            d[k] = in ? decay[c0 + k] : 0.f;
        }
#pragma unroll
        for (int k = 0; k < kGroup; ++k) {
            if (c0 + k >= p.nchunks) break;
            p.states[idx + k * step] = H;
            H = d[k] * H + S[k];
        }
    }
    if (p.has_final) p.final_states[b * p.final_s[0] + h * p.final_s[1] + pp * p.final_s[2] + nn * p.final_s[3]] = H;
}

// ---- 3. chunk outputs --------------------------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd_chunk_scan(const SsdParams p) {
    __shared__ float s_dt[kQ], s_cum[kQ];
    __shared__ int s_seg[kQ];
    constexpr int kMBlocks = kQ / kTile;
    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const i64 c = blockIdx.x / kMBlocks;
    const int m0 = (blockIdx.x % kMBlocks) * kTile, p0 = blockIdx.y * kTile;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (m0 >= len) return;  // uniform per block: a tail chunk's empty row blocks
    chunk_prologue(p, b, h, c0, len, s_dt, s_cum, s_seg);
    float acc[8][4];
    chunk_output(p, b, h, c, m0, p0, len, s_dt, s_cum, s_seg, acc);

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
