// Mamba-2 SSD chunked scan, forward, second path (the fp16 / bf16 default; fp32 data
// stays on cuda/ssd.cu). Same math and decomposition as cuda/ssd.cu (read its header first); what
// changes is where each product is formed and how operands reach the tensor cores:
//
//   p. ssd2_chunk_prep   chunk_prologue (dt', cum, seg) once per (batch, head, chunk) into scratch records
//                        (the host's stream-ordered scratch) that 1 and 3 load by cp.async
//   0. ssd2_chunk_cb     CB[b, c, g, l, s] = C_l . B_s, once per (batch, chunk, GROUP) instead of once
//                        per head and row block: fp32 workspace (batch, nchunks, ngroups, kQ, kQ), only
//                        the 64 x 64 blocks with s-block <= l-block are written (the others are never
//                        read). K = dstate, 32 per step, double-buffered.
//   1. ssd2_chunk_state  S_c (64 channels p x 128 states n per CTA, so x is read once per chunk for
//                        dstate <= 128) = sum_s x_s^T (w_s B_s), w_s = [seg_s == seg_end]
//                        exp(cum_end - cum_s) dt'_s computed once per chunk into shared memory and
//                        applied to the A fragments of x^T (8 multiplies per k16 step per thread).
//   1+2. ssd2_chunk_state_pass (sm_90a, no seq_idx, x / B rows TMA can address: the default there)
//                        1 and 2 in one kernel, one CTA per (batch, head, tile) carrying H through
//                        the chunks in its wgmma accumulator (its own comment below)
//   2. ssd2_state_passing cuda/ssd.cu's recurrence (fp32 in registers), one CTA per (batch, head), 4
//                        consecutive elements per thread, the next three S in flight (a cp.async
//                        ring in shared memory, kPassDepth); H_c written in x's
//                        dtype over chunk c's slot (in place, race-free: see the kernel), so the scan
//                        reads 2 bytes per state element instead of 4.
//   3. ssd2_chunk_scan   y (64 positions l x 64 channels p per CTA) = [seg_l == 0] exp(cum_l) C_l . H_c
//                        + sum over 64-wide source blocks s <= l of W x, W = CB * exp(cum_l - cum_s)
//                        dt'_s * [s <= l, seg_s == seg_l] built in registers from the CB workspace
//                        block (staged in shared memory by cp.async one block ahead, with x's tile)
//                        in the accumulator layout, which is the A layout of the next mma (no
//                        shared-memory round trip for W); below the diagonal (no seq_idx) the decay
//                        factored at the tile's first row m0, W = exp(cum_l - cum_m0) (CB f_s),
//                        f_s = exp(cum_m0 - cum_s) dt'_s once per CTA (accumulate_cbf_x); z
//                        prefetched by cp.async during W x; D x reads the diagonal block's x tile
//                        (already in shared memory), then silu(z) and the store.
//   3'. ssd2_chunk_scan_one a call that is one 64-row block (seqlen <= 64) without initial states:
//                        0 and 3 in one kernel (its C B^T block formed from C / B tiles in shared
//                        memory, no CB workspace traffic, one launch). Real-time b32 L60 8 x 64,
//                        state 64 on the H100 (2026-11-24): 10.0 us against 15.7 for cb + scan.
//
// Operands: 16-bit tiles in the input dtype, global -> shared by 16-byte cp.async (LDGSTS, zero-fill
// past the tile's valid rows / columns) when the tensor's rows are 16-byte aligned (host flags vec_*;
// otherwise element loads), rows padded by 8 elements (row pitch = 16 bytes mod 128: ldmatrix rows hit
// distinct banks), fragments by ldmatrix (.trans where the operand is stored K-major: x^T and B in 1,
// x in W x). The carried states H enter the scan in the input dtype (rounded by the state passing;
// the default path rounds them as its fragments are built: the same values).
//
// Work split (128 threads = 4 warps; warp w owns rows 16w .. 16w + 15 of the CTA's 64-row tile):
//   ssd2_chunk_cb    grid (nchunks * nb (nb + 1) / 2, ngroups, batch), nb = kQ / 64: one lower block
//                    (l-block i, s-block j <= i); warp tile 16 l x 64 s, acc[8][4]
//   ssd2_chunk_state grid (nchunks, ceil(headdim/64) * ceil(dstate/128), batch * nheads); warp tile
//                    16 p x 128 n, acc[16][4]; K = the chunk's positions, 32 per step, 2 stages
//                    (on sm_90a, where the product runs on wgmma, 64 per step in 2 stages: the
//                    warpgroup's m64n128k16 with x^T w from registers and B from 128B-swizzled
//                    stages, common/ssd_tiles.cuh weighted_state_product_wg, StateStep; mma.sync
//                    elsewhere)
//   ssd2_state_passing grid (batch * nheads), 256 threads x 4 elements per 1024-element block
//   ssd2_chunk_prep  grid (nchunks, ceil(nheads / 8), batch), 4 warps: dt of 8 heads read together,
//                    each warp scans two heads' chunks and stores their records
//   ssd2_chunk_scan  grid (nchunks * kQ / 64, ceil(headdim/64), batch * nheads); warp tile 16 l x 64 p,
//                    acc[8][4]; C.H^T 64 states per step (two stages), then the (i + 1) source blocks
//                    of l-block i (those below the diagonal unmasked when there is no seq_idx). On
//                    sm_90a both products run on wgmma for the warpgroup (the x, C and H tiles 64 x 64
//                    in the 128-byte swizzle, the region aligned by hand): C.H^T as four m64n64k16 a
//                    step with C and H K-major from shared memory, W x as four m64n64k16 a block with
//                    W (or CB f) from registers and x as the MN-major B; each waited for at once
//                    (deferred to the next block, ptxas serialised every wgmma of the kernel)
//
// NVRTC 13.2 (2026-11-23, CPU only): sm_90a / sm_80 registers cb 96-123, state 132 / 134, pass 48,
// scan <= 128 (__launch_bounds__(128, 4): sm_80 took 166 without it); no stack or local bytes; static
// shared memory 21, 32, 0, 40 KB: 3 state CTAs and 4 scan CTAs per SM (capping state at 128 registers
// spills 16 bytes). Since 2026-11-27 the scan's two-stage C.H^T takes 48 KB (still 4 CTAs per SM). SASS: LDGSTS for every tile, LDSM (.MT88 for x^T, B and x in W x),
// HMMA.16816.F32, LDG.128 / 8-byte stores in the state passing. Since 2026-11-28 ssd2_chunk_state runs
// three cp.async stages on sm_90 (NVRTC 13.0: 128 registers, 41-45 KB static, 4 CTAs per SM; sm_80
// keeps two: 162 registers with three): b8 L2048 on the H200 147.1 -> 143.0 us, predicted ~120 from
// twice the bytes in flight, so those were not what held it.
//
// PREDICTION for b8 L2048 nheads 80 headdim 64 dstate 128 ngroups 1 chunk 256 bf16 on H100, written
// before the first run (the first path takes 7809 us there, Triton 741 us). MEASURED 2026-11-23 (H100,
// torch.profiler, tools/ssd_profile.py): cb 11 us, chunk_state 239, state_passing 101, chunk_scan 902
// = 1253 us; ncu: the scan at 45% memory / 39% SM throughput (latency-bound), chunk_state at 18.75%
// occupancy. The scan is where the prediction failed (3.9x):
//   ssd2_chunk_cb      ~10 us  (0.7 GFLOP, 8 MB in / 17 MB out)
//   ssd2_chunk_state   ~110 us (x 168 MB + B in, states 168 MB out fp32; 21 GFLOP)
//   ssd2_state_passing ~90 us  (states 168 MB read, 84 MB written in 16 bits)
//   ssd2_chunk_scan    ~230 us (H 84 MB, x 168 MB (+ L2 re-reads), z 168 MB, out 168 MB; CB 0.8 GB
//                       from L2; 48 GFLOP of mma.sync); ~180 us without z (benches/ssd.py passes none)
//   total              ~0.4-0.45 ms (~1.7x faster than Triton). The traffic floor of this 4-kernel design
//                      is ~0.35 ms; the 2x target likely needs the state passing fused into the chunk
//                      states (the fp32 states written and read once less).
//
// MEASURED 2026-11-27 (H100, same lease, tools-style profile of b8 L2048 as above): after ncu showed
// the scan issuing 329 M warp instructions (integer index arithmetic of the tile loads and the
// epilogue, the 12-instruction masked W element, a 20% barrier stall behind the one-warp prologue):
// tile loads with per-thread bases, the epilogue's D and row pointers hoisted, W = CB 2^(cl2 - lw)
// unmasked below the diagonal, the prologue once per chunk (prep) and a two-stage C.H^T:
// chunk_scan 908 -> 515 us (203 M instructions), chunk_state 241 -> 167 us, prep 24.5 us (19.6 on one-warp CTAs, below); forward
// 1248 -> 823 us of kernels, against Triton's 740 (its chunk_scan 464, chunk_state 162). Tried and
// dropped (same lease A/B): loading the next CB block into registers during this block's W x
// (166 registers, 3 CTAs per SM) made the scan slower, 516 -> 546 us (chunk 128: 154 -> 172).
// MEASURED 2026-11-28 (H100, same lease): the CB blocks staged through shared memory by cp.async one
// block ahead (over the H_c stages, dead after C.H^T; registers unchanged): chunk_scan 513 -> 493 us
// (predicted ~430). Tried and dropped: two heads of a group per CTA (C tile and CB block read once
// for both; 168 registers, 3 CTAs per SM), 513 -> 567 us: the scan is latency-bound, not held by
// the L2 traffic it saved (benches/results/2026-11-28-h100-ssd-small-kernels/). ncu at 493 us: 25%
// occupancy (registers and shared memory both cap 4 CTAs), 0.52 instructions issued a cycle per
// scheduler, 24% excess global sectors (the epilogue's 4-byte stores) and 24% excess shared
// wavefronts. Staging y in shared memory for 16-byte stores (a barrier before them) made the scan
// slower, 494 -> 534 us: dropped.
// MEASURED 2026-11-28 (H200, same-lease A/B, benches/results/2026-11-28-h200-ssd-loads-first-update/):
// the epilogue's 16 D reads issued together (lane_d; each had waited in its own branch) moved the
// scan 498 -> 461 us, more than anything since the CB staging; ssd2_chunk_prep reading dt for 8
// heads a CTA 17.1 -> 10.3 us. Forward 737 -> 692 us of kernels, Triton 691.8 in the same process.
//
// MEASURED 2026-11-29 (H200, same-lease A/B, benches/results/2026-11-29-h200-ssd-scan-factored/):
// the blocks below the diagonal with the decay factored at the tile's first row (one FMUL an
// element where W took FADD, MUFU and FMUL; 107 instead of 170 instructions a warp and block)
// and the CB block's cp.async from one pointer: the scan 462-465 -> 416-418 us (predicted ~400),
// forward 690 -> 644 us of kernels against Triton's 694 in the same lease. Tried and dropped (same
// leases): CB columns loaded straight into registers as each pair is consumed, no staging and one
// barrier a block (-> 460 us); the diagonal block's warps skipping the k16 steps past the diagonal
// and masking only the one on it (-> 424 us: the CTA waits for its last warp, which skips nothing).
// The same factoring in ssd_bwd_chunk_dx16 moved it 546 -> 545 us (dropped: its CB loads, not its
// MUFU, hold it).
//
// MEASURED 2026-11-29, stop 30 (H200, same-lease A/B, benches/results/2026-11-29-h200-ssd-epilogues/):
// ncu put ~25% of the scan's stall samples in the epilogue: 16 D loads with 64-bit index products
// (three dtype copies of them in the code), then per element a column check, an x read from shared
// memory waited on alone, has_z / vec_out tests. D now comes from shared memory (one load a thread,
// channel_d), every shared read of the epilogue is issued first, and a whole tile takes no checks
// (store_y_rows<kFull>): the scan 416 -> 360-361 us (predicted ~360-370; 195 -> 166 M warp
// instructions), forward 643-646 -> 588-589 us of kernels, Triton 688 in the same process.
//
// MEASURED 2026-11-29, stop 31 (H200, same-lease A/B, benches/results/2026-11-29-h200-ssd-wgmma/):
// ncu of ssd2_chunk_state had L1 at 77% and L2 at 76% of peak, each warp reading the whole 32 x 128
// B tile of a step from shared memory by ldmatrix (32 KB a step for the CTA). On wgmma (B read once
// for the warpgroup from swizzled stages, two m64n128k16 a step, one barrier a step) it runs
// 143 -> 116.4-116.8 us (predicted ~115), forward 591 -> 563-565 us of kernels (Triton 695 in the
// same process); ncu then: L2 76%, L1 64%, issue 58%. Capping it at 96 registers for 5 CTAs an SM
// (16 bytes of stack) measured 119.3: dropped. The same stop moved ssd2_chunk_scan's C.H^T and W x
// onto wgmma (its LDSM / HMMA streams replaced by eight HGMMA a block pair): 359-360 -> 333.4-334.4
// us (predicted ~300: the W building, the CB reads and the epilogue stay), forward 561-563 ->
// 536-537 us of kernels.
//
// MEASURED 2026-11-29, stop 32 (H200, same-lease A/B, benches/results/2026-11-29-h200-ssd-scan-prologue/):
// ncu of the wgmma scan: issue slots 54% busy, 2033 warp instructions a warp, 16% of the stall
// samples in the prologue (the i64 (batch, head, group) divisions with their runtime 64-bit check,
// load_prep's strided loop), the wgmma descriptors re-formed (masked fields, 64-bit adds) for
// every k step, a row predicate and select on every cp.async of whole tiles. With those in 32-bit /
// stepped by desc_at / unpredicated: the scan 333.8-334.7 -> 320.3-320.6 us (predicted -5..8%),
// forward 538-539 -> 524.5-525.1 us of kernels (Triton 695.2 in the same process). The loop top of
// W x (waiting for block j's CB and x, one block ahead) then held 18% of the samples, the exit's
// store drain 4%. Tried and dropped (same leases): ssd2_chunk_state with two heads of a group a CTA
// (two warpgroups sharing each B stage, B's L2 traffic halved), 118.2 -> 118.0 us; the diagonal
// block by warp (below each warp's 16 x 16 diagonal the decay factored at its first row, 2 FMUL an
// element), 320 -> 322.7 us (the CTA waits for its last warp) and, as first written, a read of
// s_cum after the D values overwrite it (non-finite outputs under steep decay: the GPU tests caught
// it); the state product on 64 positions a step (StateStep) moved ssd2_chunk_state only 117.3 ->
// 116.5 (it landed for ssd_bwd_chunk_dstate16: 129.9 -> 122.9).
//
// TRIED 2026-12-01, stop 33 (H200, same-wheel A/B, benches/results/2026-12-01-h200-ssd-state-passing/):
// the state passing inside ssd2_chunk_state (chunk c's CTA taking R_{c-1} from slot c behind a
// flag and handing on R_c, no ssd2_state_passing launch), predicted forward 520 -> ~470 us. It
// never beat the pair: 187 us against 114 + 69 at best (R_{c-1} read back a wave later, from
// DRAM: the same ~590 MB moved, plus a chained epilogue), 210 with the chunks half a wave apart
// (the successors waited). Dropped; the patch is in the record. The bytes only go if H_c stays on
// chip (a cluster of a head's chunks handing it on through distributed shared memory).
// MEASURED the same stop (same record, call 4): ssd2_state_passing's next S values three steps
// ahead by cp.async into a per-thread shared ring (kPassDepth; one float4 in registers before, DRAM
// 71%): 68.6-68.9 -> 65.4-65.8 us at b8 L2048 (predicted ~58), 268.5 -> 258.8 at L8192.
//
// Compile-time constants (host prelude): FS_DTYPE (0 fp16, 1 bf16), FS_CHUNK (64, 128 or 256).

#include "common/ssd.cuh"
#include "common/ssd_tiles.cuh"
#if FS_SSD_STATE_WGMMA
#include "common/tma.cuh"
#endif

static_assert(DT != 2, "ssd_fwd2 covers fp16 / bf16; fp32 data uses cuda/ssd.cu");

// The default path's parameter block plus this path's workspaces and alignment flags (sizeof 592).
struct Ssd2Params {
    SsdParams p;
    float* cb;    // (batch, nchunks, ngroups, kQ, kQ) fp32 workspace: C_l . B_s
    float* prep;  // (batch * nheads, nchunks, 3, kQ) 4-byte words: ssd2_chunk_prep's records
    // 1: every row of the tensor starts 16-byte aligned and its last dimension is a multiple of 8
    // (cp.async / vector path); 0: element loads and stores
    int vec_x, vec_bc, vec_z, vec_out;
    int vec_states;  // 1: the states workspace starts 16-byte aligned
    // 1: ssd2_state_passing leaves H_c in fp32 in each chunk's slot instead of 16-bit values (the
    // backward's recompute, whose kernels read fp32 states); 0 on forward calls
    int states_f32;
    // non-null (a forward whose backward keeps H_c): ssd2_state_passing writes the 16-bit H_c here,
    // (batch, nchunks, nheads, headdim, dstate) in x's dtype, the layout of the backward's
    // states16, and the scan reads it from here; null: packed in place over each fp32 slot
    u16* h16;
    // return_varlen_states (batch 1; null otherwise): cu_seqlens (nseq + 1,) int32 on the device,
    // and the states after each sequence, (nseq, nheads, headdim, dstate) fp32 at strides varlen_s,
    // written by ssd2_varlen_states (the state passing then leaves fp32 H_c in place, states_f32,
    // and the 16-bit H_c in h16)
    const int* cu_seqlens;
    float* varlen;
    i64 varlen_s[4];
    int nseq;
    // 1: ssd2_chunk_cb writes C B^T in x's dtype (rows of kQ 16-bit values) for
    // ssd2_chunk_scan_ws; 0: fp32 (every other reader)
    int cb16;
};
static_assert(sizeof(Ssd2Params) == 592, "Ssd2Params layout changed: update the host mirror");

// Where the 16-bit H_c of (batch b, chunk c, head h) starts: q.h16's compact rows, or the start of
// the chunk's fp32 slot in p.states (packed in place by ssd2_state_passing).
__device__ __forceinline__ u16* h16_slot(const Ssd2Params& q, i64 b, i64 c, i64 h) {
    const SsdParams& p = q.p;
    const i64 slot = ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate;
    return q.h16 ? q.h16 + slot : (u16*)(p.states + slot);
}

// W[l, s] = CB[l, s] exp(cum_l - cum_s) dt'_s [s <= l, seg_s == seg_l, l < len], formed as
// CB 2^(cl2_l - lw_s) with cl2_l = cum_l log2 e and lw_s = cum_s log2 e - log2 dt'_s (+inf where
// dt'_s = 0, so W = 0): one FADD, MUFU and FMUL an element (ssd2_chunk_scan; ssd2_chunk_state's w_s alike).
// to_log2_weights turns chunk_prologue's s_dt into lw in place, each thread its own positions
// s = threadIdx.x + kThreads k (a later barrier publishes it to the others); ssd2_chunk_prep
// writes the same formula into its records.
__device__ __forceinline__ float log2_weight(float dt, float cum) { return dt > 0.f ? cum * kLog2e - lg2(dt) : pos_inf(); }
__device__ __forceinline__ void to_log2_weights(float* s_dt, const float* s_cum) {
    for (int s = threadIdx.x; s < kQ; s += kThreads) s_dt[s] = log2_weight(s_dt[s], s_cum[s]);
}

// ---- prep: the chunk prologue once per (batch, head, chunk) ---------------------------------------
// chunk_prologue's dt', cum and seg of one chunk, for ssd2_chunk_state and ssd2_chunk_scan, which
// ran it themselves before (one warp working while three waited at the barrier: 20% of the scan's
// stall samples on the H100, 2026-11-27, and four times per chunk at chunk 256). Record of
// (bh, c) at prep + (bh * nchunks + c) * 3 kQ: [0, kQ) lw = cum log2 e - log2 dt' (+inf where
// dt' = 0: a weight 2^(x - lw) of 0), [kQ, 2 kQ) cum, [2 kQ, 3 kQ) seg (int bits; stored only with
// seq_idx: without it every seg is 0, which load_prep zero-fills).
// Grid (nchunks, ceil(nheads / kPrepHeads), batch), kPrepThreads: heads_chunk_prologue
// (common/ssd.cuh) reads dt for kPrepHeads consecutive heads at once and each warp scans two of
// them; each record is staged in the warp's own s_rec row for 16-byte coalesced stores.
// History (b8 L2048 80 heads chunk 256): one warp a CTA, each lane loading its own positions of one
// head, took 19.6 us on the H100 and 17.2 on the H200 (2026-11-28): a warp's dt loads touched 256
// sectors for 512 useful bytes (dt rows are nheads elements apart), 16x the bytes through L2, and
// 5120 one-warp CTAs were 1.2 waves at 32 warps an SM; a 128-thread CTA with warp 0 scanning one
// head and the others idle took 24.5, a warp storing its lanes' 8 positions uncoalesced 40.4.
extern "C" __global__ void __launch_bounds__(kPrepThreads, 8) ssd2_chunk_prep(const Ssd2Params q) {
    constexpr int kPer = kQ / 32;
    __shared__ __align__(16) float s_raw[kPrepHeads * kLdRaw];
    __shared__ __align__(16) float s_rec[kPrepWarps][3 * kQ];
    const SsdParams& p = q.p;
    const i64 b = blockIdx.z, c = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    heads_chunk_prologue(p, b, (i64)blockIdx.y * kPrepHeads, c * kQ, s_raw,
                         [&](i64 h, const float(&d)[kPer], const float(&cs)[kPer], const int(&sg)[kPer]) {
                             float lw[kPer];
#pragma unroll
                             for (int i = 0; i < kPer; ++i) lw[i] = log2_weight(d[i], cs[i]);
                             warp_stage_record(s_rec[warp], lane, lw, cs, sg);
                             const i64 bh = b * p.nheads + h;
                             // seg (the record's third array) only with seq_idx: 0 otherwise, which
                             // load_prep zero-fills instead of reading
                             warp_copy16(q.prep + (bh * p.nchunks + c) * 3 * kQ, s_rec[warp], (p.has_seq ? 3 : 2) * kQ, lane);
                             __syncwarp();  // the row is rewritten for the warp's next head
                         });
}

// The (bh, c) prep record into shared memory (16-byte aligned arrays of kQ words) by cp.async;
// the caller commits and waits.
__device__ __forceinline__ void load_prep(const Ssd2Params& q, i64 bh, i64 c, float* s_lw, float* s_cum, int* s_seg) {
    const float* src = q.prep + (bh * q.p.nchunks + c) * 3 * kQ;
    constexpr int kPer = kQ / 4;  // 16-byte chunks per array
    constexpr int kChunks = 3 * kPer, kPasses = (kChunks + kThreads - 1) / kThreads;
#pragma unroll
    for (int k = 0; k < kPasses; ++k) {  // (unrolled: each pass's array is known but for tid's half)
        const int i = (int)threadIdx.x + k * kThreads;
        if (kChunks % kThreads != 0 && i >= kChunks) break;
        const int a = i / kPer, o = (i % kPer) * 4;
        float* dst = a == 0 ? s_lw : a == 1 ? s_cum : (float*)s_seg;
        // without seq_idx every seg is 0 and ssd2_chunk_prep stores none: zero-filled, not read
        cp_async16(smem_u32(dst + o), src + a * kQ + o, a < 2 || q.p.has_seq);
    }
}

// ---- 0. C B^T per (batch, chunk, group) -----------------------------------------------------------
extern "C" __global__ void __launch_bounds__(kThreads) ssd2_chunk_cb(const Ssd2Params q) {
    const SsdParams& p = q.p;
    __shared__ __align__(16) u16 s_c[2][kRows * kLd32];
    __shared__ __align__(16) u16 s_b[2][kRows * kLd32];
    int j = blockIdx.x % kPairs, i = 0;
    while (j > i) j -= ++i;  // pair index -> (i, j), j <= i
    const int c = blockIdx.x / kPairs, g = blockIdx.y;
    const i64 b = blockIdx.z;
    const i64 c0 = (i64)c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (i * kRows >= len) return;  // uniform: a tail chunk's unused blocks (never read)
    const u16* gc = (const u16*)p.C + b * p.C_s[0] + (c0 + i * kRows) * p.C_s[1] + g * p.C_s[2];
    const u16* gb = (const u16*)p.B + b * p.B_s[0] + (c0 + j * kRows) * p.B_s[1] + g * p.B_s[2];
    const int rows_c = len - i * kRows, rows_b = len - j * kRows, ds = (int)p.dstate;
    const bool vec = q.vec_bc;
    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5);
    const int nsteps = (ds + 31) / 32;

    float acc[8][4];
    clear(acc);
    auto load = [&](int k, int st) {
        load_tile<kRows, 32, kLd32>(s_c[st], gc + 32 * k, p.C_s[1], rows_c, ds - 32 * k, vec);
        load_tile<kRows, 32, kLd32>(s_b[st], gb + 32 * k, p.B_s[1], rows_b, ds - 32 * k, vec);
        cp_async_commit();
    };
    load(0, 0);
    for (int k = 0; k < nsteps; ++k) {
        next_stage(k, nsteps, load);
        const u32 a_base = smem_u32(s_c[k & 1] + w16 * kLd32 + lane_a(lane, kLd32));
        const u32 b_base = smem_u32(s_b[k & 1] + lane_bn(lane, kLd32));
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
            u32 a[4];
            ldsm_x4(a, a_base + kk * 32);
            mma_row<8, false>(acc, a, b_base + kk * 32, 16 * kLd32 * 2);
        }
        __syncthreads();
    }
    const i64 o = (((b * p.nchunks + c) * p.ngroups + g) * kQ + i * kRows) * kQ + j * kRows;
    if (q.cb16) {  // (ssd2_chunk_scan_ws: W is rounded to x's dtype from these, as the baseline's)
        u16* out = (u16*)q.cb + o;
#pragma unroll
        for (int jn = 0; jn < 8; ++jn)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = acc_row(2 * h), col = acc_col(jn, 0);
                *(u32*)(out + r * kQ + col) = pack2<DT>(acc[jn][2 * h], acc[jn][2 * h + 1]);
            }
        return;
    }
    float* out = q.cb + o;
#pragma unroll
    for (int jn = 0; jn < 8; ++jn)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = acc_row(2 * h), col = acc_col(jn, 0);
            *(float2*)(out + r * kQ + col) = make_float2(acc[jn][2 * h], acc[jn][2 * h + 1]);
        }
}

// ---- 1. chunk states --------------------------------------------------------------------------------
// (x / B tiles in StateStep's stages: common/ssd_tiles.cuh)
extern "C" __global__ void FS_STATE_BOUNDS ssd2_chunk_state(const Ssd2Params q) {
    const SsdParams& p = q.p;
    __shared__ __align__(16) float s_lw[kQ];  // the prep record (ssd2_chunk_prep)
    __shared__ __align__(16) float s_cum[kQ];
    __shared__ __align__(16) int s_seg[kQ];
    __shared__ __align__(8) float s_w[kQ];
    using SS = StateStep<kStateWg>;  // positions a step, stages
    __shared__ __align__(16) u16 s_x[SS::kStages][SS::kPos * kLd64];  // positions s x channels p
    __shared__ StateBTiles<kStateWg> s_bt;                        // positions s x states n
    u16* const s_b = s_bt.base();

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads, c = blockIdx.x;
    const i64 g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + 127) / 128);
    const int p0 = (blockIdx.y / ntn) * 64, n0 = (blockIdx.y % ntn) * 128;
    const i64 c0 = c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    const int hd = (int)p.headdim - p0, ds = (int)p.dstate - n0;  // valid columns of the tiles
    const u16* gx = (const u16*)p.x + b * p.x_s[0] + c0 * p.x_s[1] + h * p.x_s[2] + p0;
    const u16* gb = (const u16*)p.B + b * p.B_s[0] + c0 * p.B_s[1] + g * p.B_s[2] + n0;
    auto load = [&](int k, int st) {
        const int k0 = SS::kPos * k;
        load_tile<SS::kPos, 64, kLd64>(s_x[st], gx + k0 * p.x_s[1], p.x_s[1], len - k0, hd, q.vec_x);
        load_state_b<kStateWg>(s_b + st * StateBTiles<kStateWg>::kStage, gb + k0 * p.B_s[1], p.B_s[1], len - k0,
                               ds, q.vec_bc);
        cp_async_commit();
    };
    const int nsteps = (len + SS::kPos - 1) / SS::kPos;
    load_prep(q, blockIdx.z, c, s_lw, s_cum, s_seg);
    cp_async_commit();
    first_stages_n<SS::kStages>(nsteps, load);  // in flight while the weights are formed
    cp_async_wait<SS::kStages - 1>();
    __syncthreads();
    const float cum_end = s_cum[len - 1], cl2_end = cum_end * kLog2e;
    const int seg_end = s_seg[len - 1];
    // w_s = exp(cum_end - cum_s) dt'_s on the last position's sequence, as 2^(cl2_end - lw_s)
    for (int s = threadIdx.x; s < kQ; s += kThreads)
        s_w[s] = s < len && s_seg[s] == seg_end ? ex2(cl2_end - s_lw[s]) : 0.f;
    // (the first __syncthreads of the loop publishes s_w)

    float acc[16][4];
    clear(acc);
    state_product<false, kStateWg>(acc, &s_x[0][0], s_b, s_w, nsteps, load);
    store_state_tile(p.states + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate, acc, p0, hd, n0, ds,
                     p.dstate);
    if (blockIdx.y == 0 && threadIdx.x == 0)
        p.decay[(b * p.nheads + h) * p.nchunks + c] = seg_end == 0 ? ex(cum_end) : 0.f;
}

// ---- 1b. the states after each packed sequence (return_varlen_states, batch 1) -----------------------
// Sequence i holds positions cu[i] .. cu[i+1] - 1 of batch row 0; e = cu[i+1] - 1 lies in chunk c at pe =
// e - c kQ. Its state after e is ssd2_chunk_state's product ending at pe instead of at the chunk's last
// position, plus the carried state: H_e = [seg_pe == 0] exp(cum_pe) H_c + sum over s <= pe with seg_s ==
// seg_pe of exp(cum_pe - cum_s) dt'_s x_s B_s^T, with H_c the state entering chunk c in fp32 (the state
// passing ran with states_f32). seq_idx must mark the same sequences as cu_seqlens (the host checks it):
// its resets make H_c the sequence's own state and the seg mask drop the positions of earlier ones. An
// empty sequence's state is 0 (sequence 0's: the initial state, when given). Grid (nseq,
// ceil(headdim/64) * ceil(dstate/128), nheads), kThreads; warp w channels 16w .. 16w + 15 of the tile.
extern "C" __global__ void FS_STATE_BOUNDS ssd2_varlen_states(const Ssd2Params q) {
    const SsdParams& p = q.p;
    __shared__ __align__(16) float s_lw[kQ];
    __shared__ __align__(16) float s_cum[kQ];
    __shared__ __align__(16) int s_seg[kQ];
    __shared__ __align__(8) float s_w[kQ];
    using SS = StateStep<kStateWg>;  // positions a step, stages
    __shared__ __align__(16) u16 s_x[SS::kStages][SS::kPos * kLd64];  // positions s x channels p
    __shared__ StateBTiles<kStateWg> s_bt;                        // positions s x states n
    u16* const s_b = s_bt.base();

    const int i = blockIdx.x;
    const i64 h = blockIdx.z, g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + 127) / 128);
    const int p0 = (blockIdx.y / ntn) * 64, n0 = (blockIdx.y % ntn) * 128;
    const int hd = (int)p.headdim - p0, ds = (int)p.dstate - n0;  // valid columns of the tile
    float* out = q.varlen + i * q.varlen_s[0] + h * q.varlen_s[1];
    const i64 lo = q.cu_seqlens[i], hi = min((i64)q.cu_seqlens[i + 1], p.seqlen);
    if (hi <= lo) {  // empty: zero, or the initial state for sequence 0
        for (int e = threadIdx.x; e < 64 * 128; e += kThreads) {
            const int pp = e / 128, nn = e % 128;
            if (pp >= hd || nn >= ds) continue;
            const i64 P = p0 + pp, N = n0 + nn;
            const float v =
                i == 0 && p.has_init ? ld_any(p.init, h * p.init_s[1] + P * p.init_s[2] + N * p.init_s[3], p.init_dtype)
                                     : 0.f;
            out[P * q.varlen_s[2] + N * q.varlen_s[3]] = v;
        }
        return;
    }
    const i64 c = (hi - 1) / kQ, c0 = c * kQ;
    const int len = (int)(hi - c0);  // positions 0 .. pe = len - 1 of chunk c
    const u16* gx = (const u16*)p.x + c0 * p.x_s[1] + h * p.x_s[2] + p0;
    const u16* gb = (const u16*)p.B + c0 * p.B_s[1] + g * p.B_s[2] + n0;
    auto load = [&](int k, int st) {
        const int k0 = SS::kPos * k;
        load_tile<SS::kPos, 64, kLd64>(s_x[st], gx + k0 * p.x_s[1], p.x_s[1], len - k0, hd, q.vec_x);
        load_state_b<kStateWg>(s_b + st * StateBTiles<kStateWg>::kStage, gb + k0 * p.B_s[1], p.B_s[1], len - k0,
                               ds, q.vec_bc);
        cp_async_commit();
    };
    const int nsteps = (len + SS::kPos - 1) / SS::kPos;
    load_prep(q, h, c, s_lw, s_cum, s_seg);  // batch 0: the (batch, head) index is h
    cp_async_commit();
    first_stages_n<SS::kStages>(nsteps, load);
    cp_async_wait<SS::kStages - 1>();
    __syncthreads();
    const float cum_e = s_cum[len - 1], cl2_e = cum_e * kLog2e;
    const int seg_e = s_seg[len - 1];
    for (int s = threadIdx.x; s < kQ; s += kThreads)
        s_w[s] = s < len && s_seg[s] == seg_e ? ex2(cl2_e - s_lw[s]) : 0.f;
    // (the first __syncthreads of the loop publishes s_w)
    float acc[16][4];
    clear(acc);
    state_product<false, kStateWg>(acc, &s_x[0][0], s_b, s_w, nsteps, load);
    // the carried state, scaled to pe: only where pe continues the sequence that entered the chunk
    const float carry = seg_e == 0 ? ex(cum_e) : 0.f;
    const float* H = p.states + (c * p.nheads + h) * p.headdim * p.dstate;
#pragma unroll
    for (int jn = 0; jn < 16; ++jn)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int pp = acc_row(e), nn = acc_col(jn, e);
            if (pp >= hd || nn >= ds) continue;
            const i64 P = p0 + pp, N = n0 + nn;
            float v = acc[jn][e];
            if (carry != 0.f) v += carry * H[P * p.dstate + N];
            out[P * q.varlen_s[2] + N * q.varlen_s[3]] = v;
        }
}

#if FS_SSD_STATE_WGMMA
// ---- 1+2. chunk states and the state passing in one kernel (sm_90a) --------------------------------
// Why: ssd2_chunk_state writes every S_c in fp32 (168 MB at b8 L2048 80 heads x 64 x 128) and
// ssd2_state_passing reads them back to write the 16-bit H_c: 115 + 65 us on the H200 (2026-12-04),
// ~500 MB of DRAM traffic for 84 MB of H_c. Here one CTA walks its head's chunks in order with H in
// the wgmma accumulator: at chunk c's first step it stores H_c (16-bit, h16_slot's layout, read by
// the scan and kept for the backward), scales acc by f_c = exp(cum_end) and then accumulates S_c onto
// it (wgmma's D = A B + D), so S_c never leaves the SM: x in, H_c out, B re-read from L2.
// Grid (batch * nheads, ceil(headdim / 64) * ceil(dstate / 128)), 128 threads (warp w rows p 16w ..
// 16w + 15 of the 64 x 128 tile, acc[16][4] as ssd2_chunk_state's). Steps of kSpPos positions run
// flat over the chunks (t = c kSpc + k) through kSpStages TMA stages (below): steps t + 1, t + 2
// in flight during step t's product, across chunk boundaries; chunk c's prep record (lw, cum)
// rides on its first step's mbarrier, by chunk parity. Without seq_idx (a reset would need seg),
// rows TMA can address: the host's rule (src/ops/ssd_state_pass.rs).
// MEASURED 2026-12-04 (H200, same lease, b8 80 heads x 64, state 128, bf16; predicted ~80-100 us
// from the bytes): 122.9-125.1 us against 114.5-114.8 + 65.8 for the pair at L2048 (forward
// 449-453 -> 389-393 us of kernels; mamba_ssm's Triton 695.6 in the same process, its chunk state
// and state passing 144.7 + 68.1), 467.7 against 448.1 + 264.9 at L8192 (forward 1723 -> 1489).
// Its forms (same stop): 64 positions in two cp.async stages, 128 registers, four CTAs an SM (640
// CTAs 1.2 waves) 163-165 us; 32 positions in three cp.async stages at 96 registers, five an SM,
// 120 B of spills in the step 154-155 (ncu: 0.42 instructions issued a cycle per scheduler,
// long-scoreboard waits on the spills); one thread issuing TMA (this form) 123-125, ncu: L2 at
// 73%, DRAM 39%, 0.33 issued a cycle. What holds it now: B re-read from L2 by every head (~0.5 MB
// a CTA, ~335 of the ~590 MB through L2 at b8 L2048); the next lever is B shared by a group's
// heads (several heads a CTA, or TMA multicast over a cluster: tried, slower; see the kernel).
// Steps of 32 positions in three stages (two steps' loads in flight, 12 KB a stage): with 96
// registers (kSpCtas) five CTAs fit an SM, so the 640 (batch, head) CTAs of b8 80 heads are one
// wave on 132 SMs. Thread 0 issues each step by TMA (x one 64-channel box, B two 64-state boxes, all
// kSpPos rows in the 128-byte swizzle, zero-filled past the tensor's ends) and, at a chunk's first
// step, the chunk's record (lw, cum) by a bulk copy, all on the stage's one mbarrier; every thread
// waits on it. The barrier at each step's top frees the stage step t - 1 read for step t + 2.
constexpr int kSpPos = 32, kSpStages = 3;
constexpr int kSpCtas = 5;
constexpr int kSpBox = kSpPos * 128;       // bytes of one kSpPos x 64 16-bit box
constexpr int kSpStageBytes = 3 * kSpBox;  // x, then B's two 64-state blocks
constexpr int kSpRecBytes = 2 * kQ * 4;    // a record's lw and cum

// The kernel's one parameter (host mirror: Ssd2SpParams in src/ops/ssd_state_pass.rs): maps first.
struct Ssd2SpParams {
    fs::TensorMap tm_x;  // x (headdim, nheads, seqlen, batch), box 64 x 1 x kSpPos x 1
    fs::TensorMap tm_b;  // B (dstate, ngroups, seqlen, batch), box 64 x 1 x kSpPos x 1
    Ssd2Params q;
};

// Tried and dropped: B shared by four heads of a group on a cluster, each B box multicast by one
// CTA into the four (2026-12-04, a cluster barrier a step: 167.5-169.9 us against 123-125;
// 2026-12-05, per-stage "empty" mbarriers arrived on across the cluster, the CTAs drifting up to
// the ring's depth apart: 200.5-200.7 against 124.8 in one lease, its tests passing;
// benches/results/2026-12-05-h200-ssd-pending/cluster-relaxed.patch). B's L2 reads are not what
// holds this kernel.
extern "C" __global__ void __launch_bounds__(kThreads, kSpCtas)
    ssd2_chunk_state_pass(const __grid_constant__ Ssd2SpParams P) {
    const Ssd2Params& q = P.q;
    const SsdParams& p = q.p;
    constexpr int kSpc = kQ / kSpPos;  // steps a chunk
    static_assert(kSpc >= kSpStages - 1, "a record buffer is reloaded only after its chunk's last step");
    // chunk c's record (lw, cum) at s_rec[c & 1], its lw turned into the weights w_s in place
    __shared__ __align__(16) float s_rec[2][2 * kQ];
    __shared__ __align__(128) unsigned char s_raw[kSpStages * kSpStageBytes + 1024];
    __shared__ __align__(8) unsigned long long s_full[kSpStages];
    unsigned char* const s_st = align_smem_1024(s_raw);
    const u32 full0 = smem_u32(&s_full[0]);

    const i64 bh = blockIdx.x, b = bh / p.nheads, h = bh % p.nheads;
    const i64 g = h / (p.nheads / p.ngroups);
    const int ntn = (int)((p.dstate + 127) / 128);
    const int p0 = (blockIdx.y / ntn) * 64, n0 = (blockIdx.y % ntn) * 128;
    const int hd = (int)p.headdim - p0, ds = (int)p.dstate - n0;  // valid columns of the tile
    const float* rec = q.prep + bh * p.nchunks * 3 * kQ;
    const int nc = (int)p.nchunks;
    const int last_len = (int)(p.seqlen - (i64)(nc - 1) * kQ);
    const int nsteps = (nc - 1) * kSpc + (last_len + kSpPos - 1) / kSpPos;
    auto issue = [&](int t) {  // thread 0: step t into stage t % kSpStages
        if (t >= nsteps) return;
        const int c = t / kSpc, k = t - c * kSpc, st = t % kSpStages;
        const u32 bar = full0 + 8 * st, dst = smem_u32(s_st + st * kSpStageBytes);
        const int s0 = c * kQ + k * kSpPos;
        // (a tile of <= 64 states skips B's second block: its columns are never stored)
        const bool b2 = ds > 64;
        mbar_arrive_expect_tx(bar, (b2 ? 3 : 2) * kSpBox + (k == 0 ? kSpRecBytes : 0));
        if (k == 0) bulk_load(smem_u32(s_rec[c & 1]), rec + (i64)c * 3 * kQ, kSpRecBytes, bar);
        tma_load_4d(dst, &P.tm_x, p0, (int)h, s0, (int)b, bar);
#pragma unroll
        for (int j = 0; j < 2; ++j) {
            if (j == 1 && !b2) break;
            tma_load_4d(dst + (1 + j) * kSpBox, &P.tm_b, n0 + 64 * j, (int)g, s0, (int)b, bar);
        }
    };
    if (threadIdx.x == 0) {
#pragma unroll
        for (int st = 0; st < kSpStages; ++st) mbar_init(full0 + 8 * st, 1);
        mbar_init_fence();
        tma_prefetch_map(&P.tm_x);
        tma_prefetch_map(&P.tm_b);
    }
    if (threadIdx.x == 0)
#pragma unroll
        for (int t = 0; t < kSpStages - 1; ++t) issue(t);

    float acc[16][4];  // H: the initial state, then H_{c+1} = f_c H_c + S_c
    load_state_acc(acc, p.has_init, p.init, p.init_s, p.init_dtype, b, h, p0, hd, n0, ds);
    float(&d)[64] = *reinterpret_cast<float(*)[64]>(&acc[0][0]);
    for (int t = 0; t < nsteps; ++t) {
        // every thread is done with step t - 1's stage (and the barriers' initialisation is visible)
        __syncthreads();
        if (threadIdx.x == 0) issue(t + kSpStages - 1);  // into the stage step t - 1 read
        const int c = t / kSpc, k = t - c * kSpc, st = t % kSpStages;
        mbar_wait(full0 + 8 * st, (t / kSpStages) & 1);  // step t's boxes (and chunk c's record)
        if (k == 0) {
            float* const r = s_rec[c & 1];
            const int len = (int)min((i64)kQ, p.seqlen - (i64)c * kQ);
            const float cum_end = r[kQ + len - 1], cl2_end = cum_end * kLog2e;
            // lw -> w in place, each thread its own positions (chunk c + 2's record reuses the buffer
            // only after chunk c's last step: its load is issued past a later barrier)
            for (int s = threadIdx.x; s < kQ; s += kThreads) r[s] = s < len ? ex2(cl2_end - r[s]) : 0.f;
            fence_proxy_async();  // (the bulk copy of chunk c + 2's record writes over these)
            const float f = ex(cum_end);
            // H_c, the state entering chunk c: fp32 over slot c (states_f32: the backward's recompute,
            // return_varlen_states) and / or 16-bit (h16_slot: the scan's, the kept one), as
            // ssd2_state_passing leaves them
            if (q.states_f32)
                store_state_tile(p.states + ((b * p.nchunks + c) * p.nheads + h) * p.headdim * p.dstate, acc, p0, hd,
                                 n0, ds, p.dstate);
            if (!q.states_f32 || q.h16) store_h16_tile(h16_slot(q, b, c, h), acc, p0, hd, n0, ds, p.dstate);
#pragma unroll
            for (int i = 0; i < 64; ++i) d[i] *= f;
            if (blockIdx.y == 0 && threadIdx.x == 0) p.decay[bh * p.nchunks + c] = f;
            __syncthreads();  // the weights
        }
        const unsigned char* stage = s_st + st * kSpStageBytes;
        weighted_state_step_wg<kSpPos, true>(d, (const u16*)stage, (const u16*)(stage + kSpBox),
                                             s_rec[c & 1] + kSpPos * k);
    }
    if (p.has_final)
#pragma unroll
        for (int jn = 0; jn < 16; ++jn)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int pp = acc_row(e), nn = acc_col(jn, e);
                if (pp < hd && nn < ds)
                    p.final_states[b * p.final_s[0] + h * p.final_s[1] + (p0 + pp) * p.final_s[2] +
                                   (n0 + nn) * p.final_s[3]] = acc[jn][e];
            }
}
#endif

// ---- 2. state passing ---------------------------------------------------------------------------------
// One CTA per (batch, head) walks the head's states in blocks of kPassBlock elements (4 per thread),
// each block through every chunk: S_c read (fp32), the fp32 recurrence H_{c+1} = f_c H_c + S_c carried
// in registers, and H_c (the state entering chunk c) written OVER chunk c's slot as 16-bit values
// packed at the slot's start (element e at u16 index e, in x's dtype: the scan rounds it so anyway),
// final states in fp32. The scan then reads half the bytes, by cp.async. A forward whose backward keeps
// H_c (q.h16) writes the 16-bit values to that tensor instead (the same values; no in-place question).
// In place without a race (tests/test_ssd_fwd2_model.py replays the order): block k's 16-bit H
// covers the bytes of fp32 elements [k B / 2, (k + 1) B / 2) of the slot, all in blocks <= k: read in
// an earlier block, or, for block k, consumed by every thread (the FFMA of H_{c+1} waits for the load)
// before the step's barrier. The prefetch of the next step reads chunk c + 1's slot or block k + 1
// (elements >= (k + 1) B): never bytes written before.
// kCompact (q.h16 set): the 16-bit H_c go to q.h16 (compact rows: u16 index = the fp32 slot's element
// index) instead of over the slot. A template parameter: with the layout chosen at run time the kernel
// took 56 registers instead of 48, 4 CTAs of 256 threads an SM instead of 5, and the 640 (batch, head)
// CTAs of b8 80 heads two waves on 132 SMs (68 -> 94 us on the H200).
constexpr int kPassBlock = 4 * kPassThreads;
// The vector path's ring: each thread's next S values (16 bytes a step) kPassDepth - 1 steps ahead
// by cp.async into its own shared-memory column (no barrier: a thread reads only what it copied).
// Until 2026-12-01 one float4 a thread was in flight, in registers: ~20 KB an SM, DRAM at 71% (ncu,
// H200, 2026-11-29); three in flight from shared memory hold ~60 KB and no registers. (The element
// path, for states not 16-byte aligned, still loads one step ahead into registers.)
constexpr int kPassDepth = 4;
template <bool kCompact>
__device__ __forceinline__ void pass_states(const Ssd2Params& q, float4 (&s_ring)[kPassDepth][kPassThreads]) {
    const SsdParams& p = q.p;
    const i64 pn = p.headdim * p.dstate;
    const i64 b = blockIdx.x / p.nheads, h = blockIdx.x % p.nheads;
    const bool vec = q.vec_states && (pn & 3) == 0;  // every 4-element group 16-byte aligned and whole
    const float* decay = p.decay + (b * p.nheads + h) * p.nchunks;
    const i64 step = p.nheads * pn;  // from one chunk's slot to the next
    float* slot0 = p.states + (b * p.nchunks * p.nheads + h) * pn;
    // where the 16-bit H_c go (h16_slot's two layouts)
    u16* const h0 = kCompact ? q.h16 + (slot0 - p.states) : (u16*)slot0;
    const i64 hstep = kCompact ? step : 2 * step;  // u16 elements from one chunk's H_c to the next
    const int nblocks = (int)((pn + kPassBlock - 1) / kPassBlock), nc = (int)p.nchunks;
    // step t = k nc + c: block k of chunk c's slot
    auto issue = [&](int t) {
        if (t < nblocks * nc) {
            const int k = t / nc, c = t - k * nc;
            const i64 e0 = (i64)k * kPassBlock + 4 * threadIdx.x;
            cp_async16(smem_u32(&s_ring[t % kPassDepth][threadIdx.x]), slot0 + c * step + e0, e0 < pn);
        }
        cp_async_commit();  // (an empty group past the end keeps the count uniform)
    };
    auto load = [&](int k, int c, float (&v)[4]) {  // the element path
        const i64 e0 = (i64)k * kPassBlock + 4 * threadIdx.x;
        const float* src = slot0 + c * step + e0;
#pragma unroll
        for (int u = 0; u < 4; ++u) v[u] = e0 + u < pn ? src[u] : 0.f;
    };
    float nxt[4] = {0.f, 0.f, 0.f, 0.f};
    if (vec) {
#pragma unroll
        for (int t = 0; t < kPassDepth - 1; ++t) issue(t);
    } else {
        load(0, 0, nxt);
    }
    for (int k = 0; k < nblocks; ++k) {
        const i64 e0 = (i64)k * kPassBlock + 4 * threadIdx.x;
        const int nv = (int)max((i64)0, min((i64)4, pn - e0));
        float H[4] = {0.f, 0.f, 0.f, 0.f};
        if (p.has_init)
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (u < nv) {
                    const i64 e = e0 + u, pp = e / p.dstate, nn = e % p.dstate;
                    H[u] = ld_any(p.init, b * p.init_s[0] + h * p.init_s[1] + pp * p.init_s[2] + nn * p.init_s[3],
                                  p.init_dtype);
                }
        for (int c = 0; c < nc; ++c) {
            const float d = decay[c];
            if (vec) {  // S_c of block k from the ring; step t + kPassDepth - 1 into the slot t - 1 used
                const int t = k * nc + c;
                issue(t + kPassDepth - 1);
                cp_async_wait<kPassDepth - 1>();
                const float4 f = s_ring[t % kPassDepth][threadIdx.x];
                nxt[0] = f.x; nxt[1] = f.y; nxt[2] = f.z; nxt[3] = f.w;
            }
            float Hn[4];
#pragma unroll
            for (int u = 0; u < 4; ++u) Hn[u] = d * H[u] + nxt[u];  // consumes S_c before the barrier
            if (!vec) {
                if (c + 1 < nc) load(k, c + 1, nxt);
                else if (k + 1 < nblocks) load(k + 1, 0, nxt);
            }
            __syncthreads();  // every thread's S_c of block k is read: the 16-bit H may overwrite it
            if (q.states_f32) {  // element e over element e (the one this thread read as S_c)
                float* d32 = slot0 + c * step + e0;
                if (vec && nv == 4) {
                    *(float4*)d32 = make_float4(H[0], H[1], H[2], H[3]);
                } else {
#pragma unroll
                    for (int u = 0; u < 4; ++u)
                        if (u < nv) d32[u] = H[u];
                }
                // (with h16 as well, the 16-bit H_c below: a return_varlen_states call, whose scan
                // reads those while ssd2_varlen_states reads the fp32 ones)
                if (!kCompact) {
#pragma unroll
                    for (int u = 0; u < 4; ++u) H[u] = Hn[u];
                    continue;
                }
            }
            u16* dst = h0 + c * hstep + e0;
            if (vec && nv == 4) {
                *(uint2*)dst = make_uint2(pack2<DT>(H[0], H[1]), pack2<DT>(H[2], H[3]));
            } else {
#pragma unroll
                for (int u = 0; u < 4; ++u)
                    if (u < nv) dst[u] = f32_to_half<DT>(H[u]);
            }
#pragma unroll
            for (int u = 0; u < 4; ++u) H[u] = Hn[u];
        }
        if (p.has_final)
#pragma unroll
            for (int u = 0; u < 4; ++u)
                if (u < nv) {
                    const i64 e = e0 + u, pp = e / p.dstate, nn = e % p.dstate;
                    p.final_states[b * p.final_s[0] + h * p.final_s[1] + pp * p.final_s[2] + nn * p.final_s[3]] = H[u];
                }
    }
}

extern "C" __global__ void __launch_bounds__(kPassThreads, 5) ssd2_state_passing(const Ssd2Params q) {
    __shared__ __align__(16) float4 s_ring[kPassDepth][kPassThreads];  // (one for both forms: 16 KB)
    if (q.h16) {
        pass_states<true>(q, s_ring);
    } else {
        pass_states<false>(q, s_ring);
    }
}

// ---- 3. chunk outputs -------------------------------------------------------------------------------
// This thread's rows l = l0 and l0 + 8 of the output tile: l, cum_l log2 e and seg_l, which
// accumulate_wx takes (a row past the chunk's end reads the last position's terms: never stored).
__device__ __forceinline__ void row_terms(int l0, int len, const float* s_cum, const int* s_seg, int (&l_of)[2],
                                          float (&cl2)[2], int (&seg_l)[2]) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        l_of[hh] = l0 + 8 * hh;
        const int lc = min(l_of[hh], len - 1);
        cl2[hh] = s_cum[lc] * kLog2e;
        seg_l[hh] = s_seg[lc];
    }
}

// acc += W x for one 64 x 64 source block starting at position s0, W built in the accumulator
// layout (cbv[jn][e]: row r0 + 8 (e >> 1), column 8 jn + t2 + (e & 1)), which is the A layout of the
// next mma: the A fragment of k16 block kk from n8 tiles 2 kk, 2 kk + 1, built just before its mma
// (so cbv dies as it is used). xb: the x tile's (.trans B operand) lane address in shared memory.
// Every mask term applies: the diagonal block, and every block of a call with seq_idx (the blocks
// below the diagonal of a call without take accumulate_cbf_x).
// The A fragment (k16 step kk) of W for one 64 x 64 source block at s0, every mask term applied
// (accumulate_wx's element).
__device__ __forceinline__ void w_frag_masked(u32 (&a)[4], const float (&cbv)[8][4], int kk, int s0,
                                              const int (&l_of)[2], const float (&cl2)[2], const int (&seg_l)[2],
                                              int len, const float* s_lw, const int* s_seg) {
    const int t2 = 2 * (threadIdx.x & 3);
    float wv[2][4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int jn = 2 * kk + u, s = s0 + 8 * jn + t2;  // s even: 8-byte reads
        const float2 lw = *(const float2*)(s_lw + s);
        const int2 seg_s = *(const int2*)(s_seg + s);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int hh = e >> 1, odd = e & 1, l = l_of[hh];
            const float w = cbv[jn][e] * ex2(cl2[hh] - (odd ? lw.y : lw.x));
            wv[u][e] = s + odd <= l && l < len && (odd ? seg_s.y : seg_s.x) == seg_l[hh] ? w : 0.f;
        }
    }
    acc_to_a<DT>(a, wv[0], wv[1]);
}

// The A fragment (k16 step kk) of CB f for a block strictly below the diagonal (accumulate_cbf_x's
// element).
__device__ __forceinline__ void w_frag_cbf(u32 (&a)[4], const float (&cbv)[8][4], int kk, int s0, const float* s_f) {
    const int t2 = 2 * (threadIdx.x & 3);
    float wv[2][4];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
        const int jn = 2 * kk + u;
        const float2 f = *(const float2*)(s_f + s0 + 8 * jn + t2);
#pragma unroll
        for (int e = 0; e < 4; ++e) wv[u][e] = cbv[jn][e] * ((e & 1) ? f.y : f.x);
    }
    acc_to_a<DT>(a, wv[0], wv[1]);
}

// acc += W x for one 64 x 64 source block starting at position s0, W built in the accumulator
// layout (cbv[jn][e]: row r0 + 8 (e >> 1), column 8 jn + t2 + (e & 1)), which is the A layout of the
// next mma: the A fragment of k16 block kk from n8 tiles 2 kk, 2 kk + 1, built just before its mma
// (so cbv dies as it is used). xb: the x tile's (.trans B operand) lane address in shared memory.
// Every mask term applies: the diagonal block, and every block of a call with seq_idx (the blocks
// below the diagonal of a call without take accumulate_cbf_x).
__device__ __forceinline__ void accumulate_wx(float (&acc)[8][4], const float (&cbv)[8][4], int s0, const int (&l_of)[2],
                                              const float (&cl2)[2], const int (&seg_l)[2], int len, const float* s_lw,
                                              const int* s_seg, u32 xb) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        u32 a[4];
        w_frag_masked(a, cbv, kk, s0, l_of, cl2, seg_l, len, s_lw, s_seg);
        mma_row<8, true>(acc, a, xb + kk * 16 * kLd64 * 2, 16 * 2);
    }
}

// acc += (CB f) x for one 64 x 64 source block strictly below the diagonal of a call without
// seq_idx, with the decay factored at the CTA's first row m0: W[l, s] = CB[l, s] exp(cum_l - cum_s)
// dt'_s = g_l (CB[l, s] f_s), f_s = exp(cum_m0 - cum_s) dt'_s (s_f: formed once per CTA over s <
// m0) and g_l = exp(cum_l - cum_m0) (applied to acc once, before the diagonal block). One FMUL an
// element instead of accumulate_wx's FADD, MUFU and FMUL, and still one rounding of the product:
// CB f_s is rounded to 16 bits as W was. Where A <= 0 (Mamba-2's A = -exp(A_log)) cum does not
// increase, so f_s <= 1 and g_l <= 1: neither overflows, and where one underflows so does W.
__device__ __forceinline__ void accumulate_cbf_x(float (&acc)[8][4], const float (&cbv)[8][4], int s0, const float* s_f,
                                                 u32 xb) {
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        u32 a[4];
        w_frag_cbf(a, cbv, kk, s0, s_f);
        mma_row<8, true>(acc, a, xb + kk * 16 * kLd64 * 2, 16 * 2);
    }
}

#if FS_SSD_STATE_WGMMA
// acc += A x on wgmma (sm_90a): the four k16 steps' A fragments (W or CB f, from registers) times the
// swizzled 64 x 64 x tile at x_base (positions s x channels p: the MN-major B operand), four
// m64n64k16 for the warpgroup, committed and waited for (the A registers and the stage stay live
// until they finish).
__device__ __forceinline__ void wx_wgmma(float (&acc)[8][4], const u32 (&a)[4][4], u32 x_base) {
    float(&d)[32] = *reinterpret_cast<float(*)[32]>(&acc[0][0]);
    const u64 dx = wgmma_desc(x_base, 64 * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs<64, DT, 1>(d, a[kk], desc_at(dx, kk * 16 * 128), 1);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(d);
}
#endif

// The output tile: rows r0, r0 + 8 of positions t0 + r (r < rows), channels p0 + col (col < hd):
// acc + D x (x of row r from xd, the diagonal block's x tile; D from s_d, the tile's 64 channels,
// 0 past hd), times silu(z) (z tile zt), stored. Every shared-memory read is issued before the first
// use: behind per-element column checks and has_z / vec_out tests each waited alone, and this
// epilogue took ~25% of the scan's stall samples (ncu, b8 L2048, H200, 2026-11-29).
// kFull: a tile of 64 valid rows and columns with 4-byte aligned output pairs (no checks).
// kXSwz: the x tile in the 128-byte swizzle (the wgmma scan), else padded rows of kLd64 (z: always padded).
template <bool kFull, bool kXSwz>
__device__ __forceinline__ void store_y_rows(const Ssd2Params& q, bool has_z, const float (&acc)[8][4], const u16* xd,
                                            const u16* zt, const float* s_d, u16* o16, i64 ostride, int rows, int hd,
                                            int r0, int t2) {
    float2 dv[8];
    u32 xv[2][8], zv[2][8];
#pragma unroll
    for (int jn = 0; jn < 8; ++jn) {
        dv[jn] = *(const float2*)(s_d + 8 * jn + t2);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {  // (rows past the tile's valid ones were zero-filled)
            const int off = (r0 + 8 * hh) * kLd64 + 8 * jn + t2;
#if FS_SSD_STATE_WGMMA
            if constexpr (kXSwz) {
                xv[hh][jn] = *(const u32*)((const unsigned char*)xd + swz_offset(kRows, r0 + 8 * hh, 8 * jn + t2));
            } else {
                xv[hh][jn] = *(const u32*)(xd + off);
            }
#else
            static_assert(!kXSwz, "the swizzled x tile is the wgmma scan's");
            xv[hh][jn] = *(const u32*)(xd + off);
#endif
            zv[hh][jn] = has_z ? *(const u32*)(zt + off) : 0u;
        }
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = r0 + 8 * hh;
        if (!kFull && r >= rows) continue;
        u16* const orow = o16 + r * ostride;
#pragma unroll
        for (int jn = 0; jn < 8; ++jn) {
            const int col = 8 * jn + t2;
            if (!kFull && col >= hd) continue;
            const float2 xv2 = unpack2<DT>(xv[hh][jn]);
            float v0 = acc[jn][2 * hh] + dv[jn].x * xv2.x, v1 = acc[jn][2 * hh + 1] + dv[jn].y * xv2.y;
            if (has_z) {
                const float2 zv2 = unpack2<DT>(zv[hh][jn]);
                v0 *= silu(zv2.x);
                v1 *= silu(zv2.y);
            }
            if (kFull || q.vec_out) {
                *(u32*)(orow + col) = pack2<DT>(v0, v1);
            } else {
                orow[col] = f32_to_half<DT>(v0);
                if (col + 1 < hd) orow[col + 1] = f32_to_half<DT>(v1);
            }
        }
    }
}
template <bool kXSwz = false>
__device__ __forceinline__ void store_y(const Ssd2Params& q, const float (&acc)[8][4], const u16* xd, const u16* zt,
                                       const float* s_d, i64 b, i64 h, i64 t0, int rows, int p0, int hd, int r0,
                                       int t2) {
    const SsdParams& p = q.p;
    u16* const o16 = (u16*)p.out + b * p.out_s[0] + t0 * p.out_s[1] + h * p.out_s[2] + p0;
    if (q.vec_out && hd >= 64 && rows >= kRows) {  // uniform; has_z tested once, outside the loops
        if (p.has_z) store_y_rows<true, kXSwz>(q, true, acc, xd, zt, s_d, o16, p.out_s[1], rows, hd, r0, t2);
        else store_y_rows<true, kXSwz>(q, false, acc, xd, zt, s_d, o16, p.out_s[1], rows, hd, r0, t2);
    } else {
        store_y_rows<false, kXSwz>(q, p.has_z, acc, xd, zt, s_d, o16, p.out_s[1], rows, hd, r0, t2);
    }
}

// W x's CB blocks in shared memory (load_cb_block): pitch 72 floats, so the float2 fragment reads
// (rows r0, r0 + 8, columns 8 jn + t2) of a half-warp hit 32 distinct banks.
constexpr int kLdCb = 64 + 8;

extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd2_chunk_scan(const Ssd2Params q) {
    const SsdParams& p = q.p;
    __shared__ __align__(16) float s_lw[kQ];  // the prep record (ssd2_chunk_prep)
    __shared__ __align__(16) float s_cum[kQ];
    __shared__ __align__(16) int s_seg[kQ];
    // One region (bytes): x stages [0, 2 kXStage) (source positions s x channels p), s_c (positions l x
    // states n; then z, l x p, padded), s_h's two stages (channels p x states n: H_c, rounded, for
    // C.H^T; then the CB block of W x, 64 x kLdCb fp32, over both). On wgmma (sm_90a) the x, C and H
    // tiles are 64 x 64 in the 128-byte swizzle (8 KB, every one 1024-byte aligned: the region is
    // aligned by hand), elsewhere padded rows of kLd64.
    constexpr bool kWg = kStateWg;
    constexpr int kTileB = kRows * kLd64 * 2;                  // 9216: a padded tile (s_c, each s_h stage)
    constexpr int kXStage = kWg ? kRows * 64 * 2 : kTileB;     // bytes of one x stage
    __shared__ __align__(128) unsigned char s_raw[(kWg ? 1024 : 0) + 2 * kXStage + 3 * kTileB];
    unsigned char* const s_al = kWg ? align_smem_1024(s_raw) : s_raw;
    auto s_x = [&](int st) { return (u16*)(s_al + st * kXStage); };
    u16* const s_c = (u16*)(s_al + 2 * kXStage);
    auto s_h = [&](int st) { return (u16*)(s_al + 2 * kXStage + (1 + st) * kTileB); };
    static_assert(kRows * kLdCb * 4 <= 2 * kTileB, "the CB block fits in the H_c stages");
    float* const s_cb = (float*)s_h(0);

    // (batch, head, group) in 32-bit arithmetic: the i64 forms took a runtime 64-bit check and three
    // divisions of ~20 instructions each (ncu 2026-11-29: the prologue held ~16% of the stall samples)
    const unsigned nh = (unsigned)p.nheads, bz = blockIdx.z, bu = bz / nh, hu = bz - bu * nh;
    const i64 b = bu, h = hu, g = hu / (nh / (unsigned)p.ngroups);
    const int c = blockIdx.x / kNb, i = blockIdx.x % kNb, m0 = i * kRows, p0 = blockIdx.y * 64;
    const i64 c0 = (i64)c * kQ;
    const int len = (int)min((i64)kQ, p.seqlen - c0);
    if (m0 >= len) return;  // uniform per block: a tail chunk's empty row blocks
    const int hd = (int)p.headdim - p0, ds = (int)p.dstate;
    const u16* gx = (const u16*)p.x + b * p.x_s[0] + c0 * p.x_s[1] + h * p.x_s[2] + p0;
    // a 64 x 64 operand tile of the products (swizzled on wgmma)
    auto load_op = [&](u16* st, const u16* g, i64 stride, int rows, int cols, bool vec) {
#if FS_SSD_STATE_WGMMA
        load_tile_sw<kRows, 64>(st, g, stride, rows, cols, vec);
#else
        load_tile<kRows, 64, kLd64>(st, g, stride, rows, cols, vec);
#endif
    };
    auto load_x = [&](int j, int st) {
        load_op(s_x(st), gx + (i64)j * kRows * p.x_s[1], p.x_s[1], len - j * kRows, hd, q.vec_x);
        cp_async_commit();
    };
    const bool has_h = c > 0 || p.has_init;
    // W x's CB blocks (fp32 workspace, 64 x 64 each: rows l of this tile, one source block's
    // columns) pass through s_cb, which C.H^T's H stages occupy until its loop ends; z (rows l x
    // channels p) goes to s_c, C.H^T's C stage 0
    const float* cbg = q.cb + (((b * p.nchunks + c) * p.ngroups + g) * kQ + m0) * kQ;
    auto load_z_cb0 = [&]() {
        if (p.has_z) {
            const u16* gz = (const u16*)p.z + b * p.z_s[0] + (c0 + m0) * p.z_s[1] + h * p.z_s[2] + p0;
            load_tile<kRows, 64, kLd64>(s_c, gz, p.z_s[1], len - m0, hd, q.vec_z);
        }
        load_cb_block<kLdCb>(s_cb, cbg);
    };
    load_prep(q, blockIdx.z, c, s_lw, s_cum, s_seg);
    if (!has_h) load_z_cb0();  // (no C.H^T: s_c and s_cb are free from the start)
    load_x(0, 0);  // one group with the prep record, in flight while C.H^T runs

    // C.H^T operands, 64 states a step, two stages: (C, H) into (s_c, s_h(0)) and (s_x(1), s_h(1)),
    // s_x[1] being free until the W x loop; the first step in flight with the prep record and x
    const u16* gc = (const u16*)p.C + b * p.C_s[0] + (c0 + m0) * p.C_s[1] + g * p.C_s[2];
    // H_c in x's dtype, written by ssd2_state_passing (h16_slot)
    const u16* gh = h16_slot(q, b, c, h) + (i64)p0 * ds;
    const bool h_vec = q.vec_states && (ds & 7) == 0;
    auto load_ch = [&](int n0, int st) {
        load_op(st ? s_x(1) : s_c, gc + n0, p.C_s[1], len - m0, ds - n0, q.vec_bc);
        load_op(s_h(st), gh + n0, ds, hd, ds - n0, h_vec);
        cp_async_commit();
    };
    if (has_h) load_ch(0, 0);

    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5), t2 = 2 * (lane & 3);
    const int r0 = w16 + (lane >> 2);  // this thread's rows r0, r0 + 8 of the tile
    float acc[8][4];
    clear(acc);

    // y_l += [seg_l == 0] exp(cum_l) C_l . H_c (skipped when H_c is 0: first chunk, no initial states)
    if (has_h) {
        const int nsteps = (ds + 63) / 64;
        for (int k = 0; k < nsteps; ++k) {
#if FS_SSD_STATE_WGMMA
            // C (l x n) and H (p x n) both K-major: four m64n64k16 a step for the warpgroup
            next_stage<true>(k, nsteps, [&](int kn, int st) { load_ch(64 * kn, st); });
            {
                float(&d)[32] = *reinterpret_cast<float(*)[32]>(&acc[0][0]);
                const u64 dc = wgmma_desc(smem_u32((k & 1) ? s_x(1) : s_c), 16, 1024);
                const u64 dh = wgmma_desc(smem_u32(s_h(k & 1)), 16, 1024);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < 4; ++kk)
                    wgmma_ss<64, DT, 0>(d, desc_at(dc, kk * 32), desc_at(dh, kk * 32), 1);
                wgmma_commit();
                wgmma_wait<0>();
                reg_fence(d);
            }
#else
            next_stage(k, nsteps, [&](int kn, int st) { load_ch(64 * kn, st); });
            const u32 a_base = smem_u32(((k & 1) ? s_x(1) : s_c) + w16 * kLd64 + lane_a(lane, kLd64));
            const u32 b_base = smem_u32(s_h(k & 1) + lane_bn(lane, kLd64));
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) {
                u32 a[4];
                ldsm_x4(a, a_base + kk * 32);
                mma_row<8, false>(acc, a, b_base + kk * 32, 16 * kLd64 * 2);
            }
#endif
            __syncthreads();  // the stage is refilled two steps on (or by z / x after the loop)
        }
        // the row factor [seg_l == 0] exp(cum_l), rows r0 and r0 + 8; without seq_idx exp(cum_m0)
        // here and g_l = exp(cum_l - cum_m0) before the diagonal block (accumulate_cbf_x)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int l = m0 + r0 + 8 * hh;
            scale_row(acc, hh, !p.has_seq ? ex(s_cum[m0]) : l < len && s_seg[l] == 0 ? ex(s_cum[l]) : 0.f);
        }
    }

    // y_l += sum_{s <= l} W[l, s] x_s, W = CB[l, s] exp(cum_l - cum_s) dt'_s on the same sequence
    if (has_h) {  // z and CB block 0 into the stages C.H^T has left (its loop ended with a barrier)
        load_z_cb0();
        cp_async_commit();
    } else {  // the prep record's group (with x's first tile, z and CB block 0) is not waited on yet
        cp_async_wait<0>();
        __syncthreads();
    }
    float cl2[2];
    int seg_l[2], l_of[2];
    row_terms(m0 + r0, len, s_cum, s_seg, l_of, cl2, seg_l);
#if !FS_SSD_STATE_WGMMA
    const u32 xb_lane = lane_bt(lane, kLd64) * 2;
#endif
    // without seq_idx the blocks below the diagonal take the factored decay (accumulate_cbf_x):
    // f_s = 2^(cl2_m0 - lw_s) over lw_s in place for s < m0 (the diagonal block reads lw from m0
    // on); the loop's first barrier publishes it
    const bool fast = !p.has_seq;
    const float cl2_m0 = s_cum[m0] * kLog2e;
    if (fast)
        for (int s = threadIdx.x; s < m0; s += kThreads) s_lw[s] = ex2(cl2_m0 - s_lw[s]);
    // D of the tile's channel threadIdx.x (threads 0 .. 63) for the epilogue, staged over s_cum,
    // whose last readers come before this loop: written after the loop's first barrier, published
    // by its second. Loaded here, in flight while the first blocks land (b8 L2048: 363-365 us with
    // the load after that barrier, 361 here); at chunk 64 the register held through the wait
    // spilled (NVRTC 13.0: 8 bytes), so that variant loads after the barrier.
    constexpr bool kDEarly = kQ > 64;
    float d_own = 0.f;
    if (kDEarly && threadIdx.x < 64) d_own = channel_d(p, h, p0 + threadIdx.x, (int)threadIdx.x < hd);
    float* const s_d = s_cum;
    // Source block j: its CB block and x tile landed (and, at j = 0, z); cbv read from s_cb; a
    // barrier (every warp has its cbv, and is past block j - 1's W x, whose x stage is refilled
    // next); block j + 1's CB and x issued; W x of block j under those loads.
#pragma unroll 1
    for (int j = 0; j <= i; ++j) {
        cp_async_wait<0>();
#if FS_SSD_STATE_WGMMA
        fence_proxy_async();  // (x's tile, read by wgmma)
#endif
        __syncthreads();
        float cbv[8][4];
#pragma unroll
        for (int jn = 0; jn < 8; ++jn)
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const float2 v = *(const float2*)(s_cb + (r0 + 8 * hh) * kLdCb + 8 * jn + t2);
                cbv[jn][2 * hh] = v.x;
                cbv[jn][2 * hh + 1] = v.y;
            }
        if (j == 0 && threadIdx.x < 64)
            s_d[threadIdx.x] = kDEarly ? d_own : channel_d(p, h, p0 + threadIdx.x, (int)threadIdx.x < hd);
        __syncthreads();
        if (j < i) {
            load_cb_block<kLdCb>(s_cb, cbg + (j + 1) * kRows);
            load_x(j + 1, (j + 1) & 1);  // (commits both)
        }
#if FS_SSD_STATE_WGMMA
        const u32 xs = smem_u32(s_x(j & 1));
        u32 a[4][4];
        if (fast && j < i) {
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) w_frag_cbf(a[kk], cbv, kk, j * kRows, s_lw);
        } else {
            if (fast) {  // the off-diagonal sum (and C.H^T's exp(cum_m0)) times g_l
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) scale_row(acc, hh, ex2(cl2[hh] - cl2_m0));
            }
#pragma unroll
            for (int kk = 0; kk < 4; ++kk) w_frag_masked(a[kk], cbv, kk, j * kRows, l_of, cl2, seg_l, len, s_lw, s_seg);
        }
        wx_wgmma(acc, a, xs);
#else
        const u32 xb = smem_u32(s_x(j & 1)) + xb_lane;
        if (fast && j < i) {
            accumulate_cbf_x(acc, cbv, j * kRows, s_lw, xb);
        } else {
            if (fast) {  // the off-diagonal sum (and C.H^T's exp(cum_m0)) times g_l
#pragma unroll
                for (int hh = 0; hh < 2; ++hh) scale_row(acc, hh, ex2(cl2[hh] - cl2_m0));
            }
            accumulate_wx(acc, cbv, j * kRows, l_of, cl2, seg_l, len, s_lw, s_seg, xb);
        }
#endif
    }

    // epilogue: D x (x of row l from the diagonal block's tile, still in s_x(i & 1)), silu(z) (z from
    // s_c), store
    store_y<kWg>(q, acc, s_x(i & 1), s_c, s_d, b, h, c0 + m0, len - m0, p0, hd, r0, t2);
}

// ---- 3'. one short chunk: C B^T, W x and the epilogue in one kernel ------------------------------
// A call whose whole sequence is one chunk of <= 64 positions with no initial states (the real-time
// shape: b32 L60) has one 64-row block per (batch, head) and no C . H^T term, so the CTA forms its
// CB block itself (C and B tiles in shared memory, 64 states per step, the k16 steps in
// ssd2_chunk_cb's order: the same fp32 sums) and ssd2_chunk_cb is not launched. The host picks this
// entry (`ssd::one_block`); final states, when asked, come from the state kernels as usual.
// Grid (1, ceil(headdim/64), batch * nheads); warp w owns rows 16w .. 16w + 15 (positions) of the
// CB block (16 l x 64 s, cbv[8][4]) and of the output (16 l x 64 p, acc[8][4]).
extern "C" __global__ void __launch_bounds__(kThreads, 4) ssd2_chunk_scan_one(const Ssd2Params q) {
    const SsdParams& p = q.p;
    __shared__ __align__(8) float s_dt[kQ];
    __shared__ __align__(8) float s_cum[kQ];
    __shared__ __align__(8) int s_seg[kQ];
    __shared__ __align__(16) u16 s_x[kRows * kLd64];  // positions s x channels p
    __shared__ __align__(16) u16 s_z[kRows * kLd64];  // positions l x channels p
    __shared__ __align__(16) u16 s_c[kRows * kLd64];  // positions l x states n (64 per step)
    __shared__ __align__(16) u16 s_b[kRows * kLd64];  // positions s x states n
    __shared__ __align__(16) float s_d[64];           // D of the tile's channels (store_y)

    const i64 b = blockIdx.z / p.nheads, h = blockIdx.z % p.nheads;
    const int p0 = blockIdx.y * 64;
    const i64 g = h / (p.nheads / p.ngroups);
    const int len = (int)min((i64)kRows, p.seqlen);
    const int hd = (int)p.headdim - p0, ds = (int)p.dstate;
    const u16* gx = (const u16*)p.x + b * p.x_s[0] + h * p.x_s[2] + p0;
    const u16* gc = (const u16*)p.C + b * p.C_s[0] + g * p.C_s[2];
    const u16* gb = (const u16*)p.B + b * p.B_s[0] + g * p.B_s[2];
    // group 1: x, z and the first C / B step, all in flight while the prologue runs
    load_tile<kRows, 64, kLd64>(s_x, gx, p.x_s[1], len, hd, q.vec_x);
    if (p.has_z) {
        const u16* gz = (const u16*)p.z + b * p.z_s[0] + h * p.z_s[2] + p0;
        load_tile<kRows, 64, kLd64>(s_z, gz, p.z_s[1], len, hd, q.vec_z);
    }
    load_tile<kRows, 64, kLd64>(s_c, gc, p.C_s[1], len, ds, q.vec_bc);
    load_tile<kRows, 64, kLd64>(s_b, gb, p.B_s[1], len, ds, q.vec_bc);
    cp_async_commit();
    // (D published with the prologue by the first C B^T step's barrier)
    if (threadIdx.x < 64) s_d[threadIdx.x] = channel_d(p, h, p0 + threadIdx.x, (int)threadIdx.x < hd);
    chunk_prologue(p, b, h, 0, len, s_dt, s_cum, s_seg);
    to_log2_weights(s_dt, s_cum);  // published by the first C B^T step's barrier

    const int lane = threadIdx.x & 31, w16 = 16 * (threadIdx.x >> 5), t2 = 2 * (lane & 3);
    const int r0 = w16 + (lane >> 2);
    float cbv[8][4];
    clear(cbv);
    const u32 a_base = smem_u32(s_c + w16 * kLd64 + lane_a(lane, kLd64));
    const u32 b_base = smem_u32(s_b + lane_bn(lane, kLd64));
    for (int n0 = 0; n0 < ds; n0 += 64) {
        if (n0 > 0) {  // the previous step's readers are past the barrier that ended it
            load_tile<kRows, 64, kLd64>(s_c, gc + n0, p.C_s[1], len, ds - n0, q.vec_bc);
            load_tile<kRows, 64, kLd64>(s_b, gb + n0, p.B_s[1], len, ds - n0, q.vec_bc);
            cp_async_commit();
        }
        cp_async_wait<0>();
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            u32 a[4];
            ldsm_x4(a, a_base + kk * 32);
            mma_row<8, false>(cbv, a, b_base + kk * 32, 16 * kLd64 * 2);
        }
        if (n0 + 64 < ds) __syncthreads();
    }

    float cl2[2];
    int seg_l[2], l_of[2];
    row_terms(r0, len, s_cum, s_seg, l_of, cl2, seg_l);
    float acc[8][4];
    clear(acc);
    accumulate_wx(acc, cbv, 0, l_of, cl2, seg_l, len, s_dt, s_seg, smem_u32(s_x) + lane_bt(lane, kLd64) * 2);
    store_y(q, acc, s_x, s_z, s_d, b, h, 0, len, p0, hd, r0, t2);
}

// ---- 3''. chunk outputs, warp-specialised (sm_90a, chunk 256, no seq_idx, no z) -------------------
// The same products as ssd2_chunk_scan (C.H^T on wgmma from two swizzled 64 x 64 tiles a 64-state
// step, then W x, W = CB f below the diagonal with the decay factored at the tile's first row, the
// masked W on it), but no consumer thread issues a load: producer warps stream every operand
// through shared-memory rings with mbarriers, one ring per consumer warpgroup, so the products of a
// block run while the next blocks (and the next unit's) are in flight. Why: ssd2_chunk_scan's CTAs
// wait on their own cp.async loads at every step (ncu 2026-11-29: issue 49%, 0.86 eligible warps
// a scheduler; the waits for the loop top's CB / x block, the prologue's and the exit's drain held
// ~35% of the stall samples) and spend a third of their instructions on loads and their addresses.
//
// Work: a unit is (batch, chunk, head, 64-channel tile): its four 64-row tiles, the longest (3)
// first, each C.H^T and then its 1..4 source blocks. One CTA an SM; consumer warpgroup ci (1..3 =
// warps 4-15, each owning its 64 x 64 accumulator as ssd2_chunk_scan's four warps do) walks units
// ci' + 3 blockIdx.x, + 3 gridDim.x, ... (ci' = ci - 1), in (batch, chunk, head, channel tile)
// order, so the SMs at work share a (batch, chunk) and its C B^T and C stay in L2. Warpgroup 0
// produces: after setmaxnreg (24 registers there, 160 for the consumers; _pipe: 56 / 152) lane 0
// of its warp w issues every load of consumer w's ring; warp 3 leaves.
// Loads: x, C, H and the C B^T block by TMA (SWIZZLE_128B boxes of 64 x 64 16-bit values, the
// layout of load_tile_sw: zero fill past the tensors' ends stands for the row / column checks),
// the unit's prep record (lw, cum: no seq_idx, so no seg) as one bulk copy. C B^T comes in x's
// dtype (ssd2_chunk_cb's `cb16` form: bf16 only, set by the host): W is rounded to x's dtype from
// it, as the tests' same-precision baseline forms it, and a stage is 16 KB, so three consumers'
// rings of four fit.
// Ring stage (16 KB, 1024-aligned): [0, 8 KB) the x tile, or C.H^T's C tile; [8 KB, 16 KB) the
// C B^T block, or C.H^T's H tile. Every stage is released by all 128 threads of its warpgroup (an
// empty barrier of 128 arrivals) after their last read: the diagonal block's after the epilogue,
// which reads its x tile for D x.
// MEASURED 2026-12-04 (H200, same lease, tools/ssd_profile.py, b8 L2048 80 x 64, state 128, bf16,
// no z; benches/results/2026-12-04-h200-scan-wide-ssd-ws/), with two consumer warpgroups and fp32
// C B^T: its rows by bulk copies 585 us (the TMA unit's request rate the limit); as two swizzled
// 64 x 32 fp32 boxes 333 us; W x pipelined (below) 319.8 / 321.5 against ssd2_chunk_scan's 320.5
// / 320.3 (L8192: 1271.5): level, with 35% fewer instructions (99.9 M against 152.9 M, ncu) at 2.5
// warps a scheduler (3.9 for ssd2_chunk_scan's four CTAs an SM), stalled on the long scoreboard
// (1.97 cycles an instruction: the ring's mbarrier waits) and the short one (1.33): hence the
// third consumer. With three and 16-bit C B^T (W x waited block by block; a 48-64 byte stack
// frame, the producer's loop state at 24 registers): 252.9 / 252.8 us against ssd2_chunk_scan's
// 320.1 / 320.6 in the same lease, the forward 452 against 518 us of kernels, L8192 951.8 (ssd2_chunk_cb 9.7 -> 11.5:
// its 16-bit stores). The default where it applies (src/ops/ssd_scan_ws.rs; FLASHSCAN_SSD_SCAN_WS=0
// keeps ssd2_chunk_scan).
// ssd2_chunk_scan_ws_pipe (2026-12-05; opt-in, FLASHSCAN_SSD_SCAN_WS_PIPE=1, until it has run on a
// GPU: written in a session whose device starts were refused; predicted 200-220 us at b8 L2048
// against 248, from the ncu read of this stop: 0.45 instructions issued a cycle a scheduler, under
// one eligible warp, the tensor pipe ~20% busy): nothing waits for a group it does not need.
// C.H^T's k-steps issue back to back, block 0's W is built while they run, then acc = exp(cum_l)
// C.H^T (one rescale); below the diagonal W = (C B^T g_l) f_s whole, so the diagonal block needs
// no rescale of acc either and block j + 1's W is built in the second A buffer while block j's
// group runs. setmaxnreg 56 / 152: no stack.
// tests/test_ssd_fwd2_model.py models its factoring against float64.
#if FS_SSD_STATE_WGMMA && FS_CHUNK == 256

// A compile-time int for a generic lambda's argument (the W x loop's block and A buffer).
template <int N>
struct Int {
    static constexpr int value = N;
};

constexpr int kWsConsumers = 3;                       // consumer warpgroups (1, 2, 3; 0 produces)
constexpr int kWsThreads = (kWsConsumers + 1) * kThreads;
// setmaxnreg: 128 x 24 + 384 x 160 (ssd2_chunk_scan_ws), 128 x 56 + 384 x 152 (the _pipe form): the
// 65536 registers of the 512-thread launch either way. ptxas compiles each role's code under its
// own count: at 24 the producer's loop state spills to a 48-64 byte stack frame (the frame
// test_kernels_compile bounds), at 56 it does not; the pipelined consumers use R0-R147.
constexpr int kWsProducerRegs = 24, kWsConsumerRegs = 160;
constexpr int kWsPipeProducerRegs = 56, kWsPipeConsumerRegs = 152;
// ssd2_chunk_scan_ws_pipe: W x software-pipelined, block j + 1's W built in the second A buffer
// while block j's group runs (commit 6472b88 had tried it at two consumers with fp32 C B^T: level).
constexpr int kWsStages = 4;
constexpr int kWsTile = kRows * 64 * 2;               // one 64 x 64 16-bit tile, swizzled
constexpr int kWsStageBytes = 2 * kWsTile;            // x + the C B^T block, or C + H
constexpr int kWsPrepBytes = 2 * kQ * 4;              // lw, cum
static_assert(kWsStageBytes % 1024 == 0, "ring stages must keep the 1024-byte swizzle alignment");
static_assert(kNb == 4, "the row tiles' unrolled W x loops are chunk 256's");

// Dynamic shared memory of ssd2_chunk_scan_ws (host: ssd_scan_ws::SMEM_BYTES): the rings, then per
// consumer two prep buffers, s_f (kQ floats) and s_d (64 floats), a zero seg row (kQ ints), the
// mbarriers; plus 1024 bytes to align the rings.
constexpr int kWsRingBytes = kWsStages * kWsStageBytes;
constexpr int kWsPrepOff = kWsConsumers * kWsRingBytes;
constexpr int kWsFOff = kWsPrepOff + kWsConsumers * 2 * kWsPrepBytes;
constexpr int kWsDOff = kWsFOff + kWsConsumers * kQ * 4;
constexpr int kWsSegOff = kWsDOff + kWsConsumers * 64 * 4;
constexpr int kWsBarOff = kWsSegOff + kQ * 4;
constexpr int kWsBarsPer = 2 * kWsStages + 4;  // full, empty, prep full, prep empty
constexpr int kWsSmemBytes = 1024 + kWsBarOff + 8 * kWsConsumers * kWsBarsPer;

// The kernel's one parameter (host mirror: Ssd2WsParams in src/ops/ssd_scan_ws.rs): maps first.
struct Ssd2WsParams {
    fs::TensorMap tm_x;   // x (headdim, nheads, seqlen, batch), box 64 x 1 x 64 x 1
    fs::TensorMap tm_c;   // C (dstate, ngroups, seqlen, batch), box 64 x 1 x 64 x 1
    fs::TensorMap tm_h;   // the 16-bit H_c (dstate, headdim, nheads, batch * nchunks), box 64 x 64 x 1 x 1
    fs::TensorMap tm_cb;  // C B^T in x's dtype (kQ, batch * nchunks * ngroups * kQ rows), box 64 x 64
    Ssd2Params q;
    int nunits;  // batch * nchunks * nheads * ceil(headdim / 64)
};

// The kernel's body: kPipe, W x software-pipelined (ssd2_chunk_scan_ws_pipe), else waited block by
// block (ssd2_chunk_scan_ws, the default).
template <bool kPipe>
__device__ __forceinline__ void chunk_scan_ws(const Ssd2WsParams& P) {
    constexpr int kProducerRegs = kPipe ? kWsPipeProducerRegs : kWsProducerRegs;
    constexpr int kConsumerRegs = kPipe ? kWsPipeConsumerRegs : kWsConsumerRegs;
    const Ssd2Params& q = P.q;
    const SsdParams& p = q.p;
    extern __shared__ __align__(16) unsigned char ws_raw[];
    unsigned char* const sm = align_smem_1024(ws_raw);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int wgi = warp >> 2;  // warpgroup: 0 produces, 1.. consume
    const bool producer = wgi == 0;
    // the ring this thread serves: producer warp w < kWsConsumers serves consumer w's
    const int ci = producer ? warp : wgi - 1;
    unsigned char* const ring = sm + min(ci, kWsConsumers - 1) * kWsRingBytes;
    auto stage = [&](int s) { return smem_u32(ring + s * kWsStageBytes); };
    const u32 bars = smem_u32(sm + kWsBarOff) + min(ci, kWsConsumers - 1) * kWsBarsPer * 8;
    auto full = [&](int s) { return bars + 8 * s; };
    auto empty = [&](int s) { return bars + 8 * (kWsStages + s); };
    auto pfull = [&](int k) { return bars + 8 * (2 * kWsStages + k); };
    auto pempty = [&](int k) { return bars + 8 * (2 * kWsStages + 2 + k); };
    float* const prep_buf = (float*)(sm + kWsPrepOff) + min(ci, kWsConsumers - 1) * 2 * 2 * kQ;
    float* const s_f = (float*)(sm + kWsFOff) + min(ci, kWsConsumers - 1) * kQ;
    float* const s_d = (float*)(sm + kWsDOff) + min(ci, kWsConsumers - 1) * 64;
    int* const s_seg = (int*)(sm + kWsSegOff);

    if (threadIdx.x == 0) {
        u32 dyn;
        asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
        if (dyn < (u32)kWsSmemBytes) __trap();  // the host's ssd_scan_ws::SMEM_BYTES is off
        for (int w = 0; w < kWsConsumers; ++w) {
            const u32 bw = smem_u32(sm + kWsBarOff) + w * kWsBarsPer * 8;
            for (int s = 0; s < kWsStages; ++s) {
                mbar_init(bw + 8 * s, 1);                       // full: the producer's expect_tx
                mbar_init(bw + 8 * (kWsStages + s), kThreads);  // empty: the consumer's threads
            }
            for (int k = 0; k < 2; ++k) {
                mbar_init(bw + 8 * (2 * kWsStages + k), 1);
                mbar_init(bw + 8 * (2 * kWsStages + 2 + k), kThreads);
            }
        }
        mbar_init_fence();
    }
    for (int i = threadIdx.x; i < kQ; i += kWsThreads) s_seg[i] = 0;  // no seq_idx: every seg 0
    __syncthreads();

    const int npt = (int)((p.headdim + 63) / 64), nh = (int)p.nheads, nc = (int)p.nchunks;
    const int heads_per_group = nh / (int)p.ngroups;
    const int ds = (int)p.dstate, nsteps = (ds + 63) / 64;
    struct Unit {
        int b, c, h, g, p0, len;
        bool has_h;
    };
    auto unit = [&](int u) {
        Unit t;
        t.p0 = (u % npt) * 64;
        u /= npt;
        t.h = u % nh;
        u /= nh;
        t.c = u % nc;
        t.b = u / nc;
        t.g = t.h / heads_per_group;
        t.len = (int)min((i64)kQ, p.seqlen - (i64)t.c * kQ);
        t.has_h = t.c > 0 || p.has_init;
        return t;
    };
    // consumer ci's units: ci + kWsConsumers * blockIdx.x, then every kWsConsumers * gridDim.x on
    const int u0 = blockIdx.x * kWsConsumers + ci, ustep = gridDim.x * kWsConsumers;

    if (producer) {
        setmaxnreg_dec<kProducerRegs>();
        if (warp >= kWsConsumers || lane != 0) return;  // one thread issues a ring's every load
        tma_prefetch_map(&P.tm_x);
        tma_prefetch_map(&P.tm_c);
        tma_prefetch_map(&P.tm_h);
        tma_prefetch_map(&P.tm_cb);
        int s = 0;
        u32 ph = 0;
        int k = 0;
        for (int u = u0; u < P.nunits; u += ustep, ++k) {
            const Unit t = unit(u);
            const int c0 = t.c * kQ, pb = k & 1;
            const i64 bh = (i64)t.b * nh + t.h;
            mbar_wait(pempty(pb), ((k >> 1) & 1) ^ 1);
            mbar_arrive_expect_tx(pfull(pb), kWsPrepBytes);
            bulk_load(smem_u32(prep_buf + pb * 2 * kQ), q.prep + (bh * nc + t.c) * 3 * kQ, kWsPrepBytes, pfull(pb));
            for (int i = kNb - 1; i >= 0; --i) {
                const int m0 = i * kRows;
                if (m0 >= t.len) continue;  // (the consumer skips the same tiles)
                if (t.has_h) {
                    for (int kk = 0; kk < nsteps; ++kk) {
                        mbar_wait(empty(s), ph ^ 1);
                        mbar_arrive_expect_tx(full(s), kWsStageBytes);
                        tma_load_4d(stage(s), &P.tm_c, 64 * kk, t.g, c0 + m0, t.b, full(s));
                        tma_load_4d(stage(s) + kWsTile, &P.tm_h, 64 * kk, t.p0, t.h, t.b * nc + t.c, full(s));
                        if (++s == kWsStages) s = 0, ph ^= 1;
                    }
                }
                const int cb_row = ((t.b * nc + t.c) * (int)p.ngroups + t.g) * kQ + m0;
                for (int j = 0; j <= i; ++j) {
                    mbar_wait(empty(s), ph ^ 1);
                    mbar_arrive_expect_tx(full(s), kWsStageBytes);  // x, then the C B^T block
                    tma_load_4d(stage(s), &P.tm_x, t.p0, t.h, c0 + j * kRows, t.b, full(s));
                    tma_load_4d(stage(s) + kWsTile, &P.tm_cb, j * kRows, cb_row, 0, 0, full(s));
                    if (++s == kWsStages) s = 0, ph ^= 1;
                }
            }
        }
        return;
    }
    setmaxnreg_inc<kConsumerRegs>();

    // ---- consumer ci: its thread tid owns rows r0, r0 + 8 of the tile (warp cw's 16)
    const int tid = threadIdx.x & (kThreads - 1), cw = tid >> 5, t2 = 2 * (lane & 3);
    const int r0 = 16 * cw + (lane >> 2);
    const u32 bar_id = 1 + ci;  // the warpgroup's named barrier (0 is __syncthreads)
    int s = 0;
    u32 ph = 0;
    int k = 0;
    for (int u = u0; u < P.nunits; u += ustep, ++k) {
        const Unit t = unit(u);
        const int c0 = t.c * kQ, pb = k & 1, hd = (int)p.headdim - t.p0;
        named_bar_sync(bar_id, kThreads);  // the last unit's readers of s_d and s_f are done
        if (tid < 64) s_d[tid] = channel_d(p, t.h, t.p0 + tid, tid < hd);
        mbar_wait(pfull(pb), (k >> 1) & 1);
        const float* s_lw = prep_buf + pb * 2 * kQ;
        const float* s_cum = s_lw + kQ;
        // a row tile: C.H^T, then W x over its blocks (unrolled: kI compile-time), the epilogue
        auto tile = [&](auto ic) {
            constexpr int kI = decltype(ic)::value;
            const int m0 = kI * kRows;
            if (m0 >= t.len) return;
            // f_s = 2^(cl2_m0 - lw_s) for s < m0 (accumulate_cbf_x's factor), published with s_d
            const float cl2_m0 = s_cum[m0] * kLog2e;
            if constexpr (kI < kNb - 1) named_bar_sync(bar_id, kThreads);  // the last tile's s_f readers
            for (int s2 = tid; s2 < m0; s2 += kThreads) s_f[s2] = ex2(cl2_m0 - s_lw[s2]);
            named_bar_sync(bar_id, kThreads);
            // C B^T of stage s (rows r0, r0 + 8; columns 8 jn + t2, + 1): a swizzled 16-bit tile
            auto read_cb = [&](float(&cbv)[8][4]) {
                const unsigned char* s_cb = ring + s * kWsStageBytes + kWsTile;
#pragma unroll
                for (int jn = 0; jn < 8; ++jn)
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) {
                        const float2 v = unpack2<DT>(*(const u32*)(s_cb + swz_offset(kRows, r0 + 8 * hh, 8 * jn + t2)));
                        cbv[jn][2 * hh] = v.x;
                        cbv[jn][2 * hh + 1] = v.y;
                    }
            };
            // one C.H^T k-step (C and H tiles of stage s) on d, committed: the caller waits
            auto ch_step = [&](float(&d)[32]) {
                mbar_wait(full(s), ph);
                const u64 dc = wgmma_desc(stage(s), 16, 1024);
                const u64 dh = wgmma_desc(stage(s) + kWsTile, 16, 1024);
                wgmma_fence();
#pragma unroll
                for (int k4 = 0; k4 < 4; ++k4) wgmma_ss<64, DT, 0>(d, desc_at(dc, k4 * 32), desc_at(dh, k4 * 32), 1);
                wgmma_commit();
            };
            if constexpr (kPipe) {
                float acc[8][4];
                clear(acc);
                float(&d)[32] = *reinterpret_cast<float(*)[32]>(&acc[0][0]);
                float cl2[2];
                int seg_l[2], l_of[2];
                row_terms(m0 + r0, t.len, s_cum, s_seg, l_of, cl2, seg_l);
                // g_l = exp(cum_l - cum_m0): below the diagonal W = (C B^T g_l) f_s is built whole,
                // so no group waits for a rescale of acc
                const float g[2] = {ex2(cl2[0] - cl2_m0), ex2(cl2[1] - cl2_m0)};
                // Groups in flight: every group owns one stage, released once a later group's
                // wgmma_wait<1> (or the tile's last wait) shows it finished. C.H^T's k-steps are
                // issued back to back (at most two of their stages held, so block 0's stage and one
                // more stay free in the ring of four), block 0's W is built while they run, then
                // acc = exp(cum_l) C.H^T and the blocks follow, block j + 1's W built while block j's
                // group runs.
                int prev = -1;
                if (t.has_h) {  // y_l += exp(cum_l) C_l . H_c
                    for (int kk = 0; kk < nsteps; ++kk) {
                        ch_step(d);
                        wgmma_wait<1>();  // (a no-op at kk == 0: the last tile ended on wgmma_wait<0>)
                        if (prev >= 0) mbar_arrive(empty(prev));
                        prev = s;
                        if (++s == kWsStages) s = 0, ph ^= 1;
                    }
                }
                // W x, software-pipelined over two A buffers (block kJ in ab[kJ & 1]); the blocks and
                // the diagonal are compile-time, and every wait is unconditional: where ptxas cannot
                // prove a group finished before acc or an A buffer is written (a run-time condition
                // around a wait), it waits after every HGMMA of the kernel.
                u32 ab[2][4][4];
                int sd = 0;
                auto block = [&](auto jc) {
                    constexpr int kJ = decltype(jc)::value, kBuf = kJ & 1;
                    mbar_wait(full(s), ph);
                    float cbv[8][4];
                    read_cb(cbv);
                    if constexpr (kJ < kI) {  // W = (C B^T g_l) f_s
#pragma unroll
                        for (int jn = 0; jn < 8; ++jn)
#pragma unroll
                            for (int e = 0; e < 4; ++e) cbv[jn][e] *= g[e >> 1];
#pragma unroll
                        for (int k4 = 0; k4 < 4; ++k4) w_frag_cbf(ab[kBuf][k4], cbv, k4, kJ * kRows, s_f);
                    } else {  // the masked W carries its whole decay
#pragma unroll
                        for (int k4 = 0; k4 < 4; ++k4)
                            w_frag_masked(ab[kBuf][k4], cbv, k4, kJ * kRows, l_of, cl2, seg_l, t.len, s_lw, s_seg);
                    }
                    if constexpr (kJ == 0) {  // C.H^T's groups: done, their last stage freed, acc scaled
                        wgmma_wait<0>();
                        reg_fence(d);
                        if (t.has_h) {
                            mbar_arrive(empty(prev));
#pragma unroll
                            for (int hh = 0; hh < 2; ++hh) scale_row(acc, hh, ex2(cl2[hh]));
                        }
                    }
                    const u64 dx = wgmma_desc(stage(s), 64 * 128, 1024);
                    wgmma_fence();
#pragma unroll
                    for (int k4 = 0; k4 < 4; ++k4) wgmma_rs<64, DT, 1>(d, ab[kBuf][k4], desc_at(dx, k4 * 16 * 128), 1);
                    wgmma_commit();
                    if constexpr (kJ > 0) {
                        wgmma_wait<1>();  // block kJ - 1's group: its A buffer and stage are free
                        mbar_arrive(empty(prev));
                    }
                    if constexpr (kJ < kI) prev = s;
                    else sd = s;  // (the diagonal block's stage stays for the epilogue)
                    if (++s == kWsStages) s = 0, ph ^= 1;
                };
                block(Int<0>{});
                if constexpr (kI >= 1) block(Int<1>{});
                if constexpr (kI >= 2) block(Int<2>{});
                if constexpr (kI >= 3) block(Int<3>{});
                wgmma_wait<0>();
                reg_fence(d);
                // epilogue: D x from the diagonal block's x tile (its stage released after), store
                store_y<true>(q, acc, (const u16*)(ring + sd * kWsStageBytes), nullptr, s_d, t.b, t.h, c0 + m0,
                              t.len - m0, t.p0, hd, r0, t2);
                mbar_arrive(empty(sd));
            } else {  // W x waited block by block (the default)
                float acc[8][4];
                clear(acc);
                float(&d)[32] = *reinterpret_cast<float(*)[32]>(&acc[0][0]);
                if (t.has_h) {  // y_l += exp(cum_m0) C_l . H_c, g_l = exp(cum_l - cum_m0) before the diagonal
                    for (int kk = 0; kk < nsteps; ++kk) {
                        ch_step(d);
                        wgmma_wait<0>();
                        reg_fence(d);
                        mbar_arrive(empty(s));
                        if (++s == kWsStages) s = 0, ph ^= 1;
                    }
                    const float e = ex(s_cum[m0]);
#pragma unroll
                    for (int hh = 0; hh < 2; ++hh) scale_row(acc, hh, e);
                }
                float cl2[2];
                int seg_l[2], l_of[2];
                row_terms(m0 + r0, t.len, s_cum, s_seg, l_of, cl2, seg_l);
                // W x, one block at a time (wx_wgmma waits for its group). Unrolled (block and
                // diagonal compile-time): where ptxas cannot prove a group finished before acc or an
                // A fragment is written (a run-time condition around a wait), it waits after every
                // HGMMA of the kernel.
                int sd = 0;
                auto block = [&](auto jc) {
                    constexpr int kJ = decltype(jc)::value;
                    mbar_wait(full(s), ph);
                    float cbv[8][4];
                    read_cb(cbv);
                    u32 a[4][4];
                    if constexpr (kJ < kI) {
#pragma unroll
                        for (int k4 = 0; k4 < 4; ++k4) w_frag_cbf(a[k4], cbv, k4, kJ * kRows, s_f);
                    } else {
#pragma unroll
                        for (int hh = 0; hh < 2; ++hh) scale_row(acc, hh, ex2(cl2[hh] - cl2_m0));
#pragma unroll
                        for (int k4 = 0; k4 < 4; ++k4)
                            w_frag_masked(a[k4], cbv, k4, kJ * kRows, l_of, cl2, seg_l, t.len, s_lw, s_seg);
                    }
                    wx_wgmma(acc, a, stage(s));
                    if constexpr (kJ < kI) mbar_arrive(empty(s));
                    else sd = s;  // (the diagonal block's stage stays for the epilogue)
                    if (++s == kWsStages) s = 0, ph ^= 1;
                };
                block(Int<0>{});
                if constexpr (kI >= 1) block(Int<1>{});
                if constexpr (kI >= 2) block(Int<2>{});
                if constexpr (kI >= 3) block(Int<3>{});
                wgmma_wait<0>();
                reg_fence(d);
                // epilogue: D x from the diagonal block's x tile (its stage released after), store
                store_y<true>(q, acc, (const u16*)(ring + sd * kWsStageBytes), nullptr, s_d, t.b, t.h, c0 + m0,
                              t.len - m0, t.p0, hd, r0, t2);
                mbar_arrive(empty(sd));
            }
        };
        tile(Int<3>{});
        tile(Int<2>{});
        tile(Int<1>{});
        tile(Int<0>{});
        mbar_arrive(pempty(pb));  // this unit's record is read
    }
}
extern "C" __global__ void __launch_bounds__(kWsThreads, 1) ssd2_chunk_scan_ws(const __grid_constant__ Ssd2WsParams P) {
    chunk_scan_ws<false>(P);
}
extern "C" __global__ void __launch_bounds__(kWsThreads, 1)
    ssd2_chunk_scan_ws_pipe(const __grid_constant__ Ssd2WsParams P) {
    chunk_scan_ws<true>(P);
}
#endif
