/*
 * kernels.h — the one micro-kernel interface of the flash path.
 *
 * The flash driver (src/flash.c) owns the loops, the masks, the packing and
 * the threads; it never sees an intrinsic. It asks dispatch.c once for the
 * table of the CPU it runs on and calls three micro-kernels per tile:
 *
 *   1. qk:      S = scale * Q_i K_j^T
 *   2. softmax: online-softmax update of S in place into P, per row:
 *               m_new = max(m, max_j S), alpha = exp(m - m_new),
 *               P = exp(S - m_new), l = alpha * l + sum_j P, m = m_new
 *   3. pv:      O_i = alpha * O_i + P V_j
 *
 * Packed layouts the driver prepares (all float32, rows 64-byte aligned):
 *   Q_i : [br][ldq]   row-major, ldq >= d
 *   Kt  : [d][ldk]    K_j TRANSPOSED, ldk >= bc, a multiple of 16; columns
 *                     bc..ldk-1 are zero
 *   S/P : [br][lds]   lds >= bc, a multiple of 16
 *   V_j : [bc][ldv]   row-major, ldv >= dv
 *   O_i : [br][ldo]   float32 accumulator, ldo >= dv
 *
 * Masked scores arrive as -INFINITY. A row whose running max is still -inf
 * (nothing visible yet) must keep alpha = 1, P = 0, m = -inf and l unchanged,
 * except that a NaN score there sets l = NaN: the max skips NaN, so that is
 * where it would otherwise be lost (a finite max later gives l = 0 * NaN +
 * sum = NaN: it sticks). The finish tells the two apart: m = -inf with l = 0
 * is a row whose visible scores were all -inf, reported like an empty row;
 * with l NaN it is NaN (fa_finish_row).
 *
 * `src/kernels/scalar.c` is the specification; every ISA file implements the
 * same functions and must match it within the bound stated in its tests.
 */
#ifndef FA_KERNELS_H
#define FA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

/*
 * Work the caller slips in between a dec_qk call's blocks (decode.c asks there for the
 * next cache block, a few lines at a time): fn(ctx, done, total) before each of the
 * call's `total` blocks, done = 0, 1, ..., total - 1 in order, so the caller can pace
 * its work by the fraction done / total whatever the kernel's blocking (avx512: 16, 8
 * or 4 keys for 1, 2 or 3-4 rows, per row block of 4; avx2: 8 or 4 keys for 1 or 2
 * rows, else 2 keys across all row blocks; neon: 8 keys for 1 row, else 4 across all;
 * scalar: 4 keys). A block is never more than 16 keys, and fn runs between the
 * kernel's register blocks, never inside one (a call there would spill them). Nothing
 * the kernel computes depends on it; fn must not be NULL. A NULL fa_between: none.
 */
typedef struct fa_between {
    void (*fn)(void *ctx, int done, int total);
    void *ctx;
} fa_between;

static inline void fa_between_run(const fa_between *b, int done, int total)
{
    if (b) b->fn(b->ctx, done, total);
}

typedef struct fa_kernels {
    const char *name;       /* "scalar", "avx2", "avx512", "neon" */
    int simd_width;         /* float32 lanes */
    int row_block;          /* preferred multiple for Br (register-block rows) */

    /* S[i][j] = scale * sum_c Q[i][c] * Kt[c][j]   for i < br, j < bc
     * (the scale multiplies the finished dot product, as FlashAttention does:
     * scores that tie in q . k stay tied whatever the scale) */
    void (*qk)(int br, int bc, int d,
               const float *q, size_t ldq,
               const float *kt, size_t ldk,
               float scale,
               float *s, size_t lds);

    /* Online-softmax update; see the header comment. m, l, alpha: [br]. */
    void (*softmax)(int br, int bc, float *s, size_t lds,
                    float *m, float *l, float *alpha);

    /* O[i][c] = alpha[i] * O[i][c] + sum_j P[i][j] * V[j][c]  for i < br, c < dv */
    void (*pv)(int br, int bc, int dv,
               const float *p, size_t ldp,
               const float *v, size_t ldv,
               const float *alpha,
               float *o, size_t ldo);

    /*
     * Optional (NULL: the driver transposes the tile and calls pv). pv with P
     * stored transposed: P[i][j] = pt[j * ldpt + i]. The bits must be pv's on
     * the transposed tile: the same FMAs in the same order (the backward's
     * single pass: dV += P^T dO and dK += dS^T Q from its S-shaped tiles,
     * src/backward.c).
     */
    void (*pv_t)(int br, int bc, int dv,
                 const float *pt, size_t ldpt,
                 const float *v, size_t ldv,
                 const float *alpha,
                 float *o, size_t ldo);

    /*
     * Optional (NULL: tiles are never cut). Where a causal or windowed tile
     * may be cut (src/flash.c): the fewest leading columns n, with
     * need <= n <= bc, such that qk, softmax and pv over the first n columns
     * of a tile of bc columns give every row the bits they give over all bc
     * columns when every score in columns need..bc-1 is masked (-inf). Each
     * visible column must keep its lane, its partial-sum accumulator and its
     * pv key chunk; the dropped columns would only have added exact zeros
     * (exp(-inf) = +0 to l, 0 * v to O) and -inf to the max. Each ISA file
     * states the loop facts its answer rests on.
     */
    int (*cut_cols)(int bc, int need);
    /* (pv_t chunks its keys exactly as pv does, so cut_cols' and cut_lead's
     * answers about pv hold for it too: the backward's single pass cuts its
     * dK, dV products, made by pv_t, with them.) */

    /*
     * Optional (NULL: no leading cut). The backward pass's other side of a
     * cut (src/backward.c): for pv with alpha = 1 over a tile of bc keys, the
     * largest a' <= a, a multiple of 16, such that pv over keys [a', n) gives
     * the bits of pv over keys [0, n) when P is zero for every key < a
     * (n <= bc, from cut_cols). The skipped keys must only have added
     * P * V = +-0 to accumulators that start at +0, in the same key chunk.
     */
    int (*cut_lead)(int bc, int a);

    /*
     * Optional (NULL: the forward never cuts leading columns). The forward's
     * leading cut (src/flash.c, a window's left edge inside a tile): the
     * largest a' <= a, a multiple of 16, such that qk and softmax over
     * columns [a', n) and pv over keys [a', n) (pointers moved by a') give
     * every row the bits of the calls over [0, n) when every score in
     * columns < a is masked (-inf), for rows whose O and l are still +0
     * (the tile holds the row's first visible key) or whose alpha is 1 (it
     * sees none of the tile's keys): the driver calls it for no other row,
     * so where pv applies alpha does not matter, only its key chunks. And
     * softmax's partial sums: each kept column keeps its lane and
     * accumulator; the skipped ones only added -inf to the max and +0 to l
     * and to pv's accumulators.
     */
    int (*cut_lead_fwd)(int bc, int a);

    /* y[i] = exp(x[i]) for n elements; exp(-inf) = 0 exactly. */
    void (*vexp)(int n, const float *x, float *y);

    /*
     * Optional (NULL: the driver's portable loop). Transpose a K tile into
     * the packed Kt layout: kt[c][j] = k[j * ldk_src + c] for j < bc, c < d.
     * Columns bc..round16(bc)-1 of kt are zeroed by the driver.
     */
    void (*transpose)(int bc, int d, const float *k, size_t ldk_src, float *kt, size_t ldkt);

    /*
     * Finish one line of n scores in place (a row of S, or of S^T in the
     * backward pass) after qk has scaled them, in docs/semantics.md's order:
     *   x outside [va, vb):  s[x] = -inf (masked; g untouched)
     *   x inside:            u = s[x]
     *                        softcap (cap > 0): u = cap * tanh(u * inv_cap),
     *                          and g[x] = 1 - (u * inv_cap)^2 when g != NULL
     *                          (the softcap's derivative, for the backward pass)
     *                        ALiBi (slope != 0): u -= (float)(slope * |rel0 + rel_step * x|),
     *                          the product in double as in scalar.c
     *                        s[x] = u
     * 0 <= va <= vb <= n; rel_step is +1 or -1; with cap > 0, inv_cap must be
     * 1 / cap rounded to float (the callers pass (float)softcap and
     * (float)(1 / softcap)). The SIMD tables use the tanh of simd_exp.h
     * (within FA_TANH_MAX_ULP of tanhf), with cap folded into its small-|x|
     * branch (u + (u z) P(z), z = (u * inv_cap)^2, which takes cap as
     * 1 / inv_cap: one rounding fewer than cap * tanh(u * inv_cap));
     * everything else is bit-identical to fa_transform_line_scalar, the spec.
     */
    void (*transform)(int n, int va, int vb, float *s, float cap, float inv_cap, double slope,
                      int64_t rel0, int rel_step, float *g);

    /*
     * dst[i] = src[i] widened to float32 for i < n: IEEE binary16 bit
     * patterns (bf16 = 0) or bfloat16 (bf16 = 1). Exact (every half value is
     * a float32, subnormals included); a NaN stays a NaN (its payload may come
     * back quieted). The packers' conversion of half-precision Q, K, V, dO.
     */
    void (*widen)(int n, const uint16_t *src, int bf16, float *dst);

    /*
     * The backward pass's elementwise middle of one line (after `transform`
     * finished the scores s): for x < n, with L, D = lse[x], dd[x] when
     * per_elem, else lse[0], dd[0]:
     *   s[x]  = x in [va, vb) ? exp(s[x] - L) : 0           (P; masked: exactly 0)
     *   dp[x] = s[x] * (dp[x] - D)                           (dS)
     *   dp[x] *= g[x] for x in [va, vb) when g != NULL       (softcap derivative)
     * g is read only inside [va, vb). The exp is the table's vexp.
     */
    void (*bwd_line)(int n, int va, int vb, float *s, float *dp, const float *lse, const float *dd,
                     int per_elem, const float *g);

    /*
     * Decoding (src/decode.c): few query rows against K/V rows read where the
     * cache keeps them — no transposed panel, no copy. rows[j] points at the
     * contiguous elements of key j (d of them for K, dv for V) in format fmt
     * (FA_ROW_F32, FA_ROW_F16, FA_ROW_BF16; half rows are widened in
     * registers, exactly). Neither reads an element outside a row.
     *   dec_qk: S[i][j] = scale * (Q[i] . K_j)            for i < nr, j < n
     *   dec_pv: O[i][c] = alpha[i] * O[i][c] + sum_j P[i][j] V_j[c]
     *                                                       for i < nr, c < dv
     * The arithmetic of one output element does not depend on nr, on its row
     * index or on the other rows in the call (the driver's GQA-packed tile
     * gives the bits of the unpacked one), nor on fmt beyond the widening (a
     * half cache gives the bits of a float32 cache of the same values); dec_qk's
     * S[i][j] does not depend on n or j either (rows of a block may come from
     * any page). Q rows are read for c < d only, S written for j < n only.
     */
    void (*dec_qk)(int nr, int n, int d, const float *q, size_t ldq, const void *const *rows, int fmt,
                   float scale, float *s, size_t lds, const fa_between *between);
    void (*dec_pv)(int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows, int fmt,
                   const float *alpha, float *o, size_t ldo);
} fa_kernels;

/* Formats of the rows dec_qk / dec_pv read (fa_kernels::dec_qk). */
enum { FA_ROW_F32 = 0, FA_ROW_F16 = 1, FA_ROW_BF16 = 2 };

/* The spec of dec_qk / dec_pv (portable C; the tables without their own use them). */
void fa_dec_qk_scalar(int nr, int n, int d, const float *q, size_t ldq, const void *const *rows, int fmt,
                      float scale, float *s, size_t lds, const fa_between *between);
void fa_dec_pv_scalar(int nr, int n, int dv, const float *p, size_t ldp, const void *const *rows, int fmt,
                      const float *alpha, float *o, size_t ldo);

/* The spec of fa_kernels::widen (tensor.h's conversions), shared by tables without their own. */
void fa_widen_scalar(int n, const uint16_t *src, int bf16, float *dst);

/* The spec of fa_kernels::bwd_line (libm's expf). */
void fa_bwd_line_scalar(int n, int va, int vb, float *s, float *dp, const float *lse, const float *dd,
                        int per_elem, const float *g);

/* The spec of fa_kernels::transform (libm's tanhf), shared by tables without their own. */
void fa_transform_line_scalar(int n, int va, int vb, float *s, float cap, float inv_cap, double slope,
                              int64_t rel0, int rel_step, float *g);

/* The tables each ISA file defines (only those compiled in exist). */
extern const fa_kernels fa_kernels_scalar;
#if defined(FA_HAVE_AVX2)
extern const fa_kernels fa_kernels_avx2;
#endif
#if defined(FA_HAVE_AVX512)
extern const fa_kernels fa_kernels_avx512;
void fa_transpose_avx512(int bc, int d, const float *k, size_t ldk, float *kt, size_t ldkt);
#endif
#if defined(FA_HAVE_NEON)
extern const fa_kernels fa_kernels_neon;
#endif

/*
 * The leading dimension of a packed tile whose rows a kernel walks down (flash.c's Kt
 * [d][ldk] and V [bc][ldv]; tools/bench_kernels.c lays its tiles out alike): x rounded
 * up to 16 floats, plus one 64-byte line when the stride would be a multiple of 8 lines.
 * qk walks down a 32-column panel of Kt (d rows, one stride apart) for every row block,
 * pv down a [128][32] sub-panel of V. With a stride of 8k lines those rows fall into at most 8 line
 * pairs of a 64-set L1 (ldk = 512 floats, 2 KiB: a d = 64 panel's 128 lines in 4 sets of
 * 12 ways; ldv = 128: a sub-panel's 256 lines in 16 sets) and evict each other, so every
 * row block re-reads its panel from L2; one more line spreads them over every set. Other
 * strides already spread a panel over 32 sets or more (ldk = 416: 26 lines; 320: 20) and
 * are left alone, so packed memory does not grow for nothing (dv = 64 stays 64).
 * Measured with bench_kernels (one core, AVX-512, tiles in L2): qk at ldk = 512 84-86% ->
 * 90-93% of the FMA loop, pv at dv = 128 85% -> 91-92%, the qk+softmax+pv chain at
 * d = 128 188-190 -> 200-204 GFLOP/s (docs/performance.md, "Leading dimensions"). Padding
 * columns are never read (qk reads Kt up to bc rounded to 16) and no result depends on a
 * leading dimension, so the bits do not move. backward.c's single pass spreads its
 * tiles, K_j^T/V_j^T panels and Q, dO, K_j rows (its packs hold rows only, half of the
 * two passes' Q packs, which keep round16 with the rest of those passes).
 */
static inline size_t fa_ld_spread(size_t x)
{
    const size_t r = (x + 15) & ~(size_t)15;
    return (r / 16) % 8 == 0 ? r + 16 : r;
}

/*
 * Ask the caches for the `bytes` bytes at `row`, one prefetch per 64-byte line up to
 * the line of its last byte, wherever in its line the row starts (a row 16 bytes off a
 * line spans one line more). RW and LOCALITY are __builtin_prefetch's, and must be
 * constants (hence a macro). Used where K/V rows are heads x d elements apart, a page
 * or more, where hardware prefetchers stop following them.
 */
#define FA_PREFETCH_ROW(row, bytes, RW, LOCALITY)                                                 \
    do {                                                                                      \
        const char *fa_pf_row_ = (const char *)(row);                                         \
        const size_t fa_pf_span_ = (size_t)(bytes) + ((uintptr_t)fa_pf_row_ & 63);            \
        for (size_t fa_pf_b_ = 0; fa_pf_b_ < fa_pf_span_; fa_pf_b_ += 64)                     \
            __builtin_prefetch(fa_pf_row_ + fa_pf_b_, RW, LOCALITY);                          \
    } while (0)

/*
 * The kernel table for this CPU, chosen once (dispatch.c): the best ISA the
 * CPU supports, or the one FA_ISA names. Returns NULL and sets *status if
 * FA_ISA names an unknown ISA or one this CPU or build lacks.
 */
#include "flashattn.h"
const fa_kernels *fa_kernels_get(fa_status *status);

/* Table for a named ISA if compiled in and supported by this CPU, else NULL. */
const fa_kernels *fa_kernels_by_name(const char *name);

#endif /* FA_KERNELS_H */
