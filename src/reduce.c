/*
 * reduce.c - the element-wise reduction kernels of the engine: one plain
 * loop per (datatype, op) that gcc vectorizes, over the element arithmetic
 * that reduce_elem.h shares with the CUDA kernels, and an F16C path for f16.
 */
#include "reduce.h"

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

/* After the pragma, so that it covers the converters inlined into the
 * kernels. */
#include "reduce_elem.h"

float weft_half_to_float(uint16_t h)
{
    return weft_elem_f16_to_f32(h);
}

uint16_t weft_float_to_half(float f)
{
    return weft_elem_f32_to_f16(f);
}

float weft_bf16_to_float(uint16_t h)
{
    return weft_elem_bf16_to_f32(h);
}

uint16_t weft_float_to_bf16(float f)
{
    return weft_elem_f32_to_bf16(f);
}

bool weft_reduce_f16c_ = true;

/* ---- kernels -----------------------------------------------------------------
 * One loop per row of reduce_elem.h's tables: d[i] = ST(a[i] op b[i]), the
 * operands loaded through LD, w the AVG divisor.  The semantics (integer
 * wrap, AVG truncation, NaN and signed-zero rules of MAX/MIN, 16-bit
 * rounding) are stated there.  Each element is combined in one place (see
 * algorithms/), so every rank still gets the same bits. */
#define WEFT_KERNEL_DEF(op, OP, name, E, T, CT, U, WT, LD, ST, kind)                        \
    WEFT_KERNEL static void name##_##op(void *dv, const void *av, const void *bv, size_t n, \
                                        int div)                                            \
    {                                                                                       \
        T *d = dv;                                                                          \
        const T *a = av, *b = bv;                                                           \
        WT w = (WT)div;                                                                     \
        (void)w;                                                                            \
        for (size_t i = 0; i < n; i++) {                                                    \
            CT x = LD(a[i]), y = LD(b[i]);                                                  \
            d[i] = ST(WEFT_ELEM_EXPR(kind, op, T, U, WT, x, y, w));                         \
        }                                                                                   \
    }
#define WEFT_KERNEL_ROW(...) WEFT_ELEM_OPS(WEFT_KERNEL_DEF, __VA_ARGS__)
WEFT_ELEM_DTYPES(WEFT_KERNEL_ROW)
#undef WEFT_KERNEL_ROW
#undef WEFT_KERNEL_DEF

#ifdef WEFT_HAVE_X86
/* f16 with F16C: 8 lanes converted per instruction, about 4x the portable
 * loop, same results (round to nearest even fixed in the instruction, NaN
 * quieted with its top payload bits kept).  maxps/minps return their second
 * operand on NaN and on equal operands, exactly (x > y ? x : y). */
#define WEFT_F16C_DEF(op, VEXPR)                                                            \
    __attribute__((target("avx,f16c"))) static void f16c_##op(void *dv, const void *av,     \
                                                              const void *bv, size_t n,     \
                                                              int div)                      \
    {                                                                                       \
        uint16_t *d = dv;                                                                   \
        const uint16_t *a = av, *b = bv;                                                    \
        __m256 vw = _mm256_set1_ps((float)div);                                             \
        float w = (float)div;                                                               \
        (void)vw;                                                                           \
        (void)w;                                                                            \
        size_t i = 0;                                                                       \
        for (; i + 8 <= n; i += 8) {                                                        \
            __m256 x = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(a + i)));          \
            __m256 y = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b + i)));          \
            _mm_storeu_si128((__m128i *)(d + i),                                            \
                             _mm256_cvtps_ph(VEXPR, _MM_FROUND_TO_NEAREST_INT));            \
        }                                                                                   \
        for (; i < n; i++) {                                                                \
            float x = weft_elem_f16_to_f32(a[i]), y = weft_elem_f16_to_f32(b[i]);           \
            d[i] = weft_elem_f32_to_f16(                                                    \
                WEFT_ELEM_EXPR(FLOAT, op, uint16_t, uint16_t, float, x, y, w));             \
        }                                                                                   \
    }

WEFT_F16C_DEF(sum, _mm256_add_ps(x, y))
WEFT_F16C_DEF(prod, _mm256_mul_ps(x, y))
WEFT_F16C_DEF(max, _mm256_max_ps(x, y))
WEFT_F16C_DEF(min, _mm256_min_ps(x, y))
WEFT_F16C_DEF(avg, _mm256_div_ps(_mm256_add_ps(x, y), vw))
#endif

typedef void (*weft_kernel_fn)(void *dst, const void *a, const void *b, size_t n, int divisor);

/* Indexed by weft_op_t; AVG's slot divides, AVG without a divisor uses SUM. */
struct kernel_row {
    weft_kernel_fn op[WEFT_NUM_OPS];
};

#define WEFT_KENTRY(op, OP, name) [OP] = name##_##op,
#define WEFT_KROW(name, E, ...) [E] = { { WEFT_ELEM_OPS(WEFT_KENTRY, name) } },
static const struct kernel_row kernels[WEFT_NUM_DTYPES] = { WEFT_ELEM_DTYPES(WEFT_KROW) };
#ifdef WEFT_HAVE_X86
static const struct kernel_row kernels_f16c = { { WEFT_ELEM_OPS(WEFT_KENTRY, f16c) } };
#endif
#undef WEFT_KROW
#undef WEFT_KENTRY

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
