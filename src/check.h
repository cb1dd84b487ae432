/*
 * check.h - mismatch detection (WEFT_CHECK=1): what a collective's
 * fingerprint holds, the schedule that exchanges it among all ranks, and
 * the comparison that turns a disagreement into WEFT_ERR_MISMATCH with a
 * message naming both calls.  The engine decides when these run.
 */
#ifndef WEFT_CHECK_H
#define WEFT_CHECK_H

#include "algorithms/schedule.h"
#include "engine.h"

#define WEFT_FP_MAGIC 0x4b434657u /* "WFCK": a record, not stray bytes */

/*
 * One rank's description of one collective call, sent as is (48 bytes, no
 * padding; every rank of a job shares the byte order).  The first group is
 * the call; algo and chunk are the plan the engine derived from it, which
 * differs between ranks only when their WEFT_ALGO, weft_comm_set_algo,
 * WEFT_CHUNK_SIZE or WEFT_TUNE_* do.
 */
struct weft_fingerprint {
    uint32_t magic;   /* WEFT_FP_MAGIC */
    int32_t coll;     /* enum weft_coll */
    int32_t dtype;    /* weft_dtype_t */
    int32_t op;       /* weft_op_t; 0 where the collective does not reduce */
    int32_t root;     /* 0 where the collective has no root */
    int32_t algo;     /* enum weft_algo | variant << 8 | ordered << 12 | starts a
                         run of trials (a barrier follows the check) << 13 */
    uint64_t seq;     /* collectives issued on the communicator before this one */
    uint64_t count;   /* elements, as passed to the call */
    uint64_t chunk;   /* bytes one pipelined step carries */
};

/* The fingerprint of a validated call (seq is set at submit). */
void weft_fp_fill(struct weft_fingerprint *fp, const struct weft_op_args *a, int algo,
                  size_t chunk_bytes) WEFT_HIDDEN;

/* The exchange: each rank sends its record (sendbuf, one record) to every
 * other rank and receives rank r's into recvbuf + r records; one message
 * each way per pair, none depending on another. */
weft_status_t weft_check_sched_build(int rank, int nranks, struct weft_schedule *s) WEFT_HIDDEN;

/* Compares the nranks records of one exchange.  WEFT_OK when they agree;
 * else records on comm a message naming the sequence, the first rank whose
 * call differs from rank 0's and both calls, and returns
 * WEFT_ERR_MISMATCH.  Every rank holds the same records, so every rank
 * reaches the same verdict and names the same ranks. */
weft_status_t weft_check_verify(struct weft_comm *comm, const struct weft_fingerprint *all)
    WEFT_HIDDEN;

/* "float32", "sum": names for messages ("?" when out of range). */
const char *weft_dtype_name(weft_dtype_t t) WEFT_HIDDEN;
const char *weft_op_name(weft_op_t op) WEFT_HIDDEN;

#endif /* WEFT_CHECK_H */
