/*
 * amx.c — whether the AMX path may run (src/kernels/amx.c holds it): the CPU and
 * kernel probe, the problems it takes, and the memory it needs. Built without ISA
 * flags, as everything outside src/kernels/, because it runs on every CPU.
 */
#include "amx.h"

#include "internal.h"
#include "kernels/kernels.h"

#include <stdatomic.h>
#include <string.h>

#if defined(FA_HAVE_AMX)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

_Atomic long fa_amx_runs;

#if defined(FA_HAVE_AMX)
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

/* Why AMX cannot run here (NULL: it can). CPUID: AMX-TILE, AMX-BF16, AVX512-BF16 and
 * the OS's XSAVE state for tiles; then the Linux permission to use them (arch_prctl,
 * kernel 5.16+), asked once per process — a process-wide setting that also enlarges
 * its signal frames. */
static const char *amx_probe(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return "the OS has not enabled XSAVE (OSXSAVE)";
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw"))
        return "this CPU has no AVX-512 (F and BW)";
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 22)) || !(d & (1u << 24)))
        return "this CPU lacks AMX-BF16 or AMX-TILE";
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return "this CPU has no AVX512-BF16";
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    (void)hi;
    if ((lo & (3u << 17)) != (3u << 17)) return "the OS has not enabled the tile state (XCR0 bits 17-18)";
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0)
        return "Linux refused the tile-data permission (arch_prctl; needs kernel 5.16+)";
    return NULL;
}
#else
static const char *amx_probe(void)
{
#if defined(__x86_64__)
    return "this build has no AMX code (built with HAVE_AMX=0, or by a compiler without -mamx-tile: GCC 11+ or "
           "clang 12+)";
#else
    return "not an x86-64 build";
#endif
}
#endif

/* The probe's answer, computed once: NULL (usable) or why not. */
static const char *amx_state(void)
{
    static const char unknown[] = "unknown", yes[] = "";
    static _Atomic(const char *) state = unknown;
    const char *s = atomic_load_explicit(&state, memory_order_acquire);
    if (s == unknown) {
        const char *why = amx_probe();
        s = why ? why : yes;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s == yes ? NULL : s;
}

int fa_amx_usable(void) { return amx_state() == NULL; }

FA_API const char *fa_amx_why_not(void) { return amx_state(); }

FA_API long fa_amx_calls(void) { return atomic_load_explicit(&fa_amx_runs, memory_order_relaxed); }

FA_API int fa_amx_available(void) { return fa_amx_usable(); }

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

size_t fa_amx_packed_bytes(const fa_problem *p, size_t *ldkt, size_t *ldvv, size_t *npad)
{
    *npad = round_up((size_t)p->seqlen_k, AMX_BC);
    *ldkt = (size_t)p->d / 2 * AMX_BC; /* u32 per key block: [d/2 pair-rows][AMX_BC keys] */
    *ldvv = (size_t)p->dv + 16;        /* u32 per key-pair row */
    return fa_add_sat(fa_mul_sat(fa_mul_sat(*npad / AMX_BC, *ldkt), 4),
                      fa_mul_sat(fa_mul_sat(*npad / 2, *ldvv), 4));
}

size_t fa_amx_scratch_bytes(const fa_problem *p, size_t *ldq, size_t *ldo)
{
    *ldq = round_up((size_t)p->d, 32) + 32; /* bf16 elements (+64 bytes: rows not 4 KiB apart) */
    *ldo = (size_t)p->dv + 16;
    return AMX_TR * *ldq * 2 + AMX_BR * AMX_BC * 4 + 3 * AMX_BR * AMX_BC * 2 + AMX_TR * *ldo * 4 + 3 * AMX_TR * 4 +
           2 * AMX_TR * 8 + fa_amx_rows_bytes(p) + 12 * 64; /* the pieces of kernels/amx.c's scratch_alloc */
}

int64_t fa_amx_pass_pairs(const fa_problem *p)
{
    const int64_t pairs = p->batch * p->heads_k;
    const int64_t tasks = p->heads / p->heads_k * ((p->seqlen_q + AMX_TR - 1) / AMX_TR); /* per pair */
    size_t a, b, c;
    const size_t one = fa_amx_packed_bytes(p, &a, &b, &c);
    int64_t n = (2 * (int64_t)p->num_threads + tasks - 1) / (tasks > 0 ? tasks : 1); /* 2 tasks per thread */
    const int64_t fit = one > 0 ? (int64_t)(p->pack_max_bytes / one) : pairs;
    if (n > fit) n = fit;
    if (n > pairs) n = pairs;
    if (n < 1) return 1;
    const int64_t passes = (pairs + n - 1) / n;
    return (pairs + passes - 1) / passes; /* even passes: 3 + 3 + 2, not 4 + 4 + ... */
}

int fa_amx_threads(const fa_problem *p)
{
    return fa_threads_for(p, fa_amx_pass_pairs(p) * (p->heads / p->heads_k) * ((p->seqlen_q + AMX_TR - 1) / AMX_TR));
}

/* The rows of a source, all bf16 with unit element stride (the tail, new keys, too). */
static int rows_ok(const fa_tensor *t) { return !t->data || (t->dtype == FA_BF16 && t->stride[3] == 1); }

int fa_amx_applies(const fa_problem *p)
{
    if (!p->amx) return 0;
    /* the AVX-512 table: the path's own vector code is AVX-512, so FA_ISA=avx2 or scalar keeps it off */
    if (!p->kern || strcmp(p->kern->name, "avx512") != 0) return 0;
    if (p->q.dtype != FA_BF16 || p->q.stride[3] != 1) return 0;
    if (!rows_ok(&p->k) || !rows_ok(&p->v) || !rows_ok(&p->k_new) || !rows_ok(&p->v_new)) return 0;
    if (p->k.dtype != FA_BF16 || p->v.dtype != FA_BF16) return 0;
    if (p->d % 32 || p->dv % 32 || p->d > 1024 || p->dv > 1024) return 0;
    if (p->keep || p->rot_dim) return 0;
    size_t a, b, c;
    const size_t bytes = fa_amx_packed_bytes(p, &a, &b, &c);
    if (p->pack_max_bytes == 0 || bytes > p->pack_max_bytes) return 0; /* one kv head's K and V over the cap */
    return fa_amx_usable();
}

size_t fa_amx_workspace(const fa_problem *p)
{
    size_t a, b, c;
    return fa_add_sat(fa_mul_sat(fa_amx_packed_bytes(p, &a, &b, &c), (size_t)fa_amx_pass_pairs(p)),
                      fa_mul_sat((size_t)fa_amx_threads(p), fa_amx_scratch_bytes(p, &a, &b)));
}

#if !defined(FA_HAVE_AMX)
int fa_amx_forward(const fa_problem *p)
{
    (void)p;
    return 0;
}
#endif
