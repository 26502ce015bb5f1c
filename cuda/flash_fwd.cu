// flash_fwd.cu: FlashAttention-2-class forward kernel (tensor cores through mma.sync).
//
// One CTA computes one BLOCK_M x head_dim tile of the output for one (batch, head):
//
//   load Q tile -> for each visible KV tile (last to first):
//       S = Q K^T            (mma.sync, f32 accumulate, scores stay in registers)
//       mask, softcap        (only tiles that cross a mask or seqlen_k boundary pay for masking)
//       online softmax       (exp2 with the softmax scale folded into one FFMA)
//       O += P V             (P re-packed in registers as the A operand; V read by ldmatrix.trans)
//   -> O / rowsum, LSE -> staged through shared memory -> 16-byte coalesced stores.
//
// K/V tiles are brought in with cp.async; with FS_KV_STAGES == 2 the next tile's K and V land in
// the other buffer while this tile is computed (two barriers per tile); with FS_KV_STAGES == 1 the
// schedule is the single-buffer interleave (V(j) lands during S(j), K(j+1) during P(j)V(j)).
//
// Warp ownership: warp w owns query rows [w * WARP_M, (w + 1) * WARP_M) of the tile, WARP_M =
// BLOCK_M / NWARPS = 16 * M_TILES; every warp reads the whole K and V tile. Inside a warp the usual
// mma fragment layout applies: lane = 4 * g + t owns rows g and g + 8 of each 16-row slab and
// columns 2t, 2t + 1 of each 8-column slab.
//
// Shared memory (dynamic, bytes = (BLOCK_M + 2 * FS_KV_STAGES * BLOCK_N) * ROW_BYTES,
// ROW_BYTES = FS_HEAD_DIM * elem_bytes + 16): rows are padded by 16 bytes so that the eight
// 16-byte row segments of an ldmatrix phase fall in distinct banks. Layout: Q tile (reused for the
// output tile at the end), then per stage: K tile, V tile.
//
// Precision: fp16 / bf16 inputs use m16n8k16 with f32 accumulate; P is rounded to the input type
// for P.V (as FlashAttention does). fp32 inputs use 3xTF32 (m16n8k8: a_hi*b_hi + a_hi*b_lo +
// a_lo*b_hi, every split rounded with cvt.rna.tf32), which keeps about 21 bits of every product:
// results stay within ~1e-6 relative of float64. Softcap tanh: tanh.approx for 16-bit inputs, an
// exp2-based tanh (~1e-7) for fp32.
//
// Requirements the launcher checks: q/k/v/o base pointers 16-byte aligned, every batch/row/head
// stride a multiple of 16 bytes / element size, head dim stride 1, params.head_dim a multiple of 8
// and <= FS_HEAD_DIM, nheads % nheads_k == 0, softmax_scale > 0, softcap >= 0,
// seqlen_q + seqlen_k < 2^31 (mask arithmetic is 32-bit; memory offsets are 64-bit).
//
// Varlen (FS_VARLEN=1, flash_attn_varlen_func): q / o are (total_q, nheads, hd) and k / v
// (total_k, nheads_k, hd), packed sequences whose row ranges are [cu_seqlens[b], cu_seqlens[b+1]).
// The grid is (ceil(max_seqlen_q / BLOCK_M), nheads, batch); each CTA runs the dense algorithm on
// its sequence's rows, whose bounds it reads once from cu_seqlens_q / cu_seqlens_k (clamped into
// [0, total], so bad values never index out of bounds) into spare shared memory (the padding of
// the Q tile's first row: they cost the 255-register tiles no register), with the sequence's own
// lengths (masks aligned
// bottom-right per sequence); CTAs past the sequence's end exit. The launcher passes batch
// strides 0 and the seqlen fields as the maxima. The LSE is (nheads, total_q). The dense build's
// struct and code are untouched (the FF_SEQLEN_* macros expand to the params' fields there).
//
// The prelude defines FS_HEAD_DIM, FS_DTYPE, FS_BLOCK_M, FS_BLOCK_N, FS_NWARPS, FS_HAS_MASK,
// FS_HAS_SOFTCAP, FS_PAD_HEADDIM, FS_ARCH and optionally FS_KV_STAGES (default 2),
// FS_MIN_BLOCKS (default 1; __launch_bounds__ min blocks per SM) and FS_QK_UNROLL (default 16;
// unroll of the QK^T k loop, 1 keeps the 255-register 128-row tiles spill-free).

#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/flash_params.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/softcap.cuh"
#include "common/opaque.cuh"

#if !defined(FS_HEAD_DIM) || !defined(FS_DTYPE) || !defined(FS_BLOCK_M) || !defined(FS_BLOCK_N) || \
    !defined(FS_NWARPS) || !defined(FS_HAS_MASK) || !defined(FS_HAS_SOFTCAP) || !defined(FS_PAD_HEADDIM) || \
    !defined(FS_ARCH)
#error "the prelude must define FS_HEAD_DIM, FS_DTYPE, FS_BLOCK_M, FS_BLOCK_N, FS_NWARPS, FS_HAS_MASK, FS_HAS_SOFTCAP, FS_PAD_HEADDIM and FS_ARCH"
#endif
#ifndef FS_KV_STAGES
#define FS_KV_STAGES 2
#endif
#ifndef FS_QK_UNROLL
#define FS_QK_UNROLL 16  // unroll factor of the QK^T k loop (lower it to cap register pressure)
#endif
#ifndef FS_MIN_BLOCKS
#define FS_MIN_BLOCKS 1
#endif
#ifndef FS_VARLEN
#define FS_VARLEN 0
#endif


namespace ff {

using namespace fs;

// ---- compile-time tile shape -------------------------------------------------------------------
static constexpr int kHeadDim = FS_HEAD_DIM;
static constexpr int kBlockM = FS_BLOCK_M;
static constexpr int kBlockN = FS_BLOCK_N;
static constexpr int kNWarps = FS_NWARPS;
static constexpr int kNThreads = kNWarps * 32;
static constexpr int kStages = FS_KV_STAGES;
static constexpr int kWarpM = kBlockM / kNWarps;       // query rows owned by one warp
static constexpr int kMTiles = kWarpM / 16;            // 16-row mma slabs per warp
static constexpr int kNTiles = kBlockN / 8;            // 8-column slabs of S per warp
static constexpr int kDTiles = kHeadDim / 8;           // 8-column slabs of O per warp
static constexpr bool kF32 = (FS_DTYPE == 2);
static constexpr int kElemBytes = kF32 ? 4 : 2;
static constexpr int kElemsPerChunk = 16 / kElemBytes;  // elements per 16-byte cp.async chunk
static constexpr int kChunksPerRow = kHeadDim * kElemBytes / 16;
static constexpr int kKSteps = kChunksPerRow / 2;      // QK^T k-steps: 2 chunks = k16 (16-bit) or k8 (fp32)
static constexpr int kRowBytes = kHeadDim * kElemBytes + 16;  // padded shared-memory row
static constexpr int kQBytes = kBlockM * kRowBytes;
static constexpr int kKVBytes = kBlockN * kRowBytes;
static constexpr int kSmemBytes = kQBytes + 2 * kStages * kKVBytes;
#ifdef FS_Q_IN_REGS
static constexpr bool kQInRegs = FS_Q_IN_REGS;
#else
// Q fragments stay in registers when they fit beside the S and O accumulators.
static constexpr bool kQInRegs = !kF32 && kMTiles * kHeadDim <= 128 &&
                          kMTiles * (kNTiles + kDTiles) * 4 + kMTiles * kHeadDim / 4 <= 176;
#endif

static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim tile must be 32..256, step 32");
static_assert(kBlockM % (16 * kNWarps) == 0, "each warp owns whole 16-row slabs");
static_assert(kBlockN % 16 == 0, "BLOCK_N must be a multiple of 16");
static_assert(kStages == 1 || kStages == 2, "FS_KV_STAGES is 1 or 2");
static_assert(FS_DTYPE >= 0 && FS_DTYPE <= 2, "FS_DTYPE is 0 (fp16), 1 (bf16) or 2 (fp32)");

// ---- tile movement -----------------------------------------------------------------------------
// A tile row is kChunksPerRow 16-byte chunks. Thread tid always moves chunk column
// tid % kChunksPerRow of rows tid / kChunksPerRow + i * kRowsPerPass (threads >= kActiveThreads idle
// when the row does not divide the CTA evenly), so each thread keeps one pointer per tile.
static constexpr int kRowsPerPass = kNThreads / kChunksPerRow;
static constexpr int kActiveThreads = kRowsPerPass * kChunksPerRow;
static_assert(kRowsPerPass >= 1, "a tile row must not need more chunks than the CTA has threads");

struct ThreadChunk {
    int row;     // first row this thread moves
    int col;     // byte offset of its chunk inside a row
    bool active; // tid < kActiveThreads
    bool col_ok; // chunk lies inside params.head_dim
};

__device__ __forceinline__ ThreadChunk thread_chunk(int head_dim, int salt) {
    const int tid = opaque((int)threadIdx.x, salt);
    ThreadChunk tc;
    tc.row = tid / kChunksPerRow;
    tc.col = (tid % kChunksPerRow) * 16;
    tc.active = tid < kActiveThreads;
    tc.col_ok = !FS_PAD_HEADDIM || (tid % kChunksPerRow) * kElemsPerChunk < head_dim;
    return tc;
}

// cp.async a ROWS x FS_HEAD_DIM tile (row stride in bytes) into padded shared memory. Rows at or
// beyond rows_valid (CHECK_ROWS) and chunks beyond head_dim are zero-filled, never read.
// src points at row 0 of the (batch, head); the tile starts at row row0; the row stride is in
// elements and read straight from the kernel parameters so that it needs no register.
template <int ROWS, bool CHECK_ROWS>
__device__ __forceinline__ void load_tile(u32 dst, const char* src, long long row_stride, int row0,
                                          int rows_valid, const ThreadChunk& tc) {
    constexpr int kPasses = (ROWS + kRowsPerPass - 1) / kRowsPerPass;
    if (kActiveThreads < kNThreads && !tc.active) return;
    const char* s = src + (long long)(row0 + tc.row) * row_stride * kElemBytes + tc.col;
    const long long step = (long long)(kRowsPerPass * kElemBytes) * row_stride;
    const u32 d = dst + tc.row * kRowBytes + tc.col;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
        const int row = tc.row + i * kRowsPerPass;
        if (ROWS % kRowsPerPass == 0 || row < ROWS) {
            bool valid = tc.col_ok;
            if (CHECK_ROWS) valid = valid && row < rows_valid;
            cp_async16(d + i * kRowsPerPass * kRowBytes, valid ? s : src, valid);
        }
        if (i + 1 < kPasses) s = ptr_add(s, step);
    }
}

// Shared (padded, BLOCK_M rows) -> global, 16 bytes per thread per step; only rows < rows_valid
// and chunks inside head_dim are written.
__device__ __forceinline__ void store_tile(char* dst, long long row_stride_bytes,
                                           const unsigned char* src, int rows_valid,
                                           const ThreadChunk& tc) {
    constexpr int kPasses = (kBlockM + kRowsPerPass - 1) / kRowsPerPass;
    if (kActiveThreads < kNThreads && !tc.active) return;
    if (!tc.col_ok) return;
    char* g = dst + tc.row * row_stride_bytes + tc.col;
    const long long step = kRowsPerPass * row_stride_bytes;
#pragma unroll
    for (int i = 0; i < kPasses; ++i) {
        const int row = tc.row + i * kRowsPerPass;
        if (row < rows_valid && (kBlockM % kRowsPerPass == 0 || row < kBlockM)) {
            const uint4 val = *reinterpret_cast<const uint4*>(src + row * kRowBytes + tc.col);
            *reinterpret_cast<uint4*>(g) = val;
        }
        g += step;
    }
}

}  // namespace ff

// ---- the kernel --------------------------------------------------------------------------------
// grid = (ceil(seqlen_q / BLOCK_M), nheads, batch), block = NWARPS * 32, dynamic smem = kSmemBytes
// (varlen: seqlen_q = max_seqlen_q).
extern "C" __global__ void __launch_bounds__(ff::kNThreads, FS_MIN_BLOCKS)
flash_fwd_kernel(const FlashFwdParams p) {
    using namespace ff;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 s_base = smem_u32(smem_raw);
    const u32 sQ = s_base;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;  // row inside an 8-row group
    const int t = lane & 3;   // column pair inside an 8-column slab

    // Under a causal/window mask the last query blocks have the most keys: start them first.
    const int m_block = FS_HAS_MASK ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
    const int head = blockIdx.y;
    const int batch = blockIdx.z;
    const int m0 = m_block * kBlockM;
#if FS_VARLEN
    // This CTA's sequence: row bounds from cu_seqlens, clamped into [0, total] so that bad values
    // never reach outside q, k, v, o or lse, at most max_seqlen_q (= p.seqlen_q) queries (the
    // grid covers no more): common/flash_params.cuh's sequence_rows, inline here so that a CTA
    // past its sequence's end returns before reading the key bounds. They are kept in the 16
    // padding bytes of the Q tile's first shared-memory row (which nothing else reads or writes)
    // and read there where used: the 255-register tiles have no register to hold them across the
    // main loop.
    int* const s_seq = reinterpret_cast<int*>(smem_raw + kHeadDim * kElemBytes);
    {
        const int b = blockIdx.z;
        const int q0 = clamp_row(p.cu_seqlens_q[b], p.total_q);
        const int len_q = min(max(clamp_row(p.cu_seqlens_q[b + 1], p.total_q) - q0, 0), p.seqlen_q);
        if (m0 >= len_q) return;  // past this sequence's end (uniform over the CTA)
        const int k0 = clamp_row(p.cu_seqlens_k[b], p.total_k);
        const int len_k = max(clamp_row(p.cu_seqlens_k[b + 1], p.total_k) - k0, 0);
        if (tid == 0) {  // (written before the barrier below, read only after it)
            s_seq[0] = q0;
            s_seq[1] = len_q;
            s_seq[2] = k0;
            s_seq[3] = len_k;
        }
        __syncthreads();
    }
    auto q_row0 = [&](int) { return s_seq[0]; };
    auto k_row0 = [&](int) { return s_seq[2]; };
#define FF_SEQLEN_Q(salt) (s_seq[1])
#define FF_SEQLEN_K(salt) (s_seq[3])
#else
#define FF_SEQLEN_Q(salt) p.seqlen_q
#define FF_SEQLEN_K(salt) p.seqlen_k
#endif
    const int rows_q = min(kBlockM, FF_SEQLEN_Q(0) - m0);
    const int seqlen_k = FF_SEQLEN_K(0);
    const int head_dim = p.head_dim;
    const long long diag = (long long)seqlen_k - FF_SEQLEN_Q(0);  // bottom-right alignment offset
    const ThreadChunk tc = thread_chunk(head_dim, 0);

    const char* q_ptr = static_cast<const char*>(p.q) +
                        ((long long)batch * p.q_batch_stride + (long long)head * p.q_head_stride) *
                            kElemBytes +
                        (long long)m0 * p.q_row_stride * kElemBytes;
#if FS_VARLEN
    q_ptr += (long long)q_row0(0) * p.q_row_stride * kElemBytes;
#endif
    // K / V head base addresses, recomputed at every tile load (see opaque).
#if FS_VARLEN
    // varlen: the sequence's first key row in place of the batch offset
    auto kv_head_base = [&](const void* base, long long row_stride, long long head_stride, int salt) {
        const long long r = k_row0(salt);
        const int hk = opaque((int)blockIdx.y, salt) / (p.nheads / p.nheads_k);
        return static_cast<const char*>(base) + (r * row_stride + (long long)hk * head_stride) * kElemBytes;
    };
    auto k_base = [&](int salt) { return kv_head_base(p.k, p.k_row_stride, p.k_head_stride, salt); };
    auto v_base = [&](int salt) { return kv_head_base(p.v, p.v_row_stride, p.v_head_stride, salt); };
#else
    auto kv_head_base = [&](const void* base, long long batch_stride, long long head_stride, int salt) {
        const int b = opaque((int)blockIdx.z, salt);
        const int hk = opaque((int)blockIdx.y, salt) / (p.nheads / p.nheads_k);
        return static_cast<const char*>(base) + ((long long)b * batch_stride + (long long)hk * head_stride) * kElemBytes;
    };
    auto k_base = [&](int salt) { return kv_head_base(p.k, p.k_batch_stride, p.k_head_stride, salt); };
    auto v_base = [&](int salt) { return kv_head_base(p.v, p.v_batch_stride, p.v_head_stride, salt); };
#endif
    // Output and LSE addresses are recomputed from the parameters where they are used (the
    // parameters live in constant memory), so they hold no registers across the main loop.
#if FS_VARLEN
    // (salt -1: read again where used, after the main loop)
    auto out_tile = [&]() -> char* {
        return static_cast<char*>(p.o) + ((long long)head * p.o_head_stride +
                                          ((long long)q_row0(-1) + m0) * p.o_row_stride) * kElemBytes;
    };
    auto lse_tile = [&]() -> float* {  // (nheads, total_q)
        return p.lse + (long long)head * p.total_q + q_row0(-1) + m0;
    };
#else
    auto out_tile = [&]() -> char* {
        return static_cast<char*>(p.o) +
               ((long long)batch * p.o_batch_stride + (long long)head * p.o_head_stride +
                (long long)m0 * p.o_row_stride) * kElemBytes;
    };
    auto lse_tile = [&]() -> float* {
        return p.lse + ((long long)batch * p.nheads + head) * p.seqlen_q + m0;
    };
#endif

    // ---- KV tiles that hold at least one visible key for some row of this block ----
    const int n_tiles = (seqlen_k + kBlockN - 1) / kBlockN;
    int n_begin = 0, n_end = n_tiles;
#if FS_HAS_MASK
    if (p.window_left >= 0) {
        const long long lo = (long long)m0 + diag - p.window_left;  // first key of the first row
        if (lo > 0) n_begin = (int)min(lo / kBlockN, (long long)n_tiles);
    }
    if (p.window_right >= 0) {
        const long long hi = (long long)m0 + rows_q - 1 + diag + p.window_right;  // last key, last row
        n_end = hi < 0 ? 0 : (int)min(hi / kBlockN + 1, (long long)n_tiles);
    }
#endif
    if (n_begin >= n_end) {
        // No key visible to any row of the block: output 0, LSE -inf (flash-attn behaviour).
        if (tc.active && tc.col_ok)
            for (int r = tc.row; r < rows_q; r += kRowsPerPass)
                *reinterpret_cast<uint4*>(out_tile() + r * p.o_row_stride * kElemBytes + tc.col) =
                    make_uint4(0u, 0u, 0u, 0u);
        if (p.lse)
            for (int r = tid; r < rows_q; r += kNThreads) lse_tile()[r] = neg_inf();
        return;
    }

    // Masking geometry is recomputed per tile from blockIdx / threadIdx / params (see opaque):
    // it is needed only on the few tiles that cross a boundary and would otherwise hold registers.
    auto block_m0 = [&](int salt) -> int {
        const int bx = opaque((int)blockIdx.x, salt);
        return (FS_HAS_MASK ? (int)gridDim.x - 1 - bx : bx) * kBlockM;
    };

    const ScoreScale scale = score_scale<FS_HAS_SOFTCAP>(p.softmax_scale, p.softcap);
    const float scale_log2 = scale.log2;

    // Per-lane ldmatrix offsets (bytes). A operand (Q rows): matrices {rows 0-7, 8-15} x {chunk 0, 1}.
    // B operand from K (non-transposed): {keys 0-7 | chunk 0, keys 0-7 | chunk 1, keys 8-15 | ...}.
    // B operand from V (transposed): {keys 0-7 | dims 0-7, keys 8-15 | dims 0-7, keys 0-7 | dims 8-15, ...}.
    // They are recomputed from threadIdx in each phase (see opaque) so that each is live only there.
    auto q_lane_of = [&](int salt) -> u32 {
        const int tx = opaque((int)threadIdx.x, salt), ln = tx & 31;
        return (u32)(((tx >> 5) * kWarpM + (ln & 15)) * kRowBytes + (ln >> 4) * 16);
    };
    auto k_lane_of = [&](int salt) -> u32 {
        const int ln = opaque((int)threadIdx.x, salt) & 31;
        return (u32)(((ln & 7) + ((ln >> 4) << 3)) * kRowBytes + ((ln >> 3) & 1) * 16);
    };
    auto v_lane_of = [&](int salt) -> u32 {
        const int ln = opaque((int)threadIdx.x, salt) & 31;
        return (u32)(((ln & 7) + (((ln >> 3) & 1) << 3)) * kRowBytes + (ln >> 4) * 16);
    };

    // ---- prologue: Q and the first (last-in-sequence) K tile, then its V tile ----
    int n = n_end - 1;
    load_tile<kBlockM, true>(sQ, q_ptr, p.q_row_stride, 0, rows_q, tc);
    load_tile<kBlockN, true>(s_base + kQBytes, k_base(n), p.k_row_stride, n * kBlockN, seqlen_k - n * kBlockN,
                             tc);
    cp_async_commit();
    if (kStages == 2) {
        load_tile<kBlockN, true>(s_base + kQBytes + kKVBytes, v_base(n), p.v_row_stride, n * kBlockN,
                                 seqlen_k - n * kBlockN, tc);
        cp_async_commit();
    }

    u32 q_frag[kQInRegs ? kMTiles : 1][kQInRegs ? kKSteps : 1][4];
    if (kQInRegs) {
        if (kStages == 2) cp_async_wait<1>(); else cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int mt = 0; mt < (kQInRegs ? kMTiles : 1); ++mt)
#pragma unroll
            for (int kk = 0; kk < (kQInRegs ? kKSteps : 1); ++kk)
                ldsm_x4(q_frag[mt][kk], sQ + q_lane_of(0) + mt * 16 * kRowBytes + kk * 32);
    }

    float acc_o[kMTiles][kDTiles][4];
    zero(acc_o);
    float row_max[2 * kMTiles], row_sum[2 * kMTiles];
#pragma unroll
    for (int r = 0; r < 2 * kMTiles; ++r) {
        row_max[r] = neg_inf();
        row_sum[r] = 0.0f;
    }

    int stage = 0;
    for (; n >= n_begin; --n) {
        const u32 sK = s_base + kQBytes + stage * 2 * kKVBytes;
        const u32 sV = sK + kKVBytes;
        const int n0 = n * kBlockN;

        if (kStages == 2) {
            cp_async_wait<1>();  // K(n) (and Q) landed; V(n) may be in flight
            __syncthreads();     // ...for every thread; all warps are done with tile n+1's buffers
            if (n > n_begin) {
                const u32 sK_next = s_base + kQBytes + (stage ^ 1) * 2 * kKVBytes;
                load_tile<kBlockN, false>(sK_next, k_base(n), p.k_row_stride, n0 - kBlockN, kBlockN,
                                          thread_chunk(head_dim, n));
                cp_async_commit();
                load_tile<kBlockN, false>(sK_next + kKVBytes, v_base(n), p.v_row_stride, n0 - kBlockN, kBlockN,
                                          thread_chunk(head_dim, n));
                cp_async_commit();
            } else {
                cp_async_commit();  // empty groups keep the wait counts uniform
                cp_async_commit();
            }
        } else {
            cp_async_wait<0>();  // K(n) landed
            __syncthreads();     // all warps are done with V(n+1)
            load_tile<kBlockN, true>(sV, v_base(n), p.v_row_stride, n0, FF_SEQLEN_K(n) - n0, thread_chunk(head_dim, n));
            cp_async_commit();
        }

        // ---- S = Q K^T (raw dot products) ----
        const u32 q_lane = q_lane_of(n), k_lane = k_lane_of(n);
        float acc_s[kMTiles][kNTiles][4];
        zero(acc_s);

#pragma unroll FS_QK_UNROLL
        for (int kk = 0; kk < kKSteps; ++kk) {
            u32 a[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                if (kQInRegs) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) a[mt][e] = q_frag[kQInRegs ? mt : 0][kQInRegs ? kk : 0][e];
                } else {
                    ldsm_x4(a[mt], sQ + q_lane + mt * 16 * kRowBytes + kk * 32);
                }
            }
#if FS_DTYPE == 2
            u32 a_hi[kMTiles][4], a_lo[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int e = 0; e < 4; ++e) split_tf32(__uint_as_float(a[mt][e]), a_hi[mt][e], a_lo[mt][e]);
#endif
#pragma unroll
            for (int np = 0; np < kNTiles / 2; ++np) {
                u32 b[4];
                ldsm_x4(b, sK + k_lane + np * 16 * kRowBytes + kk * 32);
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
#if FS_DTYPE == 2
                    mma_3xtf32_x2(acc_s[mt][2 * np], acc_s[mt][2 * np + 1], a_hi[mt], a_lo[mt], b);
#else
                    mma16_x2<FS_DTYPE>(acc_s[mt][2 * np], acc_s[mt][2 * np + 1], a[mt], b);
#endif
                }
            }
        }

#if FS_HAS_SOFTCAP
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
            for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc_s[mt][j][e] = tanh_softcap<FS_DTYPE>(acc_s[mt][j][e] * scale.pre);
#endif

        // ---- mask: only tiles that cross seqlen_k or a window edge for some row of the block ----
        // Key j is visible to query i iff j < seqlen_k and -window_left <= j - (i + diag) <= window_right.
        bool need_mask = n0 + kBlockN > FF_SEQLEN_K(n);
#if FS_HAS_MASK
        {
            const long long m0_diag = (long long)block_m0(n) + FF_SEQLEN_K(n) - FF_SEQLEN_Q(n);
            if (p.window_left >= 0 && n0 < m0_diag + kBlockM - 1 - p.window_left) need_mask = true;
            if (p.window_right >= 0 && n0 + kBlockN - 1 > m0_diag + p.window_right) need_mask = true;
        }
#endif
        if (need_mask) {
            const int rel_lo = (FS_HAS_MASK && p.window_left >= 0) ? -p.window_left : -0x7fffffff;
            const int rel_hi = (FS_HAS_MASK && p.window_right >= 0) ? p.window_right : 0x7fffffff;
            const int lane_n = opaque((int)threadIdx.x, n) & 31;
            // i + diag for this thread's first row (row slot 2 * mt + h adds 16 * mt + 8 * h)
            const int row_diag = block_m0(n) + (opaque((int)threadIdx.x, n) >> 5) * kWarpM + (lane_n >> 2) +
                                 (FF_SEQLEN_K(n) - FF_SEQLEN_Q(n));
            const int col0 = n0 + 2 * (lane_n & 3);
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt)
#pragma unroll
                for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int col = col0 + j * 8 + (e & 1);
                        const int rel = col - (row_diag + 16 * mt + 8 * (e >> 1));
                        if (col >= FF_SEQLEN_K(n) || rel < rel_lo || rel > rel_hi) acc_s[mt][j][e] = neg_inf();
                    }
        }

        // ---- online softmax (base-2, scale folded into one FFMA per score) ----
#pragma unroll
        for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = 2 * mt + h;
                float mx = row_max[r];
#pragma unroll
                for (int j = 0; j < kNTiles; ++j)
                    mx = fmaxf(mx, fmaxf(acc_s[mt][j][2 * h], acc_s[mt][j][2 * h + 1]));
                mx = quad_max(mx);
                // A row with nothing visible yet keeps max -inf: use base 0 so exp2 gives 0, not NaN.
                const float base = (mx == neg_inf()) ? 0.0f : mx * scale_log2;
                const float alpha = ex2(row_max[r] * scale_log2 - base);
                row_max[r] = mx;
                float sum = row_sum[r] * alpha;
#pragma unroll
                for (int d = 0; d < kDTiles; ++d) {
                    acc_o[mt][d][2 * h] *= alpha;
                    acc_o[mt][d][2 * h + 1] *= alpha;
                }
#pragma unroll
                for (int j = 0; j < kNTiles; ++j) {
                    const float p0 = ex2(fmaf(acc_s[mt][j][2 * h], scale_log2, -base));
                    const float p1 = ex2(fmaf(acc_s[mt][j][2 * h + 1], scale_log2, -base));
                    acc_s[mt][j][2 * h] = p0;
                    acc_s[mt][j][2 * h + 1] = p1;
                    sum += p0 + p1;
                }
                row_sum[r] = sum;  // partial (this thread's columns); quad-reduced at the end
            }
        }

        if (kStages == 2) {
            cp_async_wait<2>();  // V(n) landed (K(n-1), V(n-1) may be in flight)
            __syncthreads();
        } else {
            cp_async_wait<0>();  // V(n) landed
            __syncthreads();     // all warps are done with K(n)
            if (n > n_begin) {
                load_tile<kBlockN, false>(sK, k_base(n), p.k_row_stride, n0 - kBlockN, kBlockN,
                                          thread_chunk(head_dim, n));
                cp_async_commit();
            }
        }

        // ---- O += P V, P taken from the score registers ----
#if FS_DTYPE == 2
        // m16n8k8 TF32: logical k index t <-> key 2t, t + 4 <-> key 2t + 1 of the 8-key slab, so the
        // accumulator layout of S is directly the A layout; V rows are read with the same permutation.
        const float* sVf = reinterpret_cast<const float*>(smem_raw + (sV - s_base));
        constexpr int kRowF = kRowBytes / 4;
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
            u32 a_hi[kMTiles][4], a_lo[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                split_tf32(acc_s[mt][j][0], a_hi[mt][0], a_lo[mt][0]);
                split_tf32(acc_s[mt][j][2], a_hi[mt][1], a_lo[mt][1]);
                split_tf32(acc_s[mt][j][1], a_hi[mt][2], a_lo[mt][2]);
                split_tf32(acc_s[mt][j][3], a_hi[mt][3], a_lo[mt][3]);
            }
            const float* vrow = sVf + (j * 8 + 2 * t) * kRowF + g;
#pragma unroll
            for (int d = 0; d < kDTiles; ++d) {
                const float b0 = vrow[d * 8];
                const float b1 = vrow[kRowF + d * 8];
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) mma_3xtf32(acc_o[mt][d], a_hi[mt], a_lo[mt], b0, b1);
            }
        }
#else
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            u32 a[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                acc_to_a<FS_DTYPE>(a[mt], acc_s[mt][2 * kk], acc_s[mt][2 * kk + 1]);
            }
#pragma unroll
            for (int dp = 0; dp < kDTiles / 2; ++dp) {
                u32 b[4];
                ldsm_x4_trans(b, sV + v_lane_of(n) + kk * 16 * kRowBytes + dp * 32);
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt) {
                    mma16_x2<FS_DTYPE>(acc_o[mt][2 * dp], acc_o[mt][2 * dp + 1], a[mt], b);
                }
            }
        }
#endif
        if (kStages == 2) stage ^= 1;
    }

    // ---- epilogue: normalise, LSE, stage O through the Q tile's shared memory, store ----
    // Every warp passed the last barrier after its final Q read, so the Q tile is free.
#pragma unroll
    for (int mt = 0; mt < kMTiles; ++mt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = 2 * mt + h;
            const float sum = quad_sum(row_sum[r]);
            const float inv = sum > 0.0f ? rcp(sum) : 0.0f;
            const int row = warp * kWarpM + 16 * mt + g + 8 * h;
            if (p.lse && t == 0 && row < rows_q)
                lse_tile()[row] = sum > 0.0f ? (row_max[r] * scale_log2 + lg2(sum)) * kLn2 : neg_inf();
            unsigned char* srow = smem_raw + row * kRowBytes;
#pragma unroll
            for (int d = 0; d < kDTiles; ++d) {
                const float o0 = acc_o[mt][d][2 * h] * inv;
                const float o1 = acc_o[mt][d][2 * h + 1] * inv;
#if FS_DTYPE == 2
                *reinterpret_cast<float2*>(srow + (d * 8 + 2 * t) * 4) = make_float2(o0, o1);
#else
                *reinterpret_cast<u32*>(srow + (d * 8 + 2 * t) * 2) = pack2<FS_DTYPE>(o0, o1);
#endif
            }
        }
    }
    __syncthreads();
    store_tile(out_tile(), p.o_row_stride * kElemBytes, smem_raw, rows_q, thread_chunk(head_dim, n));
}
#undef FF_SEQLEN_Q
#undef FF_SEQLEN_K
