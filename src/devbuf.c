/*
 * devbuf.c - device buffers and CUDA stream semantics.  A call that meets a
 * stream or a device pointer becomes a job of its communicator's device
 * worker: the call records an event on the user's stream and makes the
 * stream wait on a flag in pinned host memory; the worker waits for the
 * event, moves the data through pinned staging buffers (copies of one
 * segment overlapping the collective of the next), runs the collective on
 * the host engine and raises the flag.  See docs/design.md, "Device buffers".
 */
#include "devbuf_impl.h"

#include <dlfcn.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/cudrv.h"

/* Stream flags live in pinned pages that are never freed: a stream may
 * read its flag after the communicator is gone (abort), and a page is cheap. */
#define FLAG_SLOTS 1024
static pthread_mutex_t flag_mu = PTHREAD_MUTEX_INITIALIZER;
static uint32_t *flag_page;
static int flag_used = FLAG_SLOTS;

/* The per-comm pointer; created under create_mu. */
static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;

static inline struct weft_dev *dev_of(struct weft_comm *comm)
{
    return atomic_load(&comm->dev);
}

weft_status_t weft_dev_cu_check(struct weft_dev *d, CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return WEFT_OK;
    return weft_cu_error(weft_comm_err(d->comm), r, what);
}

/* ---- detection --------------------------------------------------------- */

/* Device pointers can only exist when a CUDA driver is loaded already:
 * looked at once per communicator, at its first call. */
static bool detect(struct weft_comm *comm)
{
    int on = atomic_load(&comm->cuda_on);
    if (on >= 0)
        return on;
    const char *path = weft_param_str("WEFT_CUDA_DRIVER");
    void *h = dlopen(path, RTLD_NOLOAD | RTLD_LAZY);
    if (h != NULL)
        dlclose(h);
    on = h != NULL && weft_cu_get(NULL) != NULL;
    atomic_store(&comm->cuda_on, on);
    return on;
}

static bool on_device(const void *p)
{
    return p != NULL && weft_cu_mem_kind(p, NULL, NULL) != WEFT_MEM_HOST;
}

bool weft_dev_on_device(struct weft_comm *comm, const void *a, const void *b)
{
    return detect(comm) && (on_device(a) || on_device(b));
}

/* ---- the worker's pieces ----------------------------------------------- */

static weft_status_t flag_alloc(struct weft_dev *d)
{
    pthread_mutex_lock(&flag_mu);
    weft_status_t st = WEFT_OK;
    if (flag_used == FLAG_SLOTS) {
        void *p = NULL;
        CUresult r = d->cu->cuMemHostAlloc(&p, FLAG_SLOTS * sizeof(uint32_t),
                                           CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP);
        if (r != CUDA_SUCCESS)
            st = weft_dev_cu_check(d, r, "cuMemHostAlloc of the stream flags");
        else {
            memset(p, 0, FLAG_SLOTS * sizeof(uint32_t));
            flag_page = p;
            flag_used = 0;
        }
    }
    if (st == WEFT_OK) {
        d->flag = &flag_page[flag_used++];
        st = weft_dev_cu_check(d, d->cu->cuMemHostGetDevicePointer(&d->flag_dev, (void *)d->flag, 0),
                      "cuMemHostGetDevicePointer of a stream flag");
    }
    pthread_mutex_unlock(&flag_mu);
    return st;
}

/* Releases every stream waiting for a value up to seq. */
static void flag_raise(struct weft_dev *d, uint32_t seq)
{
    __atomic_store_n(d->flag, seq, __ATOMIC_RELEASE);
}

/* The host-function form of a stream wait, for drivers without stream
 * memory operations: it holds the stream's callback thread until the flag
 * passes seq (other streams' host functions wait meanwhile). */
struct host_wait {
    volatile uint32_t *flag;
    uint32_t seq;
};

static void CUDA_CB host_wait_fn(void *arg)
{
    struct host_wait *w = arg;
    unsigned spins = 0;
    while ((int32_t)(__atomic_load_n(w->flag, __ATOMIC_ACQUIRE) - w->seq) < 0) {
        if (++spins < 1000)
            continue;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    free(w);
}

/* Makes stream wait for the flag to reach seq. */
static weft_status_t stream_wait_flag(struct weft_dev *d, CUstream s, uint32_t seq)
{
    if (d->cu->memops)
        return weft_dev_cu_check(d, d->cu->cuStreamWaitValue32(s, d->flag_dev, seq, CU_STREAM_WAIT_VALUE_GEQ),
                        "cuStreamWaitValue32 on the caller's stream");
    struct host_wait *w = malloc(sizeof(*w));
    if (w == NULL)
        return weft_error(weft_comm_err(d->comm), WEFT_ERR_NO_MEMORY, "stream wait: no memory");
    *w = (struct host_wait){d->flag, seq};
    CUresult r = d->cu->cuLaunchHostFunc(s, host_wait_fn, w);
    if (r != CUDA_SUCCESS)
        free(w);
    return weft_dev_cu_check(d, r, "cuLaunchHostFunc on the caller's stream");
}

static weft_status_t event_get(struct weft_dev *d, CUevent *ev)
{
    pthread_mutex_lock(&d->mu);
    bool have = d->nevents > 0;
    if (have)
        *ev = d->events[--d->nevents];
    pthread_mutex_unlock(&d->mu);
    if (have)
        return WEFT_OK;
    return weft_dev_cu_check(d, d->cu->cuEventCreate(ev, CU_EVENT_DISABLE_TIMING), "cuEventCreate");
}

static void event_put(struct weft_dev *d, CUevent ev)
{
    pthread_mutex_lock(&d->mu);
    if (d->nevents == d->cap_events) {
        size_t cap = d->cap_events ? 2 * d->cap_events : 16;
        CUevent *n = realloc(d->events, cap * sizeof(*n));
        if (n == NULL) {
            pthread_mutex_unlock(&d->mu);
            d->cu->cuEventDestroy(ev);
            return;
        }
        d->events = n;
        d->cap_events = cap;
    }
    d->events[d->nevents++] = ev;
    pthread_mutex_unlock(&d->mu);
}

/* Waits for a call's stream to reach it: spins briefly, then sleeps in
 * short naps; an abort ends the wait. */
static weft_status_t wait_event(struct weft_dev *d, CUevent ev)
{
    for (unsigned i = 0;; i++) {
        CUresult r = d->cu->cuEventQuery(ev);
        if (r == CUDA_SUCCESS)
            return WEFT_OK;
        if (r != CUDA_ERROR_NOT_READY)
            return weft_dev_cu_check(d, r, "cuEventQuery of the caller's stream");
        if (atomic_load(&d->abort))
            return WEFT_ERR_ABORTED;
        if (i < 200)
            continue;
        if (i < 2000) {
            sched_yield();
            continue;
        }
        struct timespec ts = {0, 50000};
        nanosleep(&ts, NULL);
    }
}

static void retired_free(struct weft_dev *d, const struct weft_dev_retired *r)
{
    switch (r->kind) {
    case WEFT_RETIRE_HOST: d->cu->cuMemFreeHost((void *)r->p); break;
    case WEFT_RETIRE_DEVICE: d->cu->cuMemFree((CUdeviceptr)r->p); break;
    case WEFT_RETIRE_IPC: d->cu->cuIpcCloseMemHandle((CUdeviceptr)r->p); break;
    }
}

void weft_dev_retire(struct weft_dev *d, enum weft_dev_retire_kind kind, uintptr_t p)
{
    struct weft_dev_retired r = {kind, p};
    if (d->nretired == d->cap_retired) {
        size_t cap = d->cap_retired ? 2 * d->cap_retired : 8;
        struct weft_dev_retired *n = realloc(d->retired, cap * sizeof(*n));
        if (n == NULL) {
            retired_free(d, &r);
            return;
        }
        d->retired = n;
        d->cap_retired = cap;
    }
    d->retired[d->nretired++] = r;
}

/* Grows the pinned staging area (doubling, so few buffers are retired). */
static weft_status_t stage_reserve(struct weft_dev *d, size_t bytes)
{
    if (bytes <= d->stage_bytes)
        return WEFT_OK;
    if (bytes < 2 * d->stage_bytes)
        bytes = 2 * d->stage_bytes;
    void *p = NULL;
    WEFT_CHECK(weft_dev_cu_check(d, d->cu->cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE),
                                 "cuMemHostAlloc of the staging buffers"));
    if (d->stage != NULL)
        weft_dev_retire(d, WEFT_RETIRE_HOST, (uintptr_t)d->stage);
    d->stage = p;
    d->stage_bytes = bytes;
    return WEFT_OK;
}

/* ---- the data path ----------------------------------------------------- */

/* Runs n host ops together on the engine (as a group does) and waits for
 * all; the first failure. */
weft_status_t weft_dev_run_host(struct weft_dev *d, const struct weft_op_args *args, size_t n)
{
    struct weft_comm *comm = d->comm;
    struct weft_op *ops[n];
    size_t made = 0;
    weft_status_t first = (weft_status_t)atomic_load(&comm->error);
    for (; made < n && first == WEFT_OK; made++) {
        if (atomic_load(&d->abort)) {
            first = WEFT_ERR_ABORTED;
            break;
        }
        first = weft_engine_op_new(comm, &args[made], &ops[made]);
        if (first != WEFT_OK)
            break;
    }
    for (size_t i = 0; i < made; i++)
        weft_engine_submit(comm, ops[i], false);
    for (size_t i = 0; i < made; i++) {
        weft_status_t st = weft_engine_wait(comm, ops[i]);
        if (first == WEFT_OK)
            first = st;
    }
    return first;
}

/* Strided collectives keep one block per rank: a segment is a slice of
 * each block (allgather's output, reduce-scatter's input). */
static int blocks_in(int coll, int p)
{
    return coll == WEFT_COLL_REDUCE_SCATTER ? p : 1;
}

static int blocks_out(int coll, int p)
{
    return coll == WEFT_COLL_ALLGATHER ? p : 1;
}

/* Bytes of a call's send and receive buffers on this rank (0: it has none). */
static void call_bytes(const struct weft_dev *d, const struct weft_op_args *a, size_t *in, size_t *out)
{
    int p = d->comm->nranks, rank = d->comm->rank;
    size_t b = a->count * weft_dtype_size(a->dtype);
    *in = weft_dev_needs_send(a, rank) ? (size_t)blocks_in(a->coll, p) * b : 0;
    *out = weft_dev_needs_recv(a, rank) ? (size_t)blocks_out(a->coll, p) * b : 0;
}

static size_t align64(size_t b)
{
    return (b + 63) & ~(size_t)63;
}

/* Segments a _stream call is cut into: a function of the call's shape and
 * WEFT_CUDA_STAGE_BYTES only, never of where its buffers are, so that
 * every rank issues the same host operations. */
static size_t seg_elems(struct weft_dev *d, const struct weft_op_args *a, size_t esize)
{
    int nb = blocks_in(a->coll, d->comm->nranks) * blocks_out(a->coll, d->comm->nranks);
    size_t m = d->seg_bytes / esize / (size_t)nb;
    return m ? m : 1;
}

/* Copies rows x width bytes with pitches through the driver (unified
 * addressing: either side may be host or device memory). */
static weft_status_t copy2d(struct weft_dev *d, void *dst, size_t dpitch, const void *src, size_t spitch,
                            size_t width, size_t rows)
{
    if (width == 0 || rows == 0)
        return WEFT_OK;
    if (rows == 1 || (dpitch == width && spitch == width))
        return weft_dev_cu_check(d, d->cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src,
                                                width * rows, d->copy),
                        "cuMemcpyAsync (staging)");
    CUDA_MEMCPY2D c = {0};
    c.srcMemoryType = CU_MEMORYTYPE_UNIFIED;
    c.srcDevice = (CUdeviceptr)(uintptr_t)src;
    c.srcPitch = spitch;
    c.dstMemoryType = CU_MEMORYTYPE_UNIFIED;
    c.dstDevice = (CUdeviceptr)(uintptr_t)dst;
    c.dstPitch = dpitch;
    c.WidthInBytes = width;
    c.Height = rows;
    return weft_dev_cu_check(d, d->cu->cuMemcpy2DAsync(&c, d->copy), "cuMemcpy2DAsync (staging)");
}

/* One call, cut into segments that go through two staging slots: the copy
 * in of segment j+1 and the copy out of segment j-1 run on the copy stream
 * while the host engine runs segment j. */
static weft_status_t run_segmented(struct weft_dev *d, const struct weft_op_args *a)
{
    struct weft_comm *comm = d->comm;
    int p = comm->nranks, rank = comm->rank;
    size_t es = weft_dtype_size(a->dtype), n = a->count;
    size_t m = seg_elems(d, a, es);
    size_t nseg = n == 0 ? 1 : (n + m - 1) / m;
    if (nseg == 1)
        m = n;
    int bi = blocks_in(a->coll, p), bo = blocks_out(a->coll, p);
    bool snd = weft_dev_needs_send(a, rank), rcv = weft_dev_needs_recv(a, rank);
    size_t in_b = snd ? (size_t)bi * m * es : 0, out_b = rcv ? (size_t)bo * m * es : 0;
    WEFT_CHECK(stage_reserve(d, 2 * (in_b + out_b)));
    char *slot_in[2] = {d->stage, d->stage + in_b};
    char *slot_out[2] = {d->stage + 2 * in_b, d->stage + 2 * in_b + out_b};
    const char *sb = a->sendbuf;
    char *rb = a->recvbuf;

    weft_status_t st = WEFT_OK;
    for (size_t j = 0; j <= nseg && st == WEFT_OK; j++) {
        /* Copy segment j in (issued one step ahead of its collective). */
        if (j < nseg) {
            int s = (int)(j & 1);
            size_t o = j * m, mj = n - o < m ? n - o : m;
            if (snd)
                st = copy2d(d, slot_in[s], mj * es, sb + o * es, n * es, mj * es, (size_t)bi);
            if (st == WEFT_OK)
                st = weft_dev_cu_check(d, d->cu->cuEventRecord(d->ev_in[s], d->copy), "cuEventRecord");
        }
        if (j == 0 || st != WEFT_OK)
            continue;
        /* Run segment j-1 once its bytes are in, then copy its result out. */
        size_t k = j - 1;
        int s = (int)(k & 1);
        size_t o = k * m, mk = n - o < m ? n - o : m;
        st = weft_dev_cu_check(d, d->cu->cuEventSynchronize(d->ev_in[s]), "cuEventSynchronize (staging)");
        if (st != WEFT_OK)
            break;
        struct weft_op_args seg = *a;
        seg.count = mk;
        seg.sendbuf = snd ? slot_in[s] : NULL;
        seg.recvbuf = rcv ? slot_out[s] : NULL;
        st = weft_dev_run_host(d, &seg, 1);
        if (st == WEFT_OK && rcv)
            st = copy2d(d, rb + o * es, n * es, slot_out[s], mk * es, mk * es, (size_t)bo);
    }
    weft_status_t sync = weft_dev_cu_check(d, d->cu->cuStreamSynchronize(d->copy), "cuStreamSynchronize (staging)");
    return st != WEFT_OK ? st : sync;
}

/* Several calls in flight together (a group, or a plain call): each is
 * staged whole, then all run at once on the engine. */
static weft_status_t run_together(struct weft_dev *d, struct dev_job *job)
{
    size_t total = 0, in, out;
    for (size_t i = 0; i < job->ncalls; i++) {
        call_bytes(d, &job->calls[i].a, &in, &out);
        total += align64(in) + align64(out);
    }
    WEFT_CHECK(stage_reserve(d, total ? total : 64));
    struct weft_op_args args[job->ncalls];
    char *cur = d->stage;
    int rank = d->comm->rank;
    weft_status_t st = WEFT_OK;
    for (size_t i = 0; i < job->ncalls && st == WEFT_OK; i++) {
        const struct weft_op_args *a = &job->calls[i].a;
        call_bytes(d, a, &in, &out);
        args[i] = *a;
        if (weft_dev_needs_send(a, rank)) {
            args[i].sendbuf = cur;
            st = copy2d(d, cur, in, a->sendbuf, in, in, 1);
            cur += align64(in);
        }
        if (weft_dev_needs_recv(a, rank)) {
            args[i].recvbuf = cur;
            cur += align64(out);
        }
    }
    if (st == WEFT_OK)
        st = weft_dev_cu_check(d, d->cu->cuStreamSynchronize(d->copy), "cuStreamSynchronize (staging)");
    if (st == WEFT_OK)
        st = weft_dev_run_host(d, args, job->ncalls);
    for (size_t i = 0; i < job->ncalls && st == WEFT_OK; i++) {
        call_bytes(d, &job->calls[i].a, &in, &out);
        st = copy2d(d, job->calls[i].a.recvbuf, out, args[i].recvbuf, out, out, 1);
    }
    weft_status_t sync = weft_dev_cu_check(d, d->cu->cuStreamSynchronize(d->copy), "cuStreamSynchronize (staging)");
    return st != WEFT_OK ? st : sync;
}

static weft_status_t run_job(struct weft_dev *d, struct dev_job *job)
{
    weft_status_t st = WEFT_OK;
    for (size_t i = 0; i < job->ncalls && st == WEFT_OK; i++)
        if (job->calls[i].start != NULL)
            st = wait_event(d, job->calls[i].start);
    if (st != WEFT_OK)
        return st;
    if (job->ncalls == 1 && job->calls[0].has_stream) {
        const struct weft_op_args *a = &job->calls[0].a;
        bool taken = false;
        if (weft_devipc_applies(d, a)) {
            WEFT_CHECK(weft_devipc_run(d, a, &taken));
            if (taken) {
                atomic_fetch_add(&d->n_ipc, 1);
                return WEFT_OK;
            }
        }
        atomic_fetch_add(&d->n_staged, 1);
        return run_segmented(d, a);
    }
    atomic_fetch_add(&d->n_staged, job->ncalls);
    return run_together(d, job);
}

static void job_free(struct weft_dev *d, struct dev_job *job)
{
    for (size_t i = 0; i < job->ncalls; i++)
        if (job->calls[i].start != NULL)
            event_put(d, job->calls[i].start);
    free(job->calls);
    free(job);
}

static void *worker_main(void *arg)
{
    struct weft_dev *d = arg;
    CUresult r = d->cu->cuCtxSetCurrent(d->ctx);
    weft_status_t setup = weft_dev_cu_check(d, r, "cuCtxSetCurrent in the device worker");
    pthread_mutex_lock(&d->mu);
    for (;;) {
        while (d->head == NULL && !d->stop)
            pthread_cond_wait(&d->cv, &d->mu);
        if (d->head == NULL)
            break;
        struct dev_job *job = d->head;
        d->head = job->next;
        if (d->head == NULL)
            d->tail = NULL;
        pthread_mutex_unlock(&d->mu);

        weft_status_t st = setup;
        if (st == WEFT_OK)
            st = (weft_status_t)atomic_load(&d->comm->error);
        if (st == WEFT_OK && atomic_load(&d->abort))
            st = WEFT_ERR_ABORTED;
        if (st == WEFT_OK)
            st = run_job(d, job);
        if (st != WEFT_OK && st != WEFT_ERR_ABORTED) {
            weft_comm_fail(d->comm, st);
            WEFT_WARN(WEFT_SUB_COLL, "rank %d: device job %u failed: %s", d->comm->rank, job->seq,
                      weft_status_string(st));
        }
        /* The streams go on even when the job failed: the error is the
         * communicator's (weft_comm_get_error), never a hung stream. */
        flag_raise(d, job->seq);

        pthread_mutex_lock(&d->mu);
        d->queued--;
        if (job->waited) {
            job->status = st;
            job->done = true;
        } else {
            pthread_mutex_unlock(&d->mu);
            job_free(d, job);
            pthread_mutex_lock(&d->mu);
        }
        pthread_cond_broadcast(&d->cv);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* ---- creation and teardown --------------------------------------------- */

static void dev_free(struct weft_dev *d)
{
    if (d == NULL)
        return;
    const struct weft_cu *cu = d->cu;
    if (d->ctx != NULL)
        cu->cuCtxSetCurrent(d->ctx);
    weft_devipc_free(d);
    for (size_t i = 0; i < d->nretired; i++)
        retired_free(d, &d->retired[i]);
    free(d->retired);
    for (int s = 0; s < 2; s++)
        if (d->ev_in[s] != NULL)
            cu->cuEventDestroy(d->ev_in[s]);
    for (size_t i = 0; i < d->nevents; i++)
        cu->cuEventDestroy(d->events[i]);
    free(d->events);
    if (d->copy != NULL)
        cu->cuStreamDestroy(d->copy);
    if (d->stage != NULL)
        cu->cuMemFreeHost(d->stage);
    if (d->primary_dev >= 0)
        cu->cuDevicePrimaryCtxRelease(d->primary_dev);
    pthread_cond_destroy(&d->cv);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

/* The context the calls of comm run in: the caller's current one, else
 * that of the device buffer, else device 0's primary context. */
static weft_status_t pick_context(struct weft_dev *d, const struct weft_op_args *a)
{
    const struct weft_cu *cu = d->cu;
    CUcontext ctx = NULL;
    cu->cuCtxGetCurrent(&ctx);
    if (ctx == NULL) {
        weft_cu_mem_kind(a->sendbuf, NULL, &ctx);
        if (ctx == NULL)
            weft_cu_mem_kind(a->recvbuf, NULL, &ctx);
    }
    if (ctx == NULL) {
        CUdevice dev;
        WEFT_CHECK(weft_dev_cu_check(d, cu->cuDeviceGet(&dev, 0), "cuDeviceGet(0)"));
        WEFT_CHECK(weft_dev_cu_check(d, cu->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"));
        d->primary_dev = dev;
    }
    d->ctx = ctx;
    /* The caller's thread makes the stream calls of each call: give it the
     * context when it has none (as the CUDA runtime would). */
    CUcontext cur = NULL;
    cu->cuCtxGetCurrent(&cur);
    if (cur == NULL)
        WEFT_CHECK(weft_dev_cu_check(d, cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent"));
    return WEFT_OK;
}

static weft_status_t dev_create(struct weft_comm *comm, const struct weft_op_args *a, const char *fn,
                                struct weft_dev **out)
{
    const char *why = NULL;
    const struct weft_cu *cu = weft_cu_get(&why);
    if (cu == NULL)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_UNSUPPORTED, "%s: %s", fn, why);
    struct weft_dev *d = calloc(1, sizeof(*d));
    if (d == NULL)
        return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "%s: no memory for the device state", fn);
    d->comm = comm;
    d->cu = cu;
    d->primary_dev = -1;
    pthread_mutex_init(&d->mu, NULL);
    pthread_cond_init(&d->cv, NULL);
    int64_t seg = weft_param_int("WEFT_CUDA_STAGE_BYTES");
    d->seg_bytes = seg >= 4096 ? (size_t)seg : 4096;
    weft_status_t st = pick_context(d, a);
    if (st == WEFT_OK)
        st = flag_alloc(d);
    if (st == WEFT_OK)
        d->next_seq = *d->flag;
    if (st == WEFT_OK)
        st = weft_dev_cu_check(d, cu->cuStreamCreate(&d->copy, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    for (int s = 0; s < 2 && st == WEFT_OK; s++)
        st = weft_dev_cu_check(d, cu->cuEventCreate(&d->ev_in[s], CU_EVENT_DISABLE_TIMING), "cuEventCreate");
    if (st == WEFT_OK && pthread_create(&d->thread, NULL, worker_main, d) != 0)
        st = weft_error(weft_comm_err(comm), WEFT_ERR_SYSTEM, "%s: cannot start the device worker", fn);
    if (st != WEFT_OK) {
        dev_free(d);
        return st;
    }
    d->started = true;
    WEFT_INFO(WEFT_SUB_INIT, "rank %d: device worker started (staging segments of %zu bytes, %s; "
              "%s)", comm->rank, d->seg_bytes,
              cu->memops ? "streams wait on a flag" : "streams wait in host functions",
              comm->topo.nhosts > 1 ? "no GPUDirect RDMA: device buffers between hosts are staged "
                                      "through host memory"
                                    : "one host: CUDA IPC where every rank can");
    *out = d;
    return WEFT_OK;
}

static weft_status_t dev_get(struct weft_comm *comm, const struct weft_op_args *a, const char *fn,
                             struct weft_dev **out)
{
    struct weft_dev *d = dev_of(comm);
    if (d != NULL) {
        *out = d;
        return WEFT_OK;
    }
    pthread_mutex_lock(&create_mu);
    weft_status_t st = WEFT_OK;
    d = dev_of(comm);
    if (d == NULL && (st = dev_create(comm, a, fn, &d)) == WEFT_OK)
        atomic_store(&comm->dev, d);
    pthread_mutex_unlock(&create_mu);
    *out = d;
    return st;
}

/* ---- calls ------------------------------------------------------------- */

static weft_status_t call_prepare(struct weft_dev *d, struct dev_call *c, const struct weft_op_args *a,
                                  bool has_stream, void *stream)
{
    *c = (struct dev_call){.a = *a, .has_stream = has_stream, .stream = stream};
    if (!has_stream)
        return WEFT_OK;
    WEFT_CHECK(event_get(d, &c->start));
    weft_status_t st = weft_dev_cu_check(d, d->cu->cuEventRecord(c->start, c->stream), "cuEventRecord on the caller's stream");
    if (st != WEFT_OK) {
        event_put(d, c->start);
        c->start = NULL;
    }
    return st;
}

static void job_enqueue(struct weft_dev *d, struct dev_job *job)
{
    pthread_mutex_lock(&d->mu);
    job->next = NULL;
    if (d->tail)
        d->tail->next = job;
    else
        d->head = job;
    d->tail = job;
    d->queued++;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

static uint32_t seq_take(struct weft_dev *d)
{
    pthread_mutex_lock(&d->mu);
    uint32_t s = ++d->next_seq;
    pthread_mutex_unlock(&d->mu);
    return s;
}

static weft_status_t job_wait(struct weft_dev *d, struct dev_job *job)
{
    pthread_mutex_lock(&d->mu);
    while (!job->done)
        pthread_cond_wait(&d->cv, &d->mu);
    weft_status_t st = job->status;
    pthread_mutex_unlock(&d->mu);
    job_free(d, job);
    return st;
}

/* This thread's open group: one job per communicator. */
struct group_job {
    struct weft_dev *d;
    struct dev_job *job;
};
static __thread struct group_job *gjobs;
static __thread size_t ngjobs, capgjobs;

static struct dev_job *job_new(void)
{
    return calloc(1, sizeof(struct dev_job));
}

static weft_status_t job_add(struct weft_comm *comm, struct dev_job *job, const struct dev_call *c)
{
    if (job->ncalls == job->cap) {
        size_t cap = job->cap ? 2 * job->cap : 4;
        struct dev_call *n = realloc(job->calls, cap * sizeof(*n));
        if (n == NULL)
            return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "device call: no memory");
        job->calls = n;
        job->cap = cap;
    }
    job->calls[job->ncalls++] = *c;
    return WEFT_OK;
}

static struct group_job *group_slot(struct weft_dev *d)
{
    for (size_t i = 0; i < ngjobs; i++)
        if (gjobs[i].d == d)
            return &gjobs[i];
    if (ngjobs == capgjobs) {
        size_t cap = capgjobs ? 2 * capgjobs : 4;
        struct group_job *n = realloc(gjobs, cap * sizeof(*n));
        if (n == NULL)
            return NULL;
        gjobs = n;
        capgjobs = cap;
    }
    struct dev_job *job = job_new();
    if (job == NULL)
        return NULL;
    job->seq = seq_take(d);
    gjobs[ngjobs] = (struct group_job){d, job};
    return &gjobs[ngjobs++];
}

weft_status_t weft_dev_call(struct weft_comm *comm, const struct weft_op_args *a, bool has_stream,
                            void *stream, const char *fn, bool in_group)
{
    struct weft_dev *d;
    WEFT_CHECK(dev_get(comm, a, fn, &d));
    struct dev_call c;
    if (in_group) {
        struct group_job *g = group_slot(d);
        if (g == NULL)
            return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "%s: cannot queue in the group", fn);
        /* The stream waits are enqueued at group end, after every call
         * of the group has recorded its event: a wait before a later
         * call's event on the same stream would hold that event forever. */
        WEFT_CHECK(call_prepare(d, &c, a, has_stream, stream));
        weft_status_t st = job_add(comm, g->job, &c);
        if (st != WEFT_OK && c.start != NULL)
            event_put(d, c.start);
        g->job->waited |= !has_stream;
        return st;
    }
    struct dev_job *job = job_new();
    if (job == NULL)
        return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "%s: no memory", fn);
    weft_status_t st = call_prepare(d, &c, a, has_stream, stream);
    if (st == WEFT_OK)
        st = job_add(comm, job, &c);
    if (st != WEFT_OK) {
        job_free(d, job);
        return st;
    }
    job->seq = seq_take(d);
    job->waited = !has_stream;
    /* The wait goes on the stream before the job can run, so the flag can
     * never pass it unseen. */
    if (has_stream && (st = stream_wait_flag(d, c.stream, job->seq)) != WEFT_OK) {
        /* The seq is spent: a job with nothing to do keeps the flag moving. */
        job->ncalls = 0;
        event_put(d, c.start);
        free(job->calls);
        job->calls = NULL;
        job_enqueue(d, job);
        return st;
    }
    job_enqueue(d, job);
    return has_stream ? WEFT_OK : job_wait(d, job);
}

weft_status_t weft_dev_group_end(void)
{
    weft_status_t first = WEFT_OK;
    size_t n = ngjobs;
    ngjobs = 0;
    for (size_t i = 0; i < n; i++) {
        struct weft_dev *d = gjobs[i].d;
        struct dev_job *job = gjobs[i].job;
        for (size_t k = 0; k < job->ncalls; k++) {
            struct dev_call *c = &job->calls[k];
            bool seen = false;
            for (size_t j = 0; j < k && !seen; j++)
                seen = job->calls[j].has_stream && job->calls[j].stream == c->stream;
            if (!c->has_stream || seen)
                continue;
            weft_status_t st = stream_wait_flag(d, c->stream, job->seq);
            if (first == WEFT_OK)
                first = st;
        }
        /* A job nobody waits for is the worker's once queued: it may be
         * freed before the loop below, so forget it here. */
        if (!job->waited)
            gjobs[i].job = NULL;
        job_enqueue(d, job);
    }
    for (size_t i = 0; i < n; i++) {
        if (gjobs[i].job == NULL)
            continue;
        weft_status_t st = job_wait(gjobs[i].d, gjobs[i].job);
        if (first == WEFT_OK)
            first = st;
    }
    return first;
}

weft_status_t weft_dev_drain(struct weft_comm *comm)
{
    struct weft_dev *d = dev_of(comm);
    if (d == NULL)
        return WEFT_OK;
    pthread_mutex_lock(&d->mu);
    while (d->queued > 0)
        pthread_cond_wait(&d->cv, &d->mu);
    pthread_mutex_unlock(&d->mu);
    return (weft_status_t)atomic_load(&comm->error);
}

void weft_dev_abort(struct weft_comm *comm)
{
    struct weft_dev *d = dev_of(comm);
    if (d == NULL)
        return;
    atomic_store(&d->abort, 1);
    pthread_mutex_lock(&d->mu);
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

void weft_dev_destroy(struct weft_comm *comm)
{
    struct weft_dev *d = dev_of(comm);
    if (d == NULL)
        return;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_broadcast(&d->cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thread, NULL);
    /* Every seq handed out is released, run or not. */
    flag_raise(d, d->next_seq);
    atomic_store(&comm->dev, NULL);
    dev_free(d);
}

void weft_dev_stats(struct weft_comm *comm, uint64_t *ipc, uint64_t *staged)
{
    struct weft_dev *d = dev_of(comm);
    *ipc = d ? atomic_load(&d->n_ipc) : 0;
    *staged = d ? atomic_load(&d->n_staged) : 0;
}

int weft_cuda_device_count(void)
{
    const struct weft_cu *cu = weft_cu_get(NULL);
    return cu ? cu->ndev : 0;
}
