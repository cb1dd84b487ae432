/*
 * tree.c - tree schedules, pipelined in chunks, any p >= 1 and any count.
 * WEFT_VAR_TREE_DOUBLE: allreduce, reduce and broadcast over two
 * complementary binary trees, each carrying half of the vector.
 * WEFT_VAR_TREE_BINOMIAL: broadcast and reduce over one binomial tree.
 */
#include <stdlib.h>

#include "algorithms/registry.h"

/* Appends one step; *idx (when not NULL) gets its index. */
static weft_status_t emit(struct weft_schedule *s, int kind, int flags, int buf, int src_buf,
                          int peer, size_t off, size_t src_off, size_t count, int32_t dep,
                          int32_t *idx)
{
    return weft_sched_step(s, "tree", kind, flags, buf, src_buf, peer, off, src_off, count, dep,
                           idx);
}

static weft_status_t emit_send(struct weft_schedule *s, int buf, int peer, size_t off,
                               size_t count, int32_t dep, int32_t *idx)
{
    return emit(s, WEFT_STEP_SEND, 0, buf, buf, peer, off, 0, count, dep, idx);
}

/* The root's own input lands in its recvbuf (skipped when in place). */
static weft_status_t emit_copy(struct weft_schedule *s, size_t count)
{
    if (count == 0)
        return WEFT_OK;
    return emit(s, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, WEFT_BUF_SEND, -1, 0, 0, count, -1, NULL);
}

/* ---- binomial tree -------------------------------------------------------------
 * With v = (rank - root) mod p, rank v hangs below v - lowbit(v); its
 * children are v + m for every power of two m below lowbit(v) (the root:
 * below p) while v + m < p.  ceil(log2 p) hops instead of the chain's
 * p - 1: it wins while a message costs more than its bytes. */

struct binomial {
    int v, parent; /* parent: a rank, -1 at the root */
    int reach;     /* lowbit(v); the root: the power of two at or above p */
};

static struct binomial binomial_of(const struct weft_coll_desc *d)
{
    int p = d->nranks;
    struct binomial b = {.v = (d->rank - d->root + p) % p, .reach = 1};
    while (b.reach < p)
        b.reach <<= 1;
    if (b.v != 0)
        b.reach = b.v & -b.v;
    b.parent = b.v == 0 ? -1 : (b.v - b.reach + d->root) % p;
    return b;
}

/* Broadcast: each chunk goes to the children largest subtree first, so
 * the deepest one starts earliest. */
static weft_status_t binomial_broadcast(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    int p = d->nranks;
    struct binomial b = binomial_of(d);
    size_t n = d->count, nch = (n + d->chunk - 1) / d->chunk;
    for (size_t c = 0; c < nch && p > 1; c++) {
        size_t off = c * d->chunk, len = WEFT_MIN(d->chunk, n - off);
        int32_t got = -1;
        int buf = b.v == 0 ? WEFT_BUF_SEND : WEFT_BUF_RECV;
        if (b.v != 0)
            WEFT_CHECK(emit(s, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, b.parent, off, 0,
                            len, -1, &got));
        for (int m = b.reach >> 1; m >= 1; m >>= 1)
            if (b.v + m < p)
                WEFT_CHECK(emit_send(s, buf, (b.v + m + d->root) % p, off, len, got, NULL));
    }
    if (b.v == 0)
        WEFT_CHECK(emit_copy(s, n));
    return WEFT_OK;
}

/* Reduce, the broadcast run backwards: chunk by chunk, a rank folds its
 * children's partial sums into its input smallest subtree first (those
 * arrive first), in scratch below the root and in recvbuf, with FINAL, at
 * the root, and passes the sum up. */
static weft_status_t binomial_reduce(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    int p = d->nranks;
    if (p == 1)
        return emit_copy(s, d->count);
    struct binomial b = binomial_of(d);
    int nkids = 0;
    for (int m = 1; m < b.reach && b.v + m < p; m <<= 1)
        nkids++;
    int acc = b.v == 0 ? WEFT_BUF_RECV : WEFT_BUF_SCRATCH;
    if (b.v != 0 && nkids > 0)
        s->scratch_count = d->count;
    size_t n = d->count, nch = (n + d->chunk - 1) / d->chunk;
    for (size_t c = 0; c < nch; c++) {
        size_t off = c * d->chunk, len = WEFT_MIN(d->chunk, n - off);
        int src = WEFT_BUF_SEND;
        int32_t prev = -1;
        for (int k = 0; k < nkids; k++) {
            int flags = b.v == 0 && k + 1 == nkids ? WEFT_STEP_FINAL : 0;
            WEFT_CHECK(emit(s, WEFT_STEP_RECV_REDUCE, flags, acc, src,
                            (b.v + (1 << k) + d->root) % p, off, off, len, prev, &prev));
            src = acc;
        }
        if (b.v != 0)
            WEFT_CHECK(emit_send(s, src, b.parent, off, len, prev, NULL));
    }
    return WEFT_OK;
}

/* ---- double binary tree ----------------------------------------------------------
 * Tree 0 is the in-order binary tree over keys 1..n: the root of a key
 * range is the key in it with the most trailing zero bits, its children
 * the roots of the ranges on either side.  Odd keys are leaves, even keys
 * interior; the depth is floor(log2 n) + 1 = ceil(log2(n + 1)).  Node i
 * (0 <= i < n) has key i + 1 in tree 0, so odd nodes are its interior.
 * Tree 1 is the same tree over other keys: n - i (mirrored) when n is
 * even, i shifted by one (node 0 takes key n) when n is odd; either way
 * its interior is the even nodes (n odd: but node 0, a leaf).  So every
 * node is interior in at most one tree and forwards half of the data; a
 * leaf of both only sends its input and receives the result.
 *
 * Allreduce runs the trees over all p ranks (node i is rank i); each
 * tree's root makes the FINAL reduction of its half and broadcasts it, and
 * the two roots differ.  Reduce and broadcast run them over the p - 1
 * ranks other than the root (node i is rank root + 1 + i), the root above
 * both trees' roots, so that the whole vector meets there. */

/* One rank's place in one tree: ranks, -1 for none. */
struct tree_node {
    int parent;
    int child[2];
};

/* The key in [lo, hi] (1 <= lo <= hi) with the most trailing zero bits. */
static int range_root(int lo, int hi)
{
    int b = 1;
    while (b <= hi / 2)
        b <<= 1;
    while (hi / b * b < lo)
        b >>= 1;
    return hi / b * b;
}

/* Keys of the parent and children of key k in the in-order tree over 1..n;
 * 0 for none. */
static void inorder_links(int n, int k, int *parent, int child[2])
{
    int lo = 1, hi = n, up = 0;
    for (int r = range_root(lo, hi); r != k; r = range_root(lo, hi)) {
        up = r;
        if (k < r)
            hi = r - 1;
        else
            lo = r + 1;
    }
    *parent = up;
    child[0] = k > lo ? range_root(lo, k - 1) : 0;
    child[1] = k < hi ? range_root(k + 1, hi) : 0;
}

static int key_of(int t, int n, int i)
{
    if (t == 0)
        return i + 1;
    return n % 2 == 0 ? n - i : (i + n - 1) % n + 1;
}

static int node_of(int t, int n, int key)
{
    if (t == 0)
        return key - 1;
    return n % 2 == 0 ? n - key : key % n;
}

/* This rank's place in tree t, nodes numbered as the comment above says;
 * rooted: d->root is the parent of the tree's root. */
static struct tree_node dbt_node(const struct weft_coll_desc *d, bool rooted, int t)
{
    int p = d->nranks, n = rooted ? p - 1 : p, base = rooted ? d->root + 1 : 0;
    struct tree_node nd = {-1, {-1, -1}};
    if (rooted && d->rank == d->root) {
        if (n > 0)
            nd.child[0] = (base + node_of(t, n, range_root(1, n))) % p;
        return nd;
    }
    int i = (d->rank - base + p) % p, up, kids[2];
    inorder_links(n, key_of(t, n, i), &up, kids);
    nd.parent = up ? (base + node_of(t, n, up)) % p : rooted ? d->root : -1;
    for (int k = 0; k < 2; k++)
        if (kids[k])
            nd.child[k] = (base + node_of(t, n, kids[k])) % p;
    return nd;
}

/* What one double tree build works with; lives for one call. */
struct dbt {
    struct weft_schedule *s;
    size_t chunk;
    struct tree_node node[2];
    size_t off[2], len[2]; /* the half of the vector tree t carries */
    size_t nch[2];         /* chunks of each half */
    int acc[2];            /* where a forwarding rank builds its partial sums */
    size_t acc_off[2];     /* acc offset of the half's first element */
};

static size_t dbt_chunk_off(const struct dbt *g, int t, size_t c)
{
    return g->off[t] + c * g->chunk;
}

static size_t dbt_chunk_len(const struct dbt *g, int t, size_t c)
{
    return WEFT_MIN(g->chunk, g->len[t] - c * g->chunk);
}

/* Chunk c of tree t on its way up: the children's partial sums folded into
 * this rank's input, then sent to the parent; at the root the last fold is
 * FINAL and lands in recvbuf.  *last: the step that sends (the root: that
 * reduces) last. */
static weft_status_t dbt_up(struct dbt *g, int t, size_t c, int32_t *last)
{
    const struct tree_node *nd = &g->node[t];
    size_t off = dbt_chunk_off(g, t, c), len = dbt_chunk_len(g, t, c);
    bool root = nd->parent < 0;
    int acc = root ? WEFT_BUF_RECV : g->acc[t];
    size_t aoff = root ? off : g->acc_off[t] + (off - g->off[t]);
    int src = WEFT_BUF_SEND;
    size_t soff = off;
    int32_t prev = -1;
    for (int k = 0; k < 2; k++) {
        if (nd->child[k] < 0)
            continue;
        bool final = root && (k == 1 || nd->child[1] < 0);
        WEFT_CHECK(emit(g->s, WEFT_STEP_RECV_REDUCE, final ? WEFT_STEP_FINAL : 0, acc, src,
                        nd->child[k], aoff, soff, len, prev, &prev));
        src = acc;
        soff = aoff;
    }
    if (!root)
        WEFT_CHECK(emit_send(g->s, src, nd->parent, soff, len, prev, &prev));
    *last = prev;
    return WEFT_OK;
}

/* Chunk c of tree t on its way down: received from the parent into
 * recvbuf once dep (the send up that read that memory) is done, passed to
 * the children.  The root sends from src, after dep. */
static weft_status_t dbt_down(struct dbt *g, int t, size_t c, int src, int32_t dep)
{
    const struct tree_node *nd = &g->node[t];
    size_t off = dbt_chunk_off(g, t, c), len = dbt_chunk_len(g, t, c);
    int32_t got = dep;
    if (nd->parent >= 0) {
        WEFT_CHECK(emit(g->s, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, nd->parent, off, 0,
                        len, dep, &got));
        src = WEFT_BUF_RECV;
    }
    for (int k = 0; k < 2; k++)
        if (nd->child[k] >= 0)
            WEFT_CHECK(emit_send(g->s, src, nd->child[k], off, len, got, NULL));
    return WEFT_OK;
}

/* Chunks go tree 0, tree 1, tree 0, ... on every rank, and in allreduce
 * every chunk up before any chunk down: two ranks linked in both trees
 * then order their messages alike, and on a link the sends up (a leaf's,
 * free to go) never wait behind sends down. */
static weft_status_t dbt_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    int p = d->nranks;
    if (p == 1)
        return emit_copy(s, d->count);
    bool rooted = d->coll != WEFT_COLL_ALLREDUCE;
    struct dbt g = {.s = s, .chunk = d->chunk};
    g.len[0] = d->count - d->count / 2;
    g.len[1] = d->count / 2;
    g.off[1] = g.len[0];
    for (int t = 0; t < 2; t++) {
        g.node[t] = dbt_node(d, rooted, t);
        g.nch[t] = (g.len[t] + d->chunk - 1) / d->chunk;
        /* Allreduce builds partial sums where the result goes; reduce, in
         * scratch, one half after the other (recvbuf is the root's only). */
        bool forwards = g.node[t].parent >= 0 && g.node[t].child[0] >= 0;
        g.acc[t] = rooted ? WEFT_BUF_SCRATCH : WEFT_BUF_RECV;
        g.acc_off[t] = rooted ? s->scratch_count : g.off[t];
        if (rooted && forwards)
            s->scratch_count += g.len[t];
    }
    if (d->coll == WEFT_COLL_BROADCAST) {
        for (size_t c = 0; c < g.nch[0]; c++)
            for (int t = 0; t < 2; t++)
                if (c < g.nch[t])
                    WEFT_CHECK(dbt_down(&g, t, c, WEFT_BUF_SEND, -1));
        return d->rank == d->root ? emit_copy(s, d->count) : WEFT_OK;
    }
    int32_t *last = malloc((g.nch[0] + g.nch[1] + 1) * sizeof(*last));
    if (!last)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "tree: cannot allocate %zu chunk marks",
                          g.nch[0] + g.nch[1]);
    int32_t *mark[2] = {last, last + g.nch[0]};
    weft_status_t st = WEFT_OK;
    for (size_t c = 0; c < g.nch[0]; c++)
        for (int t = 0; t < 2; t++)
            if (c < g.nch[t])
                WEFT_CHECK_GOTO(dbt_up(&g, t, c, &mark[t][c]), st, out);
    for (size_t c = 0; !rooted && c < g.nch[0]; c++)
        for (int t = 0; t < 2; t++)
            if (c < g.nch[t])
                WEFT_CHECK_GOTO(dbt_down(&g, t, c, WEFT_BUF_RECV, mark[t][c]), st, out);
out:
    free(last);
    return st;
}

static weft_status_t tree_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    if (d->variant == WEFT_VAR_TREE_DOUBLE)
        return dbt_build(d, s);
    if (d->coll == WEFT_COLL_BROADCAST)
        return binomial_broadcast(d, s);
    return binomial_reduce(d, s);
}

const struct weft_algo_desc weft_algo_tree = {
    .name = "tree",
    .variants = {[WEFT_VAR_TREE_DOUBLE] = "double", [WEFT_VAR_TREE_BINOMIAL] = "binomial"},
    .serves = {[WEFT_VAR_TREE_DOUBLE] =
                   WEFT_SERVES(ALLREDUCE) | WEFT_SERVES(BROADCAST) | WEFT_SERVES(REDUCE),
               [WEFT_VAR_TREE_BINOMIAL] = WEFT_SERVES(BROADCAST) | WEFT_SERVES(REDUCE)},
    .build = tree_build,
};
