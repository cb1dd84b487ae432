/*
 * test_ll.c - small collectives in one shared-memory exchange (src/ll.c):
 * which calls take the path and which the engine, the results (bitwise the
 * serial fold in rank order, in and out of place), the limit every rank
 * agrees on, and the failures: a peer killed or silent while we wait,
 * ranks whose calls differ, an abort from another thread, earlier
 * non-blocking operations.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "engine.h"
#include "harness.h"
#include "ll.h"

static void ll_env(void)
{
    weft_test_env();
    setenv("WEFT_TRANSPORT", "shm", 1);
    setenv("WEFT_TUNE_TRIALS", "0", 1);
    setenv("WEFT_DEBUG", "WARN", 1);
}

static uint64_t engine_ops(weft_comm_t comm)
{
    struct weft_engine_stats s;
    weft_engine_get_stats(comm, &s);
    return s.ops;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Rank r's element i, as int64: small enough that no sum wraps. */
static int64_t val(int r, size_t i)
{
    return (int64_t)((r + 1) * 1000 + (int64_t)(i % 997)) * ((i + (size_t)r) % 3 ? 1 : -1);
}

/* want[i] = the sum over ranks of element from + i. */
static void sums(int64_t *want, int p, size_t from, size_t count)
{
    for (size_t i = 0; i < count; i++) {
        want[i] = 0;
        for (int q = 0; q < p; q++)
            want[i] += val(q, from + i);
    }
}

/* One call of each collective at count elements of int64 (sum; root
 * p - 1), checked exactly; *ops gets the engine ops they took. */
static int five_calls(weft_comm_t comm, int rank, int p, size_t count, bool inplace,
                      uint64_t *ops)
{
    size_t all = count * (size_t)p;
    int64_t *snd = calloc(all, 8), *rcv = calloc(all, 8), *want = calloc(all, 8);
    if (!snd || !rcv || !want)
        return weft_test_fail(rank, "out of memory");
    int fails = 0, root = p - 1;
    uint64_t before = engine_ops(comm);
    for (int coll = 0; coll < 5 && !fails; coll++) {
        for (size_t i = 0; i < all; i++)
            snd[i] = val(rank, i), rcv[i] = -7;
        size_t n = count; /* elements of the result checked */
        const void *s = snd;
        void *r = rcv;
        weft_status_t st;
        const char *what;
        switch (coll) {
        case 0:
            what = "allreduce";
            sums(want, p, 0, count);
            if (inplace)
                r = snd;
            st = weft_allreduce(s, r, count, WEFT_INT64, WEFT_SUM, comm);
            break;
        case 1:
            what = "reduce_scatter";
            sums(want, p, (size_t)rank * count, count);
            if (inplace)
                r = snd + (size_t)rank * count;
            st = weft_reduce_scatter(s, r, count, WEFT_INT64, WEFT_SUM, comm);
            break;
        case 2:
            what = "allgather";
            n = all;
            for (int q = 0; q < p; q++)
                for (size_t i = 0; i < count; i++)
                    want[(size_t)q * count + i] = val(q, i);
            if (inplace) {
                memmove(rcv + (size_t)rank * count, snd, count * 8);
                s = rcv + (size_t)rank * count;
            }
            st = weft_allgather(s, r, count, WEFT_INT64, comm);
            break;
        case 3:
            what = "broadcast";
            for (size_t i = 0; i < count; i++)
                want[i] = val(root, i);
            if (inplace)
                r = snd;
            st = weft_broadcast(s, r, count, WEFT_INT64, root, comm);
            break;
        default:
            what = "reduce";
            sums(want, p, 0, count);
            if (inplace)
                r = snd;
            st = weft_reduce(s, r, count, WEFT_INT64, WEFT_SUM, root, comm);
            if (rank != root)
                n = 0;
            break;
        }
        if (weft_test_expect_status(rank, comm, what, st, WEFT_OK))
            fails++;
        else if (n > 0)
            fails += weft_test_check(rank, what, r, want, WEFT_INT64, n);
    }
    *ops = engine_ops(comm) - before;
    free(snd);
    free(rcv);
    free(want);
    return fails;
}

/* Up to the limit the five collectives skip the engine; one element more
 * and each is an engine op; both give exact results, in and out of place. */
static int boundary_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    size_t max = weft_ll_max(comm);
    if (max != 256)
        return weft_test_fail(rank, "limit %zu, want 256 (WEFT_SHM_LL_BYTES)", max);
    static const size_t counts[] = {1, 5, 32, 33, 200};
    int fails = 0;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++)
        for (int inplace = 0; inplace < 2; inplace++) {
            uint64_t ops;
            fails += five_calls(comm, rank, p, counts[k], inplace, &ops);
            uint64_t want = counts[k] * 8 <= max ? 0 : 5;
            if (ops != want)
                fails += weft_test_fail(rank, "count %zu%s: %llu engine ops, want %llu",
                                        counts[k], inplace ? " in place" : "",
                                        (unsigned long long)ops, (unsigned long long)want);
        }
    return fails ? 1 : 0;
}

Test(ll, used_up_to_the_limit_and_exact, .timeout = 90)
{
    ll_env();
    setenv("WEFT_SHM_LL_BYTES", "256", 1);
    cr_assert_eq(weft_test_run(2, 60, boundary_body, NULL), 0, "2 ranks: see above");
    cr_assert_eq(weft_test_run(5, 60, boundary_body, NULL), 0, "5 ranks: see above");
    cr_assert_eq(weft_test_run(7, 60, boundary_body, NULL), 0, "7 ranks: see above");
}

/* Float sums whose value depends on the order of the additions: every
 * rank gets the bits of the serial left fold over ranks 0..p-1. */
static int fold_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    enum { N = 16 };
    float in[N], out[N], want[N];
    int fails = 0;
    for (int rep = 0; rep < 50; rep++) {
        for (int i = 0; i < N; i++) {
            float big = (i + rep) % 2 ? 1e8f : -1e8f;
            in[i] = rank % 2 ? big : 1.0f + (float)rank * 0.37f;
            want[i] = 0;
        }
        for (int i = 0; i < N; i++) {
            float acc = 0;
            for (int q = 0; q < p; q++) {
                float big = (i + rep) % 2 ? 1e8f : -1e8f;
                float x = q % 2 ? big : 1.0f + (float)q * 0.37f;
                acc = q == 0 ? x : acc + x;
            }
            want[i] = acc;
        }
        WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(in, out, N, WEFT_FLOAT32, WEFT_SUM, comm));
        if (memcmp(out, want, sizeof(out)) != 0)
            fails += weft_test_fail(rank, "rep %d: %.9g, want the serial fold's %.9g", rep,
                                    (double)out[0], (double)want[0]);
        int64_t a = rank * 7 + rep, avg;
        WT_CHECK_OK(rank, comm, "avg", weft_allreduce(&a, &avg, 1, WEFT_INT64, WEFT_AVG, comm));
        int64_t sum = 0;
        for (int q = 0; q < p; q++)
            sum += q * 7 + rep;
        if (avg != sum / p)
            fails += weft_test_fail(rank, "avg %lld, want %lld", (long long)avg,
                                    (long long)(sum / p));
    }
    return fails ? 1 : 0;
}

Test(ll, reduces_in_rank_order, .timeout = 60)
{
    ll_env();
    cr_assert_eq(weft_test_run(3, 50, fold_body, NULL), 0, "see above");
    cr_assert_eq(weft_test_run(4, 50, fold_body, NULL), 0, "see above");
}

/* The limit is the least any rank gave its slots, so ranks with different
 * settings still choose alike. */
static int least_proc(int rank, int p, const weft_unique_id_t *id, void *arg)
{
    (void)arg;
    setenv("WEFT_SHM_LL_BYTES", rank == 1 ? "64" : "4096", 1);
    weft_comm_t comm;
    if (weft_test_child_init(&comm, p, id, rank) != 0)
        return 1;
    int fails = 0;
    if (weft_ll_max(comm) != 64)
        fails += weft_test_fail(rank, "limit %zu, want the least, 64", weft_ll_max(comm));
    uint64_t ops;
    fails += five_calls(comm, rank, p, 8, false, &ops);
    if (ops != 0)
        fails += weft_test_fail(rank, "64 bytes: %llu engine ops", (unsigned long long)ops);
    fails += five_calls(comm, rank, p, 9, false, &ops);
    if (ops != 5)
        fails += weft_test_fail(rank, "72 bytes: %llu engine ops, want 5", (unsigned long long)ops);
    weft_comm_destroy(comm);
    return fails ? 1 : 0;
}

Test(ll, limit_is_the_least_of_the_ranks, .timeout = 60)
{
    ll_env();
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 3, least_proc, NULL), 0);
    cr_assert_eq(weft_test_job_wait(&job, 50), 0, "see above");
}

/* Off when the caller forces an algorithm, asks for WEFT_CHECK, or sets
 * the limit to 0: those calls are engine ops. */
static int off_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    uint64_t ops;
    int fails = five_calls(comm, rank, p, 4, false, &ops);
    if (ops != 5)
        fails += weft_test_fail(rank, "%llu engine ops, want 5", (unsigned long long)ops);
    return fails ? 1 : 0;
}

Test(ll, off_when_forced_checked_or_zero, .timeout = 90)
{
    ll_env();
    setenv("WEFT_ALGO", "ring", 1);
    cr_assert_eq(weft_test_run(3, 40, off_body, NULL), 0, "WEFT_ALGO=ring: see above");
    unsetenv("WEFT_ALGO");
    setenv("WEFT_SHM_LL_BYTES", "0", 1);
    cr_assert_eq(weft_test_run(3, 40, off_body, NULL), 0, "WEFT_SHM_LL_BYTES=0: see above");
}

Test(ll, off_with_check, .timeout = 60)
{
    ll_env();
    setenv("WEFT_CHECK", "1", 1);
    cr_assert_eq(weft_test_run(2, 40, off_body, NULL), 0, "WEFT_CHECK=1: see above");
}

/* A non-blocking receive issued before a small collective that the peer
 * answers only after it: no deadlock, and the collective returns only
 * once the receive is done (calls complete in issue order). */
static int order_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    (void)p;
    enum { BIG = 1 << 20 };
    int32_t *big = calloc(BIG, 4);
    if (big == NULL)
        return weft_test_fail(rank, "out of memory");
    int64_t x = rank + 1, y = 0;
    int fails = 0;
    if (rank == 0) {
        weft_request_t req;
        WT_CHECK_OK(rank, comm, "irecv", weft_irecv(big, BIG, WEFT_INT32, 1, comm, &req));
        WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(&x, &y, 1, WEFT_INT64, WEFT_SUM, comm));
        int done = 0;
        weft_status_t st = weft_test(req, &done);
        if (!done)
            fails += weft_test_fail(rank, "the allreduce returned before the earlier irecv (%d)", st);
        else if (big[BIG - 1] != 42)
            fails += weft_test_fail(rank, "irecv: %d, want 42", big[BIG - 1]);
    } else {
        WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(&x, &y, 1, WEFT_INT64, WEFT_SUM, comm));
        usleep(50000);
        big[BIG - 1] = 42;
        WT_CHECK_OK(rank, comm, "send", weft_send(big, BIG, WEFT_INT32, 0, comm));
    }
    if (y != 3)
        fails += weft_test_fail(rank, "allreduce %lld, want 3", (long long)y);
    free(big);
    return fails ? 1 : 0;
}

Test(ll, after_earlier_nonblocking_calls, .timeout = 60)
{
    ll_env();
    cr_assert_eq(weft_test_run(2, 40, order_body, NULL), 0, "see above");
}

/* ---- failures ------------------------------------------------------------ */

enum fault { F_KILL, F_SILENT, F_MISMATCH, F_ABORT };
#define VICTIM 2

static void *abort_later(void *comm)
{
    usleep(200000);
    weft_comm_abort(comm);
    return NULL;
}

/* The victim dies, stays silent or calls with another count after 20
 * good calls; the others must fail with the right error, naming it, and
 * soon (killed: well before the 20 s timeout). */
static int fault_body(weft_comm_t comm, int rank, int p, void *arg)
{
    enum fault f = (enum fault)(intptr_t)arg;
    int64_t x[4] = {rank, rank, rank, rank}, y[4];
    for (int i = 0; i < 20; i++)
        WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(x, y, 2, WEFT_INT64, WEFT_SUM, comm));
    if (rank == VICTIM) {
        if (f == F_KILL)
            raise(SIGKILL);
        if (f == F_SILENT || f == F_ABORT) {
            sleep(f == F_SILENT ? 3 : 2);
            return 0;
        }
        weft_status_t st = weft_allreduce(x, y, 3, WEFT_INT64, WEFT_SUM, comm);
        return st == WEFT_OK ? weft_test_fail(rank, "a call of another count succeeded") : 0;
    }
    pthread_t t;
    if (f == F_ABORT && rank == 0)
        pthread_create(&t, NULL, abort_later, comm);
    double t0 = now_s();
    weft_status_t st = weft_allreduce(x, y, 2, WEFT_INT64, WEFT_SUM, comm);
    double took = now_s() - t0;
    if (f == F_ABORT && rank == 0)
        pthread_join(t, NULL);
    const char *msg = weft_last_error(comm);
    char victim[32];
    snprintf(victim, sizeof(victim), "rank %d", VICTIM);
    switch (f) {
    case F_KILL:
        if (st != WEFT_ERR_REMOTE || strstr(msg, victim) == NULL || took > 5)
            return weft_test_fail(rank, "killed peer: status %d after %.2f s: %s", st, took, msg);
        return 0;
    case F_SILENT:
        if (st != WEFT_ERR_TIMEOUT || strstr(msg, "receive from rank 2") == NULL)
            return weft_test_fail(rank, "silent peer: status %d: %s", st, msg);
        return 0;
    case F_MISMATCH:
        if (st == WEFT_OK)
            return weft_test_fail(rank, "calls of different counts succeeded");
        return 0;
    case F_ABORT:
        if (rank == 0 && (st != WEFT_ERR_ABORTED || took > 1.5))
            return weft_test_fail(rank, "abort: status %d after %.2f s: %s", st, took, msg);
        if (rank != 0 && st == WEFT_OK)
            return weft_test_fail(rank, "succeeded without rank %d", VICTIM);
        return 0;
    }
    return 1;
}

/* A failed communicator's destroy reports the failure: not this test's. */
static int fault_proc(int rank, int p, const weft_unique_id_t *id, void *arg)
{
    weft_comm_t comm;
    if (weft_test_child_init(&comm, p, id, rank) != 0)
        return 1;
    int rc = fault_body(comm, rank, p, arg);
    weft_comm_destroy(comm);
    return rc;
}

static int run_fault(enum fault f, const char *timeout_ms)
{
    ll_env();
    setenv("WEFT_TIMEOUT_MS", timeout_ms, 1);
    setenv("WEFT_DEBUG", "NONE", 1);
    struct weft_test_job job;
    if (weft_test_job_start_proc(&job, 3, fault_proc, (void *)(intptr_t)f) != 0)
        return -1;
    weft_test_job_wait(&job, 40);
    int fails = 0;
    for (int r = 0; r < 3; r++)
        if (r != VICTIM || f != F_KILL)
            fails += weft_test_job_exit_code(&job, r) != 0;
    return fails;
}

Test(ll, killed_peer_is_named_at_once, .timeout = 60)
{
    cr_assert_eq(run_fault(F_KILL, "20000"), 0, "see above");
}

Test(ll, silent_peer_times_out, .timeout = 60)
{
    cr_assert_eq(run_fault(F_SILENT, "500"), 0, "see above");
}

Test(ll, calls_that_differ_fail, .timeout = 60)
{
    cr_assert_eq(run_fault(F_MISMATCH, "3000"), 0, "see above");
}

Test(ll, abort_ends_the_wait, .timeout = 60)
{
    cr_assert_eq(run_fault(F_ABORT, "1500"), 0, "see above");
}
