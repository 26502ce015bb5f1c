// common/math.cuh: the special functions of the kernels as single MUFU instructions (inline PTX,
// no libdevice), the functions built on them, 2^x on the FMA pipe as polynomials (ex2_poly for
// the selective scan, ex2_fma for the attention softmax), and quad reductions.
//
// The .approx.ftz forms are what the kernels were tuned and validated with: one MUFU op each,
// a few ulp of error (PTX ISA), denormals flushed to zero. Without toolkit headers there is no
// libdevice anyway, and its exp2f / logf would add range handling the callers do not need.
#pragma once

namespace fs {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// -inf / +inf as bit patterns (no INFINITY macro without toolkit headers).
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000u); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000u); }

// 2^x: MUFU.EX2.
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// log2(x): MUFU.LG2.
__device__ __forceinline__ float lg2(float x) {
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
// 1 / x: MUFU.RCP.
__device__ __forceinline__ float rcp(float x) {
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// 2^x on the FMA pipe (FFMAs + integer add, no MUFU): x = j + f, j = rint(x), |f| <= 1/2, 2^f by a
// degree-5 minimax polynomial (relative error 1.8e-7, like MUFU.EX2), exponent added as integer.
// x clamped to [-125, 125]. Lets a MUFU-bound loop move some of its exps to the FMA pipe, which
// issues 8x more per clock.
__device__ __forceinline__ float ex2_poly(float x) {
    x = fminf(fmaxf(x, -125.f), 125.f);
    const float r = x + 12582912.f;  // 1.5 * 2^23: rint(x) lands in the low mantissa bits
    const float f = x - (r - 12582912.f);
    float p = 1.3276709e-3f;
    p = fmaf(p, f, 9.6715093e-3f);
    p = fmaf(p, f, 5.5506926e-2f);
    p = fmaf(p, f, 2.4022242e-1f);
    p = fmaf(p, f, 6.9314700e-1f);
    p = fmaf(p, f, 1.0f);
    return __int_as_float(__float_as_int(p) + (__float_as_int(r) << 23));
}

// 2^x on the FMA pipe for a softmax (the TMA attention forward's FS_EXP_POLY):
// x = j + f, j = rint(x), |f| <= 1/2, 2^f by a degree-3 near-minimax polynomial (relative error
// 1.0e-4: below the 16-bit rounding P gets for P V), the exponent added as an integer; 0 below
// -126 (a masked score's -inf included). It differs from ex2_poly on purpose: degree 3, two FFMAs
// fewer (P is rounded to 16 bits anyway; the scan's exps are decays of its fp32 state and get
// ex2_poly's 1.8e-7), and exactly 0 for x < -126, which a softmax needs (masked scores are -inf
// and must weigh nothing), where ex2_poly clamps to 2^-125 (the scan's arguments are finite).
// Not clamped above: a softmax's arguments are at most 8 (P <= 2^8, its conditional rescale).
__device__ __forceinline__ float ex2_fma(float x) {
    const float xc = fmaxf(x, -126.f);
    const float r = xc + 12582912.f;  // 1.5 * 2^23: rint(xc) lands in the low mantissa bits
    const float f = xc - (r - 12582912.f);
    const float p = fmaf(fmaf(fmaf(0.05592208f, f, 0.24264039f), f, 0.69312102f), f, 0.99992448f);
    const float y = __int_as_float(__float_as_int(p) + (__float_as_int(r) << 23));
    return x < -126.f ? 0.f : y;
}

// softplus as mamba computes it: v <= 20 ? log1p(exp(v)) : v. log1p through lg2(1 + e), with a
// 3-term series below e = 2^-6 where 1 + e would lose e's low bits. Two MUFU ops.
__device__ __forceinline__ float softplus(float v) {
    const float e = ex2(v * kLog2e);
    const float r = e < 0.015625f ? e * (1.f - e * (0.5f - e * 0.33333334f)) : kLn2 * lg2(1.f + e);
    return v <= 20.f ? r : v;
}
// 1 / (1 + exp(-v)): MUFU.EX2 + MUFU.RCP.
__device__ __forceinline__ float sigmoid(float v) { return rcp(1.f + ex2(-v * kLog2e)); }
// v * sigmoid(v) (the z gate of mamba).
__device__ __forceinline__ float silu(float v) { return v * sigmoid(v); }

// Max / sum over the 4 lanes of a quad (lanes 4g .. 4g + 3: the lanes that share an mma row),
// two SHFL.BFLY each; every lane of the quad gets the result.
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

}  // namespace fs
