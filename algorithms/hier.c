/*
 * hier.c - hierarchical schedules: a phase within each node, one among the
 * nodes, one within each node again.  Every phase is a flat schedule (ring,
 * recursive doubling, binomial tree, or the gather/scatter below) built for
 * a sub-group and spliced into the rank's schedule by hier_phase.
 *
 * Splicing (hier_append): a sub-schedule's ranks become the group's real
 * ranks, its three buffers become places in the real ones (the sub-SEND of
 * a phase is often the real RECV or SCRATCH at an offset), its deps are
 * renumbered, and a memory tracker adds what orders phases: a step waits
 * for the earlier phases' steps that last wrote the memory it touches and,
 * when it writes, for those that read it since.  The tracker works on
 * element ranges, so dependencies stay per chunk and phases pipeline: chunk
 * c of the inter-node phase starts once chunk c of the intra-node phase is
 * in.  Addresses are taken in the in-place layout (weft.h: sendbuf and
 * recvbuf overlap), which orders everything the out-of-place layout needs
 * too, so one schedule is right for both.  A step that would need more than
 * WEFT_STEP_MAX_DEPS deps gets them through join steps: a COPY of one
 * element onto itself, which the engine skips and which touches nothing.
 *
 * Nodes are ordered by their lowest rank (the leader); a node with one rank
 * needs no intra-node phase, a single node needs no inter-node one, so one
 * node or one rank per node degenerates to the flat schedule.
 */
#include <stdlib.h>
#include <string.h>

#include "algorithms/registry.h"

/* Where a buffer of a sub-schedule lives in the real schedule.  buf
 * HIER_ALLOC (sub-SCRATCH only): fresh scratch, as much as the sub-schedule
 * asks for. */
struct hier_place {
    int buf;    /* enum weft_buf_id, or HIER_ALLOC */
    size_t off; /* elements into buf */
};
#define HIER_ALLOC (-1)
#define HIER_KEEP_FINAL 0x1 /* the group's result is the collective's: FINAL stays */
#define HIER_DROP_COPY 0x2  /* leave out the sub-schedule's COPY steps (done elsewhere) */

/* How the flat sub-schedule of a phase is built: by a family (the first
 * three), or by hier's own gather and scatter. */
enum { SUB_RING, SUB_RD, SUB_TREE, SUB_GATHER, SUB_SCATTER, SUB_SCATTER_NO_OWN };

/* The tracker: the real memory as segments [lo, next lo), each with the
 * step that last wrote it and the steps that read it since (-1: none). */
struct hier_seg {
    size_t lo;
    int32_t w;
    int32_t nr;
    int32_t r[WEFT_STEP_MAX_DEPS];
};

/* An access of the phase being appended; folded into the segments when the
 * phase is complete, so that a phase's steps only see earlier phases. */
struct hier_acc {
    size_t lo, hi;
    int32_t step;
    bool write;
};

/* One hier_build call's state. */
struct hier {
    const struct weft_coll_desc *d;
    struct weft_schedule *s;
    int rank, p, nn; /* nn: nodes that have ranks */
    int me, li;      /* my node, my index in it */
    int *nodeof;     /* (p) rank -> node, nodes numbered by their lowest rank */
    int *start;      /* (nn + 1) node j's ranks are members[start[j] .. start[j + 1]) */
    int *members;    /* (p) ranks node by node, each node in rank order */
    int *grp;        /* (p) a group being assembled */
    size_t base[3];  /* element address of each buffer, in-place layout */
    int join_buf;    /* where join steps copy onto themselves; -1 until needed */
    size_t join_off;
    struct hier_seg *seg;
    size_t nseg, capseg;
    struct hier_acc *log;
    size_t nlog, caplog;
    int32_t *idx; /* sub-step -> real step, -1: left out */
    size_t capidx;
    int32_t *dl; /* deps being collected for one step */
    size_t ndl, capdl;
    struct weft_schedule sub;
    const int *hint_ranks; /* a group whose index of this rank is known: hint_me */
    int hint_me;
};

static weft_status_t nomem(const char *what)
{
    return weft_error(NULL, WEFT_ERR_NO_MEMORY, "hier: cannot allocate %s", what);
}

static weft_status_t grow(void **p, size_t *cap, size_t need, size_t size, const char *what)
{
    if (need <= *cap)
        return WEFT_OK;
    size_t cap2 = *cap ? *cap : 16;
    while (cap2 < need)
        cap2 *= 2;
    void *q = realloc(*p, cap2 * size);
    if (!q)
        return nomem(what);
    *p = q;
    *cap = cap2;
    return WEFT_OK;
}

static size_t scratch_alloc(struct hier *h, size_t n)
{
    size_t off = h->s->scratch_count;
    h->s->scratch_count += n;
    return off;
}

/* A step that only waits for deps[0..n) (n <= WEFT_STEP_MAX_DEPS). */
static weft_status_t join(struct hier *h, const int32_t *deps, size_t n, int32_t *idx)
{
    if (h->join_buf < 0) {
        /* Any element the rank may write will do; the copy never moves it.
         * A reduce's non-root must not touch recvbuf, so it gets scratch. */
        bool recv_ok = weft_coll_recv_count(h->d) > 0 &&
                       (h->d->coll != WEFT_COLL_REDUCE || h->rank == h->d->root);
        h->join_buf = recv_ok ? WEFT_BUF_RECV : WEFT_BUF_SCRATCH;
        h->join_off = recv_ok ? 0 : scratch_alloc(h, 1);
    }
    struct weft_step st = {
        .kind = WEFT_STEP_COPY, .buf = (uint8_t)h->join_buf, .src_buf = (uint8_t)h->join_buf,
        .peer = -1, .deps = {-1, -1, -1}, .off = h->join_off, .src_off = h->join_off, .count = 1,
    };
    for (size_t k = 0; k < n; k++)
        st.deps[k] = deps[k];
    return weft_sched_push(h->s, "hier", &st, idx);
}

/* ---- the tracker ------------------------------------------------------------------- */

/* Index of the segment holding address a. */
static size_t seg_find(const struct hier *h, size_t a)
{
    size_t lo = 0, hi = h->nseg; /* seg[0].lo == 0 */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (h->seg[mid].lo <= a)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

/* Makes a segment start at a; returns its index. */
static weft_status_t seg_split(struct hier *h, size_t a, size_t *at)
{
    size_t i = seg_find(h, a);
    if (h->seg[i].lo == a) {
        *at = i;
        return WEFT_OK;
    }
    WEFT_CHECK(grow((void **)&h->seg, &h->capseg, h->nseg + 1, sizeof(*h->seg), "segments"));
    memmove(&h->seg[i + 2], &h->seg[i + 1], (h->nseg - i - 1) * sizeof(*h->seg));
    h->seg[i + 1] = h->seg[i];
    h->seg[i + 1].lo = a;
    h->nseg++;
    *at = i + 1;
    return WEFT_OK;
}

static weft_status_t dl_add(struct hier *h, int32_t dep)
{
    if (dep < 0)
        return WEFT_OK;
    for (size_t k = 0; k < h->ndl; k++)
        if (h->dl[k] == dep)
            return WEFT_OK;
    WEFT_CHECK(grow((void **)&h->dl, &h->capdl, h->ndl + 1, sizeof(*h->dl), "dependencies"));
    h->dl[h->ndl++] = dep;
    return WEFT_OK;
}

/* What an access of [lo, hi) must wait for among the earlier phases. */
static weft_status_t trk_query(struct hier *h, size_t lo, size_t hi, bool write)
{
    for (size_t i = seg_find(h, lo); i < h->nseg && h->seg[i].lo < hi; i++) {
        WEFT_CHECK(dl_add(h, h->seg[i].w));
        for (int32_t k = 0; write && k < h->seg[i].nr; k++)
            WEFT_CHECK(dl_add(h, h->seg[i].r[k]));
    }
    return WEFT_OK;
}

static weft_status_t trk_apply(struct hier *h, const struct hier_acc *a)
{
    size_t i, end;
    WEFT_CHECK(seg_split(h, a->lo, &i));
    WEFT_CHECK(seg_split(h, a->hi, &end));
    for (; i < end; i++) {
        struct hier_seg *g = &h->seg[i];
        if (a->write) {
            g->w = a->step;
            g->nr = 0;
            continue;
        }
        if (g->nr == WEFT_STEP_MAX_DEPS) {
            /* Readers that a later writer must all wait for: one join. */
            int32_t j = -1;
            WEFT_CHECK(join(h, g->r, (size_t)g->nr, &j));
            g = &h->seg[i];
            g->r[0] = j;
            g->nr = 1;
        }
        g->r[g->nr++] = a->step;
    }
    return WEFT_OK;
}

static weft_status_t trk_log(struct hier *h, size_t lo, size_t n, int32_t step, bool write)
{
    WEFT_CHECK(grow((void **)&h->log, &h->caplog, h->nlog + 1, sizeof(*h->log), "accesses"));
    h->log[h->nlog++] = (struct hier_acc){lo, lo + n, step, write};
    return WEFT_OK;
}

/* ---- splicing a sub-schedule in ---------------------------------------------------- */

static size_t addr(const struct hier *h, int buf, size_t off)
{
    return h->base[buf] + off;
}

/* Appends sub (a schedule of the group ranks[0..)) with its buffers at at. */
static weft_status_t hier_append(struct hier *h, const struct weft_schedule *sub, const int *ranks,
                                 const struct hier_place at[3], int flags)
{
    WEFT_CHECK(grow((void **)&h->idx, &h->capidx, sub->nsteps, sizeof(*h->idx), "step map"));
    h->nlog = 0;
    for (size_t j = 0; j < sub->nsteps; j++) {
        const struct weft_step *ss = &sub->steps[j];
        struct weft_step st = *ss;
        st.buf = (uint8_t)at[ss->buf].buf;
        st.off = at[ss->buf].off + ss->off;
        st.src_buf = (uint8_t)at[ss->src_buf].buf;
        st.src_off = at[ss->src_buf].off + ss->src_off;
        if (st.kind != WEFT_STEP_COPY)
            st.peer = ranks[ss->peer];
        if (!(flags & HIER_KEEP_FINAL))
            st.flags &= (uint8_t)~WEFT_STEP_FINAL;
        bool nodeps = ss->deps[0] < 0 && ss->deps[1] < 0 && ss->deps[2] < 0;
        size_t dst = addr(h, st.buf, st.off), src = addr(h, st.src_buf, st.src_off);
        /* A copy from sendbuf to recvbuf vanishes in place only: out of
         * place it writes, so only a copy onto its very own place is none. */
        bool noop = st.kind == WEFT_STEP_COPY && st.buf == st.src_buf && st.off == st.src_off;
        if (st.kind == WEFT_STEP_COPY && nodeps && ((flags & HIER_DROP_COPY) || noop)) {
            h->idx[j] = -1; /* nothing waits for what it did not do */
            continue;
        }
        h->ndl = 0;
        for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
            if (ss->deps[k] >= 0)
                WEFT_CHECK(dl_add(h, h->idx[ss->deps[k]]));
        bool reads = st.kind == WEFT_STEP_SEND ||
                     (!noop && (st.kind == WEFT_STEP_RECV_REDUCE || st.kind == WEFT_STEP_COPY));
        bool writes = st.kind != WEFT_STEP_SEND && !noop;
        size_t rd = st.kind == WEFT_STEP_SEND ? dst : src;
        if (reads)
            WEFT_CHECK(trk_query(h, rd, rd + st.count, false));
        if (writes)
            WEFT_CHECK(trk_query(h, dst, dst + st.count, true));
        while (h->ndl > WEFT_STEP_MAX_DEPS) {
            int32_t jn = -1;
            h->ndl -= WEFT_STEP_MAX_DEPS;
            WEFT_CHECK(join(h, &h->dl[h->ndl], WEFT_STEP_MAX_DEPS, &jn));
            h->dl[h->ndl++] = jn;
        }
        for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
            st.deps[k] = (size_t)k < h->ndl ? h->dl[k] : -1;
        int32_t i = -1;
        WEFT_CHECK(weft_sched_push(h->s, "hier", &st, &i));
        h->idx[j] = i;
        if (reads)
            WEFT_CHECK(trk_log(h, rd, st.count, i, false));
        if (writes)
            WEFT_CHECK(trk_log(h, dst, st.count, i, true));
    }
    for (size_t k = 0; k < h->nlog; k++)
        WEFT_CHECK(trk_apply(h, &h->log[k]));
    return WEFT_OK;
}

/* ---- sub-schedules of hier's own ------------------------------------------------------
 * Gather: sub-rank 0 receives member i's cnt elements into sub-RECV at
 * ranks[i] * cnt (rank order, as allgather's recvbuf) and copies its own.
 * Scatter: the reverse; sub-rank 0 sends sub-SEND at ranks[i] * cnt to
 * member i and (own) copies its block into its sub-RECV. */

static weft_status_t sub_emit(struct weft_schedule *s, int kind, int buf, int src_buf, int peer,
                              size_t off, size_t src_off, size_t count)
{
    struct weft_step st = {
        .kind = (uint8_t)kind, .buf = (uint8_t)buf, .src_buf = (uint8_t)src_buf, .peer = peer,
        .deps = {-1, -1, -1}, .off = off, .src_off = src_off, .count = count,
    };
    return weft_sched_push(s, "hier", &st, NULL);
}

static weft_status_t build_gather(struct weft_schedule *s, const int *ranks, int n, int me,
                                  size_t cnt, size_t chunk, bool scatter, bool own)
{
    s->nsteps = 0;
    s->scratch_count = 0;
    for (int i = 1; i < n; i++) {
        if (me != 0 && me != i)
            continue;
        /* Sub-rank 0 works on member i's block, the member on its own
         * cnt elements; the data flows out of 0 when scattering. */
        int kind = (me == 0) == scatter ? WEFT_STEP_SEND : WEFT_STEP_RECV;
        int buf = kind == WEFT_STEP_SEND ? WEFT_BUF_SEND : WEFT_BUF_RECV;
        size_t at = me == 0 ? (size_t)ranks[i] * cnt : 0;
        for (size_t co = 0; co < cnt; co += chunk)
            WEFT_CHECK(sub_emit(s, kind, buf, buf, me == 0 ? i : 0, at + co, 0,
                                WEFT_MIN(chunk, cnt - co)));
    }
    size_t own_blk = (size_t)ranks[0] * cnt;
    if (me == 0 && own && cnt > 0)
        WEFT_CHECK(sub_emit(s, WEFT_STEP_COPY, WEFT_BUF_RECV, WEFT_BUF_SEND, -1,
                            scatter ? 0 : own_blk, scatter ? own_blk : 0, cnt));
    return WEFT_OK;
}

/* Builds the flat schedule `how` of coll for the group ranks[0..n) (root: a
 * sub-rank) over count elements and splices it in with its buffers at at.
 * Ranks outside the group add nothing. */
static weft_status_t hier_phase(struct hier *h, int how, enum weft_coll coll, const int *ranks,
                                int n, int root, size_t count, const struct hier_place at_in[3],
                                int flags)
{
    int me = -1;
    if (ranks == h->hint_ranks)
        me = h->hint_me;
    else
        for (int i = 0; i < n; i++)
            if (ranks[i] == h->rank)
                me = i;
    if (me < 0 || count == 0)
        return WEFT_OK;
    /* The flat families' sub-schedules come through the registry like
     * any other; its checks cost nothing next to the build. */
    static const struct {
        enum weft_algo algo;
        int variant;
    } flat[] = {
        [SUB_RING] = {WEFT_ALGO_RING, WEFT_VAR_DEFAULT},
        [SUB_RD] = {WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING},
        [SUB_TREE] = {WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL},
    };
    if (how < (int)WEFT_ARRAY_SIZE(flat)) {
        struct weft_coll_desc sd = {
            .coll = coll, .rank = me, .nranks = n, .root = root, .count = count,
            .chunk = h->d->chunk, .algo = flat[how].algo, .variant = flat[how].variant,
        };
        WEFT_CHECK(weft_sched_build(&sd, &h->sub));
    } else {
        WEFT_CHECK(build_gather(&h->sub, ranks, n, me, count, h->d->chunk, how != SUB_GATHER,
                                how != SUB_SCATTER_NO_OWN));
    }
    struct hier_place at[3] = {at_in[0], at_in[1], at_in[2]};
    if (at[WEFT_BUF_SCRATCH].buf == HIER_ALLOC)
        at[WEFT_BUF_SCRATCH] =
            (struct hier_place){WEFT_BUF_SCRATCH, scratch_alloc(h, h->sub.scratch_count)};
    return hier_append(h, &h->sub, ranks, at, flags);
}

#define PLACE(b, o) ((struct hier_place){(b), (o)})
#define ALLOC PLACE(HIER_ALLOC, 0)

static const int *node_ranks(const struct hier *h, int j, int *n)
{
    *n = h->start[j + 1] - h->start[j];
    return &h->members[h->start[j]];
}

/* Each node's leader (lowest rank), or for node_of_root the root, in node
 * order into h->grp. */
static const int *heads(struct hier *h, int root)
{
    for (int j = 0; j < h->nn; j++)
        h->grp[j] = h->members[h->start[j]];
    if (root >= 0)
        h->grp[h->nodeof[root]] = root;
    return h->grp;
}

static int index_in(const int *ranks, int n, int r)
{
    for (int i = 0; i < n; i++)
        if (ranks[i] == r)
            return i;
    return -1;
}

/* ---- allreduce ------------------------------------------------------------------------
 * Nodes of one size L > 1, the 2D form: a ring reduce-scatter in the node
 * leaves local rank i with slice i (count / L elements) summed over its
 * node; the ranks with local index i, one per node, allreduce slice i (ring
 * or recursive doubling); a ring allgather in the node spreads the slices.
 * Every rank moves about 2 count within its node and 2 count / L across.
 * The count % L elements left over, and uneven nodes, take the leader form
 * over [off, off + n): a chain reduce to the node's leader, the leaders'
 * allreduce, a chain broadcast from the leader. */
static weft_status_t allreduce_leaders(struct hier *h, size_t off, size_t n)
{
    int ln, lv = h->d->variant == WEFT_VAR_HIER_RHD ? SUB_RD : SUB_RING;
    const int *node = node_ranks(h, h->me, &ln);
    struct hier_place in_recv[3] = {PLACE(WEFT_BUF_RECV, off), PLACE(WEFT_BUF_RECV, off), ALLOC};
    struct hier_place red[3] = {PLACE(WEFT_BUF_SEND, off), PLACE(WEFT_BUF_RECV, off), ALLOC};
    WEFT_CHECK(hier_phase(h, SUB_RING, WEFT_COLL_REDUCE, node, ln, 0, n, red,
                          h->nn == 1 ? HIER_KEEP_FINAL : 0));
    WEFT_CHECK(hier_phase(h, lv, WEFT_COLL_ALLREDUCE, heads(h, -1), h->nn, 0, n, in_recv,
                          HIER_KEEP_FINAL));
    return hier_phase(h, SUB_RING, WEFT_COLL_BROADCAST, node, ln, 0, n, in_recv, HIER_KEEP_FINAL);
}

static weft_status_t build_allreduce(struct hier *h)
{
    size_t n = h->d->count;
    int L = h->start[1] - h->start[0];
    for (int j = 1; j < h->nn; j++)
        if (h->start[j + 1] - h->start[j] != L)
            L = 0;
    if (L <= 1)
        return allreduce_leaders(h, 0, n);
    size_t q = n / (size_t)L, li = (size_t)h->li;
    int ln;
    const int *node = node_ranks(h, h->me, &ln);
    /* In place, recvbuf + li q is sendbuf + li q: the sub reduce-scatter's
     * own in-place layout, which it is built to handle. */
    struct hier_place rs[3] = {PLACE(WEFT_BUF_SEND, 0), PLACE(WEFT_BUF_RECV, li * q), ALLOC};
    struct hier_place slice[3] = {PLACE(WEFT_BUF_RECV, li * q), PLACE(WEFT_BUF_RECV, li * q),
                                  ALLOC};
    struct hier_place ag[3] = {PLACE(WEFT_BUF_RECV, li * q), PLACE(WEFT_BUF_RECV, 0), ALLOC};
    WEFT_CHECK(hier_phase(h, SUB_RING, WEFT_COLL_REDUCE_SCATTER, node, ln, 0, q, rs,
                          h->nn == 1 ? HIER_KEEP_FINAL : 0));
    for (int j = 0; j < h->nn; j++)
        h->grp[j] = h->members[h->start[j] + h->li];
    WEFT_CHECK(hier_phase(h, h->d->variant == WEFT_VAR_HIER_RHD ? SUB_RD : SUB_RING,
                          WEFT_COLL_ALLREDUCE, h->grp, h->nn, 0, q, slice, HIER_KEEP_FINAL));
    WEFT_CHECK(hier_phase(h, SUB_RING, WEFT_COLL_ALLGATHER, node, ln, 0, q, ag, HIER_KEEP_FINAL));
    return allreduce_leaders(h, q * (size_t)L, n - q * (size_t)L);
}

/* Runs of blocks for the leaders' phase of reduce_scatter and allgather:
 * maximal rank-contiguous blocks of one node ([*b0, *b1), node *j), and
 * with split_leader the leader's own block alone, so that its result can go
 * straight to its recvbuf.  Every rank walks the same runs in the same
 * order, which keeps messages matched.  Returns false past the last. */
static bool next_run(const struct hier *h, int *b0, int *b1, int *j, bool split_leader)
{
    if (*b1 >= h->p)
        return false;
    *b0 = *b1;
    *j = h->nodeof[*b0];
    int lead = h->members[h->start[*j]];
    int b = *b0 + 1;
    if (!(split_leader && *b0 == lead))
        while (b < h->p && h->nodeof[b] == *j && !(split_leader && b == lead))
            b++;
    *b1 = b;
    return true;
}

/* The collective as the flat ring over all ranks. */
static weft_status_t build_flat(struct hier *h)
{
    struct hier_place flat[3] = {PLACE(WEFT_BUF_SEND, 0), PLACE(WEFT_BUF_RECV, 0), ALLOC};
    return hier_phase(h, SUB_RING, h->d->coll, h->members, h->p, 0, h->d->count, flat,
                      HIER_KEEP_FINAL);
}

/* ---- reduce_scatter -------------------------------------------------------------------
 * One node, or (ring) one rank per node: the flat ring.  Otherwise: a chain
 * reduce of the whole input to the node leader (scratch P, rank order);
 * the leaders reduce each run of a node's blocks to that node's leader
 * along a chain (ring variant; the chains of all runs together are a ring
 * reduce-scatter with uneven blocks) into scratch Q, or allreduce all of
 * it by recursive doubling into Q (rhd: log2(nodes) exchanges, for the
 * latency-bound sizes); the leader scatters the node's blocks from Q. */
static weft_status_t build_reduce_scatter(struct hier *h)
{
    size_t R = h->d->count, all = R * (size_t)h->p;
    bool rhd = h->d->variant == WEFT_VAR_HIER_RHD;
    if (h->nn == 1 || (h->nn == h->p && !rhd))
        return build_flat(h);
    int ln;
    const int *node = node_ranks(h, h->me, &ln);
    bool leader = h->li == 0;
    struct hier_place part = PLACE(WEFT_BUF_SEND, 0);
    if (ln > 1 && leader)
        part = PLACE(WEFT_BUF_SCRATCH, scratch_alloc(h, all));
    struct hier_place red[3] = {PLACE(WEFT_BUF_SEND, 0), part, ALLOC};
    if (ln > 1)
        WEFT_CHECK(hier_phase(h, SUB_RING, WEFT_COLL_REDUCE, node, ln, 0, all, red, 0));
    size_t q = leader && (rhd || ln > 1) ? scratch_alloc(h, all) : 0;
    const int *lead = heads(h, -1);
    if (rhd) {
        struct hier_place ar[3] = {part, PLACE(WEFT_BUF_SCRATCH, q), ALLOC};
        WEFT_CHECK(hier_phase(h, SUB_RD, WEFT_COLL_ALLREDUCE, lead, h->nn, 0, all, ar,
                              HIER_KEEP_FINAL));
    } else {
        int b0 = 0, b1 = 0, j;
        /* Only leaders take part; a leader's place among them is its node's
         * (one search per run made large node counts quadratic per run). */
        h->hint_ranks = lead;
        h->hint_me = h->me;
        while (leader && next_run(h, &b0, &b1, &j, true)) {
            bool mine = j == h->me && b0 == h->rank;
            struct hier_place at[3] = {
                PLACE(part.buf, part.off + (size_t)b0 * R),
                mine ? PLACE(WEFT_BUF_RECV, 0) : PLACE(WEFT_BUF_SCRATCH, q + (size_t)b0 * R),
                ALLOC,
            };
            WEFT_CHECK(hier_phase(h, SUB_RING, WEFT_COLL_REDUCE, lead, h->nn, j,
                                  (size_t)(b1 - b0) * R, at, HIER_KEEP_FINAL));
        }
        h->hint_ranks = NULL;
    }
    struct hier_place sc[3] = {PLACE(WEFT_BUF_SCRATCH, q), PLACE(WEFT_BUF_RECV, 0), ALLOC};
    return hier_phase(h, rhd ? SUB_SCATTER : SUB_SCATTER_NO_OWN, WEFT_COLL_REDUCE_SCATTER, node,
                      ln, 0, R, sc, HIER_KEEP_FINAL);
}

/* ---- allgather ------------------------------------------------------------------------
 * One node, or (ring) one rank per node: the flat ring.  Otherwise the
 * leader gathers its node's blocks into their places in its recvbuf, each
 * run of a node's blocks goes from that node's leader to the others along
 * the leaders' chain (ring: together a ring allgather with uneven blocks)
 * or down a binomial tree (rhd: log2(nodes) hops), and the leader
 * broadcasts the whole recvbuf along a chain through its node. */
static weft_status_t build_allgather(struct hier *h)
{
    size_t S = h->d->count;
    bool rhd = h->d->variant == WEFT_VAR_HIER_RHD;
    if (h->nn == 1 || (h->nn == h->p && !rhd))
        return build_flat(h);
    int ln;
    const int *node = node_ranks(h, h->me, &ln);
    struct hier_place ga[3] = {PLACE(WEFT_BUF_SEND, 0), PLACE(WEFT_BUF_RECV, 0), ALLOC};
    WEFT_CHECK(hier_phase(h, SUB_GATHER, WEFT_COLL_ALLGATHER, node, ln, 0, S, ga, 0));
    const int *lead = heads(h, -1);
    int b0 = 0, b1 = 0, j;
    h->hint_ranks = lead;
    h->hint_me = h->me;
    while (h->li == 0 && next_run(h, &b0, &b1, &j, false)) {
        struct hier_place at[3] = {PLACE(WEFT_BUF_RECV, (size_t)b0 * S),
                                   PLACE(WEFT_BUF_RECV, (size_t)b0 * S), ALLOC};
        WEFT_CHECK(hier_phase(h, rhd ? SUB_TREE : SUB_RING, WEFT_COLL_BROADCAST, lead, h->nn, j,
                              (size_t)(b1 - b0) * S, at, 0));
    }
    h->hint_ranks = NULL;
    struct hier_place bc[3] = {PLACE(WEFT_BUF_RECV, 0), PLACE(WEFT_BUF_RECV, 0), ALLOC};
    return hier_phase(h, SUB_RING, WEFT_COLL_BROADCAST, node, ln, 0, S * (size_t)h->p, bc, 0);
}

/* ---- broadcast and reduce -------------------------------------------------------------
 * The root stands for its node (no hop to the leader), the leaders for
 * theirs.  Broadcast: the heads' chain (ring) or binomial tree (rhd), then
 * a chain through each node from its head.  Reduce: a chain reduce in each
 * node to its head (the root's node: into the root's recvbuf), then the
 * heads' chain reduce to the root (ring), or their recursive doubling
 * allreduce with the root keeping the result (rhd: log2(nodes) exchanges;
 * the others end with it in scratch). */
static weft_status_t build_broadcast(struct hier *h)
{
    size_t n = h->d->count;
    int root = h->d->root, ln;
    const int *node = node_ranks(h, h->me, &ln);
    const int *hd = heads(h, root);
    int head = hd[h->me];
    bool is_root = h->rank == root;
    struct hier_place top[3] = {PLACE(WEFT_BUF_SEND, 0), PLACE(WEFT_BUF_RECV, 0), ALLOC};
    WEFT_CHECK(hier_phase(h, h->d->variant == WEFT_VAR_HIER_RHD ? SUB_TREE : SUB_RING,
                          WEFT_COLL_BROADCAST, hd, h->nn, h->nodeof[root], n, top, 0));
    struct hier_place in[3] = {PLACE(is_root ? WEFT_BUF_SEND : WEFT_BUF_RECV, 0),
                               PLACE(WEFT_BUF_RECV, 0), ALLOC};
    /* The root copied sendbuf to recvbuf among the heads already. */
    return hier_phase(h, SUB_RING, WEFT_COLL_BROADCAST, node, ln, index_in(node, ln, head), n,
                      in, HIER_DROP_COPY);
}

static weft_status_t build_reduce(struct hier *h)
{
    size_t n = h->d->count;
    int root = h->d->root, ln;
    bool rhd = h->d->variant == WEFT_VAR_HIER_RHD, is_root = h->rank == root;
    const int *node = node_ranks(h, h->me, &ln);
    const int *hd = heads(h, root);
    bool head = hd[h->me] == h->rank;
    /* The node's partial sum on its head: sendbuf itself when alone. */
    struct hier_place part = PLACE(WEFT_BUF_SEND, 0);
    if (head && ln > 1)
        part = is_root ? PLACE(WEFT_BUF_RECV, 0) : PLACE(WEFT_BUF_SCRATCH, scratch_alloc(h, n));
    struct hier_place red[3] = {PLACE(WEFT_BUF_SEND, 0), part, ALLOC};
    if (ln > 1)
        WEFT_CHECK(hier_phase(h, SUB_RING, WEFT_COLL_REDUCE, node, ln,
                              index_in(node, ln, hd[h->me]), n, red,
                              h->nn == 1 ? HIER_KEEP_FINAL : 0));
    struct hier_place res = PLACE(WEFT_BUF_RECV, 0);
    if (rhd && head && !is_root)
        res = PLACE(WEFT_BUF_SCRATCH, scratch_alloc(h, n));
    struct hier_place top[3] = {part, res, ALLOC};
    return hier_phase(h, rhd ? SUB_RD : SUB_RING, rhd ? WEFT_COLL_ALLREDUCE : WEFT_COLL_REDUCE, hd,
                      h->nn, h->nodeof[root], n, top, HIER_KEEP_FINAL);
}

/* ---- entry -------------------------------------------------------------------------- */

/* What hier needs beyond weft_sched_build's checks: room for its address
 * space (buffers plus up to two scratch copies of the whole vector) and a
 * usable node map. */
static weft_status_t hier_check(const struct weft_coll_desc *d)
{
    const char *name = weft_coll_name(d->coll);
    if ((d->coll == WEFT_COLL_REDUCE_SCATTER || d->coll == WEFT_COLL_ALLGATHER) &&
        d->count > SIZE_MAX / 4 / (size_t)d->nranks)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "hier %s: count %zu times %d ranks overflows size_t", name, d->count,
                          d->nranks);
    if (!d->node)
        return WEFT_OK;
    if (d->nnodes <= 0)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "hier %s: a node map with nnodes %d (must be at least 1)", name,
                          d->nnodes);
    for (int r = 0; r < d->nranks; r++)
        if (d->node[r] < 0 || d->node[r] >= d->nnodes)
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "hier %s: node[%d] = %d is outside [0, %d)", name, r, d->node[r],
                              d->nnodes);
    return WEFT_OK;
}

/* Numbers the nodes by their lowest rank and groups the ranks by node. */
static weft_status_t hier_nodes(struct hier *h)
{
    const struct weft_coll_desc *d = h->d;
    int p = h->p, nid = d->node ? d->nnodes : 1;
    int *map = malloc((size_t)nid * sizeof(int));
    h->nodeof = malloc((size_t)p * sizeof(int));
    h->start = calloc((size_t)p + 2, sizeof(int));
    h->members = malloc((size_t)p * sizeof(int));
    h->grp = malloc((size_t)p * sizeof(int));
    if (!map || !h->nodeof || !h->start || !h->members || !h->grp) {
        free(map);
        return nomem("the node map");
    }
    for (int k = 0; k < nid; k++)
        map[k] = -1;
    h->nn = 0;
    for (int r = 0; r < p; r++) {
        int id = d->node ? d->node[r] : 0;
        if (map[id] < 0)
            map[id] = h->nn++;
        h->nodeof[r] = map[id];
        h->start[map[id] + 1]++;
    }
    free(map);
    for (int j = 0; j < h->nn; j++)
        h->start[j + 1] += h->start[j];
    for (int j = 0; j < h->nn; j++)
        h->grp[j] = h->start[j]; /* fill position */
    for (int r = 0; r < p; r++) {
        int pos = h->grp[h->nodeof[r]]++;
        h->members[pos] = r;
        if (r == h->rank)
            h->li = pos - h->start[h->nodeof[r]];
    }
    h->me = h->nodeof[h->rank];
    return WEFT_OK;
}

static weft_status_t hier_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    WEFT_CHECK(hier_check(d));
    struct hier h = {.d = d, .s = s, .rank = d->rank, .p = d->nranks, .join_buf = -1};
    weft_sched_init(&h.sub);
    weft_status_t st = hier_nodes(&h);
    if (st != WEFT_OK)
        goto out;
    /* The in-place layout (weft.h): allgather's sendbuf is recvbuf + rank
     * count, reduce_scatter's recvbuf is sendbuf + rank count, the others'
     * are the same memory; scratch comes after. */
    size_t sc = weft_coll_send_count(d), rc = weft_coll_recv_count(d);
    size_t own = (size_t)d->rank * d->count;
    h.base[WEFT_BUF_SEND] = d->coll == WEFT_COLL_ALLGATHER ? own : 0;
    h.base[WEFT_BUF_RECV] = d->coll == WEFT_COLL_REDUCE_SCATTER ? own : 0;
    h.base[WEFT_BUF_SCRATCH] = WEFT_MAX(sc, rc);
    h.seg = malloc(16 * sizeof(*h.seg));
    if (!h.seg) {
        st = nomem("segments");
        goto out;
    }
    h.capseg = 16;
    h.nseg = 1;
    h.seg[0] = (struct hier_seg){.lo = 0, .w = -1, .nr = 0};
    switch (d->coll) {
    case WEFT_COLL_ALLREDUCE: st = build_allreduce(&h); break;
    case WEFT_COLL_REDUCE_SCATTER: st = build_reduce_scatter(&h); break;
    case WEFT_COLL_ALLGATHER: st = build_allgather(&h); break;
    case WEFT_COLL_BROADCAST: st = build_broadcast(&h); break;
    default: st = build_reduce(&h); break; /* the registry let only reduce on */
    }
out:
    free(h.nodeof);
    free(h.start);
    free(h.members);
    free(h.grp);
    free(h.seg);
    free(h.log);
    free(h.idx);
    free(h.dl);
    weft_sched_free(&h.sub);
    return st;
}

const struct weft_algo_desc weft_algo_hier = {
    .name = "hier",
    .variants = {[WEFT_VAR_HIER_RING] = "ring", [WEFT_VAR_HIER_RHD] = "rhd"},
    .serves = {[WEFT_VAR_HIER_RING] = WEFT_SERVES_ALL, [WEFT_VAR_HIER_RHD] = WEFT_SERVES_ALL},
    .build = hier_build,
};
