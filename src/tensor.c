/*
 * tensor.c — tensor descriptors, dtype names and sizes, gathering rows.
 */
#include "tensor.h"

#include <limits.h>

#include "kernels/kernels.h"
#include "status.h"

size_t fa_dtype_size(fa_dtype dtype)
{
    switch (dtype) {
    case FA_F32: return 4;
    case FA_F64: return 8;
    case FA_F16: return 2;
    case FA_BF16: return 2;
    default: return 0;
    }
}

const char *fa_dtype_name(fa_dtype dtype)
{
    switch (dtype) {
    case FA_F32: return "f32";
    case FA_F64: return "f64";
    case FA_F16: return "f16";
    case FA_BF16: return "bf16";
    default: return "invalid";
    }
}

fa_status fa_tensor_make(fa_tensor *t, void *data, fa_dtype dtype, int rank,
                         const int64_t *shape, const int64_t *stride)
{
    if (!t || !shape) return fa_fail(FA_ERR_NULL_ARG, "fa_tensor_make: null argument");
    if (rank < 1 || rank > FA_MAX_RANK)
        return fa_fail(FA_ERR_SHAPE, "fa_tensor_make: rank %d is outside 1..%d", rank, FA_MAX_RANK);
    if (fa_dtype_size(dtype) == 0)
        return fa_fail(FA_ERR_DTYPE, "fa_tensor_make: invalid dtype %d", (int)dtype);
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->rank = rank;
    /* Any zero extent makes the tensor empty, whatever the other extents are
     * (the rule of the .npy reader and of the validator): its element count is
     * 0 and cannot overflow, and since no element is ever addressed its
     * default strides merely saturate. */
    int empty = 0;
    for (int r = 0; r < rank; r++)
        if (shape[r] == 0) empty = 1;
    int64_t running = 1;
    for (int r = rank - 1; r >= 0; r--) {
        if (shape[r] < 0)
            return fa_fail(FA_ERR_SHAPE, "fa_tensor_make: dimension %d is negative (%lld)", r,
                           (long long)shape[r]);
        t->shape[r] = shape[r];
        t->stride[r] = stride ? stride[r] : running;
        if (shape[r] > 1 && running > INT64_MAX / shape[r]) {
            if (!empty) return fa_fail(FA_ERR_SHAPE, "fa_tensor_make: element count overflows 64 bits");
            running = INT64_MAX;
        } else {
            running *= shape[r] > 0 ? shape[r] : 1;
        }
    }
    return FA_OK;
}

int64_t fa_tensor_numel(const fa_tensor *t)
{
    if (!t) return 0;
    if (t->rank < 1 || t->rank > FA_MAX_RANK) return -1;
    for (int r = 0; r < t->rank; r++)
        if (t->shape[r] < 0) return -1;
    for (int r = 0; r < t->rank; r++)
        if (t->shape[r] == 0) return 0; /* empty, whatever the other extents */
    int64_t n = 1;
    for (int r = 0; r < t->rank; r++) {
        if (n > INT64_MAX / t->shape[r]) return -1; /* overflows */
        n *= t->shape[r];
    }
    return n;
}

double fa_tensor_get(const fa_tensor *t, const int64_t *index)
{
    if (!t || !index || !t->data || t->rank < 1 || t->rank > FA_MAX_RANK) return NAN;
    int64_t off = 0;
    for (int r = 0; r < t->rank; r++) {
        if (index[r] < 0 || index[r] >= t->shape[r]) return NAN;
        off += index[r] * t->stride[r];
    }
    return fa_load_f64(t, off);
}

void fa_gather_f32(const fa_tensor *t, int64_t off, int64_t inc, int64_t n, float *dst)
{
    if (t->dtype == FA_F32 && inc == 1) {
        memcpy(dst, (const float *)t->data + off, (size_t)n * sizeof(float));
        return;
    }
    if ((t->dtype == FA_F16 || t->dtype == FA_BF16) && inc == 1 && n <= INT_MAX) {
        /* contiguous halves: the kernel table's SIMD widen (F16C, shifts). The
         * conversion is exact, so any table gives the same floats; this is the
         * one the process uses (FA_ISA included), chosen once and cached. */
        fa_status st;
        const fa_kernels *k = fa_kernels_get(&st);
        if (k && k->widen) {
            k->widen((int)n, (const uint16_t *)t->data + off, t->dtype == FA_BF16, dst);
            return;
        }
    }
    for (int64_t i = 0; i < n; i++) dst[i] = fa_load_f32(t, off + i * inc);
}

void fa_gather_f64(const fa_tensor *t, int64_t off, int64_t inc, int64_t n, double *dst)
{
    switch (t->dtype) { /* the dtype switch hoisted out of the element loop */
    case FA_F32: {
        const float *s = (const float *)t->data + off;
        for (int64_t c = 0; c < n; c++) dst[c] = s[c * inc];
        break;
    }
    case FA_F64: {
        const double *s = (const double *)t->data + off;
        for (int64_t c = 0; c < n; c++) dst[c] = s[c * inc];
        break;
    }
    case FA_F16: {
        const uint16_t *s = (const uint16_t *)t->data + off;
        for (int64_t c = 0; c < n; c++) dst[c] = fa_f16_to_f32(s[c * inc]);
        break;
    }
    case FA_BF16: {
        const uint16_t *s = (const uint16_t *)t->data + off;
        for (int64_t c = 0; c < n; c++) dst[c] = fa_bf16_to_f32(s[c * inc]);
        break;
    }
    default:
        for (int64_t c = 0; c < n; c++) dst[c] = NAN;
        break;
    }
}
