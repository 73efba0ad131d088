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
 * Rows with no visible key get O = 0 and LSE = -inf. Nothing is tiled, nothing
 * is clever; the only scratch is one row of scores per thread (O(Sk)). Rows
 * are independent, so OpenMP over (batch, head, row) changes no bits.
 */
#include "internal.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

size_t fa_reference_workspace(const fa_problem *p)
{
    /* per thread that gets a task (the parallel region's clamp): scores [Sk] +
     * output accumulator [dv], both float64 */
    const size_t threads = (size_t)fa_threads_for(p, p->batch * p->heads * p->seqlen_q);
    if ((uint64_t)p->seqlen_k + (uint64_t)p->dv > SIZE_MAX / sizeof(double) / threads)
        return SIZE_MAX; /* a zero-stride view can make seqlen_k ~ 2^62: saturate, do not wrap */
    return threads * ((size_t)p->seqlen_k + (size_t)p->dv) * sizeof(double);
}

/* Compute one query row (b, i, h) into o/lse. s: [Sk] scratch, acc: [dv]. */
static void reference_row(const fa_problem *p, int64_t b, int64_t i, int64_t h, double *s,
                          double *acc)
{
    const int64_t hk = fa_kv_head(p, h);
    const double slope = fa_alibi_slope(p, b, h);
    int64_t lo, hi;
    fa_key_range(p, b, i, &lo, &hi);

    double m = -INFINITY;
    for (int64_t j = lo; j < hi; j++) {
        double dot = 0.0;
        for (int64_t c = 0; c < p->d; c++)
            dot += fa_load_f64(&p->q, fa_off4(&p->q, b, i, h, c)) *
                   fa_load_f64(&p->k, fa_off4(&p->k, b, j, hk, c));
        s[j] = fa_score_transform(p, dot, slope, b, i, j);
        if (isnan(s[j]) || s[j] > m) m = s[j]; /* NaN, once seen, sticks */
    }
    for (int64_t c = 0; c < p->dv; c++) acc[c] = 0.0;
    double l = 0.0;
    if (hi > lo && m != -INFINITY) {
        for (int64_t j = lo; j < hi; j++) {
            double e = exp(s[j] - m);
            l += e;
            for (int64_t c = 0; c < p->dv; c++)
                acc[c] += e * fa_load_f64(&p->v, fa_off4(&p->v, b, j, hk, c));
        }
    }
    const int empty = !(l > 0.0) && !isnan(l);
    for (int64_t c = 0; c < p->dv; c++)
        fa_store_f64(&p->o, fa_off4(&p->o, b, i, h, c), empty ? 0.0 : acc[c] / l);
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
    /* (Sk + 1) doubles must not wrap size_t (seqlen_k of a strided view can be ~2^62) */
    if ((uint64_t)p->seqlen_k >= SIZE_MAX / sizeof(double) - 1 ||
        (uint64_t)p->dv >= SIZE_MAX / sizeof(double))
        return fa_fail(FA_ERR_NOMEM, "reference: seqlen_k %lld needs more row scratch than can be allocated",
                       (long long)p->seqlen_k);
#ifdef _OPENMP
#pragma omp parallel num_threads(fa_threads_for(p, rows))
#endif
    {
        double *s = fa_scratch_alloc(p, ((size_t)p->seqlen_k + 1) * sizeof(double)); /* [Sk] */
        double *acc = fa_scratch_alloc(p, (size_t)p->dv * sizeof(double));           /* [dv] */
        if (!s || !acc) {
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
            reference_row(p, b, i, h, s, acc);
        }
        fa_scratch_free(p, s);
        fa_scratch_free(p, acc);
    }
    if (failed)
        return fa_fail(FA_ERR_NOMEM, "reference: could not allocate %zu bytes of row scratch",
                       fa_reference_workspace(p));
    return FA_OK;
}
