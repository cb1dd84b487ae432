/*
 * test_reduce.c - the reduction kernels against a scalar reference, and the
 * f16/bf16 converters against an independent rounding written with libm.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/reduce.h"

/* ---- helpers -------------------------------------------------------------- */

#include "testutil.h"


static const size_t esize[WEFT_NUM_DTYPES] = { 1, 1, 4, 4, 8, 8, 2, 4, 8, 2 };
static const char *const dname[WEFT_NUM_DTYPES] = { "int8",   "uint8",   "int32", "uint32",
                                                    "int64",  "uint64",  "f16",   "f32",
                                                    "f64",    "bf16" };
static const char *const oname[WEFT_NUM_OPS] = { "sum", "prod", "max", "min", "avg" };

/* A 16-bit float format: p significand bits (hidden one included). */
struct fmt16 {
    int p, bias, ebits;
};
static const struct fmt16 F16 = { 11, 15, 5 };
static const struct fmt16 BF16 = { 8, 127, 8 };

/* Decodes with ldexp, independently of the library's bit tricks. */
static double ref_decode(uint16_t h, struct fmt16 f)
{
    int mbits = f.p - 1;
    unsigned emax_field = (1u << f.ebits) - 1;
    unsigned e = (h >> mbits) & emax_field;
    unsigned m = h & ((1u << mbits) - 1);
    double s = (h >> 15) ? -1.0 : 1.0;
    if (e == emax_field)
        return m ? NAN : s * INFINITY;
    if (e == 0)
        return s * ldexp(m, 1 - f.bias - mbits);
    return s * ldexp(m + (1u << mbits), (int)e - f.bias - mbits);
}

static bool is_nan16(uint16_t h, struct fmt16 f)
{
    int mbits = f.p - 1;
    unsigned emax_field = (1u << f.ebits) - 1;
    return ((h >> mbits) & emax_field) == emax_field && (h & ((1u << mbits) - 1));
}

/* Rounds x to the format, nearest even, through nearbyint on the scaled
 * value; NaN comes back as the canonical quiet NaN (callers accept any). */
static uint16_t ref_round(double x, struct fmt16 f)
{
    int mbits = f.p - 1;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    uint16_t inf = (uint16_t)(((1u << f.ebits) - 1) << mbits);
    if (isnan(x))
        return (uint16_t)(inf | (1u << (mbits - 1)));
    double a = fabs(x);
    int emin = 1 - f.bias, emax = f.bias;
    /* Halfway between the largest finite value and 2^(emax+1) rounds up. */
    if (a >= ldexp(2.0 - ldexp(1.0, -f.p), emax))
        return sign | inf;
    if (a == 0)
        return sign;
    int e = ilogb(a);
    if (e < emin)
        e = emin;
    double q = ldexp(1.0, e - mbits);
    double v = nearbyint(a / q) * q;
    if (v == 0)
        return sign;
    if (v < ldexp(1.0, emin))
        return sign | (uint16_t)(v / ldexp(1.0, emin - mbits));
    int e2 = ilogb(v);
    unsigned mant = (unsigned)(v / ldexp(1.0, e2 - mbits)) - (1u << mbits);
    return sign | (uint16_t)((unsigned)(e2 + f.bias) << mbits) | (uint16_t)mant;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- converters --------------------------------------------------------------- */

static void check_decode_all(float (*dec)(uint16_t), struct fmt16 f, const char *what)
{
    for (uint32_t h = 0; h < 0x10000; h++) {
        float got = dec((uint16_t)h);
        double want = ref_decode((uint16_t)h, f);
        if (isnan(want)) {
            cr_assert(isnan(got), "%s 0x%04x: want NaN, got %a", what, h, got);
            continue;
        }
        cr_assert(fbits(got) == fbits((float)want), "%s 0x%04x: want %a, got %a", what, h, want,
                  got);
    }
}

Test(convert, half_to_float_all)
{
    check_decode_all(weft_half_to_float, F16, "f16");
}

Test(convert, bf16_to_float_all)
{
    check_decode_all(weft_bf16_to_float, BF16, "bf16");
}

static void check_encode(uint16_t (*enc)(float), struct fmt16 f, float x, const char *what)
{
    uint16_t got = enc(x);
    uint16_t want = ref_round((double)x, f);
    if (isnan(x)) {
        cr_assert(is_nan16(got, f), "%s(%a) = 0x%04x, not a NaN", what, x, got);
        cr_assert((got >> 15) == (fbits(x) >> 31), "%s(%a) lost the NaN's sign", what, x);
        return;
    }
    cr_assert(got == want, "%s(%a): want 0x%04x, got 0x%04x", what, x, want, got);
}

/* Every representable value, every tie between neighbours (which must go
 * to the even one) and the floats just beside each tie. */
static void check_encode_neighbours(uint16_t (*enc)(float), struct fmt16 f, const char *what)
{
    uint16_t inf = (uint16_t)(((1u << f.ebits) - 1) << (f.p - 1));
    for (uint32_t h = 0; h < inf; h++) {
        for (int s = 0; s < 2; s++) {
            double v = ref_decode((uint16_t)h, f), next;
            if (h + 1 < inf)
                next = ref_decode((uint16_t)(h + 1), f);
            else
                next = ldexp(1.0, f.bias + 1); /* where Inf begins */
            float mid = (float)((v + next) / 2);
            cr_assert((double)mid == (v + next) / 2, "tie not representable in f32");
            float xs[] = { (float)v, mid, nextafterf(mid, 0), nextafterf(mid, INFINITY) };
            for (size_t i = 0; i < 4; i++)
                check_encode(enc, f, s ? -xs[i] : xs[i], what);
        }
    }
}

Test(convert, float_to_half_neighbours)
{
    check_encode_neighbours(weft_float_to_half, F16, "f16");
}

Test(convert, float_to_bf16_neighbours)
{
    check_encode_neighbours(weft_float_to_bf16, BF16, "bf16");
}

/* A sweep of float bit patterns (all exponents, NaN payloads included). */
Test(convert, float_sweep)
{
    for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
        float x = bitsf((uint32_t)u);
        check_encode(weft_float_to_half, F16, x, "f16");
        check_encode(weft_float_to_bf16, BF16, x, "bf16");
    }
}

Test(convert, named_cases)
{
    struct {
        float x;
        uint16_t h;
    } f16[] = {
        { 1.0f, 0x3c00 },
        { 65504.0f, 0x7bff },
        { 65519.996f, 0x7bff },        /* just below the tie with Inf */
        { 65520.0f, 0x7c00 },          /* tie: rounds to the even side, Inf */
        { 1e10f, 0x7c00 },
        { -INFINITY, 0xfc00 },
        { 0x1p-24f, 0x0001 },          /* smallest subnormal */
        { 0x1p-25f, 0x0000 },          /* tie between 0 and 2^-24: even is 0 */
        { 0x1.8p-24f, 0x0002 },        /* tie between 1 and 2 quanta: 2 */
        { 0x1.0p-25f * 1.0001f, 0x0001 },
        { 0x1.ffcp-15f, 0x0400 },      /* tie: largest subnormal vs 2^-14, even */
        { 0x1p-14f, 0x0400 },          /* smallest normal */
        { 0x1p-149f, 0x0000 },         /* f32 subnormal: far below f16 */
        { -0.0f, 0x8000 },
        { 1.0f + 0x1p-11f, 0x3c00 },   /* tie, 1.0 is even */
        { 1.0f + 0x1.8p-10f, 0x3c02 }, /* tie, 1+2^-9 is even */
    };
    for (size_t i = 0; i < sizeof(f16) / sizeof(f16[0]); i++)
        cr_assert(weft_float_to_half(f16[i].x) == f16[i].h, "f16(%a): want 0x%04x got 0x%04x",
                  f16[i].x, f16[i].h, weft_float_to_half(f16[i].x));
    struct {
        float x;
        uint16_t h;
    } bf[] = {
        { 1.0f, 0x3f80 },
        { 1.0f + 0x1p-8f, 0x3f80 },   /* tie to even */
        { 1.0f + 0x3p-8f, 0x3f82 },   /* tie to even, upwards */
        { 3.4028235e38f, 0x7f80 },    /* FLT_MAX rounds to Inf */
        { 0x1p-133f, 0x0001 },        /* smallest bf16 subnormal */
        { -INFINITY, 0xff80 },
    };
    for (size_t i = 0; i < sizeof(bf) / sizeof(bf[0]); i++)
        cr_assert(weft_float_to_bf16(bf[i].x) == bf[i].h, "bf16(%a): want 0x%04x got 0x%04x",
                  bf[i].x, bf[i].h, weft_float_to_bf16(bf[i].x));
    /* NaNs whose payload sits only in the bits that are dropped must stay
     * NaN, not become Inf. */
    uint16_t h = weft_float_to_bf16(bitsf(0x7f800001u));
    cr_assert(is_nan16(h, BF16), "bf16 of a low-payload NaN is 0x%04x", h);
    h = weft_float_to_half(bitsf(0xff800001u));
    cr_assert(is_nan16(h, F16) && (h & 0x8000), "f16 of a low-payload -NaN is 0x%04x", h);
    cr_assert(isnan(weft_half_to_float(0x7c01)) && isnan(weft_bf16_to_float(0x7f81)));
}

/* ---- kernels -------------------------------------------------------------------- */

/* Inputs that reach the edges: integers with random bits and extremes,
 * floats mixing small integers, wide random values, and specials. */
static void fill(void *buf, size_t n, weft_dtype_t dt)
{
    for (size_t i = 0; i < n; i++) {
        uint64_t r = weft_test_rnd();
        unsigned pick = (unsigned)(r >> 59); /* 0..31 */
        switch (dt) {
        case WEFT_INT8:
        case WEFT_UINT8:
        case WEFT_INT32:
        case WEFT_UINT32:
        case WEFT_INT64:
        case WEFT_UINT64: {
            uint64_t v = weft_test_rnd();
            if (pick < 4) {
                static const uint64_t edge[] = { 0, 1, ~0ull, 0 };
                v = edge[pick];
                if (pick == 3) /* the signed minimum / top bit */
                    v = 1ull << (esize[dt] * 8 - 1);
            } else if (pick < 12) {
                v = (uint64_t)(int64_t)(int8_t)(r >> 8); /* small, either sign */
            }
            memcpy((char *)buf + i * esize[dt], &v, esize[dt]);
            break;
        }
        case WEFT_FLOAT32:
        case WEFT_FLOAT64: {
            double v;
            if (pick < 10)
                v = (double)(int)(r % 201) - 100;
            else if (pick < 26)
                v = ldexp((double)(r >> 11) / 0x1p53 - 0.5, (int)((r >> 4) % 40) - 20);
            else {
                static const double sp[] = { NAN, INFINITY, -INFINITY, -0.0, 1e-310, 3e38 };
                v = sp[pick - 26];
            }
            if (dt == WEFT_FLOAT32) {
                float f = pick == 30 ? 1e-40f : (float)v; /* an f32 subnormal */
                memcpy((char *)buf + i * 4, &f, 4);
            } else {
                memcpy((char *)buf + i * 8, &v, 8);
            }
            break;
        }
        case WEFT_FLOAT16:
        case WEFT_BFLOAT16: {
            uint16_t h;
            if (pick < 12) {
                h = (uint16_t)r; /* every class: NaN, Inf, subnormal, normal */
            } else {
                /* Values near one another so that sums round and tie. */
                struct fmt16 f = dt == WEFT_FLOAT16 ? F16 : BF16;
                double v = ldexp((double)(r % 4096) - 2048, (int)((r >> 20) % 8));
                h = ref_round((r >> 40) & 1 ? -v : v, f); /* -v: -0 as well */
            }
            memcpy((char *)buf + i * 2, &h, 2);
            break;
        }
        default:
            break;
        }
    }
}

/* Loads element i as (int64 / uint64 / double) for the reference. */
static int64_t ld_s(const void *p, size_t i, weft_dtype_t dt)
{
    switch (dt) {
    case WEFT_INT8: return ((const int8_t *)p)[i];
    case WEFT_INT32: return ((const int32_t *)p)[i];
    default: return ((const int64_t *)p)[i];
    }
}

static uint64_t ld_u(const void *p, size_t i, weft_dtype_t dt)
{
    switch (dt) {
    case WEFT_UINT8: return ((const uint8_t *)p)[i];
    case WEFT_UINT32: return ((const uint32_t *)p)[i];
    default: return ((const uint64_t *)p)[i];
    }
}

static bool is_signed_int(weft_dtype_t dt)
{
    return dt == WEFT_INT8 || dt == WEFT_INT32 || dt == WEFT_INT64;
}

/* Integer reference: wrapping arithmetic in 64 bits, truncated to the type. */
static uint64_t ref_int(weft_dtype_t dt, weft_op_t op, const void *a, const void *b, size_t i,
                        int divisor)
{
    unsigned bits = (unsigned)esize[dt] * 8;
    uint64_t mask = bits == 64 ? ~0ull : (1ull << bits) - 1;
    if (is_signed_int(dt)) {
        int64_t x = ld_s(a, i, dt), y = ld_s(b, i, dt);
        uint64_t r;
        switch (op) {
        case WEFT_SUM:
        case WEFT_AVG:
            r = (uint64_t)x + (uint64_t)y;
            if (op == WEFT_AVG && divisor > 0) {
                /* Sign-extend the wrapped sum, then truncate toward zero. */
                int64_t s = (int64_t)(r << (64 - bits)) >> (64 - bits);
                r = (uint64_t)(s / divisor);
            }
            break;
        case WEFT_PROD: r = (uint64_t)x * (uint64_t)y; break;
        case WEFT_MAX: r = (uint64_t)(x > y ? x : y); break;
        default: r = (uint64_t)(x < y ? x : y); break;
        }
        return r & mask;
    }
    uint64_t x = ld_u(a, i, dt), y = ld_u(b, i, dt), r;
    switch (op) {
    case WEFT_SUM:
    case WEFT_AVG:
        r = (x + y) & mask;
        if (op == WEFT_AVG && divisor > 0)
            r /= (uint64_t)divisor;
        break;
    case WEFT_PROD: r = x * y; break;
    case WEFT_MAX: r = x > y ? x : y; break;
    default: r = x < y ? x : y; break;
    }
    return r & mask;
}

/* The 16-bit reference: SUM and PROD are computed exactly (in double) and
 * rounded once; AVG is (a + b) in f32 divided in f32, as documented; MAX
 * and MIN pick an input (b when either is NaN). */
static uint16_t ref_16(struct fmt16 f, weft_op_t op, uint16_t ha, uint16_t hb, int divisor)
{
    double x = ref_decode(ha, f), y = ref_decode(hb, f);
    switch (op) {
    case WEFT_SUM: return ref_round(x + y, f);
    case WEFT_PROD: return ref_round(x * y, f);
    case WEFT_MAX: return (float)x > (float)y ? ha : hb;
    case WEFT_MIN: return (float)x < (float)y ? ha : hb;
    default: {
        float s = (float)x + (float)y;
        if (divisor > 0)
            s = s / (float)divisor;
        return ref_round(s, f);
    }
    }
}

/* The expected element i as raw bits (*nan: any NaN will do). */
static uint64_t ref_elem(weft_dtype_t dt, weft_op_t op, const void *a, const void *b, size_t i,
                         int divisor, bool *nan)
{
    uint64_t out = 0;
    *nan = false;
    switch (dt) {
    case WEFT_FLOAT32: {
        float x = ((const float *)a)[i], y = ((const float *)b)[i], r;
        switch (op) {
        case WEFT_SUM: r = x + y; break;
        case WEFT_PROD: r = x * y; break;
        case WEFT_MAX: r = x > y ? x : y; break;
        case WEFT_MIN: r = x < y ? x : y; break;
        default: r = divisor > 0 ? (x + y) / (float)divisor : x + y; break;
        }
        *nan = isnan(r);
        memcpy(&out, &r, 4);
        return out;
    }
    case WEFT_FLOAT64: {
        double x = ((const double *)a)[i], y = ((const double *)b)[i], r;
        switch (op) {
        case WEFT_SUM: r = x + y; break;
        case WEFT_PROD: r = x * y; break;
        case WEFT_MAX: r = x > y ? x : y; break;
        case WEFT_MIN: r = x < y ? x : y; break;
        default: r = divisor > 0 ? (x + y) / (double)divisor : x + y; break;
        }
        *nan = isnan(r);
        memcpy(&out, &r, 8);
        return out;
    }
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16: {
        struct fmt16 f = dt == WEFT_FLOAT16 ? F16 : BF16;
        uint16_t r = ref_16(f, op, ((const uint16_t *)a)[i], ((const uint16_t *)b)[i], divisor);
        *nan = is_nan16(r, f);
        return r;
    }
    default:
        return ref_int(dt, op, a, b, i, divisor);
    }
}

static bool elem_is_nan(weft_dtype_t dt, uint64_t v)
{
    switch (dt) {
    case WEFT_FLOAT32: return isnan(bitsf((uint32_t)v));
    case WEFT_FLOAT64: {
        double d;
        memcpy(&d, &v, 8);
        return isnan(d);
    }
    case WEFT_FLOAT16: return is_nan16((uint16_t)v, F16);
    case WEFT_BFLOAT16: return is_nan16((uint16_t)v, BF16);
    default: return false;
    }
}

/* Runs one (dtype, op, n, divisor) three ways: into a separate dst, into a
 * and into b, each checked element by element against the reference. */
static void run_case(weft_dtype_t dt, weft_op_t op, size_t n, int divisor)
{
    size_t es = esize[dt], bytes = n * es;
    char *a = malloc(bytes + 1), *b = malloc(bytes + 1), *d = malloc(bytes + 1);
    char *a0 = malloc(bytes + 1), *b0 = malloc(bytes + 1);
    uint64_t *want = malloc((n + 1) * sizeof(*want));
    bool *nan = malloc(n + 1);
    cr_assert(a && b && d && a0 && b0 && want && nan);
    fill(a0, n, dt);
    fill(b0, n, dt);
    for (size_t i = 0; i < n; i++)
        want[i] = ref_elem(dt, op, a0, b0, i, divisor, &nan[i]);
    for (int how = 0; how < 3; how++) {
        memcpy(a, a0, bytes);
        memcpy(b, b0, bytes);
        memset(d, 0x5a, bytes + 1);
        char *dst = how == 0 ? d : how == 1 ? a : b;
        weft_reduce_local(dst, a, b, n, dt, op, divisor);
        const char *label = how == 0 ? "dst=new" : how == 1 ? "dst=a" : "dst=b";
        for (size_t i = 0; i < n; i++) {
            uint64_t got = 0, x = 0, y = 0;
            memcpy(&got, dst + i * es, es);
            if (nan[i] ? elem_is_nan(dt, got) : got == want[i])
                continue;
            memcpy(&x, a0 + i * es, es);
            memcpy(&y, b0 + i * es, es);
            cr_assert_fail("%s %s (divisor %d, n %zu, %s) [%zu]: inputs 0x%llx, 0x%llx: "
                           "want 0x%llx%s, got 0x%llx",
                           dname[dt], oname[op], divisor, n, label, i, (unsigned long long)x,
                           (unsigned long long)y, (unsigned long long)want[i],
                           nan[i] ? " (a NaN)" : "", (unsigned long long)got);
        }
        if (how == 0) {
            cr_assert(memcmp(a, a0, bytes) == 0 && memcmp(b, b0, bytes) == 0,
                      "%s %s: inputs changed", dname[dt], oname[op]);
            cr_assert((unsigned char)d[bytes] == 0x5a, "%s %s n=%zu: wrote past the end",
                      dname[dt], oname[op], n);
        }
    }
    free(nan);
    free(want);
    free(a);
    free(b);
    free(d);
    free(a0);
    free(b0);
}

static void run_matrix(weft_dtype_t dt)
{
    static const size_t lens[] = { 0, 1, 7, 1000003 };
    for (int op = 0; op < WEFT_NUM_OPS; op++) {
        for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
            weft_test_rng_state = 0x9e3779b97f4a7c15ull ^ ((uint64_t)dt << 32) ^ ((uint64_t)op << 16) ^ l;
            run_case(dt, (weft_op_t)op, lens[l], 0);
            if (op == WEFT_AVG) {
                run_case(dt, (weft_op_t)op, lens[l], 3);
                run_case(dt, (weft_op_t)op, lens[l], 200); /* wider than int8 */
            }
        }
    }
}

Test(reduce, int8) { run_matrix(WEFT_INT8); }
Test(reduce, uint8) { run_matrix(WEFT_UINT8); }
Test(reduce, int32) { run_matrix(WEFT_INT32); }
Test(reduce, uint32) { run_matrix(WEFT_UINT32); }
Test(reduce, int64) { run_matrix(WEFT_INT64); }
Test(reduce, uint64) { run_matrix(WEFT_UINT64); }
Test(reduce, f16) { run_matrix(WEFT_FLOAT16); }
Test(reduce, f32) { run_matrix(WEFT_FLOAT32); }
Test(reduce, f64) { run_matrix(WEFT_FLOAT64); }
Test(reduce, bf16) { run_matrix(WEFT_BFLOAT16); }

/* The same f16 matrix through the portable converters (on F16C machines the
 * default path never runs them except in block tails). */
Test(reduce, f16_portable)
{
    weft_reduce_f16c_ = false;
    run_matrix(WEFT_FLOAT16);
    weft_reduce_f16c_ = true;
}

/* Hand-picked 16-bit cases where the rounding decides the answer. */
Test(reduce, f16_rounding_cases)
{
    struct {
        uint16_t a, b;
        int op, div;
        uint16_t want;
    } c[] = {
        { 0x6800, 0x3c00, WEFT_SUM, 0, 0x6800 }, /* 2048 + 1: tie, 2048 is even */
        { 0x6800, 0x4200, WEFT_SUM, 0, 0x6802 }, /* 2048 + 3: tie, 2052 is even */
        { 0x7bff, 0x4c00, WEFT_SUM, 0, 0x7c00 }, /* 65504 + 16: tie, overflows to Inf */
        { 0x7bff, 0x4b80, WEFT_SUM, 0, 0x7bff }, /* 65504 + 15 stays finite */
        { 0x0001, 0x0001, WEFT_SUM, 0, 0x0002 }, /* subnormals add exactly */
        { 0x03ff, 0x0001, WEFT_SUM, 0, 0x0400 }, /* into the normals */
        { 0x0001, 0x3800, WEFT_PROD, 0, 0x0000 }, /* 2^-24 * 0.5: tie, 0 is even */
        { 0x0003, 0x3800, WEFT_PROD, 0, 0x0002 }, /* 1.5 quanta: tie, 2 is even */
        { 0x7c00, 0xfc00, WEFT_SUM, 0, 0x7e00 }, /* Inf - Inf: NaN */
        { 0x7e00, 0x3c00, WEFT_SUM, 0, 0x7e00 }, /* NaN + 1 */
        { 0x3c00, 0x7e00, WEFT_MAX, 0, 0x7e00 }, /* max(1, NaN) = NaN (b) */
        { 0x7e00, 0x3c00, WEFT_MAX, 0, 0x3c00 }, /* max(NaN, 1) = 1 (b) */
        { 0x3c00, 0x4000, WEFT_AVG, 2, 0x3e00 }, /* (1 + 2) / 2 = 1.5 */
        { 0x7bff, 0x7bff, WEFT_AVG, 2, 0x7bff }, /* f32 holds the sum: no Inf */
        { 0x6800, 0x3c00, WEFT_AVG, 1, 0x6800 },
    };
    for (int pass = 0; pass < 2; pass++) {
        weft_reduce_f16c_ = pass == 0;
        for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
            uint16_t d = 0;
            weft_reduce_local(&d, &c[i].a, &c[i].b, 1, WEFT_FLOAT16, (weft_op_t)c[i].op,
                              c[i].div);
            if (is_nan16(c[i].want, F16))
                cr_assert(is_nan16(d, F16), "case %zu: want NaN, got 0x%04x", i, d);
            else
                cr_assert(d == c[i].want, "case %zu: want 0x%04x, got 0x%04x", i, c[i].want, d);
        }
    }
    weft_reduce_f16c_ = true;
    /* bf16: 1 + 2^-8 ties to 1; the largest finite doubled overflows. */
    uint16_t a = 0x3f80, b = 0x3b80, d;
    weft_reduce_local(&d, &a, &b, 1, WEFT_BFLOAT16, WEFT_SUM, 0);
    cr_assert(d == 0x3f80, "bf16 1 + 2^-8: 0x%04x", d);
    a = b = 0x7f7f;
    weft_reduce_local(&d, &a, &b, 1, WEFT_BFLOAT16, WEFT_SUM, 0);
    cr_assert(d == 0x7f80, "bf16 max + max: 0x%04x", d);
    a = 0x0001, b = 0x0001; /* bf16 subnormals */
    weft_reduce_local(&d, &a, &b, 1, WEFT_BFLOAT16, WEFT_SUM, 0);
    cr_assert(d == 0x0002, "bf16 subnormal sum: 0x%04x", d);
}

/* MAX/MIN are (a > b ? a : b) and (a < b ? a : b): ties and NaNs pick b. */
Test(reduce, float_max_min_pick_b)
{
    float fa[] = { 0.0f, -0.0f, NAN, 1.0f }, fb[] = { -0.0f, 0.0f, 1.0f, NAN }, fd[4];
    weft_reduce_local(fd, fa, fb, 4, WEFT_FLOAT32, WEFT_MAX, 0);
    cr_assert(signbit(fd[0]) && !signbit(fd[1]) && fd[2] == 1.0f && isnan(fd[3]),
              "f32 max: %g %g %g %g", fd[0], fd[1], fd[2], fd[3]);
    weft_reduce_local(fd, fa, fb, 4, WEFT_FLOAT32, WEFT_MIN, 0);
    cr_assert(signbit(fd[0]) && !signbit(fd[1]) && fd[2] == 1.0f && isnan(fd[3]),
              "f32 min: %g %g %g %g", fd[0], fd[1], fd[2], fd[3]);
    for (int bf = 0; bf < 2; bf++) {
        weft_dtype_t dt = bf ? WEFT_BFLOAT16 : WEFT_FLOAT16;
        uint16_t one = bf ? 0x3f80 : 0x3c00, qnan = bf ? 0x7fc0 : 0x7e00;
        uint16_t ha[] = { 0x0000, 0x8000, qnan, one }, hb[] = { 0x8000, 0x0000, one, qnan };
        uint16_t hd[4];
        for (int op = WEFT_MAX; op <= WEFT_MIN; op++) {
            weft_reduce_local(hd, ha, hb, 4, dt, (weft_op_t)op, 0);
            cr_assert(hd[0] == 0x8000 && hd[1] == 0x0000 && hd[2] == one &&
                          is_nan16(hd[3], bf ? BF16 : F16),
                      "%s %s: 0x%04x 0x%04x 0x%04x 0x%04x", dname[dt], oname[op], hd[0], hd[1],
                      hd[2], hd[3]);
        }
    }
}

Test(reduce, int_avg_truncates_toward_zero)
{
    int32_t a[] = { -7, 7, -1, INT32_MIN }, b[] = { 0, 0, 0, 0 }, d[4];
    weft_reduce_local(d, a, b, 4, WEFT_INT32, WEFT_AVG, 2);
    cr_assert(d[0] == -3 && d[1] == 3 && d[2] == 0 && d[3] == INT32_MIN / 2, "%d %d %d %d", d[0],
              d[1], d[2], d[3]);
    int8_t x = 100, y = 100, z; /* wraps to -56 first, then divides */
    weft_reduce_local(&z, &x, &y, 1, WEFT_INT8, WEFT_AVG, 4);
    cr_assert(z == -14, "int8 avg: %d", z);
}

Test(reduce, empty_and_invalid)
{
    /* n == 0 touches nothing, not even the pointers. */
    weft_reduce_local(NULL, NULL, NULL, 0, WEFT_FLOAT32, WEFT_SUM, 0);
    float a = 1, b = 2, d = 7;
    weft_reduce_local(&d, &a, &b, 1, (weft_dtype_t)42, WEFT_SUM, 0);
    cr_assert(d == 7, "an invalid dtype wrote %g", d);
    weft_reduce_local(&d, &a, &b, 1, WEFT_FLOAT32, (weft_op_t)-1, 0);
    cr_assert(d == 7, "an invalid op wrote %g", d);
}
