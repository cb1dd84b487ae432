/*
 * test_flood.c - listeners under a flood of strangers.  8 ranks init (then
 * shrink; then, on tcp between 8 posing hosts, init and run their first
 * collectives) while threads of this process hammer the root's listener,
 * the shrink's, or one rank's tcp data listener: connect storms, silent
 * holders, slowloris, garbage and handshakes with a wrong secret.  The job
 * must finish with exact results, its median within 0.5 s of the same
 * without the flood or, on a machine the flood loads, of the same flood
 * aimed at a decoy listener (the load alone).  WEFT_TEST_FLOOD=storm,
 * loris,... runs only those flooders, WEFT_TEST_FLOOD_ON=root,shrink,tcp
 * only those listeners' rounds.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <netinet/tcp.h>
#include <unistd.h>

#include "base/auth.h"
#include "base/sock.h"
#include "bootstrap.h"
#include "comm.h"
#include "harness.h"

#define MS 1000000ull
#define RANKS 8
#define HOLD 128        /* silent connections a holder keeps open */
#define LORIS 32        /* slowloris connections */
#define STORM_BURST 100 /* connects per storm burst, then 5 ms rest: ~20k a second */
#define FLOOD_MAX_S 10  /* the flood stops then even if the rendezvous is not over */
#define ROUNDS 3        /* of each mode; medians are compared */
#define TARGET 5        /* the rank whose tcp data listener is flooded */
#define BUSY_MS 100     /* TARGET computes that long after init, before its collectives */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A stranger's connect: the kernel finishes loopback handshakes at once,
 * so it does not wait; -1 when refused. */
static int stranger(const union weft_sockaddr *to)
{
    int fd = socket(to->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, &to->sa, weft_sock_len(to)) != 0 && errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

static void close_all(int *fds, int n)
{
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0)
            close(fds[i]);
}

static void send_some(int fd, const void *buf, size_t len)
{
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT); /* may well fail */
    (void)n;
}

/* ---- the flood ------------------------------------------------------------ */

/* Owner: the test; the threads only count. */
struct flood {
    union weft_sockaddr root;
    uint64_t job;
    uint16_t kind;        /* WEFT_AUTH_BOOTSTRAP or WEFT_AUTH_DATA: what the HELLOs claim */
    atomic_int stop;
    atomic_long connects; /* connections opened by every flooder together */
    atomic_int auth_ok;   /* wrong-secret handshakes that passed: must stay 0 */
    int decoy_fd;         /* WEFT_TEST_FLOOD=decoy: the listener flooded instead */
    pthread_t th[6];
    int nth;
};

/* Thousands of connects, closed at once: they pile up in the listen queue. */
static void *storm(void *arg)
{
    struct flood *f = arg;
    while (!atomic_load(&f->stop)) {
        for (int i = 0; i < STORM_BURST; i++) {
            int fd = stranger(&f->root);
            if (fd >= 0) {
                f->connects++;
                close(fd);
            }
        }
        sleep_ms(5);
    }
    return NULL;
}

/* Silent connections held open, the oldest replaced every millisecond. */
static void *holder(void *arg)
{
    struct flood *f = arg;
    int fds[HOLD];
    memset(fds, -1, sizeof(fds));
    for (int k = 0; !atomic_load(&f->stop); k = (k + 1) % HOLD) {
        if (fds[k] >= 0)
            close(fds[k]);
        fds[k] = stranger(&f->root);
        f->connects += fds[k] >= 0;
        sleep_ms(1);
    }
    close_all(fds, HOLD);
    return NULL;
}

/* Slowloris: one byte per connection every 20 ms.  Half dribble a HELLO
 * of this job (a stranger who learnt the job, not the secret), half
 * random bytes; a connection the root closed is opened again. */
static void *loris(void *arg)
{
    struct flood *f = arg;
    int fds[LORIS];
    size_t sent[LORIS];
    uint8_t hello[LORIS][WEFT_AUTH_HELLO_LEN];
    memset(fds, -1, sizeof(fds));
    while (!atomic_load(&f->stop)) {
        for (int i = 0; i < LORIS; i++) {
            char c[64];
            ssize_t n = fds[i] >= 0 ? recv(fds[i], c, sizeof(c), MSG_DONTWAIT) : 1;
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
                close(fds[i]); /* the root gave up on it */
                fds[i] = -1;
            }
            if (fds[i] < 0) {
                if ((fds[i] = stranger(&f->root)) < 0)
                    continue;
                f->connects++;
                sent[i] = 0;
                weft_random_bytes(hello[i], sizeof(hello[i]));
                if (i % 2 == 0) {
                    memcpy(hello[i], "WEFT\x01\x00", 6);
                    hello[i][6] = (uint8_t)f->kind;
                    hello[i][7] = 0;
                    for (int b = 0; b < 8; b++)
                        hello[i][8 + b] = (uint8_t)(f->job >> (8 * b));
                    memcpy(hello[i] + 16, "\x01\x00\x00\x00\x08\x00\x00\x00", 8);
                }
            }
            if (sent[i] < sizeof(hello[i]))
                send_some(fds[i], &hello[i][sent[i]++], 1);
        }
        sleep_ms(20);
    }
    close_all(fds, LORIS);
    return NULL;
}

/* The next stranger's connection, counted; -1 once the flood stops. */
static int next_stranger(struct flood *f)
{
    while (!atomic_load(&f->stop)) {
        int fd = stranger(&f->root);
        if (fd >= 0) {
            f->connects++;
            return fd;
        }
        sleep_ms(1);
    }
    return -1;
}

/* Garbage: a HELLO's worth of random bytes (or weft's magic and then
 * nonsense), then close. */
static void *garbage(void *arg)
{
    struct flood *f = arg;
    uint8_t junk[200];
    for (int k = 0, fd; (fd = next_stranger(f)) >= 0; k++) {
        weft_random_bytes(junk, sizeof(junk));
        if (k % 2)
            memcpy(junk, "WEFT\x01\x00\x01\x00", 8);
        sleep_ms(1); /* let the connection complete before the bytes */
        send_some(fd, junk, sizeof(junk));
        close(fd);
    }
    return NULL;
}

/* Whole handshakes with the right job and a random secret. */
static void *impostor(void *arg)
{
    struct flood *f = arg;
    for (int k = 0, fd; (fd = next_stranger(f)) >= 0; k++) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        uint8_t secret[WEFT_SECRET_BYTES];
        weft_random_bytes(secret, sizeof(secret));
        struct weft_auth_hello h = {.kind = f->kind, .job = f->job,
                                    .rank = 1 + (uint32_t)k % (RANKS - 1), .nranks = RANKS};
        const char *why = NULL;
        if (poll(&p, 1, 1000) == 1 &&
            weft_auth_connect(fd, secret, &h, weft_now_ns() + 2000 * MS, &why) == WEFT_OK)
            f->auth_ok++;
        close(fd);
    }
    return NULL;
}

/* A listener of this process that accepts and closes everything: the
 * flood aimed there costs the machine the same, but no rank waits on it. */
static void *decoy(void *arg)
{
    struct flood *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = f->decoy_fd, .events = POLLIN};
        if (poll(&p, 1, 10) == 1)
            for (int fd; (fd = accept4(f->decoy_fd, NULL, NULL, SOCK_CLOEXEC)) >= 0;)
                close(fd);
    }
    return NULL;
}

/* What a round floods: nothing, a decoy listener, or the listener under
 * test (the root's, the shrink's, or rank TARGET's tcp data listener). */
enum mode { QUIET, DECOY, ROOT, NMODES };
static const char *const mode_name[NMODES] = {"no flood", "decoy flood", "target flood"};

/* WEFT_TEST_FLOOD=storm,holder,... runs only those flooders (to see what
 * costs what). */
static void flood_start(struct flood *f, enum mode m, const union weft_sockaddr *root,
                        uint64_t job, uint16_t kind)
{
    static const char *const name[] = {"storm", "holder", "loris", "garbage", "impostor"};
    void *(*const fn[])(void *) = {storm, holder, loris, garbage, impostor};
    const char *only = getenv("WEFT_TEST_FLOOD");
    memset(f, 0, sizeof(*f));
    f->root = *root;
    f->job = job;
    f->kind = kind;
    f->decoy_fd = -1;
    if (m == QUIET)
        return;
    if (m == DECOY) {
        f->root.in.sin_port = 0; /* same offset in both families */
        cr_assert_eq(weft_sock_listen(&f->root, &f->decoy_fd), WEFT_OK);
        cr_assert_eq(listen(f->decoy_fd, 4096), 0);
        cr_assert_eq(pthread_create(&f->th[f->nth++], NULL, decoy, f), 0);
    }
    for (size_t i = 0; i < sizeof(fn) / sizeof(fn[0]); i++)
        if (only == NULL || strstr(only, name[i]))
            cr_assert_eq(pthread_create(&f->th[f->nth++], NULL, fn[i], f), 0);
    /* The strangers fill the listen queue before any rank comes. */
    sleep_ms(300);
}

/* Stops the flood (once); returns the connections it made. */
static long flood_stop(struct flood *f)
{
    if (!atomic_exchange(&f->stop, 1)) {
        for (int i = 0; i < f->nth; i++)
            pthread_join(f->th[i], NULL);
        if (f->decoy_fd >= 0)
            close(f->decoy_fd);
    }
    cr_expect_eq(f->auth_ok, 0, "%d wrong-secret handshakes were accepted", f->auth_ok);
    return atomic_load(&f->connects);
}

/* ---- the jobs ----------------------------------------------------------------- */

/* go: the test writes one byte per rank when a rendezvous may start ('q':
 * the job ends instead); rep: each rank writes a record after it. */
static int go_pipe[2], rep_pipe[2];
/* The tcp rounds: rank 0 and TARGET start on a byte from early_pipe. */
static int early_pipe[2];

struct rep {
    int32_t rank;
    int32_t ok;
    double secs;               /* this rank's weft_comm_init or weft_comm_shrink */
    union weft_sockaddr where; /* rank 0, first record of the shrink job: its shrink listener */
};

static int report_back(struct rep *r)
{
    if (write(rep_pipe[1], r, sizeof(*r)) == (ssize_t)sizeof(*r))
        return 0;
    return weft_test_fail(r->rank, "cannot report: %s", strerror(errno));
}

/* Exact sums over comm (x[i] = (rank + 1) * (i - round)), then every rank's
 * pid in its own slot: the table holds the real processes.  0 or 1. */
static int check_job(weft_comm_t comm, int rank, int p, int round)
{
    enum { CNT = 10007 };
    static int64_t x[CNT], y[CNT];
    for (int i = 0; i < CNT; i++)
        x[i] = (int64_t)(rank + 1) * (i - round);
    WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(x, y, CNT, WEFT_INT64, WEFT_SUM, comm));
    for (int i = 0; i < CNT; i++)
        if (y[i] != (int64_t)p * (p + 1) / 2 * (i - round))
            return weft_test_fail(rank, "allreduce %d [%d]: expected %lld, got %lld", round, i,
                                  (long long)p * (p + 1) / 2 * (i - round), (long long)y[i]);
    int64_t pid = getpid(), pids[RANKS];
    WT_CHECK_OK(rank, comm, "allgather", weft_allgather(&pid, pids, 1, WEFT_INT64, comm));
    if (pids[rank] != pid)
        return weft_test_fail(rank, "allgather: my slot holds pid %lld, not %lld",
                              (long long)pids[rank], (long long)pid);
    return 0;
}

/* Init when told, report, check.  arg != NULL: then shrink (a new
 * communicator of the same ranks) once per go byte, report and check each. */
static int flood_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    close(go_pipe[1]);
    close(early_pipe[1]);
    close(rep_pipe[0]);
    char c;
    if (arg == NULL && read(go_pipe[0], &c, 1) != 1)
        return weft_test_fail(rank, "no start signal");
    weft_comm_t comm = NULL;
    uint64_t t0 = weft_now_ns();
    int bad = weft_test_child_init(&comm, nranks, id, rank);
    struct rep r = {.rank = rank, .ok = !bad, .secs = (double)(weft_now_ns() - t0) / 1e9};
    if (arg != NULL && comm != NULL)
        r.where = comm->rescue[0]; /* rank 0 leads every shrink */
    if ((arg == NULL || rank == 0) && report_back(&r))
        return 2;
    if (bad)
        return 2;
    int fails = check_job(comm, rank, nranks, 0);
    for (int round = 1; arg != NULL && read(go_pipe[0], &c, 1) == 1 && c != 'q'; round++) {
        weft_comm_t child = NULL;
        t0 = weft_now_ns();
        weft_status_t st = weft_comm_shrink(comm, NULL, 0, &child);
        r = (struct rep){.rank = rank, .ok = st == WEFT_OK,
                         .secs = (double)(weft_now_ns() - t0) / 1e9};
        if (report_back(&r))
            return 2;
        WT_CHECK_OK(rank, comm, "weft_comm_shrink", st);
        fails += check_job(child, rank, nranks, round);
        WT_CHECK_OK(rank, child, "weft_comm_destroy (child)", weft_comm_destroy(child));
    }
    WT_CHECK_OK(rank, comm, "weft_comm_destroy", weft_comm_destroy(comm));
    return fails ? 1 : 0;
}

/* ---- the tcp data listener ------------------------------------------------ */

/* Finds this process's tcp data listener while weft_comm_init runs: the
 * new listening socket that tcp_init tuned (TCP_NODELAY; the bootstrap's
 * and the shrink's listeners are left untuned), and reports its address
 * on rep_pipe as a record of rank -1. */
struct finder {
    bool old[128]; /* listeners from before the init */
    atomic_int stop;
};

static bool tuned_listener(int fd)
{
    int v = 0;
    socklen_t len = sizeof(v);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &v, &len) != 0 || !v)
        return false;
    len = sizeof(v);
    return getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len) == 0 && v;
}

static void *find_listener(void *arg)
{
    struct finder *fi = arg;
    while (!atomic_load(&fi->stop)) {
        for (int fd = 3; fd < 128; fd++) {
            struct rep r = {.rank = -1, .ok = 1};
            socklen_t len = sizeof(r.where);
            if (fi->old[fd] || !tuned_listener(fd) || getsockname(fd, &r.where.sa, &len) != 0)
                continue;
            if (write(rep_pipe[1], &r, sizeof(r)) != (ssize_t)sizeof(r))
                weft_test_fail(TARGET, "cannot report the listener: %s", strerror(errno));
            return NULL;
        }
        sleep_ms(1);
    }
    return NULL;
}

/* A rank of the tcp rounds: 8 hosts on tcp alone; rank 0 and TARGET start
 * first (TARGET's finder tells the test where to aim), the others when
 * the flood is on.  Init connects ring neighbours (the calibration); the
 * first collective, direct, every pair.  TARGET is busy elsewhere for
 * BUSY_MS after init, as ranks are, so its peers' connections wait in its
 * listen queue among the strangers.  Each rank reports once init and its
 * first collectives (checked exactly) are done. */
static int data_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    (void)arg;
    close(go_pipe[1]);
    close(early_pipe[1]);
    close(rep_pipe[0]);
    char host[32], c;
    snprintf(host, sizeof(host), "flood-host-%d", rank);
    setenv("WEFT_HOSTID", host, 1);
    setenv("WEFT_TRANSPORT", "tcp", 1);
    setenv("WEFT_ALGO", "direct", 1);
    weft_param_reload();
    bool early = rank == 0 || rank == TARGET;
    if (read(early ? early_pipe[0] : go_pipe[0], &c, 1) != 1)
        return weft_test_fail(rank, "no start signal");
    static struct finder fi;
    pthread_t th;
    if (rank == TARGET) {
        for (int fd = 3; fd < 128; fd++)
            fi.old[fd] = tuned_listener(fd);
        if (pthread_create(&th, NULL, find_listener, &fi) != 0)
            return weft_test_fail(rank, "cannot start the listener finder");
    }
    weft_comm_t comm = NULL;
    uint64_t t0 = weft_now_ns();
    int bad = weft_test_child_init(&comm, nranks, id, rank);
    if (rank == TARGET) {
        atomic_store(&fi.stop, 1);
        pthread_join(th, NULL);
        sleep_ms(BUSY_MS);
    }
    int fails = bad ? 2 : check_job(comm, rank, nranks, 0);
    struct rep r = {.rank = rank, .ok = !bad && !fails,
                    .secs = (double)(weft_now_ns() - t0) / 1e9};
    if (report_back(&r))
        return 2;
    if (bad)
        return 2;
    WT_CHECK_OK(rank, comm, "weft_comm_destroy", weft_comm_destroy(comm));
    return fails ? 1 : 0;
}

/* Lets the ranks that wait on go_pipe (all but `early`) start a
 * rendezvous and waits for every rank's record (the flood stops after
 * FLOOD_MAX_S).  Returns the seconds from the signal to the last record;
 * *root_s: rank `focus`'s own figure. */
static double rendezvous(struct flood *f, const char *what, int early, int focus, double *root_s)
{
    char go[RANKS];
    memset(go, 'g', sizeof(go));
    uint64_t t0 = weft_now_ns();
    cr_assert_eq(write(go_pipe[1], go, (size_t)(RANKS - early)), (ssize_t)(RANKS - early));
    int seen = 0, ok = 0;
    *root_s = -1;
    while (seen < RANKS && weft_now_ns() - t0 < 90 * 1000 * MS) {
        struct pollfd p = {.fd = rep_pipe[0], .events = POLLIN};
        struct rep r;
        if (weft_now_ns() - t0 > FLOOD_MAX_S * 1000 * MS)
            flood_stop(f); /* a listener the strangers starve admits the ranks only now */
        if (poll(&p, 1, 100) != 1)
            continue;
        if (read(rep_pipe[0], &r, sizeof(r)) != (ssize_t)sizeof(r))
            break;
        seen++;
        ok += r.ok;
        if (r.rank == focus)
            *root_s = r.secs;
    }
    double secs = (double)(weft_now_ns() - t0) / 1e9;
    cr_assert_eq(seen, RANKS, "%s: only %d of %d ranks reported back", what, seen, RANKS);
    cr_assert_eq(ok, RANKS, "%s: %d of %d ranks failed (see the rank messages)", what,
                 RANKS - ok, RANKS);
    return secs;
}

static void job_start_proc(struct weft_test_job *job, weft_test_proc_t proc, void *arg)
{
    cr_assert_eq(pipe(go_pipe), 0);
    cr_assert_eq(pipe(early_pipe), 0);
    cr_assert_eq(pipe(rep_pipe), 0);
    cr_assert_eq(weft_test_job_start_proc(job, RANKS, proc, arg), 0);
    close(go_pipe[0]);
    close(early_pipe[0]);
    close(rep_pipe[1]);
}

/* Waits for the job; a shrink job is told to end first. */
static void job_end(struct weft_test_job *job, const char *what, bool shrinking)
{
    char quit[RANKS];
    memset(quit, 'q', sizeof(quit));
    if (shrinking)
        cr_expect_eq(write(go_pipe[1], quit, sizeof(quit)), (ssize_t)sizeof(quit));
    close(go_pipe[1]);
    close(early_pipe[1]);
    close(rep_pipe[0]);
    cr_assert_eq(weft_test_job_wait(job, 60), 0, "%s: the job failed (see the rank messages)",
                 what);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Prints the medians of secs[mode][ROUNDS] and checks the root flood's.
 * A listener that leaves a rank to TCP's SYN retry (1 s), or to the
 * flood's end, costs a second or more on top of what the flood's load
 * costs; the bound is half a second over the slower of no flood and the
 * decoy flood (the load alone), so that a loaded 2-core CI passes. */
static void judge(const char *what, const char *target, int focus, double secs[NMODES][ROUNDS],
                  double root[NMODES][ROUNDS], long connects)
{
    double med[NMODES], rmed[NMODES];
    for (int m = 0; m < NMODES; m++) {
        qsort(secs[m], ROUNDS, sizeof(double), cmp_double);
        qsort(root[m], ROUNDS, sizeof(double), cmp_double);
        med[m] = secs[m][ROUNDS / 2];
        rmed[m] = root[m][ROUNDS / 2];
    }
    fprintf(stderr,
            "flood: %s of %d ranks, median of %d (rank %d's own): %.3f s (%.3f) with no flood, "
            "%.3f s (%.3f) flooding a decoy, %.3f s (%.3f) flooding %s: %+.0f ms over no "
            "flood, %+.0f ms over the decoy; %ld stranger connections\n",
            what, RANKS, ROUNDS, focus, med[QUIET], rmed[QUIET],
            med[DECOY], rmed[DECOY], med[ROOT], rmed[ROOT], target ? target : "the root",
            (med[ROOT] - med[QUIET]) * 1e3, (med[ROOT] - med[DECOY]) * 1e3, connects);
    cr_expect_lt(med[ROOT], WEFT_MAX(med[QUIET], med[DECOY]) + 0.5,
                 "%s took %.3f s flooding %s, %.3f s without a flood, %.3f s flooding a "
                 "decoy", what, med[ROOT], target ? target : "the root", med[QUIET], med[DECOY]);
    cr_expect_gt(connects, 1000 * ROUNDS, "%s: the flood made only %ld connections", what,
                 connects);
}

/* Rank TARGET's tcp data listener, as its finder reports it. */
static union weft_sockaddr target_listener(void)
{
    struct rep where;
    struct pollfd p = {.fd = rep_pipe[0], .events = POLLIN};
    cr_assert_eq(write(early_pipe[1], "gg", 2), 2);
    cr_assert(poll(&p, 1, 20000) == 1 &&
                  read(rep_pipe[0], &where, sizeof(where)) == sizeof(where) && where.rank == -1,
              "rank %d did not say where its tcp listener is", TARGET);
    return where.where;
}

/* Init: a new job per round, rounds of each mode interleaved so that a
 * change in the machine's load falls on all of them.  tcp: the flood aims
 * at rank TARGET's tcp data listener instead of the root (data_proc): the
 * job starts rank 0 and TARGET, learns where TARGET listens, floods it (or
 * the decoy, or nothing; after as long, so that they settle alike), and
 * lets the others come: their connections to TARGET meet the flood.  The
 * strangers know the job, not the secret. */
static void init_rounds(bool tcp)
{
    double secs[NMODES][ROUNDS], root[NMODES][ROUNDS];
    long connects = 0;
    for (int r = 0; r < ROUNDS; r++)
        for (int m = 0; m < NMODES; m++) {
            struct weft_test_job job;
            struct flood f;
            job_start_proc(&job, tcp ? data_proc : flood_proc, NULL);
            union weft_sockaddr at = tcp ? target_listener() : job.uid.root;
            flood_start(&f, (enum mode)m, &at, job.uid.job,
                        tcp ? WEFT_AUTH_DATA : WEFT_AUTH_BOOTSTRAP);
            if (tcp && m == QUIET)
                sleep_ms(300);
            secs[m][r] = rendezvous(&f, mode_name[m], tcp ? 2 : 0, tcp ? TARGET - 1 : 0,
                                    &root[m][r]);
            long n = flood_stop(&f);
            connects += m == ROOT ? n : 0;
            job_end(&job, mode_name[m], false);
        }
    char target[48];
    snprintf(target, sizeof(target), "rank %d's tcp listener", TARGET);
    if (tcp)
        judge("tcp init + first collectives", target, TARGET - 1, secs, root, connects);
    else
        judge("init", NULL, 0, secs, root, connects);
}

/* Shrink: one job shrinks once per round; the strangers know the parent's
 * job, not the derived one of the shrink.  The modes go in blocks, the
 * flood last: the listener stays open between shrinks, and the strangers a
 * flood left in its queue would fall on the next round. */
static void shrink_rounds(void)
{
    double secs[NMODES][ROUNDS], root[NMODES][ROUNDS];
    long connects = 0;
    struct weft_test_job job;
    struct rep r0;
    static int shrinking = 1;
    job_start_proc(&job, flood_proc, &shrinking);
    struct pollfd p = {.fd = rep_pipe[0], .events = POLLIN};
    cr_assert(poll(&p, 1, 60000) == 1 && read(rep_pipe[0], &r0, sizeof(r0)) == sizeof(r0) &&
                  r0.ok,
              "the shrink job did not come up");
    for (int m = 0; m < NMODES; m++)
        for (int r = 0; r < ROUNDS; r++) {
            struct flood f;
            flood_start(&f, (enum mode)m, &r0.where, job.uid.job, WEFT_AUTH_BOOTSTRAP);
            secs[m][r] = rendezvous(&f, mode_name[m], 0, 0, &root[m][r]);
            long n = flood_stop(&f);
            connects += m == ROOT ? n : 0;
        }
    job_end(&job, "shrink", true);
    judge("shrink", NULL, 0, secs, root, connects);
}

/* One test, so that Criterion does not run a flood beside the other's
 * quiet rounds. */
Test(flood, root_and_shrink_listeners, .timeout = 300)
{
    setenv("WEFT_DEBUG", "NONE", 0); /* a WARN per dropped stranger otherwise */
    setenv("WEFT_TIMEOUT_MS", "60000", 1);
    const char *on = getenv("WEFT_TEST_FLOOD_ON"); /* root,shrink,tcp: only those */
    if (on == NULL || strstr(on, "root"))
        init_rounds(false);
    if (on == NULL || strstr(on, "shrink"))
        shrink_rounds();
    if (on == NULL || strstr(on, "tcp"))
        init_rounds(true);
}
