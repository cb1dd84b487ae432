/*
 * self.c - the self transport: a rank's messages to itself (a send to its
 * own rank).  The k-th isend meets the k-th irecv, and one memcpy
 * completes both inside whichever call comes second; no thread, nothing
 * on the wire.  Collective schedules copy locally instead (COPY steps).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transports/transport.h"
#include "transports/util/util.h"

/* A request is util's head alone: buf, len and bytes say all it needs. */

/* One per communicator; its only connection is itself (conn, the handle
 * connect gives).  Unmatched sends and receives wait in order; one of the
 * two queues is always empty between calls. */
struct self_ctx {
    struct weft_conn conn;
    struct weft_req_pool reqs;   /* reused: none allocated after warm-up */
    struct weft_errsink *err;
    int rank, nranks;
    struct weft_req_queue sends, recvs;
};

/* Failing the conn (a message too long, or abort) fails what waits; every
 * later post fails with it (weft_req_post). */
static void conn_close(struct weft_conn *c, weft_status_t status)
{
    struct self_ctx *ctx = (struct self_ctx *)c;
    weft_req_queue_fail(&ctx->sends, status);
    weft_req_queue_fail(&ctx->recvs, status);
}

static void self_fail(struct self_ctx *ctx, const char *fmt, ...) WEFT_PRINTF(2, 3);
static void self_fail(struct self_ctx *ctx, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    weft_conn_vfail(&ctx->conn, conn_close, WEFT_ERR_REMOTE, fmt, ap);
    va_end(ap);
}

/* Moves the oldest send into the oldest receive, if both are posted; a
 * message longer than the receive fails the conn, as on any transport. */
static void match(struct self_ctx *ctx)
{
    struct weft_req *snd = ctx->sends.head, *rcv = ctx->recvs.head;
    if (snd == NULL || rcv == NULL)
        return;
    if (snd->len > rcv->len) {
        self_fail(ctx, "rank %d: sent itself %zu bytes but the receive posted holds %zu",
                  ctx->rank, snd->len, rcv->len);
        return;
    }
    if (snd->len > 0)
        memcpy(rcv->buf, snd->buf, snd->len);
    rcv->bytes = snd->len;
    weft_req_complete(&ctx->sends, WEFT_OK);
    weft_req_complete(&ctx->recvs, WEFT_OK);
}

static weft_status_t post(const char *what, struct self_ctx *ctx, bool send, void *buf,
                          size_t bytes, void **out)
{
    weft_status_t st = weft_req_post(what, ctx, sizeof(struct weft_req), buf, bytes, out);
    if (st != WEFT_INPROGRESS)
        return st;
    weft_req_enqueue(send ? &ctx->sends : &ctx->recvs, *out);
    match(ctx);
    return WEFT_OK;
}

static weft_status_t self_isend(void *conn, const void *buf, size_t bytes, void **req)
{
    return post("self isend", conn, true, (void *)buf, bytes, req);
}

static weft_status_t self_irecv(void *conn, void *buf, size_t bytes, void **req)
{
    return post("self irecv", conn, false, buf, bytes, req);
}

static weft_status_t self_test(void *req, int *done, size_t *bytes)
{
    return weft_req_test("self", req, done, bytes, weft_req_put);
}

static weft_status_t self_init(const struct weft_transport_init *args, void **vctx, void *addr,
                               size_t *addrlen)
{
    (void)addr;
    struct self_ctx *ctx;
    WEFT_TP_CTX_NEW(ctx, args, "self");
    ctx->conn.reqs = &ctx->reqs;
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
    *conn = &ctx->conn;
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

static void self_abort(void *vctx, weft_status_t status, const char *why)
{
    struct self_ctx *ctx = vctx;
    weft_conn_abort(&ctx->conn, conn_close, status, why);
}

static void self_finalize(void *vctx)
{
    struct self_ctx *ctx = vctx;
    if (ctx == NULL)
        return;
    weft_req_pool_fini(&ctx->reqs);
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
