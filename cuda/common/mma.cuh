// common/mma.cuh: tensor-core matrix products through mma.sync (sm_80+) and the ldmatrix loads
// that bring their operands from shared memory.
//
// Fragment layout of m16n8k16 (and of the f32 accumulator, m16n8): lane = 4 g + t owns rows g and
// g + 8 and columns 2t, 2t + 1 (A: k columns 2t, 2t + 1 and 2t + 8, 2t + 9). A is 4 registers of
// packed 16-bit pairs (convert.cuh: pack2), B 2 registers, C / D 4 floats.
#pragma once

#include "common/types.cuh"
#include "common/convert.cuh"

namespace fs {

// Four 8x8 16-bit matrices from shared memory (LDSM.16.M88.4): lane l supplies the row address of
// row l % 8 of matrix l / 8 (addr: smem_u32 space); register i receives matrix i in mma layout.
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
// The same, each matrix transposed (LDSM.16.MT88.4): the B operand of a row-major [k][n] tile.
__device__ __forceinline__ void ldsm_x4_trans(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// Four 8x8 16-bit matrices to shared memory (STSM.16.M88.4, sm_90): lane l supplies the row
// address of row l % 8 of matrix l / 8; register i holds matrix i's row l / 4, columns 2 (l % 4)
// and 2 (l % 4) + 1 (the inverse of ldsm_x4).
__device__ __forceinline__ void stsm_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}

// D += A * B, m16n8k16, fp16 (DT 0) or bf16 (DT 1) inputs, f32 accumulate (HMMA.16816.F32[.BF16]).
template <int DT>
__device__ __forceinline__ void mma16(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    if constexpr (DT == 1) {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    } else {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
}

// Two adjacent n8 tiles with the same A (2 HMMA): b is one ldsm_x4 B fragment, b[0..1] the k16 x n8
// operand of d0 and b[2..3] that of d1, the usual way one ldmatrix.x4 feeds two mma.
template <int DT>
__device__ __forceinline__ void mma16_x2(float (&d0)[4], float (&d1)[4], const u32 (&a)[4], const u32 (&b)[4]) {
    mma16<DT>(d0, a, b[0], b[1]);
    mma16<DT>(d1, a, b[2], b[3]);
}

// D += A * B, m16n8k8, tf32 inputs (convert.cuh: to_tf32), f32 accumulate (HMMA.1688.F32.TF32).
__device__ __forceinline__ void mma_tf32(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// D += A * B in ~fp32 precision from an A already split into tf32 hi + lo and fp32 B values
// (3xTF32: a_lo b_hi + a_hi b_lo + a_hi b_hi, the lo * lo term dropped; ~21 bits per product).
// The small terms go first so they are not absorbed by the large one.
__device__ __forceinline__ void mma_3xtf32(float (&d)[4], const u32 (&a_hi)[4], const u32 (&a_lo)[4],
                                           float b0, float b1) {
    u32 b0h, b0l, b1h, b1l;
    split_tf32(b0, b0h, b0l);
    split_tf32(b1, b1h, b1l);
    mma_tf32(d, a_lo, b0h, b1h);
    mma_tf32(d, a_hi, b0l, b1l);
    mma_tf32(d, a_hi, b0h, b1h);
}

// mma16_x2 for fp32 data (6 HMMA): b holds raw fp32 bits (an ldsm_x4 of fp32 rows moves whole
// floats as pairs of 16-bit halves), split into tf32 hi + lo here.
__device__ __forceinline__ void mma_3xtf32_x2(float (&d0)[4], float (&d1)[4], const u32 (&a_hi)[4],
                                              const u32 (&a_lo)[4], const u32 (&b)[4]) {
    mma_3xtf32(d0, a_hi, a_lo, __uint_as_float(b[0]), __uint_as_float(b[1]));
    mma_3xtf32(d1, a_hi, a_lo, __uint_as_float(b[2]), __uint_as_float(b[3]));
}

// The f32 accumulators of two adjacent n8 tiles (c0: columns 0-7, c1: 8-15) as the A operand of a
// k16 mma (4 cvt.rn pack2): the accumulator layout of m16n8 is the A layout of m16n8k16, so a
// product (P, dS) feeds the next mma straight from registers, rounded to the input type.
template <int DT>
__device__ __forceinline__ void acc_to_a(u32 (&a)[4], const float (&c0)[4], const float (&c1)[4]) {
    a[0] = pack2<DT>(c0[0], c0[1]);
    a[1] = pack2<DT>(c0[2], c0[3]);
    a[2] = pack2<DT>(c1[0], c1[1]);
    a[3] = pack2<DT>(c1[2], c1[3]);
}

// Clears an array of m16n8 accumulators (register moves only, fully unrolled).
template <int M, int N>
__device__ __forceinline__ void zero(float (&acc)[M][N][4]) {
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
}

}  // namespace fs
