// common/flash_params.cuh: the attention kernels' by-value parameter blocks, one definition
// each: FlashFwdParams for flash_fwd.cu, flash_fwd_sm90.cu and flash_fwd_sm90_tma.cu (host mirror
// in src/ops/attention.rs), FlashBwdParams for flash_bwd.cu and flash_bwd_sm90.cu (host mirror in
// src/ops/attention_bwd.rs). Strides in elements. A varlen build (FS_VARLEN=1: flash_fwd.cu,
// flash_bwd.cu and flash_fwd_sm90_tma.cu) appends the packed-sequence fields; the other builds'
// layout ends before. Such a build also gets the one reading of a packed sequence's rows from
// cu_seqlens (clamp_row, SeqRows, sequence_rows) that all three use.
#pragma once

#ifndef FS_VARLEN
#define FS_VARLEN 0
#endif

struct FlashFwdParams {
    const void* q;
    const void* k;
    const void* v;
    void* o;
    float* lse;  // nullable; (batch, nheads, seqlen_q) contiguous, natural-log LSE
    long long q_batch_stride, q_row_stride, q_head_stride;
    long long k_batch_stride, k_row_stride, k_head_stride;
    long long v_batch_stride, v_row_stride, v_head_stride;
    long long o_batch_stride, o_row_stride, o_head_stride;
    int batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim;
    float softmax_scale;
    float softcap;
    int window_left, window_right;
#if FS_VARLEN
    const int* cu_seqlens_q;  // (batch + 1) int32
    const int* cu_seqlens_k;
    int total_q, total_k;     // rows of q / k: every row index is clamped to these
#endif
};

struct FlashBwdParams {
    const void* q;
    const void* k;
    const void* v;
    const void* o;
    const void* dout;
    const float* lse;  // (batch, nheads, seqlen_q) contiguous, natural log, from the forward
    void* dq;
    void* dk;
    void* dv;
    float* dq_accum;   // scratch [nsplit][batch][nheads][seqlen_q_pad][FS_HEAD_DIM]
    float* dpsum;      // scratch [batch][nheads][seqlen_q_pad]: D = rowsum(dO * O)
    float* lse_log2;   // scratch [batch][nheads][seqlen_q_pad]
    long long q_batch_stride, q_row_stride, q_head_stride;
    long long k_batch_stride, k_row_stride, k_head_stride;
    long long v_batch_stride, v_row_stride, v_head_stride;
    long long o_batch_stride, o_row_stride, o_head_stride;
    long long do_batch_stride, do_row_stride, do_head_stride;
    long long dq_batch_stride, dq_row_stride, dq_head_stride;
    long long dk_batch_stride, dk_row_stride, dk_head_stride;
    long long dv_batch_stride, dv_row_stride, dv_head_stride;
    int batch, nheads, nheads_k, seqlen_q, seqlen_k, head_dim;
    int seqlen_q_pad;  // multiple of FS_BLOCK_M
    int nsplit;        // accumulator slices (1 unless deterministic)
    int deterministic;
    float softmax_scale;
    float softcap;
    int window_left, window_right;  // normalised: -1 = unbounded
    int kv_block0;  // flash_bwd_sm90.cu's deterministic walk: this launch's first kv block
#if FS_VARLEN
    const int* cu_seqlens_q;  // (batch + 1) int32
    const int* cu_seqlens_k;
    int total_q, total_k;     // rows of q / k: every row bound is clamped to these
#endif
};

#if FS_VARLEN
namespace fs {

// A row bound read from cu_seqlens, clamped into [0, total]: bad values give empty or short
// sequences, never a row outside the tensors.
__device__ __forceinline__ int clamp_row(int x, int total) { return min(max(x, 0), total); }

// Sequence b's rows of a packed (varlen) call, [q0, q0 + len_q) of q / o and [k0, k0 + len_k) of
// k / v: bounds clamped into [0, total], at most max_seqlen_q (= pk.seqlen_q) queries (the
// forward's grid covers no more; the backward's scratch holds seqlen_q_pad >= max_seqlen_q rows a
// sequence). Params: FlashFwdParams or FlashBwdParams. flash_fwd.cu reads the same bounds in the
// same order inline, returning between the query and the key bounds.
struct SeqRows {
    int q0, len_q, k0, len_k;
};
template <class Params>
__device__ __forceinline__ SeqRows sequence_rows(const Params& pk, int b) {
    SeqRows r;
    r.q0 = clamp_row(pk.cu_seqlens_q[b], pk.total_q);
    r.len_q = min(max(clamp_row(pk.cu_seqlens_q[b + 1], pk.total_q) - r.q0, 0), pk.seqlen_q);
    r.k0 = clamp_row(pk.cu_seqlens_k[b], pk.total_k);
    r.len_k = max(clamp_row(pk.cu_seqlens_k[b + 1], pk.total_k) - r.k0, 0);
    return r;
}

}  // namespace fs
#endif
