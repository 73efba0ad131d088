/*
 * mask.h — the mask band, ALiBi and the score transform: the semantics of
 * docs/semantics.md, written once for every implementation.
 */
#ifndef FA_MASK_H
#define FA_MASK_H

#include <math.h>
#include <stdint.h>

#include "problem.h"
#include "tensor.h"

/* ALiBi slope of (batch b, query head h); 0 when ALiBi is off. */
static inline double fa_alibi_slope(const fa_problem *p, int64_t b, int64_t h)
{
    if (!p->alibi.data) return 0.0;
    if (p->alibi.rank == 1) return fa_load_f64(&p->alibi, h * p->alibi.stride[0]);
    return fa_load_f64(&p->alibi, b * p->alibi.stride[0] + h * p->alibi.stride[1]);
}

/* Attention sink of query head h: an extra logit in the final-score domain
 * (after scale, softcap, ALiBi) that joins the softmax denominator only;
 * -inf when there are no sinks (e^-inf = 0: the same formulas hold). */
static inline double fa_sink(const fa_problem *p, int64_t h)
{
    if (!p->sinks.data) return -INFINITY;
    return fa_load_f64(&p->sinks, h * p->sinks.stride[0]);
}

/*
 * Fold the sink into a finished row: m is the row's max over its visible
 * keys, l = sum_j e^{s_j - m}, and the unnormalized output is
 * sum_j e^{s_j - m} v_j. With the sink the denominator is l e^{m - m'} +
 * e^{sink - m'}, m' = max(m, sink), so O = unnormalized * (*out_scale) and
 * LSE = *lse. An empty row (no visible key: m = -inf, l = 0) gets scale 0 and
 * LSE = sink (-inf without sinks): O = 0, as FlashAttention-4. A NaN row stays
 * NaN. Computed in float64, whatever the caller accumulated in.
 */
static inline void fa_sink_finish(double sink, double m, double l, int empty, double *out_scale, double *lse)
{
    if (empty) {
        *out_scale = 0.0;
        *lse = sink;
        return;
    }
    if (isnan(m) || isnan(l) || sink == -INFINITY) {
        *out_scale = 1.0 / l;
        *lse = m + log(l);
        return;
    }
    const double m2 = m > sink ? m : sink;
    const double a = exp(m - m2);
    const double l2 = l * a + exp(sink - m2);
    *out_scale = a / l2;
    *lse = m2 + log(l2);
}

/* Dropout: the keep-mask bytes of query row i of (sequence b, head h); key j
 * is at [j * p->keep_stride[3]]. Only when p->keep is set. */
static inline const uint8_t *fa_keep_row(const fa_problem *p, int64_t b, int64_t h, int64_t i)
{
    return p->keep + b * p->keep_stride[0] + h * p->keep_stride[1] + i * p->keep_stride[2];
}

/* KV head read by query head h (GQA/MQA). */
static inline int64_t fa_kv_head(const fa_problem *p, int64_t h)
{
    return h / (p->heads / p->heads_k);
}

/* Offset of the LSE of query row i, head h of sequence b: element
 * (q_batch, h, q_start + i) of LSE [B][H][Sq] (varlen: [1][H][total_q]). */
static inline int64_t fa_lse_off_in(const fa_problem *p, const fa_seq *s, int64_t h, int64_t i)
{
    return s->q_batch * p->lse.stride[0] + h * p->lse.stride[1] + (s->q_start + i) * p->lse.stride[2];
}

static inline int64_t fa_lse_off(const fa_problem *p, int64_t b, int64_t h, int64_t i)
{
    const fa_seq s = fa_problem_seq(p, b);
    return fa_lse_off_in(p, &s, h, i);
}

/* The diagonal's offset in batch entry b: query row i lines up with key
 * i + fa_diag_offset(p, b) (bottom-right alignment: k_len - q_len; top-left,
 * fa_options::align: 0). */
static inline int64_t fa_diag_offset_in(const fa_problem *p, const fa_seq *sq)
{
    return p->top_left ? 0 : sq->k_len - sq->q_len;
}

static inline int64_t fa_diag_offset(const fa_problem *p, int64_t b)
{
    if (p->top_left) return 0;
    const fa_seq sq = fa_problem_seq(p, b);
    return fa_diag_offset_in(p, &sq);
}

/*
 * Visible keys of query row i of batch entry b are the half-open range
 * [*lo, *hi), possibly empty (*lo >= *hi), in the entry's own key numbering
 * (fa_problem_seq: Sq and Sk below are the entry's q_len and k_len). The band
 * is aligned to the bottom-right corner (top-left with fa_options::align:
 * drop Sk - Sq below):
 *   j >= i + Sk - Sq - window_left   (if window_left >= 0)
 *   j <= i + Sk - Sq + window_right  (if window_right >= 0)
 * A row is "empty" (O = 0, LSE = -inf) exactly when this range is empty;
 * implementations decide emptiness from here, never from a running max
 * (a NaN score must give NaN, not an empty row).
 */
static inline void fa_key_range_in(const fa_problem *p, const fa_seq *sq, int64_t i, int64_t *lo, int64_t *hi)
{
    int64_t diag = i + fa_diag_offset_in(p, sq); /* top-left: i */
    int64_t l = 0, h = sq->k_len;
    /* Written as comparisons of differences that cannot overflow, so that any
     * window up to INT64_MAX means what it says: diag - 0 and (Sk - 1) - diag
     * (Sq - 1 - i, or Sk - 1 - i top-left) are in range, and each bound is
     * computed only when it binds. */
    if (p->window_left >= 0 && diag > p->window_left) l = diag - p->window_left;
    if (p->window_right >= 0 && p->window_right < h - 1 - diag) h = diag + p->window_right + 1;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* The same for batch entry b (its sequence looked up here). */
static inline void fa_key_range(const fa_problem *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi)
{
    const fa_seq sq = fa_problem_seq(p, b);
    fa_key_range_in(p, &sq, i, lo, hi);
}

/* The score transform after the dot product: scale, softcap, ALiBi (double),
 * for query row i and key j of batch entry b. */
static inline double fa_score_transform(const fa_problem *p, double dot, double slope, int64_t b,
                                        int64_t i, int64_t j)
{
    double s = p->scale * dot;
    if (p->softcap > 0.0) s = p->softcap * tanh(s / p->softcap);
    if (slope != 0.0) {
        int64_t rel = i + fa_diag_offset(p, b) - j;
        s -= slope * (double)(rel < 0 ? -rel : rel);
    }
    return s;
}

/*
 * Finish a float32 score tile S (batch entry b, rows i0.., keys j0..; qk has scaled it):
 * softcap, ALiBi, then -inf outside each row's visible keys [lo_rows[r],
 * hi_rows[r]) (transform.c; used by flash and standard).
 */
void fa_transform_tile(const fa_problem *p, int64_t b, int64_t i0, int br, int64_t j0, int bc, double slope,
                       const int64_t *lo_rows, const int64_t *hi_rows, float *s, size_t lds);

#endif /* FA_MASK_H */
