/*
 * transform.c — the float32 score transforms shared by the flash and standard
 * forward passes (softcap, ALiBi, mask), and the rule that decides a row
 * whose scores are all NaN or -inf. The float64 versions are mask.h's.
 */
#include "mask.h"

#include <math.h>

#include "kernels/kernels.h"

/*
 * Finish the scores of tile S (rows i0.., keys j0..) after qk has scaled them:
 * softcap, ALiBi and the mask, in docs/semantics.md's order. (The scale multiplies the
 * dot product inside qk rather than being folded into Q beforehand, as
 * FlashAttention also does: scale * (q . k) keeps scores that tie in q . k
 * tied, which matters when the scale is huge.)
 */
void fa_transform_tile(const fa_problem *p, int64_t b, int64_t i0, int br, int64_t j0, int bc, double slope,
                       const int64_t *lo_rows, const int64_t *hi_rows, float *s, size_t lds)
{
    const int transform = p->softcap > 0.0 || slope != 0.0;
    const float cap = (float)p->softcap, inv_cap = p->softcap > 0.0 ? (float)(1.0 / p->softcap) : 0.0f;
    const int64_t diag = transform && slope != 0.0 ? fa_diag_offset(p, b) : 0; /* reads the geometry once */
    /* the kernel table's line transform runs at the ISA's width (scalar.c's is the spec) */
    void (*line)(int, int, int, float *, float, float, double, int64_t, int, float *) =
        p->kern && p->kern->transform ? p->kern->transform : fa_transform_line_scalar;
    for (int r = 0; r < br; r++) {
        const int64_t lo = lo_rows[r] - j0, hi = hi_rows[r] - j0; /* tile-relative */
        const int jlo = lo > 0 ? (lo < bc ? (int)lo : bc) : 0;
        const int jhi = hi < bc ? (hi > jlo ? (int)hi : jlo) : bc;
        if (!transform && jlo == 0 && jhi == bc) continue; /* nothing to do on this row */
        /* ALiBi's distance of key j0 + j: |i0 + r + diag - (j0 + j)| */
        line(bc, jlo, jhi, s + (size_t)r * lds, cap, inv_cap, slope, i0 + r + diag - j0, -1, NULL);
    }
}
