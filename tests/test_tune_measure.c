/*
 * test_tune_measure.c - measured selection in real jobs: the first calls of
 * a size class time the candidate plans, every rank settles on the same
 * one, and no call is lost or wrong on the way, whether the calls block,
 * are in flight together, sit in a group or go through WEFT_CHECK; a rank
 * that dies mid-measurement fails the others instead of hanging them;
 * each run of trials starts on every rank together; weft_comm_set_algo
 * changes the set a communicator chooses from.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"
#include "harness.h"
#include "select/tune.h"

/* These calls are small: without this the shared-memory one-exchange path
 * (src/ll.c) would run them and no plan would be chosen or measured. */
__attribute__((constructor)) static void plans_not_ll(void)
{
    setenv("WEFT_SHM_LL_BYTES", "0", 1);
}

/* More than the untimed calls and trials (6 candidates x (1 + 3), or 3 x
 * (1 + 6), here) and the exchange. */
#define CALLS 32
#define TIMEOUT_S 120

enum mode { BLOCKING, BURST, GROUP };

static const size_t counts[] = {2, 16384, 262144}; /* floats: 8 B, 64 KiB, 1 MiB */

/* Call k's input on rank r: small integers, so any order of sums is exact. */
static float input(int r, int k, size_t j)
{
    return (float)(r + k + (int)(j % 7));
}

static int check_sum(int rank, int p, int k, size_t count, const float *got)
{
    for (size_t j = 0; j < count; j++) {
        float want = (float)(p * (p - 1) / 2 + p * (k + (int)(j % 7)));
        if (got[j] != want)
            return weft_test_fail(rank, "call %d of %zu floats: [%zu] = %g, want %g", k, count, j,
                                  (double)got[j], (double)want);
    }
    return 0;
}

/* CALLS allreduces of count floats, run the way mode says, each checked;
 * in a burst an allgather of 3 ints rides along every call (another
 * class, measured at the same time). */
static int run_calls(weft_comm_t comm, int rank, int p, enum mode mode, size_t count)
{
    float *s = malloc(CALLS * count * sizeof(float)), *r = malloc(CALLS * count * sizeof(float));
    int *gs = malloc(CALLS * 3 * sizeof(int)), *gr = malloc(CALLS * 3 * (size_t)p * sizeof(int));
    weft_request_t req[2 * CALLS];
    int fails = 0;
    if (!s || !r || !gs || !gr) {
        fails = weft_test_fail(rank, "out of memory");
        goto out;
    }
    for (int k = 0; k < CALLS; k++)
        for (size_t j = 0; j < count; j++)
            s[k * count + j] = input(rank, k, j);
    if (mode == GROUP)
        WT_CHECK_OK(rank, comm, "group start", weft_group_start());
    for (int k = 0; k < CALLS && !fails; k++) {
        float *sk = s + k * count, *rk = r + k * count;
        /* Every third call in place. */
        const float *src = k % 3 == 2 ? rk : sk;
        if (src == rk)
            memcpy(rk, sk, count * sizeof(float));
        switch (mode) {
        case BLOCKING:
        case GROUP:
            WT_CHECK_OK(rank, comm, "allreduce",
                        weft_allreduce(src, rk, count, WEFT_FLOAT32, WEFT_SUM, comm));
            if (mode == BLOCKING)
                fails += check_sum(rank, p, k, count, rk);
            break;
        case BURST:
            for (int i = 0; i < 3; i++)
                gs[3 * k + i] = rank * 10 + k + i;
            WT_CHECK_OK(rank, comm, "iallreduce",
                        weft_iallreduce(src, rk, count, WEFT_FLOAT32, WEFT_SUM, comm, &req[2 * k]));
            WT_CHECK_OK(rank, comm, "iallgather",
                        weft_iallgather(gs + 3 * k, gr + 3 * k * p, 3, WEFT_INT32, comm,
                                        &req[2 * k + 1]));
            break;
        }
    }
    if (mode == GROUP)
        WT_CHECK_OK(rank, comm, "group end", weft_group_end());
    if (mode == BURST)
        for (int k = 0; k < 2 * CALLS; k++)
            WT_CHECK_OK(rank, comm, "wait", weft_wait(req[k]));
    for (int k = 0; mode != BLOCKING && k < CALLS && !fails; k++) {
        fails += check_sum(rank, p, k, count, r + k * count);
        for (int q = 0; mode == BURST && q < p && !fails; q++)
            for (int i = 0; i < 3; i++)
                if (gr[3 * k * p + 3 * q + i] != q * 10 + k + i)
                    fails += weft_test_fail(rank, "allgather %d: block of rank %d wrong", k, q);
    }
out:
    free(s);
    free(r);
    free(gs);
    free(gr);
    return fails;
}

/* The class of count floats has settled, on the same plan on every rank,
 * one of those it may run; measured when there was a choice. */
static int check_settled(weft_comm_t comm, int rank, int p, int coll, size_t count, size_t esize)
{
    int cls = weft_tune_class(count * esize), e = weft_tune_esize_index(esize);
    int32_t mine = atomic_load(&comm->tune.plan[coll][e][cls]);
    if (!(mine & 0x10000))
        return weft_test_fail(rank, "%s of %zu elements: no plan settled", weft_coll_name(coll),
                              count);
    struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    int n = weft_tune_plans(comm, coll, count, esize, plans), k = 0;
    while (k < n && !(plans[k].algo == (mine & 0xff) && plans[k].variant == ((mine >> 8) & 0xff)))
        k++;
    if (k == n)
        return weft_test_fail(rank, "%s of %zu elements settled on plan 0x%x, not a candidate",
                              weft_coll_name(coll), count, (unsigned)mine);
    struct weft_tune_measure *m = comm->tune.measure[coll][e][cls];
    if (n >= 2 &&
        (m == NULL || !atomic_load(&m->decided) || m->issued < m->ncand * (1 + m->reps)))
        return weft_test_fail(rank, "%s of %zu elements: %d candidates but no finished "
                              "measurement", weft_coll_name(coll), count, n);
    int32_t *all = calloc((size_t)p, sizeof(int32_t));
    if (all == NULL)
        return weft_test_fail(rank, "out of memory");
    weft_status_t st = weft_allgather(&mine, all, 1, WEFT_INT32, comm);
    int fails = weft_test_expect_status(rank, comm, "allgather of the plans", st, WEFT_OK);
    for (int q = 0; q < p && !fails; q++)
        if (all[q] != mine)
            fails = weft_test_fail(rank, "%s of %zu elements: rank %d settled on 0x%x, rank %d "
                                   "on 0x%x", weft_coll_name(coll), count, q, (unsigned)all[q],
                                   rank, (unsigned)mine);
    free(all);
    return fails;
}

static int settle_body(weft_comm_t comm, int rank, int p, void *arg)
{
    enum mode mode = *(enum mode *)arg;
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(counts); i++) {
        if (run_calls(comm, rank, p, mode, counts[i]))
            return 1;
        if (check_settled(comm, rank, p, WEFT_COLL_ALLREDUCE, counts[i], 4))
            return 1;
    }
    if (mode == BURST && check_settled(comm, rank, p, WEFT_COLL_ALLGATHER, 3, 4))
        return 1;
    return 0;
}

/* rounds: 1, each candidate's 3 calls in one run; 3, three candidates 6
 * calls each in 3 rounds of 2 (18 trials). */
static void settle(int p, enum mode mode, const char *transport, const char *check, int rounds)
{
    setenv("WEFT_TIMEOUT_MS", "30000", 1);
    setenv("WEFT_TUNE_TRIALS", rounds > 1 ? "6" : "3", 1);
    if (rounds > 1)
        setenv("WEFT_TUNE_CANDIDATES", "3", 1);
    if (transport)
        setenv("WEFT_TRANSPORT", transport, 1);
    if (check) {
        setenv("WEFT_CHECK", check, 1);
        setenv("WEFT_DEBUG", "NONE", 1);
    }
    cr_assert_eq(weft_test_run(p, TIMEOUT_S, settle_body, &mode), 0,
                 "see the rank messages above");
}

Test(measure, blocking_3, .timeout = TIMEOUT_S) { settle(3, BLOCKING, NULL, NULL, 1); }
Test(measure, blocking_in_rounds_3, .timeout = TIMEOUT_S) { settle(3, BLOCKING, NULL, NULL, 3); }
Test(measure, in_flight_together_5, .timeout = TIMEOUT_S) { settle(5, BURST, NULL, NULL, 1); }
Test(measure, in_flight_in_rounds_4, .timeout = TIMEOUT_S) { settle(4, BURST, NULL, NULL, 3); }
Test(measure, in_a_group_4, .timeout = TIMEOUT_S) { settle(4, GROUP, NULL, NULL, 1); }
Test(measure, with_fingerprints_4, .timeout = TIMEOUT_S) { settle(4, BURST, NULL, "1", 3); }
Test(measure, over_tcp_3, .timeout = TIMEOUT_S) { settle(3, BLOCKING, "tcp", NULL, 1); }

/* Runs body on p ranks with WEFT_TUNE_TRIALS=trials (NULL: the default)
 * and WEFT_CHECK=check (NULL: off), quietly. */
static void job(int p, const char *trials, const char *check, weft_test_body_t body)
{
    setenv("WEFT_TIMEOUT_MS", "30000", 1);
    if (trials)
        setenv("WEFT_TUNE_TRIALS", trials, 1);
    if (check)
        setenv("WEFT_CHECK", check, 1);
    setenv("WEFT_DEBUG", "NONE", 1);
    cr_assert_eq(weft_test_run(p, TIMEOUT_S, body, NULL), 0, "see the rank messages above");
}

/* WEFT_TUNE_TRIALS=0: the model's plan at once, nothing measured. */
static int off_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(counts); i++) {
        if (run_calls(comm, rank, p, BLOCKING, 3) || run_calls(comm, rank, p, BLOCKING, counts[i]))
            return 1;
        int cls = weft_tune_class(counts[i] * 4);
        struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
        int n = weft_tune_plans(comm, WEFT_COLL_ALLREDUCE, counts[i], 4, plans);
        int32_t got = atomic_load(&comm->tune.plan[WEFT_COLL_ALLREDUCE][weft_tune_esize_index(4)][cls]);
        if (n != 1 || comm->tune.measure[WEFT_COLL_ALLREDUCE][weft_tune_esize_index(4)][cls] != NULL ||
            got != (0x10000 | plans[0].variant << 8 | plans[0].algo))
            return weft_test_fail(rank, "%zu floats: %d candidates, plan 0x%x, measured %s",
                                  counts[i], n, (unsigned)got,
                                  comm->tune.measure[WEFT_COLL_ALLREDUCE][weft_tune_esize_index(4)][cls] ? "yes" : "no");
    }
    return 0;
}

Test(measure, zero_trials_is_the_model_alone, .timeout = TIMEOUT_S)
{
    setenv("WEFT_TUNE_TRIALS", "0", 1);
    cr_assert_eq(weft_test_run(3, TIMEOUT_S, off_body, NULL), 0, "see the rank messages above");
}

/* The last rank leaves after two trials; the others queue every call of
 * the class, the exchange among them, and must see each fail. */
static int death_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    const size_t count = 4096;
    float *s = calloc(count, sizeof(float)), *r = calloc(CALLS * count, sizeof(float));
    weft_request_t req[CALLS];
    if (!s || !r)
        return weft_test_fail(rank, "out of memory");
    for (int k = 0; k < 2; k++)
        WT_CHECK_OK(rank, comm, "trial", weft_allreduce(s, r, count, WEFT_FLOAT32, WEFT_SUM, comm));
    if (rank == p - 1)
        _exit(0); /* no goodbye: as if killed */
    int failed = 0;
    for (int k = 0; k < CALLS; k++)
        WT_CHECK_OK(rank, comm, "iallreduce",
                    weft_iallreduce(s, r + k * count, count, WEFT_FLOAT32, WEFT_SUM, comm,
                                    &req[k]));
    for (int k = 0; k < CALLS; k++)
        failed += weft_wait(req[k]) != WEFT_OK;
    free(s);
    free(r);
    if (failed != CALLS)
        return weft_test_fail(rank, "%d of %d calls after the death failed", failed, CALLS);
    /* Passed.  The harness's weft_comm_destroy would report the failed
     * communicator as an error of its own. */
    _exit(0);
}

Test(measure, a_death_mid_measurement_fails_every_call, .timeout = TIMEOUT_S)
{
    setenv("WEFT_TIMEOUT_MS", "20000", 1);
    setenv("WEFT_TUNE_TRIALS", "2", 1);
    setenv("WEFT_DEBUG", "NONE", 1);
    cr_assert_eq(weft_test_run(3, TIMEOUT_S, death_body, NULL), 0, "see the rank messages above");
}

/* Broadcasts of 8 bytes from rank 0, two candidates, 4 trials each in 2
 * rounds, after one untimed call each (calls 0 and 1): runs of 2 calls
 * start at calls 2, 4, 6 and 8.  The last rank
 * comes late to each of them, just after finishing the call before.  The root's sends fit the transport's
 * buffers, so only the barrier before a run can hold it: its first call
 * of each run must wait for the late rank, whatever the plan. */
#define LATE_MS 300

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int late_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    float x[2] = {1, 2};
    /* Two plans the model always puts within reach of each other (on one
     * host the hierarchical ring is the ring). */
    WT_CHECK_OK(rank, comm, "set_algo", weft_comm_set_algo(comm, "broadcast:ring,hier/ring"));
    for (int i = 0; i < 8; i++) {
        bool starts = i % 2 == 0;
        for (double t = now_ms(); rank == p - 1 && starts && now_ms() - t < LATE_MS;)
            usleep(10000); /* a signal may cut one short */
        double t0 = now_ms();
        WT_CHECK_OK(rank, comm, "broadcast", weft_broadcast(x, x, 2, WEFT_FLOAT32, 0, comm));
        double ms = now_ms() - t0;
        if (x[0] != 1 || x[1] != 2)
            return weft_test_fail(rank, "trial %d: got %g %g", i, x[0], x[1]);
        struct weft_tune_measure *m =
            comm->tune.measure[WEFT_COLL_BROADCAST][weft_tune_esize_index(4)][weft_tune_class(8)];
        if (m == NULL || m->ncand != 2 || m->reps != 4 || m->rounds != 2)
            return weft_test_fail(rank, "measured %s (%d candidates, %d calls in %d rounds), "
                                  "expected 2, 4 in 2", m ? "yes" : "no", m ? m->ncand : 0,
                                  m ? m->reps : 0, m ? m->rounds : 0);
        /* Not call 0, an untimed one with no barrier. */
        if (rank == 0 && starts && i > 0 && ms < LATE_MS / 2)
            return weft_test_fail(rank, "call %d starts a run but returned after %.1f ms, "
                                  "before the last rank came (%d ms late)", i, ms, LATE_MS);
    }
    return 0;
}

Test(measure, each_run_of_trials_starts_on_every_rank_together_3, .timeout = TIMEOUT_S)
{ job(3, "4", NULL, late_body); }

/* Broadcasts of 8 bytes as in late_body (runs of 2 from call 2: trials
 * 0-7 are calls 2-9), and an allreduce, another class, between calls 2
 * and 3 and between calls 5 and 6, and rank 0 pausing 20 ms before call
 * 9.  Every rank stores trial 1 negated, as cut from its run's call
 * before, and rank 0 trial 7 too; no rank cuts a run's first trial (0, 2,
 * 4, 6), behind its barrier, though 4 follows an allreduce.  (Another
 * trial may be cut by a long enough preemption: not checked.) */
static int cut_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    (void)p;
    float x[2] = {1, 2}, y = 1;
    WT_CHECK_OK(rank, comm, "set_algo", weft_comm_set_algo(comm, "broadcast:ring,hier/ring"));
    for (int i = 0; i < 12; i++) {
        if (i == 3 || i == 6)
            WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(&y, &y, 1, WEFT_FLOAT32, WEFT_SUM,
                                                                comm));
        if (i == 9 && rank == 0)
            usleep(20000);
        WT_CHECK_OK(rank, comm, "broadcast", weft_broadcast(x, x, 2, WEFT_FLOAT32, 0, comm));
    }
    struct weft_tune_measure *m =
        comm->tune.measure[WEFT_COLL_BROADCAST][weft_tune_esize_index(4)][weft_tune_class(8)];
    if (m == NULL || !atomic_load(&m->decided) || m->reps != 4 || m->rounds != 2)
        return weft_test_fail(rank, "no finished measurement of 4 calls in 2 rounds");
    for (int i = 0; i < m->ncand * m->reps; i++) {
        bool cut = isfinite(m->t[i]) && signbit(m->t[i]);
        if (i % 2 == 0 ? cut : !cut && (i == 1 || (i == 7 && rank == 0)))
            return weft_test_fail(rank, "trial %d: %g, expected %s", i, m->t[i],
                                  i % 2 ? "negated (cut)" : "a time");
    }
    return 0;
}

Test(measure, a_call_of_another_class_cuts_a_run_3, .timeout = TIMEOUT_S)
{ job(3, "4", NULL, cut_body); }

/* In a group, rank 0 sends 4 MiB to rank 1, which receives it, and then
 * both run a trial.  The send cannot finish before the receive is posted,
 * and the barrier before a run waits for both: the receive must start
 * before it on rank 1 (a pair's messages match in issue order). */
static int group_send_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    const size_t big = 1 << 20, count = 16384;
    float *b = malloc(big * sizeof(float)), *x = malloc(count * sizeof(float));
    struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    if (!b || !x)
        return weft_test_fail(rank, "out of memory");
    if (weft_tune_plans(comm, WEFT_COLL_ALLREDUCE, count, 4, plans) < 2)
        return weft_test_fail(rank, "allreduce of 64 KiB has one candidate: nothing to measure");
    for (int k = 0; k < 8; k++) {
        for (size_t j = 0; j < big; j++)
            b[j] = rank == 0 ? (float)(k + j % 1000) : -1;
        for (size_t j = 0; j < count; j++)
            x[j] = (float)(rank + 1);
        WT_CHECK_OK(rank, comm, "group start", weft_group_start());
        if (rank == 0)
            WT_CHECK_OK(rank, comm, "send", weft_send(b, big, WEFT_FLOAT32, 1, comm));
        else
            WT_CHECK_OK(rank, comm, "recv", weft_recv(b, big, WEFT_FLOAT32, 0, comm));
        WT_CHECK_OK(rank, comm, "allreduce",
                    weft_allreduce(x, x, count, WEFT_FLOAT32, WEFT_SUM, comm));
        WT_CHECK_OK(rank, comm, "group end", weft_group_end());
        for (size_t j = 0; j < count; j++)
            if (x[j] != (float)(p * (p + 1) / 2))
                return weft_test_fail(rank, "call %d: element %zu is %g", k, j, x[j]);
        for (size_t j = 0; rank == 1 && j < big; j++)
            if (b[j] != (float)(k + j % 1000))
                return weft_test_fail(rank, "call %d: received element %zu is %g", k, j, b[j]);
    }
    free(b);
    free(x);
    return 0;
}

Test(measure, a_send_in_a_group_before_a_run_of_trials_2, .timeout = TIMEOUT_S)
{ job(2, "2", NULL, group_send_body); }

/* ---- weft_comm_set_algo ----------------------------------------------------------- */

/* The one plan comm may run for allreduces of count floats, or -1 when
 * it has a choice. */
static int only_plan(weft_comm_t comm, size_t count)
{
    struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    int n = weft_tune_plans(comm, WEFT_COLL_ALLREDUCE, count, 4, plans);
    return n == 1 ? plans[0].variant << 8 | plans[0].algo : -1;
}

static int set_algo_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    const size_t count = counts[1];
    const int doubling = 1 << 8 | WEFT_ALGO_RHD; /* rhd/doubling */
    if (run_calls(comm, rank, p, BLOCKING, count) ||
        check_settled(comm, rank, p, WEFT_COLL_ALLREDUCE, count, 4))
        return 1;
    /* Calls in flight finish (with their plans) before the set changes. */
    float *s = malloc(4 * count * sizeof(float)), *r = malloc(4 * count * sizeof(float));
    weft_request_t req[4];
    if (!s || !r)
        return weft_test_fail(rank, "out of memory");
    for (size_t j = 0; j < 4 * count; j++)
        s[j] = input(rank, (int)(j / count), j % count);
    for (int k = 0; k < 4; k++)
        WT_CHECK_OK(rank, comm, "iallreduce",
                    weft_iallreduce(s + k * count, r + k * count, count, WEFT_FLOAT32, WEFT_SUM,
                                    comm, &req[k]));
    WT_CHECK_OK(rank, comm, "set_algo", weft_comm_set_algo(comm, "allreduce:rhd/doubling"));
    int fails = 0;
    for (int k = 0; k < 4; k++) {
        WT_CHECK_OK(rank, comm, "wait", weft_wait(req[k]));
        fails += check_sum(rank, p, k, count, r + k * count);
    }
    free(s);
    free(r);
    if (fails)
        return 1;
    int cls = weft_tune_class(count * 4);
    if (atomic_load(&comm->tune.plan[WEFT_COLL_ALLREDUCE][weft_tune_esize_index(4)][cls]) != 0 ||
        comm->tune.measure[WEFT_COLL_ALLREDUCE][weft_tune_esize_index(4)][cls] != NULL)
        return weft_test_fail(rank, "the choice made before weft_comm_set_algo was kept");
    if (only_plan(comm, count) != doubling)
        return weft_test_fail(rank, "after set_algo(rhd/doubling): plan 0x%x", only_plan(comm, count));
    if (run_calls(comm, rank, p, BLOCKING, count) ||
        check_settled(comm, rank, p, WEFT_COLL_ALLREDUCE, count, 4))
        return 1;
    if ((atomic_load(&comm->tune.plan[WEFT_COLL_ALLREDUCE][weft_tune_esize_index(4)][cls]) & 0xffff) != doubling)
        return weft_test_fail(rank, "allreduce did not run rhd/doubling");

    /* Refusals change nothing. */
    if (weft_test_expect_status(rank, comm, "set_algo(bad)",
                                weft_comm_set_algo(comm, "tree;allreduce:frobnicate"),
                                WEFT_ERR_INVALID_ARG))
        return 1;
    if (!strstr(weft_last_error(comm), "frobnicate"))
        return weft_test_fail(rank, "the error does not name the bad algorithm: %s",
                              weft_last_error(comm));
    WT_CHECK_OK(rank, comm, "group start", weft_group_start());
    weft_status_t st = weft_comm_set_algo(comm, "ring");
    WT_CHECK_OK(rank, comm, "group end", weft_group_end());
    if (weft_test_expect_status(rank, comm, "set_algo in a group", st, WEFT_ERR_INVALID_ARG))
        return 1;
    if (!strstr(weft_last_error(comm), "group"))
        return weft_test_fail(rank, "in a group: %s", weft_last_error(comm));
    if (only_plan(comm, count) != doubling)
        return weft_test_fail(rank, "a refused set_algo changed the set");
    if (weft_test_expect_status(rank, NULL, "set_algo(NULL comm)",
                                weft_comm_set_algo(NULL, "ring"), WEFT_ERR_INVALID_ARG))
        return 1;

    /* A child of split starts with its parent's set. */
    weft_comm_t child;
    WT_CHECK_OK(rank, comm, "split", weft_comm_split(comm, 0, rank, &child));
    int inherited = only_plan(child, count);
    WT_CHECK_OK(rank, comm, "destroy child", weft_comm_destroy(child));
    if (inherited != doubling)
        return weft_test_fail(rank, "the child of split runs 0x%x", inherited);

    /* NULL: every plan again, measured anew. */
    WT_CHECK_OK(rank, comm, "set_algo(NULL)", weft_comm_set_algo(comm, NULL));
    if (only_plan(comm, count) != -1)
        return weft_test_fail(rank, "after set_algo(NULL) one plan only");
    return run_calls(comm, rank, p, BLOCKING, count) ||
           check_settled(comm, rank, p, WEFT_COLL_ALLREDUCE, count, 4);
}

Test(measure, set_algo_changes_the_choice_4, .timeout = TIMEOUT_S)
{
    setenv("WEFT_TIMEOUT_MS", "30000", 1);
    setenv("WEFT_TUNE_TRIALS", "3", 1);
    cr_assert_eq(weft_test_run(4, TIMEOUT_S, set_algo_body, NULL), 0,
                 "see the rank messages above");
}

/* A 16 KiB allreduce that WEFT_CHECK must fail with a message holding
 * cause; then leaves (destroy would report the failed communicator). */
static int mismatch_named(weft_comm_t comm, int rank, const char *cause)
{
    float x[4096] = {0};
    weft_status_t st = weft_allreduce(x, x, 4096, WEFT_FLOAT32, WEFT_SUM, comm);
    if (weft_test_expect_status(rank, comm, "allreduce", st, WEFT_ERR_MISMATCH))
        return 1;
    if (!strstr(weft_last_error(comm), cause))
        return weft_test_fail(rank, "the mismatch does not name the cause: %s",
                              weft_last_error(comm));
    _exit(0);
}

/* Ranks that set different algorithms: WEFT_CHECK names the cause. */
static int set_algo_mismatch_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)p;
    (void)arg;
    WT_CHECK_OK(rank, comm, "set_algo",
                weft_comm_set_algo(comm, rank == 0 ? "ring" : "allreduce:rhd"));
    return mismatch_named(comm, rank, "weft_comm_set_algo");
}

Test(measure, set_algo_that_differs_between_ranks_is_reported_3, .timeout = TIMEOUT_S)
{ job(3, NULL, "1", set_algo_mismatch_body); }

/* Ranks that disagree on whether a class is measured, with the same first
 * plan: the fingerprint exchange names it before any barrier runs. */
static int trials_mismatch_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)p;
    (void)arg;
    struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    char spec[48];
    if (weft_tune_plans(comm, WEFT_COLL_ALLREDUCE, 4096, 4, plans) < 2)
        return weft_test_fail(rank, "allreduce of 16 KiB has one candidate: nothing to measure");
    snprintf(spec, sizeof(spec), "allreduce:");
    weft_plan_name(plans[0], spec + strlen(spec), sizeof(spec) - strlen(spec));
    if (rank == 0)
        WT_CHECK_OK(rank, comm, "set_algo", weft_comm_set_algo(comm, spec));
    return mismatch_named(comm, rank, "times plans for its size class here and rank 0 does not");
}

Test(measure, trials_on_some_ranks_only_are_reported_3, .timeout = TIMEOUT_S)
{ job(3, "4", "1", trials_mismatch_body); }
