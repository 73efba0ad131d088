/*
 * 14_validate_gpu.c — validating a GPU kernel's output against the CPU reference.
 *
 * Previous steps built FlashAttention (forward and backward) and measured it. Kernel engineers face
 *   the opposite problem: their CUDA/Triton kernel ran in bf16, its output
 *   differs from anything else by ~1e-2, and they must decide: rounding, or bug?
 * What changes: three stand-ins for GPU kernels, written here in plain C the
 *   way a bf16 FlashAttention kernel computes (inputs in bf16, scores and sums
 *   in float32, P rounded to bf16 before P V, output rounded to bf16):
 *     correct          — the real thing;
 *     acc_in_bf16      — keeps the output accumulator in bf16 instead of
 *                        float32: small errors, but more than bf16 explains;
 *     no_rescale       — forgets to multiply the accumulator by e^{m_old - m_new}
 *                        when a later key block raises the row max (step 05's
 *                        rescale); the classic online-softmax bug;
 *     mask_off_by_one  — under --causal lets query i see key i + 1.
 *   Each output goes through fa_check(), the library's validator (the same code
 *   as `flashattn check`): it computes the float64 reference, and ALSO a plain
 *   attention emulated in the kernel's precision, and passes the kernel iff
 *   its max error <= 2 x the emulation's error + a small atol
 *   (FlashAttention's own test rule). It points at the worst element.
 * What to look for:
 *   - a fixed tolerance is the wrong question: the correct bf16 kernel's error is
 *     a few 1e-3 here, and so is acc_in_bf16's: "err < 2e-2" passes both;
 *   - the ratio "error / emulation error" separates them: ~1 for correct, far
 *     above 2 for the bugs;
 *   - the .npy files written to build/tutorials/ and the `flashattn check`
 *     command to run on them: the same verdict from the command line.
 */
#include "common.h"

#include <stdint.h>

/* float -> bfloat16 bits, round to nearest even (finite inputs). */
static uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static float bf16_value(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static float bf16_round(float x) { return bf16_value(bf16_bits(x)); }

enum bug { CORRECT, ACC_IN_BF16, NO_RESCALE, MASK_OFF_BY_ONE, NKERNELS };

/*
 * The GPU stand-in: FlashAttention-2 per query row, key blocks of 64.
 * Q: [n][h][d], K, V: [n][h][d] (BSHD, batch 1; values already bf16);
 * O: [n][h][d] bf16 bits; lse: [h][n] float32.
 */
static void gpu_kernel(enum bug bug, int n, int h, int d, int causal, const float *Q, const float *K,
                       const float *V, uint16_t *O, float *lse)
{
    const float scale = 1.0f / sqrtf((float)d);
    float acc[512], s[64];   /* acc [d] (d <= 512), s [64] one block of scores */
    for (int hh = 0; hh < h; hh++)
        for (int i = 0; i < n; i++) {
            const float *q = &Q[((size_t)i * h + hh) * d];
            float m = -INFINITY, l = 0.0f;
            for (int c = 0; c < d; c++) acc[c] = 0.0f;
            for (int j0 = 0; j0 < n; j0 += 64) {
                int jn = j0 + 64 < n ? 64 : n - j0;
                float mt = m;
                for (int jj = 0; jj < jn; jj++) {
                    int j = j0 + jj, last = bug == MASK_OFF_BY_ONE ? i + 1 : i;
                    float x = 0.0f;
                    for (int c = 0; c < d; c++) x += q[c] * K[((size_t)j * h + hh) * d + c];
                    s[jj] = (causal && j > last) ? -INFINITY : x * scale;
                    mt = fmaxf(mt, s[jj]);
                }
                if (mt == -INFINITY) continue;
                float alpha = expf(m - mt);
                l *= alpha;
                if (bug != NO_RESCALE)
                    for (int c = 0; c < d; c++) acc[c] *= alpha;
                for (int jj = 0; jj < jn; jj++) {
                    float p = expf(s[jj] - mt);
                    l += p;
                    float pb = bf16_round(p);          /* P in bf16 before P V, as tensor cores take it */
                    for (int c = 0; c < d; c++) {
                        acc[c] += pb * V[((size_t)(j0 + jj) * h + hh) * d + c];
                        if (bug == ACC_IN_BF16) acc[c] = bf16_round(acc[c]);   /* accumulator kept in bf16 */
                    }
                }
                m = mt;
            }
            for (int c = 0; c < d; c++) O[((size_t)i * h + hh) * d + c] = bf16_bits(l > 0 ? acc[c] / l : 0.0f);
            lse[(size_t)hh * n + i] = l > 0 ? m + logf(l) : -INFINITY;
        }
}

/* Write a float32 or uint16 array as .npy v1.0 (little-endian, C order). */
static void write_npy(const char *path, const void *data, const char *descr, size_t elem, int rank,
                      const int64_t *shape)
{
    char hdr[256], shp[96] = "";
    size_t count = 1;
    for (int r = 0; r < rank; r++) {
        size_t len = strlen(shp);
        snprintf(shp + len, sizeof shp - len, "%lld,%s", (long long)shape[r], r + 1 < rank ? " " : "");
        count *= (size_t)shape[r];
    }
    int len = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr, shp);
    int total = 10 + len + 1, pad = (64 - total % 64) % 64;   /* header ends on a 64-byte boundary */
    FILE *f = fopen(path, "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
    uint16_t hlen = (uint16_t)(len + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f);
    fputc(hlen >> 8, f);
    fwrite(hdr, 1, (size_t)len, f);
    for (int p = 0; p < pad; p++) fputc(' ', f);
    fputc('\n', f);
    fwrite(data, elem, count, f);
    fclose(f);
}

int main(int argc, char **argv)
{
    tut_args a = {.n = {256}, .n_count = 1, .d = 64, .reps = 1};
    tut_parse_args(argc, argv, &a, "14_validate_gpu: is a bf16 kernel's output right? fa_check decides");
    const int n = a.n[0], h = 2, d = a.d;
    if (d > 512) { fprintf(stderr, "--d must be <= 512 here\n"); return 2; }
    /* the kernel's key blocks are 64: with one block, or a sliver of a second, the missing
     * rescale changes nothing (the row max is final after the first block), so that "bug"
     * gives the right answer and fa_check rightly passes it */
    if (n < 128) { fprintf(stderr, "--n must be >= 128 here: the rescale bug needs two key blocks of 64 to show\n"); return 2; }
    int causal = 1;   /* the off-by-one bug needs a mask; --causal is implied */
    tut_banner("Step 14: validating a GPU kernel's output (fa_check / flashattn check)", &a, NULL);

    size_t nhd = (size_t)n * h * d;
    float *Q = tut_alloc(nhd * 4), *K = tut_alloc(nhd * 4), *V = tut_alloc(nhd * 4);   /* [n][h][d] */
    uint16_t *O = tut_alloc(nhd * 2);                                                   /* [n][h][d] bf16 */
    float *lse = tut_alloc((size_t)h * n * 4), *Of = tut_alloc(nhd * 4);               /* [h][n], [n][h][d] */
    double *O_ref = tut_alloc(nhd * 8);                                                 /* [n][h][d] */
    tut_fill(Q, nhd, 5, -2, 2);
    tut_fill(K, nhd, 6, -2, 2);
    tut_fill(V, nhd, 7, -1, 1);
    for (size_t x = 0; x < nhd; x++) { Q[x] = bf16_round(Q[x]); K[x] = bf16_round(K[x]); V[x] = bf16_round(V[x]); }

    fa_tensor tq, tk, tv, to, tl, tr;
    int64_t shape[4] = {1, n, h, d}, lshape[3] = {1, h, n};
    fa_tensor_make(&tq, Q, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tk, K, FA_F32, 4, shape, NULL);
    fa_tensor_make(&tv, V, FA_F32, 4, shape, NULL);
    fa_tensor_make(&to, O, FA_BF16, 4, shape, NULL);
    fa_tensor_make(&tl, lse, FA_F32, 3, lshape, NULL);
    fa_tensor_make(&tr, O_ref, FA_F64, 4, shape, NULL);
    fa_options opt = fa_options_default();
    opt.causal = causal;
    opt.impl = FA_IMPL_REFERENCE;
    if (fa_forward(&tq, &tk, &tv, &tr, NULL, &opt) != FA_OK) { fprintf(stderr, "%s\n", fa_last_error()); return 1; }

    char dir[256];
    snprintf(dir, sizeof dir, "%s", a.out ? a.out : "build/tutorials");
    mkdir("build", 0777);
    mkdir(dir, 0777);
    char path[512];
    snprintf(path, sizeof path, "%s/14_q.npy", dir); write_npy(path, Q, "<f4", 4, 4, shape);
    snprintf(path, sizeof path, "%s/14_k.npy", dir); write_npy(path, K, "<f4", 4, 4, shape);
    snprintf(path, sizeof path, "%s/14_v.npy", dir); write_npy(path, V, "<f4", 4, 4, shape);

    printf("   Problem: batch 1, N = %d, heads %d, d = %d, causal, bf16 inputs (BSHD).\n\n", n, h, d);
    printf("   %-16s | %9s | %-10s | %-7s | %9s | %8s | %-30s | %8s\n", "kernel", "max err", "err < 2e-2",
           "fa_check", "err/emul", "failing", "worst (row, head, col): test/ref", "LSE err");
    FILE *dat = tut_dat_open(&a, "14", "kernel max_err emu_err ratio pass n_fail lse_err");
    const char *names[NKERNELS] = {"correct", "acc_in_bf16", "no_rescale", "mask_off_by_one"};
    int verdict[NKERNELS];
    for (int b = 0; b < NKERNELS; b++) {
        gpu_kernel((enum bug)b, n, h, d, causal, Q, K, V, O, lse);
        double err = 0;
        for (size_t x = 0; x < nhd; x++) err = fmax(err, fabs((double)bf16_value(O[x]) - O_ref[x]));
        fa_check_options co = fa_check_options_default();
        fa_check_report rep = fa_check_report_init();
        fa_status st = fa_check(&tq, &tk, &tv, &to, &tl, &opt, &co, &rep);
        if (st != FA_OK) { fprintf(stderr, "fa_check: %s\n", fa_last_error()); return 1; }
        char worst[64];
        snprintf(worst, sizeof worst, "(%lld, %lld, %lld): %.4f/%.4f", (long long)rep.worst_row,
                 (long long)rep.worst_head, (long long)rep.worst_col, rep.worst_test, rep.worst_ref);
        printf("   %-16s | %9.2e | %-10s | %-7s | %9.2f | %8lld | %-30s | %8.1e\n", names[b], err,
               err < 2e-2 ? "pass" : "FAIL", rep.pass ? "pass" : "FAIL", rep.ratio, (long long)rep.n_fail, worst,
               rep.lse_max_abs_err);
        fprintf(dat, "%s %g %g %g %d %lld %g\n", names[b], err, rep.emu_max_abs_err, rep.ratio, rep.pass,
                (long long)rep.n_fail, rep.lse_max_abs_err);
        verdict[b] = rep.pass;
        if (b == 0) {   /* the full report once, exactly as `flashattn check` prints it */
            char text[4096];
            fa_check_report_format(&rep, text, sizeof text);
            printf("\n--- fa_check report for `correct` (what `flashattn check` prints) ---\n%s---\n\n", text);
        }
        fa_check_report_free(&rep);
        for (size_t x = 0; x < nhd; x++) Of[x] = bf16_value(O[x]);
        snprintf(path, sizeof path, "%s/14_out_%s.npy", dir, names[b]);
        write_npy(path, Of, "<f4", 4, 4, shape);
    }
    fclose(dat);
    free(Q); free(K); free(V); free(O); free(lse); free(Of); free(O_ref);
    if (!verdict[0] || verdict[1] || verdict[2] || verdict[3]) {
        fprintf(stderr, "FAILED: fa_check should pass `correct` and fail every bug\n");
        return 1;
    }
    printf("\n   Same verdicts from the command line (exit status 0 = pass, 1 = mismatch):\n");
    for (int b = 0; b < NKERNELS; b++)
        printf("     ./build/flashattn check -q %s/14_q.npy -k %s/14_k.npy -v %s/14_v.npy \\\n"
               "         --out %s/14_out_%s.npy --causal --dtype bf16\n", dir, dir, dir, dir, names[b]);
    printf("\n   Try: --n 2048 (the rescale bug grows with more key blocks), --d 128; add\n"
           "   --sample-rows 64 to the command to check 64 random rows per head in O(64 N d).\n");
    return 0;
}
