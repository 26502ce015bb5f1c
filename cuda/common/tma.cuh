// common/tma.cuh: Hopper (sm_90) asynchronous data movement through inline PTX: the tensor
// memory accelerator (TMA, cp.async.bulk.tensor) completing on shared-memory mbarriers, the
// mbarrier operations a producer / consumer ring needs, named barriers for subsets of a CTA, and
// setmaxnreg (sm_90a) to move registers from a producer warpgroup to consumer warpgroups.
//
// Tensor maps (the 128-byte CUtensorMap the host encodes with cuTensorMapEncodeTiled) reach the
// kernel by value inside a `const __grid_constant__` parameter; TMA reads them through their
// generic address, which must be 64-byte aligned (TensorMap below).
#pragma once

#include "common/types.cuh"

namespace fs {

// Opaque tensor map, as the driver encodes it (host mirror: TensorMap in src/ops/attention_tma.rs).
struct __align__(64) TensorMap {
    unsigned long long opaque[16];
};

// ---- mbarrier (a 64-bit shared-memory word) ----
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes barrier initialisation visible to the async proxy (TMA's complete_tx) before use.
__device__ __forceinline__ void mbar_init_fence() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` of TMA transactions the current phase must receive.
__device__ __forceinline__ void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Spins until the phase with parity `parity` has completed. A fresh barrier is in phase 0, so
// waiting for parity 1 returns at once ("the phase before" counts as complete): producers start
// waiting on their empty barriers with parity 1.
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
    u32 done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

// ---- TMA ----
__device__ __forceinline__ void tma_prefetch_map(const TensorMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<unsigned long long>(map)) : "memory");
}
// Loads one box of a rank-4 tensor map at coordinates (c0 innermost .. c3) into shared memory at
// `dst`; its bytes count against `bar`'s transaction count. Out-of-bounds elements are zeros.
__device__ __forceinline__ void tma_load_4d(u32 dst, const TensorMap* map, int c0, int c1, int c2, int c3, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
        "l"(reinterpret_cast<unsigned long long>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
        : "memory");
}

// `bytes` contiguous bytes global -> shared memory (no tensor map), counted against `bar`'s
// transactions; dst, src 16-byte aligned, bytes a multiple of 16.
__device__ __forceinline__ void bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}

// ---- bulk reductions (shared -> global, no tensor map) ----
// dst[i] += src[i] for `bytes` / 4 floats, element-wise atomic in L2, done by the TMA unit: the
// issuing thread goes on at once. dst, src 16-byte aligned, bytes a multiple of 16. The source
// must have been written before a fence.proxy.async + barrier (generic proxy writes, async
// proxy read) and stays busy until bulk_wait_read says the group read it.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N committed bulk groups of this thread still read their shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N committed bulk groups of this thread are incomplete (writes included).
template <int N>
__device__ __forceinline__ void bulk_wait() {
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- named barriers (id 0 is __syncthreads); `count` threads, a multiple of 32 ----
__device__ __forceinline__ void named_bar_sync(u32 id, u32 count) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(u32 id, u32 count) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// ---- register reallocation between warpgroups (sm_90a; each warpgroup one branch) ----
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace fs
