/*
 * harness.c - forked multi-process jobs with a deadline, the typed buffer
 * helpers the collective tests check results with, and the per-rank state
 * and checks shared by test_coll and test_p2p.
 */
#include "harness.h"

#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "reduce.h"

void weft_test_env(void)
{
    /* Only loopback addresses are allowed on the test machines. */
    setenv("WEFT_SOCKET_IFNAME", "lo", 1);
}

/* ---- jobs ------------------------------------------------------------------ */

struct body_ctx {
    weft_test_body_t body;
    void *arg;
};

int weft_test_child_init(weft_comm_t *comm, int nranks, const weft_unique_id_t *id, int rank)
{
    /* WEFT_TEST_HOSTS=K: the ranks pose as K hosts of consecutive ranks
     * (shm inside each, tcp between them). */
    const char *hosts = getenv("WEFT_TEST_HOSTS");
    if (hosts && atoi(hosts) > 1) {
        char id_[32];
        snprintf(id_, sizeof(id_), "test-host-%d", rank * atoi(hosts) / nranks);
        setenv("WEFT_HOSTID", id_, 1);
    }
    weft_status_t st = weft_comm_init(comm, nranks, *id, rank);
    if (st != WEFT_OK) {
        weft_test_fail(rank, "weft_comm_init(%d ranks) returned %s: %s", nranks,
                       weft_status_string(st), weft_last_error(NULL));
        return 1;
    }
    return 0;
}

/* The child side of weft_test_job_start: init, body, destroy. */
static int run_body(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    struct body_ctx *bc = arg;
    weft_comm_t comm = NULL;
    if (weft_test_child_init(&comm, nranks, id, rank))
        return 2;
    int rc = bc->body(comm, rank, nranks, bc->arg);
    weft_status_t st = weft_comm_destroy(comm);
    if (st != WEFT_OK) {
        weft_test_fail(rank, "weft_comm_destroy returned %s: %s", weft_status_string(st),
                       weft_last_error(NULL));
        if (rc == 0)
            rc = 3;
    }
    return rc;
}

static int job_fork(struct weft_test_job *job, int nranks, weft_test_proc_t proc, void *arg)
{
    memset(job, 0, sizeof(*job));
    if (nranks < 1 || nranks > WEFT_TEST_MAX_RANKS) {
        fprintf(stderr, "harness: %d ranks is out of range (1..%d)\n", nranks,
                WEFT_TEST_MAX_RANKS);
        return -1;
    }
    job->nranks = nranks;
    weft_test_env();
    weft_status_t st = weft_get_unique_id(&job->id);
    if (st == WEFT_OK)
        st = weft_uid_parse(&job->id, &job->uid);
    if (st != WEFT_OK) {
        fprintf(stderr, "harness: weft_get_unique_id: %s: %s\n", weft_status_string(st),
                weft_last_error(NULL));
        return -1;
    }
    fflush(NULL); /* or buffered output would be printed once per child */
    pid_t parent = getpid();
    for (int r = 0; r < nranks; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            fprintf(stderr, "harness: fork for rank %d: %s\n", r, strerror(errno));
            for (int k = 0; k < r; k++)
                kill(job->pid[k], SIGKILL);
            for (int k = 0; k < r; k++)
                waitpid(job->pid[k], NULL, 0);
            memset(job->pid, 0, sizeof(job->pid));
            return -1;
        }
        if (pid == 0) {
            /* If the test process dies (Criterion's own timeout kills it),
             * its ranks must not live on. */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent)
                _exit(125);
            /* Only rank 0 may keep the root listener: a copy held open
             * anywhere else would queue strangers that nobody refuses. */
            if (r != 0) {
                int lfd = weft_uid_take_listener(job->uid.job);
                if (lfd >= 0)
                    close(lfd);
            }
            int rc = proc(r, nranks, &job->id, arg);
            fflush(NULL);
            _exit(rc);
        }
        job->pid[r] = pid;
    }
    /* Rank 0's child took its own copy of the listener through fork. */
    int lfd = weft_uid_take_listener(job->uid.job);
    if (lfd >= 0)
        close(lfd);
    return 0;
}

int weft_test_job_start(struct weft_test_job *job, int nranks, weft_test_body_t body, void *arg)
{
    /* The children read bc after fork, from their own copy of this frame. */
    struct body_ctx bc = {body, arg};
    return job_fork(job, nranks, run_body, &bc);
}

int weft_test_job_start_proc(struct weft_test_job *job, int nranks, weft_test_proc_t proc,
                             void *arg)
{
    return job_fork(job, nranks, proc, arg);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int weft_test_job_wait(struct weft_test_job *job, int timeout_s)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_s * 1000;
    int left = 0;
    for (;;) {
        left = 0;
        for (int r = 0; r < job->nranks; r++) {
            if (job->reaped[r] || job->pid[r] <= 0)
                continue;
            int ws;
            pid_t p = waitpid(job->pid[r], &ws, WNOHANG);
            if (p == job->pid[r] || (p < 0 && errno == ECHILD)) {
                job->wstatus[r] = p == job->pid[r] ? ws : (255 << 8);
                job->reaped[r] = true;
            } else {
                left++;
            }
        }
        if (left == 0 || now_ms() >= deadline)
            break;
        usleep(2000);
    }
    if (left > 0) {
        char names[512];
        size_t o = 0;
        for (int r = 0; r < job->nranks; r++)
            if (!job->reaped[r] && job->pid[r] > 0) {
                kill(job->pid[r], SIGKILL);
                o += (size_t)snprintf(names + o, sizeof(names) - o, "%s%d", o ? ", " : "", r);
                if (o >= sizeof(names))
                    o = sizeof(names) - 1;
            }
        if (!job->quiet)
            fprintf(stderr, "harness: job of %d ranks still running after %d s; killed rank%s %s\n",
                    job->nranks, timeout_s, left > 1 ? "s" : "", names);
        for (int r = 0; r < job->nranks; r++)
            if (!job->reaped[r] && job->pid[r] > 0) {
                waitpid(job->pid[r], &job->wstatus[r], 0);
                job->reaped[r] = true;
                job->hung[r] = true;
            }
    }
    int bad = 0;
    for (int r = 0; r < job->nranks; r++) {
        int ws = job->wstatus[r];
        if (job->hung[r]) {
            bad++;
        } else if (WIFSIGNALED(ws)) {
            if (!job->quiet)
                fprintf(stderr, "harness: rank %d (pid %d) died of signal %d (%s)\n", r,
                        (int)job->pid[r], WTERMSIG(ws), strsignal(WTERMSIG(ws)));
            bad++;
        } else if (WIFEXITED(ws) && WEXITSTATUS(ws) != 0) {
            if (!job->quiet)
                fprintf(stderr, "harness: rank %d (pid %d) exited with %d\n", r,
                        (int)job->pid[r], WEXITSTATUS(ws));
            bad++;
        }
        job->pid[r] = 0;
    }
    return bad == 0 ? 0 : -1;
}

void weft_test_job_signal(struct weft_test_job *job, int rank, int sig)
{
    if (rank >= 0 && rank < job->nranks && job->pid[rank] > 0 && !job->reaped[rank])
        kill(job->pid[rank], sig);
}

int weft_test_job_exit_code(const struct weft_test_job *job, int rank)
{
    if (rank < 0 || rank >= job->nranks || !job->reaped[rank] || job->hung[rank])
        return -1;
    return WIFEXITED(job->wstatus[rank]) ? WEXITSTATUS(job->wstatus[rank]) : -1;
}

int weft_test_run(int nranks, int timeout_s, weft_test_body_t body, void *arg)
{
    struct weft_test_job job;
    if (weft_test_job_start(&job, nranks, body, arg) != 0)
        return -1;
    return weft_test_job_wait(&job, timeout_s);
}

/* ---- reporting ---------------------------------------------------------------- */

static int vfail(int rank, const char *fmt, va_list ap)
{
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "rank %d: %s\n", rank, msg);
    return 1;
}

int weft_test_fail(int rank, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfail(rank, fmt, ap);
    va_end(ap);
    return 1;
}

int weft_test_expect_status(int rank, weft_comm_t comm, const char *what, weft_status_t st,
                            weft_status_t want)
{
    if (st == want)
        return 0;
    return weft_test_fail(rank, "%s: expected %s, got %s (last error: %s)", what,
                          weft_status_string(want), weft_status_string(st),
                          weft_last_error(comm));
}

/* ---- typed buffers ------------------------------------------------------------- */

/* The library's names, and a loud one for a value it does not know. */
const char *weft_test_dtype_name(weft_dtype_t dt)
{
    const char *name = weft_dtype_name(dt);
    return strcmp(name, "?") != 0 ? name : "bad-dtype";
}

const char *weft_test_op_name(weft_op_t op)
{
    const char *name = weft_op_name(op);
    return strcmp(name, "?") != 0 ? name : "bad-op";
}

bool weft_test_dtype_is_float(weft_dtype_t dt)
{
    return dt == WEFT_FLOAT16 || dt == WEFT_FLOAT32 || dt == WEFT_FLOAT64 || dt == WEFT_BFLOAT16;
}

bool weft_test_dtype_is_signed(weft_dtype_t dt)
{
    return dt == WEFT_INT8 || dt == WEFT_INT32 || dt == WEFT_INT64;
}

unsigned weft_test_dtype_bits(weft_dtype_t dt)
{
    return (unsigned)weft_dtype_size(dt) * 8;
}

void weft_test_store_int(void *buf, weft_dtype_t dt, size_t i, int64_t v)
{
    uint64_t u = (uint64_t)v;
    switch (dt) {
    case WEFT_INT8:
    case WEFT_UINT8: ((uint8_t *)buf)[i] = (uint8_t)u; break;
    case WEFT_INT32:
    case WEFT_UINT32: ((uint32_t *)buf)[i] = (uint32_t)u; break;
    case WEFT_INT64:
    case WEFT_UINT64: ((uint64_t *)buf)[i] = u; break;
    default: weft_test_store_f(buf, dt, i, (double)v); break;
    }
}

void weft_test_store_f(void *buf, weft_dtype_t dt, size_t i, double v)
{
    switch (dt) {
    case WEFT_FLOAT16: ((uint16_t *)buf)[i] = weft_float_to_half((float)v); break;
    case WEFT_BFLOAT16: ((uint16_t *)buf)[i] = weft_float_to_bf16((float)v); break;
    case WEFT_FLOAT32: ((float *)buf)[i] = (float)v; break;
    case WEFT_FLOAT64: ((double *)buf)[i] = v; break;
    case WEFT_UINT8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case WEFT_UINT32: ((uint32_t *)buf)[i] = (uint32_t)v; break;
    case WEFT_UINT64: ((uint64_t *)buf)[i] = (uint64_t)v; break;
    default: weft_test_store_int(buf, dt, i, (int64_t)v); break;
    }
}

int64_t weft_test_load_int(const void *buf, weft_dtype_t dt, size_t i)
{
    switch (dt) {
    case WEFT_INT8: return ((const int8_t *)buf)[i];
    case WEFT_UINT8: return ((const uint8_t *)buf)[i];
    case WEFT_INT32: return ((const int32_t *)buf)[i];
    case WEFT_UINT32: return ((const uint32_t *)buf)[i];
    case WEFT_INT64: return ((const int64_t *)buf)[i];
    case WEFT_UINT64: return (int64_t)((const uint64_t *)buf)[i];
    default: return (int64_t)weft_test_load_f(buf, dt, i);
    }
}

double weft_test_load_f(const void *buf, weft_dtype_t dt, size_t i)
{
    switch (dt) {
    case WEFT_FLOAT16: return weft_half_to_float(((const uint16_t *)buf)[i]);
    case WEFT_BFLOAT16: return weft_bf16_to_float(((const uint16_t *)buf)[i]);
    case WEFT_FLOAT32: return ((const float *)buf)[i];
    case WEFT_FLOAT64: return ((const double *)buf)[i];
    case WEFT_UINT64: return (double)((const uint64_t *)buf)[i];
    default: return (double)weft_test_load_int(buf, dt, i);
    }
}

uint64_t weft_test_load_bits(const void *buf, weft_dtype_t dt, size_t i)
{
    switch (weft_dtype_size(dt)) {
    case 1: return ((const uint8_t *)buf)[i];
    case 2: return ((const uint16_t *)buf)[i];
    case 4: return ((const uint32_t *)buf)[i];
    default: return ((const uint64_t *)buf)[i];
    }
}

const char *weft_test_format(const void *buf, weft_dtype_t dt, size_t i, char *out, size_t len)
{
    unsigned hexw = (unsigned)weft_dtype_size(dt) * 2;
    unsigned long long bits = (unsigned long long)weft_test_load_bits(buf, dt, i);
    if (weft_test_dtype_is_float(dt))
        snprintf(out, len, "%.17g (0x%0*llx)", weft_test_load_f(buf, dt, i), (int)hexw, bits);
    else if (dt == WEFT_UINT64 || dt == WEFT_UINT32 || dt == WEFT_UINT8)
        snprintf(out, len, "%llu (0x%0*llx)", bits, (int)hexw, bits);
    else
        snprintf(out, len, "%lld (0x%0*llx)", (long long)weft_test_load_int(buf, dt, i),
                 (int)hexw, bits);
    return out;
}

static bool elem_equal(const void *got, const void *want, weft_dtype_t dt, size_t i)
{
    if (!weft_test_dtype_is_float(dt))
        return weft_test_load_bits(got, dt, i) == weft_test_load_bits(want, dt, i);
    double g = weft_test_load_f(got, dt, i), w = weft_test_load_f(want, dt, i);
    return g == w || (isnan(g) && isnan(w));
}

size_t weft_test_compare(const void *got, const void *want, weft_dtype_t dt, size_t n)
{
    /* Fast path: identical bytes are equal under either rule. */
    if (n == 0 || memcmp(got, want, n * weft_dtype_size(dt)) == 0)
        return n;
    for (size_t i = 0; i < n; i++)
        if (!elem_equal(got, want, dt, i))
            return i;
    return n;
}

int weft_test_check(int rank, const char *what, const void *got, const void *want,
                    weft_dtype_t dt, size_t n)
{
    size_t i = weft_test_compare(got, want, dt, n);
    if (i == n)
        return 0;
    size_t bad = 0;
    for (size_t k = i; k < n; k++)
        bad += !elem_equal(got, want, dt, k);
    char g[64], w[64];
    return weft_test_fail(rank, "%s %s [%zu]: expected %s, got %s (%zu of %zu elements differ)",
                          what, weft_test_dtype_name(dt), i,
                          weft_test_format(want, dt, i, w, sizeof(w)),
                          weft_test_format(got, dt, i, g, sizeof(g)), bad, n);
}

void weft_test_fill_bytes(void *buf, size_t bytes, int r, uint64_t salt)
{
    uint8_t *b = buf;
    for (size_t i = 0; i < bytes; i += 8) {
        uint64_t h = weft_test_mix(salt ^ ((uint64_t)r << 48) ^ i);
        memcpy(b + i, &h, bytes - i < 8 ? bytes - i : 8);
    }
}

int weft_test_gbuf_alloc(struct weft_test_gbuf *g, size_t cap)
{
    g->base = malloc(cap + 2 * WEFT_TEST_GUARD);
    g->p = g->base ? g->base + WEFT_TEST_GUARD : NULL;
    g->cap = g->base ? cap : 0;
    return g->base ? 0 : -1;
}

void weft_test_gbuf_free(struct weft_test_gbuf *g)
{
    free(g->base);
    g->base = g->p = NULL;
    g->cap = 0;
}

void weft_test_gbuf_poison(struct weft_test_gbuf *g, size_t bytes)
{
    memset(g->base, WEFT_TEST_POISON, WEFT_TEST_GUARD + bytes + WEFT_TEST_GUARD);
}

const char *weft_test_gbuf_guard_error(const struct weft_test_gbuf *g, size_t bytes, char *msg,
                                       size_t len)
{
    for (size_t i = 0; i < WEFT_TEST_GUARD; i++)
        if (g->base[i] != WEFT_TEST_POISON) {
            snprintf(msg, len, "wrote %zu bytes before recvbuf", WEFT_TEST_GUARD - i);
            return msg;
        }
    for (size_t i = 0; i < WEFT_TEST_GUARD; i++)
        if (g->p[bytes + i] != WEFT_TEST_POISON) {
            snprintf(msg, len, "wrote past the end of recvbuf (byte %zu after it)", i);
            return msg;
        }
    return NULL;
}

bool weft_test_gbuf_untouched(const struct weft_test_gbuf *g, size_t bytes)
{
    for (size_t i = 0; i < bytes; i++)
        if (g->p[i] != WEFT_TEST_POISON)
            return false;
    return true;
}

uint64_t weft_test_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t weft_test_hash(const void *buf, size_t bytes)
{
    const uint8_t *p = buf;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < bytes; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

/* ---- one rank of a collective job ------------------------------------------- */

int tc_alloc(struct tc *c, weft_comm_t comm, int rank, int p)
{
    *c = (struct tc){.comm = comm, .rank = rank, .p = p};
    c->maxn = WEFT_MAX((size_t)LARGE, (size_t)p * LARGE_SEG);
    size_t bytes = c->maxn * 8;
    c->in = malloc(bytes);
    c->want = malloc(bytes);
    c->snd = malloc(bytes);
    weft_test_gbuf_alloc(&c->rcvg, bytes);
    if (!c->in || !c->want || !c->snd || !c->rcvg.base) {
        weft_test_fail(rank, "out of memory");
        return 1;
    }
    c->rcv = c->rcvg.p;
    return 0;
}

void tc_free(struct tc *c)
{
    free(c->in);
    free(c->want);
    free(c->snd);
    weft_test_gbuf_free(&c->rcvg);
}

int tc_verdict(const struct tc *c)
{
    int rc = 1;
    if (c->fails > 0)
        weft_test_fail(c->rank, "%d checks failed", c->fails);
    else
        rc = 0;
    if (c->rank == 0 && getenv("WEFT_TEST_VERBOSE"))
        fprintf(stderr, "rank 0: %d ranks: %ld calls, %d failed checks\n", c->p, c->calls,
                c->fails);
    return rc;
}

void report(struct tc *c, const char *fmt, ...)
{
    c->fails++;
    if (c->reports++ >= MAX_REPORTS)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfail(c->rank, fmt, ap);
    va_end(ap);
}

void poison_rcv(struct tc *c, size_t bytes)
{
    weft_test_gbuf_poison(&c->rcvg, bytes);
}

void check_guards(struct tc *c, const char *what, size_t bytes)
{
    char msg[128];
    if (weft_test_gbuf_guard_error(&c->rcvg, bytes, msg, sizeof(msg)))
        report(c, "%s: %s", what, msg);
}

void check_vals(struct tc *c, const char *what, const void *got, const void *want,
                weft_dtype_t dt, size_t n)
{
    size_t i = weft_test_compare(got, want, dt, n);
    if (i == n)
        return;
    char g[64], w[64];
    report(c, "%s %s [%zu of %zu]: expected %s, got %s", what, weft_test_dtype_name(dt), i, n,
           weft_test_format(want, dt, i, w, sizeof(w)), weft_test_format(got, dt, i, g, sizeof(g)));
}

void check_bytes(struct tc *c, const char *what, const uint8_t *got, const uint8_t *want,
                 size_t bytes, size_t esize)
{
    if (memcmp(got, want, bytes) == 0)
        return;
    size_t i = 0;
    while (got[i] == want[i])
        i++;
    report(c, "%s: element %zu differs (byte %zu: expected 0x%02x, got 0x%02x)", what, i / esize,
           i, want[i], got[i]);
}
