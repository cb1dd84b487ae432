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
    int32_t *waiting;        /* RECV_REDUCEs that could post but for a slot */
    int nwaiting, capwaiting;
};

/* A step's progress, as the engine's ST_* states.  A link is the messages
 * to one peer (sends) or from it (receives of either kind). */
enum sim_state { S_PENDING = 0, S_POSTED, S_LANDED, S_DONE };

struct sim {
    int coll, p, root, algo; /* algo: a PLAN */
    int ordered, nnodes;     /* from the desc, for the ordered check and messages */
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
    struct sim_rank *r; /* p of them */
    struct rset all;    /* every rank once */
    bool exprs_on;      /* build expression trees (see sched_sim.h) */
    uint64_t *grantable; /* bit per rank: a free slot and a RECV_REDUCE waiting for one */
    int32_t *last;       /* run_all's scratch: 2p link tails, -1 between ranks */
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
    char what[48] = "";
    if (PLAN_VAR(sm->algo) || sm->ordered || sm->nnodes > 1)
        snprintf(what, sizeof(what), " (variant %d%s, %d nodes)", PLAN_VAR(sm->algo),
                 sm->ordered ? ", ordered" : "", WEFT_MAX(sm->nnodes, 1));
    int n = snprintf(sm->err, sizeof(sm->err), "%s%s %s p=%d root=%d count=%zu %s%s: ",
                     weft_algo_name(PLAN_ALGO(sm->algo)), what, weft_coll_name(sm->coll), sm->p,
                     sm->root, sm->count, sm->inplace ? "in place" : "out of place", how);
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
        runs_push(&in, 0, (struct val){ rset_one(rank), 0, -1, 0, rank });
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

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* A rank's sends (want_send) or receives of either kind, as peer << 32 |
 * step, sorted: grouped by peer, in schedule order inside a group. */
static uint64_t *link_keys(const struct weft_schedule *s, bool want_send, size_t *n)
{
    uint64_t *k = malloc((s->nsteps + 1) * sizeof(uint64_t));
    cr_assert(k);
    *n = 0;
    for (size_t i = 0; i < s->nsteps; i++) {
        const struct weft_step *st = &s->steps[i];
        if (st->kind == WEFT_STEP_COPY || (st->kind == WEFT_STEP_SEND) != want_send)
            continue;
        k[(*n)++] = (uint64_t)(uint32_t)st->peer << 32 | (uint32_t)i;
    }
    qsort(k, *n, sizeof(uint64_t), cmp_u64);
    return k;
}

/* The first index of sorted v[0..n) whose value is at least want (n when
 * none). */
static size_t lower_bound(const uint64_t *v, size_t n, uint64_t want)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (v[mid] < want)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The first key of peer in sorted keys (n when none). */
static size_t keys_find(const uint64_t *k, size_t n, int peer)
{
    return lower_bound(k, n, (uint64_t)(uint32_t)peer << 32);
}

static size_t keys_count(const uint64_t *k, size_t n, int peer)
{
    size_t i = keys_find(k, n, peer), j = i;
    while (j < n && (int)(k[j] >> 32) == peer)
        j++;
    return j - i;
}

/* Pairs the k-th send A->B with the k-th receive on B from A: every rank's
 * sends and receives sorted by peer, so p = 4096 costs no p^2 table. */
static bool match_all(struct sim *sm)
{
    int p = sm->p;
    uint64_t **sends = calloc((size_t)p, sizeof(*sends));
    size_t *nsend = calloc((size_t)p, sizeof(size_t));
    cr_assert(sends && nsend);
    bool ok = true;
    for (int a = 0; a < p; a++) {
        sends[a] = link_keys(sm->r[a].s, true, &nsend[a]);
        for (size_t i = 0; i < sm->r[a].s->nsteps; i++)
            sm->r[a].match_rank[i] = -1;
    }
    for (int b = 0; b < p && ok; b++) {
        size_t nrecv;
        uint64_t *recvs = link_keys(sm->r[b].s, false, &nrecv);
        for (size_t g = 0; g < nrecv && ok;) {
            int a = (int)(recvs[g] >> 32);
            size_t first = keys_find(sends[a], nsend[a], b), k = 0;
            for (; g < nrecv && (int)(recvs[g] >> 32) == a && ok; g++, k++) {
                size_t i = (uint32_t)recvs[g];
                const struct weft_step *st = &sm->r[b].s->steps[i];
                if (first + k >= nsend[a] || (int)(sends[a][first + k] >> 32) != b) {
                    ok = fail(sm, "rank %d step %zu: receive #%zu from %d has no send", b, i, k,
                              a);
                    break;
                }
                int32_t j = (int32_t)(uint32_t)sends[a][first + k];
                const struct weft_step *sst = &sm->r[a].s->steps[j];
                if (sst->count != st->count) {
                    ok = fail(sm, "rank %d step %d sends %zu, rank %d step %zu receives %zu", a,
                              j, sst->count, b, i, st->count);
                    break;
                }
                sm->r[b].match_rank[i] = a;
                sm->r[b].match_step[i] = j;
                sm->r[a].match_rank[j] = b;
                sm->r[a].match_step[j] = (int32_t)i;
            }
        }
        free(recvs);
    }
    /* A send left over waits for a receive that never comes. */
    for (int a = 0; a < p && ok; a++)
        for (size_t k = 0; k < nsend[a] && ok; k++) {
            int32_t j = (int32_t)(uint32_t)sends[a][k];
            if (sm->r[a].match_rank[j] >= 0)
                continue;
            int b = (int)(sends[a][k] >> 32);
            size_t nrecv;
            uint64_t *recvs = link_keys(sm->r[b].s, false, &nrecv);
            ok = fail(sm, "rank %d sends %zu messages to rank %d, which receives %zu", a,
                      keys_count(sends[a], nsend[a], b), b, keys_count(recvs, nrecv, a));
            free(recvs);
        }
    for (int a = 0; a < p; a++)
        free(sends[a]);
    free(sends);
    free(nsend);
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
    size_t ia = 0, ib = 0, off = 0;
    while (off < st->count) {
        while (ia + 1 < in->n && in->r[ia + 1].off <= off)
            ia++;
        while (ib + 1 < sm->rb.n && sm->rb.r[ib + 1].off <= off)
            ib++;
        const struct val *x = &sm->rb.r[ib].v, *y = &in->r[ia].v;
        struct val v = { rset_add(x->ranks, y->ranks), x->delta, -1, x->flags | y->flags, -1 };
        if ((x->ranks.low & y->ranks.low) || v.ranks.n > (uint32_t)sm->p)
            v.flags |= V_DUP;
        if (x->delta != y->delta)
            v.flags |= V_MISPLACED;
        bool full = rset_eq(v.ranks, sm->all) && v.flags == 0;
        char a[96], b[96];
        bool final = st->flags & WEFT_STEP_FINAL;
        if (v.flags & V_UNINIT)
            return fail(sm, "rank %d step %d: reduces an element nobody wrote", rank, step);
        if (v.flags & V_DUP)
            return fail(sm, "rank %d step %d: combines rank input twice (%s with %s)", rank, step,
                        rset_format(x->ranks, sm->p, a, sizeof(a)),
                        rset_format(y->ranks, sm->p, b, sizeof(b)));
        if (v.flags & V_MISPLACED)
            return fail(sm, "rank %d step %d: combines input positions %lld and %lld", rank, step,
                        (long long)(x->delta + (int64_t)off), (long long)(y->delta + (int64_t)off));
        if (final != full)
            return fail(sm, "rank %d step %d: %s (ranks %s)", rank, step,
                        final ? "FINAL on a partial result" : "the final reduction lacks FINAL",
                        rset_format(v.ranks, sm->p, a, sizeof(a)));
        if (sm->exprs_on)
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
/* Keeps rank's bit in sm->grantable true to free_slots && nwaiting. */
static void grantable_update(struct sim *sm, int rank)
{
    const struct sim_rank *r = &sm->r[rank];
    uint64_t bit = 1ull << (rank % 64);
    if (r->free_slots > 0 && r->nwaiting > 0)
        sm->grantable[rank / 64] |= bit;
    else
        sm->grantable[rank / 64] &= ~bit;
}

static bool finish_recv(struct sim *sm, int rank, int32_t step)
{
    struct sim_rank *r = &sm->r[rank];
    if (!deliver(sm, rank, step, &r->staged[step]))
        return false;
    r->staged[step].n = 0;
    if (r->s->steps[step].kind == WEFT_STEP_RECV_REDUCE && sm->slots > 0) {
        r->free_slots++;
        grantable_update(sm, rank);
    }
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
    if (st->kind == WEFT_STEP_RECV_REDUCE && sm->slots > 0) {
        r->free_slots--;
        grantable_update(sm, rank);
    }
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
        if (r->nwaiting == r->capwaiting) {
            r->capwaiting = r->capwaiting ? 2 * r->capwaiting : 16;
            r->waiting = realloc(r->waiting, (size_t)r->capwaiting * sizeof(int32_t));
            cr_assert(r->waiting);
        }
        r->waiting[r->nwaiting++] = step;
        grantable_update(sm, rank);
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
    for (int w = 0; w < (sm->p + 63) / 64; w++) {
        if (!sm->grantable[w])
            continue;
        int rank = w * 64 + __builtin_ctzll(sm->grantable[w]);
        struct sim_rank *r = &sm->r[rank];
        int best = 0;
        for (int k = 1; k < r->nwaiting; k++)
            if (r->waiting[k] < r->waiting[best])
                best = k;
        int32_t step = r->waiting[best];
        r->waiting[best] = r->waiting[--r->nwaiting];
        grantable_update(sm, rank);
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
        int32_t *last = sm->last; /* all -1 between ranks */
        cr_assert(r->match_rank && r->match_step && r->ndeps && r->nunposted && r->prev_link &&
                  r->next_link && r->state && r->dep_start && r->staged);
        r->free_slots = sm->slots;
        /* Links: sends to a peer, and receives of either kind from it. */
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
        for (size_t i = 0; i < n; i++)
            if (r->s->steps[i].kind != WEFT_STEP_COPY)
                last[2 * r->s->steps[i].peer + (r->s->steps[i].kind == WEFT_STEP_SEND ? 0 : 1)] = -1;
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

/* check_races' state for one rank; every array is per step or per atom. */
struct races {
    const struct weft_step *steps;
    size_t *rd, *wr;      /* address read / written, valid where hr / hw */
    bool *hr, *hw;
    uint64_t *bp;         /* sorted distinct boundaries of all accesses */
    size_t nb;
    int32_t *writer;      /* per atom: the last step that wrote it, -1 */
    int32_t *readers;     /* per atom: head of its readers since that write in pool, -1 */
    int32_t (*pool)[2];   /* (step, next) */
    size_t npool, cappool;
    int32_t *seen, *vis;  /* per step: the j that last looked at / reached it */
    int32_t *want;        /* per step: the j it is pending for */
    int32_t *pending, *stack;
    size_t npending;
};

/* Step i touched memory that step j touches (one writing): it must be j's
 * ancestor.  Direct deps are settled here, the rest by reach(). */
static void consider(struct races *rc, int32_t i, int32_t j)
{
    if (i < 0 || i == j || rc->seen[i] == j)
        return;
    rc->seen[i] = j;
    for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
        if (rc->steps[j].deps[k] == i)
            return;
    rc->want[i] = j;
    rc->pending[rc->npending++] = i;
}

/* Walks j's ancestors back to the lowest pending step (steps only depend
 * on earlier ones, so nothing below it can lead to it) until every pending
 * step is reached; returns one that is not, or -1. */
static int32_t reach(struct races *rc, int32_t j)
{
    int32_t lo = j;
    for (size_t k = 0; k < rc->npending; k++)
        lo = WEFT_MIN(lo, rc->pending[k]);
    size_t left = rc->npending, top = 0;
    rc->stack[top++] = j;
    rc->vis[j] = j;
    while (top && left) {
        int32_t x = rc->stack[--top];
        for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++) {
            int32_t d = rc->steps[x].deps[k];
            if (d < lo || rc->vis[d] == j)
                continue;
            rc->vis[d] = j;
            if (rc->want[d] == j)
                left--;
            rc->stack[top++] = d;
        }
    }
    for (size_t k = 0; k < rc->npending; k++)
        if (rc->vis[rc->pending[k]] != j)
            return rc->pending[k];
    return -1;
}

/* Any two steps of a rank that touch overlapping memory, one writing, must
 * be ordered by dependencies (an engine may run unordered steps at once).
 * Steps go in index order, which is a topological order, keeping for each
 * atom (a piece of memory no access boundary cuts) its last writer and the
 * readers since; a step must descend from the last writer of what it reads,
 * and from the last writer and readers of what it writes.  That covers
 * every pair by transitivity: an earlier writer is an ancestor of the last
 * one, an earlier reader of the write that ended its epoch.  Most of those
 * are direct deps; the others cost one backward walk per step, bounded
 * below by the earliest step in question. */
static bool check_races(struct sim *sm, int rank)
{
    const struct sim_rank *r = &sm->r[rank];
    size_t n = r->s->nsteps;
    if (n == 0)
        return true;
    struct races rc = { .steps = r->s->steps };
    rc.rd = malloc(n * sizeof(size_t));
    rc.wr = malloc(n * sizeof(size_t));
    rc.hr = calloc(n, 1);
    rc.hw = calloc(n, 1);
    rc.bp = malloc(4 * n * sizeof(uint64_t));
    rc.seen = malloc(n * sizeof(int32_t));
    rc.vis = malloc(n * sizeof(int32_t));
    rc.want = malloc(n * sizeof(int32_t));
    rc.pending = malloc(n * sizeof(int32_t));
    rc.stack = malloc(n * sizeof(int32_t));
    cr_assert(rc.rd && rc.wr && rc.hr && rc.hw && rc.bp && rc.seen && rc.vis && rc.want && rc.pending &&
              rc.stack);
    bool ok = true;
    for (size_t i = 0; i < n && ok; i++) {
        const struct weft_step *st = &rc.steps[i];
        size_t dst = addr_of(r, st->buf, st->off);
        size_t src = addr_of(r, st->src_buf, st->src_off);
        rc.seen[i] = rc.vis[i] = rc.want[i] = -1;
        switch (st->kind) {
        case WEFT_STEP_SEND: rc.hr[i] = true, rc.rd[i] = dst; break;
        case WEFT_STEP_RECV: rc.hw[i] = true, rc.wr[i] = dst; break;
        default:
            if (st->kind == WEFT_STEP_COPY && src == dst)
                break; /* the engine skips a copy onto itself */
            rc.hr[i] = rc.hw[i] = true, rc.rd[i] = src, rc.wr[i] = dst;
            if (src != dst && src < dst + st->count && dst < src + st->count)
                ok = fail(sm, "rank %d step %zu (%s): source and destination overlap partly",
                          rank, i, kind_name(st->kind));
            break;
        }
        if (rc.hr[i])
            rc.bp[rc.nb++] = rc.rd[i], rc.bp[rc.nb++] = rc.rd[i] + st->count;
        if (rc.hw[i])
            rc.bp[rc.nb++] = rc.wr[i], rc.bp[rc.nb++] = rc.wr[i] + st->count;
    }
    qsort(rc.bp, rc.nb, sizeof(uint64_t), cmp_u64);
    size_t nb = 0;
    for (size_t k = 0; k < rc.nb; k++)
        if (nb == 0 || rc.bp[nb - 1] != rc.bp[k])
            rc.bp[nb++] = rc.bp[k];
    rc.nb = nb;
    rc.writer = malloc((nb + 1) * sizeof(int32_t));
    rc.readers = malloc((nb + 1) * sizeof(int32_t));
    cr_assert(rc.writer && rc.readers);
    memset(rc.writer, 0xff, (nb + 1) * sizeof(int32_t));
    memset(rc.readers, 0xff, (nb + 1) * sizeof(int32_t));
    for (size_t jj = 0; jj < n && ok; jj++) {
        int32_t j = (int32_t)jj;
        size_t cnt = rc.steps[j].count;
        /* The atoms (pieces between two boundaries) the accesses start at. */
        size_t ra = rc.hr[j] ? lower_bound(rc.bp, nb, rc.rd[j]) : 0;
        size_t wa = rc.hw[j] ? lower_bound(rc.bp, nb, rc.wr[j]) : 0;
        rc.npending = 0;
        for (size_t a = ra; rc.hr[j] && rc.bp[a] < rc.rd[j] + cnt; a++)
            consider(&rc, rc.writer[a], j);
        for (size_t a = wa; rc.hw[j] && rc.bp[a] < rc.wr[j] + cnt; a++) {
            consider(&rc, rc.writer[a], j);
            for (int32_t e = rc.readers[a]; e >= 0; e = rc.pool[e][1])
                consider(&rc, rc.pool[e][0], j);
        }
        int32_t i = rc.npending ? reach(&rc, j) : -1;
        if (i >= 0) {
            ok = fail(sm, "rank %d: steps %d (%s) and %d (%s) touch the same memory unordered",
                      rank, i, kind_name(rc.steps[i].kind), j, kind_name(rc.steps[j].kind));
            break;
        }
        for (size_t a = ra; rc.hr[j] && rc.bp[a] < rc.rd[j] + cnt; a++) {
            if (rc.npool == rc.cappool) {
                rc.cappool = rc.cappool ? 2 * rc.cappool : 1024;
                rc.pool = realloc(rc.pool, rc.cappool * sizeof(*rc.pool));
                cr_assert(rc.pool);
            }
            rc.pool[rc.npool][0] = j;
            rc.pool[rc.npool][1] = rc.readers[a];
            rc.readers[a] = (int32_t)rc.npool++;
        }
        for (size_t a = wa; rc.hw[j] && rc.bp[a] < rc.wr[j] + cnt; a++) {
            rc.writer[a] = j;
            rc.readers[a] = -1;
        }
    }
    free(rc.rd);
    free(rc.wr);
    free(rc.hr);
    free(rc.hw);
    free(rc.bp);
    free(rc.writer);
    free(rc.readers);
    free(rc.pool);
    free(rc.seen);
    free(rc.vis);
    free(rc.want);
    free(rc.pending);
    free(rc.stack);
    return ok;
}

/* What every rank's recvbuf must hold at the end. */
static bool check_outputs(struct sim *sm)
{
    size_t n = sm->count;
    struct runs ref = { 0 };
    bool ok = true;
    /* Deterministic mode: every reduced element is ((x0 x1) x2) ... x(p-1). */
    bool fold = sm->ordered && (sm->coll == WEFT_COLL_ALLREDUCE ||
                                sm->coll == WEFT_COLL_REDUCE_SCATTER ||
                                sm->coll == WEFT_COLL_REDUCE);
    int32_t left_fold = 0;
    for (int k = 1; fold && k < sm->p; k++)
        left_fold = expr_node(&sm->ex, left_fold, k);
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
            struct rset want_ranks = sm->all;
            int64_t want_delta = 0; /* position - index */
            if (sm->coll == WEFT_COLL_REDUCE_SCATTER) {
                want_delta = (int64_t)((size_t)rank * n);
            } else if (sm->coll == WEFT_COLL_ALLGATHER) {
                size_t b = off / n; /* len > 0, so n > 0 */
                if ((end - 1) / n != b)
                    ok = fail(sm, "rank %d recv[%zu..%zu): one run spans two ranks' blocks",
                              rank, off, end);
                want_ranks = rset_one((int)b);
                want_delta = -(int64_t)(b * n);
            } else if (sm->coll == WEFT_COLL_BROADCAST) {
                want_ranks = rset_one(sm->root);
            }
            char a[96], b[96];
            if (ok && (v->flags || !rset_eq(v->ranks, want_ranks) || v->delta != want_delta))
                ok = fail(sm, "rank %d recv[%zu..%zu): holds ranks %s position %+lld "
                          "flags %u, wants ranks %s position %+lld",
                          rank, off, end, rset_format(v->ranks, sm->p, a, sizeof(a)),
                          (long long)v->delta, v->flags,
                          rset_format(want_ranks, sm->p, b, sizeof(b)), (long long)want_delta);
            if (ok && fold && v->expr != left_fold) {
                char got[200] = "";
                expr_format(&sm->ex, v->expr, got, sizeof(got), 0);
                ok = fail(sm, "rank %d recv[%zu..%zu) is %s, not the left fold "
                          "(((x0 x1) x2) ... x%d) of deterministic mode",
                          rank, off, end, got, sm->p - 1);
            }
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
             * result or none with recursive doubling; Rabenseifner and
             * hier's 2D form compute one share and receive the others. */
            size_t owned = 0;
            for (size_t k = 0; rd && k < sm->ra.n; k++) {
                int64_t o = sm->ra.r[k].v.origin;
                size_t end = k + 1 < sm->ra.n ? sm->ra.r[k + 1].off : len;
                if (o >= 0 && (int)(o >> 32) == rank)
                    owned += end - sm->ra.r[k].off;
            }
            bool slices = PLAN_ALGO(sm->algo) == WEFT_ALGO_HIER ||
                          PLAN_VAR(sm->algo) != WEFT_VAR_RHD_DOUBLING;
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
    for (int i = 0; i < sm->p; i++) {
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
    free(sm->r);
    free(sm->grantable);
    free(sm->last);
}

/* The slot count the engine runs with (src/op.c clamps it the same way). */
int engine_slots(void)
{
    int64_t n = weft_param_int("WEFT_STAGING_SLOTS");
    return (int)WEFT_MAX(WEFT_MIN(n, 1024), 1);
}

/* Checks the schedules sch (one per rank) built from d, in and out of
 * place; outputs: see simulate. */
static bool run_checks(const struct weft_coll_desc *d, struct weft_schedule *sch, int slots,
                       bool outputs, char *err, size_t errlen)
{
    bool ok = true;
    int p = d->nranks;
    for (int mode = 0; mode < 2 && ok; mode++) {
        struct sim *sm = calloc(1, sizeof(*sm));
        cr_assert(sm);
        sm->coll = d->coll;
        sm->algo = PLAN(d->algo, d->variant);
        sm->ordered = d->ordered;
        sm->nnodes = d->node ? d->nnodes : 1;
        sm->buffered = slots == SLOTS_BUFFERED;
        sm->slots = WEFT_MAX(slots, 0);
        sm->p = p;
        sm->root = d->root;
        sm->count = d->count;
        sm->inplace = mode == 1;
        sm->exprs_on = d->ordered || p <= 64 ||
                       (d->algo == WEFT_ALGO_RHD && d->coll == WEFT_COLL_ALLREDUCE);
        sm->ex.base = p;
        sm->r = calloc((size_t)p, sizeof(*sm->r));
        sm->grantable = calloc((size_t)(p + 63) / 64, sizeof(uint64_t));
        sm->last = malloc(2 * (size_t)p * sizeof(int32_t));
        cr_assert(sm->r && sm->grantable && sm->last);
        memset(sm->last, 0xff, 2 * (size_t)p * sizeof(int32_t));
        for (int rank = 0; rank < p; rank++)
            sm->all = rset_add(sm->all, rset_one(rank));
        for (int rank = 0; rank < p; rank++) {
            struct weft_coll_desc rd = *d;
            rd.rank = rank;
            sm->r[rank].s = &sch[rank];
            layout(sm, rank, &rd, sch[rank].scratch_count);
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

/* Runs the given schedules (one per rank) of a collective, made by algo
 * (a PLAN), in and out of place; false with err filled on the first
 * problem.  With outputs false, only the static checks and the execution
 * (deadlocks, what the reductions combine) count, not what the ranks end up
 * holding. */
bool simulate(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
              int slots, bool outputs, char *err, size_t errlen)
{
    struct weft_coll_desc d = { coll, 0, p, root, count, 1, PLAN_ALGO(algo), PLAN_VAR(algo),
                                0, NULL, 0 };
    return run_checks(&d, sch, slots, outputs, err, errlen);
}

/* Checks the given schedules of a collective completely. */
bool verify(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
            int slots, char *err, size_t errlen)
{
    return simulate(algo, coll, p, root, count, sch, slots, true, err, errlen);
}

bool verify_desc(const struct weft_coll_desc *d, struct weft_schedule *sch, int slots, char *err,
                 size_t errlen)
{
    return run_checks(d, sch, slots, true, err, errlen);
}
