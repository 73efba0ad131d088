/*
 * test_kernels.c — every SIMD micro-kernel table against the scalar spec.
 *
 * One CMocka group per x86 ISA compiled in (avx2, avx512); each runs the
 * checks of tests/kernel_checks.h (shared with the NEON runner under qemu):
 * qk, softmax and pv on random tiles whose br, bc, d, dv run through
 * 1, 7, 15, 16, 17, 33, 64, 100, 128, 256 (every tail of 8 and 16 lanes),
 * with -inf masks (partial, whole rows, a first tile all masked followed by
 * finite ones), very negative and large scores, unpadded Q/V/O rows ending
 * at a guard page, and sentinels in S/O padding; then the exp error bound
 * over a dense sweep of [-88, 88]; then qk -> softmax -> pv chains of tiles;
 * and the f16/bf16 widening (every 16-bit pattern, exact).
 * Tolerances and their derivation: see kernel_checks.h.
 *
 * An ISA this CPU lacks is skipped (CMocka's skip(), with a message naming
 * it), never silently passed. The seed comes from tu_seed() (FA_TEST_SEED
 * replays a run).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include <math.h>

#include "kernel_checks.h"
#include "kernels/fma_peak.h"
#include "tensor.h"
#include "test_util.h"

static char msg[1024];

/* The table under test, or skip() if this CPU or build lacks the ISA. */
static const fa_kernels *isa_or_skip(void **state)
{
    const char *isa = (const char *)*state;
    const fa_kernels *k = fa_kernels_by_name(isa);
    if (!k) {
        int built = 0;
#if defined(FA_HAVE_AVX2)
        built |= strcmp(isa, "avx2") == 0;
#endif
#if defined(FA_HAVE_AVX512)
        built |= strcmp(isa, "avx512") == 0;
#endif
        print_message("[  SKIP    ] %s: %s; its kernels were NOT tested here\n", isa,
                      built ? "this CPU lacks it" : "not compiled into this build");
        skip();
    }
    return k;
}

static void report(int nfail)
{
    if (nfail) fail_msg("%d failing case(s); first: %s", nfail, msg);
}

/* Ensure qk matches the scalar kernel for every row, column and depth tail. */
static void test_qk_matches_scalar_on_all_tails(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_qk(k, &fa_kernels_scalar, tu_seed(), msg, sizeof msg));
}

/* Ensure the online-softmax update matches the scalar one under -inf masks and extreme scores. */
static void test_softmax_matches_scalar_when_masked_and_extreme(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_softmax(k, &fa_kernels_scalar, tu_seed() ^ 1, msg, sizeof msg));
}

/* Ensure pv matches the scalar kernel and touches nothing beyond dv. */
static void test_pv_matches_scalar_on_all_tails(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_pv(k, &fa_kernels_scalar, tu_seed() ^ 2, msg, sizeof msg));
}

/* Ensure pv_t (P read transposed) gives pv's bits on the same tile and reads nothing past its rows. */
static void test_pv_t_gives_pv_bits(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    int checked;
    msg[0] = 0;
    const int nf = kc_check_pv_t(k, tu_seed() ^ 0x70, &checked, msg, sizeof msg);
    if (!checked) fail_msg("%s has no pv_t (every table here has one)", k->name);
    report(nf);
}

/* Ensure vexp stays within FA_EXP_MAX_ULP of expf over [-88, 88] and handles -inf, inf, NaN. */
static void test_vexp_within_stated_ulp_bound(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    double worst;
    float wx;
    msg[0] = 0;
    /* every 32nd float of [-88, 88]: ~6.6e7 points */
    const int nf = kc_check_vexp(k, 32, &worst, &wx, msg, sizeof msg);
    print_message("[  INFO    ] %s vexp: max error %.0f ulp vs expf (at x = %.9g); bound %.1f\n", k->name,
                  worst, wx, FA_EXP_MAX_ULP);
    report(nf);
}

/* Ensure the SIMD tanh stays within FA_TANH_MAX_ULP of tanhf over |x| < 10 and on special values. */
static void test_tanh_within_stated_ulp_bound(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    double worst;
    float wx;
    msg[0] = 0;
    const int nf = kc_check_tanh(k, 16, &worst, &wx, msg, sizeof msg); /* every 16th float: ~1.4e8 */
    print_message("[  INFO    ] %s tanh: max error %.0f ulp vs tanhf (at x = %.9g); bound %.1f\n", k->name, worst,
                  wx, FA_TANH_MAX_ULP);
    report(nf);
}

/* Ensure the line transform (softcap, ALiBi, mask, softcap derivative) matches the scalar spec. */
static void test_transform_matches_scalar(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_transform(k, &fa_kernels_scalar, tu_seed() ^ 5, msg, sizeof msg));
}

/* Ensure the backward's line (P = exp(s - LSE), dS, softcap derivative) matches the scalar spec. */
static void test_bwd_line_matches_scalar(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_bwd_line(k, &fa_kernels_scalar, tu_seed() ^ 6, msg, sizeof msg));
}

/* Ensure float16 and bfloat16 widen to the scalar spec's float32 bits for every pattern and length. */
static void test_widen_matches_scalar_on_every_pattern(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_widen(k, &fa_kernels_scalar, msg, sizeof msg));
}

/* Ensure the table's K transpose (when it has one) packs Kt exactly and stays in bounds. */
static void test_transpose_packs_kt_exactly(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    if (!k->transpose) {
        print_message("[  INFO    ] %s has no transpose (the driver's portable loop is used)\n", k->name);
        return;
    }
    msg[0] = 0;
    report(kc_check_transpose(k, tu_seed() ^ 4, msg, sizeof msg));
}

/* Ensure the table's widen (when it has one) turns every f16 and bf16 value into its exact
 * float32 (NaN stays NaN) for every length 1..40 and writes nothing past n. */
static void test_widen_is_exact(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    if (!k->widen) {
        print_message("[  INFO    ] %s has no widen (the portable conversion is used)\n", k->name);
        return;
    }
    static uint16_t src[65536 + 64];
    static float dst[65536 + 64];
    for (int bf = 0; bf <= 1; bf++) {
        for (uint32_t x = 0; x < 65536; x++) src[x] = (uint16_t)x;
        /* every pattern, in runs of 1..40 values (every tail of 8 and 16 lanes) */
        for (uint32_t at = 0, len = 1; at < 65536; at += len, len = len % 40 + 1) {
            const int n = (int)(at + len <= 65536 ? len : 65536 - at);
            dst[at + (uint32_t)n] = 12345.0f; /* sentinel just past the run */
            k->widen(n, src + at, bf, dst + at);
            if (dst[at + (uint32_t)n] != 12345.0f) fail_msg("%s widen(n = %d) wrote past n", k->name, n);
        }
        for (uint32_t x = 0; x < 65536; x++) {
            const float want = bf ? fa_bf16_to_f32((uint16_t)x) : fa_f16_to_f32((uint16_t)x);
            if (isnan(want) ? !isnan(dst[x]) : memcmp(&want, &dst[x], 4) != 0)
                fail_msg("%s widen(%s 0x%04x) = %a, want %a", k->name, bf ? "bf16" : "f16", (unsigned)x,
                         (double)dst[x], (double)want);
        }
    }
}

/* Ensure a chain of tiles (qk, mask, softmax, pv) gives the scalar chain's output. */
static void test_tile_chain_matches_scalar(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_chain(k, &fa_kernels_scalar, tu_seed() ^ 3, msg, sizeof msg));
}

/* Ensure a masked tile cut to cut_cols columns gives the whole tile's bits (l, O; m by value). */
static void test_cut_tile_keeps_bits(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_cut(k, tu_seed() ^ 5, msg, sizeof msg));
}

/* Ensure the decode kernels (K/V rows read in place, f32/f16/bf16) match the scalar spec and keep their bit promises. */
static void test_decode_kernels_match_scalar(void **state)
{
    const fa_kernels *k = isa_or_skip(state);
    msg[0] = 0;
    report(kc_check_dec(k, &fa_kernels_scalar, tu_seed() ^ 7, msg, sizeof msg));
}

/* Ensure the scalar table reports itself and forcing an unknown ISA by name finds nothing. */
static void test_by_name_knows_scalar_and_rejects_unknown(void **state)
{
    (void)state;
    const fa_kernels *s = fa_kernels_by_name("scalar");
    assert_non_null(s);
    assert_string_equal(s->name, "scalar");
    assert_null(fa_kernels_by_name("sse9"));
    assert_null(fa_kernels_by_name(""));
    const char *isas[] = {"avx2", "avx512", "neon"};
    for (int i = 0; i < 3; i++) {
        const fa_kernels *k = fa_kernels_by_name(isas[i]);
        if (k) {
            assert_string_equal(k->name, isas[i]);
            assert_true(k->row_block >= 1 && k->simd_width >= 4);
        }
    }
}

/*
 * The benchmark loops (fma_peak.h) report the flops they performed. The fed loop's
 * accumulators after `iters` rounds are known in closed form: lane x of acc[r][v] is
 * (r + v) + iters * q_r * k[v*lanes + x], with q_r = 1e-3 (r + 1) and k[i] = 1 - 1e-3 (i + 1),
 * and the sink is the sum over r, v and x weighted by (r + 1)(v + 1). A skipped round moves
 * it by ~3e-4 of itself, a row fed another row's q or a vector fed the other K load by more:
 * all well past the tolerance. (Whether the loads are repeated every round no value can
 * show; the machine code does — docs/performance.md.)
 */
static void test_fma_loops_count_their_flops(void **state)
{
    (void)state;
    const struct { const char *isa; double peak_per_round, fed_per_round; int rows, cols; } t[] = {
        {"scalar", 16 * 2, 0, 0, 0},
        {"avx2", 12 * 8 * 2, 6 * 2 * 8 * 2, 6, 2},
        {"avx512", 16 * 16 * 2, 8 * 2 * 16 * 2, 8, 2},
        {"neon", 0, 0, 0, 0},
    };
    const long iters = 1000;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        float sink = NAN;
        const fa_kernels *k = fa_kernels_by_name(t[i].isa);
        const double peak = fa_fma_peak_loop(t[i].isa, iters, &sink);
        if (!k) {
            assert_true(peak == 0.0);
            assert_true(fa_fma_fed_loop(t[i].isa, iters, &sink) == 0.0);
            continue;
        }
        if (t[i].peak_per_round > 0) assert_true(peak == t[i].peak_per_round * (double)iters);
        assert_true(isfinite(sink));
        sink = NAN;
        const double fed = fa_fma_fed_loop(t[i].isa, iters, &sink);
        assert_true(fed == t[i].fed_per_round * (double)iters);
        if (fed == 0.0) continue;
        const int lanes = k->simd_width;
        double want = 0.0;
        for (int r = 0; r < t[i].rows; r++)
            for (int v = 0; v < t[i].cols; v++)
                for (int x = 0; x < lanes; x++) {
                    const double q = (double)(1e-3f * (float)(r + 1));
                    const double kk = (double)(1.0f - 1e-3f * (float)(v * lanes + x + 1));
                    want += (double)((r + 1) * (v + 1)) * ((double)(r + v) + (double)iters * q * kk);
                }
        if (fabs((double)sink - want) > 5e-5 * want)
            print_message("%s: sink %.9g want %.9g\n", t[i].isa, (double)sink, want);
        assert_true(fabs((double)sink - want) <= 5e-5 * want);
    }
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) { /* a negative count runs nothing */
        float sink = 1.0f;
        assert_true(fa_fma_peak_loop(t[i].isa, -5, &sink) == 0.0);
        assert_true(fa_fma_fed_loop(t[i].isa, -5, &sink) == 0.0);
        assert_true(sink == 1.0f);
    }
    assert_true(fa_fma_fed_loop("sse9", iters, NULL) == 0.0);
    assert_true(fa_fma_fed_loop(NULL, iters, NULL) == 0.0);
}

#define ISA_TESTS(isa)                                                                         \
    cmocka_unit_test_prestate(test_qk_matches_scalar_on_all_tails, (void *)isa),                \
    cmocka_unit_test_prestate(test_softmax_matches_scalar_when_masked_and_extreme, (void *)isa), \
    cmocka_unit_test_prestate(test_pv_matches_scalar_on_all_tails, (void *)isa),                \
    cmocka_unit_test_prestate(test_pv_t_gives_pv_bits, (void *)isa),                            \
    cmocka_unit_test_prestate(test_vexp_within_stated_ulp_bound, (void *)isa),                  \
    cmocka_unit_test_prestate(test_tanh_within_stated_ulp_bound, (void *)isa),                  \
    cmocka_unit_test_prestate(test_transform_matches_scalar, (void *)isa),                      \
    cmocka_unit_test_prestate(test_widen_matches_scalar_on_every_pattern, (void *)isa),         \
    cmocka_unit_test_prestate(test_bwd_line_matches_scalar, (void *)isa),                       \
    cmocka_unit_test_prestate(test_transpose_packs_kt_exactly, (void *)isa),                    \
    cmocka_unit_test_prestate(test_widen_is_exact, (void *)isa),                                \
    cmocka_unit_test_prestate(test_tile_chain_matches_scalar, (void *)isa),                     \
    cmocka_unit_test_prestate(test_decode_kernels_match_scalar, (void *)isa),                  \
    cmocka_unit_test_prestate(test_cut_tile_keeps_bits, (void *)isa)

int main(void)
{
    const struct CMUnitTest common[] = {
        cmocka_unit_test(test_by_name_knows_scalar_and_rejects_unknown),
        cmocka_unit_test(test_fma_loops_count_their_flops),
        cmocka_unit_test_prestate(test_decode_kernels_match_scalar, (void *)"scalar"), /* the spec's own promises */
        cmocka_unit_test_prestate(test_pv_t_gives_pv_bits, (void *)"scalar"),
        cmocka_unit_test_prestate(test_cut_tile_keeps_bits, (void *)"scalar"),
    };
    const struct CMUnitTest avx2[] = {ISA_TESTS("avx2")};
    const struct CMUnitTest avx512[] = {ISA_TESTS("avx512")};
    int failed = cmocka_run_group_tests_name("kernels_dispatch", common, NULL, NULL);
    failed += cmocka_run_group_tests_name("kernels_avx2", avx2, NULL, NULL);
    failed += cmocka_run_group_tests_name("kernels_avx512", avx512, NULL, NULL);
    return failed ? 1 : 0;
}
