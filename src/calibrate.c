/*
 * calibrate.c - a short ping-pong at init between ring neighbours (rank i
 * and i+1), fitted to alpha + beta * bytes (weft_topo_fit), so that the
 * link table starts from what this machine's links do rather than from
 * the built-in defaults.  Every rank learns every measured edge through
 * one bootstrap allgather, so all ranks hold the same table.
 *
 * Cost: three rounds (even edges, odd edges, the wrap-around edge), each
 * rank in at most one ping-pong per round; 30 round trips of 8 B to
 * 256 KiB per edge (up to three times over where the times fit no link).
 * WEFT_CALIBRATE=0 skips it.
 */
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "engine.h"
#include "select/topo.h"

#define CAL_MAX_BYTES (256u << 10)

static const struct {
    size_t bytes;
    int reps;
} cal_sizes[] = {{8, 16}, {4096, 8}, {65536, 4}, {CAL_MAX_BYTES, 2}};

#define CAL_POINTS (16 + 8 + 4 + 2)
#define CAL_TRIES 3 /* runs of one edge, while its fit is noise */

/* What the pinger of edge (i, i+1) publishes; plain numbers, checked on use. */
struct cal_result {
    double alpha, beta;
    int32_t transport; /* index in weft_transports[], or -1: not measured */
    int32_t pad;
};

/* Waits as the engine does (weft_engine_tune): spin, yielding the core
 * when ranks outnumber cores, then sleep in the transports. */
static weft_status_t cal_wait(struct weft_comm *comm, int peer, void *req, uint64_t deadline)
{
    uint64_t spin_ns, start = weft_now_ns();
    bool yield;
    weft_engine_spin(comm->eng, &spin_ns, &yield);
    for (;;) {
        int done = 0;
        WEFT_CHECK(comm->link_ops[peer]->test(req, &done, NULL));
        if (done)
            return WEFT_OK;
        uint64_t now = weft_now_ns();
        if (now - start < spin_ns) {
            if (yield)
                sched_yield();
            WEFT_CHECK(weft_comm_progress(comm, 0));
            continue;
        }
        if (now > deadline)
            return weft_error(weft_comm_err(comm), WEFT_ERR_TIMEOUT,
                              "rank %d: link calibration with rank %d: no answer within "
                              "WEFT_TIMEOUT_MS",
                              comm->rank, peer);
        WEFT_CHECK(weft_comm_progress(comm, 1));
    }
}

/* One message each way; *seconds gets half the round trip (pinger). */
static weft_status_t cal_exchange(struct weft_comm *comm, int peer, bool pinger, char *out,
                                  char *in, size_t bytes, uint64_t deadline, double *seconds)
{
    const struct weft_transport_ops *ops = comm->link_ops[peer];
    void *conn = comm->conns[peer], *rs = NULL, *rr = NULL;
    uint64_t t0 = weft_now_ns();
    if (pinger) {
        WEFT_CHECK(ops->isend(conn, out, bytes, &rs));
        WEFT_CHECK(ops->irecv(conn, in, bytes, &rr));
        WEFT_CHECK(cal_wait(comm, peer, rs, deadline));
        WEFT_CHECK(cal_wait(comm, peer, rr, deadline));
    } else {
        WEFT_CHECK(ops->irecv(conn, in, bytes, &rr));
        WEFT_CHECK(cal_wait(comm, peer, rr, deadline));
        WEFT_CHECK(ops->isend(conn, out, bytes, &rs));
        WEFT_CHECK(cal_wait(comm, peer, rs, deadline));
    }
    *seconds = (double)(weft_now_ns() - t0) * 0.5e-9;
    return WEFT_OK;
}

/* One ping-pong over every size, from either end; the pinger fits the
 * times.  *ok: the fit looks like a link. */
static weft_status_t cal_run(struct weft_comm *comm, int peer, bool pinger, char *buf,
                             uint64_t deadline, struct cal_result *res, bool *ok)
{
    double x[CAL_POINTS], y[CAL_POINTS];
    int n = 0;
    *ok = false;
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(cal_sizes); k++) {
        for (int rep = 0; rep <= cal_sizes[k].reps; rep++) { /* rep 0 warms up */
            double s;
            WEFT_CHECK(cal_exchange(comm, peer, pinger, buf, buf + CAL_MAX_BYTES,
                                    cal_sizes[k].bytes, deadline, &s));
            if (rep > 0 && pinger && s > 0) {
                x[n] = (double)cal_sizes[k].bytes;
                y[n++] = s;
            }
        }
    }
    /* A fit with no cost per byte is noise, not a link: the peer (or this
     * rank) was descheduled through the small sizes, as happens when ranks
     * outnumber cores. */
    if (pinger && weft_topo_fit(x, y, n, &res->alpha, &res->beta) == WEFT_OK && res->beta > 0)
        *ok = true;
    return WEFT_OK;
}

/* The ping-pong of one edge, from either end.  A run whose fit is noise
 * is run again, up to CAL_TRIES in all; after each, the pinger tells the
 * other end whether to go on (one more 8-byte exchange). */
static weft_status_t cal_edge(struct weft_comm *comm, int peer, bool pinger, char *buf,
                              uint64_t deadline, struct cal_result *res)
{
    char *out = buf, *in = buf + CAL_MAX_BYTES;
    for (int t = 1;; t++) {
        bool ok;
        double s;
        WEFT_CHECK(cal_run(comm, peer, pinger, buf, deadline, res, &ok));
        out[0] = (char)(pinger && (ok || t == CAL_TRIES));
        WEFT_CHECK(cal_exchange(comm, peer, pinger, out, in, 8, deadline, &s));
        bool done = pinger ? out[0] : in[0];
        if (pinger && !ok)
            WEFT_INFO(WEFT_SUB_INIT,
                      "rank %d: calibration with rank %d, try %d of %d: the times fit no link "
                      "(alpha %.2f us, beta %g s/B)%s",
                      comm->rank, peer, t, CAL_TRIES, res->alpha * 1e6, res->beta,
                      done ? "; it keeps the defaults" : "; again");
        if (done) {
            if (pinger && ok)
                res->transport = comm->link_kind[peer];
            return WEFT_OK;
        }
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Edge e joins e and e+1 (mod n).  Round 0: even e; round 1: odd e;
 * round 2: the wrap-around edge n-1 -> 0.  Each rank is in at most one
 * edge per round. */
static int edge_of_round(int round, int rank, int n, bool *pinger)
{
    int e = -1;
    if (round < 2) {
        if (rank % 2 == round && rank + 1 < n)
            e = rank, *pinger = true;
        else if ((rank - 1) % 2 == round && rank >= 1)
            e = rank - 1, *pinger = false;
    } else if (n > 2 && (rank == n - 1 || rank == 0)) {
        e = n - 1;
        *pinger = rank == n - 1;
    }
    return e;
}

weft_status_t weft_comm_calibrate(struct weft_comm *comm, struct weft_cal *cal, uint64_t deadline)
{
    int n = comm->nranks, rank = comm->rank;
    cal->nedges = 0;
    if (n < 2 || weft_param_int("WEFT_CALIBRATE") == 0)
        return WEFT_OK;
    uint64_t t0 = weft_now_ns();
    struct cal_result mine = {.transport = -1};
    struct cal_result *all = calloc((size_t)n, sizeof(*all));
    cal->edges = calloc((size_t)n, sizeof(*cal->edges));
    char *buf = malloc(2 * CAL_MAX_BYTES);
    weft_status_t st = WEFT_OK;
    if (all == NULL || cal->edges == NULL || buf == NULL) {
        /* The peers time out in the ping-pong and name this rank. */
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "rank %d: out of memory for calibration", rank);
        goto out;
    }
    memset(buf, 0x5a, 2 * CAL_MAX_BYTES); /* touched once, before any timing */
    for (int round = 0; round < 3; round++) {
        bool pinger = false;
        int e = edge_of_round(round, rank, n, &pinger);
        if (e < 0)
            continue;
        int peer = pinger ? (e + 1) % n : e;
        WEFT_CHECK_GOTO(cal_edge(comm, peer, pinger, buf, deadline, &mine), st, out);
    }
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bs, &mine, all, sizeof(mine), deadline), st,
                    out);
    double a[WEFT_MAX_TRANSPORTS][64], b[WEFT_MAX_TRANSPORTS][64];
    int na[WEFT_MAX_TRANSPORTS] = {0}, ntr = weft_transport_count();
    for (int e = 0; e < n; e++) {
        const struct cal_result *r = &all[e];
        /* Peers' numbers: a kind that carries no edge is refused. */
        if (r->transport < 0 || r->transport >= ntr ||
            !weft_transport_reaches_others(r->transport) || !isfinite(r->alpha) ||
            !isfinite(r->beta) || r->alpha < 0 || r->beta < 0)
            continue;
        cal->edges[cal->nedges++] = (struct weft_cal_edge){e, (e + 1) % n, r->transport, r->alpha,
                                                           r->beta};
        int t = r->transport;
        if (na[t] < 64) {
            a[t][na[t]] = r->alpha;
            b[t][na[t]++] = r->beta;
        }
    }
    for (int t = 0; t < ntr; t++) {
        cal->have[t] = na[t] > 0;
        if (!cal->have[t])
            continue;
        cal->alpha[t] = median(a[t], na[t]);
        cal->beta[t] = median(b[t], na[t]);
        WEFT_INFO(WEFT_SUB_INIT, "rank %d: calibrated %s: alpha %.2f us, %.2f GB/s (%d links, %.1f ms)",
                  rank, weft_transport_name(t), cal->alpha[t] * 1e6,
                  cal->beta[t] > 0 ? 1e-9 / cal->beta[t] : INFINITY, na[t],
                  (double)(weft_now_ns() - t0) / 1e6);
    }
out:
    free(buf);
    free(all);
    return st;
}

void weft_cal_free(struct weft_cal *cal)
{
    free(cal->edges);
    cal->edges = NULL;
    cal->nedges = 0;
}
