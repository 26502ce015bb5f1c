// Mamba single-step decode: selective_state_update (mamba_ssm semantics), state updated in place.
//
// Per batch row b, head h, channel d, state n (no-head form: nheads = 1):
//   dt       = dt[b,h,d] + dt_bias[h,d];  dt = softplus(dt) if asked (mamba: dt <= 20 ? log1p(e^dt) : dt)
//   s        = state[b,h,d,n] * exp(dt * A[h,d,n]) + dt * B[b,g,n] * x[b,h,d]     (g = h / (nheads/ngroups))
//   state[b,h,d,n] = s
//   out[b,h,d] = (sum_n s * C[b,g,n] + D[h,d] * x[b,h,d]) * silu(z[b,h,d])        (silu only if z given)
//
// Work split: block = kChans channels d of one head h = blockIdx.y and kBPT batch rows
//   b = blockIdx.z * kBPT + r (r < kBPT); kLanes consecutive lanes own one channel; lane l owns states
//   n = (g * kLanes + l) * 4 + i, g < kGroups, i < 4, of the channel in each of the kBPT rows, moved as one
//   float4 (16 B) of state when the rows allow it (vec4), element by element otherwise. The channel's
//   kLanes partial sums meet by xor shuffles; lane 0 of the channel writes out. A block holds
//   kChans = FS_THREADS / kLanes channels.
// The kernel is bound by the state's bytes (read once, written once), and with 8 state elements per
// thread its integer work is not small: offsets inside one batch row (and the whole of A, D, dt_bias) are
// 32-bit (the host checks that they fit), only the batch row's base is 64-bit, taken once per row.
//
// Compile-time constants (host prelude):
//   FS_IN_DTYPE  x/dt/z/out dtype: 0 = fp16, 1 = bf16, 2 = fp32
//   FS_BC_DTYPE  B/C dtype, same coding
//   FS_DSTATE    padded state count: power of two >= max(dstate, 4)
//   FS_THREADS   threads per block (128)
//   FS_BPT       batch rows per thread, >= 1 (grid.z = ceil(batch / FS_BPT)); the host takes 2 when that
//                leaves >= 3 blocks per SM, else 1 (4 was slower everywhere measured: 76 registers)
// Lanes per channel are derived: kLanes = min(FS_DSTATE / 4, 32).

#if !defined(FS_IN_DTYPE) || !defined(FS_BC_DTYPE) || !defined(FS_DSTATE) || !defined(FS_THREADS)
#error "the host prelude must define FS_IN_DTYPE, FS_BC_DTYPE, FS_DSTATE and FS_THREADS"
#endif
#ifndef FS_BPT
#define FS_BPT 1
#endif

#include "common/copy.cuh"
#include "common/math.cuh"

using namespace fs;

// One by-value parameter block: 10 pointers, 34 int64s, 6 int32s (sizeof = 80 + 272 + 24 = 376).
// Strides in elements; the no-head form passes nheads = 1 and head strides 0.
struct StateUpdateParams {
  float* state;          // (batch, nheads, dim, dstate) fp32, in place
  const void* x;         // (batch, nheads, dim) FS_IN_DTYPE
  const void* dt;        // (batch, nheads, dim) FS_IN_DTYPE
  const float* A;        // (nheads, dim, dstate)
  const void* B;         // (batch, ngroups, dstate) FS_BC_DTYPE
  const void* C;         // (batch, ngroups, dstate) FS_BC_DTYPE
  const float* D;        // (nheads, dim) or null when !has_D
  const void* z;         // (batch, nheads, dim) FS_IN_DTYPE or null when !has_z
  const float* dt_bias;  // (nheads, dim) or null when !has_dt_bias
  void* out;             // (batch, nheads, dim) FS_IN_DTYPE
  i64 batch, nheads, dim, dstate, ngroups;
  i64 state_batch, state_head, state_dim, state_dstate;
  i64 x_batch, x_head, x_dim;
  i64 dt_batch, dt_head, dt_dim;
  i64 z_batch, z_head, z_dim;
  i64 out_batch, out_head, out_dim;
  i64 A_head, A_dim, A_dstate;
  i64 B_batch, B_group, B_dstate;
  i64 C_batch, C_group, C_dstate;
  i64 D_head, D_dim;
  i64 dt_bias_head, dt_bias_dim;
  int has_D, has_z, has_dt_bias, softplus;
  int vec4;              // 1: dstate % 4 == 0, state/A/B/C dstate strides 1, rows of state/A 16 B aligned, of B/C 4*elem aligned
  int pad_;
};
static_assert(sizeof(StateUpdateParams) == 376, "StateUpdateParams layout changed: update the host mirror");

constexpr int kDState = FS_DSTATE;
constexpr int kLanes = kDState / 4 < 32 ? kDState / 4 : 32;
constexpr int kGroups = kDState / (4 * kLanes);
constexpr int kThreads = FS_THREADS;
constexpr int kChans = kThreads / kLanes;
constexpr int kBPT = FS_BPT;
static_assert(kDState >= 4 && (kDState & (kDState - 1)) == 0, "FS_DSTATE: power of two >= 4");

// grid (ceil(dim / kChans), nheads, ceil(batch / FS_BPT)), block FS_THREADS, no dynamic smem.
// A thread serves its channel's lanes' states in kBPT batch rows b = blockIdx.z * kBPT + r: every global
// load of all its rows is issued before the first use (kBPT * 16 B of state in flight per thread), and A,
// D, dt_bias (per channel, the same for every batch row) are loaded once.
extern "C" __global__ void __launch_bounds__(FS_THREADS) selective_state_update(const StateUpdateParams p) {
  const int tid = threadIdx.x;
  const int l = tid % kLanes;
  i64 d = (i64)blockIdx.x * kChans + tid / kLanes;
  const bool dact = d < p.dim;
  if (!dact) d = p.dim - 1;              // idle lanes shadow the last channel and store nothing
  const int hi = blockIdx.y, di = (int)d;
  const int g = hi / (int)(p.nheads / p.ngroups);
  // 32-bit offsets of this channel inside a batch row of each per-row tensor
  const int x_off = hi * (int)p.x_head + di * (int)p.x_dim;
  const int dt_off = hi * (int)p.dt_head + di * (int)p.dt_dim;
  const int z_off = hi * (int)p.z_head + di * (int)p.z_dim;
  const int out_off = hi * (int)p.out_head + di * (int)p.out_dim;
  const int st_off = hi * (int)p.state_head + di * (int)p.state_dim;
  i64 b[kBPT];
  bool active[kBPT];
#pragma unroll
  for (int r = 0; r < kBPT; ++r) {
    b[r] = (i64)blockIdx.z * kBPT + r;
    active[r] = dact && b[r] < p.batch;
    if (b[r] >= p.batch) b[r] = p.batch - 1;   // idle rows shadow the last batch row and store nothing
  }
  const int a0 = hi * (int)p.A_head + di * (int)p.A_dim;

  // ---- phase 1: issue the loads of every row's state (HBM), x, dt, z; A, D, dt_bias once
  float xv[kBPT], dtv[kBPT], zv[kBPT];
  float sv[kBPT][kGroups][4], av[kGroups][4];
  const float bias = p.has_dt_bias ? __ldg(p.dt_bias + hi * (int)p.dt_bias_head + di * (int)p.dt_bias_dim) : 0.f;
  const float Dv = p.has_D ? __ldg(p.D + hi * (int)p.D_head + di * (int)p.D_dim) : 0.f;
#pragma unroll
  for (int gi = 0; gi < kGroups; ++gi) {
    const int n0 = (gi * kLanes + l) * 4;
#pragma unroll
    for (int i = 0; i < 4; ++i) av[gi][i] = 0.f;
    if (p.vec4) {
      if (n0 < p.dstate) {
        const float4 a4 = __ldg((const float4*)(p.A + a0 + n0));
        av[gi][0] = a4.x; av[gi][1] = a4.y; av[gi][2] = a4.z; av[gi][3] = a4.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        if (n0 + i < p.dstate) av[gi][i] = __ldg(p.A + a0 + (n0 + i) * (int)p.A_dstate);
    }
  }
#pragma unroll
  for (int r = 0; r < kBPT; ++r) {
    xv[r] = ldg_f32<FS_IN_DTYPE>(p.x, b[r] * p.x_batch + x_off);
    dtv[r] = ldg_f32<FS_IN_DTYPE>(p.dt, b[r] * p.dt_batch + dt_off);
    zv[r] = p.has_z ? ldg_f32<FS_IN_DTYPE>(p.z, b[r] * p.z_batch + z_off) : 0.f;
    const float* st = p.state + b[r] * p.state_batch + st_off;
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      const int n0 = (gi * kLanes + l) * 4;
      if (p.vec4) {
        if (n0 < p.dstate) {      // dstate % 4 == 0: the whole group is real
          const float4 s4 = *(const float4*)(st + n0);
          sv[r][gi][0] = s4.x; sv[r][gi][1] = s4.y; sv[r][gi][2] = s4.z; sv[r][gi][3] = s4.w;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) sv[r][gi][i] = 0.f;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = n0 + i;
          sv[r][gi][i] = n < p.dstate ? st[n * (int)p.state_dstate] : 0.f;
        }
      }
    }
  }

  // ---- phase 2, per row: B and C (a few bytes per (row, group), cache hits), update, store the state,
  //      reduce y, store out
#pragma unroll
  for (int r = 0; r < kBPT; ++r) {
    const i64 b0 = b[r] * p.B_batch + g * (int)p.B_group;
    const i64 c0 = b[r] * p.C_batch + g * (int)p.C_group;
    float bv[kGroups][4], cv[kGroups][4];
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      const int n0 = (gi * kLanes + l) * 4;
      if (p.vec4) {
        float4 b4 = make_float4(0.f, 0.f, 0.f, 0.f), c4 = b4;
        if (n0 < p.dstate) {
          b4 = ldg4_f32<FS_BC_DTYPE>(p.B, b0 + n0);
          c4 = ldg4_f32<FS_BC_DTYPE>(p.C, c0 + n0);
        }
        bv[gi][0] = b4.x; bv[gi][1] = b4.y; bv[gi][2] = b4.z; bv[gi][3] = b4.w;
        cv[gi][0] = c4.x; cv[gi][1] = c4.y; cv[gi][2] = c4.z; cv[gi][3] = c4.w;
      } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int n = n0 + i;
          const bool real = n < p.dstate;
          bv[gi][i] = real ? ldg_f32<FS_BC_DTYPE>(p.B, b0 + n * (int)p.B_dstate) : 0.f;
          cv[gi][i] = real ? ldg_f32<FS_BC_DTYPE>(p.C, c0 + n * (int)p.C_dstate) : 0.f;
        }
      }
    }
    float dt = dtv[r] + bias;
    if (p.softplus) dt = softplus(dt);
    const float dtx = dt * xv[r];
    float* st = p.state + b[r] * p.state_batch + st_off;
    float y = 0.f;
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      const int n0 = (gi * kLanes + l) * 4;
      float* s = sv[r][gi];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[i] = fmaf(s[i], ex2(dt * av[gi][i] * kLog2e), dtx * bv[gi][i]);
        y = fmaf(s[i], cv[gi][i], y);
      }
      if (active[r]) {
        if (p.vec4) {
          if (n0 < p.dstate) *(float4*)(st + n0) = make_float4(s[0], s[1], s[2], s[3]);
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            if (n0 + i < p.dstate) st[(n0 + i) * (int)p.state_dstate] = s[i];
        }
      }
    }
#pragma unroll
    for (int m = kLanes / 2; m >= 1; m /= 2) y += __shfl_xor_sync(0xffffffffu, y, m);
    if (active[r] && l == 0) {
      float o = y;
      if (p.has_D) o = fmaf(Dv, xv[r], o);
      if (p.has_z) o *= silu(zv[r]);
      st_f32<FS_IN_DTYPE>(p.out, b[r] * p.out_batch + out_off, o);
    }
  }
}
