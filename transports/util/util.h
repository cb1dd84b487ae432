/*
 * util.h - what every transport's data path shares, written once: the
 * request (its pool, its queues, posting it and test()), the head of a
 * connection (its failure record) and the thread that wakes a sleeper
 * blocked in another transport.  The per-message calls are inline; the
 * rest is in util.c.  The registration cache is regcache.h.
 */
#ifndef WEFT_TRANSPORT_UTIL_H
#define WEFT_TRANSPORT_UTIL_H

#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "base/internal.h"

#define WEFT_CONN_ERRMSG_LEN 384

struct weft_req;
struct weft_transport_init;

/* The entry points a transport's setup file gives its ops table, declared
 * in its header as `weft_tp_init_fn shm_init;` (their contracts are the
 * ops table's, transport.h). */
typedef weft_status_t weft_tp_init_fn(const struct weft_transport_init *args, void **ctx,
                                      void *addr, size_t *addrlen);
typedef weft_status_t weft_tp_connect_fn(void *ctx, int peer, const void *addr, size_t addrlen,
                                         void **conn);
typedef void weft_tp_finalize_fn(void *ctx);

/*
 * The start of every init: allocates the transport's context (`size`
 * bytes, zeroed).  NULL when there is no memory, recorded in args->err as
 * "shm init: out of memory".
 */
void *weft_tp_ctx_alloc(const struct weft_transport_init *args, size_t size, const char *tname)
    WEFT_HIDDEN;
/* The same for a context struct with the fields err, rank, nranks and reqs
 * (its request pool), filled from args; returns WEFT_ERR_NO_MEMORY from
 * the calling init when there is no memory. */
#define WEFT_TP_CTX_NEW(ctx, args, tname)                                             \
    do {                                                                              \
        if (((ctx) = weft_tp_ctx_alloc((args), sizeof(*(ctx)), (tname))) == NULL)    \
            return WEFT_ERR_NO_MEMORY;                                                \
        (ctx)->err = (args)->err;                                                     \
        (ctx)->rank = (args)->rank;                                                   \
        (ctx)->nranks = (args)->nranks;                                               \
        weft_req_pool_init(&(ctx)->reqs, (tname), (args)->err, (args)->rank);         \
    } while (0)

/* connect's check of its pointers, for a context with the field err:
 * returns WEFT_ERR_INVALID_ARG from the calling connect if one is NULL. */
#define WEFT_TP_CONNECT_CHECK(ctx, addr, conn, tname)                                 \
    do {                                                                              \
        if ((ctx) == NULL || (addr) == NULL || (conn) == NULL)                        \
            return weft_error_quiet((ctx) ? (ctx)->err : NULL, WEFT_ERR_INVALID_ARG,  \
                                    "%s connect: NULL argument", (tname));            \
    } while (0)

/*
 * The requests of one context, allocated in slabs that live until
 * weft_req_pool_fini; every request of a pool has the same size.  Zeroed
 * and then given err, rank and tname (weft_req_pool_init), it is empty and
 * ready.  One thread at a time (the context's).
 */
struct weft_req_pool {
    struct weft_req *free;
    void *slabs;                 /* linked through their first word */
    struct weft_errsink *err;    /* the context's record */
    int rank;                    /* the context's, for messages */
    const char *tname;           /* "shm" */
};

/*
 * The head of every transport's connection, its first member.  Owner: the
 * transport's conn.  err is OK until the first failure, then sticky;
 * errmsg says why, and is what every request failed with it reports.
 */
struct weft_conn {
    struct weft_req_pool *reqs;  /* its context's: where its requests come from */
    weft_status_t err;
    char errmsg[WEFT_CONN_ERRMSG_LEN];
};

/*
 * The head of every transport's request, its first member: a request
 * handle is also a struct weft_req *.  Owner: the pool; the caller borrows
 * the handle from isend/irecv until test() reports it done or failed.
 */
struct weft_req {
    struct weft_req *next;       /* the queue it waits in, or the pool's free list */
    struct weft_conn *conn;
    char *buf;
    size_t len;                  /* bytes posted */
    size_t bytes;                /* what test() reports: a send's length, what a receive got */
    weft_status_t status;        /* WEFT_INPROGRESS, then WEFT_OK or the failure */
};

/* Who the pool's messages speak for. */
static inline void weft_req_pool_init(struct weft_req_pool *p, const char *tname,
                                      struct weft_errsink *err, int rank)
{
    p->tname = tname;
    p->err = err;
    p->rank = rank;
}
/* Adds a slab of requests of `size` bytes (slabs are 64-byte aligned, and
 * so is each request whose size is a multiple of 64).  False: no memory. */
bool weft_req_pool_grow(struct weft_req_pool *p, size_t size) WEFT_HIDDEN;
/* Frees every slab: no request may be used again. */
void weft_req_pool_fini(struct weft_req_pool *p) WEFT_HIDDEN;

/* Back to its pool; nothing may point at it any more. */
static inline void weft_req_put(struct weft_req *r)
{
    struct weft_req_pool *p = r->conn->reqs;
    r->next = p->free;
    p->free = r;
}

/*
 * The start of every isend and irecv (what names them: "shm isend"):
 * checks the arguments, takes a request of `size` bytes (the transport's
 * struct, zeroed) for len bytes at buf on conn (a transport conn, its
 * struct weft_conn first) and hands it to the caller in *out.  Returns
 * WEFT_INPROGRESS when the transport has the request to move; WEFT_OK
 * when it has nothing to do with it (conn has failed: the request carries
 * that failure); an error when there is no request (recorded).
 */
static inline weft_status_t weft_req_post(const char *what, void *conn, size_t size, void *buf,
                                          size_t len, void **out)
{
    struct weft_conn *c = conn;
    if (c == NULL || out == NULL || (buf == NULL && len > 0))
        return weft_error_quiet(c ? c->reqs->err : NULL, WEFT_ERR_INVALID_ARG, "%s: NULL %s",
                                what, c == NULL ? "connection" : "argument");
    struct weft_req_pool *p = c->reqs;
    if (WEFT_UNLIKELY(p->free == NULL) && !weft_req_pool_grow(p, size))
        return weft_error(p->err, WEFT_ERR_NO_MEMORY, "rank %d: no memory for a %s request",
                          p->rank, p->tname);
    struct weft_req *r = p->free;
    p->free = r->next;
    /* The transport's fields (after the head) start zeroed: a few stores
     * for the small requests, where zeroing the whole is a string op. */
    memset(r + 1, 0, size - sizeof(*r));
    *r = (struct weft_req){.conn = c, .buf = buf, .len = len, .bytes = len};
    *out = r;
    if (c->err != WEFT_OK) {
        r->status = c->err;
        return WEFT_OK;
    }
    r->status = WEFT_INPROGRESS;
    return WEFT_INPROGRESS;
}

/*
 * The whole of a transport's test() but for how a request is freed: one in
 * progress answers *done = 0; a finished one goes to release (which may
 * keep it until the transport is done with it too), *done = 1, and its
 * status is returned.  A failure was recorded (and logged) when its
 * connection failed; it is recorded again so that the caller reads this
 * request's cause.  tname names the transport in the argument check.
 */
static inline weft_status_t weft_req_test(const char *tname, void *req, int *done, size_t *bytes,
                                          void (*release)(struct weft_req *))
{
    struct weft_req *r = req;
    if (r == NULL || done == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "%s test: NULL argument", tname);
    if (r->status == WEFT_INPROGRESS) {
        *done = 0;
        return WEFT_OK;
    }
    struct weft_conn *c = r->conn;
    weft_status_t st = r->status;
    size_t n = r->bytes;
    release(r);
    *done = 1;
    if (st < 0)
        return weft_error_quiet(c->reqs->err, st, "%s", c->errmsg);
    if (bytes)
        *bytes = n;
    return WEFT_OK;
}

/* Requests in posting order, linked through next; zeroed, it is empty. */
struct weft_req_queue {
    struct weft_req *head, *tail;
};

static inline void weft_req_enqueue(struct weft_req_queue *q, struct weft_req *r)
{
    struct weft_req **link = q->tail ? &q->tail->next : &q->head;
    r->next = NULL;
    *link = r;
    q->tail = r;
}

/* Unlinks the oldest request (q is not empty) and returns it. */
static inline struct weft_req *weft_req_dequeue(struct weft_req_queue *q)
{
    struct weft_req *r = q->head;
    q->head = r->next;
    if (q->head == NULL)
        q->tail = NULL;
    r->next = NULL;
    return r;
}

/* Unlinks the oldest request (q is not empty) with its final status. */
static inline void weft_req_complete(struct weft_req_queue *q, weft_status_t status)
{
    weft_req_dequeue(q)->status = status;
}

/* Fails every request of q with status and empties it. */
static inline void weft_req_queue_fail(struct weft_req_queue *q, weft_status_t status)
{
    while (q->head)
        weft_req_complete(q, status);
}

/*
 * Fails c for good, the first time only: records why (logged into the
 * context's record), then close_conn(c, status) does what failing means
 * to the transport (tell the peer, fail every queued request).  Later
 * failures change nothing.
 */
typedef void weft_conn_close_fn(struct weft_conn *c, weft_status_t status);
void weft_conn_vfail(struct weft_conn *c, weft_conn_close_fn *close_conn,
                     weft_status_t status, const char *fmt, va_list ap)
    WEFT_HIDDEN WEFT_PRINTF(4, 0);
/* The same without logging, for abort: why is the communicator's, which
 * has said it. */
void weft_conn_abort(struct weft_conn *c, weft_conn_close_fn *close_conn,
                     weft_status_t status, const char *why) WEFT_HIDDEN;

/*
 * set_waker's thread, for a transport that a communicator does not sleep
 * in: it runs main(arg of weft_waker_start), which waits for this
 * transport's news and calls fn(fn_arg), the sleeper's wakeup.  Owner: the
 * transport's context, which stops main and joins before it goes.
 */
struct weft_waker {
    void (*fn)(void *);
    void *fn_arg;
    pthread_t thread;
    bool on;
};
/* Starts w's thread; 0, or pthread_create's error. */
int weft_waker_start(struct weft_waker *w, void *(*main)(void *), void *arg, void (*fn)(void *),
                     void *fn_arg) WEFT_HIDDEN;

#endif /* WEFT_TRANSPORT_UTIL_H */
