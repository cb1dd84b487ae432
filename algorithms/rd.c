/*
 * rd.c - recursive doubling allreduce, the latency-bound choice: log2(p)
 * rounds, each an exchange of the whole vector with the partner whose rank
 * differs in one bit, instead of the ring's 2(p-1) rounds.
 *
 * A rank count that is not a power of two is folded: of the first 2*rem
 * ranks (rem = p - pof2), each even one hands its vector to the odd one
 * above it, sits out the doubling, and gets the result back at the end.
 * In every exchange both partners compute (lower half) op (upper half), the
 * same expression on the same bits, so all ranks end bitwise identical
 * even where op is not commutative in IEEE corner cases (MAX with NaN).
 * Steps go chunk by chunk; chunk c of one round depends on chunk c of the
 * round before, so rounds pipeline like the ring's.
 */
#include <stdlib.h>

#include "algorithms/registry.h"

struct rd {
    struct weft_schedule *s;
    size_t n, chunk;
    int32_t *last; /* per chunk: step that last wrote it into recvbuf, -1 */
};

static weft_status_t add(struct rd *g, int kind, int flags, int buf, int src_buf, int peer,
                         size_t off, size_t count, int32_t dep0, int32_t dep1, int32_t *idx)
{
    struct weft_step st = {
        .kind = (uint8_t)kind, .flags = (uint8_t)flags, .buf = (uint8_t)buf,
        .src_buf = (uint8_t)src_buf, .peer = peer, .deps = {dep0, dep1, -1},
        .off = off, .src_off = off, .count = count,
    };
    return weft_sched_push(g->s, "rd", &st, idx);
}

/* One exchange with peer: send what we hold, receive theirs and combine. */
static weft_status_t exchange(struct rd *g, int peer, int flags)
{
    for (size_t c = 0, off = 0; off < g->n; c++, off += g->chunk) {
        size_t len = WEFT_MIN(g->chunk, g->n - off);
        int held = g->last[c] < 0 ? WEFT_BUF_SEND : WEFT_BUF_RECV;
        int32_t snd = -1, rr = -1;
        WEFT_CHECK(add(g, WEFT_STEP_SEND, 0, held, held, peer, off, len, g->last[c], -1, &snd));
        /* The reduce overwrites what the send reads (in place, or recvbuf
         * after round 0): it waits for the send. */
        WEFT_CHECK(add(g, WEFT_STEP_RECV_REDUCE, flags, WEFT_BUF_RECV, held, peer, off, len, snd,
                       g->last[c], &rr));
        g->last[c] = rr;
    }
    return WEFT_OK;
}

/* The fold: receive the even neighbour's vector and combine, no send. */
static weft_status_t exchange_fold_in(struct rd *g, int peer)
{
    for (size_t c = 0, off = 0; off < g->n; c++, off += g->chunk)
        WEFT_CHECK(add(g, WEFT_STEP_RECV_REDUCE, WEFT_STEP_RECV_FIRST, WEFT_BUF_RECV, WEFT_BUF_SEND,
                       peer, off, WEFT_MIN(g->chunk, g->n - off), -1, -1, &g->last[c]));
    return WEFT_OK;
}

weft_status_t weft_rd_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    struct rd g = {.s = s, .n = d->count, .chunk = d->chunk};
    size_t nchunks = d->count / d->chunk + (d->count % d->chunk != 0);
    int r = d->rank, p = d->nranks;
    if (p == 1) {
        if (d->count == 0)
            return WEFT_OK;
        return add(&g, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, WEFT_BUF_SEND, -1, 0, d->count, -1, -1,
                   NULL);
    }
    g.last = malloc((nchunks ? nchunks : 1) * sizeof(int32_t));
    if (g.last == NULL)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "rd: cannot allocate %zu chunk marks", nchunks);
    for (size_t c = 0; c < nchunks; c++)
        g.last[c] = -1;
    int pof2 = 1;
    while (pof2 * 2 <= p)
        pof2 *= 2;
    int rem = p - pof2;
    weft_status_t st = WEFT_OK;
    int nr;
    if (r < 2 * rem && r % 2 == 0) {
        /* Folded out: hand over our vector, get the result back. */
        int32_t *sent = g.last; /* reused: index of the send of chunk c */
        for (size_t c = 0, off = 0; off < g.n && st == WEFT_OK; c++, off += g.chunk)
            st = add(&g, WEFT_STEP_SEND, 0, WEFT_BUF_SEND, WEFT_BUF_SEND, r + 1, off,
                     WEFT_MIN(g.chunk, g.n - off), -1, -1, &sent[c]);
        for (size_t c = 0, off = 0; off < g.n && st == WEFT_OK; c++, off += g.chunk)
            st = add(&g, WEFT_STEP_RECV, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, r + 1, off,
                     WEFT_MIN(g.chunk, g.n - off), sent[c], -1, NULL);
        goto out;
    }
    if (r < 2 * rem) {
        /* Take in the even neighbour's vector: it is the lower operand. */
        st = exchange_fold_in(&g, r - 1);
        nr = r / 2;
    } else {
        nr = r - rem;
    }
    for (int mask = 1; mask < pof2 && st == WEFT_OK; mask <<= 1) {
        int pn = nr ^ mask;
        int peer = pn < rem ? 2 * pn + 1 : pn + rem;
        int flags = (nr & mask) ? WEFT_STEP_RECV_FIRST : 0;
        if (mask * 2 == pof2)
            flags |= WEFT_STEP_FINAL;
        st = exchange(&g, peer, flags);
    }
    if (r < 2 * rem)
        for (size_t c = 0, off = 0; off < g.n && st == WEFT_OK; c++, off += g.chunk)
            st = add(&g, WEFT_STEP_SEND, 0, WEFT_BUF_RECV, WEFT_BUF_RECV, r - 1, off,
                     WEFT_MIN(g.chunk, g.n - off), g.last[c], -1, NULL);
out:
    free(g.last);
    return st;
}
