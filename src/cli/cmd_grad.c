/*
 * cmd_grad.c — `flashattn grad`: the attention backward pass on .npy files.
 *
 *   Q.npy [B][Sq][H][d], K.npy [B][Sk][Hk][d], V.npy [B][Sk][Hk][dv],
 *   DO.npy [B][Sq][H][dv] (dLoss/dO)
 *     -> DQ.npy [B][Sq][H][d], DK.npy [B][Sk][Hk][d], DV.npy [B][Sk][Hk][dv]
 *        (float32 unless --dtype-out)
 *
 * O and LSE are recomputed by the forward pass of the same implementation
 * (fa_backward with o = lse = NULL), so the command needs only what a
 * training step's backward receives. Same order of work as `run`: parse
 * every option, check the output directories, load and cross-check the
 * inputs, compute, then save all three outputs or none (cli_save_outputs).
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char grad_usage[] =
    "usage: flashattn grad -q Q.npy -k K.npy -v V.npy --dout DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy\n"
    "                      [MASK OPTIONS] [--impl NAME] [--threads T] [--dtype-out f32|f64|f16|bf16]\n"
    "                      [--dsinks-out DSINKS.npy]\n"
    "\n"
    "Attention backward pass: given dO = dLoss/dO, writes dLoss/dQ, dLoss/dK, dLoss/dV\n"
    "(FlashAttention semantics: P is recomputed from Q, K and the forward's LSE; for GQA/MQA,\n"
    "dK and dV are summed over the query heads sharing a kv head; rows with no visible key\n"
    "contribute nothing).\n"
    "\n"
    "  -q Q.npy           queries [batch, seqlen_q, heads, d]\n"
    "  -k K.npy           keys    [batch, seqlen_k, heads_k, d]\n"
    "  -v V.npy           values  [batch, seqlen_k, heads_k, d_v]\n"
    "  --dout DO.npy      gradient of the output [batch, seqlen_q, heads, d_v]\n"
    "  --dq DQ.npy        written: gradient of Q, shape of Q\n"
    "  --dk DK.npy        written: gradient of K, shape of K\n"
    "  --dv DV.npy        written: gradient of V, shape of V\n"
    "  --dtype-out T      dtype of the gradients: f32 (default), f64, f16 or bf16 (<u2)\n"
    "  --dsinks-out F     with --sinks: written, the gradient of the sinks [heads]\n"
    "                     (f64 with --dtype-out f64, else f32):\n"
    "                     dsink_h = -sum_{b,i} e^(sink_h - LSE_bhi) * (dO_bhi . O_bhi)\n"
    "\n"
    "%s\n%s\n%s"
    "  (--impl standard has no backward pass: use flash or reference)\n"
    "\n"
    "Exit status: 0 ok; 2 bad usage or bad input (one line on stderr naming the file; no output written).\n";

/* Load dO and check it against Q and V. Returns 0 or prints and returns 2. */
static int load_dout(const char *path, const cli_qkv *in, const fa_varlen *vl, fa_npy *arr, fa_tensor *t)
{
    const int skip = cli_skip(in); /* varlen: [total_q, heads, d_v]; rows no sequence owns may hold anything */
    if (cli_load_array(path, 4 - skip, !skip, skip ? "dO [total_q, heads, d_v] (varlen)" : "dO [batch, seqlen_q, heads, d_v]",
                       arr, t))
        return CLI_EXIT_USAGE;
    const int64_t want[4] = {in->batch, in->seqlen_q, in->heads, in->dv};
    if (memcmp(arr->shape, want + skip, (size_t)(4 - skip) * sizeof(int64_t)) != 0) {
        char sh[96], ws[96];
        cli_die("%s: shape %s should be %s = %s (from %s and %s)", path, cli_shape(4 - skip, arr->shape, sh, sizeof sh),
                skip ? "[total_q, heads, d_v]" : "[batch, seqlen_q, heads, d_v]",
                cli_shape(4 - skip, want + skip, ws, sizeof ws), in->q_path, in->v_path);
        fa_npy_free(arr);
        return CLI_EXIT_USAGE;
    }
    if (skip && cli_varlen_rows_finite(path, arr, vl)) {
        fa_npy_free(arr);
        return CLI_EXIT_USAGE;
    }
    return 0;
}

static int grad_main(int argc, char **argv)
{
    const char *q_path = NULL, *k_path = NULL, *v_path = NULL, *do_path = NULL;
    const char *dq_path = NULL, *dk_path = NULL, *dv_path = NULL, *dtype_text = NULL, *ds_path = NULL;
    cli_attn attn;
    cli_attn_init(&attn);

    for (int i = 1; i < argc; i++) {
        int r;
        if (cli_is_help(argv[i])) {
            printf(grad_usage, cli_mask_help, cli_exec_help, cli_varlen_help);
            return CLI_EXIT_OK;
        }
        if ((r = cli_parse_mask_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_parse_exec_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_parse_varlen_option(argc, argv, &i, &attn)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-k", &k_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "-v", &v_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dout", &do_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dq", &dq_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dk", &dk_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dv", &dv_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dsinks-out", &ds_path)) != 0 ||
            (r = cli_opt_value(argc, argv, &i, "--dtype-out", &dtype_text)) != 0) {
            if (r < 0) return CLI_EXIT_USAGE;
            continue;
        }
        return cli_unknown_option("grad", argv[i]);
    }
    if (!q_path || !k_path || !v_path || !do_path || !dq_path || !dk_path || !dv_path)
        return cli_die("grad: missing %s (see flashattn grad --help)",
                       !q_path ? "-q Q.npy" : !k_path ? "-k K.npy" : !v_path ? "-v V.npy"
                       : !do_path ? "--dout DO.npy" : !dq_path ? "--dq DQ.npy" : !dk_path ? "--dk DK.npy"
                       : "--dv DV.npy");
    fa_dtype out_dtype = FA_F32;
    if (dtype_text && cli_parse_dtype("--dtype-out", dtype_text, &out_dtype) != 0) return CLI_EXIT_USAGE;
    if (ds_path && !attn.sinks_path) return cli_die("--dsinks-out needs --sinks (the sinks to differentiate)");
    const cli_named outs_named[4] = {{"--dq", dq_path}, {"--dk", dk_path}, {"--dv", dv_path}, {"--dsinks-out", ds_path}};
    const cli_named ins_named[10] = {{"-q", q_path}, {"-k", k_path}, {"-v", v_path}, {"--dout", do_path},
                                    {"--alibi", attn.alibi_path}, {"--cu-seqlens-q", attn.cu_q_path},
                                    {"--cu-seqlens-k", attn.cu_k_path}, {"--seqused-k", attn.seqused_path},
                                    {"--sinks", attn.sinks_path}, {"--dropout-mask", attn.dropout_mask_path}};
    if (cli_check_files("grad", outs_named, 4, ins_named, 10)) return CLI_EXIT_USAGE;

    cli_qkv in;
    if (cli_load_inputs(&in, &attn, q_path, k_path, v_path)) return CLI_EXIT_USAGE;
    fa_npy do_arr;
    fa_tensor do_t;
    memset(&do_arr, 0, sizeof do_arr);
    void *mem[4] = {NULL, NULL, NULL, NULL}; /* dq, dk, dv, dsinks */
    int rc = CLI_EXIT_USAGE;
    if (cli_attn_load_varlen(&attn, &in) || cli_attn_load_alibi(&attn, &in) || load_dout(do_path, &in, attn.opt.varlen, &do_arr, &do_t))
        goto done;

    /* dQ [B][Sq][H][d], dK [B][Sk][Hk][d], dV [B][Sk][Hk][dv], all in out_dtype (varlen: without the batch of 1) */
    const int skip = cli_skip(&in);
    const int64_t shapes[3][4] = {{in.batch, in.seqlen_q, in.heads, in.d},
                                  {in.batch, in.seqlen_k, in.heads_k, in.d},
                                  {in.batch, in.seqlen_k, in.heads_k, in.dv}};
    fa_tensor grads[3];
    for (int x = 0; x < 3; x++) {
        const size_t n = (size_t)(shapes[x][0] * shapes[x][1] * shapes[x][2] * shapes[x][3]);
        mem[x] = calloc(n ? n : 1, fa_dtype_size(out_dtype));
        if (!mem[x]) {
            cli_die("grad: out of memory allocating the gradients (%zu elements)", n);
            goto done;
        }
        fa_status st = fa_tensor_make(&grads[x], mem[x], out_dtype, 4 - skip, shapes[x] + skip, NULL);
        if (st != FA_OK) {
            cli_die_status(st);
            goto done;
        }
    }

    /* dsinks [heads]: f64 with --dtype-out f64, else f32 */
    const fa_dtype ds_dtype = out_dtype == FA_F64 ? FA_F64 : FA_F32;
    const int64_t ds_shape[1] = {in.heads};
    fa_tensor ds_t;
    fa_backward_extra extra;
    fa_backward_extra_init(&extra, sizeof extra);
    if (ds_path) {
        mem[3] = calloc((size_t)in.heads, fa_dtype_size(ds_dtype));
        if (!mem[3]) {
            cli_die("grad: out of memory allocating dsinks");
            goto done;
        }
        fa_tensor_make(&ds_t, mem[3], ds_dtype, 1, ds_shape, NULL);
        extra.dsinks = &ds_t;
    }

    if (cli_inputs_in_use_finite(&in, &attn)) goto done; /* varlen: the rows sequences read */
    double t0 = cli_now();
    fa_status st = fa_backward_ex(&in.q_t, &in.k_t, &in.v_t, NULL, NULL, &do_t, &grads[0], &grads[1], &grads[2],
                                  &attn.opt, &extra);
    double secs = cli_now() - t0;
    if (st != FA_OK) {
        cli_die_status(st);
        goto done;
    }

    const char *grad_paths[3] = {dq_path, dk_path, dv_path};
    for (int x = 0; x < 3; x++) /* written anyway, but never silently */
        cli_warn_nonfinite(grad_paths[x], mem[x], out_dtype, fa_tensor_numel(&grads[x]), 0);

    if (ds_path) cli_warn_nonfinite(ds_path, mem[3], ds_dtype, in.heads, 0);

    cli_output outs[4] = {
        {dq_path, mem[0], out_dtype, 4 - skip, shapes[0] + skip},
        {dk_path, mem[1], out_dtype, 4 - skip, shapes[1] + skip},
        {dv_path, mem[2], out_dtype, 4 - skip, shapes[2] + skip},
        {ds_path, mem[3], ds_dtype, 1, ds_shape},
    };
    if (cli_save_outputs(outs, 4)) goto done;

    fa_cpu_info info;
    fa_get_cpu_info(&info);
    printf("wrote %s, %s, %s%s%s (%s; %s, %s, %d threads, %.1f ms)\n", dq_path, dk_path, dv_path,
           ds_path ? ", " : "", ds_path ? ds_path : "",
           fa_dtype_name(out_dtype), fa_impl_name(attn.opt.impl),
           attn.opt.impl == FA_IMPL_REFERENCE ? "float64 loops" : info.isa,
           attn.opt.num_threads > 0 ? attn.opt.num_threads : info.max_threads, secs * 1e3);
    rc = CLI_EXIT_OK;
done:
    for (int x = 0; x < 4; x++) free(mem[x]);
    fa_npy_free(&do_arr);
    cli_attn_free(&attn);
    cli_qkv_free(&in);
    return rc;
}

int cmd_grad(int argc, char **argv)
{
    cli_guard_runtime_exit();
    return cli_finish(grad_main(argc, argv));
}
