// Mamba selective scan, backward: du, ddelta, dA, dB, dC, dD, dz, ddelta_bias, d initial_state of
// `selective_scan_fn` (see cuda/selective_scan.cu for the forward math and names).
//
// Math, per batch row b, channel d, state n (a_t = exp(dt_t * A), x_t = a_t x_{t-1} + dt_t u_t B_t,
// y_t = sum_n C_t x_t + D u_t, out_t = y_t * silu(z_t)):
//   dy_t   = dout_t * silu(z_t)                      (dout_t without z)
//   dz_t   = dout_t * y_t * silu'(z_t)               (y_t recomputed)
//   g_t    = dL/dx_t = a_{t+1} g_{t+1} + C_t dy_t    (g_T = C_T dy_T + dlast_state); carry_t := a_t g_t
//   h_t    = a_t x_{t-1},  w_t = g_t h_t
//   S1_t   = sum_n g_t B_t,  S2_t = sum_n A w_t
//   du_t   = dt_t S1_t + D dy_t;  ddt_t = u_t S1_t + S2_t;  ddelta_t = ddt_t * softplus'(v_t) (v = delta + bias)
//   dA     = sum_t dt_t w_t;  dB_t = g_t dt_t u_t;  dC_t = dy_t x_t  (summed over the channels of a group
//            when B / C vary, over t when fixed);  dD = sum_t dy_t u_t;  ddelta_bias = sum_t ddelta_t
//   d initial_state = carry_0 = a_0 g_0.
//
// Work split. A work item = kSlots channels of one batch row (all in one B/C group) over the whole
// sequence; a block (persistent grid) loops over items. A slot = kSplit consecutive lanes owning one
// channel; lane s of a slot owns the kNS states n = s*kNS + j (j < kNS).
// The sequence is cut into chunks of FS_CHUNK steps (the forward's saved-state spacing); chunks are
// processed last to first, the carry (dL/dx) flowing backwards in registers. Inside a chunk:
//   pass 1: from the chunk's start state (initial_state / 0 for chunk 0, saved_states[c-1] else) scan
//           forward tile by tile (kT steps), storing each tile's start state in the per-block
//           checkpoint scratch `ck` (global, L2-resident: each thread reads back only what it wrote);
//   pass 2: tiles last to first: reload the tile's start state, recompute its kT forward steps keeping
//           a_t and h_t in registers (history: 2*kT*kNS floats), then walk them backwards.
// So each (t, n) costs two exp2 (passes 1 and 2) and nothing is stored per step in memory.
// Per-(channel, t) scalars (dt, dt*u) and dy are staged per tile in shared memory sDT / sDY[slot][t] by the slot's
// lanes (lane s stages the slice s*kTS ..); per-step sums over a channel's states (S1, S2, y) are written
// per lane to sP and summed by slice after the tile (as the forward does with y). Varying dB/dC: per step
// the per-lane values are summed over the slots of the warp by a shuffle reduce-scatter and stored (one
// writer each) in the warp's slice of sRed[kWarps][2][kDState][kT+1]; after the tile the block sums the
// warps' slices and issues one red.global.add per (t, n) per block (shared-memory fp32 atomicAdd is a CAS
// loop on sm_90: avoided). Global loads of the next tile are issued right after a tile is staged
// (register prefetch, Pf).
//
// Cost (H100, 2026-11-23, Mamba-1 config bf16 dstate 16, b8 d2048 L2048): 1.49 ms at 256 threads / 2 blocks
// (mamba_ssm 2.41 ms). Floors: HBM 158 us, two exp2 per (t, n) 290 us; the kernel issues ~54 instructions
// per (t, n) (ncu: 910 M warp instructions, IPC 2.2, shared-memory pipe ~80% busy), so it is bound by
// instruction issue and shared-memory wavefronts (broadcast reads of B/C and dt, the per-step partials),
// not by exp or memory. Pass 1's per-tile address arithmetic (64-bit, recomputed per tile) is ~2/3 of
// its instructions: the next thing to hoist.
//
// Compile-time constants (the host prelude emits them):
//   FS_IN_DTYPE, FS_BC_DTYPE  0 = fp16, 1 = bf16, 2 = fp32 (u/delta/z/dout/du/ddelta/dz; B/C)
//   FS_DSTATE   padded state count (power of two);  FS_NSPLIT lanes per channel (power of two <= 32)
//   FS_TILE_T   steps per tile (history length; FS_CHUNK % FS_TILE_T == 0, multiple of 4)
//   FS_THREADS  threads per block;  FS_MIN_BLOCKS __launch_bounds__ min blocks
//   FS_B_VARYING, FS_C_VARYING;  FS_CHUNK saved-state spacing (steps)
//   FS_IDX32    1: 32-bit index arithmetic for the items' rows and the per-tile loads / stores (the host's
//               DSTATE16_TILES plan, where every byte offset of the call's tensors fits in 31 bits); 0
//               (default, not emitted): 64-bit. NVRTC 13.0, sm_90a bf16: 3208 -> 2880 static
//               instructions in selective_scan_bwd, stack 56 -> 48 B; H200 (2026-12-03, same wheel):
//               b8 d2048 L2048 1407 -> 1343 us, L8192 5602 -> 5336 us
// Dynamic shared memory (bytes) = 4 * (nB + nC + nDT + nP + nR): nB = FS_B_VARYING*kT*kRow,
// nC = FS_C_VARYING*kT*kRow, nDT = 4*kSlots*kT, nP = FS_THREADS*3*kPRow,
// nR = (B or C varying)*(FS_THREADS/32)*2*FS_DSTATE*(kT+1),
// kRow = FS_DSTATE >= 4 ? FS_DSTATE + 4 : FS_DSTATE, kPRow = kT + 2.

#ifndef FS_MIN_BLOCKS
#define FS_MIN_BLOCKS 4
#endif
#ifndef FS_CHUNK
#define FS_CHUNK 256
#endif
#ifndef FS_IDX32
#define FS_IDX32 0
#endif
#if !defined(FS_IN_DTYPE) || !defined(FS_BC_DTYPE) || !defined(FS_DSTATE) || !defined(FS_NSPLIT) || \
    !defined(FS_TILE_T) || !defined(FS_THREADS) || !defined(FS_B_VARYING) || !defined(FS_C_VARYING)
#error "the host prelude must define FS_IN_DTYPE, FS_BC_DTYPE, FS_DSTATE, FS_NSPLIT, FS_TILE_T, FS_THREADS, FS_B_VARYING and FS_C_VARYING"
#endif

#include "common/convert.cuh"
#include "common/copy.cuh"
#include "common/math.cuh"

using namespace fs;

// Index arithmetic of a work item's rows, slices and per-tile loads / stores: 32-bit where the host
// saw every byte offset of the call's tensors (gradients included) below 2^31 (FS_IDX32, the
// DSTATE16_TILES plan only), else 64-bit. The per-block checkpoint scratch stays 64-bit. ix(f): a
// parameter field in the index type.
#if FS_IDX32
using Ix = int;
#else
using Ix = i64;
#endif
__device__ __forceinline__ Ix ix(i64 v) { return (Ix)v; }

// One by-value parameter block for every entry. Layout: 22 pointers, 62 int64s, 10 int32s
// (no implicit padding; sizeof = 22*8 + 62*8 + 10*4 = 712). Strides are in elements.
struct ScanBwdParams {
  const void* u;              // (batch, dim, seqlen) FS_IN_DTYPE, seqlen stride 1
  const void* delta;          // same
  const float* A;             // (dim, dstate)
  const void* B;              // varying (batch, ngroups, dstate, seqlen) [seqlen stride 1] or fixed (dim, dstate)
  const void* C;
  const float* D;             // (dim,) or null
  const float* delta_bias;    // (dim,) or null
  const void* z;              // (batch, dim, seqlen) or null
  const float* initial_state; // (batch, dim, dstate) or null
  const void* dout;           // (batch, dim, seqlen) FS_IN_DTYPE, seqlen stride 1
  const float* saved;         // (batch, dim, nsaved, dstate): state at the end of chunk c (c < nsaved)
  const float* dlast;         // (batch, dim, dstate) or null
  void* du;                   // (batch, dim, seqlen) FS_IN_DTYPE, seqlen stride 1, fully written
  void* ddelta;               // same
  float* dA;                  // (dim, dstate) contiguous, accumulated (zeroed by selective_scan_bwd_zero)
  float* dB;                  // shape of B, contiguous, accumulated
  float* dC;
  float* dD;                  // (dim,) or null, accumulated
  void* dz;                   // (batch, dim, seqlen) or null, fully written
  float* ddelta_bias;         // (dim,) or null, accumulated
  float* dinit;               // (batch, dim, dstate) or null, fully written
  float* ck;                  // scratch: gridDim.x * (FS_CHUNK / kT) * FS_THREADS * kNS floats
  i64 batch, dim, seqlen, dstate, ngroups, nsaved;
  i64 u_batch, u_dim, delta_batch, delta_dim, z_batch, z_dim, dout_batch, dout_dim;
  i64 du_batch, du_dim, ddelta_batch, ddelta_dim, dz_batch, dz_dim;
  i64 A_dim, A_dstate;
  i64 B_batch, B_group, B_dstate, B_dim;      // varying: batch/group/dstate; fixed: dim/dstate
  i64 C_batch, C_group, C_dstate, C_dim;
  i64 D_dim, delta_bias_dim, init_batch, init_dim, init_dstate;
  i64 saved_batch, saved_dim, saved_chunk, saved_dstate;
  i64 dlast_batch, dlast_dim, dlast_dstate;
  i64 dA_dim, dA_dstate;
  i64 dB_batch, dB_group, dB_dstate, dB_dim;
  i64 dC_batch, dC_group, dC_dstate, dC_dim;
  i64 dD_dim, ddelta_bias_dim, dinit_batch, dinit_dim, dinit_dstate;
  i64 zero_n[5];              // element counts of dA, dB, dC, dD, ddelta_bias (0 when absent)
  int chans_per_block;        // channels per item (<= kSlots; divides dim/ngroups when B or C varies and ngroups > 1)
  int nitems;                 // batch * ceil(dim / chans_per_block)
  int has_D, has_z, has_delta_bias, softplus, has_initial_state, has_saved, has_dlast;
  int io_align;               // alignment (bytes, <= 16) shared by every u/delta/z/dout/du/ddelta/dz row start
};
static_assert(sizeof(ScanBwdParams) == 712, "ScanBwdParams layout changed: update the host mirror");

constexpr int kDState = FS_DSTATE;
constexpr int kSplit = FS_NSPLIT;
constexpr int kNS = kDState / kSplit;                 // states per lane
constexpr int kT = FS_TILE_T;
constexpr int kThreads = FS_THREADS;
constexpr int kSlots = kThreads / kSplit;             // channels per block
constexpr int kTS = kT >= kSplit ? kT / kSplit : 1;   // steps a lane stages (lanes s*kTS >= kT stage none)
constexpr int kChunk = FS_CHUNK;
constexpr int kNCk = kChunk / kT;                     // checkpoints per chunk
constexpr int kRow = kDState >= 4 ? kDState + 4 : kDState;
// sP row stride: even (float2 writes every 2 steps); 3*kPRow = 2 mod 4 so that, at FS_NSPLIT 8, the four
// slots of a warp read their partial rows in the epilogue from opposite bank halves (2 wavefronts, the minimum).
constexpr int kPRow = kT + 2;
constexpr int kRRow = kT + 1;
constexpr int kInBytes = FS_IN_DTYPE == 2 ? 4 : 2;
constexpr bool kBVar = FS_B_VARYING != 0;
constexpr bool kCVar = FS_C_VARYING != 0;
constexpr int kNRed = (kBVar ? kNS : 0) + (kCVar ? kNS : 0);   // per-lane values summed across channels per step
constexpr int kWSlots = 32 / kSplit;                  // slots per warp
constexpr int kWarps = kThreads / 32;
constexpr int kRWarp = 2 * kDState * kRRow;           // one warp's slice of sRed (floats)
constexpr int fs_log2(int v) { return v > 1 ? 1 + fs_log2(v / 2) : 0; }
constexpr int kLevels = fs_log2(kWSlots);             // shuffle levels of the cross-channel sum

static_assert(kSplit >= 1 && kSplit <= 32 && (kSplit & (kSplit - 1)) == 0, "FS_NSPLIT: power of two <= 32");
static_assert(kNS >= 1 && kDState % kSplit == 0, "FS_DSTATE must be a multiple of FS_NSPLIT");
static_assert(kT % 4 == 0 && kChunk % kT == 0, "FS_TILE_T: multiple of 4 dividing FS_CHUNK");
static_assert(kThreads % 32 == 0, "FS_THREADS: whole warps");

// Shared-memory layout (floats).
struct Smem {
  static constexpr int kB = kBVar ? kT * kRow : 0;          // sB[kT][kRow] fp32
  static constexpr int kC = kCVar ? kT * kRow : 0;          // sC[kT][kRow]
  static constexpr int kDT = 4 * kSlots * kT;               // sDT[kSlots][kT] float2 (dt, dt*u), then sDY[kSlots][kT], 1 pad
  static constexpr int kP = kThreads * 3 * kPRow;           // sP[kThreads][3][kPRow]: S1, S2, y partials
  static constexpr int kR = (kBVar || kCVar) ? kWarps * kRWarp : 0;   // sRed[kWarps][2][kDState][kRRow]
  static constexpr int kTotal = kB + kC + kDT + kP + kR;
};

// ---------------------------------------------------------------- one work item
struct Item {
  Ix b, d, group;
  bool active;
  int slot, s;
};

__device__ __forceinline__ Item fs_item(const ScanBwdParams& p, int item) {
  Item it;
  const int tid = threadIdx.x;
  it.s = tid & (kSplit - 1);
  it.slot = tid / kSplit;
  const Ix nblk_d = (ix(p.dim) + p.chans_per_block - 1) / p.chans_per_block;
  it.b = item / nblk_d;
  const Ix d0 = (item - it.b * nblk_d) * p.chans_per_block;
  it.active = it.slot < p.chans_per_block && d0 + it.slot < ix(p.dim);
  it.d = it.active ? d0 + it.slot : d0;   // idle slots shadow channel d0 and write nothing
  it.group = d0 / (ix(p.dim) / ix(p.ngroups));
  return it;
}

// Registers a lane carries from the prefetch of a tile to its commit (and, for the slices, to the
// tile's epilogue): its slice of delta, u, dout, z and its elements of the B / C tiles (raw bits).
constexpr int kStBC = (kT * kDState + kThreads - 1) / kThreads;   // B (or C) tile elements per thread
struct Pf {
  Raw<kTS, kInBytes> delta, u, dout, z;
  u32 b[kBVar ? kStBC : 1];
  u32 c[kCVar ? kStBC : 1];
};

// Issue the global loads of the tile starting at absolute step tt (valid steps): slices (dout, z only
// when kFull), B tile (and C when kFull). Steps past the end and rows past dstate load zeros.
template <bool kFull>
__device__ __forceinline__ void fs_prefetch(const ScanBwdParams& p, const Item& it, Ix tt, int valid, Pf& pf) {
  const int tid = threadIdx.x;
  const int align = p.io_align;
  const int asl = kTS * kInBytes < align ? kTS * kInBytes : align;
  const int ts0 = it.s * kTS;
  if (ts0 < kT) {
    const int vsl = valid - ts0;
    const Ix off = tt + ts0;
    load_raw(pf.delta, (const char*)p.delta + (it.b * ix(p.delta_batch) + it.d * ix(p.delta_dim) + off) * kInBytes, vsl, asl);
    load_raw(pf.u, (const char*)p.u + (it.b * ix(p.u_batch) + it.d * ix(p.u_dim) + off) * kInBytes, vsl, asl);
    if constexpr (kFull) {
      load_raw(pf.dout, (const char*)p.dout + (it.b * ix(p.dout_batch) + it.d * ix(p.dout_dim) + off) * kInBytes, vsl, asl);
      if (p.has_z) load_raw(pf.z, (const char*)p.z + (it.b * ix(p.z_batch) + it.d * ix(p.z_dim) + off) * kInBytes, vsl, asl);
    }
  }
  // B / C tile element e = n * kT + t (t fastest: coalesced)
#pragma unroll
  for (int i = 0; i < kStBC; ++i) {
    const int e = tid + i * kThreads;
    const int t = e % kT, n = e / kT;
    const bool ok = e < kT * kDState && n < p.dstate && t < valid;
    if constexpr (kBVar) pf.b[i] = ok ? ldg_raw<FS_BC_DTYPE>(p.B, it.b * ix(p.B_batch) + it.group * ix(p.B_group) + n * ix(p.B_dstate) + tt + t) : 0u;
    if constexpr (kFull && kCVar) pf.c[i] = ok ? ldg_raw<FS_BC_DTYPE>(p.C, it.b * ix(p.C_batch) + it.group * ix(p.C_group) + n * ix(p.C_dstate) + tt + t) : 0u;
  }
}

// Pass 2's B / C staging when both vary in 16 bits: one 32-bit word per (t, n) holding B's raw bits (low
// half) and C's (high half), so a lane reads B and C of its states in one shared-memory access (as the forward).
constexpr bool kPack = kBVar && kCVar && FS_BC_DTYPE != 2;

// B (and C) of this lane's states at tile row `row` (kPacked: the packed pass-2 words).
template <bool kPacked>
__device__ __forceinline__ void fs_lds_bc(float (&Bv)[kNS], float (&Cv)[kNS], const float* row) {
  if constexpr (kPacked) {
    float w[kNS];
    lds_vec(w, row);
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
      // B in the low half, C in the high half. Not unpack2: for fp16 its single mov.b32 split gets
      // this loop scheduled differently (same instruction count, other SASS; 2026-11-23).
      const u32 bits = __float_as_uint(w[j]);
      if constexpr (FS_BC_DTYPE == 1) {
        Bv[j] = __uint_as_float(bits << 16);
        Cv[j] = __uint_as_float(bits & 0xffff0000u);
      } else {
        Bv[j] = half_to_f32<0>(bits & 0xffffu);
        Cv[j] = half_to_f32<0>(bits >> 16);
      }
    }
  } else {
    lds_vec(Bv, row);
  }
}

// Stage a prefetched tile in shared memory: (dt, dt*u) and dy per (slot, t) into sDT / sDY (zero past the end
// and for idle slots: the state then stays put and nothing flows back), B (and C) as fp32.
template <bool kFull>
__device__ __forceinline__ void fs_commit(const ScanBwdParams& p, const Item& it, int valid, float bias, const Pf& pf,
                                          float* sB, float* sC, float* sDT) {
  const int tid = threadIdx.x;
  const int ts0 = it.s * kTS;
  if (ts0 < kT) {
    // (the uniform softplus / z tests outside the element loops, as in the forward: inside them each
    // element's EX2 -> LG2 / RCP chain waited behind its own branch and none overlapped)
    float v[kTS], dy[kTS];
#pragma unroll
    for (int i = 0; i < kTS; ++i) {
      v[i] = elem<FS_IN_DTYPE>(pf.delta, i) + bias;
      dy[i] = 0.f;
      if constexpr (kFull) dy[i] = elem<FS_IN_DTYPE>(pf.dout, i);
    }
    if (p.softplus) {
#pragma unroll
      for (int i = 0; i < kTS; ++i) v[i] = softplus(v[i]);
    }
    if constexpr (kFull) {
      if (p.has_z) {
#pragma unroll
        for (int i = 0; i < kTS; ++i) dy[i] *= silu(elem<FS_IN_DTYPE>(pf.z, i));
      }
    }
#pragma unroll
    for (int i = 0; i < kTS; ++i) {
      const bool ok = ts0 + i < valid && it.active;
      const float dt = ok ? v[i] : 0.f;
      const float uu = elem<FS_IN_DTYPE>(pf.u, i);
      ((float2*)sDT)[it.slot * kT + ts0 + i] = make_float2(dt, dt * uu);
      if constexpr (kFull) sDT[2 * kSlots * kT + it.slot * kT + ts0 + i] = ok ? dy[i] : 0.f;
    }
  }
#pragma unroll
  for (int i = 0; i < kStBC; ++i) {
    const int e = tid + i * kThreads;
    const int t = e % kT, n = e / kT;
    if (e < kT * kDState) {
      if constexpr (kFull && kPack) {
        ((u32*)sB)[t * kRow + n] = (pf.b[i] & 0xffffu) | (pf.c[i] << 16);
      } else {
        if constexpr (kBVar) sB[t * kRow + n] = raw_to_f32<FS_BC_DTYPE>(pf.b[i]);
        if constexpr (kFull && kCVar) sC[t * kRow + n] = raw_to_f32<FS_BC_DTYPE>(pf.c[i]);
      }
    }
  }
}

// Forward over a chunk from x. kStore: tile k's start state goes to ck[k] and the last tile is not
// scanned (its end state is never needed); else every tile is scanned. Leaves x at the state reached.
template <bool kStore>
__device__ __forceinline__ void fs_forward_chunk(const ScanBwdParams& p, const Item& it, Ix t_begin, int len,
                                                 float (&x)[kNS], const float (&A2)[kNS], const float (&Bf)[kNS],
                                                 float bias, float* smem, float* ck) {
  float* sB = smem;
  float* sDT = smem + Smem::kB + Smem::kC;
  const int ntiles = (len + kT - 1) / kT;
  const int nscan = kStore ? ntiles - 1 : ntiles;
  Pf pf;
  if (nscan > 0) fs_prefetch<false>(p, it, t_begin, len < kT ? len : kT, pf);
  for (int k = 0; k < ntiles; ++k) {
    if constexpr (kStore) {
#pragma unroll
      for (int j = 0; j < kNS; ++j) ck[((i64)k * kThreads) * kNS + j] = x[j];
    }
    if (k >= nscan) break;
    const int t0 = k * kT;
    const int valid = len - t0 < kT ? len - t0 : kT;
    __syncthreads();                    // previous readers of sB / sDT are done
    fs_commit<false>(p, it, valid, bias, pf, sB, nullptr, sDT);
    __syncthreads();
    if (k + 1 < nscan) {
      const int v1 = len - t0 - kT < kT ? len - t0 - kT : kT;
      fs_prefetch<false>(p, it, t_begin + t0 + kT, v1, pf);
    }
    const float* sBt = sB + it.s * kNS;
#pragma unroll 4
    for (int t = 0; t < kT; ++t) {
      const float2 dd = ((const float2*)sDT)[it.slot * kT + t];
      float Bv[kNS];
      if constexpr (kBVar) lds_vec(Bv, sBt + t * kRow);
#pragma unroll
      for (int j = 0; j < kNS; ++j) {
        const float a = ex2(dd.x * A2[j]);
        x[j] = fmaf(a, x[j], dd.y * (kBVar ? Bv[j] : Bf[j]));
      }
    }
  }
}

// The backward of one item (kSlots channels of one batch row, whole sequence).
__device__ __forceinline__ void fs_bwd_item(const ScanBwdParams& p, int item, float* smem, float* ck) {
  const Item it = fs_item(p, item);
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  float* sB = smem;
  float* sC = smem + Smem::kB;
  float* sDT = smem + Smem::kB + Smem::kC;
  const float2* sDT2 = (const float2*)sDT;          // (dt, dt*u) [kSlots][kT]
  const float* sDY = sDT + 2 * kSlots * kT;          // dy [kSlots][kT]
  float* sP = smem + Smem::kB + Smem::kC + Smem::kDT;
  float* sRed = sP + Smem::kP;

  // ---- per-lane constants
  float A2[kNS], Av[kNS], Bf[kNS], Cf[kNS], carry[kNS], dAacc[kNS], dBacc[kNS], dCacc[kNS];
#pragma unroll
  for (int j = 0; j < kNS; ++j) {
    const int n = it.s * kNS + j;
    const bool real = n < p.dstate;
    Av[j] = real ? __ldg(p.A + it.d * p.A_dim + n * p.A_dstate) : 0.f;
    A2[j] = Av[j] * kLog2e;
    Bf[j] = (!kBVar && real) ? ldg_f32<FS_BC_DTYPE>(p.B, it.d * p.B_dim + n * ix(p.B_dstate)) : 0.f;
    Cf[j] = (!kCVar && real) ? ldg_f32<FS_BC_DTYPE>(p.C, it.d * p.C_dim + n * ix(p.C_dstate)) : 0.f;
    carry[j] = (p.has_dlast && real && it.active) ? __ldg(p.dlast + it.b * p.dlast_batch + it.d * p.dlast_dim + n * p.dlast_dstate) : 0.f;
    dAacc[j] = dBacc[j] = dCacc[j] = 0.f;
  }
  const float Dv = p.has_D ? __ldg(p.D + it.d * p.D_dim) : 0.f;
  const float bias = p.has_delta_bias ? __ldg(p.delta_bias + it.d * p.delta_bias_dim) : 0.f;
  float dDacc = 0.f, dbacc = 0.f;

  const int align = p.io_align;
  const int asl = kTS * kInBytes < align ? kTS * kInBytes : align;
  const int ts0 = it.s * kTS;
  const int nchunks = (int)((p.seqlen + kChunk - 1) / kChunk);
  float* myck = ck + (i64)tid * kNS;

  for (int c = nchunks - 1; c >= 0; --c) {
    const Ix t_begin = (Ix)c * kChunk;
    const int len = (int)(p.seqlen - t_begin < kChunk ? p.seqlen - t_begin : kChunk);
    const int ntiles = (len + kT - 1) / kT;
    // ---- chunk start state
    float x[kNS];
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
      const int n = it.s * kNS + j;
      x[j] = 0.f;
      if (n < p.dstate) {
        if (c == 0) {
          if (p.has_initial_state) x[j] = __ldg(p.initial_state + it.b * p.init_batch + it.d * p.init_dim + n * p.init_dstate);
        } else {
          x[j] = __ldg(p.saved + it.b * p.saved_batch + it.d * p.saved_dim + (c - 1) * p.saved_chunk + n * p.saved_dstate);
        }
      }
    }
    // ---- pass 1: tile start states -> ck
    fs_forward_chunk<true>(p, it, t_begin, len, x, A2, Bf, bias, smem, myck);

    // ---- pass 2: tiles last to first
    Pf pf;
    fs_prefetch<true>(p, it, t_begin + (ntiles - 1) * kT, len - (ntiles - 1) * kT, pf);
    for (int k = ntiles - 1; k >= 0; --k) {
      const int t0 = k * kT;
      const int valid = len - t0 < kT ? len - t0 : kT;
      __syncthreads();                  // previous readers of sB / sC / sDT / sP / sRed are done
      fs_commit<true>(p, it, valid, bias, pf, sB, sC, sDT);
      const Raw<kTS, kInBytes> rdelta = pf.delta, ru = pf.u, rdout = pf.dout, rz = pf.z;   // the epilogue's
      __syncthreads();
      if (k > 0) fs_prefetch<true>(p, it, t_begin + t0 - kT, kT, pf);

      // -- forward recompute of the tile from its start state: history a_t, h_t = a_t x_{t-1}
      float ha[kT][kNS], hh[kT][kNS];
#pragma unroll
      for (int j = 0; j < kNS; ++j) x[j] = myck[((i64)k * kThreads) * kNS + j];
#pragma unroll
      for (int t = 0; t < kT; ++t) {
        const float2 dd = sDT2[it.slot * kT + t];
        float Bv[kNS], Cv[kNS];
        if constexpr (kBVar) fs_lds_bc<kPack>(Bv, Cv, sB + t * kRow + it.s * kNS);
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          ha[t][j] = ex2(dd.x * A2[j]);
          hh[t][j] = ha[t][j] * x[j];
          x[j] = fmaf(dd.y, kBVar ? Bv[j] : Bf[j], hh[t][j]);
        }
      }

      // -- reverse over the tile
      float* prow = sP + tid * 3 * kPRow;
      float q1[2], q2[2], q3[2];
#pragma unroll
      for (int t = kT - 1; t >= 0; --t) {
        const float2 dd2 = sDT2[it.slot * kT + t];
        const float3 dd = make_float3(dd2.x, dd2.y, sDY[it.slot * kT + t]);   // dt, dt*u, dy
        float Bv[kNS], Cv[kNS];
        if constexpr (kPack) {
          fs_lds_bc<true>(Bv, Cv, sB + t * kRow + it.s * kNS);
        } else {
          if constexpr (kBVar) lds_vec(Bv, sB + t * kRow + it.s * kNS);
          if constexpr (kCVar) lds_vec(Cv, sC + t * kRow + it.s * kNS);
        }
        float s1 = 0.f, s2 = 0.f, yp = 0.f;
        float red[kNRed > 0 ? kNRed : 1];
#pragma unroll
        for (int j = 0; j < kNS; ++j) {
          const float bj = kBVar ? Bv[j] : Bf[j];
          const float cj = kCVar ? Cv[j] : Cf[j];
          const float xt = fmaf(dd.y, bj, hh[t][j]);
          yp = fmaf(cj, xt, yp);
          const float g = fmaf(dd.z, cj, carry[j]);
          const float w = g * hh[t][j];
          s2 = fmaf(Av[j], w, s2);
          dAacc[j] = fmaf(dd.x, w, dAacc[j]);
          s1 = fmaf(g, bj, s1);
          if constexpr (kBVar) red[j] = g * dd.y;
          else dBacc[j] = fmaf(g, dd.y, dBacc[j]);
          if constexpr (kCVar) red[(kBVar ? kNS : 0) + j] = dd.z * xt;
          else dCacc[j] = fmaf(dd.z, xt, dCacc[j]);
          carry[j] = ha[t][j] * g;
        }
        q1[t % 2] = s1; q2[t % 2] = s2; q3[t % 2] = yp;
        if (t % 2 == 0) {
          *(float2*)(prow + t) = make_float2(q1[0], q1[1]);
          *(float2*)(prow + kPRow + t) = make_float2(q2[0], q2[1]);
          *(float2*)(prow + 2 * kPRow + t) = make_float2(q3[0], q3[1]);
        }
        if constexpr (kNRed > 0) {
          // Sum over the warp's slots: reduce-scatter while more than one value is left, then all-reduce.
          int off = 0;
          bool dup = false;
#pragma unroll
          for (int lvl = 0, mask = kSplit; mask < 32; ++lvl, mask <<= 1) {
            const int m = (kNRed >> lvl) > 1 ? (kNRed >> lvl) : 1;
            const bool up = (lane & mask) != 0;
            if (m > 1) {
              const int h = m / 2;
#pragma unroll
              for (int i = 0; i < h; ++i) {
                const float send = up ? red[i] : red[i + h];
                const float keep = up ? red[i + h] : red[i];
                red[i] = keep + __shfl_xor_sync(0xffffffffu, send, mask);
              }
              off += up ? h : 0;
            } else {
              red[0] += __shfl_xor_sync(0xffffffffu, red[0], mask);
              dup = dup || up;
            }
          }
          constexpr int kLeft = (kNRed >> kLevels) > 1 ? (kNRed >> kLevels) : 1;
          if (!dup) {   // one writer per (warp, B/C, n, t): the warp's slice of sRed
            float* sRedW = sRed + (tid / 32) * kRWarp;
#pragma unroll
            for (int i = 0; i < kLeft; ++i) {
              const int idx = off + i;
              const bool isC = !kBVar || idx >= kNS;
              const int n = it.s * kNS + (isC && kBVar ? idx - kNS : idx);
              sRedW[((isC ? 1 : 0) * kDState + n) * kRRow + t] = red[i];
            }
          }
        }
      }
      __syncwarp();

      // -- epilogue of this lane's slice: sums over the slot's lanes; du, ddelta, dz
      if (ts0 < kT && it.active) {
        float o1[kTS], o2[kTS], o3[kTS];
#pragma unroll
        for (int i = 0; i < kTS; ++i) o1[i] = o2[i] = o3[i] = 0.f;
        const float* base = sP + (tid - it.s) * 3 * kPRow + ts0;
#pragma unroll
        for (int r = 0; r < kSplit; ++r) {
          if constexpr (kTS % 2 == 0) {
#pragma unroll
            for (int i = 0; i < kTS; i += 2) {
              const float2 v1 = *(const float2*)(base + r * 3 * kPRow + i);
              const float2 v2 = *(const float2*)(base + r * 3 * kPRow + kPRow + i);
              const float2 v3 = *(const float2*)(base + r * 3 * kPRow + 2 * kPRow + i);
              o1[i] += v1.x; o1[i + 1] += v1.y;
              o2[i] += v2.x; o2[i + 1] += v2.y;
              o3[i] += v3.x; o3[i + 1] += v3.y;
            }
          } else {
#pragma unroll
            for (int i = 0; i < kTS; ++i) {
              o1[i] += base[r * 3 * kPRow + i];
              o2[i] += base[r * 3 * kPRow + kPRow + i];
              o3[i] += base[r * 3 * kPRow + 2 * kPRow + i];
            }
          }
        }
        // dt and softplus'(v) = sigmoid(v) (1 past 20, where softplus is v), dy and dz: each uniform
        // test outside its element loop (the chains overlap, as in the forward)
        float vdu[kTS], vdd[kTS], vdz[kTS], dt[kTS], dsp[kTS], dy[kTS];
#pragma unroll
        for (int i = 0; i < kTS; ++i) {
          dt[i] = elem<FS_IN_DTYPE>(rdelta, i) + bias;
          dsp[i] = 1.f;
          dy[i] = elem<FS_IN_DTYPE>(rdout, i);
          vdz[i] = 0.f;
        }
        if (p.softplus) {
#pragma unroll
          for (int i = 0; i < kTS; ++i) {
            const float v = dt[i];
            dt[i] = softplus(v);
            if (v <= 20.f) dsp[i] = sigmoid(v);
          }
        }
        if (p.has_z) {
#pragma unroll
          for (int i = 0; i < kTS; ++i) {
            const float dout = dy[i];
            const float zz = elem<FS_IN_DTYPE>(rz, i);
            const float sg = sigmoid(zz);
            dy[i] = dout * zz * sg;
            const float y = fmaf(Dv, elem<FS_IN_DTYPE>(ru, i), o3[i]);
            vdz[i] = dout * y * sg * (1.f + zz * (1.f - sg));
          }
        }
#pragma unroll
        for (int i = 0; i < kTS; ++i) {
          const float uu = elem<FS_IN_DTYPE>(ru, i);
          vdu[i] = fmaf(dt[i], o1[i], Dv * dy[i]);
          const float ddt = fmaf(uu, o1[i], o2[i]) * dsp[i];
          vdd[i] = ddt;
          if (ts0 + i < valid) {
            dDacc = fmaf(dy[i], uu, dDacc);
            dbacc += ddt;
          }
        }
        const Ix off = t_begin + t0 + ts0;
        const int vsl = valid - ts0;
        Raw<kTS, kInBytes> w;
        pack_raw<FS_IN_DTYPE>(w, vdu);
        store_raw((char*)p.du + (it.b * ix(p.du_batch) + it.d * ix(p.du_dim) + off) * kInBytes, w, vsl, asl);
        pack_raw<FS_IN_DTYPE>(w, vdd);
        store_raw((char*)p.ddelta + (it.b * ix(p.ddelta_batch) + it.d * ix(p.ddelta_dim) + off) * kInBytes, w, vsl, asl);
        if (p.has_z) {
          pack_raw<FS_IN_DTYPE>(w, vdz);
          store_raw((char*)p.dz + (it.b * ix(p.dz_batch) + it.d * ix(p.dz_dim) + off) * kInBytes, w, vsl, asl);
        }
      }

      // -- varying dB / dC: the block's sums of this tile -> global
      if constexpr (kBVar || kCVar) {
        __syncthreads();
        for (int e = tid; e < 2 * kDState * kT; e += kThreads) {
          const int t = e % kT, rest = e / kT;
          const int which = rest / kDState, n = rest % kDState;
          if (n < p.dstate && t < valid && (which == 0 ? kBVar : kCVar)) {
            float v = 0.f;
#pragma unroll
            for (int w = 0; w < kWarps; ++w) v += sRed[w * kRWarp + rest * kRRow + t];
            const Ix tg = t_begin + t0 + t;
            if (which == 0 && kBVar) red_add(p.dB + it.b * ix(p.dB_batch) + it.group * ix(p.dB_group) + n * ix(p.dB_dstate) + tg, v);
            if (which == 1 && kCVar) red_add(p.dC + it.b * ix(p.dC_batch) + it.group * ix(p.dC_group) + n * ix(p.dC_dstate) + tg, v);
          }
        }
      }
    }
  }

  // ---- item results
#pragma unroll
  for (int j = 0; j < kNS; ++j) {
    const int n = it.s * kNS + j;
    if (!it.active || n >= p.dstate) continue;
    if (p.has_initial_state) p.dinit[it.b * p.dinit_batch + it.d * p.dinit_dim + n * p.dinit_dstate] = carry[j];
    red_add(p.dA + it.d * p.dA_dim + n * p.dA_dstate, dAacc[j]);
    if constexpr (!kBVar) red_add(p.dB + it.d * p.dB_dim + n * ix(p.dB_dstate), dBacc[j]);
    if constexpr (!kCVar) red_add(p.dC + it.d * p.dC_dim + n * ix(p.dC_dstate), dCacc[j]);
  }
#pragma unroll
  for (int m = kSplit / 2; m >= 1; m /= 2) {
    dDacc += __shfl_xor_sync(0xffffffffu, dDacc, m);
    dbacc += __shfl_xor_sync(0xffffffffu, dbacc, m);
  }
  if (it.active && it.s == 0) {
    if (p.has_D) red_add(p.dD + it.d * p.dD_dim, dDacc);
    if (p.has_delta_bias) red_add(p.ddelta_bias + it.d * p.ddelta_bias_dim, dbacc);
  }
}

// Main backward: persistent grid (gridDim.x <= nitems blocks loop over items), block FS_THREADS,
// dynamic smem 4 * Smem::kTotal. Needs the accumulated outputs zeroed (selective_scan_bwd_zero) and,
// when seqlen > FS_CHUNK, the chunk states (saved by the forward or by selective_scan_bwd_states).
extern "C" __global__ void __launch_bounds__(FS_THREADS, FS_MIN_BLOCKS) selective_scan_bwd(const ScanBwdParams p) {
  extern __shared__ float4 fs_smem4[];
  float* smem = (float*)fs_smem4;
  float* ck = p.ck + (i64)blockIdx.x * kNCk * kThreads * kNS;
  for (int item = blockIdx.x; item < p.nitems; item += gridDim.x) fs_bwd_item(p, item, smem, ck);
}

// Chunk states when the forward saved none: grid (nitems), block FS_THREADS, same dynamic smem. Scans each
// item forward and writes the state at the end of every chunk but the last into p.saved (written through
// a cast: the buffer is scratch owned by the launcher) with the saved_* strides.
extern "C" __global__ void __launch_bounds__(FS_THREADS, FS_MIN_BLOCKS) selective_scan_bwd_states(const ScanBwdParams p) {
  extern __shared__ float4 fs_smem4[];
  float* smem = (float*)fs_smem4;
  const Item it = fs_item(p, blockIdx.x);
  float A2[kNS], Bf[kNS], x[kNS];
#pragma unroll
  for (int j = 0; j < kNS; ++j) {
    const int n = it.s * kNS + j;
    const bool real = n < p.dstate;
    A2[j] = real ? __ldg(p.A + it.d * p.A_dim + n * p.A_dstate) * kLog2e : 0.f;
    Bf[j] = (!kBVar && real) ? ldg_f32<FS_BC_DTYPE>(p.B, it.d * p.B_dim + n * ix(p.B_dstate)) : 0.f;
    x[j] = (p.has_initial_state && real) ? __ldg(p.initial_state + it.b * p.init_batch + it.d * p.init_dim + n * p.init_dstate) : 0.f;
  }
  const float bias = p.has_delta_bias ? __ldg(p.delta_bias + it.d * p.delta_bias_dim) : 0.f;
  float* saved = (float*)p.saved;
  for (i64 c = 0; c < p.nsaved; ++c) {
    fs_forward_chunk<false>(p, it, c * kChunk, kChunk, x, A2, Bf, bias, smem, nullptr);
#pragma unroll
    for (int j = 0; j < kNS; ++j) {
      const int n = it.s * kNS + j;
      if (it.active && n < p.dstate) saved[it.b * p.saved_batch + it.d * p.saved_dim + c * p.saved_chunk + n * p.saved_dstate] = x[j];
    }
  }
}

// Zero the accumulated outputs (contiguous f32): grid-stride over zero_n[0..4] elements of dA, dB, dC, dD,
// ddelta_bias. Any grid, any block size.
extern "C" __global__ void selective_scan_bwd_zero(const ScanBwdParams p) {
  float* ptrs[5] = {p.dA, p.dB, p.dC, p.dD, p.ddelta_bias};
  const i64 stride = (i64)gridDim.x * blockDim.x;
#pragma unroll
  for (int k = 0; k < 5; ++k) {
    if (ptrs[k] == nullptr) continue;
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.zero_n[k]; i += stride) ptrs[k][i] = 0.f;
  }
}

// dB / dC in B's 16-bit dtype: the backward accumulates them in float32 scratch (zeroed by
// selective_scan_bwd_zero, summed by selective_scan_bwd), and this entry rounds each scratch
// array into its output once, so a 16-bit call needs no conversion of its own after the op.
// Both arrays are contiguous with the shape of B (checked by the launcher). Host mirror:
// ScanBwdCastParams in src/ops/scan_bwd.rs.
struct ScanBwdCastParams {
  const float* src[2];  // float32 accumulators of dB, dC
  void* dst[2];         // the dB, dC outputs (FS_BC_DTYPE, 16-bit)
  i64 n[2];             // element counts
};

// Grid-stride over n[0] + n[1] elements; any grid, any block size. Only 16-bit variants are
// launched (float32 dB / dC are accumulated in place).
extern "C" __global__ void selective_scan_bwd_cast(const ScanBwdCastParams p) {
#if FS_BC_DTYPE != 2
  const i64 stride = (i64)gridDim.x * blockDim.x;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    u16* dst = static_cast<u16*>(p.dst[k]);
    for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n[k]; i += stride)
      dst[i] = f32_to_half<FS_BC_DTYPE>(__ldg(p.src[k] + i));
  }
#endif
}
