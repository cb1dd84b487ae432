/*
 * sched_sim.c - the symbolic simulator and checker of schedules: send/receive
 * matching, the engine's execution rules, deadlock reports, the race check
 * and the check of what every rank holds.  How it works: see sched_sim.h.
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_sim.h"

/* ---- the simulator -------------------------------------------------------------- */

struct sim_rank {
    const struct weft_schedule *s;
    struct segmap mem;
    size_t base[3], len[3];  /* per weft_buf_id, in elements */
    int32_t *match_rank, *match_step;
    int32_t *ndeps;          /* deps not yet DONE */
    int32_t *nunposted;      /* deps still PENDING */
    int32_t *prev_link, *next_link; /* the step before / after on the same link, -1 */
    uint8_t *state;          /* enum sim_state */
    int32_t *dep_start, *dep_list; /* CSR: the steps that depend on a step */
    size_t final_elems;      /* elements this rank reduced with FINAL */
    struct runs *staged;     /* per receive: the data that reached it, until delivered */
    int free_slots;          /* staging slots not held by a RECV_REDUCE (sim.slots > 0) */
    int32_t *waiting;        /* RECV_REDUCEs that could post but for a slot (< p) */
    int nwaiting;
};

/* A step's progress, as the engine's ST_* states.  A link is the messages
 * to one peer (sends) or from it (receives of either kind). */
enum sim_state { S_PENDING = 0, S_POSTED, S_LANDED, S_DONE };

struct sim {
    int coll, p, root, algo;
    size_t count;
    bool inplace;
    /* false: a send completes only together with its receive (what the
     * engine does once socket buffers are full); true: a send takes its
     * data and completes at once, the receive gets it whenever it is ready
     * (unlimited buffering: data flow only, weaker on deadlocks). */
    bool buffered;
    /* Staging slots per rank a posted RECV_REDUCE holds until it has
     * reduced (the engine's WEFT_STAGING_SLOTS); 0: unlimited. */
    int slots;
    struct sim_rank r[MAXP];
    struct exprs ex;
    char err[600];
    struct runs ra, rb, rc;
    int32_t *stack; /* steps to look at again, as (rank, step) pairs */
    size_t nstack, capstack;
};

static bool fail(struct sim *sm, const char *fmt, ...) WEFT_PRINTF(2, 3);
static bool fail(struct sim *sm, const char *fmt, ...)
{
    if (sm->err[0])
        return false; /* keep the first error */
    char how[40] = ", buffered sends";
    if (!sm->buffered && sm->slots > 0)
        snprintf(how, sizeof(how), ", %d staging slot%s", sm->slots, sm->slots > 1 ? "s" : "");
    else if (!sm->buffered)
        snprintf(how, sizeof(how), ", unlimited staging");
    int n = snprintf(sm->err, sizeof(sm->err), "%s %s p=%d root=%d count=%zu %s%s: ",
                     weft_algo_name(PLAN_ALGO(sm->algo)), weft_coll_name(sm->coll), sm->p, sm->root,
                     sm->count, sm->inplace ? "in place" : "out of place", how);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sm->err + n, sizeof(sm->err) - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

const char *kind_name(int k)
{
    static const char *const n[] = { "SEND", "RECV", "RECV_REDUCE", "COPY" };
    return k >= 0 && k < 4 ? n[k] : "?";
}

/* Where each buffer lives in a rank's memory.  In place, sendbuf and
 * recvbuf overlap as weft.h says (allgather: send = recv + rank*count;
 * reduce_scatter: recv = send + rank*count; others: the same memory). */
static void layout(struct sim *sm, int rank, const struct weft_coll_desc *d, size_t scratch)
{
    struct sim_rank *r = &sm->r[rank];
    size_t sc = weft_coll_send_count(d), rc = weft_coll_recv_count(d);
    r->len[WEFT_BUF_SEND] = sc;
    r->len[WEFT_BUF_RECV] = rc;
    r->len[WEFT_BUF_SCRATCH] = scratch;
    size_t top;
    if (!sm->inplace) {
        r->base[WEFT_BUF_SEND] = 0;
        r->base[WEFT_BUF_RECV] = sc;
        top = sc + rc;
    } else if (sm->coll == WEFT_COLL_ALLGATHER) {
        r->base[WEFT_BUF_RECV] = 0;
        r->base[WEFT_BUF_SEND] = (size_t)rank * sm->count;
        top = rc;
    } else if (sm->coll == WEFT_COLL_REDUCE_SCATTER) {
        r->base[WEFT_BUF_SEND] = 0;
        r->base[WEFT_BUF_RECV] = (size_t)rank * sm->count;
        top = sc;
    } else {
        r->base[WEFT_BUF_SEND] = r->base[WEFT_BUF_RECV] = 0;
        top = WEFT_MAX(sc, rc);
    }
    r->base[WEFT_BUF_SCRATCH] = top;
    seg_init(&r->mem, top + scratch + 1);
    if (sc) {
        struct runs in = { 0 };
        runs_push(&in, 0, (struct val){ 1ull << rank, 0, -1, 0, rank });
        seg_write(&r->mem, r->base[WEFT_BUF_SEND], sc, &in);
        free(in.r);
    }
}

static bool buf_uses(const struct weft_step *st, int buf)
{
    bool src = st->kind == WEFT_STEP_RECV_REDUCE || st->kind == WEFT_STEP_COPY;
    return st->buf == buf || (src && st->src_buf == buf);
}

/* Per-step rules that need no execution. */
static bool check_steps(struct sim *sm, int rank)
{
    const struct weft_schedule *s = sm->r[rank].s;
    const struct sim_rank *r = &sm->r[rank];
    for (size_t i = 0; i < s->nsteps; i++) {
        const struct weft_step *st = &s->steps[i];
        if (st->kind > WEFT_STEP_COPY)
            return fail(sm, "rank %d step %zu: kind %d", rank, i, st->kind);
        if (st->count == 0)
            return fail(sm, "rank %d step %zu: count 0", rank, i);
        if (st->buf > WEFT_BUF_SCRATCH || st->src_buf > WEFT_BUF_SCRATCH)
            return fail(sm, "rank %d step %zu: buffer id %d/%d", rank, i, st->buf, st->src_buf);
        if (st->kind == WEFT_STEP_COPY ? st->peer != -1
                                       : (st->peer < 0 || st->peer >= sm->p || st->peer == rank))
            return fail(sm, "rank %d step %zu (%s): peer %d", rank, i, kind_name(st->kind),
                        st->peer);
        for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
            if (st->deps[k] < -1 || st->deps[k] >= (int32_t)i)
                return fail(sm, "rank %d step %zu: dep %d", rank, i, st->deps[k]);
        if ((st->flags & WEFT_STEP_FINAL) && st->kind != WEFT_STEP_RECV_REDUCE)
            return fail(sm, "rank %d step %zu: FINAL on a %s", rank, i, kind_name(st->kind));
        if ((st->flags & WEFT_STEP_RECV_FIRST) && st->kind != WEFT_STEP_RECV_REDUCE)
            return fail(sm, "rank %d step %zu: RECV_FIRST on a %s", rank, i,
                        kind_name(st->kind));
        if (st->flags & ~(WEFT_STEP_FINAL | WEFT_STEP_RECV_FIRST))
            return fail(sm, "rank %d step %zu: unknown flags 0x%x", rank, i, st->flags);
        if (st->off > r->len[st->buf] || st->count > r->len[st->buf] - st->off)
            return fail(sm, "rank %d step %zu (%s): [%zu, +%zu) outside buffer %d of %zu", rank,
                        i, kind_name(st->kind), st->off, st->count, st->buf, r->len[st->buf]);
        bool has_src = st->kind == WEFT_STEP_RECV_REDUCE || st->kind == WEFT_STEP_COPY;
        if (has_src && (st->src_off > r->len[st->src_buf] ||
                        st->count > r->len[st->src_buf] - st->src_off))
            return fail(sm, "rank %d step %zu (%s): source [%zu, +%zu) outside buffer %d of %zu",
                        rank, i, kind_name(st->kind), st->src_off, st->count, st->src_buf,
                        r->len[st->src_buf]);
        if (st->kind != WEFT_STEP_SEND && st->buf == WEFT_BUF_SEND)
            return fail(sm, "rank %d step %zu (%s) writes sendbuf", rank, i, kind_name(st->kind));
        if (sm->coll == WEFT_COLL_BROADCAST && rank != sm->root && buf_uses(st, WEFT_BUF_SEND))
            return fail(sm, "rank %d step %zu: a non-root reads sendbuf", rank, i);
        if (sm->coll == WEFT_COLL_REDUCE && rank != sm->root && buf_uses(st, WEFT_BUF_RECV))
            return fail(sm, "rank %d step %zu: a non-root touches recvbuf", rank, i);
        if (st->kind == WEFT_STEP_RECV_REDUCE && sm->coll != WEFT_COLL_ALLREDUCE &&
            sm->coll != WEFT_COLL_REDUCE_SCATTER && sm->coll != WEFT_COLL_REDUCE)
            return fail(sm, "rank %d step %zu: RECV_REDUCE in a collective without reduction",
                        rank, i);
    }
    return true;
}

/* Pairs the k-th send A->B with the k-th receive on B from A. */
static bool match_all(struct sim *sm)
{
    int p = sm->p;
    size_t *nsend = calloc((size_t)p * p, sizeof(size_t));
    size_t *nrecv = calloc((size_t)p * p, sizeof(size_t));
    int32_t **sends = calloc((size_t)p * p, sizeof(int32_t *));
    cr_assert(nsend && nrecv && sends);
    bool ok = true;
    /* Collect each rank's sends per destination, in order. */
    for (int a = 0; a < p; a++) {
        const struct weft_schedule *s = sm->r[a].s;
        for (size_t i = 0; i < s->nsteps; i++) {
            if (s->steps[i].kind != WEFT_STEP_SEND)
                continue;
            size_t key = (size_t)a * p + (size_t)s->steps[i].peer;
            sends[key] = realloc(sends[key], (nsend[key] + 1) * sizeof(int32_t));
            cr_assert(sends[key]);
            sends[key][nsend[key]++] = (int32_t)i;
        }
    }
    for (int b = 0; b < p && ok; b++) {
        const struct weft_schedule *s = sm->r[b].s;
        for (size_t i = 0; i < s->nsteps && ok; i++) {
            const struct weft_step *st = &s->steps[i];
            if (st->kind != WEFT_STEP_RECV && st->kind != WEFT_STEP_RECV_REDUCE)
                continue;
            int a = st->peer;
            size_t key = (size_t)a * p + (size_t)b;
            size_t k = nrecv[key]++;
            if (k >= nsend[key]) {
                ok = fail(sm, "rank %d step %zu: receive #%zu from %d has no send", b, i, k, a);
                break;
            }
            int32_t j = sends[key][k];
            const struct weft_step *sst = &sm->r[a].s->steps[j];
            if (sst->count != st->count) {
                ok = fail(sm, "rank %d step %d sends %zu, rank %d step %zu receives %zu", a, j,
                          sst->count, b, i, st->count);
                break;
            }
            sm->r[b].match_rank[i] = a;
            sm->r[b].match_step[i] = j;
            sm->r[a].match_rank[j] = b;
            sm->r[a].match_step[j] = (int32_t)i;
        }
    }
    for (size_t key = 0; ok && key < (size_t)p * p; key++)
        if (nsend[key] != nrecv[key])
            ok = fail(sm, "rank %zu sends %zu messages to rank %zu, which receives %zu",
                      key / (size_t)p, nsend[key], key % (size_t)p, nrecv[key]);
    for (size_t key = 0; key < (size_t)p * p; key++)
        free(sends[key]);
    free(sends);
    free(nsend);
    free(nrecv);
    return ok;
}

/* Something a step waits for changed: look at it again (run_all). */
static void wake(struct sim *sm, int rank, int32_t step)
{
    if (sm->nstack + 2 > sm->capstack) {
        sm->capstack = sm->capstack ? sm->capstack * 2 : 1024;
        sm->stack = realloc(sm->stack, sm->capstack * sizeof(int32_t));
        cr_assert(sm->stack);
    }
    sm->stack[sm->nstack++] = rank;
    sm->stack[sm->nstack++] = step;
}

/* A step left PENDING: RECV_REDUCEs that wait only for their deps to be in
 * flight, and the next message on the same link, may go now. */
static void mark_posted(struct sim *sm, int rank, int32_t step)
{
    struct sim_rank *r = &sm->r[rank];
    for (int32_t k = r->dep_start[step]; k < r->dep_start[step + 1]; k++) {
        int32_t j = r->dep_list[k];
        if (--r->nunposted[j] == 0)
            wake(sm, rank, j);
    }
    if (r->next_link[step] >= 0)
        wake(sm, rank, r->next_link[step]);
}

static void complete(struct sim *sm, int rank, int32_t step)
{
    struct sim_rank *r = &sm->r[rank];
    r->state[step] = S_DONE;
    for (int32_t k = r->dep_start[step]; k < r->dep_start[step + 1]; k++) {
        int32_t j = r->dep_list[k];
        if (--r->ndeps[j] == 0)
            wake(sm, rank, j);
    }
}

static size_t addr_of(const struct sim_rank *r, int buf, size_t off)
{
    return r->base[buf] + off;
}

/* The receive side of a matched pair (or a COPY), the data arriving in
 * in.  A RECV_REDUCE reads its local operand here, once its deps are done. */
static bool deliver(struct sim *sm, int rank, int32_t step, const struct runs *in)
{
    struct sim_rank *r = &sm->r[rank];
    const struct weft_step *st = &r->s->steps[step];
    size_t dst = addr_of(r, st->buf, st->off);
    if (st->kind != WEFT_STEP_RECV_REDUCE) {
        seg_write(&r->mem, dst, st->count, in);
        return true;
    }
    /* local operand op incoming (incoming op local with RECV_FIRST), run by run */
    seg_read(&r->mem, addr_of(r, st->src_buf, st->src_off), st->count, &sm->rb);
    sm->rc.n = 0;
    uint64_t all = sm->p == 64 ? ~0ull : (1ull << sm->p) - 1;
    size_t ia = 0, ib = 0, off = 0;
    while (off < st->count) {
        while (ia + 1 < in->n && in->r[ia + 1].off <= off)
            ia++;
        while (ib + 1 < sm->rb.n && sm->rb.r[ib + 1].off <= off)
            ib++;
        const struct val *x = &sm->rb.r[ib].v, *y = &in->r[ia].v;
        struct val v = { x->ranks | y->ranks, x->delta, -1, x->flags | y->flags, -1 };
        if (x->ranks & y->ranks)
            v.flags |= V_DUP;
        if (x->delta != y->delta)
            v.flags |= V_MISPLACED;
        bool full = v.ranks == all && v.flags == 0;
        bool final = st->flags & WEFT_STEP_FINAL;
        if (v.flags & V_UNINIT)
            return fail(sm, "rank %d step %d: reduces an element nobody wrote", rank, step);
        if (v.flags & V_DUP)
            return fail(sm, "rank %d step %d: combines rank input twice (0x%llx with 0x%llx)",
                        rank, step, (unsigned long long)x->ranks, (unsigned long long)y->ranks);
        if (v.flags & V_MISPLACED)
            return fail(sm, "rank %d step %d: combines input positions %lld and %lld", rank, step,
                        (long long)(x->delta + (int64_t)off), (long long)(y->delta + (int64_t)off));
        if (final != full)
            return fail(sm, "rank %d step %d: %s (ranks 0x%llx)", rank, step,
                        final ? "FINAL on a partial result" : "the final reduction lacks FINAL",
                        (unsigned long long)v.ranks);
        v.expr = st->flags & WEFT_STEP_RECV_FIRST ? expr_node(&sm->ex, y->expr, x->expr)
                                                  : expr_node(&sm->ex, x->expr, y->expr);
        if (final)
            v.origin = (int64_t)rank << 32 | step;
        runs_push(&sm->rc, off, v);
        size_t na = ia + 1 < in->n ? in->r[ia + 1].off : st->count;
        size_t nb = ib + 1 < sm->rb.n ? sm->rb.r[ib + 1].off : st->count;
        if (final)
            r->final_elems += WEFT_MIN(na, nb) - off;
        off = WEFT_MIN(na, nb);
    }
    seg_write(&r->mem, dst, st->count, &sm->rc);
    return true;
}

/* A receive's data is here and its deps are done: write or reduce it and
 * give its staging slot back. */
static bool finish_recv(struct sim *sm, int rank, int32_t step)
{
    struct sim_rank *r = &sm->r[rank];
    if (!deliver(sm, rank, step, &r->staged[step]))
        return false;
    r->staged[step].n = 0;
    if (r->s->steps[step].kind == WEFT_STEP_RECV_REDUCE && sm->slots > 0)
        r->free_slots++;
    complete(sm, rank, step);
    return true;
}

/* The bytes of receive step are in r->staged[step].  A RECV writes them at
 * once (its deps were done before it was posted); a RECV_REDUCE keeps them
 * in its staging slot until its deps are done (the engine's ST_LANDED). */
static bool land(struct sim *sm, int rank, int32_t step)
{
    struct sim_rank *r = &sm->r[rank];
    if (r->s->steps[step].kind == WEFT_STEP_RECV)
        return finish_recv(sm, rank, step);
    r->state[step] = S_LANDED;
    return r->ndeps[step] > 0 || finish_recv(sm, rank, step);
}

/* Send ss of rank sr hands its data to the receive it is matched with, and
 * so completes. */
static void take_data(struct sim *sm, int sr, int32_t ss)
{
    struct sim_rank *r = &sm->r[sr];
    const struct weft_step *st = &r->s->steps[ss];
    struct sim_rank *q = &sm->r[r->match_rank[ss]];
    seg_read(&r->mem, addr_of(r, st->buf, st->off), st->count, &q->staged[r->match_step[ss]]);
    complete(sm, sr, ss);
}

/* Posts a SEND, RECV or RECV_REDUCE.  A message moves once both its ends
 * are posted; in buffered mode, the send hands its data over at once. */
static bool post(struct sim *sm, int rank, int32_t step)
{
    struct sim_rank *r = &sm->r[rank];
    const struct weft_step *st = &r->s->steps[step];
    int pr = r->match_rank[step];
    int32_t ps = r->match_step[step];
    uint8_t peer_state = sm->r[pr].state[ps];
    r->state[step] = S_POSTED;
    mark_posted(sm, rank, step);
    if (st->kind == WEFT_STEP_SEND) {
        if (sm->buffered || peer_state == S_POSTED)
            take_data(sm, rank, step);
        return peer_state != S_POSTED || land(sm, pr, ps);
    }
    if (st->kind == WEFT_STEP_RECV_REDUCE && sm->slots > 0)
        r->free_slots--;
    if (peer_state == S_POSTED)
        take_data(sm, pr, ps); /* unbuffered: the send was waiting for us */
    else if (peer_state != S_DONE)
        return true; /* S_DONE: buffered, the data is staged already */
    return land(sm, rank, step);
}

/* Moves a step on if it can, by the engine's rules (post_ready and
 * complete_posted in src/engine.c):
 * - SEND, RECV and COPY wait until their deps are DONE;
 * - a RECV_REDUCE is posted once its deps are posted (in flight) and a
 *   staging slot is free; its data lands in the slot, and the reduce, which
 *   reads the local operand, waits until the deps are DONE;
 * - the messages of one link (peer and direction) are posted in schedule
 *   order, a later one never before an earlier one.
 * The engine's rule for a receive from self (deps DONE) is not needed:
 * check_steps rejects schedules that message their own rank. */
static bool advance(struct sim *sm, int rank, int32_t step)
{
    struct sim_rank *r = &sm->r[rank];
    const struct weft_step *st = &r->s->steps[step];
    if (r->state[step] == S_LANDED)
        return r->ndeps[step] > 0 || finish_recv(sm, rank, step);
    if (r->state[step] != S_PENDING)
        return true;
    bool early = st->kind == WEFT_STEP_RECV_REDUCE;
    if (early ? r->nunposted[step] > 0 : r->ndeps[step] > 0)
        return true;
    if (st->kind == WEFT_STEP_COPY) {
        seg_read(&r->mem, addr_of(r, st->src_buf, st->src_off), st->count, &sm->ra);
        if (!deliver(sm, rank, step, &sm->ra))
            return false;
        mark_posted(sm, rank, step);
        complete(sm, rank, step);
        return true;
    }
    int32_t prev = r->prev_link[step];
    if (prev >= 0 && r->state[prev] == S_PENDING)
        return true;
    if (early && sm->slots > 0) {
        /* Queued for a slot; grant_slot hands them out. */
        for (int k = 0; k < r->nwaiting; k++)
            if (r->waiting[k] == step)
                return true;
        /* Links are posted in order, so one waits per peer at most. */
        cr_assert(r->nwaiting < sm->p);
        r->waiting[r->nwaiting++] = step;
        return true;
    }
    return post(sm, rank, step);
}

/* Once nothing else can move, the lowest waiting RECV_REDUCE of a rank with
 * a free slot gets it: the engine's scan posts in step order.  Granting
 * only then plays the ranks' timing against the schedule (others move as
 * far as they can first); *moved tells whether a slot was given. */
static bool grant_slot(struct sim *sm, bool *moved)
{
    *moved = false;
    for (int rank = 0; rank < sm->p; rank++) {
        struct sim_rank *r = &sm->r[rank];
        if (r->free_slots == 0 || r->nwaiting == 0)
            continue;
        int best = 0;
        for (int k = 1; k < r->nwaiting; k++)
            if (r->waiting[k] < r->waiting[best])
                best = k;
        int32_t step = r->waiting[best];
        r->waiting[best] = r->waiting[--r->nwaiting];
        *moved = true;
        return post(sm, rank, step);
    }
    return true;
}

/* Names the step a stuck execution is waiting on: a posted one (one end of
 * the cycle, like the engine's "waiting on") before one never posted. */
static bool report_deadlock(struct sim *sm)
{
    int rank = -1;
    size_t i = 0;
    for (int pass = 0; pass < 2 && rank < 0; pass++)
        for (int q = 0; q < sm->p && rank < 0; q++)
            for (size_t k = 0; k < sm->r[q].s->nsteps && rank < 0; k++) {
                uint8_t s = sm->r[q].state[k];
                if (s != S_DONE && (pass == 1 || s != S_PENDING))
                    rank = q, i = k;
            }
    if (rank < 0)
        return true;
    const struct sim_rank *r = &sm->r[rank];
    const struct weft_step *st = &r->s->steps[i];
    char why[160];
    bool queued = false;
    for (int k = 0; k < r->nwaiting; k++)
        queued |= r->waiting[k] == (int32_t)i;
    if (r->state[i] == S_POSTED)
        snprintf(why, sizeof(why), "posted, but rank %d never posts step %d, its match",
                 r->match_rank[i], r->match_step[i]);
    else if (r->state[i] == S_LANDED)
        snprintf(why, sizeof(why), "its data landed, but its deps never complete");
    else if (queued)
        snprintf(why, sizeof(why), "it waits for a staging slot");
    else
        snprintf(why, sizeof(why), "it is never posted");
    return fail(sm, "deadlock: rank %d step %zu (%s, peer %d) never completes: %s", rank, i,
                kind_name(st->kind), st->peer, why);
}

static bool run_all(struct sim *sm)
{
    for (int rank = 0; rank < sm->p; rank++) {
        struct sim_rank *r = &sm->r[rank];
        size_t n = r->s->nsteps;
        r->match_rank = malloc((n + 1) * sizeof(int32_t));
        r->match_step = malloc((n + 1) * sizeof(int32_t));
        r->ndeps = calloc(n + 1, sizeof(int32_t));
        r->nunposted = calloc(n + 1, sizeof(int32_t));
        r->prev_link = malloc((n + 1) * sizeof(int32_t));
        r->next_link = malloc((n + 1) * sizeof(int32_t));
        r->state = calloc(n + 1, 1);
        r->dep_start = calloc(n + 2, sizeof(int32_t));
        r->staged = calloc(n + 1, sizeof(struct runs));
        r->waiting = calloc((size_t)sm->p, sizeof(int32_t));
        int32_t *last = malloc(2 * (size_t)sm->p * sizeof(int32_t));
        cr_assert(r->match_rank && r->match_step && r->ndeps && r->nunposted && r->prev_link &&
                  r->next_link && r->state && r->dep_start && r->staged && r->waiting && last);
        r->free_slots = sm->slots;
        /* Links: sends to a peer, and receives of either kind from it. */
        for (int k = 0; k < 2 * sm->p; k++)
            last[k] = -1;
        for (size_t i = 0; i < n; i++) {
            const struct weft_step *st = &r->s->steps[i];
            r->prev_link[i] = r->next_link[i] = -1;
            if (st->kind == WEFT_STEP_COPY)
                continue;
            int32_t *l = &last[2 * st->peer + (st->kind == WEFT_STEP_SEND ? 0 : 1)];
            r->prev_link[i] = *l;
            if (*l >= 0)
                r->next_link[*l] = (int32_t)i;
            *l = (int32_t)i;
        }
        free(last);
        size_t ne = 0;
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
                if (r->s->steps[i].deps[k] >= 0) {
                    r->dep_start[r->s->steps[i].deps[k] + 1]++;
                    r->ndeps[i]++;
                    r->nunposted[i]++;
                    ne++;
                }
        for (size_t i = 0; i < n; i++)
            r->dep_start[i + 1] += r->dep_start[i];
        r->dep_list = malloc((ne + 1) * sizeof(int32_t));
        int32_t *fillp = calloc(n + 1, sizeof(int32_t));
        cr_assert(r->dep_list && fillp);
        for (size_t i = 0; i < n; i++)
            for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++) {
                int32_t d = r->s->steps[i].deps[k];
                if (d >= 0)
                    r->dep_list[r->dep_start[d] + fillp[d]++] = (int32_t)i;
            }
        free(fillp);
    }
    if (!match_all(sm))
        return false;
    /* Every step is looked at once, rank 0 step 0 first. */
    for (int rank = sm->p - 1; rank >= 0; rank--)
        for (size_t i = sm->r[rank].s->nsteps; i-- > 0;)
            wake(sm, rank, (int32_t)i);
    for (bool moved = true; moved;) {
        while (sm->nstack) {
            int32_t step = sm->stack[--sm->nstack];
            int rank = sm->stack[--sm->nstack];
            if (!advance(sm, rank, step))
                return false;
        }
        if (!grant_slot(sm, &moved))
            return false;
    }
    return report_deadlock(sm);
}

/* Any two steps of a rank that touch overlapping memory, one writing, must
 * be ordered by dependencies (an engine may run unordered steps at once). */
static bool check_races(struct sim *sm, int rank)
{
    const struct sim_rank *r = &sm->r[rank];
    const struct weft_step *steps = r->s->steps;
    size_t n = r->s->nsteps, words = (n + 63) / 64;
    uint64_t *anc = calloc(n * words + 1, sizeof(uint64_t));
    size_t *rd = malloc((n + 1) * sizeof(size_t)), *wr = malloc((n + 1) * sizeof(size_t));
    bool *hr = calloc(n + 1, 1), *hw = calloc(n + 1, 1);
    cr_assert(anc && rd && wr && hr && hw);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        const struct weft_step *st = &steps[i];
        for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++) {
            int32_t d = st->deps[k];
            if (d < 0)
                continue;
            for (size_t w = 0; w < words; w++)
                anc[i * words + w] |= anc[(size_t)d * words + w];
            anc[i * words + (size_t)d / 64] |= 1ull << (d % 64);
        }
        size_t dst = addr_of(r, st->buf, st->off);
        size_t src = addr_of(r, st->src_buf, st->src_off);
        switch (st->kind) {
        case WEFT_STEP_SEND: hr[i] = true, rd[i] = dst; break;
        case WEFT_STEP_RECV: hw[i] = true, wr[i] = dst; break;
        default:
            if (st->kind == WEFT_STEP_COPY && src == dst)
                break; /* the engine skips a copy onto itself */
            hr[i] = hw[i] = true, rd[i] = src, wr[i] = dst;
            if (src != dst && src < dst + st->count && dst < src + st->count)
                ok = fail(sm, "rank %d step %zu (%s): source and destination overlap partly",
                          rank, i, kind_name(st->kind));
            break;
        }
    }
    for (size_t j = 0; j < n && ok; j++) {
        for (size_t i = 0; i < j && ok; i++) {
            if (anc[j * words + i / 64] >> (i % 64) & 1)
                continue;
            size_t ci = steps[i].count, cj = steps[j].count;
#define OVL(a, b) ((a) < (b) + cj && (b) < (a) + ci)
            bool clash = (hw[i] && hw[j] && OVL(wr[i], wr[j])) ||
                         (hw[i] && hr[j] && OVL(wr[i], rd[j])) ||
                         (hr[i] && hw[j] && OVL(rd[i], wr[j]));
#undef OVL
            if (clash)
                ok = fail(sm, "rank %d: steps %zu (%s) and %zu (%s) touch the same memory "
                          "unordered", rank, i, kind_name(steps[i].kind), j,
                          kind_name(steps[j].kind));
        }
    }
    free(anc);
    free(rd);
    free(wr);
    free(hr);
    free(hw);
    return ok;
}

/* What every rank's recvbuf must hold at the end. */
static bool check_outputs(struct sim *sm)
{
    uint64_t all = sm->p == 64 ? ~0ull : (1ull << sm->p) - 1;
    size_t n = sm->count;
    struct runs ref = { 0 };
    bool ok = true;
    for (int rank = 0; rank < sm->p && ok; rank++) {
        struct sim_rank *r = &sm->r[rank];
        if (sm->coll == WEFT_COLL_REDUCE && rank != sm->root)
            continue;
        size_t len = r->len[WEFT_BUF_RECV];
        seg_read(&r->mem, r->base[WEFT_BUF_RECV], len, &sm->ra);
        for (size_t k = 0; k < sm->ra.n && ok; k++) {
            size_t off = sm->ra.r[k].off;
            size_t end = k + 1 < sm->ra.n ? sm->ra.r[k + 1].off : len;
            const struct val *v = &sm->ra.r[k].v;
            /* Expected source rank set and position of element off. */
            uint64_t want_ranks = all;
            int64_t want_delta = 0; /* position - index */
            if (sm->coll == WEFT_COLL_REDUCE_SCATTER) {
                want_delta = (int64_t)((size_t)rank * n);
            } else if (sm->coll == WEFT_COLL_ALLGATHER) {
                size_t b = off / n; /* len > 0, so n > 0 */
                if ((end - 1) / n != b)
                    ok = fail(sm, "rank %d recv[%zu..%zu): one run spans two ranks' blocks",
                              rank, off, end);
                want_ranks = 1ull << b;
                want_delta = -(int64_t)(b * n);
            } else if (sm->coll == WEFT_COLL_BROADCAST) {
                want_ranks = 1ull << sm->root;
            }
            if (ok && (v->flags || v->ranks != want_ranks || v->delta != want_delta))
                ok = fail(sm, "rank %d recv[%zu..%zu): holds ranks 0x%llx position %+lld "
                          "flags %u, wants ranks 0x%llx position %+lld",
                          rank, off, end, (unsigned long long)v->ranks, (long long)v->delta,
                          v->flags, (unsigned long long)want_ranks, (long long)want_delta);
        }
        /* Allreduce, ring: every rank holds the value made by the same FINAL
         * step.  Recursive doubling: every rank computes the result itself
         * (or, folded out, receives it), so the ranks' values must be the
         * same expression tree; the origin is left out of the comparison. */
        if (ok && sm->coll == WEFT_COLL_ALLREDUCE) {
            bool rd = PLAN_ALGO(sm->algo) == WEFT_ALGO_RHD ||
                      sm->algo == PLAN(WEFT_ALGO_HIER, WEFT_VAR_HIER_RHD);
            struct runs *cur = &sm->rb;
            cur->n = 0;
            for (size_t k = 0; k < sm->ra.n; k++) {
                struct val v = sm->ra.r[k].v;
                if (rd)
                    v.origin = -1;
                runs_push(cur, sm->ra.r[k].off, v);
            }
            if (rank == 0) {
                ref.n = 0;
                for (size_t k = 0; k < cur->n; k++)
                    runs_push(&ref, cur->r[k].off, cur->r[k].v);
            } else {
                size_t k = 0;
                while (k < ref.n && k < cur->n && ref.r[k].off == cur->r[k].off &&
                       val_eq(&ref.r[k].v, &cur->r[k].v))
                    k++;
                if (k < ref.n || k < cur->n) {
                    char a[160] = "", b[160] = "";
                    size_t at = k < cur->n ? cur->r[k].off : ref.r[k].off;
                    if (k < ref.n)
                        expr_format(&sm->ex, ref.r[k].v.expr, a, sizeof(a), 0);
                    if (k < cur->n)
                        expr_format(&sm->ex, cur->r[k].v.expr, b, sizeof(b), 0);
                    ok = fail(sm, "rank %d's result was not made by the same %s as rank 0's "
                              "(results could differ in their bits): at recv[%zu] rank 0 "
                              "holds %s, rank %d holds %s", rank,
                              rd ? "expression" : "reductions", at, a, rank, b);
                }
            }
            /* One FINAL reduction per element a rank computes the result
             * of, none for one it receives; a rank computes all of its
             * result or none, except in hier's 2D form, where it computes
             * one slice and receives the others. */
            size_t owned = 0;
            for (size_t k = 0; rd && k < sm->ra.n; k++) {
                int64_t o = sm->ra.r[k].v.origin;
                size_t end = k + 1 < sm->ra.n ? sm->ra.r[k + 1].off : len;
                if (o >= 0 && (int)(o >> 32) == rank)
                    owned += end - sm->ra.r[k].off;
            }
            bool slices = PLAN_ALGO(sm->algo) == WEFT_ALGO_HIER;
            if (ok && rd &&
                (r->final_elems != owned || (!slices && owned != 0 && owned != len)))
                ok = fail(sm, "rank %d: reduced %zu of %zu elements with FINAL, and made %zu "
                          "of its results itself", rank, r->final_elems, len, owned);
        }
    }
    free(ref.r);
    return ok;
}

static void sim_free(struct sim *sm)
{
    for (int i = 0; i < MAXP; i++) {
        struct sim_rank *r = &sm->r[i];
        free(r->mem.s);
        free(r->match_rank);
        free(r->match_step);
        free(r->ndeps);
        free(r->nunposted);
        free(r->prev_link);
        free(r->next_link);
        free(r->state);
        free(r->dep_start);
        free(r->dep_list);
        for (size_t k = 0; r->staged && k < r->s->nsteps; k++)
            free(r->staged[k].r);
        free(r->staged);
        free(r->waiting);
    }
    free(sm->ra.r);
    free(sm->rb.r);
    free(sm->rc.r);
    free(sm->stack);
    free(sm->ex.node);
    free(sm->ex.slot);
}

/* The slot count the engine runs with (src/op.c clamps it the same way). */
int engine_slots(void)
{
    int64_t n = weft_param_int("WEFT_STAGING_SLOTS");
    return (int)WEFT_MAX(WEFT_MIN(n, 1024), 1);
}

/* Runs the given schedules (one per rank) of a collective, made by algo,
 * in and out of place; false with err filled on the first problem.  With
 * outputs false, only the static checks and the execution (deadlocks, what
 * the reductions combine) count, not what the ranks end up holding. */
bool simulate(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
              int slots, bool outputs, char *err, size_t errlen)
{
    bool ok = true;
    for (int mode = 0; mode < 2 && ok; mode++) {
        struct sim *sm = calloc(1, sizeof(*sm));
        cr_assert(sm);
        sm->coll = coll;
        sm->algo = algo;
        sm->buffered = slots == SLOTS_BUFFERED;
        sm->slots = WEFT_MAX(slots, 0);
        sm->p = p;
        sm->root = root;
        sm->count = count;
        sm->inplace = mode == 1;
        for (int rank = 0; rank < p; rank++) {
            struct weft_coll_desc d = { coll, rank, p, root, count, 1, PLAN_ALGO(algo), PLAN_VAR(algo), 0, NULL, 0 };
            sm->r[rank].s = &sch[rank];
            layout(sm, rank, &d, sch[rank].scratch_count);
        }
        for (int rank = 0; rank < p && ok; rank++)
            ok = check_steps(sm, rank) && check_races(sm, rank);
        ok = ok && run_all(sm) && (!outputs || check_outputs(sm));
        if (!ok)
            snprintf(err, errlen, "%s", sm->err);
        sim_free(sm);
        free(sm);
    }
    return ok;
}

/* Checks the given schedules of a collective completely. */
bool verify(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
            int slots, char *err, size_t errlen)
{
    return simulate(algo, coll, p, root, count, sch, slots, true, err, errlen);
}
