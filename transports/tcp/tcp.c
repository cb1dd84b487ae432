/*
 * tcp.c - the tcp transport.  Per peer and direction, nstreams non-blocking
 * sockets carry framed messages (a 24-byte header, then the payload straight
 * into the user's buffer).  Outgoing sockets open lazily and authenticate
 * without blocking; one progress loop does I/O only where requests wait.
 * This file is the data path; connection setup is in tcp_setup.c.
 */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/sock.h"
#include "transports/transport.h"
#include "transports/tcp/tcp.h"

/* ---- small helpers ------------------------------------------------------ */

static const char *dir_name(const struct tcp_stream *st)
{
    return st->is_send ? "send" : "recv";
}

/* The oldest request of st, or NULL. */
static struct tcp_req *stream_head(const struct tcp_stream *st)
{
    return (struct tcp_req *)st->q.head;
}

/* Keeps `active` and `waits_fd` true to the invariants of tcp_stream. */
void tcp_stream_sync(struct tcp_stream *st)
{
    struct tcp_ctx *ctx = st->conn->ctx;
    bool want = false, waits = false;
    switch (st->state) {
    case ST_CONNECTING:
    case ST_HANDSHAKE: want = true; break;
    case ST_READY: want = st->q.head != NULL; break;
    case ST_IDLE: waits = !st->is_send && st->q.head != NULL; break;
    default: break;
    }
    if (want && !st->active) {
        LIST_INSERT_HEAD(&ctx->work, st, work);
        ctx->nactive++;
    } else if (!want && st->active) {
        LIST_REMOVE(st, work);
        ctx->nactive--;
    }
    st->active = want;
    if (waits != st->waits_fd) {
        if (waits)
            ctx->nwait_fd++;
        else
            ctx->nwait_fd--;
        st->waits_fd = waits;
    }
}

/* What failing means here: close every socket of c (so the peer learns
 * of it too) and fail every queued request. */
static void conn_close(struct weft_conn *base, weft_status_t status)
{
    struct tcp_conn *c = (struct tcp_conn *)base;
    for (int i = 0; i < 2 * c->ctx->nstreams; i++) {
        struct tcp_stream *st = &c->streams[i];
        if (st->fd >= 0)
            close(st->fd);
        st->fd = -1;
        st->state = ST_FAILED;
        st->rhave = 0;
        weft_req_queue_fail(&st->q, status);
        tcp_stream_sync(st);
    }
}

/* The failure of a socket call on st, errno in err (0: the peer closed). */
static void stream_fail_io(struct tcp_stream *st, int err)
{
    struct tcp_conn *c = st->conn;
    tcp_conn_fail(c, WEFT_ERR_REMOTE,
                  "rank %d: connection to rank %d (%s) failed on %s stream %d: %s",
                  c->ctx->rank, c->peer, c->addrstr, dir_name(st), st->index,
                  err == 0 ? "the peer closed the connection" : strerror(err));
}

void tcp_conn_fail(struct tcp_conn *c, weft_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    weft_conn_vfail(&c->base, conn_close, status, fmt, ap);
    va_end(ap);
}

struct tcp_conn *tcp_conn_get(struct tcp_ctx *ctx, int peer)
{
    if (ctx->conns[peer])
        return ctx->conns[peer];
    int n = ctx->nstreams;
    struct tcp_conn *c = calloc(1, sizeof(*c) + 2 * (size_t)n * sizeof(struct tcp_stream));
    if (c == NULL)
        return NULL;
    c->base.reqs = &ctx->reqs;
    c->ctx = ctx;
    c->peer = peer;
    snprintf(c->addrstr, sizeof(c->addrstr), "address unknown");
    c->send = &c->streams[0];
    c->recv = &c->streams[n];
    for (int i = 0; i < 2 * n; i++) {
        struct tcp_stream *st = &c->streams[i];
        st->conn = c;
        st->fd = -1;
        st->index = i % n;
        st->is_send = i < n;
        st->state = ST_IDLE;
    }
    ctx->conns[peer] = c;
    return c;
}

/* ---- data movement ------------------------------------------------------- */

/* Writes queued messages, several per sendmsg; returns true if bytes moved. */
static bool stream_send(struct tcp_stream *st)
{
    bool moved = false;
    while (st->q.head) {
        struct iovec iov[TCP_IOV_MAX];
        int niov = 0;
        size_t want = 0;
        for (struct tcp_req *r = stream_head(st); r && niov + 2 <= TCP_IOV_MAX;
             r = (struct tcp_req *)r->base.next) {
            size_t d = r->done;
            if (d < TCP_HDR_LEN) {
                iov[niov++] = (struct iovec){r->hdr + d, TCP_HDR_LEN - d};
                want += TCP_HDR_LEN - d;
                d = TCP_HDR_LEN;
            }
            size_t off = d - TCP_HDR_LEN;
            if (off < r->base.len) {
                iov[niov++] = (struct iovec){r->base.buf + off, r->base.len - off};
                want += r->base.len - off;
            }
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(st->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            /* Full: poll waits for room.  The stream may have been idle
             * (a new send on a full socket), so it must join the work
             * list below; returning here left such a send unsent. */
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            stream_fail_io(st, errno);
            return true;
        }
        moved = true;
        size_t left = (size_t)n;
        struct tcp_req *r;
        while ((r = stream_head(st)) != NULL) {
            size_t total = TCP_HDR_LEN + r->base.len;
            size_t take = WEFT_MIN(left, total - r->done);
            r->done += take;
            left -= take;
            if (r->done < total)
                break;
            weft_req_complete(&st->q, WEFT_OK);
        }
        /* A short write means the socket buffer is full: another call
         * would only return EAGAIN. */
        if ((size_t)n < want)
            break;
    }
    tcp_stream_sync(st);
    return moved;
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return le64toh(v);
}

static uint32_t get_le32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return le32toh(v);
}

weft_status_t tcp_frame_parse(const struct tcp_stream *st, const uint8_t *hdr, uint64_t seq,
                              size_t posted, size_t *len, char *why, size_t whylen)
{
    const struct tcp_conn *c = st->conn;
    uint32_t magic = get_le32(hdr), reserved = get_le32(hdr + 4);
    uint64_t hseq = get_le64(hdr + 8), hlen = get_le64(hdr + 16);
    if (magic != TCP_MAGIC || reserved != 0 || hseq != seq) {
        snprintf(why, whylen,
                 "rank %d: bad frame from rank %d on stream %d (seq %llu, expected %llu; "
                 "magic 0x%08x, reserved %u) from %s",
                 c->ctx->rank, c->peer, st->index, (unsigned long long)hseq,
                 (unsigned long long)seq, magic, reserved, c->addrstr);
        return WEFT_ERR_REMOTE;
    }
    if (hlen > posted) {
        snprintf(why, whylen,
                 "rank %d: rank %d sent %llu bytes but the receive posted holds %zu "
                 "(stream %d, message %llu)",
                 c->ctx->rank, c->peer, (unsigned long long)hlen, posted, st->index,
                 (unsigned long long)seq);
        return WEFT_ERR_REMOTE;
    }
    *len = (size_t)hlen;
    return WEFT_OK;
}

/* Checks the header in st->rhdr against the receive r, before a byte of
 * payload lands anywhere.  False: conn has been failed. */
static bool frame_check(struct tcp_stream *st, struct tcp_req *r)
{
    char why[TCP_ERRMSG_LEN];
    size_t len;
    if (tcp_frame_parse(st, st->rhdr, r->seq, r->base.len, &len, why, sizeof(why)) != WEFT_OK) {
        tcp_conn_fail(st->conn, WEFT_ERR_REMOTE, "%s", why);
        return false;
    }
    r->base.bytes = len;
    r->hdr_ok = true;
    st->rhave = 0;
    return true;
}

/* One read of st's socket into iov (niov pieces): the bytes read; 0 when
 * nothing is there yet; -1 when the connection failed (and has been
 * failed: the peer closed it, or the socket broke).  Inline: receives
 * spin on it while they wait. */
static inline ssize_t stream_read(struct tcp_stream *st, struct iovec *iov, size_t niov)
{
    for (;;) {
        ssize_t n;
        if (niov == 1) { /* recv costs less than recvmsg */
            n = recv(st->fd, iov->iov_base, iov->iov_len, MSG_DONTWAIT);
        } else {
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = niov};
            n = recvmsg(st->fd, &mh, MSG_DONTWAIT);
        }
        if (n > 0)
            return n;
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        stream_fail_io(st, n == 0 ? 0 : errno);
        return -1;
    }
}

/* Reads into posted receives.  The payload goes straight to the user's
 * buffer; the next frame's header rides along in the same recvmsg so that
 * a stream of messages costs one syscall each.  Returns true if it moved. */
static bool stream_recv(struct tcp_stream *st)
{
    bool moved = false;
    struct tcp_req *r;
    while ((r = stream_head(st)) != NULL) {
        if (!r->hdr_ok) {
            if (st->rhave < TCP_HDR_LEN) {
                struct iovec iov = {st->rhdr + st->rhave, TCP_HDR_LEN - st->rhave};
                ssize_t n = stream_read(st, &iov, 1);
                if (n < 0)
                    return true;
                if (n == 0)
                    break;
                moved = true;
                st->rhave += (size_t)n;
                if (st->rhave < TCP_HDR_LEN)
                    break;
            }
            if (!frame_check(st, r))
                return true;
        }
        if (r->done < r->base.bytes) {
            size_t need = r->base.bytes - r->done;
            struct iovec iov[2] = {{r->base.buf + r->done, need}, {st->rhdr, TCP_HDR_LEN}};
            ssize_t n = stream_read(st, iov, 2);
            if (n < 0)
                return true;
            if (n == 0)
                break;
            moved = true;
            size_t pay = WEFT_MIN((size_t)n, need);
            r->done += pay;
            st->rhave = (size_t)n - pay;
            if (r->done < r->base.bytes)
                break; /* short read: the kernel has nothing more now */
            weft_req_complete(&st->q, WEFT_OK);
            if ((size_t)n < need + TCP_HDR_LEN)
                break;
            continue;
        }
        weft_req_complete(&st->q, WEFT_OK);
        moved = true;
    }
    tcp_stream_sync(st);
    return moved;
}

static bool stream_progress(struct tcp_stream *st)
{
    switch (st->state) {
    case ST_CONNECTING:
    case ST_HANDSHAKE: {
        bool moved = tcp_stream_setup(st);
        if (st->state == ST_READY && st->q.head)
            stream_send(st);
        return moved;
    }
    case ST_READY: return st->is_send ? stream_send(st) : stream_recv(st);
    default: return false;
    }
}

static short stream_events(const struct tcp_stream *st)
{
    switch (st->state) {
    case ST_CONNECTING: return POLLOUT;
    case ST_HANDSHAKE: return weft_auth_connect_events(&st->auth);
    case ST_READY: return st->is_send ? POLLOUT : POLLIN;
    default: return 0;
    }
}

/* ---- the vtable: posting, testing, progress ------------------------------ */

static weft_status_t tcp_post(const char *what, struct tcp_conn *c, bool is_send, void *buf,
                              size_t bytes, void **vreq)
{
    weft_status_t rc = weft_req_post(what, c, sizeof(struct tcp_req), buf, bytes, vreq);
    if (rc != WEFT_INPROGRESS)
        return rc;
    struct tcp_req *r = *vreq;
    r->seq = is_send ? c->nsend++ : c->nrecv++;
    struct tcp_stream *st = (is_send ? c->send : c->recv) + r->seq % (uint64_t)c->ctx->nstreams;
    bool idle = st->q.head == NULL;
    weft_req_enqueue(&st->q, &r->base);
    if (is_send) {
        uint32_t magic = htole32(TCP_MAGIC), zero = 0;
        uint64_t seq = htole64(r->seq), len = htole64((uint64_t)bytes);
        memcpy(r->hdr, &magic, 4);
        memcpy(r->hdr + 4, &zero, 4);
        memcpy(r->hdr + 8, &seq, 8);
        memcpy(r->hdr + 16, &len, 8);
        if (st->state == ST_IDLE) {
            tcp_conn_open(c);
        } else if (st->state == ST_READY && idle) {
            stream_send(st); /* small messages leave without a progress round */
            return WEFT_OK;
        }
    } else if (st->state == ST_READY && idle && st->rhave > 0) {
        stream_recv(st); /* the header is here already: data is waiting */
        return WEFT_OK;
    }
    tcp_stream_sync(st);
    return WEFT_OK;
}

static weft_status_t tcp_isend(void *conn, const void *buf, size_t bytes, void **req)
{
    return tcp_post("tcp isend", conn, true, (void *)(uintptr_t)buf, bytes, req);
}

static weft_status_t tcp_irecv(void *conn, void *buf, size_t bytes, void **req)
{
    return tcp_post("tcp irecv", conn, false, buf, bytes, req);
}

static weft_status_t tcp_test(void *req, int *done, size_t *bytes)
{
    return weft_req_test("tcp", req, done, bytes, weft_req_put);
}

/* Makes room in the poll arrays for n entries (grows during warm-up only). */
static weft_status_t ctx_poll_room(struct tcp_ctx *ctx, size_t n)
{
    if (n <= ctx->pcap)
        return WEFT_OK;
    size_t cap = WEFT_MAX(n, 2 * ctx->pcap);
    struct pollfd *pfd = realloc(ctx->pfd, cap * sizeof(*pfd));
    if (pfd)
        ctx->pfd = pfd;
    struct tcp_stream **pst = realloc(ctx->pst, cap * sizeof(*pst));
    if (pst)
        ctx->pst = pst;
    if (!pfd || !pst)
        return weft_error(ctx->err, WEFT_ERR_NO_MEMORY, "rank %d: no memory for %zu poll entries",
                          ctx->rank, n);
    ctx->pcap = cap;
    return WEFT_OK;
}

static weft_status_t tcp_progress(void *vctx, int timeout_ms)
{
    struct tcp_ctx *ctx = vctx;
    WEFT_CHECK(ctx_poll_room(ctx, ctx->nactive));
    /* Snapshot first: I/O may fail a conn and unlink several streams. */
    size_t ns = 0;
    for (struct tcp_stream *st = LIST_FIRST(&ctx->work); st; st = LIST_NEXT(st, work))
        ctx->pst[ns++] = st;
    bool moved = false;
    for (size_t i = 0; i < ns; i++)
        if (ctx->pst[i]->active)
            moved |= stream_progress(ctx->pst[i]);
    /* The listener and the handshakes are served every pass while a
     * receive waits for its socket, otherwise every 16th pass and whenever
     * the poll below says so (or a handshake's deadline passed).  One poll
     * of theirs finds the few with news. */
    if (ctx->nwait_fd > 0 || (++ctx->tick & 15) == 0)
        moved |= tcp_ctx_service(ctx, NULL);
    if (moved || timeout_ms <= 0)
        return WEFT_OK;

    /* Streams, then the door and the listener, then the eventfd. */
    WEFT_CHECK(ctx_poll_room(ctx, ctx->nactive + (size_t)ctx->door.n + 2));
    size_t n = 0;
    uint64_t now = weft_now_ns();
    for (struct tcp_stream *st = LIST_FIRST(&ctx->work); st; st = LIST_NEXT(st, work)) {
        /* A connect without an answer is started afresh in its window. */
        int retry = tcp_stream_retry_ms(st, now);
        if (retry >= 0 && retry < timeout_ms)
            timeout_ms = WEFT_MAX(retry, 1);
        ctx->pfd[n] = (struct pollfd){.fd = st->fd, .events = stream_events(st)};
        ctx->pst[n++] = st;
    }
    size_t ndoor = (size_t)weft_admit_fill(&ctx->door, ctx->lfd, ctx->pfd + n);
    ctx->pfd[n + ndoor] = (struct pollfd){.fd = ctx->efd, .events = POLLIN};

    int rc = poll(ctx->pfd, (nfds_t)(n + ndoor + 1), timeout_ms);
    if (rc < 0) {
        if (errno == EINTR)
            return WEFT_OK;
        return weft_error(ctx->err, WEFT_ERR_SYSTEM, "rank %d: tcp poll on %zu sockets: %s",
                          ctx->rank, n + ndoor + 1, strerror(errno));
    }
    for (size_t i = 0; i < n; i++) {
        struct tcp_stream *st = ctx->pst[i];
        if (ctx->pfd[i].revents != 0 && st->active && st->fd == ctx->pfd[i].fd)
            stream_progress(st);
    }
    if (ctx->pfd[n + ndoor].revents != 0) {
        uint64_t v;
        while (read(ctx->efd, &v, sizeof(v)) < 0 && errno == EINTR)
            ;
    }
    /* The streams above never touch the door: its entries still match. */
    tcp_ctx_service(ctx, ctx->pfd + n);
    return WEFT_OK;
}

static void tcp_abort(void *vctx, weft_status_t status, const char *why)
{
    struct tcp_ctx *ctx = vctx;
    for (int i = 0; i < ctx->nranks; i++)
        if (ctx->conns[i])
            weft_conn_abort(&ctx->conns[i]->base, conn_close, status, why);
}

static void tcp_wakeup(void *vctx)
{
    struct tcp_ctx *ctx = vctx;
    uint64_t one = 1;
    /* EAGAIN means the counter is saturated: a wakeup is pending anyway. */
    while (write(ctx->efd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

const struct weft_transport_ops weft_tcp_ops = WEFT_TRANSPORT_OPS("tcp", tcp);