/*
 * direct.c - every pair at once: each rank talks to every other rank
 * itself, so a collective costs one round of latency (two for allreduce)
 * and p - 1 messages per rank and chunk; meant for small rank counts, any
 * p >= 1 and any count.
 *
 * Rank r sends to r+1, r+2, ..., r-1 and receives from r-1, r-2, ...,
 * r+1, in that order, chunk by chunk.  Sends wait for nothing but the
 * rank's own reductions, and every receive is posted whatever its peer
 * does, so no pair can wait on each other; the k-th message of a link is
 * the same chunk on both sides because both derive it from the same desc.
 */
#include <stdlib.h>

#include "algorithms/registry.h"

/* What one build works with; lives for one direct_build call. */
struct direct {
    struct weft_schedule *s;
    int rank, p;
    size_t chunk; /* elements per step, >= 1 */
};

/* The rank k places after this one (k < 0: before it). */
static int peer_at(const struct direct *g, int k)
{
    return ((g->rank + k) % g->p + g->p) % g->p;
}

static size_t chunks_of(const struct direct *g, size_t n)
{
    return n / g->chunk + (n % g->chunk != 0);
}

/* Elements in chunk c of a region of n elements (0 past its end). */
static size_t chunk_len(const struct direct *g, size_t n, size_t c)
{
    if (c >= chunks_of(g, n))
        return 0;
    return WEFT_MIN(g->chunk, n - c * g->chunk);
}

/* Appends one step; *idx (when not NULL) gets its index. */
static weft_status_t emit(struct direct *g, int kind, int flags, int buf, int src_buf, int peer,
                          size_t off, size_t src_off, size_t count, int32_t dep, int32_t *idx)
{
    return weft_sched_step(g->s, "direct", kind, flags, buf, src_buf, peer, off, src_off, count,
                           dep, idx);
}

static weft_status_t emit_send(struct direct *g, int buf, int peer, size_t off, size_t count,
                               int32_t dep, int32_t *idx)
{
    return emit(g, WEFT_STEP_SEND, 0, buf, buf, peer, off, 0, count, dep, idx);
}

static weft_status_t emit_recv(struct direct *g, int peer, size_t off, size_t count, int32_t dep)
{
    return emit(g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, peer, off, 0, count, dep,
                NULL);
}

/* recvbuf[dst_off..] = sendbuf[src_off..] (skipped when in place). */
static weft_status_t emit_copy(struct direct *g, size_t dst_off, size_t src_off, size_t count)
{
    if (count == 0)
        return WEFT_OK;
    return emit(g, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, WEFT_BUF_SEND, -1, dst_off, src_off, count,
                -1, NULL);
}

/* recvbuf[dst..+len) = sendbuf[src..+len) op what ranks r-1, r-2, ...,
 * r+1 send, folded in that order; the last fold is FINAL.  *last: its
 * index. */
static weft_status_t reduce_chain(struct direct *g, size_t dst, size_t src, size_t len,
                                  int32_t *last)
{
    int buf = WEFT_BUF_SEND;
    size_t off = src;
    int32_t prev = -1;
    for (int k = 1; k < g->p; k++) {
        int flags = k + 1 == g->p ? WEFT_STEP_FINAL : 0;
        WEFT_CHECK(emit(g, WEFT_STEP_RECV_REDUCE, flags, WEFT_BUF_RECV, buf, peer_at(g, -k), dst,
                        off, len, prev, &prev));
        buf = WEFT_BUF_RECV;
        off = dst;
    }
    *last = prev;
    return WEFT_OK;
}

/* ---- allreduce ----------------------------------------------------------------
 * N elements in p blocks; block b starts at b*(N/p) + min(b, N%p) and holds
 * N/p elements, one more when b < N%p.  Reduce-scatter: rank r sends block
 * j to rank j and folds the others' block r into its own.  Allgather: it
 * sends the finished block r to every rank and receives block j from rank
 * j into recvbuf, where in place it overwrites the block j it sent: that
 * receive waits for the send. */

static size_t block_off(const struct direct *g, size_t n, int b)
{
    size_t p = (size_t)g->p, ub = (size_t)b;
    return ub * (n / p) + WEFT_MIN(ub, n % p);
}

static size_t block_len(const struct direct *g, size_t n, int b)
{
    return n / (size_t)g->p + ((size_t)b < n % (size_t)g->p);
}

/* The first k >= k0 (below p, else p) whose peer r+k (dir 1) or r-k
 * (dir -1) holds one of the nb non-empty blocks 0..nb-1: with a count
 * below p the rest are empty, and walking past them one by one would
 * make a build O(p) whatever it emits. */
static int next_peer(const struct direct *g, int k0, int dir, size_t nb)
{
    if (nb == 0 || k0 >= g->p)
        return g->p;
    size_t j = (size_t)peer_at(g, dir * k0);
    if (j < nb)
        return k0;
    /* forward: wrap to block 0; backward: fall to block nb-1 */
    return k0 + (int)(dir > 0 ? (size_t)g->p - j : j - nb + 1);
}

static weft_status_t build_allreduce(struct direct *g, size_t n)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, n);
    size_t peers = (size_t)g->p - 1;
    size_t maxch = chunks_of(g, block_len(g, n, 0)); /* block 0 is a largest one */
    size_t own_off = block_off(g, n, g->rank), own_len = block_len(g, n, g->rank);
    /* sent[(k - 1) * maxch + c]: the send of chunk c of block r+k; then,
     * per chunk of the own block, its FINAL fold. */
    if (maxch > SIZE_MAX / sizeof(int32_t) / (peers + 1))
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "direct: %zu chunks per block", maxch);
    int32_t *sent = malloc(((peers + 1) * maxch + 1) * sizeof(int32_t));
    if (!sent)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "direct: cannot allocate %zu chunk marks",
                          (peers + 1) * maxch);
    int32_t *final = sent + peers * maxch;
    size_t nb = n / (size_t)g->p ? (size_t)g->p : n % (size_t)g->p; /* non-empty blocks */
    weft_status_t st = WEFT_OK;
    for (size_t c = 0; c < maxch; c++) {
        size_t co = c * g->chunk;
        for (int k = next_peer(g, 1, 1, nb); k < g->p; k = next_peer(g, k + 1, 1, nb)) {
            int j = peer_at(g, k);
            size_t len = chunk_len(g, block_len(g, n, j), c);
            if (len)
                WEFT_CHECK_GOTO(emit_send(g, WEFT_BUF_SEND, j, block_off(g, n, j) + co, len, -1,
                                          &sent[(size_t)(k - 1) * maxch + c]),
                                st, out);
        }
        size_t len = chunk_len(g, own_len, c);
        if (len)
            WEFT_CHECK_GOTO(reduce_chain(g, own_off + co, own_off + co, len, &final[c]), st, out);
    }
    for (size_t c = 0; c < maxch; c++) {
        size_t co = c * g->chunk, len = chunk_len(g, own_len, c);
        for (int k = 1; k < g->p && len; k++)
            WEFT_CHECK_GOTO(emit_send(g, WEFT_BUF_RECV, peer_at(g, k), own_off + co, len,
                                      final[c], NULL),
                            st, out);
        for (int k = next_peer(g, 1, -1, nb); k < g->p; k = next_peer(g, k + 1, -1, nb)) {
            int j = peer_at(g, -k);
            size_t jlen = chunk_len(g, block_len(g, n, j), c);
            /* block j went to rank j as the send to r + (p - k) */
            if (jlen)
                WEFT_CHECK_GOTO(emit_recv(g, j, block_off(g, n, j) + co, jlen,
                                          sent[(size_t)(g->p - k - 1) * maxch + c]),
                                st, out);
        }
    }
out:
    free(sent);
    return st;
}

/* ---- reduce_scatter ------------------------------------------------------------
 * Input p*R, block j = [j*R, (j+1)*R): block j goes to rank j; the blocks r
 * of the others are folded into the own one, straight in recvbuf.  In
 * place recvbuf is sendbuf's block r, which no send reads. */
static weft_status_t build_reduce_scatter(struct direct *g, size_t r)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, r);
    size_t own = (size_t)g->rank * r;
    for (size_t c = 0; c < chunks_of(g, r); c++) {
        size_t co = c * g->chunk, len = chunk_len(g, r, c);
        for (int k = 1; k < g->p; k++) {
            int j = peer_at(g, k);
            WEFT_CHECK(emit_send(g, WEFT_BUF_SEND, j, (size_t)j * r + co, len, -1, NULL));
        }
        int32_t last;
        WEFT_CHECK(reduce_chain(g, co, own + co, len, &last));
    }
    return WEFT_OK;
}

/* ---- allgather -------------------------------------------------------------------
 * Output p*S: the own block goes to everyone, block j arrives from rank j;
 * the local copy comes last so that the network starts first. */
static weft_status_t build_allgather(struct direct *g, size_t sc)
{
    for (size_t c = 0; c < chunks_of(g, sc) && g->p > 1; c++) {
        size_t co = c * g->chunk, len = chunk_len(g, sc, c);
        for (int k = 1; k < g->p; k++)
            WEFT_CHECK(emit_send(g, WEFT_BUF_SEND, peer_at(g, k), co, len, -1, NULL));
        for (int k = 1; k < g->p; k++) {
            int j = peer_at(g, -k);
            WEFT_CHECK(emit_recv(g, j, (size_t)j * sc + co, len, -1));
        }
    }
    return emit_copy(g, (size_t)g->rank * sc, 0, sc);
}

/* ---- broadcast and reduce ---------------------------------------------------------
 * Broadcast: the root sends every chunk to root+1, root+2, ...; the others
 * receive.  Reduce: the others send their input; the root folds chunk c
 * from root-1, root-2, ... into recvbuf. */
static weft_status_t build_broadcast(struct direct *g, size_t n, int root)
{
    for (size_t c = 0; c < chunks_of(g, n) && g->p > 1; c++) {
        size_t co = c * g->chunk, len = chunk_len(g, n, c);
        if (g->rank != root) {
            WEFT_CHECK(emit_recv(g, root, co, len, -1));
            continue;
        }
        for (int k = 1; k < g->p; k++)
            WEFT_CHECK(emit_send(g, WEFT_BUF_SEND, peer_at(g, k), co, len, -1, NULL));
    }
    return g->rank == root ? emit_copy(g, 0, 0, n) : WEFT_OK;
}

static weft_status_t build_reduce(struct direct *g, size_t n, int root)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, n);
    for (size_t c = 0; c < chunks_of(g, n); c++) {
        size_t co = c * g->chunk, len = chunk_len(g, n, c);
        int32_t last;
        if (g->rank != root)
            WEFT_CHECK(emit_send(g, WEFT_BUF_SEND, root, co, len, -1, NULL));
        else
            WEFT_CHECK(reduce_chain(g, co, co, len, &last));
    }
    return WEFT_OK;
}

static weft_status_t direct_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    struct direct g = {.s = s, .rank = d->rank, .p = d->nranks, .chunk = d->chunk};
    switch (d->coll) {
    case WEFT_COLL_ALLREDUCE: return build_allreduce(&g, d->count);
    case WEFT_COLL_REDUCE_SCATTER: return build_reduce_scatter(&g, d->count);
    case WEFT_COLL_ALLGATHER: return build_allgather(&g, d->count);
    case WEFT_COLL_BROADCAST: return build_broadcast(&g, d->count, d->root);
    default: return build_reduce(&g, d->count, d->root); /* the registry let only reduce on */
    }
}

const struct weft_algo_desc weft_algo_direct = {
    .name = "direct",
    .serves = {WEFT_SERVES_ALL},
    .build = direct_build,
};
