/*
 * reference.c — the specification written as code: the trusted result.
 *
 * One query row at a time, in float64, straight from docs/semantics.md:
 *
 *   s_j   = scale * (q_i . k_j)                      for visible keys j
 *   s_j   = softcap * tanh(s_j / softcap)            if softcap > 0
 *   s_j  -= slope * |i + Sk - Sq - j|                if ALiBi
 *   m     = max_j s_j;   l = sum_j exp(s_j - m)
 *   O_i   = sum_j exp(s_j - m) v_j / l;   LSE_i = m + ln l
 *
 * With attention sinks (fa_options::sinks) the denominator gains e^{sink_h}:
 *   O_i = sum_j exp(s_j - m) v_j / (l + exp(sink_h - m)),  LSE_i = ln(sum_j e^{s_j} + e^{sink_h})
 * (fa_sink_finish, mask.h).
 *
 * With dropout (fa_options::dropout) key j's weight in O is multiplied by
 * Z_ij / (1 - p); l and the LSE keep the undropped scores.
 *
 * Rows with no visible key get O = 0 and LSE = -inf (LSE = sink_h with sinks). Nothing is tiled, nothing
 * is clever; the only scratch is one row of scores per thread (O(Sk)). Rows
 * are independent, so OpenMP over (batch, head, row) changes no bits.
 */
#include "internal.h"

#include <stdlib.h>

#include "pack.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Row scratch of one thread, in doubles: scores [Sk + 1], acc [dv], q [d],
 * one key or value row [max(d, dv)] (saturating: a zero-stride view can make
 * seqlen_k ~ 2^62). */
static size_t row_scratch_doubles(const fa_problem *p)
{
    const size_t dmax = (size_t)(p->d > p->dv ? p->d : p->dv);
    return fa_add_sat(fa_add_sat((size_t)p->seqlen_k, 1),
                      fa_add_sat((size_t)p->dv, fa_add_sat((size_t)p->d, dmax)));
}

size_t fa_reference_workspace(const fa_problem *p)
{
    /* per thread that gets a task (the parallel region's clamp): scores [Sk] +
     * output accumulator [dv] + one query row [d] + one key or value row
     * [max(d, dv)], all float64 */
    const size_t threads = (size_t)fa_threads_for(p, p->batch * p->heads * p->seqlen_q);
    return fa_mul_sat(threads, fa_mul_sat(row_scratch_doubles(p), sizeof(double)));
}

/* Compute query row i of (sequence b, head h) into o/lse. s: [Sk] scratch,
 * acc: [dv], qd: [d], xd: [max(d, dv)]. Every row is read through the one
 * accessor (pack.h), as float64. */
static void reference_row(const fa_problem *p, int64_t b, int64_t i, int64_t h, double *s,
                          double *acc, double *qd, double *xd)
{
    const int64_t hk = fa_kv_head(p, h);
    const double slope = fa_alibi_slope(p, b, h);
    const fa_seq seq = fa_problem_seq(p, b);
    const fa_rows qs = fa_rows_q(&p->q, &seq, h), os = fa_rows_q(&p->o, &seq, h);
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    int64_t lo, hi;
    fa_key_range(p, b, i, &lo, &hi);
    fa_rows_gather_f64(&qs, i, qd);

    double m = -INFINITY;
    for (int64_t j = lo; j < hi; j++) {
        double dot = 0.0;
        fa_rows_gather_f64(&ks, j, xd);
        for (int64_t c = 0; c < p->d; c++) dot += qd[c] * xd[c];
        s[j] = fa_score_transform(p, dot, slope, b, i, j);
        if (isnan(s[j]) || s[j] > m) m = s[j]; /* NaN, once seen, sticks */
    }
    for (int64_t c = 0; c < p->dv; c++) acc[c] = 0.0;
    double l = 0.0;
    const uint8_t *keep = p->keep ? fa_keep_row(p, b, h, i) : NULL; /* dropout: Z_ij / (1 - p) on P only */
    if (hi > lo && m != -INFINITY) {
        for (int64_t j = lo; j < hi; j++) {
            double e = exp(s[j] - m);
            l += e;
            /* dropped: l only; its 0 still multiplies V, as (P o Z) V does on the GPU and in
             * flash/standard (an Inf in a dropped key's V row gives NaN, not a skip) */
            if (keep) e *= keep[j * p->keep_stride[3]] ? p->keep_scale : 0.0;
            fa_rows_gather_f64(&vs, j, xd);
            for (int64_t c = 0; c < p->dv; c++) acc[c] += e * xd[c];
        }
    }
    const int empty = !(l > 0.0) && !isnan(l);
    if (p->sinks.data) { /* the sink joins the denominator only (mask.h) */
        double scale, lse;
        fa_sink_finish(fa_sink(p, h), m, l, empty, &scale, &lse);
        for (int64_t c = 0; c < p->dv; c++) fa_rows_put(&os, i, c, empty ? 0.0 : acc[c] * scale);
        if (p->lse.data) fa_store_f64(&p->lse, fa_lse_off(p, b, h, i), lse);
        return;
    }
    for (int64_t c = 0; c < p->dv; c++) fa_rows_put(&os, i, c, empty ? 0.0 : acc[c] / l);
    if (p->lse.data) {
        double lse = empty ? -INFINITY : m + log(l);
        fa_store_f64(&p->lse,
                     fa_lse_off(p, b, h, i), lse);
    }
}

fa_status fa_reference_forward(const fa_problem *p)
{
    const int64_t rows = p->batch * p->heads * p->seqlen_q;
    int failed = 0;
    /* the row scratch must not wrap size_t (seqlen_k of a strided view can be ~2^62) */
    const size_t nd = row_scratch_doubles(p);
    if (nd >= SIZE_MAX / sizeof(double))
        return fa_fail(FA_ERR_NOMEM, "reference: seqlen_k %lld needs more row scratch than can be allocated",
                       (long long)p->seqlen_k);
#ifdef _OPENMP
#pragma omp parallel num_threads(fa_threads_for(p, rows))
#endif
    {
        double *s = fa_scratch_alloc(p, nd * sizeof(double)); /* [Sk + 1] */
        double *acc = s ? s + p->seqlen_k + 1 : NULL;          /* [dv] */
        double *qd = s ? acc + p->dv : NULL;                   /* [d] */
        double *xd = s ? qd + p->d : NULL;                     /* [max(d, dv)] */
        if (!s) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp barrier
#pragma omp for schedule(dynamic, 16)
#endif
        for (int64_t r = 0; r < rows; r++) {
            if (failed) continue;
            int64_t i = r % p->seqlen_q;
            int64_t h = (r / p->seqlen_q) % p->heads;
            int64_t b = r / (p->seqlen_q * p->heads);
            if (i >= fa_problem_seq(p, b).q_len) continue; /* a sequence shorter than the longest */
            reference_row(p, b, i, h, s, acc, qd, xd);
        }
        fa_scratch_free(p, s);
    }
    if (failed)
        return fa_fail(FA_ERR_NOMEM, "reference: could not allocate %zu bytes of row scratch",
                       fa_reference_workspace(p));
    return FA_OK;
}
