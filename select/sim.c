/*
 * sim.c - the schedule simulator: builds all ranks' schedules, matches
 * sends to receives, and runs every step under the alpha-beta-gamma model
 * of sim.h as a discrete-event simulation (a binary heap of timed events).
 *
 * Steps of all ranks live in one array, named by a global id (rank by
 * rank, step by step), in a compact form: what the run needs, nothing of
 * the buffers.  Ports and CPUs are modelled as reservations: whatever
 * becomes ready first (events are handled in time order) takes the next
 * free slot of the resources it needs, so each resource serves FIFO.
 * Messages that become ready at the same instant claim their ports in the
 * order their sends were issued: post time, then the send's place in its
 * rank's schedule, then rank.  Within a rank that is schedule order (what
 * makes a binomial root serve its deepest subtree first); across ranks it
 * takes every rank's k-th message before any (k+1)-th, as the engine's
 * ranks, running side by side, would, and what symmetric ranks do alike
 * (ranks first would let rank 0's whole fan-out reserve the ports ahead of
 * the others' first messages).
 *
 * With a symmetry (sim.h; sim_sym.c finds it), only the representatives'
 * steps are loaded: a message step's partner is the matching step of its
 * peer's representative, found by moving both ranks with the permutation
 * that takes the peer to it.
 */
#include "select/sim.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "select/topo.h"

#define NONE UINT32_MAX
/* Dependents are indexed with uint32 offsets (at most 3 per step). */
#define MAX_STEPS ((size_t)(UINT32_MAX / 4))

enum {
    ST_WAIT,   /* not posted yet */
    ST_QUEUED, /* ready to post, in the work queue */
    ST_POSTED, /* a message end posted, waiting for its match */
    ST_MOVING, /* a message on the wire; its event is the receive's */
    ST_LANDED, /* a RECV_REDUCE's data is here, its deps are not done */
    ST_CPU,    /* a reduce or a copy on the rank's CPU */
    ST_DONE
};

/* One step of one rank, as the run sees it. */
struct sstep {
    double bytes;
    double tpost;       /* when the step was posted, seconds */
    uint32_t partner;   /* message steps: the matched step (before matching: the peer rank) */
    int32_t peer;       /* message steps: the peer rank (not its representative) */
    uint32_t next_link; /* the rank's next message step on the same link (peer, direction) */
    int32_t rank;
    uint8_t kind;
    uint8_t npost; /* posts still awaited: deps (RECV_REDUCE only), the link's previous step */
    uint8_t ndone; /* deps not done yet */
    uint8_t state; /* ST_* */
};

struct event {
    double t;
    uint32_t id;
};

/* One prediction's state; lives for one weft_sim_predict call. */
struct sim {
    const struct weft_sim_model *m;
    int p;     /* ranks of the collective */
    int nrep;  /* ranks run: p, or the representatives 0 .. nrep-1 */
    int gkind; /* enum weft_sim_group; WEFT_SIM_G_NONE when nrep == p */
    struct sstep *st;
    size_t n, cap;
    uint32_t *deps;    /* (n, 3) global ids of deps, NONE pads; freed after indexing */
    size_t *rank_off;  /* (nrep + 1) first global id of each rank run */
    uint32_t *dfirst;  /* (n + 1) CSR offsets of each step's dependents */
    uint32_t *dlist;   /* dependents */
    double *sport, *rport, *cpu; /* (nrep) when each resource is free next, seconds */
    double *busy;      /* (2 nrep) bytes * beta each rank's send, then receive, port carried */
    double *core;      /* with cpu_group: when each core is free next, group by group */
    size_t *core_off;  /* (groups + 1) first core of each group */
    struct event *heap;
    size_t hn, hcap;
    uint32_t *queue; /* (n) steps ready to post, FIFO */
    size_t qhead, qtail;
    uint32_t *ready; /* sends whose message became ready this instant */
    size_t nready, readycap;
    double finish;
    uint64_t shape; /* weft_sim_result's */
    size_t ndone;
    weft_status_t err; /* a bad link cost met during the run */
};

static double max2(double a, double b)
{
    return a > b ? a : b;
}

static bool cost_ok(double x)
{
    return isfinite(x) && x >= 0;
}

/* ---- symmetry ----------------------------------------------------------------- */

/* The representative of rank q (q itself without a symmetry). */
static int rep_of(const struct sim *s, int q)
{
    return q % s->nrep;
}

static int to_rep(const struct sim *s, int q, int x)
{
    return weft_sim_to_rep(s->p, s->nrep, s->gkind, q, x);
}

/* ---- loading ------------------------------------------------------------------ */

static weft_status_t grow(struct sim *s, size_t need)
{
    if (need <= s->cap)
        return WEFT_OK;
    size_t cap = s->cap ? s->cap : 1024;
    while (cap < need)
        cap = cap > MAX_STEPS / 2 ? MAX_STEPS : cap * 2;
    struct sstep *st = realloc(s->st, cap * sizeof(*st));
    if (!st)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot hold %zu steps", cap);
    s->st = st;
    uint32_t *deps = realloc(s->deps, cap * 3 * sizeof(*deps));
    if (!deps)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot hold %zu steps", cap);
    s->deps = deps;
    s->cap = cap;
    return WEFT_OK;
}

/* Folds x into the shape hash (a splitmix64 step). */
static void shape_add(struct sim *s, uint64_t x)
{
    uint64_t z = (s->shape ^ x) + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    s->shape = z ^ (z >> 31);
}

/* Appends rank r's schedule, checked, in compact form. */
static weft_status_t add_rank(struct sim *s, int r, const struct weft_schedule *sch)
{
    if (sch->nsteps > MAX_STEPS - s->n)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY,
                          "sim: more than %zu steps over %d ranks; use larger chunks", MAX_STEPS,
                          s->p);
    WEFT_CHECK(grow(s, s->n + sch->nsteps));
    uint32_t base = (uint32_t)s->n;
    for (size_t k = 0; k < sch->nsteps; k++) {
        const struct weft_step *w = &sch->steps[k];
        bool msg = w->kind != WEFT_STEP_COPY;
        if (w->kind > WEFT_STEP_COPY)
            return weft_error(NULL, WEFT_ERR_INVALID_ARG, "sim: rank %d step %zu has kind %d", r,
                              k, w->kind);
        if (msg && (w->peer < 0 || w->peer >= s->p))
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "sim: rank %d step %zu names peer %d of %d ranks", r, k, w->peer,
                              s->p);
        if (msg || w->buf != w->src_buf || w->off != w->src_off) {
            shape_add(s, (uint64_t)(msg ? w->peer + 1 : 0) << 8 | w->kind);
            shape_add(s, w->count);
        }
        struct sstep *x = &s->st[s->n];
        *x = (struct sstep){
            .bytes = (double)w->count * (double)s->m->esize,
            .partner = msg ? (uint32_t)w->peer : NONE,
            .peer = msg ? w->peer : -1,
            .next_link = NONE,
            .rank = r,
            .kind = w->kind,
            .state = ST_WAIT,
        };
        for (int i = 0; i < 3; i++) {
            int32_t d = w->deps[i];
            if (d < -1 || (d >= 0 && (size_t)d >= k))
                return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                                  "sim: rank %d step %zu depends on step %d, not an earlier one",
                                  r, k, d);
            s->deps[3 * s->n + (size_t)i] = d < 0 ? NONE : base + (uint32_t)d;
        }
        s->n++;
    }
    return WEFT_OK;
}

static double seconds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Builds rank r's schedule into sch, of at most limit steps (0: any):
 * the builder stops at the limit, so a schedule too large to run (direct's
 * root at 1 GiB on 16,384 ranks, 33 M steps) is refused having cost no
 * more than the limit in memory. */
weft_status_t weft_sim_build_rank(const struct weft_coll_desc *tmpl, int r, size_t limit,
                                  struct weft_schedule *sch)
{
    struct weft_coll_desc d = *tmpl;
    d.rank = r;
    sch->max_steps = limit;
    weft_status_t st = weft_sched_build(&d, sch);
    /* A family that serves the collective refuses only at the limit. */
    if (st == WEFT_ERR_UNSUPPORTED && limit && weft_algo_serves(d.algo, d.variant, d.coll))
        st = weft_error(NULL, WEFT_ERR_UNSUPPORTED,
                        "sim: rank %d's schedule alone is over the limit of %zu steps, and no "
                        "symmetry lets fewer of the %d ranks stand for the others",
                        r, limit, tmpl->nranks);
    return st;
}

/* Every rank's schedule, or (reps set) the representatives' already built.
 * Without them, m->max_steps bounds the steps; once 64 ranks are in, a
 * projection over 1.5 times the limit stops the building early.  It goes
 * by the last 32 ranks built, not all: with a count below p only the first
 * ranks hold blocks (direct's ranks 0 and 1 send to every rank, the others
 * four messages), and averaging them in would refuse runs that fit; being
 * closer, it needs less slack than the average's 4 times, and refusing
 * sooner saves building 4 M steps for each cell that is over (1 s of a
 * broadcast sweep on 16,384 ranks). */
static weft_status_t load(struct sim *s, const struct weft_coll_desc *tmpl,
                          const struct weft_schedule *reps)
{
    struct weft_schedule sch;
    weft_sched_init(&sch);
    size_t lim = s->m->max_steps;
    double t0 = seconds_now(), t32 = t0;
    weft_status_t st = WEFT_OK;
    if (s->gkind != WEFT_SIM_G_NONE)
        shape_add(s, (uint64_t)s->gkind << 32 | (uint64_t)s->nrep);
    for (int r = 0; r < s->nrep; r++) {
        s->rank_off[r] = s->n;
        shape_add(s, (uint64_t)r);
        if (reps) {
            WEFT_CHECK_GOTO(add_rank(s, r, &reps[r]), st, out);
            continue;
        }
        st = weft_sim_build_rank(tmpl, r, lim ? lim - s->n + 1 : 0, &sch);
        if (st == WEFT_ERR_UNSUPPORTED && lim && weft_algo_serves(tmpl->algo, tmpl->variant,
                                                                  tmpl->coll))
            st = weft_error(NULL, WEFT_ERR_UNSUPPORTED,
                            "sim: ranks 0-%d of %d hold over %zu steps, over the limit of "
                            "%zu, and no symmetry lets fewer ranks stand for them",
                            r, s->p, lim, lim);
        if (st != WEFT_OK)
            goto out;
        WEFT_CHECK_GOTO(add_rank(s, r, &sch), st, out);
        double projected = (double)s->n;
        if (r >= 63)
            projected += (double)(s->n - s->rank_off[r - 31]) / 32 * (s->p - r - 1);
        if (lim && (s->n > lim || (r >= 63 && projected > 1.5 * (double)lim))) {
            st = weft_error(NULL, WEFT_ERR_UNSUPPORTED,
                            "sim: %d ranks' schedules hold about %.3g steps, over the limit of "
                            "%zu, and no symmetry lets fewer ranks stand for them",
                            s->p, projected, lim);
            goto out;
        }
        if (r == 31)
            t32 = seconds_now();
        if (r == 63 && s->m->max_build_seconds > 0) {
            /* The same projection as for the steps, by the last 32 ranks. */
            double now = seconds_now(), secs = now - t0 + (now - t32) / 32 * (s->p - 64);
            if (secs > s->m->max_build_seconds) {
                st = weft_error(NULL, WEFT_ERR_UNSUPPORTED,
                                "sim: building %d ranks' schedules would take about %.2g s, over "
                                "the limit of %g s, and no symmetry lets fewer ranks stand for "
                                "them",
                                s->p, secs, s->m->max_build_seconds);
                goto out;
            }
        }
    }
    s->rank_off[s->nrep] = s->n;
out:
    weft_sched_free(&sch);
    return st;
}

/* ---- matching ----------------------------------------------------------------- */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts one rank's keys (peer << 32 | id) by peer, keeping step order
 * within a peer; most ranks talk to peers in order already. */
static void sort_keys(uint64_t *k, size_t n)
{
    for (size_t i = 1; i < n; i++)
        if (k[i] < k[i - 1]) {
            qsort(k, n, sizeof(*k), cmp_u64);
            return;
        }
}

/* The keys of one rank's segment whose peer is q: [*lo, *hi). */
static void peer_range(const uint64_t *k, size_t from, size_t to, int q, size_t *lo, size_t *hi)
{
    uint64_t want = (uint64_t)q << 32;
    size_t a = from, b = to;
    while (a < b) {
        size_t mid = a + (b - a) / 2;
        if (k[mid] < want)
            a = mid + 1;
        else
            b = mid;
    }
    *lo = a;
    while (a < to && k[a] >> 32 == (uint64_t)q)
        a++;
    *hi = a;
}

enum { W_COUNT, W_PAIR, W_CHECK };

/* Walks the groups of side A (keys per rank run, grouped by peer) and
 * counts side B's matching group for each: for peer q, the steps of q's
 * representative with peer r moved as q is.  W_PAIR also pairs them;
 * W_CHECK asks them to be paired so already, else *open is set.  The first
 * mismatch is an error. */
static weft_status_t walk(struct sim *s, const uint64_t *ak, const size_t *aoff,
                          const uint64_t *bk, const size_t *boff, bool a_sends, int mode,
                          bool *open)
{
    for (int r = 0; r < s->nrep; r++) {
        for (size_t i = aoff[r]; i < aoff[r + 1];) {
            int q = (int)(ak[i] >> 32);
            size_t j = i;
            while (j < aoff[r + 1] && (int)(ak[j] >> 32) == q)
                j++;
            size_t lo, hi;
            int c = rep_of(s, q);
            peer_range(bk, boff[c], boff[c + 1], to_rep(s, q, r), &lo, &hi);
            if (hi - lo != j - i) {
                size_t ns = a_sends ? j - i : hi - lo, nr = a_sends ? hi - lo : j - i;
                return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                                  "sim: rank %d sends %zu messages to rank %d, which posts %zu "
                                  "receives from it",
                                  a_sends ? r : q, ns, a_sends ? q : r, nr);
            }
            for (size_t k = 0; mode == W_CHECK && k < j - i; k++)
                if (s->st[(uint32_t)ak[i + k]].partner != (uint32_t)bk[lo + k])
                    *open = true;
            for (size_t k = 0; mode == W_PAIR && k < j - i; k++) {
                uint32_t a = (uint32_t)ak[i + k], b = (uint32_t)bk[lo + k];
                if (s->st[a].bytes != s->st[b].bytes)
                    return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                                      "sim: message %zu from rank %d to rank %d: %.0f bytes sent, "
                                      "%.0f received",
                                      k, r, q, s->st[a].bytes, s->st[b].bytes);
                s->st[a].partner = b;
                s->st[b].partner = a;
            }
            i = j;
        }
    }
    return WEFT_OK;
}

/* Chains each rank's messages per link (next_link) and pairs the k-th send
 * from A to B with the k-th receive on B from A.  With a symmetry, *open
 * is set when the pairing does not close (a receive's partner's partner
 * is another receive): the group does not fit these schedules. */
static weft_status_t match(struct sim *s, bool *open)
{
    size_t nsend = 0, nrecv = 0;
    for (size_t g = 0; g < s->n; g++) {
        nsend += s->st[g].kind == WEFT_STEP_SEND;
        nrecv += s->st[g].kind == WEFT_STEP_RECV || s->st[g].kind == WEFT_STEP_RECV_REDUCE;
    }
    weft_status_t st = WEFT_OK;
    uint64_t *sk = malloc((nsend ? nsend : 1) * sizeof(*sk));
    uint64_t *rk = malloc((nrecv ? nrecv : 1) * sizeof(*rk));
    size_t *soff = malloc(((size_t)s->nrep + 1) * sizeof(*soff));
    size_t *roff = malloc(((size_t)s->nrep + 1) * sizeof(*roff));
    if (!sk || !rk || !soff || !roff) {
        st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot index %zu messages", nsend + nrecv);
        goto out;
    }
    size_t ns = 0, nr = 0;
    for (int r = 0; r < s->nrep; r++) {
        soff[r] = ns;
        roff[r] = nr;
        for (size_t g = s->rank_off[r]; g < s->rank_off[r + 1]; g++) {
            uint64_t key = (uint64_t)s->st[g].partner << 32 | g;
            if (s->st[g].kind == WEFT_STEP_SEND)
                sk[ns++] = key;
            else if (s->st[g].kind != WEFT_STEP_COPY)
                rk[nr++] = key;
        }
        sort_keys(sk + soff[r], ns - soff[r]);
        sort_keys(rk + roff[r], nr - roff[r]);
    }
    soff[s->nrep] = ns;
    roff[s->nrep] = nr;

    /* Links: consecutive keys with one peer, within one rank's segment. */
    for (int side = 0; side < 2; side++) {
        const uint64_t *k = side ? rk : sk;
        const size_t *off = side ? roff : soff;
        for (int r = 0; r < s->nrep; r++)
            for (size_t i = off[r] + 1; i < off[r + 1]; i++)
                if (k[i] >> 32 == k[i - 1] >> 32) {
                    s->st[(uint32_t)k[i - 1]].next_link = (uint32_t)k[i];
                    s->st[(uint32_t)k[i]].npost++;
                }
    }

    WEFT_CHECK_GOTO(walk(s, sk, soff, rk, roff, true, W_PAIR, open), st, out);
    /* Every send group matched a receive group of its size; receives are
     * all matched unless there are more of them: name who has extra. */
    if (nrecv != nsend) {
        WEFT_CHECK_GOTO(walk(s, rk, roff, sk, soff, false, W_COUNT, open), st, out);
        st = s->gkind != WEFT_SIM_G_NONE ? (*open = true, WEFT_OK)
                                : weft_error(NULL, WEFT_ERR_INTERNAL, "sim: %zu sends, %zu receives",
                                             nsend, nrecv);
    } else if (s->gkind != WEFT_SIM_G_NONE) {
        WEFT_CHECK_GOTO(walk(s, rk, roff, sk, soff, false, W_CHECK, open), st, out);
    }
out:
    free(sk);
    free(rk);
    free(soff);
    free(roff);
    return st;
}

/* Dependents of each step (CSR), and the counters each step waits on. */
static weft_status_t index_deps(struct sim *s)
{
    s->dfirst = calloc(s->n + 1, sizeof(*s->dfirst));
    if (!s->dfirst)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot index %zu steps", s->n);
    for (size_t g = 0; g < s->n; g++)
        for (int i = 0; i < 3; i++) {
            uint32_t d = s->deps[3 * g + (size_t)i];
            if (d == NONE)
                continue;
            s->dfirst[d + 1]++;
            s->st[g].ndone++;
            if (s->st[g].kind == WEFT_STEP_RECV_REDUCE)
                s->st[g].npost++;
        }
    for (size_t g = 0; g < s->n; g++)
        s->dfirst[g + 1] += s->dfirst[g];
    size_t nedges = s->dfirst[s->n];
    s->dlist = malloc((nedges ? nedges : 1) * sizeof(*s->dlist));
    uint32_t *fill = malloc((s->n ? s->n : 1) * sizeof(*fill));
    if (!s->dlist || !fill) {
        free(fill);
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot index %zu dependencies", nedges);
    }
    memcpy(fill, s->dfirst, s->n * sizeof(*fill));
    for (size_t g = 0; g < s->n; g++)
        for (int i = 0; i < 3; i++) {
            uint32_t d = s->deps[3 * g + (size_t)i];
            if (d != NONE)
                s->dlist[fill[d]++] = (uint32_t)g;
        }
    free(fill);
    free(s->deps);
    s->deps = NULL;
    return WEFT_OK;
}

/* ---- the run ------------------------------------------------------------------ */

static bool before(const struct event *a, const struct event *b)
{
    return a->t < b->t || (a->t == b->t && a->id < b->id);
}

static weft_status_t heap_push(struct sim *s, double t, uint32_t id)
{
    if (s->hn == s->hcap) {
        size_t cap = s->hcap ? s->hcap * 2 : 1024;
        struct event *h = realloc(s->heap, cap * sizeof(*h));
        if (!h)
            return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot queue %zu events", cap);
        s->heap = h;
        s->hcap = cap;
    }
    struct event e = {t, id};
    size_t i = s->hn++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!before(&e, &s->heap[up]))
            break;
        s->heap[i] = s->heap[up];
        i = up;
    }
    s->heap[i] = e;
    return WEFT_OK;
}

static struct event heap_pop(struct sim *s)
{
    struct event top = s->heap[0], last = s->heap[--s->hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= s->hn)
            break;
        if (c + 1 < s->hn && before(&s->heap[c + 1], &s->heap[c]))
            c++;
        if (!before(&s->heap[c], &last))
            break;
        s->heap[i] = s->heap[c];
        i = c;
    }
    if (s->hn > 0)
        s->heap[i] = last;
    return top;
}

static void enqueue_if_ready(struct sim *s, uint32_t g)
{
    struct sstep *x = &s->st[g];
    if (x->state == ST_WAIT && x->npost == 0 &&
        (x->kind == WEFT_STEP_RECV_REDUCE || x->ndone == 0)) {
        x->state = ST_QUEUED;
        s->queue[s->qtail++] = g;
    }
}

/* The core of rank r's machine that is free first (cpu_group set). */
static double *first_core(struct sim *s, int r)
{
    int g = s->m->cpu_group[r];
    double *best = &s->core[s->core_off[g]];
    for (size_t c = s->core_off[g] + 1; c < s->core_off[g + 1]; c++)
        if (s->core[c] < *best)
            best = &s->core[c];
    return best;
}

/* Step g takes its rank's CPU (and, cores shared, a core of its machine)
 * for cost seconds, from t or when they are free. */
static weft_status_t run_cpu(struct sim *s, uint32_t g, double t, double cost)
{
    struct sstep *x = &s->st[g];
    double *core = s->core ? first_core(s, x->rank) : NULL;
    double end = max2(t, s->cpu[x->rank]);
    if (core)
        end = max2(end, *core);
    end += cost;
    s->cpu[x->rank] = end;
    if (core)
        *core = end;
    x->state = ST_CPU;
    return heap_push(s, end, g);
}

/* Both ends of a message are posted: it claims the ports at the end of
 * this instant (flush). */
static weft_status_t message_ready(struct sim *s, uint32_t snd)
{
    if (s->nready == s->readycap) {
        size_t cap = s->readycap ? 2 * s->readycap : 256;
        uint32_t *r = realloc(s->ready, cap * sizeof(*r));
        if (!r)
            return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot hold %zu ready messages",
                              cap);
        s->ready = r;
        s->readycap = cap;
    }
    s->ready[s->nready++] = snd;
    return WEFT_OK;
}

/* The message of send snd takes the ports, from t or once they are free. */
static weft_status_t transfer(struct sim *s, uint32_t snd, double t)
{
    uint32_t rcv = s->st[snd].partner;
    struct sstep *a = &s->st[snd], *b = &s->st[rcv];
    double alpha = NAN, beta = NAN;
    s->m->link(s->m->ctx, a->rank, a->peer, &alpha, &beta);
    if (!cost_ok(alpha) || !cost_ok(beta))
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "sim: the link %d -> %d costs alpha %g s, beta %g s/B (need finite, >= 0)",
                          a->rank, a->peer, alpha, beta);
    double start = max2(t, max2(s->sport[a->rank], s->rport[b->rank]));
    /* Within a machine a core copies the bytes. */
    double *core = s->core && s->m->cpu_group[a->rank] == s->m->cpu_group[b->rank]
                       ? first_core(s, b->rank)
                       : NULL;
    if (core)
        start = max2(start, *core);
    double end = start + alpha + a->bytes * beta;
    s->sport[a->rank] = s->rport[b->rank] = end;
    if (!s->m->host || s->m->host[a->rank] != s->m->host[a->peer]) {
        s->busy[a->rank] += a->bytes * beta;
        s->busy[s->nrep + b->rank] += a->bytes * beta;
    }
    if (core)
        *core = end;
    a->state = b->state = ST_MOVING;
    return heap_push(s, end, rcv);
}

static weft_status_t post(struct sim *s, uint32_t g, double t)
{
    struct sstep *x = &s->st[g];
    x->tpost = t;
    if (x->kind == WEFT_STEP_COPY)
        WEFT_CHECK(run_cpu(s, g, t, x->bytes * s->m->copy));
    else
        x->state = ST_POSTED;
    /* Posting is what RECV_REDUCE dependents and the link's next step wait for. */
    for (uint32_t e = s->dfirst[g]; e < s->dfirst[g + 1]; e++) {
        uint32_t d = s->dlist[e];
        if (s->st[d].kind == WEFT_STEP_RECV_REDUCE) {
            s->st[d].npost--;
            enqueue_if_ready(s, d);
        }
    }
    if (x->next_link != NONE) {
        s->st[x->next_link].npost--;
        enqueue_if_ready(s, x->next_link);
    }
    if (x->kind != WEFT_STEP_COPY && s->st[x->partner].state == ST_POSTED)
        WEFT_CHECK(message_ready(s, x->kind == WEFT_STEP_SEND ? g : x->partner));
    return WEFT_OK;
}

static weft_status_t complete(struct sim *s, uint32_t g, double t)
{
    s->st[g].state = ST_DONE;
    s->ndone++;
    s->finish = max2(s->finish, t);
    for (uint32_t e = s->dfirst[g]; e < s->dfirst[g + 1]; e++) {
        uint32_t d = s->dlist[e];
        struct sstep *y = &s->st[d];
        y->ndone--;
        if (y->kind == WEFT_STEP_RECV_REDUCE) {
            if (y->state == ST_LANDED && y->ndone == 0)
                WEFT_CHECK(run_cpu(s, d, t, y->bytes * s->m->gamma));
        } else {
            enqueue_if_ready(s, d);
        }
    }
    return WEFT_OK;
}

/* The event of step g at t: a message arrived (g is its receive), or a
 * reduce or copy finished. */
static weft_status_t handle(struct sim *s, uint32_t g, double t)
{
    struct sstep *x = &s->st[g];
    if (x->state == ST_CPU)
        return complete(s, g, t);
    WEFT_CHECK(complete(s, x->partner, t));
    if (x->kind == WEFT_STEP_RECV)
        return complete(s, g, t);
    x->state = ST_LANDED;
    if (x->ndone == 0)
        return run_cpu(s, g, t, x->bytes * s->m->gamma);
    return WEFT_OK;
}

static weft_status_t drain(struct sim *s, double t)
{
    while (s->qhead < s->qtail)
        WEFT_CHECK(post(s, s->queue[s->qhead++], t));
    return WEFT_OK;
}

static int cmp_issue(const void *a, const void *b, void *ctx)
{
    const struct sim *s = ctx;
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    double tx = s->st[x].tpost, ty = s->st[y].tpost;
    if (tx != ty)
        return tx < ty ? -1 : 1;
    size_t kx = x - s->rank_off[s->st[x].rank], ky = y - s->rank_off[s->st[y].rank];
    if (kx != ky)
        return kx < ky ? -1 : 1;
    return (x > y) - (x < y);
}

/* The messages that became ready at t claim their ports in issue order. */
static weft_status_t flush(struct sim *s, double t)
{
    if (s->nready > 1)
        qsort_r(s->ready, s->nready, sizeof(*s->ready), cmp_issue, s);
    for (size_t i = 0; i < s->nready; i++)
        WEFT_CHECK(transfer(s, s->ready[i], t));
    s->nready = 0;
    return WEFT_OK;
}

static weft_status_t run(struct sim *s)
{
    s->queue = malloc((s->n ? s->n : 1) * sizeof(*s->queue));
    if (!s->queue)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot queue %zu steps", s->n);
    for (uint32_t g = 0; g < s->n; g++)
        enqueue_if_ready(s, g);
    WEFT_CHECK(drain(s, 0));
    WEFT_CHECK(flush(s, 0));
    while (s->hn > 0) {
        double t = s->heap[0].t;
        while (s->hn > 0 && s->heap[0].t == t) {
            struct event e = heap_pop(s);
            WEFT_CHECK(handle(s, e.id, e.t));
            WEFT_CHECK(drain(s, t));
        }
        WEFT_CHECK(flush(s, t));
    }
    if (s->ndone == s->n)
        return WEFT_OK;
    static const char *const kinds[] = {"send", "receive", "receive-reduce", "copy"};
    size_t g = 0;
    while (s->st[g].state == ST_DONE)
        g++;
    const struct sstep *x = &s->st[g];
    int peer = x->kind == WEFT_STEP_COPY ? -1 : x->peer;
    return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                      "sim: the schedules deadlock: rank %d step %zu (%s, peer %d) never completes",
                      x->rank, g - s->rank_off[x->rank], kinds[x->kind], peer);
}

/* One run over nrep ranks (every rank, or the representatives of group
 * gkind, whose schedules reps holds); *open: the group did not fit. */
weft_status_t weft_sim_simulate(const struct weft_coll_desc *tmpl, const struct weft_sim_model *m,
                                int nrep, int gkind, const struct weft_schedule *reps,
                                struct weft_sim_result *res, bool *open)
{
    struct sim s = {.m = m, .p = tmpl->nranks, .nrep = nrep, .gkind = gkind};
    size_t n = (size_t)nrep;
    weft_status_t st = WEFT_OK;
    s.rank_off = malloc((n + 1) * sizeof(*s.rank_off));
    s.sport = calloc(n, sizeof(double));
    s.rport = calloc(n, sizeof(double));
    s.cpu = calloc(n, sizeof(double));
    s.busy = calloc(2 * n, sizeof(double));
    if (!s.rank_off || !s.sport || !s.rport || !s.cpu || !s.busy) {
        st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot allocate state for %d ranks", nrep);
        goto out;
    }
    if (m->cpu_group) {
        int groups = 0;
        for (size_t r = 0; r < n; r++) {
            if (m->cpu_group[r] < 0 || m->cpu_group[r] >= s.p) {
                st = weft_error(NULL, WEFT_ERR_INVALID_ARG, "sim: rank %zu is in cpu group %d",
                                r, m->cpu_group[r]);
                goto out;
            }
            groups = m->cpu_group[r] + 1 > groups ? m->cpu_group[r] + 1 : groups;
        }
        s.core_off = malloc(((size_t)groups + 1) * sizeof(*s.core_off));
        if (!s.core_off) {
            st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot allocate %d core groups", groups);
            goto out;
        }
        s.core_off[0] = 0;
        for (int g = 0; g < groups; g++) {
            int c = m->group_cores ? m->group_cores[g] : 1;
            if (c < 1 || c > 1 << 20) {
                st = weft_error(NULL, WEFT_ERR_INVALID_ARG, "sim: cpu group %d has %d cores", g, c);
                goto out;
            }
            s.core_off[g + 1] = s.core_off[g] + (size_t)c;
        }
        s.core = calloc(s.core_off[groups] ? s.core_off[groups] : 1, sizeof(double));
        if (!s.core) {
            st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot allocate %zu cores",
                            s.core_off[groups]);
            goto out;
        }
    }
    WEFT_CHECK_GOTO(load(&s, tmpl, reps), st, out);
    WEFT_CHECK_GOTO(match(&s, open), st, out);
    if (*open)
        goto out;
    WEFT_CHECK_GOTO(index_deps(&s), st, out);
    WEFT_CHECK_GOTO(run(&s), st, out);
    res->seconds = s.finish;
    res->shape = s.shape;
    res->port_seconds = 0;
    for (size_t i = 0; i < 2 * n; i++)
        res->port_seconds = max2(res->port_seconds, s.busy[i]);
    res->ranks_run = nrep;
    res->symmetry = gkind == WEFT_SIM_G_ROT   ? "rotation"
                    : gkind == WEFT_SIM_G_XOR ? "xor"
                                              : "none";
out:
    free(s.core);
    free(s.core_off);
    free(s.ready);
    free(s.queue);
    free(s.heap);
    free(s.dlist);
    free(s.dfirst);
    free(s.deps);
    free(s.st);
    free(s.busy);
    free(s.cpu);
    free(s.rport);
    free(s.sport);
    free(s.rank_off);
    return st;
}

weft_status_t weft_sim_run(const struct weft_coll_desc *tmpl, const struct weft_sim_model *m,
                           struct weft_sim_result *res)
{
    if (!tmpl || !m || !res)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "sim: %s is NULL",
                          !tmpl ? "the collective" : !m ? "the model" : "the result");
    if (tmpl->nranks < 1)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "sim: nranks %d is below 1", tmpl->nranks);
    if (!m->link || m->esize < 1 || !cost_ok(m->gamma) || !cost_ok(m->copy) || m->sym_ppn < 0 ||
        !(m->max_build_seconds >= 0))
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "sim: bad model (link %s, esize %zu, gamma %g s/B, copy %g s/B, "
                          "sym_ppn %d, max_build_seconds %g)",
                          m->link ? "set" : "NULL", m->esize, m->gamma, m->copy, m->sym_ppn,
                          m->max_build_seconds);
    if (m->sym_ppn > 0 && tmpl->nranks > 1 && !m->cpu_group && !m->host) {
        bool found = false;
        WEFT_CHECK(weft_sim_symmetric(tmpl, m, res, &found));
        if (found)
            return WEFT_OK;
    }
    bool open = false;
    return weft_sim_simulate(tmpl, m, tmpl->nranks, WEFT_SIM_G_NONE, NULL, res, &open);
}

weft_status_t weft_sim_predict(const struct weft_coll_desc *tmpl, const struct weft_sim_model *m,
                               double *seconds)
{
    struct weft_sim_result r;
    if (!seconds)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "sim: seconds is NULL");
    weft_status_t st = weft_sim_run(tmpl, m, &r);
    if (st == WEFT_OK)
        *seconds = r.seconds;
    return st;
}

/* ---- models ------------------------------------------------------------------- */

static void two_level_link(const void *ctx, int i, int j, double *alpha, double *beta)
{
    const struct weft_sim_cluster *c = ctx;
    if (c->ppn < 1) {
        *alpha = *beta = NAN;
        return;
    }
    bool same = i / c->ppn == j / c->ppn;
    *alpha = same ? c->intra_alpha : c->inter_alpha;
    *beta = same ? c->intra_beta : c->inter_beta;
}

void weft_sim_two_level(struct weft_sim_model *m, const struct weft_sim_cluster *c)
{
    m->link = two_level_link;
    m->ctx = c;
    m->sym_ppn = c->ppn > 0 ? c->ppn : 0;
}

static void table_link(const void *ctx, int i, int j, double *alpha, double *beta)
{
    struct weft_link l;
    if (weft_topo_table_get(ctx, i, j, &l) != WEFT_OK) {
        *alpha = *beta = NAN;
        return;
    }
    *alpha = l.alpha;
    *beta = l.beta;
}

void weft_sim_link_table(struct weft_sim_model *m, const struct weft_link_table *tab)
{
    m->link = table_link;
    m->ctx = tab;
}
