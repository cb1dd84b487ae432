/*
 * harness.h - multi-process jobs for the tests: make an id, fork one real
 * process per rank over loopback TCP, wait for all of them with a deadline
 * (a hang is a failure that names the ranks), and typed buffer helpers that
 * fill and compare every datatype exactly.
 *
 * Children never use Criterion's asserts (they are not Criterion workers):
 * they print "rank R: what: expected X, got Y" to stderr and exit non-zero.
 */
#ifndef WEFT_TEST_HARNESS_H
#define WEFT_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "bootstrap.h"
#include "weft.h"

#define WEFT_TEST_MAX_RANKS 64

/* What a rank runs once its communicator is up; 0 means it passed. */
typedef int (*weft_test_body_t)(weft_comm_t comm, int rank, int nranks, void *arg);
/* A rank's whole life, for tests that make their own init calls (a
 * different id per rank, a delay, an init that must fail); 0 = passed. */
typedef int (*weft_test_proc_t)(int rank, int nranks, const weft_unique_id_t *id, void *arg);

/*
 * One forked job.  Owner: the test that started it; weft_test_job_wait
 * reaps every child (killing the ones still running at the deadline), so
 * no process outlives the test.  pid[r] > 0 until rank r is reaped.
 */
struct weft_test_job {
    int nranks;
    weft_unique_id_t id;          /* what every rank was given */
    struct weft_uid uid;          /* the same, parsed: root address, secret, job */
    pid_t pid[WEFT_TEST_MAX_RANKS];
    int wstatus[WEFT_TEST_MAX_RANKS]; /* waitpid status once reaped */
    bool reaped[WEFT_TEST_MAX_RANKS];
    bool hung[WEFT_TEST_MAX_RANKS];   /* killed at the deadline */
    bool quiet;                       /* wait prints nothing (tests of the harness) */
};

/* Environment every job needs: loopback only (WEFT_SOCKET_IFNAME=lo).
 * Parameters are read once per process, so a test that wants other values
 * (WEFT_TIMEOUT_MS...) sets them before its first weft call; the harness
 * calls this before it makes the id. */
void weft_test_env(void);

/* Makes the id here, forks nranks children running init + body + destroy,
 * then drops this process's copy of the root listener (rank 0's child
 * inherited it).  Returns 0, or -1 with a message on stderr. */
int weft_test_job_start(struct weft_test_job *job, int nranks, weft_test_body_t body, void *arg);
/* Same, but each child runs proc(rank, nranks, &id, arg) and exits with
 * its return value. */
int weft_test_job_start_proc(struct weft_test_job *job, int nranks, weft_test_proc_t proc,
                             void *arg);
/* Waits up to timeout_s for every child; at the deadline kills the rest
 * with SIGKILL.  Prints one line per failed rank (exit code, signal or
 * "hung") and returns 0 only if every child exited 0. */
int weft_test_job_wait(struct weft_test_job *job, int timeout_s);
/* Sends sig to rank's process if it is still running. */
void weft_test_job_signal(struct weft_test_job *job, int rank, int sig);
/* Exit code of rank (-1 if it was killed by a signal or hung). */
int weft_test_job_exit_code(const struct weft_test_job *job, int rank);

/* start + wait. */
int weft_test_run(int nranks, int timeout_s, weft_test_body_t body, void *arg);

/* In a child: init with the id, on failure print why; 0 on success.
 * With WEFT_TEST_HOSTS=K in the environment, rank r first sets WEFT_HOSTID
 * to host r*K/nranks, so one machine poses as K hosts. */
int weft_test_child_init(weft_comm_t *comm, int nranks, const weft_unique_id_t *id, int rank);

/* ---- reporting from children ----------------------------------------------- */

/* "rank R: <message>" on stderr; returns 1 so a body can `return fail(...)`. */
int weft_test_fail(int rank, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Checks a status: prints "rank R: what returned X (last error)" and
 * returns 1 unless st == want. */
int weft_test_expect_status(int rank, weft_comm_t comm, const char *what, weft_status_t st,
                            weft_status_t want);
#define WT_CHECK_OK(rank, comm, what, call)                                               \
    do {                                                                                \
        if (weft_test_expect_status((rank), (comm), (what), (call), WEFT_OK))            \
            return 1;                                                                   \
    } while (0)

/* ---- typed buffers -------------------------------------------------------- */

const char *weft_test_dtype_name(weft_dtype_t dt);
const char *weft_test_op_name(weft_op_t op);
bool weft_test_dtype_is_float(weft_dtype_t dt);
bool weft_test_dtype_is_signed(weft_dtype_t dt);
unsigned weft_test_dtype_bits(weft_dtype_t dt);

/* Stores the low bits of v (integer types wrap as two's complement); float
 * types store (double)v rounded to the type. */
void weft_test_store_int(void *buf, weft_dtype_t dt, size_t i, int64_t v);
/* Stores v rounded to the type (integers: truncated toward zero). */
void weft_test_store_f(void *buf, weft_dtype_t dt, size_t i, double v);
/* Integer element, sign- or zero-extended to 64 bits. */
int64_t weft_test_load_int(const void *buf, weft_dtype_t dt, size_t i);
/* Float element widened to double (integer types converted). */
double weft_test_load_f(const void *buf, weft_dtype_t dt, size_t i);
/* The element's bits, zero-extended. */
uint64_t weft_test_load_bits(const void *buf, weft_dtype_t dt, size_t i);
/* Element as text ("-3", "1.5 (0x3e00)"). */
const char *weft_test_format(const void *buf, weft_dtype_t dt, size_t i, char *out, size_t len);

/* Compares n elements: integers bitwise, floats by value (so +0 == -0;
 * NaN equals NaN).  Returns n when equal, else the first differing index. */
size_t weft_test_compare(const void *got, const void *want, weft_dtype_t dt, size_t n);
/* Compares and, on a difference, prints "rank R: <what> <dtype> [i]:
 * expected X, got Y (k of n differ)" and returns 1. */
int weft_test_check(int rank, const char *what, const void *got, const void *want,
                    weft_dtype_t dt, size_t n);

/* Rank r's reproducible bytes (any bit pattern, NaNs included): every
 * rank can compute every other rank's. */
void weft_test_fill_bytes(void *buf, size_t bytes, int r, uint64_t salt);

/*
 * A receive buffer with poisoned guard bytes on both sides, to catch
 * writes outside [p, p + bytes) that a sanitizer cannot see inside one
 * allocation.  Owner: the test; p = base + WEFT_TEST_GUARD.
 */
#define WEFT_TEST_GUARD 64
#define WEFT_TEST_POISON 0xa5
struct weft_test_gbuf {
    uint8_t *base, *p;
    size_t cap; /* usable bytes at p */
};
int weft_test_gbuf_alloc(struct weft_test_gbuf *g, size_t cap); /* 0 or -1 */
void weft_test_gbuf_free(struct weft_test_gbuf *g);
/* Poisons the guards and p[0, bytes). */
void weft_test_gbuf_poison(struct weft_test_gbuf *g, size_t bytes);
/* NULL when the guards around p[0, bytes) are intact, else what broke. */
const char *weft_test_gbuf_guard_error(const struct weft_test_gbuf *g, size_t bytes, char *msg,
                                       size_t len);
/* True when p[0, bytes) still holds the poison. */
bool weft_test_gbuf_untouched(const struct weft_test_gbuf *g, size_t bytes);

/* splitmix64: the seeded source of every test input. */
uint64_t weft_test_mix(uint64_t x);
/* FNV-1a over bytes, for cross-rank bitwise comparison. */
uint64_t weft_test_hash(const void *buf, size_t bytes);


/* ---- one rank of a collective job (test_coll, test_p2p) ----------------------- */

#define LARGE 100003u     /* allreduce, reduce, broadcast, p2p */
#define LARGE_SEG 20011u  /* per-rank count of reduce_scatter and allgather */
#define POISON WEFT_TEST_POISON
#define MAX_REPORTS 20    /* mismatch reports per rank before it goes quiet */

/* One rank's state for the whole job.  All buffers hold maxn elements of
 * 8 bytes: maxn = max(LARGE, p * LARGE_SEG). */
struct tc {
    weft_comm_t comm;
    int rank, p;
    size_t maxn;
    uint8_t *in;       /* this rank's input of the current (dtype, op) */
    uint8_t *want;     /* expected reduction of the current (dtype, op) */
    uint8_t *snd;      /* send buffer */
    struct weft_test_gbuf rcvg; /* receive buffer with guards, maxn * 8 */
    uint8_t *rcv;      /* rcvg.p */
    int fails;         /* checks that failed (the job goes on) */
    long calls;        /* weft calls made, for the summary line */
    int reports;
};

/* Allocates c's buffers for rank of a p-rank job on comm; 0, or 1 after
 * printing why.  tc_free releases them either way. */
int tc_alloc(struct tc *c, weft_comm_t comm, int rank, int p);
void tc_free(struct tc *c);
/* The job's verdict for this rank: 0 when no check failed, else 1 after
 * saying how many did. */
int tc_verdict(const struct tc *c);

/* Counts a failed check; prints it unless this rank reported too much. */
void report(struct tc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Poisons the receive buffer (and its guards) for bytes. */
void poison_rcv(struct tc *c, size_t bytes);
/* Reports a write outside the first bytes of the receive buffer. */
void check_guards(struct tc *c, const char *what, size_t bytes);
/* Reports the first of n elements that differ (floats by value). */
void check_vals(struct tc *c, const char *what, const void *got, const void *want,
                weft_dtype_t dt, size_t n);
/* Reports the first element whose bytes differ. */
void check_bytes(struct tc *c, const char *what, const uint8_t *got, const uint8_t *want,
                 size_t bytes, size_t esize);

/* A collective that returns an error ends the job for this rank: the
 * communicator may be broken and the ranks would drift apart. */
#define CALL(c, what, call)                                                                   \
    do {                                                                                      \
        weft_status_t st_ = (call);                                                           \
        (c)->calls++;                                                                         \
        if (st_ != WEFT_OK) {                                                                 \
            weft_test_fail((c)->rank, "%s returned %s: %s", (what), weft_status_string(st_),   \
                           weft_last_error((c)->comm));                                        \
            return -1;                                                                        \
        }                                                                                     \
    } while (0)

#endif /* WEFT_TEST_HARNESS_H */
