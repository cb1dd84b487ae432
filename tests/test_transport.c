/*
 * test_transport.c - the suite of transport_suite.c on every transport
 * (tcp, shm, verbs on the software verbs device), each under its name; and
 * which transport carries each pair: WEFT_TRANSPORT
 * restrictions that leave a pair unreachable fail init on every rank with
 * the reason; a bad name is refused; a rank killed in the middle of a
 * shared-memory AllReduce sweep leaves errors (not hangs) on the others
 * and nothing in /dev/shm.  Calibration at init measures every ring edge,
 * gives every rank the same table, and yields to WEFT_CALIBRATE=0 and to
 * the topology file.  WEFT_BIND=1 pins each rank to its own CPU.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "src/comm.h"
#include "select/topo.h"
#include "tests/tcp_harness.h"
#include "transports/registry.h"
#include "transports/shm/shm.h"
#include "transports/transport.h"

/* ---- the same behaviour from every transport ------------------------------------ */

/* The tests of transport_suite.c in a suite per transport, as gloo
 * instantiates its tests per transport: how each is opened is the
 * harness's table (weft_test_transports); a transport added there gets its
 * suite from one line below.  A transport that cannot run here (verbs
 * without the software device, which tests/verbs.sh preloads) skips. */
#define TRANSPORT_SUITE(tp)                                                                     \
    static void use_##tp(void) { tp_use(#tp); }                                                 \
    TestSuite(tp, .init = use_##tp, .timeout = 120);                                            \
    Test(tp, pingpong_sizes) { run(2, 1, sc_pingpong); }                                        \
    Test(tp, both_directions_large) { run(2, 1, sc_both_ways); }                                \
    Test(tp, many_small_both_ways) { run(2, 1, sc_many_small); }                                \
    Test(tp, four_ranks_all_to_all) { run(4, 1, sc_all_to_all); }                               \
    Test(tp, short_message_into_long_receive) { run(2, 1, sc_short_into_long); }                \
    Test(tp, long_message_into_short_receive) { run_long_into_short(4096); }                    \
    Test(tp, killed_peer_fails_receive) { run_killed_peer(); }                                  \
    Test(tp, finalized_peer_fails_receive) { run(2, 1, sc_peer_finalized); }                    \
    Test(tp, finalize_with_pending_requests) { run(2, 2, sc_finalize_pending); }                \
    Test(tp, wakeup_ends_a_wait) { check_wakeup(); }                                            \
    Test(tp, bad_arguments) { check_bad_arguments(); }

TRANSPORT_SUITE(tcp)
TRANSPORT_SUITE(shm)
#ifdef HAVE_VERBS
TRANSPORT_SUITE(verbs)
#endif

/* A transport registered and built, between ranks (self only carries a
 * rank's messages to itself), must have its row in the harness's table and
 * so its suite above: a new one fails here until it does. */
Test(transport, every_registered_transport_has_a_suite)
{
    for (int t = 0; weft_transports[t]; t++) {
        const struct weft_transport_desc *d = weft_transports[t];
        if (d->ops == NULL || (d->flags & WEFT_TP_IMPLICIT))
            continue;
        bool found = false;
        for (size_t i = 0; i < weft_test_ntransports; i++)
            found |= strcmp(weft_test_transports[i].name, d->name) == 0 &&
                     weft_test_transports[i].ops == d->ops;
        cr_expect(found, "transport %s has no row in weft_test_transports", d->name);
    }
}

/* ---- which transport carries each pair ------------------------------------------- */

/* Init must fail with status `want` and a message containing `why`. */
struct expect_fail {
    weft_status_t want;
    const char *why;
};

static int init_must_fail(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    const struct expect_fail *e = arg;
    const char *hosts = getenv("WEFT_TEST_HOSTS");
    if (hosts) {
        char h[32];
        snprintf(h, sizeof(h), "test-host-%d", rank * atoi(hosts) / nranks);
        setenv("WEFT_HOSTID", h, 1);
    }
    weft_comm_t comm = NULL;
    weft_status_t st = weft_comm_init(&comm, nranks, *id, rank);
    if (st == WEFT_OK) {
        weft_comm_destroy(comm);
        return weft_test_fail(rank, "init succeeded; expected %s", weft_status_string(e->want));
    }
    if (st != e->want || strstr(weft_last_error(NULL), e->why) == NULL)
        return weft_test_fail(rank, "init returned %s (%s); expected %s mentioning \"%s\"",
                              weft_status_string(st), weft_last_error(NULL),
                              weft_status_string(e->want), e->why);
    return 0;
}

Test(transport, shm_only_across_hosts_fails_on_every_rank, .timeout = 60)
{
    setenv("WEFT_TRANSPORT", "shm", 1);
    setenv("WEFT_TEST_HOSTS", "2", 1);
    setenv("WEFT_TIMEOUT_MS", "20000", 1);
    struct expect_fail e = {WEFT_ERR_INVALID_ARG, "only shm is allowed"};
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 4, init_must_fail, &e), 0);
    cr_assert_eq(weft_test_job_wait(&job, 50), 0);
}

Test(transport, unknown_transport_name_is_refused, .timeout = 60)
{
    setenv("WEFT_TRANSPORT", "carrier-pigeon", 1);
    setenv("WEFT_TIMEOUT_MS", "20000", 1);
    struct expect_fail e = {WEFT_ERR_INVALID_ARG, "carrier-pigeon"};
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 2, init_must_fail, &e), 0);
    /* The failing ranks leave their peers to time out at the rendezvous
     * (or find them gone): every rank must end, none may succeed. */
    weft_test_job_wait(&job, 50);
    for (int r = 0; r < 2; r++)
        cr_assert(!job.hung[r], "rank %d hung", r);
}

/* Every rank loops a 4 MiB AllReduce until it fails; rank 2 is killed. */
static int sweep_until_error(weft_comm_t comm, int rank, int nranks, void *arg)
{
    (void)nranks;
    (void)arg;
    size_t n = 1 << 20;
    float *buf = calloc(n, sizeof(float));
    if (buf == NULL)
        return weft_test_fail(rank, "out of memory");
    for (;;) {
        weft_status_t st = weft_allreduce(buf, buf, n, WEFT_FLOAT32, WEFT_SUM, comm);
        if (st != WEFT_OK) {
            free(buf);
            if (st != WEFT_ERR_REMOTE && st != WEFT_ERR_TIMEOUT)
                return weft_test_fail(rank, "the sweep ended with %s: %s",
                                      weft_status_string(st), weft_last_error(comm));
            _exit(42); /* the expected end: skip destroy's wait for peers */
        }
    }
}

Test(transport, kill_9_mid_shm_sweep_leaves_errors_and_no_files, .timeout = 90)
{
    setenv("WEFT_TRANSPORT", "shm", 1);
    setenv("WEFT_TIMEOUT_MS", "10000", 1);
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start(&job, 4, sweep_until_error, NULL), 0);
    job.quiet = true; /* rank 2 dies of SIGKILL: expected */
    struct timespec t = {0, 700 * 1000 * 1000};
    nanosleep(&t, NULL);
    weft_test_job_signal(&job, 2, SIGKILL);
    weft_test_job_wait(&job, 60);
    for (int r = 0; r < 4; r++) {
        cr_assert(!job.hung[r], "rank %d hung after its peer was killed", r);
        if (r != 2)
            cr_assert_eq(weft_test_job_exit_code(&job, r), 42,
                         "rank %d exit code %d (42: ended with a peer error)", r,
                         weft_test_job_exit_code(&job, r));
    }
    cr_assert_eq(count_segments("/dev/shm", job.uid.job), 0,
                 "segments of the job left in /dev/shm");
}

/* ---- calibration at init ------------------------------------------------------ */

/* What every rank of a job must see in its link table. */
struct cal_expect {
    bool calibrated;   /* ring edges measured, defaults replaced */
    const char *file;  /* WEFT_TOPO_FILE content, or NULL */
};

static bool is_edge(int i, int j, int n)
{
    return (i + 1) % n == j || (j + 1) % n == i;
}

static int check_table(weft_comm_t comm, int rank, int nranks, void *arg)
{
    const struct cal_expect *x = arg;
    const struct weft_link_table *tab = &comm->topo;
    double sum = 0;
    for (int i = 0; i < nranks; i++) {
        for (int j = 0; j < nranks; j++) {
            struct weft_link l;
            if (i == j || weft_topo_table_get(tab, i, j, &l) != WEFT_OK)
                continue;
            sum += l.alpha * (i + 1) + l.beta * (j + 7);
            bool file_pair = x->file && i + j == 1; /* the file names pair 0 1 */
            int want = file_pair                       ? WEFT_LINK_FROM_FILE
                       : x->calibrated && is_edge(i, j, nranks) ? WEFT_LINK_FROM_MEASURED
                                                                 : WEFT_LINK_FROM_DEFAULT;
            if (l.source != want)
                return weft_test_fail(rank, "pair %d-%d: cost from source %d, expected %d", i, j,
                                      l.source, want);
            if (!isfinite(l.alpha) || !isfinite(l.beta) || l.alpha < 0 || l.beta <= 0)
                return weft_test_fail(rank, "pair %d-%d: alpha %g beta %g", i, j, l.alpha, l.beta);
            if (file_pair && l.alpha != 7e-6)
                return weft_test_fail(rank, "pair 0-1: alpha %g, the file says 7 us", l.alpha);
        }
    }
    double shm_default = tab->alpha[weft_transport_find("shm")];
    if (x->file && shm_default != 3e-6)
        return weft_test_fail(rank, "shm default alpha %g; the file's default (3 us) must win",
                              shm_default);
    if (!x->file && (shm_default != weft_shm_desc.alpha) != x->calibrated)
        return weft_test_fail(rank, "shm default alpha %g (built-in %g), calibrated %d",
                              shm_default, weft_shm_desc.alpha, x->calibrated);
    /* Rings only for this host's ranks: with 2 "hosts", one peer each. */
    const char *hosts = getenv("WEFT_TEST_HOSTS");
    int want_group = hosts ? nranks / atoi(hosts) : nranks;
    for (int i = 0; i < comm->ntp; i++) {
        const struct shm_ctx *sc = comm->tp[i].ctx;
        if (comm->tp[i].ops == &weft_shm_ops && sc->ngroup != want_group)
            return weft_test_fail(rank, "shm has rings for %d ranks, this host has %d",
                                  sc->ngroup, want_group);
    }
    /* Every rank holds the same numbers. */
    double lo = sum, hi = sum;
    if (weft_allreduce(&lo, &lo, 1, WEFT_FLOAT64, WEFT_MIN, comm) != WEFT_OK ||
        weft_allreduce(&hi, &hi, 1, WEFT_FLOAT64, WEFT_MAX, comm) != WEFT_OK)
        return weft_test_fail(rank, "allreduce: %s", weft_last_error(comm));
    if (lo != hi)
        return weft_test_fail(rank, "ranks disagree on the link table (%g vs %g)", lo, hi);
    return 0;
}

static void run_table_job(int nranks, struct cal_expect *x)
{
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start(&job, nranks, check_table, x), 0);
    cr_assert_eq(weft_test_job_wait(&job, 60), 0);
}

Test(transport, calibration_measures_every_ring_edge, .timeout = 60)
{
    struct cal_expect x = {.calibrated = true};
    run_table_job(5, &x);
}

Test(transport, calibration_over_two_hosts_measures_shm_and_tcp, .timeout = 60)
{
    setenv("WEFT_TEST_HOSTS", "2", 1);
    struct cal_expect x = {.calibrated = true};
    run_table_job(4, &x);
}

Test(transport, calibration_off_keeps_the_defaults, .timeout = 60)
{
    setenv("WEFT_CALIBRATE", "0", 1);
    struct cal_expect x = {.calibrated = false};
    run_table_job(4, &x);
}

Test(transport, topology_file_beats_calibration, .timeout = 60)
{
    char path[] = "/tmp/weft-topo-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    const char *text = "default shm alpha_us=3 gbps=5\npair 0 1 alpha_us=7\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    setenv("WEFT_TOPO_FILE", path, 1);
    struct cal_expect x = {.calibrated = true, .file = text};
    run_table_job(4, &x);
    unlink(path);
}

/* ---- WEFT_BIND ---------------------------------------------------------------------- */

/* Each rank reports its CPU set: one CPU, rank k of the machine on the k-th
 * allowed CPU (modulo their number), when pinning; untouched otherwise. */
static int check_bind(weft_comm_t comm, int rank, int nranks, void *arg)
{
    bool pinned = arg != NULL;
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0)
        return weft_test_fail(rank, "sched_getaffinity failed");
    int parent_cpus = atoi(getenv("WEFT_TEST_PARENT_CPUS"));
    int n = CPU_COUNT(&set);
    if (!pinned)
        return n == parent_cpus ? 0 : weft_test_fail(rank, "%d CPUs, the parent had %d", n,
                                                    parent_cpus);
    if (n != 1)
        return weft_test_fail(rank, "WEFT_BIND=1 left %d CPUs", n);
    int cpu = -1;
    for (int c = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, &set))
            cpu = c;
    /* Different ranks, different CPUs while there are enough. */
    int32_t mine = cpu, all[8] = {0};
    if (weft_allgather(&mine, all, 1, WEFT_INT32, comm) != WEFT_OK)
        return weft_test_fail(rank, "allgather: %s", weft_last_error(comm));
    for (int r = 0; r < nranks; r++)
        if (r != rank && all[r] == cpu && nranks <= parent_cpus)
            return weft_test_fail(rank, "ranks %d and %d are both on CPU %d", rank, r, cpu);
    return 0;
}

static void run_bind(bool pin)
{
    cpu_set_t set;
    cr_assert_eq(sched_getaffinity(0, sizeof(set), &set), 0);
    char v[16];
    snprintf(v, sizeof(v), "%d", CPU_COUNT(&set));
    setenv("WEFT_TEST_PARENT_CPUS", v, 1);
    if (pin)
        setenv("WEFT_BIND", "1", 1);
    cr_assert_eq(weft_test_run(2, 60, check_bind, pin ? &set : NULL), 0);
}

Test(transport, bind_pins_each_rank_to_its_own_cpu, .timeout = 60) { run_bind(true); }
Test(transport, no_bind_leaves_placement_to_the_kernel, .timeout = 60) { run_bind(false); }

/* ---- self: a rank's messages to itself --------------------------------------------- */

static const struct weft_transport_ops *self_ops(void)
{
    int t = weft_transport_find("self");
    cr_assert(t >= 0 && weft_transports[t]->ops);
    return weft_transports[t]->ops;
}

/* Finishes req (self completes at the matching post; progress is idle). */
static weft_status_t self_done(const struct weft_transport_ops *o, void *req, size_t *bytes)
{
    int done = 0;
    weft_status_t st = o->test(req, &done, bytes);
    cr_assert(st != WEFT_OK || done, "self: a matched request is not done");
    return st;
}

Test(self, matches_in_order_short_send_then_too_long_fails_all)
{
    const struct weft_transport_ops *o = self_ops();
    struct weft_errsink sink;
    weft_errsink_init(&sink);
    struct weft_transport_init a = {.err = &sink, .rank = 2, .nranks = 3};
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t alen = sizeof(addr);
    void *ctx, *conn, *r[4];
    cr_assert_eq(o->init(&a, &ctx, addr, &alen), WEFT_OK);
    cr_assert_eq(o->connect(ctx, 1, NULL, 0, &conn), WEFT_ERR_INTERNAL);
    cr_assert_eq(o->connect(ctx, 2, NULL, 0, &conn), WEFT_OK);
    /* Two sends, then two receives: the k-th send lands in the k-th receive;
     * a send shorter than its receive reports its own length. */
    char s0[8] = "first", s1[3] = "2nd", in0[8] = {0}, in1[16] = {0};
    size_t n;
    cr_assert_eq(o->isend(conn, s0, sizeof(s0), &r[0]), WEFT_OK);
    cr_assert_eq(o->isend(conn, s1, sizeof(s1), &r[1]), WEFT_OK);
    cr_assert_eq(o->irecv(conn, in0, sizeof(in0), &r[2]), WEFT_OK);
    cr_assert_eq(o->irecv(conn, in1, sizeof(in1), &r[3]), WEFT_OK);
    for (int i = 0; i < 4; i++)
        cr_assert_eq(self_done(o, r[i], &n), WEFT_OK);
    cr_expect_eq(n, sizeof(s1));
    cr_expect(memcmp(in0, s0, sizeof(s0)) == 0 && memcmp(in1, s1, sizeof(s1)) == 0);
    /* A send longer than the receive posted for it fails both, and the
     * connection: a later post fails too, with the same message. */
    char big[32] = {0}, small[4];
    cr_assert_eq(o->irecv(conn, small, sizeof(small), &r[0]), WEFT_OK);
    cr_assert_eq(o->isend(conn, big, sizeof(big), &r[1]), WEFT_OK);
    cr_expect_eq(self_done(o, r[0], &n), WEFT_ERR_REMOTE);
    cr_expect_eq(self_done(o, r[1], &n), WEFT_ERR_REMOTE);
    char msg[WEFT_ERRMSG_LEN];
    cr_expect(strstr(weft_errsink_read(&sink, msg, sizeof(msg)), "holds 4") != NULL, "%s", msg);
    cr_assert_eq(o->irecv(conn, small, sizeof(small), &r[2]), WEFT_OK);
    cr_expect_eq(self_done(o, r[2], &n), WEFT_ERR_REMOTE);
    o->finalize(ctx);
    weft_errsink_destroy(&sink);
}

Test(self, abort_fails_what_is_pending_and_later_posts)
{
    const struct weft_transport_ops *o = self_ops();
    struct weft_transport_init a = {.rank = 0, .nranks = 1};
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t alen = sizeof(addr), n;
    void *ctx, *conn, *r;
    char buf[8];
    cr_assert_eq(o->init(&a, &ctx, addr, &alen), WEFT_OK);
    cr_assert_eq(o->connect(ctx, 0, NULL, 0, &conn), WEFT_OK);
    cr_assert_eq(o->irecv(conn, buf, sizeof(buf), &r), WEFT_OK);
    int done = 1;
    cr_assert_eq(o->test(r, &done, &n), WEFT_OK);
    cr_assert_eq(done, 0, "a receive with no send finished");
    o->abort(ctx, WEFT_ERR_REMOTE, "rank 1 failed");
    cr_expect_eq(self_done(o, r, &n), WEFT_ERR_REMOTE);
    cr_assert_eq(o->isend(conn, buf, sizeof(buf), &r), WEFT_OK);
    cr_expect_eq(self_done(o, r, &n), WEFT_ERR_REMOTE);
    cr_expect_eq(o->isend(NULL, buf, sizeof(buf), &r), WEFT_ERR_INVALID_ARG);
    o->finalize(ctx);
}
