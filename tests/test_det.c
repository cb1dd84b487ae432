/*
 * test_det.c - deterministic mode over real processes.  With
 * WEFT_DETERMINISTIC=1, or weft_comm_set_deterministic, every rank's
 * allreduce, reduce_scatter and reduce output must be, bit for bit, the
 * left fold in rank order ((x0 op x1) op x2) ... op x(p-1) that this file
 * computes with weft's own reduce kernel, whatever WEFT_ALGO allows and
 * whatever the chunk size; one allreduce of A||B must give the bits of two.
 *
 * The inputs span 2^24 in magnitude with full mantissas, so float sums
 * round differently in every order: order_matters proves that other
 * orders give other bits on these very inputs, and the API job proves that
 * weft itself does when the mode is off.  Otherwise a match would prove
 * nothing.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h" /* comm->deterministic: what the environment set */
#include "harness.h"
#include "reduce.h"

static const weft_dtype_t dts[] = {WEFT_FLOAT32, WEFT_BFLOAT16, WEFT_FLOAT64};
static const weft_op_t ops[] = {WEFT_SUM, WEFT_AVG};

#define BIG 150001u /* float32: 2 chunks of the default 512 KiB, ~150 of 4 KiB */
#define SEG 5003u   /* reduce_scatter per-rank count */
#define FUSE_A 7777u
#define FUSE_B 30011u

/* Rank r's input at global index j: a random sign and 52-bit mantissa
 * times 2^e, e in [-12, 12]: 10-40% of the sums of 3-5 ranks round
 * differently in another order (order_matters). */
static void put_wild(void *buf, size_t k, weft_dtype_t dt, int r, size_t j)
{
    uint64_t h = weft_test_mix(0xde7e4ull ^ ((uint64_t)dt << 56) ^ ((uint64_t)r << 40) ^ j);
    uint64_t g = weft_test_mix(h);
    double m = 1 + (double)(h >> 12) * ldexp(1, -52);
    int e = (int)(g % 25) - 12;
    weft_test_store_f(buf, dt, k, ldexp(g >> 63 ? -m : m, e));
}

static void make_wild(void *buf, weft_dtype_t dt, int r, size_t first, size_t n)
{
    for (size_t k = 0; k < n; k++)
        put_wild(buf, k, dt, r, first + k);
}

/* out[k], k < n: the inputs at first + k of ranks order[0], ..., order[p-1]
 * combined left to right by weft's kernel; AVG divides at the last
 * step, as the FINAL reduction does.  tmp holds n elements. */
static void fold(void *out, void *tmp, weft_dtype_t dt, weft_op_t op, int p, const int *order,
                 size_t first, size_t n)
{
    make_wild(out, dt, order[0], first, n);
    for (int i = 1; i < p; i++) {
        make_wild(tmp, dt, order[i], first, n);
        weft_reduce_local(out, out, tmp, n, dt, op, i == p - 1 && op == WEFT_AVG ? p : 0);
    }
}

static void rank_order(int p, int *order)
{
    for (int r = 0; r < p; r++)
        order[r] = r;
}

/* Elements of a and b (n each) whose bits differ. */
static size_t bits_differ(const void *a, const void *b, weft_dtype_t dt, size_t n)
{
    size_t d = 0;
    for (size_t k = 0; k < n; k++)
        d += weft_test_load_bits(a, dt, k) != weft_test_load_bits(b, dt, k);
    return d;
}

/* ---- the inputs make the order visible ------------------------------------------ */

/* Reversed and rotated (the ring's reduce-scatter starts a block at
 * another rank) orders give other bits for many elements. */
Test(det, order_matters)
{
    size_t n = 4001;
    void *a = malloc(n * 8), *b = malloc(n * 8), *t = malloc(n * 8);
    cr_assert(a && b && t);
    for (int p = 3; p <= 5; p++) {
        int fwd[8], rev[8], rot[8];
        for (int r = 0; r < p; r++)
            fwd[r] = r, rev[r] = p - 1 - r, rot[r] = (r + 1) % p;
        for (size_t d = 0; d < WEFT_ARRAY_SIZE(dts); d++) {
            for (size_t o = 0; o < WEFT_ARRAY_SIZE(ops); o++) {
                fold(a, t, dts[d], ops[o], p, fwd, 0, n);
                fold(b, t, dts[d], ops[o], p, rev, 0, n);
                size_t drev = bits_differ(a, b, dts[d], n);
                fold(b, t, dts[d], ops[o], p, rot, 0, n);
                size_t drot = bits_differ(a, b, dts[d], n);
                cr_assert(drev > n / 20 && drot > n / 20,
                          "p=%d %s %s: only %zu (reversed) and %zu (rotated) of %zu elements "
                          "depend on the order", p, weft_test_dtype_name(dts[d]),
                          weft_test_op_name(ops[o]), drev, drot, n);
            }
        }
    }
    free(a);
    free(b);
    free(t);
}

/* ---- one rank of a job ---------------------------------------------------------------- */

struct det_job {
    const char *algo;  /* WEFT_ALGO; NULL: unset */
    const char *chunk; /* WEFT_CHUNK_SIZE; NULL: the default */
    bool env;          /* WEFT_DETERMINISTIC=1; else the API turns the mode on */
};

struct dr {
    weft_comm_t comm;
    int rank, p;
    uint8_t *in, *snd, *rcv, *want, *tmp, *sep; /* big enough for every call */
    int fails;
};

static int dfail(struct dr *c, const char *what, const void *got, const void *want,
                 weft_dtype_t dt, size_t n)
{
    size_t k = 0;
    while (k < n && weft_test_load_bits(got, dt, k) == weft_test_load_bits(want, dt, k))
        k++;
    if (k == n)
        return 0;
    char g[64], w[64];
    if (c->fails++ < 10)
        weft_test_fail(c->rank, "%s [%zu]: got %s, the left fold is %s (%zu of %zu differ)",
                       what, k, weft_test_format(got, dt, k, g, sizeof(g)),
                       weft_test_format(want, dt, k, w, sizeof(w)), bits_differ(got, want, dt, n),
                       n);
    return 1;
}

/* One case: c->want gets the left fold, in rank order, of the n inputs
 * from element first on; c->in this rank's first nin inputs. */
static void det_case(struct dr *c, weft_dtype_t dt, weft_op_t op, size_t first, size_t n,
                     size_t nin)
{
    int order[8];
    rank_order(c->p, order);
    fold(c->want, c->tmp, dt, op, c->p, order, first, n);
    make_wild(c->in, dt, c->rank, 0, nin);
}

#define DCALL(c, what, call)                                                                   \
    do {                                                                                       \
        weft_status_t st_ = (call);                                                            \
        if (st_ != WEFT_OK)                                                                    \
            return weft_test_fail((c)->rank, "%s returned %s: %s", (what),                     \
                                  weft_status_string(st_), weft_last_error((c)->comm)),        \
                   -1;                                                                         \
    } while (0)

static int det_allreduce(struct dr *c, weft_dtype_t dt, weft_op_t op)
{
    size_t es = weft_dtype_size(dt), p = (size_t)c->p;
    size_t counts[] = {0, 1, p - 1, p + 1, FUSE_B, BIG};
    char what[128];
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(counts); i++) {
        size_t n = counts[i];
        det_case(c, dt, op, 0, n, n);
        for (int inplace = 0; inplace < 2; inplace++) {
            snprintf(what, sizeof(what), "allreduce n=%zu %s %s%s", n, weft_test_dtype_name(dt),
                     weft_test_op_name(op), inplace ? " in place" : "");
            memcpy(c->snd, c->in, n * es);
            memset(c->rcv, 0xa5, n * es);
            DCALL(c, what, weft_allreduce(c->snd, inplace ? c->snd : c->rcv, n, dt, op, c->comm));
            dfail(c, what, inplace ? c->snd : c->rcv, c->want, dt, n);
        }
    }
    /* Fused: A and B reduced apart, then A||B in one call. */
    size_t na = FUSE_A, nb = FUSE_B;
    det_case(c, dt, op, 0, na + nb, na + nb);
    snprintf(what, sizeof(what), "allreduce of A and B apart, %s %s", weft_test_dtype_name(dt),
             weft_test_op_name(op));
    DCALL(c, what, weft_allreduce(c->in, c->sep, na, dt, op, c->comm));
    DCALL(c, what, weft_allreduce(c->in + na * es, c->sep + na * es, nb, dt, op, c->comm));
    dfail(c, what, c->sep, c->want, dt, na + nb);
    snprintf(what, sizeof(what), "allreduce of A||B fused, %s %s", weft_test_dtype_name(dt),
             weft_test_op_name(op));
    DCALL(c, what, weft_allreduce(c->in, c->rcv, na + nb, dt, op, c->comm));
    if (memcmp(c->rcv, c->sep, (na + nb) * es) != 0 && c->fails++ < 10)
        weft_test_fail(c->rank, "%s: %zu elements differ from two calls", what,
                       bits_differ(c->rcv, c->sep, dt, na + nb));
    return 0;
}

static int det_reduce_scatter(struct dr *c, weft_dtype_t dt, weft_op_t op)
{
    size_t es = weft_dtype_size(dt), p = (size_t)c->p;
    size_t counts[] = {0, 1, p + 1, SEG};
    char what[128];
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(counts); i++) {
        size_t n = counts[i], mine = (size_t)c->rank * n;
        det_case(c, dt, op, mine, n, n * p); /* my block only */
        for (int inplace = 0; inplace < 2; inplace++) {
            snprintf(what, sizeof(what), "reduce_scatter recvcount=%zu %s %s%s", n,
                     weft_test_dtype_name(dt), weft_test_op_name(op), inplace ? " in place" : "");
            memcpy(c->snd, c->in, n * p * es);
            uint8_t *out = inplace ? c->snd + mine * es : c->rcv;
            DCALL(c, what, weft_reduce_scatter(c->snd, out, n, dt, op, c->comm));
            dfail(c, what, out, c->want, dt, n);
        }
    }
    return 0;
}

static int det_reduce(struct dr *c, weft_dtype_t dt, weft_op_t op)
{
    size_t es = weft_dtype_size(dt);
    size_t counts[] = {1, (size_t)c->p + 1, FUSE_B};
    char what[128];
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(counts); i++) {
        size_t n = counts[i];
        det_case(c, dt, op, 0, n, n);
        for (int root = 0; root < c->p; root++) {
            int inplace = (root + (int)i) % 2;
            snprintf(what, sizeof(what), "reduce root=%d n=%zu %s %s%s", root, n,
                     weft_test_dtype_name(dt), weft_test_op_name(op), inplace ? " in place" : "");
            memcpy(c->snd, c->in, n * es);
            uint8_t *out = inplace ? c->snd : c->rcv;
            DCALL(c, what, weft_reduce(c->snd, out, n, dt, op, root, c->comm));
            if (c->rank == root)
                dfail(c, what, out, c->want, dt, n);
        }
    }
    return 0;
}

static int det_all(struct dr *c)
{
    for (size_t d = 0; d < WEFT_ARRAY_SIZE(dts); d++)
        for (size_t o = 0; o < WEFT_ARRAY_SIZE(ops); o++)
            if (det_allreduce(c, dts[d], ops[o]) || det_reduce_scatter(c, dts[d], ops[o]) ||
                det_reduce(c, dts[d], ops[o]))
                return -1;
    return 0;
}

/* Mode off: weft's own order differs from the left fold somewhere (the
 * ring starts block b's sum at rank b+1), so the checks above can fail. */
static int det_off_differs(struct dr *c)
{
    size_t n = FUSE_B;
    det_case(c, WEFT_FLOAT32, WEFT_SUM, 0, n, n);
    DCALL(c, "allreduce, mode off", weft_allreduce(c->in, c->rcv, n, WEFT_FLOAT32, WEFT_SUM,
                                                    c->comm));
    if (bits_differ(c->rcv, c->want, WEFT_FLOAT32, n) == 0)
        return weft_test_fail(c->rank, "with the mode off the allreduce gave the left fold "
                              "anyway: this test could not tell the modes apart"), -1;
    return 0;
}

/* A communicator split from one in deterministic mode is in it too, and
 * its order is its own rank order: key p - rank reverses the ranks. */
static int det_split(struct dr *c)
{
    weft_comm_t child = NULL;
    DCALL(c, "weft_comm_split", weft_comm_split(c->comm, 0, c->p - c->rank, &child));
    int order[8];
    for (int r = 0; r < c->p; r++)
        order[r] = c->p - 1 - r; /* child rank r is parent rank p-1-r */
    size_t n = FUSE_B;
    fold(c->want, c->tmp, WEFT_FLOAT32, WEFT_SUM, c->p, order, 0, n);
    make_wild(c->in, WEFT_FLOAT32, c->rank, 0, n);
    weft_status_t st = weft_allreduce(c->in, c->rcv, n, WEFT_FLOAT32, WEFT_SUM, child);
    weft_comm_destroy(child);
    if (st != WEFT_OK)
        return weft_test_fail(c->rank, "allreduce on the split: %s", weft_status_string(st)), -1;
    dfail(c, "allreduce on a split communicator (reversed ranks)", c->rcv, c->want,
          WEFT_FLOAT32, n);
    return 0;
}

/* The API: bad arguments change nothing; off, on, off again. */
static int det_api(struct dr *c)
{
    if (weft_comm_set_deterministic(NULL, 1) != WEFT_ERR_INVALID_ARG ||
        weft_comm_set_deterministic(c->comm, 2) != WEFT_ERR_INVALID_ARG ||
        atomic_load(&c->comm->deterministic) != 0)
        return weft_test_fail(c->rank, "weft_comm_set_deterministic took a bad argument"), -1;
    if (det_off_differs(c))
        return -1;
    DCALL(c, "weft_comm_set_deterministic(1)", weft_comm_set_deterministic(c->comm, 1));
    if (det_all(c) || det_split(c))
        return -1;
    DCALL(c, "weft_comm_set_deterministic(0)", weft_comm_set_deterministic(c->comm, 0));
    return det_off_differs(c);
}

static int det_body(weft_comm_t comm, int rank, int p, void *arg)
{
    const struct det_job *jb = arg;
    struct dr c = {.comm = comm, .rank = rank, .p = p};
    size_t cap = (size_t)8 * WEFT_MAX(BIG, WEFT_MAX(FUSE_A + FUSE_B, SEG * (size_t)p));
    int rc = 1;
    c.in = malloc(cap), c.snd = malloc(cap), c.rcv = malloc(cap);
    c.want = malloc(cap), c.tmp = malloc(cap), c.sep = malloc(cap);
    if (!c.in || !c.snd || !c.rcv || !c.want || !c.tmp || !c.sep) {
        weft_test_fail(rank, "out of memory");
        goto out;
    }
    /* The parent's environment took. */
    const char *algo = weft_param_str("WEFT_ALGO");
    if (strcmp(algo, jb->algo ? jb->algo : "") != 0 ||
        weft_param_int("WEFT_CHUNK_SIZE") != (jb->chunk ? atoll(jb->chunk) : 524288) ||
        atomic_load(&comm->deterministic) != jb->env) {
        weft_test_fail(rank, "WEFT_ALGO '%s', WEFT_CHUNK_SIZE %lld, deterministic %d: not what "
                       "the job set", algo, (long long)weft_param_int("WEFT_CHUNK_SIZE"),
                       atomic_load(&comm->deterministic));
        goto out;
    }
    if (jb->env ? det_all(&c) : det_api(&c))
        goto out;
    rc = c.fails != 0;
out:
    free(c.in);
    free(c.snd);
    free(c.rcv);
    free(c.want);
    free(c.tmp);
    free(c.sep);
    return rc;
}

/* ---- the jobs -------------------------------------------------------------------- */

/* Parameters are read once per process: set them, reread them here, and
 * the ranks forked next inherit them. */
static void run_det(int p, const struct det_job *jb)
{
    if (jb->algo)
        setenv("WEFT_ALGO", jb->algo, 1);
    else
        unsetenv("WEFT_ALGO");
    if (jb->chunk)
        setenv("WEFT_CHUNK_SIZE", jb->chunk, 1);
    else
        unsetenv("WEFT_CHUNK_SIZE");
    setenv("WEFT_DETERMINISTIC", jb->env ? "1" : "0", 1);
    weft_param_reload();
    int rc = weft_test_run(p, 60, det_body, (void *)jb);
    cr_assert_eq(rc, 0, "deterministic job p=%d WEFT_ALGO=%s WEFT_CHUNK_SIZE=%s %s failed (see "
                 "the rank messages above)", p, jb->algo ? jb->algo : "(unset)",
                 jb->chunk ? jb->chunk : "(default)", jb->env ? "env" : "api");
}

/* Every algorithm WEFT_ALGO can name (and the automatic choice) at the
 * default chunk, and at 4 KiB chunks the automatic choice and one forced:
 * the same bits, the left fold's.  (The mode ignores the algorithm, so the
 * full cross product would test nothing more.) */
static void every_algorithm(int p)
{
    static const struct det_job jobs[] = {
        {NULL, NULL, true},   {"ring", NULL, true},   {"rhd", NULL, true},
        {"tree", NULL, true}, {"direct", NULL, true}, {"hier", NULL, true},
        {NULL, "4096", true}, {"rhd", "4096", true},
    };
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(jobs); i++)
        run_det(p, &jobs[i]);
}

Test(det, every_algorithm_3, .timeout = 240) { every_algorithm(3); }
Test(det, every_algorithm_4, .timeout = 240) { every_algorithm(4); }
Test(det, every_algorithm_5, .timeout = 240) { every_algorithm(5); }

/* weft_comm_set_deterministic does what the variable does; the ring is
 * forced so that "off" is the ring's order. */
Test(det, api_switch, .timeout = 120)
{
    struct det_job a = {"ring", NULL, false};
    run_det(4, &a);
    struct det_job b = {"rhd", "4096", false};
    run_det(5, &b);
}

/* Ranks that disagree about the mode would combine in different orders
 * (and hang or mix data); WEFT_CHECK's fingerprint carries the mode, so
 * every rank fails the call with a message that names it. */
static int disagree_proc(int rank, int nranks, const weft_unique_id_t *id, void *arg)
{
    (void)arg;
    weft_comm_t comm = NULL;
    if (weft_test_child_init(&comm, nranks, id, rank))
        return 1;
    float x[64] = {0}, y[64];
    int rc = 0;
    weft_status_t st = weft_comm_set_deterministic(comm, rank == 1);
    if (st == WEFT_OK)
        st = weft_allreduce(x, y, 64, WEFT_FLOAT32, WEFT_SUM, comm);
    if (st != WEFT_ERR_MISMATCH || !strstr(weft_last_error(comm), "deterministic mode is off on "
                                                                  "rank 0 but on on rank 1"))
        rc = weft_test_fail(rank, "allreduce with the mode on rank 1 only returned %s (%s)",
                            weft_status_string(st), weft_last_error(comm));
    weft_comm_destroy(comm); /* reports the sticky mismatch again */
    return rc;
}

Test(det, check_reports_disagreement, .timeout = 60)
{
    setenv("WEFT_CHECK", "1", 1);
    setenv("WEFT_DEBUG", "NONE", 1);
    unsetenv("WEFT_DETERMINISTIC");
    weft_param_reload();
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, 3, disagree_proc, NULL), 0);
    cr_assert_eq(weft_test_job_wait(&job, 50), 0);
}
