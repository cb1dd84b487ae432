/*
 * common.h - the shared driver of the nccl-tests style benchmarks.
 *
 * Each perf/<coll>.c describes one collective with a perf_coll and hands it
 * to perf_main(); everything else (flags, buffers, timing, checking, the
 * table and the JSON file) lives in common.c.  Written against weft.h only.
 */
#ifndef WEFT_PERF_COMMON_H
#define WEFT_PERF_COMMON_H

#include <stddef.h>

#include <weft.h>

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
} perf_call_t;

/* What a benchmark binary contributes: a static constant, never changed. */
typedef struct {
    const char *name;      /* "all_reduce", printed in the header */
    perf_kind_t kind;
    int has_op;            /* -o applies; the redop column shows "none" otherwise */
    int has_root;          /* -r applies; the root column shows -1 otherwise */
    int check_in_place;    /* 0 where in place aliases the data (sendrecv) */
    double (*bus_factor)(int nranks);  /* busbw = algbw * bus_factor(n) */
    weft_status_t (*run)(const perf_call_t *call, weft_comm_t comm);
} perf_coll_t;

/* "8", "64K", "32M", "1G" (powers of 1024) -> bytes; 0, or -1 when it is
 * not such a size or overflows size_t. */
int perf_parse_size(const char *s, size_t *out);

/* Parses argv, runs the benchmark, returns the process exit status:
 * 0 when every call succeeded and no value was wrong. */
int perf_main(const perf_coll_t *coll, int argc, char **argv);

#endif /* WEFT_PERF_COMMON_H */
