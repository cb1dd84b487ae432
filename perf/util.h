/*
 * util.h - what the perf tools share with weft-soak and with their MPI
 * twin, bench/mpi_coll_perf.c, which is built alone with mpicc: sizes on
 * the command line, buffers, the clock and the table's column heads.
 * Header-only and libc-only for that reason.
 */
#ifndef WEFT_PERF_UTIL_H
#define WEFT_PERF_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define PERF_HUGE (2u << 20)

/* "8", "64K", "32M", "1G" (powers of 1024) -> bytes; 0, or -1 when it is
 * not such a size or overflows size_t. */
static inline int perf_parse_size(const char *s, size_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10), mult = 1;
    if (errno)
        return -1;
    switch (*end) {
    case 'k': case 'K': mult = 1ull << 10; end++; break;
    case 'm': case 'M': mult = 1ull << 20; end++; break;
    case 'g': case 'G': mult = 1ull << 30; end++; break;
    default: break;
    }
    if (*end != '\0' || v > SIZE_MAX / mult)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

/* Allocates and touches a benchmark buffer; asks for huge pages on big
 * ones because a first touch of a small page costs ~13us here.  NULL when
 * out of memory; free() releases it. */
static inline void *perf_alloc_touched(size_t bytes)
{
    size_t align = bytes >= PERF_HUGE ? PERF_HUGE : 4096;
    bytes = (bytes + align - 1) / align * align;
    void *p = NULL;
    if (posix_memalign(&p, align, bytes) != 0)
        return NULL;
    if (bytes >= PERF_HUGE)
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* a hint: kernels without THP say EINVAL */
    memset(p, 0, bytes);
    return p;
}

static inline double perf_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

/* The header's "step:" value: "8(factor)" or "1048576(bytes)". */
static inline void perf_step_text(char *out, size_t len, long stepfactor, size_t stepbytes)
{
    if (stepfactor > 1)
        snprintf(out, len, "%ld(factor)", stepfactor);
    else
        snprintf(out, len, "%zu(bytes)", stepbytes);
}

/* The table's column heads, as nccl-tests prints them: each placement's
 * label centred over its 33-column block. */
static inline void perf_print_columns(void)
{
    printf("#%51s%22s%11s%21s\n", "", "out-of-place", "", "in-place");
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "size",
           "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
           "algbw", "busbw", "#wrong");
    printf("#%11s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s\n", "(B)",
           "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
           "(GB/s)", "");
}

#endif /* WEFT_PERF_UTIL_H */
