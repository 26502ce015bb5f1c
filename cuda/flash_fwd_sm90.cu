// flash_fwd_sm90.cu: FlashAttention forward for Hopper (sm_90a) on warpgroup MMA (wgmma).
//
// One CTA computes one 128 x head_dim tile of the output for one (batch, head) with two
// warpgroups (256 threads); warpgroup g owns query rows [64 g, 64 g + 64) of the tile:
//
//   Q tile (cp.async, swizzled) -> for each visible KV tile (last to first):
//       S = Q K^T        wgmma m64n128k16, A = Q and B = K both from shared memory (K-major)
//       mask             (only tiles that cross seqlen_k or a window edge)
//       online softmax   (registers, exp2 with the scale folded into one FFMA)
//       O += P V         wgmma m64nDk16, A = P from registers, B = V from shared memory (MN-major)
//   -> O / rowsum, LSE -> staged through the Q tile's shared memory -> 16-byte coalesced stores.
//
// K/V tiles (128 keys) are double-buffered: all 256 threads issue cp.async for tile n-1 into the
// other buffer before computing tile n; one barrier per tile publishes a landed tile (after each
// thread's fence.proxy.async, since the tensor cores read shared memory through the async proxy)
// and frees the buffer the previous tile used (its wgmmas were waited for before the barrier).
//
// Shared memory: every tile (Q, K, V; 128 rows) is stored as head_dim / 64 column blocks of 128
// rows x 128 bytes in the 128-byte swizzle of common/wgmma.cuh, blocks 1024-byte aligned:
//   [Q | K0 | V0 | K1 | V1], 5 * 128 * head_dim * 2 bytes (+ 1 KB for aligning the base).
//
// Covered: fp16 / bf16, head_dim 64 or 128 exactly, causal / sliding windows (FS_HAS_MASK),
// seqlen_q != seqlen_k (bottom-right aligned), GQA/MQA, LSE. Not covered here (the launcher uses
// flash_fwd.cu): fp32, softcap, other head dims. Same parameter struct and launcher checks as
// flash_fwd.cu (16-byte aligned rows, head-dim stride 1).
//
// The prelude defines FS_HEAD_DIM (64 or 128), FS_DTYPE (0 fp16, 1 bf16), FS_HAS_MASK, FS_ARCH (90).

#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/flash_params.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/wgmma.cuh"

#if !defined(FS_HEAD_DIM) || !defined(FS_DTYPE) || !defined(FS_HAS_MASK) || !defined(FS_ARCH)
#error "the prelude must define FS_HEAD_DIM, FS_DTYPE, FS_HAS_MASK and FS_ARCH"
#endif
#ifndef FS_SM90_PIPE
#define FS_SM90_PIPE 0  // 1: the experimental intra-warpgroup pipeline (see the main loop)
#endif


namespace f90 {

using namespace fs;

static constexpr int kHeadDim = FS_HEAD_DIM;
static constexpr int kBlockM = 128;                      // query rows per CTA
static constexpr int kBlockN = 128;                      // keys per KV tile
static constexpr int kThreads = 256;                     // two warpgroups
static constexpr int kTileBytes = 128 * kHeadDim * 2;    // one swizzled 128-row tile
static constexpr int kSColBlockBytes = 128 * 128;        // one 64-column block of a 128-row tile
static constexpr int kChunksPerRow = kHeadDim / 8;       // 16-byte chunks per row
static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
static constexpr int kSRegs = kBlockN / 2;               // S accumulator floats per thread
static constexpr int kORegs = kHeadDim / 2;              // O accumulator floats per thread

static_assert(kHeadDim == 64 || kHeadDim == 128, "head_dim tile is 64 or 128");
static_assert(FS_DTYPE == 0 || FS_DTYPE == 1, "16-bit inputs only");
static_assert(FS_ARCH == 90, "wgmma needs sm_90a");

// cp.async a 128-row tile starting at global row row0 (row stride in elements) into the swizzled
// layout; rows at or beyond rows_valid are zero-filled and never read from global memory.
__device__ __forceinline__ void load_tile(u32 dst, const char* src, long long row_stride, int row0, int rows_valid) {
    const int tid = threadIdx.x;
    const int c = tid % kChunksPerRow;
    const int r0 = tid / kChunksPerRow;
#pragma unroll
    for (int i = 0; i < 128 / kRowsPerPass; ++i) {
        const int row = r0 + i * kRowsPerPass;
        const bool valid = row < rows_valid;
        const char* s = src + (long long)(row0 + row) * row_stride * 2 + c * 16;
        cp_async16(dst + swz_offset(128, row, c * 8), valid ? s : src, valid);
    }
}

}  // namespace f90

// grid = (ceil(seqlen_q / 128), nheads, batch), block = 256, dynamic smem = 5 tiles + 1 KB.
extern "C" __global__ void __launch_bounds__(f90::kThreads, 1) flash_fwd_sm90_kernel(const FlashFwdParams p) {
    using namespace f90;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw_base = smem_u32(smem_raw);
    const u32 s_base = (raw_base + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
    unsigned char* smem = smem_raw + (s_base - raw_base);
    const u32 sQ = s_base;

    const int tid = threadIdx.x;
    const int wg = tid >> 7;            // warpgroup: query rows [64 wg, 64 wg + 64)
    const int warp_in_wg = (tid >> 5) & 3;
    const int lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

    const int m_block = FS_HAS_MASK ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int m0 = m_block * kBlockM;
    const int rows_q = min(kBlockM, p.seqlen_q - m0);
    const int seqlen_k = p.seqlen_k;
    const long long diag = (long long)seqlen_k - p.seqlen_q;  // bottom-right alignment offset
    const int head_k = head / (p.nheads / p.nheads_k);

    const char* q_ptr = static_cast<const char*>(p.q) +
                        ((long long)batch * p.q_batch_stride + (long long)head * p.q_head_stride) * 2;
    const char* k_ptr = static_cast<const char*>(p.k) +
                        ((long long)batch * p.k_batch_stride + (long long)head_k * p.k_head_stride) * 2;
    const char* v_ptr = static_cast<const char*>(p.v) +
                        ((long long)batch * p.v_batch_stride + (long long)head_k * p.v_head_stride) * 2;
    char* o_ptr = static_cast<char*>(p.o) +
                  ((long long)batch * p.o_batch_stride + (long long)head * p.o_head_stride +
                   (long long)m0 * p.o_row_stride) * 2;
    float* lse_ptr = p.lse ? p.lse + ((long long)batch * p.nheads + head) * p.seqlen_q + m0 : nullptr;

    // ---- KV tiles that hold at least one visible key for some row of this block ----
    const int n_tiles = (seqlen_k + kBlockN - 1) / kBlockN;
    int n_begin = 0, n_end = n_tiles;
#if FS_HAS_MASK
    if (p.window_left >= 0) {
        const long long lo = (long long)m0 + diag - p.window_left;
        if (lo > 0) n_begin = (int)min(lo / kBlockN, (long long)n_tiles);
    }
    if (p.window_right >= 0) {
        const long long hi = (long long)m0 + rows_q - 1 + diag + p.window_right;
        n_end = hi < 0 ? 0 : (int)min(hi / kBlockN + 1, (long long)n_tiles);
    }
#endif
    const int c_store = tid % kChunksPerRow;
    if (n_begin >= n_end) {
        // No key visible to any row of the block: output 0, LSE -inf (flash-attn behaviour).
        for (int r = tid / kChunksPerRow; r < rows_q; r += kRowsPerPass)
            *reinterpret_cast<uint4*>(o_ptr + r * p.o_row_stride * 2 + c_store * 16) = make_uint4(0u, 0u, 0u, 0u);
        if (lse_ptr)
            for (int r = tid; r < rows_q; r += kThreads) lse_ptr[r] = neg_inf();
        return;
    }

    const float scale_log2 = p.softmax_scale * kLog2e;

    // ---- prologue: Q and the last visible K/V tile into stage 0 ----
    int n = n_end - 1;
    load_tile(sQ, q_ptr, p.q_row_stride, m0, rows_q);
    load_tile(sQ + kTileBytes, k_ptr, p.k_row_stride, n * kBlockN, seqlen_k - n * kBlockN);
#if !FS_SM90_PIPE
    load_tile(sQ + 2 * kTileBytes, v_ptr, p.v_row_stride, n * kBlockN, seqlen_k - n * kBlockN);
#endif
    cp_async_commit();

    float acc_o[kORegs];
#pragma unroll
    for (int i = 0; i < kORegs; ++i) acc_o[i] = 0.0f;
    float row_max[2] = {neg_inf(), neg_inf()};
    float row_sum[2] = {0.0f, 0.0f};

    // This thread's first query row within the tile and its i + diag (for masks).
    const int row_in_tile = wg * 64 + warp_in_wg * 16 + g;
    const u32 sQ_wg = sQ + wg * 64 * 128;  // this warpgroup's 64 rows inside each column block

#if FS_SM90_PIPE
    // ---- EXPERIMENTAL (opt-in, not yet verified on a GPU): software pipeline inside each
    // warpgroup, in FlashAttention-3's order. Iteration i (tile n = n_end - 1 - i) issues
    // S(i) = Q K(i)^T, rescales O by alpha(i-1), issues O += P(i-1) V(i-1), waits for S(i) only
    // and masks + softmaxes it while the tensor cores run P V; then waits for P V and only then
    // packs P(i) into the registers P(i-1) occupied (the in-flight wgmma reads them). Loads: the
    // top of iteration i (after the barrier, all of iteration i-1 done everywhere) issues
    // K(i+1) into K's other buffer (S(i-1) done) and V(i) into V's buffer of tile i-2 (PV(i-2)
    // done), so each lands over one whole iteration with two buffers.
    auto sK_of = [&](int buf) -> u32 { return s_base + kTileBytes * (1 + 2 * buf); };
    auto sV_of = [&](int buf) -> u32 { return s_base + kTileBytes * (2 + 2 * buf); };
    auto rescale_o = [&](const float (&a)[2]) {
#pragma unroll
        for (int d = 0; d < kHeadDim / 8; ++d)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_o[4 * d + e] *= a[e >> 1];
    };
    u32 pa[kBlockN / 16][4];
    float alpha[2] = {1.0f, 1.0f};
    int buf = 0;
    for (int i = 0; n >= n_begin; --n, ++i, buf ^= 1) {
        const int n0 = n * kBlockN;
        cp_async_wait<0>();   // K(i) and V(i-1) landed for this thread
        fence_proxy_async();  // ...and are visible to the tensor cores
        __syncthreads();      // ...for every thread; iteration i-1 is done everywhere
        if (n > n_begin) load_tile(sK_of(buf ^ 1), k_ptr, p.k_row_stride, n0 - kBlockN, kBlockN);
        load_tile(sV_of(buf), v_ptr, p.v_row_stride, n0, seqlen_k - n0);
        cp_async_commit();

        float acc_s[kSRegs];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const u32 koff = (kk >> 2) * kSColBlockBytes + (kk & 3) * 32;
            wgmma_ss<kBlockN, FS_DTYPE, 0>(acc_s, wgmma_desc(sQ_wg + koff, 16, 1024),
                                           wgmma_desc(sK_of(buf) + koff, 16, 1024), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        if (i > 0) {
            rescale_o(alpha);
            reg_fence(acc_o);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kBlockN / 16; ++kk)
                wgmma_rs<kHeadDim, FS_DTYPE, 1>(acc_o, pa[kk],
                                                wgmma_desc(sV_of(buf ^ 1) + kk * 16 * 128, kSColBlockBytes, 1024), 1);
            wgmma_commit();
            wgmma_wait<1>();  // S(i) done; P(i-1) V(i-1) may still run
        } else {
            wgmma_wait<0>();
        }
        reg_fence(acc_s);

        // mask (only tiles that cross seqlen_k or a window edge), then the online softmax step
        bool need_mask = n0 + kBlockN > seqlen_k;
#if FS_HAS_MASK
        {
            const long long m0_diag = (long long)m0 + diag;
            if (p.window_left >= 0 && n0 < m0_diag + kBlockM - 1 - p.window_left) need_mask = true;
            if (p.window_right >= 0 && n0 + kBlockN - 1 > m0_diag + p.window_right) need_mask = true;
        }
#endif
        if (need_mask) {
            const int rel_lo = (FS_HAS_MASK && p.window_left >= 0) ? -p.window_left : -0x7fffffff;
            const int rel_hi = (FS_HAS_MASK && p.window_right >= 0) ? p.window_right : 0x7fffffff;
            const int row_diag = m0 + row_in_tile + (int)diag;
            const int col0 = n0 + 2 * t;
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = col0 + j * 8 + (e & 1);
                    const int rel = col - (row_diag + 8 * (e >> 1));
                    if (col >= seqlen_k || rel < rel_lo || rel > rel_hi) acc_s[4 * j + e] = neg_inf();
                }
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = row_max[h];
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(acc_s[4 * j + 2 * h], acc_s[4 * j + 2 * h + 1]));
            mx = quad_max(mx);
            const float base = (mx == neg_inf()) ? 0.0f : mx * scale_log2;
            alpha[h] = ex2(row_max[h] * scale_log2 - base);
            row_max[h] = mx;
            float sum = row_sum[h] * alpha[h];
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j) {
                const float p0 = ex2(fmaf(acc_s[4 * j + 2 * h], scale_log2, -base));
                const float p1 = ex2(fmaf(acc_s[4 * j + 2 * h + 1], scale_log2, -base));
                acc_s[4 * j + 2 * h] = p0;
                acc_s[4 * j + 2 * h + 1] = p1;
                sum += p0 + p1;
            }
            row_sum[h] = sum;
        }

        wgmma_wait<0>();  // P(i-1) V(i-1) done: its P registers may be rewritten
        reg_fence(acc_o);
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<FS_DTYPE>(acc_s[8 * kk + 2 * e], acc_s[8 * kk + 2 * e + 1]);
    }
    // the last tile's P V: its V was issued at the top of the last iteration (buffer buf ^ 1)
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();
    rescale_o(alpha);
    reg_fence(acc_o);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
        wgmma_rs<kHeadDim, FS_DTYPE, 1>(acc_o, pa[kk], wgmma_desc(sV_of(buf ^ 1) + kk * 16 * 128, kSColBlockBytes, 1024), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(acc_o);
#else
    int stage = 0;
    for (; n >= n_begin; --n) {
        const u32 sK = s_base + kTileBytes * (1 + 2 * stage);
        const u32 sV = sK + kTileBytes;
        const int n0 = n * kBlockN;

        cp_async_wait<0>();   // K(n), V(n) (and Q) landed for this thread
        fence_proxy_async();  // ...and are visible to the tensor cores
        __syncthreads();      // ...for every thread; all wgmmas on the other stage are done
        if (n > n_begin) {
            const u32 sK_next = s_base + kTileBytes * (1 + 2 * (stage ^ 1));
            load_tile(sK_next, k_ptr, p.k_row_stride, n0 - kBlockN, kBlockN);
            load_tile(sK_next + kTileBytes, v_ptr, p.v_row_stride, n0 - kBlockN, kBlockN);
        }
        cp_async_commit();

        // ---- S = Q K^T: head_dim / 16 k-steps of m64n128k16, both operands K-major ----
        float acc_s[kSRegs];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const u32 koff = (kk >> 2) * kSColBlockBytes + (kk & 3) * 32;
            const u64 da = wgmma_desc(sQ_wg + koff, 16, 1024);
            const u64 db = wgmma_desc(sK + koff, 16, 1024);
            wgmma_ss<kBlockN, FS_DTYPE, 0>(acc_s, da, db, kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc_s);

        // ---- mask: only tiles that cross seqlen_k or a window edge for some row of the block ----
        bool need_mask = n0 + kBlockN > seqlen_k;
#if FS_HAS_MASK
        {
            const long long m0_diag = (long long)m0 + diag;
            if (p.window_left >= 0 && n0 < m0_diag + kBlockM - 1 - p.window_left) need_mask = true;
            if (p.window_right >= 0 && n0 + kBlockN - 1 > m0_diag + p.window_right) need_mask = true;
        }
#endif
        if (need_mask) {
            const int rel_lo = (FS_HAS_MASK && p.window_left >= 0) ? -p.window_left : -0x7fffffff;
            const int rel_hi = (FS_HAS_MASK && p.window_right >= 0) ? p.window_right : 0x7fffffff;
            const int row_diag = m0 + row_in_tile + (int)diag;
            const int col0 = n0 + 2 * t;
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int col = col0 + j * 8 + (e & 1);
                    const int rel = col - (row_diag + 8 * (e >> 1));
                    if (col >= seqlen_k || rel < rel_lo || rel > rel_hi) acc_s[4 * j + e] = neg_inf();
                }
        }

        // ---- online softmax (base 2; rows g and g + 8 of this warp's 16) ----
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = row_max[h];
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(acc_s[4 * j + 2 * h], acc_s[4 * j + 2 * h + 1]));
            mx = quad_max(mx);
            // A row with nothing visible yet keeps max -inf: base 0 so exp2 gives 0, not NaN.
            const float base = (mx == neg_inf()) ? 0.0f : mx * scale_log2;
            const float alpha = ex2(row_max[h] * scale_log2 - base);
            row_max[h] = mx;
            float sum = row_sum[h] * alpha;
#pragma unroll
            for (int d = 0; d < kHeadDim / 8; ++d) {
                acc_o[4 * d + 2 * h] *= alpha;
                acc_o[4 * d + 2 * h + 1] *= alpha;
            }
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j) {
                const float p0 = ex2(fmaf(acc_s[4 * j + 2 * h], scale_log2, -base));
                const float p1 = ex2(fmaf(acc_s[4 * j + 2 * h + 1], scale_log2, -base));
                acc_s[4 * j + 2 * h] = p0;
                acc_s[4 * j + 2 * h + 1] = p1;
                sum += p0 + p1;
            }
            row_sum[h] = sum;  // this thread's columns; quad-reduced at the end
        }

        // ---- O += P V: P (rounded to the input type) as the register A operand ----
        u32 pa[kBlockN / 16][4];
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            pa[kk][0] = pack2<FS_DTYPE>(acc_s[8 * kk + 0], acc_s[8 * kk + 1]);
            pa[kk][1] = pack2<FS_DTYPE>(acc_s[8 * kk + 2], acc_s[8 * kk + 3]);
            pa[kk][2] = pack2<FS_DTYPE>(acc_s[8 * kk + 4], acc_s[8 * kk + 5]);
            pa[kk][3] = pack2<FS_DTYPE>(acc_s[8 * kk + 6], acc_s[8 * kk + 7]);
        }
        reg_fence(acc_o);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            // 16 keys = 16 rows of 128 bytes; LBO steps to the next 64-column block of head_dim.
            const u64 db = wgmma_desc(sV + kk * 16 * 128, kSColBlockBytes, 1024);
            wgmma_rs<kHeadDim, FS_DTYPE, 1>(acc_o, pa[kk], db, 1);
        }
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(acc_o);
        stage ^= 1;
    }
#endif

    // ---- epilogue: normalise, LSE, stage O in this warpgroup's rows of the Q tile, store ----
    // Each warpgroup read only its own Q rows, and its last wgmma on them completed above.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const float sum = quad_sum(row_sum[h]);
        const float inv = sum > 0.0f ? rcp(sum) : 0.0f;
        const int row = row_in_tile + 8 * h;
        if (lse_ptr && t == 0 && row < rows_q)
            lse_ptr[row] = sum > 0.0f ? (row_max[h] * scale_log2 + lg2(sum)) * kLn2 : neg_inf();
#pragma unroll
        for (int d = 0; d < kHeadDim / 8; ++d) {
            const u32 v = pack2<FS_DTYPE>(acc_o[4 * d + 2 * h] * inv, acc_o[4 * d + 2 * h + 1] * inv);
            *reinterpret_cast<u32*>(smem + swz_offset(128, row, d * 8 + 2 * t)) = v;
        }
    }
    __syncthreads();
    for (int r = tid / kChunksPerRow; r < rows_q; r += kRowsPerPass) {
        const uint4 val = *reinterpret_cast<const uint4*>(smem + swz_offset(128, r, c_store * 8));
        *reinterpret_cast<uint4*>(o_ptr + r * p.o_row_stride * 2 + c_store * 16) = val;
    }
}
