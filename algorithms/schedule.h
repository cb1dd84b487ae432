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
const char *weft_coll_name(enum weft_coll coll) WEFT_HIDDEN;
/* Whether coll combines contributions (allreduce, reduce_scatter, reduce). */
bool weft_coll_reduces(enum weft_coll coll) WEFT_HIDDEN;
/* Whether coll has a root (broadcast, reduce). */
bool weft_coll_rooted(enum weft_coll coll) WEFT_HIDDEN;

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
    /* Most steps it may grow to (0: no limit; weft_sched_init sets 0): a
     * build that would pass it stops with WEFT_ERR_UNSUPPORTED, so that
     * the simulator refuses a schedule too large to run (direct's root at
     * 1 GiB on 16,384 ranks: 33 M steps) having held at most this many. */
    size_t max_steps;
};

/* The algorithm families, one file each, listed in algorithms/list.h
 * (docs/design.md: how to add one).  The values are plan bits (select/tune.h)
 * and stay put; names (weft_algo_name) are the ones WEFT_ALGO, the perf
 * tools' -a, weft-info and the logs use. */
enum weft_algo {
#define WEFT_ALGO_ENTRY(e, d) WEFT_ALGO_##e,
#include "algorithms/list.h"
#undef WEFT_ALGO_ENTRY
    WEFT_ALGO_COUNT
};
const char *weft_algo_name(enum weft_algo algo) WEFT_HIDDEN;
/* The name's algorithm (case-insensitive), or -1. */
int weft_algo_from_name(const char *name, size_t len) WEFT_HIDDEN;
/* The variant's name ("doubling" for rhd's WEFT_VAR_RHD_DOUBLING), or NULL
 * where the family names none (a family of one variant) or has no such. */
const char *weft_algo_variant_name(enum weft_algo algo, int variant) WEFT_HIDDEN;
/* The variant of algo the name means (case-insensitive), or -1. */
int weft_algo_variant_from_name(enum weft_algo algo, const char *name, size_t len) WEFT_HIDDEN;

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
    enum weft_coll coll;
    int rank, nranks;
    int root;         /* broadcast/reduce */
    size_t count;
    size_t chunk;     /* most elements one step may carry (>= 1) */
    enum weft_algo algo;
    int variant;      /* WEFT_VAR_* of algo */
    int ordered;      /* deterministic mode: every element combined as
                         x0 op x1 op ... op x(p-1), left to right */
    const int *node;  /* hier: node[r] in [0, nnodes) for each rank; NULL: one node */
    int nnodes;
};

/* Whether algo's variant builds a schedule for coll (on any rank count). */
bool weft_algo_serves(enum weft_algo algo, int variant, enum weft_coll coll) WEFT_HIDDEN;

void weft_sched_init(struct weft_schedule *s) WEFT_HIDDEN;
void weft_sched_free(struct weft_schedule *s) WEFT_HIDDEN;
/* Appends a step; returns its index, or -1 when out of memory or at
 * s->max_steps. */
int32_t weft_sched_add(struct weft_schedule *s, const struct weft_step *st) WEFT_HIDDEN;
/* Appends *st; *idx (when not NULL) gets its index.  Out of memory is
 * WEFT_ERR_NO_MEMORY with a message naming who, s->max_steps reached
 * WEFT_ERR_UNSUPPORTED. */
weft_status_t weft_sched_push(struct weft_schedule *s, const char *who, const struct weft_step *st,
                              int32_t *idx) WEFT_HIDDEN;
/* Appends a step with one dependency (-1: none), the builders' common
 * case, through weft_sched_push. */
weft_status_t weft_sched_step(struct weft_schedule *s, const char *who, int kind, int flags,
                              int buf, int src_buf, int peer, size_t off, size_t src_off,
                              size_t count, int32_t dep, int32_t *idx) WEFT_HIDDEN;

/* Elements of sendbuf / recvbuf a collective reads or writes on this rank. */
size_t weft_coll_send_count(const struct weft_coll_desc *d) WEFT_HIDDEN;
size_t weft_coll_recv_count(const struct weft_coll_desc *d) WEFT_HIDDEN;

/* Builds d->algo's schedule (its variant d->variant) into s, which starts
 * from empty (its storage is reused).  A description the family does not
 * serve is WEFT_ERR_UNSUPPORTED, a malformed one (rank, root, chunk, a
 * count whose buffers overflow) WEFT_ERR_INVALID_ARG; on any error s is
 * left empty. */
weft_status_t weft_sched_build(const struct weft_coll_desc *d, struct weft_schedule *s) WEFT_HIDDEN;

#endif /* WEFT_SCHEDULE_H */
