/*
 * fc_ops.c - the fake CUDA driver's stream commands as the API queues
 * them: copies (1D and 2D, unified addressing), stream memory operations,
 * host functions, and modules whose kernels are host functions from a
 * table.  fc_stream.c runs them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fc_internal.h"

struct fc_func {
    struct fc_func *next;
    const struct fakecuda_kernel *k;
};

struct fc_module {
    struct fc_module *next;
    struct fc_ctx *ctx;
    struct fc_func *funcs;
};

/* The kernel of a function handle; caller holds fc.lock. */
static const struct fakecuda_kernel *fc_func_of(CUfunction h)
{
    for (struct fc_module *m = fc.modules; m != NULL; m = m->next)
        for (struct fc_func *f = m->funcs; f != NULL; f = f->next)
            if ((CUfunction)f == h)
                return f->k;
    return NULL;
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
    return fc_cmd_new(OP_COPY, (union fc_args){.copy = {.dst = dst, .src = src, .n = n}}, 0);
}

/* Unified addressing: either side may be device or host memory. */
FC_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount, CUstream hStream)
{
    struct fc_ctx *ctx;
    FC_CHECK(fc_enter_ctx(&ctx));
    if (!fc_range_ok(dst, ByteCount) || !fc_range_ok(src, ByteCount))
        return CUDA_ERROR_INVALID_VALUE;
    if (ByteCount == 0)
        return CUDA_SUCCESS;
    return fc_submit(ctx, hStream, fc_copy_cmd(dst, src, ByteCount));
}

/* The synchronous copies, host to device (htod) or back: the device side
 * must be memory the driver knows (pageable host memory is no device
 * address) and the host side no device memory. */
static CUresult fc_memcpy_sync(CUdeviceptr dst, CUdeviceptr src, size_t n, bool htod)
{
    struct fc_ctx *ctx;
    FC_CHECK(fc_enter_ctx(&ctx));
    CUdeviceptr dev = htod ? dst : src, host = htod ? src : dst;
    if (fc_kind_of(dev) == 0 || fc_is_device(host) || !fc_range_ok(dev, n))
        return CUDA_ERROR_INVALID_VALUE;
    return n == 0 ? CUDA_SUCCESS : fc_submit_wait(ctx, fc_copy_cmd(dst, src, n));
}

FC_API CUresult cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return fc_memcpy_sync(dstDevice, (CUdeviceptr)(uintptr_t)srcHost, ByteCount, true);
}

FC_API CUresult cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return fc_memcpy_sync((CUdeviceptr)(uintptr_t)dstHost, srcDevice, ByteCount, false);
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
    FC_CHECK(fc_enter_ctx(&ctx));
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
    union fc_args u = {.copy = {.dst = dst, .src = src, .n = m->WidthInBytes, .dpitch = m->dstPitch,
                                .spitch = m->srcPitch, .height = m->Height}};
    return fc_submit(ctx, hStream, fc_cmd_new(OP_COPY2D, u, 0));
}

/* ---- stream memory operations, host functions ---- */

static CUresult fc_memop(CUstream stream, enum fc_op op, CUdeviceptr addr, cuuint32_t value,
                         unsigned flags, bool flags_ok)
{
    struct fc_ctx *ctx;
    FC_CHECK(fc_enter_ctx(&ctx));
    if (!fc.memops)
        return CUDA_ERROR_NOT_SUPPORTED;
    /* The GPU reaches only memory the driver knows: pinned host memory
     * (its device pointer is its address), device or managed memory. */
    if (!flags_ok || addr % 4 != 0 || fc_kind_of(addr) == 0 || !fc_range_ok(addr, 4))
        return CUDA_ERROR_INVALID_VALUE;
    union fc_args u = {.val = {.addr = addr, .value = value, .flags = flags}};
    return fc_submit(ctx, stream, fc_cmd_new(op, u, 0));
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
    FC_CHECK(fc_enter_ctx(&ctx));
    if (fn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    union fc_args u = {.host = {.fn = fn, .data = userData}};
    return fc_submit(ctx, hStream, fc_cmd_new(OP_HOST_FN, u, 0));
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
    FC_CHECK(fc_enter_ctx(&ctx));
    if (module == NULL || image == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    struct fc_module *m = calloc(1, sizeof *m);
    if (m == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    m->ctx = ctx;
    FC_LINK(modules, m);
    *module = (CUmodule)m;
    return CUDA_SUCCESS;
}

/* Launches already queued keep their kernel (the tables are static). */
FC_API CUresult cuModuleUnload(CUmodule hmod)
{
    FC_CHECK(fc_enter_ctx(NULL));
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
    FC_CHECK(fc_enter_ctx(NULL));
    if (hfunc == NULL || name == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    const struct fakecuda_kernel *k = fc_kernel_named(name);
    CUresult r;
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
    FC_CHECK(fc_enter_ctx(&ctx));
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
    union fc_args u = {.kern = {.k = k, .gx = gridDimX, .bx = blockDimX}};
    struct fc_cmd *c = fc_cmd_new(OP_KERNEL, u, blob);
    if (c == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned char *at = c->blob;
    for (size_t i = 0; i < n; i++) {
        memcpy(at, kernelParams[i], k->param_bytes[i]);
        c->u.kern.args[i] = at;
        at += (k->param_bytes[i] + 15) / 16 * 16;
    }
    return fc_submit(ctx, hStream, c);
}
