/*
 * fma_probe.cu — the FP32 CUDA-core ceiling, measured the way `flashattn bench`
 * measures the CPU's FMA peak: many independent chains of fused multiply-adds
 * in registers, no memory traffic, enough threads to fill every scheduler.
 *
 * Each thread runs 16 independent chains (the FMA latency is ~4 cycles, and 2+
 * warps per scheduler cover the rest), unrolled 16 deep: 256 FMAs per loop
 * branch, so the add/compare/branch of the loop costs ~1% of the issue slots
 * (an earlier 8 x 4 unroll, 32 FMAs per branch, measured ~10% under the
 * datasheet peak for that reason); x and y come from the launch, so the
 * compiler cannot fold the loop; the sum is written only if it is a value no
 * input can produce, so the work cannot be removed as dead either. The ladder's
 * TFLOP/s are reported as a fraction of this number, measured in the same run.
 */
#include "ladder.h"

namespace {

__global__ void __launch_bounds__(256) fma_probe_kernel(float *sink, int iters, float x, float y)
{
    enum { CHAINS = 16 };
    float a[CHAINS];
#pragma unroll
    for (int c = 0; c < CHAINS; c++) a[c] = threadIdx.x * 1e-3f + c;
#pragma unroll 16
    for (int n = 0; n < iters; n++)
#pragma unroll
        for (int c = 0; c < CHAINS; c++) a[c] = fmaf(a[c], x, y);
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < CHAINS; c++) s += a[c];
    if (s == 1234.5f) sink[blockIdx.x * blockDim.x + threadIdx.x] = s;
}

} // namespace

double fma_probe_launch(float *sink, int blocks, int iters, cudaStream_t stream)
{
    /* x slightly below 1 and y small: the chains stay finite and normal for any iters */
    fma_probe_kernel<<<blocks, 256, 0, stream>>>(sink, iters, 0.999999f, 1e-6f);
    return 2.0 * 16.0 * (double)iters * blocks * 256.0;
}
