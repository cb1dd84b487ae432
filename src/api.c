/*
 * api.c - the public entry points of the collectives: every argument is
 * checked here, so a bad call returns WEFT_ERR_INVALID_ARG with a message
 * and changes nothing; then the call becomes an engine op (blocking, non-
 * blocking, or queued in a group).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/schedule.h"
#include "comm.h"
#include "devbuf.h"
#include "engine.h"
#include "ll.h"
#include "select/tune.h"

size_t weft_dtype_size(weft_dtype_t dtype)
{
    switch (dtype) {
    case WEFT_INT8:
    case WEFT_UINT8: return 1;
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16: return 2;
    case WEFT_INT32:
    case WEFT_UINT32:
    case WEFT_FLOAT32: return 4;
    case WEFT_INT64:
    case WEFT_UINT64:
    case WEFT_FLOAT64: return 8;
    default: return 0;
    }
}

/* Ops queued by blocking calls between weft_group_start and _end. */
struct group_item {
    struct weft_comm *comm;
    struct weft_op *op;
};
static __thread int group_depth;
static __thread struct group_item *group_items;
static __thread size_t group_n, group_cap;

static bool ranges_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x < y + blen && y < x + alen;
}

/* Checks everything about a call; the message names the function. */
static weft_status_t check_args(const char *fn, struct weft_comm *comm, struct weft_op_args *a)
{
    weft_status_t sticky = (weft_status_t)atomic_load(&comm->error);
    if (sticky != WEFT_OK)
        return sticky; /* the message of the first failure stays in last_error */
    size_t esize = weft_dtype_size(a->dtype);
    if (esize == 0)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: invalid datatype %d", fn,
                                (int)a->dtype);
    if (weft_coll_reduces(a->coll) && ((unsigned)a->op >= WEFT_NUM_OPS))
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: invalid reduction op %d", fn,
                                (int)a->op);
    int p = comm->nranks;
    bool rooted = weft_coll_rooted(a->coll);
    bool p2p = a->coll == WEFT_COLL_SEND || a->coll == WEFT_COLL_RECV;
    if ((rooted || p2p) && (a->root < 0 || a->root >= p))
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: %s %d out of range (0..%d)", fn,
                                p2p ? "peer" : "root", a->root, p - 1);
    /* Element counts of each buffer, guarded against overflow. */
    size_t mult = a->coll == WEFT_COLL_ALLGATHER || a->coll == WEFT_COLL_REDUCE_SCATTER ? (size_t)p : 1;
    if (a->count > SIZE_MAX / 2 / esize / mult)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                                "%s: count %zu overflows the addressable size", fn, a->count);
    struct weft_coll_desc d = {.coll = a->coll, .rank = comm->rank, .nranks = p, .root = a->root,
                               .count = a->count};
    size_t sbytes = weft_coll_send_count(&d) * esize, rbytes = weft_coll_recv_count(&d) * esize;
    bool need_send = sbytes > 0 && !(a->coll == WEFT_COLL_BROADCAST && comm->rank != a->root);
    bool need_recv = rbytes > 0 && !(a->coll == WEFT_COLL_REDUCE && comm->rank != a->root);
    if (need_send && a->sendbuf == NULL)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: %s is NULL with count %zu", fn,
                                p2p ? "buf" : "sendbuf", a->count);
    if (need_recv && a->recvbuf == NULL)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: %s is NULL with count %zu", fn,
                                p2p ? "buf" : "recvbuf", a->count);
    if (need_send && need_recv && a->sendbuf != a->recvbuf) {
        /* In place is exact aliasing (or NCCL's offsets); partial overlap is a bug. */
        const char *s = a->sendbuf;
        char *r = a->recvbuf;
        bool inplace = (a->coll == WEFT_COLL_ALLGATHER && s == r + (size_t)comm->rank * sbytes) ||
                       (a->coll == WEFT_COLL_REDUCE_SCATTER && r == s + (size_t)comm->rank * rbytes);
        if (!inplace && ranges_overlap(s, sbytes, r, rbytes))
            return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                                    "%s: sendbuf and recvbuf overlap without being in place", fn);
    }
    return WEFT_OK;
}

/* Where a call goes: stream: the _stream form (the device worker orders
 * it on the stream); else device buffers found in a plain call are staged
 * by the worker while the caller waits. */
struct call_how {
    bool has_stream;
    void *stream;
};

static weft_status_t run_acquired(const char *fn, struct weft_comm *comm,
                                  struct weft_op_args *a, weft_request_t *req,
                                  const struct call_how *how)
{
    WEFT_CHECK(check_args(fn, comm, a));
    if (how != NULL && how->has_stream)
        return weft_dev_call(comm, a, true, how->stream, fn, group_depth > 0);
    if (weft_dev_on_device(comm, a->sendbuf, a->recvbuf)) {
        if (req != NULL)
            return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_UNSUPPORTED,
                                    "%s: device buffers in a non-blocking call: use the _stream "
                                    "form (its stream is the request)", fn);
        return weft_dev_call(comm, a, false, NULL, fn, group_depth > 0);
    }
    /* Calls reach the engine in the order they were made. */
    WEFT_CHECK(weft_dev_drain(comm));
    weft_status_t st;
    if (req == NULL && group_depth == 0 && weft_ll_run(comm, a, &st))
        return st;
    struct weft_op *op;
    WEFT_CHECK(weft_engine_op_new(comm, a, &op));
    if (req != NULL) {
        weft_engine_submit(comm, op, true);
        *req = (weft_request_t)op;
        return WEFT_OK;
    }
    if (group_depth > 0) {
        if (group_n == group_cap) {
            size_t cap = group_cap ? 2 * group_cap : 16;
            struct group_item *n = realloc(group_items, cap * sizeof(*n));
            if (n == NULL) {
                weft_engine_op_free(comm, op);
                return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "%s: cannot queue in the group", fn);
            }
            group_items = n;
            group_cap = cap;
        }
        group_items[group_n++] = (struct group_item){comm, op};
        return WEFT_OK;
    }
    weft_engine_submit(comm, op, false);
    return weft_engine_wait(comm, op);
}

static weft_status_t run_how(const char *fn, struct weft_comm *comm, struct weft_op_args *a,
                             weft_request_t *req, bool nonblocking, const struct call_how *how)
{
    if (req != NULL)
        *req = NULL;
    if (comm == NULL || !weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "%s: invalid communicator (NULL, destroyed or never created)", fn);
    weft_status_t st = nonblocking && req == NULL
                           ? weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: req is NULL", fn)
                           : run_acquired(fn, comm, a, req, how);
    weft_comm_release(comm);
    return st;
}

static weft_status_t run(const char *fn, struct weft_comm *comm, struct weft_op_args *a,
                         weft_request_t *req, bool nonblocking)
{
    return run_how(fn, comm, a, req, nonblocking, NULL);
}

static weft_status_t run_stream(const char *fn, struct weft_comm *comm, struct weft_op_args *a,
                                weft_stream_t stream)
{
    struct call_how how = {true, stream};
    return run_how(fn, comm, a, NULL, false, &how);
}

#define ARGS(c, s, r, n, t, o, rt)                                                          \
    (struct weft_op_args) { .coll = (c), .sendbuf = (s), .recvbuf = (r), .count = (n),      \
                            .dtype = (t), .op = (o), .root = (rt) }

weft_status_t weft_allreduce(const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                             weft_op_t op, weft_comm_t comm)
{
    struct weft_op_args a = ARGS(WEFT_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0);
    return run("weft_allreduce", comm, &a, NULL, false);
}

weft_status_t weft_iallreduce(const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                              weft_op_t op, weft_comm_t comm, weft_request_t *req)
{
    struct weft_op_args a = ARGS(WEFT_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0);
    return run("weft_iallreduce", comm, &a, req, true);
}

weft_status_t weft_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                  weft_dtype_t dtype, weft_op_t op, weft_comm_t comm)
{
    struct weft_op_args a =
        ARGS(WEFT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0);
    return run("weft_reduce_scatter", comm, &a, NULL, false);
}

weft_status_t weft_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                   weft_dtype_t dtype, weft_op_t op, weft_comm_t comm,
                                   weft_request_t *req)
{
    struct weft_op_args a =
        ARGS(WEFT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0);
    return run("weft_ireduce_scatter", comm, &a, req, true);
}

weft_status_t weft_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                             weft_dtype_t dtype, weft_comm_t comm)
{
    struct weft_op_args a = ARGS(WEFT_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, 0, 0);
    return run("weft_allgather", comm, &a, NULL, false);
}

weft_status_t weft_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                              weft_dtype_t dtype, weft_comm_t comm, weft_request_t *req)
{
    struct weft_op_args a = ARGS(WEFT_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, 0, 0);
    return run("weft_iallgather", comm, &a, req, true);
}

weft_status_t weft_broadcast(const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                             int root, weft_comm_t comm)
{
    struct weft_op_args a = ARGS(WEFT_COLL_BROADCAST, sendbuf, recvbuf, count, dtype, 0, root);
    return run("weft_broadcast", comm, &a, NULL, false);
}

weft_status_t weft_ibroadcast(const void *sendbuf, void *recvbuf, size_t count,
                              weft_dtype_t dtype, int root, weft_comm_t comm, weft_request_t *req)
{
    struct weft_op_args a = ARGS(WEFT_COLL_BROADCAST, sendbuf, recvbuf, count, dtype, 0, root);
    return run("weft_ibroadcast", comm, &a, req, true);
}

weft_status_t weft_reduce(const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                          weft_op_t op, int root, weft_comm_t comm)
{
    struct weft_op_args a = ARGS(WEFT_COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root);
    return run("weft_reduce", comm, &a, NULL, false);
}

weft_status_t weft_ireduce(const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                           weft_op_t op, int root, weft_comm_t comm, weft_request_t *req)
{
    struct weft_op_args a = ARGS(WEFT_COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root);
    return run("weft_ireduce", comm, &a, req, true);
}

weft_status_t weft_send(const void *buf, size_t count, weft_dtype_t dtype, int peer,
                        weft_comm_t comm)
{
    struct weft_op_args a = ARGS(WEFT_COLL_SEND, buf, NULL, count, dtype, 0, peer);
    return run("weft_send", comm, &a, NULL, false);
}

weft_status_t weft_isend(const void *buf, size_t count, weft_dtype_t dtype, int peer,
                         weft_comm_t comm, weft_request_t *req)
{
    struct weft_op_args a = ARGS(WEFT_COLL_SEND, buf, NULL, count, dtype, 0, peer);
    return run("weft_isend", comm, &a, req, true);
}

weft_status_t weft_recv(void *buf, size_t count, weft_dtype_t dtype, int peer, weft_comm_t comm)
{
    struct weft_op_args a = ARGS(WEFT_COLL_RECV, NULL, buf, count, dtype, 0, peer);
    return run("weft_recv", comm, &a, NULL, false);
}

weft_status_t weft_irecv(void *buf, size_t count, weft_dtype_t dtype, int peer, weft_comm_t comm,
                         weft_request_t *req)
{
    struct weft_op_args a = ARGS(WEFT_COLL_RECV, NULL, buf, count, dtype, 0, peer);
    return run("weft_irecv", comm, &a, req, true);
}

weft_status_t weft_allreduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                    weft_dtype_t dtype, weft_op_t op, weft_comm_t comm,
                                    weft_stream_t stream)
{
    struct weft_op_args a = ARGS(WEFT_COLL_ALLREDUCE, sendbuf, recvbuf, count, dtype, op, 0);
    return run_stream("weft_allreduce_stream", comm, &a, stream);
}

weft_status_t weft_reduce_scatter_stream(const void *sendbuf, void *recvbuf, size_t recvcount,
                                         weft_dtype_t dtype, weft_op_t op, weft_comm_t comm,
                                         weft_stream_t stream)
{
    struct weft_op_args a =
        ARGS(WEFT_COLL_REDUCE_SCATTER, sendbuf, recvbuf, recvcount, dtype, op, 0);
    return run_stream("weft_reduce_scatter_stream", comm, &a, stream);
}

weft_status_t weft_allgather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                    weft_dtype_t dtype, weft_comm_t comm, weft_stream_t stream)
{
    struct weft_op_args a = ARGS(WEFT_COLL_ALLGATHER, sendbuf, recvbuf, sendcount, dtype, 0, 0);
    return run_stream("weft_allgather_stream", comm, &a, stream);
}

weft_status_t weft_broadcast_stream(const void *sendbuf, void *recvbuf, size_t count,
                                    weft_dtype_t dtype, int root, weft_comm_t comm,
                                    weft_stream_t stream)
{
    struct weft_op_args a = ARGS(WEFT_COLL_BROADCAST, sendbuf, recvbuf, count, dtype, 0, root);
    return run_stream("weft_broadcast_stream", comm, &a, stream);
}

weft_status_t weft_reduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                 weft_dtype_t dtype, weft_op_t op, int root, weft_comm_t comm,
                                 weft_stream_t stream)
{
    struct weft_op_args a = ARGS(WEFT_COLL_REDUCE, sendbuf, recvbuf, count, dtype, op, root);
    return run_stream("weft_reduce_stream", comm, &a, stream);
}

weft_status_t weft_send_stream(const void *buf, size_t count, weft_dtype_t dtype, int peer,
                               weft_comm_t comm, weft_stream_t stream)
{
    struct weft_op_args a = ARGS(WEFT_COLL_SEND, buf, NULL, count, dtype, 0, peer);
    return run_stream("weft_send_stream", comm, &a, stream);
}

weft_status_t weft_recv_stream(void *buf, size_t count, weft_dtype_t dtype, int peer,
                               weft_comm_t comm, weft_stream_t stream)
{
    struct weft_op_args a = ARGS(WEFT_COLL_RECV, NULL, buf, count, dtype, 0, peer);
    return run_stream("weft_recv_stream", comm, &a, stream);
}

/* The request's communicator, entered; NULL (with a message) when it was
 * destroyed or aborted, which also ended the request. */
static struct weft_comm *req_comm(const char *fn, struct weft_op *op)
{
    struct weft_comm *comm = weft_op_comm(op);
    if (!weft_comm_acquire(comm)) {
        weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                         "%s: the request's communicator was destroyed or aborted", fn);
        return NULL;
    }
    return comm;
}

weft_status_t weft_wait(weft_request_t req)
{
    if (req == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_wait: req is NULL");
    struct weft_op *op = (struct weft_op *)req;
    struct weft_comm *comm = req_comm("weft_wait", op);
    if (comm == NULL)
        return WEFT_ERR_INVALID_ARG;
    weft_status_t st = weft_engine_wait(comm, op);
    weft_comm_release(comm);
    return st;
}

weft_status_t weft_test(weft_request_t req, int *done)
{
    if (req == NULL || done == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_test: %s is NULL",
                                req == NULL ? "req" : "done");
    struct weft_op *op = (struct weft_op *)req;
    struct weft_comm *comm = req_comm("weft_test", op);
    if (comm == NULL)
        return WEFT_ERR_INVALID_ARG;
    weft_status_t st = weft_engine_test(comm, op, done);
    weft_comm_release(comm);
    return st;
}

weft_status_t weft_group_start(void)
{
    group_depth++;
    return WEFT_OK;
}

weft_status_t weft_group_end(void)
{
    if (group_depth == 0)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_group_end without a matching weft_group_start");
    if (--group_depth > 0)
        return WEFT_OK;
    /* Start everything, then wait for everything: matching sends and
     * receives progress together, so no order of calls can deadlock. */
    size_t n = group_n;
    group_n = 0;
    weft_status_t first = WEFT_OK;
    /* One thread can drive one engine at a time: when the group spans
     * several communicators (several ranks of one process, as with
     * ncclCommInitAll), their progress threads drive them all at once. */
    bool background = false;
    for (size_t i = 1; i < n && !background; i++)
        background = group_items[i].comm != group_items[0].comm;
    for (size_t i = 0; i < n; i++) {
        struct group_item *g = &group_items[i];
        if (!weft_comm_acquire(g->comm)) {
            /* Aborted or destroyed since the call queued it: the op never
             * reached the engine, so it is ours to free. */
            weft_engine_op_discard(g->op);
            g->op = NULL;
            if (first == WEFT_OK)
                first = weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                         "weft_group_end: a communicator of the group was "
                                         "destroyed or aborted before the group ended");
            continue;
        }
        weft_engine_submit(g->comm, g->op, background);
    }
    /* Device calls of the group: one job per communicator. */
    weft_status_t dst = weft_dev_group_end();
    if (first == WEFT_OK)
        first = dst;
    for (size_t i = 0; i < n; i++) {
        struct group_item *g = &group_items[i];
        if (g->op == NULL)
            continue;
        weft_status_t st = weft_engine_wait(g->comm, g->op);
        weft_comm_release(g->comm);
        if (first == WEFT_OK && st != WEFT_OK)
            first = st;
    }
    return first;
}

weft_status_t weft_comm_set_algo(weft_comm_t comm, const char *spec)
{
    if (comm == NULL || !weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_set_algo: invalid communicator (NULL, destroyed or "
                                "never created)");
    unsigned masks[WEFT_COLL_COUNT];
    weft_status_t st = weft_tune_parse_algo(spec ? spec : "", masks);
    if (st != WEFT_OK)
        st = weft_error_quiet(weft_comm_err(comm), st, "weft_comm_set_algo: %s", weft_thread_last_error());
    else if (group_depth > 0)
        st = weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                              "weft_comm_set_algo: inside a group (the calls it holds were "
                              "planned with the algorithms before)");
    /* The calls already issued finish with the plans they have; then the
     * choices made (and measured) under the old set are forgotten. */
    else if ((st = weft_dev_drain(comm)) == WEFT_OK && (st = weft_engine_drain(comm)) == WEFT_OK) {
        memcpy(comm->algos, masks, sizeof(masks));
        weft_tune_cache_free(&comm->tune);
    }
    weft_comm_release(comm);
    return st;
}
