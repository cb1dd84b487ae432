/*
 * ll.c - small collectives among ranks that all share memory, in one
 * exchange: each rank puts what each peer needs into that peer's short-
 * message slot (the transport's ll_* ops: data and flag in one cache line
 * up to 48 bytes) and takes what the peers put for it.  No engine op, no
 * schedule, no request.  Reductions fold the ranks' data in rank order,
 * so every rank computes the same bits, run after run.
 *
 * Every call exchanges a message both ways on each pair it uses (an empty
 * one where a side has nothing to say: broadcast's non-roots, reduce's
 * root), which is what lets the transport reuse two slots per direction.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine_impl.h"
#include "ll.h"
#include "reduce.h"
#include "select/tune.h"
#include "transports/transport.h"

struct weft_ll {
    const struct weft_transport_ops *ops; /* every peer's transport (the same one) */
    size_t max;                           /* bytes per message, the same on every rank */
    void *scratch;                        /* (max) an in-place reduction's accumulator */
    pthread_mutex_t mu;                   /* one call at a time on the slots */
    _Atomic unsigned told;                /* colls whose first use was logged */
};

/* A wait this long without the peer's message checks on it and on comm. */
#define LL_CHECK_NS 1000000ull
#define LL_NAP_NS 100000L /* past the spin: sleep this long between looks */

void weft_ll_setup(struct weft_comm *comm)
{
    comm->ll = NULL;
    if (comm->nranks < 2)
        return;
    const struct weft_transport_ops *ops = NULL;
    size_t max = SIZE_MAX;
    for (int r = 0; r < comm->nranks; r++) {
        if (r == comm->rank)
            continue;
        const struct weft_transport_ops *o = comm->link_ops[r];
        if (o == NULL || o->ll_put == NULL || (ops != NULL && o != ops) || comm->conns[r] == NULL)
            return;
        ops = o;
        max = WEFT_MIN(max, o->ll_bytes(comm->conns[r]));
    }
    if (max == 0)
        return;
    struct weft_ll *ll = calloc(1, sizeof(*ll));
    void *scratch = NULL;
    if (ll == NULL || posix_memalign(&scratch, 64, max) != 0) {
        free(ll);
        return; /* the engine carries every call: slower, not wrong */
    }
    ll->ops = ops;
    ll->max = max;
    ll->scratch = scratch;
    pthread_mutex_init(&ll->mu, NULL);
    comm->ll = ll;
}

void weft_ll_free(struct weft_comm *comm)
{
    struct weft_ll *ll = comm->ll;
    if (ll == NULL)
        return;
    pthread_mutex_destroy(&ll->mu);
    free(ll->scratch);
    free(ll);
    comm->ll = NULL;
}

size_t weft_ll_max(const struct weft_comm *comm)
{
    return comm->ll ? comm->ll->max : 0;
}

/* What ll_get returned (d, len): the message if it is this call's. */
static weft_status_t arrived(struct weft_comm *comm, const struct weft_op_args *a, int peer,
                             const void *d, size_t len, size_t want, const void **out)
{
    if (WEFT_LIKELY(d != NULL && len == want)) {
        *out = d;
        return WEFT_OK;
    }
    return weft_engine_fail(comm, weft_error(weft_comm_err(comm), WEFT_ERR_MISMATCH,
                                 "rank %d: %s of %zu elements: rank %d sent %s%zu bytes where "
                                 "%zu were expected; the ranks' calls differ",
                                 comm->rank, weft_coll_name(a->coll), a->count, peer,
                                 d ? "" : "more than ", d ? len : comm->ll->max, want));
}

/* The peer's message for this call, once it is there: spins (yielding the
 * core when ranks outnumber cores, or once the wait outlasts a peer's
 * step), then naps; checks the peer's life and comm's state every
 * LL_CHECK_NS, and gives up after WEFT_TIMEOUT_MS. */
static weft_status_t take_slow(struct weft_comm *comm, const struct weft_op_args *a, int peer,
                               size_t want, const void **out)
{
    struct weft_ll *ll = comm->ll;
    void *conn = comm->conns[peer];
    uint64_t spin_ns;
    bool yield;
    weft_engine_spin(comm->eng, &spin_ns, &yield);
    uint64_t t0 = weft_now_ns(), next_check = t0 + LL_CHECK_NS;
    for (;;) {
        size_t len;
        const void *d = ll->ops->ll_get(conn, &len);
        if (d != NULL || len != 0)
            return arrived(comm, a, peer, d, len, want, out);
        uint64_t now = weft_now_ns(), waited = now - t0;
        if (now >= next_check) {
            next_check = now + LL_CHECK_NS;
            weft_status_t st = (weft_status_t)atomic_load(&comm->error);
            if (st == WEFT_OK && atomic_load(&comm->aborting))
                st = WEFT_ERR_ABORTED;
            if (st != WEFT_OK)
                return st;
            st = ll->ops->ll_check(conn);
            if (st == WEFT_OK && waited > comm->timeout_ns)
                st = weft_error(weft_comm_err(comm), WEFT_ERR_TIMEOUT,
                                "rank %d: %s of %zu elements made no progress for %llu ms "
                                "(WEFT_TIMEOUT_MS); waiting on: receive from rank %d",
                                comm->rank, weft_coll_name(a->coll), a->count,
                                (unsigned long long)(comm->timeout_ns / 1000000), peer);
            if (st != WEFT_OK) {
                /* A peer that put its message and then left (its call done,
                 * its communicator destroyed) may have done both since our
                 * look: the message is still this call's. */
                d = ll->ops->ll_get(conn, &len);
                if (d != NULL || len != 0)
                    return arrived(comm, a, peer, d, len, want, out);
                return weft_engine_fail(comm, st); /* comm's now, told to the peers */
            }
        }
        if (waited < spin_ns) {
            if (yield || waited > YIELD_AFTER_NS)
                sched_yield();
        } else {
            struct timespec nap = {0, LL_NAP_NS};
            nanosleep(&nap, NULL);
        }
    }
}

static inline weft_status_t take(struct weft_comm *comm, const struct weft_op_args *a, int peer,
                                 size_t want, const void **out)
{
    size_t len;
    const void *d = comm->ll->ops->ll_get(comm->conns[peer], &len);
    if (WEFT_LIKELY(d != NULL || len != 0))
        return arrived(comm, a, peer, d, len, want, out);
    return take_slow(comm, a, peer, want, out);
}

static inline void put(struct weft_comm *comm, int peer, const void *buf, size_t len)
{
    comm->ll->ops->ll_put(comm->conns[peer], buf, len);
}

/* Puts to every peer, the next rank first, so that ranks do not all write
 * to rank 0 at once; peer q gets len bytes at base + q * stride. */
static void put_all(struct weft_comm *comm, const char *base, size_t stride, size_t len)
{
    for (int i = 1; i < comm->nranks; i++) {
        int q = (comm->rank + i) % comm->nranks;
        put(comm, q, base ? base + (size_t)q * stride : NULL, len);
    }
}

/* out = data of rank 0 op ... op data of rank p-1, in that order; mine is
 * this rank's data, peers' messages come in as they are taken.  out may be
 * the scratch (in place) but never mine. */
static weft_status_t fold(struct weft_comm *comm, const struct weft_op_args *a, const void *mine,
                          size_t n, void *out)
{
    int p = comm->nranks, me = comm->rank;
    const void *first = mine;
    if (me != 0)
        WEFT_CHECK(take(comm, a, 0, n, &first));
    for (int r = 1; r < p; r++) {
        const void *d = mine;
        if (r != me)
            WEFT_CHECK(take(comm, a, r, n, &d));
        int divisor = a->op == WEFT_AVG && r == p - 1 ? p : 0;
        weft_reduce_local(out, r == 1 ? first : out, d, a->count, a->dtype, a->op, divisor);
    }
    return WEFT_OK;
}

static weft_status_t run(struct weft_comm *comm, const struct weft_op_args *a, size_t n)
{
    struct weft_ll *ll = comm->ll;
    int p = comm->nranks, me = comm->rank;
    const char *send = a->sendbuf;
    char *recv = a->recvbuf;
    const void *d;
    switch (a->coll) {
    case WEFT_COLL_ALLREDUCE: {
        put_all(comm, send, 0, n);
        void *acc = recv == send ? ll->scratch : recv;
        WEFT_CHECK(fold(comm, a, send, n, acc));
        if (acc != recv)
            memcpy(recv, acc, n);
        return WEFT_OK;
    }
    case WEFT_COLL_REDUCE_SCATTER: {
        put_all(comm, send, n, n);
        const char *mine = send + (size_t)me * n;
        void *acc = recv == mine ? ll->scratch : recv;
        WEFT_CHECK(fold(comm, a, mine, n, acc));
        if (acc != recv)
            memcpy(recv, acc, n);
        return WEFT_OK;
    }
    case WEFT_COLL_ALLGATHER:
        put_all(comm, send, 0, n);
        for (int i = 1; i < p; i++) {
            int r = (me + p - i) % p; /* the order they were put in */
            WEFT_CHECK(take(comm, a, r, n, &d));
            memcpy(recv + (size_t)r * n, d, n);
        }
        if (send != recv + (size_t)me * n)
            memcpy(recv + (size_t)me * n, send, n);
        return WEFT_OK;
    case WEFT_COLL_BROADCAST:
        if (me == a->root) {
            put_all(comm, send, 0, n);
            for (int r = 0; r < p; r++)
                if (r != me)
                    WEFT_CHECK(take(comm, a, r, 0, &d));
            if (recv != send)
                memcpy(recv, send, n);
            return WEFT_OK;
        }
        put(comm, a->root, NULL, 0);
        WEFT_CHECK(take(comm, a, a->root, n, &d));
        memcpy(recv, d, n);
        return WEFT_OK;
    case WEFT_COLL_REDUCE:
        if (me != a->root) {
            put(comm, a->root, send, n);
            return take(comm, a, a->root, 0, &d);
        }
        put_all(comm, NULL, 0, 0);
        {
            void *acc = recv == send ? ll->scratch : recv;
            WEFT_CHECK(fold(comm, a, send, n, acc));
            if (acc != recv)
                memcpy(recv, acc, n);
        }
        return WEFT_OK;
    default: return WEFT_ERR_INTERNAL;
    }
}

bool weft_ll_run(struct weft_comm *comm, const struct weft_op_args *a, weft_status_t *st)
{
    struct weft_ll *ll = comm->ll;
    if (ll == NULL || a->count == 0 || a->coll == WEFT_COLL_SEND || a->coll == WEFT_COLL_RECV ||
        comm->algos[a->coll] != WEFT_PLAN_ALL || comm->eng->check)
        return false;
    /* Every collective's largest message is count elements. */
    size_t n = a->count * weft_dtype_size(a->dtype);
    if (n > ll->max)
        return false;
    if (!(atomic_fetch_or(&ll->told, 1u << a->coll) & (1u << a->coll)))
        WEFT_INFO(WEFT_SUB_COLL, "%s of up to %zu bytes on %d ranks: one shared-memory exchange "
                  "(WEFT_SHM_LL_BYTES)", weft_coll_name(a->coll), ll->max, comm->nranks);
    pthread_mutex_lock(&ll->mu);
    *st = run(comm, a, n);
    pthread_mutex_unlock(&ll->mu);
    /* Calls complete in issue order: not before the non-blocking ones
     * issued earlier (the exchange itself needs none of them). */
    if (*st == WEFT_OK)
        *st = weft_engine_drain(comm);
    return true;
}
