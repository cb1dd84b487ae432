/*
 * rhd.c - the recursive halving/doubling family: Rabenseifner allreduce
 * (halving reduce-scatter, then doubling allgather), reduce_scatter by
 * halving, allgather by doubling, broadcast as binomial scatter + doubling
 * allgather (van de Geijn), reduce as halving + binomial gather.  Allreduce
 * variant WEFT_VAR_RHD_DOUBLING is rd.c.
 *
 * Every collective runs on pof2 "virtual" ranks (pof2: the largest power of
 * two <= p, rem = p - pof2).  Of the first 2*rem (relative) ranks, pairs
 * {2i, 2i+1} act as virtual rank i; the others, w >= 2*rem, are virtual rank
 * w - rem.  The pair's "keeper" takes part, its partner is folded: it hands
 * its input to the keeper before and gets its result after.  Allreduce,
 * reduce_scatter and allgather keep the odd rank (as rd.c does); broadcast
 * and reduce number ranks from the root and keep the even one, so the root
 * always takes part.  The fold costs the pairs one extra transfer each way
 * and the others nothing; allgather folds the same way (the keeper gathers
 * for two and returns all but the partner's own block) rather than Bruck's
 * rotation, so the whole family shares one block layout.
 *
 * The vector (allreduce, broadcast, reduce: count elements; reduce_scatter
 * and allgather: p*count, ranked blocks) is split into pof2 virtual blocks;
 * virtual block i holds a pair's two real blocks where the layout is per
 * rank, so a window of aligned virtual ranks is one contiguous range.
 * Steps split ranges on one grid of multiples of d->chunk, so a piece lies
 * in one chunk c and depends on the steps of chunk c of the round before:
 * rounds pipeline.  Partners combine (lower virtual half) op (upper half)
 * with RECV_FIRST where the local operand is the upper one; each element's
 * result is computed by one rank and copied to the others, so all ranks
 * hold the same bits.
 */
#include <stdlib.h>

#include "algorithms/registry.h"

/* One build; lives for one rhd_build call. */
struct rhd {
    struct weft_schedule *s;
    enum weft_coll coll;
    int p, pof2, rem, levels; /* levels = log2(pof2) */
    int root;                 /* 0 where the collective has none */
    bool keep_odd;            /* which rank of a folded pair takes part */
    size_t count;             /* elements per rank (the desc's count) */
    size_t chunk, nch;        /* grid step; chunks of the whole index space */
    /* Per chunk c.  prev/cur: the halving step that last wrote the kept
     * window's piece of c (round before / this round).  front[2c..2c+1]:
     * steps after which every write to what the rank holds of chunk c is
     * done (-1: none).  snd/rcv: this doubling round's steps on chunk c.
     * gave[j*nch + c]: halving round j's send of the half given away. */
    int32_t *prev, *cur, *front, *snd, *rcv, *gave;
};

/* ---- steps ------------------------------------------------------------------------ */

static weft_status_t add(struct rhd *g, int kind, int flags, int buf, size_t off, int src_buf,
                         size_t src_off, int peer, size_t count, int32_t d0, int32_t d1, int32_t d2,
                         int32_t *idx)
{
    struct weft_step st = {
        .kind = (uint8_t)kind, .flags = (uint8_t)flags, .buf = (uint8_t)buf,
        .src_buf = (uint8_t)src_buf, .peer = peer, .deps = {-1, -1, -1},
        .off = off, .src_off = src_off, .count = count,
    };
    int32_t in[WEFT_STEP_MAX_DEPS] = {d0, d1, d2};
    int n = 0;
    for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++) {
        bool seen = in[k] < 0;
        for (int i = 0; i < n; i++)
            seen |= st.deps[i] == in[k];
        if (!seen)
            st.deps[n++] = in[k];
    }
    return weft_sched_push(g->s, "rhd", &st, idx);
}

static weft_status_t send(struct rhd *g, int buf, size_t off, int peer, size_t count, int32_t d0,
                          int32_t d1, int32_t *idx)
{
    return add(g, WEFT_STEP_SEND, 0, buf, off, buf, off, peer, count, d0, d1, -1, idx);
}

static weft_status_t recv(struct rhd *g, int buf, size_t off, int peer, size_t count, int32_t d0,
                          int32_t *idx)
{
    return add(g, WEFT_STEP_RECV, 0, buf, off, buf, off, peer, count, d0, -1, -1, idx);
}

/* The piece of [x, end) that starts at x: up to the next multiple of the
 * chunk, and not across cut. */
static size_t piece(const struct rhd *g, size_t x, size_t end, size_t cut)
{
    size_t len = WEFT_MIN(g->chunk - x % g->chunk, end - x);
    if (x < cut && cut < x + len)
        len = cut - x;
    return len;
}

/* ---- ranks and blocks ------------------------------------------------------------- */

static int virt_of(const struct rhd *g, int w)
{
    if (w >= 2 * g->rem)
        return w - g->rem;
    return w % 2 == (g->keep_odd ? 1 : 0) ? w / 2 : -1;
}

/* The rank (absolute) that plays virtual rank v. */
static int peer_of(const struct rhd *g, int v)
{
    int w = v < g->rem ? 2 * v + (g->keep_odd ? 1 : 0) : v + g->rem;
    return (w + g->root) % g->p;
}

/* Start of virtual block i (0 <= i <= pof2) in the index space. */
static size_t vb(const struct rhd *g, int i)
{
    size_t ui = (size_t)i;
    if (g->coll == WEFT_COLL_REDUCE_SCATTER || g->coll == WEFT_COLL_ALLGATHER)
        return g->count * (i < g->rem ? 2 * ui : ui + (size_t)g->rem);
    size_t q = (size_t)g->pof2;
    return ui * (g->count / q) + WEFT_MIN(ui, g->count % q);
}

static void front_set(struct rhd *g, size_t c, int32_t a, int32_t b)
{
    g->front[2 * c] = a;
    g->front[2 * c + 1] = b;
}

/* ---- recursive halving -------------------------------------------------------------
 * Rounds m = pof2/2 .. 1: of the window of 2m virtual blocks that holds v,
 * keep the half with v, send the other half to v ^ m, and reduce what comes
 * back into acc.  Round 0 reads src0 (sendbuf, or acc after a fold-in); g->prev
 * holds the steps round 0 waits for.  The last round is FINAL.  For
 * reduce_scatter a pair's last block splits at the keeper's own block:
 * that goes to recvbuf, the partner's stays in scratch and is handed back
 * piece by piece.  Afterwards g->prev holds the last round's steps. */
static weft_status_t halving(struct rhd *g, int v, int r, int acc, int src0)
{
    bool rs = g->coll == WEFT_COLL_REDUCE_SCATTER;
    int lo = 0, src = src0;
    for (int m = g->pof2 / 2, j = 0; m >= 1; m /= 2, j++) {
        int pv = v ^ m, peer = peer_of(g, pv);
        bool upper = v & m, last = m == 1;
        int klo = upper ? lo + m : lo, glo = upper ? lo : lo + m;
        size_t ka = vb(g, klo), kb = vb(g, klo + m), ga = vb(g, glo), gb = vb(g, glo + m);
        size_t kcut = last && rs && v < g->rem ? g->count * (size_t)r : SIZE_MAX;
        size_t gcut = last && rs && pv < g->rem ? g->count * (size_t)(2 * pv + 1) : SIZE_MAX;
        int flags = (upper ? WEFT_STEP_RECV_FIRST : 0) | (last ? WEFT_STEP_FINAL : 0);
        int32_t *gave = g->gave + (size_t)j * g->nch;
        for (size_t xg = ga, xk = ka; xg < gb || xk < kb;) {
            if (xg < gb) {
                size_t len = piece(g, xg, gb, gcut), c = xg / g->chunk;
                WEFT_CHECK(send(g, src, xg, peer, len, g->prev[c], -1, &gave[c]));
                xg += len;
            }
            if (xk < kb) {
                size_t len = piece(g, xk, kb, kcut), c = xk / g->chunk;
                int dst = acc;
                size_t doff = xk;
                bool mine = kcut == SIZE_MAX || xk >= kcut;
                if (last && rs && mine) {
                    dst = WEFT_BUF_RECV;
                    doff = xk - g->count * (size_t)r;
                }
                WEFT_CHECK(add(g, WEFT_STEP_RECV_REDUCE, flags, dst, doff, src, xk, peer, len,
                               g->prev[c], -1, -1, &g->cur[c]));
                if (last && rs && !mine) /* the folded partner's block: hand it back */
                    WEFT_CHECK(send(g, acc, xk, r - 1, len, g->cur[c], -1, NULL));
                xk += len;
            }
        }
        int32_t *t = g->prev;
        g->prev = g->cur;
        g->cur = t;
        lo = klo;
        src = acc;
    }
    return WEFT_OK;
}

/* ---- recursive doubling ------------------------------------------------------------
 * Rounds m = 1 .. pof2/2: send the window of m virtual blocks that holds v
 * (from sbuf, whose pieces wait for g->front) and receive the partner's
 * window into recvbuf.  After halving, a receive overwrites what that
 * round's halving sent from there: it waits for that send (gave, when
 * given).  Broadcast (bcast): a rank's scatter subtree is already there,
 * so a rank does not send to its scatter parent, nor receive from a child.
 * Afterwards g->front covers every write to the whole vector. */
static weft_status_t doubling(struct rhd *g, int v, int sbuf, bool after_halving, bool bcast)
{
    for (int m = 1, j = g->levels - 1; m < g->pof2; m *= 2, j--) {
        int pv = v ^ m, peer = peer_of(g, pv);
        int wlo = v & ~(m - 1), plo = pv & ~(m - 1);
        bool give = !bcast || (v & (2 * m - 1)) != m;  /* partner is not our parent */
        bool take = !bcast || (v & (2 * m - 1)) != 0; /* partner is not our child */
        size_t wa = vb(g, wlo), wb = vb(g, wlo + m), pa = vb(g, plo), pb = vb(g, plo + m);
        size_t lo = WEFT_MIN(wa, pa), hi = WEFT_MAX(wb, pb);
        if (lo == hi)
            continue;
        size_t c0 = lo / g->chunk, c1 = (hi - 1) / g->chunk;
        for (size_t c = c0; c <= c1; c++)
            g->snd[c] = g->rcv[c] = -1;
        int32_t *gave = g->gave + (size_t)j * g->nch;
        if (!give)
            wa = wb;
        if (!take)
            pa = pb;
        for (size_t xs = wa, xr = pa; xs < wb || xr < pb;) {
            if (xs < wb) {
                size_t len = piece(g, xs, wb, SIZE_MAX), c = xs / g->chunk;
                /* Nothing writes sendbuf (the broadcast root's). */
                bool wait = sbuf != WEFT_BUF_SEND;
                WEFT_CHECK(send(g, sbuf, xs, peer, len, wait ? g->front[2 * c] : -1,
                                wait ? g->front[2 * c + 1] : -1, &g->snd[c]));
                xs += len;
            }
            if (xr < pb) {
                size_t len = piece(g, xr, pb, SIZE_MAX), c = xr / g->chunk;
                WEFT_CHECK(recv(g, WEFT_BUF_RECV, xr, peer, len, after_halving ? gave[c] : -1,
                                &g->rcv[c]));
                xr += len;
            }
        }
        /* A send waited for the whole front of its chunk, so it stands for it. */
        for (size_t c = c0; c <= c1; c++) {
            if (g->snd[c] >= 0)
                front_set(g, c, g->snd[c], g->rcv[c]);
            else if (g->rcv[c] >= 0 && g->front[2 * c] < 0)
                g->front[2 * c] = g->rcv[c];
            else if (g->rcv[c] >= 0 && g->front[2 * c + 1] < 0)
                g->front[2 * c + 1] = g->rcv[c];
            else if (g->rcv[c] >= 0)
                return weft_error(NULL, WEFT_ERR_INTERNAL,
                                  "rhd: chunk %zu has three unordered writers", c);
        }
    }
    return WEFT_OK;
}

/* ---- the collectives ---------------------------------------------------------------- */

static void marks_clear(int32_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = -1;
}

/* Sends [a, b) of the index space from buf (at x - shift) to peer; each
 * piece waits for the front of its chunk when wait. */
static weft_status_t send_range(struct rhd *g, int buf, size_t a, size_t b, size_t shift, int peer,
                                bool wait, int32_t *idx)
{
    for (size_t x = a; x < b;) {
        size_t len = piece(g, x, b, SIZE_MAX), c = x / g->chunk;
        WEFT_CHECK(send(g, buf, x - shift, peer, len, wait ? g->front[2 * c] : -1,
                        wait ? g->front[2 * c + 1] : -1, idx ? &idx[c] : NULL));
        x += len;
    }
    return WEFT_OK;
}

/* Receives [a, b) into recvbuf at x - shift from peer; each piece waits for
 * dep[chunk] when dep is given. */
static weft_status_t recv_range(struct rhd *g, size_t a, size_t b, size_t shift, int peer,
                                const int32_t *dep, int32_t *idx)
{
    for (size_t x = a; x < b;) {
        size_t len = piece(g, x, b, SIZE_MAX), c = x / g->chunk;
        WEFT_CHECK(recv(g, WEFT_BUF_RECV, x - shift, peer, len, dep ? dep[c] : -1,
                        idx ? &idx[c] : NULL));
        x += len;
    }
    return WEFT_OK;
}

/* The fold-in: acc[x] = (partner's x) op src[x] (RECV_FIRST: the partner is
 * the lower rank) or src op partner's; g->prev gets the steps. */
static weft_status_t fold_in(struct rhd *g, int acc, int peer, int flags, size_t n)
{
    for (size_t x = 0; x < n;) {
        size_t len = piece(g, x, n, SIZE_MAX), c = x / g->chunk;
        WEFT_CHECK(add(g, WEFT_STEP_RECV_REDUCE, flags, acc, x, WEFT_BUF_SEND, x, peer, len, -1,
                       -1, -1, &g->prev[c]));
        x += len;
    }
    return WEFT_OK;
}

/* The front of every chunk of [a, b) is the halving's last step there. */
static void front_from_halving(struct rhd *g, size_t a, size_t b)
{
    marks_clear(g->front, 2 * g->nch);
    for (size_t c = a / g->chunk; a < b && c <= (b - 1) / g->chunk; c++)
        g->front[2 * c] = g->prev[c];
}

/* Allreduce: halving leaves block v complete (FINAL) in recvbuf, doubling
 * gathers the others.  Per rank 2(1 - 1/pof2)n elements each way in
 * 2 log2(pof2) rounds; a folded pair adds n each way. */
static weft_status_t build_allreduce(struct rhd *g, int r)
{
    size_t n = g->count;
    int v = virt_of(g, r);
    if (v < 0) {
        WEFT_CHECK(send_range(g, WEFT_BUF_SEND, 0, n, 0, r + 1, false, g->prev));
        /* In place, the result overwrites what went out. */
        return recv_range(g, 0, n, 0, r + 1, g->prev, NULL);
    }
    int src0 = WEFT_BUF_SEND;
    marks_clear(g->prev, g->nch);
    if (r < 2 * g->rem) {
        WEFT_CHECK(fold_in(g, WEFT_BUF_RECV, r - 1, WEFT_STEP_RECV_FIRST, n));
        src0 = WEFT_BUF_RECV;
    }
    WEFT_CHECK(halving(g, v, r, WEFT_BUF_RECV, src0));
    front_from_halving(g, vb(g, v), vb(g, v + 1));
    WEFT_CHECK(doubling(g, v, WEFT_BUF_RECV, true, false));
    if (r < 2 * g->rem)
        WEFT_CHECK(send_range(g, WEFT_BUF_RECV, 0, n, 0, r - 1, true, NULL));
    return WEFT_OK;
}

/* Reduce_scatter over p blocks of count: halving on the virtual blocks
 * (a pair's two blocks are one), partial sums in scratch indexed like
 * sendbuf, the own block reduced straight into recvbuf.  Per rank
 * (1 - 1/pof2)pR elements each way in log2(pof2) rounds; a folded rank
 * sends pR and gets its R back. */
static weft_status_t build_reduce_scatter(struct rhd *g, int r)
{
    size_t R = g->count, N = R * (size_t)g->p, own = R * (size_t)r;
    int v = virt_of(g, r);
    if (v < 0) {
        WEFT_CHECK(send_range(g, WEFT_BUF_SEND, 0, N, 0, r + 1, false, g->prev));
        /* In place recvbuf is sendbuf's block r: after it went out. */
        return recv_range(g, own, own + R, own, r + 1, g->prev, NULL);
    }
    int src0 = WEFT_BUF_SEND;
    marks_clear(g->prev, g->nch);
    if (r < 2 * g->rem) {
        WEFT_CHECK(fold_in(g, WEFT_BUF_SCRATCH, r - 1, WEFT_STEP_RECV_FIRST, N));
        src0 = WEFT_BUF_SCRATCH;
    }
    if (r < 2 * g->rem || g->pof2 > 2)
        g->s->scratch_count = N;
    return halving(g, v, r, WEFT_BUF_SCRATCH, src0);
}

/* Allgather of p blocks of count: the own block is copied into recvbuf
 * first (skipped in place), then doubling on the virtual blocks.  Per rank
 * (1 - 1/pof2)pS elements each way in log2(pof2) rounds; a folded rank
 * sends S and gets (p-1)S. */
static weft_status_t build_allgather(struct rhd *g, int r)
{
    size_t S = g->count, N = S * (size_t)g->p, own = S * (size_t)r;
    int v = virt_of(g, r);
    int32_t cp = -1;
    if (v < 0) {
        WEFT_CHECK(send_range(g, WEFT_BUF_SEND, own, own + S, own, r + 1, false, NULL));
        WEFT_CHECK(add(g, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, own, WEFT_BUF_SEND, 0, -1, S, -1, -1,
                       -1, NULL));
        WEFT_CHECK(recv_range(g, 0, own, 0, r + 1, NULL, NULL));
        return recv_range(g, own + S, N, 0, r + 1, NULL, NULL);
    }
    WEFT_CHECK(add(g, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, own, WEFT_BUF_SEND, 0, -1, S, -1, -1, -1,
                   &cp));
    marks_clear(g->front, 2 * g->nch);
    for (size_t c = own / g->chunk; c <= (own + S - 1) / g->chunk; c++)
        g->front[2 * c] = cp;
    if (r < 2 * g->rem) {
        WEFT_CHECK(recv_range(g, own - S, own, 0, r - 1, NULL, g->prev));
        for (size_t c = (own - S) / g->chunk; c <= (own - 1) / g->chunk; c++)
            g->front[2 * c + 1] = g->prev[c];
    }
    WEFT_CHECK(doubling(g, v, WEFT_BUF_RECV, false, false));
    if (r < 2 * g->rem) {
        WEFT_CHECK(send_range(g, WEFT_BUF_RECV, 0, own - S, 0, r - 1, true, NULL));
        WEFT_CHECK(send_range(g, WEFT_BUF_RECV, own, N, 0, r - 1, true, NULL));
    }
    return WEFT_OK;
}

/* Broadcast: binomial scatter of the root's pof2 blocks (v gets its
 * subtree's blocks [v, v + lowbit(v)) from v - lowbit(v)), then doubling,
 * in which nobody receives what the scatter brought: a non-root receives
 * each element once (n in all) over 2 log2(pof2) rounds, the root sends
 * (1 - 1/pof2)n in each phase; a folded rank gets n from its keeper. */
static weft_status_t build_broadcast(struct rhd *g, int r)
{
    size_t n = g->count;
    int w = (r - g->root + g->p) % g->p, v = virt_of(g, w);
    if (v < 0)
        return recv_range(g, 0, n, 0, (r + g->p - 1) % g->p, NULL, NULL);
    int low = v ? v & -v : g->pof2;
    int sbuf = v ? WEFT_BUF_RECV : WEFT_BUF_SEND;
    marks_clear(g->front, 2 * g->nch);
    if (v) {
        size_t a = vb(g, v), b = vb(g, v + low);
        WEFT_CHECK(recv_range(g, a, b, 0, peer_of(g, v - low), NULL, g->prev));
        for (size_t c = a / g->chunk; a < b && c <= (b - 1) / g->chunk; c++)
            g->front[2 * c] = g->prev[c];
    }
    for (int m = low / 2; m >= 1; m /= 2)
        WEFT_CHECK(send_range(g, sbuf, vb(g, v + m), vb(g, v + 2 * m), 0, peer_of(g, v + m),
                              sbuf != WEFT_BUF_SEND, NULL));
    WEFT_CHECK(doubling(g, v, sbuf, false, true));
    if (w < 2 * g->rem)
        WEFT_CHECK(send_range(g, sbuf, 0, n, 0, (r + 1) % g->p, sbuf != WEFT_BUF_SEND, NULL));
    if (v == 0)
        WEFT_CHECK(add(g, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, 0, WEFT_BUF_SEND, 0, -1, n, -1, -1, -1,
                       NULL));
    return WEFT_OK;
}

/* Reduce: halving, then v gathers its subtree's blocks [v, v + lowbit(v))
 * from its children v + m (m = 1, 2, ...) and sends them to v - lowbit(v).
 * Partial sums live in scratch off the root, in recvbuf on it.  A receive
 * overwrites what the halving gave away there, so it waits for that send;
 * where a chunk would get a third unordered writer, the receive waits for
 * the two before it, which keeps a send's deps at two. */
static weft_status_t gather(struct rhd *g, int v, int acc)
{
    int low = v ? v & -v : g->pof2;
    front_from_halving(g, vb(g, v), vb(g, v + 1));
    for (int m = 1, j = g->levels - 1; m < low; m *= 2, j--) {
        const int32_t *gave = g->gave + (size_t)j * g->nch;
        size_t b = vb(g, v + 2 * m);
        for (size_t x = vb(g, v + m); x < b;) {
            size_t len = piece(g, x, b, SIZE_MAX), c = x / g->chunk;
            int32_t *f = &g->front[2 * c], got;
            bool full = f[0] >= 0 && f[1] >= 0;
            WEFT_CHECK(add(g, WEFT_STEP_RECV, 0, acc, x, acc, x, peer_of(g, v + m), len, gave[c],
                           full ? f[0] : -1, full ? f[1] : -1, &got));
            if (full)
                f[0] = got, f[1] = -1;
            else
                f[f[0] >= 0] = got;
            x += len;
        }
    }
    if (v)
        WEFT_CHECK(send_range(g, acc, vb(g, v), vb(g, v + low), 0, peer_of(g, v - low), true,
                              NULL));
    return WEFT_OK;
}

static weft_status_t build_reduce(struct rhd *g, int r)
{
    size_t n = g->count;
    int w = (r - g->root + g->p) % g->p, v = virt_of(g, w);
    if (v < 0)
        return send_range(g, WEFT_BUF_SEND, 0, n, 0, (r + g->p - 1) % g->p, false, NULL);
    int acc = v ? WEFT_BUF_SCRATCH : WEFT_BUF_RECV, src0 = WEFT_BUF_SEND;
    if (v)
        g->s->scratch_count = n;
    marks_clear(g->prev, g->nch);
    if (w < 2 * g->rem) {
        /* The folded partner is the upper rank: ours is the left operand. */
        WEFT_CHECK(fold_in(g, acc, (r + 1) % g->p, 0, n));
        src0 = acc;
    }
    WEFT_CHECK(halving(g, v, r, acc, src0));
    return gather(g, v, acc);
}

static weft_status_t rhd_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    if (d->variant == WEFT_VAR_RHD_DOUBLING)
        return weft_rd_build(d, s);
    struct rhd g = {.s = s, .coll = d->coll, .p = d->nranks, .pof2 = 1, .count = d->count,
                    .chunk = d->chunk, .keep_odd = true};
    if (d->count == 0)
        return WEFT_OK;
    if (d->nranks == 1)
        return add(&g, WEFT_STEP_COPY, 0, WEFT_BUF_RECV, 0, WEFT_BUF_SEND, 0, -1, d->count, -1, -1,
                   -1, NULL);
    while (g.pof2 * 2 <= g.p) {
        g.pof2 *= 2;
        g.levels++;
    }
    g.rem = g.p - g.pof2;
    if (d->coll == WEFT_COLL_BROADCAST || d->coll == WEFT_COLL_REDUCE) {
        g.root = d->root;
        g.keep_odd = false;
    }
    size_t space = d->count;
    if (d->coll == WEFT_COLL_REDUCE_SCATTER || d->coll == WEFT_COLL_ALLGATHER)
        space *= (size_t)g.p; /* weft_sched_build ruled out the overflow */
    g.nch = space / g.chunk + (space % g.chunk != 0);
    size_t per = 6 + (size_t)g.levels;
    int32_t *marks = NULL;
    if (g.nch <= SIZE_MAX / sizeof(int32_t) / per)
        marks = malloc(g.nch * per * sizeof(int32_t));
    if (marks == NULL)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "rhd: cannot allocate %zu x %zu chunk marks",
                          g.nch, per);
    g.prev = marks;
    g.cur = g.prev + g.nch;
    g.front = g.cur + g.nch;
    g.snd = g.front + 2 * g.nch;
    g.rcv = g.snd + g.nch;
    g.gave = g.rcv + g.nch;
    weft_status_t st;
    switch (d->coll) {
    case WEFT_COLL_ALLREDUCE: st = build_allreduce(&g, d->rank); break;
    case WEFT_COLL_REDUCE_SCATTER: st = build_reduce_scatter(&g, d->rank); break;
    case WEFT_COLL_ALLGATHER: st = build_allgather(&g, d->rank); break;
    case WEFT_COLL_BROADCAST: st = build_broadcast(&g, d->rank); break;
    default: st = build_reduce(&g, d->rank); break; /* the registry let only reduce on */
    }
    free(marks);
    return st;
}

const struct weft_algo_desc weft_algo_rhd = {
    .name = "rhd",
    .variants = {[WEFT_VAR_RHD_RABENSEIFNER] = "rabenseifner",
                 [WEFT_VAR_RHD_DOUBLING] = "doubling"},
    .serves = {[WEFT_VAR_RHD_RABENSEIFNER] = WEFT_SERVES_ALL,
               [WEFT_VAR_RHD_DOUBLING] = WEFT_SERVES(ALLREDUCE)},
    .build = rhd_build,
};
