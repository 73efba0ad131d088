/*
 * example.c — the smallest complete program on libflashattn.
 *
 * Fills Q, K, V with fresh random numbers, runs the fast path (FA_IMPL_FLASH,
 * float32 output) and the float64 reference (FA_IMPL_REFERENCE) on the same
 * causal GQA problem, and compares them. Exit status 0 if they agree, 1 if not,
 * 2 if the library reported an error.
 *
 * Build against an installed copy:
 *   cc -std=c11 example.c $(pkg-config --cflags --libs flashattn) -o example
 *   ./example            (add $(pkg-config --variable=libdir flashattn) to
 *                          LD_LIBRARY_PATH if that directory is not a system one)
 * or fully static (the .pc's Libs.private adds OpenMP and libm):
 *   cc -std=c11 -static example.c $(pkg-config --cflags --libs --static flashattn) -o example
 */
#include <flashattn.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* xorshift64*: a small, seedable generator; uniform in [-1, 1). */
static uint64_t rng_state;
static float uniform(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (float)((rng_state * 2685821657736338717ULL) >> 40) / (float)(1 << 23) - 1.0f;
}

static int fail(const char *what, fa_status st)
{
    fprintf(stderr, "example: %s: %s (%s)\n", what, fa_status_string(st), fa_last_error());
    return 2;
}

int main(void)
{
    /* B=2, seqlen_q=100, seqlen_k=150, 4 query heads sharing 2 kv heads, d=64. */
    enum { B = 2, SQ = 100, SK = 150, H = 4, HK = 2, D = 64 };
    const int64_t qs[4] = {B, SQ, H, D}, ks[4] = {B, SK, HK, D}, ls[3] = {B, H, SQ};
    size_t nq = (size_t)B * SQ * H * D, nk = (size_t)B * SK * HK * D, nl = (size_t)B * H * SQ;
    float *q = malloc(nq * sizeof *q);                 /* [B][SQ][H][D], C order */
    float *k = malloc(nk * sizeof *k);                 /* [B][SK][HK][D] */
    float *v = malloc(nk * sizeof *v);                 /* [B][SK][HK][D] (d_v = d here) */
    float *o = malloc(nq * sizeof *o);                 /* [B][SQ][H][D], flash */
    float *lse = malloc(nl * sizeof *lse);             /* [B][H][SQ], flash */
    double *o_ref = malloc(nq * sizeof *o_ref);        /* [B][SQ][H][D], reference */
    double *lse_ref = malloc(nl * sizeof *lse_ref);    /* [B][H][SQ], reference */
    if (!q || !k || !v || !o || !lse || !o_ref || !lse_ref) {
        fprintf(stderr, "example: out of memory\n");
        return 2;
    }

    uint64_t seed = (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    rng_state = seed | 1;
    for (size_t i = 0; i < nq; i++) q[i] = 2.0f * uniform();
    for (size_t i = 0; i < nk; i++) k[i] = 2.0f * uniform();
    for (size_t i = 0; i < nk; i++) v[i] = uniform();

    fa_tensor tq, tk, tv, to, tl, to_ref, tl_ref;
    fa_status st;
    if ((st = fa_tensor_make(&tq, q, FA_F32, 4, qs, NULL)) != FA_OK ||
        (st = fa_tensor_make(&tk, k, FA_F32, 4, ks, NULL)) != FA_OK ||
        (st = fa_tensor_make(&tv, v, FA_F32, 4, ks, NULL)) != FA_OK ||
        (st = fa_tensor_make(&to, o, FA_F32, 4, qs, NULL)) != FA_OK ||
        (st = fa_tensor_make(&tl, lse, FA_F32, 3, ls, NULL)) != FA_OK ||
        (st = fa_tensor_make(&to_ref, o_ref, FA_F64, 4, qs, NULL)) != FA_OK ||
        (st = fa_tensor_make(&tl_ref, lse_ref, FA_F64, 3, ls, NULL)) != FA_OK)
        return fail("fa_tensor_make", st);

    fa_options opt = fa_options_default();
    opt.causal = 1;
    opt.impl = FA_IMPL_FLASH;
    if ((st = fa_forward(&tq, &tk, &tv, &to, &tl, &opt)) != FA_OK) return fail("fa_forward (flash)", st);
    opt.impl = FA_IMPL_REFERENCE;
    if ((st = fa_forward(&tq, &tk, &tv, &to_ref, &tl_ref, &opt)) != FA_OK)
        return fail("fa_forward (reference)", st);

    /* float32 accumulation over at most 150 keys of |v| < 1: errors of a few
     * 1e-7; 1e-5 (absolute, on values of magnitude <= 1) leaves a wide margin
     * and still catches any wrong mask, scale or normalization (errors ~1e-2+). */
    const double tol = 1e-5;
    double err_o = 0, err_l = 0;
    size_t bad = 0; /* counted with !(e <= tol), so a NaN counts as bad */
    for (size_t i = 0; i < nq; i++) {
        double e = fabs((double)o[i] - o_ref[i]);
        if (e > err_o) err_o = e;
        if (!(e <= tol)) bad++;
    }
    for (size_t i = 0; i < nl; i++) {
        /* rows with no visible key would be -inf in both; causal with
         * seqlen_k >= seqlen_q leaves none here, so every LSE is finite */
        double e = fabs((double)lse[i] - lse_ref[i]);
        if (e > err_l) err_l = e;
        if (!(e <= tol)) bad++;
    }
    int ok = bad == 0;
    printf("libflashattn %s\n", fa_version());
    printf("flash vs reference (seed %llu): max |dO| = %.3g, max |dLSE| = %.3g, %zu beyond %g: %s\n",
           (unsigned long long)seed, err_o, err_l, bad, tol, ok ? "ok" : "MISMATCH");

    free(q); free(k); free(v); free(o); free(lse); free(o_ref); free(lse_ref);
    return ok ? 0 : 1;
}
