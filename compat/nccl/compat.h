/*
 * compat.h - what the two halves of the NCCL layer share: the ncclComm
 * handle wrapped around a weft communicator, error recording and the
 * per-thread group state.
 */
#ifndef WEFT_COMPAT_NCCL_H
#define WEFT_COMPAT_NCCL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* The library is built with hidden visibility; everything nccl.h
 * declares (nccl* and pnccl*) is what it exports. */
#pragma GCC visibility push(default)
#include "nccl.h"
#pragma GCC visibility pop
#include "weft.h"

/* Every entry point is defined as pnccl<Name> (the profiling name) with
 * nccl<Name> a weak alias of it, so a tool can interpose nccl<Name> and
 * still call the real one. */
#define NCCL_ALIAS(name) extern __typeof__(p##name) name __attribute__((weak, alias("p" #name)))

#define COMPAT_MAX_REDOPS 64
#define COMPAT_ERR_LEN 512

/* A PreMulSum operator: sum after multiplying each input by *scalar. */
struct compat_redop {
    bool used;
    ncclDataType_t dtype;
    const void *ptr;        /* ncclScalarDevice: read at each call */
    unsigned char val[8];   /* ncclScalarHostImmediate: copied at creation */
    bool immediate;
};

/*
 * Owner: the application (ncclCommInit*, Split, Shrink create it;
 * ncclCommDestroy/Abort free it).  While an init runs in the background
 * (non-blocking config, or inside a group) `wc` is NULL and `state` is
 * ncclInProgress; the init thread sets both under `mu`.  When the handle
 * is destroyed while that thread runs, `abandoned` tells the thread to
 * free everything itself.
 */
struct ncclComm {
    uint32_t magic;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* signalled when the init thread ends */
    weft_comm_t wc;
    ncclResult_t state;          /* init result: ncclInProgress until known */
    bool blocking;
    bool finalized;
    bool abandoned;              /* guarded by mu */
    bool thread_running;         /* guarded by mu */
    _Atomic int users;           /* threads inside a call on it (see compat_release) */
    pthread_t thread;
    int rank, nranks, cudaDev;
    struct compat_redop ops[COMPAT_MAX_REDOPS];
    char name[64];               /* config->commName, for messages */
};

/* Records a message as this thread's (and comm's) last error; returns r. */
ncclResult_t compat_fail(struct ncclComm *c, ncclResult_t r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), visibility("hidden")));
/* Maps a weft status to NCCL's result, recording weft's message. */
ncclResult_t compat_status(struct ncclComm *c, const char *fn, weft_status_t st)
    __attribute__((visibility("hidden")));
/* The live handle behind comm, ready for operations and counted as in use
 * (so ncclCommAbort from another thread waits before freeing it), or NULL
 * with the error recorded in *r.  Every success is paired with
 * compat_release. */
struct ncclComm *compat_ready(ncclComm_t comm, const char *fn, ncclResult_t *r)
    __attribute__((visibility("hidden")));
/* The registry: true when comm is a live handle. */
bool compat_valid(const struct ncclComm *c) __attribute__((visibility("hidden")));
/* Ends a use begun by compat_ready; returns r. */
ncclResult_t compat_release(struct ncclComm *c, ncclResult_t r)
    __attribute__((visibility("hidden")));

/* Per-thread group state shared by the init and collective halves. */
int compat_group_depth(void) __attribute__((visibility("hidden")));
/* An init started inside a group, joined by ncclGroupEnd. */
void compat_group_add_init(struct ncclComm *c) __attribute__((visibility("hidden")));
/* Waits for every init started in this thread's group; first error. */
ncclResult_t compat_group_join_inits(void) __attribute__((visibility("hidden")));
/* Buffers of PreMulSum calls, freed when the group (or call) ends. */
void compat_scratch_release(void) __attribute__((visibility("hidden")));
/* A communicator a call of the open group used (for ncclGroupEnd's message). */
void compat_group_touch(struct ncclComm *c) __attribute__((visibility("hidden")));
struct ncclComm *compat_group_failed_comm(void) __attribute__((visibility("hidden")));

#endif /* WEFT_COMPAT_NCCL_H */
