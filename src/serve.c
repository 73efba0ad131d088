/*
 * serve.c — the serving extras' shared computations (serve.h).
 *
 * Attention sinks (FlashAttention-4's learnable sink, gpt-oss): one logit
 * sink_h per query head, in the final-score domain, that joins every row's
 * softmax denominator and has no value row:
 *
 *     LSE_i = ln(sum_j e^{s_ij} + e^{sink_h}),   O_i = sum_j e^{s_ij - LSE_i} v_j
 *
 * The backward pass of Q, K, V keeps its form (dS = P o (dP - D) with P from
 * that LSE, and D = dO . O is still sum_j P_ij dP_ij because O sums over the
 * keys only). The sink's own gradient is the same formula for the one extra
 * logit, whose dP is 0: dsink_h = -sum_{b,i} e^{sink_h - LSE_{b,h,i}} D_{b,h,i}.
 * It needs O(B x H x Sq x d_v) work and no scratch, so one routine serves the
 * reference and flash backward passes alike.
 */
#include "serve.h"

#include "internal.h"
#include "pack.h"

#ifdef _OPENMP
#include <omp.h>
#endif

fa_status fa_sinks_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dsinks)
{
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(fa_threads_for(p, p->heads))
#endif
    for (int64_t h = 0; h < p->heads; h++) {
        const double sink = fa_sink(p, h);
        double acc = 0.0;
        for (int64_t b = 0; b < p->batch; b++) {
            const fa_seq seq = fa_problem_seq(p, b);
            const fa_rows dos = fa_rows_q(dout, &seq, h), os = fa_rows_q(&p->o, &seq, h);
            for (int64_t i = 0; i < seq.q_len; i++) {
                const double lse = fa_load_f64(&p->lse, fa_lse_off(p, b, h, i));
                double dd = 0.0;
                for (int64_t c = 0; c < p->dv; c++) dd += fa_rows_get(&dos, i, c) * fa_rows_get(&os, i, c);
                acc -= exp(sink - lse) * dd;
            }
        }
        fa_store_f64(dsinks, h * dsinks->stride[0], acc);
    }
    return FA_OK;
}

/*
 * Dropout with an explicit keep-mask Z (fa_dropout): O = (P o Z / (1 - p)) V,
 * the LSE of the undropped scores. The mask is an input, read here byte by
 * byte for the tile's keys; nothing Sq x Sk is allocated.
 */
void fa_dropout_tile(const fa_problem *p, int64_t b, int64_t h, int64_t i0, int br, int64_t j0, int bc, float *s,
                     size_t lds)
{
    const float scale = (float)p->keep_scale;
    const int64_t ks = p->keep_stride[3];
    for (int r = 0; r < br; r++) {
        const uint8_t *z = fa_keep_row(p, b, h, i0 + r) + j0 * ks;
        float *row = s + (size_t)r * lds;
        for (int j = 0; j < bc; j++) row[j] = z[j * ks] ? row[j] * scale : 0.0f;
    }
}

/*
 * Rotary embedding (fa_rotary, FlashAttention's flash_attn_with_kvcache): the
 * first rotary_dim elements of a row, as pairs (x1, x2) = (2i, 2i+1)
 * (interleaved, GPT-J) or (i, i + rotary_dim/2) (GPT-NeoX), become
 * (x1 cos - x2 sin, x1 sin + x2 cos) with cos[pos][i], sin[pos][i]. New key t
 * of sequence b sits at position cache_seqlens[b] + t; query row i at
 * cache_seqlens[b] + i when the mask is causal or windowed, else at
 * cache_seqlens[b].
 */
static void rotate_rows(const fa_problem *p, const fa_tensor *src, const fa_tensor *dst, int query)
{
    const int64_t B = src->shape[0], S = src->shape[1], Hn = src->shape[2], d = src->shape[3];
    const int64_t half = p->rot_dim / 2;
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < S; i++) {
            const int64_t pos = (int64_t)p->cache_seqlens[b] + (query && !p->rot_q_per_row ? 0 : i);
            for (int64_t h = 0; h < Hn; h++) {
                for (int64_t c = p->rot_dim; c < d; c++) /* past rotary_dim: the same bits */
                    fa_store_f64(dst, fa_off4(dst, b, i, h, c), fa_load_f64(src, fa_off4(src, b, i, h, c)));
                for (int64_t x = 0; x < half; x++) {
                    const int64_t c1 = p->rot_interleaved ? 2 * x : x, c2 = p->rot_interleaved ? 2 * x + 1 : x + half;
                    const double cs = fa_load_f64(&p->rot_cos, pos * p->rot_cos.stride[0] + x * p->rot_cos.stride[1]);
                    const double sn = fa_load_f64(&p->rot_sin, pos * p->rot_sin.stride[0] + x * p->rot_sin.stride[1]);
                    const double x1 = fa_load_f64(src, fa_off4(src, b, i, h, c1));
                    const double x2 = fa_load_f64(src, fa_off4(src, b, i, h, c2));
                    fa_store_f64(dst, fa_off4(dst, b, i, h, c1), x1 * cs - x2 * sn);
                    fa_store_f64(dst, fa_off4(dst, b, i, h, c2), x1 * sn + x2 * cs);
                }
            }
        }
}

fa_status fa_rotary_apply(fa_problem *p, void **mem)
{
    *mem = NULL;
    if (!p->rot_dim) return FA_OK;
    const fa_tensor *q = &p->q, *kn = &p->k_new;
    const size_t nq = (size_t)(q->shape[0] * q->shape[1] * q->shape[2] * q->shape[3]);
    const size_t nk = (size_t)(kn->shape[0] * kn->shape[1] * kn->shape[2] * kn->shape[3]);
    const size_t bq = fa_mul_sat(nq, fa_dtype_size(q->dtype)), bk = fa_mul_sat(nk, fa_dtype_size(kn->dtype));
    const size_t off = (bq + 63) & ~(size_t)63;
    char *buf = fa_malloc(fa_add_sat(off, bk) ? fa_add_sat(off, bk) : 1);
    if (!buf) return fa_fail(FA_ERR_NOMEM, "rotary: could not allocate %zu bytes for the rotated q and k_new",
                             fa_add_sat(off, bk));
    fa_tensor rq, rk;
    fa_tensor_make(&rq, buf, q->dtype, 4, q->shape, NULL);
    fa_tensor_make(&rk, buf + off, kn->dtype, 4, kn->shape, NULL);
    rotate_rows(p, q, &rq, 1);
    rotate_rows(p, kn, &rk, 0);
    p->q = rq;
    p->k_new = rk;
    *mem = buf;
    return FA_OK;
}
