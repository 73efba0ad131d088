/*
 * avx512.c — AVX-512F micro-kernels (16 float32 lanes, 32 zmm registers).
 *
 * Compiled with -mavx512f (+vl/bw/dq) on this file only; dispatch.c calls
 * into it only after CPUID says the CPU has AVX-512.
 *
 * Register blocking (the whole point of this file):
 *
 *   qk  S = Q Kt:    QK_MR = 8 rows x QK_NV = 2 vectors (32 columns) of
 *                    accumulators = 16 zmm. Per step c of the dot product:
 *                    2 vector loads of Kt[c][j..j+31], 8 broadcasts of
 *                    Q[i][c] (folded into the FMA as {1to16} memory operands),
 *                    16 FMAs. 16 independent chains cover Zen 5's
 *                    2 pipes x 4 cycles FMA latency twice over.
 *                    Loop order: column panel (32 wide) outside, row block
 *                    inside, so the Kt panel [d][32] (16 KiB at d = 128)
 *                    stays in L1 while every row block of Q streams past it.
 *                    The finished dot products are multiplied by the scale
 *                    once, in registers, before the store.
 *   pv  O = aO + PV: PV_MR = 8 rows x PV_NV = 2 vectors (32 columns of dv)
 *                    = 16 zmm. Per key j: 2 loads of V[j][c..c+31], 8
 *                    broadcasts of P[i][j], 16 FMAs. The accumulators start
 *                    at 0 and O is read, updated and written once per key
 *                    chunk: O = alpha*O + acc on the first, O + acc after.
 *                    Loop order: column panel (32 of dv) > key chunk
 *                    (PV_KC = 128) > row block, so the V sub-panel [128][32]
 *                    (16 KiB) stays in L1 while the row blocks stream past.
 *   softmax          rows in groups of 16: the maxima first, alpha for the
 *                    group in one vector exp, then the exp passes.
 *
 * Tails: rows (br % 8) run the same template with fewer rows (1..7);
 * columns of qk run in panels of 32 or 16 reading Kt's zero padding up to a
 * multiple of 16 (allowed: ldk is a multiple of 16), and S is written only
 * for j < bc (masked stores). In pv, the last vector of dv uses masked loads
 * and stores, so neither V nor O is touched beyond dv; Q is never read
 * beyond d. The templates are static inline functions with constant row and
 * vector counts; GCC unrolls them (#pragma GCC unroll) and keeps the
 * accumulator arrays in registers.
 *
 * exp: see simd_exp.h. The reconstruction 2^n * p is vscalefps with a zero
 * mask for x <= FA_EXP_X_MIN (just below ln FLT_MIN), so -inf and very
 * negative x give exactly 0. The softmax's exp pass runs in base 2
 * (exp_shift: simd_exp.h, "The softmax's exp(s - m) in base 2").
 *
 * Rejected: 12..14-row qk blocks (more accumulators, but the row tail grows
 * and Br must be a multiple of the block; 8 rows already saturate the FMA
 * pipes); packing Q into a broadcast-friendly layout (the driver's Q_i
 * layout is already row-major and broadcasts are cheap loads).
 */
#include "kernels.h"

#include <immintrin.h>
#include <math.h>

#include "fma_peak.h"
#include "simd_exp.h"

#define QK_MR 8
#define QK_NV 2
#define PV_MR 8
#define PV_NV 2
#define PV_KC 128 /* keys per chunk: V sub-panel [128][32] = 16 KiB */

#define INLINE static inline __attribute__((always_inline))
/*
 * The decode kernels' blocks (dqk_block, dpv_block) are specialized per row count,
 * key count, format and tail by forced inlining. Under AddressSanitizer (CI's sanitize
 * and fuzz builds) each instrumented copy is large, and clang 14 took over ten minutes
 * and 5 GB to compile this file; there they are ordinary functions instead: the same
 * operations in the same order (the same bits), one copy with its counts at run time.
 */
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_ASAN_BUILD 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define FA_ASAN_BUILD 1
#endif
#ifdef FA_ASAN_BUILD
#define DEC_BLOCK static __attribute__((noinline))
#else
#define DEC_BLOCK INLINE
#endif

/* ------------------------------------------------------------------------ */
/* exp                                                                       */
/* ------------------------------------------------------------------------ */

/* exp(x) for x <= 0, -inf or NaN (the softmax arguments s - m_new). */
INLINE __m512 exp_nonpos(__m512 x)
{
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(FA_EXP_X_MIN), _CMP_NLE_UQ);
    const __m512 t = _mm512_mul_ps(x, _mm512_set1_ps(FA_EXP_LOG2E));
    /* round(t) as t - vreduceps(t), as exp2_nonpos does */
    const __m512 n = _mm512_sub_ps(t, _mm512_reduce_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(FA_EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(FA_EXP_LN2_LO), r);
    __m512 p = _mm512_set1_ps(FA_EXP_C6);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* 2^x for x <= 0, -inf or NaN (the softmax's exponents, log2 e (s - m) in base 2). */
INLINE __m512 exp2_nonpos(__m512 x)
{
    /* x >= -126 (or NaN): 2^x >= FLT_MIN; below, exactly +0 */
    const __mmask16 keep = _mm512_cmp_ps_mask(x, _mm512_set1_ps(FA_EXP2_X_MIN), _CMP_NLT_UQ);
    /* r = x - round(x) by vreduceps, then n = x - r: both exact (|r| <= 1/2, n an
     * integer), one uop fewer than roundscale and a subtraction (roundscale is two on
     * Intel cores; measured: softmax 0.278 -> 0.262 ns a score). The same n and r as
     * those, except n = +0 where roundscale gave -0 (x in [-1/2, -0]) and r = 0 at
     * -inf where x - roundscale(x) was NaN; neither reaches the result (scalef by +-0
     * is the same, -inf lanes are masked to 0): every float's output bits are the
     * same (hashed over all 2^32, docs/performance.md "Eleventh session"). */
    const __m512 r = _mm512_reduce_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 n = _mm512_sub_ps(x, r);
    __m512 p = _mm512_set1_ps(FA_EXP2_C6);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP2_C5));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP2_C4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP2_C3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP2_C2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(FA_EXP2_C1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(keep, p, n);
}

/* exp(s - m) as 2^(log2e s - log2e m): mh + ml = log2e m exactly (ml the FMA's residual). */
INLINE __m512 exp_shift(__m512 s, __m512 mh, __m512 ml)
{
    return exp2_nonpos(_mm512_sub_ps(_mm512_fmsub_ps(s, _mm512_set1_ps(FA_EXP_LOG2E), mh), ml));
}

/* exp(x) for any x: clamp large x so the reconstruction overflows to inf. */
INLINE __m512 exp_any(__m512 x)
{
    /* min(c, x) returns x when x is NaN, so NaN still propagates. */
    return exp_nonpos(_mm512_min_ps(_mm512_set1_ps(FA_EXP_X_CLAMP), x));
}

static void vexp_avx512(int n, const float *x, float *y)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, exp_any(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 k = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(y + i, k, exp_any(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

/* ------------------------------------------------------------------------ */
/* transform: softcap, ALiBi, mask of one score line                         */
/* ------------------------------------------------------------------------ */

/* c tanh(u / c) (the softcap; c = 1: tanh(u)), simd_exp.h's algorithm for tanh (the same
 * steps as avx2.c's cap_tanh_avx2) with c folded into the small-|x| branch: for x = u / c,
 * c (x + x z P(z)) is taken as u + (u z) P(z): on a vector whose lanes are all small (the
 * path softcapped scores take) one multiply fewer than c * tanh(x) (softcap N 1024 d 64:
 * the transform was 10% of a call), and no less accurate:
 * u is exact where c fl(u / c) is not, and z's rounding only reaches the correction term
 * (|z P(z)| < 0.13). With c = 1 it is the old tanh bit for bit (x = u). The polynomial is
 * odd and runs on u itself: fl(u z) and the FMA round symmetrically, so the result is
 * -(|u| + |u| z P(z)) for negative u; only u = -0 would come out +0, so the sign bit is
 * taken from u in one bit-select (vpternlogd). A vector whose lanes are all small skips
 * the rest; the others get c (1 - 2 / (e^{2|x|} + 1)). */
INLINE __m512 cap_tanh_avx512(__m512 u, __m512 vcap, __m512 vinv)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 x = _mm512_mul_ps(u, vinv);
    const __m512 z = _mm512_mul_ps(x, x);
    __m512 p = _mm512_set1_ps(FA_TANH_T4);
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(FA_TANH_T3));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(FA_TANH_T2));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(FA_TANH_T1));
    p = _mm512_fmadd_ps(p, z, _mm512_set1_ps(FA_TANH_T0));
    const __m512 small = _mm512_fmadd_ps(_mm512_mul_ps(u, z), p, u);
    /* |x| < FA_TANH_SMALL as z < FA_TANH_SMALL^2: z = fl(x^2) is monotone in |x| and
     * 0.625^2 = 0.390625 is exact, so the two tests agree on every float; NaN fails both */
    const __mmask16 is_small = _mm512_cmp_ps_mask(z, _mm512_set1_ps(FA_TANH_SMALL * FA_TANH_SMALL), _CMP_LT_OQ);
    __m512 t = small;
    if (is_small != 0xffff) { /* softcapped scores are mostly small: skip exp when all are */
        const __m512 c = _mm512_min_ps(_mm512_set1_ps(FA_TANH_X_ONE), _mm512_abs_ps(x)); /* NaN stays NaN */
        const __m512 e = exp_nonpos(_mm512_add_ps(c, c)); /* vscalefps: any n */
        /* 2 / (e + 1) by vrcp14ps and one Newton step (2^-28 relative before
         * rounding): a zmm vdivps costs more than the whole rest of tanh */
        const __m512 den = _mm512_add_ps(e, one);
        __m512 rc = _mm512_rcp14_ps(den);
        rc = _mm512_mul_ps(rc, _mm512_fnmadd_ps(den, rc, _mm512_set1_ps(2.0f)));
        t = _mm512_mask_blend_ps(is_small, _mm512_mul_ps(vcap, _mm512_sub_ps(one, _mm512_add_ps(rc, rc))), small);
    }
    /* (u & sign) | (t & ~sign): vpternlogd's 0xd8 */
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(_mm512_castps_si512(t), _mm512_castps_si512(u),
                                                         _mm512_set1_epi32((int)0x80000000u), 0xd8));
}

/* (float)(slope * |rel|) for rel = base + step * lane, lanes 0..15, in
 * double as scalar.c does (exact for |rel| < 2^53). */
INLINE __m512 alibi_bias(double base, double step, __m512d slope)
{
    const __m512d lane = _mm512_setr_pd(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0);
    const __m512d r0 = _mm512_abs_pd(_mm512_fmadd_pd(lane, _mm512_set1_pd(step), _mm512_set1_pd(base)));
    const __m512d r1 = _mm512_abs_pd(_mm512_fmadd_pd(lane, _mm512_set1_pd(step), _mm512_set1_pd(base + 8.0 * step)));
    const __m256 lo = _mm512_cvtpd_ps(_mm512_mul_pd(slope, r0)), hi = _mm512_cvtpd_ps(_mm512_mul_pd(slope, r1));
    return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}

/* Lanes [x, x + 16) of a line (k: those below vb) through the softcap, its derivative and
 * ALiBi: the flags are constants, so each combination compiles to its own loop. */
INLINE void transform_vec(const int CAP, const int GRAD, const int ALIBI, float *s, int x, __mmask16 k, int full,
                          __m512 vcap, __m512 vinv, __m512d vslope, int64_t rel0, int rel_step, float *g)
{
    __m512 u = full ? _mm512_loadu_ps(s + x) : _mm512_maskz_loadu_ps(k, s + x);
    if (CAP) {
        u = cap_tanh_avx512(u, vcap, vinv);
        if (GRAD) {
            const __m512 th = _mm512_mul_ps(u, vinv);
            const __m512 dg = _mm512_sub_ps(_mm512_set1_ps(1.0f), _mm512_mul_ps(th, th)); /* d/dt c tanh(t/c) */
            if (full) _mm512_storeu_ps(g + x, dg);
            else _mm512_mask_storeu_ps(g + x, k, dg);
        }
    }
    if (ALIBI) u = _mm512_sub_ps(u, alibi_bias((double)(rel0 + (int64_t)rel_step * x), (double)rel_step, vslope));
    if (full) _mm512_storeu_ps(s + x, u);
    else _mm512_mask_storeu_ps(s + x, k, u);
}

INLINE void transform_loop(const int CAP, const int GRAD, const int ALIBI, int va, int vb, float *s, float cap,
                           float inv_cap, double slope, int64_t rel0, int rel_step, float *g)
{
    const __m512 vcap = _mm512_set1_ps(cap), vinv = _mm512_set1_ps(inv_cap);
    const __m512d vslope = _mm512_set1_pd(slope);
    int x = va;
    for (; x + 16 <= vb; x += 16) /* whole vectors: no mask to build, no masked access */
        transform_vec(CAP, GRAD, ALIBI, s, x, 0xffff, 1, vcap, vinv, vslope, rel0, rel_step, g);
    if (x < vb)
        transform_vec(CAP, GRAD, ALIBI, s, x, (__mmask16)((1u << (vb - x)) - 1u), 0, vcap, vinv, vslope, rel0,
                      rel_step, g);
}

static void transform_avx512(int n, int va, int vb, float *s, float cap, float inv_cap, double slope,
                             int64_t rel0, int rel_step, float *g)
{
    for (int x = 0; x < va; x++) s[x] = -INFINITY;
    for (int x = vb; x < n; x++) s[x] = -INFINITY;
    const int softcap = cap > 0.0f, alibi = slope != 0.0;
    if (softcap && !alibi && !g) transform_loop(1, 0, 0, va, vb, s, cap, inv_cap, slope, rel0, rel_step, g);
    else if (softcap && !alibi) transform_loop(1, 1, 0, va, vb, s, cap, inv_cap, slope, rel0, rel_step, g);
    else if (softcap && !g) transform_loop(1, 0, 1, va, vb, s, cap, inv_cap, slope, rel0, rel_step, g);
    else if (softcap) transform_loop(1, 1, 1, va, vb, s, cap, inv_cap, slope, rel0, rel_step, g);
    else if (alibi) transform_loop(0, 0, 1, va, vb, s, cap, inv_cap, slope, rel0, rel_step, g);
}

/* ------------------------------------------------------------------------ */
/* qk: S = Q Kt                                                              */
/* ------------------------------------------------------------------------ */

/*
 * One register block: rows [0, MR) of q/s, columns [0, 16*NV) of kt/s.
 * Columns >= ncols (< 16*NV) are computed from Kt's zero padding but not
 * stored.
 */
INLINE void qk_block(const int MR, const int NV, int d, int ncols,
                     const float *q, size_t ldq, const float *kt, size_t ldk,
                     float scale, float *s, size_t lds)
{
    __m512 acc[QK_MR][QK_NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();

    for (int c = 0; c < d; c++) {
        const float *krow = kt + (size_t)c * ldk;
        __m512 kv[QK_NV];
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) kv[v] = _mm512_loadu_ps(krow + 16 * v);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const __m512 qb = _mm512_set1_ps(q[(size_t)r * ldq + c]);
#pragma GCC unroll 2
            for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(qb, kv[v], acc[r][v]);
        }
    }

    const __m512 vscale = _mm512_set1_ps(scale); /* S = scale * (Q K^T), scaled once in registers */
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) {
            float *dst = s + (size_t)r * lds + 16 * v;
            const int left = ncols - 16 * v;
            if (left >= 16)
                _mm512_storeu_ps(dst, _mm512_mul_ps(vscale, acc[r][v]));
            else if (left > 0)
                _mm512_mask_storeu_ps(dst, (__mmask16)((1u << left) - 1u), _mm512_mul_ps(vscale, acc[r][v]));
        }
}

/* All row blocks of one column panel of NV vectors. */
INLINE void qk_panel(const int NV, int br, int d, int ncols, const float *q, size_t ldq,
                     const float *kt, size_t ldk, float scale, float *s, size_t lds)
{
    int i = 0;
    for (; i + QK_MR <= br; i += QK_MR)
        qk_block(QK_MR, NV, d, ncols, q + (size_t)i * ldq, ldq, kt, ldk, scale, s + (size_t)i * lds, lds);
    const float *qi = q + (size_t)i * ldq;
    float *si = s + (size_t)i * lds;
    switch (br - i) {
    case 7: qk_block(7, NV, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 6: qk_block(6, NV, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 5: qk_block(5, NV, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 4: qk_block(4, NV, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 3: qk_block(3, NV, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 2: qk_block(2, NV, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 1: qk_block(1, NV, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    default: break;
    }
}

static void qk_avx512(int br, int bc, int d, const float *q, size_t ldq, const float *kt,
                      size_t ldk, float scale, float *s, size_t lds)
{
    int j = 0;
    for (; j + 16 * QK_NV <= bc; j += 16 * QK_NV)
        qk_panel(QK_NV, br, d, 16 * QK_NV, q, ldq, kt + j, ldk, scale, s + j, lds);
    if (bc - j > 16) /* 17..31 columns left: a 32-wide panel, masked store */
        qk_panel(2, br, d, bc - j, q, ldq, kt + j, ldk, scale, s + j, lds);
    else if (bc - j > 0)
        qk_panel(1, br, d, bc - j, q, ldq, kt + j, ldk, scale, s + j, lds);
}

/* ------------------------------------------------------------------------ */
/* softmax: the online update of one tile                                    */
/* ------------------------------------------------------------------------ */

/*
 * max(m, max_{j < bc} row[j]). maxps returns its second operand when either
 * is NaN, so max(x, acc) skips a NaN score, as scalar.c's
 * `x > mx ? x : mx` does (the NaN then shows in P and l, as in the spec).
 */
INLINE float row_max(const float *row, int nfull, __mmask16 tail, float m)
{
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    __m512 mx0 = _mm512_set1_ps(m), mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
    int j = 0;
    for (; j + 64 <= nfull; j += 64) {
        mx0 = _mm512_max_ps(_mm512_loadu_ps(row + j), mx0);
        mx1 = _mm512_max_ps(_mm512_loadu_ps(row + j + 16), mx1);
        mx2 = _mm512_max_ps(_mm512_loadu_ps(row + j + 32), mx2);
        mx3 = _mm512_max_ps(_mm512_loadu_ps(row + j + 48), mx3);
    }
    for (; j < nfull; j += 16) mx0 = _mm512_max_ps(_mm512_loadu_ps(row + j), mx0);
    if (tail) mx1 = _mm512_max_ps(_mm512_mask_loadu_ps(neg_inf, tail, row + nfull), mx1);
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(mx0, mx1), _mm512_max_ps(mx2, mx3)));
}

/*
 * One row's exp pass, P = exp(s - m) stored over the scores; returns the row's
 * 16 partial sums. BASE2: 2^(log2e s - log2e m) (exp_shift, simd_exp.h), else
 * exp_nonpos(s - m) — for rows whose max is beyond 2^100, where log2e m could
 * overflow.
 */
INLINE __m512 softmax_row(const int BASE2, float *row, int nfull, __mmask16 tail, float mnew)
{
    const float mh = BASE2 ? mnew * FA_EXP_LOG2E : 0.0f, ml = BASE2 ? fmaf(mnew, FA_EXP_LOG2E, -mh) : 0.0f;
    const __m512 vmh = _mm512_set1_ps(mh), vml = _mm512_set1_ps(ml), vm = _mm512_set1_ps(mnew);
#define SOFTMAX_EXP(x) (BASE2 ? exp_shift((x), vmh, vml) : exp_nonpos(_mm512_sub_ps((x), vm)))
    __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
    int j = 0;
    for (; j + 32 <= nfull; j += 32) {
        const __m512 p0 = SOFTMAX_EXP(_mm512_loadu_ps(row + j));
        const __m512 p1 = SOFTMAX_EXP(_mm512_loadu_ps(row + j + 16));
        _mm512_storeu_ps(row + j, p0);
        _mm512_storeu_ps(row + j + 16, p1);
        sum0 = _mm512_add_ps(sum0, p0);
        sum1 = _mm512_add_ps(sum1, p1);
    }
    if (j < nfull) {
        const __m512 p0 = SOFTMAX_EXP(_mm512_loadu_ps(row + j));
        _mm512_storeu_ps(row + j, p0);
        sum0 = _mm512_add_ps(sum0, p0);
    }
    if (tail) { /* lanes >= bc: exp(-inf) = 0 */
        const __m512 p1 = SOFTMAX_EXP(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), tail, row + nfull));
        _mm512_mask_storeu_ps(row + nfull, tail, p1);
        sum1 = _mm512_add_ps(sum1, p1);
    }
#undef SOFTMAX_EXP
    return _mm512_add_ps(sum0, sum1);
}

/*
 * Rows go in groups of 16: first the 16 row maxima (independent, so they
 * overlap), then alpha for the 16 rows in one vector exp, then the exp pass
 * of each row. Row by row, every exp pass would wait for its own max
 * reduction and the CPU would idle through that latency once per row.
 */
static void softmax_avx512(int br, int bc, float *s, size_t lds, float *m, float *l, float *alpha)
{
    const int nfull = bc & ~15;
    const __mmask16 tail = (__mmask16)((1u << (bc - nfull)) - 1u);
    const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < br; i0 += 16) {
        const int g = br - i0 < 16 ? br - i0 : 16;
        const __mmask16 gm = (__mmask16)((1u << g) - 1u);
        float mnew[16];
        for (int r = 0; r < g; r++) mnew[r] = row_max(s + (size_t)(i0 + r) * lds, nfull, tail, m[i0 + r]);

        /* alpha = exp(m - m_new): 0 when m was -inf; 1 when nothing is visible yet */
        const __m512 vmold = _mm512_maskz_loadu_ps(gm, m + i0);
        const __m512 vmnew = _mm512_maskz_loadu_ps(gm, mnew);
        const __mmask16 none = _mm512_cmp_ps_mask(vmnew, neg_inf, _CMP_EQ_OQ);
        __m512 va = exp_nonpos(_mm512_sub_ps(vmold, vmnew));
        va = _mm512_mask_blend_ps(none, va, _mm512_set1_ps(1.0f));
        _mm512_mask_storeu_ps(alpha + i0, gm, va);
        float a[16];
        _mm512_storeu_ps(a, va);

        for (int r = 0; r < g; r++) {
            const int i = i0 + r;
            float *row = s + (size_t)i * lds;
            if (mnew[r] == -INFINITY) { /* nothing visible yet: P = 0, keep O, l and m (l = NaN for a NaN score) */
                __mmask16 nan = 0;
                for (int j = 0; j < nfull; j += 16) {
                    const __m512 x = _mm512_loadu_ps(row + j);
                    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
                    _mm512_storeu_ps(row + j, _mm512_setzero_ps());
                }
                if (tail) {
                    const __m512 x = _mm512_maskz_loadu_ps(tail, row + nfull);
                    nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
                    _mm512_mask_storeu_ps(row + nfull, tail, _mm512_setzero_ps());
                }
                if (nan) l[i] = NAN; /* the max skipped it; NaN sticks (kernels.h) */
                continue;
            }
            const __m512 sum = fabsf(mnew[r]) < 0x1p100f ? softmax_row(1, row, nfull, tail, mnew[r])
                                                          : softmax_row(0, row, nfull, tail, mnew[r]);
            l[i] = a[r] * l[i] + _mm512_reduce_add_ps(sum);
            m[i] = mnew[r];
        }
    }
}

/* ------------------------------------------------------------------------ */
/* pv: O = alpha O + P V                                                     */
/* ------------------------------------------------------------------------ */

/*
 * One register block: rows [0, MR), columns [0, 16*NV) of v/o, keys [0, kc).
 * The last vector is restricted to the lanes in `last` (masked loads and
 * stores, so nothing beyond dv is read or written). O = a*O + acc with
 * a = alpha[r] on the first key chunk and 1 on later ones.
 */
INLINE void pv_block(const int TR, const int MR, const int NV, const int FULL, int kc, __mmask16 last, const float *p,
                     size_t ldp, const float *v, size_t ldv, const float *alpha, float *o,
                     size_t ldo)
{
    __m512 acc[PV_MR][PV_NV];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NV; u++) acc[r][u] = _mm512_setzero_ps();

    for (int j = 0; j < kc; j++) {
        const float *vrow = v + (size_t)j * ldv;
        __m512 vv[PV_NV];
#pragma GCC unroll 2
        for (int u = 0; u < NV; u++)
            vv[u] = u == NV - 1 && !FULL ? _mm512_maskz_loadu_ps(last, vrow + 16 * u)
                                         : _mm512_loadu_ps(vrow + 16 * u);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const __m512 pb = _mm512_set1_ps(TR ? p[(size_t)j * ldp + r] : p[(size_t)r * ldp + j]);
#pragma GCC unroll 2
            for (int u = 0; u < NV; u++) acc[r][u] = _mm512_fmadd_ps(pb, vv[u], acc[r][u]);
        }
    }

#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        const __m512 a = _mm512_set1_ps(alpha ? alpha[r] : 1.0f);
#pragma GCC unroll 2
        for (int u = 0; u < NV; u++) {
            float *dst = o + (size_t)r * ldo + 16 * u;
            if (FULL || u < NV - 1) {
                _mm512_storeu_ps(dst, _mm512_fmadd_ps(a, _mm512_loadu_ps(dst), acc[r][u]));
                continue;
            }
            _mm512_mask_storeu_ps(dst, last, _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(last, dst), acc[r][u]));
        }
    }
}

/* All row blocks of one (column panel, key chunk). FULL: last is all 16 lanes (plain loads
 * and stores: a masked load costs an ALU uop beside the load on some cores). TR: P is
 * stored transposed (pv_t), row i of a block at p + i. */
INLINE void pv_panel(const int TR, const int NV, const int FULL, int br, int kc, __mmask16 last, const float *p,
                     size_t ldp, const float *v, size_t ldv, const float *alpha, float *o, size_t ldo)
{
    const size_t rs = TR ? 1 : ldp; /* from one row of P to the next */
    int i = 0;
    for (; i + PV_MR <= br; i += PV_MR)
        pv_block(TR, PV_MR, NV, FULL, kc, last, p + (size_t)i * rs, ldp, v, ldv, alpha ? alpha + i : NULL,
                 o + (size_t)i * ldo, ldo);
    const float *pi = p + (size_t)i * rs, *ai = alpha ? alpha + i : NULL;
    float *oi = o + (size_t)i * ldo;
    switch (br - i) {
    case 7: pv_block(TR, 7, NV, FULL, kc, last, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 6: pv_block(TR, 6, NV, FULL, kc, last, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 5: pv_block(TR, 5, NV, FULL, kc, last, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 4: pv_block(TR, 4, NV, FULL, kc, last, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 3: pv_block(TR, 3, NV, FULL, kc, last, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 2: pv_block(TR, 2, NV, FULL, kc, last, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 1: pv_block(TR, 1, NV, FULL, kc, last, pi, ldp, v, ldv, ai, oi, ldo); break;
    default: break;
    }
}

/*
 * Loop order: column panel (32 of dv) > key chunk (PV_KC keys) > row block.
 * The V sub-panel [PV_KC][32] (16 KiB) stays in L1 while all row blocks
 * stream past it; without the chunking, a 512-key V panel (64 KiB) would
 * fall out of L1 and be re-read from L2 by every row block.
 */
INLINE void pv_body(const int TR, int br, int bc, int dv, const float *p, size_t ldp, const float *v,
                    size_t ldv, const float *alpha, float *o, size_t ldo)
{
    for (int c = 0; c < dv; c += 16 * PV_NV) {
        const int left = dv - c < 16 * PV_NV ? dv - c : 16 * PV_NV;
        for (int j0 = 0; j0 < bc; j0 += PV_KC) {
            const int kc = bc - j0 < PV_KC ? bc - j0 : PV_KC;
            const float *pj = p + (TR ? (size_t)j0 * ldp : (size_t)j0), *vj = v + (size_t)j0 * ldv + c;
            const float *aj = j0 == 0 ? alpha : NULL;
            if (left == 32)
                pv_panel(TR, 2, 1, br, kc, (__mmask16)0xffff, pj, ldp, vj, ldv, aj, o + c, ldo);
            else if (left > 16)
                pv_panel(TR, 2, 0, br, kc, (__mmask16)((1u << (left - 16)) - 1u), pj, ldp, vj, ldv, aj, o + c, ldo);
            else
                pv_panel(TR, 1, 0, br, kc, (__mmask16)((1u << left) - 1u), pj, ldp, vj, ldv, aj, o + c, ldo);
        }
    }
    if (bc == 0 && alpha) /* no key: O = alpha O still (the spec's first step) */
        for (int i = 0; i < br; i++)
            for (int c = 0; c < dv; c++) o[(size_t)i * ldo + c] *= alpha[i];
}

static void pv_avx512(int br, int bc, int dv, const float *p, size_t ldp, const float *v,
                      size_t ldv, const float *alpha, float *o, size_t ldo)
{
    pv_body(0, br, bc, dv, p, ldp, v, ldv, alpha, o, ldo);
}

/* pv with P read transposed (kernels.h, pv_t): pv_avx512's FMAs in its order over the
 * transposed tile, so its bits; a block's 8 broadcasts per key come from 8 consecutive
 * floats instead of 8 rows ldp apart. */
static void pv_t_avx512(int br, int bc, int dv, const float *pt, size_t ldpt, const float *v,
                        size_t ldv, const float *alpha, float *o, size_t ldo)
{
    pv_body(1, br, bc, dv, pt, ldpt, v, ldv, alpha, o, ldo);
}

/*
 * Cut tiles (kernels.h, cut_cols). What each loop does with a column j:
 *   qk       S[i][j] is its own FMA chain over c whatever the panel (32 or
 *            16 wide) it falls in: any n.
 *   softmax  the max is exact in any grouping (a masked -inf never wins). The
 *            sum of P puts 16-column group g into sum0 or sum1 by g's parity,
 *            except a partial last group (bc % 16), which always goes to
 *            sum1: n must not turn a full group into that tail. A multiple
 *            of 16 (or bc itself) does not, and keeps every group's parity.
 *   pv       each O element is acc = sum over the keys of a PV_KC chunk in
 *            key order, chunks starting at multiples of PV_KC from 0 (any n
 *            keeps them), then O = alpha O + acc (first chunk) or O + acc.
 *            Dropping trailing keys drops acc += 0 * v; dropping a whole
 *            chunk drops O + 0.
 * So n = need rounded up to 16 (the SIMD width), at most bc.
 */
static int cut_cols_avx512(int bc, int need)
{
    const int n = (need + 15) & ~15;
    return n < bc ? n : bc;
}

/* cut_lead (alpha = 1): within one key chunk (bc <= PV_KC) skipping leading
 * keys only skipped acc += +-0 from acc = +0; past it, a' must be a chunk
 * boundary, where O + acc (of zeros) was O + 0 and 1 * O + acc is O + acc. */
static int cut_lead_avx512(int bc, int a)
{
    return bc <= PV_KC ? a & ~15 : a - a % PV_KC;
}

/*
 * The forward's leading cut. softmax: 16-column groups keep their parity
 * (sum0/sum1) when a' is a multiple of 32. pv: with bc <= PV_KC one chunk
 * in both calls, acc over the keys in order from +0 (the skipped zero-P
 * keys left it at +0). Above, chunks start at multiples of PV_KC from 0, so
 * a' must be one; the whole tile's skipped chunks did O = alpha O + 0 and
 * O + 0, which for the rows the driver cuts (kernels.h: O = +0, or
 * alpha = 1) is what the cut call's O = alpha O + acc does with them.
 */
static int cut_lead_fwd_avx512(int bc, int a)
{
    return bc <= PV_KC ? a & ~31 : a - a % PV_KC;
}

/* ------------------------------------------------------------------------ */
/* FMA peak loop (for benchmarks: the ceiling the kernels are measured on)   */
/* ------------------------------------------------------------------------ */

/* iters x 16 independent FMA chains x 16 lanes x 2 flops; returns the flops. */
double fa_fma_loop_avx512(long iters, float *sink)
{
    __m512 acc[16];
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
    for (int k = 0; k < 16; k++) acc[k] = _mm512_set1_ps((float)k);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
    __m512 t = acc[0];
    for (int k = 1; k < 16; k++) t = _mm512_add_ps(t, acc[k]);
    *sink = _mm512_reduce_add_ps(t);
    return (double)iters * 16 * 16 * 2;
}

/*
 * qk's 8 x 2 register block on a fixed operand set of three lines (fma_peak.h):
 * an empty asm hides the operands' address from the compiler, so every round
 * loads them again, as the kernel does, with no address to compute. The
 * operands differ per lane and per row, and the sink weights each accumulator
 * by (r + 1)(v + 1), so a block that fed an FMA the wrong operand changes it
 * (test_kernels checks the sink in closed form).
 */
double fa_fma_fed_loop_avx512(long iters, float *sink)
{
    _Alignas(64) float buf[48];
    for (int k = 0; k < 48; k++) buf[k] = k < 32 ? 1.0f - 1e-3f * (float)(k + 1) : 1e-3f * (float)(k - 31);
    __m512 acc[QK_MR][QK_NV];
    const float *src = buf;
#pragma GCC unroll 8
    for (int r = 0; r < QK_MR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < QK_NV; v++) acc[r][v] = _mm512_set1_ps((float)(r + v));
    for (long it = 0; it < iters; it++) {
        __asm__ volatile("" : "+r"(src) : "m"(buf)); /* an address the compiler cannot know: load again */
        const __m512 k0 = _mm512_load_ps(src), k1 = _mm512_load_ps(src + 16);
#pragma GCC unroll 8
        for (int r = 0; r < QK_MR; r++) {
            const __m512 qb = _mm512_set1_ps(src[32 + r]);
            acc[r][0] = _mm512_fmadd_ps(qb, k0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(qb, k1, acc[r][1]);
        }
    }
    __m512 t = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < QK_MR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < QK_NV; v++) t = _mm512_fmadd_ps(acc[r][v], _mm512_set1_ps((float)((r + 1) * (v + 1))), t);
    *sink = _mm512_reduce_add_ps(t);
    return (double)iters * QK_MR * QK_NV * 16 * 2;
}

/* ------------------------------------------------------------------------ */
/* bwd_line: P = exp(s - L), dS = P (dP - D) [* g] on one backward line      */
/* ------------------------------------------------------------------------ */

/* The 16 lanes of a backward line at x, masked: k the lanes below n, `in` those of them in
 * [va, vb) (the others get P = 0 and dS = 0 * (dP - D)). */
INLINE void bwd_masked(const int PER, const int GRAD, int n, int va, int vb, int x, float *s, float *dp,
                       const float *lse, const float *dd, const float *g)
{
    const int left = n - x;
    const __mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
    /* lanes x + t with va <= x + t < vb */
    const int a = va - x > 0 ? (va - x < 16 ? va - x : 16) : 0, b = vb - x > 0 ? (vb - x < 16 ? vb - x : 16) : 0;
    const __mmask16 in = (__mmask16)(k & (b > a ? (((1u << b) - 1u) & ~((1u << a) - 1u)) : 0u));
    const __m512 L = PER ? _mm512_maskz_loadu_ps(in, lse + x) : _mm512_set1_ps(lse[0]);
    const __m512 D = PER ? _mm512_maskz_loadu_ps(k, dd + x) : _mm512_set1_ps(dd[0]);
    const __m512 p = _mm512_maskz_mov_ps(in, exp_any(_mm512_maskz_sub_ps(in, _mm512_maskz_loadu_ps(in, s + x), L)));
    __m512 ds = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dp + x), D));
    if (GRAD) ds = _mm512_mask_mul_ps(ds, in, ds, _mm512_maskz_loadu_ps(in, g + x));
    _mm512_mask_storeu_ps(s + x, k, p);
    _mm512_mask_storeu_ps(dp + x, k, ds);
}

/* The same for 16 lanes that all lie in [va, vb) and below n: no mask, the same bits. */
INLINE void bwd_whole(const int PER, const int GRAD, int x, float *s, float *dp, const float *lse, const float *dd,
                      const float *g)
{
    const __m512 L = PER ? _mm512_loadu_ps(lse + x) : _mm512_set1_ps(lse[0]);
    const __m512 D = PER ? _mm512_loadu_ps(dd + x) : _mm512_set1_ps(dd[0]);
    const __m512 p = exp_any(_mm512_sub_ps(_mm512_loadu_ps(s + x), L));
    __m512 ds = _mm512_mul_ps(p, _mm512_sub_ps(_mm512_loadu_ps(dp + x), D));
    if (GRAD) ds = _mm512_mul_ps(ds, _mm512_loadu_ps(g + x));
    _mm512_storeu_ps(s + x, p);
    _mm512_storeu_ps(dp + x, ds);
}

/* One loop per (per_elem, g) pair (as transform_loop): the masked lanes before the first
 * whole vector inside [va, vb), the whole ones, the masked ones after. */
INLINE void bwd_loop(const int PER, const int GRAD, int n, int va, int vb, float *s, float *dp, const float *lse,
                     const float *dd, const float *g)
{
    const int f0 = (va + 15) & ~15, f1 = (vb < n ? vb : n) & ~15;
    int x = 0;
    for (; x < n && !(x >= f0 && x + 16 <= f1); x += 16) bwd_masked(PER, GRAD, n, va, vb, x, s, dp, lse, dd, g);
    for (; x + 16 <= f1; x += 16) bwd_whole(PER, GRAD, x, s, dp, lse, dd, g);
    for (; x < n; x += 16) bwd_masked(PER, GRAD, n, va, vb, x, s, dp, lse, dd, g);
}

static void bwd_line_avx512(int n, int va, int vb, float *s, float *dp, const float *lse, const float *dd,
                            int per_elem, const float *g)
{
    if (per_elem && g) bwd_loop(1, 1, n, va, vb, s, dp, lse, dd, g);
    else if (per_elem) bwd_loop(1, 0, n, va, vb, s, dp, lse, dd, g);
    else if (g) bwd_loop(0, 1, n, va, vb, s, dp, lse, dd, g);
    else bwd_loop(0, 0, n, va, vb, s, dp, lse, dd, g);
}

/* ------------------------------------------------------------------------ */
/* widen: float16 (vcvtph2ps) and bfloat16 (a 16-bit shift) to float32       */
/* ------------------------------------------------------------------------ */

INLINE __m512 widen16(__m256i h, int bf16)
{
    return bf16 ? _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)) : _mm512_cvtph_ps(h);
}

static void widen_avx512(int n, const uint16_t *src, int bf16, float *dst)
{
    int i = 0;
    for (; i + 32 <= n; i += 32) {
        _mm512_storeu_ps(dst + i, widen16(_mm256_loadu_si256((const __m256i *)(src + i)), bf16));
        _mm512_storeu_ps(dst + i + 16, widen16(_mm256_loadu_si256((const __m256i *)(src + i + 16)), bf16));
    }
    for (; i < n; i += 16) {
        const int left = n - i;
        const __mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
        _mm512_mask_storeu_ps(dst + i, k, widen16(_mm256_maskz_loadu_epi16(k, src + i), bf16));
    }
}

/* ------------------------------------------------------------------------ */
/* Decoding: scores and P V straight from the cache rows                     */
/* ------------------------------------------------------------------------ */

/*
 * The dot product's order (dec_qk). A bf16 row widens most cheaply 32 elements at
 * a time: one 512-bit load holds the pairs (2t, 2t+1) in 32-bit lane t, and one
 * ALU op each gives the even elements (the lane shifted left by 16) and the odd
 * ones (its high half: AND 0xffff0000) as float32, exactly. So every format sums
 * in that order: d in chunks of 32 elements from 0; lane t of a score's
 * accumulator adds q[c+2t] k[c+2t], then q[c+2t+1] k[c+2t+1], chunk after chunk
 * (FMAs from +0; elements past d are zeros and add +0, which never changes an
 * accumulator that started at +0); then reduce16's tree over the 16 lanes, then
 * the scale. A float32 row gets the same even/odd vectors from two loads and two
 * vpermt2ps, an f16 row from two vcvtph2ps and the same two permutes; the query
 * rows are permuted alike once per call (eo_q). (The natural order — lane t
 * sums elements t, t+16, ... — cost bf16 a vpermw per 16 elements on port 5,
 * beside reduce16's shuffles: measured on one core, 4 rows x 4 keys, d = 128,
 * keys in L1, bf16 12.1 -> 10.4 ns per key, float32 9.0 -> 11.0 ns; float32 is
 * memory-bound when it matters, bf16 the one that must be faster than memory.)
 *
 * dec_pv's elements are independent (each O element's FMAs run over the keys in
 * order), so it widens bf16 V rows the same way into even/odd accumulators and
 * interleaves them back (vpermt2ps) once per call, before O = alpha*O + acc.
 */

INLINE __mmask16 mask16(int left) { return left >= 16 ? (__mmask16)0xffff : left > 0 ? (__mmask16)((1u << left) - 1u) : 0; }
INLINE __mmask32 mask32(int left) { return left >= 32 ? (__mmask32)0xffffffffu : left > 0 ? (__mmask32)((1u << left) - 1u) : 0; }

/* even and odd elements of the 32 floats a (0..15), b (16..31) */
INLINE void eo_split(__m512 a, __m512 b, __m512 *e, __m512 *o)
{
    const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i io = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    *e = _mm512_permutex2var_ps(a, ie, b);
    *o = _mm512_permutex2var_ps(a, io, b);
}

/*
 * Elements c .. c+31 of a decode row (those past `left` = row length - c read as 0,
 * not touched in memory; FULL: left >= 32) widened to float32, even elements to *e
 * (lane t = element c+2t), odd ones to *o.
 */
INLINE void eo_load(const void *row, int c, int left, const int FULL, const int fmt, __m512 *e, __m512 *o)
{
    if (fmt == FA_ROW_BF16) {
        const uint16_t *h = (const uint16_t *)row + c;
        __m512i x = FULL ? _mm512_loadu_si512(h) : _mm512_maskz_loadu_epi16(mask32(left), h);
        __asm__("" : "+v"(x)); /* one load in a register (GCC would fold one into each of the two ops) */
        *e = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
        *o = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32((int)0xffff0000u)));
        return;
    }
    __m512 a, b;
    if (fmt == FA_ROW_F32) {
        const float *f = (const float *)row + c;
        a = FULL ? _mm512_loadu_ps(f) : _mm512_maskz_loadu_ps(mask16(left), f);
        b = FULL ? _mm512_loadu_ps(f + 16) : _mm512_maskz_loadu_ps(mask16(left - 16), f + 16);
    } else {
        const uint16_t *h = (const uint16_t *)row + c;
        a = _mm512_cvtph_ps(FULL ? _mm256_loadu_si256((const __m256i *)h) : _mm256_maskz_loadu_epi16(mask16(left), h));
        b = _mm512_cvtph_ps(FULL ? _mm256_loadu_si256((const __m256i *)(h + 16))
                                 : _mm256_maskz_loadu_epi16(mask16(left - 16), h + 16));
    }
    eo_split(a, b, e, o);
}

/*
 * Lane t of the result = the sum of the 16 lanes of a[t], by one fixed tree
 * for every t: within each 128-bit lane (x0 + x2) + (x1 + x3), then the four
 * 128-bit partials (L0 + L1) + (L2 + L3). Every level combines its two inputs
 * alike, so a dot product's bits do not depend on which slot t it sits in.
 */
INLINE __m512 reduce16(const __m512 *a)
{
    __m512 b[8], c[4], e[2];
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++)
        b[t] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * t], a[2 * t + 1]), _mm512_unpackhi_ps(a[2 * t], a[2 * t + 1]));
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) {
        const __m512d x = _mm512_castps_pd(b[2 * t]), y = _mm512_castps_pd(b[2 * t + 1]);
        c[t] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
#pragma GCC unroll 2
    for (int t = 0; t < 2; t++) /* 128-bit lanes: [X.L0, X.L2, Y.L0, Y.L2] + [X.L1, X.L3, Y.L1, Y.L3] */
        e[t] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * t], c[2 * t + 1], 0x88),
                             _mm512_shuffle_f32x4(c[2 * t], c[2 * t + 1], 0xdd));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], 0x88), _mm512_shuffle_f32x4(e[0], e[1], 0xdd));
}

/* Query rows in the dot product's order: qx[r][c + t] = q[r][c + 2t], qx[r][c + 16 + t] =
 * q[r][c + 2t + 1] for each chunk c, zeros past d (rows of dp = d rounded up to 32). */
INLINE void eo_q(const int ROWS, int d, const float *q, size_t ldq, float *qx, int dp)
{
    int c = 0;
    for (; c + 32 <= d; c += 32)
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            __m512 e, o;
            eo_load(q + (size_t)r * ldq, c, 32, 1, FA_ROW_F32, &e, &o);
            _mm512_storeu_ps(qx + (size_t)r * dp + c, e);
            _mm512_storeu_ps(qx + (size_t)r * dp + c + 16, o);
        }
    if (c < d)
        for (int r = 0; r < ROWS; r++) {
            __m512 e, o;
            eo_load(q + (size_t)r * ldq, c, d - c, 0, FA_ROW_F32, &e, &o);
            _mm512_storeu_ps(qx + (size_t)r * dp + c, e);
            _mm512_storeu_ps(qx + (size_t)r * dp + c + 16, o);
        }
}

/* One chunk of 32 elements at c of the dot products of dqk_block (FULL: c + 32 <= d). */
INLINE void dqk_step(const int ROWS, const int KEYS, const int fmt, const int QX, const int FULL, int c, int d,
                     const float *q, size_t ldq, const void *const *kr, __m512 *acc)
{
    __m512 qe[4], qo[4];
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++) {
        if (QX) {
            qe[r] = _mm512_loadu_ps(q + (size_t)r * ldq + c);
            qo[r] = _mm512_loadu_ps(q + (size_t)r * ldq + c + 16);
        } else {
            eo_load(q + (size_t)r * ldq, c, d - c, FULL, FA_ROW_F32, &qe[r], &qo[r]);
        }
    }
#pragma GCC unroll 16
    for (int jj = 0; jj < KEYS; jj++) {
        __m512 ke, ko;
        eo_load(kr[jj], c, d - c, FULL, fmt, &ke, &ko);
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) acc[r * KEYS + jj] = _mm512_fmadd_ps(qe[r], ke, acc[r * KEYS + jj]);
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) acc[r * KEYS + jj] = _mm512_fmadd_ps(qo[r], ko, acc[r * KEYS + jj]);
    }
}

/*
 * Scores of ROWS rows x KEYS keys (ROWS * KEYS <= 16 accumulators, each a 16-lane
 * partial dot product over d), reduced together by reduce16 into one vector
 * whose lane r * KEYS + jj is S[r][jj]. Keys jj >= nj repeat the last row (read,
 * never stored). The query rows come from qx in eo_q's order (row stride ldq)
 * when QX, else straight from q, permuted here (the same values either way).
 */
DEC_BLOCK void dqk_block(const int ROWS, const int KEYS, const int fmt, const int QX, int d, const float *q, size_t ldq,
                      const void *const *rows, int nj, float scale, float *s, size_t lds)
{
    __m512 acc[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; t++) acc[t] = _mm512_setzero_ps();
    const void *kr[16];
#pragma GCC unroll 16
    for (int jj = 0; jj < KEYS; jj++) kr[jj] = rows[jj < nj ? jj : nj - 1];
    int c = 0;
    for (; c + 32 <= d; c += 32) dqk_step(ROWS, KEYS, fmt, QX, 1, c, d, q, ldq, kr, acc);
    if (c < d) dqk_step(ROWS, KEYS, fmt, QX, 0, c, d, q, ldq, kr, acc); /* the last, partial chunk */
    const __m512 sc = _mm512_mul_ps(_mm512_set1_ps(scale), reduce16(acc));
    const unsigned keep = (1u << nj) - 1u;
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++) /* lanes r*KEYS .. r*KEYS+nj-1 to S[r][0 .. nj-1] (lds >= 16 >= r*KEYS/r) */
        _mm512_mask_storeu_ps(s + (size_t)r * lds - r * KEYS, (__mmask16)(keep << (r * KEYS)), sc);
}

/* Keys a block for ROWS query rows (dqk_rows). */
#define DQK_KEYS(ROWS) ((ROWS) == 1 ? 16 : (ROWS) == 2 ? 8 : 4)

/* The between hook's progress over one dec_qk call: before block `done` of `total`. */
typedef struct dqk_pace {
    const fa_between *between;
    int done, total;
} dqk_pace;

/* All n keys against ROWS (<= 4) query rows: 16 keys a block for one row, 8 for two, else 4
 * (the between hook before each). */
INLINE void dqk_rows(const int ROWS, const int fmt, const int QX, int n, int d, const float *q, size_t ldq,
                     const void *const *rows, float scale, float *s, size_t lds, dqk_pace *pace)
{
    const int KEYS = DQK_KEYS(ROWS);
    for (int j = 0; j < n; j += KEYS) {
        fa_between_run(pace->between, pace->done++, pace->total);
        dqk_block(ROWS, KEYS, fmt, QX, d, q, ldq, rows + j, n - j < KEYS ? n - j : KEYS, scale, s + j, lds);
    }
}

/* Query rows of d <= EO_QMAX are permuted once per call into a stack buffer (4 rows); a
 * longer d is permuted per key block instead (the same values). */
#define EO_QMAX 512

INLINE void dec_qk_fmt(const int fmt, int nr, int n, int d, const float *q, size_t ldq, const void *const *rows,
                       float scale, float *s, size_t lds, const fa_between *between)
{
    float qx[4 * EO_QMAX] __attribute__((aligned(64)));
    const int dp = (d + 31) & ~31;
    dqk_pace pace = {between, 0, 0}; /* the hook's blocks, over every row block */
    for (int i = 0; i < nr; i += 4) {
        const int m = nr - i < 4 ? nr - i : 4;
        pace.total += (n + DQK_KEYS(m) - 1) / DQK_KEYS(m);
    }
    for (int i = 0; i < nr; i += 4) { /* row blocks of 4 (1 and 2 rows alone: more keys a block) */
        const int m = nr - i < 4 ? nr - i : 4;
        const float *qi = q + (size_t)i * ldq;
        float *si = s + (size_t)i * lds;
        if (d > EO_QMAX) {
            switch (m) {
            case 4: dqk_rows(4, fmt, 0, n, d, qi, ldq, rows, scale, si, lds, &pace); break;
            case 3: dqk_rows(3, fmt, 0, n, d, qi, ldq, rows, scale, si, lds, &pace); break;
            case 2: dqk_rows(2, fmt, 0, n, d, qi, ldq, rows, scale, si, lds, &pace); break;
            default: dqk_rows(1, fmt, 0, n, d, qi, ldq, rows, scale, si, lds, &pace); break;
            }
            continue;
        }
        switch (m) {
        case 4:
            eo_q(4, d, qi, ldq, qx, dp);
            dqk_rows(4, fmt, 1, n, d, qx, (size_t)dp, rows, scale, si, lds, &pace);
            break;
        case 3:
            eo_q(3, d, qi, ldq, qx, dp);
            dqk_rows(3, fmt, 1, n, d, qx, (size_t)dp, rows, scale, si, lds, &pace);
            break;
        case 2:
            eo_q(2, d, qi, ldq, qx, dp);
            dqk_rows(2, fmt, 1, n, d, qx, (size_t)dp, rows, scale, si, lds, &pace);
            break;
        default:
            eo_q(1, d, qi, ldq, qx, dp);
            dqk_rows(1, fmt, 1, n, d, qx, (size_t)dp, rows, scale, si, lds, &pace);
            break;
        }
    }
}

static void dec_qk_avx512(int nr, int n, int d, const float *q, size_t ldq, const void *const *rows, int fmt,
                          float scale, float *s, size_t lds, const fa_between *between)
{
    if (nr <= 0 || n <= 0) return;
    if (fmt == FA_ROW_BF16) dec_qk_fmt(FA_ROW_BF16, nr, n, d, q, ldq, rows, scale, s, lds, between);
    else if (fmt == FA_ROW_F16) dec_qk_fmt(FA_ROW_F16, nr, n, d, q, ldq, rows, scale, s, lds, between);
    else dec_qk_fmt(FA_ROW_F32, nr, n, d, q, ldq, rows, scale, s, lds, between);
}

/*
 * O rows [0, ROWS) x columns [c0, c0 + 16*VECS) (columns past dv read as 0 and
 * not stored; FULL: none is past dv): acc = sum_j P[r][j] V_j in key order from
 * +0, then O = alpha*O + acc — per element the same steps whatever the blocking
 * or format. bf16 rows: vectors 2u and 2u+1 hold the even and odd columns of
 * the 32 at c0 + 32u (eo_load), interleaved back before the update.
 */
DEC_BLOCK void dpv_block(const int ROWS, const int VECS, const int fmt, const int FULL, int n, int c0, int dv,
                      const float *p, size_t ldp, const void *const *rows, const float *alpha, float *o, size_t ldo)
{
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 8
        for (int u = 0; u < VECS; u++) acc[r][u] = _mm512_setzero_ps();
    for (int j = 0; j < n; j++) {
        const void *row = rows[j];
        __m512 pb[4];
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) pb[r] = _mm512_set1_ps(p[(size_t)r * ldp + j]);
        if (fmt == FA_ROW_BF16) {
#pragma GCC unroll 4
            for (int u = 0; u < VECS; u += 2) {
                __m512 ve, vo;
                eo_load(row, c0 + 16 * u, FULL ? 32 : dv - c0 - 16 * u, FULL, FA_ROW_BF16, &ve, &vo);
#pragma GCC unroll 4
                for (int r = 0; r < ROWS; r++) {
                    acc[r][u] = _mm512_fmadd_ps(pb[r], ve, acc[r][u]);
                    acc[r][u + 1] = _mm512_fmadd_ps(pb[r], vo, acc[r][u + 1]);
                }
            }
        } else {
#pragma GCC unroll 8
            for (int u = 0; u < VECS; u++) {
                const int c = c0 + 16 * u;
                __m512 vv;
                if (fmt == FA_ROW_F32)
                    vv = FULL ? _mm512_loadu_ps((const float *)row + c) : _mm512_maskz_loadu_ps(mask16(dv - c), (const float *)row + c);
                else
                    vv = _mm512_cvtph_ps(FULL ? _mm256_loadu_si256((const __m256i *)((const uint16_t *)row + c))
                                              : _mm256_maskz_loadu_epi16(mask16(dv - c), (const uint16_t *)row + c));
#pragma GCC unroll 4
                for (int r = 0; r < ROWS; r++) acc[r][u] = _mm512_fmadd_ps(pb[r], vv, acc[r][u]);
            }
        }
    }
    if (fmt == FA_ROW_BF16) {
        const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
        const __m512i ih = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
            for (int u = 0; u < VECS; u += 2) {
                const __m512 e = acc[r][u], od = acc[r][u + 1];
                acc[r][u] = _mm512_permutex2var_ps(e, il, od);
                acc[r][u + 1] = _mm512_permutex2var_ps(e, ih, od);
            }
    }
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 8
        for (int u = 0; u < VECS; u++) {
            float *dst = o + (size_t)r * ldo + c0 + 16 * u;
            if (FULL) {
                _mm512_storeu_ps(dst, _mm512_fmadd_ps(a, _mm512_loadu_ps(dst), acc[r][u]));
                continue;
            }
            const __mmask16 mk = mask16(dv - c0 - 16 * u);
            if (mk) _mm512_mask_storeu_ps(dst, mk, _mm512_fmadd_ps(a, _mm512_maskz_loadu_ps(mk, dst), acc[r][u]));
        }
    }
}

/* One column panel of VECS vectors at c0 for rows [0, ROWS): unmasked when it lies inside dv. */
INLINE void dpv_panel(const int ROWS, const int VECS, const int fmt, int n, int c0, int dv, const float *p,
                      size_t ldp, const void *const *rows, const float *alpha, float *o, size_t ldo)
{
    if (c0 + 16 * VECS <= dv) dpv_block(ROWS, VECS, fmt, 1, n, c0, dv, p, ldp, rows, alpha, o, ldo);
    else dpv_block(ROWS, VECS, fmt, 0, n, c0, dv, p, ldp, rows, alpha, o, ldo);
}

INLINE void dec_pv_fmt(const int fmt, int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows,
                       const float *alpha, float *o, size_t ldo)
{
    if (nr <= 2) { /* 1-2 rows x 8 vectors (128 columns); the last 64 or fewer columns in 4 */
        for (int c0 = 0; c0 < dv;) {
            if (dv - c0 <= 64) { /* dv = 64: no masked FMAs on 4 vectors past the end */
                if (nr == 1) dpv_panel(1, 4, fmt, n, c0, dv, p, ldp, rows, alpha, o, ldo);
                else dpv_panel(2, 4, fmt, n, c0, dv, p, ldp, rows, alpha, o, ldo);
                c0 += 64;
                continue;
            }
            if (nr == 1) dpv_panel(1, 8, fmt, n, c0, dv, p, ldp, rows, alpha, o, ldo);
            else dpv_panel(2, 8, fmt, n, c0, dv, p, ldp, rows, alpha, o, ldo);
            c0 += 128;
        }
        return;
    }
    for (int i = 0; i < nr; i += 4) /* row blocks of 4 x 4 vectors (64 columns) */
        for (int c0 = 0; c0 < dv; c0 += 64) {
            const float *pi = p + (size_t)i * ldp;
            float *oi = o + (size_t)i * ldo;
            switch (nr - i < 4 ? nr - i : 4) {
            case 4: dpv_panel(4, 4, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            case 3: dpv_panel(3, 4, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            case 2: dpv_panel(2, 4, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            default: dpv_panel(1, 4, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            }
        }
}

static void dec_pv_avx512(int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows, int fmt,
                          const float *alpha, float *o, size_t ldo)
{
    if (nr <= 0) return;
    if (fmt == FA_ROW_BF16) dec_pv_fmt(FA_ROW_BF16, nr, n, dv, p, ldp, rows, alpha, o, ldo);
    else if (fmt == FA_ROW_F16) dec_pv_fmt(FA_ROW_F16, nr, n, dv, p, ldp, rows, alpha, o, ldo);
    else dec_pv_fmt(FA_ROW_F32, nr, n, dv, p, ldp, rows, alpha, o, ldo);
}

const fa_kernels fa_kernels_avx512 = {
    .name = "avx512",
    .simd_width = 16,
    .row_block = QK_MR,
    .qk = qk_avx512,
    .softmax = softmax_avx512,
    .pv = pv_avx512,
    .pv_t = pv_t_avx512,
    .cut_cols = cut_cols_avx512,
    .cut_lead = cut_lead_avx512,
    .cut_lead_fwd = cut_lead_fwd_avx512,
    .vexp = vexp_avx512,
    .transpose = fa_transpose_avx512, /* avx512_transpose.c */
    .transform = transform_avx512,
    .widen = widen_avx512,
    .bwd_line = bwd_line_avx512,
    .dec_qk = dec_qk_avx512,
    .dec_pv = dec_pv_avx512,
};
