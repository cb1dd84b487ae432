/*
 * admit.c - the door of a flooded listener (admit.h): the table of accepted
 * sockets before their proof, who leaves it when it is full, and drop logs
 * that name the first few and then only count.
 */
#include "base/admit.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/sock.h"

#define DROP_LOG 8    /* drops logged one by one; then at each power of two */
#define REST_NS 5000000ull

weft_status_t weft_admit_init(struct weft_admit *a, struct weft_errsink *err, uint32_t subsys,
                              const char *who, uint64_t handshake_ns)
{
    memset(a, 0, sizeof(*a));
    a->err = err;
    a->subsys = subsys;
    a->handshake_ns = handshake_ns;
    snprintf(a->who, sizeof(a->who), "%s", who);
    a->conn = malloc(WEFT_ADMIT_MAX * sizeof(*a->conn));
    a->pfd = malloc((WEFT_ADMIT_MAX + 1) * sizeof(*a->pfd));
    if (a->conn == NULL || a->pfd == NULL) {
        weft_admit_fini(a);
        return weft_error(err, WEFT_ERR_NO_MEMORY, "%s: out of memory for the listener", who);
    }
    return WEFT_OK;
}

const char *weft_admit_from(const struct weft_admit *a, int i, char *buf, size_t len)
{
    union weft_sockaddr s;
    memset(&s, 0, sizeof(s));
    memcpy(&s, &a->conn[i].from, sizeof(a->conn[i].from));
    return weft_sock_str(&s, buf, len);
}

/* Removes conn[i]: the last one takes its place. */
static void conn_remove(struct weft_admit *a, int i)
{
    free(a->conn[i].priv);
    a->conn[i] = a->conn[--a->n];
}

void weft_admit_drop(struct weft_admit *a, int i, const char *why)
{
    struct weft_admit_conn *c = &a->conn[i];
    struct linger lg = {.l_onoff = 1, .l_linger = 0};
    char from[64];
    unsigned long d = ++a->dropped;
    if (d <= DROP_LOG)
        WEFT_WARN(a->subsys, "%s: dropped a connection from %s: %s", a->who,
                  weft_admit_from(a, i, from, sizeof(from)), why);
    else if ((d & (d - 1)) == 0)
        WEFT_WARN(a->subsys, "%s: %lu connections dropped so far (the others at TRACE); "
                  "this one from %s: %s", a->who, d, weft_admit_from(a, i, from, sizeof(from)),
                  why);
    else
        WEFT_TRACE(a->subsys, "%s: dropped a connection from %s: %s", a->who,
                   weft_admit_from(a, i, from, sizeof(from)), why);
    if (c->hello) /* before it, the peer has no challenge to answer */
        setsockopt(c->acc.fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
    close(c->acc.fd);
    conn_remove(a, i);
}

int weft_admit_take(struct weft_admit *a, int i)
{
    int fd = a->conn[i].acc.fd;
    conn_remove(a, i);
    return fd;
}

void weft_admit_fini(struct weft_admit *a)
{
    while (a->n > 0) {
        WEFT_TRACE(a->subsys, "%s: closed a connection in its handshake: the listener closes",
                   a->who);
        close(a->conn[0].acc.fd);
        conn_remove(a, 0);
    }
    if (a->dropped > DROP_LOG)
        WEFT_WARN(a->subsys, "%s: dropped %lu connections in all (%d named)", a->who, a->dropped,
                  DROP_LOG);
    free(a->conn);
    free(a->pfd);
    a->conn = NULL;
    a->pfd = NULL;
    a->dropped = 0;
}

weft_status_t weft_admit_step(struct weft_admit *a, int i, const uint8_t *secret, uint64_t job,
                              const char **why)
{
    struct weft_admit_conn *c = &a->conn[i];
    if (c->authed)
        return WEFT_OK;
    weft_status_t st = weft_auth_accept_step(&c->acc, secret, job, why);
    /* The acceptor decodes the HELLO before it answers, and only one of
     * this job gets an answer: a kind there means one came. */
    if (st == WEFT_INPROGRESS && !c->hello && c->acc.hello.kind != 0) {
        c->hello = true;
        c->since = weft_now_ns();
        c->acc.deadline_ns = c->since + a->handshake_ns;
    }
    c->authed = st == WEFT_OK;
    return st;
}

int weft_admit_fill(const struct weft_admit *a, int lfd, struct pollfd *pfd)
{
    for (int i = 0; i < a->n; i++) {
        const struct weft_admit_conn *c = &a->conn[i];
        pfd[i] = (struct pollfd){.fd = c->acc.fd,
                                 .events = c->authed ? POLLIN : weft_auth_accept_events(&c->acc)};
    }
    pfd[a->n] = (struct pollfd){.fd = weft_now_ns() < a->rest_until ? -1 : lfd, .events = POLLIN};
    return a->n + 1;
}

bool weft_admit_mark(struct weft_admit *a, const struct pollfd *pfd)
{
    /* Only connections with news (or past their deadline) cost a call. */
    uint64_t now = weft_now_ns();
    for (int i = 0; i < a->n; i++)
        a->conn[i].ready = pfd[i].revents != 0 || now > a->conn[i].acc.deadline_ns;
    return (pfd[a->n].revents & POLLIN) != 0;
}

weft_status_t weft_admit_poll(struct weft_admit *a, int lfd, int timeout_ms, bool *incoming)
{
    int n = weft_admit_fill(a, lfd, a->pfd);
    if (poll(a->pfd, (nfds_t)n, timeout_ms) < 0) {
        if (errno != EINTR)
            return weft_error(a->err, WEFT_ERR_SYSTEM, "%s: poll on %d sockets: %s", a->who, n,
                              strerror(errno));
        for (int i = 0; i < n; i++)
            a->pfd[i].revents = 0;
    }
    *incoming = weft_admit_mark(a, a->pfd);
    return WEFT_OK;
}

weft_status_t weft_admit_serve(struct weft_admit *a, weft_admit_step_fn step, void *arg)
{
    for (int i = 0; i < a->n;) {
        bool kept = true;
        if (a->conn[i].ready) {
            a->conn[i].ready = false;
            WEFT_CHECK(step(arg, i, &kept));
        }
        i += kept;
    }
    return WEFT_OK;
}

/* The slot to free for a newcomer: the oldest connection without a HELLO,
 * else the oldest whose answered HELLO is over WEFT_ADMIT_HELLO_MS old (a
 * rank answers within a round trip; ranks arriving by the thousand must
 * not push each other out); -1 when none may go. */
static int victim(const struct weft_admit *a)
{
    uint64_t old = weft_now_ns() - (uint64_t)WEFT_ADMIT_HELLO_MS * 1000000;
    int v = -1;
    for (int i = 0; i < a->n; i++) {
        const struct weft_admit_conn *p = &a->conn[i], *q = v >= 0 ? &a->conn[v] : NULL;
        if (p->authed || (p->hello && p->since > old))
            continue;
        if (q == NULL || (q->hello && !p->hello) || (q->hello == p->hello && p->since < q->since))
            v = i;
    }
    return v;
}

weft_status_t weft_admit_accept(struct weft_admit *a, int lfd, weft_admit_step_fn step, void *arg)
{
    uint64_t hello_ns = WEFT_MIN((uint64_t)WEFT_ADMIT_HELLO_MS * 1000000, a->handshake_ns);
    for (int k = 0; k < WEFT_ADMIT_BATCH; k++) {
        if (a->n == WEFT_ADMIT_MAX) {
            int v = victim(a);
            if (v < 0) { /* every slot holds a rank, likely: their turn first */
                a->rest_until = weft_now_ns() + REST_NS;
                break;
            }
            weft_admit_drop(a, v, "too many connections in their handshake (oldest goes)");
        }
        struct weft_admit_conn *c = &a->conn[a->n];
        socklen_t len = sizeof(c->from);
        /* Not weft_sock_accept: its tuning costs four calls per stranger. */
        int fd = accept4(lfd, &c->from.sa, &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break; /* the queue is empty */
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
                continue;
            /* Out of descriptors or buffers: a stranger gives its own back. */
            int v = victim(a);
            if (v < 0) {
                a->rest_until = weft_now_ns() + REST_NS;
                break;
            }
            weft_admit_drop(a, v, "out of descriptors to accept with (oldest goes)");
            continue;
        }
        c->since = weft_now_ns();
        c->hello = c->authed = false;
        c->ready = true;
        c->priv = NULL;
        weft_auth_accept_begin(&c->acc, fd, c->since + hello_ns);
        a->n++;
        a->accepted++;
    }
    return weft_admit_serve(a, step, arg);
}
