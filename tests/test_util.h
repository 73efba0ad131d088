/*
 * test_util.h — shared helpers for the CMocka suites.
 *
 * Seeded random data (a fresh seed per run unless FA_TEST_SEED is set; the
 * seed is printed so a failure can be replayed), tensors that own their
 * storage, output poisoning (so every element is proven written), and
 * comparison against the float64 reference.
 */
#ifndef FA_TEST_UTIL_H
#define FA_TEST_UTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "flashattn.h"

/* Base seed for this process: $FA_TEST_SEED, else time-derived; printed once. */
uint64_t tu_seed(void);
/* splitmix64 step. */
uint64_t tu_next(uint64_t *state);
/* Uniform in [lo, hi). */
double tu_uniform(uint64_t *state, double lo, double hi);

/* A tensor that owns its storage. */
typedef struct tu_tensor {
    fa_tensor t;
    void *mem;
    size_t bytes;
} tu_tensor;

/*
 * Allocate a rank-4 tensor of logical shape [d0][d1][d2][d3] (BSHD for
 * attention tensors). With `bhsd` non-zero the memory is laid out as
 * [d0][d2][d1][d3] and strides describe that (a BHSD view of BSHD indices).
 */
tu_tensor tu_alloc4(fa_dtype dtype, int64_t d0, int64_t d1, int64_t d2, int64_t d3, int bhsd);
/* Rank-1..3 contiguous tensor. */
tu_tensor tu_alloc(fa_dtype dtype, int rank, const int64_t *shape);
void tu_free(tu_tensor *t);

/* Fill with uniform values in [lo, hi) (rounded to the dtype). */
void tu_fill(tu_tensor *t, uint64_t *state, double lo, double hi);
/* Fill every byte of the storage with a NaN pattern (poison). */
void tu_poison(tu_tensor *t);
/* Element at logical index (rank-4 or rank-3/2/1; unused trailing idx ignored). */
double tu_get(const tu_tensor *t, const int64_t *idx);
/* Number of NaN elements in the logical view (poison left behind = unwritten). */
int64_t tu_count_nan(const tu_tensor *t);

/*
 * Max |a - b| over all elements of two same-shaped tensors; -inf == -inf
 * and +inf == +inf count as equal (error 0); inf vs finite or NaN anywhere
 * gives +INFINITY. *where receives the flat logical index of the worst one.
 */
double tu_max_abs_diff(const tu_tensor *a, const tu_tensor *b, int64_t *where);

/*
 * Gradient checks shared by the serving-feature tests (sinks, dropout).
 * tu_grads holds float64 dq, dk, dv shaped like q, k, v, and dsinks [heads]
 * when the options carry sinks.
 */
typedef struct tu_grads {
    tu_tensor dq, dk, dv, dsinks;
} tu_grads;

/* fa_backward_ex into freshly allocated, poisoned float64 gradients; fails the test on an error. */
void tu_backward(const tu_tensor *q, const tu_tensor *k, const tu_tensor *v, const tu_tensor *dout,
                 const fa_options *opt, tu_grads *gr);
void tu_free_grads(tu_grads *gr);

/*
 * check-grad's baseline, the backward run plainly in `dt` (fa_backward_extra.emulate_dtype =
 * FA_BF16 or FA_F16), on the problem: for each of dq, dk, dv its max error against `ref` (the
 * float64 reference's gradients under `opt`), relative to max|ref|, must be above 0 (it really
 * rounds), at most `rel` (the dtype's noise), and below half the relative difference of `off`
 * (the reference without the feature under test) — so an emulation that ignored the feature
 * fails. With sinks, its dsinks too (0 < error <= rel against ref->dsinks). Fails the test
 * naming `what`.
 */
void tu_expect_emulated(const tu_tensor *q, const tu_tensor *k, const tu_tensor *v, const tu_tensor *dout,
                        const fa_options *opt, fa_dtype dt, const tu_grads *ref, const tu_grads *off, double rel,
                        const char *what);

/* tu_expect_emulated in bf16 (rel 2^-4) and f16 (rel 2^-7) against the reference's gradients
 * under `with`, `without` the feature under test (both float64 reference runs made here). */
void tu_expect_emulated_feature(const tu_tensor *q, const tu_tensor *k, const tu_tensor *v, const tu_tensor *dout,
                                const fa_options *with, const fa_options *without, const char *what);

/* A scalar loss of the problem `ctx` under `opt` (e.g. sum O * dO of the float64 reference). */
typedef double (*tu_loss_fn)(const void *ctx, const fa_options *opt);

/*
 * Central differences of `loss` in every element of the float64 tensor `x`
 * (one of the problem's inputs, perturbed in place and restored) against
 * `grad`: |fd - grad| <= 1e-7 + 1e-6 |fd|.
 */
void tu_expect_fd(tu_loss_fn loss, const void *ctx, const fa_options *opt, tu_tensor *x,
                  const tu_tensor *grad, const char *what);

/* max |a - ref| <= rtol * max(1, max|ref|) for float64 `ref`; fails naming `what` and the element. */
void tu_expect_close(const tu_tensor *a, const tu_tensor *ref, double rtol, const char *what);

#endif /* FA_TEST_UTIL_H */
