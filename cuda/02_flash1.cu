/*
 * 02_flash1.cu — FlashAttention-1: tiles in shared memory, online softmax,
 * in FlashAttention-1's loop order (key blocks outer, query blocks inner).
 *
 * Previous rung (01_naive.cu): S = scale Q K^T and P = softmax(S) were whole
 *   [seqlen_q][seqlen_k] matrices in global memory, written and read back by
 *   three kernels, and every product read its operands straight from global
 *   memory (L1/L2) with no reuse in registers.
 * What this rung adds (Dao et al. 2022, FlashAttention, Algorithm 1):
 *   - S and P never exist outside one Br x Bc = 64 x 64 tile, in registers and
 *     shared memory: the online softmax merges each key block into the running
 *     (m_i, l_i, O_i) of every query row, exactly;
 *   - the tile products read 16-byte pieces of float tiles in shared memory and
 *     reuse each one for 8 to 16 register FMAs (the warp products of common.cuh,
 *     the same ones rung 03 uses, so nothing in the tile code differs between
 *     02 and 03: the loop order does, and with it the per-block divide by l,
 *     the O/m/l round trips and the launch count listed below).
 *   The loop order is the paper's: for each key block j (outer, one kernel
 *   launch each, in order) and every query block i (inner, the blocks of the
 *   launch, in parallel):
 *       load K_j, V_j, Q_i, and O_i, m_i, l_i from global memory
 *       S = scale Q_i K_j^T; m~ = rowmax S; P = e^{S - m~}; l~ = rowsum P
 *       m_new = max(m_i, m~);  l_new = e^{m_i - m_new} l_i + e^{m~ - m_new} l~
 *       O_i = (l_i e^{m_i - m_new} O_i + e^{m~ - m_new} P V_j) / l_new
 *       write O_i, m_new, l_new back to global memory
 *   A last small kernel rounds O to T and writes LSE = m + ln l.
 * What it leaves out, and why it is slower than rung 03 (the point of this rung):
 *   - O_i (float), m_i and l_i make a round trip through global memory for every
 *     (i, j) tile, and Q_i is re-read and re-converted for every tile: per tile
 *     64 x d x (2 + 4 + 4) bytes of extra traffic, 2.5x what K_j and V_j cost;
 *   - O_i is rescaled and divided by l_new after every key block (rung 03
 *     divides once); the blocks of a launch cannot keep anything on chip
 *     between launches, and each launch is a grid-wide barrier (seqlen_k / 64
 *     launches per pass, each ending in a tail of idle SMs).
 *   Tensor cores, async copies and fp8 are left out, as in rung 03.
 * Memory traffic it expects (per head, N = seqlen_q = seqlen_k, Br = Bc = 64):
 *   K, V read once per query block, as in rung 03: 2 N d (N / 64) elements of T;
 *   plus per tile Q_i (T) and O_i (float, read and written): N/64 x N x d x
 *   (2 + 8) bytes. At N = 16384, d = 128, H = 16: 34 GB of K/V (as rung 03) plus
 *   86 GB of Q and O traffic, against 2.2 TFLOP; O_acc (128 MB) does not fit the
 *   60 MB L2, so most of the O traffic reaches HBM.
 * Workspace: O_acc float [batch][seqlen_q][heads][d], m and l float [batch][heads][seqlen_q].
 */
#include "ladder.h"

namespace {

constexpr int BR = 64, BC = 64, NT = 128, LDP = BC + 4;

template <int D> __host__ __device__ constexpr int ld() { return D + 4; }
template <int D> constexpr size_t smem_bytes() { return sizeof(float) * (2 * BR * ld<D>() + BR * LDP); }

/* O_acc = 0, m = -inf, l = 0 before the first key block. */
__global__ void flash1_init(float *oacc, long long n_o, float *m, float *l, long long n_row)
{
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < n_o; x += (long long)gridDim.x * blockDim.x) {
        oacc[x] = 0.0f;
        if (x < n_row) {
            m[x] = -INFINITY;
            l[x] = 0.0f;
        }
    }
}

/* One key block j0 against every query block (blockIdx.x) of every head. */
template <typename T, int D>
__global__ void __launch_bounds__(NT, D == 64 ? 3 : 2)
    flash1_step_kernel(attn_shape p, long long j0, const T *__restrict__ q, const T *__restrict__ k,
                       const T *__restrict__ v, float *__restrict__ oacc, float *__restrict__ mg,
                       float *__restrict__ lg)
{
    constexpr int LD = ld<D>(), DC = D / 8;
    extern __shared__ float4 smem_f4[];
    float *Qs = reinterpret_cast<float *>(smem_f4); /* [BR][LD] */
    float *KVs = Qs + BR * LD;                      /* [BC][LD]: K_j, then V_j */
    float *Ps = KVs + BC * LD;                      /* [BR][LDP] */

    const int h = blockIdx.y, b = blockIdx.z, hk = kv_head(p, h);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
    const long long i0 = (long long)blockIdx.x * BR;
    const int rows = min(BR, p.seqlen_q - (int)i0);
    long long jlo, jhi;
    mask_key_range(p, i0, i0 + rows, &jlo, &jhi);
    if (j0 + BC <= jlo || j0 >= jhi) return; /* this tile is fully masked: nothing changes */
    const int cols = (int)min((long long)BC, p.seqlen_k - j0);
    const long long qstride = (long long)p.heads * D, kstride = (long long)p.heads_k * D;

    load_tile<T, BR, D, LD, NT>(Qs, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows, p.scale);
    load_tile<T, BC, D, LD, NT>(KVs, k + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
    __syncthreads();

    float s[4][8];
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int u = 0; u < 8; u++) s[t][u] = 0.0f;
    warp_mm_abt<4, D, LD, LD>(s, Qs + warp * 16 * LD, KVs);
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

    /* the tile's own softmax statistics: m~ and l~ per row, P = e^{S - m~} */
    const float L2E = 1.4426950408889634f;
    float *Pw = Ps + warp * 16 * LDP;
    float mt[4], lt[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        float mx = s[t][0];
#pragma unroll
        for (int u = 1; u < 8; u++) mx = fmaxf(mx, s[t][u]);
        mt[t] = rowgroup_max(mx);
        const float msc = mt[t] == -INFINITY ? 0.0f : mt[t] * L2E;
        float sum = 0.0f;
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const float pv = exp2f(fmaf(s[t][u], L2E, -msc));
            sum += pv;
            Pw[(rg + 4 * t) * LDP + cg + 8 * u] = pv;
        }
        lt[t] = rowgroup_sum(sum);
    }

    __syncthreads(); /* everyone is done with K_j */
    load_tile<T, BC, D, LD, NT>(KVs, v + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
    __syncthreads();
    float pv[4][DC];
#pragma unroll
    for (int t = 0; t < 4; t++)
#pragma unroll
        for (int c = 0; c < DC; c++) pv[t][c] = 0.0f;
    warp_mm_ab<4, BC, D, LDP, LD>(pv, Pw, KVs);

    /* merge into the running O_i, m_i, l_i in global memory, and normalize. Every lane of a
       row group reads the row's m and l before the group's first lane writes them back. */
    float m_old[4], l_old[4];
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const long long i = i0 + warp * 16 + rg + 4 * t;
        const long long row = ((long long)b * p.heads + h) * p.seqlen_q + i;
        m_old[t] = i < p.seqlen_q ? mg[row] : -INFINITY;
        l_old[t] = i < p.seqlen_q ? lg[row] : 0.0f;
    }
    __syncwarp();
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const long long i = i0 + warp * 16 + rg + 4 * t;
        const float m_new = fmaxf(m_old[t], mt[t]);
        if (i >= p.seqlen_q || m_new == -INFINITY) continue; /* nothing visible yet: O stays 0 */
        const long long row = ((long long)b * p.heads + h) * p.seqlen_q + i;
        const float a_old = l_old[t] * expf(m_old[t] - m_new); /* 0 when m_old = -inf */
        const float a_new = expf(mt[t] - m_new);                /* 0 when m~ = -inf */
        const float l_new = a_old + a_new * lt[t];
        const float inv = 1.0f / l_new;
        float *orow = oacc + bshd(b, i, h, p.seqlen_q, p.heads, D);
#pragma unroll
        for (int u = 0; u < D / 32; u++) {
            float4 *op = reinterpret_cast<float4 *>(orow + 4 * cg + 32 * u);
            const float4 x = *op;
            *op = make_float4((a_old * x.x + a_new * pv[t][4 * u + 0]) * inv,
                              (a_old * x.y + a_new * pv[t][4 * u + 1]) * inv,
                              (a_old * x.z + a_new * pv[t][4 * u + 2]) * inv,
                              (a_old * x.w + a_new * pv[t][4 * u + 3]) * inv);
        }
        if (cg == 0) {
            mg[row] = m_new;
            lg[row] = l_new;
        }
    }
}

/* O = round(O_acc); LSE = m + ln l (-inf for a row that saw nothing). One thread per (row, 4 columns). */
template <typename T, int D>
__global__ void flash1_finish(attn_shape p, const float *__restrict__ oacc, const float *__restrict__ mg,
                              const float *__restrict__ lg, T *__restrict__ o, float *__restrict__ lse)
{
    const long long n4 = (long long)p.batch * p.seqlen_q * p.heads * D / 4;
    for (long long x = blockIdx.x * (long long)blockDim.x + threadIdx.x; x < n4; x += (long long)gridDim.x * blockDim.x) {
        const float4 a = reinterpret_cast<const float4 *>(oacc)[x];
        store4(o + 4 * x, a.x, a.y, a.z, a.w);
        if ((4 * x) % D == 0) { /* first piece of a row: the row's LSE */
            const long long r = 4 * x / D; /* (b, i, h) in BSHD order */
            const int h = (int)(r % p.heads);
            const long long i = (r / p.heads) % p.seqlen_q;
            const int b = (int)(r / ((long long)p.heads * p.seqlen_q));
            const long long row = ((long long)b * p.heads + h) * p.seqlen_q + i;
            lse[row] = lg[row] > 0.0f ? mg[row] + logf(lg[row]) : -INFINITY;
        }
    }
}

template <typename T, int D> cudaError_t launch(const fwd_args &a)
{
    const attn_shape &p = a.sh;
    const long long n_o = (long long)p.batch * p.seqlen_q * p.heads * D;
    const long long n_row = (long long)p.batch * p.heads * p.seqlen_q;
    float *oacc = static_cast<float *>(a.work), *mg = oacc + n_o, *lg = mg + n_row;
    flash1_init<<<1024, 256, 0, a.stream>>>(oacc, n_o, mg, lg, n_row);

    auto kern = flash1_step_kernel<T, D>;
    const size_t smem = smem_bytes<D>();
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((p.seqlen_q + BR - 1) / BR, p.heads, p.batch);
    for (long long j0 = 0; j0 < p.seqlen_k; j0 += BC) /* the outer loop: one launch per key block, in order */
        kern<<<grid, NT, smem, a.stream>>>(p, j0, static_cast<const T *>(a.q), static_cast<const T *>(a.k),
                                           static_cast<const T *>(a.v), oacc, mg, lg);
    flash1_finish<T, D><<<1024, 256, 0, a.stream>>>(p, oacc, mg, lg, static_cast<T *>(a.o), a.lse);
    return cudaGetLastError();
}

} // namespace

size_t flash1_workspace_bytes(const attn_shape &p)
{
    return sizeof(float) * ((size_t)p.batch * p.seqlen_q * p.heads * p.d + 2 * (size_t)p.batch * p.heads * p.seqlen_q);
}

cudaError_t flash1_forward(const fwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch, a); }
