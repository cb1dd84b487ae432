/*
 * cudrv.c - finds the CUDA driver at run time.  Nothing here runs until a
 * call meets a stream or a device pointer, so a host-only program never
 * loads libcuda; a machine without one says so once, at INFO.
 */
#include "base/cudrv.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>

#define WEFT_CU_XSTR_(x) #x
#define WEFT_CU_XSTR(x) WEFT_CU_XSTR_(x)

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;
static struct weft_cu cu_table;
static const struct weft_cu *cu_ok;
static char cu_why[256];

static bool cu_load(void *h)
{
#define WEFT_CU_REQ(fn)                                                                     \
    if ((cu_table.fn = (__typeof__(&fn))dlsym(h, WEFT_CU_XSTR(fn))) == NULL) {             \
        snprintf(cu_why, sizeof cu_why, "the CUDA driver has no %s (too old?)",             \
                 WEFT_CU_XSTR(fn));                                                         \
        return false;                                                                       \
    }
#define WEFT_CU_OPT(fn) cu_table.fn = (__typeof__(&fn))dlsym(h, WEFT_CU_XSTR(fn));
    WEFT_CU_REQUIRED(WEFT_CU_REQ)
    WEFT_CU_OPTIONAL(WEFT_CU_OPT)
#undef WEFT_CU_REQ
#undef WEFT_CU_OPT
    return true;
}

static void cu_init_once(void)
{
    const char *path = weft_param_str("WEFT_CUDA_DRIVER");
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
        snprintf(cu_why, sizeof cu_why, "no CUDA driver (%s: %s)", path, dlerror());
        goto out;
    }
    /* The handle stays open for the life of the process: streams and
     * modules created through it may outlive any communicator. */
    if (!cu_load(h))
        goto out;
    CUresult r = cu_table.cuInit(0);
    if (r == CUDA_SUCCESS)
        r = cu_table.cuDeviceGetCount(&cu_table.ndev);
    if (r != CUDA_SUCCESS || cu_table.ndev <= 0) {
        const char *s = NULL;
        if (r != CUDA_SUCCESS)
            cu_table.cuGetErrorString(r, &s);
        snprintf(cu_why, sizeof cu_why, "no CUDA device (%s)", s ? s : "the driver lists none");
        goto out;
    }
    cu_table.cuDriverGetVersion(&cu_table.version);
    /* Stream memory operations on host memory: every device must have
     * them, or completions go through host functions (see src/cuda_stream.c). */
    cu_table.memops = cu_table.cuStreamWaitValue32 != NULL && cu_table.cuStreamWriteValue32 != NULL;
    for (int d = 0; d < cu_table.ndev && cu_table.memops; d++) {
        CUdevice dev;
        int mappable = 0;
        if (cu_table.cuDeviceGet(&dev, d) != CUDA_SUCCESS ||
            cu_table.cuDeviceGetAttribute(&mappable, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, dev) !=
                CUDA_SUCCESS)
            mappable = 0;
        cu_table.memops = mappable != 0;
    }
    cu_ok = &cu_table;
    WEFT_INFO(WEFT_SUB_INIT, "CUDA driver %d.%d from %s: %d device(s), stream memory operations %s",
              cu_table.version / 1000, cu_table.version % 1000 / 10, path, cu_table.ndev,
              cu_table.memops ? "yes" : "no (host functions instead)");
    return;
out:
    WEFT_INFO(WEFT_SUB_INIT, "%s: device buffers and streams are unavailable, host buffers work", cu_why);
}

const struct weft_cu *weft_cu_get(const char **why)
{
    pthread_once(&cu_once, cu_init_once);
    if (why != NULL)
        *why = cu_ok ? NULL : cu_why;
    return cu_ok;
}

weft_status_t weft_cu_error(struct weft_errsink *sink, CUresult r, const char *what)
{
    const char *name = NULL, *text = NULL;
    if (cu_ok != NULL) {
        cu_ok->cuGetErrorName(r, &name);
        cu_ok->cuGetErrorString(r, &text);
    }
    weft_status_t st = r == CUDA_ERROR_OUT_OF_MEMORY ? WEFT_ERR_NO_MEMORY
                     : r == CUDA_ERROR_INVALID_VALUE ? WEFT_ERR_INVALID_ARG
                                                     : WEFT_ERR_INTERNAL;
    return weft_error(sink, st, "%s: %s (%s)", what, name ? name : "CUDA error",
                      text ? text : "no description");
}

enum weft_mem_kind weft_cu_mem_kind(const void *p, int *dev, CUcontext *ctx)
{
    const struct weft_cu *cu = weft_cu_get(NULL);
    if (cu == NULL || p == NULL)
        return WEFT_MEM_HOST;
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                   CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT};
    unsigned int type = 0, managed = 0;
    int ordinal = -1;
    CUcontext c = NULL;
    void *data[] = {&type, &managed, &ordinal, &c};
    /* Unknown pointers (plain malloc) succeed with zeroed attributes. */
    if (cu->cuPointerGetAttributes(4, attrs, data, (CUdeviceptr)(uintptr_t)p) != CUDA_SUCCESS)
        return WEFT_MEM_HOST;
    if (dev != NULL)
        *dev = ordinal;
    if (ctx != NULL)
        *ctx = c;
    if (managed)
        return WEFT_MEM_MANAGED;
    return type == CU_MEMORYTYPE_DEVICE ? WEFT_MEM_DEVICE : WEFT_MEM_HOST;
}
