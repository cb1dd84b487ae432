/*
 * test_tcp.c - the tcp transport between real processes: each rank is a
 * forked child with its own transport context on 127.0.0.1; the test
 * process hands out the addresses and plays strangers and forgers.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/auth.h"
#include "src/comm.h"
#include "base/sock.h"
#include "tests/tcp_harness.h"

#define MIB (1u << 20)

/* ---- scenarios ----------------------------------------------------------------- */

static int sc_pingpong(struct rank_env *e)
{
    static const size_t sizes[] = {0, 1, 4096, MIB, 64 * MIB + 1};
    int peer = 1 - e->rank;
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(sizes); k++) {
        size_t n = sizes[k];
        uint8_t *buf = malloc(n + 1);
        CHECK(buf != NULL);
        int iters = n <= 4096 ? 20 : 2;
        for (int it = 0; it < iters; it++) {
            uint32_t seed = (uint32_t)(k * 1000 + (size_t)it * 2);
            if (e->rank == 0) {
                fill(buf, n, seed);
                send_ok(e, peer, buf, n);
                memset(buf, 0, n + 1);
                CHECKF(recv_ok(e, peer, buf, n) == n, "echo of %zu bytes", n);
                CHECKF(verify(buf, n, seed + 1) == n, "echo of %zu bytes differs", n);
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

Test(tcp, pingpong_sizes, .timeout = 120)
{
    run(2, 1, sc_pingpong);
}

/* Kernel-sized buffers, and with them other partial-write patterns. */
Test(tcp, pingpong_sizes_2_streams_kernel_buffers, .timeout = 120)
{
    run_buf(2, 2, "0", sc_pingpong);
}

/* Both ranks send large messages at once: no deadlock, both arrive. */
static int sc_both_ways(struct rank_env *e)
{
    static const size_t sizes[] = {64 * MIB, 3 * MIB + 7, 8 * MIB};
    enum { N = WEFT_ARRAY_SIZE(sizes) };
    int peer = 1 - e->rank;
    uint8_t *out[N], *in[N];
    void *reqs[2 * N];
    size_t got[2 * N];
    for (int i = 0; i < N; i++) {
        out[i] = malloc(sizes[i]);
        in[i] = malloc(sizes[i]);
        CHECK(out[i] && in[i]);
        fill(out[i], sizes[i], (uint32_t)(e->rank * 10 + i));
    }
    /* Sends first: each side is writing while the other has not posted. */
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

Test(tcp, both_directions_large, .timeout = 120)
{
    run(2, 1, sc_both_ways);
}

/* Small socket buffers: every message is written in many pieces. */
Test(tcp, both_directions_large_4_streams_64k_buffers, .timeout = 120)
{
    run_buf(2, 4, "64K", sc_both_ways);
}

/* 1000 small messages each way, all in flight at once, sizes 0..250. */
#define NSMALL 1000
static size_t small_len(int i)
{
    return (size_t)(i * 37) % 251;
}

static int sc_many_small(struct rank_env *e)
{
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

/* Rank 0 sends small messages one at a time, each waited for, into 8 KiB
 * socket buffers that rank 1 drains in bursts: a send posted while the
 * stream is idle but its socket full finds no room at once and must still
 * go out once there is some (it was left unsent: a ring broadcast's root
 * stalled that way at 1 Gbit/s). */
static int sc_slow_reader(struct rank_env *e)
{
    enum { N = 20000, LEN = 100 };
    uint8_t buf[LEN];
    for (int i = 0; i < N; i++) {
        if (e->rank == 0) {
            fill(buf, LEN, (uint32_t)i);
            send_ok(e, 1, buf, LEN);
        } else {
            if (i % 256 == 0)
                usleep(1000);
            CHECKF(recv_ok(e, 0, buf, LEN) == LEN, "message %d", i);
            CHECKF(verify(buf, LEN, (uint32_t)i) == LEN, "message %d differs", i);
        }
    }
    return 0;
}

Test(tcp, sends_into_a_full_socket_with_a_slow_reader, .timeout = 60)
{
    run_buf(2, 1, "8K", sc_slow_reader);
}

Test(tcp, many_small_1_stream, .timeout = 60)
{
    run(2, 1, sc_many_small);
}

Test(tcp, many_small_2_streams_8k_buffers, .timeout = 60)
{
    run_buf(2, 2, "8K", sc_many_small);
}

Test(tcp, many_small_4_streams, .timeout = 60)
{
    run(2, 4, sc_many_small);
}

/* A shorter message into a longer receive reports its length and leaves
 * the rest of the buffer alone; the stream carries on. */
static int sc_short_into_long(struct rank_env *e)
{
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

Test(tcp, short_message_into_long_receive, .timeout = 30)
{
    run(2, 1, sc_short_into_long);
}

/* A longer message than the receive posted fails the receiver with
 * WEFT_ERR_REMOTE before a byte lands; the sender then sees the connection
 * fail too. */
static int sc_long_into_short(struct rank_env *e)
{
    warm_up(e, 1 - e->rank);
    if (e->rank == 0) {
        uint8_t big[4096], in[16];
        fill(big, sizeof(big), 1);
        void *r = NULL;
        CHECK(T->isend(e->conn[1], big, sizeof(big), &r) == WEFT_OK);
        weft_status_t st = wait_req(e, r, NULL, 10000);
        CHECK(st == WEFT_OK || st == WEFT_ERR_REMOTE);
        CHECK(T->irecv(e->conn[1], in, sizeof(in), &r) == WEFT_OK);
        st = wait_req(e, r, NULL, 5000);
        CHECKF(st == WEFT_ERR_REMOTE, "sender got %s", weft_status_string(st));
        CHECK(strstr(weft_thread_last_error(), "rank 1") != NULL);
        tell_parent(e);
    } else {
        uint8_t small[1024];
        memset(small, 0xEE, sizeof(small));
        void *r = NULL;
        CHECK(T->irecv(e->conn[0], small, sizeof(small), &r) == WEFT_OK);
        weft_status_t st = wait_req(e, r, NULL, 10000);
        CHECKF(st == WEFT_ERR_REMOTE, "receiver got %s", weft_status_string(st));
        const char *msg = weft_thread_last_error();
        CHECKF(strstr(msg, "rank 0 sent 4096 bytes but the receive posted holds 1024"), "%s",
               msg);
        CHECK(all_bytes(small, sizeof(small), 0xEE));
        /* Later requests on the failed connection fail the same way. */
        CHECK(T->irecv(e->conn[0], small, sizeof(small), &r) == WEFT_OK);
        CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_REMOTE);
        CHECK(T->isend(e->conn[0], small, 8, &r) == WEFT_OK);
        CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_REMOTE);
        /* Alive until rank 0 has seen the failure: the closed sockets must
         * tell it, not our exit. */
        progress_until_go(e, 20000);
    }
    return 0;
}

Test(tcp, long_message_into_short_receive, .timeout = 30)
{
    struct world w;
    world_init(&w, 2, 2, 1, 20000);
    world_start(&w, sc_long_into_short);
    char c;
    cr_assert(read_full(w.up[0], &c, 1, 20000), "rank 0 did not see the failure");
    cr_assert(write_full(w.down[1], &c, 1));
    world_finish(&w, 0);
}

/* Rank 1 is killed while rank 0 waits in a receive from it. */
static int sc_killed_peer(struct rank_env *e)
{
    warm_up(e, 1 - e->rank);
    if (e->rank == 1) {
        tell_parent(e);
        for (;;)
            pause();
    }
    uint8_t buf[64];
    void *r = NULL;
    CHECK(T->irecv(e->conn[1], buf, sizeof(buf), &r) == WEFT_OK);
    tell_parent(e);
    weft_status_t st = wait_req(e, r, NULL, 10000);
    uint64_t now = weft_now_ns();
    CHECKF(st == WEFT_ERR_REMOTE, "got %s", weft_status_string(st));
    CHECK(*e->w->kill_ns != 0);
    CHECKF(now - *e->w->kill_ns < 2000000000ull, "noticed after %llu ms",
           (unsigned long long)((now - *e->w->kill_ns) / 1000000));
    const char *msg = weft_thread_last_error();
    CHECKF(strstr(msg, "rank 1") && strstr(msg, "127.0.0.1:") && strstr(msg, "stream 0"), "%s",
           msg);
    return 0;
}

Test(tcp, killed_peer_fails_receive, .timeout = 30)
{
    struct world w;
    world_init(&w, 2, 2, 1, 20000);
    world_start(&w, sc_killed_peer);
    char c;
    cr_assert(read_full(w.up[1], &c, 1, 20000));
    cr_assert(read_full(w.up[0], &c, 1, 20000));
    usleep(100000); /* let rank 0 settle into its wait */
    *w.kill_ns = weft_now_ns();
    kill(w.pid[1], SIGKILL);
    world_finish(&w, 1u << 1);
}

/* ---- strangers and forgers (played by the test process) -------------------- */

static struct weft_auth_hello data_hello(const struct world *w, uint32_t rank, uint32_t nranks,
                                         uint32_t index)
{
    return (struct weft_auth_hello){
        .kind = WEFT_AUTH_DATA, .job = w->job, .rank = rank, .nranks = nranks, .index = index};
}

static int sc_exchange_after_go(struct rank_env *e)
{
    int peer = 1 - e->rank;
    tell_parent(e);
    progress_until_go(e, 30000);
    uint8_t buf[4096];
    for (int i = 0; i < 50; i++) {
        size_t n = (size_t)(i * 83) % sizeof(buf);
        if ((i % 2) == e->rank) {
            fill(buf, n, (uint32_t)i);
            send_ok(e, peer, buf, n);
        } else {
            CHECK(recv_ok(e, peer, buf, sizeof(buf)) == n);
            CHECKF(verify(buf, n, (uint32_t)i) == n, "message %d", i);
        }
    }
    return 0;
}

Test(tcp, strangers_are_dropped, .timeout = 60)
{
    struct world w;
    world_init(&w, 2, 2, 2, 1500); /* handshakes time out after 1.5 s */
    world_start(&w, sc_exchange_after_go);
    char c;
    cr_assert(read_full(w.up[0], &c, 1, 20000));
    cr_assert(read_full(w.up[1], &c, 1, 20000));

    /* Garbage instead of a hello. */
    int garbage = tcp_connect_to(&w.addr[0]);
    uint8_t junk[200];
    fill(junk, sizeof(junk), 77);
    cr_assert_eq(send(garbage, junk, sizeof(junk), MSG_NOSIGNAL), (ssize_t)sizeof(junk));
    /* Connects and says nothing. */
    int silent = tcp_connect_to(&w.addr[0]);
    uint64_t silent_t0 = weft_now_ns();
    /* The wrong secret. */
    uint8_t wrong[WEFT_SECRET_BYTES];
    memcpy(wrong, w.secret, sizeof(wrong));
    wrong[3] ^= 1;
    struct weft_auth_hello h = data_hello(&w, 1, 2, 0);
    const char *why = NULL;
    int fd = tcp_connect_to(&w.addr[0]);
    cr_expect_neq(weft_auth_connect(fd, wrong, &h, weft_now_ns() + 5000000000ull, &why), WEFT_OK);
    close(fd);
    /* The right secret but another job. */
    struct world other = w;
    other.job ^= 0x5a5a;
    h = data_hello(&other, 1, 2, 1);
    fd = tcp_connect_to(&w.addr[1]);
    cr_expect_neq(weft_auth_connect(fd, w.secret, &h, weft_now_ns() + 5000000000ull, &why),
                  WEFT_OK);
    close(fd);
    /* Authenticated but impossible hellos: wrong size of job, itself,
     * a stream beyond WEFT_SOCKET_NSTREAMS.  The handshake completes;
     * the rank must then drop the socket without reading from it. */
    const struct weft_auth_hello bad[] = {data_hello(&w, 1, 3, 0), data_hello(&w, 0, 2, 0),
                                          data_hello(&w, 1, 2, 2)};
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(bad); i++) {
        fd = tcp_connect_to(&w.addr[0]);
        cr_assert_eq(weft_auth_connect(fd, w.secret, &bad[i], weft_now_ns() + 5000000000ull,
                                       &why),
                     WEFT_OK, "hello %zu: %s", i, why);
        uint8_t frame[24] = {0};
        send(fd, frame, sizeof(frame), MSG_NOSIGNAL);
        cr_expect(closed_within(fd, 5000), "impossible hello %zu was not dropped", i);
        close(fd);
    }
    cr_expect(closed_within(garbage, 5000), "the garbage connection was not dropped");
    cr_expect(closed_within(silent, 6000), "the silent connection was not dropped");
    uint64_t silent_ms = (weft_now_ns() - silent_t0) / 1000000;
    cr_expect(silent_ms >= 1000 && silent_ms < 5000, "silent stranger dropped after %llu ms",
              (unsigned long long)silent_ms);
    close(garbage);
    close(silent);

    c = 'g';
    cr_assert(write_full(w.down[0], &c, 1));
    cr_assert(write_full(w.down[1], &c, 1));
    world_finish(&w, 0);
}

/* More silent strangers than the 64 handshakes a rank keeps: the oldest
 * are closed at once instead of at their deadline, and the job goes on. */
Test(tcp, handshake_flood_evicts_oldest, .timeout = 60)
{
    enum { FLOOD = 70 };
    struct world w;
    world_init(&w, 2, 2, 1, 20000); /* handshakes would wait 10 s */
    world_start(&w, sc_exchange_after_go);
    char c;
    cr_assert(read_full(w.up[0], &c, 1, 20000));
    cr_assert(read_full(w.up[1], &c, 1, 20000));
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        fds[i] = tcp_connect_to(&w.addr[0]);
    for (int i = 0; i < FLOOD - 64; i++)
        cr_expect(closed_within(fds[i], 3000), "stranger %d was not evicted", i);
    cr_expect(!closed_within(fds[FLOOD - 1], 300), "the newest stranger was evicted");
    for (int i = 0; i < FLOOD; i++)
        close(fds[i]);
    c = 'g';
    cr_assert(write_full(w.down[0], &c, 1));
    cr_assert(write_full(w.down[1], &c, 1));
    world_finish(&w, 0);
}

/* Rank 0 waits for 1 KiB from rank 1, which the test process plays with
 * the job secret, sending a forged frame. */
static uint8_t g_forged[24];
static size_t g_forged_len;

static int sc_forged_frame(struct rank_env *e)
{
    uint8_t buf[1024];
    memset(buf, 0xEE, sizeof(buf));
    void *r = NULL;
    CHECK(T->irecv(e->conn[1], buf, sizeof(buf), &r) == WEFT_OK);
    weft_status_t st = wait_req(e, r, NULL, 20000);
    CHECKF(st == WEFT_ERR_REMOTE, "got %s", weft_status_string(st));
    CHECK(all_bytes(buf, sizeof(buf), 0xEE));
    const char *msg = weft_thread_last_error();
    CHECKF(strstr(msg, "rank 1") != NULL, "%s", msg);
    const char *want =
        g_forged_len > 1024 ? "sent 4096 bytes" : "bad frame from rank 1 on stream 0";
    CHECKF(strstr(msg, want), "%s", msg);
    /* Keep serving the listener while the forger tries to come back. */
    tell_parent(e);
    progress_until_go(e, 20000);
    return 0;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void forge(uint32_t magic, uint32_t reserved, uint64_t seq, uint64_t len)
{
    put_le(g_forged, magic, 4);
    put_le(g_forged + 4, reserved, 4);
    put_le(g_forged + 8, seq, 8);
    put_le(g_forged + 16, len, 8);
    g_forged_len = (size_t)len;
}

static void run_forger(void)
{
    struct world w;
    world_init(&w, 2, 1, 1, 20000);
    w.addr[1] = loopback(9); /* never used: rank 0 only receives */
    world_start(&w, sc_forged_frame);
    int fd = tcp_connect_to(&w.addr[0]);
    struct weft_auth_hello h = data_hello(&w, 1, 2, 0);
    const char *why = NULL;
    cr_assert_eq(weft_auth_connect(fd, w.secret, &h, weft_now_ns() + 5000000000ull, &why),
                 WEFT_OK, "%s", why);
    cr_assert_eq(send(fd, g_forged, sizeof(g_forged), MSG_NOSIGNAL), (ssize_t)sizeof(g_forged));
    uint8_t payload[4096];
    memset(payload, 0x11, sizeof(payload));
    send(fd, payload, WEFT_MIN(g_forged_len, sizeof(payload)), MSG_NOSIGNAL);
    cr_expect(closed_within(fd, 5000), "rank 0 kept the forger's connection");
    close(fd);
    char c;
    cr_assert(read_full(w.up[0], &c, 1, 20000));
    /* Coming back on the failed connection is refused too. */
    fd = tcp_connect_to(&w.addr[0]);
    cr_assert_eq(weft_auth_connect(fd, w.secret, &h, weft_now_ns() + 5000000000ull, &why),
                 WEFT_OK, "%s", why);
    cr_expect(closed_within(fd, 5000), "rank 0 took a stream of a failed connection");
    close(fd);
    c = 'g';
    cr_assert(write_full(w.down[0], &c, 1));
    world_finish(&w, 0);
}

Test(tcp, forged_frame_bad_seq, .timeout = 30)
{
    forge(0x31444657u, 0, 7, 8);
    run_forger();
}

Test(tcp, forged_frame_bad_magic, .timeout = 30)
{
    forge(0xdeadbeefu, 0, 0, 8);
    run_forger();
}

Test(tcp, forged_frame_too_long, .timeout = 30)
{
    forge(0x31444657u, 0, 0, 4096);
    run_forger();
}

/* ---- three ranks, setup failures, odds and ends ---------------------------------- */

static int sc_all_to_all(struct rank_env *e)
{
    enum { MSGS = 40 };
    int n = e->w->nranks;
    size_t cap = MIB + 64;
    uint8_t *out[MAXR][MSGS], *in[MAXR][MSGS];
    void *reqs[2 * MAXR * MSGS];
    size_t got[2 * MAXR * MSGS], nreq = 0;
    for (int p = 0; p < n; p++) {
        if (p == e->rank)
            continue;
        for (int i = 0; i < MSGS; i++) {
            size_t len = i == 7 ? MIB + 3 : (size_t)(i * 997 + p * 13) % 5000;
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
            size_t len = i == 7 ? MIB + 3 : (size_t)(i * 997 + e->rank * 13) % 5000;
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

Test(tcp, three_ranks_all_to_all, .timeout = 90)
{
    run(3, 2, sc_all_to_all);
}

/* Rank 1's address leads to a listener that never answers (timeout);
 * rank 2's to a port where nobody listens (refused). */
static int sc_setup_failures(struct rank_env *e)
{
    uint8_t buf[64] = {0};
    char want[64];
    void *r = NULL;
    uint64_t t0 = weft_now_ns();
    CHECK(T->isend(e->conn[1], buf, sizeof(buf), &r) == WEFT_OK);
    weft_status_t st = wait_req(e, r, NULL, 10000);
    uint64_t ms = (weft_now_ns() - t0) / 1000000;
    CHECKF(st == WEFT_ERR_TIMEOUT, "silent listener: %s", weft_status_string(st));
    CHECKF(ms >= 400 && ms < 3000, "timed out after %llu ms", (unsigned long long)ms);
    const char *msg = weft_thread_last_error();
    weft_sock_str(&e->w->addr[1], want, sizeof(want));
    CHECKF(strstr(msg, "rank 1") && strstr(msg, want), "%s", msg);
    /* The failure is sticky for that peer. */
    CHECK(T->isend(e->conn[1], buf, sizeof(buf), &r) == WEFT_OK);
    CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_TIMEOUT);

    CHECK(T->isend(e->conn[2], buf, sizeof(buf), &r) == WEFT_OK);
    st = wait_req(e, r, NULL, 10000);
    CHECKF(st == WEFT_ERR_REMOTE, "refused: %s", weft_status_string(st));
    msg = weft_thread_last_error();
    weft_sock_str(&e->w->addr[2], want, sizeof(want));
    CHECKF(strstr(msg, "rank 2") && strstr(msg, want), "%s", msg);
    return 0;
}

Test(tcp, connection_setup_failures, .timeout = 30)
{
    struct world w;
    world_init(&w, 3, 1, 1, 500);
    /* A listener that never accepts: connect succeeds, the handshake
     * never gets its challenge. */
    w.addr[1] = loopback(0);
    int lfd = -1;
    cr_assert_eq(weft_sock_listen(&w.addr[1], &lfd), WEFT_OK);
    /* A port with no listener. */
    w.addr[2] = loopback(0);
    int tmp = -1;
    cr_assert_eq(weft_sock_listen(&w.addr[2], &tmp), WEFT_OK);
    close(tmp);
    world_start(&w, sc_setup_failures);
    world_finish(&w, 0);
    close(lfd);
}

/* ---- in-process checks -------------------------------------------------------- */

static struct weft_transport_init solo_args(uint8_t *secret, int rank, int nranks)
{
    memset(secret, 7, WEFT_SECRET_BYTES);
    return (struct weft_transport_init){.err = NULL,
                                        .rank = rank,
                                        .nranks = nranks,
                                        .job = 42,
                                        .secret = secret,
                                        .local = loopback(0),
                                        .timeout_ns = 1000000000ull};
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

Test(tcp, wakeup_ends_a_wait, .timeout = 30)
{
    uint8_t secret[WEFT_SECRET_BYTES];
    struct weft_transport_init a = solo_args(secret, 0, 1);
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
    T->finalize(ctx);
    T->finalize(NULL);
}

Test(tcp, bad_arguments, .timeout = 30)
{
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL, *conn = NULL;

    struct weft_transport_init a = solo_args(secret, 2, 2);
    cr_expect_eq(T->init(&a, &ctx, addr, &len), WEFT_ERR_INVALID_ARG);
    cr_expect_null(ctx);
    a = solo_args(secret, 0, 2);
    len = 16;
    cr_expect_eq(T->init(&a, &ctx, addr, &len), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), "address buffer") != NULL);

    len = sizeof(addr);
    cr_assert_eq(T->init(&a, &ctx, addr, &len), WEFT_OK);
    cr_expect_eq(T->connect(ctx, 0, addr, len, &conn), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(T->connect(ctx, 2, addr, len, &conn), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(T->connect(ctx, 1, addr, 16, &conn), WEFT_ERR_INVALID_ARG);
    union weft_sockaddr junk;
    memset(&junk, 0, sizeof(junk));
    cr_expect_eq(T->connect(ctx, 1, &junk, sizeof(junk), &conn), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), "address family") != NULL);
    cr_assert_eq(T->connect(ctx, 1, addr, len, &conn), WEFT_OK);
    void *r = NULL;
    cr_expect_eq(T->isend(conn, NULL, 5, &r), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(T->irecv(NULL, addr, 5, &r), WEFT_ERR_INVALID_ARG);
    T->finalize(ctx);
}

Test(tcp, nstreams_out_of_range, .timeout = 30)
{
    setenv("WEFT_SOCKET_NSTREAMS", "17", 1);
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    void *ctx = NULL;
    struct weft_transport_init a = solo_args(secret, 0, 1);
    cr_expect_eq(T->init(&a, &ctx, addr, &len), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), "WEFT_SOCKET_NSTREAMS=17") != NULL, "%s",
              weft_thread_last_error());
}

/* Pending requests, queued both ways, are freed by finalize (the leak
 * check at the end of every child catches one that is not). */
static int sc_finalize_pending(struct rank_env *e)
{
    static uint8_t out[8 * MIB], in[2][8 * MIB];
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

Test(tcp, finalize_with_pending_requests, .timeout = 30)
{
    run(2, 2, sc_finalize_pending);
}
