/*
 * verbs_cm.c - queue pairs connected through librdmacm: a listener bound
 * to the address the bootstrap uses (which picks the device that owns it,
 * and the GID and route for RoCE), and per pair the lower rank calling the
 * other once per queue pair.  A request carries the caller's rank, the
 * queue pair index and an HMAC over the callee's fresh nonce (sent in the
 * tcp info exchange), so a stranger who reaches the listener cannot join.
 * Without librdmacm, or where it cannot serve the address (no kernel
 * support, no RDMA device behind it), weft sets queue pairs up by hand.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>

#include "base/sock.h"
#include "transports/verbs/ib_select.h"
#include "transports/verbs/verbs.h"

#ifdef HAVE_RDMACM
#include <rdma/rdma_cma.h>

#define CM_TIMEOUT_MS 5000

void vb_cm_proof(const uint8_t *secret, const uint8_t *nonce, uint32_t rank, uint32_t qp,
                 uint8_t out[32])
{
    uint8_t msg[7 + 16 + 8];
    memcpy(msg, "weft-cm", 7);
    memcpy(msg + 7, nonce, 16);
    uint32_t r = htole32(rank), q = htole32(qp);
    memcpy(msg + 23, &r, 4);
    memcpy(msg + 27, &q, 4);
    weft_hmac_sha256(secret, WEFT_SECRET_BYTES, msg, sizeof(msg), out);
}

bool vb_cm_open(struct vb_ctx *ctx, const union weft_sockaddr *local, const void *vfilter)
{
    const struct weft_ib_hca_list *filter = vfilter;
    const char *why = NULL;
    int err = 0;
    union weft_sockaddr a = *local;
    a.in.sin_port = 0; /* same offset in both families */
    ctx->cm_chan = rdma_create_event_channel();
    if (ctx->cm_chan == NULL) {
        why = "no connection manager";
        err = errno;
        goto no;
    }
    if (rdma_create_id(ctx->cm_chan, &ctx->cm_listen, ctx, RDMA_PS_TCP) != 0) {
        why = "cannot create an id";
        err = errno;
        goto no;
    }
    if (rdma_bind_addr(ctx->cm_listen, &a.sa) != 0 || ctx->cm_listen->verbs == NULL) {
        why = "no RDMA device behind the bootstrap's address";
        err = errno;
        goto no;
    }
    const char *name = ibv_get_device_name(ctx->cm_listen->verbs->device);
    int port = ctx->cm_listen->port_num;
    if (!weft_ib_hca_match(filter, name, port)) {
        why = "its device is excluded by WEFT_IB_HCA";
        goto no;
    }
    if (ibv_query_port(ctx->cm_listen->verbs, (uint8_t)port, &ctx->pattr) != 0 ||
        ctx->pattr.state != IBV_PORT_ACTIVE) {
        why = "its port is not active";
        goto no;
    }
    if (rdma_listen(ctx->cm_listen, WEFT_LISTEN_BACKLOG) != 0) {
        why = "cannot listen";
        err = errno;
        goto no;
    }
    if (fcntl(ctx->cm_chan->fd, F_SETFL, fcntl(ctx->cm_chan->fd, F_GETFL) | O_NONBLOCK) != 0) {
        why = "cannot make its channel non-blocking";
        err = errno;
        goto no;
    }
    struct sockaddr *sa = rdma_get_local_addr(ctx->cm_listen);
    ctx->cm_port = sa->sa_family == AF_INET6 ? ((struct sockaddr_in6 *)sa)->sin6_port
                                             : ((struct sockaddr_in *)sa)->sin_port;
    ctx->cm_src = a;
    ctx->dev = ctx->cm_listen->verbs;
    ctx->dev_borrowed = true;
    ctx->port = port;
    snprintf(ctx->devname, sizeof(ctx->devname), "%s", name);
    WEFT_INFO(WEFT_SUB_INIT, "rank %d: rdma_cm listens on port %u of the bootstrap address (%s port %d)",
              ctx->rank, ntohs(ctx->cm_port), name, port);
    return true;
no:
    WEFT_INFO(WEFT_SUB_INIT, "rank %d: rdma_cm: %s%s%s; queue pairs are set up over tcp", ctx->rank,
              why, err ? ": " : "", err ? strerror(err) : "");
    vb_cm_close(ctx);
    return false;
}

static void cm_fail(struct vb_conn *c, int q, const char *what, int status)
{
    vb_conn_fail(c, WEFT_ERR_REMOTE,
                 "rank %d: %s port %d: rdma_cm connection %d to rank %d: %s (status %d)",
                 c->ctx->rank, c->ctx->devname, c->ctx->port, q, c->peer, what, status);
}

weft_status_t vb_cm_connect(struct vb_conn *c)
{
    struct vb_ctx *ctx = c->ctx;
    union weft_sockaddr to;
    memset(&to, 0, sizeof(to));
    if (c->addr.cm_family == AF_INET6) {
        to.in6.sin6_family = AF_INET6;
        memcpy(&to.in6.sin6_addr, c->addr.cm_ip, 16);
        to.in6.sin6_port = c->addr.cm_port;
    } else {
        to.in.sin_family = AF_INET;
        memcpy(&to.in.sin_addr, c->addr.cm_ip, 4);
        to.in.sin_port = c->addr.cm_port;
    }
    /* From the listener's address: without a source the kernel routes by
     * destination alone, and where two devices share a host (or a peer's
     * address is also local) that can land on another device than ours. */
    for (int i = 0; i < c->nqps; i++) {
        struct vb_qp *q = &c->qps[i];
        if (rdma_create_id(ctx->cm_chan, &q->cm_id, q, RDMA_PS_TCP) != 0 ||
            rdma_resolve_addr(q->cm_id, &ctx->cm_src.sa, &to.sa, CM_TIMEOUT_MS) != 0) {
            cm_fail(c, i, strerror(errno), errno);
            return WEFT_ERR_REMOTE;
        }
    }
    return WEFT_OK;
}

/* A queue pair for id (ours or a request's), with its receives posted;
 * false with c failed and why said. */
static bool cm_qp(struct vb_qp *q, struct rdma_cm_id *id)
{
    struct vb_conn *c = q->conn;
    struct vb_ctx *ctx = c->ctx;
    if (id->verbs != ctx->dev) {
        char what[160];
        snprintf(what, sizeof(what), "routed through %s port %d, not the listener's device",
                 id->verbs ? ibv_get_device_name(id->verbs->device) : "no device",
                 (int)id->port_num);
        cm_fail(c, q->index, what, EXDEV);
        return false;
    }
    /* Without this the kernel takes the ack timeout from the route (for
     * RoCE a fixed packet lifetime) and WEFT_IB_TIMEOUT would not hold. */
    uint8_t tmo = (uint8_t)ctx->timeout;
    if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &tmo, sizeof(tmo)) != 0)
        WEFT_INFO(WEFT_SUB_NET, "rank %d: rdma_cm: cannot set the ack timeout (%s); the route's "
                  "holds", ctx->rank, strerror(errno));
    struct ibv_qp_init_attr ia;
    vb_qp_init_attr(ctx, q, &ia);
    if (rdma_create_qp(id, ctx->pd, &ia) != 0) {
        cm_fail(c, q->index, strerror(errno), errno);
        return false;
    }
    q->cm_id = id;
    q->qp = id->qp;
    return vb_qp_prepare(c, q) == WEFT_OK;
}

static struct rdma_conn_param cm_param(struct vb_ctx *ctx, const void *priv, size_t len)
{
    return (struct rdma_conn_param){
        .private_data = priv,
        .private_data_len = (uint8_t)len,
        .responder_resources = 1,
        .initiator_depth = 1,
        .retry_count = (uint8_t)ctx->retry_cnt,
        .rnr_retry_count = 7,
    };
}

/* A request on our listener: from a rank below us that knows the nonce we
 * sent it, for a queue pair not yet made. */
static void on_request(struct vb_ctx *ctx, struct rdma_cm_event *ev)
{
    struct vb_cm_req rq;
    const struct rdma_conn_param *p = &ev->param.conn;
    struct vb_conn *c = NULL;
    const char *why = "a request of the wrong size";
    if (p->private_data_len >= sizeof(rq) && p->private_data) {
        memcpy(&rq, p->private_data, sizeof(rq));
        uint32_t r = le32toh(rq.rank), qi = le32toh(rq.qp);
        uint8_t want[32];
        why = "a request without weft's magic";
        if (le32toh(rq.magic) == VB_CM_MAGIC) {
            why = "a request from a rank that does not call us";
            if (r < (uint32_t)ctx->rank && ctx->conns[r] && ctx->conns[r]->cm &&
                ctx->conns[r]->state == VB_WAIT_PEER && qi < (uint32_t)ctx->nqps &&
                ctx->conns[r]->qps[qi].cm_id == NULL) {
                c = ctx->conns[r];
                vb_cm_proof(ctx->secret, c->mine.nonce, r, qi, want);
                why = "a request with a bad proof";
                if (weft_ct_equal(want, rq.proof, sizeof(want))) {
                    struct vb_qp *q = &c->qps[qi];
                    struct rdma_conn_param cp = cm_param(ctx, NULL, 0);
                    ev->id->context = q;
                    if (cm_qp(q, ev->id) && rdma_accept(ev->id, &cp) != 0)
                        cm_fail(c, (int)qi, strerror(errno), errno);
                    return;
                }
            }
        }
    }
    WEFT_WARN(WEFT_SUB_NET, "rank %d: rdma_cm: refused %s", ctx->rank, why);
    rdma_reject(ev->id, NULL, 0);
    ev->id->context = NULL; /* destroyed once the event is acked */
}

void vb_cm_drain(struct vb_ctx *ctx)
{
    struct rdma_cm_event *ev;
    while (rdma_get_cm_event(ctx->cm_chan, &ev) == 0) {
        struct rdma_cm_id *refused = NULL;
        struct vb_qp *q = ev->id ? ev->id->context : NULL;
        if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
            on_request(ctx, ev);
            if (ev->id->context == NULL)
                refused = ev->id;
            q = NULL;
        }
        if (q == (void *)ctx)
            q = NULL; /* the listener's own events */
        if (q) {
            struct vb_conn *c = q->conn;
            struct rdma_conn_param cp;
            struct vb_cm_req rq;
            switch (ev->event) {
            case RDMA_CM_EVENT_ADDR_RESOLVED:
                if (rdma_resolve_route(q->cm_id, CM_TIMEOUT_MS) != 0)
                    cm_fail(c, q->index, strerror(errno), errno);
                break;
            case RDMA_CM_EVENT_ROUTE_RESOLVED:
                rq = (struct vb_cm_req){htole32(VB_CM_MAGIC), htole32((uint32_t)ctx->rank),
                                        htole32((uint32_t)q->index), {0}};
                vb_cm_proof(ctx->secret, c->theirs.nonce, (uint32_t)ctx->rank,
                            (uint32_t)q->index, rq.proof);
                cp = cm_param(ctx, &rq, sizeof(rq));
                if (cm_qp(q, q->cm_id) && rdma_connect(q->cm_id, &cp) != 0)
                    cm_fail(c, q->index, strerror(errno), errno);
                break;
            case RDMA_CM_EVENT_ESTABLISHED:
                if (!q->up) {
                    q->up = true;
                    c->nup++;
                    vb_conn_try_ready(c);
                }
                break;
            case RDMA_CM_EVENT_DISCONNECTED:
                /* The watch says whether the peer left or failed; a
                 * disconnect with work pending is a failure either way. */
                if (c->sq.head || c->rq.head || c->state != VB_READY)
                    cm_fail(c, q->index, rdma_event_str(ev->event), ev->status);
                break;
            default:
                cm_fail(c, q->index, rdma_event_str(ev->event), ev->status);
            }
        }
        rdma_ack_cm_event(ev);
        if (refused)
            rdma_destroy_id(refused);
    }
}

void vb_cm_qp_destroy(struct vb_qp *q)
{
    if (q->qp)
        rdma_destroy_qp(q->cm_id);
    rdma_destroy_id(q->cm_id);
    q->cm_id = NULL;
    q->qp = NULL;
}

void vb_cm_close(struct vb_ctx *ctx)
{
    if (ctx->cm_listen)
        rdma_destroy_id(ctx->cm_listen);
    if (ctx->cm_chan)
        rdma_destroy_event_channel(ctx->cm_chan);
    ctx->cm_listen = NULL;
    ctx->cm_chan = NULL;
}

#else /* no librdmacm: queue pairs are always set up over tcp */

bool vb_cm_open(struct vb_ctx *ctx, const union weft_sockaddr *local, const void *filter)
{
    (void)local, (void)filter;
    WEFT_INFO(WEFT_SUB_INIT, "rank %d: built without librdmacm; queue pairs are set up over tcp",
              ctx->rank);
    return false;
}
weft_status_t vb_cm_connect(struct vb_conn *c)
{
    return weft_error(c->ctx->err, WEFT_ERR_INTERNAL, "rdma_cm: not built");
}
void vb_cm_drain(struct vb_ctx *ctx) { (void)ctx; }
void vb_cm_qp_destroy(struct vb_qp *q) { (void)q; }
void vb_cm_close(struct vb_ctx *ctx) { (void)ctx; }

#endif
