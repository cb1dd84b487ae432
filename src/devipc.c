/*
 * devipc.c - collectives on device buffers between processes of one host:
 * each rank maps its peers' buffers with CUDA IPC, reduces with the GPU
 * kernels of src/cuda (contributions combined in rank order, so every rank
 * gets the same bits, run after run) and copies device to device.  The
 * host engine carries only a handshake and barriers.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "src/cuda/kernels.h"
#include "devbuf_impl.h"

#define IPC_CACHE 256       /* peer allocations kept mapped */
#define THREADS 256         /* per block of the reduction kernels */
#define MAX_BLOCKS 4096

/* A peer allocation mapped here, found again by its handle's bytes. */
struct ipc_map {
    CUipcMemHandle h;
    CUdeviceptr base;
    uint64_t last_use;
    bool used;
};

/*
 * Owner: the device state (weft_devipc_free).  Worker thread only.
 * kernels: 1 loaded, -1 unavailable (no fatbin or the module failed).
 */
struct weft_devipc {
    int kernels;
    CUmodule mod;
    CUfunction fn[WEFT_NUM_DTYPES][WEFT_NUM_OPS];
    struct ipc_map map[IPC_CACHE];
    uint64_t clock;
    CUdeviceptr scratch;    /* for reductions in place */
    size_t scratch_bytes;
};

/* What each rank tells the others before a call (allgathered). */
struct ipc_rec {
    uint32_t ok;            /* this rank's buffers can be shared */
    uint32_t pid;
    CUipcMemHandle hs, hr;  /* send and receive allocations */
    uint64_t off_s, off_r;  /* the buffers' offsets in them */
};

static weft_status_t cu(struct weft_dev *d, CUresult r, const char *what)
{
    return weft_dev_cu_check(d, r, what);
}

bool weft_devipc_applies(struct weft_dev *d, const struct weft_op_args *a)
{
    struct weft_comm *comm = d->comm;
    return comm->nranks > 1 && comm->topo.nhosts == 1 && weft_param_int("WEFT_CUDA_IPC") != 0 &&
           a->coll != WEFT_COLL_SEND && a->coll != WEFT_COLL_RECV;
}

static struct weft_devipc *ipc_state(struct weft_dev *d)
{
    if (d->ipc == NULL)
        d->ipc = calloc(1, sizeof(*d->ipc));
    return d->ipc;
}

/* Loads the kernels once; false when this build or device has none. */
static bool kernels_ready(struct weft_dev *d, struct weft_devipc *x)
{
    if (x->kernels == 0) {
        x->kernels = -1;
        if (weft_cuda_fatbin_len > 0 &&
            d->cu->cuModuleLoadData(&x->mod, weft_cuda_fatbin) == CUDA_SUCCESS)
            x->kernels = 1;
        else
            WEFT_INFO(WEFT_SUB_COLL, "rank %d: no CUDA kernels for this device%s: device buffers go "
                      "through host memory", d->comm->rank,
                      weft_cuda_fatbin_len ? " (cuModuleLoadData failed)" : " (built without nvcc)");
    }
    return x->kernels == 1;
}

static CUfunction kernel(struct weft_dev *d, struct weft_devipc *x, weft_dtype_t dt, weft_op_t op)
{
    if (x->fn[dt][op] == NULL) {
        const char *name = weft_cuda_kernel_name(dt, op);
        if (name == NULL || d->cu->cuModuleGetFunction(&x->fn[dt][op], x->mod, name) != CUDA_SUCCESS)
            x->fn[dt][op] = NULL;
    }
    return x->fn[dt][op];
}

/* This rank's side of the handshake for buffer p (NULL: not needed). */
static bool export(struct weft_dev *d, const void *p, CUipcMemHandle *h, uint64_t *off)
{
    memset(h, 0, sizeof(*h));
    *off = 0;
    if (p == NULL)
        return true;
    if (weft_cu_mem_kind(p, NULL, NULL) != WEFT_MEM_DEVICE)
        return false; /* host or managed memory has no IPC handle */
    CUdeviceptr base = 0;
    size_t size = 0;
    if (d->cu->cuMemGetAddressRange(&base, &size, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS ||
        d->cu->cuIpcGetMemHandle(h, base) != CUDA_SUCCESS)
        return false;
    *off = (uint64_t)((uintptr_t)p - base);
    return true;
}

/* A peer's allocation, mapped here (cached by handle). */
static weft_status_t import(struct weft_dev *d, struct weft_devipc *x, const CUipcMemHandle *h,
                            CUdeviceptr *base)
{
    struct ipc_map *lru = &x->map[0];
    for (int i = 0; i < IPC_CACHE; i++) {
        struct ipc_map *m = &x->map[i];
        if (m->used && memcmp(&m->h, h, sizeof(*h)) == 0) {
            m->last_use = ++x->clock;
            *base = m->base;
            return WEFT_OK;
        }
        if (!m->used || (lru->used && m->last_use < lru->last_use))
            lru = m;
    }
    if (lru->used)
        weft_dev_retire(d, WEFT_RETIRE_IPC, (uintptr_t)lru->base);
    lru->used = false;
    WEFT_CHECK(cu(d, d->cu->cuIpcOpenMemHandle(base, *h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                  "cuIpcOpenMemHandle of a peer's buffer"));
    *lru = (struct ipc_map){.h = *h, .base = *base, .last_use = ++x->clock, .used = true};
    return WEFT_OK;
}

/* Every rank's flag, combined: the first failure anywhere fails all, so
 * they all take the same next step. */
static weft_status_t barrier_flag(struct weft_dev *d, int32_t mine, int32_t *any)
{
    struct weft_op_args b = {.coll = WEFT_COLL_ALLREDUCE, .sendbuf = &mine, .recvbuf = any,
                             .count = 1, .dtype = WEFT_INT32, .op = WEFT_MAX};
    return weft_dev_run_host(d, &b, 1);
}

static weft_status_t launch(struct weft_dev *d, CUfunction f, CUdeviceptr dst, CUdeviceptr a,
                            CUdeviceptr b, size_t n, int div)
{
    size_t blocks = (n + THREADS - 1) / THREADS;
    if (blocks > MAX_BLOCKS)
        blocks = MAX_BLOCKS;
    void *params[] = {&dst, &a, &b, &n, &div};
    return cu(d, d->cu->cuLaunchKernel(f, (unsigned)blocks, 1, 1, THREADS, 1, 1, 0, d->copy, params, NULL),
              "cuLaunchKernel (reduction)");
}

/* dst = src[0] op src[1] op ... op src[p-1], combined left to right (AVG
 * divides once, at the last step).  A dst that is one of the later inputs
 * is computed in scratch first, so no input is overwritten before use. */
static weft_status_t chain(struct weft_dev *d, struct weft_devipc *x, CUdeviceptr dst,
                           const CUdeviceptr *src, int p, size_t n, weft_dtype_t dt, weft_op_t op)
{
    size_t bytes = n * weft_dtype_size(dt);
    if (n == 0)
        return WEFT_OK;
    if (p == 1)
        return dst == src[0] ? WEFT_OK
                             : cu(d, d->cu->cuMemcpyAsync(dst, src[0], bytes, d->copy), "cuMemcpyAsync");
    CUfunction f = kernel(d, x, dt, op);
    if (f == NULL)
        return weft_error(weft_comm_err(d->comm), WEFT_ERR_INTERNAL,
                          "no CUDA kernel for this datatype and op");
    CUdeviceptr out = dst;
    for (int k = 2; k < p; k++)
        if (src[k] == dst)
            out = 0;
    if (out == 0) {
        if (x->scratch_bytes < bytes) {
            if (x->scratch)
                weft_dev_retire(d, WEFT_RETIRE_DEVICE, (uintptr_t)x->scratch);
            x->scratch = 0;
            x->scratch_bytes = 0;
            WEFT_CHECK(cu(d, d->cu->cuMemAlloc(&x->scratch, bytes), "cuMemAlloc of the IPC scratch"));
            x->scratch_bytes = bytes;
        }
        out = x->scratch;
    }
    for (int k = 1; k < p; k++)
        WEFT_CHECK(launch(d, f, out, k == 1 ? src[0] : out, src[k], n,
                          op == WEFT_AVG && k == p - 1 ? p : 0));
    if (out != dst)
        WEFT_CHECK(cu(d, d->cu->cuMemcpyAsync(dst, out, bytes, d->copy), "cuMemcpyAsync"));
    return WEFT_OK;
}

/* Rank r's share of n elements: [n*r/p, n*(r+1)/p). */
static size_t share(size_t n, int r, int p)
{
    return (size_t)((unsigned __int128)n * (unsigned)r / (unsigned)p);
}

static weft_status_t compute(struct weft_dev *d, struct weft_devipc *x, const struct weft_op_args *a,
                             const CUdeviceptr *ps)
{
    int p = d->comm->nranks, r = d->comm->rank;
    size_t es = weft_dtype_size(a->dtype), n = a->count;
    CUdeviceptr rb = (CUdeviceptr)(uintptr_t)a->recvbuf, sb = (CUdeviceptr)(uintptr_t)a->sendbuf;
    CUdeviceptr src[p];
    switch (a->coll) {
    case WEFT_COLL_ALLREDUCE: {
        size_t lo = share(n, r, p), hi = share(n, r + 1, p);
        for (int q = 0; q < p; q++)
            src[q] = ps[q] + lo * es;
        return chain(d, x, rb + lo * es, src, p, hi - lo, a->dtype, a->op);
    }
    case WEFT_COLL_REDUCE_SCATTER:
        for (int q = 0; q < p; q++)
            src[q] = ps[q] + (size_t)r * n * es;
        return chain(d, x, rb, src, p, n, a->dtype, a->op);
    case WEFT_COLL_REDUCE:
        return r == a->root ? chain(d, x, rb, ps, p, n, a->dtype, a->op) : WEFT_OK;
    case WEFT_COLL_ALLGATHER:
        for (int q = 0; q < p && n > 0; q++) {
            CUdeviceptr to = rb + (size_t)q * n * es;
            CUdeviceptr from = q == r ? sb : ps[q];
            if (to != from)
                WEFT_CHECK(cu(d, d->cu->cuMemcpyAsync(to, from, n * es, d->copy), "cuMemcpyAsync"));
        }
        return WEFT_OK;
    case WEFT_COLL_BROADCAST: {
        CUdeviceptr from = r == a->root ? sb : ps[a->root];
        if (n == 0 || from == rb)
            return WEFT_OK;
        return cu(d, d->cu->cuMemcpyAsync(rb, from, n * es, d->copy), "cuMemcpyAsync");
    }
    default: return WEFT_ERR_INTERNAL;
    }
}

/* AllReduce's second half: every rank's share, from its owner. */
static weft_status_t gather_shares(struct weft_dev *d, const struct weft_op_args *a, const CUdeviceptr *pr)
{
    int p = d->comm->nranks, r = d->comm->rank;
    size_t es = weft_dtype_size(a->dtype), n = a->count;
    for (int q = 0; q < p; q++) {
        size_t lo = share(n, q, p), hi = share(n, q + 1, p);
        if (q == r || hi == lo)
            continue;
        WEFT_CHECK(cu(d, d->cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)a->recvbuf + lo * es, pr[q] + lo * es,
                                              (hi - lo) * es, d->copy),
                      "cuMemcpyAsync"));
    }
    return WEFT_OK;
}

weft_status_t weft_devipc_run(struct weft_dev *d, const struct weft_op_args *a, bool *taken)
{
    struct weft_comm *comm = d->comm;
    int p = comm->nranks, r = comm->rank;
    *taken = false;
    struct weft_devipc *x = ipc_state(d);
    bool reducing = a->coll == WEFT_COLL_ALLREDUCE || a->coll == WEFT_COLL_REDUCE ||
                    a->coll == WEFT_COLL_REDUCE_SCATTER;
    bool snd = weft_dev_needs_send(a, r), rcv = weft_dev_needs_recv(a, r);
    /* Who reads whose buffers: every rank reads the senders' ones; only
     * AllReduce reads receive buffers (the shares). */
    struct ipc_rec mine = {.pid = (uint32_t)getpid()};
    mine.ok = x != NULL && (!reducing || kernels_ready(d, x)) &&
              export(d, snd ? a->sendbuf : NULL, &mine.hs, &mine.off_s) &&
              export(d, rcv && a->coll == WEFT_COLL_ALLREDUCE ? a->recvbuf : NULL, &mine.hr, &mine.off_r);
    struct ipc_rec *all = calloc((size_t)p, sizeof(*all));
    if (all == NULL)
        return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "CUDA IPC handshake: no memory");
    struct weft_op_args hs = {.coll = WEFT_COLL_ALLGATHER, .sendbuf = &mine, .recvbuf = all,
                              .count = sizeof(mine), .dtype = WEFT_UINT8};
    weft_status_t st = weft_dev_run_host(d, &hs, 1);
    bool go = st == WEFT_OK;
    for (int q = 0; q < p && go; q++)
        go = all[q].ok && (q == r || all[q].pid != mine.pid); /* one process cannot open its own handles */
    if (!go) {
        free(all);
        return st;
    }
    /* Map what this rank reads. */
    CUdeviceptr ps[p], pr[p];
    int32_t bad = 0, any = 0;
    for (int q = 0; q < p && !bad; q++) {
        ps[q] = (CUdeviceptr)(uintptr_t)a->sendbuf;
        pr[q] = (CUdeviceptr)(uintptr_t)a->recvbuf;
        if (q == r)
            continue;
        bool need_s = a->coll == WEFT_COLL_BROADCAST ? q == a->root && r != q
                    : a->coll == WEFT_COLL_REDUCE    ? r == a->root
                                                     : true;
        CUdeviceptr base;
        if (need_s && import(d, x, &all[q].hs, &base) != WEFT_OK)
            bad = 1;
        else if (need_s)
            ps[q] = base + all[q].off_s;
        if (!bad && a->coll == WEFT_COLL_ALLREDUCE) {
            if (import(d, x, &all[q].hr, &base) != WEFT_OK)
                bad = 1;
            else
                pr[q] = base + all[q].off_r;
        }
    }
    free(all);
    WEFT_CHECK(barrier_flag(d, bad, &any));
    if (any) {
        WEFT_INFO(WEFT_SUB_COLL, "rank %d: a rank could not map its peers' buffers: staging instead", r);
        return WEFT_OK; /* every rank saw the same flag: all stage */
    }
    *taken = true;
    /* Compute, wait for it, and make sure every rank is done reading the
     * inputs before any rank writes over them (AllReduce's shares) or
     * releases its stream. */
    st = compute(d, x, a, ps);
    if (st == WEFT_OK)
        st = cu(d, d->cu->cuStreamSynchronize(d->copy), "cuStreamSynchronize (IPC)");
    WEFT_CHECK(barrier_flag(d, st != WEFT_OK, &any));
    if (st == WEFT_OK && any)
        st = weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE, "a peer's GPU reduction failed");
    if (st != WEFT_OK || a->coll != WEFT_COLL_ALLREDUCE)
        return st;
    st = gather_shares(d, a, pr);
    if (st == WEFT_OK)
        st = cu(d, d->cu->cuStreamSynchronize(d->copy), "cuStreamSynchronize (IPC)");
    WEFT_CHECK(barrier_flag(d, st != WEFT_OK, &any));
    if (st == WEFT_OK && any)
        st = weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE, "a peer's GPU copy failed");
    return st;
}

void weft_devipc_free(struct weft_dev *d)
{
    struct weft_devipc *x = d->ipc;
    if (x == NULL)
        return;
    for (int i = 0; i < IPC_CACHE; i++)
        if (x->map[i].used)
            d->cu->cuIpcCloseMemHandle(x->map[i].base);
    if (x->scratch)
        d->cu->cuMemFree(x->scratch);
    if (x->mod)
        d->cu->cuModuleUnload(x->mod);
    free(x);
    d->ipc = NULL;
}
