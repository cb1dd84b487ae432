/*
 * transport_suite.c - what transport.h promises, checked the same way on
 * every transport: matching order, sizes from 0 to a large odd one, many
 * requests in flight, short and too-long messages, a peer that dies or
 * finalizes, finalize with requests pending, wakeup and bad arguments.
 * test_transport runs each once per transport of the harness's table;
 * test_tcp and test_shm rerun some under their own settings.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/tcp_harness.h"

#define MIB (1u << 20)
#define SLOT (256u << 10) /* WEFT_SHM_SLOT_BYTES's default: sizes around it */

/* ---- data moving ---------------------------------------------------------------- */

/* Rank 0 sends each size and rank 1 echoes it back changed; rank 0
 * receives the echo with a byte to spare, which must stay untouched. */
int sc_pingpong(struct rank_env *e)
{
    static const size_t sizes[] = {0, 1, 4095, 4096, SLOT - 1, SLOT, SLOT + 1,
                                   3 * SLOT + 5, MIB, 64 * MIB + 1};
    int peer = 1 - e->rank;
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(sizes); k++) {
        size_t n = sizes[k];
        uint8_t *buf = malloc(n + 1);
        CHECK(buf != NULL);
        int iters = n <= SLOT + 1 ? 20 : PINGPONG_LARGE_ITERS;
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

/* Both ranks post all their sends, then all their receives, several far
 * larger than any buffer between them: no deadlock, all arrive. */
int sc_both_ways(struct rank_env *e)
{
    static const size_t sizes[] = {8 * MIB, 64 * MIB, 3 * MIB + 7, 8 * MIB, 0, 5};
    enum { N = WEFT_ARRAY_SIZE(sizes) };
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

/* 1000 small messages each way, all in flight at once, sizes 0..250:
 * they must match in order. */
#define NSMALL 1000
static size_t small_len(int i)
{
    return (size_t)(i * 37) % 251;
}

int sc_many_small(struct rank_env *e)
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

/* Every rank sends 40 messages to every other, one of them 2 MiB + 3, with
 * every receive posted before the sends. */
static size_t a2a_len(int i, int to)
{
    return i == 7 ? 2 * MIB + 3 : (size_t)(i * 997 + to * 13) % 5000;
}

int sc_all_to_all(struct rank_env *e)
{
    enum { MSGS = 40 };
    int n = e->w->nranks;
    size_t cap = 2 * MIB + 64;
    uint8_t *out[MAXR][MSGS], *in[MAXR][MSGS];
    void *reqs[2 * MAXR * MSGS];
    size_t got[2 * MAXR * MSGS], nreq = 0;
    for (int p = 0; p < n; p++) {
        if (p == e->rank)
            continue;
        for (int i = 0; i < MSGS; i++) {
            out[p][i] = malloc(cap);
            in[p][i] = malloc(cap);
            CHECK(out[p][i] && in[p][i]);
            fill(out[p][i], a2a_len(i, p), (uint32_t)(e->rank * 1000 + p * 100 + i));
            CHECK(T->irecv(e->conn[p], in[p][i], cap, &reqs[nreq++]) == WEFT_OK);
            CHECK(T->isend(e->conn[p], out[p][i], a2a_len(i, p), &reqs[nreq++]) == WEFT_OK);
        }
    }
    wait_all(e, reqs, nreq, got, 60000);
    nreq = 0;
    for (int p = 0; p < n; p++) {
        if (p == e->rank)
            continue;
        for (int i = 0; i < MSGS; i++) {
            size_t len = a2a_len(i, e->rank);
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

/* ---- length mismatches ----------------------------------------------------------- */

/* A shorter message into a longer receive reports its length and leaves
 * the rest of the buffer alone; the connection carries on. */
int sc_short_into_long(struct rank_env *e)
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

/* A longer message than the receive posted fails the receiver with
 * WEFT_ERR_REMOTE before a byte lands; the sender then sees the connection
 * fail too, and so does every later request on it. */
static size_t g_long;

static int sc_long_into_short(struct rank_env *e)
{
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
        CHECKF(strstr(msg, "rank 1") != NULL, "%s", msg);
        CHECKF(TP->too_long_told == NULL || strstr(msg, TP->too_long_told), "%s", msg);
        free(big);
        tell_parent(e);
    } else {
        const char *msg = recv_must_fail(e, 0, 1024, 10000);
        char want[128];
        snprintf(want, sizeof(want), TP->too_long, g_long);
        CHECKF(strstr(msg, want), "%s", msg);
        expect_failed(e, 0);
        /* Alive until rank 0 has seen the failure: the transport must
         * tell it, not our exit. */
        progress_until_go(e, 20000);
    }
    return 0;
}

void run_long_into_short(size_t bytes)
{
    g_long = bytes;
    struct world w;
    world_init(&w, 2, 2, 1, 20000);
    world_start(&w, sc_long_into_short);
    char c;
    cr_assert(read_full(w.up[0], &c, 1, 20000), "rank 0 did not see the failure");
    cr_assert(write_full(w.down[1], &c, 1));
    world_finish(&w, 0);
}

/* ---- peers that go ------------------------------------------------------------------- */

/* Rank 1 is killed while rank 0 waits in a receive from it: rank 0 gets
 * WEFT_ERR_REMOTE naming it within 2 s. */
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
    const char *msg = expect_killed(e, wait_req(e, r, NULL, 10000), 1);
    CHECKF(strstr(msg, TP->peer_died[0]) && strstr(msg, TP->peer_died[1]), "%s", msg);
    expect_failed(e, 1);
    return 0;
}

void run_killed_peer(void)
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
    if (TP->leftovers)
        cr_expect_eq(TP->leftovers(w.job), 0, "the killed rank left files behind");
}

/* Rank 1 finalizes while rank 0 still waits for a message from it: what
 * it sent first is still delivered, then receives fail naming it. */
int sc_peer_finalized(struct rank_env *e)
{
    warm_up(e, 1 - e->rank);
    if (e->rank == 1) {
        uint8_t m[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        send_ok(e, 0, m, sizeof(m));
        return 0;
    }
    uint8_t buf[64];
    usleep(200000);
    /* The transport sees rank 1 leave before the receive is posted: what
     * rank 1 sent first must still arrive. */
    for (int i = 0; i < 50; i++) {
        (void)tp_progress(e, 0);
        usleep(1000);
    }
    CHECK(recv_ok(e, 1, buf, sizeof(buf)) == 8 && buf[7] == 8);
    void *r = NULL;
    CHECK(T->irecv(e->conn[1], buf, sizeof(buf), &r) == WEFT_OK);
    weft_status_t st = wait_req(e, r, NULL, 5000);
    CHECKF(st == WEFT_ERR_REMOTE, "got %s", weft_status_string(st));
    const char *msg = weft_thread_last_error();
    CHECKF(strstr(msg, "rank 1"), "%s", msg);
    return 0;
}

/* Pending requests, queued both ways, are freed by finalize (the leak
 * check at the end of every child catches one that is not). */
int sc_finalize_pending(struct rank_env *e)
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
    CHECK(tp_progress(e, 0) == WEFT_OK);
    return 0;
}

/* ---- in the test process ------------------------------------------------------------- */

struct waker {
    struct rank_env *e;
    int delay_ms;
};

static void *waker_main(void *arg)
{
    struct waker *wk = arg;
    usleep((useconds_t)wk->delay_ms * 1000);
    tp_wakeup(wk->e);
    return NULL;
}

/* A wakeup from another thread ends a wait at once; a consumed one does
 * not cut the next short; one that comes before the wait is not lost. */
void check_wakeup(void)
{
    uint8_t secret[WEFT_SECRET_BYTES];
    struct weft_transport_init a = solo_args(secret, 0, 1, fresh_job());
    uint8_t addr[TP_ADDR_MAX];
    size_t len = sizeof(addr);
    struct rank_env e = {.rank = 0};
    cr_assert_eq(tp_open(&e, &a, addr, &len), WEFT_OK, "%s", weft_thread_last_error());
    struct waker wk = {&e, 100};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, waker_main, &wk), 0);
    uint64_t t0 = weft_now_ns();
    cr_assert_eq(tp_progress(&e, 5000), WEFT_OK);
    uint64_t ms = (weft_now_ns() - t0) / 1000000;
    cr_expect(ms >= 50 && ms < 2000, "progress returned after %llu ms, the wakeup came at 100",
              (unsigned long long)ms);
    pthread_join(th, NULL);
    t0 = weft_now_ns();
    cr_assert_eq(tp_progress(&e, 200), WEFT_OK);
    cr_expect(weft_now_ns() - t0 >= 150000000ull, "a consumed wakeup cut a later wait short");
    tp_wakeup(&e);
    t0 = weft_now_ns();
    cr_assert_eq(tp_progress(&e, 2000), WEFT_OK);
    cr_expect(weft_now_ns() - t0 < 100000000ull, "a wakeup before the wait was lost");
    tp_close(&e);
    T->finalize(NULL);
}

/* Init, connect, isend, irecv and test refuse what cannot be right, and
 * a context closed without ready() leaves nothing behind. */
void check_bad_arguments(void)
{
    if (!TP->checks_args)
        cr_skip_test("%s trusts the communicator for its arguments", TP->name);
    uint8_t secret[WEFT_SECRET_BYTES];
    uint8_t addr[2][TP_ADDR_MAX];
    size_t len[2] = {sizeof(addr[0]), sizeof(addr[1])};
    struct rank_env e[2] = {{.rank = 0}, {.rank = 1}};
    void *conn = NULL;
    uint64_t job = fresh_job();

    struct weft_transport_init a = solo_args(secret, 2, 2, job);
    cr_expect_eq(tp_open(&e[0], &a, addr[0], &len[0]), WEFT_ERR_INVALID_ARG);
    cr_expect_null(e[0].ctx);
    a = solo_args(secret, 0, 2, job);
    len[0] = 16;
    cr_expect_eq(tp_open(&e[0], &a, addr[0], &len[0]), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), "address buffer") != NULL);

    len[0] = sizeof(addr[0]);
    cr_assert_eq(tp_open(&e[0], &a, addr[0], &len[0]), WEFT_OK);
    a = solo_args(secret, 1, 2, job);
    cr_assert_eq(tp_open(&e[1], &a, addr[1], &len[1]), WEFT_OK);
    cr_expect_eq(tp_connect(&e[0], 0, addr[0], len[0], &conn), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(tp_connect(&e[0], 2, addr[1], len[1], &conn), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(tp_connect(&e[0], 1, addr[1], 16, &conn), WEFT_ERR_INVALID_ARG);
    uint8_t junk[TP_ADDR_MAX];
    memset(junk, 0, sizeof(junk));
    cr_expect_eq(tp_connect(&e[0], 1, junk, len[1], &conn), WEFT_ERR_INVALID_ARG);
    cr_expect(strstr(weft_thread_last_error(), TP->bad_addr) != NULL, "%s",
              weft_thread_last_error());
    cr_assert_eq(tp_connect(&e[0], 1, addr[1], len[1], &conn), WEFT_OK);
    void *r = NULL;
    int done = 0;
    cr_expect_eq(T->isend(conn, NULL, 5, &r), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(T->irecv(NULL, addr[0], 5, &r), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(T->test(NULL, &done, NULL), WEFT_ERR_INVALID_ARG);
    tp_close(&e[0]);
    tp_close(&e[1]);
    if (TP->leftovers)
        cr_expect_eq(TP->leftovers(job), 0, "closed without ready(), %s left files", TP->name);
}
