/*
 * 01_naive.cu — attention as the textbook writes it: S and P materialized in
 * global memory, three kernels.
 *
 * Previous step: tutorials/02_naive_attention.c does the same on the CPU.
 * What this rung is (the baseline every later rung is measured against):
 *   1. scores:  S[b][h][i][j] = logit(scale q_i . k_j), or -inf where masked.
 *               One thread per (i, j), 256 consecutive keys per block; q_i is
 *               the same for the whole block (a broadcast), k_j is read as
 *               16-byte pieces straight from global memory (L1/L2).     float S
 *   2. softmax: one warp per row: max, sum of e^{s - max}, then
 *               P = e^{s - max} / sum rounded to T (what a plain bf16/fp16
 *               attention does, and what fa_check's emulation does), and
 *               LSE = max + ln sum.                                      T P
 *   3. P V:     O[b][i][h][c] = sum_j P[i][j] v_j[c]: one thread per output
 *               element, d consecutive threads per row (coalesced V reads,
 *               P broadcast).
 *   Causal and windowed masks only shorten the P V loop (kernel 3 visits the
 *   visible key range); kernels 1 and 2 still write and read all of S and P.
 * Why it is slower than rung 02 (the two costs FlashAttention removes):
 *   - no reuse on chip: each FMA of kernels 1 and 3 loads its operands from
 *     L1/L2 (kernel 1: 16 bytes of K per 8 FMAs; kernel 3: one P and one V
 *     value per FMA), so the FMA units wait on load bandwidth, not the other way
 *     round; rung 02 reuses every 16-byte shared-memory read for 8-16 FMAs;
 *   - the N x N round trip: S (float) written and read, P (T) written and read.
 * Memory traffic it expects (per head, N = seqlen_q = seqlen_k): 4 N^2 bytes of
 *   S written + read, 2 N^2 bytes of P written + read (12 N^2 bytes), on top of
 *   Q, K, V, O. At N = 16384, H = 16: 51.5 GB — about 12 ms at the H200's
 *   ~4.3 TB/s; the rest of the time is the unblocked products.
 * Workspace: S float [batch][heads][seqlen_q][seqlen_k], P T, same shape:
 *   6 bytes per score (26 GB at N = 16384, H = 16) — the memory FlashAttention avoids.
 */
#include "ladder.h"

namespace {

constexpr int SCORE_NT = 256, SOFTMAX_NT = 256;

/* 1. S = logit(scale Q K^T), -inf where masked. Grid (ceil(Sk / 256), Sq, batch * heads). */
template <typename T, int D>
__global__ void naive_scores(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, float *__restrict__ S)
{
    const long long j = blockIdx.x * (long long)SCORE_NT + threadIdx.x;
    const long long i = blockIdx.y;
    const int bh = blockIdx.z, b = bh / p.heads, h = bh % p.heads;
    if (j >= p.seqlen_k) return;
    float s = -INFINITY;
    if (mask_visible(p, i, j)) {
        const T *qi = q + bshd(b, i, h, p.seqlen_q, p.heads, D);
        const T *kj = k + bshd(b, j, kv_head(p, h), p.seqlen_k, p.heads_k, D);
        float dot = 0.0f;
#pragma unroll 4
        for (int c = 0; c < D; c += 8) {
            float a[8], x[8];
            to_float8(*reinterpret_cast<const uint4 *>(qi + c), a, (T *)nullptr);
            to_float8(*reinterpret_cast<const uint4 *>(kj + c), x, (T *)nullptr);
#pragma unroll
            for (int e = 0; e < 8; e++) dot = fmaf(a[e], x[e], dot);
        }
        s = logit(p, dot * p.scale);
    }
    S[((long long)bh * p.seqlen_q + i) * p.seqlen_k + j] = s;
}

/* 2. P = softmax(S) rounded to T, LSE. One warp per row; grid covers batch * heads * seqlen_q rows. */
template <typename T>
__global__ void naive_softmax(attn_shape p, const float *__restrict__ S, T *__restrict__ P, float *__restrict__ lse)
{
    const long long row = (blockIdx.x * (long long)SOFTMAX_NT + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (row >= (long long)p.batch * p.heads * p.seqlen_q) return;
    const float *s = S + row * p.seqlen_k;
    T *pr = P + row * p.seqlen_k;
    float mx = -INFINITY;
    for (int j = lane; j < p.seqlen_k; j += 32) mx = fmaxf(mx, s[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    const float ms = mx == -INFINITY ? 0.0f : mx; /* a row with no visible key */
    float sum = 0.0f;
    for (int j = lane; j < p.seqlen_k; j += 32) sum += expf(s[j] - ms);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = lane; j < p.seqlen_k; j += 32) pr[j] = from_float<T>(expf(s[j] - ms) * inv);
    if (lane == 0) lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY; /* row = (b h) i: LSE's layout */
}

/* 3. O = P V. Block (D, 256 / D): threadIdx.x = column, threadIdx.y = one of 256/D query rows. */
template <typename T, int D>
__global__ void naive_pv(attn_shape p, const T *__restrict__ P, const T *__restrict__ v, T *__restrict__ o)
{
    const long long i = blockIdx.x * (long long)blockDim.y + threadIdx.y;
    const int bh = blockIdx.y, b = bh / p.heads, h = bh % p.heads, c = threadIdx.x;
    if (i >= p.seqlen_q) return;
    long long lo, hi;
    mask_key_range(p, i, i + 1, &lo, &hi);
    const T *pr = P + ((long long)bh * p.seqlen_q + i) * p.seqlen_k;
    const T *vc = v + bshd(b, 0, kv_head(p, h), p.seqlen_k, p.heads_k, D) + c;
    const long long vstride = (long long)p.heads_k * D;
    float acc = 0.0f;
    for (long long j = lo; j < hi; j++) acc = fmaf(to_float(pr[j]), to_float(vc[j * vstride]), acc);
    o[bshd(b, i, h, p.seqlen_q, p.heads, D) + c] = from_float<T>(acc);
}

template <typename T, int D> cudaError_t launch(const fwd_args &a)
{
    const attn_shape &p = a.sh;
    float *S = static_cast<float *>(a.work);
    T *P = reinterpret_cast<T *>(S + (size_t)p.batch * p.heads * p.seqlen_q * p.seqlen_k);
    const dim3 g1((p.seqlen_k + SCORE_NT - 1) / SCORE_NT, p.seqlen_q, p.batch * p.heads);
    naive_scores<T, D><<<g1, SCORE_NT, 0, a.stream>>>(p, static_cast<const T *>(a.q), static_cast<const T *>(a.k), S);
    const long long rows = (long long)p.batch * p.heads * p.seqlen_q;
    naive_softmax<T><<<(unsigned)((rows * 32 + SOFTMAX_NT - 1) / SOFTMAX_NT), SOFTMAX_NT, 0, a.stream>>>(p, S, P, a.lse);
    const dim3 b3(D, 256 / D), g3((p.seqlen_q + b3.y - 1) / b3.y, p.batch * p.heads);
    naive_pv<T, D><<<g3, b3, 0, a.stream>>>(p, P, static_cast<const T *>(a.v), static_cast<T *>(a.o));
    return cudaGetLastError();
}

} // namespace

size_t naive_workspace_bytes(const attn_shape &p)
{
    return (sizeof(float) + 2) * (size_t)p.batch * p.heads * p.seqlen_q * p.seqlen_k;
}

cudaError_t naive_forward(const fwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch, a); }
