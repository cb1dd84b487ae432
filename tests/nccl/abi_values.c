/* The numbers that make up nccl.h's ABI: enum values, macro values and
 * types, sizes, alignments, field offsets/sizes/types and what the
 * initializer macros put in each field.  Compiled once per header
 * (-DABI_SIDE=nv with NVIDIA's include dir, -DABI_SIDE=own with
 * compat/nccl); test_nccl_abi.c requires the two tables to be equal. */
#include "nccl.h"

#include <stdalign.h>
#include <string.h>

#include "abi.h"

#if ABI_SIDE_ID == 1
#ifdef WEFT_NCCL_COMPAT
#error "ABI_SIDE=nv picked up weft's nccl.h; put NVIDIA's include dir first"
#endif
#define ABI_VALUES abi_values_nv
#elif ABI_SIDE_ID == 2
#ifndef WEFT_NCCL_COMPAT
#error "ABI_SIDE=own picked up NVIDIA's nccl.h; add -I compat/nccl first"
#endif
#define ABI_VALUES abi_values_own
#else
#error "compile with -DABI_SIDE=nv or -DABI_SIDE=own"
#endif

/* A number per type, so that a field or macro whose type changed (int to
 * unsigned, char * to const char *, ...) shows up as a different value.
 * Enum-typed expressions land on their compatible integer type. */
#define TYPE_CODE(x)                                                         \
    _Generic((x),                                                            \
        char: 1,                                                             \
        signed char: 2,                                                      \
        unsigned char: 3,                                                    \
        short: 4,                                                            \
        unsigned short: 5,                                                   \
        int: 6,                                                              \
        unsigned int: 7,                                                     \
        long: 8,                                                             \
        unsigned long: 9,                                                    \
        long long: 10,                                                       \
        unsigned long long: 11,                                              \
        float: 12,                                                           \
        double: 13,                                                          \
        void *: 20,                                                          \
        const void *: 21,                                                    \
        char *: 22,                                                          \
        const char *: 23,                                                    \
        struct ncclComm *: 30,                                               \
        struct ncclWindow_vidmem *: 31,                                      \
        struct CUstream_st *: 32,                                            \
        default: 0)

#define VAL(x) { #x, (long long)(x) }
#define PTR(x) { #x " != NULL", (x) != NULL }
#define FLT(x) { #x " * 1000", (long long)((x) * 1000.0f) }
#define TYPE(x) { "type of " #x, TYPE_CODE(x) }
/* Size, alignment, and what -1 converts to (tells signed from unsigned). */
#define INTTYPE(t)                                                           \
    VAL(sizeof(t)), VAL(alignof(t)), { "(" #t ")-1", (long long)(t)-1 }
#define OBJTYPE(t) VAL(sizeof(t)), VAL(alignof(t))
/* Where a field sits, how big it is and what type it has. */
#define FIELD(t, f)                                                          \
    VAL(offsetof(t, f)), VAL(sizeof(((t *)0)->f)), TYPE(((t *)0)->f)

size_t ABI_VALUES(struct abi_entry *out, size_t cap)
{
    const ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    const ncclSimInfo_t sim = NCCL_SIM_INFO_INITIALIZER;
    const ncclUniqueId id = {{0}};
    /* Built here rather than at file scope: cfg.* and sim.* are not
     * constant expressions in C. */
    const struct abi_entry table[] = {
        /* ncclResult_t */
        VAL(ncclSuccess), VAL(ncclUnhandledCudaError), VAL(ncclSystemError),
        VAL(ncclInternalError), VAL(ncclInvalidArgument),
        VAL(ncclInvalidUsage), VAL(ncclRemoteError), VAL(ncclInProgress),
        VAL(ncclNumResults),
        /* ncclRedOp_dummy_t, ncclRedOp_t */
        VAL(ncclNumOps_dummy),
        VAL(ncclSum), VAL(ncclProd), VAL(ncclMax), VAL(ncclMin), VAL(ncclAvg),
        VAL(ncclNumOps), VAL(ncclMaxRedOp),
        /* ncclDataType_t, aliases included */
        VAL(ncclInt8), VAL(ncclChar), VAL(ncclUint8), VAL(ncclInt32),
        VAL(ncclInt), VAL(ncclUint32), VAL(ncclInt64), VAL(ncclUint64),
        VAL(ncclFloat16), VAL(ncclHalf), VAL(ncclFloat32), VAL(ncclFloat),
        VAL(ncclFloat64), VAL(ncclDouble), VAL(ncclBfloat16),
        VAL(ncclFloat8e4m3), VAL(ncclFloat8e5m2), VAL(ncclNumTypes),
        /* ncclScalarResidence_t */
        VAL(ncclScalarDevice), VAL(ncclScalarHostImmediate),

        /* Version macros; NCCL_VERSION at both sides of its 2.8/2.9 switch. */
        VAL(NCCL_MAJOR), VAL(NCCL_MINOR), VAL(NCCL_PATCH),
        VAL(sizeof(NCCL_SUFFIX)), VAL(NCCL_VERSION_CODE),
        TYPE(NCCL_VERSION_CODE),
        VAL(NCCL_VERSION(2, 28, 9)), VAL(NCCL_VERSION(2, 8, 4)),
        VAL(NCCL_VERSION(2, 9, 0)), VAL(NCCL_VERSION(1, 12, 3)),
        VAL(NCCL_VERSION(3, 0, 1)), TYPE(NCCL_VERSION(2, 28, 9)),

        /* Other numeric macros, with their types. */
        PTR(NCCL_COMM_NULL),
        VAL(NCCL_UNIQUE_ID_BYTES), TYPE(NCCL_UNIQUE_ID_BYTES),
        VAL(NCCL_CONFIG_UNDEF_INT), TYPE(NCCL_CONFIG_UNDEF_INT),
        PTR(NCCL_CONFIG_UNDEF_PTR),
        VAL(NCCL_SPLIT_NOCOLOR), TYPE(NCCL_SPLIT_NOCOLOR),
        FLT(NCCL_UNDEF_FLOAT), TYPE(NCCL_UNDEF_FLOAT),
        VAL(NCCL_WIN_DEFAULT), VAL(NCCL_WIN_COLL_SYMMETRIC),
        VAL(NCCL_WIN_REQUIRED_ALIGNMENT),
        VAL(NCCL_CTA_POLICY_DEFAULT), VAL(NCCL_CTA_POLICY_EFFICIENCY),
        VAL(NCCL_CTA_POLICY_ZERO),
        VAL(NCCL_SHRINK_DEFAULT), VAL(NCCL_SHRINK_ABORT),
        VAL(NCCL_REVOKE_DEFAULT),

        /* Sizes and alignments; struct tags must exist. */
        OBJTYPE(ncclUniqueId), OBJTYPE(ncclConfig_t),
        OBJTYPE(struct ncclConfig_v22800), OBJTYPE(ncclSimInfo_t),
        OBJTYPE(struct ncclSimInfo_v22200),
        INTTYPE(ncclResult_t), INTTYPE(ncclRedOp_dummy_t),
        INTTYPE(ncclRedOp_t), INTTYPE(ncclDataType_t),
        INTTYPE(ncclScalarResidence_t),
        OBJTYPE(ncclComm_t), TYPE((ncclComm_t)0),
        OBJTYPE(ncclWindow_t), TYPE((ncclWindow_t)0),
        OBJTYPE(cudaStream_t), TYPE((cudaStream_t)0),

        /* Layouts. */
        FIELD(ncclUniqueId, internal), TYPE(id.internal[0]),
        FIELD(ncclConfig_t, size), FIELD(ncclConfig_t, magic),
        FIELD(ncclConfig_t, version), FIELD(ncclConfig_t, blocking),
        FIELD(ncclConfig_t, cgaClusterSize), FIELD(ncclConfig_t, minCTAs),
        FIELD(ncclConfig_t, maxCTAs), FIELD(ncclConfig_t, netName),
        FIELD(ncclConfig_t, splitShare), FIELD(ncclConfig_t, trafficClass),
        FIELD(ncclConfig_t, commName), FIELD(ncclConfig_t, collnetEnable),
        FIELD(ncclConfig_t, CTAPolicy), FIELD(ncclConfig_t, shrinkShare),
        FIELD(ncclConfig_t, nvlsCTAs),
        FIELD(ncclConfig_t, nChannelsPerNetPeer),
        FIELD(ncclConfig_t, nvlinkCentricSched),
        FIELD(ncclSimInfo_t, size), FIELD(ncclSimInfo_t, magic),
        FIELD(ncclSimInfo_t, version), FIELD(ncclSimInfo_t, estimatedTime),

        /* What the initializers store. */
        VAL(cfg.size), VAL(cfg.magic), VAL(cfg.version), VAL(cfg.blocking),
        VAL(cfg.cgaClusterSize), VAL(cfg.minCTAs), VAL(cfg.maxCTAs),
        PTR(cfg.netName), VAL(cfg.splitShare), VAL(cfg.trafficClass),
        PTR(cfg.commName), VAL(cfg.collnetEnable), VAL(cfg.CTAPolicy),
        VAL(cfg.shrinkShare), VAL(cfg.nvlsCTAs), VAL(cfg.nChannelsPerNetPeer),
        VAL(cfg.nvlinkCentricSched),
        VAL(sim.size), VAL(sim.magic), VAL(sim.version),
        FLT(sim.estimatedTime),
    };
    size_t n = sizeof(table) / sizeof(table[0]);

    if (out != NULL && cap > 0)
        memcpy(out, table, (n < cap ? n : cap) * sizeof(table[0]));
    return n;
}
