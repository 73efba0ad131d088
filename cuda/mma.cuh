/*
 * mma.cuh — the tensor-core pieces rungs 04 and 04b share: cp.async tile loads
 * into XOR-swizzled shared memory, ldmatrix, mma.sync m16n8k16 (bf16 or fp16 in,
 * fp32 accumulate), and the two warp products every kernel of these rungs is
 * built from:
 *
 *   mma_abt_step: C[16][8 NT8] += A[16][k16] . B[8 NT8][k16]^T   (one k16 step;
 *                 A as a fragment in registers, B rows from shared memory:
 *                 S = Q K^T, dP = dO V^T and their transposes);
 *   mma_pv:       C[16][D] += P[16][KT] . V[KT][D]   (P in registers, already in
 *                 the A-fragment layout; V rows from shared memory, read with
 *                 ldmatrix.trans: O += P V, dV += P^T dO, dK += dS^T Q, dQ += dS K).
 *
 * Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4 g + t:
 *   accumulator C (16 x 8, fp32): c0, c1 = row g, cols 2t, 2t+1; c2, c3 = row g+8, same cols;
 *   A (16 x 16, four 32-bit registers of two halves): a0 = row g, k 2t..2t+1;
 *     a1 = row g+8, k 2t..; a2 = row g, k 2t+8..; a3 = row g+8, k 2t+8..;
 *   B (16 x 8, "col"): b0 = k 2t..2t+1, col g; b1 = k 2t+8.., col g.
 * So the accumulators of two adjacent n8 tiles, packed pairwise to 16 bits, ARE
 * the A fragment of one k16 step (pack_a): P never leaves the registers between
 * S = Q K^T and O += P V.
 *
 * Shared-memory tiles: ROWS rows of D halves (D = 64 or 128: 128 or 256 bytes),
 * row-major, the 16-byte chunk c of row r stored at chunk position c ^ (r & 7).
 * ldmatrix reads one 16-byte chunk from each of 8 consecutive rows per phase: the
 * XOR puts those 8 chunks in 8 different 16-byte bank groups (all 32 banks), so
 * no phase conflicts; cp.async writes 8 consecutive chunks of one row per 128
 * bytes, which the XOR only permutes: no conflicts either. Without the swizzle
 * the 8 rows of a phase would sit at the same bank group (row pitch 128 or 256
 * bytes) — an 8-way conflict on every ldmatrix.
 */
#ifndef FA_CUDA_MMA_CUH
#define FA_CUDA_MMA_CUH

#include "common.cuh"

/* Byte offset of 16-byte chunk `chunk` of row `row` in a swizzled tile of D halves per row. */
template <int D> __device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * (D * 2) + ((chunk ^ (row & 7)) << 4));
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, asynchronously; src_bytes 0 zero-fills the destination. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
/* 4 bytes global -> shared (src_bytes 0: zero). */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Wait until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/*
 * Start loading ROWS rows of D elements (row r at g + r * row_stride; rows >= nvalid
 * zero-filled) into the swizzled tile at shared address dst. NT threads; each issues
 * 16-byte copies of consecutive chunks (coalesced: a warp covers 512 contiguous bytes
 * of a row, or rows).
 */
template <typename T, int ROWS, int D, int NT>
__device__ __forceinline__ void load_tile_async(uint32_t dst, const T *g, long long row_stride, int nvalid)
{
    constexpr int CPR = D / 8;
    static_assert(ROWS * CPR % NT == 0, "a tile is a whole number of copies per thread");
#pragma unroll
    for (int it = 0; it < ROWS * CPR / NT; it++) {
        const int c = it * NT + threadIdx.x, r = c / CPR, ch = c % CPR;
        const bool ok = r < nvalid;
        cp_async16(dst + swz<D>(r, ch), ok ? (const void *)(g + r * row_stride + ch * 8) : (const void *)g, ok ? 16 : 0);
    }
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* d += a b, m16n8k16, fp32 accumulators. */
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                         __nv_bfloat16 *)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1, __half *)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats -> one register of two T (x in the low half: the lower column). */
__device__ __forceinline__ uint32_t pack2(float x, float y, __nv_bfloat16 *)
{
    const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}
__device__ __forceinline__ uint32_t pack2(float x, float y, __half *)
{
    const __half2 h = __floats2half2_rn(x, y);
    uint32_t u;
    memcpy(&u, &h, 4);
    return u;
}

/* The A fragment of rows row0 .. row0+15, k chunk pair (2 kk, 2 kk + 1) of a swizzled tile. */
template <int D> __device__ __forceinline__ void load_a(uint32_t (&a)[4], uint32_t tile, int row0, int kk)
{
    const int lane = threadIdx.x & 31;
    ldsm_x4(a, tile + swz<D>(row0 + (lane & 15), 2 * kk + (lane >> 4)));
}

/*
 * One k16 step of C += A B^T: A = a (16 rows, k 16 kk .. 16 kk + 15), B = rows 0 .. 8 NT8 - 1
 * of the swizzled tile btile (row n holds column n of B^T, i.e. a key). One ldmatrix.x4
 * fetches the B fragments of two n8 tiles: matrices (n 0-7, k lo), (n 0-7, k hi),
 * (n 8-15, k lo), (n 8-15, k hi).
 */
template <typename T, int NT8, int D>
__device__ __forceinline__ void mma_abt_step(float (&c)[NT8][4], const uint32_t (&a)[4], uint32_t btile, int kk)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int np = 0; np < NT8 / 2; np++) {
        uint32_t b[4];
        ldsm_x4(b, btile + swz<D>(16 * np + (lane & 7) + ((lane >> 4) << 3), 2 * kk + ((lane >> 3) & 1)));
        mma16816(c[2 * np], a, b[0], b[1], (T *)nullptr);
        mma16816(c[2 * np + 1], a, b[2], b[3], (T *)nullptr);
    }
}

/* C += A B^T over all of k < D, A rows arow0.. of the swizzled tile atile (ldmatrix per step). */
template <typename T, int NT8, int D>
__device__ __forceinline__ void mma_abt_smem(float (&c)[NT8][4], uint32_t atile, int arow0, uint32_t btile)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        load_a<D>(a, atile, arow0, kk);
        mma_abt_step<T, NT8, D>(c, a, btile, kk);
    }
}

/* The accumulators of 16 x KT (KT / 8 n8 tiles) as A fragments of KT / 16 k16 steps, in T. */
template <typename T, int KT>
__device__ __forceinline__ void pack_a(uint32_t (&p)[KT / 16][4], const float (&c)[KT / 8][4])
{
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++) {
        p[kk][0] = pack2(c[2 * kk][0], c[2 * kk][1], (T *)nullptr);
        p[kk][1] = pack2(c[2 * kk][2], c[2 * kk][3], (T *)nullptr);
        p[kk][2] = pack2(c[2 * kk + 1][0], c[2 * kk + 1][1], (T *)nullptr);
        p[kk][3] = pack2(c[2 * kk + 1][2], c[2 * kk + 1][3], (T *)nullptr);
    }
}

/*
 * C[16][D] += P[16][KT] V[KT][D]: P as A fragments (pack_a), V rows 0 .. KT-1 of the
 * swizzled tile vtile, row-major [k][n]. ldmatrix.trans of the matrices (k lo, n 0-7),
 * (k hi, n 0-7), (k lo, n 8-15), (k hi, n 8-15) gives the B fragments of two n8 tiles.
 */
template <typename T, int KT, int D>
__device__ __forceinline__ void mma_pv(float (&c)[D / 8][4], const uint32_t (&p)[KT / 16][4], uint32_t vtile)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++)
#pragma unroll
        for (int dp = 0; dp < D / 16; dp++) {
            uint32_t b[4];
            ldsm_x4_trans(b, vtile + swz<D>(16 * kk + (lane & 15), 2 * dp + (lane >> 4)));
            mma16816(c[2 * dp], p[kk], b[0], b[1], (T *)nullptr);
            mma16816(c[2 * dp + 1], p[kk], b[2], b[3], (T *)nullptr);
        }
}

/*
 * Write a warp's 16 x D accumulator tile (times mul, rows with row0 + r >= nvalid
 * skipped) to global memory through the warp's own 16 rows of a swizzled staging
 * tile: each lane puts its pairs in place, then 16-byte coalesced stores. The
 * staging rows must be this warp's alone (the caller's rows of a tile no other
 * warp reads any more).
 */
template <typename T, int D>
__device__ __forceinline__ void store_tile_warp(const float (&c)[D / 8][4], float mul, void *stage_ptr, int row0, T *g,
                                                long long row_stride, int nvalid)
{
    const int lane = threadIdx.x & 31, gq = lane >> 2, t = lane & 3;
    char *base = static_cast<char *>(stage_ptr);
    __syncwarp();
#pragma unroll
    for (int n = 0; n < D / 8; n++) {
        /* column 8 n + 2 t of rows gq and gq + 8: chunk n, byte 4 t within it */
        const uint32_t x0 = pack2(c[n][0] * mul, c[n][1] * mul, (T *)nullptr);
        const uint32_t x1 = pack2(c[n][2] * mul, c[n][3] * mul, (T *)nullptr);
        *reinterpret_cast<uint32_t *>(base + swz<D>(row0 + gq, n) + 4 * t) = x0;
        *reinterpret_cast<uint32_t *>(base + swz<D>(row0 + gq + 8, n) + 4 * t) = x1;
    }
    __syncwarp();
    constexpr int CPR = D / 8;
#pragma unroll
    for (int e = lane; e < 16 * CPR; e += 32) {
        const int r = e / CPR, ch = e % CPR;
        if (row0 + r < nvalid)
            *reinterpret_cast<uint4 *>(g + (long long)(row0 + r) * row_stride + ch * 8) =
                *reinterpret_cast<const uint4 *>(base + swz<D>(row0 + r, ch));
    }
}

#endif /* FA_CUDA_MMA_CUH */
