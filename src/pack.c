/*
 * pack.c — packing rows and transposed panels (see pack.h).
 */
#include "pack.h"

#include "mask.h"

#include <math.h>
#include <string.h>

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

/*
 * Bit 31 of the result is set when one of x[0..n) is Inf or NaN: for a
 * float's magnitude bits a, a + 2^23 carries into bit 31 exactly when
 * a >= 0x7f800000 (every exponent bit set). Integer and/add/or only, in
 * blocks of 16 the compiler turns into vector code at -O2; the float sum
 * `bad += 0 * x` this replaces was one serial chain of adds (4 cycles an
 * element), a third of the shared packing's time at d = 64.
 */
static uint32_t nonfinite_bits(const float *x, int64_t n)
{
    uint32_t acc = 0;
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        uint32_t u[16];
        memcpy(u, x + c, sizeof u);
        for (int k = 0; k < 16; k++) acc |= (u[k] & 0x7fffffffu) + 0x00800000u;
    }
    for (; c < n; c++) {
        uint32_t u;
        memcpy(&u, x + c, sizeof u);
        acc |= (u & 0x7fffffffu) + 0x00800000u;
    }
    return acc;
}

int fa_pack_rows(const fa_rows *s, int64_t row0, int n, float *dst, size_t ld, int check_bad)
{
    uint32_t bad = 0;
    for (int r = 0; r < n; r++) {
        float *row = dst + (size_t)r * ld;
        /* rows of a BSHD tensor are heads x width elements apart, often a page or
         * more, where hardware prefetchers stop: ask for the row 8 ahead (~6% of a
         * causal N = 1024 call, local, 1 thread) */
        if (r + 8 < n) fa_rows_prefetch(s, row0 + r + 8, 1);
        fa_rows_gather(s, row0 + r, row);
        if (check_bad) bad |= nonfinite_bits(row, s->width);
    }
    return check_bad && (bad & 0x80000000u) != 0;
}

void fa_pack_transposed(const fa_kernels *kern, const fa_rows *s, int64_t row0, int n, float *dst,
                        size_t ld)
{
    const int64_t width = s->width;
    const float *first = n > 0 ? fa_rows_f32(s, row0) : NULL;
    const int64_t ld_src = fa_rows_ld(s);
    if (first && kern && kern->transpose && ld_src >= 0) {
        kern->transpose(n, (int)width, first, (size_t)ld_src, dst, ld);
    } else if (first) {
        /*
         * Transpose 16 rows at a time: each c then fills one whole 64-byte line
         * of dst. Writing one column at a time instead strides by ld floats and
         * thrashes a handful of L1 sets; this order is ~10x faster.
         */
        for (int jb = 0; jb < n; jb += 16) {
            const int nj = n - jb < 16 ? n - jb : 16;
            const float *row[16];
            for (int jj = 0; jj < nj; jj++) row[jj] = fa_rows_f32(s, row0 + jb + jj);
            for (int64_t c = 0; c < width; c++) {
                float *d = dst + (size_t)c * ld + (size_t)jb;
                for (int jj = 0; jj < nj; jj++) d[jj] = row[jj][c];
            }
        }
    } else if (n > 0) {
        /*
         * Any other source (float16/bfloat16, strided, paged, new keys): 16
         * rows x 64 columns at a time are gathered into a float32 block (the
         * kernel table's SIMD widen for contiguous halves, fa_gather_f32),
         * then transposed like a float32 tile, so dst is still written in
         * whole lines and the dtype is decided once per row, not per element.
         */
        enum { JB = 16, CB = 64 };
        float blk[JB * CB] __attribute__((aligned(64)));
        for (int jb = 0; jb < n; jb += JB) {
            const int nj = n - jb < JB ? n - jb : JB;
            const fa_tensor *t[JB];
            int64_t off[JB];
            for (int jj = 0; jj < nj; jj++) t[jj] = fa_rows_src(s, row0 + jb + jj, &off[jj]);
            for (int64_t c0 = 0; c0 < width; c0 += CB) {
                const int nc = width - c0 < CB ? (int)(width - c0) : CB;
                for (int jj = 0; jj < nj; jj++)
                    fa_gather_f32(t[jj], off[jj] + c0 * t[jj]->stride[3], t[jj]->stride[3], nc, blk + jj * CB);
                float *d = dst + (size_t)c0 * ld + (size_t)jb;
                if (kern && kern->transpose) {
                    /* may write zeros into columns nj..round16(nj)-1: dst's padding */
                    kern->transpose(nj, nc, blk, CB, d, ld);
                } else {
                    for (int c = 0; c < nc; c++)
                        for (int jj = 0; jj < nj; jj++) d[(size_t)c * ld + (size_t)jj] = blk[jj * CB + c];
                }
            }
        }
    }
    const int pad = (int)round16((size_t)n);
    for (int64_t c = 0; c < width; c++)
        for (int r = n; r < pad; r++) dst[(size_t)c * ld + (size_t)r] = 0.0f;
}

/* Whether row j of s holds a non-finite element (stops at the first). */
static int row_has_nonfinite(const fa_rows *s, int64_t j, int64_t width)
{
    for (int64_t c = 0; c < width; c++)
        if (!isfinite(fa_rows_get(s, j, c))) return 1;
    return 0;
}

int fa_row_minus_inf_is_real(const fa_problem *p, const fa_seq *seq, int64_t h, int64_t i)
{
    const fa_rows qs = fa_rows_q(&p->q, seq, h);
    if (row_has_nonfinite(&qs, i, p->d)) return 1; /* every score involves the infinity */
    const fa_rows ks = fa_rows_kv(p, seq, fa_kv_head(p, h), 0);
    int64_t lo, hi;
    fa_key_range_in(p, seq, i, &lo, &hi);
    for (int64_t j = lo; j < hi; j++) /* a finite key: its -inf score is float32 overflow */
        if (!row_has_nonfinite(&ks, j, p->d)) return 0;
    return 1;
}

void fa_finish_row(const fa_problem *p, const fa_rows *os, const fa_seq *seq, int64_t h, int64_t i, int empty,
                   float m, float l, const float *orow)
{
    const int64_t dv = p->dv;
    if (!empty && m == -INFINITY) {
        /* every visible score -inf: -inf logits from infinite inputs are reported like an
         * empty row, as the reference does (docs/semantics.md, section 8); a finite key whose
         * float32 score overflowed, or a NaN score the max skipped (l NaN, kernels.h), makes
         * the row NaN */
        if (l == 0.0f && fa_row_minus_inf_is_real(p, seq, h, i)) {
            empty = 1;
        } else {
            l = NAN;
            m = NAN;
        }
    }
    float inv = empty ? 0.0f : 1.0f / l;
    /* the log only where the LSE is asked for (a sink's finish computes its own): ~1% of a
     * causal N = 1024, d = 64 forward on one thread went to it with no LSE output */
    double lse = empty || !p->lse.data ? -INFINITY : (double)m + log((double)l);
    if (p->sinks.data) {
        double sscale;
        fa_sink_finish(fa_sink(p, h), (double)m, (double)l, empty, &sscale, &lse);
        inv = (float)sscale;
    }
    if (p->o.dtype == FA_F32 && p->o.stride[3] == 1) {
        float *dst = (float *)p->o.data + fa_rows_off(os, i);
        if (empty) {
            memset(dst, 0, (size_t)dv * sizeof(float));
        } else {
#pragma omp simd
            for (int64_t c = 0; c < dv; c++) dst[c] = orow[c] * inv;
        }
    } else {
        for (int64_t c = 0; c < dv; c++) fa_rows_put(os, i, c, empty ? 0.0 : (double)(orow[c] * inv));
    }
    if (p->lse.data) fa_store_f64(&p->lse, fa_lse_off_in(p, seq, h, i), lse);
}
