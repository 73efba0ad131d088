/*
 * 11_threads.c — threads: hand the query blocks to cores.
 *
 * Previous steps: 09 and 10 made one core's arithmetic fast.
 * What changes: in FlashAttention-2's loop order, each query block i reads
 *   Q_i and all of K and V, and writes only O_i and LSE_i: no two blocks
 *   write the same memory. So `#pragma omp parallel for` over the query blocks
 *   is the whole parallelization. Each thread needs its own workspace (tile,
 *   accumulator, m, l): O(threads x block), still independent of N.
 *   (FlashAttention-1's order, K/V outer, would have every thread updating
 *   every O_i: that is why FA2 swapped the loops.)
 * What to look for:
 *   - speedup and efficiency = speedup / threads; on this project's 2-core
 *     machine 1 -> 2 threads should approach 2x for large N;
 *   - small N has few blocks (N / Br) to share: efficiency drops;
 *   - the library's flash path, same experiment, at its own speed.
 *   Cache misses: the simulator models one core's caches, so this step shows none.
 */
#include "common.h"
#ifdef _OPENMP
#include <omp.h>
#endif

static int g_threads = 1;   /* threads the next run uses */

/*
 * Q, K, V: [n][d]; O: [n][d]; lse: [n].
 * Workspace, per thread t: ws + t * per_thread = S [br][bc], acc [br][d], m [br], l [br].
 */
TUT_BODY void flash2_omp_body(cachesim *cs, const tut_problem *pb)
{
    const int n = pb->n, d = pb->d, br = pb->br, bc = pb->bc;
    const float *restrict Q = pb->Q, *restrict K = pb->K, *restrict V = pb->V;
    const size_t per_thread = (size_t)br * bc + (size_t)br * d + 2 * (size_t)br;
    const float scale = 1.0f / sqrtf((float)d);
    const int nblocks = (n + br - 1) / br;

#pragma omp parallel for schedule(dynamic, 1) num_threads(g_threads) if (cs == NULL)
    for (int b = 0; b < nblocks; b++) {
        int tid = 0;
#ifdef _OPENMP
        tid = omp_get_thread_num();
#endif
        float *restrict S = pb->ws + (size_t)tid * per_thread;   /* [br][bc] */
        float *restrict acc = S + (size_t)br * bc;               /* [br][d] */
        float *restrict m = acc + (size_t)br * d;                /* [br] */
        float *restrict l = m + br;                              /* [br] */
        int i0 = b * br, in = i0 + br < n ? br : n - i0;
        for (int ii = 0; ii < in; ii++) {
            ST(cs, &m[ii], -INFINITY);
            ST(cs, &l[ii], 0.0f);
            for (int c = 0; c < d; c++) ST(cs, &acc[(size_t)ii * d + c], 0.0f);
        }
        int j_end = pb->causal ? i0 + in : n;
        for (int j0 = 0; j0 < j_end; j0 += bc) {
            int jn = j0 + bc < n ? bc : n - j0;
            for (int ii = 0; ii < in; ii++) {
                int i = i0 + ii;
                const float *q = &Q[(size_t)i * d];              /* [d] */
                float *s = &S[(size_t)ii * bc];                  /* [bc] */
                float *a_row = &acc[(size_t)ii * d];             /* [d] */
                float mo = LD(cs, &m[ii]), mt = mo;
                for (int jj = 0; jj < jn; jj++) {
                    const float *kr = &K[(size_t)(j0 + jj) * d];  /* [d] */
                    float x = 0.0f;
#pragma omp simd reduction(+:x)
                    for (int c = 0; c < d; c++) x += LD(cs, &q[c]) * LD(cs, &kr[c]);
                    x = (pb->causal && j0 + jj > i) ? -INFINITY : x * scale;
                    ST(cs, &s[jj], x);
                    mt = fmaxf(mt, x);
                }
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
                    const float *vr = &V[(size_t)(j0 + jj) * d];  /* [d] */
#pragma omp simd
                    for (int c = 0; c < d; c++) ST(cs, &a_row[c], LD(cs, &a_row[c]) + p * LD(cs, &vr[c]));
                }
            }
        }
        for (int ii = 0; ii < in; ii++) {
            float inv = 1.0f / LD(cs, &l[ii]);
            for (int c = 0; c < d; c++)
                ST(cs, &pb->O[(size_t)(i0 + ii) * d + c], LD(cs, &acc[(size_t)ii * d + c]) * inv);
            ST(cs, &pb->lse[i0 + ii], LD(cs, &m[ii]) + logf(LD(cs, &l[ii])));
        }
    }
}

TUT_NOINLINE void flash2_omp(const tut_problem *pb) { flash2_omp_body(NULL, pb); }
TUT_NOINLINE void flash2_omp_probed(cachesim *cs, const tut_problem *pb) { flash2_omp_body(cs, pb); }
static size_t omp_ws(const tut_problem *pb)
{
    return (size_t)g_threads * ((size_t)pb->br * pb->bc + (size_t)pb->br * pb->d + 2 * (size_t)pb->br);
}

int main(int argc, char **argv)
{
    const tut_kernel k = {"flash2_omp", flash2_omp, flash2_omp_probed, omp_ws, 1};
    tut_args a = {.n = {512, 1024}, .n_count = 2, .d = 64, .reps = 3, .vg_kernel = k.name};
    tut_parse_args(argc, argv, &a, "11_threads: FlashAttention-2 with OpenMP over query blocks");
    tut_fit_blocks(&a, &a.br, &a.bc);
    if (tut_kernel_mode(&a, &k, a.br, a.bc)) return 0;

    fa_cpu_info ci;
    fa_get_cpu_info(&ci);
    int tmax = a.threads ? a.threads : ci.max_threads;
    tut_banner("Step 11: threads (OpenMP over query blocks)", &a, NULL);
    printf("   Up to %d threads (--threads T). Efficiency = speedup / threads.\n\n", tmax);
    FILE *dat = tut_dat_open(&a, "11", "variant n threads time_ms gflops speedup efficiency max_err");
    printf("   %-16s %6s %7s | %9s | %8s | %7s | %10s | %10s | %8s\n", "variant", "N", "threads", "time ms",
           "GFLOP/s", "speedup", "efficiency", "workspace", "max err");
    a.no_sim = 1;
    tut_hw nohw = {-1, -1, -1, -1};
    for (int t = 0; t < a.n_count; t++) {
        for (int lib = 0; lib < 2; lib++) {
            double t1 = 0;
            for (int th = 1; th <= tmax; th *= 2) {
                g_threads = th;
                tut_result r = lib ? tut_measure_library(&a, FA_IMPL_FLASH, a.n[t], th, 1e-4)
                                   : tut_measure(&a, &k, a.n[t], a.br, a.bc, NULL, &nohw, 1e-4);
                if (th == 1) t1 = r.sec;
                const char *name = lib ? "library_flash" : "tutorial_flash2";
                printf("   %-16s %6d %7d | %9.3f | %8.2f | %6.2fx | %9.0f%% | %10s | %8.1e\n", name, r.n, th,
                       r.sec * 1e3, r.gflops, t1 / r.sec, 100.0 * t1 / r.sec / th, tut_bytes((double)r.ws_bytes),
                       r.err);
                fprintf(dat, "%s %d %d %g %g %g %g %g\n", name, r.n, th, r.sec * 1e3, r.gflops, t1 / r.sec,
                        t1 / r.sec / th, r.err);
                if (th < tmax && th * 2 > tmax) th = tmax / 2;   /* also measure tmax itself */
            }
        }
    }
    fclose(dat);
    printf("\n   N / Br = %d query blocks at the largest N: plenty for %d threads. On a shared\n"
           "   machine the numbers wobble: rerun, or raise --reps. Try: --n 128 (few blocks),\n"
           "   --causal (uneven blocks: schedule(dynamic) balances them).\n"
           "   Next: 12 measures the slow-tier traffic against the paper's bounds.\n",
           (a.n[a.n_count - 1] + a.br - 1) / a.br, tmax);
    return 0;
}
