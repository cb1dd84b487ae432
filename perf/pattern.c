/*
 * pattern.c - the benchmarks' data: dtype helpers, f16/bf16 conversions,
 * the periodic input patterns that stay exact under any reduction order,
 * their expected values, and filling and checking buffers against them.
 */
#include "pattern.h"

#include <stdint.h>
#include <string.h>

static int dtype_is_unsigned(weft_dtype_t t)
{
    return t == WEFT_UINT8 || t == WEFT_UINT32 || t == WEFT_UINT64;
}

static int dtype_is_float(weft_dtype_t t)
{
    return t == WEFT_FLOAT16 || t == WEFT_FLOAT32 || t == WEFT_FLOAT64 || t == WEFT_BFLOAT16;
}

/* The largest B such that every integer of magnitude <= B is representable
 * exactly in t (and in the double that computes the expected values). */
static double dtype_exact_bound(weft_dtype_t t)
{
    switch (t) {
    case WEFT_INT8: return 127.0;
    case WEFT_UINT8: return 255.0;
    case WEFT_INT32: return 2147483647.0;
    case WEFT_UINT32: return 4294967295.0;
    case WEFT_FLOAT16: return 2048.0;
    case WEFT_FLOAT32: return 16777216.0;
    case WEFT_BFLOAT16: return 256.0;
    default: return 9007199254740992.0; /* 2^53: int64, uint64, double */
    }
}

/* Round-to-nearest-even conversions; only integers pass through them here,
 * but they are correct for every float. */
static uint16_t half_from_float(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xff)
        return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0u));
    int e = (int)exp - 127 + 15;
    if (e >= 31)
        return (uint16_t)(sign | 0x7c00u);
    if (e <= 0) {
        if (e < -10)
            return (uint16_t)sign;
        man |= 0x800000u;
        unsigned shift = (unsigned)(14 - e);
        uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (h & 1u)))
            h++;
        return (uint16_t)(sign | h);
    }
    uint32_t h = ((uint32_t)e << 10) | (man >> 13), rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right answer, up to inf */
    return (uint16_t)(sign | h);
}

static float half_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t x;
    float f;
    if (exp == 0x1f) {
        x = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        f = (float)man * 0x1p-24f;
        memcpy(&x, &f, sizeof(x));
        x |= sign;
    } else {
        x = sign | ((exp + 112u) << 23) | (man << 13);
    }
    memcpy(&f, &x, sizeof(f));
    return f;
}

static uint16_t bf16_from_float(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof(x));
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* keep a NaN a NaN */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

static float bf16_to_float(uint16_t h)
{
    uint32_t x = (uint32_t)h << 16;
    float f;
    memcpy(&f, &x, sizeof(f));
    return f;
}

static void value_store(weft_dtype_t t, void *dst, double v)
{
    switch (t) {
    case WEFT_INT8: { int8_t x = (int8_t)v; memcpy(dst, &x, 1); break; }
    case WEFT_UINT8: { uint8_t x = (uint8_t)v; memcpy(dst, &x, 1); break; }
    case WEFT_INT32: { int32_t x = (int32_t)v; memcpy(dst, &x, 4); break; }
    case WEFT_UINT32: { uint32_t x = (uint32_t)v; memcpy(dst, &x, 4); break; }
    case WEFT_INT64: { int64_t x = (int64_t)v; memcpy(dst, &x, 8); break; }
    case WEFT_UINT64: { uint64_t x = (uint64_t)v; memcpy(dst, &x, 8); break; }
    case WEFT_FLOAT16: { uint16_t x = half_from_float((float)v); memcpy(dst, &x, 2); break; }
    case WEFT_FLOAT32: { float x = (float)v; memcpy(dst, &x, 4); break; }
    case WEFT_FLOAT64: memcpy(dst, &v, 8); break;
    case WEFT_BFLOAT16: { uint16_t x = bf16_from_float((float)v); memcpy(dst, &x, 2); break; }
    default: break;
    }
}

/* For messages only: 64-bit integers beyond 2^53 print rounded. */
double value_load(weft_dtype_t t, const void *src)
{
    union { int8_t i8; uint8_t u8; int32_t i32; uint32_t u32; int64_t i64; uint64_t u64;
            uint16_t h; float f; double d; } u;
    memcpy(&u, src, weft_dtype_size(t));
    switch (t) {
    case WEFT_INT8: return u.i8;
    case WEFT_UINT8: return u.u8;
    case WEFT_INT32: return u.i32;
    case WEFT_UINT32: return u.u32;
    case WEFT_INT64: return (double)u.i64;
    case WEFT_UINT64: return (double)u.u64;
    case WEFT_FLOAT16: return half_to_float(u.h);
    case WEFT_FLOAT32: return u.f;
    case WEFT_FLOAT64: return u.d;
    case WEFT_BFLOAT16: return bf16_to_float(u.h);
    default: return 0.0;
    }
}

static double pattern_value(const perf_pattern_t *p, int r, unsigned key)
{
    unsigned k = (key + (unsigned)r % PERF_PERIOD) % PERF_PERIOD;
    unsigned x = (37 * k * k + 11 * k) % PERF_PERIOD;
    switch (p->kind) {
    case GEN_RAW:
        return p->is_signed ? (double)k - 125.0 : (double)k;
    case GEN_SUM:
        if (p->d == 0 || x % p->d)
            return 0.0;
        x /= p->d;
        if (p->is_signed)
            return (double)(x % (2 * p->a + 1)) - (double)p->a;
        return (double)(x % (p->a + 1));
    case GEN_PROD:
        if (p->m && x % p->m == 0)
            return 2.0;
        return (p->is_signed && x % 3 == 1) ? -1.0 : 1.0;
    case GEN_FAVG: {
        double w = (double)(key % (2 * p->a + 1)) - (double)p->a;
        if ((r ^ 1) >= p->nranks)
            return w;
        unsigned kp = (key + (unsigned)(r / 2) % PERF_PERIOD) % PERF_PERIOD;
        if (p->d == 0 || kp % p->d)
            return w;
        double s = (double)((kp / p->d) % 3) - 1.0;
        return w + ((r & 1) ? -s : s);
    }
    }
    return 0.0;
}

/* True when no partial result of any reduction order can leave the range
 * where the dtype holds integers exactly. */
static int pattern_exact(const perf_pattern_t *p)
{
    double bound = dtype_exact_bound(p->dtype);
    int max_twos = 0;
    while (max_twos < 62 && (double)(UINT64_C(1) << (max_twos + 1)) <= bound)
        max_twos++;
    for (unsigned key = 0; key < PERF_PERIOD; key++) {
        double abs_sum = 0.0;
        int twos = 0;
        for (int r = 0; r < p->nranks; r++) {
            double v = pattern_value(p, r, key);
            abs_sum += v < 0 ? -v : v;
            twos += v == 2.0;
        }
        if (p->kind == GEN_PROD ? twos > max_twos : abs_sum > bound)
            return 0;
    }
    return 1;
}

/* Picks the densest inputs that stay exact; sparser ones as ranks grow. */
void pattern_fit(perf_pattern_t *p, weft_dtype_t dtype, weft_op_t op, int reduces,
                 int nranks)
{
    memset(p, 0, sizeof(*p));
    p->dtype = dtype;
    p->op = op;
    p->reduces = reduces;
    p->is_signed = !dtype_is_unsigned(dtype);
    p->nranks = nranks;
    p->a = p->d = p->m = 1;
    if (!reduces || op == WEFT_MAX || op == WEFT_MIN) {
        p->kind = GEN_RAW;
        return;
    }
    if (op == WEFT_PROD) {
        p->kind = GEN_PROD;
        for (p->m = 2; p->m <= 256; p->m *= 2)
            if (pattern_exact(p))
                return;
        p->m = 0; /* only +-1: exact for any n */
        return;
    }
    p->kind = (op == WEFT_AVG && dtype_is_float(dtype)) ? GEN_FAVG : GEN_SUM;
    /* Amplitudes as large as the dtype allows (up to 100), so that an average
     * over many ranks still spreads over many values. */
    unsigned amin = p->kind == GEN_FAVG ? 0 : 1;
    double room = dtype_exact_bound(dtype) / nranks - (p->kind == GEN_FAVG ? 1.0 : 0.0);
    unsigned astart = room >= 100.0 ? 100u : room >= amin ? (unsigned)room : amin;
    for (p->d = 1; p->d <= 256; p->d *= 2)
        for (p->a = astart; p->a + 1 > amin; p->a--)
            if (pattern_exact(p))
                return;
    p->d = 0; /* all zeros (SUM) or the shared w = 0 (FAVG): exact for any n */
    p->a = amin;
}

/* The exact result of the reduction at element index i (key = i % PERIOD). */
static double pattern_reduced(const perf_pattern_t *p, unsigned key)
{
    double acc = pattern_value(p, 0, key);
    for (int r = 1; r < p->nranks; r++) {
        double v = pattern_value(p, r, key);
        switch (p->op) {
        case WEFT_PROD: acc *= v; break;
        case WEFT_MAX: acc = v > acc ? v : acc; break;
        case WEFT_MIN: acc = v < acc ? v : acc; break;
        default: acc += v; break;
        }
    }
    if (p->op == WEFT_AVG)
        acc = dtype_is_float(p->dtype) ? acc / p->nranks
                                       : (double)((int64_t)acc / (int64_t)p->nranks);
    return acc;
}

/* A table holds 2*PERIOD encoded elements (the period twice), so that the
 * PERIOD elements from any phase are contiguous. */
void table_of_rank(const perf_pattern_t *p, int r, unsigned char *tab)
{
    size_t ts = weft_dtype_size(p->dtype);
    for (unsigned i = 0; i < 2 * PERF_PERIOD; i++)
        value_store(p->dtype, tab + i * ts, pattern_value(p, r, i % PERF_PERIOD));
}

void table_of_reduction(const perf_pattern_t *p, unsigned char *tab)
{
    size_t ts = weft_dtype_size(p->dtype);
    for (unsigned i = 0; i < PERF_PERIOD; i++)
        value_store(p->dtype, tab + i * ts, pattern_reduced(p, i));
    memcpy(tab + PERF_PERIOD * ts, tab, PERF_PERIOD * ts);
}

void table_of_constant(weft_dtype_t t, double v, unsigned char *tab)
{
    size_t ts = weft_dtype_size(t);
    for (unsigned i = 0; i < 2 * PERF_PERIOD; i++)
        value_store(t, tab + i * ts, v);
}

/* Flipping one bit of every expected element gives a filler that can never
 * pass the check, so an element the collective forgot to write counts. */
void table_poison(const unsigned char *tab, size_t ts, unsigned char *out)
{
    memcpy(out, tab, 2 * PERF_PERIOD * ts);
    for (unsigned i = 0; i < 2 * PERF_PERIOD; i++)
        out[i * ts] ^= 1u;
}

void buffer_fill(void *buf, size_t count, size_t ts, const unsigned char *tab, size_t phase)
{
    unsigned char *dst = buf;
    for (size_t done = 0; done < count; done += PERF_PERIOD) {
        size_t len = count - done < PERF_PERIOD ? count - done : PERF_PERIOD;
        memcpy(dst + done * ts, tab + phase * ts, len * ts);
    }
}

/* Counts the elements that differ bitwise from the table; remembers the
 * first one in *first (left alone when all match). */
int64_t buffer_wrong(const void *buf, size_t count, size_t ts, const unsigned char *tab,
                     size_t phase, size_t *first)
{
    const unsigned char *src = buf;
    int64_t wrong = 0;
    for (size_t done = 0; done < count; done += PERF_PERIOD) {
        size_t len = count - done < PERF_PERIOD ? count - done : PERF_PERIOD;
        const unsigned char *want = tab + phase * ts, *got = src + done * ts;
        if (memcmp(got, want, len * ts) == 0)
            continue;
        for (size_t i = 0; i < len; i++) {
            if (memcmp(got + i * ts, want + i * ts, ts) != 0) {
                if (wrong == 0)
                    *first = done + i;
                wrong++;
            }
        }
    }
    return wrong;
}
