/*
 * plan.c - a communicator's plan per call: the cache of chosen plans per
 * size class, and the trials that time the best predicted candidates in
 * the program's own calls before one is kept.
 */
#include <stdio.h>
#include <stdlib.h>

#include "comm.h"
#include "engine_impl.h"
#include "plan.h"

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

int weft_tune_plans(struct weft_comm *comm, int coll, size_t count, size_t esize,
                    struct weft_plan *plans)
{
    double secs[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    bool fell_back;
    int cls = class_of(count, esize);
    int n = class_plans(comm, coll, cls, esize, plans, secs, NULL, &fell_back);
    if (n == 0) {
        plans[0] = (struct weft_plan){WEFT_ALGO_RING, 0};
        return 1;
    }
    int k = weft_tune_class_bytes(cls) > 0 ? weft_tune_measured(secs, n) : 0;
    return k >= 2 ? k : 1;
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

    struct weft_plan plans[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    double secs[WEFT_ALGO_COUNT * WEFT_VAR_COUNT], ports[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    size_t cb = weft_tune_class_bytes(cls);
    bool fell_back;
    int n = class_plans(comm, coll, cls, esize, plans, secs, ports, &fell_back);
    struct weft_plan pl = n > 0 ? plans[0] : (struct weft_plan){WEFT_ALGO_RING, 0};
    char name[32];
    if (fell_back && !atomic_exchange(&c->warned[coll], 1))
        WEFT_INFO(WEFT_SUB_COLL, "WEFT_ALGO allows no algorithm that runs %s: %s chosen "
                  "automatically", weft_coll_name(coll), weft_plan_name(pl, name, sizeof(name)));
    m = cb > 0 ? weft_tune_measure_new(coll, e, cls, plans, secs, ports, n) : NULL;
    if (m == NULL) {
        WEFT_INFO(WEFT_SUB_COLL, "%s of ~%zu bytes on %d ranks: %s (predicted %.1f us)",
                  weft_coll_name(coll), cb, comm->nranks, weft_plan_name(pl, name, sizeof(name)),
                  n > 0 ? secs[0] * 1e6 : 0.0);
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
