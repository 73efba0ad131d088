/*
 * pack.h — the one KV-source accessor and the one packer: float32 panels
 * from a source of rows.
 *
 * A row source (fa_rows) names rows j = 0, 1, ... of one (sequence, head):
 * K or V rows for the forward and backward passes, Q, O or dO rows for the
 * backward and the checker. Every implementation reads K, V, Q and dO through
 * it (reference.c and validate.c as float64 through fa_rows_gather_f64), and
 * writes O, dQ, dK, dV at fa_rows_off. Row j lives at one element offset of
 * the tensor, fa_rows_off(), with elements stride[3] apart: today row
 * row0 + j of tensor batch `batch` of a dense strided [B][S][H][width]
 * tensor; a paged KV cache becomes one more case of fa_rows_off (and a
 * quantized source one more case of the gathers), and flash.c, backward.c,
 * standard.c, reference.c and validate.c pick it up unchanged.
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
} fa_rows;

/* Rows row0, row0 + 1, ... of (tensor batch `batch`, `head`) of t. */
static inline fa_rows fa_rows_at(const fa_tensor *t, int64_t batch, int64_t row0, int64_t head)
{
    fa_rows r = {t, batch, row0, head, t->shape[3]};
    return r;
}

/* Query-side rows (Q, O, dO, dQ) of sequence s, head h: row i is query i. */
static inline fa_rows fa_rows_q(const fa_tensor *t, const fa_seq *s, int64_t h)
{
    return fa_rows_at(t, s->q_batch, s->q_start, h);
}

/* Key-side rows (K, V, dK, dV) of sequence s, kv head hk: row j is key j. */
static inline fa_rows fa_rows_k(const fa_tensor *t, const fa_seq *s, int64_t hk)
{
    return fa_rows_at(t, s->k_batch, s->k_start, hk);
}

/* Element offset of element 0 of row j (elements follow t->stride[3] apart). */
static inline int64_t fa_rows_off(const fa_rows *s, int64_t j)
{
    return fa_off4(s->t, s->batch, s->row0 + j, s->head, 0);
}

/* Row j as a contiguous float32 pointer when the source stores it so, else NULL. */
static inline const float *fa_rows_f32(const fa_rows *s, int64_t j)
{
    if (s->t->dtype != FA_F32 || s->t->stride[3] != 1) return NULL;
    return (const float *)s->t->data + fa_rows_off(s, j);
}

/* Distance in elements between rows j and j + 1 when it is the same for all
 * rows (dense sources: stride[1]), else -1. */
static inline int64_t fa_rows_ld(const fa_rows *s)
{
    return s->t->stride[1];
}

/* Row j converted to float32 into dst[width]. */
static inline void fa_rows_gather(const fa_rows *s, int64_t j, float *dst)
{
    fa_gather_f32(s->t, fa_rows_off(s, j), s->t->stride[3], s->width, dst);
}

/* Row j converted to float64 into dst[width] (exact for every dtype). */
static inline void fa_rows_gather_f64(const fa_rows *s, int64_t j, double *dst)
{
    const int64_t off = fa_rows_off(s, j), inc = s->t->stride[3];
    for (int64_t c = 0; c < s->width; c++) dst[c] = fa_load_f64(s->t, off + c * inc);
}

/* Element c of row j, as float64. */
static inline double fa_rows_get(const fa_rows *s, int64_t j, int64_t c)
{
    return fa_load_f64(s->t, fa_rows_off(s, j) + c * s->t->stride[3]);
}

/* Store x (rounded to the dtype) as element c of row j (outputs). */
static inline void fa_rows_put(const fa_rows *s, int64_t j, int64_t c, double x)
{
    fa_store_f64(s->t, fa_rows_off(s, j) + c * s->t->stride[3], x);
}

/* Ask the cache for rows j0 .. j0 + n - 1 (a hint; contiguous rows only). */
static inline void fa_rows_prefetch(const fa_rows *s, int64_t j0, int64_t n)
{
    if (s->t->stride[3] != 1) return;
    const size_t esz = fa_dtype_size(s->t->dtype), bytes = (size_t)s->width * esz;
    for (int64_t j = j0; j < j0 + n; j++) {
        const char *row = (const char *)s->t->data + fa_rows_off(s, j) * (int64_t)esz;
        for (size_t off = 0; off < bytes; off += 64) __builtin_prefetch(row + off, 0, 2);
    }
}

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

#endif /* FA_PACK_H */
