/*
 * nccl_allreduce_perf.c - AllReduce timed through the NCCL API only
 * (nccl.h + libc), to measure what weft's NCCL layer costs next to
 * all_reduce_perf, which calls weft directly.  Host buffers, stream NULL.
 *
 *   weftrun -n 4 ./nccl_allreduce_perf [-b 8] [-e 64M] [-f 4] [-n 20] [-w 5]
 *
 * Prints per size: time per call (as all_reduce_perf measures it: -n calls
 * back to back after a synchronizing AllReduce, averaged, the slowest rank's
 * figure), algbw and busbw (nccl-tests' definitions), and #wrong.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "nccl.h"

#define OK(call)                                                                              \
    do {                                                                                      \
        ncclResult_t r_ = (call);                                                             \
        if (r_ != ncclSuccess) {                                                              \
            fprintf(stderr, "%s: %s (%s)\n", #call, ncclGetErrorString(r_),                   \
                    ncclGetLastError(NULL));                                                  \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static size_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (size_t)v;
}

int main(int argc, char **argv)
{
    size_t minb = 8, maxb = 64u << 20, factor = 4;
    int iters = 20, warmup = 5;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "-b") == 0)
            minb = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-e") == 0)
            maxb = parse_size(argv[i + 1]);
        else if (strcmp(argv[i], "-f") == 0)
            factor = (size_t)atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-n") == 0)
            iters = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "-w") == 0)
            warmup = atoi(argv[i + 1]);
    }
    const char *r = getenv("WEFT_RANK"), *n = getenv("WEFT_NRANKS");
    if (!r || !n || factor < 2 || iters < 1 || minb < 4) {
        fprintf(stderr, "run under weftrun; -f >= 2, -n >= 1, -b >= 4\n");
        return 2;
    }
    int rank = atoi(r), p = atoi(n);
    ncclUniqueId id;
    OK(ncclGetUniqueId(&id));
    ncclComm_t comm;
    OK(ncclCommInitRank(&comm, p, id, rank));

    size_t maxn = maxb / sizeof(float);
    float *send, *recv;
    OK(ncclMemAlloc((void **)&send, maxn * sizeof(float)));
    OK(ncclMemAlloc((void **)&recv, maxn * sizeof(float)));
    memset(send, 0, maxn * sizeof(float));
    memset(recv, 0, maxn * sizeof(float));
    if (rank == 0)
        printf("# nccl_allreduce_perf: %d ranks, float sum, host buffers, NCCL API\n"
               "#%11s %12s %10s %10s %7s\n",
               p, "size(B)", "time(us)", "algbw", "busbw", "#wrong");
    for (size_t bytes = minb; bytes <= maxb; bytes *= factor) {
        size_t cnt = bytes / sizeof(float);
        for (size_t i = 0; i < cnt; i++)
            send[i] = (float)((rank + (int)i) % 5);
        for (int w = 0; w < warmup; w++)
            OK(ncclAllReduce(send, recv, cnt, ncclFloat, ncclSum, comm, NULL));
        double sync = 0, dt, slowest;
        OK(ncclAllReduce(&sync, &sync, 1, ncclDouble, ncclSum, comm, NULL));
        double t0 = now_us();
        for (int it = 0; it < iters; it++)
            OK(ncclAllReduce(send, recv, cnt, ncclFloat, ncclSum, comm, NULL));
        dt = (now_us() - t0) / iters;
        /* The slowest rank's time is the collective's time. */
        OK(ncclAllReduce(&dt, &slowest, 1, ncclDouble, ncclMax, comm, NULL));
        long wrong = 0;
        for (size_t i = 0; i < cnt; i++) {
            float want = 0;
            for (int q = 0; q < p; q++)
                want += (float)((q + (int)i) % 5);
            wrong += recv[i] != want;
        }
        long all_wrong = 0;
        OK(ncclAllReduce(&wrong, &all_wrong, 1, ncclInt64, ncclSum, comm, NULL));
        double algbw = (double)bytes / slowest / 1e3;
        if (rank == 0)
            printf(" %11zu %12.1f %10.2f %10.2f %7ld\n", bytes, slowest, algbw,
                   algbw * 2.0 * (p - 1) / p, all_wrong);
    }
    OK(ncclMemFree(send));
    OK(ncclMemFree(recv));
    OK(ncclCommDestroy(comm));
    return 0;
}
