/*
 * devbuf_impl.h - what the device worker (devbuf.c) shares with its CUDA
 * IPC path (devipc.c).  Private to those two files.
 */
#ifndef WEFT_DEVBUF_IMPL_H
#define WEFT_DEVBUF_IMPL_H

#include "base/cudrv.h"
#include "devbuf.h"

/* One call of a job.  start: recorded on the user's stream when the call
 * was made (NULL for a plain call, which reads its buffers at once). */
struct dev_call {
    struct weft_op_args a;
    bool has_stream;
    CUstream stream;
    CUevent start;
};

/*
 * A job: the calls of one API call, or of one communicator in a group.
 * Owner: the worker from enqueue; a plain call's caller waits for done and
 * frees it.  seq: the flag value that releases the streams it holds.
 */
struct dev_job {
    struct dev_job *next;
    struct dev_call *calls;
    size_t ncalls, cap;
    uint32_t seq;
    bool waited;                 /* a plain call waits for it */
    bool done;                   /* (mu) */
    weft_status_t status;        /* (mu) */
};

/*
 * Owner: the communicator (created by the first device call, freed by
 * weft_dev_destroy).  Invariants: jobs are run in queue order by the one
 * worker thread; *flag only grows (mod 2^32) and every stream waiting for
 * a value <= *flag may go.
 */
struct weft_dev {
    struct weft_comm *comm;
    const struct weft_cu *cu;
    CUcontext ctx;
    CUdevice primary_dev;        /* ctx is that device's retained primary one, or -1 */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct dev_job *head, *tail; /* (mu) */
    size_t queued;               /* (mu) jobs not yet finished */
    bool stop;                   /* (mu) */
    _Atomic int abort;
    pthread_t thread;
    bool started;
    uint32_t next_seq;           /* (mu) the last seq handed out */
    volatile uint32_t *flag;     /* host view of the stream flag */
    CUdeviceptr flag_dev;        /* its device address */
    /* Worker-only state. */
    CUstream copy;               /* the worker's stream for staging copies */
    CUevent ev_in[2];            /* segment copied in to slot s */
    char *stage;                 /* pinned staging, stage_bytes */
    size_t stage_bytes;
    size_t seg_bytes;            /* WEFT_CUDA_STAGE_BYTES */
    CUevent *events;             /* recycled start events (mu) */
    size_t nevents, cap_events;
    struct weft_devipc *ipc;     /* CUDA IPC state (devipc.c), NULL until used */
    _Atomic uint64_t n_ipc, n_staged; /* calls that took each path */
    /* Memory to give back at destroy, not before: freeing pinned or device
     * memory (and closing IPC mappings) may wait for the whole device, and
     * a stream may be waiting for the job that frees it. */
    struct weft_dev_retired *retired;
    size_t nretired, cap_retired;
};

enum weft_dev_retire_kind { WEFT_RETIRE_HOST, WEFT_RETIRE_DEVICE, WEFT_RETIRE_IPC };
struct weft_dev_retired {
    enum weft_dev_retire_kind kind;
    uintptr_t p;
};
/* Keeps p until the device state is freed (worker only); on no memory it
 * is freed at once. */
void weft_dev_retire(struct weft_dev *d, enum weft_dev_retire_kind kind, uintptr_t p) WEFT_HIDDEN;


/* Whether this rank has a send (receive) buffer in the call: a broadcast
 * is sent only by its root, a reduce received only by its root. */
static inline bool weft_dev_needs_send(const struct weft_op_args *a, int rank)
{
    return a->coll != WEFT_COLL_RECV && !(a->coll == WEFT_COLL_BROADCAST && a->root != rank);
}

static inline bool weft_dev_needs_recv(const struct weft_op_args *a, int rank)
{
    return a->coll != WEFT_COLL_SEND && !(a->coll == WEFT_COLL_REDUCE && a->root != rank);
}

/* Maps a CUresult to a status with the driver's text in the comm's error. */
weft_status_t weft_dev_cu_check(struct weft_dev *d, CUresult r, const char *what) WEFT_HIDDEN;
/* Runs n host operations together on the engine; the first failure. */
weft_status_t weft_dev_run_host(struct weft_dev *d, const struct weft_op_args *args, size_t n)
    WEFT_HIDDEN;

/* The CUDA IPC path of a _stream collective: every rank of a one-host
 * communicator agrees (one small exchange) whether all can map each
 * other's buffers; then reductions run as GPU kernels over the peers'
 * memory and copies go device to device.  *taken = false when the ranks
 * agreed to stage instead (a decision every rank makes the same). */
weft_status_t weft_devipc_run(struct weft_dev *d, const struct weft_op_args *a, bool *taken)
    WEFT_HIDDEN;
/* True when calls of this communicator go through weft_devipc_run: one
 * host, WEFT_CUDA_IPC=1, a collective (not send/recv). */
bool weft_devipc_applies(struct weft_dev *d, const struct weft_op_args *a) WEFT_HIDDEN;
void weft_devipc_free(struct weft_dev *d) WEFT_HIDDEN;

#endif /* WEFT_DEVBUF_IMPL_H */
