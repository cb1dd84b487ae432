/*
 * nccl_stream.cu - NCCL's stream semantics on weft, on a real GPU: a kernel
 * fills device buffers, an NCCL call on the same stream reduces them, and
 * a kernel after it checks the result, with no synchronisation between
 * the three; only then is the stream synchronised and the checks read.
 * Built by tools/gpu-check.sh with nvcc (against NVIDIA's nccl.h, or
 * weft's), linked against libweft_nccl; not part of make check.
 *
 *   weftrun -n 2 ./nccl_stream        one process per rank, device =
 *                                     local rank % devices; the id comes
 *                                     from ncclGetUniqueId (weftrun's job id)
 *
 * Each case prints "PASS name" or "FAIL name: why" on rank 0 (after an
 * agreement over the ranks), and the exit status is 1 when any failed.
 *
 * The fill kernel spins before it writes, so a collective that started
 * before the work queued ahead of it on the stream would read the stale
 * values (set beforehand with a synchronous memset) and fail the check;
 * the check kernel reads the output poisoned beforehand, so a collective
 * that let the stream go on before its result was in place fails too.
 */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl.h"

static int rank_ = -1, nranks_ = 0, failures;

#define CUDAOK(call)                                                                          \
    do {                                                                                      \
        cudaError_t e_ = (call);                                                              \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "rank %d: %s:%d: %s: %s\n", rank_, __FILE__, __LINE__, #call,     \
                    cudaGetErrorString(e_));                                                  \
            printf("FAIL setup: %s failed on rank %d: %s\n", #call, rank_,                   \
                   cudaGetErrorString(e_));                                                   \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

#define NCCLOK(call)                                                                          \
    do {                                                                                      \
        ncclResult_t r_ = (call);                                                             \
        if (r_ != ncclSuccess) {                                                              \
            fprintf(stderr, "rank %d: %s:%d: %s: %s (%s)\n", rank_, __FILE__, __LINE__,       \
                    #call, ncclGetErrorString(r_), ncclGetLastError(NULL));                   \
            printf("FAIL %s on rank %d: %s\n", #call, rank_, ncclGetErrorString(r_));         \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* Spins for about `cycles` clock ticks, then writes element i of rank r's
 * input: (r + 1) * (i % 7 + 1), exact in float and int. */
template <typename T>
__global__ void fill_slow(T *buf, size_t count, int r, long long cycles)
{
    long long t0 = clock64();
    while (clock64() - t0 < cycles)
        ;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        buf[i] = (T)((r + 1) * (int)(i % 7 + 1));
}

/* Counts the elements that are not scale * (i % 7 + 1) into *wrong. */
template <typename T>
__global__ void check_kernel(const T *buf, size_t count, long long scale, unsigned long long *wrong)
{
    unsigned long long bad = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        if (buf[i] != (T)(scale * (long long)(i % 7 + 1)))
            bad++;
    if (bad)
        atomicAdd(wrong, bad);
}

/* A clock64() budget of about 20 ms at 1.5 GHz: long enough that an
 * unordered collective would run ahead of the fill. */
static const long long SPIN = 30LL * 1000 * 1000;
static const int GRID = 256, BLOCK = 256;

/* One reduction: device buffers, the sum of (r + 1) over ranks. */
template <typename T>
struct job {
    T *send, *recv;
    unsigned long long *wrong; /* device counter */
    size_t count;
};

template <typename T>
static void job_init(job<T> *j, size_t count)
{
    j->count = count;
    CUDAOK(cudaMalloc(&j->send, count * sizeof(T)));
    CUDAOK(cudaMalloc(&j->recv, count * sizeof(T)));
    CUDAOK(cudaMalloc(&j->wrong, sizeof(*j->wrong)));
    /* Stale input and a poisoned output, in place before anything is queued. */
    CUDAOK(cudaMemset(j->send, 0x7f, count * sizeof(T)));
    CUDAOK(cudaMemset(j->recv, 0xa5, count * sizeof(T)));
    CUDAOK(cudaMemset(j->wrong, 0, sizeof(*j->wrong)));
    CUDAOK(cudaDeviceSynchronize());
}

template <typename T>
static void job_free(job<T> *j)
{
    CUDAOK(cudaFree(j->send));
    CUDAOK(cudaFree(j->recv));
    CUDAOK(cudaFree(j->wrong));
}

/* Wrong elements found by the check kernel, plus those the host finds in
 * the result copied back (the two must agree on 0). */
template <typename T>
static unsigned long long job_wrong(const job<T> *j, long long scale)
{
    unsigned long long dev = 0, host = 0;
    CUDAOK(cudaMemcpy(&dev, j->wrong, sizeof(dev), cudaMemcpyDeviceToHost));
    T *h = (T *)malloc(j->count * sizeof(T));
    if (h == NULL) {
        printf("FAIL setup: out of host memory on rank %d\n", rank_);
        exit(1);
    }
    CUDAOK(cudaMemcpy(h, j->recv, j->count * sizeof(T), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < j->count; i++)
        if (h[i] != (T)(scale * (long long)(i % 7 + 1)))
            host++;
    free(h);
    return dev + host;
}

/* Every rank's verdict to rank 0, which prints one line. */
static void report(ncclComm_t comm, cudaStream_t s, const char *name, unsigned long long wrong)
{
    unsigned long long *d;
    unsigned long long total = 0;
    if (wrong)
        fprintf(stderr, "rank %d: %s: %llu wrong elements here\n", rank_, name, wrong);
    CUDAOK(cudaMalloc(&d, sizeof(*d)));
    CUDAOK(cudaMemcpy(d, &wrong, sizeof(wrong), cudaMemcpyHostToDevice));
    NCCLOK(ncclAllReduce(d, d, 1, ncclUint64, ncclSum, comm, s));
    CUDAOK(cudaStreamSynchronize(s));
    CUDAOK(cudaMemcpy(&total, d, sizeof(total), cudaMemcpyDeviceToHost));
    CUDAOK(cudaFree(d));
    if (total)
        failures++;
    if (rank_ == 0) {
        if (total)
            printf("FAIL %s: %llu wrong elements over %d ranks\n", name, total, nranks_);
        else
            printf("PASS %s\n", name);
        fflush(stdout);
    }
}

/* fill -> AllReduce -> check on one stream, no host wait between. */
template <typename T>
static void enqueue_allreduce(job<T> *j, ncclDataType_t dt, ncclComm_t comm, cudaStream_t s)
{
    fill_slow<T><<<GRID, BLOCK, 0, s>>>(j->send, j->count, rank_, SPIN);
    CUDAOK(cudaGetLastError());
    NCCLOK(ncclAllReduce(j->send, j->recv, j->count, dt, ncclSum, comm, s));
    long long sum = (long long)nranks_ * (nranks_ + 1) / 2;
    check_kernel<T><<<GRID, BLOCK, 0, s>>>(j->recv, j->count, sum, j->wrong);
    CUDAOK(cudaGetLastError());
}

static void case_one_stream(ncclComm_t comm, cudaStream_t s)
{
    static const size_t counts[] = {1, 1000003, 16u << 20}; /* 16M floats: 64 MiB */
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        job<float> f;
        job<int> i;
        job_init(&f, counts[k]);
        job_init(&i, counts[k]);
        enqueue_allreduce(&f, ncclFloat32, comm, s);
        enqueue_allreduce(&i, ncclInt32, comm, s);
        CUDAOK(cudaStreamSynchronize(s));
        long long scale = (long long)nranks_ * (nranks_ + 1) / 2;
        char name[128];
        snprintf(name, sizeof(name), "fill kernel -> ncclAllReduce -> check kernel, one stream, "
                 "float+int32, count %zu", counts[k]);
        report(comm, s, name, job_wrong(&f, scale) + job_wrong(&i, scale));
        job_free(&f);
        job_free(&i);
    }
}

/* Two communicators on two streams, their work interleaved. */
static void case_two_comms(ncclComm_t c1, cudaStream_t s1, ncclComm_t c2, cudaStream_t s2)
{
    job<float> a, b;
    job_init(&a, 4u << 20);
    job_init(&b, 3u << 20);
    enqueue_allreduce(&a, ncclFloat32, c1, s1);
    enqueue_allreduce(&b, ncclFloat32, c2, s2);
    CUDAOK(cudaStreamSynchronize(s2));
    CUDAOK(cudaStreamSynchronize(s1));
    long long scale = (long long)nranks_ * (nranks_ + 1) / 2;
    report(c1, s1, "two communicators on two streams, interleaved", job_wrong(&a, scale) +
                                                                         job_wrong(&b, scale));
    job_free(&a);
    job_free(&b);
}

/* ncclGroupStart/End: an AllReduce, a Broadcast from rank 0 and a ring of
 * Send/Recv in one group on one stream, between a fill and the checks. */
static void case_group(ncclComm_t comm, cudaStream_t s)
{
    const size_t n = 1u << 20;
    job<float> ar, bc, sr;
    job_init(&ar, n);
    job_init(&bc, n);
    job_init(&sr, n);
    fill_slow<float><<<GRID, BLOCK, 0, s>>>(ar.send, n, rank_, SPIN);
    fill_slow<float><<<GRID, BLOCK, 0, s>>>(bc.send, n, rank_, 0);
    fill_slow<float><<<GRID, BLOCK, 0, s>>>(sr.send, n, rank_, 0);
    CUDAOK(cudaGetLastError());
    int next = (rank_ + 1) % nranks_, prev = (rank_ + nranks_ - 1) % nranks_;
    NCCLOK(ncclGroupStart());
    NCCLOK(ncclAllReduce(ar.send, ar.recv, n, ncclFloat32, ncclSum, comm, s));
    NCCLOK(ncclBroadcast(bc.send, bc.recv, n, ncclFloat32, 0, comm, s));
    NCCLOK(ncclSend(sr.send, n, ncclFloat32, next, comm, s));
    NCCLOK(ncclRecv(sr.recv, n, ncclFloat32, prev, comm, s));
    NCCLOK(ncclGroupEnd());
    long long sum = (long long)nranks_ * (nranks_ + 1) / 2;
    check_kernel<float><<<GRID, BLOCK, 0, s>>>(ar.recv, n, sum, ar.wrong);
    check_kernel<float><<<GRID, BLOCK, 0, s>>>(bc.recv, n, 1, bc.wrong);
    check_kernel<float><<<GRID, BLOCK, 0, s>>>(sr.recv, n, prev + 1, sr.wrong);
    CUDAOK(cudaGetLastError());
    CUDAOK(cudaStreamSynchronize(s));
    report(comm, s, "ncclGroupStart/End: AllReduce + Broadcast + Send/Recv ring, one stream",
           job_wrong(&ar, sum) + job_wrong(&bc, 1) + job_wrong(&sr, prev + 1));
    job_free(&ar);
    job_free(&bc);
    job_free(&sr);
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

int main(void)
{
    static const char *const rank_vars[] = {"WEFT_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID",
                                            NULL};
    static const char *const size_vars[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS",
                                            NULL};
    static const char *const local_vars[] = {"WEFT_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                             "SLURM_LOCALID", NULL};
    rank_ = env_int(rank_vars);
    nranks_ = env_int(size_vars);
    if (rank_ < 0 || nranks_ < 1) {
        fprintf(stderr, "no rank/size in the environment (run under weftrun or mpirun)\n");
        return 2;
    }
    int local = env_int(local_vars), ndev = 0;
    CUDAOK(cudaGetDeviceCount(&ndev));
    CUDAOK(cudaSetDevice((local < 0 ? rank_ : local) % ndev));

    ncclUniqueId id;
    NCCLOK(ncclGetUniqueId(&id));
    ncclComm_t comm, comm2;
    NCCLOK(ncclCommInitRank(&comm, nranks_, id, rank_));
    NCCLOK(ncclCommSplit(comm, 0, rank_, &comm2, NULL));
    cudaStream_t s1, s2;
    CUDAOK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CUDAOK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));

    case_one_stream(comm, s1);
    case_two_comms(comm, s1, comm2, s2);
    case_group(comm, s1);

    CUDAOK(cudaStreamDestroy(s2));
    CUDAOK(cudaStreamDestroy(s1));
    NCCLOK(ncclCommDestroy(comm2));
    NCCLOK(ncclCommDestroy(comm));
    if (rank_ == 0)
        printf("%s: %d case(s) failed\n", failures ? "FAIL nccl_stream" : "PASS nccl_stream",
               failures);
    return failures ? 1 : 0;
}
