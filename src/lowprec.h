/*
 * lowprec.h — what fa_check (validate.c) uses of the low-precision module
 * (lowprec.c): rounding P to a low-precision format for the baseline, and
 * the emulation of a kernel's data path for one query row.
 */
#ifndef FA_LOWPREC_H
#define FA_LOWPREC_H

#include "flashattn.h"

#include <stdint.h>

#include "pack.h"
#include "problem.h"

/* The format P is rounded to before P.V when Q, K, V are in `qkv_format`:
 * the format itself for FP8 and FP4, e4m3 for INT8 (SageAttention's P). */
int fa_lp_p_format(int qkv_format);

/* Round x to `format` (round to nearest even, saturating) and back. */
double fa_lp_round(int format, double x);

/*
 * The baseline's P: e[0..n) are exp(s - max) of one row's visible keys and
 * sum their float32 sum; on return e[j] = the normalized P rounded to
 * `p_format` — directly for FP8; for e2m1 as FP4 kernels do, in blocks of 16
 * keys: P scaled by 448*6, a per-block e4m3 scale max/6, the elements
 * rounded to e2m1 against the unrounded scale, dequantized with the rounded one.
 */
void fa_lp_round_p(int p_format, float *e, int64_t n, float sum);

/* Per-thread scratch of the kernel model. */
typedef struct fa_lp_model_scratch {
    float *pt;   /* [block] scaled probabilities of one key block */
    float *acc;  /* [dv] output accumulator */
    float *vrow; /* [dv] one value row as float32 */
} fa_lp_model_scratch;

int fa_lp_model_scratch_alloc(fa_lp_model_scratch *s, const fa_problem *p);
void fa_lp_model_scratch_free(fa_lp_model_scratch *s);

/*
 * The kernel model's output row (rounded to bf16) for one query row, given its
 * float32 logits s[lo..hi) (scale, softcap and ALiBi applied) and its value
 * rows vs (dv wide): out[0..dv). Counts probabilities that went past the
 * format's saturation in *n_sat.
 */
void fa_lp_model_row(int model, int p_format, const fa_rows *vs, int64_t dv, const float *s, int64_t lo,
                     int64_t hi, fa_lp_model_scratch *sc, double *out, int64_t *n_sat);

#endif /* FA_LOWPREC_H */
