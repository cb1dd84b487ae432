/*
 * gpu.c - the perf tools' device buffers and stream (-G 1), through the
 * driver table of base/cudrv.h, so the tools load and run on machines
 * without a GPU.  Without CUDA in the build, perf_gpu_open says so.
 */
#include "config.h"

#include "gpu.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CUDA

#include "base/cudrv.h"

/* Owned by the tool's perf_main; the context is the device's primary one,
 * retained here and released on close. */
struct perf_gpu {
    const struct weft_cu *cu;
    int rank;
    int dev;             /* ordinal: local rank % devices */
    CUdevice cudev;
    int ctx_retained;    /* cuDevicePrimaryCtxRetain succeeded */
    CUstream stream;     /* non-blocking, as nccl-tests' */
    CUdeviceptr buf[2];  /* send, recv: bytes each */
    size_t bytes;
    char name[96];
};

/* "cuMemAlloc: CUDA_ERROR_OUT_OF_MEMORY (out of memory)" into out. */
static void gpu_err_text(const struct weft_cu *cu, CUresult r, const char *what, char *out,
                         size_t len)
{
    const char *name = NULL, *text = NULL;
    if (cu->cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (cu->cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    snprintf(out, len, "%s: %s (%s)", what, name ? name : "unknown CUDA error",
             text ? text : "no description");
}

/* Reports a failed call of a tool that is running, with its rank. */
static weft_status_t gpu_fail(const perf_gpu_t *g, CUresult r, const char *what)
{
    char msg[256];
    gpu_err_text(g->cu, r, what, msg, sizeof(msg));
    fprintf(stderr, "# rank %d: device %d: %s\n", g->rank, g->dev, msg);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? WEFT_ERR_NO_MEMORY : WEFT_ERR_INTERNAL;
}

perf_gpu_t *perf_gpu_open(int rank, int local_rank, size_t bytes, char *why, size_t len)
{
    const char *cu_why = NULL;
    const struct weft_cu *cu = weft_cu_get(&cu_why);
    if (cu == NULL) {
        snprintf(why, len, "%s", cu_why ? cu_why : "the CUDA driver is unavailable");
        return NULL;
    }
    perf_gpu_t *g = calloc(1, sizeof(*g));
    if (g == NULL) {
        snprintf(why, len, "out of host memory");
        return NULL;
    }
    g->cu = cu;
    g->rank = rank;
    g->dev = (local_rank < 0 ? 0 : local_rank) % cu->ndev;
    g->bytes = bytes ? bytes : 1;
    char what[128];
    CUresult r;
    CUcontext ctx;
    snprintf(what, sizeof(what), "cuDeviceGet(%d)", g->dev);
    if ((r = cu->cuDeviceGet(&g->cudev, g->dev)) != CUDA_SUCCESS)
        goto fail;
    snprintf(what, sizeof(what), "cuDeviceGetName(device %d)", g->dev);
    if ((r = cu->cuDeviceGetName(g->name, (int)sizeof(g->name), g->cudev)) != CUDA_SUCCESS)
        goto fail;
    snprintf(what, sizeof(what), "cuDevicePrimaryCtxRetain(device %d)", g->dev);
    if ((r = cu->cuDevicePrimaryCtxRetain(&ctx, g->cudev)) != CUDA_SUCCESS)
        goto fail;
    g->ctx_retained = 1;
    snprintf(what, sizeof(what), "cuCtxSetCurrent(device %d)", g->dev);
    if ((r = cu->cuCtxSetCurrent(ctx)) != CUDA_SUCCESS)
        goto fail;
    snprintf(what, sizeof(what), "cuStreamCreate(device %d)", g->dev);
    if ((r = cu->cuStreamCreate(&g->stream, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS)
        goto fail;
    for (int i = 0; i < 2; i++) {
        snprintf(what, sizeof(what), "cuMemAlloc(%zu bytes, device %d)", g->bytes, g->dev);
        if ((r = cu->cuMemAlloc(&g->buf[i], g->bytes)) != CUDA_SUCCESS)
            goto fail;
    }
    return g;
fail:
    gpu_err_text(cu, r, what, why, len);
    perf_gpu_close(g); /* whatever a failure on the way out says adds nothing */
    return NULL;
}

weft_status_t perf_gpu_close(perf_gpu_t *g)
{
    if (g == NULL)
        return WEFT_OK;
    weft_status_t st = WEFT_OK;
    CUresult r;
    for (int i = 1; i >= 0; i--)
        if (g->buf[i] && (r = g->cu->cuMemFree(g->buf[i])) != CUDA_SUCCESS)
            st = gpu_fail(g, r, "cuMemFree");
    if (g->stream && (r = g->cu->cuStreamDestroy(g->stream)) != CUDA_SUCCESS)
        st = gpu_fail(g, r, "cuStreamDestroy");
    if (g->ctx_retained && (r = g->cu->cuDevicePrimaryCtxRelease(g->cudev)) != CUDA_SUCCESS)
        st = gpu_fail(g, r, "cuDevicePrimaryCtxRelease");
    free(g);
    return st;
}

void *perf_gpu_buf(const perf_gpu_t *g, int which)
{
    return (void *)(uintptr_t)g->buf[which];
}

weft_stream_t perf_gpu_stream(const perf_gpu_t *g)
{
    return (weft_stream_t)g->stream;
}

int perf_gpu_device(const perf_gpu_t *g)
{
    return g->dev;
}

const char *perf_gpu_name(const perf_gpu_t *g)
{
    return g->name;
}

int perf_gpu_driver_version(const perf_gpu_t *g)
{
    return g->cu->version;
}

weft_status_t perf_gpu_put(perf_gpu_t *g, void *dev, const void *host, size_t bytes)
{
    if (bytes == 0)
        return WEFT_OK;
    CUresult r = g->cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)dev, host, bytes);
    if (r != CUDA_SUCCESS)
        return gpu_fail(g, r, "cuMemcpyHtoD");
    /* From pageable memory the copy returns once the data is staged; the
     * DMA finishes on the legacy stream, which our non-blocking stream does
     * not wait for. */
    if ((r = g->cu->cuStreamSynchronize(NULL)) != CUDA_SUCCESS)
        return gpu_fail(g, r, "cuStreamSynchronize (after cuMemcpyHtoD)");
    return WEFT_OK;
}

weft_status_t perf_gpu_get(perf_gpu_t *g, void *host, const void *dev, size_t bytes)
{
    if (bytes == 0)
        return WEFT_OK;
    CUresult r = g->cu->cuMemcpyDtoH(host, (CUdeviceptr)(uintptr_t)dev, bytes);
    return r == CUDA_SUCCESS ? WEFT_OK : gpu_fail(g, r, "cuMemcpyDtoH");
}

weft_status_t perf_gpu_sync(perf_gpu_t *g)
{
    CUresult r = g->cu->cuStreamSynchronize(g->stream);
    return r == CUDA_SUCCESS ? WEFT_OK : gpu_fail(g, r, "cuStreamSynchronize");
}

#else /* !HAVE_CUDA */

/* Never made: open fails, so the other calls are never reached. */
struct perf_gpu {
    int unused;
};

perf_gpu_t *perf_gpu_open(int rank, int local_rank, size_t bytes, char *why, size_t len)
{
    (void)rank, (void)local_rank, (void)bytes;
    snprintf(why, len, "this build has no CUDA (configure found no cuda.h; see --with-cuda)");
    return NULL;
}

weft_status_t perf_gpu_close(perf_gpu_t *g)
{
    free(g);
    return WEFT_OK;
}

void *perf_gpu_buf(const perf_gpu_t *g, int which)
{
    (void)g, (void)which;
    return NULL;
}

weft_stream_t perf_gpu_stream(const perf_gpu_t *g)
{
    (void)g;
    return NULL;
}

int perf_gpu_device(const perf_gpu_t *g)
{
    (void)g;
    return -1;
}

const char *perf_gpu_name(const perf_gpu_t *g)
{
    (void)g;
    return "";
}

int perf_gpu_driver_version(const perf_gpu_t *g)
{
    (void)g;
    return 0;
}

weft_status_t perf_gpu_put(perf_gpu_t *g, void *dev, const void *host, size_t bytes)
{
    (void)g, (void)dev, (void)host, (void)bytes;
    return WEFT_ERR_UNSUPPORTED;
}

weft_status_t perf_gpu_get(perf_gpu_t *g, void *host, const void *dev, size_t bytes)
{
    (void)g, (void)host, (void)dev, (void)bytes;
    return WEFT_ERR_UNSUPPORTED;
}

weft_status_t perf_gpu_sync(perf_gpu_t *g)
{
    (void)g;
    return WEFT_ERR_UNSUPPORTED;
}

#endif /* HAVE_CUDA */
