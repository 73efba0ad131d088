/*
 * avx2.c — AVX2 + FMA micro-kernels (8 float32 lanes, 16 ymm registers).
 *
 * Compiled with -mavx2 -mfma on this file only; dispatch.c calls into it only
 * after CPUID says the CPU (and the OS, XSAVE) supports AVX2 and FMA.
 *
 * Register blocking, sized to the 16 ymm registers:
 *
 *   qk  S = Q Kt:    MR = 6 rows x NV = 2 vectors (16 columns) = 12 ymm
 *                    accumulators + 2 for Kt[c][j..j+15] + 1 broadcast of
 *                    Q[i][c] = 15 registers. Per c: 2 loads, 6 broadcasts,
 *                    12 FMAs (12 chains cover 2 pipes x 4 cycles of latency);
 *                    the scale multiplies the finished sums before the store.
 *                    Column panel outside, row block inside (the Kt panel
 *                    [d][16], 8 KiB at d = 128, stays in L1).
 *   pv  O = aO + PV: MR = 6 rows x NV = 2 vectors (16 columns of dv), the
 *                    same shape: per key j, 2 loads of V[j][c..c+15], 6
 *                    broadcasts of P[i][j], 12 FMAs; O is read and written
 *                    once per key chunk (O = alpha*O + acc on the first,
 *                    O + acc after). Loop order: column panel (16) > key
 *                    chunk (bc split evenly, <= PV_KC = 256) > row block, as
 *                    avx512.c, so the V sub-panel (<= [256][16], 16 KiB)
 *                    stays in a 32 KiB L1 (Zen 3).
 *   softmax          rows in groups of 8: maxima first, alpha for the group
 *                    in one vector exp, then each row's exp pass.
 *
 * row_block = 6, so the driver should pick Br as a multiple of 6 (e.g. 96 or
 * 120); other Br work, the last rows running 1..5-row versions of the same
 * template.
 *
 * Tails: qk columns run in 16- or 8-wide panels over Kt's zero padding (ldk
 * is a multiple of 16) and store S only for j < bc (vmaskmovps for the
 * partial vector). pv's last, partial vector of dv uses vmaskmovps loads and
 * stores, so V and O are never touched beyond dv (such panels run a separate
 * instantiation; the full panels use plain loads). Q is never read beyond d.
 *
 * exp: see simd_exp.h. 2^n is built as float bits: one FMA adds a shifter
 * (1.5 * 2^23 + 127) so that the low bits of x*log2(e) + shifter hold n + 127,
 * and a shift by 23 moves them into the exponent field. Valid for
 * n + 127 in [1, 254]; x <= ln(FLT_MIN) is masked to exactly 0 (that covers
 * -inf and every n below range). The general vexp also needs n = 128 (x in
 * [88.38, 88.72] is still finite), so it splits 2^n = 2^(n/2) * 2^(n - n/2).
 */
#include "kernels.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "fma_peak.h"
#include "simd_exp.h"
#include "tensor.h"

#define MR 6
#define NV 2
#define PV_KC 256 /* most keys per pv chunk: V sub-panel [256][16] = 16 KiB, half a 32 KiB L1 */

#define INLINE static inline __attribute__((always_inline))

/* ------------------------------------------------------------------------ */
/* exp                                                                       */
/* ------------------------------------------------------------------------ */

#define SHIFTER 12583039.0f /* 1.5 * 2^23 + 127 */

/* The shared steps: returns p = exp(r) and t (whose low bits hold n + 127). */
INLINE __m256 exp_poly(__m256 x, __m256 *t_out)
{
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(FA_EXP_LOG2E), _mm256_set1_ps(SHIFTER));
    const __m256 n = _mm256_sub_ps(t, _mm256_set1_ps(SHIFTER));
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FA_EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(FA_EXP_LN2_LO), r);
    __m256 p = _mm256_set1_ps(FA_EXP_C6);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FA_EXP_C5));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FA_EXP_C4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FA_EXP_C3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(FA_EXP_C2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    *t_out = t;
    return p;
}

/* exp(x) for x <= 0, -inf or NaN (softmax arguments): n in [-126, 0]. */
INLINE __m256 exp_nonpos(__m256 x)
{
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(FA_EXP_X_MIN), _CMP_NLE_UQ);
    __m256 t;
    const __m256 p = exp_poly(x, &t);
    const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
    return _mm256_and_ps(_mm256_mul_ps(p, scale), keep);
}

/*
 * exp_nonpos of four vectors, step by step across the four: the same operations on
 * every lane (the same bits), emitted interleaved. The exp is a chain of ~12 dependent
 * operations; written one vector after the other, a core that splits 256-bit
 * operations in two (Zen 1) ran out of scheduler entries before it reached the next
 * vector's chain and waited on each (softmax at 3.1 cycles a score there).
 */
INLINE void exp_nonpos_x4(__m256 *x)
{
    __m256 keep[4], t[4], n[4], r[4], p[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) keep[v] = _mm256_cmp_ps(x[v], _mm256_set1_ps(FA_EXP_X_MIN), _CMP_NLE_UQ);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) t[v] = _mm256_fmadd_ps(x[v], _mm256_set1_ps(FA_EXP_LOG2E), _mm256_set1_ps(SHIFTER));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) n[v] = _mm256_sub_ps(t[v], _mm256_set1_ps(SHIFTER));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) r[v] = _mm256_fnmadd_ps(n[v], _mm256_set1_ps(FA_EXP_LN2_HI), x[v]);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) r[v] = _mm256_fnmadd_ps(n[v], _mm256_set1_ps(FA_EXP_LN2_LO), r[v]);
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) p[v] = _mm256_fmadd_ps(_mm256_set1_ps(FA_EXP_C6), r[v], _mm256_set1_ps(FA_EXP_C5));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) p[v] = _mm256_fmadd_ps(p[v], r[v], _mm256_set1_ps(FA_EXP_C4));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) p[v] = _mm256_fmadd_ps(p[v], r[v], _mm256_set1_ps(FA_EXP_C3));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) p[v] = _mm256_fmadd_ps(p[v], r[v], _mm256_set1_ps(FA_EXP_C2));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) p[v] = _mm256_fmadd_ps(p[v], r[v], _mm256_set1_ps(1.0f));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) p[v] = _mm256_fmadd_ps(p[v], r[v], _mm256_set1_ps(1.0f));
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t[v]), 23));
        x[v] = _mm256_and_ps(_mm256_mul_ps(p[v], scale), keep[v]);
    }
}

/* exp(x) for any x: n in [-126, 128], 2^n split in two factors. */
INLINE __m256 exp_any(__m256 x)
{
    x = _mm256_min_ps(_mm256_set1_ps(FA_EXP_X_CLAMP), x); /* NaN stays NaN */
    const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(FA_EXP_X_MIN), _CMP_NLE_UQ);
    __m256 t;
    const __m256 p = exp_poly(x, &t);
    /* bits(t) = bits(SHIFTER) + n  ->  n */
    const __m256i n = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4b40007f));
    const __m256i n1 = _mm256_srai_epi32(n, 1);
    const __m256i n2 = _mm256_sub_epi32(n, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_and_ps(_mm256_mul_ps(_mm256_mul_ps(p, s1), s2), keep);
}

/* Lane mask (all ones) for lanes < k, k in [0, 8]. */
INLINE __m256i lanes_below(int k)
{
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

static void vexp_avx2(int n, const float *x, float *y)
{
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_any(_mm256_loadu_ps(x + i)));
    if (i < n) {
        const __m256i k = lanes_below(n - i);
        _mm256_maskstore_ps(y + i, k, exp_any(_mm256_maskload_ps(x + i, k)));
    }
}

/* ------------------------------------------------------------------------ */
/* transform: softcap, ALiBi, mask of one score line                         */
/* ------------------------------------------------------------------------ */

/* c tanh(u / c) (the softcap; c = 1: tanh(u)), simd_exp.h's algorithm for tanh with c
 * folded into the small-|x| branch as avx512.c's cap_tanh_avx512 does: for x = |u| / c,
 * c (x + x z P(z)) is taken as |u| + (|u| z) P(z) — one multiply fewer, u exact where
 * c fl(|u| / c) is not; with c = 1 the old tanh bit for bit. exp_nonpos's reconstruction
 * holds for n + 127 in [1, 254]; here the argument 2|x| <= 20 gives n <= 29. */
INLINE __m256 cap_tanh_avx2(__m256 u, __m256 vcap, __m256 vinv)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 au = _mm256_andnot_ps(sign, u);
    const __m256 ax = _mm256_mul_ps(au, vinv);
    const __m256 z = _mm256_mul_ps(ax, ax);
    __m256 p = _mm256_set1_ps(FA_TANH_T4);
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(FA_TANH_T3));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(FA_TANH_T2));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(FA_TANH_T1));
    p = _mm256_fmadd_ps(p, z, _mm256_set1_ps(FA_TANH_T0));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(au, z), p, au);
    const __m256 is_small = _mm256_cmp_ps(ax, _mm256_set1_ps(FA_TANH_SMALL), _CMP_LT_OQ);
    __m256 t = small;
    if (_mm256_movemask_ps(is_small) != 0xff) { /* softcapped scores are mostly small: skip exp when all are */
        const __m256 c = _mm256_min_ps(_mm256_set1_ps(FA_TANH_X_ONE), ax); /* NaN stays NaN */
        const __m256 e = exp_nonpos(_mm256_add_ps(c, c));
        const __m256 large = _mm256_sub_ps(one, _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, one)));
        t = _mm256_blendv_ps(_mm256_mul_ps(vcap, large), small, is_small);
    }
    return _mm256_or_ps(t, _mm256_and_ps(u, sign));
}

/* (float)(slope * |rel|) for rel = base + step * lane, lanes 0..7, in double
 * as scalar.c does (exact for |rel| < 2^53). */
INLINE __m256 alibi_bias(double base, double step, __m256d slope)
{
    const __m256d sign = _mm256_set1_pd(-0.0);
    const __m256d lane = _mm256_setr_pd(0.0, 1.0, 2.0, 3.0);
    const __m256d r0 = _mm256_andnot_pd(sign, _mm256_fmadd_pd(lane, _mm256_set1_pd(step), _mm256_set1_pd(base)));
    const __m256d r1 = _mm256_andnot_pd(sign, _mm256_fmadd_pd(lane, _mm256_set1_pd(step), _mm256_set1_pd(base + 4.0 * step)));
    return _mm256_set_m128(_mm256_cvtpd_ps(_mm256_mul_pd(slope, r1)), _mm256_cvtpd_ps(_mm256_mul_pd(slope, r0)));
}

/* Lanes [x, x + 8) of a line (k: those below vb; full: all 8) through the softcap, its
 * derivative and ALiBi: the flags are constants, so each combination compiles to its own
 * loop (avx512.c's transform_vec). */
INLINE void transform_vec(const int CAP, const int GRAD, const int ALIBI, float *s, int x, __m256i k, int full,
                          __m256 vcap, __m256 vinv, __m256d vslope, int64_t rel0, int rel_step, float *g)
{
    __m256 u = full ? _mm256_loadu_ps(s + x) : _mm256_maskload_ps(s + x, k);
    if (CAP) {
        u = cap_tanh_avx2(u, vcap, vinv);
        if (GRAD) {
            const __m256 th = _mm256_mul_ps(u, vinv);
            const __m256 gv = _mm256_sub_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(th, th)); /* d/dt c tanh(t/c) */
            if (full) _mm256_storeu_ps(g + x, gv);
            else _mm256_maskstore_ps(g + x, k, gv);
        }
    }
    if (ALIBI) u = _mm256_sub_ps(u, alibi_bias((double)(rel0 + (int64_t)rel_step * x), (double)rel_step, vslope));
    if (full) _mm256_storeu_ps(s + x, u);
    else _mm256_maskstore_ps(s + x, k, u);
}

INLINE void transform_loop(const int CAP, const int GRAD, const int ALIBI, int va, int vb, float *s, float cap,
                           float inv_cap, double slope, int64_t rel0, int rel_step, float *g)
{
    const __m256 vcap = _mm256_set1_ps(cap), vinv = _mm256_set1_ps(inv_cap);
    const __m256d vslope = _mm256_set1_pd(slope);
    int x = va;
    for (; x + 8 <= vb; x += 8) /* whole vectors: no mask, no masked access */
        transform_vec(CAP, GRAD, ALIBI, s, x, _mm256_set1_epi32(-1), 1, vcap, vinv, vslope, rel0, rel_step, g);
    if (x < vb)
        transform_vec(CAP, GRAD, ALIBI, s, x, lanes_below(vb - x), 0, vcap, vinv, vslope, rel0, rel_step, g);
}

static void transform_avx2(int n, int va, int vb, float *s, float cap, float inv_cap, double slope,
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

/* Rows [0, mr) x columns [0, 8*nv); S stored only for columns < ncols. */
INLINE void qk_block(const int mr, const int nv, int d, int ncols, const float *q, size_t ldq,
                     const float *kt, size_t ldk, float scale, float *s, size_t lds)
{
    __m256 acc[MR][NV];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) acc[r][v] = _mm256_setzero_ps();

    for (int c = 0; c < d; c++) {
        const float *krow = kt + (size_t)c * ldk;
        __m256 kv[NV];
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) kv[v] = _mm256_loadu_ps(krow + 8 * v);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const __m256 qb = _mm256_broadcast_ss(q + (size_t)r * ldq + c);
#pragma GCC unroll 2
            for (int v = 0; v < nv; v++) acc[r][v] = _mm256_fmadd_ps(qb, kv[v], acc[r][v]);
        }
    }

#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            float *dst = s + (size_t)r * lds + 8 * v;
            const int left = ncols - 8 * v;
            if (left >= 8)
                _mm256_storeu_ps(dst, _mm256_mul_ps(_mm256_set1_ps(scale), acc[r][v]));
            else if (left > 0)
                _mm256_maskstore_ps(dst, lanes_below(left), _mm256_mul_ps(_mm256_set1_ps(scale), acc[r][v]));
        }
}

INLINE void qk_panel(const int nv, int br, int d, int ncols, const float *q, size_t ldq,
                     const float *kt, size_t ldk, float scale, float *s, size_t lds)
{
    int i = 0;
    for (; i + MR <= br; i += MR)
        qk_block(MR, nv, d, ncols, q + (size_t)i * ldq, ldq, kt, ldk, scale, s + (size_t)i * lds, lds);
    const float *qi = q + (size_t)i * ldq;
    float *si = s + (size_t)i * lds;
    switch (br - i) {
    case 5: qk_block(5, nv, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 4: qk_block(4, nv, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 3: qk_block(3, nv, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 2: qk_block(2, nv, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    case 1: qk_block(1, nv, d, ncols, qi, ldq, kt, ldk, scale, si, lds); break;
    default: break;
    }
}

static void qk_avx2(int br, int bc, int d, const float *q, size_t ldq, const float *kt, size_t ldk,
                    float scale, float *s, size_t lds)
{
    int j = 0;
    for (; j + 8 * NV <= bc; j += 8 * NV) qk_panel(NV, br, d, 8 * NV, q, ldq, kt + j, ldk, scale, s + j, lds);
    if (bc - j > 8)
        qk_panel(2, br, d, bc - j, q, ldq, kt + j, ldk, scale, s + j, lds);
    else if (bc - j > 0)
        qk_panel(1, br, d, bc - j, q, ldq, kt + j, ldk, scale, s + j, lds);
}

/* ------------------------------------------------------------------------ */
/* softmax                                                                   */
/* ------------------------------------------------------------------------ */

INLINE float hmax(__m256 v)
{
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

INLINE float hsum(__m256 v)
{
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_shuffle_ps(x, x, 1));
    return _mm_cvtss_f32(x);
}

/*
 * max(m, max_{j < bc} row[j]); xt holds the tail lanes (-inf beyond bc).
 * maxps returns its second operand when either is NaN, so max(x, acc)
 * skips a NaN score, as scalar.c's `x > mx ? x : mx` does.
 */
INLINE float row_max(const float *row, int nfull, __m256 xt, float m)
{
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    __m256 mx0 = _mm256_max_ps(xt, _mm256_set1_ps(m)), mx1 = neg_inf, mx2 = neg_inf, mx3 = neg_inf;
    int j = 0;
    for (; j + 32 <= nfull; j += 32) {
        mx0 = _mm256_max_ps(_mm256_loadu_ps(row + j), mx0);
        mx1 = _mm256_max_ps(_mm256_loadu_ps(row + j + 8), mx1);
        mx2 = _mm256_max_ps(_mm256_loadu_ps(row + j + 16), mx2);
        mx3 = _mm256_max_ps(_mm256_loadu_ps(row + j + 24), mx3);
    }
    for (; j < nfull; j += 8) mx0 = _mm256_max_ps(_mm256_loadu_ps(row + j), mx0);
    return hmax(_mm256_max_ps(_mm256_max_ps(mx0, mx1), _mm256_max_ps(mx2, mx3)));
}

/* The tail lanes of a row, lanes >= bc as -inf (they add nothing to max or sum). */
INLINE __m256 row_tail(const float *row, int nfull, int ntail, __m256i tail)
{
    return ntail ? _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), _mm256_maskload_ps(row + nfull, tail),
                                    _mm256_castsi256_ps(tail))
                 : _mm256_set1_ps(-INFINITY);
}

/*
 * Rows in groups of 8, as in avx512.c: the 8 row maxima first (independent,
 * so their reductions overlap), alpha for the group in one vector exp, then
 * each row's exp pass.
 */
static void softmax_avx2(int br, int bc, float *s, size_t lds, float *m, float *l, float *alpha)
{
    const int nfull = bc & ~7;
    const int ntail = bc - nfull;
    const __m256i tail = lanes_below(ntail);
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    for (int i0 = 0; i0 < br; i0 += 8) {
        const int g = br - i0 < 8 ? br - i0 : 8;
        const __m256i gm = lanes_below(g);
        float mnew[8] = {0};
        for (int r = 0; r < g; r++) {
            const float *row = s + (size_t)(i0 + r) * lds;
            mnew[r] = row_max(row, nfull, row_tail(row, nfull, ntail, tail), m[i0 + r]);
        }

        /* alpha = exp(m - m_new): 0 when m was -inf; 1 when nothing is visible yet */
        const __m256 vmnew = _mm256_loadu_ps(mnew);
        const __m256 none = _mm256_cmp_ps(vmnew, neg_inf, _CMP_EQ_OQ);
        __m256 va = exp_nonpos(_mm256_sub_ps(_mm256_maskload_ps(m + i0, gm), vmnew));
        va = _mm256_blendv_ps(va, _mm256_set1_ps(1.0f), none);
        _mm256_maskstore_ps(alpha + i0, gm, va);
        float a[8];
        _mm256_storeu_ps(a, va);

        for (int r = 0; r < g; r++) {
            const int i = i0 + r;
            float *row = s + (size_t)i * lds;
            if (mnew[r] == -INFINITY) { /* nothing visible yet: P = 0, keep O, l and m (l = NaN for a NaN score) */
                int nan = 0;
                for (int j = 0; j < nfull; j += 8) {
                    const __m256 x = _mm256_loadu_ps(row + j);
                    nan |= _mm256_movemask_ps(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
                    _mm256_storeu_ps(row + j, _mm256_setzero_ps());
                }
                for (int j = nfull; j < nfull + ntail; j++) nan |= row[j] != row[j];
                if (ntail) _mm256_maskstore_ps(row + nfull, tail, _mm256_setzero_ps());
                if (nan) l[i] = NAN; /* the max skipped it; NaN sticks (kernels.h) */
                continue;
            }
            const __m256 vm = _mm256_set1_ps(mnew[r]);
            __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
            int j = 0;
            /* four vectors a step, their exps interleaved (exp_nonpos_x4); the sums take the
             * vectors in the same order as two a step did */
            for (; j + 32 <= nfull; j += 32) {
                __m256 pv[4];
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) pv[v] = _mm256_sub_ps(_mm256_loadu_ps(row + j + 8 * v), vm);
                exp_nonpos_x4(pv);
#pragma GCC unroll 4
                for (int v = 0; v < 4; v++) _mm256_storeu_ps(row + j + 8 * v, pv[v]);
                sum0 = _mm256_add_ps(_mm256_add_ps(sum0, pv[0]), pv[2]);
                sum1 = _mm256_add_ps(_mm256_add_ps(sum1, pv[1]), pv[3]);
            }
            for (; j + 16 <= nfull; j += 16) {
                const __m256 p0 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
                const __m256 p1 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + j + 8), vm));
                _mm256_storeu_ps(row + j, p0);
                _mm256_storeu_ps(row + j + 8, p1);
                sum0 = _mm256_add_ps(sum0, p0);
                sum1 = _mm256_add_ps(sum1, p1);
            }
            if (j < nfull) {
                const __m256 p0 = exp_nonpos(_mm256_sub_ps(_mm256_loadu_ps(row + j), vm));
                _mm256_storeu_ps(row + j, p0);
                sum0 = _mm256_add_ps(sum0, p0);
            }
            if (ntail) {
                const __m256 p1 = exp_nonpos(_mm256_sub_ps(row_tail(row, nfull, ntail, tail), vm));
                _mm256_maskstore_ps(row + nfull, tail, p1);
                sum1 = _mm256_add_ps(sum1, p1);
            }
            l[i] = a[r] * l[i] + hsum(_mm256_add_ps(sum0, sum1));
            m[i] = mnew[r];
        }
    }
}

/* ------------------------------------------------------------------------ */
/* pv: O = alpha O + P V                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Rows [0, mr) x columns [0, 8*nv) of v/o. With `masked`, the last vector is
 * restricted to the lanes in `last` (vmaskmovps), so nothing beyond dv is
 * read or written; without it every vector is full.
 */
INLINE void pv_block(const int TR, const int mr, const int nv, const int masked, __m256i last, int bc,
                     const float *p, size_t ldp, const float *v, size_t ldv, const float *alpha,
                     float *o, size_t ldo) /* alpha NULL: O = O + acc */
{
    __m256 acc[MR][NV];
#pragma GCC unroll 6
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 2
        for (int u = 0; u < nv; u++) acc[r][u] = _mm256_setzero_ps();

    for (int j = 0; j < bc; j++) {
        const float *vrow = v + (size_t)j * ldv;
        __m256 vv[NV];
#pragma GCC unroll 2
        for (int u = 0; u < nv; u++)
            vv[u] = (masked && u == nv - 1) ? _mm256_maskload_ps(vrow + 8 * u, last)
                                            : _mm256_loadu_ps(vrow + 8 * u);
#pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const __m256 pb = _mm256_broadcast_ss(TR ? p + (size_t)j * ldp + r : p + (size_t)r * ldp + j);
#pragma GCC unroll 2
            for (int u = 0; u < nv; u++) acc[r][u] = _mm256_fmadd_ps(pb, vv[u], acc[r][u]);
        }
    }

#pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
        const __m256 a = alpha ? _mm256_broadcast_ss(alpha + r) : _mm256_set1_ps(1.0f);
#pragma GCC unroll 2
        for (int u = 0; u < nv; u++) {
            float *dst = o + (size_t)r * ldo + 8 * u;
            if (masked && u == nv - 1)
                _mm256_maskstore_ps(dst, last, _mm256_fmadd_ps(a, _mm256_maskload_ps(dst, last), acc[r][u]));
            else
                _mm256_storeu_ps(dst, _mm256_fmadd_ps(a, _mm256_loadu_ps(dst), acc[r][u]));
        }
    }
}

/* All row blocks of one (column panel, key chunk): nv vectors, the last masked when `masked`.
 * TR: P is stored transposed (pv_t), row i of a block at p + i. */
INLINE void pv_panel(const int TR, const int nv, const int masked, __m256i last, int br, int kc, const float *p,
                     size_t ldp, const float *v, size_t ldv, const float *alpha, float *o, size_t ldo)
{
    const size_t rs = TR ? 1 : ldp; /* from one row of P to the next */
    int i = 0;
    for (; i + MR <= br; i += MR)
        pv_block(TR, MR, nv, masked, last, kc, p + (size_t)i * rs, ldp, v, ldv, alpha ? alpha + i : NULL,
                 o + (size_t)i * ldo, ldo);
    const float *pi = p + (size_t)i * rs, *ai = alpha ? alpha + i : NULL;
    float *oi = o + (size_t)i * ldo;
    switch (br - i) {
    case 5: pv_block(TR, 5, nv, masked, last, kc, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 4: pv_block(TR, 4, nv, masked, last, kc, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 3: pv_block(TR, 3, nv, masked, last, kc, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 2: pv_block(TR, 2, nv, masked, last, kc, pi, ldp, v, ldv, ai, oi, ldo); break;
    case 1: pv_block(TR, 1, nv, masked, last, kc, pi, ldp, v, ldv, ai, oi, ldo); break;
    default: break;
    }
}

/*
 * Loop order, as avx512.c: column panel (16 of dv) > key chunk (at most
 * PV_KC keys) > row block. The V sub-panel [chunk][16] (<= 16 KiB) stays in
 * L1 while every row block streams past it; with row blocks outermost (the previous order)
 * each 6-row block re-streamed all of V_j ([Bc][dv], 64-128 KiB) from L2.
 * O is rescaled by alpha on the first chunk and accumulated after.
 */
INLINE void pv_body(const int TR, int br, int bc, int dv, const float *p, size_t ldp, const float *v, size_t ldv,
                    const float *alpha, float *o, size_t ldo)
{
    const __m256i all = _mm256_set1_epi32(-1);
    /* equal chunks of at most PV_KC keys (Bc = 320 runs two of 160, not 256 + 64) */
    const int nchunk = (bc + PV_KC - 1) / PV_KC, chunk = nchunk ? (bc + nchunk - 1) / nchunk : 0;
    for (int c = 0; c < dv; c += 8 * NV) {
        const int left = dv - c < 8 * NV ? dv - c : 8 * NV;
        for (int j0 = 0; j0 < bc; j0 += chunk) {
            const int kc = bc - j0 < chunk ? bc - j0 : chunk;
            const float *pj = p + (TR ? (size_t)j0 * ldp : (size_t)j0), *vj = v + (size_t)j0 * ldv + c;
            const float *aj = j0 == 0 ? alpha : NULL;
            if (left == 16)
                pv_panel(TR, 2, 0, all, br, kc, pj, ldp, vj, ldv, aj, o + c, ldo);
            else if (left == 8)
                pv_panel(TR, 1, 0, all, br, kc, pj, ldp, vj, ldv, aj, o + c, ldo);
            else if (left > 8)
                pv_panel(TR, 2, 1, lanes_below(left - 8), br, kc, pj, ldp, vj, ldv, aj, o + c, ldo);
            else
                pv_panel(TR, 1, 1, lanes_below(left), br, kc, pj, ldp, vj, ldv, aj, o + c, ldo);
        }
    }
    if (bc == 0) /* no key: O = alpha O still */
        for (int i = 0; i < br; i++)
            for (int c = 0; c < dv; c++) o[(size_t)i * ldo + c] *= alpha[i];
}

static void pv_avx2(int br, int bc, int dv, const float *p, size_t ldp, const float *v, size_t ldv,
                    const float *alpha, float *o, size_t ldo)
{
    pv_body(0, br, bc, dv, p, ldp, v, ldv, alpha, o, ldo);
}

/* pv with P read transposed (kernels.h, pv_t): pv_avx2's FMAs in its order over the
 * transposed tile, so its bits; a block's broadcasts per key are consecutive floats. */
static void pv_t_avx2(int br, int bc, int dv, const float *pt, size_t ldpt, const float *v, size_t ldv,
                      const float *alpha, float *o, size_t ldo)
{
    pv_body(1, br, bc, dv, pt, ldpt, v, ldv, alpha, o, ldo);
}

/*
 * Cut tiles (kernels.h, cut_cols). What each loop does with a column j:
 *   qk       S[i][j] is its own FMA chain over c in any panel: any n.
 *   softmax  the max is exact in any grouping. The sum of P puts 8-column
 *            group g into sum0 or sum1 by g's parity, except a partial last
 *            group (bc % 8), always into sum1: n a multiple of 8 (or bc).
 *   pv       keys go in equal chunks of at most PV_KC, and the chunk length
 *            depends on bc: with bc <= PV_KC one chunk (any n keeps it);
 *            above, nchunk = ceil(bc / PV_KC) chunks of `chunk` keys, and a
 *            cut n = k * chunk (k < nchunk) gives ceil(n / PV_KC) = k chunks
 *            of exactly `chunk` keys again (chunk > PV_KC (nchunk-1)/nchunk),
 *            the same boundaries. Within a chunk, dropped trailing keys only
 *            dropped acc += 0 * v; a dropped chunk, O + 0.
 * So n = need rounded up to 8 (the SIMD width), and above PV_KC to a
 * multiple of the chunk that is also a multiple of 8; at most bc.
 */
static int cut_cols_avx2(int bc, int need)
{
    int n = (need + 7) & ~7;
    if (bc > PV_KC) {
        const int nchunk = (bc + PV_KC - 1) / PV_KC, chunk = (bc + nchunk - 1) / nchunk;
        n = (need + chunk - 1) / chunk * chunk;
        while (n < bc && n % 8) n += chunk;
    }
    return n < bc ? n : bc;
}

/* cut_lead (alpha = 1): with bc <= PV_KC both calls are one chunk and the
 * skipped keys only added +-0 to acc = +0; above it the chunk length depends
 * on the call's width, so no leading cut. */
static int cut_lead_avx2(int bc, int a)
{
    return bc <= PV_KC ? a & ~15 : 0;
}

/* The forward's leading cut: softmax's 8-column groups keep their parity
 * (sum0/sum1) when a' is a multiple of 16; with bc <= PV_KC pv is one chunk
 * in both calls, acc over the keys in order from +0 (the skipped zero-P
 * keys left it at +0). Above PV_KC the chunk length depends on the call's
 * width: no leading cut. */
static int cut_lead_fwd_avx2(int bc, int a)
{
    return bc <= PV_KC ? a & ~15 : 0;
}

/* ------------------------------------------------------------------------ */
/* transpose: the driver's K tile -> packed Kt                               */
/* ------------------------------------------------------------------------ */

/*
 * kt[c][j] = k[j*ldk + c] for j < bc, c < d, in 8 x 8 blocks through
 * registers: unpack pairs of rows, shuffle pairs of pairs, then swap 128-bit
 * halves. Keys past bc load as zero rows (their columns are Kt's zero
 * padding: j < round8(bc) <= ldkt); columns past d are masked on load and
 * not stored.
 */
static void transpose_avx2(int bc, int d, const float *k, size_t ldk, float *kt, size_t ldkt)
{
    for (int jb = 0; jb < bc; jb += 8) {
        const int nj = bc - jb < 8 ? bc - jb : 8;
        /* the next 8 rows, whole: in BSHD they are heads x d floats apart, often a page
         * or more, where the hardware prefetchers stop */
        for (int jj = jb + 8; jj < jb + 16 && jj < bc; jj++)
            FA_PREFETCH_ROW(k + (size_t)jj * ldk, (size_t)d * sizeof(float), 0, 3); /* prefetcht0 */
        for (int cb = 0; cb < d; cb += 8) {
            const int nc = d - cb < 8 ? d - cb : 8;
            const __m256i m = lanes_below(nc);
            __m256 r[8];
            for (int jj = 0; jj < 8; jj++)
                r[jj] = jj >= nj ? _mm256_setzero_ps()
                      : nc == 8  ? _mm256_loadu_ps(k + (size_t)(jb + jj) * ldk + cb)
                                 : _mm256_maskload_ps(k + (size_t)(jb + jj) * ldk + cb, m);
            __m256 t[8], u[8], out[8];
            for (int x = 0; x < 8; x += 2) {
                t[x] = _mm256_unpacklo_ps(r[x], r[x + 1]);     /* c0 c0 c1 c1 | c4 c4 c5 c5 */
                t[x + 1] = _mm256_unpackhi_ps(r[x], r[x + 1]); /* c2 c2 c3 c3 | c6 c6 c7 c7 */
            }
            for (int x = 0; x < 8; x += 4) { /* rows x..x+3 of columns (0|4), (1|5), (2|6), (3|7) */
                u[x + 0] = _mm256_shuffle_ps(t[x], t[x + 2], _MM_SHUFFLE(1, 0, 1, 0));
                u[x + 1] = _mm256_shuffle_ps(t[x], t[x + 2], _MM_SHUFFLE(3, 2, 3, 2));
                u[x + 2] = _mm256_shuffle_ps(t[x + 1], t[x + 3], _MM_SHUFFLE(1, 0, 1, 0));
                u[x + 3] = _mm256_shuffle_ps(t[x + 1], t[x + 3], _MM_SHUFFLE(3, 2, 3, 2));
            }
            for (int x = 0; x < 4; x++) {
                out[x] = _mm256_permute2f128_ps(u[x], u[x + 4], 0x20);     /* column x     */
                out[x + 4] = _mm256_permute2f128_ps(u[x], u[x + 4], 0x31); /* column x + 4 */
            }
            for (int cc = 0; cc < nc; cc++) _mm256_storeu_ps(kt + (size_t)(cb + cc) * ldkt + jb, out[cc]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* bwd_line: P = exp(s - L), dS = P (dP - D) [* g] on one backward line      */
/* ------------------------------------------------------------------------ */

/* The 8 lanes of a backward line at x, masked: k the lanes below n, `in` those of them in
 * [va, vb) (the others get P = 0 and dS = 0 * (dP - D)). */
INLINE void bwd_masked(const int PER, const int GRAD, int n, int va, int vb, int x, float *s, float *dp,
                       const float *lse, const float *dd, const float *g)
{
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i lo = _mm256_set1_epi32(va - 1), hi = _mm256_set1_epi32(vb);
    const int left = n - x;
    const __m256i k = left >= 8 ? _mm256_set1_epi32(-1) : lanes_below(left);
    const __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(x), lane);
    const __m256 in = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_and_si256(_mm256_cmpgt_epi32(idx, lo), _mm256_cmpgt_epi32(hi, idx)), k));
    const __m256 L = PER ? _mm256_maskload_ps(lse + x, k) : _mm256_set1_ps(lse[0]);
    const __m256 D = PER ? _mm256_maskload_ps(dd + x, k) : _mm256_set1_ps(dd[0]);
    /* masked lanes: exp of 0 - 0, then zeroed (never exp(-inf - -inf) = NaN) */
    const __m256 sx = _mm256_and_ps(_mm256_maskload_ps(s + x, k), in);
    const __m256 p = _mm256_and_ps(exp_any(_mm256_sub_ps(sx, _mm256_and_ps(L, in))), in);
    __m256 ds = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_maskload_ps(dp + x, k), D));
    if (GRAD) ds = _mm256_blendv_ps(ds, _mm256_mul_ps(ds, _mm256_maskload_ps(g + x, _mm256_castps_si256(in))), in);
    _mm256_maskstore_ps(s + x, k, p);
    _mm256_maskstore_ps(dp + x, k, ds);
}

/* The same for 8 lanes that all lie in [va, vb) and below n: no mask, the same bits. */
INLINE void bwd_whole(const int PER, const int GRAD, int x, float *s, float *dp, const float *lse, const float *dd,
                      const float *g)
{
    const __m256 L = PER ? _mm256_loadu_ps(lse + x) : _mm256_set1_ps(lse[0]);
    const __m256 D = PER ? _mm256_loadu_ps(dd + x) : _mm256_set1_ps(dd[0]);
    const __m256 p = exp_any(_mm256_sub_ps(_mm256_loadu_ps(s + x), L));
    __m256 ds = _mm256_mul_ps(p, _mm256_sub_ps(_mm256_loadu_ps(dp + x), D));
    if (GRAD) ds = _mm256_mul_ps(ds, _mm256_loadu_ps(g + x));
    _mm256_storeu_ps(s + x, p);
    _mm256_storeu_ps(dp + x, ds);
}

/* One loop per (per_elem, g) pair (avx512.c's bwd_loop). */
INLINE void bwd_loop(const int PER, const int GRAD, int n, int va, int vb, float *s, float *dp, const float *lse,
                     const float *dd, const float *g)
{
    const int f0 = (va + 7) & ~7, f1 = (vb < n ? vb : n) & ~7;
    int x = 0;
    for (; x < n && !(x >= f0 && x + 8 <= f1); x += 8) bwd_masked(PER, GRAD, n, va, vb, x, s, dp, lse, dd, g);
    for (; x + 8 <= f1; x += 8) bwd_whole(PER, GRAD, x, s, dp, lse, dd, g);
    for (; x < n; x += 8) bwd_masked(PER, GRAD, n, va, vb, x, s, dp, lse, dd, g);
}

static void bwd_line_avx2(int n, int va, int vb, float *s, float *dp, const float *lse, const float *dd,
                          int per_elem, const float *g)
{
    if (per_elem && g) bwd_loop(1, 1, n, va, vb, s, dp, lse, dd, g);
    else if (per_elem) bwd_loop(1, 0, n, va, vb, s, dp, lse, dd, g);
    else if (g) bwd_loop(0, 1, n, va, vb, s, dp, lse, dd, g);
    else bwd_loop(0, 0, n, va, vb, s, dp, lse, dd, g);
}

/* ------------------------------------------------------------------------ */
/* widen: float16 (F16C vcvtph2ps) and bfloat16 (a 16-bit shift) to float32  */
/* ------------------------------------------------------------------------ */

static void widen_avx2(int n, const uint16_t *src, int bf16, float *dst)
{
    int i = 0;
    if (bf16) {
        for (; i + 16 <= n; i += 16) {
            const __m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
            const __m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
            const __m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
            _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
            _mm256_storeu_ps(dst + i + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
        }
        for (; i < n; i++) dst[i] = fa_bf16_to_f32(src[i]);
    } else {
        for (; i + 16 <= n; i += 16) {
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
            _mm256_storeu_ps(dst + i + 8, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i + 8))));
        }
        for (; i < n; i++) dst[i] = fa_f16_to_f32(src[i]);
    }
}

/* ------------------------------------------------------------------------ */
/* FMA peak loop                                                             */
/* ------------------------------------------------------------------------ */

/* iters x 12 independent FMA chains x 8 lanes x 2 flops (12 + 2 constants
 * fit the 16 ymm registers; 12 chains cover 2 pipes x 4 cycles). */
double fa_fma_loop_avx2(long iters, float *sink)
{
    __m256 acc[12];
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (int k = 0; k < 12; k++) acc[k] = _mm256_set1_ps((float)k);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 12
        for (int k = 0; k < 12; k++) acc[k] = _mm256_fmadd_ps(acc[k], a, b);
    __m256 t = acc[0];
    for (int k = 1; k < 12; k++) t = _mm256_add_ps(t, acc[k]);
    *sink = hsum(t);
    return (double)iters * 12 * 8 * 2;
}

/* qk's 6 x 2 register block on a fixed operand set (fma_peak.h; avx512.c's twin). */
double fa_fma_fed_loop_avx2(long iters, float *sink)
{
    _Alignas(32) float buf[24];
    for (int k = 0; k < 24; k++) buf[k] = k < 16 ? 1.0f - 1e-3f * (float)(k + 1) : 1e-3f * (float)(k - 15);
    __m256 acc[MR][NV];
    const float *src = buf;
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) acc[r][v] = _mm256_set1_ps((float)(r + v));
    for (long it = 0; it < iters; it++) {
        __asm__ volatile("" : "+r"(src) : "m"(buf)); /* an address the compiler cannot know: load again */
        const __m256 k0 = _mm256_load_ps(src), k1 = _mm256_load_ps(src + 8);
#pragma GCC unroll 6
        for (int r = 0; r < MR; r++) {
            const __m256 qb = _mm256_broadcast_ss(src + 16 + r);
            acc[r][0] = _mm256_fmadd_ps(qb, k0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(qb, k1, acc[r][1]);
        }
    }
    __m256 t = _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < MR; r++)
#pragma GCC unroll 2
        for (int v = 0; v < NV; v++) t = _mm256_fmadd_ps(acc[r][v], _mm256_set1_ps((float)((r + 1) * (v + 1))), t);
    *sink = hsum(t);
    return (double)iters * MR * NV * 8 * 2;
}

/* ------------------------------------------------------------------------ */
/* Decoding: scores and P V straight from the cache rows                     */
/* ------------------------------------------------------------------------ */

/*
 * 8 elements of a decode row from element c, widened to float32 in registers
 * (bf16: a 16-bit shift; f16: vcvtph2ps). k < 8: only lanes < k are read
 * (the others are 0): vmaskmovps for float32; half rows have no 16-bit masked
 * load in AVX2, so the k elements go through a zeroed 16-byte buffer.
 */
INLINE __m256 dec_load(const void *row, int c, int k, const int fmt)
{
    if (fmt == FA_ROW_F32) {
        if (k >= 8) return _mm256_loadu_ps((const float *)row + c);
        return _mm256_maskload_ps((const float *)row + c, lanes_below(k));
    }
    const uint16_t *h = (const uint16_t *)row + c;
    __m128i x;
    if (k >= 8) {
        x = _mm_loadu_si128((const __m128i *)h);
    } else {
        uint16_t t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        memcpy(t, h, (size_t)k * sizeof(uint16_t));
        x = _mm_loadu_si128((const __m128i *)t);
    }
    if (fmt == FA_ROW_BF16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(x), 16));
    return _mm256_cvtph_ps(x);
}

/*
 * Lane t of the result = the sum of the 8 lanes of a[t], one fixed tree for
 * every t: h = low half + high half (4 lanes), then (h0 + h2) + (h1 + h3)
 * (every level combines its inputs alike: the bits do not depend on t). The
 * halves are added first with 128-bit instructions: on a core that splits
 * 256-bit operations (Zen 1) the 256-bit shuffles of a whole-vector tree
 * (vperm2f128: 8 micro-ops there) cost a third of dec_qk's time.
 */
INLINE __m128 reduce4x4(const __m128 *h)
{
    const __m128 x01 = _mm_add_ps(_mm_unpacklo_ps(h[0], h[1]), _mm_unpackhi_ps(h[0], h[1])); /* h0:0+2 h1:0+2 h0:1+3 h1:1+3 */
    const __m128 x23 = _mm_add_ps(_mm_unpacklo_ps(h[2], h[3]), _mm_unpackhi_ps(h[2], h[3]));
    return _mm_add_ps(_mm_movelh_ps(x01, x23), _mm_movehl_ps(x23, x01));
}

INLINE __m256 reduce8(const __m256 *a)
{
    __m128 h[8];
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) h[t] = _mm_add_ps(_mm256_castps256_ps128(a[t]), _mm256_extractf128_ps(a[t], 1));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(reduce4x4(h)), reduce4x4(h + 4), 1);
}

/*
 * Scores of ROWS rows x KEYS keys (ROWS * KEYS <= 8 accumulators of 8-lane partial
 * dot products), reduced together: lane r * KEYS + jj is S[r][jj]. Keys
 * jj >= nj repeat the last row (read, never stored).
 */
INLINE void dqk_block(const int ROWS, const int KEYS, const int fmt, int d, const float *q, size_t ldq,
                      const void *const *rows, int nj, float scale, float *s, size_t lds)
{
    __m256 acc[8];
#pragma GCC unroll 8
    for (int t = 0; t < 8; t++) acc[t] = _mm256_setzero_ps();
    const void *kr[8];
#pragma GCC unroll 8
    for (int jj = 0; jj < KEYS; jj++) kr[jj] = rows[jj < nj ? jj : nj - 1];
    /* whole 8-element chunks, then the tail (d % 8) as the last step of every chain: the
     * order of the sums is the same as one loop with the tail test inside, which GCC
     * compiled into a branch and a spill per chunk (Zen 1: qk at 1.6x pv's time for the
     * same FMAs) */
    int c = 0;
    for (; c + 8 <= d; c += 8) {
        __m256 qv[4];
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) {
            qv[r] = _mm256_loadu_ps(q + (size_t)r * ldq + c);
            /* float32 keys: hold the query chunk in a register (an empty asm), or GCC folds it
             * into every key's FMA as a memory operand — 10 loads per 8 FMAs at 4 x 2, more
             * than Zen 1's two 128-bit load ports feed (dec_qk 0.54 -> 0.50 ns an FMA there,
             * f32 decode ~3% faster; same bits). Half keys keep the folded form: there the
             * register copy was slower (0.55 -> 0.60), their widening competes for the slots. */
            if (KEYS > 1 && fmt == FA_ROW_F32) __asm__("" : "+x"(qv[r]));
        }
#pragma GCC unroll 8
        for (int jj = 0; jj < KEYS; jj++) {
            const __m256 kv = dec_load(kr[jj], c, 8, fmt);
#pragma GCC unroll 4
            for (int r = 0; r < ROWS; r++) acc[r * KEYS + jj] = _mm256_fmadd_ps(qv[r], kv, acc[r * KEYS + jj]);
        }
    }
    if (c < d) {
        const int k = d - c;
        __m256 qv[4];
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) qv[r] = _mm256_maskload_ps(q + (size_t)r * ldq + c, lanes_below(k));
#pragma GCC unroll 8
        for (int jj = 0; jj < KEYS; jj++) {
            const __m256 kv = dec_load(kr[jj], c, k, fmt);
#pragma GCC unroll 4
            for (int r = 0; r < ROWS; r++) acc[r * KEYS + jj] = _mm256_fmadd_ps(qv[r], kv, acc[r * KEYS + jj]);
        }
    }
    const __m256 sv = _mm256_mul_ps(_mm256_set1_ps(scale), reduce8(acc));
    if (nj == KEYS && ROWS * KEYS == 8) { /* a whole block: each row's keys straight from the register */
        const __m128 lo = _mm256_castps256_ps128(sv), hi = _mm256_extractf128_ps(sv, 1);
        if (KEYS == 8) {
            _mm256_storeu_ps(s, sv);
        } else if (KEYS == 4) {
            _mm_storeu_ps(s, lo);
            _mm_storeu_ps(s + lds, hi);
        } else if (KEYS == 2) {
            _mm_storel_pi((__m64 *)(void *)s, lo);
            _mm_storeh_pi((__m64 *)(void *)(s + lds), lo);
            _mm_storel_pi((__m64 *)(void *)(s + 2 * lds), hi);
            _mm_storeh_pi((__m64 *)(void *)(s + 3 * lds), hi);
        }
        return;
    }
    float out[8];
    _mm256_storeu_ps(out, sv);
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
        for (int jj = 0; jj < nj; jj++) s[(size_t)r * lds + jj] = out[r * KEYS + jj];
}

INLINE void dec_qk_fmt(const int fmt, int nr, int n, int d, const float *q, size_t ldq, const void *const *rows,
                       float scale, float *s, size_t lds, const fa_between *between)
{
    if (nr == 1) {
        for (int j = 0; j < n; j += 8) {
            fa_between_run(between, j / 8, (n + 7) / 8);
            dqk_block(1, 8, fmt, d, q, ldq, rows + j, n - j < 8 ? n - j : 8, scale, s + j, lds);
        }
        return;
    }
    if (nr == 2) {
        for (int j = 0; j < n; j += 4) {
            fa_between_run(between, j / 4, (n + 3) / 4);
            dqk_block(2, 4, fmt, d, q, ldq, rows + j, n - j < 4 ? n - j : 4, scale, s + j, lds);
        }
        return;
    }
    for (int j = 0; j < n; j += 2) { /* 2 keys (in L1) against every row block of 4 */
        const int nj = n - j < 2 ? n - j : 2;
        fa_between_run(between, j / 2, (n + 1) / 2);
        int i = 0;
        for (; i + 4 <= nr; i += 4)
            dqk_block(4, 2, fmt, d, q + (size_t)i * ldq, ldq, rows + j, nj, scale, s + (size_t)i * lds + j, lds);
        const float *qi = q + (size_t)i * ldq;
        float *si = s + (size_t)i * lds + j;
        switch (nr - i) {
        case 3: dqk_block(3, 2, fmt, d, qi, ldq, rows + j, nj, scale, si, lds); break;
        case 2: dqk_block(2, 2, fmt, d, qi, ldq, rows + j, nj, scale, si, lds); break;
        case 1: dqk_block(1, 2, fmt, d, qi, ldq, rows + j, nj, scale, si, lds); break;
        default: break;
        }
    }
}

static void dec_qk_avx2(int nr, int n, int d, const float *q, size_t ldq, const void *const *rows, int fmt,
                        float scale, float *s, size_t lds, const fa_between *between)
{
    if (nr <= 0 || n <= 0) return;
    if (fmt == FA_ROW_BF16) dec_qk_fmt(FA_ROW_BF16, nr, n, d, q, ldq, rows, scale, s, lds, between);
    else if (fmt == FA_ROW_F16) dec_qk_fmt(FA_ROW_F16, nr, n, d, q, ldq, rows, scale, s, lds, between);
    else dec_qk_fmt(FA_ROW_F32, nr, n, d, q, ldq, rows, scale, s, lds, between);
}

/*
 * 16 bf16 elements of a V row from element c (those past `left` read as 0, not
 * touched in memory; FULL: left >= 16) widened into even (lane t = element c+2t)
 * and odd (c+2t+1) vectors: one 256-bit load holds the pair (2t, 2t+1) in lane t,
 * a shift left by 16 gives the even element, AND 0xffff0000 the odd one — 2 ALU
 * ops per 16 elements instead of vpmovzxwd + vpslld per 8.
 */
INLINE void eo_load_bf16(const void *row, int c, int left, const int FULL, __m256 *e, __m256 *o)
{
    const uint16_t *h = (const uint16_t *)row + c;
    __m256i x;
    if (FULL || left >= 16) {
        x = _mm256_loadu_si256((const __m256i *)h);
    } else {
        uint16_t t[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
        if (left > 0) memcpy(t, h, (size_t)left * sizeof(uint16_t));
        x = _mm256_loadu_si256((const __m256i *)t);
    }
    *e = _mm256_castsi256_ps(_mm256_slli_epi32(x, 16));
    *o = _mm256_castsi256_ps(_mm256_and_si256(x, _mm256_set1_epi32((int)0xffff0000u)));
}

/*
 * O rows [0, ROWS) x columns [c0, c0 + 8*VECS) (columns past dv read as 0 and not
 * stored; FULL: none is past dv): acc = sum_j P[r][j] V_j in key order from +0,
 * then O = alpha*O + acc — per element the same steps whatever the blocking or
 * format. bf16 rows: vectors 2u and 2u+1 hold the even and odd columns of the 16
 * at c0 + 16u (eo_load_bf16), interleaved back before the update.
 */
INLINE void dpv_block(const int ROWS, const int VECS, const int fmt, const int FULL, int n, int c0, int dv,
                      const float *p, size_t ldp, const void *const *rows, const float *alpha, float *o, size_t ldo)
{
    __m256 acc[4][8];
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 8
        for (int u = 0; u < VECS; u++) acc[r][u] = _mm256_setzero_ps();
    for (int j = 0; j < n; j++) {
        const void *row = rows[j];
        __m256 pb[4];
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++) pb[r] = _mm256_broadcast_ss(p + (size_t)r * ldp + j);
        if (fmt == FA_ROW_BF16) {
#pragma GCC unroll 4
            for (int u = 0; u < VECS; u += 2) {
                if (!FULL && dv - c0 - 8 * u <= 0) break;
                __m256 ve, vo;
                eo_load_bf16(row, c0 + 8 * u, dv - c0 - 8 * u, FULL, &ve, &vo);
#pragma GCC unroll 4
                for (int r = 0; r < ROWS; r++) {
                    acc[r][u] = _mm256_fmadd_ps(pb[r], ve, acc[r][u]);
                    acc[r][u + 1] = _mm256_fmadd_ps(pb[r], vo, acc[r][u + 1]);
                }
            }
        } else {
#pragma GCC unroll 8
            for (int u = 0; u < VECS; u++) {
                const int left = dv - c0 - 8 * u;
                if (!FULL && left <= 0) break;
                const __m256 vv = dec_load(row, c0 + 8 * u, FULL ? 8 : left, fmt);
#pragma GCC unroll 4
                for (int r = 0; r < ROWS; r++) acc[r][u] = _mm256_fmadd_ps(pb[r], vv, acc[r][u]);
            }
        }
    }
    if (fmt == FA_ROW_BF16) {
#pragma GCC unroll 4
        for (int r = 0; r < ROWS; r++)
#pragma GCC unroll 4
            for (int u = 0; u < VECS; u += 2) {
                const __m256 lo = _mm256_unpacklo_ps(acc[r][u], acc[r][u + 1]); /* e0 o0 e1 o1 | e4 o4 e5 o5 */
                const __m256 hi = _mm256_unpackhi_ps(acc[r][u], acc[r][u + 1]); /* e2 o2 e3 o3 | e6 o6 e7 o7 */
                acc[r][u] = _mm256_permute2f128_ps(lo, hi, 0x20);
                acc[r][u + 1] = _mm256_permute2f128_ps(lo, hi, 0x31);
            }
    }
#pragma GCC unroll 4
    for (int r = 0; r < ROWS; r++) {
        const __m256 a = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 8
        for (int u = 0; u < VECS; u++) {
            float *dst = o + (size_t)r * ldo + c0 + 8 * u;
            const int left = dv - c0 - 8 * u;
            if (FULL || left >= 8) {
                _mm256_storeu_ps(dst, _mm256_fmadd_ps(a, _mm256_loadu_ps(dst), acc[r][u]));
            } else if (left > 0) {
                const __m256i m = lanes_below(left);
                _mm256_maskstore_ps(dst, m, _mm256_fmadd_ps(a, _mm256_maskload_ps(dst, m), acc[r][u]));
            }
        }
    }
}

/* One column panel of VECS vectors at c0 for rows [0, ROWS): no tail code when it lies inside dv. */
INLINE void dpv_panel(const int ROWS, const int VECS, const int fmt, int n, int c0, int dv, const float *p,
                      size_t ldp, const void *const *rows, const float *alpha, float *o, size_t ldo)
{
    if (c0 + 8 * VECS <= dv) dpv_block(ROWS, VECS, fmt, 1, n, c0, dv, p, ldp, rows, alpha, o, ldo);
    else dpv_block(ROWS, VECS, fmt, 0, n, c0, dv, p, ldp, rows, alpha, o, ldo);
}

INLINE void dec_pv_fmt(const int fmt, int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows,
                       const float *alpha, float *o, size_t ldo)
{
    if (nr == 1) { /* 1 row x 8 vectors (64 columns): 8 chains */
        for (int c0 = 0; c0 < dv; c0 += 64) dpv_panel(1, 8, fmt, n, c0, dv, p, ldp, rows, alpha, o, ldo);
        return;
    }
    for (int i = 0; i < nr; i += 4) /* row blocks of up to 4 x 2 vectors (16 columns) */
        for (int c0 = 0; c0 < dv; c0 += 16) {
            const float *pi = p + (size_t)i * ldp;
            float *oi = o + (size_t)i * ldo;
            switch (nr - i < 4 ? nr - i : 4) {
            case 4: dpv_panel(4, 2, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            case 3: dpv_panel(3, 2, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            case 2: dpv_panel(2, 2, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            default: dpv_panel(1, 2, fmt, n, c0, dv, pi, ldp, rows, alpha + i, oi, ldo); break;
            }
        }
}

static void dec_pv_avx2(int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows, int fmt,
                        const float *alpha, float *o, size_t ldo)
{
    if (nr <= 0) return;
    if (fmt == FA_ROW_BF16) dec_pv_fmt(FA_ROW_BF16, nr, n, dv, p, ldp, rows, alpha, o, ldo);
    else if (fmt == FA_ROW_F16) dec_pv_fmt(FA_ROW_F16, nr, n, dv, p, ldp, rows, alpha, o, ldo);
    else dec_pv_fmt(FA_ROW_F32, nr, n, dv, p, ldp, rows, alpha, o, ldo);
}

const fa_kernels fa_kernels_avx2 = {
    .name = "avx2",
    .simd_width = 8,
    .row_block = MR,
    .qk = qk_avx2,
    .softmax = softmax_avx2,
    .pv = pv_avx2,
    .pv_t = pv_t_avx2,
    .cut_cols = cut_cols_avx2,
    .cut_lead = cut_lead_avx2,
    .cut_lead_fwd = cut_lead_fwd_avx2,
    .vexp = vexp_avx2,
    .transpose = transpose_avx2,
    .transform = transform_avx2,
    .widen = widen_avx2,
    .bwd_line = bwd_line_avx2,
    .dec_qk = dec_qk_avx2,
    .dec_pv = dec_pv_avx2,
};
