/*
 * verbs_setup.c - the verbs transport's setup: device and port choice
 * (WEFT_IB_HCA), GID choice for RoCE, the protection domain, completion
 * queue and FIFO, and per peer the queue pairs, joined by an exchange over
 * the authenticated tcp connection to that peer:
 *
 *   both ways  info   {qpns, psns, FIFO address and rkey, mtu, lid, gid}
 *              (each side creates its queue pairs and posts its receives
 *              before sending it; the first use on either side starts it)
 *   both ways  ready  (sent once our queue pairs are RTR/RTS)
 *
 * A side writes nothing before the peer's ready, so no packet meets a queue
 * pair that cannot take it.  The tcp connection then stays open as a watch:
 * a peer that exits closes it, and its pending requests fail at once
 * instead of after the queue pairs' retry timeout.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "base/auth.h"
#include "transports/registry.h"
#include "transports/verbs/ib_select.h"
#include "transports/verbs/verbs.h"

#define VB_READY_MAGIC 0x59445257u /* "WRDY" */
#define VB_BYE 0x42 /* "B" on the watch: the peer destroys its communicator */

static const char *link_name(int ll)
{
    return ll == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand";
}

/* ---- checks on bytes from peers ---------------------------------------------- */

weft_status_t vb_qpinfo_check(const struct vb_qpinfo *q, size_t n, int nqps, bool cm, char *why,
                              size_t whylen)
{
    if (n != sizeof(*q)) {
        snprintf(why, whylen, "queue pair info of %zu bytes (expected %zu)", n, sizeof(*q));
        return WEFT_ERR_REMOTE;
    }
    if (le32toh(q->magic) != VB_INFO_MAGIC) {
        snprintf(why, whylen, "queue pair info with bad magic 0x%08x", le32toh(q->magic));
        return WEFT_ERR_REMOTE;
    }
    if ((int)le32toh(q->nqps) != nqps) {
        snprintf(why, whylen, "%u queue pairs per connection where this rank uses %d "
                              "(set WEFT_IB_QPS_PER_CONNECTION the same everywhere)",
                 le32toh(q->nqps), nqps);
        return WEFT_ERR_REMOTE;
    }
    for (int i = 0; i < nqps; i++) {
        /* Through rdma_cm the numbers travel in its own exchange. */
        if ((cm ? le32toh(q->qpn[i]) != 0 : le32toh(q->qpn[i]) == 0) ||
            le32toh(q->qpn[i]) > 0xffffffu || le32toh(q->psn[i]) > 0xffffffu) {
            snprintf(why, whylen, "queue pair %d: bad number 0x%x or psn 0x%x", i,
                     le32toh(q->qpn[i]), le32toh(q->psn[i]));
            return WEFT_ERR_REMOTE;
        }
    }
    uint32_t mtu = le32toh(q->mtu);
    if (mtu < IBV_MTU_256 || mtu > IBV_MTU_4096 || le64toh(q->fifo_addr) == 0) {
        snprintf(why, whylen, "bad mtu %u or FIFO address", mtu);
        return WEFT_ERR_REMOTE;
    }
    return WEFT_OK;
}

static weft_status_t addr_check(const struct vb_ctx *ctx, int peer, const void *addr, size_t n,
                                struct vb_addr *out)
{
    struct vb_addr a;
    if (n != sizeof(a))
        return weft_error(ctx->err, WEFT_ERR_REMOTE,
                          "rank %d: rank %d published a verbs address of %zu bytes", ctx->rank,
                          peer, n);
    memcpy(&a, addr, sizeof(a));
    a.dev[sizeof(a.dev) - 1] = '\0';
    if (le32toh(a.magic) != VB_ADDR_MAGIC || le16toh(a.version) != 1 || a.nqps != ctx->nqps)
        return weft_error(ctx->err, WEFT_ERR_INVALID_ARG,
                          "rank %d: rank %d's verbs address does not match this rank's (magic, "
                          "version, or %u queue pairs per connection against %d)",
                          ctx->rank, peer, a.nqps, ctx->nqps);
    if (a.link_layer != ctx->me.link_layer)
        return weft_error(ctx->err, WEFT_ERR_INVALID_ARG,
                          "rank %d: rank %d's port is %s, this rank's is %s", ctx->rank, peer,
                          link_name(a.link_layer), link_name(ctx->me.link_layer));
    *out = a;
    return WEFT_OK;
}

/* ---- queue pairs --------------------------------------------------------------- */

static weft_status_t qp_fail(struct vb_conn *c, const char *what, int err)
{
    vb_conn_fail(c, WEFT_ERR_SYSTEM, "rank %d: %s port %d: %s for rank %d: %s", c->ctx->rank,
                 c->ctx->devname, c->ctx->port, what, c->peer, strerror(err));
    return WEFT_ERR_SYSTEM;
}

static void conn_up(struct vb_conn *c);

void vb_qp_init_attr(struct vb_ctx *ctx, struct vb_qp *q, struct ibv_qp_init_attr *ia)
{
    *ia = (struct ibv_qp_init_attr){
        .qp_context = q,
        .send_cq = ctx->cq,
        .recv_cq = ctx->cq,
        .cap = {.max_send_wr = VB_SQ_DEPTH, .max_recv_wr = 3 * VB_FIFO,
                .max_send_sge = 1, .max_recv_sge = 1, .max_inline_data = VB_INLINE},
        .qp_type = IBV_QPT_RC,
    };
}

weft_status_t vb_qp_prepare(struct vb_conn *c, struct vb_qp *q)
{
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    /* What the device granted: the inline size may be smaller. */
    if (ibv_query_qp(q->qp, &a, IBV_QP_CAP, &ia) == 0 &&
        (int)ia.cap.max_inline_data < c->ctx->max_inline)
        c->ctx->max_inline = (int)ia.cap.max_inline_data;
    /* Queue pair 0 also takes the peer's descriptors and small messages. */
    return vb_post_recv(q, q->index == 0 ? 3 * VB_FIFO : VB_FIFO);
}

weft_status_t vb_conn_start(struct vb_conn *c)
{
    struct vb_ctx *ctx = c->ctx;
    if (c->state != VB_IDLE)
        return WEFT_OK;
    uint32_t psn[VB_MAX_QPS];
    WEFT_CHECK(weft_random_bytes(psn, sizeof(psn)));
    WEFT_CHECK(weft_random_bytes(c->mine.nonce, sizeof(c->mine.nonce)));
    c->nqps = ctx->nqps;
    for (int i = 0; i < c->nqps; i++) {
        struct vb_qp *q = &c->qps[i];
        q->conn = c;
        q->index = i;
        if (c->cm)
            continue; /* rdma_cm creates them as it connects */
        struct ibv_qp_init_attr ia;
        vb_qp_init_attr(ctx, q, &ia);
        q->qp = ibv_create_qp(ctx->pd, &ia);
        if (q->qp == NULL)
            return qp_fail(c, "cannot create a queue pair", errno);
        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_INIT,
            .pkey_index = 0,
            .port_num = (uint8_t)ctx->port,
            .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                               IBV_ACCESS_LOCAL_WRITE,
        };
        int rc = ibv_modify_qp(q->qp, &a,
                               IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        if (rc != 0)
            return qp_fail(c, "cannot move a queue pair to INIT", rc);
        WEFT_CHECK(vb_qp_prepare(c, q));
        c->mine.qpn[i] = htole32(q->qp->qp_num);
        c->mine.psn[i] = htole32(psn[i] & 0xffffffu);
    }
    c->mine.magic = htole32(VB_INFO_MAGIC);
    c->mine.nqps = htole32((uint32_t)c->nqps);
    c->mine.fifo_addr = htole64((uintptr_t)c->mem);
    c->mine.fifo_rkey = htole32(ctx->fifo_mr->rkey);
    c->mine.mtu = htole32(ctx->me.mtu);
    c->mine.lid = htole32(ctx->me.lid);
    memcpy(c->mine.gid, ctx->me.gid, 16);
    weft_status_t st = ctx->oob_ops->isend(c->oob, &c->mine, sizeof(c->mine), &c->oob_sreq[0]);
    if (st != WEFT_OK) {
        vb_conn_fail(c, st, "rank %d: cannot send queue pair info to rank %d: %s", ctx->rank,
                     c->peer, weft_thread_last_error());
        return st;
    }
    c->state = VB_WAIT_PEER;
    if (c->cm)
        ctx->cm_setup++;
    if (!c->on_setup) {
        c->on_setup = true;
        c->next_setup = ctx->setup;
        ctx->setup = c;
    }
    return WEFT_OK;
}

void vb_conn_try_ready(struct vb_conn *c)
{
    struct vb_ctx *ctx = c->ctx;
    if (c->ready_sent || !c->got_info || c->nup < c->nqps || c->base.err != WEFT_OK)
        return;
    const struct vb_qpinfo *t = &c->theirs;
    c->peer_fifo = le64toh(t->fifo_addr);
    c->peer_fifo_rkey = le32toh(t->fifo_rkey);
    c->ready_out = htole32(VB_READY_MAGIC);
    weft_status_t st = ctx->oob_ops->isend(c->oob, &c->ready_out, sizeof(c->ready_out),
                                           &c->oob_sreq[1]);
    if (st != WEFT_OK) {
        vb_conn_fail(c, st, "rank %d: cannot send ready to rank %d: %s", ctx->rank, c->peer,
                     weft_thread_last_error());
        return;
    }
    c->ready_sent = true;
    if (c->cm)
        ctx->cm_setup--;
    if (!c->on_setup) {
        c->on_setup = true;
        c->next_setup = ctx->setup;
        ctx->setup = c;
    }
    if (c->peer_ready)
        conn_up(c);
}

/* By hand: RTR and RTS toward the peer's queue pairs. */
static weft_status_t conn_join(struct vb_conn *c)
{
    struct vb_ctx *ctx = c->ctx;
    const struct vb_qpinfo *t = &c->theirs;
    enum ibv_mtu mtu = WEFT_MIN((enum ibv_mtu)ctx->me.mtu, (enum ibv_mtu)le32toh(t->mtu));
    for (int i = 0; i < c->nqps; i++) {
        struct ibv_qp_attr a = {
            .qp_state = IBV_QPS_RTR,
            .path_mtu = mtu,
            .dest_qp_num = le32toh(t->qpn[i]),
            .rq_psn = le32toh(t->psn[i]),
            .max_dest_rd_atomic = 1,
            .min_rnr_timer = 12,
        };
        a.ah_attr.port_num = (uint8_t)ctx->port;
        a.ah_attr.sl = (uint8_t)ctx->sl;
        a.ah_attr.dlid = (uint16_t)le32toh(t->lid);
        if (ctx->me.link_layer == IBV_LINK_LAYER_ETHERNET) {
            a.ah_attr.is_global = 1;
            memcpy(a.ah_attr.grh.dgid.raw, t->gid, 16);
            a.ah_attr.grh.sgid_index = (uint8_t)ctx->me.gid_index;
            a.ah_attr.grh.hop_limit = 255;
            a.ah_attr.grh.traffic_class = (uint8_t)ctx->tc;
        }
        int rc = ibv_modify_qp(c->qps[i].qp, &a,
                               IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                                   IBV_QP_MIN_RNR_TIMER);
        if (rc != 0)
            return qp_fail(c, "cannot move a queue pair to RTR", rc);
        struct ibv_qp_attr s = {
            .qp_state = IBV_QPS_RTS,
            .timeout = (uint8_t)ctx->timeout,
            .retry_cnt = (uint8_t)ctx->retry_cnt,
            .rnr_retry = 7,
            .sq_psn = le32toh(c->mine.psn[i]),
            .max_rd_atomic = 1,
        };
        rc = ibv_modify_qp(c->qps[i].qp, &s,
                           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                               IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
        if (rc != 0)
            return qp_fail(c, "cannot move a queue pair to RTS", rc);
    }
    c->nup = c->nqps;
    return WEFT_OK;
}

static bool conn_pending(const struct vb_conn *c)
{
    /* A write in flight counts: its completion may never come from a peer
     * that is gone (an RNR retry is endless). */
    if (c->sq.head || c->rq.head || c->writing > 0)
        return true;
    for (int i = 0; i < VB_FIFO; i++)
        if (c->rslot[i])
            return true;
    return false;
}

/* Both readies exchanged: nothing the peer writes can meet a queue pair
 * that is not ready for it. */
static void conn_up(struct vb_conn *c)
{
    c->state = VB_READY;
    vb_work_add(c);
    WEFT_TRACE(WEFT_SUB_NET, "rank %d: verbs connection to rank %d up (%d queue pairs%s)",
               c->ctx->rank, c->peer, c->nqps, c->cm ? ", rdma_cm" : "");
}

/* One out-of-band receive finished (ok or not): what it was decides. */
static void oob_received(struct vb_conn *c, weft_status_t st, size_t n)
{
    struct vb_ctx *ctx = c->ctx;
    char why[256];
    if (c->phase == VB_PH_WATCH) {
        /* The peer says bye or closes only after its last write was
         * acknowledged, so that write's completion is in our queue: take
         * it before judging what is pending. */
        vb_poll_cq(ctx);
        if (c->base.err != WEFT_OK)
            return;
    }
    if (st != WEFT_OK) {
        if (c->phase == VB_PH_WATCH && !conn_pending(c)) {
            c->peer_gone = true; /* the peer finished and left: fine until used */
            return;
        }
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d is gone (its tcp connection closed or failed)", ctx->rank,
                     c->peer);
        return;
    }
    const uint8_t *first = c->phase == VB_PH_INFO    ? (const uint8_t *)&c->theirs
                           : c->phase == VB_PH_READY ? (const uint8_t *)&c->ready_in
                                                     : &c->watch_byte;
    if (n == 1 && *first == VB_FAILED_BYTE) {
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d failed its verbs connection to this rank (its error says why)",
                     ctx->rank, c->peer);
        return;
    }
    switch (c->phase) {
    case VB_PH_INFO:
        if (c->state == VB_IDLE && vb_conn_start(c) != WEFT_OK)
            return;
        if (vb_qpinfo_check(&c->theirs, n, ctx->nqps, c->cm, why, sizeof(why)) != WEFT_OK) {
            vb_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: rank %d sent %s", ctx->rank, c->peer, why);
            return;
        }
        c->got_info = true;
        c->phase = VB_PH_READY;
        st = ctx->oob_ops->irecv(c->oob, &c->ready_in, sizeof(c->ready_in), &c->oob_rreq);
        if (st != WEFT_OK)
            break;
        /* By hand now; through rdma_cm the lower rank calls, the other
         * answers the requests as they come (vb_cm_drain). */
        if (!c->cm && conn_join(c) != WEFT_OK)
            return;
        if (c->cm && ctx->rank < c->peer && vb_cm_connect(c) != WEFT_OK)
            return;
        vb_conn_try_ready(c);
        return;
    case VB_PH_READY:
        if (n != sizeof(c->ready_in) || le32toh(c->ready_in) != VB_READY_MAGIC) {
            vb_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: rank %d sent a bad ready message",
                         ctx->rank, c->peer);
            return;
        }
        c->peer_ready = true;
        c->phase = VB_PH_WATCH;
        st = ctx->oob_ops->irecv(c->oob, &c->watch_byte, 1, &c->oob_rreq);
        if (st == WEFT_OK && c->ready_sent)
            conn_up(c);
        break;
    default:
        if (n == 1 && c->watch_byte == VB_BYE) {
            /* The peer is destroying its communicator. */
            if (conn_pending(c))
                vb_conn_fail(c, WEFT_ERR_REMOTE,
                             "rank %d: rank %d left while requests toward it were pending",
                             ctx->rank, c->peer);
            c->peer_gone = true;
            return;
        }
        vb_conn_fail(c, WEFT_ERR_REMOTE,
                     "rank %d: rank %d sent bytes on its verbs watch connection", ctx->rank,
                     c->peer);
        return;
    }
    if (st != WEFT_OK)
        vb_conn_fail(c, st, "rank %d: cannot receive from rank %d: %s", ctx->rank, c->peer,
                     weft_thread_last_error());
}

bool vb_conn_setup(struct vb_conn *c)
{
    struct vb_ctx *ctx = c->ctx;
    bool moved = false;
    for (int i = 0; i < 2; i++) {
        int done = 0;
        if (c->oob_sreq[i] == NULL)
            continue;
        weft_status_t st = ctx->oob_ops->test(c->oob_sreq[i], &done, NULL);
        if (!done && st == WEFT_OK)
            continue;
        c->oob_sreq[i] = NULL;
        moved = true;
        if (st != WEFT_OK)
            vb_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: cannot reach rank %d to set up verbs: %s",
                         ctx->rank, c->peer, weft_thread_last_error());
    }
    while (c->oob_rreq) {
        int done = 0;
        size_t n = 0;
        weft_status_t st = ctx->oob_ops->test(c->oob_rreq, &done, &n);
        if (!done && st == WEFT_OK)
            break;
        c->oob_rreq = NULL;
        moved = true;
        oob_received(c, st, n);
    }
    return moved;
}

/* ---- async events -------------------------------------------------------------- */

void vb_async_drain(struct vb_ctx *ctx)
{
    struct ibv_async_event ev;
    while (ibv_get_async_event(ctx->dev, &ev) == 0) {
        const char *what = ibv_event_type_str(ev.event_type);
        switch (ev.event_type) {
        case IBV_EVENT_QP_FATAL:
        case IBV_EVENT_QP_REQ_ERR:
        case IBV_EVENT_QP_ACCESS_ERR: {
            struct vb_qp *q = ev.element.qp ? ev.element.qp->qp_context : NULL;
            if (q)
                vb_conn_fail(q->conn, WEFT_ERR_REMOTE,
                             "rank %d: %s port %d: queue pair %d toward rank %d: %s", ctx->rank,
                             ctx->devname, ctx->port, q->index, q->conn->peer, what);
            break;
        }
        case IBV_EVENT_PORT_ERR:
        case IBV_EVENT_DEVICE_FATAL:
        case IBV_EVENT_CQ_ERR:
            if (ctx->fatal == WEFT_OK) {
                ctx->fatal = WEFT_ERR_SYSTEM;
                snprintf(ctx->fatalmsg, sizeof(ctx->fatalmsg), "rank %d: %s port %d: %s",
                         ctx->rank, ctx->devname, ctx->port, what);
                for (int p = 0; p < ctx->nranks; p++)
                    if (ctx->conns[p])
                        vb_conn_fail(ctx->conns[p], WEFT_ERR_SYSTEM, "%s", ctx->fatalmsg);
            }
            break;
        default:
            WEFT_INFO(WEFT_SUB_NET, "rank %d: %s port %d: %s", ctx->rank, ctx->devname,
                      ctx->port, what);
        }
        ibv_ack_async_event(&ev);
    }
}

/* ---- device and port ------------------------------------------------------------- */

/* The port'th usable (device, port) pair, by WEFT_IB_HCA, in list order. */
static weft_status_t pick_port(struct vb_ctx *ctx, struct ibv_device **list, int ndev,
                               const struct weft_ib_hca_list *filter, int want)
{
    int seen = 0, count = 0;
    /* Two passes: count the candidates, then open the chosen one. */
    for (int pass = 0; pass < 2; pass++) {
        for (int d = 0; d < ndev; d++) {
            const char *name = ibv_get_device_name(list[d]);
            if (!weft_ib_hca_match(filter, name, -1))
                continue;
            struct ibv_context *dev = ibv_open_device(list[d]);
            if (dev == NULL)
                continue;
            struct ibv_device_attr da;
            if (ibv_query_device(dev, &da) != 0) {
                ibv_close_device(dev);
                continue;
            }
            for (int p = 1; p <= da.phys_port_cnt; p++) {
                struct ibv_port_attr pa;
                if (!weft_ib_hca_match(filter, name, p) || ibv_query_port(dev, (uint8_t)p, &pa) != 0 ||
                    pa.state != IBV_PORT_ACTIVE)
                    continue;
                if (pass == 0) {
                    count++;
                } else if (seen++ == want % count) {
                    ctx->dev = dev;
                    ctx->port = p;
                    ctx->pattr = pa;
                    snprintf(ctx->devname, sizeof(ctx->devname), "%s", name);
                    return WEFT_OK;
                }
            }
            ibv_close_device(dev);
        }
        if (count == 0)
            break;
    }
    return WEFT_ERR_UNSUPPORTED;
}

/* RoCE: the GID by WEFT_IB_GID_INDEX / WEFT_IB_ADDR_FAMILY, preferring the
 * one of the interface the bootstrap uses. */
static weft_status_t pick_gid(struct vb_ctx *ctx, const union weft_sockaddr *local)
{
    struct weft_ib_gid cand[256];
    int n = 0;
    char why[256] = "";
    const char *sysfs = weft_param_str("WEFT_IB_SYSFS");
    if (weft_ib_gids_from_sysfs(sysfs, ctx->devname, ctx->port, cand, 256, &n, why, sizeof(why)) !=
            WEFT_OK ||
        n == 0) {
        /* No sysfs (a software device, a container): the table itself. */
        n = 0;
        for (int i = 0; i < ctx->pattr.gid_tbl_len && n < 256; i++) {
            union ibv_gid g;
            static const uint8_t zero[16];
            if (ibv_query_gid(ctx->dev, (uint8_t)ctx->port, i, &g) != 0 ||
                memcmp(g.raw, zero, 16) == 0)
                continue;
            cand[n] = (struct weft_ib_gid){.index = i, .type = WEFT_GID_UNKNOWN};
            memcpy(cand[n].raw, g.raw, 16);
            n++;
        }
    }
    bool roce = ctx->pattr.link_layer == IBV_LINK_LAYER_ETHERNET;
    int family = weft_ib_addr_family(weft_param_str("WEFT_IB_ADDR_FAMILY"));
    if (family < 0)
        return weft_error(ctx->err, WEFT_ERR_INVALID_ARG,
                          "WEFT_IB_ADDR_FAMILY=%s: expected AF_INET or AF_INET6",
                          weft_param_str("WEFT_IB_ADDR_FAMILY"));
    const uint8_t *ip = NULL;
    if (family == AF_INET && local->sa.sa_family == AF_INET)
        ip = (const uint8_t *)&local->in.sin_addr;
    else if (family == AF_INET6 && local->sa.sa_family == AF_INET6)
        ip = (const uint8_t *)&local->in6.sin6_addr;
    int want = (int)weft_param_int("WEFT_IB_GID_INDEX");
    int k = weft_ib_gid_pick(cand, n, roce, want, family, ip, why, sizeof(why));
    if (k < 0)
        return weft_error(ctx->err, WEFT_ERR_INVALID_ARG, "rank %d: %s port %d: %s", ctx->rank,
                          ctx->devname, ctx->port, why);
    if (why[0])
        WEFT_INFO(WEFT_SUB_INIT, "rank %d: %s port %d: %s", ctx->rank, ctx->devname, ctx->port,
                  why);
    ctx->me.gid_index = cand[k].index;
    memcpy(ctx->me.gid, cand[k].raw, 16);
    return WEFT_OK;
}

static int param_in(const char *name, int lo, int hi, int *out, struct weft_errsink *err)
{
    int64_t v = weft_param_int(name);
    if (v < lo || v > hi) {
        weft_error(err, WEFT_ERR_INVALID_ARG, "%s=%lld: expected %d to %d", name, (long long)v,
                   lo, hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

weft_status_t vb_init(const struct weft_transport_init *args, void **vctx, void *addr,
                      size_t *addrlen)
{
    *vctx = NULL;
    weft_transport_register_params();
    struct weft_errsink *err = args->err;
    if (args->oob_ops == NULL || *addrlen < sizeof(struct vb_addr))
        return weft_error(err, WEFT_ERR_INTERNAL, "verbs init: no out-of-band transport");
    struct weft_ib_hca_list filter;
    char why[256];
    const char *cm_mode = weft_param_str("WEFT_IB_CM");
    if (strcmp(cm_mode, "auto") != 0 && strcmp(cm_mode, "oob") != 0 && strcmp(cm_mode, "rdmacm") != 0)
        return weft_error(err, WEFT_ERR_INVALID_ARG,
                          "WEFT_IB_CM=%s: expected auto, oob or rdmacm", cm_mode);
    if (weft_ib_hca_parse(weft_param_str("WEFT_IB_HCA"), &filter, why, sizeof(why)) != WEFT_OK)
        return weft_error(err, WEFT_ERR_INVALID_ARG, "WEFT_IB_HCA: %s", why);
    struct vb_ctx *ctx;
    WEFT_TP_CTX_NEW(ctx, args, "verbs");
    ctx->oob_ops = args->oob_ops;
    ctx->oob_ctx = args->oob_ctx;
    ctx->stopfd = -1;
    ctx->max_inline = VB_INLINE;
    ctx->regcache_all = weft_param_int("WEFT_IB_REGCACHE") != 0;
    weft_status_t st = WEFT_OK;
    if (param_in("WEFT_IB_QPS_PER_CONNECTION", 1, VB_MAX_QPS, &ctx->nqps, err) ||
        param_in("WEFT_IB_TIMEOUT", 0, 31, &ctx->timeout, err) ||
        param_in("WEFT_IB_RETRY_CNT", 0, 7, &ctx->retry_cnt, err) ||
        param_in("WEFT_IB_TC", 0, 255, &ctx->tc, err) ||
        param_in("WEFT_IB_SL", 0, 15, &ctx->sl, err)) {
        free(ctx);
        return WEFT_ERR_INVALID_ARG;
    }
    memcpy(ctx->secret, args->secret, sizeof(ctx->secret));
    bool cm = strcmp(cm_mode, "oob") != 0 && vb_cm_open(ctx, &args->local, &filter);
    int ndev = 0;
    struct ibv_device **list = cm ? NULL : ibv_get_device_list(&ndev);
    if (cm) {
        /* rdma_cm picked the device that owns our address. */
    } else if (list == NULL || ndev == 0) {
        WEFT_INFO(WEFT_SUB_INIT, "rank %d: no RDMA devices%s%s", ctx->rank, list ? "" : ": ",
                  list ? "" : strerror(errno));
        if (list)
            ibv_free_device_list(list);
        free(ctx);
        return weft_error_quiet(err, WEFT_ERR_UNSUPPORTED, "no RDMA devices");
    }
    if (!cm) {
        st = pick_port(ctx, list, ndev, &filter, args->rank);
        ibv_free_device_list(list);
    }
    if (st != WEFT_OK) {
        WEFT_INFO(WEFT_SUB_INIT, "rank %d: no active RDMA port matches WEFT_IB_HCA=%s", ctx->rank,
                  weft_param_str("WEFT_IB_HCA"));
        free(ctx);
        return weft_error_quiet(err, WEFT_ERR_UNSUPPORTED, "no active RDMA port");
    }
    ctx->me = (struct vb_addr){
        .magic = htole32(VB_ADDR_MAGIC),
        .version = htole16(1),
        .link_layer = ctx->pattr.link_layer == IBV_LINK_LAYER_ETHERNET ? IBV_LINK_LAYER_ETHERNET
                                                                       : IBV_LINK_LAYER_INFINIBAND,
        .port = (uint8_t)ctx->port,
        .lid = ctx->pattr.lid,
        .mtu = (uint8_t)ctx->pattr.active_mtu,
        .nqps = (uint8_t)ctx->nqps,
    };
    snprintf(ctx->me.dev, sizeof(ctx->me.dev), "%.31s", ctx->devname);
    if (ctx->me.link_layer == IBV_LINK_LAYER_ETHERNET) {
        WEFT_CHECK_GOTO(pick_gid(ctx, &args->local), st, fail);
    } else {
        union ibv_gid g;
        if (ibv_query_gid(ctx->dev, (uint8_t)ctx->port, 0, &g) == 0)
            memcpy(ctx->me.gid, g.raw, 16);
    }
    ctx->conns = calloc((size_t)ctx->nranks, sizeof(*ctx->conns));
    ctx->oob_conn = calloc((size_t)ctx->nranks, sizeof(*ctx->oob_conn));
    size_t fifo_bytes = (size_t)ctx->nranks * sizeof(struct vb_peer_mem);
    if (ctx->conns == NULL || ctx->oob_conn == NULL ||
        posix_memalign((void **)&ctx->fifo_mem, 4096, fifo_bytes) != 0) {
        st = weft_error(err, WEFT_ERR_NO_MEMORY, "verbs: out of memory for %d ranks", ctx->nranks);
        goto fail;
    }
    memset(ctx->fifo_mem, 0, fifo_bytes);
    vb_mem_init(ctx);
    ctx->pd = ibv_alloc_pd(ctx->dev);
    ctx->chan = ctx->pd ? ibv_create_comp_channel(ctx->dev) : NULL;
    ctx->cq = ctx->chan ? ibv_create_cq(ctx->dev, VB_CQ_DEPTH, ctx, ctx->chan, 0) : NULL;
    ctx->fifo_mr = ctx->cq ? ibv_reg_mr(ctx->pd, ctx->fifo_mem, fifo_bytes,
                                        IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
                           : NULL;
    ctx->stopfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ctx->fifo_mr == NULL || ctx->stopfd < 0 ||
        fcntl(ctx->chan->fd, F_SETFL, fcntl(ctx->chan->fd, F_GETFL) | O_NONBLOCK) != 0 ||
        fcntl(ctx->dev->async_fd, F_SETFL, fcntl(ctx->dev->async_fd, F_GETFL) | O_NONBLOCK) != 0) {
        st = weft_error(err, WEFT_ERR_SYSTEM,
                        "rank %d: %s port %d: cannot set up the protection domain, completion "
                        "queue or FIFO: %s",
                        ctx->rank, ctx->devname, ctx->port, strerror(errno));
        goto fail;
    }
    if (!cm && strcmp(cm_mode, "rdmacm") == 0) {
        st = weft_error(err, WEFT_ERR_INVALID_ARG,
                        "rank %d: WEFT_IB_CM=rdmacm, but rdma_cm cannot serve %s here (the INFO "
                        "log says why); auto falls back to the tcp exchange",
                        ctx->rank, ctx->devname);
        goto fail;
    }
    if (cm) {
        ctx->me.cm = 1;
        ctx->me.cm_family = (uint8_t)args->local.sa.sa_family;
        ctx->me.cm_port = ctx->cm_port;
        if (args->local.sa.sa_family == AF_INET)
            memcpy(ctx->me.cm_ip, &args->local.in.sin_addr, 4);
        else
            memcpy(ctx->me.cm_ip, &args->local.in6.sin6_addr, 16);
    }
    memcpy(addr, &ctx->me, sizeof(ctx->me));
    *addrlen = sizeof(ctx->me);
    char gid[64];
    weft_ib_gid_str(ctx->me.gid, gid, sizeof(gid));
    WEFT_INFO(WEFT_SUB_INIT, "rank %d: verbs on %s port %d (%s, mtu %d, lid %u, gid %s index %u, %d "
              "queue pairs per peer)",
              ctx->rank, ctx->devname, ctx->port, link_name(ctx->me.link_layer),
              128 << ctx->me.mtu, ctx->me.lid, gid, ctx->me.gid_index, ctx->nqps);
    *vctx = ctx;
    return WEFT_OK;
fail:
    vb_finalize(ctx);
    return st;
}

void vb_bind_oob(void *vctx, int peer, void *oob_conn)
{
    struct vb_ctx *ctx = vctx;
    if (peer >= 0 && peer < ctx->nranks)
        ctx->oob_conn[peer] = oob_conn;
}

weft_status_t vb_connect(void *vctx, int peer, const void *addr, size_t addrlen, void **vconn)
{
    struct vb_ctx *ctx = vctx;
    if (peer < 0 || peer >= ctx->nranks || peer == ctx->rank || ctx->oob_conn[peer] == NULL)
        return weft_error(ctx->err, WEFT_ERR_INTERNAL, "verbs connect: bad peer %d", peer);
    struct vb_conn *c = aligned_alloc(64, (sizeof(*c) + 63) & ~(size_t)63);
    if (c == NULL)
        return weft_error(ctx->err, WEFT_ERR_NO_MEMORY, "verbs: out of memory");
    memset(c, 0, sizeof(*c));
    c->base.reqs = &ctx->reqs;
    c->ctx = ctx;
    c->peer = peer;
    c->oob = ctx->oob_conn[peer];
    c->mem = (struct vb_peer_mem *)(ctx->fifo_mem + (size_t)peer * sizeof(struct vb_peer_mem));
    weft_status_t st = addr_check(ctx, peer, addr, addrlen, &c->addr);
    if (st == WEFT_OK)
        st = ctx->oob_ops->irecv(c->oob, &c->theirs, sizeof(c->theirs), &c->oob_rreq);
    if (st != WEFT_OK) {
        free(c);
        return st;
    }
    c->phase = VB_PH_INFO;
    c->cm = ctx->cm_listen != NULL && c->addr.cm;
    ctx->conns[peer] = c;
    *vconn = c;
    return WEFT_OK;
}

/* Says goodbye on every watch, so that peers see a departure and not a
 * failure; waits for the bytes to leave, at most 200 ms. */
static void say_bye(struct vb_ctx *ctx)
{
    static const uint8_t bye = VB_BYE;
    void **req = calloc((size_t)ctx->nranks, sizeof(*req));
    int left = 0;
    for (int p = 0; req && p < ctx->nranks; p++) {
        struct vb_conn *c = ctx->conns[p];
        if (c && c->phase == VB_PH_WATCH && c->base.err == WEFT_OK && !c->peer_gone &&
            ctx->oob_ops->isend(c->oob, &bye, 1, &req[p]) == WEFT_OK)
            left++;
    }
    uint64_t end = weft_now_ns() + 200000000ull;
    while (left > 0 && weft_now_ns() < end) {
        ctx->oob_ops->progress(ctx->oob_ctx, 1);
        for (int p = 0; p < ctx->nranks; p++) {
            int done = 0;
            if (req[p] && (ctx->oob_ops->test(req[p], &done, NULL) != WEFT_OK || done)) {
                req[p] = NULL;
                left--;
            }
        }
    }
    free(req);
}

void vb_finalize(void *vctx)
{
    struct vb_ctx *ctx = vctx;
    if (ctx == NULL)
        return;
    if (ctx->conns && ctx->oob_ctx)
        say_bye(ctx);
    if (ctx->waker.on) {
        uint64_t one = 1;
        if (write(ctx->stopfd, &one, sizeof(one)) < 0)
            WEFT_WARN(WEFT_SUB_NET, "verbs: cannot stop the waker: %s", strerror(errno));
        pthread_join(ctx->waker.thread, NULL);
    }
    for (int p = 0; ctx->conns && p < ctx->nranks; p++) {
        struct vb_conn *c = ctx->conns[p];
        if (c == NULL)
            continue;
        for (int i = 0; i < c->nqps; i++) {
            if (c->qps[i].cm_id)
                vb_cm_qp_destroy(&c->qps[i]);
            else if (c->qps[i].qp)
                ibv_destroy_qp(c->qps[i].qp);
        }
        free(c);
    }
    weft_regcache_fini(&ctx->rc);
    weft_req_pool_fini(&ctx->reqs);
    if (ctx->fifo_mr)
        ibv_dereg_mr(ctx->fifo_mr);
    if (ctx->cq)
        ibv_destroy_cq(ctx->cq);
    if (ctx->chan)
        ibv_destroy_comp_channel(ctx->chan);
    if (ctx->pd)
        ibv_dealloc_pd(ctx->pd);
    if (ctx->dev && !ctx->dev_borrowed)
        ibv_close_device(ctx->dev);
    vb_cm_close(ctx);
    if (ctx->stopfd >= 0)
        close(ctx->stopfd);
    free(ctx->fifo_mem);
    free(ctx->conns);
    free(ctx->oob_conn);
    free(ctx);
}
