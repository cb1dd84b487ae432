/*
 * test_cuda.c - device buffers and stream semantics, run on the fake CUDA
 * driver (tests/fakecuda): its device memory faults on any host access, so
 * these tests also prove weft never touches device bytes with the CPU.
 * Every rank is a forked process that makes its own CUDA calls.
 */
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "algorithms/schedule.h"
#include "base/cudrv.h"
#include "devbuf.h"
#include "harness.h"

/* Points weft at the fake before anything reads the parameters. */
static void use_fake(const char *extra)
{
    setenv("WEFT_CUDA_DRIVER", FAKECUDA_LIB, 1);
    setenv("WEFT_CUDA_STAGE_BYTES", "4096", 1); /* many segments at small sizes */
    if (extra != NULL)
        putenv((char *)extra);
    weft_param_reload();
}

/* A rank's CUDA: the fake, a context, a stream. */
struct gpu {
    const struct weft_cu *cu;
    CUcontext ctx;
    CUstream s;
};

static int gpu_open(int rank, struct gpu *g)
{
    const char *why = NULL;
    g->cu = weft_cu_get(&why);
    if (g->cu == NULL)
        return weft_test_fail(rank, "no fake driver: %s", why);
    CUdevice dev;
    if (g->cu->cuDeviceGet(&dev, 0) || g->cu->cuDevicePrimaryCtxRetain(&g->ctx, dev) ||
        g->cu->cuCtxSetCurrent(g->ctx) || g->cu->cuStreamCreate(&g->s, CU_STREAM_NON_BLOCKING))
        return weft_test_fail(rank, "fake driver setup failed");
    return 0;
}

static void *dev_alloc(struct gpu *g, size_t bytes)
{
    CUdeviceptr p = 0;
    if (g->cu->cuMemAlloc(&p, bytes ? bytes : 1) != CUDA_SUCCESS)
        return NULL;
    return (void *)(uintptr_t)p;
}

static void dev_free(struct gpu *g, void *p)
{
    g->cu->cuMemFree((CUdeviceptr)(uintptr_t)p);
}

static int to_dev(struct gpu *g, void *d, const void *h, size_t bytes)
{
    return bytes ? g->cu->cuMemcpyHtoD((CUdeviceptr)(uintptr_t)d, h, bytes) : 0;
}

static int to_host(struct gpu *g, void *h, const void *d, size_t bytes)
{
    return bytes ? g->cu->cuMemcpyDtoH(h, (CUdeviceptr)(uintptr_t)d, bytes) : 0;
}

/* Rank r's input element i: small integers, so float sums are exact. */
static int64_t val(int r, size_t i)
{
    return (int64_t)((r + 1) * (int)(i % 7 + 1)) - 3;
}

enum kinds { DEV_DEV, HOST_DEV, DEV_HOST };

/* One collective with stream ordering: the input is copied to the device
 * on the stream, the collective is enqueued behind it, the result copied
 * back on the stream; one synchronisation at the end. */
static int one_coll(weft_comm_t comm, int rank, int p, struct gpu *g, int coll, weft_dtype_t dt,
                    size_t n, enum kinds kinds)
{
    size_t es = weft_dtype_size(dt);
    size_t in_n = coll == WEFT_COLL_REDUCE_SCATTER ? n * (size_t)p : n;
    size_t out_n = coll == WEFT_COLL_ALLGATHER ? n * (size_t)p : n;
    int root = p - 1;
    char *hin = malloc(in_n * es + 1), *hout = malloc(out_n * es + 1), *want = malloc(out_n * es + 1);
    for (size_t i = 0; i < in_n; i++)
        weft_test_store_int(hin, dt, i, val(rank, i));
    for (size_t i = 0; i < out_n; i++) {
        int64_t w = 0;
        switch (coll) {
        case WEFT_COLL_ALLREDUCE:
        case WEFT_COLL_REDUCE:
            for (int r = 0; r < p; r++)
                w += val(r, i);
            break;
        case WEFT_COLL_REDUCE_SCATTER:
            for (int r = 0; r < p; r++)
                w += val(r, (size_t)rank * n + i);
            break;
        case WEFT_COLL_ALLGATHER: w = val((int)(i / (n ? n : 1)), i % (n ? n : 1)); break;
        case WEFT_COLL_BROADCAST: w = val(root, i); break;
        }
        weft_test_store_int(want, dt, i, w);
    }
    void *din = dev_alloc(g, in_n * es), *dout = dev_alloc(g, out_n * es);
    if (!din || !dout)
        return weft_test_fail(rank, "cuMemAlloc failed");
    const void *sb = kinds == HOST_DEV ? (const void *)hin : din;
    void *rb = kinds == DEV_HOST ? (void *)hout : dout;
    if (kinds != HOST_DEV && g->cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)din, (CUdeviceptr)(uintptr_t)hin,
                                                  in_n * es, g->s))
        return weft_test_fail(rank, "cuMemcpyAsync in");
    weft_status_t st = WEFT_OK;
    switch (coll) {
    case WEFT_COLL_ALLREDUCE: st = weft_allreduce_stream(sb, rb, n, dt, WEFT_SUM, comm, g->s); break;
    case WEFT_COLL_REDUCE: st = weft_reduce_stream(sb, rb, n, dt, WEFT_SUM, root, comm, g->s); break;
    case WEFT_COLL_REDUCE_SCATTER:
        st = weft_reduce_scatter_stream(sb, rb, n, dt, WEFT_SUM, comm, g->s);
        break;
    case WEFT_COLL_ALLGATHER: st = weft_allgather_stream(sb, rb, n, dt, comm, g->s); break;
    case WEFT_COLL_BROADCAST: st = weft_broadcast_stream(sb, rb, n, dt, root, comm, g->s); break;
    }
    WT_CHECK_OK(rank, comm, "collective _stream", st);
    if (kinds != DEV_HOST && g->cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)hout,
                                                  (CUdeviceptr)(uintptr_t)dout, out_n * es, g->s))
        return weft_test_fail(rank, "cuMemcpyAsync out");
    if (g->cu->cuStreamSynchronize(g->s))
        return weft_test_fail(rank, "cuStreamSynchronize");
    int bad = 0;
    bool has_out = !(coll == WEFT_COLL_REDUCE && rank != root);
    if (has_out) {
        char what[96];
        snprintf(what, sizeof what, "coll %d n %zu kinds %d", coll, n, (int)kinds);
        bad = weft_test_check(rank, what, hout, want, dt, out_n);
    }
    dev_free(g, din);
    dev_free(g, dout);
    free(hin);
    free(hout);
    free(want);
    return bad;
}

static int body_matrix(weft_comm_t comm, int rank, int p, void *arg)
{
    struct gpu g;
    if (gpu_open(rank, &g))
        return 1;
    static const int colls[] = {WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_ALLGATHER,
                                WEFT_COLL_BROADCAST, WEFT_COLL_REDUCE};
    static const weft_dtype_t dts[] = {WEFT_FLOAT32, WEFT_INT32, WEFT_FLOAT16, WEFT_INT8};
    size_t counts[] = {0, 1, (size_t)p + 1, 3001};
    for (size_t c = 0; c < sizeof colls / sizeof *colls; c++)
        for (size_t t = 0; t < sizeof dts / sizeof *dts; t++)
            for (size_t k = 0; k < sizeof counts / sizeof *counts; k++)
                if (one_coll(comm, rank, p, &g, colls[c], dts[t], counts[k], DEV_DEV))
                    return 1;
    /* Mixed kinds in one call. */
    for (size_t c = 0; c < 3; c++) {
        if (one_coll(comm, rank, p, &g, colls[c], WEFT_FLOAT32, 1000, HOST_DEV) ||
            one_coll(comm, rank, p, &g, colls[c], WEFT_FLOAT32, 1000, DEV_HOST))
            return 1;
    }
    /* The path the calls took: what the test asked for (arg). */
    uint64_t ipc, staged;
    weft_dev_stats((struct weft_comm *)comm, &ipc, &staged);
    const char *want = arg;
    if ((strcmp(want, "ipc") == 0 && ipc < 80) || (strcmp(want, "staged") == 0 && ipc != 0))
        return weft_test_fail(rank, "wanted %s: %llu calls through IPC, %llu staged", want,
                              (unsigned long long)ipc, (unsigned long long)staged);
    return 0;
}

/* One host: CUDA IPC and GPU kernels (the fake runs them on the CPU). */
Test(cuda, stream_matrix_ipc_2_ranks, .timeout = 120)
{
    use_fake(NULL);
    cr_assert_eq(weft_test_run(2, 100, body_matrix, "ipc"), 0);
}

Test(cuda, stream_matrix_ipc_3_ranks, .timeout = 120)
{
    use_fake(NULL);
    cr_assert_eq(weft_test_run(3, 100, body_matrix, "ipc"), 0);
}

/* Staged through pinned memory: IPC turned off, and ranks posing as
 * three hosts over TCP. */
Test(cuda, stream_matrix_staged_2_ranks, .timeout = 120)
{
    use_fake("WEFT_CUDA_IPC=0");
    cr_assert_eq(weft_test_run(2, 100, body_matrix, "staged"), 0);
}

Test(cuda, stream_matrix_staged_3_hosts_tcp, .timeout = 120)
{
    use_fake("WEFT_TEST_HOSTS=3");
    cr_assert_eq(weft_test_run(3, 100, body_matrix, "staged"), 0);
}

/* The collective waits for the stream's earlier work: the stream is held
 * (as a long kernel would hold it) while the input copy sits before the
 * collective; weft must not read the input before the hold ends. */
static int body_order(weft_comm_t comm, int rank, int p, void *arg)
{
    struct gpu g;
    if (gpu_open(rank, &g))
        return 1;
    void *fake = dlopen(FAKECUDA_LIB, RTLD_NOW | RTLD_NOLOAD);
    CUresult (*hold)(CUstream) = fake ? (CUresult(*)(CUstream))dlsym(fake, "fakecuda_stream_hold") : NULL;
    CUresult (*release)(CUstream) = fake ? (CUresult(*)(CUstream))dlsym(fake, "fakecuda_stream_release") : NULL;
    if (!hold || !release)
        return weft_test_fail(rank, "fakecuda_stream_hold/release not found");
    size_t n = 5000;
    float *h = malloc(n * sizeof(float)), *out = malloc(n * sizeof(float));
    void *d = dev_alloc(&g, n * sizeof(float));
    for (int round = 0; round < 3; round++) {
        for (size_t i = 0; i < n; i++)
            h[i] = (float)(rank + round + (int)(i % 5));
        hold(g.s);
        g.cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)d, (CUdeviceptr)(uintptr_t)h, n * sizeof(float), g.s);
        WT_CHECK_OK(rank, comm, "allreduce_stream", weft_allreduce_stream(d, d, n, WEFT_FLOAT32, WEFT_SUM, comm, g.s));
        g.cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)out, (CUdeviceptr)(uintptr_t)d, n * sizeof(float), g.s);
        /* The call returned at once although the stream cannot move. */
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        release(g.s);
        g.cu->cuStreamSynchronize(g.s);
        for (size_t i = 0; i < n; i++) {
            float w = 0;
            for (int r = 0; r < p; r++)
                w += (float)(r + round + (int)(i % 5));
            if (out[i] != w)
                return weft_test_fail(rank, "round %d [%zu]: %g, expected %g", round, i, out[i], w);
        }
    }
    dev_free(&g, d);
    free(h);
    free(out);
    return 0;
}

Test(cuda, stream_order_is_kept, .timeout = 60)
{
    use_fake(NULL);
    cr_assert_eq(weft_test_run(2, 50, body_order, NULL), 0);
}

/* Blocking calls on device buffers, send/recv in a group on streams, and
 * streams that wait in host functions (a driver without memory ops). */
static int body_plain_and_p2p(weft_comm_t comm, int rank, int p, void *arg)
{
    struct gpu g;
    if (gpu_open(rank, &g))
        return 1;
    size_t n = 777;
    int32_t *h = malloc(n * 4), *o = malloc(n * 4);
    void *a = dev_alloc(&g, n * 4), *b = dev_alloc(&g, n * 4);
    for (size_t i = 0; i < n; i++)
        h[i] = rank * 1000 + (int32_t)i;
    to_dev(&g, a, h, n * 4);
    WT_CHECK_OK(rank, comm, "weft_allreduce on device buffers",
                weft_allreduce(a, b, n, WEFT_INT32, WEFT_MAX, comm));
    to_host(&g, o, b, n * 4);
    for (size_t i = 0; i < n; i++)
        if (o[i] != (p - 1) * 1000 + (int32_t)i)
            return weft_test_fail(rank, "plain allreduce [%zu] = %d", i, o[i]);
    /* A ring shift on streams: each rank sends a to the next, receives b
     * from the previous, in one group. */
    int next = (rank + 1) % p, prev = (rank + p - 1) % p;
    weft_group_start();
    weft_status_t s1 = weft_send_stream(a, n, WEFT_INT32, next, comm, g.s);
    weft_status_t s2 = weft_recv_stream(b, n, WEFT_INT32, prev, comm, g.s);
    weft_status_t s3 = weft_group_end();
    WT_CHECK_OK(rank, comm, "send_stream", s1);
    WT_CHECK_OK(rank, comm, "recv_stream", s2);
    WT_CHECK_OK(rank, comm, "group_end", s3);
    g.cu->cuMemcpyAsync((CUdeviceptr)(uintptr_t)o, (CUdeviceptr)(uintptr_t)b, n * 4, g.s);
    g.cu->cuStreamSynchronize(g.s);
    for (size_t i = 0; i < n; i++)
        if (o[i] != prev * 1000 + (int32_t)i)
            return weft_test_fail(rank, "ring shift [%zu] = %d", i, o[i]);
    /* A non-blocking call on device buffers says what to use instead. */
    weft_request_t req;
    weft_status_t st = weft_iallreduce(a, b, n, WEFT_INT32, WEFT_SUM, comm, &req);
    if (st != WEFT_ERR_UNSUPPORTED || strstr(weft_last_error(comm), "_stream") == NULL)
        return weft_test_fail(rank, "weft_iallreduce on device buffers: %s (%s)", weft_status_string(st),
                              weft_last_error(comm));
    /* Host calls after stream calls keep the order of the calls. */
    int32_t x = rank + 1, y = 0;
    WT_CHECK_OK(rank, comm, "host allreduce after", weft_allreduce(&x, &y, 1, WEFT_INT32, WEFT_SUM, comm));
    if (y != p * (p + 1) / 2)
        return weft_test_fail(rank, "host allreduce after stream calls: %d", y);
    dev_free(&g, a);
    dev_free(&g, b);
    free(h);
    free(o);
    return 0;
}

Test(cuda, plain_calls_and_p2p_groups, .timeout = 60)
{
    use_fake(NULL);
    cr_assert_eq(weft_test_run(3, 50, body_plain_and_p2p, NULL), 0);
}

Test(cuda, streams_wait_in_host_functions_without_memops, .timeout = 60)
{
    use_fake("FAKECUDA_NO_MEMOPS=1");
    cr_assert_eq(weft_test_run(2, 50, body_plain_and_p2p, NULL), 0);
    cr_assert_eq(weft_test_run(2, 50, body_order, NULL), 0);
}

/* A dead peer: the survivor's stream is released with an error, never
 * left hanging; abort then frees everything. */
static int body_dead_peer(weft_comm_t comm, int rank, int p, void *arg)
{
    struct gpu g;
    if (gpu_open(rank, &g))
        return 1;
    size_t n = 4096;
    void *d = dev_alloc(&g, n * 4);
    if (rank == 1)
        _exit(0); /* dies before its collective */
    weft_status_t st = weft_allreduce_stream(d, d, n, WEFT_FLOAT32, WEFT_SUM, comm, g.s);
    WT_CHECK_OK(rank, comm, "allreduce_stream (returns at once)", st);
    uint64_t t0 = weft_now_ns();
    if (g.cu->cuStreamSynchronize(g.s))
        return weft_test_fail(rank, "cuStreamSynchronize failed");
    double s = (weft_now_ns() - t0) / 1e9;
    st = weft_comm_get_error(comm);
    if (st != WEFT_ERR_REMOTE && st != WEFT_ERR_TIMEOUT)
        return weft_test_fail(rank, "comm error after a dead peer: %s", weft_status_string(st));
    if (s > 20)
        return weft_test_fail(rank, "the stream took %.1f s to be released", s);
    /* The next call fails at once with the same error and holds no stream. */
    st = weft_allreduce_stream(d, d, n, WEFT_FLOAT32, WEFT_SUM, comm, g.s);
    if (st == WEFT_OK)
        return weft_test_fail(rank, "a call on a failed communicator succeeded");
    g.cu->cuStreamSynchronize(g.s);
    weft_comm_abort(comm);
    _exit(0);
}

Test(cuda, dead_peer_releases_the_stream, .timeout = 60)
{
    use_fake("WEFT_TIMEOUT_MS=10000");
    cr_assert_eq(weft_test_run(2, 50, body_dead_peer, NULL), 0);
}

/* Abort while the stream waits for a peer that never calls: the stream is
 * released by the abort. */
static int body_abort(weft_comm_t comm, int rank, int p, void *arg)
{
    struct gpu g;
    if (gpu_open(rank, &g))
        return 1;
    void *d = dev_alloc(&g, 4096);
    if (rank == 1) {
        sleep(3); /* alive but silent: the collective cannot finish */
        weft_comm_abort(comm);
        _exit(0);
    }
    WT_CHECK_OK(rank, comm, "allreduce_stream", weft_allreduce_stream(d, d, 1024, WEFT_FLOAT32, WEFT_SUM, comm, g.s));
    struct timespec ts = {0, 200 * 1000 * 1000};
    nanosleep(&ts, NULL);
    if (g.cu->cuStreamQuery(g.s) != CUDA_ERROR_NOT_READY)
        return weft_test_fail(rank, "the stream went on before the collective could finish");
    uint64_t t0 = weft_now_ns();
    weft_comm_abort(comm);
    g.cu->cuStreamSynchronize(g.s);
    double s = (weft_now_ns() - t0) / 1e9;
    if (s > 5)
        return weft_test_fail(rank, "abort took %.1f s to release the stream", s);
    _exit(0);
}

Test(cuda, abort_releases_a_waiting_stream, .timeout = 60)
{
    use_fake("WEFT_TIMEOUT_MS=60000");
    cr_assert_eq(weft_test_run(2, 50, body_abort, NULL), 0);
}

/* No driver, no device: clear errors, host buffers unaffected. */
static int body_no_driver(weft_comm_t comm, int rank, int p, void *arg)
{
    float x = 1, y = 0;
    weft_status_t st = weft_allreduce_stream(&x, &y, 1, WEFT_FLOAT32, WEFT_SUM, comm, NULL);
    const char *want = arg;
    if (st != WEFT_ERR_UNSUPPORTED || strstr(weft_last_error(comm), want) == NULL)
        return weft_test_fail(rank, "stream call without %s: %s (%s)", want, weft_status_string(st),
                              weft_last_error(comm));
    if (weft_cuda_device_count() != 0)
        return weft_test_fail(rank, "weft_cuda_device_count() = %d", weft_cuda_device_count());
    WT_CHECK_OK(rank, comm, "host allreduce", weft_allreduce(&x, &y, 1, WEFT_FLOAT32, WEFT_SUM, comm));
    return y == (float)p ? 0 : weft_test_fail(rank, "host allreduce gave %g", y);
}

Test(cuda, no_driver_is_a_clear_error, .timeout = 30)
{
    setenv("WEFT_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    weft_param_reload();
    cr_assert_eq(weft_test_run(2, 20, body_no_driver, "no CUDA driver"), 0);
}

Test(cuda, no_device_is_a_clear_error, .timeout = 30)
{
    use_fake("FAKECUDA_DEVICES=0");
    cr_assert_eq(weft_test_run(2, 20, body_no_driver, "no CUDA device"), 0);
}

/* Deterministic results with device buffers: random floats (sums that
 * round), the same bits on every rank and on a second run. */
static int body_det(weft_comm_t comm, int rank, int p, void *arg)
{
    struct gpu g;
    if (gpu_open(rank, &g))
        return 1;
    size_t n = 10007;
    float *h = malloc(n * 4), *o1 = malloc(n * 4), *o2 = malloc(n * 4);
    uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(rank + 1);
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = (float)((double)(x >> 11) / 9007199254740992.0 * 2e3 - 1e3) / 7.0f;
    }
    void *s = dev_alloc(&g, n * 4), *r = dev_alloc(&g, n * 4);
    to_dev(&g, s, h, n * 4);
    for (int run = 0; run < 2; run++) {
        WT_CHECK_OK(rank, comm, "allreduce_stream", weft_allreduce_stream(s, r, n, WEFT_FLOAT32, WEFT_SUM, comm, g.s));
        g.cu->cuStreamSynchronize(g.s);
        to_host(&g, run ? o2 : o1, r, n * 4);
    }
    if (memcmp(o1, o2, n * 4) != 0)
        return weft_test_fail(rank, "two runs differ");
    uint64_t hash = 1469598103934665603ull, all[64];
    for (size_t i = 0; i < n * 4; i++)
        hash = (hash ^ ((unsigned char *)o1)[i]) * 1099511628211ull;
    WT_CHECK_OK(rank, comm, "allgather", weft_allgather(&hash, all, 1, WEFT_UINT64, comm));
    for (int q = 0; q < p; q++)
        if (all[q] != hash)
            return weft_test_fail(rank, "rank %d got other bits", q);
    dev_free(&g, s);
    dev_free(&g, r);
    free(h);
    free(o1);
    free(o2);
    return 0;
}

Test(cuda, deterministic_ipc_3_ranks, .timeout = 60)
{
    use_fake("WEFT_DETERMINISTIC=1");
    cr_assert_eq(weft_test_run(3, 50, body_det, NULL), 0);
}

Test(cuda, deterministic_staged_3_ranks, .timeout = 60)
{
    use_fake("WEFT_DETERMINISTIC=1");
    putenv("WEFT_CUDA_IPC=0");
    weft_param_reload();
    cr_assert_eq(weft_test_run(3, 50, body_det, NULL), 0);
}
