/*
 * offload.h - ZeRO-Offload for the trainer: the AdamW moments (m and v,
 * whole or this rank's shard) kept out of the model-state working set, in
 * a host buffer or a file, and streamed through a few chunk buffers once
 * per optimizer step, with reads ahead and writes behind on a worker thread.
 */
#ifndef WEFT_TRAINER_OFFLOAD_H
#define WEFT_TRAINER_OFFLOAD_H

#include <stddef.h>
#include <stdint.h>

/* NONE: plain resident arrays; chunks point straight into them (zero
 * copies), so the optimizer has one code path for all three kinds.
 * CPU: a separate host buffer streamed through the chunk buffers by
 * memcpy.  On this all-CPU trainer that does not save memory: the moments
 * only leave the working set's accounting, and the copies cost time.  It
 * stands for the GPU case (device working set, pinned host store) and
 * tests the streaming path without a disk.
 * FILE: one sparse file per rank in dir; only the chunk buffers stay in
 * memory. */
enum offload_kind { OFFLOAD_NONE, OFFLOAD_CPU, OFFLOAD_FILE };

struct offload_spec {
    enum offload_kind kind;
    char dir[4096]; /* FILE only */
};

/* Most streams per offload (the trainer uses 2: m and v). */
#define OFFLOAD_MAX_STREAMS 4

/* "none", "cpu" or "file:DIR" (the --offload value) into *spec.  Returns
 * 0, or -1 with err saying what is wrong and what is expected. */
int offload_parse(const char *text, struct offload_spec *spec, char *err, size_t errlen);

/* One thread at a time calls an offload's functions (the worker thread is
 * internal). */
struct offload;

/* nstreams (1..OFFLOAD_MAX_STREAMS) arrays of n floats each, all zero at
 * first, moved chunk floats at a time (chunk > 0; n == 0 is fine, n need
 * not be a multiple of chunk).  FILE creates dir/weft-optim-rank<R>.<pid>
 * .bin (O_EXCL, 0600), sized with ftruncate: it is sparse, so zeros cost
 * no disk until the first pass writes them, and a disk that fills up shows
 * then, as an error of that pass.  CPU and FILE start the worker thread.
 * Returns NULL with err set (naming the file and the errno text for a
 * directory that is missing, not writable or not a directory). */
struct offload *offload_create(const struct offload_spec *spec, int rank, size_t n,
                               int nstreams, size_t chunk, char *err, size_t errlen);
/* Stops and joins the worker, frees everything and unlinks the file, also
 * in the middle of a pass or after an error.  NULL ok. */
void offload_destroy(struct offload *o);

/* Whole stream in from src (resume) or out to dst (checkpoint): n floats,
 * on the caller's thread, outside a pass.  Returns 0 or -1 (see
 * offload_error).  A failed store leaves that stream undefined.
 * After a failed pass, offload_load still works and returns the state the
 * pass left behind (see offload_next): that is how the caller saves what a
 * full disk would otherwise lose. */
int offload_store(struct offload *o, int stream, const float *src);
int offload_load(struct offload *o, int stream, float *dst);

/* One pass over all chunks in order, for the optimizer step:
 *
 *     float *ptr[2];
 *     if (offload_begin(o) != 0) fail(offload_error(o));
 *     while ((rc = offload_next(o, &off, &len, ptr)) > 0)
 *         update ptr[k][0..len) in place: elements off..off+len of stream k;
 *     if (rc < 0) fail(offload_error(o));
 *
 * Chunks cover [0, n) in order; ptr[k] (nstreams entries) is valid until
 * the next call, which tells the offload the caller is done with it.
 * offload_next returns 1 with a chunk, 0 once every chunk is written back
 * (it waits for the last writes), -1 on an error.  Reads run ahead of the
 * caller (up to 3 chunks) and writes behind it, on the worker thread; the
 * caller waits only for data that is not there yet.  Between passes the
 * worker already reads the next pass's first chunks (a store drops them).
 * A disk is never synced: the file is scratch, valid only while the
 * offload lives.
 *
 * After an error the pass is over and the offload is failed: begin, next
 * and store return -1 with the first error's text (the file and the errno
 * text) and the worker does no more I/O.  Nothing is lost: chunks the
 * caller was handed in this pass keep the values it left in them (written
 * back, or held in the chunk buffers when their write failed or was not
 * reached), the others keep their values from before the pass.  So a
 * caller that updates its parameters chunk by chunk alongside m and v can
 * still offload_load a consistent state and checkpoint it, as long as the
 * file can be read. */
int offload_begin(struct offload *o);
int offload_next(struct offload *o, size_t *off, size_t *len, float **ptr);
/* Why the last call failed: once the offload has failed, the first I/O
 * error's text for good; before, the last refused call's (next without
 * begin, begin or load inside a pass: refused, but nothing is lost and
 * the offload goes on working).  "" if nothing failed yet. */
const char *offload_error(const struct offload *o);

/* Counts over all passes (store and load are not counted: they are
 * one-off and synchronous); bytes_read includes the next pass's first
 * chunks once they are read.  io_s - wait_s is the I/O time hidden behind
 * the caller's work. */
struct offload_stats {
    uint64_t bytes_read, bytes_written;
    double io_s;            /* worker's time in pread/pwrite (memcpy for CPU) */
    double wait_s;          /* caller's time blocked in offload_next (reads, last writes) */
    uint64_t chunks;        /* chunks handed to the caller */
    uint64_t chunks_ready;  /* of those, already read when asked for */
    uint64_t ahead_max;     /* chunks: the furthest read issued ahead of the one held */
    size_t resident_bytes;  /* chunk buffers (the arrays for NONE) */
    size_t stored_bytes;    /* kept out of memory or in the host buffer (0 for NONE) */
};
struct offload_stats offload_stats(const struct offload *o);

#endif /* WEFT_TRAINER_OFFLOAD_H */
