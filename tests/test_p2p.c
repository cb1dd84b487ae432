/*
 * test_p2p.c - non-blocking requests, groups (of sends and receives, and of
 * collectives) and point to point over TCP with real processes, at the rank
 * counts and settings of test_coll; one job per rank count runs them all.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "tc_job.h"

/* ---- non-blocking requests ------------------------------------------------- */

enum { NB_AR_I32, NB_AR_F32, NB_AG_U8, NB_BC_I64, NB_RD_F64, NB_RS_I32, NB_COUNT };
static const size_t nb_count[NB_COUNT] = {1000, 5001, 777, 3001, 2001, 1003};
static const weft_dtype_t nb_dtype[NB_COUNT] = {WEFT_INT32, WEFT_FLOAT32, WEFT_UINT8,
                                                WEFT_INT64, WEFT_FLOAT64, WEFT_INT32};

/* Buffers of the six requests of one batch. */
struct nb {
    void *snd[NB_COUNT], *rcv[NB_COUNT], *want[NB_COUNT];
    weft_request_t req[NB_COUNT];
};

static void nb_free(struct nb *b)
{
    for (int i = 0; i < NB_COUNT; i++) {
        free(b->snd[i]);
        free(b->rcv[i]);
        free(b->want[i]);
    }
}

static int nb_prepare(struct tc *c, struct nb *b)
{
    int p = c->p, r = c->rank;
    memset(b, 0, sizeof(*b));
    for (int i = 0; i < NB_COUNT; i++) {
        size_t bytes = nb_count[i] * weft_dtype_size(nb_dtype[i]) * (size_t)p;
        b->snd[i] = malloc(bytes);
        b->rcv[i] = malloc(bytes);
        b->want[i] = malloc(bytes);
        if (!b->snd[i] || !b->rcv[i] || !b->want[i])
            return weft_test_fail(r, "out of memory"), -1;
        memset(b->rcv[i], POISON, bytes);
    }
    for (size_t j = 0; j < nb_count[NB_AR_I32]; j++) {
        ((int32_t *)b->snd[0])[j] = (int32_t)((r + 1) * (j + 1));
        ((int32_t *)b->want[0])[j] = (int32_t)((j + 1) * (size_t)(p * (p + 1) / 2));
    }
    for (size_t j = 0; j < nb_count[NB_AR_F32]; j++) {
        float mx = 0;
        for (int q = 0; q < p; q++) {
            float v = (float)((q * 31 + (int)j * 7) % 101);
            mx = q == 0 || v > mx ? v : mx;
        }
        ((float *)b->snd[1])[j] = (float)((r * 31 + (int)j * 7) % 101);
        ((float *)b->want[1])[j] = mx;
    }
    size_t seg = nb_count[NB_AG_U8];
    weft_test_fill_bytes(b->snd[2], seg, r, 0xa6);
    for (int q = 0; q < p; q++)
        weft_test_fill_bytes((uint8_t *)b->want[2] + (size_t)q * seg, seg, q, 0xa6);
    weft_test_fill_bytes(b->want[3], nb_count[NB_BC_I64] * 8, p - 1, 0xbc);
    if (r == p - 1)
        memcpy(b->snd[3], b->want[3], nb_count[NB_BC_I64] * 8);
    for (size_t j = 0; j < nb_count[NB_RD_F64]; j++) {
        ((double *)b->snd[4])[j] = (double)r + (double)j;
        ((double *)b->want[4])[j] = (double)p * (p - 1) / 2 + (double)p * (double)j;
    }
    size_t rs = nb_count[NB_RS_I32];
    for (size_t j = 0; j < rs * (size_t)p; j++)
        ((int32_t *)b->snd[5])[j] = (int32_t)(r * 3 + (int)j);
    for (size_t j = 0; j < rs; j++)
        ((int32_t *)b->want[5])[j] = 3 * p * (p - 1) / 2 + p * (int)(r * rs + j);
    return 0;
}

static int nb_issue(struct tc *c, struct nb *b)
{
    weft_comm_t m = c->comm;
    CALL(c, "iallreduce int32", weft_iallreduce(b->snd[0], b->rcv[0], nb_count[0], WEFT_INT32,
                                                WEFT_SUM, m, &b->req[0]));
    CALL(c, "iallreduce float32", weft_iallreduce(b->snd[1], b->rcv[1], nb_count[1],
                                                  WEFT_FLOAT32, WEFT_MAX, m, &b->req[1]));
    CALL(c, "iallgather", weft_iallgather(b->snd[2], b->rcv[2], nb_count[2], WEFT_UINT8, m,
                                          &b->req[2]));
    CALL(c, "ibroadcast", weft_ibroadcast(b->snd[3], b->rcv[3], nb_count[3], WEFT_INT64,
                                          c->p - 1, m, &b->req[3]));
    CALL(c, "ireduce", weft_ireduce(b->snd[4], b->rcv[4], nb_count[4], WEFT_FLOAT64, WEFT_SUM,
                                    0, m, &b->req[4]));
    CALL(c, "ireduce_scatter", weft_ireduce_scatter(b->snd[5], b->rcv[5], nb_count[5],
                                                    WEFT_INT32, WEFT_SUM, m, &b->req[5]));
    for (int i = 0; i < NB_COUNT; i++)
        if (b->req[i] == NULL)
            return weft_test_fail(c->rank, "request %d is NULL after a successful call", i), -1;
    return 0;
}

static void nb_check(struct tc *c, struct nb *b, const char *batch)
{
    static const char *const names[NB_COUNT] = {"iallreduce int32 sum", "iallreduce f32 max",
                                                "iallgather", "ibroadcast", "ireduce",
                                                "ireduce_scatter"};
    char what[128];
    for (int i = 0; i < NB_COUNT; i++) {
        size_t n = nb_count[i] * (i == NB_AG_U8 ? (size_t)c->p : 1);
        snprintf(what, sizeof(what), "%s p=%d: %s", batch, c->p, names[i]);
        if (i == NB_RD_F64 && c->rank != 0) {
            const uint8_t *q = b->rcv[i];
            size_t k = 0;
            while (k < n * 8 && q[k] == POISON)
                k++;
            if (k < n * 8)
                report(c, "%s: recvbuf written on a non-root rank", what);
            continue;
        }
        check_vals(c, what, b->rcv[i], b->want[i], nb_dtype[i], n);
    }
}

/* weft_test until done, bounded so a lost request is a failure. */
static int test_until_done(struct tc *c, weft_request_t req, const char *what)
{
    uint64_t deadline = weft_now_ns() + 60ull * 1000000000;
    int done = 0;
    while (!done) {
        weft_status_t st = weft_test(req, &done);
        if (st < 0)
            return weft_test_fail(c->rank, "%s: weft_test returned %s: %s", what,
                                  weft_status_string(st), weft_last_error(c->comm)), -1;
        if (!done && weft_now_ns() > deadline)
            return weft_test_fail(c->rank, "%s: not done after 60 s of weft_test", what), -1;
    }
    return 0;
}

static int run_nonblocking(struct tc *c)
{
    struct nb b;
    int rc = -1;
    /* Batch 1: the first completed by weft_test, the rest waited in order. */
    if (nb_prepare(c, &b) || nb_issue(c, &b) || test_until_done(c, b.req[0], "batch 1"))
        goto out;
    for (int i = 1; i < NB_COUNT; i++)
        CALL(c, "weft_wait (batch 1)", weft_wait(b.req[i]));
    nb_check(c, &b, "batch 1");
    nb_free(&b);
    /* Batch 2: once the last is done, every earlier one must be (issue order). */
    if (nb_prepare(c, &b) || nb_issue(c, &b) ||
        test_until_done(c, b.req[NB_COUNT - 1], "batch 2"))
        goto out;
    for (int i = 0; i < NB_COUNT - 1; i++) {
        int done = 0;
        weft_status_t st = weft_test(b.req[i], &done);
        if (st < 0) {
            weft_test_fail(c->rank, "batch 2: weft_test of request %d returned %s", i,
                           weft_status_string(st));
            goto out;
        }
        if (!done) {
            report(c, "batch 2: request %d not done after the later request %d completed", i,
                   NB_COUNT - 1);
            CALL(c, "weft_wait (batch 2)", weft_wait(b.req[i]));
        }
    }
    nb_check(c, &b, "batch 2");
    nb_free(&b);
    memset(&b, 0, sizeof(b));
    /* Batch 3: 32 small requests outstanding, waited newest first. */
    enum { MANY = 32 };
    int64_t vals[MANY], sums[MANY];
    weft_request_t reqs[MANY];
    for (int k = 0; k < MANY; k++) {
        vals[k] = (int64_t)(c->rank + 1) * (k + 1);
        CALL(c, "iallreduce (batch 3)",
             weft_iallreduce(&vals[k], &sums[k], 1, WEFT_INT64, WEFT_SUM, c->comm, &reqs[k]));
    }
    for (int k = MANY - 1; k >= 0; k--)
        CALL(c, "weft_wait (batch 3)", weft_wait(reqs[k]));
    for (int k = 0; k < MANY; k++)
        if (sums[k] != (int64_t)(k + 1) * c->p * (c->p + 1) / 2)
            report(c, "batch 3 p=%d: request %d: expected %lld, got %lld", c->p, k,
                   (long long)(k + 1) * c->p * (c->p + 1) / 2, (long long)sums[k]);
    rc = 0;
out:
    nb_free(&b);
    return rc;
}

/* ---- groups and point to point ----------------------------------------------- */

static int run_group_ring(struct tc *c)
{
    const size_t bytes = 8u << 20; /* far beyond socket buffers: ungrouped, this deadlocks */
    int next = (c->rank + 1) % c->p, prev = (c->rank + c->p - 1) % c->p;
    uint8_t *s = malloc(bytes), *r = malloc(bytes), *w = malloc(bytes);
    int rc = -1;
    if (!s || !r || !w) {
        weft_test_fail(c->rank, "out of memory");
        goto out;
    }
    weft_test_fill_bytes(s, bytes, c->rank, 0x7171);
    weft_test_fill_bytes(w, bytes, prev, 0x7171);
    memset(r, POISON, bytes);
    CALL(c, "weft_group_start", weft_group_start());
    CALL(c, "weft_send (ring, grouped)", weft_send(s, bytes, WEFT_UINT8, next, c->comm));
    CALL(c, "weft_recv (ring, grouped)", weft_recv(r, bytes, WEFT_UINT8, prev, c->comm));
    CALL(c, "weft_group_end (ring)", weft_group_end());
    check_bytes(c, "group ring 8 MiB", r, w, bytes, 1);
    rc = 0;
out:
    free(s);
    free(r);
    free(w);
    return rc;
}

static int run_group_alltoall(struct tc *c)
{
    const size_t n = 1001;
    int p = c->p;
    int32_t *s = malloc(n * (size_t)p * 4), *r = malloc(n * (size_t)p * 4);
    if (!s || !r) {
        free(s);
        free(r);
        return weft_test_fail(c->rank, "out of memory"), -1;
    }
    for (int q = 0; q < p; q++)
        for (size_t j = 0; j < n; j++) {
            s[(size_t)q * n + j] = c->rank * 1000003 + q * 1009 + (int32_t)j;
            r[(size_t)q * n + j] = -1;
        }
    CALL(c, "weft_group_start", weft_group_start());
    for (int q = 0; q < p; q++) {
        if (q == c->rank)
            continue;
        CALL(c, "weft_send (all-to-all)", weft_send(s + (size_t)q * n, n, WEFT_INT32, q, c->comm));
        CALL(c, "weft_recv (all-to-all)", weft_recv(r + (size_t)q * n, n, WEFT_INT32, q, c->comm));
    }
    CALL(c, "weft_group_end (all-to-all)", weft_group_end());
    for (int q = 0; q < p; q++) {
        if (q == c->rank)
            continue;
        for (size_t j = 0; j < n; j++)
            if (r[(size_t)q * n + j] != q * 1000003 + c->rank * 1009 + (int32_t)j) {
                report(c, "group all-to-all p=%d: from rank %d [%zu]: expected %d, got %d", p, q,
                       j, q * 1000003 + c->rank * 1009 + (int32_t)j, r[(size_t)q * n + j]);
                break;
            }
    }
    free(s);
    free(r);
    return 0;
}

/* Several collectives in one group: queued, then run together. */
static int run_group_colls(struct tc *c)
{
    int32_t a[1000], asum[1000];
    double m[10], mmax[10];
    int64_t bc[300];
    for (int j = 0; j < 1000; j++)
        a[j] = c->rank + j;
    for (int j = 0; j < 10; j++)
        m[j] = (double)((c->rank * 7 + j) % 11);
    for (int j = 0; j < 300; j++)
        bc[j] = c->rank == 0 ? (int64_t)j * 1000000007 : -1;
    CALL(c, "weft_group_start", weft_group_start());
    CALL(c, "grouped allreduce", weft_allreduce(a, asum, 1000, WEFT_INT32, WEFT_SUM, c->comm));
    CALL(c, "grouped allreduce", weft_allreduce(m, mmax, 10, WEFT_FLOAT64, WEFT_MAX, c->comm));
    CALL(c, "grouped broadcast", weft_broadcast(bc, bc, 300, WEFT_INT64, 0, c->comm));
    CALL(c, "weft_group_end (collectives)", weft_group_end());
    for (int j = 0; j < 1000; j++)
        if (asum[j] != c->p * (c->p - 1) / 2 + c->p * j) {
            report(c, "grouped allreduce [%d]: expected %d, got %d", j,
                   c->p * (c->p - 1) / 2 + c->p * j, asum[j]);
            break;
        }
    for (int j = 0; j < 10; j++) {
        double mx = 0;
        for (int q = 0; q < c->p; q++)
            mx = fmax(mx, (double)((q * 7 + j) % 11));
        if (mmax[j] != mx) {
            report(c, "grouped allreduce max [%d]: expected %g, got %g", j, mx, mmax[j]);
            break;
        }
    }
    for (int j = 0; j < 300; j++)
        if (bc[j] != (int64_t)j * 1000000007) {
            report(c, "grouped broadcast [%d]: expected %lld, got %lld", j,
                   (long long)j * 1000000007, (long long)bc[j]);
            break;
        }
    return 0;
}

/* Pairs (0,1), (2,3)...: blocking send/recv of 0, 1 and LARGE elements
 * (even ranks send first), then isend/irecv both ways at once. */
static int run_p2p(struct tc *c)
{
    static const size_t counts[] = {0, 1, LARGE};
    char what[128];
    /* To oneself: grouped (alone, a blocking send would wait for its recv). */
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(counts); k++) {
        size_t n = counts[k];
        snprintf(what, sizeof(what), "p2p p=%d rank %d to itself n=%zu", c->p, c->rank, n);
        weft_test_fill_bytes(c->snd, n * 8, c->rank, 0x5e1f + k);
        poison_rcv(c, n * 8);
        CALL(c, "weft_group_start", weft_group_start());
        CALL(c, what, weft_send(c->snd, n, WEFT_FLOAT64, c->rank, c->comm));
        CALL(c, what, weft_recv(c->rcv, n, WEFT_FLOAT64, c->rank, c->comm));
        CALL(c, what, weft_group_end());
        check_bytes(c, what, c->rcv, c->snd, n * 8, 8);
        check_guards(c, what, n * 8);
    }
    int peer = c->rank ^ 1;
    if (peer >= c->p)
        return 0;
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(counts); k++) {
        size_t n = counts[k], bytes = n * 8;
        snprintf(what, sizeof(what), "p2p p=%d %d<->%d n=%zu", c->p, c->rank, peer, n);
        weft_test_fill_bytes(c->snd, bytes, c->rank, 0x99 + k);
        weft_test_fill_bytes(c->want, bytes, peer, 0x99 + k);
        poison_rcv(c, bytes);
        for (int phase = 0; phase < 2; phase++) {
            if ((phase == 0) == (c->rank % 2 == 0))
                CALL(c, what, weft_send(c->snd, n, WEFT_FLOAT64, peer, c->comm));
            else
                CALL(c, what, weft_recv(c->rcv, n, WEFT_FLOAT64, peer, c->comm));
        }
        check_bytes(c, what, c->rcv, c->want, bytes, 8);
        check_guards(c, what, bytes);
        poison_rcv(c, bytes);
        weft_request_t rq, sq;
        CALL(c, what, weft_irecv(c->rcv, n, WEFT_FLOAT64, peer, c->comm, &rq));
        CALL(c, what, weft_isend(c->snd, n, WEFT_FLOAT64, peer, c->comm, &sq));
        CALL(c, what, weft_wait(sq));
        CALL(c, what, weft_wait(rq));
        check_bytes(c, what, c->rcv, c->want, bytes, 8);
        check_guards(c, what, bytes);
    }
    return 0;
}

/* ---- the job ------------------------------------------------------------------ */

static int p2p_steps(struct tc *c, void *arg)
{
    (void)arg;
    if (run_nonblocking(c))
        return 1;
    if (c->p > 1 && (run_group_ring(c) || run_group_alltoall(c)))
        return 1;
    return run_group_colls(c) || run_p2p(c);
}

static int p2p_body(weft_comm_t comm, int rank, int p, void *arg)
{
    return tc_job(comm, rank, p, p2p_steps, arg);
}

/* The non-blocking batches, each on a new communicator split from comm:
 * every batch 1 and 2 then runs the first calls of fresh size classes,
 * whose plans (the measurement's untimed calls, one candidate each) differ
 * from collective to collective while all six are in flight. */
static int fresh_comms_steps(struct tc *c, void *arg)
{
    weft_comm_t comm = c->comm;
    for (int k = 0; k < *(const int *)arg; k++) {
        weft_comm_t sub = NULL;
        CALL(c, "weft_comm_split", weft_comm_split(comm, 0, c->rank, &sub));
        c->comm = sub;
        int bad = run_nonblocking(c);
        c->comm = comm;
        CALL(c, "weft_comm_destroy", weft_comm_destroy(sub));
        if (bad)
            return 1;
    }
    return 0;
}

static int fresh_comms_body(weft_comm_t comm, int rank, int p, void *arg)
{
    return tc_job(comm, rank, p, fresh_comms_steps, arg);
}

/* Runs one p-rank job of body; chunk, slots and streams set
 * WEFT_CHUNK_SIZE, WEFT_STAGING_SLOTS and WEFT_SOCKET_NSTREAMS where not
 * NULL.  Parameters are read once per process, and each Test runs in its
 * own. */
static void run_job(int p, const char *chunk, const char *slots, const char *streams,
                    weft_test_body_t body, void *arg)
{
    if (chunk)
        setenv("WEFT_CHUNK_SIZE", chunk, 1);
    if (slots)
        setenv("WEFT_STAGING_SLOTS", slots, 1);
    if (streams)
        setenv("WEFT_SOCKET_NSTREAMS", streams, 1);
    int rc = weft_test_run(p, 90, body, arg);
    cr_assert_eq(rc, 0, "the %d-rank job failed (see the rank messages above)", p);
}

static void run_p2p_job(int p, const char *chunk, const char *slots, const char *streams)
{
    run_job(p, chunk, slots, streams, p2p_body, NULL);
}

Test(p2p, ranks_1, .timeout = 100) { run_p2p_job(1, NULL, NULL, NULL); }
Test(p2p, ranks_2, .timeout = 100) { run_p2p_job(2, NULL, NULL, NULL); }
Test(p2p, ranks_3, .timeout = 100) { run_p2p_job(3, NULL, NULL, NULL); }
Test(p2p, ranks_4, .timeout = 100) { run_p2p_job(4, NULL, NULL, NULL); }
Test(p2p, ranks_5, .timeout = 100) { run_p2p_job(5, NULL, NULL, NULL); }
Test(p2p, ranks_7, .timeout = 100) { run_p2p_job(7, NULL, NULL, NULL); }
Test(p2p, ranks_8, .timeout = 100) { run_p2p_job(8, NULL, NULL, NULL); }
/* The pipeline cut fine, several TCP streams per peer, tiny chunks. */
Test(p2p, ranks_4_chunk_4k_slots_2, .timeout = 100) { run_p2p_job(4, "4096", "2", NULL); }
Test(p2p, ranks_5_streams_4_chunk_64k, .timeout = 100) { run_p2p_job(5, "65536", NULL, "4"); }
Test(p2p, ranks_2_chunk_256, .timeout = 100) { run_p2p_job(2, "256", NULL, NULL); }

/* Six collectives in flight at once, each with its own plan, on two
 * staging slots: a later op's receive-reduces must never hold the slots
 * the oldest op needs while their senders wait on that op (engine.c
 * post_ready; before, this job hung in each of 4 runs). */
Test(p2p, ranks_4_fresh_plans_in_flight_slots_2, .timeout = 100)
{
    int comms = 12;
    run_job(4, "4096", "2", NULL, fresh_comms_body, &comms);
}
