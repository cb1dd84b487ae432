/*
 * tcp_harness.c - the process side of the transport tests: the table of
 * transports and how each is opened, forking the ranks and exchanging their
 * addresses through pipes, and the helpers ranks and the test process use
 * to move and check bytes.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
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
#include "transports/registry.h"
#include "transports/shm/shm.h"
#include "transports/tcp/tcp.h"
#ifdef HAVE_VERBS
#include "transports/verbs/verbs.h"
#endif

int g_rank = -1;

/* ---- the transports ----------------------------------------------------------- */

static int shm_leftovers(uint64_t job)
{
    return count_segments(NULL, job);
}

#ifdef HAVE_VERBS
/* verbs on the software device (tests/softverbs), which tests/verbs.sh
 * preloads.  As in a communicator, each rank's queue pairs are joined over
 * a tcp connection to the peer: a rank opens both and publishes both
 * addresses, [tcp length][tcp address][verbs address]. */
static const char *verbs_setup(void)
{
    if (!getenv("WEFT_TEST_SOFTVERBS"))
        return "needs the software verbs device preloaded (tests/verbs.sh)";
    setenv("WEFT_IB_TIMEOUT", "14", 1); /* a dead peer's writes give up in 200 ms */
    return NULL;
}

static void verbs_close(struct rank_env *e)
{
    weft_verbs_ops.finalize(e->ctx); /* says goodbye over tcp: first */
    weft_tcp_ops.finalize(e->oob);
    e->ctx = e->oob = NULL;
}

static weft_status_t verbs_open(struct rank_env *e, const struct weft_transport_init *a,
                                void *addr, size_t *addrlen)
{
    uint8_t taddr[WEFT_TRANSPORT_ADDR_MAX], vaddr[WEFT_TRANSPORT_ADDR_MAX];
    size_t tlen = sizeof(taddr), vlen = sizeof(vaddr);
    e->ctx = e->oob = NULL;
    weft_status_t st = weft_tcp_ops.init(a, &e->oob, taddr, &tlen);
    if (st != WEFT_OK)
        return st;
    struct weft_transport_init v = *a;
    v.oob_ops = &weft_tcp_ops;
    v.oob_ctx = e->oob;
    st = weft_verbs_ops.init(&v, &e->ctx, vaddr, &vlen);
    /* Completions end tcp's wait, as in a communicator. */
    if (st == WEFT_OK)
        st = weft_verbs_ops.set_waker(e->ctx, weft_tcp_ops.wakeup, e->oob);
    if (st == WEFT_OK && 1 + tlen + vlen > *addrlen)
        st = weft_error(NULL, WEFT_ERR_INVALID_ARG, "verbs and tcp addresses: %zu bytes",
                        1 + tlen + vlen);
    if (st != WEFT_OK) {
        verbs_close(e);
        return st;
    }
    uint8_t *p = addr;
    p[0] = (uint8_t)tlen;
    memcpy(p + 1, taddr, tlen);
    memcpy(p + 1 + tlen, vaddr, vlen);
    *addrlen = 1 + tlen + vlen;
    return WEFT_OK;
}

static weft_status_t verbs_connect(struct rank_env *e, int peer, const void *addr,
                                   size_t addrlen, void **conn)
{
    const uint8_t *p = addr;
    void *oob = NULL;
    if (addrlen < 1 || addrlen < 1u + p[0])
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "rank %d published a bad address", peer);
    weft_status_t st = weft_tcp_ops.connect(e->oob, peer, p + 1, p[0], &oob);
    if (st != WEFT_OK)
        return st;
    weft_verbs_desc.bind_oob(e->ctx, peer, oob);
    return weft_verbs_ops.connect(e->ctx, peer, p + 1 + p[0], addrlen - 1 - p[0], conn);
}

/* weft_comm_progress's way: verbs without waiting, then sleep in tcp
 * unless verbs has news. */
static weft_status_t verbs_progress(struct rank_env *e, int timeout_ms)
{
    weft_status_t st = weft_verbs_ops.progress(e->ctx, 0);
    if (st != WEFT_OK)
        return st;
    if (timeout_ms <= 0)
        return weft_tcp_ops.progress(e->oob, 0);
    bool news = weft_verbs_ops.sleep_begin(e->ctx);
    st = weft_tcp_ops.progress(e->oob, news ? 0 : timeout_ms);
    weft_verbs_ops.sleep_end(e->ctx);
    return st;
}

static void verbs_wakeup(struct rank_env *e)
{
    weft_tcp_ops.wakeup(e->oob);
}
#endif

#define SENT_BUT_HOLDS "rank 0 sent %zu bytes but the receive posted holds 1024"

const struct test_transport weft_test_transports[] = {
    {"tcp", &weft_tcp_ops, .checks_args = true, .too_long = SENT_BUT_HOLDS,
     .peer_died = {"127.0.0.1:", "stream 0"}, .bad_addr = "address family"},
    {"shm", &weft_shm_ops, .barrier = true, .checks_args = true, .leftovers = shm_leftovers,
     .too_long = SENT_BUT_HOLDS, .too_long_told = "holds 1024",
     .peer_died = {"(pid ", ") exited"}, .bad_addr = "is not one"},
#ifdef HAVE_VERBS
    /* The receiver's error is "rank 0 sent a message longer than the 1024
     * bytes posted for it", unless the sender's word that it failed the
     * connection comes first: then only the sender's says why. */
    {"verbs", &weft_verbs_ops, .setup = verbs_setup, .open = verbs_open,
     .connect = verbs_connect, .progress = verbs_progress, .wakeup = verbs_wakeup,
     .close = verbs_close, .too_long = "rank 0 ",
     .too_long_told = "longer than the 1024 bytes it posted",
     .peer_died = {"is gone", "tcp connection"}},
#endif
};
const size_t weft_test_ntransports = WEFT_ARRAY_SIZE(weft_test_transports);

const struct test_transport *TP = &weft_test_transports[0];
const struct weft_transport_ops *T = &weft_tcp_ops;

void tp_use(const char *name)
{
    for (size_t i = 0; i < weft_test_ntransports; i++) {
        if (strcmp(weft_test_transports[i].name, name) != 0)
            continue;
        TP = &weft_test_transports[i];
        T = TP->ops;
        const char *why = TP->setup ? TP->setup() : NULL;
        if (why)
            cr_skip_test("%s: %s", name, why);
        return;
    }
    cr_skip_test("%s: not built", name);
}

weft_status_t tp_open(struct rank_env *e, const struct weft_transport_init *a, void *addr,
                      size_t *addrlen)
{
    return TP->open ? TP->open(e, a, addr, addrlen) : T->init(a, &e->ctx, addr, addrlen);
}

weft_status_t tp_connect(struct rank_env *e, int peer, const void *addr, size_t addrlen,
                         void **conn)
{
    return TP->connect ? TP->connect(e, peer, addr, addrlen, conn)
                       : T->connect(e->ctx, peer, addr, addrlen, conn);
}

weft_status_t tp_progress(struct rank_env *e, int timeout_ms)
{
    return TP->progress ? TP->progress(e, timeout_ms) : T->progress(e->ctx, timeout_ms);
}

void tp_wakeup(struct rank_env *e)
{
    if (TP->wakeup)
        TP->wakeup(e);
    else
        T->wakeup(e->ctx);
}

void tp_close(struct rank_env *e)
{
    if (TP->close)
        TP->close(e);
    else
        T->finalize(e->ctx);
}

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

/* Moves n bytes through fd: reads, waiting until end at most, or writes
 * (blocking).  False on EOF, an error or the deadline. */
static bool full_io(int fd, char *p, size_t n, bool reading, uint64_t end)
{
    while (n > 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int left = weft_ms_left(end);
        if (reading && (left == 0 || poll(&pfd, 1, left) == 0))
            return false;
        ssize_t k = reading ? read(fd, p, n) : write(fd, p, n);
        if (k < 0 && (errno == EINTR || (reading && errno == EAGAIN)))
            continue;
        if (k <= 0)
            return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

bool write_full(int fd, const void *buf, size_t n)
{
    return full_io(fd, (char *)(uintptr_t)buf, n, false, 0);
}

bool read_full(int fd, void *buf, size_t n, int ms)
{
    return full_io(fd, buf, n, true, weft_now_ns() + (uint64_t)ms * 1000000);
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
    uint8_t addr[TP_ADDR_MAX];
    size_t len = sizeof(addr);
    CHECK(tp_open(&e, &a, addr, &len) == WEFT_OK);
    CHECK(len <= sizeof(addr));
    CHECK(write_full(up, &len, sizeof(len)) && write_full(up, addr, sizeof(addr)));
    CHECK(read_full(down, w->tablelen, sizeof(w->tablelen), 30000));
    CHECK(read_full(down, w->table, sizeof(w->table), 30000));
    for (int p = 0; p < w->nranks; p++)
        if (p != rank)
            CHECK(tp_connect(&e, p, w->table[p], w->tablelen[p], &e.conn[p]) == WEFT_OK);
    if (TP->barrier) { /* the other side of world_barrier */
        tell_parent(&e);
        progress_until_go(&e, 30000);
        CHECK(T->ready(e.ctx) == WEFT_OK);
    }
    int rc = fn(&e);
    tp_close(&e);
    /* _exit skips the sanitizer's exit-time leak check: run it here. */
    LEAK_CHECK();
    _exit(rc);
}

void world_spawn(struct world *w, int (*fn)(struct rank_env *))
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

void world_barrier(struct world *w)
{
    char c = 'g';
    for (int r = 0; r < w->nreal; r++)
        cr_assert(read_full(w->up[r], &c, 1, 30000), "rank %d did not reach the barrier", r);
    for (int r = 0; r < w->nreal; r++)
        cr_assert(write_full(w->down[r], &c, 1));
}

void world_start(struct world *w, int (*fn)(struct rank_env *))
{
    world_spawn(w, fn);
    if (TP->barrier)
        world_barrier(w);
}

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
    if (TP->leftovers)
        cr_expect_eq(TP->leftovers(w.job), 0, "%s left files of the job behind", TP->name);
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
        CHECK(tp_progress(e, 10) == WEFT_OK);
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
            CHECK(tp_progress(e, 10) == WEFT_OK);
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

const char *recv_must_fail(struct rank_env *e, int peer, size_t n, int limit_ms)
{
    uint8_t *buf = malloc(n);
    CHECK(buf != NULL);
    memset(buf, 0xEE, n);
    void *r = NULL;
    CHECK(T->irecv(e->conn[peer], buf, n, &r) == WEFT_OK);
    weft_status_t st = wait_req(e, r, NULL, limit_ms);
    CHECKF(st == WEFT_ERR_REMOTE, "the receive got %s", weft_status_string(st));
    CHECKF(all_bytes(buf, n, 0xEE), "bytes of the failed message landed");
    free(buf);
    return weft_thread_last_error();
}

void expect_failed(struct rank_env *e, int peer)
{
    uint8_t buf[8] = {0};
    void *r = NULL;
    CHECK(T->irecv(e->conn[peer], buf, sizeof(buf), &r) == WEFT_OK);
    CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_REMOTE);
    CHECK(T->isend(e->conn[peer], buf, sizeof(buf), &r) == WEFT_OK);
    CHECK(wait_req(e, r, NULL, 1000) == WEFT_ERR_REMOTE);
}

const char *expect_killed(struct rank_env *e, weft_status_t st, int peer)
{
    uint64_t now = weft_now_ns();
    CHECKF(st == WEFT_ERR_REMOTE, "got %s", weft_status_string(st));
    CHECK(*e->w->kill_ns != 0);
    CHECKF(now - *e->w->kill_ns < 2000000000ull, "noticed after %llu ms",
           (unsigned long long)((now - *e->w->kill_ns) / 1000000));
    const char *msg = weft_thread_last_error();
    char name[16];
    snprintf(name, sizeof(name), "rank %d", peer);
    CHECKF(strstr(msg, name), "%s", msg);
    return msg;
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
        CHECK(tp_progress(e, 5) == WEFT_OK);
    }
}

/* ---- in-process checks ------------------------------------------------------ */

struct weft_transport_init solo_args(uint8_t *secret, int rank, int nranks, uint64_t job)
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

weft_status_t solo_init(int nranks, uint64_t job, void **ctx)
{
    uint8_t secret[WEFT_SECRET_BYTES], addr[WEFT_TRANSPORT_ADDR_MAX];
    size_t len = sizeof(addr);
    struct weft_transport_init a = solo_args(secret, 0, nranks, job);
    return T->init(&a, ctx, addr, &len);
}

uint64_t fresh_job(void)
{
    uint64_t job;
    cr_assert_eq(weft_random_bytes(&job, sizeof(job)), WEFT_OK);
    return job;
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

const char *shm_dir(void)
{
    const char *d = getenv("WEFT_SHM_DIR");
    return d && *d ? d : "/dev/shm";
}

int count_segments(const char *dir, uint64_t job)
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
