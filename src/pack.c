/*
 * pack.c — packing rows and transposed panels (see pack.h).
 */
#include "pack.h"

#include <math.h>

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

int fa_pack_rows(const fa_rows *s, int64_t row0, int n, float *dst, size_t ld, int check_bad)
{
    float bad = 0.0f; /* 0 * x stays 0 for finite x; becomes NaN for Inf or NaN */
    for (int r = 0; r < n; r++) {
        float *row = dst + (size_t)r * ld;
        fa_rows_gather(s, row0 + r, row);
        if (check_bad)
            for (int64_t c = 0; c < s->width; c++) bad += 0.0f * row[c];
    }
    return check_bad && isnan(bad);
}

void fa_pack_transposed(const fa_kernels *kern, const fa_rows *s, int64_t row0, int n, float *dst,
                        size_t ld)
{
    const int64_t width = s->width;
    const float *first = n > 0 ? fa_rows_f32(s, row0) : NULL;
    const int64_t ld_src = fa_rows_ld(s);
    if (first && kern && kern->transpose && ld_src >= 0) {
        kern->transpose(n, (int)width, first, (size_t)ld_src, dst, ld);
    } else if (first) {
        /*
         * Transpose 16 rows at a time: each c then fills one whole 64-byte line
         * of dst. Writing one column at a time instead strides by ld floats and
         * thrashes a handful of L1 sets; this order is ~10x faster.
         */
        for (int jb = 0; jb < n; jb += 16) {
            const int nj = n - jb < 16 ? n - jb : 16;
            const float *row[16];
            for (int jj = 0; jj < nj; jj++) row[jj] = fa_rows_f32(s, row0 + jb + jj);
            for (int64_t c = 0; c < width; c++) {
                float *d = dst + (size_t)c * ld + (size_t)jb;
                for (int jj = 0; jj < nj; jj++) d[jj] = row[jj][c];
            }
        }
    } else if (n > 0) {
        /*
         * Any other source (float16/bfloat16, strided, paged, new keys): 16
         * rows x 64 columns at a time are gathered into a float32 block (the
         * kernel table's SIMD widen for contiguous halves, fa_gather_f32),
         * then transposed like a float32 tile, so dst is still written in
         * whole lines and the dtype is decided once per row, not per element.
         */
        enum { JB = 16, CB = 64 };
        float blk[JB * CB] __attribute__((aligned(64)));
        for (int jb = 0; jb < n; jb += JB) {
            const int nj = n - jb < JB ? n - jb : JB;
            const fa_tensor *t[JB];
            int64_t off[JB];
            for (int jj = 0; jj < nj; jj++) t[jj] = fa_rows_src(s, row0 + jb + jj, &off[jj]);
            for (int64_t c0 = 0; c0 < width; c0 += CB) {
                const int nc = width - c0 < CB ? (int)(width - c0) : CB;
                for (int jj = 0; jj < nj; jj++)
                    fa_gather_f32(t[jj], off[jj] + c0 * t[jj]->stride[3], t[jj]->stride[3], nc, blk + jj * CB);
                float *d = dst + (size_t)c0 * ld + (size_t)jb;
                if (kern && kern->transpose) {
                    /* may write zeros into columns nj..round16(nj)-1: dst's padding */
                    kern->transpose(nj, nc, blk, CB, d, ld);
                } else {
                    for (int c = 0; c < nc; c++)
                        for (int jj = 0; jj < nj; jj++) d[(size_t)c * ld + (size_t)jj] = blk[jj * CB + c];
                }
            }
        }
    }
    const int pad = (int)round16((size_t)n);
    for (int64_t c = 0; c < width; c++)
        for (int r = n; r < pad; r++) dst[(size_t)c * ld + (size_t)r] = 0.0f;
}
