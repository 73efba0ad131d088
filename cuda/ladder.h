/*
 * ladder.h — the rungs as the harness sees them: one forward (or backward)
 * launcher per rung and the workspace it needs. Each launcher enqueues its
 * kernels on args.stream and returns the launch status (cudaGetLastError);
 * it never synchronizes. d must be 64 or 128; the harness checks that.
 */
#ifndef FA_CUDA_LADDER_H
#define FA_CUDA_LADDER_H

#include "common.cuh"

/* 01_naive.cu: S and P materialized in global memory, three kernels. */
size_t naive_workspace_bytes(const attn_shape &sh);
cudaError_t naive_forward(const fwd_args &a);

/* 02_flash1.cu: FlashAttention-1 loop order, one launch per key block. */
size_t flash1_workspace_bytes(const attn_shape &sh);
cudaError_t flash1_forward(const fwd_args &a);

/* 03_flash2.cu: FlashAttention-2 forward. */
size_t flash2_workspace_bytes(const attn_shape &sh);
cudaError_t flash2_forward(const fwd_args &a);

/* 03b_flash2_bwd.cu: FlashAttention-2 backward (needs O and LSE of the forward). */
size_t flash2_bwd_workspace_bytes(const attn_shape &sh);
cudaError_t flash2_backward(const bwd_args &a);

/* 04_mma.cu: FlashAttention-2 forward on tensor cores (mma.sync m16n8k16, ldmatrix, cp.async). */
size_t mma_workspace_bytes(const attn_shape &sh);
cudaError_t mma_forward(const fwd_args &a);

/* 04b_mma_bwd.cu: its backward on tensor cores (needs O and LSE of the forward): FlashAttention-2's
 * single pass, dQ accumulated with float atomics (the default; run to run different in the last
 * bits of dQ), and the deterministic split (dQ by its own kernel, 7 tile products instead of 5). */
size_t mma_bwd_workspace_bytes(const attn_shape &sh);
cudaError_t mma_backward(const bwd_args &a);
size_t mma_bwd_det_workspace_bytes(const attn_shape &sh);
cudaError_t mma_backward_det(const bwd_args &a);

/* 05_hopper.cu: the forward on Hopper's wgmma (sm_90a only), 128-byte-swizzled tiles: fed by
 * cp.async (05), or by TMA through an mbarrier pipeline with a producer warpgroup (05ws). */
size_t hopper_workspace_bytes(const attn_shape &sh);
cudaError_t hopper_forward(const fwd_args &a);
cudaError_t hopper_ws_forward(const fwd_args &a);
/* 05pp: 05ws with the two consumer warpgroups taking turns on the tensor cores (named barriers). */
cudaError_t hopper_pp_forward(const fwd_args &a);

/* fma_probe.cu: the FP32 CUDA-core ceiling. Runs `iters` FMAs on 8 independent
 * chains per thread; returns FLOPs performed (2 per FMA). */
double fma_probe_launch(float *sink, int blocks, int iters, cudaStream_t stream);

#endif /* FA_CUDA_LADDER_H */
