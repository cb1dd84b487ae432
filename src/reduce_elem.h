/*
 * reduce_elem.h - the element arithmetic of the reductions, one definition
 * for the host kernels (src/reduce.c, C11) and the CUDA kernels (src/cuda/,
 * nvcc): the f16/bf16 <-> f32 converters and one expression per (dtype, op).
 */
#ifndef WEFT_REDUCE_ELEM_H
#define WEFT_REDUCE_ELEM_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "weft.h"

#ifdef __CUDACC__
#define WEFT_HD __host__ __device__
#else
#define WEFT_HD
#endif

/* ---- the tables ---------------------------------------------------------
 * Both sides expand the same rows, so a kernel cannot exist on one side
 * only or compute differently there.
 *
 * One row per dtype: X(name, dtype enum, T, CT, U, WT, LD, ST, kind)
 *   T   storage type             CT  type the operands are combined in
 *   U   unsigned type of T's width: integer + and * are done in it, so
 *       that they wrap instead of overflowing (unused for floats)
 *   WT  type the AVG divisor converts to and the AVG sum is divided in
 *   LD  T -> CT, ST  the result -> T (function or function-like macro)
 *   kind  INT or FLOAT: picks the expressions below
 * Integer AVG truncates toward zero: 8- and 32-bit sums divide in double,
 * which is exact for them (a quotient that is not an integer lies at least
 * 1/divisor from one, far more than double's error for |sum| < 2^52) and
 * vectorizes; 64-bit sums divide as integers.  16-bit floats combine (and
 * for AVG divide) in f32 and round once: the f32 result of one + or * of
 * two 16-bit values is wide enough (more than 2p+2 bits) that rounding it
 * again to 16 bits gives the correctly rounded 16-bit result. */
#define WEFT_ELEM_DTYPES(X)                                                                  \
    X(i8, WEFT_INT8, int8_t, int8_t, uint8_t, double, WEFT_ELEM_ID, WEFT_ELEM_ID, INT)       \
    X(u8, WEFT_UINT8, uint8_t, uint8_t, uint8_t, double, WEFT_ELEM_ID, WEFT_ELEM_ID, INT)    \
    X(i32, WEFT_INT32, int32_t, int32_t, uint32_t, double, WEFT_ELEM_ID, WEFT_ELEM_ID, INT)  \
    X(u32, WEFT_UINT32, uint32_t, uint32_t, uint32_t, double, WEFT_ELEM_ID, WEFT_ELEM_ID,    \
      INT)                                                                                   \
    X(i64, WEFT_INT64, int64_t, int64_t, uint64_t, int64_t, WEFT_ELEM_ID, WEFT_ELEM_ID, INT) \
    X(u64, WEFT_UINT64, uint64_t, uint64_t, uint64_t, uint64_t, WEFT_ELEM_ID, WEFT_ELEM_ID,  \
      INT)                                                                                   \
    X(f16, WEFT_FLOAT16, uint16_t, float, uint16_t, float, weft_elem_f16_to_f32,             \
      weft_elem_f32_to_f16, FLOAT)                                                           \
    X(f32, WEFT_FLOAT32, float, float, uint32_t, float, WEFT_ELEM_ID, WEFT_ELEM_ID, FLOAT)   \
    X(f64, WEFT_FLOAT64, double, double, uint64_t, double, WEFT_ELEM_ID, WEFT_ELEM_ID,       \
      FLOAT)                                                                                 \
    X(bf16, WEFT_BFLOAT16, uint16_t, float, uint16_t, float, weft_elem_bf16_to_f32,          \
      weft_elem_f32_to_bf16, FLOAT)

/* One entry per op: X(name, op enum, ...), the trailing arguments passed
 * on, so that a dtype row can expand every op with its columns. */
#define WEFT_ELEM_OPS(X, ...)                                                                \
    X(sum, WEFT_SUM, __VA_ARGS__)                                                            \
    X(prod, WEFT_PROD, __VA_ARGS__)                                                          \
    X(max, WEFT_MAX, __VA_ARGS__)                                                            \
    X(min, WEFT_MIN, __VA_ARGS__)                                                            \
    X(avg, WEFT_AVG, __VA_ARGS__)

#define WEFT_ELEM_ID(v) (v)

/* a op b for operands x, y already loaded as CT; w is the AVG divisor as
 * WT, used only by avg (which needs divisor > 0: AVG without a divisor is
 * sum, and the caller picks sum then).  The value goes through ST.
 *
 * Integer results are cast back to T here (the conversion of a wrapped
 * unsigned value is the compilers' modulo rule).  Float MAX/MIN are plain
 * comparisons: when either operand is NaN the result is y, so a NaN
 * propagates only from y; with equal operands (+0 vs -0) it is also y. */
#define WEFT_ELEM_EXPR(kind, op, T, U, WT, x, y, w) WEFT_ELEM_##kind##_##op(T, U, WT, x, y, w)

#define WEFT_ELEM_INT_sum(T, U, WT, x, y, w) (T)((U)(x) + (U)(y))
#define WEFT_ELEM_INT_prod(T, U, WT, x, y, w) (T)((U)(x) * (U)(y))
#define WEFT_ELEM_INT_max(T, U, WT, x, y, w) ((x) > (y) ? (x) : (y))
#define WEFT_ELEM_INT_min(T, U, WT, x, y, w) ((x) < (y) ? (x) : (y))
#define WEFT_ELEM_INT_avg(T, U, WT, x, y, w) (T)((WT)(T)((U)(x) + (U)(y)) / (w))

#define WEFT_ELEM_FLOAT_sum(T, U, WT, x, y, w) ((x) + (y))
#define WEFT_ELEM_FLOAT_prod(T, U, WT, x, y, w) ((x) * (y))
#define WEFT_ELEM_FLOAT_max(T, U, WT, x, y, w) ((x) > (y) ? (x) : (y))
#define WEFT_ELEM_FLOAT_min(T, U, WT, x, y, w) ((x) < (y) ? (x) : (y))
#define WEFT_ELEM_FLOAT_avg(T, U, WT, x, y, w) (((x) + (y)) / (w))

/* ---- f16 / bf16 <-> f32 -------------------------------------------------
 * Written without branches (selects only) so that the host loops using
 * them vectorize; none of them depends on FTZ/DAZ being off.  Magnitudes
 * are compared as int32 (they are below 2^31): SSE2 has signed compares
 * only.  On the device they are a handful of integer instructions too,
 * and give the same bits as on the host. */

WEFT_HD static inline uint32_t weft_elem_f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

WEFT_HD static inline float weft_elem_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

WEFT_HD static inline float weft_elem_f16_to_f32(uint16_t h)
{
    int32_t em = h & 0x7fff;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    /* Normal: move the fields into place and rebias the exponent 15 -> 127. */
    uint32_t bits = ((uint32_t)em << 13) + (112u << 23);
    /* Inf/NaN: rebias once more so the exponent is all ones; the mantissa,
     * NaN payload included, is kept. */
    bits = em >= 0x7c00 ? bits + (112u << 23) : bits;
    /* Zero and subnormals are m * 2^-24: exact through int -> float, and the
     * result is a normal f32, so flush-to-zero modes cannot touch it. */
    uint32_t sub = weft_elem_f32_bits((float)em * 0x1p-24f);
    bits = em < 0x0400 ? sub : bits;
    return weft_elem_bits_f32(bits | sign);
}

WEFT_HD static inline uint16_t weft_elem_f32_to_f16(float f)
{
    uint32_t u = weft_elem_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t a = (int32_t)(u & 0x7fffffffu);
    uint32_t ua = (uint32_t)a;
    /* Normal range: rebias, then round to nearest even on the 13 bits that
     * go; a carry out of the mantissa bumps the exponent, up to Inf. */
    uint32_t norm = (ua - (112u << 23) + 0xfffu + ((ua >> 13) & 1u)) >> 13;
    /* Below 2^-14: adding 0.5f lines the value up with 0.5's last mantissa
     * bit (2^-24, the f16 subnormal quantum) and the FPU rounds to nearest
     * even; what is left above 0.5 is the f16 encoding (0x400 = 2^-14 when
     * it rounds up into the normals). */
    uint32_t sub = weft_elem_f32_bits(weft_elem_bits_f32(ua) + 0.5f) - weft_elem_f32_bits(0.5f);
    /* NaN stays NaN: quiet bit set, top payload bits kept (as F16C does). */
    uint32_t nan = 0x7e00u | ((ua >> 13) & 0x3ffu);
    uint32_t h = a < (int32_t)(113u << 23) ? sub : norm;
    h = a >= (int32_t)(143u << 23) ? 0x7c00u : h; /* |f| >= 65536 (or Inf) */
    h = a > (int32_t)0x7f800000 ? nan : h;
    return (uint16_t)(h | sign);
}

WEFT_HD static inline float weft_elem_bf16_to_f32(uint16_t h)
{
    return weft_elem_bits_f32((uint32_t)h << 16);
}

WEFT_HD static inline uint16_t weft_elem_f32_to_bf16(float f)
{
    uint32_t u = weft_elem_f32_bits(f);
    /* Round to nearest even on the low 16 bits; a carry walks into the
     * exponent, so the largest floats become Inf as they should. */
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u; /* NaN stays NaN: set the quiet bit */
    r = (int32_t)(u & 0x7fffffffu) > (int32_t)0x7f800000 ? nan : r;
    return (uint16_t)r;
}

#endif /* WEFT_REDUCE_ELEM_H */
