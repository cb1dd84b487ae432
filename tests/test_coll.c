/*
 * test_coll.c - every collective over TCP with real processes: ranks
 * {1,2,3,4,5,7,8} x counts {0, 1, p-1, p+1, large odd} x every datatype x
 * every op, out of place and in place, checked exactly against values this
 * file computes itself; then bitwise identity across ranks for inexact
 * float sums, non-blocking requests, groups and point to point.
 *
 * Allreduce has two algorithms (ring, recursive doubling); the default
 * jobs let the cost model pick per call, and the `algo` suite runs the
 * allreduce part once more per rank count with WEFT_ALGO forcing each.
 *
 * One job per rank count runs the whole matrix (init costs too much to
 * pay per combination).  Inputs are chosen so the documented semantics
 * give one exact answer whatever the reduction order: integers wrap modulo
 * 2^bits (random bits), float sums are small integers, float products are
 * powers of two, AVG inputs sum to p*k so the average is exactly k.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/schedule.h" /* enum weft_algo */
#include "comm.h"                /* comm->algos: what WEFT_ALGO allowed */
#include "harness.h"
#include "tune.h"

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

/* ---- inputs and expected values ------------------------------------------ */

static uint64_t seed_of(weft_dtype_t dt, weft_op_t op, int r, uint64_t j)
{
    return weft_test_mix(((uint64_t)dt << 56) ^ ((uint64_t)op << 48) ^ ((uint64_t)r << 40) ^ j);
}

/* The value rank r contributes at global index j (stored into buf[k]). */
static void put_input(void *buf, size_t k, weft_dtype_t dt, weft_op_t op, int r, int p,
                      uint64_t j)
{
    uint64_t h = seed_of(dt, op, r, j);
    if (!weft_test_dtype_is_float(dt)) {
        if (op != WEFT_AVG) { /* any bits: SUM and PROD wrap, MAX/MIN compare */
            weft_test_store_int(buf, dt, k, (int64_t)h);
            return;
        }
        /* AVG: a bound that keeps the sum of up to 8 ranks in range, so
         * the exact sum is known and truncation is the only rounding. */
        unsigned bits = weft_test_dtype_bits(dt);
        if (weft_test_dtype_is_signed(dt)) {
            uint64_t bound = 1ull << (bits - 4); /* [-bound, bound) */
            weft_test_store_int(buf, dt, k, (int64_t)(h % (2 * bound)) - (int64_t)bound);
        } else {
            weft_test_store_int(buf, dt, k, (int64_t)(h % (1ull << (bits - 3))));
        }
        return;
    }
    static const double powers[8] = {1, 1, -1, 2, -2, 0.5, 1, -0.5};
    double v;
    switch (op) {
    case WEFT_SUM: v = (double)(h % 17) - 8; break;      /* partial sums stay small ints */
    case WEFT_PROD: v = powers[h % 8]; break;            /* products are powers of two */
    case WEFT_MAX:
    case WEFT_MIN: v = ((double)(h % 4001) - 2000) / 16; break; /* any value: read back */
    default: {
        /* AVG: v = k + c on every rank but the last, which gets k - (p-1)c,
         * so the sum is p*k exactly and every partial sum is a small int. */
        uint64_t g = weft_test_mix(j ^ 0x5bd1e995ull ^ ((uint64_t)dt << 32));
        double kk = (double)(g % 9) - 4, c = (double)((g >> 20) % 3) - 1;
        v = r < p - 1 ? kk + c : kk - (p - 1) * c;
        break;
    }
    }
    weft_test_store_f(buf, dt, k, v);
}

static void make_input(struct tc *c, weft_dtype_t dt, weft_op_t op, size_t n)
{
    for (size_t j = 0; j < n; j++)
        put_input(c->in, j, dt, op, c->rank, c->p, j);
}

/* want[j] for j < n: the reduction of every rank's put_input(j). */
static void make_expected(struct tc *c, weft_dtype_t dt, weft_op_t op, size_t n)
{
    uint8_t e[8];
    bool isf = weft_test_dtype_is_float(dt), sgn = weft_test_dtype_is_signed(dt);
    for (size_t j = 0; j < n; j++) {
        if (isf) {
            double acc = 0;
            for (int r = 0; r < c->p; r++) {
                put_input(e, 0, dt, op, r, c->p, j);
                double v = weft_test_load_f(e, dt, 0);
                if (r == 0)
                    acc = v;
                else if (op == WEFT_SUM || op == WEFT_AVG)
                    acc += v;
                else if (op == WEFT_PROD)
                    acc *= v;
                else if (op == WEFT_MAX)
                    acc = v > acc ? v : acc;
                else
                    acc = v < acc ? v : acc;
            }
            if (op == WEFT_AVG)
                acc /= c->p;
            weft_test_store_f(c->want, dt, j, acc);
            continue;
        }
        uint64_t acc = 0;
        for (int r = 0; r < c->p; r++) {
            put_input(e, 0, dt, op, r, c->p, j);
            uint64_t v = (uint64_t)weft_test_load_int(e, dt, 0);
            bool gt = sgn ? (int64_t)v > (int64_t)acc : v > acc;
            if (r == 0)
                acc = v;
            else if (op == WEFT_SUM || op == WEFT_AVG)
                acc += v; /* wraps modulo 2^64, hence modulo 2^bits */
            else if (op == WEFT_PROD)
                acc *= v;
            else if (op == WEFT_MAX)
                acc = gt ? v : acc;
            else
                acc = gt ? acc : v;
        }
        if (op == WEFT_AVG) /* exact sum (inputs are bounded), truncated toward zero */
            acc = sgn ? (uint64_t)((int64_t)acc / c->p) : acc / (uint64_t)c->p;
        weft_test_store_int(c->want, dt, j, (int64_t)acc);
    }
}

/* ---- checks ------------------------------------------------------------------ */

static void report(struct tc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(struct tc *c, const char *fmt, ...)
{
    c->fails++;
    if (c->reports++ >= MAX_REPORTS)
        return;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    weft_test_fail(c->rank, "%s", msg);
}

static void poison_rcv(struct tc *c, size_t bytes)
{
    weft_test_gbuf_poison(&c->rcvg, bytes);
}

static void check_guards(struct tc *c, const char *what, size_t bytes)
{
    char msg[128];
    if (weft_test_gbuf_guard_error(&c->rcvg, bytes, msg, sizeof(msg)))
        report(c, "%s: %s", what, msg);
}

static void check_vals(struct tc *c, const char *what, const void *got, const void *want,
                       weft_dtype_t dt, size_t n)
{
    size_t i = weft_test_compare(got, want, dt, n);
    if (i == n)
        return;
    char g[64], w[64];
    report(c, "%s %s [%zu of %zu]: expected %s, got %s", what, weft_test_dtype_name(dt), i, n,
           weft_test_format(want, dt, i, w, sizeof(w)), weft_test_format(got, dt, i, g, sizeof(g)));
}

static void check_bytes(struct tc *c, const char *what, const uint8_t *got, const uint8_t *want,
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

static size_t counts_of(int p, size_t large, size_t out[5])
{
    size_t cand[5] = {0, 1, (size_t)p - 1, (size_t)p + 1, large}, n = 0;
    for (int i = 0; i < 5; i++) {
        bool dup = false;
        for (size_t k = 0; k < n; k++)
            dup |= out[k] == cand[i];
        if (!dup)
            out[n++] = cand[i];
    }
    return n;
}

/* ---- the matrix ------------------------------------------------------------ */

static int run_allreduce(struct tc *c, weft_dtype_t dt, weft_op_t op)
{
    size_t es = weft_dtype_size(dt), counts[5], nc = counts_of(c->p, LARGE, counts);
    char what[160];
    for (size_t k = 0; k < nc; k++) {
        size_t n = counts[k];
        for (int inplace = 0; inplace < 2; inplace++) {
            snprintf(what, sizeof(what), "allreduce p=%d n=%zu %s%s", c->p, n,
                     weft_test_op_name(op), inplace ? " in place" : "");
            poison_rcv(c, n * es);
            if (inplace) {
                memcpy(c->rcv, c->in, n * es);
                CALL(c, what, weft_allreduce(c->rcv, c->rcv, n, dt, op, c->comm));
            } else {
                memcpy(c->snd, c->in, n * es);
                CALL(c, what, weft_allreduce(c->snd, c->rcv, n, dt, op, c->comm));
                if (memcmp(c->snd, c->in, n * es) != 0)
                    report(c, "%s: sendbuf was modified", what);
            }
            check_vals(c, what, c->rcv, c->want, dt, n);
            check_guards(c, what, n * es);
        }
    }
    return 0;
}

static int run_reduce_scatter(struct tc *c, weft_dtype_t dt, weft_op_t op)
{
    size_t es = weft_dtype_size(dt), counts[5], nc = counts_of(c->p, LARGE_SEG, counts);
    char what[160];
    for (size_t k = 0; k < nc; k++) {
        size_t n = counts[k], total = n * (size_t)c->p, mine = (size_t)c->rank * n * es;
        for (int inplace = 0; inplace < 2; inplace++) {
            snprintf(what, sizeof(what), "reduce_scatter p=%d recvcount=%zu %s%s", c->p, n,
                     weft_test_op_name(op), inplace ? " in place" : "");
            poison_rcv(c, total * es);
            if (inplace) {
                memcpy(c->rcv, c->in, total * es);
                CALL(c, what, weft_reduce_scatter(c->rcv, c->rcv + mine, n, dt, op, c->comm));
                check_vals(c, what, c->rcv + mine, c->want + mine, dt, n);
                check_guards(c, what, total * es);
            } else {
                memcpy(c->snd, c->in, total * es);
                CALL(c, what, weft_reduce_scatter(c->snd, c->rcv, n, dt, op, c->comm));
                if (memcmp(c->snd, c->in, total * es) != 0)
                    report(c, "%s: sendbuf was modified", what);
                check_vals(c, what, c->rcv, c->want + mine, dt, n);
                check_guards(c, what, n * es);
            }
        }
    }
    return 0;
}

static int run_reduce(struct tc *c, weft_dtype_t dt, weft_op_t op)
{
    size_t es = weft_dtype_size(dt), counts[5], nc = counts_of(c->p, LARGE, counts);
    int roots[8], nroots = 0;
    if (c->p <= 4)
        for (int r = 0; r < c->p; r++)
            roots[nroots++] = r;
    else
        roots[nroots++] = 0, roots[nroots++] = c->p - 1;
    char what[160];
    for (int ri = 0; ri < nroots; ri++) {
        int root = roots[ri];
        for (size_t k = 0; k < nc; k++) {
            size_t n = counts[k];
            for (int inplace = 0; inplace < 2; inplace++) {
                snprintf(what, sizeof(what), "reduce p=%d root=%d n=%zu %s%s", c->p, root, n,
                         weft_test_op_name(op), inplace ? " in place" : "");
                poison_rcv(c, n * es);
                if (inplace) {
                    memcpy(c->rcv, c->in, n * es);
                    CALL(c, what, weft_reduce(c->rcv, c->rcv, n, dt, op, root, c->comm));
                    if (c->rank == root)
                        check_vals(c, what, c->rcv, c->want, dt, n);
                    else if (memcmp(c->rcv, c->in, n * es) != 0)
                        report(c, "%s: a non-root's buffer was modified", what);
                } else {
                    memcpy(c->snd, c->in, n * es);
                    CALL(c, what, weft_reduce(c->snd, c->rcv, n, dt, op, root, c->comm));
                    if (memcmp(c->snd, c->in, n * es) != 0)
                        report(c, "%s: sendbuf was modified", what);
                    if (c->rank == root)
                        check_vals(c, what, c->rcv, c->want, dt, n);
                    else if (!weft_test_gbuf_untouched(&c->rcvg, n * es))
                        report(c, "%s: recvbuf written on a non-root rank", what);
                }
                check_guards(c, what, n * es);
            }
        }
    }
    return 0;
}

static int run_allgather(struct tc *c, weft_dtype_t dt)
{
    size_t es = weft_dtype_size(dt), counts[5], nc = counts_of(c->p, LARGE_SEG, counts);
    char what[160];
    for (size_t k = 0; k < nc; k++) {
        size_t n = counts[k], seg = n * es, mine = (size_t)c->rank * seg;
        for (int r = 0; r < c->p; r++) /* want = every rank's bytes, in rank order */
            weft_test_fill_bytes(c->want + (size_t)r * seg, seg, r, 0xa11 + dt);
        for (int inplace = 0; inplace < 2; inplace++) {
            snprintf(what, sizeof(what), "allgather p=%d sendcount=%zu %s%s", c->p, n,
                     weft_test_dtype_name(dt), inplace ? " in place" : "");
            poison_rcv(c, seg * (size_t)c->p);
            if (inplace) {
                memcpy(c->rcv + mine, c->want + mine, seg);
                CALL(c, what, weft_allgather(c->rcv + mine, c->rcv, n, dt, c->comm));
            } else {
                memcpy(c->snd, c->want + mine, seg);
                CALL(c, what, weft_allgather(c->snd, c->rcv, n, dt, c->comm));
                if (memcmp(c->snd, c->want + mine, seg) != 0)
                    report(c, "%s: sendbuf was modified", what);
            }
            check_bytes(c, what, c->rcv, c->want, seg * (size_t)c->p, es);
            check_guards(c, what, seg * (size_t)c->p);
        }
    }
    return 0;
}

static int run_broadcast(struct tc *c, weft_dtype_t dt)
{
    size_t es = weft_dtype_size(dt), counts[5], nc = counts_of(c->p, LARGE, counts);
    char what[160];
    for (int root = 0; root < c->p; root++) {
        for (size_t k = 0; k < nc; k++) {
            size_t n = counts[k], bytes = n * es;
            weft_test_fill_bytes(c->want, bytes, root, 0xb0 + dt);
            for (int inplace = 0; inplace < 2; inplace++) {
                snprintf(what, sizeof(what), "broadcast p=%d root=%d n=%zu %s%s", c->p, root, n,
                         weft_test_dtype_name(dt), inplace ? " in place" : "");
                poison_rcv(c, bytes);
                /* A non-root's sendbuf is never read: give it junk. */
                if (c->rank == root)
                    memcpy(inplace ? c->rcv : c->snd, c->want, bytes);
                else
                    memset(c->snd, 0x3c, bytes);
                if (inplace)
                    CALL(c, what, weft_broadcast(c->rcv, c->rcv, n, dt, root, c->comm));
                else
                    CALL(c, what, weft_broadcast(c->snd, c->rcv, n, dt, root, c->comm));
                if (!inplace && c->rank == root && memcmp(c->snd, c->want, bytes) != 0)
                    report(c, "%s: sendbuf was modified", what);
                check_bytes(c, what, c->rcv, c->want, bytes, es);
                check_guards(c, what, bytes);
            }
        }
    }
    return 0;
}

static int run_matrix(struct tc *c)
{
    for (int d = 0; d < WEFT_NUM_DTYPES; d++) {
        weft_dtype_t dt = (weft_dtype_t)d;
        for (int o = 0; o < WEFT_NUM_OPS; o++) {
            weft_op_t op = (weft_op_t)o;
            make_input(c, dt, op, c->maxn);
            make_expected(c, dt, op, c->maxn);
            if (run_allreduce(c, dt, op) || run_reduce_scatter(c, dt, op) ||
                run_reduce(c, dt, op))
                return -1;
        }
        if (run_allgather(c, dt) || run_broadcast(c, dt))
            return -1;
    }
    return 0;
}

/* The allreduce part of the matrix alone, for the jobs that force an
 * algorithm (the other collectives always run the ring). */
static int run_allreduce_matrix(struct tc *c)
{
    for (int d = 0; d < WEFT_NUM_DTYPES; d++) {
        for (int o = 0; o < WEFT_NUM_OPS; o++) {
            weft_dtype_t dt = (weft_dtype_t)d;
            weft_op_t op = (weft_op_t)o;
            make_input(c, dt, op, LARGE);
            make_expected(c, dt, op, LARGE);
            if (run_allreduce(c, dt, op))
                return -1;
        }
    }
    return 0;
}

/* ---- bitwise identity of inexact float results ------------------------------- */

/* Unit roundoff of each float type. */
static double unit_roundoff(weft_dtype_t dt)
{
    switch (dt) {
    case WEFT_FLOAT16: return ldexp(1, -11);
    case WEFT_BFLOAT16: return ldexp(1, -8);
    case WEFT_FLOAT32: return ldexp(1, -24);
    default: return ldexp(1, -53);
    }
}

static void put_random_float(void *buf, size_t k, weft_dtype_t dt, weft_op_t op, int r, size_t j)
{
    uint64_t h = weft_test_mix(0xf10a7ull ^ ((uint64_t)dt << 56) ^ ((uint64_t)op << 48) ^
                               ((uint64_t)r << 40) ^ j);
    double u = (double)(h >> 11) * ldexp(1, -53); /* [0, 1) */
    double v = op == WEFT_PROD ? 0.75 + 0.5 * u : (2 * u - 1) * (double)(1 << (h & 7));
    weft_test_store_f(buf, dt, k, v);
}

/* The exact answer at j of op over every rank's put_random_float, and the
 * sum of magnitudes that bounds its rounding error. */
static double exact_random(const struct tc *c, weft_dtype_t dt, weft_op_t op, size_t j,
                           double *mag)
{
    uint8_t e[8];
    double exact = 0;
    *mag = 0;
    for (int r = 0; r < c->p; r++) {
        put_random_float(e, 0, dt, op, r, j);
        double v = weft_test_load_f(e, dt, 0);
        if (r == 0)
            exact = v, *mag = fabs(v);
        else if (op == WEFT_PROD)
            exact *= v, *mag *= fabs(v);
        else if (op == WEFT_MAX)
            exact = v > exact ? v : exact;
        else if (op == WEFT_MIN)
            exact = v < exact ? v : exact;
        else
            exact += v, *mag += fabs(v);
    }
    if (op == WEFT_AVG)
        exact /= c->p, *mag /= c->p;
    return exact;
}

/* Every rank's result hash must be the same as ours. */
static int same_everywhere(struct tc *c, const char *what, const void *buf, size_t bytes,
                           uint64_t *hashes)
{
    uint64_t mine = weft_test_hash(buf, bytes);
    CALL(c, what, weft_allgather(&mine, hashes, 1, WEFT_UINT64, c->comm));
    for (int r = 0; r < c->p; r++)
        if (hashes[r] != mine) {
            report(c, "%s: result bits differ between rank %d and rank %d", what, c->rank, r);
            break;
        }
    return 0;
}

/* Random non-integer floats: every rank must get the same bits, and the
 * result must be within the rounding error of the exact answer (MAX and
 * MIN: be it).  Two sizes, so that the cost model has both algorithms to
 * choose from in the default jobs (the small one goes to recursive
 * doubling). */
static int run_bitwise(struct tc *c)
{
    static const weft_dtype_t dts[] = {WEFT_FLOAT16, WEFT_BFLOAT16, WEFT_FLOAT32, WEFT_FLOAT64};
    static const weft_op_t ops[] = {WEFT_SUM, WEFT_PROD, WEFT_AVG, WEFT_MAX, WEFT_MIN};
    static const size_t sizes[] = {LARGE, 1001};
    uint64_t *hashes = calloc((size_t)c->p, sizeof(uint64_t));
    if (hashes == NULL)
        return weft_test_fail(c->rank, "out of memory"), -1;
    char what[160];
    int rc = -1;
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(sizes) * WEFT_ARRAY_SIZE(dts); k++) {
        size_t n = sizes[k / WEFT_ARRAY_SIZE(dts)];
        weft_dtype_t dt = dts[k % WEFT_ARRAY_SIZE(dts)];
        for (size_t o = 0; o < WEFT_ARRAY_SIZE(ops); o++) {
            weft_op_t op = ops[o];
            snprintf(what, sizeof(what), "bitwise allreduce p=%d n=%zu %s %s", c->p, n,
                     weft_test_dtype_name(dt), weft_test_op_name(op));
            for (size_t j = 0; j < n; j++)
                put_random_float(c->snd, j, dt, op, c->rank, j);
            weft_status_t st = weft_allreduce(c->snd, c->rcv, n, dt, op, c->comm);
            c->calls++;
            if (st != WEFT_OK) {
                weft_test_fail(c->rank, "%s returned %s: %s", what, weft_status_string(st),
                               weft_last_error(c->comm));
                goto out;
            }
            if (same_everywhere(c, what, c->rcv, n * weft_dtype_size(dt), hashes))
                goto out;
            /* Close to the exact value (checked on a sample of elements). */
            double u = unit_roundoff(dt);
            for (size_t j = 0; j < n; j += 13) {
                double mag, exact = exact_random(c, dt, op, j, &mag);
                double got = weft_test_load_f(c->rcv, dt, j);
                bool cmp = op == WEFT_MAX || op == WEFT_MIN; /* no rounding at all */
                double tol = cmp ? 0 : (c->p + 1) * u * mag * 1.01 + 1e-300;
                if (!(fabs(got - exact) <= tol)) {
                    report(c, "%s [%zu]: got %.17g, exact %.17g (tolerance %.3g)", what, j, got,
                           exact, tol);
                    break;
                }
            }
        }
    }
    rc = 0;
out:
    free(hashes);
    return rc;
}

/* ---- operand order: NaN and signed zeros ----------------------------------- */

/* A quiet NaN with h's sign and payload bits. */
static void store_nan(void *buf, weft_dtype_t dt, size_t k, uint64_t h)
{
    bool neg = h >> 63;
    switch (dt) {
    case WEFT_FLOAT16:
        ((uint16_t *)buf)[k] = (uint16_t)(0x7e00u | (h & 0x1ffu) | (neg ? 0x8000u : 0));
        break;
    case WEFT_BFLOAT16:
        ((uint16_t *)buf)[k] = (uint16_t)(0x7fc0u | (h & 0x3fu) | (neg ? 0x8000u : 0));
        break;
    case WEFT_FLOAT32:
        ((uint32_t *)buf)[k] = 0x7fc00000u | (uint32_t)(h & 0x3fffffu) | (neg ? 0x80000000u : 0);
        break;
    default:
        ((uint64_t *)buf)[k] = 0x7ff8000000000000ull | (h & 0x7ffffffffffffull) |
                               (h & 0x8000000000000000ull);
        break;
    }
}

/* Rank r's input at j: j%4 == 0 a NaN on one rank, 1 a different NaN on
 * every rank, 2 +0 on even ranks and -0 on odd ones, 3 plain values. */
static void put_special(void *buf, size_t k, weft_dtype_t dt, int r, int p, size_t j)
{
    uint64_t h = weft_test_mix(0x4a4e5ull ^ ((uint64_t)dt << 56) ^ ((uint64_t)r << 40) ^ j);
    if ((j % 4 == 0 && (int)(j / 4 % (size_t)p) == r) || j % 4 == 1)
        store_nan(buf, dt, k, h);
    else if (j % 4 == 2)
        weft_test_store_f(buf, dt, k, r % 2 ? -0.0 : 0.0);
    else
        weft_test_store_f(buf, dt, k, ((double)(h % 4001) - 2000) / 16);
}

/* MAX and MIN are (a > b ? a : b), and x86 adds two NaNs into the first
 * one's payload: with NaNs, and with +0 against -0, the result depends on
 * operand order.  Ranks agree bit for bit only if every rank's result was
 * combined in the same order (recursive doubling computes it on every
 * rank).  Every rank's result is gathered and compared with rank 0's. */
static int run_nan_order(struct tc *c)
{
    static const weft_dtype_t dts[] = {WEFT_FLOAT16, WEFT_BFLOAT16, WEFT_FLOAT32, WEFT_FLOAT64};
    static const weft_op_t ops[] = {WEFT_MAX, WEFT_MIN, WEFT_SUM};
    const size_t n = 4099;
    uint8_t *all = malloc(n * 8 * (size_t)c->p);
    if (all == NULL)
        return weft_test_fail(c->rank, "out of memory"), -1;
    char what[160];
    int rc = -1;
    for (size_t k = 0; k < 2 * WEFT_ARRAY_SIZE(dts) * WEFT_ARRAY_SIZE(ops); k++) {
        int inplace = (int)(k % 2);
        weft_dtype_t dt = dts[k / 2 % WEFT_ARRAY_SIZE(dts)];
        weft_op_t op = ops[k / 2 / WEFT_ARRAY_SIZE(dts)];
        size_t es = weft_dtype_size(dt);
        snprintf(what, sizeof(what), "NaN/zero order allreduce p=%d n=%zu %s %s%s", c->p, n,
                 weft_test_dtype_name(dt), weft_test_op_name(op), inplace ? " in place" : "");
        uint8_t *src = inplace ? c->rcv : c->snd;
        for (size_t j = 0; j < n; j++)
            put_special(src, j, dt, c->rank, c->p, j);
        weft_status_t st = weft_allreduce(src, c->rcv, n, dt, op, c->comm);
        if (st == WEFT_OK)
            st = weft_allgather(c->rcv, all, n, dt, c->comm);
        c->calls += 2;
        if (st != WEFT_OK) {
            weft_test_fail(c->rank, "%s returned %s: %s", what, weft_status_string(st),
                           weft_last_error(c->comm));
            goto out;
        }
        /* Rank 0 alone reports disagreement, once per case. */
        for (int r = 1; r < c->p && c->rank == 0; r++) {
            const uint8_t *theirs = all + (size_t)r * n * es;
            if (memcmp(theirs, all, n * es) == 0)
                continue;
            size_t j = 0;
            while (weft_test_load_bits(theirs, dt, j) == weft_test_load_bits(all, dt, j))
                j++;
            char a[64], b[64];
            report(c, "%s: rank %d [%zu] holds %s, rank 0 holds %s (input kind %zu)", what, r, j,
                   weft_test_format(theirs, dt, j, b, sizeof(b)),
                   weft_test_format(all, dt, j, a, sizeof(a)), j % 4);
            break;
        }
        /* What the values must be whatever the order. */
        uint8_t e[8];
        for (size_t j = 0; j < n; j++) {
            double got = weft_test_load_f(c->rcv, dt, j);
            bool ok = true;
            if (j % 4 == 1 || (j % 4 == 0 && op == WEFT_SUM))
                ok = isnan(got);
            else if (j % 4 == 2)
                ok = got == 0;
            else if (j % 4 == 3 && op != WEFT_SUM) {
                double want = 0;
                for (int r = 0; r < c->p; r++) {
                    put_special(e, 0, dt, r, c->p, j);
                    double v = weft_test_load_f(e, dt, 0);
                    want = r == 0 || (op == WEFT_MAX ? v > want : v < want) ? v : want;
                }
                ok = got == want;
            }
            if (!ok) {
                char g[64];
                report(c, "%s [%zu] (input kind %zu): got %s", what, j, j % 4,
                       weft_test_format(c->rcv, dt, j, g, sizeof(g)));
                break;
            }
        }
    }
    rc = 0;
out:
    free(all);
    return rc;
}

/* ---- non-blocking requests ------------------------------------------------- */

enum { NB_AR_I32, NB_AR_F32, NB_AG_U8, NB_BC_I64, NB_RD_F64, NB_RS_I32, NB_COUNT };
static const size_t nb_count[NB_COUNT] = {1000, 5001, 777, 3001, 2001, 1003};
static const weft_dtype_t nb_dtype[NB_COUNT] = {WEFT_INT32, WEFT_FLOAT32, WEFT_UINT8,
                                                WEFT_INT64, WEFT_FLOAT64, WEFT_INT32};

/* Buffers of the six requests of one batch. */
struct nb {
    void *snd[NB_COUNT], *rcv[NB_COUNT], *want[NB_COUNT];
    weft_request_t req[NB_COUNT];
};

static void nb_free(struct nb *b)
{
    for (int i = 0; i < NB_COUNT; i++) {
        free(b->snd[i]);
        free(b->rcv[i]);
        free(b->want[i]);
    }
}

static int nb_prepare(struct tc *c, struct nb *b)
{
    int p = c->p, r = c->rank;
    memset(b, 0, sizeof(*b));
    for (int i = 0; i < NB_COUNT; i++) {
        size_t bytes = nb_count[i] * weft_dtype_size(nb_dtype[i]) * (size_t)p;
        b->snd[i] = malloc(bytes);
        b->rcv[i] = malloc(bytes);
        b->want[i] = malloc(bytes);
        if (!b->snd[i] || !b->rcv[i] || !b->want[i])
            return weft_test_fail(r, "out of memory"), -1;
        memset(b->rcv[i], POISON, bytes);
    }
    for (size_t j = 0; j < nb_count[NB_AR_I32]; j++) {
        ((int32_t *)b->snd[0])[j] = (int32_t)((r + 1) * (j + 1));
        ((int32_t *)b->want[0])[j] = (int32_t)((j + 1) * (size_t)(p * (p + 1) / 2));
    }
    for (size_t j = 0; j < nb_count[NB_AR_F32]; j++) {
        float mx = 0;
        for (int q = 0; q < p; q++) {
            float v = (float)((q * 31 + (int)j * 7) % 101);
            mx = q == 0 || v > mx ? v : mx;
        }
        ((float *)b->snd[1])[j] = (float)((r * 31 + (int)j * 7) % 101);
        ((float *)b->want[1])[j] = mx;
    }
    size_t seg = nb_count[NB_AG_U8];
    weft_test_fill_bytes(b->snd[2], seg, r, 0xa6);
    for (int q = 0; q < p; q++)
        weft_test_fill_bytes((uint8_t *)b->want[2] + (size_t)q * seg, seg, q, 0xa6);
    weft_test_fill_bytes(b->want[3], nb_count[NB_BC_I64] * 8, p - 1, 0xbc);
    if (r == p - 1)
        memcpy(b->snd[3], b->want[3], nb_count[NB_BC_I64] * 8);
    for (size_t j = 0; j < nb_count[NB_RD_F64]; j++) {
        ((double *)b->snd[4])[j] = (double)r + (double)j;
        ((double *)b->want[4])[j] = (double)p * (p - 1) / 2 + (double)p * (double)j;
    }
    size_t rs = nb_count[NB_RS_I32];
    for (size_t j = 0; j < rs * (size_t)p; j++)
        ((int32_t *)b->snd[5])[j] = (int32_t)(r * 3 + (int)j);
    for (size_t j = 0; j < rs; j++)
        ((int32_t *)b->want[5])[j] = 3 * p * (p - 1) / 2 + p * (int)(r * rs + j);
    return 0;
}

static int nb_issue(struct tc *c, struct nb *b)
{
    weft_comm_t m = c->comm;
    CALL(c, "iallreduce int32", weft_iallreduce(b->snd[0], b->rcv[0], nb_count[0], WEFT_INT32,
                                                WEFT_SUM, m, &b->req[0]));
    CALL(c, "iallreduce float32", weft_iallreduce(b->snd[1], b->rcv[1], nb_count[1],
                                                  WEFT_FLOAT32, WEFT_MAX, m, &b->req[1]));
    CALL(c, "iallgather", weft_iallgather(b->snd[2], b->rcv[2], nb_count[2], WEFT_UINT8, m,
                                          &b->req[2]));
    CALL(c, "ibroadcast", weft_ibroadcast(b->snd[3], b->rcv[3], nb_count[3], WEFT_INT64,
                                          c->p - 1, m, &b->req[3]));
    CALL(c, "ireduce", weft_ireduce(b->snd[4], b->rcv[4], nb_count[4], WEFT_FLOAT64, WEFT_SUM,
                                    0, m, &b->req[4]));
    CALL(c, "ireduce_scatter", weft_ireduce_scatter(b->snd[5], b->rcv[5], nb_count[5],
                                                    WEFT_INT32, WEFT_SUM, m, &b->req[5]));
    for (int i = 0; i < NB_COUNT; i++)
        if (b->req[i] == NULL)
            return weft_test_fail(c->rank, "request %d is NULL after a successful call", i), -1;
    return 0;
}

static void nb_check(struct tc *c, struct nb *b, const char *batch)
{
    static const char *const names[NB_COUNT] = {"iallreduce int32 sum", "iallreduce f32 max",
                                                "iallgather", "ibroadcast", "ireduce",
                                                "ireduce_scatter"};
    char what[128];
    for (int i = 0; i < NB_COUNT; i++) {
        size_t n = nb_count[i] * (i == NB_AG_U8 ? (size_t)c->p : 1);
        snprintf(what, sizeof(what), "%s p=%d: %s", batch, c->p, names[i]);
        if (i == NB_RD_F64 && c->rank != 0) {
            const uint8_t *q = b->rcv[i];
            size_t k = 0;
            while (k < n * 8 && q[k] == POISON)
                k++;
            if (k < n * 8)
                report(c, "%s: recvbuf written on a non-root rank", what);
            continue;
        }
        check_vals(c, what, b->rcv[i], b->want[i], nb_dtype[i], n);
    }
}

/* weft_test until done, bounded so a lost request is a failure. */
static int test_until_done(struct tc *c, weft_request_t req, const char *what)
{
    uint64_t deadline = weft_now_ns() + 60ull * 1000000000;
    int done = 0;
    while (!done) {
        weft_status_t st = weft_test(req, &done);
        if (st < 0)
            return weft_test_fail(c->rank, "%s: weft_test returned %s: %s", what,
                                  weft_status_string(st), weft_last_error(c->comm)), -1;
        if (!done && weft_now_ns() > deadline)
            return weft_test_fail(c->rank, "%s: not done after 60 s of weft_test", what), -1;
    }
    return 0;
}

static int run_nonblocking(struct tc *c)
{
    struct nb b;
    int rc = -1;
    /* Batch 1: the first completed by weft_test, the rest waited in order. */
    if (nb_prepare(c, &b) || nb_issue(c, &b) || test_until_done(c, b.req[0], "batch 1"))
        goto out;
    for (int i = 1; i < NB_COUNT; i++)
        CALL(c, "weft_wait (batch 1)", weft_wait(b.req[i]));
    nb_check(c, &b, "batch 1");
    nb_free(&b);
    /* Batch 2: once the last is done, every earlier one must be (issue order). */
    if (nb_prepare(c, &b) || nb_issue(c, &b) ||
        test_until_done(c, b.req[NB_COUNT - 1], "batch 2"))
        goto out;
    for (int i = 0; i < NB_COUNT - 1; i++) {
        int done = 0;
        weft_status_t st = weft_test(b.req[i], &done);
        if (st < 0) {
            weft_test_fail(c->rank, "batch 2: weft_test of request %d returned %s", i,
                           weft_status_string(st));
            goto out;
        }
        if (!done) {
            report(c, "batch 2: request %d not done after the later request %d completed", i,
                   NB_COUNT - 1);
            CALL(c, "weft_wait (batch 2)", weft_wait(b.req[i]));
        }
    }
    nb_check(c, &b, "batch 2");
    nb_free(&b);
    memset(&b, 0, sizeof(b));
    /* Batch 3: 32 small requests outstanding, waited newest first. */
    enum { MANY = 32 };
    int64_t vals[MANY], sums[MANY];
    weft_request_t reqs[MANY];
    for (int k = 0; k < MANY; k++) {
        vals[k] = (int64_t)(c->rank + 1) * (k + 1);
        CALL(c, "iallreduce (batch 3)",
             weft_iallreduce(&vals[k], &sums[k], 1, WEFT_INT64, WEFT_SUM, c->comm, &reqs[k]));
    }
    for (int k = MANY - 1; k >= 0; k--)
        CALL(c, "weft_wait (batch 3)", weft_wait(reqs[k]));
    for (int k = 0; k < MANY; k++)
        if (sums[k] != (int64_t)(k + 1) * c->p * (c->p + 1) / 2)
            report(c, "batch 3 p=%d: request %d: expected %lld, got %lld", c->p, k,
                   (long long)(k + 1) * c->p * (c->p + 1) / 2, (long long)sums[k]);
    rc = 0;
out:
    nb_free(&b);
    return rc;
}

/* ---- groups and point to point ----------------------------------------------- */

static int run_group_ring(struct tc *c)
{
    const size_t bytes = 8u << 20; /* far beyond socket buffers: ungrouped, this deadlocks */
    int next = (c->rank + 1) % c->p, prev = (c->rank + c->p - 1) % c->p;
    uint8_t *s = malloc(bytes), *r = malloc(bytes), *w = malloc(bytes);
    int rc = -1;
    if (!s || !r || !w) {
        weft_test_fail(c->rank, "out of memory");
        goto out;
    }
    weft_test_fill_bytes(s, bytes, c->rank, 0x7171);
    weft_test_fill_bytes(w, bytes, prev, 0x7171);
    memset(r, POISON, bytes);
    CALL(c, "weft_group_start", weft_group_start());
    CALL(c, "weft_send (ring, grouped)", weft_send(s, bytes, WEFT_UINT8, next, c->comm));
    CALL(c, "weft_recv (ring, grouped)", weft_recv(r, bytes, WEFT_UINT8, prev, c->comm));
    CALL(c, "weft_group_end (ring)", weft_group_end());
    check_bytes(c, "group ring 8 MiB", r, w, bytes, 1);
    rc = 0;
out:
    free(s);
    free(r);
    free(w);
    return rc;
}

static int run_group_alltoall(struct tc *c)
{
    const size_t n = 1001;
    int p = c->p;
    int32_t *s = malloc(n * (size_t)p * 4), *r = malloc(n * (size_t)p * 4);
    if (!s || !r) {
        free(s);
        free(r);
        return weft_test_fail(c->rank, "out of memory"), -1;
    }
    for (int q = 0; q < p; q++)
        for (size_t j = 0; j < n; j++) {
            s[(size_t)q * n + j] = c->rank * 1000003 + q * 1009 + (int32_t)j;
            r[(size_t)q * n + j] = -1;
        }
    CALL(c, "weft_group_start", weft_group_start());
    for (int q = 0; q < p; q++) {
        if (q == c->rank)
            continue;
        CALL(c, "weft_send (all-to-all)", weft_send(s + (size_t)q * n, n, WEFT_INT32, q, c->comm));
        CALL(c, "weft_recv (all-to-all)", weft_recv(r + (size_t)q * n, n, WEFT_INT32, q, c->comm));
    }
    CALL(c, "weft_group_end (all-to-all)", weft_group_end());
    for (int q = 0; q < p; q++) {
        if (q == c->rank)
            continue;
        for (size_t j = 0; j < n; j++)
            if (r[(size_t)q * n + j] != q * 1000003 + c->rank * 1009 + (int32_t)j) {
                report(c, "group all-to-all p=%d: from rank %d [%zu]: expected %d, got %d", p, q,
                       j, q * 1000003 + c->rank * 1009 + (int32_t)j, r[(size_t)q * n + j]);
                break;
            }
    }
    free(s);
    free(r);
    return 0;
}

/* Several collectives in one group: queued, then run together. */
static int run_group_colls(struct tc *c)
{
    int32_t a[1000], asum[1000];
    double m[10], mmax[10];
    int64_t bc[300];
    for (int j = 0; j < 1000; j++)
        a[j] = c->rank + j;
    for (int j = 0; j < 10; j++)
        m[j] = (double)((c->rank * 7 + j) % 11);
    for (int j = 0; j < 300; j++)
        bc[j] = c->rank == 0 ? (int64_t)j * 1000000007 : -1;
    CALL(c, "weft_group_start", weft_group_start());
    CALL(c, "grouped allreduce", weft_allreduce(a, asum, 1000, WEFT_INT32, WEFT_SUM, c->comm));
    CALL(c, "grouped allreduce", weft_allreduce(m, mmax, 10, WEFT_FLOAT64, WEFT_MAX, c->comm));
    CALL(c, "grouped broadcast", weft_broadcast(bc, bc, 300, WEFT_INT64, 0, c->comm));
    CALL(c, "weft_group_end (collectives)", weft_group_end());
    for (int j = 0; j < 1000; j++)
        if (asum[j] != c->p * (c->p - 1) / 2 + c->p * j) {
            report(c, "grouped allreduce [%d]: expected %d, got %d", j,
                   c->p * (c->p - 1) / 2 + c->p * j, asum[j]);
            break;
        }
    for (int j = 0; j < 10; j++) {
        double mx = 0;
        for (int q = 0; q < c->p; q++)
            mx = fmax(mx, (double)((q * 7 + j) % 11));
        if (mmax[j] != mx) {
            report(c, "grouped allreduce max [%d]: expected %g, got %g", j, mx, mmax[j]);
            break;
        }
    }
    for (int j = 0; j < 300; j++)
        if (bc[j] != (int64_t)j * 1000000007) {
            report(c, "grouped broadcast [%d]: expected %lld, got %lld", j,
                   (long long)j * 1000000007, (long long)bc[j]);
            break;
        }
    return 0;
}

/* Pairs (0,1), (2,3)...: blocking send/recv of 0, 1 and LARGE elements
 * (even ranks send first), then isend/irecv both ways at once. */
static int run_p2p(struct tc *c)
{
    static const size_t counts[] = {0, 1, LARGE};
    char what[128];
    /* To oneself: grouped (alone, a blocking send would wait for its recv). */
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(counts); k++) {
        size_t n = counts[k];
        snprintf(what, sizeof(what), "p2p p=%d rank %d to itself n=%zu", c->p, c->rank, n);
        weft_test_fill_bytes(c->snd, n * 8, c->rank, 0x5e1f + k);
        poison_rcv(c, n * 8);
        CALL(c, "weft_group_start", weft_group_start());
        CALL(c, what, weft_send(c->snd, n, WEFT_FLOAT64, c->rank, c->comm));
        CALL(c, what, weft_recv(c->rcv, n, WEFT_FLOAT64, c->rank, c->comm));
        CALL(c, what, weft_group_end());
        check_bytes(c, what, c->rcv, c->snd, n * 8, 8);
        check_guards(c, what, n * 8);
    }
    int peer = c->rank ^ 1;
    if (peer >= c->p)
        return 0;
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(counts); k++) {
        size_t n = counts[k], bytes = n * 8;
        snprintf(what, sizeof(what), "p2p p=%d %d<->%d n=%zu", c->p, c->rank, peer, n);
        weft_test_fill_bytes(c->snd, bytes, c->rank, 0x99 + k);
        weft_test_fill_bytes(c->want, bytes, peer, 0x99 + k);
        poison_rcv(c, bytes);
        for (int phase = 0; phase < 2; phase++) {
            if ((phase == 0) == (c->rank % 2 == 0))
                CALL(c, what, weft_send(c->snd, n, WEFT_FLOAT64, peer, c->comm));
            else
                CALL(c, what, weft_recv(c->rcv, n, WEFT_FLOAT64, peer, c->comm));
        }
        check_bytes(c, what, c->rcv, c->want, bytes, 8);
        check_guards(c, what, bytes);
        poison_rcv(c, bytes);
        weft_request_t rq, sq;
        CALL(c, what, weft_irecv(c->rcv, n, WEFT_FLOAT64, peer, c->comm, &rq));
        CALL(c, what, weft_isend(c->snd, n, WEFT_FLOAT64, peer, c->comm, &sq));
        CALL(c, what, weft_wait(sq));
        CALL(c, what, weft_wait(rq));
        check_bytes(c, what, c->rcv, c->want, bytes, 8);
        check_guards(c, what, bytes);
    }
    return 0;
}

/* ---- algorithm choice --------------------------------------------------------- */

/*
 * What one job runs, and under which WEFT_ALGO.  Parameters are read once
 * per process, at the first weft call, and Criterion runs each Test in a
 * process of its own: a Test sets WEFT_ALGO before its job makes the id
 * (the parent's first read), and the children forked after that inherit
 * the value.  check_algo proves in every child that it took.
 */
struct job {
    const char *only; /* parts to run, comma separated (see coll_body); NULL: all */
    const char *algo; /* WEFT_ALGO of the job; NULL: unset, the cost model picks */
    int force;        /* enum weft_algo every allreduce runs, or -1 */
};

/* The communicator allows what the job set, and the pick the engine makes
 * for each allreduce (weft_tune_pick over comm->algos) is the one forced;
 * in a default job the model has both algorithms to choose from. */
static int check_algo(struct tc *c, const struct job *jb)
{
    const char *seen = weft_param_str("WEFT_ALGO");
    if (strcmp(seen, jb->algo ? jb->algo : "") != 0)
        return weft_test_fail(c->rank, "WEFT_ALGO reads '%s' here, the job set '%s'", seen,
                              jb->algo ? jb->algo : "");
    unsigned all = (1u << WEFT_ALGO_COUNT) - 1;
    unsigned want = jb->force < 0 ? all : 1u << jb->force;
    if (c->comm->algos != want)
        return weft_test_fail(c->rank, "WEFT_ALGO=%s: the communicator allows algorithms 0x%x, "
                              "expected 0x%x", seen, c->comm->algos, want);
    if (c->p == 1)
        return 0; /* one rank: nothing to choose */
    static const size_t sizes[] = {0, 4, 8 * LARGE, (size_t)1 << 30};
    for (size_t i = 0; jb->force >= 0 && i < WEFT_ARRAY_SIZE(sizes); i++) {
        int got = weft_tune_pick(c->comm->algos, WEFT_COLL_ALLREDUCE, c->p, sizes[i]);
        if (got != jb->force)
            return weft_test_fail(c->rank, "WEFT_ALGO=%s: an allreduce of %zu bytes runs %s",
                                  seen, sizes[i], weft_algo_name(got));
    }
    if (jb->force < 0) {
        int small = weft_tune_pick(all, WEFT_COLL_ALLREDUCE, c->p, 1001 * 4);
        int big = weft_tune_pick(all, WEFT_COLL_ALLREDUCE, c->p, (size_t)1 << 30);
        if (small != WEFT_ALGO_RD || big != WEFT_ALGO_RING)
            return weft_test_fail(c->rank, "the cost model picks %s for 4004 bytes and %s for "
                                  "1 GiB: the default jobs would not run both algorithms",
                                  weft_algo_name(small), weft_algo_name(big));
    }
    if (weft_tune_pick(c->comm->algos, WEFT_COLL_BROADCAST, c->p, 4) != WEFT_ALGO_RING)
        return weft_test_fail(c->rank, "a broadcast would not run the ring");
    return 0;
}

/* Recursive doubling with chunks larger than the socket buffers: each
 * partner must finish a send before it may receive (see the Test). */
static int run_rd_big(struct tc *c)
{
    const size_t n = (size_t)1 << 20; /* 4 MiB of float32: 8 chunks of the default 512 KiB */
    float *s = malloc(n * sizeof(float)), *r = malloc(n * sizeof(float));
    int rc = -1;
    if (!s || !r) {
        weft_test_fail(c->rank, "out of memory");
        goto out;
    }
    for (int inplace = 0; inplace < 2; inplace++) {
        for (size_t j = 0; j < n; j++)
            s[j] = (float)((size_t)c->rank + j % 13);
        CALL(c, "rd allreduce of 4 MiB", weft_allreduce(s, inplace ? s : r, n, WEFT_FLOAT32,
                                                         WEFT_SUM, c->comm));
        const float *got = inplace ? s : r;
        for (size_t j = 0; j < n; j++) {
            float want = (float)(c->p * (c->p - 1) / 2) + (float)(c->p * (int)(j % 13));
            if (got[j] != want) {
                report(c, "rd allreduce of 4 MiB%s [%zu]: expected %g, got %g",
                       inplace ? " in place" : "", j, (double)want, (double)got[j]);
                break;
            }
        }
    }
    rc = 0;
out:
    free(s);
    free(r);
    return rc;
}

/* ---- the job ------------------------------------------------------------------ */

static int coll_body(weft_comm_t comm, int rank, int p, void *arg)
{
    struct tc c = {.comm = comm, .rank = rank, .p = p};
    c.maxn = WEFT_MAX((size_t)LARGE, (size_t)p * LARGE_SEG);
    size_t bytes = c.maxn * 8;
    c.in = malloc(bytes);
    c.want = malloc(bytes);
    c.snd = malloc(bytes);
    weft_test_gbuf_alloc(&c.rcvg, bytes);
    int rc = 1;
    if (!c.in || !c.want || !c.snd || !c.rcvg.base) {
        weft_test_fail(rank, "out of memory");
        goto out;
    }
    c.rcv = c.rcvg.p;
    const struct job *jb = arg;
    const char *only = jb->only;
    bool all = only == NULL;
    if (check_algo(&c, jb))
        goto out;
    if ((all || strstr(only, "matrix")) && run_matrix(&c))
        goto out;
    if (!all && strstr(only, "allreduce") && run_allreduce_matrix(&c))
        goto out;
    if (!all && strstr(only, "rdbig") && run_rd_big(&c))
        goto out;
    if ((all || strstr(only, "bitwise")) && run_bitwise(&c))
        goto out;
    if ((all || strstr(only, "nan")) && run_nan_order(&c))
        goto out;
    if ((all || strstr(only, "nonblocking")) && run_nonblocking(&c))
        goto out;
    if (p > 1 && (all || strstr(only, "group"))) {
        if (run_group_ring(&c) || run_group_alltoall(&c))
            goto out;
    }
    if ((all || strstr(only, "group")) && run_group_colls(&c))
        goto out;
    if ((all || strstr(only, "p2p")) && run_p2p(&c))
        goto out;
    if (c.fails > 0)
        weft_test_fail(rank, "%d checks failed", c.fails);
    else
        rc = 0;
    if (rank == 0 && getenv("WEFT_TEST_VERBOSE"))
        fprintf(stderr, "rank 0: %d ranks: %ld calls, %d failed checks\n", p, c.calls, c.fails);
out:
    free(c.in);
    free(c.want);
    free(c.snd);
    weft_test_gbuf_free(&c.rcvg);
    return rc;
}

/* Runs one job.  algo: WEFT_ALGO for it (NULL unsets it, whatever the
 * caller's environment says: the cost model picks among all); force: the
 * algorithm that implies (-1: none).  WEFT_COLL_ONLY=matrix,allreduce,
 * bitwise,nan,nonblocking,group,p2p narrows a run while debugging. */
static void run_job(int p, int timeout_s, const char *algo, int force, const char *only)
{
    if (algo)
        setenv("WEFT_ALGO", algo, 1);
    else
        unsetenv("WEFT_ALGO");
    const char *env = getenv("WEFT_COLL_ONLY");
    struct job jb = {env && *env ? env : only, algo, force};
    int rc = weft_test_run(p, timeout_s, coll_body, &jb);
    cr_assert_eq(rc, 0, "the %d-rank collective job%s%s failed (see the rank messages above)", p,
                 algo ? " with WEFT_ALGO=" : "", algo ? algo : "");
}

static void run_ranks(int p, int timeout_s)
{
    run_job(p, timeout_s, NULL, -1, NULL);
}

Test(coll, ranks_1, .timeout = 200) { run_ranks(1, 180); }
Test(coll, ranks_2, .timeout = 200) { run_ranks(2, 180); }
Test(coll, ranks_3, .timeout = 200) { run_ranks(3, 180); }
Test(coll, ranks_4, .timeout = 200) { run_ranks(4, 180); }
Test(coll, ranks_5, .timeout = 200) { run_ranks(5, 180); }
Test(coll, ranks_7, .timeout = 200) { run_ranks(7, 180); }
Test(coll, ranks_8, .timeout = 200) { run_ranks(8, 180); }

/* The same matrix with the pipeline cut fine (many chunks per operation,
 * few staging slots) and with several TCP streams per peer.  Parameters
 * are read once per process, and each Test runs in its own. */
Test(coll, ranks_4_chunk_4k_slots_2, .timeout = 200)
{
    setenv("WEFT_CHUNK_SIZE", "4096", 1);
    setenv("WEFT_STAGING_SLOTS", "2", 1);
    run_ranks(4, 180);
}

Test(coll, ranks_5_streams_4_chunk_64k, .timeout = 200)
{
    setenv("WEFT_SOCKET_NSTREAMS", "4", 1);
    setenv("WEFT_CHUNK_SIZE", "65536", 1);
    run_ranks(5, 180);
}

Test(coll, ranks_2_chunk_256, .timeout = 200)
{
    setenv("WEFT_CHUNK_SIZE", "256", 1);
    run_ranks(2, 180);
}

/* The allreduce matrix, bitwise identity and operand order under each
 * algorithm forced (other collectives have only the ring).  "^rd" is the
 * exclusion syntax for the same thing as "ring". */
#define ALGO_PARTS "allreduce,bitwise,nan"
Test(algo, rd_2, .timeout = 200) { run_job(2, 180, "rd", WEFT_ALGO_RD, ALGO_PARTS); }
Test(algo, rd_3, .timeout = 200) { run_job(3, 180, "rd", WEFT_ALGO_RD, ALGO_PARTS); }
Test(algo, rd_4, .timeout = 200) { run_job(4, 180, "rd", WEFT_ALGO_RD, ALGO_PARTS); }
Test(algo, rd_5, .timeout = 200) { run_job(5, 180, "rd", WEFT_ALGO_RD, ALGO_PARTS); }
Test(algo, rd_7, .timeout = 200) { run_job(7, 180, "rd", WEFT_ALGO_RD, ALGO_PARTS); }
Test(algo, rd_8, .timeout = 200) { run_job(8, 180, "rd", WEFT_ALGO_RD, ALGO_PARTS); }
Test(algo, ring_2, .timeout = 200) { run_job(2, 180, "ring", WEFT_ALGO_RING, ALGO_PARTS); }
Test(algo, ring_3, .timeout = 200) { run_job(3, 180, "^rd", WEFT_ALGO_RING, ALGO_PARTS); }
Test(algo, ring_4, .timeout = 200) { run_job(4, 180, "ring", WEFT_ALGO_RING, ALGO_PARTS); }
Test(algo, ring_5, .timeout = 200) { run_job(5, 180, "^rd", WEFT_ALGO_RING, ALGO_PARTS); }
Test(algo, ring_7, .timeout = 200) { run_job(7, 180, "ring", WEFT_ALGO_RING, ALGO_PARTS); }
Test(algo, ring_8, .timeout = 200) { run_job(8, 180, "ring", WEFT_ALGO_RING, ALGO_PARTS); }

/* Recursive doubling pipelined over many chunks with few staging slots,
 * with ranks folded in and out (5 is not a power of two). */
Test(algo, rd_5_chunk_4k_slots_2, .timeout = 200)
{
    setenv("WEFT_CHUNK_SIZE", "4096", 1);
    setenv("WEFT_STAGING_SLOTS", "2", 1);
    run_job(5, 180, "rd", WEFT_ALGO_RD, ALGO_PARTS);
}

/* Chunks larger than what the sockets buffer: recursive doubling must not
 * need the kernel to hold a whole chunk while both partners send (the
 * ring never does).  A hang shows as the engine's timeout. */
Test(algo, rd_small_socket_buffers, .timeout = 100)
{
    setenv("WEFT_SOCKET_BUFSIZE", "65536", 1);
    setenv("WEFT_TIMEOUT_MS", "10000", 1);
    run_job(2, 60, "rd", WEFT_ALGO_RD, "rdbig");
}
