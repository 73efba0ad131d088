/*
 * pack.h — the one KV-source accessor and the one packer: float32 panels
 * from a source of rows.
 *
 * A row source (fa_rows) names rows j = 0, 1, ... of one (sequence, head):
 * K or V rows for the forward and backward passes, Q, O or dO rows for the
 * backward and the checker. Every implementation reads K, V, Q and dO through
 * it (reference.c and validate.c as float64 through fa_rows_gather_f64), and
 * writes O, dQ, dK, dV at fa_rows_off. Row j lives in one tensor at one
 * element offset, fa_rows_src(), its elements stride[3] apart. The cases, all
 * decided there and nowhere else:
 *   dense     row row0 + j of tensor batch `batch` of a strided [B][S][H][width] tensor;
 *   paged     row r = row0 + j at row r % page_size of page pages[r / page_size]
 *             of a [num_pages][page_size][H][width] tensor (a paged KV cache);
 *   new keys  rows j >= tail_from from row j - tail_from of batch tail_batch of
 *             `tail` (a KV cache's k_new/v_new, read where they are not yet appended).
 * (A quantized source would be one more case of the gathers.) flash.c,
 * backward.c, standard.c, reference.c and validate.c never see which.
 */
#ifndef FA_PACK_H
#define FA_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "problem.h"
#include "tensor.h"

typedef struct fa_rows {
    const fa_tensor *t;   /* [B][S][H][width], any strides and dtype */
    int64_t batch;        /* tensor batch index */
    int64_t row0;         /* row j is row row0 + j of that batch */
    int64_t head;         /* head index */
    int64_t width;        /* elements per row (t->shape[3]) */
    const int32_t *pages; /* paged: NULL, or the page of each page_size rows */
    int64_t page_size;
    const fa_tensor *tail; /* NULL, or the source of rows j >= tail_from */
    int64_t tail_batch, tail_from;
} fa_rows;

/* Rows row0, row0 + 1, ... of (tensor batch `batch`, `head`) of t. */
static inline fa_rows fa_rows_at(const fa_tensor *t, int64_t batch, int64_t row0, int64_t head)
{
    fa_rows r = {t, batch, row0, head, t->shape[3], NULL, 0, NULL, 0, 0};
    return r;
}

/* Query-side rows (Q, O, dO, dQ) of sequence s, head h: row i is query i. */
static inline fa_rows fa_rows_q(const fa_tensor *t, const fa_seq *s, int64_t h)
{
    return fa_rows_at(t, s->q_batch, s->q_start, h);
}

/* Key-side rows of a dense tensor (dK, dV) of sequence s, kv head hk: row j is key j. */
static inline fa_rows fa_rows_k(const fa_tensor *t, const fa_seq *s, int64_t hk)
{
    return fa_rows_at(t, s->k_batch, s->k_start, hk);
}

/* The keys (vside = 0) or values (vside = 1) of sequence s, kv head hk, as the
 * problem stores them: dense, paged, and/or with new keys not yet appended. */
static inline fa_rows fa_rows_kv(const fa_problem *p, const fa_seq *s, int64_t hk, int vside)
{
    fa_rows r = fa_rows_at(vside ? &p->v : &p->k, s->k_batch, s->k_start, hk);
    r.pages = s->k_pages;
    r.page_size = s->k_page_size;
    const fa_tensor *nw = vside ? &p->v_new : &p->k_new;
    if (nw->data) {
        r.tail = nw;
        r.tail_batch = s->k_new_batch;
        r.tail_from = s->k_new_from;
    }
    return r;
}

/* The tensor holding row j and the element offset of its element 0 there. */
static inline const fa_tensor *fa_rows_src(const fa_rows *s, int64_t j, int64_t *off)
{
    if (s->tail && j >= s->tail_from) {
        *off = fa_off4(s->tail, s->tail_batch, j - s->tail_from, s->head, 0);
        return s->tail;
    }
    const int64_t r = s->row0 + j;
    if (s->pages) {
        *off = fa_off4(s->t, s->pages[r / s->page_size], r % s->page_size, s->head, 0);
        return s->t;
    }
    *off = fa_off4(s->t, s->batch, r, s->head, 0);
    return s->t;
}

/* Element offset of element 0 of row j of a dense source (outputs: O, dQ, dK, dV). */
static inline int64_t fa_rows_off(const fa_rows *s, int64_t j)
{
    int64_t off;
    fa_rows_src(s, j, &off);
    return off;
}

/* Row j as a contiguous float32 pointer when the source stores it so, else NULL. */
static inline const float *fa_rows_f32(const fa_rows *s, int64_t j)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(s, j, &off);
    if (t->dtype != FA_F32 || t->stride[3] != 1) return NULL;
    return (const float *)t->data + off;
}

/* Distance in elements between rows j and j + 1 when it is the same for all
 * rows (dense sources: stride[1]), else -1. */
static inline int64_t fa_rows_ld(const fa_rows *s)
{
    return s->pages || s->tail ? -1 : s->t->stride[1];
}

/* Row j converted to float32 into dst[width]. */
static inline void fa_rows_gather(const fa_rows *s, int64_t j, float *dst)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(s, j, &off);
    fa_gather_f32(t, off, t->stride[3], s->width, dst);
}

/* Row j converted to float64 into dst[width] (exact for every dtype). */
static inline void fa_rows_gather_f64(const fa_rows *s, int64_t j, double *dst)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(s, j, &off);
    fa_gather_f64(t, off, t->stride[3], s->width, dst);
}

/* Element c of row j, as float64. */
static inline double fa_rows_get(const fa_rows *s, int64_t j, int64_t c)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(s, j, &off);
    return fa_load_f64(t, off + c * t->stride[3]);
}

/* Store x (rounded to the dtype) as element c of row j (outputs, and the KV
 * cache's append). */
static inline void fa_rows_put(const fa_rows *s, int64_t j, int64_t c, double x)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(s, j, &off);
    fa_store_f64(t, off + c * t->stride[3], x);
}

/* Ask the cache for rows j0 .. j0 + n - 1 (a hint; rows with contiguous elements only). */
static inline void fa_rows_prefetch_rw(const fa_rows *s, int64_t j0, int64_t n, int write)
{
    for (int64_t j = j0; j < j0 + n; j++) {
        int64_t off;
        const fa_tensor *t = fa_rows_src(s, j, &off);
        if (t->stride[3] != 1) return;
        const size_t esz = fa_dtype_size(t->dtype), bytes = (size_t)s->width * esz;
        const char *row = (const char *)t->data + off * (int64_t)esz;
        if (write) FA_PREFETCH_ROW(row, bytes, 1, 2);
        else FA_PREFETCH_ROW(row, bytes, 0, 2);
    }
}

static inline void fa_rows_prefetch(const fa_rows *s, int64_t j0, int64_t n) { fa_rows_prefetch_rw(s, j0, n, 0); }

/*
 * dst[r][c] = row (row0 + r), element c, for r < n, c < width (row-major
 * panel, leading dimension ld). With check_bad, returns 1 when a packed
 * element is Inf or NaN (the P V kernels then mask per row), else 0.
 */
int fa_pack_rows(const fa_rows *s, int64_t row0, int n, float *dst, size_t ld, int check_bad);

/*
 * dst[c][r] = row (row0 + r), element c, for r < n, c < width (the panel
 * transposed, leading dimension ld); columns n..round16(n)-1 are zeroed
 * (kernels may read them). Uses the kernel table's transpose when it has one.
 */
void fa_pack_transposed(const fa_kernels *kern, const fa_rows *s, int64_t row0, int n, float *dst,
                        size_t ld);

/*
 * Finish one row of the online softmax and store it: O row i of `os` (query
 * row i of head h of sequence b) = orow[0, dv) / l, and, when the problem asks
 * for it, LSE = m + ln l (mask.h's fa_sink_finish when the head has a sink,
 * which joins the denominator only). `empty` — the row sees no key — is
 * decided by the caller from the row's key range, never from m: an empty row
 * stores O = 0 and LSE = -inf. A row that sees keys but whose running max
 * stayed -inf is reported like an empty row when its visible logits were -inf
 * for real (l = 0 and fa_row_minus_inf_is_real), as the reference does;
 * otherwise — a NaN score (l NaN, kernels.h), or a finite key whose float32
 * score overflowed to -inf, which float32 cannot compute — it stores NaN.
 * flash.c and decode.c finish their rows here, so both write the same bits
 * from the same (m, l, O).
 */
void fa_finish_row(const fa_problem *p, const fa_rows *os, const fa_seq *seq, int64_t h, int64_t i, int empty,
                   float m, float l, const float *orow);

/* For query row i of (sequence seq, head h), whose visible float32 scores all
 * came out -inf: whether they are -inf for real — its q row holds an infinity
 * (or NaN), or every key row it sees does — rather than float32 overflow of a
 * finite q . k. Only such rows ask; the scan stops at the first finite key
 * (or q's first non-finite element). */
int fa_row_minus_inf_is_real(const fa_problem *p, const fa_seq *seq, int64_t h, int64_t i);

#endif /* FA_PACK_H */
