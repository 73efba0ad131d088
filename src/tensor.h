/*
 * tensor.h — element access and conversion of strided tensors.
 *
 * Offsets are in elements: element (i0, i1, i2, i3) of a rank-4 tensor lives
 * at data + i0*stride[0] + i1*stride[1] + i2*stride[2] + i3*stride[3].
 * Conversions round to nearest even; NaN stays NaN (quiet), overflow gives Inf.
 */
#ifndef FA_TENSOR_H
#define FA_TENSOR_H

#include "flashattn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Offset of element (i0, i1, i2, i3) of a rank-4 tensor. */
static inline int64_t fa_off4(const fa_tensor *t, int64_t i0, int64_t i1, int64_t i2, int64_t i3)
{
    return i0 * t->stride[0] + i1 * t->stride[1] + i2 * t->stride[2] + i3 * t->stride[3];
}


static inline float fa_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalize */
            int e = -1;
            do { e++; man <<= 1; } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round-to-nearest-even float32 -> float16 (overflow to inf, NaN kept quiet). */
static inline uint16_t fa_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0));
    if (ax >= 0x477ff000u) /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (uint16_t)sign; /* < 2^-25 rounds to 0 */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) + ... bits dropped */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1))) r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ax - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t lsb = (r >> 13) & 1u;
    r += 0xfffu + lsb;
    return (uint16_t)(sign | (r >> 13));
}

static inline float fa_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline uint16_t fa_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40u); /* quiet NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* A float32 value rounded to dt and back (identity for f32 and f64): the emulations of
 * fa_check (validate.c) and of a low-precision backward (backward.c). */
static inline float fa_round_to(fa_dtype dt, float x)
{
    switch (dt) {
    case FA_BF16: return fa_bf16_to_f32(fa_f32_to_bf16(x));
    case FA_F16: return fa_f16_to_f32(fa_f32_to_f16(x));
    default: return x;
    }
}

/* Load element at offset `off` (elements) of a tensor as double / float. */
static inline double fa_load_f64(const fa_tensor *t, int64_t off)
{
    switch (t->dtype) {
    case FA_F32: return (double)((const float *)t->data)[off];
    case FA_F64: return ((const double *)t->data)[off];
    case FA_F16: return (double)fa_f16_to_f32(((const uint16_t *)t->data)[off]);
    case FA_BF16: return (double)fa_bf16_to_f32(((const uint16_t *)t->data)[off]);
    default: return NAN;
    }
}

static inline float fa_load_f32(const fa_tensor *t, int64_t off)
{
    switch (t->dtype) {
    case FA_F32: return ((const float *)t->data)[off];
    case FA_F64: return (float)((const double *)t->data)[off];
    case FA_F16: return fa_f16_to_f32(((const uint16_t *)t->data)[off]);
    case FA_BF16: return fa_bf16_to_f32(((const uint16_t *)t->data)[off]);
    default: return NAN;
    }
}

static inline void fa_store_f64(const fa_tensor *t, int64_t off, double x)
{
    switch (t->dtype) {
    case FA_F32: ((float *)t->data)[off] = (float)x; break;
    case FA_F64: ((double *)t->data)[off] = x; break;
    case FA_F16: ((uint16_t *)t->data)[off] = fa_f32_to_f16((float)x); break;
    case FA_BF16: ((uint16_t *)t->data)[off] = fa_f32_to_bf16((float)x); break;
    default: break;
    }
}

/*
 * Gather n elements starting at offset `off` with stride `inc` into float32.
 * Fast path for contiguous float32.
 */
void fa_gather_f32(const fa_tensor *t, int64_t off, int64_t inc, int64_t n, float *dst);

/* n elements from offset off, stride inc, as float64 (exact for every dtype). */
void fa_gather_f64(const fa_tensor *t, int64_t off, int64_t inc, int64_t n, double *dst);

#endif /* FA_TENSOR_H */
