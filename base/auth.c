/*
 * auth.c - the handshake of base/auth.h: message encoding and the acceptor
 * and connector state machines.  Nothing here logs or records errors; the
 * reason for a failure goes back through *why and the caller decides.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "base/auth.h"

enum {
    ACC_READ_HELLO = 0,
    ACC_WRITE_CHALLENGE,
    ACC_READ_PROOF,
    ACC_DONE,
    ACC_FAILED,
};

enum {
    CON_WRITE_HELLO = 0,
    CON_READ_CHALLENGE,
    CON_WRITE_PROOF,
    CON_DONE,
    CON_FAILED,
    CON_NO_RANDOM, /* begin() could not draw nonce_c; step() reports it */
};

#define NONCE_BYTES 16
#define MAC_BYTES 32
#define HELLO_NONCE_OFF (WEFT_AUTH_HELLO_LEN - NONCE_BYTES)

/* Holds the one formatted reason (a version mismatch); the pointer handed
 * out stays valid until the next such failure on the same thread. */
static _Thread_local char why_buf[64];

static void put_le(uint8_t *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void hello_encode(const struct weft_auth_hello *h, const uint8_t nonce[NONCE_BYTES],
                         uint8_t out[WEFT_AUTH_HELLO_LEN])
{
    memcpy(out, "WEFT", 4);
    put_le(out + 4, WEFT_AUTH_VERSION, 2);
    put_le(out + 6, h->kind, 2);
    put_le(out + 8, h->job, 8);
    put_le(out + 16, h->rank, 4);
    put_le(out + 20, h->nranks, 4);
    put_le(out + 24, h->index, 4);
    memcpy(out + HELLO_NONCE_OFF, nonce, NONCE_BYTES);
}

/* Decodes and checks a HELLO; returns a reason or NULL when acceptable. */
static const char *hello_decode(const uint8_t in[WEFT_AUTH_HELLO_LEN], uint64_t job,
                                struct weft_auth_hello *h)
{
    if (memcmp(in, "WEFT", 4) != 0)
        return "bad magic";
    unsigned version = (unsigned)get_le(in + 4, 2);
    if (version != WEFT_AUTH_VERSION) {
        snprintf(why_buf, sizeof(why_buf), "protocol version %u, expected %u", version,
                 (unsigned)WEFT_AUTH_VERSION);
        return why_buf;
    }
    h->kind = (uint16_t)get_le(in + 6, 2);
    h->job = get_le(in + 8, 8);
    h->rank = (uint32_t)get_le(in + 16, 4);
    h->nranks = (uint32_t)get_le(in + 20, 4);
    h->index = (uint32_t)get_le(in + 24, 4);
    if (h->kind != WEFT_AUTH_BOOTSTRAP && h->kind != WEFT_AUTH_DATA)
        return "bad connection kind";
    if (h->job != job)
        return "wrong job";
    if (h->nranks == 0)
        return "zero ranks";
    if (h->rank >= h->nranks)
        return "rank out of range";
    return NULL;
}

/* HMAC(secret, label HELLO nonce_a); label is "weft-acc" or "weft-con" so
 * neither side's MAC can be reflected back as the other's. */
static void handshake_mac(const uint8_t *secret, const char *label,
                          const uint8_t hello[WEFT_AUTH_HELLO_LEN],
                          const uint8_t nonce_a[NONCE_BYTES], uint8_t out[MAC_BYTES])
{
    uint8_t msg[8 + WEFT_AUTH_HELLO_LEN + NONCE_BYTES];
    memcpy(msg, label, 8);
    memcpy(msg + 8, hello, WEFT_AUTH_HELLO_LEN);
    memcpy(msg + 8 + WEFT_AUTH_HELLO_LEN, nonce_a, NONCE_BYTES);
    weft_hmac_sha256(secret, WEFT_SECRET_BYTES, msg, sizeof(msg), out);
}

/* Moves bytes of the current message; OK when all `want` are done,
 * INPROGRESS when the socket would block, an error with *why otherwise. */
static weft_status_t io_step(int fd, uint8_t *buf, size_t *have, size_t want, bool sending,
                             const char **why)
{
    while (*have < want) {
        ssize_t n = sending ? send(fd, buf + *have, want - *have, MSG_DONTWAIT | MSG_NOSIGNAL)
                            : recv(fd, buf + *have, want - *have, MSG_DONTWAIT);
        if (n > 0) {
            *have += (size_t)n;
            continue;
        }
        if (n == 0) {
            *why = "peer closed during handshake";
            return WEFT_ERR_REMOTE;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return WEFT_INPROGRESS;
        if (errno == ECONNRESET || errno == EPIPE) {
            *why = "connection reset during handshake";
            return WEFT_ERR_REMOTE;
        }
        *why = "socket error during handshake";
        return WEFT_ERR_SYSTEM;
    }
    return WEFT_OK;
}

static bool deadline_passed(uint64_t deadline_ns)
{
    return deadline_ns != 0 && weft_now_ns() > deadline_ns;
}

void weft_auth_accept_begin(struct weft_auth_acceptor *a, int fd, uint64_t deadline_ns)
{
    memset(a, 0, sizeof(*a));
    a->fd = fd;
    a->state = ACC_READ_HELLO;
    a->deadline_ns = deadline_ns;
}

static weft_status_t accept_fail(struct weft_auth_acceptor *a, weft_status_t st, const char **why,
                                 const char *reason)
{
    a->state = ACC_FAILED;
    if (reason != NULL)
        *why = reason;
    return st;
}

weft_status_t weft_auth_accept_step(struct weft_auth_acceptor *a, const uint8_t *secret,
                                    uint64_t job, const char **why)
{
    const char *dummy;
    if (why == NULL)
        why = &dummy;
    if (a->state == ACC_DONE)
        return WEFT_OK;
    if (a->state == ACC_FAILED) {
        *why = "handshake already failed";
        return WEFT_ERR_INTERNAL;
    }
    if (deadline_passed(a->deadline_ns))
        return accept_fail(a, WEFT_ERR_TIMEOUT, why, "handshake timed out");

    weft_status_t st;
    uint8_t mac[MAC_BYTES];
    switch (a->state) {
    case ACC_READ_HELLO:
        st = io_step(a->fd, a->buf, &a->have, WEFT_AUTH_HELLO_LEN, false, why);
        if (st != WEFT_OK)
            return st == WEFT_INPROGRESS ? st : accept_fail(a, st, why, NULL);
        memcpy(a->hello_raw, a->buf, WEFT_AUTH_HELLO_LEN);
        const char *bad = hello_decode(a->hello_raw, job, &a->hello);
        if (bad != NULL)
            return accept_fail(a, WEFT_ERR_REMOTE, why, bad);
        st = weft_random_bytes(a->nonce_a, NONCE_BYTES);
        if (st != WEFT_OK)
            return accept_fail(a, st, why, "no randomness for the challenge");
        memcpy(a->buf, a->nonce_a, NONCE_BYTES);
        handshake_mac(secret, "weft-acc", a->hello_raw, a->nonce_a, a->buf + NONCE_BYTES);
        a->have = 0;
        a->state = ACC_WRITE_CHALLENGE;
        /* The socket is almost always writable now: try at once. */
        /* fall through */
    case ACC_WRITE_CHALLENGE:
        st = io_step(a->fd, a->buf, &a->have, WEFT_AUTH_CHALLENGE_LEN, true, why);
        if (st != WEFT_OK)
            return st == WEFT_INPROGRESS ? st : accept_fail(a, st, why, NULL);
        a->have = 0;
        a->state = ACC_READ_PROOF;
        /* fall through */
    case ACC_READ_PROOF:
        st = io_step(a->fd, a->buf, &a->have, WEFT_AUTH_PROOF_LEN, false, why);
        if (st != WEFT_OK)
            return st == WEFT_INPROGRESS ? st : accept_fail(a, st, why, NULL);
        handshake_mac(secret, "weft-con", a->hello_raw, a->nonce_a, mac);
        if (!weft_ct_equal(mac, a->buf, MAC_BYTES))
            return accept_fail(a, WEFT_ERR_REMOTE, why, "connector does not know the job secret");
        a->state = ACC_DONE;
        return WEFT_OK;
    default:
        return accept_fail(a, WEFT_ERR_INTERNAL, why, "acceptor in an unknown state");
    }
}

short weft_auth_accept_events(const struct weft_auth_acceptor *a)
{
    switch (a->state) {
    case ACC_READ_HELLO:
    case ACC_READ_PROOF: return POLLIN;
    case ACC_WRITE_CHALLENGE: return POLLOUT;
    default: return 0;
    }
}

void weft_auth_connect_begin(struct weft_auth_connector *c, int fd,
                             const struct weft_auth_hello *hello, uint64_t deadline_ns)
{
    uint8_t nonce_c[NONCE_BYTES];
    memset(c, 0, sizeof(*c));
    c->fd = fd;
    c->deadline_ns = deadline_ns;
    c->state = CON_WRITE_HELLO;
    if (weft_random_bytes(nonce_c, sizeof(nonce_c)) != WEFT_OK)
        c->state = CON_NO_RANDOM;
    hello_encode(hello, nonce_c, c->hello_raw);
    memcpy(c->buf, c->hello_raw, WEFT_AUTH_HELLO_LEN);
}

static weft_status_t connect_fail(struct weft_auth_connector *c, weft_status_t st,
                                  const char **why, const char *reason)
{
    c->state = CON_FAILED;
    if (reason != NULL)
        *why = reason;
    return st;
}

weft_status_t weft_auth_connect_step(struct weft_auth_connector *c, const uint8_t *secret,
                                     const char **why)
{
    const char *dummy;
    if (why == NULL)
        why = &dummy;
    if (c->state == CON_DONE)
        return WEFT_OK;
    if (c->state == CON_FAILED) {
        *why = "handshake already failed";
        return WEFT_ERR_INTERNAL;
    }
    if (c->state == CON_NO_RANDOM)
        return connect_fail(c, WEFT_ERR_SYSTEM, why, "no randomness for the hello nonce");
    if (deadline_passed(c->deadline_ns))
        return connect_fail(c, WEFT_ERR_TIMEOUT, why, "handshake timed out");

    weft_status_t st;
    uint8_t mac[MAC_BYTES];
    switch (c->state) {
    case CON_WRITE_HELLO:
        st = io_step(c->fd, c->buf, &c->have, WEFT_AUTH_HELLO_LEN, true, why);
        if (st != WEFT_OK)
            return st == WEFT_INPROGRESS ? st : connect_fail(c, st, why, NULL);
        c->have = 0;
        c->state = CON_READ_CHALLENGE;
        /* fall through */
    case CON_READ_CHALLENGE:
        st = io_step(c->fd, c->buf, &c->have, WEFT_AUTH_CHALLENGE_LEN, false, why);
        if (st != WEFT_OK)
            return st == WEFT_INPROGRESS ? st : connect_fail(c, st, why, NULL);
        /* buf = nonce_a | acceptor MAC */
        handshake_mac(secret, "weft-acc", c->hello_raw, c->buf, mac);
        if (!weft_ct_equal(mac, c->buf + NONCE_BYTES, MAC_BYTES))
            return connect_fail(c, WEFT_ERR_REMOTE, why, "acceptor does not know the job secret");
        handshake_mac(secret, "weft-con", c->hello_raw, c->buf, mac);
        memcpy(c->buf, mac, MAC_BYTES);
        c->have = 0;
        c->state = CON_WRITE_PROOF;
        /* fall through */
    case CON_WRITE_PROOF:
        st = io_step(c->fd, c->buf, &c->have, WEFT_AUTH_PROOF_LEN, true, why);
        if (st != WEFT_OK)
            return st == WEFT_INPROGRESS ? st : connect_fail(c, st, why, NULL);
        c->state = CON_DONE;
        return WEFT_OK;
    default:
        return connect_fail(c, WEFT_ERR_INTERNAL, why, "connector in an unknown state");
    }
}

short weft_auth_connect_events(const struct weft_auth_connector *c)
{
    switch (c->state) {
    case CON_WRITE_HELLO:
    case CON_WRITE_PROOF: return POLLOUT;
    case CON_READ_CHALLENGE: return POLLIN;
    default: return 0;
    }
}

weft_status_t weft_auth_connect(int fd, const uint8_t *secret, const struct weft_auth_hello *hello,
                                uint64_t deadline_ns, const char **why)
{
    struct weft_auth_connector c;
    weft_auth_connect_begin(&c, fd, hello, deadline_ns);
    for (;;) {
        weft_status_t st = weft_auth_connect_step(&c, secret, why);
        if (st != WEFT_INPROGRESS)
            return st;
        struct pollfd p = {.fd = fd, .events = weft_auth_connect_events(&c)};
        /* A poll that times out is fine: the next step reports the deadline. */
        if (poll(&p, 1, weft_ms_left(deadline_ns)) < 0 && errno != EINTR) {
            if (why != NULL)
                *why = "poll failed during handshake";
            return WEFT_ERR_SYSTEM;
        }
    }
}
