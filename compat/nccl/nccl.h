/* weft's NCCL-compatible API header.
 *
 * Programs written for NVIDIA NCCL 2.28.9 build against this header unchanged
 * and link against weft's NCCL compatibility library.  Every name, enum value, struct layout
 * and signature matches NCCL 2.28.9; tests/nccl/test_nccl_abi.c compares them
 * against NVIDIA's own header.  The guard is NCCL_H_, NVIDIA's, so including
 * this file and NVIDIA's in one program is a no-op the second time.
 *
 * How weft runs these calls today:
 *   - Buffers are host memory for now.  With stream == NULL a collective or
 *     send/recv has completed when the call returns, or, inside
 *     ncclGroupStart/ncclGroupEnd, when ncclGroupEnd returns.
 *   - A non-NULL stream returns ncclInvalidUsage until weft's CUDA support
 *     lands.
 *   - A call weft does not support returns ncclInvalidUsage, and
 *     ncclGetLastError says which call and why.
 */
#ifndef NCCL_H_
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

/* cudaStream_t comes from CUDA when its headers are on the include path.
 * Otherwise it is declared exactly as CUDA's driver_types.h declares it, so a
 * later #include <cuda_runtime.h> repeats an identical typedef, which both C11
 * and C++ accept. */
#if defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#define WEFT_NCCL_HAVE_CUDA_RUNTIME_ 1
#endif
#endif
#ifndef WEFT_NCCL_HAVE_CUDA_RUNTIME_
typedef struct CUstream_st *cudaStream_t;
#endif
#undef WEFT_NCCL_HAVE_CUDA_RUNTIME_

/* Defined only by weft's header: lets code (and our ABI test) tell it apart
 * from NVIDIA's. */
#define WEFT_NCCL_COMPAT 1

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 9
#define NCCL_SUFFIX ""

/* Versions up to 2.8 used two decimal digits for minor+patch (2.8.4 = 2804);
 * from 2.9 on the minor gets two digits of its own (2.28.9 = 22809). */
#define NCCL_VERSION_CODE 22809
#define NCCL_VERSION(X, Y, Z)                                                \
    (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z)                   \
                            : (X) * 10000 + (Y) * 100 + (Z))

#ifdef __cplusplus
extern "C" {
#endif

/* Handles.  Both structs stay incomplete: the library owns them. */
typedef struct ncclComm *ncclComm_t;
typedef struct ncclWindow_vidmem *ncclWindow_t;
#define NCCL_COMM_NULL NULL

/* Opaque bytes from ncclGetUniqueId, copied unchanged to every rank. */
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

/* "Not set" markers: a config field holding one keeps the library default. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_SPLIT_NOCOLOR -1
#define NCCL_UNDEF_FLOAT -1.0f

/* winFlags of ncclCommWindowRegister. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096 /* bytes */

/* Values of ncclConfig_t.CTAPolicy. */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/* shrinkFlags of ncclCommShrink: DEFAULT shrinks a healthy parent; ABORT
 * first stops whatever the parent still has in flight. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/* revokeFlags of ncclCommRevoke; no other value is accepted. */
#define NCCL_REVOKE_DEFAULT 0x00

/* Options for ncclCommInitRankConfig, ncclCommSplit, ncclCommShrink and
 * ncclCommInitRankScalable.  Always start from NCCL_CONFIG_INITIALIZER: size,
 * magic and version tell the library which layout the caller was built with,
 * and every other field starts "not set".  The field order is ABI; new NCCL
 * versions only append. */
typedef struct ncclConfig_v22800 {
    size_t size;          /* sizeof(ncclConfig_t) at build time */
    unsigned int magic;   /* 0xcafebeef */
    unsigned int version; /* NCCL_VERSION_CODE at build time */
    int blocking;         /* 0: calls may return ncclInProgress */
    int cgaClusterSize;
    int minCTAs;
    int maxCTAs;
    const char *netName;
    int splitShare;
    int trafficClass;
    const char *commName;
    int collnetEnable;
    int CTAPolicy; /* NCCL_CTA_POLICY_* */
    int shrinkShare;
    int nvlsCTAs;
    int nChannelsPerNetPeer;
    int nvlinkCentricSched;
} ncclConfig_t;

#define NCCL_CONFIG_INITIALIZER                                              \
    {                                                                        \
        sizeof(ncclConfig_t), 0xcafebeef,                                    \
            NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),                \
            NCCL_CONFIG_UNDEF_INT, /* blocking */                            \
            NCCL_CONFIG_UNDEF_INT, /* cgaClusterSize */                      \
            NCCL_CONFIG_UNDEF_INT, /* minCTAs */                             \
            NCCL_CONFIG_UNDEF_INT, /* maxCTAs */                             \
            NCCL_CONFIG_UNDEF_PTR, /* netName */                             \
            NCCL_CONFIG_UNDEF_INT, /* splitShare */                          \
            NCCL_CONFIG_UNDEF_INT, /* trafficClass */                        \
            NCCL_CONFIG_UNDEF_PTR, /* commName */                            \
            NCCL_CONFIG_UNDEF_INT, /* collnetEnable */                       \
            NCCL_CONFIG_UNDEF_INT, /* CTAPolicy */                           \
            NCCL_CONFIG_UNDEF_INT, /* shrinkShare */                         \
            NCCL_CONFIG_UNDEF_INT, /* nvlsCTAs */                            \
            NCCL_CONFIG_UNDEF_INT, /* nChannelsPerNetPeer */                 \
            NCCL_CONFIG_UNDEF_INT, /* nvlinkCentricSched */                  \
    }

/* Filled in by ncclGroupSimulateEnd.  Start from NCCL_SIM_INFO_INITIALIZER
 * for the same reason as ncclConfig_t. */
typedef struct ncclSimInfo_v22200 {
    size_t size;
    unsigned int magic; /* 0x74685283 */
    unsigned int version;
    float estimatedTime; /* microseconds; NCCL_UNDEF_FLOAT until filled */
} ncclSimInfo_t;

#define NCCL_SIM_INFO_INITIALIZER                                            \
    {                                                                        \
        sizeof(ncclSimInfo_t), 0x74685283,                                   \
            NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH),                \
            NCCL_UNDEF_FLOAT                                                 \
    }

/* Every function exists twice: ncclX and pncclX (the profiling entry point,
 * as in MPI's PMPI).  Both do the same thing. */

/* Memory suited to the library's transports; free it with ncclMemFree. */
ncclResult_t ncclMemAlloc(void **ptr, size_t size);
ncclResult_t pncclMemAlloc(void **ptr, size_t size);
ncclResult_t ncclMemFree(void *ptr);
ncclResult_t pncclMemFree(void *ptr);

/* Stores the library's NCCL_VERSION_CODE (which may differ from the header's
 * when an application runs against a newer library). */
ncclResult_t ncclGetVersion(int *version);
ncclResult_t pncclGetVersion(int *version);

/* Made once, by one rank; every rank then passes the same bytes to init. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId *uniqueId);

/* Communicator creation.  Each rank calls init with the same nranks and id
 * and its own rank in [0, nranks); the call waits for the others, so a
 * thread that creates several ranks must do so inside a group.  config may be
 * NULL for defaults. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                    ncclUniqueId commId, int rank,
                                    ncclConfig_t *config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks,
                                     ncclUniqueId commId, int rank,
                                     ncclConfig_t *config);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks,
                              ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks,
                               ncclUniqueId commId, int rank);
/* All ndev ranks in this process at once; comm has room for ndev handles. */
ncclResult_t ncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
ncclResult_t pncclCommInitAll(ncclComm_t *comm, int ndev, const int *devlist);
/* commIds holds nId ids, identical (and in the same order) on every rank. */
ncclResult_t ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks,
                                      int myrank, int nId,
                                      ncclUniqueId *commIds,
                                      ncclConfig_t *config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t *newcomm, int nranks,
                                       int myrank, int nId,
                                       ncclUniqueId *commIds,
                                       ncclConfig_t *config);

/* Teardown.  Finalize lets issued work finish (collectively); Destroy then
 * frees the local handle; Abort stops everything and frees at once.
 * Revoke (stop in-flight work, then split, shrink or destroy) is not
 * supported by weft yet: it returns ncclInvalidUsage. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/* New communicators from an existing one.  Split: ranks with equal color
 * form one communicator, ordered by key; NCCL_SPLIT_NOCOLOR yields
 * *newcomm == NULL.  Shrink: drops the listed ranks, renumbering the rest in
 * order; shrinkFlags is an NCCL_SHRINK_* value.  config == NULL inherits the
 * parent's configuration. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key,
                           ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key,
                            ncclComm_t *newcomm, ncclConfig_t *config);
ncclResult_t ncclCommShrink(ncclComm_t comm, int *excludeRanksList,
                            int excludeRanksCount, ncclComm_t *newcomm,
                            ncclConfig_t *config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int *excludeRanksList,
                             int excludeRanksCount, ncclComm_t *newcomm,
                             ncclConfig_t *config, int shrinkFlags);

/* Errors.  The strings are static; ncclGetLastError's text describes the
 * most recent failure (comm may be NULL). */
const char *ncclGetErrorString(ncclResult_t result);
const char *pncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
const char *pncclGetLastError(ncclComm_t comm);

/* Kept for binary compatibility only: NCCL marks it deprecated and outside
 * its API.  The empty parameter list is NCCL's; C++ reads it as (void). */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((deprecated("ncclResetDebugInit is outside the NCCL API")))
#endif
void ncclResetDebugInit();
#if defined(__GNUC__) || defined(__clang__)
__attribute__((deprecated("pncclResetDebugInit is outside the NCCL API")))
#endif
void pncclResetDebugInit();

/* Queries.  GetAsyncError reports an error raised in the background, or
 * ncclInProgress while a non-blocking operation is still running. */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int *device);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int *rank);

/* Buffer registration (a hint for zero-copy transfers) and memory windows. */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                              void **handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size,
                               void **handle);
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle);
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                    ncclWindow_t *win, int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size,
                                     ncclWindow_t *win, int winFlags);
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* Only its size matters: ncclMaxRedOp is derived from it so that
 * ncclRedOp_t keeps the size it had in earlier NCCL releases. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;

/* Built-in operators are 0..ncclNumOps-1; operators made by
 * ncclRedOpCreatePreMulSum take values from ncclNumOps up to ncclMaxRedOp. */
typedef enum {
    ncclSum = 0,
    ncclProd = 1,
    ncclMax = 2,
    ncclMin = 3,
    ncclAvg = 4,
    ncclNumOps = 5,
    ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/* The second name on a line is an older alias of the same value. */
typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9,
    ncclFloat8e4m3 = 10,
    ncclFloat8e5m2 = 11,
    ncclNumTypes = 12
} ncclDataType_t;

/* Where ncclRedOpCreatePreMulSum's scalar lives: Device is read while each
 * collective runs; HostImmediate is read once, before the call returns. */
typedef enum {
    ncclScalarDevice = 0,
    ncclScalarHostImmediate = 1
} ncclScalarResidence_t;

/* An operator that multiplies each input by *scalar, then sums.  Valid only
 * on comm and with datatype; destroy it with ncclRedOpDestroy once the last
 * call using it has returned. */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                      ncclDataType_t datatype,
                                      ncclScalarResidence_t residence,
                                      ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar,
                                       ncclDataType_t datatype,
                                       ncclScalarResidence_t residence,
                                       ncclComm_t comm);
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* Collectives.  Every rank of comm calls each one, in the same order, with
 * matching count, datatype, op and root.  Counts are elements, not bytes.
 * sendbuff == recvbuff runs in place; for ReduceScatter, AllGather, Gather
 * and Scatter "in place" means the rank's own block of the larger buffer.
 * In weft, stream must be NULL and buffers are host memory (see the top of
 * this file). */

/* recvbuff matters only on root. */
ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root,
                         ncclComm_t comm, cudaStream_t stream);
/* Older in-place form of ncclBroadcast. */
ncclResult_t ncclBcast(void *buff, size_t count, ncclDataType_t datatype,
                       int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff,
                            size_t count, ncclDataType_t datatype, int root,
                            ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff,
                            size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream);
/* sendbuff holds nranks * recvcount elements; rank r keeps block r. */
ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff,
                               size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff,
                                size_t recvcount, ncclDataType_t datatype,
                                ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);
/* recvbuff holds nranks * sendcount elements; block r comes from rank r. */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff,
                           size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff,
                            size_t sendcount, ncclDataType_t datatype,
                            ncclComm_t comm, cudaStream_t stream);
/* Block j of sendbuff (count elements) goes to rank j; block i of recvbuff
 * comes from rank i. */
ncclResult_t ncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, ncclComm_t comm,
                          cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm,
                           cudaStream_t stream);
/* recvbuff (nranks * count elements) is used only on root. */
ncclResult_t ncclGather(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);
ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
/* sendbuff (nranks * count elements) is used only on root. */
ncclResult_t ncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm,
                         cudaStream_t stream);
ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream);

/* Point to point.  The peer posts the matching call with the same count and
 * datatype.  Several sends/receives that depend on each other must sit in
 * one group, or they can wait on each other forever. */
ncclResult_t ncclSend(const void *sendbuff, size_t count,
                      ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclSend(const void *sendbuff, size_t count,
                       ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
                      int peer, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype,
                       int peer, ncclComm_t comm, cudaStream_t stream);

/* Groups (per thread, nestable): calls between ncclGroupStart and the
 * outermost ncclGroupEnd are only queued, then run together.  This is how
 * one thread drives several ranks, or posts sends and receives that must
 * progress together.  In weft, queued host operations have completed when
 * ncclGroupEnd returns.  weft does not support GroupSimulateEnd: it
 * returns ncclInvalidUsage and the group stays open.  The empty parameter lists
 * are NCCL's; C++ reads them as (void). */
ncclResult_t ncclGroupStart();
ncclResult_t pncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t pncclGroupEnd();
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t *simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *simInfo);

#ifdef __cplusplus
}
#endif

#endif /* NCCL_H_ */
