/*
 * 04_mma.cu — FlashAttention-2's forward pass on tensor cores (mma.sync).
 *
 * Previous rung (03_flash2.cu): the FlashAttention-2 loop order and work split
 *   (one query block per thread block, warps split its rows, normalize once, LSE
 *   written), but every product on the FP32 CUDA cores: bf16 tiles converted to
 *   float in shared memory, 4 FMAs per 16-byte shared read, bound by the FMA
 *   issue rate (about 52% of the card's ~66 TFLOP/s FP32 ceiling).
 * What this rung adds — the same algorithm, the products on the tensor cores
 *   (sm_80+ instructions; compiled here for sm_90):
 *   - mma.sync.m16n8k16: a warp multiplies a 16 x 16 bf16/fp16 tile by a 16 x 8
 *     one into fp32 accumulators in one instruction (4096 FLOP). S = Q K^T and
 *     O += P V are 16-row strips per warp: 4 warps, Br = 64 query rows per block,
 *     Bc = 64 keys per step;
 *   - ldmatrix(.trans): one instruction loads four 8 x 8 matrices from shared
 *     memory straight into the fragment layout mma expects; .trans reads V
 *     (stored [key][d]) as the column-major B operand of P V with no transpose pass;
 *   - tiles stay bf16/fp16 in shared memory (half the bytes of rung 03's floats),
 *     XOR-swizzled (mma.cuh): the 8 rows an ldmatrix phase reads land in 8
 *     different bank groups, no bank conflicts without padding;
 *   - cp.async: K_j and V_j are copied global -> shared by the copy engine without
 *     passing through registers, STAGES deep (2 at d = 128, 3 at d = 64): the
 *     loads of tiles j+1 .. j+STAGES-1 are in flight while tile j is computed;
 *   - Q is loaded once and held as A fragments in registers for the whole pass;
 *   - P stays in registers between the two products: the fp32 accumulator
 *     fragment of S, after the online-softmax update, is rounded to bf16/fp16 and
 *     re-packed as the A fragment of P V (its layout already is the A layout, two
 *     n8 tiles per k16 step) — no trip through shared memory as in rung 03;
 *   - the softmax works in log2 units: t = s scale log2(e), p = 2^(t - m): one
 *     multiply and one ex2 per element; LSE = ln 2 (m + log2 l);
 *   - O leaves through the warp's own rows of the (no longer needed) Q tile and
 *     16-byte coalesced stores.
 *   Kept from rung 03: causal (bottom-right) and windows by key range plus an
 *   element mask only on tiles that straddle an edge, heaviest query blocks first,
 *   GQA, softcap, d = 64 or 128, rows with no visible key give O = 0, LSE = -inf.
 * The online softmax, per warp row strip (same symbols as docs/ and tutorials/):
 *     S = Q_i K_j^T (mma, fp32)  ->  t = log2(e) scale S (or log2(e) c tanh(scale S / c))
 *     m_new = max(m, rowmax t);  P = 2^(t - m_new);  l = 2^(m - m_new) l + rowsum P
 *     acc = 2^(m - m_new) acc + bf16(P) V_j (mma)   ...   O = acc / l once at the end.
 *   l sums the fp32 P, the product uses P rounded to the input type (as FlashAttention-2).
 * What it leaves out (rung 05): Hopper's wgmma (warpgroup-wide, B from shared memory,
 *   asynchronous), TMA bulk copies with mbarriers, warp specialization and the
 *   ping-pong of softmax against the products of another warpgroup; fp8.
 * What bounds it — measured (ncu --clock-control none, H200, bf16, d = 128, N = 16384, H = 16,
 *   2026-12-03; cuda/results/tc2/ncu_04.txt): the instruction stream, not the tensor cores.
 *   Duration 7.50 ms at 1.80 GHz; tensor pipe (HMMA) active 46.7% of its peak
 *   (sm__pipe_tensor_op_hmma_cycles_active), 536,870,912 mma.sync instructions; issue slots
 *   busy 49.7% (IPC 2.05); 8 warps per SM = 2 per scheduler (occupancy 12.5%, capped by the
 *   250 registers and the 80 KiB of tiles), 3.89 cycles between two issues of a warp, of which
 *   1.3 (32%) the top stall: a fixed-latency execution dependency (an mma waiting for the
 *   previous one's accumulators, the softmax's dependent FMUL/ex2 chain). With two warps per
 *   scheduler nothing hides those latencies, and every product also costs its ldmatrix
 *   instructions. Shared memory: 260,561 bank conflicts in 1.106e9 wavefronts (0.02%: the
 *   swizzle holds; what is left is the O staging stores), L1 throughput 64%. What lifts it is
 *   rung 05: one wgmma (64 x 128 x 16, issued by a warpgroup) does the work of 64 mma.sync
 *   and reads its operands from shared memory itself, with no ldmatrix.
 *   Measured speed (same H200 run as SDPA, cuda/results/tc3): 293.7 TFLOP/s forward = 0.83x
 *   PyTorch's flash backend, causal 296.5 = 0.92x; d = 64: 247.8 = 0.82x; fp16 as bf16.
 * Memory traffic (per head, N = seqlen_q = seqlen_k): Q read and O written once,
 *   K and V read once per query block of 64: 2 N d (N / 64) elements — 2 GiB per
 *   head at N = 16384, d = 128, mostly L2 hits (one head's K, V is 8 MiB).
 * Resources (nvcc 13.0, sm_90, `make cuda-regs`): 250 registers at d = 128 (bf16 and
 *   fp16; __launch_bounds__(128, 2): two blocks, 8 warps per SM, the register file
 *   full), 168 at d = 64 (three blocks); 0 bytes spilled, 0 bytes of stack — and a
 *   spill would fail the build (mk/cuda.mk: -Xptxas -warn-spills,-Werror for 04*).
 *   Shared memory: Q 64 x d + STAGES x (K + V) 64 x d halves: 80 KiB at d = 128,
 *   56 KiB at d = 64. The 250 registers are acc (64 fp32), S (32), Q's fragments (32)
 *   and the ldmatrix addresses the compiler hoists out of the key loop.
 */
#include "ladder.h"
#include "mma.cuh"

namespace {

constexpr int BR = 64, BC = 64, NT = 128;
constexpr float L2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

template <int D> __host__ __device__ constexpr int stages() { return D == 64 ? 3 : 2; }
template <int D> __host__ __device__ constexpr size_t tile_bytes() { return (size_t)BR * D * 2; } /* BR = BC */
template <int D> constexpr size_t smem_bytes() { return tile_bytes<D>() * (1 + 2 * stages<D>()); }

template <typename T, int D>
__global__ void __launch_bounds__(NT, D == 64 ? 3 : 2)
    mma_forward_kernel(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                       T *__restrict__ o, float *__restrict__ lse)
{
    constexpr int S = stages<D>(), TB = (int)tile_bytes<D>(), DT = D / 8, NB = BC / 8;
    extern __shared__ uint4 smem_u4[];
    const uint32_t sQ = smem_addr(smem_u4), sK = sQ + TB, sV = sK + S * TB; /* K stages, then V stages */

    const int qblock = gridDim.x - 1 - blockIdx.x; /* heaviest (causal) first */
    const int h = blockIdx.y, b = blockIdx.z, hk = kv_head(p, h);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    const long long i0 = (long long)qblock * BR;
    const int rows = min(BR, p.seqlen_q - (int)i0);
    const long long qstride = (long long)p.heads * D, kstride = (long long)p.heads_k * D;

    long long jlo, jhi;
    mask_key_range(p, i0, i0 + rows, &jlo, &jhi);
    const long long jstart = (jlo / BC) * BC;
    const int nblk = jhi > jlo ? (int)((jhi - jstart + BC - 1) / BC) : 0;
    const T *kbase = k + bshd(b, 0, hk, p.seqlen_k, p.heads_k, D), *vbase = v + bshd(b, 0, hk, p.seqlen_k, p.heads_k, D);

    auto load_kv = [&](int blk) {
        const long long j0 = jstart + (long long)blk * BC;
        const int cols = (int)min((long long)BC, p.seqlen_k - j0);
        const int st = blk % S;
        load_tile_async<T, BC, D, NT>(sK + st * TB, kbase + j0 * kstride, kstride, cols);
        load_tile_async<T, BC, D, NT>(sV + st * TB, vbase + j0 * kstride, kstride, cols);
    };

    /* prologue: Q (group 0), then K/V tiles 0 .. S-2 (one group each, empty past the end) */
    load_tile_async<T, BR, D, NT>(sQ, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nblk) load_kv(s);
        cp_async_commit();
    }
    cp_async_wait<S - 1>(); /* Q has landed (the K/V groups may still fly) */
    __syncthreads();
    uint32_t qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) load_a<D>(qf[kk], sQ, warp * 16, kk);

    float acc[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < DT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    const float sl2 = p.scale * L2E;
    const long long qrow = i0 + warp * 16 + g; /* this lane's rows: qrow, qrow + 8 */

    for (int blk = 0; blk < nblk; blk++) {
        cp_async_wait<S - 2>(); /* tile blk has landed for this thread ... */
        __syncthreads();        /* ... for all threads; and all are done with tile blk - 1 */
        if (blk + S - 1 < nblk) load_kv(blk + S - 1); /* into the buffer of tile blk - 1 */
        cp_async_commit();
        const int st = blk % S;
        const long long j0 = jstart + (long long)blk * BC;

        float s[NB][4];
#pragma unroll
        for (int n = 0; n < NB; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) mma_abt_step<T, NB, D>(s, qf[kk], sK + st * TB, kk);

        /* to log2 units, softcap, mask */
        if (p.softcap > 0.0f) {
            const float inv = p.scale / p.softcap, cl = p.softcap * L2E;
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = cl * tanhf(s[n][e] * inv);
        } else {
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] *= sl2;
        }
        if (!mask_tile_full(p, i0, i0 + rows, j0, j0 + BC)) {
#pragma unroll
            for (int n = 0; n < NB; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const long long i = qrow + 8 * (e >> 1), j = j0 + 8 * n + 2 * t4 + (e & 1);
                    if (j >= p.seqlen_k || !mask_visible(p, i, j)) s[n][e] = -INFINITY;
                }
        }

        /* online softmax on the two rows this lane holds (r = 0: row g, r = 1: row g + 8) */
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = -INFINITY;
#pragma unroll
            for (int n = 0; n < NB; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[r], mx);
            const float msc = m_new == -INFINITY ? 0.0f : m_new; /* nothing visible yet: keep P = 0 */
            const float alpha = exp2f(m[r] - msc);               /* 0 when m = -inf */
            float sum = 0.0f;
#pragma unroll
            for (int n = 0; n < NB; n++) {
                s[n][2 * r] = exp2f(s[n][2 * r] - msc);
                s[n][2 * r + 1] = exp2f(s[n][2 * r + 1] - msc);
                sum += s[n][2 * r] + s[n][2 * r + 1];
            }
            l[r] = fmaf(l[r], alpha, sum);
            m[r] = m_new;
#pragma unroll
            for (int n = 0; n < DT; n++) {
                acc[n][2 * r] *= alpha;
                acc[n][2 * r + 1] *= alpha;
            }
        }

        uint32_t pf[BC / 16][4];
        pack_a<T, BC>(pf, s);
        mma_pv<T, BC, D>(acc, pf, sV + st * TB);
    }
    cp_async_wait<0>();

    /* normalize once; LSE; O through this warp's rows of the Q tile */
    float inv[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float lsum = l[r];
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
        lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
        inv[r] = lsum > 0.0f ? 1.0f / lsum : 0.0f;
        const long long i = qrow + 8 * r;
        if (t4 == 0 && i < p.seqlen_q)
            lse[((long long)b * p.heads + h) * p.seqlen_q + i] = lsum > 0.0f ? (m[r] + log2f(lsum)) * LN2 : -INFINITY;
    }
#pragma unroll
    for (int n = 0; n < DT; n++) {
        acc[n][0] *= inv[0];
        acc[n][1] *= inv[0];
        acc[n][2] *= inv[1];
        acc[n][3] *= inv[1];
    }
    store_tile_warp<T, D>(acc, 1.0f, smem_u4, warp * 16, o + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
}

template <typename T, int D> cudaError_t launch(const fwd_args &a)
{
    auto kern = mma_forward_kernel<T, D>;
    const size_t smem = smem_bytes<D>();
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((a.sh.seqlen_q + BR - 1) / BR, a.sh.heads, a.sh.batch);
    kern<<<grid, NT, smem, a.stream>>>(a.sh, static_cast<const T *>(a.q), static_cast<const T *>(a.k),
                                       static_cast<const T *>(a.v), static_cast<T *>(a.o), a.lse);
    return cudaGetLastError();
}

} // namespace

size_t mma_workspace_bytes(const attn_shape &) { return 0; }

cudaError_t mma_forward(const fwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch, a); }
