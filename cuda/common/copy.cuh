// common/copy.cuh: data movement. Shared-memory addresses and cp.async (global -> shared without
// registers, sm_80+); vector loads / stores of a Raw row slice through the read-only path; scalar
// loads that widen fp16 / bf16 to f32; small shared-memory vector reads; fire-and-forget global adds.
#pragma once

#include "common/types.cuh"
#include "common/convert.cuh"

namespace fs {

// ---- shared memory and cp.async ------------------------------------------------------------------
// The 32-bit shared-window address of a generic pointer into shared memory (cvta.to.shared), the
// operand form ldmatrix and cp.async take: one register instead of a 64-bit pointer.
__device__ __forceinline__ u32 smem_u32(const void* ptr) {
    u32 r;
    asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(ptr));
    return r;
}

// 16-byte global -> shared copy (LDGSTS, L1 bypassed: .cg); valid == false zero-fills the
// destination without reading src (src-size 0), which is how tile edges are padded.
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
// B-byte global -> shared copy through L1 (.ca; B = 4, 8 or 16, src and dst B-aligned): reads the
// first src_bytes of src and zero-fills the rest of the destination (src_bytes 0: reads nothing).
template <int B>
__device__ __forceinline__ void cp_async_ca(u32 dst, const void* src, int src_bytes) {
    static_assert(B == 4 || B == 8 || B == 16, "cp.async.ca copies 4, 8 or 16 bytes");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(B),
                 "r"(src_bytes)
                 : "memory");
}
// Closes the group of cp.async issued so far by this thread (LDGDEPBAR).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's groups are in flight (DEPBAR); a __syncthreads after it
// makes every thread's copies visible. "memory": no shared read is moved above it.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- Raw row slices: one vector access where the alignment allows --------------------------------
// Load N elements of ES bytes starting at byte address p into r through the read-only path
// (ld.global.nc: LDG.E.CONSTANT). A full slice (valid >= N) uses the widest vector (16 / 8 / 4 bytes)
// that its size and `align` (bytes every slice start is aligned to) allow; a partial one loads element
// by element and zero-fills, never reading past p + valid elements.
template <int N, int ES>
__device__ __forceinline__ void load_raw(Raw<N, ES>& r, const char* p, int valid, int align) {
    constexpr int kBytes = N * ES;
    if (valid >= N && kBytes % 16 == 0 && align >= 16) {
#pragma unroll
        for (int i = 0; i < kBytes / 16; ++i)
            asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];"
                         : "=r"(r.w[4 * i]), "=r"(r.w[4 * i + 1]), "=r"(r.w[4 * i + 2]), "=r"(r.w[4 * i + 3])
                         : "l"(p + 16 * i));
    } else if (valid >= N && kBytes % 8 == 0 && align >= 8) {
#pragma unroll
        for (int i = 0; i < kBytes / 8; ++i)
            asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];" : "=r"(r.w[2 * i]), "=r"(r.w[2 * i + 1]) : "l"(p + 8 * i));
    } else if (valid >= N && kBytes % 4 == 0 && align >= 4) {
#pragma unroll
        for (int i = 0; i < kBytes / 4; ++i) asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(r.w[i]) : "l"(p + 4 * i));
    } else if constexpr (ES == 4) {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            u32 v = 0;
            if (i < valid) asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(p + 4 * i));
            r.w[i] = v;
        }
    } else {
#pragma unroll
        for (int i = 0; i < (N + 1) / 2; ++i) r.w[i] = 0;
#pragma unroll
        for (int i = 0; i < N; ++i) {
            u16 h = 0;
            if (i < valid) asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(h) : "l"(p + 2 * i));
            r.w[i >> 1] |= (u32)h << (16 * (i & 1));
        }
    }
}
// Store the first min(valid, N) elements of r at byte address p, with the same vector choice.
template <int N, int ES>
__device__ __forceinline__ void store_raw(char* p, const Raw<N, ES>& r, int valid, int align) {
    constexpr int kBytes = N * ES;
    if (valid >= N && kBytes % 16 == 0 && align >= 16) {
#pragma unroll
        for (int i = 0; i < kBytes / 16; ++i)
            asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p + 16 * i), "r"(r.w[4 * i]),
                         "r"(r.w[4 * i + 1]), "r"(r.w[4 * i + 2]), "r"(r.w[4 * i + 3]) : "memory");
    } else if (valid >= N && kBytes % 8 == 0 && align >= 8) {
#pragma unroll
        for (int i = 0; i < kBytes / 8; ++i)
            asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p + 8 * i), "r"(r.w[2 * i]), "r"(r.w[2 * i + 1]) : "memory");
    } else if (valid >= N && kBytes % 4 == 0 && align >= 4) {
#pragma unroll
        for (int i = 0; i < kBytes / 4; ++i) asm volatile("st.global.u32 [%0], %1;" ::"l"(p + 4 * i), "r"(r.w[i]) : "memory");
    } else if constexpr (ES == 4) {
#pragma unroll
        for (int i = 0; i < N; ++i)
            if (i < valid) asm volatile("st.global.u32 [%0], %1;" ::"l"(p + 4 * i), "r"(r.w[i]) : "memory");
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) {
            const u16 h = (u16)(r.w[i >> 1] >> (16 * (i & 1)));
            if (i < valid) asm volatile("st.global.u16 [%0], %1;" ::"l"(p + 2 * i), "h"(h) : "memory");
        }
    }
}

// A Raw slice of 4, 8 or 16 bytes from / to shared memory at a 32-bit shared address (one access).
template <int N, int ES>
__device__ __forceinline__ void lds_raw(Raw<N, ES>& r, u32 addr) {
    constexpr int kWords = (N * ES + 3) / 4;
    static_assert(kWords == 1 || kWords == 2 || kWords == 4, "lds_raw: 4, 8 or 16 bytes");
    if constexpr (kWords == 4)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(r.w[0]), "=r"(r.w[1]), "=r"(r.w[2]), "=r"(r.w[3])
                     : "r"(addr)
                     : "memory");
    else if constexpr (kWords == 2)
        asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(r.w[0]), "=r"(r.w[1]) : "r"(addr) : "memory");
    else
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(r.w[0]) : "r"(addr) : "memory");
}
template <int N, int ES>
__device__ __forceinline__ void sts_raw(u32 addr, const Raw<N, ES>& r) {
    constexpr int kWords = (N * ES + 3) / 4;
    static_assert(kWords == 1 || kWords == 2 || kWords == 4, "sts_raw: 4, 8 or 16 bytes");
    if constexpr (kWords == 4)
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(r.w[0]), "r"(r.w[1]), "r"(r.w[2]),
                     "r"(r.w[3])
                     : "memory");
    else if constexpr (kWords == 2)
        asm volatile("st.shared.v2.u32 [%0], {%1, %2};" ::"r"(addr), "r"(r.w[0]), "r"(r.w[1]) : "memory");
    else
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(r.w[0]) : "memory");
}

// ---- scalars and small vectors ---------------------------------------------------------------------
// Element idx of a DT array as f32, through the read-only cache (__ldg: LDG.E.CONSTANT).
template <int DT>
__device__ __forceinline__ float ldg_f32(const void* base, i64 idx) {
    if constexpr (DT == 2) {
        return __ldg((const float*)base + idx);
    } else {
        return half_to_f32<DT>(__ldg((const u16*)base + idx));
    }
}
// 4 consecutive DT elements at base + idx (16-byte / 8-byte aligned: one LDG.128 / LDG.64) as f32.
template <int DT>
__device__ __forceinline__ float4 ldg4_f32(const void* base, i64 idx) {
    if constexpr (DT == 2) {
        return __ldg((const float4*)((const float*)base + idx));
    } else {
        const uint2 w = __ldg((const uint2*)((const u16*)base + idx));
        const float2 lo = unpack2<DT>(w.x), hi = unpack2<DT>(w.y);
        return make_float4(lo.x, lo.y, hi.x, hi.y);
    }
}
// Element idx of a DT array, raw bits (fp32: the word; 16-bit: zero-extended), through __ldg.
template <int DT>
__device__ __forceinline__ u32 ldg_raw(const void* base, i64 idx) {
    if constexpr (DT == 2) {
        return __float_as_uint(__ldg((const float*)base + idx));
    } else {
        return (u32)__ldg((const u16*)base + idx);
    }
}
// The same from a byte address, as an explicit ld.global.nc (asm volatile: never dropped, merged or
// reordered with the other volatile loads of a prefetch).
template <int DT>
__device__ __forceinline__ u32 ld_nc_raw(const char* q) {
    u32 v;
    if constexpr (DT == 2) {
        asm volatile("ld.global.nc.u32 %0, [%1];" : "=r"(v) : "l"(q));
    } else {
        u16 h;
        asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(h) : "l"(q));
        v = h;
    }
    return v;
}
// Store v as a DT element at base + idx (16-bit: rounded to nearest even).
template <int DT>
__device__ __forceinline__ void st_f32(void* base, i64 idx, float v) {
    if constexpr (DT == 2) {
        ((float*)base)[idx] = v;
    } else {
        ((u16*)base)[idx] = f32_to_half<DT>(v);
    }
}
// N consecutive floats of shared memory at q in as few accesses as N allows (LDS.128 / LDS.64).
template <int N>
__device__ __forceinline__ void lds_vec(float (&v)[N], const float* q) {
    if constexpr (N % 4 == 0) {
#pragma unroll
        for (int i = 0; i < N / 4; ++i) {
            const float4 w = *(const float4*)(q + 4 * i);
            v[4 * i] = w.x; v[4 * i + 1] = w.y; v[4 * i + 2] = w.z; v[4 * i + 3] = w.w;
        }
    } else if constexpr (N == 2) {
        const float2 w = *(const float2*)q;
        v[0] = w.x; v[1] = w.y;
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) v[i] = q[i];
    }
}

// ---- global reductions -------------------------------------------------------------------------------
// *p += v without a return value (RED.E.ADD.F32: the SM does not wait for the old value).
__device__ __forceinline__ void red_add(float* p, float v) {
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
// p[0] += x, p[1] += y in one vector reduction (sm_90+: red.global.add.v2.f32; p 8-byte aligned).
__device__ __forceinline__ void red_add2(float* p, float x, float y) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(x), "f"(y) : "memory");
}
// p[0..3] += x, y, z, w in one vector reduction (sm_90+: red.global.add.v4.f32; p 16-byte aligned).
__device__ __forceinline__ void red_add4(float* p, float x, float y, float z, float w) {
    asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(x), "f"(y), "f"(z), "f"(w)
                 : "memory");
}

}  // namespace fs
