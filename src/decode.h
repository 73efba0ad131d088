/*
 * decode.h — the flash forward pass for few query rows (decoding): GQA
 * packing and split-KV (decode.c). flash.c hands a problem over when
 * fa_decode_applies() says so.
 */
#ifndef FA_DECODE_H
#define FA_DECODE_H

#include <stddef.h>

#include "problem.h"

/* Query rows per sequence up to which the decode path runs (seqlen_q <= this). */
#define FA_DECODE_MAX_Q 16

/* Most key splits one (sequence, kv head) is cut into (num_splits is clamped to it). */
#define FA_DECODE_MAX_SPLITS 128

/* The heuristic (num_splits 0) splits until there are this many tasks: a
 * constant, not the thread count, so that its bits do not depend on the
 * threads. 16 keeps a 16-core machine busy and costs a 2-core one little
 * (a split's partial row is d_v floats; the merge is O(splits x d_v)). */
#define FA_DECODE_SPLIT_TASKS 16

/* Whether fa_flash_forward hands problem p to the decode path. */
int fa_decode_applies(const fa_problem *p);

/* The key splits the decode path uses for p: num_splits (clamped to the key
 * blocks of the longest sequence and FA_DECODE_MAX_SPLITS), or for 0 the
 * heuristic: 1 when heads_k x row chunks reach FA_DECODE_SPLIT_TASKS, else
 * enough splits to make that many tasks per sequence (never the thread count
 * or the batch, so the bits are the same for any of them). */
int fa_decode_splits(const fa_problem *p);

/* The decode forward pass (O, and LSE when requested) and its scratch bytes. */
fa_status fa_decode_forward(const fa_problem *p);
size_t fa_decode_workspace(const fa_problem *p);

#endif /* FA_DECODE_H */
