/*
 * tree.c - binomial tree broadcast, pipelined in chunks.  With v = (rank -
 * root) mod p, rank v receives each chunk from v - lowbit(v) and passes it
 * on to v + m for every power of two m below lowbit(v) (the root: below p)
 * while v + m < p, largest m first, so the subtree that is deepest gets the
 * chunk first.  ceil(log2 p) hops instead of the chain's p - 1: it wins
 * while a message costs more than its bytes.  Any p >= 1 and any count.
 */
#include "schedule.h"

static weft_status_t tree_emit(struct weft_schedule *s, int kind, int buf, int peer, size_t off,
                               size_t count, int32_t dep, int32_t *idx)
{
    struct weft_step st = {
        .kind = (uint8_t)kind,
        .buf = (uint8_t)buf,
        .src_buf = (uint8_t)buf,
        .peer = peer,
        .deps = {dep, -1, -1},
        .off = off,
        .count = count,
    };
    if (kind == WEFT_STEP_COPY) {
        st.src_buf = WEFT_BUF_SEND;
        st.src_off = off;
    }
    int32_t i = weft_sched_add(s, &st);
    if (i < 0)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY,
                          "tree: cannot grow a schedule past %zu steps", s->nsteps);
    if (idx)
        *idx = i;
    return WEFT_OK;
}

static weft_status_t tree_broadcast(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    int p = d->nranks, v = (d->rank - d->root + p) % p;
    /* lowbit(v): the hop that reaches v; the root is reached by none. */
    int reach = 1;
    while (reach < p)
        reach <<= 1;
    if (v != 0)
        reach = v & -v;
    int parent = v == 0 ? -1 : (v - reach + d->root) % p;
    size_t n = d->count, nch = (n + d->chunk - 1) / d->chunk;
    for (size_t c = 0; c < nch && p > 1; c++) {
        size_t off = c * d->chunk, len = n - off < d->chunk ? n - off : d->chunk;
        int32_t got = -1;
        int buf = v == 0 ? WEFT_BUF_SEND : WEFT_BUF_RECV;
        if (v != 0)
            WEFT_CHECK(tree_emit(s, WEFT_STEP_RECV, WEFT_BUF_RECV, parent, off, len, -1, &got));
        for (int m = reach >> 1; m >= 1; m >>= 1)
            if (v + m < p)
                WEFT_CHECK(tree_emit(s, WEFT_STEP_SEND, buf, (v + m + d->root) % p, off, len, got,
                                     NULL));
    }
    if (v == 0 && n > 0)
        WEFT_CHECK(tree_emit(s, WEFT_STEP_COPY, WEFT_BUF_RECV, -1, 0, n, -1, NULL));
    return WEFT_OK;
}

weft_status_t weft_tree_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    if (d == NULL || s == NULL)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "tree: NULL argument");
    if (d->coll != WEFT_COLL_BROADCAST)
        return weft_error(NULL, WEFT_ERR_UNSUPPORTED, "tree: no %s (broadcast only)",
                          weft_coll_name(d->coll));
    if (d->nranks < 1 || d->rank < 0 || d->rank >= d->nranks)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "tree: rank %d of %d", d->rank,
                          d->nranks);
    if (d->root < 0 || d->root >= d->nranks)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "tree broadcast: root %d is outside [0, %d)",
                          d->root, d->nranks);
    if (d->chunk < 1)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "tree: chunk is 0 elements");
    s->nsteps = 0;
    s->scratch_count = 0;
    weft_status_t st = tree_broadcast(d, s);
    if (st != WEFT_OK)
        s->nsteps = 0;
    return st;
}
