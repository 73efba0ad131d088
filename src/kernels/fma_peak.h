/*
 * fma_peak.h — an FMA-throughput loop per ISA, to measure the ceiling that
 * benchmarks report their fraction of.
 *
 * Each loop runs `iters` rounds of 16 independent FMA chains on full vectors
 * (enough to cover latency x pipes on every CPU we target), writes a value
 * derived from the result to *sink (so the work cannot be elided) and
 * returns the number of float32 flops it performed (2 per lane per FMA).
 * Time it yourself; peak GFLOP/s = flops / seconds / 1e9.
 */
#ifndef FA_FMA_PEAK_H
#define FA_FMA_PEAK_H

/*
 * The same FMAs fed the way qk's register block feeds them: per round, the
 * block's vector loads of a Kt row and one broadcast load per row (AVX-512:
 * 2 + 8 loads for 16 FMAs; AVX2: 2 + 6 for 12), all from one L1-resident
 * line set, with no address arithmetic and no tails: the kernels' instruction
 * mix alone. A reference, not a bound (hand-written assembly of the same mix
 * runs a few percent faster): it shows how far below the FMA loop a load-fed
 * kernel of that shape sits on this core, on cores whose loads cost issue
 * slots or power (bench_kernels prints both). Returns 0 where there is none
 * (scalar, NEON).
 */
double fa_fma_fed_loop(const char *isa, long iters, float *sink);

/* By ISA name ("scalar", "avx2", "avx512", "neon"); returns 0 if that ISA is
 * not compiled in or not supported by this CPU, or iters < 0 (nothing is run then). */
double fa_fma_peak_loop(const char *isa, long iters, float *sink);

/* The per-ISA loops behind it (only those compiled in exist). */
double fa_fma_loop_scalar(long iters, float *sink);
#if defined(FA_HAVE_AVX2)
double fa_fma_loop_avx2(long iters, float *sink);
double fa_fma_fed_loop_avx2(long iters, float *sink);
#endif
#if defined(FA_HAVE_AVX512)
double fa_fma_loop_avx512(long iters, float *sink);
double fa_fma_fed_loop_avx512(long iters, float *sink);
#endif
#if defined(FA_HAVE_NEON)
double fa_fma_loop_neon(long iters, float *sink);
#endif

#endif /* FA_FMA_PEAK_H */
