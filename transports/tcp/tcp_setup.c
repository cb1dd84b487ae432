/*
 * tcp_setup.c - tcp connection setup: outgoing sockets that connect and
 * authenticate without blocking, the listener and the handshakes of accepted
 * sockets, and the transport's init, connect and finalize.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/sock.h"
#include "transports/registry.h"
#include "transports/transport.h"
#include "transports/tcp/tcp.h"

/* ---- outgoing connection setup ------------------------------------------ */

/* Starts a connect of st; its retry window counts from now.  False: c
 * has been failed. */
static bool stream_connect(struct tcp_stream *st)
{
    struct tcp_conn *c = st->conn;
    struct tcp_ctx *ctx = c->ctx;
    int fd = -1;
    weft_status_t rc = weft_sock_connect_start(&c->addr, &fd);
    if (rc < 0) {
        tcp_conn_fail(c, rc == WEFT_ERR_TIMEOUT ? rc : WEFT_ERR_REMOTE,
                      "rank %d: cannot connect to rank %d at %s (stream %d): %s", ctx->rank,
                      c->peer, c->addrstr, st->index, weft_thread_last_error());
        return false;
    }
    weft_sock_tune(fd, ctx->bufsize);
    st->fd = fd;
    st->state = ST_CONNECTING;
    st->tried_at = weft_now_ns();
    return true;
}

/* Starts every send stream of c connecting; the handshakes finish in
 * progress(), so two ranks that connect to each other never wait. */
void tcp_conn_open(struct tcp_conn *c)
{
    struct tcp_ctx *ctx = c->ctx;
    c->deadline = ctx->timeout_ns ? weft_now_ns() + ctx->timeout_ns : 0;
    for (int s = 0; s < ctx->nstreams; s++) {
        struct tcp_stream *st = &c->send[s];
        st->unanswered = 0;
        if (!stream_connect(st))
            return;
        tcp_stream_sync(st);
    }
}

int tcp_stream_retry_ms(const struct tcp_stream *st, uint64_t now)
{
    if (st->state != ST_CONNECTING)
        return -1;
    uint64_t due = st->tried_at + (uint64_t)weft_sock_connect_window_ms(st->unanswered) * 1000000;
    return now >= due ? 0 : (int)((due - now + 999999) / 1000000);
}

/* Advances the setup of a send stream; returns true if it moved. */
bool tcp_stream_setup(struct tcp_stream *st)
{
    struct tcp_conn *c = st->conn;
    struct tcp_ctx *ctx = c->ctx;
    if (st->state == ST_CONNECTING) {
        weft_status_t rc = weft_sock_connect_finish(st->fd);
        if (rc == WEFT_INPROGRESS && tcp_stream_retry_ms(st, weft_now_ns()) == 0) {
            /* No answer: the peer's full listen queue dropped our SYN, and
             * TCP would send it again only after 1 s (sock.h). */
            close(st->fd);
            st->fd = -1;
            st->unanswered++;
            WEFT_TRACE(WEFT_SUB_NET, "rank %d: connect %d to rank %d (%s) stream %d: no answer, "
                       "starting afresh", ctx->rank, st->unanswered, c->peer, c->addrstr,
                       st->index);
            if (!stream_connect(st))
                return true;
        } else if (rc < 0) {
            tcp_conn_fail(c, WEFT_ERR_REMOTE,
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
            tcp_stream_sync(st);
            WEFT_INFO(WEFT_SUB_NET, "rank %d: send stream %d to rank %d (%s) is up", ctx->rank,
                      st->index, c->peer, c->addrstr);
            return true;
        }
        if (rc < 0) {
            tcp_conn_fail(c, rc == WEFT_ERR_TIMEOUT ? rc : WEFT_ERR_REMOTE,
                          "rank %d: handshake with rank %d at %s failed on stream %d: %s",
                          ctx->rank, c->peer, c->addrstr, st->index, why);
            return true;
        }
    }
    if (c->deadline != 0 && weft_now_ns() > c->deadline) {
        tcp_conn_fail(c, WEFT_ERR_TIMEOUT,
                      "rank %d: connecting to rank %d at %s timed out after %llu ms (stream %d)",
                      ctx->rank, c->peer, c->addrstr,
                      (unsigned long long)(ctx->timeout_ns / 1000000), st->index);
        return true;
    }
    return false;
}

/* ---- incoming connections ------------------------------------------------ */

weft_status_t tcp_hello_check(const struct tcp_ctx *ctx, const struct weft_auth_hello *h,
                              char *why, size_t whylen)
{
    if (h->kind != WEFT_AUTH_DATA)
        snprintf(why, whylen, "not a data connection (kind %u)", (unsigned)h->kind);
    else if (h->nranks != (uint32_t)ctx->nranks)
        snprintf(why, whylen, "it believes the job has %u ranks, not %d", (unsigned)h->nranks,
                 ctx->nranks);
    else if (h->rank >= (uint32_t)ctx->nranks || h->rank == (uint32_t)ctx->rank)
        snprintf(why, whylen, "it claims rank %u", (unsigned)h->rank);
    else if (h->index >= (uint32_t)ctx->nstreams)
        snprintf(why, whylen, "stream %u, but WEFT_SOCKET_NSTREAMS is %d", (unsigned)h->index,
                 ctx->nstreams);
    else
        return WEFT_OK;
    return WEFT_ERR_REMOTE;
}

/* door.conn[i] proved the secret: becomes receive stream hello.index
 * from hello.rank if that slot is legitimately free, else is dropped. */
static void door_install(struct tcp_ctx *ctx, int i)
{
    const struct weft_auth_hello *h = &ctx->door.conn[i].acc.hello;
    char why[128];
    if (tcp_hello_check(ctx, h, why, sizeof(why)) == WEFT_OK) {
        struct tcp_conn *c = tcp_conn_get(ctx, (int)h->rank);
        struct tcp_stream *st = c ? &c->recv[h->index] : NULL;
        if (c == NULL)
            snprintf(why, sizeof(why), "out of memory for the connection");
        else if (c->base.err != WEFT_OK)
            snprintf(why, sizeof(why), "the connection to rank %u has failed already",
                     (unsigned)h->rank);
        else if (st->installed)
            snprintf(why, sizeof(why), "stream %u of rank %u is connected already",
                     (unsigned)h->index, (unsigned)h->rank);
        else {
            char from[TCP_ADDRSTR_LEN];
            weft_admit_from(&ctx->door, i, from, sizeof(from));
            WEFT_INFO(WEFT_SUB_NET, "rank %d: recv stream %u from rank %u (%s) is up", ctx->rank,
                      (unsigned)h->index, (unsigned)h->rank, from);
            st->fd = weft_admit_take(&ctx->door, i); /* h is gone now */
            st->installed = true;
            st->state = ST_READY;
            weft_sock_tune(st->fd, ctx->bufsize);
            if (!c->have_addr)
                snprintf(c->addrstr, sizeof(c->addrstr), "%s", from);
            tcp_stream_sync(st);
            return;
        }
    }
    weft_admit_drop(&ctx->door, i, why);
}

/* The door's step (base/admit.h): a handshake that fails is dropped, one
 * that proves the secret installed or dropped. */
static weft_status_t door_step(void *arg, int i, bool *kept)
{
    struct tcp_ctx *ctx = arg;
    const char *why = "unknown reason";
    /* The acceptor checks its own deadline: a silent stranger fails here. */
    weft_status_t rc = weft_admit_step(&ctx->door, i, ctx->secret, ctx->job, &why);
    *kept = rc == WEFT_INPROGRESS;
    if (rc == WEFT_OK)
        door_install(ctx, i);
    else if (rc < 0)
        weft_admit_drop(&ctx->door, i, why);
    return WEFT_OK;
}

bool tcp_ctx_service(struct tcp_ctx *ctx, const struct pollfd *pfd)
{
    struct weft_admit *d = &ctx->door;
    unsigned long accepted = d->accepted;
    bool incoming;
    if (pfd != NULL)
        incoming = weft_admit_mark(d, pfd);
    else if (weft_admit_poll(d, ctx->lfd, 0, &incoming) != WEFT_OK)
        return false; /* recorded; the streams' own polls report a broken process */
    weft_admit_serve(d, door_step, ctx); /* door_step fails nothing */
    if (incoming)
        weft_admit_accept(d, ctx->lfd, door_step, ctx);
    return d->accepted != accepted;
}

/* ---- the vtable ----------------------------------------------------------- */

void tcp_finalize(void *vctx);

weft_status_t tcp_init(const struct weft_transport_init *args, void **vctx, void *addr,
                       size_t *addrlen)
{
    if (args == NULL || vctx == NULL || addr == NULL || addrlen == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "tcp init: NULL argument");
    *vctx = NULL;
    if (args->nranks < 1 || args->rank < 0 || args->rank >= args->nranks || args->secret == NULL)
        return weft_error_quiet(args->err, WEFT_ERR_INVALID_ARG,
                                "tcp init: rank %d of %d ranks (secret %s) is not valid",
                                args->rank, args->nranks, args->secret ? "set" : "NULL");
    if (*addrlen < sizeof(union weft_sockaddr))
        return weft_error_quiet(args->err, WEFT_ERR_INVALID_ARG,
                                "tcp init: address buffer of %zu bytes, %zu needed", *addrlen,
                                sizeof(union weft_sockaddr));
    weft_transport_register_params();
    int64_t nstreams = weft_param_int("WEFT_SOCKET_NSTREAMS");
    int64_t bufsize = weft_param_int("WEFT_SOCKET_BUFSIZE");
    if (nstreams < 1 || nstreams > TCP_MAX_STREAMS)
        return weft_error(args->err, WEFT_ERR_INVALID_ARG,
                          "WEFT_SOCKET_NSTREAMS=%lld is out of range (1..%d)",
                          (long long)nstreams, TCP_MAX_STREAMS);
    if (bufsize < 0 || bufsize > (1 << 30))
        return weft_error(args->err, WEFT_ERR_INVALID_ARG,
                          "WEFT_SOCKET_BUFSIZE=%lld is out of range (0..1G)", (long long)bufsize);

    struct tcp_ctx *ctx;
    WEFT_TP_CTX_NEW(ctx, args, "tcp");
    weft_status_t st;
    ctx->nstreams = (int)nstreams;
    ctx->bufsize = (int)bufsize;
    ctx->job = args->job;
    ctx->timeout_ns = args->timeout_ns;
    memcpy(ctx->secret, args->secret, WEFT_SECRET_BYTES);
    ctx->lfd = ctx->efd = -1;
    ctx->conns = calloc((size_t)args->nranks, sizeof(*ctx->conns));
    char who[32];
    snprintf(who, sizeof(who), "rank %d: tcp", args->rank);
    /* A HELLO of this job gets the handshake's whole time. */
    st = weft_admit_init(&ctx->door, args->err, WEFT_SUB_NET, who,
                         ctx->timeout_ns ? WEFT_MIN(ctx->timeout_ns, TCP_ACCEPT_TIMEOUT_NS)
                                         : TCP_ACCEPT_TIMEOUT_NS);
    if (st != WEFT_OK)
        goto fail;
    ctx->pcap = 64;
    ctx->pfd = malloc(ctx->pcap * sizeof(*ctx->pfd));
    ctx->pst = malloc(ctx->pcap * sizeof(*ctx->pst));
    if (!ctx->conns || !ctx->pfd || !ctx->pst) {
        st = weft_error(args->err, WEFT_ERR_NO_MEMORY, "tcp init: out of memory");
        goto fail;
    }
    ctx->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (ctx->efd < 0) {
        st = weft_error(args->err, weft_errno_status(errno), "tcp init: eventfd: %s",
                        strerror(errno));
        goto fail;
    }
    ctx->laddr = args->local;
    st = weft_sock_listen(&ctx->laddr, &ctx->lfd);
    if (st < 0) {
        st = weft_error(args->err, st, "rank %d: tcp transport cannot listen: %s", args->rank,
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

weft_status_t tcp_addr_parse(const struct tcp_ctx *ctx, int peer, const void *addr, size_t addrlen,
                             union weft_sockaddr *out, char *why, size_t whylen)
{
    if (addrlen != sizeof(*out)) {
        snprintf(why, whylen, "rank %d: tcp address of rank %d has %zu bytes, expected %zu",
                 ctx->rank, peer, addrlen, sizeof(*out));
        return WEFT_ERR_INVALID_ARG;
    }
    memcpy(out, addr, sizeof(*out));
    if (out->sa.sa_family != AF_INET && out->sa.sa_family != AF_INET6) {
        snprintf(why, whylen, "rank %d: tcp address of rank %d has address family %d", ctx->rank,
                 peer, (int)out->sa.sa_family);
        return WEFT_ERR_INVALID_ARG;
    }
    return WEFT_OK;
}

weft_status_t tcp_connect(void *vctx, int peer, const void *addr, size_t addrlen,
                          void **vconn)
{
    struct tcp_ctx *ctx = vctx;
    WEFT_TP_CONNECT_CHECK(ctx, addr, vconn, "tcp");
    if (peer < 0 || peer >= ctx->nranks || peer == ctx->rank)
        return weft_error_quiet(ctx->err, WEFT_ERR_INVALID_ARG,
                                "rank %d: tcp connect to rank %d: not a peer in 0..%d", ctx->rank,
                                peer, ctx->nranks - 1);
    union weft_sockaddr a;
    char why[160];
    if (tcp_addr_parse(ctx, peer, addr, addrlen, &a, why, sizeof(why)) != WEFT_OK)
        return weft_error_quiet(ctx->err, WEFT_ERR_INVALID_ARG, "%s", why);
    struct tcp_conn *c = tcp_conn_get(ctx, peer);
    if (c == NULL)
        return weft_error(ctx->err, WEFT_ERR_NO_MEMORY, "rank %d: no memory for a connection",
                          ctx->rank);
    if (c->have_addr && memcmp(&c->addr, &a, sizeof(a)) != 0)
        return weft_error_quiet(ctx->err, WEFT_ERR_INVALID_ARG,
                                "rank %d: tcp connect to rank %d twice with different addresses",
                                ctx->rank, peer);
    c->addr = a;
    c->have_addr = true;
    weft_sock_str(&a, c->addrstr, sizeof(c->addrstr));
    *vconn = c;
    return WEFT_OK;
}

void tcp_finalize(void *vctx)
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
    weft_admit_fini(&ctx->door);
    if (ctx->lfd >= 0)
        close(ctx->lfd);
    if (ctx->efd >= 0)
        close(ctx->efd);
    weft_req_pool_fini(&ctx->reqs);
    free(ctx->conns);
    free(ctx->pfd);
    free(ctx->pst);
    free(ctx);
}
