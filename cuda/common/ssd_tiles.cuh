// common/ssd_tiles.cuh: 16-bit operand tiles of the SSD kernels that run on fp16 / bf16 data
// (cuda/ssd_fwd2.cu, and cuda/ssd_bwd.cu's 16-bit dx kernel): tile pitches, the global -> shared
// tile load (16-byte cp.async or element loads), the ldmatrix lane addresses of A / B operands
// stored either way round, and one warp row of m16n8k16 products.
//
// Rows are padded by 8 elements (row pitch = 16 bytes mod 128), so the 8 row addresses of one
// ldmatrix 8 x 8 matrix hit distinct bank groups.
#pragma once

#include "common/ssd.cuh"

constexpr int kRows = 64;       // rows of every CTA tile (4 warps x 16)
constexpr int kLd32 = 32 + 8;   // row pitch (elements) of a 32-wide 16-bit tile: 80 bytes
constexpr int kLd64 = 64 + 8;   // 64-wide: 144 bytes
constexpr int kLd128 = 128 + 8; // 128-wide: 272 bytes
constexpr int kNb = kQ / kRows; // 64-row blocks per chunk
constexpr int kPairs = kNb * (kNb + 1) / 2;

// A kR x kC 16-bit tile into shared memory (row pitch kLd): row r (< valid_rows) from g + r * stride
// elements, columns < valid_cols (the rest and the invalid rows zero). vec: 16-byte cp.async chunks
// (valid_cols a multiple of 8; the caller commits and waits), else element loads (synchronous).
template <int kR, int kC, int kLd>
__device__ __forceinline__ void load_tile(u16* s, const u16* g, i64 stride, int valid_rows, int valid_cols, bool vec) {
    if (vec) {
        // thread t copies chunk (t % kPerRow) of rows t / kPerRow + kRowStep k: its column, source
        // pointer and shared address are set once, each pass adds a constant (ncu 2026-11-27: the
        // per-chunk 64-bit index arithmetic of a strided loop cost ~120 instructions per warp per
        // 64 x 64 tile, a quarter of ssd2_chunk_scan's instructions with the epilogue's)
        constexpr int kPerRow = kC / 8;  // 16-byte chunks per row
        static_assert(kThreads % kPerRow == 0 && (kR * kPerRow) % kThreads == 0, "tile / thread shape");
        constexpr int kRowStep = kThreads / kPerRow, kPasses = kR * kPerRow / kThreads;
        const int r0 = threadIdx.x / kPerRow, c8 = (threadIdx.x % kPerRow) * 8;
        const bool col_ok = c8 < valid_cols;
        const u16* src = g + r0 * stride + c8;
        const i64 step = kRowStep * stride;
        const u32 dst = smem_u32(s + r0 * kLd + c8);
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
            const bool ok = col_ok && r0 + k * kRowStep < valid_rows;
            cp_async16(dst + k * kRowStep * kLd * 2, ok ? src : g, ok);
            src += step;
        }
    } else {
        for (int i = threadIdx.x; i < kR * kC; i += kThreads) {
            const int r = i / kC, col = i % kC;
            s[r * kLd + col] = r < valid_rows && col < valid_cols ? __ldg(g + r * stride + col) : (u16)0;
        }
    }
}

// ldmatrix lane addresses (elements from the tile origin) for a 16 x 16 block at (row0, col0):
// A operand stored [m][k] (non-trans) or B operand stored [n][k] (non-trans, two n8 tiles).
__device__ __forceinline__ int lane_a(int lane, int ld) { return (lane & 15) * ld + (lane >> 4) * 8; }
__device__ __forceinline__ int lane_bn(int lane, int ld) { return ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8; }
// A operand stored [k][m] (.trans) and B operand stored [k][n] (.trans, two n8 tiles).
__device__ __forceinline__ int lane_at(int lane, int ld) { return ((lane & 7) + ((lane >> 4) << 3)) * ld + ((lane >> 3) & 1) * 8; }
__device__ __forceinline__ int lane_bt(int lane, int ld) { return ((lane & 7) + ((lane >> 3) & 1) * 8) * ld + (lane >> 4) * 8; }

// acc[NT][4] += A (16 x 16 k-block kk) B for one warp, A from ldsm_x4 at a_addr, B (NT n8 tiles) by
// NT / 2 ldmatrix at b_addr + np * b_step bytes (trans or not).
template <int NT, bool kTransB>
__device__ __forceinline__ void mma_row(float (&acc)[NT][4], const u32 (&a)[4], u32 b_addr, u32 b_step) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
        u32 bf[4];
        if constexpr (kTransB) ldsm_x4_trans(bf, b_addr + np * b_step);
        else ldsm_x4(bf, b_addr + np * b_step);
        mma16_x2<DT>(acc[2 * np], acc[2 * np + 1], a, bf);
    }
}
