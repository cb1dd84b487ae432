/*
 * engine.c - executes schedules over the transport.  One thread at a time
 * "drives": it posts every step whose dependencies are met (keeping each
 * peer's message order across operations), moves bytes, reduces chunks as
 * they land and retires operations in issue order.  A blocking call drives
 * from the caller's thread; non-blocking calls are driven by a per-
 * communicator progress thread that sleeps in poll() or on a condition
 * variable when there is nothing to do.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/schedule.h"
#include "engine.h"
#include "reduce.h"
#include "tune.h"
#include "transports/transport.h"

enum { ST_PENDING = 0, ST_POSTED, ST_DONE };

#define SCHED_CACHE 64   /* schedules kept per communicator */
#define MAX_ACTIVE 32    /* ops in flight at once; later ones wait queued */
#define SCAN_BUDGET 512  /* unposted steps examined per posting pass */
#define POLL_SLICE_MS 100

/* A cached schedule; refs counts the ops using it (evicted only at 0). */
struct sched_entry {
    struct weft_coll_desc desc;
    struct weft_schedule s;
    int refs;
    uint64_t last_use;
    bool valid;
};

/* A posted send to our own rank, waiting for our matching receive. */
struct self_send {
    struct weft_op *op;
    uint32_t step;
};

/* A scratch buffer, kept for the communicator's life once touched. */
struct scratch {
    void *p;
    size_t bytes;
    bool busy;
};

/*
 * One operation (also what a weft_request_t points to).  Owner: the engine
 * from submit until the waiter frees it through wait/test.  Per-step arrays
 * have room for cap steps and are reused when the op is recycled.
 */
struct weft_op {
    struct weft_op *next;        /* queue, active list or free list */
    struct weft_comm *comm;
    struct weft_op_args a;
    uint64_t seq;
    struct sched_entry *ent;     /* cached schedule, or NULL for p2p */
    struct weft_schedule own;    /* p2p: a one-step schedule */
    const struct weft_schedule *s;
    size_t cap;
    uint8_t *st;                 /* (cap) step state */
    void **treq;                 /* (cap) transport request */
    int32_t *slot;               /* (cap) staging slot of a RECV_REDUCE */
    uint32_t *posted;            /* (cap) indices of posted steps */
    size_t nposted, first_pending, ndone;
    struct scratch *scratch;
    char *bufs[3];
    size_t esize;
    weft_status_t status;
    bool done;                   /* guarded by eng->mu */
    bool started;                /* the driver has set it up */
};

/*
 * Invariants: only the thread with driving == true touches `active`, the
 * transport, staging slots and step state; everything else below the
 * mutex is guarded by mu.
 */
struct weft_engine {
    struct weft_comm *comm;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct weft_op *qhead, *qtail;   /* submitted, not yet active (mu) */
    struct weft_op *free_ops;        /* recycled ops (mu) */
    size_t nlive;                    /* submitted and not finished (mu) */
    bool driving;                    /* (mu) */
    bool thread_started, stop;       /* (mu) */
    pthread_t thread;
    uint64_t next_seq;               /* (mu) */

    /* driver-only state */
    struct weft_op *active, *active_tail;
    size_t nactive;
    uint32_t *stamp;                 /* (2 * nranks) peer-blocked marks */
    uint32_t gen;
    char *staging;                   /* (nslots * chunk_bytes) */
    int32_t *free_slots;
    int nslots, nfree_slots;
    size_t chunk_bytes;
    int spin_us;
    uint64_t last_event_ns;
    struct self_send *selfq;         /* sends to ourselves not yet received */
    size_t selfq_head, selfq_n, selfq_cap;

    struct sched_entry cache[SCHED_CACHE];   /* (mu) */
    uint64_t cache_clock;
    struct scratch scratch[MAX_ACTIVE];      /* (driver) */
};

struct weft_comm *weft_op_comm(struct weft_op *op)
{
    return op->comm;
}

weft_status_t weft_engine_create(struct weft_comm *comm, struct weft_engine **out)
{
    struct weft_engine *eng = calloc(1, sizeof(*eng));
    if (eng == NULL)
        return weft_error(comm, WEFT_ERR_NO_MEMORY, "cannot allocate the engine");
    eng->comm = comm;
    pthread_mutex_init(&eng->mu, NULL);
    pthread_cond_init(&eng->cv, NULL);
    int64_t chunk = weft_param_int("WEFT_CHUNK_SIZE");
    int64_t slots = weft_param_int("WEFT_STAGING_SLOTS");
    eng->chunk_bytes = (size_t)WEFT_MAX(WEFT_MIN(chunk, (int64_t)1 << 30), 64);
    eng->chunk_bytes &= ~(size_t)7; /* whole elements of every dtype */
    eng->nslots = (int)WEFT_MAX(WEFT_MIN(slots, 1024), 1);
    weft_engine_tune(eng, 1);
    eng->stamp = calloc(2 * (size_t)comm->nranks, sizeof(uint32_t));
    eng->free_slots = calloc((size_t)eng->nslots, sizeof(int32_t));
    eng->staging = weft_buf_alloc((size_t)eng->nslots * eng->chunk_bytes);
    if (eng->stamp == NULL || eng->free_slots == NULL || eng->staging == NULL) {
        weft_engine_destroy(eng);
        return weft_error(comm, WEFT_ERR_NO_MEMORY, "cannot allocate %d staging slots of %zu bytes",
                          (int)slots, eng->chunk_bytes);
    }
    for (int i = 0; i < eng->nslots; i++)
        eng->free_slots[i] = i;
    eng->nfree_slots = eng->nslots;
    *out = eng;
    return WEFT_OK;
}

void weft_engine_tune(struct weft_engine *eng, int local_ranks)
{
    int64_t spin = weft_param_int("WEFT_SPIN_US");
    if (spin < 0) {
        /* Spinning against a rank that wants our core only delays it:
         * measured 4 ranks on 2 cores, 8 B allreduce 230 us spinning 40 us
         * against 125 us sleeping at once. */
        cpu_set_t set;
        int cores = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
        spin = local_ranks <= cores ? 40 : 0;
    }
    eng->spin_us = (int)WEFT_MIN(spin, 1000000);
}

static void op_release(struct weft_op *op)
{
    free(op->st);
    free(op->treq);
    free(op->slot);
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
        if (eng->comm->tops && eng->comm->tctx)
            eng->comm->tops->wakeup(eng->comm->tctx);
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
    weft_buf_free(eng->staging, (size_t)eng->nslots * eng->chunk_bytes);
    free(eng->stamp);
    free(eng->free_slots);
    free(eng->selfq);
    pthread_cond_destroy(&eng->cv);
    pthread_mutex_destroy(&eng->mu);
    free(eng);
}

/* ---- schedules ---------------------------------------------------------- */

static bool desc_equal(const struct weft_coll_desc *a, const struct weft_coll_desc *b)
{
    return a->coll == b->coll && a->count == b->count && a->root == b->root && a->algo == b->algo &&
           a->chunk == b->chunk && a->nranks == b->nranks && a->rank == b->rank;
}

/* Called with mu held. */
static weft_status_t sched_get(struct weft_engine *eng, const struct weft_coll_desc *d,
                               struct sched_entry **out)
{
    struct sched_entry *victim = NULL;
    for (size_t i = 0; i < SCHED_CACHE; i++) {
        struct sched_entry *e = &eng->cache[i];
        if (e->valid && desc_equal(&e->desc, d)) {
            e->refs++;
            e->last_use = ++eng->cache_clock;
            *out = e;
            return WEFT_OK;
        }
        if (e->refs == 0 && (victim == NULL || !e->valid ||
                             (victim->valid && e->last_use < victim->last_use)))
            victim = e;
    }
    if (victim == NULL)
        return weft_error(eng->comm, WEFT_ERR_NO_MEMORY, "schedule cache is full of ops in flight");
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
    *out = victim;
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
    int32_t *slot = realloc(op->slot, cap * sizeof(int32_t));
    if (slot)
        op->slot = slot;
    uint32_t *posted = realloc(op->posted, cap * sizeof(uint32_t));
    if (posted)
        op->posted = posted;
    if (!st || !treq || !slot || !posted)
        return weft_error(op->comm, WEFT_ERR_NO_MEMORY, "cannot allocate state for %zu steps", n);
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

weft_status_t weft_engine_op_new(struct weft_comm *comm, const struct weft_op_args *args,
                                 struct weft_op **out)
{
    struct weft_engine *eng = comm->eng;
    size_t esize = weft_dtype_size(args->dtype);
    pthread_mutex_lock(&eng->mu);
    struct weft_op *op = eng->free_ops;
    if (op)
        eng->free_ops = op->next;
    pthread_mutex_unlock(&eng->mu);
    if (op == NULL) {
        op = calloc(1, sizeof(*op));
        if (op == NULL)
            return weft_error(comm, WEFT_ERR_NO_MEMORY, "cannot allocate an operation");
        weft_sched_init(&op->own);
    }
    op->next = NULL;
    op->comm = comm;
    op->a = *args;
    op->esize = esize;
    op->ent = NULL;
    op->scratch = NULL;
    op->done = op->started = false;
    op->status = WEFT_OK;
    op->nposted = op->first_pending = op->ndone = 0;

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
                st = weft_error(comm, WEFT_ERR_NO_MEMORY, "cannot allocate a schedule");
        }
        op->s = &op->own;
    } else {
        struct weft_coll_desc d = {
            .coll = args->coll, .rank = comm->rank, .nranks = comm->nranks,
            .root = args->root, .count = args->count,
            .chunk = WEFT_MAX(eng->chunk_bytes / esize, 1),
            .algo = weft_tune_pick(comm->algos, args->coll, comm->nranks, args->count * esize),
        };
        pthread_mutex_lock(&eng->mu);
        st = sched_get(eng, &d, &op->ent);
        pthread_mutex_unlock(&eng->mu);
        if (st == WEFT_OK)
            op->s = &op->ent->s;
    }
    if (st == WEFT_OK)
        st = op_reserve(op, op->s->nsteps);
    if (st != WEFT_OK) {
        weft_engine_op_free(comm, op);
        return st;
    }
    if (op->s->nsteps > 0)
        memset(op->st, ST_PENDING, op->s->nsteps);
    *out = op;
    return WEFT_OK;
}

void weft_engine_op_free(struct weft_comm *comm, struct weft_op *op)
{
    struct weft_engine *eng = comm->eng;
    sched_put(eng, op);
    pthread_mutex_lock(&eng->mu);
    op->next = eng->free_ops;
    eng->free_ops = op;
    pthread_mutex_unlock(&eng->mu);
}

/* ---- driving ------------------------------------------------------------ */

static const char *dtype_name(weft_dtype_t t)
{
    static const char *const names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                        "uint64",  "float16", "float32", "float64", "bfloat16"};
    return (unsigned)t < WEFT_ARRAY_SIZE(names) ? names[t] : "?";
}

static weft_status_t scratch_acquire(struct weft_engine *eng, struct weft_op *op)
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
    struct scratch *sc = empty ? empty : small;
    if (sc == NULL)
        return weft_error(eng->comm, WEFT_ERR_INTERNAL, "no free scratch buffer");
    weft_buf_free(sc->p, sc->bytes);
    sc->bytes = need;
    sc->p = weft_buf_alloc(need);
    if (sc->p == NULL) {
        sc->bytes = 0;
        return weft_error(eng->comm, WEFT_ERR_NO_MEMORY, "cannot allocate %zu bytes of scratch",
                          need);
    }
    sc->busy = true;
    op->scratch = sc;
    return WEFT_OK;
}

/* Moves queued ops to the active list (driver only). */
static void activate(struct weft_engine *eng)
{
    pthread_mutex_lock(&eng->mu);
    while (eng->qhead && eng->nactive < MAX_ACTIVE) {
        struct weft_op *op = eng->qhead;
        eng->qhead = op->next;
        if (!eng->qhead)
            eng->qtail = NULL;
        op->next = NULL;
        if (eng->active_tail)
            eng->active_tail->next = op;
        else
            eng->active = op;
        eng->active_tail = op;
        eng->nactive++;
    }
    pthread_mutex_unlock(&eng->mu);
}

static void finish(struct weft_engine *eng, struct weft_op *op, weft_status_t st)
{
    if (op->scratch)
        op->scratch->busy = false;
    op->scratch = NULL;
    pthread_mutex_lock(&eng->mu);
    op->status = st;
    op->done = true;
    eng->nlive--;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
}

/* Fails every active and queued op; the comm keeps the sticky error. */
static void fail_all(struct weft_engine *eng, weft_status_t st)
{
    st = weft_comm_fail(eng->comm, st);
    for (struct weft_op *op = eng->active, *next; op; op = next) {
        next = op->next;
        finish(eng, op, st);
    }
    eng->active = eng->active_tail = NULL;
    eng->nactive = 0;
    eng->selfq_n = 0;
    for (;;) {
        pthread_mutex_lock(&eng->mu);
        struct weft_op *op = eng->qhead;
        if (op) {
            eng->qhead = op->next;
            if (!eng->qhead)
                eng->qtail = NULL;
        }
        pthread_mutex_unlock(&eng->mu);
        if (!op)
            break;
        finish(eng, op, st);
    }
}

static inline char *step_ptr(const struct weft_op *op, int buf, size_t off)
{
    return op->bufs[buf] + off * op->esize;
}

static bool deps_done(const struct weft_op *op, const struct weft_step *s)
{
    for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
        if (s->deps[k] >= 0 && op->st[s->deps[k]] != ST_DONE)
            return false;
    return true;
}

static weft_status_t start_op(struct weft_engine *eng, struct weft_op *op)
{
    op->bufs[WEFT_BUF_SEND] = (char *)op->a.sendbuf;
    op->bufs[WEFT_BUF_RECV] = op->a.recvbuf;
    WEFT_CHECK(scratch_acquire(eng, op));
    op->bufs[WEFT_BUF_SCRATCH] = op->scratch ? op->scratch->p : NULL;
    op->started = true;
    return WEFT_OK;
}

static weft_status_t selfq_push(struct weft_engine *eng, struct weft_op *op, uint32_t i)
{
    if (eng->selfq_n == eng->selfq_cap) {
        size_t cap = eng->selfq_cap ? 2 * eng->selfq_cap : 16;
        struct self_send *q = malloc(cap * sizeof(*q));
        if (q == NULL)
            return weft_error(eng->comm, WEFT_ERR_NO_MEMORY, "cannot queue a send to self");
        for (size_t k = 0; k < eng->selfq_n; k++)
            q[k] = eng->selfq[(eng->selfq_head + k) % eng->selfq_cap];
        free(eng->selfq);
        eng->selfq = q;
        eng->selfq_head = 0;
        eng->selfq_cap = cap;
    }
    eng->selfq[(eng->selfq_head + eng->selfq_n++) % eng->selfq_cap] = (struct self_send){op, i};
    return WEFT_OK;
}

/* A send to self waits in selfq; a receive from self takes the oldest one
 * (WEFT_INPROGRESS when there is none yet) and completes both. */
static weft_status_t post_self(struct weft_engine *eng, struct weft_op *op, uint32_t i)
{
    const struct weft_step *s = &op->s->steps[i];
    if (s->kind == WEFT_STEP_SEND) {
        WEFT_CHECK(selfq_push(eng, op, i));
        op->st[i] = ST_POSTED;
        return WEFT_OK;
    }
    if (eng->selfq_n == 0)
        return WEFT_INPROGRESS;
    struct self_send snd = eng->selfq[eng->selfq_head];
    eng->selfq_head = (eng->selfq_head + 1) % eng->selfq_cap;
    eng->selfq_n--;
    const struct weft_step *ss = &snd.op->s->steps[snd.step];
    size_t bytes = s->count * op->esize, sent = ss->count * snd.op->esize;
    if (sent != bytes)
        return weft_error(eng->comm, WEFT_ERR_INVALID_ARG,
                          "rank %d: a send to self of %zu bytes met a receive of %zu bytes",
                          eng->comm->rank, sent, bytes);
    const char *src = step_ptr(snd.op, ss->buf, ss->off);
    if (s->kind == WEFT_STEP_RECV_REDUCE)
        weft_reduce_local(step_ptr(op, s->buf, s->off), step_ptr(op, s->src_buf, s->src_off), src,
                          s->count, op->a.dtype, op->a.op, 0);
    else
        memcpy(step_ptr(op, s->buf, s->off), src, bytes);
    snd.op->st[snd.step] = ST_DONE;
    snd.op->ndone++;
    op->st[i] = ST_DONE;
    op->ndone++;
    return WEFT_OK;
}

/* Posts every step that may go now.  Returns true if anything changed. */
static weft_status_t post_ready(struct weft_engine *eng, bool *changed)
{
    struct weft_comm *comm = eng->comm;
    const struct weft_transport_ops *t = comm->tops;
    uint32_t gen = ++eng->gen;
    int budget = SCAN_BUDGET;
    for (struct weft_op *op = eng->active; op && budget > 0; op = op->next) {
        const struct weft_step *steps = op->s->steps;
        size_t n = op->s->nsteps;
        while (op->first_pending < n && op->st[op->first_pending] != ST_PENDING)
            op->first_pending++;
        for (size_t i = op->first_pending; i < n && budget > 0; i++) {
            if (op->st[i] != ST_PENDING)
                continue;
            budget--;
            const struct weft_step *s = &steps[i];
            uint32_t *mark = NULL;
            if (s->kind != WEFT_STEP_COPY) {
                mark = &eng->stamp[2 * (size_t)s->peer + (s->kind == WEFT_STEP_SEND ? 0 : 1)];
                if (*mark == gen)
                    continue; /* an earlier message to/from this peer is not posted yet */
            }
            if (!deps_done(op, s) ||
                (s->kind == WEFT_STEP_RECV_REDUCE && eng->nfree_slots == 0)) {
                if (mark)
                    *mark = gen;
                continue;
            }
            size_t bytes = s->count * op->esize;
            weft_status_t st = WEFT_OK;
            if (s->peer == comm->rank) {
                /* A message to ourselves never touches the transport. */
                st = post_self(eng, op, (uint32_t)i);
                if (st == WEFT_INPROGRESS) {
                    *mark = gen;
                    continue;
                }
                if (st != WEFT_OK)
                    return st;
                *changed = true;
                continue;
            }
            switch (s->kind) {
            case WEFT_STEP_COPY: {
                char *dst = step_ptr(op, s->buf, s->off);
                const char *src = step_ptr(op, s->src_buf, s->src_off);
                if (dst != src)
                    memmove(dst, src, bytes);
                op->st[i] = ST_DONE;
                op->ndone++;
                *changed = true;
                continue;
            }
            case WEFT_STEP_SEND:
                st = t->isend(comm->conns[s->peer], step_ptr(op, s->buf, s->off), bytes, NULL,
                              &op->treq[i]);
                break;
            case WEFT_STEP_RECV:
                st = t->irecv(comm->conns[s->peer], step_ptr(op, s->buf, s->off), bytes, NULL,
                              &op->treq[i]);
                break;
            case WEFT_STEP_RECV_REDUCE: {
                int32_t slot = eng->free_slots[--eng->nfree_slots];
                op->slot[i] = slot;
                st = t->irecv(comm->conns[s->peer], eng->staging + (size_t)slot * eng->chunk_bytes,
                              bytes, NULL, &op->treq[i]);
                if (st != WEFT_OK)
                    eng->free_slots[eng->nfree_slots++] = slot;
                break;
            }
            default:
                st = weft_error(comm, WEFT_ERR_INTERNAL, "bad step kind %d", s->kind);
            }
            if (st != WEFT_OK)
                return st;
            op->st[i] = ST_POSTED;
            op->posted[op->nposted++] = (uint32_t)i;
            *changed = true;
        }
    }
    return WEFT_OK;
}

static const char *coll_label(const struct weft_op *op, char *buf, size_t len)
{
    snprintf(buf, len, "%s #%llu (count %zu, %s)", weft_coll_name(op->a.coll),
             (unsigned long long)op->seq, op->a.count, dtype_name(op->a.dtype));
    return buf;
}

/* Tests posted steps; reduces landed chunks.  Returns an error to fail all. */
static weft_status_t complete_posted(struct weft_engine *eng, struct weft_op *op, bool *changed)
{
    struct weft_comm *comm = eng->comm;
    for (size_t k = 0; k < op->nposted;) {
        uint32_t i = op->posted[k];
        const struct weft_step *s = &op->s->steps[i];
        int done = 0;
        size_t got = 0;
        weft_status_t st = comm->tops->test(op->treq[i], &done, &got);
        if (st != WEFT_OK) {
            char label[160], why[WEFT_ERRMSG_LEN];
            op->st[i] = ST_DONE; /* the transport freed the request */
            if (s->kind == WEFT_STEP_RECV_REDUCE)
                eng->free_slots[eng->nfree_slots++] = op->slot[i];
            op->posted[k] = op->posted[--op->nposted];
            return weft_error(comm, st, "rank %d: %s failed while %s rank %d: %s", comm->rank,
                              coll_label(op, label, sizeof(label)),
                              s->kind == WEFT_STEP_SEND ? "sending to" : "receiving from", s->peer,
                              weft_comm_last_error_copy(comm, why, sizeof(why)));
        }
        if (!done) {
            k++;
            continue;
        }
        size_t bytes = s->count * op->esize;
        if (s->kind != WEFT_STEP_SEND && got != bytes) {
            char label[160];
            if (s->kind == WEFT_STEP_RECV_REDUCE)
                eng->free_slots[eng->nfree_slots++] = op->slot[i];
            op->st[i] = ST_DONE;
            op->posted[k] = op->posted[--op->nposted];
            return weft_error(comm, WEFT_ERR_REMOTE,
                              "rank %d: %s: rank %d sent %zu bytes where %zu were expected "
                              "(do all ranks call the same collectives with the same counts?)",
                              comm->rank, coll_label(op, label, sizeof(label)), s->peer, got,
                              bytes);
        }
        if (s->kind == WEFT_STEP_RECV_REDUCE) {
            int32_t slot = op->slot[i];
            int divisor = (s->flags & WEFT_STEP_FINAL) && op->a.op == WEFT_AVG ? comm->nranks : 0;
            const char *mine = step_ptr(op, s->src_buf, s->src_off);
            const char *got = eng->staging + (size_t)slot * eng->chunk_bytes;
            bool swap = s->flags & WEFT_STEP_RECV_FIRST;
            weft_reduce_local(step_ptr(op, s->buf, s->off), swap ? got : mine, swap ? mine : got,
                              s->count, op->a.dtype, op->a.op, divisor);
            eng->free_slots[eng->nfree_slots++] = slot;
        }
        op->st[i] = ST_DONE;
        op->ndone++;
        op->posted[k] = op->posted[--op->nposted];
        *changed = true;
    }
    return WEFT_OK;
}

/* One pass of driving.  *changed tells whether anything moved. */
static weft_status_t drive_once(struct weft_engine *eng, bool *changed)
{
    struct weft_comm *comm = eng->comm;
    activate(eng);
    for (struct weft_op *op = eng->active; op; op = op->next)
        if (!op->started)
            WEFT_CHECK(start_op(eng, op));
    WEFT_CHECK(post_ready(eng, changed));
    if (eng->active)
        WEFT_CHECK(comm->tops->progress(comm->tctx, 0));
    for (struct weft_op *op = eng->active; op; op = op->next)
        WEFT_CHECK(complete_posted(eng, op, changed));
    /* Retire finished ops; completion is reported in issue order. */
    while (eng->active && eng->active->ndone == eng->active->s->nsteps) {
        struct weft_op *op = eng->active;
        eng->active = op->next;
        if (!eng->active)
            eng->active_tail = NULL;
        eng->nactive--;
        finish(eng, op, WEFT_OK);
        *changed = true;
    }
    return WEFT_OK;
}

static weft_status_t stall_error(struct weft_engine *eng)
{
    struct weft_comm *comm = eng->comm;
    struct weft_op *op = eng->active;
    char label[160], peers[256] = "";
    size_t o = 0;
    for (size_t k = 0; op && k < op->nposted && o + 40 < sizeof(peers); k++) {
        const struct weft_step *s = &op->s->steps[op->posted[k]];
        o += (size_t)snprintf(peers + o, sizeof(peers) - o, "%s%s rank %d", o ? ", " : "",
                              s->kind == WEFT_STEP_SEND ? "send to" : "receive from", s->peer);
    }
    return weft_error(comm, WEFT_ERR_TIMEOUT,
                      "rank %d: %s made no progress for %llu ms (WEFT_TIMEOUT_MS); waiting on: %s",
                      comm->rank, op ? coll_label(op, label, sizeof(label)) : "operation",
                      (unsigned long long)(comm->timeout_ns / 1000000), o ? peers : "nothing posted");
}

/* Drives until `until` is done (or, with until == NULL, until no op is
 * left).  Called by the thread that set driving. */
static void drive(struct weft_engine *eng, struct weft_op *until)
{
    struct weft_comm *comm = eng->comm;
    uint64_t spin_ns = (uint64_t)eng->spin_us * 1000;
    uint64_t idle_since = weft_now_ns();
    eng->last_event_ns = idle_since;
    for (;;) {
        pthread_mutex_lock(&eng->mu);
        bool stop = until ? until->done : (eng->nlive == 0 || eng->stop);
        pthread_mutex_unlock(&eng->mu);
        if (stop)
            return;
        if (atomic_load(&comm->aborting) || atomic_load(&comm->error) != WEFT_OK) {
            fail_all(eng, atomic_load(&comm->error) != WEFT_OK ? atomic_load(&comm->error)
                                                              : WEFT_ERR_ABORTED);
            continue;
        }
        bool changed = false;
        weft_status_t st = drive_once(eng, &changed);
        if (st != WEFT_OK) {
            fail_all(eng, st);
            continue;
        }
        uint64_t now = weft_now_ns();
        if (changed) {
            idle_since = eng->last_event_ns = now;
            continue;
        }
        if (!eng->active) {
            /* Nothing active: the queue is empty (activate ran); done. */
            continue;
        }
        if (now - eng->last_event_ns > comm->timeout_ns) {
            fail_all(eng, stall_error(eng));
            continue;
        }
        if (now - idle_since < spin_ns)
            continue;
        uint64_t left_ms = (comm->timeout_ns - (now - eng->last_event_ns)) / 1000000 + 1;
        st = comm->tops->progress(comm->tctx, (int)WEFT_MIN(left_ms, POLL_SLICE_MS));
        if (st != WEFT_OK)
            fail_all(eng, st);
    }
}

static void *progress_main(void *arg)
{
    struct weft_engine *eng = arg;
    weft_log_set_rank(eng->comm->rank);
    pthread_mutex_lock(&eng->mu);
    while (!eng->stop) {
        if (eng->nlive == 0 || eng->driving) {
            pthread_cond_wait(&eng->cv, &eng->mu);
            continue;
        }
        eng->driving = true;
        pthread_mutex_unlock(&eng->mu);
        drive(eng, NULL);
        pthread_mutex_lock(&eng->mu);
        eng->driving = false;
        pthread_cond_broadcast(&eng->cv);
    }
    pthread_mutex_unlock(&eng->mu);
    return NULL;
}

void weft_engine_submit(struct weft_comm *comm, struct weft_op *op, bool background)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    op->seq = eng->next_seq++;
    op->next = NULL;
    op->started = false;
    if (eng->qtail)
        eng->qtail->next = op;
    else
        eng->qhead = op;
    eng->qtail = op;
    eng->nlive++;
    if (background && !eng->thread_started && !eng->stop) {
        if (pthread_create(&eng->thread, NULL, progress_main, eng) == 0)
            eng->thread_started = true;
        else
            WEFT_WARN(WEFT_SUB_COLL, "cannot start the progress thread (%s); non-blocking "
                                     "operations move only inside weft_wait/weft_test",
                      strerror(errno));
    }
    bool wake = eng->driving;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
    if (wake)
        comm->tops->wakeup(comm->tctx);
}

static weft_status_t reap(struct weft_engine *eng, struct weft_op *op)
{
    weft_status_t st = op->status;
    sched_put(eng, op);
    pthread_mutex_lock(&eng->mu);
    op->next = eng->free_ops;
    eng->free_ops = op;
    pthread_mutex_unlock(&eng->mu);
    return st;
}

weft_status_t weft_engine_wait(struct weft_comm *comm, struct weft_op *op)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    while (!op->done) {
        if (!eng->driving) {
            eng->driving = true;
            pthread_mutex_unlock(&eng->mu);
            drive(eng, op);
            pthread_mutex_lock(&eng->mu);
            eng->driving = false;
            pthread_cond_broadcast(&eng->cv);
        } else {
            pthread_cond_wait(&eng->cv, &eng->mu);
        }
    }
    pthread_mutex_unlock(&eng->mu);
    return reap(eng, op);
}

weft_status_t weft_engine_test(struct weft_comm *comm, struct weft_op *op, int *done)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    bool drive_now = !op->done && !eng->driving && !eng->thread_started;
    if (drive_now)
        eng->driving = true;
    pthread_mutex_unlock(&eng->mu);
    if (drive_now) {
        /* No progress thread: one non-blocking pass moves the op along. */
        bool changed = false;
        weft_status_t st = drive_once(eng, &changed);
        if (st != WEFT_OK)
            fail_all(eng, st);
        pthread_mutex_lock(&eng->mu);
        eng->driving = false;
        pthread_cond_broadcast(&eng->cv);
        pthread_mutex_unlock(&eng->mu);
    }
    pthread_mutex_lock(&eng->mu);
    bool fin = op->done;
    pthread_mutex_unlock(&eng->mu);
    *done = fin;
    if (!fin)
        return WEFT_INPROGRESS;
    return reap(eng, op);
}

weft_status_t weft_engine_drain(struct weft_comm *comm)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    while (eng->nlive > 0) {
        if (!eng->driving) {
            eng->driving = true;
            pthread_mutex_unlock(&eng->mu);
            drive(eng, NULL);
            pthread_mutex_lock(&eng->mu);
            eng->driving = false;
            pthread_cond_broadcast(&eng->cv);
        } else {
            pthread_cond_wait(&eng->cv, &eng->mu);
        }
    }
    pthread_mutex_unlock(&eng->mu);
    return (weft_status_t)atomic_load(&comm->error);
}

void weft_engine_abort(struct weft_comm *comm, weft_status_t status)
{
    struct weft_engine *eng = comm->eng;
    weft_comm_fail(comm, status);
    atomic_store(&comm->aborting, 1);
    comm->tops->wakeup(comm->tctx);
    pthread_mutex_lock(&eng->mu);
    while (eng->driving) {
        pthread_mutex_unlock(&eng->mu);
        comm->tops->wakeup(comm->tctx);
        pthread_mutex_lock(&eng->mu);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 10 * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&eng->cv, &eng->mu, &ts);
    }
    eng->driving = true;
    pthread_mutex_unlock(&eng->mu);
    fail_all(eng, status);
    pthread_mutex_lock(&eng->mu);
    eng->driving = false;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
}
