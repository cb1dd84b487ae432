/*
 * test_faults.c - the fault matrix: a peer that is killed, frozen
 * (SIGSTOP), closes its communicator, or sends garbage, during init, in the
 * middle of a collective loop, or while every rank is idle, over tcp and
 * over shm.  Every surviving rank must end with WEFT_ERR_REMOTE or
 * WEFT_ERR_TIMEOUT, a message naming a rank, within WEFT_TIMEOUT_MS + 2 s
 * of the fault, no rank may hang, and nothing of the job may stay in
 * /dev/shm.  Each case prints one line per
 * survivor ("fault ...: rank R REMOTE after N ms") for the record.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "src/comm.h"
#include "base/sock.h"
#include "transports/shm/shm.h"
#include "transports/tcp/tcp.h"
#include "transports/transport.h"

#define NRANKS 4
#define VICTIM 2
#define TIMEOUT_MS 2000
#define COUNT (64 * 1024) /* floats: 256 KiB, several chunks */

enum fault { F_KILL, F_STOP, F_CLOSE, F_GARBAGE };
enum phase { P_INIT, P_COLL, P_IDLE };
static const char *const fault_name[] = {"kill", "stop", "close", "garbage"};
static const char *const phase_name[] = {"init", "collective", "idle"};

/* Shared by the test process and the ranks (MAP_SHARED before the fork). */
struct board {
    enum fault fault;
    enum phase phase;
    _Atomic uint64_t fault_ns;  /* when the fault happened (0: not yet) */
    _Atomic int iters[NRANKS];  /* collectives each rank completed */
    _Atomic int done[NRANKS];   /* the rank recorded its end */
    int status[NRANKS];
    uint64_t end_ns[NRANKS];
    char msg[NRANKS][256];
};
static struct board *B;

static void sleep_ms(int ms)
{
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000};
    nanosleep(&t, NULL);
}

static void mark_fault(void)
{
    uint64_t zero = 0;
    atomic_compare_exchange_strong(&B->fault_ns, &zero, weft_now_ns());
}

static int record(int rank, weft_status_t st, const char *msg)
{
    B->status[rank] = st;
    B->end_ns[rank] = weft_now_ns();
    snprintf(B->msg[rank], sizeof(B->msg[rank]), "%s", msg ? msg : "");
    atomic_store(&B->done[rank], 1);
    /* Stay until every survivor has ended, so that none learns of the
     * fault from a survivor's exit; then skip destroy (it would wait for
     * peers that are gone). */
    uint64_t end = weft_now_ns() + (uint64_t)(TIMEOUT_MS + 5000) * 1000000ull;
    for (int r = 0; r < NRANKS && weft_now_ns() < end; r++)
        while (r != VICTIM && !atomic_load(&B->done[r]) && weft_now_ns() < end)
            sleep_ms(1);
    _exit(0);
}

/* ---- the victim's own faults ----------------------------------------------------------- */

/* Random bytes where the next frame header (tcp) or slot descriptor (shm)
 * of the message stream to `peer` belongs. */
static void send_garbage(weft_comm_t comm, int peer)
{
    mark_fault();
    if (comm->link_ops[peer] == &weft_tcp_ops) {
        struct tcp_conn *c = comm->conns[peer];
        uint8_t junk[64];
        for (size_t i = 0; i < sizeof(junk); i++)
            junk[i] = (uint8_t)(i * 37 + 11);
        if (write(c->send[0].fd, junk, sizeof(junk)) != (ssize_t)sizeof(junk))
            fprintf(stderr, "victim: could not write garbage\n");
        return;
    }
    struct shm_conn *c = comm->conns[peer];
    struct shm_ring *ring = c->tx;
    uint64_t head = atomic_load(&ring->head);
    struct shm_slot *s = &ring->slot[head % c->tx_nslots];
    s->seq = 0xdeadbeefull;
    s->kind = 77;
    s->msglen = 1ull << 40;
    s->len = 1u << 30;
    atomic_store_explicit(&s->full, 1, memory_order_release);
    atomic_store(&ring->head, head + 1);
    shm_signal(c);
}

static void self_fault(weft_comm_t comm)
{
    if (B->fault == F_GARBAGE) {
        send_garbage(comm, (VICTIM + 1) % NRANKS);
        return;
    }
    /* F_CLOSE: the process lives on, its communicator is gone. */
    mark_fault();
    weft_comm_abort(comm);
    for (;;)
        sleep_ms(1000);
}

/* ---- collective and idle phases ----------------------------------------------------------- */

static int body(weft_comm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    (void)nranks;
    float *buf = calloc(COUNT, sizeof(float));
    if (buf == NULL)
        return weft_test_fail(rank, "out of memory");
    bool self = B->fault == F_CLOSE || B->fault == F_GARBAGE;
    weft_status_t st = WEFT_OK;
    if (B->phase == P_IDLE) {
        st = weft_allreduce(buf, buf, COUNT, WEFT_FLOAT32, WEFT_SUM, comm);
        if (st != WEFT_OK)
            return weft_test_fail(rank, "first allreduce: %s", weft_last_error(comm));
        atomic_fetch_add(&B->iters[rank], 1);
        if (rank == VICTIM && self) {
            sleep_ms(100);
            self_fault(comm);
        }
        while (atomic_load(&B->fault_ns) == 0)
            sleep_ms(1);
        sleep_ms(100); /* idle after the fault, then call */
    }
    for (int i = 0; st == WEFT_OK; i++) {
        if (rank == VICTIM && self && i == 20 && B->phase == P_COLL)
            self_fault(comm);
        st = weft_allreduce(buf, buf, COUNT, WEFT_FLOAT32, WEFT_SUM, comm);
        atomic_fetch_add(&B->iters[rank], 1);
        if (i > 100000)
            return weft_test_fail(rank, "100000 allreduces and no error");
    }
    free(buf);
    return record(rank, st, weft_last_error(comm));
}

/* ---- init phase --------------------------------------------------------------------------- */

static void *victim_signal(void *arg)
{
    sleep_ms((int)(intptr_t)arg);
    mark_fault();
    raise(B->fault == F_KILL ? SIGKILL : SIGSTOP);
    return NULL;
}

/* A stranger's turn at rank 0's bootstrap listener: connect, then close
 * or send garbage, and go away without ever joining. */
static void poke_root(const weft_unique_id_t *id)
{
    struct weft_uid uid;
    int fd = -1;
    if (weft_uid_parse(id, &uid) != WEFT_OK ||
        weft_sock_connect(&uid.root, weft_now_ns() + 2000000000ull, &fd) != WEFT_OK)
        return;
    mark_fault();
    if (B->fault == F_GARBAGE) {
        char junk[200];
        memset(junk, 0xa5, sizeof(junk));
        if (write(fd, junk, sizeof(junk)) < 0)
            fprintf(stderr, "victim: write: %s\n", strerror(errno));
    }
    close(fd);
}

static int init_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    (void)arg;
    if (rank == VICTIM) {
        if (B->fault == F_CLOSE || B->fault == F_GARBAGE) {
            poke_root(id);
            _exit(0);
        }
        /* Somewhere inside init (or just after it). */
        pthread_t t;
        pthread_create(&t, NULL, victim_signal, (void *)(intptr_t)(rank * 7 % 30));
    }
    weft_comm_t comm = NULL;
    weft_status_t st = weft_comm_init(&comm, nranks, *id, rank);
    if (st != WEFT_OK)
        return record(rank, st, weft_last_error(NULL));
    float *buf = calloc(COUNT, sizeof(float));
    for (int i = 0; st == WEFT_OK && i < 100000; i++)
        st = weft_allreduce(buf, buf, COUNT, WEFT_FLOAT32, WEFT_SUM, comm);
    return record(rank, st, weft_last_error(comm));
}

/* ---- the test process ---------------------------------------------------------------------- */

static void run_case(enum fault f, enum phase p, const char *transport)
{
    if (strcmp(transport, "verbs") == 0 && !getenv("WEFT_TEST_SOFTVERBS"))
        cr_skip_test("needs the software verbs device preloaded (tests/verbs.sh)");
    B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(B != MAP_FAILED);
    memset(B, 0, sizeof(*B));
    B->fault = f;
    B->phase = p;
    char tmo[16];
    snprintf(tmo, sizeof(tmo), "%d", TIMEOUT_MS);
    setenv("WEFT_TIMEOUT_MS", tmo, 1);
    setenv("WEFT_TRANSPORT", transport, 1);
    setenv("WEFT_DEBUG", "NONE", 1);
    struct weft_test_job job;
    if (p == P_INIT)
        cr_assert_eq(weft_test_job_start_proc(&job, NRANKS, init_proc, NULL), 0);
    else
        cr_assert_eq(weft_test_job_start(&job, NRANKS, body, NULL), 0);
    job.quiet = true;
    if (f == F_KILL || f == F_STOP) {
        if (p != P_INIT) {
            /* Mid-loop: once the victim is well into it.  Idle: once all
             * ranks sit after their first allreduce. */
            int want = p == P_COLL ? 20 : 1;
            uint64_t end = weft_now_ns() + 20000000000ull;
            for (;;) {
                bool ready = true;
                for (int r = 0; r < NRANKS; r++)
                    ready &= atomic_load(&B->iters[r]) >= want;
                if (ready || weft_now_ns() > end)
                    break;
                sleep_ms(1);
            }
            if (p == P_IDLE)
                sleep_ms(50);
            mark_fault();
            weft_test_job_signal(&job, VICTIM, f == F_KILL ? SIGKILL : SIGSTOP);
        }
    }
    /* The survivors end by themselves; then the victim goes. */
    uint64_t end = weft_now_ns() + (uint64_t)(TIMEOUT_MS + 10000) * 1000000ull;
    for (;;) {
        int n = 0;
        for (int r = 0; r < NRANKS; r++)
            n += r != VICTIM && atomic_load(&B->done[r]);
        if (n == NRANKS - 1 || weft_now_ns() > end)
            break;
        sleep_ms(5);
    }
    weft_test_job_signal(&job, VICTIM, SIGKILL);
    weft_test_job_signal(&job, VICTIM, SIGCONT);
    weft_test_job_wait(&job, 10);
    uint64_t fault_ns = atomic_load(&B->fault_ns);
    cr_assert(fault_ns != 0, "the fault never happened");
    for (int r = 0; r < NRANKS; r++) {
        if (r == VICTIM)
            continue;
        cr_assert(atomic_load(&B->done[r]), "rank %d never ended (hung: %d, exit %d)", r,
                  job.hung[r], weft_test_job_exit_code(&job, r));
        double ms = (double)(int64_t)(B->end_ns[r] - fault_ns) / 1e6;
        printf("fault %-7s %-10s %-3s: rank %d %-7s after %6.0f ms: %s\n", fault_name[f],
               phase_name[p], transport, r, weft_status_string(B->status[r]), ms, B->msg[r]);
        cr_expect(B->status[r] == WEFT_ERR_REMOTE || B->status[r] == WEFT_ERR_TIMEOUT,
                  "rank %d ended with %s: %s", r, weft_status_string(B->status[r]), B->msg[r]);
        cr_expect(strstr(B->msg[r], "rank") != NULL, "rank %d: message names no rank: %s", r,
                  B->msg[r]);
        cr_expect(ms < TIMEOUT_MS + 2000, "rank %d took %.0f ms to see the %s", r, ms,
                  fault_name[f]);
    }
    /* Nothing of the job may stay in /dev/shm, whoever died when. */
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "weft-%016llx-", (unsigned long long)job.uid.job);
    DIR *d = opendir("/dev/shm");
    for (struct dirent *e; d && (e = readdir(d)) != NULL;)
        cr_expect(strncmp(e->d_name, prefix, strlen(prefix)) != 0, "/dev/shm/%s was left behind",
                  e->d_name);
    if (d)
        closedir(d);
    fflush(stdout);
    munmap(B, sizeof(*B));
}

#define FAULT_CASE(f, p, t)                                                                      \
    Test(faults, f##_##p##_##t, .timeout = 60)                                                   \
    {                                                                                            \
        run_case(F_##f, P_##p, #t);                                                              \
    }

#define FAULT_ROW(f, p)                                                                          \
    FAULT_CASE(f, p, tcp)                                                                        \
    FAULT_CASE(f, p, shm)

FAULT_ROW(KILL, INIT)
FAULT_ROW(KILL, COLL)
FAULT_ROW(KILL, IDLE)
FAULT_ROW(STOP, INIT)
FAULT_ROW(STOP, COLL)
FAULT_ROW(STOP, IDLE)
FAULT_ROW(CLOSE, INIT)
FAULT_ROW(CLOSE, COLL)
FAULT_ROW(CLOSE, IDLE)
FAULT_ROW(GARBAGE, INIT)
FAULT_ROW(GARBAGE, COLL)
FAULT_ROW(GARBAGE, IDLE)
/* Over verbs on the software device (tests/verbs.sh preloads it): a peer
 * killed or stopped in the middle of the loop or while idle. */
FAULT_CASE(KILL, COLL, verbs)
FAULT_CASE(KILL, IDLE, verbs)
FAULT_CASE(STOP, COLL, verbs)
FAULT_CASE(KILL, INIT, verbs)

/* Faults the software verbs device injects (WEFT_SOFTVERBS_FAULT, in
 * every rank's device: the harness's ranks share one environment): a
 * failed completion, a queue pair killed, the port going down.  Every
 * rank must end with an error naming a rank, within the timeout; none
 * may hang. */
static void run_inject(const char *spec)
{
    if (!getenv("WEFT_TEST_SOFTVERBS"))
        cr_skip_test("needs the software verbs device preloaded (tests/verbs.sh)");
    B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(B != MAP_FAILED);
    memset(B, 0, sizeof(*B));
    B->fault = F_CLOSE + 100; /* none of the self-made faults */
    B->phase = P_COLL;
    char tmo[16];
    snprintf(tmo, sizeof(tmo), "%d", TIMEOUT_MS);
    setenv("WEFT_TIMEOUT_MS", tmo, 1);
    setenv("WEFT_TRANSPORT", "verbs", 1);
    setenv("WEFT_IB_TIMEOUT", "14", 1);
    setenv("WEFT_SOFTVERBS_FAULT", spec, 1);
    /* Connections are made by the first collective, not by init's
     * calibration: the faults land in the loop the ranks report from. */
    setenv("WEFT_CALIBRATE", "0", 1);
    setenv("WEFT_DEBUG", "NONE", 1);
    struct weft_test_job job;
    mark_fault();
    cr_assert_eq(weft_test_job_start(&job, NRANKS, body, NULL), 0);
    job.quiet = true;
    uint64_t fault_ns = atomic_load(&B->fault_ns);
    uint64_t end = weft_now_ns() + (uint64_t)(TIMEOUT_MS + 20000) * 1000000ull;
    for (;;) {
        int n = 0;
        for (int r = 0; r < NRANKS; r++)
            n += atomic_load(&B->done[r]);
        if (n == NRANKS || weft_now_ns() > end)
            break;
        sleep_ms(5);
    }
    weft_test_job_wait(&job, 10);
    for (int r = 0; r < NRANKS; r++) {
        cr_assert(atomic_load(&B->done[r]), "rank %d never ended (hung: %d, exit %d)", r,
                  job.hung[r], weft_test_job_exit_code(&job, r));
        double ms = (double)(int64_t)(B->end_ns[r] - fault_ns) / 1e6;
        printf("inject %-16s: rank %d %-7s after %6.0f ms, %d collectives: %s\n", spec, r,
               weft_status_string(B->status[r]), ms, atomic_load(&B->iters[r]), B->msg[r]);
        cr_expect(B->status[r] == WEFT_ERR_REMOTE || B->status[r] == WEFT_ERR_TIMEOUT ||
                      B->status[r] == WEFT_ERR_SYSTEM,
                  "rank %d ended with %s: %s", r, weft_status_string(B->status[r]), B->msg[r]);
        cr_expect(strstr(B->msg[r], "rank") != NULL, "rank %d: message names no rank: %s", r,
                  B->msg[r]);
    }
    fflush(stdout);
    munmap(B, sizeof(*B));
}

Test(faults, inject_failed_completion_verbs, .timeout = 60) { run_inject("fail=300"); }
Test(faults, inject_access_error_verbs, .timeout = 60) { run_inject("fail=300:rem_access"); }
Test(faults, inject_killed_qp_verbs, .timeout = 60) { run_inject("kill_qp=300"); }
Test(faults, inject_port_down_verbs, .timeout = 60) { run_inject("port_down=1500"); }
/* The connection manager refuses a connection request (rdma_cm path). */
Test(faults, inject_cm_reject_verbs, .timeout = 60) { run_inject("cm_reject=1"); }

/* ---- shrink after a failure -------------------------------------------------------------- */

/* A "training loop": each step all-reduces a gradient whose exact sum is
 * known.  The victim is killed mid-loop; the survivors see the error,
 * shrink around the victim and finish every remaining step on the new
 * communicator with exact results. */
#define STEPS 60

static int step_check(weft_comm_t comm, float *g, int step, int rank, int members,
                      const int *ranks_in)
{
    for (size_t i = 0; i < COUNT; i++)
        g[i] = (float)(rank + 1) * (float)(step % 7 + 1) + (float)(i % 5);
    weft_status_t st = weft_allreduce(g, g, COUNT, WEFT_FLOAT32, WEFT_SUM, comm);
    if (st != WEFT_OK)
        return st;
    float sum_r = 0;
    for (int k = 0; k < members; k++)
        sum_r += (float)(ranks_in[k] + 1);
    for (size_t i = 0; i < COUNT; i += 97) {
        float want = sum_r * (float)(step % 7 + 1) + (float)members * (float)(i % 5);
        if (g[i] != want) {
            fprintf(stderr, "rank %d: step %d: element %zu is %g, expected %g\n", rank, step, i,
                    (double)g[i], (double)want);
            return -1000;
        }
    }
    return WEFT_OK;
}

static int g_shrink_victim;

static int shrink_body(weft_comm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    float *g = calloc(COUNT, sizeof(float));
    int all[NRANKS], survivors[NRANKS], ns = 0;
    for (int r = 0; r < nranks; r++) {
        all[r] = r;
        if (r != g_shrink_victim)
            survivors[ns++] = r;
    }
    int step = 0, st = WEFT_OK;
    for (; step < STEPS; step++) {
        st = step_check(comm, g, step, rank, nranks, all);
        atomic_fetch_add(&B->iters[rank], 1);
        if (st != WEFT_OK)
            break;
    }
    if (st == -1000)
        return 1;
    if (step == STEPS)
        return weft_test_fail(rank, "all %d steps passed; the victim was never killed", STEPS);
    if (st != WEFT_ERR_REMOTE && st != WEFT_ERR_TIMEOUT)
        return weft_test_fail(rank, "step %d failed with %s: %s", step,
                              weft_status_string(st), weft_last_error(comm));
    /* The failed step is redone on the survivors' communicator. */
    weft_comm_t small = NULL;
    int excluded = g_shrink_victim;
    weft_status_t sst = weft_comm_shrink(comm, &excluded, 1, &small);
    if (sst != WEFT_OK)
        return weft_test_fail(rank, "shrink: %s: %s", weft_status_string(sst),
                              weft_last_error(comm));
    int me = -1, n = 0;
    weft_comm_rank(small, &me);
    weft_comm_size(small, &n);
    if (n != NRANKS - 1 || me != rank - (rank > g_shrink_victim))
        return weft_test_fail(rank, "new communicator: rank %d of %d", me, n);
    /* Survivors may disagree on the last step that completed (a ring step
     * can finish on some ranks before the victim's death stops it on
     * others): like a trainer after a failure, they resume from the
     * earliest one. */
    int32_t resume = step;
    if (weft_allreduce(&resume, &resume, 1, WEFT_INT32, WEFT_MIN, small) != WEFT_OK)
        return weft_test_fail(rank, "agreeing on the step: %s", weft_last_error(small));
    step = resume;
    for (; step < STEPS; step++) {
        st = step_check(small, g, step, rank, ns, survivors);
        if (st != WEFT_OK)
            return weft_test_fail(rank, "step %d after the shrink: %s: %s", step,
                                  weft_status_string(st), weft_last_error(small));
    }
    /* Shrinking the failed communicator again also works (a second
     * rendezvous on the same listener). */
    weft_comm_t again = NULL;
    sst = weft_comm_shrink(comm, &excluded, 1, &again);
    if (sst != WEFT_OK || step_check(again, g, 0, rank, ns, survivors) != WEFT_OK)
        return weft_test_fail(rank, "second shrink: %s", weft_last_error(comm));
    weft_comm_destroy(again);
    weft_comm_destroy(small);
    free(g);
    return record(rank, WEFT_OK, "");
}

static void run_shrink(int victim, const char *transport)
{
    B = mmap(NULL, sizeof(*B), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(B != MAP_FAILED);
    memset(B, 0, sizeof(*B));
    g_shrink_victim = victim;
    setenv("WEFT_TIMEOUT_MS", "5000", 1);
    setenv("WEFT_TRANSPORT", transport, 1);
    setenv("WEFT_DEBUG", "NONE", 1);
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start(&job, NRANKS, shrink_body, NULL), 0);
    job.quiet = true;
    uint64_t end = weft_now_ns() + 20000000000ull;
    while (atomic_load(&B->iters[victim]) < 10 && weft_now_ns() < end)
        sleep_ms(1);
    weft_test_job_signal(&job, victim, SIGKILL);
    weft_test_job_wait(&job, 40);
    for (int r = 0; r < NRANKS; r++)
        if (r != victim)
            cr_expect(atomic_load(&B->done[r]) && B->status[r] == WEFT_OK,
                      "rank %d did not finish after the shrink (exit %d, hung %d)", r,
                      weft_test_job_exit_code(&job, r), job.hung[r]);
    munmap(B, sizeof(*B));
}

Test(faults, shrink_after_kill_tcp, .timeout = 60) { run_shrink(2, "tcp"); }
Test(faults, shrink_after_kill_shm, .timeout = 60) { run_shrink(2, "shm"); }
Test(faults, shrink_after_kill_of_rank_0, .timeout = 60) { run_shrink(0, "tcp"); }
