/*
 * test_cuda_nccl.c - the NCCL API with device buffers and streams, on the
 * fake CUDA driver: what a program written for NCCL does (enqueue on a
 * stream, consume on the stream, synchronise once), groups of sends and
 * receives, the legacy NULL stream, and an abort that frees a stream.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/cudrv.h"
#include "harness.h"
#include "nccl.h"
#include "testcommon.h"

struct gpu {
    const struct weft_cu *cu;
    CUstream s;
};

static int gpu_open(int rank, struct gpu *g)
{
    const char *why = NULL;
    CUdevice dev;
    CUcontext ctx;
    g->cu = weft_cu_get(&why);
    if (g->cu == NULL || g->cu->cuDeviceGet(&dev, 0) || g->cu->cuDevicePrimaryCtxRetain(&ctx, dev) ||
        g->cu->cuCtxSetCurrent(ctx) || g->cu->cuStreamCreate(&g->s, CU_STREAM_NON_BLOCKING))
        return weft_test_fail(rank, "fake driver setup failed (%s)", why ? why : "a call failed");
    return 0;
}

static void *dalloc(struct gpu *g, size_t bytes)
{
    CUdeviceptr p = 0;
    g->cu->cuMemAlloc(&p, bytes);
    return (void *)(uintptr_t)p;
}

static int init(int rank, int n, const weft_unique_id_t *id, ncclComm_t *comm)
{
    ncclUniqueId nid;
    memcpy(&nid, id, sizeof nid);
    ncclResult_t r = ncclCommInitRank(comm, n, nid, rank);
    return r == ncclSuccess ? 0 : weft_test_fail(rank, "ncclCommInitRank: %s", ncclGetErrorString(r));
}

#define NCHECK(rank, call)                                                                    \
    do {                                                                                      \
        ncclResult_t r_ = (call);                                                             \
        if (r_ != ncclSuccess)                                                                \
            return weft_test_fail(rank, "%s: %s (%s)", #call, ncclGetErrorString(r_),         \
                                  ncclGetLastError(NULL));                                    \
    } while (0)

static int proc_ops(int rank, int n, const weft_unique_id_t *id, void *arg)
{
    struct gpu g;
    ncclComm_t comm;
    if (gpu_open(rank, &g) || init(rank, n, id, &comm))
        return 1;
    cudaStream_t s = (cudaStream_t)g.s;
    size_t cnt = 6007;
    float *h = malloc(cnt * n * sizeof(float)), *o = malloc(cnt * n * sizeof(float));
    float *a = dalloc(&g, cnt * n * sizeof(float)), *b = dalloc(&g, cnt * n * sizeof(float));
    for (size_t i = 0; i < cnt * n; i++)
        h[i] = (float)(rank + 1) * (float)(i % 11);
    /* AllReduce in place, enqueued between a copy in and a copy out. */
    g.cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)a, (CUdeviceptr)(uintptr_t)h, cnt * 4, g.s);
    NCHECK(rank, ncclAllReduce(a, a, cnt, ncclFloat, ncclSum, comm, s));
    g.cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)o, (CUdeviceptr)(uintptr_t)a, cnt * 4, g.s);
    g.cu->cuStreamSynchronize(g.s);
    for (size_t i = 0; i < cnt; i++)
        if (o[i] != (float)(n * (n + 1) / 2) * (float)(i % 11))
            return weft_test_fail(rank, "ncclAllReduce [%zu] = %g", i, o[i]);
    /* AllGather, then a ring of Send/Recv in a group, both on the stream. */
    g.cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)a, h, cnt * 4);
    NCHECK(rank, ncclAllGather(a, b, cnt, ncclFloat, comm, s));
    g.cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)o, (CUdeviceptr)(uintptr_t)b, cnt * n * 4, g.s);
    g.cu->cuStreamSynchronize(g.s);
    for (int q = 0; q < n; q++)
        for (size_t i = 0; i < cnt; i++)
            if (o[q * cnt + i] != (float)(q + 1) * (float)(i % 11))
                return weft_test_fail(rank, "ncclAllGather block %d [%zu] = %g", q, i, o[q * cnt + i]);
    NCHECK(rank, ncclGroupStart());
    NCHECK(rank, ncclSend(a, cnt, ncclFloat, (rank + 1) % n, comm, s));
    NCHECK(rank, ncclRecv(b, cnt, ncclFloat, (rank + n - 1) % n, comm, s));
    NCHECK(rank, ncclGroupEnd());
    g.cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)o, (CUdeviceptr)(uintptr_t)b, cnt * 4, g.s);
    g.cu->cuStreamSynchronize(g.s);
    int prev = (rank + n - 1) % n;
    for (size_t i = 0; i < cnt; i++)
        if (o[i] != (float)(prev + 1) * (float)(i % 11))
            return weft_test_fail(rank, "ring Send/Recv [%zu] = %g", i, o[i]);
    /* The NULL stream with device buffers: the legacy default stream. */
    NCHECK(rank, ncclBroadcast(a, b, cnt, ncclFloat, 0, comm, NULL));
    g.cu->cuStreamSynchronize(NULL);
    g.cu->cuMemcpyDtoH(o, (CUdeviceptr)(uintptr_t)b, cnt * 4);
    for (size_t i = 0; i < cnt; i++)
        if (o[i] != (float)(i % 11))
            return weft_test_fail(rank, "ncclBroadcast on the NULL stream [%zu] = %g", i, o[i]);
    /* PreMulSum cannot read device memory on the host: a clear refusal. */
    ncclRedOp_t pm;
    float scale = 2;
    NCHECK(rank, ncclRedOpCreatePreMulSum(&pm, &scale, ncclFloat, ncclScalarHostImmediate, comm));
    ncclResult_t r = ncclAllReduce(a, b, cnt, ncclFloat, pm, comm, s);
    if (r != ncclInvalidUsage || strstr(ncclGetLastError(comm), "PreMulSum") == NULL)
        return weft_test_fail(rank, "PreMulSum on a stream: %s (%s)", ncclGetErrorString(r),
                              ncclGetLastError(comm));
    ncclRedOpDestroy(pm, comm);
    ncclResult_t async = ncclInternalError;
    NCHECK(rank, ncclCommGetAsyncError(comm, &async));
    if (async != ncclSuccess)
        return weft_test_fail(rank, "async error %s after good calls", ncclGetErrorString(async));
    NCHECK(rank, ncclCommDestroy(comm));
    free(h);
    free(o);
    return 0;
}

/* n ranks on the fake driver, each running proc. */
static void run_on_fake(int n, weft_test_proc_t proc)
{
    setenv("WEFT_CUDA_DRIVER", FAKECUDA_LIB, 1);
    weft_param_reload();
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, n, proc, NULL), 0);
    cr_assert_eq(weft_test_job_wait(&job, 50), 0);
}

Test(cuda_nccl, device_buffers_on_streams, .timeout = 60)
{
    run_on_fake(3, proc_ops);
}

/* A peer that never joins: ncclCommAbort frees the stream waiting on it. */
static int proc_abort(int rank, int n, const weft_unique_id_t *id, void *arg)
{
    struct gpu g;
    ncclComm_t comm;
    if (gpu_open(rank, &g) || init(rank, n, id, &comm))
        return 1;
    float *a = dalloc(&g, 4096 * 4);
    if (rank == 1) {
        sleep(3);
        ncclCommAbort(comm);
        return 0;
    }
    NCHECK(rank, ncclAllReduce(a, a, 4096, ncclFloat, ncclSum, comm, (cudaStream_t)g.s));
    struct timespec ts = {0, 300 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (g.cu->cuStreamQuery(g.s) != CUDA_ERROR_NOT_READY)
        return weft_test_fail(rank, "the stream did not wait for the collective");
    uint64_t t0 = weft_now_ns();
    NCHECK(rank, ncclCommAbort(comm));
    g.cu->cuStreamSynchronize(g.s);
    double sec = (weft_now_ns() - t0) / 1e9;
    return sec < 5 ? 0 : weft_test_fail(rank, "abort released the stream after %.1f s", sec);
}

Test(cuda_nccl, abort_frees_the_stream, .timeout = 60)
{
    run_on_fake(2, proc_abort);
}

/* The six perf tools with -G 1 (buffers in GPU memory, issued on a
 * stream) and -c 1: every result checked, none wrong. */
Test(cuda_nccl, perf_tools_with_device_buffers, .timeout = 240)
{
    static const char *const tools[] = {"all_reduce_perf", "reduce_scatter_perf", "all_gather_perf",
                                        "broadcast_perf", "reduce_perf", "sendrecv_perf"};
    for (size_t t = 0; t < sizeof tools / sizeof *tools; t++) {
        char cmd[1024], out[16384];
        snprintf(cmd, sizeof cmd,
                 "cd %s && WEFT_CUDA_DRIVER=%s WEFT_CUDA_STAGE_BYTES=16384 timeout 120 ./weftrun -n 3 "
                 "./%s -G 1 -c 1 -b 8 -e 256K -f 8 -n 2 -w 1 2>&1",
                 WEFT_BUILDDIR, FAKECUDA_LIB, tools[t]);
        int rc = weft_test_shell(cmd, out, sizeof out);
        cr_expect_eq(rc, 0, "%s -G 1 exited %d:\n%s", tools[t], rc, out);
        cr_expect_not_null(strstr(out, "Out of bounds values : 0 OK"), "%s -G 1:\n%s", tools[t], out);
    }
}

/* Without a driver, -G 1 says why in one line and fails; no crash. */
Test(cuda_nccl, perf_tool_without_a_driver, .timeout = 60)
{
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof cmd,
             "cd %s && WEFT_CUDA_DRIVER=/nonexistent.so timeout 30 ./weftrun -n 2 ./all_reduce_perf -G 1 "
             "-b 8 -e 8 2>&1",
             WEFT_BUILDDIR);
    int rc = weft_test_shell(cmd, out, sizeof out);
    cr_expect_neq(rc, 0, "all_reduce_perf -G 1 without a driver succeeded:\n%s", out);
    cr_expect_not_null(strstr(out, "no CUDA driver"), "no reason given:\n%s", out);
}
