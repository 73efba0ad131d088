/*
 * backward.c — the attention backward pass: dQ, dK, dV from dO.
 *
 * The math (docs/semantics.md). For one (batch, query head), with the
 * final logits s_ij (scale, softcap, ALiBi, mask, as in the forward pass),
 *
 *     P_ij = exp(s_ij - LSE_i)            the softmax, recomputed from the LSE
 *     D_i  = dO_i . O_i                   (= sum_j P_ij dP_ij: softmax's Jacobian)
 *     dP   = dO V^T
 *     dS   = P o (dP - D)                 gradient w.r.t. the logits
 *     dT   = dS o (1 - tanh^2(t / c))     t = scale (q . k), when softcap c > 0
 *     dQ   = scale dT K,   dK = scale dT^T Q,   dV = P^T dO
 *
 * ALiBi's bias and the mask are constants: their derivative is 1 (visible)
 * or 0 (masked, P = 0), so they only shape P. For GQA the kv head's dK, dV
 * sum the contributions of all query heads of its group.
 *
 * Two implementations:
 *
 *   reference — the formulas above as plain loops in float64, one query row
 *     at a time; one task per (batch, kv head), which owns the dK/dV
 *     accumulators of that head ([Sk][d] + [Sk][dv] doubles, next to that
 *     head's K and V converted to float64 once) and the dQ rows of its query
 *     heads. No two tasks write the same element, so there are
 *     no atomics and the bits do not depend on the thread count.
 *
 *   flash — FlashAttention-2's backward, atomic-free, in one of two shapes
 *     that give the same bits. Both recompute P tile by tile from Q, K and
 *     the LSE (Sq x Sk never exists; only Br x Bc tiles):
 *         S = scale Q_i K_j^T        (qk)
 *         P = exp(S - LSE_i)         (transforms, mask, vexp)
 *         dP = dO_i V_j^T            (qk)
 *         dS = P o (dP - D_i)        (softcap derivative)
 *         dV_j += P^T dO_i,  dK_j += dS^T Q_i,  dQ_i += dS K_j
 *
 *     The single pass (bwd_task_onepass; FlashAttention-2's 5 tile products):
 *       one task per (batch, kv head) owns dK, dV of its keys and dQ of its
 *       group's query rows. For each K block j (outer), K_j^T, V_j^T, K_j and
 *       dK_j, dV_j live in the scratch; for each Q block i of every query head
 *       of the group (inner), tile_onepass computes S, P, dP, dS in that
 *       shape, dQ_i += dS K_j (pv), and dV_j, dK_j through pv_t, which reads
 *       the tile down its columns (P^T, dS^T without a transpose; tables
 *       without pv_t transpose the corner). dQ accumulates in task scratch
 *       (group x Sq rows of fa_ld_spread(d) floats, O(seqlen)) written once
 *       at the end, or, for float32 rows when that scratch does not fit
 *       beside the packs under the cap and under 8 MiB over all threads (or
 *       cannot be allocated), in the output itself. The task packs its
 *       group's Q_i, dO_i rows once when all threads' packs fit under the
 *       packing cap together, else per tile.
 *
 *     The two passes (7 tile products: S, P, dP and dS are computed twice):
 *       (a) one task per (batch, kv head, K block j): dK_j, dV_j on the
 *           transposed tile (S^T = scale K_j Q_i^T against the Q_i^T panel,
 *           then pv computes P^T dO_i and dS^T Q_i directly), every Q block i
 *           of every query head of the group streaming past;
 *       (b) one task per (batch, query head, Q block i): dQ_i in scratch, the
 *           K blocks stream past: S = scale Q_i K_j^T, P, dP = dO_i V_j^T,
 *           dS, and dQ_i += dS K_j (pv).
 *     Their tasks are many and small (blocks are cut into pieces when there
 *     are too few for the threads), so they keep any number of threads busy.
 *     use_one_pass picks the single pass when its B x Hk tasks do (one
 *     thread, or at most a fifth of the thread slots idle); FA_BWD_ONE_PASS=0
 *     or 1 forces the two passes or the single pass.
 *
 *     Same bits: qk computes S^T[j][i] and S[i][j] as the same FMA chain over
 *     c, the elementwise steps are per element, dK_j and dV_j receive the Q
 *     blocks in the same order in both shapes and dQ_i the K blocks, alpha =
 *     1, and the elements a cut tile skips are +-0 (tile_onepass). The
 *     alternatives — atomics, or a dQ buffer per thread summed at the end —
 *     give bits that depend on the schedule, or O(threads x Sq x d) memory.
 *     Every task runs on one thread in a fixed order: identical bits for any
 *     thread count (tests/test_determinism.c, tests/test_backward.c compare
 *     the two shapes bit for bit). Measured (two passes) on the project
 *     machine (AVX-512, B=1, N=2048, non-causal, counting 10 N^2 d per head =
 *     2.5x the forward's 4 N^2 d): d=64, H=4: ~120 GFLOP/s on one thread,
 *     210-245 on two (forward: ~160 and ~300); d=128, H=8: 122 and 226. qk
 *     and pv take ~65% of the time, vexp and the elementwise tile work ~10%.
 *     The single pass: docs/performance.md.
 *
 * D (one float per query row) is computed once up front: O(B x H x Sq).
 * The operands each pass streams (Q_i^T, dO_i^T, ... or K_j^T, V_j^T, K_j;
 * the single pass: Q_i, dO_i rows)
 * are packed once per (batch, kv head) when they fit in 16 MiB, else per
 * tile (see bwd_packed): memory beyond inputs and outputs stays
 * O(threads x block + B x H x Sq) plus that bounded panel buffer, plus in
 * the single pass threads x group x Sq rows of dQ accumulators: required when
 * dQ is not float32 (under 8 MiB over all threads unless FA_BWD_ONE_PASS=1
 * forces it), taken for a float32 dQ only when they fit beside the packs under
 * the cap and under those 8 MiB.
 * When the caller passes no O or LSE, fa_backward runs the forward pass of
 * the same implementation into temporaries first (O(B x Sq x H x d_v)).
 */
#include "internal.h"

#include <assert.h>
#include <stdint.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "pack.h"

#ifdef _OPENMP
#include <omp.h>
#endif

#define DIM(x) ((long long)(x))

/* ceil(n / b) for n >= 0, b >= 1, without overflowing n + b - 1 */
static int64_t nblocks(int64_t n, int64_t b) { return n > 0 ? (n - 1) / b + 1 : 0; }

static double load_lse(const fa_problem *p, int64_t b, int64_t h, int64_t i)
{
    return fa_load_f64(&p->lse, fa_lse_off(p, b, h, i));
}

/* ------------------------------------------------------------------------ */
/* reference: the spec as float64 loops                                      */
/* ------------------------------------------------------------------------ */

/* Per-thread scratch of the reference, in doubles. */
static size_t reference_scratch_doubles(const fa_problem *p)
{
    /* K [Sk][d] + V [Sk][dv] as float64, dK [Sk][d] + dV [Sk][dv] accumulators, q_i [d], dO_i [dv],
     * dq_i [d], O_i [dv] */
    const size_t dsum = fa_add_sat((size_t)p->d, (size_t)p->dv);
    return fa_add_sat(fa_mul_sat(fa_mul_sat(2, (size_t)p->seqlen_k), dsum),
                      fa_add_sat(fa_mul_sat(2, dsum), fa_add_sat((size_t)p->dv, 1)));
}

/* All query heads of kv head hk in batch b: writes dQ of those heads and dK, dV of hk. */
static void reference_backward_task(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dq,
                                    const fa_tensor *dk, const fa_tensor *dv, int64_t b, int64_t hk,
                                    double *scratch)
{
    const fa_seq seq = fa_problem_seq(p, b);
    const int64_t Sk = seq.k_len, d = p->d, dvd = p->dv, group = p->heads / p->heads_k;
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    const fa_rows dks = fa_rows_k(dk, &seq, hk), dvs = fa_rows_k(dv, &seq, hk);
    double *kd = scratch;                           /* K of this kv head [Sk][d] */
    double *vd = kd + (size_t)(Sk * d);             /* V of this kv head [Sk][dv] */
    double *dk_acc = vd + (size_t)(Sk * dvd);       /* [Sk][d] */
    double *dv_acc = dk_acc + (size_t)(Sk * d);     /* [Sk][dv] */
    double *qi = dv_acc + (size_t)(Sk * dvd);       /* [d] */
    double *doi = qi + d;                           /* [dv] */
    double *dqi = doi + dvd;                        /* [d] */
    double *oi = dqi + d;                           /* [dv] */
    memset(dk_acc, 0, (size_t)(Sk * (d + dvd)) * sizeof(double));
    for (int64_t j = 0; j < Sk; j++) {
        fa_rows_gather_f64(&ks, j, kd + j * d);
        fa_rows_gather_f64(&vs, j, vd + j * dvd);
    }
    const double c = p->softcap;

    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        const double slope = fa_alibi_slope(p, b, h);
        const fa_rows qs = fa_rows_q(&p->q, &seq, h), os = fa_rows_q(&p->o, &seq, h);
        const fa_rows dos = fa_rows_q(dout, &seq, h), dqs = fa_rows_q(dq, &seq, h);
        for (int64_t i = 0; i < seq.q_len; i++) {
            int64_t lo, hi;
            fa_key_range(p, b, i, &lo, &hi);
            const double L = load_lse(p, b, h, i);
            double D = 0.0;
            fa_rows_gather_f64(&qs, i, qi);
            fa_rows_gather_f64(&dos, i, doi);
            fa_rows_gather_f64(&os, i, oi);
            for (int64_t x = 0; x < dvd; x++) D += doi[x] * oi[x];
            for (int64_t x = 0; x < d; x++) dqi[x] = 0.0;
            const uint8_t *keep = p->keep ? fa_keep_row(p, b, h, i) : NULL;
            for (int64_t j = lo; j < hi; j++) { /* an empty row (lo >= hi) contributes nothing */
                double dot = 0.0;
                for (int64_t x = 0; x < d; x++) dot += qi[x] * kd[j * d + x];
                const double t = p->scale * dot;             /* scaled score */
                const double u = c > 0.0 ? c * tanh(t / c) : t; /* softcapped */
                const int64_t rel = i + fa_diag_offset(p, b) - j;
                const double s = u - slope * (double)(rel < 0 ? -rel : rel); /* ALiBi */
                const double P = exp(s - L);
                double dP = 0.0;
                for (int64_t x = 0; x < dvd; x++) dP += doi[x] * vd[j * dvd + x];
                /* dropout: O uses P Z / (1-p), so dV gets it and dP is masked and scaled */
                const double z = keep ? (keep[j * p->keep_stride[3]] ? p->keep_scale : 0.0) : 1.0;
                double dS = P * (z * dP - D);
                if (c > 0.0) dS *= 1.0 - (u / c) * (u / c); /* d/dt c tanh(t/c) */
                for (int64_t x = 0; x < d; x++) {
                    dqi[x] += dS * kd[j * d + x];
                    dk_acc[j * d + x] += dS * qi[x];
                }
                const double Pz = P * z;
                for (int64_t x = 0; x < dvd; x++) dv_acc[j * dvd + x] += Pz * doi[x];
            }
            for (int64_t x = 0; x < d; x++) fa_rows_put(&dqs, i, x, p->scale * dqi[x]);
        }
    }
    for (int64_t j = 0; j < Sk; j++) {
        for (int64_t x = 0; x < d; x++) fa_rows_put(&dks, j, x, p->scale * dk_acc[j * d + x]);
        for (int64_t x = 0; x < dvd; x++) fa_rows_put(&dvs, j, x, dv_acc[j * dvd + x]);
    }
}

/* The outputs of a backward and, for the emulation, its dtype and the sinks' gradient per
 * (batch, head) (NULL: not asked for; each slot is one task's: a (batch, kv head)'s heads). */
typedef struct bwd_args {
    const fa_tensor *dout, *dq, *dk, *dv;
    fa_dtype dt;
    float *dsink_part;
} bwd_args;

typedef void (*kv_head_task)(const fa_problem *p, const bwd_args *a, int64_t b, int64_t hk, void *scratch);

/* One task per (batch, kv head), each thread with `bytes` of scratch (the reference and the
 * emulation: a task owns its kv head's dK, dV and its query heads' dQ, so no atomics). */
static fa_status kv_head_tasks(const fa_problem *p, size_t bytes, const char *what, kv_head_task task,
                               const bwd_args *a)
{
    const int64_t tasks = p->batch * p->heads_k;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(fa_threads_for(p, p->batch * p->heads_k))
#endif
    {
        void *scratch = fa_scratch_alloc(p, bytes);
        if (!scratch) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp barrier
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < tasks; t++) {
            if (failed) continue;
            task(p, a, t / p->heads_k, t % p->heads_k, scratch);
        }
        fa_scratch_free(p, scratch);
    }
    if (failed) return fa_fail(FA_ERR_NOMEM, "%s backward: could not allocate %zu bytes per thread", what, bytes);
    return FA_OK;
}

static void reference_task(const fa_problem *p, const bwd_args *a, int64_t b, int64_t hk, void *scratch)
{
    reference_backward_task(p, a->dout, a->dq, a->dk, a->dv, b, hk, scratch);
}

fa_status fa_reference_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dq,
                                const fa_tensor *dk, const fa_tensor *dv)
{
    const bwd_args a = {dout, dq, dk, dv, FA_F64, NULL};
    return kv_head_tasks(p, fa_mul_sat(reference_scratch_doubles(p), sizeof(double)), "reference", reference_task, &a);
}

/* ------------------------------------------------------------------------ */
/* emulated: a plain backward in a low precision (check-grad's baseline)      */
/* ------------------------------------------------------------------------ */

/* Per-thread scratch of the emulation, in floats: K scaled [Sk][d], V [Sk][dv], the group's
 * dK, dV sums and one head's accumulators, q_i, dO_i, dq_i, and one row of S (u: before
 * ALiBi), P, P dropped and dP. */
static size_t emulated_scratch_floats(const fa_problem *p)
{
    const size_t dsum = fa_add_sat((size_t)p->d, (size_t)p->dv);
    return fa_add_sat(fa_mul_sat(fa_mul_sat(3, (size_t)p->seqlen_k), dsum),
                      fa_add_sat(fa_mul_sat(2, dsum), fa_mul_sat(5, (size_t)p->seqlen_k)));
}

/*
 * The attention backward as PyTorch's autograd runs FlashAttention's test reference in a low
 * precision (flash-attn's attention_ref(upcast=False, reorder_ops=True), whose gradients its
 * tests allow twice the error of): inputs in dt, K scaled first (k * scale, rounded), every
 * product's output rounded to dt after a float32 sum — S = q . k_s, P = softmax(S) (computed
 * in float32 from the rounded S), dP = dO . v, dS = P (dP - D) with D = sum_j dP_j P_j, dQ =
 * dS k_s, dK = (dS^T q) scale, dV = P^T dO — and the softcap, ALiBi, mask, sinks and dropout
 * as the reference applies them. Under GQA attention_ref repeats K and V per query head
 * before scaling, so each head's dK (and its scale) and dV are rounded before the group's
 * float32 sum is (as FlashAttention-2's mha_bwd sums bf16 per-head gradients). The sinks: a
 * sink is one more score column with no value row, so its dS is P_sink (0 - D), rounded, and
 * its gradient the float32 sum of those over the rows (into dsink_part[b][h]; the caller sums
 * over b and rounds). One task per (batch, kv head), as the reference.
 */
static void emulated_backward_task(const fa_problem *p, fa_dtype dt, const fa_tensor *dout, const fa_tensor *dq,
                                   const fa_tensor *dk, const fa_tensor *dv, float *dsink_part, int64_t b, int64_t hk,
                                   float *scratch)
{
    const fa_seq seq = fa_problem_seq(p, b);
    const int64_t Sk = seq.k_len, d = p->d, dvd = p->dv, group = p->heads / p->heads_k;
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    const fa_rows dks = fa_rows_k(dk, &seq, hk), dvs = fa_rows_k(dv, &seq, hk);
    float *kd = scratch, *vd = kd + (size_t)(Sk * d);
    float *dk_sum = vd + (size_t)(Sk * dvd), *dv_sum = dk_sum + (size_t)(Sk * d); /* over the group */
    float *dk_acc = dv_sum + (size_t)(Sk * dvd), *dv_acc = dk_acc + (size_t)(Sk * d); /* one head's */
    float *qi = dv_acc + (size_t)(Sk * dvd), *doi = qi + d, *dqi = doi + dvd;
    float *u = dqi + d, *sr = u + Sk, *pr = sr + Sk, *pd = pr + Sk, *dpr = pd + Sk;
    const float scale = (float)p->scale, c = (float)p->softcap;
    memset(dk_sum, 0, (size_t)(Sk * (d + dvd)) * sizeof(float));
    for (int64_t j = 0; j < Sk; j++) {
        for (int64_t x = 0; x < d; x++) kd[j * d + x] = fa_round_to(dt, fa_round_to(dt, (float)fa_rows_get(&ks, j, x)) * scale);
        for (int64_t x = 0; x < dvd; x++) vd[j * dvd + x] = fa_round_to(dt, (float)fa_rows_get(&vs, j, x));
    }
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        const double slope = fa_alibi_slope(p, b, h);
        const fa_rows qs = fa_rows_q(&p->q, &seq, h), dos = fa_rows_q(dout, &seq, h), dqs = fa_rows_q(dq, &seq, h);
        const int sinked = p->sinks.data != NULL;
        memset(dk_acc, 0, (size_t)(Sk * (d + dvd)) * sizeof(float));
        const float sink = sinked ? (float)fa_sink(p, h) : 0.0f;
        for (int64_t i = 0; i < seq.q_len; i++) {
            int64_t lo, hi;
            fa_key_range(p, b, i, &lo, &hi);
            for (int64_t x = 0; x < d; x++) qi[x] = fa_round_to(dt, (float)fa_rows_get(&qs, i, x));
            for (int64_t x = 0; x < dvd; x++) doi[x] = fa_round_to(dt, (float)fa_rows_get(&dos, i, x));
            for (int64_t x = 0; x < d; x++) dqi[x] = 0.0f;
            if (lo < hi) {
                float m = sinked ? sink : -INFINITY, l = 0.0f, D = 0.0f;
                for (int64_t j = lo; j < hi; j++) {
                    float dot = 0.0f;
                    for (int64_t x = 0; x < d; x++) dot += qi[x] * kd[j * d + x];
                    float t = fa_round_to(dt, dot);
                    if (c > 0.0f) t = fa_round_to(dt, c * tanhf(t / c));
                    u[j] = t;
                    const int64_t rel = i + fa_diag_offset(p, b) - j;
                    if (slope != 0.0) t = fa_round_to(dt, t - (float)(slope * (double)(rel < 0 ? -rel : rel)));
                    sr[j] = t;
                    if (t > m) m = t;
                }
                for (int64_t j = lo; j < hi; j++) l += expf(sr[j] - m);
                if (sinked) l += expf(sink - m);
                const uint8_t *keep = p->keep ? fa_keep_row(p, b, h, i) : NULL;
                for (int64_t j = lo; j < hi; j++) {
                    pr[j] = fa_round_to(dt, expf(sr[j] - m) / l);
                    const float z = keep ? (keep[j * p->keep_stride[3]] ? (float)p->keep_scale : 0.0f) : 1.0f;
                    pd[j] = keep ? fa_round_to(dt, pr[j] * z) : pr[j];
                    float dot = 0.0f;
                    for (int64_t x = 0; x < dvd; x++) dot += doi[x] * vd[j * dvd + x];
                    dpr[j] = keep ? fa_round_to(dt, fa_round_to(dt, dot) * z) : fa_round_to(dt, dot);
                    D += dpr[j] * pr[j];
                }
                if (sinked && dsink_part)
                    dsink_part[b * p->heads + h] += fa_round_to(dt, -fa_round_to(dt, expf(sink - m) / l) * D);
                for (int64_t j = lo; j < hi; j++) {
                    float dS = fa_round_to(dt, pr[j] * (dpr[j] - D));
                    if (c > 0.0f) dS = fa_round_to(dt, dS * (1.0f - (u[j] / c) * (u[j] / c)));
                    for (int64_t x = 0; x < d; x++) {
                        dqi[x] += dS * kd[j * d + x];
                        dk_acc[j * d + x] += dS * qi[x];
                    }
                    for (int64_t x = 0; x < dvd; x++) dv_acc[j * dvd + x] += pd[j] * doi[x];
                }
            }
            for (int64_t x = 0; x < d; x++) fa_rows_put(&dqs, i, x, (double)fa_round_to(dt, dqi[x]));
        }
        for (int64_t j = 0; j < Sk; j++) { /* this head's gradients, rounded, into the group's sums */
            for (int64_t x = 0; x < d; x++) dk_sum[j * d + x] += fa_round_to(dt, fa_round_to(dt, dk_acc[j * d + x]) * scale);
            for (int64_t x = 0; x < dvd; x++) dv_sum[j * dvd + x] += fa_round_to(dt, dv_acc[j * dvd + x]);
        }
    }
    for (int64_t j = 0; j < Sk; j++) {
        for (int64_t x = 0; x < d; x++) fa_rows_put(&dks, j, x, (double)fa_round_to(dt, dk_sum[j * d + x]));
        for (int64_t x = 0; x < dvd; x++) fa_rows_put(&dvs, j, x, (double)fa_round_to(dt, dv_sum[j * dvd + x]));
    }
}

static void emulated_task(const fa_problem *p, const bwd_args *a, int64_t b, int64_t hk, void *scratch)
{
    emulated_backward_task(p, a->dt, a->dout, a->dq, a->dk, a->dv, a->dsink_part, b, hk, scratch);
}

fa_status fa_emulated_backward(const fa_problem *p, fa_dtype dt, const fa_tensor *dout, const fa_tensor *dq,
                               const fa_tensor *dk, const fa_tensor *dv, const fa_tensor *dsinks)
{
    float *part = NULL;
    if (dsinks) {
        part = fa_calloc(fa_mul_sat(fa_mul_sat((size_t)p->batch, (size_t)p->heads), sizeof(float)));
        if (!part) return fa_fail(FA_ERR_NOMEM, "emulated backward: no memory for the sinks' gradient");
    }
    const bwd_args a = {dout, dq, dk, dv, dt, part};
    fa_status st = kv_head_tasks(p, fa_mul_sat(emulated_scratch_floats(p), sizeof(float)), "emulated", emulated_task,
                                 &a);
    if (st == FA_OK && dsinks)
        for (int64_t h = 0; h < p->heads; h++) { /* autograd's sum over the broadcast: float32, then rounded */
            float s = 0.0f;
            for (int64_t b = 0; b < p->batch; b++) s += part[b * p->heads + h];
            fa_store_f64(dsinks, h * dsinks->stride[0], (double)fa_round_to(dt, s));
        }
    fa_free(part);
    return st;
}

/* ------------------------------------------------------------------------ */
/* flash: two tiled passes                                                   */
/* ------------------------------------------------------------------------ */

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

typedef struct bwd_dims {
    int br, bc;     /* Q block rows, K block keys */
    size_t ldd;     /* round16(d):  rows of Q_i, K_j, dQ_i, dK_j */
    size_t lddv;    /* round16(dv): rows of dO_i, V_j, dV_j */
    size_t ldr;     /* round16(br): Q_i^T, dO_i^T panels */
    size_t ldt;     /* fa_ld_spread(br): transposed tiles [bc][ldt] (S^T, dP^T; no L1 set aliasing) */
    size_t ldk;     /* fa_ld_spread(d): K_j rows (sc->kr); the single pass's Q rows */
    size_t ldvs;    /* fa_ld_spread(dv): the single pass's dO rows */
    size_t ldcs;    /* fa_ld_spread(bc): the single pass's K_j^T, V_j^T panels and S, dP tiles */
    size_t ldc;     /* round16(bc): K_j^T, V_j^T panels; tiles [br][ldc] */
} bwd_dims;

/*
 * Per-thread scratch (float32, 64-byte aligned rows). Pass (a) uses
 * kr, vr, dka, dva, qt, dot, qr, dor, st, dpt; pass (b) uses qr, dor, kt, vt,
 * kr, s, dp, dqa; the single pass uses kt, vt, kr, s, dp, dka, dva (qr, dor when
 * it packs per tile; st for a kernel table without pv_t). lse, dd, lo, hi
 * describe the rows of the current Q block.
 */
typedef struct bwd_scratch {
    float *qr;    /* [br][ldd]   Q_i rows (single pass: [br][ldk]) */
    float *dor;   /* [br][lddv]  dO_i rows (single pass: [br][ldvs]) */
    float *qt;    /* [d][ldr]    Q_i^T, columns br..ldr zero */
    float *dot;   /* [dv][ldr]   dO_i^T */
    float *kr;    /* [bc][ldk]   K_j rows */
    float *vr;    /* [bc][lddv]  V_j rows */
    float *kt;    /* [d][ldc]    K_j^T (single pass: [d][ldcs]) */
    float *vt;    /* [dv][ldc]   V_j^T (single pass: [dv][ldcs]) */
    float *st;    /* [bc][ldt]   S^T -> P^T        (pass a) */
    float *dpt;   /* [bc][ldt]   dP^T -> dS^T      (pass a) */
    float *s;     /* [br][ldc]   S -> P            (pass b; single pass [br][ldcs]) */
    float *dp;    /* [br][ldc]   dP -> dS          (pass b; single pass [br][ldcs]) */
    float *dka;   /* [bc][ldd]   dK_j accumulator (unscaled) */
    float *dva;   /* [bc][lddv]  dV_j accumulator */
    float *dqa;   /* [br][ldd]   dQ_i accumulator (unscaled) */
    float *lse;   /* [ldr]       LSE of the rows of Q_i */
    float *dd;    /* [ldr]       D of the rows of Q_i */
    float *g;     /* [max(ldr, ldc)]  softcap derivative of one tile line */
    float *ones;  /* [max(ldr, ldc)]  alpha = 1 for pv */
    int64_t *lo, *hi; /* [br] visible key interval of each row of Q_i */
    void *base;
} bwd_scratch;

static bwd_dims bwd_layout(const fa_problem *p)
{
    bwd_dims g;
    /* the forward's blocks, capped unless pinned (FA_BWD_BLOCK_MAX); p keeps the
     * forward's own, which the recompute of O and LSE (api.c) must use */
    g.br = !p->blocks_pinned_q && p->block_q > FA_BWD_BLOCK_MAX ? FA_BWD_BLOCK_MAX : p->block_q;
    g.bc = !p->blocks_pinned_k && p->block_k > FA_BWD_BLOCK_MAX ? FA_BWD_BLOCK_MAX : p->block_k;
    assert(g.br >= 1 && g.bc >= 1); /* make_problem resolves the blocks for FA_IMPL_FLASH */
    g.ldd = round16((size_t)p->d);
    g.lddv = round16((size_t)p->dv);
    g.ldr = round16((size_t)g.br);
    g.ldc = round16((size_t)g.bc);
    g.ldt = fa_ld_spread((size_t)g.br);
    g.ldk = fa_ld_spread((size_t)p->d);
    g.ldvs = fa_ld_spread((size_t)p->dv);
    g.ldcs = fa_ld_spread((size_t)g.bc);
    return g;
}

static size_t bwd_scratch_floats(const fa_problem *p, const bwd_dims *g)
{
    const size_t br = (size_t)g->br, bc = (size_t)g->bc, d = (size_t)p->d, dv = (size_t)p->dv;
    const size_t lmax = g->ldr > g->ldc ? g->ldr : g->ldc;
    const size_t rows_d = fa_add_sat(fa_mul_sat(br + bc, g->ldd), fa_mul_sat(br + bc, g->ldk)); /* dqa, dka; qr, kr */
    const size_t rows_dv = fa_add_sat(fa_mul_sat(2 * bc, g->lddv), fa_mul_sat(br, g->ldvs)); /* vr, dva; dor */
    const size_t panels = fa_mul_sat(fa_add_sat(d, dv), g->ldr + g->ldcs); /* qt, dot, kt, vt */
    const size_t tiles = 2 * bc * g->ldt + 2 * br * g->ldcs;      /* st, dpt, s, dp */
    return fa_add_sat(fa_add_sat(rows_d, rows_dv), fa_add_sat(panels, tiles + 2 * g->ldr + 2 * lmax + 4 * round16(br) + 64));
}

static int bwd_scratch_alloc(const fa_problem *p, const bwd_dims *g, bwd_scratch *sc)
{
    const size_t br = (size_t)g->br, bc = (size_t)g->bc, d = (size_t)p->d, dv = (size_t)p->dv;
    const size_t lmax = g->ldr > g->ldc ? g->ldr : g->ldc;
    const size_t n = bwd_scratch_floats(p, g);
    float *cur = fa_scratch_alloc(p, fa_mul_sat(n, sizeof(float)));
    if (!cur) return 0;
    memset(cur, 0, n * sizeof(float)); /* padding columns of the panels stay zero */
    sc->base = cur;
    sc->qr = cur;   cur += br * g->ldk;
    sc->dor = cur;  cur += br * g->ldvs;
    sc->qt = cur;   cur += d * g->ldr;
    sc->dot = cur;  cur += dv * g->ldr;
    sc->kr = cur;   cur += bc * g->ldk;
    sc->vr = cur;   cur += bc * g->lddv;
    sc->kt = cur;   cur += d * g->ldcs;
    sc->vt = cur;   cur += dv * g->ldcs;
    sc->st = cur;   cur += bc * g->ldt;
    sc->dpt = cur;  cur += bc * g->ldt;
    sc->s = cur;    cur += br * g->ldcs;
    sc->dp = cur;   cur += br * g->ldcs;
    sc->dka = cur;  cur += bc * g->ldd;
    sc->dva = cur;  cur += bc * g->lddv;
    sc->dqa = cur;  cur += br * g->ldd;
    sc->lse = cur;  cur += g->ldr;
    sc->dd = cur;   cur += g->ldr;
    sc->g = cur;    cur += lmax;
    sc->ones = cur; cur += lmax;
    sc->lo = (int64_t *)cur; cur += 2 * round16(br);
    sc->hi = (int64_t *)cur;
    for (size_t x = 0; x < lmax; x++) sc->ones[x] = 1.0f;
    return 1;
}

/* Row row0 + r of output rows `dst` = scale * src[r][c] for r < n, c < width. */
static void store_rows(const fa_rows *dst, int64_t row0, int n, const float *src, size_t ld, float scale)
{
    const fa_tensor *t = dst->t;
    for (int r = 0; r < n; r++) {
        const float *row = src + (size_t)r * ld;
        const int64_t off = fa_rows_off(dst, row0 + r);
        if (t->dtype == FA_F32 && t->stride[3] == 1) {
            float *out = (float *)t->data + off;
            for (int64_t c = 0; c < dst->width; c++) out[c] = scale * row[c];
        } else {
            for (int64_t c = 0; c < dst->width; c++) fa_store_f64(t, off + c * t->stride[3], (double)(scale * row[c]));
        }
    }
}

/*
 * Operands packed once per (batch, kv head) and shared by all threads, when
 * they fit in p->pack_max_bytes (as the forward does for K and V):
 * packing per tile costs a transpose of every Q block for every K block (and
 * vice versa), ~15% of the time at N = 2048, d = 64, since BSHD rows are far
 * apart. Beyond the cap each task packs its own tiles: memory stays
 * O(threads x block) at any length.
 *   pass (a), Q blocks of the group's heads (nqb blocks per head, hh = h - hk*group):
 *     a: Q^T  [group][nqb][d][ldr]      b: dO^T [group][nqb][dv][ldr]
 *     c: Q    [group][nqb][br][ldd]     e: dO   [group][nqb][br][lddv]
 *   pass (b), K blocks:
 *     a: K^T  [nkb][d][ldc]   b: V^T [nkb][dv][ldc]   c: K [nkb][bc][ldd]   (e unused)
 */
typedef struct bwd_packed {
    float *a, *b, *c, *e;
} bwd_packed;

/* Q block t of pass (a)'s packed layout (a: Q^T, b: dO^T, c: Q, e: dO). */
static bwd_packed packed_q_block(const bwd_packed *qp, const bwd_dims *g, int64_t d, int64_t dvd, size_t t)
{
    bwd_packed q;
    q.a = qp->a + t * (size_t)d * g->ldr;
    q.b = qp->b + t * (size_t)dvd * g->ldr;
    q.c = qp->c + t * (size_t)g->br * g->ldd;
    q.e = qp->e + t * (size_t)g->br * g->lddv;
    return q;
}

/* Rows i0..i0+br of Q and dO into pass (a)'s four operands (Q^T, dO^T, Q, dO). */
static void pack_q_block(const fa_kernels *kern, const bwd_dims *g, const fa_rows *qs, const fa_rows *dos,
                         int64_t i0, int br, const bwd_packed *to)
{
    fa_pack_transposed(kern, qs, i0, br, to->a, g->ldr);
    fa_pack_transposed(kern, dos, i0, br, to->b, g->ldr);
    fa_pack_rows(qs, i0, br, to->c, g->ldd, 0);
    fa_pack_rows(dos, i0, br, to->e, g->lddv, 0);
}

static size_t shared_cap(const fa_problem *p)
{
    const size_t cap = p->pack_max_bytes; /* 0 forces per-tile packing */
    return cap < SIZE_MAX / 4 ? cap : SIZE_MAX / 4; /* a saturated size never fits */
}

static size_t packed_q_floats(const fa_problem *p, const bwd_dims *g)
{
    const size_t nblk = fa_mul_sat((size_t)nblocks(p->seqlen_q, g->br), (size_t)(p->heads / p->heads_k));
    const size_t dsum = fa_add_sat((size_t)p->d, (size_t)p->dv);
    return fa_mul_sat(nblk, fa_add_sat(fa_mul_sat(dsum, g->ldr), fa_mul_sat((size_t)g->br, g->ldd + g->lddv)));
}

static size_t packed_k_floats(const fa_problem *p, const bwd_dims *g)
{
    const size_t nkb = (size_t)nblocks(p->seqlen_k, g->bc);
    const size_t dsum = fa_add_sat((size_t)p->d, (size_t)p->dv);
    return fa_mul_sat(nkb, fa_add_sat(fa_mul_sat(dsum, g->ldc), fa_mul_sat((size_t)g->bc, g->ldd)));
}

static bwd_packed packed_q_layout(const fa_problem *p, const bwd_dims *g, float *base)
{
    const size_t nblk = fa_mul_sat((size_t)nblocks(p->seqlen_q, g->br), (size_t)(p->heads / p->heads_k));
    bwd_packed q;
    q.a = base;
    q.b = q.a + nblk * (size_t)p->d * g->ldr;
    q.c = q.b + nblk * (size_t)p->dv * g->ldr;
    q.e = q.c + nblk * (size_t)g->br * g->ldd;
    return q;
}

static bwd_packed packed_k_layout(const fa_problem *p, const bwd_dims *g, float *base)
{
    const size_t nkb = (size_t)nblocks(p->seqlen_k, g->bc);
    bwd_packed k;
    k.a = base;
    k.b = k.a + nkb * (size_t)p->d * g->ldc;
    k.c = k.b + nkb * (size_t)p->dv * g->ldc;
    k.e = NULL;
    return k;
}

/*
 * D is indexed like the tensor rows of Q (like the LSE): [q batches][heads][q
 * rows], so it is as large as Q's rows, never batch x heads x the longest
 * sequence. Only rows a sequence owns are written and read.
 */
static int64_t d_rows(const fa_problem *p)
{
    return p->q.shape[0] * p->heads * p->q.shape[1];
}

static int64_t d_index(const fa_problem *p, const fa_seq *seq, int64_t h, int64_t i)
{
    return (seq->q_batch * p->heads + h) * p->q.shape[1] + seq->q_start + i;
}

/*
 * Rows i0..i0+br of query head h: LSE, D and visible key intervals into the
 * scratch. Returns 1 if some row sees a key in [j0, j1), else 0.
 */
static int load_row_info(const fa_problem *p, const float *dvec, int64_t b, int64_t h, int64_t i0, int br,
                         int64_t j0, int64_t j1, bwd_scratch *sc)
{
    int any = 0;
    const fa_seq seq = fa_problem_seq(p, b);
    for (int r = 0; r < br; r++) {
        const int64_t i = i0 + r;
        fa_key_range(p, b, i, &sc->lo[r], &sc->hi[r]);
        sc->lse[r] = (float)load_lse(p, b, h, i);
        sc->dd[r] = dvec[d_index(p, &seq, h, i)];
        if (sc->lo[r] < sc->hi[r] && sc->lo[r] < j1 && sc->hi[r] > j0) any = 1;
    }
    return any;
}

/*
 * The elementwise middle of a tile, for one line of n scores. A line is a row
 * of S (pass b: one query, keys j0..j0+n) or a row of S^T (pass a: one key,
 * queries i0..i0+n). Either way its visible elements form one interval
 * [va, vb) (the band's lo_i and hi_i grow with i). On entry s holds
 * scale * (q . k) and dp holds dO . v; on return s holds P and dp holds dS,
 * through the softcap derivative. lse and dd are per element (pass a,
 * per_elem = 1) or one value for the whole line (pass b). ALiBi's distance of
 * element x is |rel0 + rel_step * x|. The transforms are flash.c's forward
 * ones, in float32, so P matches the forward's LSE.
 */
static void tile_line(const fa_problem *p, const fa_kernels *kern, float *restrict g, int n, int va, int vb,
                      float *restrict s, float *restrict dp, const float *restrict lse,
                      const float *restrict dd, int per_elem, double slope, int64_t rel0, int rel_step,
                      const uint8_t *keep, int64_t kstep)
{
    const float cap = (float)p->softcap, inv_cap = p->softcap > 0.0 ? (float)(1.0 / p->softcap) : 0.0f;
    kern->transform(n, va, vb, s, cap, inv_cap, slope, rel0, rel_step, cap > 0.0f ? g : NULL);
    if (!keep) {
        /* P = exp(s - LSE) (0 where masked), dS = P o (dP - D) o g: at the ISA's width */
        kern->bwd_line(n, va, vb, s, dp, lse, dd, per_elem, cap > 0.0f ? g : NULL);
        return;
    }
    /* dropout (validation runs): the portable lines */
    if (per_elem) {
        for (int x = va; x < vb; x++) s[x] -= lse[x];
    } else {
        const float L = lse[0];
        for (int x = va; x < vb; x++) s[x] -= L;
    }
    kern->vexp(n, s, s); /* exp(-inf) = 0 exactly: masked P = 0 */
    /* dS = P o (Z/(1-p) o dP - D), and s becomes P o Z/(1-p) for dV */
    const float zs = (float)p->keep_scale;
    for (int x = 0; x < n; x++) {
        const float z = keep[x * kstep] ? zs : 0.0f;
        dp[x] = s[x] * (z * dp[x] - (per_elem ? dd[x] : dd[0]));
        s[x] *= z;
    }
    if (cap > 0.0f) {
        for (int x = va; x < vb; x++) dp[x] *= g[x];
    }
}

/*
 * Cut tiles (as the forward's, src/flash.c): under a causal or windowed mask a
 * tile that some line sees only part of is computed per group of about 16
 * lines (rows of S in pass (b), keys of S^T in pass (a)), each over only the
 * columns its lines can see: pass (b) drops the masked columns at the end
 * (kern->cut_cols), pass (a) those at the start too (kern->cut_lead: its
 * lines are keys, and a key's masked queries come first under a causal
 * mask). A group that sees nothing of the tile is skipped. The dropped
 * columns only added P = 0 and dS = 0 * (dP - D) = +-0 terms, so the bits are
 * the whole tile's for finite dP (kernels.h); a dP of +-inf or NaN at a
 * masked position (V holding Inf or NaN, or dO . V overflowing) made the
 * whole tile's dS there NaN, which the cut drops where it drops the column.
 */
#define FA_CUT_GROUP_MAX 64
static int cut_group(const fa_kernels *kern)
{
    const int rb = kern->row_block > 0 ? kern->row_block : 1;
    const int n = rb * ((16 + rb - 1) / rb);
    return n < FA_CUT_GROUP_MAX ? n : FA_CUT_GROUP_MAX - FA_CUT_GROUP_MAX % rb;
}

/* Whether some query row of the tile does not see all of keys j0..j0+bc (a tile to cut). */
static int tile_partly_masked(const fa_problem *p, const fa_kernels *kern, const bwd_scratch *sc, int br,
                              int64_t j0, int bc)
{
    if (!(p->tile_cut && kern->cut_cols && kern->cut_lead)) return 0;
    for (int r = 0; r < br; r++)
        if (!(sc->lo[r] <= j0 && sc->hi[r] >= j0 + bc)) return 1;
    return 0;
}

/* Keys j0..j0+need of the tile that query rows r0..r0+nr see (0: none), for cut_cols. */
static int64_t group_need(const bwd_scratch *sc, int r0, int nr, int64_t j0, int bc)
{
    int64_t need = 0;
    for (int r = r0; r < r0 + nr; r++)
        if (sc->lo[r] < sc->hi[r] && sc->lo[r] < j0 + bc && sc->hi[r] > j0) {
            const int64_t e = (sc->hi[r] < j0 + bc ? sc->hi[r] : j0 + bc) - j0;
            if (e > need) need = e;
        }
    return need;
}

/* tile_line on query rows r0..r0+nr of an S-shaped tile (S, dP in sc->s, sc->dp, lds apart;
 * n keys from j0): each row's visible keys, its LSE and D, per-row ALiBi distance and keep row. */
static void query_lines(const fa_problem *p, const fa_kernels *kern, bwd_scratch *sc, int r0, int nr, int n,
                        size_t lds, int64_t b, int64_t h, int64_t i0, int64_t j0, double slope)
{
    for (int r = r0; r < r0 + nr; r++) {
        const int64_t lo = sc->lo[r] - j0, hi = sc->hi[r] - j0; /* tile-relative */
        const int va = lo > 0 ? (lo < n ? (int)lo : n) : 0;
        const int vb = hi < n ? (hi > va ? (int)hi : va) : n;
        tile_line(p, kern, sc->g, n, va, vb, sc->s + (size_t)r * lds, sc->dp + (size_t)r * lds, sc->lse + r,
                  sc->dd + r, 0, slope, i0 + r + fa_diag_offset(p, b) - j0, -1,
                  p->keep ? fa_keep_row(p, b, h, i0 + r) + j0 * p->keep_stride[3] : NULL, p->keep_stride[3]);
    }
}

/*
 * One tile of pass (a)'s shape: keys j0..j0+bc (K_j, V_j rows in sc->kr,
 * sc->vr) against queries i0..i0+br of head h (their row info in sc, their
 * panels qt, dot, qr, dor): S^T -> P^T in sc->st, dP^T -> dS^T in sc->dpt,
 * then dV_j += P^T dO_i and dK_j += dS^T Q_i into sc->dva, sc->dka.
 */
static void tile_dkdv(const fa_problem *p, const fa_kernels *kern, const bwd_dims *g, bwd_scratch *sc,
                      const float *qt, const float *dot, const float *qr, const float *dor, int64_t b, int64_t h,
                      int64_t i0, int br, int64_t j0, int bc, double slope)
{
    const int64_t d = p->d, dvd = p->dv;
    /* a tile some key line of which is partly masked: cut it per key group */
    const int cut = tile_partly_masked(p, kern, sc, br, j0, bc);
    if (!cut) {
        kern->qk(bc, br, (int)d, sc->kr, g->ldk, qt, g->ldr, (float)p->scale, sc->st, g->ldt);
        kern->qk(bc, br, (int)dvd, sc->vr, g->lddv, dot, g->ldr, 1.0f, sc->dpt, g->ldt);
    }
    /* queries visible to key j0 + j: [r1, r2), both growing with j */
    int r1 = 0, r2 = 0;
    const int keys = cut ? cut_group(kern) : bc;
    for (int k0 = 0; k0 < bc; k0 += keys) {
        const int nk = bc - k0 < keys ? bc - k0 : keys;
        int v1[FA_CUT_GROUP_MAX], v2[FA_CUT_GROUP_MAX]; /* each key's [r1, r2) when cut */
        int a = 0, n = br;
        if (cut) {
            int lo = br, hi = 0;
            for (int j = k0; j < k0 + nk; j++) {
                const int64_t key = j0 + j;
                while (r1 < br && sc->hi[r1] <= key) r1++;
                while (r2 < br && sc->lo[r2] <= key) r2++;
                v1[j - k0] = r1;
                v2[j - k0] = r2 > r1 ? r2 : r1;
                if (r2 > r1) {
                    if (r1 < lo) lo = r1;
                    if (r2 > hi) hi = r2;
                }
            }
            if (hi == 0) continue; /* no key of the group is seen: P = dS = 0 */
            n = kern->cut_cols(br, hi);
            a = kern->cut_lead(br, lo);
            float *st = sc->st + (size_t)k0 * g->ldt + a, *dpt = sc->dpt + (size_t)k0 * g->ldt + a;
            kern->qk(nk, n - a, (int)d, sc->kr + (size_t)k0 * g->ldk, g->ldk, qt + a, g->ldr, (float)p->scale, st,
                     g->ldt);
            kern->qk(nk, n - a, (int)dvd, sc->vr + (size_t)k0 * g->lddv, g->lddv, dot + a, g->ldr, 1.0f, dpt, g->ldt);
        }
        for (int j = k0; j < k0 + nk; j++) {
            const int64_t key = j0 + j;
            int va, vb;
            if (cut) {
                va = (v1[j - k0] < n ? v1[j - k0] : n) - a;
                vb = (v2[j - k0] < n ? v2[j - k0] : n) - a;
                if (va < 0) va = 0; /* a key that sees nothing, before the lead */
                if (vb < va) vb = va;
            } else {
                while (r1 < br && sc->hi[r1] <= key) r1++;
                while (r2 < br && sc->lo[r2] <= key) r2++;
                va = r1;
                vb = r2 > r1 ? r2 : r1;
            }
            tile_line(p, kern, sc->g, n - a, va, vb, sc->st + (size_t)j * g->ldt + a, sc->dpt + (size_t)j * g->ldt + a,
                      sc->lse + a, sc->dd + a, 1, slope, i0 + a + fa_diag_offset(p, b) - key, 1,
                      p->keep ? fa_keep_row(p, b, h, i0 + a) + key * p->keep_stride[3] : NULL, p->keep_stride[2]);
        }
        if (cut) {
            kern->pv(nk, n - a, (int)dvd, sc->st + (size_t)k0 * g->ldt + a, g->ldt, dor + (size_t)a * g->lddv, g->lddv,
                     sc->ones, sc->dva + (size_t)k0 * g->lddv, g->lddv);
            kern->pv(nk, n - a, (int)d, sc->dpt + (size_t)k0 * g->ldt + a, g->ldt, qr + (size_t)a * g->ldd, g->ldd,
                     sc->ones, sc->dka + (size_t)k0 * g->ldd, g->ldd);
        }
    }
    if (!cut) {
        kern->pv(bc, br, (int)dvd, sc->st, g->ldt, dor, g->lddv, sc->ones, sc->dva, g->lddv);
        kern->pv(bc, br, (int)d, sc->dpt, g->ldt, qr, g->ldd, sc->ones, sc->dka, g->ldd);
    }
}

/* Keys j0..j0+bc of a kv head as rows (K, V) and their dK, dV accumulators at +0. */
static void start_key_block(const fa_problem *p, const bwd_dims *g, bwd_scratch *sc, const fa_rows *ks,
                            const fa_rows *vs, int64_t j0, int bc)
{
    fa_pack_rows(ks, j0, bc, sc->kr, g->ldk, 0);
    fa_pack_rows(vs, j0, bc, sc->vr, g->lddv, 0);
    for (int j = 0; j < bc; j++) {
        memset(sc->dka + (size_t)j * g->ldd, 0, (size_t)p->d * sizeof(float));
        memset(sc->dva + (size_t)j * g->lddv, 0, (size_t)p->dv * sizeof(float));
    }
}

/* Pass (a): dK, dV of keys j0..j0+bc of kv head hk in batch b. */
static void bwd_task_dkdv(const fa_problem *p, const fa_kernels *kern, const bwd_dims *g, bwd_scratch *sc,
                          const bwd_packed *qp, const float *dvec, const fa_tensor *dout, const fa_tensor *dk,
                          const fa_tensor *dv, int64_t b, int64_t hk, int64_t j0, int bc)
{
    const int64_t d = p->d, dvd = p->dv, group = p->heads / p->heads_k;
    const fa_seq seq = fa_problem_seq(p, b);
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    start_key_block(p, g, sc, &ks, &vs, j0, bc);
    for (int64_t h = hk * group; h < (hk + 1) * group; h++) {
        const double slope = fa_alibi_slope(p, b, h);
        const fa_rows qs = fa_rows_q(&p->q, &seq, h), dos = fa_rows_q(dout, &seq, h);
        for (int64_t i0 = 0; i0 < seq.q_len; i0 += g->br) {
            const int br = (int)(seq.q_len - i0 < g->br ? seq.q_len - i0 : g->br);
            if (!load_row_info(p, dvec, b, h, i0, br, j0, j0 + bc, sc)) continue; /* tile fully masked */
            bwd_packed q = {sc->qt, sc->dot, sc->qr, sc->dor};
            if (qp) /* Q block (h, i0) packed once for all K blocks */
                q = packed_q_block(qp, g, d, dvd, (size_t)((h - hk * group) * nblocks(p->seqlen_q, g->br) + i0 / g->br));
            else
                pack_q_block(kern, g, &qs, &dos, i0, br, &q);
            tile_dkdv(p, kern, g, sc, q.a, q.b, q.c, q.e, b, h, i0, br, j0, bc, slope);
        }
    }
    const fa_rows dks = fa_rows_k(dk, &seq, hk), dvs = fa_rows_k(dv, &seq, hk);
    store_rows(&dks, j0, bc, sc->dka, g->ldd, (float)p->scale);
    store_rows(&dvs, j0, bc, sc->dva, g->lddv, 1.0f);
}

/* Pass (b): dQ of rows i0..i0+br of query head h in batch b. */
static void bwd_task_dq(const fa_problem *p, const fa_kernels *kern, const bwd_dims *g, bwd_scratch *sc,
                        const bwd_packed *kp, const float *dvec, const fa_tensor *dout, const fa_tensor *dq,
                        int64_t b, int64_t h, int64_t i0, int br)
{
    const int64_t d = p->d, dvd = p->dv, hk = fa_kv_head(p, h);
    const double slope = fa_alibi_slope(p, b, h);
    const fa_seq seq = fa_problem_seq(p, b);
    const fa_rows qs = fa_rows_q(&p->q, &seq, h), dos = fa_rows_q(dout, &seq, h), dqs = fa_rows_q(dq, &seq, h);
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    for (int r = 0; r < br; r++) memset(sc->dqa + (size_t)r * g->ldd, 0, (size_t)d * sizeof(float));
    if (load_row_info(p, dvec, b, h, i0, br, 0, seq.k_len, sc)) {
        int64_t jmin = seq.k_len, jmax = 0;
        for (int r = 0; r < br; r++)
            if (sc->lo[r] < sc->hi[r]) {
                if (sc->lo[r] < jmin) jmin = sc->lo[r];
                if (sc->hi[r] > jmax) jmax = sc->hi[r];
            }
        /* the smallest end of a non-empty row's keys: tiles past it are cut */
        const int cut_any = p->tile_cut && kern->cut_cols;
        int64_t jmin_hi = seq.k_len;
        for (int r = 0; r < br; r++)
            if (sc->lo[r] < sc->hi[r] && sc->hi[r] < jmin_hi) jmin_hi = sc->hi[r];
        fa_pack_rows(&qs, i0, br, sc->qr, g->ldd, 0);
        fa_pack_rows(&dos, i0, br, sc->dor, g->lddv, 0);
        for (int64_t j0 = jmin - jmin % g->bc; j0 < jmax; j0 += g->bc) {
            const int bc = (int)(seq.k_len - j0 < g->bc ? seq.k_len - j0 : g->bc);
            const float *kt = sc->kt, *vt = sc->vt, *kr = sc->kr;
            size_t ldkr = g->ldk;
            if (kp) { /* K block j0 packed once for all Q blocks */
                const size_t blk = (size_t)(j0 / g->bc);
                kt = kp->a + blk * (size_t)d * g->ldc;
                vt = kp->b + blk * (size_t)dvd * g->ldc;
                kr = kp->c + blk * (size_t)g->bc * g->ldd;
                ldkr = g->ldd;
            } else {
                fa_pack_transposed(kern, &ks, j0, bc, sc->kt, g->ldc);
                fa_pack_transposed(kern, &vs, j0, bc, sc->vt, g->ldc);
                fa_pack_rows(&ks, j0, bc, sc->kr, g->ldk, 0);
            }

            /* rows whose keys end inside this tile: cut it per row group (as flash.c's
             * flash_tile_cut: same bits); else the whole tile */
            const int cut = cut_any && jmin_hi < j0 + bc;
            const int rows = cut ? cut_group(kern) : br;
            for (int r0 = 0; r0 < br; r0 += rows) {
                const int nr = br - r0 < rows ? br - r0 : rows;
                int n = bc;
                if (cut) {
                    const int64_t need = group_need(sc, r0, nr, j0, bc);
                    if (need == 0) continue; /* no row of the group sees the tile: dS = 0 */
                    n = kern->cut_cols(bc, (int)need);
                }
                float *s = sc->s + (size_t)r0 * g->ldc, *dp = sc->dp + (size_t)r0 * g->ldc;
                kern->qk(nr, n, (int)d, sc->qr + (size_t)r0 * g->ldd, g->ldd, kt, g->ldc, (float)p->scale, s, g->ldc);
                kern->qk(nr, n, (int)dvd, sc->dor + (size_t)r0 * g->lddv, g->lddv, vt, g->ldc, 1.0f, dp, g->ldc);
                query_lines(p, kern, sc, r0, nr, n, g->ldc, b, h, i0, j0, slope);
                kern->pv(nr, n, (int)d, dp, g->ldc, kr, ldkr, sc->ones, sc->dqa + (size_t)r0 * g->ldd, g->ldd);
            }
        }
    }
    store_rows(&dqs, i0, br, sc->dqa, g->ldd, (float)p->scale);
}

/*
 * The single pass (FlashAttention-2's backward, atomic-free): one task per
 * (batch, kv head) owns dK, dV of its keys and dQ of its group's query rows.
 */

/* dst[c][r] = src[r][c] for r < rows, c < cols (a tile transposed; the kernel
 * table's transpose when it has one, which may also write zeros into columns
 * rows..round16(rows), dst's padding) */
static void tile_transpose(const fa_kernels *kern, int rows, int cols, const float *src, size_t lds, float *dst,
                           size_t ldd)
{
    if (kern->transpose) {
        kern->transpose(rows, cols, src, lds, dst, ldd);
        return;
    }
    for (int r0 = 0; r0 < rows; r0 += 16) { /* 16 rows at a time: dst written in whole lines */
        const int nr = rows - r0 < 16 ? rows - r0 : 16;
        for (int c = 0; c < cols; c++) {
            float *out = dst + (size_t)c * ldd + r0;
            for (int r = 0; r < nr; r++) out[r] = src[(size_t)(r0 + r) * lds + c];
        }
    }
}

/*
 * O[k][c] += sum over x < nq of T[x][k] V[x][c] for k < nk: pv on the transposed
 * nq x nk corner of tile T (lds apart) — pv_t in place, or, for a table without
 * it, pv on the corner transposed into sc->st (the same bits either way).
 */
static void pv_cols(const fa_kernels *kern, const bwd_dims *g, bwd_scratch *sc, int nk, int nq, int dv,
                    const float *t, size_t lds, const float *v, size_t ldv, float *o, size_t ldo)
{
    if (kern->pv_t) {
        kern->pv_t(nk, nq, dv, t, lds, v, ldv, sc->ones, o, ldo);
        return;
    }
    tile_transpose(kern, nq, nk, t, lds, sc->st, g->ldt);
    kern->pv(nk, nq, dv, sc->st, g->ldt, v, ldv, sc->ones, o, ldo);
}

/*
 * One tile of the single pass: queries i0..i0+br of head h (their rows qr, dor,
 * g->ldk and g->ldvs apart, their row info in sc) against keys j0..j0+bc (K_j^T,
 * V_j^T in sc->kt, sc->vt; K_j rows in sc->kr). S -> P and dP -> dS in sc->s,
 * sc->dp ([br][ldcs]) exactly as pass (b) computes them, cut per row group at the
 * end of its rows' keys, then dQ_i += dS K_j (pass (b)'s pv calls), then
 * dV_j += P^T dO_i and dK_j += dS^T Q_i: pv_t reads the tiles down their columns,
 * so these are pass (a)'s pv calls on the transposed tile, cut per key group as
 * pass (a) cuts (cut_lead, cut_cols over the queries). So the bits are the two
 * passes' (qk computes S[i][j] and S^T[j][i] as one FMA chain; tile_line is per
 * element). An element a cut leaves uncomputed here is a masked one (every
 * visible element is computed: n = cut_cols(bc, need) >= need), set to +0,
 * where pass (a) may have computed it as 0 * (dP - D) = -0; pv's accumulators
 * start at +0 and dK, dV, dQ start at +0, so a +-0 term changes no output bit
 * for finite inputs (non-finite ones at masked positions: docs/robustness.md).
 * Q^T and dO^T are never needed: the packs hold rows.
 */
static void tile_onepass(const fa_problem *p, const fa_kernels *kern, const bwd_dims *g, bwd_scratch *sc,
                         const float *qr, const float *dor, int64_t b, int64_t h, int64_t i0, int br, int64_t j0,
                         int bc, double slope, float *dqa, size_t lddq)
{
    const int64_t d = p->d, dvd = p->dv;
    const size_t lds = g->ldcs;
    const int cut = tile_partly_masked(p, kern, sc, br, j0, bc);
    const int rows = cut ? cut_group(kern) : br;
    for (int r0 = 0; r0 < br; r0 += rows) {
        const int nr = br - r0 < rows ? br - r0 : rows;
        float *s = sc->s + (size_t)r0 * lds, *dp = sc->dp + (size_t)r0 * lds;
        int n = bc;
        if (cut) {
            const int64_t need = group_need(sc, r0, nr, j0, bc);
            n = need > 0 ? kern->cut_cols(bc, (int)need) : 0;
            for (int r = 0; r < nr; r++) { /* columns past the cut: masked, P = dS = +0 */
                memset(s + (size_t)r * lds + n, 0, (size_t)(bc - n) * sizeof(float));
                memset(dp + (size_t)r * lds + n, 0, (size_t)(bc - n) * sizeof(float));
            }
            if (n == 0) continue; /* no row of the group sees the tile */
        }
        kern->qk(nr, n, (int)d, qr + (size_t)r0 * g->ldk, g->ldk, sc->kt, g->ldcs, (float)p->scale, s, lds);
        kern->qk(nr, n, (int)dvd, dor + (size_t)r0 * g->ldvs, g->ldvs, sc->vt, g->ldcs, 1.0f, dp, lds);
        query_lines(p, kern, sc, r0, nr, n, lds, b, h, i0, j0, slope);
        kern->pv(nr, n, (int)d, dp, lds, sc->kr, g->ldk, sc->ones, dqa + (size_t)r0 * lddq, lddq);
    }
    if (!cut) {
        pv_cols(kern, g, sc, bc, br, (int)dvd, sc->s, lds, dor, g->ldvs, sc->dva, g->lddv);
        pv_cols(kern, g, sc, bc, br, (int)d, sc->dp, lds, qr, g->ldk, sc->dka, g->ldd);
        return;
    }
    /* per key group: the queries that see one of its keys, [r1, r2) per key growing with it */
    const int keys = cut_group(kern);
    int r1 = 0, r2 = 0;
    for (int k0 = 0; k0 < bc; k0 += keys) {
        const int nk = bc - k0 < keys ? bc - k0 : keys;
        int lo = br, hi = 0;
        for (int j = k0; j < k0 + nk; j++) {
            const int64_t key = j0 + j;
            while (r1 < br && sc->hi[r1] <= key) r1++;
            while (r2 < br && sc->lo[r2] <= key) r2++;
            if (r2 > r1) {
                if (r1 < lo) lo = r1;
                if (r2 > hi) hi = r2;
            }
        }
        if (hi == 0) continue; /* no query sees the group's keys: P = dS = 0 */
        const int n = kern->cut_cols(br, hi), a = kern->cut_lead(br, lo);
        pv_cols(kern, g, sc, nk, n - a, (int)dvd, sc->s + (size_t)a * lds + k0, lds, dor + (size_t)a * g->ldvs,
                g->ldvs, sc->dva + (size_t)k0 * g->lddv, g->lddv);
        pv_cols(kern, g, sc, nk, n - a, (int)d, sc->dp + (size_t)a * lds + k0, lds, qr + (size_t)a * g->ldk, g->ldk,
                sc->dka + (size_t)k0 * g->ldd, g->ldd);
    }
}

/* dQ accumulates in the output itself when it holds float32 rows (that do not overlap) */
static int dq_in_place(const fa_problem *p, const fa_tensor *dq)
{
    return dq->dtype == FA_F32 && dq->stride[3] == 1 && dq->stride[1] >= p->d;
}

/*
 * The single pass's packs: the rows of Q and dO of the group's heads, nqb blocks each
 * (a: Q [group][nqb][br][ldk], b: dO [group][nqb][br][ldvs]) — rows only, no
 * transposed panels: its tiles are S = Q K_j^T with K_j^T per thread.
 */
static size_t onepass_q_floats(const fa_problem *p, const bwd_dims *g)
{
    const size_t nblk = fa_mul_sat((size_t)nblocks(p->seqlen_q, g->br), (size_t)(p->heads / p->heads_k));
    return fa_mul_sat(fa_mul_sat(nblk, (size_t)g->br), g->ldk + g->ldvs);
}

static bwd_packed onepass_q_layout(const fa_problem *p, const bwd_dims *g, float *base)
{
    const size_t nblk = fa_mul_sat((size_t)nblocks(p->seqlen_q, g->br), (size_t)(p->heads / p->heads_k));
    bwd_packed q = {base, base + nblk * (size_t)g->br * g->ldk, NULL, NULL};
    return q;
}

/* Block t of the single pass's packs (a: Q rows, b: dO rows). */
static bwd_packed onepass_q_block(const bwd_packed *qp, const bwd_dims *g, size_t t)
{
    bwd_packed q = {qp->a + t * (size_t)g->br * g->ldk, qp->b + t * (size_t)g->br * g->ldvs, NULL, NULL};
    return q;
}

/* Rows i0..i0+br of Q and dO into the single pass's operands. */
static void onepass_pack_q(const bwd_dims *g, const fa_rows *qs, const fa_rows *dos, int64_t i0, int br,
                           const bwd_packed *to)
{
    fa_pack_rows(qs, i0, br, to->a, g->ldk, 0);
    fa_pack_rows(dos, i0, br, to->b, g->ldvs, 0);
}

/* Keys j0..j0+bc for the single pass: K_j^T, V_j^T (sc->kt, sc->vt), K_j rows, dK, dV at +0. */
static void onepass_key_block(const fa_problem *p, const fa_kernels *kern, const bwd_dims *g, bwd_scratch *sc,
                              const fa_rows *ks, const fa_rows *vs, int64_t j0, int bc)
{
    fa_pack_transposed(kern, ks, j0, bc, sc->kt, g->ldcs);
    fa_pack_transposed(kern, vs, j0, bc, sc->vt, g->ldcs);
    fa_pack_rows(ks, j0, bc, sc->kr, g->ldk, 0);
    for (int j = 0; j < bc; j++) {
        memset(sc->dka + (size_t)j * g->ldd, 0, (size_t)p->d * sizeof(float));
        memset(sc->dva + (size_t)j * g->lddv, 0, (size_t)p->dv * sizeof(float));
    }
}

/* Per-thread buffers of the single pass beyond bwd_scratch. */
typedef struct bwd_onepass {
    bwd_packed qp; /* the task's Q, dO rows (onepass_q_layout), packed once; qp.a NULL: per tile */
    float *dqs;    /* [group][seqlen_q][ldk] dQ accumulators, or NULL: in the output (dq_in_place) */
} bwd_onepass;

/* The dQ accumulator rows of query head h (group index hh) of sequence seq, and their distance. */
static float *dq_acc(const fa_problem *p, const bwd_dims *g, const bwd_onepass *op, const fa_tensor *dq,
                     const fa_seq *seq, int64_t h, int64_t hh, size_t *ld)
{
    if (op->dqs) {
        *ld = g->ldk;
        return op->dqs + (size_t)hh * (size_t)p->seqlen_q * g->ldk;
    }
    const fa_rows dqs = fa_rows_q(dq, seq, h);
    *ld = (size_t)dq->stride[1];
    return (float *)dq->data + fa_rows_off(&dqs, 0);
}

/*
 * The single pass for kv head hk of batch b: for each K block j (outer),
 * K_j^T, V_j^T, K_j and dK_j, dV_j in the scratch; for each Q block i of every
 * query head of the group (inner), tile_onepass (S, P, dP, dS; dQ_i += dS K_j,
 * dV_j += P^T dO_i, dK_j += dS^T Q_i with the two passes' bits). 5 tile
 * products where the two passes take 7.
 */
static void bwd_task_onepass(const fa_problem *p, const fa_kernels *kern, const bwd_dims *g, bwd_scratch *sc,
                             const bwd_onepass *op, const float *dvec, const fa_tensor *dout, const fa_tensor *dq,
                             const fa_tensor *dk, const fa_tensor *dv, int64_t b, int64_t hk)
{
    const int64_t d = p->d, group = p->heads / p->heads_k;
    const fa_seq seq = fa_problem_seq(p, b);
    const int64_t nqb_max = nblocks(p->seqlen_q, g->br);
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    for (int64_t hh = 0; hh < group; hh++) { /* the accumulators start at +0 */
        size_t ld;
        float *acc = dq_acc(p, g, op, dq, &seq, hk * group + hh, hh, &ld);
        for (int64_t i = 0; i < seq.q_len; i++) memset(acc + (size_t)i * ld, 0, (size_t)d * sizeof(float));
    }
    if (op->qp.a) /* the group's Q blocks, once for all K blocks */
        for (int64_t t = 0; t < group * nqb_max; t++) {
            const int64_t h = hk * group + t / nqb_max, i0 = (t % nqb_max) * g->br;
            if (i0 >= seq.q_len) continue;
            const int br = (int)(seq.q_len - i0 < g->br ? seq.q_len - i0 : g->br);
            const fa_rows qs = fa_rows_q(&p->q, &seq, h), dos = fa_rows_q(dout, &seq, h);
            const bwd_packed to = onepass_q_block(&op->qp, g, (size_t)t);
            onepass_pack_q(g, &qs, &dos, i0, br, &to);
        }
    const fa_rows dks = fa_rows_k(dk, &seq, hk), dvs = fa_rows_k(dv, &seq, hk);
    for (int64_t j0 = 0; j0 < seq.k_len; j0 += g->bc) {
        const int bc = (int)(seq.k_len - j0 < g->bc ? seq.k_len - j0 : g->bc);
        onepass_key_block(p, kern, g, sc, &ks, &vs, j0, bc);
        for (int64_t hh = 0; hh < group; hh++) {
            const int64_t h = hk * group + hh;
            const double slope = fa_alibi_slope(p, b, h);
            const fa_rows qs = fa_rows_q(&p->q, &seq, h), dos = fa_rows_q(dout, &seq, h);
            size_t lddq;
            float *acc = dq_acc(p, g, op, dq, &seq, h, hh, &lddq);
            for (int64_t i0 = 0; i0 < seq.q_len; i0 += g->br) {
                const int br = (int)(seq.q_len - i0 < g->br ? seq.q_len - i0 : g->br);
                if (!load_row_info(p, dvec, b, h, i0, br, j0, j0 + bc, sc)) continue; /* tile fully masked */
                bwd_packed q = {sc->qr, sc->dor, NULL, NULL};
                if (op->qp.a)
                    q = onepass_q_block(&op->qp, g, (size_t)(hh * nqb_max + i0 / g->br));
                else
                    onepass_pack_q(g, &qs, &dos, i0, br, &q);
                tile_onepass(p, kern, g, sc, q.a, q.b, b, h, i0, br, j0, bc, slope, acc + (size_t)i0 * lddq, lddq);
            }
        }
        store_rows(&dks, j0, bc, sc->dka, g->ldd, (float)p->scale);
        store_rows(&dvs, j0, bc, sc->dva, g->lddv, 1.0f);
    }
    const float scale = (float)p->scale;
    for (int64_t hh = 0; hh < group; hh++) { /* dQ = scale dQ, as store_rows scales pass (b)'s */
        const int64_t h = hk * group + hh;
        size_t ld;
        float *acc = dq_acc(p, g, op, dq, &seq, h, hh, &ld);
        if (op->dqs) {
            const fa_rows dqs = fa_rows_q(dq, &seq, h);
            for (int64_t i0 = 0; i0 < seq.q_len; i0 += g->br)
                store_rows(&dqs, i0, (int)(seq.q_len - i0 < g->br ? seq.q_len - i0 : g->br), acc + (size_t)i0 * ld,
                           ld, scale);
        } else {
            for (int64_t i = 0; i < seq.q_len; i++) {
                float *row = acc + (size_t)i * ld;
                for (int64_t c = 0; c < d; c++) row[c] = scale * row[c];
            }
        }
    }
}

/* Bytes of one single-pass task's dQ accumulators in scratch: group x Sq rows of ldk. */
static size_t onepass_dq_scratch(const fa_problem *p, const bwd_dims *g)
{
    const size_t group = (size_t)(p->heads / p->heads_k);
    return fa_mul_sat(fa_mul_sat(group, (size_t)p->seqlen_q), fa_mul_sat(g->ldk, sizeof(float)));
}

/* Bytes of dQ accumulators one single-pass task must keep in scratch (0: it may use the output). */
static size_t onepass_dq_bytes(const fa_problem *p, const bwd_dims *g, const fa_tensor *dq)
{
    return dq_in_place(p, dq) ? 0 : onepass_dq_scratch(p, g);
}

/*
 * The single pass, or the two passes? FA_BWD_ONE_PASS (p->bwd_one_pass)
 * decides when set; else the single pass when its (batch, kv head) tasks keep
 * the threads busy: one thread, or at least as many tasks as threads with at
 * most a fifth of the thread slots of the rounds idle (B x Hk = 8 tasks on 16
 * threads, or 3 on 2, would leave half or a quarter of the machine waiting,
 * where the two passes cut their blocks into pieces for every thread) and no
 * task (q_len x k_len of its sequence) above 5/4 of the threads' fair share, and
 * when a dQ that is not float32 needs less than half of FA_PACK_DEFAULT_MAX_BYTES
 * of accumulators over all threads (beyond it the two passes keep memory
 * O(threads x block); the other half is left for the Q packs, which the
 * single pass takes only when packs and accumulators fit under the cap
 * together, so the pass's own buffers stay under the 16 MiB that
 * docs/robustness.md promises at N = 65536). Either way the bits are the
 * same (tile_onepass), so the rule may follow the thread count.
 */
static int use_one_pass(const fa_problem *p, const bwd_dims *g, const fa_tensor *dq)
{
    if (p->bwd_one_pass >= 0) return p->bwd_one_pass;
    const int64_t tasks = p->batch * p->heads_k, threads = p->num_threads;
    if (fa_mul_sat(onepass_dq_bytes(p, g, dq), (size_t)fa_threads_for(p, tasks)) >= FA_PACK_DEFAULT_MAX_BYTES / 2)
        return 0;
    if (threads <= 1) return 1;
    if (tasks < threads) return 0;
    const int64_t rounds = (tasks + threads - 1) / threads;
    if (5 * tasks < 4 * rounds * threads) return 0;
    /* sequences of different lengths (varlen, seqused_k): a task's work is about
     * q_len x k_len, and the longest task must not outweigh the threads' fair share
     * by more than a quarter (16 threads, 8 kv heads, lengths 4096 and 64: 16 tasks,
     * half of them nearly empty — the two passes cut every sequence into pieces) */
    double total = 0.0, most = 0.0;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq sq = fa_problem_seq(p, b);
        const double w = (double)sq.q_len * (double)sq.k_len;
        total += w * (double)p->heads_k;
        if (w > most) most = w;
    }
    return 4.0 * most * (double)threads <= 5.0 * total;
}

/*
 * Piece `pc` of a sequence of `len` rows (or keys): block pc / npc, its piece
 * pc % npc of `piece` (fa_piece_rows; npc = 1, piece = blk: whole blocks).
 * Sets the first row and the count; 0 when the piece is past the end.
 */
static int piece_of(int64_t len, int64_t pc, int64_t npc, int blk, int piece, int64_t *first, int64_t *count)
{
    const int64_t start = (pc / npc) * blk + (pc % npc) * piece;
    const int64_t block_end = (pc / npc) * blk + blk < len ? (pc / npc) * blk + blk : len;
    if (start >= block_end) return 0;
    *first = start;
    *count = block_end - start < piece ? block_end - start : piece;
    return 1;
}

fa_status fa_flash_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dq,
                            const fa_tensor *dk, const fa_tensor *dv)
{
    const fa_kernels *kern = p->kern;
    const bwd_dims g = bwd_layout(p);
    const int64_t nqb = nblocks(p->seqlen_q, g.br);
    const int64_t nkb = nblocks(p->seqlen_k, g.bc);
    const int64_t rows = d_rows(p);
    const int64_t group = p->heads / p->heads_k;
    float *dvec = fa_scratch_alloc(p, fa_mul_sat((size_t)(rows > 0 ? rows : 1), sizeof(float))); /* D, like Q's rows */
    if (!dvec) return fa_fail(FA_ERR_NOMEM, "flash backward: could not allocate D (%lld rows)", DIM(rows));
    int failed = 0;
    const int one_pass = use_one_pass(p, &g, dq);
    const int64_t bhk_tasks = p->batch * p->heads_k;

    /* two passes: shared packing, each pass on its own, when it fits under the cap */
    const size_t cap = fa_problem_long_enough(p, g.br, g.bc) ? shared_cap(p) : 0;
    const size_t qfl = packed_q_floats(p, &g), kfl = packed_k_floats(p, &g);
    const size_t qbytes = !one_pass && fa_mul_sat(qfl, sizeof(float)) <= cap ? qfl * sizeof(float) : 0;
    const size_t kbytes = !one_pass && fa_mul_sat(kfl, sizeof(float)) <= cap ? kfl * sizeof(float) : 0;
    const size_t sbytes = qbytes > kbytes ? qbytes : kbytes;
    /* one pass: each thread keeps dQ accumulators unless dQ accumulates in the output, and
     * packs its task's Q blocks when all threads' packs and accumulators fit under the cap
     * together */
    const int threads1 = fa_threads_for(p, bhk_tasks);
    const size_t dqs1 = one_pass ? onepass_dq_bytes(p, &g, dq) : 0;
    const size_t qfl1 = onepass_q_floats(p, &g);
    const size_t pack1 =
        one_pass && fa_mul_sat(fa_add_sat(fa_mul_sat(qfl1, sizeof(float)), dqs1), (size_t)threads1) <= cap
            ? qfl1 * sizeof(float)
            : 0;
    /* A float32 dQ that could accumulate in the output still accumulates in contiguous
     * scratch when that fits beside the packs under the cap (and the 8 MiB that use_one_pass
     * allows accumulators): the output's rows are heads x d apart, one page each at d = 128,
     * H = 8, and the 2 MiB of one head's dQ at N = 4096 leave L2 between two visits, so pv
     * waited on its O rows (dQ's pv took ~1.35x the time of each other product). The same
     * pv calls on the same values: the same bits. */
    size_t dqopt = 0;
    if (one_pass && dqs1 == 0) {
        const size_t want = onepass_dq_scratch(p, &g);
        if (fa_mul_sat(want, (size_t)threads1) < FA_PACK_DEFAULT_MAX_BYTES / 2 &&
            fa_mul_sat(fa_add_sat(pack1, want), (size_t)threads1) <= cap)
            dqopt = want;
    }
    float *shared = sbytes ? fa_scratch_alloc(p, sbytes) : NULL; /* reused: pass (a) is done before pass (b) packs */
    bwd_packed qpack = {NULL, NULL, NULL, NULL}, kpack = {NULL, NULL, NULL, NULL};
    if (shared && qbytes) qpack = packed_q_layout(p, &g, shared);
    if (shared && kbytes) kpack = packed_k_layout(p, &g, shared);

#ifdef _OPENMP
#pragma omp parallel num_threads(one_pass ? threads1 : fa_threads_for(p, rows > bhk_tasks * nkb ? rows : bhk_tasks * nkb))
#endif
    {
#ifdef _OPENMP
        const int nthreads = omp_get_num_threads();
#else
        const int nthreads = 1;
#endif
        /* blocks cut into pieces when a loop has too few for the threads (fa_piece_rows):
         * shared passes run one (batch, kv head) at a time, per-tile ones all at once */
        const int kpiece = fa_piece_rows(nkb, nthreads, g.bc, kern->row_block);
        const int qpiece = fa_piece_rows(group * nqb, nthreads, g.br, kern->row_block);
        const int kpiece_all = fa_piece_rows(p->batch * p->heads_k * nkb, nthreads, g.bc, kern->row_block);
        const int qpiece_all = fa_piece_rows(p->batch * p->heads * nqb, nthreads, g.br, kern->row_block);
        const int64_t kpc = (g.bc + kpiece - 1) / kpiece, qpc = (g.br + qpiece - 1) / qpiece;
        const int64_t kpc_all = (g.bc + kpiece_all - 1) / kpiece_all, qpc_all = (g.br + qpiece_all - 1) / qpiece_all;
        bwd_scratch sc;
        memset(&sc, 0, sizeof sc);
        if (!bwd_scratch_alloc(p, &g, &sc)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        bwd_onepass op = {{NULL, NULL, NULL, NULL}, NULL};
        void *pack1_mem = pack1 ? fa_scratch_alloc(p, pack1) : NULL;
        op.dqs = dqs1 || dqopt ? fa_scratch_alloc(p, dqs1 ? dqs1 : dqopt) : NULL;
        if ((pack1 && !pack1_mem) || (dqs1 && !op.dqs)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
        if (pack1_mem) op.qp = onepass_q_layout(p, &g, pack1_mem);
        /* D_i = dO_i . O_i, accumulated in float64, for the rows each sequence owns */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < p->batch * p->heads; t++) {
            const int64_t h = t % p->heads, b = t / p->heads;
            const fa_seq seq = fa_problem_seq(p, b);
            const fa_rows dos = fa_rows_q(dout, &seq, h), os = fa_rows_q(&p->o, &seq, h);
            float *dseq = dvec + d_index(p, &seq, h, 0);
            for (int64_t i = 0; i < seq.q_len; i++) {
                double acc = 0.0;
                for (int64_t c = 0; c < p->dv; c++) acc += fa_rows_get(&dos, i, c) * fa_rows_get(&os, i, c);
                dseq[i] = (float)acc;
            }
        }
        /* (the implicit barrier of the loop above also publishes `failed`) */
        if (!failed && one_pass) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < bhk_tasks; t++) {
                bwd_task_onepass(p, kern, &g, &sc, &op, dvec, dout, dq, dk, dv, t / p->heads_k, t % p->heads_k);
                fa_progress(p);
            }
        } else if (!failed && qpack.a) {
            /* pass (a), shared Q panels: per (batch, kv head), pack, then its K blocks */
            for (int64_t bhk = 0; bhk < p->batch * p->heads_k; bhk++) {
                const int64_t b = bhk / p->heads_k, hk = bhk % p->heads_k;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (int64_t t = 0; t < group * nqb; t++) {
                    const int64_t h = hk * group + t / nqb, i0 = (t % nqb) * g.br;
                    const fa_seq seq = fa_problem_seq(p, b);
                    if (i0 >= seq.q_len) continue; /* a sequence shorter than the longest */
                    const int br = (int)(seq.q_len - i0 < g.br ? seq.q_len - i0 : g.br);
                    const fa_rows qs = fa_rows_q(&p->q, &seq, h), dos = fa_rows_q(dout, &seq, h);
                    const bwd_packed to = packed_q_block(&qpack, &g, p->d, p->dv, (size_t)t);
                    pack_q_block(kern, &g, &qs, &dos, i0, br, &to);
                }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
                for (int64_t t = 0; t < nkb * kpc; t++) {
                    int64_t j0, bc;
                    if (!piece_of(fa_problem_seq(p, b).k_len, t, kpc, g.bc, kpiece, &j0, &bc)) continue;
                    bwd_task_dkdv(p, kern, &g, &sc, &qpack, dvec, dout, dk, dv, b, hk, j0, (int)bc);
                    fa_progress(p);
                }
            }
        } else if (!failed) {
            /* pass (a), per-tile packing */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < p->batch * p->heads_k * nkb * kpc_all; t++) {
                const int64_t kp = t % (nkb * kpc_all), bhk = t / (nkb * kpc_all);
                const int64_t hk = bhk % p->heads_k, b = bhk / p->heads_k;
                int64_t j0, bc;
                if (!piece_of(fa_problem_seq(p, b).k_len, kp, kpc_all, g.bc, kpiece_all, &j0, &bc)) continue;
                bwd_task_dkdv(p, kern, &g, &sc, NULL, dvec, dout, dk, dv, b, hk, j0, (int)bc);
                fa_progress(p);
            }
        }
        if (!failed && one_pass) {
            /* done above */
        } else if (!failed && kpack.a) {
            /* pass (b), shared K panels: per (batch, kv head), pack, then the group's Q blocks */
            for (int64_t bhk = 0; bhk < p->batch * p->heads_k; bhk++) {
                const int64_t b = bhk / p->heads_k, hk = bhk % p->heads_k;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (int64_t kb = 0; kb < nkb; kb++) {
                    const fa_seq seq = fa_problem_seq(p, b);
                    const int64_t j0 = kb * g.bc;
                    if (j0 >= seq.k_len) continue;
                    const int bc = (int)(seq.k_len - j0 < g.bc ? seq.k_len - j0 : g.bc);
                    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
                    fa_pack_transposed(kern, &ks, j0, bc, kpack.a + (size_t)kb * (size_t)p->d * g.ldc, g.ldc);
                    fa_pack_transposed(kern, &vs, j0, bc, kpack.b + (size_t)kb * (size_t)p->dv * g.ldc, g.ldc);
                    fa_pack_rows(&ks, j0, bc, kpack.c + (size_t)kb * (size_t)g.bc * g.ldd, g.ldd, 0);
                }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
                for (int64_t t = 0; t < group * nqb * qpc; t++) {
                    /* last Q rows first: under a causal mask they see the most keys */
                    const int64_t h = hk * group + t / (nqb * qpc), qp = nqb * qpc - 1 - t % (nqb * qpc);
                    int64_t i0, br;
                    if (!piece_of(fa_problem_seq(p, b).q_len, qp, qpc, g.br, qpiece, &i0, &br)) continue;
                    bwd_task_dq(p, kern, &g, &sc, &kpack, dvec, dout, dq, b, h, i0, (int)br);
                    fa_progress(p);
                }
            }
        } else if (!failed) {
            /* pass (b), per-tile packing */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < p->batch * p->heads * nqb * qpc_all; t++) {
                const int64_t nqp = nqb * qpc_all, qp = nqp - 1 - t % nqp;
                const int64_t h = (t / nqp) % p->heads, b = t / (nqp * p->heads);
                int64_t i0, br;
                if (!piece_of(fa_problem_seq(p, b).q_len, qp, qpc_all, g.br, qpiece_all, &i0, &br)) continue;
                bwd_task_dq(p, kern, &g, &sc, NULL, dvec, dout, dq, b, h, i0, (int)br);
                fa_progress(p);
            }
        }
        fa_scratch_free(p, sc.base);
        fa_scratch_free(p, pack1_mem);
        fa_scratch_free(p, op.dqs);
    }
    fa_scratch_free(p, dvec);
    fa_scratch_free(p, shared);
    if (failed)
        return fa_fail(FA_ERR_NOMEM, "flash backward: could not allocate %zu bytes of per-thread scratch",
                       fa_add_sat(fa_mul_sat(bwd_scratch_floats(p, &g), sizeof(float)), fa_add_sat(pack1, dqs1)));
    return FA_OK;
}
