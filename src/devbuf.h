/*
 * devbuf.h - CUDA device buffers and stream semantics for the API layer:
 * calls that meet a stream or a device pointer become jobs of the
 * communicator's device worker (src/devbuf.c), which waits for the stream,
 * moves the data through pinned host memory and releases the stream.
 * Without --with-cuda, src/devbuf_none.c answers "unsupported".
 */
#ifndef WEFT_DEVBUF_H
#define WEFT_DEVBUF_H

#include "comm.h"
#include "engine.h"

/* True when a or b (either may be NULL) is device or managed memory.  The
 * pointers are looked at only when a CUDA driver is loaded in this process
 * (decided once per communicator), so host-only programs pay nothing. */
bool weft_dev_on_device(struct weft_comm *comm, const void *a, const void *b) WEFT_HIDDEN;

/* A validated call handed to the device worker.  has_stream: the _stream
 * form (stream ordering; NULL stream is the legacy default one); else a
 * plain call on device buffers, which the caller then waits for. */
weft_status_t weft_dev_call(struct weft_comm *comm, const struct weft_op_args *a, bool has_stream,
                            void *stream, const char *fn, bool in_group) WEFT_HIDDEN;
/* in_group: between weft_group_start and _end the calls of one thread
 * collect per communicator; weft_dev_group_end submits each set as one
 * job (all its calls in flight together) and waits for the jobs holding
 * plain calls. */
weft_status_t weft_dev_group_end(void) WEFT_HIDDEN;
/* Waits until every job of comm has finished (before a plain call, so that
 * calls reach the engine in the order they were made). */
weft_status_t weft_dev_drain(struct weft_comm *comm) WEFT_HIDDEN;
/* Abort: fails the queued jobs and releases every stream waiting on them. */
void weft_dev_abort(struct weft_comm *comm) WEFT_HIDDEN;
/* Destroy: finishes the queued jobs, stops the worker, frees it. */
void weft_dev_destroy(struct weft_comm *comm) WEFT_HIDDEN;

/* Calls of comm that went through CUDA IPC and through staging (tests). */
void weft_dev_stats(struct weft_comm *comm, uint64_t *ipc, uint64_t *staged) WEFT_HIDDEN;

#endif /* WEFT_DEVBUF_H */
