/*
 * flash.c — the tiled forward pass with online softmax (FlashAttention-2 order).
 *
 * The memory hierarchy, CPU edition: DRAM is the slow tier ("HBM"), the
 * per-core L2 (and L1) the fast tier ("SRAM") of size M. Q is cut into row
 * blocks of Br rows, K and V into column blocks of Bc keys. One task owns one
 * (batch, head, Q block): it loads Q_i once, streams every K_j/V_j block past
 * it, and writes O_i and LSE_i once. The Sq x Sk score matrix never exists;
 * only one Br x Bc tile of it, which lives in cache.
 *
 * ---- the online softmax (teacher comment) --------------------------------
 *
 * For one query row with scores s_1..s_N, softmax needs the max m and the sum
 * ℓ = Σ exp(s_j - m) over ALL keys before any output can be normalized. The
 * trick is to carry a running max and a running sum and repair them when the
 * max grows. After seeing key blocks 1..j, keep
 *
 *     m^(j) = max over seen keys of s          (running max)
 *     ℓ^(j) = Σ over seen keys of exp(s - m^(j))   (running sum)
 *     Õ^(j) = Σ over seen keys of exp(s - m^(j)) v  (unnormalized output)
 *
 * When block j+1 arrives with scores S (a row of the tile):
 *
 *     m_new  = max(m^(j), max S)
 *     α      = exp(m^(j) - m_new)          rescales everything seen so far
 *     P      = exp(S - m_new)
 *     ℓ^(j+1) = α ℓ^(j) + Σ P
 *     Õ^(j+1) = α Õ^(j) + P V_j
 *
 * and at the end O = Õ / ℓ, LSE = m + ln ℓ. Every exp argument is <= 0, so
 * nothing overflows, and the result is exact (not an approximation): it is
 * the same sum, reassociated. FlashAttention-2's order — Q block outer, K/V
 * inner, divide by ℓ once at the end — keeps Õ, m, ℓ in cache for the whole
 * sweep and writes O exactly once.
 * --------------------------------------------------------------------------
 *
 * Masks. Each row's visible keys form one interval [lo_i, hi_i) (causal and
 * windows are bands aligned to the bottom-right corner), and lo_i, hi_i grow
 * with i. So the keys any row of a Q block can see form one interval, tiles
 * outside it are skipped without being computed, and only tiles that cut
 * through some row's interval need a per-element mask.
 *
 * Layouts (float32, per thread, 64-byte aligned):
 *   Qi  [Br][ldq]   rows of Q for this block (float32)
 *   Kt  [d][ldk]    K_j transposed (ldk = Bc rounded up to 16, zero-padded)
 *   Vj  [Bc][ldv]   V_j row-major, contiguous
 *   S   [Br][lds]   score tile, overwritten by P
 *   Oa  [Br][ldo]   unnormalized output accumulator Õ
 *   m, l, alpha [Br]
 *
 * Determinism: a task is computed by one thread in a fixed order, so the
 * result is bit-for-bit identical for any thread count and schedule. With
 * fewer than 8 Q blocks per thread in a pass (4 on up to 4 threads), a task
 * is a piece of a Q block (fa_piece_rows, a multiple of the kernel's row
 * block): still the same bits,
 * since every kernel computes each row on its own and the key blocks (Bc),
 * which fix each row's order of operations, do not change.
 */
#include "internal.h"

#include <assert.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>

#include "amx.h"
#include "decode.h"
#include "kernels/kernels.h"
#include "pack.h"
#include "serve.h"

#ifdef _OPENMP
#include <omp.h>
#endif

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

/*
 * The largest shared K^T/V packing the driver will allocate is
 * p->pack_max_bytes (default FA_PACK_DEFAULT_MAX_BYTES, 16 MiB: N = 8192 at
 * d = 128 or N = 16384 at d = 64; it sits in a typical L3). Beyond it each
 * task packs tiles itself and memory stays O(threads x block).
 *
 * K and V reach the driver through the one packer (pack.c): K_j transposed
 * into Kt, V_j copied into contiguous rows. V_j is always copied, even when
 * it is float32 already: in BSHD its rows are heads*d_v floats apart (often
 * a multiple of 4 KiB), which maps a whole tile onto a few cache sets and
 * defeats the hardware prefetcher; the copy costs Bc*d_v moves per tile and
 * measured ~12% faster.
 */

/* Per-thread scratch, laid out in one allocation. */
typedef struct flash_scratch {
    float *qi;    /* [Br][ldq] */
    float *kt;    /* [d][ldk] */
    float *vj;    /* [Bc][ldv] */
    float *s;     /* [Br][lds] */
    float *oa;    /* [Br][ldo] */
    float *m, *l, *alpha; /* [Br] each */
    int64_t *lo, *hi;     /* [Br] each: visible key interval per row */
    void *base;
} flash_scratch;

/*
 * K^T and V of one (batch, kv head), packed once and shared by every thread
 * and every Q block that reads them (see fa_flash_forward):
 *   kt [nkb][d][ldk]   tile kb at kt + kb*d*ldk, zero-padded columns
 *   v  [nkb*Bc][ldv]
 *   v_bad [nkb]        1 if that V tile holds Inf or NaN
 */
typedef struct flash_packed {
    float *kt;
    float *v;
    unsigned char *v_bad;   /* [nkb]: tile holds Inf/NaN in V */
} flash_packed;

typedef struct flash_dims {
    int br, bc;
    int strip; /* rows per strip of a whole tile's qk, transforms and softmax (strip_rows) */
    size_t ldq, ldk, ldv, lds, ldo;
} flash_dims;

/*
 * Br as the driver uses it: p->block_q, except that a derived (not pinned)
 * block is lowered to spread seqlen_q evenly over the same number of blocks,
 * a multiple of the kernels' row block (fa_even_block). At N = 1024 and
 * Br = 204 (AVX2, row block 6) that is six blocks of 174, the last 154,
 * instead of five of 204 and a 4-row block that still streams every key tile
 * under a causal mask. The bits do not move: rows are computed on their own,
 * in an order fixed by the key blocks (Bc).
 */
static int even_block_rows(const fa_problem *p)
{
    if (p->blocks_pinned_q) return p->block_q;
    return fa_even_block(p->seqlen_q, p->block_q, p->kern && p->kern->row_block > 0 ? p->kern->row_block : 1);
}

/*
 * Rows per strip of a whole tile. qk, the transforms, softmax and dropout run
 * strip by strip, and pv once over the tile. What changes is where the passes
 * over S find it: on a whole tile (256 x 256 floats, 256 KiB) softmax's max
 * pass, a softcap / ALiBi / mask transform and dropout each read S back from
 * L2, while after a strip's qk the strip's last score panels are still in L1d
 * (its first ones are pushed out by the K^T tile qk streams: 64-128 KiB); the
 * exp pass already worked in L1d-sized row groups. qk's L2 reads change too:
 * a whole tile re-reads Q once per 32-column panel, a strip re-reads K^T once
 * per strip — about even at 32 rows, twice the K^T reads at 16. pv stays
 * whole: re-reading the V tile for every strip would cost more than P's one
 * read from L2 (measured: no gain). The rule: a multiple of the kernels' row
 * block whose S rows fill about 3/4 of L1d — 32 rows on a 48 KiB L1d at
 * Bc = 256, 16 (AVX-512) or 18 (AVX2) on 32 KiB; a tile whose two row blocks
 * already exceed that (a pinned, very wide Bc) stays whole. Measured on Intel
 * Xeons (48 KiB L1d, 2 MiB L2), 2 threads, alternating runs: 1-4% faster on
 * every row on a quiet 16-core host (d = 64 3%, d = 128 1%, causal 2%,
 * softcap 4%), flat from 16 to 64 rows, 8 rows a little slower; not measured
 * on an AMD core (docs/performance.md, "Tenth session"). FA_STRIP_ROWS=N pins
 * it (0: whole tiles). Same bits as the whole tile: every score comes from
 * the same kernel over the same operands, softmax's row groups reach only
 * per-lane work, and the transforms and dropout index rows absolutely
 * (tests/test_forward.c compares them).
 */
int fa_strip_rows_for(const fa_kernels *kern, int setting, int br, int bc)
{
    const int rb = kern && kern->row_block > 0 ? kern->row_block : 1;
    int64_t rows;
    if (setting == 0) return br;
    if (setting > 0) {
        rows = setting - setting % rb;
    } else {
        size_t l1, l2, l3, line;
        int src;
        fa_detect_caches(&l1, &l2, &l3, &line, &src);
        rows = (int64_t)(l1 / 4 * 3 / (fa_ld_spread((size_t)bc) * sizeof(float)));
        rows -= rows % rb;
        if (rows < 2 * rb) return br; /* two row blocks would not fit: whole tiles */
    }
    if (rows < rb) rows = rb;
    return rows < br ? (int)rows : br;
}

static int strip_rows(const fa_problem *p, const flash_dims *g)
{
    return fa_strip_rows_for(p->kern, p->strip_rows, g->br, g->bc);
}

static flash_dims flash_layout(const fa_problem *p)
{
    flash_dims g;
    g.br = even_block_rows(p);
    g.bc = p->block_k;
    g.ldq = round16((size_t)p->d);
    g.ldk = fa_ld_spread((size_t)g.bc);
    g.ldv = fa_ld_spread((size_t)p->dv);
    g.lds = g.ldk;
    g.ldo = round16((size_t)p->dv);
    g.strip = strip_rows(p, &g);
    return g;
}

static size_t scratch_floats(const fa_problem *p, const flash_dims *g)
{
    return (size_t)g->br * g->ldq + (size_t)p->d * g->ldk + (size_t)g->bc * g->ldv +
           (size_t)g->br * g->lds + (size_t)g->br * g->ldo + 3 * round16((size_t)g->br) +
           4 * round16((size_t)g->br) /* lo, hi as int64 = 2 floats each */ + 64;
}

static int scratch_alloc(const fa_problem *p, const flash_dims *g, flash_scratch *sc)
{
    float *base = fa_scratch_alloc(p, scratch_floats(p, g) * sizeof(float));
    if (!base) return 0;
    float *cur = base;
    sc->base = base;
    sc->qi = cur; cur += (size_t)g->br * g->ldq;
    sc->kt = cur; cur += (size_t)p->d * g->ldk;
    sc->vj = cur; cur += (size_t)g->bc * g->ldv;
    sc->s = cur;  cur += (size_t)g->br * g->lds;
    sc->oa = cur; cur += (size_t)g->br * g->ldo;
    sc->m = cur;  cur += round16((size_t)g->br);
    sc->l = cur;  cur += round16((size_t)g->br);
    sc->alpha = cur; cur += round16((size_t)g->br);
    sc->lo = (int64_t *)cur; cur += 2 * round16((size_t)g->br);
    sc->hi = (int64_t *)cur;
    /* the padding columns of Kt must be zero: kernels may compute them */
    memset(sc->kt, 0, (size_t)p->d * g->ldk * sizeof(float));
    return 1;
}

/*
 * P V for a tile whose V holds Inf or NaN (rare; only for such inputs). The
 * fast kernel multiplies the P = 0 of masked keys into V too, and 0 * Inf is
 * NaN, which would leak into rows that cannot see the bad key. Here each row
 * multiplies only its visible keys.
 */
static void pv_masked_rows(const fa_kernels *kern, int r0, int br, int64_t j0, int bc, int64_t dv,
                           const flash_scratch *sc, size_t lds, const float *vj, size_t ldv,
                           size_t ldo)
{
    for (int r = r0; r < r0 + br; r++) {
        int64_t a = sc->lo[r] - j0, e = sc->hi[r] - j0;
        if (a < 0) a = 0;
        if (e > bc) e = bc;
        float *orow = sc->oa + (size_t)r * ldo;
        if (a >= e) {
            for (int64_t c = 0; c < dv; c++) orow[c] *= sc->alpha[r];
            continue;
        }
        kern->pv(1, (int)(e - a), (int)dv, sc->s + (size_t)r * lds + a, lds, vj + (size_t)a * ldv, ldv,
                 &sc->alpha[r], orow, ldo);
    }
}

/*
 * Ask for the next K and V tiles while this one is being computed. In BSHD
 * their rows are heads_k*d floats apart, one 4 KiB page or more, and hardware
 * prefetchers do not cross pages; without this every row is a cold miss when
 * it is packed. __builtin_prefetch is a hint the compiler maps to the target's
 * prefetch instruction (or to nothing), so no ISA leaks into this file.
 */
static void prefetch_tile(const fa_rows *ks, const fa_rows *vs, int64_t k_len, int64_t j0, int bc)
{
    const int64_t n = (j0 + bc < k_len ? j0 + bc : k_len) - j0;
    fa_rows_prefetch(ks, j0, n);
    fa_rows_prefetch(vs, j0, n);
}

/*
 * Rows per group of a cut tile (see flash_tile_cut): a multiple of the
 * kernels' register block, about 16 rows. Measured (docs/performance.md,
 * issue 14 item 4, second part): 16-row groups are as fast per computed
 * score as the whole tile (a group's S rows stay in L1 from qk to pv; the
 * K/V tile's re-reads come from L2), and 32, 48, 64 or 96 rows only add
 * masked columns to compute.
 */
static int cut_rows(const fa_kernels *kern)
{
    const int rb = kern->row_block > 0 ? kern->row_block : 1;
    return rb * ((16 + rb - 1) / rb);
}

/* The columns [*a, n) that rows [r0, r0 + nr) of a cut tile compute: n from
 * kern->cut_cols of the last column any of them sees (+1), *a from
 * kern->cut_lead_fwd of the first (0 without `lead`); n = 0 when none of
 * them sees the tile. */
static int group_cols(const fa_kernels *kern, const flash_scratch *sc, int r0, int nr, int64_t j0, int bc,
                      int lead, int *a)
{
    const int64_t jend = j0 + bc;
    int64_t need = 0, first = bc;
    for (int r = r0; r < r0 + nr; r++)
        if (sc->lo[r] < jend && sc->hi[r] > j0 && sc->lo[r] < sc->hi[r]) {
            const int64_t e = (sc->hi[r] < jend ? sc->hi[r] : jend) - j0;
            const int64_t f = sc->lo[r] > j0 ? sc->lo[r] - j0 : 0;
            if (e > need) need = e;
            if (f < first) first = f;
        }
    *a = 0;
    if (need == 0) return 0;
    if (lead && first > 0) *a = kern->cut_lead_fwd(bc, (int)first);
    return kern->cut_cols(bc, (int)need);
}

/*
 * One masked tile (rows whose visible keys end inside it, or, with `lead`,
 * start inside it), cut: each group of cut_rows rows runs qk, the
 * transforms, softmax and pv over only the columns [a, n) it needs
 * (group_cols), a group that sees none of the tile is skipped, and the
 * following groups that need the same columns join its call. Identical bits
 * to the whole tile (kernels.h, cut_cols and cut_lead_fwd: every visible
 * column keeps its lane, accumulator and key chunk, and a dropped column
 * only added exact zeros; a skipped group had alpha = exp(m - m) = 1 and
 * P = 0). The one exception is the sign of an O element that is exactly
 * zero: an accumulator at -0 (only after products that underflow) plus a
 * dropped +0 would have become +0. A leading cut (a > 0) skips columns
 * before every seeing row's first visible key, so for each such row this is
 * the first tile it sees (tiles go left to right, a row's keys are one
 * interval): its O and l are still +0, which is what cut_lead_fwd asks of
 * them; a row of the group that sees none of the tile has alpha = 1. A V
 * tile with Inf or NaN is never cut on the left (its per-row pv reads the
 * tile from column 0). With os_pf (the task's last tile: under a causal mask
 * the diagonal one), each group's O rows are asked for once its pv is done,
 * so the task's final stores do not wait for the lines (BSHD rows heads x d_v
 * apart; 1-4% on causal N = 1024, docs/performance.md). The hint says
 * "write", but without -mprfchw in the flags GCC emits prefetcht1 for it:
 * the lines come into L2 for reading, and the stores take them from there.
 */
static void flash_tile_cut(const fa_problem *p, const fa_kernels *kern, const flash_dims *g,
                           flash_scratch *sc, int64_t b, int64_t h, int64_t i0, int br, int64_t j0, int bc,
                           double slope, const float *kt, const float *vj, int v_bad, int lead, const fa_rows *os_pf)
{
    const int rows = cut_rows(kern);
    lead = lead && !v_bad && kern->cut_lead_fwd;
    long leads = 0;
    int r0 = 0;
    while (r0 < br) {
        int nr = br - r0 < rows ? br - r0 : rows, a;
        const int n = group_cols(kern, sc, r0, nr, j0, bc, lead, &a);
        if (n == 0) { /* no row of the group sees this tile: exact no-ops */
            r0 += nr;
            continue;
        }
        while (r0 + nr < br) { /* the next groups that need the same columns join this call */
            const int nx = br - r0 - nr < rows ? br - r0 - nr : rows;
            int ax;
            if (group_cols(kern, sc, r0 + nr, nx, j0, bc, lead, &ax) != n || ax != a) break;
            nr += nx;
        }
        const int w = n - a;
        float *s = sc->s + (size_t)r0 * g->lds + a;
        kern->qk(nr, w, (int)p->d, sc->qi + (size_t)r0 * g->ldq, g->ldq, kt + a, g->ldk, (float)p->scale, s, g->lds);
        fa_transform_tile(p, b, i0 + r0, nr, j0 + a, w, slope, sc->lo + r0, sc->hi + r0, s, g->lds);
        kern->softmax(nr, w, s, g->lds, sc->m + r0, sc->l + r0, sc->alpha + r0);
        if (p->keep) fa_dropout_tile(p, b, h, i0 + r0, nr, j0 + a, w, s, g->lds);
        if (v_bad)
            pv_masked_rows(kern, r0, nr, j0, n, p->dv, sc, g->lds, vj, g->ldv, g->ldo);
        else
            kern->pv(nr, w, (int)p->dv, s, g->lds, vj + (size_t)a * g->ldv, g->ldv, sc->alpha + r0,
                     sc->oa + (size_t)r0 * g->ldo, g->ldo);
        if (a > 0) leads++;
        if (os_pf) fa_rows_prefetch_rw(os_pf, i0 + r0, nr, 1); /* O rows written at the end of the task */
        r0 += nr;
    }
    if (fa_tile_cut_test >= 0) { /* tests only (problem.h) */
        atomic_fetch_add_explicit(&fa_tile_cut_stats[0], 1, memory_order_relaxed);
        atomic_fetch_add_explicit(&fa_tile_cut_stats[1], leads, memory_order_relaxed);
    }
}

/* One task: (batch b, head h, Q block starting at row i0 with br rows). */
static void flash_task(const fa_problem *p, const fa_kernels *kern, const flash_dims *g,
                       flash_scratch *sc, const flash_packed *kv, int64_t b, int64_t h, int64_t i0,
                       int br)
{
    const int64_t hk = fa_kv_head(p, h);
    const double slope = fa_alibi_slope(p, b, h);
    const int64_t d = p->d, dv = p->dv;
    const fa_seq seq = fa_problem_seq(p, b);
    const fa_rows qs = fa_rows_q(&p->q, &seq, h), os = fa_rows_q(&p->o, &seq, h);
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);

    if (fa_count_test > 0) atomic_fetch_add_explicit(&fa_count_rows, br, memory_order_relaxed); /* tests only */

    /* load Q_i and the visible interval of each row */
    int64_t jmin = seq.k_len, jmax = 0;
    for (int r = 0; r < br; r++) {
        float *qrow = sc->qi + (size_t)r * g->ldq;
        if (r + 8 < br) fa_rows_prefetch(&qs, i0 + r + 8, 1); /* rows a page apart: no HW prefetch */
        fa_rows_gather(&qs, i0 + r, qrow);
        fa_key_range_in(p, &seq, i0 + r, &sc->lo[r], &sc->hi[r]);
        if (sc->lo[r] < sc->hi[r]) {
            if (sc->lo[r] < jmin) jmin = sc->lo[r];
            if (sc->hi[r] > jmax) jmax = sc->hi[r];
        }
        sc->m[r] = -INFINITY;
        sc->l[r] = 0.0f;
        memset(sc->oa + (size_t)r * g->ldo, 0, (size_t)dv * sizeof(float));
    }

    /* the smallest end of a non-empty row's keys: tiles past it are cut; and
     * the largest start: tiles before it may be cut on the left (windows) */
    const int cut_any = p->tile_cut && kern->cut_cols;
    int64_t jmin_hi = seq.k_len, jmax_lo = 0;
    for (int r = 0; r < br; r++)
        if (sc->lo[r] < sc->hi[r]) {
            if (sc->hi[r] < jmin_hi) jmin_hi = sc->hi[r];
            if (sc->lo[r] > jmax_lo) jmax_lo = sc->lo[r];
        }

    /* stream the K/V tiles that some row can see; the rest are skipped */
    if (jmin < jmax) {
        const int64_t kb0 = jmin / g->bc, kb1 = (jmax + g->bc - 1) / g->bc;
        for (int64_t kb = kb0; kb < kb1; kb++) {
            const int64_t j0 = kb * g->bc;
            const int bc = (int)(seq.k_len - j0 < g->bc ? seq.k_len - j0 : g->bc);

            const float *kt, *vj;
            int v_bad;
            if (kv) { /* this (batch, kv head) was packed once for all Q blocks */
                kt = kv->kt + (size_t)kb * (size_t)d * g->ldk;
                vj = kv->v + (size_t)j0 * g->ldv;
                v_bad = kv->v_bad[kb];
            } else {
                fa_pack_transposed(kern, &ks, j0, bc, sc->kt, g->ldk);
                v_bad = fa_pack_rows(&vs, j0, bc, sc->vj, g->ldv, 1);
                kt = sc->kt;
                vj = sc->vj;
                if (kb + 1 < kb1) prefetch_tile(&ks, &vs, seq.k_len, j0 + g->bc, g->bc);
            }
            const size_t ldv = g->ldv;

            /* a tile that some row's visible keys end inside, or start inside past
             * the kernels' leading cut: cut it (flash_tile_cut) */
            if (cut_any) {
                const int lead = kern->cut_lead_fwd && jmax_lo > j0 &&
                                 kern->cut_lead_fwd(bc, (int)(jmax_lo - j0 < bc ? jmax_lo - j0 : bc)) > 0;
                if (lead || jmin_hi < j0 + bc) {
                    flash_tile_cut(p, kern, g, sc, b, h, i0, br, j0, bc, slope, kt, vj, v_bad, lead,
                                   kb + 1 == kb1 ? &os : NULL);
                    continue;
                }
            }
            for (int r0 = 0; r0 < br; r0 += g->strip) { /* strips: see strip_rows */
                const int nr = br - r0 < g->strip ? br - r0 : g->strip;
                float *s = sc->s + (size_t)r0 * g->lds;
                kern->qk(nr, bc, (int)d, sc->qi + (size_t)r0 * g->ldq, g->ldq, kt, g->ldk, (float)p->scale, s, g->lds);
                fa_transform_tile(p, b, i0 + r0, nr, j0, bc, slope, sc->lo + r0, sc->hi + r0, s, g->lds);
                kern->softmax(nr, bc, s, g->lds, sc->m + r0, sc->l + r0, sc->alpha + r0);
                if (p->keep) fa_dropout_tile(p, b, h, i0 + r0, nr, j0, bc, s, g->lds); /* P o Z / (1-p); l undropped */
            }
            if (fa_strip_test >= 0 && g->strip < br) /* tests only (problem.h) */
                atomic_fetch_add_explicit(&fa_tile_cut_stats[2], 1, memory_order_relaxed);
            if (v_bad)
                pv_masked_rows(kern, 0, br, j0, bc, dv, sc, g->lds, vj, ldv, g->ldo);
            else
                kern->pv(br, bc, (int)dv, sc->s, g->lds, vj, ldv, sc->alpha, sc->oa, g->ldo);
        }
    }

    /* normalize once, write O_i and LSE_i (empty: from the key range only, never from m) */
    for (int r = 0; r < br; r++)
        fa_finish_row(p, &os, &seq, h, i0 + r, !(sc->lo[r] < sc->hi[r]), sc->m[r], sc->l[r],
                      sc->oa + (size_t)r * g->ldo);
}

static int region_threads(const fa_problem *p, const flash_dims *g);
static int pack_overlap(const fa_problem *p, int nthreads);

/*
 * The shared packing: how many (batch, kv head) pairs are packed at once
 * (*heads_per_pass, 0 when it is not used) and the bytes of one pair's slot.
 * As many pairs as fit FA_FLASH_SHARED_MAX_BYTES go together, so short
 * sequences still give every thread work between two packing passes — but
 * no more than the L2 caches of the region's threads hold, so that a pass's
 * packing is mostly still in L2 when its tasks read it and the next pass
 * writes lines L2 already holds; and as many pairs in each pass (the last
 * pass is not a lone pair whose few tasks leave threads idle). Measured
 * (docs/performance.md, issue 14 item 4, second part; 2 MiB L2): at
 * N = 1024, d = 64, 8 heads, 1 thread, one pass of all 8 heads (4 MiB) spent
 * 2.6 ms of a 13 ms causal call packing, one head a pass 1.3 ms. Where the
 * packing runs beside the tasks and there is more than one pass, *sets = 2:
 * a second set of slots for the next pass (pack_sync), both within the cap,
 * with fewer pairs a pass if need be (the L2 rule is for one set); else 1.
 */
static size_t shared_plan(const fa_problem *p, const flash_dims *g, int64_t *heads_per_pass, int *sets)
{
    *sets = 1;
    const size_t nkb = (size_t)((p->seqlen_k + g->bc - 1) / g->bc);
    const size_t per_kb = (size_t)p->d * g->ldk + (size_t)g->bc * g->ldv; /* floats per key block */
    size_t cap = p->pack_max_bytes; /* 0 forces per-tile packing */
    if (!fa_problem_long_enough(p, g->br, g->bc)) cap = 0; /* many short varlen sequences */
    if (cap > SIZE_MAX / 4) cap = SIZE_MAX / 4;
    /* Decide before multiplying: a strided view can have seqlen_k ~ 2^62, and
     * nkb * per_kb would wrap to a small size that seems to fit. */
    *heads_per_pass = 0;
    if (nkb == 0 || nkb > cap / sizeof(float) / per_kb) return 0;
    const size_t slot = nkb * per_kb * sizeof(float) + ((nkb + 63) & ~(size_t)63); /* + v_bad, to 64 B */
    const int64_t pairs = p->batch * p->heads_k;
    int64_t n = slot <= cap ? (int64_t)(cap / slot) : 0;
    if (n > pairs) n = pairs;
    size_t l1, l2, l3, line;
    int src;
    fa_detect_caches(&l1, &l2, &l3, &line, &src);
    if (n > 1) {
        /* K^T and V bytes of one pair (its slot less the flags) against the threads' L2 */
        const size_t kv = nkb * per_kb * sizeof(float), warm = fa_mul_sat((size_t)region_threads(p, g), l2);
        if ((size_t)n * kv > warm) n = warm / kv > 1 ? (int64_t)(warm / kv) : 1;
    }
    /* more than one pass, overlapped (pack_overlap): a second set of slots, so that the
     * next pass is packed beside this one's tasks; both sets within the cap, with fewer
     * pairs a pass if need be — but only where one pair's K^T and V fit one L2, so that the
     * smaller pieces of a smaller pass re-read them from there: on the 16-core device host
     * (2 MiB L2) halving the passes of N = 4096, d = 128 (8 MiB a pair) ran 0.93x, of
     * N = 1024, d = 128, H = 32 (1 MiB) 1.07x (docs/performance.md, "Twenty-fourth session") */
    if (n >= 1 && n < pairs && pack_overlap(p, region_threads(p, g)) && slot <= cap / 2) {
        if ((size_t)n <= cap / 2 / slot) {
            *sets = 2;
        } else if (slot <= l2) {
            n = (int64_t)(cap / 2 / slot);
            *sets = 2;
        }
    }
    if (n > 1) { /* the same number of passes, spread evenly (the driver's loop): 4 + 4 pairs, not 7 + 1 */
        const int64_t passes = (pairs + n - 1) / n;
        n = (pairs + passes - 1) / passes;
    }
    *heads_per_pass = n;
    return slot;
}

/* Bytes of one set of pack_sync counters (per_pass > 0): its claim counter on a cache line of
 * its own, its pass (read by every task) on another, its done and packed counts on a third, then
 * its slots' ready counts, to a whole line. sync_bytes: two sets after the slots, then the call's
 * task counter on a line of its own. */
static size_t sync_set_bytes(int64_t per_pass)
{
    return 192 + ((fa_mul_sat((size_t)per_pass, sizeof(_Atomic int64_t)) + 63) & ~(size_t)63);
}
static size_t sync_bytes(int64_t per_pass) { return fa_add_sat(fa_mul_sat(2, sync_set_bytes(per_pass)), 64); }

/* Slot s of the shared packing (see flash_packed). */
static flash_packed packed_slot(char *base, size_t slot_bytes, int64_t s, const fa_problem *p,
                                const flash_dims *g)
{
    const size_t nkb = (size_t)((p->seqlen_k + g->bc - 1) / g->bc);
    flash_packed kv;
    kv.kt = (float *)(base + (size_t)s * slot_bytes);
    kv.v = kv.kt + nkb * (size_t)p->d * g->ldk;
    kv.v_bad = (unsigned char *)(kv.v + nkb * (size_t)g->bc * g->ldv);
    return kv;
}

/* Threads of the forward's parallel region: no more than its pieces can
 * use (Q blocks cut into pieces of at least 4 row blocks, fa_piece_rows). */
static int region_threads(const fa_problem *p, const flash_dims *g)
{
    const int64_t nqb = (p->seqlen_q + g->br - 1) / g->br;
    const int64_t min_piece = 4 * (int64_t)(p->kern && p->kern->row_block > 0 ? p->kern->row_block : 8);
    const int64_t most_pieces = (g->br + min_piece - 1) / min_piece;
    return fa_threads_for(p, p->batch * p->heads * nqb * most_pieces);
}

size_t fa_flash_workspace(const fa_problem *p)
{
    if (fa_decode_applies(p)) return fa_decode_workspace(p);
    flash_dims g = flash_layout(p);
    int64_t per_pass;
    int sets;
    size_t slot = shared_plan(p, &g, &per_pass, &sets);
    /* per thread that gets a task: the parallel region's own clamp */
    const size_t threads = (size_t)region_threads(p, &g);
    const size_t own = fa_add_sat(fa_mul_sat(threads, fa_mul_sat(scratch_floats(p, &g), sizeof(float))),
                                  per_pass > 0 ? fa_add_sat(fa_mul_sat((size_t)sets, fa_mul_sat((size_t)per_pass, slot)),
                                                            sync_bytes(per_pass))
                                               : 0);
    /* FA_AMX=1: the AMX path's buffers, or this path's when it hands over (amx.h) */
    const size_t amx = fa_amx_applies(p) ? fa_amx_workspace(p) : 0;
    return amx > own ? amx : own;
}

/* Rows of the Q block starting at i0 of sequence b (<= 0: the sequence is
 * shorter than the longest, the block is past its end). */
static int64_t block_rows(const fa_problem *p, int64_t b, int64_t i0, int blk)
{
    const int64_t q_len = fa_problem_seq(p, b).q_len;
    return q_len - i0 < blk ? q_len - i0 : blk;
}

/*
 * The piece `back` places from the end of sequence b's rows: Q blocks of `blk`
 * rows, each cut into npc pieces of `piece` rows (fa_piece_rows; npc = 1 and
 * piece = blk when blocks are whole), counted over the pieces that hold rows
 * (a short last block has fewer). Counting from each sequence's own end hands
 * out every sequence's last (under a causal mask, biggest) pieces first, also
 * when varlen sequences differ in length. Sets the first row and the row
 * count; 0 when the sequence has fewer pieces.
 */
static int piece_of(const fa_problem *p, int64_t b, int64_t back, int64_t npc, int blk, int piece,
                    int64_t *i0, int64_t *rows)
{
    const int64_t q_len = fa_problem_seq(p, b).q_len;
    if (q_len <= 0) return 0;
    const int64_t total = q_len / blk * npc + (q_len % blk + piece - 1) / piece;
    if (back >= total) return 0;
    const int64_t qp = total - 1 - back, qb = qp / npc, first = (qp % npc) * piece;
    const int64_t br = block_rows(p, b, qb * blk, blk);
    *i0 = qb * blk + first;
    *rows = br - first < piece ? br - first : piece;
    return 1;
}

/*
 * Pieces of one head a thread takes at a time in a packing pass's task loop:
 * FA_TASK_CHUNK=N (unset or 0: one piece at a time, last rows first — slot by
 * slot where the packing overlaps the tasks (pack_overlap), else heads
 * interleaved; a chunk turns the overlap off). On many threads Q blocks are
 * cut into pieces (fa_piece_rows) and each piece streams its head's whole packed K/V for few rows: at
 * N = 1024, d = 128, 16 threads, a 64-row piece reads 1.1 MiB for 64 rows,
 * from L3, because the next piece a thread takes belongs to another head.
 * With N pieces of one head a grab (chunk_back deals them), a thread's first
 * piece brings the head's K/V into its L2 and the others find it there.
 * Measured on the 16-core device hosts (tools/device_task_chunk.sh: orders
 * alternating call by call in one process, paired; docs/performance.md,
 * "Eleventh session"), 8 pieces a grab over interleaved: on one host
 * (105 MiB L3; consecutive pieces, before chunk_back) non-causal N = 1024
 * d 128 1.35x, d 64 1.31x, N = 2048 d 64 1.17x; on another (300 MiB L3), two
 * calls, 0.73-1.00, where the interleaved control read 0.996-1.004. Those rows
 * give exactly one grab to each of the 16 threads, so one late vCPU holds up
 * the call. A grab count that does not share out evenly costs directly: at
 * N = 4096, d = 128 a pass of 3 heads has 144 pieces, 18 grabs of 8 for 16
 * threads, two of which do two (0.68 measured, 0.63 predicted). Not robust,
 * so not the default; N is taken as given. (Those figures are against the
 * interleaved order the default had before pack_overlap.) Same bits in any
 * order: tasks are independent.
 */
static int task_chunk(const fa_problem *p) { return p->task_chunk > 0 ? p->task_chunk : 0; }

/*
 * The tail of a pass's task loop (tail_split; FA_TAIL_SPLIT=N, default
 * FA_TAIL_SPLIT_DEFAULT = 4, 0 or 1 to turn it off): the last tasks handed
 * out — as many as there are threads, on 2 threads or more — are each cut
 * into N pieces of at least 4 row blocks (fewer when the task is too short
 * for N). A dynamic loop ends when its last task does, and each thread's
 * last task starts at a random moment, so the others wait about half a task
 * at the pass's barrier (where the packing runs beside the tasks in two sets
 * of slots, only the call's last pass ends so: pack_sync; the tail of the
 * others is left whole). tools/phase_times.c, 2 threads, N = 4096, d = 64
 * (4 passes of 2 heads): with AVX2 (17 blocks of 252 rows a head, ~3.8 ms
 * each) the wait was ~8 ms a call of ~249 ms, ~0.9 ms with the tail in 4;
 * AVX-512 1.8 -> 0.9 ms, at d = 128 2.3 -> 1.05 ms. The small pieces
 * re-stream their head's K/V for fewer rows, which takes part of it back;
 * paired call by call (tools/ab_chunk.c --tail) AVX2 gains a few percent and
 * AVX-512 is within its controls (docs/performance.md, "Twelfth session").
 * Empty tasks (a shorter sequence of a varlen batch, pieces past a short
 * last block when Q blocks are cut) are passed over wherever the order puts
 * them; the tail is counted in non-empty tasks. Only with the
 * default task order (task_chunk 0), and not under a mask that is causal in
 * effect (causal_like, below; that skips bottom-right causal with seqlen_k >>
 * seqlen_q too, whose rows cost about the same). Same bits: a row's
 * arithmetic is the same in any piece.
 */
/* Causal in effect: a right bound and no left one that cuts (none, or at least as many keys as
 * the longest sequence has), so a row's work grows with its index. */
static int causal_like(const fa_problem *p)
{
    return p->window_right >= 0 && (p->window_left < 0 || p->window_left >= p->seqlen_k);
}

static int tail_split(const fa_problem *p)
{
    /* causal: the loop hands out the biggest pieces first, its last ones are the first
     * rows' few tiles, and the wait was already ~0.05 ms (N = 1024) */
    if (causal_like(p)) return 1;
    return p->task_chunk > 0 || p->tail_split < 2 ? 1 : p->tail_split;
}

/* Part s of `sub` of the rows [*i0, *i0 + *rows) of a task, in whole row blocks of at least
 * 4 row blocks; 0 when part s is empty. */
static int tail_part(int sub, int s, int rb, int64_t *i0, int64_t *rows)
{
    const int64_t unit = rb > 0 ? rb : 8;
    int64_t part = (*rows + sub - 1) / sub;
    part = (part + unit - 1) / unit * unit;
    if (part < 4 * unit) part = 4 * unit;
    const int64_t r0 = (int64_t)s * part;
    if (r0 >= *rows) return 0;
    *i0 += r0;
    *rows = *rows - r0 < part ? *rows - r0 : part;
    return 1;
}

/*
 * The piece (counted from the end of the head's rows, piece_of's `back`) at
 * position w of a head's pieces in chunk order: chunks are c consecutive
 * positions, and the nch chunks of a head are dealt its pieces like cards,
 * snaking (16 pieces, 2 chunks: 0 3 4 7 8 11 12 15 and 1 2 5 6 9 10 13 14), so
 * under a causal mask, where a piece's work grows with its rows, the chunks'
 * work is about equal. A bijection of [0, per_head); positions past the last
 * whole chunk (a c that does not divide per_head) stay in place, and then an
 * OpenMP grab of c consecutive tasks may span the end of one head and the start
 * of the next.
 */
static int64_t chunk_back(int64_t w, int c, int64_t per_head)
{
    const int64_t nch = per_head / c;
    if (w >= nch * c) return w;
    const int64_t ci = w / c, pi = w % c;
    return pi * nch + (pi % 2 ? nch - 1 - ci : ci);
}

/* A packing pass's tasks, in the order its loop hands them out. */
typedef struct pass_order {
    int64_t first, heads_in_pass, group, per_head, npc;
    int chunk, br, piece;
} pass_order;

/*
 * Task t of the pass: its pair slot, sequence, query head and rows (0: an empty
 * piece). chunk 0: row-major order, last rows first: the last (biggest causal)
 * piece of every head of the pass is handed out first, so no thread is left
 * with one big piece while the others wait at the next barrier. chunk N:
 * head-major, a grab is N pieces of one head (task_chunk, chunk_back).
 */
static int pass_task(const fa_problem *p, const pass_order *o, int64_t t, int64_t *sidx, int64_t *b, int64_t *h,
                     int64_t *i0, int64_t *rows)
{
    const int64_t back = o->chunk > 0 ? chunk_back(t % o->per_head, o->chunk, o->per_head) : t / o->heads_in_pass;
    const int64_t hp = o->chunk > 0 ? t / o->per_head : t % o->heads_in_pass, bhk = o->first + hp / o->group;
    *sidx = hp / o->group;
    *b = bhk / p->heads_k;
    *h = (bhk % p->heads_k) * o->group + hp % o->group;
    return piece_of(p, *b, back, o->npc, o->br, o->piece, i0, rows);
}

/* Pack unit u of a packing pass: K^T and V of key block u % nkb of the pass's pair
 * slot u / nkb (a block past a shorter sequence's end is left alone). */
static void pack_unit(const fa_problem *p, const fa_kernels *kern, const flash_dims *g, char *shared,
                      size_t slot, int64_t first, int64_t nkb, int64_t u)
{
    const int64_t sidx = u / nkb, kb = u % nkb, bhk = first + sidx;
    const int64_t b = bhk / p->heads_k, hk = bhk % p->heads_k;
    const flash_packed kv = packed_slot(shared, slot, sidx, p, g);
    const fa_seq seq = fa_problem_seq(p, b);
    const int64_t j0 = kb * g->bc;
    if (j0 >= seq.k_len) return; /* a sequence shorter than the longest */
    const int bc = (int)(seq.k_len - j0 < g->bc ? seq.k_len - j0 : g->bc);
    const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
    fa_pack_transposed(kern, &ks, j0, bc, kv.kt + (size_t)kb * (size_t)p->d * g->ldk, g->ldk);
    kv.v_bad[kb] = (unsigned char)fa_pack_rows(&vs, j0, bc, kv.v + (size_t)j0 * g->ldv, g->ldv, 1);
}

/*
 * The packing overlapped with the tasks, in passes without barriers (pack_overlap).
 * A pass's pack units (slot-major) are claimed from one counter and each slot
 * counts its units packed in ready[slot]; the tasks are handed out slot by slot,
 * pass after pass, from one counter for the whole call. Before a task of slot s
 * computes, its thread packs its share (pack_pass.ahead) of the units of slots up
 * to s + 1 still unclaimed (after a pass's last slot, the next pass's first), so
 * the next slot's packing runs beside this slot's arithmetic; then, while slot s is
 * not complete, it packs unclaimed units of slots up to s, or waits for the ones in
 * flight (a unit is claimed only by a thread that packs it at once, so the wait
 * ends).
 *
 * Pass q packs into set q % nsets of slots (two sets where they fit the packing's
 * cap, else one), each set with counters of its own. A set goes on to pass
 * q + nsets when the last of pass q's task indices is done: the thread that
 * finishes it closes the claim counter, waits for the units in flight, clears
 * the counters and hands the set on (gen = q + nsets, release); a task of pass q
 * first waits for gen == q (acquire). So no thread waits at a pass's end for all
 * the others, as it did at the barrier that closed every pass before: with two
 * sets only a pass two behind holds a pass up. The claim counter carries the
 * pass in its top bits, so a claim read before the set moved on fails. The
 * waits are the driver's own (wait_pause), not OpenMP's: OMP_WAIT_POLICY and
 * GOMP_SPINCOUNT do not reach them.
 */
typedef struct pack_sync {
    _Atomic int64_t *next;   /* pass_tag(pass) | units claimed (a line of its own) */
    _Atomic int64_t *gen;    /* the pass whose slots the set holds */
    _Atomic int64_t *done;   /* task indices of that pass finished */
    _Atomic int64_t *packed; /* units of it packed */
    _Atomic int64_t *ready;  /* [per_pass]: units of each slot packed */
} pack_sync;

/* The claim counter: the pass's low 23 bits above 40 bits of count (a set's units are far
 * fewer than 2^40: each is a whole key block of K^T and V in memory; passes 2^23 apart share
 * a tag, and a claim that stale would need its thread to sleep through 8 million passes). */
#define PACK_COUNT_BITS 40
#define PACK_COUNT_MASK ((INT64_C(1) << PACK_COUNT_BITS) - 1)
static int64_t pass_tag(int64_t pass) { return (pass & 0x7fffff) << PACK_COUNT_BITS; }

typedef struct pack_pass {
    const fa_problem *p;
    const fa_kernels *kern;
    const flash_dims *g;
    char *shared; /* the pass's set of slots */
    size_t slot;
    int64_t pass, first, nkb, units;
    int ahead; /* units a task packs for the next slot: nkb over the tasks of a slot, rounded up */
    const pack_sync *sync;
} pack_pass;

/* Claim the next unit of the pass if it lies below `limit` and pack it; 0 when none is left
 * there or the set is not the pass's yet. */
static int pack_one_below(const pack_pass *pp, int64_t limit)
{
    if (limit > pp->units) limit = pp->units;
    const int64_t tag = pass_tag(pp->pass);
    int64_t x = atomic_load_explicit(pp->sync->next, memory_order_acquire);
    for (;;) {
        if ((x & ~PACK_COUNT_MASK) != tag || (x & PACK_COUNT_MASK) >= limit) return 0;
        if (atomic_compare_exchange_weak_explicit(pp->sync->next, &x, x + 1, memory_order_acquire,
                                                  memory_order_acquire))
            break;
    }
    const int64_t u = x & PACK_COUNT_MASK;
    pack_unit(pp->p, pp->kern, pp->g, pp->shared, pp->slot, pp->first, pp->nkb, u);
    if (fa_count_test > 0) atomic_fetch_add_explicit(&fa_count_overlap_units, 1, memory_order_relaxed); /* tests */
    atomic_fetch_add_explicit(&pp->sync->ready[u / pp->nkb], 1, memory_order_release);
    atomic_fetch_add_explicit(pp->sync->packed, 1, memory_order_release);
    return 1;
}

/* A waiting thread's pause: the CPU's spin hint, every 64th time the scheduler's turn, and
 * past 4096 short sleeps, so that threads beyond the cores leave them to the packers. */
static void wait_pause(unsigned spins)
{
    if (spins % 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#elif defined(__aarch64__)
        __asm__ __volatile__("yield");
#endif
    } else if (spins < 4096) {
        sched_yield();
    } else {
        const struct timespec nap = {0, 20000};
        nanosleep(&nap, NULL);
    }
}

/* Set k's counters for its first pass, k (before the region). */
static void pack_sync_reset(const pack_sync *ps, int64_t per_pass, int64_t k)
{
    atomic_store_explicit(ps->next, pass_tag(k), memory_order_relaxed);
    atomic_store_explicit(ps->done, 0, memory_order_relaxed);
    atomic_store_explicit(ps->packed, 0, memory_order_relaxed);
    for (int64_t s = 0; s < per_pass; s++) atomic_store_explicit(&ps->ready[s], 0, memory_order_relaxed);
    atomic_store_explicit(ps->gen, k, memory_order_relaxed);
}

/* Until the set holds pass q. */
static void set_await(const pack_sync *ps, int64_t q)
{
    for (unsigned spins = 1; atomic_load_explicit(ps->gen, memory_order_acquire) != q; spins++) wait_pause(spins);
}

/* Pass q's last task index is done: hand its set on to pass q + nsets. */
static void set_hand_on(const pack_sync *ps, int64_t q, int nsets, int64_t per_pass)
{
    /* close the claims (a count no limit reaches), then wait for the units in flight */
    const int64_t x = atomic_exchange_explicit(ps->next, pass_tag(q) | PACK_COUNT_MASK, memory_order_acq_rel);
    const int64_t claimed = x & PACK_COUNT_MASK;
    for (unsigned spins = 1; atomic_load_explicit(ps->packed, memory_order_acquire) < claimed; spins++)
        wait_pause(spins);
    atomic_store_explicit(ps->done, 0, memory_order_relaxed);
    atomic_store_explicit(ps->packed, 0, memory_order_relaxed);
    for (int64_t s = 0; s < per_pass; s++) atomic_store_explicit(&ps->ready[s], 0, memory_order_relaxed);
    atomic_store_explicit(ps->next, pass_tag(q + nsets), memory_order_release);
    atomic_store_explicit(ps->gen, q + nsets, memory_order_release);
}

/* Before a task of slot s: its share of the next slot's units (`nx`: the next pass, after
 * this pass's last slot, or NULL), then slot s whole. */
static void pack_await(const pack_pass *pp, const pack_pass *nx, int64_t s)
{
    int k = 0;
    while (k < pp->ahead && pack_one_below(pp, (s + 2) * pp->nkb)) k++;
    if (nx && (s + 1) * pp->nkb >= pp->units)
        while (k < pp->ahead && pack_one_below(nx, nx->nkb)) k++;
    for (unsigned spins = 1; atomic_load_explicit(&pp->sync->ready[s], memory_order_acquire) < pp->nkb; spins++)
        if (!pack_one_below(pp, (s + 1) * pp->nkb)) wait_pause(spins);
}

/*
 * Whether a pass packs beside its tasks (pack_sync): on 2 threads or more,
 * with the default task order, and not under a mask that is causal in effect
 * (causal_like): there the slot-by-slot order cost 4-13% against the heads
 * interleaved on 2-8 threads, more than the overlap gave back below 16
 * (docs/performance.md, "Nineteenth session").
 */
static int pack_overlap(const fa_problem *p, int nthreads)
{
    return nthreads >= 2 && p->task_chunk <= 0 && !causal_like(p);
}

/* One pass of the shared packing: its pairs, its tasks in the order they are handed out
 * (pass_task), and how many task indices (the tail's pieces counted). */
typedef struct pass_plan {
    int64_t first, npass, lead, count;
    int sub;
    pass_order ord;
    int ahead; /* overlapped: units of the next slot a task packs */
} pass_plan;

static void plan_pass(const fa_problem *p, const flash_dims *g, int64_t pass, int64_t passes, int nthreads,
                      int chunk, int sub, pass_plan *pl)
{
    const int64_t nbhk = p->batch * p->heads_k, group = p->heads / p->heads_k;
    const int64_t nqb = (p->seqlen_q + g->br - 1) / g->br, nkb = (p->seqlen_k + g->bc - 1) / g->bc;
    pl->first = pass * nbhk / passes;
    pl->npass = (pass + 1) * nbhk / passes - pl->first;
    /* every Q block (or piece of one) of every query head that reads the pass's pairs */
    const int64_t heads_in_pass = pl->npass * group;
    const int piece = fa_piece_rows(heads_in_pass * nqb, nthreads, g->br, p->kern->row_block);
    const int64_t npc = (g->br + piece - 1) / piece; /* pieces per Q block */
    const int64_t per_head = nqb * npc;
    const int64_t per_slot = group * per_head > 0 ? group * per_head : 1;
    pl->ahead = (int)((nkb + per_slot - 1) / per_slot);
    pl->ord = (pass_order){pl->first, heads_in_pass, group, per_head, npc, chunk, g->br, piece};
    /* the tasks from `lead` on — the last ones handed out, as many non-empty ones as
     * threads — in `sub` pieces each (tail_split; one thread has no one to wait for).
     * Empty tasks (a shorter sequence, pieces past a short last block) are passed over
     * in the count, wherever the order puts them. */
    const int64_t ntask = heads_in_pass * per_head;
    pl->sub = sub > 1 && nthreads > 1 ? sub : 1;
    pl->lead = ntask;
    if (pl->sub > 1)
        for (int k = 0; pl->lead > 0 && k < nthreads;) {
            int64_t sidx, b, h, i0, rows;
            if (pass_task(p, &pl->ord, --pl->lead, &sidx, &b, &h, &i0, &rows)) k++;
        }
    pl->count = pl->lead + (ntask - pl->lead) * pl->sub;
}

/* Task index u of a pass: 0 when it is empty, else its slot, sequence, head and rows. */
static int plan_task(const fa_problem *p, const pass_plan *pl, int64_t u, int64_t *sidx, int64_t *b, int64_t *h,
                     int64_t *i0, int64_t *rows)
{
    const int64_t t = u < pl->lead ? u : pl->lead + (u - pl->lead) / pl->sub;
    if (!pass_task(p, &pl->ord, t, sidx, b, h, i0, rows)) return 0;
    return u < pl->lead || tail_part(pl->sub, (int)((u - pl->lead) % pl->sub), p->kern->row_block, i0, rows);
}

static fa_status flash_forward_tiles(const fa_problem *p);

fa_status fa_flash_forward(const fa_problem *p)
{
    if (fa_decode_applies(p)) return fa_decode_forward(p); /* few query rows: decode.c */
    if (fa_amx_applies(p) && fa_amx_forward(p)) return FA_OK; /* bf16 on AMX tiles, opt-in: amx.c */
    return flash_forward_tiles(p);
}

/*
 * The backward's recompute of O and LSE (api.c, when the caller gives none): always
 * the tiled path, whose qk is the one the backward recomputes P with, so P = exp(s -
 * LSE) sees the very scores the LSE was summed from. The decode path sums each dot
 * product in another order (decode.c) and AMX rounds differently; at large logits
 * (|s| ~ 10^3) that difference alone moved dV past check-grad's bound for few
 * query rows.
 */
fa_status fa_flash_forward_for_backward(const fa_problem *p) { return flash_forward_tiles(p); }

static fa_status flash_forward_tiles(const fa_problem *p)
{
    const fa_kernels *kern = p->kern;
    const flash_dims g = flash_layout(p);
    assert(kern && g.br >= 1 && g.bc >= 1);

    const int64_t nqb = (p->seqlen_q + g.br - 1) / g.br;
    const int64_t nkb = (p->seqlen_k + g.bc - 1) / g.bc;
    const int64_t group = p->heads / p->heads_k;
    int failed = 0;

    /*
     * Two ways to feed K and V to the tasks:
     *  - shared (when one kv head's K^T and V fit in FA_FLASH_SHARED_MAX_BYTES):
     *    pack them once per (batch, kv head), all threads together — as many
     *    pairs per pass as fit — then run every Q block of every query head
     *    that reads them against the packed copy. Packing is O(Sk*d) instead
     *    of O(Sq*Sk*d/Br), and the packed tiles are contiguous, so hardware
     *    prefetchers stream them. On 2 threads or more (pack_overlap) a pass
     *    does not pack first and compute after: its tasks go slot by slot and
     *    each packs its share of the next slot before it computes (pack_sync),
     *    so the packing's memory reads run beside other threads' arithmetic.
     *    On the 16-core device host the separate phase took 17% of an
     *    N = 1024 call and did not speed up past 4 threads (~20 GB/s); the
     *    overlap ran those calls 1.08-1.15x faster at 16 threads, 1.07x at
     *    8, 1.01-1.02x at 2 and 4, while the slot-by-slot order alone (a
     *    packing phase first) ran them 0.93-0.97x (docs/performance.md,
     *    "Nineteenth session"). Nor do its passes end at a barrier: the
     *    tasks of all passes come from one counter, and a pass waits only for
     *    its set of slots (pack_sync: the pass two before it, with two sets).
     *    Not under a causal mask: there the order alone cost 4-13% on 2-8
     *    threads, more than the overlap gave back below 16; those passes pack
     *    in a phase, then compute, with a barrier after each. Same bits: a
     *    unit's packing is the same whoever does it, and a task starts only
     *    once its slot is whole (the slot's ready count, release/acquire).
     *  - per tile (long sequences): each task packs each tile it visits into
     *    its own scratch, so memory stays O(threads x block) at any length.
     */
    int64_t per_pass;
    int nsets; /* sets of slots, planned for the region's thread count (shared_plan; a region
                * given one thread packs in phases, into the first) */
    const size_t slot = shared_plan(p, &g, &per_pass, &nsets);
    const size_t set_bytes = (size_t)per_pass * slot;
    char *shared = NULL;
    pack_sync sync[2];
    _Atomic int64_t *next_task = NULL; /* the overlapped passes' task counter */
    memset(sync, 0, sizeof sync);
    if (per_pass > 0) {
        const size_t bytes = (size_t)nsets * set_bytes + sync_bytes(per_pass);
        shared = fa_scratch_alloc(p, bytes);
        if (!shared) return fa_fail(FA_ERR_NOMEM, "flash: could not allocate %zu bytes for packed K/V", bytes);
        char *ctr = shared + (size_t)nsets * set_bytes;
        for (int k = 0; k < 2; k++) {
            char *set = ctr + (size_t)k * sync_set_bytes(per_pass);
            sync[k].next = (_Atomic int64_t *)set;
            sync[k].gen = (_Atomic int64_t *)(set + 64);
            sync[k].done = (_Atomic int64_t *)(set + 128);
            sync[k].packed = sync[k].done + 1;
            sync[k].ready = (_Atomic int64_t *)(set + 192);
            pack_sync_reset(&sync[k], per_pass, k);
        }
        next_task = (_Atomic int64_t *)(ctr + 2 * sync_set_bytes(per_pass));
        atomic_store_explicit(next_task, 0, memory_order_relaxed);
    }

#ifdef _OPENMP
#pragma omp parallel num_threads(region_threads(p, &g))
#endif
    {
#ifdef _OPENMP
        const int nthreads = omp_get_num_threads();
#else
        const int nthreads = 1;
#endif
        flash_scratch sc;
        memset(&sc, 0, sizeof sc);
        if (!scratch_alloc(p, &g, &sc)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
            sc.base = NULL;
        }
#ifdef _OPENMP
#pragma omp barrier
#endif
        /* passes of at most per_pass pairs, their sizes differing by one at most
         * (16 pairs, 3 a pass: 3 3 3 3 2 2, not 3 3 3 3 3 1) */
        const int64_t nbhk = p->batch * p->heads_k, passes = per_pass > 0 ? (nbhk + per_pass - 1) / per_pass : 0;
        if (shared && !failed && nqb > 0 && pack_overlap(p, nthreads)) {
            /* overlapped: slot by slot (pass_task's chunk 1), pass after pass, no barrier
             * between passes (pack_sync); the tail of the last pass in pieces (of every
             * pass with one set, where a pass waits for the one before) */
            pass_plan pl;
            pack_pass pp, nx; /* pass q's units, and the next pass's (two sets only) */
            int64_t q = -1, start = 0, end = 0; /* this thread's pass: its task indices [start, end) */
            const int sub = tail_split(p);
            for (;;) {
                const int64_t u = atomic_fetch_add_explicit(next_task, 1, memory_order_relaxed);
                while (u >= end && ++q < passes) { /* a thread's indices only grow */
                    plan_pass(p, &g, q, passes, nthreads, 1, nsets == 1 || q == passes - 1 ? sub : 1, &pl);
                    start = end;
                    end += pl.count;
                    pp = (pack_pass){p, kern, &g, shared + (size_t)(q % nsets) * set_bytes, slot, q, pl.first, nkb,
                                     pl.npass * nkb, pl.ahead, &sync[q % nsets]};
                    nx = pp;
                    nx.shared = shared + (size_t)((q + 1) % nsets) * set_bytes;
                    nx.pass = q + 1;
                    nx.first = (q + 1) * nbhk / passes;
                    nx.units = ((q + 2) * nbhk / passes - nx.first) * nkb;
                    nx.sync = &sync[(q + 1) % nsets];
                }
                if (q >= passes) break;
                const pack_sync *ps = pp.sync;
                set_await(ps, q);
                int64_t sidx, b, h, i0, rows;
                if (plan_task(p, &pl, u - start, &sidx, &b, &h, &i0, &rows)) {
                    /* after this pass's last slot, the next pass's first units (one set: the
                     * next pass's set is this one, not handed on yet) */
                    pack_await(&pp, nsets == 2 && q + 1 < passes ? &nx : NULL, sidx);
                    const flash_packed kv = packed_slot(pp.shared, slot, sidx, p, &g);
                    flash_task(p, kern, &g, &sc, &kv, b, h, i0, (int)rows);
                }
                /* (before the caller's progress hook, which would hold the hand-on up) */
                if (atomic_fetch_add_explicit(ps->done, 1, memory_order_acq_rel) + 1 == pl.count)
                    set_hand_on(ps, q, nsets, per_pass);
                fa_progress(p);
            }
        } else if (shared && !failed) {
            for (int64_t pass = 0; pass < passes; pass++) {
                pass_plan pl;
                plan_pass(p, &g, pass, passes, nthreads, task_chunk(p), tail_split(p), &pl);
                /* pack K^T and V of the pass's pairs, all threads together */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (int64_t u = 0; u < pl.npass * nkb; u++) pack_unit(p, kern, &g, shared, slot, pl.first, nkb, u);
                /* then every Q block (or piece of one) of every query head that reads them */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, pl.ord.chunk > 0 ? pl.ord.chunk : 1)
#endif
                for (int64_t u = 0; u < pl.count; u++) {
                    int64_t sidx, b, h, i0, rows;
                    if (!plan_task(p, &pl, u, &sidx, &b, &h, &i0, &rows)) continue;
                    const flash_packed kv = packed_slot(shared, slot, sidx, p, &g);
                    flash_task(p, kern, &g, &sc, &kv, b, h, i0, (int)rows);
                    fa_progress(p);
                }
            }
        } else if (!failed) {
            const int piece = fa_piece_rows(p->batch * p->heads * nqb, nthreads, g.br, kern->row_block);
            const int64_t npc = (g.br + piece - 1) / piece, nqp = nqb * npc; /* pieces per head */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < p->batch * p->heads * nqp; t++) {
                const int64_t bhk = t / (group * nqp);
                const int64_t b = bhk / p->heads_k, hk = bhk % p->heads_k;
                const int64_t tt = t % (group * nqp);
                const int64_t back = tt % nqp; /* biggest causal pieces first */
                const int64_t h = hk * group + tt / nqp;
                int64_t i0, rows;
                if (!piece_of(p, b, back, npc, g.br, piece, &i0, &rows)) continue;
                flash_task(p, kern, &g, &sc, NULL, b, h, i0, (int)rows);
                fa_progress(p);
            }
        }
        fa_scratch_free(p, sc.base);
    }
    fa_scratch_free(p, shared);
    if (failed)
        return fa_fail(FA_ERR_NOMEM, "flash: could not allocate %zu bytes of per-thread scratch",
                       fa_flash_workspace(p));
    return FA_OK;
}
