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

/* By ISA name ("scalar", "avx2", "avx512", "neon"); returns 0 if that ISA is
 * not compiled in or not supported by this CPU (nothing is run then). */
double fa_fma_peak_loop(const char *isa, long iters, float *sink);

/* The per-ISA loops behind it (only those compiled in exist). */
double fa_fma_loop_scalar(long iters, float *sink);
#if defined(FA_HAVE_AVX2)
double fa_fma_loop_avx2(long iters, float *sink);
#endif
#if defined(FA_HAVE_AVX512)
double fa_fma_loop_avx512(long iters, float *sink);
#endif
#if defined(FA_HAVE_NEON)
double fa_fma_loop_neon(long iters, float *sink);
#endif

#endif /* FA_FMA_PEAK_H */
