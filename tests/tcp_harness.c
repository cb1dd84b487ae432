/*
 * tcp_harness.c - the process side of test_tcp: forks the ranks, gives each
 * its tcp transport context, exchanges the addresses through pipes, and the
 * helpers ranks and the test process use to move and check bytes.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define LEAK_CHECK() __lsan_do_leak_check()
#else
#define LEAK_CHECK() ((void)0)
#endif

#include "src/comm.h"
#include "tests/tcp_harness.h"
#include "transports/tcp/tcp.h"

/* Weak, and not const so the compiler cannot fold it here: a test of
 * another transport defines its own T. */
__attribute__((weak)) const struct weft_transport_ops *T = &weft_tcp_ops;

int g_rank = -1;

/* ---- data patterns ---------------------------------------------------------- */

void fill(uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        p[i] = (uint8_t)(x >> 23);
    }
}

/* Index of the first byte that differs from fill(seed), or n. */
size_t verify(const uint8_t *p, size_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        if (p[i] != (uint8_t)(x >> 23))
            return i;
    }
    return n;
}

bool all_bytes(const uint8_t *p, size_t n, uint8_t v)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != v)
            return false;
    return true;
}

/* ---- plumbing --------------------------------------------------------------- */

bool write_full(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n > 0) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

/* Reads n bytes, waiting at most ms in all; false on EOF or timeout. */
bool read_full(int fd, void *buf, size_t n, int ms)
{
    char *p = buf;
    uint64_t end = weft_now_ns() + (uint64_t)ms * 1000000;
    while (n > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = weft_ms_left(end);
        if (left == 0 || poll(&pfd, 1, left) == 0)
            return false;
        ssize_t k = read(fd, p, n);
        if (k < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

union weft_sockaddr loopback(uint16_t port)
{
    union weft_sockaddr a;
    memset(&a, 0, sizeof(a));
    a.in.sin_family = AF_INET;
    a.in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.in.sin_port = htons(port);
    return a;
}

void world_init(struct world *w, int nranks, int nreal, int nstreams, uint64_t timeout_ms)
{
    memset(w, 0, sizeof(*w));
    w->nranks = nranks;
    w->nreal = nreal;
    w->nstreams = nstreams;
    w->timeout_ms = timeout_ms;
    cr_assert_eq(weft_random_bytes(&w->job, sizeof(w->job)), WEFT_OK);
    cr_assert_eq(weft_random_bytes(w->secret, sizeof(w->secret)), WEFT_OK);
    void *sh = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(sh, MAP_FAILED);
    w->kill_ns = sh;
}

static void child_main(struct world *w, int rank, int up, int down, int (*fn)(struct rank_env *))
{
    g_rank = rank;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    char v[16];
    snprintf(v, sizeof(v), "%d", w->nstreams);
    /* Parameters are read once per process: set before the first read. */
    setenv("WEFT_SOCKET_NSTREAMS", v, 1);
    if (w->bufsize)
        setenv("WEFT_SOCKET_BUFSIZE", w->bufsize, 1);
    struct rank_env e = {.w = w, .rank = rank, .up = up, .down = down};
    struct weft_transport_init a = {.err = NULL,
                                    .rank = rank,
                                    .nranks = w->nranks,
                                    .job = w->job,
                                    .secret = w->secret,
                                    .local = loopback(0),
                                    .timeout_ns = w->timeout_ms * 1000000};
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    CHECK(T->init(&a, &e.ctx, addr, &len) == WEFT_OK);
    CHECK(len <= sizeof(addr));
    CHECK(write_full(up, &len, sizeof(len)) && write_full(up, addr, sizeof(addr)));
    CHECK(read_full(down, w->tablelen, sizeof(w->tablelen), 30000));
    CHECK(read_full(down, w->table, sizeof(w->table), 30000));
    for (int p = 0; p < w->nranks; p++)
        if (p != rank)
            CHECK(T->connect(e.ctx, p, w->table[p], w->tablelen[p], &e.conn[p]) == WEFT_OK);
    int rc = fn(&e);
    T->finalize(e.ctx);
    /* _exit skips the sanitizer's exit-time leak check: run it here. */
    LEAK_CHECK();
    _exit(rc);
}

/* Forks the real ranks and hands every rank the table of addresses
 * (w->addr[r] for r >= nreal is set by the test beforehand). */
void world_start(struct world *w, int (*fn)(struct rank_env *))
{
    fflush(NULL);
    for (int r = 0; r < w->nreal; r++) {
        int up[2], down[2];
        cr_assert_eq(pipe(up), 0);
        cr_assert_eq(pipe(down), 0);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) {
            close(up[0]);
            close(down[1]);
            for (int q = 0; q < r; q++) {
                close(w->up[q]);
                close(w->down[q]);
            }
            child_main(w, r, up[1], down[0], fn);
        }
        close(up[1]);
        close(down[0]);
        w->pid[r] = pid;
        w->up[r] = up[0];
        w->down[r] = down[1];
    }
    for (int r = 0; r < w->nreal; r++)
        cr_assert(read_full(w->up[r], &w->tablelen[r], sizeof(w->tablelen[r]), 30000) &&
                      read_full(w->up[r], w->table[r], sizeof(w->table[r]), 30000),
                  "rank %d did not publish its address", r);
    for (int r = 0; r < w->nranks; r++) {
        if (r >= w->nreal && w->tablelen[r] == 0) {
            memcpy(w->table[r], &w->addr[r], sizeof(w->addr[r]));
            w->tablelen[r] = sizeof(w->addr[r]);
        }
        if (w->tablelen[r] == sizeof(w->addr[r]))
            memcpy(&w->addr[r], w->table[r], sizeof(w->addr[r]));
    }
    for (int r = 0; r < w->nreal; r++)
        cr_assert(write_full(w->down[r], w->tablelen, sizeof(w->tablelen)) &&
                  write_full(w->down[r], w->table, sizeof(w->table)));
}

/* Waits for every child; those in killed_mask must have died of SIGKILL,
 * the others must have exited 0. */
void world_finish(struct world *w, unsigned killed_mask)
{
    for (int r = 0; r < w->nreal; r++) {
        int status = 0;
        cr_assert_eq(waitpid(w->pid[r], &status, 0), w->pid[r]);
        if (killed_mask & (1u << r))
            cr_expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
                      "rank %d should have been killed (status 0x%x)", r, status);
        else
            cr_expect(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                      "rank %d failed (status 0x%x; its stderr says why)", r, status);
        close(w->up[r]);
        close(w->down[r]);
    }
}

void run_buf(int nranks, int nstreams, const char *bufsize, int (*fn)(struct rank_env *))
{
    struct world w;
    world_init(&w, nranks, nranks, nstreams, 20000);
    w.bufsize = bufsize;
    world_start(&w, fn);
    world_finish(&w, 0);
}

void run(int nranks, int nstreams, int (*fn)(struct rank_env *))
{
    run_buf(nranks, nstreams, NULL, fn);
}

/* ---- waiting inside a rank -------------------------------------------------- */

weft_status_t wait_req(struct rank_env *e, void *req, size_t *bytes, int limit_ms)
{
    uint64_t end = weft_now_ns() + (uint64_t)limit_ms * 1000000;
    for (;;) {
        int done = 0;
        size_t b = 0;
        weft_status_t st = T->test(req, &done, &b);
        if (st != WEFT_OK)
            return st;
        if (done) {
            if (bytes)
                *bytes = b;
            return WEFT_OK;
        }
        CHECKF(weft_now_ns() < end, "request not done within %d ms", limit_ms);
        CHECK(T->progress(e->ctx, 10) == WEFT_OK);
    }
}

/* Waits for n requests that must all succeed; bytes[i] gets each length. */
void wait_all(struct rank_env *e, void **reqs, size_t n, size_t *bytes, int limit_ms)
{
    uint64_t end = weft_now_ns() + (uint64_t)limit_ms * 1000000;
    size_t left = n;
    while (left > 0) {
        for (size_t i = 0; i < n; i++) {
            if (reqs[i] == NULL)
                continue;
            int done = 0;
            size_t b = 0;
            weft_status_t st = T->test(reqs[i], &done, &b);
            CHECKF(st == WEFT_OK, "request %zu failed: %s", i, weft_status_string(st));
            if (done) {
                reqs[i] = NULL;
                if (bytes)
                    bytes[i] = b;
                left--;
            }
        }
        CHECKF(left == 0 || weft_now_ns() < end, "%zu of %zu requests not done in %d ms", left,
               n, limit_ms);
        if (left > 0)
            CHECK(T->progress(e->ctx, 10) == WEFT_OK);
    }
}

void send_ok(struct rank_env *e, int peer, const void *buf, size_t n)
{
    void *r = NULL;
    CHECK(T->isend(e->conn[peer], buf, n, &r) == WEFT_OK);
    CHECK(wait_req(e, r, NULL, 20000) == WEFT_OK);
}

size_t recv_ok(struct rank_env *e, int peer, void *buf, size_t n)
{
    void *r = NULL;
    size_t got = 0;
    CHECK(T->irecv(e->conn[peer], buf, n, &r) == WEFT_OK);
    CHECK(wait_req(e, r, &got, 20000) == WEFT_OK);
    return got;
}

/* One small message each way, so that both directions have sockets. */
void warm_up(struct rank_env *e, int peer)
{
    uint8_t out[8], in[8];
    fill(out, sizeof(out), 99);
    void *reqs[2];
    size_t got[2];
    CHECK(T->irecv(e->conn[peer], in, sizeof(in), &reqs[0]) == WEFT_OK);
    CHECK(T->isend(e->conn[peer], out, sizeof(out), &reqs[1]) == WEFT_OK);
    wait_all(e, reqs, 2, got, 20000);
    CHECK(got[0] == sizeof(in) && verify(in, sizeof(in), 99) == sizeof(in));
}

/* Lets the test process know we reached a point. */
void tell_parent(struct rank_env *e)
{
    char c = 'x';
    CHECK(write_full(e->up, &c, 1));
}

/* Keeps the transport moving (accepting, handshaking) until the test
 * process says go. */
void progress_until_go(struct rank_env *e, int limit_ms)
{
    uint64_t end = weft_now_ns() + (uint64_t)limit_ms * 1000000;
    for (;;) {
        struct pollfd p = {.fd = e->down, .events = POLLIN};
        if (poll(&p, 1, 0) == 1) {
            char c;
            CHECK(read(e->down, &c, 1) == 1);
            return;
        }
        CHECKF(weft_now_ns() < end, "no go from the test process in %d ms", limit_ms);
        CHECK(T->progress(e->ctx, 5) == WEFT_OK);
    }
}

/* ---- for the test process ------------------------------------------------- */

int tcp_connect_to(const union weft_sockaddr *a)
{
    int fd = -1;
    cr_assert_eq(weft_sock_connect(a, weft_now_ns() + 5000000000ull, &fd), WEFT_OK);
    return fd;
}

/* True when the other side closes fd within ms (bytes it sends are
 * skipped). */
bool closed_within(int fd, int ms)
{
    uint64_t end = weft_now_ns() + (uint64_t)ms * 1000000;
    char buf[256];
    for (;;) {
        int left = weft_ms_left(end);
        if (left == 0)
            return false;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, left) <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return true;
    }
}
