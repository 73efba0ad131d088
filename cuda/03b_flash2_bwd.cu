/*
 * 03b_flash2_bwd.cu — FlashAttention-2's backward pass on CUDA cores.
 *
 * Previous rung (03_flash2.cu): the forward pass, which leaves O and the LSE
 *   (m + ln l per query row) behind — all the backward needs to rebuild P.
 * What this rung adds (Dao 2023, FlashAttention-2, Algorithm 2), given dO:
 *     D_i  = dO_i . O_i                                 (kernel 1, one thread per row)
 *     P    = e^{s - LSE}       recomputed tile by tile, never stored
 *     dV   = P^T dO,   dP = dO V^T,   dS = P o (dP - D)  (o: elementwise)
 *     dS  *= 1 - (s / softcap)^2                        when softcap is on (s: the capped logit)
 *     dK   = scale dS^T Q,   dQ = scale dS K
 *   - kernel 2 (dK, dV): one thread block per key block K_j, V_j (64 keys, 8
 *     warps of 8 key rows); it walks the query blocks that can see it (the mask's
 *     query range) and, for GQA, every query head sharing the kv head, in a fixed
 *     order, keeping dK_j and dV_j in registers: the head sum is in-block;
 *   - kernel 3 (dQ): one thread block per query block (64 rows) walks the key
 *     blocks it can see and keeps dQ_i in registers.
 *   dQ is deterministic by this split: every element of dQ, dK and dV is summed
 *   by one thread in a fixed order; there are no atomics, so a run gives the same
 *   bits every time. The price: kernel 3 recomputes S and dP (2 of the 5 tile
 *   products) that kernel 2 already formed: 7 products instead of FlashAttention-2's
 *   5 (whose default accumulates dQ with atomic adds in float, in an order that
 *   changes from run to run; it also has a deterministic mode, which orders those
 *   adds at some cost in speed). TFLOP/s are counted on FlashAttention's 5 (2.5 x
 *   the forward). The score is recomputed here as scale (q . k), while the forward
 *   forms (scale q) . k: the recomputed P can differ from the forward's in the last
 *   bits (within the tolerance; D = dO . O is exact against dP's own order).
 * What it leaves out: tensor cores, asynchronous copies, and a dQ accumulation
 *   that avoids the recomputation (FlashAttention-3's semaphore-ordered atomics).
 * Memory traffic it expects (per head, N = seqlen_q = seqlen_k, blocks of 64):
 *   kernel 2 reads Q, dO (and LSE, D) once per key block: 2 N d (N / 64) elements;
 *   kernel 3 reads K, V once per query block: 2 N d (N / 64); both far below their
 *   FMA time (68 GB against 5.5 TFLOP counted, 80 FLOP per byte, at N = 16384,
 *   d = 128, H = 16).
 * Shared memory (floats, LD = d + 4): four [64][LD] tiles and one [64][68]
 *   (P^T, then dS^T): 150 KiB at d = 128 (one block of 8 warps per SM), 86 KiB at d = 64.
 */
#include "ladder.h"

namespace {

constexpr int BT = 64, NT = 256, LDP = BT + 4;
constexpr float L2E = 1.4426950408889634f;

template <int D> __host__ __device__ constexpr int ld() { return D + 4; }
template <int D> constexpr size_t smem_bytes() { return sizeof(float) * (4 * BT * ld<D>() + BT * LDP + 2 * BT); }

/* 1. D[b][h][i] = dO_i . O_i (float). One thread per row (b, h, i), one fmaf chain over
 *    c = 0 .. d-1: the same order in which the tile products form dP_ij = dO_i . v_j
 *    (common.cuh's warp_mm_abt). Where a row's whole probability sits on one key (seqlen_k = 1,
 *    say), O_i = v_j exactly, so dP_ij - D_i is exactly 0 and so are dS, dQ and dK — as they
 *    are mathematically; a differently ordered sum would leave float32 rounding noise there,
 *    which check-grad's rule (relative to max|G_ref| = 0) rightly rejects. */
template <typename T, int D>
__global__ void bwd_dot_do_o(attn_shape p, const T *__restrict__ o, const T *__restrict__ dout, float *__restrict__ Dg)
{
    const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (row >= (long long)p.batch * p.heads * p.seqlen_q) return;
    const long long i = row % p.seqlen_q;
    const int h = (int)((row / p.seqlen_q) % p.heads), b = (int)(row / ((long long)p.seqlen_q * p.heads));
    const long long base = bshd(b, i, h, p.seqlen_q, p.heads, D);
    float acc = 0.0f;
#pragma unroll 4
    for (int c = 0; c < D; c += 8) {
        float x[8], y[8];
        to_float8(*reinterpret_cast<const uint4 *>(o + base + c), x, (T *)nullptr);
        to_float8(*reinterpret_cast<const uint4 *>(dout + base + c), y, (T *)nullptr);
#pragma unroll
        for (int e = 0; e < 8; e++) acc = fmaf(y[e], x[e], acc);
    }
    Dg[row] = acc;
}

/* P and dS of one tile element: x = scale (q . k) (raw), dp = (dO V^T) element, lse, Drow of the query. */
struct pds {
    float p, ds;
};
__device__ inline pds tile_p_ds(const attn_shape &pb, float x, float dp, float lse, float Drow, bool visible)
{
    if (!visible) return {0.0f, 0.0f};
    const float s = logit(pb, x);
    const float p = exp2f(fmaf(s, L2E, -lse * L2E));
    float ds = p * (dp - Drow);
    if (pb.softcap > 0.0f) {
        const float th = s / pb.softcap; /* tanh(x / softcap) */
        ds *= 1.0f - th * th;
    }
    return {p, ds};
}

/* 2. dK_j, dV_j: grid (ceil(Sk / 64), heads_k, batch). Warp w owns key rows 8w .. 8w+7 of the block. */
template <typename T, int D>
__global__ void __launch_bounds__(NT, D == 64 ? 2 : 1)
    bwd_dk_dv(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
              const T *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg,
              T *__restrict__ dk, T *__restrict__ dv)
{
    constexpr int LD = ld<D>(), DC = D / 8;
    extern __shared__ float4 smem_f4[];
    float *Ks = reinterpret_cast<float *>(smem_f4), *Vs = Ks + BT * LD, *Qs = Vs + BT * LD, *dOs = Qs + BT * LD;
    float *Ps = dOs + BT * LD, *Ls = Ps + BT * LDP, *Ds = Ls + BT;

    const int hk = blockIdx.y, b = blockIdx.z, group = p.heads / p.heads_k;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
    const long long j0 = (long long)blockIdx.x * BT;
    const int cols = min(BT, p.seqlen_k - (int)j0);
    const long long qstride = (long long)p.heads * D, kstride = (long long)p.heads_k * D;

    load_tile<T, BT, D, LD, NT>(Ks, k + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
    load_tile<T, BT, D, LD, NT>(Vs, v + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
    const float *Kw = Ks + warp * 8 * LD, *Vw = Vs + warp * 8 * LD;
    float *Pw = Ps + warp * 8 * LDP;

    float dKa[2][DC], dVa[2][DC];
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int c = 0; c < DC; c++) dKa[t][c] = dVa[t][c] = 0.0f;

    long long ilo, ihi;
    mask_query_range(p, j0, j0 + cols, &ilo, &ihi);
    for (int g = 0; g < group; g++) {
        const int h = hk * group + g;
        for (long long i0 = (ilo / BT) * BT; i0 < ihi; i0 += BT) {
            const int rows = (int)min((long long)BT, p.seqlen_q - i0);
            __syncthreads(); /* everyone is done with the previous Q, dO */
            load_tile<T, BT, D, LD, NT>(Qs, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows, 1.0f);
            load_tile<T, BT, D, LD, NT>(dOs, dout + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows, 1.0f);
            if (threadIdx.x < BT) {
                const long long r = ((long long)b * p.heads + h) * p.seqlen_q + i0 + threadIdx.x;
                Ls[threadIdx.x] = (int)threadIdx.x < rows ? lse[r] : 0.0f;
                Ds[threadIdx.x] = (int)threadIdx.x < rows ? Dg[r] : 0.0f;
            }
            __syncthreads();

            float st[2][8], dpt[2][8];
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int u = 0; u < 8; u++) st[t][u] = dpt[t][u] = 0.0f;
            warp_mm_abt<2, D, LD, LD>(st, Kw, Qs);   /* S^T = K_j Q_i^T (unscaled) */
            warp_mm_abt<2, D, LD, LD>(dpt, Vw, dOs); /* dP^T = V_j dO_i^T */
            float dst[2][8];
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const long long jj = j0 + warp * 8 + rg + 4 * t, ii = i0 + cg + 8 * u;
                    const bool vis = jj < p.seqlen_k && ii < p.seqlen_q && mask_visible(p, ii, jj);
                    const pds r = tile_p_ds(p, st[t][u] * p.scale, dpt[t][u], Ls[cg + 8 * u], Ds[cg + 8 * u], vis);
                    Pw[(rg + 4 * t) * LDP + cg + 8 * u] = r.p;
                    dst[t][u] = r.ds;
                }
            __syncwarp();
            warp_mm_ab<2, BT, D, LDP, LD>(dVa, Pw, dOs); /* dV_j += P^T dO_i */
            __syncwarp();
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int u = 0; u < 8; u++) Pw[(rg + 4 * t) * LDP + cg + 8 * u] = dst[t][u];
            __syncwarp();
            warp_mm_ab<2, BT, D, LDP, LD>(dKa, Pw, Qs); /* dK_j += dS^T Q_i (scale at the end) */
        }
    }

#pragma unroll
    for (int t = 0; t < 2; t++) {
        const long long jj = j0 + warp * 8 + rg + 4 * t;
        if (jj >= p.seqlen_k) continue;
        T *kr = dk + bshd(b, jj, hk, p.seqlen_k, p.heads_k, D), *vr = dv + bshd(b, jj, hk, p.seqlen_k, p.heads_k, D);
#pragma unroll
        for (int u = 0; u < D / 32; u++) {
            store4(kr + 4 * cg + 32 * u, dKa[t][4 * u] * p.scale, dKa[t][4 * u + 1] * p.scale,
                   dKa[t][4 * u + 2] * p.scale, dKa[t][4 * u + 3] * p.scale);
            store4(vr + 4 * cg + 32 * u, dVa[t][4 * u], dVa[t][4 * u + 1], dVa[t][4 * u + 2], dVa[t][4 * u + 3]);
        }
    }
}

/* 3. dQ_i: grid (ceil(Sq / 64), heads, batch). Warp w owns query rows 8w .. 8w+7 of the block. */
template <typename T, int D>
__global__ void __launch_bounds__(NT, D == 64 ? 2 : 1)
    bwd_dq(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
           const T *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg, T *__restrict__ dq)
{
    constexpr int LD = ld<D>(), DC = D / 8;
    extern __shared__ float4 smem_f4[];
    float *Qs = reinterpret_cast<float *>(smem_f4), *dOs = Qs + BT * LD, *Ks = dOs + BT * LD, *Vs = Ks + BT * LD;
    float *Ps = Vs + BT * LD;

    const int h = blockIdx.y, b = blockIdx.z, hk = kv_head(p, h);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
    const long long i0 = (long long)blockIdx.x * BT;
    const int rows = min(BT, p.seqlen_q - (int)i0);
    const long long qstride = (long long)p.heads * D, kstride = (long long)p.heads_k * D;

    load_tile<T, BT, D, LD, NT>(Qs, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows, 1.0f);
    load_tile<T, BT, D, LD, NT>(dOs, dout + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows, 1.0f);
    float Lr[2], Dr[2];
#pragma unroll
    for (int t = 0; t < 2; t++) {
        const long long ii = i0 + warp * 8 + rg + 4 * t;
        const long long r = ((long long)b * p.heads + h) * p.seqlen_q + ii;
        Lr[t] = ii < p.seqlen_q ? lse[r] : 0.0f;
        Dr[t] = ii < p.seqlen_q ? Dg[r] : 0.0f;
    }
    const float *Qw = Qs + warp * 8 * LD, *dOw = dOs + warp * 8 * LD;
    float *Pw = Ps + warp * 8 * LDP;
    float dQa[2][DC];
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int c = 0; c < DC; c++) dQa[t][c] = 0.0f;

    long long jlo, jhi;
    mask_key_range(p, i0, i0 + rows, &jlo, &jhi);
    for (long long j0 = (jlo / BT) * BT; j0 < jhi; j0 += BT) {
        const int cols = (int)min((long long)BT, p.seqlen_k - j0);
        __syncthreads();
        load_tile<T, BT, D, LD, NT>(Ks, k + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
        load_tile<T, BT, D, LD, NT>(Vs, v + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols, 1.0f);
        __syncthreads();
        float s[2][8], dp[2][8];
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int u = 0; u < 8; u++) s[t][u] = dp[t][u] = 0.0f;
        warp_mm_abt<2, D, LD, LD>(s, Qw, Ks);   /* S = Q_i K_j^T (unscaled) */
        warp_mm_abt<2, D, LD, LD>(dp, dOw, Vs); /* dP = dO_i V_j^T */
#pragma unroll
        for (int t = 0; t < 2; t++)
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const long long ii = i0 + warp * 8 + rg + 4 * t, jj = j0 + cg + 8 * u;
                const bool vis = ii < p.seqlen_q && jj < p.seqlen_k && mask_visible(p, ii, jj);
                Pw[(rg + 4 * t) * LDP + cg + 8 * u] = tile_p_ds(p, s[t][u] * p.scale, dp[t][u], Lr[t], Dr[t], vis).ds;
            }
        __syncwarp();
        warp_mm_ab<2, BT, D, LDP, LD>(dQa, Pw, Ks); /* dQ_i += dS K_j (scale at the end) */
    }

#pragma unroll
    for (int t = 0; t < 2; t++) {
        const long long ii = i0 + warp * 8 + rg + 4 * t;
        if (ii >= p.seqlen_q) continue;
        T *qr = dq + bshd(b, ii, h, p.seqlen_q, p.heads, D);
#pragma unroll
        for (int u = 0; u < D / 32; u++)
            store4(qr + 4 * cg + 32 * u, dQa[t][4 * u] * p.scale, dQa[t][4 * u + 1] * p.scale,
                   dQa[t][4 * u + 2] * p.scale, dQa[t][4 * u + 3] * p.scale);
    }
}

template <typename T, int D> cudaError_t launch(const bwd_args &a)
{
    const attn_shape &p = a.sh;
    float *Dg = static_cast<float *>(a.work);
    const T *q = static_cast<const T *>(a.q), *k = static_cast<const T *>(a.k), *v = static_cast<const T *>(a.v);
    const T *o = static_cast<const T *>(a.o), *dout = static_cast<const T *>(a.dout);
    const long long rows = (long long)p.batch * p.heads * p.seqlen_q;
    bwd_dot_do_o<T, D><<<(unsigned)((rows + 255) / 256), 256, 0, a.stream>>>(p, o, dout, Dg);

    const size_t smem = smem_bytes<D>();
    cudaError_t e = cudaFuncSetAttribute(bwd_dk_dv<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(bwd_dq<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 gk((p.seqlen_k + BT - 1) / BT, p.heads_k, p.batch), gq((p.seqlen_q + BT - 1) / BT, p.heads, p.batch);
    bwd_dk_dv<T, D><<<gk, NT, smem, a.stream>>>(p, q, k, v, dout, a.lse, Dg, static_cast<T *>(a.dk),
                                               static_cast<T *>(a.dv));
    bwd_dq<T, D><<<gq, NT, smem, a.stream>>>(p, q, k, v, dout, a.lse, Dg, static_cast<T *>(a.dq));
    return cudaGetLastError();
}

} // namespace

size_t flash2_bwd_workspace_bytes(const attn_shape &p) { return sizeof(float) * (size_t)p.batch * p.heads * p.seqlen_q; }

cudaError_t flash2_backward(const bwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch, a); }
