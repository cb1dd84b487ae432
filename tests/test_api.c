/*
 * test_api.c - the public API's argument checking: every invalid argument
 * returns WEFT_ERR_INVALID_ARG, leaves a message that names the function
 * in weft_last_error, and changes nothing (receive buffers keep their
 * bytes).  Plus the small tables (status strings, dtype sizes), rank/size
 * and weft_comm_init_env's environment parsing.  Mostly 1-rank
 * communicators in the test process; a forked 2-rank job where a peer is
 * needed.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define N 16 /* elements of the valid base call */

/* The fourteen operations, called through one signature. */
enum fn {
    F_ALLREDUCE, F_IALLREDUCE, F_REDUCE_SCATTER, F_IREDUCE_SCATTER, F_ALLGATHER, F_IALLGATHER,
    F_BROADCAST, F_IBROADCAST, F_REDUCE, F_IREDUCE, F_SEND, F_ISEND, F_RECV, F_IRECV, F_COUNT
};
static const char *const fn_name[F_COUNT] = {
    "weft_allreduce", "weft_iallreduce", "weft_reduce_scatter", "weft_ireduce_scatter",
    "weft_allgather", "weft_iallgather", "weft_broadcast",      "weft_ibroadcast",
    "weft_reduce",    "weft_ireduce",    "weft_send",           "weft_isend",
    "weft_recv",      "weft_irecv"};

static bool fn_reduces(enum fn f)
{
    return f <= F_IREDUCE_SCATTER || f == F_REDUCE || f == F_IREDUCE;
}
static bool fn_rooted(enum fn f) { return f >= F_BROADCAST && f <= F_IREDUCE; }
static bool fn_p2p(enum fn f) { return f >= F_SEND; }

struct call {
    const void *s;
    void *r;
    size_t n;
    weft_dtype_t dt;
    weft_op_t op;
    int root; /* root, or peer for send/recv */
    weft_comm_t comm;
};

/* Calls f; a successful non-blocking call is waited for here. */
static weft_status_t invoke(enum fn f, const struct call *a)
{
    weft_request_t q = NULL;
    weft_request_t *rq = &q;
    weft_status_t st;
    switch (f) {
    case F_ALLREDUCE: return weft_allreduce(a->s, a->r, a->n, a->dt, a->op, a->comm);
    case F_IALLREDUCE: st = weft_iallreduce(a->s, a->r, a->n, a->dt, a->op, a->comm, rq); break;
    case F_REDUCE_SCATTER: return weft_reduce_scatter(a->s, a->r, a->n, a->dt, a->op, a->comm);
    case F_IREDUCE_SCATTER:
        st = weft_ireduce_scatter(a->s, a->r, a->n, a->dt, a->op, a->comm, rq);
        break;
    case F_ALLGATHER: return weft_allgather(a->s, a->r, a->n, a->dt, a->comm);
    case F_IALLGATHER: st = weft_iallgather(a->s, a->r, a->n, a->dt, a->comm, rq); break;
    case F_BROADCAST: return weft_broadcast(a->s, a->r, a->n, a->dt, a->root, a->comm);
    case F_IBROADCAST: st = weft_ibroadcast(a->s, a->r, a->n, a->dt, a->root, a->comm, rq); break;
    case F_REDUCE: return weft_reduce(a->s, a->r, a->n, a->dt, a->op, a->root, a->comm);
    case F_IREDUCE:
        st = weft_ireduce(a->s, a->r, a->n, a->dt, a->op, a->root, a->comm, rq);
        break;
    case F_SEND: return weft_send(a->s, a->n, a->dt, a->root, a->comm);
    case F_ISEND: st = weft_isend(a->s, a->n, a->dt, a->root, a->comm, rq); break;
    case F_RECV: return weft_recv(a->r, a->n, a->dt, a->root, a->comm);
    case F_IRECV: st = weft_irecv(a->r, a->n, a->dt, a->root, a->comm, rq); break;
    default: return WEFT_ERR_INTERNAL;
    }
    if (st == WEFT_OK)
        st = q == NULL ? WEFT_ERR_INTERNAL : weft_wait(q);
    return st;
}

/* msg names fn as a whole word ("weft_reduce" is not in "weft_reduce_scatter"). */
static bool names_fn(const char *msg, const char *fn)
{
    size_t len = strlen(fn);
    for (const char *p = strstr(msg, fn); p; p = strstr(p + 1, fn)) {
        char after = p[len];
        bool word_end = !(after == '_' || (after >= 'a' && after <= 'z') ||
                          (after >= '0' && after <= '9'));
        bool word_start = p == msg || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z'));
        if (word_end && word_start)
            return true;
    }
    return false;
}

/* 0 when st is INVALID_ARG and weft_last_error(comm) names fn; else the
 * reason in why. */
static int invalid_ok(weft_comm_t comm, const char *fn, const char *what, weft_status_t st,
                      char *why, size_t len)
{
    const char *msg = weft_last_error(comm);
    if (st != WEFT_ERR_INVALID_ARG)
        snprintf(why, len, "%s (%s): expected WEFT_ERR_INVALID_ARG, got %s (last error: %s)", fn,
                 what, weft_status_string(st), msg ? msg : "(NULL)");
    else if (msg == NULL || msg[0] == '\0')
        snprintf(why, len, "%s (%s): INVALID_ARG with an empty last error", fn, what);
    else if (!names_fn(msg, fn))
        snprintf(why, len, "%s (%s): last error does not name the function: \"%s\"", fn, what,
                 msg);
    else
        return 0;
    return 1;
}

#define EXPECT_INVALID(comm, fn, what, call)                                                   \
    do {                                                                                       \
        char why_[768];                                                                        \
        weft_status_t st_ = (call);                                                            \
        cr_expect(!invalid_ok((comm), (fn), (what), st_, why_, sizeof(why_)), "%s", why_);     \
    } while (0)

/* Sentinel-filled buffers: a failed call must leave recv as it was. */
static uint8_t sbuf[1024], rbuf[1024], rbuf_copy[1024];

static void fill_bufs(void)
{
    for (size_t i = 0; i < sizeof(sbuf); i++) {
        sbuf[i] = (uint8_t)(i * 7 + 1);
        rbuf[i] = (uint8_t)(0xa5 ^ i);
    }
    memcpy(rbuf_copy, rbuf, sizeof(rbuf));
}

static struct call base_call(weft_comm_t comm)
{
    return (struct call){.s = sbuf, .r = rbuf, .n = N, .dt = WEFT_INT32, .op = WEFT_SUM,
                         .root = 0, .comm = comm};
}

/* Runs f with a and expects the invalid-argument contract. */
static void expect_invalid_call(enum fn f, const struct call *a, const char *what)
{
    fill_bufs();
    char why[768];
    weft_status_t st = invoke(f, a);
    cr_expect(!invalid_ok(a->comm, fn_name[f], what, st, why, sizeof(why)), "%s", why);
    cr_expect(memcmp(rbuf, rbuf_copy, sizeof(rbuf)) == 0, "%s (%s): recvbuf was modified",
              fn_name[f], what);
}

/* A 1-rank communicator in this process. */
static weft_comm_t one_rank(void)
{
    weft_test_env();
    weft_unique_id_t id;
    struct weft_uid uid;
    cr_assert_eq(weft_get_unique_id(&id), WEFT_OK, "%s", weft_last_error(NULL));
    cr_assert_eq(weft_uid_parse(&id, &uid), WEFT_OK);
    weft_comm_t comm = NULL;
    cr_assert_eq(weft_comm_init(&comm, 1, id, 0), WEFT_OK, "%s", weft_last_error(NULL));
    cr_assert_not_null(comm);
    int lfd = weft_uid_take_listener(uid.job); /* a 1-rank job never listens */
    if (lfd >= 0)
        close(lfd);
    return comm;
}

/* ---- invalid communicators ------------------------------------------------- */

Test(api, null_comm, .timeout = 10)
{
    for (int f = 0; f < F_COUNT; f++) {
        struct call a = base_call(NULL);
        expect_invalid_call((enum fn)f, &a, "NULL comm");
    }
    int v;
    EXPECT_INVALID(NULL, "weft_comm_rank", "NULL comm", weft_comm_rank(NULL, &v));
    EXPECT_INVALID(NULL, "weft_comm_size", "NULL comm", weft_comm_size(NULL, &v));
    EXPECT_INVALID(NULL, "weft_comm_get_error", "NULL comm", weft_comm_get_error(NULL));
    cr_expect_eq(weft_comm_destroy(NULL), WEFT_OK);
    cr_expect_eq(weft_comm_abort(NULL), WEFT_OK);
    cr_expect_not_null(weft_last_error(NULL));
}

Test(api, destroyed_comm, .timeout = 30)
{
    weft_comm_t comm = one_rank();
    cr_assert_eq(weft_comm_destroy(comm), WEFT_OK);
    /* The handle is dangling: the library must refuse it without using it. */
    for (int f = 0; f < F_COUNT; f++) {
        struct call a = base_call(comm);
        expect_invalid_call((enum fn)f, &a, "destroyed comm");
    }
    int v = -7;
    EXPECT_INVALID(comm, "weft_comm_rank", "destroyed comm", weft_comm_rank(comm, &v));
    EXPECT_INVALID(comm, "weft_comm_size", "destroyed comm", weft_comm_size(comm, &v));
    cr_expect_eq(v, -7, "a failed weft_comm_rank/size wrote its output");
    EXPECT_INVALID(comm, "weft_comm_destroy", "destroyed twice", weft_comm_destroy(comm));
    EXPECT_INVALID(comm, "weft_comm_abort", "destroyed comm", weft_comm_abort(comm));
    cr_expect_not_null(weft_last_error(comm));
}

/* ---- buffers, dtypes, ops, roots, counts on one rank ------------------------ */

Test(api, null_buffers, .timeout = 30)
{
    weft_comm_t comm = one_rank();
    for (int f = 0; f < F_COUNT; f++) {
        /* (point to point: peer 0 is this rank itself) */
        struct call a = base_call(comm);
        a.s = NULL;
        if (f != F_RECV && f != F_IRECV)
            expect_invalid_call((enum fn)f, &a, "NULL sendbuf, count 16");
        a = base_call(comm);
        a.r = NULL;
        if (f != F_SEND && f != F_ISEND)
            expect_invalid_call((enum fn)f, &a, "NULL recvbuf, count 16");
        if (fn_p2p((enum fn)f))
            continue; /* alone, a send to oneself waits for its receive: below */
        /* count 0 needs no memory at all */
        a = base_call(comm);
        a.s = NULL;
        a.r = NULL;
        a.n = 0;
        weft_status_t st = invoke((enum fn)f, &a);
        cr_expect_eq(st, WEFT_OK, "%s with NULL buffers and count 0: %s (%s)", fn_name[f],
                     weft_status_string(st), weft_last_error(comm));
    }
    /* A send to oneself and its receive, count 0 and NULL, in one group. */
    cr_expect_eq(weft_group_start(), WEFT_OK);
    cr_expect_eq(weft_send(NULL, 0, WEFT_INT32, 0, comm), WEFT_OK, "%s", weft_last_error(comm));
    cr_expect_eq(weft_recv(NULL, 0, WEFT_INT32, 0, comm), WEFT_OK, "%s", weft_last_error(comm));
    cr_expect_eq(weft_group_end(), WEFT_OK, "%s", weft_last_error(comm));
    cr_expect_eq(weft_comm_destroy(comm), WEFT_OK);
}

/* Registration: bad arguments refused, handles looked up (another
 * communicator's, a deregistered one and a made-up one are refused without
 * being read), and collectives on registered memory still right. */
Test(api, mem_register, .timeout = 30)
{
    weft_comm_t a = one_rank(), b = one_rank();
    float buf[64] = {0};
    void *h = (void *)1, *hb = NULL;
    cr_expect_eq(weft_mem_register(NULL, buf, sizeof(buf), &h), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_mem_register(a, NULL, 16, &h), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_mem_register(a, buf, sizeof(buf), NULL), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_mem_register(a, buf, sizeof(buf), &h), WEFT_OK, "%s", weft_last_error(a));
    cr_assert_eq(weft_mem_register(b, buf, 0, &hb), WEFT_OK, "%s", weft_last_error(b));
    cr_expect_eq(weft_allreduce(buf, buf, 64, WEFT_FLOAT32, WEFT_SUM, a), WEFT_OK);
    cr_expect_eq(weft_mem_deregister(b, h), WEFT_ERR_INVALID_ARG, "another comm's handle");
    cr_expect(strstr(weft_last_error(b), "not a registration"), "%s", weft_last_error(b));
    cr_expect_eq(weft_mem_deregister(a, buf), WEFT_ERR_INVALID_ARG, "a made-up handle");
    cr_expect_eq(weft_mem_deregister(a, NULL), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_mem_deregister(a, h), WEFT_OK, "%s", weft_last_error(a));
    cr_expect_eq(weft_mem_deregister(a, h), WEFT_ERR_INVALID_ARG, "deregistered twice");
    cr_expect_eq(weft_mem_deregister(b, hb), WEFT_OK);
    /* A registration still held at destroy is released with the comm. */
    cr_assert_eq(weft_mem_register(a, buf, sizeof(buf), &h), WEFT_OK);
    cr_expect_eq(weft_comm_destroy(a), WEFT_OK);
    cr_expect_eq(weft_comm_destroy(b), WEFT_OK);
}

Test(api, bad_dtype_op_root_count, .timeout = 30)
{
    weft_comm_t comm = one_rank();
    static const int bad_dtypes[] = {-1, 10, 1000};
    static const int bad_ops[] = {-1, 5};
    static const int bad_roots[] = {-1, 1};
    char what[64];
    for (int f = 0; f < F_COUNT; f++) {
        for (size_t i = 0; i < WEFT_ARRAY_SIZE(bad_dtypes); i++) {
            struct call a = base_call(comm);
            a.dt = (weft_dtype_t)bad_dtypes[i];
            snprintf(what, sizeof(what), "dtype %d", bad_dtypes[i]);
            expect_invalid_call((enum fn)f, &a, what);
        }
        for (size_t i = 0; fn_reduces((enum fn)f) && i < WEFT_ARRAY_SIZE(bad_ops); i++) {
            struct call a = base_call(comm);
            a.op = (weft_op_t)bad_ops[i];
            snprintf(what, sizeof(what), "op %d", bad_ops[i]);
            expect_invalid_call((enum fn)f, &a, what);
        }
        for (size_t i = 0; (fn_rooted((enum fn)f) || fn_p2p((enum fn)f)) &&
                           i < WEFT_ARRAY_SIZE(bad_roots); i++) {
            struct call a = base_call(comm);
            a.root = bad_roots[i];
            snprintf(what, sizeof(what), "%s %d of 1 rank", fn_p2p((enum fn)f) ? "peer" : "root",
                     bad_roots[i]);
            expect_invalid_call((enum fn)f, &a, what);
        }
        static const struct { size_t n; weft_dtype_t dt; } big[] = {
            {SIZE_MAX, WEFT_INT32}, {SIZE_MAX / 2, WEFT_INT32}, {SIZE_MAX, WEFT_INT8},
            {SIZE_MAX / 16 + 1, WEFT_FLOAT64}};
        for (size_t i = 0; i < WEFT_ARRAY_SIZE(big); i++) {
            struct call a = base_call(comm);
            a.n = big[i].n;
            a.dt = big[i].dt;
            snprintf(what, sizeof(what), "count %zu of %s", big[i].n,
                     weft_test_dtype_name(big[i].dt));
            expect_invalid_call((enum fn)f, &a, what);
        }
    }
    /* None of this may have broken the communicator. */
    cr_expect_eq(weft_comm_get_error(comm), WEFT_OK);
    int32_t x = 5, y = 0;
    cr_expect_eq(weft_allreduce(&x, &y, 1, WEFT_INT32, WEFT_SUM, comm), WEFT_OK);
    cr_expect_eq(y, 5);
    cr_expect_eq(weft_comm_destroy(comm), WEFT_OK);
}

Test(api, overlapping_buffers, .timeout = 30)
{
    weft_comm_t comm = one_rank();
    int32_t *b = (int32_t *)(void *)rbuf;
    static const enum fn fs[] = {F_ALLREDUCE, F_IALLREDUCE, F_REDUCE_SCATTER, F_IREDUCE_SCATTER,
                                 F_ALLGATHER, F_IALLGATHER, F_BROADCAST, F_IBROADCAST,
                                 F_REDUCE,    F_IREDUCE};
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(fs); i++) {
        /* recv one element after send, and send one element after recv */
        for (int dir = 0; dir < 2; dir++) {
            struct call a = base_call(comm);
            a.s = dir ? b + 1 : b;
            a.r = dir ? b : b + 1;
            expect_invalid_call(fs[i], &a, dir ? "sendbuf = recvbuf + 1" : "recvbuf = sendbuf + 1");
        }
        /* Exact aliasing is in place, and fine. */
        fill_bufs();
        struct call a = base_call(comm);
        a.s = b;
        a.r = b;
        weft_status_t st = invoke(fs[i], &a);
        cr_expect_eq(st, WEFT_OK, "%s in place: %s (%s)", fn_name[fs[i]], weft_status_string(st),
                     weft_last_error(comm));
    }
    cr_expect_eq(weft_comm_destroy(comm), WEFT_OK);
}

/* ---- requests and groups ---------------------------------------------------- */

Test(api, requests_and_groups, .timeout = 30)
{
    weft_comm_t comm = one_rank();
    int done = 7;
    EXPECT_INVALID(NULL, "weft_wait", "NULL request", weft_wait(NULL));
    EXPECT_INVALID(NULL, "weft_test", "NULL request", weft_test(NULL, &done));
    cr_expect_eq(done, 7, "weft_test(NULL) wrote *done");
    EXPECT_INVALID(NULL, "weft_group_end", "without weft_group_start", weft_group_end());

    int32_t x = 3, y = 0;
    weft_request_t req = NULL;
    cr_assert_eq(weft_iallreduce(&x, &y, 1, WEFT_INT32, WEFT_SUM, comm, &req), WEFT_OK);
    /* weft_test has no comm argument: its message is the thread's. */
    EXPECT_INVALID(NULL, "weft_test", "NULL done", weft_test(req, NULL));
    cr_expect_eq(weft_wait(req), WEFT_OK, "the request must survive a refused weft_test");
    cr_expect_eq(y, 3);

    /* A NULL request pointer: the message belongs on comm, where the
     * caller of a call that has a comm looks for it. */
    static const enum fn ifs[] = {F_IALLREDUCE, F_IREDUCE_SCATTER, F_IALLGATHER, F_IBROADCAST,
                                  F_IREDUCE};
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(ifs); i++) {
        fill_bufs();
        weft_allreduce(sbuf, rbuf, N, (weft_dtype_t)77, WEFT_SUM, comm); /* an older message */
        const void *s = sbuf;
        void *r = rbuf;
        weft_status_t st = ifs[i] == F_IALLREDUCE
                               ? weft_iallreduce(s, r, N, WEFT_INT32, WEFT_SUM, comm, NULL)
                           : ifs[i] == F_IREDUCE_SCATTER
                               ? weft_ireduce_scatter(s, r, N, WEFT_INT32, WEFT_SUM, comm, NULL)
                           : ifs[i] == F_IALLGATHER
                               ? weft_iallgather(s, r, N, WEFT_INT32, comm, NULL)
                           : ifs[i] == F_IBROADCAST
                               ? weft_ibroadcast(s, r, N, WEFT_INT32, 0, comm, NULL)
                               : weft_ireduce(s, r, N, WEFT_INT32, WEFT_SUM, 0, comm, NULL);
        char why[768];
        cr_expect(!invalid_ok(comm, fn_name[ifs[i]], "NULL req", st, why, sizeof(why)), "%s",
                  why);
        cr_expect(memcmp(rbuf, rbuf_copy, sizeof(rbuf)) == 0, "%s (NULL req): recvbuf modified",
                  fn_name[ifs[i]]);
    }

    /* Groups nest; an invalid call inside one fails at once and queues nothing. */
    y = 0;
    cr_expect_eq(weft_group_start(), WEFT_OK);
    cr_expect_eq(weft_group_start(), WEFT_OK);
    EXPECT_INVALID(comm, "weft_allreduce", "dtype -1 in a group",
                   weft_allreduce(&x, &y, 1, (weft_dtype_t)-1, WEFT_SUM, comm));
    cr_expect_eq(weft_allreduce(&x, &y, 1, WEFT_INT32, WEFT_MAX, comm), WEFT_OK);
    cr_expect_eq(weft_group_end(), WEFT_OK);
    cr_expect_eq(weft_group_end(), WEFT_OK);
    cr_expect_eq(y, 3);
    EXPECT_INVALID(NULL, "weft_group_end", "one end too many", weft_group_end());
    cr_expect_eq(weft_comm_destroy(comm), WEFT_OK);
}

/* ---- init ------------------------------------------------------------------ */

Test(api, comm_init_args, .timeout = 30)
{
    weft_test_env();
    weft_unique_id_t id;
    cr_assert_eq(weft_get_unique_id(&id), WEFT_OK);
    EXPECT_INVALID(NULL, "weft_get_unique_id", "NULL id", weft_get_unique_id(NULL));
    weft_comm_t comm = (weft_comm_t)&comm; /* must not be taken for a communicator */
    EXPECT_INVALID(NULL, "weft_comm_init", "NULL comm pointer", weft_comm_init(NULL, 1, id, 0));
    EXPECT_INVALID(NULL, "weft_comm_init", "nranks 0", weft_comm_init(&comm, 0, id, 0));
    EXPECT_INVALID(NULL, "weft_comm_init", "nranks -3", weft_comm_init(&comm, -3, id, 0));
    EXPECT_INVALID(NULL, "weft_comm_init", "rank 1 of 1", weft_comm_init(&comm, 1, id, 1));
    EXPECT_INVALID(NULL, "weft_comm_init", "rank 5 of 2", weft_comm_init(&comm, 2, id, 5));
    EXPECT_INVALID(NULL, "weft_comm_init", "rank -1", weft_comm_init(&comm, 2, id, -1));
    weft_unique_id_t junk;
    memset(&junk, 0, sizeof(junk));
    EXPECT_INVALID(NULL, "weft_comm_init", "all-zero id", weft_comm_init(&comm, 1, junk, 0));
    for (size_t i = 0; i < sizeof(junk.internal); i++)
        junk.internal[i] = (char)weft_test_mix(i);
    EXPECT_INVALID(NULL, "weft_comm_init", "random id", weft_comm_init(&comm, 1, junk, 0));
    cr_expect(comm == NULL || comm == (weft_comm_t)&comm, "a failed init returned a handle");
    /* The good id still works after all that. */
    comm = NULL;
    cr_assert_eq(weft_comm_init(&comm, 1, id, 0), WEFT_OK, "%s", weft_last_error(NULL));
    cr_expect_eq(weft_comm_destroy(comm), WEFT_OK);
}

static void clear_launcher_env(void)
{
    static const char *const vars[] = {
        "WEFT_RANK", "WEFT_NRANKS", "WEFT_UNIQUE_ID", "WEFT_ROOT", "WEFT_SECRET",
        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE",
        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_ID", "SLURM_JOB_ID",
        "WEFT_ROOT_FD"};
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(vars); i++)
        unsetenv(vars[i]);
}

/* Sets "NAME=value" pairs (NULL-terminated) on a clean environment and
 * expects weft_comm_init_env to refuse them, naming `mention`. */
static void env_refused(const char *mention, ...)
{
    clear_launcher_env();
    va_list ap;
    va_start(ap, mention);
    char desc[256] = "";
    for (const char *kv = va_arg(ap, const char *); kv; kv = va_arg(ap, const char *)) {
        char name[64];
        const char *eq = strchr(kv, '=');
        snprintf(name, sizeof(name), "%.*s", (int)(eq - kv), kv);
        setenv(name, eq + 1, 1);
        strncat(desc, kv, sizeof(desc) - strlen(desc) - 2);
        strcat(desc, " ");
    }
    va_end(ap);
    weft_comm_t comm = NULL;
    weft_status_t st = weft_comm_init_env(&comm);
    const char *msg = weft_last_error(NULL);
    cr_expect_eq(st, WEFT_ERR_INVALID_ARG, "weft_comm_init_env with [%s]: got %s (%s)", desc,
                 weft_status_string(st), msg);
    cr_expect(msg[0] != '\0' && strstr(msg, mention) != NULL,
              "weft_comm_init_env with [%s]: message should mention %s: \"%s\"", desc, mention,
              msg);
    cr_expect_null(comm);
    if (st == WEFT_OK)
        weft_comm_destroy(comm);
}

Test(api, comm_init_env, .timeout = 30)
{
    weft_test_env();
    EXPECT_INVALID(NULL, "weft_comm_init_env", "NULL comm pointer", weft_comm_init_env(NULL));
    env_refused("weft_comm_init_env", NULL);
    env_refused("WEFT_RANK", "WEFT_RANK=abc", "WEFT_NRANKS=2", NULL);
    env_refused("WEFT_RANK", "WEFT_RANK=-1", "WEFT_NRANKS=2", NULL);
    env_refused("WEFT_RANK", "WEFT_RANK=1x", "WEFT_NRANKS=2", NULL);
    env_refused("WEFT_NRANKS", "WEFT_RANK=0", "WEFT_NRANKS=two", NULL);
    env_refused("weft_comm_init_env", "WEFT_RANK=0", NULL);
    env_refused("WEFT_RANK", "WEFT_RANK=2", "WEFT_NRANKS=2", NULL);
    env_refused("weft_comm_init_env", "WEFT_RANK=0", "WEFT_NRANKS=1", NULL);
    env_refused("WEFT_UNIQUE_ID", "WEFT_RANK=0", "WEFT_NRANKS=1", "WEFT_UNIQUE_ID=zz", NULL);
    env_refused("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_RANK=x", "OMPI_COMM_WORLD_SIZE=2",
                NULL);
    /* A batch script holds the job's SLURM_PROCID/NTASKS but is no step. */
    env_refused("srun", "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_JOB_ID=7",
                "WEFT_ROOT=127.0.0.1:1", NULL);
    char hex[WEFT_UID_HEX_LEN];
    memset(hex, '0', sizeof(hex) - 1);
    hex[sizeof(hex) - 1] = '\0';
    char kv[WEFT_UID_HEX_LEN + 32];
    snprintf(kv, sizeof(kv), "WEFT_UNIQUE_ID=%s", hex);
    env_refused("unique id", "WEFT_RANK=0", "WEFT_NRANKS=1", kv, NULL);

    /* And the good case: an id in hex, rank 0 of 1. */
    clear_launcher_env();
    weft_unique_id_t id;
    cr_assert_eq(weft_get_unique_id(&id), WEFT_OK);
    weft_uid_to_hex(&id, hex);
    setenv("WEFT_UNIQUE_ID", hex, 1);
    setenv("WEFT_RANK", "0", 1);
    setenv("WEFT_NRANKS", "1", 1);
    weft_comm_t comm = NULL;
    cr_assert_eq(weft_comm_init_env(&comm), WEFT_OK, "%s", weft_last_error(NULL));
    int r = -1, n = -1;
    cr_expect_eq(weft_comm_rank(comm, &r), WEFT_OK);
    cr_expect_eq(weft_comm_size(comm, &n), WEFT_OK);
    cr_expect_eq(r, 0);
    cr_expect_eq(n, 1);
    cr_expect_eq(weft_comm_destroy(comm), WEFT_OK);
    clear_launcher_env();
}

/* ---- tables and accessors --------------------------------------------------- */

Test(api, status_strings, .timeout = 10)
{
    static const weft_status_t all[] = {
        WEFT_OK, WEFT_INPROGRESS, WEFT_ERR_INVALID_ARG, WEFT_ERR_NO_MEMORY, WEFT_ERR_SYSTEM,
        WEFT_ERR_REMOTE, WEFT_ERR_TIMEOUT, WEFT_ERR_ABORTED, WEFT_ERR_UNSUPPORTED,
        WEFT_ERR_INTERNAL, WEFT_ERR_MISMATCH};
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(all); i++) {
        const char *a = weft_status_string(all[i]);
        cr_assert_not_null(a, "weft_status_string(%d) is NULL", (int)all[i]);
        cr_expect(a[0] != '\0', "weft_status_string(%d) is empty", (int)all[i]);
        for (size_t k = 0; k < i; k++)
            cr_expect(strcmp(a, weft_status_string(all[k])) != 0,
                      "statuses %d and %d share the string \"%s\"", (int)all[i], (int)all[k], a);
    }
    cr_expect_not_null(weft_status_string((weft_status_t)-42));
    cr_expect_not_null(weft_status_string((weft_status_t)77));
}

Test(api, dtype_sizes, .timeout = 10)
{
    static const size_t sizes[WEFT_NUM_DTYPES] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
    for (int d = 0; d < WEFT_NUM_DTYPES; d++)
        cr_expect_eq(weft_dtype_size((weft_dtype_t)d), sizes[d], "weft_dtype_size(%s)",
                     weft_test_dtype_name((weft_dtype_t)d));
    cr_expect_eq(weft_dtype_size((weft_dtype_t)-1), 0);
    cr_expect_eq(weft_dtype_size(WEFT_NUM_DTYPES), 0);
    cr_expect_eq(weft_dtype_size((weft_dtype_t)1000), 0);
}

Test(api, rank_and_size, .timeout = 30)
{
    weft_comm_t comm = one_rank();
    int r = -1, n = -1;
    cr_expect_eq(weft_comm_rank(comm, &r), WEFT_OK);
    cr_expect_eq(weft_comm_size(comm, &n), WEFT_OK);
    cr_expect_eq(r, 0);
    cr_expect_eq(n, 1);
    EXPECT_INVALID(comm, "weft_comm_rank", "NULL rank", weft_comm_rank(comm, NULL));
    EXPECT_INVALID(comm, "weft_comm_size", "NULL nranks", weft_comm_size(comm, NULL));
    cr_expect_eq(weft_comm_get_error(comm), WEFT_OK);
    cr_expect_eq(weft_comm_destroy(comm), WEFT_OK);
}

/* ---- two ranks: peers, non-root NULL buffers, NCCL in-place offsets ---------- */

struct two_state {
    weft_comm_t comm;
    int rank, fails;
};

static void two_expect_invalid(struct two_state *t, enum fn f, const struct call *a,
                               const char *what)
{
    fill_bufs();
    char why[768];
    weft_status_t st = invoke(f, a);
    if (invalid_ok(a->comm, fn_name[f], what, st, why, sizeof(why)))
        t->fails += weft_test_fail(t->rank, "%s", why);
    if (memcmp(rbuf, rbuf_copy, sizeof(rbuf)) != 0)
        t->fails += weft_test_fail(t->rank, "%s (%s): recvbuf was modified", fn_name[f], what);
}

static int two_body(weft_comm_t comm, int rank, int p, void *arg)
{
    struct two_state t = {comm, rank, 0};
    int peer = 1 - rank, v = -1;
    WT_CHECK_OK(rank, comm, "weft_comm_rank", weft_comm_rank(comm, &v));
    if (v != rank)
        t.fails += weft_test_fail(rank, "weft_comm_rank: expected %d, got %d", rank, v);
    WT_CHECK_OK(rank, comm, "weft_comm_size", weft_comm_size(comm, &v));
    if (v != 2)
        t.fails += weft_test_fail(rank, "weft_comm_size: expected 2, got %d", v);

    /* Local refusals: none of these may reach the wire. */
    for (int f = F_SEND; f < F_COUNT; f++) {
        static const int bad_peers[] = {-1, 2, 1000};
        char what[64];
        for (size_t i = 0; i < WEFT_ARRAY_SIZE(bad_peers); i++) {
            struct call a = base_call(comm);
            a.root = bad_peers[i];
            snprintf(what, sizeof(what), "peer %d of 2", bad_peers[i]);
            two_expect_invalid(&t, (enum fn)f, &a, what);
        }
        struct call a = base_call(comm);
        a.root = peer;
        if (f == F_SEND || f == F_ISEND)
            a.s = NULL;
        else
            a.r = NULL;
        two_expect_invalid(&t, (enum fn)f, &a, "NULL buf, count 16");
        a = base_call(comm);
        a.root = peer;
        a.dt = (weft_dtype_t)10;
        two_expect_invalid(&t, (enum fn)f, &a, "dtype 10");
        a.dt = WEFT_INT32;
        a.n = SIZE_MAX;
        two_expect_invalid(&t, (enum fn)f, &a, "count SIZE_MAX");
    }
    /* To oneself: a grouped pair, and a non-blocking pair. */
    int32_t self_s[N], self_r[N];
    for (int i = 0; i < N; i++)
        self_s[i] = rank * 50 + i, self_r[i] = -1;
    WT_CHECK_OK(rank, comm, "weft_group_start", weft_group_start());
    WT_CHECK_OK(rank, comm, "weft_send to self", weft_send(self_s, N, WEFT_INT32, rank, comm));
    WT_CHECK_OK(rank, comm, "weft_recv from self", weft_recv(self_r, N, WEFT_INT32, rank, comm));
    WT_CHECK_OK(rank, comm, "weft_group_end (self)", weft_group_end());
    if (memcmp(self_s, self_r, sizeof(self_s)) != 0)
        t.fails += weft_test_fail(rank, "grouped send/recv to self: data differs");
    weft_request_t rq, sq;
    memset(self_r, 0xff, sizeof(self_r));
    WT_CHECK_OK(rank, comm, "weft_irecv from self",
                weft_irecv(self_r, N, WEFT_INT32, rank, comm, &rq));
    WT_CHECK_OK(rank, comm, "weft_isend to self", weft_isend(self_s, N, WEFT_INT32, rank, comm, &sq));
    WT_CHECK_OK(rank, comm, "weft_wait (isend to self)", weft_wait(sq));
    WT_CHECK_OK(rank, comm, "weft_wait (irecv from self)", weft_wait(rq));
    if (memcmp(self_s, self_r, sizeof(self_s)) != 0)
        t.fails += weft_test_fail(rank, "isend/irecv to self: data differs");
    int32_t *b = (int32_t *)(void *)rbuf;
    /* NCCL's in-place offsets, shifted by one element: overlap, refused. */
    struct call a = base_call(comm);
    a.s = b;
    a.r = b + rank * N + 1;
    two_expect_invalid(&t, F_REDUCE_SCATTER, &a, "recvbuf = sendbuf + rank*count + 1");
    a = base_call(comm);
    a.r = b;
    a.s = b + rank * N + 1;
    two_expect_invalid(&t, F_ALLGATHER, &a, "sendbuf = recvbuf + rank*count + 1");

    /* The refusals left the two ranks in step: valid calls still match. */
    int32_t x[N], y[N * 2];
    for (int i = 0; i < N; i++)
        x[i] = rank * 100 + i;
    WT_CHECK_OK(rank, comm, "allreduce after refusals",
                weft_allreduce(x, y, N, WEFT_INT32, WEFT_SUM, comm));
    for (int i = 0; i < N; i++)
        if (y[i] != 100 + 2 * i)
            t.fails += weft_test_fail(rank, "allreduce [%d]: expected %d, got %d", i, 100 + 2 * i,
                                      y[i]);
    /* NULL recvbuf on the non-root of reduce, NULL sendbuf on the
     * non-root of broadcast: both allowed. */
    for (int root = 0; root < 2; root++) {
        y[0] = -1;
        WT_CHECK_OK(rank, comm, "reduce with NULL recvbuf on the non-root",
                    weft_reduce(x, rank == root ? y : NULL, N, WEFT_INT32, WEFT_SUM, root, comm));
        if (rank == root && y[0] != 100)
            t.fails += weft_test_fail(rank, "reduce root %d: expected 100, got %d", root, y[0]);
        for (int i = 0; i < N; i++)
            y[i] = rank == root ? 7 * i : -1;
        WT_CHECK_OK(rank, comm, "broadcast with NULL sendbuf on the non-root",
                    weft_broadcast(rank == root ? y : NULL, y, N, WEFT_INT32, root, comm));
        for (int i = 0; i < N; i++)
            if (y[i] != 7 * i) {
                t.fails += weft_test_fail(rank, "broadcast root %d [%d]: expected %d, got %d",
                                          root, i, 7 * i, y[i]);
                break;
            }
    }
    /* Exact NCCL offsets are accepted as in place. */
    for (int i = 0; i < 2 * N; i++)
        y[i] = rank + i;
    WT_CHECK_OK(rank, comm, "reduce_scatter in place",
                weft_reduce_scatter(y, y + rank * N, N, WEFT_INT32, WEFT_SUM, comm));
    for (int i = 0; i < N; i++)
        if (y[rank * N + i] != 1 + 2 * (rank * N + i))
            t.fails += weft_test_fail(rank, "reduce_scatter in place [%d]: expected %d, got %d",
                                      i, 1 + 2 * (rank * N + i), y[rank * N + i]);
    for (int i = 0; i < N; i++)
        y[rank * N + i] = rank * 1000 + i;
    WT_CHECK_OK(rank, comm, "allgather in place",
                weft_allgather(y + rank * N, y, N, WEFT_INT32, comm));
    for (int i = 0; i < 2 * N; i++)
        if (y[i] != (i / N) * 1000 + i % N)
            t.fails += weft_test_fail(rank, "allgather in place [%d]: expected %d, got %d", i,
                                      (i / N) * 1000 + i % N, y[i]);
    return t.fails ? 1 : 0;
}

Test(api, two_ranks, .timeout = 60)
{
    cr_assert_eq(weft_test_run(2, 50, two_body, NULL), 0,
                 "the 2-rank argument job failed (see the rank messages above)");
}

/* ---- ranks that disagree about the job ----------------------------------------- */

/* What each forked process passes to weft_comm_init, and what the root
 * (rank 0) must answer. */
struct disagreement {
    int nranks[3], rank[3];
    const char *root_mentions; /* text the root's message must contain */
};

static int disagree_proc(int idx, int nprocs, const weft_unique_id_t *id, void *arg)
{
    const struct disagreement *d = arg;
    weft_comm_t comm = NULL;
    uint64_t t0 = weft_now_ns();
    weft_status_t st = weft_comm_init(&comm, d->nranks[idx], *id, d->rank[idx]);
    double secs = (double)(weft_now_ns() - t0) / 1e9;
    const char *msg = weft_last_error(NULL);
    (void)nprocs;
    if (st == WEFT_OK) {
        weft_comm_destroy(comm);
        return weft_test_fail(idx, "init as rank %d of %d succeeded in a job that disagrees",
                              d->rank[idx], d->nranks[idx]);
    }
    int fails = 0;
    if (secs > 8.0) /* WEFT_TIMEOUT_MS is 5000; the root knows at once */
        fails += weft_test_fail(idx, "init took %.1f s to fail", secs);
    if (idx == 0 && (st != WEFT_ERR_INVALID_ARG || strstr(msg, d->root_mentions) == NULL))
        fails += weft_test_fail(idx, "root: expected WEFT_ERR_INVALID_ARG mentioning \"%s\", "
                                     "got %s: \"%s\"",
                                d->root_mentions, weft_status_string(st), msg);
    if (msg[0] == '\0')
        fails += weft_test_fail(idx, "init failed (%s) without a message", weft_status_string(st));
    return fails ? 1 : 0;
}

static void run_disagreement(int nprocs, struct disagreement *d)
{
    setenv("WEFT_TIMEOUT_MS", "5000", 1); /* before any weft call: read once */
    setenv("WEFT_DEBUG", "NONE", 0);
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, nprocs, disagree_proc, d), 0);
    cr_assert_eq(weft_test_job_wait(&job, 20), 0, "see the rank messages above");
}

Test(api, nranks_mismatch, .timeout = 30)
{
    struct disagreement d = {.nranks = {2, 3}, .rank = {0, 1}, .root_mentions = "nranks 3"};
    run_disagreement(2, &d);
}

Test(api, duplicate_rank, .timeout = 30)
{
    struct disagreement d = {.nranks = {3, 3, 3}, .rank = {0, 1, 1},
                             .root_mentions = "two processes joined as rank 1"};
    run_disagreement(3, &d);
}

/* ---- the harness itself: a hang or a crash must not pass ----------------------- */

static int harness_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    (void)nranks;
    (void)id;
    const char *mode = arg;
    if (rank == 1 && strcmp(mode, "hang") == 0)
        for (;;)
            pause();
    if (rank == 1 && strcmp(mode, "exit") == 0)
        return 7;
    if (rank == 1 && strcmp(mode, "stop") == 0)
        sleep(30); /* the test kills it long before */
    return 0;
}

Test(harness, reports_hangs_exits_and_signals, .timeout = 30)
{
    struct weft_test_job job;
    uint64_t t0 = weft_now_ns();
    cr_assert_eq(weft_test_job_start_proc(&job, 3, harness_proc, "hang"), 0);
    job.quiet = true;
    cr_expect_neq(weft_test_job_wait(&job, 1), 0, "a hung rank passed");
    cr_expect(job.hung[1] && !job.hung[0] && !job.hung[2], "the wrong ranks were called hung");
    cr_expect_lt((double)(weft_now_ns() - t0) / 1e9, 5.0, "the deadline was not kept");

    cr_assert_eq(weft_test_job_start_proc(&job, 3, harness_proc, "exit"), 0);
    job.quiet = true;
    cr_expect_neq(weft_test_job_wait(&job, 10), 0, "a rank exiting 7 passed");
    cr_expect_eq(weft_test_job_exit_code(&job, 1), 7);
    cr_expect_eq(weft_test_job_exit_code(&job, 0), 0);

    cr_assert_eq(weft_test_job_start_proc(&job, 2, harness_proc, "stop"), 0);
    job.quiet = true;
    weft_test_job_signal(&job, 1, SIGKILL);
    cr_expect_neq(weft_test_job_wait(&job, 10), 0, "a killed rank passed");
    cr_expect_eq(weft_test_job_exit_code(&job, 1), -1);

    cr_assert_eq(weft_test_job_start_proc(&job, 4, harness_proc, "none"), 0);
    cr_expect_eq(weft_test_job_wait(&job, 10), 0, "a job of healthy ranks failed");
}

/* weft_comm_abort from another thread ends a blocking allreduce that waits
 * for a peer who never calls it, fails the request in flight, returns at
 * once, and the handle is refused afterwards. */
static weft_comm_t abort_target;
static void *abort_later(void *arg)
{
    usleep(300 * 1000);
    *(weft_status_t *)arg = weft_comm_abort(abort_target);
    return NULL;
}

static int abort_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    if (weft_test_child_init(&abort_target, nranks, id, rank) != 0)
        return 1;
    if (rank == 1) {
        sleep(2); /* never joins the collective */
        return 0;
    }
    static float a[1 << 18], b[1 << 18];
    weft_status_t aborted = WEFT_ERR_INTERNAL;
    pthread_t th;
    if (pthread_create(&th, NULL, abort_later, &aborted) != 0)
        return weft_test_fail(rank, "pthread_create failed");
    weft_request_t req;
    int fails = 0;
    fails += weft_test_expect_status(rank, abort_target, "iallreduce",
                                     weft_iallreduce(a, b, 1 << 18, WEFT_FLOAT32, WEFT_SUM,
                                                     abort_target, &req), WEFT_OK);
    uint64_t t0 = weft_now_ns();
    weft_status_t st = weft_allreduce(a, b, 1 << 18, WEFT_FLOAT32, WEFT_SUM, abort_target);
    double ms = (double)(weft_now_ns() - t0) / 1e6;
    pthread_join(th, NULL);
    if (st != WEFT_ERR_ABORTED)
        fails += weft_test_fail(rank, "blocking allreduce returned %s, expected aborted",
                                weft_status_string(st));
    if (ms > 1500)
        fails += weft_test_fail(rank, "allreduce took %.0f ms to notice the abort", ms);
    if (aborted != WEFT_OK)
        fails += weft_test_fail(rank, "weft_comm_abort returned %s", weft_status_string(aborted));
    if (weft_wait(req) != WEFT_ERR_INVALID_ARG)
        fails += weft_test_fail(rank, "weft_wait on a request of an aborted comm did not refuse");
    if (weft_allreduce(a, b, 1, WEFT_FLOAT32, WEFT_SUM, abort_target) != WEFT_ERR_INVALID_ARG)
        fails += weft_test_fail(rank, "an aborted communicator was accepted");
    return fails != 0;
}

Test(api, abort_from_another_thread, .timeout = 30)
{
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 2, abort_proc, NULL), 0);
    cr_assert_eq(weft_test_job_wait(&job, 20), 0, "abort did not end the operations cleanly");
}
