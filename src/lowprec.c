/*
 * lowprec.c — low-precision inputs (FP8 e4m3fn / e5m2, FP4 e2m1, INT8) and
 * the pieces of the low-precision check rule.
 *
 *   - Decoding is exact: a code's value follows from its bit fields (sign,
 *     exponent, mantissa; bias 7 / 15 / 1), and fa_dequantize builds the
 *     256-entry table of the format once per call and multiplies by the
 *     scale in float64 (a code times an fp32 scale is exact in float64).
 *   - Encoding rounds to nearest, ties to even, and saturates to the
 *     largest finite value, as the GPU conversions do (cvt.rn.satfinite).
 *   - The check rule's baseline rounds the normalized P to the format
 *     (fa_lp_round_p); the kernel model emulates FlashAttention-3's FP8 data
 *     path row by row (fa_lp_model_row).
 *
 * Nothing here is proportional to seqlen_q x seqlen_k: the model keeps one
 * key block of probabilities and one output row per thread.
 */
#include "internal.h"
#include "lowprec.h"

#include <float.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define DIM(x) ((long long)(x))

/* ------------------------------------------------------------------------ */
/* Formats                                                                   */
/* ------------------------------------------------------------------------ */

/* A minifloat: exponent bits, mantissa bits, bias, largest finite value. */
typedef struct minifloat {
    int ebits, mbits, bias;
    double max;
} minifloat;

static int minifloat_of(int format, minifloat *f)
{
    switch (format) {
    case FA_QF_E4M3: *f = (minifloat){4, 3, 7, 448.0}; return 1;
    case FA_QF_E5M2: *f = (minifloat){5, 2, 15, 57344.0}; return 1;
    case FA_QF_E2M1: *f = (minifloat){2, 1, 1, 6.0}; return 1;
    default: return 0;
    }
}

const char *fa_qformat_name(int format)
{
    switch (format) {
    case FA_QF_NONE: return "none";
    case FA_QF_E4M3: return "e4m3";
    case FA_QF_E5M2: return "e5m2";
    case FA_QF_E2M1: return "e2m1";
    case FA_QF_INT8: return "int8";
    case FA_QF_E8M0: return "e8m0";
    default: return NULL;
    }
}

fa_qformat fa_qformat_parse(const char *name)
{
    if (!name) return FA_QF_NONE;
    if (!strcmp(name, "e4m3fn")) return FA_QF_E4M3;
    for (int f = FA_QF_E4M3; f < FA_QF_COUNT; f++)
        if (!strcmp(name, fa_qformat_name(f))) return (fa_qformat)f;
    return FA_QF_NONE;
}

double fa_qformat_decode(int format, unsigned code)
{
    if (code > 255) return NAN;
    if (format == FA_QF_INT8) return (double)(int8_t)(uint8_t)code;
    if (format == FA_QF_E8M0) return code == 255 ? NAN : ldexp(1.0, (int)code - 127);
    minifloat f;
    if (!minifloat_of(format, &f)) return NAN;
    const int width = 1 + f.ebits + f.mbits;
    if (code >> width) return NAN; /* e2m1: not a code (upper nibble set) */
    const unsigned sign = (code >> (width - 1)) & 1u;
    const unsigned e = (code >> f.mbits) & ((1u << f.ebits) - 1u);
    const unsigned m = code & ((1u << f.mbits) - 1u);
    const unsigned emax = (1u << f.ebits) - 1u;
    double v;
    if (format == FA_QF_E4M3 && e == emax && m == (1u << f.mbits) - 1u) return NAN;
    if (format == FA_QF_E5M2 && e == emax) {
        if (m) return NAN;
        v = INFINITY;
    } else if (e == 0) {
        v = ldexp((double)m, 1 - f.bias - f.mbits); /* subnormal: 0.m * 2^(1-bias) */
    } else {
        v = ldexp((double)((1u << f.mbits) | m), (int)e - f.bias - f.mbits);
    }
    return sign ? -v : v;
}

fa_status fa_qformat_table(int format, double table[256])
{
    if (!table) return fa_fail(FA_ERR_NULL_ARG, "fa_qformat_table: table is NULL");
    if (format <= FA_QF_NONE || format >= FA_QF_COUNT)
        return fa_fail(FA_ERR_OPTION, "fa_qformat_table: unknown format %d", format);
    for (unsigned c = 0; c < 256; c++) table[c] = fa_qformat_decode(format, c);
    return FA_OK;
}

unsigned fa_qformat_encode(int format, double x)
{
    if (format == FA_QF_INT8) {
        if (isnan(x)) return 0;
        double r = x >= 127.0 ? 127.0 : x <= -127.0 ? -127.0 : nearbyint(x);
        return (unsigned)(uint8_t)(int8_t)r;
    }
    if (format == FA_QF_E8M0) {
        if (isnan(x) || x <= 0.0) return 255u; /* no zero or negative power of two */
        if (isinf(x)) return 254u;
        int e;
        double m = frexp(x, &e); /* x = m 2^e, m in [0.5, 1) */
        /* nearest power of two, ties (m = 0.75 is not a tie in log space; use value space) to even exponent */
        double lo = ldexp(1.0, e - 1), hi = ldexp(1.0, e);
        int k = (x - lo < hi - x) ? e - 1 : (x - lo > hi - x) ? e : (((e - 1) & 1) ? e : e - 1);
        (void)m;
        k += 127;
        if (k < 0) k = 0;
        if (k > 254) k = 254;
        return (unsigned)k;
    }
    minifloat f;
    if (!minifloat_of(format, &f)) return 0;
    const int width = 1 + f.ebits + f.mbits;
    const unsigned sign_bit = 1u << (width - 1);
    if (isnan(x)) {
        if (format == FA_QF_E4M3) return 0x7fu;
        if (format == FA_QF_E5M2) return 0x7fu;
        return 0; /* e2m1 has no NaN */
    }
    const unsigned sign = signbit(x) ? sign_bit : 0u;
    const double a = fabs(x);
    const unsigned emax_field = (1u << f.ebits) - 1u;
    /* the largest finite code: e4m3 S.1111.110, e5m2 S.11110.11, e2m1 S.11.1 */
    const unsigned max_code = format == FA_QF_E4M3 ? 0x7eu
                              : format == FA_QF_E5M2 ? ((emax_field - 1u) << f.mbits) | ((1u << f.mbits) - 1u)
                                                     : 0x7u;
    if (a >= f.max) return sign | max_code; /* satfinite: inf and overflow saturate */
    const int emin = 1 - f.bias;
    int e;
    frexp(a, &e);
    e -= 1; /* a in [2^e, 2^(e+1)) */
    if (a == 0.0 || e < emin) e = emin;
    double n = nearbyint(ldexp(a, f.mbits - e)); /* ties to even (default rounding mode) */
    if (n >= (double)(2u << f.mbits)) { /* rounded up into the next binade */
        n = (double)(1u << f.mbits);
        e += 1;
    }
    if (ldexp(n, e - f.mbits) > f.max) return sign | max_code;
    unsigned field, mant;
    if (n < (double)(1u << f.mbits)) { /* subnormal (only at e = emin) */
        field = 0;
        mant = (unsigned)n;
    } else {
        field = (unsigned)(e + f.bias);
        mant = (unsigned)n - (1u << f.mbits);
    }
    return sign | (field << f.mbits) | mant;
}

double fa_lp_round(int format, double x)
{
    return fa_qformat_decode(format, fa_qformat_encode(format, x));
}

int fa_lp_p_format(int qkv_format)
{
    return qkv_format == FA_QF_INT8 ? FA_QF_E4M3 : qkv_format;
}

/* ------------------------------------------------------------------------ */
/* Dequantization                                                            */
/* ------------------------------------------------------------------------ */

int64_t fa_qscale_block(int scale_kind)
{
    return scale_kind == FA_QSCALE_NVFP4 ? 16 : scale_kind == FA_QSCALE_MXFP4 ? 32 : 0;
}

static const char *kind_name(int kind)
{
    switch (kind) {
    case FA_QSCALE_NONE: return "none";
    case FA_QSCALE_TENSOR: return "per-tensor";
    case FA_QSCALE_HEAD: return "per-(batch, head)";
    case FA_QSCALE_NVFP4: return "nvfp4";
    case FA_QSCALE_MXFP4: return "mxfp4";
    default: return "?";
    }
}

static void shape_text(const int64_t s[4], char *buf, size_t n)
{
    snprintf(buf, n, "[%lld, %lld, %lld, %lld]", DIM(s[0]), DIM(s[1]), DIM(s[2]), DIM(s[3]));
}

/* The code of logical element (a, b, c, e) (C order over x->shape). */
static inline unsigned code_at(const fa_qtensor *x, int64_t flat)
{
    if (!x->packed) return x->codes[flat];
    const uint8_t byte = x->codes[flat >> 1];
    return (flat & 1) ? (unsigned)(byte >> 4) : (unsigned)(byte & 0x0fu);
}

fa_status fa_dequantize(const fa_qtensor *x, const char *name, fa_tensor *out)
{
    const char *nm = name && *name ? name : "tensor";
    if (!x || !out) return fa_fail(FA_ERR_NULL_ARG, "fa_dequantize: %s is NULL", !x ? "input" : "output");
    if (x->format <= FA_QF_NONE || x->format >= FA_QF_E8M0)
        return fa_fail(FA_ERR_OPTION, "%s: unknown low-precision format %d (e4m3, e5m2, e2m1 or int8)", nm,
                       x->format);
    if (x->packed && x->format != FA_QF_E2M1)
        return fa_fail(FA_ERR_OPTION, "%s: only e2m1 codes can be packed two per byte (format %s)", nm,
                       fa_qformat_name(x->format));
    if (!x->codes) return fa_fail(FA_ERR_NULL_ARG, "%s: codes are NULL", nm);
    for (int a = 0; a < 4; a++)
        if (x->shape[a] < 1 || x->shape[a] > (INT64_MAX >> 8))
            return fa_fail(FA_ERR_SHAPE, "%s: extent %lld of dimension %d is out of range", nm,
                           DIM(x->shape[a]), a);
    if (x->packed && (x->shape[3] & 1))
        return fa_fail(FA_ERR_SHAPE, "%s: packed e2m1 needs an even last dimension (got %lld)", nm,
                       DIM(x->shape[3]));
    if (out->dtype != FA_F32 && out->dtype != FA_F64)
        return fa_fail(FA_ERR_DTYPE, "%s: dequantized output must be f32 or f64", nm);
    if (out->rank != 4 || !out->data)
        return fa_fail(FA_ERR_SHAPE, "%s: dequantized output must be a rank-4 tensor with data", nm);
    for (int a = 0; a < 4; a++)
        if (out->shape[a] != x->shape[a]) {
            char s1[96], s2[96];
            shape_text(out->shape, s1, sizeof s1);
            shape_text(x->shape, s2, sizeof s2);
            return fa_fail(FA_ERR_SHAPE, "%s: output shape %s differs from the codes' %s", nm, s1, s2);
        }
    const int64_t B = x->shape[0], S = x->shape[1], H = x->shape[2], D = x->shape[3];
    const int kind = x->scale_kind;
    const int64_t blk = fa_qscale_block(kind);
    const int axis = x->scale_axis == 0 ? 3 : x->scale_axis;
    double global = 1.0;
    int64_t bshape[4] = {0, 0, 0, 0};

    /* a scale of another kind would be ignored, and the values silently not what the caller
     * meant: refused (0, the zeroed struct's value, means "not given") */
    if (kind >= FA_QSCALE_NONE && kind < FA_QSCALE_COUNT) {
        if (kind != FA_QSCALE_TENSOR && x->scale != 0.0)
            return fa_fail(FA_ERR_OPTION, "%s: a per-tensor scale (%g) is given but the scale kind is %s; "
                           "it applies only to FA_QSCALE_TENSOR", nm, x->scale, kind_name(kind));
        if (kind != FA_QSCALE_NVFP4 && x->global_scale != 0.0)
            return fa_fail(FA_ERR_OPTION, "%s: a global scale (%g) is given but the scale kind is %s; "
                           "it applies only to NVFP4 block scales", nm, x->global_scale, kind_name(kind));
    }

    switch (kind) {
    case FA_QSCALE_NONE: break;
    case FA_QSCALE_TENSOR:
        if (!isfinite(x->scale))
            return fa_fail(FA_ERR_NONFINITE, "%s: the per-tensor scale is %g; scales must be finite", nm, x->scale);
        break;
    case FA_QSCALE_HEAD:
        if (!x->head_scale) return fa_fail(FA_ERR_NULL_ARG, "%s: per-(batch, head) scales are NULL", nm);
        if (x->scale_heads < 1 || H % x->scale_heads != 0)
            return fa_fail(FA_ERR_SHAPE, "%s: %lld scale heads do not divide the tensor's %lld heads", nm,
                           DIM(x->scale_heads), DIM(H));
        for (int64_t e = 0; e < B * x->scale_heads; e++)
            if (!isfinite(x->head_scale[e]))
                return fa_fail(FA_ERR_NONFINITE, "%s: scale [%lld, %lld] is %s; scales must be finite", nm,
                               DIM(e / x->scale_heads), DIM(e % x->scale_heads),
                               isnan(x->head_scale[e]) ? "NaN" : "Inf");
        break;
    case FA_QSCALE_NVFP4:
    case FA_QSCALE_MXFP4: {
        if (!x->block_scale) return fa_fail(FA_ERR_NULL_ARG, "%s: %s block scales are NULL", nm, kind_name(kind));
        if (axis != 3 && axis != 1)
            return fa_fail(FA_ERR_OPTION, "%s: block scales run along axis 3 (head dim) or 1 (tokens), not %d",
                           nm, x->scale_axis);
        for (int a = 0; a < 4; a++) bshape[a] = x->shape[a];
        bshape[axis] = (x->shape[axis] + blk - 1) / blk;
        for (int a = 0; a < 4; a++)
            if (x->block_scale_shape[a] != bshape[a]) {
                char s1[96], s2[96];
                shape_text(x->block_scale_shape, s1, sizeof s1);
                shape_text(bshape, s2, sizeof s2);
                return fa_fail(FA_ERR_SHAPE,
                               "%s: %s block scales have shape %s, should be %s (one per %lld elements "
                               "along the %s)",
                               nm, kind_name(kind), s1, s2, DIM(blk), axis == 3 ? "head dim" : "tokens");
            }
        if (kind == FA_QSCALE_NVFP4) {
            if (!isfinite(x->global_scale))
                return fa_fail(FA_ERR_NONFINITE, "%s: the global scale is %g; scales must be finite", nm,
                               x->global_scale);
            /* an fp32 scale > 0 (block scales must not be negative either), used as its float32
             * value as the CLI and Python do; -0.0, or a value float32 rounds to 0 or infinity,
             * would not mean what the caller meant */
            if (x->global_scale != 0.0) global = (double)(float)x->global_scale;
            if (signbit(x->global_scale) || !(global > 0.0) || !isfinite(global))
                return fa_fail(FA_ERR_OPTION, "%s: the global scale is %.9g; it must be a finite float32 > 0 "
                               "(0 means 1)", nm, x->global_scale);
        }
        const int64_t nb = bshape[0] * bshape[1] * bshape[2] * bshape[3];
        for (int64_t e = 0; e < nb; e++) {
            const unsigned c = x->block_scale[e];
            const double v = fa_qformat_decode(kind == FA_QSCALE_NVFP4 ? FA_QF_E4M3 : FA_QF_E8M0, c);
            if (isnan(v))
                return fa_fail(FA_ERR_NONFINITE, "%s: block scale %lld (code 0x%02x) is NaN", nm, DIM(e), c);
            if (v < 0.0 || (v == 0.0 && (c & 0x80u)))
                return fa_fail(FA_ERR_FORMAT, "%s: block scale %lld (code 0x%02x) is negative; NVFP4 "
                               "block scales are unsigned e4m3", nm, DIM(e), c);
        }
        break;
    }
    default:
        return fa_fail(FA_ERR_OPTION, "%s: unknown scale kind %d", nm, kind);
    }

    double table[256];
    fa_qformat_table(x->format, table);
    /* refuse bad codes before writing anything */
    const int64_t n = B * S * H * D;
    for (int64_t e = 0; e < n; e++) {
        const unsigned c = code_at(x, e);
        if (!isfinite(table[c])) {
            const int64_t i3 = e % D, i2 = (e / D) % H, i1 = (e / D / H) % S, i0 = e / D / H / S;
            if (x->format == FA_QF_E2M1)
                return fa_fail(FA_ERR_FORMAT, "%s: element [%lld,%lld,%lld,%lld] has byte 0x%02x, not an e2m1 "
                               "code (0x00..0x0f; two codes a byte are read as packed: fa_qtensor.packed, "
                               "the CLI's --fp4-packed, Python's packed=True)",
                               nm, DIM(i0), DIM(i1), DIM(i2), DIM(i3), c);
            return fa_fail(FA_ERR_NONFINITE, "%s: element [%lld,%lld,%lld,%lld] is code 0x%02x = %s in %s; "
                           "inputs must be finite", nm, DIM(i0), DIM(i1), DIM(i2), DIM(i3), c,
                           isnan(table[c]) ? "NaN" : "Inf", fa_qformat_name(x->format));
        }
    }
    /* pass 0 checks that every value fits a float32 output (a code times its scales can pass
     * FLT_MAX: e4m3's 448 under a scale of 1e38), pass 1 writes: nothing is written on refusal */
    const int64_t group = kind == FA_QSCALE_HEAD ? H / x->scale_heads : 1;
    for (int pass = out->dtype == FA_F32 ? 0 : 1; pass < 2; pass++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t s = 0; s < S; s++)
                for (int64_t h = 0; h < H; h++) {
                    double hs = 1.0;
                    if (kind == FA_QSCALE_TENSOR) hs = x->scale;
                    if (kind == FA_QSCALE_HEAD) hs = (double)x->head_scale[b * x->scale_heads + h / group];
                    const int64_t base = ((b * S + s) * H + h) * D;
                    for (int64_t c = 0; c < D; c++) {
                        const unsigned code = code_at(x, base + c);
                        double v = table[code] * hs;
                        if (blk) {
                            const int64_t s2 = axis == 1 ? s / blk : s, c2 = axis == 3 ? c / blk : c;
                            const unsigned sc =
                                x->block_scale[((b * bshape[1] + s2) * bshape[2] + h) * bshape[3] + c2];
                            v *= fa_qformat_decode(kind == FA_QSCALE_NVFP4 ? FA_QF_E4M3 : FA_QF_E8M0, sc) * global;
                        }
                        if (pass == 1) {
                            fa_store_f64(out, fa_off4(out, b, s, h, c), v);
                        } else if (!(fabs(v) <= (double)FLT_MAX)) {
                            return fa_fail(FA_ERR_NONFINITE,
                                           "%s: element [%lld,%lld,%lld,%lld] (code 0x%02x = %g in %s) dequantizes "
                                           "to %g with its scales, beyond float32 (3.4e38); inputs must be finite",
                                           nm, DIM(b), DIM(s), DIM(h), DIM(c), code, table[code],
                                           fa_qformat_name(x->format), v);
                        }
                    }
                }
    fa_clear_error();
    return FA_OK;
}

/* ------------------------------------------------------------------------ */
/* The check rule: the baseline's P and the kernel model                      */
/* ------------------------------------------------------------------------ */

void fa_lp_round_p(int p_format, float *e, int64_t n, float sum)
{
    if (p_format != FA_QF_E2M1) {
        /* The normalized P rounded after a power-of-two row scale 2^k that brings the row's
         * largest P into [128, 256). Scaling by 2^k is exact and moves no P across a rounding
         * boundary while P and P 2^k are both normal numbers of the format, so wherever P is
         * normal this is the unscaled rounding bit for bit; the small P keep the format's relative precision instead of
         * going subnormal and then to zero. Without it, once seqlen_k is about 1000 most of
         * a row's P lies below e4m3's smallest subnormal (2^-9), the baseline's output is
         * about 0, its error about max|ref|, and the rule 2 x that error passed an all-zero
         * output. Real FP8 kernels scale P the same way (FA3: 256 exp(s - m)). */
        float mx = 0.0f;
        for (int64_t j = 0; j < n; j++) {
            const float pj = e[j] / sum;
            if (pj > mx) mx = pj;
        }
        int ex = 0;
        if (mx > 0.0f && isfinite(mx)) (void)frexp((double)mx, &ex);
        const int k = mx > 0.0f && isfinite(mx) ? 8 - ex : 0; /* mx 2^k in [128, 256) */
        const double up = ldexp(1.0, k), down = ldexp(1.0, -k);
        for (int64_t j = 0; j < n; j++) e[j] = (float)(fa_lp_round(p_format, (double)(e[j] / sum) * up) * down);
        return;
    }
    const float span = 448.0f * 6.0f; /* P scaled so that a block scale max/6 fills e4m3's range */
    for (int64_t j0 = 0; j0 < n; j0 += 16) {
        const int64_t j1 = j0 + 16 < n ? j0 + 16 : n;
        float mx = 0.0f;
        for (int64_t j = j0; j < j1; j++) {
            const float pt = e[j] / sum * span;
            e[j] = pt;
            if (pt > mx) mx = pt;
        }
        const float sc = mx / 6.0f;
        const double sc8 = fa_lp_round(FA_QF_E4M3, sc);
        for (int64_t j = j0; j < j1; j++)
            e[j] = sc > 0.0f ? (float)(fa_lp_round(FA_QF_E2M1, e[j] / sc) * sc8 / span) : 0.0f;
    }
}

#define MODEL_BLOCK_N 128

int fa_lp_model_scratch_alloc(fa_lp_model_scratch *s, const fa_problem *p)
{
    s->pt = fa_malloc(MODEL_BLOCK_N * sizeof(float));
    s->acc = fa_malloc((size_t)p->dv * sizeof(float));
    s->vrow = fa_malloc((size_t)p->dv * sizeof(float));
    if (s->pt && s->acc && s->vrow) return 1;
    fa_lp_model_scratch_free(s);
    return 0;
}

void fa_lp_model_scratch_free(fa_lp_model_scratch *s)
{
    fa_free(s->pt);
    fa_free(s->acc);
    fa_free(s->vrow);
    s->pt = NULL;
    s->acc = NULL;
    s->vrow = NULL;
}

/*
 * FlashAttention-3's FP8 forward for one row (hopper/softmax.h and the sm90
 * mainloop, as read): key blocks of 128 from the last to the first; a running
 * max m; p~ = exp2((s - m) log2 e + 8) = 256 exp(s - m), in (0, 256]; the row
 * sum adds the unrounded p~; P.V uses p~ rounded to the format, accumulated
 * in float32; when m grows, sum and accumulator are rescaled by exp(m_old -
 * m). The output is acc / sum, rounded to bf16 (the kernel's output dtype).
 *
 * SageAttention (csrc/qattn/attn_utils.cuh, sageattn3 softmax_fused.h, as
 * read): the same online softmax with key blocks visited first to last; FP8
 * P with the static offset log2 448 (p~ in (0, 448]), blocks of 64; FP4
 * (SageAttention3) p~ = 448*6 exp(s - m), and per 16 keys a scale max/6: the
 * elements rounded to e2m1 against the fp32 scale, multiplied back by the
 * scale rounded to e4m3, blocks of 128.
 */
void fa_lp_model_row(int model, int p_format, const fa_rows *vs, int64_t dv, const float *s, int64_t lo,
                     int64_t hi, fa_lp_model_scratch *sc, double *out, int64_t *n_sat)
{
    const int sage = model == FA_KERNEL_MODEL_SAGE, fp4 = p_format == FA_QF_E2M1;
    const int64_t bn = sage && !fp4 ? 64 : MODEL_BLOCK_N;
    const float offset = !sage ? 8.0f : fp4 ? 11.392317422778761f /* log2(448*6) */ : 8.807354922057604f;
    const float log2e = 1.4426950408889634f;
    const double pmax = p_format == FA_QF_E5M2 ? 57344.0 : fp4 ? 448.0 * 6.0 : 448.0;
    float m = -INFINITY, l = 0.0f;
    for (int64_t c = 0; c < dv; c++) sc->acc[c] = 0.0f;
    if (hi <= lo) {
        for (int64_t c = 0; c < dv; c++) out[c] = 0.0;
        return;
    }
    const int64_t nb_lo = lo / bn, nb_hi = (hi - 1) / bn;
    for (int64_t step = 0; step <= nb_hi - nb_lo; step++) {
        const int64_t nb = sage ? nb_lo + step : nb_hi - step; /* FA3: last to first */
        const int64_t j0 = nb * bn > lo ? nb * bn : lo;
        const int64_t j1 = (nb + 1) * bn < hi ? (nb + 1) * bn : hi;
        float mb = m;
        for (int64_t j = j0; j < j1; j++)
            if (s[j] > mb) mb = s[j];
        if (mb > m) {
            const float r = m == -INFINITY ? 0.0f : exp2f((m - mb) * log2e);
            l *= r;
            for (int64_t c = 0; c < dv; c++) sc->acc[c] *= r;
            m = mb;
        }
        for (int64_t j = j0; j < j1; j++) {
            const float pt = exp2f((s[j] - m) * log2e + offset);
            sc->pt[j - j0] = pt;
            l += pt;
            if (pt > pmax) (*n_sat)++;
        }
        if (fp4) { /* two-level: e2m1 elements under an e4m3 scale per 16 keys (absolute key index) */
            for (int64_t g0 = j0; g0 < j1; g0 = (g0 / 16 + 1) * 16) {
                const int64_t g1 = (g0 / 16 + 1) * 16 < j1 ? (g0 / 16 + 1) * 16 : j1;
                float mx = 0.0f;
                for (int64_t j = g0; j < g1; j++)
                    if (sc->pt[j - j0] > mx) mx = sc->pt[j - j0];
                const float scl = mx / 6.0f;
                const float scl8 = (float)fa_lp_round(FA_QF_E4M3, scl);
                for (int64_t j = g0; j < g1; j++)
                    sc->pt[j - j0] = scl > 0.0f ? (float)fa_lp_round(FA_QF_E2M1, sc->pt[j - j0] / scl) * scl8 : 0.0f;
            }
        } else {
            for (int64_t j = j0; j < j1; j++) sc->pt[j - j0] = (float)fa_lp_round(p_format, sc->pt[j - j0]);
        }
        for (int64_t j = j0; j < j1; j++) {
            const float p8 = sc->pt[j - j0];
            if (p8 == 0.0f) continue;
            fa_rows_gather(vs, j, sc->vrow);
            for (int64_t c = 0; c < dv; c++) sc->acc[c] += p8 * sc->vrow[c];
        }
    }
    for (int64_t c = 0; c < dv; c++)
        out[c] = (double)fa_bf16_to_f32(fa_f32_to_bf16(sc->acc[c] / l));
}
