/*
 * config.h — configuration: the environment (read once, strictly), the
 * detected caches (cpuinfo.c, which reads the environment from here), and
 * the default thread count. The block-size rule that uses them is
 * problem.c's (fa_resolve_blocks).
 *
 * Environment variables (all optional; read once, on first use, and never
 * again — setenv after the first call has no effect):
 *   FA_BLOCK_Q, FA_BLOCK_K   integers 1..FA_BLOCK_MAX: pin the flash blocks
 *   FA_FLASH_SHARED_MAX      bytes, e.g. 0, 4096, 64K, 16M, 1G (binary units;
 *                            K/KiB, M/MiB, G/GiB): cap on the shared packing
 *   FA_L1D_BYTES, FA_L2_BYTES  bytes, same syntax: override the caches
 * A malformed value (e.g. "16MB", "-1", "12x") is refused: every call that
 * depends on it returns FA_ERR_OPTION naming the variable. FA_ISA is read by
 * kernels/dispatch.c until a kernel table has been chosen.
 */
#ifndef FA_CONFIG_H
#define FA_CONFIG_H

#include "flashattn.h"

#include <stddef.h>

/* Largest block a user may pin (options or environment). */
#define FA_BLOCK_MAX 1024

/* Largest block the L2 rule derives (problem.c, block_rule). Past 256 nothing is
 * left to amortize — a K/V tile is re-read Sq/256 times, a few bytes per thousand
 * FLOPs — while a bigger tile presses on L2: on a 2 MiB-L2 Xeon the rule's 416 at
 * d = 128 ran up to 6.5% slower than 256 at 2 threads (N = 4096; ~0 at N = 1024;
 * docs/performance.md, "A cap of 256"). */
#define FA_BLOCK_RULE_MAX 256
_Static_assert(FA_BLOCK_RULE_MAX % 16 == 0 && FA_BLOCK_RULE_MAX <= FA_BLOCK_MAX,
               "the rule's blocks are multiples of 16 a user could also pin");

/* Default cap of the K/V (forward) and Q/K (backward) panels packed once and
 * shared by all threads: 16 MiB holds N = 8192 at d = 128 or N = 16384 at d = 64. */
#define FA_PACK_DEFAULT_MAX_BYTES ((size_t)16 << 20)

/* Default backward block: the forward's rule gives blocks for S, Q_i, K_j, V_j
 * and O_i; the backward keeps about twice that hot per tile (S and dP, Q_i and
 * dO_i in two layouts, K_j, V_j and their gradients), so unless the blocks are
 * pinned (opt->block_q/k, FA_BLOCK_Q/K) it caps them at 128. */
#define FA_BWD_BLOCK_MAX 128

typedef struct fa_env {
    int block_q, block_k;  /* 0: not set */
    int has_pack_max;      /* FA_FLASH_SHARED_MAX was set */
    size_t pack_max;
    size_t l1d, l2;        /* 0: not set */
    int tile_cut;          /* FA_TILE_CUT: -1 not set (cut), 0 whole tiles, 1 cut (src/flash.c) */
    int bwd_one_pass;      /* FA_BWD_ONE_PASS: -1 not set (the task rule), 0 two passes, 1 one pass (src/backward.c) */
    int amx;               /* FA_AMX: -1 not set (off), 0 off, 1 the bf16 forward on AMX tiles where it applies (src/amx.c) */
    int decode_touch;      /* FA_DECODE_TOUCH: -1 not set (on for AMD CPUs), 0 off, 1 on (src/decode.c, addr_plan) */
    int strip_rows;        /* FA_STRIP_ROWS: -1 not set (from L1d), 0 whole tiles, N rows a strip (src/flash.c, strip_rows) */
    int task_chunk;        /* FA_TASK_CHUNK: 0 not set or heads interleaved, N pieces of one head a grab (src/flash.c) */
    int tail_split;        /* FA_TAIL_SPLIT: -1 not set; 0/1 off; N: a pass's last tasks cut in N (src/flash.c) */
} fa_env;

/* The environment, parsed once (thread-safe). NULL when a variable is
 * malformed; then the status is returned and fa_last_error() names it. */
const fa_env *fa_env_get(fa_status *status);

/* Parse "123", "64K", "16M", "1G", "2KiB"... into bytes (binary units).
 * Returns 0 on success, -1 when malformed or overflowing. */
int fa_parse_bytes(const char *s, size_t *bytes);

/* Detected caches (cpuinfo.c): computed once (thread-safe), FA_L1D_BYTES /
 * FA_L2_BYTES applied. */
void fa_detect_caches(size_t *l1d, size_t *l2, size_t *l3, size_t *line, int *source);

/* 1 when the CPU's vendor string (CPUID leaf 0) is AuthenticAMD, else 0 (any other
 * vendor, or not x86). The decoder's address order (src/decode.c, addr_plan) is on
 * by default where it was measured to pay. */
int fa_cpu_is_amd(void);

/* Number of OpenMP threads a parallel region gets by default (1 without OpenMP). */
int fa_default_threads(void);


#endif /* FA_CONFIG_H */
