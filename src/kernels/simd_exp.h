/*
 * simd_exp.h — the one exp algorithm every SIMD kernel uses, as constants.
 *
 * No intrinsics here: each ISA file (avx2.c, avx512.c, neon.c) writes the
 * same steps in its own vocabulary, so the three agree to the last bit on
 * everything except where an ISA offers a native step (AVX-512's vscalefps).
 *
 * Teacher's note — exp(x) in float32, branch-free:
 *
 *   1. Range reduction.  n = round(x / ln2),  r = x - n*ln2,  |r| <= ln2/2.
 *      ln2 is split into FA_EXP_LN2_HI (= ln2 rounded to float) and
 *      FA_EXP_LN2_LO (the rest). With a fused multiply-add, x - n*LN2_HI is
 *      exact for |x| < 128 (the product is exact inside the FMA, the result
 *      is a multiple of 2^-24 below 0.35 in magnitude, so it fits in 24 bits);
 *      the second FMA folds in LN2_LO. r then carries ~2^-32 absolute error.
 *   2. Polynomial.  exp(r) ~= 1 + r + c2 r^2 + ... + c6 r^6, evaluated by
 *      Horner with FMAs. c2..c6 are a minimax fit of the *relative* error of
 *      exp on [-ln2/2, ln2/2] with c0 = c1 = 1 held exact (computed for this
 *      project by a Lawson-weighted least-squares iteration in double, then
 *      rounded to float). Approximation error alone: 3.1e-9 relative
 *      (0.05 ulp); what remains is float rounding in the Horner steps.
 *      (Degree 5 would save one FMA but costs 1.05e-7 = ~1.8 ulp by itself.)
 *   3. Reconstruction.  exp(x) = 2^n * exp(r): vscalefps on AVX-512, or the
 *      integer (n + 127) << 23 built as float bits on AVX2/NEON.
 *   4. Edges.  x <= FA_EXP_X_MIN, the float just below ln(FLT_MIN) (where
 *      expf returns a subnormal, or 0), gives exactly +0.0 — including
 *      x = -inf, which is how masked scores enter the softmax. No subnormals,
 *      never NaN for -inf. (FA_EXP_X_MIN rounds 3.1e-6 below ln(FLT_MIN), so
 *      the test is x <= X_MIN; the next float up already has expf >= FLT_MIN.)
 *      The comparison is "not less-or-equal, unordered true", so a NaN input
 *      propagates to a NaN output rather than being hidden as 0.
 *      Large x: the general vexp clamps x to FA_EXP_X_CLAMP (> ln(FLT_MAX))
 *      and lets the reconstruction overflow to +inf, as expf does. The
 *      softmax path skips that clamp: its arguments s - m_new are <= 0.
 *
 * Measured error, AVX-512 and AVX2 (identical results), over EVERY float in
 * [-88, 88] (2.24e9 of them): at most 1 ulp from glibc 2.36's expf, and at
 * most 0.891 ulp from the exact exp (at x = 5.2016387). NEON uses the same
 * steps and shows the same 1 ulp on the test's sweep under qemu.
 * tests/test_kernels.c checks FA_EXP_MAX_ULP = 2 (a margin over the measured
 * 1 for other libms) on every 32nd float plus every float near both edges.
 * The bound applies where expf(x) >= FLT_MIN, i.e. x > -87.33654; below,
 * the result is exactly 0 and the absolute error is below FLT_MIN =
 * 1.18e-38 — nothing next to a softmax denominator >= 1.
 */
#ifndef FA_SIMD_EXP_H
#define FA_SIMD_EXP_H

#define FA_EXP_LOG2E   1.44269502163f        /* 0x1.715476p+0  (1/ln2 rounded)   */
#define FA_EXP_LN2_HI  0.693147182464599609f /* 0x1.62e430p-1  (ln2 rounded)     */
#define FA_EXP_LN2_LO  -1.90465421212593e-09f/* -0x1.05c610p-29 (ln2 - LN2_HI)   */

/* exp(r) ~= 1 + r + C2 r^2 + C3 r^3 + C4 r^4 + C5 r^5 + C6 r^6, |r| <= ln2/2 */
#define FA_EXP_C2 0.4999999403953552f        /* 0x1.fffffcp-2  */
#define FA_EXP_C3 0.1666652113199234f        /* 0x1.555492p-3  */
#define FA_EXP_C4 0.04166838899254799f       /* 0x1.5558f2p-5  */
#define FA_EXP_C5 0.00836874544620514f       /* 0x1.123a20p-7  */
#define FA_EXP_C6 0.0013814539415761828f     /* 0x1.6a23cep-10 */

/* At or below this, expf(x) < FLT_MIN: the kernels return exactly 0. */
#define FA_EXP_X_MIN   -87.3365447505531f    /* ln(2^-126), rounds to -0x1.5d58a0p+6 */
/* Above ln(FLT_MAX) = 88.7228: clamp here so 2^n * p overflows to +inf cleanly. */
#define FA_EXP_X_CLAMP 88.8f

/* Stated bound, checked by tests/test_kernels.c (max |err| in ulps of expf). */
#define FA_EXP_MAX_ULP 2.0

#endif /* FA_SIMD_EXP_H */
