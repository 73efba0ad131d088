/*
 * avx512_transpose.c — the K-tile transpose of the flash driver, AVX-512.
 *
 * Packing K_j as K_j^T ([d][ldkt]) lets qk broadcast one q element and FMA a
 * whole vector of 16 keys. The transpose runs once per key block of each
 * (batch, kv head) in flash.c's shared packing, or once per tile of each task
 * when K/V are packed per tile (long sequences), so it must be cheap: 16x16
 * blocks go through registers in four shuffle stages (unpack ps, unpack pd,
 * two 128-bit lane shuffles), and every store writes a full 64-byte line.
 * Missing keys (bc % 16) load as zeros, which is exactly the zero padding the
 * packed layout promises; missing columns (d % 16) use masked loads and are
 * simply not stored.
 *
 * Rows of a [batch, seqlen, heads, d] tensor are heads x d floats apart (a
 * page or more), where hardware prefetchers stop following them, so each
 * 16-row step asks for the next 16 rows, whole, into L2 (prefetcht1).
 * Measured on an AMD EPYC (Zen 4, 1 MiB L2), 2 rounds each: one core packing
 * 8 heads x 2048 keys from DRAM into one slot reused for every head, as the
 * shared packing does (tools/pack_pattern.c)
 * d 128 3.43 / 3.04 -> 1.95 / 1.86 ms, d 64 1.28 / 1.33 -> 0.89 / 0.90 ms
 * (prefetcht0: 2.46 / 2.59 ms at d 128); in the library (tools/phase_times.c,
 * 2 threads, causal, 3 rounds side by side) the packing per thread and call
 * N 1024 d 64 0.50 / 0.49 / 0.46 -> 0.35 / 0.41 / 0.34 ms, N 2048 d 128
 * 2.47 / 2.47 / 2.32 -> 2.19 / 1.94 / 2.15 ms. On the earlier Intel project
 * machine a prefetcht0 version made packing ~9% slower (never landed); this
 * one is not measured there.
 */
#include <immintrin.h>

#include "kernels.h"

void fa_transpose_avx512(int bc, int d, const float *k, size_t ldk, float *kt, size_t ldkt);

/* out[c] = column c of the 16 x 16 block r[0..15] (r[j] = row j). */
static inline void transpose16(const __m512 r[16], __m512 out[16])
{
    __m512 a[16], b[16];
    for (int i = 0; i < 16; i += 2) {
        a[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);     /* per lane: r_i[0] r_i+1[0] r_i[1] r_i+1[1] */
        a[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]); /* per lane: r_i[2] r_i+1[2] r_i[3] r_i+1[3] */
    }
    for (int g = 0; g < 16; g += 4) { /* rows g..g+3; b[g+m] lane k = column 4k+m of those rows */
        __m512d a0 = _mm512_castps_pd(a[g]), a1 = _mm512_castps_pd(a[g + 1]);
        __m512d a2 = _mm512_castps_pd(a[g + 2]), a3 = _mm512_castps_pd(a[g + 3]);
        b[g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a0, a2));
        b[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a0, a2));
        b[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(a1, a3));
        b[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(a1, a3));
    }
    for (int m = 0; m < 4; m++) { /* gather lane k of b[m], b[4+m], b[8+m], b[12+m] */
        __m512 s1 = _mm512_shuffle_f32x4(b[m], b[4 + m], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 s2 = _mm512_shuffle_f32x4(b[m], b[4 + m], _MM_SHUFFLE(3, 1, 3, 1));
        __m512 s3 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 s4 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], _MM_SHUFFLE(3, 1, 3, 1));
        out[0 + m] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(2, 0, 2, 0));  /* k = 0 */
        out[4 + m] = _mm512_shuffle_f32x4(s2, s4, _MM_SHUFFLE(2, 0, 2, 0));  /* k = 1 */
        out[8 + m] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(3, 1, 3, 1));  /* k = 2 */
        out[12 + m] = _mm512_shuffle_f32x4(s2, s4, _MM_SHUFFLE(3, 1, 3, 1)); /* k = 3 */
    }
}

void fa_transpose_avx512(int bc, int d, const float *k, size_t ldk, float *kt, size_t ldkt)
{
    for (int jb = 0; jb < bc; jb += 16) {
        const int nj = bc - jb < 16 ? bc - jb : 16;
        /* the next 16 rows, whole, into L2 (see the file comment) */
        for (int jj = jb + 16; jj < jb + 32 && jj < bc; jj++)
            FA_PREFETCH_ROW(k + (size_t)jj * ldk, (size_t)d * sizeof(float), 0, 2); /* prefetcht1 */
        for (int cb = 0; cb < d; cb += 16) {
            const int nc = d - cb < 16 ? d - cb : 16;
            const __mmask16 m = (__mmask16)(nc == 16 ? 0xffffu : (1u << nc) - 1u);
            __m512 r[16], out[16];
            for (int jj = 0; jj < 16; jj++)
                r[jj] = jj < nj ? _mm512_maskz_loadu_ps(m, k + (size_t)(jb + jj) * ldk + cb)
                                : _mm512_setzero_ps();
            transpose16(r, out);
            for (int cc = 0; cc < nc; cc++) _mm512_storeu_ps(kt + (size_t)(cb + cc) * ldkt + jb, out[cc]);
        }
    }
}
