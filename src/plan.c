/*
 * plan.c - a communicator's plan per call: the cache of chosen plans per
 * size class, where each choice comes from (WEFT_ALGO, the tuning file,
 * the model, or trials that time the best predicted candidates in the
 * program's own calls), and the tuning file's table shared at init.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm.h"
#include "engine_impl.h"
#include "plan.h"
#include "select/tune_file.h"

static struct weft_tune_in tune_in(struct weft_comm *comm, int coll)
{
    return (struct weft_tune_in){
        .nranks = comm->nranks, .links = &comm->topo, .chunk_bytes = comm->eng->chunk_bytes,
        .gamma = WEFT_TUNE_GAMMA, .mask = comm->algos[coll], .cpu_group = comm->cpu_group,
        .group_cores = comm->group_cores,
    };
}

/* The size class of count elements of esize bytes. */
static int class_of(size_t count, size_t esize)
{
    return weft_tune_class(count > SIZE_MAX / (esize ? esize : 1) ? SIZE_MAX : count * esize);
}

/* The plans comm allows for coll on class cls, best predicted first, with
 * their predictions (and busiest ports' loads, ports may be NULL); 0 when
 * there is nothing to choose (one rank, no element size). */
static int class_plans(struct weft_comm *comm, int coll, int cls, size_t esize,
                       struct weft_plan *plans, double *secs, double *ports, bool *fell_back)
{
    struct weft_tune_in in = tune_in(comm, coll);
    return weft_tune_ranked(&in, coll, weft_tune_class_bytes(cls), esize, plans, secs, ports,
                            fell_back);
}

/* Where a class's plan comes from when it is not measured. */
enum source { FROM_MODEL, FROM_FILE, FROM_MASK };

/* Whether mask allows exactly one plan that builds coll. */
static bool one_allowed(unsigned mask, int coll)
{
    int k = 0;
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        for (int v = 0; v < WEFT_VAR_COUNT; v++)
            k += (mask & WEFT_PLAN_BIT(a, v)) && weft_algo_serves(a, v, coll);
    return k == 1;
}

/* The tuning file's plan for the class, when comm's algorithms allow it
 * (any, when they allow nothing that runs coll) and it builds coll here. */
static bool file_plan(struct weft_comm *comm, int coll, int cls, size_t esize, bool fell_back,
                      struct weft_plan *out)
{
    const struct weft_tune_table *t = &comm->tune.file;
    int v = t->path[0] ? t->plan[coll][weft_tune_esize_index(esize)][cls] : -1;
    if (v < 0)
        return false;
    struct weft_plan pl = {v / WEFT_VAR_COUNT, v % WEFT_VAR_COUNT}, p[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    if (!fell_back && !(comm->algos[coll] & WEFT_PLAN_BIT(pl.algo, pl.variant)))
        return false;
    struct weft_tune_in in = tune_in(comm, coll);
    double secs[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    bool fb;
    in.mask = WEFT_PLAN_BIT(pl.algo, pl.variant);
    if (weft_tune_ranked(&in, coll, weft_tune_class_bytes(cls), esize, p, secs, NULL, &fb) == 0 ||
        fb)
        return false;
    *out = pl;
    return true;
}

/* The class's plans as class_plans ranks them, and where the choice
 * comes from: the one plan WEFT_ALGO allows, the tuning file's (*chosen),
 * or the model (plans[0], unless the class is measured). */
static int class_choice(struct weft_comm *comm, int coll, int cls, size_t esize,
                        struct weft_plan *plans, double *secs, double *ports, bool *fell_back,
                        enum source *src, struct weft_plan *chosen)
{
    int n = class_plans(comm, coll, cls, esize, plans, secs, ports, fell_back);
    *chosen = n > 0 ? plans[0] : (struct weft_plan){WEFT_ALGO_RING, 0};
    *src = FROM_MODEL;
    if (n > 0 && !*fell_back && one_allowed(comm->algos[coll], coll))
        *src = FROM_MASK;
    else if (n > 0 && weft_tune_class_bytes(cls) > 0 &&
             file_plan(comm, coll, cls, esize, *fell_back, chosen))
        *src = FROM_FILE;
    return n;
}

int weft_tune_plans(struct weft_comm *comm, int coll, size_t count, size_t esize,
                    struct weft_plan *plans)
{
    double secs[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    bool fell_back;
    enum source src;
    struct weft_plan chosen;
    int cls = class_of(count, esize);
    int n = class_choice(comm, coll, cls, esize, plans, secs, NULL, &fell_back, &src, &chosen);
    if (n == 0 || src != FROM_MODEL) {
        plans[0] = chosen;
        return 1;
    }
    int k = weft_tune_class_bytes(cls) > 0 ? weft_tune_measured(secs, n) : 0;
    return k >= 2 ? k : 1;
}

int weft_tune_distinct(struct weft_comm *comm, int coll, size_t count, size_t esize,
                       struct weft_plan *plans)
{
    double secs[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    bool fell_back;
    int n = class_plans(comm, coll, class_of(count, esize), esize, plans, secs, NULL, &fell_back);
    return fell_back ? 0 : n;
}

struct weft_plan weft_tune_pick(struct weft_comm *comm, int coll, size_t count, size_t esize,
                                struct weft_tune_ticket *tk)
{
    struct weft_tune_cache *c = &comm->tune;
    int cls = class_of(count, esize), e = weft_tune_esize_index(esize);
    *tk = (struct weft_tune_ticket){.trial = -1};
    int32_t hit = atomic_load_explicit(&c->plan[coll][e][cls], memory_order_acquire);
    if (hit & 0x10000)
        return (struct weft_plan){hit & 0xff, (hit >> 8) & 0xff};

    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    struct weft_tune_measure *m = c->measure[coll][e][cls];
    if (m) {
        /* Being measured: the next trial, the call that decides, or one
         * that waits for the decision. */
        tk->m = m;
        struct weft_plan pl = m->cand[0];
        int trials = m->ncand * m->reps, i = m->issued++ - m->ncand;
        if (atomic_load(&m->decided))
            pl = m->plan, tk->m = NULL;
        else if (i < 0)
            pl = m->cand[i + m->ncand], tk->m = NULL, tk->prime = true;
        else if (i < trials)
            pl = m->cand[weft_tune_trial_cand(m, i)], tk->trial = i,
            tk->sync = i % weft_tune_run_calls(m) == 0;
        else
            tk->pending = true, tk->decide = i == trials;
        pthread_mutex_unlock(&eng->mu);
        return pl;
    }
    pthread_mutex_unlock(&eng->mu);

    struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT], pl;
    double secs[WEFT_ALGO_COUNT * WEFT_VAR_COUNT], ports[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    size_t cb = weft_tune_class_bytes(cls);
    bool fell_back;
    enum source src;
    int n = class_choice(comm, coll, cls, esize, plans, secs, ports, &fell_back, &src, &pl);
    char name[32], why[WEFT_TUNE_PATH_MAX + 32];
    if (fell_back && !atomic_exchange(&c->warned[coll], 1))
        WEFT_INFO(WEFT_SUB_COLL, "WEFT_ALGO allows no algorithm that runs %s: %s chosen "
                  "automatically", weft_coll_name(coll), weft_plan_name(pl, name, sizeof(name)));
    m = cb > 0 && src == FROM_MODEL ? weft_tune_measure_new(coll, e, cls, plans, secs, ports, n)
                                    : NULL;
    if (m == NULL) {
        if (src == FROM_FILE)
            snprintf(why, sizeof(why), "tune file %s", c->file.path);
        else if (src == FROM_MASK)
            snprintf(why, sizeof(why), "WEFT_ALGO");
        else
            snprintf(why, sizeof(why), "model, predicted %.1f us", n > 0 ? secs[0] * 1e6 : 0.0);
        WEFT_INFO(WEFT_SUB_COLL, "%s of ~%zu bytes on %d ranks: %s (%s)", weft_coll_name(coll),
                  cb, comm->nranks, weft_plan_name(pl, name, sizeof(name)), why);
        weft_tune_cache_store(c, coll, e, cls, pl);
        return pl;
    }
    WEFT_INFO(WEFT_SUB_COLL, "%s of ~%zu bytes on %d ranks: timing the %d best predicted "
              "plans, one untimed call each, then %d calls each in %d rounds (WEFT_TUNE_TRIALS)",
              weft_coll_name(coll), cb,
              comm->nranks, m->ncand, m->reps, m->rounds);
    pthread_mutex_lock(&eng->mu);
    if (c->measure[coll][e][cls] == NULL)
        c->measure[coll][e][cls] = m;
    else
        free(m); /* another thread's call got here first: join its count */
    pthread_mutex_unlock(&eng->mu);
    return weft_tune_pick(comm, coll, count, esize, tk);
}

void weft_tune_record(struct weft_comm *comm, struct weft_tune_measure *m, const double *all)
{
    double tc[WEFT_TUNE_MAX_CANDS];
    int w = weft_tune_decide(m, all, comm->nranks, tc);
    char line[256], name[32];
    size_t o = 0;
    for (int c = 0; c < m->ncand && o < sizeof(line); c++)
        o += (size_t)snprintf(line + o, sizeof(line) - o, "%s%s %.1f", c ? ", " : "",
                              weft_plan_name(m->cand[c], name, sizeof(name)), tc[c] * 1e6);
    m->plan = m->cand[w];
    weft_tune_cache_store(&comm->tune, m->coll, m->esize_idx, m->cls, m->plan);
    atomic_store(&m->decided, 1);
    WEFT_INFO(WEFT_SUB_COLL, "%s of ~%zu bytes on %d ranks: %s (predicted %.1f us; measured "
              "us: %s)", weft_coll_name(m->coll), weft_tune_class_bytes(m->cls), comm->nranks,
              weft_plan_name(m->plan, name, sizeof(name)), m->predicted[w] * 1e6, line);
}

/* ---- the tuning file at init ------------------------------------------------ */

#define BLOB_HDR 8 /* u32 points, u32 path bytes; then 5 bytes a point, the path */

/* Rank 0: the section of its tuning file for comm's shape into pts; how
 * many (0: no file, no section, or a file it could not use, said once a
 * process at WARN). */
static int file_load(struct weft_comm *comm, struct weft_tune_point *pts, char *path, size_t plen)
{
    static _Atomic int warned;
    char err[WEFT_ERRMSG_LEN], *text = NULL, *key = NULL;
    size_t len;
    bool named;
    int n = 0;
    if (!weft_tune_file_path(path, plen, &named))
        return 0;
    weft_status_t st = weft_tune_file_read(path, &text, &len, err, sizeof(err));
    if (st == WEFT_ERR_UNSUPPORTED && named)
        snprintf(err, sizeof(err), "WEFT_TUNE_FILE=%.400s: no such file", path);
    if (st == WEFT_OK && (key = weft_tune_shape_key(&comm->topo)) == NULL) {
        snprintf(err, sizeof(err), "%.400s: out of memory for the section key", path);
        st = WEFT_ERR_NO_MEMORY;
    }
    if (st == WEFT_OK)
        st = weft_tune_file_parse(text, len, path, key, pts, &n, err, sizeof(err));
    if (st != WEFT_OK && (st != WEFT_ERR_UNSUPPORTED || named) && !atomic_exchange(&warned, 1))
        WEFT_WARN(WEFT_SUB_INIT, "%s; the cost model chooses the plans", err);
    else if (st == WEFT_OK)
        WEFT_INFO(WEFT_SUB_INIT, "tuning file %s: %d plans for [%s]%s", path, n, key,
                  n ? "" : " (no section for this shape: the cost model chooses)");
    free(text);
    free(key);
    return n;
}

/* Rank 0's points and path as one record for the others. */
static uint8_t *blob_make(const struct weft_tune_point *pts, int n, const char *path,
                          uint32_t *len)
{
    uint32_t pl = (uint32_t)WEFT_MIN(strlen(path), (size_t)WEFT_TUNE_PATH_MAX - 1);
    *len = BLOB_HDR + 5u * (uint32_t)n + pl;
    uint8_t *b = malloc(*len);
    if (b == NULL)
        return NULL;
    uint32_t hdr[2] = {(uint32_t)n, pl};
    memcpy(b, hdr, sizeof(hdr));
    for (int i = 0; i < n; i++)
        memcpy(b + BLOB_HDR + 5 * i, &pts[i], 5);
    memcpy(b + BLOB_HDR + 5 * n, path, pl);
    return b;
}

/* The table from rank 0's record (len bytes); false when it is not one. */
static bool blob_read(struct weft_tune_table *t, const uint8_t *b, uint32_t len)
{
    uint32_t hdr[2];
    if (len < BLOB_HDR)
        return false;
    memcpy(hdr, b, sizeof(hdr));
    if (hdr[0] > WEFT_TUNE_MAX_POINTS || hdr[1] >= WEFT_TUNE_PATH_MAX ||
        len != BLOB_HDR + 5 * hdr[0] + hdr[1])
        return false;
    struct weft_tune_point *pts = malloc((hdr[0] ? hdr[0] : 1) * sizeof(*pts));
    if (pts == NULL)
        return false;
    bool ok = true;
    for (uint32_t i = 0; i < hdr[0] && ok; i++) {
        memcpy(&pts[i], b + BLOB_HDR + 5 * i, 5);
        ok = pts[i].coll < WEFT_COLL_COUNT && pts[i].esize_idx <= WEFT_TUNE_ANY_ESIZE &&
             pts[i].cls < WEFT_TUNE_CLASSES && pts[i].algo < WEFT_ALGO_COUNT &&
             pts[i].variant < WEFT_VAR_COUNT;
    }
    if (ok) {
        weft_tune_table_fill(t, pts, (int)hdr[0]);
        memcpy(t->path, b + BLOB_HDR + 5 * hdr[0], hdr[1]);
        t->path[hdr[1]] = '\0';
    }
    free(pts);
    return ok;
}

weft_status_t weft_tune_file_share(struct weft_comm *comm, uint64_t deadline)
{
    int p = comm->nranks, n = 0;
    struct weft_tune_point *pts = NULL;
    uint8_t *mine = NULL, *all = NULL;
    uint32_t len = 0, *lens = NULL;
    char path[WEFT_TUNE_PATH_MAX * 4];
    weft_status_t st = WEFT_OK;
    memset(&comm->tune.file, 0, sizeof(comm->tune.file));
    if (p < 2)
        return WEFT_OK; /* nothing to choose */
    if (comm->rank == 0 && (pts = malloc(WEFT_TUNE_MAX_POINTS * sizeof(*pts))) != NULL &&
        (n = file_load(comm, pts, path, sizeof(path))) > 0 &&
        (mine = blob_make(pts, n, path, &len)) == NULL)
        len = 0; /* out of memory: the model chooses, on every rank */
    /* Every rank learns rank 0's length, so all take the second round or
     * none does; only rank 0's bytes count in either. */
    if ((lens = calloc((size_t)p, sizeof(*lens))) == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "out of memory for %d ranks", p);
        goto out; /* the others time out in the exchange and name this rank */
    }
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bs, &len, lens, sizeof(len), deadline), st, out);
    len = lens[0];
    if (len == 0)
        goto out;
    if (mine == NULL && (mine = calloc(len, 1)) == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "out of memory for the tuning "
                        "table");
        goto out;
    }
    if ((all = malloc((size_t)p * len)) == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "out of memory for %d ranks", p);
        goto out;
    }
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bs, mine, all, len, deadline), st, out);
    if (!blob_read(&comm->tune.file, all, len))
        st = weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE,
                        "rank %d: rank 0 sent a malformed tuning table (%u bytes)", comm->rank,
                        len);
out:
    free(all);
    free(lens);
    free(mine);
    free(pts);
    return st;
}
