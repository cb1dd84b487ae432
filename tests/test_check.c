/*
 * test_check.c - mismatch detection (WEFT_CHECK=1).  When one rank's call
 * differs in collective, count, dtype, op or root, every rank gets
 * WEFT_ERR_MISMATCH within a fraction of the (huge) timeout, before any
 * byte of the call lands, with a message naming the sequence number, the
 * first rank that differs from rank 0 and both calls; blocking, non-
 * blocking and grouped, on 2, 3 and 5 ranks, over shm, tcp and both.
 * Matching calls still give exact results, and with WEFT_CHECK unset the
 * engine sends exactly the messages of the schedules, nothing more.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algorithms/schedule.h"
#include "check.h"
#include "comm.h"
#include "engine.h"
#include "harness.h"
#include "select/tune.h"

#define MAX_COUNT 1024            /* elements of the largest call */
#define DETECT_S 2.0              /* a mismatch must be reported within this */
#define TIMEOUT_MS "60000"        /* what a hang would cost instead */

/* Parameters are read once per process: every Test sets them before its
 * job makes the id. */
static void check_env(const char *check)
{
    if (check)
        setenv("WEFT_CHECK", check, 1);
    else
        unsetenv("WEFT_CHECK");
    setenv("WEFT_TIMEOUT_MS", TIMEOUT_MS, 1);
    setenv("WEFT_DEBUG", "NONE", 0); /* each rank would log the mismatch it reports */
}

/* ---- one call, as data ---------------------------------------------------- */

struct call {
    int coll; /* enum weft_coll */
    size_t count;
    weft_dtype_t dt;
    weft_op_t op;
    int root;
};

/* How the message must spell a call: "reduce(count=64, float32, sum, root=1)". */
static const char *spell(const struct call *c, char *buf, size_t len)
{
    int o = snprintf(buf, len, "%s(count=%zu, %s", weft_coll_name(c->coll), c->count,
                     weft_test_dtype_name(c->dt));
    if (weft_coll_reduces(c->coll))
        o += snprintf(buf + o, len - (size_t)o, ", %s", weft_test_op_name(c->op));
    if (weft_coll_rooted(c->coll))
        o += snprintf(buf + o, len - (size_t)o, ", root=%d", c->root);
    snprintf(buf + o, len - (size_t)o, ")");
    return buf;
}

/* Elements of the send and receive buffers the call touches on any rank. */
static size_t elems(const struct call *c, int p)
{
    bool per_rank = c->coll == WEFT_COLL_ALLGATHER || c->coll == WEFT_COLL_REDUCE_SCATTER;
    return c->count * (per_rank ? (size_t)p : 1);
}

enum mode { M_BLOCKING, M_NONBLOCKING, M_GROUP, M_COUNT };
static const char *const mode_name[M_COUNT] = {"blocking", "non-blocking", "grouped"};

/* Issues c; with req, the non-blocking form. */
static weft_status_t issue(const struct call *c, const void *s, void *r, weft_comm_t comm,
                           weft_request_t *req)
{
    switch (c->coll) {
    case WEFT_COLL_ALLREDUCE:
        return req ? weft_iallreduce(s, r, c->count, c->dt, c->op, comm, req)
                   : weft_allreduce(s, r, c->count, c->dt, c->op, comm);
    case WEFT_COLL_REDUCE_SCATTER:
        return req ? weft_ireduce_scatter(s, r, c->count, c->dt, c->op, comm, req)
                   : weft_reduce_scatter(s, r, c->count, c->dt, c->op, comm);
    case WEFT_COLL_ALLGATHER:
        return req ? weft_iallgather(s, r, c->count, c->dt, comm, req)
                   : weft_allgather(s, r, c->count, c->dt, comm);
    case WEFT_COLL_BROADCAST:
        return req ? weft_ibroadcast(s, r, c->count, c->dt, c->root, comm, req)
                   : weft_broadcast(s, r, c->count, c->dt, c->root, comm);
    case WEFT_COLL_REDUCE:
        return req ? weft_ireduce(s, r, c->count, c->dt, c->op, c->root, comm, req)
                   : weft_reduce(s, r, c->count, c->dt, c->op, c->root, comm);
    default: return WEFT_ERR_INTERNAL;
    }
}

/* ---- mismatches ------------------------------------------------------------ */

/* One rank (odd) calls `other` where the rest call `normal`. */
struct mcase {
    const char *what;
    struct call normal, other;
    int odd;
    enum mode mode;
};

static const struct call AR = {WEFT_COLL_ALLREDUCE, MAX_COUNT, WEFT_FLOAT32, WEFT_SUM, 0};

/* Every field, in every mode; then a count mismatch in each collective;
 * then rank 0 as the odd one (the message names rank 1, and how many
 * differ from rank 0). */
static size_t make_cases(struct mcase *out, int p)
{
    size_t n = 0;
    int last = p - 1;
    for (int m = 0; m < M_COUNT; m++) {
        struct mcase *c = &out[n];
        c[0] = (struct mcase){"collective", AR, AR, last, (enum mode)m};
        c[0].other = (struct call){WEFT_COLL_BROADCAST, MAX_COUNT, WEFT_FLOAT32, 0, 1};
        c[1] = (struct mcase){"count", AR, AR, last, (enum mode)m};
        c[1].other.count = MAX_COUNT - 24;
        c[2] = (struct mcase){"dtype (same size)", AR, AR, last, (enum mode)m};
        c[2].other.dt = WEFT_INT32;
        c[3] = (struct mcase){"op", AR, AR, last, (enum mode)m};
        c[3].other.op = WEFT_MAX;
        c[4] = (struct mcase){"root", AR, AR, last, (enum mode)m};
        c[4].normal = (struct call){WEFT_COLL_BROADCAST, MAX_COUNT, WEFT_FLOAT32, 0, 0};
        c[4].other = c[4].normal;
        c[4].other.root = last;
        n += 5;
    }
    static const int colls[] = {WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER,
                                WEFT_COLL_ALLGATHER, WEFT_COLL_BROADCAST, WEFT_COLL_REDUCE};
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(colls); k++) {
        struct call c = {colls[k], 64, WEFT_INT64, WEFT_SUM, p > 2 ? 1 : 0};
        out[n] = (struct mcase){"count", c, c, last, M_BLOCKING};
        out[n++].other.count = 65;
    }
    out[n] = (struct mcase){"collective, rank 0 the odd one", AR, AR, 0, M_BLOCKING};
    out[n++].other = (struct call){WEFT_COLL_REDUCE, MAX_COUNT, WEFT_FLOAT32, WEFT_SUM, 0};
    return n;
}

/* Buffers large enough for any call of a case; rcv poisoned. */
struct mbufs {
    uint8_t *snd, *rcv, *warm_rcv;
    size_t bytes;
};

/* 0 when `msg` says what case c must make every rank say. */
static int check_message(int rank, int p, const struct mcase *c, uint64_t seq, const char *msg)
{
    char want[256], a[128], b[128];
    const struct call *ref = c->odd == 0 ? &c->other : &c->normal;
    const struct call *dif = c->odd == 0 ? &c->normal : &c->other;
    int first = c->odd == 0 ? 1 : c->odd;
    int fails = 0;
    snprintf(want, sizeof(want), "rank %d: collective mismatch at collective #%llu: ", rank,
             (unsigned long long)seq);
    if (strncmp(msg, want, strlen(want)) != 0)
        fails += weft_test_fail(rank, "%s: message does not start with \"%s\": \"%s\"", c->what,
                                want, msg);
    snprintf(want, sizeof(want), "rank 0 called %s but rank %d called %s", spell(ref, a, sizeof(a)),
             first, spell(dif, b, sizeof(b)));
    if (strstr(msg, want) == NULL)
        fails += weft_test_fail(rank, "%s: message lacks \"%s\": \"%s\"", c->what, want, msg);
    if (c->odd == 0 && p > 2) {
        snprintf(want, sizeof(want), "(every other rank called what rank 1 did)");
        if (strstr(msg, want) == NULL)
            fails += weft_test_fail(rank, "%s: message lacks \"%s\": \"%s\"", c->what, want, msg);
    }
    return fails;
}

/* Runs case c on a fresh communicator: a matching allreduce first (so the
 * mismatch is not collective #0), then the case in its mode.  Every rank
 * must get MISMATCH quickly, with the message, and no byte in rcv. */
static int run_case(weft_comm_t comm, int rank, int p, const struct mcase *c, struct mbufs *b)
{
    const struct call *mine = rank == c->odd ? &c->other : &c->normal;
    size_t esize = weft_dtype_size(mine->dt);
    char what[160];
    snprintf(what, sizeof(what), "%s mismatch, %s, %d ranks", c->what, mode_name[c->mode], p);
    int fails = 0;
    WT_CHECK_OK(rank, comm, "the matching allreduce before the case",
                weft_allreduce(b->snd, b->warm_rcv, 16, WEFT_FLOAT32, WEFT_SUM, comm));
    memset(b->rcv, POISON, b->bytes);
    uint64_t seq = c->mode == M_BLOCKING ? 1 : 2;
    weft_status_t st = WEFT_OK;
    uint64_t t0 = weft_now_ns();
    switch (c->mode) {
    case M_BLOCKING:
        st = issue(mine, b->snd, b->rcv, comm, NULL);
        break;
    case M_NONBLOCKING: {
        /* A matching call in flight before it: it may finish or fail with
         * the communicator, but the mismatched one must fail. */
        weft_request_t r1 = NULL, r2 = NULL;
        WT_CHECK_OK(rank, comm, "a matching iallreduce",
                    issue(&AR, b->snd, b->warm_rcv, comm, &r1));
        WT_CHECK_OK(rank, comm, what, issue(mine, b->snd, b->rcv, comm, &r2));
        weft_status_t s1 = weft_wait(r1);
        if (s1 != WEFT_OK && s1 != WEFT_ERR_MISMATCH)
            fails += weft_test_fail(rank, "%s: the matching call before it returned %s", what,
                                    weft_status_string(s1));
        st = weft_wait(r2);
        break;
    }
    case M_GROUP:
        weft_group_start();
        issue(&AR, b->snd, b->warm_rcv, comm, NULL);
        issue(mine, b->snd, b->rcv, comm, NULL);
        st = weft_group_end();
        break;
    default: break;
    }
    double secs = (double)(weft_now_ns() - t0) / 1e9;
    const char *msg = weft_last_error(comm);
    if (st != WEFT_ERR_MISMATCH)
        return fails + weft_test_fail(rank, "%s: expected %s, got %s after %.2f s: %s", what,
                                      weft_status_string(WEFT_ERR_MISMATCH),
                                      weft_status_string(st), secs, msg);
    if (secs > DETECT_S)
        fails += weft_test_fail(rank, "%s: took %.2f s to report (WEFT_TIMEOUT_MS is %s)", what,
                                secs, TIMEOUT_MS);
    fails += check_message(rank, p, c, seq, msg);
    size_t touched = elems(mine, p) * esize;
    if (!weft_test_gbuf_untouched(&(struct weft_test_gbuf){.p = b->rcv, .cap = b->bytes},
                                  touched))
        fails += weft_test_fail(rank, "%s: bytes of the mismatched call landed in recvbuf", what);
    /* Sticky: the next call fails the same way without moving anything,
     * and the first message stays. */
    char first_msg[WEFT_ERRMSG_LEN];
    snprintf(first_msg, sizeof(first_msg), "%s", msg);
    fails += weft_test_expect_status(rank, comm, "a call after the mismatch",
                                     weft_allreduce(b->snd, b->warm_rcv, 4, WEFT_FLOAT32, WEFT_SUM,
                                                    comm),
                                     WEFT_ERR_MISMATCH);
    fails += weft_test_expect_status(rank, comm, "weft_comm_get_error", weft_comm_get_error(comm),
                                     WEFT_ERR_MISMATCH);
    if (strcmp(first_msg, weft_last_error(comm)) != 0)
        fails += weft_test_fail(rank, "%s: the message changed to \"%s\"", what,
                                weft_last_error(comm));
    return fails;
}

static int mismatch_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    struct mcase cases[32];
    size_t n = make_cases(cases, p);
    struct mbufs b = {.bytes = (size_t)p * MAX_COUNT * 8};
    b.snd = malloc(b.bytes);
    b.rcv = malloc(b.bytes);
    b.warm_rcv = malloc(b.bytes);
    if (!b.snd || !b.rcv || !b.warm_rcv)
        return weft_test_fail(rank, "out of memory");
    for (size_t i = 0; i < b.bytes; i++)
        b.snd[i] = (uint8_t)(i * 13 + (size_t)rank); /* never the poison pattern as a whole */
    int fails = 0;
    for (size_t k = 0; k < n; k++) {
        /* Each case gets a fresh communicator: a mismatch ends the one it hit. */
        weft_comm_t child = NULL;
        WT_CHECK_OK(rank, comm, "weft_comm_split", weft_comm_split(comm, 0, rank, &child));
        fails += run_case(child, rank, p, &cases[k], &b);
        weft_status_t st = weft_comm_destroy(child);
        if (st != WEFT_OK && st != WEFT_ERR_MISMATCH)
            fails += weft_test_fail(rank, "weft_comm_destroy after a mismatch returned %s",
                                    weft_status_string(st));
    }
    free(b.snd);
    free(b.rcv);
    free(b.warm_rcv);
    return fails ? 1 : 0;
}

/* A p-rank job of body with checks on, over transport (NULL: default)
 * and posing as `hosts` hosts (NULL: one). */
static void run_checked(int p, const char *transport, const char *hosts, weft_test_body_t body,
                        const char *what)
{
    check_env("1");
    if (transport)
        setenv("WEFT_TRANSPORT", transport, 1);
    if (hosts)
        setenv("WEFT_TEST_HOSTS", hosts, 1);
    cr_assert_eq(weft_test_run(p, 150, body, NULL), 0,
                 "the %d-rank %s job failed (see the rank messages above)", p, what);
}

static void run_mismatch(int p, const char *transport, const char *hosts)
{
    run_checked(p, transport, hosts, mismatch_body, "mismatch");
}

Test(check, mismatch_2, .timeout = 180) { run_mismatch(2, NULL, NULL); }
Test(check, mismatch_3, .timeout = 180) { run_mismatch(3, NULL, NULL); }
Test(check, mismatch_5, .timeout = 180) { run_mismatch(5, NULL, NULL); }
Test(check, mismatch_tcp_3, .timeout = 180) { run_mismatch(3, "tcp", NULL); }
Test(check, mismatch_shm_3, .timeout = 180) { run_mismatch(3, "shm", NULL); }
Test(check, mismatch_mixed_4, .timeout = 180) { run_mismatch(4, NULL, "2"); }

/* A rank that skips a collective leaves nothing to compare: the others time
 * out (the limit of any fingerprint scheme), and the message says they
 * were waiting in the exchange for that rank. */
static int skip_body(weft_comm_t comm, int rank)
{
    float x[4] = {0}, y[4];
    WT_CHECK_OK(rank, comm, "a matching allreduce",
                weft_allreduce(x, y, 4, WEFT_FLOAT32, WEFT_SUM, comm));
    if (rank == 1) {
        sleep(3); /* never calls the second one; the others give up first */
        return 0;
    }
    weft_status_t st = weft_allreduce(x, y, 4, WEFT_FLOAT32, WEFT_SUM, comm);
    const char *msg = weft_last_error(comm);
    if (st != WEFT_ERR_TIMEOUT ||
        !strstr(msg, "fingerprint exchange (WEFT_CHECK) before allreduce") ||
        !strstr(msg, "receive from rank 1"))
        return weft_test_fail(rank, "expected a timeout in the exchange waiting for rank 1, got "
                                    "%s: %s", weft_status_string(st), msg);
    return 0;
}

/* init, body, destroy: the failed communicator's destroy returns its
 * sticky error, which is no failure here. */
static int skip_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    (void)arg;
    weft_comm_t comm = NULL;
    if (weft_test_child_init(&comm, nranks, id, rank))
        return 2;
    int rc = skip_body(comm, rank);
    weft_comm_destroy(comm);
    return rc;
}

Test(check, skipped_collective_times_out_in_the_exchange, .timeout = 60)
{
    check_env("1");
    setenv("WEFT_TIMEOUT_MS", "1000", 1);
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 3, skip_proc, NULL), 0);
    cr_assert_eq(weft_test_job_wait(&job, 30), 0, "see the rank messages above");
}

/* ---- matching calls give exact results -------------------------------------- */

/* Rank r's input element i (int32): small integers, exact in any order. */
static int32_t in_val(int r, size_t i)
{
    return r * 1000 + (int32_t)(i % 997);
}

struct mstate {
    int rank, p;
    int32_t *snd[5], *rcv[5];
    size_t n[5];
    int fails;
    long colls; /* collectives issued, to compare with the engine's check count */
};

static const int all_colls[5] = {WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER,
                                 WEFT_COLL_ALLGATHER, WEFT_COLL_BROADCAST, WEFT_COLL_REDUCE};

static struct call coll_call(int k, size_t n, int p)
{
    return (struct call){all_colls[k], n, WEFT_INT32, WEFT_SUM, (k + 1) % p};
}

static void fill_inputs(struct mstate *s, size_t n)
{
    for (int k = 0; k < 5; k++) {
        s->n[k] = n;
        size_t in = all_colls[k] == WEFT_COLL_REDUCE_SCATTER ? n * (size_t)s->p : n;
        for (size_t i = 0; i < in; i++)
            s->snd[k][i] = in_val(s->rank, i);
        memset(s->rcv[k], POISON, (size_t)s->p * MAX_COUNT * 4);
    }
}

/* Checks collective k's output on this rank. */
static void check_outputs(struct mstate *s, const char *how)
{
    int p = s->p, me = s->rank;
    int32_t sum_r = 1000 * p * (p - 1) / 2;
    for (int k = 0; k < 5; k++) {
        struct call c = coll_call(k, s->n[k], p);
        size_t n = s->n[k], out = all_colls[k] == WEFT_COLL_ALLGATHER ? n * (size_t)p : n;
        if (c.coll == WEFT_COLL_REDUCE && me != c.root)
            continue;
        for (size_t i = 0; i < out; i++) {
            int32_t want;
            switch (c.coll) {
            case WEFT_COLL_ALLREDUCE:
            case WEFT_COLL_REDUCE: want = sum_r + p * (int32_t)(i % 997); break;
            case WEFT_COLL_REDUCE_SCATTER: want = sum_r + p * (int32_t)((me * n + i) % 997); break;
            case WEFT_COLL_ALLGATHER: want = in_val((int)(i / n), i % n); break;
            default: want = in_val(c.root, i); break;
            }
            if (s->rcv[k][i] != want) {
                s->fails += weft_test_fail(me, "%s %s count %zu [%zu]: expected %d, got %d", how,
                                           weft_coll_name(c.coll), n, i, want, s->rcv[k][i]);
                break;
            }
        }
    }
}

static int matching_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    struct mstate s = {.rank = rank, .p = p};
    for (int k = 0; k < 5; k++) {
        s.snd[k] = malloc((size_t)p * MAX_COUNT * 4);
        s.rcv[k] = malloc((size_t)p * MAX_COUNT * 4);
        if (!s.snd[k] || !s.rcv[k])
            return weft_test_fail(rank, "out of memory");
    }
    static const size_t counts[] = {0, 1, 7, MAX_COUNT};
    for (size_t ci = 0; ci < WEFT_ARRAY_SIZE(counts); ci++) {
        size_t n = counts[ci];
        /* Blocking, one after the other. */
        fill_inputs(&s, n);
        for (int k = 0; k < 5; k++) {
            struct call c = coll_call(k, n, p);
            WT_CHECK_OK(rank, comm, "a blocking collective",
                        issue(&c, s.snd[k], s.rcv[k], comm, NULL));
            s.colls++;
        }
        check_outputs(&s, "blocking");
        /* Non-blocking: all five in flight at once, so their checks overlap. */
        fill_inputs(&s, n);
        weft_request_t req[5];
        for (int k = 0; k < 5; k++) {
            struct call c = coll_call(k, n, p);
            WT_CHECK_OK(rank, comm, "a non-blocking collective",
                        issue(&c, s.snd[k], s.rcv[k], comm, &req[k]));
            s.colls++;
        }
        for (int k = 4; k >= 0; k--) /* out of order on purpose */
            WT_CHECK_OK(rank, comm, "weft_wait", weft_wait(req[k]));
        check_outputs(&s, "non-blocking");
        /* Grouped, with a ring of sends and receives among them. */
        fill_inputs(&s, n);
        int32_t token = rank, got = -1;
        weft_group_start();
        for (int k = 0; k < 5; k++) {
            struct call c = coll_call(k, n, p);
            issue(&c, s.snd[k], s.rcv[k], comm, NULL);
            s.colls++;
            if (k == 2) {
                weft_send(&token, 1, WEFT_INT32, (rank + 1) % p, comm);
                weft_recv(&got, 1, WEFT_INT32, (rank - 1 + p) % p, comm);
            }
        }
        WT_CHECK_OK(rank, comm, "weft_group_end", weft_group_end());
        check_outputs(&s, "grouped");
        if (got != (rank - 1 + p) % p)
            s.fails += weft_test_fail(rank, "grouped recv: expected %d, got %d", (rank - 1 + p) % p,
                                      got);
    }
    /* The checks did run: one exchange per collective. */
    struct weft_engine_stats st;
    weft_engine_get_stats(comm, &st);
    if (p > 1 && st.checks != (uint64_t)s.colls)
        s.fails += weft_test_fail(rank, "%llu fingerprint exchanges for %ld collectives",
                                  (unsigned long long)st.checks, s.colls);
    for (int k = 0; k < 5; k++) {
        free(s.snd[k]);
        free(s.rcv[k]);
    }
    return s.fails ? 1 : 0;
}

static void run_matching(int p, const char *transport, const char *hosts)
{
    run_checked(p, transport, hosts, matching_body, "matching-calls");
}

Test(check, matching_1, .timeout = 120) { run_matching(1, NULL, NULL); }
Test(check, matching_2, .timeout = 120) { run_matching(2, NULL, NULL); }
Test(check, matching_3, .timeout = 120) { run_matching(3, NULL, NULL); }
Test(check, matching_5, .timeout = 120) { run_matching(5, NULL, NULL); }
Test(check, matching_tcp_4, .timeout = 120) { run_matching(4, "tcp", NULL); }
Test(check, matching_mixed_4, .timeout = 120) { run_matching(4, NULL, "2"); }

/* ---- the cost when off: exactly the schedule's messages -------------------------- */

/* Sends to other ranks in the schedule of c on this rank.  The counts are
 * far below any chunk size, so the chunk does not change the schedule. */
static uint64_t schedule_sends(weft_comm_t comm, const struct call *c)
{
    size_t esize = weft_dtype_size(c->dt);
    struct weft_coll_desc d = {
        .coll = c->coll, .rank = comm->rank, .nranks = comm->nranks, .root = c->root,
        .count = c->count, .chunk = c->count * (size_t)comm->nranks + 1,
    };
    struct weft_plan pl[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    weft_tune_plans(comm, c->coll, c->count, esize, pl); /* one: measuring is off here */
    d.algo = pl[0].algo;
    d.variant = pl[0].variant;
    struct weft_schedule s;
    weft_sched_init(&s);
    uint64_t n = 0;
    if (weft_sched_build(&d, &s) == WEFT_OK)
        for (size_t i = 0; i < s.nsteps; i++)
            n += s.steps[i].kind == WEFT_STEP_SEND && s.steps[i].peer != comm->rank;
    else
        n = UINT64_MAX;
    weft_sched_free(&s);
    return n;
}

/* arg: "on" or "off".  Each collective must send exactly its schedule's
 * messages, plus one fingerprint to every other rank when on.  The plans
 * are the model's alone (WEFT_TUNE_TRIALS=0): measuring runs other plans
 * first, and an exchange of its own. */
static int cost_body(weft_comm_t comm, int rank, int p, void *arg)
{
    bool on = strcmp(arg, "on") == 0;
    static int64_t snd[MAX_COUNT * 8], rcv[MAX_COUNT * 8];
    int fails = 0;
    static const size_t counts[] = {1, 100};
    for (size_t ci = 0; ci < WEFT_ARRAY_SIZE(counts); ci++)
        for (int k = 0; k < 5; k++) {
            struct call c = {all_colls[k], counts[ci], WEFT_INT64, WEFT_SUM, p - 1};
            struct weft_engine_stats before, after;
            weft_engine_get_stats(comm, &before);
            WT_CHECK_OK(rank, comm, "a collective", issue(&c, snd, rcv, comm, NULL));
            weft_engine_get_stats(comm, &after);
            uint64_t want = schedule_sends(comm, &c) + (on ? (uint64_t)(p - 1) : 0);
            uint64_t sends = after.sends - before.sends, checks = after.checks - before.checks;
            if (sends != want || checks != (on ? 1u : 0u) || after.ops - before.ops != 1)
                fails += weft_test_fail(rank, "WEFT_CHECK %s, %s count %zu: %llu sends (want "
                                              "%llu), %llu checks, %llu ops",
                                        on ? "on" : "off", weft_coll_name(c.coll), c.count,
                                        (unsigned long long)sends, (unsigned long long)want,
                                        (unsigned long long)checks,
                                        (unsigned long long)(after.ops - before.ops));
        }
    return fails ? 1 : 0;
}

Test(check, off_sends_only_the_schedule, .timeout = 60)
{
    check_env(NULL);
    setenv("WEFT_TUNE_TRIALS", "0", 1);
    setenv("WEFT_SHM_LL_BYTES", "0", 1); /* the engine's schedule is what is counted */
    cr_assert_eq(weft_test_run(3, 50, cost_body, "off"), 0, "see the rank messages above");
}

Test(check, on_adds_one_message_per_peer, .timeout = 60)
{
    check_env("1");
    setenv("WEFT_TUNE_TRIALS", "0", 1);
    cr_assert_eq(weft_test_run(3, 50, cost_body, "on"), 0, "see the rank messages above");
}

Test(check, zero_is_off, .timeout = 60)
{
    check_env("0");
    setenv("WEFT_TUNE_TRIALS", "0", 1);
    setenv("WEFT_SHM_LL_BYTES", "0", 1);
    cr_assert_eq(weft_test_run(2, 50, cost_body, "off"), 0, "see the rank messages above");
}

/* ---- the verdict on records made by hand --------------------------------------- */

/* A communicator record good enough for weft_check_verify (rank, size and
 * the error record). */
static struct weft_comm *fake_comm(int rank, int nranks)
{
    struct weft_comm *c = calloc(1, sizeof(*c));
    cr_assert_not_null(c);
    weft_errsink_init(&c->err);
    c->rank = rank;
    c->nranks = nranks;
    return c;
}

static void fake_free(struct weft_comm *c)
{
    weft_errsink_destroy(&c->err);
    free(c);
}

static void fill(struct weft_fingerprint *fp, int n, const struct call *c)
{
    struct weft_op_args a = {.coll = c->coll, .count = c->count, .dtype = c->dt, .op = c->op,
                             .root = c->root};
    for (int r = 0; r < n; r++) {
        weft_fp_fill(&fp[r], &a, WEFT_ALGO_RING, 524288);
        fp[r].seq = 41;
    }
}

Test(check_verify, agreement_and_ignored_fields)
{
    setenv("WEFT_DEBUG", "NONE", 1);
    struct weft_comm *c = fake_comm(1, 4);
    struct weft_fingerprint fp[4];
    struct call ag = {WEFT_COLL_ALLGATHER, 10, WEFT_UINT8, WEFT_SUM, 0};
    fill(fp, 4, &ag);
    cr_expect_eq(weft_check_verify(c, fp), WEFT_OK);
    /* An allgather has no op and no root: what a caller passes there does
     * not count (the API passes 0, but the record must not depend on it). */
    struct weft_op_args a = {.coll = WEFT_COLL_ALLGATHER, .count = 10, .dtype = WEFT_UINT8,
                             .op = WEFT_MAX, .root = 3};
    weft_fp_fill(&fp[2], &a, WEFT_ALGO_RING, 524288);
    fp[2].seq = 41;
    cr_expect_eq(weft_check_verify(c, fp), WEFT_OK, "%s", c->err.msg);
    fake_free(c);
}

static void root_and_dtype_differ(struct weft_fingerprint *fp)
{
    fp[3].root = 2;
    fp[4].dtype = WEFT_FLOAT16;
}

static void rank_0_differs(struct weft_fingerprint *fp)
{
    fp[0].count = 11;
}

static void other_plan(struct weft_fingerprint *fp)
{
    fp[1].algo = WEFT_ALGO_RHD;
}

static void other_sequence(struct weft_fingerprint *fp)
{
    fp[1].seq = 40;
}

static void garbage(struct weft_fingerprint *fp)
{
    memset(&fp[1], 0x5a, sizeof(fp[1]));
}

/* Rank me of n judges n records of call c that change() alters: a
 * mismatch, whose message is want (or, unless exact, contains it). */
Test(check_verify, mismatches_named)
{
    setenv("WEFT_DEBUG", "NONE", 1);
    const struct call red = {WEFT_COLL_REDUCE, 1024, WEFT_BFLOAT16, WEFT_AVG, 4};
    const struct call ag = {WEFT_COLL_ALLGATHER, 10, WEFT_UINT8, WEFT_SUM, 0};
    const struct call ar = {WEFT_COLL_ALLREDUCE, 8, WEFT_FLOAT32, WEFT_SUM, 0};
    const struct {
        int me, n;
        const struct call *c;
        void (*change)(struct weft_fingerprint *fp);
        bool exact;
        const char *want;
    } m[] = {
        /* The first differing rank and both calls. */
        {2, 5, &red, root_and_dtype_differ, true,
         "rank 2: collective mismatch at collective #41: rank 0 called reduce(count=1024, "
         "bfloat16, avg, root=4) but rank 3 called reduce(count=1024, bfloat16, avg, root=2) "
         "(2 of the 4 other ranks differ from rank 0)"},
        /* Rank 0 the odd one: compared with rank 1, which all the others match. */
        {3, 4, &ag, rank_0_differs, true,
         "rank 3: collective mismatch at collective #41: rank 0 called allgather(count=11, "
         "uint8) but rank 1 called allgather(count=10, uint8) (every other rank called what "
         "rank 1 did)"},
        /* Same call, different plan: ranks were given different WEFT_ALGO. */
        {0, 2, &ar, other_plan, false,
         "rank 0 runs it with ring and 524288-byte chunks but rank 1 with rhd and 524288-byte "
         "chunks (WEFT_ALGO, weft_comm_set_algo or WEFT_CHUNK_SIZE differ between ranks)"},
        /* Different sequence numbers: both are named. */
        {0, 2, &ar, other_sequence, false,
         "rank 0 called allreduce(count=8, float32, sum) as its collective #41 but rank 1 "
         "called allreduce(count=8, float32, sum) as its collective #40"},
        /* Bytes that are not a record: a send met the exchange. */
        {0, 2, &ar, garbage, false, "rank 1 sent something other than a fingerprint"},
    };
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(m); i++) {
        struct weft_comm *comm = fake_comm(m[i].me, m[i].n);
        struct weft_fingerprint fp[8];
        cr_assert(m[i].n <= 8);
        fill(fp, m[i].n, m[i].c);
        m[i].change(fp);
        cr_assert_eq(weft_check_verify(comm, fp), WEFT_ERR_MISMATCH, "case %zu", i);
        if (m[i].exact)
            cr_expect_str_eq(comm->err.msg, m[i].want, "case %zu", i);
        else
            cr_expect(strstr(comm->err.msg, m[i].want) != NULL, "case %zu: %s", i,
                      comm->err.msg);
        fake_free(comm);
    }
}

/* The exchange: one message each way per pair, nothing dependent, each
 * record received into its sender's slot. */
Test(check_verify, exchange_schedule)
{
    for (int p = 1; p <= 9; p++)
        for (int me = 0; me < p; me++) {
            struct weft_schedule s;
            weft_sched_init(&s);
            cr_assert_eq(weft_check_sched_build(me, p, &s), WEFT_OK);
            cr_expect_eq(s.nsteps, 2 * (size_t)(p - 1));
            unsigned sent = 0, got = 0;
            for (size_t i = 0; i < s.nsteps; i++) {
                const struct weft_step *st = &s.steps[i];
                cr_expect(st->deps[0] < 0 && st->peer != me && st->count == 48);
                if (st->kind == WEFT_STEP_SEND) {
                    cr_expect(st->off == 0 && st->buf == WEFT_BUF_SEND);
                    sent |= 1u << st->peer;
                } else {
                    cr_expect(st->kind == WEFT_STEP_RECV && st->buf == WEFT_BUF_RECV);
                    cr_expect_eq(st->off, (size_t)st->peer * 48);
                    got |= 1u << st->peer;
                }
            }
            unsigned others = ((1u << p) - 1) & ~(1u << me);
            cr_expect(sent == others && got == others, "p %d rank %d", p, me);
            weft_sched_free(&s);
        }
}

/* One rank with WEFT_CHECK=1, the others without: init refuses the job on
 * every rank instead of letting fingerprints be read as data. */
static int init_with_own_check(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    (void)arg;
    setenv("WEFT_CHECK", rank == 1 ? "1" : "0", 1);
    weft_param_reload(); /* the parent read the environment before the fork */
    weft_comm_t comm = NULL;
    weft_status_t st = weft_comm_init(&comm, nranks, *id, rank);
    if (st == WEFT_OK) {
        weft_comm_destroy(comm);
        return weft_test_fail(rank, "init succeeded with WEFT_CHECK differing between ranks");
    }
    if (st != WEFT_ERR_INVALID_ARG || strstr(weft_last_error(NULL), "WEFT_CHECK differs") == NULL)
        return weft_test_fail(rank, "init returned %s (%s)", weft_status_string(st),
                              weft_last_error(NULL));
    return 0;
}

Test(check, ranks_that_disagree_on_check_fail_init, .timeout = 60)
{
    unsetenv("WEFT_CHECK");
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 3, init_with_own_check, NULL), 0);
    cr_assert_eq(weft_test_job_wait(&job, 50), 0);
}
