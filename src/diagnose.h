/*
 * diagnose.h — internals of fa_diagnose() (diagnose.c): the candidate
 * mistakes, as perturbations of the float64 reference for one query row.
 *
 * A variant says how a kernel with one known mistake computes a row: which
 * scale, softcap order, diagonal, window, kv head, tile bookkeeping, empty-row
 * result, LSE convention and memory layout it uses. The correct reference is
 * the variant with every field at its resolved value (dg_variant_reference).
 */
#ifndef FA_DIAGNOSE_H
#define FA_DIAGNOSE_H

#include <stdint.h>

#include "problem.h"

typedef enum dg_cap_mode {
    DG_CAP_RIGHT = 0,    /* scale, then cap (the contract) */
    DG_CAP_BEFORE_SCALE, /* s = scale * cap(q.k): the cap applied to the raw dot */
    DG_CAP_AFTER_MASK    /* masked keys kept at cap(-inf) = -softcap */
} dg_cap_mode;

typedef enum dg_empty_mode {
    DG_EMPTY_ZERO = 0,   /* O = 0, LSE = -inf (the contract) */
    DG_EMPTY_NAN,        /* no l == 0 guard: 0/0 */
    DG_EMPTY_MEAN_V,     /* a finite -inf sentinel: uniform weights over every key */
    DG_EMPTY_NAN_O       /* O = 0/0 (no l == 0 guard) while the LSE is guarded (-inf) */
} dg_empty_mode;

typedef enum dg_lse_mode {
    DG_LSE_RIGHT = 0,
    DG_LSE_LOG2,         /* log2 of the sum: LSE / ln 2 */
    DG_LSE_LN2_TWICE,    /* a natural-log LSE multiplied by ln 2 again */
    DG_LSE_UNSCALED      /* logsumexp of the unscaled dot products q.k (O right) */
} dg_lse_mode;

typedef enum dg_layout_mode {
    DG_LAYOUT_RIGHT = 0,
    DG_LAYOUT_OUT_BHSD,  /* O written [B][H][Sq][dv] into the [B][Sq][H][dv] buffer */
    DG_LAYOUT_ALL_BHSD   /* Q, K, V read and O written as BHSD over BSHD buffers */
} dg_layout_mode;

/* How the kernel finds the keys of a sequence (varlen, KV cache, paged). */
typedef enum dg_keys_mode {
    DG_KEYS_RIGHT = 0,
    DG_KEYS_MAXLEN,      /* varlen: max_seqlen_k keys from its start (into the next sequence) */
    DG_KEYS_TO_END,      /* varlen: every key from its start to the end of the packed tensor */
    DG_KEYS_IGNORE_USED, /* varlen: cu_seqlens_k's span, seqused_k ignored (padding read) */
    DG_KEYS_FROM_START,  /* varlen: every key from packed row 0 to its end (the sequences before) */
    DG_KEYS_GLOBAL       /* varlen: cu_seqlens ignored: one sequence of total_q queries, total_k keys */
} dg_keys_mode;

typedef enum dg_page_mode {
    DG_PAGE_RIGHT = 0,
    DG_PAGE_ENTRY,       /* block_table[b][r / page_size + delta] */
    DG_PAGE_TABLE_ROW,   /* block_table[b + delta][r / page_size] */
    DG_PAGE_PHYS,        /* block_table[b][r / page_size] + delta */
    DG_PAGE_IDENTITY     /* the block table ignored: page b * max_pages + r / page_size */
} dg_page_mode;

/* How a split-KV kernel combines its splits' partial (O, LSE). */
typedef enum dg_split_mode {
    DG_SPLIT_RIGHT = 0,
    DG_SPLIT_MEAN,       /* O = the mean of the non-empty splits' partial O (no LSE weights) */
    DG_SPLIT_OWN_MAX,    /* weights l_s = sum of exp(s - m_s) with each split's own max m_s (no rescale) */
    DG_SPLIT_LAST,       /* only the last non-empty split's partial (O, LSE) */
    DG_SPLIT_LSE_MAX     /* O right, LSE = max over the splits' LSEs */
} dg_split_mode;

/* Where a kernel with attention sinks left the sink out (the sink joins the denominator only). */
typedef enum dg_sink_mode {
    DG_SINK_RIGHT = 0,
    DG_SINK_OUT,         /* left out of O's denominator and of the LSE */
    DG_SINK_OUT_O,       /* left out of O's denominator, the LSE right */
    DG_SINK_OUT_LSE      /* O right, the LSE without the sink */
} dg_sink_mode;

/* How a kernel with dropout applied the keep-mask Z to P before P.V. */
typedef enum dg_drop_mode {
    DG_DROP_RIGHT = 0,   /* P_ij Z_ij / (1 - p) */
    DG_DROP_NONE,        /* the mask not applied */
    DG_DROP_NO_SCALE,    /* P_ij Z_ij: the 1 / (1 - p) left out */
    DG_DROP_TRANSPOSED,  /* Z read as [seqlen_k][seqlen_q]: element (i, j) at flat j * seqlen_q + i */
    DG_DROP_KEY_SHIFT,   /* Z_i,j+drop_shift (outside the mask: dropped) */
    DG_DROP_ROW_SHIFT    /* Z_i+drop_shift,j (outside the mask: dropped) */
} dg_drop_mode;

typedef struct dg_variant {
    double scale;        /* applied to q.k */
    double softcap;      /* 0: off */
    dg_cap_mode cap_mode;
    int align;           /* -1: the problem's; 0: bottom-right (by the kernel's key count); 1: top-left */
    int64_t wl, wr;      /* window (< 0 unbounded), causal folded in */
    int64_t kvh;         /* kv head; -1: the problem's map h / (H / Hk) */
    int tile;            /* > 0: online softmax in tiles of this many keys with no rescale */
    int pad_tile;        /* > 0: keys padded to a multiple of this with zero K and V (tail tile) */
    dg_empty_mode empty;
    dg_lse_mode lse;
    dg_layout_mode layout;
    /* serving geometry (all 0: the problem's) */
    dg_keys_mode keys;
    int64_t k_shift;     /* keys read from row start + k_shift (varlen: cu_seqlens_k off by k_shift) */
    int k_clip;          /* keys shifted past the end of the packed K/V: 0: left out, the causal
                          * alignment still over the full count; 1: the sequence ends there (the
                          * count shrinks and the alignment follows) */
    int64_t q_shift;     /* query row i read from row i + q_shift of the packed Q */
    int64_t len_delta;   /* KV cache: attention over k_len + len_delta keys */
    int no_new;          /* KV cache: attention over the cached keys only (the new ones left out) */
    int64_t new_at;      /* KV cache: new keys placed new_at slots after cache_seqlens[b] */
    dg_page_mode page;
    int64_t page_delta;
    /* low precision: P~ = psat_c * exp(s - running max) clamped at psat_max in P.V, the row sum of the
     * unclamped P~, online over blocks of psat_block keys (last to first with psat_reverse); 0: off */
    double psat_c, psat_max;
    int psat_block, psat_reverse;
    /* split-KV: keys in split_n chunks of ceil(len / split_n), combined the split_mode way */
    dg_split_mode split_mode;
    int split_n;
    dg_sink_mode sink;   /* attention sinks: where the sink is left out */
    dg_drop_mode drop;   /* dropout: how the keep-mask is applied */
    int64_t drop_shift;
} dg_variant;

/* The variant that is the reference for problem p. */
dg_variant dg_variant_reference(const fa_problem *p);

#endif /* FA_DIAGNOSE_H */
