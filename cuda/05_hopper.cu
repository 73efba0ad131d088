/*
 * 05_hopper.cu — FlashAttention's forward pass on Hopper's warpgroup tensor cores (wgmma, sm_90a).
 *
 * Three kernels, one consumer's pieces (s_issue, softmax_pack, pv_issue): 05 feeds them with
 *   cp.async under a block barrier per key tile; 05ws with TMA through an mbarrier pipeline and a
 *   producer warpgroup (FlashAttention-3's warp specialization); 05pp is 05ws with
 *   FlashAttention-3's ping-pong schedule of the two consumer warpgroups. All validated by
 *   libflashattn on the H200 (all rows on 12 edge shapes, bf16 and fp16, and on 1- and 64-tile
 *   shapes; sampled rows on every timed shape) — cuda/results/tc3 (05, 05ws), tc4 (05pp).
 *
 * Previous rung (04_mma.cu): FlashAttention-2 on the tensor cores through mma.sync — every warp
 *   issues its own 16 x 8 x 16 products and first fetches both operands from shared memory into
 *   registers with ldmatrix (ncu, H200: tensor pipe active 46.7% of the kernel, issue slots 49.7%
 *   busy: the ldmatrix/mma.sync instruction stream of 8 warps cannot keep the pipe fed).
 * What this rung adds — Hopper's warpgroup MMA:
 *   - wgmma.mma_async: the 4 warps of a warpgroup (128 threads) issue one 64 x N x 16 product
 *     together (N = 128 keys for S = Q K^T: 262 144 FLOP in one instruction, against mma.sync's
 *     4096); the tensor cores read B — and here A too for S — straight from shared memory through
 *     a 64-bit matrix descriptor, with no ldmatrix and no register staging;
 *   - the descriptor's 128-byte swizzle: every tile is stored as d/64 sub-tiles of [rows][64]
 *     halves, 128-byte rows, the 16-byte chunk c of row r at chunk c ^ (r & 7) — the layout TMA's
 *     SWIZZLE_128B writes (so 05ws's TMA copies did not change the kernel's reads): the 8 rows a
 *     descriptor step touches hit 8 different bank groups. Q and K are "K-major" operands (d
 *     contiguous), V is read as an "MN-major" B (d contiguous, keys the k dimension: the
 *     transpose bit), exactly as FlashAttention-3 reads it;
 *   - asynchronous issue: wgmma.fence / commit_group / wait_group bracket a product; the warps
 *     are free while it runs (this rung still waits for it before the softmax);
 *   - P from registers: the S accumulator fragment of wgmma (per warp: rows 16w + g, g + 8, two
 *     columns 2t, 2t+1 per 8-column block — the mma.sync C layout) is, rounded to bf16/fp16 and
 *     packed in pairs, the register A fragment of the P V wgmma (the "RS" form), as in rung 04;
 *   - 128 query rows per block (one 64-row slice per warpgroup, two warpgroups), 128 keys per step.
 *   Kept from rung 04: the online softmax in log2 units, the cp.async K/V pipeline (2 stages at
 *   d = 128, 3 at d = 64), causal (bottom-right) and windows by key range plus an element mask on
 *   straddling tiles, heaviest query blocks first, GQA, softcap, d = 64 or 128, O staged through
 *   shared memory for 16-byte stores, LSE.
 * 05ws adds (second kernel, bottom of this file): TMA — cp.async.bulk.tensor of 64 x 128 boxes
 *   from 4-d tensor maps (d, seqlen, heads, batch), written by the copy engine in the same
 *   128-byte swizzle, rows past the end zero-filled — completing on "full" mbarriers armed with
 *   the byte count; "empty" mbarriers the consumer warps arrive on when a stage is free; a
 *   producer warpgroup (one thread issues every copy; setmaxnreg.dec to 24 registers) and two
 *   consumer warpgroups (setmaxnreg.inc to 240) that never meet at a block barrier in the key
 *   loop, so one warpgroup's softmax runs while the other's wgmmas keep the tensor cores busy.
 * 05pp adds (the same kernel as 05ws, template flag PP): the explicit ping-pong. Two named
 *   barriers (ids 2, 3; bar.sync by the waiting warpgroup, bar.arrive by the other, 256 threads)
 *   hand the tensor cores from one consumer warpgroup to the other: per key tile j a warpgroup
 *   waits for its turn, issues P_{j-1} V_{j-1} and S_j = Q K_j^T as one commit group, passes the
 *   turn, and only then waits for its products and runs softmax j — so its exponentials run
 *   while the other warpgroup's two products occupy the tensor cores, by construction rather than
 *   by the schedulers' chance. Deferring P V by one tile holds a K/V stage one tile longer, so
 *   05pp has one stage more (3 at d = 128: 225.3 KiB of shared memory, 4 at d = 64). Tile 0 is
 *   a separate copy of the loop body: with `if (j > 0) P V` inside the group ptxas serialized
 *   every wgmma (warning C7520).
 * What it leaves out (FlashAttention-3's remaining steps): the intra-warpgroup overlap of softmax
 *   j with S_{j+1} (a second S accumulator: registers), a persistent grid, fp8; and the backward
 *   on wgmma.
 * Measured, 05pp (H200, bf16, d = 128, N = 16384, H = 16; cuda/results/tc4, one run with 05ws and
 *   SDPA: flash 347, cuDNN 652, causal 318 / 622 TFLOP/s): 05pp 581.8 TFLOP/s = 1.68x flash,
 *   0.89x cuDNN (05ws in that run 567.2); causal 571.4 = 1.80x / 0.92x (05ws 531.2); d = 64:
 *   376.0 (05ws 344.1; flash 292, cuDNN 470); GQA 32:8 N 4096: 549.9 / causal 453.3 (05ws 513.3 /
 *   423.0); fp16 567.5. Ablation (cuda/results/tc4/ablation, second run): 05ws given 05pp's stage
 *   count is slower at d = 128 (506.8, causal 499.8 against 564.3 / 528.8 with 2 stages; 05pp
 *   577.4 / 570.8), so there the gain is the ping-pong's (+14% over the same stage count); at
 *   d = 64 the fourth stage gives most of it (341.0 -> 368.0; 05pp 373.3).
 * What bounds 05pp: not profiled (no ncu in either run). 582 TFLOP/s is 0.86x of the 673 TFLOP/s
 *   bf16 matmul measured earlier on this card; what is left between the two products of one
 *   warpgroup is its own softmax (the other warpgroup's products cover it only if they are as
 *   long: at d = 64 they are half as long — inferred, not measured — which fits 376), and each
 *   warpgroup still waits for S_j before softmax j (the intra-warpgroup overlap would issue
 *   S_{j+1} first).
 * Measured, 05/05ws (H200, bf16, d = 128, N = 16384, H = 16; PyTorch SDPA in the same run, flash 355,
 *   cuDNN 683 TFLOP/s): 05 426.4 TFLOP/s = 1.20x flash, 0.62x cuDNN; 05ws 563.2 = 1.59x
 *   flash, 0.82x cuDNN (causal 421.1 / 531.6 against flash 323, cuDNN 590: 05ws 1.64x /
 *   0.90x); d = 64: 297.4 / 344.2 (flash 299, cuDNN 493); GQA 32:8 N 4096: 425.6 / 513.2.
 * What bounds 05 — measured (ncu --clock-control none, target shape; cuda/results/tc3/ncu_05.txt):
 *   5.13 ms at 1.81 GHz; the shared pipe (wgmma's) busiest at 43.9% of peak; 50,331,648
 *   warpgroup MMA instructions (against 04's 536,870,912 mma.sync) and 2.30e9 instructions
 *   in all; issue slots 47% busy, 4.12 cycles between two issues of a warp; 0 shared-memory
 *   bank conflicts in 361M wavefronts (the 128-byte swizzle). The block barrier per key tile
 *   keeps both warpgroups in step, so their softmax phases (64 ex2 per thread per tile, on
 *   the special-function units) tend to coincide and the tensor pipe waits — what 05ws gains by
 *   taking the barrier (and the consumers' copy instructions) out of the key loop: +32%.
 *   (This ncu build has no sm__pipe_tensor_op_gmma_cycles_active: "n/a"; 05ws was not profiled.)
 * Resources (`make cuda-regs`; a spill fails the build): 05: 254-255 registers, 256 threads,
 *   one block per SM; 05ws and 05pp: 384 threads under a 168-register cap at entry, then 24 (producer) /
 *   240 (consumers) after setmaxnreg; 0 spills. Shared memory: Q 128 x d, STAGES x (K + V)
 *   128 x d halves, + 1 KiB to align the tiles to the swizzle's 1024-byte atom (+ 256 bytes of
 *   mbarriers for 05ws): 161 KiB at d = 128, 113 KiB at d = 64.
 * Descriptor fields (PTX ISA, "Matrix Descriptor Format" for wgmma): start address >> 4 (bits
 *   0-13), leading byte offset >> 4 (16-29), stride byte offset >> 4 (32-45), base offset (49-51,
 *   0: the tiles are 1024-byte aligned), swizzle mode (62-63, 1 = 128B). Every product here spans
 *   one 128-byte swizzle atom along its contiguous dimension (16 of the 64 halves of a K-major row;
 *   64 d-columns of an MN-major V row — the P V product is issued per 64 columns of d), so only the
 *   8-row stride matters: 1024 bytes. It is written into both offset fields, so the layout does not
 *   depend on which of the two the hardware reads for that stride.
 */
#include "ladder.h"
#include "mma.cuh"

#include <cuda.h> /* CUtensorMap and its enums (the encoder is fetched at run time: no -lcuda) */

namespace {

constexpr int BR = 128, BC = 128, NT = 256; /* two consumer warpgroups of 64 query rows */
constexpr int SUB = 128 * 128;              /* bytes of one [128 rows][64 halves] sub-tile */
constexpr float L2E = 1.4426950408889634f, LN2 = 0.6931471805599453f;

template <int D> __host__ __device__ constexpr int stages() { return D == 64 ? 3 : 2; }
template <int D> __host__ __device__ constexpr int tile_bytes() { return 128 * D * 2; } /* BR = BC = 128 */
template <int D> constexpr size_t smem_bytes() { return (size_t)tile_bytes<D>() * (1 + 2 * stages<D>()) + 1024; }

/* Byte offset of 16-byte chunk `ch` (columns 8 ch .. 8 ch + 7) of row r in a 128-row tile. */
__device__ __forceinline__ uint32_t toff(int r, int ch)
{
    return (uint32_t)((ch >> 3) * SUB + r * 128 + (((ch & 7) ^ (r & 7)) << 4));
}

/* 128 rows of D halves (row r at g + r * row_stride; rows >= nvalid zero-filled) into a tile. */
template <typename T, int D> __device__ __forceinline__ void load_tile128(uint32_t dst, const T *g, long long row_stride, int nvalid)
{
    constexpr int CPR = D / 8;
#pragma unroll
    for (int it = 0; it < 128 * CPR / NT; it++) {
        const int c = it * NT + threadIdx.x, r = c / CPR, ch = c % CPR;
        const bool ok = r < nvalid;
        cp_async16(dst + toff(r, ch), ok ? (const void *)(g + r * row_stride + ch * 8) : (const void *)g, ok ? 16 : 0);
    }
}

/* The wgmma shared-memory descriptor of the operand starting at shared address a (see the header). */
__device__ __forceinline__ uint64_t desc128(uint32_t a)
{
    return (uint64_t)((a & 0x3FFFF) >> 4) | ((uint64_t)(1024 >> 4) << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
/* Generic-proxy writes (cp.async) made visible to the async proxy (wgmma) — before the barrier. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* Keep the compiler from moving accesses of accumulator registers across wgmma fence/wait. */
template <int N> __device__ __forceinline__ void reg_fence(float (&x)[N][4])
{
#pragma unroll
    for (int n = 0; n < N; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(x[n][e])::"memory");
}

/* wgmma, m64 n{128,64} k16, fp32 accumulators: d[4 j + e] is element e of 8-column block j
 * (the mma.sync C layout per warp). _ss: A and B by descriptor (scale_d 0: D = A B);
 * _rs_tb: A from registers (the mma.sync A layout per warp), B by descriptor, transposed
 * (MN-major), D += A B. */
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t da, uint64_t db, int scale_d, __nv_bfloat16 *)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float *d, const uint32_t (&a)[4], uint64_t db, __nv_bfloat16 *)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t da, uint64_t db, int scale_d, __half *)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db), "r"(scale_d));
}
__device__ __forceinline__ void wgmma_m64n64k16_rs_tb(float *d, const uint32_t (&a)[4], uint64_t db, __half *)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

/*
 * The three pieces of one key tile for this warpgroup's 64 query rows (tile_step runs them in a
 * row; 05pp interleaves them with the other warpgroup's): s_issue — S = Q K^T (wgmma, A and B from
 * the swizzled tiles at qbase and kt), issued, not committed; softmax_pack — scale/softcap/mask,
 * the online-softmax update of (m, l), acc rescaled, P packed into A fragments; pv_issue —
 * acc += P V (wgmma, P from registers, V from the tile at vt), issued, not committed.
 */
template <typename T, int D> __device__ __forceinline__ void s_issue(float (&s)[BC / 8][4], uint32_t qbase, uint32_t kt)
{
    float (&sf)[BC / 2] = reinterpret_cast<float (&)[BC / 2]>(s);
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t off = (kk >> 2) * SUB + (kk & 3) * 32;
        wgmma_m64n128k16_ss(sf, desc128(qbase + off), desc128(kt + off), kk > 0, (T *)nullptr);
    }
}
template <typename T, int D>
__device__ __forceinline__ void pv_issue(float (&acc)[D / 8][4], const uint32_t (&pf)[BC / 16][4], uint32_t vt)
{
#pragma unroll
    for (int kk = 0; kk < BC / 16; kk++)
#pragma unroll
        for (int hh = 0; hh < D / 64; hh++)
            wgmma_m64n64k16_rs_tb(&acc[8 * hh][0], pf[kk], desc128(vt + hh * SUB + kk * 16 * 128), (T *)nullptr);
}
template <typename T, int D>
__device__ __forceinline__ void softmax_pack(const attn_shape &p, float (&s)[BC / 8][4], long long i0, int rows,
                                             long long j0, long long qrow, int t4, float (&acc)[D / 8][4],
                                             float (&m)[2], float (&l)[2], uint32_t (&pf)[BC / 16][4])
{
    constexpr int DT = D / 8, NB = BC / 8;
    const float sl2 = p.scale * L2E;
    /* to log2 units, softcap, mask — as rung 04 */
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
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < NB; n++) mx = fmaxf(mx, fmaxf(s[n][2 * r], s[n][2 * r + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m[r], mx);
        const float msc = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp2f(m[r] - msc);
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
    pack_a<T, BC>(pf, s);
}

/* One key tile for this warpgroup (05 and 05ws): S, then softmax, then P V; returns with both
 * products complete (wait_group 0), so the caller may release the K/V stage. */
template <typename T, int D>
__device__ __forceinline__ void tile_step(const attn_shape &p, uint32_t qbase, uint32_t kt, uint32_t vt, long long i0,
                                          int rows, long long j0, long long qrow, int t4, float (&acc)[D / 8][4],
                                          float (&m)[2], float (&l)[2])
{
    float s[BC / 8][4];
    wg_fence();
    s_issue<T, D>(s, qbase, kt);
    wg_commit();
    wg_wait0();
    reg_fence(s);
    uint32_t pf[BC / 16][4];
    softmax_pack<T, D>(p, s, i0, rows, j0, qrow, t4, acc, m, l, pf);

    /* O += P V: per 64 columns of d (one swizzle atom of V's rows), BC / 16 steps of k16 */
    reg_fence(acc);
    wg_fence();
    pv_issue<T, D>(acc, pf, vt);
    wg_commit();
    wg_wait0();
    reg_fence(acc);
}

template <typename T, int D>
__global__ void __launch_bounds__(NT, 1)
    hopper_forward_kernel(attn_shape p, const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v,
                          T *__restrict__ o, float *__restrict__ lse)
{
    constexpr int S = stages<D>(), TB = tile_bytes<D>(), DT = D / 8;
    extern __shared__ uint4 smem_u4[];
    const uint32_t raw = smem_addr(smem_u4);
    const uint32_t sQ = (raw + 1023u) & ~1023u, sK = sQ + TB, sV = sK + S * TB; /* K stages, then V stages */
    char *gQ = reinterpret_cast<char *>(smem_u4) + (sQ - raw);

    const int qblock = gridDim.x - 1 - blockIdx.x; /* heaviest (causal) first */
    const int h = blockIdx.y, b = blockIdx.z, hk = kv_head(p, h);
    const int wg = threadIdx.x >> 7, warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
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
        load_tile128<T, D>(sK + st * TB, kbase + j0 * kstride, kstride, cols);
        load_tile128<T, D>(sV + st * TB, vbase + j0 * kstride, kstride, cols);
    };

    load_tile128<T, D>(sQ, q + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < S - 1; s++) {
        if (s < nblk) load_kv(s);
        cp_async_commit();
    }

    float acc[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < DT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    const long long qrow = i0 + warp * 16 + g; /* this lane's rows: qrow, qrow + 8 (warp w: rows 16 w ..) */
    const uint32_t qbase = sQ + wg * 64 * 128; /* this warpgroup's 64 rows, in every sub-tile */

    for (int blk = 0; blk < nblk; blk++) {
        cp_async_wait<S - 2>(); /* tile blk (and Q) has landed for this thread ... */
        fence_proxy_async();    /* ... is visible to the tensor cores' reads ... */
        __syncthreads();        /* ... for all threads; and all are done with tile blk - 1 */
        if (blk + S - 1 < nblk) load_kv(blk + S - 1);
        cp_async_commit();
        const int st = blk % S;
        const long long j0 = jstart + (long long)blk * BC;

        tile_step<T, D>(p, qbase, sK + st * TB, sV + st * TB, i0, rows, j0, qrow, t4, acc, m, l);
    }
    cp_async_wait<0>();

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
    __syncthreads(); /* both warpgroups are done reading the Q tile: it becomes O's staging area */
    store_tile_warp<T, D>(acc, 1.0f, gQ, warp * 16, o + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
}

template <typename T, int D> cudaError_t launch(const fwd_args &a)
{
    auto kern = hopper_forward_kernel<T, D>;
    const size_t smem = smem_bytes<D>();
    cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((a.sh.seqlen_q + BR - 1) / BR, a.sh.heads, a.sh.batch);
    kern<<<grid, NT, smem, a.stream>>>(a.sh, static_cast<const T *>(a.q), static_cast<const T *>(a.k),
                                       static_cast<const T *>(a.v), static_cast<T *>(a.o), a.lse);
    return cudaGetLastError();
}


/* ==========================================================================================
 * 05ws: the same consumer work, fed by TMA through an mbarrier pipeline (FlashAttention-3's
 * producer/consumer split). Three warpgroups: warpgroup 0 is the producer — it gives most of
 * its registers away (setmaxnreg.dec to 24) and one thread issues the bulk tensor copies —
 * warpgroups 1 and 2 are the consumers (setmaxnreg.inc to 240), 64 query rows each. Per stage:
 * a "full" mbarrier (the producer arms it with the stage's byte count; the copy engine completes
 * it) and an "empty" one (each consumer warp arrives once it is done with the stage). No block
 * barrier in the key loop: each consumer warpgroup runs at its own pace, so the softmax of one
 * overlaps the products of the other (the ping-pong FlashAttention-3 enforces with named barriers
 * happens in 05ws only as far as the warp schedulers interleave them; 05pp, the PP instance of the
 * same kernel, enforces it).
 * ========================================================================================== */
constexpr int NT_WS = 384;

__device__ __forceinline__ void mbar_init(uint32_t bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, int bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
/* Wait until the phase of parity `parity` of the barrier has completed. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity)
{
    asm volatile("{\n.reg .pred done;\nwait_%=:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
                 "@!done bra wait_%=;\n}\n" ::"r"(bar),
                 "r"(parity)
                 : "memory");
}
/* One box of the 4-d tensor map (d, seqlen, heads, batch) into shared memory, completing on bar. */
__device__ __forceinline__ void tma_load4(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3, uint32_t bar)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}
/* A 128-row tile (d / 64 boxes of 64 columns) at row `row` of (head, batch). */
template <int D>
__device__ __forceinline__ void tma_tile(uint32_t dst, const CUtensorMap *map, int row, int head, int batch, uint32_t bar)
{
#pragma unroll
    for (int hh = 0; hh < D / 64; hh++) tma_load4(dst + hh * SUB, map, 64 * hh, row, head, batch, bar);
}
__device__ __forceinline__ void consumer_sync() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

/* 05pp holds a stage one key tile longer (its V is read by the next tile's P V): one stage more
 * than 05/05ws — 3 at d = 128 (225.3 KiB of the 227 a block may have), 4 at d = 64. */
/* Ablation switch, not a rung: built with -DFA_05WS_EXTRA_STAGE=1, 05ws gets 05pp's stage count —
 * what separates the ping-pong's gain from the extra stage's (cuda/results/tc4/ablation). */
#ifndef FA_05WS_EXTRA_STAGE
#define FA_05WS_EXTRA_STAGE 0
#endif
template <int D, bool PP> __host__ __device__ constexpr int stages_ws() { return stages<D>() + (PP ? 1 : FA_05WS_EXTRA_STAGE); }
template <int D, bool PP> constexpr size_t smem_bytes_ws()
{
    return (size_t)tile_bytes<D>() * (1 + 2 * stages_ws<D, PP>()) + 1024 + 256; /* + the mbarriers */
}
/* 05pp's two named barriers (ids 2, 3; id 1 is consumer_sync): consumer warpgroup c waits on
 * 2 + c before it issues its products; the other warpgroup's 128 threads arrive on it. */
__device__ __forceinline__ void sched_sync(int c) { asm volatile("bar.sync %0, 256;\n" ::"r"(2 + c) : "memory"); }
__device__ __forceinline__ void sched_arrive(int c) { asm volatile("bar.arrive %0, 256;\n" ::"r"(2 + c) : "memory"); }

template <typename T, int D, bool PP>
__global__ void __launch_bounds__(NT_WS, 1)
    hopper_ws_kernel(attn_shape p, const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                     const __grid_constant__ CUtensorMap tv, T *__restrict__ o, float *__restrict__ lse)
{
    constexpr int S = stages_ws<D, PP>(), TB = tile_bytes<D>(), DT = D / 8;
    extern __shared__ uint4 smem_u4[];
    const uint32_t raw = smem_addr(smem_u4);
    const uint32_t sQ = (raw + 1023u) & ~1023u, sK = sQ + TB, sV = sK + S * TB;
    const uint32_t bars = sV + S * TB; /* qbar, full[S], empty[S]: 8 bytes each */
    const uint32_t qbar = bars;
    auto full = [&](int st) { return bars + 8 + 8 * st; };
    auto empty = [&](int st) { return bars + 8 + 8 * S + 8 * st; };
    char *gQ = reinterpret_cast<char *>(smem_u4) + (sQ - raw);

    const int qblock = gridDim.x - 1 - blockIdx.x;
    const int h = blockIdx.y, b = blockIdx.z, hk = kv_head(p, h);
    const int wgi = threadIdx.x >> 7;
    const long long i0 = (long long)qblock * BR;
    const int rows = min(BR, p.seqlen_q - (int)i0);
    long long jlo, jhi;
    mask_key_range(p, i0, i0 + rows, &jlo, &jhi);
    const long long jstart = (jlo / BC) * BC;
    const int nblk = jhi > jlo ? (int)((jhi - jstart + BC - 1) / BC) : 0;

    if (threadIdx.x == 0) {
        mbar_init(qbar, 1);
        for (int st = 0; st < S; st++) {
            mbar_init(full(st), 1);
            mbar_init(empty(st), 8); /* one arrival per consumer warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wgi == 0) { /* producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n" ::: "memory");
        if (threadIdx.x == 0) {
            mbar_expect_tx(qbar, TB);
            tma_tile<D>(sQ, &tq, (int)i0, h, b, qbar);
            for (int blk = 0; blk < nblk; blk++) {
                const int st = blk % S;
                mbar_wait(empty(st), ((blk / S) & 1) ^ 1); /* the consumers are done with its last use */
                mbar_expect_tx(full(st), 2 * TB);
                const int j0 = (int)(jstart + (long long)blk * BC);
                tma_tile<D>(sK + st * TB, &tk, j0, hk, b, full(st));
                tma_tile<D>(sV + st * TB, &tv, j0, hk, b, full(st));
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n" ::: "memory");
    const int cwg = wgi - 1, warp = (threadIdx.x >> 5) - 4, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
    float acc[DT][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int n = 0; n < DT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    const long long qrow = i0 + warp * 16 + g;
    const uint32_t qbase = sQ + cwg * 64 * 128;
    mbar_wait(qbar, 0);
    if (!PP) {
        for (int blk = 0; blk < nblk; blk++) {
            const int st = blk % S;
            mbar_wait(full(st), (blk / S) & 1);
            const long long j0 = jstart + (long long)blk * BC;
            tile_step<T, D>(p, qbase, sK + st * TB, sV + st * TB, i0, rows, j0, qrow, t4, acc, m, l);
            __syncwarp();
            if (lane == 0) mbar_arrive(empty(st));
        }
    } else {
        /* 05pp: the ping-pong. Per key tile j a warpgroup waits for its turn (sched_sync), issues
         * P_{j-1} V_{j-1} and S_j = Q K_j^T as one commit group, hands the turn to the other
         * warpgroup (sched_arrive) and only then waits for its products and runs softmax j — so
         * its softmax runs while the other warpgroup's two products occupy the tensor cores.
         * Both warpgroups see the same nblk; warpgroup 1 arrives once before the loop (warpgroup
         * 0 goes first) and skips its last arrival, so every arrival meets exactly one sync. */
        uint32_t pf[BC / 16][4];
        if (nblk > 0) { /* tile 0: S only (no P V before it; a separate copy keeps every wgmma of a
                           group on a path without branches — ptxas serializes them otherwise) */
            if (cwg == 1) sched_arrive(0);
            mbar_wait(full(0), 0);
            float s[BC / 8][4];
            sched_sync(cwg);
            wg_fence();
            s_issue<T, D>(s, qbase, sK);
            wg_commit();
            if (cwg == 0 || nblk > 1) sched_arrive(cwg ^ 1);
            wg_wait0();
            reg_fence(s);
            softmax_pack<T, D>(p, s, i0, rows, jstart, qrow, t4, acc, m, l, pf);
        }
        for (int blk = 1; blk < nblk; blk++) {
            const int st = blk % S, pst = (blk + S - 1) % S;
            mbar_wait(full(st), (blk / S) & 1);
            float s[BC / 8][4];
            sched_sync(cwg);
            reg_fence(acc);
            wg_fence();
            pv_issue<T, D>(acc, pf, sV + pst * TB);
            s_issue<T, D>(s, qbase, sK + st * TB);
            wg_commit();
            if (cwg == 0 || blk + 1 < nblk) sched_arrive(cwg ^ 1);
            wg_wait0();
            reg_fence(s);
            reg_fence(acc);
            __syncwarp();
            if (lane == 0) mbar_arrive(empty(pst)); /* K and V of tile blk - 1 are read */
            softmax_pack<T, D>(p, s, i0, rows, jstart + (long long)blk * BC, qrow, t4, acc, m, l, pf);
        }
        if (nblk > 0) { /* the last P V, outside the turns (the other warpgroup is past its own) */
            reg_fence(acc);
            wg_fence();
            pv_issue<T, D>(acc, pf, sV + ((nblk - 1) % S) * TB);
            wg_commit();
            wg_wait0();
            reg_fence(acc);
        }
    }

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
    consumer_sync(); /* both consumer warpgroups are done reading the Q tile */
    const long long qstride = (long long)p.heads * D;
    store_tile_warp<T, D>(acc, 1.0f, gQ, warp * 16, o + bshd(b, i0, h, p.seqlen_q, p.heads, D), qstride, rows);
}

/* The 4-d tensor map of a BSHD tensor (dims innermost first: d, seqlen, heads, batch), boxes of
 * 64 columns x 128 rows, 128-byte swizzle, zero fill past the end. */
typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                    const cuuint64_t *, const cuuint32_t *, const cuuint32_t *, CUtensorMapInterleave,
                                    CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

static cudaError_t make_map(CUtensorMap *map, const void *base, cuda_dtype dt, int batch, int seqlen, int heads, int d)
{
    static encode_tiled_fn encode = nullptr;
    if (!encode) {
        void *fn = nullptr;
        cudaDriverEntryPointQueryResult q;
        cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q);
        if (e != cudaSuccess) return e;
        if (q != cudaDriverEntryPointSuccess || !fn) return cudaErrorNotSupported;
        encode = reinterpret_cast<encode_tiled_fn>(fn);
    }
    const cuuint64_t dims[4] = {(cuuint64_t)d, (cuuint64_t)seqlen, (cuuint64_t)heads, (cuuint64_t)batch};
    const cuuint64_t strides[3] = {(cuuint64_t)heads * d * 2, (cuuint64_t)d * 2, (cuuint64_t)seqlen * heads * d * 2};
    const cuuint32_t box[4] = {64, 128, 1, 1}, estride[4] = {1, 1, 1, 1};
    const CUresult r = encode(map, dt == DT_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4,
                              const_cast<void *>(base), dims, strides, box, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <typename T, int D, bool PP> cudaError_t launch_ws_pp(const fwd_args &a)
{
    const attn_shape &s = a.sh;
    CUtensorMap tq, tk, tv;
    cudaError_t e = make_map(&tq, a.q, a.dtype, s.batch, s.seqlen_q, s.heads, D);
    if (e == cudaSuccess) e = make_map(&tk, a.k, a.dtype, s.batch, s.seqlen_k, s.heads_k, D);
    if (e == cudaSuccess) e = make_map(&tv, a.v, a.dtype, s.batch, s.seqlen_k, s.heads_k, D);
    if (e != cudaSuccess) return e;
    auto kern = hopper_ws_kernel<T, D, PP>;
    const size_t smem = smem_bytes_ws<D, PP>();
    e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
    const dim3 grid((s.seqlen_q + BR - 1) / BR, s.heads, s.batch);
    kern<<<grid, NT_WS, smem, a.stream>>>(s, tq, tk, tv, static_cast<T *>(a.o), a.lse);
    return cudaGetLastError();
}

template <typename T, int D> cudaError_t launch_ws(const fwd_args &a) { return launch_ws_pp<T, D, false>(a); }
template <typename T, int D> cudaError_t launch_pp(const fwd_args &a) { return launch_ws_pp<T, D, true>(a); }

} // namespace

size_t hopper_workspace_bytes(const attn_shape &) { return 0; }

cudaError_t hopper_forward(const fwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch, a); }

cudaError_t hopper_ws_forward(const fwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch_ws, a); }

cudaError_t hopper_pp_forward(const fwd_args &a) { return FA_DISPATCH(a.dtype, a.sh.d, launch_pp, a); }
