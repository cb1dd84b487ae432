/*
 * detsum.c - canonical-tree sums for the trainer (see detsum.h): the
 * tree allreduce and reduce-scatter over weft point-to-point calls, and
 * the binned sum of squares.
 */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "detsum.h"

static void add_into_f64(double *restrict dst, const double *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* ---- across ranks -------------------------------------------------------------- */

static _Thread_local char err_msg[200];
static _Thread_local bool err_own; /* err_msg explains the last failure */

static weft_status_t refuse(weft_status_t st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static weft_status_t refuse(weft_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err_msg, sizeof(err_msg), fmt, ap);
    va_end(ap);
    err_own = true;
    return st;
}

/* A failed weft call: its own message is in weft_last_error. */
static weft_status_t weft_failed(weft_status_t st)
{
    if (st != WEFT_OK)
        err_own = false;
    return st;
}

const char *det_last_error(weft_comm_t comm)
{
    return err_own ? err_msg : weft_last_error(comm);
}

/* Sends count elements of snd to peer and receives as many from it into
 * rcv, as one group so that neither order can deadlock. */
static weft_status_t exchange(weft_comm_t comm, const void *snd, void *rcv, size_t count,
                              weft_dtype_t dt, int peer)
{
    weft_status_t st = weft_group_start();
    if (st != WEFT_OK)
        return weft_failed(st);
    st = weft_send(snd, count, dt, peer, comm);
    if (st == WEFT_OK)
        st = weft_recv(rcv, count, dt, peer, comm);
    weft_status_t end = weft_group_end();
    return weft_failed(st != WEFT_OK ? st : end);
}

static void add_dt(void *dst, const void *src, size_t count, weft_dtype_t dt)
{
    if (dt == WEFT_FLOAT32)
        tacc_add_into(dst, src, count);
    else
        add_into_f64(dst, src, count);
}

static weft_status_t comm_shape(weft_comm_t comm, int *rank, int *n)
{
    weft_status_t st = weft_comm_rank(comm, rank);
    if (st == WEFT_OK)
        st = weft_comm_size(comm, n);
    return weft_failed(st);
}

/* out[i] = a[i] + b[i], i < n; out may be a. */
static void sum_dt(void *out, const void *a, const void *b, size_t n, weft_dtype_t dt)
{
    if (dt == WEFT_FLOAT32) {
        float *o = out;
        const float *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            o[i] = x[i] + y[i];
    } else {
        double *o = out;
        const double *x = a, *y = b;
        for (size_t i = 0; i < n; i++)
            o[i] = x[i] + y[i];
    }
}

/* Recursive doubling over a power-of-two n: after step d every rank holds
 * its aligned block of 2^(d+1) ranks summed as the two blocks of 2^d, the
 * canonical subtree.  scratch: count elements. */
static weft_status_t doubling(weft_comm_t comm, int r, int n, void *buf, size_t count,
                              weft_dtype_t dt, void *scratch)
{
    for (int step = 1; step < n && count > 0; step *= 2) {
        weft_status_t st = exchange(comm, buf, scratch, count, dt, r ^ step);
        if (st != WEFT_OK)
            return st;
        add_dt(buf, scratch, count, dt);
    }
    return WEFT_OK;
}

/*
 * Recursive halving over a power-of-two n > 1 of full (n chunks of s
 * elements): before step d rank r holds chunks c == r (mod 2^d), each the
 * sum of its aligned block of 2^d ranks; it keeps c == r (mod 2^(d+1)) and
 * hands the others to its partner, n / 2^(d+1) chunks each way.  The last
 * step sums chunk r into part (which may be that chunk).  scratch: n * s.
 */
static weft_status_t halving(weft_comm_t comm, int r, int n, void *full, void *part, size_t s,
                             weft_dtype_t dt, void *scratch)
{
    size_t cb = s * weft_dtype_size(dt); /* bytes a chunk */
    uint8_t *f = full, *snd = scratch, *rcv = snd + (size_t)n / 2 * cb;
    for (int step = 1; step < n; step *= 2) {
        int mod = 2 * step, p = r ^ step;
        size_t k = 0;
        for (int c = p % mod; c < n; c += mod, k++)
            memcpy(snd + k * cb, f + (size_t)c * cb, cb);
        weft_status_t st = exchange(comm, snd, rcv, k * s, dt, p);
        if (st != WEFT_OK)
            return st;
        if (mod == n) {
            sum_dt(part, f + (size_t)r * cb, rcv, s, dt);
            break;
        }
        k = 0;
        for (int c = r % mod; c < n; c += mod, k++)
            add_dt(f + (size_t)c * cb, rcv + k * cb, s, dt);
    }
    return WEFT_OK;
}

/* Below this many elements a rank, whole-vector doubling beats halving
 * plus allgather: log2(n) latencies instead of about twice as many. */
#define HALVING_MIN 2048

weft_status_t det_allreduce(weft_comm_t comm, void *buf, size_t count, weft_dtype_t dtype,
                            void *scratch)
{
    if (dtype != WEFT_FLOAT32 && dtype != WEFT_FLOAT64)
        return refuse(WEFT_ERR_INVALID_ARG, "det_allreduce: dtype %d is not float32 or float64",
                      (int)dtype);
    int r, n;
    weft_status_t st = comm_shape(comm, &r, &n);
    if (st != WEFT_OK || n == 1 || count == 0)
        return st;
    if ((n & (n - 1)) == 0) {
        size_t s = count / (size_t)n, es = weft_dtype_size(dtype);
        if (s < HALVING_MIN)
            return doubling(comm, r, n, buf, count, dtype, scratch);
        /* Every element is summed in the same tree by halving as by
         * doubling; the allgather only moves bits.  Each rank sends
         * 2 s (n - 1) elements instead of count log2(n). */
        uint8_t *b = buf;
        st = halving(comm, r, n, b, b + (size_t)r * s * es, s, dtype, scratch);
        if (st == WEFT_OK)
            st = weft_failed(weft_allgather(b + (size_t)r * s * es, b, s, dtype, comm));
        if (st != WEFT_OK)
            return st;
        return doubling(comm, r, n, b + (size_t)n * s * es, count - (size_t)n * s, dtype,
                        scratch);
    }
    /* Level by level as the definition reads: a rank that has sent its
     * subtree is done until the broadcast. */
    for (int step = 1; step < n; step *= 2) {
        if (r % (2 * step) != 0) {
            st = weft_failed(weft_send(buf, count, dtype, r - step, comm));
            break;
        }
        if (r + step < n) {
            st = weft_failed(weft_recv(scratch, count, dtype, r + step, comm));
            if (st != WEFT_OK)
                break;
            add_dt(buf, scratch, count, dtype);
        }
    }
    if (st != WEFT_OK)
        return st;
    return weft_failed(weft_broadcast(buf, buf, count, dtype, 0, comm));
}

weft_status_t det_reduce_scatter(weft_comm_t comm, float *full, float *part, size_t s,
                                 float *scratch)
{
    int r, n;
    weft_status_t st = comm_shape(comm, &r, &n);
    if (st != WEFT_OK)
        return st;
    if (n & (n - 1))
        return refuse(WEFT_ERR_UNSUPPORTED,
                      "det_reduce_scatter: %d ranks: the canonical tree needs a power of two", n);
    if (n == 1) {
        memmove(part, full, s * sizeof(float));
        return WEFT_OK;
    }
    if (s == 0)
        return WEFT_OK;
    return halving(comm, r, n, full, part, s, WEFT_FLOAT32, scratch);
}

/* ---- order-free sum of squares ---------------------------------------------------- */

void xsq_add(int64_t *bins, const float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float g = x[i] * scale;
        if (!isfinite(g)) {
            bins[isnan(g) ? XSQ_NAN : XSQ_INF]++;
            continue;
        }
        if (g == 0)
            continue;
        /* Exact: 24-bit significands square into 48 bits, and squares of
         * floats are normal doubles, so the bits give frexp's m and e. */
        double sq = (double)g * (double)g;
        uint64_t b;
        memcpy(&b, &sq, sizeof(b));
        int e = (int)((b >> 52) & 0x7ff) - 1022;
        uint64_t m53 = (b & ((UINT64_C(1) << 52) - 1)) | (UINT64_C(1) << 52); /* m * 2^53 */
        bins[e - XSQ_EMIN] += (int64_t)(m53 >> 22);                           /* m * 2^31 */
    }
}

double xsq_total(const int64_t *bins)
{
    if (bins[XSQ_NAN])
        return NAN;
    if (bins[XSQ_INF])
        return INFINITY;
    double t = 0;
    for (int k = 0; k < XSQ_NAN; k++)
        if (bins[k])
            t += ldexp((double)bins[k], k + XSQ_EMIN - 31);
    return t;
}
