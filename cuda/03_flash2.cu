/*
 * 03_flash2.cu — FlashAttention-2's forward pass on CUDA cores.
 *
 * Previous rung (02_flash1.cu): tiles in shared memory and the online softmax,
 *   but in FlashAttention-1's loop order — key blocks outer, query blocks
 *   inner — so every (query block, key block) tile re-reads Q_i and
 *   reads-modifies-writes O_i, m_i and l_i in global memory, and divides O_i
 *   by l_i after every key block. One launch per key block.
 * What this rung adds (Dao 2023, FlashAttention-2, Algorithm 1 and section 3.2):
 *   - the loops swap: one thread block owns one query block Q_i (Br = 64 rows)
 *     for the whole pass and streams K_j, V_j past it; O_i, m_i, l_i live in
 *     registers from the first key block to the last. One launch, grid
 *     (seqlen_q / Br, heads, batch): the sequence dimension is parallel too;
 *   - warps split the query rows (16 rows per warp, 4 warps), not the keys: a
 *     row's max and sum stay inside one warp (three shuffles), and no warp
 *     waits on another's partial results ("split-K" across warps is what
 *     FlashAttention-1's CUDA kernel did);
 *   - normalize once: acc = e^{m - m_new} acc + P V_j without any division;
 *     O_i = acc / l_i at the very end; l is even kept per thread (a partial
 *     row sum over the thread's 8 columns, all rescaled by the same factor)
 *     and reduced across the row group once, at the end;
 *   - the LSE (m_i + ln l_i) is written: the backward pass (03b) needs it;
 *   - causal and windowed masks by key range: a query block visits only key
 *     blocks [lo, hi) that some of its rows can see, masks element-wise only on
 *     tiles that straddle a mask edge, and blocks are launched heaviest first
 *     (causal: the last query blocks see the most keys), so the tail is short;
 *   - GQA (a kv head shared by heads / heads_k query heads), softcap, d = 64 or 128.
 * Teacher comment — the online softmax (same symbols as docs/ and tutorials/):
 *     for each key block j:   S = scale Q_i K_j^T            (Br x Bc, registers)
 *                             m_new = max(m, rowmax S)
 *                             P = e^{S - m_new}              (exp2 with log2 e folded in)
 *                             l = e^{m - m_new} l + rowsum P
 *                             acc = e^{m - m_new} acc + P V_j
 *                             m = m_new
 *     O_i = acc / l,  LSE_i = m + ln l                      (once)
 *   A row that sees no key keeps m = -inf and l = 0: O = 0, LSE = -inf.
 * What it leaves out (part 2 of the ladder): tensor cores (mma.sync, wgmma),
 *   cp.async / TMA pipelining (here a tile is loaded with plain 16-byte loads,
 *   converted to float once, and the second resident block of the SM overlaps
 *   its loads with our compute), fp8, split-KV for decoding.
 * Memory traffic it expects (per head, N = seqlen_q = seqlen_k, causal halves the K/V
 *   part): Q read once and O written once (2 N d elements of T) plus K and V read
 *   once per query block: 2 N d (N / Br). At N = 16384, d = 128, bf16, H = 16:
 *   16 x (8 MiB + 2 GiB) = 34 GB, against 2.2 TFLOP: 64 FLOP per byte, above the
 *   H200's ~14 FLOP/byte balance for FP32 CUDA cores (60 TFLOP/s over 4.3 TB/s),
 *   and one head's K and V (8 MiB) fit the 60 MB L2 (the hit rate was not measured). This rung is
 *   bound by the FMA issue rate and the shared-memory reads that feed it.
 * Shared memory (floats, LD = d + 4 padding): Q_i [64][LD] scaled by `scale`,
 *   K_j then V_j in one buffer [64][LD], P [64][68]: 83 KiB at d = 128, so two
 *   blocks (8 warps) share an SM; registers: acc 4 x d/8, S 4 x 8 per thread.
 */
#include "ladder.h"

namespace {

constexpr int BR = 64, BC = 64, NT = 128, LDP = BC + 4;

template <int D> __host__ __device__ constexpr int ld() { return D + 4; }
template <int D> constexpr size_t smem_bytes() { return sizeof(float) * (2 * BR * ld<D>() + BR * LDP); }

template <typename T, int D>
__global__ void __launch_bounds__(NT, D == 64 ? 3 : 2)
    flash2_forward_kernel(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                          T *__restrict__ o, float *__restrict__ lse)
{
    constexpr int LD = ld<D>(), DC = D / 8; /* DC: output columns per thread */
    extern __shared__ float4 smem_f4[];
    float *Qs = reinterpret_cast<float *>(smem_f4); /* [BR][LD] */
    float *KVs = Qs + BR * LD;                      /* [BC][LD]: K_j, then V_j */
    float *Ps = KVs + BC * LD;                      /* [BR][LDP] */

    const int qblock = gridDim.x - 1 - blockIdx.x; /* heaviest (causal) first */
    const int h = blockIdx.y, b = blockIdx.z, hk = kv_head(p, h);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
    const long long i0 = (long long)qblock * BR;
    const int rows = min(BR, p.seqlen_q - (int)i0);
    const long long qstride = (long long)p.heads * D, kstride = (long long)p.heads_k * D;

    load_tile<T, BR, D, LD, NT>(Qs, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows, p.scale);

    float acc[4][DC], m[4], l[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        m[t] = -INFINITY;
        l[t] = 0.0f;
#pragma unroll
        for (int c = 0; c < DC; c++) acc[t][c] = 0.0f;
    }

    long long jlo, jhi;
    mask_key_range(p, i0, i0 + rows, &jlo, &jhi);
    const float L2E = 1.4426950408889634f;
    const float *Qw = Qs + warp * 16 * LD;
    float *Pw = Ps + warp * 16 * LDP;

    for (long long j0 = (jlo / BC) * BC; j0 < jhi; j0 += BC) {
        const int cols = (int)min((long long)BC, p.seqlen_k - j0);
        __syncthreads(); /* everyone is done with V_{j-1} (and Q is loaded) */
        load_tile<T, BC, D, LD, NT>(KVs, k + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
        __syncthreads();

        float s[4][8];
#pragma unroll
        for (int t = 0; t < 4; t++)
#pragma unroll
            for (int u = 0; u < 8; u++) s[t][u] = 0.0f;
        warp_mm_abt<4, D, LD, LD>(s, Qw, KVs);

        if (p.softcap > 0.0f) {
#pragma unroll
            for (int t = 0; t < 4; t++)
#pragma unroll
                for (int u = 0; u < 8; u++) s[t][u] = logit(p, s[t][u]);
        }
        if (!mask_tile_full(p, i0, i0 + rows, j0, j0 + BC)) {
#pragma unroll
            for (int t = 0; t < 4; t++)
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const long long i = i0 + warp * 16 + rg + 4 * t, j = j0 + cg + 8 * u;
                    if (j >= p.seqlen_k || !mask_visible(p, i, j)) s[t][u] = -INFINITY;
                }
        }
        /* online softmax, one row at a time */
#pragma unroll
        for (int t = 0; t < 4; t++) {
            float mx = s[t][0];
#pragma unroll
            for (int u = 1; u < 8; u++) mx = fmaxf(mx, s[t][u]);
            const float m_new = fmaxf(m[t], rowgroup_max(mx));
            const float msc = m_new == -INFINITY ? 0.0f : m_new * L2E; /* a row with nothing visible yet */
            const float alpha = exp2f(fmaf(m[t], L2E, -msc));          /* e^{m - m_new}; 0 when m = -inf */
            float sum = 0.0f;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const float pv = exp2f(fmaf(s[t][u], L2E, -msc));
                sum += pv;
                Pw[(rg + 4 * t) * LDP + cg + 8 * u] = pv;
            }
            l[t] = fmaf(l[t], alpha, sum);
            m[t] = m_new;
#pragma unroll
            for (int c = 0; c < DC; c++) acc[t][c] *= alpha;
        }

        __syncthreads(); /* everyone is done with K_j */
        load_tile<T, BC, D, LD, NT>(KVs, v + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
        __syncthreads(); /* V_j and this warp's P rows are visible */
        warp_mm_ab<4, BC, D, LDP, LD>(acc, Pw, KVs);
    }

    /* normalize once; write O (T) and LSE */
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const float lsum = rowgroup_sum(l[t]);
        const long long i = i0 + warp * 16 + rg + 4 * t;
        if (i >= p.seqlen_q) continue;
        const float inv = lsum > 0.0f ? 1.0f / lsum : 0.0f;
        T *orow = o + bshd(b, i, h, p.seqlen_q, p.heads, D);
#pragma unroll
        for (int u = 0; u < D / 32; u++)
            store4(orow + 4 * cg + 32 * u, acc[t][4 * u] * inv, acc[t][4 * u + 1] * inv, acc[t][4 * u + 2] * inv,
                   acc[t][4 * u + 3] * inv);
        if (cg == 0)
            lse[((long long)b * p.heads + h) * p.seqlen_q + i] = lsum > 0.0f ? m[t] + logf(lsum) : -INFINITY;
    }
}

template <typename T, int D> cudaError_t launch(const fwd_args &a)
{
    auto kern = flash2_forward_kernel<T, D>;
    const size_t smem = smem_bytes<D>();
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((a.sh.seqlen_q + BR - 1) / BR, a.sh.heads, a.sh.batch);
    kern<<<grid, NT, smem, a.stream>>>(a.sh, static_cast<const T *>(a.q), static_cast<const T *>(a.k),
                                       static_cast<const T *>(a.v), static_cast<T *>(a.o), a.lse);
    return cudaGetLastError();
}

} // namespace

size_t flash2_workspace_bytes(const attn_shape &) { return 0; }

cudaError_t flash2_forward(const fwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch, a); }
