// common/opaque.cuh: values the optimiser must not see through, to control register pressure.
// Each is an asm the compiler cannot look into (opaque: a mov that ptxas folds away; ptr_add: the
// add it names), so values derived from its result are not hoisted out of a loop, where they
// would hold registers across the main loop.
#pragma once

namespace fs {

// x, tied to a loop-variant salt: values computed from it (tile addresses, lane offsets) are
// recomputed per iteration (a few integer ops) instead of being kept live in registers that the
// accumulators need.
__device__ __forceinline__ int opaque(int x, int salt) {
    int r;
    asm("{\n .reg .b32 unused;\n mov.b32 %0, %1;\n mov.b32 unused, %2;\n}" : "=r"(r) : "r"(x), "r"(salt));
    return r;
}

// a + b with the sum hidden from the optimiser, so an unrolled loop steps one pointer instead of
// keeping one precomputed 64-bit address per unrolled step live across the main loop.
__device__ __forceinline__ const char* ptr_add(const char* a, long long b) {
    const char* r;
    asm("add.s64 %0, %1, %2;" : "=l"(r) : "l"(a), "l"(b));
    return r;
}

}  // namespace fs
