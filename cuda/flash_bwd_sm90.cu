// flash_bwd_sm90.cu: FlashAttention backward main kernel for Hopper (sm_90a) on warpgroup MMA
// (wgmma). Same algorithm, parameters and scratch as flash_bwd.cu's flash_bwd_kernel (whose
// flash_bwd_preprocess and flash_bwd_dq_convert passes run before and after this one; the convert
// built with FS_DQ_FRAG, since this kernel leaves the dQ accumulator in fragment order, below):
//
//   one CTA = one block of 128 keys of one kv head (grid x = kv block, y = kv head, z = batch);
//   it loops over every q head of the kv head's GQA group and every q block of kBlockM queries that
//   sees one of its keys, and per (q head, q block):
//       S^T  = K Q^T      wgmma m64 n{kBlockM} k16, A = K, B = Q, both shared memory, K-major
//       dP^T = V dO^T     same with V and dO
//       P^T  = exp2(S^T * scale*log2e - lse_log2),  dS^T = P^T (dP^T - D)    (registers)
//       dV  += P^T dO     wgmma m64 n{hd} k16, A = P^T from registers, B = dO MN-major (transposed)
//       dK  += dS^T Q     same with dS^T and Q
//       dS^T -> shared memory (swizzled);  dQ_partial = dS K   wgmma m64n64k16, A = dS read
//                         MN-major from the dS^T tile (transposed A), B = K MN-major
//       dQ_partial -> shared memory in fragment order -> one bulk reduce-add (the TMA unit) into
//                     the fp32 accumulator's block, issued after the next iteration's first barrier
//   and writes dK (times softmax_scale) and dV once, summed over the group, through shared memory.
//
// Threads: 256 = two warpgroups. Warpgroup wg owns keys [64 wg, 64 wg + 64) of the block for
// S^T, dP^T, P^T, dS^T and the dK / dV accumulators (64 keys x hd, in registers: 2 x hd / 2 floats
// per thread). dQ (kBlockM x hd per iteration) is split between the warpgroups:
//   hd128 (kBlockM 64):  warpgroup wg computes dQ columns [64 wg, 64 wg + 64) over all 128 keys;
//   hd64  (kBlockM 128): warpgroup wg computes dQ rows    [64 wg, 64 wg + 64) over all 128 keys;
// so both are one m64n64 output per warpgroup, 8 k16 steps.
// Register budget per thread (hd128): dK 64 + dV 64 + S^T 32 + dP^T 32 floats at the peak
// (hd64: 32 + 32 + 64 + 64); dQ's 32 floats live only once S^T / dP^T are packed.
//
// Shared memory (base aligned to 1024 bytes; every tile in the 128-byte swizzle of
// common/wgmma.cuh: hd / 64 column blocks of R rows x 128 bytes, blocks 1024-byte aligned):
//   K (128 rows) | V (128 rows) | 2 stages x [Q (kBlockM rows) | dO (kBlockM rows)]
//   | dS^T (128 key rows x kBlockM query columns: kBlockM / 64 column blocks)
//   | 2 stages x [lse_log2 (kBlockM floats) | D (kBlockM floats)]
//   | 2 stages x dQ (kBlockM x hd floats)
// hd128: 32 + 32 + 64 + 16 + 1 + 64 KB = 209 KB; hd64: 16 + 16 + 64 + 32 + 2 + 64 KB = 194 KB
// (+1 KB align).
//
// dQ in fragment order. The kBlockM x hd fp32 block of one (q head, q block) is contiguous in the
// accumulator (rows of hd floats, seqlen_q_pad rows a head), so one bulk reduce-add moves it. Its
// layout there and in shared memory is the dQ wgmma's fragment order, not row-major: warp w (0..7)
// stores acc_dq[4 j .. 4 j + 3] as the float4 at ((w 8 + j) 32 + lane) 4 floats, so each store
// instruction writes 512 contiguous bytes (no bank conflict). acc_dq[4 j + 2 h + e] of lane
// 4 g + t of warp w (warpgroup wg = w / 4) is element (row, col) of the block with
//   row = (kBlockM == 128 ? 64 wg : 0) + 16 (w % 4) + 8 h + g,
//   col = (kBlockM == 64 ? 64 wg : 0) + 8 j + 2 t + e       (the dQ split above).
// flash_bwd.cu's convert pass reads this order when built with
// FS_DQ_FRAG = kBlockM (attention_bwd.rs asks for it with this kernel). Why not red.global.add
// per thread, as before 2026-11-28: 16 RED.64 a thread an iteration kept the LSU queues full and
// the warps waiting (measured: the same kernel without them 346 -> 550 TFLOP/s, hd128 s4096).
// Q / dO / lse_log2 / D are double-buffered: iteration it issues it + 1's loads into the other
// stage after the barrier that ends iteration it - 1 (whose wgmmas all completed), right behind
// its own S^T / dP^T wgmmas. TMA build (FS_BWD_TMA, the default): thread 0 issues one TMA box a
// 64-column block of Q and of dO and two bulk copies (lse_log2, D), all on stage st's mbarrier
// (expect_tx of the whole boxes; rows past seqlen_q arrive as zeros), and every thread waits on
// it (parity = (it / 2) % 2) at the loop top; measured +8-11% over the cp.async build, where
// every thread issues 8 cp.async and their address math (2026-11-28). The cp.async build runs
// where the driver refuses a map (FLASHSCAN_SM90_BWD_TMA=0 forces it).
//
// Synchronisation per iteration (every wgmma batch: wgmma.fence, issue, commit_group, and
// wait_group before registers or shared memory they touch are reused):
//   cp.async.wait_group 0 (TMA build: + the stage's mbarrier wait); fence.proxy.async;
//   __syncthreads                                                 stage `st` (and K, V) visible
//     to the tensor cores; every thread is done with iteration it - 1 (its dQ wgmma read dS^T and
//     K, its dV / dK wgmma read the other stage's Q / dO, all waited for)
//   S^T group, dP^T group; issue loads of it + 1 into stage st ^ 1 (under the wgmmas)
//   wait_group 1 -> S^T; P^T; mask P^T; dV group (register A = packed P^T)
//   wait_group 1 -> dP^T (dV may run on); dS^T; st.shared dS^T (before the dK issue: pa / sa
//   are not touched at all, not even read, between their wgmma and its wait, PTX ISA
//   wgmma.wait_group); dK group (register A = packed dS^T)
//   fence.proxy.async; __syncthreads                              dS^T visible to both warpgroups'
//     tensor cores
//   dQ group; wait_group 0 (dQ, dV, dK done); dQ -> shared memory (fragment order)
// Thread 0 issues the bulk reduce-add of iteration it - 1's dQ (stage (it - 1) % 2) right after
// iteration it's first barrier (every thread's dQ stores and proxy fence precede it) and, before
// iteration it's second barrier, waits until the reduce of it - 2 has read stage it % 2: the dQ
// stores at the end of iteration it come after that barrier. Two stages let a reduce read for a
// whole iteration while the next one runs. The last iteration's block goes after the loop.
// The descriptor / fence review for a first GPU run is in ARCHITECTURE.md ("Hopper backward").
//
// Head dim 256: the column-split form (kWide; 2026-12-02). dK + dV of 64 keys x 256 columns in one
// warpgroup would be 256 fp32 registers a thread, so a CTA takes 64 keys (kBlockN 64, kBlockM 64)
// and both warpgroups share them:
//   S^T, dP^T   warpgroup wg over queries [32 wg, 32 wg + 32): m64n32k16, 16 k-steps each, A = all
//               64 K / V rows, B = its 32 Q / dO rows (K-major both); P^T and dS^T of those
//               queries go to shared memory (16-bit, the dS^T tile's shape: 64 key rows x 64
//               query columns, one column block each; P^T at kPOff) and a barrier publishes them
//   dV, dK      warpgroup wg owns columns [128 wg, 128 wg + 128): m64n128k16, 4 k-steps over the
//               queries, A = P^T / dS^T from shared memory (K-major), B = dO / Q MN-major from
//               column block 2 wg (64 + 64 accumulator floats a thread)
//   dQ          the same 128 columns in two m64n64k16 halves of 4 k-steps (A = dS from the dS^T
//               tile, transposed; B = K MN-major from column block 2 wg + half), one live at a
//               time (32 floats); each half added straight from registers by 8
//               red.global.add.v4.f32 a thread into the fragment order (float4 j = 8 half + n8
//               slab of warp w at ((w 16 + j) 32 + lane) 4; element (row, col) with row =
//               16 (w % 4) + 8 h + g, col = 128 wg + 8 j + 2 t + e; flash_bwd.cu's frag_index)
// Shared memory: K, V 32 KB each | 2 x (Q, dO) 32 KB each | dS^T, P^T 8 KB each | lse / D 1 KB:
// 210 KB, no room for a dQ stage (64 KB), hence the REDs (measured 2026-11-28 at hd128: ~10% below
// the bulk reduce, far above the 2-byte REDs). Per iteration: loop-top barrier, S^T + dP^T
// groups and the next stage's loads, wait 1 -> P^T (mask) -> shared, wait 0 -> dS^T -> shared,
// fence + barrier, dQ half 0 group, dV + dK group, wait 1 -> REDs of half 0, dQ half 1 group,
// wait 0 -> REDs of half 1. H200 (benches/results/2026-12-02-h200-attention-bwd-hd256/): backward
// 340-373 TFLOP/s (2.0x the mma.sync kernel), fwd+bwd 0.97-1.05x cuDNN; ncu: shared-memory reads
// (the n32 S^T / dP^T products) at ~63% of L1 throughput, 2 warps a scheduler, 77% of cycles
// with none eligible. One m64n128 dQ batch instead of halves measured 0.4-1.7% slower.
//
// Covered (the launcher falls back to flash_bwd.cu otherwise): sm_90a, fp16 / bf16, head dim
// exactly 64, 128 or 256, dense or packed sequences (FS_VARLEN, below), causal / sliding windows
// (FS_HAS_MASK), seqlen_q != seqlen_k (bottom-right), GQA / MQA, softcap (FS_HAS_SOFTCAP, below),
// deterministic or not (below).
//
// Deterministic mode (FS_DETERMINISTIC = 1, flash_attn_func(deterministic=True)): the dQ adds of
// different kv blocks into one accumulator block must come in a fixed order. The launcher splits
// the kv blocks into ceil(n_kv / nsplit) launches on one stream; launch i (p.kv_block0 = i nsplit)
// runs CTA x on kv block i nsplit + x, which adds into its own slice x of an nsplit-slice
// accumulator. Within a launch no two CTAs share a slice, a CTA's bulk reduces (or hd256's REDs)
// hit distinct addresses, and launches are ordered by the stream: every element is summed in kv
// block order, and the convert pass sums the slices in slice order. The kernel is the plain one
// but for its block index and the slice in its accumulator rows (FB90_BH). A walk over the blocks
// inside one launch (the mma.sync kernel's form) was tried first: inlined into that loop, the
// 255-register builds spilled 8-64 bytes (NVRTC 13.0); as a real call, ptxas serialised the wgmmas.
//
// Varlen (FS_VARLEN = 1, flash_attn_varlen_func): q / dout are (total_q, nheads, hd), k / v / dk /
// dv (total_k, nheads_k, hd), batch strides 0; each CTA reads its sequence's rows once
// (fs::sequence_rows) and works on it as a dense problem of batch 1. The scratch (lse_log2, D,
// the dQ accumulator) keeps the dense layout, seqlen_q_pad rows a sequence (flash_bwd.cu's
// preprocess / convert under FS_VARLEN), so the loop is unchanged; the grid covers max_seqlen_k
// and CTAs past their sequence's keys return at once. The TMA build's q / dout maps span the
// packed rows (batch 1): a Q / dO box past the sequence's end holds the next sequence's rows
// (zeros past total_q), which contribute nothing: their lse_log2 is +inf and D 0 in this
// sequence's scratch, so P^T = dS^T = 0 there (finite inputs assumed, as the TMA forward's
// varlen K / V boxes do).
//
// The prelude defines FS_HEAD_DIM (64, 128 or 256), FS_DTYPE (0 fp16, 1 bf16), FS_HAS_MASK, FS_ARCH (90);
// FS_HAS_SOFTCAP = 1 only in softcap variants.

#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/flash_params.cuh"
#include "common/math.cuh"
#include "common/softcap.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"

#if !defined(FS_HEAD_DIM) || !defined(FS_DTYPE) || !defined(FS_HAS_MASK) || !defined(FS_ARCH)
#error "the prelude must define FS_HEAD_DIM, FS_DTYPE, FS_HAS_MASK and FS_ARCH"
#endif
#ifndef FS_BWD_TMA
#define FS_BWD_TMA 0
#endif
#ifndef FS_HAS_SOFTCAP
#define FS_HAS_SOFTCAP 0
#endif
#ifndef FS_DETERMINISTIC
#define FS_DETERMINISTIC 0
#endif
// Softcap (FS_HAS_SOFTCAP): S^T's registers hold th = tanh(scale / cap * q.k) (common/softcap.cuh,
// the forward's scores bit for bit) instead of P^T; P^T = exp2(th cap log2e - lse_log2) is formed
// where it is packed or stored and again for dS^T = P^T (dP^T - D) (1 - th^2), so no second array
// of registers lives; masked elements hold th = -inf (P^T = 0, and max(1 - th^2, 0) = 0 keeps
// dS^T a clean 0).
#if FS_HAS_SOFTCAP
#define FB90_MASKED neg_inf()
#else
#define FB90_MASKED 0.0f
#endif

// FS_BWD_TMA = 1: the kernel parameter carries tensor maps of q and dout (4D: head dim, seqlen,
// heads, batch; boxes of 64 columns x kBlockM rows, 128-byte swizzle: the tiles' layout), and
// thread 0 loads each iteration's Q / dO tiles by TMA and its lse_log2 / D rows by bulk copy,
// completing on one mbarrier per stage, instead of every thread issuing cp.async.
struct FlashBwdTmaParams {
    fs::TensorMap tm_q, tm_do;
    FlashBwdParams p;
};


namespace fb90 {

using namespace fs;

static constexpr int kHeadDim = FS_HEAD_DIM;
static constexpr bool kWide = kHeadDim == 256;               // the column-split form (header)
static constexpr int kBlockN = kWide ? 64 : 128;             // keys per CTA
static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;    // queries per iteration
static constexpr int kThreads = 256;                         // two warpgroups
static constexpr int kChunksPerRow = kHeadDim / 8;           // 16-byte chunks per row
static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
static constexpr int kKVColBlock = kBlockN * 128;            // one 64-column block of K / V
static constexpr int kQColBlock = kBlockM * 128;             // one 64-column block of Q / dO
static constexpr int kKVTile = kBlockN * kHeadDim * 2;
static constexpr int kQTile = kBlockM * kHeadDim * 2;
static constexpr int kSTile = kBlockN * kBlockM * 2;         // dS^T: kBlockN key rows x kBlockM queries
static constexpr int kKOff = 0;
static constexpr int kVOff = kKVTile;
static constexpr int kQOff = 2 * kKVTile;                    // stage s: Q at + 2 s kQTile, dO after
static constexpr int kSOff = kQOff + 4 * kQTile;
static constexpr int kPOff = kSOff + kSTile;                 // hd256: P^T, shaped as dS^T
static constexpr int kLOff = kSOff + (kWide ? 2 : 1) * kSTile;  // stage s: lse_log2, then D
static constexpr int kDQOff = kLOff + 2 * 2 * kBlockM * 4;  // dQ blocks, fp32, fragment order
static constexpr int kDQBytes = kBlockM * kHeadDim * 4;
// iteration it stores into stage it % 2 while it - 1's reduce reads; hd256 adds its dQ from
// registers (no room for a stage: header)
static constexpr int kDQStages = kWide ? 0 : 2;
static constexpr int kBarOff = kDQOff + kDQStages * kDQBytes;  // 2 mbarriers (TMA build), 16 bytes
static constexpr int kSmemBytes = kBarOff + 16 + 1024;  // + 1 KB base alignment
static constexpr int kSCols = kWide ? kBlockM / 2 : kBlockM;  // queries of S^T / dP^T a warpgroup computes
static constexpr int kSRegs = kSCols / 2;                    // S^T / dP^T floats per thread
static constexpr int kDCols = kWide ? kHeadDim / 2 : kHeadDim;  // dK / dV columns a warpgroup owns
static constexpr int kDRegs = kDCols / 2;                    // dK / dV floats per thread
static constexpr int kDQRegs = kBlockM * kHeadDim / kThreads;  // dQ floats per thread
static constexpr int kPSteps = kBlockM / 16;                 // k16 steps of dV / dK (queries)

static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim tile is 64, 128 or 256");
static_assert(FS_DTYPE == 0 || FS_DTYPE == 1, "16-bit inputs only");
static_assert(FS_ARCH == 90, "wgmma needs sm_90a");
static_assert(kKVTile % 1024 == 0 && kQTile % 1024 == 0 && kSTile % 1024 == 0, "swizzle atoms");
static_assert(kBlockM % kRowsPerPass == 0 && kBlockN % kRowsPerPass == 0, "load passes");
static_assert(kDQOff % 16 == 0 && kDQBytes == kThreads * kDQRegs * 4, "dQ: 16-byte aligned, kDQRegs a thread");
static_assert(kSmemBytes <= 227 * 1024, "one CTA an SM");

#if FS_DTYPE == 0
#define FB90_WGMMA_TYPES ".f32.f16.f16"
#else
#define FB90_WGMMA_TYPES ".f32.bf16.bf16"
#endif

// dQ_partial (+)= dS K: m64n64k16, A = dS MN-major (transposed, read from the dS^T tile), B = K
// MN-major (transposed). The two trailing immediates of wgmma are imm-trans-a and imm-trans-b.
__device__ __forceinline__ void wgmma_ss_n64_tt(float (&d)[32], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16" FB90_WGMMA_TYPES
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "
        "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// hd256, S^T / dP^T of a warpgroup's 32 queries: m64n32k16, A and B K-major.
__device__ __forceinline__ void wgmma_ss_n32(float (&d)[16], u64 desc_a, u64 desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n32k16" FB90_WGMMA_TYPES
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

#undef FB90_WGMMA_TYPES

// Keeps packed A fragments alive (and in place) until the wgmma reading them has been waited for.
template <int N>
__device__ __forceinline__ void reg_fence_u(u32 (&a)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+r"(a[i][e])::"memory");
}

// cp.async ROWS rows of hd elements from src (row stride in elements) into the swizzled layout;
// rows >= rows_valid are zero-filled without reading global memory.
template <int ROWS>
__device__ __forceinline__ void load_tile(u32 dst, const char* src, long long row_stride, int rows_valid) {
    const int c = threadIdx.x % kChunksPerRow;
    const int r0 = threadIdx.x / kChunksPerRow;
#pragma unroll
    for (int i = 0; i < ROWS / kRowsPerPass; ++i) {
        const int row = r0 + i * kRowsPerPass;
        const bool valid = row < rows_valid;
        const char* s = src + (long long)row * row_stride * 2 + c * 16;
        cp_async16(dst + swz_offset(ROWS, row, c * 8), valid ? s : src, valid);
    }
}

}  // namespace fb90

// grid = (ceil(seqlen_k / kBlockN), nheads_k, batch) (deterministic: (nsplit, nheads_k, batch), one
// launch of the walk), block = 256, dynamic smem = fb90::kSmemBytes.
#if FS_BWD_TMA
extern "C" __global__ void __launch_bounds__(fb90::kThreads, 1)
    flash_bwd_sm90_kernel(const __grid_constant__ FlashBwdTmaParams P) {
    const FlashBwdParams& p = P.p;
#else
extern "C" __global__ void __launch_bounds__(fb90::kThreads, 1) flash_bwd_sm90_kernel(const FlashBwdParams p) {
#endif
    using namespace fb90;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw_base = smem_u32(smem_raw);
    const u32 s_base = (raw_base + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
    unsigned char* smem = smem_raw + (s_base - raw_base);
    const u32 sK = s_base + kKOff, sV = s_base + kVOff, sS = s_base + kSOff;

    const int tid = threadIdx.x;
    const int wg = tid >> 7;                 // warpgroup: keys [64 wg, 64 wg + 64)
    const int warp_in_wg = (tid >> 5) & 3;
    const int lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;

#if FS_DETERMINISTIC
    // launch i of the walk (header: "Deterministic mode") takes kv blocks i nsplit + x
    const int n_block = p.kv_block0 + blockIdx.x;
    // dQ rows of (batch, q head) in this CTA's accumulator slice x: (slice, batch, head, row)
// (hq unparenthesised: the sum associates as the plain build's always did)
#define FB90_BH(hq) (((long long)blockIdx.x * p.batch + b) * p.nheads + hq)
#else
    const int n_block = blockIdx.x;
#define FB90_BH(hq) ((long long)b * p.nheads + hq)
#endif
    const int hk = blockIdx.y, b = blockIdx.z;
    const int group = p.nheads / p.nheads_k;
#if FS_VARLEN
    // batch strides are 0: the sequence's first rows carry the offset (32-bit: < total_q / k).
    // The loop re-reads its query rows (L1 hits) where it issues a Q / dO load: the 255-register
    // builds have none to hold them across it.
    const fs::SeqRows seq = fs::sequence_rows(p, b);
    const int seqlen_q = seq.len_q, seqlen_k = seq.len_k;
#define FB90_Q_ROWS fs::sequence_rows(p, b)
#define FB90_K_ROW0 fs::clamp_row(p.cu_seqlens_k[b], p.total_k)
#else
    const int seqlen_q = p.seqlen_q, seqlen_k = p.seqlen_k;
#define FB90_K_ROW0 0
#endif
    const int diag = seqlen_k - seqlen_q;    // bottom-right alignment: query i sits at key i + diag
    const int n0 = n_block * kBlockN;
    const int keys = min(kBlockN, seqlen_k - n0);
#if FS_VARLEN || FS_DETERMINISTIC
    // the grid covers max_seqlen_k (varlen) or the walk's last launch runs past the blocks
    if (keys <= 0) return;
#endif

    // ---- q blocks that see at least one key of this block ----
    int m_begin = 0, m_end = (seqlen_q + kBlockM - 1) / kBlockM;
#if FS_HAS_MASK
    if (p.window_right >= 0) {  // query i sees key j only if j <= i + diag + right
        const long long lo = (long long)n0 - diag - p.window_right;
        if (lo > 0) m_begin = (int)min(lo / kBlockM, (long long)m_end);
    }
    if (p.window_left >= 0) {  // ... and j >= i + diag - left
        const long long hi = (long long)n0 + keys - 1 - diag + p.window_left;
        m_end = hi < 0 ? 0 : (int)min(hi / kBlockM + 1, (long long)m_end);
    }
#endif
    const int nm = max(0, m_end - m_begin);
    const int n_iters = nm * group;

    const char* k_ptr = static_cast<const char*>(p.k) +
                        ((long long)b * p.k_batch_stride + (long long)(FB90_K_ROW0 + n0) * p.k_row_stride +
                         (long long)hk * p.k_head_stride) * 2;
    const char* v_ptr = static_cast<const char*>(p.v) +
                        ((long long)b * p.v_batch_stride + (long long)(FB90_K_ROW0 + n0) * p.v_row_stride +
                         (long long)hk * p.v_head_stride) * 2;

    // Q / dO / lse_log2 / D of iteration `it` into stage `st` (TMA build: thread 0 only).
    auto load_q = [&](int it, int st) {
        const int hq = hk * group + it / nm;
        const int m0 = (m_begin + it % nm) * kBlockM;
#if FS_BWD_TMA
        const u32 bar = s_base + kBarOff + st * 8;
        const u32 sQ = s_base + kQOff + st * 2 * kQTile;
        const u32 sL = s_base + kLOff + st * 2 * kBlockM * 4;
        const long long roff = ((long long)b * p.nheads + hq) * p.seqlen_q_pad + m0;
        // whole boxes count, rows past seqlen_q included (TMA fills them with zeros; varlen: the
        // next sequence's rows, whose P^T is 0 (lse_log2 = +inf, D = 0 in this sequence's scratch))
        mbar_arrive_expect_tx(bar, 2 * kQTile + 2 * kBlockM * 4);
#if FS_VARLEN
        const int row = FB90_Q_ROWS.q0 + m0, batch = 0;  // maps over the packed rows, batch 1
#else
        const int row = m0, batch = b;
#endif
#pragma unroll
        for (int cb = 0; cb < kHeadDim / 64; ++cb) {
            tma_load_4d(sQ + cb * kQColBlock, &P.tm_q, cb * 64, row, hq, batch, bar);
            tma_load_4d(sQ + kQTile + cb * kQColBlock, &P.tm_do, cb * 64, row, hq, batch, bar);
        }
        bulk_load(sL, p.lse_log2 + roff, kBlockM * 4, bar);
        bulk_load(sL + kBlockM * 4, p.dpsum + roff, kBlockM * 4, bar);
#else
#if FS_VARLEN
        const fs::SeqRows qs = FB90_Q_ROWS;
        const int q_row0 = qs.q0, q_rows = qs.len_q;
#else
        constexpr int q_row0 = 0;
        const int q_rows = seqlen_q;
#endif
        const char* q_ptr = static_cast<const char*>(p.q) +
                            ((long long)b * p.q_batch_stride + (long long)(q_row0 + m0) * p.q_row_stride +
                             (long long)hq * p.q_head_stride) * 2;
        const char* do_ptr = static_cast<const char*>(p.dout) +
                             ((long long)b * p.do_batch_stride + (long long)(q_row0 + m0) * p.do_row_stride +
                              (long long)hq * p.do_head_stride) * 2;
        const u32 sQ = s_base + kQOff + st * 2 * kQTile;
        load_tile<kBlockM>(sQ, q_ptr, p.q_row_stride, q_rows - m0);
        load_tile<kBlockM>(sQ + kQTile, do_ptr, p.do_row_stride, q_rows - m0);
        const long long roff = ((long long)b * p.nheads + hq) * p.seqlen_q_pad + m0;
        const u32 sL = s_base + kLOff + st * 2 * kBlockM * 4;
        // rows m0 .. m0 + kBlockM - 1 < seqlen_q_pad (a multiple of kBlockM): always in the scratch
        if (tid < kBlockM / 4) cp_async16(sL + tid * 16, p.lse_log2 + roff + tid * 4, true);
        else if (tid < kBlockM / 2)
            cp_async16(sL + kBlockM * 4 + (tid - kBlockM / 4) * 16, p.dpsum + roff + (tid - kBlockM / 4) * 4, true);
#endif
    };

    load_tile<kBlockN>(sK, k_ptr, p.k_row_stride, keys);
    load_tile<kBlockN>(sV, v_ptr, p.v_row_stride, keys);
#if FS_BWD_TMA
    if (tid == 0) {
        tma_prefetch_map(&P.tm_q);
        tma_prefetch_map(&P.tm_do);
        mbar_init(s_base + kBarOff, 1);
        mbar_init(s_base + kBarOff + 8, 1);
        mbar_init_fence();
        if (n_iters > 0) load_q(0, 0);
    }
    __syncthreads();  // the barriers are initialised before any thread waits on them
#else
    if (n_iters > 0) load_q(0, 0);
#endif
    cp_async_commit();

    float acc_dk[kDRegs], acc_dv[kDRegs];
#pragma unroll
    for (int i = 0; i < kDRegs; ++i) {
        acc_dk[i] = 0.0f;
        acc_dv[i] = 0.0f;
    }

#if FS_HAS_SOFTCAP
    const ScoreScale sc = score_scale<true>(p.softmax_scale, p.softcap);
    const float scale_log2 = sc.log2;  // cap log2e: P = exp2(th scale_log2 - lse_log2)
#else
    const float scale_log2 = p.softmax_scale * kLog2e;
#endif
#if FS_HEAD_DIM == 256
    // ---- hd256: the column-split form (header) ----
    const int key_row = warp_in_wg * 16 + g;  // this thread's first key row (S^T, P^T, dS^T)
    const int q_col0 = wg * kSCols;           // this warpgroup's 32 queries of S^T / dP^T
    const int d_col0 = wg * kDCols;           // ... and 128 columns of dK / dV / dQ
    const u32 sP = s_base + kPOff;
    const u64 d_k = wgmma_desc(sK, 16, 1024), d_v = wgmma_desc(sV, 16, 1024);
    // dV / dK: A = P^T / dS^T K-major (key rows, query columns: one 64-column block)
    const u64 d_p = wgmma_desc(sP, 16, 1024), d_s = wgmma_desc(sS, 16, 1024);
    // dQ: A = dS read MN-major from the dS^T tile, B = K MN-major from column block 2 wg
    const u64 d_dq_a = wgmma_desc(sS, kBlockN * 128, 1024);
    const u64 d_dq_b = wgmma_desc(sK + 2 * wg * kKVColBlock, kKVColBlock, 1024);

    for (int it = 0; it < n_iters; ++it) {
        const int st = it & 1;
        const int hq = hk * group + it / nm;
        const int m0 = (m_begin + it % nm) * kBlockM;
        const u32 sQ = s_base + kQOff + st * 2 * kQTile;
        const u32 sdO = sQ + kQTile;
        const float* sL = reinterpret_cast<const float*>(smem + kLOff + st * 2 * kBlockM * 4);
        const float* sD = sL + kBlockM;

        cp_async_wait<0>();   // stage st (and on it == 0 K, V) landed for this thread
#if FS_BWD_TMA
        mbar_wait(s_base + kBarOff + st * 8, (it >> 1) & 1);  // stage st's TMA / bulk bytes landed
#endif
        fence_proxy_async();  // ...and is visible to the tensor cores
        __syncthreads();      // ...for every thread; iteration it - 1 is done everywhere (its
                              // wgmmas waited for: P^T, dS^T and the other stage are free)

        // ---- S^T = K Q^T and dP^T = V dO^T over this warpgroup's 32 queries: m64n32, 16 k-steps ----
        float acc_s[kSRegs], acc_dp[kSRegs];
        const u64 d_q = wgmma_desc(sQ + q_col0 * 128, 16, 1024), d_do = wgmma_desc(sdO + q_col0 * 128, 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const u32 kv_off = (kk >> 2) * kKVColBlock + (kk & 3) * 32;
            const u32 q_off = (kk >> 2) * kQColBlock + (kk & 3) * 32;
            wgmma_ss_n32(acc_s, desc_at(d_k, kv_off), desc_at(d_q, q_off), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const u32 kv_off = (kk >> 2) * kKVColBlock + (kk & 3) * 32;
            const u32 q_off = (kk >> 2) * kQColBlock + (kk & 3) * 32;
            wgmma_ss_n32(acc_dp, desc_at(d_v, kv_off), desc_at(d_do, q_off), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
#if FS_BWD_TMA
        if (tid == 0 && it + 1 < n_iters) load_q(it + 1, st ^ 1);
#else
        if (it + 1 < n_iters) {
            load_q(it + 1, st ^ 1);
            cp_async_commit();
        }
#endif

        // ---- P^T = exp2(S^T scale log2e - lse_log2), masked, -> shared memory (16-bit) ----
        wgmma_wait<1>();
        reg_fence(acc_s);
#if FS_HAS_SOFTCAP
#pragma unroll
        for (int i = 0; i < kSRegs; ++i) acc_s[i] = tanh_softcap<FS_DTYPE>(acc_s[i] * sc.pre);
#else
#pragma unroll
        for (int j = 0; j < kSCols / 8; ++j) {
            const float2 l2 = *reinterpret_cast<const float2*>(sL + q_col0 + 8 * j + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc_s[4 * j + e] = ex2(fmaf(acc_s[4 * j + e], scale_log2, (e & 1) ? -l2.y : -l2.x));
        }
#endif
        bool need_mask = n0 + kBlockN > seqlen_k;
#if FS_HAS_MASK
        if (p.window_right >= 0 && n0 + kBlockN - 1 - (m0 + diag) > p.window_right) need_mask = true;
        if (p.window_left >= 0 && n0 - (m0 + kBlockM - 1 + diag) < -p.window_left) need_mask = true;
#endif
        if (need_mask) {
            const int rel_lo = (FS_HAS_MASK && p.window_left >= 0) ? -p.window_left : -0x7fffffff;
            const int rel_hi = (FS_HAS_MASK && p.window_right >= 0) ? p.window_right : 0x7fffffff;
            const int key0 = n0 + key_row;
            const int qd0 = m0 + q_col0 + 2 * t + diag;
#pragma unroll
            for (int j = 0; j < kSCols / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = key0 + 8 * (e >> 1);
                    const int rel = key - (qd0 + 8 * j + (e & 1));
                    if (key >= seqlen_k || rel < rel_lo || rel > rel_hi) acc_s[4 * j + e] = FB90_MASKED;
                }
        }
        // element (key_row + 8 h, q_col0 + 8 j + 2 t + {0, 1}) of the accumulator is the pair
        // acc[4 j + 2 h], acc[4 j + 2 h + 1]: one 4-byte store, 32 banks a warp (the swizzle)
#pragma unroll
        for (int j = 0; j < kSCols / 8; ++j) {
#if FS_HAS_SOFTCAP
            const float2 l2 = *reinterpret_cast<const float2*>(sL + q_col0 + 8 * j + 2 * t);
#endif
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<u32*>(smem + kPOff + swz_offset(kBlockN, key_row + 8 * h, q_col0 + 8 * j + 2 * t)) =
#if FS_HAS_SOFTCAP
                    pack2<FS_DTYPE>(ex2(fmaf(acc_s[4 * j + 2 * h], scale_log2, -l2.x)),
                                    ex2(fmaf(acc_s[4 * j + 2 * h + 1], scale_log2, -l2.y)));
#else
                    pack2<FS_DTYPE>(acc_s[4 * j + 2 * h], acc_s[4 * j + 2 * h + 1]);
#endif
        }

        // ---- dS^T = P^T (dP^T - D) -> shared memory ----
        wgmma_wait<0>();
        reg_fence(acc_dp);
#pragma unroll
        for (int j = 0; j < kSCols / 8; ++j) {
            const float2 dd = *reinterpret_cast<const float2*>(sD + q_col0 + 8 * j + 2 * t);
#if FS_HAS_SOFTCAP
            const float2 l2 = *reinterpret_cast<const float2*>(sL + q_col0 + 8 * j + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float th = acc_s[4 * j + e];
                const float pr = ex2(fmaf(th, scale_log2, (e & 1) ? -l2.y : -l2.x));
                acc_dp[4 * j + e] = pr * (acc_dp[4 * j + e] - ((e & 1) ? dd.y : dd.x)) * fmaxf(1.0f - th * th, 0.0f);
            }
#else
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dp[4 * j + e] = acc_s[4 * j + e] * (acc_dp[4 * j + e] - ((e & 1) ? dd.y : dd.x));
#endif
        }
#pragma unroll
        for (int j = 0; j < kSCols / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                *reinterpret_cast<u32*>(smem + kSOff + swz_offset(kBlockN, key_row + 8 * h, q_col0 + 8 * j + 2 * t)) =
                    pack2<FS_DTYPE>(acc_dp[4 * j + 2 * h], acc_dp[4 * j + 2 * h + 1]);
        fence_proxy_async();  // the st.shared above are read next by the tensor cores
        __syncthreads();      // P^T, dS^T complete: every product below reads both halves

        // ---- dQ_partial = dS K over this warpgroup's 128 columns, in two m64n64 halves of 4
        //      k16 steps (keys) each (one live at a time: 192 accumulator registers would spill
        //      the cp.async build); the first half before dV += P^T dO and dK += dS^T Q (4 k16
        //      steps over the queries each) so its adds go out under them ----
        float* dq_blk = p.dq_accum + (FB90_BH(hq) * p.seqlen_q_pad + m0) * kHeadDim;
        // fragment order (header): float4 j of warp w's lane at ((w 16 + j) 32 + lane) 4 floats,
        // j = 8 half + n8 slab: one red.global.add.v4.f32 of 512 contiguous bytes a warp
        float* dq_thread = dq_blk + ((tid >> 5) * (kDQRegs / 4) * 32 + lane) * 4;
        float acc_dq[32];
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk)
            wgmma_ss_n64_tt(acc_dq, desc_at(d_dq_a, kk * 16 * 128), desc_at(d_dq_b, kk * 16 * 128), kk > 0 ? 1 : 0);
        wgmma_commit();
        reg_fence(acc_dv);
        reg_fence(acc_dk);
        const u64 d_do_mn = wgmma_desc(sdO + 2 * wg * kQColBlock, kQColBlock, 1024);
        const u64 d_q_mn = wgmma_desc(sQ + 2 * wg * kQColBlock, kQColBlock, 1024);
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)  // A: 16 query columns (32 bytes); B: 16 query rows
            wgmma_ss<kDCols, FS_DTYPE, 1>(acc_dv, desc_at(d_p, kk * 32), desc_at(d_do_mn, kk * 16 * 128), 1);
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)
            wgmma_ss<kDCols, FS_DTYPE, 1>(acc_dk, desc_at(d_s, kk * 32), desc_at(d_q_mn, kk * 16 * 128), 1);
        wgmma_commit();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (half == 1) {  // the second half, behind dV / dK
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < kBlockN / 16; ++kk)
                    wgmma_ss_n64_tt(acc_dq, desc_at(d_dq_a, kk * 16 * 128),
                                    desc_at(d_dq_b, kKVColBlock + kk * 16 * 128), kk > 0 ? 1 : 0);
                wgmma_commit();
                wgmma_wait<0>();  // dV, dK and this half complete: P^T, dS^T, this stage free
            } else {
                wgmma_wait<1>();  // the first half complete (dV, dK may run on)
            }
            reg_fence(acc_dq);
#pragma unroll
            for (int j = 0; j < 8; ++j)
                red_add4(dq_thread + (8 * half + j) * 32 * 4, acc_dq[4 * j], acc_dq[4 * j + 1], acc_dq[4 * j + 2],
                         acc_dq[4 * j + 3]);
        }
        reg_fence(acc_dv);
        reg_fence(acc_dk);
    }
#else
    const u32 sK_wg = sK + wg * 64 * 128;    // this warpgroup's 64 key rows in each column block
    const u32 sV_wg = sV + wg * 64 * 128;
    const int key_row = wg * 64 + warp_in_wg * 16 + g;  // this thread's first key row in the block
    const u64 d_k = wgmma_desc(sK_wg, 16, 1024), d_v = wgmma_desc(sV_wg, 16, 1024);
    // dQ split (see the header): A column block (query rows) and B column block (head-dim columns)
    const u32 dq_a_off = kBlockM == 128 ? wg * (kBlockN * 128) : 0;
    const u32 dq_b_off = kBlockM == 64 ? wg * kKVColBlock : 0;
    // the accumulator block of the dQ waiting in shared memory: its offset in floats / kHeadDim
    long long dq_pending = 0;

    for (int it = 0; it < n_iters; ++it) {
        const int st = it & 1;
        const int m0 = (m_begin + it % nm) * kBlockM;
        const u32 sQ = s_base + kQOff + st * 2 * kQTile;
        const u32 sdO = sQ + kQTile;
        const float* sL = reinterpret_cast<const float*>(smem + kLOff + st * 2 * kBlockM * 4);
        const float* sD = sL + kBlockM;

        cp_async_wait<0>();   // stage st (and on it == 0 K, V) landed for this thread
#if FS_BWD_TMA
        mbar_wait(s_base + kBarOff + st * 8, (it >> 1) & 1);  // stage st's TMA / bulk bytes landed
#endif
        fence_proxy_async();  // ...and is visible to the tensor cores (async proxy), and this
                              // thread's dQ stores of it - 1 to the bulk reduce (async proxy)
        __syncthreads();      // ...for every thread; iteration it - 1 is done everywhere
        if (tid == 0 && it > 0) {  // iteration it - 1's dQ block, added by the TMA unit
            bulk_reduce_add_f32(p.dq_accum + dq_pending * kHeadDim,
                                s_base + kDQOff + ((it - 1) % kDQStages) * kDQBytes, kDQBytes);
            bulk_commit();
        }

        // ---- S^T = K Q^T and dP^T = V dO^T: hd / 16 k-steps each, both operands K-major ----
        // (every descriptor formed once an iteration, or once (K, V), and stepped by desc_at:
        // formed at each of the iteration's 32 k-steps, they cost ~5 uniform instructions each)
        float acc_s[kSRegs], acc_dp[kSRegs];
        const u64 d_q = wgmma_desc(sQ, 16, 1024), d_do = wgmma_desc(sdO, 16, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const u32 kv_off = (kk >> 2) * kKVColBlock + (kk & 3) * 32;
            const u32 q_off = (kk >> 2) * kQColBlock + (kk & 3) * 32;
            wgmma_ss<kBlockM, FS_DTYPE, 0>(acc_s, desc_at(d_k, kv_off), desc_at(d_q, q_off), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; ++kk) {
            const u32 kv_off = (kk >> 2) * kKVColBlock + (kk & 3) * 32;
            const u32 q_off = (kk >> 2) * kQColBlock + (kk & 3) * 32;
            wgmma_ss<kBlockM, FS_DTYPE, 0>(acc_dp, desc_at(d_v, kv_off), desc_at(d_do, q_off), kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        // Q / dO / lse / D of it + 1 into the other stage (free: its last readers, iteration
        // it - 1's wgmmas, were waited for before the barrier), issued under S^T / dP^T.
#if FS_BWD_TMA
        if (tid == 0 && it + 1 < n_iters) load_q(it + 1, st ^ 1);
#else
        if (it + 1 < n_iters) {
            load_q(it + 1, st ^ 1);
            cp_async_commit();
        }
#endif

        // ---- P^T = exp2(S^T scale log2e - lse_log2) (raw scores: the scale is applied to dK at the
        //      end and to dQ in the convert pass) while dP^T still runs ----
        wgmma_wait<1>();
        reg_fence(acc_s);
#if FS_HAS_SOFTCAP
#pragma unroll
        for (int i = 0; i < kSRegs; ++i) acc_s[i] = tanh_softcap<FS_DTYPE>(acc_s[i] * sc.pre);
#else
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j) {
            const float2 l2 = *reinterpret_cast<const float2*>(sL + 8 * j + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; ++e)
                acc_s[4 * j + e] = ex2(fmaf(acc_s[4 * j + e], scale_log2, (e & 1) ? -l2.y : -l2.x));
        }
#endif

        // ---- mask P^T (only blocks crossing seqlen_k or a window edge); dS^T = P^T (dP^T - D)
        //      then vanishes there too, dP^T and D being finite ----
        bool need_mask = n0 + kBlockN > seqlen_k;
#if FS_HAS_MASK
        if (p.window_right >= 0 && n0 + kBlockN - 1 - (m0 + diag) > p.window_right) need_mask = true;
        if (p.window_left >= 0 && n0 - (m0 + kBlockM - 1 + diag) < -p.window_left) need_mask = true;
#endif
        if (need_mask) {
            const int rel_lo = (FS_HAS_MASK && p.window_left >= 0) ? -p.window_left : -0x7fffffff;
            const int rel_hi = (FS_HAS_MASK && p.window_right >= 0) ? p.window_right : 0x7fffffff;
            const int key0 = n0 + key_row;
            const int qd0 = m0 + 2 * t + diag;
#pragma unroll
            for (int j = 0; j < kBlockM / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = key0 + 8 * (e >> 1);
                    const int rel = key - (qd0 + 8 * j + (e & 1));
                    if (key >= seqlen_k || rel < rel_lo || rel > rel_hi) acc_s[4 * j + e] = FB90_MASKED;
                }
        }

        // ---- P^T, dS^T rounded to the input type as register A operands: n8 slabs 2kk, 2kk + 1
        //      of the accumulator are k16 step kk of A (common/wgmma.cuh) ----
        u32 pa[kPSteps][4], sa[kPSteps][4];
#if FS_HAS_SOFTCAP
        // pa[kk][e] packs accumulator elements 8 kk + 2 e, + 1: n8 slab j = 2 kk + e / 2, pair e % 2
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j) {
            const float2 l2 = *reinterpret_cast<const float2*>(sL + 8 * j + 2 * t);
#pragma unroll
            for (int h = 0; h < 2; ++h)
                pa[j >> 1][2 * (j & 1) + h] = pack2<FS_DTYPE>(ex2(fmaf(acc_s[4 * j + 2 * h], scale_log2, -l2.x)),
                                                              ex2(fmaf(acc_s[4 * j + 2 * h + 1], scale_log2, -l2.y)));
        }
#else
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<FS_DTYPE>(acc_s[8 * kk + 2 * e], acc_s[8 * kk + 2 * e + 1]);
#endif

        // ---- dV += P^T dO (B = dO MN-major: rows = queries = K, columns = hd = N), issued
        //      before dP^T is waited for: the tensor cores run it under the dS^T arithmetic ----
        reg_fence(acc_dv);
        const u64 d_do_mn = wgmma_desc(sdO, kQColBlock, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)  // 16 query rows of 128 bytes; LBO: next 64 hd columns
            wgmma_rs<kHeadDim, FS_DTYPE, 1>(acc_dv, pa[kk], desc_at(d_do_mn, kk * 16 * 128), 1);
        wgmma_commit();

        wgmma_wait<1>();  // S^T, dP^T complete (dV may still run)
        reg_fence(acc_dp);
#pragma unroll
        for (int j = 0; j < kBlockM / 8; ++j) {
            const float2 dd = *reinterpret_cast<const float2*>(sD + 8 * j + 2 * t);
#if FS_HAS_SOFTCAP
            const float2 l2 = *reinterpret_cast<const float2*>(sL + 8 * j + 2 * t);
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const float th = acc_s[4 * j + e];
                const float pr = ex2(fmaf(th, scale_log2, (e & 1) ? -l2.y : -l2.x));
                acc_dp[4 * j + e] = pr * (acc_dp[4 * j + e] - ((e & 1) ? dd.y : dd.x)) * fmaxf(1.0f - th * th, 0.0f);
            }
#else
#pragma unroll
            for (int e = 0; e < 4; ++e) acc_dp[4 * j + e] = acc_s[4 * j + e] * (acc_dp[4 * j + e] - ((e & 1) ? dd.y : dd.x));
#endif
        }
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) sa[kk][e] = pack2<FS_DTYPE>(acc_dp[8 * kk + 2 * e], acc_dp[8 * kk + 2 * e + 1]);

        // ---- dS^T -> shared memory (key rows, query columns; the packed pairs of sa), before
        //      the dK wgmma takes sa as its register A: the PTX ISA (wgmma.wait_group) makes any access
        //      to an in-flight wgmma's A registers, reads included, undefined ----
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int row = key_row + 8 * (e & 1);             // a1, a3: row + 8
                const int col = 16 * kk + 8 * (e >> 1) + 2 * t;     // a2, a3: column + 8
                *reinterpret_cast<u32*>(smem + kSOff + swz_offset(kBlockN, row, col)) = sa[kk][e];
            }

        // ---- dK += dS^T Q (B = Q MN-major) ----
        reg_fence(acc_dk);
        const u64 d_q_mn = wgmma_desc(sQ, kQColBlock, 1024);
        wgmma_fence();  // sa was written by ordinary instructions since the last fence
#pragma unroll
        for (int kk = 0; kk < kPSteps; ++kk)
            wgmma_rs<kHeadDim, FS_DTYPE, 1>(acc_dk, sa[kk], desc_at(d_q_mn, kk * 16 * 128), 1);
        wgmma_commit();

        if (tid == 0) bulk_wait_read<kDQStages - 1>();  // the reduce of it - 2 has read stage it % 2
        fence_proxy_async();  // the st.shared above are read next by the tensor cores
        __syncthreads();      // dS^T complete: each warpgroup's dQ reads both warpgroups' keys;
                              // dQ's shared memory is free again

        // ---- dQ_partial = dS K: m64n64, 8 k16 steps over the 128 keys ----
        float acc_dq[32];
        const u64 d_dq_a = wgmma_desc(sS + dq_a_off, kBlockN * 128, 1024);
        const u64 d_dq_b = wgmma_desc(sK + dq_b_off, kKVColBlock, 1024);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlockN / 16; ++kk) {
            // A: dS^T tile, 16 key rows (K) from row 16 kk, 64 queries (M) of one column block;
            // B: K tile, 16 key rows (K), 64 head-dim columns (N) of one column block.
            const u64 da = desc_at(d_dq_a, kk * 16 * 128);
            const u64 db = desc_at(d_dq_b, kk * 16 * 128);
            wgmma_ss_n64_tt(acc_dq, da, db, kk > 0 ? 1 : 0);
        }
        wgmma_commit();
        wgmma_wait<0>();  // dQ, and dV, dK above, complete
        reg_fence(acc_dq);
        reg_fence(acc_dv);
        reg_fence(acc_dk);
        reg_fence_u(pa);
        reg_fence_u(sa);

        // ---- dQ_partial -> shared memory in fragment order (header); rows past seqlen_q hold
        //      zeros (their Q / dO rows were zero-filled, lse_log2 = +inf) and are added as such:
        //      the accumulator has seqlen_q_pad rows ----
#pragma unroll
        for (int j = 0; j < 8; ++j)
            *reinterpret_cast<float4*>(smem + kDQOff + (it % kDQStages) * kDQBytes +
                                       (((tid >> 5) * 8 + j) * 32 + lane) * 16) =
                make_float4(acc_dq[4 * j], acc_dq[4 * j + 1], acc_dq[4 * j + 2], acc_dq[4 * j + 3]);
        dq_pending = FB90_BH(hk * group + it / nm) * p.seqlen_q_pad + m0;
    }
    // the last iteration's dQ block
    fence_proxy_async();
    __syncthreads();
    if (tid == 0 && n_iters > 0) {
        bulk_reduce_add_f32(p.dq_accum + dq_pending * kHeadDim,
                            s_base + kDQOff + ((n_iters - 1) % kDQStages) * kDQBytes, kDQBytes);
        bulk_commit();
        bulk_wait<0>();
    }
#endif  // FS_HEAD_DIM == 256

    // ---- epilogue: dK * scale and dV staged in the K / V tiles (swizzled), 16-byte stores ----
    cp_async_wait<0>();  // with no iteration the K / V loads may still be landing
    __syncthreads();     // every wgmma reading K / V completed (waited) in every thread
    {
        const float sc = p.softmax_scale;
#if FS_HEAD_DIM == 256
        const int dc0 = d_col0;  // this warpgroup's columns
#else
        const int dc0 = 0;       // every column, this warpgroup's keys
#endif
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int j = 0; j < kDCols / 8; ++j) {
                const u32 off = swz_offset(kBlockN, key_row + 8 * h, dc0 + 8 * j + 2 * t);
                *reinterpret_cast<u32*>(smem + kKOff + off) =
                    pack2<FS_DTYPE>(acc_dk[4 * j + 2 * h] * sc, acc_dk[4 * j + 2 * h + 1] * sc);
                *reinterpret_cast<u32*>(smem + kVOff + off) =
                    pack2<FS_DTYPE>(acc_dv[4 * j + 2 * h], acc_dv[4 * j + 2 * h + 1]);
            }
    }
    __syncthreads();
    {
        char* dk = static_cast<char*>(p.dk) + ((long long)b * p.dk_batch_stride + (long long)(FB90_K_ROW0 + n0) * p.dk_row_stride +
                                              (long long)hk * p.dk_head_stride) * 2;
        char* dv = static_cast<char*>(p.dv) + ((long long)b * p.dv_batch_stride + (long long)(FB90_K_ROW0 + n0) * p.dv_row_stride +
                                              (long long)hk * p.dv_head_stride) * 2;
        const int c = tid % kChunksPerRow;
        for (int r = tid / kChunksPerRow; r < keys; r += kRowsPerPass) {
            const u32 off = swz_offset(kBlockN, r, c * 8);
            *reinterpret_cast<uint4*>(dk + (long long)r * p.dk_row_stride * 2 + c * 16) =
                *reinterpret_cast<const uint4*>(smem + kKOff + off);
            *reinterpret_cast<uint4*>(dv + (long long)r * p.dv_row_stride * 2 + c * 16) =
                *reinterpret_cast<const uint4*>(smem + kVOff + off);
        }
    }
}
#undef FB90_BH
