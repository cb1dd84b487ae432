/*
 * test_schedule.c - proves schedules correct by running them symbolically.
 *
 * The schedules of all ranks are built, sends are matched to receives (the
 * k-th send from A to B meets the k-th receive on B from A), and steps run
 * by the engine's rules (see advance): a send completes only once its
 * receive is posted (no buffering in between; in buffered mode, at once),
 * a RECV_REDUCE's receive is posted as soon as its dependencies are in
 * flight but its reduce waits for them to be done, and a limited number of
 * staging slots can be modelled.  Instead of numbers, every element carries
 * which ranks' inputs it holds and which input position it came from, kept
 * as runs over each rank's memory, so a million elements cost a few runs.
 * A separate static check requires that any two steps of a rank touching
 * the same memory (one of them writing) are ordered by dependencies, with
 * and without sendbuf and recvbuf being the same memory, so that every
 * execution order the engine may pick computes the same thing.
 *
 * Each element also carries the expression tree that made it, operand
 * order included (hash-consed, so equal trees have equal ids).  Equal trees
 * mean equal bits whatever the datatype and op; that is how the recursive
 * doubling schedules, where every rank computes the result itself, are
 * proved to give all ranks the same bits.
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/schedule.h"

#define MAXP 64

/* ---- element values ----------------------------------------------------------- */

enum { V_UNINIT = 1, V_DUP = 2, V_MISPLACED = 4 };

/* What one element holds: the set of ranks whose input is combined in it,
 * the input position it stands for (address + delta, so a run of elements
 * copied together shares one delta), the FINAL reduction it came from, and
 * the expression that computed it. */
struct val {
    uint64_t ranks;
    int64_t delta;
    int64_t origin; /* rank << 32 | step of the FINAL reduction, or -1 */
    uint32_t flags; /* V_* */
    int32_t expr;   /* < MAXP: rank expr's input; >= MAXP: a node of sim.ex; -1: none */
};

static bool val_eq(const struct val *a, const struct val *b)
{
    return a->ranks == b->ranks && a->delta == b->delta && a->origin == b->origin &&
           a->flags == b->flags && a->expr == b->expr;
}

/* A run inside a region read out of memory: off is relative to the region,
 * and so is v.delta (position = off-in-region + delta). */
struct run {
    size_t off;
    struct val v;
};

struct runs {
    struct run *r;
    size_t n, cap;
};

static void runs_push(struct runs *rs, size_t off, struct val v)
{
    if (rs->n && val_eq(&rs->r[rs->n - 1].v, &v))
        return; /* same value continues */
    if (rs->n == rs->cap) {
        rs->cap = rs->cap ? rs->cap * 2 : 16;
        rs->r = realloc(rs->r, rs->cap * sizeof(*rs->r));
        cr_assert(rs->r);
    }
    rs->r[rs->n].off = off;
    rs->r[rs->n].v = v;
    rs->n++;
}

/* One rank's memory: runs sorted by start, covering [0, size). */
struct segmap {
    struct run *s;
    size_t n, cap, size;
};

static size_t seg_find(const struct segmap *m, size_t addr)
{
    size_t lo = 0, hi = m->n; /* last run with start <= addr */
    while (hi - lo > 1) {
        size_t mid = (lo + hi) / 2;
        if (m->s[mid].off <= addr)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

static void seg_reserve(struct segmap *m, size_t extra)
{
    if (m->n + extra <= m->cap)
        return;
    while (m->n + extra > m->cap)
        m->cap = m->cap ? m->cap * 2 : 16;
    m->s = realloc(m->s, m->cap * sizeof(*m->s));
    cr_assert(m->s);
}

static void seg_split(struct segmap *m, size_t addr)
{
    if (addr == 0 || addr >= m->size)
        return;
    size_t i = seg_find(m, addr);
    if (m->s[i].off == addr)
        return;
    seg_reserve(m, 1);
    memmove(&m->s[i + 2], &m->s[i + 1], (m->n - i - 1) * sizeof(*m->s));
    m->s[i + 1].off = addr;
    m->s[i + 1].v = m->s[i].v; /* delta is per address: a split keeps it */
    m->n++;
}

static void seg_init(struct segmap *m, size_t size)
{
    memset(m, 0, sizeof(*m));
    m->size = size;
    seg_reserve(m, 1);
    m->s[0].off = 0;
    m->s[0].v = (struct val){ 0, 0, -1, V_UNINIT, -1 };
    m->n = 1;
}

static void seg_read(const struct segmap *m, size_t addr, size_t len, struct runs *out)
{
    out->n = 0;
    if (len == 0)
        return;
    for (size_t i = seg_find(m, addr); i < m->n && m->s[i].off < addr + len; i++) {
        size_t start = WEFT_MAX(m->s[i].off, addr);
        struct val v = m->s[i].v;
        v.delta += (int64_t)addr;
        runs_push(out, start - addr, v);
    }
}

static void seg_write(struct segmap *m, size_t addr, size_t len, const struct runs *in)
{
    seg_split(m, addr);
    seg_split(m, addr + len);
    size_t i0 = seg_find(m, addr);
    size_t i1 = i0;
    while (i1 < m->n && m->s[i1].off < addr + len)
        i1++;
    seg_reserve(m, in->n);
    memmove(&m->s[i0 + in->n], &m->s[i1], (m->n - i1) * sizeof(*m->s));
    m->n = m->n - (i1 - i0) + in->n;
    for (size_t k = 0; k < in->n; k++) {
        m->s[i0 + k].off = addr + in->r[k].off;
        m->s[i0 + k].v = in->r[k].v;
        m->s[i0 + k].v.delta -= (int64_t)addr;
    }
    /* Merge equal neighbours at the two seams so maps stay short. */
    size_t lo = i0 ? i0 - 1 : 0, hi = WEFT_MIN(i0 + in->n + 1, m->n);
    size_t w = lo;
    for (size_t k = lo + 1; k < hi; k++) {
        if (val_eq(&m->s[w].v, &m->s[k].v))
            continue;
        m->s[++w] = m->s[k];
    }
    size_t removed = hi - (w + 1);
    if (removed) {
        memmove(&m->s[w + 1], &m->s[hi], (m->n - hi) * sizeof(*m->s));
        m->n -= removed;
    }
}

/* ---- the simulator -------------------------------------------------------------- */

/* Hash-consed expression nodes: node i (id MAXP + i) is l op r, in that
 * operand order; a pair is stored once, so two trees are the same
 * expression exactly when their ids are equal. */
struct exprs {
    int32_t (*node)[2];
    size_t n, cap;
    int32_t *slot; /* open addressing over node ids, -1 empty; hcap a power of two */
    size_t hcap;
};

static uint64_t expr_hash(int32_t l, int32_t r)
{
    uint64_t h = ((uint64_t)(uint32_t)l << 32 | (uint32_t)r) * 0x9e3779b97f4a7c15ull;
    return h ^ h >> 29;
}

static void expr_rehash(struct exprs *e, size_t hcap)
{
    free(e->slot);
    e->hcap = hcap;
    e->slot = malloc(hcap * sizeof(int32_t));
    cr_assert(e->slot);
    memset(e->slot, 0xff, hcap * sizeof(int32_t));
    for (size_t i = 0; i < e->n; i++) {
        size_t h = expr_hash(e->node[i][0], e->node[i][1]) & (hcap - 1);
        while (e->slot[h] >= 0)
            h = (h + 1) & (hcap - 1);
        e->slot[h] = (int32_t)i;
    }
}

/* The id of (l op r). */
static int32_t expr_node(struct exprs *e, int32_t l, int32_t r)
{
    if (2 * (e->n + 1) > e->hcap)
        expr_rehash(e, e->hcap ? 2 * e->hcap : 1024);
    size_t h = expr_hash(l, r) & (e->hcap - 1);
    for (; e->slot[h] >= 0; h = (h + 1) & (e->hcap - 1)) {
        const int32_t *nd = e->node[e->slot[h]];
        if (nd[0] == l && nd[1] == r)
            return MAXP + e->slot[h];
    }
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 1024;
        e->node = realloc(e->node, e->cap * sizeof(*e->node));
        cr_assert(e->node);
    }
    e->node[e->n][0] = l;
    e->node[e->n][1] = r;
    e->slot[h] = (int32_t)e->n;
    return MAXP + (int32_t)e->n++;
}

/* Writes expression id as text, "(x0 x1)" for x0 op x1; returns the
 * length it wanted (like snprintf), truncating at len. */
static size_t expr_format(const struct exprs *e, int32_t id, char *out, size_t len, size_t at)
{
    char leaf[16];
    if (id < MAXP) {
        snprintf(leaf, sizeof(leaf), id < 0 ? "?" : "x%d", id);
        for (const char *c = leaf; *c; c++, at++)
            if (at + 1 < len)
                out[at] = *c, out[at + 1] = '\0';
        return at;
    }
    const int32_t *nd = e->node[id - MAXP];
    if (at + 1 < len)
        out[at] = '(', out[at + 1] = '\0';
    at = expr_format(e, nd[0], out, len, at + 1);
    if (at + 1 < len)
        out[at] = ' ', out[at + 1] = '\0';
    at = expr_format(e, nd[1], out, len, at + 1);
    if (at + 1 < len)
        out[at] = ')', out[at + 1] = '\0';
    return at + 1;
}

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
                     weft_algo_name(sm->algo), weft_coll_name(sm->coll), sm->p, sm->root,
                     sm->count, sm->inplace ? "in place" : "out of place", how);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(sm->err + n, sizeof(sm->err) - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

static const char *kind_name(int k)
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
            bool rd = sm->algo == WEFT_ALGO_RD;
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
            /* One FINAL reduction per element on a rank that computes the
             * result, none on one that receives it. */
            for (size_t k = 0; ok && rd && k < sm->ra.n; k++) {
                int64_t o = sm->ra.r[k].v.origin;
                bool own = o >= 0 && (int)(o >> 32) == rank;
                if (own ? r->final_elems != len : r->final_elems != 0)
                    ok = fail(sm, "rank %d: reduced %zu of %zu elements with FINAL, and "
                              "recv[%zu] was made by %s", rank, r->final_elems, len,
                              sm->ra.r[k].off, own ? "itself" : "another rank");
            }
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

/* verify's slots: a staging slot count, or one of these. */
#define SLOTS_UNLIMITED 0 /* unbuffered, any number of receive-reduces in flight */
#define SLOTS_BUFFERED (-1) /* buffered sends: see struct sim */

/* The slot count the engine runs with (src/op.c clamps it the same way). */
static int engine_slots(void)
{
    int64_t n = weft_param_int("WEFT_STAGING_SLOTS");
    return (int)WEFT_MAX(WEFT_MIN(n, 1024), 1);
}

/* Runs the given schedules (one per rank) of a collective, made by algo,
 * in and out of place; false with err filled on the first problem.  With
 * outputs false, only the static checks and the execution (deadlocks, what
 * the reductions combine) count, not what the ranks end up holding. */
static bool simulate(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
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
            struct weft_coll_desc d = { coll, rank, p, root, count, 1, algo };
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
static bool verify(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
                   int slots, char *err, size_t errlen)
{
    return simulate(algo, coll, p, root, count, sch, slots, true, err, errlen);
}

/* ---- the ring, checked -------------------------------------------------------- */

static void build_all(int algo, int coll, int p, int root, size_t count, size_t chunk,
                      struct weft_schedule *sch)
{
    for (int rank = 0; rank < p; rank++) {
        struct weft_coll_desc d = { coll, rank, p, root, count, chunk, algo };
        weft_sched_init(&sch[rank]);
        weft_status_t st = algo == WEFT_ALGO_RD ? weft_rd_build(&d, &sch[rank])
                                                : weft_ring_build(&d, &sch[rank]);
        cr_assert(st == WEFT_OK, "%s %s p=%d rank=%d root=%d count=%zu chunk=%zu: %s (%s)",
                  weft_algo_name(algo), weft_coll_name(coll), p, rank, root, count, chunk,
                  weft_status_string(st), weft_last_error(NULL));
    }
}

static void free_all(int p, struct weft_schedule *sch)
{
    for (int rank = 0; rank < p; rank++)
        weft_sched_free(&sch[rank]);
}

static void check_sched(int algo, int coll, int p, int root, size_t count, size_t chunk,
                        int slots)
{
    struct weft_schedule sch[MAXP];
    char err[700];
    build_all(algo, coll, p, root, count, chunk, sch);
    bool ok = verify(algo, coll, p, root, count, sch, slots, err, sizeof(err));
    free_all(p, sch);
    cr_assert(ok, "chunk %zu: %s", chunk, err);
}

/* Ranks pmin..pmax, then 31 and 64 when with_big; slots: see verify. */
static void ring_matrix(int coll, int pmin, int pmax, bool with_big, int slots)
{
    int ps[MAXP], np = 0;
    for (int p = pmin; p <= pmax; p++)
        ps[np++] = p;
    if (with_big) {
        ps[np++] = 31;
        ps[np++] = 64;
    }
    for (int i = 0; i < np; i++) {
        int p = ps[i];
        /* Allgather and reduce_scatter count per block, the others per
         * rank: their large and many-chunk cases are scaled so that steps
         * per rank stay comparable (the race check is quadratic in them). */
        bool per_block = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCE_SCATTER;
        size_t small = per_block ? 17 : 10 * (size_t)p + 7;
        size_t big = per_block ? 1 << 18 : 65536;
        /* 9p+1 in chunks of 3: block 0 has one chunk more than the rest. */
        size_t uneven = per_block ? 4 : 9 * (size_t)p + 1;
        size_t counts[] = { 0, 1, (size_t)p - 1, (size_t)p + 1, 1000003, small, uneven };
        size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, big, 3, 3 };
        int roots[MAXP], nroots = 0;
        bool rooted = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
        if (!rooted || p <= 16) {
            for (int r = 0; r < (rooted ? p : 1); r++)
                roots[nroots++] = r;
        } else {
            int pick[] = { 0, 1, p / 2, p - 1 };
            for (int k = 0; k < 4; k++)
                roots[nroots++] = pick[k];
        }
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int r = 0; r < nroots; r++)
                check_sched(WEFT_ALGO_RING, coll, p, roots[r], counts[c], chunks[c], slots);
        /* Chunk 1: every element its own step. */
        check_sched(WEFT_ALGO_RING, coll, p, roots[nroots - 1], per_block ? 3 : (size_t)p + 1,
                    1, slots);
    }
}

Test(ring, allreduce_small_p) { ring_matrix(WEFT_COLL_ALLREDUCE, 1, 8, false, engine_slots()); }
Test(ring, allreduce_large_p) { ring_matrix(WEFT_COLL_ALLREDUCE, 9, 16, true, engine_slots()); }
Test(ring, reduce_scatter) { ring_matrix(WEFT_COLL_REDUCE_SCATTER, 1, 16, true, engine_slots()); }
Test(ring, allgather) { ring_matrix(WEFT_COLL_ALLGATHER, 1, 16, true, engine_slots()); }
Test(ring, broadcast) { ring_matrix(WEFT_COLL_BROADCAST, 1, 16, true, engine_slots()); }
Test(ring, reduce) { ring_matrix(WEFT_COLL_REDUCE, 1, 16, true, engine_slots()); }

/* Few staging slots: a RECV_REDUCE holds one from its post to its reduce,
 * and must not end up waiting for one that only a later step frees. */
Test(ring, no_buffering_needed)
{
    int colls[] = { WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_REDUCE };
    for (int slots = 1; slots <= 2; slots++)
        for (size_t c = 0; c < sizeof(colls) / sizeof(colls[0]); c++)
            ring_matrix(colls[c], 1, 9, false, slots);
}

/* The structure the engine relies on, beyond correctness. */
Test(ring, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    /* p=1: one COPY, or nothing for count 0. */
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        struct weft_coll_desc d = { coll, 0, 1, 0, 5, 2, WEFT_ALGO_RING };
        cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
        cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5 &&
                      s.scratch_count == 0,
                  "%s p=1: %zu steps", weft_coll_name(coll), s.nsteps);
        d.count = 0;
        cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    }
    /* Allreduce p=4, N=8, chunk 1: 2 elements per block, 2 chunks per round,
     * 3 + 3 rounds of (send, receive) per chunk = 24 steps; FINAL only on
     * the last reduce-scatter round. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 1, WEFT_ALGO_RING };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 24 && s.scratch_count == 0, "%zu steps", s.nsteps);
    int finals = 0;
    for (size_t i = 0; i < s.nsteps; i++) {
        const struct weft_step *st = &s.steps[i];
        cr_assert(st->count == 1);
        cr_assert(st->kind == WEFT_STEP_SEND ? st->peer == 2 : st->peer == 0);
        if (st->flags & WEFT_STEP_FINAL) {
            finals++;
            cr_assert(i >= 8 && i < 12, "FINAL at step %zu", i);
        }
        /* chunk c of round k+1 depends on chunk c of round k only */
        if (st->kind == WEFT_STEP_SEND && i >= 4)
            cr_assert(st->deps[0] == (int32_t)i - 3, "step %zu deps on %d", i, st->deps[0]);
    }
    cr_assert(finals == 2);
    /* Reduce_scatter asks for scratch; reduce only on middle ranks. */
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE_SCATTER, 0, 4, 0, 10, 4, WEFT_ALGO_RING };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 40);
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE, 2, 4, 0, 10, 4, WEFT_ALGO_RING };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 10);
    d.rank = 0; /* the root */
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    d.rank = 1; /* first in the chain: sends its input only */
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 0 && s.nsteps == 3);
    weft_sched_free(&s);
}

Test(ring, bad_descriptions)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct {
        struct weft_coll_desc d;
        weft_status_t want;
        const char *needle;
    } c[] = {
#define RING_DESC(coll, rank, p, root, count, chunk)                                          \
    { coll, rank, p, root, count, chunk, WEFT_ALGO_RING }
        { RING_DESC(WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 1), WEFT_ERR_INVALID_ARG, "nranks" },
        { RING_DESC(WEFT_COLL_ALLREDUCE, -1, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "rank -1" },
        { RING_DESC(WEFT_COLL_ALLREDUCE, 4, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "rank 4" },
        { RING_DESC(WEFT_COLL_BROADCAST, 0, 4, 4, 4, 1), WEFT_ERR_INVALID_ARG, "root 4" },
        { RING_DESC(WEFT_COLL_REDUCE, 0, 4, -1, 4, 1), WEFT_ERR_INVALID_ARG, "root -1" },
        { RING_DESC(WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 0), WEFT_ERR_INVALID_ARG, "chunk" },
        { RING_DESC(99, 0, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "unknown collective" },
        { RING_DESC(-1, 0, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "unknown collective" },
        { RING_DESC(WEFT_COLL_SEND, 0, 4, 0, 4, 1), WEFT_ERR_UNSUPPORTED, "point to point" },
        { RING_DESC(WEFT_COLL_ALLGATHER, 0, 4, 0, SIZE_MAX / 2, 1), WEFT_ERR_INVALID_ARG,
          "overflows" },
        { RING_DESC(WEFT_COLL_REDUCE_SCATTER, 0, 3, 0, SIZE_MAX / 2, 1), WEFT_ERR_INVALID_ARG,
          "overflows" },
#undef RING_DESC
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        weft_status_t st = weft_ring_build(&c[i].d, &s);
        cr_assert(st == c[i].want, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0);
    }
    /* Root does not matter where there is none. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 4, 77, 4, 1, WEFT_ALGO_RING };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
    cr_assert(weft_ring_build(NULL, &s) == WEFT_ERR_INVALID_ARG);
    cr_assert(weft_ring_build(&d, NULL) == WEFT_ERR_INVALID_ARG);
    weft_sched_free(&s);
}

/* A rebuild into a used schedule starts from empty. */
Test(ring, rebuild_reuses_schedule)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 8, 0, 1000, 1, WEFT_ALGO_RING };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
    size_t big = s.nsteps;
    d.count = 16;
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps < big && s.nsteps == 56, "%zu steps", s.nsteps);
    weft_sched_free(&s);
}

/* ---- recursive doubling, checked ---------------------------------------------- */

/* Allreduce over ranks pmin..pmax (then 31 and 64 when with_big): powers of
 * two, folded rank counts, counts that leave ranks without a full chunk.
 * slots: see verify. */
static void rd_matrix(int pmin, int pmax, bool with_big, int slots)
{
    int ps[MAXP], np = 0;
    for (int p = pmin; p <= pmax; p++)
        ps[np++] = p;
    if (with_big) {
        ps[np++] = 31;
        ps[np++] = 64;
    }
    for (int i = 0; i < np; i++) {
        size_t p = (size_t)ps[i];
        size_t counts[] = { 0, 1, p - 1, p + 1, 1000003, 10 * p + 7, 9 * p + 1 };
        size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, 65536, 3, 3 };
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            check_sched(WEFT_ALGO_RD, WEFT_COLL_ALLREDUCE, ps[i], 0, counts[c], chunks[c],
                        slots);
        check_sched(WEFT_ALGO_RD, WEFT_COLL_ALLREDUCE, ps[i], 0, p + 1, 1, slots);
    }
}

Test(rd, allreduce_small_p) { rd_matrix(1, 8, false, engine_slots()); }
Test(rd, allreduce_large_p) { rd_matrix(9, 16, true, engine_slots()); }

/* A TCP send completes only once the kernel has taken all of it.  Both
 * partners of an exchange send first and make the reduce wait for their own
 * send; while the engine posted a RECV_REDUCE only once its deps were done,
 * a chunk larger than the socket buffers hung there (seen: 2 ranks,
 * WEFT_SOCKET_BUFSIZE=65536, 256 KiB float sum, "waiting on: send to rank
 * 1").  Now the receive goes out while the send is in flight; unbuffered
 * execution must not deadlock, down to one staging slot. */
Test(rd, no_buffering_needed)
{
    for (int slots = 1; slots <= 2; slots++)
        rd_matrix(1, 9, false, slots);
    rd_matrix(1, 9, false, SLOTS_UNLIMITED);
}

static int count_flag(const struct weft_schedule *s, int flag)
{
    int n = 0;
    for (size_t i = 0; i < s->nsteps; i++)
        n += (s->steps[i].flags & flag) != 0;
    return n;
}

/* The shape the cost model in src/tune.c assumes: log2(p) whole-vector
 * exchanges, plus the fold in and out for a rank count that is not a
 * power of two. */
Test(rd, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 1, 0, 5, 2, WEFT_ALGO_RD };
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5);
    d.count = 0;
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    /* p=4, rank 1, 8 elements in chunks of 3: round 0 with rank 0 (rank 1
     * is the upper half: RECV_FIRST), round 1 with rank 3 (lower: FINAL). */
    d = (struct weft_coll_desc){ WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 3, WEFT_ALGO_RD };
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 12 && s.scratch_count == 0, "%zu steps", s.nsteps);
    for (size_t i = 0; i < s.nsteps; i++) {
        const struct weft_step *st = &s.steps[i];
        bool round0 = i < 6, send = i % 2 == 0;
        cr_assert(st->kind == (send ? WEFT_STEP_SEND : WEFT_STEP_RECV_REDUCE), "step %zu", i);
        cr_assert(st->peer == (round0 ? 0 : 3), "step %zu peer %d", i, st->peer);
        cr_assert(st->off == i / 2 % 3 * 3 && st->count == (i / 2 % 3 == 2 ? 2u : 3u));
        int want = send ? 0 : round0 ? WEFT_STEP_RECV_FIRST : WEFT_STEP_FINAL;
        cr_assert(st->flags == want, "step %zu flags %d", i, st->flags);
        if (send)
            cr_assert(st->buf == (round0 ? WEFT_BUF_SEND : WEFT_BUF_RECV));
        else
            cr_assert(st->buf == WEFT_BUF_RECV && st->deps[0] == (int32_t)i - 1);
        /* chunk c of round 1 waits for chunk c of round 0 only */
        if (!round0 && send)
            cr_assert(st->deps[0] == (int32_t)i - 5, "step %zu deps on %d", i, st->deps[0]);
    }
    /* p=5 folds rank 0 into rank 1. */
    d = (struct weft_coll_desc){ WEFT_COLL_ALLREDUCE, 0, 5, 0, 8, 3, WEFT_ALGO_RD };
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 6);
    for (size_t i = 0; i < 6; i++)
        cr_assert(s.steps[i].kind == (i < 3 ? WEFT_STEP_SEND : WEFT_STEP_RECV) &&
                      s.steps[i].peer == 1 && s.steps[i].flags == 0,
                  "folded rank, step %zu", i);
    d.rank = 1;
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 18, "%zu steps", s.nsteps);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3);
    for (size_t i = 0; i < 3; i++)
        cr_assert(s.steps[i].kind == WEFT_STEP_RECV_REDUCE && s.steps[i].peer == 0 &&
                  s.steps[i].flags == WEFT_STEP_RECV_FIRST && s.steps[i].src_buf == WEFT_BUF_SEND);
    for (size_t i = 15; i < 18; i++)
        cr_assert(s.steps[i].kind == WEFT_STEP_SEND && s.steps[i].peer == 0 &&
                  s.steps[i].buf == WEFT_BUF_RECV);
    d.rank = 4;
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 12);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3);
    weft_sched_free(&s);
}

Test(rd, bad_descriptions)
{
    struct {
        struct weft_coll_desc d;
        weft_status_t want;
        const char *needle;
    } c[] = {
        { { WEFT_COLL_BROADCAST, 0, 4, 0, 4, 1, WEFT_ALGO_RD }, WEFT_ERR_UNSUPPORTED,
          "only allreduce, not broadcast" },
        { { WEFT_COLL_REDUCE_SCATTER, 0, 4, 0, 4, 1, WEFT_ALGO_RD }, WEFT_ERR_UNSUPPORTED,
          "only allreduce" },
        { { WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 1, WEFT_ALGO_RD }, WEFT_ERR_INVALID_ARG, "of 0" },
        { { WEFT_COLL_ALLREDUCE, -1, 4, 0, 4, 1, WEFT_ALGO_RD }, WEFT_ERR_INVALID_ARG,
          "rank -1" },
        { { WEFT_COLL_ALLREDUCE, 4, 4, 0, 4, 1, WEFT_ALGO_RD }, WEFT_ERR_INVALID_ARG, "rank 4" },
        { { WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 0, WEFT_ALGO_RD }, WEFT_ERR_INVALID_ARG, "chunk 0" },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct weft_schedule s;
        weft_sched_init(&s);
        weft_status_t st = weft_rd_build(&c[i].d, &s);
        cr_assert(st == c[i].want, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0);
        /* The dispatcher passes the same verdict on. */
        cr_assert(weft_sched_build(&c[i].d, &s) == c[i].want, "case %zu via sched_build", i);
        weft_sched_free(&s);
    }
}

/* Field by field: struct weft_step has padding that a copy may not keep. */
static bool same_steps(const struct weft_schedule *a, const struct weft_schedule *b)
{
    if (a->nsteps != b->nsteps || a->scratch_count != b->scratch_count)
        return false;
    for (size_t i = 0; i < a->nsteps; i++) {
        const struct weft_step *x = &a->steps[i], *y = &b->steps[i];
        if (x->kind != y->kind || x->flags != y->flags || x->buf != y->buf ||
            x->src_buf != y->src_buf || x->peer != y->peer || x->off != y->off ||
            x->src_off != y->src_off || x->count != y->count ||
            memcmp(x->deps, y->deps, sizeof(x->deps)) != 0)
            return false;
    }
    return true;
}

/* weft_sched_build runs the algorithm the description names. */
Test(schedule, build_dispatches_on_algo)
{
    struct weft_schedule a, b;
    weft_sched_init(&a);
    weft_sched_init(&b);
    for (int algo = 0; algo < WEFT_ALGO_COUNT; algo++) {
        struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 3, 6, 0, 100, 7, algo };
        cr_assert(weft_sched_build(&d, &a) == WEFT_OK);
        cr_assert((algo == WEFT_ALGO_RD ? weft_rd_build(&d, &b) : weft_ring_build(&d, &b)) ==
                  WEFT_OK);
        cr_assert(same_steps(&a, &b), "%s", weft_algo_name(algo));
    }
    /* The two really differ: rd exchanges whole chunks with 3 partners. */
    cr_assert(a.nsteps != 0 && count_flag(&a, WEFT_STEP_RECV_FIRST) > 0);
    int bad[] = { WEFT_ALGO_COUNT, -1, 77 };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 1, bad[i] };
        cr_assert(weft_sched_build(&d, &a) == WEFT_ERR_INVALID_ARG);
        cr_assert(strstr(weft_last_error(NULL), "unknown algorithm"), "'%s'",
                  weft_last_error(NULL));
    }
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_RING), "ring");
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_RD), "rd");
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_COUNT), "unknown");
    weft_sched_free(&a);
    weft_sched_free(&b);
}

/* ---- the checker catches broken schedules ----------------------------------------- */

/* Builds a correct schedule set, lets mutate() break it, and expects the
 * checker to say so with a message containing needle. */
static void expect_caught_algo(int algo, int coll, int p, int root, size_t count, size_t chunk,
                               void (*mutate)(struct weft_schedule *sch, int p),
                               const char *needle)
{
    struct weft_schedule sch[MAXP];
    char err[700] = "";
    int slots = engine_slots();
    build_all(algo, coll, p, root, count, chunk, sch);
    cr_assert(verify(algo, coll, p, root, count, sch, slots, err, sizeof(err)),
              "baseline: %s", err);
    mutate(sch, p);
    bool ok = verify(algo, coll, p, root, count, sch, slots, err, sizeof(err));
    free_all(p, sch);
    if (needle == NULL) {
        cr_assert(ok, "a harmless change was rejected: %s", err);
        return;
    }
    cr_assert(!ok, "the checker missed: %s", needle);
    cr_assert(strstr(err, needle), "wanted '%s', got: %s", needle, err);
}

static void expect_caught(int coll, int p, int root, size_t count, size_t chunk,
                          void (*mutate)(struct weft_schedule *sch, int p), const char *needle)
{
    expect_caught_algo(WEFT_ALGO_RING, coll, p, root, count, chunk, mutate, needle);
}

static struct weft_step *find_step(struct weft_schedule *s, int kind, int nth)
{
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == kind && nth-- == 0)
            return &s->steps[i];
    cr_assert_fail("no step of kind %d", kind);
    return NULL;
}

static void drop_final(struct weft_schedule *sch, int p)
{
    for (size_t i = 0; i < sch[1].nsteps; i++)
        sch[1].steps[i].flags = 0;
}

static void final_everywhere(struct weft_schedule *sch, int p)
{
    for (size_t i = 0; i < sch[0].nsteps; i++)
        if (sch[0].steps[i].kind == WEFT_STEP_RECV_REDUCE)
            sch[0].steps[i].flags = WEFT_STEP_FINAL;
}

static void drop_dep(struct weft_schedule *sch, int p)
{
    /* The second round's send no longer waits for the reduction it sends. */
    find_step(&sch[0], WEFT_STEP_SEND, 1)->deps[0] = -1;
}

static void drop_recv_dep(struct weft_schedule *sch, int p)
{
    /* An allgather receive may now overwrite a block still being sent. */
    struct weft_step *st = find_step(&sch[0], WEFT_STEP_RECV, 1);
    st->deps[0] = -1;
}

static void recv_reduce_allgather(struct weft_schedule *sch, int p)
{
    /* A reduction where the collective has none. */
    struct weft_step *st = find_step(&sch[2], WEFT_STEP_RECV, 0);
    st->kind = WEFT_STEP_RECV_REDUCE;
    st->src_buf = WEFT_BUF_RECV;
    st->src_off = st->off;
}

static void recv_reduce_twice(struct weft_schedule *sch, int p)
{
    /* The allreduce's second allgather receive turned into a reduction with
     * the partial sum the rank made there: ranks counted twice. */
    struct weft_step *st = find_step(&sch[2], WEFT_STEP_RECV, 1);
    st->kind = WEFT_STEP_RECV_REDUCE;
    st->src_buf = WEFT_BUF_RECV;
    st->src_off = st->off;
}

static void swap_recv_dst(struct weft_schedule *sch, int p)
{
    /* Rank 3 is the end of the chain (root 0, p 4): its receives of chunks
     * 0 and 1 land in each other's place. */
    struct weft_step *a = find_step(&sch[3], WEFT_STEP_RECV, 0);
    struct weft_step *b = find_step(&sch[3], WEFT_STEP_RECV, 1);
    size_t t = a->off;
    a->off = b->off;
    b->off = t;
}

static void swap_reduce_src(struct weft_schedule *sch, int p)
{
    /* The root combines chunk 1 of its input with chunk 0 arriving. */
    struct weft_step *a = find_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0);
    struct weft_step *b = find_step(&sch[0], WEFT_STEP_RECV_REDUCE, 1);
    size_t t = a->src_off;
    a->src_off = b->src_off;
    b->src_off = t;
}

static void swap_reduce_dst(struct weft_schedule *sch, int p)
{
    struct weft_step *a = find_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0);
    struct weft_step *b = find_step(&sch[0], WEFT_STEP_RECV_REDUCE, 1);
    size_t t = a->off;
    a->off = b->off;
    b->off = t;
}

static void remove_last(struct weft_schedule *sch, int p)
{
    sch[1].nsteps--;
}

/* Every rank receives before it sends, and its send waits for that
 * receive: nobody sends first. */
static void receive_first(struct weft_schedule *sch, int p)
{
    for (int r = 0; r < p; r++) {
        struct weft_schedule *s = &sch[r];
        cr_assert(s->nsteps >= 2 && s->steps[0].kind == WEFT_STEP_SEND);
        struct weft_step t = s->steps[0];
        s->steps[0] = s->steps[1];
        s->steps[1] = t;
        for (size_t i = 2; i < s->nsteps; i++)
            for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
                if (s->steps[i].deps[k] == 0 || s->steps[i].deps[k] == 1)
                    s->steps[i].deps[k] ^= 1;
        s->steps[0].deps[0] = -1;
        s->steps[1].deps[0] = 0;
    }
}

static void write_sendbuf(struct weft_schedule *sch, int p)
{
    find_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0)->buf = WEFT_BUF_SEND;
}

static void count_mismatch(struct weft_schedule *sch, int p)
{
    find_step(&sch[0], WEFT_STEP_SEND, 0)->count -= 1;
}

static void reorder_sends(struct weft_schedule *sch, int p)
{
    /* The root sends chunk 1 before chunk 0: receivers get them swapped. */
    struct weft_step *a = find_step(&sch[0], WEFT_STEP_SEND, 0);
    struct weft_step *b = find_step(&sch[0], WEFT_STEP_SEND, 1);
    struct weft_step t = *a;
    *a = *b;
    *b = t;
}

Test(checker, catches_broken_schedules)
{
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 3, drop_final, "lacks FINAL");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 3, final_everywhere, "FINAL on a partial");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 100, drop_dep, "unordered");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 100, drop_recv_dep, "unordered");
    expect_caught(WEFT_COLL_ALLGATHER, 4, 0, 10, 3, recv_reduce_allgather, "without reduction");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 10, 3, recv_reduce_twice, "twice");
    expect_caught(WEFT_COLL_BROADCAST, 4, 0, 10, 3, swap_recv_dst, "position");
    expect_caught(WEFT_COLL_BROADCAST, 4, 0, 10, 3, reorder_sends, "position");
    expect_caught(WEFT_COLL_REDUCE, 4, 0, 10, 3, swap_reduce_src, "combines input positions");
    expect_caught(WEFT_COLL_REDUCE, 4, 0, 10, 3, swap_reduce_dst, "position");
    expect_caught(WEFT_COLL_ALLREDUCE, 3, 0, 30, 100, remove_last, "which receives");
    expect_caught(WEFT_COLL_ALLREDUCE, 2, 0, 2, 100, receive_first, "deadlock");
    expect_caught(WEFT_COLL_REDUCE_SCATTER, 3, 0, 30, 100, write_sendbuf, "writes sendbuf");
    expect_caught(WEFT_COLL_ALLREDUCE, 3, 0, 30, 100, count_mismatch, "step 0 sends");
}
/* ---- broken recursive doubling schedules ---- */

static struct weft_step *nth_reduce(struct weft_schedule *s, int nth)
{
    return find_step(s, WEFT_STEP_RECV_REDUCE, nth);
}

static void rd_drop_recv_first(struct weft_schedule *sch, int p)
{
    /* Rank 1 computes x1 op x0 while its partner computes x0 op x1. */
    nth_reduce(&sch[1], 0)->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
}

static void rd_recv_first_both(struct weft_schedule *sch, int p)
{
    nth_reduce(&sch[0], 0)->flags |= WEFT_STEP_RECV_FIRST;
}

static void rd_swap_convention(struct weft_schedule *sch, int p)
{
    /* Both partners switch to x1 op x0: a different tree, but the same on
     * both, so results still agree bit for bit. */
    nth_reduce(&sch[1], 0)->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
    nth_reduce(&sch[0], 0)->flags |= WEFT_STEP_RECV_FIRST;
}

static void rd_drop_recv_first_last_round(struct weft_schedule *sch, int p)
{
    struct weft_schedule *s = &sch[p - 1];
    struct weft_step *st = &s->steps[s->nsteps - 1];
    cr_assert(st->kind == WEFT_STEP_RECV_REDUCE && (st->flags & WEFT_STEP_FINAL));
    st->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
}

static void rd_fold_in_order(struct weft_schedule *sch, int p)
{
    /* Only rank 1 computes the fold-in's (x1 op x0) and it ships that on:
     * the order there is a convention, not a matter of agreement. */
    nth_reduce(&sch[1], 0)->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
}

static void rd_fold_out_early(struct weft_schedule *sch, int p)
{
    /* Rank 1 hands the result back before it has computed it. */
    struct weft_schedule *s = &sch[1];
    struct weft_step *st = &s->steps[s->nsteps - 1];
    cr_assert(st->kind == WEFT_STEP_SEND && st->peer == 0);
    st->deps[0] = -1;
}

static void rd_fold_out_input(struct weft_schedule *sch, int p)
{
    /* Rank 1 hands back its own input instead of the result. */
    struct weft_schedule *s = &sch[1];
    struct weft_step *st = &s->steps[s->nsteps - 1];
    st->buf = WEFT_BUF_SEND;
    st->deps[0] = -1;
}

static void rd_drop_fold_out_recv(struct weft_schedule *sch, int p)
{
    sch[0].nsteps--;
}

static void rd_drop_final(struct weft_schedule *sch, int p)
{
    for (size_t i = 0; i < sch[2].nsteps; i++)
        sch[2].steps[i].flags &= (uint8_t)~WEFT_STEP_FINAL;
}

static void rd_final_early(struct weft_schedule *sch, int p)
{
    nth_reduce(&sch[0], 0)->flags |= WEFT_STEP_FINAL;
}

static void rd_recv_first_on_send(struct weft_schedule *sch, int p)
{
    find_step(&sch[0], WEFT_STEP_SEND, 0)->flags |= WEFT_STEP_RECV_FIRST;
}

/* p=2, 2 elements in chunks of 1: rank 0 computes chunk 1 and sends the
 * result, rank 1 receives it instead of computing it (rank 1 still
 * computes chunk 0).  The values agree, but rank 1 mixes the two ways. */
static void rd_half_received(struct weft_schedule *sch, int p)
{
    struct weft_schedule *a = &sch[0], *b = &sch[1];
    cr_assert(a->nsteps == 4 && b->nsteps == 4);
    struct weft_step snd = a->steps[2], red = a->steps[3];
    red.deps[0] = red.deps[1] = -1;
    snd.buf = WEFT_BUF_RECV;
    snd.deps[0] = 2;
    a->steps[2] = red;
    a->steps[3] = snd;
    b->steps[3].kind = WEFT_STEP_RECV;
    b->steps[3].flags = 0;
}

Test(checker, catches_broken_rd_schedules)
{
    const int rd = WEFT_ALGO_RD, ar = WEFT_COLL_ALLREDUCE;
    expect_caught_algo(rd, ar, 2, 0, 10, 3, rd_drop_recv_first, "same expression");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_drop_recv_first, "same expression");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_recv_first_both, "same expression");
    expect_caught_algo(rd, ar, 8, 0, 10, 3, rd_drop_recv_first_last_round, "same expression");
    expect_caught_algo(rd, ar, 6, 0, 10, 3, rd_drop_recv_first_last_round, "same expression");
    expect_caught_algo(rd, ar, 5, 0, 10, 3, rd_fold_out_early, "unordered");
    expect_caught_algo(rd, ar, 3, 0, 10, 100, rd_fold_out_input, "holds ranks 0x2");
    expect_caught_algo(rd, ar, 6, 0, 10, 3, rd_drop_fold_out_recv, "which receives");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_drop_final, "lacks FINAL");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_final_early, "FINAL on a partial");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_recv_first_on_send, "RECV_FIRST on a SEND");
    expect_caught_algo(rd, ar, 2, 0, 2, 1, rd_half_received, "reduced 1 of 2 elements");
    /* Changes that keep every rank's expression the same pass. */
    expect_caught_algo(rd, ar, 2, 0, 10, 3, rd_swap_convention, NULL);
    expect_caught_algo(rd, ar, 3, 0, 10, 3, rd_fold_in_order, NULL);
}

/* ---- deadlocks the engine would have ---------------------------------------------- */

/* Appends a one-element step to a hand-made schedule: SEND reads sendbuf,
 * RECV writes recvbuf, RECV_REDUCE combines sendbuf into recvbuf, all at
 * element off. */
static int32_t add_step(struct weft_schedule *s, int kind, int flags, int peer, size_t off,
                        int32_t dep)
{
    struct weft_step st = { .kind = (uint8_t)kind, .flags = (uint8_t)flags,
                            .buf = kind == WEFT_STEP_SEND ? WEFT_BUF_SEND : WEFT_BUF_RECV,
                            .src_buf = WEFT_BUF_SEND, .peer = peer, .deps = { dep, -1, -1 },
                            .off = off, .src_off = off, .count = 1 };
    int32_t i = weft_sched_add(s, &st);
    cr_assert(i >= 0);
    return i;
}

/* Runs hand-made allreduce schedules, 2 elements per rank, without asking
 * for a right result: only whether (and where) execution gets stuck. */
static bool run_hand(int p, struct weft_schedule *sch, int slots, char *err, size_t len)
{
    err[0] = '\0';
    return simulate(WEFT_ALGO_RING, WEFT_COLL_ALLREDUCE, p, 0, 2, sch, slots, false, err, len);
}

/* Two partners that each send and then receive, the receive waiting for
 * their own send.  A plain RECV is posted only once the send is done, and
 * the send is done only once the peer's receive is posted: that needs the
 * transport to buffer the message.  A RECV_REDUCE is posted while its send
 * is in flight, so it does not (rd's exchanges are built that way; the
 * engine that held RECV_REDUCE back like a RECV hung on them). */
Test(checker, send_then_dependent_receive)
{
    struct weft_schedule sch[2];
    char err[700];
    for (int kind = WEFT_STEP_RECV; kind <= WEFT_STEP_RECV_REDUCE; kind++) {
        for (int r = 0; r < 2; r++) {
            weft_sched_init(&sch[r]);
            int32_t snd = add_step(&sch[r], WEFT_STEP_SEND, 0, 1 - r, 0, -1);
            int flags = kind == WEFT_STEP_RECV_REDUCE ? WEFT_STEP_FINAL : 0;
            add_step(&sch[r], kind, flags, 1 - r, 0, snd);
        }
        cr_assert(run_hand(2, sch, SLOTS_BUFFERED, err, sizeof(err)), "%s", err);
        int slots[] = { 1, 2, SLOTS_UNLIMITED };
        for (size_t k = 0; k < sizeof(slots) / sizeof(slots[0]); k++) {
            bool ok = run_hand(2, sch, slots[k], err, sizeof(err));
            if (kind == WEFT_STEP_RECV_REDUCE) {
                cr_assert(ok, "%s", err);
                continue;
            }
            cr_assert(!ok, "a send that needs buffering passed (slots %d)", slots[k]);
            cr_assert(strstr(err, "deadlock: rank 0 step 0 (SEND, peer 1) never completes: "
                                  "posted, but rank 1 never posts step 1, its match"),
                      "%s", err);
        }
        free_all(2, sch);
    }
}

/* Each rank receives first and sends what it received: nobody ever sends,
 * buffered or not, a RECV_REDUCE (posted at once) no better than a RECV. */
Test(checker, receive_before_send)
{
    struct weft_schedule sch[2];
    char err[700];
    for (int kind = WEFT_STEP_RECV; kind <= WEFT_STEP_RECV_REDUCE; kind++) {
        for (int r = 0; r < 2; r++) {
            weft_sched_init(&sch[r]);
            int flags = kind == WEFT_STEP_RECV_REDUCE ? WEFT_STEP_FINAL : 0;
            int32_t rcv = add_step(&sch[r], kind, flags, 1 - r, 0, -1);
            struct weft_step st = { .kind = WEFT_STEP_SEND, .buf = WEFT_BUF_RECV,
                                    .peer = 1 - r, .deps = { rcv, -1, -1 }, .count = 1 };
            cr_assert(weft_sched_add(&sch[r], &st) == 1);
        }
        int slots[] = { SLOTS_BUFFERED, 1, SLOTS_UNLIMITED };
        for (size_t k = 0; k < sizeof(slots) / sizeof(slots[0]); k++) {
            cr_assert(!run_hand(2, sch, slots[k], err, sizeof(err)), "%s, slots %d: passed",
                      kind_name(kind), slots[k]);
            char want[120];
            snprintf(want, sizeof(want), "deadlock: rank 0 step 0 (%s, peer 1) never completes: "
                     "posted, but rank 1 never posts step 1", kind_name(kind));
            cr_assert(strstr(err, want), "%s", err);
        }
        free_all(2, sch);
    }
}

/* Messages on one link keep their order: rank 0's second receive from rank
 * 1 (a RECV_REDUCE free to go) is not posted before the first (a RECV that
 * waits for rank 0's send), so rank 1's first send, which that RECV takes,
 * blocks its second. */
Test(checker, link_order)
{
    struct weft_schedule sch[2];
    char err[700];
    weft_sched_init(&sch[0]);
    weft_sched_init(&sch[1]);
    int32_t snd = add_step(&sch[0], WEFT_STEP_SEND, 0, 1, 0, -1);
    add_step(&sch[0], WEFT_STEP_RECV, 0, 1, 0, snd);
    add_step(&sch[0], WEFT_STEP_RECV_REDUCE, WEFT_STEP_FINAL, 1, 1, -1);
    add_step(&sch[1], WEFT_STEP_SEND, 0, 0, 0, -1);
    snd = add_step(&sch[1], WEFT_STEP_SEND, 0, 0, 1, -1);
    add_step(&sch[1], WEFT_STEP_RECV, 0, 0, 1, snd);
    cr_assert(run_hand(2, sch, SLOTS_BUFFERED, err, sizeof(err)), "%s", err);
    cr_assert(!run_hand(2, sch, SLOTS_UNLIMITED, err, sizeof(err)), "a message overtook");
    cr_assert(strstr(err, "deadlock: rank 0 step 0 (SEND, peer 1) never completes"), "%s", err);
    /* With both links in the other order (the receive of rank 1 still
     * waiting for the send the RECV_REDUCE takes), all is well. */
    struct weft_step t = sch[0].steps[1];
    sch[0].steps[1] = sch[0].steps[2];
    sch[0].steps[2] = t;
    sch[1].steps[0].off = 1;
    sch[1].steps[1].off = 0;
    sch[1].steps[2].deps[0] = 0;
    cr_assert(run_hand(2, sch, SLOTS_UNLIMITED, err, sizeof(err)), "%s", err);
    free_all(2, sch);
}

/* A RECV_REDUCE holds its staging slot from its post to its reduce.  Rank 0
 * takes two messages, from rank 2 first in schedule order; rank 2 sends
 * only after rank 1 has sent it something, which rank 1 does only after
 * rank 0 took rank 1's message.  With one slot, the receive from rank 2
 * holds it and the one from rank 1 can never be posted. */
Test(checker, staging_slots_run_out)
{
    struct weft_schedule sch[3];
    char err[700];
    for (int r = 0; r < 3; r++)
        weft_sched_init(&sch[r]);
    add_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0, 2, 0, -1);
    add_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0, 1, 1, -1);
    add_step(&sch[1], WEFT_STEP_SEND, 0, 0, 1, -1);
    add_step(&sch[1], WEFT_STEP_SEND, 0, 2, 0, 0);
    add_step(&sch[2], WEFT_STEP_RECV, 0, 1, 1, -1);
    add_step(&sch[2], WEFT_STEP_SEND, 0, 0, 0, 0);
    cr_assert(!run_hand(3, sch, 1, err, sizeof(err)), "one slot was enough");
    cr_assert(strstr(err, "1 staging slot: deadlock: rank 0 step 0 (RECV_REDUCE, peer 2) never "
                          "completes: posted, but rank 2 never posts step 1"),
              "%s", err);
    cr_assert(run_hand(3, sch, 2, err, sizeof(err)), "%s", err);
    cr_assert(run_hand(3, sch, SLOTS_UNLIMITED, err, sizeof(err)), "%s", err);
    cr_assert(run_hand(3, sch, SLOTS_BUFFERED, err, sizeof(err)), "%s", err);
    free_all(3, sch);
}
/* ---- schedule container and collective facts ---------------------------------------- */

Test(schedule, add_grows_and_keeps_order)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    cr_assert(s.steps == NULL && s.nsteps == 0 && s.cap == 0 && s.scratch_count == 0);
    for (int i = 0; i < 1000; i++) {
        struct weft_step st = { .kind = WEFT_STEP_SEND, .peer = i, .deps = { -1, -1, -1 },
                                .count = (size_t)i + 1 };
        cr_assert(weft_sched_add(&s, &st) == i);
    }
    cr_assert(s.nsteps == 1000 && s.cap >= 1000 && s.cap < 4000);
    for (int i = 0; i < 1000; i++)
        cr_assert(s.steps[i].peer == i && s.steps[i].count == (size_t)i + 1);
    weft_sched_free(&s);
    cr_assert(s.steps == NULL && s.nsteps == 0);
    weft_sched_free(&s);
    weft_sched_free(NULL);
}

Test(schedule, coll_counts_and_names)
{
    struct {
        int coll;
        size_t send, recv;
        const char *name;
    } c[] = {
        { WEFT_COLL_ALLREDUCE, 10, 10, "allreduce" },
        { WEFT_COLL_REDUCE_SCATTER, 40, 10, "reduce_scatter" },
        { WEFT_COLL_ALLGATHER, 10, 40, "allgather" },
        { WEFT_COLL_BROADCAST, 10, 10, "broadcast" },
        { WEFT_COLL_REDUCE, 10, 10, "reduce" },
        { WEFT_COLL_SEND, 10, 0, "send" },
        { WEFT_COLL_RECV, 0, 10, "recv" },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct weft_coll_desc d = { c[i].coll, 1, 4, 0, 10, 1, WEFT_ALGO_RING };
        cr_assert(weft_coll_send_count(&d) == c[i].send, "%s send", c[i].name);
        cr_assert(weft_coll_recv_count(&d) == c[i].recv, "%s recv", c[i].name);
        cr_assert_str_eq(weft_coll_name(c[i].coll), c[i].name);
    }
    cr_assert_str_eq(weft_coll_name(WEFT_COLL_COUNT), "unknown");
    cr_assert_str_eq(weft_coll_name(-3), "unknown");
    struct weft_coll_desc big = { WEFT_COLL_ALLGATHER, 0, 4, 0, SIZE_MAX / 2, 1,
                                  WEFT_ALGO_RING };
    cr_assert(weft_coll_recv_count(&big) == SIZE_MAX, "an overflowing size saturates");
}
