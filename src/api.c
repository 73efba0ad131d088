/*
 * api.c — the public entry points: validate once, then hand a plain, checked
 * fa_problem to one implementation.
 *
 * Everything a caller can get wrong is caught here, with a message naming the
 * argument (fa_last_error()), so reference.c, standard.c and flash.c can
 * assume consistent shapes, valid dtypes and resolved options. This file also
 * holds the small shared services: the thread-local error message, the
 * counting allocator, and the block-size rule.
 */
#include "internal.h"

#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/kernels.h"

#ifdef _OPENMP
#include <omp.h>
#endif

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

static _Thread_local char fa_errbuf[512];

fa_status fa_fail(fa_status status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fa_errbuf, sizeof fa_errbuf, fmt, ap);
    va_end(ap);
    return status;
}

void fa_clear_error(void) { fa_errbuf[0] = '\0'; }

const char *fa_last_error(void) { return fa_errbuf; }

const char *fa_status_string(fa_status status)
{
    static const char *const names[FA_STATUS_COUNT] = {
        [FA_OK] = "ok",
        [FA_ERR_NULL_ARG] = "null argument",
        [FA_ERR_DTYPE] = "unsupported dtype",
        [FA_ERR_SHAPE] = "inconsistent or invalid shape",
        [FA_ERR_HEADS] = "heads is not a multiple of heads_k",
        [FA_ERR_STRIDE] = "invalid stride",
        [FA_ERR_OPTION] = "option out of range",
        [FA_ERR_ALIBI] = "invalid ALiBi slopes",
        [FA_ERR_IMPL] = "unknown implementation",
        [FA_ERR_NOMEM] = "out of memory",
        [FA_ERR_TOO_LARGE] = "exceeds the memory cap",
        [FA_ERR_ISA] = "instruction set unavailable",
        [FA_ERR_IO] = "I/O error",
        [FA_ERR_FORMAT] = "malformed file",
        [FA_ERR_NONFINITE] = "non-finite value",
    };
    if ((int)status < 0 || status >= FA_STATUS_COUNT) return "unknown status";
    return names[status];
}

/* ------------------------------------------------------------------------ */
/* Counting allocator                                                        */
/* ------------------------------------------------------------------------ */

/* Each block carries its size in a 64-byte header so fa_free can un-count it. */
#define FA_ALLOC_HEADER 64

static atomic_size_t fa_alloc_current;
static atomic_size_t fa_alloc_peak;
static atomic_size_t fa_alloc_count;

void *fa_malloc(size_t bytes)
{
    if (bytes > SIZE_MAX - FA_ALLOC_HEADER) return NULL;
    void *raw = NULL;
    if (posix_memalign(&raw, 64, bytes + FA_ALLOC_HEADER) != 0) return NULL;
    *(size_t *)raw = bytes;
    size_t now = atomic_fetch_add(&fa_alloc_current, bytes) + bytes;
    size_t peak = atomic_load(&fa_alloc_peak);
    while (now > peak && !atomic_compare_exchange_weak(&fa_alloc_peak, &peak, now)) {
    }
    atomic_fetch_add(&fa_alloc_count, 1);
    return (char *)raw + FA_ALLOC_HEADER;
}

void *fa_calloc(size_t bytes)
{
    void *p = fa_malloc(bytes);
    if (p) memset(p, 0, bytes);
    return p;
}

void fa_free(void *ptr)
{
    if (!ptr) return;
    char *raw = (char *)ptr - FA_ALLOC_HEADER;
    atomic_fetch_sub(&fa_alloc_current, *(size_t *)raw);
    free(raw);
}

void fa_alloc_stats_get(fa_alloc_stats *stats)
{
    if (!stats) return;
    stats->current_bytes = atomic_load(&fa_alloc_current);
    stats->peak_bytes = atomic_load(&fa_alloc_peak);
    stats->total_allocs = atomic_load(&fa_alloc_count);
}

void fa_alloc_stats_reset(void)
{
    atomic_store(&fa_alloc_peak, atomic_load(&fa_alloc_current));
    atomic_store(&fa_alloc_count, 0);
}

/* ------------------------------------------------------------------------ */
/* Small public helpers                                                      */
/* ------------------------------------------------------------------------ */

fa_options fa_options_default(void)
{
    fa_options o;
    memset(&o, 0, sizeof o);
    o.window_left = -1;
    o.window_right = -1;
    o.impl = FA_IMPL_FLASH;
    return o;
}

size_t fa_dtype_size(fa_dtype dtype)
{
    switch (dtype) {
    case FA_F32: return 4;
    case FA_F64: return 8;
    case FA_F16: return 2;
    case FA_BF16: return 2;
    default: return 0;
    }
}

const char *fa_dtype_name(fa_dtype dtype)
{
    switch (dtype) {
    case FA_F32: return "f32";
    case FA_F64: return "f64";
    case FA_F16: return "f16";
    case FA_BF16: return "bf16";
    default: return "invalid";
    }
}

const char *fa_impl_name(fa_impl impl)
{
    switch (impl) {
    case FA_IMPL_FLASH: return "flash";
    case FA_IMPL_REFERENCE: return "reference";
    case FA_IMPL_STANDARD: return "standard";
    default: return "invalid";
    }
}

fa_status fa_impl_from_name(const char *name, fa_impl *impl)
{
    if (!name || !impl) return fa_fail(FA_ERR_NULL_ARG, "fa_impl_from_name: null argument");
    for (int i = 0; i < FA_IMPL_COUNT; i++) {
        if (strcmp(name, fa_impl_name((fa_impl)i)) == 0) {
            *impl = (fa_impl)i;
            return FA_OK;
        }
    }
    return fa_fail(FA_ERR_IMPL, "unknown implementation '%s' (expected flash, reference or standard)",
                   name);
}

fa_status fa_tensor_make(fa_tensor *t, void *data, fa_dtype dtype, int rank,
                         const int64_t *shape, const int64_t *stride)
{
    if (!t || !shape) return fa_fail(FA_ERR_NULL_ARG, "fa_tensor_make: null argument");
    if (rank < 1 || rank > FA_MAX_RANK)
        return fa_fail(FA_ERR_SHAPE, "fa_tensor_make: rank %d is outside 1..%d", rank, FA_MAX_RANK);
    if (fa_dtype_size(dtype) == 0)
        return fa_fail(FA_ERR_DTYPE, "fa_tensor_make: invalid dtype %d", (int)dtype);
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->rank = rank;
    int64_t running = 1;
    for (int r = rank - 1; r >= 0; r--) {
        if (shape[r] < 0)
            return fa_fail(FA_ERR_SHAPE, "fa_tensor_make: dimension %d is negative (%lld)", r,
                           (long long)shape[r]);
        t->shape[r] = shape[r];
        t->stride[r] = stride ? stride[r] : running;
        if (shape[r] > 0 && running > INT64_MAX / shape[r])
            return fa_fail(FA_ERR_SHAPE, "fa_tensor_make: element count overflows 64 bits");
        running *= shape[r] > 0 ? shape[r] : 1;
    }
    return FA_OK;
}

int64_t fa_tensor_numel(const fa_tensor *t)
{
    if (!t) return 0;
    int64_t n = 1;
    for (int r = 0; r < t->rank; r++) n *= t->shape[r];
    return n;
}

void fa_gather_f32(const fa_tensor *t, int64_t off, int64_t inc, int64_t n, float *dst)
{
    if (t->dtype == FA_F32 && inc == 1) {
        memcpy(dst, (const float *)t->data + off, (size_t)n * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < n; i++) dst[i] = fa_load_f32(t, off + i * inc);
}

double fa_alibi_slope(const fa_problem *p, int64_t b, int64_t h)
{
    if (!p->alibi.data) return 0.0;
    if (p->alibi.rank == 1) return fa_load_f64(&p->alibi, h * p->alibi.stride[0]);
    return fa_load_f64(&p->alibi, b * p->alibi.stride[0] + h * p->alibi.stride[1]);
}

int fa_default_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ------------------------------------------------------------------------ */
/* Block sizes                                                               */
/* ------------------------------------------------------------------------ */

#define FA_BLOCK_MAX 1024

static int env_int(const char *name)
{
    const char *s = getenv(name);
    if (!s || !*s) return 0;
    char *end;
    long v = strtol(s, &end, 10);
    if (*end != '\0' || v <= 0 || v > FA_BLOCK_MAX) return -1;
    return (int)v;
}

fa_status fa_block_sizes(int64_t d, int64_t d_v, const fa_options *opt, int *block_q, int *block_k)
{
    if (!block_q || !block_k) return fa_fail(FA_ERR_NULL_ARG, "fa_block_sizes: null output");
    if (d < 1 || d_v < 1)
        return fa_fail(FA_ERR_SHAPE, "fa_block_sizes: head dims must be >= 1 (d=%lld, d_v=%lld)",
                       (long long)d, (long long)d_v);
    fa_status st;
    const fa_kernels *kern = fa_kernels_get(&st);
    if (!kern) return st;

    /*
     * The rule. The paper (GPU) takes Bc = M / 4d and Br = min(Bc, d) for an
     * SRAM of M words. On a CPU the fast tier is the per-core L2 (M = L2 /
     * 4 floats), which is large next to d, and what one task keeps hot is
     *     Q_i [Br][d] + K_j^T [d][Bc] + V_j [Bc][dv] + S [Br][Bc] + O_i [Br][dv]
     * floats. Every K/V tile is re-read Sq/Br times, so Br should be as large
     * as the cache allows, not capped at d. We take square blocks B = Br = Bc,
     * the largest multiple of 16 with
     *     B^2 + B (d + dv) + B (d + dv)  <=  (3/4) M
     * (3/4 leaves room for the next tile and the stack), clamped to [16, 512],
     * then Br rounded down to the kernel's register-block rows. Measured on a
     * 1 MiB-L2 Zen 5 core at d = 128 (docs/performance.md): B = 256 runs ~15%
     * faster than the paper's (Br, Bc) = (128, 512).
     */
    size_t l1, l2, l3, line;
    int src;
    fa_detect_caches(&l1, &l2, &l3, &line, &src);
    const int64_t m_words = (int64_t)(l2 / sizeof(float));
    const int64_t budget = m_words / 4 * 3;
    const int64_t dsum = d + d_v;
    int64_t blk = 16;
    while (blk + 16 <= 512 && (blk + 16) * (blk + 16) + 2 * (blk + 16) * dsum <= budget) blk += 16;
    int64_t bc = blk, br = blk;
    int rb = kern->row_block > 0 ? kern->row_block : 1;
    if (br >= rb) br -= br % rb;

    if (opt && (opt->block_q < 0 || opt->block_q > FA_BLOCK_MAX))
        return fa_fail(FA_ERR_OPTION, "block_q %d is outside 0..%d", opt->block_q, FA_BLOCK_MAX);
    if (opt && (opt->block_k < 0 || opt->block_k > FA_BLOCK_MAX))
        return fa_fail(FA_ERR_OPTION, "block_k %d is outside 0..%d", opt->block_k, FA_BLOCK_MAX);
    int eq = env_int("FA_BLOCK_Q"), ek = env_int("FA_BLOCK_K");
    if (eq < 0) return fa_fail(FA_ERR_OPTION, "FA_BLOCK_Q must be an integer in 1..%d", FA_BLOCK_MAX);
    if (ek < 0) return fa_fail(FA_ERR_OPTION, "FA_BLOCK_K must be an integer in 1..%d", FA_BLOCK_MAX);
    if (eq) br = eq;
    if (ek) bc = ek;
    if (opt && opt->block_q) br = opt->block_q;
    if (opt && opt->block_k) bc = opt->block_k;
    *block_q = (int)br;
    *block_k = (int)bc;
    return FA_OK;
}

fa_status fa_get_cpu_info(fa_cpu_info *info)
{
    if (!info) return fa_fail(FA_ERR_NULL_ARG, "fa_get_cpu_info: null argument");
    memset(info, 0, sizeof *info);
    fa_detect_caches(&info->l1d_bytes, &info->l2_bytes, &info->l3_bytes, &info->line_bytes,
                     &info->cache_source);
    fa_status st;
    const fa_kernels *kern = fa_kernels_get(&st);
    if (!kern) return st;
    info->isa = kern->name;
    info->simd_width = kern->simd_width;
    info->max_threads = fa_default_threads();
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* Validation                                                                */
/* ------------------------------------------------------------------------ */

static fa_status check_tensor(const fa_tensor *t, const char *name, int rank)
{
    if (!t) return fa_fail(FA_ERR_NULL_ARG, "%s: tensor is NULL", name);
    if (fa_dtype_size(t->dtype) == 0)
        return fa_fail(FA_ERR_DTYPE, "%s: invalid dtype %d", name, (int)t->dtype);
    if (t->rank != rank)
        return fa_fail(FA_ERR_SHAPE, "%s: expected rank %d, got rank %d", name, rank, t->rank);
    int64_t n = 1;
    for (int r = 0; r < rank; r++) {
        if (t->shape[r] < 0)
            return fa_fail(FA_ERR_SHAPE, "%s: dimension %d is negative (%lld)", name, r,
                           (long long)t->shape[r]);
        if (t->stride[r] < 0)
            return fa_fail(FA_ERR_STRIDE, "%s: stride %d is negative (%lld)", name, r,
                           (long long)t->stride[r]);
        if (t->shape[r] > 0 && n > INT64_MAX / t->shape[r])
            return fa_fail(FA_ERR_SHAPE, "%s: element count overflows 64 bits", name);
        n *= t->shape[r];
    }
    if (n > 0 && !t->data) return fa_fail(FA_ERR_NULL_ARG, "%s: data pointer is NULL", name);
    return FA_OK;
}

#define DIM(x) ((long long)(x))

/* Validate all arguments and fill *p. */
static fa_status make_problem(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                              const fa_tensor *o, const fa_tensor *lse, const fa_options *opt_in,
                              fa_problem *p)
{
    fa_options opt = opt_in ? *opt_in : fa_options_default();
    fa_status st;
    if ((st = check_tensor(q, "q", 4)) != FA_OK) return st;
    if ((st = check_tensor(k, "k", 4)) != FA_OK) return st;
    if ((st = check_tensor(v, "v", 4)) != FA_OK) return st;
    if (o && (st = check_tensor(o, "o", 4)) != FA_OK) return st;
    if (lse && (st = check_tensor(lse, "lse", 3)) != FA_OK) return st;

    memset(p, 0, sizeof *p);
    p->batch = q->shape[0];
    p->seqlen_q = q->shape[1];
    p->heads = q->shape[2];
    p->d = q->shape[3];
    p->seqlen_k = k->shape[1];
    p->heads_k = k->shape[2];
    p->dv = v->shape[3];

    if (p->d < 1) return fa_fail(FA_ERR_SHAPE, "q: head dim d must be >= 1 (got %lld)", DIM(p->d));
    if (p->dv < 1) return fa_fail(FA_ERR_SHAPE, "v: head dim d_v must be >= 1 (got %lld)", DIM(p->dv));
    if (p->heads < 1) return fa_fail(FA_ERR_SHAPE, "q: heads must be >= 1 (got %lld)", DIM(p->heads));
    if (p->heads_k < 1) return fa_fail(FA_ERR_SHAPE, "k: heads_k must be >= 1 (got %lld)", DIM(p->heads_k));
    if (k->shape[0] != p->batch)
        return fa_fail(FA_ERR_SHAPE, "k: batch %lld does not match q batch %lld", DIM(k->shape[0]), DIM(p->batch));
    if (k->shape[3] != p->d)
        return fa_fail(FA_ERR_SHAPE, "k: head dim %lld does not match q head dim %lld", DIM(k->shape[3]), DIM(p->d));
    if (v->shape[0] != p->batch)
        return fa_fail(FA_ERR_SHAPE, "v: batch %lld does not match q batch %lld", DIM(v->shape[0]), DIM(p->batch));
    if (v->shape[1] != p->seqlen_k)
        return fa_fail(FA_ERR_SHAPE, "v: seqlen %lld does not match k seqlen %lld", DIM(v->shape[1]), DIM(p->seqlen_k));
    if (v->shape[2] != p->heads_k)
        return fa_fail(FA_ERR_SHAPE, "v: heads %lld does not match k heads %lld", DIM(v->shape[2]), DIM(p->heads_k));
    if (p->heads % p->heads_k != 0)
        return fa_fail(FA_ERR_HEADS, "q: heads (%lld) is not a multiple of k heads (%lld)", DIM(p->heads), DIM(p->heads_k));
    if (o) {
        if (o->shape[0] != p->batch || o->shape[1] != p->seqlen_q || o->shape[2] != p->heads ||
            o->shape[3] != p->dv)
            return fa_fail(FA_ERR_SHAPE, "o: shape [%lld,%lld,%lld,%lld] should be [%lld,%lld,%lld,%lld]",
                           DIM(o->shape[0]), DIM(o->shape[1]), DIM(o->shape[2]), DIM(o->shape[3]),
                           DIM(p->batch), DIM(p->seqlen_q), DIM(p->heads), DIM(p->dv));
    }
    if (lse) {
        if (lse->dtype != FA_F32 && lse->dtype != FA_F64)
            return fa_fail(FA_ERR_DTYPE, "lse: dtype must be f32 or f64 (got %s)", fa_dtype_name(lse->dtype));
        if (lse->shape[0] != p->batch || lse->shape[1] != p->heads || lse->shape[2] != p->seqlen_q)
            return fa_fail(FA_ERR_SHAPE, "lse: shape [%lld,%lld,%lld] should be [%lld,%lld,%lld]",
                           DIM(lse->shape[0]), DIM(lse->shape[1]), DIM(lse->shape[2]),
                           DIM(p->batch), DIM(p->heads), DIM(p->seqlen_q));
    }

    /* options */
    if (!isfinite(opt.scale))
        return fa_fail(FA_ERR_OPTION, "scale must be finite (got %g)", opt.scale);
    p->scale = opt.scale != 0.0 ? opt.scale : 1.0 / sqrt((double)p->d);
    if (!isfinite(opt.softcap) || opt.softcap < 0.0)
        return fa_fail(FA_ERR_OPTION, "softcap must be >= 0 and finite (got %g)", opt.softcap);
    p->softcap = opt.softcap;
    p->window_left = opt.window_left < 0 ? -1 : opt.window_left;
    p->window_right = opt.window_right < 0 ? -1 : opt.window_right;
    if (opt.causal) p->window_right = 0;
    /* A window as wide as both sequences hides nothing: make it unbounded, so
     * the band arithmetic (i + Sk - Sq +- window) can never overflow. */
    if (p->window_left > p->seqlen_q + p->seqlen_k) p->window_left = -1;
    if (p->window_right > p->seqlen_q + p->seqlen_k) p->window_right = -1;
    if (opt.num_threads < 0)
        return fa_fail(FA_ERR_OPTION, "num_threads must be >= 0 (got %d)", opt.num_threads);
    p->num_threads = opt.num_threads > 0 ? opt.num_threads : fa_default_threads();
    if ((int)opt.impl < 0 || opt.impl >= FA_IMPL_COUNT)
        return fa_fail(FA_ERR_IMPL, "unknown implementation %d", (int)opt.impl);
    p->standard_max_bytes = opt.standard_max_bytes ? opt.standard_max_bytes : FA_STANDARD_DEFAULT_MAX_BYTES;

    if (opt.alibi_slopes) {
        const fa_tensor *a = opt.alibi_slopes;
        if (a->dtype != FA_F32 && a->dtype != FA_F64)
            return fa_fail(FA_ERR_ALIBI, "alibi slopes: dtype must be f32 or f64 (got %s)", fa_dtype_name(a->dtype));
        if (a->rank == 1) {
            if (a->shape[0] != p->heads)
                return fa_fail(FA_ERR_ALIBI, "alibi slopes: shape [%lld] should be [heads=%lld] or [batch, heads]",
                               DIM(a->shape[0]), DIM(p->heads));
        } else if (a->rank == 2) {
            if (a->shape[0] != p->batch || a->shape[1] != p->heads)
                return fa_fail(FA_ERR_ALIBI, "alibi slopes: shape [%lld,%lld] should be [batch=%lld, heads=%lld]",
                               DIM(a->shape[0]), DIM(a->shape[1]), DIM(p->batch), DIM(p->heads));
        } else {
            return fa_fail(FA_ERR_ALIBI, "alibi slopes: rank %d should be 1 [heads] or 2 [batch, heads]", a->rank);
        }
        for (int r = 0; r < a->rank; r++)
            if (a->stride[r] < 0) return fa_fail(FA_ERR_ALIBI, "alibi slopes: negative stride");
        if (!a->data) return fa_fail(FA_ERR_ALIBI, "alibi slopes: data pointer is NULL");
        p->alibi = *a;
        for (int64_t b = 0; b < (a->rank == 2 ? p->batch : 1); b++)
            for (int64_t h = 0; h < p->heads; h++)
                if (!isfinite(fa_alibi_slope(p, b, h)))
                    return fa_fail(FA_ERR_ALIBI, "alibi slopes: non-finite slope at head %lld", DIM(h));
    }

    p->q = *q;
    p->k = *k;
    p->v = *v;
    if (o) p->o = *o;
    if (lse) p->lse = *lse;
    if (opt.impl == FA_IMPL_FLASH || opt.block_q || opt.block_k) {
        if ((st = fa_block_sizes(p->d, p->dv, &opt, &p->block_q, &p->block_k)) != FA_OK) return st;
    }
    return FA_OK;
}

/* make_problem for backward.c: the same validation, shared rather than copied. */
fa_status fa_make_problem(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                          const fa_tensor *o, const fa_tensor *lse, const fa_options *opt,
                          fa_problem *p)
{
    return make_problem(q, k, v, o, lse, opt, p);
}

static size_t workspace(const fa_problem *p, fa_impl impl)
{
    switch (impl) {
    case FA_IMPL_REFERENCE: return fa_reference_workspace(p);
    case FA_IMPL_STANDARD: return fa_standard_workspace(p);
    case FA_IMPL_FLASH: return fa_flash_workspace(p);
    default: return 0;
    }
}

fa_status fa_workspace_bytes(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                             const fa_options *opt, size_t *bytes)
{
    if (!bytes) return fa_fail(FA_ERR_NULL_ARG, "fa_workspace_bytes: bytes is NULL");
    fa_problem p;
    fa_status st = make_problem(q, k, v, NULL, NULL, opt, &p);
    if (st != FA_OK) return st;
    *bytes = workspace(&p, opt ? opt->impl : FA_IMPL_FLASH);
    fa_clear_error();
    return FA_OK;
}

fa_status fa_forward(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *o,
                     fa_tensor *lse, const fa_options *opt)
{
    if (!o) return fa_fail(FA_ERR_NULL_ARG, "o: output tensor is NULL");
    fa_problem p;
    fa_status st = make_problem(q, k, v, o, lse, opt, &p);
    if (st != FA_OK) return st;
    fa_impl impl = opt ? opt->impl : FA_IMPL_FLASH;
    if (p.batch == 0 || p.seqlen_q == 0) {
        fa_clear_error();
        return FA_OK;
    }
    switch (impl) {
    case FA_IMPL_REFERENCE: st = fa_reference_forward(&p); break;
    case FA_IMPL_STANDARD: st = fa_standard_forward(&p); break;
    case FA_IMPL_FLASH: st = fa_flash_forward(&p); break;
    default: st = fa_fail(FA_ERR_IMPL, "unknown implementation %d", (int)impl); break;
    }
    if (st == FA_OK) fa_clear_error();
    return st;
}
