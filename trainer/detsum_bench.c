/*
 * detsum_bench.c - what the canonical tree costs: det_allreduce and
 * det_reduce_scatter against weft's own collectives (fastest and
 * deterministic mode) on forked local ranks, and tacc against a plain add.
 * `make detsum_bench && ./detsum_bench [ranks [floats]]` in build/; the
 * ratios mean more than the times on a shared machine.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "detsum.h"
#include "harness.h"

#define REPS 20

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static size_t nfloats = 1u << 20;

enum { DET_AR, WEFT_AR, WEFT_AR_DET, DET_RS, WEFT_RS, WEFT_RS_DET, NKIND };
static const char *const names[NKIND] = {
    "det_allreduce", "weft_allreduce", "weft_allreduce (deterministic)",
    "det_reduce_scatter", "weft_reduce_scatter", "weft_reduce_scatter (deterministic)"};

static weft_status_t once(weft_comm_t comm, int kind, float *buf, float *scr, float *part,
                          size_t s)
{
    switch (kind) {
    case DET_AR:
        return det_allreduce(comm, buf, nfloats, WEFT_FLOAT32, scr);
    case WEFT_AR:
    case WEFT_AR_DET:
        return weft_allreduce(buf, buf, nfloats, WEFT_FLOAT32, WEFT_SUM, comm);
    case DET_RS:
        return det_reduce_scatter(comm, buf, part, s, scr);
    default:
        return weft_reduce_scatter(buf, part, s, WEFT_FLOAT32, WEFT_SUM, comm);
    }
}

static int body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    size_t s = nfloats / (size_t)p;
    float *buf = calloc(nfloats, 4), *scr = calloc(nfloats, 4), *part = calloc(s, 4);
    int rc = 1;
    if (!buf || !scr || !part)
        goto out;
    for (int kind = 0; kind < NKIND; kind++) {
        if ((kind >= DET_RS && (p & (p - 1))) ||
            weft_comm_set_deterministic(comm, kind == WEFT_AR_DET || kind == WEFT_RS_DET))
            continue;
        double best = 1e30;
        for (int i = 0; i < REPS + 2; i++) {
            double t0 = now_s();
            weft_status_t st = once(comm, kind, buf, scr, part, s);
            if (st != WEFT_OK) {
                weft_test_fail(rank, "%s: %s", names[kind], det_last_error(comm));
                goto out;
            }
            double t = now_s() - t0;
            if (i >= 2 && t < best)
                best = t;
        }
        if (rank == 0)
            printf("%d ranks, %zu floats: %-36s %8.3f ms\n", p, nfloats, names[kind], best * 1e3);
    }
    rc = 0;
out:
    free(buf);
    free(scr);
    free(part);
    return rc;
}

/* tacc of 8 items against 7 plain adds into one buffer. */
static void local(void)
{
    const int G = 8;
    struct tacc *a = tacc_create(nfloats, G);
    float *x = calloc(nfloats, 4), *y = calloc(nfloats, 4);
    if (!a || !x || !y)
        goto out;
    double best[2] = {1e30, 1e30};
    for (int i = 0; i < REPS; i++) {
        double t0 = now_s();
        tacc_reset(a);
        for (int g = 0; g < G; g++) {
            memcpy(tacc_slot(a), x, nfloats * 4);
            tacc_commit(a);
        }
        tacc_finish(a, NULL);
        double t1 = now_s();
        memcpy(y, x, nfloats * 4);
        for (int g = 1; g < G; g++) {
            memcpy(x, y, nfloats * 4); /* the item's write, as above */
            tacc_add_into(y, x, nfloats);
        }
        double t2 = now_s();
        if (t1 - t0 < best[0])
            best[0] = t1 - t0;
        if (t2 - t1 < best[1])
            best[1] = t2 - t1;
    }
    printf("%d items of %zu floats: tacc %.3f ms, left fold %.3f ms\n", G, nfloats,
           best[0] * 1e3, best[1] * 1e3);
out:
    tacc_destroy(a);
    free(x);
    free(y);
}

int main(int argc, char **argv)
{
    int p = argc > 1 ? atoi(argv[1]) : 4;
    if (argc > 2)
        nfloats = strtoul(argv[2], NULL, 0);
    if (p < 1 || p > WEFT_TEST_MAX_RANKS || nfloats < (size_t)p) {
        fprintf(stderr, "usage: detsum_bench [ranks [floats]]\n");
        return 2;
    }
    local();
    fflush(stdout);
    return weft_test_run(p, 300, body, NULL) ? 1 : 0;
}
