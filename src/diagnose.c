/*
 * diagnose.c — fa_diagnose(): which known mistake explains a wrong output.
 *
 * 1. Rows: K query rows per (batch, head), one from each of K equal strata of
 *    [0, Sq) (row 0 and the last row always), seeded; or every row.
 * 2. For each sampled row: the tested O row (and LSE), the float64 reference
 *    (the variant with nothing wrong, dg_variant_reference), and, when they
 *    fit in 256 MiB, the dot products q.k_j of the row, reused by every
 *    variant that reads the same q and kv head.
 * 3. Channels: the output (sum of squared differences over the sampled rows,
 *    a NaN/Inf that the candidate does not predict costs a fixed penalty) and
 *    the LSE when given. A channel is "wrong" when its error is above the
 *    rounding floor of the kernel's precision (see flashattn.h).
 * 4. Candidates (the vocabulary ids the shape makes possible), each one or a
 *    few variants; parameters are fitted: the scale factor by a grid plus a
 *    golden-section search on a subset of rows, window shifts, tile sizes and
 *    LSE bases by trying each, the GQA map per head by the best kv head.
 *    explained = mean over wrong channels of 1 - residual(candidate) /
 *    residual(reference), on all sampled rows.
 *
 * Varlen batches and KV caches (paged or not): rows are sampled per (sequence,
 * head), and every variant reads a sequence's keys through its own geometry
 * (geo_of/key_src: the problem's, or the kernel's mistaken span, start, page or
 * append slot), so every class applies per sequence and the serving classes
 * (varlen-leak, varlen-offset, paged-index, kv-append-offset) are variants too.
 * Low precision (fa_diagnose_options::qkv_format): the rounding floor follows
 * P's format, and `descale` (one (batch, kv head)'s Q/K or V descale off by a
 * fitted factor) and `p-saturation` (P~ clamped at the format's max in P.V,
 * row sums unclamped, online over key blocks) are candidates.
 * Attention sinks and dropout: every variant folds the sink into its finished
 * row (eval_core) and puts the keep-mask on P before P.V (keep_factor), and
 * `sink-missing` and `dropout-mask` are the variants that do it wrongly.
 * Rotary (KV cache with k_new): the reference and every variant above read q
 * and k_new rotated the problem's way (serve.c's fa_rotary_apply, as fa_check
 * does); `rotary-pairing` and `rotary-offset` re-rotate the raw q and k_new
 * under a mistaken rule (the other pairing; positions off by a fitted offset,
 * the query rule of the other mask kind, new keys from position 0, rotary not
 * applied to q or k_new) and score the reference on those (cand_rotary).
 *
 * Everything is float64 and follows mask.h's semantics for the reference.
 */
#include "diagnose.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "internal.h"
#include "lowprec.h"
#include "serve.h"

#define DG_DOTS_MAX_BYTES ((size_t)256 << 20)
#define DG_FIT_ROWS 8
#define DG_FINALISTS 4 /* at most this many variants carried from the fit rows to a score on every row, */
#define DG_FINALIST_MARGIN 0.05 /* those within this much explained fraction of the best fit-row score, */
#define DG_FINALIST_FLOOR 0.5   /* when that score is at least this (else only the best: nothing is near) */
#define DG_LSE_PENALTY 100.0
#define DG_LN2 0.69314718055994530942

typedef struct dg_item {
    int64_t b, i, h;
} dg_item;

typedef struct dg_ctx {
    const fa_problem *p;
    int64_t n;          /* sampled rows */
    dg_item *it;        /* [n] */
    double *ot;         /* [n][dv] tested O */
    double *lt;         /* [n] tested LSE, or NULL */
    double *orf;        /* [n][dv] reference O */
    double *lrf;        /* [n] reference LSE */
    double *dots;       /* [n][Sk] q.k_j for the row's own kv head, or NULL */
    double pen;         /* squared penalty of an unpredicted NaN/Inf in O */
    int nt;             /* threads */
    double r0o, r0l;    /* reference residuals */
    double floor_o, floor_l; /* residuals at the rounding floor (over all sampled rows) */
    double *ro_ref, *rl_ref; /* [n] the reference's residual per row */
    int sig_o, sig_l;
    int64_t fit[DG_FIT_ROWS]; /* the sampled rows with the largest reference error: where fits run */
    int64_t nfit;
    double fit_o, fit_l;      /* reference residuals on them */
    int qfmt;                 /* fa_qformat of Q, K, V (low precision), or FA_QF_NONE */
    const fa_tensor *raw_q;   /* rotary: q and k_new as given (p->q, p->k_new are rotated); else NULL */
    const fa_tensor *raw_kn;
} dg_ctx;

typedef struct dg_scratch {
    double *q;   /* [d] */
    double *x;   /* [max(d, dv)] */
    double *s;   /* [Sk padded] logits */
    double *acc; /* [dv] */
} dg_scratch;

dg_variant dg_variant_reference(const fa_problem *p)
{
    dg_variant v;
    memset(&v, 0, sizeof v);
    v.scale = p->scale;
    v.softcap = p->softcap;
    v.cap_mode = DG_CAP_RIGHT;
    v.align = -1;
    v.wl = p->window_left;
    v.wr = p->window_right;
    v.kvh = -1;
    return v;
}

static int64_t kv_of(const fa_problem *p, const dg_variant *v, int64_t h)
{
    return v->kvh >= 0 ? v->kvh : fa_kv_head(p, h);
}

/* Does the variant read the keys (and the query) the problem's way? Then the
 * cached dot products of the row's own kv head apply. */
static int keys_right(const dg_variant *v)
{
    return v->keys == DG_KEYS_RIGHT && !v->k_shift && !v->k_clip && !v->q_shift && !v->len_delta && !v->no_new && !v->new_at &&
           v->page == DG_PAGE_RIGHT && v->layout != DG_LAYOUT_ALL_BHSD;
}

/* Is the problem a uniform batch (sequence b = tensor batch b, every row)? */
static int uniform(const fa_problem *p) { return !p->seq && !p->cu_seqlens_q && !p->cache_seqlens; }

/* Offsets of Q row (b, i, h) and K/V row (b, j, kvh) of a uniform batch, read
 * the variant's way: DG_LAYOUT_ALL_BHSD reads the BSHD buffer as if it were BHSD. */
static int64_t q_off(const fa_problem *p, int bhsd, int64_t b, int64_t i, int64_t h)
{
    if (bhsd) {
        const int64_t r = h * p->seqlen_q + i;
        i = r / p->heads;
        h = r % p->heads;
    }
    return fa_off4(&p->q, b, i, h, 0);
}

static int64_t kv_off(const fa_problem *p, const fa_tensor *t, int bhsd, int64_t b, int64_t j, int64_t kh)
{
    if (bhsd) {
        const int64_t r = kh * p->seqlen_k + j;
        j = r / p->heads_k;
        kh = r % p->heads_k;
    }
    return fa_off4(t, b, j, kh, 0);
}

/*
 * The keys of sequence b as a kernel with variant v sees them: `len` keys,
 * key j at row start + j of the K/V tensor's batch (through the pages when
 * paged), keys j >= new_from from row j - new_from of k_new/v_new; query row i
 * lines up with key i + diag0 and is read from row q_row0 + i.
 */
typedef struct dg_geo {
    int64_t b;
    fa_seq s;
    int64_t len, start, new_from, diag0, q_row0;
} dg_geo;

static dg_geo geo_of(const fa_problem *p, const dg_variant *v, int64_t b)
{
    dg_geo g;
    g.b = b;
    g.s = fa_problem_seq(p, b);
    g.len = g.s.k_len;
    g.start = g.s.k_start;
    g.new_from = p->k_new.data ? g.s.k_new_from : INT64_MAX;
    g.q_row0 = g.s.q_start + v->q_shift;
    int64_t qpos = 0; /* the kernel's position of query row 0 when it sees one long sequence */
    if (p->cu_seqlens_q) {
        const int64_t total_k = p->k.shape[1], next = p->cu_seqlens_k[b + 1];
        switch (v->keys) {
        case DG_KEYS_MAXLEN: g.len = p->seqlen_k; break;
        case DG_KEYS_TO_END: g.len = total_k - g.start; break;
        case DG_KEYS_IGNORE_USED: g.len = next - g.start; break;
        case DG_KEYS_FROM_START: g.len += g.start; g.start = 0; break;
        case DG_KEYS_GLOBAL:
            g.start = 0;
            g.len = total_k;
            qpos = g.s.q_start;
            break;
        default: break;
        }
        g.start += v->k_shift;
        if (v->k_clip) { /* the sequence trimmed to the rows K/V hold, at either end */
            if (g.start < 0) {
                g.len += g.start;
                g.start = 0;
            }
            if (g.start + g.len > total_k) g.len = total_k - g.start;
            if (g.len < 0) g.len = 0;
        }
    }
    if (p->cache_seqlens) {
        const int64_t cached = g.s.k_new_from, nnew = p->seqlen_new;
        if (v->no_new) g.len = cached;
        g.len += v->len_delta;
        if (v->new_at) {
            g.new_from = cached + v->new_at;
            g.len = cached + v->new_at + nnew;
        }
        if (g.len < 0) g.len = 0;
    }
    const int align = v->align >= 0 ? v->align : p->top_left;
    const int64_t q_len = v->keys == DG_KEYS_GLOBAL ? p->q.shape[1] : g.s.q_len;
    g.diag0 = qpos + (align ? 0 : g.len - q_len);
    return g;
}

/* Where key j (vside 0: K, 1: V) of kv head kh lives for geometry g; NULL when
 * the kernel would read outside every tensor (the key is then left out). */
static const fa_tensor *key_src(const fa_problem *p, const dg_variant *v, const dg_geo *g, int64_t j, int vside,
                                int64_t kh, int64_t *off)
{
    const fa_tensor *t = vside ? &p->v : &p->k;
    if (uniform(p)) {
        if (j < 0 || j >= p->seqlen_k) return NULL;
        *off = kv_off(p, t, v->layout == DG_LAYOUT_ALL_BHSD, g->b, j, kh);
        return t;
    }
    if (j >= g->new_from) {
        const fa_tensor *nw = vside ? &p->v_new : &p->k_new;
        if (j - g->new_from < p->seqlen_new) {
            *off = fa_off4(nw, g->s.k_new_batch, j - g->new_from, kh, 0);
            return nw;
        }
        /* past the new keys: the cache slot the kernel reads there */
    }
    const int64_t r = g->start + j;
    if (r < 0) return NULL;
    if (g->s.k_pages) {
        const int64_t ps = g->s.k_page_size, num = t->shape[0];
        int64_t e = r / ps, row = g->b, page;
        if (v->page == DG_PAGE_ENTRY) e += v->page_delta;
        if (v->page == DG_PAGE_TABLE_ROW) row += v->page_delta;
        if (e < 0 || e >= p->max_pages || row < 0 || row >= p->batch) return NULL;
        page = v->page == DG_PAGE_IDENTITY ? g->b * p->max_pages + e : p->block_table[row * p->max_pages + e];
        if (v->page == DG_PAGE_PHYS) page += v->page_delta;
        if (page < 0 || page >= num) return NULL;
        *off = fa_off4(t, page, r % ps, kh, 0);
        return t;
    }
    if (r >= t->shape[1]) return NULL;
    *off = fa_off4(t, g->s.k_batch, r, kh, 0);
    return t;
}

/* Longest key list any variant may build (scratch size). */
static int64_t keys_max(const fa_problem *p)
{
    int64_t n = p->seqlen_k;
    if (p->cu_seqlens_q && p->k.shape[1] > n) n = p->k.shape[1];
    if (p->cache_seqlens) {
        const int64_t rows = p->block_table ? p->max_pages * p->page_size : p->k.shape[1];
        if (rows + p->seqlen_new > n) n = rows + p->seqlen_new;
    }
    return n + 4;
}

/* The factor the variant puts on P_ij of row i (sequence b, head h) before P.V:
 * the dropout keep-mask Z_ij / (1 - p) read the variant's way; 1 without dropout. */
static double keep_factor(const fa_problem *p, const dg_variant *v, int64_t b, int64_t h, int64_t i, int64_t j)
{
    if (!p->keep || v->drop == DG_DROP_NONE) return 1.0;
    int64_t r = i, c = j;
    if (v->drop == DG_DROP_TRANSPOSED) {
        const int64_t f = j * p->seqlen_q + i;
        r = f / p->seqlen_k;
        c = f % p->seqlen_k;
    } else if (v->drop == DG_DROP_KEY_SHIFT) {
        c = j + v->drop_shift;
    } else if (v->drop == DG_DROP_ROW_SHIFT) {
        r = i + v->drop_shift;
    }
    if (r < 0 || r >= p->seqlen_q || c < 0 || c >= p->seqlen_k) return 0.0;
    if (!fa_keep_row(p, b, h, r)[c * p->keep_stride[3]]) return 0.0;
    return v->drop == DG_DROP_NO_SCALE ? 1.0 : p->keep_scale;
}

/*
 * O row (b, i, h) and its LSE as a kernel with variant v computes them
 * (layout: only the input reading of DG_LAYOUT_ALL_BHSD; the output mapping is
 * predict()'s). dots: the cached q.k_j of this row for its own kv head, or NULL.
 * *lse_any = 1 when the variant does not determine the LSE (a finite sentinel).
 */
static void eval_core_nosink(const dg_ctx *cx, dg_scratch *s, int64_t b, int64_t i, int64_t h, const dg_variant *v,
                             const double *dots, int no_alibi, double *o, double *lse, int *lse_any)
{
    const fa_problem *p = cx->p;
    const int64_t d = p->d, dv = p->dv;
    const int bhsd = v->layout == DG_LAYOUT_ALL_BHSD;
    const int64_t kh = kv_of(p, v, h);
    const dg_geo g = geo_of(p, v, b);
    const int64_t Sk = g.len;
    const int64_t diag = i + g.diag0;
    const int64_t npad = v->pad_tile > 0 ? (Sk + v->pad_tile - 1) / v->pad_tile * v->pad_tile : Sk;
    int64_t lo = 0, hi = npad;
    if (v->wl >= 0 && diag - v->wl > lo) lo = diag - v->wl;
    if (v->wr >= 0 && diag + v->wr + 1 < hi) hi = diag + v->wr + 1;
    if (hi < lo) hi = lo;
    const int cap_leak = v->cap_mode == DG_CAP_AFTER_MASK && v->softcap > 0;
    const int64_t j0 = cap_leak ? 0 : lo, j1 = cap_leak ? Sk : hi;
    *lse_any = 0;
    double m = -INFINITY;
    if (j1 > j0) {
        const double slope = no_alibi ? 0.0 : fa_alibi_slope(p, b, h);
        if (!dots) {
            if (uniform(p)) {
                fa_gather_f64(&p->q, q_off(p, bhsd, b, i, h), p->q.stride[3], d, s->q);
            } else {
                const int64_t r = g.q_row0 + i;
                if (r >= 0 && r < p->q.shape[1])
                    fa_gather_f64(&p->q, fa_off4(&p->q, g.s.q_batch, r, h, 0), p->q.stride[3], d, s->q);
                else
                    for (int64_t c = 0; c < d; c++) s->q[c] = 0.0;
            }
        }
        for (int64_t j = j0; j < j1; j++) {
            double sc;
            if (cap_leak && (j < lo || j >= hi)) {
                sc = -v->softcap;
            } else {
                double dot = 0.0;
                if (j < Sk) {
                    int64_t off;
                    const fa_tensor *t;
                    if (dots) {
                        dot = dots[j];
                    } else if ((t = key_src(p, v, &g, j, 0, kh, &off)) != NULL) {
                        fa_gather_f64(t, off, t->stride[3], d, s->x);
                        for (int64_t c = 0; c < d; c++) dot += s->q[c] * s->x[c];
                    } else {
                        s->s[j - j0] = -INFINITY; /* read outside every tensor: left out */
                        continue;
                    }
                }
                if (v->softcap > 0 && v->cap_mode == DG_CAP_BEFORE_SCALE) {
                    sc = v->scale * (v->softcap * tanh(dot / v->softcap));
                } else {
                    sc = v->scale * dot;
                    if (v->softcap > 0) sc = v->softcap * tanh(sc / v->softcap);
                }
                if (slope != 0.0) sc -= slope * fabs((double)(diag - j));
            }
            s->s[j - j0] = sc;
            if (sc > m) m = sc;
        }
    }
    if (j1 <= j0 || m == -INFINITY) {
        if (v->empty == DG_EMPTY_NAN || v->empty == DG_EMPTY_NAN_O) {
            for (int64_t c = 0; c < dv; c++) o[c] = NAN;
            *lse = v->empty == DG_EMPTY_NAN ? NAN : -INFINITY;
        } else if (v->empty == DG_EMPTY_MEAN_V) {
            int64_t n = 0;
            for (int64_t c = 0; c < dv; c++) o[c] = 0.0;
            for (int64_t j = 0; j < Sk; j++) {
                int64_t off;
                const fa_tensor *t = key_src(p, v, &g, j, 1, kh, &off);
                if (!t) continue;
                fa_gather_f64(t, off, t->stride[3], dv, s->x);
                for (int64_t c = 0; c < dv; c++) o[c] += s->x[c];
                n++;
            }
            for (int64_t c = 0; c < dv; c++) o[c] /= (double)(n > 0 ? n : 1);
            *lse_any = 1;
            *lse = NAN;
        } else {
            for (int64_t c = 0; c < dv; c++) o[c] = 0.0;
            *lse = -INFINITY;
        }
        return;
    }
    for (int64_t c = 0; c < dv; c++) s->acc[c] = 0.0;
    double l = 0.0;
    if (v->split_mode != DG_SPLIT_RIGHT) {
        /* each split: its own max m_c, sum l_c and accumulator (o[] holds it), then the combine */
        const int64_t chunk = (Sk + v->split_n - 1) / v->split_n;
        double num = 0.0, den = 0.0, lmax = -INFINITY, lsum = 0.0;
        int64_t used = 0;
        for (int64_t c = 0; c < dv; c++) s->acc[c] = 0.0;
        for (int sp = 0; sp < v->split_n; sp++) {
            const int64_t a0 = sp * chunk > j0 ? sp * chunk : j0, e0 = (sp + 1) * chunk < j1 ? (sp + 1) * chunk : j1;
            double mc = -INFINITY, lc = 0.0;
            for (int64_t j = a0; j < e0; j++)
                if (s->s[j - j0] > mc) mc = s->s[j - j0];
            if (mc == -INFINITY) continue;
            for (int64_t c = 0; c < dv; c++) o[c] = 0.0;
            for (int64_t j = a0; j < e0; j++) {
                const double w = exp(s->s[j - j0] - mc);
                lc += w;
                int64_t off;
                const fa_tensor *t;
                if (j >= Sk || w == 0.0 || !(t = key_src(p, v, &g, j, 1, kh, &off))) continue;
                fa_gather_f64(t, off, t->stride[3], dv, s->x);
                const double wk = w * keep_factor(p, v, b, h, i, j);
                for (int64_t c = 0; c < dv; c++) o[c] += wk * s->x[c];
            }
            const double lse_c = mc + log(lc);
            used++;
            lsum += exp(lse_c - m); /* m: the row's max over every visible key */
            if (lse_c > lmax) lmax = lse_c;
            switch (v->split_mode) {
            case DG_SPLIT_MEAN:
                for (int64_t c = 0; c < dv; c++) s->acc[c] += o[c] / lc;
                den += 1.0;
                break;
            case DG_SPLIT_OWN_MAX:
                for (int64_t c = 0; c < dv; c++) s->acc[c] += o[c];
                den += lc;
                break;
            case DG_SPLIT_LAST:
                for (int64_t c = 0; c < dv; c++) s->acc[c] = o[c] / lc;
                den = 1.0;
                num = lse_c;
                break;
            default: /* DG_SPLIT_LSE_MAX: the right O */
                for (int64_t c = 0; c < dv; c++) s->acc[c] += exp(lse_c - m) * o[c] / lc;
                break;
            }
        }
        if (v->split_mode == DG_SPLIT_LSE_MAX) den = lsum;
        for (int64_t c = 0; c < dv; c++) o[c] = s->acc[c] / den;
        *lse = v->split_mode == DG_SPLIT_LAST ? num : v->split_mode == DG_SPLIT_LSE_MAX ? lmax : m + log(lsum);
        (void)used;
        return;
    }
    if (v->psat_c > 0) {
        /* blocks aligned at key 0, visited last to first (FlashAttention-3) or first to last */
        const int64_t bs = v->psat_block, nb0 = j0 / bs, nb1 = (j1 - 1) / bs;
        double mr = -INFINITY;
        for (int64_t x = nb0; x <= nb1; x++) {
            const int64_t nb = v->psat_reverse ? nb1 - (x - nb0) : x;
            const int64_t a = nb * bs > j0 ? nb * bs : j0, e = (nb + 1) * bs < j1 ? (nb + 1) * bs : j1;
            double mt = -INFINITY;
            for (int64_t j = a; j < e; j++)
                if (s->s[j - j0] > mt) mt = s->s[j - j0];
            const double mn = mt > mr ? mt : mr;
            if (mn == -INFINITY) continue;
            const double r = mr == -INFINITY ? 0.0 : exp(mr - mn);
            l *= r;
            for (int64_t c = 0; c < dv; c++) s->acc[c] *= r;
            mr = mn;
            for (int64_t j = a; j < e; j++) {
                const double w = v->psat_c * exp(s->s[j - j0] - mr);
                l += w;
                int64_t off;
                const fa_tensor *t;
                if (j >= Sk || w == 0.0 || !(t = key_src(p, v, &g, j, 1, kh, &off))) continue;
                const double pw = (w < v->psat_max ? w : v->psat_max) * keep_factor(p, v, b, h, i, j);
                fa_gather_f64(t, off, t->stride[3], dv, s->x);
                for (int64_t c = 0; c < dv; c++) s->acc[c] += pw * s->x[c];
            }
        }
        for (int64_t c = 0; c < dv; c++) o[c] = s->acc[c] / l;
        *lse = mr + log(l / v->psat_c);
        return;
    }
    if (v->tile <= 0) {
        for (int64_t j = j0; j < j1; j++) {
            const double w = exp(s->s[j - j0] - m);
            l += w;
            int64_t off;
            const fa_tensor *t;
            if (j >= Sk || w == 0.0 || !(t = key_src(p, v, &g, j, 1, kh, &off))) continue;
            fa_gather_f64(t, off, t->stride[3], dv, s->x);
            const double wk = w * keep_factor(p, v, b, h, i, j);
            for (int64_t c = 0; c < dv; c++) s->acc[c] += wk * s->x[c];
        }
    } else {
        /* online softmax over key tiles aligned at 0, the running max updated but
         * the accumulator and the sum never rescaled */
        double mr = -INFINITY;
        for (int64_t t0 = j0 - j0 % v->tile; t0 < j1; t0 += v->tile) {
            const int64_t a = t0 > j0 ? t0 : j0, e = t0 + v->tile < j1 ? t0 + v->tile : j1;
            double mt = -INFINITY;
            for (int64_t j = a; j < e; j++)
                if (s->s[j - j0] > mt) mt = s->s[j - j0];
            if (mt > mr) mr = mt;
            for (int64_t j = a; j < e; j++) {
                const double w = exp(s->s[j - j0] - mr);
                l += w;
                int64_t off;
                const fa_tensor *t;
                if (j >= Sk || w == 0.0 || !(t = key_src(p, v, &g, j, 1, kh, &off))) continue;
                fa_gather_f64(t, off, t->stride[3], dv, s->x);
                const double wk = w * keep_factor(p, v, b, h, i, j);
                for (int64_t c = 0; c < dv; c++) s->acc[c] += wk * s->x[c];
            }
        }
        m = mr;
    }
    for (int64_t c = 0; c < dv; c++) o[c] = s->acc[c] / l;
    *lse = m + log(l);
}

/* eval_core_nosink's row with the problem's attention sink of head h folded in
 * (mask.h's fa_sink_finish on the finished row: LSE' = ln(e^LSE + e^sink),
 * O' = O e^(LSE - LSE'); an empty row gets O = 0, LSE = sink), except where
 * the variant leaves it out (v->sink). */
static void eval_core(const dg_ctx *cx, dg_scratch *s, int64_t b, int64_t i, int64_t h, const dg_variant *v,
                      const double *dots, int no_alibi, double *o, double *lse, int *lse_any)
{
    eval_core_nosink(cx, s, b, i, h, v, dots, no_alibi, o, lse, lse_any);
    const double sink = fa_sink(cx->p, h), l0 = *lse;
    if (sink == -INFINITY || v->sink == DG_SINK_OUT || isnan(l0) || *lse_any) return;
    double l2, f;
    if (l0 == -INFINITY) {
        l2 = sink;
        f = 0.0;
    } else {
        const double m2 = l0 > sink ? l0 : sink;
        l2 = m2 + log(exp(l0 - m2) + exp(sink - m2));
        f = exp(l0 - l2);
    }
    if (v->sink != DG_SINK_OUT_O)
        for (int64_t c = 0; c < cx->p->dv; c++) o[c] = f == 0.0 ? 0.0 : o[c] * f;
    if (v->sink != DG_SINK_OUT_LSE) *lse = l2;
}

/* The O row and LSE the variant predicts at sampled row w. */
static void predict(const dg_ctx *cx, dg_scratch *s, int64_t w, const dg_variant *v, double *o, double *lse,
                    int *lse_any)
{
    const fa_problem *p = cx->p;
    const dg_item *it = &cx->it[w];
    const int64_t dv = p->dv;
    *lse_any = 0;
    if (v->lse != DG_LSE_RIGHT) {
        memcpy(o, cx->orf + w * dv, (size_t)dv * sizeof *o);
        const double L = cx->lrf[w];
        if (v->lse == DG_LSE_LOG2) *lse = L / DG_LN2;
        else if (v->lse == DG_LSE_LN2_TWICE) *lse = L * DG_LN2;
        else {
            dg_variant u = dg_variant_reference(p);
            u.scale = 1.0;
            u.softcap = 0.0;
            eval_core(cx, s, it->b, it->i, it->h, &u, cx->dots ? cx->dots + w * p->seqlen_k : NULL, 1, s->acc + 0,
                      lse, lse_any);
            memcpy(o, cx->orf + w * dv, (size_t)dv * sizeof *o);
        }
        return;
    }
    if (v->layout != DG_LAYOUT_RIGHT) {
        /* the tested buffer's element (b, i, h) is the BHSD element at the same flat position */
        const int64_t r = it->i * p->heads + it->h;
        const int64_t h2 = r / p->seqlen_q, i2 = r % p->seqlen_q;
        if (v->layout == DG_LAYOUT_OUT_BHSD) {
            dg_variant u = dg_variant_reference(p);
            eval_core(cx, s, it->b, i2, h2, &u, NULL, 0, o, lse, lse_any);
            *lse = cx->lrf[w];
        } else {
            double l2;
            int any2;
            eval_core(cx, s, it->b, i2, h2, v, NULL, 0, o, &l2, &any2);
            double *tmp = malloc((size_t)dv * sizeof *tmp);
            if (tmp) {
                eval_core(cx, s, it->b, it->i, it->h, v, NULL, 0, tmp, lse, lse_any);
                free(tmp);
            } else {
                *lse = NAN;
                *lse_any = 1;
            }
        }
        return;
    }
    const int own = (v->kvh < 0 || v->kvh == fa_kv_head(p, it->h)) && keys_right(v);
    eval_core(cx, s, it->b, it->i, it->h, v, own && cx->dots ? cx->dots + w * p->seqlen_k : NULL, 0, o, lse,
              lse_any);
}

static double o_diff(double t, double c, double pen)
{
    if (isfinite(t) && isfinite(c)) return (t - c) * (t - c);
    if (isnan(t) && isnan(c)) return 0.0;
    if (t == c) return 0.0;
    return pen;
}

static double l_diff(double t, double c)
{
    if (isfinite(t) && isfinite(c)) return (t - c) * (t - c);
    if (isinf(t) && isinf(c)) return 0.0; /* an empty row: either infinity is the convention */
    if (isnan(t) && isnan(c)) return 0.0;
    return DG_LSE_PENALTY;
}

static int scratch_alloc(dg_scratch *s, const fa_problem *p)
{
    const int64_t x = p->d > p->dv ? p->d : p->dv;
    const int64_t ns = keys_max(p) + 512;
    s->q = malloc((size_t)p->d * sizeof(double));
    s->x = malloc((size_t)x * sizeof(double));
    s->s = malloc((size_t)ns * sizeof(double));
    s->acc = malloc((size_t)(p->dv + 1) * sizeof(double));
    return s->q && s->x && s->s && s->acc;
}

static void scratch_free(dg_scratch *s)
{
    free(s->q);
    free(s->x);
    free(s->s);
    free(s->acc);
}

/*
 * Residuals of variant v on the rows listed in `rows` (NULL: all n): per row
 * into ro[w]/rl[w] when those are non-NULL, summed into *so, *sl in row order
 * (not by an OpenMP reduction, whose order changes with the schedule: two
 * variants that predict the same rows must score the same bits, so that a tie
 * goes to the first one listed on any thread count and in every run).
 * Returns 0, or -1 when scratch could not be allocated.
 */
static int residuals(const dg_ctx *cx, const dg_variant *v, const int64_t *rows, int64_t nrows, double *ro,
                     double *rl, double *so, double *sl)
{
    const fa_problem *p = cx->p;
    const int64_t dv = p->dv;
    double *per = malloc((size_t)(nrows > 0 ? nrows : 1) * 2 * sizeof *per); /* row x: [2x] O, [2x+1] LSE */
    if (!per) return -1;
    int bad = 0;
#pragma omp parallel num_threads((int)(nrows < cx->nt ? (nrows > 0 ? nrows : 1) : cx->nt)) reduction(+ : bad)
    {
        dg_scratch s;
        double *o = malloc((size_t)dv * sizeof *o);
        if (!scratch_alloc(&s, p) || !o) {
            bad++;
        } else {
#pragma omp for schedule(dynamic, 1)
            for (int64_t x = 0; x < nrows; x++) {
                const int64_t w = rows ? rows[x] : x;
                double lse;
                int any;
                predict(cx, &s, w, v, o, &lse, &any);
                double a = 0.0, c = 0.0;
                const double *t = cx->ot + w * dv;
                for (int64_t k = 0; k < dv; k++) a += o_diff(t[k], o[k], cx->pen);
                if (cx->lt && !any) c = l_diff(cx->lt[w], lse);
                if (ro) ro[w] = a;
                if (rl) rl[w] = c;
                per[2 * x] = a;
                per[2 * x + 1] = c;
            }
        }
        scratch_free(&s);
        free(o);
    }
    double to = 0.0, tl = 0.0;
    if (!bad)
        for (int64_t x = 0; x < nrows; x++) {
            to += per[2 * x];
            tl += per[2 * x + 1];
        }
    free(per);
    *so = to;
    *sl = tl;
    return bad ? -1 : 0;
}

/* Explained fraction from residuals (ro, rl) against reference residuals (bo,
 * bl): the mean over the wrong channels of 1 - r / r_ref. A channel that is
 * right (at its rounding floor) may only lower it: a candidate that breaks a
 * correct output to explain a wrong LSE pays 1 - r / max(r_ref, floor) < 0. */
static double explained(const dg_ctx *cx, double ro, double rl, double bo, double bl)
{
    double e = 0.0;
    int n = 0;
    if (cx->sig_o) {
        e += bo > 0 ? 1.0 - ro / bo : 0.0;
        n++;
    } else {
        const double f = bo > cx->floor_o ? bo : cx->floor_o;
        if (f > 0 && ro > f) e += 1.0 - ro / f;
    }
    if (cx->sig_l) {
        e += bl > 0 ? 1.0 - rl / bl : 0.0;
        n++;
    } else if (cx->lt) {
        const double f = bl > cx->floor_l ? bl : cx->floor_l;
        if (f > 0 && rl > f) e += 1.0 - rl / f;
    }
    return n ? e / n : 0.0;
}

/* ------------------------------------------------------------------------ */
/* Candidates                                                                */
/* ------------------------------------------------------------------------ */

typedef struct dg_result {
    fa_diagnosis d;
} dg_result;

typedef struct dg_list {
    struct dg_entry {
        fa_diagnosis d;
        int order; /* the order it was added: ties go to the earlier (more specific) class */
    } all[32];
    int n;
    char considered[256];
    int n_considered;
} dg_list;

static void consider(dg_list *L, const char *id)
{
    size_t len = strlen(L->considered);
    snprintf(L->considered + len, sizeof L->considered - len, "%s%s", len ? ", " : "", id);
    L->n_considered++;
}

static void add(dg_list *L, const char *id, double ex, double param, const char *fmt, ...)
{
    if (L->n >= (int)(sizeof L->all / sizeof L->all[0])) return;
    L->all[L->n].order = L->n;
    fa_diagnosis *d = &L->all[L->n++].d;
    memset(d, 0, sizeof *d);
    snprintf(d->id, sizeof d->id, "%s", id);
    d->explained = ex;
    d->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->detail, sizeof d->detail, fmt, ap);
    va_end(ap);
}

/* Score variant v on every sampled row; NaN on allocation failure. */
static double score(const dg_ctx *cx, const dg_variant *v)
{
    double ro, rl;
    if (residuals(cx, v, NULL, cx->n, NULL, NULL, &ro, &rl) != 0) return NAN;
    return explained(cx, ro, rl, cx->r0o, cx->r0l);
}

/* Finalists: the indices of the DG_FINALISTS highest fit-row scores, best first. */
typedef struct dg_finalists {
    int n, idx[DG_FINALISTS];
    double e[DG_FINALISTS];
} dg_finalists;

static void finalist_add(dg_finalists *f, int x, double e)
{
    if (isnan(e)) return; /* never a finalist (as the unsampled path never picks one) */
    int at = f->n < DG_FINALISTS ? f->n : DG_FINALISTS;
    while (at > 0 && e > f->e[at - 1]) at--;
    if (at >= DG_FINALISTS) return;
    const int move = (f->n < DG_FINALISTS ? f->n : DG_FINALISTS - 1) - at;
    memmove(f->idx + at + 1, f->idx + at, (size_t)move * sizeof f->idx[0]);
    memmove(f->e + at + 1, f->e + at, (size_t)move * sizeof f->e[0]);
    f->idx[at] = x;
    f->e[at] = e;
    if (f->n < DG_FINALISTS) f->n++;
}

/* How many finalists are scored on every row: the best, and while its fit score is at least
 * DG_FINALIST_FLOOR, the others within DG_FINALIST_MARGIN of it. */
static int finalists_kept(const dg_finalists *f)
{
    int k = f->n > 0;
    if (k && f->e[0] >= DG_FINALIST_FLOOR)
        while (k < f->n && f->e[k] >= f->e[0] - DG_FINALIST_MARGIN) k++;
    return k;
}

/* The best of nv variants; its index in *best. With many rows, the variants
 * are first compared on the rows where the error is largest (cx->fit) and the
 * best there (finalists_kept) are scored on every row: the fit rows may all come from one
 * sequence, where a variant that is right only for that sequence (a uniform
 * offset equal to its cache length) ties the per-sequence rule that is right
 * for all of them. The margin keeps the usual clear winner at one full score. */
static double best_of(const dg_ctx *cx, const dg_variant *vs, int nv, int *best)
{
    *best = 0;
    if (nv > 1 && cx->n > 2 * cx->nfit) {
        dg_finalists f = {0};
        for (int x = 0; x < nv; x++) {
            double ro, rl;
            if (residuals(cx, &vs[x], cx->fit, cx->nfit, NULL, NULL, &ro, &rl) != 0) return NAN;
            finalist_add(&f, x, explained(cx, ro, rl, cx->fit_o, cx->fit_l));
        }
        double top = -INFINITY;
        for (int k = 0; k < finalists_kept(&f); k++) {
            const double e = score(cx, &vs[f.idx[k]]);
            if (isnan(e)) return NAN;
            if (e > top) {
                top = e;
                *best = f.idx[k];
            }
        }
        return top;
    }
    double top = -INFINITY;
    for (int x = 0; x < nv; x++) {
        const double e = score(cx, &vs[x]);
        if (e > top) {
            top = e;
            *best = x;
        }
    }
    return top;
}

/* Scale factor fit on a subset of rows: grid over 2^(k/2), k in -14..14, then golden section. */
static double fit_scale(const dg_ctx *cx, const int64_t *rows, int64_t nr, double bo, double bl)
{
    const fa_problem *p = cx->p;
    dg_variant v = dg_variant_reference(p);
    double best_x = 0.0, best_e = -INFINITY;
    for (int k = -14; k <= 14; k++) {
        if (k == 0) continue;
        v.scale = p->scale * exp2(k / 2.0);
        double ro, rl;
        if (residuals(cx, &v, rows, nr, NULL, NULL, &ro, &rl) != 0) return 1.0;
        const double e = explained(cx, ro, rl, bo, bl);
        if (e > best_e) {
            best_e = e;
            best_x = k / 2.0;
        }
    }
    double a = best_x - 0.5, c = best_x + 0.5;
    const double g = 0.5 * (sqrt(5.0) - 1.0);
    double x1 = c - g * (c - a), x2 = a + g * (c - a), f1, f2;
    double ro, rl;
    v.scale = p->scale * exp2(x1);
    residuals(cx, &v, rows, nr, NULL, NULL, &ro, &rl);
    f1 = explained(cx, ro, rl, bo, bl);
    v.scale = p->scale * exp2(x2);
    residuals(cx, &v, rows, nr, NULL, NULL, &ro, &rl);
    f2 = explained(cx, ro, rl, bo, bl);
    for (int it = 0; it < 22; it++) {
        if (f1 > f2) {
            c = x2;
            x2 = x1;
            f2 = f1;
            x1 = c - g * (c - a);
            v.scale = p->scale * exp2(x1);
            residuals(cx, &v, rows, nr, NULL, NULL, &ro, &rl);
            f1 = explained(cx, ro, rl, bo, bl);
        } else {
            a = x1;
            x1 = x2;
            f1 = f2;
            x2 = a + g * (c - a);
            v.scale = p->scale * exp2(x2);
            residuals(cx, &v, rows, nr, NULL, NULL, &ro, &rl);
            f2 = explained(cx, ro, rl, bo, bl);
        }
    }
    const double x = f1 > f2 ? x1 : x2;
    return exp2((f1 > f2 ? f1 : f2) >= best_e ? x : best_x);
}

static int near(double a, double b, double rel) { return fabs(a - b) <= rel * fabs(b); }

static void cand_scale(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    consider(L, "scale");
    dg_variant v = dg_variant_reference(p);
    const double f = fit_scale(cx, cx->fit, cx->nfit, cx->fit_o, cx->fit_l);
    v.scale = p->scale * f;
    const double e = score(cx, &v);
    const double used = v.scale, d = (double)p->d;
    const char *why = "";
    if (near(used, 1.0 / d, 0.02)) why = ": 1/d used instead of 1/sqrt(d)";
    else if (near(used, p->scale * p->scale, 0.02)) why = ": the scale applied twice";
    else if (near(used, 1.0, 0.02)) why = ": the scale not applied";
    else if (near(used, 1.0 / p->scale, 0.02)) why = ": the inverse of the scale";
    add(L, "scale", e, f, "factor %.4g: the kernel's scale is %.4g, expected %.4g%s", f, used, p->scale, why);
}

/* Does some sequence have q_len != k_len (the alignment then matters)? */
static int lengths_differ(const fa_problem *p)
{
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq s = fa_problem_seq(p, b);
        if (s.q_len > 0 && s.q_len != s.k_len) return 1;
    }
    return 0;
}

static void cand_align(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    /* the alignment changes the result when the lengths differ and it places
     * something: a bounded side of the band, or the ALiBi distances |i + diag - j| */
    const int band = p->window_left >= 0 || p->window_right >= 0;
    if (!lengths_differ(p) || (!band && !p->alibi.data)) return;
    consider(L, "causal-top-left");
    dg_variant v = dg_variant_reference(p);
    v.align = p->top_left ? 0 : 1;
    const double e = score(cx, &v);
    const char *what = band ? (p->alibi.data ? "the mask and the ALiBi distances" : "the mask")
                            : "the ALiBi distances";
    if (p->top_left)
        add(L, "causal-top-left", e, 1.0,
            "the kernel aligns %s bottom-right (FlashAttention's), the check expected top-left "
            "(--align top-left was given)", what);
    else
        add(L, "causal-top-left", e, 0.0,
            "the kernel aligns %s top-left (PyTorch SDPA's is_causal); if that is its contract, "
            "check with --align top-left", what);
}

/* varlen-leak: the keys of a sequence run into its neighbours or into padding. */
static void cand_varlen_leak(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!p->cu_seqlens_q || p->batch < 1) return;
    static const struct {
        dg_keys_mode m;
        const char *what;
    } modes[] = {
        {DG_KEYS_MAXLEN, "each sequence attends to max_seqlen_k keys from its start: into the next sequence"},
        {DG_KEYS_TO_END, "each sequence attends to every key from its start to the end of the packed batch"},
        {DG_KEYS_IGNORE_USED, "seqused_k ignored: each sequence attends to its whole cu_seqlens_k span (padding)"},
        {DG_KEYS_FROM_START, "each sequence attends to every key before its own: the previous sequences"},
        {DG_KEYS_GLOBAL, "cu_seqlens ignored: the packed batch attended as one sequence"},
    };
    dg_variant vs[5];
    int idx[5], nv = 0;
    for (int x = 0; x < 5; x++) {
        if (modes[x].m == DG_KEYS_IGNORE_USED && !p->seqused_k) continue;
        if (p->batch < 2 && modes[x].m != DG_KEYS_IGNORE_USED && modes[x].m != DG_KEYS_TO_END) continue;
        vs[nv] = dg_variant_reference(p);
        vs[nv].keys = modes[x].m;
        idx[nv++] = x;
    }
    if (!nv) return;
    consider(L, "varlen-leak");
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "varlen-leak", e, (double)modes[idx[best]].m, "%s", modes[idx[best]].what);
}

/* varlen-offset: cu_seqlens_q or cu_seqlens_k read one (or two) rows off. */
static void cand_varlen_offset(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!p->cu_seqlens_q) return;
    consider(L, "varlen-offset");
    static const int shifts[4] = {-1, 1, -2, 2};
    dg_variant vs[20];
    int side[20], sh[20], nv = 0;
    for (int k = 0; k < 3; k++)
        for (int x = 0; x < 4; x++) {
            vs[nv] = dg_variant_reference(p);
            if (k != 1) vs[nv].k_shift = shifts[x];
            if (k != 0) vs[nv].q_shift = shifts[x];
            side[nv] = k;
            sh[nv++] = shifts[x];
            /* keys shifted past either end of the packed K/V (late: the last sequence's end,
             * early: the first's start) may be left out with the diagonal kept where the
             * full count puts it (above), or the sequence may end there, its count and so its
             * diagonal shrinking: what a kernel does that bounds its reads by the tensor, or
             * cu_seqlens_k off by one everywhere but the last entry (still total_k). Both are
             * this offset; on a tie (bottom-right alignment makes them equal at the start)
             * the first listed wins. */
            if (k != 1) {
                vs[nv] = vs[nv - 1];
                vs[nv].k_clip = 1;
                side[nv] = k;
                sh[nv++] = shifts[x];
            }
        }
    int best;
    const double e = best_of(cx, vs, nv, &best);
    static const char *const what[3] = {"keys and values", "queries", "queries, keys and values"};
    add(L, "varlen-offset", e, (double)sh[best],
        "each sequence's %s read %d row%s %s: cu_seqlens_%s off by %+d", what[side[best]], abs(sh[best]),
        abs(sh[best]) == 1 ? "" : "s", sh[best] > 0 ? "late" : "early",
        side[best] == 0 ? "k" : side[best] == 1 ? "q" : "q and cu_seqlens_k", sh[best]);
}

/* paged-index: a wrong page of the block table. */
static void cand_paged(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!p->block_table) return;
    consider(L, "paged-index");
    dg_variant vs[7];
    char what[7][112];
    int nv = 0;
    for (int x = -1; x <= 1; x += 2) {
        vs[nv] = dg_variant_reference(p);
        vs[nv].page = DG_PAGE_ENTRY;
        vs[nv].page_delta = x;
        snprintf(what[nv++], sizeof what[0], "block_table[b][r / page_size %+d]: the %s logical page", x,
                 x > 0 ? "next" : "previous");
        vs[nv] = dg_variant_reference(p);
        vs[nv].page = DG_PAGE_PHYS;
        vs[nv].page_delta = x;
        snprintf(what[nv++], sizeof what[0], "block_table[b][r / page_size] %+d: the physical page one off", x);
        if (p->batch > 1) {
            vs[nv] = dg_variant_reference(p);
            vs[nv].page = DG_PAGE_TABLE_ROW;
            vs[nv].page_delta = x;
            snprintf(what[nv++], sizeof what[0], "block_table[b %+d]: another sequence's row of the table", x);
        }
    }
    vs[nv] = dg_variant_reference(p);
    vs[nv].page = DG_PAGE_IDENTITY;
    snprintf(what[nv++], sizeof what[0], "the block table ignored: pages read in order (b * max_pages + r / page_size)");
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "paged-index", e, (double)vs[best].page_delta, "%s", what[best]);
}

/* kv-append-offset: new keys placed one slot off, or one key too few/many attended. */
static void cand_append(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!p->cache_seqlens) return;
    consider(L, "kv-append-offset");
    dg_variant vs[5];
    char what[5][112];
    double par[5];
    int nv = 0;
    for (int x = -1; x <= 1; x += 2) {
        vs[nv] = dg_variant_reference(p);
        vs[nv].len_delta = x;
        par[nv] = x;
        snprintf(what[nv++], sizeof what[0], "attention over cache_seqlens + seqlen_new %+d keys", x);
        if (p->k_new.data) {
            vs[nv] = dg_variant_reference(p);
            vs[nv].new_at = x;
            par[nv] = x;
            snprintf(what[nv++], sizeof what[0], "new keys appended at cache_seqlens %+d (one slot off)", x);
        }
    }
    if (p->seqlen_new > 0) {
        vs[nv] = dg_variant_reference(p);
        vs[nv].no_new = 1;
        par[nv] = (double)-p->seqlen_new;
        snprintf(what[nv++], sizeof what[0], "attention over the cache_seqlens cached keys only: the %lld new keys left out",
                 (long long)p->seqlen_new);
    }
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "kv-append-offset", e, par[best], "%s", what[best]);
}

static void cand_softcap(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!(p->softcap > 0)) return;
    consider(L, "softcap-missing");
    dg_variant v = dg_variant_reference(p);
    v.softcap = 0.0;
    add(L, "softcap-missing", score(cx, &v), p->softcap, "softcap %g not applied", p->softcap);
    consider(L, "softcap-order");
    dg_variant vs[2];
    int nv = 0;
    vs[nv] = dg_variant_reference(p);
    vs[nv++].cap_mode = DG_CAP_BEFORE_SCALE;
    if (p->window_left >= 0 || p->window_right >= 0) {
        vs[nv] = dg_variant_reference(p);
        vs[nv++].cap_mode = DG_CAP_AFTER_MASK;
    }
    int best;
    const double e = best_of(cx, vs, nv, &best);
    if (vs[best].cap_mode == DG_CAP_BEFORE_SCALE)
        add(L, "softcap-order", e, 1.0, "the cap applied to q.k before the scale: scale * cap(q.k)");
    else
        add(L, "softcap-order", e, 2.0, "the cap applied after the mask: masked keys kept at -softcap");
}

static void cand_lse(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!cx->lt) return;
    consider(L, "lse-log2");
    dg_variant vs[2];
    vs[0] = dg_variant_reference(p);
    vs[0].lse = DG_LSE_LOG2;
    vs[1] = dg_variant_reference(p);
    vs[1].lse = DG_LSE_LN2_TWICE;
    int best;
    const double e = best_of(cx, vs, 2, &best);
    if (best == 0) add(L, "lse-log2", e, 1.0 / DG_LN2, "LSE in log base 2 (natural LSE x 1.4427)");
    else add(L, "lse-log2", e, DG_LN2, "LSE converted by ln 2 twice (natural LSE x 0.6931)");
    consider(L, "lse-unscaled");
    dg_variant u = dg_variant_reference(p);
    u.lse = DG_LSE_UNSCALED;
    add(L, "lse-unscaled", score(cx, &u), 1.0, "LSE of the unscaled q.k (the scale %.4g left out of the LSE)",
        p->scale);
}

static void cand_window(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (p->window_left < 0 && p->window_right < 0) return;
    consider(L, "window-shift");
    dg_variant vs[12];
    char what[12][96];
    double par[12];
    int nv = 0;
    static const int shifts[4] = {-2, -1, 1, 2};
    for (int side = 0; side < 2; side++) {
        const int64_t w = side ? p->window_right : p->window_left;
        if (w < 0) continue;
        for (int x = 0; x < 4; x++) {
            if (w + shifts[x] < 0) continue;
            vs[nv] = dg_variant_reference(p);
            if (side) vs[nv].wr = w + shifts[x];
            else vs[nv].wl = w + shifts[x];
            snprintf(what[nv], sizeof what[nv], "%s window %lld instead of %lld (shift %+d)",
                     side ? "right" : "left", (long long)(w + shifts[x]), (long long)w, shifts[x]);
            par[nv++] = shifts[x];
        }
    }
    if (p->window_left >= 0 && p->window_right != p->window_left) {
        vs[nv] = dg_variant_reference(p);
        vs[nv].wr = p->window_left;
        snprintf(what[nv], sizeof what[nv], "a symmetric window (%lld, %lld): right = left",
                 (long long)p->window_left, (long long)p->window_left);
        par[nv++] = 0.0;
    }
    if (!nv) return;
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "window-shift", e, par[best], "%s", what[best]);
}

static void cand_empty(const dg_ctx *cx, dg_list *L)
{
    int any = 0;
    for (int64_t w = 0; w < cx->n && !any; w++) any = cx->lrf[w] == -INFINITY;
    if (!any) return;
    consider(L, "empty-row");
    dg_variant vs[3];
    vs[0] = dg_variant_reference(cx->p);
    vs[0].empty = DG_EMPTY_NAN;
    vs[1] = dg_variant_reference(cx->p);
    vs[1].empty = DG_EMPTY_MEAN_V;
    vs[2] = dg_variant_reference(cx->p); /* a kernel that guards the LSE but not O */
    vs[2].empty = DG_EMPTY_NAN_O;
    int best;
    const double e = best_of(cx, vs, 3, &best);
    add(L, "empty-row", e, (double)best,
        best == 0   ? "rows with no visible key give NaN (0/0: no l == 0 guard)"
        : best == 1 ? "rows with no visible key give mean(V) (a finite -inf sentinel: uniform weights)"
                    : "rows with no visible key give NaN in O (0/0: no l == 0 guard) while the LSE is guarded (infinite)");
}

static const int tiles[5] = {16, 32, 64, 128, 256};

static void cand_rescale(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    dg_variant vs[5];
    int nv = 0;
    for (int x = 0; x < 5; x++)
        if (tiles[x] < p->seqlen_k) {
            vs[nv] = dg_variant_reference(p);
            vs[nv++].tile = tiles[x];
        }
    if (!nv) return;
    consider(L, "missing-rescale");
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "missing-rescale", e, vs[best].tile,
        "online softmax over %d-key tiles without rescaling the accumulator when the row max rises",
        vs[best].tile);
}

/* Is sampled row w's tested O exactly zero everywhere while the reference is not? */
static int row_unwritten(const dg_ctx *cx, int64_t w)
{
    const int64_t dv = cx->p->dv;
    int ref_nonzero = 0;
    for (int64_t c = 0; c < dv; c++) {
        if (cx->ot[w * dv + c] != 0.0) return 0;
        if (cx->orf[w * dv + c] != 0.0) ref_nonzero = 1;
    }
    return ref_nonzero;
}

/* O residual (and LSE residual) of "the kernel wrote nothing": every tested row
 * left exactly zero predicted as zero (its LSE as 0 when the tested LSE is 0),
 * every other row as the reference. */
static void cand_unwritten(const dg_ctx *cx, dg_list *L)
{
    int64_t rows = 0;
    double so = 0.0, sl = 0.0;
    for (int64_t w = 0; w < cx->n; w++) {
        double a = cx->ro_ref[w], c = cx->rl_ref[w];
        if (row_unwritten(cx, w)) {
            rows++;
            a = 0.0;
            if (cx->lt && cx->lt[w] == 0.0) c = 0.0;
        }
        so += a;
        sl += c;
    }
    if (!rows) return;
    consider(L, "output-unwritten");
    add(L, "output-unwritten", explained(cx, so, sl, cx->r0o, cx->r0l), (double)rows,
        "%lld of %lld sampled rows are exactly 0 where the reference is not: the kernel did not write them",
        (long long)rows, (long long)cx->n);
}

/* Does some sequence's key count not fill whole tiles of t keys? */
static int ragged_keys(const fa_problem *p, int64_t t)
{
    for (int64_t b = 0; b < p->batch; b++)
        if (fa_problem_seq(p, b).k_len % t != 0) return 1;
    return 0;
}

static void cand_tail(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    dg_variant vs[5];
    int nv = 0;
    for (int x = 0; x < 5; x++)
        if (ragged_keys(p, tiles[x])) {
            vs[nv] = dg_variant_reference(p);
            vs[nv++].pad_tile = tiles[x];
        }
    /* padded keys sit right of every real key: a bounded right window hides them
     * from every row whose band ends before seqlen_k */
    if (!nv) return;
    consider(L, "tail-tile");
    int best;
    const double e = best_of(cx, vs, nv, &best);
    if (cx->sig_o) {
        /* zero keys dilute every row towards O = 0 (with a 256-key tile and a few
         * real keys, to almost 0): the model must explain the output clearly better
         * than "O = 0" does, or an unwritten output would read as a tail tile */
        double rt, lt_, rz = 0.0;
        if (residuals(cx, &vs[best], NULL, cx->n, NULL, NULL, &rt, &lt_) != 0) return;
        for (int64_t x = 0; x < cx->n * p->dv; x++) rz += o_diff(cx->ot[x], 0.0, cx->pen);
        if (!(rt < 0.25 * rz)) return;
    }
    const int64_t t = vs[best].pad_tile, padded = (p->seqlen_k + t - 1) / t * t;
    if (!uniform(p)) {
        add(L, "tail-tile", e, (double)t,
            "keys past each sequence's k_len up to a multiple of %lld read as zero K and V (score 0): the last "
            "tile is not masked", (long long)t);
        return;
    }
    add(L, "tail-tile", e, (double)padded,
        "keys %lld..%lld read as zero K and V (score 0): the last %lld-key tile is not masked at seqlen_k %lld",
        (long long)p->seqlen_k, (long long)padded - 1, (long long)t, (long long)p->seqlen_k);
}

static void cand_gqa(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    const int64_t H = p->heads, Hk = p->heads_k, n = cx->n;
    if (Hk <= 1 || Hk >= H) return;
    consider(L, "gqa-head-map");
    double *ro = malloc((size_t)(Hk * n) * sizeof *ro), *rl = malloc((size_t)(Hk * n) * sizeof *rl);
    int64_t *map = malloc((size_t)H * sizeof *map);
    if (!ro || !rl || !map) {
        free(ro);
        free(rl);
        free(map);
        return;
    }
    int64_t *rows = malloc((size_t)n * sizeof *rows);
    if (!rows) {
        free(ro);
        free(rl);
        free(map);
        return;
    }
    for (int64_t j = 0; j < Hk; j++) {
        /* a row's own kv head gives the reference: its residuals are known */
        int64_t nr = 0;
        for (int64_t w = 0; w < n; w++) {
            if (fa_kv_head(p, cx->it[w].h) == j) {
                ro[j * n + w] = cx->ro_ref[w];
                rl[j * n + w] = cx->rl_ref[w];
            } else {
                rows[nr++] = w;
            }
        }
        dg_variant v = dg_variant_reference(p);
        v.kvh = j;
        double so, sl;
        residuals(cx, &v, rows, nr, ro + j * n, rl + j * n, &so, &sl);
    }
    free(rows);
    const double wo = cx->sig_o && cx->r0o > 0 ? 1.0 / cx->r0o : 0.0;
    const double wl = cx->sig_l && cx->r0l > 0 ? 1.0 / cx->r0l : 0.0;
    for (int64_t h = 0; h < H; h++) {
        double best = INFINITY;
        map[h] = fa_kv_head(p, h);
        for (int64_t j = 0; j < Hk; j++) {
            double t = 0.0;
            for (int64_t w = 0; w < n; w++)
                if (cx->it[w].h == h) t += wo * ro[j * n + w] + wl * rl[j * n + w];
            if (t < best) {
                best = t;
                map[h] = j;
            }
        }
    }
    double so = 0.0, sl = 0.0;
    for (int64_t w = 0; w < n; w++) {
        const int64_t j = map[cx->it[w].h];
        so += ro[j * n + w];
        sl += rl[j * n + w];
    }
    const double e = explained(cx, so, sl, cx->r0o, cx->r0l);
    char text[160];
    size_t len = 0;
    int modulo = 1;
    for (int64_t h = 0; h < H; h++) {
        if (map[h] != h % Hk) modulo = 0;
        if (len < 100) len += (size_t)snprintf(text + len, sizeof text - len, "%s%lld->%lld", h ? " " : "",
                                               (long long)h, (long long)map[h]);
        else if (len < 104) len += (size_t)snprintf(text + len, sizeof text - len, " ...");
    }
    add(L, "gqa-head-map", e, modulo ? 1.0 : 0.0, "query head -> kv head %s%s (expected h / %lld)", text,
        modulo ? " = h % heads_k" : "", (long long)(H / Hk));
    free(ro);
    free(rl);
    free(map);
}

static void cand_layout(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (p->heads < 2 || p->seqlen_q < 2 || !uniform(p)) return;
    consider(L, "layout-transposed");
    dg_variant vs[2];
    vs[0] = dg_variant_reference(p);
    vs[0].layout = DG_LAYOUT_OUT_BHSD;
    vs[1] = dg_variant_reference(p);
    vs[1].layout = DG_LAYOUT_ALL_BHSD;
    const int nv = p->heads_k > 1 || p->seqlen_k > 1 ? 2 : 1;
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "layout-transposed", e, (double)(best + 1),
        best == 0 ? "O written as [batch, heads, seqlen_q, d_v] into the [batch, seqlen_q, heads, d_v] buffer"
                  : "Q, K, V read and O written as [batch, heads, seqlen, d] over [batch, seqlen, heads, d] buffers");
}

/* descale (low precision): the Q, K or V descale of some (batch, kv head) off by a factor.
 * A Q or K descale scales that group's logits (fitted like `scale`, on the group's rows), a V
 * descale its output rows (least squares); per group the better, when it removes most of the
 * group's error. All groups off by one factor is `scale`'s (or every descale's) business. */
static void cand_descale(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!cx->qfmt || !cx->sig_o) return;
    consider(L, "descale");
    const int64_t n = cx->n, dv = p->dv, G = p->batch * p->heads_k;
    int64_t *rows = malloc((size_t)n * sizeof *rows);
    double *ro = malloc((size_t)n * sizeof *ro), *rl = malloc((size_t)n * sizeof *rl);
    if (!rows || !ro || !rl) {
        free(rows);
        free(ro);
        free(rl);
        return;
    }
    double so = 0.0, sl = 0.0, worst = 0.0, fac_worst = 1.0;
    int64_t n_off = 0, n_same = 0;
    double first_fac = 0.0;
    char text[160] = "";
    size_t len = 0;
    for (int64_t gi = 0; gi < G; gi++) {
        const int64_t b = gi / p->heads_k, kh = gi % p->heads_k;
        int64_t nr = 0;
        double go = 0.0, gl = 0.0, tr = 0.0, rr = 0.0;
        for (int64_t w = 0; w < n; w++)
            if (cx->it[w].b == b && fa_kv_head(p, cx->it[w].h) == kh) {
                rows[nr++] = w;
                go += cx->ro_ref[w];
                gl += cx->rl_ref[w];
                for (int64_t c = 0; c < dv; c++) {
                    tr += cx->ot[w * dv + c] * cx->orf[w * dv + c];
                    rr += cx->orf[w * dv + c] * cx->orf[w * dv + c];
                }
            }
        double bo = go, bl = gl, fac = 1.0;
        int which = 0; /* 0 none, 1 Q or K, 2 V */
        if (nr > 0 && go > 0.01 * cx->r0o && go > cx->floor_o * (double)nr / (double)n) {
            /* V: O scaled by f, LSE unchanged */
            const double f = rr > 0 ? tr / rr : 1.0;
            double vo = 0.0;
            for (int64_t x = 0; x < nr; x++) {
                const int64_t w = rows[x];
                for (int64_t c = 0; c < dv; c++) vo += o_diff(cx->ot[w * dv + c], f * cx->orf[w * dv + c], cx->pen);
            }
            /* Q or K: the logits scaled, fitted on (up to) the group's DG_FIT_ROWS worst rows */
            int64_t fr[DG_FIT_ROWS], nf = 0;
            double fo = 0.0, fl = 0.0;
            for (int64_t x = 0; x < nr; x++) { /* keep the DG_FIT_ROWS largest, largest first */
                const int64_t w = rows[x];
                int64_t y = nf < DG_FIT_ROWS ? nf++ : DG_FIT_ROWS - 1;
                if (y == DG_FIT_ROWS - 1 && nf == DG_FIT_ROWS && x >= DG_FIT_ROWS &&
                    cx->ro_ref[fr[y]] >= cx->ro_ref[w])
                    continue;
                while (y > 0 && cx->ro_ref[fr[y - 1]] < cx->ro_ref[w]) {
                    fr[y] = fr[y - 1];
                    y--;
                }
                fr[y] = w;
            }
            for (int64_t x = 0; x < nf; x++) {
                fo += cx->ro_ref[fr[x]];
                fl += cx->rl_ref[fr[x]];
            }
            const double fq = fit_scale(cx, fr, nf, fo, fl);
            dg_variant v = dg_variant_reference(p);
            v.scale = p->scale * fq;
            double qo, ql;
            if (residuals(cx, &v, rows, nr, NULL, NULL, &qo, &ql) != 0) qo = ql = INFINITY;
            const double eq = explained(cx, qo, ql, go, gl), ev = explained(cx, vo, gl, go, gl);
            if (eq >= ev && eq > 0.5) {
                which = 1;
                fac = fq;
                bo = qo;
                bl = ql;
            } else if (ev > 0.5) {
                which = 2;
                fac = f;
                bo = vo;
            }
        }
        so += bo;
        sl += bl;
        if (which) {
            n_off++;
            if (n_off == 1) first_fac = fac;
            if (near(fac, first_fac, 0.02)) n_same++;
            if (go - bo > worst) {
                worst = go - bo;
                fac_worst = fac;
            }
            if (len < 110)
                len += (size_t)snprintf(text + len, sizeof text - len, "%s(batch %lld, kv head %lld) %s x%.3g",
                                        len ? ", " : "", (long long)b, (long long)kh, which == 1 ? "Q or K" : "V",
                                        fac);
            else if (len < 114)
                len += (size_t)snprintf(text + len, sizeof text - len, ", ...");
        }
    }
    free(rows);
    free(ro);
    free(rl);
    if (!n_off) return;
    if (n_off == G && n_same == G && G > 1) return; /* one factor everywhere: the `scale` candidate's */
    add(L, "descale", explained(cx, so, sl, cx->r0o, cx->r0l), fac_worst, "%lld of %lld descales off: %s",
        (long long)n_off, (long long)G, text);
}

/* p-saturation (low precision): P~ = c * exp(s - running max) went past the P format's largest
 * value and was clamped there in P.V while the row sum kept the unclamped P~ (FlashAttention-4
 * before its PR 2717). c (a power of 2^(1/4)), the block size and the block order are fitted. */
static void cand_psat(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!cx->qfmt || !cx->sig_o) return;
    const int pf = fa_lp_p_format(cx->qfmt);
    const double pmax = pf == FA_QF_E5M2 ? 57344.0 : pf == FA_QF_E2M1 ? 6.0 : 448.0;
    consider(L, "p-saturation");
    enum { NC = 49 };
    static const int blocks[2] = {64, 128};
    dg_variant vs[2 * 2 * NC];
    int nv = 0;
    for (int bk = 0; bk < 2; bk++)
        for (int rev = 1; rev >= 0; rev--)
            for (int k = 0; k < NC; k++) {
                vs[nv] = dg_variant_reference(p);
                vs[nv].psat_c = pmax * exp2(0.25 * (k + 1));
                vs[nv].psat_max = pmax;
                vs[nv].psat_block = blocks[bk];
                vs[nv++].psat_reverse = rev;
            }
    int best;
    const double e = best_of(cx, vs, nv, &best);
    const dg_variant *v = &vs[best];
    add(L, "p-saturation", e, v->psat_c,
        "P saturated at %g (%s's max) in P.V, the row sums unclamped: P scaled by ~2^%.2f before rounding; "
        "blocks of %d keys, %s", pmax, fa_qformat_name(pf), log2(v->psat_c), v->psat_block,
        v->psat_reverse ? "last to first" : "first to last");
}

/* split-combine: a split-KV kernel's partials (O_s, LSE_s) combined wrongly. The number of
 * splits (2 .. 8, keys in chunks of ceil(seqlen_k / n)) and the way are fitted. */
static void cand_split(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (p->seqlen_k < 4) return;
    consider(L, "split-combine");
    static const struct {
        dg_split_mode m;
        const char *what;
    } modes[] = {
        {DG_SPLIT_MEAN, "the splits' partial outputs averaged (no LSE weights)"},
        {DG_SPLIT_OWN_MAX, "the partials weighted by their sums without rescaling to a common max"},
        {DG_SPLIT_LAST, "only the last split's partial (O, LSE) kept"},
        {DG_SPLIT_LSE_MAX, "the combined LSE taken as the max of the splits' LSEs"},
    };
    dg_variant vs[4 * 7];
    int mi[4 * 7], nv = 0;
    for (int x = 0; x < 4; x++) {
        if (modes[x].m == DG_SPLIT_LSE_MAX && !cx->lt) continue;
        for (int n = 2; n <= 8; n++) {
            if (n > p->seqlen_k) break;
            vs[nv] = dg_variant_reference(p);
            vs[nv].split_mode = modes[x].m;
            vs[nv].split_n = n;
            mi[nv++] = x;
        }
    }
    if (!nv) return;
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "split-combine", e, (double)vs[best].split_n, "%d splits of the keys: %s", vs[best].split_n,
        modes[mi[best]].what);
}

/* sink-missing: a kernel with attention sinks left the sink out of O's denominator, of the
 * LSE, or of both (which of the three is fitted; the LSE-only ones need the tested LSE). */
static void cand_sink(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!p->sinks.data) return;
    consider(L, "sink-missing");
    static const struct {
        dg_sink_mode m;
        const char *what;
    } modes[] = {
        {DG_SINK_OUT, "the sink left out of the softmax denominator and of the LSE"},
        {DG_SINK_OUT_O, "the sink left out of O's denominator (the LSE has it)"},
        {DG_SINK_OUT_LSE, "the sink left out of the LSE (O has it)"},
    };
    dg_variant vs[3];
    int mi[3], nv = 0;
    for (int x = 0; x < 3; x++) {
        if (modes[x].m != DG_SINK_OUT && !cx->lt) continue;
        vs[nv] = dg_variant_reference(p);
        vs[nv].sink = modes[x].m;
        mi[nv++] = x;
    }
    int best;
    const double e = best_of(cx, vs, nv, &best);
    add(L, "sink-missing", e, (double)vs[best].sink, "%s", modes[mi[best]].what);
}

/* dropout-mask: a kernel with dropout applied the keep-mask Z wrongly: not at all, without the
 * 1 / (1 - p) scale, transposed, or shifted by -2 .. +2 keys or rows (which one is fitted). The
 * LSE keeps the undropped scores in every way, so only O tells them apart. */
static void cand_dropout(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!p->keep || !cx->sig_o) return;
    consider(L, "dropout-mask");
    dg_variant vs[12];
    int nv = 0;
    const dg_drop_mode plain[3] = {DG_DROP_NONE, DG_DROP_NO_SCALE, DG_DROP_TRANSPOSED};
    for (int x = 0; x < 3; x++) {
        if (plain[x] == DG_DROP_TRANSPOSED && p->seqlen_q < 2) continue;
        vs[nv] = dg_variant_reference(p);
        vs[nv++].drop = plain[x];
    }
    for (int dir = 0; dir < 2; dir++)
        for (int64_t sh = -2; sh <= 2; sh++) {
            if (!sh || (dir == 1 && p->seqlen_q < 2)) continue;
            vs[nv] = dg_variant_reference(p);
            vs[nv].drop = dir ? DG_DROP_ROW_SHIFT : DG_DROP_KEY_SHIFT;
            vs[nv++].drop_shift = sh;
        }
    int best;
    const double e = best_of(cx, vs, nv, &best);
    const dg_variant *v = &vs[best];
    switch (v->drop) {
    case DG_DROP_NONE:
        add(L, "dropout-mask", e, 0.0, "the keep-mask not applied");
        break;
    case DG_DROP_NO_SCALE:
        add(L, "dropout-mask", e, 1.0, "the keep-mask applied without the 1/(1-p) scale");
        break;
    case DG_DROP_TRANSPOSED:
        add(L, "dropout-mask", e, 0.0, "the keep-mask read transposed ([seqlen_k][seqlen_q])");
        break;
    default:
        add(L, "dropout-mask", e, (double)v->drop_shift, "the keep-mask read %+lld %s off", (long long)v->drop_shift,
            v->drop == DG_DROP_KEY_SHIFT ? "keys" : "rows");
        break;
    }
}

/* ------------------------------------------------------------------------ */
/* Rotary: rotary-pairing, rotary-offset                                     */
/* ------------------------------------------------------------------------ */

/* Where a kernel took sequence b's base position from (the reference: cache_seqlens[b]). */
enum { ROT_BASE_CS, ROT_BASE_AFTER_APPEND, ROT_BASE_LEFTPAD, ROT_BASE_CBI };

/* How a kernel rotated q and k_new: each side's pairing, whether it rotated at all, and the
 * positions: query row i at (q_base ? base(b) : 0) + (q_per_row ? i : 0) + q_off,
 * new key t at (k_base ? base(b) : 0) + t + k_off, base(b) per base_kind (rot_base). */
typedef struct dg_rot_rule {
    int inter_q, inter_k;
    int q_none, k_none;
    int q_base, k_base;
    int q_per_row;
    int base_kind;
    int64_t q_off, k_off;
} dg_rot_rule;

/* Sequence b's base position under rule r: cache_seqlens[b] (the reference), taken after the
 * append (+ seqlen_new), counted from the left padding (- cache_leftpad[b]), or read through
 * cache_batch_idx (cache_seqlens[cache_batch_idx[b]]; only offered when that index is < batch). */
static int64_t rot_base(const fa_problem *p, const dg_rot_rule *r, int64_t b)
{
    switch (r->base_kind) {
    case ROT_BASE_AFTER_APPEND: return (int64_t)p->cache_seqlens[b] + p->seqlen_new;
    case ROT_BASE_LEFTPAD: return (int64_t)p->cache_seqlens[b] - p->cache_leftpad[b];
    case ROT_BASE_CBI: return p->cache_seqlens[p->cache_batch_idx[b]];
    default: return p->cache_seqlens[b];
    }
}

static dg_rot_rule rot_rule_reference(const fa_problem *p)
{
    dg_rot_rule r;
    memset(&r, 0, sizeof r);
    r.inter_q = r.inter_k = p->rot_interleaved;
    r.q_base = r.k_base = 1;
    r.q_per_row = p->rot_q_per_row;
    return r;
}

/* Does every position the rule reads lie in the tables [0, seqlen_ro)? (A kernel reading
 * past them reads memory we do not have: such a rule is not evaluated.) */
static int rot_valid(const fa_problem *p, const dg_rot_rule *r)
{
    const int64_t ro = p->rot_cos.shape[0];
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t cs = rot_base(p, r, b);
        if (!r->q_none && p->seqlen_q > 0) {
            const int64_t lo = (r->q_base ? cs : 0) + r->q_off, hi = lo + (r->q_per_row ? p->seqlen_q - 1 : 0);
            if (lo < 0 || hi >= ro) return 0;
        }
        if (!r->k_none && p->seqlen_new > 0) {
            const int64_t lo = (r->k_base ? cs : 0) + r->k_off, hi = lo + p->seqlen_new - 1;
            if (lo < 0 || hi >= ro) return 0;
        }
    }
    return 1;
}

/* Row (b, i, h) of src (dims past rotary_dim copied) into the same row of dst, rotated at
 * position pos with the given pairing, or copied when `none`; rounded to dst's dtype as
 * fa_rotary_apply rounds to the input's. */
static void rot_row(const fa_problem *p, const fa_tensor *src, const fa_tensor *dst, int64_t b, int64_t i, int64_t h,
                    int64_t pos, int inter, int none)
{
    const int64_t d = src->shape[3], half = p->rot_dim / 2;
    for (int64_t c = none ? 0 : p->rot_dim; c < d; c++)
        fa_store_f64(dst, fa_off4(dst, b, i, h, c), fa_load_f64(src, fa_off4(src, b, i, h, c)));
    if (none) return;
    for (int64_t x = 0; x < half; x++) {
        const int64_t c1 = inter ? 2 * x : x, c2 = inter ? 2 * x + 1 : x + half;
        const double cs = fa_load_f64(&p->rot_cos, pos * p->rot_cos.stride[0] + x * p->rot_cos.stride[1]);
        const double sn = fa_load_f64(&p->rot_sin, pos * p->rot_sin.stride[0] + x * p->rot_sin.stride[1]);
        const double x1 = fa_load_f64(src, fa_off4(src, b, i, h, c1));
        const double x2 = fa_load_f64(src, fa_off4(src, b, i, h, c2));
        fa_store_f64(dst, fa_off4(dst, b, i, h, c1), x1 * cs - x2 * sn);
        fa_store_f64(dst, fa_off4(dst, b, i, h, c2), x1 * sn + x2 * cs);
    }
}

/* The problem with q and k_new rotated by rule r (into rq, rk): the q rows of the sampled
 * rows listed (NULL: all n), every k_new row. */
static void rot_apply(const dg_ctx *cx, const dg_rot_rule *r, const int64_t *rows, int64_t nrows, fa_problem *p2,
                      const fa_tensor *rq, const fa_tensor *rk)
{
    const fa_problem *p = cx->p;
    for (int64_t x = 0; x < nrows; x++) {
        const dg_item *it = &cx->it[rows ? rows[x] : x];
        const fa_seq s = fa_problem_seq(p, it->b);
        const int64_t pos = (r->q_base ? rot_base(p, r, it->b) : 0) + (r->q_per_row ? it->i : 0) + r->q_off;
        rot_row(p, cx->raw_q, rq, s.q_batch, s.q_start + it->i, it->h, pos, r->inter_q, r->q_none);
    }
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t t = 0; t < p->seqlen_new; t++) {
            const int64_t pos = (r->k_base ? rot_base(p, r, b) : 0) + t + r->k_off;
            for (int64_t kh = 0; kh < p->heads_k; kh++)
                rot_row(p, cx->raw_kn, rk, b, t, kh, pos, r->inter_k, r->k_none);
        }
    *p2 = *p;
    p2->q = *rq;
    p2->k_new = *rk;
}

/* Explained fraction of rule r on the rows listed (NULL: all), against the reference's
 * residuals bo, bl on them; NaN on allocation failure. */
static double rot_score(const dg_ctx *cx, const dg_rot_rule *r, const int64_t *rows, int64_t nrows, double bo,
                        double bl, const fa_tensor *rq, const fa_tensor *rk)
{
    fa_problem p2;
    rot_apply(cx, r, rows, nrows, &p2, rq, rk);
    dg_ctx c2 = *cx;
    c2.p = &p2;
    c2.dots = NULL;
    const dg_variant v = dg_variant_reference(&p2);
    double ro, rl;
    if (residuals(&c2, &v, rows, nrows, NULL, NULL, &ro, &rl) != 0) return NAN;
    return explained(cx, ro, rl, bo, bl);
}

/* The best of nv rules (best_of's way: compared on the fit rows when there are many rows,
 * its finalists_kept scored on all); *best = -1 when no rule is valid. */
static double rot_best(const dg_ctx *cx, const dg_rot_rule *rs, int nv, const fa_tensor *rq, const fa_tensor *rk,
                       int *best)
{
    const int sub = nv > 1 && cx->n > 2 * cx->nfit;
    dg_finalists f = {0};
    double top = -INFINITY;
    *best = -1;
    for (int x = 0; x < nv; x++) {
        if (!rot_valid(cx->p, &rs[x])) continue;
        const double e = sub ? rot_score(cx, &rs[x], cx->fit, cx->nfit, cx->fit_o, cx->fit_l, rq, rk)
                             : rot_score(cx, &rs[x], NULL, cx->n, cx->r0o, cx->r0l, rq, rk);
        if (isnan(e)) return NAN;
        if (sub) finalist_add(&f, x, e);
        else if (e > top) {
            top = e;
            *best = x;
        }
    }
    for (int k = 0; k < finalists_kept(&f); k++) { /* as best_of */
        const double e = rot_score(cx, &rs[f.idx[k]], NULL, cx->n, cx->r0o, cx->r0l, rq, rk);
        if (isnan(e)) return NAN;
        if (e > top) {
            top = e;
            *best = f.idx[k];
        }
    }
    return top;
}

static const char *pairing_name(int inter) { return inter ? "(2i, 2i+1) (GPT-J, interleaved)" : "(i, i + rotary_dim/2) (GPT-NeoX)"; }

/* rotary-pairing: q and k_new (or one of them) rotated with the other pairing.
 * rotary-offset: the positions wrong: q and k_new, q or k_new off by a fitted offset in
 * -16 .. +16 (a fit on the edge of the offsets tried reported as a bound, not as the offset); the query rule of the other mask kind (every query at cache_seqlens[b] vs query i
 * at cache_seqlens[b] + i); new keys at t, or q and k_new from position 0 (cos/sin not sliced
 * at cache_seqlens); rotary not applied to q, to k_new, or to either. */
static void cand_rotary(const dg_ctx *cx, dg_list *L)
{
    const fa_problem *p = cx->p;
    if (!cx->raw_q || !p->rot_dim) return;
    const fa_tensor *q = &p->q, *kn = &p->k_new;
    const size_t nq = (size_t)(q->shape[0] * q->shape[1] * q->shape[2] * q->shape[3]);
    const size_t nk = (size_t)(kn->shape[0] * kn->shape[1] * kn->shape[2] * kn->shape[3]);
    const size_t bq = fa_mul_sat(nq, fa_dtype_size(q->dtype)), bk = fa_mul_sat(nk, fa_dtype_size(kn->dtype));
    const size_t off = (bq + 63) & ~(size_t)63;
    char *buf = calloc(fa_add_sat(off, bk) ? fa_add_sat(off, bk) : 1, 1);
    if (!buf) return;
    fa_tensor rq, rk;
    fa_tensor_make(&rq, buf, q->dtype, 4, q->shape, NULL);
    fa_tensor_make(&rk, buf + off, kn->dtype, 4, kn->shape, NULL);
    const dg_rot_rule ref = rot_rule_reference(p);
    const int inter = p->rot_interleaved;
    int best;

    consider(L, "rotary-pairing");
    {
        static const char *const side[3] = {"q and k_new", "q only (k_new right)", "k_new only (q right)"};
        dg_rot_rule rs[3];
        for (int x = 0; x < 3; x++) {
            rs[x] = ref;
            if (x != 2) rs[x].inter_q = !inter;
            if (x != 1) rs[x].inter_k = !inter;
        }
        const double e = rot_best(cx, rs, 3, &rq, &rk, &best);
        if (best >= 0 && !isnan(e))
            add(L, "rotary-pairing", e, (double)!inter, "pairs %s used where %s was expected, on %s",
                pairing_name(!inter), pairing_name(inter), side[best]);
    }

    {
        enum { ROT_RANGE = 16, ROT_MAX = 3 * 2 * ROT_RANGE + 12 };
        dg_rot_rule rs[ROT_MAX];
        char what[ROT_MAX][160];
        double par[ROT_MAX];
        int side_of[ROT_MAX];
        int nv = 0;
        /* the named per-sequence rules first: on a tie (after-append with seqlen_new in range
         * equals the offset +seqlen_new) the named one wins */
        if (p->seqlen_new > 0) {
            rs[nv] = ref;
            rs[nv].base_kind = ROT_BASE_AFTER_APPEND;
            par[nv] = (double)p->seqlen_new;
            side_of[nv] = -1;
            snprintf(what[nv++], sizeof what[0], "q and k_new rotated at positions %+lld off (= seqlen_new: positions "
                     "from cache_seqlens taken after the append)", (long long)p->seqlen_new);
        }
        int any_pad = 0, cbi_ok = p->cache_batch_idx != NULL, cbi_diff = 0;
        for (int64_t b = 0; b < p->batch; b++) {
            any_pad |= p->cache_leftpad && p->cache_leftpad[b] != 0;
            if (p->cache_batch_idx) {
                const int64_t c = p->cache_batch_idx[b];
                if (c < 0 || c >= p->batch) cbi_ok = 0;
                else cbi_diff |= p->cache_seqlens[c] != p->cache_seqlens[b];
            }
        }
        if (any_pad) {
            rs[nv] = ref;
            rs[nv].base_kind = ROT_BASE_LEFTPAD;
            par[nv] = NAN;
            side_of[nv] = -1;
            snprintf(what[nv++], sizeof what[0], "positions counted from the left padding: cache_seqlens[b] - "
                     "cache_leftpad[b] (the cache indices are absolute: leftpad does not shift them)");
        }
        if (cbi_ok && cbi_diff) {
            rs[nv] = ref;
            rs[nv].base_kind = ROT_BASE_CBI;
            par[nv] = NAN;
            side_of[nv] = -1;
            snprintf(what[nv++], sizeof what[0], "positions read from cache_seqlens[cache_batch_idx[b]] instead of "
                     "cache_seqlens[b]");
        }
        const int off0 = nv;
        static const char *const side[3] = {"q and k_new", "q (k_new right)", "k_new (q right)"};
        for (int sd = 0; sd < 3; sd++)
            for (int dl = -ROT_RANGE; dl <= ROT_RANGE; dl++) {
                if (!dl) continue;
                rs[nv] = ref;
                if (sd != 2) rs[nv].q_off = dl;
                if (sd != 1) rs[nv].k_off = dl;
                par[nv] = dl;
                side_of[nv] = sd;
                snprintf(what[nv++], sizeof what[0], "%s rotated at positions %+d off (cos/sin sliced at "
                         "cache_seqlens %+d)", side[sd], dl, dl);
            }
        const int n_off = nv;
        int any_cached = 0;
        for (int64_t b = 0; b < p->batch; b++) any_cached |= p->cache_seqlens[b] > 0;
        if (p->seqlen_q > 1) {
            rs[nv] = ref;
            rs[nv].q_per_row = !ref.q_per_row;
            side_of[nv] = -1;
            par[nv] = NAN;
            snprintf(what[nv++], sizeof what[0], "%s", ref.q_per_row
                         ? "every query at cache_seqlens[b] (the non-causal rule) where query i is at cache_seqlens[b] + i"
                         : "query i at cache_seqlens[b] + i (the causal rule) where every query is at cache_seqlens[b]");
        }
        if (any_cached) {
            rs[nv] = ref;
            rs[nv].k_base = 0;
            side_of[nv] = -1;
            par[nv] = NAN;
            snprintf(what[nv++], sizeof what[0], "new key t rotated at position t instead of cache_seqlens[b] + t");
            rs[nv] = ref;
            rs[nv].k_base = rs[nv].q_base = 0;
            side_of[nv] = -1;
            par[nv] = NAN;
            snprintf(what[nv++], sizeof what[0], "q and k_new rotated from position 0: cos/sin not sliced at "
                     "cache_seqlens[b]");
        }
        static const char *const none[3] = {"rotary not applied to q (q used unrotated)",
                                            "rotary not applied to k_new (k_new used unrotated)",
                                            "rotary not applied to q nor k_new"};
        for (int x = 0; x < 3; x++) {
            rs[nv] = ref;
            rs[nv].q_none = x != 1;
            rs[nv].k_none = x != 0;
            side_of[nv] = -1;
            par[nv] = NAN;
            snprintf(what[nv++], sizeof what[0], "%s", none[x]);
        }
        /* +delta rules the cos/sin tables are too short for are not evaluated: say so in the
         * considered list (a `none` would otherwise hide that they were not tried) */
        int skip_from = 0;
        for (int x = off0; x < n_off; x++)
            if (par[x] > 0 && !rot_valid(p, &rs[x]) && (!skip_from || par[x] < skip_from)) skip_from = (int)par[x];
        if (skip_from) {
            char note[128];
            snprintf(note, sizeof note, "rotary-offset (+delta rules from %+d skipped: cos/sin has %lld rows; pass "
                     "longer tables)", skip_from, (long long)p->rot_cos.shape[0]);
            consider(L, note);
        } else
            consider(L, "rotary-offset");
        const double e = rot_best(cx, rs, nv, &rq, &rk, &best);
        if (best >= off0 && best < n_off && !isnan(e)) {
            /* A fit on the edge of what was tried (the end of the range, or the last offset
             * the cos/sin tables can serve) only bounds the offset: the true one may lie past it. */
            const int dl = (int)par[best];
            dg_rot_rule nx = rs[best];
            if (side_of[best] != 2) nx.q_off += dl > 0 ? 1 : -1;
            if (side_of[best] != 1) nx.k_off += dl > 0 ? 1 : -1;
            if (abs(dl) >= ROT_RANGE || !rot_valid(p, &nx)) {
                snprintf(what[best], sizeof what[0], "%s rotated at positions %s%d off (the edge of the offsets "
                         "fitted, %s: the true offset may lie past it)", side[side_of[best]],
                         dl > 0 ? ">= +" : "<= ", dl,
                         abs(dl) >= ROT_RANGE ? "-16 .. +16" : "cos/sin too short for more");
                par[best] = NAN;
            }
        }
        if (best >= 0 && !isnan(e)) add(L, "rotary-offset", e, par[best], "%s", what[best]);
    }
    free(buf);
}

/* ------------------------------------------------------------------------ */
/* Entry point                                                               */
/* ------------------------------------------------------------------------ */

#define DIAG_OPTIONS_MIN_SIZE (offsetof(fa_diagnose_options, min_explained) + sizeof(double))
#define DIAG_REPORT_MIN_SIZE (offsetof(fa_diagnose_report, batch_rel_rms) + sizeof(double *))

void fa_diagnose_options_init(fa_diagnose_options *opt, size_t struct_size)
{
    if (!opt) return;
    memset(opt, 0, struct_size);
    fa_diagnose_options o;
    memset(&o, 0, sizeof o);
    o.struct_size = struct_size;
    o.dtype = FA_CHECK_DTYPE_AUTO;
    o.min_explained = 0.8;
    memcpy(opt, &o, struct_size < sizeof o ? struct_size : sizeof o);
}

void fa_diagnose_report_free(fa_diagnose_report *r)
{
    if (!r || r->struct_size < DIAG_REPORT_MIN_SIZE) return;
    const size_t size = r->struct_size;
    free(r->head_rel_rms);
    free(r->batch_rel_rms);
    memset(r, 0, size < sizeof *r ? size : sizeof *r);
    r->struct_size = size;
}

static uint64_t mix64(uint64_t *st)
{
    uint64_t z = (*st += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int dtype_rank(fa_dtype t) { return t == FA_BF16 ? 0 : t == FA_F16 ? 1 : t == FA_F32 ? 2 : 3; }

static int cmp_diag(const void *a, const void *b)
{
    const struct dg_entry *x = a, *y = b;
    if (x->d.explained != y->d.explained) return (x->d.explained < y->d.explained) - (x->d.explained > y->d.explained);
    return (x->order > y->order) - (x->order < y->order);
}

static fa_status run(const fa_problem *p, const fa_tensor *lse, const fa_diagnose_options *o,
                     const fa_tensor *raw_q, const fa_tensor *raw_kn, fa_diagnose_report *rep)
{
    const int64_t B = p->batch, H = p->heads, dv = p->dv, Sk = p->seqlen_k;
    /* K(b): rows sampled per head of sequence b (its own q_len) */
#define DG_ROWS_OF(qlen) (o->sample_rows > 0 && o->sample_rows < (qlen) ? o->sample_rows : (qlen))
    dg_ctx cx;
    memset(&cx, 0, sizeof cx);
    cx.p = p;
    cx.raw_q = raw_q;
    cx.raw_kn = raw_kn;
    for (int64_t b = 0; b < B; b++) cx.n += H * DG_ROWS_OF(fa_problem_seq(p, b).q_len);
    cx.nt = o->num_threads > 0 ? o->num_threads : p->num_threads;
    fa_status st = FA_ERR_NOMEM;
    cx.it = malloc((size_t)cx.n * sizeof *cx.it);
    cx.ot = malloc((size_t)(cx.n * dv) * sizeof(double));
    cx.orf = malloc((size_t)(cx.n * dv) * sizeof(double));
    cx.lrf = malloc((size_t)cx.n * sizeof(double));
    if (lse) cx.lt = malloc((size_t)cx.n * sizeof(double));
    double *ro = malloc((size_t)cx.n * sizeof(double)), *rl = calloc((size_t)cx.n, sizeof(double));
    cx.ro_ref = ro;
    cx.rl_ref = rl;
    rep->head_rel_rms = calloc((size_t)H, sizeof(double));
    rep->batch_rel_rms = calloc((size_t)B, sizeof(double));
    double *hs = calloc((size_t)(2 * H + 2 * B), sizeof(double));
    /* non-finite tested values per head and per sequence: bit 1 an Inf, bit 2 a NaN */
    unsigned char *nf = calloc((size_t)(H + B), 1);
    if (!cx.it || !cx.ot || !cx.orf || !cx.lrf || (lse && !cx.lt) || !ro || !rl || !rep->head_rel_rms ||
        !rep->batch_rel_rms || !hs || !nf)
        goto out;
    rep->n_heads = H;
    rep->n_batch = B;

    /* 1. rows: one per stratum of each sequence, its row 0 and its last row always */
    {
        int64_t w = 0;
        for (int64_t b = 0; b < B; b++) {
            const int64_t Sq = fa_problem_seq(p, b).q_len, K = DG_ROWS_OF(Sq);
            for (int64_t h = 0; h < H; h++) {
                uint64_t sd = o->seed ^ (0x5851f42d4c957f2dull * (uint64_t)(b + 1)) ^
                              (0x2545f4914f6cdd1dull * (uint64_t)(h + 1));
                for (int64_t t = 0; t < K; t++) {
                    const int64_t lo = t * Sq / K, hi = (t + 1) * Sq / K;
                    int64_t i = lo + (int64_t)(mix64(&sd) % (uint64_t)(hi - lo));
                    if (t == 0) i = 0;
                    if (t == K - 1) i = Sq - 1;
                    dg_item *it = &cx.it[w++];
                    it->b = b;
                    it->i = i;
                    it->h = h;
                }
            }
        }
    }
#undef DG_ROWS_OF
    /* 2. tested rows, the dot cache, the reference */
    double maxref = 0.0;
    for (int64_t w = 0; w < cx.n; w++) {
        const dg_item *it = &cx.it[w];
        const fa_seq sq = fa_problem_seq(p, it->b);
        fa_gather_f64(&p->o, fa_off4(&p->o, sq.q_batch, sq.q_start + it->i, it->h, 0), p->o.stride[3], dv,
                      cx.ot + w * dv);
        if (lse) cx.lt[w] = fa_load_f64(lse, fa_lse_off(p, it->b, it->h, it->i));
    }
    if ((size_t)cx.n * (size_t)Sk <= DG_DOTS_MAX_BYTES / sizeof(double)) {
        cx.dots = malloc((size_t)(cx.n * Sk) * sizeof(double));
        if (cx.dots) {
            const dg_variant ref = dg_variant_reference(p);
            int bad = 0;
#pragma omp parallel num_threads((int)(cx.n < cx.nt ? cx.n : cx.nt)) reduction(+ : bad)
            {
                double *q = malloc((size_t)p->d * sizeof *q), *x = malloc((size_t)p->d * sizeof *x);
                if (!q || !x) bad++;
                else {
#pragma omp for schedule(dynamic, 1)
                    for (int64_t w = 0; w < cx.n; w++) {
                        const dg_item *it = &cx.it[w];
                        const int64_t kh = fa_kv_head(p, it->h);
                        const dg_geo g = geo_of(p, &ref, it->b);
                        fa_gather_f64(&p->q, fa_off4(&p->q, g.s.q_batch, g.q_row0 + it->i, it->h, 0), p->q.stride[3],
                                      p->d, q);
                        for (int64_t j = 0; j < Sk; j++) {
                            int64_t off;
                            const fa_tensor *kt = j < g.len ? key_src(p, &ref, &g, j, 0, kh, &off) : NULL;
                            double t = 0.0;
                            if (kt) {
                                fa_gather_f64(kt, off, kt->stride[3], p->d, x);
                                for (int64_t c = 0; c < p->d; c++) t += q[c] * x[c];
                            }
                            cx.dots[w * Sk + j] = t;
                        }
                    }
                }
                free(q);
                free(x);
            }
            if (bad) goto out;
        }
    }
    {
        int bad = 0;
        const dg_variant ref = dg_variant_reference(p);
#pragma omp parallel num_threads((int)(cx.n < cx.nt ? cx.n : cx.nt)) reduction(+ : bad)
        {
            dg_scratch s;
            if (!scratch_alloc(&s, p)) bad++;
            else {
#pragma omp for schedule(dynamic, 1)
                for (int64_t w = 0; w < cx.n; w++) {
                    int any;
                    eval_core(&cx, &s, cx.it[w].b, cx.it[w].i, cx.it[w].h, &ref,
                              cx.dots ? cx.dots + w * Sk : NULL, 0, cx.orf + w * dv, cx.lrf + w, &any);
                }
            }
            scratch_free(&s);
        }
        if (bad) goto out;
    }
    for (int64_t x = 0; x < cx.n * dv; x++)
        if (fabs(cx.orf[x]) > maxref) maxref = fabs(cx.orf[x]);
    cx.pen = 4.0 * (maxref + 1.0) * (maxref + 1.0);

    /* 3. channels */
    double refsq = 0.0, lsq = 0.0, lref2 = 0.0;
    int64_t nl = 0, nonfinite = 0;
    unsigned char nf_all = 0;
    for (int64_t w = 0; w < cx.n; w++) {
        double a = 0.0, r2 = 0.0;
        for (int64_t c = 0; c < dv; c++) {
            const double t = cx.ot[w * dv + c], r = cx.orf[w * dv + c];
            a += o_diff(t, r, cx.pen);
            r2 += r * r;
            if (!isfinite(t)) {
                const unsigned char bit = isnan(t) ? 2 : 1;
                nonfinite++;
                nf[cx.it[w].h] |= bit;
                nf[H + cx.it[w].b] |= bit;
                nf_all |= bit;
            }
        }
        ro[w] = a;
        cx.r0o += a;
        refsq += r2;
        hs[cx.it[w].h] += a;
        hs[H + cx.it[w].h] += r2;
        hs[2 * H + cx.it[w].b] += a;
        hs[2 * H + B + cx.it[w].b] += r2;
        if (cx.lt) {
            rl[w] = l_diff(cx.lt[w], cx.lrf[w]);
            cx.r0l += rl[w];
            if (isfinite(cx.lrf[w])) {
                lsq += l_diff(cx.lt[w], cx.lrf[w]);
                lref2 += cx.lrf[w] * cx.lrf[w];
                nl++;
            } else if (!isinf(cx.lt[w])) {
                lsq += DG_LSE_PENALTY;
            }
        }
    }
    /* a NaN or Inf in the tested output is shown as such (NaN first), never as
     * the finite penalty the residuals use */
    for (int64_t h = 0; h < H; h++)
        rep->head_rel_rms[h] = nf[h] & 2 ? NAN : nf[h] ? INFINITY : sqrt(hs[h] / (hs[H + h] > 0 ? hs[H + h] : 1.0));
    for (int64_t b = 0; b < B; b++)
        rep->batch_rel_rms[b] = nf[H + b] & 2   ? NAN
                                : nf[H + b] ? INFINITY
                                            : sqrt(hs[2 * H + b] / (hs[2 * H + B + b] > 0 ? hs[2 * H + B + b] : 1.0));
    fa_dtype dt = o->dtype;
    if (dt == FA_CHECK_DTYPE_AUTO) {
        const fa_dtype all[4] = {p->q.dtype, p->k.dtype, p->v.dtype, p->o.dtype};
        dt = all[0];
        for (int x = 1; x < 4; x++)
            if (dtype_rank(all[x]) < dtype_rank(dt)) dt = all[x];
    }
    double floor_rel = dt == FA_BF16 ? 0x1p-6 : dt == FA_F16 ? 0x1p-9 : 0x1p-16;
    cx.qfmt = o->qkv_format;
    if (cx.qfmt) {
        /* P rounded to its format before P.V: e4m3 (FP8 e4m3 and INT8 kernels) has 3 mantissa bits,
         * e5m2 2, e2m1 1 (its block scale adds its own) */
        const int pf = fa_lp_p_format(cx.qfmt);
        floor_rel = pf == FA_QF_E5M2 ? 0x1p-3 : pf == FA_QF_E2M1 ? 0x1p-2 : 0x1p-4;
    }
    rep->out_rel_rms = nf_all & 2 ? NAN : nonfinite ? INFINITY : sqrt(cx.r0o / (refsq > 0 ? refsq : 1.0));
    cx.sig_o = nonfinite > 0 || rep->out_rel_rms > floor_rel;
    cx.floor_o = floor_rel * floor_rel * refsq;
    if (cx.lt) {
        const double n1 = (double)(cx.n > 0 ? cx.n : 1);
        rep->lse_rms = sqrt(lsq / n1);
        const double lr = nl ? sqrt(lref2 / (double)nl) : 0.0;
        cx.sig_l = rep->lse_rms > 5e-4 * (lr > 1.0 ? lr : 1.0);
        cx.floor_l = 25e-8 * (lr > 1.0 ? lr * lr : 1.0) * n1;
    }
    /* the fit rows: largest normalized reference residual first */
    {
        const double wo = cx.r0o > 0 ? 1.0 / cx.r0o : 0.0, wl = cx.r0l > 0 ? 1.0 / cx.r0l : 0.0;
        cx.nfit = cx.n < DG_FIT_ROWS ? cx.n : DG_FIT_ROWS;
        for (int64_t x = 0; x < cx.nfit; x++) cx.fit[x] = -1;
        for (int64_t w = 0; w < cx.n; w++) {
            const double e = (cx.sig_o ? wo * ro[w] : 0.0) + (cx.sig_l ? wl * rl[w] : 0.0);
            int64_t x = cx.nfit;
            while (x > 0 && (cx.fit[x - 1] < 0 ||
                             e > (cx.sig_o ? wo * ro[cx.fit[x - 1]] : 0.0) + (cx.sig_l ? wl * rl[cx.fit[x - 1]] : 0.0)))
                x--;
            if (x >= cx.nfit) continue;
            memmove(cx.fit + x + 1, cx.fit + x, (size_t)(cx.nfit - 1 - x) * sizeof cx.fit[0]);
            cx.fit[x] = w;
        }
        for (int64_t x = 0; x < cx.nfit; x++) {
            cx.fit_o += ro[cx.fit[x]];
            cx.fit_l += rl[cx.fit[x]];
        }
    }
    rep->out_significant = cx.sig_o;
    rep->lse_significant = cx.sig_l;
    rep->rows_sampled = cx.n;

    /* 4. candidates */
    dg_list L;
    memset(&L, 0, sizeof L);
    if (cx.sig_o || cx.sig_l) {
        cand_align(&cx, &L);
        cand_scale(&cx, &L);
        cand_softcap(&cx, &L);
        cand_lse(&cx, &L);
        cand_gqa(&cx, &L);
        cand_window(&cx, &L);
        cand_empty(&cx, &L);
        cand_rescale(&cx, &L);
        cand_tail(&cx, &L);
        cand_unwritten(&cx, &L);
        cand_layout(&cx, &L);
        cand_varlen_leak(&cx, &L);
        cand_varlen_offset(&cx, &L);
        cand_paged(&cx, &L);
        cand_append(&cx, &L);
        cand_rotary(&cx, &L);
        cand_descale(&cx, &L);
        cand_psat(&cx, &L);
        cand_split(&cx, &L);
        cand_sink(&cx, &L);
        cand_dropout(&cx, &L);
    }
    /* best first; a tie goes to the candidate considered first (a more specific class) */
    qsort(L.all, (size_t)L.n, sizeof L.all[0], cmp_diag);
    for (int x = 0; x < L.n && rep->n < FA_DIAG_MAX; x++)
        if (L.all[x].d.explained >= o->min_explained) rep->items[rep->n++] = L.all[x].d;
    rep->n_considered = L.n_considered;
    snprintf(rep->considered, sizeof rep->considered, "%s", L.considered);
    st = FA_OK;
out:
    if (st != FA_OK) st = fa_fail(FA_ERR_NOMEM, "fa_diagnose: out of memory for %lld sampled rows",
                                  (long long)cx.n);
    free(cx.it);
    free(cx.ot);
    free(cx.orf);
    free(cx.lrf);
    free(cx.lt);
    free(cx.dots);
    free(ro);
    free(rl);
    free(hs);
    free(nf);
    return st;
}

fa_status fa_diagnose(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, const fa_tensor *out,
                      const fa_tensor *lse, const fa_options *attn, const fa_diagnose_options *dopt,
                      fa_diagnose_report *report)
{
    if (!report) return fa_fail(FA_ERR_NULL_ARG, "fa_diagnose: report is NULL");
    static const size_t rknown[] = {sizeof(fa_diagnose_report)};
    fa_status st = fa_struct_size_check(report, sizeof *report, rknown, 1, "fa_diagnose_report",
                                        "fa_diagnose_report_init");
    if (st != FA_OK) return st;
    const size_t rsize = report->struct_size;
    memset(report, 0, rsize < sizeof *report ? rsize : sizeof *report);
    report->struct_size = sizeof *report;
    fa_diagnose_options o;
    fa_diagnose_options_init(&o, sizeof o);
    if (dopt) {
        static const size_t known[] = {DIAG_OPTIONS_MIN_SIZE, sizeof(fa_diagnose_options)};
        if ((st = fa_struct_size_check(dopt, sizeof o, known, 2, "fa_diagnose_options",
                                       "fa_diagnose_options_init")) != FA_OK)
            return st;
        memcpy(&o, dopt, dopt->struct_size < sizeof o ? dopt->struct_size : sizeof o);
        o.struct_size = sizeof o;
    }
    if (o.sample_rows < 0)
        return fa_fail(FA_ERR_OPTION, "fa_diagnose: sample_rows must be >= 0 (got %lld)", (long long)o.sample_rows);
    if (o.num_threads < 0 || o.num_threads > FA_MAX_THREADS)
        return fa_fail(FA_ERR_OPTION, "fa_diagnose: num_threads must be in [0, %d] (got %d)", FA_MAX_THREADS,
                       o.num_threads);
    if (!(o.min_explained >= 0.0 && o.min_explained <= 1.0))
        return fa_fail(FA_ERR_OPTION, "fa_diagnose: min_explained must be in [0, 1] (got %g)", o.min_explained);
    if (o.qkv_format < FA_QF_NONE || o.qkv_format >= FA_QF_E8M0)
        return fa_fail(FA_ERR_OPTION, "fa_diagnose: qkv_format %d is not e4m3, e5m2, e2m1 or int8", o.qkv_format);
    if ((int)o.dtype < 0 || o.dtype > FA_CHECK_DTYPE_AUTO)
        return fa_fail(FA_ERR_DTYPE, "fa_diagnose: invalid dtype %d", (int)o.dtype);
    if (!out) return fa_fail(FA_ERR_NULL_ARG, "out: tensor is NULL");
    fa_problem p;
    if ((st = fa_resolve(FA_PURPOSE_CHECK, q, k, v, out, lse, attn, NULL, &p)) != FA_OK) return st;
    if (p.batch == 0 || p.seqlen_q == 0 || p.seqlen_k == 0) {
        snprintf(report->considered, sizeof report->considered, "%s", "");
        return FA_OK; /* nothing to diagnose */
    }
    /* rotary: the reference (and every other candidate) reads q and k_new rotated the
     * problem's way, as fa_check does; cand_rotary re-rotates the raw ones */
    const fa_tensor raw_q = p.q, raw_kn = p.k_new;
    void *rot_mem = NULL;
    if ((st = fa_rotary_apply(&p, &rot_mem)) != FA_OK) return st;
    st = run(&p, lse, &o, p.rot_dim ? &raw_q : NULL, p.rot_dim ? &raw_kn : NULL, report);
    fa_free(rot_mem);
    if (st != FA_OK) fa_diagnose_report_free(report);
    return st;
}

/* ------------------------------------------------------------------------ */
/* Text                                                                      */
/* ------------------------------------------------------------------------ */

typedef struct dg_text {
    char *buf;
    size_t size, len;
} dg_text;

static void put(dg_text *t, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *dst = t->len < t->size ? t->buf + t->len : NULL;
    const int n = vsnprintf(dst, dst ? t->size - t->len : 0, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n;
}

size_t fa_diagnose_report_format(const fa_diagnose_report *r, char *buf, size_t size)
{
    dg_text t = {buf, buf ? size : 0, 0};
    if (buf && size) buf[0] = '\0';
    if (!r || r->struct_size < DIAG_REPORT_MIN_SIZE) return 0;
    if (r->n == 0) {
        if (!r->out_significant && !r->lse_significant)
            put(&t, "diagnosis: none (the error is at the rounding level of the kernel's precision over the %lld "
                    "sampled rows, so no known mistake is named; an error confined to a few elements, or to rows "
                    "not sampled, shows in the check above, not here)\n",
                (long long)r->rows_sampled);
        else
            put(&t, "diagnosis: none (no known mistake explains the error; considered: %s)\n",
                r->n_considered ? r->considered : "nothing");
    }
    for (int x = 0; x < r->n; x++)
        put(&t, "diagnosis: %s (explains %.1f%% of the error; %s)\n", r->items[x].id,
            100.0 * r->items[x].explained, r->items[x].detail);
    put(&t, "diagnosis rows: %lld sampled; output relative RMS error %.3g; ", (long long)r->rows_sampled,
        r->out_rel_rms);
    if (r->lse_significant || r->lse_rms > 0) put(&t, "LSE RMS error %.3g\n", r->lse_rms);
    else put(&t, "no LSE error\n");
    if (r->n_heads > 0 && r->head_rel_rms) {
        put(&t, "error by head (relative RMS):");
        for (int64_t h = 0; h < r->n_heads; h++) {
            if (h == 64) {
                put(&t, " ...");
                break;
            }
            put(&t, " %lld:%.3g", (long long)h, r->head_rel_rms[h]);
        }
        put(&t, "\n");
    }
    if (r->n_batch > 0 && r->batch_rel_rms) {
        put(&t, "error by sequence (relative RMS):");
        for (int64_t b = 0; b < r->n_batch; b++) {
            if (b == 64) {
                put(&t, " ...");
                break;
            }
            put(&t, " %lld:%.3g", (long long)b, r->batch_rel_rms[b]);
        }
        put(&t, "\n");
    }
    return t.len;
}
