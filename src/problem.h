/*
 * problem.h — the one checked description of an attention problem.
 *
 * fa_resolve() (problem.c) is the one validator: fa_forward, fa_backward,
 * fa_workspace_bytes and fa_check all turn their arguments into an
 * fa_problem through it, so they accept exactly the same problems and
 * resolve the options (scale, mask band, window clamp, threads, blocks,
 * packing cap) the same way. Implementations (reference.c, standard.c,
 * flash.c, backward.c, validate.c) receive only resolved problems and never
 * re-validate.
 *
 * Indexing convention, used everywhere:
 *   Q: [B][Sq][H][d]     element (b, i, h, c)  at  q.data + b*st0 + i*st1 + h*st2 + c*st3
 *   K: [B][Sk][Hk][d]    V: [B][Sk][Hk][dv]    O: [B][Sq][H][dv]    LSE: [B][H][Sq]
 * Strides are in elements and may be anything (BSHD, BHSD, ...).
 *
 * Per-sequence geometry: sequence b (0 <= b < batch) has its own query rows
 * and keys, fa_problem_seq(). Q, O, LSE (and dO, dQ) rows of sequence b are
 * rows q_start .. q_start + q_len - 1 of tensor batch q_batch; K, V (and dK,
 * dV) rows are rows k_start .. k_start + k_len - 1 of tensor batch k_batch.
 * Every implementation indexes through it (pack.h's fa_rows_q/fa_rows_k, and
 * fa_lse_off), and the masks are aligned per sequence with its own q_len and
 * k_len. Uniform batches (p->seq == NULL) are sequence b = tensor batch b,
 * rows [0, Sq) and keys [0, Sk). Varlen fills p->seq with tensor batch 0 and
 * row offsets cu_seqlens[b]; the KV cache with k_batch = cache_batch_idx[b]
 * and k_start = cache_leftpad[b]. p->seqlen_q and p->seqlen_k are then the
 * largest q_len and k_len (what scratch is sized for).
 */
#ifndef FA_PROBLEM_H
#define FA_PROBLEM_H

#include "flashattn.h"

#include <stddef.h>
#include <stdint.h>

struct fa_kernels;
struct fa_arena;

/* Geometry of one sequence (batch entry). */
typedef struct fa_seq {
    int64_t q_batch;  /* tensor batch index of its Q/O/LSE (dO/dQ) rows */
    int64_t q_start;  /* first query row in that tensor batch */
    int64_t q_len;    /* query rows */
    int64_t k_batch;  /* tensor batch index of its K/V (dK/dV) rows */
    int64_t k_start;  /* first key row in that tensor batch */
    int64_t k_len;    /* keys */
    /* KV cache only (fa_kvcache): */
    const int32_t *k_pages; /* paged: key row r is row r % k_page_size of page k_pages[r / k_page_size]; else NULL */
    int64_t k_page_size;
    int64_t k_new_from;     /* keys j >= k_new_from are row j - k_new_from of k_new/v_new
                               (batch k_new_batch) when those are set (not yet appended) */
    int64_t k_new_batch;
} fa_seq;

typedef struct fa_problem {
    int64_t batch, seqlen_q, seqlen_k, heads, heads_k, d, dv;
    const fa_seq *seq;           /* [batch] or NULL: uniform (see fa_problem_seq); seqlen_q,
                                    seqlen_k are then the largest q_len, k_len */
    /* varlen (fa_varlen): the geometry is read from these arrays (fa_problem_seq);
     * q, k, v, o are then rank-4 views [1][total][heads][width], lse [1][heads][total_q] */
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* [batch + 1], or NULL */
    const int32_t *seqused_k;    /* [batch], or NULL */
    /* KV cache (fa_kvcache): k, v are the caches or pages; the geometry is read from these */
    const int32_t *cache_seqlens;   /* [batch], or NULL: no cache */
    const int32_t *cache_batch_idx, *cache_leftpad; /* [batch], or NULL */
    const int32_t *block_table;     /* [batch][max_pages], or NULL */
    int64_t max_pages, page_size;
    int64_t seqlen_new;             /* rows of k_new/v_new (0: none) */
    fa_tensor k_new, v_new;         /* k_new.data == NULL: nothing to read from them (appended, or none) */
    const char *k_new_name, *v_new_name; /* their names in messages (fa_kvcache), NULL: "k_new", "v_new" */
    fa_tensor q, k, v, o;        /* copies of the caller's descriptors (o may be empty) */
    fa_tensor lse;               /* lse.data == NULL when not requested */
    fa_impl impl;
    double scale;                /* resolved: 1/sqrt(d) when the caller gave 0 */
    int64_t window_left;         /* < 0: unbounded (clamped: never wider than Sq + Sk) */
    int64_t window_right;        /* < 0: unbounded; causal folded in as 0 */
    double softcap;              /* 0: off */
    int top_left;                /* 1: mask and ALiBi aligned top-left (fa_options::align) */
    fa_tensor alibi;             /* alibi.data == NULL when off; rank 1 [H] or rank 2 [B][H] */
    fa_tensor sinks;             /* sinks.data == NULL when off; rank 1 [H], finite (fa_options::sinks) */
    const uint8_t *keep;         /* dropout keep-mask [B][H][Sq][Sk] of 0/1 bytes, or NULL (fa_options::dropout) */
    int64_t keep_stride[4];      /* its strides in bytes (resolved: never all zero) */
    double keep_scale;           /* 1 / (1 - p) */
    /* rotary (fa_options::rotary; KV cache with k_new only): rot_dim == 0 when off */
    fa_tensor rot_cos, rot_sin;  /* [seqlen_ro][rot_dim / 2] */
    int64_t rot_dim;
    int rot_interleaved;
    int rot_q_per_row;           /* 1: query row i at cache_seqlens[b] + i (causal or windowed); 0: all at cache_seqlens[b] */
    int num_threads;             /* resolved: >= 1 */
    int block_q, block_k;        /* flash blocks, the forward's (backward.c caps its own) */
    int blocks_pinned_q, blocks_pinned_k; /* 1: the caller chose them (opt->block_q/k); FA_BLOCK_Q/K
                                               * replace the L2 rule's and do not pin */
    size_t pack_max_bytes;       /* cap on shared packed panels; 0: pack per tile */
    int tile_cut;                /* 1: cut masked tiles to the columns each row block sees (flash.c) */
    int strip_rows;              /* flash.c's strips of whole tiles: -1 from L1d, 0 none, N rows (FA_STRIP_ROWS, fa_strip_test) */
    int task_chunk;              /* flash.c's task order: 0 heads interleaved, N pieces of a head a grab (FA_TASK_CHUNK) */
    int tail_split;              /* flash.c: a pass's last tasks (one a thread) cut into this many pieces (FA_TAIL_SPLIT) */
    int bwd_one_pass;            /* backward.c: -1 its task rule decides, 0 two passes, 1 one pass */
    int amx;                     /* 1: FA_AMX=1, the flash forward may run bf16 products on AMX tiles (amx.h) */
    int decode_touch;            /* 1: the decoder goes through the cache in address order (decode.c, addr_plan) */
    size_t standard_max_bytes;   /* resolved cap */
    int num_splits;              /* split-KV of the decode path (decode.c): 0 heuristic, 1 none, n splits */
    void (*progress)(void *);    /* fa_options::progress: run by thread 0 between tasks (fa_progress) */
    void *progress_arg;          /* its argument */
    const struct fa_kernels *kern; /* the kernel table (the context's, or the dispatched one) */
    const fa_context *context;   /* the caller's context, or NULL */
    struct fa_arena *arena;      /* the context's scratch arena during a call, or NULL */
} fa_problem;

/*
 * Tests only: >= 0 overrides FA_TILE_CUT for the problems resolved after it
 * is set (1 cut masked tiles, 0 the whole-tile path; src/flash.c), so one
 * test process can compare both paths bit for bit. -1 (default): the
 * environment decides. Not part of the API; not thread-safe.
 */
extern int fa_tile_cut_test;

/*
 * Tests only: while fa_tile_cut_test >= 0, the forward (src/flash.c) counts
 * here the masked tiles it cut ([0]) and the row groups of those whose
 * leading columns it skipped ([1], a window's left edge), so a test can
 * assert that the cut path ran. Reset by the test; relaxed atomic adds.
 */
extern _Atomic long fa_tile_cut_stats[3];

/*
 * Tests only: >= 0 overrides FA_STRIP_ROWS for the problems resolved after
 * it is set: the rows per strip of the forward's whole tiles (src/flash.c,
 * strip_rows; rounded down to a multiple of the kernels' row block, and up
 * to one row block when smaller), 0 each tile in one piece. While it is >= 0
 * the forward counts in fa_tile_cut_stats[2] the whole tiles it ran in more
 * than one strip. -1 (default): the environment decides. Not thread-safe.
 */
extern int fa_strip_test;
/* Task order hook (tools/ab_chunk.c): -1 (default) reads FA_TASK_CHUNK; N >= 0 pins flash.c's
 * task_chunk, so one process can alternate the orders call by call. */
extern int fa_task_chunk_test;
/* flash.c's tail_split when FA_TAIL_SPLIT is not set: a pass's last tasks in 4 pieces each */
#define FA_TAIL_SPLIT_DEFAULT 4
/* Tail split hook (tools/ab_chunk.c --tail): -1 (default) reads FA_TAIL_SPLIT; N >= 0 pins
 * flash.c's tail_split (0 and 1: no cut). */
extern int fa_tail_split_test;

/*
 * Tests only: while fa_count_test > 0, the float32 forward (src/flash.c) adds
 * the query rows of every task it runs to fa_count_rows (a piece handed out
 * twice would write the same bits, invisible in the output), and the AMX
 * forward (src/kernels/amx.c) adds every key block it packs to
 * fa_count_packed, and the packing beside the tasks (src/flash.c,
 * pack_overlap) every unit it packs to fa_count_overlap_units. Reset by the
 * test; relaxed atomic adds.
 */
extern int fa_count_test;
extern _Atomic long fa_count_rows, fa_count_packed, fa_count_overlap_units;

/*
 * Tests only: >= 0 overrides FA_DECODE_TOUCH (and the AMD default) for the
 * problems resolved after it is set. While fa_count_test > 0 the decoder adds
 * each key block it computes in address order (decode.c, addr_plan: tasks of
 * several kv heads) to fa_count_addr_blocks; of those, each one it read first to
 * fa_count_touched, each one whose lines it asked for while computing the block
 * before to fa_count_asked; a block asked for only in part, or a plan that was
 * not the block's, to fa_count_ask_bad.
 */
extern int fa_decode_touch_test;
extern _Atomic long fa_count_addr_blocks, fa_count_touched, fa_count_asked, fa_count_ask_bad;

/*
 * Tests only: >= 0 overrides FA_AMX (1 on, 0 off) for the problems resolved
 * after it is set; -1 (default): the environment decides. Not thread-safe.
 */
extern int fa_amx_test;

/*
 * Tests only: >= 0 overrides FA_BWD_ONE_PASS (0 the flash backward's two
 * passes, 1 its single pass for any task count; src/backward.c); -1: the
 * environment, or when unset the task rule, decides. Not thread-safe.
 */
extern int fa_bwd_one_pass_test;

/* Geometry of sequence b. */
static inline fa_seq fa_problem_seq(const fa_problem *p, int64_t b)
{
    if (p->seq) return p->seq[b];
    if (p->cu_seqlens_q) { /* varlen: tensor batch 0, rows from the prefix sums */
        const int64_t k0 = p->cu_seqlens_k[b];
        fa_seq s = {0, p->cu_seqlens_q[b], (int64_t)p->cu_seqlens_q[b + 1] - p->cu_seqlens_q[b],
                    0, k0, p->seqused_k ? (int64_t)p->seqused_k[b] : p->cu_seqlens_k[b + 1] - k0, NULL, 0, 0, 0};
        return s;
    }
    if (p->cache_seqlens) { /* KV cache: the cache rows, then the new keys */
        const int64_t pad = p->cache_leftpad ? p->cache_leftpad[b] : 0;
        const int64_t cached = p->cache_seqlens[b] - pad;
        fa_seq s = {b, 0, p->seqlen_q, p->cache_batch_idx ? p->cache_batch_idx[b] : (p->block_table ? 0 : b),
                    pad, cached + p->seqlen_new, p->block_table ? p->block_table + b * p->max_pages : NULL,
                    p->page_size, cached, b};
        return s;
    }
    fa_seq s = {b, 0, p->seqlen_q, b, 0, p->seqlen_k, NULL, 0, 0, 0};
    return s;
}

/*
 * Whether the sequences average at least `rows` query rows and `keys` keys.
 * The flash drivers share packed panels across a (sequence, kv head) only then:
 * sharing costs barriers per sequence, which many short varlen sequences
 * cannot repay (they pack per tile instead: the same bits). Not varlen: 1.
 */
static inline int fa_problem_long_enough(const fa_problem *p, int64_t rows, int64_t keys)
{
    if (!p->cu_seqlens_q) return 1; /* uniform, and KV caches (GQA heads reuse the shared panels) */
    int64_t sum_q = 0, sum_k = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq seq = fa_problem_seq(p, b);
        sum_q += seq.q_len;
        sum_k += seq.k_len;
    }
    return sum_q >= p->batch * rows && sum_k >= p->batch * keys;
}

/* What the request is for: decides which tensors are required. */
typedef enum fa_purpose {
    FA_PURPOSE_FORWARD = 0,  /* o required (unless workspace query) */
    FA_PURPOSE_WORKSPACE,    /* q, k, v and options only */
    FA_PURPOSE_BACKWARD,     /* o and lse optional (recomputed) */
    FA_PURPOSE_CHECK         /* o is the tested output; impl/threads/blocks ignored */
} fa_purpose;

/* Names used in messages (NULL fields: "q", "k", "v", "o", "lse"). */
typedef struct fa_names {
    const char *q, *k, *v, *o, *lse;
} fa_names;

/*
 * The one validator: check q, k, v (and o, lse when given) and the options,
 * and fill *p. `opt` may be NULL (defaults) and may be a smaller, older
 * fa_options (its struct_size says how much of it to read).
 */
fa_status fa_resolve(fa_purpose purpose, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                     const fa_tensor *o, const fa_tensor *lse, const fa_options *opt,
                     const fa_names *names, fa_problem *p);

/* The flash blocks for head dims d, dv (the one place they are decided): the
 * L2 rule for kernel table `kern`, then FA_BLOCK_Q/K, then opt->block_q/k;
 * *pinned_q/k say whether opt->block_q/k chose them (FA_BLOCK_Q/K do not pin). opt: a resolved (current
 * layout) fa_options. */
fa_status fa_resolve_blocks(int64_t d, int64_t dv, const fa_options *opt, const struct fa_kernels *kern,
                            int *br, int *bc, int *pinned_q, int *pinned_k);

/* Copy a caller's fa_options of any (older or newer) size into the current
 * layout: fields the caller's struct lacks keep their defaults. */
fa_status fa_options_read(const fa_options *in, fa_options *out);

/* Largest struct_size a versioned struct may claim: a bound far above any
 * layout, so a garbage size (e.g. the `double scale` that began a 0.2
 * fa_options) is refused before any byte past the library's struct is read. */
#define FA_STRUCT_SIZE_MAX ((size_t)1 << 16)

/* Refuse a versioned struct whose first member, struct_size, is neither one of
 * the `known` published sizes nor a newer caller's larger size whose bytes past
 * `lib_size` are all zero. `what` names the struct, `init_fn` its initializer. */
fa_status fa_struct_size_check(const void *in, size_t lib_size, const size_t *known, int n_known,
                               const char *what, const char *init_fn);

/* A rank-4 tensor check shared by the entry points: dtype, rank, exact shape
 * (when `shape` is not NULL), strides, data pointer, largest reachable offset. */
fa_status fa_check_tensor4(const fa_tensor *t, const char *name, const int64_t *shape,
                           const char *shape_desc);

/* Geometry-aware shape check of an extra per-row tensor of the call (dout,
 * dq, dk, dv): rows like q (kside = 0) or like k (kside = 1), `width`
 * elements per row; rank 4 [B][S][H][width], or rank 3 [total][H][width] for
 * varlen. *view receives the rank-4 view the implementations index. */
fa_status fa_check_rows_tensor(const fa_problem *p, const fa_tensor *t, const char *name, int kside,
                               int64_t width, const char *desc, fa_tensor *view);

/* Write `value` into every row of the rank-4 view t (rows like q, or like k
 * with kside = 1) that no sequence owns, and, for lse (a [B][H][S] view, with
 * t = NULL), the LSE of query rows no sequence owns. No-op for uniform
 * batches, where every row is owned. */
fa_status fa_fill_unowned_rows(const fa_problem *p, const fa_tensor *t, int kside, double value);
fa_status fa_fill_unowned_lse(const fa_problem *p, const fa_tensor *lse, double value);

/* KV cache: write k_new/v_new into the caches at cache_seqlens[b] (in place,
 * through the same row accessor as the reads, so pages are honoured), then
 * clear p->k_new/v_new so that the new keys are read from the cache. With
 * undo, the rows it overwrites are kept first in *undo (NULL when nothing is
 * appended; FA_ERR_NOMEM, nothing written, when they cannot be), for
 * fa_kvcache_restore. */
fa_status fa_kvcache_append(fa_problem *p, void **undo);

/* Put back the cache rows that fa_kvcache_append kept in undo (the call failed
 * after the append: a failed call leaves the caches as they were), then free
 * undo. NULL: nothing to do. */
void fa_kvcache_restore(const fa_problem *p, void *undo);

/* Refuse an output that overlaps another tensor the call reads or writes,
 * or that has a zero stride on a dimension longer than 1 (FA_ERR_STRIDE). */
fa_status fa_check_output(const fa_tensor *out, const char *name, const fa_tensor *const *others,
                          const char *const *other_names, int n_others);

#endif /* FA_PROBLEM_H */
