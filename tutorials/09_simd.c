/*
 * 09_simd.c — SIMD: let the compiler vectorize the inner loops, then compare
 * with the library's hand-written micro-kernels.
 *
 * Previous step: 07/08 had the right memory behaviour but ran the arithmetic
 *   one float at a time: a few GFLOP/s, far from what one core can do.
 * What changes: the same FlashAttention-2 kernel, written so a compiler can
 *   vectorize it without intrinsics:
 *     - every inner loop runs over the contiguous head dimension c;
 *     - pointers are `restrict` (no aliasing between Q, K, V and the tile);
 *     - `#pragma omp simd reduction(+:x)` tells the compiler it may reorder
 *       the dot product's sum (C forbids that otherwise: float + is not
 *       associative), so it can keep 4, 8 or 16 partial sums in one register;
 *     - the 4 x Bc score micro-tile: four query rows share each K row load.
 *   Then the library (fa_forward) with its AVX-512 / AVX2 / NEON micro-kernels,
 *   on one thread, and its `standard` path (S and P materialized).
 * What to look for:
 *   - GFLOP/s: scalar (step 07) < vectorized here < the library's flash path;
 *   - the error column barely moves: reordering a sum changes rounding only;
 *   - the baseline x86-64 target has 4-wide SSE only. Rebuild with
 *     `make tutorials TUT_CFLAGS=-march=native` to let the compiler use AVX-512.
 */
#include "common.h"

/*
 * Q, K, V: [n][d]; O: [n][d]; lse: [n].
 * Workspace: S [br][bc], acc [br][d], m [br], l [br]. br must be a multiple of 4.
 */
TUT_BODY void flash2_simd_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d, br = pb->br, bc = pb->bc;
    const float *restrict Q = pb->Q, *restrict K = pb->K, *restrict V = pb->V;
    float *restrict O = pb->O;
    float *restrict S = pb->ws;                 /* [br][bc] */
    float *restrict acc = S + (size_t)br * bc;  /* [br][d] */
    float *restrict m = acc + (size_t)br * d;   /* [br] */
    float *restrict l = m + br;                 /* [br] */
    const float scale = 1.0f / sqrtf((float)d);

    for (int i0 = 0; i0 < n; i0 += br) {
        int in = i0 + br < n ? br : n - i0;
        for (int ii = 0; ii < in; ii++) {
            ST(cs, &m[ii], -INFINITY);
            ST(cs, &l[ii], 0.0f);
#pragma omp simd
            for (int c = 0; c < d; c++) ST(cs, &acc[(size_t)ii * d + c], 0.0f);
        }
        int j_end = pb->causal ? i0 + in : n;
        for (int j0 = 0; j0 < j_end; j0 += bc) {
            int jn = j0 + bc < n ? bc : n - j0;
            /* Score micro-tile: 4 query rows x 1 key row per step; each K row is loaded once for 4 dots. */
            for (int ii = 0; ii < in; ii += 4) {
                int rows = in - ii < 4 ? in - ii : 4;
                const float *q0 = &Q[(size_t)(i0 + ii) * d];                     /* [4][d] */
                const float *q1 = rows > 1 ? q0 + d : q0, *q2 = rows > 2 ? q0 + 2 * d : q0,
                            *q3 = rows > 3 ? q0 + 3 * d : q0;
                for (int jj = 0; jj < jn; jj++) {
                    const float *kr = &K[(size_t)(j0 + jj) * d];                  /* [d] */
                    float x0 = 0, x1 = 0, x2 = 0, x3 = 0;
#pragma omp simd reduction(+:x0, x1, x2, x3)
                    for (int c = 0; c < d; c++) {
                        float kc = LD(cs, &kr[c]);
                        x0 += LD(cs, &q0[c]) * kc;
                        x1 += LD(cs, &q1[c]) * kc;
                        x2 += LD(cs, &q2[c]) * kc;
                        x3 += LD(cs, &q3[c]) * kc;
                    }
                    float xs[4] = {x0, x1, x2, x3};
                    for (int r = 0; r < rows; r++) {
                        int i = i0 + ii + r, j = j0 + jj;
                        ST(cs, &S[(size_t)(ii + r) * bc + jj], (pb->causal && j > i) ? -INFINITY : xs[r] * scale);
                    }
                }
            }
            /* Online softmax update and P V, row by row; the c loops vectorize. */
            for (int ii = 0; ii < in; ii++) {
                float *s = &S[(size_t)ii * bc];                                   /* [bc] */
                float *a_row = &acc[(size_t)ii * d];                              /* [d] */
                float mo = LD(cs, &m[ii]), mt = mo;
                for (int jj = 0; jj < jn; jj++) mt = fmaxf(mt, LD(cs, &s[jj]));
                if (mt == -INFINITY) continue;
                float alpha = expf(mo - mt), rowsum = 0.0f;
                for (int jj = 0; jj < jn; jj++) {
                    float p = expf(LD(cs, &s[jj]) - mt);
                    ST(cs, &s[jj], p);
                    rowsum += p;
                }
                ST(cs, &l[ii], LD(cs, &l[ii]) * alpha + rowsum);
                ST(cs, &m[ii], mt);
#pragma omp simd
                for (int c = 0; c < d; c++) ST(cs, &a_row[c], LD(cs, &a_row[c]) * alpha);
                for (int jj = 0; jj < jn; jj++) {
                    float p = LD(cs, &s[jj]);
                    const float *vr = &V[(size_t)(j0 + jj) * d];                  /* [d] */
#pragma omp simd
                    for (int c = 0; c < d; c++) ST(cs, &a_row[c], LD(cs, &a_row[c]) + p * LD(cs, &vr[c]));
                }
            }
        }
        for (int ii = 0; ii < in; ii++) {
            float inv = 1.0f / LD(cs, &l[ii]);
#pragma omp simd
            for (int c = 0; c < d; c++)
                ST(cs, &O[(size_t)(i0 + ii) * d + c], LD(cs, &acc[(size_t)ii * d + c]) * inv);
            ST(cs, &pb->lse[i0 + ii], LD(cs, &m[ii]) + logf(LD(cs, &l[ii])));
        }
    }
}

TUT_NOINLINE void flash2_simd(const tut_problem *pb) { flash2_simd_body(NULL, pb); }
TUT_NOINLINE void flash2_simd_probed(cachesim *cs, const tut_problem *pb) { flash2_simd_body(cs, pb); }
static size_t simd_ws(const tut_problem *pb)
{
    return (size_t)pb->br * pb->bc + (size_t)pb->br * pb->d + 2 * (size_t)pb->br;
}

static void print_row(FILE *dat, const char *variant, const tut_result *r, double base_gflops)
{
    printf("   %-22s %6d %4d %4d | %9.3f | %8.2f | %6.1fx | %10s | %8.1e\n", variant, r->n, r->br, r->bc,
           r->sec * 1e3, r->gflops, r->gflops / base_gflops, tut_bytes((double)r->ws_bytes), r->err);
    fprintf(dat, "%s %d %d %d %d %g %g %zu %g\n", variant, r->n, r->d, r->br, r->bc, r->sec * 1e3, r->gflops,
            r->ws_bytes, r->err);
}

int main(int argc, char **argv)
{
    const tut_kernel k = {"flash2_simd", flash2_simd, flash2_simd_probed, simd_ws, 1};
    tut_args a = {.n = {512, 1024}, .n_count = 2, .d = 64, .reps = 3, .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "09_simd: vectorizable FlashAttention-2 vs the library's micro-kernels");
    tut_fit_blocks(&a, &a.br, &a.bc);
    a.br = a.br < 4 ? 4 : a.br / 4 * 4;
    if (tut_kernel_mode(&a, &k, a.br, a.bc)) return 0;

    fa_cpu_info ci;
    fa_get_cpu_info(&ci);
    tut_banner("Step 09: SIMD (compiler-vectorized loops, then the library's micro-kernels)", &a, NULL);
    printf("   One thread everywhere. Library ISA: %s (%d float lanes). Speedup is against the\n"
           "   vectorized kernel of this step. [sim] misses are not the point here: see step 07.\n\n",
           ci.isa, ci.simd_width);
    FILE *dat = tut_dat_open(&a, "09", "variant n d br bc time_ms gflops ws_bytes max_err");
    printf("   %-22s %6s %4s %4s | %9s | %8s | %7s | %10s | %8s\n", "variant", "N", "Br", "Bc", "time ms",
           "GFLOP/s", "speedup", "workspace", "max err");
    a.no_sim = 1;
    for (int t = 0; t < a.n_count; t++) {
        tut_result r = tut_measure(&a, &k, a.n[t], a.br, a.bc, NULL, &(tut_hw){-1, -1, -1, -1}, 1e-4);
        double base = r.gflops;
        print_row(dat, "tutorial_flash2_simd", &r, base);
        r = tut_measure_library(&a, FA_IMPL_FLASH, a.n[t], 1, 1e-4);
        print_row(dat, "library_flash", &r, base);
        r = tut_measure_library(&a, FA_IMPL_STANDARD, a.n[t], 1, 1e-4);
        print_row(dat, "library_standard", &r, base);
    }
    fclose(dat);
    printf("\n   The library's flash path packs K and V into the layout its micro-kernel wants,\n"
           "   keeps a whole register tile of S in registers, and uses FMA at the full vector\n"
           "   width; its block sizes come from L2 (`flashattn info`). Try: --d 128,\n"
           "   `make tutorials TUT_CFLAGS=-march=native`, and compare step 07 at the same N.\n"
           "   Next: 10 takes the tile product apart: register blocking, packing, vector width.\n");
    return 0;
}
