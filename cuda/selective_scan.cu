// Mamba selective scan, forward (mamba_ssm `selective_scan_fn` semantics), plus `initial_state`.
//
// Per batch row b, channel d, state n, timestep t:
//   dt     = delta[b,d,t] + delta_bias[d];  dt = softplus(dt) if asked (mamba: dt <= 20 ? log1p(e^dt) : dt)
//   x[n]   = exp(dt * A[d,n]) * x[n] + dt * B[n,t] * u[b,d,t]          (x starts at initial_state or 0)
//   y      = sum_n C[n,t] * x[n] + D[d] * u[b,d,t]
//   out    = y * silu(z[b,d,t])  (if z given)
// State and accumulation in fp32; u/delta/z/out in FS_IN_DTYPE; B/C in FS_BC_DTYPE.
//
// Cost model (H100): one exp per (b, d, t, n) on MUFU (16/clk/SM) is the floor; the inner loop is 5
// instructions per state (FMUL dt*A, MUFU.EX2, FMUL dtu*B, 2 FFMA). The second limit is shared memory ->
// register bandwidth (128 B/clk/SM, broadcasts included): per step a lane reads B and C of its kNS
// states and (dt, dt*u) of its kCPT channels, 8*kNS + 8*kCPT bytes for kNS*kCPT state updates, so each
// lane works on kCPT channels at once (register blocking: one B/C read serves kCPT channels).
//
// Work split.
//   block  = kSlots * kCPT channels of one batch row b (channels d0 .. d0 + chans_per_block - 1,
//            all in one B/C group) and one sequence chunk [c * chunk_len, min((c + 1) * chunk_len, seqlen)).
//   slot   = kSplit consecutive lanes of a warp; it owns the kCPT channels slot*kCPT + q (q < kCPT);
//            lane s of the slot owns kNS states of each of them (in registers, for the whole chunk),
//            laid out in float4 groups interleaved across the lanes:
//            state n(s, j) = (j / kVG) * kSplit * kVG + s * kVG + j % kVG, j < kNS.
//   time   = tiles of kT timesteps; lane s of a channel also owns the tile's timestep slice
//            s*kTS .. s*kTS + kTS - 1 (kTS = kT / kSplit) for everything done once per (channel, t).
//   Per tile:
//     1. the block stages the B/C tile in shared memory as fp32 sB/sC[kT][kRow] (all its channels share it);
//     2. each lane computes dt (bias, softplus) for its slice and its kCPT channels and stores
//        (dt*log2(e), dt*u), zero past the sequence end, as float2 in sDT[slot][t][q];
//     3. __syncthreads, then the loads of tile k+1 (delta, u, z slices; B/C) are issued (register prefetch);
//     4. the recurrence: per t a lane reads (dt*log2(e), dt*u) of its kCPT channels and its states' B, C, updates
//        its kCPT*kNS states and writes its partial y to sY[lane][q][t] (a float4 per 4 steps);
//     5. __syncwarp, lane s sums the kSplit partials of its slice, adds D*u, multiplies by silu(z), stores.
//   sB, sC and sDT are double-buffered (tile k+1 writes the other buffer; its last readers finished
//   before tile k's barrier); sY is single: its next writes follow the next tile's barrier.
//   exp(dt*A) = exp2((dt*log2(e)) * A): sDT holds dt*log2(e) (A is used as loaded). FS_POLY_NUM of every 8 (t, state) exps are
//   evaluated by an FMA-pipe polynomial instead of MUFU.EX2 (MUFU does 16/clk/SM, FMA 128/clk/SM).
//
// Long sequences with few channels (chunked path, nchunks > 1, exact: the recurrence is linear):
//   1. selective_scan_chunk_state, grid.y = chunks 0..nchunks-2: scans its chunk from x = 0 and writes
//      the chunk's end state (chunk_state) and sum of dt (chunk_dtsum); the chunk's decay is
//      prod_t exp(dt_t*A[n]) = exp(A[n] * sum_t dt_t).
//   2. selective_scan_fwd, grid.y = chunks 0..nchunks-1: the block of chunk c starts from initial_state
//      (or 0), folds chunks 0..c-1: x = exp(A * dtsum[cc]) * x + chunk_state[cc], then scans its chunk
//      writing out. The last chunk writes last_state.
//
// Compile-time constants (emitted by the host prelude; those with a default below are optional):
//   FS_IN_DTYPE   u/delta/z/out dtype: 0 = fp16, 1 = bf16, 2 = fp32
//   FS_BC_DTYPE   B/C dtype, same coding
//   FS_DSTATE     padded state count (power of two, >= real dstate); padded states have A = B = C = 0
//   FS_NSPLIT     lanes per channel (power of two <= 32; divides FS_TILE_T and FS_DSTATE)
//   FS_TILE_T     timesteps per tile (multiple of 8 and of FS_NSPLIT; 32 at dstate <= 64)
//   FS_THREADS    threads per block; a block has FS_THREADS / FS_NSPLIT slots
//   FS_CPT        channels per slot (1, 2 or 4): register blocking over channels. Measured on the H100
//                 (2026-11-22, b8 d2048 L2048 bf16): 1 -> 294 us, 2 -> 341 us (half the warps; the kernel is
//                 latency-bound: MUFU pipe 49% busy, 7.8 warps/SM at FS_CPT 2). The host plan uses 1.
//                 H200 (2026-12-02, `FLASHSCAN_SCAN_TILES=nsplit,tile,threads,min_blocks,cpt`): slower
//                 at every plan tried, also with the warps kept (8 lanes x 2 channels at b32 d512 L60:
//                 11.5 vs 10.1 us, 2.4% more instructions: the epilogue's wider reduce outweighs the
//                 shared B / C reads)
//   FS_MIN_BLOCKS __launch_bounds__ min blocks per SM
//   FS_B_VARYING, FS_C_VARYING  1: (batch, ngroups, dstate, seqlen); 0: (dim, dstate)
//   FS_POLY_NUM   0..8: exps per 8 done by polynomial (0: measured slower at 1 and 2, 2026-11-22)
//   FS_PACK_BC    1 (default, not emitted by the host unless FLASHSCAN_SCAN_PACK_BC is set, a measurement
//                 override): packed 16-bit B/C staging, see kPackBCOk. Unpacked measured slower at every
//                 shape (2026-11-27, b32 d512 L60 12.1 vs 11.6 us, b8 d2048 L2048 292 vs 280 us)
//   FS_ARCH       e.g. 90 (informational)
//   FS_SAVE_STATES 1: also write the state at the end of every FS_SAVE_LEN-step chunk but the last into
//                 ScanParams::saved (extra trailing fields, this variant only) for the backward; 0 (default,
//                 not emitted): the struct and code are those of the plain forward
//   FS_IDX32      1: 32-bit index arithmetic (every byte offset of the call's tensors < 2^31: the host's
//                 check); 0 (default, not emitted): 64-bit. The short-sequence plans and, since
//                 2026-12-03, the long dstate-16 plans with B and C varying (H200, b8 d2048 L2048 271 ->
//                 264 us, L8192 1067 -> 1041, b2 d5120 L16384 1681 -> 1643: 4% fewer instructions, the
//                 tile loop's offsets)
// Everything else (D, z, delta_bias, softplus, initial/last state, chunking) is a runtime field of
// ScanParams: a uniform branch costs nothing measurable here.
// Dynamic shared memory (bytes) = 4 * (nB + nC + nDT + nY), nB = FS_B_VARYING*2*kT*kRow,
// nC = FS_C_VARYING*2*kT*kRow (0 for selective_scan_chunk_state; allocated but unused by the packed
// B/C path, see kPackBCOk), nDT = 4*kSlots*(kT+1)*FS_CPT,
// nY = FS_THREADS*FS_CPT*(kT+4) (0 for selective_scan_chunk_state),
// kRow = FS_DSTATE >= 4 ? FS_DSTATE + 4 : FS_DSTATE, kSlots = FS_THREADS/FS_NSPLIT.

#if !defined(FS_IN_DTYPE) || !defined(FS_BC_DTYPE) || !defined(FS_DSTATE) || !defined(FS_NSPLIT) || \
    !defined(FS_TILE_T) || !defined(FS_THREADS) || !defined(FS_B_VARYING) || !defined(FS_C_VARYING)
#error "the host prelude must define FS_IN_DTYPE, FS_BC_DTYPE, FS_DSTATE, FS_NSPLIT, FS_TILE_T, FS_THREADS, FS_B_VARYING and FS_C_VARYING"
#endif
#ifndef FS_MIN_BLOCKS
#define FS_MIN_BLOCKS 4
#endif
#ifndef FS_CPT
#define FS_CPT 1
#endif
#ifndef FS_POLY_NUM
#define FS_POLY_NUM 0
#endif
#ifndef FS_PACK_BC
#define FS_PACK_BC 1
#endif
#ifndef FS_SAVE_STATES
#define FS_SAVE_STATES 0
#endif
#ifndef FS_SAVE_LEN
#define FS_SAVE_LEN 256
#endif
#ifndef FS_IDX32
#define FS_IDX32 0
#endif

#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/math.cuh"

using namespace fs;

// 32-bit copies of every field the scan's setup reads, beside the setup's pointers at the head of the
// parameter block: a FS_IDX32 variant reads these (the host fills them for every call; only a call
// whose byte offsets fit in 31 bits takes such a variant, so they are exact there). Why: the block
// sits in the constant bank from 0x210; the 64-bit fields spread the setup's reads over all seven of
// its 64-byte lines, each a constant-cache miss the warps of a one-wave grid wait for in series at the
// start (ncu, H200, 2026-11-29: 76 of the setup's 194 stall samples). Here the setup's pointers and
// its 28 first fields fill the block's first three lines (0x210-0x2bf); nchunks and out's strides,
// read at the end, open the fourth. flags: bit 0 has_D, 1 has_z, 2 has_delta_bias, 3 softplus,
// 4 has_initial_state, 5 has_last_state.
struct ScanHot {
  int dim, seqlen, dstate, ngroups, chunk_len, blocks_per_row, chans_per_block, flags, io_align;
  int u_batch, u_dim, delta_batch, delta_dim, z_batch, z_dim;
  int A_dim, A_dstate, B_batch, B_group, B_dstate, C_batch, C_group, C_dstate, D_dim, delta_bias_dim;
  int init_batch, init_dim, init_dstate;
  int nchunks, out_batch, out_dim, pad_;
};
static_assert(sizeof(ScanHot) == 128, "ScanHot layout changed: update the host mirror");

// One by-value parameter block for both entries. Layout: the setup's 8 pointers, the 32-bit copies
// (ScanHot), 5 more pointers, then int64s, then int32s (no implicit padding; sizeof = 8*8 + 128 +
// 5*8 + 32*8 + 10*4 = 528). Strides are in elements.
struct ScanParams {
  const void* u;              // (batch, dim, seqlen)  FS_IN_DTYPE, seqlen stride 1
  const void* delta;          // (batch, dim, seqlen)  FS_IN_DTYPE, seqlen stride 1
  const float* A;             // (dim, dstate)
  const void* B;              // varying (batch, ngroups, dstate, seqlen) [seqlen stride 1] or fixed (dim, dstate)
  const void* C;              // same forms as B
  const float* D;             // (dim,) or null when !has_D
  const float* delta_bias;    // (dim,) or null when !has_delta_bias
  const void* z;              // (batch, dim, seqlen) FS_IN_DTYPE or null when !has_z
  ScanHot hot;
  void* out;                  // (batch, dim, seqlen) FS_IN_DTYPE
  const float* initial_state; // (batch, dim, dstate) or null
  float* last_state;          // (batch, dim, dstate) or null
  float* chunk_state;         // scratch (batch*dim, nchunks-1, FS_DSTATE) fp32, contiguous; null if nchunks == 1
  float* chunk_dtsum;         // scratch (batch*dim, nchunks-1) fp32, contiguous; null if nchunks == 1
  i64 batch, dim, seqlen, dstate, ngroups, chunk_len;
  i64 u_batch, u_dim, delta_batch, delta_dim, z_batch, z_dim, out_batch, out_dim;
  i64 A_dim, A_dstate;
  i64 B_batch, B_group, B_dstate, B_dim;      // varying: batch/group/dstate; fixed: dim/dstate
  i64 C_batch, C_group, C_dstate, C_dim;
  i64 D_dim, delta_bias_dim;
  i64 init_batch, init_dim, init_dstate;
  i64 last_batch, last_dim, last_dstate;
  int nchunks;                // >= 1; grid.y of selective_scan_fwd
  int chans_per_block;        // channels per block (<= FS_THREADS / FS_NSPLIT; divides dim/ngroups when B or C varies and ngroups > 1)
  int has_D, has_z, has_delta_bias, softplus, has_initial_state, has_last_state;
  int io_align;               // bytes (2, 4, 8 or 16): alignment every u/delta/z/out row start shares
  int blocks_per_row;         // ceil(dim / chans_per_block): blockIdx.x = b * blocks_per_row + block of the row
#if FS_SAVE_STATES
  // Saving variant only (the struct, and so every other variant, is unchanged without it): the state at
  // the end of every FS_SAVE_LEN-step chunk but the last, for the backward. f32 (batch, dim, nsaved, dstate).
  float* saved;
  i64 saved_batch, saved_dim, saved_chunk, saved_dstate;
#endif
};
#if FS_SAVE_STATES
static_assert(sizeof(ScanParams) == 568, "ScanParams layout changed: update the host mirror");
static_assert(FS_SAVE_LEN % FS_TILE_T == 0 && (FS_SAVE_LEN & (FS_SAVE_LEN - 1)) == 0,
              "FS_SAVE_LEN: a power of two, multiple of FS_TILE_T");
#else
static_assert(sizeof(ScanParams) == 528, "ScanParams layout changed: update the host mirror");
#endif

constexpr int kDState = FS_DSTATE;
constexpr int kSplit = FS_NSPLIT;
constexpr int kNS = kDState / kSplit;                 // states per lane
constexpr int kVG = kNS < 4 ? kNS : 4;                // states per shared-memory vector read
constexpr int kNGrp = kNS / kVG;                      // vector groups per lane
constexpr int kT = FS_TILE_T;
constexpr int kThreads = FS_THREADS;
constexpr int kTS = kT / kSplit;                      // timesteps per lane in its slice
constexpr int kSlots = kThreads / kSplit;             // lane groups per block
constexpr int kCPT = FS_CPT;                          // channels per slot
constexpr int kDTRow = kT + 1;                        // sDT row stride in units of kCPT float2 (odd)
constexpr int kYRow = kT + 4;                         // float row stride of sY (16 B aligned rows)
constexpr int kRow = kDState >= 4 ? kDState + 4 : kDState;   // fp32 row stride of a staged B/C tile
constexpr int kInBytes = FS_IN_DTYPE == 2 ? 4 : 2;
constexpr int kBCBytes = FS_BC_DTYPE == 2 ? 4 : 2;
constexpr int kStage = (kDState * kT + kThreads - 1) / kThreads;   // B (or C) tile elements per thread
constexpr int kNStep = kThreads / kT;                 // B/C tile rows staged per pass of the block
constexpr bool kBVar = FS_B_VARYING != 0;
constexpr bool kCVar = FS_C_VARYING != 0;
// Packed B/C staging (selective_scan_fwd, both varying, 16-bit B/C): the tile is one 32-bit word per (t, n)
// holding B's raw 16 bits (low half) and C's (high half), so a lane's B and C of kVG states come in ONE
// shared-memory vector read instead of two fp32 ones. The recurrence is bound by the shared-memory pipe
// (a 128-bit LDS costs 4 wavefronts a warp, whatever the broadcast), not only by MUFU; this halves its B/C
// wavefronts for 2 integer ops per state. Exact: the words hold the input bits.
constexpr bool kPackBCOk = FS_PACK_BC != 0 && kBVar && kCVar && FS_BC_DTYPE != 2;

static_assert(kSplit >= 1 && kSplit <= 32 && (kSplit & (kSplit - 1)) == 0, "FS_NSPLIT: power of two <= 32");
static_assert(kDState % kSplit == 0 && kNS % kVG == 0, "FS_DSTATE must be a multiple of FS_NSPLIT");
static_assert(kT % kSplit == 0 && kT % 8 == 0, "FS_TILE_T must be a multiple of 8 and of FS_NSPLIT");
static_assert(kThreads % 32 == 0 && kThreads % kT == 0, "FS_THREADS: whole warps, a multiple of FS_TILE_T");
static_assert(kCPT == 1 || kCPT == 2 || kCPT == 4, "FS_CPT: 1, 2 or 4");

// Index arithmetic: 32-bit where the host saw every byte offset of the call's tensors below 2^31
// (FS_IDX32, emitted for the short and the B / C-varying dstate-16 plans, `scan.rs`), else 64-bit. At
// b32 d512 L60 the per-warp setup (block -> (b, d0), the row pointers) was 445 instructions of a
// warp's ~3500, most of them 64-bit IMADs (ncu, H200, 2026-11-29).
#if FS_IDX32
using Ix = int;
#else
using Ix = i64;
#endif
__device__ __forceinline__ Ix ix(i64 v) { return (Ix)v; }

// The fields the scan reads in its index type: a FS_IDX32 variant reads the block's 32-bit head
// (ScanHot) as values, the others refer to the 64-bit fields so that each use reads the constant
// bank as before (held as values, the 64-bit ones took registers for the whole kernel: the sm_80
// build of fp32 dstate 16 spilled, 2026-11-29).
#if FS_IDX32
struct View {
  int dim, seqlen, dstate, ngroups, chunk_len;
  int nchunks, blocks_per_row, chans_per_block, io_align;
  int u_batch, u_dim, delta_batch, delta_dim, z_batch, z_dim, out_batch, out_dim;
  int A_dim, A_dstate, B_batch, B_group, B_dstate, C_batch, C_group, C_dstate, D_dim, delta_bias_dim;
  int init_batch, init_dim, init_dstate;
  bool has_D, has_z, has_delta_bias, softplus, has_initial_state, has_last_state;
};
__device__ __forceinline__ View view(const ScanParams& p) {
  const ScanHot& h = p.hot;
  const int f = h.flags;
  return View{h.dim, h.seqlen, h.dstate, h.ngroups, h.chunk_len,
              h.nchunks, h.blocks_per_row, h.chans_per_block, h.io_align,
              h.u_batch, h.u_dim, h.delta_batch, h.delta_dim, h.z_batch, h.z_dim, h.out_batch, h.out_dim,
              h.A_dim, h.A_dstate, h.B_batch, h.B_group, h.B_dstate, h.C_batch, h.C_group, h.C_dstate, h.D_dim, h.delta_bias_dim,
              h.init_batch, h.init_dim, h.init_dstate,
              (f & 1) != 0, (f & 2) != 0, (f & 4) != 0, (f & 8) != 0, (f & 16) != 0, (f & 32) != 0};
}
#else
struct View {
  const i64 &dim, &seqlen, &dstate, &ngroups, &chunk_len;
  const int &nchunks, &blocks_per_row, &chans_per_block, &io_align;
  const i64 &u_batch, &u_dim, &delta_batch, &delta_dim, &z_batch, &z_dim, &out_batch, &out_dim;
  const i64 &A_dim, &A_dstate, &B_batch, &B_group, &B_dstate, &C_batch, &C_group, &C_dstate, &D_dim, &delta_bias_dim;
  const i64 &init_batch, &init_dim, &init_dstate;
  const int &has_D, &has_z, &has_delta_bias, &softplus, &has_initial_state, &has_last_state;
};
__device__ __forceinline__ View view(const ScanParams& p) {
  return View{p.dim, p.seqlen, p.dstate, p.ngroups, p.chunk_len,
              p.nchunks, p.blocks_per_row, p.chans_per_block, p.io_align,
              p.u_batch, p.u_dim, p.delta_batch, p.delta_dim, p.z_batch, p.z_dim, p.out_batch, p.out_dim,
              p.A_dim, p.A_dstate, p.B_batch, p.B_group, p.B_dstate, p.C_batch, p.C_group, p.C_dstate, p.D_dim, p.delta_bias_dim,
              p.init_batch, p.init_dim, p.init_dstate,
              p.has_D, p.has_z, p.has_delta_bias, p.softplus, p.has_initial_state, p.has_last_state};
}
#endif

// ---------------------------------------------------------------- the scan
// Registers a lane carries from one tile to the next (the prefetch of tile k+1).
struct Prefetch {
  Raw<kTS, kInBytes> delta_s[kCPT];   // this lane's slice of delta, per channel
  Raw<kTS, kInBytes> u_s[kCPT];       // this lane's slice of u
  Raw<kTS, kInBytes> z_s[kCPT];       // this lane's slice of z
  u32 b[kBVar ? kStage : 1];       // B tile elements this thread stages (raw bits)
  u32 c[kCVar ? kStage : 1];
};

// Shared-memory layout (floats) of one block.
template <bool kStateOnly> struct SmemLayout {
  static constexpr bool kPack = kPackBCOk && !kStateOnly;                // sB holds packed (B, C) words
  static constexpr int kB = kBVar ? 2 * kT * kRow : 0;                   // sB[2][kT][kRow]
  static constexpr int kC = (kCVar && !kStateOnly && !kPack) ? 2 * kT * kRow : 0;  // sC[2][kT][kRow]
  static constexpr int kDT = 2 * kSlots * kDTRow * kCPT * 2;             // sDT[2][kSlots][kDTRow][kCPT] float2
  static constexpr int kY = kStateOnly ? 0 : kThreads * kCPT * kYRow;    // sY[kThreads][kCPT][kYRow]
  static constexpr int kTotal = kB + kC + kDT + kY;
};

template <bool kStateOnly>
__device__ __forceinline__ void fs_scan(const ScanParams& p, float* smem) {
  using L = SmemLayout<kStateOnly>;
  const View g = view(p);
  const int tid = threadIdx.x;
  const int s = tid & (kSplit - 1);      // this lane's index within its slot
  const int slot = tid / kSplit;         // lane group in the block; owns channels slot*kCPT + q
  const Ix nblk_d = g.blocks_per_row;   // (from the host: one division fewer before the first loads)
  const Ix b = blockIdx.x / nblk_d;
  const Ix d0 = (blockIdx.x - b * nblk_d) * g.chans_per_block;
  bool active[kCPT];
  Ix d[kCPT];
#pragma unroll
  for (int q = 0; q < kCPT; ++q) {
    const int ch = slot * kCPT + q;
    active[q] = ch < g.chans_per_block && d0 + ch < g.dim;
    d[q] = active[q] ? d0 + ch : d0;     // idle channels shadow channel d0 and store nothing
  }
  const Ix group = g.ngroups == 1 ? 0 : d0 / (g.dim / g.ngroups);
  const int c = blockIdx.y;
  const Ix t_begin = (Ix)c * g.chunk_len;
  const Ix t_end = t_begin + g.chunk_len < g.seqlen ? t_begin + g.chunk_len : g.seqlen;
  const int len = (int)(t_end - t_begin);
  const int ntiles = (len + kT - 1) / kT;
  const int align = g.io_align;
  const int asl = kTS * kInBytes < align ? kTS * kInBytes : align;   // alignment of a slice start

  // ---- global pointers (bytes) at the chunk start; slices already offset by this lane's s*kTS
  const Ix soff = t_begin + s * kTS;
  const char* delta_sl[kCPT];
  const char* u_sl[kCPT];
  const char* z_sl[kCPT];
  char* out_sl[kCPT];
#pragma unroll
  for (int q = 0; q < kCPT; ++q) {
    delta_sl[q] = (const char*)p.delta + (b * g.delta_batch + d[q] * g.delta_dim + soff) * kInBytes;
    u_sl[q] = (const char*)p.u + (b * g.u_batch + d[q] * g.u_dim + soff) * kInBytes;
    z_sl[q] = g.has_z ? (const char*)p.z + (b * g.z_batch + d[q] * g.z_dim + soff) * kInBytes : nullptr;
    out_sl[q] = (char*)p.out + (b * g.out_batch + d[q] * g.out_dim + soff) * kInBytes;
  }
  // B / C staging: tile element (n, t) with n = st_n0 + it * kNStep, t = st_t (it < kStage); consecutive
  // threads walk t (coalesced); rows n >= dstate load nothing (zero).
  const int st_t = tid % kT, st_n0 = tid / kT;
  const char* bq = kBVar ? (const char*)p.B + (b * g.B_batch + group * g.B_group + st_n0 * g.B_dstate + t_begin + st_t) * kBCBytes : nullptr;
  const char* cq = (kCVar && !kStateOnly) ? (const char*)p.C + (b * g.C_batch + group * g.C_group + st_n0 * g.C_dstate + t_begin + st_t) * kBCBytes : nullptr;
  const Ix bstep = (Ix)kNStep * g.B_dstate * kBCBytes, cstep = (Ix)kNStep * g.C_dstate * kBCBytes;

  float* sB = smem;
  float* sC = smem + L::kB;
  float2* sDT = (float2*)(smem + L::kB + L::kC);
  float* sY = smem + L::kB + L::kC + L::kDT;

  // Issue the global loads of tile k into pf.
  auto prefetch = [&](Prefetch& pf, int k) {
    const int t0 = k * kT;
    const int valid = len - t0 < kT ? len - t0 : kT;
    const int vsl = valid - s * kTS;              // may be <= 0: slice past the end, zero-filled
#pragma unroll
    for (int q = 0; q < kCPT; ++q) {
      load_raw(pf.delta_s[q], delta_sl[q] + (Ix)t0 * kInBytes, vsl, asl);
      load_raw(pf.u_s[q], u_sl[q] + (Ix)t0 * kInBytes, vsl, asl);
      if constexpr (!kStateOnly) {
        if (g.has_z) load_raw(pf.z_s[q], z_sl[q] + (Ix)t0 * kInBytes, vsl, asl);
      }
    }
#pragma unroll
    for (int it = 0; it < kStage; ++it) {
      const int n = st_n0 + it * kNStep;
      const bool ok = n < kDState && n < g.dstate && st_t < valid;
      if constexpr (kBVar) pf.b[it] = ok ? ld_nc_raw<FS_BC_DTYPE>(bq + it * bstep + (Ix)t0 * kBCBytes) : 0u;
      if constexpr (kCVar && !kStateOnly) pf.c[it] = ok ? ld_nc_raw<FS_BC_DTYPE>(cq + it * cstep + (Ix)t0 * kBCBytes) : 0u;
    }
  };

  // ---- per-lane constants: A, fixed B / C, D, delta_bias; initial state. Their loads and the first
  // tile's go out together, no result used before the tile's barrier (A is kept as loaded: dt carries
  // the log2(e) factor instead, in sDT): every warp of a one-wave grid starts at once, and a use here
  // had it wait one memory round trip before issuing the next loads (ncu, H200, 2026-11-29).
  float Av[kCPT][kNS], x[kCPT][kNS], Bf[kCPT][kBVar ? 1 : kNS], Cf[kCPT][(kCVar || kStateOnly) ? 1 : kNS];
  float Dv[kCPT], bias[kCPT];
#pragma unroll
  for (int q = 0; q < kCPT; ++q) {
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
      const int n = (j / kVG) * kSplit * kVG + s * kVG + j % kVG;
      const bool real = n < g.dstate;
      Av[q][j] = real ? __ldg(p.A + d[q] * g.A_dim + n * g.A_dstate) : 0.f;
      if constexpr (!kBVar) Bf[q][j] = real ? ldg_f32<FS_BC_DTYPE>(p.B, d[q] * ix(p.B_dim) + n * g.B_dstate) : 0.f;
      if constexpr (!kCVar && !kStateOnly) Cf[q][j] = real ? ldg_f32<FS_BC_DTYPE>(p.C, d[q] * ix(p.C_dim) + n * g.C_dstate) : 0.f;
      x[q][j] = 0.f;
      if (!kStateOnly && g.has_initial_state && real)
        x[q][j] = __ldg(p.initial_state + b * g.init_batch + d[q] * g.init_dim + n * g.init_dstate);
    }
    Dv[q] = (!kStateOnly && g.has_D) ? __ldg(p.D + d[q] * g.D_dim) : 0.f;
    bias[q] = g.has_delta_bias ? __ldg(p.delta_bias + d[q] * g.delta_bias_dim) : 0.f;
  }

  Prefetch pf;
  prefetch(pf, 0);

  // ---- chunked path: fold the end states of the chunks before this one
  if (!kStateOnly && c > 0) {
#pragma unroll
    for (int q = 0; q < kCPT; ++q) {
      const Ix cb = (b * g.dim + d[q]) * (g.nchunks - 1);
      for (int cc = 0; cc < c; ++cc) {
        const float S = p.chunk_dtsum[cb + cc] * kLog2e;
        const float* cs = p.chunk_state + (cb + cc) * kDState;
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          const int n = (j / kVG) * kSplit * kVG + s * kVG + j % kVG;
          x[q][j] = fmaf(ex2(Av[q][j] * S), x[q][j], cs[n]);
        }
      }
    }
  }

  float dtsum[kCPT];
#pragma unroll
  for (int q = 0; q < kCPT; ++q) dtsum[q] = 0.f;

  for (int k = 0; k < ntiles; ++k) {
    const int t0 = k * kT;
    const int valid = len - t0 < kT ? len - t0 : kT;
    const int buf = k & 1;
    // -- 1. stage this tile's B/C into shared memory
#pragma unroll
    for (int it = 0; it < kStage; ++it) {
      const int n = st_n0 + it * kNStep;
      if (n < kDState) {
        if constexpr (L::kPack) {
          ((u32*)sB)[buf * kT * kRow + st_t * kRow + n] = (pf.b[it] & 0xffffu) | (pf.c[it] << 16);
        } else {
          if constexpr (kBVar) sB[buf * kT * kRow + st_t * kRow + n] = raw_to_f32<FS_BC_DTYPE>(pf.b[it]);
          if constexpr (kCVar && !kStateOnly) sC[buf * kT * kRow + st_t * kRow + n] = raw_to_f32<FS_BC_DTYPE>(pf.c[it]);
        }
      }
    }
    // -- 2. dt and dt*u of this lane's slice (zero past the end: the state then stays put)
    float2* dtrow = sDT + (buf * kSlots + slot) * kDTRow * kCPT;   // [kDTRow][kCPT] float2
    // (the uniform softplus test outside the element loop: inside it, every element's
    // EX2 -> LG2 chain sat behind its own branch and none overlapped: ncu, H200, 2026-11-29)
    float v[kTS][kCPT];
#pragma unroll
    for (int i = 0; i < kTS; ++i) {
#pragma unroll
      for (int q = 0; q < kCPT; ++q) v[i][q] = elem<FS_IN_DTYPE>(pf.delta_s[q], i) + bias[q];
    }
    if (g.softplus) {
#pragma unroll
      for (int i = 0; i < kTS; ++i) {
#pragma unroll
        for (int q = 0; q < kCPT; ++q) v[i][q] = softplus(v[i][q]);
      }
    }
#pragma unroll
    for (int i = 0; i < kTS; ++i) {
#pragma unroll
      for (int q = 0; q < kCPT; ++q) {
        const float dt = s * kTS + i < valid ? v[i][q] : 0.f;
        dtsum[q] += dt;
        dtrow[(s * kTS + i) * kCPT + q] = make_float2(dt * kLog2e, dt * elem<FS_IN_DTYPE>(pf.u_s[q], i));
      }
    }
    Raw<kTS, kInBytes> u_s[kCPT], z_s[kCPT];    // the epilogue's, before the prefetch lands
#pragma unroll
    for (int q = 0; q < kCPT; ++q) {
      u_s[q] = pf.u_s[q];
      z_s[q] = pf.z_s[q];
    }
    __syncthreads();
    if (k + 1 < ntiles) prefetch(pf, k + 1);

    // -- 4. the recurrence over the tile: x = exp2(dt*log2(e)*A) * x + dt*u*B ; y partial = sum over own states C*x
    const float* sBt = sB + buf * kT * kRow + s * kVG;
    const float* sCt = sC + buf * kT * kRow + s * kVG;
    float* yrow = sY + tid * kCPT * kYRow;
    float yq[kCPT][4];
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      // steps past the sequence end (dt = 0) would leave x as it is: the last tile skips them in
      // groups of 4 (block-uniform; their y partials are never stored). Only where the register
      // budget is >= 128 (FS_MIN_BLOCKS <= 4): at 64 (the small-grid plans) the exit spilled.
      if (FS_MIN_BLOCKS <= 4 && t % 4 == 0 && t >= valid) break;
      float2 dd[kCPT];                  // (dt*log2(e), dt*u) per channel; same address for the slot's lanes
      if constexpr (kCPT == 1) {
        dd[0] = dtrow[t];
      } else {
#pragma unroll
        for (int q2 = 0; q2 < kCPT / 2; ++q2) {
          const float4 v = *(const float4*)(dtrow + t * kCPT + 2 * q2);
          dd[2 * q2] = make_float2(v.x, v.y);
          dd[2 * q2 + 1] = make_float2(v.z, v.w);
        }
      }
      float Bv[kNS], Cv[kStateOnly ? 1 : kNS];
#pragma unroll
      for (int g = 0; g < kNGrp; ++g) {
        const int off = t * kRow + g * kSplit * kVG;
        if constexpr (L::kPack) {
          u32 w[kVG];
          if constexpr (kVG == 4) {
            const uint4 v = *(const uint4*)(sBt + off);
            w[0] = v.x; w[1] = v.y; w[2] = v.z; w[3] = v.w;
          } else if constexpr (kVG == 2) {
            const uint2 v = *(const uint2*)(sBt + off);
            w[0] = v.x; w[1] = v.y;
          } else {
            w[0] = *(const u32*)(sBt + off);
          }
#pragma unroll
          for (int i = 0; i < kVG; ++i) {
            const float2 bc = unpack2<FS_BC_DTYPE>(w[i]);   // B in the low half, C in the high half
            Bv[kVG * g + i] = bc.x;
            Cv[kVG * g + i] = bc.y;
          }
        } else {
        if constexpr (kBVar) {
          if constexpr (kVG == 4) {
            const float4 v = *(const float4*)(sBt + off);
            Bv[4 * g] = v.x; Bv[4 * g + 1] = v.y; Bv[4 * g + 2] = v.z; Bv[4 * g + 3] = v.w;
          } else if constexpr (kVG == 2) {
            const float2 v = *(const float2*)(sBt + off);
            Bv[2 * g] = v.x; Bv[2 * g + 1] = v.y;
          } else {
            Bv[g] = sBt[off];
          }
        }
        if constexpr (kCVar && !kStateOnly) {
          if constexpr (kVG == 4) {
            const float4 v = *(const float4*)(sCt + off);
            Cv[4 * g] = v.x; Cv[4 * g + 1] = v.y; Cv[4 * g + 2] = v.z; Cv[4 * g + 3] = v.w;
          } else if constexpr (kVG == 2) {
            const float2 v = *(const float2*)(sCt + off);
            Cv[2 * g] = v.x; Cv[2 * g + 1] = v.y;
          } else {
            Cv[g] = sCt[off];
          }
        }
        }
      }
#pragma unroll
      for (int q = 0; q < kCPT; ++q) {
        float y = 0.f;
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          const float arg = dd[q].x * Av[q][j];
          const float a = (((t * kCPT + q) * kNS + j) % 8) < FS_POLY_NUM ? ex2_poly(arg) : ex2(arg);
          x[q][j] = fmaf(a, x[q][j], dd[q].y * (kBVar ? Bv[j] : Bf[q][j]));
          if constexpr (!kStateOnly) y = fmaf(kCVar ? Cv[j] : Cf[q][j], x[q][j], y);
        }
        if constexpr (!kStateOnly) {
          yq[q][t % 4] = y;
          if (t % 4 == 3) *(float4*)(yrow + q * kYRow + t - 3) = make_float4(yq[q][0], yq[q][1], yq[q][2], yq[q][3]);
        }
      }
    }

    if constexpr (!kStateOnly) {
      // -- 5. y of this lane's slice = sum of the slot's kSplit partials; + D*u, * silu(z); store
      __syncwarp();
#pragma unroll
      for (int q = 0; q < kCPT; ++q) {
        float o[kTS];
#pragma unroll
        for (int i = 0; i < kTS; ++i) o[i] = 0.f;
        const float* ysl = sY + ((tid - s) * kCPT + q) * kYRow + s * kTS;   // lane 0 of the slot, channel q, my slice
#pragma unroll
        for (int r = 0; r < kSplit; ++r) {
          const float* yr = ysl + r * kCPT * kYRow;
          if constexpr (kTS % 4 == 0) {
#pragma unroll
            for (int v4 = 0; v4 < kTS / 4; ++v4) {
              const float4 v = *(const float4*)(yr + 4 * v4);
              o[4 * v4] += v.x; o[4 * v4 + 1] += v.y; o[4 * v4 + 2] += v.z; o[4 * v4 + 3] += v.w;
            }
          } else if constexpr (kTS % 2 == 0) {
#pragma unroll
            for (int v2 = 0; v2 < kTS / 2; ++v2) {
              const float2 v = *(const float2*)(yr + 2 * v2);
              o[2 * v2] += v.x; o[2 * v2 + 1] += v.y;
            }
          } else {
#pragma unroll
            for (int i = 0; i < kTS; ++i) o[i] += yr[i];
          }
        }
#pragma unroll
        for (int i = 0; i < kTS; ++i) o[i] = fmaf(Dv[q], elem<FS_IN_DTYPE>(u_s[q], i), o[i]);
        if (g.has_z) {   // outside the element loop, as the softplus above: the SiLU chains overlap
#pragma unroll
          for (int i = 0; i < kTS; ++i) o[i] *= silu(elem<FS_IN_DTYPE>(z_s[q], i));
        }
        Raw<kTS, kInBytes> ro;
        pack_raw<FS_IN_DTYPE>(ro, o);
        if (active[q]) store_raw(out_sl[q] + (Ix)t0 * kInBytes, ro, valid - s * kTS, asl);
      }
    }

#if FS_SAVE_STATES
    // -- saving variant: the state at every interior FS_SAVE_LEN boundary (tiles never straddle one: the
    //    chunk start and FS_SAVE_LEN are multiples of kT; steps past the end left x unchanged)
    if constexpr (!kStateOnly) {
      // (placed after the epilogue: fewer live registers; the low bits of t_begin + t0 + valid suffice)
      if ((((int)t_begin + t0 + valid) & (FS_SAVE_LEN - 1)) == 0 && t_begin + t0 + valid < g.seqlen) {
        const Ix ci = (t_begin + t0 + valid) / FS_SAVE_LEN - 1;
#pragma unroll
        for (int q = 0; q < kCPT; ++q) {
#pragma unroll
          for (int j = 0; j < kNS; ++j) {
            const int n = (j / kVG) * kSplit * kVG + s * kVG + j % kVG;
            if (active[q] && n < g.dstate)
              p.saved[b * ix(p.saved_batch) + d[q] * ix(p.saved_dim) + ci * ix(p.saved_chunk) + n * ix(p.saved_dstate)] = x[q][j];
          }
        }
      }
    }
#endif
  }

  // ---- results carried past the chunk
#pragma unroll
  for (int q = 0; q < kCPT; ++q) {
    if constexpr (kStateOnly) {
#pragma unroll
      for (int m = kSplit / 2; m >= 1; m /= 2) dtsum[q] += __shfl_xor_sync(0xffffffffu, dtsum[q], m);
      if (active[q]) {
        const Ix ci = (b * g.dim + d[q]) * (g.nchunks - 1) + c;
        float* cs = p.chunk_state + ci * kDState;
#pragma unroll
        for (int j = 0; j < kNS; ++j) cs[(j / kVG) * kSplit * kVG + s * kVG + j % kVG] = x[q][j];
        if (s == 0) p.chunk_dtsum[ci] = dtsum[q];
      }
    } else {
      if (active[q] && g.has_last_state && c == g.nchunks - 1) {
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          const int n = (j / kVG) * kSplit * kVG + s * kVG + j % kVG;
          if (n < g.dstate) p.last_state[b * ix(p.last_batch) + d[q] * ix(p.last_dim) + n * ix(p.last_dstate)] = x[q][j];
        }
      }
    }
  }
}

// grid (ceil(dim / chans_per_block) * batch, nchunks), block FS_THREADS, dynamic smem: see the header.
extern "C" __global__ void __launch_bounds__(FS_THREADS, FS_MIN_BLOCKS) selective_scan_fwd(const ScanParams p) {
  extern __shared__ float4 fs_smem4[];
  fs_scan<false>(p, (float*)fs_smem4);
}

// Chunked path, first launch: grid (ceil(dim / chans_per_block) * batch, nchunks - 1), block FS_THREADS,
// dynamic smem: see the header.
extern "C" __global__ void __launch_bounds__(FS_THREADS, FS_MIN_BLOCKS) selective_scan_chunk_state(const ScanParams p) {
  extern __shared__ float4 fs_smem4[];
  fs_scan<true>(p, (float*)fs_smem4);
}
