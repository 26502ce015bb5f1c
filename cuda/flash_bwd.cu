// flash_bwd.cu: FlashAttention-2-class backward (dQ, dK, dV) on tensor cores (mma.sync).
//
// Three entries share this source and one by-value FlashBwdParams:
//
//   flash_bwd_preprocess  (FS_AUX_ONLY=1 build)  D = rowsum(dO * O) in fp32, lse_log2 = lse * log2(e)
//                         (+inf for rows the forward marked -inf, i.e. no visible key, and for the
//                         padded rows >= seqlen_q), and zeroes the fp32 dQ accumulator.
//   flash_bwd_kernel      one CTA owns one BLOCK_N-key block of one kv head (and one 1/DSPLIT slice
//                         of the head dim for dK / dV / dQ) and loops over every q head of its GQA group
//                         and every q block that sees one of its keys:
//       S^T = K Q^T, P^T = exp2(S^T * scale*log2e - lse_log2)     (softcap: S = cap * tanh(.))
//       dP^T = V dO^T,  dS^T = P^T * (dP^T - D)                    (softcap: * (1 - tanh^2))
//       dV += P^T dO,   dK += dS^T Q                                (P^T / dS^T straight from registers)
//       dS^T -> shared memory;  dQ_partial = dS K  -> fp32 red.add into the accumulator
//     and writes dK (times softmax_scale) and dV once, summed over the group: no dK/dV reduction pass.
//   flash_bwd_dq_convert  (FS_AUX_ONLY=1 build)  dq = softmax_scale * sum_split(dq_accum), cast
//                         (FS_DQ_FRAG: the accumulator in flash_bwd_sm90.cu's fragment order).
//
// Warp ownership in flash_bwd_kernel: warp w owns keys [WK w, WK (w + 1)) of the block, WK =
// BLOCK_N / NWARPS = 16 or 32 (kWK), for S^T, dP^T, dS^T and the dK / dV accumulators (kDOut
// columns each, in registers); with 32 keys per warp every Q / dO fragment read from shared
// memory feeds twice the mma of the 16-key layout (hd64's tile). For dQ the warps
// tile the BLOCK_M x kDOut output as kDqWM x kDqWD warps. mma fragment layout as usual: lane
// = 4 g + t owns rows g, g + 8 and columns 2t, 2t + 1 of each 16 x 8 tile.
//
// Shared memory (dynamic): K, V tiles (BLOCK_N rows), FS_STAGES x (Q, dO tiles of BLOCK_M rows),
// dS^T (BLOCK_N rows of BLOCK_M elements), FS_STAGES x (lse_log2, D: BLOCK_M floats each). Rows are
// padded by 16 bytes (conflict-free ldmatrix). With FS_STAGES == 2 the next (head, q block)'s
// Q / dO land while this one is computed; with 1 they land during the dQ product.
//
// Deterministic mode (params.nsplit > 1 or deterministic != 0): the grid's x dimension is nsplit;
// CTA x handles kv blocks x, x + nsplit, ... in order and owns slice x of the accumulator
// (nsplit copies), which it updates with plain loads/stores; the convert pass sums the slices in
// a fixed order. Otherwise one slice, red.global.add (v2 on sm_90).
//
// Precision: fp16 / bf16 use m16n8k16 with f32 accumulate, P and dS rounded to the input type
// as operands (as FlashAttention does); fp32 uses 3xTF32 (~fp32 accuracy), P and dS stay fp32.
//
// Requirements the launcher checks: every tensor row 16-byte aligned, head dim stride 1,
// params.head_dim a multiple of 8 and <= FS_HEAD_DIM, nheads % nheads_k == 0,
// seqlen_q_pad a multiple of FS_BLOCK_M and >= seqlen_q, seqlen_q + seqlen_k < 2^31.
//
// Varlen (FS_VARLEN=1, flash_attn_varlen_func): q / o / dout / dq are (total_q, nheads, hd) and
// k / v / dk / dv (total_k, nheads_k, hd), sequence b's rows [cu_seqlens[b], cu_seqlens[b+1]); the
// lse is (nheads, total_q). The two small passes first turn the packed parameters into their
// sequence's dense ones (sequence_params: row bounds clamped into [0, total], the query length to
// max_seqlen_q, base pointers moved to the sequence's first row); the main kernel keeps the same
// bounds (sequence_rows, common/flash_params.cuh) in spare shared memory and reads them where used
// (the FB_* macros; they expand to the dense code's own locals in the dense build), so the
// algorithm is unchanged; the launcher passes batch strides 0 and seqlen_q / seqlen_k as the
// maxima, and the scratch keeps its (batch, nheads, seqlen_q_pad) layout with seqlen_q_pad from
// max_seqlen_q. CTAs with no rows of their sequence to do fall through their loops. The dense
// build's struct and code are untouched.
//
// Prelude defines: FS_HEAD_DIM (tile), FS_DTYPE (0 fp16, 1 bf16, 2 fp32), FS_ARCH, and for the main
// kernel FS_BLOCK_M, FS_BLOCK_N (= 16 or 32 * FS_NWARPS), FS_NWARPS, FS_STAGES (1/2), FS_DSPLIT (1/2/4),
// FS_HAS_MASK, FS_HAS_SOFTCAP, FS_PAD_HEADDIM, FS_MIN_BLOCKS; FS_AUX_ONLY=1 builds only the two
// small passes (their variant depends on FS_DTYPE and FS_HEAD_DIM only).

#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/flash_params.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/softcap.cuh"

#if !defined(FS_HEAD_DIM) || !defined(FS_DTYPE) || !defined(FS_ARCH)
#error "the prelude must define FS_HEAD_DIM, FS_DTYPE and FS_ARCH"
#endif
#ifndef FS_AUX_ONLY
#define FS_AUX_ONLY 0
#endif
#ifndef FS_STAGES
#define FS_STAGES 2
#endif
#ifndef FS_DSPLIT
#define FS_DSPLIT 1
#endif
#ifndef FS_MIN_BLOCKS
#define FS_MIN_BLOCKS 1
#endif
#ifndef FS_VARLEN
#define FS_VARLEN 0
#endif


namespace fb {

using namespace fs;

static constexpr int kHeadDim = FS_HEAD_DIM;
static constexpr bool kF32 = (FS_DTYPE == 2);
static constexpr int kElemBytes = kF32 ? 4 : 2;
static constexpr int kElemsPerChunk = 16 / kElemBytes;
static constexpr int kChunksPerRow = kHeadDim * kElemBytes / 16;
static_assert(kHeadDim % 32 == 0 && kHeadDim <= 256, "head dim tile must be 32..256, step 32");
static_assert(FS_DTYPE >= 0 && FS_DTYPE <= 2, "FS_DTYPE is 0 (fp16), 1 (bf16) or 2 (fp32)");

// dot product of two 16-byte chunks (8 16-bit or 4 fp32 elements), fp32
__device__ __forceinline__ float dot_chunk(uint4 x, uint4 y) {
#if FS_DTYPE == 2
    return __uint_as_float(x.x) * __uint_as_float(y.x) + __uint_as_float(x.y) * __uint_as_float(y.y) +
           __uint_as_float(x.z) * __uint_as_float(y.z) + __uint_as_float(x.w) * __uint_as_float(y.w);
#else
    const u32 xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {y.x, y.y, y.z, y.w};
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float2 a = unpack2<FS_DTYPE>(xs[i]), b = unpack2<FS_DTYPE>(ys[i]);
        s = fmaf(a.x, b.x, s);
        s = fmaf(a.y, b.y, s);
    }
    return s;
#endif
}

#if FS_VARLEN
// Sequence b of a packed (varlen) call as a dense problem of batch 1 at its own rows.
__device__ __forceinline__ FlashBwdParams sequence_params(const FlashBwdParams& pk, int b) {
    FlashBwdParams p = pk;
    const SeqRows r = sequence_rows(pk, b);
    const int q0 = r.q0, k0 = r.k0;
    p.seqlen_q = r.len_q;
    p.seqlen_k = r.len_k;
    const long long qr = q0, kr = k0;
    p.q = static_cast<const char*>(pk.q) + qr * pk.q_row_stride * kElemBytes;
    p.o = static_cast<const char*>(pk.o) + qr * pk.o_row_stride * kElemBytes;
    p.dout = static_cast<const char*>(pk.dout) + qr * pk.do_row_stride * kElemBytes;
    p.dq = static_cast<char*>(pk.dq) + qr * pk.dq_row_stride * kElemBytes;
    p.k = static_cast<const char*>(pk.k) + kr * pk.k_row_stride * kElemBytes;
    p.v = static_cast<const char*>(pk.v) + kr * pk.v_row_stride * kElemBytes;
    p.dk = static_cast<char*>(pk.dk) + kr * pk.dk_row_stride * kElemBytes;
    p.dv = static_cast<char*>(pk.dv) + kr * pk.dv_row_stride * kElemBytes;
    p.lse = pk.lse + q0;
    p.q_batch_stride = p.k_batch_stride = p.v_batch_stride = p.o_batch_stride = 0;
    p.do_batch_stride = p.dq_batch_stride = p.dk_batch_stride = p.dv_batch_stride = 0;
    return p;
}
#endif

}  // namespace fb

// The entries take the packed parameters under FS_VARLEN and work on their sequence's.
#if FS_VARLEN
#define FS_BWD_PARAMS const FlashBwdParams p_packed
#define FS_BWD_SEQUENCE const FlashBwdParams p = fb::sequence_params(p_packed, blockIdx.z)
#else
#define FS_BWD_PARAMS const FlashBwdParams p
#define FS_BWD_SEQUENCE (void)0
#endif

// ---- preprocess: D, lse_log2, zeroed accumulator -------------------------------------------------
// grid = (seqlen_q_pad / 32, nheads, batch), block = 256: 8 threads per row, 32 rows per block.
extern "C" __global__ void __launch_bounds__(256) flash_bwd_preprocess(FS_BWD_PARAMS) {
    using namespace fb;
    FS_BWD_SEQUENCE;
    const int row = blockIdx.x * 32 + (threadIdx.x >> 3);
    const int l8 = threadIdx.x & 7;
    const int h = blockIdx.y, b = blockIdx.z;
    float acc = 0.0f;
    if (row < p.seqlen_q) {
        const char* o = static_cast<const char*>(p.o) +
                        ((long long)b * p.o_batch_stride + (long long)row * p.o_row_stride +
                         (long long)h * p.o_head_stride) * kElemBytes;
        const char* d = static_cast<const char*>(p.dout) +
                        ((long long)b * p.do_batch_stride + (long long)row * p.do_row_stride +
                         (long long)h * p.do_head_stride) * kElemBytes;
        for (int c = l8; c * kElemsPerChunk < p.head_dim; c += 8)
            acc += dot_chunk(*reinterpret_cast<const uint4*>(o + c * 16),
                             *reinterpret_cast<const uint4*>(d + c * 16));
    }
    acc += __shfl_xor_sync(0xffffffffu, acc, 1);
    acc += __shfl_xor_sync(0xffffffffu, acc, 2);
    acc += __shfl_xor_sync(0xffffffffu, acc, 4);
    const long long bh = (long long)b * p.nheads + h;
    if (l8 == 0 && row < p.seqlen_q_pad) {
        p.dpsum[bh * p.seqlen_q_pad + row] = acc;
#if FS_VARLEN
        const float l = row < p.seqlen_q ? p.lse[(long long)h * p.total_q + row] : neg_inf();
#else
        const float l = row < p.seqlen_q ? p.lse[bh * p.seqlen_q + row] : neg_inf();
#endif
        // -inf (no visible key) -> +inf, so every P of the row is exp2(-inf) = 0.
        p.lse_log2[bh * p.seqlen_q_pad + row] = (l == neg_inf()) ? pos_inf() : l * kLog2e;
    }
    const int r0 = blockIdx.x * 32;
    const int rows = min(32, p.seqlen_q_pad - r0);
    const int n4 = rows * kHeadDim / 4;
    for (int s = 0; s < p.nsplit; ++s) {
        float4* base = reinterpret_cast<float4*>(
            p.dq_accum + ((((long long)s * p.batch + b) * p.nheads + h) * p.seqlen_q_pad + r0) * kHeadDim);
        for (int i = threadIdx.x; i < n4; i += 256) base[i] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// ---- dq = softmax_scale * sum over slices of dq_accum, cast ---------------------------------------
// FS_DQ_FRAG = 0: the accumulator is row-major (rows of kHeadDim floats). FS_DQ_FRAG = 64 / 128:
// it holds flash_bwd_sm90.cu's fragment order, blocks of FS_DQ_FRAG rows (that file's header):
// element (row, col) of a block sits at frag_index below.
#ifndef FS_DQ_FRAG
#define FS_DQ_FRAG 0
#endif
namespace fb {
#if FS_DQ_FRAG
static_assert((FS_DQ_FRAG == 64 && (kHeadDim == 128 || kHeadDim == 256)) || (FS_DQ_FRAG == 128 && kHeadDim == 64),
              "the wgmma backward's dQ blocks: 64 x 128, 64 x 256 or 128 x 64");
// Offset in floats, within its block, of the even column `col` of block row `r` (col + 1 follows).
__device__ __forceinline__ int frag_index(int r, int col) {
    constexpr int kWgCols = FS_DQ_FRAG == 64 ? kHeadDim / 2 : kHeadDim;  // a warpgroup's dQ columns
    constexpr int kWgShift = kWgCols == 128 ? 7 : 6;
    const int wg = FS_DQ_FRAG == 64 ? col >> kWgShift : r >> 6;  // the warpgroup's half of the columns / rows
    const int c = FS_DQ_FRAG == 64 ? col & (kWgCols - 1) : col;
    const int w = wg * 4 + ((r & 63) >> 4);              // warp: 16 rows of its warpgroup's half
    const int lane = 4 * (r & 7) + ((c & 7) >> 1);       // g = row % 8, t = (col % 8) / 2
    return ((w * (kWgCols / 8) + (c >> 3)) * 32 + lane) * 4 + 2 * ((r >> 3) & 1);  // j = col / 8, h = row / 8 % 2
}
#endif
}  // namespace fb

// grid = (ceil(seqlen_q / 32), nheads, batch), block = 256: 8 threads per row, 4 columns per step.
extern "C" __global__ void __launch_bounds__(256) flash_bwd_dq_convert(FS_BWD_PARAMS) {
    using namespace fb;
    FS_BWD_SEQUENCE;
    const int row = blockIdx.x * 32 + (threadIdx.x >> 3);
    const int l8 = threadIdx.x & 7;
    const int h = blockIdx.y, b = blockIdx.z;
    if (row >= p.seqlen_q) return;
    const long long slice = (long long)p.batch * p.nheads * p.seqlen_q_pad * kHeadDim;
#if FS_DQ_FRAG
    const int rb = row % FS_DQ_FRAG;  // row within its block
    const float* acc = p.dq_accum + (((long long)b * p.nheads + h) * p.seqlen_q_pad + row - rb) * kHeadDim;
#else
    const float* acc = p.dq_accum + (((long long)b * p.nheads + h) * p.seqlen_q_pad + row) * kHeadDim;
#endif
    char* out = static_cast<char*>(p.dq) + ((long long)b * p.dq_batch_stride +
                                            (long long)row * p.dq_row_stride +
                                            (long long)h * p.dq_head_stride) * kElemBytes;
    for (int c = l8 * 4; c < p.head_dim; c += 32) {
#if FS_DQ_FRAG
        const int lo_i = frag_index(rb, c), hi_i = frag_index(rb, c + 2);
        float2 lo = *reinterpret_cast<const float2*>(acc + lo_i);
        float2 hi = *reinterpret_cast<const float2*>(acc + hi_i);
        for (int k = 1; k < p.nsplit; ++k) {  // the deterministic walk's slices, in order
            const float2 l = *reinterpret_cast<const float2*>(acc + k * slice + lo_i);
            const float2 u = *reinterpret_cast<const float2*>(acc + k * slice + hi_i);
            lo.x += l.x;
            lo.y += l.y;
            hi.x += u.x;
            hi.y += u.y;
        }
        float4 s = make_float4(lo.x, lo.y, hi.x, hi.y);
#else
        float4 s = *reinterpret_cast<const float4*>(acc + c);
        for (int k = 1; k < p.nsplit; ++k) {
            const float4 x = *reinterpret_cast<const float4*>(acc + k * slice + c);
            s.x += x.x;
            s.y += x.y;
            s.z += x.z;
            s.w += x.w;
        }
#endif
        const float sc = p.softmax_scale;
#if FS_DTYPE == 2
        *reinterpret_cast<float4*>(out + c * 4) = make_float4(s.x * sc, s.y * sc, s.z * sc, s.w * sc);
#else
        *reinterpret_cast<uint2*>(out + c * 2) = make_uint2(pack2<FS_DTYPE>(s.x * sc, s.y * sc), pack2<FS_DTYPE>(s.z * sc, s.w * sc));
#endif
    }
}

#if !FS_AUX_ONLY
#if !defined(FS_BLOCK_M) || !defined(FS_BLOCK_N) || !defined(FS_NWARPS) || !defined(FS_HAS_MASK) || \
    !defined(FS_HAS_SOFTCAP) || !defined(FS_PAD_HEADDIM)
#error "the main kernel's prelude must define FS_BLOCK_M, FS_BLOCK_N, FS_NWARPS, FS_HAS_MASK, FS_HAS_SOFTCAP, FS_PAD_HEADDIM"
#endif

namespace fb {

static constexpr int kBlockM = FS_BLOCK_M;
static constexpr int kBlockN = FS_BLOCK_N;
static constexpr int kNWarps = FS_NWARPS;
static constexpr int kNThreads = 32 * kNWarps;
static constexpr int kStages = FS_STAGES;
static constexpr int kDSplit = FS_DSPLIT;
static constexpr int kDOut = kHeadDim / kDSplit;   // dK / dV / dQ columns this CTA owns
static constexpr int kWK = kBlockN / kNWarps;       // keys per warp (16 or 32)
static constexpr int kWMT = kWK / 16;              // 16-key slabs per warp
static constexpr int kMT = kBlockM / 8;            // 8-query slabs of S^T per warp
static constexpr int kKSteps = kChunksPerRow / 2;  // k16 (16-bit) / k8 (fp32) steps over the head dim
static constexpr int kOT = kDOut / 8;              // 8-column slabs of dK / dV per warp
static constexpr int kRowBytes = kHeadDim * kElemBytes + 16;
static constexpr int kSRowBytes = kBlockM * kElemBytes + 16;  // a dS^T row (BLOCK_M queries)
static constexpr int kDqWM = (kBlockM / 16 < kNWarps) ? kBlockM / 16 : kNWarps;
static constexpr int kDqWD = kNWarps / kDqWM;
static constexpr int kDqRows = kBlockM / kDqWM;
static constexpr int kDqMT = kDqRows / 16;
static constexpr int kDqCols = kDOut / kDqWD;
static constexpr int kDqNT = kDqCols / 8;
static constexpr int kQBytes = kBlockM * kRowBytes;
static constexpr int kKOff = 0;
static constexpr int kVOff = kBlockN * kRowBytes;
static constexpr int kQOff = 2 * kBlockN * kRowBytes;               // stage s: Q at +2s*kQBytes, dO after
static constexpr int kSOff = kQOff + kStages * 2 * kQBytes;          // dS^T
static constexpr int kLOff = kSOff + kBlockN * kSRowBytes;           // stage s: lse_log2, then D
static constexpr int kSmemBytes = kLOff + kStages * 2 * kBlockM * 4;

static_assert(kBlockN == kWK * kNWarps && (kWK == 16 || kWK == 32), "each warp owns 16 or 32 keys");
static_assert(kBlockM % 16 == 0, "BLOCK_M must be a multiple of 16");
static_assert(kHeadDim % kDSplit == 0 && kDOut % 16 == 0, "DSPLIT slices must be multiples of 16");
static_assert(kDqWM * kDqWD == kNWarps && kDqRows % 16 == 0 && kDqCols % (kF32 ? 8 : 16) == 0,
              "dQ warp tiling");
static_assert(kStages == 1 || kStages == 2, "FS_STAGES is 1 or 2");

// cp.async ROWS x head-dim rows into padded shared memory; rows >= rows_valid and chunks beyond
// head_dim are zero-filled without reading.
template <int ROWS>
__device__ __forceinline__ void load_rows(u32 dst, const char* src, long long row_stride, int rows_valid,
                                          int head_dim) {
#pragma unroll 2
    for (int i = threadIdx.x; i < ROWS * kChunksPerRow; i += kNThreads) {
        const int r = i / kChunksPerRow, c = i % kChunksPerRow;
        const bool ok = r < rows_valid && (!FS_PAD_HEADDIM || c * kElemsPerChunk < head_dim);
        const char* s = src + (long long)r * row_stride * kElemBytes + c * 16;
        cp_async16(dst + r * kRowBytes + c * 16, ok ? s : src, ok);
    }
}

}  // namespace fb

// grid = (n_kv_blocks, or nsplit when deterministic; nheads_k * DSPLIT; batch),
// block = NWARPS * 32, dynamic smem = kSmemBytes.
extern "C" __global__ void __launch_bounds__(fb::kNThreads, FS_MIN_BLOCKS)
flash_bwd_kernel(const FlashBwdParams p) {
    using namespace fb;
    extern __shared__ __align__(128) unsigned char smem_raw[];
    const u32 s_base = smem_u32(smem_raw);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int hk = blockIdx.y / kDSplit, ds = blockIdx.y % kDSplit;
    const int b = blockIdx.z;
    const int group = p.nheads / p.nheads_k;
#if FS_VARLEN
    // This CTA's sequence (sequence_rows), kept in the 16 padding bytes of the K tile's
    // first shared-memory row, which nothing else reads or writes, and read there where used: the
    // 255-register tiles have no register to hold them across the loops. b still indexes the
    // scratch, laid out per sequence.
    int* const s_seq = reinterpret_cast<int*>(smem_raw + kKOff + kHeadDim * kElemBytes);
    {
        const SeqRows r = sequence_rows(p, b);
        if (tid == 0) {  // (written before the barrier below, read only after it)
            s_seq[0] = r.q0;
            s_seq[1] = r.len_q;
            s_seq[2] = r.k0;
            s_seq[3] = r.len_k;
        }
        __syncthreads();
    }
#define FB_SEQLEN_Q (s_seq[1])
#define FB_SEQLEN_K (s_seq[3])
#define FB_DIAG (s_seq[3] - s_seq[1])
#define FB_N_TILES ((s_seq[3] + kBlockN - 1) / kBlockN)
#define FB_QROWS(batch_stride, row_stride) ((long long)s_seq[0] * (row_stride))
#define FB_KROWS(batch_stride, row_stride) ((long long)s_seq[2] * (row_stride))
#else
    const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
    const int diag = seqlen_k - seqlen_q;  // bottom-right alignment: query i sits at key i + diag
    const int n_tiles = (seqlen_k + kBlockN - 1) / kBlockN;
#define FB_SEQLEN_Q seqlen_q
#define FB_SEQLEN_K seqlen_k
#define FB_DIAG diag
#define FB_N_TILES n_tiles
#define FB_QROWS(batch_stride, row_stride) (long long)b * (batch_stride)
#define FB_KROWS(batch_stride, row_stride) (long long)b * (batch_stride)
#endif
    const int col0 = ds * kDOut;            // first head-dim column this CTA writes

    const ScoreScale scale = score_scale<FS_HAS_SOFTCAP>(p.softmax_scale, p.softcap);
    const float scale_log2 = scale.log2;

    // ldmatrix lane offsets (bytes)
    // A, row-major [r][k] (K / V rows):  rows ln&15, chunk ln>>4
    const u32 a_lane = (lane & 15) * kRowBytes + (lane >> 4) * 16;
    // B from [n][k] (Q / dO for S^T, dP^T): rows (ln&7) + 8(ln>>4), chunk (ln>>3)&1
    const u32 b_lane = ((lane & 7) + ((lane >> 4) << 3)) * kRowBytes + ((lane >> 3) & 1) * 16;
    // B from [k][n], transposed (dO / Q for dV, dK; K for dQ): rows (ln&7) + 8((ln>>3)&1), chunk ln>>4
    const u32 bt_lane = ((lane & 7) + (((lane >> 3) & 1) << 3)) * kRowBytes + (lane >> 4) * 16;

    const u32 sK = s_base + kKOff, sV = s_base + kVOff, sS = s_base + kSOff;
    (void)bt_lane;
    (void)sS;

    for (int n = blockIdx.x; n < FB_N_TILES; n += gridDim.x) {
        const int n0 = n * kBlockN;
        const int keys = min(kBlockN, FB_SEQLEN_K - n0);
        int m_begin = 0, m_end = (FB_SEQLEN_Q + kBlockM - 1) / kBlockM;
#if FS_HAS_MASK
        if (p.window_right >= 0) {  // query i sees key j only if j <= i + diag + right
            const long long lo = (long long)n0 - FB_DIAG - p.window_right;
            if (lo > 0) m_begin = (int)min(lo / kBlockM, (long long)m_end);
        }
        if (p.window_left >= 0) {  // ... and j >= i + diag - left
            const long long hi = (long long)n0 + keys - 1 - FB_DIAG + p.window_left;
            m_end = hi < 0 ? 0 : (int)min(hi / kBlockM + 1, (long long)m_end);
        }
#endif
        const int nm = max(0, m_end - m_begin);
        const int n_iters = nm * group;

        float acc_dk[kWMT][kOT][4], acc_dv[kWMT][kOT][4];
        zero(acc_dk);
        zero(acc_dv);

        // Q / dO / lse_log2 / D of iteration `it` into stage `st`.
        auto load_q = [&](int it, int st) {
            const int hq = hk * group + it / nm;
            const int m0 = (m_begin + it % nm) * kBlockM;
            const long long qoff = FB_QROWS(p.q_batch_stride, p.q_row_stride) + (long long)m0 * p.q_row_stride +
                                   (long long)hq * p.q_head_stride;
            const long long dooff = FB_QROWS(p.do_batch_stride, p.do_row_stride) + (long long)m0 * p.do_row_stride +
                                    (long long)hq * p.do_head_stride;
            const u32 sQ = s_base + kQOff + st * 2 * kQBytes;
            load_rows<kBlockM>(sQ, static_cast<const char*>(p.q) + qoff * kElemBytes, p.q_row_stride,
                               FB_SEQLEN_Q - m0, p.head_dim);
            load_rows<kBlockM>(sQ + kQBytes, static_cast<const char*>(p.dout) + dooff * kElemBytes,
                               p.do_row_stride, FB_SEQLEN_Q - m0, p.head_dim);
            const long long roff = ((long long)b * p.nheads + hq) * p.seqlen_q_pad + m0;
            const u32 sL = s_base + kLOff + st * 2 * kBlockM * 4;
            if (tid < kBlockM / 4) cp_async16(sL + tid * 16, p.lse_log2 + roff + tid * 4, true);
            else if (tid < kBlockM / 2)
                cp_async16(sL + kBlockM * 4 + (tid - kBlockM / 4) * 16, p.dpsum + roff + (tid - kBlockM / 4) * 4,
                           true);
        };

        if (n_iters > 0) {
            const long long koff = FB_KROWS(p.k_batch_stride, p.k_row_stride) + (long long)n0 * p.k_row_stride +
                                   (long long)hk * p.k_head_stride;
            const long long voff = FB_KROWS(p.v_batch_stride, p.v_row_stride) + (long long)n0 * p.v_row_stride +
                                   (long long)hk * p.v_head_stride;
            load_rows<kBlockN>(sK, static_cast<const char*>(p.k) + koff * kElemBytes, p.k_row_stride, keys,
                               p.head_dim);
            load_rows<kBlockN>(sV, static_cast<const char*>(p.v) + voff * kElemBytes, p.v_row_stride, keys,
                               p.head_dim);
            load_q(0, 0);
            cp_async_commit();
        }

        for (int it = 0; it < n_iters; ++it) {
            const int st = kStages == 2 ? (it & 1) : 0;
            const int hq = hk * group + it / nm;
            const int m0 = (m_begin + it % nm) * kBlockM;
            const u32 sQ = s_base + kQOff + st * 2 * kQBytes;
            const u32 sdO = sQ + kQBytes;
            const float* sL = reinterpret_cast<const float*>(smem_raw + kLOff + st * 2 * kBlockM * 4);
            const float* sD = sL + kBlockM;

            cp_async_wait<0>();
            __syncthreads();  // this stage landed; every warp is done with the other stage and dS^T
            if (kStages == 2 && it + 1 < n_iters) {
                load_q(it + 1, st ^ 1);
                cp_async_commit();
            }

            // ---- S^T = K Q^T and dP^T = V dO^T (warp: 16 keys x BLOCK_M queries) ----
            float acc_s[kWMT][kMT][4], acc_dp[kWMT][kMT][4];
            zero(acc_s);
            zero(acc_dp);
#pragma unroll
            for (int kk = 0; kk < kKSteps; ++kk) {
                u32 a[kWMT][4], a2[kWMT][4];
#pragma unroll
                for (int km = 0; km < kWMT; ++km) {
                    ldsm_x4(a[km], sK + (warp * kWK + 16 * km) * kRowBytes + a_lane + kk * 32);
                    ldsm_x4(a2[km], sV + (warp * kWK + 16 * km) * kRowBytes + a_lane + kk * 32);
                }
#if FS_DTYPE == 2
                u32 ah[kWMT][4], al[kWMT][4], a2h[kWMT][4], a2l[kWMT][4];
#pragma unroll
                for (int km = 0; km < kWMT; ++km) {
                    split4(reinterpret_cast<const float(&)[4]>(a[km]), ah[km], al[km]);
                    split4(reinterpret_cast<const float(&)[4]>(a2[km]), a2h[km], a2l[km]);
                }
#endif
#pragma unroll
                for (int np = 0; np < kMT / 2; ++np) {
                    u32 bq[4], bo[4];
                    ldsm_x4(bq, sQ + b_lane + np * 16 * kRowBytes + kk * 32);
                    ldsm_x4(bo, sdO + b_lane + np * 16 * kRowBytes + kk * 32);
#pragma unroll
                    for (int km = 0; km < kWMT; ++km) {
#if FS_DTYPE == 2
                        mma_3xtf32_x2(acc_s[km][2 * np], acc_s[km][2 * np + 1], ah[km], al[km], bq);
                        mma_3xtf32_x2(acc_dp[km][2 * np], acc_dp[km][2 * np + 1], a2h[km], a2l[km], bo);
#else
                        mma16_x2<FS_DTYPE>(acc_s[km][2 * np], acc_s[km][2 * np + 1], a[km], bq);
                        mma16_x2<FS_DTYPE>(acc_dp[km][2 * np], acc_dp[km][2 * np + 1], a2[km], bo);
#endif
                    }
                }
            }

            // ---- P^T and dS^T (raw; softmax_scale is applied to dK at the end and dQ in convert) ----
#pragma unroll
            for (int j = 0; j < kMT; ++j) {
                const float2 l2 = *reinterpret_cast<const float2*>(sL + 8 * j + 2 * t);
                const float2 dd = *reinterpret_cast<const float2*>(sD + 8 * j + 2 * t);
#pragma unroll
                for (int x = 0; x < 4 * kWMT; ++x) {
                    const int km = x >> 2, e = x & 3;
                    const float lse2 = (e & 1) ? l2.y : l2.x;
                    const float dsum = (e & 1) ? dd.y : dd.x;
#if FS_HAS_SOFTCAP
                    const float th = tanh_softcap<FS_DTYPE>(acc_s[km][j][e] * scale.pre);
                    const float pr = ex2(fmaf(th, scale_log2, -lse2));
                    acc_dp[km][j][e] = pr * (acc_dp[km][j][e] - dsum) * (1.0f - th * th);
#else
                    const float pr = ex2(fmaf(acc_s[km][j][e], scale_log2, -lse2));
                    acc_dp[km][j][e] = pr * (acc_dp[km][j][e] - dsum);
#endif
                    acc_s[km][j][e] = pr;
                }
            }

            // ---- mask: only blocks crossing seqlen_k or a window edge ----
            bool need_mask = n0 + kBlockN > FB_SEQLEN_K;
#if FS_HAS_MASK
            if (p.window_right >= 0 && n0 + kBlockN - 1 - (m0 + FB_DIAG) > p.window_right) need_mask = true;
            if (p.window_left >= 0 && n0 - (m0 + kBlockM - 1 + FB_DIAG) < -p.window_left) need_mask = true;
#endif
            if (need_mask) {
                const int rel_lo = (FS_HAS_MASK && p.window_left >= 0) ? -p.window_left : -0x7fffffff;
                const int rel_hi = (FS_HAS_MASK && p.window_right >= 0) ? p.window_right : 0x7fffffff;
                const int key0 = n0 + warp * kWK + g;
                const int qd0 = m0 + 2 * t + FB_DIAG;
#pragma unroll
                for (int km = 0; km < kWMT; ++km)
#pragma unroll
                    for (int j = 0; j < kMT; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int key = key0 + 16 * km + 8 * (e >> 1);
                            const int rel = key - (qd0 + 8 * j + (e & 1));
                            if (key >= FB_SEQLEN_K || rel < rel_lo || rel > rel_hi) {
                                acc_s[km][j][e] = 0.0f;
                                acc_dp[km][j][e] = 0.0f;
                            }
                        }
            }

            // ---- dV += P^T dO, dK += dS^T Q (A operands from registers) ----
#if FS_DTYPE == 2
            {
                const float* sQf = reinterpret_cast<const float*>(smem_raw + (sQ - s_base));
                const float* sdOf = reinterpret_cast<const float*>(smem_raw + (sdO - s_base));
                constexpr int kRowF = kRowBytes / 4;
#pragma unroll
                for (int j = 0; j < kMT; ++j)
#pragma unroll
                    for (int km = 0; km < kWMT; ++km) {
                        u32 ph[4], pl[4], sh[4], sl[4];
                        const float pa[4] = {acc_s[km][j][0], acc_s[km][j][2], acc_s[km][j][1], acc_s[km][j][3]};
                        const float sa[4] = {acc_dp[km][j][0], acc_dp[km][j][2], acc_dp[km][j][1],
                                             acc_dp[km][j][3]};
                        split4(pa, ph, pl);
                        split4(sa, sh, sl);
                        const int r = (8 * j + 2 * t) * kRowF + col0 + g;
#pragma unroll
                        for (int o = 0; o < kOT; ++o) {
                            mma_3xtf32(acc_dv[km][o], ph, pl, sdOf[r + o * 8], sdOf[r + kRowF + o * 8]);
                            mma_3xtf32(acc_dk[km][o], sh, sl, sQf[r + o * 8], sQf[r + kRowF + o * 8]);
                        }
                    }
            }
#else
#pragma unroll
            for (int kk = 0; kk < kBlockM / 16; ++kk) {
                u32 pa[kWMT][4], sa[kWMT][4];
#pragma unroll
                for (int km = 0; km < kWMT; ++km) {
                    acc_to_a<FS_DTYPE>(pa[km], acc_s[km][2 * kk], acc_s[km][2 * kk + 1]);
                    acc_to_a<FS_DTYPE>(sa[km], acc_dp[km][2 * kk], acc_dp[km][2 * kk + 1]);
                }
#pragma unroll
                for (int op = 0; op < kOT / 2; ++op) {
                    u32 bo[4], bq[4];
                    const u32 off = bt_lane + kk * 16 * kRowBytes + col0 * kElemBytes + op * 32;
                    ldsm_x4_trans(bo, sdO + off);
                    ldsm_x4_trans(bq, sQ + off);
#pragma unroll
                    for (int km = 0; km < kWMT; ++km) {
                        mma16_x2<FS_DTYPE>(acc_dv[km][2 * op], acc_dv[km][2 * op + 1], pa[km], bo);
                        mma16_x2<FS_DTYPE>(acc_dk[km][2 * op], acc_dk[km][2 * op + 1], sa[km], bq);
                    }
                }
            }
#endif

            // ---- dS^T -> shared memory (rows = keys, BLOCK_M query columns) ----
            {
#pragma unroll
                for (int km = 0; km < kWMT; ++km) {
                    unsigned char* srow = smem_raw + kSOff + (warp * kWK + 16 * km + g) * kSRowBytes;
#pragma unroll
                    for (int j = 0; j < kMT; ++j)
#pragma unroll
                        for (int h = 0; h < 2; ++h) {
#if FS_DTYPE == 2
                            *reinterpret_cast<float2*>(srow + h * 8 * kSRowBytes + (8 * j + 2 * t) * 4) =
                                make_float2(acc_dp[km][j][2 * h], acc_dp[km][j][2 * h + 1]);
#else
                            *reinterpret_cast<u32*>(srow + h * 8 * kSRowBytes + (8 * j + 2 * t) * 2) =
                                pack2<FS_DTYPE>(acc_dp[km][j][2 * h], acc_dp[km][j][2 * h + 1]);
#endif
                        }
                }
            }
            __syncthreads();  // dS^T complete; every warp is done with this stage's Q / dO
            if (kStages == 1 && it + 1 < n_iters) {
                load_q(it + 1, 0);
                cp_async_commit();
            }

            // ---- dQ_partial = dS K (BLOCK_M x kDOut; warp tile kDqRows x kDqCols) ----
            {
                const int wm = warp / kDqWD, wd = warp % kDqWD;
                const int qrow0 = wm * kDqRows;
                const int dcol0 = col0 + wd * kDqCols;
                float acc_dq[kDqMT][kDqNT][4];
                zero(acc_dq);
#if FS_DTYPE == 2
                const float* sSf = reinterpret_cast<const float*>(smem_raw + kSOff);
                const float* sKf = reinterpret_cast<const float*>(smem_raw + kKOff);
                constexpr int kSRowF = kSRowBytes / 4, kRowF = kRowBytes / 4;
#pragma unroll 2
                for (int kk = 0; kk < kBlockN / 8; ++kk) {
                    u32 ah[kDqMT][4], al[kDqMT][4];
#pragma unroll
                    for (int mt = 0; mt < kDqMT; ++mt) {
                        const float* s0 = sSf + (8 * kk + t) * kSRowF + qrow0 + 16 * mt + g;
                        const float x[4] = {s0[0], s0[8], s0[4 * kSRowF], s0[4 * kSRowF + 8]};
                        split4(x, ah[mt], al[mt]);
                    }
                    const float* k0 = sKf + (8 * kk + t) * kRowF + dcol0 + g;
#pragma unroll
                    for (int o = 0; o < kDqNT; ++o) {
                        const float b0 = k0[o * 8], b1 = k0[4 * kRowF + o * 8];
#pragma unroll
                        for (int mt = 0; mt < kDqMT; ++mt) mma_3xtf32(acc_dq[mt][o], ah[mt], al[mt], b0, b1);
                    }
                }
#else
                // A = dS (queries x keys) read transposed from dS^T: rows (ln&7) + 8(ln>>4), chunk (ln>>3)&1
                const u32 at_lane = ((lane & 7) + ((lane >> 4) << 3)) * kSRowBytes + ((lane >> 3) & 1) * 16;
#pragma unroll
                for (int kk = 0; kk < kBlockN / 16; ++kk) {
                    u32 a[kDqMT][4];
#pragma unroll
                    for (int mt = 0; mt < kDqMT; ++mt)
                        ldsm_x4_trans(a[mt], sS + at_lane + kk * 16 * kSRowBytes + (qrow0 + 16 * mt) * kElemBytes);
#pragma unroll
                    for (int op = 0; op < kDqNT / 2; ++op) {
                        u32 bk[4];
                        ldsm_x4_trans(bk, sK + bt_lane + kk * 16 * kRowBytes + dcol0 * kElemBytes + op * 32);
#pragma unroll
                        for (int mt = 0; mt < kDqMT; ++mt) {
                            mma16_x2<FS_DTYPE>(acc_dq[mt][2 * op], acc_dq[mt][2 * op + 1], a[mt], bk);
                        }
                    }
                }
#endif
                const int split = p.deterministic ? (int)blockIdx.x : 0;
                float* accum = p.dq_accum +
                               ((((long long)split * p.batch + b) * p.nheads + hq) * p.seqlen_q_pad + m0 + qrow0 + g) *
                                   kHeadDim +
                               dcol0 + 2 * t;
#pragma unroll
                for (int mt = 0; mt < kDqMT; ++mt)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
#pragma unroll
                        for (int o = 0; o < kDqNT; ++o) {
                            float* ptr = accum + (16 * mt + 8 * h) * kHeadDim + 8 * o;
                            const float x = acc_dq[mt][o][2 * h], y = acc_dq[mt][o][2 * h + 1];
                            if (p.deterministic) {
                                float2 v = *reinterpret_cast<float2*>(ptr);
                                v.x += x;
                                v.y += y;
                                *reinterpret_cast<float2*>(ptr) = v;
                            } else {
#if FS_ARCH >= 90
                                red_add2(ptr, x, y);
#else
                                red_add(ptr, x);
                                red_add(ptr + 1, y);
#endif
                            }
                        }
            }
        }

        // ---- epilogue: dK * scale and dV staged in the K / V tiles, 16-byte stores ----
        __syncthreads();  // every warp is done reading K / V (and dS^T)
        {
            const float sc = p.softmax_scale;
#pragma unroll
            for (int km = 0; km < kWMT; ++km) {
                unsigned char* kr = smem_raw + kKOff + (warp * kWK + 16 * km + g) * kRowBytes;
                unsigned char* vr = smem_raw + kVOff + (warp * kWK + 16 * km + g) * kRowBytes;
#pragma unroll
                for (int o = 0; o < kOT; ++o)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int off = h * 8 * kRowBytes + (8 * o + 2 * t) * kElemBytes;
                        const float* dk2 = acc_dk[km][o];
                        const float* dv2 = acc_dv[km][o];
#if FS_DTYPE == 2
                        *reinterpret_cast<float2*>(kr + off) = make_float2(dk2[2 * h] * sc, dk2[2 * h + 1] * sc);
                        *reinterpret_cast<float2*>(vr + off) = make_float2(dv2[2 * h], dv2[2 * h + 1]);
#else
                        *reinterpret_cast<u32*>(kr + off) = pack2<FS_DTYPE>(dk2[2 * h] * sc, dk2[2 * h + 1] * sc);
                        *reinterpret_cast<u32*>(vr + off) = pack2<FS_DTYPE>(dv2[2 * h], dv2[2 * h + 1]);
#endif
                    }
            }
        }
        __syncthreads();
        {
            constexpr int kCpr = kDOut * kElemBytes / 16;  // chunks per output row slice
            char* dk = static_cast<char*>(p.dk) + (FB_KROWS(p.dk_batch_stride, p.dk_row_stride) + (long long)n0 * p.dk_row_stride +
                                                  (long long)hk * p.dk_head_stride + col0) * kElemBytes;
            char* dv = static_cast<char*>(p.dv) + (FB_KROWS(p.dv_batch_stride, p.dv_row_stride) + (long long)n0 * p.dv_row_stride +
                                                  (long long)hk * p.dv_head_stride + col0) * kElemBytes;
            for (int i = tid; i < kBlockN * kCpr; i += kNThreads) {
                const int r = i / kCpr, c = i % kCpr;
                if (r < keys && col0 + c * kElemsPerChunk < p.head_dim) {
                    *reinterpret_cast<uint4*>(dk + (long long)r * p.dk_row_stride * kElemBytes + c * 16) =
                        *reinterpret_cast<const uint4*>(smem_raw + kKOff + r * kRowBytes + c * 16);
                    *reinterpret_cast<uint4*>(dv + (long long)r * p.dv_row_stride * kElemBytes + c * 16) =
                        *reinterpret_cast<const uint4*>(smem_raw + kVOff + r * kRowBytes + c * 16);
                }
            }
        }
        __syncthreads();  // the staging tiles are free before the next kv block loads into them
    }
}
#undef FB_SEQLEN_Q
#undef FB_SEQLEN_K
#undef FB_DIAG
#undef FB_N_TILES
#undef FB_QROWS
#undef FB_KROWS
#endif  // !FS_AUX_ONLY
