/*
 * test_shm.c - what only the shared-memory transport has, between real
 * processes through the harness of test_tcp: the ring and CMA under the
 * generic scenarios (transport_suite.c, run as such by test_transport),
 * receives consumed in place, peers dying mid-message, sleeping, its
 * parameters and its segments.  Each rank is a forked child that maps its
 * peers' segments; the test process hands out the addresses, holds the
 * barrier before ready(), kills ranks and looks at what is left in the
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

static void use_shm(void)
{
    tp_use("shm");
}
TestSuite(shm, .init = use_shm);

#define MIB (1u << 20)
#define SLOT (256u << 10) /* WEFT_SHM_SLOT_BYTES's default */

/* ---- helpers -------------------------------------------------------------------- */

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

/* A job of nranks running fn; messages of cma_min bytes and more are
 * pulled with process_vm_readv ("0": none). */
static void run_cma(int nranks, const char *cma_min, int (*fn)(struct rank_env *))
{
    setenv("WEFT_SHM_CMA_MIN", cma_min, 1);
    run(nranks, 1, fn);
}

/* ---- ping-pong ---------------------------------------------------------------------- */

/* CMA on: the messages of 1 MiB and more must have gone that way. */
static int sc_pingpong_cma(struct rank_env *e)
{
    sc_pingpong(e);
    struct weft_shm_stats s = stats(e);
    CHECKF(s.cma_sends == PINGPONG_MIB_MESSAGES && s.cma_pulls == PINGPONG_MIB_MESSAGES &&
               s.cma_nacks == 0,
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

Test(shm, pingpong_sizes_ring, .timeout = 120) { run_cma(2, "0", sc_pingpong_ring); }
Test(shm, pingpong_sizes_cma, .timeout = 120) { run_cma(2, "1M", sc_pingpong_cma); }

/* Two slots of one page: every message wraps the ring many times. */
Test(shm, pingpong_sizes_2_small_slots, .timeout = 120)
{
    setenv("WEFT_SHM_SLOTS", "2", 1);
    setenv("WEFT_SHM_SLOT_BYTES", "4K", 1);
    run_cma(2, "0", sc_pingpong_ring);
}

/* ---- many in flight ----------------------------------------------------------------- */

/* Messages far larger than the ring, or pulled. */
Test(shm, both_directions_large_ring, .timeout = 120) { run_cma(2, "0", sc_both_ways); }
Test(shm, both_directions_large_cma, .timeout = 120) { run_cma(2, "64K", sc_both_ways); }
Test(shm, four_ranks_all_to_all_cma, .timeout = 90) { run_cma(4, "1M", sc_all_to_all); }

/* ---- length mismatches ---------------------------------------------------------------- */

/* Longer than the ring: the sender is stuck until the failure frees it. */
Test(shm, long_message_into_short_receive_larger_than_ring, .timeout = 30)
{
    setenv("WEFT_SHM_CMA_MIN", "0", 1);
    run_long_into_short(16 * MIB + 3);
}

Test(shm, long_message_into_short_receive_cma, .timeout = 30)
{
    setenv("WEFT_SHM_CMA_MIN", "64K", 1);
    run_long_into_short(4 * MIB);
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
    g_take_len = 5 * SLOT + 24;
    run_cma(2, "0", sc_take);
}

Test(shm, irecv_take_offers_cma_pulls_from_the_buffer, .timeout = 60)
{
    g_take_len = 1 * MIB + 8;
    g_take_cma = true;
    run_cma(2, "64K", sc_take);
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
    const char *msg = expect_killed(e, st, 1);
    CHECKF(strstr(msg, "rank 1 (pid ") && strstr(msg, ") exited"), "%s", msg);
    expect_failed(e, 1);
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

/* ---- sleeping ----------------------------------------------------------------------------- */

/* Rank 0 sleeps in progress(5 s) on a receive; rank 1 sends 200 ms later:
 * the futex hand-off must end the sleep at once. */
static int sc_sleep_wake(struct rank_env *e)
{
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
    run(2, 1, sc_sleep_wake);
}

/* ---- in-process checks ------------------------------------------------------------------ */

/* The segment is there from init on and our own address posing as rank
 * 1's is refused; finalize without ready() removes the name too. */
Test(shm, own_address_refused_segment_removed, .timeout = 30)
{
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL, *conn = NULL;
    uint64_t job = fresh_job();
    struct weft_transport_init a = solo_args(secret, 0, 2, job);
    cr_assert_eq(T->init(&a, &ctx, addr, &len), WEFT_OK);
    cr_expect_eq(count_segments(NULL, job), 1);
    cr_expect_eq(T->connect(ctx, 1, addr, len, &conn), WEFT_ERR_INVALID_ARG);
    T->finalize(ctx);
    cr_expect_eq(count_segments(NULL, job), 0);
}

/* One value per test: parameters may be read once per process. */
static void expect_bad_param(const char *name, const char *value)
{
    setenv(name, value, 1);
    void *ctx = NULL;
    cr_expect_eq(solo_init(2, fresh_job(), &ctx), WEFT_ERR_INVALID_ARG, "%s=%s", name, value);
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

Test(shm, param_max_bytes_negative, .timeout = 30)
{
    expect_bad_param("WEFT_SHM_MAX_BYTES", "-1");
}

/* ---- the segment's bound (WEFT_SHM_MAX_BYTES) ------------------------------------------- */

/* Rank 0's rings in a job of nranks on this host, by the context's
 * geometry and by the segment's size in the folder. */
static void solo_geometry(int nranks, uint32_t *nslots, size_t *slot_bytes, size_t *seg_bytes)
{
    void *vctx = NULL;
    cr_assert_eq(solo_init(nranks, fresh_job(), &vctx), WEFT_OK, "%s", weft_thread_last_error());
    struct shm_ctx *ctx = vctx;
    *nslots = ctx->nslots;
    *slot_bytes = ctx->slot_bytes;
    *seg_bytes = ctx->seg_bytes;
    cr_expect_eq(ctx->seg->seg_bytes, ctx->seg_bytes);
    cr_expect_eq(ctx->seg->nslots, ctx->nslots, "the header tells peers another geometry");
    cr_expect_eq(ctx->seg->slot_bytes, ctx->slot_bytes);
    T->finalize(vctx);
}

/* A ring's header (descriptors, short-message slots) for the default
 * WEFT_SHM_LL_BYTES, as the transport rounds it. */
static size_t ring_hdr(uint32_t nslots)
{
    size_t b = shm_ll_off(nslots) + 2 * shm_ll_slot(SHM_DEFAULT_LL_BYTES);
    return (b + 4095) / 4096 * 4096;
}

/* 16 ranks keep the full rings; 65 get slots as large as fit 32 MiB. */
Test(shm, rings_shrink_to_the_default_bound, .timeout = 60)
{
    uint32_t n;
    size_t slot, seg;
    solo_geometry(16, &n, &slot, &seg);
    cr_expect(n == 8 && slot == SLOT, "16 ranks: %u x %zu", n, slot);
    cr_expect_eq(seg, 4096 + 15 * (ring_hdr(8) + 8 * (size_t)SLOT));
    solo_geometry(65, &n, &slot, &seg);
    size_t per_ring = (SHM_DEFAULT_MAX_BYTES - 4096) / 64;
    cr_expect_eq(n, 8u);
    cr_expect(slot % 4096 == 0 && slot >= SHM_MIN_SLOT_BYTES && slot < SLOT, "slot %zu", slot);
    cr_expect_leq(ring_hdr(8) + 8 * slot, per_ring, "8 x %zu bytes pass the bound", slot);
    cr_expect_gt(ring_hdr(8) + 8 * (slot + 4096), per_ring, "slots of %zu bytes: too small", slot);
    cr_expect_leq(seg, (size_t)SHM_DEFAULT_MAX_BYTES);
    cr_expect_eq(seg, 4096 + 64 * (ring_hdr(8) + 8 * slot));
}

/* Below the least slot size, fewer slots; the least ring (2 slots of 16
 * KiB) even when it passes the bound; 0: no bound. */
Test(shm, rings_shrink_to_a_small_bound, .timeout = 60)
{
    uint32_t n;
    size_t slot, seg;
    setenv("WEFT_SHM_MAX_BYTES", "256K", 1);
    solo_geometry(4, &n, &slot, &seg); /* 3 rings of 84 KiB: 36 KiB of header, 3 slots */
    cr_expect(n == 3 && slot == SHM_MIN_SLOT_BYTES, "%u x %zu", n, slot);
    cr_expect_leq(seg, (size_t)256 << 10);
    setenv("WEFT_SHM_MAX_BYTES", "1", 1);
    solo_geometry(4, &n, &slot, &seg);
    cr_expect(n == 2 && slot == SHM_MIN_SLOT_BYTES, "%u x %zu", n, slot);
    setenv("WEFT_SHM_MAX_BYTES", "0", 1);
    solo_geometry(65, &n, &slot, &seg);
    cr_expect(n == 8 && slot == SLOT, "no bound: %u x %zu", n, slot);
}

/* Rings shrunk by the bound carry everything, between real processes. */
Test(shm, all_to_all_through_shrunk_rings, .timeout = 120)
{
    setenv("WEFT_SHM_MAX_BYTES", "256K", 1);
    run_cma(4, "0", sc_all_to_all);
}

Test(shm, pingpong_sizes_through_a_shrunk_ring, .timeout = 120)
{
    setenv("WEFT_SHM_MAX_BYTES", "64K", 1); /* 1 ring: 2 slots of 16 KiB */
    run_cma(2, "0", sc_pingpong_ring);
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
        void *ctx = NULL;
        weft_status_t st = solo_init(2, job, &ctx);
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

/* A 1 MiB tmpfs mounted on dir, made from its template, becomes
 * WEFT_SHM_DIR: a /dev/shm that fills up.  Skips without root. */
static void small_shm_dir(char *dir)
{
    cr_assert_not_null(mkdtemp(dir));
    if (mount("tmpfs", dir, "tmpfs", 0, "size=1M") != 0) {
        int err = errno;
        rmdir(dir);
        cr_skip_test("cannot mount a small tmpfs (%s): needs root", strerror(err));
    }
    setenv("WEFT_SHM_DIR", dir, 1);
}

/* /dev/shm full: a 1 MiB tmpfs stands in for it. */
Test(shm, full_dev_shm_is_a_clear_error, .timeout = 30)
{
    char dir[] = "/tmp/weft-shm-full-XXXXXX";
    small_shm_dir(dir);
    void *ctx = NULL;
    uint64_t job = fresh_job();
    weft_status_t st = solo_init(2, job, &ctx);
    const char *msg = weft_thread_last_error();
    cr_expect_eq(st, WEFT_ERR_SYSTEM, "%s", msg);
    cr_expect_null(ctx);
    char want[160];
    snprintf(want, sizeof(want), "segment %s/weft-%016" PRIx64 "-0: ", dir, job);
    cr_expect(strstr(msg, want) != NULL, "no segment name in: %s", msg);
    snprintf(want, sizeof(want), "%s is full", dir);
    cr_expect(strstr(msg, want) != NULL, "no '%s' in: %s", want, msg);
    /* The header page, then one ring: its header (slot descriptors and the
     * short-message slots), rounded to a page, and its slots. */
    size_t ring_hdr = shm_ll_off(8) + 2 * shm_ll_slot(SHM_DEFAULT_LL_BYTES);
    ring_hdr = (ring_hdr + 4095) / 4096 * 4096;
    snprintf(want, sizeof(want), "%zu needed", (size_t)4096 + ring_hdr + 8 * (size_t)SLOT);
    cr_expect(strstr(msg, want) != NULL, "no '%s' in: %s", want, msg);
    cr_expect_eq(count_segments(dir, job), 0, "a partial segment was left behind");
    umount(dir);
    rmdir(dir);
}

/* The same small folder holds smaller rings. */
Test(shm, small_rings_fit_a_small_dev_shm, .timeout = 30)
{
    char dir[] = "/tmp/weft-shm-full-XXXXXX";
    small_shm_dir(dir);
    setenv("WEFT_SHM_SLOTS", "2", 1);
    setenv("WEFT_SHM_SLOT_BYTES", "64K", 1);
    void *ctx = NULL;
    uint64_t job = fresh_job();
    cr_expect_eq(solo_init(4, job, &ctx), WEFT_OK, "%s", weft_thread_last_error());
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
    world_spawn(&w, sc_many_small);
    cr_expect_eq(count_segments(dir, w.job), 2);
    world_barrier(&w);
    world_finish(&w, 0);
    cr_expect_eq(count_segments(dir, w.job), 0);
    rmdir(dir);
}

/* ---- CMA refused ---------------------------------------------------------------------- */

/* process_vm_readv refused from the start (ptrace policy, old kernel): the
 * probe at connect sees it and large messages take the ring. */
static void run_cma_refused(int err)
{
    forbid_cma(err);
    run_cma(2, "1M", sc_pingpong_ring);
}

Test(shm, cma_refused_at_connect_eperm, .timeout = 120) { run_cma_refused(EPERM); }
Test(shm, cma_refused_at_connect_enosys, .timeout = 120) { run_cma_refused(ENOSYS); }

/* Refused later, on a message already published for pulling: the receiver
 * refuses it, the sender resends it through the ring, and from then on
 * that receiver gets everything through the ring.  The other direction
 * still pulls. */
static int sc_cma_refused_later(struct rank_env *e)
{
    enum { N = 3 };
    size_t n = 2 * MIB + 5;
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
    run_cma(2, "1M", sc_cma_refused_later);
}
