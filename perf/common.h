/*
 * common.h - the shared driver of the nccl-tests style benchmarks.
 *
 * Each perf/<coll>.c names its collective's kind to perf_main(); the
 * collectives' calls and bus factors, and everything else (flags, buffers,
 * timing, checking, the table and the JSON file) live in common.c; -G 1's
 * device buffers and stream in gpu.c.  Written against weft.h, but for
 * gpu.c, which uses the library's CUDA driver table.
 */
#ifndef WEFT_PERF_COMMON_H
#define WEFT_PERF_COMMON_H

#include <stddef.h>

#include <weft.h>

#include "util.h"

/* How the data of one call is laid out, which decides where the input is
 * written, where the in-place input lives and what the output must hold. */
typedef enum {
    PERF_KIND_ALLREDUCE,      /* count in, count out, reduced */
    PERF_KIND_REDUCE_SCATTER, /* count*n in, count out: block rank of the reduction */
    PERF_KIND_ALLGATHER,      /* count in, count*n out: block src is rank src's input */
    PERF_KIND_BROADCAST,      /* root's count in, count out everywhere */
    PERF_KIND_REDUCE,         /* count in, count out on root only */
    PERF_KIND_SENDRECV        /* count to rank+1, count from rank-1 */
} perf_kind_t;

/* The arguments of one call, built by the driver for each size and
 * placement.  count is the count argument of the weft call (per rank for
 * reduce_scatter and allgather).  The buffers belong to the driver. */
typedef struct {
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    weft_dtype_t dtype;
    weft_op_t op;
    int root; /* -1 where the collective has no root */
    int rank;
    int nranks;
    int on_stream;        /* -G 1: device buffers, the _stream forms on stream */
    weft_stream_t stream;
} perf_call_t;

/* Parses argv, runs the benchmark of kind, returns the process exit
 * status: 0 when every call succeeded and no value was wrong. */
int perf_main(perf_kind_t kind, int argc, char **argv);

#endif /* WEFT_PERF_COMMON_H */
