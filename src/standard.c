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
 * so memory is one S per call whatever the thread count. The two matrix
 * products use the same SIMD micro-kernels as the flash path (qk over a whole
 * row of keys, pv over a whole row of P), so flash vs standard measures the
 * IO difference — the N x N round trip — not a difference in arithmetic.
 */
#include "internal.h"

#include <stdlib.h>

#include "kernels/kernels.h"
#include "pack.h"
#include "serve.h"

/* Rows per micro-kernel call, and the d_v chunk of the P V accumulator. */
#define STD_ROWS 32
#define STD_DV_CHUNK 128

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

/*
 * S/P is used by one (sequence, head) at a time, so it is sized for the
 * largest q_len_b x round16(k_len_b) over the sequences, not for the longest
 * query rows times the most keys of different sequences. *at: the sequence
 * that needs it. Saturates at SIZE_MAX.
 */
static size_t s_floats(const fa_problem *p, int64_t *at)
{
    size_t best = 0;
    *at = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq seq = fa_problem_seq(p, b);
        const size_t n = fa_mul_sat((size_t)seq.q_len, round16((size_t)seq.k_len));
        if (n > best) {
            best = n;
            *at = b;
        }
    }
    return best;
}

size_t fa_standard_workspace(const fa_problem *p)
{
    int64_t at;
    size_t ldk = round16((size_t)p->seqlen_k);
    size_t s = s_floats(p, &at);                           /* S/P [q_len][round16(k_len)] */
    size_t packed = (size_t)p->seqlen_q * (size_t)p->d     /* Q   [Sq][d]   */
                    + (size_t)p->d * ldk                   /* K^T [d][ldk]  */
                    + (size_t)p->seqlen_k * (size_t)p->dv  /* V   [Sk][dv]  */
                    + 2 * (size_t)p->seqlen_q;             /* row max, sum  */
    return fa_mul_sat(fa_add_sat(s, packed), sizeof(float));
}

fa_status fa_standard_forward(const fa_problem *p)
{
    /* sized for the longest sequence; each (sequence, head) uses its own lengths
     * (S and K^T with the sequence's own leading dimension round16(k_len)) */
    const int64_t Sq_max = p->seqlen_q, Sk_max = p->seqlen_k, d = p->d, dv = p->dv;
    const size_t ldk_max = round16((size_t)Sk_max);
    int64_t at;
    const size_t s_fl = s_floats(p, &at);
    /* overflow-safe size of S in bytes */
    if (s_fl > SIZE_MAX / sizeof(float))
        return fa_fail(FA_ERR_TOO_LARGE, "standard: S would need more than SIZE_MAX bytes");
    const size_t s_bytes = s_fl * sizeof(float);
    if (s_bytes > p->standard_max_bytes) {
        const fa_seq big = fa_problem_seq(p, at);
        if (p->batch > 1 && (p->seq || p->cu_seqlens_q || p->cache_seqlens))
            return fa_fail(FA_ERR_TOO_LARGE,
                           "standard: S and P need %zu bytes per head (sequence %lld: seqlen_q %lld x seqlen_k "
                           "%lld), above the cap of %zu bytes; use the flash path or raise the cap "
                           "(standard_max_bytes)",
                           s_bytes, (long long)at, (long long)big.q_len, (long long)big.k_len,
                           p->standard_max_bytes);
        return fa_fail(FA_ERR_TOO_LARGE,
                       "standard: S and P need %zu bytes per head (seqlen_q %lld x seqlen_k %lld), "
                       "above the cap of %zu bytes; use the flash path or raise the cap (standard_max_bytes)",
                       s_bytes, (long long)big.q_len, (long long)big.k_len, p->standard_max_bytes);
    }

    float *S = fa_scratch_alloc(p, s_bytes ? s_bytes : sizeof(float));               /* [q_len][ldk] */
    float *Q = fa_scratch_alloc(p, (size_t)Sq_max * (size_t)d * sizeof(float));          /* [Sq_max][d] */
    float *Kt = fa_scratch_alloc(p, (size_t)d * ldk_max * sizeof(float) + sizeof(float)); /* [d][ldk] */
    float *V = fa_scratch_alloc(p, ((size_t)Sk_max * (size_t)dv + 1) * sizeof(float));   /* [Sk_max][dv] */
    float *rowm = fa_scratch_alloc(p, (size_t)Sq_max * sizeof(float));                   /* [Sq_max] row max */
    float *rowl = fa_scratch_alloc(p, (size_t)Sq_max * sizeof(float));                   /* [Sq_max] row sum */
    if (!S || !Q || !Kt || !V || !rowm || !rowl) {
        fa_scratch_free(p, S); fa_scratch_free(p, Q); fa_scratch_free(p, Kt); fa_scratch_free(p, V); fa_scratch_free(p, rowm); fa_scratch_free(p, rowl);
        return fa_fail(FA_ERR_NOMEM, "standard: could not allocate %zu bytes", fa_standard_workspace(p));
    }
    const float scale = (float)p->scale;
    const fa_kernels *kern = p->kern;

    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq seq = fa_problem_seq(p, b);
        const int64_t Sq = seq.q_len, Sk = seq.k_len; /* this sequence's */
        const size_t ldk = round16((size_t)Sk);
        for (int64_t h = 0; h < p->heads && Sq > 0; h++) {
            const int64_t hk = fa_kv_head(p, h);
            const double slope = fa_alibi_slope(p, b, h);

            /* pack this head through the one packer: Q rows, K transposed, V rows
             * (all float32; v_bad: V holds Inf or NaN) */
            const fa_rows qs = fa_rows_q(&p->q, &seq, h), ks = fa_rows_kv(p, &seq, hk, 0),
                          vs = fa_rows_kv(p, &seq, hk, 1), os = fa_rows_q(&p->o, &seq, h);
            fa_pack_rows(&qs, 0, (int)Sq, Q, (size_t)d, 0);
            fa_pack_transposed(kern, &ks, 0, (int)Sk, Kt, ldk);
            const int v_bad = fa_pack_rows(&vs, 0, (int)Sk, V, (size_t)dv, 1);

            /* 1. S = scale * Q K^T for all rows, one row block per kernel call */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(fa_threads_for(p, (Sq + STD_ROWS - 1) / STD_ROWS))
#endif
            for (int64_t i0 = 0; i0 < Sq; i0 += STD_ROWS) {
                const int br = (int)(Sq - i0 < STD_ROWS ? Sq - i0 : STD_ROWS);
                kern->qk(br, (int)Sk, (int)d, Q + i0 * d, (size_t)d, Kt, ldk, scale, S + (size_t)i0 * ldk, ldk);
            }

            /* 2. transforms, mask, and P = softmax(S) in place: the flash path's own
             * float32 transforms (transform.c) and SIMD softmax kernel, one row block at
             * a time, so flash vs standard differs in the S round trip, not in the math */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(fa_threads_for(p, (Sq + STD_ROWS - 1) / STD_ROWS))
#endif
            for (int64_t i0 = 0; i0 < Sq; i0 += STD_ROWS) {
                const int br = (int)(Sq - i0 < STD_ROWS ? Sq - i0 : STD_ROWS);
                int64_t lo[STD_ROWS], hi[STD_ROWS];
                float alpha[STD_ROWS];
                for (int r = 0; r < br; r++) {
                    fa_key_range(p, b, i0 + r, &lo[r], &hi[r]);
                    rowm[i0 + r] = -INFINITY;
                    rowl[i0 + r] = 0.0f;
                }
                float *sblk = S + (size_t)i0 * ldk; /* [br][ldk] */
                fa_transform_tile(p, b, i0, br, 0, (int)Sk, slope, lo, hi, sblk, ldk);
                kern->softmax(br, (int)Sk, sblk, ldk, rowm + i0, rowl + i0, alpha);
                if (p->keep) fa_dropout_tile(p, b, h, i0, br, 0, (int)Sk, sblk, ldk); /* P o Z / (1-p) */
                /* a row that sees keys but whose max stayed -inf: like an empty row when
                 * infinite inputs gave every -inf logit (as in the reference), else NaN — a
                 * NaN score the max skipped (l NaN, kernels.h), or a finite key whose float32
                 * score overflowed to -inf (the rule of fa_finish_row) */
                for (int r = 0; r < br; r++)
                    if (lo[r] < hi[r] && rowm[i0 + r] == -INFINITY &&
                        (rowl[i0 + r] != 0.0f || !fa_row_minus_inf_is_real(p, &seq, h, i0 + r)))
                        rowm[i0 + r] = rowl[i0 + r] = NAN;
            }

            /* 3. O = P V / l, one row block per kernel call */
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic, 1) num_threads(fa_threads_for(p, (Sq + STD_ROWS - 1) / STD_ROWS))
#endif
            for (int64_t i0 = 0; i0 < Sq; i0 += STD_ROWS) {
                const int br = (int)(Sq - i0 < STD_ROWS ? Sq - i0 : STD_ROWS);
                float acc[STD_ROWS * STD_DV_CHUNK]; /* [br][<= STD_DV_CHUNK] */
                float ones[STD_ROWS];
                for (int r = 0; r < br; r++) ones[r] = 1.0f;
                for (int64_t c0 = 0; c0 < dv; c0 += STD_DV_CHUNK) {
                    const int nc = (int)(dv - c0 < STD_DV_CHUNK ? dv - c0 : STD_DV_CHUNK);
                    memset(acc, 0, sizeof acc);
                    if (!v_bad) {
                        kern->pv(br, (int)Sk, nc, S + (size_t)i0 * ldk, ldk, V + c0, (size_t)dv, ones,
                                 acc, STD_DV_CHUNK);
                    } else {
                        /* V holds Inf or NaN: each row multiplies only its visible keys,
                         * since the P = 0 of a masked key times Inf/NaN is NaN and would
                         * reach rows that cannot see that key */
                        for (int r = 0; r < br; r++) {
                            int64_t lo, hi;
                            fa_key_range(p, b, i0 + r, &lo, &hi);
                            if (lo < hi && rowm[i0 + r] != -INFINITY)
                                kern->pv(1, (int)(hi - lo), nc, S + (size_t)(i0 + r) * ldk + lo, ldk,
                                         V + lo * dv + c0, (size_t)dv, ones, acc + r * STD_DV_CHUNK,
                                         STD_DV_CHUNK);
                        }
                    }
                    for (int r = 0; r < br; r++) {
                        const int64_t i = i0 + r;
                        const int empty = rowm[i] == -INFINITY;
                        if (p->sinks.data) { /* the sink joins the denominator only (mask.h) */
                            double sscale, lse;
                            fa_sink_finish(fa_sink(p, h), rowm[i], rowl[i], empty, &sscale, &lse);
                            for (int c = 0; c < nc; c++)
                                fa_rows_put(&os, i, c0 + c, empty ? 0.0 : (double)(acc[r * STD_DV_CHUNK + c] * (float)sscale));
                            continue;
                        }
                        for (int c = 0; c < nc; c++)
                            fa_rows_put(&os, i, c0 + c,
                                        empty ? 0.0 : (double)(acc[r * STD_DV_CHUNK + c] / rowl[i]));
                    }
                }
                if (p->lse.data)
                    for (int r = 0; r < br; r++) {
                        const int64_t i = i0 + r;
                        double lse = rowm[i] == -INFINITY ? -INFINITY : (double)rowm[i] + log((double)rowl[i]);
                        if (p->sinks.data) {
                            double sscale;
                            fa_sink_finish(fa_sink(p, h), rowm[i], rowl[i], rowm[i] == -INFINITY, &sscale, &lse);
                        }
                        fa_store_f64(&p->lse, fa_lse_off(p, b, h, i), lse);
                    }
            }
        }
    }
    fa_scratch_free(p, S);
    fa_scratch_free(p, Q);
    fa_scratch_free(p, Kt);
    fa_scratch_free(p, V);
    fa_scratch_free(p, rowm);
    fa_scratch_free(p, rowl);
    return FA_OK;
}
