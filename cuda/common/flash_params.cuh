// common/flash_params.cuh: the attention kernels' by-value parameter blocks, one definition
// each: FlashFwdParams for flash_fwd.cu, flash_fwd_sm90.cu and flash_fwd_sm90_tma.cu (host mirror
// in src/ops/attention.rs), FlashBwdParams for flash_bwd.cu and flash_bwd_sm90.cu (host mirror in
// src/ops/attention_bwd.rs). Strides in elements. A varlen build (FS_VARLEN=1, flash_fwd.cu and
// flash_bwd.cu only) appends the packed-sequence fields; the other builds' layout ends before.
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
#if FS_VARLEN
    const int* cu_seqlens_q;  // (batch + 1) int32
    const int* cu_seqlens_k;
    int total_q, total_k;     // rows of q / k: every row bound is clamped to these
#endif
};
