/*
 * parallel.c - data parallelism and ZeRO 1/2/3 over weft (see parallel.h).
 *
 * Layout: each model unit u (embeddings, one per layer, final LayerNorm)
 * is padded to n * s[u] floats, s[u] = ceil(len(u) / n), so that rank r
 * owns unit elements [r * s[u], (r + 1) * s[u]) of every unit.  Whole
 * buffers use the padded layout (poff); shard buffers hold the owned
 * slices of every unit back to back (soff).  Padding stays zero.
 *
 *   zero 0  params, grads, m, v whole        gradients: bucketed AllReduce
 *   zero 1  params, grads whole; m, v shard  per-unit ReduceScatter in place
 *   zero 2  params whole; grads, m, v shard  per-unit ReduceScatter of a
 *                                            scratch copy, every micro-batch
 *   zero 3  everything sharded               + AllGather of each unit before
 *                                            use, prefetching the next one
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parallel.h"

#define NSCRATCH 3 /* zero 2/3: unit-sized gradient buffers in flight */
#define NSLOT 2    /* zero 3: gathered units besides the embeddings */

enum { EMB = 0 };

/* A unit-sized gradient buffer whose ReduceScatter may be in flight. */
struct scratch {
    float *full;     /* (n * smax) */
    float *part;     /* (smax) the ReduceScatter result */
    int unit;        /* -1: free */
    weft_request_t req;
};

/* A gathered unit for zero 3. */
struct slot {
    float *buf;      /* (n * smax) */
    int unit;        /* -1: empty */
    bool ready, busy;
    weft_request_t req;
};

/*
 * Owner: the trainer.  Invariants: n >= 1; zero == 0 when n == 1; the
 * padding of every whole buffer is zero; requests in `pending` belong to
 * the current backward pass and are all waited for in par_end_backward.
 */
struct par {
    weft_comm_t comm;
    int rank, n, zero;
    const struct model_layout *lay;
    int nunits;
    size_t *s, *poff, *soff; /* (nunits) */
    size_t P, S, smax;
    float *params, *grads, *m, *v;
    long steps;
    bool backward, last;
    weft_status_t err;
    double wait_s;
    struct model_hooks hooks;
    /* zero 0 buckets: units [bucket_lo[b], bucket_lo[b + 1]) */
    int nbuckets, *bucket_of, *bucket_lo, *bucket_left;
    weft_request_t *pending;
    int npending, cap_pending;
    struct scratch scr[NSCRATCH];
    int scr_next;
    struct slot slot[NSLOT], emb;
    size_t comm_bytes;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void note(struct par *p, weft_status_t st, const char *what)
{
    if (st != WEFT_OK && p->err == WEFT_OK) {
        p->err = st;
        fprintf(stderr, "trainer: rank %d: %s: %s\n", p->rank, what,
                weft_last_error(p->comm));
    }
}

static void wait_req(struct par *p, weft_request_t *req, const char *what)
{
    if (*req == NULL)
        return;
    double t0 = now_s();
    note(p, weft_wait(*req), what);
    p->wait_s += now_s() - t0;
    *req = NULL;
}

static void pend(struct par *p, weft_request_t req)
{
    if (p->npending == p->cap_pending) {
        int cap = p->cap_pending ? 2 * p->cap_pending : 64;
        weft_request_t *n = realloc(p->pending, (size_t)cap * sizeof(*n));
        if (n == NULL) { /* cannot queue: finish it now */
            wait_req(p, &req, "gradient reduction");
            return;
        }
        p->pending = n;
        p->cap_pending = cap;
    }
    p->pending[p->npending++] = req;
}

static size_t unit_len(const struct par *p, int u)
{
    return p->lay->unit_off[u + 1] - p->lay->unit_off[u];
}

static float *zalloc(size_t nfloats)
{
    /* calloc of a large block maps fresh zero pages; touching them once here
     * keeps first-touch faults out of the timed steps. */
    float *f = calloc(nfloats ? nfloats : 1, sizeof(float));
    if (f)
        memset(f, 0, nfloats * sizeof(float));
    return f;
}

/* ---- hooks ------------------------------------------------------------- */

static void start_gather(struct par *p, struct slot *sl, int u)
{
    sl->unit = u;
    sl->ready = false;
    sl->req = NULL;
    if (p->err != WEFT_OK)
        return;
    note(p, weft_iallgather(p->params + p->soff[u], sl->buf, p->s[u], WEFT_FLOAT32, p->comm,
                            &sl->req),
         "parameter gather");
}

static struct slot *find_slot(struct par *p, int u)
{
    for (int i = 0; i < NSLOT; i++)
        if (p->slot[i].unit == u)
            return &p->slot[i];
    return NULL;
}

static struct slot *free_slot(struct par *p)
{
    for (int i = 0; i < NSLOT; i++)
        if (!p->slot[i].busy && p->slot[i].req == NULL)
            return &p->slot[i];
    return NULL;
}

/* The unit after u in the order the current pass uses them (-1: none). */
static int next_unit(const struct par *p, int u)
{
    if (!p->backward)
        return u + 1 < p->nunits ? u + 1 : -1;
    if (u == p->nunits - 1) /* head backward: the last layer comes next */
        return p->nunits - 2 > EMB ? p->nunits - 2 : -1;
    return u - 1 > EMB ? u - 1 : -1;
}

static const float *hook_params(void *ctx, int u)
{
    struct par *p = ctx;
    if (p->zero < 3)
        return p->params + p->poff[u];
    if (u == EMB) { /* used at both ends of every pass: kept for the step */
        if (p->emb.unit != EMB)
            start_gather(p, &p->emb, EMB);
        wait_req(p, &p->emb.req, "parameter gather");
        return p->emb.buf;
    }
    struct slot *sl = find_slot(p, u);
    if (sl == NULL) {
        sl = free_slot(p);
        if (sl == NULL) { /* both hold prefetches: drop one */
            sl = p->slot[0].busy ? &p->slot[1] : &p->slot[0];
            wait_req(p, &sl->req, "parameter gather");
        }
        start_gather(p, sl, u);
    }
    wait_req(p, &sl->req, "parameter gather");
    sl->busy = true;
    int nx = next_unit(p, u);
    if (nx > EMB && find_slot(p, nx) == NULL) {
        struct slot *pre = free_slot(p);
        if (pre)
            start_gather(p, pre, nx);
    }
    return sl->buf;
}

static void hook_params_done(void *ctx, int u)
{
    struct par *p = ctx;
    if (p->zero < 3 || u == EMB)
        return;
    struct slot *sl = find_slot(p, u);
    if (sl) {
        sl->busy = false;
        sl->unit = -1;
    }
}

/* zero 2/3: folds a finished ReduceScatter into the gradient shard. */
static void retire(struct par *p, struct scratch *sc)
{
    if (sc->unit < 0)
        return;
    wait_req(p, &sc->req, "gradient reduce-scatter");
    float *dst = p->grads + p->soff[sc->unit];
    for (size_t i = 0; i < p->s[sc->unit]; i++)
        dst[i] += sc->part[i];
    sc->unit = -1;
}

static float *hook_grads(void *ctx, int u)
{
    struct par *p = ctx;
    if (p->zero < 2)
        return p->grads + p->poff[u];
    /* The embeddings' buffer stays open for the whole backward pass (its
     * wte part is written first and last), so skip buffers being written. */
    struct scratch *sc = &p->scr[p->scr_next];
    for (int k = 0; k < NSCRATCH && sc->unit < -1; k++) {
        p->scr_next = (p->scr_next + 1) % NSCRATCH;
        sc = &p->scr[p->scr_next];
    }
    p->scr_next = (p->scr_next + 1) % NSCRATCH;
    retire(p, sc);
    memset(sc->full, 0, p->n * p->s[u] * sizeof(float));
    sc->unit = -2 - u; /* being written */
    return sc->full;
}

static void reduce_bucket(struct par *p, int b)
{
    size_t lo = p->poff[p->bucket_lo[b]], hi = p->poff[p->bucket_lo[b + 1]];
    weft_request_t req = NULL;
    note(p, weft_iallreduce(p->grads + lo, p->grads + lo, hi - lo, WEFT_FLOAT32, WEFT_SUM,
                            p->comm, &req),
         "gradient allreduce");
    if (req)
        pend(p, req);
}

static void hook_grads_done(void *ctx, int u)
{
    struct par *p = ctx;
    if (p->n == 1 || p->err != WEFT_OK)
        return;
    if (p->zero == 0) {
        if (p->last && --p->bucket_left[p->bucket_of[u]] == 0)
            reduce_bucket(p, p->bucket_of[u]);
        return;
    }
    if (p->zero == 1) {
        if (!p->last)
            return;
        float *g = p->grads + p->poff[u];
        weft_request_t req = NULL;
        note(p, weft_ireduce_scatter(g, g + (size_t)p->rank * p->s[u], p->s[u], WEFT_FLOAT32,
                                     WEFT_SUM, p->comm, &req),
             "gradient reduce-scatter");
        if (req)
            pend(p, req);
        return;
    }
    for (int i = 0; i < NSCRATCH; i++) {
        struct scratch *sc = &p->scr[i];
        if (sc->unit != -2 - u)
            continue;
        sc->unit = u;
        note(p, weft_ireduce_scatter(sc->full, sc->part, p->s[u], WEFT_FLOAT32, WEFT_SUM,
                                     p->comm, &sc->req),
             "gradient reduce-scatter");
        return;
    }
}

/* ---- life cycle ----------------------------------------------------------- */

struct par *par_create(weft_comm_t comm, int zero, const struct model_layout *lay,
                       size_t bucket_bytes)
{
    struct par *p = calloc(1, sizeof(*p));
    if (p == NULL)
        goto oom;
    p->comm = comm;
    p->n = 1;
    if (comm) {
        weft_comm_rank(comm, &p->rank);
        weft_comm_size(comm, &p->n);
    }
    p->zero = p->n > 1 ? zero : 0;
    p->lay = lay;
    p->nunits = lay->nunits;
    int U = p->nunits;
    p->s = calloc((size_t)U, sizeof(size_t));
    p->poff = calloc((size_t)U + 1, sizeof(size_t));
    p->soff = calloc((size_t)U + 1, sizeof(size_t));
    p->bucket_of = calloc((size_t)U, sizeof(int));
    p->bucket_lo = calloc((size_t)U + 1, sizeof(int));
    p->bucket_left = calloc((size_t)U, sizeof(int));
    if (!p->s || !p->poff || !p->soff || !p->bucket_of || !p->bucket_lo || !p->bucket_left)
        goto oom;
    for (int u = 0; u < U; u++) {
        p->s[u] = (unit_len(p, u) + (size_t)p->n - 1) / (size_t)p->n;
        p->poff[u + 1] = p->poff[u] + (size_t)p->n * p->s[u];
        p->soff[u + 1] = p->soff[u] + p->s[u];
        if (p->s[u] > p->smax)
            p->smax = p->s[u];
    }
    p->P = p->poff[U];
    p->S = p->soff[U];
    /* Buckets of whole units, filled from the last unit (backward order). */
    size_t acc = 0;
    int nb = 0;
    p->bucket_lo[0] = 0;
    for (int u = U - 1; u >= 0; u--) {
        p->bucket_of[u] = nb;
        acc += p->n * p->s[u] * sizeof(float);
        if (acc >= bucket_bytes || u == 0) {
            nb++;
            acc = 0;
        }
    }
    p->nbuckets = nb;
    for (int u = 0; u < U; u++) /* bucket numbers descend with u */
        p->bucket_of[u] = nb - 1 - p->bucket_of[u];
    for (int u = U - 1; u >= 0; u--)
        p->bucket_lo[p->bucket_of[u]] = u;
    p->bucket_lo[nb] = U;

    for (int i = 0; i < NSCRATCH; i++)
        p->scr[i].unit = -1;
    for (int i = 0; i < NSLOT; i++)
        p->slot[i].unit = -1;
    p->emb.unit = -1;
    size_t whole = p->P, shard = p->S;
    p->params = zalloc(p->zero == 3 ? shard : whole);
    p->grads = zalloc(p->zero >= 2 ? shard : whole);
    p->m = zalloc(p->zero >= 1 ? shard : whole);
    p->v = zalloc(p->zero >= 1 ? shard : whole);
    if (!p->params || !p->grads || !p->m || !p->v)
        goto oom;
    size_t unit_floats = (size_t)p->n * p->smax;
    if (p->zero >= 2)
        for (int i = 0; i < NSCRATCH; i++) {
            p->scr[i].full = zalloc(unit_floats);
            p->scr[i].part = zalloc(p->smax);
            if (!p->scr[i].full || !p->scr[i].part)
                goto oom;
            p->comm_bytes += (unit_floats + p->smax) * sizeof(float);
        }
    if (p->zero == 3) {
        for (int i = 0; i < NSLOT; i++) {
            p->slot[i].buf = zalloc(unit_floats);
            if (!p->slot[i].buf)
                goto oom;
        }
        p->emb.buf = zalloc((size_t)p->n * p->s[EMB]);
        if (!p->emb.buf)
            goto oom;
        p->comm_bytes += (NSLOT * unit_floats + (size_t)p->n * p->s[EMB]) * sizeof(float);
    }
    p->hooks = (struct model_hooks){p, hook_params, hook_params_done, hook_grads,
                                    hook_grads_done, NULL};
    return p;
oom:
    fprintf(stderr, "trainer: out of memory for the model state\n");
    par_destroy(p);
    return NULL;
}

void par_destroy(struct par *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < NSCRATCH; i++) {
        free(p->scr[i].full);
        free(p->scr[i].part);
    }
    for (int i = 0; i < NSLOT; i++)
        free(p->slot[i].buf);
    free(p->emb.buf);
    free(p->params);
    free(p->grads);
    free(p->m);
    free(p->v);
    free(p->pending);
    free(p->s);
    free(p->poff);
    free(p->soff);
    free(p->bucket_of);
    free(p->bucket_lo);
    free(p->bucket_left);
    free(p);
}

/* Where this rank keeps its slice of unit u for a buffer kept whole
 * (padded layout) or sharded. */
static float *owned(const struct par *p, float *buf, bool whole, int u)
{
    return whole ? buf + p->poff[u] + (size_t)p->rank * p->s[u] : buf + p->soff[u];
}

/* Elements of unit u that rank r's slice really holds (the rest is padding). */
static size_t owned_len(const struct par *p, int u, int r)
{
    size_t lo = (size_t)r * p->s[u], len = unit_len(p, u);
    return lo >= len ? 0 : len - lo < p->s[u] ? len - lo : p->s[u];
}

void par_import(struct par *p, const float *params, const float *m, const float *v, long step)
{
    for (int u = 0; u < p->nunits; u++) {
        const size_t off = p->lay->unit_off[u], len = unit_len(p, u);
        if (p->zero < 3)
            memcpy(p->params + p->poff[u], params + off, len * sizeof(float));
        else
            memcpy(owned(p, p->params, false, u), params + off + (size_t)p->rank * p->s[u],
                   owned_len(p, u, p->rank) * sizeof(float));
        const float *src[2] = {m, v};
        float *dst[2] = {p->m, p->v};
        for (int k = 0; k < 2; k++) {
            if (src[k] == NULL)
                continue;
            if (p->zero == 0)
                memcpy(dst[k] + p->poff[u], src[k] + off, len * sizeof(float));
            else
                memcpy(owned(p, dst[k], false, u), src[k] + off + (size_t)p->rank * p->s[u],
                       owned_len(p, u, p->rank) * sizeof(float));
        }
    }
    p->steps = step;
    p->emb.unit = -1;
}

weft_status_t par_export(struct par *p, int which, float *out)
{
    float *buf = which == 0 ? p->params : which == 1 ? p->m : p->v;
    bool whole = which == 0 ? p->zero < 3 : p->zero == 0;
    float *tmp = whole ? NULL : malloc((size_t)p->n * p->smax * sizeof(float));
    if (!whole && tmp == NULL)
        return WEFT_ERR_NO_MEMORY;
    weft_status_t st = WEFT_OK;
    for (int u = 0; u < p->nunits && st == WEFT_OK; u++) {
        const float *full = buf + p->poff[u];
        if (!whole) {
            double t0 = now_s();
            st = weft_allgather(owned(p, buf, false, u), tmp, p->s[u], WEFT_FLOAT32, p->comm);
            p->wait_s += now_s() - t0;
            full = tmp;
        }
        if (out)
            memcpy(out + p->lay->unit_off[u], full, unit_len(p, u) * sizeof(float));
    }
    free(tmp);
    return st;
}

/* ---- a step --------------------------------------------------------------- */

const struct model_hooks *par_hooks(struct par *p)
{
    return &p->hooks;
}

void par_zero_grads(struct par *p)
{
    memset(p->grads, 0, (p->zero >= 2 ? p->S : p->P) * sizeof(float));
}

void par_begin_forward(struct par *p)
{
    p->backward = false;
}

void par_begin_backward(struct par *p, bool last)
{
    p->backward = true;
    p->last = last;
    for (int b = 0; b < p->nbuckets; b++)
        p->bucket_left[b] = p->bucket_lo[b + 1] - p->bucket_lo[b];
}

weft_status_t par_end_backward(struct par *p)
{
    for (int i = 0; i < p->npending; i++)
        wait_req(p, &p->pending[i], "gradient reduction");
    p->npending = 0;
    for (int i = 0; i < NSCRATCH; i++)
        retire(p, &p->scr[i]);
    for (int i = 0; i < NSLOT; i++) { /* prefetches nobody asked for */
        wait_req(p, &p->slot[i].req, "parameter gather");
        p->slot[i].unit = -1;
        p->slot[i].busy = false;
    }
    p->backward = false;
    return p->err;
}

weft_status_t par_sum(struct par *p, double *v, int n)
{
    if (p->n == 1)
        return WEFT_OK;
    double t0 = now_s();
    weft_status_t st = weft_allreduce(v, v, (size_t)n, WEFT_FLOAT64, WEFT_SUM, p->comm);
    p->wait_s += now_s() - t0;
    return st;
}

weft_status_t par_step(struct par *p, const struct adamw *o, int global, float *norm)
{
    if (p->err != WEFT_OK)
        return p->err;
    const float scale = 1.0f / (float)global;
    /* Global norm of the averaged gradient, from what each rank owns. */
    double sq = 0;
    for (int u = 0; u < p->nunits; u++) {
        const float *g = p->zero == 0 ? p->grads + p->poff[u]
                                      : owned(p, p->grads, p->zero == 1, u);
        size_t len = p->zero == 0 ? unit_len(p, u) : owned_len(p, u, p->rank);
        for (size_t i = 0; i < len; i++)
            sq += (double)(g[i] * scale) * (double)(g[i] * scale);
    }
    weft_status_t st = p->zero == 0 ? WEFT_OK : par_sum(p, &sq, 1);
    if (st != WEFT_OK)
        return st;
    *norm = (float)sqrt(sq);
    float c = o->clip > 0 && *norm > o->clip ? o->clip / *norm : 1.0f;
    const float gs = scale * c;
    p->steps++;
    const float b1c = 1.0f - powf(o->beta1, (float)p->steps);
    const float b2c = 1.0f - powf(o->beta2, (float)p->steps);
    for (int u = 0; u < p->nunits; u++) {
        size_t len = p->zero == 0 ? unit_len(p, u) : owned_len(p, u, p->rank);
        float *w = p->zero == 0 ? p->params + p->poff[u] : owned(p, p->params, p->zero < 3, u);
        const float *g = p->zero == 0 ? p->grads + p->poff[u]
                                      : owned(p, p->grads, p->zero == 1, u);
        float *m = p->zero == 0 ? p->m + p->poff[u] : owned(p, p->m, false, u);
        float *v = p->zero == 0 ? p->v + p->poff[u] : owned(p, p->v, false, u);
        for (size_t i = 0; i < len; i++) {
            float gi = g[i] * gs;
            m[i] = o->beta1 * m[i] + (1.0f - o->beta1) * gi;
            v[i] = o->beta2 * v[i] + (1.0f - o->beta2) * gi * gi;
            float mh = m[i] / b1c, vh = v[i] / b2c;
            w[i] -= o->lr * (mh / (sqrtf(vh) + o->eps) + o->weight_decay * w[i]);
        }
    }
    p->emb.unit = -1; /* gathered embeddings are stale now */
    if (p->zero == 1 || p->zero == 2) {
        /* Each rank updated its slice; make the parameters whole again. */
        for (int u = 0; u < p->nunits; u++) {
            weft_request_t req = NULL;
            float *w = p->params + p->poff[u];
            note(p, weft_iallgather(w + (size_t)p->rank * p->s[u], w, p->s[u], WEFT_FLOAT32,
                                    p->comm, &req),
                 "parameter allgather");
            if (req)
                pend(p, req);
        }
        for (int i = 0; i < p->npending; i++)
            wait_req(p, &p->pending[i], "parameter allgather");
        p->npending = 0;
    }
    return p->err;
}

struct par_memory par_memory(const struct par *p)
{
    size_t f = sizeof(float);
    return (struct par_memory){
        .params = (p->zero == 3 ? p->S : p->P) * f,
        .grads = (p->zero >= 2 ? p->S : p->P) * f,
        .optimizer = 2 * (p->zero >= 1 ? p->S : p->P) * f,
        .comm = p->comm_bytes,
    };
}

double par_wait_seconds(const struct par *p)
{
    return p->wait_s;
}

long par_steps(const struct par *p)
{
    return p->steps;
}
