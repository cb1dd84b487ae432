/*
 * test_security.c - strangers on the wire.  (a) While a job initialises,
 * a process that knows the root's address (but not the secret) sends
 * garbage, stays silent, floods connections and tries handshakes with a
 * wrong secret: the job must complete with exact results and the stranger
 * must get nothing but a closed connection.  (b) After init, a thread
 * hammers a rank's data listener the same way while the ranks run
 * allreduces.  (c) Ranks that disagree on the secret fail with an error
 * within WEFT_TIMEOUT_MS instead of hanging.  (d) The same stranger at the
 * listener a rank opens for weft_comm_shrink, before and during a shrink.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h" /* HAVE_RDMACM */
#include "base/auth.h"
#include "bootstrap.h"
#include "comm.h"
#include "harness.h"
#include "base/sock.h"

#define MS 1000000ull

/* The strangers make the library log a WARN per refused connection; they
 * are expected here, so the tests run quiet unless WEFT_DEBUG is set. */
static void quiet_logs(void)
{
    setenv("WEFT_DEBUG", "NONE", 0);
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* A stranger's connect: no retries, bounded; -1 when refused or slow. */
static int stranger_connect(const union weft_sockaddr *to, int timeout_ms)
{
    int fd = socket(to->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    if (connect(fd, &to->sa, weft_sock_len(to)) != 0) {
        if (errno != EINPROGRESS) {
            close(fd);
            return -1;
        }
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int err = 0;
        socklen_t len = sizeof(err);
        if (poll(&p, 1, timeout_ms) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 ||
            err != 0) {
            close(fd);
            return -1;
        }
    }
    return fd;
}

static void send_some(int fd, const void *buf, size_t len)
{
    /* A stranger does not care whether its bytes arrive. */
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
}

/* What a stranger's socket shows: bytes it was sent, and whether the
 * other side closed it (EOF or reset) within wait_ms. */
struct seen {
    size_t bytes;
    bool closed;
};

static struct seen drain(int fd, int wait_ms)
{
    struct seen s = {0, false};
    uint64_t deadline = weft_now_ns() + (uint64_t)wait_ms * MS;
    for (;;) {
        uint8_t buf[256];
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) {
            s.bytes += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            s.closed = true;
            return s;
        }
        int left = weft_ms_left(deadline);
        if (left <= 0)
            return s;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        poll(&p, 1, left);
    }
}

/* A handshake with a random secret; returns its status (must fail). */
static weft_status_t wrong_secret_handshake(const union weft_sockaddr *to, uint16_t kind,
                                            uint64_t job, uint32_t rank, uint32_t nranks,
                                            const char **why)
{
    int fd = stranger_connect(to, 1000);
    if (fd < 0) {
        *why = "connection refused";
        return WEFT_ERR_REMOTE;
    }
    uint8_t secret[WEFT_SECRET_BYTES];
    weft_random_bytes(secret, sizeof(secret));
    struct weft_auth_hello h = {.kind = kind, .job = job, .rank = rank, .nranks = nranks};
    weft_status_t st = weft_auth_connect(fd, secret, &h, weft_now_ns() + 3000 * MS, why);
    close(fd);
    return st;
}

/* Checks the sum allreduce of x[i] = (rank + 1) * (i - it) over p ranks
 * (n elements in y); 0, or 1 after saying where it first went wrong. */
static int expect_rank_sums(int rank, int p, int it, const int32_t *y, int n)
{
    for (int i = 0; i < n; i++)
        if (y[i] != p * (p + 1) / 2 * (i - it))
            return weft_test_fail(rank, "allreduce %d [%d]: expected %d, got %d", it, i,
                                  p * (p + 1) / 2 * (i - it), y[i]);
    return 0;
}

/* ---- (a) strangers while the job initialises ------------------------------- */

#define A_RANKS 3
#define A_FLOOD 200

/* Rank 0 writes a byte to ready[1] once the job has checked its results,
 * then holds the job open until the test closes hold[1]: the strangers'
 * sockets are examined while the library, not process exit, owns them. */
static int ready_pipe[2], hold_pipe[2];

static int late_ranks_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    close(hold_pipe[1]);
    close(ready_pipe[0]);
    if (rank > 0)
        sleep_ms(500); /* the strangers get the root to themselves first */
    weft_comm_t comm = NULL;
    if (weft_test_child_init(&comm, nranks, id, rank))
        return 2;
    int fails = 0;
    enum { CNT = 10007 };
    static int64_t x[CNT], y[CNT];
    for (int round = 0; round < 5; round++) {
        for (int i = 0; i < CNT; i++)
            x[i] = (int64_t)(rank + 1) * (i + round);
        WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(x, y, CNT, WEFT_INT64, WEFT_SUM, comm));
        for (int i = 0; i < CNT; i++)
            if (y[i] != (int64_t)nranks * (nranks + 1) / 2 * (i + round)) {
                fails += weft_test_fail(rank, "allreduce round %d [%d]: expected %lld, got %lld",
                                        round, i,
                                        (long long)nranks * (nranks + 1) / 2 * (i + round),
                                        (long long)y[i]);
                break;
            }
    }
    /* Every rank is who it says: the table holds the real processes. */
    int64_t pid = getpid(), pids[A_RANKS];
    WT_CHECK_OK(rank, comm, "allgather", weft_allgather(&pid, pids, 1, WEFT_INT64, comm));
    if (pids[rank] != pid)
        fails += weft_test_fail(rank, "allgather: my own slot holds pid %lld, not %lld",
                                (long long)pids[rank], (long long)pid);
    if (rank == 0) {
        char b = fails ? 'F' : 'R', c;
        if (write(ready_pipe[1], &b, 1) != 1)
            fails += weft_test_fail(rank, "cannot signal the test: %s", strerror(errno));
        while (read(hold_pipe[0], &c, 1) > 0) {
        }
    }
    /* The others wait here for rank 0. */
    WT_CHECK_OK(rank, comm, "final allreduce",
                weft_allreduce(x, y, 1, WEFT_INT64, WEFT_SUM, comm));
    WT_CHECK_OK(rank, comm, "weft_comm_destroy", weft_comm_destroy(comm));
    (void)arg;
    return fails ? 1 : 0;
}

Test(security, strangers_during_init, .timeout = 60)
{
    struct weft_test_job job;
    quiet_logs();
    cr_assert_eq(pipe(ready_pipe), 0);
    cr_assert_eq(pipe(hold_pipe), 0);
    uint64_t t0 = weft_now_ns();
    cr_assert_eq(weft_test_job_start_proc(&job, A_RANKS, late_ranks_proc, NULL), 0);
    close(ready_pipe[1]);
    close(hold_pipe[0]);
    const union weft_sockaddr *root = &job.uid.root;
    int garbage[3], silent, half, flood[A_FLOOD], nflood = 0;

    /* Garbage: random bytes, bytes that start like a HELLO, one byte + EOF. */
    uint8_t junk[200];
    weft_random_bytes(junk, sizeof(junk));
    for (int i = 0; i < 3; i++)
        garbage[i] = stranger_connect(root, 1000);
    silent = stranger_connect(root, 1000);
    half = stranger_connect(root, 1000);
    cr_assert(garbage[0] >= 0 && garbage[1] >= 0 && garbage[2] >= 0 && silent >= 0 && half >= 0,
              "cannot reach the root during init");
    send_some(garbage[0], junk, sizeof(junk));
    memcpy(junk, "WEFT\x01\x00\x01\x00", 8); /* magic, version, kind; nonsense after */
    send_some(garbage[1], junk, WEFT_AUTH_HELLO_LEN + 10);
    send_some(garbage[2], junk, 1);
    shutdown(garbage[2], SHUT_WR);
    send_some(half, junk, WEFT_AUTH_HELLO_LEN / 2); /* a HELLO cut in half */
    /* A flood, held open while the late ranks arrive. */
    for (int i = 0; i < A_FLOOD; i++) {
        int fd = stranger_connect(root, 200);
        if (fd >= 0)
            flood[nflood++] = fd;
    }
    /* Handshakes with a wrong secret: with the right job (the id's address
     * and job leaked, not its secret), and with a wrong job too. */
    const char *why = NULL;
    weft_status_t st =
        wrong_secret_handshake(root, WEFT_AUTH_BOOTSTRAP, job.uid.job, 1, A_RANKS, &why);
    cr_expect_neq(st, WEFT_OK, "a handshake with a wrong secret (right job) succeeded");
    st = wrong_secret_handshake(root, WEFT_AUTH_BOOTSTRAP, job.uid.job ^ 1, 2, A_RANKS, &why);
    cr_expect_neq(st, WEFT_OK, "a handshake with a wrong secret and job succeeded");

    /* Wait for the job to be up and checked (bounded: a hang fails). */
    struct pollfd rp = {.fd = ready_pipe[0], .events = POLLIN};
    char b = 0;
    bool ready = poll(&rp, 1, 30000) == 1 && read(ready_pipe[0], &b, 1) == 1;
    double secs = (double)(weft_now_ns() - t0) / 1e9;
    if (ready) {
        /* Silent strangers must not hold the job until their deadline. */
        cr_expect_lt(secs, 9.0, "init took %.1f s with strangers at the root", secs);
        /* The job is alive: every stranger socket must have been closed by
         * the library, having received nothing (the acceptor speaks only
         * after a valid HELLO). */
        static const char *const gname[3] = {"random bytes", "bad HELLO", "one byte"};
        for (int i = 0; i < 3; i++) {
            struct seen s = drain(garbage[i], 2000);
            cr_expect_eq(s.bytes, 0, "the %s stranger received %zu bytes", gname[i], s.bytes);
            cr_expect(s.closed, "the %s stranger's connection is still open", gname[i]);
        }
        struct seen s = drain(silent, 2000);
        cr_expect(s.bytes == 0 && s.closed, "silent stranger: %zu bytes, closed %d", s.bytes,
                  s.closed);
        s = drain(half, 2000);
        cr_expect(s.bytes == 0 && s.closed, "half-HELLO stranger: %zu bytes, closed %d", s.bytes,
                  s.closed);
        size_t flood_bytes = 0;
        int flood_open = 0;
        for (int i = 0; i < nflood; i++) {
            s = drain(flood[i], i == 0 ? 2000 : 50);
            flood_bytes += s.bytes;
            flood_open += !s.closed;
        }
        cr_expect_eq(flood_bytes, 0, "flood connections received %zu bytes", flood_bytes);
        cr_expect_eq(flood_open, 0, "%d of %d flood connections still open after init",
                     flood_open, nflood);
        /* Init is over: nobody may join any more. */
        int late = stranger_connect(root, 500);
        cr_expect_lt(late, 0, "the root address still accepts connections after init");
        if (late >= 0)
            close(late);
    }
    close(hold_pipe[1]); /* let the job finish */
    int rc = weft_test_job_wait(&job, 30);
    cr_expect(ready, "the job never reported back (after %.1f s)", secs);
    cr_expect_eq(b, ready ? 'R' : 0, "rank 0 found wrong results");
    cr_expect_eq(rc, 0, "the job failed with strangers at its root (see the rank messages)");
    for (int i = 0; i < 3; i++)
        close(garbage[i]);
    close(silent);
    close(half);
    for (int i = 0; i < nflood; i++)
        close(flood[i]);
    close(ready_pipe[0]);
}

/* ---- (b) strangers at a data listener while the job runs --------------------- */

#define B_RANKS 3
#define B_ROUNDS 200
#define B_WATCH 48

/* The stranger thread's state.  Owner: rank 0's body; the thread writes
 * the counters, the body reads them after joining it. */
struct hammer {
    union weft_sockaddr target;  /* rank 1's data listener (or rank 0's shrink listener) */
    uint16_t kind;               /* the handshake the listener expects */
    uint64_t job;
    atomic_int stop;
    atomic_int rounds;           /* stranger rounds done */
    int auth_ok;                 /* wrong-secret handshakes that succeeded: must stay 0 */
    size_t bytes;                /* bytes any stranger socket received: must stay 0 */
    int garbage_open;            /* garbage sockets not closed in time */
    int watch[B_WATCH];          /* garbage sockets, checked for closing later */
    int nwatch;
};

static void *hammer_main(void *arg)
{
    struct hammer *h = arg;
    uint8_t junk[128];
    int flood[100], nflood = 0;
    while (!atomic_load(&h->stop)) {
        int k = h->rounds++;
        /* Every 4th round (the first included, while the ranks make their
         * data connections) holds 100 connections open through the round:
         * more than the listener keeps in their handshake. */
        for (int i = 0; k % 4 == 0 && i < 100; i++)
            if ((flood[nflood] = stranger_connect(&h->target, 100)) >= 0)
                nflood++;
        weft_random_bytes(junk, sizeof(junk));
        if (k % 2)
            memcpy(junk, "WEFT\x01\x00\x02\x00", 8); /* a data HELLO's start */
        /* A whole HELLO's worth of garbage can be refused at once: watched
         * until the end, when it must be closed. */
        int fd = stranger_connect(&h->target, 1000);
        if (fd >= 0) {
            send_some(fd, junk, sizeof(junk));
            if (h->nwatch < B_WATCH)
                h->watch[h->nwatch++] = fd;
            else
                close(fd);
        }
        /* Silent, or one byte: undecidable before the handshake deadline,
         * so they are only held for the round. */
        int quiet = stranger_connect(&h->target, 1000);
        if (quiet >= 0 && k % 3 == 0)
            send_some(quiet, junk, 1);
        const char *why = NULL;
        /* Claims to be rank 0 or 2, with the right job but not the secret. */
        if (wrong_secret_handshake(&h->target, h->kind, h->job, (uint32_t)(k % 2) * 2,
                                   B_RANKS, &why) == WEFT_OK)
            h->auth_ok++;
        if (quiet >= 0) {
            h->bytes += drain(quiet, 0).bytes;
            close(quiet);
        }
        for (int i = 0; i < nflood; i++) {
            h->bytes += drain(flood[i], 0).bytes;
            close(flood[i]);
        }
        nflood = 0;
    }
    return NULL;
}

static int hammered_body(weft_comm_t comm, int rank, int p, void *arg)
{
    int fails = 0;
    /* Everyone's data address, over the bootstrap star: no data connection
     * exists yet, so the stranger is already at work while they are made. */
    uint8_t addrs[B_RANKS][128];
    WT_CHECK_OK(rank, comm, "bootstrap allgather of addresses",
                weft_bootstrap_allgather(comm->bs, comm->taddr, addrs, 128,
                                         weft_now_ns() + 10000 * MS));
    struct hammer h;
    memset(&h, 0, sizeof(h));
    pthread_t th;
    if (rank == 0) {
        memcpy(&h.target, addrs[1], sizeof(h.target));
        h.kind = WEFT_AUTH_DATA;
        h.job = comm->job;
        if (pthread_create(&th, NULL, hammer_main, &h) != 0)
            return weft_test_fail(rank, "pthread_create failed");
    }
    enum { CNT = 4099 };
    static int32_t x[CNT], y[CNT];
    /* The attack lasts at least B_ROUNDS operations and until the stranger
     * has done 5 rounds (on a loaded machine the operations can outrun it);
     * rank 0 decides and tells the others with each round's first call. */
    int attack_end = -1;
    for (int it = 0; attack_end < 0 || it < attack_end + 20; it++) {
        if (attack_end < 0) {
            int32_t more = rank == 0 && (it < B_ROUNDS || (atomic_load(&h.rounds) < 5 &&
                                                           it < 50 * B_ROUNDS));
            int32_t any = 0;
            WT_CHECK_OK(rank, comm, "attack-phase vote",
                        weft_allreduce(&more, &any, 1, WEFT_INT32, WEFT_MAX, comm));
            if (!any) {
                attack_end = it;
                if (rank == 0) {
                    atomic_store(&h.stop, 1);
                    pthread_join(th, NULL);
                }
            }
        }
        for (int i = 0; i < CNT; i++)
            x[i] = (rank + 1) * (i - it);
        /* Alternate roots so that connections between every pair are used. */
        if (it % 3 == 2) {
            int root = it % p;
            WT_CHECK_OK(rank, comm, "broadcast under attack",
                        weft_broadcast(x, y, CNT, WEFT_INT32, root, comm));
            for (int i = 0; i < CNT; i++)
                if (y[i] != (root + 1) * (i - it)) {
                    fails += weft_test_fail(rank, "broadcast %d root %d [%d]: expected %d, got %d",
                                            it, root, i, (root + 1) * (i - it), y[i]);
                    break;
                }
            continue;
        }
        WT_CHECK_OK(rank, comm, "allreduce under attack",
                    weft_allreduce(x, y, CNT, WEFT_INT32, WEFT_SUM, comm));
        fails += expect_rank_sums(rank, p, it, y, CNT);
    }
    if (rank == 0) {
        /* The last 20 operations kept rank 1 serving its listener, so the
         * garbage (refused at the first bytes) must be closed by now. */
        for (int i = 0; i < h.nwatch; i++) {
            struct seen s = drain(h.watch[i], 1000);
            h.bytes += s.bytes;
            h.garbage_open += !s.closed;
            close(h.watch[i]);
        }
        if (h.rounds < 5)
            fails += weft_test_fail(rank, "the stranger only got %d rounds in", h.rounds);
        if (h.auth_ok)
            fails += weft_test_fail(rank, "%d wrong-secret handshakes succeeded", h.auth_ok);
        if (h.bytes)
            fails += weft_test_fail(rank, "stranger sockets received %zu bytes", h.bytes);
        if (h.garbage_open)
            fails += weft_test_fail(rank, "%d of %d garbage connections were never closed",
                                    h.garbage_open, h.nwatch);
        if (getenv("WEFT_TEST_VERBOSE"))
            fprintf(stderr, "rank 0: %d stranger rounds against rank 1\n", h.rounds);
    }
    WT_CHECK_OK(rank, comm, "weft_comm_get_error", weft_comm_get_error(comm));
    (void)arg;
    return fails ? 1 : 0;
}

Test(security, strangers_at_data_listener, .timeout = 120)
{
    quiet_logs();
    cr_assert_eq(weft_test_run(B_RANKS, 100, hammered_body, NULL), 0,
                 "the job failed while a stranger hammered rank 1 (see the rank messages)");
}

/* ---- (c) ranks that disagree on the secret ----------------------------------- */

/* Rank 1's id: the job's root address with another secret; the same job
 * number too when same_job (found by flipping id bytes until only the
 * secret changes, so the test does not hard-code the id's layout). */
static int other_id(int rank, const weft_unique_id_t *id, bool same_job, weft_unique_id_t *out)
{
    struct weft_uid uid, o;
    if (weft_uid_parse(id, &uid) != WEFT_OK)
        return weft_test_fail(rank, "cannot parse the job's id: %s", weft_last_error(NULL));
    if (!same_job) {
        uint8_t secret[WEFT_SECRET_BYTES];
        weft_random_bytes(secret, sizeof(secret));
        if (weft_uid_make(out, &uid.root, secret) != WEFT_OK)
            return weft_test_fail(rank, "weft_uid_make: %s", weft_last_error(NULL));
        return 0;
    }
    for (size_t i = 0; i < sizeof(id->internal); i++) {
        *out = *id;
        out->internal[i] ^= 0x5a;
        if (weft_uid_parse(out, &o) == WEFT_OK && o.job == uid.job &&
            memcmp(&o.root, &uid.root, sizeof(o.root)) == 0 &&
            memcmp(o.secret, uid.secret, sizeof(o.secret)) != 0)
            return 0;
    }
    return weft_test_fail(rank, "no byte of the id changes only its secret");
}

/* Init must fail on both sides, with a message, within the deadline. */
static int disagree_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    bool same_job = arg != NULL;
    weft_unique_id_t mine = *id;
    if (rank == 1 && other_id(rank, id, same_job, &mine))
        return 1;
    weft_comm_t comm = NULL;
    uint64_t t0 = weft_now_ns();
    weft_status_t st = weft_comm_init(&comm, nranks, mine, rank);
    double secs = (double)(weft_now_ns() - t0) / 1e9;
    const char *msg = weft_last_error(NULL);
    if (st == WEFT_OK) {
        weft_comm_destroy(comm);
        return weft_test_fail(rank, "init succeeded although rank 1 has another secret");
    }
    int fails = 0;
    if (msg[0] == '\0')
        fails += weft_test_fail(rank, "init failed (%s) with no message", weft_status_string(st));
    /* WEFT_TIMEOUT_MS is 3000: rank 0 waits that long for rank 1 at most. */
    if (secs > 6.0)
        fails += weft_test_fail(rank, "init took %.1f s to fail (WEFT_TIMEOUT_MS=3000)", secs);
    if (rank == 0 && st != WEFT_ERR_TIMEOUT)
        fails += weft_test_fail(rank, "root: expected WEFT_ERR_TIMEOUT, got %s (%s)",
                                weft_status_string(st), msg);
    if (rank == 0 && strstr(msg, "rank 1") == NULL)
        fails += weft_test_fail(rank, "root's message does not name rank 1: \"%s\"", msg);
    if (getenv("WEFT_TEST_VERBOSE"))
        fprintf(stderr, "rank %d: init failed after %.2f s with %s: %s\n", rank, secs,
                weft_status_string(st), msg);
    return fails ? 1 : 0;
}

static void disagree(bool same_job)
{
    /* Parameters are read once per process: set them before any weft call. */
    setenv("WEFT_TIMEOUT_MS", "3000", 1);
    quiet_logs();
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 2, disagree_proc, same_job ? &job : NULL), 0);
    int rc = weft_test_job_wait(&job, 20);
    cr_assert_eq(rc, 0, "ranks with different secrets (%s job): see the rank messages above",
                 same_job ? "same" : "different");
}

Test(security, secret_mismatch_same_job, .timeout = 30) { disagree(true); }
Test(security, secret_mismatch_other_job, .timeout = 30) { disagree(false); }

/* ---- (d) the shrink rendezvous listener ---------------------------------------- */

static int shrink_hammered_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    struct hammer h;
    memset(&h, 0, sizeof(h));
    pthread_t th;
    if (rank == 1) {
        /* Rank 0 will be the new communicator's root: its listener, with
         * the parent's job (the stranger cannot know the derived one). */
        h.target = comm->rescue[0];
        h.kind = WEFT_AUTH_BOOTSTRAP;
        h.job = comm->job;
        if (pthread_create(&th, NULL, hammer_main, &h) != 0)
            return weft_test_fail(rank, "pthread_create failed");
    }
    /* Let the stranger fill the listener's queue before anyone listens. */
    for (int32_t busy = 1; busy;) {
        int32_t mine = rank == 1 && atomic_load(&h.rounds) < 3;
        WT_CHECK_OK(rank, comm, "vote", weft_allreduce(&mine, &busy, 1, WEFT_INT32, WEFT_MAX, comm));
    }
    weft_comm_t child = NULL;
    WT_CHECK_OK(rank, comm, "shrink under attack", weft_comm_shrink(comm, NULL, 0, &child));
    int32_t x = rank + 1, y = 0;
    WT_CHECK_OK(rank, child, "allreduce on the child",
                weft_allreduce(&x, &y, 1, WEFT_INT32, WEFT_SUM, child));
    int fails = 0;
    if (y != p * (p + 1) / 2)
        fails += weft_test_fail(rank, "child allreduce: expected %d, got %d", p * (p + 1) / 2, y);
    weft_comm_destroy(child);
    if (rank == 1) {
        atomic_store(&h.stop, 1);
        pthread_join(th, NULL);
        for (int i = 0; i < h.nwatch; i++) {
            h.bytes += drain(h.watch[i], 0).bytes;
            close(h.watch[i]);
        }
        if (h.auth_ok)
            fails += weft_test_fail(rank, "%d wrong-secret handshakes succeeded", h.auth_ok);
        if (h.bytes)
            fails += weft_test_fail(rank, "stranger sockets received %zu bytes", h.bytes);
    }
    return fails ? 1 : 0;
}

Test(security, strangers_at_shrink_listener, .timeout = 120)
{
    setenv("WEFT_TIMEOUT_MS", "30000", 1);
    quiet_logs();
    cr_assert_eq(weft_test_run(B_RANKS, 100, shrink_hammered_body, NULL), 0,
                 "a shrink failed while a stranger hammered its listener (see the rank messages)");
}

/* ---- (e) strangers at a rank's rdma_cm listener ---------------------------------- */
#ifdef HAVE_RDMACM
#include <rdma/rdma_cma.h>

#include "transports/transport.h"
#include "transports/verbs/verbs.h"

#define CM_CNT 4096

/* One connection request to 127.0.0.1:port carrying priv; the event it
 * ends in (REJECTED expected), or -1 when it got nowhere. */
static int cm_attempt(uint16_t port, const void *priv, size_t len)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();
    struct rdma_cm_id *id = NULL;
    struct rdma_cm_event *ev;
    int result = -1;
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = port};
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (ch == NULL || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) != 0 ||
        rdma_resolve_addr(id, NULL, (struct sockaddr *)&to, 2000) != 0)
        goto out;
    for (int step = 0; step < 3; step++) {
        if (rdma_get_cm_event(ch, &ev) != 0)
            goto out;
        enum rdma_cm_event_type t = ev->event;
        rdma_ack_cm_event(ev);
        if (t == RDMA_CM_EVENT_ADDR_RESOLVED) {
            if (rdma_resolve_route(id, 2000) != 0)
                goto out;
        } else if (t == RDMA_CM_EVENT_ROUTE_RESOLVED) {
            struct ibv_qp_init_attr ia = {.cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                                  .max_send_sge = 1, .max_recv_sge = 1},
                                          .qp_type = IBV_QPT_RC};
            struct rdma_conn_param cp = {.private_data = priv, .private_data_len = (uint8_t)len,
                                         .retry_count = 1, .rnr_retry_count = 1};
            if (rdma_create_qp(id, NULL, &ia) != 0 || rdma_connect(id, &cp) != 0)
                goto out;
        } else {
            result = t;
            break;
        }
    }
out:
    if (id && id->qp)
        rdma_destroy_qp(id);
    if (id)
        rdma_destroy_id(id);
    if (ch)
        rdma_destroy_event_channel(ch);
    return result;
}

/* Rank 1's listener port, from its verbs context (rank 1 only). */
static uint32_t cm_port_of(weft_comm_t comm)
{
    for (int i = 0; i < comm->ntp; i++)
        if (comm->tp[i].ops == &weft_verbs_ops)
            return ((struct vb_ctx *)comm->tp[i].ctx)->cm_port;
    return 0;
}

/* Rank 0 plays the stranger against rank 1 between exact allreduces:
 * garbage, weft's magic with a made-up proof, a rank that does not call
 * rank 1 and a queue pair out of range.  Every request must end in
 * REJECTED, and the job must go on unharmed. */
static int cm_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    static int32_t x[CM_CNT], y[CM_CNT];
    int fails = 0;
    uint32_t port = rank == 1 ? cm_port_of(comm) : 0;
    WT_CHECK_OK(rank, comm, "port broadcast", weft_broadcast(&port, &port, 1, WEFT_UINT32, 1, comm));
    if (port == 0)
        return weft_test_fail(rank, "rank 1 has no rdma_cm listener (is the device preloaded?)");
    struct vb_cm_req fake = {htole32(VB_CM_MAGIC), 0, 0, {0}};
    weft_random_bytes(fake.proof, sizeof(fake.proof));
    struct vb_cm_req far = fake, badq = fake;
    far.rank = htole32(7);
    badq.qp = htole32(3);
    const struct {
        const char *what;
        const void *priv;
        size_t len;
    } tries[] = {{"garbage", "\x01\x02\x03\x04\x05\x06\x07\x08", 8},
                 {"a made-up proof", &fake, sizeof(fake)},
                 {"a rank past the job", &far, sizeof(far)},
                 {"a queue pair past the connection", &badq, sizeof(badq)}};
    for (int it = 0; it < 12; it++) {
        if (rank == 0 && it % 3 == 0) {
            int k = it / 3;
            int ev = cm_attempt((uint16_t)port, tries[k].priv, tries[k].len);
            if (ev != RDMA_CM_EVENT_REJECTED)
                fails += weft_test_fail(rank, "a stranger's request with %s ended in %s, not "
                                              "REJECTED",
                                        tries[k].what, ev < 0 ? "nothing" : rdma_event_str(ev));
        }
        for (int i = 0; i < CM_CNT; i++)
            x[i] = (rank + 1) * (i - it);
        WT_CHECK_OK(rank, comm, "allreduce beside the strangers",
                    weft_allreduce(x, y, CM_CNT, WEFT_INT32, WEFT_SUM, comm));
        fails += expect_rank_sums(rank, p, it, y, CM_CNT);
    }
    WT_CHECK_OK(rank, comm, "weft_comm_get_error", weft_comm_get_error(comm));
    return fails ? 1 : 0;
}
#endif

/* Over verbs on the software verbs device, which emulates librdmacm
 * (tests/verbs.sh preloads it); skipped otherwise. */
Test(security, strangers_at_rdma_cm_listener_verbs, .timeout = 60)
{
#ifdef HAVE_RDMACM
    if (!getenv("WEFT_TEST_SOFTVERBS"))
        cr_skip_test("needs the software verbs device preloaded (tests/verbs.sh)");
    quiet_logs();
    setenv("WEFT_TRANSPORT", "verbs", 1);
    setenv("WEFT_IB_CM", "rdmacm", 1);
    cr_assert_eq(weft_test_run(3, 50, cm_body, NULL), 0,
                 "the job failed while a stranger called rank 1's rdma_cm listener");
#else
    cr_skip_test("built without librdmacm");
#endif
}
