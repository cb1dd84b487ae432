/*
 * fc_stream.c - the fake CUDA driver's streams (a thread each, running its
 * commands in order, the legacy stream ordered against blocking ones),
 * events, and the test-control holds.  fc_ops.c queues the commands.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fc_internal.h"

/* A stream.  refs: the handle (dropped by cuStreamDestroy; never for the
 * legacy stream), the thread (dropped when it exits), and each command or
 * waiter that waits on done.  Linked in ctx->streams until its thread
 * exits, so frees wait for what a destroyed stream still has to run. */
struct fc_stream {
    struct fc_stream *next;
    struct fc_ctx *ctx;
    unsigned flags;
    bool legacy;
    bool started;                 /* its thread runs (set once) */
    bool dying;                   /* destroyed: the thread exits when empty */
    int refs;
    int hold;                     /* fakecuda_stream_hold count */
    uint64_t enq, done;           /* commands enqueued / finished */
    struct fc_cmd *head, *tail;   /* head runs first; it stays until done */
    pthread_cond_t wake;
};

/* An event: rec counts cuEventRecord calls, done the records its streams
 * have reached; complete when done == rec (never recorded: 0 == 0). */
struct fc_event {
    struct fc_event *next;
    struct fc_ctx *ctx;
    bool dead;                    /* destroyed: freed with its last ref */
    int refs;
    uint64_t rec, done;
};

/* ---- object lookup (caller holds fc.lock) ---- */

static struct fc_stream *fc_stream_new(struct fc_ctx *ctx, unsigned flags, bool legacy);

static void fc_stream_unref(struct fc_stream *s)
{
    if (--s->refs == 0) {
        pthread_cond_destroy(&s->wake);
        free(s);
    }
}

static void fc_event_unref(struct fc_event *e)
{
    if (--e->refs > 0)
        return;
    struct fc_event **pp = &fc.events;
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    free(e);
}

/* NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: the legacy stream. */
static bool fc_legacy_handle(CUstream h)
{
    return h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD;
}

/* The stream h names: the legacy stream of ctx for the three special
 * handles (made on first use), NULL for an unknown or destroyed one. */
static struct fc_stream *fc_stream_of(struct fc_ctx *ctx, CUstream h)
{
    if (fc_legacy_handle(h)) {
        if (ctx->legacy == NULL)
            ctx->legacy = fc_stream_new(ctx, 0, true);
        return ctx->legacy;
    }
    for (int d = 0; d < fc.ndev; d++)
        for (struct fc_stream *s = fc.ctx[d].streams; s != NULL; s = s->next)
            if ((CUstream)s == h && !s->dying)
                return s;
    return NULL;
}

static struct fc_event *fc_event_of(CUevent h)
{
    for (struct fc_event *e = fc.events; e != NULL; e = e->next)
        if ((CUevent)e == h && !e->dead)
            return e;
    return NULL;
}

/* Wait (fc.lock held) until s has run its first seq commands, or e has
 * reached its record gen, then drop the reference the caller took so that
 * neither is freed under the wait. */
static void fc_stream_wait_unref(struct fc_stream *s, uint64_t seq)
{
    while (s->done < seq)
        pthread_cond_wait(&fc.progress, &fc.lock);
    fc_stream_unref(s);
}

static void fc_event_wait_unref(struct fc_event *e, uint64_t gen)
{
    while (e->done < gen)
        pthread_cond_wait(&fc.progress, &fc.lock);
    fc_event_unref(e);
}

void fc_streams_forget(void)
{
    fc.events = NULL;
    fc.modules = NULL;
}

/* ---- the stream thread ---- */

static bool fc_value_ok(uint32_t v, uint32_t want, unsigned op)
{
    switch (op) {
    case CU_STREAM_WAIT_VALUE_GEQ: return (int32_t)(v - want) >= 0;
    case CU_STREAM_WAIT_VALUE_EQ: return v == want;
    case CU_STREAM_WAIT_VALUE_AND: return (v & want) != 0;
    default: return ~(v | want) != 0; /* NOR */
    }
}

static void *fc_xlat(CUdeviceptr p) { return fc_host_addr(p, 0); }

static void fc_run(struct fc_cmd *c)
{
    switch (c->op) {
    case OP_COPY:
    case OP_COPY2D: {
        size_t h = c->op == OP_COPY ? 1 : c->u.copy.height;
        size_t dspan = (h - 1) * c->u.copy.dpitch + c->u.copy.n;
        size_t sspan = (h - 1) * c->u.copy.spitch + c->u.copy.n;
        char *d = fc_host_addr(c->u.copy.dst, dspan);
        const char *s = fc_host_addr(c->u.copy.src, sspan);
        /* Checked at enqueue, and frees wait for the stream. */
        if (d == NULL || s == NULL) {
            fprintf(stderr, "fakecuda: copy over freed device memory\n");
            break;
        }
        for (size_t row = 0; row < h; row++)
            memmove(d + row * c->u.copy.dpitch, s + row * c->u.copy.spitch, c->u.copy.n);
        break;
    }
    case OP_SIGNAL:
        pthread_mutex_lock(&fc.lock);
        if (c->u.ev.ev->done < c->u.ev.gen)
            c->u.ev.ev->done = c->u.ev.gen;
        fc_event_unref(c->u.ev.ev);
        pthread_mutex_unlock(&fc.lock);
        break;
    case OP_WAIT_EVENT:
        pthread_mutex_lock(&fc.lock);
        fc_event_wait_unref(c->u.ev.ev, c->u.ev.gen);
        pthread_mutex_unlock(&fc.lock);
        break;
    case OP_WAIT_STREAM:
        pthread_mutex_lock(&fc.lock);
        fc_stream_wait_unref(c->u.st.s, c->u.st.seq);
        pthread_mutex_unlock(&fc.lock);
        break;
    case OP_WAIT_VALUE: {
        /* The GPU polls memory the host writes without telling it. */
        uint32_t *p = fc_host_addr(c->u.val.addr, 4);
        struct timespec ts = {0, 20000};
        while (!fc_value_ok(__atomic_load_n(p, __ATOMIC_ACQUIRE), c->u.val.value, c->u.val.flags))
            nanosleep(&ts, NULL);
        break;
    }
    case OP_WRITE_VALUE:
        __atomic_store_n((uint32_t *)fc_host_addr(c->u.val.addr, 4), c->u.val.value, __ATOMIC_RELEASE);
        break;
    case OP_HOST_FN:
        fc_in_host_fn = true;
        c->u.host.fn(c->u.host.data);
        fc_in_host_fn = false;
        break;
    case OP_KERNEL:
        c->u.kern.k->run(c->u.kern.args, c->u.kern.gx, c->u.kern.bx, fc_xlat);
        break;
    }
}

static void *fc_stream_main(void *arg)
{
    struct fc_stream *s = arg;
    pthread_mutex_lock(&fc.lock);
    s->started = true;
    pthread_cond_broadcast(&fc.progress);
    for (;;) {
        while ((s->head == NULL && !s->dying) || (s->head != NULL && s->hold > 0))
            pthread_cond_wait(&s->wake, &fc.lock);
        struct fc_cmd *c = s->head;
        if (c == NULL)
            break; /* destroyed and drained */
        pthread_mutex_unlock(&fc.lock);
        fc_run(c);
        pthread_mutex_lock(&fc.lock);
        s->head = c->next;
        if (s->head == NULL)
            s->tail = NULL;
        s->done++;
        pthread_cond_broadcast(&fc.progress);
        free(c);
    }
    struct fc_stream **pp = &s->ctx->streams;
    while (*pp != s)
        pp = &(*pp)->next;
    *pp = s->next;
    fc_stream_unref(s);
    pthread_mutex_unlock(&fc.lock);
    return NULL;
}

/* Caller holds fc.lock. */
static struct fc_stream *fc_stream_new(struct fc_ctx *ctx, unsigned flags, bool legacy)
{
    struct fc_stream *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    *s = (struct fc_stream){.ctx = ctx, .flags = flags, .legacy = legacy, .refs = 2};
    pthread_cond_init(&s->wake, NULL);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int e = pthread_create(&t, &attr, fc_stream_main, s);
    pthread_attr_destroy(&attr);
    if (e != 0) {
        pthread_cond_destroy(&s->wake);
        free(s);
        return NULL;
    }
    s->next = ctx->streams;
    ctx->streams = s;
    /* Returns once the thread runs: a fork right after must not find it
     * half-started (inside a sanitizer's allocator, say). */
    while (!s->started)
        pthread_cond_wait(&fc.progress, &fc.lock);
    return s;
}

/* ---- enqueueing (caller holds fc.lock) ---- */

struct fc_cmd *fc_cmd_new(enum fc_op op, union fc_args u, size_t blob)
{
    struct fc_cmd *c = calloc(1, sizeof *c + blob);
    if (c != NULL) {
        c->op = op;
        c->u = u;
    }
    return c;
}

static void fc_push(struct fc_stream *s, struct fc_cmd *c)
{
    c->next = NULL;
    if (s->tail != NULL)
        s->tail->next = c;
    else
        s->head = c;
    s->tail = c;
    s->enq++;
    pthread_cond_signal(&s->wake);
}

static void fc_push_wait(struct fc_stream *s, struct fc_stream *on)
{
    struct fc_cmd *w = fc_cmd_new(OP_WAIT_STREAM, (union fc_args){.st = {on, on->enq}}, 0);
    if (w == NULL) {
        fprintf(stderr, "fakecuda: out of memory ordering streams\n");
        abort();
    }
    on->refs++;
    fc_push(s, w);
}

/* The legacy stream waits for the blocking streams of its context, and
 * they for it, as the real legacy default stream does. */
static void fc_push_ordered(struct fc_stream *s, struct fc_cmd *c)
{
    struct fc_ctx *ctx = s->ctx;
    if (s->legacy) {
        for (struct fc_stream *t = ctx->streams; t != NULL; t = t->next)
            if (t != s && !(t->flags & CU_STREAM_NON_BLOCKING) && t->done < t->enq)
                fc_push_wait(s, t);
    } else if (!(s->flags & CU_STREAM_NON_BLOCKING) && ctx->legacy != NULL &&
               ctx->legacy->done < ctx->legacy->enq) {
        fc_push_wait(s, ctx->legacy);
    }
    fc_push(s, c);
}

/* Queues c on stream h (c is freed on failure); *out gets the stream. */
static CUresult fc_submit_on(struct fc_ctx *ctx, CUstream h, struct fc_cmd *c, struct fc_stream **out)
{
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct fc_stream *s = fc_stream_of(ctx, h);
    if (s == NULL) {
        free(c);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    fc_push_ordered(s, c);
    if (out != NULL)
        *out = s;
    return CUDA_SUCCESS;
}

CUresult fc_submit(struct fc_ctx *ctx, CUstream h, struct fc_cmd *c)
{
    pthread_mutex_lock(&fc.lock);
    CUresult r = fc_submit_on(ctx, h, c, NULL);
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* Waits (fc.lock held) until s has run what is queued on it now. */
static void fc_sync_stream(struct fc_stream *s)
{
    s->refs++;
    fc_stream_wait_unref(s, s->enq);
}

CUresult fc_submit_wait(struct fc_ctx *ctx, struct fc_cmd *c)
{
    pthread_mutex_lock(&fc.lock);
    struct fc_stream *s;
    CUresult r = fc_submit_on(ctx, NULL, c, &s);
    if (r == CUDA_SUCCESS)
        fc_sync_stream(s);
    pthread_mutex_unlock(&fc.lock);
    return r;
}

void fc_drain_locked(struct fc_ctx *only)
{
    size_t n = 0;
    for (int d = 0; d < fc.ndev; d++)
        for (struct fc_stream *s = fc.ctx[d].streams; s != NULL; s = s->next)
            n++;
    struct { struct fc_stream *s; uint64_t seq; } *w = calloc(n + 1, sizeof *w);
    if (w == NULL) {
        fprintf(stderr, "fakecuda: out of memory synchronizing a free\n");
        abort();
    }
    n = 0;
    for (int d = 0; d < fc.ndev; d++) {
        if (only != NULL && only != &fc.ctx[d])
            continue;
        for (struct fc_stream *s = fc.ctx[d].streams; s != NULL; s = s->next)
            if (s->done < s->enq) {
                w[n].s = s;
                w[n++].seq = s->enq;
                s->refs++;
            }
    }
    for (size_t i = 0; i < n; i++)
        fc_stream_wait_unref(w[i].s, w[i].seq);
    free(w);
}

/* ---- streams ---- */

/* Ends a call that fc_enter_stream or fc_enter_event opened: releases
 * fc.lock, returns r. */
static CUresult fc_leave(CUresult r)
{
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* The end of fc_enter_stream and fc_enter_event: found keeps fc.lock,
 * an unknown handle releases it. */
static CUresult fc_found_locked(const void *obj)
{
    return obj != NULL ? CUDA_SUCCESS : fc_leave(CUDA_ERROR_INVALID_HANDLE);
}

/* Opens a call on stream h: the entry checks, then fc.lock taken and *s
 * the stream (the legacy one for the special handles, unless legacy_ok is
 * false: they name no stream the caller may destroy).  The lock is held
 * only on success. */
static CUresult fc_enter_stream(CUstream h, bool legacy_ok, struct fc_stream **s)
{
    struct fc_ctx *ctx;
    FC_CHECK(fc_enter_ctx(&ctx));
    pthread_mutex_lock(&fc.lock);
    *s = legacy_ok || !fc_legacy_handle(h) ? fc_stream_of(ctx, h) : NULL;
    return fc_found_locked(*s);
}

FC_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    struct fc_ctx *ctx;
    FC_CHECK(fc_enter_ctx(&ctx));
    if (phStream == NULL || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    struct fc_stream *s = fc_stream_new(ctx, Flags, false);
    pthread_mutex_unlock(&fc.lock);
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

/* Returns at once; the stream's thread runs what is queued, then exits. */
FC_API CUresult cuStreamDestroy(CUstream hStream)
{
    struct fc_stream *s;
    FC_CHECK(fc_enter_stream(hStream, false, &s));
    s->dying = true;
    s->hold = 0;
    pthread_cond_signal(&s->wake);
    fc_stream_unref(s);
    return fc_leave(CUDA_SUCCESS);
}

FC_API CUresult cuStreamSynchronize(CUstream hStream)
{
    struct fc_stream *s;
    FC_CHECK(fc_enter_stream(hStream, true, &s));
    fc_sync_stream(s);
    return fc_leave(CUDA_SUCCESS);
}

FC_API CUresult cuStreamQuery(CUstream hStream)
{
    struct fc_stream *s;
    FC_CHECK(fc_enter_stream(hStream, true, &s));
    return fc_leave(s->done < s->enq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

static CUresult fc_hold(CUstream hStream, int delta)
{
    struct fc_stream *s;
    FC_CHECK(fc_enter_stream(hStream, true, &s));
    if (delta < 0 && s->hold == 0)
        return fc_leave(CUDA_ERROR_INVALID_VALUE);
    s->hold += delta;
    pthread_cond_signal(&s->wake);
    return fc_leave(CUDA_SUCCESS);
}

FC_API CUresult fakecuda_stream_hold(CUstream stream) { return fc_hold(stream, 1); }
FC_API CUresult fakecuda_stream_release(CUstream stream) { return fc_hold(stream, -1); }

/* ---- events ---- */

/* Opens a call on event h as fc_enter_stream does on a stream. */
static CUresult fc_enter_event(CUevent h, struct fc_event **e)
{
    FC_CHECK(fc_enter_ctx(NULL));
    pthread_mutex_lock(&fc.lock);
    *e = fc_event_of(h);
    return fc_found_locked(*e);
}

FC_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    struct fc_ctx *ctx;
    FC_CHECK(fc_enter_ctx(&ctx));
    unsigned all = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == NULL || (Flags & ~all) != 0 ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_event *e = calloc(1, sizeof *e);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (struct fc_event){.ctx = ctx, .refs = 1};
    FC_LINK(events, e);
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

/* Returns at once; a record still queued fires into the freed handle's
 * object, kept until then. */
FC_API CUresult cuEventDestroy(CUevent hEvent)
{
    struct fc_event *e;
    FC_CHECK(fc_enter_event(hEvent, &e));
    e->dead = true;
    fc_event_unref(e);
    return fc_leave(CUDA_SUCCESS);
}

FC_API CUresult cuEventQuery(CUevent hEvent)
{
    struct fc_event *e;
    FC_CHECK(fc_enter_event(hEvent, &e));
    return fc_leave(e->done < e->rec ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
}

FC_API CUresult cuEventSynchronize(CUevent hEvent)
{
    struct fc_event *e;
    FC_CHECK(fc_enter_event(hEvent, &e));
    e->refs++;
    fc_event_wait_unref(e, e->rec);
    return fc_leave(CUDA_SUCCESS);
}

/* Queues an event command (OP_SIGNAL: a new record of hEvent; OP_WAIT_EVENT:
 * a wait for its latest record) on hStream.  args_ok false: the caller's
 * own arguments are invalid, checked after the context as the driver
 * does.  A record needs the event and the stream of one context; a wait
 * takes any context's event (the real driver orders across devices too). */
static CUresult fc_event_cmd(CUevent hEvent, CUstream hStream, enum fc_op op, bool args_ok)
{
    struct fc_ctx *ctx;
    FC_CHECK(fc_enter_ctx(&ctx));
    if (!args_ok)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_cmd *c = fc_cmd_new(op, (union fc_args){.ev = {NULL, 0}}, 0); /* set once found */
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc.lock);
    struct fc_event *e = fc_event_of(hEvent);
    struct fc_stream *s = fc_stream_of(ctx, hStream);
    if (e == NULL || s == NULL || (op == OP_SIGNAL && e->ctx != s->ctx)) {
        free(c);
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        c->u.ev.ev = e;
        c->u.ev.gen = op == OP_SIGNAL ? ++e->rec : e->rec;
        e->refs++;
        fc_push_ordered(s, c);
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return fc_event_cmd(hEvent, hStream, OP_SIGNAL, true);
}

FC_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return fc_event_cmd(hEvent, hStream, OP_WAIT_EVENT, Flags == 0);
}
