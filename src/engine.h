/*
 * engine.h - runs operations: each is a schedule (algorithms/schedule.h)
 * executed over the communicator's transport connections, several chunks in
 * flight, receive-and-reduce fused per chunk.  Operations of one
 * communicator complete in issue order; consecutive ones may overlap on the
 * wire because per-peer message order is kept across them.
 */
#ifndef WEFT_ENGINE_H
#define WEFT_ENGINE_H

#include "comm.h"
#include "base/internal.h"

struct weft_op;
struct weft_engine;

/* A validated call: count as in struct weft_coll_desc; peer for send/recv
 * is in root. */
struct weft_op_args {
    int coll; /* enum weft_coll */
    const void *sendbuf;
    void *recvbuf;
    size_t count;
    weft_dtype_t dtype;
    weft_op_t op;
    int root;
};

/* What the engine has done, for tests and benchmarks.  ops and checks are
 * exact at any time; sends is exact while no op is in flight. */
struct weft_engine_stats {
    uint64_t ops;    /* operations submitted by callers */
    uint64_t checks; /* fingerprint exchanges run before collectives (WEFT_CHECK) */
    uint64_t sends;  /* messages handed to a transport (sends to self excluded) */
};

/* Reads WEFT_CHECK: with it set and more than one rank, every collective
 * is preceded by a fingerprint exchange (src/check.h). */
weft_status_t weft_engine_create(struct weft_comm *comm, struct weft_engine **out) WEFT_HIDDEN;
/* Stops the progress thread and frees everything; ops must be finished
 * (weft_engine_drain) or failed (weft_engine_abort) first.  NULL ok. */
void weft_engine_destroy(struct weft_engine *eng) WEFT_HIDDEN;

/* Sets how long a waiting driver spins before sleeping: WEFT_SPIN_US, or
 * when it is -1 (auto), spin only if this host's ranks fit its cores; and
 * sizes and touches the staging slots by the host's share (src/op.c). */
void weft_engine_tune(struct weft_engine *eng, int local_ranks) WEFT_HIDDEN;
/* What weft_engine_tune chose: spin time, and whether to yield meanwhile. */
void weft_engine_spin(const struct weft_engine *eng, uint64_t *spin_ns, bool *yield) WEFT_HIDDEN;

/* Builds (or takes from the cache) the op's schedule.  With WEFT_CHECK, a
 * collective also gets its fingerprint exchange, submitted with it; the
 * collective moves no byte until every rank's fingerprint agrees, and a
 * disagreement fails the communicator with WEFT_ERR_MISMATCH. */
weft_status_t weft_engine_op_new(struct weft_comm *comm, const struct weft_op_args *args,
                                 struct weft_op **out) WEFT_HIDDEN;
/* Queues op; it may start moving at once.  With background = true the
 * progress thread is started (non-blocking calls). */
void weft_engine_submit(struct weft_comm *comm, struct weft_op *op, bool background) WEFT_HIDDEN;
/* Waits for op (driving progress when no one else does), frees it and
 * returns its status. */
weft_status_t weft_engine_wait(struct weft_comm *comm, struct weft_op *op) WEFT_HIDDEN;
/* *done = 1: op finished and was freed, the return value is its status. */
weft_status_t weft_engine_test(struct weft_comm *comm, struct weft_op *op, int *done) WEFT_HIDDEN;
/* Frees an op that was never submitted, when its engine is already gone. */
void weft_engine_op_discard(struct weft_op *op) WEFT_HIDDEN;
/* Frees an op that was never submitted. */
void weft_engine_op_free(struct weft_comm *comm, struct weft_op *op) WEFT_HIDDEN;
/* Waits until every submitted op has finished. */
weft_status_t weft_engine_drain(struct weft_comm *comm) WEFT_HIDDEN;
/* Fails every pending op with status and wakes all waiters; returns once
 * no thread is driving progress. */
void weft_engine_abort(struct weft_comm *comm, weft_status_t status) WEFT_HIDDEN;
/* A failure found outside the engine (src/ll.c): makes status comm's
 * sticky error if it has none, tells the peers and fails every pending
 * op, as the engine does with its own; returns the sticky error. */
weft_status_t weft_engine_fail(struct weft_comm *comm, weft_status_t status) WEFT_HIDDEN;
/* Runs fn(arg) as the thread that drives comm (once the current driver,
 * if any, lets go): what it does to the transports races with nothing. */
weft_status_t weft_engine_exclusive(struct weft_comm *comm, weft_status_t (*fn)(void *), void *arg)
    WEFT_HIDDEN;
struct weft_comm *weft_op_comm(struct weft_op *op) WEFT_HIDDEN;
void weft_engine_get_stats(struct weft_comm *comm, struct weft_engine_stats *out) WEFT_HIDDEN;

#endif /* WEFT_ENGINE_H */
