// flash_decode.cu: attention of a few query tokens against a KV cache (FlashDecoding: the keys are
// split across CTAs), the pass that combines the splits, and the cache append (+ rotary) that
// precedes a decode step. Three entries:
//
//   flash_decode_kernel   (main build)         one CTA per (M block, split, kv head, batch):
//       load the Q rows of the kv head's group -> for each K/V tile of its key range (first to last):
//           S = Q K^T            (mma.sync m16n8k16, f32 accumulate, scores in registers)
//           mask, softcap        (only tiles that cross leftpad / seqlens_k / a window edge mask)
//           online softmax       (exp2, the scale folded into one FFMA)
//           O += P V             (P re-packed in registers as the A operand; V by ldmatrix.trans)
//       -> merge the key-warps' partial (max, sum, O) through shared memory
//       -> num_splits == 1: out (input dtype) + lse; else fp32 O / sum and the split's LSE to scratch.
//   flash_decode_combine  (FS_AUX_ONLY=1 build) one warp per (batch, head, query): merges the
//       splits exactly, out = sum_s w_s O_s / sum_s w_s with w_s = exp(lse_s - max_s lse_s),
//       lse = max + log(sum_s w_s).
//   kvcache_append        (FS_AUX_ONLY=1 build) k_new / v_new -> cache rows cache_seqlens[b] + i
//       (through block_table when paged), rotary on k_new and q (q -> q_rot); 16 bytes per thread.
//
// GQA packing: the rows of a CTA are (query i, head j of the kv head's group) pairs, row
// R = i * group + j (q head = kv_head * group + j), so one CTA reads each K/V byte once for the
// whole group: with seqlen_q * group <= BLOCK_M (decode: seqlen_q 1..16, group 1..8) K/V travel
// from memory exactly once per kv head, which is what a bandwidth-bound decode step must achieve.
// Larger groups take several M blocks; they are adjacent in the grid, so their K/V reads meet in L2.
//
// Tiles and warp roles (NWARPS = 4): the Q tile is BLOCK_M x HEAD_DIM, a K or V tile BLOCK_N x
// HEAD_DIM. Warps form a WARPS_M x WARPS_N grid, WARPS_M = BLOCK_M / 16: warp w owns the 16 rows
// [16 * (w / WARPS_N), +16) of the Q tile and the WARP_KEYS = BLOCK_N / WARPS_N keys
// [WARP_KEYS * (w % WARPS_N), +WARP_KEYS) of every K/V tile (BLOCK_M 16: 4 warps split the keys,
// 16 each; BLOCK_M 64: 4 warps split the rows and each sees all keys). Each warp keeps its own
// online-softmax state (max, sum, O) over its keys; the WARPS_N states of a row are merged once at
// the end. Inside a warp the mma fragment layout applies: lane = 4 g + t owns rows g, g + 8 and
// columns 2t, 2t + 1 of each 8-column slab.
//
// Data movement: every thread moves 16-byte chunks with cp.async (chunk column tid % (HEAD_DIM/8)
// of rows tid / (HEAD_DIM/8) + k * rows_per_pass), BLOCK_N * HEAD_DIM / (8 * 128) chunks of K and
// as many of V per tile (hd128: 8 + 8), STAGES tiles buffered (STAGES - 1 in flight during a
// tile's math). Rows outside [leftpad, seqlens_k) and chunks past head_dim are zero-filled, never
// read. Paged caches look up block_table per row (per tile when block_size % BLOCK_N == 0).
//
// Shared memory (dynamic): Q tile | merge statistics | STAGES x (K tile, V tile); rows padded by
// 16 bytes so the 8 rows of an ldmatrix phase fall in distinct banks. After the main loop the K/V
// region holds the fp32 partial O of each key-warp for the merge.
//
// Index safety (device data is never trusted): seqlens_k clamped to [0, capacity], leftpad to
// [0, seqlens_k]; a cache_batch_idx outside [0, cache_rows) or a block_table entry outside
// [0, num_blocks) is never dereferenced: its keys count as absent and the (batch, kv head group)
// rows get NaN out / lse (partials: NaN lse, which the combine propagates), so the error shows.
//
// Launcher-checked requirements: q/k/v/out base pointers and every batch/row/head stride 16-byte
// aligned, head dim stride 1, head_dim a multiple of 8 and <= FS_HEAD_DIM, fp16/bf16 only,
// softmax_scale > 0, softcap >= 0, capacity + seqlen_q < 2^31 (positions are 32-bit; memory
// offsets 64-bit).
//
// The prelude defines FS_DTYPE (0 fp16, 1 bf16), FS_ARCH and, for the main build, FS_HEAD_DIM,
// FS_BLOCK_M, FS_BLOCK_N, FS_NWARPS, FS_STAGES, FS_HAS_SOFTCAP, FS_MIN_BLOCKS; FS_AUX_ONLY=1
// builds only the combine and append entries.

#include "common/types.cuh"
#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/softcap.cuh"

#if !defined(FS_DTYPE) || !defined(FS_ARCH)
#error "the prelude must define FS_DTYPE and FS_ARCH"
#endif
#ifndef FS_AUX_ONLY
#define FS_AUX_ONLY 0
#endif
#if FS_DTYPE != 0 && FS_DTYPE != 1
#error "flash_decode supports FS_DTYPE 0 (fp16) and 1 (bf16)"
#endif

// The by-value parameter of flash_decode_kernel and flash_decode_combine (host mirror:
// FlashDecodeParams in src/ops/attention_decode.rs). Strides in elements. Paged caches: the
// k/v "batch" stride is the stride between cache blocks.
struct FlashDecodeParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;          // nullable; (batch, nheads, seqlen_q), natural-log LSE
    float* o_partial;    // num_splits > 1: (num_splits, batch, nheads, seqlen_q, head_dim) fp32
    float* lse_partial;  // num_splits > 1: (num_splits, batch, nheads, seqlen_q) fp32
    const int* seqlens_k;        // (batch,): keys [leftpad, seqlens_k) of each row attend
    const int* cache_batch_idx;  // nullable (contiguous only): cache row of batch b
    const int* cache_leftpad;    // nullable
    const int* block_table;      // nullable: paged cache, (batch, max_blocks)
    long long q_batch_stride, q_row_stride, q_head_stride;
    long long k_batch_stride, k_row_stride, k_head_stride;
    long long v_batch_stride, v_row_stride, v_head_stride;
    long long o_batch_stride, o_row_stride, o_head_stride;
    long long block_table_stride;
    int batch, nheads, nheads_k, group, seqlen_q, head_dim;
    int cache_rows;  // contiguous: batch_cache; paged: num_blocks
    int capacity;    // keys one sequence can hold: seqlen_cache, or max_blocks * block_size
    int block_size;  // paged: keys per cache block (0 when contiguous)
    int max_blocks;  // paged: block_table columns
    int num_splits, m_blocks;
    float softmax_scale;
    float softcap;
    int window_left, window_right;  // -1 = unbounded
    int seqlens_k_add;  // >= 0, added to every seqlens_k[b] (the keys a same-call append adds)
    int pad_;
};

// The by-value parameter of kvcache_append (host mirror: KvAppendParams).
struct KvAppendParams {
    const void* k_new;  // nullable (with v_new): (batch, seqlen_new, nheads_k, head_dim)
    const void* v_new;
    void* k_cache;
    void* v_cache;
    const int* cache_seqlens;    // (batch,)
    const int* cache_batch_idx;  // nullable
    const int* cache_leftpad;    // nullable
    const int* block_table;      // nullable
    const void* rotary_cos;      // nullable: (seqlen_ro, rotary_dim / 2), q's dtype or fp32
    const void* rotary_sin;
    const void* q;               // nullable (with q_rot): (batch, seqlen_q, nheads, head_dim)
    void* q_rot;
    long long kn_batch_stride, kn_row_stride, kn_head_stride;
    long long vn_batch_stride, vn_row_stride, vn_head_stride;
    long long kc_batch_stride, kc_row_stride, kc_head_stride;
    long long vc_batch_stride, vc_row_stride, vc_head_stride;
    long long q_batch_stride, q_row_stride, q_head_stride;
    long long qr_batch_stride, qr_row_stride, qr_head_stride;
    long long block_table_stride, cos_row_stride, sin_row_stride;
    int batch, seqlen_new, nheads_k, seqlen_q, nheads, head_dim;
    int cache_rows, capacity, block_size, max_blocks;
    int rotary_dim, seqlen_ro, interleaved, cs_f32;
};

namespace fd {

using namespace fs;

static constexpr int kElemBytes = 2;
static constexpr int kAuxThreads = 128;
static constexpr int kCombineUnroll = 8;  // splits whose partials one combine step loads at once

// The number of valid keys of batch b (seqlens_k[b] + add, clamped to [0, capacity]) and its
// leftpad (clamped to [0, that]).
__device__ __forceinline__ int2 key_range(const int* seqlens, int add, const int* leftpad, int b,
                                          int capacity) {
    const long long raw = (long long)__ldg(seqlens + b) + add;
    const int hi = (int)min(max(raw, 0LL), (long long)capacity);
    const int lo = leftpad ? min(max(__ldg(leftpad + b), 0), hi) : 0;
    return make_int2(lo, hi);
}

}  // namespace fd

#if !FS_AUX_ONLY
#if !defined(FS_HEAD_DIM) || !defined(FS_BLOCK_M) || !defined(FS_BLOCK_N) || !defined(FS_NWARPS) || \
    !defined(FS_STAGES) || !defined(FS_HAS_SOFTCAP)
#error "the main build needs FS_HEAD_DIM, FS_BLOCK_M, FS_BLOCK_N, FS_NWARPS, FS_STAGES and FS_HAS_SOFTCAP"
#endif
#ifndef FS_MIN_BLOCKS
#define FS_MIN_BLOCKS 1
#endif

namespace fd {

// ---- compile-time tile shape -------------------------------------------------------------------
static constexpr int kHeadDim = FS_HEAD_DIM;
static constexpr int kBlockM = FS_BLOCK_M;                 // packed (query, group head) rows
static constexpr int kBlockN = FS_BLOCK_N;                 // keys per K/V tile
static constexpr int kNWarps = FS_NWARPS;
static constexpr int kNThreads = kNWarps * 32;
static constexpr int kStages = FS_STAGES;
static constexpr int kWarpsM = kBlockM / 16;               // warps along the rows, 16 rows each
static constexpr int kWarpsN = kNWarps / kWarpsM;          // warps along the keys of a tile
static constexpr int kWarpKeys = kBlockN / kWarpsN;        // keys of a tile one warp owns
static constexpr int kNTiles = kWarpKeys / 8;              // 8-key slabs of S per warp
static constexpr int kDTiles = kHeadDim / 8;               // 8-column slabs of O per warp
static constexpr int kKSteps = kHeadDim / 16;              // k16 steps of Q K^T
static constexpr int kChunksPerRow = kHeadDim * kElemBytes / 16;
static constexpr int kRowBytes = kHeadDim * kElemBytes + 16;  // padded shared-memory row
static constexpr int kQBytes = kBlockM * kRowBytes;
static constexpr int kStatBytes = (2 * kWarpsN + 2) * kBlockM * 4;  // per-warp max, sum; 1/sum, lse
static constexpr int kTileBytes = kBlockN * kRowBytes;     // one K or one V tile
static constexpr int kStageBytes = 2 * kTileBytes;
static constexpr int kORow = kHeadDim + 4;                 // fp32 merge row (floats), padded
static constexpr int kMergeBytes = kWarpsN * kBlockM * kORow * 4;
static constexpr int kKVRegion = kStages * kStageBytes > kMergeBytes ? kStages * kStageBytes : kMergeBytes;
static constexpr int kSmemBytes = kQBytes + kStatBytes + kKVRegion;  // host mirror: decode_smem_bytes
// Q fragments stay in registers when they fit beside the O accumulators.
static constexpr bool kQInRegs = kHeadDim <= 128;
static constexpr int kRowsPerPass = kNThreads / kChunksPerRow;
static constexpr int kActiveThreads = kRowsPerPass * kChunksPerRow;
static constexpr int kKVPasses = (kBlockN + kRowsPerPass - 1) / kRowsPerPass;
static constexpr int kQPasses = (kBlockM + kRowsPerPass - 1) / kRowsPerPass;

static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim tile must be 32..256, step 32");
static_assert(kBlockM % 16 == 0 && kNWarps % kWarpsM == 0, "each warp owns one 16-row slab");
static_assert(kWarpKeys % 16 == 0, "each warp owns whole k16 key slabs");
static_assert(kStages >= 2 && kStages <= 4, "FS_STAGES is 2..4");
static_assert(kRowsPerPass >= 1, "a row must not need more chunks than the CTA has threads");
static_assert(kStatBytes % 16 == 0 && kQBytes % 16 == 0, "regions stay 16-byte aligned");

// Where a CTA's K/V come from: the kv head's base in the cache (contiguous: of its cache row),
// the visible key range [lo, hi) and the paging geometry.
struct KVSource {
    const char* k;
    const char* v;
    const int* table;  // this batch's block_table row, or nullptr (contiguous)
    int lo, hi;
};

// cp.async one K tile and one V tile (keys n0 .. n0 + BLOCK_N) into shared memory. Rows outside
// [lo, hi) or whose cache block id is out of range are zero-filled, never read; a bad block id
// sets `bad`.
__device__ __forceinline__ void load_kv_tile(const FlashDecodeParams& p, const KVSource& src, u32 sK, int n0,
                                             bool& bad) {
    const int tid = threadIdx.x;
    if (kActiveThreads < kNThreads && tid >= kActiveThreads) return;
    const int row0 = tid / kChunksPerRow;
    const int col = (tid % kChunksPerRow) * 16;
    const bool col_ok = (tid % kChunksPerRow) * 8 < p.head_dim;
    const u32 sV = sK + kTileBytes;
    // Paged, with block_size a multiple of BLOCK_N: the tile lies in one cache block.
    int tile_page = 0;
    const bool per_tile = src.table && p.block_size % kBlockN == 0;
    if (per_tile) tile_page = __ldg(src.table + n0 / p.block_size);  // n0 < hi <= capacity
#pragma unroll
    for (int i = 0; i < kKVPasses; ++i) {
        const int row = row0 + i * kRowsPerPass;
        if (kBlockN % kRowsPerPass != 0 && row >= kBlockN) break;
        const int pos = n0 + row;
        bool valid = col_ok && pos >= src.lo && pos < src.hi;
        long long koff = 0, voff = 0;
        if (valid) {
            if (src.table) {
                const int blk = pos / p.block_size;  // < max_blocks: pos < capacity
                const int page = per_tile ? tile_page : __ldg(src.table + blk);
                if ((unsigned)page >= (unsigned)p.cache_rows) {
                    bad = true;
                    valid = false;
                } else {
                    const long long in_blk = pos - blk * p.block_size;
                    koff = (long long)page * p.k_batch_stride + in_blk * p.k_row_stride;
                    voff = (long long)page * p.v_batch_stride + in_blk * p.v_row_stride;
                }
            } else {
                koff = (long long)pos * p.k_row_stride;
                voff = (long long)pos * p.v_row_stride;
            }
        }
        const u32 d = row * kRowBytes + col;
        cp_async16(sK + d, valid ? src.k + koff * kElemBytes + col : src.k, valid);
        cp_async16(sV + d, valid ? src.v + voff * kElemBytes + col : src.v, valid);
    }
}

// cp.async the CTA's Q rows: row r of the tile is packed row R = m0 + r = i * group + j, i.e. query
// i of q head kv_head * group + j. Rows past seqlen_q * group and chunks past head_dim are zeroed.
__device__ __forceinline__ void load_q_tile(const FlashDecodeParams& p, u32 sQ, int b, int hk, int m0) {
    const int tid = threadIdx.x;
    if (kActiveThreads < kNThreads && tid >= kActiveThreads) return;
    const int row0 = tid / kChunksPerRow;
    const int col = (tid % kChunksPerRow) * 16;
    const bool col_ok = (tid % kChunksPerRow) * 8 < p.head_dim;
    const int rows = p.seqlen_q * p.group;
    const char* q = static_cast<const char*>(p.q);
#pragma unroll
    for (int i = 0; i < kQPasses; ++i) {
        const int row = row0 + i * kRowsPerPass;
        if (kBlockM % kRowsPerPass != 0 && row >= kBlockM) break;
        const int R = m0 + row;
        const bool valid = col_ok && R < rows;
        const int qi = valid ? R / p.group : 0;
        const int h = hk * p.group + (valid ? R - qi * p.group : 0);
        const char* s = q + ((long long)b * p.q_batch_stride + (long long)qi * p.q_row_stride +
                             (long long)h * p.q_head_stride) * kElemBytes + col;
        cp_async16(sQ + row * kRowBytes + col, valid ? s : q, valid);
    }
}

}  // namespace fd

// ---- the split-KV attention kernel -------------------------------------------------------------
// grid = (m_blocks * num_splits, nheads_k, batch), block = NWARPS * 32, dynamic smem = kSmemBytes.
extern "C" __global__ void __launch_bounds__(fd::kNThreads, FS_MIN_BLOCKS)
flash_decode_kernel(const FlashDecodeParams p) {
    using namespace fd;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 s_base = smem_u32(smem_raw);
    const u32 sQ = s_base;
    float* s_max = reinterpret_cast<float*>(smem_raw + kQBytes);  // [kWarpsN][kBlockM], log2 units
    float* s_sum = s_max + kWarpsN * kBlockM;                     // [kWarpsN][kBlockM]
    float* s_inv = s_sum + kWarpsN * kBlockM;                     // [kBlockM]: 1 / total sum
    float* s_lse = s_inv + kBlockM;                               // [kBlockM]: natural-log LSE
    const u32 s_kv = s_base + kQBytes + kStatBytes;
    float* s_o = reinterpret_cast<float*>(smem_raw + kQBytes + kStatBytes);  // after the loop

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int wm = warp / kWarpsN;  // row slab of this warp
    const int wn = warp % kWarpsN;  // key slice of this warp
    const int g = lane >> 2;
    const int t = lane & 3;

    const int mb = blockIdx.x % p.m_blocks;
    const int split = blockIdx.x / p.m_blocks;
    const int hk = blockIdx.y;
    const int b = blockIdx.z;
    const int m0 = mb * kBlockM;
    const int rows_total = p.seqlen_q * p.group;

    // ---- this batch's keys, cache row and key-block range ----
    const int2 kr = key_range(p.seqlens_k, p.seqlens_k_add, p.cache_leftpad, b, p.capacity);
    KVSource src;
    src.lo = kr.x;
    src.hi = kr.y;
    src.table = nullptr;
    bool bad = false;
    {
        long long row_off = (long long)hk * p.k_head_stride, vrow_off = (long long)hk * p.v_head_stride;
        if (p.block_table) {
            src.table = p.block_table + (long long)b * p.block_table_stride;
        } else {
            const int cb = p.cache_batch_idx ? __ldg(p.cache_batch_idx + b) : b;
            if ((unsigned)cb >= (unsigned)p.cache_rows) {
                bad = true;  // never dereferenced: no keys, NaN result
                src.lo = src.hi = 0;
            } else {
                row_off += (long long)cb * p.k_batch_stride;
                vrow_off += (long long)cb * p.v_batch_stride;
            }
        }
        src.k = static_cast<const char*>(p.k) + row_off * kElemBytes;
        src.v = static_cast<const char*>(p.v) + vrow_off * kElemBytes;
    }
    // Query i sits at absolute key position diag + i (bottom-right alignment over [lo, hi)).
    const int diag = src.hi - p.seqlen_q;
    const int q_first = m0 / p.group;
    const int q_last = (min(m0 + kBlockM, rows_total) - 1) / p.group;
    int n_lo = src.lo / kBlockN;
    int n_hi = (src.hi + kBlockN - 1) / kBlockN;
    if (p.window_left >= 0) {
        const int first = diag + q_first - p.window_left;  // first key of the first row
        if (first > 0) n_lo = max(n_lo, first / kBlockN);
    }
    if (p.window_right >= 0) {
        const int last = diag + q_last + p.window_right;  // last key of the last row
        n_hi = last < 0 ? 0 : min(n_hi, last / kBlockN + 1);
    }
    // This split's blocks: an even share of [n_lo, n_hi).
    const int n_blocks = max(n_hi - n_lo, 0);
    const int per_split = (n_blocks + p.num_splits - 1) / p.num_splits;
    const int n_begin = n_lo + split * per_split;
    const int n_count = max(min(per_split, n_lo + n_blocks - n_begin), 0);

    const ScoreScale scale = score_scale<FS_HAS_SOFTCAP>(p.softmax_scale, p.softcap);
    const float scale_log2 = scale.log2;

    // ldmatrix lane offsets (bytes): A from Q rows {0-7, 8-15} x {chunk 0, 1} of the warp's slab;
    // B from K (keys {0-7 | chunk 0, 0-7 | chunk 1, 8-15 | chunk 0, 8-15 | chunk 1}); B from V
    // transposed (keys {0-7, 8-15} x dims {0-7, 8-15}), both from the warp's key slice.
    const u32 q_lane = (u32)((wm * 16 + (lane & 15)) * kRowBytes + (lane >> 4) * 16);
    const u32 k_lane = (u32)((wn * kWarpKeys + (lane & 7) + ((lane >> 4) << 3)) * kRowBytes + ((lane >> 3) & 1) * 16);
    const u32 v_lane = (u32)((wn * kWarpKeys + (lane & 7) + (((lane >> 3) & 1) << 3)) * kRowBytes + (lane >> 4) * 16);

    // ---- prologue: Q (its own group), then the first STAGES - 1 K/V tiles ----
    load_q_tile(p, sQ, b, hk, m0);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
        if (s < n_count) load_kv_tile(p, src, s_kv + s * kStageBytes, (n_begin + s) * kBlockN, bad);
        cp_async_commit();
    }

    u32 q_frag[kQInRegs ? kKSteps : 1][4];
    if (kQInRegs) {
        cp_async_wait<kStages - 1>();  // Q landed
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < (kQInRegs ? kKSteps : 1); ++kk) ldsm_x4(q_frag[kk], sQ + q_lane + kk * 32);
    }

    float acc_o[kDTiles][4];
#pragma unroll
    for (int d = 0; d < kDTiles; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[d][e] = 0.0f;
    float row_max[2] = {neg_inf(), neg_inf()};
    float row_sum[2] = {0.0f, 0.0f};

    for (int it = 0; it < n_count; ++it) {
        cp_async_wait<kStages - 2>();  // tile `it` (and Q) landed for this thread
        __syncthreads();               // ...for every thread; every warp is done with tile it - 1
        {
            const int nxt = it + kStages - 1;  // refill the buffer tile it - 1 used
            if (nxt < n_count)
                load_kv_tile(p, src, s_kv + (nxt % kStages) * kStageBytes, (n_begin + nxt) * kBlockN, bad);
            cp_async_commit();
        }
        const u32 sK = s_kv + (it % kStages) * kStageBytes;
        const u32 sV = sK + kTileBytes;
        const int n0 = (n_begin + it) * kBlockN;

        // ---- S = Q K^T over this warp's keys ----
        float acc_s[kNTiles][4];
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < kKSteps; ++kk) {
            u32 a[4];
            if (kQInRegs) {
#pragma unroll
                for (int e = 0; e < 4; ++e) a[e] = q_frag[kQInRegs ? kk : 0][e];
            } else {
                ldsm_x4(a, sQ + q_lane + kk * 32);
            }
#pragma unroll
            for (int np = 0; np < kNTiles / 2; ++np) {
                u32 bk[4];
                ldsm_x4(bk, sK + k_lane + np * 16 * kRowBytes + kk * 32);
                mma16_x2<FS_DTYPE>(acc_s[2 * np], acc_s[2 * np + 1], a, bk);
            }
        }
#if FS_HAS_SOFTCAP
#pragma unroll
        for (int j = 0; j < kNTiles; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_s[j][e] = tanh_softcap<FS_DTYPE>(acc_s[j][e] * scale.pre);
#endif

        // ---- mask: key c is visible to query i iff lo <= c < hi and
        //      -window_left <= c - (diag + i) <= window_right. Only boundary tiles pay. ----
        bool need_mask = n0 < src.lo || n0 + kBlockN > src.hi;
        if (p.window_left >= 0 && n0 < diag + q_last - p.window_left) need_mask = true;
        if (p.window_right >= 0 && n0 + kBlockN - 1 > diag + q_first + p.window_right) need_mask = true;
        if (need_mask) {
            const int col0 = n0 + wn * kWarpKeys + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int R = m0 + wm * 16 + g + 8 * h;
                const int qpos = diag + R / p.group;
                const int c_lo = p.window_left >= 0 ? max(src.lo, qpos - p.window_left) : src.lo;
                const int c_hi = p.window_right >= 0 ? min(src.hi, qpos + p.window_right + 1) : src.hi;
#pragma unroll
                for (int j = 0; j < kNTiles; ++j)
#pragma unroll
                    for (int e = 0; e < 2; ++e) {
                        const int c = col0 + j * 8 + e;
                        if (c < c_lo || c >= c_hi) acc_s[j][2 * h + e] = neg_inf();
                    }
            }
        }

        // ---- online softmax over this warp's keys (base 2, scale folded into one FFMA) ----
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float mx = row_max[h];
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) mx = fmaxf(mx, fmaxf(acc_s[j][2 * h], acc_s[j][2 * h + 1]));
            mx = quad_max(mx);
            // A row with nothing visible yet keeps max -inf: base 0 so exp2 gives 0, not NaN.
            const float base = (mx == neg_inf()) ? 0.0f : mx * scale_log2;
            const float alpha = ex2(row_max[h] * scale_log2 - base);
            row_max[h] = mx;
            float sum = row_sum[h] * alpha;
#pragma unroll
            for (int d = 0; d < kDTiles; ++d) {
                acc_o[d][2 * h] *= alpha;
                acc_o[d][2 * h + 1] *= alpha;
            }
#pragma unroll
            for (int j = 0; j < kNTiles; ++j) {
                const float p0 = ex2(fmaf(acc_s[j][2 * h], scale_log2, -base));
                const float p1 = ex2(fmaf(acc_s[j][2 * h + 1], scale_log2, -base));
                acc_s[j][2 * h] = p0;
                acc_s[j][2 * h + 1] = p1;
                sum += p0 + p1;
            }
            row_sum[h] = sum;  // this thread's columns; quad-reduced at the end
        }

        // ---- O += P V over this warp's keys ----
#pragma unroll
        for (int kk = 0; kk < kWarpKeys / 16; ++kk) {
            u32 a[4];
            acc_to_a<FS_DTYPE>(a, acc_s[2 * kk], acc_s[2 * kk + 1]);
#pragma unroll
            for (int dp = 0; dp < kDTiles / 2; ++dp) {
                u32 bv[4];
                ldsm_x4_trans(bv, sV + v_lane + kk * 16 * kRowBytes + dp * 32);
                mma16_x2<FS_DTYPE>(acc_o[2 * dp], acc_o[2 * dp + 1], a, bv);
            }
        }
    }

    // ---- merge the key-warps' states of each row ----
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the K/V buffers; nothing in flight
    float m_log2[2], l_own[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = wm * 16 + g + 8 * h;
        l_own[h] = quad_sum(row_sum[h]);
        m_log2[h] = row_max[h] == neg_inf() ? neg_inf() : row_max[h] * scale_log2;
        if (t == 0) {
            s_max[wn * kBlockM + r] = m_log2[h];
            s_sum[wn * kBlockM + r] = l_own[h];
        }
    }
    __syncthreads();
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = wm * 16 + g + 8 * h;
        float m_all = neg_inf();
#pragma unroll
        for (int w = 0; w < kWarpsN; ++w) m_all = fmaxf(m_all, s_max[w * kBlockM + r]);
        const float f = m_log2[h] == neg_inf() ? 0.0f : ex2(m_log2[h] - m_all);
        if (wn == 0 && t == 0) {
            float l_all = 0.0f;
#pragma unroll
            for (int w = 0; w < kWarpsN; ++w) {
                const float mw = s_max[w * kBlockM + r];
                l_all += mw == neg_inf() ? 0.0f : s_sum[w * kBlockM + r] * ex2(mw - m_all);
            }
            s_inv[r] = l_all > 0.0f ? rcp(l_all) : 0.0f;
            s_lse[r] = l_all > 0.0f ? (m_all + lg2(l_all)) * kLn2 : neg_inf();
        }
        float* orow = s_o + (wn * kBlockM + r) * kORow + 2 * t;
#pragma unroll
        for (int d = 0; d < kDTiles; ++d)
            *reinterpret_cast<float2*>(orow + d * 8) = make_float2(acc_o[d][2 * h] * f, acc_o[d][2 * h + 1] * f);
    }
    bad = __syncthreads_or(bad);

    // ---- store: 8 columns per item; out in the input dtype (num_splits == 1) or fp32 partials ----
    const bool final_out = p.num_splits == 1;
    const float nan = __int_as_float(0x7fffffff);
    const long long rows_all = (long long)p.batch * p.nheads * p.seqlen_q;
    for (int item = tid; item < kBlockM * kChunksPerRow; item += kNThreads) {
        const int r = item / kChunksPerRow;
        const int c = (item % kChunksPerRow) * 8;
        const int R = m0 + r;
        if (R >= rows_total || c >= p.head_dim) continue;
        float o[8];
        const float inv = s_inv[r];
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarpsN; ++w) {
            const float* src_o = s_o + (w * kBlockM + r) * kORow + c;
            const float4 x0 = *reinterpret_cast<const float4*>(src_o);
            const float4 x1 = *reinterpret_cast<const float4*>(src_o + 4);
            o[0] += x0.x; o[1] += x0.y; o[2] += x0.z; o[3] += x0.w;
            o[4] += x1.x; o[5] += x1.y; o[6] += x1.z; o[7] += x1.w;
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = bad ? nan : o[e] * inv;
        const int qi = R / p.group;
        const int h = hk * p.group + (R - qi * p.group);
        if (final_out) {
            char* dst = static_cast<char*>(p.o) +
                        ((long long)b * p.o_batch_stride + (long long)qi * p.o_row_stride +
                         (long long)h * p.o_head_stride + c) * kElemBytes;
            const uint4 v = make_uint4(pack2<FS_DTYPE>(o[0], o[1]), pack2<FS_DTYPE>(o[2], o[3]),
                                       pack2<FS_DTYPE>(o[4], o[5]), pack2<FS_DTYPE>(o[6], o[7]));
            *reinterpret_cast<uint4*>(dst) = v;
        } else {
            const long long row = (long long)split * rows_all + ((long long)b * p.nheads + h) * p.seqlen_q + qi;
            float* dst = p.o_partial + row * p.head_dim + c;
            *reinterpret_cast<float4*>(dst) = make_float4(o[0], o[1], o[2], o[3]);
            *reinterpret_cast<float4*>(dst + 4) = make_float4(o[4], o[5], o[6], o[7]);
        }
    }
    for (int r = tid; r < kBlockM; r += kNThreads) {
        const int R = m0 + r;
        if (R >= rows_total) continue;
        const int qi = R / p.group;
        const int h = hk * p.group + (R - qi * p.group);
        const long long row = ((long long)b * p.nheads + h) * p.seqlen_q + qi;
        const float l = bad ? nan : s_lse[r];
        if (final_out) {
            if (p.lse) p.lse[row] = l;
        } else {
            p.lse_partial[(long long)split * rows_all + row] = l;
        }
    }
}
#endif  // !FS_AUX_ONLY

#if FS_AUX_ONLY
// ---- combine the splits --------------------------------------------------------------------------
// grid = batch * nheads * seqlen_q, block = 128: block x merges row x (row = (b * nheads + h) *
// seqlen_q + i, the layout of lse). Every warp reads all the splits' LSEs (a few hundred bytes,
// L2 hits) for the max and the sum of weights; warp w then accumulates splits w, w + 4, ..., loading
// kCombineUnroll of them at once (lane l owns columns [8l, 8l + 8)), and the four partial rows meet
// in shared memory. A row's partials are a few KB: one warp walking them is latency-bound (it was a
// quarter of a b1 32k decode call), four warps per row overlap four times the loads.
extern "C" __global__ void __launch_bounds__(fd::kAuxThreads)
flash_decode_combine(const FlashDecodeParams p) {
    using namespace fd;
    constexpr int kWarps = kAuxThreads / 32;
    __shared__ float4 s_part[kWarps - 1][32][2];  // warps 1.. hand their 8 columns per lane to warp 0
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long rows = (long long)p.batch * p.nheads * p.seqlen_q;
    const long long row = blockIdx.x;
    if (row >= rows) return;  // (grid == rows: never)
    const float* lse_s = p.lse_partial + row;  // split s at lse_s[s * rows]

    // max over the splits (a NaN LSE marks a split that met a bad index)
    float mx = neg_inf();
    bool nan_seen = false;
    for (int s = lane; s < p.num_splits; s += 32) {
        const float v = lse_s[(long long)s * rows];
        nan_seen |= v != v;
        mx = fmaxf(mx, v);
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    nan_seen = __any_sync(0xffffffffu, nan_seen);
    float sum = 0.0f;
    if (mx != neg_inf()) {
        for (int s = lane; s < p.num_splits; s += 32) {
            const float v = lse_s[(long long)s * rows];
            if (v != neg_inf()) sum += ex2((v - mx) * kLog2e);
        }
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);

    const int c = lane * 8;
    const bool has_col = c < p.head_dim;
    float o[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) o[e] = 0.0f;
    if (has_col && sum > 0.0f) {
        // this warp's splits (w, w + kWarps, ...), kCombineUnroll at a time, every load issued
        // before any is used
        for (int s0 = warp; s0 < p.num_splits; s0 += kWarps * kCombineUnroll) {
            float v[kCombineUnroll];
            float4 x0[kCombineUnroll], x1[kCombineUnroll];
#pragma unroll
            for (int u = 0; u < kCombineUnroll; ++u) {
                const int s = s0 + u * kWarps;
                v[u] = neg_inf();
                if (s < p.num_splits) {
                    v[u] = lse_s[(long long)s * rows];
                    const float* src = p.o_partial + ((long long)s * rows + row) * p.head_dim + c;
                    x0[u] = *reinterpret_cast<const float4*>(src);
                    x1[u] = *reinterpret_cast<const float4*>(src + 4);
                }
            }
#pragma unroll
            for (int u = 0; u < kCombineUnroll; ++u) {
                if (!(v[u] > neg_inf())) continue;  // empty split (-inf) or NaN: not used
                const float w = ex2((v[u] - mx) * kLog2e);
                o[0] = fmaf(w, x0[u].x, o[0]); o[1] = fmaf(w, x0[u].y, o[1]);
                o[2] = fmaf(w, x0[u].z, o[2]); o[3] = fmaf(w, x0[u].w, o[3]);
                o[4] = fmaf(w, x1[u].x, o[4]); o[5] = fmaf(w, x1[u].y, o[5]);
                o[6] = fmaf(w, x1[u].z, o[6]); o[7] = fmaf(w, x1[u].w, o[7]);
            }
        }
    }
    if (warp > 0) {
        s_part[warp - 1][lane][0] = make_float4(o[0], o[1], o[2], o[3]);
        s_part[warp - 1][lane][1] = make_float4(o[4], o[5], o[6], o[7]);
    }
    __syncthreads();
    if (warp > 0) return;
#pragma unroll
    for (int w = 0; w < kWarps - 1; ++w) {
        const float4 a = s_part[w][lane][0], b4 = s_part[w][lane][1];
        o[0] += a.x; o[1] += a.y; o[2] += a.z; o[3] += a.w;
        o[4] += b4.x; o[5] += b4.y; o[6] += b4.z; o[7] += b4.w;
    }

    const int qi = (int)(row % p.seqlen_q);
    const long long bh = row / p.seqlen_q;
    const int h = (int)(bh % p.nheads);
    const int b = (int)(bh / p.nheads);
    const float nan = __int_as_float(0x7fffffff);
    if (has_col) {
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) o[e] = nan_seen ? nan : o[e] * inv;
        char* dst = static_cast<char*>(p.o) +
                    ((long long)b * p.o_batch_stride + (long long)qi * p.o_row_stride +
                     (long long)h * p.o_head_stride + c) * kElemBytes;
        *reinterpret_cast<uint4*>(dst) =
            make_uint4(pack2<FS_DTYPE>(o[0], o[1]), pack2<FS_DTYPE>(o[2], o[3]), pack2<FS_DTYPE>(o[4], o[5]),
                       pack2<FS_DTYPE>(o[6], o[7]));
    }
    if (p.lse && lane == 0) p.lse[row] = nan_seen ? nan : (sum > 0.0f ? mx + kLn2 * lg2(sum) : neg_inf());
}

// ---- append to the cache, rotary -------------------------------------------------------------------
namespace fd {

// cos / sin at (position, index), in q's dtype or fp32.
__device__ __forceinline__ float rot_coef(const KvAppendParams& p, const void* base, long long row_stride, int pos,
                                          int idx) {
    const long long at = (long long)pos * row_stride + idx;
    return p.cs_f32 ? ldg_f32<2>(base, at) : ldg_f32<FS_DTYPE>(base, at);
}

// Rotary of the 8 elements [c, c + 8) of a head row (x, already loaded; row: the row's first
// element, for the partners of the non-interleaved layout) at rotary position pos. Columns past
// rotary_dim pass through. pos outside [0, seqlen_ro) gives NaN (a bad index made visible).
__device__ __forceinline__ void rotate8(const KvAppendParams& p, float (&x)[8], const char* row, int c, int pos) {
    if (c >= p.rotary_dim) return;
    if (pos < 0 || pos >= p.seqlen_ro) {
#pragma unroll
        for (int e = 0; e < 8; ++e)
            if (c + e < p.rotary_dim) x[e] = __int_as_float(0x7fffffff);
        return;
    }
    if (p.interleaved) {
        // GPT-J: pairs (2i, 2i + 1) rotate by angle i; a pair never straddles a chunk.
#pragma unroll
        for (int e = 0; e < 8; e += 2) {
            const int col = c + e;
            if (col < p.rotary_dim) {
                const float cs = rot_coef(p, p.rotary_cos, p.cos_row_stride, pos, col / 2);
                const float sn = rot_coef(p, p.rotary_sin, p.sin_row_stride, pos, col / 2);
                const float x0 = x[e], x1 = x[e + 1];
                x[e] = x0 * cs - x1 * sn;
                x[e + 1] = x0 * sn + x1 * cs;
            }
        }
    } else {
        // GPT-NeoX: element i pairs with i + rotary_dim / 2.
        const int half = p.rotary_dim / 2;
        float y[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            const int col = c + e;
            y[e] = x[e];
            if (col < p.rotary_dim) {
                const bool first = col < half;
                const int idx = first ? col : col - half;
                const float partner = ldg_f32<FS_DTYPE>(row, first ? col + half : col - half);
                const float cs = rot_coef(p, p.rotary_cos, p.cos_row_stride, pos, idx);
                const float sn = rot_coef(p, p.rotary_sin, p.sin_row_stride, pos, idx);
                y[e] = first ? x[e] * cs - partner * sn : x[e] * cs + partner * sn;
            }
        }
#pragma unroll
        for (int e = 0; e < 8; ++e) x[e] = y[e];
    }
}

__device__ __forceinline__ uint4 load16(const char* p) {
    return __ldg(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ void unpack8(float (&x)[8], uint4 v) {
    const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 f = unpack2<FS_DTYPE>(w[i]);
        x[2 * i] = f.x;
        x[2 * i + 1] = f.y;
    }
}
__device__ __forceinline__ uint4 pack8(const float (&x)[8]) {
    return make_uint4(pack2<FS_DTYPE>(x[0], x[1]), pack2<FS_DTYPE>(x[2], x[3]), pack2<FS_DTYPE>(x[4], x[5]),
                      pack2<FS_DTYPE>(x[6], x[7]));
}

}  // namespace fd

// grid = (ceil(items / 128), 2): y = 0 moves k_new / v_new (items: batch * seqlen_new * nheads_k *
// head_dim / 8), y = 1 rotates q (batch * seqlen_q * nheads * head_dim / 8); one 16-byte chunk of one
// head row per thread. Cache slots outside [0, capacity), cache rows / block ids out of range are
// skipped (never written).
extern "C" __global__ void __launch_bounds__(fd::kAuxThreads) kvcache_append(const KvAppendParams p) {
    using namespace fd;
    const int chunks = p.head_dim / 8;
    const long long item = (long long)blockIdx.x * kAuxThreads + threadIdx.x;
    const bool rotary = p.rotary_cos != nullptr;
    if (blockIdx.y == 0) {
        if (!p.k_new) return;
        const long long items = (long long)p.batch * p.seqlen_new * p.nheads_k * chunks;
        if (item >= items) return;
        const int c = (int)(item % chunks) * 8;
        long long rest = item / chunks;
        const int hk = (int)(rest % p.nheads_k);
        rest /= p.nheads_k;
        const int i = (int)(rest % p.seqlen_new);
        const int b = (int)(rest / p.seqlen_new);
        const int base = __ldg(p.cache_seqlens + b);
        const int pos = base + i;
        if (base < 0 || pos < 0 || pos >= p.capacity) return;  // past the cache: never written
        long long kdst, vdst;
        if (p.block_table) {
            const int blk = pos / p.block_size;
            const int page = __ldg(p.block_table + (long long)b * p.block_table_stride + blk);
            if ((unsigned)page >= (unsigned)p.cache_rows) return;
            const long long in_blk = pos - blk * p.block_size;
            kdst = (long long)page * p.kc_batch_stride + in_blk * p.kc_row_stride;
            vdst = (long long)page * p.vc_batch_stride + in_blk * p.vc_row_stride;
        } else {
            const int cb = p.cache_batch_idx ? __ldg(p.cache_batch_idx + b) : b;
            if ((unsigned)cb >= (unsigned)p.cache_rows) return;
            kdst = (long long)cb * p.kc_batch_stride + (long long)pos * p.kc_row_stride;
            vdst = (long long)cb * p.vc_batch_stride + (long long)pos * p.vc_row_stride;
        }
        kdst += (long long)hk * p.kc_head_stride + c;
        vdst += (long long)hk * p.vc_head_stride + c;
        const char* krow = static_cast<const char*>(p.k_new) +
                           ((long long)b * p.kn_batch_stride + (long long)i * p.kn_row_stride +
                            (long long)hk * p.kn_head_stride) * kElemBytes;
        const char* vsrc = static_cast<const char*>(p.v_new) +
                           ((long long)b * p.vn_batch_stride + (long long)i * p.vn_row_stride +
                            (long long)hk * p.vn_head_stride + c) * kElemBytes;
        uint4 kv = load16(krow + c * kElemBytes);
        if (rotary && c < p.rotary_dim) {
            const int lp = p.cache_leftpad ? __ldg(p.cache_leftpad + b) : 0;
            float x[8];
            unpack8(x, kv);
            rotate8(p, x, krow, c, pos - lp);
            kv = pack8(x);
        }
        *reinterpret_cast<uint4*>(static_cast<char*>(p.k_cache) + kdst * kElemBytes) = kv;
        *reinterpret_cast<uint4*>(static_cast<char*>(p.v_cache) + vdst * kElemBytes) = load16(vsrc);
    } else {
        if (!p.q) return;
        const long long items = (long long)p.batch * p.seqlen_q * p.nheads * chunks;
        if (item >= items) return;
        const int c = (int)(item % chunks) * 8;
        long long rest = item / chunks;
        const int h = (int)(rest % p.nheads);
        rest /= p.nheads;
        const int i = (int)(rest % p.seqlen_q);
        const int b = (int)(rest / p.seqlen_q);
        const char* qrow = static_cast<const char*>(p.q) +
                           ((long long)b * p.q_batch_stride + (long long)i * p.q_row_stride +
                            (long long)h * p.q_head_stride) * kElemBytes;
        uint4 qv = load16(qrow + c * kElemBytes);
        if (rotary && c < p.rotary_dim) {
            const int lp = p.cache_leftpad ? __ldg(p.cache_leftpad + b) : 0;
            float x[8];
            unpack8(x, qv);
            rotate8(p, x, qrow, c, __ldg(p.cache_seqlens + b) - lp + i);
            qv = pack8(x);
        }
        char* dst = static_cast<char*>(p.q_rot) +
                    ((long long)b * p.qr_batch_stride + (long long)i * p.qr_row_stride +
                     (long long)h * p.qr_head_stride + c) * kElemBytes;
        *reinterpret_cast<uint4*>(dst) = qv;
    }
}
#endif  // FS_AUX_ONLY
