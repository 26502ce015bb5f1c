// Causal depthwise conv1d (causal-conv1d semantics): forward, backward, and the decode update.
//
// Per batch row b, channel c, position t (W = FS_WIDTH, H = W - 1, xcat = [initial_states | x]
// along time, so xcat[t + H] = x[t] and xcat[j] = initial_states[j] for j < H, zeros without them):
//   y[t]   = bias[c] + sum_k weight[c, k] * m_k(t) * xcat[t + k]          (k = 0..W-1)
//   out[t] = silu(y[t]) when silu, else y[t]
//   final_states[j] = xcat[L + j], j < H                      (the last H inputs, for streaming)
//   m_k(t) = 1 without seq_idx; with it, seq_idx[t - H + k] == seq_idx[t] and seq_idx[t] >= 0
//            (positions before 0 never match: seq_idx excludes initial_states)
// Backward, dy[t] = dout[t] * silu'(y[t]) (or dout[t]):
//   dxcat[p] = sum_k weight[c, k] * m_k(t) * dy[t], t = p - k   (+ dfinal[p - L] for p >= L)
//   dx[t] = dxcat[t + H], dinitial_states[j] = dxcat[j]
//   dweight[c, k] = sum_{b,t} dy[t] * m_k(t) * xcat[t + k], dbias[c] = sum_{b,t} dy[t]
//
// Two layouts of x (batch, dim, seqlen), each with its own kernels, fp32 accumulation throughout:
// - channel-first (seqlen stride 1): forward block = one (channel c, chunk of kChunk positions,
//   batch b); thread i owns kItems = 2 * kVec consecutive positions (two 16-byte loads / stores),
//   and reads the H positions on each side it needs (the neighbours' data: L1 hits) element by
//   element. The backward walks a row's steps of kThreads 16-byte slices (one a thread) backwards
//   and trades the halos through shared memory (causal_conv1d_bwd_cf); with seq_idx it runs the
//   forward's ownership with per-element halos and masks (causal_conv1d_bwd_cf_seq). Rows that
//   fewer than kThreads threads cover (short sequences: the real-time shapes) share blocks, a row
//   to each 2^cf_lg threads (causal_conv1d_fwd_cf_rows, causal_conv1d_bwd_cf_rows).
// - channel-last (dim stride 1): block = 4 warps x 32 lanes; lane l owns kVecF = 4 consecutive
//   channels (one 8-byte slice of a row for 16-bit x, 16 bytes for fp32), warp w a range of kT
//   positions (forward) or kTB (backward), walked in order with the last H inputs (and in the
//   backward the last H dy) kept in registers. Rows stream through a per-warp ring of shared-memory
//   stages filled by cp.async, so several steps of loads are in flight per lane without holding
//   registers. Interior warps (no seq_idx, aligned rows, dim % 4 == 0, the walk inside the
//   sequence; 16-bit for the backward) take a lean walk: no per-row bounds, masks, 64-bit index
//   products or register moves (the history in slot r % H of an unrolled 6-row stage); the
//   general walk serves seq_idx, the sequence's edges, partial or unaligned rows. Grids that
//   would not fill one wave of blocks take shorter walks (p.cl_rows, down to 4 positions a warp:
//   the general walk) so that short sequences spread over the SMs.
//   H100, b8 L2048 d5376 bf16 width 4: the forward 173 -> 133 us (ring) -> 125.5 (lean walk, 89% of
//   copy); the backward 862 -> 362 us (ring; it held 16-byte slices of x, dout and both histories
//   in 253 registers before) -> 231 (lean walk: ~250 -> ~110 SASS instructions a row) at 3 blocks
//   per SM (4 spill the general walk and measured 240).
// Every other forward / backward kernel runs one of two bodies (kSeq: seq_idx given or not), so a
// call without seq_idx evaluates no mask.
// Backward dweight / dbias: each block reduces its own partial sums (shuffles, then shared memory
// across warps) and writes them to partials[part][c][W + 1] (part = b * blocks along time + block);
// causal_conv1d_dw_reduce sums the parts per (c, k) in a fixed order: deterministic, no atomics.
// Decode (causal_conv1d_update): one thread per (b, c); conv_state (batch, dim, state_len) is
// shifted left by the new inputs, or with cache_seqlens a ring whose next slot is
// cache_seqlens[b] % state_len.
//
// Compile-time constants (host prelude):
//   FS_DTYPE    x / out / states / dout / dx dtype: 0 = fp16, 1 = bf16, 2 = fp32
//   FS_W_DTYPE  weight / bias / dweight / dbias dtype (FS_DTYPE or fp32)
//   FS_WIDTH    the kernel width W, 2..4
//   FS_ENTRY    which entry this translation unit holds (0 fwd_cf, 1 fwd_cl, 2 bwd_cf, 3 bwd_cl,
//               4 dw_reduce, 5 update, 6 bwd_cf_seq, 7 fwd_cf_rows, 8 bwd_cf_rows; -1 or absent: all): a variant compiles
//               only its own kernel

#if !defined(FS_DTYPE) || !defined(FS_W_DTYPE) || !defined(FS_WIDTH)
#error "the host prelude must define FS_DTYPE, FS_W_DTYPE and FS_WIDTH"
#endif

#ifndef FS_ENTRY
#define FS_ENTRY -1
#endif
#define FS_HAS_ENTRY(n) (FS_ENTRY < 0 || FS_ENTRY == (n))

#include "common/copy.cuh"
#include "common/math.cuh"

using namespace fs;

// One by-value parameter block for every entry: 16 pointers, 40 int64s, 12 int32s (sizeof = 496).
// Strides in elements, in the logical order (batch, dim, seqlen) for x-like tensors, (batch,
// seqlen) for seq_idx, (dim, width) for weight / dweight. Absent tensors are null.
struct Conv1dParams {
  const void* x;            // (batch, dim, seqlen)   FS_DTYPE
  const void* weight;       // (dim, W)               FS_W_DTYPE
  const void* bias;         // (dim,)                 FS_W_DTYPE
  const void* init;         // (batch, dim, H)        FS_DTYPE  initial_states
  const int* seq_idx;       // (batch, seqlen)        int32
  void* out;                // like x
  void* final_states;       // (batch, dim, H)        FS_DTYPE
  const void* dout;         // like x
  const void* dfinal;       // (batch, dim, H)        FS_DTYPE  gradient of final_states
  void* dx;                 // like x
  void* dinit;              // (batch, dim, H)        FS_DTYPE
  float* partials;          // (nparts, dim, W + 1)   fp32 scratch of the backward
  void* dweight;            // (dim, W)               FS_W_DTYPE
  void* dbias;              // (dim,)                 FS_W_DTYPE
  void* state;              // (batch, dim, state_len) FS_DTYPE, in place (update)
  const int* cache_seqlens; // (batch,)               int32 (update, ring mode)
  i64 batch, dim, seqlen, state_len, nparts;
  i64 x_s[3], out_s[3], init_s[3], final_s[3], dout_s[3], dfinal_s[3], dx_s[3], dinit_s[3], state_s[3];
  i64 seq_s[2], w_s[2], dw_s[2];
  i64 bias_s, dbias_s;
  int silu, has_bias, has_init, has_seq, has_final, has_dfinal, has_dinit, circular;
  // channel-last forward / backward: positions a warp walks. kT / kTB, or (host: conv1d.rs
  // `cl_rows`) the fewest, a power of two down to 4, whose grid still fits one wave of blocks
  // (short sequences, small batches); only a warp of kT / kTB rows takes the lean walk.
  int cl_rows;
  // channel-first *_rows kernels: log2 of the threads T a row (T < kThreads: a block serves
  // kThreads / T rows; host: conv1d.rs `cf_rows`)
  int cf_lg;
  // 32-bit index arithmetic. Decode update: every element offset of x, out, conv_state, weight,
  // bias is below 2^31 (host: conv1d.rs `offsets_fit_i32`). The channel-last short walks: every
  // byte offset of the call's tensors is (`byte_offsets_fit_i32`)
  int idx32;
  // the channel-last short walks: weight rows contiguous (strides W, 1) from a 16-byte-aligned
  // base and bias contiguous from a (kVecF element)-aligned one (host: conv1d.rs `weights_packed`):
  // a lane's kVecF x W weights are one run of vector loads (lane_weights_short)
  int w_vec;
};
static_assert(sizeof(Conv1dParams) == 496, "Conv1dParams layout changed: update the host mirror");

constexpr int DT = FS_DTYPE;
constexpr int WDT = FS_W_DTYPE;
constexpr int kW = FS_WIDTH;
constexpr int kH = kW - 1;
constexpr int kES = DT == 2 ? 4 : 2;
constexpr int kVec = 16 / kES;            // elements per 16-byte access
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kItems = 2 * kVec;          // channel-first: positions per thread
constexpr int kChunk = kThreads * kItems; // channel-first: positions per block
constexpr int kT = 32;                    // channel-last forward: positions per warp
constexpr int kTB = 64;                   // channel-last backward: positions per warp
constexpr int kVecF = 4;                  // channel-last: channels per lane
constexpr int kU = 4;                     // channel-last forward: rows per ring stage
constexpr int kUB = 2;                    // channel-last backward: rows (of x and of dout) per stage
static_assert(kW >= 2 && kW <= 4, "FS_WIDTH: 2..4");
static_assert(kT % kU == 0 && kTB % kUB == 0, "kT / kTB must be multiples of kU / kUB");

// ---- helpers -------------------------------------------------------------------------------------
// The widest access (16 / 8 / 4 / 2 bytes) the address allows.
__device__ __forceinline__ int align_of(const void* p) {
  const unsigned long long a = (unsigned long long)p;
  return (a & 15) == 0 ? 16 : (a & 7) == 0 ? 8 : (a & 3) == 0 ? 4 : 2;
}
__device__ __forceinline__ const char* elem_ptr(const void* base, i64 idx) {
  return (const char*)base + idx * kES;
}
// N consecutive FS_DTYPE elements at base + idx as f32 (zero past `valid`), vectorised when aligned.
template <int N>
__device__ __forceinline__ void load_f32(float (&v)[N], const void* base, i64 idx, i64 valid) {
  Raw<N, kES> r;
  const char* q = elem_ptr(base, idx);
  load_raw<N, kES>(r, q, (int)(valid < N ? valid : N), align_of(q));
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = elem<DT>(r, i);
}
// Store the first min(valid, N) of v at base + idx in FS_DTYPE, vectorised when aligned.
template <int N>
__device__ __forceinline__ void store_f32(void* base, i64 idx, const float (&v)[N], i64 valid) {
  Raw<N, kES> r;
  pack_raw<DT, N>(r, v);
  char* q = (char*)base + idx * kES;
  store_raw<N, kES>(q, r, (int)(valid < N ? valid : N), align_of(q));
}
// A plain (coherent) load of an element the kernel may also write: the decode state.
__device__ __forceinline__ float ld_state(const void* base, i64 idx) {
  if constexpr (DT == 2) return ((const float*)base)[idx];
  else return half_to_f32<DT>(((const u16*)base)[idx]);
}
// A state / x element's raw bits (ld_state_raw, ldg_raw) as float.
__device__ __forceinline__ float raw_f32(u32 v) {
  if constexpr (DT == 2) return __uint_as_float(v);
  else return half_to_f32<DT>((u16)v);
}
__device__ __forceinline__ u32 ld_state_raw(const void* base, i64 idx) {
  if constexpr (DT == 2) return ((const u32*)base)[idx];
  else return ((const u16*)base)[idx];
}
__device__ __forceinline__ void st_state_raw(void* base, i64 idx, u32 v) {
  if constexpr (DT == 2) ((u32*)base)[idx] = v;
  else ((u16*)base)[idx] = (u16)v;
}
// d silu(y) / dy = s + y s (1 - s), s = sigmoid(y).
__device__ __forceinline__ float dsilu(float y) {
  const float s = sigmoid(y);
  return s * fmaf(y, 1.f - s, 1.f);
}
// Input at a position p < 0 (before x): initial_states[b, c, p + H], or 0.
__device__ __forceinline__ float before_x(const Conv1dParams& p, i64 b, i64 c, i64 pos) {
  return p.has_init ? ldg_f32<DT>(p.init, b * p.init_s[0] + c * p.init_s[1] + (pos + kH) * p.init_s[2]) : 0.f;
}
// Sequence id at pos (-1 outside [0, seqlen): matches nothing).
__device__ __forceinline__ int seq_at(const Conv1dParams& p, i64 b, i64 pos) {
  return (pos >= 0 && pos < p.seqlen) ? __ldg(p.seq_idx + b * p.seq_s[0] + pos * p.seq_s[1]) : -1;
}
__device__ __forceinline__ bool same_seq(int a, int t) { return a == t && t >= 0; }

// ==== channel-first forward ========================================================================
// causal_conv1d_fwd_cf: grid (dim * ceil(seqlen / kChunk), batch), block kThreads. Thread i:
// positions s0 .. s0 + kItems - 1, s0 = chunk * kChunk + i * kItems; window index q <-> position
// s0 - H + q.
// causal_conv1d_fwd_cf_rows (kRows), for rows shorter than kChunk (host: conv1d.rs `cf_rows`):
// T = 2^p.cf_lg < kThreads threads a row (the fewest whose kItems each cover it), R = kThreads / T
// rows a block, grid (ceil(dim / R), batch); thread i: channel c = blockIdx.x R + i / T, s0 =
// (i % T) kItems. Short rows had a block each, most of its threads idle: b32 L60 d640 ran 20480
// blocks of 4 working threads, 19.4 us on the H200 against 8.3 packed. Its own entry: one kernel
// with T at run time for every row measured 104.5 against 100 us at b8 L2048 d5376 bf16 (H200).
#if FS_HAS_ENTRY(0) || FS_HAS_ENTRY(7) || FS_HAS_ENTRY(9)
// The long rows' common thread (no seq_idx, all kItems positions inside the row, x and out rows
// 16-byte aligned, no final states to write): two vector loads, the H inputs before it from the
// previous 16 bytes (one vector, an L1 hit) or initial_states at the row's start, the window slid
// through registers and each pair of outputs packed as it is formed, two vector stores. The
// general body (load_f32 / store_f32 with run-time alignment paths) held all kItems inputs and
// outputs as floats: 55 registers, 9 blocks an SM, 49% achieved occupancy, against causal-conv1d's
// 32 registers and 95% (ncu, H200, b8 L2048 d5376: 100.2 vs 92.0 us).
template <bool kSilu>
__device__ __forceinline__ void fwd_cf_fast(const Conv1dParams& p, i64 b, i64 c, i64 s0, const char* qx, char* qo,
                                            const float (&w)[kW], float bias) {
  Raw<kItems, kES> xr;
  load_raw<kItems, kES>(xr, qx, kItems, 16);
  float win[kW];  // win[k]: the input at s - H + k for the output s being formed
  if (s0 > 0) {
    Raw<kVec, kES> prev;
    load_raw<kVec, kES>(prev, qx - 16, kVec, 16);
#pragma unroll
    for (int j = 0; j < kH; ++j) win[j] = elem<DT>(prev, kVec - kH + j);
  } else {
#pragma unroll
    for (int j = 0; j < kH; ++j) win[j] = before_x(p, b, c, j - kH);
  }
  Raw<kItems, kES> orr;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    win[kH] = elem<DT>(xr, i);
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kW; ++k) acc = fmaf(w[k], win[k], acc);
    const float o = kSilu ? silu(acc) : acc;
    if constexpr (DT == 2) {
      orr.w[i] = __float_as_uint(o);
    } else if (i & 1) {
      orr.w[i / 2] = pack2<DT>(__uint_as_float(orr.w[i / 2]), o);  // the even output waits in its word
    } else {
      orr.w[i / 2] = __float_as_uint(o);
    }
#pragma unroll
    for (int k = 0; k < kH; ++k) win[k] = win[k + 1];
  }
  store_raw<kItems, kES>(qo, orr, kItems, 16);
}

template <bool kSeq, bool kRows>
__device__ __forceinline__ void fwd_cf(const Conv1dParams& p) {
  i64 c, s0;
  if constexpr (kRows) {
    const int lg = p.cf_lg;
    c = (i64)blockIdx.x * (kThreads >> lg) + (threadIdx.x >> lg);
    s0 = (i64)(threadIdx.x & ((1u << lg) - 1)) * kItems;
    if (c >= p.dim) return;  // no block barrier in this kernel
  } else {
    // grid.x = dim * nchunks < 2^31: 32-bit division (a 64-bit one is a subroutine call)
    const u32 nchunks = (u32)((p.seqlen + kChunk - 1) / kChunk);
    c = blockIdx.x / nchunks;
    s0 = (i64)(blockIdx.x % nchunks) * kChunk + (i64)threadIdx.x * kItems;
  }
  const i64 b = blockIdx.y;
  if (s0 >= p.seqlen) return;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = ldg_f32<WDT>(p.weight, c * p.w_s[0] + k * p.w_s[1]);
  const float bias = p.has_bias ? ldg_f32<WDT>(p.bias, c * p.bias_s) : 0.f;
  const i64 xrow = b * p.x_s[0] + c * p.x_s[1];
  float xi[kItems], xh[kH];
  load_f32<kItems>(xi, p.x, xrow + s0, p.seqlen - s0);
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    const i64 pos = s0 - kH + j;
    xh[j] = pos >= 0 ? ldg_f32<DT>(p.x, xrow + pos) : before_x(p, b, c, pos);
  }
  int sq[kH + kItems];
#pragma unroll
  for (int q = 0; q < kH + kItems; ++q) sq[q] = kSeq ? seq_at(p, b, s0 - kH + q) : 0;
  float o[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      const int q = i + k;
      float v = q < kH ? xh[q] : xi[q - kH];
      if (kSeq && !same_seq(sq[q], sq[i + kH])) v = 0.f;
      acc = fmaf(w[k], v, acc);
    }
    o[i] = p.silu ? silu(acc) : acc;
  }
  store_f32<kItems>(p.out, b * p.out_s[0] + c * p.out_s[1] + s0, o, p.seqlen - s0);
  if (p.has_final && s0 + kItems >= p.seqlen) {
    // this thread holds position L - 1: final[j] = position L - H + j = window index L - s0 + j
    const int base = (int)(p.seqlen - s0);
    const i64 f0 = b * p.final_s[0] + c * p.final_s[1];
#pragma unroll
    for (int q = 0; q < kH + kItems; ++q) {
      const int j = q - base;
      if (j >= 0 && j < kH) st_f32<DT>(p.final_states, f0 + j * p.final_s[2], q < kH ? xh[q] : xi[q - kH]);
    }
  }
}
#endif
#if FS_HAS_ENTRY(0)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_fwd_cf(const Conv1dParams p) {
  if (p.has_seq) fwd_cf<true, false>(p);  // kSeq: seq_idx given; without it no mask is evaluated
  else fwd_cf<false, false>(p);
}
#endif
// A launch whose every thread is the fast one (host: conv1d.rs `cf_fast`: no seq_idx, no final
// states, seqlen a multiple of kItems, x and out rows 16-byte aligned): one row a block as
// causal_conv1d_fwd_cf, 16 blocks an SM (<= 32 registers, none spilled; as causal-conv1d's kernel).
#if FS_HAS_ENTRY(9)
extern "C" __global__ void __launch_bounds__(kThreads, 16) causal_conv1d_fwd_cf_fast(const Conv1dParams p) {
  const u32 nchunks = (u32)((p.seqlen + kChunk - 1) / kChunk);
  const i64 c = blockIdx.x / nchunks;
  const i64 s0 = (i64)(blockIdx.x % nchunks) * kChunk + (i64)threadIdx.x * kItems;
  const i64 b = blockIdx.y;
  if (s0 >= p.seqlen) return;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = ldg_f32<WDT>(p.weight, c * p.w_s[0] + k * p.w_s[1]);
  const float bias = p.has_bias ? ldg_f32<WDT>(p.bias, c * p.bias_s) : 0.f;
  const char* qx = elem_ptr(p.x, b * p.x_s[0] + c * p.x_s[1] + s0);
  char* qo = (char*)p.out + (b * p.out_s[0] + c * p.out_s[1] + s0) * kES;
  if (p.silu) fwd_cf_fast<true>(p, b, c, s0, qx, qo, w, bias);
  else fwd_cf_fast<false>(p, b, c, s0, qx, qo, w, bias);
}
#endif
#if FS_HAS_ENTRY(7)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_fwd_cf_rows(const Conv1dParams p) {
  if (p.has_seq) fwd_cf<true, true>(p);
  else fwd_cf<false, true>(p);
}
#endif

// ==== the channel-last ring =========================================================================
// Each warp streams its rows through a private ring of shared-memory stages filled by cp.async
// (LDGSTS: no registers held by the copies in flight), so several steps of loads are in flight per
// lane while it computes on an earlier one. Lane l's slice of a row (kVecF channels, kRowB bytes)
// sits at [stage][row][lane]: one conflict-free ld.shared per row. Rows whose slices are not
// kRowB-aligned (odd strides or base) take the synchronous path into the same slots.
#if FS_HAS_ENTRY(1) || FS_HAS_ENTRY(3) || FS_HAS_ENTRY(10) || FS_HAS_ENTRY(11) || FS_HAS_ENTRY(12)
constexpr int kRowB = kVecF * kES;        // bytes of one lane's slice of a row: 8 (16-bit) or 16 (fp32)
constexpr u32 kRowStride = 32 * kRowB;    // bytes between rows of one stage
using RowRaw = Raw<kVecF, kES>;
// The lean walks (interior warps: no bounds, masks or 64-bit index products in their loops): rows go
// kR at a time through kSL ring stages, pointers advanced by the row stride; since kR is a multiple
// of every H, the history of row r (relative to the warp's first) sits in slot r % H, a compile-time
// index in the unrolled stage (row j of a stage: slot j % H), so the window slides without moves.
constexpr int kR = 6;                     // rows a stage: a multiple of H = 1, 2, 3
constexpr int kSL = 3;                    // stages a warp: two in flight while one is read
constexpr u32 kStageL = kR * kRowStride;  // 1.5 KB (16-bit) / 3 KB (fp32) a stage and tensor
static_assert(kR % kH == 0, "a lean stage must hold whole history periods");

// Stage q of a warp's walk of kWalk rows, kStageRows a stage, into ring slot q % kSlots of the
// warp's ring at dst ([slot][row][lane], rows 32 kSliceB bytes apart): this lane's kSliceB-byte slice
// of each row from src, which then moves on a stage of rows (stride: bytes a row); a stage past
// the walk issues nothing. The caller commits the group. (The lean forward walk and the wide one.)
template <int kSliceB, int kStageRows, int kSlots, int kWalk>
__device__ __forceinline__ void ring_issue(u32 dst, const char*& src, i64 stride, int q) {
  constexpr u32 kRowPitch = 32 * kSliceB, kSlotBytes = kStageRows * kRowPitch;
  if (q < (kWalk + kStageRows - 1) / kStageRows) {
    const u32 off = (q % kSlots) * kSlotBytes;
#pragma unroll
    for (int j = 0; j < kStageRows; ++j) {
      if (q * kStageRows + j < kWalk) cp_async_ca<kSliceB>(dst + off + j * kRowPitch, src + j * stride, kSliceB);
    }
    src += kStageRows * stride;
  }
}

// Whether every lane's slice of every row of a tensor like x is kRowB-aligned (c0 is a multiple of
// kVecF and the dim stride is 1).
__device__ __forceinline__ bool rows_aligned(const void* base, const i64 (&s)[3]) {
  return align_of(base) >= kRowB && s[0] % kVecF == 0 && s[2] % kVecF == 0;
}
// Rows t0 .. t0 + N - 1 of this lane's slice (src row t at base + (rb + t * ts2) elements) into the
// ring at dst, row u at dst + u kRowStride; rows at or past tv are zero-filled and read nothing.
template <int N>
__device__ __forceinline__ void ring_rows(u32 dst, const void* base, i64 rb, i64 ts2, i64 t0, i64 tv, int nv,
                                          bool vec) {
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const bool in = t0 + u < tv;
    const char* src = elem_ptr(base, rb + (in ? t0 + u : 0) * ts2);
    const int n = in ? nv : 0;
    if (vec) {
      cp_async_ca<kRowB>(dst + u * kRowStride, src, n * kES);
    } else {
      RowRaw r;
      load_raw<kVecF, kES>(r, src, n, align_of(src));
      sts_raw(dst + u * kRowStride, r);
    }
  }
}
// seq_idx of rows t0 .. t0 + N - 1 (-1 at or past tv): loaded one step ahead of their use.
template <bool kSeq, int N>
__device__ __forceinline__ void seq_rows(int (&s)[N], const Conv1dParams& p, i64 b, i64 t0, i64 tv) {
#pragma unroll
  for (int u = 0; u < N; ++u) s[u] = kSeq ? seq_at(p, b, t0 + u < tv ? t0 + u : -1) : 0;
}
// Store a lane's row slice (nv of kVecF valid) at base + idx elements; `vec`: every row slice of
// this tensor is kRowB-aligned (rows_aligned), so full slices take one vector store.
__device__ __forceinline__ void store_row(void* base, i64 idx, const float (&v)[kVecF], int nv, bool vec) {
  RowRaw r;
  pack_raw<DT, kVecF>(r, v);
  char* q = (char*)base + idx * kES;
  store_raw<kVecF, kES>(q, r, nv, vec ? kRowB : align_of(q));
}
// The lane's weights and bias for channels c0 .. c0 + kVecF - 1 (past dim: the last channel's).
// Ix: the index type (int where the host saw every byte offset below 2^31, p.idx32).
template <typename Ix>
__device__ __forceinline__ void lane_weights(float (&w)[kW][kVecF], float (&bias)[kVecF], const Conv1dParams& p,
                                             Ix c0) {
  const Ix dim = (Ix)p.dim, ws0 = (Ix)p.w_s[0], ws1 = (Ix)p.w_s[1], bs = (Ix)p.bias_s;
#pragma unroll
  for (int i = 0; i < kVecF; ++i) {
    const Ix c = c0 + i < dim ? c0 + i : dim - 1;
#pragma unroll
    for (int k = 0; k < kW; ++k) w[k][i] = ldg_f32<WDT>(p.weight, c * ws0 + k * ws1);
    bias[i] = p.has_bias ? ldg_f32<WDT>(p.bias, c * bs) : 0.f;
  }
}
// A lane's weights and bias for N full channels from c0, packed (host: conv1d.rs `weights_packed`:
// weight rows contiguous from a 16-byte-aligned base, bias contiguous and vector-aligned): the lane's
// N x W weights are one contiguous run (channel-major) of 8- / 16-byte loads (its offset c0 W kWES is
// a multiple of the run's bytes), its biases 8- / 16-byte vectors.
template <int N, typename Ix>
__device__ __forceinline__ void lane_weights_packed(float (&w)[kW][N], float (&bias)[N], const Conv1dParams& p, Ix c0) {
  constexpr int kWES = WDT == 2 ? 4 : 2;
  constexpr int kN = N * kW;
  constexpr int kAl = (kN * kWES) % 16 == 0 ? 16 : 8;
  constexpr int kBAl = N * kWES < 16 ? N * kWES : 16;
  Raw<kN, kWES> r;
  load_raw<kN, kWES>(r, (const char*)p.weight + c0 * (Ix)(kW * kWES), kN, kAl);
  Raw<N, kWES> rb{};  // zero bits: a 0 bias in every dtype
  if (p.has_bias) load_raw<N, kWES>(rb, (const char*)p.bias + c0 * (Ix)kWES, N, kBAl);
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int k = 0; k < kW; ++k) w[k][i] = elem<WDT>(r, i * kW + k);
    bias[i] = elem<WDT>(rb, i);
  }
}
// The short walks' weights and bias (full lane slices): with p.w_vec packed, W / 2 (16-bit, W even)
// or W (8-byte loads of 16-bit W = 3, 16-byte of fp32) vector loads and one for the bias, where
// lane_weights issues W + 1 scalar loads a channel, each with its own index product (ncu, H200,
// b32 L60 d640: 20 of the forward's 34 loads).
template <typename Ix>
__device__ __forceinline__ void lane_weights_short(float (&w)[kW][kVecF], float (&bias)[kVecF], const Conv1dParams& p,
                                                   Ix c0) {
  if (p.w_vec) lane_weights_packed<kVecF>(w, bias, p, c0);
  else lane_weights(w, bias, p, c0);
}
// A lean forward stage (the ring section's note): rows it * kRows + j (j < kRows) of a warp's kT from
// the ring stage at rx, a lane on N channels (N x kES bytes a row slice, 32 slices a stage row); x at
// row r - H + k (k < H) sits in slot (j + k) % H of xh, kRows a multiple of H; the last stage may be
// partial (kCheck). The 4-channel lean walk (fwd_cl_lean) and the 8-channel wide one (fwd_cl_wide).
template <int N, int kRows, bool kSilu, bool kCheck>
__device__ __forceinline__ void lean_fwd_stage(const float (&w)[kW][N], const float (&bias)[N], float (&xh)[kH][N],
                                               u32 rx, char* outs, i64 so, int it) {
  static_assert(kRows % kH == 0, "a lean stage must hold whole history periods");
  constexpr int kSliceB = N * kES;
#pragma unroll
  for (int j = 0; j < kRows; ++j) {
    if (kCheck && it * kRows + j >= kT) break;
    Raw<N, kES> xraw;
    lds_raw(xraw, rx + j * (32 * kSliceB));
    float xr[N], o[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      xr[i] = elem<DT>(xraw, i);
      float acc = bias[i];
#pragma unroll
      for (int k = 0; k < kH; ++k) acc = fmaf(w[k][i], xh[(j + k) % kH][i], acc);
      acc = fmaf(w[kH][i], xr[i], acc);
      o[i] = kSilu ? silu(acc) : acc;
    }
    Raw<N, kES> out;
    pack_raw<DT, N>(out, o);
    store_raw<N, kES>(outs + j * so, out, N, kSliceB);
#pragma unroll
    for (int i = 0; i < N; ++i) xh[j % kH][i] = xr[i];
  }
}
// The short forward's rows: every row's vector load is issued first (short_load, from an address
// clamped into the sequence), and only then converted or replaced (short_x). With the load and its
// conversion in one branch per row the kernel took 5.5 us at b32 L60 d640, 4.7 so (b1: 3.4 -> 2.5;
// H200). The short backward keeps its per-row branches: the same there measured 8.2 -> 8.4 us
// (b1 5.1 -> 5.6) at 168 registers instead of 142.
// Rows t0 .. t0 + N - 1 of a lane slice (full, kRowB-aligned) of a tensor like x at rb elements.
template <int N, typename Ix>
__device__ __forceinline__ void short_load(RowRaw (&raw)[N], const void* base, Ix rb, Ix ts2, Ix t0, Ix L) {
  const char* g = (const char*)base + rb * kES;
  const Ix step = ts2 * kES;
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const Ix t = t0 + j;
    load_raw<kVecF, kES>(raw[j], g + (t < 0 ? 0 : t < L ? t : L - 1) * step, kVecF, kRowB);
  }
}
// x rows t0 + j as floats: before_x values before position 0, 0 from seqlen on.
template <int N, typename Ix>
__device__ __forceinline__ void short_x(float (&xf)[N][kVecF], const RowRaw (&raw)[N], const Conv1dParams& p, Ix b,
                                        Ix c0, Ix t0, Ix L) {
#pragma unroll
  for (int j = 0; j < N; ++j) {
    const Ix t = t0 + j;
#pragma unroll
    for (int i = 0; i < kVecF; ++i) xf[j][i] = elem<DT>(raw[j], i);
    if (t < 0 || t >= L) {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) xf[j][i] = t < 0 ? before_x(p, b, c0 + i, t) : 0.f;
    }
  }
}
// The H inputs before ts (x, or initial_states before position 0) and their seq ids.
template <bool kSeq>
__device__ __forceinline__ void lane_history(float (&h)[kH][kVecF], int (&hs)[kH], const Conv1dParams& p, i64 b,
                                             i64 c0, i64 xb, i64 ts, int nv) {
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    const i64 pos = ts - kH + j;
    if (pos >= 0) {
      load_f32<kVecF>(h[j], p.x, xb + pos * p.x_s[2], nv);
    } else {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) h[j][i] = i < nv ? before_x(p, b, c0 + i, pos) : 0.f;
    }
    hs[j] = kSeq ? seq_at(p, b, pos) : 0;
  }
}
#endif

// ==== channel-last forward =========================================================================
// grid (ceil(dim / (32 kVecF)), ceil(seqlen / (kWarps R)), batch), block kThreads, R = p.cl_rows (kT,
// or fewer on small grids). Lane l of warp w: channels c0 .. c0 + kVecF - 1 (c0 = (blockIdx.x * 32 +
// l) * kVecF) at positions ts .. ts + R - 1 (ts = (blockIdx.y * kWarps + w) * R), in order; h[j]
// holds the input at t - H + j. Rows go in steps of kU through a ring of kSF stages: kSF - 1 steps
// of loads in flight.
#if FS_HAS_ENTRY(1)
constexpr int kSF = 4;
constexpr u32 kStageF = kU * kRowStride;  // 1 KB (16-bit) / 2 KB (fp32); the ring 16 / 32 KB a block
// kSeq: seq_idx given (the kernel picks one body per call: without it no mask is evaluated)
template <bool kSeq>
__device__ __forceinline__ void fwd_cl(const Conv1dParams& p, u32 ring) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const i64 c0 = ((i64)blockIdx.x * 32 + lane) * kVecF;
  const i64 ts = ((i64)blockIdx.y * kWarps + warp) * p.cl_rows;
  const i64 b = blockIdx.z;
  if (c0 >= p.dim || ts >= p.seqlen) return;  // no block barrier in this kernel
  const int nv = (int)(p.dim - c0 < kVecF ? p.dim - c0 : kVecF);  // channels of this lane that exist
  const i64 te = ts + p.cl_rows < p.seqlen ? ts + p.cl_rows : p.seqlen;
  const int nsteps = (int)((te - ts + kU - 1) / kU);
  const i64 xb = b * p.x_s[0] + c0;
  const bool vec = rows_aligned(p.x, p.x_s), vout = rows_aligned(p.out, p.out_s);
  const u32 ring0 = ring + lane * kRowB;  // this warp's ring: [stage][row][lane]
  // step s's rows into stage s % kSF (none past the last step), then close the group
  auto issue = [&](int s) {
    if (s < nsteps) ring_rows<kU>(ring0 + (s % kSF) * kStageF, p.x, xb, p.x_s[2], ts + s * kU, te, nv, vec);
    cp_async_commit();
  };
#pragma unroll
  for (int s = 0; s < kSF - 1; ++s) issue(s);
  float w[kW][kVecF], bias[kVecF], h[kH][kVecF];
  int hs[kH], sr[kU], sn[kU];
  lane_weights(w, bias, p, c0);
  lane_history<kSeq>(h, hs, p, b, c0, xb, ts, nv);
  seq_rows<kSeq>(sr, p, b, ts, te);
  const i64 ob = b * p.out_s[0] + c0;
  for (int st = 0; st < nsteps; ++st) {
    issue(st + kSF - 1);
    const i64 t0 = ts + (i64)st * kU;
    seq_rows<kSeq>(sn, p, b, t0 + kU, te);
    cp_async_wait<kSF - 1>();  // step st's rows are in the ring
    const u32 stage = ring0 + (st % kSF) * kStageF;
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const i64 t = t0 + u;
      if (t >= te) break;
      RowRaw xr;
      lds_raw(xr, stage + u * kRowStride);
      float o[kVecF];
#pragma unroll
      for (int i = 0; i < kVecF; ++i) {
        float acc = bias[i];
#pragma unroll
        for (int k = 0; k < kH; ++k) {
          const float v = (kSeq && !same_seq(hs[k], sr[u])) ? 0.f : h[k][i];
          acc = fmaf(w[k][i], v, acc);
        }
        const float v = (kSeq && sr[u] < 0) ? 0.f : elem<DT>(xr, i);
        acc = fmaf(w[kH][i], v, acc);
        o[i] = p.silu ? silu(acc) : acc;
      }
      store_row(p.out, ob + t * p.out_s[2], o, nv, vout);
#pragma unroll
      for (int j = 0; j < kH; ++j) {
#pragma unroll
        for (int i = 0; i < kVecF; ++i) h[j][i] = j + 1 < kH ? h[j + 1][i] : elem<DT>(xr, i);
        hs[j] = j + 1 < kH ? hs[j + 1] : sr[u];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) sr[u] = sn[u];
  }
  if (p.has_final && te == p.seqlen) {
    // h holds positions L - H .. L - 1: the final states
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      if (i >= nv) break;
      const i64 f0 = b * p.final_s[0] + (c0 + i) * p.final_s[1];
#pragma unroll
      for (int j = 0; j < kH; ++j) st_f32<DT>(p.final_states, f0 + j * p.final_s[2], h[j][i]);
    }
  }
}
// The lean forward (the ring section's note) of a warp whose kT rows all exist and are not the last
// (no final states to write), full lane slices, rows of x and out aligned, no seq_idx: at L >= 256
// nearly every warp. Stage `it`: rows r = it kR + j; the last stage is partial (kCheck).
constexpr int kNIF = (kT + kR - 1) / kR;
template <bool kSilu>
__device__ __forceinline__ void fwd_cl_lean(const Conv1dParams& p, u32 ring, i64 b, i64 c0, i64 ts) {
  const int lane = threadIdx.x % 32;
  const i64 sx = p.x_s[2] * kES, so = p.out_s[2] * kES;  // row strides, bytes
  const char* gx = elem_ptr(p.x, b * p.x_s[0] + c0 + ts * p.x_s[2]);
  char* outs = (char*)p.out + (b * p.out_s[0] + c0 + ts * p.out_s[2]) * kES;
  const u32 rx = ring + lane * kRowB;  // this warp's ring: [stage][row][lane]
  auto issue = [&](int q) {
    ring_issue<kRowB, kR, kSL, kT>(rx, gx, sx, q);
    cp_async_commit();
  };
#pragma unroll
  for (int q = 0; q < kSL - 1; ++q) issue(q);
  float w[kW][kVecF], bias[kVecF], xh[kH][kVecF];
  int hs[kH];  // lane_history's seq ids: unused without seq_idx
  lane_weights(w, bias, p, c0);
  lane_history<false>(xh, hs, p, b, c0, b * p.x_s[0] + c0, ts, kVecF);  // slot j: row j - H
#pragma unroll 1
  for (int it = 0; it < kNIF; ++it) {
    issue(it + kSL - 1);
    cp_async_wait<kSL - 1>();  // stage it's rows are in the ring
    const u32 off = (it % kSL) * kStageL;
    if (it >= kT / kR) lean_fwd_stage<kVecF, kR, kSilu, true>(w, bias, xh, rx + off, outs, so, it);  // rows past kT
    else lean_fwd_stage<kVecF, kR, kSilu, false>(w, bias, xh, rx + off, outs, so, it);
    outs += kR * so;
  }
}
// Each warp's ring in its own bytes: the general walk's kSF stages of kU rows or the lean walk's kSL
// stages of kR rows (4.5 KB 16-bit, 9 KB fp32).
constexpr u32 kWarpRingF = kSF * kStageF > kSL * kStageL ? kSF * kStageF : kSL * kStageL;

// 4 blocks per SM (<= 128 registers). The general walk alone ran at 5 on sm_90 (<= 96 registers);
// with the lean walk beside it that bound spills 8-64 bytes, and the lean walk measured 123.3 us at
// 5 against 125.5 at 4 (H100, b8 L2048 d5376 bf16): not worth a spilling seq_idx walk.
extern "C" __global__ void __launch_bounds__(kThreads, 4) causal_conv1d_fwd_cl(const Conv1dParams p) {
  __shared__ __align__(16) char ring[kWarps][kWarpRingF];
  const int warp = threadIdx.x / 32;
  if (p.has_seq) {
    fwd_cl<true>(p, smem_u32(ring[warp]));
    return;
  }
  const i64 ts = ((i64)blockIdx.y * kWarps + warp) * p.cl_rows;
  if (p.cl_rows == kT && p.dim % kVecF == 0 && ts + kT < p.seqlen && rows_aligned(p.x, p.x_s) &&
      rows_aligned(p.out, p.out_s)) {
    const i64 c0 = ((i64)blockIdx.x * 32 + threadIdx.x % 32) * kVecF;
    if (c0 >= p.dim) return;  // no block barrier in this kernel
    if (p.silu) fwd_cl_lean<true>(p, smem_u32(ring[warp]), blockIdx.z, c0, ts);
    else fwd_cl_lean<false>(p, smem_u32(ring[warp]), blockIdx.z, c0, ts);
  } else {
    fwd_cl<false>(p, smem_u32(ring[warp]));
  }
}
#endif

// ==== channel-last forward, short walks ==========================================================
// Grid and ownership as causal_conv1d_fwd_cl with R = p.cl_rows = 4 or 8 (grids that would not fill
// one wave of blocks: the real-time shapes), for calls without seq_idx whose lane slices are all full
// and whose x and out rows are kRowB-aligned (host: conv1d.rs `cl_short`). Its own entry: inside
// causal_conv1d_fwd_cl's code this walk measured 7.4 -> 7.3 us at b32 L60 d640 (H200), the warps
// waiting on instruction fetches of that kernel's other walks (ncu, 2026-11-28).
#if FS_HAS_ENTRY(10)
// A warp of kRS = p.cl_rows rows: every row it needs (H before ts, kRS from ts)
// is loaded at once, one vector a row, and converted once; then each row's outputs are formed
// from registers with compile-time indices and stored. No ring, no history moves, no per-row
// bounds but the sequence's end; the warp holding row L - 1 writes the final states from them.
// (The general walk at b32 L60 d640, 8 rows a warp: 1.71 M warp instructions against
// causal-conv1d's 0.80 M, most warps waiting on instruction fetches.)
template <int kRS, bool kSilu, typename Ix>
__device__ __forceinline__ void fwd_cl_short(const Conv1dParams& p, Ix b, Ix c0, Ix ts) {
  const Ix L = (Ix)p.seqlen;
  // An interior warp (rows ts - H .. ts + R - 1 all inside the sequence: 14 of 15 at L60 R4)
  // loads its rows from one pointer and converts them with no clamps or fix-ups; the edge warps
  // clamp each row's address and replace the rows outside. The x loads are issued first, then the
  // weights' (the loads are volatile asm: issued in program order).
  const bool interior = ts >= kH && ts + kRS <= L;
  RowRaw raw[kH + kRS];
  if (interior) {
    const Ix sx = (Ix)p.x_s[2] * kES;
    const char* g = (const char*)p.x + (b * (Ix)p.x_s[0] + c0) * kES + (ts - kH) * sx;
#pragma unroll
    for (int j = 0; j < kH + kRS; ++j) load_raw<kVecF, kES>(raw[j], g + j * sx, kVecF, kRowB);
  } else {
    short_load(raw, p.x, b * (Ix)p.x_s[0] + c0, (Ix)p.x_s[2], ts - kH, L);
  }
  float w[kW][kVecF], bias[kVecF];
  lane_weights_short(w, bias, p, c0);
  float xf[kH + kRS][kVecF];  // xf[j]: the input at row ts - H + j (0 past the sequence's end)
  if (interior) {
#pragma unroll
    for (int j = 0; j < kH + kRS; ++j) {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) xf[j][i] = elem<DT>(raw[j], i);
    }
  } else {
    short_x(xf, raw, p, b, c0, ts - kH, L);
  }
  if (p.has_final && ts + kRS >= L) {
    // the final states: inputs at L - H .. L - 1, i.e. xf[L - ts + q] (before_x values if L < H)
#pragma unroll
    for (int j = 0; j < kH + kRS; ++j) {
      const Ix q = j - (L - ts);
      if (q < 0 || q >= kH) continue;
#pragma unroll
      for (int i = 0; i < kVecF; ++i)
        st_f32<DT>(p.final_states, b * p.final_s[0] + (c0 + i) * p.final_s[1] + q * p.final_s[2], xf[j][i]);
    }
  }
  char* outs = (char*)p.out + (b * (Ix)p.out_s[0] + c0 + ts * (Ix)p.out_s[2]) * kES;
  const Ix so = (Ix)p.out_s[2] * kES;
#pragma unroll
  for (int r = 0; r < kRS; ++r) {
    if (ts + r >= L) break;
    float o[kVecF];
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      float acc = bias[i];
#pragma unroll
      for (int k = 0; k < kW; ++k) acc = fmaf(w[k][i], xf[r + k][i], acc);
      o[i] = kSilu ? silu(acc) : acc;
    }
    RowRaw out;
    pack_raw<DT, kVecF>(out, o);
    store_raw<kVecF, kES>(outs + r * so, out, kVecF, kRowB);
  }
}
// 4 or 8 rows (16 would hold 76 inputs a lane: spills under the kernel's 128 registers).
template <bool kSilu, typename Ix>
__device__ __forceinline__ void fwd_cl_short_rows(const Conv1dParams& p, Ix b, Ix c0, Ix ts) {
  if (p.cl_rows == 4) fwd_cl_short<4, kSilu>(p, b, c0, ts);
  else fwd_cl_short<8, kSilu>(p, b, c0, ts);
}
template <typename Ix>
__device__ __forceinline__ void fwd_cl_short_entry(const Conv1dParams& p) {
  const Ix ts = ((Ix)blockIdx.y * kWarps + threadIdx.x / 32) * p.cl_rows;
  const Ix c0 = ((Ix)blockIdx.x * 32 + threadIdx.x % 32) * kVecF;
  if (c0 >= (Ix)p.dim || ts >= (Ix)p.seqlen) return;
  if (p.silu) fwd_cl_short_rows<true>(p, (Ix)blockIdx.z, c0, ts);
  else fwd_cl_short_rows<false>(p, (Ix)blockIdx.z, c0, ts);
}

// 32-bit index arithmetic only: the host takes this entry where every byte offset of the call's
// tensors is below 2^31 (p.idx32; the general walk otherwise), which halves the code a warp's
// instruction fetches run through.
// 5 blocks an SM (host: conv1d.rs SHORT_FWD_BLOCKS_PER_SM picks cl_rows for that wave).
extern "C" __global__ void __launch_bounds__(kThreads, 5) causal_conv1d_fwd_cl_short(const Conv1dParams p) {
  fwd_cl_short_entry<int>(p);
}
#endif

// ==== channel-last forward, wide lanes ============================================================
// causal_conv1d_fwd_cl_wide (16-bit x; host: conv1d.rs `cl_wide`): the long channel-last forward of
// a call without seq_idx whose dim is a multiple of 8 and whose x / out row slices are 16-byte
// aligned, a lane on 8 channels (one 16-byte slice a row) instead of 4. Grid (ceil(dim / 256),
// ceil(seqlen / (kWarps kT)), batch), block kThreads; lane l of warp w: channels c0 .. c0 + 7
// (c0 = (blockIdx.x * 32 + l) * 8) at positions ts .. ts + kT - 1 (ts = (blockIdx.y * kWarps + w) *
// kT). A warp of kT rows (not the one writing final states) streams them kRW at a time through a
// 4-stage ring of its own, as the lean walk; the sequence's last warp goes row by row. The 4-channel
// kernel issued ~75 warp instructions a warp-row of 4 channels (ncu, H200, b8 L2048 d5376: half its
// time issue at the real clock): a row's load, store, address step and conversions now serve 8.
#if FS_HAS_ENTRY(12)
static_assert(DT != 2, "causal_conv1d_fwd_cl_wide: 16-bit x only (conv1d.rs `spec` refuses fp32)");
constexpr int kVW = 8;                     // channels a lane
constexpr int kRowBW = kVW * 2;            // 16 bytes: a lane's slice of a row
constexpr u32 kRowStrideW = 32 * kRowBW;   // 512 bytes between a stage's rows
// rows a stage: a multiple of H (so the history's slot is a compile-time index), and few (an unrolled
// stage of 6 rows x 8 channels held 168 registers and spilled)
constexpr int kRW = kH == 2 ? 4 : 3;
constexpr int kSW = 4;                      // ring stages a warp: three in flight while one is read
constexpr u32 kStageW = kRW * kRowStrideW;  // 1.5 / 2 KB a stage: 6 / 8 KB a warp, <= 32 KB a block
constexpr int kNIW = (kT + kRW - 1) / kRW;  // stages of a warp's walk (the last partial if kRW = 3)
using RowRawW = Raw<kVW, 2>;

template <bool kSilu>
__device__ __forceinline__ void fwd_cl_wide(const Conv1dParams& p, u32 ring, i64 b, i64 c0, i64 ts) {
  const int lane = threadIdx.x % 32;
  const i64 L = p.seqlen;
  const i64 te = ts + kT < L ? ts + kT : L;
  const i64 sx = p.x_s[2] * kES, so = p.out_s[2] * kES;  // row strides, bytes
  const char* gx = elem_ptr(p.x, b * p.x_s[0] + c0 + ts * p.x_s[2]);
  char* outs = (char*)p.out + (b * p.out_s[0] + c0 + ts * p.out_s[2]) * kES;
  const bool walk = te - ts == kT && !(p.has_final && te == L);
  const u32 rx = ring + lane * kRowBW;  // this warp's ring: [stage][row][lane]
  const char* gq = gx;                  // the next stage's first row (stages issued in order)
  auto issue = [&](int q) {
    ring_issue<kRowBW, kRW, kSW, kT>(rx, gq, sx, q);
    cp_async_commit();
  };
  if (walk) {
#pragma unroll
    for (int q = 0; q < kSW - 1; ++q) issue(q);
  }
  // weights and bias (host: packed, `weights_packed`): the lane's 8 x W weights one contiguous run
  // of 16-byte loads, its biases 16-byte vectors (per-element loads here held 2 address registers
  // a load and spilled); history: rows ts - H .. ts - 1 (x, or initial_states / 0 before 0)
  float w[kW][kVW], bias[kVW], xh[kH][kVW];
  lane_weights_packed<kVW>(w, bias, p, c0);
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    const i64 t = ts - kH + j;
    if (t >= 0) {
      RowRawW r;
      load_raw<kVW, 2>(r, gx + (j - kH) * sx, kVW, kRowBW);
#pragma unroll
      for (int i = 0; i < kVW; ++i) xh[j][i] = elem<DT>(r, i);
    } else {
#pragma unroll
      for (int i = 0; i < kVW; ++i) xh[j][i] = before_x(p, b, c0 + i, t);
    }
  }
  if (walk) {
#pragma unroll 1
    for (int it = 0; it < kNIW; ++it) {
      issue(it + kSW - 1);
      cp_async_wait<kSW - 1>();  // stage it's rows are in the ring
      const u32 off = (it % kSW) * kStageW;
      if (it >= kT / kRW) lean_fwd_stage<kVW, kRW, kSilu, true>(w, bias, xh, rx + off, outs + it * kRW * so, so, it);  // rows past kT
      else lean_fwd_stage<kVW, kRW, kSilu, false>(w, bias, xh, rx + off, outs + it * kRW * so, so, it);
    }
    return;
  }
  // the sequence's last warp: row by row, the history slid through registers, then the final states
#pragma unroll 1
  for (i64 t = ts; t < te; ++t) {
    RowRawW r;
    load_raw<kVW, 2>(r, gx + (t - ts) * sx, kVW, kRowBW);
    float xr[kVW], o[kVW];
#pragma unroll
    for (int i = 0; i < kVW; ++i) {
      xr[i] = elem<DT>(r, i);
      float acc = bias[i];
#pragma unroll
      for (int k = 0; k < kH; ++k) acc = fmaf(w[k][i], xh[k][i], acc);
      acc = fmaf(w[kH][i], xr[i], acc);
      o[i] = kSilu ? silu(acc) : acc;
    }
    RowRawW out;
    pack_raw<DT, kVW>(out, o);
    store_raw<kVW, 2>(outs + (t - ts) * so, out, kVW, kRowBW);
#pragma unroll
    for (int j = 0; j < kH; ++j) {
#pragma unroll
      for (int i = 0; i < kVW; ++i) xh[j][i] = j + 1 < kH ? xh[j + 1][i] : xr[i];
    }
  }
  if (p.has_final && te == L) {
    // xh[j]: the input at L - H + j (initial_states where L < H)
#pragma unroll
    for (int i = 0; i < kVW; ++i) {
      const i64 f0 = b * p.final_s[0] + (c0 + i) * p.final_s[1];
#pragma unroll
      for (int j = 0; j < kH; ++j) st_f32<DT>(p.final_states, f0 + j * p.final_s[2], xh[j][i]);
    }
  }
}
extern "C" __global__ void __launch_bounds__(kThreads, 4) causal_conv1d_fwd_cl_wide(const Conv1dParams p) {
  __shared__ __align__(16) char ring[kWarps][kSW * kStageW];
  const int warp = threadIdx.x / 32;
  const i64 c0 = ((i64)blockIdx.x * 32 + threadIdx.x % 32) * kVW;
  const i64 ts = ((i64)blockIdx.y * kWarps + warp) * kT;
  if (c0 >= p.dim || ts >= p.seqlen) return;  // no block barrier in this kernel
  if (p.silu) fwd_cl_wide<true>(p, smem_u32(ring[warp]), blockIdx.z, c0, ts);
  else fwd_cl_wide<false>(p, smem_u32(ring[warp]), blockIdx.z, c0, ts);
}
#endif

// ==== block reduction of the weight / bias partial sums ===========================================
// Channel-first: every thread of the block serves the block's one channel, so v is summed over the
// whole block (xor shuffles in each warp, then the warps' sums through shared memory); the result is
// valid in thread 0.
__device__ __forceinline__ void block_sum_cf(float (&v)[kW + 1], float (*red)[kW + 1]) {
#pragma unroll
  for (int k = 0; k < kW + 1; ++k) {
#pragma unroll
    for (int m = 16; m >= 1; m /= 2) v[k] += __shfl_xor_sync(0xffffffffu, v[k], m);
  }
  if (threadIdx.x % 32 == 0) {
#pragma unroll
    for (int k = 0; k < kW + 1; ++k) red[threadIdx.x / 32][k] = v[k];
  }
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < kW + 1; ++k) {
      float s = 0.f;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) s += red[wi][k];
      v[k] = s;
    }
  }
}

// ==== channel-first backward (no seq_idx) =========================================================
// grid (dim * nsplit, batch), block kThreads. A row (b, c) is cut into steps of kStepCF = kThreads * kVec
// positions (thread i owns the kVec positions p0 = step * kStepCF + i * kVec .. p0 + kVec - 1: one
// 16-byte slice of x, dout and dx) and block (c, split) walks kStepsCF consecutive steps, the last
// first (nsplit = ceil(steps / kStepsCF)). Per step, with two block barriers:
//   1. each thread posts its last H inputs (xt) and thread 0 takes the H before p0 from memory (the
//      previous step's or initial_states): barrier; every thread forms y and dy at its own positions
//      and adds its dweight / dbias terms;
//   2. each thread posts its first H dy (dh): barrier; dx at s needs dy at s .. s + H, the last
//      thread's H after come from the step after (thread 0's dh of the previous iteration, carried
//      in registers: the walk goes backwards for this) or, for the block's first step, from memory.
// xt / dh alternate between two buffers by step parity, so no third barrier guards their reuse.
// The block's dweight / dbias sums go to partials[part = b * nsplit + split] at the end.
// Occupancy is what hides the loads' latency here: at 48 registers 10 blocks (40 warps) fit an SM.
// H200, same process: 10 blocks without prefetch 194-197 us; the next step's slices prefetched into
// registers at 8 blocks (64 registers) 210, at 6 blocks 252; through a cp.async ring in shared
// memory at 10 blocks 206-209, at 12 (40 registers, spilling at width 4) 212. With that it was
// issue-bound (ncu: 60 warp instructions a position, issue slots 86% busy), so the activation and,
// for blocks whose slices are all full and whose rows are 16-byte aligned, the vector-only loop are
// compile-time variants (kSilu, kFast): 141 M instead of 165 M instructions, 192 -> 170 us
// (causal-conv1d's kernel 162 us, 126.5 M instructions).
// H100 (b8 L2048 d5376 bf16, width 4): this replaced one block per 2048 positions of a row, 16 a
// thread with element loads for the halos (105 registers, 4 blocks per SM, 57 instructions a
// position, 290.8 us against causal-conv1d's 194.7).
#if FS_HAS_ENTRY(2) || FS_HAS_ENTRY(8)
// One thread's 16-byte slice of a channel-first row in the backward (causal_conv1d_bwd_cf and
// causal_conv1d_bwd_cf_rows), positions p0 .. p0 + kVec - 1 of row (b, c).
// dy at its positions (dout g, 0 past seqlen; times silu'(y) with the activation, y from the x
// window xw[q] <-> position p0 - H + q) into dyw[0 .. kVec), its dweight / dbias terms into acc.
__device__ __forceinline__ void slice_dy(bool silu, const float (&g)[kVec], const float (&xw)[kVec + kH],
                                         const float (&w)[kW], float bias, float (&dyw)[kVec + kH],
                                         float (&acc)[kW + 1]) {
#pragma unroll
  for (int r = 0; r < kVec; ++r) {
    float d = g[r];
    if (silu) {
      float y = bias;
#pragma unroll
      for (int k = 0; k < kW; ++k) y = fmaf(w[k], xw[r + k], y);
      d *= dsilu(y);
    }
    dyw[r] = d;
    acc[kW] += d;
#pragma unroll
    for (int k = 0; k < kW; ++k) acc[k] = fmaf(d, xw[r + k], acc[k]);
  }
}
// dx at s = p0 + i: sum_k w[k] dy[s + H - k] (dyw index i + H - k; dyw[kVec ..] the H dy after the
// slice), plus dfinal_states[s + H - L] for s in [L - H, L): rare, kept apart so the common path
// holds no 64-bit addresses for it.
__device__ __forceinline__ void slice_dx(const Conv1dParams& p, i64 b, i64 c, i64 p0, const float (&w)[kW],
                                         const float (&dyw)[kVec + kH], float (&dxv)[kVec]) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    float d = 0.f;
#pragma unroll
    for (int k = 0; k < kW; ++k) d = fmaf(w[k], dyw[i + kH - k], d);
    dxv[i] = d;
  }
  const i64 L = p.seqlen;
  if (p.has_dfinal && p0 + kVec > L - kH && p0 < L) {
    const i64 fbase = b * p.dfinal_s[0] + c * p.dfinal_s[1];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const i64 pos = p0 + i;
      if (pos >= L - kH && pos < L) dxv[i] += ldg_f32<DT>(p.dfinal, fbase + (pos + kH - L) * p.dfinal_s[2]);
    }
  }
}
// The row's first slice: dinitial_states[j] = dxcat[j] = sum_k w[k] dy[j - k] (dy before 0 does not
// exist), plus dfinal_states[j - L] where j >= L.
__device__ __forceinline__ void slice_dinit(const Conv1dParams& p, i64 b, i64 c, const float (&w)[kW],
                                            const float (&dyw)[kVec + kH]) {
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    float d = 0.f;
#pragma unroll
    for (int k = 0; k <= j; ++k) d = fmaf(w[k], dyw[j - k], d);
    if (p.has_dfinal && j >= p.seqlen)
      d += ldg_f32<DT>(p.dfinal, b * p.dfinal_s[0] + c * p.dfinal_s[1] + (j - p.seqlen) * p.dfinal_s[2]);
    st_f32<DT>(p.dinit, b * p.dinit_s[0] + c * p.dinit_s[1] + j * p.dinit_s[2], d);
  }
}
#endif

#if FS_HAS_ENTRY(2)
constexpr int kStepCF = kThreads * kVec;  // positions of a row per step of the channel-first backward
constexpr int kStepsCF = 4;               // steps a block walks (the host's CF_BWD_STEPS)

struct CfBwdSmem {
  float xt[2][kH][kThreads];  // [buf][j][thread]: x at the thread's last H positions
  float dh[2][kH][kThreads];  // dy at its first H positions
  float red[kWarps][kW + 1];
};

// dy at position t (0 past seqlen) from memory: the block's first step's look-ahead (no seq_idx).
__device__ __forceinline__ float dy_from_memory(const Conv1dParams& p, i64 b, i64 c, i64 xrow, i64 grow,
                                                const float (&w)[kW], float bias, i64 t) {
  if (t >= p.seqlen) return 0.f;
  const float g = ldg_f32<DT>(p.dout, grow + t);
  if (!p.silu) return g;
  float y = bias;
#pragma unroll
  for (int k = 0; k < kW; ++k) {
    const i64 pos = t - kH + k;
    const float v = pos < 0 ? before_x(p, b, c, pos) : ldg_f32<DT>(p.x, xrow + pos);
    y = fmaf(w[k], v, y);
  }
  return g * dsilu(y);
}

// One step's loads: this thread's x and dout slices (16-byte vectors where the row is aligned and
// the slice full, else element by element), and for thread 0 the H inputs before p0.
struct CfStepLoad {
  Raw<kVec, kES> x, g;
  float before[kH];
};
// kFast: the block's slices are all full and its rows 16-byte aligned (one vector access each, no
// tests); thread 0 then reads the slice before its own as one vector too (when it exists).
template <bool kFast>
__device__ __forceinline__ void cf_load_step(CfStepLoad& ld, const Conv1dParams& p, i64 b, i64 c, i64 xrow,
                                             i64 grow, i64 p0) {
  const char* qx = elem_ptr(p.x, xrow + p0);
  const char* qg = elem_ptr(p.dout, grow + p0);
  if constexpr (kFast) {
    load_raw<kVec, kES>(ld.x, qx, kVec, 16);
    load_raw<kVec, kES>(ld.g, qg, kVec, 16);
  } else {
    const i64 valid = p.seqlen - p0;
    const int v = (int)(valid < kVec ? (valid < 0 ? 0 : valid) : kVec);
    load_raw<kVec, kES>(ld.x, qx, v, align_of(qx));
    load_raw<kVec, kES>(ld.g, qg, v, align_of(qg));
  }
  if (threadIdx.x == 0) {
    if (kFast && p0 >= kVec) {
      Raw<kVec, kES> prev;
      load_raw<kVec, kES>(prev, qx - 16, kVec, 16);
#pragma unroll
      for (int j = 0; j < kH; ++j) ld.before[j] = elem<DT>(prev, kVec - kH + j);
    } else {
#pragma unroll
      for (int j = 0; j < kH; ++j) {
        const i64 pos = p0 - kH + j;
        ld.before[j] = pos < 0 ? before_x(p, b, c, pos) : ldg_f32<DT>(p.x, xrow + pos);
      }
    }
  }
}

// The block's row, split and steps (grid (dim * nsplit, batch)).
struct CfBlock {
  i64 c, b, split, s_first, s_last;
  u32 nsplit;
};
__device__ __forceinline__ CfBlock cf_block(const Conv1dParams& p) {
  CfBlock k;
  const i64 nsteps = (p.seqlen + kStepCF - 1) / kStepCF;
  k.nsplit = (u32)((nsteps + kStepsCF - 1) / kStepsCF);
  k.c = blockIdx.x / k.nsplit;
  k.split = blockIdx.x % k.nsplit;
  k.b = blockIdx.y;
  k.s_first = k.split * kStepsCF;
  k.s_last = min(k.s_first + kStepsCF, nsteps) - 1;
  return k;
}

// kSilu: the activation (p.silu) as a compile-time choice, so the step loop holds no test of it.
template <bool kSilu, bool kFast>
__device__ __forceinline__ void bwd_cf(const Conv1dParams& p, CfBwdSmem& sm, const CfBlock& blk) {
  const int tid = threadIdx.x;
  const i64 L = p.seqlen;
  const i64 c = blk.c, b = blk.b, split = blk.split, s_first = blk.s_first, s_last = blk.s_last;
  const u32 nsplit = blk.nsplit;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = ldg_f32<WDT>(p.weight, c * p.w_s[0] + k * p.w_s[1]);
  const float bias = p.has_bias ? ldg_f32<WDT>(p.bias, c * p.bias_s) : 0.f;
  const i64 xrow = b * p.x_s[0] + c * p.x_s[1];
  const i64 grow = b * p.dout_s[0] + c * p.dout_s[1];
  const i64 dxrow = b * p.dx_s[0] + c * p.dx_s[1];
  float acc[kW + 1];
#pragma unroll
  for (int k = 0; k < kW + 1; ++k) acc[k] = 0.f;
  // dy at the H positions after the current step: the last thread's look-ahead
  float dy_next[kH];
#pragma unroll
  for (int j = 0; j < kH; ++j) dy_next[j] = 0.f;
  if (tid == kThreads - 1) {
    const i64 e = (s_last + 1) * kStepCF;
#pragma unroll
    for (int j = 0; j < kH; ++j) dy_next[j] = dy_from_memory(p, b, c, xrow, grow, w, bias, e + j);
  }
  for (i64 s = s_last; s >= s_first; --s) {
    const int buf = (int)(s & 1);
    const i64 p0 = s * kStepCF + tid * kVec;
    CfStepLoad cur;
    cf_load_step<kFast>(cur, p, b, c, xrow, grow, p0);

    // x window xw[q] <-> position p0 - H + q
    float xw[kVec + kH], g[kVec];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      xw[kH + i] = elem<DT>(cur.x, i);
      g[i] = elem<DT>(cur.g, i);
    }
#pragma unroll
    for (int j = 0; j < kH; ++j) sm.xt[buf][j][tid] = xw[kVec + j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kH; ++j) xw[j] = tid > 0 ? sm.xt[buf][j][tid - 1] : cur.before[j];
    // dy at the own positions (0 past seqlen: dout reads 0 there); dweight / dbias terms
    float dyw[kVec + kH];  // dy at p0 .. p0 + kVec + H - 1
    slice_dy(kSilu, g, xw, w, bias, dyw, acc);
#pragma unroll
    for (int j = 0; j < kH; ++j) sm.dh[buf][j][tid] = dyw[j];
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kH; ++j) dyw[kVec + j] = tid < kThreads - 1 ? sm.dh[buf][j][tid + 1] : dy_next[j];
    if (tid == kThreads - 1) {  // the next (earlier) step's look-ahead: this step's first H dy
#pragma unroll
      for (int j = 0; j < kH; ++j) dy_next[j] = sm.dh[buf][j][0];
    }
    float dxv[kVec];
    slice_dx(p, b, c, p0, w, dyw, dxv);
    if constexpr (kFast) {
      Raw<kVec, kES> r;
      pack_raw<DT, kVec>(r, dxv);
      store_raw<kVec, kES>((char*)p.dx + (dxrow + p0) * kES, r, kVec, 16);
    } else {
      store_f32<kVec>(p.dx, dxrow + p0, dxv, L - p0);
    }
    if (p0 == 0 && p.has_dinit) slice_dinit(p, b, c, w, dyw);
  }
  block_sum_cf(acc, sm.red);
  if (tid == 0) {
    float* dst = p.partials + ((b * (i64)nsplit + split) * p.dim + c) * (kW + 1);
#pragma unroll
    for (int k = 0; k < kW + 1; ++k) dst[k] = acc[k];
  }
}
extern "C" __global__ void __launch_bounds__(kThreads, 10) causal_conv1d_bwd_cf(const Conv1dParams p) {
  __shared__ CfBwdSmem sm;
  const CfBlock blk = cf_block(p);
  // every slice of the block full, and x / dout / dx rows 16-byte aligned (p0 * kES is a multiple
  // of 16, so the row start decides): the vector-only loop
  const i64 xrow = blk.b * p.x_s[0] + blk.c * p.x_s[1];
  const i64 grow = blk.b * p.dout_s[0] + blk.c * p.dout_s[1];
  const i64 dxrow = blk.b * p.dx_s[0] + blk.c * p.dx_s[1];
  const bool fast = (blk.s_last + 1) * kStepCF <= p.seqlen && (((unsigned long long)elem_ptr(p.x, xrow) |
                    (unsigned long long)elem_ptr(p.dout, grow) | (unsigned long long)elem_ptr(p.dx, dxrow)) & 15) == 0;
  if (p.silu) {
    if (fast) bwd_cf<true, true>(p, sm, blk);
    else bwd_cf<true, false>(p, sm, blk);
  } else {
    if (fast) bwd_cf<false, true>(p, sm, blk);
    else bwd_cf<false, false>(p, sm, blk);
  }
}
#endif

// ==== channel-first backward, short rows (no seq_idx) ==============================================
// For rows of at most kThreads / 2 slices (host: conv1d.rs `cf_rows`; longer rows and seq_idx take
// the kernels above and below). T = 2^p.cf_lg <= kThreads / 2 threads a row (the fewest whose
// 16-byte slices cover it), R = kThreads / T rows a block: grid (ceil(dim / R), batch). Thread i:
// channel c = blockIdx.x R + i / T, positions p0 = (i % T) kVec .. p0 + kVec - 1. The row is one
// step of causal_conv1d_bwd_cf's walk done by T threads: x's last H to the right neighbour and dy's
// first H to the left through shared memory; before the row initial_states (or 0), after it nothing
// (T kVec >= L: dy is 0 there). The row's dweight / dbias sums: xor shuffles within its T lanes, and
// at T = 64 its two warps' sums through shared memory; part = b (nparts = batch). One block a row
// left most threads idle: b32 L60 d640 ran 20480 blocks of 8 working threads (H200: ~78 us).
#if FS_HAS_ENTRY(8)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_bwd_cf_rows(const Conv1dParams p) {
  __shared__ float xt[kH][kThreads];  // x at each thread's last H positions
  __shared__ float dh[kH][kThreads];  // dy at its first H positions
  __shared__ float red[kWarps][kW + 1];
  const int tid = threadIdx.x, lg = p.cf_lg, nt = 1 << lg, lt = tid & (nt - 1);
  const i64 c = (i64)blockIdx.x * (kThreads >> lg) + (tid >> lg);
  const i64 b = blockIdx.y, L = p.seqlen;
  // threads of rows past dim load and store nothing but still reach the barriers
  const bool row = c < p.dim;
  const i64 cw = row ? c : p.dim - 1;
  const i64 p0 = (i64)lt * kVec;
  const i64 valid = row ? L - p0 : 0;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = ldg_f32<WDT>(p.weight, cw * p.w_s[0] + k * p.w_s[1]);
  const float bias = p.has_bias ? ldg_f32<WDT>(p.bias, cw * p.bias_s) : 0.f;
  float xi[kVec], g[kVec];
  load_f32<kVec>(xi, p.x, b * p.x_s[0] + cw * p.x_s[1] + p0, valid);
  load_f32<kVec>(g, p.dout, b * p.dout_s[0] + cw * p.dout_s[1] + p0, valid);
#pragma unroll
  for (int j = 0; j < kH; ++j) xt[j][tid] = xi[kVec - kH + j];
  __syncthreads();
  float xw[kVec + kH];  // x window: xw[q] <-> position p0 - H + q
#pragma unroll
  for (int j = 0; j < kH; ++j) xw[j] = lt > 0 ? xt[j][tid - 1] : (row ? before_x(p, b, cw, j - kH) : 0.f);
#pragma unroll
  for (int i = 0; i < kVec; ++i) xw[kH + i] = xi[i];
  float acc[kW + 1], dyw[kVec + kH];  // dyw: dy at p0 .. p0 + kVec + H - 1
#pragma unroll
  for (int k = 0; k < kW + 1; ++k) acc[k] = 0.f;
  slice_dy(p.silu, g, xw, w, bias, dyw, acc);
#pragma unroll
  for (int j = 0; j < kH; ++j) dh[j][tid] = dyw[j];
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kH; ++j) dyw[kVec + j] = lt < nt - 1 ? dh[j][tid + 1] : 0.f;
  if (row) {
    float dxv[kVec];
    slice_dx(p, b, c, p0, w, dyw, dxv);
    store_f32<kVec>(p.dx, b * p.dx_s[0] + c * p.dx_s[1] + p0, dxv, L - p0);
    if (lt == 0 && p.has_dinit) slice_dinit(p, b, c, w, dyw);
  }
  // the row's sums: its T lanes (T <= 32: one warp's aligned group), then at T = 64 its two warps
#pragma unroll
  for (int k = 0; k < kW + 1; ++k) {
    for (int m = (nt < 32 ? nt : 32) >> 1; m >= 1; m >>= 1) acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], m);
  }
  if (nt > 32) {
    if (tid % 32 == 0) {
#pragma unroll
      for (int k = 0; k < kW + 1; ++k) red[tid / 32][k] = acc[k];
    }
    __syncthreads();
    if (lt == 0) {
#pragma unroll
      for (int k = 0; k < kW + 1; ++k) acc[k] += red[tid / 32 + 1][k];
    }
  }
  if (row && lt == 0) {
    float* dst = p.partials + (b * p.dim + c) * (kW + 1);
#pragma unroll
    for (int k = 0; k < kW + 1; ++k) dst[k] = acc[k];
  }
}
#endif

// ==== channel-first backward with seq_idx ==========================================================
// grid (dim * ceil(seqlen / kChunk), batch), block kThreads, as causal_conv1d_fwd_cf. Thread i owns
// kItems = 2 * kVec positions from s0 = chunk * kChunk + i * kItems; it recomputes y (and dy) at its
// positions and the H after them from a window of x (s0 - H .. s0 + kItems + H - 1, index q <->
// position s0 - H + q) and the seq ids of that window read element by element, writes dx at its
// positions, and adds its dweight / dbias terms to the block's partial sums (part = b * nchunks +
// chunk). The general walk of the channel-first layout: its own entry, so the masks and per-element
// loads cost the lean backward (causal_conv1d_bwd_cf) no registers.
#if FS_HAS_ENTRY(6)
__device__ __forceinline__ void bwd_cf_seq(const Conv1dParams& p, float (*red)[kW + 1]) {
  constexpr bool kSeq = true;
  const u32 nchunks = (u32)((p.seqlen + kChunk - 1) / kChunk);  // 32-bit division, as the forward
  const i64 c = blockIdx.x / nchunks;
  const i64 chunk = blockIdx.x % nchunks;
  const i64 s0 = chunk * kChunk + (i64)threadIdx.x * kItems;
  const i64 b = blockIdx.y;
  float acc[kW + 1];
#pragma unroll
  for (int k = 0; k < kW + 1; ++k) acc[k] = 0.f;
  if (s0 < p.seqlen) {
    constexpr int kX = kItems + 2 * kH;   // x window
    constexpr int kG = kItems + kH;       // dy at s0 .. s0 + kG - 1
    float w[kW];
#pragma unroll
    for (int k = 0; k < kW; ++k) w[k] = ldg_f32<WDT>(p.weight, c * p.w_s[0] + k * p.w_s[1]);
    const float bias = p.has_bias ? ldg_f32<WDT>(p.bias, c * p.bias_s) : 0.f;
    const i64 xrow = b * p.x_s[0] + c * p.x_s[1];
    const i64 grow = b * p.dout_s[0] + c * p.dout_s[1];
    float xi[kItems], gi[kItems], xw[kX], g[kG];
    load_f32<kItems>(xi, p.x, xrow + s0, p.seqlen - s0);
    load_f32<kItems>(gi, p.dout, grow + s0, p.seqlen - s0);
#pragma unroll
    for (int q = 0; q < kX; ++q) {
      const i64 pos = s0 - kH + q;
      if (q >= kH && q < kH + kItems) xw[q] = xi[q - kH];
      else if (pos < 0) xw[q] = before_x(p, b, c, pos);
      else xw[q] = pos < p.seqlen ? ldg_f32<DT>(p.x, xrow + pos) : 0.f;
    }
#pragma unroll
    for (int r = 0; r < kG; ++r) {
      const i64 pos = s0 + r;
      g[r] = r < kItems ? gi[r] : (pos < p.seqlen ? ldg_f32<DT>(p.dout, grow + pos) : 0.f);
    }
    int sq[kX];
#pragma unroll
    for (int q = 0; q < kX; ++q) sq[q] = kSeq ? seq_at(p, b, s0 - kH + q) : 0;
    // dy at position s0 + r: window indices r .. r + H, centre r + H
    if (p.silu) {
#pragma unroll
      for (int r = 0; r < kG; ++r) {
        float y = bias;
#pragma unroll
        for (int k = 0; k < kW; ++k) {
          const float v = (kSeq && !same_seq(sq[r + k], sq[r + kH])) ? 0.f : xw[r + k];
          y = fmaf(w[k], v, y);
        }
        g[r] *= dsilu(y);
      }
    }
    // dweight, dbias over this thread's positions (dy is 0 past seqlen)
#pragma unroll
    for (int r = 0; r < kItems; ++r) {
      acc[kW] += g[r];
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const float v = (kSeq && !same_seq(sq[r + k], sq[r + kH])) ? 0.f : xw[r + k];
        acc[k] = fmaf(g[r], v, acc[k]);
      }
    }
    // dx at s = s0 + i: sum_k w[k] dy[s + H - k] (dy index i + H - k, its window centre i + 2H - k)
    float dxv[kItems];
#pragma unroll
    for (int i = 0; i < kItems; ++i) {
      float d = 0.f;
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const float gv = (kSeq && !same_seq(sq[i + kH], sq[i + 2 * kH - k])) ? 0.f : g[i + kH - k];
        d = fmaf(w[k], gv, d);
      }
      const i64 pc = s0 + i + kH;  // xcat index
      if (p.has_dfinal && pc >= p.seqlen && pc < p.seqlen + kH)
        d += ldg_f32<DT>(p.dfinal, b * p.dfinal_s[0] + c * p.dfinal_s[1] + (pc - p.seqlen) * p.dfinal_s[2]);
      dxv[i] = d;
    }
    store_f32<kItems>(p.dx, b * p.dx_s[0] + c * p.dx_s[1] + s0, dxv, p.seqlen - s0);
    if (s0 == 0 && p.has_dinit) {
      // dinit[j] = dxcat[j] = sum_k w[k] dy[j - k] (dy before 0 does not exist)
#pragma unroll
      for (int j = 0; j < kH; ++j) {
        float d = 0.f;
#pragma unroll
        for (int k = 0; k <= j; ++k) d = fmaf(w[k], g[j - k], d);
        if (p.has_dfinal && j >= p.seqlen)
          d += ldg_f32<DT>(p.dfinal, b * p.dfinal_s[0] + c * p.dfinal_s[1] + (j - p.seqlen) * p.dfinal_s[2]);
        st_f32<DT>(p.dinit, b * p.dinit_s[0] + c * p.dinit_s[1] + j * p.dinit_s[2], d);
      }
    }
  }
  block_sum_cf(acc, red);
  if (threadIdx.x == 0) {
    float* dst = p.partials + ((b * (i64)nchunks + chunk) * p.dim + c) * (kW + 1);
#pragma unroll
    for (int k = 0; k < kW + 1; ++k) dst[k] = acc[k];
  }
}
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_bwd_cf_seq(const Conv1dParams p) {
  __shared__ float red[kWarps][kW + 1];
  bwd_cf_seq(p, red);
}
#endif

// ==== channel-last backward ========================================================================
// Grid and ownership as causal_conv1d_fwd_cl with R = p.cl_rows positions a warp (kTB, or fewer on
// small grids; kTB = 2 kT halves the dweight / dbias partials and the H rows each warp re-reads).
// Warp w walks t = ts .. te + H - 1 (te = min(ts + R, L)):
// at each t it forms dy[t] (0 past L) and, with the last H dy kept, dx at s = t - H for s in [ts, te)
// (dinitial_states for s < 0 in the first warp); dweight / dbias terms for t in [ts, te). Rows of x
// and dout go in steps of kUB through two rings of kSB stages. The 4 warps share the lanes'
// channels: their partial sums meet in shared memory (part = b * gridDim.y + blockIdx.y).
#if FS_HAS_ENTRY(3) || FS_HAS_ENTRY(11)
// The block's dweight / dbias partial sums: each warp's lanes into shared memory, summed over the
// warps by warp 0 into partials[part][c][W + 1] (part = b * gridDim.y + blockIdx.y).
__device__ __forceinline__ void cl_partials(const Conv1dParams& p, const float (&dw)[kW][kVecF],
                                            const float (&db)[kVecF], float (*red)[kW + 1][kVecF][32]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const i64 c0 = ((i64)blockIdx.x * 32 + lane) * kVecF;
#pragma unroll
  for (int i = 0; i < kVecF; ++i) {
#pragma unroll
    for (int k = 0; k < kW; ++k) red[warp][k][i][lane] = dw[k][i];
    red[warp][kW][i][lane] = db[i];
  }
  __syncthreads();
  if (warp == 0 && c0 < p.dim) {
    const i64 part = (i64)blockIdx.z * gridDim.y + blockIdx.y;
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      if (c0 + i >= p.dim) break;
      float* dst = p.partials + (part * p.dim + c0 + i) * (kW + 1);
#pragma unroll
      for (int k = 0; k < kW + 1; ++k) {
        float sum = 0.f;
#pragma unroll
        for (int wi = 0; wi < kWarps; ++wi) sum += red[wi][k][i][lane];
        dst[k] = sum;
      }
    }
  }
}
#endif

#if FS_HAS_ENTRY(3)
constexpr int kSB = DT == 2 ? 3 : 6;       // stages: 24 KB of rings a block either way (static <= 48 KB)
constexpr u32 kStageB = kUB * kRowStride;  // 512 B (16-bit) / 1 KB (fp32) per stage and tensor
template <bool kSeq>
__device__ __forceinline__ void bwd_cl(const Conv1dParams& p, u32 ring, float (&dw)[kW][kVecF],
                                       float (&db)[kVecF]) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const i64 c0 = ((i64)blockIdx.x * 32 + lane) * kVecF;
  const i64 ts = ((i64)blockIdx.y * kWarps + warp) * p.cl_rows;
  const i64 b = blockIdx.z;
  if (c0 < p.dim && ts < p.seqlen) {
    const int nv = (int)(p.dim - c0 < kVecF ? p.dim - c0 : kVecF);
    const i64 te = ts + p.cl_rows < p.seqlen ? ts + p.cl_rows : p.seqlen;
    const i64 tend = te + kH;                         // one past the last t visited
    const i64 tv = tend < p.seqlen ? tend : p.seqlen;  // rows read: [ts, tv); x, dout are 0 past L
    const int nsteps = (int)((tend - ts + kUB - 1) / kUB);
    const i64 xb = b * p.x_s[0] + c0;
    const i64 gb = b * p.dout_s[0] + c0;
    const bool vec = rows_aligned(p.x, p.x_s) && rows_aligned(p.dout, p.dout_s);
    const bool vdx = rows_aligned(p.dx, p.dx_s);
    const u32 rx = ring + lane * kRowB;  // this warp's rings: [stage][row][lane], x then dout
    const u32 rg = rx + kSB * kStageB;
    // step s's rows of x and dout into stage s % kSB (none past the last step), then close the group
    auto issue = [&](int s) {
      if (s < nsteps) {
        const u32 off = (s % kSB) * kStageB;
        ring_rows<kUB>(rx + off, p.x, xb, p.x_s[2], ts + s * kUB, tv, nv, vec);
        ring_rows<kUB>(rg + off, p.dout, gb, p.dout_s[2], ts + s * kUB, tv, nv, vec);
      }
      cp_async_commit();
    };
#pragma unroll
    for (int s = 0; s < kSB - 1; ++s) issue(s);
    float w[kW][kVecF], bias[kVecF], xh[kH][kVecF], gh[kH][kVecF];
    int hs[kH], sr[kUB], sn[kUB];
    lane_weights(w, bias, p, c0);
    lane_history<kSeq>(xh, hs, p, b, c0, xb, ts, nv);
#pragma unroll
    for (int j = 0; j < kH; ++j) {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) gh[j][i] = 0.f;
    }
    seq_rows<kSeq>(sr, p, b, ts, p.seqlen);
    for (int st = 0; st < nsteps; ++st) {
      issue(st + kSB - 1);
      const i64 t0 = ts + (i64)st * kUB;
      seq_rows<kSeq>(sn, p, b, t0 + kUB, p.seqlen);
      cp_async_wait<kSB - 1>();  // step st's rows are in the rings
      const u32 off = (st % kSB) * kStageB;
#pragma unroll
      for (int u = 0; u < kUB; ++u) {
        const i64 t = t0 + u;
        if (t >= tend) break;
        RowRaw xraw, graw;
        lds_raw(xraw, rx + off + u * kRowStride);
        lds_raw(graw, rg + off + u * kRowStride);
        float xr[kVecF], g[kVecF];
        // dy at t (dout is 0 past seqlen)
#pragma unroll
        for (int i = 0; i < kVecF; ++i) {
          xr[i] = elem<DT>(xraw, i);
          g[i] = elem<DT>(graw, i);
          if (p.silu) {
            float y = bias[i];
#pragma unroll
            for (int k = 0; k < kH; ++k) {
              const float v = (kSeq && !same_seq(hs[k], sr[u])) ? 0.f : xh[k][i];
              y = fmaf(w[k][i], v, y);
            }
            y = fmaf(w[kH][i], (kSeq && sr[u] < 0) ? 0.f : xr[i], y);
            g[i] *= dsilu(y);
          }
        }
        if (t < te) {
#pragma unroll
          for (int i = 0; i < kVecF; ++i) {
            db[i] += g[i];
#pragma unroll
            for (int k = 0; k < kH; ++k) {
              const float v = (kSeq && !same_seq(hs[k], sr[u])) ? 0.f : xh[k][i];
              dw[k][i] = fmaf(g[i], v, dw[k][i]);
            }
            dw[kH][i] = fmaf(g[i], (kSeq && sr[u] < 0) ? 0.f : xr[i], dw[kH][i]);
          }
        }
        // dx at s = t - H: sum_k w[k] dy[t - k]; dy[t - k] is g (k = 0) or gh[H - k]; seq[s] = hs[0]
        const i64 sp = t - kH;
        const bool emit = sp >= ts || (ts == 0 && p.has_dinit);
        if (emit) {
          float d[kVecF];
#pragma unroll
          for (int i = 0; i < kVecF; ++i) {
            float a = 0.f;
#pragma unroll
            for (int k = 0; k < kW; ++k) {
              const float gv = k == 0 ? g[i] : gh[kH - k][i];
              const int sq = k == 0 ? sr[u] : hs[kH - k];
              a = fmaf(w[k][i], (kSeq && !same_seq(hs[0], sq)) ? 0.f : gv, a);
            }
            d[i] = a;
          }
          if (t >= p.seqlen && p.has_dfinal) {  // the last H rows of the last warp only
#pragma unroll
            for (int i = 0; i < kVecF; ++i)
              if (i < nv)
                d[i] += ldg_f32<DT>(p.dfinal, b * p.dfinal_s[0] + (c0 + i) * p.dfinal_s[1] + (t - p.seqlen) * p.dfinal_s[2]);
          }
          if (sp >= ts) {
            store_row(p.dx, b * p.dx_s[0] + c0 + sp * p.dx_s[2], d, nv, vdx);
          } else {
#pragma unroll
            for (int i = 0; i < kVecF; ++i)
              if (i < nv) st_f32<DT>(p.dinit, b * p.dinit_s[0] + (c0 + i) * p.dinit_s[1] + (sp + kH) * p.dinit_s[2], d[i]);
          }
        }
#pragma unroll
        for (int j = 0; j < kH; ++j) {
#pragma unroll
          for (int i = 0; i < kVecF; ++i) {
            xh[j][i] = j + 1 < kH ? xh[j + 1][i] : xr[i];
            gh[j][i] = j + 1 < kH ? gh[j + 1][i] : g[i];
          }
          hs[j] = j + 1 < kH ? hs[j + 1] : sr[u];
        }
      }
#pragma unroll
      for (int u = 0; u < kUB; ++u) sr[u] = sn[u];
    }
  }
}

// ---- the interior warps' lean walk -----------------------------------------------------------------
// A warp whose walk [ts, ts + kTB + H) lies inside [0, L), with full lane slices, 16-bit rows aligned
// in x, dout and dx, no seq_idx and no dinitial_states to write (ts > 0 or no dinit): at L >= 512
// nearly every warp. Same sums as bwd_cl through the lean walk (the ring section's note). Walk rows
// r = 0 .. kTB + H - 1; dweight / dbias from r < kTB, dx at r - H from r >= H. Only the stages that
// hold a row where a test fails evaluate them (kCheck); the others run every row whole.
constexpr int kRows = kTB + kH;             // rows a warp walks
constexpr int kNI = (kRows + kR - 1) / kR;  // stages a warp walks

// The per-warp, per-lane state of the lean walk.
struct LeanWalk {
  float w[kW][kVecF], bias[kVecF];
  float xh[kH][kVecF], gh[kH][kVecF];  // x and dy of row r in slot r % H
};

// Stage `it` of the walk (its rows in the ring at ring offset `off`): row j = row r = it kR + j.
template <bool kSilu, bool kCheck>
__device__ __forceinline__ void lean_stage(LeanWalk& s, float (&dw)[kW][kVecF], float (&db)[kVecF], u32 rx,
                                           u32 rg, char* dxs, i64 sdx, int it) {
#pragma unroll
  for (int j = 0; j < kR; ++j) {
    const int r = it * kR + j;
    if (kCheck && r >= kRows) break;
    RowRaw xraw, graw;
    lds_raw(xraw, rx + j * kRowStride);
    lds_raw(graw, rg + j * kRowStride);
    float xr[kVecF], g[kVecF];
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      xr[i] = elem<DT>(xraw, i);
      g[i] = elem<DT>(graw, i);
      if (kSilu) {
        // y[t] = bias + sum_{k < H} w[k] x[t - H + k] + w[H] x[t]; x[t - H + k] is row r - H + k: slot (j + k) % H
        float y = s.bias[i];
#pragma unroll
        for (int k = 0; k < kH; ++k) y = fmaf(s.w[k][i], s.xh[(j + k) % kH][i], y);
        y = fmaf(s.w[kH][i], xr[i], y);
        g[i] *= dsilu(y);
      }
    }
    if (!kCheck || r < kTB) {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) {
        db[i] += g[i];
#pragma unroll
        for (int k = 0; k < kH; ++k) dw[k][i] = fmaf(g[i], s.xh[(j + k) % kH][i], dw[k][i]);
        dw[kH][i] = fmaf(g[i], xr[i], dw[kH][i]);
      }
    }
    if (!kCheck || r >= kH) {
      // dx at row r - H: sum_k w[k] dy[row r - k]; dy of row r - k (k >= 1) is in slot (j - k) mod H
      float d[kVecF];
#pragma unroll
      for (int i = 0; i < kVecF; ++i) {
        float a = s.w[0][i] * g[i];
#pragma unroll
        for (int k = 1; k < kW; ++k) a = fmaf(s.w[k][i], s.gh[(j - k + kH * kW) % kH][i], a);
        d[i] = a;
      }
      RowRaw o;
      pack_raw<DT, kVecF>(o, d);
      store_raw<kVecF, kES>(dxs + (j - kH) * sdx, o, kVecF, kRowB);
    }
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      s.xh[j % kH][i] = xr[i];
      s.gh[j % kH][i] = g[i];
    }
  }
}

// This warp's lean walk (rows from ts; this lane's channels c0 ..; ring: the warp's [x | dout] stages).
template <bool kSilu>
__device__ __forceinline__ void bwd_cl_lean(const Conv1dParams& p, u32 ring, float (&dw)[kW][kVecF],
                                            float (&db)[kVecF], i64 b, i64 c0, i64 ts) {
  const int lane = threadIdx.x % 32;
  const i64 sx = p.x_s[2] * kES, sg = p.dout_s[2] * kES, sdx = p.dx_s[2] * kES;  // row strides, bytes
  const char* gx = elem_ptr(p.x, b * p.x_s[0] + c0 + ts * p.x_s[2]);
  const char* gg = elem_ptr(p.dout, b * p.dout_s[0] + c0 + ts * p.dout_s[2]);
  char* dxs = (char*)p.dx + (b * p.dx_s[0] + c0 + ts * p.dx_s[2]) * kES;  // row r - H of stage 0: dxs + (j - H) sdx
  const u32 rx = ring + lane * kRowB;  // this warp's rings: [stage][row][lane], x then dout
  const u32 rg = rx + kSL * kStageL;
  // stage q's rows (those of the walk) into slot q % kSL, then close the group (empty past the walk)
  auto issue = [&](int q) {
    if (q < kNI) {
      const u32 off = (q % kSL) * kStageL;
#pragma unroll
      for (int j = 0; j < kR; ++j) {
        if (q * kR + j < kRows) {
          cp_async_ca<kRowB>(rx + off + j * kRowStride, gx + j * sx, kRowB);
          cp_async_ca<kRowB>(rg + off + j * kRowStride, gg + j * sg, kRowB);
        }
      }
      gx += kR * sx;
      gg += kR * sg;
    }
    cp_async_commit();
  };
#pragma unroll
  for (int q = 0; q < kSL - 1; ++q) issue(q);
  LeanWalk s;
  int hs[kH];  // lane_history's seq ids: unused without seq_idx
  lane_weights(s.w, s.bias, p, c0);
  lane_history<false>(s.xh, hs, p, b, c0, b * p.x_s[0] + c0, ts, kVecF);  // slot j: row j - H
#pragma unroll
  for (int j = 0; j < kH; ++j) {
#pragma unroll
    for (int i = 0; i < kVecF; ++i) s.gh[j][i] = 0.f;  // dy before ts: never read (dx from r >= H)
  }
#pragma unroll 1
  for (int it = 0; it < kNI; ++it) {
    issue(it + kSL - 1);
    cp_async_wait<kSL - 1>();  // stage it's rows are in the ring
    const u32 off = (it % kSL) * kStageL;
    // checked: stage 0 (rows r < H emit no dx) and every stage from the one holding row kTB (rows
    // r >= kTB add no dweight; r >= kRows do not exist): with H = 3 that is the last two
    if (it == 0 || it >= kTB / kR) lean_stage<kSilu, true>(s, dw, db, rx + off, rg + off, dxs, sdx, it);
    else lean_stage<kSilu, false>(s, dw, db, rx + off, rg + off, dxs, sdx, it);
    dxs += kR * sdx;
  }
}

// Whether warp ts of a call without seq_idx takes the lean walk (the same answer for its every lane:
// the walks' rings share the warp's shared memory). dim % kVecF == 0: no partial lane slice.
__device__ __forceinline__ bool lean_ok(const Conv1dParams& p, i64 ts) {
  if constexpr (DT == 2) {
    return false;  // fp32 rows: 2x the ring (the general walk's 3 stages fit, the lean walk's do not)
  } else {
    return p.cl_rows == kTB && p.dim % kVecF == 0 && ts + kRows <= p.seqlen && (ts > 0 || !p.has_dinit) &&
           rows_aligned(p.x, p.x_s) && rows_aligned(p.dout, p.dout_s) && rows_aligned(p.dx, p.dx_s);
  }
}

// Each warp's rings, x then dout, in its own kWarpRing bytes: the general walk's kSB stages of kUB
// rows or (16-bit only) the lean walk's kSL stages of kR rows. 36 KB a block, + 10 KB of `red`.
constexpr u32 kRingGeneral = kSB * kStageB;
constexpr u32 kRingLean = DT == 2 ? 0 : kSL * kStageL;
constexpr u32 kWarpRing = 2 * (kRingGeneral > kRingLean ? kRingGeneral : kRingLean);

// 3 blocks per SM (<= 168 registers: the general walk unbounded takes ~195, and at 4 blocks spills)
extern "C" __global__ void __launch_bounds__(kThreads, 3) causal_conv1d_bwd_cl(const Conv1dParams p) {
  __shared__ __align__(16) char ring[kWarps][kWarpRing];
  __shared__ float red[kWarps][kW + 1][kVecF][32];
  float dw[kW][kVecF], db[kVecF];
#pragma unroll
  for (int i = 0; i < kVecF; ++i) {
    db[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kW; ++k) dw[k][i] = 0.f;
  }
  const int warp = threadIdx.x / 32;
  const i64 c0 = ((i64)blockIdx.x * 32 + threadIdx.x % 32) * kVecF;
  const i64 ts = ((i64)blockIdx.y * kWarps + warp) * p.cl_rows;
  const u32 mine = smem_u32(ring[warp]);
  if (p.has_seq) {
    bwd_cl<true>(p, mine, dw, db);
  } else if (lean_ok(p, ts)) {
    if (c0 < p.dim) {  // lanes past dim: nothing to walk
      if (p.silu) bwd_cl_lean<true>(p, mine, dw, db, blockIdx.z, c0, ts);
      else bwd_cl_lean<false>(p, mine, dw, db, blockIdx.z, c0, ts);
    }
  } else {
    bwd_cl<false>(p, mine, dw, db);
  }
  cl_partials(p, dw, db, red);
}
#endif

// ==== channel-last backward, short walks =========================================================
// Grid and ownership as causal_conv1d_bwd_cl with R = p.cl_rows = 4 or 8, for calls without
// seq_idx, dinitial_states or dfinal_states whose lane slices are all full and whose x, dout and dx
// rows are kRowB-aligned (host: conv1d.rs `cl_short`). Its own entry, as the forward's: a warp's
// rows come from registers, so the block needs no rings, only `red` for the partial sums.
#if FS_HAS_ENTRY(11)
// The short walks (cl_rows 4 or 8: grids that would not fill one wave), as fwd_cl_short: every x
// row the warp needs (ts - H .. ts + R + H - 1) and dout row (ts .. ts + R + H - 1) loaded at once
// and converted once; dy, the dweight / dbias terms and dx from registers with compile-time
// indices. Not for calls with dinitial_states or dfinal_states: the general walk keeps those. (The general walk at b32 L60 d640: 3.92 M
// warp instructions against causal-conv1d's 1.64 M.)
// The short backward's edge warps (a row of x or dout outside the sequence): each row loaded and
// converted in its own branch, x rows before position 0 from initial_states (or 0), dout rows
// from seqlen on 0.
template <int kRS, typename Ix>
__device__ __forceinline__ void short_bwd_edge(float (&xf)[kRS + 2 * kH][kVecF], float (&dy)[kRS + kH][kVecF],
                                               float (&w)[kW][kVecF], float (&bias)[kVecF], const Conv1dParams& p,
                                               Ix b, Ix c0, Ix ts, Ix L, const char* gx, const char* gg, Ix sx, Ix sg) {
  constexpr int kNX = kRS + 2 * kH, kNG = kRS + kH;
  lane_weights_short(w, bias, p, c0);
#pragma unroll
  for (int j = 0; j < kNX; ++j) {
    const Ix t = ts - kH + j;
    if (t >= 0 && t < L) {
      RowRaw r;
      load_raw<kVecF, kES>(r, gx + j * sx, kVecF, kRowB);
#pragma unroll
      for (int i = 0; i < kVecF; ++i) xf[j][i] = elem<DT>(r, i);
    } else {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) xf[j][i] = t < 0 ? before_x(p, b, c0 + i, t) : 0.f;
    }
  }
#pragma unroll
  for (int j = 0; j < kNG; ++j) {
    RowRaw r;
    load_raw<kVecF, kES>(r, gg + j * sg, ts + j < L ? kVecF : 0, kRowB);
#pragma unroll
    for (int i = 0; i < kVecF; ++i) dy[j][i] = elem<DT>(r, i);
  }
}
template <int kRS, bool kSilu, typename Ix>
__device__ __forceinline__ void bwd_cl_short(const Conv1dParams& p, float (&dw)[kW][kVecF], float (&db)[kVecF],
                                             Ix b, Ix c0, Ix ts) {
  constexpr int kNX = kRS + 2 * kH;  // xf[j]: x at row ts - H + j
  constexpr int kNG = kRS + kH;      // dy[j]: dy at row ts + j (0 past the sequence's end)
  const Ix L = (Ix)p.seqlen;
  const char* gx = (const char*)p.x + (b * (Ix)p.x_s[0] + c0 + (ts - kH) * (Ix)p.x_s[2]) * kES;
  const char* gg = (const char*)p.dout + (b * (Ix)p.dout_s[0] + c0 + ts * (Ix)p.dout_s[2]) * kES;
  const Ix sx = (Ix)p.x_s[2] * kES, sg = (Ix)p.dout_s[2] * kES;
  float w[kW][kVecF], bias[kVecF];
  float xf[kNX][kVecF], dy[kNG][kVecF];
  if (ts >= kH && ts + kRS + kH <= L) {
    // interior (every x and dout row inside the sequence: 6 of 8 warps at L60 R8): all rows'
    // loads issued at once from two pointers, then the weights', then the conversions; no branches
    RowRaw rx[kNX], rg[kNG];
#pragma unroll
    for (int j = 0; j < kNX; ++j) load_raw<kVecF, kES>(rx[j], gx + j * sx, kVecF, kRowB);
#pragma unroll
    for (int j = 0; j < kNG; ++j) load_raw<kVecF, kES>(rg[j], gg + j * sg, kVecF, kRowB);
    lane_weights_short(w, bias, p, c0);
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
#pragma unroll
      for (int j = 0; j < kNX; ++j) xf[j][i] = elem<DT>(rx[j], i);
#pragma unroll
      for (int j = 0; j < kNG; ++j) dy[j][i] = elem<DT>(rg[j], i);
    }
  } else {
    short_bwd_edge<kRS>(xf, dy, w, bias, p, b, c0, ts, L, gx, gg, sx, sg);
  }
  if constexpr (kSilu) {
    // y at row ts + j: bias + sum_k w[k] x[ts + j - H + k] = xf[j + k]
#pragma unroll
    for (int j = 0; j < kNG; ++j) {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) {
        float y = bias[i];
#pragma unroll
        for (int k = 0; k < kW; ++k) y = fmaf(w[k][i], xf[j + k][i], y);
        dy[j][i] *= dsilu(y);
      }
    }
  }
  // dweight / dbias: rows ts .. min(ts + R, L) - 1 (dy is 0 past L, so no test is needed)
#pragma unroll
  for (int j = 0; j < kRS; ++j) {
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      db[i] += dy[j][i];
#pragma unroll
      for (int k = 0; k < kW; ++k) dw[k][i] = fmaf(dy[j][i], xf[j + k][i], dw[k][i]);
    }
  }
  // dx at s = ts + r: sum_k w[k] dy[s + H - k] = dy[r + H - k]
  char* dxs = (char*)p.dx + (b * (Ix)p.dx_s[0] + c0 + ts * (Ix)p.dx_s[2]) * kES;
  const Ix sd = (Ix)p.dx_s[2] * kES;
#pragma unroll
  for (int r = 0; r < kRS; ++r) {
    if (ts + r >= L) break;
    float d[kVecF];
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      float a = 0.f;
#pragma unroll
      for (int k = 0; k < kW; ++k) a = fmaf(w[k][i], dy[r + kH - k][i], a);
      d[i] = a;
    }
    RowRaw out;
    pack_raw<DT, kVecF>(out, d);
    store_raw<kVecF, kES>(dxs + r * sd, out, kVecF, kRowB);
  }
}
template <typename Ix>
__device__ __forceinline__ void bwd_cl_short_entry(const Conv1dParams& p, float (&dw)[kW][kVecF], float (&db)[kVecF]) {
  const Ix c0 = ((Ix)blockIdx.x * 32 + threadIdx.x % 32) * kVecF;
  const Ix ts = ((Ix)blockIdx.y * kWarps + threadIdx.x / 32) * p.cl_rows;
  if (c0 < (Ix)p.dim && ts < (Ix)p.seqlen) {  // no return: every thread reaches cl_partials' barrier
    if (p.silu) {
      if (p.cl_rows == 4) bwd_cl_short<4, true>(p, dw, db, (Ix)blockIdx.z, c0, ts);
      else bwd_cl_short<8, true>(p, dw, db, (Ix)blockIdx.z, c0, ts);
    } else {
      if (p.cl_rows == 4) bwd_cl_short<4, false>(p, dw, db, (Ix)blockIdx.z, c0, ts);
      else bwd_cl_short<8, false>(p, dw, db, (Ix)blockIdx.z, c0, ts);
    }
  }
}
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_bwd_cl_short(const Conv1dParams p) {
  __shared__ float red[kWarps][kW + 1][kVecF][32];
  float dw[kW][kVecF], db[kVecF];
#pragma unroll
  for (int i = 0; i < kVecF; ++i) {
    db[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kW; ++k) dw[k][i] = 0.f;
  }
  bwd_cl_short_entry<int>(p, dw, db);  // 32-bit only, as the forward's (host: p.idx32)
  cl_partials(p, dw, db, red);
}
#endif

// ==== dweight / dbias: the sum of the parts ========================================================
// grid ceil(dim * (W + 1) / 32), block kThreads. Column = one (c, k) (k = W: the bias); lane l of a
// block owns column blockIdx.x * 32 + l (a warp reads 128 contiguous bytes of a part), warp w sums
// parts w, w + kWarps, ... with 8 loads in flight, and warp 0 adds the warps' sums in warp order:
// deterministic, no atomics. (One thread a column summing every part in turn ran at ~0.75 TB/s.)
#if FS_HAS_ENTRY(4)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_dw_reduce(const Conv1dParams p) {
  __shared__ float sums[kWarps][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const i64 cols = p.dim * (kW + 1);
  const i64 idx = (i64)blockIdx.x * 32 + lane;
  float acc[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) acc[u] = 0.f;
  if (idx < cols) {
    i64 part = warp;
    for (; part + 7 * kWarps < p.nparts; part += 8 * kWarps) {
#pragma unroll
      for (int u = 0; u < 8; ++u) acc[u] += p.partials[(part + u * kWarps) * cols + idx];
    }
    for (; part < p.nparts; part += kWarps) acc[0] += p.partials[part * cols + idx];
  }
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < 8; ++u) s += acc[u];
  sums[warp][lane] = s;
  __syncthreads();
  if (warp == 0 && idx < cols) {
    float t = 0.f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) t += sums[wi][lane];
    const i64 c = idx / (kW + 1);
    const int k = (int)(idx % (kW + 1));
    if (k < kW) st_f32<WDT>(p.dweight, c * p.dw_s[0] + k * p.dw_s[1], t);
    else if (p.dbias != nullptr) st_f32<WDT>(p.dbias, c * p.dbias_s, t);
  }
}
#endif

// ==== decode update ================================================================================
// grid (ceil(dim / kThreads), batch), block kThreads; thread = channel c of row b. seqlen = the new
// inputs n; the H inputs before them are the state's last H (or, in ring mode, the H slots before
// cache_seqlens[b] % state_len). The state is read whole before any of its slots is written.
// I: the index type, int where the host found every element offset of the call's tensors below 2^31
// (p.idx32: any decode batch of a real model), else i64. The kernel is instruction-bound (ncu, H200,
// b256 d5376 bf16: SM 72% busy, DRAM 11%), and the 64-bit index products and the 64-bit ring
// modulo (a subroutine call) were most of its instructions. The new state is stored from the
// window's registers where they hold it (state_len W - 1; a ring step of n <= W - 1 inputs): the
// slot-by-slot reload went one round trip a slot (H200 2026-11-28, benches/results/
// 2026-11-28-h200-ssd-loads-first-update/: b32 d640 2.14 -> 1.89 us, b256 d5376 12.9 -> 10.3).
#if FS_HAS_ENTRY(5)
template <typename I>
__device__ __forceinline__ void update_body(const Conv1dParams& p) {
  const I c = (I)blockIdx.x * kThreads + (I)threadIdx.x;
  const I b = (I)blockIdx.y;
  if (c >= (I)p.dim) return;
  const I S = (I)p.state_len, n = (I)p.seqlen;
  const I ss2 = (I)p.state_s[2], xs2 = (I)p.x_s[2], os2 = (I)p.out_s[2];
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = ldg_f32<WDT>(p.weight, c * (I)p.w_s[0] + k * (I)p.w_s[1]);
  const float bias = p.has_bias ? ldg_f32<WDT>(p.bias, c * (I)p.bias_s) : 0.f;
  const I st0 = b * (I)p.state_s[0] + c * (I)p.state_s[1];
  const I x0 = b * (I)p.x_s[0] + c * (I)p.x_s[1];
  const I o0 = b * (I)p.out_s[0] + c * (I)p.out_s[1];
  // ring slots in 32-bit arithmetic (state_len < 2^31, host-checked)
  const int S32 = (int)S;
  const int head = p.circular ? __ldg(p.cache_seqlens + b) : S32;
  // the window: h[j] (and its raw bits hr[j]) = [state, x] at the H positions before the next input
  float h[kH];
  u32 hr[kH];
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    int q = head - kH + j;
    if (p.circular) q = ((q % S32) + S32) % S32;
    hr[j] = ld_state_raw(p.state, st0 + (I)q * ss2);
    h[j] = raw_f32(hr[j]);
  }
  for (I t = 0; t < n; ++t) {
    const u32 xr = ldg_raw<DT>(p.x, x0 + t * xs2);
    const float xt = raw_f32(xr);
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kH; ++k) acc = fmaf(w[k], h[k], acc);
    acc = fmaf(w[kH], xt, acc);
    st_f32<DT>(p.out, o0 + t * os2, p.silu ? silu(acc) : acc);
#pragma unroll
    for (int j = 0; j < kH; ++j) {
      h[j] = j + 1 < kH ? h[j + 1] : xt;
      hr[j] = j + 1 < kH ? hr[j + 1] : xr;
    }
  }
  if (!p.circular && S == (I)kH) {
    // state_len W - 1 (causal-conv1d's own layout): the new state, slot j = [state, x][n + j], is
    // the window the walk ends with, stored from registers; the shift below reloads each slot and
    // stores it before loading the next (one round trip a slot)
#pragma unroll
    for (int j = 0; j < kH; ++j) st_state_raw(p.state, st0 + (I)j * ss2, hr[j]);
  } else if (p.circular) {
    int slot = ((head % S32) + S32) % S32;
    if (n <= (I)kH) {
      // n <= W - 1 inputs (a decode step) are the window's last n entries: stored from registers
      // instead of reloaded, slot (head + t) mod state_len taking input t = j - (kH - n)
#pragma unroll
      for (int j = 0; j < kH; ++j) {
        if (j < kH - (int)n) continue;
        st_state_raw(p.state, st0 + (I)slot * ss2, hr[j]);
        slot = slot + 1 == S32 ? 0 : slot + 1;
      }
    } else {
      for (I t = 0; t < n; ++t) {
        st_state_raw(p.state, st0 + (I)slot * ss2, ldg_raw<DT>(p.x, x0 + t * xs2));
        slot = slot + 1 == S32 ? 0 : slot + 1;
      }
    }
  } else {
    // ascending: slot i reads slot i + n (not yet written) or input i + n - S
    for (I i = 0; i < S; ++i) {
      const u32 v = i + n < S ? ld_state_raw(p.state, st0 + (i + n) * ss2) : ldg_raw<DT>(p.x, x0 + (i + n - S) * xs2);
      st_state_raw(p.state, st0 + i * ss2, v);
    }
  }
}
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_update(const Conv1dParams p) {
  if (p.idx32) update_body<int>(p);
  else update_body<i64>(p);
}
#endif
