/* test_fakecuda.c - the fake CUDA driver (tests/fakecuda) behaves as the
 * real one in the ways weft relies on: it is dlopened by path and every
 * entry point of base/cudrv.h's lists is resolved by cuda.h's name, as
 * weft does; then stream order, holds, events, stream memory operations,
 * host functions, copies, kernels, pointer attributes, contexts, IPC
 * between forked processes, and the device addresses the CPU cannot touch. */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "base/cudrv.h"
#include "tests/fakecuda/fakecuda.h"

#ifndef FAKECUDA_LIB
#error "FAKECUDA_LIB must name build/libweft-fakecuda.so"
#endif

#define XSTR_(x) #x
#define XSTR(x) XSTR_(x)

/* The driver table, resolved as base/cudrv.c resolves it, plus the fake's
 * test controls. */
#define FIELD(fn) __typeof__(&fn) fn;
static struct {
    WEFT_CU_REQUIRED(FIELD)
    WEFT_CU_OPTIONAL(FIELD)
    __typeof__(&cuMemAllocManaged) cuMemAllocManaged;
    __typeof__(&fakecuda_stream_hold) hold;
    __typeof__(&fakecuda_stream_release) release;
    __typeof__(&fakecuda_live_allocations) live;
    __typeof__(&fakecuda_shadow) shadow;
} cu;
#undef FIELD

static void *sym(void *h, const char *name)
{
    void *p = dlsym(h, name);
    cr_assert_not_null(p, "the fake has no %s", name);
    return p;
}

static void load(void)
{
    void *h = dlopen(FAKECUDA_LIB, RTLD_NOW | RTLD_LOCAL);
    cr_assert_not_null(h, "dlopen %s: %s", FAKECUDA_LIB, dlerror());
#define RESOLVE(fn) cu.fn = (__typeof__(&fn))sym(h, XSTR(fn));
    WEFT_CU_REQUIRED(RESOLVE)
    WEFT_CU_OPTIONAL(RESOLVE)
    RESOLVE(cuMemAllocManaged)
#undef RESOLVE
    cu.hold = (__typeof__(cu.hold))sym(h, "fakecuda_stream_hold");
    cu.release = (__typeof__(cu.release))sym(h, "fakecuda_stream_release");
    cu.live = (__typeof__(cu.live))sym(h, "fakecuda_live_allocations");
    cu.shadow = (__typeof__(cu.shadow))sym(h, "fakecuda_shadow");
}

/* cr_assert that a call succeeds, naming the error. */
#define CK(call)                                                                        \
    do {                                                                                \
        CUresult r_ = (call);                                                           \
        const char *n_ = NULL;                                                          \
        if (r_ != CUDA_SUCCESS)                                                         \
            cu.cuGetErrorName(r_, &n_);                                                 \
        cr_assert_eq(r_, CUDA_SUCCESS, "%s: %s", #call, n_ ? n_ : "?");                 \
    } while (0)
#define CK_EQ(call, want) cr_assert_eq((call), (want), "%s: %d, want %s", #call, (int)(call), #want)

/* In a forked child: no Criterion, exit 1 naming what failed. */
#define CHILD_CK(cond)                                                                  \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "child %d: %s:%d: %s failed\n", (int)getpid(), __FILE__,    \
                    __LINE__, #cond);                                                   \
            _exit(1);                                                                   \
        }                                                                               \
    } while (0)

static CUcontext ctx0;

/* Loads and initializes the driver; device 0's context current here. */
static void up(void)
{
    load();
    CK(cu.cuInit(0));
    CK(cu.cuDevicePrimaryCtxRetain(&ctx0, 0));
    CK(cu.cuCtxSetCurrent(ctx0));
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int wait_child(pid_t pid)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    return st;
}

TestSuite(fakecuda, .timeout = 60);

Test(fakecuda, init_devices_and_errors)
{
    load();
    int n = -1;
    CK_EQ(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CUdeviceptr d;
    CK_EQ(cu.cuMemAlloc(&d, 64), CUDA_ERROR_NOT_INITIALIZED);
    const char *s = NULL;
    CK(cu.cuGetErrorName(CUDA_ERROR_INVALID_VALUE, &s));
    cr_assert_str_eq(s, "CUDA_ERROR_INVALID_VALUE");
    CK(cu.cuGetErrorString(CUDA_ERROR_NOT_READY, &s));
    cr_assert_str_eq(s, "device not ready");
    CK_EQ(cu.cuGetErrorName((CUresult)123456, &s), CUDA_ERROR_INVALID_VALUE);
    cr_assert_null(s);
    CK_EQ(cu.cuInit(1), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuInit(0));
    CK(cu.cuInit(0));
    CK(cu.cuDeviceGetCount(&n));
    cr_assert_eq(n, 1);
    int v = 0;
    CK(cu.cuDriverGetVersion(&v));
    cr_assert_eq(v, 13000);
    CUdevice dev;
    CK(cu.cuDeviceGet(&dev, 0));
    CK_EQ(cu.cuDeviceGet(&dev, 1), CUDA_ERROR_INVALID_DEVICE);
    CK(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, dev));
    cr_assert_eq(v, 1);
    CK(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, dev));
    cr_assert_eq(v, 1);
    CK_EQ(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, dev), CUDA_ERROR_INVALID_VALUE);
    char name[64];
    CK(cu.cuDeviceGetName(name, sizeof name, dev));
    cr_assert(strlen(name) > 0);
    /* Optional entry points resolve; no dma-buf without a GPU. */
    int fd;
    CK_EQ(cu.cuMemGetHandleForAddressRange(&fd, 0, 4096, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0),
          CUDA_ERROR_NOT_SUPPORTED);
}

Test(fakecuda, no_device)
{
    setenv("FAKECUDA_DEVICES", "0", 1);
    load();
    CK_EQ(cu.cuInit(0), CUDA_ERROR_NO_DEVICE);
    int n;
    CK_EQ(cu.cuDeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
}

Test(fakecuda, several_devices)
{
    setenv("FAKECUDA_DEVICES", "3", 1);
    load();
    CK(cu.cuInit(0));
    int n;
    CK(cu.cuDeviceGetCount(&n));
    cr_assert_eq(n, 3);
    CUcontext c[3];
    for (int d = 0; d < 3; d++)
        CK(cu.cuDevicePrimaryCtxRetain(&c[d], d));
    CUcontext again;
    CK(cu.cuDevicePrimaryCtxRetain(&again, 2));
    cr_assert_eq(again, c[2], "one primary context per device");
    cr_assert_neq(c[0], c[1]);
    CK(cu.cuCtxSetCurrent(c[2]));
    CUdevice dev;
    CK(cu.cuCtxGetDevice(&dev));
    cr_assert_eq(dev, 2);
    CUdeviceptr p;
    CK(cu.cuMemAlloc(&p, 100));
    int ordinal = -1;
    CUcontext pc = NULL;
    CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT};
    void *data[] = {&ordinal, &pc};
    CK(cu.cuPointerGetAttributes(2, at, data, p));
    cr_assert_eq(ordinal, 2);
    cr_assert_eq(pc, c[2]);
    CK(cu.cuMemFree(p));
    /* A released primary context cannot be used. */
    CK(cu.cuDevicePrimaryCtxRelease(2));
    CK(cu.cuDevicePrimaryCtxRelease(2));
    CK_EQ(cu.cuMemAlloc(&p, 100), CUDA_ERROR_CONTEXT_IS_DESTROYED);
    CK_EQ(cu.cuDevicePrimaryCtxRelease(2), CUDA_ERROR_INVALID_CONTEXT);
}

Test(fakecuda, no_memops)
{
    setenv("FAKECUDA_NO_MEMOPS", "1", 1);
    up();
    int v = 1;
    CK(cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, 0));
    cr_assert_eq(v, 0);
    uint32_t *flag;
    CK(cu.cuMemHostAlloc((void **)&flag, 4096, 0));
    CUdeviceptr dflag;
    CK(cu.cuMemHostGetDevicePointer(&dflag, flag, 0));
    CK_EQ(cu.cuStreamWaitValue32(NULL, dflag, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_ERROR_NOT_SUPPORTED);
    CK_EQ(cu.cuStreamWriteValue32(NULL, dflag, 1, 0), CUDA_ERROR_NOT_SUPPORTED);
    CK(cu.cuMemFreeHost(flag));
}

static void *no_context_thread(void *arg)
{
    (void)arg;
    CUcontext c = (CUcontext)1;
    long bad = 0;
    CUdeviceptr d;
    CUstream s;
    CUevent e;
    char buf[8] = {0};
    bad += cu.cuCtxGetCurrent(&c) != CUDA_SUCCESS || c != NULL;
    bad += cu.cuMemAlloc(&d, 64) != CUDA_ERROR_INVALID_CONTEXT;
    bad += cu.cuStreamCreate(&s, 0) != CUDA_ERROR_INVALID_CONTEXT;
    bad += cu.cuEventCreate(&e, 0) != CUDA_ERROR_INVALID_CONTEXT;
    bad += cu.cuMemcpyAsync((CUdeviceptr)buf, (CUdeviceptr)(buf + 4), 4, NULL) != CUDA_ERROR_INVALID_CONTEXT;
    bad += cu.cuStreamSynchronize(NULL) != CUDA_ERROR_INVALID_CONTEXT;
    /* Pointer attributes need no context: any thread asks them. */
    unsigned type = 7;
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    void *data = &type;
    bad += cu.cuPointerGetAttributes(1, &at, &data, (CUdeviceptr)buf) != CUDA_SUCCESS || type != 0;
    return (void *)bad;
}

Test(fakecuda, context_required)
{
    load();
    CK(cu.cuInit(0));
    CUdeviceptr d;
    CK_EQ(cu.cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT);
    CUdevice dev;
    CK_EQ(cu.cuCtxGetDevice(&dev), CUDA_ERROR_INVALID_CONTEXT);
    CK(cu.cuDevicePrimaryCtxRetain(&ctx0, 0));
    CK_EQ(cu.cuCtxSetCurrent((CUcontext)&d), CUDA_ERROR_INVALID_CONTEXT);
    CK(cu.cuCtxSetCurrent(ctx0));
    CK(cu.cuMemAlloc(&d, 64));
    /* Current is per thread: a new thread has none. */
    pthread_t t;
    void *bad;
    pthread_create(&t, NULL, no_context_thread, NULL);
    pthread_join(t, &bad);
    cr_assert_eq((long)bad, 0, "%ld calls did not need a context", (long)bad);
    CK(cu.cuMemFree(d));
    CK(cu.cuCtxSetCurrent(NULL));
    CK_EQ(cu.cuMemAlloc(&d, 64), CUDA_ERROR_INVALID_CONTEXT);
}

Test(fakecuda, stream_runs_in_order)
{
    up();
    enum { N = 200, W = 64 };
    CUstream s;
    CK(cu.cuStreamCreate(&s, 0));
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, W * 4));
    static uint32_t src[N][W], dst[N][W];
    for (int i = 0; i < N; i++)
        for (int j = 0; j < W; j++)
            src[i][j] = (uint32_t)(i * 1000 + j);
    CK(cu.hold(s)); /* everything queues before anything runs */
    /* One device buffer reused: out of order, dst[i] would see another i. */
    for (int i = 0; i < N; i++) {
        CK(cu.cuMemcpyAsync(d, (CUdeviceptr)src[i], sizeof src[i], s));
        CK(cu.cuMemcpyAsync((CUdeviceptr)dst[i], d, sizeof dst[i], s));
    }
    CK(cu.release(s));
    CK(cu.cuStreamSynchronize(s));
    CK(cu.cuStreamQuery(s));
    cr_assert_eq(memcmp(src, dst, sizeof src), 0);
    CK(cu.cuStreamDestroy(s));
    CK_EQ(cu.cuStreamSynchronize(s), CUDA_ERROR_INVALID_HANDLE);
    CK(cu.cuMemFree(d));
    cr_assert_eq(cu.live(), 0);
}

Test(fakecuda, hold_and_release)
{
    up();
    CUstream s;
    CK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, 4096));
    static char a[4096], b[4096];
    memset(a, 0x5a, sizeof a);
    CK(cu.hold(s));
    CK(cu.hold(s));
    CK(cu.cuMemcpyAsync(d, (CUdeviceptr)a, sizeof a, s));
    CK(cu.cuMemcpyAsync((CUdeviceptr)b, d, sizeof b, s));
    CUevent e;
    CK(cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
    CK(cu.cuEventRecord(e, s));
    sleep_ms(50);
    CK_EQ(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
    CK_EQ(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    cr_assert_eq(b[0], 0, "a held stream ran a command");
    CK(cu.release(s));
    sleep_ms(50);
    CK_EQ(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY); /* held twice */
    CK(cu.release(s));
    CK_EQ(cu.release(s), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuEventSynchronize(e));
    CK(cu.cuEventQuery(e));
    cr_assert_eq(memcmp(a, b, sizeof a), 0);
    /* The legacy stream holds too. */
    CK(cu.hold(NULL));
    memset(b, 0, sizeof b);
    CK(cu.cuMemcpyAsync((CUdeviceptr)b, d, sizeof b, NULL));
    sleep_ms(20);
    CK_EQ(cu.cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_NOT_READY);
    CK(cu.release(CU_STREAM_PER_THREAD));
    CK(cu.cuStreamSynchronize(NULL));
    cr_assert_eq(b[100], 0x5a);
    CK(cu.cuEventDestroy(e));
    CK(cu.cuStreamDestroy(s));
    CK(cu.cuMemFree(d));
}

Test(fakecuda, events_order_streams)
{
    up();
    CUstream a, b;
    CK(cu.cuStreamCreate(&a, CU_STREAM_NON_BLOCKING));
    CK(cu.cuStreamCreate(&b, CU_STREAM_NON_BLOCKING));
    CUevent e, never;
    CK(cu.cuEventCreate(&e, 0));
    CK(cu.cuEventCreate(&never, 0));
    CK(cu.cuEventQuery(never)); /* never recorded: complete */
    CK(cu.cuEventSynchronize(never));
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, 1024));
    static char in[1024], out[1024];
    memset(in, 7, sizeof in);
    CK(cu.hold(a));
    CK(cu.cuMemcpyAsync(d, (CUdeviceptr)in, sizeof in, a));
    CK(cu.cuEventRecord(e, a));
    CK(cu.cuStreamWaitEvent(b, e, 0));
    CK(cu.cuStreamWaitEvent(b, never, 0));
    CK(cu.cuMemcpyAsync((CUdeviceptr)out, d, sizeof out, b));
    sleep_ms(50);
    CK_EQ(cu.cuStreamQuery(b), CUDA_ERROR_NOT_READY);
    cr_assert_eq(out[0], 0, "b ran before the event it waits for");
    CK(cu.release(a));
    CK(cu.cuStreamSynchronize(b));
    cr_assert_eq(memcmp(in, out, sizeof in), 0);
    CK(cu.cuEventQuery(e));
    /* Re-recording: the query follows the latest record. */
    CK(cu.hold(a));
    CK(cu.cuEventRecord(e, a));
    CK_EQ(cu.cuEventQuery(e), CUDA_ERROR_NOT_READY);
    CK(cu.release(a));
    CK(cu.cuEventSynchronize(e));
    CK_EQ(cu.cuStreamWaitEvent(b, e, 5), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuEventDestroy(e));
    CK_EQ(cu.cuEventQuery(e), CUDA_ERROR_INVALID_HANDLE);
    CK(cu.cuEventDestroy(never));
    CK(cu.cuStreamDestroy(a));
    CK(cu.cuStreamDestroy(b));
    CK(cu.cuMemFree(d));
}

/* The legacy stream waits for blocking streams and they for it; a
 * non-blocking stream orders with neither. */
Test(fakecuda, legacy_stream_orders_blocking_streams)
{
    up();
    CUstream blocking, nonblocking;
    CK(cu.cuStreamCreate(&blocking, 0));
    CK(cu.cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
    static char x[64], y[64];
    CK(cu.hold(blocking));
    CK(cu.cuMemcpyAsync((CUdeviceptr)x, (CUdeviceptr)y, sizeof x, blocking));
    CK(cu.cuMemcpyAsync((CUdeviceptr)y, (CUdeviceptr)x, sizeof x, NULL));
    CK(cu.cuMemcpyAsync((CUdeviceptr)y, (CUdeviceptr)x, sizeof x, nonblocking));
    CK(cu.cuStreamSynchronize(nonblocking));
    sleep_ms(30);
    CK_EQ(cu.cuStreamQuery(NULL), CUDA_ERROR_NOT_READY);
    CK(cu.release(blocking));
    CK(cu.cuStreamSynchronize(NULL));
    /* And the other way: a blocking stream waits for the legacy one. */
    CK(cu.hold(NULL));
    CK(cu.cuMemcpyAsync((CUdeviceptr)x, (CUdeviceptr)y, sizeof x, NULL));
    CK(cu.cuMemcpyAsync((CUdeviceptr)x, (CUdeviceptr)y, sizeof x, blocking));
    sleep_ms(30);
    CK_EQ(cu.cuStreamQuery(blocking), CUDA_ERROR_NOT_READY);
    CK(cu.release(NULL));
    CK(cu.cuStreamSynchronize(blocking));
    CK(cu.cuStreamDestroy(blocking));
    CK(cu.cuStreamDestroy(nonblocking));
}

struct hostlog {
    int n;
    int seen[16];
    CUresult inner;
};
static struct hostlog hlog;

static void host_fn(void *arg)
{
    hlog.seen[hlog.n++] = (int)(intptr_t)arg;
    CUdeviceptr d;
    hlog.inner = cu.cuMemAlloc(&d, 64); /* a host function may not call CUDA */
}

Test(fakecuda, host_functions_in_order)
{
    up();
    CUstream s;
    CK(cu.cuStreamCreate(&s, 0));
    static uint32_t word, copy;
    CK(cu.hold(s));
    for (int i = 0; i < 8; i++) {
        CK(cu.cuLaunchHostFunc(s, host_fn, (void *)(intptr_t)i));
        if (i == 3) {
            word = 77;
            CK(cu.cuMemcpyAsync((CUdeviceptr)&copy, (CUdeviceptr)&word, 4, s));
        }
    }
    cr_assert_eq(hlog.n, 0);
    CK(cu.release(s));
    CK(cu.cuStreamSynchronize(s));
    cr_assert_eq(hlog.n, 8);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(hlog.seen[i], i);
    cr_assert_eq(copy, 77);
    CK_EQ(hlog.inner, CUDA_ERROR_NOT_PERMITTED);
    CK_EQ(cu.cuLaunchHostFunc(s, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuStreamDestroy(s));
}

Test(fakecuda, wait_and_write_value)
{
    up();
    uint32_t *flags;
    CK(cu.cuMemHostAlloc((void **)&flags, 4096, CU_MEMHOSTALLOC_PORTABLE));
    CUdeviceptr dflags;
    CK(cu.cuMemHostGetDevicePointer(&dflags, flags, 0));
    cr_assert_eq((void *)(uintptr_t)dflags, flags, "unified addressing: the same address");
    CUstream s;
    CK(cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    struct { unsigned op; uint32_t start, want, fire; } cases[] = {
        {CU_STREAM_WAIT_VALUE_GEQ, 0, 5, 5},
        {CU_STREAM_WAIT_VALUE_GEQ, 0xfffffff0u, 3, 4}, /* wraps: 4 - 3 >= 0 */
        {CU_STREAM_WAIT_VALUE_EQ, 1, 9, 9},
        {CU_STREAM_WAIT_VALUE_AND, 0x0f, 0x30, 0x10},
        {CU_STREAM_WAIT_VALUE_NOR | CU_STREAM_WAIT_VALUE_FLUSH, 0xffffffffu, 0x0000ffffu, 0xfff0ffffu},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        __atomic_store_n(&flags[0], cases[i].start, __ATOMIC_RELEASE);
        flags[1] = 0;
        CK(cu.cuStreamWaitValue32(s, dflags, cases[i].want, cases[i].op));
        CK(cu.cuStreamWriteValue32(s, dflags + 4, (cuuint32_t)(100 + i), 0));
        sleep_ms(20);
        CK_EQ(cu.cuStreamQuery(s), CUDA_ERROR_NOT_READY);
        cr_assert_eq(__atomic_load_n(&flags[1], __ATOMIC_ACQUIRE), 0, "case %zu ran early", i);
        __atomic_store_n(&flags[0], cases[i].fire, __ATOMIC_RELEASE);
        CK(cu.cuStreamSynchronize(s));
        cr_assert_eq(flags[1], 100 + i);
    }
    /* Device memory works as a flag too; pageable memory does not. */
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, 64));
    CK(cu.cuStreamWriteValue32(s, d + 8, 42, CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
    CK(cu.cuStreamWaitValue32(s, d + 8, 42, CU_STREAM_WAIT_VALUE_EQ));
    uint32_t got[4];
    CK(cu.cuStreamSynchronize(s));
    CK(cu.cuMemcpyDtoH(got, d, sizeof got));
    cr_assert_eq(got[2], 42);
    static uint32_t pageable;
    CK_EQ(cu.cuStreamWaitValue32(s, (CUdeviceptr)&pageable, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuStreamWaitValue32(s, dflags + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuStreamWaitValue32(s, dflags, 1, 7), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuMemHostGetDevicePointer(&d, &pageable, 0), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuStreamDestroy(s));
    CK(cu.cuMemFree(d));
    CK(cu.cuMemFreeHost(flags));
    cr_assert_eq(cu.live(), 0);
}

Test(fakecuda, device_memory_faults_on_the_cpu)
{
    up();
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, 1000));
    uint8_t in[1000], out[1000];
    for (int i = 0; i < 1000; i++)
        in[i] = (uint8_t)(i * 7);
    CK(cu.cuMemcpyHtoD(d, in, sizeof in));
    /* The bytes are in the shadow, not at the device address. */
    uint8_t *sh = cu.shadow(d);
    cr_assert_not_null(sh);
    cr_assert_eq(memcmp(sh, in, sizeof in), 0);
    cr_assert_null(cu.shadow((CUdeviceptr)in));
    CK(cu.cuMemcpyDtoH(out, d + 0, sizeof out));
    cr_assert_eq(memcmp(in, out, sizeof in), 0);
    for (int write = 0; write < 2; write++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            signal(SIGSEGV, SIG_DFL);
            volatile uint8_t *p = (volatile uint8_t *)(uintptr_t)(d + 10);
            if (write)
                *p = 1;
            else
                (void)*p;
            _exit(0);
        }
        int st = wait_child(pid);
        cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV,
                  "a CPU %s of device memory did not fault (status %#x)", write ? "write" : "read", st);
    }
    /* Ranges: past the end, or a host pointer where a device one must be. */
    CK_EQ(cu.cuMemcpyHtoD(d + 1, in, sizeof in), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuMemcpyAsync(d + 999, (CUdeviceptr)in, 2, NULL), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuMemcpyHtoD((CUdeviceptr)out, in, 10), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuMemcpyDtoH(out, (CUdeviceptr)in, 10), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuMemcpyHtoD(d, (void *)(uintptr_t)d, 10), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuMemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuMemFree(d));
    CK_EQ(cu.cuMemFree(d), CUDA_ERROR_INVALID_VALUE);
}

Test(fakecuda, pointer_attributes)
{
    up();
    CUdeviceptr dev, managed;
    void *pinned;
    CK(cu.cuMemAlloc(&dev, 5000));
    CK(cu.cuMemHostAlloc(&pinned, 100, 0));
    CK(cu.cuMemAllocManaged(&managed, 300, CU_MEM_ATTACH_GLOBAL));
    static char plain[64];
    struct { CUdeviceptr p; unsigned type, managed; int ordinal; CUcontext ctx; size_t size; } want[] = {
        {dev + 17, CU_MEMORYTYPE_DEVICE, 0, 0, ctx0, 5000},
        {(CUdeviceptr)pinned, CU_MEMORYTYPE_HOST, 0, 0, ctx0, 100},
        {managed + 1, CU_MEMORYTYPE_DEVICE, 1, 0, ctx0, 300},
        {(CUdeviceptr)plain, 0, 0, 0, NULL, 0}, /* unknown: zeroed, and success */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        unsigned type = 99, is_managed = 99;
        int ordinal = 99;
        CUcontext c = (CUcontext)&type;
        size_t size = 99;
        CUpointer_attribute at[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                    CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_CONTEXT,
                                    CU_POINTER_ATTRIBUTE_RANGE_SIZE};
        void *data[] = {&type, &is_managed, &ordinal, &c, &size};
        CK(cu.cuPointerGetAttributes(5, at, data, want[i].p));
        cr_assert_eq(type, want[i].type, "case %zu", i);
        cr_assert_eq(is_managed, want[i].managed, "case %zu", i);
        cr_assert_eq(ordinal, want[i].ordinal, "case %zu", i);
        cr_assert_eq(c, want[i].ctx, "case %zu", i);
        cr_assert_eq(size, want[i].size, "case %zu", i);
    }
    /* Managed memory is the CPU's to touch. */
    memset((void *)(uintptr_t)managed, 3, 300);
    CUdeviceptr base;
    size_t size;
    CK(cu.cuMemGetAddressRange(&base, &size, dev + 4999));
    cr_assert_eq(base, dev);
    cr_assert_eq(size, 5000);
    CK_EQ(cu.cuMemGetAddressRange(&base, &size, dev + 5000), CUDA_ERROR_NOT_FOUND);
    CK_EQ(cu.cuMemGetAddressRange(&base, &size, (CUdeviceptr)plain), CUDA_ERROR_NOT_FOUND);
    CK(cu.cuMemGetAddressRange(&base, NULL, (CUdeviceptr)pinned + 50));
    cr_assert_eq(base, (CUdeviceptr)pinned);
    cr_assert_eq(cu.live(), 3);
    CK(cu.cuMemFree(dev));
    CK(cu.cuMemFree(managed));
    CK_EQ(cu.cuMemFreeHost(plain), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuMemFreeHost(pinned));
    cr_assert_eq(cu.live(), 0);
}

Test(fakecuda, memcpy_2d)
{
    up();
    enum { HP = 16, DP = 64, DH = 8, W = 10, H = 5 };
    static uint8_t host[12 * HP], back[DH * DP], ref[DH * DP];
    for (size_t i = 0; i < sizeof host; i++)
        host[i] = (uint8_t)(i + 1);
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, DH * DP));
    uint8_t zero[DH * DP] = {0};
    CK(cu.cuMemcpyHtoD(d, zero, sizeof zero));
    /* host (x 3, y 2) -> device (x 7, y 1), both by unified addressing */
    CUDA_MEMCPY2D m = {.srcXInBytes = 3, .srcY = 2, .srcMemoryType = CU_MEMORYTYPE_UNIFIED,
                       .srcDevice = (CUdeviceptr)host, .srcPitch = HP,
                       .dstXInBytes = 7, .dstY = 1, .dstMemoryType = CU_MEMORYTYPE_UNIFIED,
                       .dstDevice = d, .dstPitch = DP, .WidthInBytes = W, .Height = H};
    CK(cu.cuMemcpy2DAsync(&m, NULL));
    for (int y = 0; y < H; y++)
        memcpy(ref + (1 + y) * DP + 7, host + (2 + y) * HP + 3, W);
    /* the whole device buffer back, by explicit memory types */
    CUDA_MEMCPY2D b = {.srcMemoryType = CU_MEMORYTYPE_DEVICE, .srcDevice = d, .srcPitch = DP,
                       .dstMemoryType = CU_MEMORYTYPE_HOST, .dstHost = back, .dstPitch = DP,
                       .WidthInBytes = DP, .Height = DH};
    CK(cu.cuMemcpy2DAsync(&b, NULL));
    CK(cu.cuStreamSynchronize(NULL));
    cr_assert_eq(memcmp(back, ref, sizeof ref), 0);
    /* What the real driver refuses. */
    CUDA_MEMCPY2D bad = b;
    bad.dstHost = (void *)(uintptr_t)d; /* device memory as host memory */
    CK_EQ(cu.cuMemcpy2DAsync(&bad, NULL), CUDA_ERROR_INVALID_VALUE);
    bad = b;
    bad.srcDevice = (CUdeviceptr)host; /* pageable memory as device memory */
    CK_EQ(cu.cuMemcpy2DAsync(&bad, NULL), CUDA_ERROR_INVALID_VALUE);
    bad = b;
    bad.srcY = 1; /* rows past the end */
    CK_EQ(cu.cuMemcpy2DAsync(&bad, NULL), CUDA_ERROR_INVALID_VALUE);
    bad = b;
    bad.srcPitch = DP - 1; /* pitch under the width */
    CK_EQ(cu.cuMemcpy2DAsync(&bad, NULL), CUDA_ERROR_INVALID_VALUE);
    bad = b;
    bad.srcMemoryType = CU_MEMORYTYPE_ARRAY;
    CK_EQ(cu.cuMemcpy2DAsync(&bad, NULL), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuMemFree(d));
}

Test(fakecuda, kernel_launch)
{
    up();
    CUmodule mod;
    static const char image[] = "any image";
    CK_EQ(cu.cuModuleLoadData(&mod, NULL), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuModuleLoadData(&mod, image));
    CUfunction f;
    CK_EQ(cu.cuModuleGetFunction(&f, mod, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    CK(cu.cuModuleGetFunction(&f, mod, "fakecuda_test_fill"));
    enum { N = 1000 };
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, N * 4));
    CUstream s;
    CK(cu.cuStreamCreate(&s, 0));
    CK(cu.hold(s));
    uint32_t value = 500;
    size_t count = N;
    void *params[] = {&d, &value, &count};
    CK(cu.cuLaunchKernel(f, 3, 1, 1, 7, 1, 1, 0, s, params, NULL));
    /* Arguments are copied at launch: changing them now changes nothing. */
    value = 1;
    count = 1;
    static uint32_t out[N];
    CK(cu.cuMemcpyAsync((CUdeviceptr)out, d, sizeof out, s));
    CK(cu.release(s));
    CK(cu.cuStreamSynchronize(s));
    for (uint32_t i = 0; i < N; i++)
        cr_assert_eq(out[i], 500 + i, "out[%u] = %u", i, out[i]);
    CK_EQ(cu.cuLaunchKernel(f, 1, 2, 1, 1, 1, 1, 0, s, params, NULL), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 2, 0, s, params, NULL), CUDA_ERROR_INVALID_VALUE);
    CK_EQ(cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CK(cu.cuModuleUnload(mod));
    CK_EQ(cu.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, s, params, NULL), CUDA_ERROR_INVALID_HANDLE);
    CK(cu.cuStreamDestroy(s));
    CK(cu.cuMemFree(d));
}

/* cuMemFree waits for what the streams still have to do with memory. */
static atomic_int freed;
static CUdeviceptr to_free;

static void *free_thread(void *arg)
{
    (void)arg;
    cu.cuCtxSetCurrent(ctx0);
    CUresult r = cu.cuMemFree(to_free);
    atomic_store(&freed, r == CUDA_SUCCESS ? 1 : -1);
    return NULL;
}

Test(fakecuda, free_waits_for_streams_and_destroy_finishes_work)
{
    up();
    CUstream s;
    CK(cu.cuStreamCreate(&s, 0));
    CK(cu.cuMemAlloc(&to_free, 4096));
    static char in[4096], out[4096];
    memset(in, 9, sizeof in);
    CK(cu.hold(s));
    CK(cu.cuMemcpyAsync(to_free, (CUdeviceptr)in, sizeof in, s));
    CK(cu.cuMemcpyAsync((CUdeviceptr)out, to_free, sizeof out, s));
    pthread_t t;
    pthread_create(&t, NULL, free_thread, NULL);
    sleep_ms(50);
    cr_assert_eq(atomic_load(&freed), 0, "cuMemFree returned with work pending");
    CK(cu.release(s));
    pthread_join(t, NULL);
    cr_assert_eq(atomic_load(&freed), 1);
    cr_assert_eq(out[4095], 9);
    /* Destroy returns at once; the queued work still runs (and a hold
     * goes with the stream). */
    CUevent e;
    CK(cu.cuEventCreate(&e, 0));
    memset(out, 0, sizeof out);
    CK(cu.hold(s));
    CK(cu.cuMemcpyAsync((CUdeviceptr)out, (CUdeviceptr)in, sizeof out, s));
    CK(cu.cuEventRecord(e, s));
    CK(cu.cuStreamDestroy(s));
    CK_EQ(cu.cuStreamDestroy(s), CUDA_ERROR_INVALID_HANDLE);
    CK(cu.cuEventSynchronize(e));
    cr_assert_eq(out[0], 9);
    CK(cu.cuEventDestroy(e));
    cr_assert_eq(cu.live(), 0);
}

/* Rank threads: each its own stream, all at once. */
static void *rank_thread(void *arg)
{
    intptr_t rank = (intptr_t)arg;
    long bad = 0;
    bad += cu.cuCtxSetCurrent(ctx0) != CUDA_SUCCESS;
    CUstream s;
    CUdeviceptr d;
    bad += cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS;
    bad += cu.cuMemAlloc(&d, 256 * 4) != CUDA_SUCCESS;
    uint32_t in[256], out[256];
    for (int it = 0; it < 200 && bad == 0; it++) {
        for (int i = 0; i < 256; i++)
            in[i] = (uint32_t)(rank << 24 | it << 8 | i);
        bad += cu.cuMemcpyAsync(d, (CUdeviceptr)in, sizeof in, s) != CUDA_SUCCESS;
        bad += cu.cuMemcpyAsync((CUdeviceptr)out, d, sizeof out, s) != CUDA_SUCCESS;
        bad += cu.cuStreamSynchronize(s) != CUDA_SUCCESS;
        bad += memcmp(in, out, sizeof in) != 0;
    }
    bad += cu.cuMemFree(d) != CUDA_SUCCESS;
    bad += cu.cuStreamDestroy(s) != CUDA_SUCCESS;
    return (void *)bad;
}

Test(fakecuda, threads_at_once)
{
    up();
    pthread_t t[6];
    for (intptr_t i = 0; i < 6; i++)
        pthread_create(&t[i], NULL, rank_thread, (void *)i);
    for (int i = 0; i < 6; i++) {
        void *bad;
        pthread_join(t[i], &bad);
        cr_assert_eq((long)bad, 0, "rank %d: %ld failures", i, (long)bad);
    }
    cr_assert_eq(cu.live(), 0);
}

/* A fork child starts un-initialized and empty; it may init again. */
Test(fakecuda, fork_child_starts_over)
{
    up();
    CUdeviceptr d;
    CK(cu.cuMemAlloc(&d, 64));
    CUstream s;
    CK(cu.cuStreamCreate(&s, 0));
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        CUdeviceptr e;
        CHILD_CK(cu.cuMemAlloc(&e, 64) == CUDA_ERROR_NOT_INITIALIZED);
        CHILD_CK(cu.cuInit(0) == CUDA_SUCCESS);
        CUcontext c = (CUcontext)&e;
        CHILD_CK(cu.cuCtxGetCurrent(&c) == CUDA_SUCCESS && c == NULL);
        CHILD_CK(cu.live() == 0);
        CHILD_CK(cu.cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
        CHILD_CK(cu.cuCtxSetCurrent(c) == CUDA_SUCCESS);
        CHILD_CK(cu.cuStreamSynchronize(s) == CUDA_ERROR_INVALID_HANDLE);
        CHILD_CK(cu.cuMemFree(d) == CUDA_ERROR_INVALID_VALUE);
        char in[64] = "child", out[64] = {0};
        CHILD_CK(cu.cuMemAlloc(&e, 64) == CUDA_SUCCESS);
        CHILD_CK(cu.cuMemcpyAsync(e, (CUdeviceptr)in, 64, NULL) == CUDA_SUCCESS);
        CHILD_CK(cu.cuMemcpyAsync((CUdeviceptr)out, e, 64, NULL) == CUDA_SUCCESS);
        CHILD_CK(cu.cuStreamSynchronize(NULL) == CUDA_SUCCESS);
        CHILD_CK(strcmp(out, "child") == 0);
        _exit(0);
    }
    int st = wait_child(pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child status %#x", st);
    /* The parent's objects are untouched. */
    static char in[64] = "parent", out[64];
    CK(cu.cuMemcpyHtoD(d, in, 64));
    CK(cu.cuMemcpyAsync((CUdeviceptr)out, d, 64, s));
    CK(cu.cuStreamSynchronize(s));
    cr_assert_str_eq(out, "parent");
    CK(cu.cuStreamDestroy(s));
    CK(cu.cuMemFree(d));
}

/* ---- IPC: the test forks before any CUDA call, then each side inits ---- */

enum { IPC_BYTES = 3 * 4096 + 100 };

struct ipc_msg {
    CUipcMemHandle live, freed;
};

static void put(int fd, const void *p, size_t n) { CHILD_CK(write(fd, p, n) == (ssize_t)n); }
static void get(int fd, void *p, size_t n) { CHILD_CK(read(fd, p, n) == (ssize_t)n); }

/* The exporter: fills a buffer, sends its handle and one of a buffer it
 * frees, waits for the importer to write, checks what it wrote. */
static void ipc_exporter(int tx, int rx)
{
    CUcontext c;
    CHILD_CK(cu.cuInit(0) == CUDA_SUCCESS);
    CHILD_CK(cu.cuDevicePrimaryCtxRetain(&c, 0) == CUDA_SUCCESS);
    CHILD_CK(cu.cuCtxSetCurrent(c) == CUDA_SUCCESS);
    CUdeviceptr d, gone;
    CHILD_CK(cu.cuMemAlloc(&d, IPC_BYTES) == CUDA_SUCCESS);
    CHILD_CK(cu.cuMemAlloc(&gone, 4096) == CUDA_SUCCESS);
    static uint8_t buf[IPC_BYTES];
    for (int i = 0; i < IPC_BYTES; i++)
        buf[i] = (uint8_t)(i * 3 + 1);
    CHILD_CK(cu.cuMemcpyHtoD(d, buf, IPC_BYTES) == CUDA_SUCCESS);
    struct ipc_msg m;
    CHILD_CK(cu.cuIpcGetMemHandle(&m.live, d + 64) == CUDA_ERROR_INVALID_VALUE);
    CHILD_CK(cu.cuIpcGetMemHandle(&m.live, d) == CUDA_SUCCESS);
    CHILD_CK(cu.cuIpcGetMemHandle(&m.freed, gone) == CUDA_SUCCESS);
    CHILD_CK(cu.cuMemFree(gone) == CUDA_SUCCESS);
    /* Most likely under gone's memfd number: the handle must not open it. */
    CUdeviceptr reuse;
    CHILD_CK(cu.cuMemAlloc(&reuse, 4096) == CUDA_SUCCESS);
    CUdeviceptr own;
    CHILD_CK(cu.cuIpcOpenMemHandle(&own, m.live, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) ==
             CUDA_ERROR_INVALID_CONTEXT);
    put(tx, &m, sizeof m);
    char go;
    get(rx, &go, 1);
    CHILD_CK(cu.cuMemcpyDtoH(buf, d, IPC_BYTES) == CUDA_SUCCESS);
    for (int i = 0; i < IPC_BYTES; i++)
        CHILD_CK(buf[i] == (uint8_t)(i < 4096 ? 0xee : i * 3 + 1));
    CHILD_CK(cu.cuMemFree(d) == CUDA_SUCCESS);
    CHILD_CK(cu.cuMemFree(reuse) == CUDA_SUCCESS);
    CHILD_CK(cu.live() == 0);
    put(tx, "k", 1);
    get(rx, &go, 1); /* stay alive until the importer is done */
    _exit(0);
}

Test(fakecuda, ipc_between_processes)
{
    load();
    int to_parent[2], to_child[2];
    cr_assert_eq(pipe(to_parent), 0);
    cr_assert_eq(pipe(to_child), 0);
    pid_t pid = fork(); /* before any CUDA call: both sides init their own */
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* Dies with the parent, and sees EOF if the parent fails. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        close(to_parent[0]);
        close(to_child[1]);
        ipc_exporter(to_parent[1], to_child[0]);
    }
    close(to_parent[1]);
    close(to_child[0]);
    CK(cu.cuInit(0));
    CK(cu.cuDevicePrimaryCtxRetain(&ctx0, 0));
    CK(cu.cuCtxSetCurrent(ctx0));
    struct ipc_msg m;
    cr_assert_eq(read(to_parent[0], &m, sizeof m), (ssize_t)sizeof m);
    CUdeviceptr p, again;
    CK(cu.cuIpcOpenMemHandle(&p, m.live, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    CK(cu.cuIpcOpenMemHandle(&again, m.live, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    cr_assert_eq(again, p, "a second open is the same mapping");
    CK_EQ(cu.cuIpcOpenMemHandle(&again, m.freed, 0), CUDA_ERROR_INVALID_HANDLE);
    CUipcMemHandle junk = {{0}};
    CK_EQ(cu.cuIpcOpenMemHandle(&again, junk, 0), CUDA_ERROR_INVALID_VALUE);
    /* An imported address is device memory here too. */
    unsigned type = 0;
    CUpointer_attribute at = CU_POINTER_ATTRIBUTE_MEMORY_TYPE;
    void *data = &type;
    CK(cu.cuPointerGetAttributes(1, &at, &data, p + 5));
    cr_assert_eq(type, CU_MEMORYTYPE_DEVICE);
    cr_assert_not_null(cu.shadow(p));
    static uint8_t buf[IPC_BYTES];
    CK(cu.cuMemcpyDtoH(buf, p, IPC_BYTES));
    for (int i = 0; i < IPC_BYTES; i++)
        cr_assert_eq(buf[i], (uint8_t)(i * 3 + 1), "byte %d", i);
    memset(buf, 0xee, 4096);
    CUstream s;
    CK(cu.cuStreamCreate(&s, 0));
    CK(cu.cuMemcpyAsync(p, (CUdeviceptr)buf, 4096, s));
    CK(cu.cuStreamSynchronize(s));
    cr_assert_eq(write(to_child[1], "g", 1), 1);
    char ok;
    cr_assert_eq(read(to_parent[0], &ok, 1), 1, "the exporter failed");
    /* The exporter freed it: the mapping here stays valid until closed. */
    CK(cu.cuMemcpyDtoH(buf, p + 4096, 16));
    cr_assert_eq(buf[0], (uint8_t)(4096 * 3 + 1));
    CK(cu.cuIpcCloseMemHandle(p));
    cr_assert_not_null(cu.shadow(p), "closed with one open left");
    CK(cu.cuIpcCloseMemHandle(p));
    cr_assert_null(cu.shadow(p));
    CK_EQ(cu.cuIpcCloseMemHandle(p), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(write(to_child[1], "x", 1), 1);
    int st = wait_child(pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exporter status %#x", st);
    /* Its process gone, its handles open nothing. */
    CK_EQ(cu.cuIpcOpenMemHandle(&again, m.live, 0), CUDA_ERROR_INVALID_HANDLE);
    CK(cu.cuStreamDestroy(s));
    cr_assert_eq(cu.live(), 0);
}
