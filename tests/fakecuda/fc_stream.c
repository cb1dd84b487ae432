/*
 * fc_stream.c - the fake CUDA driver's streams (a thread each, running its
 * commands in order), events, copies, stream memory operations, host
 * functions, modules and kernel launches (host functions from a table),
 * and the test-control holds.
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

struct fc_func {
    struct fc_func *next;
    const struct fakecuda_kernel *k;
};

struct fc_module {
    struct fc_module *next;
    struct fc_ctx *ctx;
    struct fc_func *funcs;
};

enum fc_op { OP_COPY, OP_COPY2D, OP_SIGNAL, OP_WAIT_EVENT, OP_WAIT_STREAM, OP_WAIT_VALUE,
             OP_WRITE_VALUE, OP_HOST_FN, OP_KERNEL };

/* One stream command; device addresses are translated when it runs. */
struct fc_cmd {
    struct fc_cmd *next;
    enum fc_op op;
    union {
        struct { CUdeviceptr dst, src; size_t n, dpitch, spitch, height; } copy;
        struct { struct fc_event *ev; uint64_t gen; } ev;
        struct { struct fc_stream *s; uint64_t seq; } st;
        struct { CUdeviceptr addr; uint32_t value; unsigned flags; } val;
        struct { CUhostFn fn; void *data; } host;
        struct { const struct fakecuda_kernel *k; unsigned gx, bx; void *args[FAKECUDA_MAX_PARAMS]; } kern;
    } u;
    _Alignas(16) unsigned char blob[]; /* the kernel's argument copies */
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

/* The stream h names: the legacy stream of ctx for the three special
 * handles (made on first use), NULL for an unknown or destroyed one. */
static struct fc_stream *fc_stream_of(struct fc_ctx *ctx, CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
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

static const struct fakecuda_kernel *fc_func_of(CUfunction h)
{
    for (struct fc_module *m = fc.modules; m != NULL; m = m->next)
        for (struct fc_func *f = m->funcs; f != NULL; f = f->next)
            if ((CUfunction)f == h)
                return f->k;
    return NULL;
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
        while (c->u.ev.ev->done < c->u.ev.gen)
            pthread_cond_wait(&fc.progress, &fc.lock);
        fc_event_unref(c->u.ev.ev);
        pthread_mutex_unlock(&fc.lock);
        break;
    case OP_WAIT_STREAM:
        pthread_mutex_lock(&fc.lock);
        while (c->u.st.s->done < c->u.st.seq)
            pthread_cond_wait(&fc.progress, &fc.lock);
        fc_stream_unref(c->u.st.s);
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
    return s;
}

/* ---- enqueueing (caller holds fc.lock) ---- */

static struct fc_cmd *fc_cmd_new(enum fc_op op, size_t blob)
{
    struct fc_cmd *c = calloc(1, sizeof *c + blob);
    if (c != NULL)
        c->op = op;
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
    struct fc_cmd *w = fc_cmd_new(OP_WAIT_STREAM, 0);
    if (w == NULL) {
        fprintf(stderr, "fakecuda: out of memory ordering streams\n");
        abort();
    }
    w->u.st.s = on;
    w->u.st.seq = on->enq;
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

static CUresult fc_submit(struct fc_ctx *ctx, CUstream h, struct fc_cmd *c)
{
    pthread_mutex_lock(&fc.lock);
    CUresult r = fc_submit_on(ctx, h, c, NULL);
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* Waits (fc.lock held) until s has run its first seq commands. */
static void fc_wait_stream(struct fc_stream *s, uint64_t seq)
{
    s->refs++;
    while (s->done < seq)
        pthread_cond_wait(&fc.progress, &fc.lock);
    fc_stream_unref(s);
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
    for (size_t i = 0; i < n; i++) {
        while (w[i].s->done < w[i].seq)
            pthread_cond_wait(&fc.progress, &fc.lock);
        fc_stream_unref(w[i].s);
    }
    free(w);
}

/* ---- streams ---- */

FC_API CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
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
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_stream *s = hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD
                              ? NULL
                              : fc_stream_of(ctx, hStream);
    if (s == NULL) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        s->dying = true;
        s->hold = 0;
        pthread_cond_signal(&s->wake);
        fc_stream_unref(s);
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuStreamSynchronize(CUstream hStream)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_stream *s = fc_stream_of(ctx, hStream);
    if (s == NULL)
        r = CUDA_ERROR_INVALID_HANDLE;
    else
        fc_wait_stream(s, s->enq);
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuStreamQuery(CUstream hStream)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_stream *s = fc_stream_of(ctx, hStream);
    r = s == NULL ? CUDA_ERROR_INVALID_HANDLE : s->done < s->enq ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&fc.lock);
    return r;
}

static CUresult fc_hold(CUstream hStream, int delta)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_stream *s = fc_stream_of(ctx, hStream);
    if (s == NULL) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (delta < 0 && s->hold == 0) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        s->hold += delta;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult fakecuda_stream_hold(CUstream stream) { return fc_hold(stream, 1); }
FC_API CUresult fakecuda_stream_release(CUstream stream) { return fc_hold(stream, -1); }

/* ---- events ---- */

FC_API CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    unsigned all = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    if (phEvent == NULL || (Flags & ~all) != 0 ||
        ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING)))
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_event *e = calloc(1, sizeof *e);
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (struct fc_event){.ctx = ctx, .refs = 1};
    pthread_mutex_lock(&fc.lock);
    e->next = fc.events;
    fc.events = e;
    pthread_mutex_unlock(&fc.lock);
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

/* Returns at once; a record still queued fires into the freed handle's
 * object, kept until then. */
FC_API CUresult cuEventDestroy(CUevent hEvent)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_event *e = fc_event_of(hEvent);
    if (e == NULL) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        e->dead = true;
        fc_event_unref(e);
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    struct fc_cmd *c = fc_cmd_new(OP_SIGNAL, 0);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fc.lock);
    struct fc_event *e = fc_event_of(hEvent);
    struct fc_stream *s = fc_stream_of(ctx, hStream);
    /* The event and the stream must be of one context. */
    if (e == NULL || s == NULL || e->ctx != s->ctx) {
        free(c);
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        c->u.ev.ev = e;
        c->u.ev.gen = ++e->rec;
        e->refs++;
        fc_push_ordered(s, c);
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuEventQuery(CUevent hEvent)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_event *e = fc_event_of(hEvent);
    r = e == NULL ? CUDA_ERROR_INVALID_HANDLE : e->done < e->rec ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuEventSynchronize(CUevent hEvent)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_event *e = fc_event_of(hEvent);
    if (e == NULL) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        uint64_t gen = e->rec;
        e->refs++;
        while (e->done < gen)
            pthread_cond_wait(&fc.progress, &fc.lock);
        fc_event_unref(e);
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* Any context's event: the real driver orders across devices too. */
FC_API CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_cmd *c = fc_cmd_new(OP_WAIT_EVENT, 0);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&fc.lock);
    struct fc_event *e = fc_event_of(hEvent);
    if (e == NULL) {
        free(c);
        r = CUDA_ERROR_INVALID_HANDLE;
    } else {
        c->u.ev.ev = e;
        c->u.ev.gen = e->rec;
        e->refs++;
        r = fc_submit_on(ctx, hStream, c, NULL);
        if (r != CUDA_SUCCESS)
            e->refs--; /* never 0 here: the handle holds one */
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* ---- copies ---- */

/* false when p is in device memory that [p, p+n) overruns. */
static bool fc_range_ok(CUdeviceptr p, size_t n)
{
    return n == 0 || fc_host_addr(p, n) != NULL;
}

/* What p is: 0 unknown (pageable host), else 1 + its fc_kind. */
static int fc_kind_of(CUdeviceptr p)
{
    pthread_mutex_lock(&fc.lock);
    struct fc_alloc *a = fc_find((uintptr_t)p, 0, NULL);
    int k = a == NULL ? 0 : 1 + (int)a->kind;
    pthread_mutex_unlock(&fc.lock);
    return k;
}

static bool fc_is_device(CUdeviceptr p)
{
    int k = fc_kind_of(p);
    return k == 1 + FC_DEVICE || k == 1 + FC_IPC;
}

static struct fc_cmd *fc_copy_cmd(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    struct fc_cmd *c = fc_cmd_new(OP_COPY, 0);
    if (c != NULL) {
        c->u.copy.dst = dst;
        c->u.copy.src = src;
        c->u.copy.n = n;
    }
    return c;
}

/* Unified addressing: either side may be device or host memory. */
FC_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (!fc_range_ok(dst, ByteCount) || !fc_range_ok(src, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    if (ByteCount == 0)
        return CUDA_SUCCESS;
    return fc_submit(ctx, hStream, fc_copy_cmd(dst, src, ByteCount));
}

/* The synchronous copies go through the legacy stream, and return when
 * it has run them. */
static CUresult fc_copy_sync(struct fc_ctx *ctx, CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    struct fc_cmd *c = fc_copy_cmd(dst, src, n);
    pthread_mutex_lock(&fc.lock);
    struct fc_stream *s;
    CUresult r = fc_submit_on(ctx, NULL, c, &s);
    if (r == CUDA_SUCCESS)
        fc_wait_stream(s, s->enq);
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr src = (CUdeviceptr)(uintptr_t)srcHost;
    if (fc_kind_of(dstDevice) == 0 || fc_is_device(src) || !fc_range_ok(dstDevice, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    return ByteCount == 0 ? CUDA_SUCCESS : fc_copy_sync(ctx, dstDevice, src, ByteCount);
}

FC_API CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    CUdeviceptr dst = (CUdeviceptr)(uintptr_t)dstHost;
    if (fc_kind_of(srcDevice) == 0 || fc_is_device(dst) || !fc_range_ok(srcDevice, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    return ByteCount == 0 ? CUDA_SUCCESS : fc_copy_sync(ctx, dst, srcDevice, ByteCount);
}

/* One side of a 2D copy: its first byte, or false when the memory type
 * does not fit the pointer or the rows overrun a device allocation. */
static bool fc_2d_side(CUmemorytype type, const void *host, CUdeviceptr dev, size_t x, size_t y,
                       size_t pitch, size_t width, size_t height, CUdeviceptr *start)
{
    CUdeviceptr p;
    switch (type) {
    case CU_MEMORYTYPE_HOST:
        p = (CUdeviceptr)(uintptr_t)host;
        if (fc_is_device(p))
            return false;
        break;
    case CU_MEMORYTYPE_DEVICE:
        p = dev;
        if (fc_kind_of(p) == 0) /* pageable host memory is no device address */
            return false;
        break;
    case CU_MEMORYTYPE_UNIFIED:
        p = dev;
        break;
    default:
        return false; /* arrays are not emulated */
    }
    if (height > 1 && pitch < width)
        return false;
    *start = p + y * pitch + x;
    return fc_range_ok(*start, (height - 1) * pitch + width);
}

FC_API CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (pCopy == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_MEMCPY2D *m = pCopy;
    if (m->WidthInBytes == 0 || m->Height == 0)
        return CUDA_SUCCESS;
    CUdeviceptr src, dst;
    if (!fc_2d_side(m->srcMemoryType, m->srcHost, m->srcDevice, m->srcXInBytes, m->srcY, m->srcPitch,
                    m->WidthInBytes, m->Height, &src) ||
        !fc_2d_side(m->dstMemoryType, m->dstHost, m->dstDevice, m->dstXInBytes, m->dstY, m->dstPitch,
                    m->WidthInBytes, m->Height, &dst))
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_cmd *c = fc_cmd_new(OP_COPY2D, 0);
    if (c != NULL)
        c->u.copy = (__typeof__(c->u.copy)){.dst = dst, .src = src, .n = m->WidthInBytes,
                                            .dpitch = m->dstPitch, .spitch = m->srcPitch,
                                            .height = m->Height};
    return fc_submit(ctx, hStream, c);
}

/* ---- stream memory operations, host functions ---- */

static CUresult fc_memop(CUstream stream, enum fc_op op, CUdeviceptr addr, cuuint32_t value,
                         unsigned flags, bool flags_ok)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (!fc.memops)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* The GPU reaches only memory the driver knows: pinned host memory
     * (its device pointer is its address), device or managed memory. */
    if (!flags_ok || addr % 4 != 0 || fc_kind_of(addr) == 0 || !fc_range_ok(addr, 4))
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_cmd *c = fc_cmd_new(op, 0);
    if (c != NULL)
        c->u.val.addr = addr, c->u.val.value = value, c->u.val.flags = flags;
    return fc_submit(ctx, stream, c);
}

FC_API CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    unsigned op = flags & ~(unsigned)CU_STREAM_WAIT_VALUE_FLUSH;
    return fc_memop(stream, OP_WAIT_VALUE, addr, value, op, op <= CU_STREAM_WAIT_VALUE_NOR);
}

FC_API CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags)
{
    return fc_memop(stream, OP_WRITE_VALUE, addr, value, 0,
                    (flags & ~(unsigned)CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER) == 0);
}

FC_API CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_cmd *c = fc_cmd_new(OP_HOST_FN, 0);
    if (c != NULL)
        c->u.host.fn = fn, c->u.host.data = userData;
    return fc_submit(ctx, hStream, c);
}

/* ---- modules, kernels ---- */

/* The fake's own kernel, for its tests: out[i] = value + i for i < count,
 * each of grid_x * block_x threads taking every (grid_x*block_x)-th i as a
 * grid-stride loop does.  (CUdeviceptr out, uint32_t value, size_t count) */
static void fc_test_fill(void **params, unsigned grid_x, unsigned block_x, void *(*xlat)(CUdeviceptr))
{
    uint32_t *out = xlat(*(CUdeviceptr *)params[0]);
    uint32_t value = *(uint32_t *)params[1];
    size_t count = *(size_t *)params[2];
    size_t threads = (size_t)grid_x * block_x;
    for (size_t t = 0; t < threads; t++)
        for (size_t i = t; i < count; i += threads)
            out[i] = value + (uint32_t)i;
}

static const struct fakecuda_kernel fc_own_kernels[] = {
    {"fakecuda_test_fill", fc_test_fill, {sizeof(CUdeviceptr), sizeof(uint32_t), sizeof(size_t)}},
};

static const struct fakecuda_kernel *fc_kernel_named(const char *name)
{
    for (size_t i = 0; i < sizeof fc_own_kernels / sizeof fc_own_kernels[0]; i++)
        if (strcmp(fc_own_kernels[i].name, name) == 0)
            return &fc_own_kernels[i];
    for (size_t i = 0; i < fakecuda_nkernels; i++)
        if (strcmp(fakecuda_kernels[i].name, name) == 0)
            return &fakecuda_kernels[i];
    return NULL;
}

/* Any image: the kernels are the host functions of the tables. */
FC_API CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_module *m = calloc(1, sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ctx = ctx;
    pthread_mutex_lock(&fc.lock);
    m->next = fc.modules;
    fc.modules = m;
    pthread_mutex_unlock(&fc.lock);
    *module = (CUmodule)m;
    return CUDA_SUCCESS;
}

/* Launches already queued keep their kernel (the tables are static). */
FC_API CUresult cuModuleUnload(CUmodule hmod)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    struct fc_module **pp = &fc.modules;
    while (*pp != NULL && *pp != (struct fc_module *)hmod)
        pp = &(*pp)->next;
    struct fc_module *m = *pp;
    if (m != NULL)
        *pp = m->next;
    pthread_mutex_unlock(&fc.lock);
    if (m == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    for (struct fc_func *f = m->funcs, *next; f != NULL; f = next) {
        next = f->next;
        free(f);
    }
    free(m);
    return CUDA_SUCCESS;
}

FC_API CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    if (hfunc == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fakecuda_kernel *k = fc_kernel_named(name);
    pthread_mutex_lock(&fc.lock);
    struct fc_module *m = fc.modules;
    while (m != NULL && m != (struct fc_module *)hmod)
        m = m->next;
    struct fc_func *f = NULL;
    if (m == NULL) {
        r = CUDA_ERROR_INVALID_HANDLE;
    } else if (k == NULL) {
        r = CUDA_ERROR_NOT_FOUND;
    } else {
        for (f = m->funcs; f != NULL && f->k != k; f = f->next)
            ;
        if (f == NULL && (f = calloc(1, sizeof *f)) != NULL) {
            f->k = k;
            f->next = m->funcs;
            m->funcs = f;
        }
        r = f == NULL ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&fc.lock);
    if (r == CUDA_SUCCESS)
        *hfunc = (CUfunction)f;
    return r;
}

/* One-dimensional launches only (weft's kernels are); the arguments are
 * copied now, as the driver does, by the sizes the table gives. */
FC_API CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                               unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY,
                               unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream,
                               void **kernelParams, void **extra)
{
    struct fc_ctx *ctx;
    CUresult r = fc_enter_ctx(&ctx);
    if (r != CUDA_SUCCESS)
        return r;
    pthread_mutex_lock(&fc.lock);
    const struct fakecuda_kernel *k = fc_func_of(f);
    pthread_mutex_unlock(&fc.lock);
    if (k == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    if (gridDimY != 1 || gridDimZ != 1 || blockDimY != 1 || blockDimZ != 1 || gridDimX == 0 ||
        blockDimX == 0 || blockDimX > 1024 || extra != NULL)
        return CUDA_ERROR_INVALID_VALUE;
    size_t n = 0, blob = 0;
    while (n < FAKECUDA_MAX_PARAMS && k->param_bytes[n] != 0)
        blob += (k->param_bytes[n++] + 15) / 16 * 16;
    if (n > 0 && kernelParams == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (n == 0 && kernelParams != NULL) {
        fprintf(stderr, "fakecuda: kernel %s: its table entry lists no param_bytes\n", k->name);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fc_cmd *c = fc_cmd_new(OP_KERNEL, blob);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    c->u.kern.k = k;
    c->u.kern.gx = gridDimX;
    c->u.kern.bx = blockDimX;
    unsigned char *at = c->blob;
    for (size_t i = 0; i < n; i++) {
        memcpy(at, kernelParams[i], k->param_bytes[i]);
        c->u.kern.args[i] = at;
        at += (k->param_bytes[i] + 15) / 16 * 16;
    }
    return fc_submit(ctx, hStream, c);
}
