/*
 * serve.h — the serving extras shared by the implementations (serve.c):
 * the attention sinks' own gradient, dropout applied to a tile of P, the
 * rotary embedding of q and k_new. (The sink's forward term is mask.h's
 * fa_sink_finish, used where each implementation finishes a row.)
 */
#ifndef FA_SERVE_H
#define FA_SERVE_H

#include "problem.h"

/*
 * dsinks[h] = -sum over sequences b and their query rows i of
 *             e^{sink_h - LSE_{b,h,i}} D_{b,h,i},   D = dO_i . O_i
 * (the sink is one more logit whose value row is 0: dS_sink = P_sink (0 - D)).
 * p->o and p->lse hold the forward's O and LSE (with the sink). Accumulated in
 * float64 per head in a fixed order: the same bits for any thread count.
 * dsinks: a checked [heads] f32/f64 tensor.
 */
fa_status fa_sinks_backward(const fa_problem *p, const fa_tensor *dout, const fa_tensor *dsinks);

/*
 * Dropout on a float32 tile of P (rows i0.., keys j0.. of sequence b, head h),
 * after the softmax has summed the undropped P into the row sums: element
 * (r, j) *= Z / (1 - p) (0 where dropped). Used by flash and standard. The
 * tile's keys and rows must lie inside the sequence.
 */
void fa_dropout_tile(const fa_problem *p, int64_t b, int64_t h, int64_t i0, int br, int64_t j0, int bc, float *s,
                     size_t lds);

/*
 * Rotary (fa_rotary): replace p->q and p->k_new by rotated copies (C-contiguous,
 * the same dtypes: the rotation is computed in float64 and rounded to them, as
 * FlashAttention rounds to its input dtype), so every implementation, the
 * append and fa_check read rotated rows. Memory: one copy of q and of k_new,
 * linear in the sequence lengths. *mem receives the allocation, to be freed
 * with fa_free after the call. No-op (and *mem = NULL) without rotary.
 */
fa_status fa_rotary_apply(fa_problem *p, void **mem);

#endif /* FA_SERVE_H */
