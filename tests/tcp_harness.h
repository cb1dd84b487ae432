/*
 * tcp_harness.h - the process harness of the transport tests (test_tcp,
 * test_shm, the per-transport suites of test_transport): the test process
 * forks the real ranks, each child opens the transport under test on
 * 127.0.0.1 and connects to every peer once the test process has handed out
 * the table of addresses; then the scenario runs in the child.
 *
 * Children are not Criterion workers: they check with CHECK/CHECKF, which
 * print "rank R: file:line: ..." to stderr and _exit(3).
 */
#ifndef WEFT_TEST_TCP_HARNESS_H
#define WEFT_TEST_TCP_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/auth.h"
#include "src/comm.h"
#include "base/sock.h"
#include "transports/transport.h"

#define MAXR 4
/* Bytes a rank may publish: verbs publishes a tcp address beside its own. */
#define TP_ADDR_MAX (2 * WEFT_TRANSPORT_ADDR_MAX + 1)

struct rank_env;

/*
 * How the harness opens one transport in a rank, and what the generic suite
 * (transport_suite.c) expects of it where transports word or do things
 * differently.  weft_test_transports[] (tcp_harness.c) holds one for each
 * transport built: the one place to add a transport.  Hooks left NULL call
 * the vtable as it is.
 */
struct test_transport {
    const char *name; /* its WEFT_TRANSPORT word, and its suite's name */
    const struct weft_transport_ops *ops;
    /* Readies this process for it (parameters); returns why it cannot run
     * here (the test skips), or NULL. */
    const char *(*setup)(void);
    /* Opens e's context (e->ctx, and any other it needs) and writes the
     * address the rank publishes. */
    weft_status_t (*open)(struct rank_env *e, const struct weft_transport_init *a, void *addr,
                          size_t *addrlen);
    weft_status_t (*connect)(struct rank_env *e, int peer, const void *addr, size_t addrlen,
                             void **conn);
    weft_status_t (*progress)(struct rank_env *e, int timeout_ms);
    /* Ends a progress() waiting in another thread. */
    void (*wakeup)(struct rank_env *e);
    void (*close)(struct rank_env *e);
    bool barrier;     /* ready() once every rank has connected (shm) */
    bool checks_args; /* init, connect, isend and irecv refuse bad arguments */
    /* Files of the job left on the machine (-1: cannot tell); NULL: it
     * makes none. */
    int (*leftovers)(uint64_t job);
    /* The receiver's error for a message longer than its 1024-byte
     * receive: a printf format of the bytes sent. */
    const char *too_long;
    /* What the sender's error says of it besides "rank 1" (NULL: no more). */
    const char *too_long_told;
    /* Besides "rank N", what the error of a dead peer says. */
    const char *peer_died[2];
    /* What connect says of an address that is not one of its own. */
    const char *bad_addr;
};

extern const struct test_transport weft_test_transports[];
extern const size_t weft_test_ntransports;

/* The transport under test (tcp until tp_use) and its vtable. */
extern const struct test_transport *TP;
extern const struct weft_transport_ops *T;
/* This process's rank in a child, -1 in the test process (for CHECK). */
extern int g_rank;

/* Makes the named transport the one under test, in the test process
 * before any fork; skips the test where it cannot run. */
void tp_use(const char *name);

/* What the test process knows about the job; children get a copy at fork. */
struct world {
    int nranks, nreal, nstreams;   /* ranks >= nreal are played by the test process */
    const char *bufsize;           /* WEFT_SOCKET_BUFSIZE for the ranks, NULL: default */
    uint64_t timeout_ms;
    uint64_t job;
    uint8_t secret[WEFT_SECRET_BYTES];
    union weft_sockaddr addr[MAXR];  /* tcp: the table below as socket addresses */
    /* The published addresses as opaque bytes, for any transport; for
     * r >= nreal the test sets table[r] (or, for tcp, addr[r]) beforehand. */
    uint8_t table[MAXR][TP_ADDR_MAX];
    size_t tablelen[MAXR];
    pid_t pid[MAXR];
    int up[MAXR], down[MAXR];      /* test process's ends of each child's pipes */
    volatile uint64_t *kill_ns;    /* shared: when the test process killed a rank */
};

/* One rank, inside its child. */
struct rank_env {
    struct world *w;
    int rank;
    void *ctx;                     /* the transport's */
    void *oob;                     /* verbs: the tcp context its queue pairs are joined over */
    void *conn[MAXR];
    int up, down;                  /* child's ends: to and from the test process */
};

/* The transport under test, through TP's hooks; e may be a rank of this
 * process (the in-process tests: only e->rank set). */
weft_status_t tp_open(struct rank_env *e, const struct weft_transport_init *a, void *addr,
                      size_t *addrlen);
weft_status_t tp_connect(struct rank_env *e, int peer, const void *addr, size_t addrlen,
                         void **conn);
weft_status_t tp_progress(struct rank_env *e, int timeout_ms);
void tp_wakeup(struct rank_env *e);
void tp_close(struct rank_env *e);

#define CHECKF(cond, ...)                                                                   \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "rank %d: %s:%d: check failed: %s: ", g_rank, __FILE__,         \
                    __LINE__, #cond);                                                       \
            fprintf(stderr, __VA_ARGS__);                                                   \
            fprintf(stderr, " (last error: %s)\n", weft_thread_last_error());               \
            _exit(3);                                                                       \
        }                                                                                   \
    } while (0)
#define CHECK(cond) CHECKF(cond, "%s", "")


/* ---- data patterns ---------------------------------------------------------- */

/* Fills p with a pseudo-random pattern that depends on seed only. */
void fill(uint8_t *p, size_t n, uint32_t seed);
/* Index of the first byte that differs from fill(seed), or n. */
size_t verify(const uint8_t *p, size_t n, uint32_t seed);
bool all_bytes(const uint8_t *p, size_t n, uint8_t v);

/* ---- plumbing --------------------------------------------------------------- */

bool write_full(int fd, const void *buf, size_t n);
/* Reads n bytes, waiting at most ms in all; false on EOF or timeout. */
bool read_full(int fd, void *buf, size_t n, int ms);
union weft_sockaddr loopback(uint16_t port);

/* Fresh job id and secret, and the shared page for kill_ns. */
void world_init(struct world *w, int nranks, int nreal, int nstreams, uint64_t timeout_ms);
/* Forks the real ranks, each running fn once connected, and hands every
 * rank the table of addresses (w->table[r] or w->addr[r] for r >= nreal is
 * set by the test beforehand).  Where the transport wants ready(), the
 * ranks wait for world_barrier before they call it and run fn. */
void world_spawn(struct world *w, int (*fn)(struct rank_env *));
/* Every rank has connected: lets them go on to ready(). */
void world_barrier(struct world *w);
/* world_spawn, then world_barrier where the transport has one. */
void world_start(struct world *w, int (*fn)(struct rank_env *));
/* Waits for every child; those in killed_mask must have died of SIGKILL,
 * the others must have exited 0. */
void world_finish(struct world *w, unsigned killed_mask);
/* A whole job of nranks real ranks running fn; bufsize as in struct world.
 * Afterwards nothing of it may be left on the machine. */
void run_buf(int nranks, int nstreams, const char *bufsize, int (*fn)(struct rank_env *));
void run(int nranks, int nstreams, int (*fn)(struct rank_env *));

/* ---- waiting inside a rank -------------------------------------------------- */

/* Progresses until req is done (bytes gets its length) or fails; not done
 * within limit_ms fails the rank. */
weft_status_t wait_req(struct rank_env *e, void *req, size_t *bytes, int limit_ms);
/* Waits for n requests that must all succeed; bytes[i] gets each length. */
void wait_all(struct rank_env *e, void **reqs, size_t n, size_t *bytes, int limit_ms);
void send_ok(struct rank_env *e, int peer, const void *buf, size_t n);
size_t recv_ok(struct rank_env *e, int peer, void *buf, size_t n);
/* A receive of n bytes from peer that must fail with WEFT_ERR_REMOTE
 * without a byte landing; returns the error. */
const char *recv_must_fail(struct rank_env *e, int peer, size_t n, int limit_ms);
/* The connection to peer failed: later requests on it fail too. */
void expect_failed(struct rank_env *e, int peer);
/* st, of a request to a peer the test process killed (w->kill_ns): it must
 * be WEFT_ERR_REMOTE, within 2 s of the kill, naming the peer; returns
 * the error. */
const char *expect_killed(struct rank_env *e, weft_status_t st, int peer);
/* One small message each way, so that both directions have sockets. */
void warm_up(struct rank_env *e, int peer);
/* Lets the test process know we reached a point. */
void tell_parent(struct rank_env *e);
/* Keeps the transport moving (accepting, handshaking) until the test
 * process says go. */
void progress_until_go(struct rank_env *e, int limit_ms);

/* ---- in-process checks ------------------------------------------------------ */

/* Arguments of a rank opened in the test process (secret: 7s). */
struct weft_transport_init solo_args(uint8_t *secret, int rank, int nranks, uint64_t job);
/* Rank 0 of nranks of job opened here with T->init; the address is
 * dropped. */
weft_status_t solo_init(int nranks, uint64_t job, void **ctx);
uint64_t fresh_job(void);

/* ---- for the test process --------------------------------------------------- */

/* A plain TCP connection to a, as a stranger would make. */
int tcp_connect_to(const union weft_sockaddr *a);
/* True when the other side closes fd within ms (bytes it sends are
 * skipped). */
bool closed_within(int fd, int ms);
/* The folder shm puts its segments in (WEFT_SHM_DIR or /dev/shm). */
const char *shm_dir(void);
/* Segments of job in dir (NULL: shm_dir()); -1 if dir cannot be read. */
int count_segments(const char *dir, uint64_t job);

/* ---- the generic scenarios (transport_suite.c) ------------------------------- */

/* Round trips of each ping-pong size over 256 KiB (20 of the smaller);
 * PINGPONG_MIB_MESSAGES of its messages each way are 1 MiB or more. */
#define PINGPONG_LARGE_ITERS 3
#define PINGPONG_MIB_MESSAGES (2 * PINGPONG_LARGE_ITERS)

/* Bodies of 2-rank jobs (sc_all_to_all: any number up to MAXR). */
int sc_pingpong(struct rank_env *e);
int sc_both_ways(struct rank_env *e);
int sc_many_small(struct rank_env *e);
int sc_all_to_all(struct rank_env *e);
int sc_short_into_long(struct rank_env *e);
int sc_peer_finalized(struct rank_env *e);
int sc_finalize_pending(struct rank_env *e);
/* Whole tests: a message of bytes into a 1024-byte receive; a peer killed
 * while the other waits for it; wakeup; bad arguments. */
void run_long_into_short(size_t bytes);
void run_killed_peer(void);
void check_wakeup(void);
void check_bad_arguments(void);

#endif
