/*
 * version.c — fa_version(): the library version, the kernel ISAs this build
 * compiled in, and the one the CPU runs.
 *
 * The string is built once, on the first call, into a static buffer: later
 * calls (from any thread) return the same pointer. The kernel choice is itself
 * made once per process (kernels/dispatch.c), so the string never goes stale.
 */
#include "flashattn.h"

#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>

#include "kernels/kernels.h"

static const char compiled_isas[] = "scalar"
#if defined(FA_HAVE_AVX2)
                                    " avx2"
#endif
#if defined(FA_HAVE_AVX512)
                                    " avx512"
#endif
#if defined(FA_HAVE_NEON)
                                    " neon"
#endif
    ;

const char *fa_version(void)
{
    static char text[512];
    static atomic_int state; /* 0 not built, 1 being built, 2 ready */
    if (atomic_load_explicit(&state, memory_order_acquire) == 2) return text;
    int expected = 0;
    if (atomic_compare_exchange_strong_explicit(&state, &expected, 1, memory_order_acq_rel,
                                                memory_order_acquire)) {
        fa_status st;
        const fa_kernels *k = fa_kernels_get(&st);
        if (k)
            snprintf(text, sizeof text, "%s (ISA: %s compiled; %s in use)", FA_VERSION, compiled_isas,
                     k->name);
        else /* FA_ISA names an ISA this build or CPU lacks: say so */
            snprintf(text, sizeof text, "%s (ISA: %s compiled; none usable: %s)", FA_VERSION,
                     compiled_isas, fa_last_error());
        atomic_store_explicit(&state, 2, memory_order_release);
        return text;
    }
    while (atomic_load_explicit(&state, memory_order_acquire) != 2) sched_yield();
    return text;
}
