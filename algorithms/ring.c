/*
 * ring.c - ring schedules: allreduce as reduce-scatter then allgather,
 * reduce_scatter, allgather, and pipelined chains for broadcast and reduce.
 *
 * Every rank sends only to its right neighbour (rank + 1) and receives only
 * from its left one, so the k-th send on one side meets the k-th receive on
 * the other as long as both emit rounds in the same order and, inside a
 * round, chunks in the same order.  Both sides derive block and chunk sizes
 * from the same desc, so they agree without talking; empty blocks or chunks
 * emit nothing on either side.
 *
 * Steps are emitted round by round and, inside a round, chunk by chunk;
 * chunk c of round k+1 depends only on chunk c of round k, so the engine can
 * keep several chunks of several rounds in flight.  Dependencies cover every
 * same-rank hazard (read after write, write after read), including those
 * that only exist when sendbuf and recvbuf are the same memory, so an engine
 * may run any step whose deps are complete.
 *
 * With desc->ordered (deterministic mode) the reducing collectives run
 * chains in rank order instead (see "ordered" below), which fix the order
 * every element is combined in.
 */
#include "algorithms/registry.h"

#include <stdlib.h>

/* What one build works with; lives for one ring_build call. */
struct ring {
    struct weft_schedule *s;
    int rank, p;
    int left, right;
    size_t chunk; /* elements per step, >= 1 */
};

static int ring_mod(const struct ring *g, long long x)
{
    long long m = x % g->p;
    return (int)(m < 0 ? m + g->p : m);
}

static size_t chunks_of(const struct ring *g, size_t n)
{
    return n / g->chunk + (n % g->chunk != 0);
}

/* Elements in chunk c of a region of n elements (0 past its end). */
static size_t chunk_len(const struct ring *g, size_t n, size_t c)
{
    size_t start = c * g->chunk;
    if (c >= chunks_of(g, n))
        return 0;
    return WEFT_MIN(g->chunk, n - start);
}

/* Appends one step; *idx (when not NULL) gets its index. */
static weft_status_t emit(struct ring *g, int kind, int flags, int buf, int src_buf, int peer,
                          size_t off, size_t src_off, size_t count, int32_t dep, int32_t *idx)
{
    return weft_sched_step(g->s, "ring", kind, flags, buf, src_buf, peer, off, src_off, count,
                           dep, idx);
}

static weft_status_t emit_send(struct ring *g, int buf, size_t off, size_t count, int32_t dep,
                               int32_t *idx)
{
    return emit(g, WEFT_STEP_SEND, 0, buf, buf, g->right, off, 0, count, dep, idx);
}

static weft_status_t emit_copy(struct ring *g, size_t dst_off, size_t src_off, size_t count)
{
    if (count == 0)
        return WEFT_OK;
    return emit(g, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, WEFT_BUF_SEND, -1, dst_off, src_off, count, -1,
                NULL);
}

/* Two per-chunk index arrays: the receive of chunk c in the previous round
 * (what the next send of chunk c depends on) and in the current one. */
struct chunk_marks {
    int32_t *prev, *cur;
};

static weft_status_t marks_alloc(struct chunk_marks *m, size_t nchunks)
{
    size_t n = nchunks ? nchunks : 1;
    m->prev = malloc(n * sizeof(int32_t));
    m->cur = malloc(n * sizeof(int32_t));
    if (!m->prev || !m->cur) {
        free(m->prev);
        free(m->cur);
        m->prev = m->cur = NULL;
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "ring: cannot allocate %zu chunk marks",
                          nchunks);
    }
    return WEFT_OK;
}

static void marks_swap(struct chunk_marks *m)
{
    int32_t *t = m->prev;
    m->prev = m->cur;
    m->cur = t;
}

static void marks_free(struct chunk_marks *m)
{
    free(m->prev);
    free(m->cur);
}

/* ---- allreduce ---------------------------------------------------------------
 * N elements in p blocks; block b starts at b*(N/p) + min(b, N%p) and holds
 * N/p elements, one more when b < N%p.
 *
 * Reduce-scatter, rounds k = 0..p-2: send block (rank-k) to the right (from
 * sendbuf in round 0, later the partial sum in recvbuf), receive block
 * (rank-k-1) from the left and reduce: recv[t] = send[t] op incoming.  The
 * last round's reductions complete block (rank+1) and carry FINAL.
 * Allgather, rounds k = 0..p-2: send block (rank+1-k) from recvbuf (the one
 * completed or received just before), receive block (rank-k) into recvbuf.
 * The allgather receive of round k overwrites the block the reduce-scatter
 * sent in round k (and, in place, round 0's block is sendbuf's), so it
 * depends on that send. */

static size_t ar_block_off(const struct ring *g, size_t n, int b)
{
    size_t p = (size_t)g->p, ub = (size_t)b;
    return ub * (n / p) + WEFT_MIN(ub, n % p);
}

static size_t ar_block_len(const struct ring *g, size_t n, int b)
{
    size_t p = (size_t)g->p;
    return n / p + ((size_t)b < n % p);
}

/* The first round k >= k0 whose block (c - k) mod p is one of the nb
 * non-empty ones (blocks 0..nb-1: a count below p leaves the rest empty),
 * or SIZE_MAX.  Skipping rounds with nothing to move keeps a build
 * O(steps) instead of O(p): the dependencies a skipped round would have
 * left are never read, since a block's send follows its receive in the
 * round just before. */
static size_t next_round(const struct ring *g, long long c, size_t k0, size_t nb)
{
    if (nb == 0)
        return SIZE_MAX;
    size_t b = (size_t)ring_mod(g, c - (long long)k0);
    return b < nb ? k0 : k0 + (b - nb + 1);
}

/* The first round k >= k0 that sends block (c - k) or receives (c - k - 1). */
static size_t next_busy(const struct ring *g, long long c, size_t k0, size_t nb)
{
    return WEFT_MIN(next_round(g, c, k0, nb), next_round(g, c - 1, k0, nb));
}

static weft_status_t build_allreduce(struct ring *g, size_t n)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, n);

    size_t rounds = (size_t)g->p - 1;
    size_t maxch = chunks_of(g, ar_block_len(g, n, 0)); /* block 0 is a largest one */
    struct chunk_marks m;
    WEFT_CHECK(marks_alloc(&m, maxch));
    int32_t *rs_send = NULL;
    weft_status_t st = WEFT_OK;
    if (maxch > SIZE_MAX / sizeof(int32_t) / rounds ||
        !(rs_send = malloc((maxch ? maxch : 1) * rounds * sizeof(int32_t)))) {
        st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "ring: cannot allocate %zu x %zu send marks",
                        rounds, maxch);
        goto out;
    }

    size_t nb = n / (size_t)g->p ? (size_t)g->p : n % (size_t)g->p; /* non-empty blocks */
    for (size_t k = next_busy(g, g->rank, 0, nb); k < rounds;
         k = next_busy(g, g->rank, k + 1, nb)) {
        int sb = ring_mod(g, (long long)g->rank - (long long)k);
        int tb = ring_mod(g, (long long)g->rank - (long long)k - 1);
        size_t slen = ar_block_len(g, n, sb), soff = ar_block_off(g, n, sb);
        size_t tlen = ar_block_len(g, n, tb), toff = ar_block_off(g, n, tb);
        size_t nch = WEFT_MAX(chunks_of(g, slen), chunks_of(g, tlen));
        int flags = k + 1 == rounds ? WEFT_STEP_FINAL : 0;
        for (size_t c = 0; c < nch; c++) {
            size_t sc = chunk_len(g, slen, c), tc = chunk_len(g, tlen, c);
            size_t co = c * g->chunk;
            if (sc) {
                int buf = k == 0 ? WEFT_BUF_SEND : WEFT_BUF_RECV;
                WEFT_CHECK_GOTO(emit_send(g, buf, soff + co, sc, k == 0 ? -1 : m.prev[c],
                                          &rs_send[k * maxch + c]),
                                st, out);
            }
            if (tc)
                WEFT_CHECK_GOTO(emit(g, WEFT_STEP_RECV_REDUCE, flags, WEFT_BUF_RECV, WEFT_BUF_SEND,
                                     g->left, toff + co, toff + co, tc, -1, &m.cur[c]),
                                st, out);
        }
        marks_swap(&m);
    }

    for (size_t k = next_busy(g, (long long)g->rank + 1, 0, nb); k < rounds;
         k = next_busy(g, (long long)g->rank + 1, k + 1, nb)) {
        int sb = ring_mod(g, (long long)g->rank + 1 - (long long)k);
        int tb = ring_mod(g, (long long)g->rank - (long long)k);
        size_t slen = ar_block_len(g, n, sb), soff = ar_block_off(g, n, sb);
        size_t tlen = ar_block_len(g, n, tb), toff = ar_block_off(g, n, tb);
        size_t nch = WEFT_MAX(chunks_of(g, slen), chunks_of(g, tlen));
        for (size_t c = 0; c < nch; c++) {
            size_t sc = chunk_len(g, slen, c), tc = chunk_len(g, tlen, c);
            size_t co = c * g->chunk;
            if (sc)
                WEFT_CHECK_GOTO(emit_send(g, WEFT_BUF_RECV, soff + co, sc, m.prev[c], NULL), st,
                                out);
            if (tc)
                WEFT_CHECK_GOTO(emit(g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, g->left,
                                     toff + co, 0, tc, rs_send[k * maxch + c], &m.cur[c]),
                                st, out);
        }
        marks_swap(&m);
    }
out:
    free(rs_send);
    marks_free(&m);
    return st;
}

/* ---- reduce_scatter ------------------------------------------------------------
 * Input p*R, block b = [b*R, (b+1)*R).  Rounds k = 0..p-2: send block
 * (rank-k-1) (round 0 from sendbuf, later the partial sum in scratch),
 * receive block (rank-k-2) and reduce it into scratch[block], except in the
 * last round: that block is the rank's own, reduced straight into recvbuf
 * with FINAL.  Scratch is indexed like sendbuf (p*R elements). */
static weft_status_t build_reduce_scatter(struct ring *g, size_t r)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, r);

    size_t rounds = (size_t)g->p - 1;
    size_t nch = chunks_of(g, r);
    struct chunk_marks m;
    WEFT_CHECK(marks_alloc(&m, nch));
    weft_status_t st = WEFT_OK;
    g->s->scratch_count = r * (size_t)g->p; /* weft_sched_build checked the product */

    for (size_t k = 0; k < rounds; k++) {
        size_t sb = (size_t)ring_mod(g, (long long)g->rank - (long long)k - 1);
        size_t tb = (size_t)ring_mod(g, (long long)g->rank - (long long)k - 2);
        bool last = k + 1 == rounds;
        for (size_t c = 0; c < nch; c++) {
            size_t len = chunk_len(g, r, c), co = c * g->chunk;
            int sbuf = k == 0 ? WEFT_BUF_SEND : WEFT_BUF_SCRATCH;
            WEFT_CHECK_GOTO(emit_send(g, sbuf, sb * r + co, len, k == 0 ? -1 : m.prev[c], NULL),
                            st, out);
            WEFT_CHECK_GOTO(emit(g, WEFT_STEP_RECV_REDUCE, last ? WEFT_STEP_FINAL : 0,
                                 last ? WEFT_BUF_RECV : WEFT_BUF_SCRATCH, WEFT_BUF_SEND, g->left,
                                 last ? co : tb * r + co, tb * r + co, len, -1, &m.cur[c]),
                            st, out);
        }
        marks_swap(&m);
    }
out:
    marks_free(&m);
    return st;
}

/* ---- allgather -------------------------------------------------------------------
 * Output p*S.  Rounds k = 0..p-2: send block (rank-k) (round 0 straight from
 * sendbuf, later the block received the round before), receive block
 * (rank-k-1) into recvbuf.  The local copy into recv[rank] comes last so
 * that the engine can start the network first; in place it is skipped. */
static weft_status_t build_allgather(struct ring *g, size_t sc)
{
    size_t rounds = (size_t)g->p - 1;
    size_t nch = chunks_of(g, sc);
    struct chunk_marks m;
    WEFT_CHECK(marks_alloc(&m, nch));
    weft_status_t st = WEFT_OK;

    for (size_t k = 0; k < rounds; k++) {
        size_t sb = (size_t)ring_mod(g, (long long)g->rank - (long long)k);
        size_t tb = (size_t)ring_mod(g, (long long)g->rank - (long long)k - 1);
        for (size_t c = 0; c < nch; c++) {
            size_t len = chunk_len(g, sc, c), co = c * g->chunk;
            if (k == 0)
                WEFT_CHECK_GOTO(emit_send(g, WEFT_BUF_SEND, co, len, -1, NULL), st, out);
            else
                WEFT_CHECK_GOTO(emit_send(g, WEFT_BUF_RECV, sb * sc + co, len, m.prev[c], NULL),
                                st, out);
            WEFT_CHECK_GOTO(emit(g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, g->left,
                                 tb * sc + co, 0, len, -1, &m.cur[c]),
                            st, out);
        }
        marks_swap(&m);
    }
    WEFT_CHECK_GOTO(emit_copy(g, (size_t)g->rank * sc, 0, sc), st, out);
out:
    marks_free(&m);
    return st;
}

/* ---- broadcast -------------------------------------------------------------------
 * A chain root -> root+1 -> ... -> root-1, chunk by chunk: the root sends
 * from sendbuf (then copies it into its recvbuf), middle ranks receive a
 * chunk and pass it on, the last rank only receives. */
static weft_status_t build_broadcast(struct ring *g, size_t n, int root)
{
    int dist = ring_mod(g, (long long)g->rank - root);
    size_t nch = chunks_of(g, n);
    for (size_t c = 0; c < nch && g->p > 1; c++) {
        size_t len = chunk_len(g, n, c), co = c * g->chunk;
        int32_t got = -1;
        if (dist == 0) {
            WEFT_CHECK(emit_send(g, WEFT_BUF_SEND, co, len, -1, NULL));
            continue;
        }
        WEFT_CHECK(emit(g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, g->left, co, 0, len, -1,
                        &got));
        if (dist < g->p - 1)
            WEFT_CHECK(emit_send(g, WEFT_BUF_RECV, co, len, got, NULL));
    }
    if (dist == 0)
        WEFT_CHECK(emit_copy(g, 0, 0, n));
    return WEFT_OK;
}

/* ---- reduce ------------------------------------------------------------------------
 * A chain root+1 -> root+2 -> ... -> root, chunk by chunk: the first rank
 * sends its input, middle ranks reduce what arrives with their input into
 * scratch and pass it on, the root reduces into recvbuf with FINAL.
 * recvbuf is touched on the root only. */
static weft_status_t build_reduce(struct ring *g, size_t n, int root)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, n);

    int dist = ring_mod(g, (long long)g->rank - root - 1); /* 0: first, p-1: root */
    bool middle = dist > 0 && dist < g->p - 1;
    size_t nch = chunks_of(g, n);
    if (middle)
        g->s->scratch_count = n;
    for (size_t c = 0; c < nch; c++) {
        size_t len = chunk_len(g, n, c), co = c * g->chunk;
        int32_t got = -1;
        if (dist == 0) {
            WEFT_CHECK(emit_send(g, WEFT_BUF_SEND, co, len, -1, NULL));
        } else if (middle) {
            WEFT_CHECK(emit(g, WEFT_STEP_RECV_REDUCE, 0, WEFT_BUF_SCRATCH, WEFT_BUF_SEND, g->left,
                            co, co, len, -1, &got));
            WEFT_CHECK(emit_send(g, WEFT_BUF_SCRATCH, co, len, got, NULL));
        } else {
            WEFT_CHECK(emit(g, WEFT_STEP_RECV_REDUCE, WEFT_STEP_FINAL, WEFT_BUF_RECV, WEFT_BUF_SEND,
                            g->left, co, co, len, -1, NULL));
        }
    }
    return WEFT_OK;
}

/* ---- ordered: deterministic mode ---------------------------------------------------
 * Every element is combined in one fixed order, the left fold
 * ((x0 op x1) op x2) ... op x(p-1), whatever the count, the chunk and the
 * rank that wants the result.  A chain 0 -> 1 -> ... -> p-1 runs chunk by
 * chunk: rank 0 sends its input, rank r > 0 receives the partial result of
 * ranks 0..r-1 and combines it as the left operand (RECV_FIRST) with its
 * own input; rank p-1 makes the result, with FINAL, and every other rank
 * that needs it receives those bits instead of computing its own.  The
 * chain walks rank order, not the ring from the root: the order must not
 * depend on the root either. */

/* Appends a step to or from a chain neighbour (or any peer). */
static weft_status_t emit_to(struct ring *g, int kind, int flags, int buf, int peer, size_t off,
                             size_t src_off, size_t count, int32_t dep, int32_t *idx)
{
    int src = kind == WEFT_STEP_RECV_REDUCE ? WEFT_BUF_SEND : buf; /* the input is the operand */
    return emit(g, kind, flags, buf, src, peer, off, src_off, count, dep, idx);
}

/* Rank r's chain step for one chunk: rank 0 sends its input at off, the
 * others receive the partial sum and combine it with their input at off
 * into buf[dst]; *idx gets the step. */
static weft_status_t chain_step(struct ring *g, int buf, size_t dst, size_t off, size_t len,
                                int32_t *idx)
{
    int last = g->p - 1;
    if (g->rank == 0)
        return emit_to(g, WEFT_STEP_SEND, 0, WEFT_BUF_SEND, 1, off, 0, len, -1, idx);
    int flags = WEFT_STEP_RECV_FIRST | (g->rank == last ? WEFT_STEP_FINAL : 0);
    return emit_to(g, WEFT_STEP_RECV_REDUCE, flags, buf, g->rank - 1, dst, off, len, -1, idx);
}

/* Allreduce: the chain into recvbuf (middle ranks pass their partial on
 * from there), then the result flows back p-1 -> p-2 -> ... -> 0 over
 * the links the chain does not use, so neither phase waits for the other:
 * chunk c goes back as soon as rank p-1 made it.  A rank's receive of the
 * result overwrites the partial it sent (and, in place, its input), so it
 * depends on that send. */
static weft_status_t build_ordered_allreduce(struct ring *g, size_t n)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, n);
    int r = g->rank, last = g->p - 1;
    size_t nch = chunks_of(g, n);
    for (size_t c = 0; c < nch; c++) {
        size_t len = chunk_len(g, n, c), co = c * g->chunk;
        int32_t mine = -1, sent = -1, got = -1;
        WEFT_CHECK(chain_step(g, WEFT_BUF_RECV, co, co, len, &mine));
        if (r == last) {
            WEFT_CHECK(emit_to(g, WEFT_STEP_SEND, 0, WEFT_BUF_RECV, r - 1, co, 0, len, mine, NULL));
            continue;
        }
        sent = mine;
        if (r > 0)
            WEFT_CHECK(
                emit_to(g, WEFT_STEP_SEND, 0, WEFT_BUF_RECV, r + 1, co, 0, len, mine, &sent));
        WEFT_CHECK(emit_to(g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, r + 1, co, 0, len, sent, &got));
        if (r > 0)
            WEFT_CHECK(emit_to(g, WEFT_STEP_SEND, 0, WEFT_BUF_RECV, r - 1, co, 0, len, got, NULL));
    }
    return WEFT_OK;
}

/* Reduce: the chain, partials in scratch; rank p-1 reduces into recvbuf
 * when it is the root, else into scratch and sends each chunk to the
 * root.  The root's receive may overwrite its input (in place), so it
 * depends on the root's own chain step. */
static weft_status_t build_ordered_reduce(struct ring *g, size_t n, int root)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, n);
    int r = g->rank, last = g->p - 1;
    bool middle = r > 0 && r < last;
    int acc = r == last && root == last ? WEFT_BUF_RECV : WEFT_BUF_SCRATCH;
    if (middle || (r == last && root != last))
        g->s->scratch_count = n;
    size_t nch = chunks_of(g, n);
    for (size_t c = 0; c < nch; c++) {
        size_t len = chunk_len(g, n, c), co = c * g->chunk;
        int32_t mine = -1;
        WEFT_CHECK(chain_step(g, acc, co, co, len, &mine));
        if (middle)
            WEFT_CHECK(emit_to(g, WEFT_STEP_SEND, 0, acc, r + 1, co, 0, len, mine, NULL));
        else if (r == last && root != last)
            WEFT_CHECK(emit_to(g, WEFT_STEP_SEND, 0, acc, root, co, 0, len, mine, NULL));
        if (r == root && r != last)
            WEFT_CHECK(emit_to(g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, last, co, 0, len, mine, NULL));
    }
    return WEFT_OK;
}

/* Reduce_scatter: the chain over the whole input, block by block (block b
 * = [b*R, (b+1)*R), chunked within the block so that a chunk belongs to
 * one rank), partials in scratch indexed like sendbuf; rank p-1 reduces
 * its own block into recvbuf and every other block into scratch, and
 * sends block b to rank b.  Rank b's receive may overwrite its input (in
 * place recvbuf is sendbuf's block b), so it depends on b's chain step for
 * the same chunk. */
static weft_status_t build_ordered_reduce_scatter(struct ring *g, size_t rc)
{
    if (g->p == 1)
        return emit_copy(g, 0, 0, rc);
    int r = g->rank, last = g->p - 1;
    bool middle = r > 0 && r < last;
    size_t nch = chunks_of(g, rc);
    if (middle)
        g->s->scratch_count = rc * (size_t)g->p; /* weft_sched_build checked the product */
    else if (r == last)
        g->s->scratch_count = rc * (size_t)last; /* blocks 0..p-2 */
    for (int b = 0; b < g->p; b++) {
        bool own = b == r;
        for (size_t c = 0; c < nch; c++) {
            size_t len = chunk_len(g, rc, c), co = c * g->chunk, off = (size_t)b * rc + co;
            bool in_recv = r == last && own;
            int32_t mine = -1;
            WEFT_CHECK(chain_step(g, in_recv ? WEFT_BUF_RECV : WEFT_BUF_SCRATCH,
                                  in_recv ? co : off, off, len, &mine));
            if (middle)
                WEFT_CHECK(emit_to(g, WEFT_STEP_SEND, 0, WEFT_BUF_SCRATCH, r + 1, off, 0, len,
                                   mine, NULL));
            else if (r == last && !own)
                WEFT_CHECK(emit_to(g, WEFT_STEP_SEND, 0, WEFT_BUF_SCRATCH, b, off, 0, len, mine,
                                   NULL));
            if (own && r != last)
                WEFT_CHECK(emit_to(g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, last, co, 0, len, mine,
                                   NULL));
        }
    }
    return WEFT_OK;
}

static weft_status_t ring_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    struct ring g = {
        .s = s,
        .rank = d->rank,
        .p = d->nranks,
        .chunk = d->chunk,
    };
    g.left = ring_mod(&g, (long long)d->rank - 1);
    g.right = ring_mod(&g, (long long)d->rank + 1);

    /* Allgather and broadcast combine nothing: ordered changes nothing. */
    switch (d->coll) {
    case WEFT_COLL_ALLREDUCE:
        return d->ordered ? build_ordered_allreduce(&g, d->count) : build_allreduce(&g, d->count);
    case WEFT_COLL_REDUCE_SCATTER:
        return d->ordered ? build_ordered_reduce_scatter(&g, d->count)
                          : build_reduce_scatter(&g, d->count);
    case WEFT_COLL_ALLGATHER:
        return build_allgather(&g, d->count);
    case WEFT_COLL_BROADCAST:
        return build_broadcast(&g, d->count, d->root);
    default: /* WEFT_COLL_REDUCE: the registry lets nothing else through */
        return d->ordered ? build_ordered_reduce(&g, d->count, d->root)
                          : build_reduce(&g, d->count, d->root);
    }
}

const struct weft_algo_desc weft_algo_ring = {
    .name = "ring",
    .serves = {WEFT_SERVES_ALL},
    .build = ring_build,
};
