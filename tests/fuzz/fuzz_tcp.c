/*
 * fuzz_tcp.c - what a tcp peer sends after the handshake
 * (transports/tcp): the frame header of each message (tcp_frame_parse),
 * a whole stream of frames read by the real receive path into posted
 * receives, and the address a peer publishes in the rank table
 * (tcp_addr_parse).  A frame is accepted only with a length that fits the
 * receive; a stream delivers exactly what a reference reading of it says,
 * and a closed stream never leaves a receive waiting.
 *
 * Input: mode (mod 3), then
 *   0  seq u64, posted u32, whylen u8, header[24]
 *   1  rank u8, peer u8, strlen u8, address bytes (its length is addrlen)
 *   2  nreq u8 (1 + b % 8), posted u16 (% 2049) per receive, stream bytes
 */
#include <sys/socket.h>
#include <unistd.h>

#include "fuzz.h"
#include "base/sock.h"
#include "transports/tcp/tcp.h"

#define MAX_RECVS 8

static uint64_t le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* A transport context with what the receive path touches, listening (on
 * loopback, for nobody) so that its accept finds nothing rather than
 * failing.  tcp_finalize releases it. */
static struct tcp_ctx *fake_ctx(int rank, int nranks)
{
    static int lfd = -1;
    if (lfd < 0) {
        union weft_sockaddr a = {.in = {.sin_family = AF_INET}};
        a.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (weft_sock_listen(&a, &lfd) != WEFT_OK)
            abort();
    }
    struct tcp_ctx *ctx = calloc(1, sizeof(*ctx));
    if (ctx == NULL || (ctx->conns = calloc((size_t)nranks, sizeof(*ctx->conns))) == NULL)
        abort();
    ctx->rank = rank;
    ctx->nranks = nranks;
    ctx->nstreams = 1;
    ctx->lfd = lfd;
    ctx->efd = -1;
    return ctx;
}

static void fake_ctx_free(struct tcp_ctx *ctx)
{
    ctx->lfd = -1; /* kept for the next input */
    tcp_finalize(ctx);
}

static void frame(struct fuzz_in *in)
{
    uint64_t seq = fuzz_le(in, 8);
    size_t posted = (size_t)fuzz_le(in, 4);
    size_t whylen = fuzz_u8(in);
    uint8_t hdr[TCP_HDR_LEN];
    for (size_t i = 0; i < sizeof(hdr); i++)
        hdr[i] = fuzz_u8(in);
    struct tcp_ctx *ctx = fake_ctx(0, 2);
    struct tcp_conn *c = tcp_conn_get(ctx, 1);
    char *why = malloc(whylen ? whylen : 1);
    if (c == NULL || why == NULL)
        abort();
    size_t len = 12345;
    weft_status_t st = tcp_frame_parse(&c->recv[0], hdr, seq, posted, &len, why, whylen);
    bool framed = le(hdr, 4) == TCP_MAGIC && le(hdr + 4, 4) == 0 && le(hdr + 8, 8) == seq;
    if (st == WEFT_OK) {
        FUZZ_CHECK(framed && len == le(hdr + 16, 8) && len <= posted,
                   "frame of %zu bytes accepted for %zu posted", len, posted);
    } else {
        FUZZ_CHECK(st == WEFT_ERR_REMOTE, "status %d", st);
        FUZZ_CHECK(!framed || le(hdr + 16, 8) > posted, "good frame refused");
        FUZZ_CHECK(whylen == 0 || fuzz_text_ok(why, whylen), "reason unreadable");
        FUZZ_CHECK(whylen < 8 || strncmp(why, "rank 0: ", WEFT_MIN(8, whylen - 1)) == 0,
                   "reason '%s'", why);
    }
    free(why);
    fake_ctx_free(ctx);
}

static void address(struct fuzz_in *in)
{
    int rank = fuzz_u8(in) % 8;
    int peer = fuzz_u8(in) % 8;
    size_t slen = fuzz_u8(in);
    struct tcp_ctx *ctx = fake_ctx(rank, 8);
    /* Exactly the published bytes, so ASan sees any read past them. */
    uint8_t *addr = malloc(in->n ? in->n : 1);
    char *str = malloc(slen ? slen : 1);
    if (addr == NULL || str == NULL)
        abort();
    memcpy(addr, in->p, in->n);
    union weft_sockaddr a;
    char why[160];
    weft_status_t st = tcp_addr_parse(ctx, peer, addr, in->n, &a, why, sizeof(why));
    if (st == WEFT_OK) {
        FUZZ_CHECK(in->n == sizeof(a), "address of %zu bytes accepted", in->n);
        FUZZ_CHECK(a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6, "family %d",
                   a.sa.sa_family);
        /* What tcp_connect then does with it. */
        weft_sock_str(&a, str, slen);
        FUZZ_CHECK(slen == 0 || fuzz_text_ok(str, slen), "address string unreadable");
        (void)weft_sock_is_loopback(&a);
    } else {
        FUZZ_CHECK(st == WEFT_ERR_INVALID_ARG, "status %d", st);
        FUZZ_CHECK(fuzz_text_ok(why, sizeof(why)) && strncmp(why, "rank ", 5) == 0,
                   "reason '%s'", why);
    }
    free(addr);
    free(str);
    fake_ctx_free(ctx);
}

/* The real receive path (tcp_progress -> stream_recv) over a socketpair
 * whose other end sends the input and closes. */
static void stream(struct fuzz_in *in)
{
    int nreq = 1 + fuzz_u8(in) % MAX_RECVS;
    size_t posted[MAX_RECVS];
    char *buf[MAX_RECVS];
    void *req[MAX_RECVS];
    for (int k = 0; k < nreq; k++) {
        posted[k] = (size_t)fuzz_le(in, 2) % 2049;
        /* Exactly the posted bytes, so ASan sees any write past them. */
        if ((buf[k] = malloc(posted[k] ? posted[k] : 1)) == NULL)
            abort();
    }
    struct tcp_ctx *ctx = fake_ctx(0, 2);
    struct tcp_conn *c = tcp_conn_get(ctx, 1);
    int sv[2];
    if (c == NULL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    struct tcp_stream *st = &c->recv[0];
    st->fd = sv[0];
    st->installed = true;
    st->state = ST_READY;
    tcp_stream_sync(st);
    for (int k = 0; k < nreq; k++)
        FUZZ_CHECK(weft_tcp_ops.irecv(c, buf[k], posted[k], &req[k]) == WEFT_OK,
                   "irecv %d", k);
    size_t sent = 0;
    while (sent < in->n) {
        ssize_t n = send(sv[1], in->p + sent, in->n - sent, MSG_NOSIGNAL);
        if (n <= 0)
            break;
        sent += (size_t)n;
    }
    close(sv[1]);

    bool waiting = true;
    for (int i = 0; i < 16 && waiting; i++) {
        weft_tcp_ops.progress(ctx, 0);
        waiting = false;
        for (int k = 0; k < nreq; k++)
            waiting |= ((struct weft_req *)req[k])->status == WEFT_INPROGRESS;
    }
    FUZZ_CHECK(!waiting, "a receive still waits on a closed stream");

    /* The reference reading: frames in order until one is bad or cut. */
    const uint8_t *s = in->p;
    size_t off = 0;
    bool failed = false;
    for (int k = 0; k < nreq; k++) {
        const char *why = NULL;
        uint64_t len = 0;
        if (!failed) {
            if (sent - off < TCP_HDR_LEN) {
                why = "the peer closed the connection";
            } else if (le(s + off, 4) != TCP_MAGIC || le(s + off + 4, 4) != 0 ||
                       le(s + off + 8, 8) != (uint64_t)k) {
                why = "bad frame from rank 1 on stream 0";
            } else if ((len = le(s + off + 16, 8)) > posted[k]) {
                why = "bytes but the receive posted holds";
            } else if (sent - off - TCP_HDR_LEN < len) {
                why = "the peer closed the connection";
            }
            failed = why != NULL;
        }
        int done = 0;
        size_t got = 0;
        weft_status_t rc = weft_tcp_ops.test(req[k], &done, &got);
        FUZZ_CHECK(done, "receive %d not done", k);
        if (failed) {
            FUZZ_CHECK(rc == WEFT_ERR_REMOTE, "receive %d: status %d, expected a failure", k, rc);
            FUZZ_CHECK(why == NULL || strstr(c->base.errmsg, why), "receive %d: '%s' lacks '%s'", k,
                       c->base.errmsg, why);
            continue;
        }
        FUZZ_CHECK(rc == WEFT_OK, "receive %d: status %d (%s)", k, rc, c->base.errmsg);
        FUZZ_CHECK(got == len, "receive %d: %zu bytes, the frame says %llu", k, got,
                   (unsigned long long)len);
        FUZZ_CHECK(memcmp(buf[k], s + off + TCP_HDR_LEN, got) == 0, "receive %d: wrong bytes", k);
        off += TCP_HDR_LEN + got;
    }
    FUZZ_CHECK(fuzz_text_ok(c->base.errmsg, sizeof(c->base.errmsg)), "error record unreadable");
    for (int k = 0; k < nreq; k++)
        free(buf[k]);
    fake_ctx_free(ctx); /* closes sv[0] with the stream */
}

int weft_fuzz_tcp(const uint8_t *data, size_t size)
{
    static const fuzz_mode_t modes[] = {frame, address, stream};
    return fuzz_modes(data, size, modes, WEFT_ARRAY_SIZE(modes));
}

WEFT_FUZZ_ENTRY(weft_fuzz_tcp)
