/*
 * flashattn_mpi.h — ring attention over MPI (issue 16): one sequence split
 * across the ranks of a communicator, merged exactly by the online-softmax rule.
 *
 * Built only when `mpicc` is found (mk/mpi.mk); the core library stays MPI-free
 * and this part calls only its public API (fa_forward, fa_backward per block).
 *
 * Every rank holds its shard of Q, K, V (and dO, O, LSE in backward): the
 * tensors passed here are the LOCAL shards, in the library's layout
 * (Q [batch][c_q][heads][d], K [batch][c_k][heads_k][d], V [batch][c_k][heads_k][d_v],
 * LSE [batch][heads][c_q]), with the same c_q and c_k on every rank; the global
 * lengths are P * c_q and P * c_k. Which global rows a rank holds is the layout:
 *
 *   FA_RING_CONTIGUOUS  rank r holds rows [r c, (r + 1) c)
 *   FA_RING_ZIGZAG      the sequence cut into 2P chunks of c/2 rows; rank r holds
 *                       chunks r and 2P-1-r, in that order (balances causal work)
 *   FA_RING_AUTO        zigzag when the options mask (causal or a window), else contiguous
 * (with one rank every layout is contiguous: the same rows, any length)
 *
 * fa_ring_global_row() maps a local row to its global position.
 *
 * The ring: K/V shards travel rank r -> r+1 (MPI_Isend/MPI_Irecv into a second
 * buffer, as 1 MiB messages; FA_RING_CHUNK=bytes overrides) while the rank
 * computes on the one it holds, with bursts of MPI_Testall between library calls
 * and inside them (fa_options::progress, run by the call's thread 0 between its
 * tasks); while a transfer is in flight a Q chunk is cut into pieces of whole
 * flash row blocks, at most 16 (FA_RING_PIECES=0: not); each (Q piece, K chunk) block
 * is one fa_forward call with the band
 * shifted to the chunks' global offsets (top-left alignment, rows or keys that
 * see nothing sliced off), and the partial (O, LSE) merge in float64:
 *   LSE = max + log1p(exp(min - max)),  O = exp(LSE_a - LSE) O_a + exp(LSE_b - LSE) O_b.
 * Backward: each block is one fa_backward call with the GLOBAL O and LSE rows;
 * dQ accumulates locally, and the dK/dV accumulators (float64) follow their
 * K/V block one step behind around the ring, back to their owner.
 *
 * Threads: MPI must be initialized with at least MPI_THREAD_FUNNELED and these
 * functions called from the main thread (OpenMP runs inside fa_forward; MPI is
 * called by the main thread only: between blocks, and inside a block's call
 * through its progress hook, which the library runs on the calling thread). A
 * progress hook in the caller's options is still run (after the ring's own
 * tests). Collective: every rank of `comm` must call with
 * the same options; a problem found on any rank is returned on EVERY rank with
 * the same status and message (fa_ring_last_error), never a hang.
 *
 * Supported: causal, windows (both sides), top-left/bottom-right alignment,
 * GQA/MQA, softcap, scale, seqlen_q != seqlen_k, impl flash or reference
 * (and standard for the forward). Refused (FA_ERR_OPTION): ALiBi, varlen,
 * kvcache, sinks, rotary, dropout. Outputs: float32 or float64.
 */
#ifndef FLASHATTN_MPI_H
#define FLASHATTN_MPI_H

#include <mpi.h>
#include <stdint.h>

#include "flashattn.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fa_ring_layout {
    FA_RING_AUTO = 0,       /**< zigzag when the options mask, else contiguous */
    FA_RING_CONTIGUOUS = 1, /**< rank r holds rows [r c, (r+1) c) */
    FA_RING_ZIGZAG = 2      /**< rank r holds chunks r and 2P-1-r of 2P */
} fa_ring_layout;

/** What one call did on this rank (filled when the pointer is not NULL). */
typedef struct fa_ring_stats {
    int ranks;                 /**< P */
    int steps;                 /**< ring steps (P) */
    fa_ring_layout layout;     /**< layout used (AUTO resolved) */
    uint64_t bytes_sent;       /**< bytes this rank sent in all */
    uint64_t bytes_recv;       /**< bytes this rank received in all */
    uint64_t step_bytes;       /**< bytes sent in one K/V step (the same every step) */
    int64_t blocks_computed;   /**< library calls: (Q piece, K chunk) blocks with a visible key */
    int64_t blocks_skipped;    /**< (Q piece, K chunk) blocks the mask hides entirely */
    double visible_pairs;      /**< (query, key) pairs visible in the computed blocks (work measure) */
    double compute_s;          /**< seconds in fa_forward / fa_backward and the merge */
    double wait_s;             /**< seconds blocked in MPI_Wait* after the compute of a step */
    double total_s;            /**< seconds in the call */
} fa_ring_stats;

/** "contiguous", "zigzag", "auto". */
const char *fa_ring_layout_name(fa_ring_layout layout);

/** Parse "contiguous" / "zigzag" / "auto"; FA_ERR_OPTION otherwise. */
fa_status fa_ring_layout_from_name(const char *name, fa_ring_layout *layout);

/** AUTO resolved for these options (NULL: defaults): zigzag when causal or a window is set. */
fa_ring_layout fa_ring_resolve_layout(fa_ring_layout layout, const fa_options *opt);

/**
 * FA_OK when a global length `seqlen` splits over `nranks` in `layout`
 * (a multiple of P, of 2P for zigzag); else FA_ERR_SHAPE with a message.
 */
fa_status fa_ring_check_split(int64_t seqlen, int nranks, fa_ring_layout layout);

/**
 * Global position of local row `local_row` of rank `rank` (0 <= local_row < seqlen / nranks);
 * -1 for arguments out of range or a length that does not split.
 */
int64_t fa_ring_global_row(int64_t seqlen, int nranks, int rank, fa_ring_layout layout, int64_t local_row);

/**
 * Ring forward. q, k, v, o, lse are this rank's shards (see above); lse may be
 * NULL. o: float32 or float64; lse: float32 or float64. Collective over comm.
 */
fa_status fa_ring_forward(MPI_Comm comm, fa_ring_layout layout, const fa_tensor *q, const fa_tensor *k,
                          const fa_tensor *v, fa_tensor *o, fa_tensor *lse, const fa_options *opt,
                          fa_ring_stats *stats);

/**
 * Ring backward. o and lse are the forward's shards (both NULL: recomputed
 * by fa_ring_forward: float32, float64 for the reference); dout the shard of dO; dq, dk, dv (float32 or
 * float64) receive this rank's shards of the gradients. Collective over comm.
 */
fa_status fa_ring_backward(MPI_Comm comm, fa_ring_layout layout, const fa_tensor *q, const fa_tensor *k,
                           const fa_tensor *v, const fa_tensor *o, const fa_tensor *lse, const fa_tensor *dout,
                           fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, const fa_options *opt,
                           fa_ring_stats *stats);

/** Message of the last failed fa_ring_* call on this thread (the same on every rank); "" after a success. */
const char *fa_ring_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_MPI_H */
