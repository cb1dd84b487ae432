/*
 * tc_job.h - one rank's part of a checked multi-process job (harness.h):
 * its struct tc allocated, its steps run, its verdict taken, freed.
 */
#ifndef WEFT_TC_JOB_H
#define WEFT_TC_JOB_H

#include "harness.h"

/* A rank's checks on c; nonzero stops the rank's part early (its job
 * fails). */
typedef int (*tc_steps_t)(struct tc *c, void *arg);

/* For weft_test_run bodies: 0 when steps returned 0 and no check failed. */
static inline int tc_job(weft_comm_t comm, int rank, int p, tc_steps_t steps, void *arg)
{
    struct tc c;
    int rc = 1;
    if (tc_alloc(&c, comm, rank, p) == 0 && steps(&c, arg) == 0)
        rc = tc_verdict(&c);
    tc_free(&c);
    return rc;
}

#endif /* WEFT_TC_JOB_H */
