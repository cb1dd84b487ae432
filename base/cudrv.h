/*
 * cudrv.h - the CUDA driver, loaded at run time (dlopen of libcuda.so.1,
 * or WEFT_CUDA_DRIVER), so that the library loads and runs on machines
 * without a GPU or a driver.  Only built --with-cuda (it needs cuda.h for
 * the types); every caller goes through weft_cu_get().
 */
#ifndef WEFT_CUDRV_H
#define WEFT_CUDRV_H

#include <cuda.h>

#include "base/internal.h"

/* Driver entry points weft needs: a driver without one of them is not
 * used (reported at INFO, host buffers only).  The names are cuda.h's, so
 * versioned ones (cuMemAlloc -> cuMemAlloc_v2) resolve to the symbol that
 * header means. */
#define WEFT_CU_REQUIRED(X)                                                                 \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorString) X(cuGetErrorName)                   \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDeviceGetName)           \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent)             \
    X(cuCtxSetCurrent) X(cuCtxGetDevice) X(cuPointerGetAttributes) X(cuMemAlloc)           \
    X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemHostGetDevicePointer)            \
    X(cuMemGetAddressRange) X(cuMemcpyAsync) X(cuMemcpy2DAsync) X(cuMemcpyHtoD)             \
    X(cuMemcpyDtoH) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)             \
    X(cuStreamQuery) X(cuStreamWaitEvent) X(cuEventCreate) X(cuEventDestroy)                \
    X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuLaunchHostFunc)              \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel)          \
    X(cuIpcGetMemHandle) X(cuIpcOpenMemHandle) X(cuIpcCloseMemHandle)
/* Used when present: stream memory operations (the stream waits on a flag
 * in pinned host memory), dma-buf export for GPUDirect RDMA. */
#define WEFT_CU_OPTIONAL(X)                                                                 \
    X(cuStreamWaitValue32) X(cuStreamWriteValue32) X(cuMemGetHandleForAddressRange)

#define WEFT_CU_FIELD(fn) __typeof__(&fn) fn;
struct weft_cu {
    WEFT_CU_REQUIRED(WEFT_CU_FIELD)
    WEFT_CU_OPTIONAL(WEFT_CU_FIELD)
    int ndev;          /* devices cuInit found (> 0 whenever the table is returned) */
    int version;       /* cuDriverGetVersion */
    bool memops;       /* cuStreamWaitValue32 on host memory works on every device */
};
#undef WEFT_CU_FIELD

/* The driver, loaded and initialized once (any thread); NULL when there is
 * none, no device, or a required entry point is missing, with why set to a
 * sentence naming what is missing (also logged once at INFO). */
const struct weft_cu *weft_cu_get(const char **why) WEFT_HIDDEN;

/* Maps a CUresult to a status, recording "what: cuName (text)" in sink. */
weft_status_t weft_cu_error(struct weft_errsink *sink, CUresult r, const char *what) WEFT_HIDDEN;

/* Where a pointer lives, as the driver sees it (unknown pointers are host). */
enum weft_mem_kind { WEFT_MEM_HOST = 0, WEFT_MEM_DEVICE, WEFT_MEM_MANAGED };
/* Kind of p and, for device and managed memory, its device ordinal and
 * context; host when there is no driver. */
enum weft_mem_kind weft_cu_mem_kind(const void *p, int *dev, CUcontext *ctx) WEFT_HIDDEN;

#endif /* WEFT_CUDRV_H */
