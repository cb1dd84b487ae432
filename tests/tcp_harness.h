/*
 * tcp_harness.h - the process harness of test_tcp: the test process forks
 * the real ranks, each child makes its own tcp transport context on
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

/* The transport under test: &weft_tcp_ops unless the test defines T. */
extern const struct weft_transport_ops *T;
/* This process's rank in a child, -1 in the test process (for CHECK). */
extern int g_rank;

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
    uint8_t table[MAXR][WEFT_TRANSPORT_ADDR_MAX];
    size_t tablelen[MAXR];
    pid_t pid[MAXR];
    int up[MAXR], down[MAXR];      /* test process's ends of each child's pipes */
    volatile uint64_t *kill_ns;    /* shared: when the test process killed a rank */
};

/* One rank, inside its child. */
struct rank_env {
    struct world *w;
    int rank;
    void *ctx;
    void *conn[MAXR];
    int up, down;                  /* child's ends: to and from the test process */
};

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
 * set by the test beforehand). */
void world_start(struct world *w, int (*fn)(struct rank_env *));
/* Waits for every child; those in killed_mask must have died of SIGKILL,
 * the others must have exited 0. */
void world_finish(struct world *w, unsigned killed_mask);
/* A whole job of nranks real ranks running fn; bufsize as in struct world. */
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
/* One small message each way, so that both directions have sockets. */
void warm_up(struct rank_env *e, int peer);
/* Lets the test process know we reached a point. */
void tell_parent(struct rank_env *e);
/* Keeps the transport moving (accepting, handshaking) until the test
 * process says go. */
void progress_until_go(struct rank_env *e, int limit_ms);

/* ---- for the test process --------------------------------------------------- */

/* A plain TCP connection to a, as a stranger would make. */
int tcp_connect_to(const union weft_sockaddr *a);
/* True when the other side closes fd within ms (bytes it sends are
 * skipped). */
bool closed_within(int fd, int ms);

#endif
