/*
 * test_shm.c - the shared-memory transport between real processes, through
 * the same process harness as test_tcp: each rank is a forked child that
 * maps its peers' segments; the test process hands out the addresses, holds
 * the barrier before ready(), kills ranks and looks at what is left in the
 * shared-memory folder.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "src/comm.h"
#include "tests/tcp_harness.h"
#include "transports/shm/shm.h"

const struct weft_transport_ops *T = &weft_shm_ops;

#define MIB (1u << 20)
#define SLOT (256u << 10) /* WEFT_SHM_SLOT_BYTES's default */

/* ---- helpers -------------------------------------------------------------------- */

/* The folder the transport puts segments in. */
static const char *shm_dir(void)
{
    const char *d = getenv("WEFT_SHM_DIR");
    return d && *d ? d : "/dev/shm";
}

/* Segments of job in dir (NULL: shm_dir()). */
static int count_segments(const char *dir, uint64_t job)
{
    char prefix[64];
    snprintf(prefix, sizeof(prefix), "weft-%016" PRIx64 "-", job);
    DIR *d = opendir(dir ? dir : shm_dir());
    if (d == NULL)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strncmp(de->d_name, prefix, strlen(prefix)) == 0)
            n++;
    closedir(d);
    return n;
}

/* In a rank: every rank has connected (the test process holds the
 * barrier), then ready() unlinks our name. */
static void barrier_ready(struct rank_env *e)
{
    tell_parent(e);
    progress_until_go(e, 30000);
    CHECK(T->ready(e->ctx) == WEFT_OK);
}

/* In the test process: the other side of barrier_ready. */
static void barrier(struct world *w)
{
    char c = 'g';
    for (int r = 0; r < w->nreal; r++)
        cr_assert(read_full(w->up[r], &c, 1, 30000), "rank %d did not reach the barrier", r);
    for (int r = 0; r < w->nreal; r++)
        cr_assert(write_full(w->down[r], &c, 1));
}

/* A whole job of nranks ranks running fn (which starts with barrier_ready);
 * afterwards nothing of it may be left in /dev/shm. */
static void run_shm(int nranks, int (*fn)(struct rank_env *))
{
    struct world w;
    world_init(&w, nranks, nranks, 1, 20000);
    world_start(&w, fn);
    barrier(&w);
    world_finish(&w, 0);
    cr_expect_eq(count_segments(NULL, w.job), 0, "segments of the job left in /dev/shm");
}

static struct weft_shm_stats stats(struct rank_env *e)
{
    struct weft_shm_stats s;
    weft_shm_get_stats(e->ctx, &s);
    return s;
}

#if defined(__x86_64__)
#define TEST_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define TEST_AUDIT_ARCH AUDIT_ARCH_AARCH64
#endif

/* Makes process_vm_readv fail with err in this process (and its children
 * forked later), the way a ptrace policy or an old kernel would. */
static void forbid_cma(int err)
{
#ifdef TEST_AUDIT_ARCH
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, TEST_AUDIT_ARCH, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_process_vm_readv, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (uint32_t)err),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = WEFT_ARRAY_SIZE(f), .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        fprintf(stderr, "rank %d: seccomp: %s\n", g_rank, strerror(errno));
        _exit(3);
    }
#else
    fprintf(stderr, "rank %d: no seccomp filter for this architecture\n", g_rank);
    _exit(3);
#endif
}

/* ---- ping-pong ---------------------------------------------------------------------- */

static int sc_pingpong(struct rank_env *e)
{
    static const size_t sizes[] = {0, 1, 4095, SLOT - 1, SLOT, SLOT + 1, 3 * SLOT + 5, 64 * MIB};
    barrier_ready(e);
    int peer = 1 - e->rank;
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(sizes); k++) {
        size_t n = sizes[k];
        uint8_t *buf = malloc(n + 1);
        CHECK(buf != NULL);
        int iters = n <= SLOT + 1 ? 20 : 3;
        for (int it = 0; it < iters; it++) {
            uint32_t seed = (uint32_t)(k * 1000 + (size_t)it * 2);
            if (e->rank == 0) {
                fill(buf, n, seed);
                send_ok(e, peer, buf, n);
                memset(buf, 0, n + 1);
                CHECKF(recv_ok(e, peer, buf, n + 1) == n, "echo of %zu bytes", n);
                CHECKF(verify(buf, n, seed + 1) == n, "echo of %zu bytes differs", n);
                CHECKF(buf[n] == 0, "echo of %zu bytes wrote past its end", n);
            } else {
                memset(buf, 0, n + 1);
                CHECKF(recv_ok(e, peer, buf, n) == n, "message of %zu bytes", n);
                CHECKF(verify(buf, n, seed) == n, "message of %zu bytes differs at %zu", n,
                       verify(buf, n, seed));
                fill(buf, n, seed + 1);
                send_ok(e, peer, buf, n);
            }
        }
        free(buf);
    }
    return 0;
}

/* CMA on: the messages of 1 MiB and more must have gone that way. */
static int sc_pingpong_cma(struct rank_env *e)
{
    sc_pingpong(e);
    struct weft_shm_stats s = stats(e);
    CHECKF(s.cma_sends == 3 && s.cma_pulls == 3 && s.cma_nacks == 0,
           "cma sends %llu, pulls %llu, nacks %llu", (unsigned long long)s.cma_sends,
           (unsigned long long)s.cma_pulls, (unsigned long long)s.cma_nacks);
    return 0;
}

static int sc_pingpong_ring(struct rank_env *e)
{
    sc_pingpong(e);
    struct weft_shm_stats s = stats(e);
    CHECKF(s.cma_sends == 0 && s.cma_pulls == 0, "cma sends %llu, pulls %llu",
           (unsigned long long)s.cma_sends, (unsigned long long)s.cma_pulls);
    return 0;
}

Test(shm, pingpong_sizes_ring, .timeout = 120)
{
    setenv("WEFT_SHM_CMA_MIN", "0", 1);
    run_shm(2, sc_pingpong_ring);
}

Test(shm, pingpong_sizes_cma, .timeout = 120)
{
    setenv("WEFT_SHM_CMA_MIN", "1M", 1);
    run_shm(2, sc_pingpong_cma);
}

/* Two slots of one page: every message wraps the ring many times. */
Test(shm, pingpong_sizes_2_small_slots, .timeout = 120)
{
    setenv("WEFT_SHM_SLOTS", "2", 1);
    setenv("WEFT_SHM_SLOT_BYTES", "4K", 1);
    setenv("WEFT_SHM_CMA_MIN", "0", 1);
    run_shm(2, sc_pingpong_ring);
}

/* ---- many in flight ----------------------------------------------------------------- */

/* Both ranks post their sends first, then their receives, each far larger
 * than the ring: the pipeline must not deadlock. */
static int sc_both_ways(struct rank_env *e)
{
    static const size_t sizes[] = {8 * MIB, 64 * MIB, 3 * MIB + 7, 8 * MIB, 0, 5};
    enum { N = WEFT_ARRAY_SIZE(sizes) };
    barrier_ready(e);
    int peer = 1 - e->rank;
    uint8_t *out[N], *in[N];
    void *reqs[2 * N];
    size_t got[2 * N];
    for (int i = 0; i < N; i++) {
        out[i] = malloc(sizes[i] + 1);
        in[i] = malloc(sizes[i] + 1);
        CHECK(out[i] && in[i]);
        fill(out[i], sizes[i], (uint32_t)(e->rank * 10 + i));
    }
    for (int i = 0; i < N; i++)
        CHECK(T->isend(e->conn[peer], out[i], sizes[i], &reqs[i]) == WEFT_OK);
    for (int i = 0; i < N; i++)
        CHECK(T->irecv(e->conn[peer], in[i], sizes[i], &reqs[N + i]) == WEFT_OK);
    wait_all(e, reqs, 2 * N, got, 60000);
    for (int i = 0; i < N; i++) {
        CHECK(got[i] == sizes[i] && got[N + i] == sizes[i]);
        CHECKF(verify(in[i], sizes[i], (uint32_t)(peer * 10 + i)) == sizes[i], "message %d", i);
        free(out[i]);
        free(in[i]);
    }
    return 0;
}

Test(shm, both_directions_large_ring, .timeout = 120)
{
    setenv("WEFT_SHM_CMA_MIN", "0", 1);
    run_shm(2, sc_both_ways);
}

Test(shm, both_directions_large_cma, .timeout = 120)
{
    setenv("WEFT_SHM_CMA_MIN", "64K", 1);
    run_shm(2, sc_both_ways);
}

/* 1000 small messages each way, all in flight at once: far more than the
 * ring's slots, so most wait in the queue. */
#define NSMALL 1000
static size_t small_len(int i)
{
    return (size_t)(i * 37) % 251;
}

static int sc_many_small(struct rank_env *e)
{
    barrier_ready(e);
    int peer = 1 - e->rank;
    uint8_t *out = malloc(NSMALL * 256), *in = malloc(NSMALL * 256);
    void **reqs = calloc(2 * NSMALL, sizeof(void *));
    size_t *got = calloc(2 * NSMALL, sizeof(size_t));
    CHECK(out && in && reqs && got);
    memset(in, 0xEE, NSMALL * 256);
    for (int i = 0; i < NSMALL; i++) {
        fill(out + i * 256, small_len(i), (uint32_t)(e->rank * 100000 + i));
        CHECK(T->isend(e->conn[peer], out + i * 256, small_len(i), &reqs[i]) == WEFT_OK);
    }
    for (int i = 0; i < NSMALL; i++)
        CHECK(T->irecv(e->conn[peer], in + i * 256, 256, &reqs[NSMALL + i]) == WEFT_OK);
    wait_all(e, reqs, 2 * NSMALL, got, 30000);
    for (int i = 0; i < NSMALL; i++) {
        size_t n = small_len(i);
        CHECKF(got[i] == n, "send %d reported %zu bytes, not %zu", i, got[i], n);
        CHECKF(got[NSMALL + i] == n, "receive %d got %zu bytes, not %zu", i, got[NSMALL + i], n);
        CHECKF(verify(in + i * 256, n, (uint32_t)(peer * 100000 + i)) == n,
               "message %d arrived wrong (out of order?)", i);
        CHECKF(all_bytes(in + i * 256 + n, 256 - n, 0xEE), "message %d wrote past its end", i);
    }
    free(out);
    free(in);
    free(reqs);
    free(got);
    return 0;
}

Test(shm, many_small_both_ways, .timeout = 60)
{
    run_shm(2, sc_many_small);
}

static int sc_all_to_all(struct rank_env *e)
{
    enum { MSGS = 40 };
    barrier_ready(e);
    int n = e->w->nranks;
    size_t cap = 2 * MIB + 64;
    uint8_t *out[MAXR][MSGS], *in[MAXR][MSGS];
    void *reqs[2 * MAXR * MSGS];
    size_t got[2 * MAXR * MSGS], nreq = 0;
    for (int p = 0; p < n; p++) {
        if (p == e->rank)
            continue;
        for (int i = 0; i < MSGS; i++) {
            size_t len = i == 7 ? 2 * MIB + 3 : (size_t)(i * 997 + p * 13) % 5000;
            out[p][i] = malloc(cap);
            in[p][i] = malloc(cap);
            CHECK(out[p][i] && in[p][i]);
            fill(out[p][i], len, (uint32_t)(e->rank * 1000 + p * 100 + i));
            CHECK(T->irecv(e->conn[p], in[p][i], cap, &reqs[nreq++]) == WEFT_OK);
            CHECK(T->isend(e->conn[p], out[p][i], len, &reqs[nreq++]) == WEFT_OK);
        }
    }
    wait_all(e, reqs, nreq, got, 60000);
    nreq = 0;
    for (int p = 0; p < n; p++) {
        if (p == e->rank)
            continue;
        for (int i = 0; i < MSGS; i++) {
            size_t len = i == 7 ? 2 * MIB + 3 : (size_t)(i * 997 + e->rank * 13) % 5000;
            CHECKF(got[nreq] == len, "from %d message %d: %zu bytes, not %zu", p, i, got[nreq],
                   len);
            CHECKF(verify(in[p][i], len, (uint32_t)(p * 1000 + e->rank * 100 + i)) == len,
                   "from %d message %d", p, i);
            nreq += 2;
            free(out[p][i]);
            free(in[p][i]);
        }
    }
    return 0;
}

Test(shm, four_ranks_all_to_all, .timeout = 90)
{
    run_shm(4, sc_all_to_all);
}

Test(shm, four_ranks_all_to_all_cma, .timeout = 90)
{
    setenv("WEFT_SHM_CMA_MIN", "1M", 1);
    run_shm(4, sc_all_to_all);
}

/* ---- length mismatches ---------------------------------------------------------------- */

static int sc_short_into_long(struct rank_env *e)
{
    barrier_ready(e);
    uint8_t buf[1000];
    if (e->rank == 0) {
        fill(buf, 100, 5);
        send_ok(e, 1, buf, 100);
        fill(buf, 1000, 6);
        send_ok(e, 1, buf, 1000);
    } else {
        memset(buf, 0xEE, sizeof(buf));
        CHECK(recv_ok(e, 0, buf, sizeof(buf)) == 100);
        CHECK(verify(buf, 100, 5) == 100);
        CHECK(all_bytes(buf + 100, 900, 0xEE));
        CHECK(recv_ok(e, 0, buf, sizeof(buf)) == 1000);
        CHECK(verify(buf, 1000, 6) == 1000);
    }
    return 0;
}

Test(shm, short_message_into_long_receive, .timeout = 30)
{
    run_shm(2, sc_short_into_long);
}

/* A longer message than the receive posted fails the receiver before a
 * byte lands, and the sender learns of it through the ring's failure
 * record. */
static size_t g_long;

static int sc_long_into_short(struct rank_env *e)
{
    barrier_ready(e);
    warm_up(e, 1 - e->rank);
    if (e->rank == 0) {
        uint8_t *big = malloc(g_long), in[16];
        CHECK(big != NULL);
        fill(big, g_long, 1);
        void *r = NULL;
        CHECK(T->isend(e->conn[1], big, g_long, &r) == WEFT_OK);
        weft_status_t st = wait_req(e, r, NULL, 10000);
        CHECK(st == WEFT_OK || st == WEFT_ERR_REMOTE);
        CHECK(T->irecv(e->conn[1], in, sizeof(in), &r) == WEFT_OK);
        st = wait_req(e, r, NULL, 5000);
        CHECKF(st == WEFT_ERR_REMOTE, "sender got %s", weft_status_string(st));
        const char *msg = weft_thread_last_error();
        CHECKF(strstr(msg, "rank 1") && strstr(msg, "holds 1024"), "%s", msg);
        free(big);
        tell_parent(e);
    } else {
        uint8_t small[1024];
        memset(small, 0xEE, sizeof(small));
        void *r = NULL;
        CHECK(T->irecv(e->conn[0], small, sizeof(small), &r) == WEFT_OK);
        weft_status_t st = wait_req(e, r, NULL, 10000);
        CHECKF(st == WEFT_ERR_REMOTE, "receiver got %s", weft_status_string(st));
        const char *msg = weft_thread_last_error();
        char want[96];
        snprintf(want, sizeof(want), "rank 0 sent %zu bytes but the receive posted holds 1024",
                 g_long);
        CHECKF(strstr(msg, want), "%s", msg);
        CHECK(all_bytes(small, sizeof(small), 0xEE));
        /* Later requests on the failed connection fail the same way. */
        CHECK(T->irecv(e->conn[0], small, sizeof(small), &r) == WEFT_OK);
        CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_REMOTE);
        CHECK(T->isend(e->conn[0], small, 8, &r) == WEFT_OK);
        CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_REMOTE);
        /* Alive until rank 0 has seen the failure: the failure record
         * must tell it, not our exit. */
        progress_until_go(e, 20000);
    }
    return 0;
}

static void run_long_into_short(size_t n, const char *cma_min)
{
    g_long = n;
    setenv("WEFT_SHM_CMA_MIN", cma_min, 1);
    struct world w;
    world_init(&w, 2, 2, 1, 20000);
    world_start(&w, sc_long_into_short);
    barrier(&w);
    char c;
    cr_assert(read_full(w.up[0], &c, 1, 20000), "rank 0 did not see the failure");
    cr_assert(write_full(w.down[1], &c, 1));
    world_finish(&w, 0);
}

Test(shm, long_message_into_short_receive, .timeout = 30)
{
    run_long_into_short(4096, "0");
}

/* Longer than the ring: the sender is stuck until the failure frees it. */
Test(shm, long_message_into_short_receive_larger_than_ring, .timeout = 30)
{
    run_long_into_short(16 * MIB + 3, "0");
}

Test(shm, long_message_into_short_receive_cma, .timeout = 30)
{
    run_long_into_short(4 * MIB, "64K");
}

/* ---- receives consumed in place (irecv_take) --------------------------------------------- */

/* The taker refuses the first `refuse` chunks (the transport must copy
 * them to the buffer) and copies the rest itself into `taken`: offsets come
 * in order, without gaps, and nothing taken reaches the buffer. */
struct taker {
    uint8_t *taken;
    size_t total, next, refuse, offers, from_buf;
    const uint8_t *buf;
    bool bad;
};

static bool take(void *arg, size_t off, const void *data, size_t len)
{
    struct taker *t = arg;
    if (data == t->buf + off) { /* placed by the transport (CMA): already there */
        t->from_buf += len;
        t->next = off + len;
        return false;
    }
    t->bad |= off != t->next || (off + len < t->total && len % 8 != 0);
    t->next = off + len;
    if (t->offers++ < t->refuse)
        return false;
    memcpy(t->taken + off, data, len);
    return true;
}

static size_t g_take_len;
static bool g_take_cma; /* the message must come by CMA */

static int sc_take(struct rank_env *e)
{
    barrier_ready(e);
    warm_up(e, 1 - e->rank);
    size_t n = g_take_len;
    uint8_t *buf = calloc(1, n), *taken = calloc(1, n);
    CHECK(buf && taken);
    if (e->rank == 1) {
        fill(buf, n, 77);
        send_ok(e, 0, buf, n);
        recv_ok(e, 0, buf, 1); /* hold the mapping until rank 0 is done */
        return 0;
    }
    struct taker t = {.taken = taken, .total = n, .refuse = 2, .buf = buf};
    void *r = NULL;
    CHECK(T->irecv_take(e->conn[1], buf, n, take, &t, &r) == WEFT_OK);
    size_t got = 0;
    CHECK(wait_req(e, r, &got, 20000) == WEFT_OK);
    CHECKF(got == n && !t.bad && t.next == n, "got %zu of %zu, offers in order: %d", got, n, !t.bad);
    uint8_t *want = malloc(n);
    fill(want, n, 77);
    CHECKF((t.from_buf == n) == g_take_cma, "%zu bytes offered from the buffer", t.from_buf);
    if (t.from_buf == n) { /* pulled by CMA into buf, offered from there */
        CHECK(memcmp(buf, want, n) == 0);
    } else {
        size_t cut = WEFT_MIN(n, 2 * (size_t)SLOT); /* the two refused chunks */
        CHECKF(memcmp(buf, want, cut) == 0, "refused chunks not in the buffer");
        CHECKF(memcmp(taken + cut, want + cut, n - cut) == 0, "taken chunks differ");
        for (size_t i = cut; i < n; i++)
            CHECKF(buf[i] == 0, "byte %zu of a taken chunk reached the buffer", i);
    }
    send_ok(e, 1, buf, 1);
    free(want);
    free(buf);
    free(taken);
    return 0;
}

Test(shm, irecv_take_refused_then_taken, .timeout = 60)
{
    setenv("WEFT_SHM_CMA_MIN", "0", 1);
    g_take_len = 5 * SLOT + 24;
    run_shm(2, sc_take);
}

Test(shm, irecv_take_offers_cma_pulls_from_the_buffer, .timeout = 60)
{
    setenv("WEFT_SHM_CMA_MIN", "64K", 1);
    g_take_len = 1 * MIB + 8;
    g_take_cma = true;
    run_shm(2, sc_take);
}

/* ---- dead peers ------------------------------------------------------------------------- */

/* Rank 1 is killed half-way through a 64 MiB message to rank 0 (it filled
 * the ring, then stopped), or while rank 0 is stuck sending it 64 MiB. */
static bool g_victim_sends;
/* Rank 0 never waits in the transport (progress(0), then 1 ms in poll, as
 * a communicator that also has tcp does). */
static bool g_never_wait;

static weft_status_t wait_no_sleep(struct rank_env *e, void *r, int limit_ms)
{
    uint64_t end = weft_now_ns() + (uint64_t)limit_ms * 1000000;
    for (;;) {
        int done = 0;
        weft_status_t st = T->test(r, &done, NULL);
        if (st != WEFT_OK || done)
            return st;
        CHECKF(weft_now_ns() < end, "request not done within %d ms", limit_ms);
        CHECK(T->progress(e->ctx, 0) == WEFT_OK);
        poll(NULL, 0, 1);
    }
}

static int sc_killed_peer(struct rank_env *e)
{
    barrier_ready(e);
    warm_up(e, 1 - e->rank);
    CHECK(count_segments(NULL, e->w->job) == 0);
    size_t n = 64 * MIB;
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    fill(buf, n, 3);
    void *r = NULL;
    if (e->rank == 1) {
        if (g_victim_sends)
            CHECK(T->isend(e->conn[0], buf, n, &r) == WEFT_OK);
        tell_parent(e);
        for (;;)
            pause();
    }
    /* Rank 1 is out of its isend before we take anything: a receive that
     * drains the ring while the isend still fills it takes all 64 MiB. */
    progress_until_go(e, 20000);
    if (g_victim_sends)
        CHECK(T->irecv(e->conn[1], buf, n, &r) == WEFT_OK);
    else
        CHECK(T->isend(e->conn[1], buf, n, &r) == WEFT_OK);
    tell_parent(e);
    weft_status_t st = g_never_wait ? wait_no_sleep(e, r, 10000) : wait_req(e, r, NULL, 10000);
    uint64_t now = weft_now_ns();
    CHECKF(st == WEFT_ERR_REMOTE, "got %s", weft_status_string(st));
    CHECK(*e->w->kill_ns != 0);
    CHECKF(now - *e->w->kill_ns < 2000000000ull, "noticed after %llu ms",
           (unsigned long long)((now - *e->w->kill_ns) / 1000000));
    const char *msg = weft_thread_last_error();
    CHECKF(strstr(msg, "rank 1 (pid ") && strstr(msg, ") exited"), "%s", msg);
    /* Sticky. */
    CHECK(T->irecv(e->conn[1], buf, 8, &r) == WEFT_OK);
    CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_REMOTE);
    free(buf);
    return 0;
}

static void run_killed(bool victim_sends, bool never_wait)
{
    g_victim_sends = victim_sends;
    g_never_wait = never_wait;
    struct world w;
    world_init(&w, 2, 2, 1, 20000);
    world_start(&w, sc_killed_peer);
    barrier(&w);
    char c;
    cr_assert(read_full(w.up[1], &c, 1, 20000));
    cr_assert(write_full(w.down[0], "g", 1));
    cr_assert(read_full(w.up[0], &c, 1, 20000));
    usleep(100000); /* let rank 0 settle into its wait */
    *w.kill_ns = weft_now_ns();
    kill(w.pid[1], SIGKILL);
    /* Rank 1 stays a zombie until world_finish reaps it, after rank 0:
     * rank 0 must see it dead all the same. */
    world_finish(&w, 1u << 1);
    cr_expect_eq(count_segments(NULL, w.job), 0, "the killed rank left its segment behind");
}

Test(shm, killed_peer_fails_receive_mid_message, .timeout = 30)
{
    run_killed(true, false);
}

Test(shm, killed_peer_fails_blocked_send, .timeout = 30)
{
    run_killed(false, false);
}

Test(shm, killed_peer_seen_without_waiting_in_shm, .timeout = 30)
{
    run_killed(true, true);
}

/* Rank 1 finalizes while rank 0 still waits for a message from it. */
static int sc_peer_finalized(struct rank_env *e)
{
    barrier_ready(e);
    warm_up(e, 1 - e->rank);
    if (e->rank == 1) {
        uint8_t m[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        send_ok(e, 0, m, sizeof(m)); /* still delivered after we are gone */
        return 0;
    }
    uint8_t buf[64];
    usleep(200000);
    CHECK(recv_ok(e, 1, buf, sizeof(buf)) == 8 && buf[7] == 8);
    void *r = NULL;
    CHECK(T->irecv(e->conn[1], buf, sizeof(buf), &r) == WEFT_OK);
    weft_status_t st = wait_req(e, r, NULL, 5000);
    CHECKF(st == WEFT_ERR_REMOTE, "got %s", weft_status_string(st));
    const char *msg = weft_thread_last_error();
    CHECKF(strstr(msg, "rank 1"), "%s", msg);
    return 0;
}

Test(shm, finalized_peer_fails_receive, .timeout = 30)
{
    run_shm(2, sc_peer_finalized);
}

/* ---- sleeping ----------------------------------------------------------------------------- */

/* Rank 0 sleeps in progress(5 s) on a receive; rank 1 sends 200 ms later:
 * the futex hand-off must end the sleep at once. */
static int sc_sleep_wake(struct rank_env *e)
{
    barrier_ready(e);
    warm_up(e, 1 - e->rank);
    uint8_t buf[64];
    if (e->rank == 1) {
        usleep(200000);
        fill(buf, sizeof(buf), 9);
        send_ok(e, 0, buf, sizeof(buf));
        return 0;
    }
    void *r = NULL;
    CHECK(T->irecv(e->conn[1], buf, sizeof(buf), &r) == WEFT_OK);
    uint64_t t0 = weft_now_ns();
    int done = 0, sleeps = 0;
    while (!done) {
        uint64_t s0 = weft_now_ns();
        CHECK(T->progress(e->ctx, 5000) == WEFT_OK);
        /* Waits are cut at 100 ms to check on the peer's process (1 s:
         * far below the 5 s asked for, with room for a loaded machine). */
        CHECKF(weft_now_ns() - s0 < 1000000000ull, "progress slept %llu ms",
               (unsigned long long)((weft_now_ns() - s0) / 1000000));
        sleeps++;
        size_t got = 0;
        CHECK(T->test(r, &done, &got) == WEFT_OK);
    }
    uint64_t ms = (weft_now_ns() - t0) / 1000000;
    CHECKF(ms >= 150 && ms < 1000, "received after %llu ms", (unsigned long long)ms);
    CHECK(verify(buf, sizeof(buf), 9) == sizeof(buf));
    CHECK(stats(e).sleeps >= 1);
    return 0;
}

Test(shm, sleeping_receiver_is_woken, .timeout = 30)
{
    run_shm(2, sc_sleep_wake);
}

/* ---- in-process checks ------------------------------------------------------------------ */

static struct weft_transport_init solo_args(uint8_t *secret, int rank, int nranks, uint64_t job)
{
    memset(secret, 7, WEFT_SECRET_BYTES);
    return (struct weft_transport_init){.err = NULL,
                                        .rank = rank,
                                        .nranks = nranks,
                                        .job = job,
                                        .secret = secret,
                                        .local = loopback(0),
                                        .timeout_ns = 1000000000ull};
}

static uint64_t fresh_job(void)
{
    uint64_t job;
    cr_assert_eq(weft_random_bytes(&job, sizeof(job)), WEFT_OK);
    return job;
}

struct waker {
    void *ctx;
    int delay_ms;
};

static void *waker_main(void *arg)
{
    struct waker *wk = arg;
    usleep((useconds_t)wk->delay_ms * 1000);
    T->wakeup(wk->ctx);
    return NULL;
}

Test(shm, wakeup_ends_a_wait, .timeout = 30)
{
    uint8_t secret[WEFT_SECRET_BYTES];
    struct weft_transport_init a = solo_args(secret, 0, 1, fresh_job());
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL;
    cr_assert_eq(T->init(&a, &ctx, addr, &len), WEFT_OK);
    struct waker wk = {ctx, 100};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, waker_main, &wk), 0);
    uint64_t t0 = weft_now_ns();
    cr_assert_eq(T->progress(ctx, 5000), WEFT_OK);
    uint64_t ms = (weft_now_ns() - t0) / 1000000;
    cr_expect(ms >= 50 && ms < 2000, "progress returned after %llu ms, the wakeup came at 100",
              (unsigned long long)ms);
    pthread_join(th, NULL);
    t0 = weft_now_ns();
    cr_assert_eq(T->progress(ctx, 200), WEFT_OK);
    cr_expect(weft_now_ns() - t0 >= 150000000ull, "a consumed wakeup cut a later wait short");
    /* A wakeup before the wait is not lost. */
    T->wakeup(ctx);
    t0 = weft_now_ns();
    cr_assert_eq(T->progress(ctx, 2000), WEFT_OK);
    cr_expect(weft_now_ns() - t0 < 100000000ull, "a wakeup before the wait was lost");
    T->finalize(ctx);
    T->finalize(NULL);
}

Test(shm, bad_arguments, .timeout = 30)
{
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL, *conn = NULL;
    uint64_t job = fresh_job();

    struct weft_transport_init a = solo_args(secret, 2, 2, job);
    cr_expect_eq(T->init(&a, &ctx, addr, &len), WEFT_ERR_INVALID_ARG);
    cr_expect_null(ctx);
    a = solo_args(secret, 0, 2, job);
    len = 16;
    cr_expect_eq(T->init(&a, &ctx, addr, &len), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), "address buffer") != NULL);

    len = sizeof(addr);
    cr_assert_eq(T->init(&a, &ctx, addr, &len), WEFT_OK);
    cr_expect_eq(count_segments(NULL, job), 1);
    cr_expect_eq(T->connect(ctx, 0, addr, len, &conn), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(T->connect(ctx, 2, addr, len, &conn), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(T->connect(ctx, 1, addr, 16, &conn), WEFT_ERR_INVALID_ARG);
    uint8_t junk[WEFT_TRANSPORT_ADDR_MAX];
    memset(junk, 0, sizeof(junk));
    cr_expect_eq(T->connect(ctx, 1, junk, len, &conn), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), "is not one") != NULL, "%s",
              weft_thread_last_error());
    /* Our own address posing as rank 1's. */
    cr_expect_eq(T->connect(ctx, 1, addr, len, &conn), WEFT_ERR_INVALID_ARG);
    T->finalize(ctx);
    /* finalize without ready() removes the name too. */
    cr_expect_eq(count_segments(NULL, job), 0);
}

/* One value per test: parameters may be read once per process. */
static void expect_bad_param(const char *name, const char *value)
{
    setenv(name, value, 1);
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL;
    struct weft_transport_init a = solo_args(secret, 0, 2, fresh_job());
    cr_expect_eq(T->init(&a, &ctx, addr, &len), WEFT_ERR_INVALID_ARG, "%s=%s", name, value);
    cr_expect_null(ctx);
    char want[64];
    snprintf(want, sizeof(want), "%s=%s", name, value);
    cr_expect(strstr(weft_thread_last_error(), want) != NULL, "%s", weft_thread_last_error());
}

Test(shm, param_slots_zero, .timeout = 30)
{
    expect_bad_param("WEFT_SHM_SLOTS", "0");
}

Test(shm, param_slots_junk, .timeout = 30)
{
    expect_bad_param("WEFT_SHM_SLOTS", "many");
}

Test(shm, param_slot_bytes_below_a_page, .timeout = 30)
{
    expect_bad_param("WEFT_SHM_SLOT_BYTES", "1K");
}

Test(shm, param_cma_min_negative, .timeout = 30)
{
    expect_bad_param("WEFT_SHM_CMA_MIN", "-1");
}

/* A segment of our name left by a crashed run of the same job is replaced;
 * one of a live process is an error. */
Test(shm, stale_segment_of_the_same_job, .timeout = 30)
{
    uint64_t job = fresh_job();
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/weft-%016" PRIx64 "-0", shm_dir(), job);
    for (int live = 0; live < 2; live++) {
        int fd = open(path, O_RDWR | O_CREAT | O_EXCL, 0600);
        cr_assert_geq(fd, 0);
        struct shm_seg h;
        memset(&h, 0, sizeof(h));
        h.magic = SHM_SEG_MAGIC;
        /* Dead: a pid that exited; live: our parent. */
        pid_t dead = fork();
        if (dead == 0)
            _exit(0);
        waitpid(dead, NULL, 0);
        h.pid = live ? (int32_t)getppid() : (int32_t)dead;
        cr_assert_eq(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
        close(fd);
        uint8_t secret[WEFT_SECRET_BYTES];
        uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
        size_t len = sizeof(addr);
        void *ctx = NULL;
        struct weft_transport_init a = solo_args(secret, 0, 2, job);
        weft_status_t st = T->init(&a, &ctx, addr, &len);
        if (live) {
            cr_expect_eq(st, WEFT_ERR_SYSTEM);
            cr_expect(strstr(weft_thread_last_error(), "running twice") != NULL, "%s",
                      weft_thread_last_error());
            cr_expect_eq(count_segments(NULL, job), 1, "the live owner's segment was removed");
            unlink(path);
        } else {
            cr_expect_eq(st, WEFT_OK, "%s", weft_thread_last_error());
            T->finalize(ctx);
        }
        cr_expect_eq(count_segments(NULL, job), 0);
    }
}

/* /dev/shm full: a 1 MiB tmpfs stands in for it (WEFT_SHM_DIR). */
Test(shm, full_dev_shm_is_a_clear_error, .timeout = 30)
{
    char dir[] = "/tmp/weft-shm-full-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    if (mount("tmpfs", dir, "tmpfs", 0, "size=1M") != 0) {
        int err = errno;
        rmdir(dir);
        cr_skip_test("cannot mount a small tmpfs to fill (%s): needs root", strerror(err));
    }
    setenv("WEFT_SHM_DIR", dir, 1);
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL;
    uint64_t job = fresh_job();
    struct weft_transport_init a = solo_args(secret, 0, 2, job);
    weft_status_t st = T->init(&a, &ctx, addr, &len);
    const char *msg = weft_thread_last_error();
    cr_expect_eq(st, WEFT_ERR_SYSTEM, "%s", msg);
    cr_expect_null(ctx);
    char want[160];
    snprintf(want, sizeof(want), "segment %s/weft-%016" PRIx64 "-0: ", dir, job);
    cr_expect(strstr(msg, want) != NULL, "no segment name in: %s", msg);
    snprintf(want, sizeof(want), "%s is full", dir);
    cr_expect(strstr(msg, want) != NULL, "no '%s' in: %s", want, msg);
    snprintf(want, sizeof(want), "%zu needed", (size_t)4096 + 4096 + 8 * (size_t)SLOT);
    cr_expect(strstr(msg, want) != NULL, "no '%s' in: %s", want, msg);
    cr_expect_eq(count_segments(dir, job), 0, "a partial segment was left behind");
    umount(dir);
    rmdir(dir);
}

/* The same small folder holds smaller rings. */
Test(shm, small_rings_fit_a_small_dev_shm, .timeout = 30)
{
    char dir[] = "/tmp/weft-shm-full-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    if (mount("tmpfs", dir, "tmpfs", 0, "size=1M") != 0) {
        int err = errno;
        rmdir(dir);
        cr_skip_test("cannot mount a small tmpfs (%s): needs root", strerror(err));
    }
    setenv("WEFT_SHM_DIR", dir, 1);
    setenv("WEFT_SHM_SLOTS", "2", 1);
    setenv("WEFT_SHM_SLOT_BYTES", "64K", 1);
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL;
    uint64_t job = fresh_job();
    struct weft_transport_init a = solo_args(secret, 0, 4, job);
    cr_expect_eq(T->init(&a, &ctx, addr, &len), WEFT_OK, "%s", weft_thread_last_error());
    cr_expect_eq(count_segments(dir, job), 1);
    T->finalize(ctx);
    cr_expect_eq(count_segments(dir, job), 0);
    umount(dir);
    rmdir(dir);
}

/* WEFT_SHM_DIR moves the segments to a folder (open() instead of
 * shm_open); the data path is the same. */
Test(shm, segments_in_another_folder, .timeout = 120)
{
    char dir[] = "/dev/shm/weft-test-dir-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    setenv("WEFT_SHM_DIR", dir, 1);
    struct world w;
    world_init(&w, 2, 2, 1, 20000);
    world_start(&w, sc_many_small);
    cr_expect_eq(count_segments(dir, w.job), 2);
    barrier(&w);
    world_finish(&w, 0);
    cr_expect_eq(count_segments(dir, w.job), 0);
    rmdir(dir);
}

/* ---- CMA refused ---------------------------------------------------------------------- */

/* process_vm_readv refused from the start (ptrace policy, old kernel): the
 * probe at connect sees it and large messages take the ring. */
Test(shm, cma_refused_at_connect_eperm, .timeout = 120)
{
    setenv("WEFT_SHM_CMA_MIN", "1M", 1);
    forbid_cma(EPERM);
    run_shm(2, sc_pingpong_ring);
}

Test(shm, cma_refused_at_connect_enosys, .timeout = 120)
{
    setenv("WEFT_SHM_CMA_MIN", "1M", 1);
    forbid_cma(ENOSYS);
    run_shm(2, sc_pingpong_ring);
}

/* Refused later, on a message already published for pulling: the receiver
 * refuses it, the sender resends it through the ring, and from then on
 * that receiver gets everything through the ring.  The other direction
 * still pulls. */
static int sc_cma_refused_later(struct rank_env *e)
{
    enum { N = 3 };
    size_t n = 2 * MIB + 5;
    barrier_ready(e);
    warm_up(e, 1 - e->rank);
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    if (e->rank == 0) {
        for (int i = 0; i < N; i++) {
            fill(buf, n, (uint32_t)i);
            send_ok(e, 1, buf, n);
        }
        CHECK(recv_ok(e, 1, buf, n) == n && verify(buf, n, 77) == n);
        struct weft_shm_stats s = stats(e);
        CHECKF(s.cma_nacks == 1 && s.cma_sends == 0 && s.cma_pulls == 1,
               "nacks %llu, cma sends %llu, pulls %llu", (unsigned long long)s.cma_nacks,
               (unsigned long long)s.cma_sends, (unsigned long long)s.cma_pulls);
    } else {
        forbid_cma(EPERM);
        for (int i = 0; i < N; i++) {
            memset(buf, 0, n);
            CHECK(recv_ok(e, 0, buf, n) == n);
            CHECKF(verify(buf, n, (uint32_t)i) == n, "message %d", i);
        }
        fill(buf, n, 77);
        send_ok(e, 0, buf, n);
        struct weft_shm_stats s = stats(e);
        CHECKF(s.cma_pulls == 0 && s.cma_sends == 1, "pulls %llu, cma sends %llu",
               (unsigned long long)s.cma_pulls, (unsigned long long)s.cma_sends);
    }
    free(buf);
    return 0;
}

Test(shm, cma_refused_later_falls_back_to_the_ring, .timeout = 60)
{
    setenv("WEFT_SHM_CMA_MIN", "1M", 1);
    run_shm(2, sc_cma_refused_later);
}

/* Pending requests, queued both ways, are freed by finalize (the leak
 * check at the end of every child catches one that is not). */
static int sc_finalize_pending(struct rank_env *e)
{
    static uint8_t out[8 * MIB], in[2][8 * MIB];
    barrier_ready(e);
    int peer = 1 - e->rank;
    void *r[5];
    warm_up(e, peer);
    CHECK(T->irecv(e->conn[peer], in[0], sizeof(in[0]), &r[0]) == WEFT_OK);
    CHECK(T->irecv(e->conn[peer], in[1], sizeof(in[1]), &r[1]) == WEFT_OK);
    CHECK(T->irecv(e->conn[peer], in[1], sizeof(in[1]), &r[2]) == WEFT_OK);
    CHECK(T->isend(e->conn[peer], out, sizeof(out), &r[3]) == WEFT_OK);
    CHECK(T->isend(e->conn[peer], out, sizeof(out), &r[4]) == WEFT_OK);
    CHECK(T->progress(e->ctx, 0) == WEFT_OK);
    return 0;
}

Test(shm, finalize_with_pending_requests, .timeout = 30)
{
    run_shm(2, sc_finalize_pending);
}
