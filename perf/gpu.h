/*
 * gpu.h - -G 1 for the perf tools: their two buffers in GPU memory and a
 * CUDA stream for the _stream calls, through weft's run-time loaded
 * driver table (gpu.c).  The host never touches device memory: data goes
 * through copies to and from the tools' host buffers.
 */
#ifndef WEFT_PERF_GPU_H
#define WEFT_PERF_GPU_H

#include <stddef.h>

#include <weft.h>

/* One rank's device state; made by perf_gpu_open, ended by
 * perf_gpu_close after the communicator is destroyed. */
typedef struct perf_gpu perf_gpu_t;

/* Retains device (local_rank % devices)'s primary context, makes it
 * current, and allocates two zeroed buffers of bytes each and a stream.
 * NULL when any of it fails (no CUDA in this build, no driver, no device,
 * no memory), with one sentence on why in why[len]; rank only labels
 * later messages. */
perf_gpu_t *perf_gpu_open(int rank, int local_rank, size_t bytes, char *why, size_t len);
/* Frees what open made; reports a failure on stderr (WEFT_OK otherwise).
 * NULL is a no-op. */
weft_status_t perf_gpu_close(perf_gpu_t *g);

/* Device buffer 0 (send) or 1 (recv), as the address weft's calls take:
 * never to be read or written by the host. */
void *perf_gpu_buf(const perf_gpu_t *g, int which);
weft_stream_t perf_gpu_stream(const perf_gpu_t *g);
int perf_gpu_device(const perf_gpu_t *g);       /* the ordinal used */
const char *perf_gpu_name(const perf_gpu_t *g); /* "NVIDIA H100 80GB HBM3" */
int perf_gpu_driver_version(const perf_gpu_t *g); /* 12040 for 12.4 */

/* Host to device and back, synchronous: put returns when the data is in
 * device memory (so work on any stream sees it), get when it is in host
 * memory.  The _stream calls' results must be complete (perf_gpu_sync)
 * before a get.  Failures are reported on stderr with the rank. */
weft_status_t perf_gpu_put(perf_gpu_t *g, void *dev, const void *host, size_t bytes);
weft_status_t perf_gpu_get(perf_gpu_t *g, void *host, const void *dev, size_t bytes);
/* Waits until everything issued on the stream has finished. */
weft_status_t perf_gpu_sync(perf_gpu_t *g);

#endif /* WEFT_PERF_GPU_H */
