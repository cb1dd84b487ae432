/*
 * reduce.c - the element-wise reduction kernels of the engine: one plain
 * loop per (datatype, op) that gcc vectorizes, and the f16/bf16 converters.
 * f16/bf16 are widened to f32 in registers, combined, and rounded once.
 */
#include "reduce.h"

#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define WEFT_HAVE_X86 1
/* Every kernel is built twice, for AVX2 and for the x86-64 baseline; the
 * loader picks one (ifunc).  Both do the same IEEE operations in the same
 * order (no FMA), so they give the same bits. */
#define WEFT_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define WEFT_KERNEL
#endif

/* Vectorization at -O2 (gcc 12's "very cheap" cost model) refuses loops
 * whose trip count is unknown, which is every loop here.  dst may be a or b
 * exactly: gcc's runtime alias check lets distance 0 take the vector path,
 * so the kernels need no restrict and no per-alias variants.
 * no-trapping-math lets gcc evaluate both arms of the selects in the f16
 * converters (it would otherwise keep the float arm behind a branch, which
 * stops vectorization); no value changes, only FP exception flags could. */
#pragma GCC optimize("O3", "no-trapping-math")

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
 * Written without branches (selects only) so that the loops using them
 * vectorize; none of them depends on FTZ/DAZ being off.  Magnitudes are
 * compared as int32 (they are below 2^31): SSE2 has signed compares only. */

static inline float half_to_float_inl(uint16_t h)
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
    uint32_t sub = f32_bits((float)em * 0x1p-24f);
    bits = em < 0x0400 ? sub : bits;
    return bits_f32(bits | sign);
}

static inline uint16_t float_to_half_inl(float f)
{
    uint32_t u = f32_bits(f);
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
    uint32_t sub = f32_bits(bits_f32(ua) + 0.5f) - f32_bits(0.5f);
    /* NaN stays NaN: quiet bit set, top payload bits kept (as F16C does). */
    uint32_t nan = 0x7e00u | ((ua >> 13) & 0x3ffu);
    uint32_t h = a < (int32_t)(113u << 23) ? sub : norm;
    h = a >= (int32_t)(143u << 23) ? 0x7c00u : h; /* |f| >= 65536 (or Inf) */
    h = a > (int32_t)0x7f800000 ? nan : h;
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
    r = (int32_t)(u & 0x7fffffffu) > (int32_t)0x7f800000 ? nan : r;
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

bool weft_reduce_f16c_ = true;

/* ---- kernels -----------------------------------------------------------------
 * Signed integers add and multiply in their unsigned twin, so overflow wraps
 * instead of being undefined; the conversion back is gcc's modulo rule.
 * Integer AVG truncates toward zero: 8- and 32-bit sums divide in double,
 * which is exact for them (a quotient that is not an integer lies at least
 * 1/divisor from one, far more than double's error for |sum| < 2^52) and
 * vectorizes; 64-bit sums divide as integers.
 *
 * Float MAX/MIN are plain comparisons, (a > b ? a : b): when either operand
 * is NaN the result is b, so a NaN propagates only from b; with equal
 * operands (+0 vs -0) the result is also b.  Each element is combined in
 * one place (see algorithms/), so every rank still gets the same bits.
 *
 * 16-bit floats: each element is widened to f32, combined (and for AVG
 * divided) in f32, and rounded once.  The f32 result of one + or * of two
 * f16 (or bf16) values, rounded to 16 bits, is the correctly rounded 16-bit
 * result: f32 has more than 2p+2 bits, so the double rounding is harmless. */

/* One kernel: d[i] = EXPR, with x = a[i], y = b[i] loaded as LD(.) and the
 * result stored through ST(.); w is the AVG divisor as type WT. */
#define WEFT_KERNEL_DEF(fn, T, CT, WT, LD, ST, EXPR)                                      \
    WEFT_KERNEL static void fn(void *dv, const void *av, const void *bv, size_t n, int div) \
    {                                                                                   \
        T *d = dv;                                                                      \
        const T *a = av, *b = bv;                                                       \
        WT w = (WT)div;                                                                 \
        (void)w;                                                                        \
        for (size_t i = 0; i < n; i++) {                                                \
            CT x = LD(a[i]), y = LD(b[i]);                                              \
            d[i] = ST(EXPR);                                                            \
        }                                                                               \
    }

#define WEFT_ID(v) (v)

/* Integers: U is the unsigned twin, AW the type AVG divides in. */
#define WEFT_KERNELS_INT(name, T, U, AW)                                                  \
    WEFT_KERNEL_DEF(name##_sum, T, T, AW, WEFT_ID, (T), (U)x + (U)y)                      \
    WEFT_KERNEL_DEF(name##_prod, T, T, AW, WEFT_ID, (T), (U)x * (U)y)                     \
    WEFT_KERNEL_DEF(name##_max, T, T, AW, WEFT_ID, WEFT_ID, x > y ? x : y)                \
    WEFT_KERNEL_DEF(name##_min, T, T, AW, WEFT_ID, WEFT_ID, x < y ? x : y)                \
    WEFT_KERNEL_DEF(name##_avg, T, T, AW, WEFT_ID, (T), (AW)(T)((U)x + (U)y) / w)

/* Floats, native or widened: CT is the compute type. */
#define WEFT_KERNELS_FLOAT(name, T, CT, LD, ST)                                           \
    WEFT_KERNEL_DEF(name##_sum, T, CT, CT, LD, ST, x + y)                                 \
    WEFT_KERNEL_DEF(name##_prod, T, CT, CT, LD, ST, x * y)                                \
    WEFT_KERNEL_DEF(name##_max, T, CT, CT, LD, ST, x > y ? x : y)                         \
    WEFT_KERNEL_DEF(name##_min, T, CT, CT, LD, ST, x < y ? x : y)                         \
    WEFT_KERNEL_DEF(name##_avg, T, CT, CT, LD, ST, (x + y) / w)

WEFT_KERNELS_INT(i8, int8_t, uint8_t, double)
WEFT_KERNELS_INT(u8, uint8_t, uint8_t, double)
WEFT_KERNELS_INT(i32, int32_t, uint32_t, double)
WEFT_KERNELS_INT(u32, uint32_t, uint32_t, double)
WEFT_KERNELS_INT(i64, int64_t, uint64_t, int64_t)
WEFT_KERNELS_INT(u64, uint64_t, uint64_t, uint64_t)
WEFT_KERNELS_FLOAT(f32, float, float, WEFT_ID, WEFT_ID)
WEFT_KERNELS_FLOAT(f64, double, double, WEFT_ID, WEFT_ID)
WEFT_KERNELS_FLOAT(f16, uint16_t, float, half_to_float_inl, float_to_half_inl)
WEFT_KERNELS_FLOAT(bf16, uint16_t, float, bf16_to_float_inl, float_to_bf16_inl)

#ifdef WEFT_HAVE_X86
/* f16 with F16C: 8 lanes converted per instruction, about 4x the portable
 * loop, same results (round to nearest even fixed in the instruction, NaN
 * quieted with its top payload bits kept).  maxps/minps return their second
 * operand on NaN and on equal operands, exactly (x > y ? x : y). */
#define WEFT_F16C_DEF(fn, VEXPR, SEXPR)                                                   \
    __attribute__((target("avx,f16c"))) static void fn(void *dv, const void *av,          \
                                                       const void *bv, size_t n, int div) \
    {                                                                                   \
        uint16_t *d = dv;                                                               \
        const uint16_t *a = av, *b = bv;                                                \
        __m256 vw = _mm256_set1_ps((float)div);                                         \
        float w = (float)div;                                                           \
        (void)vw;                                                                       \
        (void)w;                                                                        \
        size_t i = 0;                                                                   \
        for (; i + 8 <= n; i += 8) {                                                    \
            __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));       \
            __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));       \
            _mm_storeu_si128((__m128i *)(d + i),                                         \
                             _mm256_cvtps_ph(VEXPR, _MM_FROUND_TO_NEAREST_INT));         \
        }                                                                               \
        for (; i < n; i++) {                                                            \
            float x = half_to_float_inl(a[i]), y = half_to_float_inl(b[i]);             \
            d[i] = float_to_half_inl(SEXPR);                                            \
        }                                                                               \
    }

WEFT_F16C_DEF(f16c_sum, _mm256_add_ps(x, y), x + y)
WEFT_F16C_DEF(f16c_prod, _mm256_mul_ps(x, y), x * y)
WEFT_F16C_DEF(f16c_max, _mm256_max_ps(x, y), x > y ? x : y)
WEFT_F16C_DEF(f16c_min, _mm256_min_ps(x, y), x < y ? x : y)
WEFT_F16C_DEF(f16c_avg, _mm256_div_ps(_mm256_add_ps(x, y), vw), (x + y) / w)
#endif

typedef void (*weft_kernel_fn)(void *dst, const void *a, const void *b, size_t n, int divisor);

/* Indexed by weft_op_t; AVG's slot divides, AVG without a divisor uses SUM. */
struct kernel_row {
    weft_kernel_fn op[WEFT_NUM_OPS];
};

#define WEFT_KROW(name) { { name##_sum, name##_prod, name##_max, name##_min, name##_avg } }
static const struct kernel_row kernels[WEFT_NUM_DTYPES] = {
    [WEFT_INT8] = WEFT_KROW(i8),     [WEFT_UINT8] = WEFT_KROW(u8),
    [WEFT_INT32] = WEFT_KROW(i32),   [WEFT_UINT32] = WEFT_KROW(u32),
    [WEFT_INT64] = WEFT_KROW(i64),   [WEFT_UINT64] = WEFT_KROW(u64),
    [WEFT_FLOAT16] = WEFT_KROW(f16), [WEFT_FLOAT32] = WEFT_KROW(f32),
    [WEFT_FLOAT64] = WEFT_KROW(f64), [WEFT_BFLOAT16] = WEFT_KROW(bf16),
};
#ifdef WEFT_HAVE_X86
static const struct kernel_row kernels_f16c = WEFT_KROW(f16c);
#endif
#undef WEFT_KROW

static const struct kernel_row *kernel_row(weft_dtype_t dtype)
{
#ifdef WEFT_HAVE_X86
    /* __builtin_cpu_supports reads what libgcc found at startup: no syscall. */
    if (dtype == WEFT_FLOAT16 && weft_reduce_f16c_ && __builtin_cpu_supports("f16c") &&
        __builtin_cpu_supports("avx"))
        return &kernels_f16c;
#endif
    return &kernels[dtype];
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
    if (op == WEFT_AVG && divisor <= 0)
        op = WEFT_SUM;
    kernel_row(dtype)->op[op](dst, a, b, n, divisor);
}
