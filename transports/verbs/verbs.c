/*
 * verbs.c - the verbs transport's data path: receives described into the
 * sender's FIFO, payloads written with RDMA WRITE WITH IMMEDIATE straight
 * into the receiver's memory (registered) or a bounce buffer, striped
 * across the connection's queue pairs; one completion queue per rank,
 * polled by progress().  Setup lives in verbs_setup.c, memory in verbs_mem.c.
 */
#include <errno.h>
#include <poll.h>
#include <stddef.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transports/verbs/verbs.h"

/* Work request ids: a request or a queue pair (both 64-byte aligned), the
 * low bits saying which and, for a send, the queue pair index. */
enum { WR_SEND = 0, WR_RECV = 1, WR_FIFO = 2 };
#define WR_KIND(id) ((id) & 3u)
#define WR_QP(id) (((id) >> 2) & 7u)
#define WR_PTR(id) ((void *)(uintptr_t)((id) & ~(uint64_t)63))
#define VB_SIGNAL_EVERY 16

/* ---- requests ------------------------------------------------------------- */

/* Back to the pool once the caller has it back and no completion is due;
 * releases what it held. */
static void req_release(struct vb_ctx *ctx, struct vb_req *r)
{
    if (!r->returned || r->wrs > 0)
        return;
    weft_regcache_put(&ctx->rc, r->mr);
    weft_bounce_put(&ctx->rc, r->bounce);
    r->mr = NULL;
    r->bounce = NULL;
    weft_req_put(&r->base);
}

static struct vb_conn *req_conn(const struct vb_req *r)
{
    return (struct vb_conn *)r->base.conn;
}

/* test() has reported r: it is the transport's alone now. */
static void req_returned(struct weft_req *base)
{
    struct vb_req *r = (struct vb_req *)base;
    r->returned = true;
    req_release(req_conn(r)->ctx, r);
}

static void req_finish(struct vb_req *r, weft_status_t st)
{
    if (r->base.status == WEFT_INPROGRESS) {
        r->base.status = st;
        req_conn(r)->ctx->finished = true;
    }
}

/* ---- connection failure ------------------------------------------------------ */

void vb_work_add(struct vb_conn *c)
{
    if (c->on_work)
        return;
    c->on_work = true;
    c->next_work = c->ctx->work;
    c->ctx->work = c;
}

/* What failing means here: tell the peer, stop the queue pairs, fail every
 * request not yet written or described. */
static void conn_close(struct weft_conn *base, weft_status_t st)
{
    struct vb_conn *c = (struct vb_conn *)base;
    c->state = VB_FAILED;
    /* Tell the peer now: its side of the queue pairs would only learn of
     * it from a retry timeout.  The request is freed with the tcp context. */
    static const uint8_t failed = VB_FAILED_BYTE;
    void *req;
    if (c->oob)
        (void)c->ctx->oob_ops->isend(c->oob, &failed, 1, &req); /* down too: nothing to tell */
    /* The queue pairs go to the error state: the hardware stops touching
     * our buffers and flushes every outstanding work request, so the
     * requests in flight learn of it from their completions. */
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
    for (int q = 0; q < c->nqps; q++)
        if (c->qps[q].qp)
            ibv_modify_qp(c->qps[q].qp, &a, IBV_QP_STATE);
    weft_req_queue_fail(&c->sq, st);
    weft_req_queue_fail(&c->rq, st);
    for (int i = 0; i < VB_FIFO; i++) {
        if (c->rslot[i]) {
            req_finish(c->rslot[i], st);
            c->rslot[i] = NULL;
        }
    }
}

void vb_conn_fail(struct vb_conn *c, weft_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    weft_conn_vfail(&c->base, conn_close, st, fmt, ap);
    va_end(ap);
}

/* ---- posting -------------------------------------------------------------------- */

static bool sq_room(const struct vb_qp *q, uint32_t n)
{
    return q->sq_used + n <= VB_SQ_DEPTH - 1 && q->sig_head - q->sig_tail < VB_SQ_DEPTH - 1;
}

/* Posts a chain on q; `sig` is the signalled last WR (or none). */
static int sq_post(struct vb_qp *q, struct ibv_send_wr *first, uint32_t n, bool last_signaled)
{
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(q->qp, first, &bad);
    if (rc != 0)
        return rc;
    q->sq_used += n;
    if (last_signaled) {
        q->sig_retire[q->sig_head++ % VB_SQ_DEPTH] = q->unsignaled + 1;
        q->unsignaled = 0;
    } else {
        q->unsignaled += n;
    }
    return 0;
}

static void sq_retire(struct vb_qp *q)
{
    if (q->sig_tail != q->sig_head)
        q->sq_used -= q->sig_retire[q->sig_tail++ % VB_SQ_DEPTH];
}

weft_status_t vb_post_recv(struct vb_qp *q, int n)
{
    for (int i = 0; i < n; i++) {
        struct ibv_recv_wr wr = {.wr_id = (uintptr_t)q | WR_RECV, .num_sge = 0}, *bad = NULL;
        int rc = ibv_post_recv(q->qp, &wr, &bad);
        if (rc != 0) {
            vb_conn_fail(q->conn, WEFT_ERR_SYSTEM,
                         "rank %d: %s port %d: cannot post a receive toward rank %d: %s",
                         q->conn->ctx->rank, q->conn->ctx->devname, q->conn->ctx->port,
                         q->conn->peer, strerror(rc));
            return WEFT_ERR_SYSTEM;
        }
    }
    return WEFT_OK;
}

/* Copies small message e out of its slot into r and completes r; false
 * with c failed when it does not fit. */
static bool eager_take(struct vb_conn *c, struct vb_req *r, const struct vb_eager *e)
{
    if (e->len > r->base.len) {
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d sent a %u-byte message to a %zu-byte receive",
                     c->ctx->rank, c->peer, e->len, r->base.len);
        return false;
    }
    memcpy(r->base.buf, c->mem->eager[e->slot], e->len);
    r->base.bytes = e->len;
    c->eager_done++;
    req_finish(r, WEFT_OK);
    return true;
}

/* A small message landed in slot order: into its receive if described
 * (and no earlier one waits), else kept for describe_one. */
static void on_eager(struct vb_conn *c, struct vb_qp *q, uint32_t seq, uint32_t len)
{
    if (q->index != 0 || len > VB_INLINE || c->npend == VB_FIFO) {
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d sent a small message out of protocol (%u bytes, queue "
                     "pair %d)",
                     c->ctx->rank, c->peer, len, q->index);
        return;
    }
    struct vb_eager e = {seq, c->eager_in++ % VB_FIFO, len};
    struct vb_req *r = c->rslot[seq % VB_FIFO];
    if (c->npend == 0 && r != NULL && (r->seq & 0xffffffu) == seq) {
        c->rslot[seq % VB_FIFO] = NULL;
        if (eager_take(c, r, &e))
            req_release(c->ctx, r);
        vb_work_add(c);
        return;
    }
    c->pend[(c->pend_head + c->npend++) % VB_FIFO] = e;
    vb_work_add(c);
}

/* Whether the oldest small message kept for describe_one is receive
 * seq's (its message came eagerly). */
static bool pend_is(const struct vb_conn *c, uint32_t seq)
{
    return c->npend > 0 && c->pend[c->pend_head].seq == (seq & 0xffffffu);
}

static struct vb_eager pend_pop(struct vb_conn *c)
{
    struct vb_eager e = c->pend[c->pend_head];
    c->pend_head = (c->pend_head + 1) % VB_FIFO;
    c->npend--;
    return e;
}

/* Describes the oldest undescribed receive to the peer; false when it
 * must wait (slot busy, queue full). */
static bool describe_one(struct vb_conn *c)
{
    struct vb_ctx *ctx = c->ctx;
    struct vb_req *r = (struct vb_req *)c->rq.head;
    uint32_t slot = r->seq % VB_FIFO;
    struct vb_qp *q = &c->qps[0];
    if (c->rslot[slot] != NULL || !sq_room(q, 1))
        return false;
    uint64_t addr = 0;
    uint32_t rkey = 0;
    /* Its message came eagerly: it completes now, and the descriptor, an
     * empty one, only tells the sender so (and returns the slot). */
    bool came = pend_is(c, r->seq);
    if (came) {
        struct vb_eager e = pend_pop(c);
        if (!eager_take(c, r, &e))
            return false;
    } else if (r->base.len > 0) {
        r->mr = weft_regcache_get(&ctx->rc, r->base.buf, r->base.len, ctx->regcache_all);
        if (r->mr) {
            addr = (uintptr_t)r->base.buf;
            rkey = vb_mr(r->mr->handle)->rkey;
        } else if ((r->bounce = weft_bounce_get(&ctx->rc, r->base.len)) != NULL) {
            addr = (uintptr_t)r->bounce->buf;
            rkey = vb_mr(r->bounce->handle)->rkey;
        } else {
            vb_conn_fail(c, WEFT_ERR_NO_MEMORY,
                         "rank %d: %s: no memory for a %zu-byte bounce buffer (receive from "
                         "rank %d)",
                         ctx->rank, ctx->devname, r->base.len, c->peer);
            return false;
        }
    }
    struct vb_desc d = {.addr = addr, .len = came ? 0 : r->base.len, .rkey = rkey,
                        .seq = r->seq + 1, .eager_done = c->eager_done};
    struct ibv_sge sge = {.addr = (uintptr_t)&d, .length = sizeof(d), .lkey = 0};
    bool sig = q->unsignaled + 1 >= VB_SIGNAL_EVERY;
    struct ibv_send_wr wr = {
        .wr_id = (uintptr_t)q | WR_FIFO,
        .sg_list = &sge,
        .num_sge = 1,
        .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
        .send_flags = IBV_SEND_INLINE | (sig ? IBV_SEND_SIGNALED : 0),
        .imm_data = htobe32(VB_IMM(VB_IMM_FIFO, 1, r->seq)),
    };
    wr.wr.rdma.remote_addr = c->peer_fifo + (uint64_t)slot * sizeof(struct vb_desc);
    wr.wr.rdma.rkey = c->peer_fifo_rkey;
    int rc = sq_post(q, &wr, 1, sig);
    if (rc != 0) {
        vb_conn_fail(c, WEFT_ERR_SYSTEM,
                     "rank %d: %s port %d: cannot post a descriptor to rank %d: %s", ctx->rank,
                     ctx->devname, ctx->port, c->peer, strerror(rc));
        return false;
    }
    weft_req_dequeue(&c->rq);
    if (came)
        req_release(ctx, r);
    else
        c->rslot[slot] = r;
    c->rdesc++;
    return true;
}

/* Sends r, which has no descriptor yet, eagerly if it is small and the
 * peer has a slot free; false when it must wait for its descriptor. */
static bool write_eager(struct vb_conn *c, struct vb_req *r)
{
    struct vb_ctx *ctx = c->ctx;
    struct vb_qp *q = &c->qps[0];
    size_t len = r->base.len;
    if (len > (size_t)ctx->max_inline || c->eager_out - c->eager_credit >= VB_FIFO ||
        !sq_room(q, 1))
        return false;
    uint32_t slot = c->eager_out % VB_FIFO;
    struct ibv_sge sge = {.addr = (uintptr_t)r->base.buf, .length = (uint32_t)len, .lkey = 0};
    /* Complete on the acknowledgement, not at post: a rank whose sends are
     * all done may leave, and must not leave bytes still unsent. */
    struct ibv_send_wr wr = {
        .wr_id = (uintptr_t)r | WR_SEND,
        .sg_list = &sge,
        .num_sge = len > 0 ? 1 : 0,
        .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
        .send_flags = IBV_SEND_INLINE | IBV_SEND_SIGNALED,
        .imm_data = htobe32(VB_IMM(VB_IMM_EAGER, 1, r->seq)),
    };
    wr.wr.rdma.remote_addr =
        c->peer_fifo + offsetof(struct vb_peer_mem, eager) + (uint64_t)slot * VB_INLINE;
    wr.wr.rdma.rkey = c->peer_fifo_rkey;
    r->wrs++;
    int rc = sq_post(q, &wr, 1, true);
    if (rc != 0) {
        r->wrs--;
        vb_conn_fail(c, WEFT_ERR_SYSTEM, "rank %d: %s port %d: cannot post a write to rank %d: %s",
                     ctx->rank, ctx->devname, ctx->port, c->peer, strerror(rc));
        return false;
    }
    weft_req_dequeue(&c->sq);
    c->nwritten++;
    c->eager_out++;
    r->base.bytes = len;
    r->writing = true;
    c->writing++;
    return true;
}

/* Writes the oldest send whose descriptor has arrived; false when it
 * must wait. */
static bool write_one(struct vb_conn *c)
{
    struct vb_ctx *ctx = c->ctx;
    struct vb_req *r = (struct vb_req *)c->sq.head;
    uint32_t slot = r->seq % VB_FIFO;
    if (!c->desc_seen[slot])
        return write_eager(c, r);
    const volatile struct vb_desc *vd = &c->mem->desc[slot];
    struct vb_desc d = {.addr = vd->addr, .len = vd->len, .rkey = vd->rkey, .seq = vd->seq};
    if (d.seq != r->seq + 1) {
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d described message %u where %u was due (corrupt FIFO)",
                     ctx->rank, c->peer, d.seq - 1, r->seq);
        return false;
    }
    size_t len = r->base.len;
    bool toolong = len > d.len;
    uint32_t nstripes = 1;
    if (!toolong && len >= 2 * (size_t)VB_MIN_STRIPE)
        nstripes = (uint32_t)WEFT_MIN((size_t)c->nqps, len / VB_MIN_STRIPE);
    /* Every stripe's pieces must fit its send queue at once. */
    size_t stripe = toolong ? 0 : (len + nstripes - 1) / nstripes;
    uint32_t pieces = stripe > VB_MAX_WR_BYTES ? (uint32_t)((stripe + VB_MAX_WR_BYTES - 1) / VB_MAX_WR_BYTES) : 1;
    if (pieces > VB_SQ_DEPTH / 2)
        pieces = VB_SQ_DEPTH / 2; /* not reachable below 64 GiB a stripe */
    for (uint32_t s = 0; s < nstripes; s++)
        if (!sq_room(&c->qps[s], pieces))
            return false;
    uint32_t lkey = 0;
    const char *src = r->base.buf;
    bool inl = len <= (size_t)ctx->max_inline;
    if (!toolong && !inl && len > 0) {
        r->mr = weft_regcache_get(&ctx->rc, r->base.buf, len, ctx->regcache_all);
        if (r->mr) {
            lkey = vb_mr(r->mr->handle)->lkey;
        } else if ((r->bounce = weft_bounce_get(&ctx->rc, len)) != NULL) {
            memcpy(r->bounce->buf, r->base.buf, len);
            src = r->bounce->buf;
            lkey = vb_mr(r->bounce->handle)->lkey;
        } else {
            vb_conn_fail(c, WEFT_ERR_NO_MEMORY,
                         "rank %d: %s: no memory for a %zu-byte bounce buffer (send to rank %d)",
                         ctx->rank, ctx->devname, len, c->peer);
            return false;
        }
    }
    c->desc_seen[slot] = false;
    weft_req_dequeue(&c->sq);
    c->nwritten++;
    if (toolong) {
        /* Tell the receiver (its request fails too), move no byte. */
        struct ibv_send_wr wr = {
            .wr_id = (uintptr_t)r | WR_SEND,
            .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
            .send_flags = IBV_SEND_SIGNALED,
            .imm_data = htobe32(VB_IMM(VB_IMM_TOOLONG, 1, r->seq)),
        };
        wr.wr.rdma.remote_addr = d.addr;
        wr.wr.rdma.rkey = d.rkey;
        r->wrs++;
        int rc = sq_post(&c->qps[0], &wr, 1, true);
        if (rc != 0)
            r->wrs--;
        req_finish(r, WEFT_ERR_REMOTE);
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: a %zu-byte message to rank %d is longer than the %llu bytes it "
                     "posted",
                     ctx->rank, len, c->peer, (unsigned long long)d.len);
        return false;
    }
    r->base.bytes = len;
    size_t off = 0;
    for (uint32_t s = 0; s < nstripes; s++) {
        size_t slen = WEFT_MIN(stripe, len - off);
        struct ibv_sge sges[VB_SQ_DEPTH / 2];
        struct ibv_send_wr wrs[VB_SQ_DEPTH / 2];
        uint32_t n = 0;
        size_t done = 0;
        do {
            size_t plen = WEFT_MIN(slen - done, (size_t)VB_MAX_WR_BYTES);
            bool last = done + plen == slen || n + 1 == pieces;
            if (last)
                plen = slen - done;
            sges[n] = (struct ibv_sge){(uintptr_t)(src + off + done), (uint32_t)plen, lkey};
            wrs[n] = (struct ibv_send_wr){
                .wr_id = (uintptr_t)r | WR_SEND | (uint64_t)s << 2,
                .sg_list = &sges[n],
                .num_sge = plen > 0 ? 1 : 0,
                .opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE,
                .send_flags = (last ? IBV_SEND_SIGNALED : 0) | (inl && plen > 0 ? IBV_SEND_INLINE : 0),
                .imm_data = last ? htobe32(VB_IMM(VB_IMM_DATA, nstripes, r->seq)) : 0,
            };
            wrs[n].wr.rdma.remote_addr = d.addr + off + done;
            wrs[n].wr.rdma.rkey = d.rkey;
            if (n > 0)
                wrs[n - 1].next = &wrs[n];
            done += plen;
            n++;
        } while (done < slen);
        r->wrs++;
        int rc = sq_post(&c->qps[s], &wrs[0], n, true);
        if (rc != 0) {
            r->wrs--;
            req_finish(r, WEFT_ERR_SYSTEM);
            vb_conn_fail(c, WEFT_ERR_SYSTEM,
                         "rank %d: %s port %d: cannot post a write to rank %d: %s", ctx->rank,
                         ctx->devname, ctx->port, c->peer, strerror(rc));
            return false;
        }
        off += slen;
    }
    r->writing = true;
    c->writing++;
    return true;
}

/* Moves what c can move now. */
static void conn_push(struct vb_conn *c)
{
    if (c->state != VB_READY)
        return;
    while (c->rq.head && describe_one(c))
        ;
    while (c->sq.head && c->state == VB_READY && write_one(c))
        ;
}

/* ---- completions ---------------------------------------------------------------- */

static void wc_fail(struct vb_conn *c, const struct ibv_wc *wc, const char *what)
{
    struct vb_ctx *ctx = c->ctx;
    weft_status_t st = wc->status == IBV_WC_WR_FLUSH_ERR && c->base.err != WEFT_OK ? c->base.err
                       : WEFT_ERR_REMOTE;
    vb_conn_fail(c, st, "rank %d: %s port %d: %s toward rank %d failed: %s (status %d, vendor error 0x%x)",
                 ctx->rank, ctx->devname, ctx->port, what, c->peer, ibv_wc_status_str(wc->status),
                 (int)wc->status, wc->vendor_err);
}

static void on_recv(struct vb_qp *q, const struct ibv_wc *wc)
{
    struct vb_conn *c = q->conn;
    if (wc->status != IBV_WC_SUCCESS) {
        wc_fail(c, wc, "a receive");
        return;
    }
    if (vb_post_recv(q, 1) != WEFT_OK)
        return;
    uint32_t imm = be32toh(wc->imm_data);
    uint32_t seq = VB_IMM_SEQ(imm);
    if (!(wc->wc_flags & IBV_WC_WITH_IMM) || wc->opcode != IBV_WC_RECV_RDMA_WITH_IMM) {
        vb_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: rank %d sent a message without immediate data",
                     c->ctx->rank, c->peer);
        return;
    }
    if (VB_IMM_KIND(imm) == VB_IMM_FIFO) {
        /* Descriptors travel on queue pair 0 only, in order. */
        if (q->index != 0 || seq != (c->sdesc & 0xffffffu)) {
            vb_conn_fail(c, WEFT_ERR_REMOTE,
                         "rank %d: rank %d sent descriptor %u where %u was due", c->ctx->rank,
                         c->peer, seq, c->sdesc & 0xffffffu);
            return;
        }
        /* The slot may hold a newer descriptor already; its count is only
         * larger, and counts only grow. */
        uint32_t done = ((const volatile struct vb_desc *)&c->mem->desc[c->sdesc % VB_FIFO])->eager_done;
        if ((int32_t)(done - c->eager_credit) > 0 && (int32_t)(c->eager_out - done) >= 0)
            c->eager_credit = done;
        /* A message already sent eagerly needs no descriptor. */
        if ((int32_t)(c->sdesc - c->nwritten) >= 0)
            c->desc_seen[c->sdesc % VB_FIFO] = true;
        c->sdesc++;
        vb_work_add(c);
        return;
    }
    if (VB_IMM_KIND(imm) == VB_IMM_EAGER) {
        on_eager(c, q, seq, wc->byte_len);
        return;
    }
    struct vb_req *r = c->rslot[seq % VB_FIFO];
    if (r == NULL || (r->seq & 0xffffffu) != seq) {
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d wrote message %u, which was not described", c->ctx->rank,
                     c->peer, seq);
        return;
    }
    if (VB_IMM_KIND(imm) == VB_IMM_TOOLONG) {
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d sent a message longer than the %zu bytes posted for it",
                     c->ctx->rank, c->peer, r->base.len);
        return;
    }
    r->stripes = VB_IMM_STRIPES(imm);
    r->got++;
    r->base.bytes += wc->byte_len;
    if (r->got < r->stripes)
        return;
    if (r->base.bytes > r->base.len) {
        vb_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: rank %d wrote %zu bytes into a %zu-byte receive",
                     c->ctx->rank, c->peer, r->base.bytes, r->base.len);
        return;
    }
    if (r->bounce)
        memcpy(r->base.buf, r->bounce->buf, r->base.bytes);
    c->rslot[seq % VB_FIFO] = NULL;
    req_finish(r, WEFT_OK);
    req_release(c->ctx, r);
    vb_work_add(c);
}

static void on_send(struct vb_req *r, struct vb_qp *q, const struct ibv_wc *wc)
{
    struct vb_conn *c = req_conn(r);
    sq_retire(q);
    r->wrs--;
    if (r->wrs == 0 && r->writing) {
        r->writing = false;
        c->writing--;
    }
    if (wc->status != IBV_WC_SUCCESS) {
        wc_fail(c, wc, "a write");
        req_finish(r, c->base.err);
    } else if (r->wrs == 0) {
        req_finish(r, c->base.err != WEFT_OK ? c->base.err : WEFT_OK);
    }
    req_release(c->ctx, r);
    vb_work_add(c);
}

/* Handles every completion waiting; returns how many. */
int vb_poll_cq(struct vb_ctx *ctx)
{
    struct ibv_wc wc[32];
    int total = 0, n;
    while ((n = ibv_poll_cq(ctx->cq, 32, wc)) > 0) {
        for (int i = 0; i < n; i++) {
            uint64_t id = wc[i].wr_id;
            if (WR_KIND(id) == WR_RECV) {
                on_recv(WR_PTR(id), &wc[i]);
            } else if (WR_KIND(id) == WR_FIFO) {
                struct vb_qp *q = WR_PTR(id);
                sq_retire(q);
                vb_work_add(q->conn); /* room for a write that waited */
                if (wc[i].status != IBV_WC_SUCCESS)
                    wc_fail(q->conn, &wc[i], "a descriptor or small write");
            } else {
                struct vb_req *r = WR_PTR(id);
                on_send(r, &req_conn(r)->qps[WR_QP(id)], &wc[i]);
            }
        }
        total += n;
    }
    if (n < 0 && ctx->fatal == WEFT_OK) {
        ctx->fatal = WEFT_ERR_SYSTEM;
        snprintf(ctx->fatalmsg, sizeof(ctx->fatalmsg), "rank %d: %s: polling the completion queue failed",
                 ctx->rank, ctx->devname);
    }
    return total;
}

/* ---- the vtable ------------------------------------------------------------------ */

static weft_status_t post(const char *what, struct vb_conn *c, void *buf, size_t bytes,
                          bool is_send, void **out)
{
    weft_status_t rc = weft_req_post(what, c, sizeof(struct vb_req), buf, bytes, out);
    if (rc != WEFT_INPROGRESS)
        return rc;
    struct vb_req *r = *out;
    r->base.bytes = 0; /* a send's is set when it is written; a receive counts what lands */
    if (c->peer_gone) {
        /* A small message it sent before it left is still this receive's. */
        if (!is_send && pend_is(c, c->nrecv)) {
            struct vb_eager e = pend_pop(c);
            r->seq = c->nrecv++;
            if (eager_take(c, r, &e))
                return WEFT_OK;
        } else {
            vb_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: rank %d closed its connection",
                         c->ctx->rank, c->peer);
        }
        r->base.status = c->base.err;
        return WEFT_OK;
    }
    r->seq = is_send ? c->nsend++ : c->nrecv++;
    weft_req_enqueue(is_send ? &c->sq : &c->rq, &r->base);
    if (c->state == VB_IDLE && vb_conn_start(c) != WEFT_OK)
        return WEFT_OK; /* the request carries the failure */
    vb_work_add(c);
    conn_push(c);
    return WEFT_OK;
}

static weft_status_t vb_isend(void *conn, const void *buf, size_t bytes, void **req)
{
    return post("verbs isend", conn, (void *)buf, bytes, true, req);
}

static weft_status_t vb_irecv(void *conn, void *buf, size_t bytes, void **req)
{
    return post("verbs irecv", conn, buf, bytes, false, req);
}

static weft_status_t vb_test(void *req, int *done, size_t *bytes)
{
    return weft_req_test("verbs", req, done, bytes, req_returned);
}

static weft_status_t vb_progress(void *vctx, int timeout_ms)
{
    (void)timeout_ms; /* never the transport a communicator sleeps in (tcp is) */
    struct vb_ctx *ctx = vctx;
    vb_async_drain(ctx);
    if (ctx->cm_chan)
        vb_cm_drain(ctx);
    vb_poll_cq(ctx);
    /* Exchanges in flight: every call.  Every connection's out-of-band
     * receive (a peer that starts the exchange, or the watch that sees a
     * peer exit): every millisecond, so that idle peers cost nothing. */
    struct vb_conn **pp = &ctx->setup;
    while (*pp) {
        struct vb_conn *c = *pp;
        vb_conn_setup(c);
        if (c->oob_sreq[0] || c->oob_sreq[1] || (c->state == VB_WAIT_PEER && c->oob_rreq)) {
            pp = &c->next_setup;
        } else {
            *pp = c->next_setup;
            c->on_setup = false;
        }
    }
    uint64_t now = weft_now_ns();
    if (now >= ctx->next_sweep) {
        ctx->next_sweep = now + 1000000;
        for (int p = 0; p < ctx->nranks; p++)
            if (ctx->conns[p] && !ctx->conns[p]->on_setup && ctx->conns[p]->oob_rreq)
                vb_conn_setup(ctx->conns[p]);
    }
    struct vb_conn *list = ctx->work;
    ctx->work = NULL;
    while (list) {
        struct vb_conn *c = list;
        list = c->next_work;
        c->on_work = false;
        conn_push(c);
    }
    vb_poll_cq(ctx);
    if (ctx->fatal != WEFT_OK)
        return weft_error(ctx->err, ctx->fatal, "%s", ctx->fatalmsg);
    return WEFT_OK;
}

static void vb_wakeup(void *vctx)
{
    (void)vctx; /* progress never waits */
}

static void vb_abort(void *vctx, weft_status_t status, const char *why)
{
    struct vb_ctx *ctx = vctx;
    for (int p = 0; p < ctx->nranks; p++)
        if (ctx->conns[p])
            weft_conn_abort(&ctx->conns[p]->base, conn_close, status, why);
}

/* ---- sleeping in another transport's wait ------------------------------------------- */

static void *waker_main(void *arg)
{
    struct vb_ctx *ctx = arg;
    for (;;) {
        struct pollfd p[2] = {{ctx->chan->fd, POLLIN, 0}, {ctx->stopfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0 && errno != EINTR)
            break;
        if (p[1].revents)
            break;
        struct ibv_cq *cq;
        void *cq_ctx;
        if (p[0].revents && ibv_get_cq_event(ctx->chan, &cq, &cq_ctx) == 0) {
            ibv_ack_cq_events(cq, 1);
            ctx->waker.fn(ctx->waker.fn_arg);
        }
    }
    return NULL;
}

static weft_status_t vb_set_waker(void *vctx, void (*fn)(void *), void *arg)
{
    struct vb_ctx *ctx = vctx;
    int rc = weft_waker_start(&ctx->waker, waker_main, ctx, fn, arg);
    if (rc != 0)
        return weft_error(ctx->err, WEFT_ERR_SYSTEM, "rank %d: verbs: cannot start a thread: %s",
                          ctx->rank, strerror(rc));
    return WEFT_OK;
}

static bool vb_sleep_begin(void *vctx)
{
    struct vb_ctx *ctx = vctx;
    int n = vb_poll_cq(ctx);
    if (ibv_req_notify_cq(ctx->cq, 0) != 0)
        return true; /* cannot be woken: do not sleep */
    /* What landed between the poll and the arming raised no event. */
    n += vb_poll_cq(ctx);
    /* A request that finished in this round's progress (a completion, or a
     * receive whose small message had come) wakes nobody either: the
     * engine must look before anyone sleeps. */
    bool finished = ctx->finished;
    ctx->finished = false;
    /* An rdma_cm connection being made: its events do not wake anyone. */
    return n > 0 || finished || ctx->work != NULL || ctx->fatal != WEFT_OK || ctx->cm_setup > 0;
}

static void vb_sleep_end(void *vctx)
{
    (void)vctx;
}

const struct weft_transport_ops weft_verbs_ops = WEFT_TRANSPORT_OPS("verbs", vb,
    .reg_mem = vb_reg_mem,
    .dereg_mem = vb_dereg_mem,
    WEFT_TRANSPORT_SLEEPER(vb));
