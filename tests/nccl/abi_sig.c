/* Every function of NCCL 2.28.9, nccl* and pnccl*, assigned to a pointer
 * whose type is spelled out here from NVIDIA's 2.28.9 signatures.  Built
 * once per header (-DABI_SIDE=nv / -DABI_SIDE=own) with
 * -Werror=incompatible-pointer-types, so a header whose signature differs
 * fails to compile; linking the test then needs every symbol.  The file is
 * also valid C++, where function pointer types must match exactly (C lets
 * an enum stand for its underlying integer type). */
#include "nccl.h"

#include "abi.h"

#if ABI_SIDE_ID == 1
#ifdef WEFT_NCCL_COMPAT
#error "ABI_SIDE=nv picked up weft's nccl.h; put NVIDIA's include dir first"
#endif
#define ABI_SIG abi_sig_nv
#elif ABI_SIDE_ID == 2
#ifndef WEFT_NCCL_COMPAT
#error "ABI_SIDE=own picked up NVIDIA's nccl.h; add -I compat/nccl first"
#endif
#define ABI_SIG abi_sig_own
#else
#error "compile with -DABI_SIDE=nv or -DABI_SIDE=own"
#endif

typedef void (*abi_fn)(void);

/* Written through volatile so the compiler keeps every address (and so the
 * link needs every symbol) instead of folding "&f != NULL" to true. */
#define KEPT_MAX 128
static abi_fn volatile kept[KEPT_MAX];

/* Takes nccl<name> and pnccl<name> through a pointer of type
 * ret (*) params. */
#define SIG(ret, name, params)                                               \
    do {                                                                     \
        ret(*nccl_fn) params = nccl##name;                                   \
        ret(*pnccl_fn) params = pnccl##name;                                 \
        if (n + 2 <= KEPT_MAX) {                                             \
            kept[n++] = (abi_fn)nccl_fn;                                     \
            kept[n++] = (abi_fn)pnccl_fn;                                    \
        }                                                                    \
    } while (0)

int ABI_SIG(void)
{
    int n = 0;

    SIG(ncclResult_t, MemAlloc, (void **, size_t));
    SIG(ncclResult_t, MemFree, (void *));
    SIG(ncclResult_t, GetVersion, (int *));
    SIG(ncclResult_t, GetUniqueId, (ncclUniqueId *));
    SIG(ncclResult_t, CommInitRankConfig,
        (ncclComm_t *, int, ncclUniqueId, int, ncclConfig_t *));
    SIG(ncclResult_t, CommInitRank, (ncclComm_t *, int, ncclUniqueId, int));
    SIG(ncclResult_t, CommInitAll, (ncclComm_t *, int, const int *));
    SIG(ncclResult_t, CommFinalize, (ncclComm_t));
    SIG(ncclResult_t, CommDestroy, (ncclComm_t));
    SIG(ncclResult_t, CommAbort, (ncclComm_t));
    SIG(ncclResult_t, CommRevoke, (ncclComm_t, int));
    SIG(ncclResult_t, CommSplit,
        (ncclComm_t, int, int, ncclComm_t *, ncclConfig_t *));
    SIG(ncclResult_t, CommShrink,
        (ncclComm_t, int *, int, ncclComm_t *, ncclConfig_t *, int));
    SIG(ncclResult_t, CommInitRankScalable,
        (ncclComm_t *, int, int, int, ncclUniqueId *, ncclConfig_t *));
    SIG(const char *, GetErrorString, (ncclResult_t));
    SIG(const char *, GetLastError, (ncclComm_t));
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
    SIG(void, ResetDebugInit, (void));
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
    SIG(ncclResult_t, CommGetAsyncError, (ncclComm_t, ncclResult_t *));
    SIG(ncclResult_t, CommCount, (const ncclComm_t, int *));
    SIG(ncclResult_t, CommCuDevice, (const ncclComm_t, int *));
    SIG(ncclResult_t, CommUserRank, (const ncclComm_t, int *));
    SIG(ncclResult_t, CommRegister,
        (const ncclComm_t, void *, size_t, void **));
    SIG(ncclResult_t, CommDeregister, (const ncclComm_t, void *));
    SIG(ncclResult_t, CommWindowRegister,
        (ncclComm_t, void *, size_t, ncclWindow_t *, int));
    SIG(ncclResult_t, CommWindowDeregister, (ncclComm_t, ncclWindow_t));
    SIG(ncclResult_t, RedOpCreatePreMulSum,
        (ncclRedOp_t *, void *, ncclDataType_t, ncclScalarResidence_t,
         ncclComm_t));
    SIG(ncclResult_t, RedOpDestroy, (ncclRedOp_t, ncclComm_t));
    SIG(ncclResult_t, Reduce,
        (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int,
         ncclComm_t, cudaStream_t));
    SIG(ncclResult_t, Bcast,
        (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
    SIG(ncclResult_t, Broadcast,
        (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
         cudaStream_t));
    SIG(ncclResult_t, AllReduce,
        (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
         ncclComm_t, cudaStream_t));
    SIG(ncclResult_t, ReduceScatter,
        (const void *, void *, size_t, ncclDataType_t, ncclRedOp_t,
         ncclComm_t, cudaStream_t));
    SIG(ncclResult_t, AllGather,
        (const void *, void *, size_t, ncclDataType_t, ncclComm_t,
         cudaStream_t));
    SIG(ncclResult_t, AlltoAll,
        (const void *, void *, size_t, ncclDataType_t, ncclComm_t,
         cudaStream_t));
    SIG(ncclResult_t, Gather,
        (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
         cudaStream_t));
    SIG(ncclResult_t, Scatter,
        (const void *, void *, size_t, ncclDataType_t, int, ncclComm_t,
         cudaStream_t));
    SIG(ncclResult_t, Send,
        (const void *, size_t, ncclDataType_t, int, ncclComm_t,
         cudaStream_t));
    SIG(ncclResult_t, Recv,
        (void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t));
    SIG(ncclResult_t, GroupStart, (void));
    SIG(ncclResult_t, GroupEnd, (void));
    SIG(ncclResult_t, GroupSimulateEnd, (ncclSimInfo_t *));

    /* Count what came out non-NULL (an unresolved weak symbol would not). */
    int found = 0;
    for (int i = 0; i < n; i++)
        found += kept[i] != NULL;
    return found;
}
