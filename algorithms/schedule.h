/*
 * schedule.h - the one format algorithms emit: per rank, an ordered list of
 * steps over element ranges of three buffers, with dependencies.
 *
 * The engine executes it, the tests run it symbolically; algorithms never
 * see a transport.  Matching rule: the k-th SEND a rank's schedule has for
 * peer P meets the k-th RECV or RECV_REDUCE in P's schedule for that rank.
 * Steps with count 0 are never emitted.
 */
#ifndef WEFT_SCHEDULE_H
#define WEFT_SCHEDULE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"

enum weft_coll {
    WEFT_COLL_ALLREDUCE = 0,
    WEFT_COLL_REDUCE_SCATTER,
    WEFT_COLL_ALLGATHER,
    WEFT_COLL_BROADCAST,
    WEFT_COLL_REDUCE,
    WEFT_COLL_SEND,
    WEFT_COLL_RECV,
    WEFT_COLL_COUNT
};
const char *weft_coll_name(int coll) WEFT_HIDDEN;
/* Whether coll combines contributions (allreduce, reduce_scatter, reduce). */
bool weft_coll_reduces(int coll) WEFT_HIDDEN;

enum weft_step_kind {
    WEFT_STEP_SEND = 0,    /* send buf[off, off+count) to peer */
    WEFT_STEP_RECV,        /* receive from peer into buf[off, ...) */
    WEFT_STEP_RECV_REDUCE, /* receive from peer t; buf[off..] = src_buf[src_off..] op t */
    WEFT_STEP_COPY         /* buf[off..] = src_buf[src_off..] (skipped when same memory) */
};

enum weft_buf_id { WEFT_BUF_SEND = 0, WEFT_BUF_RECV = 1, WEFT_BUF_SCRATCH = 2 };

#define WEFT_STEP_FINAL 0x1 /* RECV_REDUCE producing a final value: AVG divides here */
#define WEFT_STEP_RECV_FIRST 0x2 /* RECV_REDUCE: buf = received op src (operand order) */
#define WEFT_STEP_MAX_DEPS 3

struct weft_step {
    uint8_t kind;  /* enum weft_step_kind */
    uint8_t flags; /* WEFT_STEP_* */
    uint8_t buf;   /* SEND: source; RECV, RECV_REDUCE, COPY: destination */
    uint8_t src_buf; /* RECV_REDUCE: local operand; COPY: source */
    int32_t peer;    /* -1 for COPY */
    int32_t deps[WEFT_STEP_MAX_DEPS]; /* earlier steps that must be complete; -1 pads */
    size_t off;     /* elements into buf */
    size_t src_off; /* elements into src_buf */
    size_t count;   /* elements */
};

/* Invariant: deps[i] < index of the step itself. */
struct weft_schedule {
    struct weft_step *steps;
    size_t nsteps, cap;
    size_t scratch_count; /* elements of WEFT_BUF_SCRATCH the schedule uses */
};

/* The algorithm families; names (weft_algo_name) are the ones WEFT_ALGO,
 * the perf tools' -a, weft-info and the logs use. */
enum weft_algo {
    WEFT_ALGO_RING = 0, /* "ring": rings and pipelined chains */
    WEFT_ALGO_TREE,     /* "tree": double binary tree; binomial tree */
    WEFT_ALGO_RHD,      /* "rhd": recursive halving/doubling, Rabenseifner, scatter+allgather */
    WEFT_ALGO_DIRECT,   /* "direct": every pair at once (small rank counts) */
    WEFT_ALGO_HIER,     /* "hier": within each node, among nodes, within each node */
    WEFT_ALGO_COUNT
};
const char *weft_algo_name(int algo) WEFT_HIDDEN;
/* The name's algorithm (case-insensitive), or -1. */
int weft_algo_from_name(const char *name, size_t len) WEFT_HIDDEN;

/* Variants: one family may build more than one schedule for a collective;
 * selection weighs each.  0 is a family's default. */
enum {
    WEFT_VAR_DEFAULT = 0,
    WEFT_VAR_RHD_RABENSEIFNER = 0, /* rhd allreduce: halving reduce-scatter + doubling allgather */
    WEFT_VAR_RHD_DOUBLING = 1,     /* rhd allreduce: whole vector exchanged log2(p) times */
    WEFT_VAR_TREE_DOUBLE = 0,      /* tree: two complementary binary trees, half the data each */
    WEFT_VAR_TREE_BINOMIAL = 1,    /* tree broadcast/reduce: one binomial tree */
    WEFT_VAR_HIER_RING = 0,        /* hier: the node leaders' step as a ring */
    WEFT_VAR_HIER_RHD = 1,         /* hier: the node leaders' step as rhd */
    WEFT_VAR_COUNT = 2
};

/* What a schedule is built for.  count means: allreduce, broadcast, reduce:
 * elements per rank; reduce_scatter: recvcount; allgather: sendcount. */
struct weft_coll_desc {
    int coll;         /* enum weft_coll */
    int rank, nranks;
    int root;         /* broadcast/reduce */
    size_t count;
    size_t chunk;     /* most elements one step may carry (>= 1) */
    int algo;         /* enum weft_algo */
    int variant;      /* WEFT_VAR_* of algo */
    int ordered;      /* deterministic mode: every element combined as
                         x0 op x1 op ... op x(p-1), left to right */
    const int *node;  /* hier: node[r] in [0, nnodes) for each rank; NULL: one node */
    int nnodes;
};

/* Whether algo's variant builds a schedule for coll (on any rank count). */
bool weft_algo_serves(int algo, int variant, int coll) WEFT_HIDDEN;

void weft_sched_init(struct weft_schedule *s) WEFT_HIDDEN;
void weft_sched_free(struct weft_schedule *s) WEFT_HIDDEN;
/* Appends a step; returns its index, or -1 when out of memory. */
int32_t weft_sched_add(struct weft_schedule *s, const struct weft_step *st) WEFT_HIDDEN;
/* Appends a step with one dependency (-1: none), the builders' common
 * case; *idx (when not NULL) gets its index.  Out of memory is
 * WEFT_ERR_NO_MEMORY with a message naming who. */
weft_status_t weft_sched_step(struct weft_schedule *s, const char *who, int kind, int flags,
                              int buf, int src_buf, int peer, size_t off, size_t src_off,
                              size_t count, int32_t dep, int32_t *idx) WEFT_HIDDEN;

/* Elements of sendbuf / recvbuf a collective reads or writes on this rank. */
size_t weft_coll_send_count(const struct weft_coll_desc *d) WEFT_HIDDEN;
size_t weft_coll_recv_count(const struct weft_coll_desc *d) WEFT_HIDDEN;

/* Builds d->algo's schedule (its variant d->variant). */
weft_status_t weft_sched_build(const struct weft_coll_desc *d, struct weft_schedule *s) WEFT_HIDDEN;

/* Recursive doubling allreduce (algorithms/rd.c; rhd's WEFT_VAR_RHD_DOUBLING): log2(p) exchanges of the
 * whole vector, non-powers of two folded in and out; partners combine in
 * the same operand order, so every rank's result is bitwise identical. */
weft_status_t weft_rd_build(const struct weft_coll_desc *d, struct weft_schedule *s) WEFT_HIDDEN;

/* Recursive halving/doubling (algorithms/rhd.c), variant 0: Rabenseifner
 * allreduce, reduce_scatter, allgather, broadcast (scatter + allgather) and
 * reduce (reduce-scatter + gather), any nranks >= 1, root and count;
 * WEFT_VAR_RHD_DOUBLING: weft_rd_build (allreduce only). */
weft_status_t weft_rhd_build(const struct weft_coll_desc *d, struct weft_schedule *s) WEFT_HIDDEN;

/* Tree schedules (algorithms/tree.c), pipelined in chunks, any nranks >= 1
 * and any count.  WEFT_VAR_TREE_DOUBLE: allreduce, reduce and broadcast
 * over two complementary binary trees, half of the vector each:
 * ceil(log2(p + 1)) levels for allreduce; for reduce and broadcast the
 * root sits above two trees over the other ranks, ceil(log2 p) + 1.
 * WEFT_VAR_TREE_BINOMIAL: broadcast and reduce over a binomial tree,
 * ceil(log2 p) hops.  Other collectives: WEFT_ERR_UNSUPPORTED. */
weft_status_t weft_tree_build(const struct weft_coll_desc *d, struct weft_schedule *s) WEFT_HIDDEN;

/* Every pair at once (algorithms/direct.c), for small rank counts:
 * allreduce (direct reduce-scatter then direct allgather), reduce_scatter,
 * allgather, broadcast (the root sends to each rank) and reduce (each rank
 * sends to the root).  Any nranks >= 1 and any count. */
weft_status_t weft_direct_build(const struct weft_coll_desc *d,
                                struct weft_schedule *s) WEFT_HIDDEN;

/* Ring algorithm (algorithms/ring.c): allreduce as reduce-scatter then
 * allgather, reduce_scatter, allgather, and pipelined chains for broadcast
 * and reduce.  With d->ordered, allreduce, reduce_scatter and reduce run a
 * chain 0 -> 1 -> ... -> p-1 that combines every element as the left fold
 * in rank order, and rank p-1 hands out the result.  Any nranks >= 1 and
 * any count, 0 included. */
weft_status_t weft_ring_build(const struct weft_coll_desc *d, struct weft_schedule *s) WEFT_HIDDEN;

/* Hierarchical schedules (algorithms/hier.c): within each node (d->node,
 * d->nnodes; NULL: one node), among the nodes (variant: ring, or recursive
 * doubling and binomial trees), within each node again, for allreduce,
 * reduce_scatter, allgather, broadcast and reduce on any node map.  A node
 * map entry outside [0, nnodes), or nnodes < 1 with a map, is
 * WEFT_ERR_INVALID_ARG. */
weft_status_t weft_hier_build(const struct weft_coll_desc *d, struct weft_schedule *s) WEFT_HIDDEN;

#endif /* WEFT_SCHEDULE_H */
