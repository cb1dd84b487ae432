/*
 * test_cuda_kernels.c - the CUDA reduction kernels, run on the CPU through
 * the fake driver's emulation (tests/fakecuda/kernels_host.c), against
 * weft_reduce_local bit for bit; their names and the embedded fatbin.
 */
#include <criterion/criterion.h>
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config.h" /* HAVE_NVCC */
#include "src/cuda/kernels.h"
#include "src/reduce.h"
#include "testutil.h"

#include "tests/fakecuda/fakecuda.h"

static const size_t esize[WEFT_NUM_DTYPES] = { 1, 1, 4, 4, 8, 8, 2, 4, 8, 2 };
static const char *const dname[WEFT_NUM_DTYPES] = { "int8", "uint8", "int32", "uint32", "int64",
                                                    "uint64", "f16", "f32", "f64", "bf16" };
static const char *const oname[WEFT_NUM_OPS] = { "sum", "prod", "max", "min", "avg" };

static const struct fakecuda_kernel *emulated(weft_dtype_t dt, weft_op_t op)
{
    const char *name = weft_cuda_kernel_name(dt, op);
    for (size_t k = 0; name && k < fakecuda_nkernels; k++)
        if (strcmp(fakecuda_kernels[k].name, name) == 0)
            return &fakecuda_kernels[k];
    return NULL;
}

/* Host memory stands in for device memory: a device pointer is the
 * address itself. */
static void *xlat_identity(CUdeviceptr p)
{
    return (void *)(uintptr_t)p;
}

/* ---- inputs ---------------------------------------------------------------------
 * Half of the elements come from a list of edge values, the rest are
 * random bits (floats: every class, NaN payloads included) or, for
 * integers, small values of either sign (AVG's truncation of negatives). */

static const uint64_t edge_int[] = {
    0, 1, 2, 3, ~0ull /* -1 */, ~1ull /* -2 */, ~6ull /* -7 */, 100, ~99ull /* -100 */,
};
static const uint32_t edge_f32[] = {
    0x00000000, 0x80000000, 0x3f800000, 0xbf800000, 0x40400000, /* +-0, +-1, 3 */
    0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000,             /* +-Inf, +-qNaN */
    0x7f800001, 0x7fc12345, 0xffbfffff,                         /* sNaN, payloads */
    0x00000001, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, /* subnormal, normal, max */
    0x33800000, 0x4b800000,                                     /* 2^-24, 2^24 */
};
static const uint64_t edge_f64[] = {
    0x0000000000000000ull, 0x8000000000000000ull, 0x3ff0000000000000ull,
    0xbff0000000000000ull, 0x4008000000000000ull, 0x7ff0000000000000ull,
    0xfff0000000000000ull, 0x7ff8000000000000ull, 0xfff8000000000000ull,
    0x7ff0000000000001ull, 0x7ff8123456789abcull, 0x0000000000000001ull,
    0x800fffffffffffffull, 0x0010000000000000ull, 0x7fefffffffffffffull,
    0xffefffffffffffffull, 0x3ca0000000000000ull, /* 2^-53 */
};
static const uint16_t edge_f16[] = {
    0x0000, 0x8000, 0x3c00, 0xbc00, 0x4200,         /* +-0, +-1, 3 */
    0x7c00, 0xfc00, 0x7e00, 0xfe00, 0x7c01, 0x7dff, /* +-Inf, NaNs, sNaN */
    0x0001, 0x83ff, 0x0400, 0x7bff, 0xfbff,         /* subnormals, normal, max */
    0x6800, 0x1400,                                 /* 2048 (ties), 2^-10 */
};
static const uint16_t edge_bf16[] = {
    0x0000, 0x8000, 0x3f80, 0xbf80, 0x4040,         /* +-0, +-1, 3 */
    0x7f80, 0xff80, 0x7fc0, 0xffc0, 0x7f81, 0x7fff, /* +-Inf, NaNs, sNaN */
    0x0001, 0x807f, 0x0080, 0x7f7f, 0xff7f,         /* subnormals, normal, max */
    0x4b00, 0x3b80,                                 /* 2^23, 2^-8 */
};

#define PICK(list, r) (list)[(r) % (sizeof(list) / sizeof((list)[0]))]

static void fill(void *buf, size_t n, weft_dtype_t dt)
{
    size_t es = esize[dt];
    for (size_t i = 0; i < n; i++) {
        uint64_t r = weft_test_rnd(), v = weft_test_rnd();
        bool edge = r & 1;
        r >>= 1;
        switch (dt) {
        case WEFT_FLOAT16:
            if (edge)
                v = PICK(edge_f16, r);
            break;
        case WEFT_BFLOAT16:
            if (edge)
                v = PICK(edge_bf16, r);
            break;
        case WEFT_FLOAT32:
            if (edge)
                v = PICK(edge_f32, r);
            break;
        case WEFT_FLOAT64:
            if (edge)
                v = PICK(edge_f64, r);
            break;
        default:
            if (edge) {
                /* The extremes of the type: sums and products wrap. */
                uint64_t top = 1ull << (es * 8 - 1);
                uint64_t ext[] = { top, top - 1, top + 1, ~0ull >> (64 - es * 8) };
                v = r % 3 == 0 ? PICK(ext, r / 3) : PICK(edge_int, r / 3);
            } else if (r % 2 == 0) {
                v = (uint64_t)(int64_t)(int8_t)(r >> 8);
            }
            break;
        }
        memcpy((char *)buf + i * es, &v, es); /* low bytes: little-endian */
    }
}

/* ---- the matrix ------------------------------------------------------------------ */

static bool is_nan(weft_dtype_t dt, uint64_t v)
{
    switch (dt) {
    case WEFT_FLOAT16: return (v & 0x7c00) == 0x7c00 && (v & 0x03ff);
    case WEFT_BFLOAT16: return (v & 0x7f80) == 0x7f80 && (v & 0x007f);
    case WEFT_FLOAT32: return (v & 0x7f800000) == 0x7f800000 && (v & 0x007fffff);
    case WEFT_FLOAT64:
        return (v & 0x7ff0000000000000ull) == 0x7ff0000000000000ull &&
               (v & 0x000fffffffffffffull);
    default: return false;
    }
}

/* The one difference allowed: when both operands of +, * (or AVG's +) are
 * NaN, IEEE 754 leaves open which payload the result carries, and
 * compilers swap the operands of a commutative op as they like (gcc does
 * between the vector and scalar loops); it must still be a NaN.  A GPU
 * differs further (its NaN results are canonical): see kernels.h. */
static bool nan_either_way(weft_dtype_t dt, weft_op_t op, uint64_t x, uint64_t y, uint64_t want,
                           uint64_t got)
{
    return op != WEFT_MAX && op != WEFT_MIN && is_nan(dt, x) && is_nan(dt, y) &&
           is_nan(dt, want) && is_nan(dt, got);
}

struct shape {
    unsigned grid, block;
};
/* One thread, a few odd ones, a typical launch, and more threads than the
 * largest n (5 * 1024 > 4099). */
static const struct shape shapes[] = { { 1, 1 }, { 3, 7 }, { 64, 256 }, { 5, 1024 } };
static const size_t lens[] = { 0, 1, 7, 1000, 4099 };

static void launch(const struct fakecuda_kernel *k, void *dst, const void *a, const void *b,
                   size_t n, int div, struct shape s)
{
    CUdeviceptr dd = (CUdeviceptr)(uintptr_t)dst, da = (CUdeviceptr)(uintptr_t)a,
                db = (CUdeviceptr)(uintptr_t)b;
    void *params[] = { &dd, &da, &db, &n, &div };
    k->run(params, s.grid, s.block, xlat_identity);
}

/* One (dtype, op, n, div, shape): into a separate dst, into a and into b,
 * each compared with weft_reduce_local byte for byte. */
static void run_case(weft_dtype_t dt, weft_op_t op, size_t n, int div, struct shape s)
{
    const struct fakecuda_kernel *k = emulated(dt, op);
    cr_assert(k, "no emulated kernel for %s %s", dname[dt], oname[op]);
    size_t es = esize[dt], bytes = n * es;
    char *a0 = malloc(bytes + 1), *b0 = malloc(bytes + 1), *want = malloc(bytes + 1);
    char *a = malloc(bytes + 1), *b = malloc(bytes + 1), *d = malloc(bytes + 1);
    cr_assert(a0 && b0 && want && a && b && d);
    fill(a0, n, dt);
    fill(b0, n, dt);
    weft_reduce_local(want, a0, b0, n, dt, op, div);
    for (int how = 0; how < 3; how++) {
        memcpy(a, a0, bytes);
        memcpy(b, b0, bytes);
        memset(d, 0x5a, bytes + 1);
        a[bytes] = b[bytes] = 0x5a;
        char *dst = how == 0 ? d : how == 1 ? a : b;
        launch(k, dst, a, b, n, div, s);
        for (size_t i = 0; i < n; i++) {
            if (memcmp(dst + i * es, want + i * es, es) == 0)
                continue;
            uint64_t x = 0, y = 0, w = 0, got = 0;
            memcpy(&x, a0 + i * es, es);
            memcpy(&y, b0 + i * es, es);
            memcpy(&w, want + i * es, es);
            memcpy(&got, dst + i * es, es);
            if (nan_either_way(dt, op, x, y, w, got))
                continue;
            cr_assert_fail("%s %s div %d n %zu grid %ux%u %s [%zu]: 0x%llx, 0x%llx: host 0x%llx, "
                           "kernel 0x%llx",
                           dname[dt], oname[op], div, n, s.grid, s.block,
                           how == 0 ? "dst=new" : how == 1 ? "dst=a" : "dst=b", i,
                           (unsigned long long)x, (unsigned long long)y, (unsigned long long)w,
                           (unsigned long long)got);
        }
        cr_assert(d[bytes] == 0x5a && a[bytes] == 0x5a && b[bytes] == 0x5a,
                  "%s %s n %zu grid %ux%u: wrote past the end", dname[dt], oname[op], n, s.grid,
                  s.block);
        if (how == 0)
            cr_assert(memcmp(a, a0, bytes) == 0 && memcmp(b, b0, bytes) == 0,
                      "%s %s n %zu grid %ux%u: an input changed", dname[dt], oname[op], n,
                      s.grid, s.block);
    }
    free(a0);
    free(b0);
    free(want);
    free(a);
    free(b);
    free(d);
}

static void run_matrix(weft_dtype_t dt)
{
    /* AVG: no divisor and a negative one are sums; 200 is wider than int8. */
    static const int avg_divs[] = { 0, -3, 1, 3, 200 };
    for (int op = 0; op < WEFT_NUM_OPS; op++) {
        size_t ndiv = op == WEFT_AVG ? sizeof(avg_divs) / sizeof(avg_divs[0]) : 1;
        for (size_t dv = 0; dv < ndiv; dv++) {
            /* Other ops ignore the divisor: pass one anyway. */
            int div = op == WEFT_AVG ? avg_divs[dv] : 5;
            for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++) {
                for (size_t s = 0; s < sizeof(shapes) / sizeof(shapes[0]); s++) {
                    weft_test_rng_state = 0x9e3779b97f4a7c15ull ^ ((uint64_t)dt << 40) ^
                                          ((uint64_t)op << 32) ^ ((uint64_t)dv << 24) ^
                                          (l << 8) ^ s;
                    run_case(dt, (weft_op_t)op, lens[l], div, shapes[s]);
                }
            }
        }
    }
}

Test(cuda_kernels, int8) { run_matrix(WEFT_INT8); }
Test(cuda_kernels, uint8) { run_matrix(WEFT_UINT8); }
Test(cuda_kernels, int32) { run_matrix(WEFT_INT32); }
Test(cuda_kernels, uint32) { run_matrix(WEFT_UINT32); }
Test(cuda_kernels, int64) { run_matrix(WEFT_INT64); }
Test(cuda_kernels, uint64) { run_matrix(WEFT_UINT64); }
Test(cuda_kernels, f16) { run_matrix(WEFT_FLOAT16); }
Test(cuda_kernels, f32) { run_matrix(WEFT_FLOAT32); }
Test(cuda_kernels, f64) { run_matrix(WEFT_FLOAT64); }
Test(cuda_kernels, bf16) { run_matrix(WEFT_BFLOAT16); }

/* The portable f16 converters too: on F16C machines weft_reduce_local
 * otherwise runs them only in block tails. */
Test(cuda_kernels, f16_portable)
{
    weft_reduce_f16c_ = false;
    run_matrix(WEFT_FLOAT16);
    weft_reduce_f16c_ = true;
}

/* ---- names and the fatbin -------------------------------------------------------- */

Test(cuda_kernels, names)
{
    const char *seen[WEFT_NUM_DTYPES * WEFT_NUM_OPS];
    size_t nseen = 0;
    for (int dt = 0; dt < WEFT_NUM_DTYPES; dt++) {
        for (int op = 0; op < WEFT_NUM_OPS; op++) {
            const char *name = weft_cuda_kernel_name((weft_dtype_t)dt, (weft_op_t)op);
            cr_assert(name, "%s %s has no kernel name", dname[dt], oname[op]);
            for (size_t j = 0; j < nseen; j++)
                cr_assert(strcmp(seen[j], name) != 0, "%s %s: name %s used twice", dname[dt],
                          oname[op], name);
            seen[nseen++] = name;
            size_t found = 0;
            for (size_t k = 0; k < fakecuda_nkernels; k++)
                found += strcmp(fakecuda_kernels[k].name, name) == 0;
            cr_assert(found == 1, "%s is defined %zu times by kernels_body.h", name, found);
        }
    }
    cr_assert(fakecuda_nkernels == nseen, "kernels_body.h defines %zu kernels, %zu are named",
              fakecuda_nkernels, nseen);
    cr_assert_null(weft_cuda_kernel_name(WEFT_NUM_DTYPES, WEFT_SUM));
    cr_assert_null(weft_cuda_kernel_name((weft_dtype_t)-1, WEFT_SUM));
    cr_assert_null(weft_cuda_kernel_name(WEFT_FLOAT32, WEFT_NUM_OPS));
    cr_assert_null(weft_cuda_kernel_name(WEFT_FLOAT32, (weft_op_t)-1));
}

#ifdef HAVE_NVCC
/* A fatbin (its magic, 0xba55ed50 little-endian) that keeps each kernel's
 * symbol name, which cuModuleGetFunction looks up. */
Test(cuda_kernels, fatbin_has_every_kernel)
{
    static const unsigned char magic[] = { 0x50, 0xed, 0x55, 0xba };
    cr_assert(weft_cuda_fatbin_len > sizeof magic, "the fatbin is empty");
    cr_assert(memcmp(weft_cuda_fatbin, magic, sizeof magic) == 0, "not a fatbin");
    cr_assert((uintptr_t)weft_cuda_fatbin % 8 == 0, "the fatbin is not 8-byte aligned");
    for (int dt = 0; dt < WEFT_NUM_DTYPES; dt++) {
        for (int op = 0; op < WEFT_NUM_OPS; op++) {
            const char *name = weft_cuda_kernel_name((weft_dtype_t)dt, (weft_op_t)op);
            /* With its NUL: a symbol, not the prefix of a longer one. */
            cr_assert(memmem(weft_cuda_fatbin, weft_cuda_fatbin_len, name, strlen(name) + 1),
                      "%s is not in the fatbin", name);
        }
    }
}
#else
Test(cuda_kernels, no_nvcc_no_fatbin)
{
    cr_assert(weft_cuda_fatbin_len == 0, "built without nvcc, yet a %zu-byte fatbin",
              weft_cuda_fatbin_len);
}
#endif
