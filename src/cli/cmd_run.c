/*
 * cmd_run.c — `flashattn run`: attention on .npy files.
 *
 *   Q.npy [B][Sq][H][d], K.npy [B][Sk][Hk][d], V.npy [B][Sk][Hk][dv]
 *     -> O.npy [B][Sq][H][dv] (float32 unless --dtype-out), LSE.npy [B][H][Sq] float32
 *   varlen (--cu-seqlens-q/-k): Q [total_q][H][d], K/V [total_k][Hk][d|dv]
 *     -> O [total_q][H][dv], LSE [H][total_q]
 *
 * Order of work: parse every option, check the outputs (writable, not a
 * directory, not the same file as another output or an input, under any
 * spelling: cli_check_files), load and cross-check the inputs, compute, then
 * save. Nothing is written until the result exists, and O and LSE are saved
 * all or none (cli_save_outputs: both temporaries complete before either is
 * renamed). An output holding NaN/Inf (e.g. --dtype-out f16 beyond 65504) is
 * written with a warning on stderr.
 */
#include "cli.h"
#include "cli_lowprec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char run_usage[] =
    "usage: flashattn run -q Q.npy -k K.npy -v V.npy -o O.npy [--lse LSE.npy]\n"
    "                     [MASK OPTIONS] [--impl NAME] [--threads T] [--dtype-out f32|f64|f16|bf16]\n"
    "\n"
    "Exact attention O = softmax(mask(scale * Q K^T)) V on .npy files (numpy format 1.0/2.0,\n"
    "little-endian, C order; dtypes <f4, <f8, <f2, and <u2 holding bfloat16 bit patterns).\n"
    "\n"
    "  -q Q.npy           queries [batch, seqlen_q, heads, d]\n"
    "  -k K.npy           keys    [batch, seqlen_k, heads_k, d]   (heads %% heads_k == 0: GQA/MQA)\n"
    "  -v V.npy           values  [batch, seqlen_k, heads_k, d_v]\n"
    "  -o O.npy           output  [batch, seqlen_q, heads, d_v]\n"
    "  --lse LSE.npy      also write the log-sum-exp [batch, heads, seqlen_q], float32\n"
    "                     (natural log; -inf for a row with no visible key)\n"
    "  --dtype-out T      dtype of O: f32 (default), f64, f16 or bf16 (written as <u2)\n"
    "\n"
    "%s\n%s\n%s\n%s"
    "  --k-cache-out F --v-cache-out F  also write the caches after the append\n\n"
    "%s\n"
    "Exit status: 0 ok; 2 bad usage or bad input (one line on stderr naming the file; no output written).\n";

static int run_main(int argc, char **argv)
{
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *o_path = NULL, *lse_path = NULL;
    const char *dtype_text = NULL, *kc_out = NULL, *vc_out = NULL;
    cli_attn attn;
    cli_attn_init(&attn);
    cli_lowprec lp;
    cli_lowprec_init(&lp);

    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf(run_usage, cli_mask_help, cli_exec_help, cli_varlen_help, cli_kvcache_help, cli_lowprec_help);
            return CLI_EXIT_OK;
        }
        if ((r = cli_parse_mask_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_lowprec_parse(argc, argv, &i, &lp)) != 0 ||
            (r = cli_parse_exec_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_parse_varlen_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_parse_kvcache_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--k-cache-out", &kc_out)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--v-cache-out", &vc_out)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-k", &k_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-v", &v_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-o", &o_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--lse", &lse_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype-out", &dtype_text)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            continue;
        }
        return cli_unknown_option("run", argv[i]);
    }
    if (!q_path || !k_path || !v_path || !o_path)
        return cli_die("run: missing %s (see flashattn run --help)",
                       !q_path ? "-q Q.npy" : !k_path ? "-k K.npy" : !v_path ? "-v V.npy" : "-o O.npy");
    fa_dtype out_dtype = FA_F32;
    if (dtype_text && cli_parse_dtype("--dtype-out", dtype_text, &out_dtype) != 0) return CLI_EXIT_USAGE;
    if ((kc_out || vc_out) && !attn.cache_seqlens_path)
        return cli_die("%s needs --cache-seqlens (a KV cache)", kc_out ? "--k-cache-out" : "--v-cache-out");
    const cli_named outs_named[4] = {{"-o", o_path}, {"--lse", lse_path}, {"--k-cache-out", kc_out},
                                     {"--v-cache-out", vc_out}};
    if (cli_lowprec_validate(&lp, &attn)) return CLI_EXIT_USAGE;
    cli_named ins_named[23] = {{"-q", q_path}, {"-k", k_path}, {"-v", v_path}, {"--alibi", attn.alibi_path},
                                     {"--cu-seqlens-q", attn.cu_q_path}, {"--cu-seqlens-k", attn.cu_k_path},
                                     {"--seqused-k", attn.seqused_path}, {"--cache-seqlens", attn.cache_seqlens_path},
                                     {"--k-new", attn.k_new_path}, {"--v-new", attn.v_new_path},
                                     {"--cache-batch-idx", attn.cache_idx_path}, {"--cache-leftpad", attn.leftpad_path},
                                     {"--block-table", attn.block_table_path}, {"--sinks", attn.sinks_path},
                                     {"--dropout-mask", attn.dropout_mask_path},
                                     {"--rotary-cos", attn.rotary_cos_path}, {"--rotary-sin", attn.rotary_sin_path}};
    const int n_ins = 17 + cli_lowprec_inputs(&lp, ins_named + 17);
    if (cli_check_files("run", outs_named, 4, ins_named, n_ins)) return CLI_EXIT_USAGE;

    cli_qkv in;
    if (lp.format ? cli_lowprec_load_qkv(&in, q_path, k_path, v_path, &lp)
                  : cli_load_inputs(&in, &attn, q_path, k_path, v_path))
        return CLI_EXIT_USAGE;
    if (cli_attn_load_varlen(&attn, &in) || cli_attn_load_kvcache(&attn, &in) || cli_attn_load_alibi(&attn, &in)) {
        cli_attn_free(&attn);
        cli_qkv_free(&in);
        return CLI_EXIT_USAGE;
    }

    /* O: [B][Sq][H][dv] in out_dtype;  LSE: [B][H][Sq] float32 (varlen: without the batch of 1) */
    const int skip = cli_skip(&in);
    int64_t o_full[4] = {in.batch, in.seqlen_q, in.heads, in.dv};
    int64_t lse_full[3] = {in.batch, in.heads, in.seqlen_q};
    const int64_t *o_shape = o_full + skip, *lse_shape = lse_full + skip;
    size_t o_numel = (size_t)(in.batch * in.seqlen_q * in.heads * in.dv);
    size_t lse_numel = (size_t)(in.batch * in.heads * in.seqlen_q);
    void *o_mem = calloc(o_numel ? o_numel : 1, fa_dtype_size(out_dtype));
    float *lse_mem = lse_path ? calloc(lse_numel ? lse_numel : 1, sizeof(float)) : NULL;
    int rc = CLI_EXIT_USAGE;
    fa_tensor o, lse;
    fa_status st;
    if (!o_mem || (lse_path && !lse_mem)) {
        cli_die("run: out of memory allocating the output (%zu elements)", o_numel);
        goto done;
    }
    if ((st = fa_tensor_make(&o, o_mem, out_dtype, 4 - skip, o_shape, NULL)) != FA_OK ||
        (lse_path && (st = fa_tensor_make(&lse, lse_mem, FA_F32, 3 - skip, lse_shape, NULL)) != FA_OK)) {
        cli_die_status(st);
        goto done;
    }

    if (cli_inputs_in_use_finite(&in, &attn)) goto done; /* varlen / KV cache: the rows read */
    const long amx0 = fa_amx_calls();
    double t0 = cli_now();
    st = fa_forward(&in.q_t, &in.k_t, &in.v_t, &o, lse_path ? &lse : NULL, &attn.opt);
    double secs = cli_now() - t0;
    if (st != FA_OK) {
        cli_die_status(st);
        goto done;
    }

    /* written anyway (the caller asked for this dtype), but never silently */
    cli_warn_nonfinite(o_path, o_mem, out_dtype, (int64_t)o_numel, 0);
    if (lse_path) cli_warn_nonfinite(lse_path, lse_mem, FA_F32, (int64_t)lse_numel, 1);

    cli_output outs[4] = {
        {o_path, o_mem, out_dtype, 4 - skip, o_shape},
        {lse_path, lse_mem, FA_F32, 3 - skip, lse_shape},
        {kc_out, in.k.data, in.k.dtype, 4, in.k.shape}, /* the caches, appended to in place */
        {vc_out, in.v.data, in.v.dtype, 4, in.v.shape},
    };
    if (cli_save_outputs(outs, 4)) goto done;

    fa_cpu_info info;
    char sh[96];
    fa_get_cpu_info(&info);
    if (lp.format)
        printf("inputs: %s codes decoded exactly (%s); attention on the dequantized values\n",
               fa_qformat_name(lp.format), lp.scale_format ? lp.scale_format : "descales");
    printf("wrote %s %s %s%s%s (%s, %s, up to %d threads, %.1f ms)\n", o_path,
           cli_shape(4 - skip, o_shape, sh, sizeof sh),
           fa_dtype_name(out_dtype), lse_path ? " and " : "", lse_path ? lse_path : "",
           fa_impl_name(attn.opt.impl),
           attn.opt.impl == FA_IMPL_REFERENCE ? "float64 loops" : fa_amx_calls() > amx0 ? "amx" : info.isa,
           attn.opt.num_threads > 0 ? attn.opt.num_threads : info.max_threads, secs * 1e3);
    rc = CLI_EXIT_OK;
done:
    free(o_mem);
    free(lse_mem);
    cli_attn_free(&attn);
    cli_qkv_free(&in);
    return rc;
}

int cmd_run(int argc, char **argv)
{
    cli_guard_runtime_exit();
    return cli_finish(run_main(argc, argv));
}
