/*
 * op.c - operation objects and what they borrow: schedules from a per-
 * communicator cache (keyed by shape and algorithm, evicted least recently
 * used when no op holds them), recycled per-step state, scratch buffers
 * touched once and kept.  After the first call of a shape nothing here
 * allocates.
 */
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "transports/transport.h"
#include "select/tune.h"

/* The staging slots of all ranks of a host together, unless
 * WEFT_STAGING_SLOTS is set: 32 ranks keep the default 16 slots of 512
 * KiB, 256 ranks get 2 each (256 MiB in all, not 2 GiB touched at init). */
#define STAGING_HOST_BYTES ((size_t)256 << 20)

struct weft_comm *weft_op_comm(struct weft_op *op)
{
    return op->comm;
}

/* Uses (and touches, so that the first calls pay no page faults) as many
 * staging slots as the host's share allows: see STAGING_HOST_BYTES.  Only
 * while no op holds a slot, i.e. at init. */
static void staging_fit(struct weft_engine *eng, int local_ranks)
{
    if (eng->nfree_slots != eng->nslots)
        return;
    size_t share = STAGING_HOST_BYTES / (size_t)WEFT_MAX(local_ranks, 1) / eng->chunk_bytes;
    /* Two slots: one op alone needs one, a second op in flight one more. */
    int used = eng->nslots;
    if (weft_param_source("WEFT_STAGING_SLOTS") == NULL)
        used = (int)WEFT_MIN((size_t)eng->nslots, WEFT_MAX(share, (size_t)2));
    eng->nfree_slots = used;
    memset(eng->staging, 0, (size_t)used * eng->chunk_bytes);
}

/* How a wait spins (weft_engine_spin), for local_ranks on this host. */
static void engine_spin(struct weft_engine *eng, int local_ranks)
{
    int64_t spin = weft_param_int("WEFT_SPIN_US");
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
    /* With more ranks than cores the rank we wait for may need our core:
     * spin, but give the core away on every turn (sched_yield).  Measured
     * 4 ranks on 2 cores, 8 B allreduce: 62 us sleeping in poll at once,
     * 230 us spinning 40 us without yielding, 36 us spinning 1 ms with
     * yields.  With a core each, spin for much longer than a sleeping
     * peer takes to wake (futex, waker thread, poll: ~50 us here): with a
     * 40 us spin two ranks woke each other in turn at 50-150 us a call,
     * for whole runs, where spinning through costs 1.5 us. */
    eng->yield = local_ranks > cores;
    if (spin < 0)
        spin = 1000;
    eng->spin_us = (int)WEFT_MIN(spin, 1000000);
}

weft_status_t weft_engine_create(struct weft_comm *comm, struct weft_engine **out)
{
    struct weft_engine *eng = calloc(1, sizeof(*eng));
    if (eng == NULL)
        return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "cannot allocate the engine");
    eng->comm = comm;
    eng->last_trial = -1;
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->cv, NULL);
    int64_t chunk = weft_param_int("WEFT_CHUNK_SIZE");
    int64_t slots = weft_param_int("WEFT_STAGING_SLOTS");
    eng->chunk_bytes = (size_t)WEFT_MAX(WEFT_MIN(chunk, (int64_t)1 << 30), 64);
    eng->chunk_bytes &= ~(size_t)7; /* whole elements of every dtype */
    eng->nslots = (int)WEFT_MAX(WEFT_MIN(slots, 1024), 1);
    engine_spin(eng, 1);
    eng->stamp = calloc(2 * (size_t)comm->nranks, sizeof(uint32_t));
    eng->free_slots = calloc((size_t)eng->nslots, sizeof(int32_t));
    /* Reserved, not touched: staging_fit touches the host's share. */
    eng->staging = weft_buf_reserve((size_t)eng->nslots * eng->chunk_bytes);
    if (eng->stamp == NULL || eng->free_slots == NULL || eng->staging == NULL) {
        weft_engine_destroy(eng);
        return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "cannot allocate %d staging slots of %zu bytes",
                          (int)slots, eng->chunk_bytes);
    }
    for (int i = 0; i < eng->nslots; i++)
        eng->free_slots[i] = i;
    eng->nfree_slots = eng->nslots;
    weft_sched_init(&eng->check_sched);
    eng->check = weft_param_int("WEFT_CHECK") != 0 && comm->nranks > 1;
    if (eng->check) {
        weft_status_t st = weft_check_sched_build(comm->rank, comm->nranks, &eng->check_sched);
        if (st != WEFT_OK) {
            weft_engine_destroy(eng);
            return weft_error(weft_comm_err(comm), st, "cannot build the fingerprint exchange (WEFT_CHECK)");
        }
    }
    *out = eng;
    return WEFT_OK;
}

void weft_engine_tune(struct weft_engine *eng, int local_ranks)
{
    engine_spin(eng, local_ranks);
    staging_fit(eng, local_ranks);
}

void weft_engine_spin(const struct weft_engine *eng, uint64_t *spin_ns, bool *yield)
{
    *spin_ns = (uint64_t)eng->spin_us * 1000;
    *yield = eng->yield;
}

static void op_release(struct weft_op *op)
{
    if (op->pre)
        op_release(op->pre);
    if (op->tune_pre)
        op_release(op->tune_pre);
    free(op->times);
    free(op->fps);
    free(op->st);
    free(op->treq);
    free(op->rr);
    free(op->posted);
    weft_sched_free(&op->own);
    free(op);
}

void weft_engine_destroy(struct weft_engine *eng)
{
    if (eng == NULL)
        return;
    pthread_mutex_lock(&eng->mu);
    eng->stop = true;
    pthread_cond_broadcast(&eng->cv);
    bool joined = eng->thread_started;
    pthread_mutex_unlock(&eng->mu);
    if (joined) {
        weft_comm_wakeup(eng->comm);
        pthread_join(eng->thread, NULL);
    }
    while (eng->free_ops) {
        struct weft_op *op = eng->free_ops;
        eng->free_ops = op->next;
        op_release(op);
    }
    for (size_t i = 0; i < SCHED_CACHE; i++)
        if (eng->cache[i].valid)
            weft_sched_free(&eng->cache[i].s);
    for (size_t i = 0; i < MAX_ACTIVE; i++)
        weft_buf_free(eng->scratch[i].p, eng->scratch[i].bytes);
    weft_sched_free(&eng->check_sched);
    weft_buf_free(eng->staging, (size_t)eng->nslots * eng->chunk_bytes);
    free(eng->stamp);
    free(eng->free_slots);
    pthread_cond_destroy(&eng->cv);
    pthread_mutex_destroy(&eng->mu);
    free(eng);
}

/* ---- schedules ---------------------------------------------------------- */

static bool desc_equal(const struct weft_coll_desc *a, const struct weft_coll_desc *b)
{
    return a->coll == b->coll && a->count == b->count && a->root == b->root && a->algo == b->algo &&
           a->variant == b->variant && a->ordered == b->ordered && a->node == b->node &&
           a->chunk == b->chunk && a->nranks == b->nranks && a->rank == b->rank;
}

/* Called with mu held. */
static weft_status_t sched_get(struct weft_engine *eng, const struct weft_coll_desc *d,
                               struct sched_entry **out)
{
    struct sched_entry *victim = NULL, *hot = eng->cache_hot;
    /* Training loops repeat one call: its entry is the last one used. */
    if (hot && hot->valid && desc_equal(&hot->desc, d)) {
        hot->refs++;
        hot->last_use = ++eng->cache_clock;
        *out = hot;
        return WEFT_OK;
    }
    for (size_t i = 0; i < SCHED_CACHE; i++) {
        struct sched_entry *e = &eng->cache[i];
        if (e->valid && desc_equal(&e->desc, d)) {
            e->refs++;
            e->last_use = ++eng->cache_clock;
            *out = eng->cache_hot = e;
            return WEFT_OK;
        }
        if (e->refs == 0 && (victim == NULL || !e->valid ||
                             (victim->valid && e->last_use < victim->last_use)))
            victim = e;
    }
    if (victim == NULL)
        return weft_error(weft_comm_err(eng->comm), WEFT_ERR_NO_MEMORY, "schedule cache is full of ops in flight");
    if (victim->valid)
        weft_sched_free(&victim->s);
    victim->valid = false;
    weft_sched_init(&victim->s);
    weft_status_t st = weft_sched_build(d, &victim->s);
    if (st != WEFT_OK) {
        weft_sched_free(&victim->s);
        return st;
    }
    victim->desc = *d;
    victim->valid = true;
    victim->refs = 1;
    victim->last_use = ++eng->cache_clock;
    *out = eng->cache_hot = victim;
    return WEFT_OK;
}

static weft_status_t op_reserve(struct weft_op *op, size_t n)
{
    if (n <= op->cap)
        return WEFT_OK;
    size_t cap = WEFT_MAX(n, 2 * op->cap);
    uint8_t *st = realloc(op->st, cap);
    if (st)
        op->st = st;
    void **treq = realloc(op->treq, cap * sizeof(void *));
    if (treq)
        op->treq = treq;
    struct weft_rr *rr = realloc(op->rr, cap * sizeof(*rr));
    if (rr)
        op->rr = rr;
    uint32_t *posted = realloc(op->posted, cap * sizeof(uint32_t));
    if (posted)
        op->posted = posted;
    if (!st || !treq || !rr || !posted)
        return weft_error(weft_comm_err(op->comm), WEFT_ERR_NO_MEMORY, "cannot allocate state for %zu steps", n);
    op->cap = cap;
    return WEFT_OK;
}

static void sched_put(struct weft_engine *eng, struct weft_op *op)
{
    if (op->ent) {
        pthread_mutex_lock(&eng->mu);
        op->ent->refs--;
        pthread_mutex_unlock(&eng->mu);
        op->ent = NULL;
    }
}

/* A recycled (or new) op, reset for args. */
static struct weft_op *op_get(struct weft_comm *comm, const struct weft_op_args *args)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    struct weft_op *op = eng->free_ops;
    if (op)
        eng->free_ops = op->next;
    pthread_mutex_unlock(&eng->mu);
    if (op == NULL) {
        op = calloc(1, sizeof(*op));
        if (op == NULL)
            return NULL;
        weft_sched_init(&op->own);
    }
    op->next = NULL;
    op->comm = comm;
    op->a = *args;
    op->esize = weft_dtype_size(args->dtype);
    op->ent = NULL;
    op->scratch = NULL;
    op->done = op->started = false;
    op->status = WEFT_OK;
    op->nposted = op->first_pending = op->ndone = 0;
    op->kind = OP_USER;
    op->gated = op->verified = false;
    op->pre = op->target = NULL;
    op->s = NULL;
    op->tm = NULL;
    op->trial = -1;
    op->pending = false;
    op->prime = false;
    op->tune_pre = NULL;
    return op;
}

/* An op of the engine's own (kind) that runs before op, freed with it;
 * NULL when out of memory (what names the op in the error). */
static struct weft_op *pre_op_get(struct weft_comm *comm, struct weft_op *op,
                                  const struct weft_op_args *a, uint8_t kind, const char *what)
{
    struct weft_op *p = op_get(comm, a);
    if (p == NULL) {
        weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "cannot allocate %s", what);
        return NULL;
    }
    p->kind = kind;
    if (kind == OP_CHECK)
        op->pre = p;
    else
        op->tune_pre = p;
    return p;
}

/* Gives the collective op (whose schedule was built from d) the check op
 * that exchanges its fingerprint; the seq is filled in at submit. */
static weft_status_t check_op_new(struct weft_comm *comm, struct weft_op *op,
                                  const struct weft_coll_desc *d)
{
    struct weft_engine *eng = comm->eng;
    struct weft_op_args ca = {.coll = op->a.coll, .count = sizeof(struct weft_fingerprint),
                              .dtype = WEFT_UINT8, .op = WEFT_SUM};
    struct weft_op *c = pre_op_get(comm, op, &ca, OP_CHECK, "a fingerprint exchange");
    if (c == NULL)
        return WEFT_ERR_NO_MEMORY;
    c->target = op;
    if (c->fps == NULL) {
        c->fps = calloc((size_t)comm->nranks, sizeof(*c->fps));
        if (c->fps == NULL)
            return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "cannot allocate %d fingerprints",
                              comm->nranks);
    }
    c->s = &eng->check_sched;
    WEFT_CHECK(op_reserve(c, c->s->nsteps));
    memset(c->st, ST_PENDING, c->s->nsteps);
    memset(c->fps, 0, (size_t)comm->nranks * sizeof(*c->fps));
    /* Set where this rank times plans: a run's first trial, or an untimed
     * call before them (so a rank that does not is named at the first). */
    bool run = op->prime || (op->tune_pre && op->tune_pre->kind == OP_SYNC);
    weft_fp_fill(&c->fps[comm->rank], &op->a,
                 d->algo | d->variant << 8 | (d->ordered != 0) << 12 | run << 13,
                 d->chunk * op->esize);
    c->a.sendbuf = &c->fps[comm->rank];
    c->a.recvbuf = c->fps;
    return WEFT_OK;
}

/* The description of collective op's schedule under plan (algo, variant). */
static void coll_desc(const struct weft_comm *comm, const struct weft_op *op, int algo,
                      int variant, struct weft_coll_desc *d)
{
    *d = (struct weft_coll_desc){
        .coll = op->a.coll, .rank = comm->rank, .nranks = comm->nranks,
        .root = op->a.root, .count = op->a.count,
        .chunk = WEFT_MAX(comm->eng->chunk_bytes / op->esize, 1),
        .algo = algo, .variant = variant,
    };
    if (algo == WEFT_ALGO_HIER) {
        d->node = comm->topo.host;
        d->nnodes = comm->topo.nhosts;
    }
}

/* Gives op the schedule d describes, and step state for it. */
static weft_status_t op_set_sched(struct weft_engine *eng, struct weft_op *op,
                                  const struct weft_coll_desc *d)
{
    pthread_mutex_lock(&eng->mu);
    weft_status_t st = sched_get(eng, d, &op->ent);
    pthread_mutex_unlock(&eng->mu);
    WEFT_CHECK(st);
    op->s = &op->ent->s;
    WEFT_CHECK(op_reserve(op, op->s->nsteps));
    if (op->s->nsteps > 0)
        memset(op->st, ST_PENDING, op->s->nsteps);
    return WEFT_OK;
}

/* Gives the user op an op of the engine's own that allgathers per_rank
 * doubles of every rank, out of its `times`, under plan algo, and runs
 * once every op before it has retired:
 *  - OP_TUNE, before the call that ends m's trials: every rank's trial
 *    times, ours filled in by the engine;
 *  - OP_SYNC, before the first trial of each run: a barrier, so that no
 *    rank starts the run while another still works on the plan before (a
 *    rooted collective's root runs ahead through the transports' buffers,
 *    and would hand its backlog to the next plan's trials). */
static weft_status_t exchange_op_new(struct weft_comm *comm, struct weft_op *op,
                                     struct weft_tune_measure *m, uint8_t kind, size_t per_rank,
                                     int algo, const char *what)
{
    size_t need = per_rank * (size_t)comm->nranks;
    struct weft_op_args ta = {.coll = WEFT_COLL_ALLGATHER, .count = per_rank,
                              .dtype = WEFT_FLOAT64, .op = WEFT_SUM};
    struct weft_op *t = pre_op_get(comm, op, &ta, kind, what);
    if (t == NULL)
        return WEFT_ERR_NO_MEMORY;
    t->tm = m;
    if (t->cap_times < need) {
        free(t->times);
        t->cap_times = 0;
        t->times = calloc(need, sizeof(double));
        if (t->times == NULL)
            return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "cannot allocate %s of %zu doubles",
                              what, need);
        t->cap_times = need;
    }
    t->a.sendbuf = t->times + (size_t)comm->rank * per_rank;
    t->a.recvbuf = t->times;
    struct weft_coll_desc d;
    coll_desc(comm, t, algo, 0, &d);
    return op_set_sched(comm->eng, t, &d);
}

weft_status_t weft_engine_op_new(struct weft_comm *comm, const struct weft_op_args *args,
                                 struct weft_op **out)
{
    struct weft_engine *eng = comm->eng;
    size_t esize = weft_dtype_size(args->dtype);
    struct weft_op *op = op_get(comm, args);
    if (op == NULL)
        return weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "cannot allocate an operation");

    weft_status_t st = WEFT_OK;
    if (args->coll == WEFT_COLL_SEND || args->coll == WEFT_COLL_RECV) {
        op->own.nsteps = 0;
        op->own.scratch_count = 0;
        if (args->count > 0) {
            bool send = args->coll == WEFT_COLL_SEND;
            struct weft_step step = {
                .kind = send ? WEFT_STEP_SEND : WEFT_STEP_RECV,
                .buf = send ? WEFT_BUF_SEND : WEFT_BUF_RECV,
                .peer = args->root,
                .deps = {-1, -1, -1},
                .count = args->count,
            };
            if (weft_sched_add(&op->own, &step) < 0)
                st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "cannot allocate a schedule");
        }
        op->s = &op->own;
        if (st == WEFT_OK)
            st = op_reserve(op, op->s->nsteps);
        if (st == WEFT_OK && op->s->nsteps > 0)
            memset(op->st, ST_PENDING, op->s->nsteps);
    } else {
        struct weft_coll_desc d;
        if (atomic_load(&comm->deterministic) && weft_coll_reduces(args->coll)) {
            /* One fixed combining order: the ordered chain, whatever was allowed. */
            static _Atomic int told;
            if (!(comm->algos[args->coll] & WEFT_PLAN_BIT(WEFT_ALGO_RING, 0)) &&
                !atomic_exchange(&told, 1))
                WEFT_INFO(WEFT_SUB_COLL, "deterministic mode: %s runs the ordered chain (ring), "
                          "not what WEFT_ALGO=%s allows", weft_coll_name(args->coll),
                          weft_param_str("WEFT_ALGO"));
            coll_desc(comm, op, WEFT_ALGO_RING, 0, &d);
            d.ordered = 1;
            st = op_set_sched(eng, op, &d);
        } else {
            struct weft_tune_ticket tk;
            struct weft_plan pl = weft_tune_pick(comm, args->coll, args->count, esize, &tk);
            op->tm = tk.m;
            op->trial = tk.trial;
            op->pending = tk.pending;
            op->prime = tk.prime;
            /* A pending op's fingerprint names no plan: every rank waits
             * for the same decision at the same call. */
            coll_desc(comm, op, tk.pending ? WEFT_ALGO_COUNT : pl.algo, pl.variant, &d);
            if (tk.decide)
                st = exchange_op_new(comm, op, tk.m, OP_TUNE, (size_t)(tk.m->ncand * tk.m->reps),
                                     WEFT_ALGO_RING, "a trial-time exchange");
            else if (tk.sync)
                st = exchange_op_new(comm, op, tk.m, OP_SYNC, 1, WEFT_ALGO_RHD, "a trial barrier");
            if (st == WEFT_OK && !tk.pending)
                st = op_set_sched(eng, op, &d);
        }
        if (st == WEFT_OK && eng->check)
            st = check_op_new(comm, op, &d);
    }
    if (st != WEFT_OK) {
        weft_engine_op_free(comm, op);
        return st;
    }
    *out = op;
    return WEFT_OK;
}

weft_status_t weft_engine_op_plan(struct weft_engine *eng, struct weft_op *op)
{
    struct weft_coll_desc d;
    coll_desc(eng->comm, op, op->tm->plan.algo, op->tm->plan.variant, &d);
    WEFT_CHECK(op_set_sched(eng, op, &d));
    op->pending = false;
    return WEFT_OK;
}

void weft_engine_op_discard(struct weft_op *op)
{
    op_release(op);
}

void weft_engine_op_free(struct weft_comm *comm, struct weft_op *op)
{
    struct weft_engine *eng = comm->eng;
    struct weft_op *pre = op->pre, *tune_pre = op->tune_pre;
    op->pre = op->tune_pre = NULL;
    if (pre)
        weft_engine_op_free(comm, pre);
    if (tune_pre)
        weft_engine_op_free(comm, tune_pre);
    sched_put(eng, op);
    pthread_mutex_lock(&eng->mu);
    op->next = eng->free_ops;
    eng->free_ops = op;
    pthread_mutex_unlock(&eng->mu);
}

/* ---- driving ------------------------------------------------------------ */

weft_status_t weft_engine_scratch_acquire(struct weft_engine *eng, struct weft_op *op)
{
    size_t need = op->s->scratch_count * op->esize;
    if (need == 0)
        return WEFT_OK;
    struct scratch *empty = NULL, *small = NULL;
    for (size_t i = 0; i < MAX_ACTIVE; i++) {
        struct scratch *sc = &eng->scratch[i];
        if (sc->busy)
            continue;
        if (sc->p && sc->bytes >= need) {
            sc->busy = true;
            op->scratch = sc;
            return WEFT_OK;
        }
        if (!sc->p && !empty)
            empty = sc;
        else if (sc->p && !small)
            small = sc;
    }
    /* Grow a free buffer before taking an empty slot: otherwise every new
     * largest size would keep one more buffer, up to MAX_ACTIVE of them,
     * while ops that run one at a time only ever need one. */
    struct scratch *sc = small ? small : empty;
    if (sc == NULL)
        return weft_error(weft_comm_err(eng->comm), WEFT_ERR_INTERNAL, "no free scratch buffer");
    weft_buf_free(sc->p, sc->bytes);
    sc->bytes = need;
    sc->p = weft_buf_alloc(need);
    if (sc->p == NULL) {
        sc->bytes = 0;
        return weft_error(weft_comm_err(eng->comm), WEFT_ERR_NO_MEMORY, "cannot allocate %zu bytes of scratch",
                          need);
    }
    sc->busy = true;
    op->scratch = sc;
    return WEFT_OK;
}

weft_status_t weft_engine_reap(struct weft_engine *eng, struct weft_op *op)
{
    weft_status_t st = op->status;
    sched_put(eng, op);
    pthread_mutex_lock(&eng->mu);
    op->next = eng->free_ops;
    eng->free_ops = op;
    pthread_mutex_unlock(&eng->mu);
    return st;
}
