/*
 * test_tcp.c - what only tcp has, between real processes: streams and
 * socket buffers under the generic scenarios (transport_suite.c, run as
 * such by test_transport), strangers and forgers the test process plays,
 * connection setup failures.  Each rank is a forked child with its own
 * transport context on 127.0.0.1.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "base/admit.h"
#include "base/auth.h"
#include "src/comm.h"
#include "base/sock.h"
#include "tests/tcp_harness.h"

static void use_tcp(void)
{
    tp_use("tcp");
}
TestSuite(tcp, .init = use_tcp);

/* ---- the generic scenarios over several streams and small buffers ------------- */

/* Kernel-sized buffers, and with them other partial-write patterns. */
Test(tcp, pingpong_sizes_2_streams_kernel_buffers, .timeout = 120)
{
    run_buf(2, 2, "0", sc_pingpong);
}

/* Small socket buffers: every message is written in many pieces. */
Test(tcp, both_directions_large_4_streams_64k_buffers, .timeout = 120)
{
    run_buf(2, 4, "64K", sc_both_ways);
}

Test(tcp, many_small_2_streams_8k_buffers, .timeout = 60)
{
    run_buf(2, 2, "8K", sc_many_small);
}

Test(tcp, many_small_4_streams, .timeout = 60)
{
    run(2, 4, sc_many_small);
}

Test(tcp, three_ranks_all_to_all, .timeout = 90)
{
    run(3, 2, sc_all_to_all);
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

/* More silent strangers than the handshakes a rank keeps (base/admit.h):
 * the oldest are closed at once instead of at their deadline (1 s for a
 * HELLO), and the job goes on. */
Test(tcp, handshake_flood_evicts_oldest, .timeout = 60)
{
    enum { FLOOD = WEFT_ADMIT_MAX + 6 };
    struct world w;
    world_init(&w, 2, 2, 1, 20000); /* handshakes would wait 10 s */
    world_start(&w, sc_exchange_after_go);
    char c;
    cr_assert(read_full(w.up[0], &c, 1, 20000));
    cr_assert(read_full(w.up[1], &c, 1, 20000));
    int fds[FLOOD];
    for (int i = 0; i < FLOOD; i++)
        fds[i] = tcp_connect_to(&w.addr[0]);
    for (int i = 0; i < FLOOD - WEFT_ADMIT_MAX; i++)
        cr_expect(closed_within(fds[i], 500), "stranger %d was not evicted", i);
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
    const char *msg = recv_must_fail(e, 1, 1024, 20000);
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

/* ---- setup failures, odds and ends ------------------------------------------------ */

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

Test(tcp, nstreams_out_of_range, .timeout = 30)
{
    setenv("WEFT_SOCKET_NSTREAMS", "17", 1);
    void *ctx = NULL;
    cr_expect_eq(solo_init(1, 42, &ctx), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), "WEFT_SOCKET_NSTREAMS=17") != NULL, "%s",
              weft_thread_last_error());
}
