/*
 * cli.h — what the flashattn subcommands share (cli_common.c).
 *
 * The command-line tool is a thin shell around the public API: main.c picks a
 * subcommand from a table; each subcommand (cmd_<name>.c) parses its options,
 * loads .npy files through the helpers below, calls fa_* functions, and prints.
 * Only this layer prints or decides exit codes; the library returns statuses.
 *
 * Conventions every subcommand follows:
 *   - exit status: 0 ok, 1 check mismatch (only `check`), 2 bad usage or bad input;
 *   - every error is ONE line on stderr, "flashattn: <message>", naming the file
 *     when a file is at fault (the messages of npy.c, fa_npy_last_error(), already do);
 *   - an unknown option is an error, never ignored;
 *   - no output file is left behind on any error: outputs are checked before any
 *     work (cli_check_files), every output goes to its temporary before any is
 *     renamed into place (cli_save_outputs), and temporaries are removed on
 *     SIGINT/SIGTERM; devices and FIFOs are written in place, never replaced.
 *
 * Typical use, as in cmd_run.c:
 *
 *     cli_attn attn;  cli_attn_init(&attn);
 *     for (int i = 1; i < argc; i++) {
 *         int r;
 *         if ((r = cli_parse_mask_option(argc, argv, &i, &attn)) != 0) { if (r < 0) goto usage; continue; }
 *         if ((r = cli_opt_value(argc, argv, &i, "-q", &q_path)) != 0) { if (r < 0) goto usage; continue; }
 *         ...
 *         return cli_unknown_option("run", argv[i]);
 *     }
 *     cli_qkv in;
 *     if (cli_load_qkv(&in, q_path, k_path, v_path) != 0) ...   // prints, returns 2
 *     if (cli_attn_load_alibi(&attn, &in) != 0) ...              // sets attn.opt.alibi_slopes
 *     fa_forward(&in.q_t, &in.k_t, &in.v_t, &o, &lse, &attn.opt);
 */
#ifndef FA_CLI_H
#define FA_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn.h"
#include "npy.h"

/* ------------------------------------------------------------------------ */
/* Exit codes and subcommands                                                */
/* ------------------------------------------------------------------------ */

enum {
    CLI_EXIT_OK = 0,        /* success (check: within tolerance) */
    CLI_EXIT_MISMATCH = 1,  /* check: the tested output is out of tolerance */
    CLI_EXIT_USAGE = 2,     /* bad usage or bad input */
};

/* Each takes argv[0] = the subcommand's name and returns an exit status. */
int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_grad(int argc, char **argv);
int cmd_check_grad(int argc, char **argv);
int cmd_probe(int argc, char **argv);

/* ------------------------------------------------------------------------ */
/* Errors                                                                    */
/* ------------------------------------------------------------------------ */

/* Print "flashattn: <message>\n" to stderr; returns CLI_EXIT_USAGE. */
int cli_die(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Print the library's message for a failed call (fa_last_error(), or the
 * status name if empty) as one line; returns CLI_EXIT_USAGE. */
int cli_die_status(fa_status st);

/* Print the .npy layer's message for a failed fa_npy_* / fa_outfile_* call
 * (fa_npy_last_error(), or the status name if empty); returns CLI_EXIT_USAGE. */
int cli_die_npy(fa_status st);

/* "flashattn <cmd>: unknown option '<arg>' (see flashattn <cmd> --help)"; returns 2. */
int cli_unknown_option(const char *cmd, const char *arg);

/* ------------------------------------------------------------------------ */
/* Option parsing                                                            */
/* ------------------------------------------------------------------------ */

/* 1 if argv[i] is "-h" or "--help". */
int cli_is_help(const char *arg);

/*
 * Option with a value, spelled "NAME VALUE" or "NAME=VALUE". If argv[*i] is
 * option `name`, sets *value, advances *i past a separate value, and returns
 * 1; returns 0 if argv[*i] is a different option; -1 (after printing) if the
 * value is missing.
 */
int cli_opt_value(int argc, char **argv, int *i, const char *name, const char **value);

/*
 * Flag `name` (an option without a value): 1 when argv[i] is it, 0 when argv[i]
 * is another argument, -1 (after printing) when it was given before — each
 * option once, as for options with a value (`--causal --causal` is refused).
 */
int cli_opt_flag(char **argv, int i, const char *name);

/* Whether text is written as the CLI's numbers are (docs/cli.md): a digit, or '-' and a
 * digit, first, and no hexadecimal 'x' — what strtol/strtod alone would not refuse. */
int cli_is_decimal(const char *text);

/* Parse a whole decimal integer in [lo, hi] / a finite double (subnormals
 * accepted; overflow and underflow to 0 refused as too large / too small);
 * on error print "flashattn: OPT: ..." and return -1, else 0. */
int cli_parse_int(const char *opt, const char *text, long long lo, long long hi, long long *out);
int cli_parse_double(const char *opt, const char *text, double *out);

/* A positive byte count, optionally suffixed K, M, G or T (powers of 1024). */
int cli_parse_bytes(const char *opt, const char *text, size_t *out);

/* ------------------------------------------------------------------------ */
/* Attention options: MASK OPTIONS and execution options                     */
/* ------------------------------------------------------------------------ */

typedef struct cli_attn {
    fa_options opt;          /* everything fa_forward / fa_check need */
    const char *alibi_path;  /* --alibi FILE, or NULL */
    fa_npy alibi;            /* slopes loaded by cli_attn_load_alibi (owned) */
    fa_tensor alibi_t;       /* view of `alibi`; opt.alibi_slopes points here */
    /* varlen (--cu-seqlens-q/-k, --seqused-k): int32 index files */
    const char *cu_q_path, *cu_k_path, *seqused_path;
    int32_t *cu_q, *cu_k, *seqused; /* loaded by cli_attn_load_varlen (owned) */
    fa_varlen varlen;        /* opt.varlen points here once loaded */
    /* KV cache (--cache-seqlens, ...): -k/-v are then the caches (or pages) */
    const char *cache_seqlens_path, *k_new_path, *v_new_path, *cache_idx_path, *leftpad_path, *block_table_path;
    int32_t *cache_seqlens, *cache_idx, *leftpad, *block_table; /* loaded by cli_attn_load_kvcache (owned) */
    fa_npy k_new, v_new;     /* new keys and values (owned) */
    fa_tensor k_new_t, v_new_t;
    fa_kvcache kvcache;      /* opt.kvcache points here once loaded */
    /* attention sinks (--sinks F: float [heads]) */
    const char *sinks_path;
    fa_npy sinks;            /* loaded by cli_attn_load_alibi (owned) */
    fa_tensor sinks_t;       /* opt.sinks points here once loaded */
    /* dropout (--dropout-p P --dropout-mask F: uint8 keep-mask [batch, heads, seqlen_q, seqlen_k]) */
    const char *dropout_p_text, *dropout_mask_path;
    fa_npy keep;             /* loaded by cli_attn_load_alibi (owned) */
    fa_dropout dropout;      /* opt.dropout points here once loaded */
    /* rotary (--rotary-cos F --rotary-sin F [--rotary-interleaved]; KV cache with --k-new only) */
    const char *rotary_cos_path, *rotary_sin_path;
    int rotary_interleaved;
    fa_npy rot_cos, rot_sin; /* loaded by cli_attn_load_alibi (owned) */
    fa_tensor rot_cos_t, rot_sin_t;
    fa_rotary rotary;        /* opt.rotary points here once loaded */
} cli_attn;

/* Defaults: fa_options_default() (flash, no mask, default scale). */
void cli_attn_init(cli_attn *a);

/*
 * MASK OPTIONS at argv[*i]:
 *   --causal  --window L,R  --softcap C  --scale S  --alibi SLOPES.npy  --align bottom-right|top-left
 *   --sinks SINKS.npy  --dropout-p P  --dropout-mask KEEP.npy
 * Returns 1 if consumed (with *i advanced past its value), 0 if argv[*i] is
 * not a mask option, -1 after printing an error for a bad value.
 */
int cli_parse_mask_option(int argc, char **argv, int *i, cli_attn *a);

/* Execution options at argv[*i]: --impl NAME  --threads T  --block-q N  --block-k N
 * --num-splits N  --standard-max-bytes N.
 * Same return convention. */
int cli_parse_exec_option(int argc, char **argv, int *i, cli_attn *a);

/*
 * Variable-length batches at argv[*i]: --cu-seqlens-q F  --cu-seqlens-k F
 * --seqused-k F (int32 .npy files). Same return convention.
 */
int cli_parse_varlen_option(int argc, char **argv, int *i, cli_attn *a);

/* 1 when --cu-seqlens-q or --cu-seqlens-k was given: Q, K, V (and O, dO, the
 * gradients) are then packed [total, heads, x], LSE [heads, total_q]. */
int cli_attn_is_varlen(const cli_attn *a);

/*
 * KV cache at argv[*i]: --cache-seqlens F  --k-new F  --v-new F
 * --cache-batch-idx F  --cache-leftpad F  --block-table F, and rotary:
 * --rotary-cos F  --rotary-sin F  --rotary-interleaved. Same return
 * convention. (--k-cache-out/--v-cache-out are run's own outputs.)
 */
int cli_parse_kvcache_option(int argc, char **argv, int *i, cli_attn *a);

/* 1 when --cache-seqlens was given: -k/-v are caches [batch_cache, seqlen_cache,
 * heads_k, x] or, with --block-table, pages [num_pages, page_size, heads_k, x]. */
int cli_attn_is_kvcache(const cli_attn *a);

/* Help text for the option groups (for each subcommand's --help). */
extern const char cli_mask_help[];
extern const char cli_exec_help[];
extern const char cli_varlen_help[];
extern const char cli_kvcache_help[];

/* Free the loaded slopes. Safe to call on an initialized, unloaded cli_attn. */
void cli_attn_free(cli_attn *a);

/* ------------------------------------------------------------------------ */
/* Loading inputs                                                            */
/* ------------------------------------------------------------------------ */

/* Q, K, V loaded from .npy files and checked against each other. */
typedef struct cli_qkv {
    const char *q_path, *k_path, *v_path;
    fa_npy q, k, v;                 /* owned arrays, C order */
    fa_tensor q_t, k_t, v_t;        /* Q [B][Sq][H][d], K [B][Sk][Hk][d], V [B][Sk][Hk][dv] */
    int64_t batch, seqlen_q, seqlen_k, heads, heads_k, d, dv;
    int packed;                     /* varlen: rank 3 [total, heads, x]; batch = 1, seqlen_q/k = total_q/k */
} cli_qkv;

/*
 * Shapes of per-row arrays are built with four entries [batch, seqlen, heads,
 * x] (LSE: three, [batch, heads, seqlen_q]); a varlen array drops the leading
 * batch of 1: its rank is one less and its shape starts at shape + cli_skip(in).
 */
static inline int cli_skip(const cli_qkv *in) { return in->packed ? 1 : 0; }

/*
 * Load one float array: `path` must be a valid .npy of a float type ('<f4',
 * '<f8', '<f2', '<u2'; int32 and uint8 files are refused by name), of rank
 * `want_rank` (0: any rank 1..4), finite if `require_finite` (the first NaN/Inf is reported by its
 * index), and `role` (e.g. "Q [batch, seqlen_q, heads, d]") is used in the
 * rank message. Fills *arr and, when t is non-NULL, the tensor view *t.
 * Returns 0, or prints one line and returns CLI_EXIT_USAGE with *arr freed.
 */
int cli_load_array(const char *path, int want_rank, int require_finite, const char *role,
                   fa_npy *arr, fa_tensor *t);

/*
 * Load an int32 index file (cu_seqlens, seqused_k, cache_seqlens, block_table,
 * ...): `path` must be a valid .npy of type '<i4' (big-endian '>i4' and every
 * other type refused), of rank `want_rank` (< 0: any rank 0..4), and, where
 * `want_shape` is non-NULL, of extent want_shape[r] on each axis r with
 * want_shape[r] >= 0 (< 0: any extent). `role` names the file's part in the
 * messages, e.g. "--cu-seqlens-q [batch + 1]". The values are not checked:
 * what an index may be is the caller's rule. Returns 0 with *arr loaded
 * (arr->data is int32_t[arr->numel]), or prints ONE line naming the file, the
 * expected type and shape and the ones found, e.g.
 *   flashattn: cu.npy: --cu-seqlens-q [batch + 1] must be int32 ('<i4') of
 *   shape [3], found float32 ('<f4') of shape [2, 3]
 * and returns CLI_EXIT_USAGE with *arr freed.
 */
int cli_load_index(const char *path, const char *role, int want_rank, const int64_t *want_shape, fa_npy *arr);

/* The same for a uint8 code file ('|u1': FP8/FP4/INT8 codes, keep-masks);
 * arr->data is uint8_t[arr->numel]. */
int cli_load_codes(const char *path, const char *role, int want_rank, const int64_t *want_shape, fa_npy *arr);

/*
 * Load Q, K, V (BSHD, rank 4, finite) and check: batch equal, K and V seqlen
 * equal, K and V heads equal, heads % heads_k == 0, d of Q equal d of K,
 * d >= 1, d_v >= 1, heads >= 1. Messages name the files involved.
 * Returns 0, or prints one line and returns CLI_EXIT_USAGE (nothing left loaded).
 */
int cli_load_qkv(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path);

/* cli_load_qkv for a varlen batch: rank 3 Q [total_q, heads, d], K [total_k,
 * heads_k, d], V [total_k, heads_k, d_v]; sets in->packed. */
int cli_load_qkv_packed(cli_qkv *in, const char *q_path, const char *k_path, const char *v_path);

/* cli_load_qkv, cli_load_qkv_packed (varlen), or, with --cache-seqlens, Q plus
 * the caches (any batch_cache; not required finite: rows past the lengths are
 * never read), as a's options ask. A cache option without --cache-seqlens is
 * refused here, before -k/-v load. */
int cli_load_inputs(cli_qkv *in, const cli_attn *a, const char *q_path, const char *k_path, const char *v_path);

/*
 * If varlen options were given: load the int32 index files (rank 1;
 * cu_seqlens [batch + 1], both the same length; seqused_k [batch]) and point
 * a->opt.varlen at them, named by their files (the library checks the values
 * and names the file and the index). Call before cli_attn_load_alibi. Returns
 * 0 or prints and returns 2.
 */
int cli_attn_load_varlen(cli_attn *a, const cli_qkv *in);

/* Load the KV cache's index files and k_new/v_new, point a->opt.kvcache at
 * them (named by their files). Returns 0 or prints and returns 2. */
int cli_attn_load_kvcache(cli_attn *a, const cli_qkv *in);

void cli_qkv_free(cli_qkv *in);

/*
 * If a->alibi_path is set: load it (f32 or f64, [heads] or [batch][heads],
 * finite) and point a->opt.alibi_slopes at it; the same for a->sinks_path
 * (--sinks: f32 or f64 [heads], finite) and a->opt.sinks, and the dropout
 * keep-mask (--dropout-mask, uint8 rank 4; the library checks its shape and
 * values) and a->opt.dropout. Returns 0 or prints and returns 2.
 */
int cli_attn_load_alibi(cli_attn *a, const cli_qkv *in);

/*
 * Fail early, before a long computation, if output `path` (given as option
 * `opt`) cannot be written: an empty name, a directory, a block device, a
 * file the caller may not write (permission bits, even as root), a missing
 * or unwritable directory (fa_outfile_check). Returns 0 or prints and returns 2.
 */
int cli_check_output(const char *opt, const char *path);

/* An option and the file it names (path NULL: not given). */
typedef struct cli_named {
    const char *opt;
    const char *path;
} cli_named;

/*
 * cli_check_output for every output, then refuse (exit 2, one line) two
 * outputs that are the same file, or an output that is one of the inputs,
 * under any spelling: compared by device and inode for existing files, and
 * by the directory's device and inode plus the name (symlinks resolved) for
 * new ones. Two outputs into one character device (/dev/null) are allowed.
 */
int cli_check_files(const char *cmd, const cli_named *outs, int nout, const cli_named *ins, int nin);

/* Install SIGINT/SIGTERM/SIGHUP/SIGPIPE handlers that remove live temporary
 * files (fa_outfile_cleanup_signal) and then die of the signal. */
void cli_cleanup_on_signals(void);

/*
 * libgomp ends the process with exit(1) when it cannot create threads, which
 * would read as "mismatch" for check. cli_guard_runtime_exit() (at a
 * subcommand's start) registers an atexit handler that turns any exit that
 * is not the subcommand's own return (cli_finish(rc)) into exit status 2 with
 * a line on stderr.
 */
void cli_guard_runtime_exit(void);
int cli_finish(int rc);

/* One output file for cli_save_outputs: a C-contiguous array. */
typedef struct cli_output {
    const char *path;        /* NULL entries are skipped (e.g. an optional --lse) */
    const void *data;
    fa_dtype dtype;
    int rank;
    const int64_t *shape;
} cli_output;

/*
 * Save several outputs as .npy, all or none: every output is first written
 * to its temporary (devices and FIFOs: written through), and only when all
 * succeeded are they renamed into place; if a rename fails, the outputs
 * already renamed are removed. Temporaries are removed on SIGINT/SIGTERM.
 * Returns 0, or prints one line and returns CLI_EXIT_USAGE.
 */
int cli_save_outputs(const cli_output *outs, int n);

/* Parse "f32", "f64", "f16", "bf16". Returns 0, or -1 after printing "OPT: ...". */
int cli_parse_dtype(const char *opt, const char *text, fa_dtype *dtype);

/* ------------------------------------------------------------------------ */
/* Small utilities                                                           */
/* ------------------------------------------------------------------------ */

/* Element x (flat, C order) of data of dtype t as a double (bf16 from its bit pattern). */
double cli_element(const void *data, fa_dtype t, int64_t x);

/* Count the NaN/Inf among n elements (-inf allowed if allow_neg_inf: an LSE's
 * empty rows) and, if any, print one warning line naming `path`; returns the count. */
/* After cli_load_inputs and the options: a varlen batch's packed Q/K/V and a KV cache were loaded
 * without the whole-file finiteness test (rows no sequence reads may hold anything), so the rows in
 * use are tested here (fa_check_inputs); one line and CLI_EXIT_USAGE when one is not finite. */
int cli_inputs_in_use_finite(const cli_qkv *in, const cli_attn *a);
/* Every element of the rows sequences own finite, in a varlen [total_q, heads, x] array (dO):
 * else one line naming the file, [row, head, col] and the sequence; returns CLI_EXIT_USAGE. */
int cli_varlen_rows_finite(const char *path, const fa_npy *arr, const fa_varlen *vl);
/* cli_opt_value for an option with two spellings (`--out` / `-o`) into one variable that starts
 * NULL: a second value under either spelling is refused. */
int cli_opt_value_alias(int argc, char **argv, int *i, const char *name, const char *alias, const char **value);
int64_t cli_warn_nonfinite(const char *path, const void *data, fa_dtype t, int64_t n, int allow_neg_inf);

/* "(0, 3, 1, 7)": the multi-index of flat element `flat` of arr into buf[size]; returns buf. */
const char *cli_multi_index(const fa_npy *arr, int64_t flat, char *buf, size_t size);

/* Monotonic clock in seconds. */
double cli_now(void);

/* "1.5 MiB", "48 KiB", "512 B" into buf[size]; returns buf. */
const char *cli_bytes(size_t bytes, char *buf, size_t size);

/* "[2, 128, 8, 64]" into buf[size]; returns buf. */
const char *cli_shape(int rank, const int64_t *shape, char *buf, size_t size);

#endif /* FA_CLI_H */
