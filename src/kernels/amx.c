/*
 * amx.c — the forward pass for bfloat16 Q, K, V on Intel AMX tiles (opt-in:
 * FA_AMX=1; docs/performance.md, "AMX tiles for bf16 inputs").
 *
 * Teacher's note. AMX adds eight tile registers of 16 rows x 64 bytes and one
 * instruction that matters here, TDPBF16PS: C[16][16] (float32) += A[16][32]
 * (bf16) . B[32][16] (bf16), 8192 multiply-adds — on this project's Xeon one
 * core runs ~3.3 TFLOP/s of them against ~0.24 for AVX-512 float32 FMAs. The
 * algorithm is flash.c's: per (batch, kv head) pack K and V once, then every
 * task of 128 query rows streams the key blocks with the online softmax, each
 * 128-key block taken by the task's four 32-row steps in turn while it is in
 * L1/L2. Only the two products move to the tiles:
 *
 *   S = Q K^T   A = Q rows as stored (d contiguous: pairs (2t, 2t+1) adjacent),
 *               B = K packed as 32-bit pairs transposed, one key block after
 *               another: kt[blk][t][j] = (K[j][2t], K[j][2t+1]), so a B tile
 *               is 16 pair-rows x 16 keys, rows 512 bytes apart.
 *               bf16 x bf16 products are exact in float32; the sums are float32.
 *   O += P V    A = P (float32 after the softmax) split in three bf16 parts,
 *               hi = bf16(P), mid = bf16(P - hi), lo = bf16(P - hi - mid): each
 *               rounding leaves a rest of at most 16, then 8 significant bits,
 *               so hi + mid + lo == P exactly (unless a part is subnormal, which
 *               the conversion flushes: mid for P < ~2^-117, lo for P < ~2^-109,
 *               terms far below float32's resolution of the sum), and every
 *               product with V is exact. (Two parts measured 18-28x the float32
 *               path's error against float64, so three; one part is bf16 P, what
 *               GPU kernels use. Three cost 3x the tile work of one and still
 *               run 2.0-2.8x the float32 path here: docs/performance.md.)
 *               B = V packed as key pairs: vv[u][c] = (V[2u][c], V[2u+1][c]).
 *
 * The scale, softcap, ALiBi, masks and the online softmax run on the float32
 * score tile exactly as in flash.c (fa_transform_tile, the kernel table's
 * softmax, pack.c's fa_finish_row). So the result differs from the float32
 * path's by the order of the float32 sums and AMX's handling of subnormals
 * (inputs read as zero, results flushed) — a different computation of the
 * same attention, held to the float32 path's own error against the float64
 * reference on the same inputs (tests/test_amx.c), not to its bits.
 *
 * Where it does not apply (not bf16, rows not contiguous, d or d_v not a
 * multiple of 32, dropout, rotary, a packed copy over the packing cap, no AMX
 * on this CPU or no permission from the kernel) fa_amx_applies says 0 and
 * flash.c runs its own path. A value in Q, K or V that the tiles would not
 * compute to float32's standard — Inf, NaN, or a nonzero magnitude below 2^-40
 * or from 2^40 (subnormal products are flushed: out_of_range) — is found while
 * loading; the call then also hands over to flash.c, which overwrites every
 * output (and Inf/NaN semantics stay the float32 path's): fa_amx_forward
 * returns 0, as it does when its buffers cannot be allocated.
 */
#include "amx.h"

#include "context.h"
#include "internal.h"
#include "kernels/kernels.h"
#include "mask.h"
#include "pack.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif


/* Every tile 16 rows x 64 bytes (palette 1). */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

static void amx_config(void)
{
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) {
        c.colsb[t] = 64;
        c.rows[t] = 16;
    }
    _tile_loadconfig(&c);
}

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* Per-thread scratch (all 64-byte aligned pieces of one allocation). */
typedef struct {
    uint16_t *q;          /* [AMX_TR][ldq] bf16: the task's query rows, zeros past the last */
    float *s;             /* [32][AMX_BC] scores, then P, of one 32-row step */
    uint16_t *ph, *pm, *pl; /* [32][AMX_BC] bf16: P's three parts (split_p) */
    float *o;             /* [AMX_TR][ldo] Õ */
    float *m, *l, *alpha; /* [AMX_TR] */
    int64_t *lo, *hi;     /* [AMX_TR] visible keys of each row */
    uint16_t *rows;       /* [16][max(d, 2 dv)] bf16: K rows gathered for the transpose, zero V rows */
    void *base;
    size_t ldq, ldo;
} amx_scratch;

static int scratch_alloc(const fa_problem *p, amx_scratch *sc)
{
    char *base = fa_scratch_alloc(p, fa_amx_scratch_bytes(p, &sc->ldq, &sc->ldo));
    sc->base = base;
    if (!base) return 0;
#define TAKE(ptr, type, n) do { ptr = (type *)(void *)base; base += round_up((size_t)(n), 64); } while (0)
    TAKE(sc->q, uint16_t, AMX_TR * sc->ldq * 2);
    TAKE(sc->s, float, AMX_BR * AMX_BC * 4);
    TAKE(sc->ph, uint16_t, AMX_BR * AMX_BC * 2);
    TAKE(sc->pl, uint16_t, AMX_BR * AMX_BC * 2);
    TAKE(sc->pm, uint16_t, AMX_BR * AMX_BC * 2);
    TAKE(sc->o, float, AMX_TR * sc->ldo * 4);
    TAKE(sc->m, float, AMX_TR * 4);
    TAKE(sc->l, float, AMX_TR * 4);
    TAKE(sc->alpha, float, AMX_TR * 4);
    TAKE(sc->lo, int64_t, AMX_TR * 8);
    TAKE(sc->hi, int64_t, AMX_TR * 8);
    TAKE(sc->rows, uint16_t, fa_amx_rows_bytes(p));
#undef TAKE
    return 1;
}

/* Pointer to row j of a bf16 source. */
static const uint16_t *bf16_row(const fa_rows *s, int64_t j)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(s, j, &off);
    return (const uint16_t *)t->data + off;
}

/*
 * The values the tiles compute to float32's standard: zero, or a magnitude in [2^-40, 2^40).
 * AMX reads subnormal inputs as zero and flushes subnormal products and sums, so a product
 * below 2^-126 vanishes where the float32 path keeps it (and Inf/NaN must keep the float32
 * path's semantics). Inside the range, q.k products stay in [2^-80, 2^80) — no flush, no
 * overflow for any d here — and a flushed P-part x V product is below 2^-126, under 2^-86 of
 * the largest |V|. A value outside it sends the whole call to flash.c.
 */
#define AMX_MAG_MIN (87u << 7)  /* bf16 magnitude bits of 2^-40 */
#define AMX_MAG_END (167u << 7) /* ... of 2^40 */

/* Lanes of 32 bf16 values outside the range above. */
static inline __mmask32 out_of_range(__m512i x)
{
    const __m512i t = _mm512_and_si512(x, _mm512_set1_epi16(0x7fff));
    const __mmask32 zero = _mm512_cmpeq_epi16_mask(t, _mm512_setzero_si512());
    const __mmask32 small = _mm512_cmplt_epu16_mask(t, _mm512_set1_epi16((short)AMX_MAG_MIN));
    const __mmask32 big = _mm512_cmpge_epu16_mask(t, _mm512_set1_epi16((short)AMX_MAG_END));
    return (small & ~zero) | big;
}

/* Copy n bf16 values (n a multiple of 32); 1 when one of them is outside the range. */
static int copy_bf16(uint16_t *dst, const uint16_t *src, int64_t n)
{
    __mmask32 bad = 0;
    for (int64_t c = 0; c < n; c += 32) {
        const __m512i x = _mm512_loadu_si512(src + c);
        bad |= out_of_range(x);
        _mm512_storeu_si512(dst + c, x);
    }
    return bad != 0;
}

/* 1 when one of the n bf16 values at x (n a multiple of 32) is outside the range. */
static int any_bad(const uint16_t *x, int64_t n)
{
    __mmask32 bad = 0;
    for (int64_t c = 0; c < n; c += 32) bad |= out_of_range(_mm512_loadu_si512(x + c));
    return bad != 0;
}

/* out[c] = a[c] | b[c] << 16 for c < n (n a multiple of 32): two bf16 rows as key pairs. */
static void interleave_rows(const uint16_t *a, const uint16_t *b, int64_t n, uint32_t *out)
{
    /* unpacklo/hi_epi16 pair elements 8L+0..3 (lo) and 8L+4..7 (hi) of each 128-bit lane L;
     * the permutes put the pairs back in column order */
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    for (int64_t c = 0; c < n; c += 32) {
        const __m512i x = _mm512_loadu_si512(a + c), y = _mm512_loadu_si512(b + c);
        const __m512i lo = _mm512_unpacklo_epi16(x, y), hi = _mm512_unpackhi_epi16(x, y);
        _mm512_storeu_si512(out + c, _mm512_permutex2var_epi32(lo, i0, hi));
        _mm512_storeu_si512(out + c + 16, _mm512_permutex2var_epi32(lo, i1, hi));
    }
}

/*
 * Pack key block [j0, j0 + AMX_BC) of (sequence, kv head): kt block [t][j - j0] = the
 * 32-bit pair (K[j][2t], K[j][2t+1]) — 16 keys at a time gathered to `rows` [16][d]
 * and transposed by the kernel table as 32-bit words — and vv[j/2][c] = (V[j][c] low
 * half, V[j+1][c] high half). Keys at or past k_len are zeros. Returns 1 when a K or V
 * value is outside the tiles' range (out_of_range).
 */
static int pack_block(const fa_problem *p, const fa_rows *ks, const fa_rows *vs, int64_t k_len, int64_t j0,
                      uint32_t *kt, uint32_t *vv, size_t ldvv, uint16_t *rows)
{
    const int64_t d = p->d, dv = p->dv;
    const fa_kernels *kern = p->kern;
    int bad = 0;
    for (int64_t g = j0; g < j0 + AMX_BC; g += 16) {
        for (int x = 0; x < 16; x++) {
            uint16_t *dst = rows + (size_t)x * (size_t)d;
            if (g + x < k_len) bad |= copy_bf16(dst, bf16_row(ks, g + x), d);
            else memset(dst, 0, (size_t)d * 2);
        }
        uint32_t *out = kt + (g - j0); /* column g - j0 of the block's [d/2][AMX_BC] words */
        /* the AVX-512 table's transpose (fa_amx_applies requires that table): words moved, never
         * computed on — shuffles and moves, so any bit pattern (a pair read as a float may look
         * like a NaN) arrives unchanged */
        kern->transpose(16, (int)(d / 2), (const float *)(const void *)rows, (size_t)d / 2, (float *)(void *)out,
                        AMX_BC);
    }
    for (int64_t j = j0; j < j0 + AMX_BC; j += 2) {
        uint32_t *dst = vv + (size_t)(j / 2) * ldvv;
        const uint16_t *v0 = rows, *v1 = rows + dv;
        if (j < k_len) bad |= any_bad(v0 = bf16_row(vs, j), dv);
        else memset(rows, 0, (size_t)dv * 2);
        if (j + 1 < k_len) bad |= any_bad(v1 = bf16_row(vs, j + 1), dv);
        else memset(rows + dv, 0, (size_t)dv * 2);
        interleave_rows(v0, v1, dv, dst);
    }
    return bad;
}

/* S[32][nk] = Q K_j^T (unscaled): query rows q (32, ldq apart), keys j0 .. j0+nk-1 of the packed kt
 * (nk a multiple of 32, at most AMX_BC). */
static void tile_qk(const amx_scratch *sc, const uint16_t *q, int64_t d, const uint32_t *kt, size_t ldkt, int64_t j0,
                    int nk)
{
    const size_t qs = sc->ldq * 2, ks = AMX_BC * 4, ss = AMX_BC * 4;
    kt += (size_t)(j0 / AMX_BC) * ldkt;
    for (int half = 0; half < nk / 32; half++) { /* keys j0 + 32 half .. + 31 */
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        for (int64_t c = 0; c < d; c += 32) {
            _tile_loadd(4, q + c, qs);                        /* rows 0..15, d chunk c */
            _tile_loadd(5, q + 16 * sc->ldq + c, qs);         /* rows 16..31 */
            const uint32_t *kb = kt + (size_t)(c / 2) * AMX_BC + 32 * half;
            _tile_loadd(6, kb, ks);                           /* 16 pair-rows x keys +0..15 */
            _tile_loadd(7, kb + 16, ks);                      /* keys +16..31 */
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
        float *s = sc->s + 32 * half;
        _tile_stored(0, s, ss);
        _tile_stored(1, s + 16, ss);
        _tile_stored(2, s + 16 * AMX_BC, ss);
        _tile_stored(3, s + 16 * AMX_BC + 16, ss);
    }
}

/* Õ rows oa (32, ldo apart) [dv] += (P_hi + P_mid + P_lo) V_j for keys j0 .. j0+nk-1 (key pairs
 * j0/2 ..) of vv: per 32 columns, each V tile pair is loaded once for the three parts. */
static void tile_pv(const amx_scratch *sc, float *oa, int64_t dv, const uint32_t *vv, size_t ldvv, int64_t j0,
                    int nk)
{
    const size_t os = sc->ldo * 4, ps = AMX_BC * 2, vs = ldvv * 4;
    const uint16_t *part[3] = {sc->ph, sc->pm, sc->pl};
    for (int64_t c = 0; c < dv; c += 32) {
        float *o = oa + c;
        _tile_loadd(0, o, os);
        _tile_loadd(1, o + 16, os);
        _tile_loadd(2, o + 16 * sc->ldo, os);
        _tile_loadd(3, o + 16 * sc->ldo + 16, os);
        for (int kc = 0; kc < nk; kc += 32) {
            const uint32_t *vb = vv + (size_t)((j0 + kc) / 2) * ldvv + (size_t)c;
            _tile_loadd(6, vb, vs);      /* 16 key pairs x columns c .. c+15 */
            _tile_loadd(7, vb + 16, vs); /* columns c+16 .. c+31 */
            for (int x = 0; x < 3; x++) {
                _tile_loadd(4, part[x] + kc, ps);                /* rows 0..15, keys kc .. kc+31 */
                _tile_loadd(5, part[x] + 16 * AMX_BC + kc, ps);  /* rows 16..31 */
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
        }
        _tile_stored(0, o, os);
        _tile_stored(1, o + 16, os);
        _tile_stored(2, o + 16 * sc->ldo, os);
        _tile_stored(3, o + 16 * sc->ldo + 16, os);
    }
}

/* bf16(x) widened back to float32 */
static inline __m512 bf16_back(__m256bh h)
{
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)h), 16));
}

/* P (rows < br, keys < bc of S) into its three bf16 parts, each the rounded rest of the ones
 * before (exact subtractions: P - hi and (P - hi) - mid are float32 values); every other
 * element of all three is 0. */
static void split_p(amx_scratch *sc, int br, int bc)
{
    for (int r = 0; r < AMX_BR; r++) {
        const float *s = sc->s + (size_t)r * AMX_BC;
        uint16_t *h = sc->ph + (size_t)r * AMX_BC, *mm = sc->pm + (size_t)r * AMX_BC, *l = sc->pl + (size_t)r * AMX_BC;
        for (int j = 0; j < AMX_BC; j += 16) {
            const int n = r < br ? (bc - j < 16 ? bc - j : 16) : 0;
            const __mmask16 k = n <= 0 ? 0 : n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u);
            const __m512 x = _mm512_maskz_loadu_ps(k, s + j);
            const __m256bh xh = _mm512_cvtneps_pbh(x);
            const __m512 r1 = _mm512_sub_ps(x, bf16_back(xh));
            const __m256bh xm = _mm512_cvtneps_pbh(r1);
            const __m256bh xl = _mm512_cvtneps_pbh(_mm512_sub_ps(r1, bf16_back(xm)));
            _mm256_storeu_si256((__m256i *)(h + j), (__m256i)xh);
            _mm256_storeu_si256((__m256i *)(mm + j), (__m256i)xm);
            _mm256_storeu_si256((__m256i *)(l + j), (__m256i)xl);
        }
    }
}

/* Õ rows r0 .. r0+br-1 times alpha (the online softmax's rescale before this block's P V). */
static void scale_o(amx_scratch *sc, int r0, int br, int64_t dv)
{
    for (int r = r0; r < r0 + br; r++) {
        if (sc->alpha[r] == 1.0f) continue; /* the row's max did not move: O * 1 is O (same bits, 1-7% faster) */
        const __m512 a = _mm512_set1_ps(sc->alpha[r]);
        float *o = sc->o + (size_t)r * sc->ldo;
        for (int64_t c = 0; c < dv; c += 16) _mm512_storeu_ps(o + c, _mm512_mul_ps(a, _mm512_loadu_ps(o + c)));
    }
}

/* S (rows < br, keys < bc) times the scale: the finished dot products scaled, as the kernels' qk does. */
static void scale_s(amx_scratch *sc, int br, int bc, float scale)
{
    const __m512 f = _mm512_set1_ps(scale);
    for (int r = 0; r < br; r++) {
        float *s = sc->s + (size_t)r * AMX_BC;
        for (int j = 0; j < bc; j += 16) {
            const __mmask16 k = bc - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (bc - j)) - 1u);
            _mm512_mask_storeu_ps(s + j, k, _mm512_mul_ps(f, _mm512_maskz_loadu_ps(k, s + j)));
        }
    }
}

/* One task: query rows i0 .. i0+br-1 (br <= AMX_TR) of head h of sequence b against the
 * packed K, V: each key block is visited once, by every 32-row step that sees it. */
static int amx_task(const fa_problem *p, amx_scratch *sc, int64_t b, int64_t h, int64_t i0, int br,
                    const uint32_t *kt, size_t ldkt, const uint32_t *vv, size_t ldvv)
{
    const fa_kernels *kern = p->kern;
    const int64_t d = p->d, dv = p->dv;
    const fa_seq seq = fa_problem_seq(p, b);
    const fa_rows qs = fa_rows_q(&p->q, &seq, h), os = fa_rows_q(&p->o, &seq, h);
    const double slope = fa_alibi_slope(p, b, h);
    const int steps = (br + AMX_BR - 1) / AMX_BR;
    int64_t smin[AMX_TR / AMX_BR], smax[AMX_TR / AMX_BR]; /* each step's visible keys */
    int64_t jmin = seq.k_len, jmax = 0;
    uint32_t bad = 0;
    for (int t = 0; t < steps; t++) {
        smin[t] = seq.k_len;
        smax[t] = 0;
        for (int r = t * AMX_BR; r < (t + 1) * AMX_BR; r++) {
            uint16_t *qr = sc->q + (size_t)r * sc->ldq;
            if (r < br) {
                bad |= (uint32_t)copy_bf16(qr, (const uint16_t *)p->q.data + fa_rows_off(&qs, i0 + r), d);
                fa_key_range_in(p, &seq, i0 + r, &sc->lo[r], &sc->hi[r]);
                if (sc->lo[r] < sc->hi[r]) {
                    if (sc->lo[r] < smin[t]) smin[t] = sc->lo[r];
                    if (sc->hi[r] > smax[t]) smax[t] = sc->hi[r];
                }
            } else {
                memset(qr, 0, (size_t)d * 2);
                sc->lo[r] = sc->hi[r] = 0;
            }
            sc->m[r] = -INFINITY;
            sc->l[r] = 0.0f;
            memset(sc->o + (size_t)r * sc->ldo, 0, (size_t)dv * sizeof(float));
        }
        if (smin[t] < jmin) jmin = smin[t];
        if (smax[t] > jmax) jmax = smax[t];
    }
    if (bad) return 1;
    for (int64_t j0 = jmin / AMX_BC * AMX_BC; j0 < jmax; j0 += AMX_BC) {
        const int bc = (int)(seq.k_len - j0 < AMX_BC ? seq.k_len - j0 : AMX_BC);
        for (int t = 0; t < steps; t++) {
            if (smin[t] >= j0 + bc || smax[t] <= j0) continue; /* no row of the step sees the block */
            const int r0 = t * AMX_BR, n = br - r0 < AMX_BR ? br - r0 : AMX_BR;
            /* the step's rows see no key from smax[t] on (a causal diagonal, a window): stop at the
             * 32-key chunk that holds it — the dropped keys had P = 0 for every row of the step */
            const int need = (int)(smax[t] - j0 < bc ? smax[t] - j0 : bc), nk = (need + 31) / 32 * 32;
            const int w = nk < bc ? nk : bc;
            tile_qk(sc, sc->q + (size_t)r0 * sc->ldq, d, kt, ldkt, j0, nk);
            scale_s(sc, n, w, (float)p->scale);
            fa_transform_tile(p, b, i0 + r0, n, j0, w, slope, sc->lo + r0, sc->hi + r0, sc->s, AMX_BC);
            kern->softmax(n, w, sc->s, AMX_BC, sc->m + r0, sc->l + r0, sc->alpha + r0);
            split_p(sc, n, w);
            scale_o(sc, r0, n, dv);
            tile_pv(sc, sc->o + (size_t)r0 * sc->ldo, dv, vv, ldvv, j0, nk);
        }
    }
    for (int r = 0; r < br; r++)
        fa_finish_row(p, &os, &seq, h, i0 + r, !(sc->lo[r] < sc->hi[r]), sc->m[r], sc->l[r],
                      sc->o + (size_t)r * sc->ldo);
    return 0;
}

int fa_amx_forward(const fa_problem *p)
{
    size_t ldkt, ldvv, npad;
    const size_t one = fa_amx_packed_bytes(p, &ldkt, &ldvv, &npad); /* one (batch, kv head) */
    const int64_t per_pass = fa_amx_pass_pairs(p), pairs = p->batch * p->heads_k;
    char *packed = fa_scratch_alloc(p, one * (size_t)per_pass);
    if (!packed) return 0; /* flash.c's path needs less */
    const int64_t group = p->heads / p->heads_k;
    const int64_t nqb = (p->seqlen_q + AMX_TR - 1) / AMX_TR, nkb = (int64_t)npad / AMX_BC;
    atomic_int bad = 0, failed = 0;

#ifdef _OPENMP
#pragma omp parallel num_threads(fa_amx_threads(p))
#endif
    {
        amx_scratch sc;
        memset(&sc, 0, sizeof sc);
        if (!scratch_alloc(p, &sc)) atomic_store(&failed, 1);
        amx_config();
        /* passes of per_pass (batch, kv head) pairs: pack them all, then serve every task of
         * them (several pairs per pass keep every thread busy where one pair has few tasks) */
        for (int64_t first = 0; first < pairs; first += per_pass) {
            const int64_t npass = pairs - first < per_pass ? pairs - first : per_pass;
            /* A task of the last pass met Inf/NaN: the float32 path redoes the call, so do not
             * pack this pass. Every thread reads the same flag: nothing writes it between the
             * last pass's task loop (its closing barrier) and the barrier below. Not on the
             * first pass, where another thread's scratch_alloc may still set `failed`. */
            const int skip = first > 0 && (atomic_load(&bad) || atomic_load(&failed));
#ifdef _OPENMP
#pragma omp barrier
#endif
            if (skip) break;
#ifdef _OPENMP
#pragma omp for schedule(static, 1) /* round robin: pairs of other lengths share the threads */
#endif
            for (int64_t u = 0; u < npass * nkb; u++) {
                const int64_t s = u / nkb, kb = u % nkb, b = (first + s) / p->heads_k, hk = (first + s) % p->heads_k;
                const fa_seq seq = fa_problem_seq(p, b);
                if (seq.q_len <= 0 || kb * AMX_BC >= seq.k_len) continue; /* nothing reads it */
                const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
                uint32_t *kt = (uint32_t *)(void *)(packed + (size_t)s * one);
                uint32_t *vv = kt + npad / AMX_BC * ldkt;
                if (sc.base && pack_block(p, &ks, &vs, seq.k_len, kb * AMX_BC, kt + (size_t)kb * ldkt, vv, ldvv, sc.rows))
                    atomic_store(&bad, 1);
                if (fa_count_test > 0) atomic_fetch_add_explicit(&fa_count_packed, 1, memory_order_relaxed);
            }
            /* (the omp for's barrier: packed before any task reads it.) Every thread reads the
             * flags, then waits for the others before any task can set `bad` again (a Q row
             * with Inf/NaN): all take the same branch, so all meet the same worksharing loop. */
            const int stop = atomic_load(&bad) || atomic_load(&failed);
#ifdef _OPENMP
#pragma omp barrier
#endif
            if (stop) break; /* every thread alike: the float32 path redoes the whole call */
            const int64_t per_pair = group * nqb;
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < npass * per_pair; t++) {
                /* the last row blocks first, of every head of the pass: under a causal mask they
                 * see the most keys, so the threads end together (flash.c's order; causal N 1024
                 * 6-9% faster) */
                const int64_t qb = nqb - 1 - t / (npass * group), w = t % (npass * group);
                const int64_t s = w / group, b = (first + s) / p->heads_k, hk = (first + s) % p->heads_k;
                const int64_t h = hk * group + w % group;
                const fa_seq seq = fa_problem_seq(p, b);
                const int64_t qblocks = (seq.q_len + AMX_TR - 1) / AMX_TR;
                if (qb >= qblocks || atomic_load_explicit(&bad, memory_order_relaxed)) continue;
                const int64_t i0 = qb * AMX_TR;
                const int br = (int)(seq.q_len - i0 < AMX_TR ? seq.q_len - i0 : AMX_TR);
                const uint32_t *kt = (const uint32_t *)(const void *)(packed + (size_t)s * one);
                if (amx_task(p, &sc, b, h, i0, br, kt, ldkt, kt + npad / AMX_BC * ldkt, ldvv)) atomic_store(&bad, 1);
                if (p->progress) {
                    fa_progress(p);
                    amx_config(); /* the caller's hook may have used the tiles itself */
                }
            }
        }
        _tile_release();
        if (sc.base) fa_scratch_free(p, sc.base);
    }
    fa_scratch_free(p, packed);
    if (atomic_load(&failed) || atomic_load(&bad)) return 0;
    atomic_fetch_add_explicit(&fa_amx_runs, 1, memory_order_relaxed);
    return 1;
}
