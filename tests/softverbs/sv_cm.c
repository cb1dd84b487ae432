/* sv_cm.c - librdmacm's connection manager (RDMA_PS_TCP, RC QPs) on the
 * software verbs device: event channels, cm ids, address binding, and the
 * REQ/REP/RTU/REJ/DREQ/DREP exchange between processes over UNIX sockets
 * <dir>/cm-<ip>-<port>, driven by one CM service thread per process. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "softverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define SV_EXPORT __attribute__((visibility("default")))

#define CM_MAGIC 0x53564d31u /* "SVM1" */
#define CM_MAX_ADDRS 32
/* What the IB CM leaves to the consumer once rdma_cm's header is in: the
 * receiver always sees the whole area, zero-padded, as on IB and RoCE. */
#define CM_REQ_PRIV 56
#define CM_REP_PRIV 196
#define CM_REJ_PRIV 148
#define CM_REJ_CONSUMER 28 /* IB_CM_REJ_CONSUMER_DEFINED */
#define CM_TIMEOUT 17      /* 4.096 us * 2^17: the kernel's RoCE packet life + 1 */
#define CM_MIN_RNR 12      /* 0.64 ms; the kernel's ib_cm uses 0 (655 ms) */

/* ---- wire format (host order: both ends are on this machine) ---- */

enum { CM_REQ = 1, CM_REP, CM_RTU, CM_REJ, CM_NOLSN, CM_DREQ, CM_DREP };

struct cm_msg {
    uint32_t magic, type;
    uint32_t qpn, psn; /* REQ, REP: the sender's QP */
    int32_t status;    /* REJ: the IB reject reason */
    uint16_t lid, pad;
    uint8_t gid[16]; /* where the receiver's QP must address the sender's */
    uint8_t retry, rnr_retry, resp_res, init_depth, plen;
    struct sockaddr_storage src, dst; /* REQ: the active side's view */
    uint8_t priv[CM_REP_PRIV];
};

/* ---- objects ---- */

enum cm_state {
    CM_IDLE,
    CM_BOUND,
    CM_LISTEN,
    CM_ADDR,         /* address resolved */
    CM_ROUTE,        /* route resolved */
    CM_CONNECT,      /* active: REQ sent */
    CM_REP_RCVD,     /* active: REP queued until the app fetches it */
    CM_REQ_RCVD,     /* passive: CONNECT_REQUEST delivered */
    CM_ACCEPTED,     /* passive: REP sent, waiting for the RTU */
    CM_ESTABLISHED,
    CM_DISCONNECTING, /* DREQ sent */
    CM_DONE,          /* disconnected, rejected or unreachable */
};

enum cm_link_kind { CM_LINK_REG, CM_LINK_CONN };

/* A socket of the CM thread: a registry entry (listening UNIX socket that
 * reserves an ip:port) or a connection to the peer id.  App threads only
 * mark a link closing; the CM thread frees it between epoll batches, so a
 * fetched event never points at freed memory. */
struct cm_link {
    int fd;
    enum cm_link_kind kind;
    struct cm_id *id;     /* NULL once the id let go of it */
    struct cm_link *reg;  /* accepted conn before its REQ: where it came in */
    bool closing;
    size_t have;          /* bytes of in[] filled */
    char in[sizeof(struct cm_msg)];
    char path[SV_PATH_MAX]; /* registry entries: unlinked when let go */
    struct cm_link *next;
};

struct cm_peer {
    uint32_t qpn, psn;
    uint16_t lid;
    uint8_t gid[16];
    uint8_t retry, rnr_retry, resp_res, init_depth;
};

/* A cm id.  The public part comes first; shadow stands where librdmacm
 * keeps its private fields (struct cma_id_private, ~170 bytes), zeroed, so
 * an entry point we do not define (rdma_set_option, ...) reads zeros and
 * fails on the kernel write instead of reading past the allocation. */
struct cm_id {
    struct rdma_cm_id id;
    char shadow[256];
    enum cm_state state;
    uint8_t ack_timeout; /* rdma_set_option's; 0: the route's (CM_TIMEOUT) */
    bool was_connected;
    bool peer_gone; /* the peer went away before the app finished its step */
    struct cm_link *link;
    struct cm_link *reg[CM_MAX_ADDRS];
    int nreg;
    struct cm_peer peer;
    uint32_t psn;
    uint8_t retry, resp_res, init_depth; /* our side's conn_param */
    struct ibv_sa_path_rec path;
};

/* A queued event; finish marks one the app's fetch completes (as
 * librdmacm's rdma_get_cm_event does for CONNECT_RESPONSE and REJECTED). */
struct cm_event {
    struct rdma_cm_event ev;
    uint8_t priv[CM_REP_PRIV];
    struct cm_event *next;
};

/* fd is an eventfd that is non-zero while events are queued: a fetch reads
 * it to zero and writes it back when more remain.  A spurious count (an id
 * destroyed with unfetched events, or librdmacm's own entry points writing
 * their kernel commands to fd, which an eventfd takes as a count and so
 * fails them cleanly with ENODATA) makes a fetch find the queue empty; it
 * then reads again, which blocks or says EAGAIN as fd's mode wants. */
struct cm_chan {
    struct rdma_event_channel ch;
    struct cm_event *head, **tail;
};

/* Process-wide state.  lock guards every id's state, links and channel
 * queues; it is taken before a soft context's lock, never after. */
static struct {
    pthread_mutex_t lock;
    int epfd, doorbell, err;
    pthread_t thread;
    struct ibv_context *verbs; /* the one soft context the ids share */
    struct ibv_pd *pd;         /* id->pd, as librdmacm's per-device PD */
    unsigned long netns;       /* loopback keys are per network namespace */
    struct cm_link *links;
    uint64_t reqs; /* CONNECT_REQUESTs received, for cm_reject=N */
} cm = {.lock = PTHREAD_MUTEX_INITIALIZER, .epfd = -1, .doorbell = -1};

static pthread_once_t cm_once = PTHREAD_ONCE_INIT;

static int cm_err(int e)
{
    errno = e;
    return -1;
}

static struct cm_id *cm_of(struct rdma_cm_id *id)
{
    return (struct cm_id *)id;
}

/* ---- addresses ---- */

static socklen_t sa_len(const struct sockaddr *sa)
{
    if (sa && sa->sa_family == AF_INET)
        return sizeof(struct sockaddr_in);
    if (sa && sa->sa_family == AF_INET6)
        return sizeof(struct sockaddr_in6);
    return 0;
}

static uint16_t sa_port(const struct sockaddr *sa)
{
    return ntohs(sa->sa_family == AF_INET ? ((const struct sockaddr_in *)sa)->sin_port
                                          : ((const struct sockaddr_in6 *)sa)->sin6_port);
}

static void sa_set_port(struct sockaddr *sa, uint16_t port)
{
    if (sa->sa_family == AF_INET)
        ((struct sockaddr_in *)sa)->sin_port = htons(port);
    else
        ((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
}

/* The address bytes, IPv4-mapped IPv6 seen as the IPv4 it maps. */
static const void *sa_raw(const struct sockaddr *sa, int *family)
{
    const struct sockaddr_in6 *s6 = (const void *)sa;

    if (sa->sa_family == AF_INET) {
        *family = AF_INET;
        return &((const struct sockaddr_in *)sa)->sin_addr;
    }
    if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
        *family = AF_INET;
        return &s6->sin6_addr.s6_addr[12];
    }
    *family = AF_INET6;
    return &s6->sin6_addr;
}

static bool sa_is_any(const struct sockaddr *sa)
{
    int f;
    const uint8_t *p = sa_raw(sa, &f);

    for (int i = 0; i < (f == AF_INET ? 4 : 16); i++)
        if (p[i])
            return false;
    return true;
}

static bool sa_is_loopback(const struct sockaddr *sa)
{
    int f;
    const uint8_t *p = sa_raw(sa, &f);

    return f == AF_INET ? p[0] == 127 : IN6_IS_ADDR_LOOPBACK((const struct in6_addr *)p);
}

static bool sa_same_ip(const struct sockaddr *a, const struct sockaddr *b)
{
    int fa, fb;
    const void *pa = sa_raw(a, &fa), *pb = sa_raw(b, &fb);

    return fa == fb && !memcmp(pa, pb, fa == AF_INET ? 4 : 16);
}

static bool sa_same_ip(const struct sockaddr *a, const struct sockaddr *b);

/* This namespace's distinct addresses of a family (0: both), up to max. */
static int local_addrs(int family, struct sockaddr_storage *out, int max)
{
    struct ifaddrs *ifa, *i;
    int n = 0;

    if (getifaddrs(&ifa))
        return 0;
    for (i = ifa; i && n < max; i = i->ifa_next) {
        socklen_t len = sa_len(i->ifa_addr);
        bool dup = false;

        if (!len || (family && i->ifa_addr->sa_family != family))
            continue;
        for (int j = 0; j < n && !dup; j++)
            dup = sa_same_ip((struct sockaddr *)&out[j], i->ifa_addr);
        if (dup)
            continue;
        memset(&out[n], 0, sizeof(out[n]));
        memcpy(&out[n++], i->ifa_addr, len);
    }
    freeifaddrs(ifa);
    return n;
}

static bool is_local(const struct sockaddr *sa)
{
    struct sockaddr_storage a[CM_MAX_ADDRS];
    int n = local_addrs(0, a, CM_MAX_ADDRS);

    for (int i = 0; i < n; i++)
        if (sa_same_ip((struct sockaddr *)&a[i], sa))
            return true;
    return false;
}

/* The source the kernel would route from: the destination itself when it
 * is ours, loopback for loopback, else our first address of the family
 * (IPv6 link-local last). */
static int pick_src(const struct sockaddr *dst, struct sockaddr_storage *src)
{
    struct sockaddr_storage a[CM_MAX_ADDRS];
    int n = local_addrs(dst->sa_family, a, CM_MAX_ADDRS), best = -1;

    for (int i = 0; i < n; i++) {
        struct sockaddr *s = (struct sockaddr *)&a[i];
        const struct sockaddr_in6 *s6 = (const void *)s;

        if (sa_same_ip(s, dst)) {
            best = i;
            break;
        }
        if (sa_is_loopback(s) != sa_is_loopback(dst))
            continue;
        if (best < 0 || (s->sa_family == AF_INET6 && !IN6_IS_ADDR_LINKLOCAL(&s6->sin6_addr) &&
                         IN6_IS_ADDR_LINKLOCAL(&((struct sockaddr_in6 *)&a[best])->sin6_addr)))
            best = i;
    }
    if (best < 0)
        return ENETUNREACH;
    *src = a[best];
    return 0;
}

/* <dir>/cm-<ip>-<port>; loopback names carry the namespace, since every
 * namespace has its own 127.0.0.1. */
static int reg_path(char *path, const struct sockaddr *sa)
{
    char ip[INET6_ADDRSTRLEN], ns[32] = "";
    int f, n;
    const void *raw = sa_raw(sa, &f);

    inet_ntop(f, raw, ip, sizeof(ip));
    if (sa_is_loopback(sa))
        snprintf(ns, sizeof(ns), "-ns%lu", cm.netns);
    n = snprintf(path, SV_PATH_MAX, "%s/cm-%s-%u%s", sv_ctx(cm.verbs)->dir, ip,
                 (unsigned)sa_port(sa), ns);
    return n >= SV_PATH_MAX ? ENAMETOOLONG : 0;
}

/* ---- the CM thread's sockets ---- */

static void ring(void)
{
    uint64_t one = 1;

    if (write(cm.doorbell, &one, sizeof(one)) < 0) {
        /* a saturated counter still wakes the thread */
    }
}

static struct cm_link *link_new(int fd, enum cm_link_kind kind, struct cm_id *c)
{
    struct cm_link *l = sv_watch_new(cm.epfd, fd, sizeof(*l));

    if (l) {
        *l = (struct cm_link){.fd = fd, .kind = kind, .id = c, .next = cm.links};
        cm.links = l;
    }
    return l;
}

/* Lets go of a link: a registry name goes at once, so new connects fail. */
static void link_drop(struct cm_link *l)
{
    if (!l || l->closing)
        return;
    l->closing = true;
    if (l->id && l->id->link == l)
        l->id->link = NULL;
    l->id = NULL;
    if (l->kind == CM_LINK_REG)
        unlink(l->path);
    ring();
}

/* Messages are small and few; a full socket buffer means a stuck peer,
 * which the reader side then sees as lost. */
static void link_send(struct cm_link *l, struct cm_msg *m)
{
    m->magic = CM_MAGIC;
    if (l && !l->closing &&
        send(l->fd, m, sizeof(*m), MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof(*m)) {
        /* the read side reports the loss */
    }
}

static void send_type(struct cm_link *l, uint32_t type, int32_t status, const void *priv,
                      uint8_t len)
{
    struct cm_msg m = {.type = type, .status = status, .plen = len};

    if (len)
        memcpy(m.priv, priv, len);
    link_send(l, &m);
}

/* ---- events ---- */

static void chan_signal(struct cm_chan *ch)
{
    uint64_t one = 1;

    if (write(ch->ch.fd, &one, sizeof(one)) < 0) {
        /* only a count near 2^64 refuses, and that is readable too */
    }
}

static struct cm_event *post_event(struct cm_id *c, enum rdma_cm_event_type type, int status)
{
    struct cm_chan *ch = (struct cm_chan *)c->id.channel;
    struct cm_event *e = calloc(1, sizeof(*e));

    if (!e)
        return NULL; /* as a lost MAD: the app times out */
    e->ev.id = &c->id;
    e->ev.event = type;
    e->ev.status = status;
    if (!ch->head)
        chan_signal(ch);
    *ch->tail = e;
    ch->tail = &e->next;
    return e;
}

static void event_priv(struct cm_event *e, const void *p, uint8_t len, uint8_t area)
{
    if (!e)
        return;
    memcpy(e->priv, p, len);
    e->ev.param.conn.private_data = e->priv;
    e->ev.param.conn.private_data_len = area;
}

/* ---- QPs ---- */

/* Where a peer must address our QP: the RoCE GID of our IPv4 source when
 * the context has it (what rdma_cm resolves), else GID 0; and our LID. */
static void qp_addr(struct cm_id *c, struct cm_msg *m, uint8_t *sgid_index)
{
    struct sv_context *ctx = sv_ctx(c->id.qp->context);
    const struct sockaddr *src = &c->id.route.addr.src_addr;
    int idx = 0, f;
    const void *raw = sa_raw(src, &f);

    for (int i = 1; i < ctx->ngid && f == AF_INET; i++)
        if (!memcmp(&ctx->gid[i].raw[12], raw, 4))
            idx = i;
    memcpy(m->gid, ctx->gid[idx].raw, 16);
    m->lid = ctx->lid;
    m->qpn = c->id.qp->qp_num;
    m->psn = c->psn;
    if (sgid_index)
        *sgid_index = (uint8_t)idx;
}

static uint8_t cap16(uint8_t v)
{
    return v > 16 ? 16 : v;
}

/* INIT -> RTR -> RTS toward c->peer, as rdma_accept and the active side's
 * CONNECT_RESPONSE do with the attributes the kernel's CM hands them. */
static int qp_connect(struct cm_id *c, uint8_t resp_res, uint8_t init_depth, uint8_t retry,
                      uint8_t rnr_retry)
{
    struct ibv_qp_attr a = {0};
    struct cm_msg me;
    uint8_t sgid_index;
    int err;

    qp_addr(c, &me, &sgid_index);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = c->peer.qpn;
    a.rq_psn = c->peer.psn;
    a.max_dest_rd_atomic = cap16(resp_res);
    a.min_rnr_timer = CM_MIN_RNR;
    a.ah_attr.port_num = 1;
    a.ah_attr.dlid = c->peer.lid;
    a.ah_attr.is_global = 1;
    memcpy(a.ah_attr.grh.dgid.raw, c->peer.gid, 16);
    a.ah_attr.grh.sgid_index = sgid_index;
    a.ah_attr.grh.hop_limit = 64;
    err = ibv_modify_qp(c->id.qp, &a,
                        IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                            IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
    if (err)
        return err;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = c->ack_timeout ? c->ack_timeout : CM_TIMEOUT;
    a.retry_cnt = retry > 7 ? 7 : retry;
    a.rnr_retry = rnr_retry > 7 ? 7 : rnr_retry;
    a.sq_psn = c->psn;
    a.max_rd_atomic = cap16(init_depth);
    return ibv_modify_qp(c->id.qp, &a,
                         IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                             IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
}

static void qp_err(struct cm_id *c)
{
    struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};

    if (c->id.qp)
        ibv_modify_qp(c->id.qp, &a, IBV_QP_STATE);
}

/* ---- the CM thread ---- */

static void peer_from(struct cm_peer *p, const struct cm_msg *m)
{
    p->qpn = m->qpn;
    p->psn = m->psn;
    p->lid = m->lid;
    memcpy(p->gid, m->gid, 16);
    p->retry = m->retry;
    p->rnr_retry = m->rnr_retry;
    p->resp_res = m->resp_res;
    p->init_depth = m->init_depth;
}

static void fill_ibaddr(struct cm_id *c)
{
    struct rdma_addr *ra = &c->id.route.addr;
    const struct sockaddr *sides[2] = {&ra->src_addr, &ra->dst_addr};
    union ibv_gid *gids[2] = {&ra->addr.ibaddr.sgid, &ra->addr.ibaddr.dgid};

    for (int i = 0; i < 2; i++) {
        int f;
        const void *raw;

        if (!sa_len(sides[i]))
            continue;
        raw = sa_raw(sides[i], &f);
        memset(gids[i], 0, sizeof(*gids[i]));
        if (f == AF_INET) {
            gids[i]->raw[10] = gids[i]->raw[11] = 0xff;
            memcpy(&gids[i]->raw[12], raw, 4);
        } else {
            memcpy(gids[i]->raw, raw, 16);
        }
    }
    ra->addr.ibaddr.pkey = htons(0xffff);
}

/* A REQ on a connection accepted from a registry socket. */
static void on_req(struct cm_link *l, const struct cm_msg *m)
{
    struct cm_id *lis = l->reg ? l->reg->id : NULL, *c;
    struct cm_event *e;

    if (!lis || lis->state != CM_LISTEN) {
        send_type(l, CM_NOLSN, 0, NULL, 0);
        link_drop(l);
        return;
    }
    cm.reqs++;
    if (sv_ctx(cm.verbs)->fault.cm_reject_n == cm.reqs) {
        send_type(l, CM_REJ, CM_REJ_CONSUMER, NULL, 0);
        link_drop(l);
        return;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        link_drop(l);
        return;
    }
    c->id.channel = lis->id.channel;
    c->id.context = lis->id.context;
    c->id.ps = RDMA_PS_TCP;
    c->id.qp_type = IBV_QPT_RC;
    c->id.verbs = cm.verbs;
    c->id.pd = cm.pd;
    c->id.port_num = 1;
    memcpy(&c->id.route.addr.src_storage, &m->dst, sizeof(m->dst));
    sa_set_port(&c->id.route.addr.src_addr, sa_port(&lis->id.route.addr.src_addr));
    memcpy(&c->id.route.addr.dst_storage, &m->src, sizeof(m->src));
    fill_ibaddr(c);
    c->state = CM_REQ_RCVD;
    c->psn = sv_now_ns() & 0xffffff;
    peer_from(&c->peer, m);
    l->reg = NULL;
    l->id = c;
    c->link = l;
    e = post_event(c, RDMA_CM_EVENT_CONNECT_REQUEST, 0);
    if (!e)
        return;
    e->ev.listen_id = &lis->id;
    event_priv(e, m->priv, m->plen > CM_REQ_PRIV ? CM_REQ_PRIV : m->plen, CM_REQ_PRIV);
    e->ev.param.conn.responder_resources = m->resp_res;
    e->ev.param.conn.initiator_depth = m->init_depth;
    e->ev.param.conn.flow_control = 1;
    e->ev.param.conn.retry_count = m->retry;
    e->ev.param.conn.rnr_retry_count = m->rnr_retry;
    e->ev.param.conn.qp_num = m->qpn;
}

static void on_msg(struct cm_link *l, const struct cm_msg *m)
{
    struct cm_id *c = l->id;
    struct cm_event *e;

    if (!c) {
        if (m->type == CM_REQ)
            on_req(l, m);
        else
            link_drop(l);
        return;
    }
    switch (m->type) {
    case CM_REP:
        if (c->state != CM_CONNECT)
            break;
        peer_from(&c->peer, m);
        c->state = CM_REP_RCVD;
        e = post_event(c, RDMA_CM_EVENT_CONNECT_RESPONSE, 0);
        event_priv(e, m->priv, m->plen > CM_REP_PRIV ? CM_REP_PRIV : m->plen, CM_REP_PRIV);
        if (e) {
            e->ev.param.conn.responder_resources = m->resp_res;
            e->ev.param.conn.initiator_depth = m->init_depth;
            e->ev.param.conn.rnr_retry_count = m->rnr_retry;
            e->ev.param.conn.qp_num = m->qpn;
        }
        break;
    case CM_REJ:
        if (c->state != CM_CONNECT)
            break;
        c->state = CM_DONE;
        e = post_event(c, RDMA_CM_EVENT_REJECTED, m->status);
        event_priv(e, m->priv, m->plen > CM_REJ_PRIV ? CM_REJ_PRIV : m->plen, CM_REJ_PRIV);
        link_drop(l);
        break;
    case CM_NOLSN:
        if (c->state != CM_CONNECT)
            break;
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
        link_drop(l);
        break;
    case CM_RTU:
        if (c->state != CM_ACCEPTED)
            break;
        c->state = CM_ESTABLISHED;
        c->was_connected = true;
        post_event(c, RDMA_CM_EVENT_ESTABLISHED, 0);
        break;
    case CM_DREQ:
        if (c->state != CM_ESTABLISHED && c->state != CM_DISCONNECTING)
            break;
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_DISCONNECTED, 0);
        send_type(l, CM_DREP, 0, NULL, 0);
        link_drop(l);
        break;
    case CM_DREP:
        if (c->state != CM_DISCONNECTING)
            break;
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_DISCONNECTED, 0);
        link_drop(l);
        break;
    default:
        break;
    }
}

/* The peer's socket closed: its process died or its id was destroyed. */
static void on_lost(struct cm_link *l)
{
    struct cm_id *c = l->id;

    link_drop(l);
    if (!c)
        return;
    switch (c->state) {
    case CM_CONNECT:
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
        break;
    case CM_REP_RCVD:
    case CM_REQ_RCVD:
        c->peer_gone = true;
        break;
    case CM_ACCEPTED:
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_CONNECT_ERROR, -ETIMEDOUT);
        break;
    case CM_ESTABLISHED:
    case CM_DISCONNECTING:
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_DISCONNECTED, 0);
        break;
    default:
        break;
    }
}

static void on_readable(struct cm_link *l)
{
    while (!l->closing) {
        ssize_t n = recv(l->fd, l->in + l->have, sizeof(l->in) - l->have, MSG_DONTWAIT);
        struct cm_msg m;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (n <= 0) {
            on_lost(l);
            return;
        }
        l->have += (size_t)n;
        if (l->have < sizeof(m))
            continue;
        l->have = 0;
        memcpy(&m, l->in, sizeof(m));
        if (m.magic != CM_MAGIC) {
            on_lost(l);
            return;
        }
        on_msg(l, &m);
    }
}

static void on_accept(struct cm_link *reg)
{
    for (;;) {
        int fd = accept4(reg->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        struct cm_link *l;

        if (fd < 0)
            return;
        l = link_new(fd, CM_LINK_CONN, NULL);
        if (!l) {
            close(fd);
            continue;
        }
        l->reg = reg;
    }
}

static void reap(void)
{
    for (struct cm_link **pl = &cm.links; *pl;) {
        struct cm_link *l = *pl;

        if (!l->closing) {
            pl = &l->next;
            continue;
        }
        *pl = l->next;
        for (struct cm_link *o = cm.links; o; o = o->next)
            if (o->reg == l)
                o->reg = NULL;
        close(l->fd);
        free(l);
    }
}

static void *cm_service(void *arg)
{
    struct epoll_event evs[32];

    (void)arg;
    pthread_mutex_lock(&cm.lock);
    for (;;) {
        int n;

        reap();
        pthread_mutex_unlock(&cm.lock);
        n = epoll_wait(cm.epfd, evs, 32, -1);
        pthread_mutex_lock(&cm.lock);
        for (int i = 0; i < n; i++) {
            struct cm_link *l = evs[i].data.ptr;
            uint64_t cnt;

            if (!l) {
                if (read(cm.doorbell, &cnt, sizeof(cnt)) < 0) {
                    /* already drained */
                }
                continue;
            }
            if (l->closing)
                continue;
            if (l->kind == CM_LINK_REG)
                on_accept(l);
            else
                on_readable(l);
        }
    }
    return NULL;
}

/* The thread lives as long as the process, as librdmacm's state does. */
static void cm_start(void)
{
    struct epoll_event ev = {.events = EPOLLIN};
    pthread_attr_t attr;
    struct stat st;

    if (stat("/proc/self/ns/net", &st) == 0)
        cm.netns = (unsigned long)st.st_ino;
    cm.epfd = epoll_create1(EPOLL_CLOEXEC);
    cm.doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (cm.epfd < 0 || cm.doorbell < 0 || epoll_ctl(cm.epfd, EPOLL_CTL_ADD, cm.doorbell, &ev)) {
        cm.err = errno;
        return;
    }
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    cm.err = pthread_create(&cm.thread, &attr, cm_service, NULL);
    pthread_attr_destroy(&attr);
}

/* Opens the soft device once per process through its own open path, with
 * the PD librdmacm would allocate per device.  Callers hold cm.lock. */
static int cm_dev(void)
{
    struct ibv_device **list;
    int err = 0;

    if (cm.verbs)
        return 0;
    list = ibv_get_device_list(NULL);
    if (!list || !list[0]) {
        ibv_free_device_list(list);
        return ENODEV;
    }
    cm.verbs = ibv_open_device(list[0]);
    if (!cm.verbs)
        err = errno;
    ibv_free_device_list(list);
    if (err)
        return err;
    cm.pd = ibv_alloc_pd(cm.verbs);
    if (!cm.pd) {
        err = errno;
        ibv_close_device(cm.verbs);
        cm.verbs = NULL;
    }
    return err;
}

/* ---- event channels ---- */

SV_EXPORT struct rdma_event_channel *rdma_create_event_channel(void)
{
    struct cm_chan *ch;

    pthread_once(&cm_once, cm_start);
    if (cm.err) {
        errno = cm.err;
        return NULL;
    }
    ch = sv_zalloc(sizeof(*ch));
    if (!ch)
        return NULL;
    ch->ch.fd = eventfd(0, EFD_CLOEXEC);
    if (ch->ch.fd < 0) {
        int err = errno;

        free(ch);
        errno = err;
        return NULL;
    }
    ch->tail = &ch->head;
    return &ch->ch;
}

SV_EXPORT void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
    struct cm_chan *ch = (struct cm_chan *)channel;

    if (!ch)
        return;
    for (struct cm_event *e; (e = ch->head); free(e))
        ch->head = e->next;
    close(ch->ch.fd);
    free(ch);
}

/* Completes what the app's fetch completes in librdmacm: the active side's
 * QP goes to RTS and the RTU leaves when CONNECT_RESPONSE is fetched, so the
 * passive side is ESTABLISHED only after the active app asked. */
static void finish(struct cm_event *e)
{
    struct cm_id *c = cm_of(e->ev.id);
    int err;

    if (e->ev.event == RDMA_CM_EVENT_REJECTED || e->ev.event == RDMA_CM_EVENT_UNREACHABLE) {
        qp_err(c);
        return;
    }
    if (e->ev.event != RDMA_CM_EVENT_CONNECT_RESPONSE || c->state != CM_REP_RCVD)
        return;
    err = qp_connect(c, c->resp_res, c->init_depth, c->retry, c->peer.rnr_retry);
    if (err) {
        e->ev.event = RDMA_CM_EVENT_CONNECT_ERROR;
        e->ev.status = -err;
        c->state = CM_DONE;
        send_type(c->link, CM_REJ, CM_REJ_CONSUMER, NULL, 0);
        link_drop(c->link);
        return;
    }
    e->ev.event = RDMA_CM_EVENT_ESTABLISHED;
    c->state = CM_ESTABLISHED;
    c->was_connected = true;
    send_type(c->link, CM_RTU, 0, NULL, 0);
    if (c->peer_gone) {
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_DISCONNECTED, 0);
    }
}

SV_EXPORT int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
    struct cm_chan *ch = (struct cm_chan *)channel;
    struct cm_event *e = NULL;

    if (!ch || !event)
        return cm_err(EINVAL);
    while (!e) {
        uint64_t cnt;

        /* Blocks or says EAGAIN as the caller set O_NONBLOCK on fd. */
        if (read(ch->ch.fd, &cnt, sizeof(cnt)) != sizeof(cnt))
            return -1;
        pthread_mutex_lock(&cm.lock);
        SV_QUEUE_POP(ch->head, ch->tail, e);
        if (e && ch->head)
            chan_signal(ch);
        if (e)
            finish(e);
        pthread_mutex_unlock(&cm.lock);
    }
    *event = &e->ev;
    return 0;
}

SV_EXPORT int rdma_ack_cm_event(struct rdma_cm_event *event)
{
    if (!event)
        return cm_err(EINVAL);
    free(event); /* the first member of its struct cm_event */
    return 0;
}

/* ---- ids ---- */

SV_EXPORT int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **id,
                             void *context, enum rdma_port_space ps)
{
    struct cm_id *c;

    if (!id)
        return cm_err(EINVAL);
    if (ps != RDMA_PS_TCP)
        return cm_err(EOPNOTSUPP);
    if (!channel) /* librdmacm's synchronous mode is not modelled */
        return cm_err(EOPNOTSUPP);
    c = calloc(1, sizeof(*c));
    if (!c)
        return cm_err(ENOMEM);
    c->id.channel = channel;
    c->id.context = context;
    c->id.ps = ps;
    c->id.qp_type = IBV_QPT_RC;
    c->psn = sv_now_ns() & 0xffffff;
    *id = &c->id;
    return 0;
}

/* Drops c's unfetched events; pending CONNECT_REQUESTs of a listener take
 * their new ids with them, rejected as the kernel does. */
static void drop_events(struct cm_id *c)
{
    struct cm_chan *ch = (struct cm_chan *)c->id.channel;
    struct cm_event **p = &ch->head;

    while (*p) {
        struct cm_event *e = *p;

        if (e->ev.id != &c->id && e->ev.listen_id != &c->id) {
            p = &e->next;
            continue;
        }
        *p = e->next;
        if (e->ev.listen_id == &c->id && e->ev.id != &c->id) {
            struct cm_id *n = cm_of(e->ev.id);

            /* its only event is this one: nothing else to drop */
            send_type(n->link, CM_REJ, CM_REJ_CONSUMER, NULL, 0);
            link_drop(n->link);
            free(n);
        }
        free(e);
    }
    ch->tail = &ch->head;
    for (struct cm_event *e = ch->head; e; e = e->next)
        ch->tail = &e->next;
}

SV_EXPORT int rdma_destroy_id(struct rdma_cm_id *id)
{
    struct cm_id *c = cm_of(id);

    if (!id)
        return cm_err(EINVAL);
    pthread_mutex_lock(&cm.lock);
    drop_events(c);
    if (c->state == CM_REQ_RCVD)
        send_type(c->link, CM_REJ, CM_REJ_CONSUMER, NULL, 0);
    else if (c->state == CM_ESTABLISHED)
        send_type(c->link, CM_DREQ, 0, NULL, 0);
    link_drop(c->link);
    for (int i = 0; i < c->nreg; i++)
        link_drop(c->reg[i]);
    pthread_mutex_unlock(&cm.lock);
    free(c);
    return 0;
}

/* Binds a registry socket at sa's name.  A name bound but refusing
 * connections was left by a dead process and is taken over; a live one
 * means the ip:port is in use. */
static int reg_bind(struct cm_id *c, const struct sockaddr *sa)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    struct cm_link *l;
    int fd, err;

    if ((err = reg_path(un.sun_path, sa)))
        return err;
    for (int tries = 0; tries < 2; tries++) {
        int probe;

        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return errno;
        if (bind(fd, (struct sockaddr *)&un, sizeof(un)) == 0 && listen(fd, SOMAXCONN) == 0)
            break;
        err = errno;
        close(fd);
        fd = -1;
        if (err != EADDRINUSE)
            return err;
        probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (probe < 0)
            return errno;
        err = connect(probe, (struct sockaddr *)&un, sizeof(un)) < 0 ? errno : 0;
        close(probe);
        if (err != ECONNREFUSED)
            return EADDRINUSE;
        unlink(un.sun_path);
    }
    if (fd < 0)
        return EADDRINUSE;
    l = link_new(fd, CM_LINK_REG, c);
    if (!l) {
        unlink(un.sun_path);
        close(fd);
        return ENOMEM;
    }
    memcpy(l->path, un.sun_path, sizeof(l->path));
    c->reg[c->nreg++] = l;
    return 0;
}

static void reg_release(struct cm_id *c)
{
    for (int i = 0; i < c->nreg; i++)
        link_drop(c->reg[i]);
    c->nreg = 0;
}

/* Reserves sa (port 0: a free one) for every address it covers: one name
 * for a specific address, one per local address for a wildcard (IPv6's
 * also covers IPv4, as rdma_cm's default afonly=0 does).  Callers hold
 * cm.lock and have the device open. */
static int bind_locked(struct cm_id *c, const struct sockaddr *sa)
{
    struct sockaddr_storage a[CM_MAX_ADDRS];
    int n = 1, err = EADDRINUSE;
    uint16_t port = sa_port(sa);

    if (sa_is_any(sa)) {
        n = local_addrs(sa->sa_family == AF_INET ? AF_INET : 0, a, CM_MAX_ADDRS);
    } else {
        memset(&a[0], 0, sizeof(a[0]));
        memcpy(&a[0], sa, sa_len(sa));
    }
    for (int tries = 0; tries < (port ? 1 : 200) && err == EADDRINUSE; tries++) {
        uint16_t p = port;

        if (!p) {
            uint32_t r = 0;

            if (getrandom(&r, sizeof(r), 0) != sizeof(r))
                r = (uint32_t)sv_now_ns();
            p = (uint16_t)(32768 + r % 28232); /* Linux's ephemeral range */
        }
        err = 0;
        for (int i = 0; i < n && !err; i++) {
            sa_set_port((struct sockaddr *)&a[i], p);
            err = reg_bind(c, (struct sockaddr *)&a[i]);
        }
        if (err) {
            reg_release(c);
            continue;
        }
        memset(&c->id.route.addr.src_storage, 0, sizeof(c->id.route.addr.src_storage));
        memcpy(&c->id.route.addr.src_storage, sa, sa_len(sa));
        sa_set_port(&c->id.route.addr.src_addr, p);
    }
    return err;
}

SV_EXPORT int rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *addr)
{
    struct cm_id *c = cm_of(id);
    int err;

    if (!id || !addr)
        return cm_err(EINVAL);
    if (!sa_len(addr))
        return cm_err(EAFNOSUPPORT);
    if (!sa_is_any(addr) && !is_local(addr))
        return cm_err(EADDRNOTAVAIL);
    pthread_mutex_lock(&cm.lock);
    err = c->state != CM_IDLE ? EINVAL : cm_dev();
    if (!err)
        err = bind_locked(c, addr);
    if (!err) {
        c->state = CM_BOUND;
        if (!sa_is_any(addr)) {
            id->verbs = cm.verbs;
            id->pd = cm.pd;
            id->port_num = 1;
            fill_ibaddr(c);
        }
    }
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}

SV_EXPORT int rdma_listen(struct rdma_cm_id *id, int backlog)
{
    struct cm_id *c = cm_of(id);
    int err = 0;

    (void)backlog; /* the registry socket's own backlog is SOMAXCONN */
    if (!id)
        return cm_err(EINVAL);
    if (c->state == CM_IDLE) { /* the kernel binds to any address first */
        struct sockaddr_in any = {.sin_family = AF_INET};

        if (rdma_bind_addr(id, (struct sockaddr *)&any))
            return -1;
    }
    pthread_mutex_lock(&cm.lock);
    if (c->state == CM_BOUND)
        c->state = CM_LISTEN;
    else if (c->state != CM_LISTEN)
        err = EINVAL;
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}

/* As the kernel has it: RDMA_OPTION_ID_ACK_TIMEOUT sets the queue pair's
 * ack timeout at RTS instead of the route's; other options are refused. */
SV_EXPORT int rdma_set_option(struct rdma_cm_id *id, int level, int optname, void *optval,
                              size_t optlen)
{
    if (!id || !optval)
        return cm_err(EINVAL);
    if (level != RDMA_OPTION_ID || optname != RDMA_OPTION_ID_ACK_TIMEOUT ||
        optlen != sizeof(uint8_t))
        return cm_err(ENOSYS);
    pthread_mutex_lock(&cm.lock);
    cm_of(id)->ack_timeout = *(uint8_t *)optval & 0x1f;
    pthread_mutex_unlock(&cm.lock);
    return 0;
}

/* Resolution is local: any IPv4/IPv6 destination resolves when this
 * namespace has a source for it; whether anyone listens shows at connect. */
SV_EXPORT int rdma_resolve_addr(struct rdma_cm_id *id, struct sockaddr *src_addr,
                                struct sockaddr *dst_addr, int timeout_ms)
{
    struct cm_id *c = cm_of(id);
    struct sockaddr_storage src;
    int err;

    (void)timeout_ms;
    if (!id || !dst_addr)
        return cm_err(EINVAL);
    if (!sa_len(dst_addr) || (src_addr && src_addr->sa_family && !sa_len(src_addr)))
        return cm_err(EAFNOSUPPORT);
    if (src_addr && src_addr->sa_family && cm_of(id)->state == CM_IDLE &&
        rdma_bind_addr(id, src_addr))
        return -1;
    pthread_mutex_lock(&cm.lock);
    err = (c->state != CM_IDLE && c->state != CM_BOUND) ? EINVAL : cm_dev();
    if (err)
        goto out;
    memset(&c->id.route.addr.dst_storage, 0, sizeof(c->id.route.addr.dst_storage));
    memcpy(&c->id.route.addr.dst_storage, dst_addr, sa_len(dst_addr));
    if (c->state == CM_IDLE || sa_is_any(&c->id.route.addr.src_addr)) {
        uint16_t port = c->state == CM_BOUND ? sa_port(&c->id.route.addr.src_addr) : 0;

        if (pick_src(dst_addr, &src)) {
            post_event(c, RDMA_CM_EVENT_ADDR_ERROR, -ENETUNREACH);
            goto out;
        }
        if (!port) { /* an ephemeral port, not reserved: only listeners need one */
            uint32_t r = 0;

            if (getrandom(&r, sizeof(r), 0) != sizeof(r))
                r = (uint32_t)sv_now_ns();
            port = (uint16_t)(32768 + r % 28232);
        }
        c->id.route.addr.src_storage = src;
        sa_set_port(&c->id.route.addr.src_addr, port);
    }
    c->state = CM_ADDR;
    id->verbs = cm.verbs;
    id->pd = cm.pd;
    id->port_num = 1;
    fill_ibaddr(c);
    post_event(c, RDMA_CM_EVENT_ADDR_RESOLVED, 0);
out:
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}

SV_EXPORT int rdma_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
    struct cm_id *c = cm_of(id);
    int err = 0;

    (void)timeout_ms;
    if (!id)
        return cm_err(EINVAL);
    pthread_mutex_lock(&cm.lock);
    if (c->state == CM_ADDR) {
        struct ibv_sa_path_rec *p = &c->path;

        memset(p, 0, sizeof(*p));
        p->sgid = id->route.addr.addr.ibaddr.sgid;
        p->dgid = id->route.addr.addr.ibaddr.dgid;
        p->pkey = htons(0xffff);
        p->mtu = IBV_MTU_4096;
        p->packet_life_time = CM_TIMEOUT - 1;
        p->hop_limit = 64;
        p->reversible = 1;
        p->numb_path = 1;
        id->route.path_rec = p;
        id->route.num_paths = 1;
        c->state = CM_ROUTE;
        post_event(c, RDMA_CM_EVENT_ROUTE_RESOLVED, 0);
    } else {
        err = EINVAL;
    }
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}

/* ---- QPs on ids ---- */

/* As librdmacm, a CQ made for one side of id's QP (wr entries deep) comes
 * with a channel of its own; NULL with errno if either cannot be made. */
static struct ibv_cq *id_cq(struct rdma_cm_id *id, struct ibv_cq **cq,
                            struct ibv_comp_channel **ch, uint32_t wr)
{
    *ch = ibv_create_comp_channel(id->verbs);
    if (*ch)
        *cq = ibv_create_cq(id->verbs, wr ? (int)wr : 1, id, *ch, 0);
    return *cq;
}

static void id_cq_destroy(struct ibv_cq **cq, struct ibv_comp_channel **ch)
{
    if (*cq)
        ibv_destroy_cq(*cq);
    if (*ch)
        ibv_destroy_comp_channel(*ch);
    *cq = NULL;
    *ch = NULL;
}

static void destroy_cqs(struct rdma_cm_id *id)
{
    id_cq_destroy(&id->recv_cq, &id->recv_cq_channel);
    id_cq_destroy(&id->send_cq, &id->send_cq_channel);
}

SV_EXPORT int rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
                             struct ibv_qp_init_attr *qp_init_attr)
{
    struct ibv_qp_init_attr a;
    struct ibv_qp_attr qa = {.qp_state = IBV_QPS_INIT, .port_num = 1,
                             .qp_access_flags = IBV_ACCESS_LOCAL_WRITE |
                                                IBV_ACCESS_REMOTE_WRITE |
                                                IBV_ACCESS_REMOTE_READ};
    struct ibv_qp *qp;
    int err;

    if (!id || !qp_init_attr || !id->verbs || id->qp)
        return cm_err(EINVAL);
    pd = pd ? pd : id->pd;
    if (!pd || pd->context != id->verbs)
        return cm_err(EINVAL);
    a = *qp_init_attr;
    /* As librdmacm: missing CQs are made here. */
    if (!a.send_cq &&
        !(a.send_cq = id_cq(id, &id->send_cq, &id->send_cq_channel, a.cap.max_send_wr)))
        goto err_cq;
    if (!a.recv_cq &&
        !(a.recv_cq = id_cq(id, &id->recv_cq, &id->recv_cq_channel, a.cap.max_recv_wr)))
        goto err_cq;
    qp = ibv_create_qp(pd, &a);
    if (!qp)
        goto err_cq;
    err = ibv_modify_qp(qp, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                     IBV_QP_ACCESS_FLAGS);
    if (err) {
        ibv_destroy_qp(qp);
        errno = err;
        goto err_cq;
    }
    qp_init_attr->cap = a.cap;
    id->qp = qp;
    return 0;

err_cq:
    err = errno;
    destroy_cqs(id);
    return cm_err(err);
}

SV_EXPORT void rdma_destroy_qp(struct rdma_cm_id *id)
{
    if (!id || !id->qp)
        return;
    ibv_destroy_qp(id->qp);
    id->qp = NULL;
    destroy_cqs(id);
}

/* ---- connection ---- */

SV_EXPORT int rdma_connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    static const struct rdma_conn_param dflt = {.responder_resources = 16, .initiator_depth = 16,
                                                .retry_count = 7, .rnr_retry_count = 7};
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    struct cm_id *c = cm_of(id);
    struct cm_msg m = {.type = CM_REQ};
    int fd, err = 0;

    if (!id)
        return cm_err(EINVAL);
    param = param ? param : (struct rdma_conn_param *)&dflt;
    if (param->private_data_len > CM_REQ_PRIV || (param->private_data_len && !param->private_data))
        return cm_err(EINVAL);
    pthread_mutex_lock(&cm.lock);
    if (c->state != CM_ROUTE || !id->qp) {
        err = EINVAL;
        goto out;
    }
    err = reg_path(un.sun_path, &id->route.addr.dst_addr);
    if (err)
        goto out;
    c->retry = param->retry_count;
    c->resp_res = param->responder_resources;
    c->init_depth = param->initiator_depth;
    qp_addr(c, &m, NULL);
    m.retry = param->retry_count > 7 ? 7 : param->retry_count;
    m.rnr_retry = param->rnr_retry_count > 7 ? 7 : param->rnr_retry_count;
    m.resp_res = param->responder_resources;
    m.init_depth = param->initiator_depth;
    m.plen = param->private_data_len;
    if (m.plen)
        memcpy(m.priv, param->private_data, m.plen);
    memcpy(&m.src, &id->route.addr.src_storage, sizeof(m.src));
    memcpy(&m.dst, &id->route.addr.dst_storage, sizeof(m.dst));
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        err = errno;
        goto out;
    }
    /* Nobody bound there: as a REQ that no CM answers. */
    if (connect(fd, (struct sockaddr *)&un, sizeof(un)) < 0 ||
        !(c->link = link_new(fd, CM_LINK_CONN, c))) {
        close(fd);
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_UNREACHABLE, -ETIMEDOUT);
        goto out;
    }
    c->state = CM_CONNECT;
    link_send(c->link, &m);
out:
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}

SV_EXPORT int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
    struct cm_id *c = cm_of(id);
    struct cm_msg m = {.type = CM_REP};
    uint8_t resp_res, depth, rnr;
    int err = 0;

    if (!id)
        return cm_err(EINVAL);
    if (param && (param->private_data_len > CM_REP_PRIV ||
                  (param->private_data_len && !param->private_data)))
        return cm_err(EINVAL);
    pthread_mutex_lock(&cm.lock);
    if (c->state != CM_REQ_RCVD || !id->qp) {
        err = EINVAL;
        goto out;
    }
    /* Without param, what the REQ offered. */
    resp_res = param ? param->responder_resources : c->peer.init_depth;
    depth = param ? param->initiator_depth : c->peer.resp_res;
    rnr = param ? param->rnr_retry_count : 7;
    err = qp_connect(c, resp_res, depth, c->peer.retry, c->peer.rnr_retry);
    if (err)
        goto out;
    if (c->peer_gone) {
        c->state = CM_DONE;
        post_event(c, RDMA_CM_EVENT_CONNECT_ERROR, -ETIMEDOUT);
        goto out;
    }
    qp_addr(c, &m, NULL);
    m.rnr_retry = rnr > 7 ? 7 : rnr;
    m.resp_res = resp_res;
    m.init_depth = depth;
    m.plen = param ? param->private_data_len : 0;
    if (m.plen)
        memcpy(m.priv, param->private_data, m.plen);
    c->state = CM_ACCEPTED;
    link_send(c->link, &m);
out:
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}

SV_EXPORT int rdma_reject(struct rdma_cm_id *id, const void *private_data,
                          uint8_t private_data_len)
{
    struct cm_id *c = cm_of(id);
    int err = 0;

    if (!id || private_data_len > CM_REJ_PRIV || (private_data_len && !private_data))
        return cm_err(EINVAL);
    pthread_mutex_lock(&cm.lock);
    if (c->state == CM_REQ_RCVD) {
        send_type(c->link, CM_REJ, CM_REJ_CONSUMER, private_data, private_data_len);
        link_drop(c->link);
        c->state = CM_DONE;
    } else {
        err = EINVAL;
    }
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}

/* The QP goes to ERR first (its WRs flush), as librdmacm does.  After the
 * peer disconnected first this only answers, and succeeds. */
SV_EXPORT int rdma_disconnect(struct rdma_cm_id *id)
{
    struct cm_id *c = cm_of(id);
    int err = 0;

    if (!id)
        return cm_err(EINVAL);
    pthread_mutex_lock(&cm.lock);
    qp_err(c);
    if (c->state == CM_ESTABLISHED) {
        send_type(c->link, CM_DREQ, 0, NULL, 0);
        c->state = CM_DISCONNECTING;
    } else if (!c->was_connected) {
        err = EINVAL;
    }
    pthread_mutex_unlock(&cm.lock);
    return err ? cm_err(err) : 0;
}
