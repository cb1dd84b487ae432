/*
 * nccl_prog.c - a program written only against the NCCL API (nccl.h and
 * libc), compiled against NVIDIA's header and against weft's, that checks
 * every operation with host buffers and stream == NULL.
 *
 *   nccl_prog                 one rank of a job: rank and size from the
 *                             launcher (WEFT_RANK/WEFT_NRANKS, Open MPI,
 *                             Slurm); the id from ncclGetUniqueId on every
 *                             rank, as with NCCL_COMM_ID (or weftrun).
 *   nccl_prog --init-all N    N ranks in this process (ncclCommInitAll),
 *                             driven from one thread with groups.
 *   --abort                   rank 0 aborts its communicator from the main
 *                             thread while another thread waits in an
 *                             AllReduce that rank 1 never joins.
 *   --which                   prints the path of the library that provides
 *                             ncclAllReduce, and exits.
 *   --expect-lib SUBSTR       the library that provides ncclAllReduce
 *                             must have SUBSTR in its path (which libnccl
 *                             did the dynamic linker pick?).
 * Exit 0 when every check passed; each failure prints a line.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

static int rank_ = -1, failures;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "rank %d: %s:%d: ", rank_, __FILE__, __LINE__);                   \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
            failures++;                                                                       \
        }                                                                                     \
    } while (0)

#define NCCLOK(call)                                                                          \
    do {                                                                                      \
        ncclResult_t r_ = (call);                                                             \
        if (r_ != ncclSuccess) {                                                              \
            fprintf(stderr, "rank %d: %s:%d: %s: %s (%s)\n", rank_, __FILE__, __LINE__,       \
                    #call, ncclGetErrorString(r_), ncclGetLastError(NULL));                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* ---- values: small integers, exact in every type ------------------------- */

static const size_t tsize[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

static uint16_t to_half(double v) /* exact for integers below 2048 */
{
    if (v == 0)
        return 0;
    uint16_t sign = v < 0 ? 0x8000 : 0;
    double a = v < 0 ? -v : v;
    int e = 0;
    while (a >= 2) { a /= 2; e++; }
    while (a < 1) { a *= 2; e--; }
    return (uint16_t)(sign | (uint16_t)((e + 15) << 10) | (uint16_t)((a - 1) * 1024 + 0.5));
}

static double from_half(uint16_t h)
{
    int e = (h >> 10) & 31;
    double m = (h & 1023) / 1024.0;
    double v = e == 0 ? m * (1.0 / 16384) : (1 + m) * (double)(1u << e) / 32768.0;
    return h & 0x8000 ? -v : v;
}

static uint16_t to_bf16(double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16); /* exact for small integers */
}

static double from_bf16(uint16_t b)
{
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void put(void *buf, int t, size_t i, double v)
{
    char *p = (char *)buf + i * tsize[t];
    switch (t) {
    case ncclInt8: *(int8_t *)p = (int8_t)v; break;
    case ncclUint8: *(uint8_t *)p = (uint8_t)v; break;
    case ncclInt32: *(int32_t *)p = (int32_t)v; break;
    case ncclUint32: *(uint32_t *)p = (uint32_t)v; break;
    case ncclInt64: *(int64_t *)p = (int64_t)v; break;
    case ncclUint64: *(uint64_t *)p = (uint64_t)v; break;
    case ncclFloat16: *(uint16_t *)p = to_half(v); break;
    case ncclFloat32: *(float *)p = (float)v; break;
    case ncclFloat64: *(double *)p = v; break;
    case ncclBfloat16: *(uint16_t *)p = to_bf16(v); break;
    }
}

static double get(const void *buf, int t, size_t i)
{
    const char *p = (const char *)buf + i * tsize[t];
    switch (t) {
    case ncclInt8: return *(const int8_t *)p;
    case ncclUint8: return *(const uint8_t *)p;
    case ncclInt32: return *(const int32_t *)p;
    case ncclUint32: return *(const uint32_t *)p;
    case ncclInt64: return (double)*(const int64_t *)p;
    case ncclUint64: return (double)*(const uint64_t *)p;
    case ncclFloat16: return from_half(*(const uint16_t *)p);
    case ncclFloat32: return *(const float *)p;
    case ncclFloat64: return *(const double *)p;
    case ncclBfloat16: return from_bf16(*(const uint16_t *)p);
    }
    return 0;
}

/* Rank r's element i: 1..3 so products stay small. */
static double val(int r, size_t i)
{
    return (double)(1 + (r + i) % 3);
}

static double expect_reduce(int op, int t, int p, size_t i)
{
    double acc = val(0, i);
    for (int r = 1; r < p; r++) {
        double v = val(r, i);
        acc = op == ncclSum || op == ncclAvg ? acc + v
              : op == ncclProd               ? acc * v
              : op == ncclMax                ? (v > acc ? v : acc)
                                             : (v < acc ? v : acc);
    }
    if (op == ncclAvg) {
        acc /= p;
        if (t <= ncclUint64) /* integers truncate */
            acc = (double)(long long)acc;
        else if (t == ncclFloat16)
            acc = from_half(to_half(acc)) == acc ? acc : acc; /* compared with tolerance */
    }
    return acc;
}

/* ---- the checks ---------------------------------------------------------- */

static void check_allreduce(ncclComm_t comm, int p)
{
    size_t counts[] = {0, 1, (size_t)p + 1, 100003};
    size_t maxn = 100003;
    void *in = malloc(maxn * 8), *out = malloc(maxn * 8);
    for (int t = 0; t < 10; t++)
        for (int op = 0; op < ncclNumOps; op++)
            for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                size_t n = counts[k];
                for (size_t i = 0; i < n; i++)
                    put(in, t, i, val(rank_, i));
                NCCLOK(ncclAllReduce(in, out, n, (ncclDataType_t)t, (ncclRedOp_t)op, comm, NULL));
                for (size_t i = 0; i < n; i++) {
                    double want = expect_reduce(op, t, p, i), got = get(out, t, i);
                    double tol = op == ncclAvg && t >= ncclFloat16 ? 0.01 : 0;
                    if (got - want > tol || want - got > tol) {
                        CHECK(0, "AllReduce type %d op %d count %zu [%zu]: want %g got %g", t, op,
                              n, i, want, got);
                        break;
                    }
                }
            }
    free(in);
    free(out);
}

static void check_collectives(ncclComm_t comm, int p)
{
    enum { N = 1001 };
    float *big = malloc(sizeof(float) * N * (size_t)p), *small = malloc(sizeof(float) * N);
    /* ReduceScatter: block b of rank r holds r + b. */
    for (int b = 0; b < p; b++)
        for (int i = 0; i < N; i++)
            big[b * N + i] = (float)(rank_ + b + i % 5);
    NCCLOK(ncclReduceScatter(big, small, N, ncclFloat, ncclSum, comm, NULL));
    for (int i = 0; i < N; i++)
        CHECK(small[i] == (float)(p * (p - 1) / 2 + p * (rank_ + i % 5)),
              "ReduceScatter [%d] = %g", i, small[i]);
    /* In place: the result lands in this rank's block. */
    for (int b = 0; b < p; b++)
        for (int i = 0; i < N; i++)
            big[b * N + i] = 1.0f;
    NCCLOK(ncclReduceScatter(big, big + rank_ * N, N, ncclFloat, ncclSum, comm, NULL));
    CHECK(big[rank_ * N] == (float)p && big[rank_ * N + N - 1] == (float)p,
          "in-place ReduceScatter gave %g", big[rank_ * N]);

    /* AllGather, then in place. */
    for (int i = 0; i < N; i++)
        small[i] = (float)(rank_ * 10000 + i);
    NCCLOK(ncclAllGather(small, big, N, ncclFloat, comm, NULL));
    for (int r = 0; r < p; r++)
        CHECK(big[r * N + 7] == (float)(r * 10000 + 7), "AllGather block %d", r);
    memset(big, 0, sizeof(float) * N * (size_t)p);
    big[rank_ * N] = (float)(rank_ + 1);
    NCCLOK(ncclAllGather(big + rank_ * N, big, N, ncclFloat, comm, NULL));
    for (int r = 0; r < p; r++)
        CHECK(big[r * N] == (float)(r + 1), "in-place AllGather block %d = %g", r, big[r * N]);

    /* fp8 moves as bytes; it cannot be reduced. */
    uint8_t b8[4] = {(uint8_t)(0x38 + rank_)}, all8[256];
    NCCLOK(ncclAllGather(b8, all8, 1, ncclFloat8e4m3, comm, NULL));
    for (int r = 0; r < p; r++)
        CHECK(all8[r] == 0x38 + r, "fp8 AllGather [%d] = %#x", r, all8[r]);
    CHECK(ncclAllReduce(b8, b8, 1, ncclFloat8e5m2, ncclSum, comm, NULL) == ncclInvalidUsage,
          "fp8 AllReduce must be ncclInvalidUsage");

    /* Broadcast from the last rank; Bcast in place from rank 1 % p. */
    int64_t v[3] = {rank_, rank_, rank_}, w[3] = {0};
    NCCLOK(ncclBroadcast(v, w, 3, ncclInt64, p - 1, comm, NULL));
    CHECK(w[0] == p - 1 && w[2] == p - 1, "Broadcast gave %lld", (long long)w[0]);
    NCCLOK(ncclBcast(v, 3, ncclInt64, 1 % p, comm, NULL));
    CHECK(v[1] == 1 % p, "Bcast gave %lld", (long long)v[1]);

    /* Reduce (max) to rank 0; recvbuff NULL elsewhere. */
    int64_t mine = 100 + rank_, top = -1;
    NCCLOK(ncclReduce(&mine, rank_ == 0 ? &top : NULL, 1, ncclInt64, ncclMax, 0, comm, NULL));
    if (rank_ == 0)
        CHECK(top == 100 + p - 1, "Reduce max gave %lld", (long long)top);

    /* AlltoAll: block q of rank r is r * 100 + q. */
    int32_t *a2a = malloc(sizeof(int32_t) * 3 * (size_t)p), *got = malloc(sizeof(int32_t) * 3 * (size_t)p);
    for (int q = 0; q < p; q++)
        for (int i = 0; i < 3; i++)
            a2a[q * 3 + i] = rank_ * 100 + q;
    NCCLOK(ncclAlltoAll(a2a, got, 3, ncclInt32, comm, NULL));
    for (int q = 0; q < p; q++)
        CHECK(got[q * 3 + 2] == q * 100 + rank_, "AlltoAll block %d = %d", q, got[q * 3 + 2]);

    /* Gather to rank 1 % p, then in place; Scatter from rank 0. */
    int root = 1 % p;
    int32_t g = 7 * rank_;
    memset(got, 0xff, sizeof(int32_t) * (size_t)p);
    NCCLOK(ncclGather(&g, rank_ == root ? got : NULL, 1, ncclInt32, root, comm, NULL));
    if (rank_ == root)
        for (int q = 0; q < p; q++)
            CHECK(got[q] == 7 * q, "Gather [%d] = %d", q, got[q]);
    got[rank_] = 5 * rank_;
    NCCLOK(ncclGather(rank_ == root ? &got[root] : &got[rank_], got, 1, ncclInt32, root, comm,
                      NULL));
    if (rank_ == root)
        for (int q = 0; q < p; q++)
            CHECK(got[q] == 5 * q, "in-place Gather [%d] = %d", q, got[q]);
    for (int q = 0; q < p; q++)
        a2a[q] = 1000 + q;
    int32_t s = -1;
    NCCLOK(ncclScatter(rank_ == 0 ? a2a : NULL, &s, 1, ncclInt32, 0, comm, NULL));
    CHECK(s == 1000 + rank_, "Scatter gave %d", s);
    free(a2a);
    free(got);
    free(big);
    free(small);
}

/* The ring of Send/Recv that deadlocks without a group: every rank sends
 * first.  Large enough that no socket buffer hides the deadlock. */
static void check_send_recv_ring(ncclComm_t comm, int p)
{
    size_t n = 4 << 20;
    char *out, *in;
    NCCLOK(ncclMemAlloc((void **)&out, n));
    NCCLOK(ncclMemAlloc((void **)&in, n));
    memset(out, rank_ + 1, n);
    memset(in, 0, n);
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclSend(out, n, ncclChar, (rank_ + 1) % p, comm, NULL));
    NCCLOK(ncclRecv(in, n, ncclChar, (rank_ + p - 1) % p, comm, NULL));
    NCCLOK(ncclGroupEnd());
    int from = (rank_ + p - 1) % p;
    CHECK(in[0] == from + 1 && in[n - 1] == from + 1, "ring recv got %d", in[0]);
    NCCLOK(ncclMemFree(out));
    NCCLOK(ncclMemFree(in));
}

static void check_premulsum(ncclComm_t comm, int p)
{
    float half = 0.5f;
    ncclRedOp_t op;
    NCCLOK(ncclRedOpCreatePreMulSum(&op, &half, ncclFloat, ncclScalarHostImmediate, comm));
    half = 100; /* immediate: the value was read already */
    float x[5] = {2, 4, 6, 8, 10}, y[5];
    NCCLOK(ncclAllReduce(x, y, 5, ncclFloat, op, comm, NULL));
    CHECK(y[0] == p * 1.0f && y[4] == p * 5.0f, "PreMulSum AllReduce gave %g", y[0]);
    CHECK(x[0] == 2, "PreMulSum changed the input");
    NCCLOK(ncclRedOpDestroy(op, comm));
    CHECK(ncclAllReduce(x, y, 5, ncclFloat, op, comm, NULL) == ncclInvalidArgument,
          "a destroyed operator must be rejected");
    double scale = 2; /* "device" residence: read when the operation runs */
    NCCLOK(ncclRedOpCreatePreMulSum(&op, &scale, ncclDouble, ncclScalarDevice, comm));
    scale = 3;
    double d = rank_ + 1, e = 0;
    NCCLOK(ncclAllReduce(&d, &e, 1, ncclDouble, op, comm, NULL));
    CHECK(e == 3.0 * p * (p + 1) / 2, "PreMulSum (device scalar) gave %g", e);
    double *blocks = malloc(sizeof(double) * (size_t)p);
    for (int b = 0; b < p; b++)
        blocks[b] = b + 1;
    NCCLOK(ncclReduceScatter(blocks, &e, 1, ncclDouble, op, comm, NULL));
    CHECK(e == 3.0 * p * (rank_ + 1), "PreMulSum ReduceScatter gave %g", e);
    free(blocks);
    CHECK(ncclAllReduce(x, y, 5, ncclFloat, op, comm, NULL) == ncclInvalidArgument,
          "an operator used with another datatype must be rejected");
    NCCLOK(ncclRedOpDestroy(op, comm));
}

static void check_errors(ncclComm_t comm, int p)
{
    float x = 1;
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, NULL, NULL) == ncclInvalidArgument,
          "NULL comm");
    CHECK(strlen(ncclGetLastError(NULL)) > 0, "no message for a NULL comm");
    CHECK(ncclAllReduce(&x, &x, 1, (ncclDataType_t)99, ncclSum, comm, NULL) ==
              ncclInvalidArgument,
          "bad datatype");
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, (ncclRedOp_t)1234, comm, NULL) ==
              ncclInvalidArgument,
          "bad op");
    CHECK(ncclBroadcast(&x, &x, 1, ncclFloat, p, comm, NULL) == ncclInvalidArgument,
          "root out of range");
    CHECK(ncclAllReduce(NULL, &x, 1, ncclFloat, ncclSum, comm, NULL) == ncclInvalidArgument,
          "NULL sendbuff");
    CHECK(ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, comm, (cudaStream_t)&x) ==
              ncclInvalidUsage,
          "a CUDA stream must be refused");
    CHECK(strstr(ncclGetLastError(comm), "stream") != NULL, "message: %s",
          ncclGetLastError(comm));
    CHECK(ncclGroupEnd() == ncclInvalidUsage, "GroupEnd without GroupStart");
    CHECK(ncclCommRevoke(comm, 0) == ncclInvalidUsage, "Revoke is unsupported");
    CHECK(strcmp(ncclGetErrorString(ncclRemoteError), ncclGetErrorString(ncclSuccess)) != 0,
          "error strings");
    int n = -1, me = -1, dev = -1;
    NCCLOK(ncclCommCount(comm, &n));
    NCCLOK(ncclCommUserRank(comm, &me));
    NCCLOK(ncclCommCuDevice(comm, &dev));
    CHECK(n == p && me == rank_ && dev >= 0, "Count %d UserRank %d CuDevice %d", n, me, dev);
    CHECK(ncclCommCount(comm, NULL) == ncclInvalidArgument, "Count(NULL)");
    ncclResult_t async = ncclInternalError;
    NCCLOK(ncclCommGetAsyncError(comm, &async));
    CHECK(async == ncclSuccess, "async error %d", async);
    void *h = NULL;
    NCCLOK(ncclCommRegister(comm, &x, sizeof(x), &h));
    NCCLOK(ncclCommDeregister(comm, h));
    CHECK(ncclCommDeregister(comm, &x) == ncclInvalidArgument, "Deregister of a non-handle");
}

static void check_split_and_shrink(ncclComm_t comm, int p)
{
    /* Even and odd ranks, reverse order; rank 0 stays out. */
    ncclComm_t sub = (ncclComm_t)&sub;
    int color = rank_ == 0 ? NCCL_SPLIT_NOCOLOR : rank_ % 2;
    NCCLOK(ncclCommSplit(comm, color, -rank_, &sub, NULL));
    if (rank_ == 0) {
        CHECK(sub == NULL, "NOCOLOR gave a communicator");
    } else {
        int n = -1, me = -1, want_n = 0, want_me = 0;
        for (int r = 1; r < p; r++)
            if (r % 2 == color) {
                want_n++;
                want_me += r > rank_;
            }
        NCCLOK(ncclCommCount(sub, &n));
        NCCLOK(ncclCommUserRank(sub, &me));
        CHECK(n == want_n && me == want_me, "split: %d of %d, want %d of %d", me, n, want_me,
              want_n);
        int32_t x = rank_, sum = 0;
        NCCLOK(ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, sub, NULL));
        int want = 0;
        for (int r = 1; r < p; r++)
            want += r % 2 == color ? r : 0;
        CHECK(sum == want, "split AllReduce %d, want %d", sum, want);
        NCCLOK(ncclCommDestroy(sub));
    }
    if (p < 3)
        return;
    /* The last rank leaves; the others shrink and go on. */
    if (rank_ == p - 1)
        return;
    int gone = p - 1;
    ncclComm_t shrunk;
    NCCLOK(ncclCommShrink(comm, &gone, 1, &shrunk, NULL, NCCL_SHRINK_DEFAULT));
    int n = -1;
    NCCLOK(ncclCommCount(shrunk, &n));
    int32_t one = 1, total = 0;
    NCCLOK(ncclAllReduce(&one, &total, 1, ncclInt32, ncclSum, shrunk, NULL));
    CHECK(n == p - 1 && total == p - 1, "shrink: %d ranks, sum %d", n, total);
    NCCLOK(ncclCommDestroy(shrunk));
}

/* A second communicator with a non-blocking config; its id travels over
 * the first, the way NCCL programs pass ids around. */
static void check_nonblocking_init(ncclComm_t comm, int p)
{
    ncclUniqueId id;
    if (rank_ == 0)
        NCCLOK(ncclGetUniqueId(&id));
    NCCLOK(ncclBroadcast(&id, &id, sizeof(id), ncclUint8, 0, comm, NULL));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.commName = "second";
    ncclComm_t c2;
    ncclResult_t r = ncclCommInitRankConfig(&c2, p, id, rank_, &cfg);
    CHECK(r == ncclSuccess || r == ncclInProgress, "non-blocking init returned %d", r);
    ncclResult_t state = ncclInProgress;
    while (state == ncclInProgress)
        NCCLOK(ncclCommGetAsyncError(c2, &state));
    CHECK(state == ncclSuccess, "non-blocking init ended with %s", ncclGetErrorString(state));
    double x = 1, y = 0;
    NCCLOK(ncclAllReduce(&x, &y, 1, ncclDouble, ncclSum, c2, NULL));
    CHECK(y == p, "AllReduce on the second comm gave %g", y);
    ncclConfig_t bad = NCCL_CONFIG_INITIALIZER;
    bad.magic = 0;
    ncclComm_t c3;
    CHECK(ncclCommInitRankConfig(&c3, p, id, rank_, &bad) == ncclInvalidArgument,
          "an uninitialized config must be refused");
    NCCLOK(ncclCommFinalize(c2));
    CHECK(ncclAllReduce(&x, &y, 1, ncclDouble, ncclSum, c2, NULL) == ncclInvalidUsage,
          "an operation after ncclCommFinalize");
    NCCLOK(ncclCommDestroy(c2));
}

static int init_all(int n)
{
    ncclComm_t comms[16];
    if (n < 1 || n > 16)
        return 2;
    rank_ = 0;
    NCCLOK(ncclCommInitAll(comms, n, NULL));
    float *buf[16];
    for (int i = 0; i < n; i++) {
        int me = -1, cnt = -1;
        NCCLOK(ncclCommUserRank(comms[i], &me));
        NCCLOK(ncclCommCount(comms[i], &cnt));
        CHECK(me == i && cnt == n, "comm %d: rank %d of %d", i, me, cnt);
        buf[i] = malloc(sizeof(float) * 65536);
        for (int k = 0; k < 65536; k++)
            buf[i][k] = (float)(i + k % 3);
    }
    NCCLOK(ncclGroupStart());
    for (int i = 0; i < n; i++)
        NCCLOK(ncclAllReduce(buf[i], buf[i], 65536, ncclFloat, ncclSum, comms[i], NULL));
    NCCLOK(ncclGroupEnd());
    for (int i = 0; i < n; i++)
        CHECK(buf[i][4] == (float)(n * (n - 1) / 2 + n * 1), "comm %d AllReduce gave %g", i,
              buf[i][4]);
    int32_t out[16], in[16];
    NCCLOK(ncclGroupStart());
    for (int i = 0; i < n; i++) {
        out[i] = 50 + i;
        NCCLOK(ncclSend(&out[i], 1, ncclInt32, (i + 1) % n, comms[i], NULL));
        NCCLOK(ncclRecv(&in[i], 1, ncclInt32, (i + n - 1) % n, comms[i], NULL));
    }
    NCCLOK(ncclGroupEnd());
    for (int i = 0; i < n; i++) {
        CHECK(in[i] == 50 + (i + n - 1) % n, "comm %d ring got %d", i, in[i]);
        NCCLOK(ncclCommDestroy(comms[i]));
        free(buf[i]);
    }
    return failures ? 1 : 0;
}

/* ncclCommAbort from another thread while a collective waits for a rank
 * that never joins it (what a watchdog thread does): the collective
 * returns an error and the abort returns promptly. */
struct blocked {
    ncclComm_t comm;
    ncclResult_t r;
};

static void *blocked_allreduce(void *arg)
{
    struct blocked *b = arg;
    float x = 1;
    b->r = ncclAllReduce(&x, &x, 1, ncclFloat, ncclSum, b->comm, NULL);
    return NULL;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int abort_test(ncclComm_t comm)
{
    if (rank_ != 0) {
        sleep(2); /* never joins the collective */
        NCCLOK(ncclCommAbort(comm));
        return 0;
    }
    struct blocked b = {comm, ncclSuccess};
    pthread_t th;
    pthread_create(&th, NULL, blocked_allreduce, &b);
    usleep(300000);
    double t0 = now_s();
    NCCLOK(ncclCommAbort(comm));
    pthread_join(th, NULL);
    double dt = now_s() - t0;
    CHECK(b.r != ncclSuccess, "the aborted AllReduce returned success");
    CHECK(dt < 2.0, "abort took %.2f s", dt);
    if (failures == 0)
        printf("abort returned in %.1f ms; the blocked AllReduce got %s\n", dt * 1e3,
               ncclGetErrorString(b.r));
    return failures ? 1 : 0;
}

/* --shrink-after-death: the last rank dies (no cleanup) in the middle of
 * a loop of AllReduces; the others see ncclRemoteError, shrink the failed
 * communicator with NCCL_SHRINK_ABORT and go on with exact sums. */
static int shrink_after_death(ncclComm_t comm, int p)
{
    enum { N = 1 << 16 };
    static float buf[N];
    int gone = p - 1;
    ncclResult_t r = ncclSuccess;
    for (int it = 0; r == ncclSuccess && it < 100000; it++) {
        if (rank_ == gone && it == 5)
            _exit(0); /* as if killed: nothing is closed or told */
        for (int i = 0; i < N; i++)
            buf[i] = (float)(rank_ + 1);
        r = ncclAllReduce(buf, buf, N, ncclFloat, ncclSum, comm, NULL);
    }
    CHECK(r == ncclRemoteError, "the loop ended with %s", ncclGetErrorString(r));
    ncclComm_t small = NULL;
    NCCLOK(ncclCommShrink(comm, &gone, 1, &small, NULL, NCCL_SHRINK_ABORT));
    int n = 0, me = -1;
    NCCLOK(ncclCommCount(small, &n));
    NCCLOK(ncclCommUserRank(small, &me));
    CHECK(n == p - 1 && me == rank_, "shrunk: rank %d of %d", me, n);
    for (int i = 0; i < N; i++)
        buf[i] = (float)(rank_ + 1);
    NCCLOK(ncclAllReduce(buf, buf, N, ncclFloat, ncclSum, small, NULL));
    float want = (float)((p - 1) * p / 2);
    CHECK(buf[0] == want && buf[N - 1] == want, "sum after the shrink: %g, expected %g",
          (double)buf[0], (double)want);
    NCCLOK(ncclCommDestroy(small));
    NCCLOK(ncclCommAbort(comm));
    if (failures == 0 && rank_ == 0)
        printf("shrink after a death: %d ranks go on\n", p - 1);
    return failures ? 1 : 0;
}

static int env_int(const char *const *names)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v && *v)
            return atoi(v);
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *expect_lib = NULL;
    int all = 0;
    bool which = false, abort_mode = false, shrink_mode = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--which") == 0)
            which = true;
        else if (strcmp(argv[i], "--abort") == 0)
            abort_mode = true;
        else if (strcmp(argv[i], "--shrink-after-death") == 0)
            shrink_mode = true;
        else if (strcmp(argv[i], "--expect-lib") == 0 && i + 1 < argc)
            expect_lib = argv[++i];
        else if (strcmp(argv[i], "--init-all") == 0 && i + 1 < argc)
            all = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--which] [--abort] [--init-all N] [--expect-lib SUBSTR]\n",
                    argv[0]);
            return 2;
        }
    }
    Dl_info info;
    if (dladdr((void *)ncclAllReduce, &info) == 0 || info.dli_fname == NULL) {
        fprintf(stderr, "cannot tell which library provides ncclAllReduce\n");
        return 1;
    }
    if (which) { /* where ncclAllReduce comes from, and nothing else */
        printf("%s\n", info.dli_fname);
        return 0;
    }
    if (expect_lib && strstr(info.dli_fname, expect_lib) == NULL) {
        fprintf(stderr, "ncclAllReduce comes from %s, not from a path with \"%s\"\n",
                info.dli_fname, expect_lib);
        return 1;
    }
    int version = 0;
    NCCLOK(ncclGetVersion(&version));
    if (version < NCCL_VERSION(2, 28, 0)) {
        fprintf(stderr, "version %d\n", version);
        return 1;
    }
    if (all > 0)
        return init_all(all);

    static const char *const rank_vars[] = {"WEFT_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", NULL};
    static const char *const size_vars[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", NULL};
    rank_ = env_int(rank_vars);
    int p = env_int(size_vars);
    if (rank_ < 0 || p < 1) {
        fprintf(stderr, "no rank/size in the environment (run under weftrun or mpirun)\n");
        return 2;
    }
    ncclUniqueId id;
    NCCLOK(ncclGetUniqueId(&id));
    ncclComm_t comm;
    NCCLOK(ncclCommInitRank(&comm, p, id, rank_));
    if (abort_mode)
        return abort_test(comm);
    if (shrink_mode)
        return shrink_after_death(comm, p);
    if (rank_ == 0)
        printf("ncclAllReduce from %s; version %d; %d ranks\n", info.dli_fname, version, p);
    check_allreduce(comm, p);
    check_collectives(comm, p);
    check_send_recv_ring(comm, p);
    check_premulsum(comm, p);
    check_errors(comm, p);
    check_nonblocking_init(comm, p);
    check_split_and_shrink(comm, p);
    NCCLOK(ncclCommDestroy(comm));
    CHECK(ncclCommDestroy(comm) == ncclInvalidArgument, "destroying twice");
    if (failures == 0 && rank_ == 0)
        printf("all NCCL API checks passed on %d ranks\n", p);
    return failures ? 1 : 0;
}
