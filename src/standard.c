/*
 * standard.c — textbook attention: materialize S, then P, then O = P V.
 *
 * Per (batch, head), in float32:
 *   S = scale * Q K^T          [Sq][Sk]   <- the N x N matrix FlashAttention avoids
 *   S = softcap/ALiBi/mask(S)
 *   P = softmax_rows(S)        (stored over S, in place)
 *   O = P V,  LSE = m + ln(l)
 *
 * This is what the IO-complexity argument is about: S and P make a round trip
 * through slow memory, Θ(N²) traffic per head. It exists as a baseline and as
 * a teaching contrast, not for production. Because S grows as Sq x Sk, it
 * refuses (FA_ERR_TOO_LARGE) when S would exceed standard_max_bytes instead of
 * driving the machine into swap.
 *
 * Heads run one after another; the rows of one head are split among threads,
 * so memory is one S per call whatever the thread count.
 */
#include "internal.h"

#include <stdlib.h>

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

size_t fa_standard_workspace(const fa_problem *p)
{
    size_t ldk = round16((size_t)p->seqlen_k);
    size_t s = (size_t)p->seqlen_q * ldk;                  /* S/P [Sq][ldk] */
    size_t packed = (size_t)p->seqlen_q * (size_t)p->d     /* Q   [Sq][d]   */
                    + (size_t)p->d * ldk                   /* K^T [d][ldk]  */
                    + (size_t)p->seqlen_k * (size_t)p->dv; /* V   [Sk][dv]  */
    return (s + packed) * sizeof(float);
}

fa_status fa_standard_forward(const fa_problem *p)
{
    const int64_t Sq = p->seqlen_q, Sk = p->seqlen_k, d = p->d, dv = p->dv;
    const size_t ldk = round16((size_t)Sk);
    /* overflow-safe size of S in bytes */
    if (Sq > 0 && ldk > SIZE_MAX / sizeof(float) / (size_t)Sq)
        return fa_fail(FA_ERR_TOO_LARGE, "standard: S would need more than SIZE_MAX bytes");
    const size_t s_bytes = (size_t)Sq * ldk * sizeof(float);
    if (s_bytes > p->standard_max_bytes)
        return fa_fail(FA_ERR_TOO_LARGE,
                       "standard: S and P need %zu MiB per head (seqlen_q %lld x seqlen_k %lld), "
                       "above the cap of %zu MiB; use the flash path or raise the cap",
                       s_bytes >> 20, (long long)Sq, (long long)Sk, p->standard_max_bytes >> 20);

    float *S = fa_malloc(s_bytes ? s_bytes : sizeof(float));               /* [Sq][ldk] */
    float *Q = fa_malloc((size_t)Sq * (size_t)d * sizeof(float));          /* [Sq][d], scaled */
    float *Kt = fa_malloc((size_t)d * ldk * sizeof(float) + sizeof(float)); /* [d][ldk] */
    float *V = fa_malloc(((size_t)Sk * (size_t)dv + 1) * sizeof(float));   /* [Sk][dv] */
    if (!S || !Q || !Kt || !V) {
        fa_free(S); fa_free(Q); fa_free(Kt); fa_free(V);
        return fa_fail(FA_ERR_NOMEM, "standard: could not allocate %zu bytes", fa_standard_workspace(p));
    }
    const float scale = (float)p->scale;

    for (int64_t b = 0; b < p->batch; b++) {
        for (int64_t h = 0; h < p->heads; h++) {
            const int64_t hk = fa_kv_head(p, h);
            const double slope = fa_alibi_slope(p, b, h);

            /* pack this head: Q scaled, K transposed, V row-major (all float32) */
            for (int64_t i = 0; i < Sq; i++) {
                fa_gather_f32(&p->q, fa_off4(&p->q, b, i, h, 0), p->q.stride[3], d, Q + i * d);
                for (int64_t c = 0; c < d; c++) Q[i * d + c] *= scale;
            }
            for (int64_t j = 0; j < Sk; j++) {
                for (int64_t c = 0; c < d; c++)
                    Kt[(size_t)c * ldk + (size_t)j] = fa_load_f32(&p->k, fa_off4(&p->k, b, j, hk, c));
                fa_gather_f32(&p->v, fa_off4(&p->v, b, j, hk, 0), p->v.stride[3], dv, V + j * dv);
            }

#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(p->num_threads)
#endif
            for (int64_t i = 0; i < Sq; i++) {
                float *srow = S + (size_t)i * ldk; /* [Sk] */
                int64_t lo, hi;
                fa_key_range(p, i, &lo, &hi);

                /* S_i = Q_i K^T, the whole row, masked or not: that is the textbook way */
                for (int64_t j = 0; j < Sk; j++) srow[j] = 0.0f;
                for (int64_t c = 0; c < d; c++) {
                    const float qc = Q[i * d + c];
                    const float *krow = Kt + (size_t)c * ldk;
                    for (int64_t j = 0; j < Sk; j++) srow[j] += qc * krow[j];
                }
                /* transforms and mask */
                float m = -INFINITY;
                for (int64_t j = 0; j < Sk; j++) {
                    float s = srow[j];
                    if (p->softcap > 0.0) s = (float)(p->softcap * tanh(s / p->softcap));
                    if (slope != 0.0) {
                        int64_t rel = i + Sk - Sq - j;
                        s -= (float)(slope * (double)(rel < 0 ? -rel : rel));
                    }
                    if (j < lo || j >= hi) s = -INFINITY;
                    srow[j] = s;
                    if (isnan(s) || s > m) m = s;
                }
                /* P_i = softmax(S_i), in place */
                float l = 0.0f;
                if (m != -INFINITY) {
                    for (int64_t j = 0; j < Sk; j++) {
                        srow[j] = expf(srow[j] - m);
                        l += srow[j];
                    }
                }
                const int empty = (m == -INFINITY);
                /* O_i = P_i V / l */
                float acc[64];
                for (int64_t c0 = 0; c0 < dv; c0 += 64) {
                    int64_t nc = dv - c0 < 64 ? dv - c0 : 64;
                    for (int64_t c = 0; c < nc; c++) acc[c] = 0.0f;
                    if (!empty) {
                        for (int64_t j = lo; j < hi; j++) {
                            const float pj = srow[j];
                            const float *vrow = V + j * dv + c0;
                            for (int64_t c = 0; c < nc; c++) acc[c] += pj * vrow[c];
                        }
                    }
                    for (int64_t c = 0; c < nc; c++)
                        fa_store_f64(&p->o, fa_off4(&p->o, b, i, h, c0 + c), empty ? 0.0 : acc[c] / l);
                }
                if (p->lse.data)
                    fa_store_f64(&p->lse,
                                 b * p->lse.stride[0] + h * p->lse.stride[1] + i * p->lse.stride[2],
                                 empty ? -INFINITY : (double)m + log((double)l));
            }
        }
    }
    fa_free(S);
    fa_free(Q);
    fa_free(Kt);
    fa_free(V);
    return FA_OK;
}
