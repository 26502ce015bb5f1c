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
// - channel-first (seqlen stride 1): block = one (channel c, chunk of kChunk positions, batch b);
//   thread i owns kItems = 2 * kVec consecutive positions (two 16-byte loads / stores), and reads
//   the H positions on each side it needs (the neighbours' data: L1 hits) element by element.
// - channel-last (dim stride 1): block = 4 warps x 32 lanes; lane l owns kVecF = 4 consecutive
//   channels in the forward (one 8-byte access per row for 16-bit x) and kVec in the backward (16
//   bytes), warp w a range of kT positions, walked in order with the last H inputs (and in the
//   backward the last H dy) kept in registers. The forward loads rows in steps of kU, the next
//   step's before this step's math and stores: it is bound by the bytes in flight per SM, and the
//   narrower lanes (119-124 registers for 16-bit x against 167-176 at kVec, so 4 CTAs per SM, not
//   3) with two steps in flight measured 173 us against 180 us at b8 L2048 d5376 bf16 (H100; 68%
//   of copy bandwidth) and 15.6 against 19.9 us at b32 L60 d640; 16-byte lanes with the same
//   pipelining took 188 registers and 189 us.
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
//               4 dw_reduce, 5 update; -1 or absent: all): a variant compiles only its own kernel

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

// One by-value parameter block for every entry: 16 pointers, 40 int64s, 8 int32s (sizeof = 480).
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
};
static_assert(sizeof(Conv1dParams) == 480, "Conv1dParams layout changed: update the host mirror");

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
constexpr int kT = 32;                    // channel-last: positions per warp
// channel-last forward: kVecF channels per lane (4: one 8-byte access per row for 16-bit x, 16 bytes
// for fp32; half of kVec for 16-bit so the weights / history take half the registers and more
// CTAs fit per SM), kU rows per step, the next step's rows loaded before this step's math and
// stores (two steps of loads in flight per lane: the kernel is bound by bytes in flight)
constexpr int kVecF = 4;
constexpr int kU = 4;
constexpr int kUB = 2;                    // channel-last backward: rows (of x and dout) loaded ahead
static_assert(kW >= 2 && kW <= 4, "FS_WIDTH: 2..4");
static_assert(kT % kU == 0 && kT % kUB == 0, "kT must be a multiple of kU and kUB");

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
// grid (dim * ceil(seqlen / kChunk), batch), block kThreads. Thread i: positions s0 .. s0 + kItems - 1,
// s0 = chunk * kChunk + i * kItems; window index q <-> position s0 - H + q.
#if FS_HAS_ENTRY(0)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_fwd_cf(const Conv1dParams p) {
  // grid.x = dim * nchunks < 2^31: 32-bit division (a 64-bit one is a subroutine call)
  const u32 nchunks = (u32)((p.seqlen + kChunk - 1) / kChunk);
  const i64 c = blockIdx.x / nchunks;
  const i64 s0 = (i64)(blockIdx.x % nchunks) * kChunk + (i64)threadIdx.x * kItems;
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
  for (int q = 0; q < kH + kItems; ++q) sq[q] = p.has_seq ? seq_at(p, b, s0 - kH + q) : 0;
  float o[kItems];
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      const int q = i + k;
      float v = q < kH ? xh[q] : xi[q - kH];
      if (p.has_seq && !same_seq(sq[q], sq[i + kH])) v = 0.f;
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

// ==== channel-last forward =========================================================================
// grid (ceil(dim / (32 kVecF)), ceil(seqlen / (kWarps kT)), batch), block kThreads. Lane l of warp w:
// channels c0 .. c0 + kVecF - 1 (c0 = (blockIdx.x * 32 + l) * kVecF) at positions ts .. ts + kT - 1
// (ts = (blockIdx.y * kWarps + w) * kT), in order; h[j] holds the input at t - H + j. Rows go in
// steps of kU: step i + 1's loads are issued before step i's math and stores.
#if FS_HAS_ENTRY(1)
// Loads the kU rows of the step at t0 (rows at or past te: none, zero-filled) and their seq_idx.
__device__ __forceinline__ void load_step_cl(Raw<kVecF, kES> (&xr)[kU], int (&sr)[kU], const Conv1dParams& p,
                                             i64 b, i64 xb, i64 t0, i64 te, i64 ts, i64 nc) {
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const i64 t = t0 + u;
    const char* q = elem_ptr(p.x, xb + (t < te ? t : ts) * p.x_s[2]);
    load_raw<kVecF, kES>(xr[u], q, t < te ? (int)(nc < kVecF ? nc : kVecF) : 0, align_of(q));
    sr[u] = p.has_seq ? seq_at(p, b, t < te ? t : -1) : 0;
  }
}

extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_fwd_cl(const Conv1dParams p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const i64 c0 = ((i64)blockIdx.x * 32 + lane) * kVecF;
  const i64 ts = ((i64)blockIdx.y * kWarps + warp) * kT;
  const i64 b = blockIdx.z;
  if (c0 >= p.dim || ts >= p.seqlen) return;
  const i64 nc = p.dim - c0;             // channels of this lane that exist (>= kVecF: all)
  const i64 te = ts + kT < p.seqlen ? ts + kT : p.seqlen;
  const i64 xb = b * p.x_s[0] + c0;
  Raw<kVecF, kES> xr[kU], xn[kU];   // packed: half the registers of floats for 16-bit x
  int sr[kU], sn[kU];
  load_step_cl(xr, sr, p, b, xb, ts, te, ts, nc);
  float w[kW][kVecF], bias[kVecF], h[kH][kVecF];
  int hs[kH];
#pragma unroll
  for (int i = 0; i < kVecF; ++i) {
    const i64 c = c0 + i < p.dim ? c0 + i : p.dim - 1;
#pragma unroll
    for (int k = 0; k < kW; ++k) w[k][i] = ldg_f32<WDT>(p.weight, c * p.w_s[0] + k * p.w_s[1]);
    bias[i] = p.has_bias ? ldg_f32<WDT>(p.bias, c * p.bias_s) : 0.f;
  }
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    const i64 pos = ts - kH + j;
    if (pos >= 0) {
      load_f32<kVecF>(h[j], p.x, xb + pos * p.x_s[2], nc);
    } else {
#pragma unroll
      for (int i = 0; i < kVecF; ++i) h[j][i] = c0 + i < p.dim ? before_x(p, b, c0 + i, pos) : 0.f;
    }
    hs[j] = p.has_seq ? seq_at(p, b, pos) : 0;
  }
  const i64 ob = b * p.out_s[0] + c0;
  for (i64 t0 = ts; t0 < te; t0 += kU) {
    if (t0 + kU < te) load_step_cl(xn, sn, p, b, xb, t0 + kU, te, ts, nc);
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const i64 t = t0 + u;
      if (t >= te) break;
      float o[kVecF];
#pragma unroll
      for (int i = 0; i < kVecF; ++i) {
        float acc = bias[i];
#pragma unroll
        for (int k = 0; k < kH; ++k) {
          const float v = (p.has_seq && !same_seq(hs[k], sr[u])) ? 0.f : h[k][i];
          acc = fmaf(w[k][i], v, acc);
        }
        const float v = (p.has_seq && sr[u] < 0) ? 0.f : elem<DT>(xr[u], i);
        acc = fmaf(w[kH][i], v, acc);
        o[i] = p.silu ? silu(acc) : acc;
      }
      store_f32<kVecF>(p.out, ob + t * p.out_s[2], o, nc);
#pragma unroll
      for (int j = 0; j < kH; ++j) {
#pragma unroll
        for (int i = 0; i < kVecF; ++i) h[j][i] = j + 1 < kH ? h[j + 1][i] : elem<DT>(xr[u], i);
        hs[j] = j + 1 < kH ? hs[j + 1] : sr[u];
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      xr[u] = xn[u];
      sr[u] = sn[u];
    }
  }
  if (p.has_final && te == p.seqlen) {
    // h holds positions L - H .. L - 1: the final states
#pragma unroll
    for (int i = 0; i < kVecF; ++i) {
      if (c0 + i >= p.dim) break;
      const i64 f0 = b * p.final_s[0] + (c0 + i) * p.final_s[1];
#pragma unroll
      for (int j = 0; j < kH; ++j) st_f32<DT>(p.final_states, f0 + j * p.final_s[2], h[j][i]);
    }
  }
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

// ==== channel-first backward =======================================================================
// Grid and ownership as causal_conv1d_fwd_cf. Thread i recomputes y (and dy) at its positions and the
// H after them (window of x: s0 - H .. s0 + kItems + H - 1, index q <-> position s0 - H + q), writes
// dx at its positions (and dinitial_states in the block of position 0), and adds its dweight / dbias
// terms to the block's partial sums (part = b * nchunks + chunk).
#if FS_HAS_ENTRY(2)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_bwd_cf(const Conv1dParams p) {
  __shared__ float red[kWarps][kW + 1];
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
    for (int q = 0; q < kX; ++q) sq[q] = p.has_seq ? seq_at(p, b, s0 - kH + q) : 0;
    // dy at position s0 + r: window indices r .. r + H, centre r + H
    if (p.silu) {
#pragma unroll
      for (int r = 0; r < kG; ++r) {
        float y = bias;
#pragma unroll
        for (int k = 0; k < kW; ++k) {
          const float v = (p.has_seq && !same_seq(sq[r + k], sq[r + kH])) ? 0.f : xw[r + k];
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
        const float v = (p.has_seq && !same_seq(sq[r + k], sq[r + kH])) ? 0.f : xw[r + k];
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
        const float gv = (p.has_seq && !same_seq(sq[i + kH], sq[i + 2 * kH - k])) ? 0.f : g[i + kH - k];
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
#endif

// ==== channel-last backward ========================================================================
// Grid and ownership as causal_conv1d_fwd_cl. Warp w walks t = ts .. te + H - 1 (te = min(ts + kT, L)):
// at each t it forms dy[t] (0 past L) and, with the last H dy kept, dx at s = t - H for s in [ts, te)
// (dinitial_states for s < 0 in the first warp); dweight / dbias terms for t in [ts, te). The 4 warps
// share the lanes' channels: their partial sums meet in shared memory (part = b * gridDim.y + blockIdx.y).
#if FS_HAS_ENTRY(3)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_bwd_cl(const Conv1dParams p) {
  __shared__ float red[kWarps][kW + 1][kVec][32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const i64 c0 = ((i64)blockIdx.x * 32 + lane) * kVec;
  const i64 ts = ((i64)blockIdx.y * kWarps + warp) * kT;
  const i64 b = blockIdx.z;
  float dw[kW][kVec], db[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
    db[i] = 0.f;
#pragma unroll
    for (int k = 0; k < kW; ++k) dw[k][i] = 0.f;
  }
  if (c0 < p.dim && ts < p.seqlen) {
    const i64 nc = p.dim - c0;
    const i64 te = ts + kT < p.seqlen ? ts + kT : p.seqlen;
    const i64 tend = te + kH;   // one past the last t visited
    float w[kW][kVec], bias[kVec], xh[kH][kVec], gh[kH][kVec];
    int hs[kH];
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const i64 c = c0 + i < p.dim ? c0 + i : p.dim - 1;
#pragma unroll
      for (int k = 0; k < kW; ++k) w[k][i] = ldg_f32<WDT>(p.weight, c * p.w_s[0] + k * p.w_s[1]);
      bias[i] = p.has_bias ? ldg_f32<WDT>(p.bias, c * p.bias_s) : 0.f;
    }
    const i64 xb = b * p.x_s[0] + c0;
    const i64 gb = b * p.dout_s[0] + c0;
#pragma unroll
    for (int j = 0; j < kH; ++j) {
      const i64 pos = ts - kH + j;
      if (pos >= 0) {
        load_f32<kVec>(xh[j], p.x, xb + pos * p.x_s[2], nc);
      } else {
#pragma unroll
        for (int i = 0; i < kVec; ++i) xh[j][i] = c0 + i < p.dim ? before_x(p, b, c0 + i, pos) : 0.f;
      }
#pragma unroll
      for (int i = 0; i < kVec; ++i) gh[j][i] = 0.f;
      hs[j] = p.has_seq ? seq_at(p, b, pos) : 0;
    }
    for (i64 t0 = ts; t0 < tend; t0 += kUB) {
      float xr[kUB][kVec], gr[kUB][kVec];
      int sr[kUB];
#pragma unroll
      for (int u = 0; u < kUB; ++u) {
        const i64 t = t0 + u;
        const bool in = t < p.seqlen;
        load_f32<kVec>(xr[u], p.x, xb + (in ? t : ts) * p.x_s[2], in ? nc : 0);
        load_f32<kVec>(gr[u], p.dout, gb + (in ? t : ts) * p.dout_s[2], in ? nc : 0);
        sr[u] = p.has_seq ? seq_at(p, b, t) : 0;
      }
#pragma unroll
      for (int u = 0; u < kUB; ++u) {
        const i64 t = t0 + u;
        if (t >= tend) break;
        // dy at t (gr is 0 past seqlen)
        float g[kVec];
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          g[i] = gr[u][i];
          if (p.silu) {
            float y = bias[i];
#pragma unroll
            for (int k = 0; k < kH; ++k) {
              const float v = (p.has_seq && !same_seq(hs[k], sr[u])) ? 0.f : xh[k][i];
              y = fmaf(w[k][i], v, y);
            }
            y = fmaf(w[kH][i], (p.has_seq && sr[u] < 0) ? 0.f : xr[u][i], y);
            g[i] *= dsilu(y);
          }
        }
        if (t < te) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            db[i] += g[i];
#pragma unroll
            for (int k = 0; k < kH; ++k) {
              const float v = (p.has_seq && !same_seq(hs[k], sr[u])) ? 0.f : xh[k][i];
              dw[k][i] = fmaf(g[i], v, dw[k][i]);
            }
            dw[kH][i] = fmaf(g[i], (p.has_seq && sr[u] < 0) ? 0.f : xr[u][i], dw[kH][i]);
          }
        }
        // dx at s = t - H: sum_k w[k] dy[t - k]; dy[t - k] is g (k = 0) or gh[H - k]; seq[s] = hs[0]
        const i64 s = t - kH;
        const bool emit = s >= ts || (ts == 0 && p.has_dinit);
        if (emit) {
          float d[kVec];
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            float a = 0.f;
#pragma unroll
            for (int k = 0; k < kW; ++k) {
              const float gv = k == 0 ? g[i] : gh[kH - k][i];
              const int st = k == 0 ? sr[u] : hs[kH - k];
              a = fmaf(w[k][i], (p.has_seq && !same_seq(hs[0], st)) ? 0.f : gv, a);
            }
            if (p.has_dfinal && t >= p.seqlen && c0 + i < p.dim)
              a += ldg_f32<DT>(p.dfinal, b * p.dfinal_s[0] + (c0 + i) * p.dfinal_s[1] + (t - p.seqlen) * p.dfinal_s[2]);
            d[i] = a;
          }
          if (s >= ts) {
            store_f32<kVec>(p.dx, b * p.dx_s[0] + c0 + s * p.dx_s[2], d, nc);
          } else {
#pragma unroll
            for (int i = 0; i < kVec; ++i)
              if (c0 + i < p.dim)
                st_f32<DT>(p.dinit, b * p.dinit_s[0] + (c0 + i) * p.dinit_s[1] + (s + kH) * p.dinit_s[2], d[i]);
          }
        }
#pragma unroll
        for (int j = 0; j < kH; ++j) {
#pragma unroll
          for (int i = 0; i < kVec; ++i) {
            xh[j][i] = j + 1 < kH ? xh[j + 1][i] : xr[u][i];
            gh[j][i] = j + 1 < kH ? gh[j + 1][i] : g[i];
          }
          hs[j] = j + 1 < kH ? hs[j + 1] : sr[u];
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
#pragma unroll
    for (int k = 0; k < kW; ++k) red[warp][k][i][lane] = dw[k][i];
    red[warp][kW][i][lane] = db[i];
  }
  __syncthreads();
  if (warp == 0 && c0 < p.dim) {
    const i64 part = b * gridDim.y + blockIdx.y;
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (c0 + i >= p.dim) break;
      float* dst = p.partials + (part * p.dim + c0 + i) * (kW + 1);
#pragma unroll
      for (int k = 0; k < kW + 1; ++k) {
        float s = 0.f;
#pragma unroll
        for (int wi = 0; wi < kWarps; ++wi) s += red[wi][k][i][lane];
        dst[k] = s;
      }
    }
  }
}
#endif

// ==== dweight / dbias: the sum of the parts ========================================================
// grid ceil(dim * (W + 1) / kThreads), block kThreads; thread = one (c, k) (k = W: the bias), summing
// partials[part][c][k] over part in order (consecutive threads read consecutive floats).
#if FS_HAS_ENTRY(4)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_dw_reduce(const Conv1dParams p) {
  const i64 idx = (i64)blockIdx.x * kThreads + threadIdx.x;
  if (idx >= p.dim * (kW + 1)) return;
  const i64 c = idx / (kW + 1);
  const int k = (int)(idx % (kW + 1));
  // 8 independent sums (8 loads in flight per thread: the channel-last backward makes
  // batch * seqlen / 128 parts), added in a fixed order at the end: deterministic
  const i64 stride = p.dim * (kW + 1);
  float acc[8];
#pragma unroll
  for (int u = 0; u < 8; ++u) acc[u] = 0.f;
  i64 part = 0;
  for (; part + 8 <= p.nparts; part += 8) {
#pragma unroll
    for (int u = 0; u < 8; ++u) acc[u] += p.partials[(part + u) * stride + idx];
  }
  for (; part < p.nparts; ++part) acc[0] += p.partials[part * stride + idx];
  float s = 0.f;
#pragma unroll
  for (int u = 0; u < 8; ++u) s += acc[u];
  if (k < kW) st_f32<WDT>(p.dweight, c * p.dw_s[0] + k * p.dw_s[1], s);
  else if (p.dbias != nullptr) st_f32<WDT>(p.dbias, c * p.dbias_s, s);
}
#endif

// ==== decode update ================================================================================
// grid (ceil(dim / kThreads), batch), block kThreads; thread = channel c of row b. seqlen = the new
// inputs n; the H inputs before them are the state's last H (or, in ring mode, the H slots before
// cache_seqlens[b] % state_len). The state is read whole before any of its slots is written.
#if FS_HAS_ENTRY(5)
extern "C" __global__ void __launch_bounds__(kThreads) causal_conv1d_update(const Conv1dParams p) {
  const i64 c = (i64)blockIdx.x * kThreads + threadIdx.x;
  const i64 b = blockIdx.y;
  if (c >= p.dim) return;
  const i64 S = p.state_len, n = p.seqlen;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = ldg_f32<WDT>(p.weight, c * p.w_s[0] + k * p.w_s[1]);
  const float bias = p.has_bias ? ldg_f32<WDT>(p.bias, c * p.bias_s) : 0.f;
  const i64 st0 = b * p.state_s[0] + c * p.state_s[1];
  const i64 x0 = b * p.x_s[0] + c * p.x_s[1];
  const i64 o0 = b * p.out_s[0] + c * p.out_s[1];
  const i64 head = p.circular ? (i64)__ldg(p.cache_seqlens + b) : S;
  float h[kH];
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    i64 q = head - kH + j;
    if (p.circular) q = ((q % S) + S) % S;
    h[j] = ld_state(p.state, st0 + q * p.state_s[2]);
  }
  for (i64 t = 0; t < n; ++t) {
    const float xt = ldg_f32<DT>(p.x, x0 + t * p.x_s[2]);
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kH; ++k) acc = fmaf(w[k], h[k], acc);
    acc = fmaf(w[kH], xt, acc);
    st_f32<DT>(p.out, o0 + t * p.out_s[2], p.silu ? silu(acc) : acc);
#pragma unroll
    for (int j = 0; j < kH; ++j) h[j] = j + 1 < kH ? h[j + 1] : xt;
  }
  if (p.circular) {
    const i64 base = ((head % S) + S) % S;
    for (i64 t = 0; t < n; ++t)
      st_state_raw(p.state, st0 + ((base + t) % S) * p.state_s[2], ldg_raw<DT>(p.x, x0 + t * p.x_s[2]));
  } else {
    // ascending: slot i reads slot i + n (not yet written) or input i + n - S
    for (i64 i = 0; i < S; ++i) {
      const u32 v = i + n < S ? ld_state_raw(p.state, st0 + (i + n) * p.state_s[2])
                              : ldg_raw<DT>(p.x, x0 + (i + n - S) * p.x_s[2]);
      st_state_raw(p.state, st0 + i * p.state_s[2], v);
    }
  }
}
#endif
