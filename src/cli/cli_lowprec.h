/*
 * cli_lowprec.h — low-precision inputs for `run` and `check` (cli_lowprec.c):
 * --qkv-format e4m3|e5m2|e2m1|int8 and the scale options of DESIGN.md. Q, K
 * and V are `|u1` code files; they are decoded by fa_dequantize into float64
 * arrays that stand in for the usual inputs of cli_qkv.
 */
#ifndef FA_CLI_LOWPREC_H
#define FA_CLI_LOWPREC_H

#include "cli.h"

typedef struct cli_lowprec {
    const char *format_text;      /* --qkv-format */
    int packed;                   /* --fp4-packed */
    const char *descale[3];       /* --descale-q/-k/-v: a number (per tensor) or a [batch, heads_k] f32 file */
    const char *scale[3];         /* --scale-q/-k/-v: block-scale code files */
    const char *global[3];        /* --global-scale-q/-k/-v (nvfp4) */
    const char *scale_format;     /* --scale-format nvfp4|mxfp4 */
    const char *v_scale_along;    /* --v-scale-along d|tokens */
    int format;                   /* parsed fa_qformat, after cli_lowprec_validate */
} cli_lowprec;

void cli_lowprec_init(cli_lowprec *lp);

/* One of the options above at argv[*i]: 1 consumed, 0 not ours, -1 error printed. */
int cli_lowprec_parse(int argc, char **argv, int *i, cli_lowprec *lp);

/* 1 if any low-precision option was given. */
int cli_lowprec_active(const cli_lowprec *lp);

/* Check the combination (before any load), also against the varlen and KV
 * cache options of `attn`, which low-precision inputs do not take (yet).
 * Returns 0, or prints and returns 2. */
int cli_lowprec_validate(cli_lowprec *lp, const cli_attn *attn);

/* Load codes and scales, dequantize into in->q/k/v (float64) and cross-check
 * shapes like cli_load_qkv. Returns 0, or prints one line and returns 2. */
int cli_lowprec_load_qkv(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path,
                         const cli_lowprec *lp);

/* The input files the options name (for cli_check_files): fills up to 6 entries, returns the count. */
int cli_lowprec_inputs(const cli_lowprec *lp, cli_named *ins);

extern const char cli_lowprec_help[];

#endif /* FA_CLI_LOWPREC_H */
