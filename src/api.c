/*
 * api.c — the public entry points: resolve once (problem.c), check the
 * outputs, then hand a plain, checked fa_problem to one implementation.
 *
 * Nothing below calls back up here: the shared services live beneath the
 * implementations (status.c, alloc.c, tensor.c, config.c, mask.h, pack.c,
 * problem.c, context.c); see internal.h for the layers.
 */
#include "internal.h"

#include <limits.h>
#include <stdlib.h>

#include "kernels/kernels.h"
#include "serve.h"

#define DIM(x) ((long long)(x))

/* ------------------------------------------------------------------------ */
/* Small public helpers                                                      */
/* ------------------------------------------------------------------------ */

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

/* The blocks (and the kernels and environment they follow) for head dims d, d_v:
 * fa_block_sizes and fa_strip_rows; `who` names the caller in errors. */
static fa_status resolve_blocks(const char *who, int64_t d, int64_t d_v, const fa_options *opt_in,
                                const fa_kernels **kern, const fa_env **env, int *block_q, int *block_k)
{
    if (d < 1 || d_v < 1 || d > FA_HEAD_DIM_MAX || d_v > FA_HEAD_DIM_MAX)
        return fa_fail(FA_ERR_SHAPE, "%s: head dims must be in 1..%d (d=%lld, d_v=%lld)", who,
                       FA_HEAD_DIM_MAX, DIM(d), DIM(d_v));
    fa_options opt;
    fa_status st = fa_options_read(opt_in, &opt);
    if (st != FA_OK) return st;
    if (!(*env = fa_env_get(&st))) return st;
    *kern = opt.context ? fa_context_kernels_(opt.context) : fa_kernels_get(&st);
    if (!*kern) return st;
    int pq, pk;
    return fa_resolve_blocks(d, d_v, &opt, *kern, block_q, block_k, &pq, &pk);
}

fa_status fa_block_sizes(int64_t d, int64_t d_v, const fa_options *opt_in, int *block_q, int *block_k)
{
    if (!block_q || !block_k) return fa_fail(FA_ERR_NULL_ARG, "fa_block_sizes: null output");
    const fa_kernels *kern;
    const fa_env *env;
    return resolve_blocks("fa_block_sizes", d, d_v, opt_in, &kern, &env, block_q, block_k);
}

fa_status fa_strip_rows(int64_t d, int64_t d_v, const fa_options *opt_in, int *rows)
{
    if (!rows) return fa_fail(FA_ERR_NULL_ARG, "fa_strip_rows: null output");
    const fa_kernels *kern;
    const fa_env *env;
    int br, bc;
    fa_status st = resolve_blocks("fa_strip_rows", d, d_v, opt_in, &kern, &env, &br, &bc);
    if (st != FA_OK) return st;
    *rows = fa_strip_rows_for(kern, env->strip_rows, br, bc);
    return FA_OK;
}

fa_status fa_get_cpu_info(fa_cpu_info *info)
{
    if (!info) return fa_fail(FA_ERR_NULL_ARG, "fa_get_cpu_info: null argument");
    memset(info, 0, sizeof *info);
    fa_status st;
    if (!fa_env_get(&st)) return st;
    fa_detect_caches(&info->l1d_bytes, &info->l2_bytes, &info->l3_bytes, &info->line_bytes,
                     &info->cache_source);
    const fa_kernels *kern = fa_kernels_get(&st);
    if (!kern) return st;
    info->isa = kern->name;
    info->simd_width = kern->simd_width;
    info->max_threads = fa_default_threads();
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* Forward                                                                   */
/* ------------------------------------------------------------------------ */

fa_status fa_workspace_bytes(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                             const fa_options *opt, size_t *bytes)
{
    if (!bytes) return fa_fail(FA_ERR_NULL_ARG, "fa_workspace_bytes: bytes is NULL");
    fa_problem p;
    fa_status st = fa_resolve(FA_PURPOSE_WORKSPACE, q, k, v, NULL, NULL, opt, NULL, &p);
    if (st != FA_OK) return st;
    switch (p.impl) {
    case FA_IMPL_REFERENCE: *bytes = fa_reference_workspace(&p); break;
    case FA_IMPL_STANDARD: *bytes = fa_standard_workspace(&p); break;
    default: *bytes = fa_flash_workspace(&p); break;
    }
    fa_clear_error();
    return FA_OK;
}

fa_status fa_forward(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v, fa_tensor *o,
                     fa_tensor *lse, const fa_options *opt)
{
    if (!o) return fa_fail(FA_ERR_NULL_ARG, "o: output tensor is NULL");
    fa_problem p;
    fa_status st = fa_resolve(FA_PURPOSE_FORWARD, q, k, v, o, lse, opt, NULL, &p);
    if (st != FA_OK) return st;
    const fa_tensor *alibi = p.alibi.data ? &p.alibi : NULL;
    {
        const fa_tensor *others[] = {q, k, v, alibi, lse};
        const char *names[] = {"q", "k", "v", "alibi slopes", "lse"};
        if ((st = fa_check_output(o, "o", others, names, 5)) != FA_OK) return st;
    }
    if (lse) {
        const fa_tensor *others[] = {q, k, v, alibi};
        const char *names[] = {"q", "k", "v", "alibi slopes"};
        if ((st = fa_check_output(lse, "lse", others, names, 4)) != FA_OK) return st;
    }
    /* KV cache: append the new keys in place (the caches must not overlap them) */
    void *rot_mem = NULL; /* rotary: the rotated q and k_new (serve.c) */
    void *undo = NULL;    /* the cache rows the append overwrote, put back if the call fails */
    if (p.cache_seqlens && p.k_new.data) {
        const fa_tensor *nk[] = {&p.k_new, &p.v_new, q, v};
        const char *nn[] = {"k_new", "v_new", "q", "v cache"};
        if ((st = fa_check_output(k, "k cache", nk, nn, 4)) != FA_OK ||
            (st = fa_check_output(v, "v cache", nk, nn, 3)) != FA_OK)
            return st;
        /* rotary: q and k_new rotated first, so the rotated keys are appended */
        if ((st = fa_rotary_apply(&p, &rot_mem)) != FA_OK) return st;
        if ((st = fa_kvcache_append(&p, &undo)) != FA_OK) {
            fa_free(rot_mem);
            return st;
        }
    }
    /* varlen: the rows no sequence owns get O = 0, LSE = -inf */
    if ((st = fa_fill_unowned_rows(&p, &p.o, 0, 0.0)) == FA_OK &&
        (st = fa_fill_unowned_lse(&p, p.lse.data ? &p.lse : NULL, -INFINITY)) == FA_OK &&
        p.batch > 0 && p.seqlen_q > 0) {
        p.arena = fa_arena_begin(p.context);
        switch (p.impl) {
        case FA_IMPL_REFERENCE: st = fa_reference_forward(&p); break;
        case FA_IMPL_STANDARD: st = fa_standard_forward(&p); break;
        default: st = fa_flash_forward(&p); break;
        }
        fa_arena_end(p.arena);
    }
    fa_free(rot_mem);
    if (st != FA_OK) { /* a call that fails leaves the caches as they were (the error stays set) */
        fa_kvcache_restore(&p, undo);
        return st;
    }
    fa_free(undo);
    fa_clear_error();
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* Backward                                                                  */
/* ------------------------------------------------------------------------ */

void fa_backward_extra_init(fa_backward_extra *x, size_t struct_size)
{
    if (!x) return;
    memset(x, 0, struct_size);
    fa_backward_extra e;
    memset(&e, 0, sizeof e);
    e.struct_size = struct_size;
    memcpy(x, &e, struct_size < sizeof e ? struct_size : sizeof e);
}

fa_status fa_backward(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                      const fa_tensor *o, const fa_tensor *lse, const fa_tensor *dout,
                      fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, const fa_options *opt)
{
    return fa_backward_ex(q, k, v, o, lse, dout, dq, dk, dv, opt, NULL);
}

fa_status fa_backward_ex(const fa_tensor *q, const fa_tensor *k, const fa_tensor *v,
                         const fa_tensor *o, const fa_tensor *lse, const fa_tensor *dout,
                         fa_tensor *dq, fa_tensor *dk, fa_tensor *dv, const fa_options *opt,
                         const fa_backward_extra *extra_in)
{
    fa_backward_extra extra;
    fa_backward_extra_init(&extra, sizeof extra);
    if (extra_in) { /* a versioned struct: read what the caller's layout holds */
        /* the layout before emulate_dtype (0.5) too */
        static const size_t known[] = {sizeof(fa_backward_extra), offsetof(fa_backward_extra, emulate_dtype)};
        fa_status est = fa_struct_size_check(extra_in, sizeof extra, known, 2, "fa_backward_extra",
                                             "fa_backward_extra_init");
        if (est != FA_OK) return est;
        memcpy(&extra, extra_in, extra_in->struct_size < sizeof extra ? extra_in->struct_size : sizeof extra);
    }
    const int emu = extra.emulate_dtype;
    if (emu != 0 && emu != FA_BF16 && emu != FA_F16)
        return fa_fail(FA_ERR_OPTION, "backward: emulate_dtype %d is not FA_BF16 or FA_F16 (0: off)", emu);
    fa_problem p;
    fa_status st = fa_resolve(FA_PURPOSE_BACKWARD, q, k, v, o, lse, opt, NULL, &p);
    if (st != FA_OK) return st;
    const fa_tensor *dsinks = extra.dsinks;
    if (dsinks) {
        if (!p.sinks.data)
            return fa_fail(FA_ERR_OPTION, "dsinks: requested, but fa_options.sinks is NULL (no sinks to differentiate)");
        if (dsinks->dtype != FA_F32 && dsinks->dtype != FA_F64)
            return fa_fail(FA_ERR_DTYPE, "dsinks: dtype must be f32 or f64 (got %s)", fa_dtype_name(dsinks->dtype));
        if (dsinks->rank != 1 || dsinks->shape[0] != p.heads)
            return fa_fail(FA_ERR_SHAPE, "dsinks: shape must be [heads=%lld], the shape of the sinks", DIM(p.heads));
        if (!dsinks->data) return fa_fail(FA_ERR_NULL_ARG, "dsinks: data pointer is NULL");
        if (dsinks->stride[0] < 0) return fa_fail(FA_ERR_STRIDE, "dsinks: negative stride");
        const fa_tensor *others[] = {q, k, v, o, lse, dout, dq, dk, dv, &p.sinks};
        const char *onames[] = {"q", "k", "v", "o", "lse", "dout", "dq", "dk", "dv", "sinks"};
        if ((st = fa_check_output(dsinks, "dsinks", others, onames, 10)) != FA_OK) return st;
    }
    if (p.cache_seqlens)
        return fa_fail(FA_ERR_OPTION, "backward: a KV cache (fa_options.kvcache) is forward only");
    /* the tensors' own rows (varlen: [1][total]; p.batch, seqlen_q/k count sequences) */
    const int64_t tb = p.q.shape[0], tq = p.q.shape[1];
    const int64_t nb = tb > 0 ? tb : 1;
    const int64_t o_shape[4] = {tb, tq, p.heads, p.dv};
    /* O's element count, which no input bounds when d_v > d: refuse what cannot be indexed */
    if (tq > 0 && p.dv > INT64_MAX / 8 / nb / tq / p.heads)
        return fa_fail(FA_ERR_TOO_LARGE, "dout: [%lld, %lld, %lld, %lld] has too many elements",
                       DIM(tb), DIM(tq), DIM(p.heads), DIM(p.dv));
    fa_tensor dout4, dq4, dk4, dv4; /* rank-4 views (varlen: of the rank-3 tensors) */
    if ((st = fa_check_rows_tensor(&p, dout, "dout", 0, p.dv, "the shape of o: [batch, seqlen_q, heads, d_v]",
                                   &dout4)) != FA_OK ||
        (st = fa_check_rows_tensor(&p, dq, "dq", 0, p.d, "the shape of q", &dq4)) != FA_OK ||
        (st = fa_check_rows_tensor(&p, dk, "dk", 1, p.d, "the shape of k", &dk4)) != FA_OK ||
        (st = fa_check_rows_tensor(&p, dv, "dv", 1, p.dv, "the shape of v", &dv4)) != FA_OK)
        return st;
    {
        const fa_tensor *alibi = p.alibi.data ? &p.alibi : NULL;
        const fa_tensor *all[] = {q, k, v, o, lse, dout, alibi, dq, dk, dv};
        const char *names[] = {"q", "k", "v", "o", "lse", "dout", "alibi slopes", "dq", "dk", "dv"};
        for (int x = 7; x < 10; x++) {
            const fa_tensor *others[9];
            const char *onames[9];
            int n = 0;
            for (int y = 0; y < 10; y++)
                if (y != x) { others[n] = all[y]; onames[n] = names[y]; n++; }
            if ((st = fa_check_output(all[x], names[x], others, onames, n)) != FA_OK) return st;
        }
    }
    if (p.impl == FA_IMPL_STANDARD)
        return fa_fail(FA_ERR_IMPL, "backward: implementation 'standard' not available; use flash or reference");
    /* varlen: rows no sequence owns have no gradient */
    if ((st = fa_fill_unowned_rows(&p, &dq4, 0, 0.0)) != FA_OK || (st = fa_fill_unowned_rows(&p, &dk4, 1, 0.0)) != FA_OK ||
        (st = fa_fill_unowned_rows(&p, &dv4, 1, 0.0)) != FA_OK)
        return st;
    if (p.batch == 0) {
        for (int64_t h = 0; dsinks && h < p.heads; h++) fa_store_f64(dsinks, h * dsinks->stride[0], 0.0);
        fa_clear_error();
        return FA_OK;
    }

    p.arena = fa_arena_begin(p.context);
    /* O and LSE: the caller's, or recomputed by this implementation's forward
     * pass (float64 for the reference, float32 for flash). */
    void *o_tmp = NULL, *lse_tmp = NULL;
    if (emu) { /* self-contained: its own softmax, no O or LSE */
        st = fa_emulated_backward(&p, (fa_dtype)emu, &dout4, &dq4, &dk4, &dv4, dsinks);
        fa_arena_end(p.arena);
        if (st == FA_OK) fa_clear_error();
        return st;
    }
    if (!o || !lse) {
        const fa_dtype tdt = p.impl == FA_IMPL_REFERENCE ? FA_F64 : FA_F32;
        const size_t esz = fa_dtype_size(tdt);
        const size_t o_n = (size_t)(tb * tq * p.heads * p.dv);
        const size_t l_n = (size_t)(tb * p.heads * tq);
        const int64_t l_shape[3] = {tb, p.heads, tq};
        o_tmp = fa_scratch_alloc(&p, fa_mul_sat(o_n ? o_n : 1, esz));   /* O   [B][Sq][H][dv] */
        lse_tmp = fa_scratch_alloc(&p, fa_mul_sat(l_n ? l_n : 1, esz)); /* LSE [B][H][Sq] */
        if (!o_tmp || !lse_tmp) {
            fa_scratch_free(&p, o_tmp);
            fa_scratch_free(&p, lse_tmp);
            fa_arena_end(p.arena);
            return fa_fail(FA_ERR_NOMEM, "backward: could not allocate %zu bytes to recompute O and LSE",
                           fa_mul_sat(fa_add_sat(o_n, l_n), esz));
        }
        fa_problem fp = p;
        fa_tensor_make(&fp.o, o_tmp, tdt, 4, o_shape, NULL);
        fa_tensor_make(&fp.lse, lse_tmp, tdt, 3, l_shape, NULL);
        st = p.seqlen_q == 0 ? FA_OK
             : p.impl == FA_IMPL_REFERENCE ? fa_reference_forward(&fp) : fa_flash_forward_for_backward(&fp);
        /* (rows no sequence owns are never read: they hold no gradient) */
        if (!o) p.o = fp.o;
        if (!lse) p.lse = fp.lse;
    }
    if (st == FA_OK)
        st = p.impl == FA_IMPL_REFERENCE ? fa_reference_backward(&p, &dout4, &dq4, &dk4, &dv4)
                                         : fa_flash_backward(&p, &dout4, &dq4, &dk4, &dv4);
    if (st == FA_OK && dsinks) st = fa_sinks_backward(&p, &dout4, dsinks);
    fa_scratch_free(&p, o_tmp);
    fa_scratch_free(&p, lse_tmp);
    fa_arena_end(p.arena);
    if (st == FA_OK) fa_clear_error();
    return st;
}
