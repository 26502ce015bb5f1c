// common/ssd_tiles.cuh: 16-bit operand tiles of the SSD kernels that run on fp16 / bf16 data
// (cuda/ssd_fwd2.cu, and cuda/ssd_bwd.cu's 16-bit kernels): tile pitches, the global -> shared
// tile load (16-byte cp.async or element loads), the ldmatrix lane addresses of A / B operands
// stored either way round, one warp row of m16n8k16 products, and the chunk-state product
// (mma.sync, or on sm_90a wgmma with B in 128B-swizzled stages).
//
// Rows are padded by 8 elements (row pitch = 16 bytes mod 128), so the 8 row addresses of one
// ldmatrix 8 x 8 matrix hit distinct bank groups.
#pragma once

#include "common/ssd.cuh"

// sm_90a builds run the state product and the chunk scan's products on wgmma (see below); wgmma is
// sm_90a's alone, so every other arch (sm_100, sm_120 ... included) keeps mma.sync
#if defined(FS_ARCH) && FS_ARCH == 90
#include "common/wgmma.cuh"
#define FS_SSD_STATE_WGMMA 1
#else
#define FS_SSD_STATE_WGMMA 0
#endif

// p advanced to the next 1024-byte boundary of the shared window (a swizzled wgmma tile's
// alignment; the caller reserves 1024 bytes of slack).
__device__ __forceinline__ unsigned char* align_smem_1024(unsigned char* p) {
    return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}

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

// acc[NT][4]'s row half hh (this thread's row r0 + 8 hh: elements 2 hh, 2 hh + 1 of each n8 tile)
// times f (a row factor of the accumulator layout).
template <int NT>
__device__ __forceinline__ void scale_row(float (&acc)[NT][4], int hh, float f) {
#pragma unroll
    for (int jn = 0; jn < NT; ++jn) {
        acc[jn][2 * hh] *= f;
        acc[jn][2 * hh + 1] *= f;
    }
}

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

// acc[NT][4] += (hi + lo) B for one warp: mma_row with an A operand split into a hi / lo pair of
// 16-bit values, each B fragment pair (ldmatrix .trans at b_addr + np * b_step) loaded once for both.
template <int NT>
__device__ __forceinline__ void mma_row_hilo(float (&acc)[NT][4], const u32 (&hi)[4], const u32 (&lo)[4], u32 b_addr,
                                             u32 b_step) {
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
        u32 bf[4];
        ldsm_x4_trans(bf, b_addr + np * b_step);
        mma16_x2<DT>(acc[2 * np], acc[2 * np + 1], hi, bf);
        mma16_x2<DT>(acc[2 * np], acc[2 * np + 1], lo, bf);
    }
}

// One 64 x 64 fp32 block of the C B^T workspace (64 rows of kQ floats from g, 16-byte aligned) into
// shared memory of pitch kLd floats by cp.async, 8 16-byte chunks a thread; the caller commits.
// (ssd2_chunk_scan's W x, one block ahead of the mma; its header has the measurements.)
// Thread t copies columns 4 (t % 16) .. + 3 of rows t / 16 + 8 k: one source pointer and one shared
// address a call, constant offsets a pass (SASS 2026-11-29: the per-chunk (t + 128 k) / 16 rows had
// each pass form its own 64-bit address, ~9 instructions a chunk).
template <int kLd>
__device__ __forceinline__ void load_cb_block(float* s, const float* g) {
    constexpr int kRowStep = kThreads / 16;
    const int r = threadIdx.x / 16, c4 = (threadIdx.x % 16) * 4;
    const float* src = g + r * kQ + c4;
    const u32 dst = smem_u32(s + r * kLd + c4);
#pragma unroll
    for (int k = 0; k < kRows / kRowStep; ++k) cp_async16(dst + k * kRowStep * kLd * 4, src + k * kRowStep * kQ, true);
}

// The top of step k of a two-stage cp.async loop of nsteps steps: step k + 1 issued into the other
// stage (load(k + 1, stage), which commits its group) and every older group waited for, or at the
// last step every group; then the barrier that shows step k's stage to every warp. (The caller ends
// a step with its own barrier where the next one refills the stage just read.) kAsyncProxy: the
// stage is read by wgmma, so each thread's writes are made visible to the async proxy first.
template <bool kAsyncProxy = false, typename Load>
__device__ __forceinline__ void next_stage(int k, int nsteps, Load&& load) {
    if (k + 1 < nsteps) {
        load(k + 1, (k + 1) & 1);
        cp_async_wait<1>();
    } else {
        cp_async_wait<0>();
    }
#if FS_SSD_STATE_WGMMA
    if constexpr (kAsyncProxy) fence_proxy_async();
#else
    static_assert(!kAsyncProxy, "wgmma stages are sm_90a's");
#endif
    __syncthreads();
}

// The start of a kStages-stage loop of nsteps >= 1 steps: steps 0 .. kStages - 2 issued
// (load(k, stage k) commits step k's group; an empty group for each step past nsteps, so that
// next_stage_n's count of groups in flight holds).
template <int kStages, typename Load>
__device__ __forceinline__ void first_stages_n(int nsteps, Load&& load) {
    load(0, 0);
#pragma unroll
    for (int k = 1; k < kStages - 1; ++k) {
        if (k < nsteps) load(k, k);
        else cp_async_commit();
    }
}

// The top of step k of a kStages-stage loop whose caller issued steps 0 .. kStages - 2: step
// k + kStages - 1 issued into the stage step k - 1 read (the barrier ending step k - 1 freed it),
// or an empty group past the last step so that the count stays uniform; then step k's group
// waited for (kStages - 1 younger groups may stay in flight) and the barrier.
template <int kStages, typename Load>
__device__ __forceinline__ void next_stage_n(int k, int nsteps, Load&& load) {
    const int kn = k + kStages - 1;
    if (kn < nsteps) load(kn, kn % kStages);
    else cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncthreads();
}

// Stages of weighted_state_product's tiles for its callers: three on sm_90 (two steps in flight;
// 128 registers and 41-45 KB static there), two elsewhere (sm_80 took 162 registers with three)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kStateStages = 3;
#else
constexpr int kStateStages = 2;
#endif

// An A fragment of x^T (its k columns = positions) scaled by the positions' weights, rounded to 16
// bits once: a[0], a[1] hold positions 2t, 2t + 1 of the k16 step (weights wl), a[2], a[3] those
// + 8 (wh). weighted_a loads it by ldmatrix .trans at a_addr, the weights from w (the step's + 2t).
__device__ __forceinline__ void scale_a(u32 (&a)[4], float2 wl, float2 wh) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const float2 v = unpack2<DT>(a[e]), f = e < 2 ? wl : wh;
        a[e] = pack2<DT>(v.x * f.x, v.y * f.y);
    }
}
__device__ __forceinline__ void weighted_a(u32 (&a)[4], u32 a_addr, const float* w) {
    ldsm_x4_trans(a, a_addr);
    scale_a(a, *(const float2*)w, *(const float2*)(w + 8));
}

// A chunk's state-shaped product, 64 rows p x 128 columns n per CTA (warp w rows 16w .. 16w + 15,
// acc[16][4]): acc += sum over positions l of w_l a_l^T b_l, K = the chunk's positions, 32 a step in
// two stages: load(k, stage) fills s_a[stage] (32 positions x 64 rows, pitch kLd64) and s_b[stage]
// (32 positions x 128 columns, pitch kLd128) by cp.async and commits; the caller has issued step
// 0 (and may have committed earlier groups: step 0's wait covers them). A = a^T by ldmatrix .trans
// with its k columns (positions) scaled by s_w in fp32, rounded to 16 bits once, or with kHiLo as
// a hi / lo pair of 16-bit values (two mma: ~16 significant bits); B = b by .trans.
// ssd2_chunk_state (S_c: a = x, b = B) and ssd_bwd_chunk_dstate16 (L_c: a = dout, b = C).
// kStages > 2 (ssd2_chunk_state on sm_90): s_a / s_b hold kStages stages and the caller has issued
// steps 0 .. kStages - 2 (an empty group for each past nsteps): kStages - 1 steps of loads stay in
// flight (next_stage_n).
template <bool kHiLo, int kStages = 2, typename Load>
__device__ __forceinline__ void weighted_state_product(float (&acc)[16][4], u16 (*s_a)[32 * kLd64],
                                                       u16 (*s_b)[32 * kLd128], const float* s_w, int nsteps, Load load) {
    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5), t2 = 2 * (lane & 3);
    for (int k = 0; k < nsteps; ++k) {
        if constexpr (kStages == 2) next_stage(k, nsteps, load);
        else next_stage_n<kStages>(k, nsteps, load);
        const u32 a_base = smem_u32(s_a[k % kStages] + w16 + lane_at(lane, kLd64));
        const u32 b_base = smem_u32(s_b[k % kStages] + lane_bt(lane, kLd128));
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            u32 a[4];
            ldsm_x4_trans(a, a_base + kk * 16 * kLd64 * 2);
            // a[0], a[1] hold positions k = 2t, 2t + 1 of the step's 16; a[2], a[3] k + 8
            const float* w = s_w + 32 * k + 16 * kk + t2;
            const float2 wl = *(const float2*)w, wh = *(const float2*)(w + 8);
            if constexpr (kHiLo) {
                u32 lo[4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float2 v = unpack2<DT>(a[e]), f = e < 2 ? wl : wh;
                    const float x0 = v.x * f.x, x1 = v.y * f.y;
                    a[e] = pack2<DT>(x0, x1);
                    const float2 r = unpack2<DT>(a[e]);
                    lo[e] = pack2<DT>(x0 - r.x, x1 - r.y);
                }
                mma_row_hilo<16>(acc, a, lo, b_base + kk * 16 * kLd128 * 2, 16 * 2);
            } else {
                scale_a(a, wl, wh);
                mma_row<16, true>(acc, a, b_base + kk * 16 * kLd128 * 2, 16 * 2);
            }
        }
        __syncthreads();
    }
}

#if FS_SSD_STATE_WGMMA
// ---- the same product on wgmma (sm_90a: ssd2_chunk_state, ssd2_varlen_states) -----------------------
// B's stage is one kWgPos x 128 tile in wgmma's 128-byte swizzle (common/wgmma.cuh): two 64-column
// blocks of kWgPos rows x 128 bytes, kBzBlock bytes apart, the stage 1024-byte aligned. A stays as above (x^T by
// ldmatrix .trans from the padded s_a, scaled by s_w in registers) and enters as the register operand;
// the warpgroup's m64n128k16 reads B from shared memory once for the four warps, where mma_row had
// every warp read all of it by ldmatrix (32 KB of shared-memory reads a step instead of 8: ncu on the
// H200, 2026-11-29, had L1 at 77% and L2 at 76% of peak in ssd2_chunk_state). The accumulator of
// m64n128 is acc[16][4]'s layout (wgmma.cuh), so the callers' stores are unchanged.
// A step is kWgPos = 64 positions in two stages (since 2026-11-29: the same 64 positions in flight as
// three stages of 32 had, half the barriers and wgmma waits, four m64n128k16 a step; 128 registers
// under FS_STATE_BOUNDS, 55-57 KB static, four CTAs an SM. H200 b8 L2048: ssd_bwd_chunk_dstate16
// 129.8-130.0 -> 122.2-123.5 us, ssd2_chunk_state 117.0-117.6 -> 116.4-116.6).
constexpr int kWgPos = 64;                      // positions a step
constexpr int kWgStages = 2;
constexpr int kBzBlock = kWgPos * 128;          // bytes of one 64-column block (kWgPos rows x 128 B)
constexpr int kBzStage = kWgPos * 128;          // u16 elements of one stage (16 KB)

// Shared memory of kStages swizzled B stages plus the slack that aligns them to 1024 bytes.
template <int kStages>
struct BzStages {
    unsigned char raw[kStages * 2 * kBzBlock + 1024];
    __device__ __forceinline__ u16* base() {
        return (u16*)align_smem_1024(raw);
    }
};

// A kR x kC 16-bit tile (rows < valid_rows, columns < valid_cols, the rest zero) into shared memory s
// in wgmma's 128-byte swizzle (common/wgmma.cuh: kC / 64 column blocks of kR rows x 128 bytes, s
// 1024-byte aligned). vec: 16-byte cp.async chunks (the caller commits and waits): thread t copies
// chunk t % (kC / 8) of rows t / (kC / 8) + kRowStep k, rows a multiple of 8 apart that share one
// swizzle (row % 8), so one shared address a thread and constant offsets a pass; else element stores
// (synchronous).
template <int kR, int kC>
__device__ __forceinline__ void load_tile_sw(u16* s, const u16* g, i64 stride, int valid_rows, int valid_cols,
                                             bool vec) {
    constexpr int kPerRow = kC / 8, kRowStep = kThreads / kPerRow, kPasses = kR * kPerRow / kThreads;
    static_assert(kC % 64 == 0 && kThreads % kPerRow == 0 && kRowStep % 8 == 0 && (kR * kPerRow) % kThreads == 0,
                  "tile / thread shape");
    if (vec) {
        const int r0 = threadIdx.x / kPerRow, ch = threadIdx.x % kPerRow;
        const bool col_ok = ch * 8 < valid_cols;
        const u16* src = g + r0 * stride + ch * 8;
        const i64 step = kRowStep * stride;
        const u32 dst = smem_u32(s) + (ch >> 3) * (kR * 128) + r0 * 128 + (((ch & 7) ^ (r0 & 7)) << 4);
        if (valid_rows >= kR && valid_cols >= kC) {  // uniform: a whole tile, no per-pass predicate
#pragma unroll
            for (int k = 0; k < kPasses; ++k) cp_async16(dst + k * kRowStep * 128, src + k * step, true);
            return;
        }
#pragma unroll
        for (int k = 0; k < kPasses; ++k) {
            const bool ok = col_ok && r0 + k * kRowStep < valid_rows;
            cp_async16(dst + k * kRowStep * 128, ok ? src : g, ok);
            src += step;
        }
    } else {
        for (int i = threadIdx.x; i < kR * kC; i += kThreads) {
            const int r = i / kC, col = i % kC;
            const u16 v = r < valid_rows && col < valid_cols ? __ldg(g + r * stride + col) : (u16)0;
            *(u16*)((unsigned char*)s + swz_offset(kR, r, col)) = v;
        }
    }
}
// A B stage of the wgmma state product: kWgPos positions x 128 states.
__device__ __forceinline__ void load_tile_bz(u16* s, const u16* g, i64 stride, int valid_rows, int valid_cols,
                                             bool vec) {
    load_tile_sw<kWgPos, 128>(s, g, stride, valid_rows, valid_cols, vec);
}

// One kPos-position step of the wgmma state product: d (acc[16][4]'s registers) += (x^T w) B, A from
// the padded stage s_a (x^T by ldmatrix .trans, scaled by the step's weights w[0 .. kPos) and
// rounded to 16 bits once), B from the swizzled stage s_bz (load_tile_sw<kPos, 128>: two 64-column
// blocks of kPos rows x 128 bytes); kPos / 16 m64n128k16 committed and
// waited for (the caller's next barrier may then hand both stages to the next loads).
// kASwz: s_a is a kPos x 64 tile in the 128-byte swizzle (a TMA box) instead of padded rows.
template <int kPos = kWgPos, bool kASwz = false>
__device__ __forceinline__ void weighted_state_step_wg(float (&d)[64], const u16* s_a, const u16* s_bz,
                                                       const float* w) {
    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5), t2 = 2 * (lane & 3);
    constexpr int kRowBytes = kASwz ? 128 : kLd64 * 2;
    u32 a_base;
    if constexpr (kASwz) {  // lane_at's row and 8-channel chunk, the chunk XOR-ed with row % 8
        const int row = (lane & 7) + ((lane >> 4) << 3), chunk = (w16 >> 3) + ((lane >> 3) & 1);
        a_base = smem_u32(s_a) + row * 128 + ((chunk ^ (lane & 7)) << 4);
    } else {
        a_base = smem_u32(s_a + w16 + lane_at(lane, kLd64));
    }
    const u32 b_base = smem_u32(s_bz);
    constexpr int kK16 = kPos / 16;
    u32 a[kK16][4];
#pragma unroll
    for (int kk = 0; kk < kK16; ++kk) weighted_a(a[kk], a_base + kk * 16 * kRowBytes, w + 16 * kk + t2);
    const u64 db = wgmma_desc(b_base, kPos * 128, 1024);  // (the stage's two 64-column blocks)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK16; ++kk) wgmma_rs<128, DT, 1>(d, a[kk], desc_at(db, kk * 16 * 128), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(d);
}

// weighted_state_product (kHiLo false) with B from swizzled stages (s_bz + stage * kBzStage) and the
// product on wgmma. Steps 0 .. kStages - 2 issued by the caller (first_stages_n). One barrier a step:
// step k's group waited for (kStages - 2 younger in flight), made visible to the async proxy, the
// barrier; then step k + kStages - 1 issued into the stage step k - 1 read (every warp passed the
// barrier after waiting for its step k - 1 wgmma, so no one reads it any more), A loaded and scaled,
// kWgPos / 16 m64n128k16 committed and waited for.
template <int kStages, typename Load>
__device__ __forceinline__ void weighted_state_product_wg(float (&acc)[16][4], u16 (*s_a)[kWgPos * kLd64], u16* s_bz,
                                                          const float* s_w, int nsteps, Load load) {
    static_assert(kStages >= 2, "stages");
    float(&d)[64] = *reinterpret_cast<float(*)[64]>(&acc[0][0]);
    for (int k = 0; k < nsteps; ++k) {
        cp_async_wait<kStages - 2>();
        fence_proxy_async();
        __syncthreads();
        const int kn = k + kStages - 1;
        if (kn < nsteps) load(kn, kn % kStages);
        else cp_async_commit();  // (an empty group keeps the count of groups in flight uniform)
        weighted_state_step_wg(d, s_a[k % kStages], s_bz + (k % kStages) * kBzStage, s_w + kWgPos * k);
    }
}
#endif

// A state product's step: kPos positions a step in kStages stages (kStateStages of 32 on mma.sync,
// kWgStages of kWgPos on wgmma). The callers size their A stages (u16 [kStages][kPos * kLd64]) and
// their loads by it.
template <bool kWg>
struct StateStep {
    static constexpr int kPos = 32, kStages = kStateStages;
};
// The B side of a state product (B in ssd2_chunk_state, C in ssd_bwd_chunk_dstate16): the step's
// stages of kPos positions x 128 columns, swizzled for wgmma (kWg: sm_90a) or padded (kLd128) for
// mma.sync. kStage: u16 elements from one stage to the next.
template <bool kWg>
struct StateBTiles {
    static constexpr int kStage = StateStep<false>::kPos * kLd128;
    u16 t[kStateStages][kStage];
    __device__ __forceinline__ u16* base() { return &t[0][0]; }
};
#if FS_SSD_STATE_WGMMA
template <>
struct StateStep<true> {
    static constexpr int kPos = kWgPos, kStages = kWgStages;
};
template <>
struct StateBTiles<true> {
    static constexpr int kStage = kBzStage;
    BzStages<kWgStages> z;
    __device__ __forceinline__ u16* base() { return z.base(); }
};
#endif
// kWg where this build has the wgmma product (sm_90a), else the mma.sync one.
constexpr bool kStateWg = FS_SSD_STATE_WGMMA != 0;
// The state kernels' bounds: four CTAs an SM at 128 registers on wgmma (their 55-57 KB of shared
// memory allow four; unbounded, the 64-position step took 168-174 registers, three CTAs), as before
// elsewhere.
#if FS_SSD_STATE_WGMMA
#define FS_STATE_BOUNDS __launch_bounds__(kThreads, 4)
#else
#define FS_STATE_BOUNDS __launch_bounds__(kThreads)
#endif

// One stage of the B side (load_tile_bz or load_tile); the caller commits.
template <bool kWg>
__device__ __forceinline__ void load_state_b(u16* s, const u16* g, i64 stride, int valid_rows, int valid_cols,
                                             bool vec) {
#if FS_SSD_STATE_WGMMA
    if constexpr (kWg) {
        load_tile_bz(s, g, stride, valid_rows, valid_cols, vec);
        return;
    }
#endif
    load_tile<StateStep<false>::kPos, 128, kLd128>(s, g, stride, valid_rows, valid_cols, vec);
}

// acc += the weighted state product over s_b's stages: weighted_state_product_wg (kWg) or
// weighted_state_product<kHiLo> (kHiLo only on mma.sync).
template <bool kHiLo, bool kWg, typename Load>
__device__ __forceinline__ void state_product(float (&acc)[16][4], u16* s_a, u16* s_b, const float* s_w, int nsteps,
                                              Load load) {
    static_assert(!(kHiLo && kWg), "the hi / lo product runs on mma.sync");
#if FS_SSD_STATE_WGMMA
    if constexpr (kWg) {
        weighted_state_product_wg<kWgStages>(acc, (u16(*)[kWgPos * kLd64])s_a, s_b, s_w, nsteps, load);
        return;
    }
#endif
    weighted_state_product<kHiLo, kStateStages>(acc, (u16(*)[32 * kLd64])s_a, (u16(*)[32 * kLd128])s_b, s_w, nsteps,
                                                load);
}

// weighted_state_product's acc into out (fp32, row-major rows p0 + r x dstate columns, from n0):
// rows < hd and columns < ds of the tile (8-byte stores where dstate is even).
// A whole tile (64 rows, 128 columns, even dstate) takes no per-element checks: ncu of
// ssd2_chunk_state (H200, b8 L2048, 2026-11-29) put ~20% of its stall samples in this store's
// bounds tests and branches; unchecked, ssd2_chunk_state 116.4-116.5 -> 114.5-115.5 us and
// ssd_bwd_chunk_dstate16 122.8-123.0 -> 121.1-121.6 (predicted -5..10%: its samples were mostly
// the stores' own latency). kWhole false: every tile takes the checked stores (fewer registers).
// acc[16][4] (weighted_state_product's layout) from a (batch, head, headdim, dstate) tensor of any
// float dtype (ld_any; element strides s): rows p0 + r < p0 + hd, states n0 + n < n0 + ds of
// (b, h), zero elsewhere and everywhere when !present. ssd2_chunk_state_pass's initial states,
// ssd_bwd_dstate_pass's dfinal_states.
__device__ __forceinline__ void load_state_acc(float (&acc)[16][4], bool present, const void* src, const i64 (&s)[4],
                                               int dtype, i64 b, i64 h, int p0, int hd, int n0, int ds) {
#pragma unroll
    for (int jn = 0; jn < 16; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int pp = acc_row(e), nn = acc_col(jn, e);
            acc[jn][e] = present && pp < hd && nn < ds
                             ? ld_any(src, b * s[0] + h * s[1] + (p0 + pp) * s[2] + (n0 + nn) * s[3], dtype)
                             : 0.f;
        }
}

template <bool kWhole = true>
__device__ __forceinline__ void store_state_tile(float* out, const float (&acc)[16][4], int p0, int hd, int n0, int ds,
                                                 i64 dstate) {
    const bool pair = (dstate & 1) == 0;
    if (kWhole && pair && hd >= 64 && ds >= 128) {  // uniform
        float* const o0 = out + (i64)(p0 + acc_row(0)) * dstate + n0 + acc_col(0, 0);
        float* const o1 = o0 + 8 * dstate;
#pragma unroll
        for (int jn = 0; jn < 16; ++jn) {
            *(float2*)(o0 + 8 * jn) = make_float2(acc[jn][0], acc[jn][1]);
            *(float2*)(o1 + 8 * jn) = make_float2(acc[jn][2], acc[jn][3]);
        }
        return;
    }
#pragma unroll
    for (int jn = 0; jn < 16; ++jn)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int pp = acc_row(2 * hh), nn = acc_col(jn, 0);
            if (pp >= hd || nn >= ds) continue;
            float* o = out + (i64)(p0 + pp) * dstate + n0 + nn;
            if (pair) {
                *(float2*)o = make_float2(acc[jn][2 * hh], acc[jn][2 * hh + 1]);
            } else {
                o[0] = acc[jn][2 * hh];
                if (nn + 1 < ds) o[1] = acc[jn][2 * hh + 1];
            }
        }
}

// The accumulator's tile rounded to the build's 16-bit dtype into out (rows p0 + r x dstate columns
// from n0, as store_state_tile's fp32: ssd2_chunk_state_pass's H_c, ssd_bwd_dstate_pass's dS_c):
// whole tiles by 4-byte pairs unchecked, others element by element.
__device__ __forceinline__ void store_h16_tile(u16* out, const float (&acc)[16][4], int p0, int hd, int n0, int ds,
                                               i64 dstate) {
    const bool pair = (dstate & 1) == 0;
    if (pair && hd >= 64 && ds >= 128) {  // uniform
        u16* const o0 = out + (i64)(p0 + acc_row(0)) * dstate + n0 + acc_col(0, 0);
        u16* const o1 = o0 + 8 * dstate;
#pragma unroll
        for (int jn = 0; jn < 16; ++jn) {
            *(u32*)(o0 + 8 * jn) = pack2<DT>(acc[jn][0], acc[jn][1]);
            *(u32*)(o1 + 8 * jn) = pack2<DT>(acc[jn][2], acc[jn][3]);
        }
        return;
    }
#pragma unroll
    for (int jn = 0; jn < 16; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int pp = acc_row(e), nn = acc_col(jn, e);
            if (pp < hd && nn < ds) out[(i64)(p0 + pp) * dstate + n0 + nn] = f32_to_half<DT>(acc[jn][e]);
        }
}
