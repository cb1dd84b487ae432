/*
 * test_transport.c - which transport carries each pair: WEFT_TRANSPORT
 * restrictions that leave a pair unreachable fail init on every rank with
 * the reason; a bad name is refused; a rank killed in the middle of a
 * shared-memory AllReduce sweep leaves errors (not hangs) on the others
 * and nothing in /dev/shm.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

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

static int count_segments(uint64_t job)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "weft-%016llx-", (unsigned long long)job);
    DIR *d = opendir("/dev/shm");
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL)
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0;
    if (d)
        closedir(d);
    return n;
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
    cr_assert_eq(count_segments(job.uid.job), 0, "segments of the job left in /dev/shm");
}
