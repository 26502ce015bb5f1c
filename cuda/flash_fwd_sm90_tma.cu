// flash_fwd_sm90_tma.cu: FlashAttention forward for Hopper (sm_90a), warp-specialised: a
// producer warpgroup loads Q, K and V with TMA into a shared-memory ring guarded by mbarriers,
// and two consumer warpgroups run wgmma and the online softmax (the math of flash_fwd_sm90.cu).
//
// One CTA computes one FS_BLOCK_M x head_dim tile of the output for one (batch, head) (FS_BLOCK_M
// 128, or 192 at head dim 64); 128 threads per warpgroup, one producer and FS_BLOCK_M / 64
// consumers (384 or 512 threads):
//   warpgroup 0 (producer): setmaxnreg down to 24; one thread issues every TMA load:
//       Q once (bar_q), then for each visible KV tile (last to first) K into ring stage s
//       (full_k[s]) and V (full_v[s]), each after the consumers freed that stage (empty_k/v[s]).
//   warpgroups 1.. (consumers): setmaxnreg up to 240 (two consumers) or 160 (three); consumer c
//   owns query rows [64 c, 64 c + 64):
//       S = Q K^T   wgmma m64n128k16 (m64n64k16 at head dim 256), A = Q and B = K from shared
//                   memory (K-major)                                               -> free K
//       mask        (only in warps whose 16 rows a window edge crosses, or tiles past seqlen_k;
//                   per-row key limits, one compare an element under a causal mask)
//       softmax     (registers, exp2 with the scale folded into one FFMA)
//       O += P V    wgmma m64nDk16 (two m64n128k16 at D = 256), A = P from registers, B = V
//                   (MN-major)                                                     -> free V
//     The consumers never synchronise with each other inside the loop, so one's softmax runs
//     while the other's GEMMs use the tensor cores. FS_SM90_PIPE=1 also overlaps inside each
//     warpgroup: S(i) is issued before P(i-1) V(i-1), and the softmax of tile i runs while that
//     P V is on the tensor cores (flash_fwd_sm90.cu's verified pipelined order).
//     FS_SM90_PINGPONG=1 (on top of PIPE) makes the consumers take turns: each issue slot (S(i)
//     and P(i-1) V(i-1) back to back) waits for the previous consumer's slot (round robin, one
//     named barrier per consumer after the epilogue's, 256 threads: 128 waiting + 128
//     arriving), so one warpgroup's softmax runs while another's GEMMs hold the tensor cores
//     (FlashAttention-3's ping-pong; with three consumers two softmaxes overlap one GEMM slot,
//     which is what head dim 64, whose softmax costs as much as its GEMMs, needs).
//   Epilogue: O / rowsum and LSE; each consumer stages its rows in its own rows of the Q tile and
//   stores them with 16-byte coalesced writes (named barrier per warpgroup).
//
// TMA: rank-4 tensor maps (head_dim, seqlen, heads, batch), box 64 x 128 x 1 x 1 (Q at FS_BLOCK_M
// 192: 64 x 64, three boxes per column block; K and V at head dim 256: 64 x 64), 128-byte swizzle:
// one box is exactly one 64-column block of common/wgmma.cuh's swizzled tile layout (128 rows x
// 128 bytes, chunk c of row r at r * 128 + (c ^ r % 8) * 16), so the wgmma descriptors of the
// cp.async kernel read it unchanged. Rows past seqlen (tails) are zero-filled by TMA and, for K,
// masked; a box always delivers its full byte count, which is what expect_tx announces.
//
// Shared memory: [Q | K0 | V0 | K1 | V1 | ... ] (Q: FS_BLOCK_M * head_dim * 2 bytes; K, V: 2 *
// FS_KV_STAGES tiles of FS_BLOCK_N * head_dim * 2 bytes; 1024-byte aligned) then the mbarriers: bar_q,
// full_k[S], full_v[S], empty_k[S], empty_v[S]. Empty barriers count one arrival per consumer
// warp: its lane 0, once its wgmmas on the stage completed.
//
// Head dim 256 (FS_BLOCK_N=64): 64-key K / V tiles, so that O (128 fp32 registers a thread), S (32)
// and P (16) fit the consumers' 240 registers and Q (64 KB) with two stages of K and V (32 KB
// each) the shared memory; each P V k-step is two m64n128k16, one per half of O (whose registers
// hold the columns as one m64n256k16 would); one CTA a tile (no room for the persistent form's
// O buffer). Measured on the H200 (2026-12-02, bf16, ping-pong): 719-733 TFLOP/s at s2048-16k,
// 1.12-1.21x cuDNN, 2.6x the mma.sync kernel (benches/results/2026-12-02-h200-attention-hd256/).
//
// Covered: fp16 / bf16, head_dim 64, 128 or 256 (FS_HEAD_DIM, the tile) or a multiple of 8 below it
// (p.head_dim: the maps hold the real width, TMA fills the columns past it with zeros, so Q K^T and
// P V are unchanged and O's extra columns, zero, are not stored), causal / sliding windows
// (FS_HAS_MASK), seqlen_q != seqlen_k (bottom-right aligned), GQA/MQA, LSE, packed sequences
// (FS_VARLEN: the maps span the packed rows with batch 1, each tile reads its sequence's bounds
// from cu_seqlens (clamped, common/flash_params.cuh) and loads from its first rows; rows past a
// sequence's end are the next one's or TMA's zeros, masked as keys and never stored as queries;
// one CTA a tile, those past their sequence's end return at once), softcap (FS_HAS_SOFTCAP:
// tanh.approx of the pre-scaled product before the mask, common/softcap.cuh; built for each head
// dim's default schedule only). The launcher
// (src/ops/attention.rs) encodes the maps and falls back to flash_fwd_sm90.cu (exact head dims) or
// flash_fwd.cu where the driver refuses one.
//
// Persistent (FS_SM90_PERSIST=1, a static stride; masks off only): one CTA an SM walks the tiles t = blockIdx.x,
// blockIdx.x + gridDim.x, ... in the grid order of the plain launch (query blocks fastest, so the
// CTAs at work share their heads' K / V in L2; every tile costs the same, so the stride balances).
// The producer runs on into the next tile: its Q as soon as every consumer warp's last S = Q K^T
// of the tile completed (q_empty, one arrival a consumer warp), its K / V as the ring frees, so
// that tile's loads land under this one's last P V and epilogue; O is staged in a buffer of its
// own (after the ring), not in the Q tile. Why: short sequences ran far below long ones (H200,
// 2026-12-02, bf16, batch x seqlen 16k: hd64 305 TFLOP/s at s512 against 501 at s16k), the loads
// before a CTA's first S and the epilogue after its last P V exposed in every CTA. Measured
// against the one-tile grid in the same process: +15% at s512, +7-8% at s1024, +2-6% from s2048
// (benches/results/2026-12-02-h200-attention-persistent/).
//
// The tile queue (FS_SM90_PERSIST=2; the default for masked problems with seqlen_k <= 8192 or a
// left window, whose tiles differ in cost, so a static stride would not balance): CTA i starts on
// tile i; its producer thread takes each next index from a global counter (atomicAdd) once it has
// issued the current tile's loads, and hands every index (the last one past the end: stop) to the
// consumer warps through two shared-memory slots, each with a tile_full (one arrival) and a
// tile_free (one arrival a consumer warp, after its lane 0 read the slot) mbarrier. The counter
// and a count of CTAs done are zero at the launch, and the last CTA done zeroes them again: the
// host gives each stream one such pair for all its launches (src/runtime/counters.rs; zeroed
// scratch under graph capture), so a launch costs no memset. The order: sections of
// section_heads (batch, head) pairs whose K / V the host sized to ~32 MB of L2, inside one the
// query blocks outermost, last first (under a causal mask the longest: the tiles left for the end
// are the short ones), pairs fastest. Against the one-tile grid in the same process (H200, bf16,
// causal, batch x seqlen 16k): hd64 +17-20% at s512, +13-17% at s1024, +8% at s2048, +3-6% at s4096,
// +1% at s8192; hd128 +11% / +13% / +8% / +2% at s512 / 1024 / 2048 / 8192; at s16384 -1..-5%,
// so longer problems keep one CTA a tile (benches/results/2026-12-02-h200-attention-queue/).
// Unmasked problems keep the stride, 0.3-2% faster than the queue in the same order. In the
// queue's plain-schedule builds a consumer warpgroup passes on, without computing, the leading KV
// tiles none of its rows sees (at 192 rows the diagonal tile for the upper warpgroups): +13% /
// +11% / +5% at hd64 causal s512 / 1024 / 2048.
//
// FP8 (FS_DTYPE=3: e4m3 Q, K and V, bf16 O; flash-attn 3's q_descale / k_descale / v_descale): the
// 128 tile (FS_HEAD_DIM 128; head dims 16 .. 128 padded to it by the maps), 128 query rows,
// ping-pong, no softcap, dense. Both operands of an 8-bit wgmma must be K-major, so O += P V needs
// V transposed (Vt: head-dim rows of 128 key bytes, the K tile's layout). V tiles come by TMA as
// stored (V's map is K's) into two raw tiles after the O buffer, and producer warps 1-3 transpose
// each into the ring's Vt stage (transpose_v_tiles: ldmatrix .trans + byte permutes, after the
// consumers freed the stage; full_v then counts their three arrivals), so the call is one launch.
// (FS_FP8_TRANSPOSE=0, where each V row serves many query rows, attention_fp8::prepass_for: the
// host's pre-pass cuda/flash_fp8_vt.cu writes Vt (batch, heads_k, head_dim, seqlen_k padded to
// 128) to scratch and the V map is Vt's. The in-kernel transpose made the kernel 5-10% slower,
// H200 2026-12-03: benches/results/2026-12-03-h200-attention-fp8-transpose/.) S = Q K^T
// is m64n128k32 (4 k-steps of 32 bytes, the same byte offsets as the 16-bit k16 steps); P is
// rounded to e4m3 in registers and O += P Vt runs m64n128k32 with P as the register A. P's
// accumulator registers hold keys {2t, 2t+1, 8+2t, 9+2t} of each 16 where the 8-bit A fragment
// wants columns {4t .. 4t+3}: instead of shuffling bytes, Vt holds each 16 keys in that permuted
// order (column 4t+e of a 16 holds key 2t + (e & 1) + 8 (e >> 1)), so P's registers pack in place.
// Descales: the tile's (batch, kv head) q x k descale multiplies the score scale, v's the output; O
// is staged in a buffer of its own (the 16 KB Q tile cannot hold 32 KB of bf16 output).
//
// The prelude defines FS_HEAD_DIM (64, 128 or 256), FS_DTYPE (0 fp16, 1 bf16, 3 e4m3), FS_HAS_MASK, FS_ARCH
// (90), FS_KV_STAGES (2 to 5), optionally FS_SM90_PIPE, FS_SM90_PINGPONG, FS_SM90_PERSIST (0, 1 or
// 2), FS_BLOCK_M (default 128), FS_BLOCK_N (default 128; 64 at head dim 256) and FS_HAS_SOFTCAP.

#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/flash_params.cuh"
#include "common/math.cuh"
#include "common/mma.cuh"
#include "common/softcap.cuh"
#include "common/tma.cuh"
#include "common/wgmma.cuh"

#if !defined(FS_HEAD_DIM) || !defined(FS_DTYPE) || !defined(FS_HAS_MASK) || !defined(FS_ARCH) || !defined(FS_KV_STAGES)
#error "the prelude must define FS_HEAD_DIM, FS_DTYPE, FS_HAS_MASK, FS_ARCH and FS_KV_STAGES"
#endif
#ifndef FS_SM90_PIPE
#define FS_SM90_PIPE 0
#endif
#ifndef FS_SM90_PINGPONG
#define FS_SM90_PINGPONG 0  // 1 (with FS_SM90_PIPE): the consumers take turns issuing GEMMs
#endif
#ifndef FS_BLOCK_M
#define FS_BLOCK_M 128
#endif
#ifndef FS_BLOCK_N
#define FS_BLOCK_N 128  // keys per K / V tile; 64 at head dim 256 (host: attention_tma::block_n)
#endif
#ifndef FS_SM90_PERSIST
#define FS_SM90_PERSIST 0
#endif
#ifndef FS_VARLEN
#define FS_VARLEN 0  // 1: packed sequences (flash_attn_varlen_func), one CTA a tile
#endif
#if FS_VARLEN && FS_SM90_PERSIST
#error "FS_VARLEN: one CTA a tile (the persistent forms index dense tiles)"
#endif
#ifndef FS_EXP_POLY
#define FS_EXP_POLY 0  // of each 16 column pairs of S, how many exponentiate on the FMA pipe
#endif
#ifndef FS_HAS_SOFTCAP
#define FS_HAS_SOFTCAP 0  // 1: scores capped, s = cap * tanh(scale * q.k / cap) (common/softcap.cuh)
#endif
#if FS_SM90_PERSIST == 1 && FS_HAS_MASK
#error "FS_SM90_PERSIST=1 (a static stride): unmasked problems only (equal tiles); masks take 2"
#endif
#if FS_SM90_PERSIST < 0 || FS_SM90_PERSIST > 2
#error "FS_SM90_PERSIST: 0 (one tile a CTA), 1 (a static stride) or 2 (a tile queue)"
#endif
#if FS_SM90_PINGPONG && !FS_SM90_PIPE
#error "FS_SM90_PINGPONG builds on the FS_SM90_PIPE schedule"
#endif
#define FS_FP8 (FS_DTYPE == 3)  // e4m3 Q / K / V, bf16 O
#if FS_FP8 && (FS_VARLEN || FS_HAS_SOFTCAP || FS_HEAD_DIM != 128)
#error "FP8: the dense 128 tile without softcap"
#endif
#ifndef FS_FP8_TRANSPOSE
#define FS_FP8_TRANSPOSE 1  // FP8: 1, the producer's warps transpose V in shared memory; 0, the host's pre-pass
#endif
#define FS_FP8_VT (FS_FP8 && FS_FP8_TRANSPOSE)  // V by TMA as stored, transposed by producer warps 1-3

#if FS_FP8
// One descale tensor (flash-attn 3: float32, (batch, nheads_k)); ptr null: 1. Strides in elements
// (0 broadcasts).
struct Fp8Descale {
    const float* ptr;
    long long batch_stride, head_stride;
};
struct Fp8Scales {
    Fp8Descale q, k, v;
};
#endif


// The kernel's one parameter (host mirror: FlashFwdTmaParams in src/ops/attention_tma.rs):
// tensor maps first (64-byte aligned, 128 bytes each), then the plain parameters.
struct FlashFwdTmaParams {
    fs::TensorMap tm_q, tm_k, tm_v;
    int* tile_counter;  // FS_SM90_PERSIST=2: [tiles taken past the grid's first, CTAs done]; zero at
                        // the launch, and zero again when the last CTA's producer is done
    int section_heads;  // FS_SM90_PERSIST=2: (batch, head) pairs a section of the tile order
    int pad_;
    FlashFwdParams p;
#if FS_FP8
    // the host mirror's FlashFwdParams carries the varlen tail (24 bytes) and the struct is 64-byte
    // aligned: the descales sit at byte 640 (FlashFwdFp8Params in src/ops/attention_fp8.rs)
    unsigned char host_tail_[640 - 400 - sizeof(FlashFwdParams)];
    Fp8Scales f8;
#endif
};

namespace f90t {

using namespace fs;

static constexpr int kHeadDim = FS_HEAD_DIM;
static constexpr int kBlockM = FS_BLOCK_M;             // query rows per CTA
static constexpr int kBlockN = FS_BLOCK_N;             // keys per KV tile
static constexpr int kNC = kBlockM / 64;               // consumer warpgroups, 64 query rows each
static constexpr int kStages = FS_KV_STAGES;           // K/V ring depth
static constexpr int kThreads = 128 * (1 + kNC);       // producer + consumer warpgroups
static constexpr int kElem = FS_FP8 ? 1 : 2;           // bytes of a Q / K / V element
static constexpr int kOutDtype = FS_FP8 ? 1 : FS_DTYPE; // O's dtype code (FP8: bf16)
static constexpr int kBoxCols = 128 / kElem;           // elements of a 128-byte box row
static constexpr int kTileBytes = kBlockN * kHeadDim * kElem;  // one swizzled K or V (FP8: Vt) tile
static constexpr int kColBlockBytes = kBlockN * 128;   // one 128-byte column block of a K / V tile
static constexpr int kQBytes = kBlockM * kHeadDim * kElem; // the Q tile
static constexpr int kQColBlock = kBlockM * 128;       // one 64-column block of the Q tile
// How far (log2 units) a row's scores may rise above its exponent base before the base moves
// (the pipelined schedules' conditional rescale, mask_softmax). FP8: 0, so that the largest P of a
// row is exactly 1 as e4m3 (at 8, P ran up to 2^8 and its largest, most weighted value carried
// e4m3's 3% rounding: outputs 2-3.5x the error of an FP8 kernel with exact maxima, H200
// 2026-12-03); the warp still skips O's rescale on tiles where no row's maximum grew.
// FS_FP8_RESCALE (measurement): 0 rescales every tile, 1 conditionally at 2^0, 2 at 2^8.
#ifndef FS_FP8_RESCALE
#define FS_FP8_RESCALE 1
#endif
static constexpr float kRescaleLog2 = (FS_FP8 && FS_FP8_RESCALE < 2) ? 0.0f : 8.0f;
static constexpr bool kCondRescale = !FS_FP8 || FS_FP8_RESCALE > 0;
static constexpr int kQBoxRows = kBlockM == 128 ? 128 : 64;  // rows of a Q TMA box (host: the Q map)
static constexpr int kColBlocks = kHeadDim * kElem / 128;  // TMA boxes per tile
static constexpr int kKSteps = kHeadDim * kElem / 32;  // 32-byte k-steps of S = Q K^T
static constexpr int kPSteps = kBlockN * kElem / 32;   // 32-byte k-steps of O += P V (P's registers)
static constexpr int kChunksPerRow = kHeadDim / 8;     // 16-byte chunks per row
static constexpr int kSRegs = kBlockN / 2;             // S accumulator floats per thread
static constexpr int kORegs = kHeadDim / 2;            // O accumulator floats per thread
// N of one O += P V wgmma: the head dim, or two m64n128k16 side by side at 256 (each on its half
// of O's registers, which hold the columns in the order one m64n256k16 would)
static constexpr int kPvN = kHeadDim > 128 ? 128 : kHeadDim;
// (FP8 with the in-kernel transpose: the transposing warps spilled at 24, NVRTC 13.0)
static constexpr int kProducerRegs = FS_FP8_VT ? 32 : 24;
// 24 * 128 + 240 * 256 (two consumers; FP8 transpose 32 * 128 + 232 * 256) or + 160 * 384
// (three) <= 64 K registers
static constexpr int kConsumerRegs = kNC == 2 ? (FS_FP8_VT ? 232 : 240) : 160;
static constexpr u32 kEmptyArrivals = 4 * kNC;         // one per consumer warp
static constexpr u32 kTurnBar = 1 + kNC;               // ping-pong barriers (1..kNC: epilogues)

static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "head_dim tile is 64, 128 or 256");
// 64-key tiles at head dim 256: O (128 registers) + S (32) + P (16) fit the consumers' 240, and
// Q (64 KB) + two stages of K and V (32 KB each) the 227 KB of shared memory
static_assert(kBlockN == (kHeadDim == 256 ? 64 : 128), "128-key K / V tiles, 64 at head dim 256");
static_assert(kBlockM == 128 || (kBlockM == 192 && kHeadDim == 64), "FS_BLOCK_M 128, or 192 at head dim 64");
static_assert(FS_DTYPE == 0 || FS_DTYPE == 1 || FS_DTYPE == 3, "16-bit or e4m3 inputs");
static_assert(!FS_FP8 || kBlockM == 128, "FP8: 128 query rows (two consumers)");
static_assert(FS_ARCH == 90, "wgmma, TMA and setmaxnreg need sm_90a");
static_assert(kStages >= 2 && kStages <= 5, "2 to 5 ring stages (the smem assert below bounds them too)");
// the O staging buffer (persistent, or FP8: a bf16 O tile is larger than the e4m3 Q tile)
static constexpr bool kOwnO = FS_SM90_PERSIST || FS_FP8;
static constexpr int kOBytes = kOwnO ? kBlockM * kHeadDim * 2 : 0;
static constexpr bool kQueue = FS_SM90_PERSIST == 2;            // tiles from a global counter
// FP8 with the in-kernel transpose: V tiles as stored (TMA, K's layout) land in kVrStages raw
// tiles after the O buffer; producer warps 1 .. kTransposeWarps turn each into the ring's Vt stage
static constexpr int kVrStages = FS_FP8_VT ? 2 : 0;
#ifndef FS_FP8_TRANSPOSE_WARPS
#define FS_FP8_TRANSPOSE_WARPS 3  // (measurement: 1 or 2, FLASHSCAN_SM90_FP8_TRANSPOSE_WARPS)
#endif
static constexpr int kTransposeWarps = FS_FP8_TRANSPOSE_WARPS;
#ifndef FS_FP8_TRANSPOSE_DEPTH
#define FS_FP8_TRANSPOSE_DEPTH 1  // (measurement: 2 units' loads in flight, FLASHSCAN_SM90_FP8_TRANSPOSE_DEPTH;
                                  // 4 spilled 24 bytes at 32 registers)
#endif
static constexpr int kTransposeDepth = FS_FP8_TRANSPOSE_DEPTH;
static_assert(kTransposeWarps >= 1 && kTransposeWarps <= 3, "producer warps 1 .. 3 transpose");
static constexpr int kVrBytes = kVrStages * kTileBytes;
// barriers: bar_q, 4 per stage, q_empty; the queue's 2 tile_full + 2 tile_free, and its 2 slots;
// (FP8 transpose) 2 full_vr + 2 empty_vr, and the 2 stop flags
static constexpr int kBarBytes = FS_FP8_VT ? 8 * (12 + 4 * kStages) : 8 * (2 + 4 * kStages) + (kQueue ? 8 * 4 + 8 : 0);
static_assert(kQBytes + 2 * kStages * kTileBytes + kOBytes + kVrBytes + 1024 + kBarBytes <= 232448, "smem");
static_assert(!(FS_SM90_PERSIST && kHeadDim == 256), "head dim 256: one CTA a tile (no room for the O buffer)");

// Shared-memory addresses of one CTA's tiles and barriers.
struct Smem {
    u32 base;
    __device__ u32 q() const { return base; }
    __device__ u32 k(int s) const { return base + kQBytes + kTileBytes * (2 * s); }
    __device__ u32 v(int s) const { return base + kQBytes + kTileBytes * (1 + 2 * s); }
    // the epilogue's O staging: its own buffer when persistent (the next tile's Q may be landing),
    // else the Q tile
    __device__ u32 o() const { return kOwnO ? base + kQBytes + kTileBytes * (2 * kStages) : base; }
    // (FP8 transpose) raw V tile i, as TMA writes it
    __device__ u32 vr(int i) const { return base + kQBytes + kTileBytes * (2 * kStages) + kOBytes + kTileBytes * i; }
    __device__ u32 bar(int i) const { return base + kQBytes + kTileBytes * (2 * kStages) + kOBytes + kVrBytes + 8 * i; }
    __device__ u32 bar_q() const { return bar(0); }
    __device__ u32 full_k(int s) const { return bar(1 + s); }
    __device__ u32 full_v(int s) const { return bar(1 + kStages + s); }
    __device__ u32 empty_k(int s) const { return bar(1 + 2 * kStages + s); }
    __device__ u32 empty_v(int s) const { return bar(1 + 3 * kStages + s); }
    __device__ u32 q_empty() const { return bar(1 + 4 * kStages); }  // persistent only
    // the tile queue (FS_SM90_PERSIST=2): slot i holds a tile index the producer handed the
    // consumers (tile_full[i], one arrival), free again once every consumer warp read it
    // (tile_free[i], one arrival a consumer warp)
    __device__ u32 tile_full(int i) const { return bar(2 + 4 * kStages + i); }
    __device__ u32 tile_free(int i) const { return bar(4 + 4 * kStages + i); }
    __device__ u32 tile_slot(int i) const { return bar(6 + 4 * kStages) + 4 * i; }
    // (FP8 transpose) raw V tile i landed (full_vr[i], TMA), transposed and free again (empty_vr[i],
    // one arrival a transposing warp); stop flag i set: the producer's last arrival on full_vr[i]
    // carries no tile, the transposing warps return
    __device__ u32 full_vr(int i) const { return bar(7 + 4 * kStages + i); }
    __device__ u32 empty_vr(int i) const { return bar(9 + 4 * kStages + i); }
    __device__ u32 vr_stop(int i) const { return bar(11 + 4 * kStages) + 4 * i; }
};

// One output tile: query rows m0 .. m0 + rows_q - 1 of (batch, head) (K / V head head_k), its
// output rows and LSE, and the KV tiles [n_begin, n_end) holding a key visible to one of its rows
// (none: n_begin >= n_end). Varlen (packed rows, the maps' batch 1): the TMA rows of its query
// row m0 (q_row) and of its sequence's key 0 (k_row), its sequence's keys (sk) and bottom-right
// offset (dg); rows_q <= 0 past the sequence's end. (Formed in the one-tile kernel's order of
// before, the dense path's text unchanged: its SASS stays.)
struct TileWork {
    int m0, rows_q, head, batch, head_k, n_begin, n_end;
#if FS_VARLEN
    int q_row, k_row, sk;
    long long dg;
#endif
    char* o_ptr;
    float* lse_ptr;
};

__device__ __forceinline__ TileWork tile_work(const FlashFwdParams& p, int m_block, int head, int batch,
                                              long long diag) {
    TileWork w;
    w.m0 = m_block * kBlockM;
#if FS_VARLEN
    // the sequence's rows [q0, q0 + len_q) of q / o and [k0, k0 + sk) of k / v
    // (common/flash_params.cuh); at most max_seqlen_q (= p.seqlen_q) queries, which the grid covers
    const SeqRows r = sequence_rows(p, batch);
    const int q0 = r.q0, len_q = r.len_q, k0 = r.k0;
    w.sk = r.len_k;
    diag = (long long)w.sk - len_q;
    w.dg = diag;
    w.rows_q = min(kBlockM, len_q - w.m0);
    w.q_row = q0 + w.m0;
    w.k_row = k0;
    w.head = head;
    w.batch = batch;
    w.head_k = head / (p.nheads / p.nheads_k);
    w.o_ptr = static_cast<char*>(p.o) +
              ((long long)head * p.o_head_stride + (long long)w.q_row * p.o_row_stride) * 2;
    w.lse_ptr = p.lse ? p.lse + (long long)head * p.total_q + w.q_row : nullptr;  // (nheads, total_q)
    const int n_tiles = (w.sk + kBlockN - 1) / kBlockN;
#else
    w.rows_q = min(kBlockM, p.seqlen_q - w.m0);
    w.head = head;
    w.batch = batch;
    w.head_k = head / (p.nheads / p.nheads_k);
    w.o_ptr = static_cast<char*>(p.o) + ((long long)batch * p.o_batch_stride + (long long)head * p.o_head_stride +
                                         (long long)w.m0 * p.o_row_stride) * 2;
    w.lse_ptr = p.lse ? p.lse + ((long long)batch * p.nheads + head) * p.seqlen_q + w.m0 : nullptr;
    const int n_tiles = (p.seqlen_k + kBlockN - 1) / kBlockN;
#endif
    w.n_begin = 0;
    w.n_end = n_tiles;
#if FS_HAS_MASK
    if (p.window_left >= 0) {
        const long long lo = (long long)w.m0 + diag - p.window_left;
        if (lo > 0) w.n_begin = (int)min(lo / kBlockN, (long long)n_tiles);
    }
    if (p.window_right >= 0) {
        const long long hi = (long long)w.m0 + w.rows_q - 1 + diag + p.window_right;
        w.n_end = hi < 0 ? 0 : (int)min(hi / kBlockN + 1, (long long)n_tiles);
    }
#else
    (void)diag;
#endif
    return w;
}

// The tiles a CTA computes: persistent with a static stride, t = blockIdx.x + i * gridDim.x over
// query blocks (fastest), heads, batch; with the queue, blockIdx.x and then the indices the
// counter hands out, in sections of `section_heads` (batch, head) pairs (whose K / V the host sized
// to stay in L2), each section's query blocks outermost (masked: last first, the longest under a
// causal mask, so that the tiles left at the end are the short ones) and its pairs fastest; else
// the one tile of (blockIdx.x, y, z), masked ones longest first.
struct TileSched {
    int num_m, total;
#if FS_SM90_PERSIST == 2
    int pairs, section;
#endif
    __device__ TileSched(const FlashFwdTmaParams& P) {
        const FlashFwdParams& p = P.p;
        num_m = (p.seqlen_q + kBlockM - 1) / kBlockM;
        total = FS_SM90_PERSIST ? num_m * p.nheads * p.batch : 1;
#if FS_SM90_PERSIST == 2
        pairs = p.nheads * p.batch;
        section = max(1, min(P.section_heads, pairs));
#endif
    }
    __device__ int first() const { return FS_SM90_PERSIST ? (int)blockIdx.x : 0; }
    __device__ int stride() const { return FS_SM90_PERSIST ? (int)gridDim.x : 1; }
    __device__ TileWork work(const FlashFwdParams& p, int t, long long diag) const {
#if FS_SM90_PERSIST == 2
        const int sec = t / (section * num_m);  // full sections come first: the last may be short
        const int hb0 = sec * section;
        const int hs = min(section, pairs - hb0);
        const int r = t - hb0 * num_m;
        const int mi = r / hs;
        const int hb = hb0 + (r - mi * hs);
        return tile_work(p, FS_HAS_MASK ? num_m - 1 - mi : mi, hb % p.nheads, hb / p.nheads, diag);
#elif FS_SM90_PERSIST
        const int hb = t / num_m;
        return tile_work(p, t - hb * num_m, hb % p.nheads, hb / p.nheads, diag);
#else
        (void)t;
        const int m_block = FS_HAS_MASK ? (int)(gridDim.x - 1 - blockIdx.x) : (int)blockIdx.x;
        return tile_work(p, m_block, (int)blockIdx.y, (int)blockIdx.z, diag);
#endif
    }
};

// Output 0 and LSE -inf for a tile no key is visible to (flash-attn's behaviour), by threads
// tid0 .. tid0 + nthr - 1.
__device__ __forceinline__ void store_empty_tile(const FlashFwdParams& p, const TileWork& w, int tid0, int nthr) {
    const int c = tid0 % kChunksPerRow;
    if (c * 8 < p.head_dim)  // (a padded head dim: the tile's columns past it are not O's)
        for (int r = tid0 / kChunksPerRow; r < w.rows_q; r += nthr / kChunksPerRow)
            *reinterpret_cast<uint4*>(w.o_ptr + r * p.o_row_stride * 2 + c * 16) = make_uint4(0u, 0u, 0u, 0u);
    if (w.lse_ptr)
        for (int r = tid0; r < w.rows_q; r += nthr) w.lse_ptr[r] = neg_inf();
}

// All boxes of one kBlockN-row tile (rows row0.. of (head, batch)) into dst, completing on bar.
__device__ __forceinline__ void tma_tile(u32 dst, const TensorMap* map, int row0, int head, int batch, u32 bar) {
    mbar_arrive_expect_tx(bar, kTileBytes);
#pragma unroll
    for (int cb = 0; cb < kColBlocks; ++cb)
        tma_load_4d(dst + cb * kColBlockBytes, map, cb * kBoxCols, row0, head, batch, bar);
}

#if FS_FP8
// The Vt tile of keys key0 .. key0 + kBlockN - 1 (all kHeadDim rows; past head_dim TMA's zeros) of
// (head, batch): one box, completing on bar.
__device__ __forceinline__ void tma_vt(u32 dst, const TensorMap* map, int key0, int head, int batch, u32 bar) {
    mbar_arrive_expect_tx(bar, kTileBytes);
    tma_load_4d(dst, map, key0, 0, head, batch, bar);
}

// The tile's descale from one (batch, kv head) descale tensor (none: 1).
__device__ __forceinline__ float fp8_descale(const Fp8Descale& d, int batch, int head_k) {
    return d.ptr ? d.ptr[batch * d.batch_stride + head_k * d.head_stride] : 1.0f;
}
#endif

#if FS_FP8_VT
__device__ __forceinline__ u32 byte_perm(u32 a, u32 b, u32 sel) {
    u32 d;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(d) : "r"(a), "r"(b), "r"(sel));
    return d;
}

// Producer warps 1 .. kTransposeWarps (warp tw = warp - 1): every V tile the producer thread loads
// (raw ring position j: tile j % 2, in the order of the K / V ring) becomes ring stage s's Vt, in
// the layout the host's pre-pass wrote (cuda/flash_fp8_vt.cu): row d (head-dim column d) of 128 key
// bytes, 128-byte swizzle (chunk c of row d at d * 128 + (c ^ d % 8) * 16), column 16 h + 4 t + e
// of each 16 holding key 16 h + 2 t + (e & 1) + 8 (e >> 1), the order of P's registers (pack_p).
//
// The raw tile is K's layout (key row r, chunk c of head-dim bytes 16 c .. at r * 128 + (c ^ r %
// 8) * 16). A unit is 16 keys (h) x 32 head-dim bytes (chunks 2 cp, 2 cp + 1): one ldmatrix .x4
// .trans reads it as four 8 x 8 matrices of 16-bit pairs (matrix i: keys 16 h + 8 (i & 1) .., chunk
// 2 cp + (i >> 1); its eight row addresses in eight distinct chunks: no bank conflict), so lane l
// = 4 jj + q holds, of head-dim pair d, d + 1 = 16 c + 2 jj, the keys ka = 16 h + 2 q, ka + 1 in
// m[2x] and ka + 8, ka + 9 in m[2x + 1] (bytes: v[ka][d], v[ka][d+1], v[ka+1][d], v[ka+1][d+1]).
// Two byte permutes give Vt row d's word at column 16 h + 4 q (keys ka, ka+1, ka+8, ka+9: exactly
// the permuted order) and row d + 1's, which is stmatrix's layout (lane 4 jj + q: row jj, word q)
// for four matrices of eight Vt rows each (rows 16 c + 2 r, or + 1, chunk h): one stmatrix .x4 a
// unit. (Its rows 2 r share four swizzle phases: a 2-way bank conflict; selecting rows d / d + 1 by
// lane to avoid it cost 4 SEL a unit, and the stores' instructions, not their bank cycles, are
// what the consumer warps on the same schedulers feel.)
// tests/test_fp8_transpose_model.py replays these addresses and permutes in NumPy.
__device__ __forceinline__ void transpose_v_tiles(const Smem& sm, const volatile int* stop, int tw, int lane) {
    const int mi = lane >> 3, mj = lane & 7;             // ldmatrix / stmatrix: matrix, row
    const u32 ld_row = (8 * (mi & 1) + mj) * 128;
    // stmatrix: matrix mi is Vt rows 16 (2 cp + (mi >> 1)) + 2 r + (mi & 1), r = mj (FS_FP8_TRANSPOSE_SEL,
    // measurement: rows r >= 4 of each matrix pair swapped, 2 r + 1 - (mi & 1), so that each
    // matrix's rows fall in eight swizzle phases: no bank conflict, for 4 SEL a unit)
#ifndef FS_FP8_TRANSPOSE_SEL
#define FS_FP8_TRANSPOSE_SEL 0
#endif
    const bool swap_hi = FS_FP8_TRANSPOSE_SEL && (lane >> 4) != 0;  // this lane's registers: rows jj >= 4
    const int st_r = 2 * mj + (FS_FP8_TRANSPOSE_SEL && mj >= 4 ? 1 - (mi & 1) : (mi & 1));
    const u32 st_row = ((mi >> 1) * 16 + st_r) * 128;
    int s = 0;
    u32 phase = 0;
    for (u32 j = 0;; ++j) {
        const int r = j & 1;
        mbar_wait(sm.full_vr(r), (j >> 1) & 1);
        // (lane 0 reads the flag, the lane that arrives on empty_vr below: racecheck cannot see
        // other lanes' reads ordered before that arrival)
        if (__shfl_sync(0xffffffffu, lane == 0 ? stop[r] : 0, 0)) return;
        mbar_wait(sm.empty_v(s), phase ^ 1);  // (a fresh barrier passes parity 1 at once)
        const u32 src = sm.vr(r), dst = sm.v(s);
        // kTransposeDepth units' loads in flight before their stores (FS_FP8_TRANSPOSE_DEPTH,
        // measurement: a unit's ldmatrix waits on the shared-memory pipe the consumers' wgmmas
        // stream through)
#pragma unroll 1
        for (int u0 = tw; u0 < 32; u0 += kTransposeDepth * kTransposeWarps) {
            u32 m[kTransposeDepth][4];
#pragma unroll
            for (int k = 0; k < kTransposeDepth; ++k) {
                const int u = u0 + k * kTransposeWarps, h = u >> 2, cp = u & 3;
                if (u < 32)  // (uniform in the warp)
                    ldsm_x4_trans(m[k], src + h * 2048 + ld_row + (((2 * cp + (mi >> 1)) ^ mj) << 4));
            }
#pragma unroll
            for (int k = 0; k < kTransposeDepth; ++k) {
                const int u = u0 + k * kTransposeWarps, h = u >> 2, cp = u & 3;
                if (u >= 32) break;
                const u32 a0 = byte_perm(m[k][0], m[k][1], 0x6420), a1 = byte_perm(m[k][0], m[k][1], 0x7531);
                const u32 b0 = byte_perm(m[k][2], m[k][3], 0x6420), b1 = byte_perm(m[k][2], m[k][3], 0x7531);
                stsm_x4(dst + cp * 32 * 128 + st_row + ((h ^ (st_r & 7)) << 4), swap_hi ? a1 : a0,
                        swap_hi ? a0 : a1, swap_hi ? b1 : b0, swap_hi ? b0 : b1);
            }
        }
        fence_proxy_async();  // the generic stores, before wgmma (the async proxy) reads them
        __syncwarp();
        if (lane == 0) {
            mbar_arrive(sm.empty_vr(r));
            mbar_arrive(sm.full_v(s));
        }
        if (++s == kStages) {
            s = 0;
            phase ^= 1;
        }
    }
}
#endif

// The Q tile (rows row0.. of (head, batch)): kQBoxRows-row boxes, completing on bar.
__device__ __forceinline__ void tma_q(u32 dst, const TensorMap* map, int row0, int head, int batch, u32 bar) {
    mbar_arrive_expect_tx(bar, kQBytes);
#pragma unroll
    for (int cb = 0; cb < kColBlocks; ++cb)
#pragma unroll
        for (int r = 0; r < kBlockM / kQBoxRows; ++r)
            tma_load_4d(dst + cb * kQColBlock + r * kQBoxRows * 128, map, cb * kBoxCols, row0 + r * kQBoxRows, head, batch,
                        bar);
}

// S = Q K^T for this warpgroup's 64 rows (issued, committed, not waited for).
// The descriptors are formed once (Q's at the tile loop's start, K's a call) and stepped by
// `desc_at`, one add a k-step: formed every step, each cost ~5 uniform instructions (mask,
// shift, or, move) in the issue slots the softmax needs (hd64: ~60 of ~500 a tile).
__device__ __forceinline__ void issue_qk(float (&acc_s)[kSRegs], u64 dQ_wg, u32 sK) {
    const u64 dk = wgmma_desc(sK, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
        const u32 koff = (kk >> 2) * kColBlockBytes + (kk & 3) * 32;
        const u32 qoff = (kk >> 2) * kQColBlock + (kk & 3) * 32;
#if FS_FP8
        wgmma_ss_e4m3<kBlockN>(acc_s, desc_at(dQ_wg, qoff), desc_at(dk, koff), kk > 0 ? 1 : 0);
#else
        wgmma_ss<kBlockN, FS_DTYPE, 0>(acc_s, desc_at(dQ_wg, qoff), desc_at(dk, koff), kk > 0 ? 1 : 0);
#endif
    }
    wgmma_commit();
}

// O += P V (issued, committed, not waited for): 16 keys = 16 rows of 128 bytes per k-step; LBO
// steps to the next 64-column block of head_dim. At head dim 256 each k-step is two kPvN-column
// wgmmas, the second on O's upper half and V's column blocks 2 and 3.
__device__ __forceinline__ void issue_pv(float (&acc_o)[kORegs], const u32 (&pa)[kPSteps][4], u32 sV) {
#if FS_FP8
    // Vt: kHeadDim rows (N) of kBlockN key bytes (K), K-major like K's tile; 32 keys a k-step
    const u64 dvt = wgmma_desc(sV, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) wgmma_rs_e4m3<kHeadDim>(acc_o, pa[kk], desc_at(dvt, kk * 32), 1);
    wgmma_commit();
#else
    const u64 dv = wgmma_desc(sV, kColBlockBytes, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
        for (int nb = 0; nb < kHeadDim / kPvN; ++nb)
            wgmma_rs<kPvN, FS_DTYPE, 1>(reinterpret_cast<float(&)[kPvN / 2]>(acc_o[nb * (kPvN / 2)]), pa[kk],
                                        desc_at(dv, kk * 16 * 128 + nb * (kPvN / 64) * kColBlockBytes), 1);
    wgmma_commit();
#endif
}

__device__ __forceinline__ void rescale_o(float (&acc_o)[kORegs], const float (&alpha)[2]) {
#pragma unroll
    for (int d = 0; d < kHeadDim / 8; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc_o[4 * d + e] *= alpha[e >> 1];
}

// The max of row h (0: the thread's first row, 1: eight below) of S over the quad's columns,
// starting from init.
__device__ __forceinline__ float row_max_of(const float (&acc_s)[kSRegs], int h, float init) {
    float mx = init;
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) mx = fmaxf(mx, fmaxf(acc_s[4 * j + 2 * h], acc_s[4 * j + 2 * h + 1]));
    return quad_max(mx);
}

// Row h of S turned into P = 2^(S scale_log2 - base) in place; returns sum plus this thread's
// part of the row's P. FS_EXP_POLY of every 16 column pairs (spread evenly) exponentiate on the
// FMA pipe (ex2_fma, common/math.cuh), the rest on MUFU (16 lanes a clock an SM: at head dim 64 as
// many exps a clock as the tensor cores' GEMM work on the same scores). Off by default: measured,
// it pays only where MUFU also runs the softcap's tanh (src/ops/attention_tma.rs, exp_poly).
__device__ __forceinline__ float exp_row(float (&acc_s)[kSRegs], int h, float scale_log2, float base, float sum) {
#pragma unroll
    for (int j = 0; j < kBlockN / 8; ++j) {
        const float a0 = fmaf(acc_s[4 * j + 2 * h], scale_log2, -base);
        const float a1 = fmaf(acc_s[4 * j + 2 * h + 1], scale_log2, -base);
        const bool fma_pipe = (j * FS_EXP_POLY) % 16 < FS_EXP_POLY;
        const float p0 = fma_pipe ? ex2_fma(a0) : ex2(a0);
        const float p1 = fma_pipe ? ex2_fma(a1) : ex2(a1);
        acc_s[4 * j + 2 * h] = p0;
        acc_s[4 * j + 2 * h + 1] = p1;
        sum += p0 + p1;
    }
    return sum;
}

// Masks (where the tile needs it) and turns S into P in place, updating the running max and sum;
// alpha receives the factor O must be rescaled by. Returns whether O needs that rescale (false:
// alpha is 1 for every row of the warp).
//
// kConditional (the pipelined / ping-pong schedules): the exponent base (row_max) moves only when a
// row of the warp meets a score more than 2^kRescaleLog2 above it (FlashAttention-4's conditional
// rescale): P then stays below 2^kRescaleLog2 (exact in fp32, rounded to 16 bits with the same
// relative error), O and the sums stay in fp32, and most tiles after the first few skip alpha and
// O's rescale. Measured on the H200 (2026-12-02, in one process): head dim 128 ping-pong +2-8%;
// the plain schedule (head dim 64's three warpgroups) 3-6% slower with it (the vote and branch
// sit between the row max and the exponentials there), so it keeps the rescale every tile.
template <bool kConditional>
__device__ __forceinline__ bool mask_softmax(float (&acc_s)[kSRegs], float (&row_max)[2], float (&row_sum)[2],
                                             float (&alpha)[2], const FlashFwdParams& p, int n0, int m0,
                                             long long diag, int row_in_tile, int t, ScoreScale sc,
                                             int sk) {
    const float scale_log2 = sc.log2;
    // the keys: the tile's sequence's (varlen), else the problem's, read where used (as before:
    // a local copy moves the parameter load, and the dense SASS with it)
#if FS_VARLEN
#define F90T_SEQLEN_K sk
#else
#define F90T_SEQLEN_K p.seqlen_k
    (void)sk;
#endif
#if FS_HAS_SOFTCAP
    // the capped score tanh(scale q.k / cap), before the mask (the softmax scales it by cap)
#pragma unroll
    for (int i = 0; i < kSRegs; ++i) acc_s[i] = tanh_softcap<FS_DTYPE>(acc_s[i] * sc.pre);
#endif
    // Decided per warp (its 16 rows: row_in_tile & ~15 ..), not per tile: under a causal mask
    // only the warps the diagonal crosses pay for the mask.
    bool need_mask = n0 + kBlockN > F90T_SEQLEN_K;
#if FS_HAS_MASK
    const long long warp_row = (long long)m0 + (row_in_tile & ~15) + diag;  // in key coordinates
    if (p.window_left >= 0 && n0 < warp_row + 15 - p.window_left) need_mask = true;
    if (p.window_right >= 0 && n0 + kBlockN - 1 > warp_row + p.window_right) need_mask = true;
#endif
    if (need_mask) {
        // Each of this thread's two rows sees the keys col0 + k with k_lo <= k <= k_hi (its columns
        // are col0 + 8j + b, b < 2): two limits a row, then one or two compares an element against
        // a constant k.
        const long long col0 = (long long)n0 + 2 * t;
        int k_hi[2], k_lo[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            long long hi = (long long)F90T_SEQLEN_K - 1, lo = 0;
#if FS_HAS_MASK
            const long long row = (long long)m0 + row_in_tile + 8 * h + diag;
            if (p.window_right >= 0) hi = min(hi, row + p.window_right);
            if (p.window_left >= 0) lo = row - p.window_left;
#endif
            k_hi[h] = (int)max(-1LL, min(hi - col0, (long long)kBlockN));
            k_lo[h] = (int)max(0LL, min(lo - col0, (long long)kBlockN));
        }
        if (!FS_HAS_MASK || p.window_left < 0) {
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)
                    if (j * 8 + (e & 1) > k_hi[e >> 1]) acc_s[4 * j + e] = neg_inf();
        } else {
#pragma unroll
            for (int j = 0; j < kBlockN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int k = j * 8 + (e & 1);
                    if (k > k_hi[e >> 1] || k < k_lo[e >> 1]) acc_s[4 * j + e] = neg_inf();
                }
        }
    }
    if constexpr (!kConditional) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float mx = row_max_of(acc_s, h, row_max[h]);
            // A row with nothing visible yet keeps max -inf: base 0 so exp2 gives 0, not NaN.
            const float base = (mx == neg_inf()) ? 0.0f : mx * scale_log2;
            alpha[h] = ex2(row_max[h] * scale_log2 - base);
            row_max[h] = mx;
            // this thread's columns; quad-reduced at the end
            row_sum[h] = exp_row(acc_s, h, scale_log2, base, row_sum[h] * alpha[h]);
        }
        return true;
    }
    float tmx[2];
    bool grow = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        tmx[h] = row_max_of(acc_s, h, neg_inf());
        // (-inf - -inf is NaN: false, a row with nothing visible yet stays at -inf)
        grow |= (tmx[h] - row_max[h]) * scale_log2 > kRescaleLog2;
    }
    const bool rescale = __any_sync(0xffffffffu, grow);
    if (rescale) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float mx = fmaxf(row_max[h], tmx[h]);
            alpha[h] = (mx == neg_inf()) ? 1.0f : ex2((row_max[h] - mx) * scale_log2);
            row_max[h] = mx;
            row_sum[h] *= alpha[h];
        }
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        // A row with nothing visible yet keeps max -inf: base 0 so exp2 gives 0, not NaN.
        const float base = (row_max[h] == neg_inf()) ? 0.0f : row_max[h] * scale_log2;
        row_sum[h] = exp_row(acc_s, h, scale_log2, base, row_sum[h]);  // (quad-reduced at the end)
    }
    return rescale;
#undef F90T_SEQLEN_K
}

// P (rounded to the input type) as the register A operand of O += P V.
__device__ __forceinline__ void pack_p(u32 (&pa)[kPSteps][4], const float (&acc_s)[kSRegs]) {
#if FS_FP8
    // k-step kk: S's n8 slabs 4 kk .. 4 kk + 3 (keys 32 kk ..), rows g (a[0], a[2]) and g + 8 (a[1],
    // a[3]); each register the four keys {2t, 2t+1, 8+2t, 9+2t} of a 16 (Vt stores them permuted)
#pragma unroll
    for (int kk = 0; kk < kPSteps; ++kk) {
        const float* s = acc_s + 16 * kk;
        pa[kk][0] = pack_e4m3x4(s[0], s[1], s[4], s[5]);
        pa[kk][1] = pack_e4m3x4(s[2], s[3], s[6], s[7]);
        pa[kk][2] = pack_e4m3x4(s[8], s[9], s[12], s[13]);
        pa[kk][3] = pack_e4m3x4(s[10], s[11], s[14], s[15]);
    }
#else
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
        for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<FS_DTYPE>(acc_s[8 * kk + 2 * e], acc_s[8 * kk + 2 * e + 1]);
#endif
}

}  // namespace f90t

// grid = (ceil(seqlen_q / FS_BLOCK_M), nheads, batch), persistent (min(tiles, SMs), 1, 1); block =
// 128 * (1 + FS_BLOCK_M / 64), dynamic smem = attention_tma::smem_bytes.
extern "C" __global__ void __launch_bounds__(f90t::kThreads, 1)
    flash_fwd_sm90_tma_kernel(const __grid_constant__ FlashFwdTmaParams P) {
    using namespace f90t;
    const FlashFwdParams& p = P.p;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw_base = smem_u32(smem_raw);
    const u32 s_base = (raw_base + 1023u) & ~1023u;  // swizzle atoms need 1024-byte alignment
    unsigned char* smem = smem_raw + (s_base - raw_base);
    const Smem sm{s_base};

    const int tid = threadIdx.x;
    const int wg = tid >> 7;
    const int lane = tid & 31;
    const TileSched sched(P);
    const long long diag = (long long)p.seqlen_k - p.seqlen_q;  // bottom-right alignment offset

#if FS_SM90_PERSIST
    const auto work_of = [&](int t) { return sched.work(p, t, diag); };
#else
    const TileWork w0 = sched.work(p, 0, diag);  // the block's one tile, for both roles
    if (FS_VARLEN && w0.rows_q <= 0) return;     // past its sequence's end (uniform per block)
    if (w0.n_begin >= w0.n_end) {          // (uniform per block)
        store_empty_tile(p, w0, tid, kThreads);
        return;
    }
    const auto work_of = [&](int) { return w0; };
#endif

    if (tid == 0) {
        mbar_init(sm.bar_q(), 1);
        for (int s = 0; s < kStages; ++s) {
            mbar_init(sm.full_k(s), 1);
            mbar_init(sm.full_v(s), FS_FP8_VT ? kTransposeWarps : 1);
            mbar_init(sm.empty_k(s), kEmptyArrivals);
            mbar_init(sm.empty_v(s), kEmptyArrivals);
        }
        if (FS_SM90_PERSIST) mbar_init(sm.q_empty(), kEmptyArrivals);
        if (kQueue)
            for (int i = 0; i < 2; ++i) {
                mbar_init(sm.tile_full(i), 1);
                mbar_init(sm.tile_free(i), kEmptyArrivals);
            }
#if FS_FP8_VT
        for (int i = 0; i < kVrStages; ++i) {
            mbar_init(sm.full_vr(i), 1);
            mbar_init(sm.empty_vr(i), kTransposeWarps);
            *reinterpret_cast<volatile int*>(smem + (sm.vr_stop(i) - s_base)) = 0;
        }
#endif
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        // ================= producer =================
        setmaxnreg_dec<kProducerRegs>();
        if (tid == 0) {
            int s = 0;
            u32 phase = 0, it = 0;  // ring position; tiles loaded
#if FS_FP8_VT
            u32 jv = 0;  // V tiles loaded (the raw tiles' ring position)
#endif
#if FS_SM90_PERSIST == 2
            // Every tile index taken (the last one past the end: the consumers' stop) goes to the
            // consumers through the two slots; the next is taken once this tile's loads are issued,
            // a few KV tiles before the consumers need it, so that the counter's latency hides and
            // the tiles stay with whichever CTA frees first.
            u32 handed = 0;
            int* const slots = reinterpret_cast<int*>(smem + (sm.tile_slot(0) - s_base));
            const auto hand = [&](int t) {
                const int i = handed & 1;
                mbar_wait(sm.tile_free(i), ((handed >> 1) & 1) ^ 1);  // (a fresh barrier: no wait)
                slots[i] = t;
                mbar_arrive(sm.tile_full(i));  // (release: the slot's store is seen first)
                ++handed;
                return t;
            };
            // (taking the next index as the current tile starts instead measured no faster, H200
            // 2026-12-02: benches/results/2026-12-02-h200-attention-queue/)
            const auto take_next = [&]() { return hand(atomicAdd(P.tile_counter, 1) + (int)gridDim.x); };
            for (int t = hand(sched.first()); t < sched.total; t = take_next()) {
#else
            for (int t = sched.first(); t < sched.total; t += sched.stride()) {
#endif
                const TileWork w = work_of(t);
                if (FS_SM90_PERSIST && w.n_begin >= w.n_end) continue;  // (else: returned above)
                // the previous tile's last S = Q K^T completed in every consumer warp (a fresh
                // barrier passes parity 1 at once: the first tile does not wait)
                if (FS_SM90_PERSIST) mbar_wait(sm.q_empty(), (it & 1) ^ 1);
                // TMA coordinates: varlen, the packed rows of the sequence (the maps' batch 0);
                // dense, the tile's rows of its batch (macros: the dense SASS stays)
#if FS_VARLEN
#define F90T_KV_ROW(n) (w.k_row + (n) * kBlockN)
#define F90T_MAP_B 0
                tma_q(sm.q(), &P.tm_q, w.q_row, w.head, F90T_MAP_B, sm.bar_q());
#else
#define F90T_KV_ROW(n) ((n) * kBlockN)
#define F90T_MAP_B w.batch
                tma_q(sm.q(), &P.tm_q, w.m0, w.head, F90T_MAP_B, sm.bar_q());
#endif
                for (int n = w.n_end - 1; n >= w.n_begin; --n) {
                    // a fresh empty barrier passes parity 1 at once: the first lap does not wait
                    mbar_wait(sm.empty_k(s), phase ^ 1);
                    tma_tile(sm.k(s), &P.tm_k, F90T_KV_ROW(n), w.head_k, F90T_MAP_B, sm.full_k(s));
#if FS_FP8_VT
                    // V as stored into a raw tile; the transposing warps fill stage s's Vt from it
                    mbar_wait(sm.empty_vr(jv & 1), ((jv >> 1) & 1) ^ 1);
                    tma_tile(sm.vr(jv & 1), &P.tm_v, F90T_KV_ROW(n), w.head_k, F90T_MAP_B, sm.full_vr(jv & 1));
                    ++jv;
#elif FS_FP8
                    mbar_wait(sm.empty_v(s), phase ^ 1);
                    tma_vt(sm.v(s), &P.tm_v, n * kBlockN, w.head_k, w.batch, sm.full_v(s));
#else
                    mbar_wait(sm.empty_v(s), phase ^ 1);
                    tma_tile(sm.v(s), &P.tm_v, F90T_KV_ROW(n), w.head_k, F90T_MAP_B, sm.full_v(s));
#endif
                    if (++s == kStages) {
                        s = 0;
                        phase ^= 1;
                    }
                }
                ++it;
#undef F90T_KV_ROW
#undef F90T_MAP_B
            }
#if FS_FP8_VT
            // no more V tiles: the next raw tile's arrival carries the stop flag instead
            mbar_wait(sm.empty_vr(jv & 1), ((jv >> 1) & 1) ^ 1);
            *reinterpret_cast<volatile int*>(smem + (sm.vr_stop(jv & 1) - s_base)) = 1;
            mbar_arrive(sm.full_vr(jv & 1));  // (release: the flag's store is seen first)
#endif
#if FS_SM90_PERSIST == 2
            // Every index is taken (this CTA's last was past the end): the last CTA here zeroes
            // the counters for the next launch on the stream (launches on one stream do not
            // overlap; the host gives each stream its own pair, or fresh scratch).
            if (atomicAdd(P.tile_counter + 1, 1) == (int)gridDim.x - 1) {
                atomicExch(P.tile_counter, 0);
                atomicExch(P.tile_counter + 1, 0);
            }
#endif
        }
#if FS_FP8_VT
        else if (tid >= 32 && tid < 32 * (1 + kTransposeWarps)) {
            transpose_v_tiles(sm, reinterpret_cast<const volatile int*>(smem + (sm.vr_stop(0) - s_base)),
                              (tid >> 5) - 1, lane);
        }
#endif
    } else {
        // ================= consumers =================
        setmaxnreg_inc<kConsumerRegs>();
        const int cw = wg - 1;  // query rows [64 cw, 64 cw + 64)
        const int tid_wg = tid & 127;
        const int warp_in_wg = tid_wg >> 5;
        const int g = lane >> 2, t = lane & 3;
        const int row_in_tile = cw * 64 + warp_in_wg * 16 + g;
        const u32 sQ_wg = sm.q() + cw * 64 * 128;  // this warpgroup's 64 rows inside each column block
        const u64 q_desc = wgmma_desc(sQ_wg, 16, 1024);  // its k-steps: desc_at
        const ScoreScale sc = score_scale<FS_HAS_SOFTCAP>(p.softmax_scale, p.softcap);
        unsigned char* const s_o = smem + (sm.o() - s_base);

#if FS_SM90_PINGPONG
        // Turn-taking, round robin: consumer 0 issues first, then 1, ... Each warpgroup issues
        // N + 1 slots a tile (the first S, the loop's, the last P V) and passes the turn to the
        // next after each; the last consumer's opening arrival stands in for its last pass, so
        // arrivals and waits balance on every barrier by the end of each tile.
        const auto turn_wait = [&]() { named_bar_sync(kTurnBar + cw, 256); };
        const auto turn_pass = [&](bool last) {
            if (!(last && cw == kNC - 1)) named_bar_arrive(kTurnBar + (cw + 1) % kNC, 256);
        };
#elif FS_SM90_PIPE
        const auto turn_wait = []() {};
        const auto turn_pass = [](bool) {};
#endif
        int s = 0;
        u32 phase = 0, it = 0;  // ring position; tiles computed
#if FS_SM90_PERSIST == 2
        // the producer's tile indices, in order: lane 0 of each warp takes one from its slot and
        // frees the slot, the warp shares it
        u32 taken = 0;
        const int* const slots = reinterpret_cast<const int*>(smem + (sm.tile_slot(0) - s_base));
        const auto take = [&]() {
            int t = 0;
            if (lane == 0) {
                const int i = taken & 1;
                mbar_wait(sm.tile_full(i), (taken >> 1) & 1);
                t = slots[i];
                mbar_arrive(sm.tile_free(i));  // (release: the read completes first)
            }
            ++taken;
            return __shfl_sync(0xffffffffu, t, 0);
        };
        for (int tile = take(); tile < sched.total; tile = take()) {
#else
        for (int tile = sched.first(); tile < sched.total; tile += sched.stride()) {
#endif
            const TileWork w = work_of(tile);
            if (FS_SM90_PERSIST && w.n_begin >= w.n_end) {  // (the one-tile grid returned above)
                store_empty_tile(p, w, tid - 128, kNC * 128);
                continue;
            }
            const int m0 = w.m0, rows_q = w.rows_q, n_begin = w.n_begin, n_end = w.n_end;
            // the tile's keys and bottom-right offset (dense: the problem's diag, and mask_softmax
            // reads p.seqlen_k, as before: the dense SASS stays)
#if FS_VARLEN
#define F90T_TILE_DIAG w.dg
#define F90T_TILE_SK w.sk
#else
#define F90T_TILE_DIAG diag
#define F90T_TILE_SK 0
#endif
            char* const o_ptr = w.o_ptr;
            float* const lse_ptr = w.lse_ptr;
#if FS_FP8
            // the tile's descales: q x k into the score scale, v into the output's normaliser
            ScoreScale sc_t = sc;
            sc_t.log2 *= fp8_descale(P.f8.q, w.batch, w.head_k) * fp8_descale(P.f8.k, w.batch, w.head_k);
            const float ds_v = fp8_descale(P.f8.v, w.batch, w.head_k);
#define F90T_SC sc_t
#else
#define F90T_SC sc
#endif

            float acc_o[kORegs];
#pragma unroll
            for (int i = 0; i < kORegs; ++i) acc_o[i] = 0.0f;
            float row_max[2] = {neg_inf(), neg_inf()};
            float row_sum[2] = {0.0f, 0.0f};
            float alpha[2];
#if FS_SM90_PIPE
            bool resc = true;  // O's rescale for the previous tile's alpha, applied a step later
#endif
            u32 pa[kPSteps][4];
#if FS_SM90_PINGPONG
            if (cw == kNC - 1) named_bar_arrive(kTurnBar, 256);
#endif
            mbar_wait(sm.bar_q(), it & 1);
#if FS_SM90_PIPE
            // The first tile alone (nothing to overlap with), so that every iteration of the loop has
            // the same two groups in flight: ptxas then sees that wait<1> completes S(i), and does
            // not inject a wait for P(i-1) V(i-1) before the softmax (C7517), which it does when the
            // first iteration is a branch inside the loop.
            int n = n_end - 1;
            {
                float acc_s[kSRegs];
                mbar_wait(sm.full_k(s), phase);
                turn_wait();
                issue_qk(acc_s, q_desc, sm.k(s));
                turn_pass(false);
                wgmma_wait<0>();
                reg_fence(acc_s);
                if (lane == 0) mbar_arrive(sm.empty_k(s));
                resc = mask_softmax<kCondRescale>(acc_s, row_max, row_sum, alpha, p, n * kBlockN, m0, F90T_TILE_DIAG,
                                         row_in_tile, t, F90T_SC, F90T_TILE_SK);
                pack_p(pa, acc_s);
            }
            int s_prev = s;
            u32 phase_prev = phase;
            if (++s == kStages) {
                s = 0;
                phase ^= 1;
            }
            for (--n; n >= n_begin; --n) {
                float acc_s[kSRegs];
                mbar_wait(sm.full_k(s), phase);
                mbar_wait(sm.full_v(s_prev), phase_prev);
                if (resc) rescale_o(acc_o, alpha);
                reg_fence(acc_o);
                turn_wait();
                issue_qk(acc_s, q_desc, sm.k(s));
                issue_pv(acc_o, pa, sm.v(s_prev));
                turn_pass(false);
                wgmma_wait<1>();  // S(i) done; P(i-1) V(i-1) may still run
                reg_fence(acc_s);
                if (lane == 0) mbar_arrive(sm.empty_k(s));
                resc = mask_softmax<kCondRescale>(acc_s, row_max, row_sum, alpha, p, n * kBlockN, m0, F90T_TILE_DIAG,
                                         row_in_tile, t, F90T_SC, F90T_TILE_SK);
                reg_fence(acc_s);
                // ptxas schedules wgmma_wait<0> near the top of its basic block, i.e. before the
                // exponentials, which then no longer overlap P V (seen in SASS). A side exit that
                // never fires (row sums are >= 0 or NaN) ends the block here, so the wait stays
                // after the softmax. Head dim 64 only: at 128 the live set (O 64 + P 32 + S 64
                // registers) under the 168-register entry budget makes ptxas serialise every wgmma
                // instead (C7512), so there the wait stays hoisted and ping-pong is the overlap.
                if constexpr (kHeadDim == 64) {
                    if (row_sum[0] == -1.0f) __trap();
                }
                wgmma_wait<0>();  // P(i-1) V(i-1) done: its V stage is free, its P registers reusable
                reg_fence(acc_o);
                if (lane == 0) mbar_arrive(sm.empty_v(s_prev));
                pack_p(pa, acc_s);
                s_prev = s;
                phase_prev = phase;
                if (++s == kStages) {
                    s = 0;
                    phase ^= 1;
                }
            }
            // every S of the tile completed: Q is free for the next tile's load
            if (FS_SM90_PERSIST && lane == 0) mbar_arrive(sm.q_empty());
            if (resc) rescale_o(acc_o, alpha);
            reg_fence(acc_o);
            mbar_wait(sm.full_v(s_prev), phase_prev);
            turn_wait();
            issue_pv(acc_o, pa, sm.v(s_prev));
            turn_pass(true);
            wgmma_wait<0>();
            reg_fence(acc_o);
            if (lane == 0) mbar_arrive(sm.empty_v(s_prev));
#else
            // KV tiles [wn_end, n_end), walked first, hold no key visible to a row of this
            // warpgroup (the diagonal tile's upper rows under a causal mask, where 64-row groups
            // and 128-key tiles do not align; every tile for rows past seqlen_q: the last query
            // block's third warpgroup when seqlen_q % 192 <= 128): the warpgroup only passes
            // their stages on, after they landed (so that its arrivals stay in the stage's lap).
            // (Tiles hidden from a warpgroup by a left window, walked last, are computed masked.
            // Masked persistent builds only: in the one-tile kernel at 192 rows it spilled the
            // output pointer, NVRTC 13.0, and masked problems there have seqlen_k > 8192, where it
            // saves ~1%; unmasked, only the last query block's third warpgroup is idle, and the
            // stride's loop measured 3% slower with it, H200 2026-12-02.)
            int n = n_end - 1;
#if FS_SM90_PERSIST && FS_HAS_MASK
            {
                const int r_lo = cw * 64;  // this warpgroup's first and last valid rows in the tile
                const int r_hi = min(r_lo + 63, rows_q - 1);
                int wn_end = r_lo > r_hi ? n_begin : n_end;
                if (p.window_right >= 0) {
                    // the last key any of its rows sees (clamped: windows past seqlen_k see all)
                    const int hi = (int)min((long long)m0 + r_hi + diag + p.window_right, (long long)p.seqlen_k);
                    wn_end = hi < 0 ? n_begin : max(n_begin, min(hi / kBlockN + 1, wn_end));
                }
                for (; n >= wn_end; --n) {
                    mbar_wait(sm.full_k(s), phase);
                    if (lane == 0) mbar_arrive(sm.empty_k(s));
                    if (n == n_begin && lane == 0) mbar_arrive(sm.q_empty());
                    mbar_wait(sm.full_v(s), phase);
                    if (lane == 0) mbar_arrive(sm.empty_v(s));
                    if (++s == kStages) {
                        s = 0;
                        phase ^= 1;
                    }
                }
            }
#endif
            for (; n >= n_begin; --n) {
                float acc_s[kSRegs];
                mbar_wait(sm.full_k(s), phase);
                issue_qk(acc_s, q_desc, sm.k(s));
                wgmma_wait<0>();
                reg_fence(acc_s);
                if (lane == 0) mbar_arrive(sm.empty_k(s));
                if (FS_SM90_PERSIST && n == n_begin && lane == 0) mbar_arrive(sm.q_empty());  // (the tile's last S)
                mask_softmax<false>(acc_s, row_max, row_sum, alpha, p, n * kBlockN, m0, F90T_TILE_DIAG,
                                    row_in_tile, t, F90T_SC, F90T_TILE_SK);
                rescale_o(acc_o, alpha);
                pack_p(pa, acc_s);
                reg_fence(acc_o);
                mbar_wait(sm.full_v(s), phase);
                issue_pv(acc_o, pa, sm.v(s));
                wgmma_wait<0>();
                reg_fence(acc_o);
                if (lane == 0) mbar_arrive(sm.empty_v(s));
                if (++s == kStages) {
                    s = 0;
                    phase ^= 1;
                }
            }
#endif

            // ---- epilogue: normalise, LSE, stage O in this warpgroup's rows (of the Q tile, or of
            // the O buffer when persistent), store ----
            // This warpgroup read only its own Q rows, and its last wgmma on them completed above;
            // persistent: every thread of the warpgroup is past the previous tile's reads of its O rows.
            if (FS_SM90_PERSIST) named_bar_sync(1 + cw, 128);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float sum = quad_sum(row_sum[h]);
#if FS_FP8
                const float inv = sum > 0.0f ? rcp(sum) * ds_v : 0.0f;
#else
                const float inv = sum > 0.0f ? rcp(sum) : 0.0f;
#endif
                const int row = row_in_tile + 8 * h;
                if (lse_ptr && t == 0 && row < rows_q)
                    lse_ptr[row] = sum > 0.0f ? (row_max[h] * F90T_SC.log2 + lg2(sum)) * kLn2 : neg_inf();
#pragma unroll
                for (int d = 0; d < kHeadDim / 8; ++d) {
                    const u32 v = pack2<kOutDtype>(acc_o[4 * d + 2 * h] * inv, acc_o[4 * d + 2 * h + 1] * inv);
                    *reinterpret_cast<u32*>(s_o + swz_offset(kBlockM, row, d * 8 + 2 * t)) = v;
                }
            }
            named_bar_sync(1 + cw, 128);
            const int c = tid_wg % kChunksPerRow;
            // (a padded head dim: the chunks past it are zero columns of the tile, not O's)
            const int row_end = c * 8 < p.head_dim ? min(cw * 64 + 64, rows_q) : 0;
            for (int r = cw * 64 + tid_wg / kChunksPerRow; r < row_end; r += 128 / kChunksPerRow) {
                const uint4 val = *reinterpret_cast<const uint4*>(s_o + swz_offset(kBlockM, r, c * 8));
                *reinterpret_cast<uint4*>(o_ptr + r * p.o_row_stride * 2 + c * 16) = val;
            }
            ++it;
        }
#undef F90T_TILE_DIAG
#undef F90T_TILE_SK
#undef F90T_SC
    }
}
