/*
 * tune.c - algorithm selection: WEFT_ALGO's syntax, and the choice itself,
 * made by running every candidate's schedules through the alpha-beta-gamma
 * simulator on the communicator's link table (its per-pair alpha and beta:
 * defaults, refined by the init calibration, overridden by a topology
 * file).  The simulator predicts; it does not have to be exact, only to
 * rank the candidates the way the machine does.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "select/sim.h"
#include "select/tune.h"


int weft_tune_coll_from_name(const char *name, size_t len)
{
    static const char *const names[] = {
        [WEFT_COLL_ALLREDUCE] = "allreduce", [WEFT_COLL_REDUCE_SCATTER] = "reducescatter",
        [WEFT_COLL_ALLGATHER] = "allgather", [WEFT_COLL_BROADCAST] = "broadcast",
        [WEFT_COLL_REDUCE] = "reduce",
    };
    for (int c = 0; c < (int)WEFT_ARRAY_SIZE(names); c++)
        if (strncasecmp(name, names[c], len) == 0 && names[c][len] == '\0')
            return c;
    return -1;
}

/* "rhd" -> both of rhd's plan bits, "rhd/doubling" -> one; 0 unknown. */
static unsigned plan_bits(const char *tok, size_t n)
{
    const char *slash = memchr(tok, '/', n);
    size_t fl = slash ? (size_t)(slash - tok) : n;
    int a = weft_algo_from_name(tok, fl);
    if (a < 0)
        return 0;
    if (!slash)
        return WEFT_PLAN_FAMILY(a);
    int v = weft_algo_variant_from_name(a, slash + 1, n - fl - 1);
    return v < 0 ? 0 : WEFT_PLAN_BIT(a, v);
}

/* One list ("ring,tree", "^tree") -> mask; false with the bad name. */
static bool parse_list(const char *tok, size_t len, unsigned *mask, char *bad, size_t badlen)
{
    unsigned named = 0;
    bool exclude = len > 0 && tok[0] == '^';
    for (size_t i = exclude; i < len;) {
        size_t n = 0;
        while (i + n < len && tok[i + n] != ',')
            n++;
        if (n > 0) {
            unsigned bits = plan_bits(tok + i, n);
            if (bits == 0) {
                snprintf(bad, badlen, "%.*s", (int)WEFT_MIN(n, (size_t)60), tok + i);
                return false;
            }
            named |= bits;
        }
        i += n + 1;
    }
    *mask = exclude ? WEFT_PLAN_ALL & ~named : named;
    return true;
}

weft_status_t weft_tune_parse_algo(const char *spec, unsigned masks[WEFT_COLL_COUNT])
{
    unsigned m[WEFT_COLL_COUNT];
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        m[c] = WEFT_PLAN_ALL;
    for (const char *e = spec ? spec : ""; *e;) {
        size_t len = strcspn(e, ";");
        const char *colon = memchr(e, ':', len);
        int coll = -1;
        const char *list = e;
        if (colon) {
            coll = weft_tune_coll_from_name(e, (size_t)(colon - e));
            if (coll < 0)
                return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                        "WEFT_ALGO=%s: unknown collective '%.*s' (available: "
                                        "allreduce, reducescatter, allgather, broadcast, reduce)",
                                        spec, (int)WEFT_MIN((size_t)(colon - e), (size_t)60), e);
            list = colon + 1;
        }
        size_t llen = len - (size_t)(list - e);
        char bad[64];
        unsigned mask;
        if (!parse_list(list, llen, &mask, bad, sizeof(bad)))
            return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                    "WEFT_ALGO=%s: unknown algorithm '%s' (available: ring, "
                                    "tree, rhd, direct, hier; variants: rhd/rabenseifner, "
                                    "rhd/doubling, tree/double, tree/binomial, hier/ring, "
                                    "hier/rhd)", spec, bad);
        if (mask == 0 && llen > 0)
            return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                    "WEFT_ALGO=%s: '%.*s' leaves no algorithm (available: ring, "
                                    "tree, rhd, direct, hier)", spec, (int)WEFT_MIN(len, (size_t)60), e);
        if (llen > 0)
            for (int c = 0; c < WEFT_COLL_COUNT; c++)
                if (coll < 0 || c == coll)
                    m[c] = mask;
        e += len + (e[len] == ';');
    }
    memcpy(masks, m, sizeof(m));
    return WEFT_OK;
}

const char *weft_plan_name(struct weft_plan pl, char *buf, size_t len)
{
    const char *v = weft_algo_variant_name(pl.algo, pl.variant);
    snprintf(buf, len, "%s%s%s", weft_algo_name(pl.algo), v ? "/" : "", v ? v : "");
    return buf;
}

int weft_tune_class(size_t bytes)
{
    if (bytes == 0)
        return 0;
    /* Two classes per power of two: [2^k, 1.5 * 2^k) and [1.5 * 2^k, 2^(k+1)). */
    int k = 63 - __builtin_clzll((unsigned long long)bytes);
    int half = k >= 1 && ((bytes >> (k - 1)) & 1u);
    int cls = 1 + 2 * k + half;
    return cls < WEFT_TUNE_CLASSES ? cls : WEFT_TUNE_CLASSES - 1;
}

size_t weft_tune_class_bytes(int cls)
{
    if (cls <= 0)
        return 0;
    int k = (cls - 1) / 2;
    size_t b = (size_t)1 << k;
    return (cls - 1) % 2 ? b + b / 2 : b;
}

static void table_link(const void *ctx, int i, int j, double *alpha, double *beta)
{
    struct weft_link l = {0};
    weft_topo_table_get(ctx, i, j, &l);
    *alpha = l.alpha;
    *beta = l.beta;
}

/* Plan pl's simulated call: seconds INFINITY when it cannot be built. */
static struct weft_sim_result predict(const struct weft_tune_in *in, struct weft_plan pl,
                                      int coll, size_t bytes, size_t esize)
{
    struct weft_sim_model m = {
        .link = table_link, .ctx = in->links, .gamma = in->gamma, .copy = in->gamma / 2,
        .esize = esize, .cpu_group = in->cpu_group, .group_cores = in->group_cores,
        .host = in->links->host,
    };
    size_t count = bytes / esize;
    /* At most ~16 chunks a message: the simulation's cost grows with the
     * steps, and deeper pipelines change the prediction little (the first
     * selections of a job with 4 KiB chunks spent seconds simulating). */
    size_t chunk = WEFT_MAX(in->chunk_bytes / esize, count / 16);
    struct weft_coll_desc d = {
        .coll = coll, .rank = 0, .nranks = in->nranks, .root = 0, .count = count,
        .chunk = WEFT_MAX(chunk, 1), .algo = pl.algo, .variant = pl.variant,
        .node = in->links ? in->links->host : NULL, .nnodes = in->links ? in->links->nhosts : 0,
    };
    struct weft_sim_result r;
    if (weft_sim_run(&d, &m, &r) != WEFT_OK || !isfinite(r.seconds))
        return (struct weft_sim_result){.seconds = INFINITY};
    return r;
}

/* Every plan of mask that builds coll, best predicted first (ties keep
 * the family order: the ring first), with its prediction and, when ports
 * is not NULL, its busiest port's load; how many.  Twins of an earlier
 * plan are left out (weft_tune_ranked). */
static int ranked(const struct weft_tune_in *in, unsigned mask, int coll, size_t bytes,
                  size_t esize, struct weft_plan *plans, double *secs, double *ports)
{
    struct weft_sim_result seen[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    int n = 0;
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        for (int v = 0; v < WEFT_VAR_COUNT; v++) {
            if (!(mask & WEFT_PLAN_BIT(a, v)) || !weft_algo_serves(a, v, coll))
                continue;
            struct weft_plan pl = {a, v};
            struct weft_sim_result r = predict(in, pl, coll, bytes, esize);
            bool twin = false;
            for (int j = 0; j < n && isfinite(r.seconds) && !twin; j++)
                twin = seen[j].shape == r.shape && seen[j].seconds == r.seconds &&
                       seen[j].port_seconds == r.port_seconds;
            if (twin)
                continue;
            int i = n++;
            for (; i > 0 && r.seconds < secs[i - 1]; i--) {
                plans[i] = plans[i - 1];
                secs[i] = secs[i - 1];
                seen[i] = seen[i - 1];
                if (ports)
                    ports[i] = ports[i - 1];
            }
            plans[i] = pl;
            secs[i] = r.seconds;
            seen[i] = r;
            if (ports)
                ports[i] = r.port_seconds;
        }
    return n;
}

/* Ranked plans for the call, from the automatic choice when mask builds
 * none (*fell_back). */
static int candidates(const struct weft_tune_in *in, int coll, size_t bytes, size_t esize,
                      struct weft_plan *plans, double *secs, double *ports, bool *fell_back)
{
    *fell_back = false;
    int n = ranked(in, in->mask, coll, bytes, esize, plans, secs, ports);
    if (n == 0) {
        *fell_back = true;
        n = ranked(in, WEFT_PLAN_ALL, coll, bytes, esize, plans, secs, ports);
    }
    return n;
}

int weft_tune_ranked(const struct weft_tune_in *in, int coll, size_t bytes, size_t esize,
                     struct weft_plan *plans, double *secs, double *ports, bool *fell_back)
{
    *fell_back = false;
    if (in->nranks < 2 || esize == 0)
        return 0;
    return candidates(in, coll, bytes, esize, plans, secs, ports, fell_back);
}

struct weft_plan weft_tune_select(const struct weft_tune_in *in, int coll, size_t bytes,
                                  size_t esize, double *seconds, bool *fell_back)
{
    const struct weft_plan ring = {WEFT_ALGO_RING, 0};
    struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    double secs[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    bool fb;
    int n = weft_tune_ranked(in, coll, bytes, esize, plans, secs, NULL, &fb);
    if (fell_back)
        *fell_back = fb;
    if (seconds)
        *seconds = n > 0 ? secs[0] : 0;
    return n > 0 ? plans[0] : ring;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median of v[0..n), which it sorts; INFINITY when n is 0. */
static double median(double *v, int n)
{
    if (n == 0)
        return INFINITY;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int weft_tune_run_calls(const struct weft_tune_measure *m)
{
    return m->reps / m->rounds;
}

int weft_tune_trial_cand(const struct weft_tune_measure *m, int i)
{
    return i / weft_tune_run_calls(m) % m->ncand;
}

/* The calls of a run that count (tune.h), given where it was cut:
 * [*from, *to). */
static void run_span(const bool *cut, int run, int *from, int *to)
{
    int best = 0, len = 0;
    for (int s = 0, e; s < run; s = e) {
        for (e = s + 1; e < run && !cut[e]; e++)
            ;
        if (e - s > len)
            best = s, len = e - s;
    }
    *from = 0, *to = run;
    if (2 * len >= run)
        *from = best, *to = best + len;
}

int weft_tune_decide(const struct weft_tune_measure *m, const double *all, int nranks,
                     double *per_cand)
{
    int trials = m->ncand * m->reps, run = weft_tune_run_calls(m), best = 0;
    /* Whether a stretch's first call is left out (see tune.h). */
    bool rooted = m->coll == WEFT_COLL_BROADCAST || m->coll == WEFT_COLL_REDUCE;
    double tbest = INFINITY;
    for (int c = 0; c < m->ncand; c++) {
        /* Round q ran candidate c as calls (q * ncand + c) * run onwards,
         * run of them back to back behind a barrier. */
        double rounds[WEFT_TUNE_MAX_ROUNDS];
        int nr = 0;
        for (int q = 0; q < m->rounds; q++) {
            int first = (q * m->ncand + c) * run, from, to;
            /* A cut on one rank (its pause) is felt by all. */
            bool cut[WEFT_TUNE_MAX_REPS] = {false};
            for (int k = 0; k < nranks; k++)
                for (int i = 1; i < run; i++) {
                    double t = all[(size_t)k * (size_t)trials + (size_t)(first + i)];
                    cut[i] |= isfinite(t) && signbit(t);
                }
            run_span(cut, run, &from, &to);
            from += !rooted && to - from > 1;
            double slowest = -1;
            for (int k = 0; k < nranks; k++) {
                const double *t = all + (size_t)k * (size_t)trials + (size_t)first;
                double sum = 0;
                int n = 0;
                for (int i = from; i < to; i++)
                    if (isfinite(t[i]))
                        sum += fabs(t[i]), n++;
                if (n > 0)
                    slowest = fmax(slowest, sum / n);
            }
            if (slowest >= 0)
                rounds[nr++] = slowest;
        }
        double tc = fmax(median(rounds, nr), m->floor[c]);
        if (per_cand)
            per_cand[c] = tc;
        if (tc < tbest) {
            tbest = tc;
            best = c;
        }
    }
    return best;
}

int weft_tune_esize_index(size_t esize)
{
    return esize >= 8 ? 3 : esize >= 4 ? 2 : esize >= 2 ? 1 : 0;
}

void weft_tune_cache_store(struct weft_tune_cache *c, int coll, int e, int cls,
                           struct weft_plan pl)
{
    atomic_store_explicit(&c->plan[coll][e][cls], 0x10000 | pl.variant << 8 | pl.algo,
                          memory_order_release);
}

/* WEFT_TUNE_TRIALS -1: as many rounds (1 to 3) as runs of 8 calls fit
 * WEFT_TUNE_BUDGET by the model's clock, each run about WEFT_TUNE_RUN_SECS
 * (8 to 80 calls): long enough to reach a loop's steady state and spread
 * what a run's start costs.  docs/tuning.md has the measurements. */
void weft_tune_shape(int ncand, double secs, int64_t *reps, int64_t *rounds)
{
    double per = WEFT_TUNE_BUDGET / (ncand * secs * WEFT_TUNE_RUN_MIN);
    double calls = ceil(WEFT_TUNE_RUN_SECS / secs);
    int64_t run = calls >= WEFT_TUNE_RUN_MAX   ? WEFT_TUNE_RUN_MAX
                  : calls <= WEFT_TUNE_RUN_MIN ? WEFT_TUNE_RUN_MIN
                                               : (int64_t)calls;
    *rounds = per >= WEFT_TUNE_MAX_ROUNDS ? WEFT_TUNE_MAX_ROUNDS : per >= 2 ? (int64_t)per : 1;
    *reps = *rounds * run;
}

/* How many of the ranked plans get timed: 0 when measuring is off. */
int weft_tune_measured(const double *secs, int n)
{
    int64_t most = weft_param_int("WEFT_TUNE_CANDIDATES");
    int k = 0;
    if (weft_param_int("WEFT_TUNE_TRIALS") == 0)
        return 0;
    while (k < n && k < WEFT_MIN(most, WEFT_TUNE_MAX_CANDS) && isfinite(secs[k]) &&
           secs[k] <= WEFT_TUNE_SPREAD * secs[0])
        k++;
    return k;
}

/* A new measurement of the class over plans[0..n) (their predictions and
 * busiest ports' loads alongside), or NULL (fewer than two candidates,
 * measuring off, no memory: the prediction stands). */
struct weft_tune_measure *weft_tune_measure_new(int coll, int e, int cls,
                                                const struct weft_plan *plans, const double *secs,
                                                const double *ports, int n)
{
    int64_t reps = weft_param_int("WEFT_TUNE_TRIALS"), rounds;
    int k = weft_tune_measured(secs, n);
    if (k < 2)
        return NULL;
    if (reps < 0) {
        weft_tune_shape(k, secs[0], &reps, &rounds);
    } else {
        /* Rounds of at least 2 calls; reps a multiple of the rounds. */
        reps = WEFT_MIN(reps, WEFT_TUNE_MAX_REPS);
        rounds = WEFT_MAX(WEFT_MIN(reps / 2, WEFT_TUNE_MAX_ROUNDS), 1);
        reps = reps / rounds * rounds;
    }
    struct weft_tune_measure *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->coll = coll;
    m->esize_idx = e;
    m->cls = cls;
    m->ncand = k;
    m->rounds = (int)rounds;
    m->reps = (int)reps;
    for (int i = 0; i < k; i++) {
        m->cand[i] = plans[i];
        m->predicted[i] = secs[i];
        m->floor[i] = ports[i];
    }
    return m;
}

void weft_tune_cache_free(struct weft_tune_cache *c)
{
    for (int k = 0; k < WEFT_COLL_COUNT; k++) {
        atomic_store(&c->warned[k], 0);
        for (int e = 0; e < 4; e++)
            for (int cls = 0; cls < WEFT_TUNE_CLASSES; cls++) {
                atomic_store(&c->plan[k][e][cls], 0);
                free(c->measure[k][e][cls]);
                c->measure[k][e][cls] = NULL;
            }
    }
}
