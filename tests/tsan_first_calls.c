/*
 * tsan_first_calls.c — concurrent first calls, under ThreadSanitizer
 * (built and run by tests/test_tsan.sh, never by the plain test build).
 *
 * Eight threads released together make the library's first calls at the
 * same moment: the environment, the cache detection and the kernel choice
 * are one-time initializations (pthread_once / an atomic), and a context's
 * arena is shared by two threads (the loser of the try-lock allocates as
 * without a context). Before issue 10, cpuinfo.c's `static int done` was a
 * data race here. Each thread also checks its result against a float64
 * computation of its own, so a race that corrupts data fails even where
 * TSan is silent. Exit status 0: clean and correct.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

#define NT 8
#define S 24
#define D 16

static pthread_barrier_t start;
static fa_context *shared_ctx;
static int failures;
static pthread_mutex_t fail_lock = PTHREAD_MUTEX_INITIALIZER;

static void fail(const char *what, int id)
{
    pthread_mutex_lock(&fail_lock);
    fprintf(stderr, "tsan_first_calls: thread %d: %s (%s)\n", id, what, fa_last_error());
    failures++;
    pthread_mutex_unlock(&fail_lock);
}

static void *worker(void *arg)
{
    const int id = (int)(size_t)arg;
    float q[S * D], k[S * D], v[S * D], o[S * D];
    unsigned s = 12345u + (unsigned)id;
    for (int x = 0; x < S * D; x++) {
        s = s * 1103515245u + 12345u;
        q[x] = (float)((s >> 8) & 0xffff) / 65536.0f - 0.5f;
        k[x] = (float)((s >> 4) & 0xffff) / 65536.0f - 0.5f;
        v[x] = (float)((s >> 12) & 0xffff) / 65536.0f - 0.5f;
    }
    const int64_t shape[4] = {1, S, 1, D};
    fa_tensor tq, tk, tv, to;
    fa_tensor_make(&tq, q, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tk, k, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tv, v, FA_F32, 4, shape, NULL);
    fa_tensor_make(&to, o, FA_F32, 4, shape, NULL);
    pthread_barrier_wait(&start);

    fa_cpu_info info;
    if (fa_get_cpu_info(&info) != FA_OK) fail("fa_get_cpu_info", id);
    int br, bc;
    if (fa_block_sizes(D, D, NULL, &br, &bc) != FA_OK) fail("fa_block_sizes", id);
    fa_options opt = fa_options_default();
    opt.causal = id & 1;
    opt.num_threads = 1;
    if (id >= NT / 2) opt.context = shared_ctx;
    if (fa_forward(&tq, &tk, &tv, &to, NULL, &opt) != FA_OK) fail("fa_forward", id);
    /* float64 check of every row */
    const double scale = 1.0 / sqrt((double)D);
    for (int i = 0; i < S; i++) {
        const int hi = opt.causal ? i + 1 : S;
        double m = -INFINITY, l = 0.0, acc[D] = {0}, sc[S];
        for (int j = 0; j < hi; j++) {
            double dot = 0.0;
            for (int c = 0; c < D; c++) dot += (double)q[i * D + c] * (double)k[j * D + c];
            sc[j] = scale * dot;
            if (sc[j] > m) m = sc[j];
        }
        for (int j = 0; j < hi; j++) {
            const double e = exp(sc[j] - m);
            l += e;
            for (int c = 0; c < D; c++) acc[c] += e * (double)v[j * D + c];
        }
        for (int c = 0; c < D; c++)
            if (fabs(acc[c] / l - (double)o[i * D + c]) > 1e-5) {
                fail("wrong output", id);
                return NULL;
            }
    }
    return NULL;
}

int main(void)
{
    if (fa_context_create(&shared_ctx, NULL, 1) != FA_OK) {
        fprintf(stderr, "tsan_first_calls: fa_context_create: %s\n", fa_last_error());
        return 1;
    }
    pthread_barrier_init(&start, NULL, NT);
    pthread_t t[NT];
    for (int i = 0; i < NT; i++) pthread_create(&t[i], NULL, worker, (void *)(size_t)i);
    for (int i = 0; i < NT; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&start);
    fa_context_destroy(shared_ctx);
    if (failures) return 1;
    printf("tsan_first_calls: %d threads, first calls concurrent: clean\n", NT);
    return 0;
}
