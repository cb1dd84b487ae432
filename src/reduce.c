/*
 * reduce.c - the element-wise reduction kernels of the engine: one plain
 * loop per (datatype, op) that gcc vectorizes, and the f16/bf16 converters.
 * f16/bf16 are widened to f32 a block at a time, combined, and rounded once.
 */
#include "reduce.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define WEFT_HAVE_X86 1
#endif

/* Vectorization at -O2 (gcc 12's "very cheap" cost model) refuses loops
 * whose trip count is unknown, which is every loop here.  dst may be a or b
 * exactly: gcc's runtime alias check lets distance 0 take the vector path,
 * so the kernels need no restrict and no per-alias variants.
 * no-trapping-math lets gcc evaluate both arms of the selects in the f16
 * converters (it would otherwise keep the float arm behind a branch, which
 * stops vectorization); no value changes, only FP exception flags could. */
#pragma GCC optimize("O3", "no-trapping-math")

/* Elements per f32 staging block: 3 blocks of 1 KiB stay in L1. */
#define WEFT_REDUCE_BLOCK 256

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- f16 / bf16 <-> f32 -------------------------------------------------
 * Written without branches (selects only) so that the block loops below
 * vectorize; none of them depends on FTZ/DAZ being off. */

static inline float half_to_float_inl(uint16_t h)
{
    uint32_t em = h & 0x7fffu;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    /* Normal: move the fields into place and rebias the exponent 15 -> 127. */
    uint32_t bits = (em << 13) + (112u << 23);
    /* Inf/NaN: rebias once more so the exponent is all ones; the mantissa,
     * NaN payload included, is kept. */
    bits = em >= 0x7c00u ? bits + (112u << 23) : bits;
    /* Zero and subnormals are m * 2^-24: exact through int -> float, and the
     * result is a normal f32, so flush-to-zero modes cannot touch it. */
    uint32_t sub = f32_bits((float)(int32_t)em * 0x1p-24f);
    bits = em < 0x0400u ? sub : bits;
    return bits_f32(bits | sign);
}

static inline uint16_t float_to_half_inl(float f)
{
    uint32_t u = f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    /* Normal range: rebias, then round to nearest even on the 13 bits that
     * go; a carry out of the mantissa bumps the exponent, up to Inf. */
    uint32_t norm = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
    /* Below 2^-14: adding 0.5f lines the value up with 0.5's last mantissa
     * bit (2^-24, the f16 subnormal quantum) and the FPU rounds to nearest
     * even; what is left above 0.5 is the f16 encoding (0x400 = 2^-14 when
     * it rounds up into the normals). */
    uint32_t sub = f32_bits(bits_f32(a) + 0.5f) - f32_bits(0.5f);
    /* NaN stays NaN: quiet bit set, top payload bits kept (as F16C does). */
    uint32_t nan = 0x7e00u | ((a >> 13) & 0x3ffu);
    uint32_t h = a < (113u << 23) ? sub : norm;
    h = a >= (143u << 23) ? 0x7c00u : h; /* |f| >= 65536 (or Inf) */
    h = a > 0x7f800000u ? nan : h;
    return (uint16_t)(h | sign);
}

static inline float bf16_to_float_inl(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

static inline uint16_t float_to_bf16_inl(float f)
{
    uint32_t u = f32_bits(f);
    /* Round to nearest even on the low 16 bits; a carry walks into the
     * exponent, so the largest floats become Inf as they should. */
    uint32_t r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = (u >> 16) | 0x40u; /* NaN stays NaN: set the quiet bit */
    r = (u & 0x7fffffffu) > 0x7f800000u ? nan : r;
    return (uint16_t)r;
}

float weft_half_to_float(uint16_t h)
{
    return half_to_float_inl(h);
}

uint16_t weft_float_to_half(float f)
{
    return float_to_half_inl(f);
}

float weft_bf16_to_float(uint16_t h)
{
    return bf16_to_float_inl(h);
}

uint16_t weft_float_to_bf16(float f)
{
    return float_to_bf16_inl(f);
}

/* ---- block converters ----------------------------------------------------- */

static void half_block_to_float_sw(float *restrict out, const uint16_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = half_to_float_inl(in[i]);
}

static void float_block_to_half_sw(uint16_t *restrict out, const float *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = float_to_half_inl(in[i]);
}

#ifdef WEFT_HAVE_X86
/* F16C converts 8 lanes per instruction, about 4x the portable loop; the
 * results are identical (round to nearest even, NaN quieted with its top
 * payload bits kept).  The rounding is fixed in the instruction, not taken
 * from MXCSR. */
__attribute__((target("avx,f16c"))) static void half_block_to_float_f16c(float *restrict out,
                                                                        const uint16_t *restrict in,
                                                                        size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
    for (; i < n; i++)
        out[i] = half_to_float_inl(in[i]);
}

__attribute__((target("avx,f16c"))) static void float_block_to_half_f16c(uint16_t *restrict out,
                                                                        const float *restrict in,
                                                                        size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        out[i] = float_to_half_inl(in[i]);
}

static bool have_f16c(void)
{
    /* Reads what libgcc's constructor found at startup; no syscall. */
    return weft_reduce_f16c_ && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
}
#endif

bool weft_reduce_f16c_ = true;

static void half_block_to_float(float *restrict out, const uint16_t *restrict in, size_t n)
{
#ifdef WEFT_HAVE_X86
    if (have_f16c()) {
        half_block_to_float_f16c(out, in, n);
        return;
    }
#endif
    half_block_to_float_sw(out, in, n);
}

static void float_block_to_half(uint16_t *restrict out, const float *restrict in, size_t n)
{
#ifdef WEFT_HAVE_X86
    if (have_f16c()) {
        float_block_to_half_f16c(out, in, n);
        return;
    }
#endif
    float_block_to_half_sw(out, in, n);
}

static void bf16_block_to_float(float *restrict out, const uint16_t *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = bf16_to_float_inl(in[i]);
}

static void float_block_to_bf16(uint16_t *restrict out, const float *restrict in, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = float_to_bf16_inl(in[i]);
}

/* ---- native kernels --------------------------------------------------------
 * Signed integers add and multiply in their unsigned twin, so overflow wraps
 * instead of being undefined; the conversion back is gcc's modulo rule.
 * AVG divides in 64 bits so that a divisor wider than the type (int8 over
 * 200 ranks) still truncates toward zero correctly.
 *
 * Float MAX/MIN are plain comparisons, (a > b ? a : b): when either operand
 * is NaN the result is b, so a NaN propagates only from b; with equal
 * operands (+0 vs -0) the result is also b.  Each element is combined in
 * one place (see algorithms/), so every rank still gets the same bits. */

#define WEFT_KERNELS_COMMON(name, T)                                                     \
    static void name##_max(void *dv, const void *av, const void *bv, size_t n)          \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = a[i] > b[i] ? a[i] : b[i];                                            \
    }                                                                                    \
    static void name##_min(void *dv, const void *av, const void *bv, size_t n)          \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = a[i] < b[i] ? a[i] : b[i];                                            \
    }

#define WEFT_KERNELS_INT(name, T, U, W)                                                  \
    WEFT_KERNELS_COMMON(name, T)                                                         \
    static void name##_sum(void *dv, const void *av, const void *bv, size_t n)          \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = (T)((U)a[i] + (U)b[i]);                                               \
    }                                                                                    \
    static void name##_prod(void *dv, const void *av, const void *bv, size_t n)         \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = (T)((U)a[i] * (U)b[i]);                                               \
    }                                                                                    \
    static void name##_avg(void *dv, const void *av, const void *bv, size_t n, int div) \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        W w = (W)div;                                                                    \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = (T)((W)(T)((U)a[i] + (U)b[i]) / w);                                   \
    }

#define WEFT_KERNELS_FLOAT(name, T)                                                      \
    WEFT_KERNELS_COMMON(name, T)                                                         \
    static void name##_sum(void *dv, const void *av, const void *bv, size_t n)          \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = a[i] + b[i];                                                          \
    }                                                                                    \
    static void name##_prod(void *dv, const void *av, const void *bv, size_t n)         \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = a[i] * b[i];                                                          \
    }                                                                                    \
    static void name##_avg(void *dv, const void *av, const void *bv, size_t n, int div) \
    {                                                                                    \
        T *d = dv;                                                                       \
        const T *a = av, *b = bv;                                                        \
        T w = (T)div;                                                                    \
        for (size_t i = 0; i < n; i++)                                                   \
            d[i] = (a[i] + b[i]) / w;                                                    \
    }

WEFT_KERNELS_INT(i8, int8_t, uint8_t, int64_t)
WEFT_KERNELS_INT(u8, uint8_t, uint8_t, uint64_t)
WEFT_KERNELS_INT(i32, int32_t, uint32_t, int64_t)
WEFT_KERNELS_INT(u32, uint32_t, uint32_t, uint64_t)
WEFT_KERNELS_INT(i64, int64_t, uint64_t, int64_t)
WEFT_KERNELS_INT(u64, uint64_t, uint64_t, uint64_t)
WEFT_KERNELS_FLOAT(f32, float)
WEFT_KERNELS_FLOAT(f64, double)

typedef void (*weft_kernel_fn)(void *dst, const void *a, const void *b, size_t n);
typedef void (*weft_avg_fn)(void *dst, const void *a, const void *b, size_t n, int divisor);

/* Indexed by weft_dtype_t; f16/bf16 go through the f32 block path instead. */
static const struct {
    weft_kernel_fn op[4]; /* SUM, PROD, MAX, MIN */
    weft_avg_fn avg;
} kernels[WEFT_NUM_DTYPES] = {
#define WEFT_KROW(name) { { name##_sum, name##_prod, name##_max, name##_min }, name##_avg }
    [WEFT_INT8] = WEFT_KROW(i8),
    [WEFT_UINT8] = WEFT_KROW(u8),
    [WEFT_INT32] = WEFT_KROW(i32),
    [WEFT_UINT32] = WEFT_KROW(u32),
    [WEFT_INT64] = WEFT_KROW(i64),
    [WEFT_UINT64] = WEFT_KROW(u64),
    [WEFT_FLOAT32] = WEFT_KROW(f32),
    [WEFT_FLOAT64] = WEFT_KROW(f64),
#undef WEFT_KROW
};

/* ---- 16-bit floats ---------------------------------------------------------- */

/* x = x op y over one staging block; AVG with a divisor divides the f32
 * result here, so the value is rounded to 16 bits once, after the divide. */
static void f32_block_combine(float *restrict x, const float *restrict y, size_t n, weft_op_t op,
                              int divisor)
{
    switch (op) {
    case WEFT_SUM:
    case WEFT_AVG:
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] + y[i];
        break;
    case WEFT_PROD:
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] * y[i];
        break;
    case WEFT_MAX:
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] > y[i] ? x[i] : y[i];
        break;
    case WEFT_MIN:
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] < y[i] ? x[i] : y[i];
        break;
    default:
        return;
    }
    if (op == WEFT_AVG && divisor > 0) {
        float w = (float)divisor;
        for (size_t i = 0; i < n; i++)
            x[i] = x[i] / w;
    }
}

/* The f32 result of one + or * of two f16 (or bf16) values, rounded to 16
 * bits, equals the correctly rounded 16-bit result: f32 has more than
 * 2p+2 bits, so the double rounding is harmless. */
static void reduce_16bit(uint16_t *dst, const uint16_t *a, const uint16_t *b, size_t n, weft_op_t op,
                         int divisor, bool bf16)
{
    float fa[WEFT_REDUCE_BLOCK], fb[WEFT_REDUCE_BLOCK];

    for (size_t off = 0; off < n; off += WEFT_REDUCE_BLOCK) {
        size_t m = WEFT_MIN((size_t)WEFT_REDUCE_BLOCK, n - off);
        /* Both inputs are read before dst is written: dst may be a or b. */
        if (bf16) {
            bf16_block_to_float(fa, a + off, m);
            bf16_block_to_float(fb, b + off, m);
        } else {
            half_block_to_float(fa, a + off, m);
            half_block_to_float(fb, b + off, m);
        }
        f32_block_combine(fa, fb, m, op, divisor);
        if (bf16)
            float_block_to_bf16(dst + off, fa, m);
        else
            float_block_to_half(dst + off, fa, m);
    }
}

void weft_reduce_local(void *dst, const void *a, const void *b, size_t n, weft_dtype_t dtype,
                       weft_op_t op, int divisor)
{
    if (n == 0)
        return;
    if ((unsigned)dtype >= WEFT_NUM_DTYPES || (unsigned)op >= WEFT_NUM_OPS) {
        /* The API validated both; reaching here is a bug in the caller. */
        WEFT_WARN(WEFT_SUB_COLL, "weft_reduce_local: invalid dtype %d or op %d, nothing reduced",
                  (int)dtype, (int)op);
        return;
    }
    if (dtype == WEFT_FLOAT16 || dtype == WEFT_BFLOAT16) {
        reduce_16bit(dst, a, b, n, op, divisor, dtype == WEFT_BFLOAT16);
        return;
    }
    if (op == WEFT_AVG) {
        if (divisor > 0)
            kernels[dtype].avg(dst, a, b, n, divisor);
        else
            kernels[dtype].op[WEFT_SUM](dst, a, b, n);
        return;
    }
    kernels[dtype].op[op](dst, a, b, n);
}
