/*
 * engine.c - executes schedules over the transport.  One thread at a time
 * "drives": it posts every step whose dependencies are met (keeping each
 * peer's message order across operations), moves bytes, reduces chunks as
 * they land and retires operations in issue order.  A blocking call drives
 * from the caller's thread; non-blocking calls are driven by a per-
 * communicator progress thread that sleeps in poll() or on a condition
 * variable when there is nothing to do.  With WEFT_CHECK, a collective is
 * held back until the fingerprint exchange before it has agreed.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine_impl.h"
#include "reduce.h"
#include "select/tune.h"
#include "transports/transport.h"

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
    if ((op->kind == OP_USER || op->kind == OP_SYNC) && st == WEFT_OK) {
        /* A trial's time: from when it started, or from when the op before
         * it (or the barrier before its run) finished if that was later
         * (ops in flight together share the links; each is charged what it
         * added). */
        uint64_t now = weft_now_ns();
        if (op->trial >= 0) {
            double t = (double)(now - WEFT_MAX(op->t0, eng->last_finish_ns)) * 1e-9;
            /* Cut from its run's call before (tune.h): stored negated. */
            bool cut = op->trial % weft_tune_run_calls(op->tm) != 0 &&
                       (eng->last_tm != op->tm || eng->last_trial != op->trial - 1 ||
                        op->t0 > eng->last_finish_ns + WEFT_TUNE_PAUSE_NS);
            op->tm->t[op->trial] = cut ? -t : t;
        }
        if (op->kind == OP_USER)
            eng->last_tm = op->tm, eng->last_trial = op->trial;
        eng->last_finish_ns = now;
    }
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

/* Finishes a retired or failed op of the engine's own (a check or tune
 * op): nobody waits for it. */
static void finish_internal(struct weft_engine *eng, struct weft_op *op, weft_status_t st)
{
    finish(eng, op, st);
    weft_engine_reap(eng, op);
}

static void finish_any(struct weft_engine *eng, struct weft_op *op, weft_status_t st)
{
    (op->kind == OP_USER ? finish : finish_internal)(eng, op, st);
}

/* Fails every active and queued op; the comm keeps the sticky error. */
static void fail_all(struct weft_engine *eng, weft_status_t st)
{
    st = weft_comm_fail(eng->comm, st);
    weft_comm_tell_peers(eng->comm);
    for (struct weft_op *op = eng->active, *next; op; op = next) {
        next = op->next;
        finish_any(eng, op, st);
    }
    eng->active = eng->active_tail = NULL;
    eng->nactive = 0;
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
        finish_any(eng, op, st);
    }
}

static inline char *step_ptr(const struct weft_op *op, int buf, size_t off)
{
    return op->bufs[buf] + off * op->esize;
}

/* A RECV_REDUCE is posted as soon as its dependencies are in flight: the
 * bytes land in a staging slot and only the reduce waits for them.  Holding
 * the receive back instead would make two partners that each send before
 * combining depend on the kernel buffering a whole chunk (rd with chunks
 * larger than the socket buffers hung that way). */
static bool deps_posted(const struct weft_op *op, const struct weft_step *s)
{
    for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
        if (s->deps[k] >= 0 && op->st[s->deps[k]] == ST_PENDING)
            return false;
    return true;
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
    WEFT_CHECK(weft_engine_scratch_acquire(eng, op));
    op->bufs[WEFT_BUF_SCRATCH] = op->scratch ? op->scratch->p : NULL;
    op->started = true;
    op->t0 = weft_now_ns();
    return WEFT_OK;
}

/* Elements [first, first + n) of the step: buf = src op got (got op src
 * with RECV_FIRST); the FINAL step of an AVG divides. */
static void combine(struct weft_engine *eng, struct weft_op *op, const struct weft_step *s,
                    size_t first, size_t n, const char *got)
{
    int divisor = (s->flags & WEFT_STEP_FINAL) && op->a.op == WEFT_AVG ? eng->comm->nranks : 0;
    const char *mine = step_ptr(op, s->src_buf, s->src_off + first);
    bool swap = s->flags & WEFT_STEP_RECV_FIRST;
    weft_reduce_local(step_ptr(op, s->buf, s->off + first), swap ? got : mine, swap ? mine : got,
                      n, op->a.dtype, op->a.op, divisor);
}

/* irecv_take's offer of a chunk of a RECV_REDUCE: combined from the
 * transport's memory when the step's inputs are final, else staged. */
static bool take_chunk(void *arg, size_t off, const void *data, size_t len)
{
    struct weft_rr *rr = arg;
    struct weft_op *op = rr->op;
    const struct weft_step *s = &op->s->steps[rr->step];
    size_t es = op->esize;
    /* Once one chunk is taken the inputs stay final, so the staged bytes
     * are a prefix; every chunk but the last is a multiple of 8 bytes. */
    if (rr->staged > off || off % es || len % es || !deps_done(op, s)) {
        rr->staged = off + len;
        return false;
    }
    combine(rr->eng, op, s, off / es, len / es, data);
    return true;
}

/* Posts every step that may go now.  Returns true if anything changed. */
static weft_status_t post_ready(struct weft_engine *eng, bool *changed)
{
    struct weft_comm *comm = eng->comm;
    uint32_t gen = ++eng->gen;
    int budget = SCAN_BUDGET;
    /* The oldest op with a step left to post may take any free staging
     * slot; a later one must leave one free.  A later op's receive-reduces
     * can hold every slot while they wait for messages their senders send
     * only after this op's messages, which need a slot here: a cycle
     * across ranks.  One slot is enough for an op alone (the symbolic
     * checker runs every schedule with WEFT_STAGING_SLOTS=1). */
    bool oldest = true;
    for (struct weft_op *op = eng->active; op && budget > 0; op = op->next) {
        /* A collective whose fingerprints have not agreed yet, or that is
         * not started (waiting for a measurement), moves nothing, and ops
         * after it wait too: posting theirs first would break each peer's
         * message order. */
        if (op->gated || !op->started)
            break;
        const struct weft_step *steps = op->s->steps;
        size_t n = op->s->nsteps;
        while (op->first_pending < n && op->st[op->first_pending] != ST_PENDING)
            op->first_pending++;
        int keep = oldest ? 0 : 1; /* free slots this op must leave */
        oldest = oldest && op->first_pending == n;
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
            bool early = s->kind == WEFT_STEP_RECV_REDUCE;
            bool ready = early ? deps_posted(op, s) : deps_done(op, s);
            if (!ready || (early && eng->nfree_slots <= keep)) {
                if (mark)
                    *mark = gen;
                continue;
            }
            size_t bytes = s->count * op->esize;
            weft_status_t st = WEFT_OK;
            /* A COPY step has no peer; a message to this rank goes over
             * the self transport like any other. */
            const struct weft_transport_ops *t =
                s->kind == WEFT_STEP_COPY ? NULL : comm->link_ops[s->peer];
            void *conn = s->kind == WEFT_STEP_COPY ? NULL : comm->conns[s->peer];
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
                st = t->isend(conn, step_ptr(op, s->buf, s->off), bytes, &op->treq[i]);
                eng->stats.sends++;
                break;
            case WEFT_STEP_RECV:
                st = t->irecv(conn, step_ptr(op, s->buf, s->off), bytes, &op->treq[i]);
                break;
            case WEFT_STEP_RECV_REDUCE: {
                int32_t slot = eng->free_slots[--eng->nfree_slots];
                struct weft_rr *rr = &op->rr[i];
                *rr = (struct weft_rr){eng, op, (uint32_t)i, slot, bytes};
                char *stage = eng->staging + (size_t)slot * eng->chunk_bytes;
                if (t->irecv_take) {
                    rr->staged = 0;
                    st = t->irecv_take(conn, stage, bytes, take_chunk, rr, &op->treq[i]);
                } else {
                    st = t->irecv(conn, stage, bytes, &op->treq[i]);
                }
                if (st != WEFT_OK)
                    eng->free_slots[eng->nfree_slots++] = slot;
                break;
            }
            default:
                st = weft_error(weft_comm_err(comm), WEFT_ERR_INTERNAL, "bad step kind %d", s->kind);
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
    if (op->kind == OP_CHECK)
        snprintf(buf, len, "the fingerprint exchange (WEFT_CHECK) before %s #%llu",
                 weft_coll_name(op->a.coll), (unsigned long long)op->seq);
    else if (op->kind == OP_TUNE)
        snprintf(buf, len, "the trial-time exchange (WEFT_TUNE_TRIALS) before %s #%llu",
                 weft_coll_name(op->tm->coll), (unsigned long long)op->seq);
    else if (op->kind == OP_SYNC)
        snprintf(buf, len, "the barrier before a run of trials (WEFT_TUNE_TRIALS) of %s #%llu",
                 weft_coll_name(op->tm->coll), (unsigned long long)op->seq);
    else
        snprintf(buf, len, "%s #%llu (count %zu, %s)", weft_coll_name(op->a.coll),
                 (unsigned long long)op->seq, op->a.count, weft_dtype_name(op->a.dtype));
    return buf;
}

/* Combines a landed chunk into its destination and frees its slot. */
static void reduce_landed(struct weft_engine *eng, struct weft_op *op, const struct weft_step *s,
                          uint32_t i)
{
    struct weft_rr *rr = &op->rr[i];
    size_t n = WEFT_MIN(rr->staged, s->count * op->esize) / op->esize;
    if (n > 0)
        combine(eng, op, s, 0, n, eng->staging + (size_t)rr->slot * eng->chunk_bytes);
    eng->free_slots[eng->nfree_slots++] = rr->slot;
    op->st[i] = ST_DONE;
    op->ndone++;
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
        if (op->st[i] == ST_LANDED) {
            if (!deps_done(op, s)) {
                k++;
                continue;
            }
            reduce_landed(eng, op, s, i);
            op->posted[k] = op->posted[--op->nposted];
            *changed = true;
            continue;
        }
        weft_status_t st = comm->link_ops[s->peer]->test(op->treq[i], &done, &got);
        if (st != WEFT_OK) {
            char label[160], why[WEFT_ERRMSG_LEN];
            op->st[i] = ST_DONE; /* the transport freed the request */
            if (s->kind == WEFT_STEP_RECV_REDUCE)
                eng->free_slots[eng->nfree_slots++] = op->rr[i].slot;
            op->posted[k] = op->posted[--op->nposted];
            return weft_error(weft_comm_err(comm), st, "rank %d: %s failed while %s rank %d: %s", comm->rank,
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
                eng->free_slots[eng->nfree_slots++] = op->rr[i].slot;
            op->st[i] = ST_DONE;
            op->posted[k] = op->posted[--op->nposted];
            return weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE,
                              "rank %d: %s: rank %d sent %zu bytes where %zu were expected "
                              "(do all ranks call the same collectives with the same counts?)",
                              comm->rank, coll_label(op, label, sizeof(label)), s->peer, got,
                              bytes);
        }
        *changed = true;
        if (s->kind == WEFT_STEP_RECV_REDUCE) {
            op->st[i] = ST_LANDED;
            if (!deps_done(op, s)) {
                k++;
                continue;
            }
            reduce_landed(eng, op, s, i);
        } else {
            op->st[i] = ST_DONE;
            op->ndone++;
        }
        op->posted[k] = op->posted[--op->nposted];
    }
    return WEFT_OK;
}

/* One pass of driving.  *changed tells whether anything moved. */
static weft_status_t drive_once(struct weft_engine *eng, bool *changed)
{
    struct weft_comm *comm = eng->comm;
    activate(eng);
    for (struct weft_op *op = eng->active; op; op = op->next) {
        /* Nothing starts behind a trial barrier until it has retired. */
        if (op->started) {
            if (op->kind == OP_SYNC)
                break;
            continue;
        }
        /* Started in order; what follows an op that may not start yet
         * waits (post_ready stops there anyway). */
        if (op->pending) {
            if (!atomic_load(&op->tm->decided))
                break;
            WEFT_CHECK(weft_engine_op_plan(eng, op));
        }
        if (op->kind == OP_TUNE || op->kind == OP_SYNC) {
            /* Our times are final, and the calls before a run of trials
             * are over here, once every op before it has retired.  (A send
             * or receive among them waits at most for an op its peer
             * issued before the same barrier: a pair's messages match in
             * issue order.) */
            if (op != eng->active)
                break;
            if (op->kind == OP_TUNE)
                memcpy(op->times + op->a.count * (size_t)comm->rank, op->tm->t,
                       op->a.count * sizeof(double));
        }
        WEFT_CHECK(start_op(eng, op));
        if (op->kind == OP_SYNC)
            break;
    }
    WEFT_CHECK(post_ready(eng, changed));
    if (eng->active)
        WEFT_CHECK(weft_comm_progress(comm, 0));
    for (struct weft_op *op = eng->active; op; op = op->next) {
        WEFT_CHECK(complete_posted(eng, op, changed));
        if (op->kind == OP_CHECK && !op->verified && op->ndone == op->s->nsteps) {
            /* Every record is in: agree, or fail the communicator. */
            WEFT_CHECK(weft_check_verify(comm, op->fps));
            op->verified = true;
            op->target->gated = false;
            *changed = true;
        }
    }
    /* Retire finished ops; completion is reported in issue order. */
    while (eng->active && eng->active->started && eng->active->ndone == eng->active->s->nsteps) {
        struct weft_op *op = eng->active;
        if (op->kind == OP_TUNE)
            weft_tune_record(comm, op->tm, op->times);
        eng->active = op->next;
        if (!eng->active)
            eng->active_tail = NULL;
        eng->nactive--;
        finish_any(eng, op, WEFT_OK);
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
        bool send = s->kind == WEFT_STEP_SEND, seen = false;
        for (size_t j = 0; j < k && !seen; j++) { /* name each link once */
            const struct weft_step *t = &op->s->steps[op->posted[j]];
            seen = t->peer == s->peer && (t->kind == WEFT_STEP_SEND) == send;
        }
        if (!seen)
            o += (size_t)snprintf(peers + o, sizeof(peers) - o, "%s%s rank %d", o ? ", " : "",
                                  send ? "send to" : "receive from", s->peer);
    }
    return weft_error(weft_comm_err(comm), WEFT_ERR_TIMEOUT,
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
        if (now - idle_since < spin_ns) {
            /* Oversubscribed, or a wait longer than a peer's step should
             * take (another process may hold the core the peer needs):
             * let the rank we wait for run.  Nobody waiting: it returns. */
            if (eng->yield || now - idle_since > YIELD_AFTER_NS)
                sched_yield();
            continue;
        }
        uint64_t left_ms = (comm->timeout_ns - (now - eng->last_event_ns)) / 1000000 + 1;
        st = weft_comm_progress(comm, (int)WEFT_MIN(left_ms, POLL_SLICE_MS));
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

/* Appends op to the queue; called with mu held. */
static void enqueue(struct weft_engine *eng, struct weft_op *op)
{
    op->next = NULL;
    op->started = false;
    if (eng->qtail)
        eng->qtail->next = op;
    else
        eng->qhead = op;
    eng->qtail = op;
    eng->nlive++;
}

void weft_engine_submit(struct weft_comm *comm, struct weft_op *op, bool background)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    op->seq = eng->next_seq++;
    eng->stats.ops++;
    struct weft_op *tune = op->tune_pre, *pre = op->pre;
    if (pre) {
        /* The fingerprint exchange goes first, under the same number (it
         * also tells whether a barrier or trial-time exchange follows);
         * the engine owns it from here. */
        op->pre = NULL;
        pre->seq = op->seq;
        pre->fps[comm->rank].seq = eng->coll_seq++;
        op->gated = true;
        eng->stats.checks++;
        enqueue(eng, pre);
    }
    if (tune) {
        /* Then the trial barrier or trial-time exchange. */
        op->tune_pre = NULL;
        tune->seq = op->seq;
        enqueue(eng, tune);
    }
    enqueue(eng, op);
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
        weft_comm_wakeup(comm);
}

/* Drives, or waits for the thread that drives, until op is done (op NULL:
 * until no op is live).  Called and returns with eng->mu held. */
static void drive_until(struct weft_engine *eng, struct weft_op *op)
{
    while (op ? !op->done : eng->nlive > 0) {
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
}

weft_status_t weft_engine_wait(struct weft_comm *comm, struct weft_op *op)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    drive_until(eng, op);
    pthread_mutex_unlock(&eng->mu);
    return weft_engine_reap(eng, op);
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
    return weft_engine_reap(eng, op);
}

weft_status_t weft_engine_drain(struct weft_comm *comm)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    drive_until(eng, NULL);
    pthread_mutex_unlock(&eng->mu);
    return (weft_status_t)atomic_load(&comm->error);
}

void weft_engine_get_stats(struct weft_comm *comm, struct weft_engine_stats *out)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    *out = eng->stats;
    pthread_mutex_unlock(&eng->mu);
}

/* Waits until no thread drives comm, then drives it: the transports are
 * ours until engine_release. */
static void engine_take(struct weft_comm *comm)
{
    struct weft_engine *eng = comm->eng;
    pthread_mutex_lock(&eng->mu);
    while (eng->driving) {
        pthread_mutex_unlock(&eng->mu);
        weft_comm_wakeup(comm);
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
}

static void engine_release(struct weft_engine *eng)
{
    pthread_mutex_lock(&eng->mu);
    eng->driving = false;
    pthread_cond_broadcast(&eng->cv);
    pthread_mutex_unlock(&eng->mu);
}

weft_status_t weft_engine_exclusive(struct weft_comm *comm, weft_status_t (*fn)(void *), void *arg)
{
    engine_take(comm);
    weft_status_t st = fn(arg);
    engine_release(comm->eng);
    return st;
}

weft_status_t weft_engine_fail(struct weft_comm *comm, weft_status_t status)
{
    engine_take(comm);
    fail_all(comm->eng, status);
    engine_release(comm->eng);
    return (weft_status_t)atomic_load(&comm->error);
}

void weft_engine_abort(struct weft_comm *comm, weft_status_t status)
{
    weft_comm_fail(comm, status);
    atomic_store(&comm->aborting, 1);
    weft_comm_wakeup(comm);
    weft_engine_fail(comm, status);
}
