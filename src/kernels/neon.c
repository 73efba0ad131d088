/*
 * neon.c — AArch64 Advanced SIMD micro-kernels (4 float32 lanes, 32 v regs).
 *
 * Advanced SIMD is architectural on AArch64, so this file needs no extra
 * compiler flags; dispatch.c still confirms HWCAP_ASIMD. Correctness first:
 * it is tested under qemu-aarch64 against the scalar spec (mk/neon.mk), and
 * its speed has not been measured on Arm hardware yet.
 *
 * Register blocking:
 *
 *   qk  S = Q Kt:    MR = 4 rows x NV = 4 vectors (16 columns) = 16
 *                    accumulators. Per c: 4 loads of Kt[c][j..j+15], 4
 *                    scalar loads of Q[i][c], 16 FMLA-by-element
 *                    (vfmaq_n_f32). 16 chains cover 4 FMA pipes x 4 cycles
 *                    on the wider Neoverse cores.
 *   pv  O = aO + PV: MR = 4 rows x NV = 4 vectors (16 columns of dv), per
 *                    key j: 4 loads of V[j][c..c+15], 4 scalar loads of
 *                    P[i][j], 16 FMAs; O = alpha*O + acc once per tile.
 *
 * Tails: qk computes 16-wide panels over Kt's zero padding (ldk is a
 * multiple of 16) and stores only j < bc; pv's partial last vector of dv is
 * loaded and stored lane by lane, so V and O are never touched beyond dv.
 * Rows br % 4 run 1..3-row instantiations.
 *
 * exp: simd_exp.h, with 2^n built as float bits exactly as in avx2.c (the
 * same shifter trick, the same mask for x < ln(FLT_MIN), the same split of
 * 2^n in the general vexp).
 */
#include "kernels.h"

#include <arm_neon.h>
#include <math.h>

#include "fma_peak.h"
#include "simd_exp.h"

#define MR 4
#define NV 4

#define INLINE static inline __attribute__((always_inline))

/* ------------------------------------------------------------------------ */
/* exp                                                                       */
/* ------------------------------------------------------------------------ */

#define SHIFTER 12583039.0f /* 1.5 * 2^23 + 127: low bits of x*log2e + SHIFTER = n + 127 */

INLINE float32x4_t exp_poly(float32x4_t x, float32x4_t *t_out)
{
    const float32x4_t t = vfmaq_f32(vdupq_n_f32(SHIFTER), x, vdupq_n_f32(FA_EXP_LOG2E));
    const float32x4_t n = vsubq_f32(t, vdupq_n_f32(SHIFTER));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(FA_EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(FA_EXP_LN2_LO));
    float32x4_t p = vdupq_n_f32(FA_EXP_C6);
    p = vfmaq_f32(vdupq_n_f32(FA_EXP_C5), p, r);
    p = vfmaq_f32(vdupq_n_f32(FA_EXP_C4), p, r);
    p = vfmaq_f32(vdupq_n_f32(FA_EXP_C3), p, r);
    p = vfmaq_f32(vdupq_n_f32(FA_EXP_C2), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    *t_out = t;
    return p;
}

/* all ones where x > FA_EXP_X_MIN or x is NaN (NaN propagates, never hidden) */
INLINE uint32x4_t exp_keep(float32x4_t x)
{
    return vmvnq_u32(vcleq_f32(x, vdupq_n_f32(FA_EXP_X_MIN)));
}

/* exp(x) for x <= 0, -inf or NaN (softmax arguments). */
INLINE float32x4_t exp_nonpos(float32x4_t x)
{
    const uint32x4_t keep = exp_keep(x);
    float32x4_t t;
    const float32x4_t p = exp_poly(x, &t);
    const float32x4_t scale = vreinterpretq_f32_u32(vshlq_n_u32(vreinterpretq_u32_f32(t), 23));
    return vreinterpretq_f32_u32(vandq_u32(vreinterpretq_u32_f32(vmulq_f32(p, scale)), keep));
}

/* exp(x) for any x: 2^n = 2^(n/2) * 2^(n - n/2) covers n = 128. */
INLINE float32x4_t exp_any(float32x4_t x)
{
    x = vbslq_f32(vcgtq_f32(x, vdupq_n_f32(FA_EXP_X_CLAMP)), vdupq_n_f32(FA_EXP_X_CLAMP), x);
    const uint32x4_t keep = exp_keep(x);
    float32x4_t t;
    const float32x4_t p = exp_poly(x, &t);
    const int32x4_t n = vsubq_s32(vreinterpretq_s32_f32(t), vdupq_n_s32(0x4b40007f));
    const int32x4_t n1 = vshrq_n_s32(n, 1);
    const int32x4_t n2 = vsubq_s32(n, n1);
    const int32x4_t bias = vdupq_n_s32(127);
    const float32x4_t s1 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n1, bias), 23));
    const float32x4_t s2 = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n2, bias), 23));
    return vreinterpretq_f32_u32(
        vandq_u32(vreinterpretq_u32_f32(vmulq_f32(vmulq_f32(p, s1), s2)), keep));
}

/* Partial vectors (k < 4 lanes): lanes >= k read as `fill`. */
INLINE float32x4_t load_partial(const float *p, int k, float fill)
{
    float tmp[4] = {fill, fill, fill, fill};
    for (int i = 0; i < k; i++) tmp[i] = p[i];
    return vld1q_f32(tmp);
}

INLINE void store_partial(float *p, int k, float32x4_t v)
{
    float tmp[4];
    vst1q_f32(tmp, v);
    for (int i = 0; i < k; i++) p[i] = tmp[i];
}

static void vexp_neon(int n, const float *x, float *y)
{
    int i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, exp_any(vld1q_f32(x + i)));
    if (i < n) store_partial(y + i, n - i, exp_any(load_partial(x + i, n - i, 0.0f)));
}

/* ------------------------------------------------------------------------ */
/* qk: S = Q Kt                                                              */
/* ------------------------------------------------------------------------ */

/* Rows [0, mr) x columns [0, 16); S stored only for columns < ncols. */
INLINE void qk_block(const int mr, int d, int ncols, const float *q, size_t ldq, const float *kt,
                     size_t ldk, float scale, float *s, size_t lds)
{
    float32x4_t acc[MR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[r][v] = vdupq_n_f32(0.0f);

    for (int c = 0; c < d; c++) {
        const float *krow = kt + (size_t)c * ldk;
        float32x4_t kv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) kv[v] = vld1q_f32(krow + 4 * v);
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            const float qrc = q[(size_t)r * ldq + c];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) acc[r][v] = vfmaq_n_f32(acc[r][v], kv[v], qrc);
        }
    }

#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) {
            float *dst = s + (size_t)r * lds + 4 * v;
            const int left = ncols - 4 * v;
            if (left >= 4)
                vst1q_f32(dst, vmulq_n_f32(acc[r][v], scale));
            else if (left > 0)
                store_partial(dst, left, vmulq_n_f32(acc[r][v], scale));
        }
}

static void qk_neon(int br, int bc, int d, const float *q, size_t ldq, const float *kt, size_t ldk,
                    float scale, float *s, size_t lds)
{
    for (int j = 0; j < bc; j += 4 * NV) {
        const int ncols = bc - j < 4 * NV ? bc - j : 4 * NV;
        int i = 0;
        for (; i + MR <= br; i += MR)
            qk_block(MR, d, ncols, q + (size_t)i * ldq, ldq, kt + j, ldk, scale, s + (size_t)i * lds + j, lds);
        const float *qi = q + (size_t)i * ldq;
        float *si = s + (size_t)i * lds + j;
        switch (br - i) {
        case 3: qk_block(3, d, ncols, qi, ldq, kt + j, ldk, scale, si, lds); break;
        case 2: qk_block(2, d, ncols, qi, ldq, kt + j, ldk, scale, si, lds); break;
        case 1: qk_block(1, d, ncols, qi, ldq, kt + j, ldk, scale, si, lds); break;
        default: break;
        }
    }
}

/* ------------------------------------------------------------------------ */
/* softmax                                                                   */
/* ------------------------------------------------------------------------ */

static void softmax_neon(int br, int bc, float *s, size_t lds, float *m, float *l, float *alpha)
{
    const int nfull = bc & ~3, ntail = bc - nfull;
    for (int i = 0; i < br; i++) {
        float *row = s + (size_t)i * lds;
        /* lanes >= bc read as -inf: nothing added to the max or the sum */
        const float32x4_t xt = load_partial(row + nfull, ntail, -INFINITY);
        /* vmaxnm skips a NaN score, as scalar.c's `x > mx ? x : mx` does */
        float32x4_t mx0 = vmaxnmq_f32(vdupq_n_f32(m[i]), xt), mx1 = vdupq_n_f32(-INFINITY);
        int j = 0;
        for (; j + 8 <= nfull; j += 8) {
            mx0 = vmaxnmq_f32(mx0, vld1q_f32(row + j));
            mx1 = vmaxnmq_f32(mx1, vld1q_f32(row + j + 4));
        }
        if (j < nfull) mx0 = vmaxnmq_f32(mx0, vld1q_f32(row + j));
        const float mnew = vmaxnmvq_f32(vmaxnmq_f32(mx0, mx1));

        if (mnew == -INFINITY) { /* nothing visible yet: P = 0, keep O and l (l = NaN for a NaN score) */
            int nan = 0;
            for (j = 0; j < bc; j++) {
                nan |= row[j] != row[j];
                row[j] = 0.0f;
            }
            if (nan) l[i] = NAN; /* the max skipped it; NaN sticks (kernels.h) */
            alpha[i] = 1.0f;
            continue;
        }

        const float a = vgetq_lane_f32(exp_nonpos(vdupq_n_f32(m[i] - mnew)), 0);
        const float32x4_t vm = vdupq_n_f32(mnew);
        float32x4_t sum0 = vdupq_n_f32(0.0f), sum1 = vdupq_n_f32(0.0f);
        for (j = 0; j + 8 <= nfull; j += 8) {
            const float32x4_t p0 = exp_nonpos(vsubq_f32(vld1q_f32(row + j), vm));
            const float32x4_t p1 = exp_nonpos(vsubq_f32(vld1q_f32(row + j + 4), vm));
            vst1q_f32(row + j, p0);
            vst1q_f32(row + j + 4, p1);
            sum0 = vaddq_f32(sum0, p0);
            sum1 = vaddq_f32(sum1, p1);
        }
        if (j < nfull) {
            const float32x4_t p0 = exp_nonpos(vsubq_f32(vld1q_f32(row + j), vm));
            vst1q_f32(row + j, p0);
            sum0 = vaddq_f32(sum0, p0);
        }
        if (ntail) {
            const float32x4_t p1 = exp_nonpos(vsubq_f32(xt, vm));
            store_partial(row + nfull, ntail, p1);
            sum1 = vaddq_f32(sum1, p1);
        }
        alpha[i] = a;
        l[i] = a * l[i] + vaddvq_f32(vaddq_f32(sum0, sum1));
        m[i] = mnew;
    }
}

/* ------------------------------------------------------------------------ */
/* pv: O = alpha O + P V                                                     */
/* ------------------------------------------------------------------------ */

/*
 * Rows [0, mr) x columns [0, 4*nv) of v/o; the last vector holds `last`
 * lanes (1..4). Partial vectors go lane by lane: nothing beyond dv is touched.
 */
INLINE void pv_block(const int TR, const int mr, const int nv, int last, int bc, const float *p, size_t ldp,
                     const float *v, size_t ldv, const float *alpha, float *o, size_t ldo)
{
    float32x4_t acc[MR][NV];
#pragma GCC unroll 4
    for (int r = 0; r < mr; r++)
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++) acc[r][u] = vdupq_n_f32(0.0f);

    for (int j = 0; j < bc; j++) {
        const float *vrow = v + (size_t)j * ldv;
        float32x4_t vv[NV];
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++)
            vv[u] = (u == nv - 1 && last < 4) ? load_partial(vrow + 4 * u, last, 0.0f)
                                              : vld1q_f32(vrow + 4 * u);
#pragma GCC unroll 4
        for (int r = 0; r < mr; r++) {
            const float prj = TR ? p[(size_t)j * ldp + r] : p[(size_t)r * ldp + j];
#pragma GCC unroll 4
            for (int u = 0; u < nv; u++) acc[r][u] = vfmaq_n_f32(acc[r][u], vv[u], prj);
        }
    }

#pragma GCC unroll 4
    for (int r = 0; r < mr; r++) {
        const float32x4_t a = vdupq_n_f32(alpha[r]);
#pragma GCC unroll 4
        for (int u = 0; u < nv; u++) {
            float *dst = o + (size_t)r * ldo + 4 * u;
            if (u == nv - 1 && last < 4)
                store_partial(dst, last, vfmaq_f32(acc[r][u], a, load_partial(dst, last, 0.0f)));
            else
                vst1q_f32(dst, vfmaq_f32(acc[r][u], a, vld1q_f32(dst)));
        }
    }
}

INLINE void pv_rows(const int TR, const int mr, int bc, int dv, const float *p, size_t ldp, const float *v,
                    size_t ldv, const float *alpha, float *o, size_t ldo)
{
    int c = 0;
    for (; c + 4 * NV <= dv; c += 4 * NV) pv_block(TR, mr, NV, 4, bc, p, ldp, v + c, ldv, alpha, o + c, ldo);
    const int left = dv - c; /* 0..15 columns */
    const int lastw = left % 4 ? left % 4 : 4;
    switch ((left + 3) / 4) {
    case 4: pv_block(TR, mr, 4, lastw, bc, p, ldp, v + c, ldv, alpha, o + c, ldo); break;
    case 3: pv_block(TR, mr, 3, lastw, bc, p, ldp, v + c, ldv, alpha, o + c, ldo); break;
    case 2: pv_block(TR, mr, 2, lastw, bc, p, ldp, v + c, ldv, alpha, o + c, ldo); break;
    case 1: pv_block(TR, mr, 1, lastw, bc, p, ldp, v + c, ldv, alpha, o + c, ldo); break;
    default: break;
    }
}

/* TR: P stored transposed (pv_t), row i at p + i */
INLINE void pv_body(const int TR, int br, int bc, int dv, const float *p, size_t ldp, const float *v, size_t ldv,
                    const float *alpha, float *o, size_t ldo)
{
    const size_t rs = TR ? 1 : ldp;
    int i = 0;
    for (; i + MR <= br; i += MR)
        pv_rows(TR, MR, bc, dv, p + (size_t)i * rs, ldp, v, ldv, alpha + i, o + (size_t)i * ldo, ldo);
    const float *pi = p + (size_t)i * rs;
    float *oi = o + (size_t)i * ldo;
    switch (br - i) {
    case 3: pv_rows(TR, 3, bc, dv, pi, ldp, v, ldv, alpha + i, oi, ldo); break;
    case 2: pv_rows(TR, 2, bc, dv, pi, ldp, v, ldv, alpha + i, oi, ldo); break;
    case 1: pv_rows(TR, 1, bc, dv, pi, ldp, v, ldv, alpha + i, oi, ldo); break;
    default: break;
    }
}

static void pv_neon(int br, int bc, int dv, const float *p, size_t ldp, const float *v, size_t ldv,
                    const float *alpha, float *o, size_t ldo)
{
    pv_body(0, br, bc, dv, p, ldp, v, ldv, alpha, o, ldo);
}

/* pv_neon's FMAs in its order on P stored transposed (kernels.h, pv_t) */
static void pv_t_neon(int br, int bc, int dv, const float *pt, size_t ldpt, const float *v, size_t ldv,
                      const float *alpha, float *o, size_t ldo)
{
    pv_body(1, br, bc, dv, pt, ldpt, v, ldv, alpha, o, ldo);
}

/*
 * Cut tiles (kernels.h, cut_cols). qk: each S[i][j] is its own FMA chain,
 * any n. softmax: the max is exact in any grouping; the sum of P puts
 * 4-column group g into sum0 or sum1 by g's parity, except a partial last
 * group (bc % 4), always into sum1: n a multiple of 4 (or bc). pv: one
 * chunk, keys in order into acc, then O = alpha O + acc: dropped trailing
 * keys only dropped acc += 0 * v. So n = need rounded up to 4 (the SIMD
 * width), at most bc.
 */
static int cut_cols_neon(int bc, int need)
{
    const int n = (need + 3) & ~3;
    return n < bc ? n : bc;
}

/* cut_lead (alpha = 1): one chunk; the skipped keys only added +-0 to acc = +0. */
static int cut_lead_neon(int bc, int a) { return a & ~15; }

/* The forward's leading cut: softmax's 4-column groups keep their parity
 * (sum0/sum1) when a' is a multiple of 8; pv is one chunk, acc over the
 * keys in order from +0, which the skipped zero-P keys left at +0. */
static int cut_lead_fwd_neon(int bc, int a) { return a & ~15; }

/* ------------------------------------------------------------------------ */
/* transpose: the driver's K tile -> packed Kt                               */
/* ------------------------------------------------------------------------ */

/*
 * kt[c][j] = k[j*ldk + c] for j < bc, c < d, in 4 x 4 blocks (vtrn on 32-
 * then on 64-bit lanes). Keys past bc are zero rows (Kt's padding, within
 * round4(bc) <= ldkt); columns past d are neither read nor stored.
 */
static void transpose_neon(int bc, int d, const float *k, size_t ldk, float *kt, size_t ldkt)
{
    for (int jb = 0; jb < bc; jb += 4) {
        const int nj = bc - jb < 4 ? bc - jb : 4;
        for (int cb = 0; cb < d; cb += 4) {
            const int nc = d - cb < 4 ? d - cb : 4;
            float32x4_t r[4];
            for (int jj = 0; jj < 4; jj++) {
                const float *src = k + (size_t)(jb + jj) * ldk + cb;
                r[jj] = jj >= nj ? vdupq_n_f32(0.0f) : nc == 4 ? vld1q_f32(src) : load_partial(src, nc, 0.0f);
            }
            const float32x4x2_t a = vtrnq_f32(r[0], r[1]); /* (r0c0 r1c0 r0c2 r1c2), (r0c1 r1c1 r0c3 r1c3) */
            const float32x4x2_t b = vtrnq_f32(r[2], r[3]);
            float32x4_t out[4];
            out[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(a.val[0]), vreinterpretq_f64_f32(b.val[0])));
            out[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(a.val[1]), vreinterpretq_f64_f32(b.val[1])));
            out[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(a.val[0]), vreinterpretq_f64_f32(b.val[0])));
            out[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(a.val[1]), vreinterpretq_f64_f32(b.val[1])));
            for (int cc = 0; cc < nc; cc++) vst1q_f32(kt + (size_t)(cb + cc) * ldkt + jb, out[cc]);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* FMA peak loop                                                             */
/* ------------------------------------------------------------------------ */

double fa_fma_loop_neon(long iters, float *sink)
{
    float32x4_t acc[16];
    const float32x4_t a = vdupq_n_f32(0.999999f), b = vdupq_n_f32(1e-7f);
    for (int k = 0; k < 16; k++) acc[k] = vdupq_n_f32((float)k);
    for (long it = 0; it < iters; it++)
#pragma GCC unroll 16
        for (int k = 0; k < 16; k++) acc[k] = vfmaq_f32(b, acc[k], a);
    float32x4_t t = acc[0];
    for (int k = 1; k < 16; k++) t = vaddq_f32(t, acc[k]);
    *sink = vaddvq_f32(t);
    return (double)iters * 16 * 4 * 2;
}

/* ------------------------------------------------------------------------ */
/* Element lines: the transform (softcap, ALiBi, mask), bwd_line, widen      */
/* ------------------------------------------------------------------------ */

/* c tanh(u / c) (the softcap; c = 1: tanh(u)): avx2.c's cap_tanh_avx2 step for step
 * (simd_exp.h's tanh with c folded into the small branch: |u| + (|u| z) P(z) for
 * x = |u| / c below FA_TANH_SMALL, else c (1 - 2 / (e^{2x} + 1)) with x clamped to
 * FA_TANH_X_ONE), the sign put back from u. exp_nonpos builds 2^n from the float's
 * bits, which holds for n + 127 in [1, 254]; the argument 2x <= 20 gives n <= 29. */
INLINE float32x4_t cap_tanh_neon(float32x4_t u, float32x4_t vcap, float32x4_t vinv)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t au = vabsq_f32(u);
    const float32x4_t ax = vmulq_f32(au, vinv);
    const float32x4_t z = vmulq_f32(ax, ax);
    float32x4_t p = vdupq_n_f32(FA_TANH_T4);
    p = vfmaq_f32(vdupq_n_f32(FA_TANH_T3), p, z);
    p = vfmaq_f32(vdupq_n_f32(FA_TANH_T2), p, z);
    p = vfmaq_f32(vdupq_n_f32(FA_TANH_T1), p, z);
    p = vfmaq_f32(vdupq_n_f32(FA_TANH_T0), p, z);
    const float32x4_t small = vfmaq_f32(au, vmulq_f32(au, z), p);
    const uint32x4_t is_small = vcltq_f32(ax, vdupq_n_f32(FA_TANH_SMALL)); /* NaN: not small */
    float32x4_t t = small;
    if (vminvq_u32(is_small) == 0) { /* softcapped scores are mostly small: skip exp when all are */
        const float32x4_t c = vminq_f32(vdupq_n_f32(FA_TANH_X_ONE), ax); /* FMIN: NaN stays NaN */
        const float32x4_t e = exp_nonpos(vaddq_f32(c, c));
        const float32x4_t large = vsubq_f32(one, vdivq_f32(vdupq_n_f32(2.0f), vaddq_f32(e, one)));
        t = vbslq_f32(is_small, small, vmulq_f32(vcap, large));
    }
    /* t >= 0 or NaN here: or in u's sign bit */
    return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(t),
                                           vandq_u32(vreinterpretq_u32_f32(u), vdupq_n_u32(0x80000000u))));
}

/* (float)(slope * |rel|) for rel = base + step * lane, lanes 0..3, in double as
 * scalar.c does (exact for |rel| < 2^53). */
INLINE float32x4_t alibi_bias(double base, double step, float64x2_t slope)
{
    const float64x2_t lane = {0.0, 1.0};
    const float64x2_t r0 = vabsq_f64(vfmaq_f64(vdupq_n_f64(base), lane, vdupq_n_f64(step)));
    const float64x2_t r1 = vabsq_f64(vfmaq_f64(vdupq_n_f64(base + 2.0 * step), lane, vdupq_n_f64(step)));
    return vcombine_f32(vcvt_f32_f64(vmulq_f64(slope, r0)), vcvt_f32_f64(vmulq_f64(slope, r1)));
}

/* Lanes [x, x + k) of a line (k <= 4; 4: a whole vector, no copy) through the softcap,
 * its derivative and ALiBi: the flags are constants, so each combination compiles to
 * its own loop (avx512.c's transform_vec). */
INLINE void transform_vec(const int CAP, const int GRAD, const int ALIBI, float *s, int x, int k, float32x4_t vcap,
                          float32x4_t vinv, float64x2_t vslope, int64_t rel0, int rel_step, float *g)
{
    float32x4_t u = k == 4 ? vld1q_f32(s + x) : load_partial(s + x, k, 0.0f);
    if (CAP) {
        u = cap_tanh_neon(u, vcap, vinv);
        if (GRAD) {
            const float32x4_t th = vmulq_f32(u, vinv);
            const float32x4_t dg = vsubq_f32(vdupq_n_f32(1.0f), vmulq_f32(th, th)); /* d/dt c tanh(t/c) */
            if (k == 4) vst1q_f32(g + x, dg);
            else store_partial(g + x, k, dg);
        }
    }
    if (ALIBI) u = vsubq_f32(u, alibi_bias((double)(rel0 + (int64_t)rel_step * x), (double)rel_step, vslope));
    if (k == 4) vst1q_f32(s + x, u);
    else store_partial(s + x, k, u);
}

INLINE void transform_loop(const int CAP, const int GRAD, const int ALIBI, int va, int vb, float *s, float cap,
                           float inv_cap, double slope, int64_t rel0, int rel_step, float *g)
{
    const float32x4_t vcap = vdupq_n_f32(cap), vinv = vdupq_n_f32(inv_cap);
    const float64x2_t vslope = vdupq_n_f64(slope);
    int x = va;
    for (; x + 4 <= vb; x += 4) transform_vec(CAP, GRAD, ALIBI, s, x, 4, vcap, vinv, vslope, rel0, rel_step, g);
    if (x < vb) transform_vec(CAP, GRAD, ALIBI, s, x, vb - x, vcap, vinv, vslope, rel0, rel_step, g);
}

static void transform_neon(int n, int va, int vb, float *s, float cap, float inv_cap, double slope, int64_t rel0,
                           int rel_step, float *g)
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

/* Lanes [x, x + k) (k <= 4), all inside [va, vb): P = exp(s - L), dS = P (dP - D) (g). */
INLINE void bwd_vec(const int PER, const int GRAD, int x, int k, float *s, float *dp, const float *lse,
                    const float *dd, const float *g)
{
    const int w = k == 4;
    const float32x4_t L = PER ? (w ? vld1q_f32(lse + x) : load_partial(lse + x, k, 0.0f)) : vdupq_n_f32(lse[0]);
    const float32x4_t D = PER ? (w ? vld1q_f32(dd + x) : load_partial(dd + x, k, 0.0f)) : vdupq_n_f32(dd[0]);
    const float32x4_t p = exp_any(vsubq_f32(w ? vld1q_f32(s + x) : load_partial(s + x, k, 0.0f), L));
    float32x4_t ds = vmulq_f32(p, vsubq_f32(w ? vld1q_f32(dp + x) : load_partial(dp + x, k, 0.0f), D));
    if (GRAD) ds = vmulq_f32(ds, w ? vld1q_f32(g + x) : load_partial(g + x, k, 0.0f));
    if (w) {
        vst1q_f32(s + x, p);
        vst1q_f32(dp + x, ds);
    } else {
        store_partial(s + x, k, p);
        store_partial(dp + x, k, ds);
    }
}

/* Elements outside [va, vb): P = +0 and dS = 0 (dP - D), as the spec writes them. */
INLINE void bwd_outside(const int PER, int x0, int x1, float *s, float *dp, const float *dd)
{
    for (int x = x0; x < x1; x++) {
        s[x] = 0.0f;
        dp[x] = 0.0f * (dp[x] - (PER ? dd[x] : dd[0]));
    }
}

/* One loop per (per_elem, g) pair (avx512.c's bwd_loop): the visible elements in whole
 * vectors from va and one partial vector, the rest outside. */
INLINE void bwd_loop(const int PER, const int GRAD, int n, int va, int vb, float *s, float *dp, const float *lse,
                     const float *dd, const float *g)
{
    const int a = va < 0 ? 0 : va > n ? n : va, b = vb > n ? n : vb < a ? a : vb;
    bwd_outside(PER, 0, a, s, dp, dd);
    int x = a;
    for (; x + 4 <= b; x += 4) bwd_vec(PER, GRAD, x, 4, s, dp, lse, dd, g);
    if (x < b) bwd_vec(PER, GRAD, x, b - x, s, dp, lse, dd, g);
    bwd_outside(PER, b, n, s, dp, dd);
}

static void bwd_line_neon(int n, int va, int vb, float *s, float *dp, const float *lse, const float *dd,
                          int per_elem, const float *g)
{
    if (per_elem && g) bwd_loop(1, 1, n, va, vb, s, dp, lse, dd, g);
    else if (per_elem) bwd_loop(1, 0, n, va, vb, s, dp, lse, dd, g);
    else if (g) bwd_loop(0, 1, n, va, vb, s, dp, lse, dd, g);
    else bwd_loop(0, 0, n, va, vb, s, dp, lse, dd, g);
}

/* float16 (FCVTL) and bfloat16 (SHLL by 16) to float32, exact. */
static void widen_neon(int n, const uint16_t *src, int bf16, float *dst)
{
    int i = 0;
    if (bf16)
        for (; i + 8 <= n; i += 8) {
            const uint16x8_t h = vld1q_u16(src + i);
            vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
            vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
        }
    else
        for (; i + 8 <= n; i += 8) {
            const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
            vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
            vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
        }
    if (i < n) fa_widen_scalar(n - i, src + i, bf16, dst + i);
}

/* ------------------------------------------------------------------------ */
/* Decoding: scores and P V straight from the cache rows                     */
/* ------------------------------------------------------------------------ */

/* 4 elements of a decode row from element c, widened in registers (bf16: SHLL
 * by 16; f16: FCVTL); k < 4: only lanes < k are read (the others are 0). */
INLINE float32x4_t dec_load(const void *row, int c, int k, const int fmt)
{
    if (fmt == FA_ROW_F32) return k >= 4 ? vld1q_f32((const float *)row + c) : load_partial((const float *)row + c, k, 0.0f);
    const uint16_t *h = (const uint16_t *)row + c;
    uint16x4_t x;
    if (k >= 4) {
        x = vld1_u16(h);
    } else {
        uint16_t t[4] = {0, 0, 0, 0};
        for (int i = 0; i < k; i++) t[i] = h[i];
        x = vld1_u16(t);
    }
    if (fmt == FA_ROW_BF16) return vreinterpretq_f32_u32(vshll_n_u16(x, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(x));
}

/*
 * Scores of ROWS x KEYS (<= 16 accumulators, each a 4-lane partial dot
 * product over d); each accumulator is summed by one tree, (x0 + x1) +
 * (x2 + x3) (FADDP twice, alike for every input), and S[r][jj] stored for
 * jj < nj. Keys jj >= nj repeat the last row (read, never stored).
 */
INLINE void dqk_block(const int ROWS, const int KEYS, const int fmt, int d, const float *q, size_t ldq,
                      const void *const *rows, int nj, float scale, float *s, size_t lds)
{
    float32x4_t acc[16];
    for (int t = 0; t < 16; t++) acc[t] = vdupq_n_f32(0.0f);
    const void *kr[16];
    for (int jj = 0; jj < KEYS; jj++) kr[jj] = rows[jj < nj ? jj : nj - 1];
    for (int c = 0; c < d; c += 4) {
        const int k = d - c;
        float32x4_t qv[4];
        for (int r = 0; r < ROWS; r++)
            qv[r] = k >= 4 ? vld1q_f32(q + (size_t)r * ldq + c) : load_partial(q + (size_t)r * ldq + c, k, 0.0f);
        for (int jj = 0; jj < KEYS; jj++) {
            const float32x4_t kv = dec_load(kr[jj], c, k, fmt);
            for (int r = 0; r < ROWS; r++) acc[r * KEYS + jj] = vfmaq_f32(acc[r * KEYS + jj], qv[r], kv);
        }
    }
    const float32x4_t vs = vdupq_n_f32(scale);
    for (int t = 0; t < ROWS * KEYS; t += 4) { /* 4 accumulators -> one vector of their 4 sums */
        const float32x4_t ab = vpaddq_f32(acc[t], acc[t + 1]), cd = vpaddq_f32(acc[t + 2], acc[t + 3]);
        float out[4];
        vst1q_f32(out, vmulq_f32(vs, vpaddq_f32(ab, cd)));
        for (int x = 0; x < 4; x++) {
            const int r = (t + x) / KEYS, jj = (t + x) % KEYS;
            if (jj < nj) s[(size_t)r * lds + jj] = out[x];
        }
    }
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
    for (int j = 0; j < n; j += 4) {
        const int nj = n - j < 4 ? n - j : 4;
        fa_between_run(between, j / 4, (n + 3) / 4);
        int i = 0;
        for (; i + 4 <= nr; i += 4)
            dqk_block(4, 4, fmt, d, q + (size_t)i * ldq, ldq, rows + j, nj, scale, s + (size_t)i * lds + j, lds);
        const float *qi = q + (size_t)i * ldq;
        float *si = s + (size_t)i * lds + j;
        switch (nr - i) {
        case 3: dqk_block(3, 4, fmt, d, qi, ldq, rows + j, nj, scale, si, lds); break;
        case 2: dqk_block(2, 4, fmt, d, qi, ldq, rows + j, nj, scale, si, lds); break;
        case 1: dqk_block(1, 4, fmt, d, qi, ldq, rows + j, nj, scale, si, lds); break;
        default: break;
        }
    }
}

static void dec_qk_neon(int nr, int n, int d, const float *q, size_t ldq, const void *const *rows, int fmt,
                        float scale, float *s, size_t lds, const fa_between *between)
{
    if (nr <= 0 || n <= 0) return;
    if (fmt == FA_ROW_BF16) dec_qk_fmt(FA_ROW_BF16, nr, n, d, q, ldq, rows, scale, s, lds, between);
    else if (fmt == FA_ROW_F16) dec_qk_fmt(FA_ROW_F16, nr, n, d, q, ldq, rows, scale, s, lds, between);
    else dec_qk_fmt(FA_ROW_F32, nr, n, d, q, ldq, rows, scale, s, lds, between);
}

/* O rows [0, ROWS) x columns [c0, c0 + 4*VECS) (vector u holds kl[u] lanes, none past dv):
 * acc = sum_j P[r][j] V_j in key order from 0, then O = alpha*O + acc. */
INLINE void dpv_block(const int ROWS, const int VECS, const int fmt, int n, int c0, const int *kl, const float *p,
                      size_t ldp, const void *const *rows, const float *alpha, float *o, size_t ldo)
{
    float32x4_t acc[4][8];
    for (int r = 0; r < ROWS; r++)
        for (int u = 0; u < VECS; u++) acc[r][u] = vdupq_n_f32(0.0f);
    for (int j = 0; j < n; j++) {
        const void *row = rows[j];
        for (int u = 0; u < VECS; u++) {
            if (kl[u] <= 0) continue;
            const float32x4_t vv = dec_load(row, c0 + 4 * u, kl[u], fmt);
            for (int r = 0; r < ROWS; r++) acc[r][u] = vfmaq_n_f32(acc[r][u], vv, p[(size_t)r * ldp + j]);
        }
    }
    for (int r = 0; r < ROWS; r++) {
        const float32x4_t a = vdupq_n_f32(alpha[r]);
        for (int u = 0; u < VECS; u++) {
            float *dst = o + (size_t)r * ldo + c0 + 4 * u;
            if (kl[u] >= 4) vst1q_f32(dst, vfmaq_f32(acc[r][u], a, vld1q_f32(dst)));
            else if (kl[u] > 0) store_partial(dst, kl[u], vfmaq_f32(acc[r][u], a, load_partial(dst, kl[u], 0.0f)));
        }
    }
}

INLINE void dec_pv_fmt(const int fmt, int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows,
                       const float *alpha, float *o, size_t ldo)
{
    int kl[8];
    if (nr == 1) { /* 1 row x 8 vectors (32 columns) */
        for (int c0 = 0; c0 < dv; c0 += 32) {
            for (int u = 0; u < 8; u++) kl[u] = dv - c0 - 4 * u;
            dpv_block(1, 8, fmt, n, c0, kl, p, ldp, rows, alpha, o, ldo);
        }
        return;
    }
    for (int i = 0; i < nr; i += 4) /* row blocks of up to 4 x 4 vectors (16 columns) */
        for (int c0 = 0; c0 < dv; c0 += 16) {
            for (int u = 0; u < 4; u++) kl[u] = dv - c0 - 4 * u;
            const float *pi = p + (size_t)i * ldp;
            float *oi = o + (size_t)i * ldo;
            switch (nr - i < 4 ? nr - i : 4) {
            case 4: dpv_block(4, 4, fmt, n, c0, kl, pi, ldp, rows, alpha + i, oi, ldo); break;
            case 3: dpv_block(3, 4, fmt, n, c0, kl, pi, ldp, rows, alpha + i, oi, ldo); break;
            case 2: dpv_block(2, 4, fmt, n, c0, kl, pi, ldp, rows, alpha + i, oi, ldo); break;
            default: dpv_block(1, 4, fmt, n, c0, kl, pi, ldp, rows, alpha + i, oi, ldo); break;
            }
        }
}

static void dec_pv_neon(int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows, int fmt,
                        const float *alpha, float *o, size_t ldo)
{
    if (nr <= 0) return;
    if (fmt == FA_ROW_BF16) dec_pv_fmt(FA_ROW_BF16, nr, n, dv, p, ldp, rows, alpha, o, ldo);
    else if (fmt == FA_ROW_F16) dec_pv_fmt(FA_ROW_F16, nr, n, dv, p, ldp, rows, alpha, o, ldo);
    else dec_pv_fmt(FA_ROW_F32, nr, n, dv, p, ldp, rows, alpha, o, ldo);
}

const fa_kernels fa_kernels_neon = {
    .name = "neon",
    .simd_width = 4,
    .row_block = MR,
    .qk = qk_neon,
    .softmax = softmax_neon,
    .pv = pv_neon,
    .pv_t = pv_t_neon,
    .cut_cols = cut_cols_neon,
    .cut_lead = cut_lead_neon,
    .cut_lead_fwd = cut_lead_fwd_neon,
    .vexp = vexp_neon,
    .transpose = transpose_neon,
    .transform = transform_neon,
    .widen = widen_neon,
    .bwd_line = bwd_line_neon,
    .dec_qk = dec_qk_neon,
    .dec_pv = dec_pv_neon,
};
