/*
 * fakecuda.c - the fake CUDA driver's devices, contexts, memory (device
 * addresses the CPU cannot touch, shadowed by memfds), pointer attributes,
 * IPC through /proc/<pid>/fd, and what a fork child inherits.  Streams,
 * events and kernels are in fc_stream.c; fakecuda.h says what is emulated.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fc_internal.h"

struct fc_state fc = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .progress = PTHREAD_COND_INITIALIZER,
};
__thread bool fc_in_host_fn;

/* The thread's current context, valid while tls_gen == fc.gen. */
static __thread struct fc_ctx *tls_ctx;
static __thread unsigned tls_gen;

/* ---- errors ---- */

static const struct {
    CUresult r;
    const char *name, *text;
} fc_errors[] = {
#define E(code, text) {code, #code, text}
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    E(CUDA_ERROR_MAP_FAILED, "mapping of buffer object failed"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
#undef E
};

/* Sets *pStr to error's name (name true) or text; NULL and INVALID_VALUE
 * for an error the table lacks. */
static CUresult fc_error_str(CUresult error, bool name, const char **pStr)
{
    for (size_t i = 0; i < sizeof fc_errors / sizeof fc_errors[0]; i++)
        if (fc_errors[i].r == error) {
            *pStr = name ? fc_errors[i].name : fc_errors[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FC_API CUresult cuGetErrorString(CUresult error, const char **pStr) { return fc_error_str(error, false, pStr); }
FC_API CUresult cuGetErrorName(CUresult error, const char **pStr) { return fc_error_str(error, true, pStr); }

/* ---- init, devices ---- */

CUresult fc_enter(void)
{
    if (fc_in_host_fn)
        return CUDA_ERROR_NOT_PERMITTED;
    return atomic_load(&fc.inited) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult fc_enter_ctx(struct fc_ctx **ctx)
{
    FC_CHECK(fc_enter());
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc.lock);
    struct fc_ctx *c = tls_gen == fc.gen ? tls_ctx : NULL;
    if (c == NULL)
        r = CUDA_ERROR_INVALID_CONTEXT;
    else if (c->retained == 0)
        r = CUDA_ERROR_CONTEXT_IS_DESTROYED;
    pthread_mutex_unlock(&fc.lock);
    if (ctx != NULL)
        *ctx = c;
    return r;
}

static void fc_atfork_prepare(void) { pthread_mutex_lock(&fc.lock); }
static void fc_atfork_parent(void) { pthread_mutex_unlock(&fc.lock); }

/* The child has none of the parent's stream threads: it forgets every
 * object (leaking their memory is harmless) and starts un-initialized.
 * Device reservations stay PROT_NONE so stale device pointers still fault;
 * the shadows and memfds go so the child shares no bytes with the parent. */
static void fc_atfork_child(void)
{
    pthread_mutex_init(&fc.lock, NULL);
    pthread_cond_init(&fc.progress, NULL);
    for (struct fc_alloc *a = fc.allocs; a != NULL; a = a->next) {
        if (a->kind == FC_DEVICE || a->kind == FC_IPC)
            munmap(a->shadow, a->maplen);
        if (a->fd >= 0)
            close(a->fd);
    }
    fc.allocs = NULL;
    fc_streams_forget();
    memset(fc.ctx, 0, sizeof fc.ctx);
    fc.gen++;
    atomic_store(&fc.inited, 0);
}

__attribute__((constructor)) static void fc_register_atfork(void)
{
    pthread_atfork(fc_atfork_prepare, fc_atfork_parent, fc_atfork_child);
}

FC_API CUresult cuInit(unsigned int Flags)
{
    if (fc_in_host_fn)
        return CUDA_ERROR_NOT_PERMITTED;
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    CUresult r = CUDA_SUCCESS;
    if (!atomic_load(&fc.inited)) {
        const char *s = getenv("FAKECUDA_DEVICES");
        int n = s != NULL && *s != '\0' ? atoi(s) : 1;
        s = getenv("FAKECUDA_NO_MEMOPS");
        fc.memops = !(s != NULL && strcmp(s, "1") == 0);
        if (n <= 0) {
            r = CUDA_ERROR_NO_DEVICE;
        } else {
            fc.ndev = n > FC_MAX_DEV ? FC_MAX_DEV : n;
            for (int d = 0; d < fc.ndev; d++)
                fc.ctx[d] = (struct fc_ctx){.dev = d};
            atomic_store(&fc.inited, 1);
        }
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

FC_API CUresult cuDriverGetVersion(int *driverVersion)
{
    /* The real one answers before cuInit too. */
    if (driverVersion == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *driverVersion = 13000;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetCount(int *count)
{
    FC_CHECK(fc_enter());
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fc.ndev;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    FC_CHECK(fc_enter());
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fc_dev_ok(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    FC_CHECK(fc_enter());
    if (!fc_dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (pi == NULL || (int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    int v = 0;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM:
    case CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR:
        v = fc.memops;
        break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
        v = 1;
        break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = 9; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 4; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: v = 0x7fffffff; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = dev + 1; break;
    default: break; /* a real attribute the fake has no hardware for: 0 */
    }
    *pi = v;
    return CUDA_SUCCESS;
}

FC_API CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FC_CHECK(fc_enter());
    if (!fc_dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "weft fakecuda %d", dev);
    return CUDA_SUCCESS;
}

/* ---- contexts ---- */

FC_API CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FC_CHECK(fc_enter());
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (!fc_dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&fc.lock);
    fc.ctx[dev].retained++;
    pthread_mutex_unlock(&fc.lock);
    *pctx = (CUcontext)&fc.ctx[dev];
    return CUDA_SUCCESS;
}

FC_API CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    FC_CHECK(fc_enter());
    if (!fc_dev_ok(dev))
        return CUDA_ERROR_INVALID_DEVICE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc.lock);
    if (fc.ctx[dev].retained > 0)
        fc.ctx[dev].retained--;
    else
        r = CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_unlock(&fc.lock);
    return r;
}

static struct fc_ctx *fc_ctx_of(CUcontext c)
{
    for (int d = 0; d < fc.ndev; d++)
        if ((CUcontext)&fc.ctx[d] == c)
            return &fc.ctx[d];
    return NULL;
}

FC_API CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FC_CHECK(fc_enter());
    struct fc_ctx *c = NULL;
    if (ctx != NULL && (c = fc_ctx_of(ctx)) == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&fc.lock);
    tls_ctx = c;
    tls_gen = fc.gen;
    pthread_mutex_unlock(&fc.lock);
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FC_CHECK(fc_enter());
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    *pctx = tls_gen == fc.gen ? (CUcontext)tls_ctx : NULL;
    pthread_mutex_unlock(&fc.lock);
    return CUDA_SUCCESS;
}

FC_API CUresult cuCtxGetDevice(CUdevice *device)
{
    struct fc_ctx *c;
    FC_CHECK(fc_enter_ctx(&c));
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *device = c->dev;
    return CUDA_SUCCESS;
}

/* ---- the allocation table ---- */

struct fc_alloc *fc_find(uintptr_t p, size_t n, bool *short_range)
{
    if (short_range != NULL)
        *short_range = false;
    for (struct fc_alloc *a = fc.allocs; a != NULL; a = a->next) {
        if (p < a->base || p >= a->base + a->bytes)
            continue;
        if (n > a->bytes - (p - a->base)) {
            if (short_range != NULL)
                *short_range = true;
            return NULL;
        }
        return a;
    }
    return NULL;
}

void *fc_host_addr(CUdeviceptr p, size_t n)
{
    pthread_mutex_lock(&fc.lock);
    bool short_range;
    struct fc_alloc *a = fc_find((uintptr_t)p, n, &short_range);
    void *h = short_range ? NULL : a != NULL ? a->shadow + ((uintptr_t)p - a->base) : (void *)(uintptr_t)p;
    pthread_mutex_unlock(&fc.lock);
    return h;
}

FC_API void *fakecuda_shadow(CUdeviceptr p)
{
    pthread_mutex_lock(&fc.lock);
    struct fc_alloc *a = fc_find((uintptr_t)p, 0, NULL);
    void *h = a != NULL && (a->kind == FC_DEVICE || a->kind == FC_IPC)
                  ? a->shadow + ((uintptr_t)p - a->base)
                  : NULL;
    pthread_mutex_unlock(&fc.lock);
    return h;
}

FC_API size_t fakecuda_live_allocations(void)
{
    size_t n = 0;
    pthread_mutex_lock(&fc.lock);
    for (struct fc_alloc *a = fc.allocs; a != NULL; a = a->next)
        n++;
    pthread_mutex_unlock(&fc.lock);
    return n;
}

static size_t fc_pagelen(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

/* Unlinks the allocation of kind k based at p, after the streams that may
 * still use it have run (the real free synchronizes).  false: no such
 * allocation; *out NULL: an IPC mapping still opened elsewhere here. */
static bool fc_unlink(uintptr_t p, enum fc_kind k, struct fc_alloc **out)
{
    pthread_mutex_lock(&fc.lock);
    struct fc_alloc *a = fc.allocs;
    while (a != NULL && (a->base != p || a->kind != k || a->dying))
        a = a->next;
    *out = NULL;
    if (a != NULL && (k != FC_IPC || --a->refs == 0)) {
        a->dying = true; /* a second free of it fails from now on */
        fc_drain_locked(a->kind == FC_HOST ? NULL : a->ctx); /* pinned: any device may use it */
        /* Looked up again: the drain dropped the lock. */
        struct fc_alloc **pp = &fc.allocs;
        while (*pp != a)
            pp = &(*pp)->next;
        *pp = a->next;
        *out = a;
    }
    pthread_mutex_unlock(&fc.lock);
    return a != NULL;
}

static void fc_release(struct fc_alloc *a)
{
    if (a->kind == FC_DEVICE || a->kind == FC_IPC)
        munmap((void *)a->base, a->maplen);
    munmap(a->shadow, a->maplen);
    if (a->fd >= 0)
        close(a->fd);
    free(a);
}

/* A device address: reserved, never accessible, so a CPU access faults. */
static void *fc_reserve(size_t maplen)
{
    void *p = mmap(NULL, maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

FC_API CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize)
{
    struct fc_ctx *c;
    FC_CHECK(fc_enter_ctx(&c));
    if (dptr == NULL || bytesize == 0)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *a = (struct fc_alloc){.kind = FC_DEVICE, .bytes = bytesize, .maplen = fc_pagelen(bytesize), .ctx = c};
    pthread_mutex_lock(&fc.lock);
    a->id = ++fc.next_id;
    pthread_mutex_unlock(&fc.lock);
    char name[64];
    snprintf(name, sizeof name, "fakecuda:%" PRIu64, a->id);
    a->fd = memfd_create(name, MFD_CLOEXEC);
    if (a->fd < 0)
        goto fail_fd;
    if (ftruncate(a->fd, (off_t)a->maplen) != 0)
        goto fail_map;
    a->shadow = mmap(NULL, a->maplen, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
    if (a->shadow == MAP_FAILED)
        goto fail_map;
    void *dev = fc_reserve(a->maplen);
    if (dev == NULL)
        goto fail_reserve;
    a->base = (uintptr_t)dev;
    FC_LINK(allocs, a);
    *dptr = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
fail_reserve:
    munmap(a->shadow, a->maplen);
fail_map:
    close(a->fd);
fail_fd:
    free(a);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

FC_API CUresult cuMemFree(CUdeviceptr dptr)
{
    FC_CHECK(fc_enter_ctx(NULL));
    if (dptr == 0)
        return CUDA_SUCCESS;
    struct fc_alloc *a;
    if (!fc_unlink((uintptr_t)dptr, FC_DEVICE, &a) && !fc_unlink((uintptr_t)dptr, FC_MANAGED, &a))
        return CUDA_ERROR_INVALID_VALUE;
    fc_release(a);
    return CUDA_SUCCESS;
}

/* Host memory the CPU may use: pinned (host) or managed. */
static CUresult fc_alloc_host(void **p, size_t bytesize, enum fc_kind kind, struct fc_ctx *c)
{
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (a == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *a = (struct fc_alloc){.kind = kind, .bytes = bytesize, .maplen = fc_pagelen(bytesize), .fd = -1, .ctx = c};
    a->shadow = mmap(NULL, a->maplen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a->shadow == MAP_FAILED) {
        free(a);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    a->base = (uintptr_t)a->shadow;
    FC_LINK(allocs, a);
    *p = a->shadow;
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    struct fc_ctx *c;
    FC_CHECK(fc_enter_ctx(&c));
    unsigned all = CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (pp == NULL || bytesize == 0 || (Flags & ~all) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    return fc_alloc_host(pp, bytesize, FC_HOST, c);
}

FC_API CUresult cuMemFreeHost(void *p)
{
    FC_CHECK(fc_enter_ctx(NULL));
    struct fc_alloc *a;
    if (!fc_unlink((uintptr_t)p, FC_HOST, &a))
        return CUDA_ERROR_INVALID_VALUE;
    fc_release(a);
    return CUDA_SUCCESS;
}

FC_API CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    struct fc_ctx *c;
    FC_CHECK(fc_enter_ctx(&c));
    if (dptr == NULL || bytesize == 0 || (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST))
        return CUDA_ERROR_INVALID_VALUE;
    void *p;
    CUresult r = fc_alloc_host(&p, bytesize, FC_MANAGED, c);
    if (r == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)p;
    return r;
}

FC_API CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags)
{
    FC_CHECK(fc_enter_ctx(NULL));
    if (pdptr == NULL || Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&fc.lock);
    struct fc_alloc *a = fc_find((uintptr_t)p, 0, NULL);
    CUresult r = a == NULL || a->kind != FC_HOST ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS;
    pthread_mutex_unlock(&fc.lock);
    if (r == CUDA_SUCCESS)
        *pdptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    return r;
}

FC_API CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FC_CHECK(fc_enter_ctx(NULL));
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc.lock);
    struct fc_alloc *a = fc_find((uintptr_t)dptr, 0, NULL);
    if (a == NULL) {
        r = CUDA_ERROR_NOT_FOUND;
    } else {
        if (pbase != NULL)
            *pbase = (CUdeviceptr)a->base;
        if (psize != NULL)
            *psize = a->bytes;
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* Unknown pointers (plain host memory) succeed with every attribute
 * zeroed, as the real one does.  Needs no current context. */
FC_API CUresult cuPointerGetAttributes(unsigned int numAttributes, CUpointer_attribute *attributes,
                                       void **data, CUdeviceptr ptr)
{
    FC_CHECK(fc_enter());
    if (numAttributes > 0 && (attributes == NULL || data == NULL))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc.lock);
    struct fc_alloc *a = fc_find((uintptr_t)ptr, 0, NULL);
    struct fc_alloc none = {.kind = FC_HOST};
    bool known = a != NULL;
    if (!known)
        a = &none;
    bool dev = a->kind == FC_DEVICE || a->kind == FC_IPC;
    for (unsigned i = 0; i < numAttributes && r == CUDA_SUCCESS; i++) {
        void *d = data[i];
        switch (attributes[i]) {
        case CU_POINTER_ATTRIBUTE_MEMORY_TYPE:
            *(unsigned int *)d = !known ? 0
                               : a->kind == FC_HOST ? CU_MEMORYTYPE_HOST
                                                    : CU_MEMORYTYPE_DEVICE;
            break;
        case CU_POINTER_ATTRIBUTE_IS_MANAGED:
            *(unsigned int *)d = a->kind == FC_MANAGED;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL:
            *(int *)d = known && a->ctx != NULL ? a->ctx->dev : 0;
            break;
        case CU_POINTER_ATTRIBUTE_CONTEXT:
            *(CUcontext *)d = known ? (CUcontext)a->ctx : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_DEVICE_POINTER:
            *(CUdeviceptr *)d = known ? ptr : 0;
            break;
        case CU_POINTER_ATTRIBUTE_HOST_POINTER:
            *(void **)d = known && !dev ? (void *)(uintptr_t)ptr : NULL;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_START_ADDR:
            *(CUdeviceptr *)d = known ? (CUdeviceptr)a->base : 0;
            break;
        case CU_POINTER_ATTRIBUTE_RANGE_SIZE:
            *(size_t *)d = known ? a->bytes : 0;
            break;
        case CU_POINTER_ATTRIBUTE_BUFFER_ID:
            *(unsigned long long *)d = known ? (unsigned long long)a->base : 0;
            break;
        default:
            r = CUDA_ERROR_INVALID_VALUE;
            break;
        }
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* ---- IPC ---- */

#define FC_IPC_MAGIC 0x46434950u /* "FCIP" */

/* What a CUipcMemHandle carries: enough for another process to find the
 * memfd in /proc/<pid>/fd and check it is still that allocation. */
struct fc_ipc {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    uint32_t pad;
    uint64_t id;
    uint64_t bytes, maplen;
};
_Static_assert(sizeof(struct fc_ipc) <= CU_IPC_HANDLE_SIZE, "fits a CUipcMemHandle");

FC_API CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    FC_CHECK(fc_enter_ctx(NULL));
    if (pHandle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult r = CUDA_SUCCESS;
    pthread_mutex_lock(&fc.lock);
    struct fc_alloc *a = fc_find((uintptr_t)dptr, 0, NULL);
    /* Only the base of an allocation made here, as the driver requires. */
    if (a == NULL || a->kind != FC_DEVICE || a->base != (uintptr_t)dptr) {
        r = CUDA_ERROR_INVALID_VALUE;
    } else {
        struct fc_ipc h = {.magic = FC_IPC_MAGIC, .pid = getpid(), .fd = a->fd, .id = a->id,
                           .bytes = a->bytes, .maplen = a->maplen};
        memset(pHandle, 0, sizeof *pHandle);
        memcpy(pHandle->reserved, &h, sizeof h);
    }
    pthread_mutex_unlock(&fc.lock);
    return r;
}

/* Opens the exporter's memfd and checks, by its name, that it is still the
 * allocation the handle was made for (the fd number may have been reused). */
static int fc_ipc_open_fd(const struct fc_ipc *h)
{
    char path[64], link[128], want[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return -1;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(path, link, sizeof link - 1);
    int len = snprintf(want, sizeof want, "/memfd:fakecuda:%" PRIu64, h->id);
    struct stat st;
    if (n < len || (link[n] = '\0', strncmp(link, want, (size_t)len) != 0) ||
        (link[len] != '\0' && link[len] != ' ') || fstat(fd, &st) != 0 ||
        (uint64_t)st.st_size < h->maplen) {
        close(fd);
        return -1;
    }
    return fd;
}

FC_API CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags)
{
    struct fc_ctx *c;
    FC_CHECK(fc_enter_ctx(&c));
    struct fc_ipc h;
    memcpy(&h, handle.reserved, sizeof h);
    if (pdptr == NULL || (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) != 0 ||
        h.magic != FC_IPC_MAGIC || h.maplen == 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (h.pid == getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* the driver refuses its own handles */
    pthread_mutex_lock(&fc.lock);
    for (struct fc_alloc *a = fc.allocs; a != NULL; a = a->next)
        if (a->kind == FC_IPC && a->pid == h.pid && a->id == h.id) {
            /* Opened already: the same address, one more reference. */
            a->refs++;
            *pdptr = (CUdeviceptr)a->base;
            pthread_mutex_unlock(&fc.lock);
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&fc.lock);
    int fd = fc_ipc_open_fd(&h);
    if (fd < 0)
        return CUDA_ERROR_INVALID_HANDLE; /* exporter gone, or the memory freed */
    struct fc_alloc *a = calloc(1, sizeof *a);
    if (a == NULL) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *a = (struct fc_alloc){.kind = FC_IPC, .bytes = h.bytes, .maplen = h.maplen, .fd = -1,
                           .id = h.id, .pid = h.pid, .refs = 1, .ctx = c};
    a->shadow = mmap(NULL, a->maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    void *dev = a->shadow == MAP_FAILED ? NULL : fc_reserve(a->maplen);
    if (dev == NULL) {
        if (a->shadow != MAP_FAILED)
            munmap(a->shadow, a->maplen);
        free(a);
        return CUDA_ERROR_MAP_FAILED;
    }
    a->base = (uintptr_t)dev;
    FC_LINK(allocs, a);
    *pdptr = (CUdeviceptr)a->base;
    return CUDA_SUCCESS;
}

FC_API CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    FC_CHECK(fc_enter_ctx(NULL));
    struct fc_alloc *a;
    if (!fc_unlink((uintptr_t)dptr, FC_IPC, &a))
        return CUDA_ERROR_INVALID_VALUE;
    if (a != NULL)
        fc_release(a);
    return CUDA_SUCCESS;
}

/* No dma-buf export without a GPU; present so the entry point resolves. */
FC_API CUresult cuMemGetHandleForAddressRange(void *handle, CUdeviceptr dptr, size_t size,
                                              CUmemRangeHandleType handleType,
                                              unsigned long long flags)
{
    FC_CHECK(fc_enter());
    return CUDA_ERROR_NOT_SUPPORTED;
}
