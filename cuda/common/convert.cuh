// common/convert.cuh: fp16 / bf16 <-> f32 and f32 -> tf32 conversions, by dtype code DT
// (types.cuh: 0 fp16, 1 bf16, 2 fp32). bf16 -> f32 is a shift (bf16 is the top half of an f32);
// fp16 -> f32 is one cvt (F2F / HADD2.F32); f32 -> 16-bit rounds to nearest even with cvt.rn.
#pragma once

#include "common/types.cuh"

namespace fs {

// A 16-bit value (in the low half of h16; the high half must be zero for bf16) as f32.
template <int DT>
__device__ __forceinline__ float half_to_f32(u32 h16) {
    if constexpr (DT == 1) {
        return __uint_as_float(h16 << 16);
    } else {
        float f;
        const u16 h = (u16)h16;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
}
// Raw element bits (a whole word for fp32, the low 16 bits otherwise) as f32.
template <int DT>
__device__ __forceinline__ float raw_to_f32(u32 v) {
    if constexpr (DT == 2) return __uint_as_float(v);
    else return half_to_f32<DT>(v);
}
// Element i of a packed Raw as f32 (bf16: a mask or shift of its word, no cvt).
template <int DT, int N, int ES>
__device__ __forceinline__ float elem(const Raw<N, ES>& r, int i) {
    if constexpr (DT == 2) {
        return __uint_as_float(r.w[i]);
    } else if constexpr (DT == 1) {
        return (i & 1) ? __uint_as_float(r.w[i >> 1] & 0xffff0000u) : __uint_as_float(r.w[i >> 1] << 16);
    } else {
        return half_to_f32<0>((i & 1) ? (r.w[i >> 1] >> 16) : (r.w[i >> 1] & 0xffffu));
    }
}

// f32 -> one 16-bit value, round to nearest even (cvt.rn.bf16.f32 / cvt.rn.f16.f32).
template <int DT>
__device__ __forceinline__ u16 f32_to_half(float v) {
    u16 h;
    if constexpr (DT == 1) asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    else asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return h;
}
// Two floats -> a packed 16-bit pair (lo in the low half), round to nearest even: one
// cvt.rn.{bf16x2,f16x2}.f32 (F2FP), the layout of an mma operand register and of memory.
template <int DT>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 r;
    if constexpr (DT == 1) {
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    } else {
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    }
    return r;
}
// The two 16-bit elements of a packed pair as floats (lo, hi).
template <int DT>
__device__ __forceinline__ float2 unpack2(u32 x) {
    if constexpr (DT == 1) {
        return make_float2(__uint_as_float(x << 16), __uint_as_float(x & 0xffff0000u));
    } else {
        float lo, hi;
        asm("{ .reg .b16 l, h; mov.b32 {l, h}, %2; cvt.f32.f16 %0, l; cvt.f32.f16 %1, h; }"
            : "=f"(lo), "=f"(hi)
            : "r"(x));
        return make_float2(lo, hi);
    }
}
// N floats -> a Raw of dtype DT (fp32: the bits; 16-bit: pack2 per pair, the odd tail padded with 0).
template <int DT, int N>
__device__ __forceinline__ void pack_raw(Raw<N, DT == 2 ? 4 : 2>& r, const float (&o)[N]) {
    if constexpr (DT == 2) {
#pragma unroll
        for (int i = 0; i < N; ++i) r.w[i] = __float_as_uint(o[i]);
    } else {
#pragma unroll
        for (int i = 0; i < N / 2; ++i) r.w[i] = pack2<DT>(o[2 * i], o[2 * i + 1]);
        if constexpr (N & 1) r.w[N / 2] = pack2<DT>(o[N - 1], 0.f);
    }
}

// Four floats -> four e4m3 bytes (a in the lowest), round to nearest even, saturating at +-448
// (cvt.rn.satfinite.e4m3x2.f32: its first source goes to the high byte); sm_89 and later.
__device__ __forceinline__ u32 pack_e4m3x4(float a, float b, float c, float d) {
    u32 r;
    asm("{ .reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi}; }"
        : "=r"(r)
        : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

// f32 -> tf32 bits, round to nearest (ties away): cvt.rna.tf32.f32, the mma tf32 operand format.
__device__ __forceinline__ u32 to_tf32(float x) {
    u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
    return r;
}
// x = hi + lo with hi, lo both tf32 (the 3xTF32 split: hi keeps ~11 bits, lo the next ~11).
__device__ __forceinline__ void split_tf32(float x, u32& hi, u32& lo) {
    hi = to_tf32(x);
    lo = to_tf32(x - __uint_as_float(hi));
}
// split_tf32 of the four floats of an mma fragment.
__device__ __forceinline__ void split4(const float (&x)[4], u32 (&hi)[4], u32 (&lo)[4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e) split_tf32(x[e], hi[e], lo[e]);
}

}  // namespace fs
