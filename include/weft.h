/*
 * weft.h - the public API of weft, a collective-communication library.
 *
 * One header, nothing else is installed.  Argument order follows NCCL.
 * Every function returns a weft_status_t; a failed call changes nothing and
 * leaves a message in weft_last_error(comm).  User buffers are borrowed until
 * the operation (or its request) completes.
 */
#ifndef WEFT_H
#define WEFT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define WEFT_API __attribute__((visibility("default")))
#else
#define WEFT_API
#endif

#define WEFT_VERSION_MAJOR 0
#define WEFT_VERSION_MINOR 1
#define WEFT_VERSION_PATCH 0

typedef enum {
    WEFT_OK = 0,
    WEFT_INPROGRESS = 1,
    WEFT_ERR_INVALID_ARG = -1,
    WEFT_ERR_NO_MEMORY = -2,
    WEFT_ERR_SYSTEM = -3,    /* an OS call failed (errno text in last error) */
    WEFT_ERR_REMOTE = -4,    /* a peer failed, closed or sent bad bytes */
    WEFT_ERR_TIMEOUT = -5,   /* a deadline (WEFT_TIMEOUT_MS) passed */
    WEFT_ERR_ABORTED = -6,   /* weft_comm_abort() was called */
    WEFT_ERR_UNSUPPORTED = -7,
    WEFT_ERR_INTERNAL = -8,
    WEFT_ERR_MISMATCH = -9   /* ranks called different collectives (found with WEFT_CHECK=1) */
} weft_status_t;

/* Numbered as NCCL numbers its ncclDataType_t. */
typedef enum {
    WEFT_INT8 = 0,
    WEFT_UINT8 = 1,
    WEFT_INT32 = 2,
    WEFT_UINT32 = 3,
    WEFT_INT64 = 4,
    WEFT_UINT64 = 5,
    WEFT_FLOAT16 = 6,
    WEFT_FLOAT32 = 7,
    WEFT_FLOAT64 = 8,
    WEFT_BFLOAT16 = 9,
    WEFT_NUM_DTYPES = 10
} weft_dtype_t;

/* Numbered as NCCL numbers its ncclRedOp_t.  AVG divides once, at the end;
 * on integer types it truncates toward zero. */
typedef enum {
    WEFT_SUM = 0,
    WEFT_PROD = 1,
    WEFT_MAX = 2,
    WEFT_MIN = 3,
    WEFT_AVG = 4,
    WEFT_NUM_OPS = 5
} weft_op_t;

#define WEFT_UNIQUE_ID_BYTES 128
/* Opaque bytes: root address, protocol version, job secret. */
typedef struct {
    char internal[WEFT_UNIQUE_ID_BYTES];
} weft_unique_id_t;

typedef struct weft_comm *weft_comm_t;
typedef struct weft_request *weft_request_t;

WEFT_API const char *weft_status_string(weft_status_t status);
/* The last error message recorded on comm (never NULL).  With comm == NULL,
 * the last error of this thread that had no communicator to record it on. */
WEFT_API const char *weft_last_error(weft_comm_t comm);
WEFT_API size_t weft_dtype_size(weft_dtype_t dtype); /* 0 for an invalid dtype */

/* Makes a fresh id: this process listens on the chosen interface (see
 * WEFT_SOCKET_IFNAME) and becomes the rendezvous root when it joins as
 * rank 0 with this id.  Pass the id to every rank out of band. */
WEFT_API weft_status_t weft_get_unique_id(weft_unique_id_t *id);
/* Collective over nranks processes: every rank calls it with the same id. */
WEFT_API weft_status_t weft_comm_init(weft_comm_t *comm, int nranks, weft_unique_id_t id, int rank);
/* Rank, size and rendezvous from the environment: WEFT_UNIQUE_ID (hex) or
 * WEFT_ROOT=host:port (+ WEFT_SECRET), WEFT_RANK/WEFT_NRANKS, or the
 * variables of Open MPI, PMI and Slurm. */
WEFT_API weft_status_t weft_comm_init_env(weft_comm_t *comm);
/* Waits for the communicator's pending operations, then frees it.  NULL is
 * accepted. */
WEFT_API weft_status_t weft_comm_destroy(weft_comm_t comm);
/* Fails every pending operation with WEFT_ERR_ABORTED (a thread blocked in
 * a call on comm returns with it), waits for such calls to return, closes
 * connections and frees comm; safe from any state and any thread.  Requests
 * still held are void: weft_wait/weft_test on them return
 * WEFT_ERR_INVALID_ARG.  NULL is accepted. */
WEFT_API weft_status_t weft_comm_abort(weft_comm_t comm);
/* Collective over comm (every rank calls it, in the same order as other
 * calls that make communicators): ranks passing the same color form
 * *newcomm, ranked by (key, rank in comm).  A negative color
 * (WEFT_SPLIT_NOCOLOR) takes part and gets *newcomm = NULL.  comm stays
 * usable; the two are independent. */
#define WEFT_SPLIT_NOCOLOR (-1)
WEFT_API weft_status_t weft_comm_split(weft_comm_t comm, int color, int key, weft_comm_t *newcomm);
/* Called by every rank of comm that is not in excluded[0..nexcluded-1]
 * (the excluded ranks do not call it): they form *newcomm, keeping their
 * order.  No link of comm is used, so it works after comm failed (a rank
 * died, hung or was aborted): the survivors list the lost ranks and go on.
 * Every survivor must pass the same list, and have made the same split and
 * shrink calls on comm before.  comm stays as it was (failed or not) and is
 * still destroyed by its owner. */
WEFT_API weft_status_t weft_comm_shrink(weft_comm_t comm, const int *excluded, int nexcluded,
                                        weft_comm_t *newcomm);
WEFT_API weft_status_t weft_comm_rank(weft_comm_t comm, int *rank);
WEFT_API weft_status_t weft_comm_size(weft_comm_t comm, int *nranks);
/* The sticky error of comm: WEFT_OK while it is healthy. */
WEFT_API weft_status_t weft_comm_get_error(weft_comm_t comm);

/* Registers [buf, buf + bytes) with comm's zero-copy transports (verbs):
 * collectives and sends on memory inside it move bytes straight to and
 * from it instead of through bounce buffers.  The memory must stay mapped
 * until weft_mem_deregister(comm, *handle) or weft_comm_destroy; freeing
 * it first leaves the transport writing into pages nobody reads.  Without
 * such a transport it records the range and changes nothing.  It waits
 * for the collectives comm is driving to let go of the transports.
 * bytes == 0 gives a valid handle that registers nothing. */
WEFT_API weft_status_t weft_mem_register(weft_comm_t comm, void *buf, size_t bytes,
                                         void **handle);
/* Undoes weft_mem_register; a handle of another communicator, or one
 * deregistered already, is WEFT_ERR_INVALID_ARG (handles are looked up,
 * never read before they are found). */
WEFT_API weft_status_t weft_mem_deregister(weft_comm_t comm, void *handle);
/* Deterministic mode on (1) or off (0); a new communicator starts with
 * WEFT_DETERMINISTIC, one made by split or shrink with its parent's
 * setting.  On, allreduce, reduce_scatter and reduce combine every element
 * in rank order, ((x0 op x1) op x2) ... op x(p-1) (AVG divides that sum
 * once), so the result is bitwise identical on every rank, run after run,
 * whatever algorithm WEFT_ALGO allows, whatever the chunk size and the
 * count: two tensors reduced in one call get the bits of two calls.  The
 * price is a pipelined chain through the ranks instead of the fastest
 * algorithm (README, "Deterministic mode").  Collective in spirit: every
 * rank sets the same value before its next collective on comm (WEFT_CHECK=1
 * reports ranks that disagree); calls already issued keep their mode. */
WEFT_API weft_status_t weft_comm_set_deterministic(weft_comm_t comm, int on);

/* The algorithms comm may choose from, in WEFT_ALGO's syntax ("ring",
 * "^tree", "allreduce:rhd;allgather:ring"); NULL or "" lets it choose from
 * all.  A new communicator starts with WEFT_ALGO, one made by split or
 * shrink with its parent's set.  It first waits for the calls already
 * issued on comm, then forgets every choice made (and measured) so far.
 * Not inside a group.  Collective in spirit, like the call above: every
 * rank sets the same value at the same point of its calls on comm
 * (WEFT_CHECK=1 reports ranks that disagree). */
WEFT_API weft_status_t weft_comm_set_algo(weft_comm_t comm, const char *spec);

/* Blocking collectives.  In place: sendbuf == recvbuf; for allgather
 * sendbuf == recvbuf + rank * sendcount elements, for reduce_scatter
 * recvbuf == sendbuf + rank * recvcount elements (NCCL's convention). */
WEFT_API weft_status_t weft_allreduce(const void *sendbuf, void *recvbuf, size_t count,
                             weft_dtype_t dtype, weft_op_t op, weft_comm_t comm);
WEFT_API weft_status_t weft_reduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                  weft_dtype_t dtype, weft_op_t op, weft_comm_t comm);
WEFT_API weft_status_t weft_allgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                             weft_dtype_t dtype, weft_comm_t comm);
/* sendbuf is read on root only; recvbuf is written on every rank. */
WEFT_API weft_status_t weft_broadcast(const void *sendbuf, void *recvbuf, size_t count,
                             weft_dtype_t dtype, int root, weft_comm_t comm);
/* recvbuf is written on root only (may be NULL elsewhere). */
WEFT_API weft_status_t weft_reduce(const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                          weft_op_t op, int root, weft_comm_t comm);
/* Point to point: the k-th send from A to B matches the k-th recv on B from
 * A; counts must agree. */
WEFT_API weft_status_t weft_send(const void *buf, size_t count, weft_dtype_t dtype, int peer,
                        weft_comm_t comm);
WEFT_API weft_status_t weft_recv(void *buf, size_t count, weft_dtype_t dtype, int peer, weft_comm_t comm);

/* Non-blocking forms.  Operations on one communicator complete in the order
 * they were issued; a progress thread moves them while the caller computes.
 * The request is released by weft_wait, or by weft_test once it reports
 * done; both return the operation's status. */
WEFT_API weft_status_t weft_iallreduce(const void *sendbuf, void *recvbuf, size_t count,
                              weft_dtype_t dtype, weft_op_t op, weft_comm_t comm,
                              weft_request_t *req);
WEFT_API weft_status_t weft_ireduce_scatter(const void *sendbuf, void *recvbuf, size_t recvcount,
                                   weft_dtype_t dtype, weft_op_t op, weft_comm_t comm,
                                   weft_request_t *req);
WEFT_API weft_status_t weft_iallgather(const void *sendbuf, void *recvbuf, size_t sendcount,
                              weft_dtype_t dtype, weft_comm_t comm, weft_request_t *req);
WEFT_API weft_status_t weft_ibroadcast(const void *sendbuf, void *recvbuf, size_t count,
                              weft_dtype_t dtype, int root, weft_comm_t comm,
                              weft_request_t *req);
WEFT_API weft_status_t weft_ireduce(const void *sendbuf, void *recvbuf, size_t count, weft_dtype_t dtype,
                           weft_op_t op, int root, weft_comm_t comm, weft_request_t *req);
WEFT_API weft_status_t weft_isend(const void *buf, size_t count, weft_dtype_t dtype, int peer,
                         weft_comm_t comm, weft_request_t *req);
WEFT_API weft_status_t weft_irecv(void *buf, size_t count, weft_dtype_t dtype, int peer, weft_comm_t comm,
                         weft_request_t *req);
WEFT_API weft_status_t weft_wait(weft_request_t req);
WEFT_API weft_status_t weft_test(weft_request_t req, int *done);

/* Between weft_group_start and weft_group_end (per thread, nestable) the
 * blocking calls above only queue their operation; weft_group_end starts
 * them all together and returns when all are done, so any matching pattern
 * of sends and receives completes without deadlock. */
WEFT_API weft_status_t weft_group_start(void);
WEFT_API weft_status_t weft_group_end(void);

/* Device buffers and CUDA streams.  Every call above also takes CUDA
 * device or managed pointers (told apart per call by the driver, which is
 * loaded only when a call needs it); a blocking call on device buffers
 * returns when the result is in place.
 *
 * The _stream forms follow NCCL: the call returns at once; the operation
 * starts after the work enqueued on `stream` before it and the work
 * enqueued after it sees the result.  stream is a cudaStream_t (CUstream);
 * NULL is the legacy default stream.  Buffers may be device, managed or
 * host memory in any mix.  Inside weft_group_start/_end the calls of a
 * communicator start together when the group ends.  A failure (a dead
 * peer, weft_comm_abort) releases the stream, leaves the buffers
 * unspecified and is reported by weft_comm_get_error.  Without a CUDA
 * driver or device they return WEFT_ERR_UNSUPPORTED, saying so. */
typedef void *weft_stream_t;
WEFT_API weft_status_t weft_allreduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                             weft_dtype_t dtype, weft_op_t op, weft_comm_t comm,
                                             weft_stream_t stream);
WEFT_API weft_status_t weft_reduce_scatter_stream(const void *sendbuf, void *recvbuf,
                                                  size_t recvcount, weft_dtype_t dtype,
                                                  weft_op_t op, weft_comm_t comm,
                                                  weft_stream_t stream);
WEFT_API weft_status_t weft_allgather_stream(const void *sendbuf, void *recvbuf, size_t sendcount,
                                             weft_dtype_t dtype, weft_comm_t comm,
                                             weft_stream_t stream);
WEFT_API weft_status_t weft_broadcast_stream(const void *sendbuf, void *recvbuf, size_t count,
                                             weft_dtype_t dtype, int root, weft_comm_t comm,
                                             weft_stream_t stream);
WEFT_API weft_status_t weft_reduce_stream(const void *sendbuf, void *recvbuf, size_t count,
                                          weft_dtype_t dtype, weft_op_t op, int root,
                                          weft_comm_t comm, weft_stream_t stream);
WEFT_API weft_status_t weft_send_stream(const void *buf, size_t count, weft_dtype_t dtype,
                                        int peer, weft_comm_t comm, weft_stream_t stream);
WEFT_API weft_status_t weft_recv_stream(void *buf, size_t count, weft_dtype_t dtype, int peer,
                                        weft_comm_t comm, weft_stream_t stream);
/* CUDA devices this process can use: 0 without a driver, a device, or a
 * build --with-cuda. */
WEFT_API int weft_cuda_device_count(void);

#ifdef __cplusplus
}
#endif
#endif /* WEFT_H */
