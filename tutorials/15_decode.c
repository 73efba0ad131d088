/*
 * 15_decode.c — decoding: one query row against a long KV cache.
 *
 * Previous steps: 07-12 made the N x N forward fast; there every K/V byte
 *   brought into cache is used by a whole block of Br query rows, so the
 *   arithmetic (FLOPs) sets the pace.
 * What changes: generating a token asks for ONE new query row per head,
 *   attending to all N cached keys. Each K/V element is now used by 2 FLOPs per
 *   query row that reads it: the pass is bound by how fast memory delivers K and
 *   V, and the question becomes "how many bytes do we move, and do all cores
 *   pull?". Two changes answer it (src/decode.c does both):
 *   - GQA packing: the g = H/H_k query heads that share a kv head become the rows
 *     of one tile, so each K/V row is read once per group instead of once per
 *     query head (g times fewer bytes);
 *   - split-KV: with few kv heads (MQA: one) there are fewer tasks than cores;
 *     cutting the keys into S ranges gives H_k x S tasks, each leaving a partial
 *     (m, l, O~) that merge exactly by step 01's rule
 *     m = max(m1, m2), l = l1 e^(m1-m) + l2 e^(m2-m), O~ = O~1 e^(m1-m) + O~2 e^(m2-m).
 *   A third thing matters once the bytes are right: the work per byte. With 2
 *   FLOPs per element there is no room to copy K into a transposed panel or V
 *   (or a bf16 cache widened to float32) into a buffer first — that costs more
 *   instructions than the arithmetic. decode_rows below reads each K and V row
 *   where it lies; so do the library's kernels (the kernel table's dec_qk and
 *   dec_pv: a block of K rows dotted with the group's rows in registers,
 *   f16/bf16 widened in registers, V rows read in place).
 *   A fourth, on some CPUs: the ORDER of the reads. A task holding several kv
 *   heads computes a key block head by head, so it reads each head's rows
 *   H_k x d elements apart; an AMD Zen 4 core's prefetchers do not follow that
 *   (11 GB/s from one core, against 33-35 for one ascending run). The library
 *   there asks (software prefetch) for the NEXT block in address order, a few
 *   lines between the kernel's key blocks, so memory and arithmetic overlap
 *   (src/decode.c, addr_plan; FA_DECODE_TOUCH=0/1 turns it off/on;
 *   docs/performance.md, "Zen 4: ask for the next block, spread").
 * What to look for:
 *   - the count: bytes vs FLOPs of decode against the machine's own balance
 *     (its FMA peak over its read bandwidth, both measured here);
 *   - GB/s of the three kernels (bytes counted once: the K/V the answer needs),
 *     as a fraction of the read bandwidth; the unpacked kernel asks for g times
 *     the bytes;
 *   - the library with num_splits 1 vs 0 (heuristic), and a bf16 cache: half the
 *     bytes, so about half the time once the pass is memory-bound.
 *   Sizes: --n is the cache length (default 131072 keys: 128 MiB of f32 K/V at
 *   H_k = 2, d = 64; more than most last-level caches). Timings wobble on a
 *   shared machine; the counts do not.
 */
#include "common.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define H 8           /* query heads */
#define KB 64         /* keys per block of the online softmax */

/*
 * The one kernel all variants call: rows q[r] (r < nr, each [d]) against keys
 * j0..j1-1 of one kv head (K, V rows `ld` floats apart), online softmax over
 * blocks of KB keys; leaves m[r], l[r] and the unnormalized acc[r][d].
 */
static void decode_rows(int nr, int d, const float *q, const float *K, const float *V, size_t ld, int j0, int j1,
                        float scale, float *m, float *l, float *acc)
{
    float s[8][KB];
    for (int r = 0; r < nr; r++) {
        m[r] = -INFINITY;
        l[r] = 0.0f;
        memset(acc + (size_t)r * d, 0, (size_t)d * sizeof(float));
    }
    for (int b0 = j0; b0 < j1; b0 += KB) {
        const int nb = j1 - b0 < KB ? j1 - b0 : KB;
        for (int jj = 0; jj < nb; jj++) {            /* each K row read once for all nr rows */
            const float *k = K + (size_t)(b0 + jj) * ld;
            for (int r = 0; r < nr; r++) {
                const float *qr = q + (size_t)r * d;
                float x = 0.0f;
#pragma omp simd reduction(+ : x)
                for (int c = 0; c < d; c++) x += qr[c] * k[c];
                s[r][jj] = x * scale;
            }
        }
        for (int r = 0; r < nr; r++) {
            float mt = m[r];
            for (int jj = 0; jj < nb; jj++) mt = fmaxf(mt, s[r][jj]);
            const float alpha = expf(m[r] - mt);
            float sum = 0.0f;
            for (int jj = 0; jj < nb; jj++) sum += (s[r][jj] = expf(s[r][jj] - mt));
            l[r] = l[r] * alpha + sum;
            m[r] = mt;
            float *a = acc + (size_t)r * d;
#pragma omp simd
            for (int c = 0; c < d; c++) a[c] *= alpha;
        }
        for (int jj = 0; jj < nb; jj++) {            /* each V row read once for all nr rows */
            const float *v = V + (size_t)(b0 + jj) * ld;
            for (int r = 0; r < nr; r++) {
                const float p = s[r][jj];
                float *a = acc + (size_t)r * d;
#pragma omp simd
                for (int c = 0; c < d; c++) a[c] += p * v[c];
            }
        }
    }
}

typedef struct dec {
    int n, d, hk, threads, splits;
    const float *q, *k, *v; /* q [H][d]; k, v [n][hk][d] */
    float *o;               /* [H][d] */
    float *part;            /* split-KV partials [H][splits][d + 2] */
} dec;

/* Unpacked: one task per QUERY head; kv head h/g is streamed g times. */
static void run_unpacked(const dec *p)
{
    const int g = H / p->hk, d = p->d;
#pragma omp parallel for schedule(dynamic, 1) num_threads(p->threads)
    for (int h = 0; h < H; h++) {
        float m, l, acc[256];
        decode_rows(1, d, p->q + (size_t)h * d, p->k + (size_t)(h / g) * d, p->v + (size_t)(h / g) * d,
                    (size_t)p->hk * d, 0, p->n, 1.0f / sqrtf((float)d), &m, &l, acc);
        for (int c = 0; c < d; c++) p->o[(size_t)h * d + c] = acc[c] / l;
    }
}

/* GQA-packed, optionally split: task (kv head, split) runs the g query heads of
 * the kv head over its key range; then the partials merge in split order. */
static void run_packed(const dec *p)
{
    const int g = H / p->hk, d = p->d, S = p->splits;
#pragma omp parallel for schedule(dynamic, 1) num_threads(p->threads)
    for (int t = 0; t < p->hk * S; t++) {
        const int hk = t / S, s = t % S;
        float m[8], l[8], acc[8 * 256];
        decode_rows(g, d, p->q + (size_t)hk * g * d, p->k + (size_t)hk * d, p->v + (size_t)hk * d,
                    (size_t)p->hk * d, (int)((long)p->n * s / S), (int)((long)p->n * (s + 1) / S),
                    1.0f / sqrtf((float)d), m, l, acc);
        for (int r = 0; r < g; r++) {
            float *pt = p->part + ((size_t)(hk * g + r) * S + s) * (d + 2);
            pt[0] = m[r];
            pt[1] = l[r];
            memcpy(pt + 2, acc + (size_t)r * d, (size_t)d * sizeof(float));
        }
    }
    for (int h = 0; h < H; h++) { /* the merge: step 01's rule, split by split */
        const float *pt = p->part + (size_t)h * S * (d + 2);
        float m = -INFINITY, l = 0.0f;
        for (int s = 0; s < S; s++) m = fmaxf(m, pt[(size_t)s * (d + 2)]);
        float *o = p->o + (size_t)h * d;
        memset(o, 0, (size_t)d * sizeof(float));
        for (int s = 0; s < S; s++) {
            const float *x = pt + (size_t)s * (d + 2), w = expf(x[0] - m);
            l += w * x[1];
            for (int c = 0; c < d; c++) o[c] += w * x[2 + c];
        }
        for (int c = 0; c < d; c++) o[c] /= l;
    }
}

/* Read bandwidth in GB/s: XOR over a buffer 4x the last-level cache (64 MiB..512 MiB). */
static double read_gbps(int threads)
{
    fa_cpu_info ci;
    fa_get_cpu_info(&ci);
    size_t bytes = 4 * (ci.l3_bytes ? ci.l3_bytes : 16u << 20);
    bytes = bytes < (64u << 20) ? (64u << 20) : bytes > (512u << 20) ? (512u << 20) : bytes;
    const size_t n = bytes / 8;
    uint64_t *buf = tut_alloc(bytes);
    for (size_t i = 0; i < n; i++) buf[i] = i;
    double best = 0;
    volatile uint64_t sink = 0;
    for (int pass = 0; pass < 4; pass++) {
        uint64_t x = 0;
        const double t0 = tut_now();
#pragma omp parallel for simd num_threads(threads) reduction(^ : x)
        for (size_t i = 0; i < n; i++) x ^= buf[i];
        const double t = tut_now() - t0;
        sink ^= x;
        if (pass > 0 && bytes / t / 1e9 > best) best = bytes / t / 1e9;
    }
    (void)sink;
    free(buf);
    return best;
}

/* Max |o - reference| for the problem in p, the reference from the library (float64). */
static double check(const dec *p, const fa_tensor *tq, const fa_tensor *tk, const fa_tensor *tv)
{
    double *ref = tut_alloc((size_t)H * p->d * sizeof(double)), err = 0;
    const int64_t os[4] = {1, 1, H, p->d};
    fa_tensor to;
    fa_tensor_make(&to, ref, FA_F64, 4, os, NULL);
    fa_options opt = fa_options_default();
    opt.impl = FA_IMPL_REFERENCE;
    if (fa_forward(tq, tk, tv, &to, NULL, &opt) != FA_OK) { fprintf(stderr, "%s\n", fa_last_error()); exit(1); }
    for (int i = 0; i < H * p->d; i++) err = fmax(err, fabs(p->o[i] - ref[i]));
    free(ref);
    return err;
}

int main(int argc, char **argv)
{
    tut_args a = {.n = {131072}, .n_count = 1, .d = 64, .reps = 5, .vg_kernel = "decode_rows"};
    tut_parse_args(argc, argv, &a, "15_decode: one query row against a KV cache (GQA packing, split-KV)");
    const int n = a.n[0], d = a.d > 256 ? 256 : a.d;
    fa_cpu_info ci;
    fa_get_cpu_info(&ci);
    const int T = a.threads ? a.threads : ci.max_threads;
    tut_banner("Step 15: decoding (memory-bound: GQA packing and split-KV)", &a, NULL);

    /* ---- 1. the count ---- */
    double peak = 0;
    fa_measure_fma_peak(ci.isa, T, 0.1, &peak);
    const double bw = read_gbps(T);
    printf("   Measured on %d thread%s: FMA peak %.1f GFLOP/s, read bandwidth %.1f GB/s: the machine does\n"
           "   %.1f FLOPs in the time one byte arrives. A kernel below that many FLOPs per byte waits on memory.\n\n",
           T, T == 1 ? "" : "s", peak, bw, peak / bw);
    printf("   %-34s %12s %12s %11s\n", "problem (f32, d, N keys)", "FLOPs", "bytes", "FLOPs/byte");
    const double N = n;
    const double fl_dec = 4.0 * H * N * d, by_dec = 2.0 * 2 * N * d * 4; /* H_k = 2 */
    const double fl_pre = 4.0 * H * N * N * d, by_pre = (2.0 * H + 2.0 * 2) * N * d * 4;
    printf("   %-34s %12.3g %12.3g %11.2f   <- memory-bound\n", "decode: 1 query row, H=8, H_k=2", fl_dec, by_dec,
           fl_dec / by_dec);
    printf("   %-34s %12.3g %12.3g %11.2f   <- compute-bound\n", "prefill: N query rows, H=8, H_k=2", fl_pre, by_pre,
           fl_pre / by_pre);
    printf("   decode does 2 FLOPs per K/V element per query head that reads it: H/(2 H_k) FLOPs per f32 byte,\n"
           "   at best; time = bytes / bandwidth = %.2f ms here, whatever the FMA units can do.\n\n",
           by_dec / bw / 1e6);

    /* ---- 2. three kernels, measured ---- */
    FILE *dat = tut_dat_open(&a, "15", "variant hk threads splits time_ms gbps bw_fraction bytes_asked_ratio max_err");
    printf("   %-16s %4s %7s %6s | %9s | %8s | %7s | %11s | %8s\n", "variant", "H_k", "threads", "splits", "time ms",
           "GB/s", "of bw", "bytes asked", "max err");
    static const int hks[2] = {2, 1};
    for (int x = 0; x < 2; x++) {
        const int hk = hks[x], g = H / hk;
        float *q = tut_alloc((size_t)H * d * 4), *k = tut_alloc((size_t)n * hk * d * 4);
        float *v = tut_alloc((size_t)n * hk * d * 4), *o = tut_alloc((size_t)H * d * 4);
        float *part = tut_alloc((size_t)H * 4 * T * (d + 2) * 4);
        tut_fill(q, (size_t)H * d, 1, -1, 1);
        tut_fill(k, (size_t)n * hk * d, 2, -1, 1);
        tut_fill(v, (size_t)n * hk * d, 3, -1, 1);
        const int64_t qs[4] = {1, 1, H, d}, ks[4] = {1, n, hk, d};
        fa_tensor tq, tk, tv;
        fa_tensor_make(&tq, q, FA_F32, 4, qs, NULL);
        fa_tensor_make(&tk, k, FA_F32, 4, ks, NULL);
        fa_tensor_make(&tv, v, FA_F32, 4, ks, NULL);
        const double kv_bytes = 2.0 * n * hk * d * 4;
        /* split-KV: enough key ranges that H_k x splits tasks occupy the T threads */
        struct { const char *name; int packed, threads, splits; } vs[4] = {
            {"unpacked", 0, T, 1}, {"gqa-packed", 1, T, 1}, {"packed+split", 1, T, (T + hk - 1) / hk},
            {"packed, 1 thr", 1, 1, 1}};
        for (int i = 0; i < 4; i++) {
            dec p = {n, d, hk, vs[i].threads, vs[i].splits, q, k, v, o, part};
            double sec;
            TUT_TIME(a.reps, sec, vs[i].packed ? run_packed(&p) : run_unpacked(&p));
            const double err = check(&p, &tq, &tk, &tv);
            tut_require(err, 1e-4, vs[i].name);
            const double ratio = vs[i].packed ? 1.0 : (double)g;
            printf("   %-16s %4d %7d %6d | %9.3f | %8.2f | %6.0f%% | %10.0fx | %8.1e\n", vs[i].name, hk, vs[i].threads,
                   vs[i].splits, sec * 1e3, kv_bytes / sec / 1e9, 100 * kv_bytes / sec / 1e9 / bw, ratio, err);
            fprintf(dat, "%s %d %d %d %g %g %g %g %g\n", vs[i].name, hk, vs[i].threads, vs[i].splits, sec * 1e3,
                    kv_bytes / sec / 1e9, kv_bytes / sec / 1e9 / bw, ratio, err);
        }

        /* ---- 3. the library: num_splits 1 vs the heuristic; a bf16 cache ---- */
        uint16_t *kb = tut_alloc((size_t)n * hk * d * 2), *vb = tut_alloc((size_t)n * hk * d * 2);
        for (size_t i = 0; i < (size_t)n * hk * d; i++) { /* bf16 = the top half of a float32 (truncated) */
            uint32_t u;
            memcpy(&u, &k[i], 4); kb[i] = (uint16_t)(u >> 16);
            memcpy(&u, &v[i], 4); vb[i] = (uint16_t)(u >> 16);
        }
        fa_tensor tkb, tvb, to;
        fa_tensor_make(&tkb, kb, FA_BF16, 4, ks, NULL);
        fa_tensor_make(&tvb, vb, FA_BF16, 4, ks, NULL);
        fa_tensor_make(&to, o, FA_F32, 4, qs, NULL);
        for (int lib = 0; lib < 3; lib++) {
            fa_options opt = fa_options_default();
            opt.num_threads = T;
            opt.num_splits = lib == 0 ? 1 : 0;
            const int bf = lib == 2;
            const fa_tensor *kk = bf ? &tkb : &tk, *vv = bf ? &tvb : &tv;
            double sec;
            TUT_TIME(a.reps, sec, fa_forward(&tq, kk, vv, &to, NULL, &opt));
            dec p = {n, d, hk, T, 1, q, k, v, o, part};
            const double err = check(&p, &tq, kk, vv); /* bf16: against the reference of the bf16 cache */
            tut_require(err, 1e-4, "library");
            const double bytes = kv_bytes / (bf ? 2 : 1);
            const char *name = lib == 0 ? "lib splits=1" : lib == 1 ? "lib splits=auto" : "lib auto, bf16";
            printf("   %-16s %4d %7d %6s | %9.3f | %8.2f | %6.0f%% | %11s | %8.1e\n", name, hk, T, lib ? "auto" : "1",
                   sec * 1e3, bytes / sec / 1e9, 100 * bytes / sec / 1e9 / bw, bf ? "0.5x" : "1x", err);
            fprintf(dat, "%s %d %d %d %g %g %g %g %g\n", lib == 0 ? "lib_splits1" : lib == 1 ? "lib_auto" : "lib_bf16",
                    hk, T, lib ? 0 : 1, sec * 1e3, bytes / sec / 1e9, bytes / sec / 1e9 / bw, bf ? 0.5 : 1.0, err);
        }
        printf("\n");
        free(q); free(k); free(v); free(o); free(part); free(kb); free(vb);
    }
    fclose(dat);
    printf("   K/V of H_k=2 is %s (last-level cache %s): below it the \"bandwidth\" is the cache's.\n"
           "   Read the table: unpacked asks for g x the bytes; packing reads them once. With H_k = 1 (MQA)\n"
           "   packing leaves one task, so one core pulls; split-KV gives every core a key range and the\n"
           "   partials merge exactly. bf16 halves the bytes and so the time, once memory-bound.\n"
           "   `flashattn bench --seqlen-q 1` times the library's decode rows with a cold cache (evicted\n"
           "   before every run, as a decoder meets it; --warm-cache times it as here).\n",
           tut_bytes(2.0 * n * 2 * d * 4), ci.l3_bytes ? tut_bytes((double)ci.l3_bytes) : "unknown");
    return 0;
}
