/* sv_wire.c - the per-context service thread of the software verbs
 * device: it talks to peer QPs over UNIX stream sockets (<dir>/qp-<qpn>),
 * runs the requester and responder sides of RC, and moves payload with
 * process_vm_readv/writev.  The responder does the copy, then ACKs, so
 * a requester completion always means the data is in place. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "softverbs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define SV_MAGIC 0x53567631u /* "SVv1" */

/* ---- wire format (host order: both ends are on this machine) ---- */

struct sv_hello {
    uint32_t magic, src_qpn, dest_qpn;
    uint16_t dlid, pad;
    uint8_t dgid[16];
};

enum { SV_MSG_REQ = 1, SV_MSG_RESP = 2 };

/* Followed by nsge {addr, len} pairs of requester memory, or by len inline
 * bytes when inl is set. */
struct sv_req {
    uint32_t type, seq, opcode, rkey, len, imm, nsge, inl;
    uint64_t raddr;
};

struct sv_wire_sge {
    uint64_t addr, len;
};

enum sv_nak { SV_ACK, SV_NAK_ACCESS, SV_NAK_INV_REQ, SV_NAK_REM_OP, SV_NAK_RNR, SV_NAK_NOT_READY };

struct sv_resp {
    uint32_t type, seq, status, arg; /* arg: responder's min_rnr_timer */
};

#define SEQ_LT(a, b) ((int32_t)((a) - (b)) < 0)

/* 4.096 us * 2^timeout per try; 0 means wait forever. */
static uint64_t sv_timeout_ns(const struct sv_qp *qp)
{
    return qp->attr.timeout ? 4096ull << qp->attr.timeout : 0;
}

/* The IB encoding of the RNR NAK timer (IBTA table 45), in microseconds. */
static uint64_t sv_rnr_ns(unsigned t)
{
    static const uint32_t us[32] = {
        655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
        2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920,
        122880, 163840, 245760, 327680, 491520};

    return (uint64_t)us[t & 31] * 1000;
}

/* ---- registry ---- */

/* Binds a listening socket at <dir>/<prefix>-<id> for a random id in
 * [lo, lo + span).  A name already bound but refusing connections was left
 * by a killed process and is taken over. */
int sv_bind_unique(const char *dir, const char *prefix, uint32_t lo, uint32_t span,
                   uint32_t *id, char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};

    for (int tries = 0; tries < 1000; tries++) {
        uint32_t r = 0;
        int fd, probe, err;

        if (getrandom(&r, sizeof(r), 0) != sizeof(r))
            r = (uint32_t)sv_now_ns();
        *id = lo + r % span;
        snprintf(sa.sun_path, sizeof(sa.sun_path), strcmp(prefix, "lid") ? "%s/%s-%06x" : "%s/%s-%04x",
                 dir, prefix, *id);
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -1;
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0 && listen(fd, 128) == 0) {
            memcpy(path, sa.sun_path, sizeof(sa.sun_path));
            return fd;
        }
        err = errno;
        close(fd);
        if (err != EADDRINUSE) {
            errno = err;
            return -1;
        }
        probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (probe < 0)
            return -1;
        if (connect(probe, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == ECONNREFUSED) {
            unlink(sa.sun_path);
            tries--; /* same odds again, now with the stale name gone */
        }
        close(probe);
    }
    errno = EADDRINUSE;
    return -1;
}

/* ---- sockets of the service thread ---- */

void *sv_watch_new(int epfd, int fd, size_t size)
{
    void *p = calloc(1, size);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = p};

    if (p && epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev)) {
        free(p);
        p = NULL;
    }
    return p;
}

struct sv_sock *sv_sock_new(struct sv_context *ctx, int fd, enum sv_sock_kind kind,
                                struct sv_qp *qp)
{
    struct sv_sock *s = sv_watch_new(ctx->epfd, fd, sizeof(*s));

    if (!s)
        return NULL;
    *s = (struct sv_sock){.fd = fd, .kind = kind, .qp = qp, .next = ctx->socks};
    ctx->socks = s;
    return s;
}

void sv_sock_free(struct sv_sock *s)
{
    close(s->fd);
    free(s->in.data);
    free(s->out.data);
    free(s);
}

static void out_lost(struct sv_context *ctx, struct sv_qp *qp, struct sv_sock *s);

static void sock_close(struct sv_context *ctx, struct sv_sock *s)
{
    if (s->closing)
        return;
    s->closing = true;
    if (s->kind == SV_SOCK_OUT && s->qp && s->qp->out == s)
        out_lost(ctx, s->qp, s);
}

static void on_readable(struct sv_context *ctx, struct sv_sock *s);

static void sock_flush(struct sv_context *ctx, struct sv_sock *s)
{
    struct sv_buf *b = &s->out;

    while (b->off < b->len) {
        ssize_t n = send(s->fd, b->data + b->off, b->len - b->off, MSG_NOSIGNAL | MSG_DONTWAIT);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            b->off = b->len = 0;
            /* The peer closed: what it answered before that (an ACK, the
             * NAK it closed for) is still in our receive buffer and
             * completes our requests first, as the wire would. */
            if (s->kind == SV_SOCK_OUT)
                on_readable(ctx, s);
            sock_close(ctx, s);
            return;
        }
        b->off += (size_t)n;
    }
    if (b->off == b->len)
        b->off = b->len = 0;
    if ((b->len != 0) != s->want_out && !s->closing) {
        struct epoll_event ev = {.events = EPOLLIN | (b->len ? EPOLLOUT : 0), .data.ptr = s};

        s->want_out = b->len != 0;
        epoll_ctl(ctx->epfd, EPOLL_CTL_MOD, s->fd, &ev);
    }
}

static int buf_put(struct sv_buf *b, const void *p, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        char *d;

        if (b->off) {
            memmove(b->data, b->data + b->off, b->len - b->off);
            b->len -= b->off;
            b->off = 0;
        }
        while (cap < b->len + n)
            cap *= 2;
        d = realloc(b->data, cap);
        if (!d)
            return -1;
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    return 0;
}

static void sock_send(struct sv_context *ctx, struct sv_sock *s, const void *p, size_t n)
{
    if (s->closing)
        return;
    if (buf_put(&s->out, p, n)) {
        sock_close(ctx, s); /* out of memory looks like a lost link */
        return;
    }
    sock_flush(ctx, s);
}

/* ---- completions and errors ---- */

static enum ibv_wc_opcode send_wc_opcode(enum ibv_wr_opcode op)
{
    switch (op) {
    case IBV_WR_RDMA_READ:
        return IBV_WC_RDMA_READ;
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
        return IBV_WC_SEND;
    default:
        return IBV_WC_RDMA_WRITE;
    }
}

void sv_push_send_wc(struct sv_context *ctx, struct sv_qp *qp, const struct sv_swqe *w,
                         enum ibv_wc_status st)
{
    struct ibv_wc wc = {
        .wr_id = w->wr_id,
        .status = st,
        .opcode = send_wc_opcode(w->opcode),
        .byte_len = w->opcode == IBV_WR_RDMA_READ ? w->len : 0,
        .qp_num = qp->ibv.qp_num,
    };

    sv_cq_push(ctx, (struct sv_cq *)qp->ibv.send_cq, &wc);
}

void sv_push_recv_wc(struct sv_context *ctx, struct sv_qp *qp, uint64_t wr_id,
                         enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len,
                         bool with_imm, uint32_t imm, uint32_t src_qp)
{
    struct ibv_wc wc = {
        .wr_id = wr_id,
        .status = st,
        .opcode = op,
        .byte_len = len,
        .qp_num = qp->ibv.qp_num,
        .src_qp = src_qp,
        .wc_flags = with_imm ? IBV_WC_WITH_IMM : 0,
        .imm_data = imm,
    };

    sv_cq_push(ctx, (struct sv_cq *)qp->ibv.recv_cq, &wc);
}

void sv_qp_close_conns(struct sv_context *ctx, struct sv_qp *qp)
{
    for (struct sv_sock *s = ctx->socks; s; s = s->next)
        if (s->qp == qp && s->kind != SV_SOCK_LISTEN)
            sock_close(ctx, s);
    qp->out = NULL;
}

/* Callers hold ctx->lock.  Flushes both queues: every outstanding WR
 * completes with IBV_WC_WR_FLUSH_ERR, signalled or not.  The QP's links
 * close, so a peer still sending to it sees a lost path. */
void sv_qp_set_err(struct sv_context *ctx, struct sv_qp *qp)
{
    if (qp->ibv.state == IBV_QPS_ERR)
        return;
    qp->ibv.state = IBV_QPS_ERR;
    qp->attr.qp_state = IBV_QPS_ERR;
    sv_qp_close_conns(ctx, qp);
    qp->conn = SV_CONN_LOST;
    while (qp->sq_head != qp->sq_tail) {
        struct sv_swqe *w = sq_at(qp, qp->sq_head++);

        sv_push_send_wc(ctx, qp, w, IBV_WC_WR_FLUSH_ERR);
    }
    qp->sq_send = qp->sq_head;
    while (qp->rq_head != qp->rq_tail) {
        struct sv_rwqe *r = rq_at(qp, qp->rq_head++);

        sv_push_recv_wc(ctx, qp, r->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, false, 0, 0);
    }
    sv_ring(ctx);
}

/* Completes the SQ head.  The fault counter sees every completion except
 * flushes. */
static void sq_complete(struct sv_context *ctx, struct sv_qp *qp, enum ibv_wc_status st)
{
    struct sv_swqe *w = sq_at(qp, qp->sq_head);

    ctx->send_cqes++;
    if (ctx->fault.fail_n && ctx->send_cqes == ctx->fault.fail_n)
        st = ctx->fault.fail_status;
    qp->sq_head++;
    if (SEQ_LT(qp->sq_send, qp->sq_head))
        qp->sq_send = qp->sq_head;
    if (st != IBV_WC_SUCCESS || w->signaled || qp->sig_all)
        sv_push_send_wc(ctx, qp, w, st);
    if (st != IBV_WC_SUCCESS)
        sv_qp_set_err(ctx, qp);
}

static void out_lost(struct sv_context *ctx, struct sv_qp *qp, struct sv_sock *s)
{
    (void)ctx;
    (void)s;
    qp->out = NULL;
    if (qp->conn == SV_CONN_UP)
        qp->conn = SV_CONN_LOST;
    if (!qp->lost_ns)
        qp->lost_ns = sv_now_ns();
    qp->sq_send = qp->sq_head;
}

/* ---- requester ---- */

static void qp_connect(struct sv_context *ctx, struct sv_qp *qp, uint64_t now)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct sv_hello h = {.magic = SV_MAGIC, .src_qpn = qp->ibv.qp_num,
                         .dest_qpn = qp->attr.dest_qp_num, .dlid = qp->attr.ah_attr.dlid};
    uint64_t tmo = sv_timeout_ns(qp);
    int fd;

    memcpy(h.dgid, qp->attr.ah_attr.grh.dgid.raw, 16);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/qp-%06x", ctx->dir, qp->attr.dest_qp_num);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
        qp->out = sv_sock_new(ctx, fd, SV_SOCK_OUT, qp);
        if (qp->out) {
            qp->conn = SV_CONN_UP;
            sock_send(ctx, qp->out, &h, sizeof(h));
            return;
        }
    }
    if (fd >= 0)
        close(fd);
    /* Nobody there (yet): a lost packet, retried once per timeout. */
    qp->conn = SV_CONN_RETRY;
    if (!qp->lost_ns)
        qp->lost_ns = now;
    qp->retry_at = now + (tmo ? tmo : 100000000ull);
}

static void send_request(struct sv_context *ctx, struct sv_qp *qp, struct sv_swqe *w)
{
    struct {
        struct sv_req r;
        struct sv_wire_sge sge[SV_MAX_SGE];
    } m = {.r = {.type = SV_MSG_REQ, .seq = w->seq, .opcode = w->opcode, .rkey = w->rkey,
                 .len = w->len, .imm = w->imm, .inl = w->inl, .raddr = w->raddr}};
    size_t n = sizeof(m.r);

    if (!w->inl) {
        m.r.nsge = (uint32_t)w->nsge;
        for (int i = 0; i < w->nsge; i++) {
            m.sge[i].addr = (uintptr_t)w->sge[i].iov_base;
            m.sge[i].len = w->sge[i].iov_len;
        }
        n += (size_t)w->nsge * sizeof(m.sge[0]);
    }
    sock_send(ctx, qp->out, &m, n);
    if (w->inl && qp->out)
        sock_send(ctx, qp->out, w->data, w->len);
}

static void next_at(uint64_t *next, uint64_t t)
{
    if (t < *next)
        *next = t;
}

/* Drives one QP's send queue: connect, transmit, fail on a lost path. */
static void qp_progress(struct sv_context *ctx, struct sv_qp *qp, uint64_t now, uint64_t *next)
{
    uint64_t tmo = sv_timeout_ns(qp), delay = ctx->fault.delay_us * 1000;
    struct sv_swqe *head;

    if (qp->zombie || qp->ibv.state != IBV_QPS_RTS || qp->sq_head == qp->sq_tail)
        return;
    head = sq_at(qp, qp->sq_head);
    if (head->preset != IBV_WC_SUCCESS && qp->sq_send == qp->sq_head) {
        sq_complete(ctx, qp, head->preset);
        return;
    }
    if (qp->conn == SV_CONN_NONE || (qp->conn == SV_CONN_RETRY && now >= qp->retry_at))
        qp_connect(ctx, qp, now);
    if (qp->conn == SV_CONN_RETRY)
        next_at(next, qp->retry_at);
    if (qp->conn == SV_CONN_UP && qp->out) {
        if (now < qp->resend_at) {
            next_at(next, qp->resend_at);
        } else {
            while (qp->sq_send != qp->sq_tail && qp->out) {
                struct sv_swqe *w = sq_at(qp, qp->sq_send);

                if (w->preset != IBV_WC_SUCCESS)
                    break;
                if (delay && now < w->post_ns + delay) {
                    next_at(next, w->post_ns + delay);
                    break;
                }
                qp->sq_send++;
                send_request(ctx, qp, w);
            }
        }
    }
    /* Retry exhaustion only counts while the path is broken: a peer that
     * is alive answers, however slowly (its HCA would). */
    if (tmo && qp->lost_ns && qp->sq_head != qp->sq_tail) {
        uint64_t start = qp->lost_ns > head->post_ns + delay ? qp->lost_ns : head->post_ns + delay;
        uint64_t deadline = start + tmo * (qp->attr.retry_cnt + 1u);

        if (now >= deadline)
            sq_complete(ctx, qp, IBV_WC_RETRY_EXC_ERR);
        else
            next_at(next, deadline);
    }
}

static void on_response(struct sv_context *ctx, struct sv_qp *qp, const struct sv_resp *r)
{
    uint64_t now = sv_now_ns(), tmo = sv_timeout_ns(qp);
    struct sv_swqe *w;

    if (qp->ibv.state != IBV_QPS_RTS || qp->sq_head == qp->sq_send)
        return;
    w = sq_at(qp, qp->sq_head);
    if (w->seq != r->seq)
        return;
    switch (r->status) {
    case SV_ACK:
        qp->lost_ns = 0;
        sq_complete(ctx, qp, IBV_WC_SUCCESS);
        break;
    case SV_NAK_RNR:
        qp->lost_ns = 0;
        if (w->rnr_left == 0) {
            sq_complete(ctx, qp, IBV_WC_RNR_RETRY_EXC_ERR);
            break;
        }
        if (w->rnr_left > 0)
            w->rnr_left--;
        qp->resend_at = now + sv_rnr_ns(r->arg);
        qp->sq_send = qp->sq_head;
        break;
    case SV_NAK_NOT_READY:
        if (!qp->lost_ns)
            qp->lost_ns = now;
        qp->resend_at = now + (tmo ? tmo : 100000000ull);
        qp->sq_send = qp->sq_head;
        break;
    case SV_NAK_ACCESS:
        sq_complete(ctx, qp, IBV_WC_REM_ACCESS_ERR);
        break;
    case SV_NAK_INV_REQ:
        sq_complete(ctx, qp, IBV_WC_REM_INV_REQ_ERR);
        break;
    default:
        sq_complete(ctx, qp, IBV_WC_REM_OP_ERR);
        break;
    }
}

/* ---- responder ---- */

static void respond(struct sv_context *ctx, struct sv_sock *s, uint32_t seq, enum sv_nak st,
                    uint32_t arg)
{
    struct sv_resp r = {.type = SV_MSG_RESP, .seq = seq, .status = st, .arg = arg};

    sock_send(ctx, s, &r, sizeof(r));
}

static bool path_ok(struct sv_context *ctx, struct sv_qp *qp, struct sv_sock *s)
{
    if (qp->attr.dest_qp_num != s->src_qpn)
        return false;
    if (ctx->link_ib)
        return s->dlid == ctx->lid;
    for (int i = 0; i < ctx->ngid; i++)
        if (!memcmp(ctx->gid[i].raw, s->dgid, 16))
            return true;
    return false;
}

static bool rkey_ok(struct sv_context *ctx, struct sv_qp *qp, const struct sv_req *r, int need)
{
    struct sv_mr *mr;
    uint64_t lo, hi;

    if (r->len == 0)
        return true; /* zero-length transfers touch no memory */
    mr = sv_mr_find(ctx, r->rkey, true);
    if (!mr || mr->ibv.pd != qp->ibv.pd || !(mr->access & need))
        return false;
    lo = (uintptr_t)mr->ibv.addr;
    hi = lo + mr->ibv.length;
    return r->raddr >= lo && r->raddr <= hi && r->len <= hi - r->raddr;
}

/* Moves len bytes between our local iovecs and the requester's. */
static int xfer(pid_t pid, bool to_peer, const struct iovec *l, int nl, const struct iovec *rv,
                int nr, const uint8_t *inl, uint32_t len)
{
    ssize_t n;

    if (len == 0)
        return 0;
    if (inl) {
        for (int i = 0; i < nl && len; i++) {
            size_t c = l[i].iov_len < len ? l[i].iov_len : len;

            memcpy(l[i].iov_base, inl, c);
            inl += c;
            len -= (uint32_t)c;
        }
        return 0;
    }
    n = to_peer ? process_vm_writev(pid, l, (unsigned long)nl, rv, (unsigned long)nr, 0)
                : process_vm_readv(pid, l, (unsigned long)nl, rv, (unsigned long)nr, 0);
    if (n == (ssize_t)len)
        return 0;
    return n < 0 ? errno : EFAULT;
}

static void resp_fatal(struct sv_context *ctx, struct sv_qp *qp, struct sv_sock *s, uint32_t seq,
                       enum sv_nak nak, enum ibv_event_type ev)
{
    respond(ctx, s, seq, nak, 0);
    if (ev)
        sv_async_event(ctx, ev, &qp->ibv);
    sv_qp_set_err(ctx, qp);
}

static void on_request(struct sv_context *ctx, struct sv_sock *s, const struct sv_req *r,
                       const struct sv_wire_sge *wsge, const uint8_t *inl)
{
    struct sv_qp *qp = s->qp;
    struct iovec rv[SV_MAX_SGE], lv[SV_MAX_SGE];
    struct iovec one = {(void *)(uintptr_t)r->raddr, r->len};
    struct sv_rwqe *rw;
    bool imm;
    int nl = 0, err;

    if (qp->zombie || qp->ibv.state == IBV_QPS_ERR || qp->ibv.state == IBV_QPS_SQE) {
        sock_close(ctx, s); /* dropped: the requester retries and gives up */
        return;
    }
    if (qp->ibv.state == IBV_QPS_RESET || qp->ibv.state == IBV_QPS_INIT) {
        if (r->seq == s->expect)
            respond(ctx, s, r->seq, SV_NAK_NOT_READY, 0);
        return;
    }
    if (!path_ok(ctx, qp, s)) {
        sock_close(ctx, s);
        return;
    }
    if (r->seq != s->expect)
        return; /* go-back-N: after a NAK the requester resends from it */
    for (uint32_t i = 0; i < r->nsge; i++) {
        rv[i].iov_base = (void *)(uintptr_t)wsge[i].addr;
        rv[i].iov_len = wsge[i].len;
    }
    switch (r->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
        imm = r->opcode == IBV_WR_RDMA_WRITE_WITH_IMM;
        if (!rkey_ok(ctx, qp, r, IBV_ACCESS_REMOTE_WRITE)) {
            resp_fatal(ctx, qp, s, r->seq, SV_NAK_ACCESS, IBV_EVENT_QP_ACCESS_ERR);
            return;
        }
        if (imm && qp->rq_head == qp->rq_tail) {
            respond(ctx, s, r->seq, SV_NAK_RNR, qp->attr.min_rnr_timer);
            return;
        }
        err = xfer(s->peer_pid, false, &one, 1, rv, (int)r->nsge, r->inl ? inl : NULL, r->len);
        if (err)
            break;
        if (imm) {
            rw = rq_at(qp, qp->rq_head++);
            sv_push_recv_wc(ctx, qp, rw->wr_id, IBV_WC_SUCCESS, IBV_WC_RECV_RDMA_WITH_IMM, r->len,
                         true, r->imm, s->src_qpn);
        }
        s->expect++;
        respond(ctx, s, r->seq, SV_ACK, 0);
        return;
    case IBV_WR_SEND:
    case IBV_WR_SEND_WITH_IMM:
        if (qp->rq_head == qp->rq_tail) {
            respond(ctx, s, r->seq, SV_NAK_RNR, qp->attr.min_rnr_timer);
            return;
        }
        rw = rq_at(qp, qp->rq_head);
        if (rw->bad_lkey || r->len > rw->len) {
            qp->rq_head++;
            sv_push_recv_wc(ctx, qp, rw->wr_id, rw->bad_lkey ? IBV_WC_LOC_PROT_ERR : IBV_WC_LOC_LEN_ERR,
                         IBV_WC_RECV, r->len, false, 0, s->src_qpn);
            resp_fatal(ctx, qp, s, r->seq, rw->bad_lkey ? SV_NAK_REM_OP : SV_NAK_INV_REQ, 0);
            return;
        }
        for (uint32_t left = r->len; nl < rw->nsge && left; nl++) {
            lv[nl] = rw->sge[nl];
            if (lv[nl].iov_len > left)
                lv[nl].iov_len = left;
            left -= (uint32_t)lv[nl].iov_len;
        }
        err = xfer(s->peer_pid, false, lv, nl, rv, (int)r->nsge, r->inl ? inl : NULL, r->len);
        if (err)
            break;
        qp->rq_head++;
        sv_push_recv_wc(ctx, qp, rw->wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, r->len,
                     r->opcode == IBV_WR_SEND_WITH_IMM, r->imm, s->src_qpn);
        s->expect++;
        respond(ctx, s, r->seq, SV_ACK, 0);
        return;
    case IBV_WR_RDMA_READ:
        if (r->inl || !rkey_ok(ctx, qp, r, IBV_ACCESS_REMOTE_READ)) {
            resp_fatal(ctx, qp, s, r->seq, SV_NAK_ACCESS, IBV_EVENT_QP_ACCESS_ERR);
            return;
        }
        err = xfer(s->peer_pid, true, &one, 1, rv, (int)r->nsge, NULL, r->len);
        if (err)
            break;
        s->expect++;
        respond(ctx, s, r->seq, SV_ACK, 0);
        return;
    default:
        resp_fatal(ctx, qp, s, r->seq, SV_NAK_INV_REQ, IBV_EVENT_QP_REQ_ERR);
        return;
    }
    if (err == ESRCH) {
        sock_close(ctx, s); /* the requester died */
        return;
    }
    resp_fatal(ctx, qp, s, r->seq, SV_NAK_REM_OP, IBV_EVENT_QP_FATAL);
}

/* ---- the service thread ---- */

static void on_accept(struct sv_context *ctx, struct sv_sock *l)
{
    for (;;) {
        struct ucred cred;
        socklen_t len = sizeof(cred);
        struct sv_sock *s;
        int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd < 0)
            return;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) ||
            !(s = sv_sock_new(ctx, fd, SV_SOCK_IN, l->qp))) {
            close(fd);
            continue;
        }
        s->peer_pid = cred.pid; /* in our pid namespace */
    }
}

/* Parses whole messages out of s->in. */
static void on_input(struct sv_context *ctx, struct sv_sock *s)
{
    struct sv_buf *b = &s->in;

    while (!s->closing) {
        char *p = b->data + b->off;
        size_t have = b->len - b->off;

        if (s->kind == SV_SOCK_IN && !s->hello) {
            struct sv_hello h;

            if (have < sizeof(h))
                break;
            memcpy(&h, p, sizeof(h));
            b->off += sizeof(h);
            if (h.magic != SV_MAGIC || h.dest_qpn != s->qp->ibv.qp_num) {
                sock_close(ctx, s);
                break;
            }
            s->hello = true;
            s->src_qpn = h.src_qpn;
            s->dlid = h.dlid;
            memcpy(s->dgid, h.dgid, 16);
        } else if (s->kind == SV_SOCK_IN) {
            struct sv_req r;
            size_t need;

            if (have < sizeof(r))
                break;
            memcpy(&r, p, sizeof(r));
            if (r.type != SV_MSG_REQ || r.nsge > SV_MAX_SGE || (r.inl && r.len > SV_MAX_INLINE)) {
                sock_close(ctx, s);
                break;
            }
            need = sizeof(r) + (r.inl ? r.len : r.nsge * sizeof(struct sv_wire_sge));
            if (have < need)
                break;
            b->off += need;
            {
                struct sv_wire_sge sge[SV_MAX_SGE];

                if (!r.inl)
                    memcpy(sge, p + sizeof(r), r.nsge * sizeof(sge[0]));
                on_request(ctx, s, &r, sge, (const uint8_t *)p + sizeof(r));
            }
        } else {
            struct sv_resp r;

            if (have < sizeof(r))
                break;
            memcpy(&r, p, sizeof(r));
            b->off += sizeof(r);
            if (s->qp->out == s)
                on_response(ctx, s->qp, &r);
        }
    }
    if (b->off == b->len)
        b->off = b->len = 0;
}

static void on_readable(struct sv_context *ctx, struct sv_sock *s)
{
    char tmp[65536];

    for (;;) {
        ssize_t n = recv(s->fd, tmp, sizeof(tmp), MSG_DONTWAIT);

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0 || buf_put(&s->in, tmp, (size_t)n)) {
            on_input(ctx, s);
            sock_close(ctx, s);
            return;
        }
        if (s->in.len - s->in.off >= sizeof(tmp))
            on_input(ctx, s);
    }
    on_input(ctx, s);
}

/* Frees what app threads and handlers closed; runs only between epoll
 * batches, so no fetched event can point at freed memory. */
static void reap(struct sv_context *ctx)
{
    struct sv_sock **ps;
    struct sv_qp **pq;
    bool freed = false;

    for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next)
        if (qp->zombie) {
            sv_qp_close_conns(ctx, qp);
            if (qp->listen)
                qp->listen->closing = true;
        }
    for (ps = &ctx->socks; *ps;) {
        struct sv_sock *s = *ps;

        if (!s->closing) {
            ps = &s->next;
            continue;
        }
        if (s->out.len > s->out.off && send(s->fd, s->out.data + s->out.off,
                                            s->out.len - s->out.off, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
            /* best effort: a final NAK the peer may never read */
        }
        *ps = s->next;
        sv_sock_free(s);
    }
    for (pq = &ctx->qps; *pq;) {
        struct sv_qp *qp = *pq;

        if (!qp->zombie) {
            pq = &qp->next;
            continue;
        }
        *pq = qp->next;
        qp->freed = true;
        freed = true;
    }
    if (freed)
        pthread_cond_broadcast(&ctx->cond);
}

void *sv_service(void *arg)
{
    struct sv_context *ctx = arg;
    struct epoll_event evs[64];

    pthread_mutex_lock(&ctx->lock);
    while (!ctx->stop) {
        uint64_t now = sv_now_ns(), next = UINT64_MAX;
        int n, timeout = -1;

        reap(ctx);
        if (ctx->fault.port_down_ms && ctx->port_state == IBV_PORT_ACTIVE) {
            uint64_t at = ctx->open_ns + ctx->fault.port_down_ms * 1000000ull;

            if (now >= at) {
                ctx->port_state = IBV_PORT_DOWN;
                sv_async_event(ctx, IBV_EVENT_PORT_ERR, NULL);
                for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next)
                    sv_qp_set_err(ctx, qp);
                continue;
            }
            next_at(&next, at);
        }
        for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next)
            qp_progress(ctx, qp, now, &next);
        if (next != UINT64_MAX) {
            now = sv_now_ns();
            timeout = next <= now ? 0 : (int)((next - now + 999999) / 1000000);
        }
        pthread_mutex_unlock(&ctx->lock);
        n = epoll_wait(ctx->epfd, evs, 64, timeout);
        pthread_mutex_lock(&ctx->lock);
        for (int i = 0; i < n; i++) {
            struct sv_sock *s = evs[i].data.ptr;
            uint64_t cnt;

            if (!s) {
                if (read(ctx->doorbell, &cnt, sizeof(cnt)) < 0) {
                    /* already drained */
                }
                continue;
            }
            if (s->closing)
                continue;
            if (s->kind == SV_SOCK_LISTEN) {
                on_accept(ctx, s);
                continue;
            }
            if (evs[i].events & EPOLLOUT)
                sock_flush(ctx, s);
            if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                on_readable(ctx, s);
        }
    }
    pthread_mutex_unlock(&ctx->lock);
    return NULL;
}

