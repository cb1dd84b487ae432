/*
 * self.c - the self transport: a rank's messages to itself (a send to its
 * own rank).  The k-th isend meets the k-th irecv, and one memcpy
 * completes both inside whichever call comes second; no thread, nothing
 * on the wire.  Collective schedules copy locally instead (COPY steps).
 */
#include <stdlib.h>
#include <string.h>

#include "transports/transport.h"

/* A posted send or receive.  Owner: the context, which frees them all at
 * finalize; test() returns a finished one to the free list. */
struct self_req {
    struct self_req *next; /* the queue it waits in, or the free list */
    struct self_req *all;  /* every request of the context */
    struct self_ctx *ctx;
    void *buf;             /* borrowed: the caller's (a send's is only read) */
    size_t bytes;          /* posted length */
    size_t got;            /* bytes moved, once done */
    weft_status_t status;
    bool done;
};

struct self_queue {
    struct self_req *head, *tail;
};

/* One per communicator; its only connection is itself.  Unmatched sends
 * and receives wait in order; one of the two queues is always empty. */
struct self_ctx {
    struct weft_errsink *err;
    int rank;
    struct self_queue sends, recvs;
    struct self_req *free;    /* finished requests, reused: none allocated after warm-up */
    struct self_req *all;
    weft_status_t failed;     /* abort's status; WEFT_OK while usable */
};

static void push(struct self_queue *q, struct self_req *r)
{
    r->next = NULL;
    if (q->tail)
        q->tail->next = r;
    else
        q->head = r;
    q->tail = r;
}

static struct self_req *pop(struct self_queue *q)
{
    struct self_req *r = q->head;
    if (r && (q->head = r->next) == NULL)
        q->tail = NULL;
    return r;
}

static void finish(struct self_req *r, weft_status_t status, size_t got)
{
    r->status = status;
    r->got = got;
    r->done = true;
}

/* Moves snd into rcv; a message longer than the receive fails both. */
static void deliver(struct self_ctx *ctx, struct self_req *snd, struct self_req *rcv)
{
    if (snd->bytes > rcv->bytes) {
        weft_status_t st = weft_error(ctx->err, WEFT_ERR_INVALID_ARG,
                                      "rank %d: a send to self of %zu bytes met a receive of "
                                      "%zu bytes",
                                      ctx->rank, snd->bytes, rcv->bytes);
        finish(snd, st, 0);
        finish(rcv, st, 0);
        return;
    }
    if (snd->bytes > 0)
        memcpy(rcv->buf, snd->buf, snd->bytes);
    finish(snd, WEFT_OK, snd->bytes);
    finish(rcv, WEFT_OK, snd->bytes);
}

/* Posts one side: matched at once with the oldest of the other side, or
 * queued behind its own. */
static weft_status_t post(struct self_ctx *ctx, void *buf, size_t bytes, bool send, void **out)
{
    if (ctx->failed != WEFT_OK)
        return ctx->failed;
    struct self_req *r = ctx->free;
    if (r) {
        ctx->free = r->next;
    } else {
        if ((r = malloc(sizeof(*r))) == NULL)
            return weft_error(ctx->err, WEFT_ERR_NO_MEMORY, "self: out of memory");
        r->all = ctx->all;
        ctx->all = r;
    }
    *r = (struct self_req){.all = r->all, .ctx = ctx, .buf = buf, .bytes = bytes};
    struct self_req *other = pop(send ? &ctx->recvs : &ctx->sends);
    if (other)
        deliver(ctx, send ? r : other, send ? other : r);
    else
        push(send ? &ctx->sends : &ctx->recvs, r);
    *out = r;
    return WEFT_OK;
}

static weft_status_t self_isend(void *conn, const void *buf, size_t bytes, void **req)
{
    return post(conn, (void *)buf, bytes, true, req);
}

static weft_status_t self_irecv(void *conn, void *buf, size_t bytes, void **req)
{
    return post(conn, buf, bytes, false, req);
}

static weft_status_t self_test(void *req, int *done, size_t *bytes)
{
    struct self_req *r = req;
    if (!r->done) {
        *done = 0;
        return WEFT_OK;
    }
    *done = 1;
    if (bytes)
        *bytes = r->got;
    r->next = r->ctx->free;
    r->ctx->free = r;
    return r->status;
}

static weft_status_t self_init(const struct weft_transport_init *args, void **vctx, void *addr,
                               size_t *addrlen)
{
    (void)addr;
    struct self_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return weft_error(args->err, WEFT_ERR_NO_MEMORY, "self: out of memory");
    ctx->err = args->err;
    ctx->rank = args->rank;
    *addrlen = 0; /* it reaches no other rank: nothing to publish */
    *vctx = ctx;
    return WEFT_OK;
}

static weft_status_t self_connect(void *vctx, int peer, const void *addr, size_t addrlen,
                                  void **conn)
{
    (void)addr;
    (void)addrlen;
    struct self_ctx *ctx = vctx;
    if (peer != ctx->rank)
        return weft_error(ctx->err, WEFT_ERR_INTERNAL, "self: rank %d asked to reach rank %d",
                          ctx->rank, peer);
    *conn = ctx;
    return WEFT_OK;
}

static weft_status_t self_progress(void *vctx, int timeout_ms)
{
    (void)vctx;
    (void)timeout_ms;
    return WEFT_OK; /* every match completes inside the call that makes it */
}

static void self_wakeup(void *vctx)
{
    (void)vctx;
}

/* Fails what waits and every later post. */
static void self_abort(void *vctx, weft_status_t status, const char *why)
{
    (void)why;
    struct self_ctx *ctx = vctx;
    ctx->failed = status;
    for (struct self_req *r; (r = pop(&ctx->sends)) != NULL;)
        finish(r, status, 0);
    for (struct self_req *r; (r = pop(&ctx->recvs)) != NULL;)
        finish(r, status, 0);
}

static void self_finalize(void *vctx)
{
    struct self_ctx *ctx = vctx;
    if (ctx == NULL)
        return;
    while (ctx->all) {
        struct self_req *r = ctx->all;
        ctx->all = r->all;
        free(r);
    }
    free(ctx);
}

/* No thread and no events of its own: nothing to wake anyone for. */
static weft_status_t self_set_waker(void *vctx, void (*fn)(void *), void *arg)
{
    (void)vctx;
    (void)fn;
    (void)arg;
    return WEFT_OK;
}

static bool self_sleep_begin(void *vctx)
{
    (void)vctx;
    return false;
}

static void self_sleep_end(void *vctx)
{
    (void)vctx;
}

static const struct weft_transport_ops self_ops = WEFT_TRANSPORT_OPS("self", self,
    WEFT_TRANSPORT_SLEEPER(self));

static bool self_can_reach(const struct weft_transport_pair *pair)
{
    return pair->self;
}

/* memcpy moves 14-44 GB/s on the development machine. */
const struct weft_transport_desc weft_self_desc = {
    .name = "self", .flags = WEFT_TP_IMPLICIT, .priority = 0,
    .can_reach = self_can_reach,
    .alpha = 0.1e-6, .beta = 1.0 / 17e9,
    .ops = &self_ops,
};
