/*
 * 04b_mma_bwd.cu — FlashAttention-2's backward pass on tensor cores (mma.sync).
 *
 * Previous rung (03b_flash2_bwd.cu): the backward's algorithm and its
 *   deterministic split, every product on the FP32 CUDA cores.
 * What this rung adds: the backward on the tensor cores, built from rung 04's two warp
 *   products (mma.cuh):
 *     S = Q K^T, dP = dO V^T (and their transposes)  — mma_abt: A and B rows from
 *       swizzled shared memory through ldmatrix;
 *     dV += P^T dO, dK += dS^T Q, dQ += dS K         — mma_pv: the left factor
 *       (P^T, dS^T) never leaves the registers: the fp32 accumulator fragment of S^T,
 *       turned elementwise into P and dS, is rounded to bf16/fp16 and re-packed as the A
 *       fragment; the right factor is read with ldmatrix.trans.
 *   Tiles arrive by cp.async, double-buffered (the loads of step s+1 fly while step s
 *   computes), into XOR-swizzled bf16/fp16 tiles (no bank conflicts). Two variants:
 *   --kernel 04b (the default): FlashAttention-2's single pass, 5 tile products:
 *     kernel 1 (D = rowsum(dO o O)): one warp per 16 rows; the row dot products are
 *       taken on the tensor cores too, as the diagonal of the 16 x 16 tile dO_w O_w^T,
 *       so that D_i is formed by exactly the instruction sequence that forms dP_ij =
 *       dO_i . v_j (same operands in the same A/B roles, same k order, same start):
 *       where a row's whole probability sits on one key (seqlen_k = 1, say), O_i = v_j,
 *       so dP_ij - D_i is exactly 0 and so are dS, dQ and dK, as they are mathematically
 *       (rung 03b's header says why check-grad insists). Kernel 2 forms dP^T = V dO^T, A
 *       and B the other way round, so kernel 1 also forms the diagonal of O_w dO_w^T for it
 *       (Dt) — no reliance on the tensor core's sum being symmetric in A and B;
 *     kernel 2 (dK, dV and dQ): one block of 8 warps per 128 keys (16 per warp); it walks
 *       the query blocks of BQ rows (32 at d = 128, 64 at d = 64) that can see them, for
 *       every query head of the GQA group in a fixed order:
 *         S^T = K_j Q_i^T, dP^T = V_j dO_i^T, P^T = 2^(t - LSE log2 e),
 *         dS^T = P^T o (dP^T - D), dV_j += P^T dO_i, dK_j += dS^T Q_i,
 *       then writes its rounded dS^T to a shared tile (swizzled for 32- or 64-half rows:
 *       conflict-free stores and ldmatrix phases), and after one barrier the 8 warps split
 *       dQ_i += dS K_j (BQ x d) between them — A = dS by ldmatrix.trans of the dS^T tile,
 *       B = K_j by ldmatrix.trans — and add it into a float dQ accumulator in global memory,
 *       one float2 atomic (sm_90's vector red) per accumulator pair: BQ x d adds per step
 *       for BQ x 128 (q, k) pairs, d / 128 = one float add per pair at d = 128 (FA-2's rate);
 *     kernel 3 (dQ = scale x the accumulator, rounded to bf16/fp16; 16-byte stores).
 *     The float accumulator is zeroed (cudaMemsetAsync) in the same stream first; it is
 *     batch x seqlen_q x heads x d floats of workspace.
 *   --kernel 04bd: the deterministic split of rung 03b: kernel 2 with 4 warps per 64 keys
 *     computes dK, dV only; dQ by its own kernel (one block of 4 warps per 64 query rows,
 *     walking the key blocks: S = Q_i K_j^T, dP = dO_i V_j^T, dS, dQ_i += dS K_j) — every
 *     element of dQ, dK, dV is summed by one thread in a fixed order, the same bits every
 *     run, at the price of recomputing S and dP there: 7 tile products instead of 5.
 *   Why the single pass is the default: it is FlashAttention-2's own algorithm and what
 *   PyTorch's flash backend (the target) runs, and it meets issue 15's backward target where
 *   the deterministic split cannot (5/7 of the work at equal efficiency predicted 0.71x and
 *   measured 0.66x). Its dQ differs from run to run in the last bits (float additions in
 *   arrival order) — well inside check-grad's rule — while dK and dV stay bitwise
 *   reproducible; a user who needs dQ bit-for-bit runs 04bd (FlashAttention-3 reaches both
 *   with semaphore-ordered dQ accumulation — not here).
 *   TFLOP/s are counted on FlashAttention's 5 products (2.5 x the forward) for both.
 *   Softcap: t = c tanh(scale s / c), dS *= 1 - tanh^2 (the same expression as rung 04's
 *   forward, so P is rebuilt from the same bits as the forward's).
 * What it leaves out: FlashAttention-3's deterministic ordered dQ accumulation; wgmma/TMA
 *   (a Hopper backward rung was not written).
 * What bounds it — measured (ncu --clock-control none, H200, kernel 2 of 04b, bf16, d = 128,
 *   N = 4096, H = 16, B = 4, 2026-12-03; cuda/results/tc2/ncu_04b.txt): the shared-memory
 *   operand traffic of mma.sync. Duration 6.39 ms at 1.80 GHz; tensor pipe (HMMA) active
 *   34.3% (335,544,320 mma.sync), issue slots busy 28.4% (IPC 1.17); 8 warps per SM
 *   (one block: 255 registers), 6.82 cycles between two issues of a warp, of which 2.3 (33%,
 *   the top stall) a short scoreboard on MIO — waiting for ldmatrix results from shared
 *   memory: kernel 2 re-reads its K_j, V_j A fragments at every step (no room in registers
 *   beside the dK and dV accumulators: 2 x 64 registers at d = 128) and every product
 *   streams its B operand through ldmatrix; L1 throughput 73%. Bank conflicts: 0 on loads
 *   and stores (27,234 of 934M wavefronts in all: the atomics' traffic). The dQ atomics are
 *   not the bound: the single pass (5 products + atomics) runs 1.10x the deterministic split
 *   (7 products, no atomics), against 1.4x if it were as efficient per product.
 *   Measured speed (H200, SDPA in the same run, cuda/results/tc2 and tc3): 04b 217.3 TFLOP/s
 *   = 0.72-0.73x PyTorch's flash backward (299-300), causal 216.7 = 0.72x; d = 64 191.8 =
 *   0.69x (causal 0.74x); GQA 32:8 212.5 = 0.78x; fp16 217.6; 04bd 197.5 = 0.66x.
 * Memory traffic (per head, N = seqlen_q = seqlen_k): kernel 2 reads Q, dO once per key
 *   block (2 N d N / 128 elements) and adds dQ once per key block (N d N / 128 floats,
 *   mostly L2 atomics); 04bd's dQ kernel reads K, V once per query block of 64.
 * Resources (nvcc 13.0, sm_90, `make cuda-regs`; bf16 and fp16 alike):
 *     kernel 1: 55 registers (d = 128) / 38 (d = 64), 32 KiB / 16 KiB shared, 128 threads;
 *     kernel 2 (04b): 255 / 243 registers, 256 threads, __launch_bounds__(256, 1), 104.5 KiB /
 *       81 KiB shared (K, V 128 x d; 2 stages of Q, dO, LSE, D; the dS^T tile);
 *     kernel 2 (04bd): 255 / 240 registers, 128 threads, (128, 2), 64.5 KiB / 49 KiB shared;
 *     04bd's dQ kernel: 244 / 222 registers, 96 KiB / 48 KiB shared;
 *   0 bytes spilled, 0 stack everywhere (a spill fails the build: -Xptxas -warn-spills,-Werror).
 *   Kernel 2 at d = 128 sits at the 255-register cap: its dK and dV accumulators alone are
 *   128 registers, which is why its query step is 32 rows there (64 at d = 64).
 */
#include "ladder.h"
#include "mma.cuh"

namespace {

constexpr int NT = 128, BM = 64; /* kernels 1 and 3: threads, query rows per block */
constexpr float L2E = 1.4426950408889634f;

/* Kernel 2: 4 warps and 64 keys per block (deterministic: dQ is kernel 3's), or 8 warps and
 * 128 keys (single pass: the block also adds its dS K_j into dQ; the wider key block halves
 * the dQ atomics and the Q/dO re-reads per key). Every warp owns 16 keys. */
template <bool FUSED> __host__ __device__ constexpr int k2_warps() { return FUSED ? 8 : 4; }
template <bool FUSED> __host__ __device__ constexpr int k2_keys() { return 16 * k2_warps<FUSED>(); }
template <int D> __host__ __device__ constexpr int bq() { return D == 128 ? 32 : 64; } /* kernel 2's query step */
constexpr int KQ = 64;                                                            /* kernel 3's key step */
constexpr int STAGES = 2;

/* Kernel 2's shared memory: K, V tiles (BK x D), then STAGES x {Q, dO (BQ x D), LSE, D (BQ floats)},
 * then (single pass) the dS^T tile, BK x BQ. */
template <int D> __host__ __device__ constexpr int k2_stage_bytes() { return 2 * bq<D>() * D * 2 + 2 * bq<D>() * 4; }
template <int D, bool FUSED> constexpr size_t k2_smem()
{
    return (size_t)2 * k2_keys<FUSED>() * D * 2 + (size_t)STAGES * k2_stage_bytes<D>() +
           (FUSED ? (size_t)k2_keys<FUSED>() * bq<D>() * 2 : 0);
}

/* Byte offset of 16-byte chunk c of row r in the dS^T tile (rows: keys; W = BQ halves a row).
 * W = 64: mma.cuh's swizzle. W = 32 (4 chunks a row): chunk ^ ((r >> 1) & 3), so the 8 rows of
 * an ldmatrix phase (or of one store by the warp) fill the 8 16-byte slots of 128 bytes. */
template <int W> __device__ __forceinline__ uint32_t ds_off(int r, int c)
{
    static_assert(W == 32 || W == 64, "dS^T tile width");
    if (W == 64) return swz<64>(r, c);
    return (uint32_t)(r * 64 + ((c ^ ((r >> 1) & 3)) << 4));
}

/* dQacc[x .. x+1] += (a, b) in float, atomically: one vector reduction on sm_90 (two before). */
__device__ __forceinline__ void atomic_add2(float *x, float a, float b)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    atomicAdd(reinterpret_cast<float2 *>(x), make_float2(a, b));
#else
    atomicAdd(x, a);
    atomicAdd(x + 1, b);
#endif
}
/* Kernel 3's: Q, dO (BM x D), then STAGES x {K, V (KQ x D)}. */
template <int D> constexpr size_t k3_smem() { return (size_t)2 * BM * D * 2 + (size_t)STAGES * 2 * KQ * D * 2; }

/* 1. D[b][h][i] = dO_i . O_i, as the diagonal of dO_w O_w^T on the tensor cores (kernel 3's
 *    operand order: A = dO, B = V), and Dt, the same dot as the diagonal of O_w dO_w^T (kernel 2's
 *    order: A = V, B = dO). Grid (ceil(Sq / 64), heads, batch), 4 warps of 16 rows. */
template <typename T, int D>
__global__ void __launch_bounds__(NT) bwd_dot_do_o_mma(attn_shape p, const T *__restrict__ o, const T *__restrict__ dout,
                                                       float *__restrict__ Dg, float *__restrict__ Dt)
{
    extern __shared__ uint4 smem_u4[];
    const uint32_t sdO = smem_addr(smem_u4), sO = sdO + BM * D * 2;
    const int h = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const long long i0 = (long long)blockIdx.x * BM;
    const int rows = min(BM, p.seqlen_q - (int)i0);
    const long long qstride = (long long)p.heads * D;
    load_tile_async<T, BM, D, NT>(sdO, dout + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
    load_tile_async<T, BM, D, NT>(sO, o + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    float c[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    float ct[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
    mma_abt_smem<T, 2, D>(c, sdO, warp * 16, sO + warp * 16 * D * 2);
    mma_abt_smem<T, 2, D>(ct, sO, warp * 16, sdO + warp * 16 * D * 2);
    if (t4 == (g >> 1)) { /* the lane that holds diagonal elements (g, g) and (g + 8, g + 8) */
        const long long r = ((long long)b * p.heads + h) * p.seqlen_q + i0 + warp * 16 + g;
        if (warp * 16 + g < rows) {
            Dg[r] = (g & 1) ? c[0][1] : c[0][0];
            Dt[r] = (g & 1) ? ct[0][1] : ct[0][0];
        }
        if (warp * 16 + g + 8 < rows) {
            Dg[r + 8] = (g & 1) ? c[1][3] : c[1][2];
            Dt[r + 8] = (g & 1) ? ct[1][3] : ct[1][2];
        }
    }
}

/* 2. dK_j, dV_j (and, FUSED, dQ += dS K_j into the float dQacc): grid (ceil(Sk / BK), heads_k, batch).
 *    Warp w owns keys 16w .. 16w+15 of the block. */
template <typename T, int D, bool FUSED>
__global__ void __launch_bounds__(32 * k2_warps<FUSED>(), FUSED ? 1 : 2)
    bwd_dk_dv_mma(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                  const T *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg,
                  T *__restrict__ dk, T *__restrict__ dv, float *__restrict__ dqacc)
{
    constexpr int BQ = bq<D>(), NB = BQ / 8, DT = D / 8, SB = k2_stage_bytes<D>(), TQ = BQ * D * 2;
    constexpr int BK = k2_keys<FUSED>(), NT = 32 * k2_warps<FUSED>();
    extern __shared__ uint4 smem_u4[];
    char *smem = reinterpret_cast<char *>(smem_u4);
    const uint32_t sK = smem_addr(smem), sV = sK + BK * D * 2, sS0 = sV + BK * D * 2; /* stage s at sS0 + s SB */
    const uint32_t sdS = sS0 + STAGES * SB;                                           /* FUSED: dS^T [BK][BQ] */
    const float *fS0 = reinterpret_cast<const float *>(smem + 2 * BK * D * 2);

    const int hk = blockIdx.y, b = blockIdx.z, group = p.heads / p.heads_k;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const long long j0 = (long long)blockIdx.x * BK;
    const int cols = min(BK, p.seqlen_k - (int)j0);
    const long long qstride = (long long)p.heads * D, kstride = (long long)p.heads_k * D;

    long long ilo, ihi;
    mask_query_range(p, j0, j0 + cols, &ilo, &ihi);
    const long long istart = (ilo / BQ) * BQ;
    const int nq = ihi > ilo ? (int)((ihi - istart + BQ - 1) / BQ) : 0, nsteps = nq * group;

    auto load_step = [&](int stp) {
        const int h = hk * group + stp / nq;
        const long long i0 = istart + (long long)(stp % nq) * BQ;
        const int rows = (int)min((long long)BQ, p.seqlen_q - i0);
        const uint32_t st = sS0 + (stp % STAGES) * SB;
        load_tile_async<T, BQ, D, NT>(st, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
        load_tile_async<T, BQ, D, NT>(st + TQ, dout + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
        if (threadIdx.x < 2 * BQ) {
            const int x = threadIdx.x % BQ;
            const float *src = (threadIdx.x < BQ ? lse : Dg) + ((long long)b * p.heads + h) * p.seqlen_q + i0;
            cp_async4(st + 2 * TQ + 4 * threadIdx.x, x < rows ? src + x : src, x < rows ? 4 : 0);
        }
    };

    load_tile_async<T, BK, D, NT>(sK, k + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols);
    load_tile_async<T, BK, D, NT>(sV, v + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nsteps) load_step(s);
        cp_async_commit(); /* group 0 also carries K and V */
    }

    float dKa[DT][4], dVa[DT][4];
#pragma unroll
    for (int n = 0; n < DT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dKa[n][e] = dVa[n][e] = 0.0f;
    const float sl2 = p.scale * L2E, inv_cap = p.softcap > 0.0f ? p.scale / p.softcap : 0.0f, cl = p.softcap * L2E;
    const long long krow = j0 + warp * 16 + g; /* this lane's keys: krow, krow + 8 */

    for (int stp = 0; stp < nsteps; stp++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (stp + STAGES - 1 < nsteps) load_step(stp + STAGES - 1);
        cp_async_commit();
        const int buf = stp % STAGES;
        const uint32_t sQ = sS0 + buf * SB, sdO = sQ + TQ;
        const float *Ls = reinterpret_cast<const float *>(reinterpret_cast<const char *>(fS0) + buf * SB + 2 * TQ);
        const float *Dsm = Ls + BQ;
        const long long i0 = istart + (long long)(stp % nq) * BQ;

        float st[NB][4], dpt[NB][4];
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[n][e] = dpt[n][e] = 0.0f;
        mma_abt_smem<T, NB, D>(st, sK, warp * 16, sQ);   /* S^T = K_j Q_i^T (unscaled) */
        mma_abt_smem<T, NB, D>(dpt, sV, warp * 16, sdO); /* dP^T = V_j dO_i^T */

        const bool full = mask_tile_full(p, i0, i0 + BQ, j0, j0 + BK) && i0 + BQ <= p.seqlen_q;
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = 8 * n + 2 * t4 + (e & 1);
                float x, dfac = 1.0f;
                if (p.softcap > 0.0f) {
                    const float th = tanhf(st[n][e] * inv_cap);
                    x = cl * th;
                    dfac = 1.0f - th * th;
                } else {
                    x = st[n][e] * sl2;
                }
                float pv = exp2f(x - Ls[col] * L2E);
                if (!full) {
                    const long long jj = krow + 8 * (e >> 1), ii = i0 + col;
                    if (jj >= p.seqlen_k || ii >= p.seqlen_q || !mask_visible(p, ii, jj)) pv = 0.0f;
                }
                st[n][e] = pv;
                dpt[n][e] = pv * (dpt[n][e] - Dsm[col]) * dfac;
            }
        uint32_t af[BQ / 16][4];
        pack_a<T, BQ>(af, st);
        mma_pv<T, BQ, D>(dVa, af, sdO); /* dV_j += P^T dO_i */
        pack_a<T, BQ>(af, dpt);
        if constexpr (FUSED) {
            /* dS^T of this warp's 16 keys, as rounded for the products, into the shared tile:
             * af[kk] holds rows (g, g + 8) x query columns 16 kk + 2 t4 (+ 8) */
            char *ds = smem + (sdS - sK);
#pragma unroll
            for (int kk = 0; kk < BQ / 16; kk++) {
                const int r = warp * 16 + g;
                *reinterpret_cast<uint32_t *>(ds + ds_off<BQ>(r, 2 * kk) + 4 * t4) = af[kk][0];
                *reinterpret_cast<uint32_t *>(ds + ds_off<BQ>(r + 8, 2 * kk) + 4 * t4) = af[kk][1];
                *reinterpret_cast<uint32_t *>(ds + ds_off<BQ>(r, 2 * kk + 1) + 4 * t4) = af[kk][2];
                *reinterpret_cast<uint32_t *>(ds + ds_off<BQ>(r + 8, 2 * kk + 1) + 4 * t4) = af[kk][3];
            }
        }
        mma_pv<T, BQ, D>(dKa, af, sQ); /* dK_j += dS^T Q_i (scale at the end) */
        if constexpr (FUSED) {
            /* dQ_i += dS K_j over the block's BK keys: warp w takes query rows 16 mt .. of the step
             * and 32 columns of d at 32 cg; A = dS (ldmatrix.trans of the dS^T tile), B = K_j
             * (ldmatrix.trans, as V in P V); then one float2 atomic add per accumulator pair */
            __syncthreads(); /* every warp's dS^T is in the tile */
            constexpr int MT = BQ / 16;
            const int mt = warp % MT, cg = warp / MT;
            static_assert(k2_warps<FUSED>() / MT * 32 == D, "the warps tile dQ's BQ x D");
            float dq[4][4];
#pragma unroll
            for (int n = 0; n < 4; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t a[4];
                ldsm_x4_trans(a, sdS + ds_off<BQ>(16 * kk + ((lane >> 4) << 3) + (lane & 7), 2 * mt + ((lane >> 3) & 1)));
#pragma unroll
                for (int dpi = 0; dpi < 2; dpi++) {
                    uint32_t bb[4];
                    ldsm_x4_trans(bb, sK + swz<D>(16 * kk + (lane & 15), 4 * cg + 2 * dpi + (lane >> 4)));
                    mma16816(dq[2 * dpi], a, bb[0], bb[1], (T *)nullptr);
                    mma16816(dq[2 * dpi + 1], a, bb[2], bb[3], (T *)nullptr);
                }
            }
            const int h = hk * group + stp / nq;
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const long long ii = i0 + 16 * mt + g + 8 * r;
                if (ii < p.seqlen_q) {
                    float *row = dqacc + bshd(b, ii, h, p.seqlen_q, p.heads, D) + 32 * cg + 2 * t4;
#pragma unroll
                    for (int n = 0; n < 4; n++) atomic_add2(row + 8 * n, dq[n][2 * r], dq[n][2 * r + 1]);
                }
            }
        }
    }
    cp_async_wait<0>();
    __syncthreads(); /* every thread's copies into K, V have landed (no step may have waited for them) */

    /* through this warp's own rows of the K and V tiles (only this warp read them) */
    store_tile_warp<T, D>(dKa, p.scale, smem, warp * 16, dk + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D), kstride, cols);
    store_tile_warp<T, D>(dVa, 1.0f, smem + BK * D * 2, warp * 16, dv + bshd(b, j0, hk, p.seqlen_k, p.heads_k, D),
                          kstride, cols);
}

/* 3. dQ_i: grid (ceil(Sq / 64), heads, batch). Warp w owns query rows 16w .. 16w+15 of the block. */
template <typename T, int D>
__global__ void __launch_bounds__(NT, 2)
    bwd_dq_mma(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
               const T *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ Dg,
               T *__restrict__ dq)
{
    constexpr int NB = KQ / 8, DT = D / 8, TK = KQ * D * 2;
    extern __shared__ uint4 smem_u4[];
    char *smem = reinterpret_cast<char *>(smem_u4);
    const uint32_t sQ = smem_addr(smem), sdO = sQ + BM * D * 2, sS0 = sdO + BM * D * 2; /* stage s: K, V */

    const int h = blockIdx.y, b = blockIdx.z, hk = kv_head(p, h);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const long long i0 = (long long)blockIdx.x * BM;
    const int rows = min(BM, p.seqlen_q - (int)i0);
    const long long qstride = (long long)p.heads * D, kstride = (long long)p.heads_k * D;

    long long jlo, jhi;
    mask_key_range(p, i0, i0 + rows, &jlo, &jhi);
    const long long jstart = (jlo / KQ) * KQ;
    const int nblk = jhi > jlo ? (int)((jhi - jstart + KQ - 1) / KQ) : 0;
    const T *kbase = k + bshd(b, 0, hk, p.seqlen_k, p.heads_k, D), *vbase = v + bshd(b, 0, hk, p.seqlen_k, p.heads_k, D);
    auto load_kv = [&](int blk) {
        const long long j0 = jstart + (long long)blk * KQ;
        const int cols = (int)min((long long)KQ, p.seqlen_k - j0);
        const uint32_t st = sS0 + (blk % STAGES) * 2 * TK;
        load_tile_async<T, KQ, D, NT>(st, kbase + j0 * kstride, kstride, cols);
        load_tile_async<T, KQ, D, NT>(st + TK, vbase + j0 * kstride, kstride, cols);
    };

    load_tile_async<T, BM, D, NT>(sQ, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
    load_tile_async<T, BM, D, NT>(sdO, dout + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < nblk) load_kv(s);
        cp_async_commit(); /* group 0 also carries Q and dO */
    }

    const long long qrow = i0 + warp * 16 + g; /* this lane's rows: qrow, qrow + 8 */
    float Lr[2], Dr[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const long long ii = qrow + 8 * r, x = ((long long)b * p.heads + h) * p.seqlen_q + ii;
        Lr[r] = ii < p.seqlen_q ? lse[x] * L2E : 0.0f;
        Dr[r] = ii < p.seqlen_q ? Dg[x] : 0.0f;
    }
    float dQa[DT][4];
#pragma unroll
    for (int n = 0; n < DT; n++) dQa[n][0] = dQa[n][1] = dQa[n][2] = dQa[n][3] = 0.0f;
    const float sl2 = p.scale * L2E, inv_cap = p.softcap > 0.0f ? p.scale / p.softcap : 0.0f, cl = p.softcap * L2E;

    for (int blk = 0; blk < nblk; blk++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        if (blk + STAGES - 1 < nblk) load_kv(blk + STAGES - 1);
        cp_async_commit();
        const uint32_t sK = sS0 + (blk % STAGES) * 2 * TK, sV = sK + TK;
        const long long j0 = jstart + (long long)blk * KQ;

        float s[NB][4], dp[NB][4];
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[n][e] = dp[n][e] = 0.0f;
        mma_abt_smem<T, NB, D>(s, sQ, warp * 16, sK);   /* S = Q_i K_j^T (unscaled) */
        mma_abt_smem<T, NB, D>(dp, sdO, warp * 16, sV); /* dP = dO_i V_j^T */

        const bool full = mask_tile_full(p, i0, i0 + rows, j0, j0 + KQ);
#pragma unroll
        for (int n = 0; n < NB; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                float x, dfac = 1.0f;
                if (p.softcap > 0.0f) {
                    const float th = tanhf(s[n][e] * inv_cap);
                    x = cl * th;
                    dfac = 1.0f - th * th;
                } else {
                    x = s[n][e] * sl2;
                }
                float pv = exp2f(x - Lr[r]);
                if (!full) {
                    const long long ii = qrow + 8 * r, jj = j0 + 8 * n + 2 * t4 + (e & 1);
                    if (jj >= p.seqlen_k || ii >= p.seqlen_q || !mask_visible(p, ii, jj)) pv = 0.0f;
                }
                dp[n][e] = pv * (dp[n][e] - Dr[r]) * dfac;
            }
        uint32_t af[KQ / 16][4];
        pack_a<T, KQ>(af, dp);
        mma_pv<T, KQ, D>(dQa, af, sK); /* dQ_i += dS K_j (scale at the end) */
    }
    cp_async_wait<0>();
    __syncthreads(); /* every thread's copies into Q have landed (no step may have waited for them) */
    store_tile_warp<T, D>(dQa, p.scale, smem, warp * 16, dq + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
}

/* 4. (single pass) dQ = scale dQacc, rounded to T: 8 elements a thread, 16-byte stores. */
template <typename T>
__global__ void __launch_bounds__(256) bwd_dq_convert(const float *__restrict__ acc, T *__restrict__ dq, float scale,
                                                      long long n8)
{
    const long long x = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= n8) return;
    const float4 lo = reinterpret_cast<const float4 *>(acc)[2 * x], hi = reinterpret_cast<const float4 *>(acc)[2 * x + 1];
    uint4 out;
    out.x = pack2(lo.x * scale, lo.y * scale, (T *)nullptr);
    out.y = pack2(lo.z * scale, lo.w * scale, (T *)nullptr);
    out.z = pack2(hi.x * scale, hi.y * scale, (T *)nullptr);
    out.w = pack2(hi.z * scale, hi.w * scale, (T *)nullptr);
    reinterpret_cast<uint4 *>(dq)[x] = out;
}

size_t d_bytes(const attn_shape &p) { return 2 * sizeof(float) * (size_t)p.batch * p.heads * p.seqlen_q; }

template <typename T, int D, bool FUSED> cudaError_t launch(const bwd_args &a)
{
    const attn_shape &p = a.sh;
    float *Dg = static_cast<float *>(a.work), *Dt = Dg + (size_t)p.batch * p.heads * p.seqlen_q;
    float *dqacc = FUSED ? reinterpret_cast<float *>(static_cast<char *>(a.work) + d_bytes(p)) : nullptr;
    const T *q = static_cast<const T *>(a.q), *k = static_cast<const T *>(a.k), *v = static_cast<const T *>(a.v);
    const T *o = static_cast<const T *>(a.o), *dout = static_cast<const T *>(a.dout);
    constexpr int BK = k2_keys<FUSED>();
    const size_t s1 = (size_t)2 * BM * D * 2, s2 = k2_smem<D, FUSED>(), s3 = k3_smem<D>();
    cudaError_t e = cudaFuncSetAttribute(bwd_dot_do_o_mma<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1);
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(bwd_dk_dv_mma<T, D, FUSED>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2);
    if (e == cudaSuccess && !FUSED)
        e = cudaFuncSetAttribute(bwd_dq_mma<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s3);
    if (e != cudaSuccess) return e;
    const size_t nq = (size_t)p.batch * p.seqlen_q * p.heads * D;
    if (FUSED && (e = cudaMemsetAsync(dqacc, 0, nq * sizeof(float), a.stream)) != cudaSuccess) return e;
    const dim3 gq((p.seqlen_q + BM - 1) / BM, p.heads, p.batch), gk((p.seqlen_k + BK - 1) / BK, p.heads_k, p.batch);
    bwd_dot_do_o_mma<T, D><<<gq, NT, s1, a.stream>>>(p, o, dout, Dg, Dt);
    bwd_dk_dv_mma<T, D, FUSED><<<gk, 32 * k2_warps<FUSED>(), s2, a.stream>>>(
        p, q, k, v, dout, a.lse, Dt, static_cast<T *>(a.dk), static_cast<T *>(a.dv), dqacc);
    if (FUSED) {
        const long long n8 = (long long)(nq / 8);
        bwd_dq_convert<T><<<(unsigned)((n8 + 255) / 256), 256, 0, a.stream>>>(dqacc, static_cast<T *>(a.dq), p.scale, n8);
    } else {
        bwd_dq_mma<T, D><<<gq, NT, s3, a.stream>>>(p, q, k, v, dout, a.lse, Dg, static_cast<T *>(a.dq));
    }
    return cudaGetLastError();
}
template <typename T, int D> cudaError_t launch_fused(const bwd_args &a) { return launch<T, D, true>(a); }
template <typename T, int D> cudaError_t launch_det(const bwd_args &a) { return launch<T, D, false>(a); }

} // namespace

size_t mma_bwd_workspace_bytes(const attn_shape &p)
{
    return d_bytes(p) + sizeof(float) * (size_t)p.batch * p.seqlen_q * p.heads * p.d;
}
cudaError_t mma_backward(const bwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch_fused, a); }

size_t mma_bwd_det_workspace_bytes(const attn_shape &p) { return d_bytes(p); }
cudaError_t mma_backward_det(const bwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch_det, a); }
