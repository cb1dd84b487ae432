/*
 * tcp.c - the tcp transport.  Per peer and direction, nstreams non-blocking
 * sockets carry framed messages (a 24-byte header, then the payload straight
 * into the user's buffer).  Outgoing sockets open lazily and authenticate
 * without blocking; one progress loop does I/O only where requests wait.
 */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "src/auth.h"
#include "src/comm.h"
#include "src/sock.h"
#include "transports/transport.h"

#define TCP_HDR_LEN 24                 /* u32 magic, u32 reserved, u64 seq, u64 len */
#define TCP_MAGIC 0x31444657u          /* "WFD1" on the wire */
#define TCP_MAX_STREAMS 16
#define TCP_MAX_PENDING 64             /* accepted sockets still in their handshake */
#define TCP_ACCEPT_TIMEOUT_NS (10ull * 1000000000ull)
#define TCP_IOV_MAX 64                 /* iovecs per sendmsg: 32 queued messages */
#define TCP_REQ_SLAB 64
#define TCP_ERRMSG_LEN 384
#define TCP_ADDRSTR_LEN 64

_Static_assert(sizeof(union weft_sockaddr) <= WEFT_TRANSPORT_ADDR_MAX,
               "a published tcp address must fit WEFT_TRANSPORT_ADDR_MAX");

/* Send streams go IDLE -> CONNECTING -> HANDSHAKE -> READY; receive streams
 * go IDLE -> READY when an authenticated socket is installed.  FAILED is
 * final for both. */
enum { ST_IDLE, ST_CONNECTING, ST_HANDSHAKE, ST_READY, ST_FAILED };

struct tcp_ctx;
struct tcp_conn;

/*
 * One isend or irecv.  Owner: the transport (recycled through ctx's free
 * list); the caller borrows the handle until test() reports it done or
 * failed.  While status is WEFT_INPROGRESS it sits in its stream's FIFO.
 */
struct tcp_req {
    struct tcp_req *next;      /* FIFO or free list */
    struct tcp_conn *conn;
    char *buf;
    size_t len;                /* bytes posted */
    size_t msglen;             /* bytes of the message (recv: from its header) */
    size_t done;               /* send: header + payload bytes written; recv: payload bytes */
    uint64_t seq;              /* message number in this direction of conn */
    weft_status_t status;      /* INPROGRESS, OK or the failure */
    bool hdr_ok;               /* recv: header read and validated */
    uint8_t hdr[TCP_HDR_LEN];  /* send: the frame header */
};

/*
 * One socket of one direction.  Invariants: fd >= 0 exactly in states
 * CONNECTING, HANDSHAKE and READY; `active` <=> linked into ctx's work list
 * <=> the stream has something to do (setup, or READY with requests);
 * `waits_fd` <=> a receive stream with requests but no socket yet.
 */
struct tcp_stream {
    struct tcp_conn *conn;
    int fd;
    int index;
    uint8_t state;
    bool is_send, active, waits_fd, installed;
    struct tcp_stream *prev, *next;          /* ctx work list */
    struct tcp_req *head, *tail;             /* FIFO, oldest first */
    size_t rhave;                            /* recv: bytes of rhdr read ahead */
    uint8_t rhdr[TCP_HDR_LEN];
    struct weft_auth_connector auth;         /* send: during HANDSHAKE */
};

/*
 * Everything toward one peer.  Owner: ctx (conns[peer]), freed at finalize.
 * Created by connect() or by the first accepted stream of that peer.
 * err is OK until the first failure, then sticky: every stream is FAILED.
 */
struct tcp_conn {
    struct tcp_ctx *ctx;
    int peer;
    bool have_addr;
    union weft_sockaddr addr;              /* peer's published address */
    char addrstr[TCP_ADDRSTR_LEN];
    uint64_t nsend, nrecv;                 /* messages posted per direction */
    uint64_t deadline;                     /* outgoing setup must finish by then (0: none) */
    weft_status_t err;
    char errmsg[TCP_ERRMSG_LEN];
    struct tcp_stream *send, *recv;        /* nstreams each, inside streams[] */
    struct tcp_stream streams[];
};

/* An accepted socket that has not proven itself yet. */
struct tcp_pending {
    bool used;
    uint64_t serial;                       /* acceptance order: lowest is oldest */
    struct weft_auth_acceptor acc;
    char from[TCP_ADDRSTR_LEN];
};

struct tcp_slab {
    struct tcp_slab *next;
    struct tcp_req reqs[TCP_REQ_SLAB];
};

/*
 * One rank's transport.  Owner: the engine, through init/finalize.  Used by
 * one thread at a time, except efd (written by wakeup from any thread).
 * The poll arrays hold room for every active stream plus the pending
 * handshakes, the listener and the eventfd.
 */
struct tcp_ctx {
    struct weft_comm *comm;
    int rank, nranks, nstreams, bufsize;
    uint64_t job, timeout_ns;
    uint8_t secret[WEFT_SECRET_BYTES];
    int lfd, efd;
    union weft_sockaddr laddr;
    struct tcp_conn **conns;               /* (nranks), NULL until needed */
    struct tcp_stream *work;               /* active streams */
    size_t nactive, nwait_fd;
    unsigned tick;
    struct tcp_pending pending[TCP_MAX_PENDING];
    uint64_t pending_serial;
    int npending;                          /* used entries of pending[] */
    struct pollfd *pfd;                    /* (pcap) */
    struct tcp_stream **pst;               /* (pcap) stream of pfd[i], NULL for others */
    int *pkind;                            /* (pcap) -1 stream, -2 listener, -3 efd, else pending */
    size_t pcap;
    struct tcp_req *free_reqs;
    struct tcp_slab *slabs;
};

/* ---- small helpers ------------------------------------------------------ */

static const char *dir_name(const struct tcp_stream *st)
{
    return st->is_send ? "send" : "recv";
}

static struct tcp_req *req_get(struct tcp_ctx *ctx)
{
    if (ctx->free_reqs == NULL) {
        struct tcp_slab *s = calloc(1, sizeof(*s));
        if (s == NULL)
            return NULL;
        s->next = ctx->slabs;
        ctx->slabs = s;
        for (int i = TCP_REQ_SLAB - 1; i >= 0; i--) {
            s->reqs[i].next = ctx->free_reqs;
            ctx->free_reqs = &s->reqs[i];
        }
    }
    struct tcp_req *r = ctx->free_reqs;
    ctx->free_reqs = r->next;
    r->next = NULL;
    r->done = 0;
    r->hdr_ok = false;
    r->status = WEFT_INPROGRESS;
    return r;
}

static void req_put(struct tcp_ctx *ctx, struct tcp_req *r)
{
    r->next = ctx->free_reqs;
    ctx->free_reqs = r;
}

/* Keeps `active` and `waits_fd` true to the invariants of tcp_stream. */
static void stream_sync(struct tcp_stream *st)
{
    struct tcp_ctx *ctx = st->conn->ctx;
    bool want = false, waits = false;
    switch (st->state) {
    case ST_CONNECTING:
    case ST_HANDSHAKE: want = true; break;
    case ST_READY: want = st->head != NULL; break;
    case ST_IDLE: waits = !st->is_send && st->head != NULL; break;
    default: break;
    }
    if (want && !st->active) {
        st->prev = NULL;
        st->next = ctx->work;
        if (ctx->work)
            ctx->work->prev = st;
        ctx->work = st;
        ctx->nactive++;
    } else if (!want && st->active) {
        if (st->prev)
            st->prev->next = st->next;
        else
            ctx->work = st->next;
        if (st->next)
            st->next->prev = st->prev;
        st->prev = st->next = NULL;
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

static void stream_enqueue(struct tcp_stream *st, struct tcp_req *r)
{
    r->next = NULL;
    if (st->tail)
        st->tail->next = r;
    else
        st->head = r;
    st->tail = r;
}

/* Pops the oldest request of st and gives it its final status. */
static void stream_complete(struct tcp_stream *st, weft_status_t status)
{
    struct tcp_req *r = st->head;
    st->head = r->next;
    if (st->head == NULL)
        st->tail = NULL;
    r->next = NULL;
    r->status = status;
}

/* Fails conn for good: records why, closes every socket toward the peer
 * (so the peer learns of it too) and fails every queued request. */
static void conn_fail(struct tcp_conn *c, weft_status_t status, const char *fmt, ...)
    WEFT_PRINTF(3, 4);
static void conn_fail(struct tcp_conn *c, weft_status_t status, const char *fmt, ...)
{
    if (c->err != WEFT_OK)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
    va_end(ap);
    c->err = status;
    weft_error(c->ctx->comm, status, "%s", c->errmsg);
    for (int i = 0; i < 2 * c->ctx->nstreams; i++) {
        struct tcp_stream *st = &c->streams[i];
        if (st->fd >= 0)
            close(st->fd);
        st->fd = -1;
        st->state = ST_FAILED;
        st->rhave = 0;
        while (st->head)
            stream_complete(st, status);
        stream_sync(st);
    }
}

/* The failure of a socket call on st, errno in err (0: the peer closed). */
static void stream_fail_io(struct tcp_stream *st, int err)
{
    struct tcp_conn *c = st->conn;
    conn_fail(c, WEFT_ERR_REMOTE, "rank %d: connection to rank %d (%s) failed on %s stream %d: %s",
              c->ctx->rank, c->peer, c->addrstr, dir_name(st), st->index,
              err == 0 ? "the peer closed the connection" : strerror(err));
}

static struct tcp_conn *conn_get(struct tcp_ctx *ctx, int peer)
{
    if (ctx->conns[peer])
        return ctx->conns[peer];
    int n = ctx->nstreams;
    struct tcp_conn *c = calloc(1, sizeof(*c) + 2 * (size_t)n * sizeof(struct tcp_stream));
    if (c == NULL)
        return NULL;
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

/* ---- outgoing connection setup ------------------------------------------ */

/* Starts every send stream of c connecting; the handshakes finish in
 * progress(), so two ranks that connect to each other never wait. */
static void conn_open(struct tcp_conn *c)
{
    struct tcp_ctx *ctx = c->ctx;
    c->deadline = ctx->timeout_ns ? weft_now_ns() + ctx->timeout_ns : 0;
    for (int s = 0; s < ctx->nstreams; s++) {
        struct tcp_stream *st = &c->send[s];
        int fd = -1;
        weft_status_t rc = weft_sock_connect_start(&c->addr, &fd);
        if (rc < 0) {
            conn_fail(c, rc == WEFT_ERR_TIMEOUT ? rc : WEFT_ERR_REMOTE,
                      "rank %d: cannot connect to rank %d at %s (stream %d): %s", ctx->rank,
                      c->peer, c->addrstr, s, weft_thread_last_error());
            return;
        }
        weft_sock_tune(fd, ctx->bufsize);
        st->fd = fd;
        st->state = ST_CONNECTING;
        stream_sync(st);
    }
}

/* Advances the setup of a send stream; returns true if it moved. */
static bool stream_setup(struct tcp_stream *st)
{
    struct tcp_conn *c = st->conn;
    struct tcp_ctx *ctx = c->ctx;
    if (st->state == ST_CONNECTING) {
        weft_status_t rc = weft_sock_connect_finish(st->fd);
        if (rc < 0) {
            conn_fail(c, WEFT_ERR_REMOTE,
                      "rank %d: cannot connect to rank %d at %s (stream %d): %s", ctx->rank,
                      c->peer, c->addrstr, st->index, weft_thread_last_error());
            return true;
        }
        if (rc == WEFT_OK) {
            struct weft_auth_hello h = {.kind = WEFT_AUTH_DATA,
                                        .job = ctx->job,
                                        .rank = (uint32_t)ctx->rank,
                                        .nranks = (uint32_t)ctx->nranks,
                                        .index = (uint32_t)st->index};
            weft_auth_connect_begin(&st->auth, st->fd, &h, c->deadline);
            st->state = ST_HANDSHAKE;
        }
    }
    if (st->state == ST_HANDSHAKE) {
        const char *why = "unknown reason";
        weft_status_t rc = weft_auth_connect_step(&st->auth, ctx->secret, &why);
        if (rc == WEFT_OK) {
            st->state = ST_READY;
            stream_sync(st);
            WEFT_INFO(WEFT_SUB_NET, "rank %d: send stream %d to rank %d (%s) is up", ctx->rank,
                      st->index, c->peer, c->addrstr);
            return true;
        }
        if (rc < 0) {
            conn_fail(c, rc == WEFT_ERR_TIMEOUT ? rc : WEFT_ERR_REMOTE,
                      "rank %d: handshake with rank %d at %s failed on stream %d: %s", ctx->rank,
                      c->peer, c->addrstr, st->index, why);
            return true;
        }
    }
    if (c->deadline != 0 && weft_now_ns() > c->deadline) {
        conn_fail(c, WEFT_ERR_TIMEOUT,
                  "rank %d: connecting to rank %d at %s timed out after %llu ms (stream %d)",
                  ctx->rank, c->peer, c->addrstr,
                  (unsigned long long)(ctx->timeout_ns / 1000000), st->index);
        return true;
    }
    return false;
}

/* ---- data movement ------------------------------------------------------- */

/* Writes queued messages, several per sendmsg; returns true if bytes moved. */
static bool stream_send(struct tcp_stream *st)
{
    bool moved = false;
    while (st->head) {
        struct iovec iov[TCP_IOV_MAX];
        int niov = 0;
        size_t want = 0;
        for (struct tcp_req *r = st->head; r && niov + 2 <= TCP_IOV_MAX; r = r->next) {
            size_t d = r->done;
            if (d < TCP_HDR_LEN) {
                iov[niov++] = (struct iovec){r->hdr + d, TCP_HDR_LEN - d};
                want += TCP_HDR_LEN - d;
                d = TCP_HDR_LEN;
            }
            size_t off = d - TCP_HDR_LEN;
            if (off < r->len) {
                iov[niov++] = (struct iovec){r->buf + off, r->len - off};
                want += r->len - off;
            }
        }
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
        ssize_t n = sendmsg(st->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return moved;
            stream_fail_io(st, errno);
            return true;
        }
        moved = true;
        size_t left = (size_t)n;
        struct tcp_req *r;
        while ((r = st->head) != NULL) {
            size_t total = TCP_HDR_LEN + r->len;
            size_t take = WEFT_MIN(left, total - r->done);
            r->done += take;
            left -= take;
            if (r->done < total)
                break;
            stream_complete(st, WEFT_OK);
        }
        /* A short write means the socket buffer is full: another call
         * would only return EAGAIN. */
        if ((size_t)n < want)
            break;
    }
    stream_sync(st);
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

/* Checks the header in st->rhdr against the receive r, before a byte of
 * payload lands anywhere.  False: conn has been failed. */
static bool frame_check(struct tcp_stream *st, struct tcp_req *r)
{
    struct tcp_conn *c = st->conn;
    uint32_t magic = get_le32(st->rhdr), reserved = get_le32(st->rhdr + 4);
    uint64_t seq = get_le64(st->rhdr + 8), len = get_le64(st->rhdr + 16);
    if (magic != TCP_MAGIC || reserved != 0 || seq != r->seq) {
        conn_fail(c, WEFT_ERR_REMOTE,
                  "rank %d: bad frame from rank %d on stream %d (seq %llu, expected %llu; "
                  "magic 0x%08x, reserved %u) from %s",
                  c->ctx->rank, c->peer, st->index, (unsigned long long)seq,
                  (unsigned long long)r->seq, magic, reserved, c->addrstr);
        return false;
    }
    if (len > r->len) {
        conn_fail(c, WEFT_ERR_REMOTE,
                  "rank %d: rank %d sent %llu bytes but the receive posted holds %zu "
                  "(stream %d, message %llu)",
                  c->ctx->rank, c->peer, (unsigned long long)len, r->len, st->index,
                  (unsigned long long)r->seq);
        return false;
    }
    r->msglen = (size_t)len;
    r->hdr_ok = true;
    st->rhave = 0;
    return true;
}

/* Reads into posted receives.  The payload goes straight to the user's
 * buffer; the next frame's header rides along in the same recvmsg so that
 * a stream of messages costs one syscall each.  Returns true if it moved. */
static bool stream_recv(struct tcp_stream *st)
{
    bool moved = false;
    struct tcp_req *r;
    while ((r = st->head) != NULL) {
        if (!r->hdr_ok) {
            if (st->rhave < TCP_HDR_LEN) {
                ssize_t n = recv(st->fd, st->rhdr + st->rhave, TCP_HDR_LEN - st->rhave,
                                 MSG_DONTWAIT);
                if (n <= 0) {
                    if (n < 0 && errno == EINTR)
                        continue;
                    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                        break;
                    stream_fail_io(st, n == 0 ? 0 : errno);
                    return true;
                }
                moved = true;
                st->rhave += (size_t)n;
                if (st->rhave < TCP_HDR_LEN)
                    break;
            }
            if (!frame_check(st, r))
                return true;
        }
        if (r->done < r->msglen) {
            size_t need = r->msglen - r->done;
            struct iovec iov[2] = {{r->buf + r->done, need}, {st->rhdr, TCP_HDR_LEN}};
            struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
            ssize_t n = recvmsg(st->fd, &mh, MSG_DONTWAIT);
            if (n <= 0) {
                if (n < 0 && errno == EINTR)
                    continue;
                if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                    break;
                stream_fail_io(st, n == 0 ? 0 : errno);
                return true;
            }
            moved = true;
            size_t pay = WEFT_MIN((size_t)n, need);
            r->done += pay;
            st->rhave = (size_t)n - pay;
            if (r->done < r->msglen)
                break; /* short read: the kernel has nothing more now */
            stream_complete(st, WEFT_OK);
            if ((size_t)n < need + TCP_HDR_LEN)
                break;
            continue;
        }
        stream_complete(st, WEFT_OK);
        moved = true;
    }
    stream_sync(st);
    return moved;
}

static bool stream_progress(struct tcp_stream *st)
{
    switch (st->state) {
    case ST_CONNECTING:
    case ST_HANDSHAKE: {
        bool moved = stream_setup(st);
        if (st->state == ST_READY && st->head)
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

/* ---- incoming connections ------------------------------------------------ */

static void pending_drop(struct tcp_ctx *ctx, struct tcp_pending *p, const char *why)
{
    WEFT_WARN(WEFT_SUB_NET, "rank %d: dropped connection from %s: %s", ctx->rank, p->from, why);
    close(p->acc.fd);
    p->used = false;
    ctx->npending--;
}

/* An authenticated socket: becomes receive stream hello.index from
 * hello.rank if that slot is legitimately free. */
static void pending_install(struct tcp_ctx *ctx, struct tcp_pending *p)
{
    const struct weft_auth_hello *h = &p->acc.hello;
    char why[128];
    if (h->kind != WEFT_AUTH_DATA) {
        snprintf(why, sizeof(why), "not a data connection (kind %u)", (unsigned)h->kind);
    } else if (h->nranks != (uint32_t)ctx->nranks) {
        snprintf(why, sizeof(why), "it believes the job has %u ranks, not %d",
                 (unsigned)h->nranks, ctx->nranks);
    } else if (h->rank >= (uint32_t)ctx->nranks || h->rank == (uint32_t)ctx->rank) {
        snprintf(why, sizeof(why), "it claims rank %u", (unsigned)h->rank);
    } else if (h->index >= (uint32_t)ctx->nstreams) {
        snprintf(why, sizeof(why), "stream %u, but WEFT_SOCKET_NSTREAMS is %d",
                 (unsigned)h->index, ctx->nstreams);
    } else {
        struct tcp_conn *c = conn_get(ctx, (int)h->rank);
        struct tcp_stream *st = c ? &c->recv[h->index] : NULL;
        if (c == NULL)
            snprintf(why, sizeof(why), "out of memory for the connection");
        else if (c->err != WEFT_OK)
            snprintf(why, sizeof(why), "the connection to rank %u has failed already",
                     (unsigned)h->rank);
        else if (st->installed)
            snprintf(why, sizeof(why), "stream %u of rank %u is connected already",
                     (unsigned)h->index, (unsigned)h->rank);
        else {
            st->fd = p->acc.fd;
            st->installed = true;
            st->state = ST_READY;
            weft_sock_tune(st->fd, ctx->bufsize);
            if (!c->have_addr)
                snprintf(c->addrstr, sizeof(c->addrstr), "%s", p->from);
            p->used = false;
            ctx->npending--;
            stream_sync(st);
            WEFT_INFO(WEFT_SUB_NET, "rank %d: recv stream %u from rank %u (%s) is up", ctx->rank,
                      (unsigned)h->index, (unsigned)h->rank, p->from);
            return;
        }
    }
    pending_drop(ctx, p, why);
}

static void pending_step(struct tcp_ctx *ctx, struct tcp_pending *p)
{
    const char *why = "unknown reason";
    weft_status_t rc = weft_auth_accept_step(&p->acc, ctx->secret, ctx->job, &why);
    /* The acceptor checks its own deadline: a silent stranger fails here. */
    if (rc == WEFT_OK)
        pending_install(ctx, p);
    else if (rc < 0)
        pending_drop(ctx, p, why);
}

static void pending_add(struct tcp_ctx *ctx, int fd)
{
    struct tcp_pending *p = NULL, *oldest = NULL;
    for (int i = 0; i < TCP_MAX_PENDING && p == NULL; i++) {
        struct tcp_pending *q = &ctx->pending[i];
        if (!q->used)
            p = q;
        else if (oldest == NULL || q->serial < oldest->serial)
            oldest = q;
    }
    if (p == NULL) {
        pending_drop(ctx, oldest, "too many connections in their handshake");
        p = oldest;
    }
    union weft_sockaddr from;
    socklen_t len = sizeof(from);
    if (getpeername(fd, &from.sa, &len) == 0)
        weft_sock_str(&from, p->from, sizeof(p->from));
    else
        snprintf(p->from, sizeof(p->from), "unknown address (fd %d)", fd);
    uint64_t t = ctx->timeout_ns ? WEFT_MIN(ctx->timeout_ns, TCP_ACCEPT_TIMEOUT_NS)
                                 : TCP_ACCEPT_TIMEOUT_NS;
    p->used = true;
    ctx->npending++;
    p->serial = ctx->pending_serial++;
    weft_auth_accept_begin(&p->acc, fd, weft_now_ns() + t);
    pending_step(ctx, p);
}

/* Accepts what waits on the listener and advances every handshake. */
static bool ctx_service(struct tcp_ctx *ctx)
{
    bool moved = false;
    for (int i = 0; i < TCP_MAX_PENDING; i++)
        if (ctx->pending[i].used)
            pending_step(ctx, &ctx->pending[i]);
    for (;;) {
        int fd = -1;
        if (weft_sock_accept(ctx->lfd, &fd) < 0 || fd < 0)
            break;
        moved = true;
        pending_add(ctx, fd);
    }
    return moved;
}

/* ---- the vtable ----------------------------------------------------------- */

static void tcp_finalize(void *vctx);

static weft_status_t tcp_init(const struct weft_transport_init *args, void **vctx, void *addr,
                              size_t *addrlen)
{
    if (args == NULL || vctx == NULL || addr == NULL || addrlen == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "tcp init: NULL argument");
    *vctx = NULL;
    if (args->nranks < 1 || args->rank < 0 || args->rank >= args->nranks || args->secret == NULL)
        return weft_error_quiet(args->comm, WEFT_ERR_INVALID_ARG,
                                "tcp init: rank %d of %d ranks (secret %s) is not valid",
                                args->rank, args->nranks, args->secret ? "set" : "NULL");
    if (*addrlen < sizeof(union weft_sockaddr))
        return weft_error_quiet(args->comm, WEFT_ERR_INVALID_ARG,
                                "tcp init: address buffer of %zu bytes, %zu needed", *addrlen,
                                sizeof(union weft_sockaddr));
    int64_t nstreams = weft_param_int("WEFT_SOCKET_NSTREAMS");
    int64_t bufsize = weft_param_int("WEFT_SOCKET_BUFSIZE");
    if (nstreams < 1 || nstreams > TCP_MAX_STREAMS)
        return weft_error(args->comm, WEFT_ERR_INVALID_ARG,
                          "WEFT_SOCKET_NSTREAMS=%lld is out of range (1..%d)",
                          (long long)nstreams, TCP_MAX_STREAMS);
    if (bufsize < 0 || bufsize > (1 << 30))
        return weft_error(args->comm, WEFT_ERR_INVALID_ARG,
                          "WEFT_SOCKET_BUFSIZE=%lld is out of range (0..1G)", (long long)bufsize);

    struct tcp_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL)
        return weft_error(args->comm, WEFT_ERR_NO_MEMORY, "tcp init: out of memory");
    weft_status_t st;
    ctx->comm = args->comm;
    ctx->rank = args->rank;
    ctx->nranks = args->nranks;
    ctx->nstreams = (int)nstreams;
    ctx->bufsize = (int)bufsize;
    ctx->job = args->job;
    ctx->timeout_ns = args->timeout_ns;
    memcpy(ctx->secret, args->secret, WEFT_SECRET_BYTES);
    ctx->lfd = ctx->efd = -1;
    ctx->conns = calloc((size_t)args->nranks, sizeof(*ctx->conns));
    ctx->pcap = 64;
    ctx->pfd = malloc(ctx->pcap * sizeof(*ctx->pfd));
    ctx->pst = malloc(ctx->pcap * sizeof(*ctx->pst));
    ctx->pkind = malloc(ctx->pcap * sizeof(*ctx->pkind));
    if (!ctx->conns || !ctx->pfd || !ctx->pst || !ctx->pkind) {
        st = weft_error(args->comm, WEFT_ERR_NO_MEMORY, "tcp init: out of memory");
        goto fail;
    }
    ctx->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->efd < 0) {
        st = weft_error(args->comm, weft_errno_status(errno), "tcp init: eventfd: %s",
                        strerror(errno));
        goto fail;
    }
    ctx->laddr = args->local;
    st = weft_sock_listen(&ctx->laddr, &ctx->lfd);
    if (st < 0) {
        st = weft_error(args->comm, st, "rank %d: tcp transport cannot listen: %s", args->rank,
                        weft_thread_last_error());
        goto fail;
    }
    /* Accepted sockets inherit the buffer sizes, which must be set before
     * the handshake so that TCP scales its window for them. */
    weft_sock_tune(ctx->lfd, ctx->bufsize);
    memset(addr, 0, *addrlen);
    memcpy(addr, &ctx->laddr, sizeof(ctx->laddr));
    *addrlen = sizeof(ctx->laddr);
    *vctx = ctx;
    char name[TCP_ADDRSTR_LEN];
    WEFT_INFO(WEFT_SUB_NET, "rank %d: tcp listening on %s, %d streams per peer, buffers %d",
              ctx->rank, weft_sock_str(&ctx->laddr, name, sizeof(name)), ctx->nstreams,
              ctx->bufsize);
    return WEFT_OK;
fail:
    tcp_finalize(ctx);
    return st;
}

static weft_status_t tcp_connect(void *vctx, int peer, const void *addr, size_t addrlen,
                                 void **vconn)
{
    struct tcp_ctx *ctx = vctx;
    if (ctx == NULL || addr == NULL || vconn == NULL)
        return weft_error_quiet(ctx ? ctx->comm : NULL, WEFT_ERR_INVALID_ARG,
                                "tcp connect: NULL argument");
    if (peer < 0 || peer >= ctx->nranks || peer == ctx->rank)
        return weft_error_quiet(ctx->comm, WEFT_ERR_INVALID_ARG,
                                "rank %d: tcp connect to rank %d: not a peer in 0..%d", ctx->rank,
                                peer, ctx->nranks - 1);
    union weft_sockaddr a;
    if (addrlen != sizeof(a))
        return weft_error_quiet(ctx->comm, WEFT_ERR_INVALID_ARG,
                                "rank %d: tcp address of rank %d has %zu bytes, expected %zu",
                                ctx->rank, peer, addrlen, sizeof(a));
    memcpy(&a, addr, sizeof(a));
    if (a.sa.sa_family != AF_INET && a.sa.sa_family != AF_INET6)
        return weft_error_quiet(ctx->comm, WEFT_ERR_INVALID_ARG,
                                "rank %d: tcp address of rank %d has address family %d",
                                ctx->rank, peer, (int)a.sa.sa_family);
    struct tcp_conn *c = conn_get(ctx, peer);
    if (c == NULL)
        return weft_error(ctx->comm, WEFT_ERR_NO_MEMORY, "rank %d: no memory for a connection",
                          ctx->rank);
    if (c->have_addr && memcmp(&c->addr, &a, sizeof(a)) != 0)
        return weft_error_quiet(ctx->comm, WEFT_ERR_INVALID_ARG,
                                "rank %d: tcp connect to rank %d twice with different addresses",
                                ctx->rank, peer);
    c->addr = a;
    c->have_addr = true;
    weft_sock_str(&a, c->addrstr, sizeof(c->addrstr));
    *vconn = c;
    return WEFT_OK;
}

static weft_status_t tcp_post(struct tcp_conn *c, bool is_send, void *buf, size_t bytes,
                              void **vreq)
{
    struct tcp_ctx *ctx = c->ctx;
    struct tcp_req *r = req_get(ctx);
    if (r == NULL)
        return weft_error(ctx->comm, WEFT_ERR_NO_MEMORY, "rank %d: no memory for a tcp request",
                          ctx->rank);
    r->conn = c;
    r->buf = buf;
    r->len = r->msglen = bytes;
    *vreq = r;
    if (c->err != WEFT_OK) {
        r->status = c->err;
        return WEFT_OK;
    }
    r->seq = is_send ? c->nsend++ : c->nrecv++;
    struct tcp_stream *st = (is_send ? c->send : c->recv) + r->seq % (uint64_t)ctx->nstreams;
    bool idle = st->head == NULL;
    stream_enqueue(st, r);
    if (is_send) {
        uint32_t magic = htole32(TCP_MAGIC), zero = 0;
        uint64_t seq = htole64(r->seq), len = htole64((uint64_t)bytes);
        memcpy(r->hdr, &magic, 4);
        memcpy(r->hdr + 4, &zero, 4);
        memcpy(r->hdr + 8, &seq, 8);
        memcpy(r->hdr + 16, &len, 8);
        if (st->state == ST_IDLE) {
            conn_open(c);
        } else if (st->state == ST_READY && idle) {
            stream_send(st); /* small messages leave without a progress round */
            return WEFT_OK;
        }
    } else if (st->state == ST_READY && idle && st->rhave > 0) {
        stream_recv(st); /* the header is here already: data is waiting */
        return WEFT_OK;
    }
    stream_sync(st);
    return WEFT_OK;
}

static weft_status_t tcp_isend(void *conn, const void *buf, size_t bytes, void *mh, void **req)
{
    struct tcp_conn *c = conn;
    if (c == NULL || req == NULL || (buf == NULL && bytes > 0))
        return weft_error_quiet(c ? c->ctx->comm : NULL, WEFT_ERR_INVALID_ARG,
                                "tcp isend: NULL %s", c == NULL ? "connection" : "argument");
    return tcp_post(c, true, (void *)(uintptr_t)buf, bytes, req);
}

static weft_status_t tcp_irecv(void *conn, void *buf, size_t bytes, void *mh, void **req)
{
    struct tcp_conn *c = conn;
    if (c == NULL || req == NULL || (buf == NULL && bytes > 0))
        return weft_error_quiet(c ? c->ctx->comm : NULL, WEFT_ERR_INVALID_ARG,
                                "tcp irecv: NULL %s", c == NULL ? "connection" : "argument");
    return tcp_post(c, false, buf, bytes, req);
}

static weft_status_t tcp_test(void *vreq, int *done, size_t *bytes)
{
    struct tcp_req *r = vreq;
    if (r == NULL || done == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "tcp test: NULL argument");
    if (r->status == WEFT_INPROGRESS) {
        *done = 0;
        return WEFT_OK;
    }
    struct tcp_conn *c = r->conn;
    weft_status_t st = r->status;
    size_t n = r->msglen;
    req_put(c->ctx, r);
    *done = 1;
    if (st < 0)
        /* Recorded (and logged) when the connection failed; recorded again
         * so that the caller reads this request's cause. */
        return weft_error_quiet(c->ctx->comm, st, "%s", c->errmsg);
    if (bytes)
        *bytes = n;
    return WEFT_OK;
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
    int *pkind = realloc(ctx->pkind, cap * sizeof(*pkind));
    if (pkind)
        ctx->pkind = pkind;
    if (!pfd || !pst || !pkind)
        return weft_error(ctx->comm, WEFT_ERR_NO_MEMORY, "rank %d: no memory for %zu poll entries",
                          ctx->rank, n);
    ctx->pcap = cap;
    return WEFT_OK;
}

static weft_status_t tcp_progress(void *vctx, int timeout_ms)
{
    struct tcp_ctx *ctx = vctx;
    WEFT_CHECK(ctx_poll_room(ctx, ctx->nactive + TCP_MAX_PENDING + 2));
    /* Snapshot first: I/O may fail a conn and unlink several streams. */
    size_t ns = 0;
    for (struct tcp_stream *st = ctx->work; st; st = st->next)
        ctx->pst[ns++] = st;
    bool moved = false;
    for (size_t i = 0; i < ns; i++)
        if (ctx->pst[i]->active)
            moved |= stream_progress(ctx->pst[i]);
    /* The listener and the handshakes are served every pass while a
     * receive waits for its socket or before we sleep with handshakes
     * pending (their deadlines are checked here); otherwise every 16th
     * pass and whenever poll says so. */
    if (ctx->nwait_fd > 0 || (++ctx->tick & 15) == 0 || (timeout_ms > 0 && ctx->npending > 0))
        moved |= ctx_service(ctx);
    if (moved || timeout_ms <= 0)
        return WEFT_OK;

    WEFT_CHECK(ctx_poll_room(ctx, ctx->nactive + TCP_MAX_PENDING + 2));
    size_t n = 0;
    for (struct tcp_stream *st = ctx->work; st; st = st->next) {
        ctx->pfd[n] = (struct pollfd){.fd = st->fd, .events = stream_events(st)};
        ctx->pst[n] = st;
        ctx->pkind[n++] = -1;
    }
    for (int i = 0; i < TCP_MAX_PENDING; i++) {
        if (!ctx->pending[i].used)
            continue;
        ctx->pfd[n] = (struct pollfd){.fd = ctx->pending[i].acc.fd,
                                      .events = weft_auth_accept_events(&ctx->pending[i].acc)};
        ctx->pst[n] = NULL;
        ctx->pkind[n++] = i;
    }
    ctx->pfd[n] = (struct pollfd){.fd = ctx->lfd, .events = POLLIN};
    ctx->pst[n] = NULL;
    ctx->pkind[n++] = -2;
    ctx->pfd[n] = (struct pollfd){.fd = ctx->efd, .events = POLLIN};
    ctx->pst[n] = NULL;
    ctx->pkind[n++] = -3;

    int rc = poll(ctx->pfd, (nfds_t)n, timeout_ms);
    if (rc < 0) {
        if (errno == EINTR)
            return WEFT_OK;
        return weft_error(ctx->comm, WEFT_ERR_SYSTEM, "rank %d: tcp poll on %zu sockets: %s",
                          ctx->rank, n, strerror(errno));
    }
    for (size_t i = 0; i < n && rc > 0; i++) {
        if (ctx->pfd[i].revents == 0)
            continue;
        rc--;
        int kind = ctx->pkind[i];
        if (kind == -1) {
            struct tcp_stream *st = ctx->pst[i];
            if (st->active && st->fd == ctx->pfd[i].fd)
                stream_progress(st);
        } else if (kind == -2) {
            ctx_service(ctx);
        } else if (kind == -3) {
            uint64_t v;
            while (read(ctx->efd, &v, sizeof(v)) < 0 && errno == EINTR)
                ;
        } else if (ctx->pending[kind].used && ctx->pending[kind].acc.fd == ctx->pfd[i].fd) {
            pending_step(ctx, &ctx->pending[kind]);
        }
    }
    return WEFT_OK;
}

static void tcp_wakeup(void *vctx)
{
    struct tcp_ctx *ctx = vctx;
    uint64_t one = 1;
    /* EAGAIN means the counter is saturated: a wakeup is pending anyway. */
    while (write(ctx->efd, &one, sizeof(one)) < 0 && errno == EINTR)
        ;
}

static void tcp_finalize(void *vctx)
{
    struct tcp_ctx *ctx = vctx;
    if (ctx == NULL)
        return;
    for (int i = 0; ctx->conns && i < ctx->nranks; i++) {
        struct tcp_conn *c = ctx->conns[i];
        if (c == NULL)
            continue;
        for (int s = 0; s < 2 * ctx->nstreams; s++)
            if (c->streams[s].fd >= 0)
                close(c->streams[s].fd);
        free(c);
    }
    for (int i = 0; i < TCP_MAX_PENDING; i++)
        if (ctx->pending[i].used)
            close(ctx->pending[i].acc.fd);
    if (ctx->lfd >= 0)
        close(ctx->lfd);
    if (ctx->efd >= 0)
        close(ctx->efd);
    while (ctx->slabs) {
        struct tcp_slab *s = ctx->slabs;
        ctx->slabs = s->next;
        free(s);
    }
    free(ctx->conns);
    free(ctx->pfd);
    free(ctx->pst);
    free(ctx->pkind);
    free(ctx);
}

const struct weft_transport_ops weft_tcp_ops = {
    .name = "tcp",
    .init = tcp_init,
    .connect = tcp_connect,
    .reg_mem = NULL,
    .dereg_mem = NULL,
    .isend = tcp_isend,
    .irecv = tcp_irecv,
    .test = tcp_test,
    .put_notify = NULL,
    .progress = tcp_progress,
    .wakeup = tcp_wakeup,
    .finalize = tcp_finalize,
};
