/*
 * test_kernels_neon.c — the NEON kernels against the scalar spec, under qemu.
 *
 * The same checks as tests/test_kernels.c (tests/kernel_checks.h), in a
 * plain C runner: Debian has no CMocka for arm64 here, and this binary is
 * cross-compiled with aarch64-linux-gnu-gcc and run with qemu-aarch64
 * (`make test-neon`, mk/neon.mk). It links only the kernel files and
 * dispatch.c; the one library function dispatch.c needs, fa_fail, is a stub
 * below. Prints one line per check and "N passed, N failed"; exit 1 on any
 * failure. FA_TEST_SEED=<n> replays a run.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernel_checks.h"

/* dispatch.c reports errors through fa_fail (api.c); record nothing here. */
fa_status fa_fail(fa_status status, const char *fmt, ...)
{
    (void)fmt;
    return status;
}

static int passed, failed;

static void result(const char *name, int nfail, const char *msg)
{
    if (nfail) {
        failed++;
        printf("[  FAILED  ] %s: %d failing case(s); first: %s\n", name, nfail, msg);
    } else {
        passed++;
        printf("[       OK ] %s\n", name);
    }
}

int main(void)
{
    const char *env = getenv("FA_TEST_SEED");
    const uint64_t seed = env ? strtoull(env, NULL, 10) : (uint64_t)time(NULL);
    printf("[ seed     ] FA_TEST_SEED=%llu\n", (unsigned long long)seed);
    char msg[1024] = "";

    const fa_kernels *k = fa_kernels_by_name("neon");
    result("dispatch finds neon (HWCAP_ASIMD)", k == NULL, "fa_kernels_by_name(\"neon\") returned NULL");
    fa_status st;
    const fa_kernels *best = fa_kernels_get(&st);
    result("dispatch picks neon by default", !(best == &fa_kernels_neon && st == FA_OK), "another table was chosen");
    k = &fa_kernels_neon;
    const fa_kernels *ref = &fa_kernels_scalar;

    msg[0] = 0;
    result("qk matches scalar on all tails", kc_check_qk(k, ref, seed, msg, sizeof msg), msg);
    msg[0] = 0;
    result("softmax matches scalar when masked and extreme", kc_check_softmax(k, ref, seed ^ 1, msg, sizeof msg), msg);
    msg[0] = 0;
    result("pv matches scalar on all tails", kc_check_pv(k, ref, seed ^ 2, msg, sizeof msg), msg);
    {
        int checked;
        const int nf = kc_check_pv_t(k, seed ^ 0x70, &checked, msg, sizeof msg);
        result("pv_t gives pv's bits", checked ? nf : 1, checked ? msg : "no pv_t in the neon table");
    }
    msg[0] = 0;
    double worst;
    float wx;
    const int nf = kc_check_vexp(k, 256, &worst, &wx, msg, sizeof msg); /* every 256th float */
    printf("[  INFO    ] neon vexp: max error %.0f ulp vs expf (at x = %.9g); bound %.1f\n", worst, wx,
           FA_EXP_MAX_ULP);
    result("vexp within stated ulp bound", nf, msg);
    msg[0] = 0;
    result("transpose packs Kt exactly", kc_check_transpose(k, seed ^ 4, msg, sizeof msg), msg);
    msg[0] = 0;
    result("tile chain matches scalar", kc_check_chain(k, ref, seed ^ 3, msg, sizeof msg), msg);
    msg[0] = 0; /* NEON's own tanh, transform, widen and bwd_line, held to the scalar spec */
    const int nt = kc_check_tanh(k, 256, &worst, &wx, msg, sizeof msg);
    printf("[  INFO    ] neon tanh: max error %.0f ulp vs tanhf (at x = %.9g); bound %.1f\n", worst, wx,
           FA_TANH_MAX_ULP);
    result("tanh within stated ulp bound", nt, msg);
    msg[0] = 0;
    result("transform matches scalar", kc_check_transform(k, ref, seed ^ 5, msg, sizeof msg), msg);
    msg[0] = 0;
    result("widen matches scalar on every pattern", kc_check_widen(k, ref, msg, sizeof msg), msg);
    msg[0] = 0;
    result("bwd_line matches scalar", kc_check_bwd_line(k, ref, seed ^ 6, msg, sizeof msg), msg);
    msg[0] = 0;
    result("decode kernels match scalar", kc_check_dec(k, ref, seed ^ 7, msg, sizeof msg), msg);
    msg[0] = 0;
    result("a tile cut at cut_cols / cut_lead gives the whole tile's bits", kc_check_cut(k, seed ^ 8, msg, sizeof msg),
           msg);

    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
