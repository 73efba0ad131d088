/*
 * cmd_info.c — `flashattn info`: what the flash path will do on this machine.
 *
 * Prints the kernel ISA the dispatcher chose, the cache sizes and where they
 * came from, the thread count, and the block sizes for d = 64 and d = 128 with
 * the arithmetic of the rule (include/flashattn.h, fa_block_sizes): the L2 is
 * the fast tier ("SRAM") of size M floats, a K/V block of Bc keys of dim d
 * should take about a quarter of it (Bc = M / 4d), and a Q block has
 * Br = min(Bc, d) rows; the CPU rule (square blocks filling up to 3/4 of L2, see
 * fa_block_sizes) is printed beside it. The numbers shown as "used" come from the library
 * itself, so this page cannot drift from what actually runs.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>
#include <stdlib.h>

static const char info_usage[] =
    "usage: flashattn info\n"
    "\n"
    "Print the kernel ISA, cache sizes (and where they came from), the OpenMP thread count, and\n"
    "the flash block sizes for d = 64 and d = 128 with the rule that derives them.\n"
    "\n"
    "Environment: FA_ISA=scalar|avx2|avx512|neon forces a kernel; FA_L1D_BYTES / FA_L2_BYTES\n"
    "override the detected caches; FA_BLOCK_Q / FA_BLOCK_K replace the L2 rule's blocks;\n"
    "FA_STRIP_ROWS pins the rows per strip of a whole tile (0: whole tiles);\n"
    "OMP_NUM_THREADS sets the default thread count.\n";

static const char *cache_source_name(int source)
{
    switch (source) {
    case 1: return "sysconf/sysfs";
    case 2: return "CPUID";
    case 3: return "FA_L1D_BYTES/FA_L2_BYTES environment";
    default: return "built-in defaults: detection failed";
    }
}

/* One block-size line: the rule's arithmetic, then what the library uses. */
static int print_blocks(const fa_cpu_info *info, int64_t d)
{
    int br, bc;
    fa_status st = fa_block_sizes(d, d, NULL, &br, &bc);
    if (st != FA_OK) return cli_die_status(st);
    char l2[32], l1[32], sbytes[32];
    long long m = (long long)(info->l2_bytes / sizeof(float));
    long long paper_bc = m / (4 * d);
    long long paper_br = paper_bc < d ? paper_bc : d;
    long long ws = (long long)br * d + (long long)d * bc + (long long)bc * d + (long long)br * bc +
                   (long long)br * d;
    printf("  d = %-4lld L2 = %s -> M = %lld floats; paper's rule: Bc = M/(4d) = %lld, Br = min(Bc, d) = %lld\n",
           (long long)d, cli_bytes(info->l2_bytes, l2, sizeof l2), m, paper_bc, paper_br);
    printf("           CPU rule: largest B (multiple of 16, at most 256) with B^2 + 2B(d + d_v) <= 3M/4 = %lld\n",
           m / 4 * 3);
    const char *eq = getenv("FA_BLOCK_Q"), *ek = getenv("FA_BLOCK_K"); /* empty = unset (config.c) */
    char share[32] = "more than M";
    if (m > 0) snprintf(share, sizeof share, "%.0f%% of M", 100.0 * (double)ws / (double)m);
    printf("           used: Br = %d, Bc = %d -> Q_i + K_j^T + V_j + S + O_i = %lld floats (%s)%s\n", br, bc, ws,
           share, (eq && *eq) || (ek && *ek) ? "; FA_BLOCK_Q/FA_BLOCK_K set" : "");
    int strip;
    if ((st = fa_strip_rows(d, d, NULL, &strip)) != FA_OK) return cli_die_status(st);
    const char *es = getenv("FA_STRIP_ROWS");
    if (strip < br)
        printf("           strips: a whole tile's qk and softmax run in %d-row strips (%d x %d scores, %s; L1d %s),\n"
               "                   P V once over the tile%s\n", strip, strip, bc,
               cli_bytes((size_t)strip * (size_t)bc * sizeof(float), sbytes, sizeof sbytes),
               cli_bytes(info->l1d_bytes, l1, sizeof l1), es && *es ? "; FA_STRIP_ROWS set" : "");
    else
        printf("           strips: none (whole tiles)%s\n", es && *es ? "; FA_STRIP_ROWS set" : "");
    return 0;
}

int cmd_info(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            fputs(info_usage, stdout);
            return CLI_EXIT_OK;
        }
        return cli_unknown_option("info", argv[i]);
    }
    fa_cpu_info info;
    fa_status st = fa_get_cpu_info(&info);
    if (st != FA_OK) return cli_die_status(st);
    char b1[32], b2[32], b3[32];
    printf("flashattn %s\n", FA_VERSION);
    printf("ISA      : %s (%d float32 lanes; chosen at run time, FA_ISA forces one)\n", info.isa,
           info.simd_width);
    printf("threads  : %d (OpenMP default; the commands' --threads or OMP_NUM_THREADS changes it)\n", info.max_threads);
    printf("caches   : L1d %s, L2 %s, L3 %s, line %zu B (from %s)\n",
           cli_bytes(info.l1d_bytes, b1, sizeof b1), cli_bytes(info.l2_bytes, b2, sizeof b2),
           info.l3_bytes ? cli_bytes(info.l3_bytes, b3, sizeof b3) : "unknown", info.line_bytes,
           cache_source_name(info.cache_source));
    printf("blocks   : flash keeps a Br x d block of Q and a Bc x d block of K and V in the L2 (\"SRAM\")\n");
    if (print_blocks(&info, 64) || print_blocks(&info, 128)) return CLI_EXIT_USAGE;
    printf("supported: ");
    static const char *const isas[] = {"scalar", "avx2", "avx512", "neon"};
    for (int i = 0; i < 4; i++)
        if (fa_isa_supported(isas[i])) printf("%s ", isas[i]);
    printf("(FA_ISA=<name> runs any of them)\n");
    if (fa_amx_available() && strcmp(info.isa, "avx512") != 0)
        printf("amx      : on this CPU, but off with the %s kernel table (FA_ISA): the AMX path runs beside\n"
               "           the AVX-512 table only\n", info.isa);
    else if (fa_amx_available())
        printf("amx      : available; FA_AMX=1 runs bf16 inputs' products on AMX tiles (float32-class, not\n"
               "           the float32 path's bits; docs/performance.md, \"AMX tiles for bf16 inputs\")\n");
    else
        printf("amx      : not available here: %s\n", fa_amx_why_not());
    /* the L2 size is the block rule's one machine input: pinning it (with the ISA) reproduces
     * every d's blocks, and every pass derives its own from those */
    printf("bits     : identical for any thread count, for a given (ISA, Br, Bc); the blocks follow the\n"
           "           detected L2, so another machine may differ. To reproduce these bits elsewhere (any d;\n"
           "           forward, backward and decoding):\n"
           "           FA_ISA=%s FA_L2_BYTES=%zu\n", info.isa, info.l2_bytes);
    return CLI_EXIT_OK;
}
