/*
 * decode.c — the flash forward pass for few query rows (decoding).
 *
 * Why decoding needs its own driver. One generated token is one query row
 * per head against the whole KV cache: each K/V element read from memory is
 * used for 2 FLOPs per query row that reads it, so the pass is bound by the
 * memory bandwidth, not by the FMA units, and the two things that matter are
 * (1) reading every K/V byte once and (2) having every thread read.
 * flash.c's driver gets neither: it gives each query head its own task (a GQA
 * group of g query heads reads the same K/V g times), and with batch x heads
 * tasks < threads most threads have nothing to do.
 *
 * GQA packing. The g query heads of one kv head and the q_len query rows of
 * each become the rows of one tile: row r = gi * q_len + i is query row i of
 * head hk * g + gi. One K/V tile read then serves all g x q_len rows (the qk
 * and pv kernels see an ordinary Br x Bc tile). Each row keeps its own key
 * interval [lo, hi) (causal, windows) and its own ALiBi slope: the transform
 * runs per head segment of the rows.
 *
 * Tasks. A task takes several whole kv heads (as many as fit DEC_MAX_ROWS
 * rows, but few enough that there are tasks for every thread: 4 each for
 * H = 32, H_k = 8, one query row, 2 threads) and, key block by key block,
 * runs each of its kv heads' tiles in turn: in a cache laid out
 * [.., seqlen, heads_k, d] the rows j0..j0+bc of all heads are one contiguous
 * stretch, so a thread streams through memory instead of walking one head's
 * rows heads_k*d elements apart (a page or more) over the whole cache —
 * measured 1.3-1.4x faster on one thread with 65536 keys. A kv head with more
 * than DEC_MAX_ROWS rows (large groups, q_len up to FA_DECODE_MAX_Q) gets
 * tasks of its own, cut into row chunks.
 *
 * Split-KV. The key blocks that a task's rows can see are cut into
 * `splits` contiguous ranges; task (sequence, head group or chunk, split) runs
 * the online softmax over its range alone and leaves a partial (m, l, Õ):
 * running max, running sum and the unnormalized output. The partials of
 * one row merge by the same rule that merges two key blocks in the online
 * softmax (flash.c's teacher comment):
 *
 *     m = max_s m_s,   l = Σ_s e^{m_s - m} l_s,   Õ = Σ_s e^{m_s - m} Õ_s,
 *     O = Õ / l,       LSE = m + ln l
 *
 * — exact, the same sum reassociated. The merge runs in split order 0, 1,
 * ... for every row, and the split boundaries depend only on the split count
 * and the sequence, so for a fixed split count the bits do not depend on the
 * thread count or the schedule. The partials are O(batch x heads x q_len x
 * splits x d_v) floats; nothing is proportional to seqlen_q x seqlen_k.
 * (With one split a task normalizes and writes its rows itself.)
 *
 * Direct kernels. With 2 FLOPs per K/V element per row, packing costs more
 * than the arithmetic: a K tile transposed into a panel, a V tile copied, a
 * bf16 cache widened into a float32 buffer took ~3/4 of the time (measured:
 * docs/performance.md). So nothing is packed here. For each key block
 * (DEC_BLOCK_K_GQA or _MQA keys, or the caller's block_k) and kv head, the task builds the
 * row pointers of the block (dense: a stride; paged: walking the block table,
 * page by page; new keys: pack.h's accessor) and the kernel table's dec_qk
 * dots each K row, read in place, with the tile's rows in registers (f16/bf16
 * widened in registers), the transform and the online softmax run on the
 * small scores tile, and dec_pv adds P V reading each V row in place. A
 * source the kernels cannot read in place (a strided last dimension, float64)
 * is gathered to float32 rows first — the same values, so the same bits.
 * While a head's tile is computed, the next head's rows of the block are
 * prefetched (after the last head, the first head's rows of the next block):
 * hardware prefetchers stop at 4 KiB pages, and a paged cache's next page is
 * wherever the block table says. On AMD CPUs (FA_DECODE_TOUCH overrides) a task of
 * several kv heads goes by address order instead (addr_plan): it reads its first
 * block once in address order and, while it computes a block, asks for the next
 * one in address order, a few lines at a time between dec_qk's blocks of keys. On a
 * Zen 4 the prefetchers do not follow the head-by-head order; reading each block
 * first made the default GQA rows 1.2-1.5x faster there, cold, and asking spread
 * instead another 1.1-1.35x for bf16 (docs/performance.md, "Zen 4: read each block
 * once in address order first", "Zen 4: ask for the next block, spread").
 * DEC_BLOCK_K_GQA and the next-head prefetch were tuned on an Intel core without it.
 *
 * Low-precision caches. A bf16 cache moves half the bytes of a float32 one and
 * gives its bits: the widening is exact, and the kernels' arithmetic does not
 * depend on the format.
 *
 * Every KV source — dense, paged, a cache with new keys not yet appended —
 * reaches this file through pack.h's one row accessor, so a paged cache gives
 * the bits of the same cache stored contiguously.
 */
#include "decode.h"

#include "internal.h"

#include <assert.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "pack.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* Rows of one tile at most (query heads of a group x query rows). */
#define DEC_MAX_ROWS 64

/* Keys per block unless the caller pins block_k (fa_options; FA_BLOCK_K does not pin): the
 * kernels read K/V in place, so the block only sets the scores tile (rows x
 * bc floats), the per-block overhead, how far ahead the prefetch asks and —
 * with several kv heads per task — how close in time the heads' stretches of
 * the same cache rows are read. Measured on the 16-core device host, cold cache,
 * 2 threads, 3 rounds side by side (docs/examples/device_decode_ring_run2.log):
 * H = 32, H_k = 8 (4 kv heads per task): 32 keys read a bf16 cache in 12.6 /
 * 16.0 / 14.4 ms against 19.4 / 16.0 / 16.5 with 128, float32 the same (24.0 /
 * 24.5 / 25.4 against 24.9 / 25.4 / 23.7); MQA (H_k = 1, one head per task):
 * 32 keys ~10% slower than 128 (bf16 4.0-4.5 ms against 3.5-4.0 unsplit). So
 * DEC_BLOCK_K_GQA when there are several kv heads, DEC_BLOCK_K_MQA for one: a
 * property of the problem, never of the thread count (the bits must not
 * depend on it), and one block for every format, so a bf16 cache keeps the
 * bits of the same values widened to float32. With the prefetch asking for the
 * next head's rows (decode_task), one 3-round pass on the project machine read
 * float32 5-12% faster with 16 keys than with 32 but bf16 0-16% slower
 * (docs/performance.md, "Prefetch the next head"); a bf16 cache is what decoders
 * serve from, so 32 stays. */
#define DEC_BLOCK_K_GQA 32
#define DEC_BLOCK_K_MQA 128

/* Keys per dec_qk call, each preceded by the prefetch of the same keys of the rows
 * decode_task asks for next (K rows; the V rows one chunk behind). */
#define DEC_PF_KEYS 32

static size_t round16(size_t x) { return (x + 15) & ~(size_t)15; }

typedef struct dec_dims {
    int64_t group;  /* query heads per kv head */
    int64_t rows;   /* group x seqlen_q: rows of one kv head in the longest sequence */
    int64_t hpt;    /* kv heads per task (all their rows), when rows <= DEC_MAX_ROWS; else 1 */
    int64_t cph;    /* row chunks per kv head: 1, or more when rows > DEC_MAX_ROWS */
    int64_t chunks; /* tasks per sequence before splitting: cph x ceil(heads_k / hpt) */
    int64_t chunk_rows; /* most rows of one task */
    int splits;
    int bc;
    size_t ldq, ldk, ldv, lds, ldo;
} dec_dims;

int fa_decode_applies(const fa_problem *p)
{
    /* sinks, dropout and rotary are applied by flash.c's general path (not yet here) */
    return p->seqlen_q >= 1 && p->seqlen_q <= FA_DECODE_MAX_Q && !p->sinks.data && !p->keep && !p->rot_dim;
}

static dec_dims dec_layout_rows(const fa_problem *p)
{
    dec_dims g;
    memset(&g, 0, sizeof g);
    g.group = p->heads / p->heads_k;
    g.rows = g.group * p->seqlen_q;
    if (g.rows <= DEC_MAX_ROWS) {
        /* whole kv heads per task: as many as fit, but the kv heads of a sequence
         * in at least ceil(threads / batch) groups, so the unsplit tasks occupy
         * the threads whenever batch x heads_k can (the grouping never changes a
         * bit of the result: each head's tiles are computed alike in any group) */
        const int64_t fit = DEC_MAX_ROWS / g.rows < p->heads_k ? DEC_MAX_ROWS / g.rows : p->heads_k;
        int64_t want = (p->num_threads + p->batch - 1) / p->batch; /* groups per sequence */
        if (want > p->heads_k) want = p->heads_k;
        if (want < 1) want = 1;
        const int64_t hpt = (p->heads_k + want - 1) / want;
        g.cph = 1;
        g.hpt = hpt < fit ? hpt : fit;
        g.chunk_rows = g.hpt * g.rows;
    } else { /* one kv head per task, cut into row chunks */
        g.hpt = 1;
        g.cph = (g.rows + DEC_MAX_ROWS - 1) / DEC_MAX_ROWS;
        g.chunk_rows = (g.rows + g.cph - 1) / g.cph;
    }
    g.chunks = g.cph * ((p->heads_k + g.hpt - 1) / g.hpt);
    g.bc = p->blocks_pinned_k ? p->block_k : p->heads_k > 1 ? DEC_BLOCK_K_GQA : DEC_BLOCK_K_MQA;
    g.ldq = round16((size_t)p->d);
    g.ldk = round16((size_t)g.bc);
    g.ldv = round16((size_t)p->dv);
    g.lds = g.ldk;
    g.ldo = round16((size_t)p->dv);
    return g;
}

int fa_decode_splits(const fa_problem *p)
{
    const dec_dims g = dec_layout_rows(p);
    const int64_t nkb = (p->seqlen_k + g.bc - 1) / g.bc; /* key blocks of the longest sequence */
    int64_t cap = nkb < FA_DECODE_MAX_SPLITS ? nkb : FA_DECODE_MAX_SPLITS;
    if (cap < 1) cap = 1;
    if (p->num_splits > 0) return (int)(p->num_splits < cap ? p->num_splits : cap);
    /* heuristic: split only when heads_k x row chunks (the unsplit tasks of one
     * sequence, one kv head each) number fewer than FA_DECODE_SPLIT_TASKS, and
     * then into enough splits to make that many. It looks at neither the thread
     * count nor the batch, so the default gives the same bits on any number of
     * threads (flashattn.h's promise) and a sequence the same bits alone or in
     * a batch. (The clamp to the longest sequence's key blocks does not break
     * the latter: a task cuts its own nkb visible blocks into splits, and once
     * splits >= nkb every split holds one block or none, in key order, so its
     * bits depend on min(splits, nkb) only, the same either way.) */
    const int64_t tasks = p->heads_k * g.cph;
    const int64_t n = tasks >= FA_DECODE_SPLIT_TASKS || tasks < 1 ? 1 : (FA_DECODE_SPLIT_TASKS + tasks - 1) / tasks;
    return (int)(n < cap ? n : cap);
}

static dec_dims dec_layout(const fa_problem *p)
{
    dec_dims g = dec_layout_rows(p);
    g.splits = fa_decode_splits(p);
    if (g.cph == 1 && g.splits > 1) {
        /* Split-KV already gives every sequence `splits` tasks per head group: group
         * the kv heads so that batch x groups x splits just covers the threads, and
         * no finer. Each task then streams whole cache rows (all its sequence's kv
         * heads of keys j0..j0+bc: one contiguous stretch of [.., seqlen, heads_k, d])
         * instead of two threads reading the two halves of the same rows at once —
         * shorter, interleaved streams that the hardware prefetchers follow worse.
         * (The grouping never changes a bit: a head's tiles are computed alike in any
         * group, and the split boundaries depend on the split count only.) Measured
         * on the device host, H = 32, H_k = 8, 2 threads, cold, 3 rounds side by side
         * (docs/examples/device_decode_group_ab.log; a noisy call): the heuristic's rows
         * new/old 1.13 / 1.03 / 1.07 (f32), 0.92 / 0.97 / 1.22 (bf16), paged 16
         * 1.13 / 1.02 / 1.05 and 1.18 / 1.03 / 1.29 — not worse, gains within the noise. */
        const int64_t per = p->batch * g.splits;
        int64_t want = (p->num_threads + per - 1) / per;
        if (want > p->heads_k) want = p->heads_k;
        if (want < 1) want = 1;
        const int64_t fit = DEC_MAX_ROWS / g.rows < p->heads_k ? DEC_MAX_ROWS / g.rows : p->heads_k;
        const int64_t hpt = (p->heads_k + want - 1) / want;
        g.hpt = hpt < fit ? hpt : fit;
        g.chunk_rows = g.hpt * g.rows;
        g.chunks = (p->heads_k + g.hpt - 1) / g.hpt;
    }
    return g;
}

/* Per-thread scratch. */
typedef struct dec_scratch {
    float *qi;    /* [cr][ldq]  the chunk's query rows */
    float *kr;    /* [bc][ldq]  K rows gathered to float32 (only sources the kernels cannot read in place) */
    float *vj;    /* [bc][ldv]  V rows likewise */
    float *s;     /* [cr][lds]  scores, then P */
    float *oa;    /* [cr][ldo]  Õ */
    float *keep;  /* [cr][ldo]  Õ before a P V (restored when V held Inf/NaN) */
    float *m, *l, *alpha; /* [cr] */
    int64_t *lo, *hi;     /* [cr] visible keys of each row */
    const void **rp; /* [hpt][2][2][bc] row pointers of each head of the task: this block's and the
                      * next one's (double-buffered), K then V */
    const void **plan; /* [2][2][bc] an addr_plan's stretches: starts (K rows, V rows), then ends */
    void *base;
} dec_scratch;

static size_t scratch_floats(const fa_problem *p, const dec_dims *g)
{
    const size_t cr = (size_t)g->chunk_rows, r16 = round16(cr), b16 = round16((size_t)g->bc);
    return cr * g->ldq + (size_t)g->bc * g->ldq + (size_t)g->bc * g->ldv + cr * g->lds + 2 * cr * g->ldo +
           3 * r16 + 4 * r16 /* lo, hi: int64 */ + 2 * 4 * (size_t)g->hpt * b16 /* rp */ +
           2 * 4 * b16 /* plan */ + 16 * 10;
    (void)p;
}

static int scratch_alloc(const fa_problem *p, const dec_dims *g, dec_scratch *sc)
{
    float *base = fa_scratch_alloc(p, scratch_floats(p, g) * sizeof(float));
    sc->base = base;
    if (!base) return 0;
    const size_t cr = (size_t)g->chunk_rows, r16 = round16(cr);
    float *cur = base;
    /* each piece starts 64-byte aligned (the allocation is) */
#define TAKE(ptr, n) do { ptr = cur; cur += round16(n); } while (0)
    TAKE(sc->qi, cr * g->ldq);
    TAKE(sc->kr, (size_t)g->bc * g->ldq);
    TAKE(sc->vj, (size_t)g->bc * g->ldv);
    TAKE(sc->s, cr * g->lds);
    TAKE(sc->oa, cr * g->ldo);
    TAKE(sc->keep, cr * g->ldo);
    TAKE(sc->m, r16);
    TAKE(sc->l, r16);
    TAKE(sc->alpha, r16);
#undef TAKE
    sc->lo = (int64_t *)cur;
    cur += 2 * r16;
    sc->hi = (int64_t *)cur;
    cur += 2 * r16;
    sc->rp = (const void **)cur;
    sc->plan = sc->rp + 4 * (size_t)g->hpt * round16((size_t)g->bc);
    return 1;
}

/* The partials of split-KV: per (sequence, kv head, row, split) the running
 * max and sum (ml[2]) and Õ [dv]. */
typedef struct dec_partials {
    float *o;  /* [batch][heads_k][rows][splits][dv] */
    float *ml; /* [batch][heads_k][rows][splits][2] */
} dec_partials;

static size_t partial_index(const fa_problem *p, const dec_dims *g, int64_t b, int64_t hk, int64_t r, int s)
{
    return (((size_t)b * (size_t)p->heads_k + (size_t)hk) * (size_t)g->rows + (size_t)r) * (size_t)g->splits +
           (size_t)s;
}

static size_t partial_floats(const fa_problem *p, const dec_dims *g)
{
    if (g->splits <= 1) return 0;
    const size_t n = fa_mul_sat(fa_mul_sat((size_t)p->batch * (size_t)p->heads_k, (size_t)g->rows),
                                (size_t)g->splits);
    return fa_add_sat(fa_mul_sat(n, (size_t)p->dv), fa_mul_sat(n, 2)) + 16;
}

size_t fa_decode_workspace(const fa_problem *p)
{
    const dec_dims g = dec_layout(p);
    const int64_t tasks = p->batch * g.chunks * g.splits;
    const size_t threads = (size_t)fa_threads_for(p, tasks);
    return fa_add_sat(fa_mul_sat(threads, fa_mul_sat(scratch_floats(p, &g), sizeof(float))),
                      fa_mul_sat(partial_floats(p, &g), sizeof(float)));
}

/* Row j of a KV source as float32 into dst[width]: f16/bf16 rows through the
 * kernel table's SIMD widening when it has one. */
static void gather_row(const fa_kernels *kern, const fa_rows *s, int64_t j, float *dst)
{
    int64_t off;
    const fa_tensor *t = fa_rows_src(s, j, &off);
    if (kern->widen && t->stride[3] == 1 && (t->dtype == FA_F16 || t->dtype == FA_BF16)) {
        kern->widen((int)s->width, (const uint16_t *)t->data + off, t->dtype == FA_BF16, dst);
        return;
    }
    fa_gather_f32(t, off, t->stride[3], s->width, dst);
}

/* The dec_qk/dec_pv format of a tensor's rows, or -1 when the kernels cannot read them in place. */
static int row_fmt(const fa_tensor *t)
{
    if (t->stride[3] != 1) return -1;
    return t->dtype == FA_F32 ? FA_ROW_F32 : t->dtype == FA_F16 ? FA_ROW_F16 : t->dtype == FA_BF16 ? FA_ROW_BF16 : -1;
}

/*
 * Pointers to rows j0 .. j0 + n - 1 of a KV source (ptr[x] -> row j0 + x), as
 * pack.h's accessor places them (dense, paged, new keys), and their format:
 * 1 when every row is stored contiguously in one format the kernels read,
 * else 0. A paged source is walked page by page (one division per call, not
 * per row).
 */
static int row_ptrs(const fa_rows *s, int64_t j0, int n, const void **ptr, int *fmt)
{
    int f = -1, x = 0;
    const int64_t end = s->tail && s->tail_from < j0 + n ? s->tail_from : j0 + n;
    if (j0 < end) {
        const fa_tensor *t = s->t;
        if ((f = row_fmt(t)) < 0) return 0;
        const int64_t esz = (int64_t)fa_dtype_size(t->dtype), nm = end - j0, r0 = s->row0 + j0;
        const char *base = (const char *)t->data;
        if (s->pages) {
            int64_t pg = r0 / s->page_size, w = r0 % s->page_size;
            const int64_t step = esz * t->stride[1];
            while (x < nm) {
                const char *rp = base + esz * fa_off4(t, s->pages[pg], 0, s->head, 0) + w * step;
                for (; w < s->page_size && x < nm; w++, x++, rp += step) ptr[x] = rp;
                w = 0;
                pg++;
            }
        } else {
            const int64_t step = esz * t->stride[1];
            const char *rp = base + esz * fa_off4(t, s->batch, r0, s->head, 0);
            for (; x < nm; x++, rp += step) ptr[x] = rp;
        }
    }
    for (; x < n; x++) { /* new keys, not yet appended */
        int64_t off;
        const fa_tensor *t = fa_rows_src(s, j0 + x, &off);
        const int g = row_fmt(t);
        if (g < 0 || (f >= 0 && g != f)) return 0;
        f = g;
        ptr[x] = (const char *)t->data + (int64_t)fa_dtype_size(t->dtype) * off;
    }
    *fmt = f < 0 ? FA_ROW_F32 : f;
    return 1;
}

/* Row pointers for rows j0 .. j0 + n - 1 that the kernels can read: in place
 * when row_ptrs can, else gathered to float32 rows of buf [n][ld]. */
static int kv_rows(const fa_kernels *kern, const fa_rows *s, int64_t j0, int n, const void **ptr, float *buf, size_t ld)
{
    int fmt;
    if (row_ptrs(s, j0, n, ptr, &fmt)) return fmt;
    for (int x = 0; x < n; x++) {
        gather_row(kern, s, j0 + x, buf + (size_t)x * ld);
        ptr[x] = buf + (size_t)x * ld;
    }
    return FA_ROW_F32;
}

/*
 * Ask the cache for the n rows at ptr (a hint), each `bytes` long: one prefetch per 64-byte
 * line, into L1 (prefetcht0). Measured on one core of the project Xeon, cold 32768-key cache,
 * H = 32, H_k = 8, d = 128, 3 interleaved rounds (shared machine, indicative): prefetcht0
 * against prefetcht1 (into L2), bf16 14.8-14.9 against 16.2-16.4 ms, paged (16) float32
 * 28.2-28.6 against 37.6-38.7, paged bf16 16.0 against 18.6-19.6; a dense float32 cache
 * 23.3-24.5 ms with them against 25.9-26.8 without (in L2 they cost float32 ~20%, bf16 ~3%);
 * prefetchnta 40 ms — all measured when the prefetch asked for the same head's next block;
 * with the next head's rows (decode_task) a review found prefetcht1 as fast as t0 (one core,
 * 2 rounds: f32 22.0-22.4 against 21.4-22.6 ms, bf16 13.1-13.3 against 13.4-13.6). (Keep
 * the address as ptr[x] + b: GCC 12 drops every prefetch of this function when ptr[x] is
 * first held in a local variable — f6649b4 shipped that, and its warm-cache gain was the
 * prefetches gone.)
 */
static void prefetch_ptrs(const void *const *ptr, int n, size_t bytes)
{
    for (int x = 0; x < n; x++) {
        /* to the line of the row's last byte, wherever in its line the row starts */
        const size_t span = bytes + ((uintptr_t)ptr[x] & 63);
#pragma GCC unroll 8
        for (size_t b = 0; b < span; b += 64) __builtin_prefetch((const char *)ptr[x] + b, 0, 3);
        /* a compiler barrier: without it GCC 12 drops every prefetch of this loop once the
         * span is computed from ptr[x] (checked by tests/test_prefetch_kept.sh) */
        __asm__ volatile("" ::: "memory");
    }
}

/*
 * Address order (AMD CPUs by default; FA_DECODE_TOUCH=0/1 overrides; p->decode_touch).
 * A task of several kv heads computes a block head by head, which reads each head's
 * rows heads_k x d elements apart, a new 4 KiB page per row: on an AMD Zen 4 core the
 * prefetchers do not follow that, and one core read 11 GB/s where an ascending run
 * reads 33-35 (tools/decode_pattern.c, orders 0 and 2). In a cache [.., seqlen,
 * heads_k, d] (dense or paged) the rows j0 .. j0 + n - 1 of heads hk0 .. hk1 are one
 * stretch per key, from head hk0's row to the end of head hk1's, and a dense block
 * is one ascending run. So the decoder
 *   - reads the first block of a task once in that order (addr_touch: one load per
 *     64-byte line), and
 *   - while it computes a block, asks for the next one in that order (prefetcht2),
 *     each head 1/nh of its lines, a few at a time between dec_qk's blocks of keys
 *     (fa_between), paced by the fraction of the call done (addr_share).
 * Asking for the whole next block in one burst, or a head's share at once, stalls on
 * full fill buffers; reading each block before computing it (the first version) adds
 * the block's memory time to its compute time. Spread, the two overlap: on the Zen 4,
 * cold, 2 threads, bf16 1.15-1.31x faster than the read-first version (paged 1.23-
 * 1.50x, one query row a kv head 1.4-1.7x), float32 0.90-1.26x (docs/performance.md,
 * "Zen 4: ask for the next block, spread"). Warm (K/V already in L2/L3) both cost
 * 12-22% over no address order. Nothing is computed from the loads or the asks, so
 * the bits do not change. Only where the task's heads' rows are exactly next to each
 * other in a key's row (addr_plan; a gap may be another cache slot, another view's
 * heads or a row past the sequence, which is never read) and the rows are read in
 * place. On the Intel machines measured before, the prefetchers followed the
 * head-by-head order, and reading or asking in address order was slower there
 * (docs/performance.md, "Prefetch the next head"): off by default.
 */
typedef struct addr_plan {
    const void **lo, **hi; /* [2][bc] stretches, K rows' then V rows' (dec_scratch's plan) */
    int n, at;             /* stretches; the one the cursor is in */
    const char *q;         /* the next line to ask for */
    size_t lines;          /* lines of all stretches */
} addr_plan;

/* The stretches of rows j0 .. j0 + n - 1 of kv heads hk0 .. hk1, K then V, into a->lo/hi
 * (room for 2n each); 0 when a source is not read in place or the heads' rows are not
 * exactly adjacent. */
static int addr_plan_make(const fa_problem *p, const fa_seq *seq, int64_t hk0, int64_t hk1, int64_t j0, int n,
                          addr_plan *a)
{
    a->n = a->at = 0;
    a->lines = 0;
    if (n <= 0) return 0;
    for (int kv = 0; kv < 2; kv++) {
        const fa_rows first = fa_rows_kv(p, seq, hk0, kv), last = fa_rows_kv(p, seq, hk1, kv);
        const void **f = a->lo + a->n, **e = a->hi + a->n;
        int ff, fe;
        if (!row_ptrs(&first, j0, n, f, &ff) || !row_ptrs(&last, j0, n, e, &fe) || ff != fe) return 0;
        const size_t rb = (size_t)first.width * (ff == FA_ROW_F32 ? 4 : 2);
        for (int x = 0; x < n; x++) {
            const uintptr_t lo = (uintptr_t)f[x], hi = (uintptr_t)e[x] + rb;
            if (hi < lo || hi - lo != (size_t)(hk1 - hk0 + 1) * rb) return 0;
            e[x] = (const char *)e[x] + rb;
            a->lines += (size_t)(((hi - 1) >> 6) - (lo >> 6) + 1);
        }
        a->n += n;
    }
    a->q = a->lo[0];
    return 1;
}

/* Read every line of the plan once: the first byte of a stretch, then the start of each
 * later line of it — never a byte outside [lo, hi). */
static void addr_touch(const addr_plan *a)
{
    for (int s = 0; s < a->n; s++) {
        /* volatile: the compiler keeps loads whose values nothing uses; a char may alias anything */
        (void)*(const volatile unsigned char *)a->lo[s];
        for (uintptr_t q = ((uintptr_t)a->lo[s] | 63) + 1; q < (uintptr_t)a->hi[s]; q += 64)
            (void)*(const volatile unsigned char *)q;
    }
}

/* Tests only: a block computed in address order, and whether the plan asked for during
 * the previous block (asked_this) was this block's (starts at head hk0's K row j0). */
static void addr_count(const fa_problem *p, const fa_seq *seq, int64_t hk0, int64_t j0, int asked_this,
                       const addr_plan *a)
{
    atomic_fetch_add_explicit(&fa_count_addr_blocks, 1, memory_order_relaxed);
    if (!asked_this) return;
    const fa_rows first = fa_rows_kv(p, seq, hk0, 0);
    const void *row;
    int f;
    const int same = row_ptrs(&first, j0, 1, &row, &f) && a->n > 0 && a->lo[0] == row;
    atomic_fetch_add_explicit(same ? &fa_count_asked : &fa_count_ask_bad, 1, memory_order_relaxed);
}

/* Whether every line of the plan was asked for. */
static int addr_done(const addr_plan *a)
{
    return a->at >= a->n || (a->at == a->n - 1 && (uintptr_t)a->q >= (uintptr_t)a->hi[a->at]);
}

/* Ask for the plan's next k lines, in order: prefetcht2 (into L2 on x86; t0 was measured
 * slower, t1 as fast), PLDL2KEEP on Arm. A prefetch may be dropped by the core; that
 * costs speed only. */
static void addr_ask(addr_plan *a, size_t k)
{
    while (k > 0 && a->at < a->n) {
        uintptr_t q = (uintptr_t)a->q;
        const uintptr_t hi = (uintptr_t)a->hi[a->at];
        for (; k > 0 && q < hi; k--) { /* the stretch's lines, in registers */
#if defined(__aarch64__)
            __builtin_prefetch((const void *)q, 0, 2);
#else
            __builtin_prefetch((const void *)q, 0, 1);
#endif
            q = (q | 63) + 1;
        }
        a->q = (const char *)q;
        if (q >= hi && ++a->at < a->n) a->q = a->lo[a->at];
    }
}

/* A head's share of the next block's plan, asked for between dec_qk's blocks at the pace
 * of the call: before block `done` of `total`, up to share * (done + 1) / total lines. */
typedef struct addr_share {
    addr_plan *plan;
    size_t from, span; /* lines of the head's share asked for before this dec_qk call; its part */
    size_t asked;      /* lines of the head's share asked for so far */
} addr_share;

static void addr_share_upto(addr_share *h, size_t upto)
{
    if (upto > h->asked) {
        addr_ask(h->plan, upto - h->asked);
        h->asked = upto;
    }
}

/* fa_between's fn: before block `done` of the call's `total`, its part up to (done + 1) / total. */
static void addr_share_ask(void *ctx, int done, int total)
{
    addr_share *h = ctx;
    addr_share_upto(h, h->from + (h->span * (size_t)(done + 1) + (size_t)total - 1) / (size_t)total);
}

/* Whether every element of rows [0, nr) x [0, dv) is finite. */
static int rows_finite(const float *o, int nr, int64_t dv, size_t ldo)
{
    uint32_t bad = 0;
    for (int r = 0; r < nr; r++) {
        const float *row = o + (size_t)r * ldo;
        for (int64_t c = 0; c < dv; c++) {
            uint32_t u;
            memcpy(&u, &row[c], 4);
            bad |= (u & 0x7f800000u) == 0x7f800000u;
        }
    }
    return !bad;
}

/*
 * P V for a tile whose V holds Inf or NaN (see flash.c's pv_masked_rows): the
 * fast kernel multiplies the P = 0 of masked keys into V too, and 0 * Inf is
 * NaN, which would leak into rows that cannot see the bad key. Each row here
 * multiplies only its visible keys.
 */
static void pv_masked_rows(const fa_kernels *kern, int r0, int nr, int64_t j0, int bc, int64_t dv,
                           const dec_scratch *sc, size_t lds, const void *const *vp, int vfmt, size_t ldo)
{
    for (int r = r0; r < r0 + nr; r++) {
        int64_t a = sc->lo[r] - j0, e = sc->hi[r] - j0;
        if (a < 0) a = 0;
        if (e > bc) e = bc;
        float *orow = sc->oa + (size_t)r * ldo;
        if (a >= e) {
            for (int64_t c = 0; c < dv; c++) orow[c] *= sc->alpha[r];
            continue;
        }
        kern->dec_pv(1, (int)(e - a), (int)dv, sc->s + (size_t)r * lds + a, lds, vp + a, vfmt, &sc->alpha[r], orow,
                     ldo);
    }
}

/*
 * Normalize one row and write O (and LSE): query row i of head h of sequence
 * b, from its running max m, sum l and Õ (pack.h's fa_finish_row, as flash.c;
 * empty from the key range only). An attention sink would be added there —
 * once per row, after the merge, never per split.
 */
static void finalize_row(const fa_problem *p, int64_t b, int64_t h, int64_t i, float m, float l, const float *orow)
{
    const fa_seq seq = fa_problem_seq(p, b);
    const fa_rows os = fa_rows_q(&p->o, &seq, h);
    int64_t lo, hi;
    fa_key_range_in(p, &seq, i, &lo, &hi);
    fa_finish_row(p, &os, &seq, h, i, !(lo < hi), m, l, orow);
}

/*
 * One task: sequence b, task group c (kv heads [c*hpt, ..) with all their rows,
 * or, when one kv head has more than DEC_MAX_ROWS rows, row chunk c % cph of kv
 * head c / cph), key split sp. Within each key block the kv heads of the task
 * are taken one after the other, so a thread reads the rows j0..j0+bc of all
 * its heads — in a cache [.., seqlen, heads_k, d], one contiguous stretch —
 * rather than one head's rows heads_k*d elements apart over the whole cache.
 */
static void decode_task(const fa_problem *p, const fa_kernels *kern, const dec_dims *g, dec_scratch *sc,
                        const dec_partials *part, int64_t b, int64_t c, int sp)
{
    const int64_t d = p->d, dv = p->dv;
    const fa_seq seq = fa_problem_seq(p, b);
    const int64_t q_len = seq.q_len;
    if (q_len <= 0) return;
    const int64_t rows = g->group * q_len; /* rows of one kv head in this sequence */
    /* the task's heads: hk of head t, its rows [ra, ra + (off[t+1]-off[t])) at task rows off[t].. */
    int64_t hks[DEC_MAX_ROWS], ra[DEC_MAX_ROWS];
    int off[DEC_MAX_ROWS + 1], nh = 0;
    off[0] = 0;
    if (g->cph == 1) {
        const int64_t hk0 = c * g->hpt, hk1 = hk0 + g->hpt < p->heads_k ? hk0 + g->hpt : p->heads_k;
        for (int64_t hk = hk0; hk < hk1; hk++, nh++) {
            hks[nh] = hk;
            ra[nh] = 0;
            off[nh + 1] = off[nh] + (int)rows;
        }
    } else {
        const int64_t per = (rows + g->cph - 1) / g->cph, r0 = (c % g->cph) * per;
        const int64_t r1 = r0 + per < rows ? r0 + per : rows;
        if (r0 >= r1) return;
        hks[0] = c / g->cph;
        ra[0] = r0;
        off[1] = (int)(r1 - r0);
        nh = 1;
    }
    const int nr = off[nh];
    if (nr <= 0) return;

    /* the task's query rows: task row off[t] + x is row q = ra[t] + x of kv head hks[t],
     * i.e. query row q % q_len of head hks[t]*group + q / q_len */
    int64_t jmin = seq.k_len, jmax = 0;
    for (int t = 0; t < nh; t++)
        for (int r = off[t]; r < off[t + 1]; r++) {
            const int64_t q = ra[t] + (r - off[t]), h = hks[t] * g->group + q / q_len, i = q % q_len;
            const fa_rows qs = fa_rows_q(&p->q, &seq, h);
            fa_rows_gather(&qs, i, sc->qi + (size_t)r * g->ldq);
            fa_key_range(p, b, i, &sc->lo[r], &sc->hi[r]);
            if (sc->lo[r] < sc->hi[r]) {
                if (sc->lo[r] < jmin) jmin = sc->lo[r];
                if (sc->hi[r] > jmax) jmax = sc->hi[r];
            }
            sc->m[r] = -INFINITY;
            sc->l[r] = 0.0f;
            memset(sc->oa + (size_t)r * g->ldo, 0, (size_t)dv * sizeof(float));
        }

    /* this split's share of the key blocks some row can see */
    if (jmin < jmax) {
        const int64_t kb0 = jmin / g->bc, kb1 = (jmax + g->bc - 1) / g->bc, nkb = kb1 - kb0;
        const int64_t kbs = kb0 + nkb * sp / g->splits, kbe = kb0 + nkb * (sp + 1) / g->splits;
        /* per head t: rp[t][buf][0 = K, 1 = V][bc]; buffer (kb - kbs) & 1 holds this block's
         * pointers, the other the next block's, which row_ptrs fills (when the rows can be
         * read in place: nkf/nvf[t] >= 0) while this block is computed */
        int nkf[DEC_MAX_ROWS], nvf[DEC_MAX_ROWS];
        const size_t b16 = round16((size_t)g->bc);
        /* address order (see addr_plan): the next block's plan, asked for spread over this
         * block's dec_qk key blocks (addr_share); a block not asked for is read first */
        const int addr = nh > 1 && p->decode_touch;
        addr_plan next = {sc->plan, sc->plan + 2 * b16, 0, 0, NULL, 0};
        addr_share share = {&next, 0, 0, 0};
        const fa_between between = {addr_share_ask, &share};
        int ask_next = 0; /* the next block is asked for during this one */
        for (int64_t kb = kbs; kb < kbe; kb++) {
            const int64_t j0 = kb * g->bc;
            const int bc = (int)(seq.k_len - j0 < g->bc ? seq.k_len - j0 : g->bc);
            const int64_t j1 = j0 + g->bc;
            const int n1 = kb + 1 < kbe ? (int)(seq.k_len - j1 < g->bc ? seq.k_len - j1 : g->bc) : 0;
            const int cur = (int)((kb - kbs) & 1);
            size_t head_lines = 0; /* each head's share of the next block's lines */
            if (addr) {
                const int asked_this = ask_next; /* this block was asked for during the previous one */
                if (fa_count_test > 0) addr_count(p, &seq, hks[0], j0, asked_this, &next); /* tests only */
                if (!asked_this && addr_plan_make(p, &seq, hks[0], hks[nh - 1], j0, bc, &next)) {
                    addr_touch(&next); /* read first */
                    if (fa_count_test > 0) atomic_fetch_add_explicit(&fa_count_touched, 1, memory_order_relaxed);
                }
                ask_next = n1 > 0 && addr_plan_make(p, &seq, hks[0], hks[nh - 1], j1, n1, &next);
                if (ask_next) head_lines = (next.lines + (size_t)nh - 1) / (size_t)nh;
            }
            for (int t = 0; t < nh; t++) {
                const int64_t hk = hks[t];
                const int rt = off[t], nt = off[t + 1] - off[t];
                const fa_rows ks = fa_rows_kv(p, &seq, hk, 0), vs = fa_rows_kv(p, &seq, hk, 1);
                float *st = sc->s + (size_t)rt * g->lds, *ot = sc->oa + (size_t)rt * g->ldo;
                const void **kp = sc->rp + ((size_t)t * 4 + (size_t)cur * 2) * b16, **vp = kp + b16;
                const void **kn = sc->rp + ((size_t)t * 4 + (size_t)(cur ^ 1) * 2) * b16, **vn = kn + b16;
                /* this block's pointers: made while the previous block ran, else now (a gather
                 * to float32 rows when the source cannot be read in place) */
                const int kfmt = kb > kbs && nkf[t] >= 0 ? nkf[t] : kv_rows(kern, &ks, j0, bc, kp, sc->kr, g->ldq);
                const int vfmt0 = kb > kbs && nvf[t] >= 0 ? nvf[t] : -1;
                /* the next block's, once */
                nkf[t] = nvf[t] = -1;
                if (n1 > 0) {
                    int f;
                    if (row_ptrs(&ks, j1, n1, kn, &f)) nkf[t] = f;
                    if (row_ptrs(&vs, j1, n1, vn, &f)) nvf[t] = f;
                }
                /* What to ask the cache for while this tile is computed: the next head's rows
                 * of this block (pointers made during the previous block; none yet in the
                 * first), after the last head the first head's rows of the next block (made
                 * during head 0 of this block). That is one head's K and V ahead (16-32 KiB
                 * at d = 128, 32 keys) where the same head's next block, asked for before,
                 * was a whole block of every head ahead (64-256 KiB). Measured faster (one
                 * 3-round pass on the project machine, 2 threads, H_k = 8: float32 63-68% ->
                 * 80-83% of bench's bandwidth, bf16 60-66% -> 66-67%; docs/performance.md,
                 * "Prefetch the next head"); why is not established: into L2 (prefetcht1)
                 * does as well, so it is not that the lines stay in L1. With one kv head per
                 * task (MQA, row chunks, threads >= heads_k) this is the old target. */
                const void **pk, **pv;
                int pn, pkf, pvf;
                if (t + 1 < nh) {
                    pk = sc->rp + ((size_t)(t + 1) * 4 + (size_t)cur * 2) * b16;
                    pn = kb > kbs ? bc : 0;
                    pkf = pn > 0 ? nkf[t + 1] : -1;
                    pvf = pn > 0 ? nvf[t + 1] : -1;
                } else {
                    pk = sc->rp + (size_t)(cur ^ 1) * 2 * b16;
                    pn = n1;
                    pkf = nkf[0];
                    pvf = nvf[0];
                }
                pv = pk + b16;
                const size_t kbytes = (size_t)ks.width * (pkf == FA_ROW_F32 ? 4 : 2);
                const size_t vbytes = (size_t)vs.width * (pvf == FA_ROW_F32 ? 4 : 2);
                /* rows read in place, and the next block not asked for in address order */
                const int pfk = !ask_next && pkf >= 0, pfv = !ask_next && pvf >= 0;
                /* the scores DEC_PF_KEYS keys at a time, asking before each call for the
                 * same keys of the rows above (K rows; V rows a chunk behind, the last V
                 * chunk before dec_pv): hardware prefetchers stop at 4 KiB pages, one kv
                 * head's rows are heads_k*d elements apart, and a paged cache's next page is
                 * wherever the block table says. With MQA's 128-key blocks the asks are
                 * spread over four calls (measured with 128-key blocks, earlier: one burst
                 * per block stalled on full fill buffers, bf16 5.1-5.6 GB/s on one core vs
                 * 7.0 spread; f32 6.6 vs 7.1); with the 32-key blocks of grouped heads there
                 * is one call per block, so one K and one V burst per head and block. A
                 * score does not depend on the other keys of the call, so the bits are the
                 * same. */
                int vdone = 0; /* V rows asked for */
                share.asked = 0;
                for (int c0 = 0; c0 < bc; c0 += DEC_PF_KEYS) {
                    const int nc = bc - c0 < DEC_PF_KEYS ? bc - c0 : DEC_PF_KEYS;
                    const int np = pn - c0 < nc ? pn - c0 : nc;
                    if (np > 0 && pfk) prefetch_ptrs(pk + c0, np, kbytes);
                    if (c0 > 0 && pfv) {
                        const int nv = (pn < c0 ? pn : c0) - vdone;
                        if (nv > 0) prefetch_ptrs(pv + vdone, nv, vbytes);
                        vdone += nv > 0 ? nv : 0;
                    }
                    /* this call's part of the head's share: up to (c0 + nc) / bc of it */
                    share.from = share.asked;
                    share.span = (head_lines * (size_t)(c0 + nc) + (size_t)bc - 1) / (size_t)bc - share.from;
                    kern->dec_qk(nt, nc, (int)d, sc->qi + (size_t)rt * g->ldq, g->ldq, kp + c0, kfmt,
                                 (float)p->scale, st + c0, g->lds, ask_next ? &between : NULL);
                    if (ask_next) addr_share_upto(&share, share.from + share.span); /* what the hook left */
                }
                if (pfv && pn > vdone) prefetch_ptrs(pv + vdone, pn - vdone, vbytes);
                /* softcap, ALiBi and the mask per query-head segment (its own rows i and slope) */
                int full = 1; /* every row of the tile sees every key of the block */
                for (int r = rt; r < rt + nt;) {
                    const int64_t q = ra[t] + (r - rt), gi = q / q_len, i = q % q_len;
                    int n = (int)(q_len - i);
                    if (n > rt + nt - r) n = rt + nt - r;
                    fa_transform_tile(p, b, i, n, j0, bc, fa_alibi_slope(p, b, hk * g->group + gi), sc->lo + r,
                                      sc->hi + r, sc->s + (size_t)r * g->lds, g->lds);
                    r += n;
                }
                for (int r = rt; r < rt + nt; r++) full &= sc->lo[r] <= j0 && sc->hi[r] >= j0 + bc;
                kern->softmax(nt, bc, st, g->lds, sc->m + rt, sc->l + rt, sc->alpha + rt);
                const int vfmt = vfmt0 >= 0 ? vfmt0 : kv_rows(kern, &vs, j0, bc, vp, sc->vj, g->ldv);
                if (full) { /* no P = 0 from the mask: any Inf/NaN of V reaches only rows that see it */
                    kern->dec_pv(nt, bc, (int)dv, st, g->lds, vp, vfmt, sc->alpha + rt, ot, g->ldo);
                    continue;
                }
                for (int r = rt; r < rt + nt; r++)
                    memcpy(sc->keep + (size_t)r * g->ldo, sc->oa + (size_t)r * g->ldo, (size_t)dv * sizeof(float));
                kern->dec_pv(nt, bc, (int)dv, st, g->lds, vp, vfmt, sc->alpha + rt, ot, g->ldo);
                /* V with Inf/NaN (or rows already non-finite): redo the P V per row over
                 * its visible keys only, from Õ as it was (0 * Inf of a masked key
                 * would leak NaN into a row that cannot see it) */
                if (!rows_finite(ot, nt, dv, g->ldo)) {
                    for (int r = rt; r < rt + nt; r++)
                        memcpy(sc->oa + (size_t)r * g->ldo, sc->keep + (size_t)r * g->ldo, (size_t)dv * sizeof(float));
                    pv_masked_rows(kern, rt, nt, j0, bc, dv, sc, g->lds, vp, vfmt, g->ldo);
                }
            }
            if (ask_next && fa_count_test > 0 && !addr_done(&next)) /* tests only */
                atomic_fetch_add_explicit(&fa_count_ask_bad, 1, memory_order_relaxed);
        }
    }

    for (int t = 0; t < nh; t++)
        for (int r = off[t]; r < off[t + 1]; r++) {
            const int64_t q = ra[t] + (r - off[t]), h = hks[t] * g->group + q / q_len, i = q % q_len;
            const float *orow = sc->oa + (size_t)r * g->ldo;
            if (g->splits == 1) {
                finalize_row(p, b, h, i, sc->m[r], sc->l[r], orow);
            } else {
                const size_t at = partial_index(p, g, b, hks[t], q, sp);
                part->ml[2 * at] = sc->m[r];
                part->ml[2 * at + 1] = sc->l[r];
                memcpy(part->o + at * (size_t)dv, orow, (size_t)dv * sizeof(float));
            }
        }
}

/* Merge the splits of row r of (b, hk) in split order and write it; acc [dv]. */
static void combine_row(const fa_problem *p, const dec_dims *g, const dec_partials *part, int64_t b, int64_t hk,
                        int64_t r, float *acc)
{
    const fa_seq seq = fa_problem_seq(p, b);
    const int64_t q_len = seq.q_len;
    if (r >= g->group * q_len) return;
    const int64_t h = hk * g->group + r / q_len, i = r % q_len, dv = p->dv;
    const size_t at0 = partial_index(p, g, b, hk, r, 0);
    float m = -INFINITY;
    int nan = 0;
    for (int s = 0; s < g->splits; s++) {
        const float ms = part->ml[2 * (at0 + (size_t)s)], ls = part->ml[2 * (at0 + (size_t)s) + 1];
        if (isnan(ms) || (ms == -INFINITY && isnan(ls))) nan = 1; /* l NaN: a NaN score the max skipped */
        else if (ms > m) m = ms;
    }
    if (nan) m = NAN;
    float l = 0.0f;
    for (int64_t c = 0; c < dv; c++) acc[c] = 0.0f;
    if (m != -INFINITY) {
        for (int s = 0; s < g->splits; s++) {
            const size_t at = at0 + (size_t)s;
            const float ms = part->ml[2 * at];
            if (ms == -INFINITY) continue; /* the split saw no finite score */
            const float w = expf(ms - m);
            l += w * part->ml[2 * at + 1];
            const float *os = part->o + at * (size_t)dv;
            for (int64_t c = 0; c < dv; c++) acc[c] += w * os[c];
        }
    }
    finalize_row(p, b, h, i, m, l, acc);
}

fa_status fa_decode_forward(const fa_problem *p)
{
    const fa_kernels *kern = p->kern;
    const dec_dims g = dec_layout(p);
    assert(kern && g.bc >= 1 && g.splits >= 1);

    dec_partials part = {NULL, NULL};
    const size_t pf = partial_floats(p, &g);
    float *pbase = NULL;
    if (pf > 0) {
        pbase = fa_scratch_alloc(p, fa_mul_sat(pf, sizeof(float)));
        if (!pbase)
            return fa_fail(FA_ERR_NOMEM, "flash (decode): could not allocate %zu bytes for split-KV partials",
                           fa_mul_sat(pf, sizeof(float)));
        const size_t n = (size_t)p->batch * (size_t)p->heads_k * (size_t)g.rows * (size_t)g.splits;
        part.o = pbase;
        part.ml = pbase + n * (size_t)p->dv;
    }

    const int64_t ntask = p->batch * g.chunks * g.splits;
    const int64_t nrows = p->batch * p->heads_k * g.rows;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(fa_threads_for(p, ntask))
#endif
    {
        dec_scratch sc;
        memset(&sc, 0, sizeof sc);
        if (!scratch_alloc(p, &g, &sc)) {
#ifdef _OPENMP
#pragma omp atomic write
#endif
            failed = 1;
        }
#ifdef _OPENMP
#pragma omp barrier
#endif
        if (!failed) {
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
            for (int64_t t = 0; t < ntask; t++) {
                const int sp = (int)(t % g.splits);
                const int64_t u = t / g.splits;
                decode_task(p, kern, &g, &sc, &part, u / g.chunks, u % g.chunks, sp);
            }
            if (g.splits > 1) { /* (the loop above ends with a barrier) */
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
                for (int64_t t = 0; t < nrows; t++) {
                    const int64_t r = t % g.rows, bhk = t / g.rows;
                    combine_row(p, &g, &part, bhk / p->heads_k, bhk % p->heads_k, r, sc.oa);
                }
            }
        }
        fa_scratch_free(p, sc.base);
    }
    fa_scratch_free(p, pbase);
    if (failed)
        return fa_fail(FA_ERR_NOMEM, "flash (decode): could not allocate %zu bytes of per-thread scratch",
                       fa_decode_workspace(p));
    return FA_OK;
}
