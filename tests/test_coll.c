/*
 * test_coll.c - every collective over TCP with real processes: ranks
 * {1,2,3,4,5,7,8} x counts {0, 1, p-1, p+1, large odd} x every datatype x
 * every op, out of place and in place, checked exactly against values this
 * file computes itself; then bitwise identity across ranks for inexact
 * float sums and operand order.  Non-blocking requests, groups and point
 * to point are in test_p2p.c.
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
#include "engine_impl.h"         /* the engine's staging slots */
#include "harness.h"
#include "select/tune.h"
#include "tc_job.h"

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

/* Poisons the receive buffer and copies this rank's input (bytes of it)
 * to where a reducing call reads it: the receive buffer in place, the
 * send buffer otherwise.  Returns that buffer. */
static uint8_t *stage_input(struct tc *c, bool inplace, size_t bytes)
{
    poison_rcv(c, bytes);
    uint8_t *src = inplace ? c->rcv : c->snd;
    memcpy(src, c->in, bytes);
    return src;
}

/* An out-of-place call must leave its send buffer (bytes) as staged. */
static void check_sendbuf(struct tc *c, const char *what, bool inplace, size_t bytes)
{
    if (!inplace && memcmp(c->snd, c->in, bytes) != 0)
        report(c, "%s: sendbuf was modified", what);
}

static int run_allreduce(struct tc *c, weft_dtype_t dt, weft_op_t op)
{
    size_t es = weft_dtype_size(dt), counts[5], nc = counts_of(c->p, LARGE, counts);
    char what[160];
    for (size_t k = 0; k < nc; k++) {
        size_t n = counts[k];
        for (int inplace = 0; inplace < 2; inplace++) {
            snprintf(what, sizeof(what), "allreduce p=%d n=%zu %s%s", c->p, n,
                     weft_test_op_name(op), inplace ? " in place" : "");
            uint8_t *src = stage_input(c, inplace, n * es);
            CALL(c, what, weft_allreduce(src, c->rcv, n, dt, op, c->comm));
            check_sendbuf(c, what, inplace, n * es);
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
            uint8_t *src = stage_input(c, inplace, total * es);
            /* In place, this rank's block stays where it sits in the input. */
            uint8_t *dst = inplace ? c->rcv + mine : c->rcv;
            CALL(c, what, weft_reduce_scatter(src, dst, n, dt, op, c->comm));
            check_sendbuf(c, what, inplace, total * es);
            check_vals(c, what, dst, c->want + mine, dt, n);
            check_guards(c, what, inplace ? total * es : n * es);
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
                uint8_t *src = stage_input(c, inplace, n * es);
                CALL(c, what, weft_reduce(src, c->rcv, n, dt, op, root, c->comm));
                check_sendbuf(c, what, inplace, n * es);
                if (c->rank == root)
                    check_vals(c, what, c->rcv, c->want, dt, n);
                else if (inplace && memcmp(c->rcv, c->in, n * es) != 0)
                    report(c, "%s: a non-root's buffer was modified", what);
                else if (!inplace && !weft_test_gbuf_untouched(&c->rcvg, n * es))
                    report(c, "%s: recvbuf written on a non-root rank", what);
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
    unsigned want[WEFT_COLL_COUNT];
    if (weft_tune_parse_algo(seen, want) != WEFT_OK)
        return weft_test_fail(c->rank, "WEFT_ALGO=%s does not parse: %s", seen,
                              weft_thread_last_error());
    for (int coll = 0; coll < WEFT_COLL_SEND; coll++) {
        unsigned fam = jb->force >= 0 ? WEFT_PLAN_FAMILY(jb->force) : want[coll];
        if (c->comm->algos[coll] != want[coll] || want[coll] != fam)
            return weft_test_fail(c->rank, "WEFT_ALGO=%s: the communicator allows plans 0x%x "
                                  "for %s, expected 0x%x", seen, c->comm->algos[coll],
                                  weft_coll_name(coll), fam);
    }
    if (c->p == 1)
        return 0; /* one rank: nothing to choose */
    /* Each call runs an allowed plan whenever one builds the collective,
     * else a plan that does (the automatic choice). */
    static const size_t sizes[] = {0, 4, 8 * LARGE, (size_t)1 << 30};
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(sizes); i++) {
        for (int coll = 0; coll < WEFT_COLL_SEND; coll++) {
            /* Every plan the call may run: measured ones included. */
            struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
            int n = weft_tune_plans(c->comm, coll, sizes[i] / 4, 4, plans);
            bool any = false;
            for (int a = 0; a < WEFT_ALGO_COUNT; a++)
                for (int v = 0; v < WEFT_VAR_COUNT; v++)
                    any |= (want[coll] & WEFT_PLAN_BIT(a, v)) && weft_algo_serves(a, v, coll);
            for (int k = 0; k < n; k++) {
                struct weft_plan got = plans[k];
                char name[32];
                weft_plan_name(got, name, sizeof(name));
                if (!weft_algo_serves(got.algo, got.variant, coll))
                    return weft_test_fail(c->rank, "WEFT_ALGO=%s: a %s of %zu bytes gets %s, "
                                          "which cannot run it", seen, weft_coll_name(coll),
                                          sizes[i], name);
                if (any && !(want[coll] & WEFT_PLAN_BIT(got.algo, got.variant)))
                    return weft_test_fail(c->rank, "WEFT_ALGO=%s: a %s of %zu bytes runs %s, "
                                          "which it does not allow", seen,
                                          weft_coll_name(coll), sizes[i], name);
            }
        }
    }
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

static int coll_steps(struct tc *c, void *arg)
{
    const struct job *jb = arg;
    const char *only = jb->only;
    bool all = only == NULL;
    if (check_algo(c, jb))
        return 1;
    if ((all || strstr(only, "matrix")) && run_matrix(c))
        return 1;
    if (!all && strstr(only, "allreduce") && run_allreduce_matrix(c))
        return 1;
    if (!all && strstr(only, "rdbig") && run_rd_big(c))
        return 1;
    if ((all || strstr(only, "bitwise")) && run_bitwise(c))
        return 1;
    return (all || strstr(only, "nan")) && run_nan_order(c);
}

static int coll_body(weft_comm_t comm, int rank, int p, void *arg)
{
    return tc_job(comm, rank, p, coll_steps, arg);
}

/* Runs one job.  algo: WEFT_ALGO for it (NULL unsets it, whatever the
 * caller's environment says: the cost model picks among all); force: the
 * algorithm that implies (-1: none).  WEFT_COLL_ONLY=matrix,allreduce,
 * bitwise,nan narrows a run while debugging. */
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

/* Sets each NAME=value of a space-separated list in the environment.
 * Parameters are read once per process, and each Test runs in its own. */
static void set_params(const char *list)
{
    char buf[256];
    cr_assert_lt(strlen(list), sizeof(buf), "parameter list too long: %s", list);
    strcpy(buf, list);
    char *save = NULL;
    for (char *kv = strtok_r(buf, " ", &save); kv; kv = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(kv, '=');
        cr_assert_not_null(eq, "\"%s\" is not NAME=value", kv);
        *eq = '\0';
        setenv(kv, eq + 1, 1);
    }
}

/* The whole matrix on p ranks with params (see set_params) set. */
static void run_ranks_with(int p, const char *params)
{
    set_params(params);
    run_ranks(p, 180);
}

Test(coll, ranks_1, .timeout = 200) { run_ranks(1, 180); }
Test(coll, ranks_2, .timeout = 200) { run_ranks(2, 180); }
Test(coll, ranks_3, .timeout = 200) { run_ranks(3, 180); }
Test(coll, ranks_4, .timeout = 200) { run_ranks(4, 180); }
Test(coll, ranks_5, .timeout = 200) { run_ranks(5, 180); }
Test(coll, ranks_7, .timeout = 200) { run_ranks(7, 180); }
Test(coll, ranks_8, .timeout = 200) { run_ranks(8, 180); }

/* The same matrix with the pipeline cut fine (many chunks per operation,
 * few staging slots) and with several TCP streams per peer. */
Test(coll, ranks_4_chunk_4k_slots_2, .timeout = 200)
{
    run_ranks_with(4, "WEFT_CHUNK_SIZE=4096 WEFT_STAGING_SLOTS=2");
}
Test(coll, ranks_5_streams_4_chunk_64k, .timeout = 200)
{
    run_ranks_with(5, "WEFT_SOCKET_NSTREAMS=4 WEFT_CHUNK_SIZE=65536");
}

/* Ranks on one host talk through shared memory by default; the same
 * matrix over tcp alone, over shm alone, and mixed: one machine posing as
 * two or three hosts (shm inside each, tcp between). */
Test(coll, tcp_ranks_3, .timeout = 200) { run_ranks_with(3, "WEFT_TRANSPORT=tcp"); }
Test(coll, tcp_ranks_4, .timeout = 200) { run_ranks_with(4, "WEFT_TRANSPORT=^shm"); }
Test(coll, shm_only_ranks_5, .timeout = 200) { run_ranks_with(5, "WEFT_TRANSPORT=shm"); }
Test(coll, mixed_2_hosts_of_2, .timeout = 200) { run_ranks_with(4, "WEFT_TEST_HOSTS=2"); }
Test(coll, mixed_3_hosts_7_ranks, .timeout = 200) { run_ranks_with(7, "WEFT_TEST_HOSTS=3"); }
Test(coll, ranks_2_chunk_256, .timeout = 200) { run_ranks_with(2, "WEFT_CHUNK_SIZE=256"); }

/* The whole matrix (every collective, size, dtype, op and root), bitwise
 * identity and operand order under each algorithm family forced, over
 * shared memory, over tcp alone, and on one machine posing as two hosts
 * (shm inside each, tcp between: what hier is for).  A collective the
 * family does not build gets the automatic choice.  Variants are forced
 * by their own names.  "^rhd,tree,direct,hier" is the exclusion syntax for
 * the same thing as "ring". */
#define ALGO_PARTS "matrix,bitwise,nan"
static void run_forced(int p, const char *transport, const char *hosts, const char *algo,
                       int force)
{
    if (transport)
        setenv("WEFT_TRANSPORT", transport, 1);
    if (hosts)
        setenv("WEFT_TEST_HOSTS", hosts, 1);
    run_job(p, 180, algo, force, ALGO_PARTS);
}

/* The matrix over the verbs transport on the software verbs device
 * (tests/softverbs), each family forced: tests/verbs.sh runs this suite
 * with the device preloaded; without it, the suite skips.  "verbs" alone
 * leaves no other way between ranks; "shm,verbs" across posed hosts makes
 * verbs carry every byte between them. */
static void run_verbs(int p, const char *hosts, const char *algo, int force)
{
    if (!getenv("WEFT_TEST_SOFTVERBS"))
        cr_skip_test("needs the software verbs device preloaded (tests/verbs.sh)");
    setenv("WEFT_IB_TIMEOUT", "14", 1);
    run_forced(p, hosts ? "shm,verbs" : "verbs", hosts, algo, force);
}
Test(verbs, ring_4, .timeout = 300) { run_verbs(4, NULL, "ring", WEFT_ALGO_RING); }
Test(verbs, tree_5, .timeout = 300) { run_verbs(5, NULL, "tree", WEFT_ALGO_TREE); }
Test(verbs, rhd_3, .timeout = 300) { run_verbs(3, NULL, "rhd", WEFT_ALGO_RHD); }
Test(verbs, direct_4, .timeout = 300) { run_verbs(4, NULL, "direct", WEFT_ALGO_DIRECT); }
Test(verbs, hier_2_hosts_of_2, .timeout = 300) { run_verbs(4, "2", "hier", WEFT_ALGO_HIER); }
Test(verbs, auto_2_hosts_of_2, .timeout = 300) { run_verbs(4, "2", NULL, -1); }
/* The device emulates librdmacm too, so the tests above connect through
 * it (WEFT_IB_CM=auto); these two join queue pairs by hand over tcp. */
Test(verbs, oob_direct_5, .timeout = 300)
{
    setenv("WEFT_IB_CM", "oob", 1);
    run_verbs(5, NULL, "direct", WEFT_ALGO_DIRECT);
}
Test(verbs, oob_auto_2_hosts_of_2, .timeout = 300)
{
    setenv("WEFT_IB_CM", "oob", 1);
    run_verbs(4, "2", NULL, -1);
}
Test(verbs, qps_2_chunk_4k_regcache_rdmacm, .timeout = 300)
{
    setenv("WEFT_IB_QPS_PER_CONNECTION", "2", 1);
    setenv("WEFT_IB_REGCACHE", "1", 1);
    setenv("WEFT_IB_CM", "rdmacm", 1);
    setenv("WEFT_CHUNK_SIZE", "4096", 1);
    run_verbs(3, NULL, "ring", WEFT_ALGO_RING);
}

Test(algo, ring_shm_5, .timeout = 200) { run_forced(5, NULL, NULL, "ring", WEFT_ALGO_RING); }
Test(algo, ring_tcp_3, .timeout = 200)
{
    run_forced(3, "tcp", NULL, "^rhd,tree,direct,hier", WEFT_ALGO_RING);
}
Test(algo, ring_2_hosts_of_2, .timeout = 200) { run_forced(4, NULL, "2", "ring", WEFT_ALGO_RING); }
Test(algo, tree_shm_5, .timeout = 200) { run_forced(5, NULL, NULL, "tree", WEFT_ALGO_TREE); }
Test(algo, tree_tcp_4, .timeout = 200) { run_forced(4, "tcp", NULL, "tree", WEFT_ALGO_TREE); }
Test(algo, tree_2_hosts_of_2, .timeout = 200) { run_forced(4, NULL, "2", "tree", WEFT_ALGO_TREE); }
Test(algo, tree_binomial_shm_7, .timeout = 200)
{
    run_forced(7, NULL, NULL, "tree/binomial", -1);
}
Test(algo, rhd_shm_5, .timeout = 200) { run_forced(5, NULL, NULL, "rhd", WEFT_ALGO_RHD); }
Test(algo, rhd_tcp_4, .timeout = 200) { run_forced(4, "tcp", NULL, "rhd", WEFT_ALGO_RHD); }
Test(algo, rhd_2_hosts_of_2, .timeout = 200) { run_forced(4, NULL, "2", "rhd", WEFT_ALGO_RHD); }
Test(algo, rhd_rabenseifner_shm_7, .timeout = 200)
{
    run_forced(7, NULL, NULL, "rhd/rabenseifner", -1);
}
Test(algo, rhd_doubling_shm_6, .timeout = 200) { run_forced(6, NULL, NULL, "rhd/doubling", -1); }
Test(algo, direct_shm_5, .timeout = 200) { run_forced(5, NULL, NULL, "direct", WEFT_ALGO_DIRECT); }
Test(algo, direct_tcp_4, .timeout = 200) { run_forced(4, "tcp", NULL, "direct", WEFT_ALGO_DIRECT); }
Test(algo, direct_2_hosts_of_2, .timeout = 200)
{
    run_forced(4, NULL, "2", "direct", WEFT_ALGO_DIRECT);
}
Test(algo, hier_shm_5, .timeout = 200) { run_forced(5, NULL, NULL, "hier", WEFT_ALGO_HIER); }
Test(algo, hier_tcp_4, .timeout = 200) { run_forced(4, "tcp", NULL, "hier", WEFT_ALGO_HIER); }
Test(algo, hier_2_hosts_of_2, .timeout = 200) { run_forced(4, NULL, "2", "hier", WEFT_ALGO_HIER); }
Test(algo, hier_3_hosts_7_ranks, .timeout = 200)
{
    run_forced(7, NULL, "3", "hier", WEFT_ALGO_HIER);
}
Test(algo, hier_rhd_2_hosts_of_3, .timeout = 200) { run_forced(6, NULL, "2", "hier/rhd", -1); }
Test(algo, per_collective_syntax_5, .timeout = 200)
{
    run_forced(5, NULL, NULL, "allreduce:rhd;reducescatter:direct;allgather:rhd;broadcast:tree;"
               "reduce:tree/binomial", -1);
}

/* Recursive doubling pipelined over many chunks with few staging slots,
 * with ranks folded in and out (5 is not a power of two). */
Test(algo, rd_5_chunk_4k_slots_2, .timeout = 200)
{
    setenv("WEFT_CHUNK_SIZE", "4096", 1);
    setenv("WEFT_STAGING_SLOTS", "2", 1);
    run_job(5, 180, "rhd/doubling", -1, ALGO_PARTS);
}

/* Every family over many chunks and few staging slots, on 7 ranks. */
static void run_fine(int force)
{
    setenv("WEFT_CHUNK_SIZE", "4096", 1);
    setenv("WEFT_STAGING_SLOTS", "2", 1);
    run_job(7, 180, weft_algo_name(force), force, "matrix");
}
Test(algo, ring_7_chunk_4k_slots_2, .timeout = 200) { run_fine(WEFT_ALGO_RING); }
Test(algo, tree_7_chunk_4k_slots_2, .timeout = 200) { run_fine(WEFT_ALGO_TREE); }
Test(algo, rhd_7_chunk_4k_slots_2, .timeout = 200) { run_fine(WEFT_ALGO_RHD); }
Test(algo, direct_7_chunk_4k_slots_2, .timeout = 200) { run_fine(WEFT_ALGO_DIRECT); }
Test(algo, hier_7_chunk_4k_slots_2, .timeout = 200) { run_fine(WEFT_ALGO_HIER); }

/* Chunks larger than what the sockets buffer: recursive doubling must not
 * need the kernel to hold a whole chunk while both partners send (the
 * ring never does).  A hang shows as the engine's timeout. */
Test(algo, rd_small_socket_buffers, .timeout = 100)
{
    setenv("WEFT_SOCKET_BUFSIZE", "65536", 1);
    setenv("WEFT_TIMEOUT_MS", "10000", 1);
    run_job(2, 60, "rhd/doubling", -1, "rdbig");
}

/* ---- staging slots and the host's ranks ---------------------------------------- */

/* What a 2-rank job's engines should use: before, and after being told
 * that `local` ranks share the host. */
struct staging_case {
    int local, before, after;
};

/* Checks the slots in use, then a reduction of 24 chunks through them. */
static int staging_body(weft_comm_t comm, int rank, int nranks, void *arg)
{
    const struct staging_case *k = arg;
    struct weft_engine *eng = comm->eng;
    if (eng->nfree_slots != k->before)
        return weft_test_fail(rank, "%d staging slots in use, not %d", eng->nfree_slots,
                              k->before);
    weft_engine_tune(eng, k->local);
    if (eng->nfree_slots != k->after)
        return weft_test_fail(rank, "%d ranks on the host: %d staging slots, not %d", k->local,
                              eng->nfree_slots, k->after);
    size_t n = 24 * eng->chunk_bytes / sizeof(int32_t);
    int32_t *x = malloc(n * sizeof(*x)), *y = malloc(n * sizeof(*y));
    int bad = x == NULL || y == NULL;
    for (size_t i = 0; !bad && i < n; i++)
        x[i] = (int32_t)(i % 1000) + rank;
    if (!bad && weft_allreduce(x, y, n, WEFT_INT32, WEFT_SUM, comm) != WEFT_OK)
        bad = weft_test_fail(rank, "allreduce: %s", weft_last_error(comm));
    for (size_t i = 0; !bad && i < n; i++)
        if (y[i] != (int32_t)(nranks * (i % 1000)) + nranks * (nranks - 1) / 2)
            bad = weft_test_fail(rank, "element %zu: %d", i, y[i]);
    if (!bad && eng->nfree_slots != k->after)
        bad = weft_test_fail(rank, "%d staging slots free after the call", eng->nfree_slots);
    free(x);
    free(y);
    return bad;
}

/* 256 MiB of staging for the host's ranks together: 64 ranks use 8 of the
 * 16 slots of 512 KiB. */
Test(staging, slots_shrink_with_the_hosts_ranks, .timeout = 60)
{
    unsetenv("WEFT_STAGING_SLOTS");
    struct staging_case k = {64, 16, 8};
    cr_expect_eq(weft_test_run(2, 50, staging_body, &k), 0);
}

/* WEFT_STAGING_SLOTS set: every slot, however many ranks share the host. */
Test(staging, slots_as_set_whatever_the_ranks, .timeout = 60)
{
    setenv("WEFT_STAGING_SLOTS", "4", 1);
    struct staging_case k = {1024, 4, 4};
    cr_expect_eq(weft_test_run(2, 50, staging_body, &k), 0);
}
