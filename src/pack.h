/*
 * pack.h — the one packer: float32 panels from a source of rows.
 *
 * A row source (fa_rows) names rows j = 0, 1, ... of one (batch, head) of a
 * rank-4 tensor [B][S][H][width]: K or V rows for the forward and backward
 * passes, Q or dO rows for the backward. Today it reads a dense strided
 * tensor of any dtype; a paged KV cache or a quantized source becomes one
 * more case of fa_rows_gather / fa_rows_f32, and flash.c, backward.c and
 * standard.c pick it up unchanged.
 */
#ifndef FA_PACK_H
#define FA_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/kernels.h"
#include "tensor.h"

typedef struct fa_rows {
    const fa_tensor *t;   /* [B][S][H][width], any strides and dtype */
    int64_t b, head;      /* which (batch, head) */
    int64_t width;        /* elements per row (t->shape[3]) */
} fa_rows;

static inline fa_rows fa_rows_of(const fa_tensor *t, int64_t b, int64_t head)
{
    fa_rows r = {t, b, head, t->shape[3]};
    return r;
}

/* Row j as a contiguous float32 pointer when the source stores it so, else NULL. */
static inline const float *fa_rows_f32(const fa_rows *s, int64_t j)
{
    if (s->t->dtype != FA_F32 || s->t->stride[3] != 1) return NULL;
    return (const float *)s->t->data + fa_off4(s->t, s->b, j, s->head, 0);
}

/* Row j converted to float32 into dst[width]. */
static inline void fa_rows_gather(const fa_rows *s, int64_t j, float *dst)
{
    fa_gather_f32(s->t, fa_off4(s->t, s->b, j, s->head, 0), s->t->stride[3], s->width, dst);
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
