/*
 * shm.c - the shared-memory transport's data path.  Each rank owns one
 * segment with an incoming ring per peer; a sender copies chunks into
 * slots of its ring in the receiver's segment, the receiver copies them
 * out (or, for large messages, pulls the sender's buffer directly with
 * process_vm_readv).  Slot flags are C11 atomics: no lock and no syscall on
 * the data path.  A waiting rank sleeps on a futex in its own segment that
 * peers ring only when it sleeps.  Setup is in shm_setup.c.
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "transports/shm/shm.h"
#include "transports/transport.h"

/* ---- queues --------------------------------------------------------------- */

/* The oldest request of a queue, or NULL. */
static struct shm_req *queue_head(const struct weft_req_queue *q)
{
    return (struct shm_req *)q->head;
}

/* Keeps `active` true to the invariant of shm_conn. */
static void conn_sync(struct shm_conn *c)
{
    struct shm_ctx *ctx = c->ctx;
    bool want = c->sq.head != NULL || c->rq.head != NULL;
    if (want && !c->active) {
        LIST_INSERT_HEAD(&ctx->work, c, work);
        ctx->nactive++;
        c->moved = true; /* a fresh wait is not a stall */
    } else if (!want && c->active) {
        LIST_REMOVE(c, work);
        ctx->nactive--;
    }
    c->active = want;
}

/* ---- waking a peer ------------------------------------------------------- */

static long futex_op(_Atomic uint32_t *word, int op, uint32_t val, const struct timespec *ts)
{
    /* Not FUTEX_PRIVATE: the word sits in a shared mapping and the waker
     * is another process. */
    return syscall(SYS_futex, (uint32_t *)word, op, val, ts, NULL, 0);
}

/* Rings the peer's doorbell if it sleeps.  The fence pairs with the one a
 * sleeper makes between raising `sleeping` and looking at the rings one
 * last time: either it sees what we just published, or we see it
 * sleeping.  Nobody asleep: no store to its line and no syscall. */
void shm_signal(struct shm_conn *c)
{
    atomic_thread_fence(memory_order_seq_cst);
    struct shm_seg *s = c->peer_seg;
    if (WEFT_UNLIKELY(atomic_load_explicit(&s->sleeping, memory_order_relaxed))) {
        atomic_fetch_add_explicit(&s->doorbell, 1, memory_order_release);
        futex_op(&s->doorbell, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* ---- failure ------------------------------------------------------------- */

/* What failing means here: tell the peer (it reads our ring's failure
 * record when it stalls) and fail every queued request. */
static void conn_close(struct weft_conn *base, weft_status_t status)
{
    struct shm_conn *c = (struct shm_conn *)base;
    if (c->rx && atomic_load_explicit(&c->rx->failed, memory_order_relaxed) == 0) {
        snprintf(c->rx->why, sizeof(c->rx->why), "%s", c->base.errmsg);
        atomic_store_explicit(&c->rx->failed, 1, memory_order_release);
        shm_signal(c);
    }
    weft_req_queue_fail(&c->sq, status);
    weft_req_queue_fail(&c->rq, status);
    conn_sync(c);
}

void shm_conn_fail(struct shm_conn *c, weft_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    weft_conn_vfail(&c->base, conn_close, status, fmt, ap);
    va_end(ap);
}

static bool conn_send(struct shm_conn *c);
static bool conn_recv(struct shm_conn *c);

void shm_peer_failure(const struct shm_conn *c, char *msg, size_t len)
{
    char why[SHM_WHY_LEN];
    memcpy(why, c->tx->why, sizeof(why)); /* the peer's bytes: terminate */
    why[sizeof(why) - 1] = '\0';
    snprintf(msg, len, "rank %d: the shared-memory connection to rank %d failed on its side: %s",
             c->ctx->rank, c->peer, why);
}

/* The peer failed the connection (or closed its transport) and said why.
 * What it published before that is still delivered: our look at the slots
 * may have come before the flag we just saw, so look again.  Returns true
 * if the conn moved or failed. */
static bool conn_check_peer_failed(struct shm_conn *c)
{
    if (WEFT_LIKELY(atomic_load_explicit(&c->tx->failed, memory_order_acquire) == 0))
        return false;
    bool moved = false;
    if (c->sq.head)
        moved |= conn_send(c);
    if (c->rq.head && c->base.err == WEFT_OK)
        moved |= conn_recv(c);
    if (moved || c->base.err != WEFT_OK)
        return true;
    char msg[SHM_FAILURE_LEN];
    shm_peer_failure(c, msg, sizeof(msg));
    shm_conn_fail(c, WEFT_ERR_REMOTE, "%s", msg);
    return true;
}

/* ---- sending -------------------------------------------------------------- */

static bool want_cma(const struct shm_conn *c, const struct shm_req *r)
{
    size_t min = c->ctx->cma_min;
    return min > 0 && r->base.len >= min && !r->no_cma &&
           atomic_load_explicit(&c->tx->cma_ok, memory_order_relaxed) != 0;
}

/* Fills slots with queued sends.  A CMA send holds the queue until the
 * peer acknowledges it (its buffer is borrowed until then, and a refusal
 * must be resent before any later message).  Returns true if it moved. */
static bool conn_send(struct shm_conn *c)
{
    struct shm_ctx *ctx = c->ctx;
    struct shm_ring *ring = c->tx;
    const uint32_t n = c->tx_nslots;
    bool moved = false;
    struct shm_req *r;
    while ((r = queue_head(&c->sq)) != NULL) {
        if (r->cma) {
            struct shm_slot *s = &ring->slot[r->cma_slot % n];
            if (atomic_load_explicit(&s->full, memory_order_acquire))
                break; /* the peer is still pulling */
            moved = true;
            if (s->nack) {
                /* The peer cannot pull: the same message, through the ring. */
                r->cma = false;
                r->no_cma = true;
                r->started = false;
                r->done = 0;
                ctx->stats.cma_nacks++;
                continue;
            }
            ctx->stats.cma_sends++;
            weft_req_complete(&c->sq, WEFT_OK);
            continue;
        }
        uint64_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
        struct shm_slot *s = &ring->slot[head % n];
        if (atomic_load_explicit(&s->full, memory_order_acquire))
            break; /* ring full */
        s->seq = r->seq;
        s->msglen = r->base.len;
        s->nack = 0;
        if (!r->started && want_cma(c, r)) {
            s->kind = SHM_KIND_CMA;
            s->addr = (uint64_t)(uintptr_t)r->base.buf;
            s->off = 0;
            s->len = r->base.len;
            r->cma = true;
            r->cma_slot = head;
        } else {
            size_t chunk = WEFT_MIN(c->tx_slot_bytes, r->base.len - r->done);
            if (chunk > 0)
                memcpy(c->tx_data + (head % n) * c->tx_slot_bytes, r->base.buf + r->done, chunk);
            s->kind = SHM_KIND_DATA;
            s->off = r->done;
            s->len = chunk;
            r->done += chunk;
        }
        r->started = true;
        atomic_store_explicit(&s->full, 1, memory_order_release);
        atomic_store_explicit(&ring->head, head + 1, memory_order_relaxed);
        shm_signal(c);
        moved = true;
        if (!r->cma && r->done == r->base.len) {
            ctx->stats.ring_sends++;
            weft_req_complete(&c->sq, WEFT_OK);
        }
    }
    return moved;
}

/* ---- receiving ------------------------------------------------------------ */

/* Pulls len bytes at the peer's addr into buf.  0, or the errno. */
static int cma_pull(struct shm_conn *c, char *buf, uint64_t addr, size_t len)
{
    size_t got = 0;
    while (got < len) {
        size_t want = WEFT_MIN((size_t)SHM_CMA_CHUNK, len - got);
        struct iovec local = {buf + got, want};
        struct iovec remote = {(void *)(uintptr_t)(addr + got), want};
        ssize_t k = process_vm_readv(c->pid, &local, 1, &remote, 1, 0);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        if (k == 0)
            return EFAULT;
        got += (size_t)k;
    }
    return 0;
}

/* Frees slot s (position tail) for the producer. */
static void slot_release(struct shm_conn *c, struct shm_slot *s, uint64_t tail)
{
    atomic_store_explicit(&s->full, 0, memory_order_release);
    atomic_store_explicit(&c->rx->tail, tail + 1, memory_order_relaxed);
    shm_signal(c);
}

/* We cannot pull with process_vm_readv: say so once, stop every peer from
 * trying (their next large sends take the ring) and refuse this one. */
static void cma_give_up(struct shm_conn *c, struct shm_slot *s, uint64_t tail, int err)
{
    struct shm_ctx *ctx = c->ctx;
    if (!ctx->cma_broken)
        WEFT_INFO(WEFT_SUB_NET,
                  "rank %d: process_vm_readv from rank %d (pid %d) failed (%s); large "
                  "shared-memory messages go through the ring from now on",
                  ctx->rank, c->peer, (int)c->pid, strerror(err));
    ctx->cma_broken = true;
    for (int p = 0; p < ctx->nranks; p++)
        if (ctx->conns[p])
            atomic_store_explicit(&ctx->conns[p]->rx->cma_ok, 0, memory_order_relaxed);
    s->nack = 1;
    slot_release(c, s, tail);
}

/* Takes filled slots into posted receives.  Returns true if it moved. */
static bool conn_recv(struct shm_conn *c)
{
    struct shm_ctx *ctx = c->ctx;
    struct shm_ring *ring = c->rx;
    const uint32_t n = ctx->nslots;
    bool moved = false;
    struct shm_req *r;
    while ((r = queue_head(&c->rq)) != NULL) {
        uint64_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
        struct shm_slot *s = &ring->slot[tail % n];
        if (!atomic_load_explicit(&s->full, memory_order_acquire))
            break;
        /* Read the descriptor once: the peer's bytes, checked before use. */
        uint32_t kind = s->kind;
        uint64_t seq = s->seq, msglen = s->msglen, off = s->off, len = s->len, addr = s->addr;
        if (seq != r->seq || (kind != SHM_KIND_DATA && kind != SHM_KIND_CMA) ||
            (r->started && msglen != r->base.bytes)) {
            shm_conn_fail(c, WEFT_ERR_REMOTE,
                          "rank %d: bad slot from rank %d (message %llu of %llu bytes, kind %u; "
                          "expected message %llu)",
                          ctx->rank, c->peer, (unsigned long long)seq,
                          (unsigned long long)msglen, kind, (unsigned long long)r->seq);
            return true;
        }
        if (!r->started) {
            if (msglen > r->base.len) {
                shm_conn_fail(c, WEFT_ERR_REMOTE,
                              "rank %d: rank %d sent %llu bytes but the receive posted holds "
                              "%zu (message %llu)",
                              ctx->rank, c->peer, (unsigned long long)msglen, r->base.len,
                              (unsigned long long)seq);
                return true;
            }
            r->base.bytes = (size_t)msglen;
            r->started = true;
        }
        moved = true;
        if (kind == SHM_KIND_CMA) {
            if (ctx->cma_broken) {
                s->nack = 1;
                slot_release(c, s, tail);
                continue;
            }
            int err = cma_pull(c, r->base.buf, addr, (size_t)msglen);
            if (err == EPERM || err == ENOSYS) {
                cma_give_up(c, s, tail, err);
                continue;
            }
            if (err != 0) {
                if (err == ESRCH || shm_peer_dead(c))
                    shm_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: rank %d (pid %d) exited",
                                  ctx->rank, c->peer, (int)c->pid);
                else
                    shm_conn_fail(c, WEFT_ERR_REMOTE,
                                  "rank %d: process_vm_readv of %llu bytes from rank %d (pid "
                                  "%d): %s",
                                  ctx->rank, (unsigned long long)msglen, c->peer, (int)c->pid,
                                  strerror(err));
                return true;
            }
            r->done = (size_t)msglen;
            if (r->take)
                r->take(r->take_arg, 0, r->base.buf, (size_t)msglen);
            ctx->stats.cma_pulls++;
            slot_release(c, s, tail);
        } else {
            if (off != r->done || len > ctx->slot_bytes || len > msglen - off) {
                shm_conn_fail(c, WEFT_ERR_REMOTE,
                              "rank %d: bad slot from rank %d (message %llu: %llu bytes at "
                              "offset %llu, expected offset %zu of %llu)",
                              ctx->rank, c->peer, (unsigned long long)seq,
                              (unsigned long long)len, (unsigned long long)off, r->done,
                              (unsigned long long)msglen);
                return true;
            }
            const char *data = c->rx_data + (tail % n) * ctx->slot_bytes;
            if (len > 0 && !(r->take && r->take(r->take_arg, (size_t)off, data, (size_t)len)))
                memcpy(r->base.buf + off, data, (size_t)len);
            r->done += (size_t)len;
            slot_release(c, s, tail);
        }
        if (r->done == r->base.bytes)
            weft_req_complete(&c->rq, WEFT_OK);
    }
    return moved;
}

/* ---- progress ------------------------------------------------------------- */

/* One pass over every conn with requests.  Returns true if bytes moved. */
static bool ctx_pass(struct shm_ctx *ctx)
{
    bool moved = false;
    struct shm_conn *next;
    for (struct shm_conn *c = LIST_FIRST(&ctx->work); c; c = next) {
        next = LIST_NEXT(c, work); /* failing c unlinks c only */
        bool m = false;
        if (c->sq.head)
            m |= conn_send(c);
        if (c->rq.head && c->base.err == WEFT_OK)
            m |= conn_recv(c);
        if (m)
            c->moved = true;
        else if (c->base.err == WEFT_OK)
            m = conn_check_peer_failed(c);
        if (c->base.err == WEFT_OK)
            conn_sync(c);
        moved |= m;
    }
    return moved;
}

/* Fails the conns whose peer process is gone.  Only conns that have not
 * moved since the last check are looked at, at most every SHM_CHECK_NS:
 * this is a syscall per peer, kept off the data path. */
static bool ctx_check_peers(struct shm_ctx *ctx)
{
    uint64_t now = weft_now_ns();
    if (now < ctx->next_check)
        return false;
    ctx->next_check = now + SHM_CHECK_NS;
    bool failed = false;
    struct shm_conn *next;
    for (struct shm_conn *c = LIST_FIRST(&ctx->work); c; c = next) {
        next = LIST_NEXT(c, work);
        if (c->moved) {
            c->moved = false;
            continue;
        }
        if (!shm_peer_dead(c))
            continue;
        /* What it published before it died is still ours to take. */
        if (c->sq.head)
            conn_send(c);
        if (c->rq.head)
            conn_recv(c);
        if (c->base.err == WEFT_OK && (c->sq.head || c->rq.head))
            shm_conn_fail(c, WEFT_ERR_REMOTE, "rank %d: rank %d (pid %d) exited", ctx->rank,
                          c->peer, (int)c->pid);
        conn_sync(c);
        failed = true;
    }
    return failed;
}

static weft_status_t shm_progress(void *vctx, int timeout_ms)
{
    struct shm_ctx *ctx = vctx;
    if (ctx == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "shm progress: NULL context");
    bool moved = ctx_pass(ctx);
    if (moved)
        return WEFT_OK;
    if (timeout_ms <= 0) {
        /* Callers that never wait here (a communicator that also has tcp
         * sleeps in tcp's poll) still learn of a dead peer. */
        if ((++ctx->passes & 63) == 0 && ctx->nactive > 0)
            ctx_check_peers(ctx);
        return WEFT_OK;
    }
    if (ctx->nactive > 0 && ctx_check_peers(ctx))
        return WEFT_OK;

    /* Sleep until a peer rings.  Raise `sleeping`, fence, then look once
     * more: a peer publishing after our look sees the flag (shm_signal). */
    struct shm_seg *seg = ctx->seg;
    atomic_store_explicit(&seg->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    uint32_t bell = atomic_load_explicit(&seg->doorbell, memory_order_acquire);
    if (atomic_exchange(&ctx->wake_pending, 0) || ctx_pass(ctx)) {
        atomic_store_explicit(&seg->sleeping, 0, memory_order_relaxed);
        return WEFT_OK;
    }
    /* A dead peer rings nobody: wake up to check on it. */
    int ms = timeout_ms;
    if (ctx->nactive > 0)
        ms = WEFT_MIN(ms, (int)(SHM_CHECK_NS / 1000000));
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    ctx->stats.sleeps++;
    futex_op(&seg->doorbell, FUTEX_WAIT, bell, &ts);
    atomic_store_explicit(&seg->sleeping, 0, memory_order_relaxed);
    atomic_exchange(&ctx->wake_pending, 0);
    ctx_pass(ctx);
    return WEFT_OK;
}

static void shm_wakeup(void *vctx)
{
    struct shm_ctx *ctx = vctx;
    /* Pending until a wait consumes it, so a wakeup just before the wait
     * is not lost (the seq_cst pair is the same handshake as shm_signal). */
    atomic_store(&ctx->wake_pending, 1);
    if (atomic_load(&ctx->seg->sleeping)) {
        atomic_fetch_add_explicit(&ctx->seg->doorbell, 1, memory_order_release);
        futex_op(&ctx->seg->doorbell, FUTEX_WAKE, INT_MAX, NULL);
    }
}

/* ---- sleeping in another transport ---------------------------------------- */

static void *waker_main(void *arg)
{
    struct shm_ctx *ctx = arg;
    _Atomic uint32_t *bell = &ctx->seg->doorbell;
    uint32_t seen = atomic_load_explicit(bell, memory_order_acquire);
    while (!atomic_load(&ctx->waker_stop)) {
        futex_op(bell, FUTEX_WAIT, seen, NULL);
        uint32_t now = atomic_load_explicit(bell, memory_order_acquire);
        if (now != seen) {
            seen = now;
            ctx->waker.fn(ctx->waker.fn_arg);
        }
    }
    return NULL;
}

static weft_status_t shm_set_waker(void *vctx, void (*fn)(void *), void *arg)
{
    struct shm_ctx *ctx = vctx;
    if (ctx->waker.on)
        return WEFT_OK;
    int err = weft_waker_start(&ctx->waker, waker_main, ctx, fn, arg);
    if (err != 0)
        return weft_error(ctx->err, WEFT_ERR_SYSTEM, "rank %d: cannot start the shm waker: %s",
                          ctx->rank, strerror(err));
    return WEFT_OK;
}

void shm_waker_stop(struct shm_ctx *ctx)
{
    if (!ctx->waker.on)
        return;
    atomic_store(&ctx->waker_stop, 1);
    atomic_fetch_add_explicit(&ctx->seg->doorbell, 1, memory_order_release);
    futex_op(&ctx->seg->doorbell, FUTEX_WAKE, INT_MAX, NULL);
    pthread_join(ctx->waker.thread, NULL);
    ctx->waker.on = false;
}

static bool shm_sleep_begin(void *vctx)
{
    struct shm_ctx *ctx = vctx;
    if (ctx_pass(ctx) || (ctx->nactive > 0 && ctx_check_peers(ctx)))
        return true;
    /* The same handshake as shm_progress's futex wait: raise, fence, look. */
    atomic_store_explicit(&ctx->seg->sleeping, 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_exchange(&ctx->wake_pending, 0) || ctx_pass(ctx)) {
        atomic_store_explicit(&ctx->seg->sleeping, 0, memory_order_relaxed);
        return true;
    }
    return false;
}

static void shm_sleep_end(void *vctx)
{
    struct shm_ctx *ctx = vctx;
    atomic_store_explicit(&ctx->seg->sleeping, 0, memory_order_relaxed);
}

static void shm_abort(void *vctx, weft_status_t status, const char *why)
{
    struct shm_ctx *ctx = vctx;
    for (int i = 0; i < ctx->nranks; i++)
        if (ctx->conns[i])
            weft_conn_abort(&ctx->conns[i]->base, conn_close, status, why);
}

/* ---- posting and testing -------------------------------------------------- */

static weft_status_t shm_post(const char *what, struct shm_conn *c, bool is_send, void *buf,
                              size_t bytes, weft_take_fn take, void *take_arg, void **vreq)
{
    weft_status_t st = weft_req_post(what, c, sizeof(struct shm_req), buf, bytes, vreq);
    if (st != WEFT_INPROGRESS)
        return st;
    struct shm_req *r = *vreq;
    r->take = take;
    r->take_arg = take_arg;
    if (is_send) {
        r->seq = c->nsend++;
        bool idle = c->sq.head == NULL;
        weft_req_enqueue(&c->sq, &r->base);
        /* Small messages leave without a progress round. */
        if (idle)
            conn_send(c);
    } else {
        r->seq = c->nrecv++;
        bool idle = c->rq.head == NULL;
        weft_req_enqueue(&c->rq, &r->base);
        if (idle)
            conn_recv(c);
    }
    if (c->base.err == WEFT_OK)
        conn_sync(c);
    return WEFT_OK;
}

static weft_status_t shm_isend(void *conn, const void *buf, size_t bytes, void **req)
{
    return shm_post("shm isend", conn, true, (void *)(uintptr_t)buf, bytes, NULL, NULL, req);
}

static weft_status_t shm_irecv(void *conn, void *buf, size_t bytes, void **req)
{
    return shm_post("shm irecv", conn, false, buf, bytes, NULL, NULL, req);
}

static weft_status_t shm_irecv_take(void *conn, void *buf, size_t bytes, weft_take_fn take,
                                    void *arg, void **req)
{
    struct shm_conn *c = conn;
    if (c != NULL && take == NULL)
        return weft_error_quiet(c->ctx->err, WEFT_ERR_INVALID_ARG,
                                "shm irecv_take: NULL argument");
    return shm_post("shm irecv_take", conn, false, buf, bytes, take, arg, req);
}

static weft_status_t shm_test(void *req, int *done, size_t *bytes)
{
    return weft_req_test("shm", req, done, bytes, weft_req_put);
}

void weft_shm_get_stats(void *vctx, struct weft_shm_stats *out)
{
    const struct shm_ctx *ctx = vctx;
    *out = ctx->stats;
}

const struct weft_transport_ops weft_shm_ops = WEFT_TRANSPORT_OPS("shm", shm,
    .ready = shm_ready,
    .irecv_take = shm_irecv_take,
    WEFT_TRANSPORT_SLEEPER(shm),
    .ll_bytes = shm_ll_bytes, .ll_put = shm_ll_put, .ll_get = shm_ll_get,
    .ll_check = shm_ll_check);
