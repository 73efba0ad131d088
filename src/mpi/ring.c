/*
 * ring.c — ring attention over MPI (flashattn_mpi.h): forward and backward
 * over a communicator, each rank holding its shard; exact merge of partial
 * (O, LSE) in float64. Calls only the public API of libflashattn.
 */
#include "flashattn_mpi.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* Errors: one message, the same on every rank                               */
/* ------------------------------------------------------------------------ */

enum { RING_MSG = 512 };
static _Thread_local char ring_err[RING_MSG];

const char *fa_ring_last_error(void) { return ring_err; }

static fa_status fail(fa_status st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ring_err, sizeof ring_err, fmt, ap);
    va_end(ap);
    return st;
}

/* The library's message for a failed call, prefixed by what was being done. */
static fa_status fail_lib(fa_status st, const char *what)
{
    const char *m = fa_last_error();
    return fail(st, "%s: %s", what, m && *m ? m : fa_status_string(st));
}

/*
 * Collective: if any rank has st != FA_OK, every rank returns the status and
 * message of the lowest such rank (prefixed "rank N: " when N > 0).
 */
static fa_status agree(MPI_Comm comm, fa_status st)
{
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int mine = st != FA_OK ? rank : size, first = size;
    MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, comm);
    if (first == size) {
        ring_err[0] = '\0';
        return FA_OK;
    }
    struct {
        int st;
        char msg[RING_MSG];
    } m;
    memset(&m, 0, sizeof m);
    if (rank == first) {
        m.st = (int)st;
        if (first > 0)
            snprintf(m.msg, sizeof m.msg, "rank %d: %.480s", first, ring_err);
        else
            snprintf(m.msg, sizeof m.msg, "%s", ring_err);
    }
    MPI_Bcast(&m, (int)sizeof m, MPI_BYTE, first, comm);
    snprintf(ring_err, sizeof ring_err, "%s", m.msg);
    return (fa_status)m.st;
}

/* ------------------------------------------------------------------------ */
/* Layouts                                                                   */
/* ------------------------------------------------------------------------ */

const char *fa_ring_layout_name(fa_ring_layout layout)
{
    switch (layout) {
    case FA_RING_AUTO: return "auto";
    case FA_RING_CONTIGUOUS: return "contiguous";
    case FA_RING_ZIGZAG: return "zigzag";
    }
    return "?";
}

fa_status fa_ring_layout_from_name(const char *name, fa_ring_layout *layout)
{
    static const fa_ring_layout all[] = {FA_RING_AUTO, FA_RING_CONTIGUOUS, FA_RING_ZIGZAG};
    for (int i = 0; name && i < 3; i++)
        if (strcmp(name, fa_ring_layout_name(all[i])) == 0) {
            *layout = all[i];
            return FA_OK;
        }
    return fail(FA_ERR_OPTION, "layout must be contiguous, zigzag or auto (got '%s')", name ? name : "(null)");
}

fa_ring_layout fa_ring_resolve_layout(fa_ring_layout layout, const fa_options *opt)
{
    if (layout != FA_RING_AUTO) return layout;
    if (opt && (opt->causal || opt->window_left >= 0 || opt->window_right >= 0)) return FA_RING_ZIGZAG;
    return FA_RING_CONTIGUOUS;
}

fa_status fa_ring_check_split(int64_t seqlen, int nranks, fa_ring_layout layout)
{
    if (nranks < 1) return fail(FA_ERR_OPTION, "the communicator has %d ranks", nranks);
    const int64_t parts = layout == FA_RING_ZIGZAG ? 2 * (int64_t)nranks : nranks;
    if (seqlen < 0 || seqlen % parts != 0)
        return fail(FA_ERR_SHAPE, "sequence length %lld does not split into %lld equal %s over %d ranks",
                    (long long)seqlen, (long long)parts, layout == FA_RING_ZIGZAG ? "zigzag chunks" : "shards",
                    nranks);
    return FA_OK;
}

/* A rank's rows: one or two runs of global rows (gstart, len) at local row loff. */
typedef struct seg {
    int64_t gstart, len, loff;
} seg;
typedef struct shard {
    int n;
    seg s[2];
} shard;

static shard make_shard(int64_t c, int nranks, int rank, fa_ring_layout layout)
{
    shard sh;
    memset(&sh, 0, sizeof sh);
    if (layout != FA_RING_ZIGZAG) {
        sh.n = 1;
        sh.s[0] = (seg){(int64_t)rank * c, c, 0};
        return sh;
    }
    const int64_t h = c / 2;
    sh.s[0] = (seg){(int64_t)rank * h, h, 0};
    sh.s[1] = (seg){(2 * (int64_t)nranks - 1 - rank) * h, h, h};
    sh.n = 2;
    if (sh.s[1].gstart == sh.s[0].gstart + h) { /* adjacent (P = 1): one run */
        sh.n = 1;
        sh.s[0].len = c;
    }
    return sh;
}

int64_t fa_ring_global_row(int64_t seqlen, int nranks, int rank, fa_ring_layout layout, int64_t local_row)
{
    if (layout == FA_RING_AUTO || nranks < 1 || rank < 0 || rank >= nranks) return -1;
    const int64_t parts = layout == FA_RING_ZIGZAG ? 2 * (int64_t)nranks : nranks;
    if (seqlen < 0 || seqlen % parts != 0) return -1;
    const int64_t c = seqlen / nranks;
    if (local_row < 0 || local_row >= c) return -1;
    const shard sh = make_shard(c, nranks, rank, layout);
    for (int i = 0; i < sh.n; i++)
        if (local_row < sh.s[i].loff + sh.s[i].len) return sh.s[i].gstart + (local_row - sh.s[i].loff);
    return -1;
}

/* ------------------------------------------------------------------------ */
/* The mask band of one block                                                */
/* ------------------------------------------------------------------------ */

/* Global band: key j_g is visible from row i_g iff L <= j_g - i_g <= R (each side optional). */
typedef struct band {
    int has_l, has_r;
    int64_t l, r;
} band;

static band global_band(const fa_options *o, int64_t sq, int64_t sk)
{
    band g;
    const int64_t diag = o->align == FA_ALIGN_TOP_LEFT ? 0 : sk - sq;
    int64_t wl = o->window_left < 0 ? -1 : o->window_left;
    int64_t wr = o->causal ? 0 : (o->window_right < 0 ? -1 : o->window_right);
    if (wl > sq + sk) wl = -1; /* as wide as both sequences: hides nothing */
    if (wr > sq + sk) wr = -1;
    g.has_l = wl >= 0;
    g.l = g.has_l ? diag - wl : 0;
    g.has_r = wr >= 0;
    g.r = g.has_r ? diag + wr : 0;
    return g;
}

/* One (Q run, K run) block: the rows i0.. and keys j0.. that can see anything,
 * and the options that say the band in the block's own numbering. */
typedef struct plan {
    int64_t i0, j0, n, m; /* rows i0 .. i0+n of the Q run, keys j0 .. j0+m of the K run */
    fa_options o;
    double pairs;         /* visible (row, key) pairs */
} plan;

static int64_t clamp64(int64_t x, int64_t lo, int64_t hi) { return x < lo ? lo : x > hi ? hi : x; }

/* Returns 0 when the mask hides the whole block. */
static int plan_block(const band *g, const fa_options *user, int whole, const seg *qs, const seg *ks, plan *p)
{
    const int64_t cq = qs->len, ck = ks->len;
    if (cq == 0 || ck == 0) return 0;
    int has_l = g->has_l, has_r = g->has_r;
    int64_t l = g->l + qs->gstart - ks->gstart, r = g->r + qs->gstart - ks->gstart; /* on j - i */
    if (has_r && r < -(cq - 1)) return 0;
    if (has_l && l > ck - 1) return 0;
    p->o = *user;
    p->i0 = p->j0 = 0;
    if (!whole) {
        if (has_r && r < 0) { /* rows i < -r see no key of this block */
            p->i0 = -r;
            l += p->i0;
            r = 0;
        } else if (has_l && l > 0) { /* keys j < l are seen by no row of this block */
            p->j0 = l;
            r -= l;
            l = 0;
        }
    }
    p->n = cq - p->i0;
    p->m = ck - p->j0;
    if (!whole) {
        p->o.causal = 0;
        p->o.align = FA_ALIGN_TOP_LEFT; /* the band is now l <= j - i <= r with l <= 0 <= r */
        p->o.window_left = has_l && l > -(p->n - 1) ? -l : -1;
        p->o.window_right = has_r && r < p->m - 1 ? r : -1;
        has_l = p->o.window_left >= 0;
        has_r = p->o.window_right >= 0;
    }
    /* visible pairs, for the work statistics */
    double pairs = 0;
    for (int64_t i = 0; i < p->n; i++) {
        int64_t lo = has_l ? clamp64(i + l, 0, p->m) : 0, hi = has_r ? clamp64(i + r + 1, 0, p->m) : p->m;
        if (whole) { /* the caller's own band, in its own alignment */
            lo = g->has_l ? clamp64(i + g->l, 0, p->m) : 0;
            hi = g->has_r ? clamp64(i + g->r + 1, 0, p->m) : p->m;
        }
        if (hi > lo) pairs += (double)(hi - lo);
    }
    p->pairs = pairs;
    return 1;
}

/* ------------------------------------------------------------------------ */
/* Tensors: views, packing, stores                                           */
/* ------------------------------------------------------------------------ */

static fa_tensor view(const fa_tensor *t, int dim, int64_t start, int64_t len)
{
    fa_tensor v = *t;
    v.data = (char *)t->data + start * t->stride[dim] * (int64_t)fa_dtype_size(t->dtype);
    v.shape[dim] = len;
    return v;
}

static fa_tensor dense(void *data, fa_dtype dt, int rank, int64_t a, int64_t b, int64_t c, int64_t d)
{
    fa_tensor t;
    const int64_t shape[4] = {a, b, c, d};
    fa_tensor_make(&t, data, dt, rank, shape, NULL);
    return t;
}

/* Copy a rank-4 tensor into a C-contiguous buffer of its dtype. */
static void pack4(const fa_tensor *t, unsigned char *dst)
{
    const size_t es = fa_dtype_size(t->dtype);
    const int64_t *n = t->shape, *st = t->stride;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++) {
                const unsigned char *src = (const unsigned char *)t->data + (a * st[0] + b * st[1] + c * st[2]) * (int64_t)es;
                if (st[3] == 1) {
                    memcpy(dst, src, (size_t)n[3] * es);
                    dst += (size_t)n[3] * es;
                } else {
                    for (int64_t x = 0; x < n[3]; x++, dst += es) memcpy(dst, src + x * st[3] * (int64_t)es, es);
                }
            }
}

/* Store C-contiguous doubles into a float32/float64 tensor of any strides (rank 3 or 4). */
static void store(fa_tensor *t, const double *src)
{
    int64_t n[4] = {1, 1, 1, 1}, st[4] = {0, 0, 0, 0};
    const int off = 4 - t->rank;
    for (int i = 0; i < t->rank; i++) {
        n[off + i] = t->shape[i];
        st[off + i] = t->stride[i];
    }
    size_t k = 0;
    for (int64_t a = 0; a < n[0]; a++)
        for (int64_t b = 0; b < n[1]; b++)
            for (int64_t c = 0; c < n[2]; c++)
                for (int64_t x = 0; x < n[3]; x++, k++) {
                    const int64_t e = a * st[0] + b * st[1] + c * st[2] + x * st[3];
                    if (t->dtype == FA_F64)
                        ((double *)t->data)[e] = src[k];
                    else
                        ((float *)t->data)[e] = (float)src[k];
                }
}

static void fill(double *x, size_t n, double value)
{
    for (size_t i = 0; i < n; i++) x[i] = value;
}

/* ------------------------------------------------------------------------ */
/* Transfers: a buffer to rank+1 while another arrives from rank-1            */
/* ------------------------------------------------------------------------ */

/*
 * A transfer is sent as up to MAX_CHUNKS messages of at least CHUNK bytes.
 * Open MPI's shared-memory transport without a single-copy mechanism (as in
 * containers: btl_vader_single_copy_mechanism=none) moves a large message as
 * a pipeline of small fragments, a few per progress call: a 16 MiB message
 * needs ~170 calls of MPI_Test, one 1 MiB message only a few, and several
 * messages in flight advance together. So a shard goes as 1 MiB messages (one
 * Irecv/Isend pair each; MPI's non-overtaking order matches them), and each
 * test between blocks is a burst of up to TEST_BURST calls that stops when
 * all is done. With cross-memory attach the receiver copies a whole message in
 * one call and the chunks cost nothing.
 */
enum { CHUNK = 1 << 20, MAX_CHUNK = 1 << 30, MAX_CHUNKS = 1024, TEST_BURST = 16 };
#define MAX_XFER ((size_t)MAX_CHUNKS * (size_t)MAX_CHUNK) /* 1 TiB */

typedef struct xfer {
    MPI_Request req[2 * MAX_CHUNKS];
    int n, done;
} xfer;

static void xfer_post(xfer *x, const void *send, void *recv, size_t bytes, size_t min_chunk, int to, int from,
                      int tag, MPI_Comm comm, fa_ring_stats *s)
{
    size_t chunk = (bytes + MAX_CHUNKS - 1) / MAX_CHUNKS;
    if (chunk < min_chunk) chunk = min_chunk;
    if (chunk > MAX_CHUNK) chunk = MAX_CHUNK; /* bytes <= MAX_XFER: checked before */
    x->n = 0;
    x->done = 0;
    for (size_t off = 0; (off < bytes || off == 0) && x->n < 2 * MAX_CHUNKS; off += chunk) {
        const int len = (int)(bytes - off < chunk ? bytes - off : chunk);
        MPI_Irecv((char *)recv + off, len, MPI_BYTE, from, tag, comm, &x->req[x->n++]);
        MPI_Isend((const char *)send + off, len, MPI_BYTE, to, tag, comm, &x->req[x->n++]);
        if (bytes == 0) break;
    }
    s->bytes_sent += bytes;
    s->bytes_recv += bytes;
}

/* Drive the transfer: a burst of tests (each one progress call), until done. */
static void xfer_test(xfer *x)
{
    for (int i = 0; i < TEST_BURST && x->n && !x->done; i++) MPI_Testall(x->n, x->req, &x->done, MPI_STATUSES_IGNORE);
}

/*
 * The transfers of a step also advance inside each library call: fa_options::progress
 * runs this between the call's tasks on its thread 0 — the thread that called,
 * the one MPI_THREAD_FUNNELED lets call MPI — while the other threads compute.
 * Between calls only (the tests in the block loops below), every thread of the
 * rank but one would sit idle while MPI copies a step's shard (16 MiB of K/V in
 * docs/distributed.md's benchmark, 48 MiB with the backward's accumulators).
 * No gain from it was resolved on the device host (docs/distributed.md,
 * "Progress inside the library calls"). The caller's own hook, if any, runs after.
 */
typedef struct ring_hook {
    xfer *x[2];
    void (*user)(void *);
    void *user_arg;
} ring_hook;

static void ring_progress(void *arg)
{
    const ring_hook *h = arg;
    for (int i = 0; i < 2; i++)
        if (h->x[i]) xfer_test(h->x[i]);
    if (h->user) h->user(h->user_arg);
}

/* A block's options: progress is the ring's hook while a transfer is in flight (which then
 * runs the caller's own hook too), else the caller's own hook as it was. */
static void block_hook(fa_options *o, ring_hook *h, xfer *a, xfer *b)
{
    h->x[0] = a && a->n && !a->done ? a : NULL;
    h->x[1] = b && b->n && !b->done ? b : NULL;
    h->user = o->progress;
    h->user_arg = o->progress_arg;
    if (!h->x[0] && !h->x[1]) return;
    o->progress = ring_progress;
    o->progress_arg = h;
}

static void xfer_wait(xfer *x, fa_ring_stats *s)
{
    if (!x->n) return;
    const double t = MPI_Wtime();
    MPI_Waitall(x->n, x->req, MPI_STATUSES_IGNORE);
    s->wait_s += MPI_Wtime() - t;
    x->n = 0;
}

/* ------------------------------------------------------------------------ */
/* Validation, shared by forward and backward                                */
/* ------------------------------------------------------------------------ */

typedef struct ring {
    MPI_Comm comm; /* a duplicate of the caller's */
    int rank, size;
    fa_ring_layout layout;
    fa_options opt;
    int64_t batch, cq, ck, heads, heads_k, d, dv;
    band g;
    shard qsh;   /* this rank's Q rows */
    int64_t br;  /* the flash path's row block (pieces are multiples of it) */
    int threads; /* OpenMP threads of a library call (and of the merge) */
    size_t chunk; /* smallest message of a transfer (CHUNK; FA_RING_CHUNK overrides) */
    int pieces;   /* cut blocks into pieces while a transfer is in flight (FA_RING_PIECES=0: not) */
} ring;

static fa_status check_out(const fa_tensor *t, const char *name, int rank, const int64_t *shape, int allow_null)
{
    if (!t) return allow_null ? FA_OK : fail(FA_ERR_NULL_ARG, "%s is NULL", name);
    if (t->dtype != FA_F32 && t->dtype != FA_F64)
        return fail(FA_ERR_DTYPE, "%s must be float32 or float64 (got %s)", name, fa_dtype_name(t->dtype));
    if (t->rank != rank) return fail(FA_ERR_SHAPE, "%s must have rank %d (got %d)", name, rank, t->rank);
    for (int i = 0; i < rank; i++)
        if (t->shape[i] != shape[i])
            return fail(FA_ERR_SHAPE, "%s: extent %lld of dimension %d should be %lld", name, (long long)t->shape[i], i,
                        (long long)shape[i]);
    if (!t->data && fa_tensor_numel(t) > 0) return fail(FA_ERR_NULL_ARG, "%s has no data", name);
    return FA_OK;
}

/* Local checks of one rank (no communication). */
static fa_status check_local(ring *R, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v)
{
    int level = MPI_THREAD_SINGLE, is_main = 0;
    MPI_Query_thread(&level);
    MPI_Is_thread_main(&is_main);
    if (level < MPI_THREAD_FUNNELED)
        return fail(FA_ERR_OPTION, "MPI was initialized below MPI_THREAD_FUNNELED (OpenMP runs inside each rank): "
                                   "use MPI_Init_thread(..., MPI_THREAD_FUNNELED, ...)");
    if (!is_main && level < MPI_THREAD_MULTIPLE)
        return fail(FA_ERR_OPTION, "fa_ring_* must be called from the thread that initialized MPI");
    /* FA_RING_CHUNK=bytes: smaller messages (the tests use it to send many chunks on small shapes) */
    const char *env = getenv("FA_RING_CHUNK");
    R->chunk = CHUNK;
    if (env) {
        char *end = NULL;
        const long long ch = strtoll(env, &end, 10);
        if (end == env || *end != '\0' || ch < 1 || ch > MAX_CHUNK)
            return fail(FA_ERR_OPTION, "FA_RING_CHUNK must be a number of bytes from 1 to %d (got '%s')", MAX_CHUNK,
                        env);
        R->chunk = (size_t)ch;
    }
    /* FA_RING_PIECES=0: one call per block even while a transfer is in flight (cut_of) */
    env = getenv("FA_RING_PIECES");
    R->pieces = 1;
    if (env && strcmp(env, "1") != 0) {
        if (strcmp(env, "0") != 0) return fail(FA_ERR_OPTION, "FA_RING_PIECES must be 0 or 1 (got '%s')", env);
        R->pieces = 0;
    }
    const fa_options *o = &R->opt;
    if (o->alibi_slopes) return fail(FA_ERR_OPTION, "the ring does not support ALiBi slopes");
    if (o->varlen) return fail(FA_ERR_OPTION, "the ring does not support variable-length batches (varlen)");
    if (o->kvcache) return fail(FA_ERR_OPTION, "the ring does not support a KV cache");
    if (o->sinks || o->rotary || o->dropout)
        return fail(FA_ERR_OPTION, "the ring does not support %s", o->sinks ? "sinks" : o->rotary ? "rotary" : "dropout");
    if (!q || !k || !v) return fail(FA_ERR_NULL_ARG, "%s is NULL", !q ? "q" : !k ? "k" : "v");
    if (q->rank != 4 || k->rank != 4 || v->rank != 4)
        return fail(FA_ERR_SHAPE, "%s must have rank 4 [batch, seqlen, heads, d] (got %d)",
                    q->rank != 4 ? "q" : k->rank != 4 ? "k" : "v",
                    q->rank != 4 ? q->rank : k->rank != 4 ? k->rank : v->rank);
    size_t bytes = 0;
    fa_status st = fa_workspace_bytes(q, k, v, o, &bytes); /* the library's own checks of q, k, v, options */
    if (st != FA_OK) return fail_lib(st, "local shards");
    R->batch = q->shape[0];
    R->cq = q->shape[1];
    R->heads = q->shape[2];
    R->d = q->shape[3];
    R->ck = k->shape[1];
    R->heads_k = k->shape[2];
    R->dv = v->shape[3];
    const int64_t sq = R->cq * R->size, sk = R->ck * R->size;
    if ((st = fa_ring_check_split(sq, R->size, R->layout)) != FA_OK) {
        char m[RING_MSG];
        snprintf(m, sizeof m, "%s", ring_err);
        return fail(st, "q: %.400s (the zigzag layout needs an even number of rows per rank)", m);
    }
    if ((st = fa_ring_check_split(sk, R->size, R->layout)) != FA_OK) {
        char m[RING_MSG];
        snprintf(m, sizeof m, "%s", ring_err);
        return fail(st, "k: %.400s (the zigzag layout needs an even number of rows per rank)", m);
    }
    return FA_OK;
}

/* Every rank must hold the same shapes and options. */
static fa_status check_same(ring *R, const fa_tensor *q, const fa_tensor *k, const fa_tensor *v)
{
    enum { NV = 18 };
    int64_t x[NV], lo[NV], hi[NV], bits_sc, bits_cap;
    static const char *names[NV] = {"batch", "rows of q per rank", "rows of k per rank", "heads", "heads_k", "d",
                                    "d_v", "dtype of q", "dtype of k", "dtype of v", "layout", "causal",
                                    "window_left", "window_right", "impl", "align", "scale (bits)",
                                    "softcap (bits)"};
    memcpy(&bits_sc, &R->opt.scale, sizeof bits_sc);
    memcpy(&bits_cap, &R->opt.softcap, sizeof bits_cap);
    const int64_t w[NV] = {R->batch, R->cq, R->ck, R->heads, R->heads_k, R->d, R->dv, q->dtype, k->dtype, v->dtype,
                           R->layout, R->opt.causal != 0, R->opt.window_left < 0 ? -1 : R->opt.window_left,
                           R->opt.window_right < 0 ? -1 : R->opt.window_right, R->opt.impl, R->opt.align, bits_sc,
                           bits_cap};
    memcpy(x, w, sizeof x);
    MPI_Allreduce(x, lo, NV, MPI_INT64_T, MPI_MIN, R->comm);
    MPI_Allreduce(x, hi, NV, MPI_INT64_T, MPI_MAX, R->comm);
    for (int i = 0; i < NV; i++)
        if (lo[i] != hi[i])
            return fail(FA_ERR_SHAPE, "the ranks disagree on %s (from %lld to %lld): every rank must hold an equal "
                                      "shard and pass the same options", names[i], (long long)lo[i], (long long)hi[i]);
    return FA_OK;
}

/*
 * R->opt: the caller's options as the library reads them. The library checks
 * struct_size (and a newer caller's tail) as fa_forward would — fa_block_sizes
 * reads options the same way — then the struct is copied only as far as the
 * caller's goes, the rest left at the defaults, and given this library's size:
 * a caller built against an older layout is not read past its end, and what the
 * ring sets in a block's options (progress) reaches the library whatever layout
 * the caller was compiled with.
 */
static fa_status read_options(ring *R, const fa_options *opt, const fa_tensor *q)
{
    R->opt = fa_options_default();
    if (!opt) return FA_OK;
    const int64_t d = q && q->rank == 4 && q->shape[3] >= 1 && q->shape[3] <= FA_HEAD_DIM_MAX ? q->shape[3] : 64;
    int bq = 0, bk = 0;
    const fa_status st = fa_block_sizes(d, d, opt, &bq, &bk);
    if (st != FA_OK) return fail_lib(st, "options");
    memcpy(&R->opt, opt, opt->struct_size < sizeof R->opt ? opt->struct_size : sizeof R->opt);
    R->opt.struct_size = sizeof R->opt;
    return FA_OK;
}

static fa_status ring_open(ring *R, MPI_Comm comm, fa_ring_layout layout, const fa_options *opt, const fa_tensor *q,
                           const fa_tensor *k, const fa_tensor *v)
{
    memset(R, 0, sizeof *R);
    R->comm = MPI_COMM_NULL;
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    if (!init || fin) return fail(FA_ERR_OPTION, "MPI is not initialized (call MPI_Init_thread first)");
    if (comm == MPI_COMM_NULL) return fail(FA_ERR_NULL_ARG, "the communicator is MPI_COMM_NULL");
    MPI_Comm_dup(comm, &R->comm);
    MPI_Comm_rank(R->comm, &R->rank);
    MPI_Comm_size(R->comm, &R->size);
    fa_status st = read_options(R, opt, q);
    if (st == FA_OK && layout != FA_RING_AUTO && layout != FA_RING_CONTIGUOUS && layout != FA_RING_ZIGZAG)
        st = fail(FA_ERR_OPTION, "unknown ring layout %d", (int)layout);
    R->layout = fa_ring_resolve_layout(layout, &R->opt);
    if (R->size == 1) R->layout = FA_RING_CONTIGUOUS; /* one rank: the same rows; no even length needed */
    if (st == FA_OK) st = check_local(R, q, k, v);
    if ((st = agree(R->comm, st)) != FA_OK) return st;
    if ((st = agree(R->comm, check_same(R, q, k, v))) != FA_OK) return st;
    R->g = global_band(&R->opt, R->cq * R->size, R->ck * R->size);
    R->qsh = make_shard(R->cq, R->size, R->rank, R->layout);
    int bq = 0, bk = 0;
    R->br = fa_block_sizes(R->d, R->dv, &R->opt, &bq, &bk) == FA_OK && bq > 0 ? bq : 64;
    fa_cpu_info info;
    R->threads = R->opt.num_threads > 0 ? R->opt.num_threads
                 : fa_get_cpu_info(&info) == FA_OK && info.max_threads > 0 ? info.max_threads : 1;
    return FA_OK;
}

static void ring_close(ring *R)
{
    if (R->comm != MPI_COMM_NULL) MPI_Comm_free(&R->comm);
}

static void stats_begin(fa_ring_stats *s, const ring *R)
{
    memset(s, 0, sizeof *s);
    s->ranks = R->size;
    s->steps = R->size;
    s->layout = R->layout;
}

/*
 * While a transfer is in flight a block is cut into pieces, one library call
 * each, with a burst of MPI_Test between them: MPI progresses a large message
 * only inside MPI calls, so one call per block would leave the transfer to the
 * final MPI_Waitall, and a rank that finishes early would wait for its
 * neighbour to finish too. Pieces go first by kv heads (each call packs only
 * its own heads' K and V, so the K/V shard is packed once per step however it
 * is cut), then by Q rows in whole flash row blocks Br (a partial block runs at
 * a fraction of the speed; a row piece packs its heads' K/V again); every
 * piece keeps at least two (batch, head, row block) tasks per thread; at most
 * MAX_PIECE_CALLS pieces, and rows are cut only to reach ROW_TARGET pieces.
 * With nothing in flight (the last step, one rank) the block is one call. The
 * pieces depend on Br and the thread count, so the bits do too (the same for
 * the same ranks, threads and blocks). Inside each call the transfer advances
 * as well (ring_progress, between the call's tasks), so pieces are no longer
 * what keeps it moving; FA_RING_PIECES=0 turns them off (one call per block;
 * device host, 2 threads x 8 ranks, weak scaling: the time of P = 8 as with
 * them, forward and backward within the host's noise; peak RSS per rank +12%
 * in the backward, whose one call holds every head's scratch at once).
 */
enum { MAX_PIECE_CALLS = 16, ROW_TARGET = 8 };

typedef struct cut {
    int nh, nr; /* kv-head pieces, row pieces */
} cut;

static cut cut_of(const ring *R, int64_t len, int in_flight)
{
    cut c = {1, 1};
    if (!in_flight || len <= 0 || !R->pieces) return c;
    const int64_t nb = (len + R->br - 1) / R->br, g = R->heads / (R->heads_k > 0 ? R->heads_k : 1);
    const int64_t need = 2 * (int64_t)R->threads; /* tasks per call */
    int64_t nh = R->heads_k < MAX_PIECE_CALLS ? R->heads_k : MAX_PIECE_CALLS;
    while (nh > 1 && R->batch * (R->heads_k / nh) * g * nb < need) nh--;
    c.nh = nh < 1 ? 1 : (int)nh;
    if (c.nh >= ROW_TARGET) return c;
    const int64_t tasks_row_block = R->batch * (R->heads_k / c.nh) * g; /* per row block of a head piece */
    const int64_t per = (need + tasks_row_block - 1) / (tasks_row_block > 0 ? tasks_row_block : 1);
    int64_t nr = nb / (per > 0 ? per : 1);
    const int64_t cap = ROW_TARGET / c.nh;
    if (nr > cap) nr = cap;
    c.nr = nr < 1 ? 1 : (int)nr;
    return c;
}

/* Piece k of n of a run: row blocks [nb k / n, nb (k+1) / n), the last to the run's end. */
static seg piece(const ring *R, const seg *s, int k, int n)
{
    if (n <= 1) return *s;
    const int64_t nb = (s->len + R->br - 1) / R->br;
    int64_t a = R->br * (nb * k / n), b = k + 1 == n ? s->len : R->br * (nb * (k + 1) / n);
    if (a > s->len) a = s->len;
    if (b > s->len) b = s->len;
    return (seg){s->gstart + a, b - a, s->loff + a};
}

/* The whole problem in one block (P = 1): the caller's options, unchanged. */
static int is_whole(const ring *R, const seg *qs, const seg *ks)
{
    return qs->gstart == 0 && qs->len == R->cq * R->size && ks->gstart == 0 && ks->len == R->ck * R->size;
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                   */
/* ------------------------------------------------------------------------ */

/* Element x of a float32 (f64 = 0) or float64 scratch buffer. */
static inline double at(const void *p, int f64, int64_t x)
{
    return f64 ? ((const double *)p)[x] : (double)((const float *)p)[x];
}

/* The partials' dtype: float64 for the float64 reference (a float32 scratch
 * would round it), float32 for flash (what it computes in: the same bits). */
static fa_dtype partial_dtype(const fa_options *o) { return o->impl == FA_IMPL_REFERENCE ? FA_F64 : FA_F32; }

/* Merge a block's partial (po [B][n][hn][dv], float32 or float64; plse [B][hn][n] float64)
 * into the accumulator rows r0 .. r0+n, heads h0 .. h0+hn (acc_o [B][cq][H][dv], acc_lse [B][H][cq]). */
static void merge(const ring *R, double *acc_o, double *acc_lse, const void *po, int f64, const double *plse,
                  int64_t r0, int64_t n, int64_t h0, int64_t hn)
{
    const int64_t B = R->batch, H = R->heads, dv = R->dv, cq = R->cq;
    /* each (row, head) on its own: threads change no bit */
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) num_threads(R->threads) if (B * n * hn * dv >= (1 << 16))
#endif
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t h = 0; h < hn; h++) {
                const double lb = plse[(b * hn + h) * n + i];
                double *la = &acc_lse[(b * H + h0 + h) * cq + r0 + i];
                double *oa = acc_o + ((b * cq + r0 + i) * H + h0 + h) * dv;
                const int64_t ob = ((b * n + i) * hn + h) * dv;
                if (lb == -INFINITY) continue; /* the row sees no key of this block */
                if (*la == -INFINITY) {        /* first block the row sees: the partial itself */
                    for (int64_t x = 0; x < dv; x++) oa[x] = at(po, f64, ob + x);
                    *la = lb;
                    continue;
                }
                const double a = *la;
                const double hi = a > lb ? a : lb, lo = a > lb ? lb : a;
                const double lse = (isnan(a) || isnan(lb)) ? NAN : hi + log1p(exp(lo - hi));
                const double wa = exp(a - lse), wb = exp(lb - lse);
                for (int64_t x = 0; x < dv; x++) oa[x] = wa * oa[x] + wb * at(po, f64, ob + x);
                *la = lse;
            }
}

fa_status fa_ring_forward(MPI_Comm comm, fa_ring_layout layout, const fa_tensor *q, const fa_tensor *k,
                          const fa_tensor *v, fa_tensor *o, fa_tensor *lse, const fa_options *opt,
                          fa_ring_stats *stats)
{
    const double t_start = MPI_Wtime();
    fa_ring_stats local_stats;
    fa_ring_stats *S = stats ? stats : &local_stats;
    ring R;
    fa_status st = ring_open(&R, comm, layout, opt, q, k, v);
    if (st != FA_OK) {
        ring_close(&R);
        return st;
    }
    stats_begin(S, &R);
    const int64_t B = R.batch, H = R.heads, Hk = R.heads_k, cq = R.cq, ck = R.ck, d = R.d, dv = R.dv;
    const int64_t o_shape[4] = {B, cq, H, dv}, l_shape[3] = {B, H, cq};
    st = check_out(o, "o", 4, o_shape, 0);
    if (st == FA_OK) st = check_out(lse, "lse", 3, l_shape, 1);

    const size_t kbytes = (size_t)(B * ck * Hk * d) * fa_dtype_size(k->dtype);
    const size_t vbytes = (size_t)(B * ck * Hk * dv) * fa_dtype_size(v->dtype);
    const size_t kvbytes = kbytes + vbytes;
    unsigned char *kv[2] = {NULL, NULL};
    double *acc_o = NULL, *acc_lse = NULL, *plse = NULL;
    void *po = NULL;
    const fa_dtype pdt = partial_dtype(&R.opt);
    if (st == FA_OK && kvbytes > MAX_XFER)
        st = fail(FA_ERR_SHAPE, "a K/V shard of %zu bytes is more than one ring transfer carries (%zu)", kvbytes,
                  (size_t)MAX_XFER);
    if (st == FA_OK) {
        kv[0] = malloc(kvbytes ? kvbytes : 1);
        kv[1] = malloc(kvbytes ? kvbytes : 1);
        acc_o = malloc((size_t)(B * cq * H * dv + 1) * sizeof(double));
        acc_lse = malloc((size_t)(B * H * cq + 1) * sizeof(double));
        po = malloc((size_t)(B * cq * H * dv + 1) * fa_dtype_size(pdt));
        plse = malloc((size_t)(B * H * cq + 1) * sizeof(double));
        if (!kv[0] || !kv[1] || !acc_o || !acc_lse || !po || !plse)
            st = fail(FA_ERR_NOMEM, "out of memory for the ring buffers (%zu bytes of K/V per buffer)", kvbytes);
    }
    if ((st = agree(R.comm, st)) != FA_OK) goto done;

    fill(acc_o, (size_t)(B * cq * H * dv), 0.0);
    fill(acc_lse, (size_t)(B * H * cq), -INFINITY);
    pack4(k, kv[0]);
    pack4(v, kv[0] + kbytes);
    S->step_bytes = kvbytes;

    const int next = (R.rank + 1) % R.size, prev = (R.rank + R.size - 1) % R.size;
    int cur = 0;
    fa_status local = FA_OK;
    for (int s = 0; s < R.size; s++) {
        const int src = (R.rank - s + R.size) % R.size; /* owner of the K/V block held now */
        xfer x = {.n = 0};
        if (s < R.size - 1) xfer_post(&x, kv[cur], kv[1 - cur], kvbytes, R.chunk, next, prev, 16, R.comm, S);
        const fa_tensor kt = dense(kv[cur], k->dtype, 4, B, ck, Hk, d);
        const fa_tensor vt = dense(kv[cur] + kbytes, v->dtype, 4, B, ck, Hk, dv);
        const shard ksh = make_shard(ck, R.size, src, R.layout);
        for (int a = 0; a < R.qsh.n; a++) {
            const cut c = cut_of(&R, R.qsh.s[a].len, x.n > 0);
            const int np = c.nh * c.nr;
            for (int b = 0; b < ksh.n * np; b++) {
                const int hi = (b % np) / c.nr;
                const int64_t k0 = Hk * hi / c.nh, kn = Hk * (hi + 1) / c.nh - k0, g = H / Hk, h0 = k0 * g, hn = kn * g;
                const seg qpc = piece(&R, &R.qsh.s[a], b % c.nr, c.nr), *qs = &qpc, *ks = &ksh.s[b / np];
                plan p;
                if (!plan_block(&R.g, &R.opt, is_whole(&R, qs, ks), qs, ks, &p)) {
                    S->blocks_skipped++;
                    continue;
                }
                if (local != FA_OK) continue; /* keep the ring going; report at the end */
                const double t = MPI_Wtime();
                ring_hook hook;
                block_hook(&p.o, &hook, &x, NULL);
                const fa_tensor q1 = view(q, 1, qs->loff + p.i0, p.n), qv = view(&q1, 2, h0, hn);
                const fa_tensor k1 = view(&kt, 1, ks->loff + p.j0, p.m), kb = view(&k1, 2, k0, kn);
                const fa_tensor v1 = view(&vt, 1, ks->loff + p.j0, p.m), vb = view(&v1, 2, k0, kn);
                fa_tensor ot = dense(po, pdt, 4, B, p.n, hn, dv);
                fa_tensor lt = dense(plse, FA_F64, 3, B, hn, p.n, 0);
                fa_status e = fa_forward(&qv, &kb, &vb, &ot, &lt, &p.o);
                if (e != FA_OK)
                    local = fail_lib(e, "block forward");
                else
                    merge(&R, acc_o, acc_lse, po, pdt == FA_F64, plse, qs->loff + p.i0, p.n, h0, hn);
                S->compute_s += MPI_Wtime() - t;
                S->blocks_computed++;
                S->visible_pairs += p.pairs * (double)(B * hn);
                xfer_test(&x); /* drive the transfer between blocks */
            }
        }
        xfer_wait(&x, S);
        cur = 1 - cur;
    }
    if ((st = agree(R.comm, local)) != FA_OK) goto done;
    store(o, acc_o);
    if (lse) store(lse, acc_lse);
done:
    free(kv[0]);
    free(kv[1]);
    free(acc_o);
    free(acc_lse);
    free(po);
    free(plse);
    ring_close(&R);
    S->total_s = MPI_Wtime() - t_start;
    return st;
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                  */
/* ------------------------------------------------------------------------ */

/* acc rows r0.., heads h0.. of a [B][rows][Hx][w] float64 buffer += a block [B][n][hn][w] (float32 or float64). */
static void add_rows(double *acc, int64_t rows, int64_t Hx, int64_t w, const void *blk, int f64, int64_t B, int64_t n,
                     int64_t r0, int64_t h0, int64_t hn, int threads)
{
    const int64_t hw = hn * w;
    /* element by element: threads change no bit */
#ifdef _OPENMP
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (B * n * hw >= (1 << 16))
#endif
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < n; i++) {
            double *a = acc + ((b * rows + r0 + i) * Hx + h0) * w; /* heads h0 .. h0+hn are adjacent */
            const int64_t x = (b * n + i) * hw;
            for (int64_t e = 0; e < hw; e++) a[e] += at(blk, f64, x + e);
        }
}

fa_status fa_ring_backward(MPI_Comm comm, fa_ring_layout layout, const fa_tensor *q, const fa_tensor *k,
                           const fa_tensor *v, const fa_tensor *o, const fa_tensor *lse, const fa_tensor *dout,
                           fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, const fa_options *opt,
                           fa_ring_stats *stats)
{
    const double t_start = MPI_Wtime();
    fa_ring_stats local_stats;
    fa_ring_stats *S = stats ? stats : &local_stats;
    ring R;
    fa_status st = ring_open(&R, comm, layout, opt, q, k, v);
    if (st != FA_OK) {
        ring_close(&R);
        return st;
    }
    stats_begin(S, &R);
    const int64_t B = R.batch, H = R.heads, Hk = R.heads_k, cq = R.cq, ck = R.ck, d = R.d, dvv = R.dv;
    const int64_t o_shape[4] = {B, cq, H, dvv}, l_shape[3] = {B, H, cq}, q_shape[4] = {B, cq, H, d};
    const int64_t k_shape[4] = {B, ck, Hk, d}, v_shape[4] = {B, ck, Hk, dvv};
    if ((o == NULL) != (lse == NULL)) st = fail(FA_ERR_NULL_ARG, "o and lse must both be given or both be NULL");
    int has_o = o != NULL, lo_o = 0, hi_o = 0; /* NULL recomputes over the ring: every rank must agree */
    MPI_Allreduce(&has_o, &lo_o, 1, MPI_INT, MPI_MIN, R.comm);
    MPI_Allreduce(&has_o, &hi_o, 1, MPI_INT, MPI_MAX, R.comm);
    if (st == FA_OK && lo_o != hi_o) st = fail(FA_ERR_NULL_ARG, "o and lse are NULL on some ranks only");
    if (st == FA_OK && o) st = check_out(o, "o", 4, o_shape, 0);
    if (st == FA_OK && lse) st = check_out(lse, "lse", 3, l_shape, 0);
    if (st == FA_OK) {
        if (!dout) st = fail(FA_ERR_NULL_ARG, "dout is NULL");
        else if (dout->rank != 4 || memcmp(dout->shape, o_shape, sizeof o_shape) != 0)
            st = fail(FA_ERR_SHAPE, "dout must have the shape of o [batch, c_q, heads, d_v]");
    }
    if (st == FA_OK) st = check_out(dq, "dq", 4, q_shape, 0);
    if (st == FA_OK) st = check_out(dk, "dk", 4, k_shape, 0);
    if (st == FA_OK) st = check_out(dv, "dv", 4, v_shape, 0);

    const size_t kbytes = (size_t)(B * ck * Hk * d) * fa_dtype_size(k->dtype);
    const size_t vbytes = (size_t)(B * ck * Hk * dvv) * fa_dtype_size(v->dtype);
    const size_t kvbytes = kbytes + vbytes;
    const size_t nk = (size_t)(B * ck * Hk * d), nv = (size_t)(B * ck * Hk * dvv), ndkv = nk + nv;
    unsigned char *kv[2] = {NULL, NULL};
    double *dacc[2] = {NULL, NULL}, *dstep = NULL, *dq_acc = NULL;
    void *dq_blk = NULL, *dk_blk = NULL, *dv_blk = NULL, *o_own = NULL, *l_own = NULL;
    const fa_dtype pdt = partial_dtype(&R.opt);
    const size_t pes = fa_dtype_size(pdt);
    if (st == FA_OK && (kvbytes > MAX_XFER || ndkv * sizeof(double) > MAX_XFER))
        st = fail(FA_ERR_SHAPE, "a K/V shard of %zu bytes is more than one ring transfer carries (%zu)", kvbytes,
                  (size_t)MAX_XFER);
    if (st == FA_OK) {
        kv[0] = malloc(kvbytes ? kvbytes : 1);
        kv[1] = malloc(kvbytes ? kvbytes : 1);
        dacc[0] = malloc((ndkv + 1) * sizeof(double));
        dacc[1] = malloc((ndkv + 1) * sizeof(double));
        dstep = malloc((ndkv + 1) * sizeof(double));
        dq_acc = malloc((size_t)(B * cq * H * d + 1) * sizeof(double));
        dq_blk = malloc((size_t)(B * cq * H * d + 1) * pes);
        dk_blk = malloc((nk + 1) * pes);
        dv_blk = malloc((nv + 1) * pes);
        if (!o) {
            o_own = malloc((size_t)(B * cq * H * dvv + 1) * pes);
            l_own = malloc((size_t)(B * H * cq + 1) * pes);
        }
        if (!kv[0] || !kv[1] || !dacc[0] || !dacc[1] || !dstep || !dq_acc || !dq_blk || !dk_blk || !dv_blk ||
            (!o && (!o_own || !l_own)))
            st = fail(FA_ERR_NOMEM, "out of memory for the ring buffers (%zu bytes of K/V per buffer)", kvbytes);
    }
    if ((st = agree(R.comm, st)) != FA_OK) goto done;

    fa_tensor o_t, l_t;
    if (!o) { /* the forward, over the same ring, as fa_backward recomputes it */
        o_t = dense(o_own, pdt, 4, B, cq, H, dvv); /* float32 for flash, float64 for the reference */
        l_t = dense(l_own, pdt, 3, B, H, cq, 0);
        fa_ring_stats fs;
        if ((st = fa_ring_forward(R.comm, R.layout, q, k, v, &o_t, &l_t, &R.opt, &fs)) != FA_OK) goto done;
        o = &o_t;
        lse = &l_t;
    }

    pack4(k, kv[0]);
    pack4(v, kv[0] + kbytes);
    fill(dq_acc, (size_t)(B * cq * H * d), -0.0); /* -0.0 + x == x for every x: one block gives its own bits */
    S->step_bytes = kvbytes + ndkv * sizeof(double);

    const int next = (R.rank + 1) % R.size, prev = (R.rank + R.size - 1) % R.size;
    int cur = 0, dc = 0;
    xfer dx = {.n = 0};
    fa_status local = FA_OK;
    for (int s = 0; s < R.size; s++) {
        const int src = (R.rank - s + R.size) % R.size;
        xfer x = {.n = 0};
        if (s < R.size - 1) xfer_post(&x, kv[cur], kv[1 - cur], kvbytes, R.chunk, next, prev, 16, R.comm, S);
        const fa_tensor kt = dense(kv[cur], k->dtype, 4, B, ck, Hk, d);
        const fa_tensor vt = dense(kv[cur] + kbytes, v->dtype, 4, B, ck, Hk, dvv);
        const shard ksh = make_shard(ck, R.size, src, R.layout);
        /* step 0 accumulates straight into the block's own accumulator; later
         * steps into dstep, added to the accumulator that arrives from rank-1 */
        double *target = s == 0 ? dacc[dc] : dstep;
        fill(target, ndkv, -0.0);
        for (int a = 0; a < R.qsh.n; a++) {
            const cut c = cut_of(&R, R.qsh.s[a].len, x.n > 0 || dx.n > 0);
            const int np = c.nh * c.nr;
            for (int b = 0; b < ksh.n * np; b++) {
                const int hi = (b % np) / c.nr;
                const int64_t k0 = Hk * hi / c.nh, kn = Hk * (hi + 1) / c.nh - k0, g = H / Hk, h0 = k0 * g, hn = kn * g;
                const seg qpc = piece(&R, &R.qsh.s[a], b % c.nr, c.nr), *qs = &qpc, *ks = &ksh.s[b / np];
                plan p;
                if (!plan_block(&R.g, &R.opt, is_whole(&R, qs, ks), qs, ks, &p)) {
                    S->blocks_skipped++;
                    continue;
                }
                if (local != FA_OK) continue;
                const double t = MPI_Wtime();
                ring_hook hook;
                block_hook(&p.o, &hook, &x, &dx);
                const int64_t r0 = qs->loff + p.i0, j0 = ks->loff + p.j0;
                const fa_tensor q1 = view(q, 1, r0, p.n), o1 = view(o, 1, r0, p.n), l1 = view(lse, 2, r0, p.n);
                const fa_tensor g1 = view(dout, 1, r0, p.n);
                const fa_tensor qb = view(&q1, 2, h0, hn), ob = view(&o1, 2, h0, hn), lb = view(&l1, 1, h0, hn);
                const fa_tensor gb = view(&g1, 2, h0, hn);
                const fa_tensor k1 = view(&kt, 1, j0, p.m), v1 = view(&vt, 1, j0, p.m);
                const fa_tensor kb = view(&k1, 2, k0, kn), vb = view(&v1, 2, k0, kn);
                fa_tensor dqb = dense(dq_blk, pdt, 4, B, p.n, hn, d);
                fa_tensor dkb = dense(dk_blk, pdt, 4, B, p.m, kn, d);
                fa_tensor dvb = dense(dv_blk, pdt, 4, B, p.m, kn, dvv);
                fa_status e = fa_backward(&qb, &kb, &vb, &ob, &lb, &gb, &dqb, &dkb, &dvb, &p.o);
                if (e != FA_OK) {
                    local = fail_lib(e, "block backward");
                } else {
                    const int f64 = pdt == FA_F64;
                    add_rows(dq_acc, cq, H, d, dq_blk, f64, B, p.n, r0, h0, hn, R.threads);
                    add_rows(target, ck, Hk, d, dk_blk, f64, B, p.m, j0, k0, kn, R.threads);
                    add_rows(target + nk, ck, Hk, dvv, dv_blk, f64, B, p.m, j0, k0, kn, R.threads);
                }
                S->compute_s += MPI_Wtime() - t;
                S->blocks_computed++;
                S->visible_pairs += p.pairs * (double)(B * hn);
                xfer_test(&x);
                xfer_test(&dx);
            }
        }
        if (s > 0) { /* the accumulator of block src, from rank-1, plus this step's share */
            xfer_wait(&dx, S);
            const double t = MPI_Wtime();
            double *acc = dacc[dc];
#ifdef _OPENMP
#pragma omp parallel for schedule(static) num_threads(R.threads) if (ndkv >= (1 << 16))
#endif
            for (size_t e = 0; e < ndkv; e++) acc[e] += dstep[e];
            S->compute_s += MPI_Wtime() - t;
        }
        if (R.size > 1) { /* on to rank+1; after the last step this is the hop home */
            xfer_post(&dx, dacc[dc], dacc[1 - dc], ndkv * sizeof(double), R.chunk, next, prev, 17, R.comm, S);
            dc = 1 - dc;
        }
        xfer_wait(&x, S);
        cur = 1 - cur;
    }
    xfer_wait(&dx, S); /* dacc[dc]: this rank's own dK, dV, with every rank's share */
    if ((st = agree(R.comm, local)) != FA_OK) goto done;
    store(dq, dq_acc);
    store(dk, dacc[dc]);
    store(dv, dacc[dc] + nk);
done:
    free(kv[0]);
    free(kv[1]);
    free(dacc[0]);
    free(dacc[1]);
    free(dstep);
    free(dq_acc);
    free(dq_blk);
    free(dk_blk);
    free(dv_blk);
    free(o_own);
    free(l_own);
    ring_close(&R);
    S->total_s = MPI_Wtime() - t_start;
    return st;
}
