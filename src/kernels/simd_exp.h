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

/*
 * The softmax's exp(s - m) in base 2 (AVX-512's softmax; the other tables call
 * the exp above on s - m). Per score it saves the range reduction's multiply
 * and its two Cody-Waite FMAs — on a core with one 512-bit FMA a cycle the exp
 * was 13 FMA-pipe ops per 16 scores against qk + pv's 128 at d = 64:
 *
 *   once per row:  mh = fl(log2e m), ml = fma(m, log2e, -mh)  (mh + ml = log2e m
 *                  exactly, so a logit of 1e4 loses nothing to the split)
 *   per score:     x2 = fl(fl(s log2e - mh) - ml)   (one FMA, one subtraction)
 *                  n = round(x2), r = x2 - n        (exact, |r| <= 1/2)
 *                  2^r ~= 1 + C1 r + ... + C6 r^6   (FA_EXP2_C*, Horner)
 *                  2^n 2^r by vscalefps; exactly +0 when x2 < FA_EXP2_X_MIN
 *                  (-126: below it 2^x2 < FLT_MIN), NaN stays NaN.
 *
 * Error (x = s - m, u = 2^-24): the FMA rounds log2e x + ml and the subtraction
 * rounds x2 (~1.45|x|; the FMA's operand can be larger when |x| is near ulp(m),
 * but then s and m are coarse and the sum is exact or nearly), and log2e itself
 * is 0.22u off, so P = 2^x2 is within ~2.3|x| u (relative) of exp(x) plus the
 * polynomial's 0.95 ulp; the natural path is within |x| u (the rounding of
 * s - m) plus its 1 ulp. `make exp2-ulp` (tools/exp2_ulp.c) runs the table's softmax
 * over every float of s - m in [-88, 0] for 9 values of m up to 1e30: at most 0.70
 * of the test's bound below (the scalar spec, every 64th float: 0.30). The |x| term is exp's conditioning, large only where P = e^x
 * is small: over a row it adds at most 2.3 u sum_j P_j |x_j| <= 2.3 u l ln(bc)
 * to l (the normalized sum is an entropy), well below the summation's own
 * rounding of up to bc u l. tests/kernel_checks.h checks every table's P
 * against exp(s - m) in double within (4 + 3|x|) u. Rows whose max is beyond
 * 2^100 (log2e m could overflow near 2^127) take the natural path.
 *
 * C1..C6: a minimax fit of 2^r's relative error on [-1/2, 1/2] (Lawson-weighted
 * least squares in double, computed for this project) rounded to float; Horner
 * in float with fmaf over every float of [-1/2, 1/2], against 2^r in double
 * (`make exp2-ulp`): at most 0.9516 ulp, at r = -0x1.fbe9f6p-2.
 */
#define FA_EXP2_C1 0x1.62e430p-1f
#define FA_EXP2_C2 0x1.ebfbdcp-3f
#define FA_EXP2_C3 0x1.c6aee8p-5f
#define FA_EXP2_C4 0x1.3b2d4ep-7f
#define FA_EXP2_C5 0x1.5f3e54p-10f
#define FA_EXP2_C6 0x1.41fbb2p-13f
#define FA_EXP2_X_MIN -126.0f

/* At or below this, expf(x) < FLT_MIN: the kernels return exactly 0. */
#define FA_EXP_X_MIN   -87.3365447505531f    /* ln(2^-126), rounds to -0x1.5d58a0p+6 */
/* Above ln(FLT_MAX) = 88.7228: clamp here so 2^n * p overflows to +inf cleanly. */
#define FA_EXP_X_CLAMP 88.8f

/* Stated bound, checked by tests/test_kernels.c (max |err| in ulps of expf). */
#define FA_EXP_MAX_ULP 2.0

/*
 * tanh, built from the exp above (the softcap c * tanh(s / c) of the score
 * transform, kernels.h's `transform`). Odd, so computed on |x| and given x's
 * sign back (AVX-512 evaluates the small-|x| polynomial on the signed
 * argument itself, which is the same bits, and takes only the sign bit from
 * it: avx512.c's cap_tanh_avx512, where the argument is the score u, c folded
 * in as below):
 *
 *   |x| <  FA_TANH_SMALL:  tanh(x) ~= x + x^3 (T0 + T1 z + T2 z^2 + T3 z^3 + T4 z^4),
 *                          z = x^2. 1 - 2/(e^2x + 1) would cancel here (it
 *                          loses every bit of tanh(x) ~ x below 2^-24). T0..T4
 *                          are a minimax fit of tanh's *relative* error on
 *                          [0, 0.625] (Lawson-weighted least squares in double,
 *                          computed for this project, rounded to float);
 *                          simulated in float: <= 0.77 ulp.
 *   otherwise:             tanh(|x|) = 1 - 2 / (exp(2|x|) + 1), with |x|
 *                          clamped to FA_TANH_X_ONE (tanhf is exactly 1 above
 *                          9.01), so exp's argument is at most 20 and never
 *                          overflows. tanh >= 0.55 here, so the subtraction
 *                          cancels nothing; exp (<= 1 ulp), the add and the
 *                          division (0.5 ulp each) leave a few ulp at most.
 *   NaN stays NaN (the clamp is min(C, x), which returns x when x is NaN, and
 *   NaN fails the small-|x| test); +-inf give +-1, -0 gives -0.
 *
 *   The division 2 / (e + 1): vdivps on AVX2; on AVX-512 vrcp14ps and one
 *   Newton step (a zmm vdivps costs more than the rest of tanh together).
 *   The SIMD transforms compute the softcap c tanh(u / c) with c folded into
 *   the small branch: c (x + x z P(z)) as u + (u z) P(z), x = u / c, one
 *   multiply fewer and u exact (c = 1 is the same tanh bit for bit).
 *   Softcapped arguments s / c are mostly below FA_TANH_SMALL (|s| < 18.75
 *   at c = 30), so a vector whose lanes are all small skips the exp path.
 *
 * Measured (`make tanh-ulp`, tools/tanh_ulp.c: EVERY float of |x| < 10, both
 * signs, 2.19e9 of them; above 10 the result is exactly +-1): AVX2 is within
 * 1 ulp of tanh computed in double and rounded (0.3% of floats not correctly
 * rounded), AVX-512 (reciprocal + Newton) within 2 ulp; both within 2 ulp of
 * glibc 2.36's tanhf, which is itself up to 2 ulp from the rounded tanh.
 * tests/test_kernels.c checks FA_TANH_MAX_ULP = 4 against tanhf (a margin
 * for other libms) on every 16th float plus every float near 0.625 and 9.
 */
#define FA_TANH_SMALL 0.625f
#define FA_TANH_X_ONE 10.0f
#define FA_TANH_T0 -0x1.555532p-2f /* -3.3333280683e-01 */
#define FA_TANH_T1  0x1.110726p-3f /*  1.3331441581e-01 */
#define FA_TANH_T2 -0x1.b83c5ap-5f /* -5.3739715368e-02 */
#define FA_TANH_T3  0x1.52269ep-6f /*  2.0639089867e-02 */
#define FA_TANH_T4 -0x1.75e1d4p-8f /* -5.7049887255e-03 */

/* Stated bound, checked by tests/test_kernels.c (max |err| in ulps of tanhf). */
#define FA_TANH_MAX_ULP 4.0

#endif /* FA_SIMD_EXP_H */
