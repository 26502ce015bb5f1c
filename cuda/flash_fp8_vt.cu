// flash_fp8_vt.cu: the FP8 attention forward's pre-pass. An 8-bit wgmma takes both operands
// K-major, so O += P V needs V with the keys contiguous: this kernel writes Vt (batch, nheads_k,
// head_dim, seqlen_k_pad) e4m3 from V (batch, seqlen_k, nheads_k, head_dim, any strides, rows
// 16-byte aligned), keys past seqlen_k zero. Inside every 32-key block the keys are stored in the
// order of P's registers (cuda/flash_fwd_sm90_tma.cu, pack_p): column 16 h + 4 t + e holds key
// 16 h + 2 t + (e & 1) + 8 (e >> 1), so P packs into the 8-bit A fragment without byte shuffles.
//
// One CTA (256 threads) per 128 keys of one (batch, kv head): the 128 key rows (head_dim bytes
// each) come in with 16-byte loads into shared memory (128 rows x 128 bytes, chunk c of row key at
// key * 128 + (c ^ (key >> 4 & 7)) * 16: the store phase's eight lanes of a row read keys 16 apart,
// which this swizzle spreads over eight banks groups), then every thread writes 16-byte chunks of
// Vt rows (8 lanes a row: 128 contiguous bytes) gathered byte by byte.

#include "common/types.cuh"

struct Fp8VtParams {
    const unsigned char* v;
    unsigned char* vt;
    long long v_batch_stride, v_row_stride, v_head_stride;  // bytes (= elements)
    int seqlen_k, head_dim, seqlen_k_pad, nheads_k;
};

namespace fvt {
using namespace fs;
static constexpr int kKeys = 128;   // keys a CTA
static constexpr int kThreads = 256;
static constexpr int kRow = 128;    // bytes of a shared-memory key row (head_dim <= 128)

// The key whose value sits at column `col` (0 .. 127) of a 128-key Vt block.
__device__ __forceinline__ int key_at(int col) {
    const int r = col & 15;
    return (col & ~15) + 2 * (r >> 2) + (r & 1) + 8 * ((r >> 1) & 1);
}
}  // namespace fvt

// grid = (seqlen_k_pad / 128, nheads_k, batch), block = 256, static shared memory 16 KB.
extern "C" __global__ void __launch_bounds__(fvt::kThreads) flash_fp8_vt_kernel(const Fp8VtParams p) {
    using namespace fvt;
    __shared__ __align__(16) unsigned char tile[kKeys * kRow];
    const int key0 = blockIdx.x * kKeys;
    const int head = blockIdx.y, batch = blockIdx.z;
    const int chunks = p.head_dim >> 4;  // 16-byte chunks of a V row
    const unsigned char* src = p.v + batch * p.v_batch_stride + head * p.v_head_stride;
    for (int i = threadIdx.x; i < kKeys * chunks; i += kThreads) {
        const int key = i / chunks, c = i - key * chunks;
        uint4 val = make_uint4(0u, 0u, 0u, 0u);
        if (key0 + key < p.seqlen_k)
            val = *reinterpret_cast<const uint4*>(src + (long long)(key0 + key) * p.v_row_stride + c * 16);
        *reinterpret_cast<uint4*>(tile + key * kRow + ((c ^ ((key >> 4) & 7)) << 4)) = val;
    }
    __syncthreads();
    unsigned char* dst = p.vt + ((long long)batch * p.nheads_k + head) * p.head_dim * p.seqlen_k_pad + key0;
    for (int i = threadIdx.x; i < p.head_dim * 8; i += kThreads) {
        const int d = i >> 3, ch = i & 7;  // Vt row d, columns 16 ch .. 16 ch + 15
        const int c = d >> 4;              // the shared-memory chunk holding column d of a key row
        u32 w[4];
#pragma unroll
        for (int q = 0; q < 4; ++q) {
            u32 word = 0;
#pragma unroll
            for (int b = 0; b < 4; ++b) {
                const int key = key_at(16 * ch + 4 * q + b);  // (key >> 4 == ch)
                const u32 byte = tile[key * kRow + ((c ^ (ch & 7)) << 4) + (d & 15)];
                word |= byte << (8 * b);
            }
            w[q] = word;
        }
        *reinterpret_cast<uint4*>(dst + (long long)d * p.seqlen_k_pad + 16 * ch) = make_uint4(w[0], w[1], w[2], w[3]);
    }
}
