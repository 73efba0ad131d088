/*
 * cli_lowprec.c — low-precision inputs for `run` and `check`.
 *
 * Q, K and V arrive as `|u1` code files (numpy has no FP8/FP4 dtypes; the
 * format is named by --qkv-format), each with at most one scale: a
 * FlashAttention-3 descale (--descale-x: a number for a per-tensor scale, or
 * a float32 [batch, heads_k] file — Q's too is per kv head), or block scales
 * (--scale-x FILE with --scale-format nvfp4|mxfp4, codes `|u1`, along d for Q
 * and K and along tokens for V unless --v-scale-along d; NVFP4 with
 * --global-scale-x). fa_dequantize decodes them into float64 arrays that the
 * subcommand then uses like any Q, K, V.
 */
#include "cli_lowprec.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char cli_lowprec_help[] =
    "LOW-PRECISION INPUTS (Q, K, V as |u1 code files):\n"
    "  --qkv-format F     e4m3 (FP8 e4m3fn), e5m2, e2m1 (FP4) or int8: the codes of -q, -k, -v\n"
    "  --fp4-packed       e2m1 with two codes per byte, the first in the low nibble\n"
    "  --descale-q X      Q's scale: a number (per tensor) or a float32 [batch, heads_k] file\n"
    "  --descale-k X      (FlashAttention-3's descales: Q's too is per kv head); likewise K, V\n"
    "  --descale-v X\n"
    "  --scale-q F        block scales (|u1 codes) with --scale-format: along d for Q and K,\n"
    "  --scale-k F        along tokens for V (shape [batch, ceil(seqlen/block), heads, d_v])\n"
    "  --scale-v F\n"
    "  --scale-format S   nvfp4 (e4m3 scale per 16 elements) or mxfp4 (e8m0 per 32)\n"
    "  --global-scale-q G the fp32 per-tensor scale of NVFP4 (default 1); also -k, -v\n"
    "  --v-scale-along A  tokens (default) or d: the axis of V's block scales\n"
    "  Values are code * scale, decoded exactly; the reference is exact attention on them.\n";

static const char *const tname[3] = {"q", "k", "v"};

void cli_lowprec_init(cli_lowprec *lp)
{
    memset(lp, 0, sizeof *lp);
}

int cli_lowprec_parse(int argc, char **argv, int *i, cli_lowprec *lp)
{
    int r;
    if ((r = cli_opt_flag(argv, *i, "--fp4-packed")) != 0) {
        lp->packed = 1;
        return r;
    }
    static const char *const descale[3] = {"--descale-q", "--descale-k", "--descale-v"};
    static const char *const scale[3] = {"--scale-q", "--scale-k", "--scale-v"};
    static const char *const global[3] = {"--global-scale-q", "--global-scale-k", "--global-scale-v"};
    if ((r = cli_opt_value(argc, argv, i, "--qkv-format", &lp->format_text)) != 0) return r;
    if ((r = cli_opt_value(argc, argv, i, "--scale-format", &lp->scale_format)) != 0) return r;
    if ((r = cli_opt_value(argc, argv, i, "--v-scale-along", &lp->v_scale_along)) != 0) return r;
    for (int t = 0; t < 3; t++) {
        if ((r = cli_opt_value(argc, argv, i, descale[t], &lp->descale[t])) != 0) return r;
        if ((r = cli_opt_value(argc, argv, i, scale[t], &lp->scale[t])) != 0) return r;
        if ((r = cli_opt_value(argc, argv, i, global[t], &lp->global[t])) != 0) return r;
    }
    return 0;
}

int cli_lowprec_active(const cli_lowprec *lp)
{
    if (lp->format_text || lp->packed || lp->scale_format || lp->v_scale_along) return 1;
    for (int t = 0; t < 3; t++)
        if (lp->descale[t] || lp->scale[t] || lp->global[t]) return 1;
    return 0;
}

/* A whole number (per-tensor scale)? Decimal, as every number of the CLI (docs/cli.md): a
 * digit or '-' and a digit first, no hex; anything else names a file. */
static int parse_number(const char *text, double *out)
{
    char *end;
    errno = 0;
    if (!cli_is_decimal(text)) return 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0') return 0;
    *out = v;
    return 1;
}

int cli_lowprec_validate(cli_lowprec *lp, const cli_attn *attn)
{
    if (!cli_lowprec_active(lp)) return 0;
    const char *layout = attn->cu_q_path || attn->cu_k_path || attn->seqused_path ? "varlen (--cu-seqlens-*, --seqused-k)"
                         : attn->cache_seqlens_path || attn->block_table_path ? "KV cache (--cache-seqlens, --block-table)"
                                                                              : NULL;
    if (layout)
        return cli_die("low-precision inputs (--qkv-format and its scales) take dense [batch, seqlen, heads, dim] "
                       "code files; %s options are not supported with them", layout);
    if (!lp->format_text)
        return cli_die("low-precision options need --qkv-format e4m3|e5m2|e2m1|int8");
    lp->format = fa_qformat_parse(lp->format_text);
    if (lp->format == FA_QF_NONE || lp->format == FA_QF_E8M0)
        return cli_die("--qkv-format: expected e4m3, e5m2, e2m1 or int8, got '%s'", lp->format_text);
    if (lp->packed && lp->format != FA_QF_E2M1)
        return cli_die("--fp4-packed: only e2m1 codes are packed two per byte (--qkv-format %s)", lp->format_text);
    int any_block = 0;
    for (int t = 0; t < 3; t++) {
        if (lp->descale[t] && lp->scale[t])
            return cli_die("--descale-%s and --scale-%s: one scale per tensor", tname[t], tname[t]);
        if (lp->global[t] && !lp->scale[t])
            return cli_die("--global-scale-%s needs --scale-%s (NVFP4 block scales)", tname[t], tname[t]);
        if (lp->global[t]) {
            double g;
            char gname[24];
            snprintf(gname, sizeof gname, "--global-scale-%s", tname[t]);
            if (cli_parse_double(gname, lp->global[t], &g) != 0) return 2;
            /* 0 in fa_qtensor means "not given" (1): a zero scale, a bug upstream, would pass as 1 */
            if (!((float)g > 0.0f) || !isfinite((float)g))
                return cli_die("--global-scale-%s: %s is not a finite float32 scale > 0", tname[t], lp->global[t]);
        }
        if (lp->descale[t] && !lp->descale[t][0])
            return cli_die("--descale-%s: empty value", tname[t]);
        any_block |= lp->scale[t] != NULL;
    }
    if (any_block && !lp->scale_format)
        return cli_die("--scale-q/-k/-v need --scale-format nvfp4|mxfp4");
    if (lp->scale_format && strcmp(lp->scale_format, "nvfp4") && strcmp(lp->scale_format, "mxfp4"))
        return cli_die("--scale-format: expected nvfp4 or mxfp4, got '%s'", lp->scale_format);
    if (lp->scale_format && !any_block)
        return cli_die("--scale-format %s: give the block scales with --scale-q/-k/-v", lp->scale_format);
    if (lp->scale_format && !strcmp(lp->scale_format, "mxfp4"))
        for (int t = 0; t < 3; t++)
            if (lp->global[t]) return cli_die("--global-scale-%s: MXFP4 has no global scale", tname[t]);
    if (lp->v_scale_along && strcmp(lp->v_scale_along, "d") && strcmp(lp->v_scale_along, "tokens"))
        return cli_die("--v-scale-along: expected d or tokens, got '%s'", lp->v_scale_along);
    return 0;
}

int cli_lowprec_inputs(const cli_lowprec *lp, cli_named *ins)
{
    static const char *const descale[3] = {"--descale-q", "--descale-k", "--descale-v"};
    static const char *const scale[3] = {"--scale-q", "--scale-k", "--scale-v"};
    int n = 0;
    for (int t = 0; t < 3; t++) {
        double x;
        if (lp->descale[t] && !parse_number(lp->descale[t], &x)) ins[n++] = (cli_named){descale[t], lp->descale[t]};
        if (lp->scale[t]) ins[n++] = (cli_named){scale[t], lp->scale[t]};
    }
    return n;
}

/* ------------------------------------------------------------------------ */
/* Loading and decoding Q, K, V                                              */
/* ------------------------------------------------------------------------ */

/* Decode tensor t (0 q, 1 k, 2 v) from its codes into arr (float64). */
static int load_one(int t, const char *path, const cli_lowprec *lp, int64_t batch, int64_t heads_k,
                    fa_npy *arr, fa_tensor *view)
{
    static const char *const role[3] = {"Q [batch, seqlen_q, heads, d]", "K [batch, seqlen_k, heads_k, d]",
                                        "V [batch, seqlen_k, heads_k, d_v]"};
    static const int64_t any4[4] = {-1, -1, -1, -1};
    fa_npy codes, bs, ds;
    memset(&bs, 0, sizeof bs);
    memset(&ds, 0, sizeof ds);
    if (cli_load_codes(path, role[t], 4, any4, &codes)) return CLI_EXIT_USAGE;
    int rc = CLI_EXIT_USAGE;
    char sh[96];
    fa_qtensor x;
    memset(&x, 0, sizeof x);
    x.codes = codes.data;
    x.format = lp->format;
    x.packed = lp->packed;
    for (int a = 0; a < 4; a++) x.shape[a] = codes.shape[a];
    if (lp->packed) x.shape[3] *= 2;
    if (x.shape[0] != batch && batch > 0) {
        cli_die("%s: batch %lld does not match the batch of Q (%lld)", path, (long long)x.shape[0], (long long)batch);
        goto out;
    }
    double num;
    if (lp->descale[t] && parse_number(lp->descale[t], &num)) {
        if (!isfinite(num) || !isfinite((float)num)) { /* 1e39 is finite, its fp32 is not */
            cli_die("--descale-%s: %s is not a finite float32 scale", tname[t], lp->descale[t]);
            goto out;
        }
        /* a non-zero text that reads as 0 (1e-400), or rounds to 0 in float32 (1e-50): refused,
         * as --softcap's "too small", not taken as a zero scale */
        int nonzero = 0; /* a digit 1-9 before any exponent */
        for (const char *c = lp->descale[t]; *c && *c != 'e' && *c != 'E'; c++) nonzero |= *c >= '1' && *c <= '9';
        if ((float)num == 0.0f && nonzero) {
            cli_die("--descale-%s: %s is too small: it rounds to 0 in float32 (the smallest float32 is about 1.4e-45)",
                    tname[t], lp->descale[t]);
            goto out;
        }
        x.scale_kind = FA_QSCALE_TENSOR;
        x.scale = (double)(float)num; /* an fp32 scale, as kernels take it */
    } else if (lp->descale[t]) {
        if (cli_load_array(lp->descale[t], 2, 0, "descales [batch, heads_k]", &ds, NULL)) goto out;
        if (ds.dtype != FA_F32) {
            cli_die("%s: descales must be float32 ('<f4'), got %s", lp->descale[t], fa_dtype_name(ds.dtype));
            goto out;
        }
        const int64_t hk = heads_k > 0 ? heads_k : x.shape[2];
        if (ds.shape[0] != x.shape[0] || ds.shape[1] != hk) {
            cli_die("%s: descales of shape %s should be [batch, heads_k] = [%lld, %lld] (FlashAttention-3's "
                    "layout; Q's too is per kv head)",
                    lp->descale[t], cli_shape(2, ds.shape, sh, sizeof sh), (long long)x.shape[0], (long long)hk);
            goto out;
        }
        x.scale_kind = FA_QSCALE_HEAD;
        x.head_scale = ds.data;
        x.scale_heads = hk;
    } else if (lp->scale[t]) {
        if (cli_load_codes(lp->scale[t], "block scales", 4, any4, &bs)) goto out;
        x.scale_kind = !strcmp(lp->scale_format, "nvfp4") ? FA_QSCALE_NVFP4 : FA_QSCALE_MXFP4;
        x.block_scale = bs.data;
        for (int a = 0; a < 4; a++) x.block_scale_shape[a] = bs.shape[a];
        x.scale_axis = (t == 2 && !(lp->v_scale_along && !strcmp(lp->v_scale_along, "d"))) ? 1 : 3;
        x.global_scale = x.scale_kind == FA_QSCALE_NVFP4 ? 1.0 : 0.0; /* MXFP4 has none: 0, or it is refused */
        if (lp->global[t]) {
            cli_parse_double("--global-scale", lp->global[t], &num);
            if (isfinite(num) && !isfinite((float)num)) {
                cli_die("--global-scale-%s: %s is not a finite float32 scale", tname[t], lp->global[t]);
                goto out;
            }
            x.global_scale = (double)(float)num;
        }
    }
    arr->dtype = FA_F64;
    arr->rank = 4;
    arr->numel = 1;
    for (int a = 0; a < 4; a++) {
        arr->shape[a] = x.shape[a];
        arr->numel *= x.shape[a];
    }
    arr->data = malloc((size_t)(arr->numel ? arr->numel : 1) * sizeof(double)); /* fa_npy_free frees it */
    if (!arr->data) {
        cli_die("%s: out of memory decoding %lld elements", path, (long long)arr->numel);
        goto out;
    }
    fa_status st;
    arr->type = FA_NPY_F64;
    if ((st = fa_npy_as_tensor(arr, view)) != FA_OK) {
        cli_die_npy(st);
        fa_npy_free(arr);
        goto out;
    }
    /* the scales' own file named beside the codes' in the library's messages (a NaN descale
     * is the descale file's fault, not the codes') */
    char who[1024];
    const char *sfile = x.scale_kind == FA_QSCALE_HEAD ? lp->descale[t] : x.block_scale ? lp->scale[t] : NULL;
    if (sfile) snprintf(who, sizeof who, "%s (scales %s)", path, sfile);
    else snprintf(who, sizeof who, "%s", path);
    if ((st = fa_dequantize(&x, who, view)) != FA_OK) {
        cli_die_status(st);
        fa_npy_free(arr);
        goto out;
    }
    rc = 0;
out:
    fa_npy_free(&codes);
    fa_npy_free(&bs);
    fa_npy_free(&ds);
    return rc;
}

int cli_lowprec_load_qkv(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path,
                         const cli_lowprec *lp)
{
    memset(in, 0, sizeof *in);
    in->q_path = q_path;
    in->k_path = k_path;
    in->v_path = v_path;
    /* K first: Q's per-(batch, kv head) descales need heads_k */
    if (load_one(1, k_path, lp, 0, 0, &in->k, &in->k_t)) goto fail;
    if (load_one(2, v_path, lp, in->k.shape[0], in->k.shape[2], &in->v, &in->v_t)) goto fail;
    if (load_one(0, q_path, lp, in->k.shape[0], in->k.shape[2], &in->q, &in->q_t)) goto fail;
    const int64_t *q = in->q.shape, *k = in->k.shape, *v = in->v.shape;
    in->batch = q[0];
    in->seqlen_q = q[1];
    in->heads = q[2];
    in->d = q[3];
    in->seqlen_k = k[1];
    in->heads_k = k[2];
    in->dv = v[3];
    if (k[3] != q[3])
        cli_die("%s: head dim %lld does not match %s head dim %lld", k_path, (long long)k[3], q_path, (long long)q[3]);
    else if (v[1] != k[1])
        cli_die("%s: seqlen %lld does not match %s seqlen %lld", v_path, (long long)v[1], k_path, (long long)k[1]);
    else if (v[2] != k[2])
        cli_die("%s: heads %lld does not match %s heads %lld", v_path, (long long)v[2], k_path, (long long)k[2]);
    else if (in->heads % in->heads_k != 0)
        cli_die("%s: heads (%lld) is not a multiple of %s heads (%lld)", q_path, (long long)in->heads, k_path,
                (long long)in->heads_k);
    else
        return 0;
fail:
    cli_qkv_free(in);
    return CLI_EXIT_USAGE;
}
