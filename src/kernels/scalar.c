/*
 * scalar.c — the micro-kernels written as the specification.
 *
 * Plain C, no intrinsics, no cleverness: every ISA kernel (avx2.c, avx512.c,
 * neon.c) must match these within the bound its tests state. The loops are
 * ordered so a compiler can still vectorize them (j innermost in qk, c
 * innermost in pv), which keeps the scalar table usable, not only correct.
 */
#include "kernels.h"

#include <math.h>

#include "tensor.h"

static void qk_scalar(int br, int bc, int d, const float *q, size_t ldq,
                      const float *kt, size_t ldk, float scale, float *s, size_t lds)
{
    for (int i = 0; i < br; i++) {
        float *srow = s + (size_t)i * lds;
        for (int j = 0; j < bc; j++) srow[j] = 0.0f;
        for (int c = 0; c < d; c++) {
            const float qic = q[(size_t)i * ldq + c];
            const float *krow = kt + (size_t)c * ldk;
            for (int j = 0; j < bc; j++) srow[j] += qic * krow[j];
        }
        for (int j = 0; j < bc; j++) srow[j] *= scale; /* scale the dot product, not q */
    }
}

static void vexp_scalar(int n, const float *x, float *y)
{
    for (int i = 0; i < n; i++) y[i] = expf(x[i]);
}

static void softmax_scalar(int br, int bc, float *s, size_t lds, float *m, float *l, float *alpha)
{
    for (int i = 0; i < br; i++) {
        float *row = s + (size_t)i * lds;
        float mx = m[i];
        for (int j = 0; j < bc; j++) mx = row[j] > mx ? row[j] : mx;
        if (mx == -INFINITY) { /* nothing visible yet: P = 0, keep O and l (l = NaN for a NaN score) */
            int nan = 0;
            for (int j = 0; j < bc; j++) {
                nan |= row[j] != row[j];
                row[j] = 0.0f;
            }
            if (nan) l[i] = NAN; /* the max skipped it; NaN sticks (kernels.h) */
            alpha[i] = 1.0f;
            continue;
        }
        alpha[i] = expf(m[i] - mx); /* exp(-inf) = 0 when m was -inf */
        float sum = 0.0f;
        for (int j = 0; j < bc; j++) {
            row[j] = expf(row[j] - mx);
            sum += row[j];
        }
        l[i] = alpha[i] * l[i] + sum;
        m[i] = mx;
    }
}

/* P[i][j] = p[i * rs + j * js]: pv (rs = ldp, js = 1) and pv_t (rs = 1, js = ldp) */
static void pv_strided(int br, int bc, int dv, const float *p, size_t rs, size_t js, const float *v, size_t ldv,
                       const float *alpha, float *o, size_t ldo)
{
    for (int i = 0; i < br; i++) {
        float *orow = o + (size_t)i * ldo;
        const float a = alpha[i];
        for (int c = 0; c < dv; c++) orow[c] *= a;
        for (int j = 0; j < bc; j++) {
            const float pij = p[(size_t)i * rs + (size_t)j * js];
            const float *vrow = v + (size_t)j * ldv;
            for (int c = 0; c < dv; c++) orow[c] += pij * vrow[c];
        }
    }
}

static void pv_scalar(int br, int bc, int dv, const float *p, size_t ldp,
                      const float *v, size_t ldv, const float *alpha, float *o, size_t ldo)
{
    pv_strided(br, bc, dv, p, ldp, 1, v, ldv, alpha, o, ldo);
}

/* pv on P stored transposed (kernels.h, pv_t): pv_scalar's steps, P[i][j] = pt[j * ldpt + i] */
static void pv_t_scalar(int br, int bc, int dv, const float *pt, size_t ldpt,
                        const float *v, size_t ldv, const float *alpha, float *o, size_t ldo)
{
    pv_strided(br, bc, dv, pt, 1, ldpt, v, ldv, alpha, o, ldo);
}

void fa_transform_line_scalar(int n, int va, int vb, float *s, float cap, float inv_cap, double slope,
                              int64_t rel0, int rel_step, float *g)
{
    for (int x = 0; x < va; x++) s[x] = -INFINITY;
    for (int x = vb; x < n; x++) s[x] = -INFINITY;
    if (!(cap > 0.0f) && slope == 0.0) return;
    for (int x = va; x < vb; x++) {
        float u = s[x];
        if (cap > 0.0f) {
            u = cap * tanhf(u * inv_cap);
            if (g) {
                const float th = u * inv_cap;
                g[x] = 1.0f - th * th; /* d/dt c tanh(t/c) */
            }
        }
        if (slope != 0.0) {
            const int64_t rel = rel0 + (int64_t)rel_step * x;
            u -= (float)(slope * (double)(rel < 0 ? -rel : rel));
        }
        s[x] = u;
    }
}

void fa_widen_scalar(int n, const uint16_t *src, int bf16, float *dst)
{
    if (bf16)
        for (int i = 0; i < n; i++) dst[i] = fa_bf16_to_f32(src[i]);
    else
        for (int i = 0; i < n; i++) dst[i] = fa_f16_to_f32(src[i]);
}

void fa_bwd_line_scalar(int n, int va, int vb, float *s, float *dp, const float *lse, const float *dd,
                        int per_elem, const float *g)
{
    for (int x = 0; x < n; x++) {
        const float L = per_elem ? lse[x] : lse[0], D = per_elem ? dd[x] : dd[0];
        const int in = x >= va && x < vb;
        const float p = in ? expf(s[x] - L) : 0.0f;
        s[x] = p;
        dp[x] = p * (dp[x] - D);
        if (g && in) dp[x] *= g[x];
    }
}

/* Element c of a decode row in format fmt, as float32 (exact). */
static inline float row_elem(const void *row, int fmt, int c)
{
    if (fmt == FA_ROW_F32) return ((const float *)row)[c];
    const uint16_t h = ((const uint16_t *)row)[c];
    return fmt == FA_ROW_BF16 ? fa_bf16_to_f32(h) : fa_f16_to_f32(h);
}

/* Each score: its own dot product over c in order, then times the scale. */
void fa_dec_qk_scalar(int nr, int n, int d, const float *q, size_t ldq, const void *const *rows, int fmt,
                      float scale, float *s, size_t lds, const fa_between *between)
{
    for (int j = 0; j < n; j++) {
        if (j % 4 == 0) fa_between_run(between, j / 4, (n + 3) / 4);
        for (int i = 0; i < nr; i++) {
            const float *qi = q + (size_t)i * ldq;
            float acc = 0.0f;
            if (fmt == FA_ROW_F32) {
                const float *k = rows[j];
                for (int c = 0; c < d; c++) acc += qi[c] * k[c];
            } else {
                for (int c = 0; c < d; c++) acc += qi[c] * row_elem(rows[j], fmt, c);
            }
            s[(size_t)i * lds + j] = scale * acc;
        }
    }
}

/* pv_scalar's order: O *= alpha, then O += P[i][j] V_j for j = 0, 1, ... */
void fa_dec_pv_scalar(int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows, int fmt,
                      const float *alpha, float *o, size_t ldo)
{
    for (int i = 0; i < nr; i++)
        for (int c = 0; c < dv; c++) o[(size_t)i * ldo + c] *= alpha[i];
    for (int j = 0; j < n; j++)
        for (int i = 0; i < nr; i++) {
            const float pij = p[(size_t)i * ldp + j];
            float *orow = o + (size_t)i * ldo;
            if (fmt == FA_ROW_F32) {
                const float *v = rows[j];
                for (int c = 0; c < dv; c++) orow[c] += pij * v[c];
            } else {
                for (int c = 0; c < dv; c++) orow[c] += pij * row_elem(rows[j], fmt, c);
            }
        }
}

/* Cut tiles (kernels.h, cut_cols): every loop above walks the columns of a
 * row in order into one accumulator (the max, the sum of P, each O element),
 * so any n >= need keeps the bits: the dropped columns are the last ones. */
static int cut_cols_scalar(int bc, int need) { return need < bc ? need : bc; }
static int cut_lead_scalar(int bc, int a) { return a & ~15; }
/* The forward's leading cut: the same in-order loops into one accumulator
 * each, so skipped leading columns only added -inf to the max, +0 to l and
 * 0 * v to O: any a' (a multiple of 16 keeps S rows aligned). */
static int cut_lead_fwd_scalar(int bc, int a) { return a & ~15; }

const fa_kernels fa_kernels_scalar = {
    .name = "scalar",
    .simd_width = 1,
    .row_block = 1,
    .qk = qk_scalar,
    .softmax = softmax_scalar,
    .pv = pv_scalar,
    .pv_t = pv_t_scalar,
    .cut_cols = cut_cols_scalar,
    .cut_lead = cut_lead_scalar,
    .cut_lead_fwd = cut_lead_fwd_scalar,
    .vexp = vexp_scalar,
    .transform = fa_transform_line_scalar,
    .widen = fa_widen_scalar,
    .bwd_line = fa_bwd_line_scalar,
    .dec_qk = fa_dec_qk_scalar,
    .dec_pv = fa_dec_pv_scalar,
};
