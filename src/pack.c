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
    } else {
        for (int r = 0; r < n; r++) {
            int64_t off;
            const fa_tensor *t = fa_rows_src(s, row0 + r, &off);
            for (int64_t c = 0; c < width; c++)
                dst[(size_t)c * ld + (size_t)r] = fa_load_f32(t, off + c * t->stride[3]);
        }
    }
    const int pad = (int)round16((size_t)n);
    for (int64_t c = 0; c < width; c++)
        for (int r = n; r < pad; r++) dst[(size_t)c * ld + (size_t)r] = 0.0f;
}
