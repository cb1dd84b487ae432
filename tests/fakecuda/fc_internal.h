/*
 * fc_internal.h - state shared by the fake CUDA driver's files: one lock
 * over everything (tests, not speed), contexts, the allocation table, and
 * the stream and event objects fc_stream.c runs.
 */
#ifndef WEFT_FC_INTERNAL_H
#define WEFT_FC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "fakecuda.h"

#define FC_API __attribute__((visibility("default")))
#define FC_MAX_DEV 16

/* A device's primary context.  Lives in fc.ctx[] for the life of the
 * process (generation fc.gen); streams is every stream of it, the legacy
 * one included, until each stream's thread has finished and unlinked it. */
struct fc_ctx {
    int dev;
    int retained;                 /* cuDevicePrimaryCtxRetain count */
    struct fc_stream *streams;
    struct fc_stream *legacy;     /* created on first use */
};

enum fc_kind { FC_DEVICE, FC_IPC, FC_HOST, FC_MANAGED };

/* One allocation (or IPC mapping), owned by fc.allocs.  base..base+bytes is
 * what callers address; shadow holds the bytes (== base for host and
 * managed memory, which the CPU may touch). */
struct fc_alloc {
    struct fc_alloc *next;
    enum fc_kind kind;
    uintptr_t base;
    size_t bytes;                 /* requested */
    size_t maplen;                /* page-rounded, mapped */
    char *shadow;
    int fd;                       /* FC_DEVICE: its memfd, else -1 */
    uint64_t id;                  /* FC_DEVICE: memfd name; FC_IPC: exporter's */
    pid_t pid;                    /* FC_IPC: exporter */
    int refs;                     /* FC_IPC: opens of the same handle */
    bool dying;                   /* being freed: no longer found */
    struct fc_ctx *ctx;           /* current when it was made */
};

/* Everything, under lock.  progress is broadcast whenever a stream command
 * completes, an event fires or a hold is released. */
struct fc_state {
    pthread_mutex_t lock;
    pthread_cond_t progress;
    atomic_int inited;
    unsigned gen;                 /* bumped in a fork child: stale TLS contexts */
    int ndev;
    bool memops;
    struct fc_ctx ctx[FC_MAX_DEV];
    struct fc_alloc *allocs;
    struct fc_event *events;
    struct fc_module *modules;
    uint64_t next_id;
};
extern struct fc_state fc;

/* Set on a stream thread while it runs a host function. */
extern __thread bool fc_in_host_fn;

/* Entry checks: host-function, initialized, and (second) a current
 * context, returned in *ctx (ctx may be NULL: a call that needs a
 * context but does not use it). */
CUresult fc_enter(void);
CUresult fc_enter_ctx(struct fc_ctx **ctx);

/* Returns call's CUresult from the calling function unless it is
 * CUDA_SUCCESS: entry points open with FC_CHECK(fc_enter_ctx(&ctx)). */
#define FC_CHECK(call)                                                                  \
    do {                                                                                \
        CUresult fc_r_ = (call);                                                        \
        if (fc_r_ != CUDA_SUCCESS)                                                      \
            return fc_r_;                                                               \
    } while (0)

/* Pushes obj on the list fc.list (allocs, events, modules) under fc.lock. */
#define FC_LINK(list, obj)                                                              \
    do {                                                                                \
        pthread_mutex_lock(&fc.lock);                                                   \
        (obj)->next = fc.list;                                                          \
        fc.list = (obj);                                                                \
        pthread_mutex_unlock(&fc.lock);                                                 \
    } while (0)

/* Whether dev is a device ordinal of the fake (cuInit sets fc.ndev). */
static inline bool fc_dev_ok(int dev) { return dev >= 0 && dev < fc.ndev; }

/* The allocation holding [p, p+n) (n 0: holding p); *err says whether p is
 * in one whose range is shorter.  Caller holds fc.lock. */
struct fc_alloc *fc_find(uintptr_t p, size_t n, bool *short_range);
/* Host address of [p, p+n) for the CPU (the shadow for device memory, p
 * itself otherwise); NULL when p is device memory and the range overruns
 * its allocation.  Takes fc.lock. */
void *fc_host_addr(CUdeviceptr p, size_t n);

/* Waits until the streams of ctx (every context when NULL) have run what
 * was enqueued on them before the call.  Caller holds fc.lock. */
void fc_drain_locked(struct fc_ctx *ctx);

enum fc_op { OP_COPY, OP_COPY2D, OP_SIGNAL, OP_WAIT_EVENT, OP_WAIT_STREAM, OP_WAIT_VALUE,
             OP_WRITE_VALUE, OP_HOST_FN, OP_KERNEL };

/* A stream command's arguments, one member per kind of op. */
union fc_args {
    struct { CUdeviceptr dst, src; size_t n, dpitch, spitch, height; } copy;
    struct { struct fc_event *ev; uint64_t gen; } ev;
    struct { struct fc_stream *s; uint64_t seq; } st;
    struct { CUdeviceptr addr; uint32_t value; unsigned flags; } val;
    struct { CUhostFn fn; void *data; } host;
    struct { const struct fakecuda_kernel *k; unsigned gx, bx; void *args[FAKECUDA_MAX_PARAMS]; } kern;
};

/* One stream command; device addresses are translated when it runs. */
struct fc_cmd {
    struct fc_cmd *next;
    enum fc_op op;
    union fc_args u;
    _Alignas(16) unsigned char blob[]; /* the kernel's argument copies */
};

/* A command op with arguments u and blob bytes of blob; NULL when out of
 * memory, which fc_submit and fc_submit_wait take and report. */
struct fc_cmd *fc_cmd_new(enum fc_op op, union fc_args u, size_t blob);
/* Queues c on stream h of ctx (c freed on failure; NULL c: out of
 * memory); the legacy stream for the sync form, which returns once the
 * stream has run it.  Take fc.lock. */
CUresult fc_submit(struct fc_ctx *ctx, CUstream h, struct fc_cmd *c);
CUresult fc_submit_wait(struct fc_ctx *ctx, struct fc_cmd *c);

/* Forgets every stream, event and module (fork child). */
void fc_streams_forget(void);

#endif /* WEFT_FC_INTERNAL_H */
