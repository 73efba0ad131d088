/*
 * common.cuh — what every rung of the CUDA ladder shares: the problem, the
 * mask rule, bf16/fp16 <-> float, tile loads, and the two register-blocked
 * warp products (S = Q K^T and O += P V).
 *
 * Layouts (docs/semantics.md, FlashAttention's BSHD order, all C-contiguous):
 *   Q   [batch][seqlen_q][heads  ][d]     T = __nv_bfloat16 or __half
 *   K,V [batch][seqlen_k][heads_k][d]     T      (d_v = d in this ladder)
 *   O   [batch][seqlen_q][heads  ][d]     T
 *   LSE [batch][heads][seqlen_q]          float, natural log, -inf for a row with no visible key
 *
 * Semantics (the contract fa_check() holds every rung to): s = scale (q . k);
 * softcap s = c tanh(s / c); key j visible to query i iff
 *   j >= i + seqlen_k - seqlen_q - window_left   (unless window_left < 0) and
 *   j <= i + seqlen_k - seqlen_q + window_right  (unless window_right < 0),
 * causal meaning window_right = 0 (bottom-right aligned); P = softmax over the
 * visible keys; query head h reads kv head h / (heads / heads_k).
 *
 * The functions marked __host__ __device__ are compiled for the CPU too: the
 * harness's self-test runs them on the host against libflashattn, so the mask
 * rule the kernels use is checked even on a machine without a GPU.
 */
#ifndef FA_CUDA_COMMON_CUH
#define FA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- the problem ------------------------------------------------------------ */

enum cuda_dtype { DT_BF16 = 0, DT_FP16 = 1 };

/* One attention problem, as every launcher receives it. d_v = d. */
struct attn_shape {
    int batch, seqlen_q, seqlen_k, heads, heads_k, d;
    float scale;          /* softmax scale (the harness fills 1/sqrt(d) by default) */
    float softcap;        /* > 0: s = softcap tanh(s / softcap); 0: off */
    long long window_left;  /* < 0: unbounded */
    long long window_right; /* < 0: unbounded; causal sets 0 */
};

/* Forward launch arguments. Device pointers. */
struct fwd_args {
    attn_shape sh;
    cuda_dtype dtype;
    const void *q, *k, *v; /* T, layouts above */
    void *o;               /* T */
    float *lse;            /* [batch][heads][seqlen_q] */
    void *work;            /* the rung's workspace (see its *_workspace_bytes) */
    cudaStream_t stream;
};

/* Backward launch arguments. Device pointers. */
struct bwd_args {
    attn_shape sh;
    cuda_dtype dtype;
    const void *q, *k, *v, *o, *dout; /* T */
    const float *lse;                 /* from the forward pass */
    void *dq, *dk, *dv;               /* T, shapes of q, k, v */
    void *work;                       /* float D [batch][heads][seqlen_q] */
    cudaStream_t stream;
};

/* ---- the mask rule, once -------------------------------------------------------- */

/* Key j visible to query i? (j < seqlen_k is the caller's business.) */
__host__ __device__ inline bool mask_visible(const attn_shape &p, long long i, long long j)
{
    const long long diag = i + p.seqlen_k - p.seqlen_q;
    if (p.window_left >= 0 && j < diag - p.window_left) return false;
    if (p.window_right >= 0 && j > diag + p.window_right) return false;
    return true;
}

/* Keys [*lo, *hi) that some query of rows [i0, i1) can see (empty: *lo >= *hi). */
__host__ __device__ inline void mask_key_range(const attn_shape &p, long long i0, long long i1, long long *lo,
                                               long long *hi)
{
    const long long off = (long long)p.seqlen_k - p.seqlen_q;
    long long a = 0, b = p.seqlen_k;
    if (p.window_left >= 0 && i0 + off - p.window_left > a) a = i0 + off - p.window_left;
    if (p.window_right >= 0 && (i1 - 1) + off + p.window_right + 1 < b) b = (i1 - 1) + off + p.window_right + 1;
    *lo = a;
    *hi = b;
}

/* Queries [*lo, *hi) that can see some key of [j0, j1) (the backward's dK/dV loop). */
__host__ __device__ inline void mask_query_range(const attn_shape &p, long long j0, long long j1, long long *lo,
                                                 long long *hi)
{
    const long long off = (long long)p.seqlen_k - p.seqlen_q;
    long long a = 0, b = p.seqlen_q;
    if (p.window_right >= 0 && j0 - off - p.window_right > a) a = j0 - off - p.window_right;
    if (p.window_left >= 0 && (j1 - 1) - off + p.window_left + 1 < b) b = (j1 - 1) - off + p.window_left + 1;
    *lo = a;
    *hi = b;
}

/* Is every key of [j0, j1) visible to every query of [i0, i1)? Then a tile needs no mask. */
__host__ __device__ inline bool mask_tile_full(const attn_shape &p, long long i0, long long i1, long long j0,
                                               long long j1)
{
    if (j1 > p.seqlen_k) return false;
    const long long off = (long long)p.seqlen_k - p.seqlen_q;
    if (p.window_right >= 0 && j1 - 1 > i0 + off + p.window_right) return false;
    if (p.window_left >= 0 && j0 < (i1 - 1) + off - p.window_left) return false;
    return true;
}

/* The logit after scale and softcap: what the mask and the softmax see. */
__host__ __device__ inline float logit(const attn_shape &p, float scaled_dot)
{
    return p.softcap > 0.0f ? p.softcap * tanhf(scaled_dot / p.softcap) : scaled_dot;
}

/* Query head h reads kv head h / (heads / heads_k). */
__host__ __device__ inline int kv_head(const attn_shape &p, int h) { return h / (p.heads / p.heads_k); }

/* Row offset (in elements) of token s, head h in a [batch][seqlen][nh][d] tensor. */
__host__ __device__ inline long long bshd(int b, long long s, int h, int seqlen, int nh, int d)
{
    return (((long long)b * seqlen + s) * nh + h) * d;
}

/* ---- bf16 / fp16 <-> float ------------------------------------------------------- */

/* Eight elements (16 bytes) of T to float. */
__device__ inline void to_float8(const uint4 raw, float *f, __nv_bfloat16 *)
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        f[2 * e] = __uint_as_float(w[e] << 16);
        f[2 * e + 1] = __uint_as_float(w[e] & 0xffff0000u);
    }
}
__device__ inline void to_float8(const uint4 raw, float *f, __half *)
{
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int e = 0; e < 4; e++) {
        __half2 h;
        memcpy(&h, &w[e], 4);
        const float2 x = __half22float2(h);
        f[2 * e] = x.x;
        f[2 * e + 1] = x.y;
    }
}
__device__ inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ inline float to_float(__half x) { return __half2float(x); }
template <typename T> __device__ inline T from_float(float x);
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ inline __half from_float<__half>(float x) { return __float2half_rn(x); }

/* Four floats to four T, stored as 8 bytes at dst (8-byte aligned). */
template <typename T> __device__ inline void store4(T *dst, float a, float b, float c, float d)
{
    union {
        T t[4];
        uint2 u;
    } x;
    x.t[0] = from_float<T>(a);
    x.t[1] = from_float<T>(b);
    x.t[2] = from_float<T>(c);
    x.t[3] = from_float<T>(d);
    *reinterpret_cast<uint2 *>(dst) = x.u;
}

/* ---- tiles in shared memory -------------------------------------------------------- */

/*
 * Load ROWS rows of D elements of T (row r at g + r * row_stride) into shared
 * memory as float, row-major with leading dimension LD, each value times mul;
 * rows >= nvalid are zero. 16-byte global loads: consecutive threads read
 * consecutive 16-byte pieces of one row (coalesced). NT = threads in the block.
 */
template <typename T, int ROWS, int D, int LD, int NT>
__device__ inline void load_tile(float *sm, const T *g, long long row_stride, int nvalid, float mul)
{
    constexpr int CPR = D / 8; /* 16-byte chunks per row */
#pragma unroll 4
    for (int c = threadIdx.x; c < ROWS * CPR; c += NT) {
        const int r = c / CPR, k = (c % CPR) * 8;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < nvalid) {
            const uint4 raw = *reinterpret_cast<const uint4 *>(g + r * row_stride + k);
            to_float8(raw, f, (T *)nullptr);
        }
        float4 *dst = reinterpret_cast<float4 *>(sm + r * LD + k);
        dst[0] = make_float4(f[0] * mul, f[1] * mul, f[2] * mul, f[3] * mul);
        dst[1] = make_float4(f[4] * mul, f[5] * mul, f[6] * mul, f[7] * mul);
    }
}

/* ---- the two warp products -------------------------------------------------------------
 *
 * A warp owns 4*RT consecutive rows of the left operand. Its 32 lanes form a
 * 4 x 8 grid: lane = 8 rg + cg. Lane (rg, cg) owns rows rg + 4t (t < RT) of the
 * warp's rows and
 *   - in S = A B^T (64 columns): columns cg + 8u, u < 8;
 *   - in O += P V (D columns):   columns 4 cg + 32 u + e, u < D/32, e < 4.
 * A row of S is spread over the 8 lanes that share rg, so a row max or row sum
 * is three xor-shuffles (1, 2, 4) and never leaves the warp: warps split rows,
 * the FlashAttention-2 work split. Shared-memory reads are 16 bytes wide; the
 * 8 lanes of a row group read 8 different rows (or 8 consecutive 16-byte
 * pieces), 4 rg groups broadcast, and the row padding (LD = D + 4) puts those
 * 8 rows on 8 different bank quads: no bank conflicts. Each 16-byte read feeds
 * 8 to 16 FMAs from registers.
 */

__device__ inline float f4at(const float4 &v, int e) { return e == 0 ? v.x : e == 1 ? v.y : e == 2 ? v.z : v.w; }

/* s[t][u] += sum_k A[rg + 4t][k] * B[cg + 8u][k], k < K. A: the warp's first row. */
template <int RT, int K, int LDA, int LDB>
__device__ inline void warp_mm_abt(float (&s)[RT][8], const float *A, const float *B)
{
    const int lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
#pragma unroll 2
    for (int k0 = 0; k0 < K; k0 += 4) {
        float4 a[RT], b[8];
#pragma unroll
        for (int t = 0; t < RT; t++) a[t] = *reinterpret_cast<const float4 *>(A + (rg + 4 * t) * LDA + k0);
#pragma unroll
        for (int u = 0; u < 8; u++) b[u] = *reinterpret_cast<const float4 *>(B + (cg + 8 * u) * LDB + k0);
#pragma unroll
        for (int t = 0; t < RT; t++)
#pragma unroll
            for (int u = 0; u < 8; u++) {
                s[t][u] = fmaf(a[t].x, b[u].x, s[t][u]);
                s[t][u] = fmaf(a[t].y, b[u].y, s[t][u]);
                s[t][u] = fmaf(a[t].z, b[u].z, s[t][u]);
                s[t][u] = fmaf(a[t].w, b[u].w, s[t][u]);
            }
    }
}

/* o[t][4u + e] += sum_c A[rg + 4t][c] * B[c][4cg + 32u + e], c < K. */
template <int RT, int K, int D, int LDA, int LDB>
__device__ inline void warp_mm_ab(float (&o)[RT][D / 8], const float *A, const float *B)
{
    const int lane = threadIdx.x & 31, rg = lane >> 3, cg = lane & 7;
#pragma unroll 1
    for (int c0 = 0; c0 < K; c0 += 4) {
        float4 a[RT];
#pragma unroll
        for (int t = 0; t < RT; t++) a[t] = *reinterpret_cast<const float4 *>(A + (rg + 4 * t) * LDA + c0);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            float4 b[D / 32];
#pragma unroll
            for (int u = 0; u < D / 32; u++)
                b[u] = *reinterpret_cast<const float4 *>(B + (c0 + kk) * LDB + 4 * cg + 32 * u);
#pragma unroll
            for (int t = 0; t < RT; t++) {
                const float x = f4at(a[t], kk);
#pragma unroll
                for (int u = 0; u < D / 32; u++) {
                    o[t][4 * u + 0] = fmaf(x, b[u].x, o[t][4 * u + 0]);
                    o[t][4 * u + 1] = fmaf(x, b[u].y, o[t][4 * u + 1]);
                    o[t][4 * u + 2] = fmaf(x, b[u].z, o[t][4 * u + 2]);
                    o[t][4 * u + 3] = fmaf(x, b[u].w, o[t][4 * u + 3]);
                }
            }
        }
    }
}

/* Max and sum over the 8 lanes of a row group. */
__device__ inline float rowgroup_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 4));
}
__device__ inline float rowgroup_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    x += __shfl_xor_sync(0xffffffffu, x, 2);
    return x + __shfl_xor_sync(0xffffffffu, x, 4);
}

/* ---- dispatch on (dtype, d) ------------------------------------------------------------- */

/* Calls LAUNCH<T, D>(args) for the problem's dtype and d; d must be 64 or 128. */
#define FA_DISPATCH(dtype, d, LAUNCH, args)                                                          \
    ((dtype) == DT_BF16 ? ((d) == 64 ? LAUNCH<__nv_bfloat16, 64>(args) : LAUNCH<__nv_bfloat16, 128>(args)) \
                        : ((d) == 64 ? LAUNCH<__half, 64>(args) : LAUNCH<__half, 128>(args)))

#endif /* FA_CUDA_COMMON_CUH */
