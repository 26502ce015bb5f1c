// common/softcap.cuh: attention score capping (Gemma-style softcap), shared by the forward and
// the backward: the backward recomputes P from the forward's LSE, so both must compute the same
// scores, bit for bit.
//
// With a softcap the score of q.k is s = cap * tanh(scale * q.k / cap): tanh of the product
// pre-scaled by scale / cap, then the softmax runs with cap as its scale.
#pragma once

#include "common/math.cuh"

namespace fs {

// tanh for the attention softcap, by input dtype DT. fp32 (DT 2): through ex2 (relative error
// ~1e-7 away from 0, absolute ~1e-7 near 0). fp16 / bf16: the hardware tanh.approx (MUFU.TANH,
// relative error ~2^-11, below the rounding of 16-bit scores; what FlashAttention uses), one MUFU
// op and fewer live registers.
template <int DT>
__device__ __forceinline__ float tanh_softcap(float x) {
    if constexpr (DT == 2) {
        const float e = ex2(fabsf(x) * (2.0f * kLog2e));
        const float r = 1.0f - 2.0f * rcp(e + 1.0f);
        return copysignf(r, x);
    } else {
        float y;
        asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
        return y;
    }
}

// The two multipliers of a raw product q.k: `pre` (before tanh_softcap; only with a softcap) and
// `log2` (the softmax scale times log2(e): P = exp2(s * log2 - max)). One MUFU.RCP with a softcap.
struct ScoreScale {
    float pre;
    float log2;
};
template <bool kSoftcap>
__device__ __forceinline__ ScoreScale score_scale(float softmax_scale, float softcap) {
    if constexpr (kSoftcap) return {softmax_scale * rcp(softcap), softcap * kLog2e};
    else return {1.0f, softmax_scale * kLog2e};
}

}  // namespace fs
