/*
 * parallel.c - data parallelism and ZeRO 1/2/3 over weft (see parallel.h).
 *
 * Layout: each local unit u (see model.h) is padded to n * s[u] floats,
 * s[u] = ceil(len(u) / n), so that data-parallel rank r owns unit elements
 * [r * s[u], (r + 1) * s[u]) of every unit.  Whole buffers use the padded
 * layout (poff); shard buffers hold the owned slices of every unit back to
 * back (soff).  Padding stays zero.
 *
 *   zero 0  params, grads, m, v whole        gradients: bucketed AllReduce
 *   zero 1  params, grads whole; m, v shard  per-unit ReduceScatter in place
 *   zero 2  params whole; grads, m, v shard  per-unit ReduceScatter of a
 *                                            scratch copy, every micro-batch
 *   zero 3  everything sharded               + AllGather of each unit before
 *                                            use, prefetching the next one
 * Deterministic mode replaces the gradient path of every stage: a unit's
 * gradient of one micro-batch goes to a zeroed scratch, is reduce-scattered
 * in the canonical tree (blocking), and lands in that micro-batch's item of
 * a tree accumulator over the shard; the step takes the accumulator's sum
 * (and zero 0/1 gather it whole).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "detsum.h"
#include "parallel.h"

#define NSCRATCH 3 /* zero 2/3: unit-sized gradient buffers in flight */
#define NSLOT 2    /* zero 3: gathered units besides the kept one */
/* Floats per offload chunk: a sixteenth of the moments, within 4 KiB..1 MiB,
 * so the four chunk buffers stay a quarter of what they stand for. */
#define OFFLOAD_CHUNK_MIN 1024
#define OFFLOAD_CHUNK_MAX (256 * 1024)

/* A unit-sized gradient buffer whose ReduceScatter may be in flight. */
struct scratch {
    float *full;     /* (n * smax) */
    float *part;     /* (smax) the ReduceScatter result */
    int unit;        /* -1: free; -2 - u: being written for unit u */
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
 * the current backward pass and are all waited for in par_end_backward;
 * in deterministic mode `item` is the accumulator slot of the micro-batch
 * whose backward pass is running (NULL outside one).
 */
struct par {
    struct par_config cfg;
    weft_comm_t comm; /* dp */
    int rank, n, zero, tp;
    const struct model *model;
    const struct model_layout *lay;
    int nunits, keep; /* keep: the unit used at both ends of a pass (-1: none) */
    size_t *s, *poff, *soff; /* (nunits) */
    size_t P, S, smax;
    float *params, *grads, *m, *v;
    long steps;
    bool backward, last;
    weft_status_t err;
    char errtext[512];
    double wait_s;
    struct model_hooks hooks;
    /* zero 0 buckets: units [bucket_lo[b], bucket_lo[b + 1]) */
    int nbuckets, *bucket_of, *bucket_lo, *bucket_left;
    weft_request_t *pending;
    int npending, cap_pending;
    struct scratch scr[NSCRATCH];
    int scr_next;
    struct slot slot[NSLOT], kept;
    size_t comm_bytes;
    /* deterministic mode */
    struct tacc *acc;  /* over the shard (S floats), one item per micro-batch */
    float *item;
    float *det_scratch; /* (n * smax) */
    void *tp_scratch;
    size_t tp_scratch_bytes;
    /* tied wte */
    weft_comm_t tie_comm;
    int tie_peer, tie_unit;
    bool tie_send;
    struct offload *off;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void fail(struct par *p, weft_status_t st, const char *what, const char *why)
{
    if (p->err != WEFT_OK)
        return;
    p->err = st;
    snprintf(p->errtext, sizeof(p->errtext), "%s: %s", what, why);
    fprintf(stderr, "trainer: %s\n", p->errtext);
}

static void note(struct par *p, weft_status_t st, const char *what)
{
    if (st != WEFT_OK)
        fail(p, st, what, weft_last_error(p->comm));
}

static void note_det(struct par *p, weft_status_t st, weft_comm_t c, const char *what)
{
    if (st != WEFT_OK)
        fail(p, st, what, det_last_error(c));
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

static void wait_pending(struct par *p, const char *what)
{
    for (int i = 0; i < p->npending; i++)
        wait_req(p, &p->pending[i], what);
    p->npending = 0;
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

/* The unit after u in the order the current pass uses them (-1: none):
 * a guess for prefetching only. */
static int next_unit(const struct par *p, int u)
{
    int nx = p->backward ? u - 1 : u + 1;
    return nx >= 0 && nx < p->nunits && nx != p->keep ? nx : -1;
}

static const float *hook_params(void *ctx, int u)
{
    struct par *p = ctx;
    if (p->zero < 3)
        return p->params + p->poff[u];
    if (u == p->keep) { /* used at both ends of every pass: kept for the step */
        if (p->kept.unit != u)
            start_gather(p, &p->kept, u);
        wait_req(p, &p->kept.req, "parameter gather");
        return p->kept.buf;
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
    if (nx >= 0 && find_slot(p, nx) == NULL) {
        struct slot *pre = free_slot(p);
        if (pre)
            start_gather(p, pre, nx);
    }
    return sl->buf;
}

static void hook_params_done(void *ctx, int u)
{
    struct par *p = ctx;
    if (p->zero < 3 || u == p->keep)
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
    if (p->zero < 2 && !p->cfg.det)
        return p->grads + p->poff[u];
    /* A fresh zeroed buffer for the unit; skip buffers being written. */
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

static struct scratch *written(struct par *p, int u)
{
    for (int i = 0; i < NSCRATCH; i++)
        if (p->scr[i].unit == -2 - u)
            return &p->scr[i];
    return NULL;
}

/* Deterministic mode: the unit's gradient of this micro-batch, reduced in
 * the canonical tree, into the micro-batch's accumulator item. */
static void det_grads_done(struct par *p, int u)
{
    struct scratch *sc = written(p, u);
    if (sc == NULL)
        return;
    sc->unit = -1;
    if (p->err != WEFT_OK || p->item == NULL)
        return;
    float *dst = p->item + p->soff[u];
    if (p->n == 1) {
        memcpy(dst, sc->full, p->s[u] * sizeof(float));
        return;
    }
    double t0 = now_s();
    weft_status_t st;
    if (p->n & (p->n - 1)) /* not a power of two: weft's own fixed order */
        st = weft_reduce_scatter(sc->full, dst, p->s[u], WEFT_FLOAT32, WEFT_SUM, p->comm);
    else
        st = det_reduce_scatter(p->comm, sc->full, dst, p->s[u], p->det_scratch);
    p->wait_s += now_s() - t0;
    note_det(p, st, p->comm, "gradient reduce-scatter");
}

static void hook_grads_done(void *ctx, int u)
{
    struct par *p = ctx;
    if (p->cfg.det) {
        det_grads_done(p, u);
        return;
    }
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
    struct scratch *sc = written(p, u);
    if (sc == NULL)
        return;
    sc->unit = u;
    note(p, weft_ireduce_scatter(sc->full, sc->part, p->s[u], WEFT_FLOAT32, WEFT_SUM, p->comm,
                                 &sc->req),
         "gradient reduce-scatter");
}

/* The model's tensor-parallel sums and maxima. */
static int hook_tp_allreduce(void *ctx, void *buf, size_t count, bool dbl, int op)
{
    struct par *p = ctx;
    if (p->err != WEFT_OK)
        return -1;
    weft_dtype_t dt = dbl ? WEFT_FLOAT64 : WEFT_FLOAT32;
    size_t bytes = count * (dbl ? sizeof(double) : sizeof(float));
    double t0 = now_s();
    weft_status_t st;
    if (op == 1 || !p->cfg.det) {
        st = weft_allreduce(buf, buf, count, dt, op == 1 ? WEFT_MAX : WEFT_SUM, p->cfg.tp);
        if (st != WEFT_OK)
            fail(p, st, "tensor-parallel allreduce", weft_last_error(p->cfg.tp));
    } else {
        if (bytes > p->tp_scratch_bytes) {
            void *n = realloc(p->tp_scratch, bytes);
            if (n == NULL) {
                fail(p, WEFT_ERR_NO_MEMORY, "tensor-parallel allreduce", "out of memory");
                return -1;
            }
            p->tp_scratch = n;
            p->tp_scratch_bytes = bytes;
        }
        st = det_allreduce(p->cfg.tp, buf, count, dt, p->tp_scratch);
        note_det(p, st, p->cfg.tp, "tensor-parallel allreduce");
    }
    p->wait_s += now_s() - t0;
    return st == WEFT_OK ? 0 : -1;
}
/* ---- life cycle ----------------------------------------------------------- */

struct par *par_create(const struct par_config *cfg, const struct model *model)
{
    const struct model_layout *lay = model_layout(model);
    struct par *p = calloc(1, sizeof(*p));
    if (p == NULL)
        goto oom;
    p->cfg = *cfg;
    p->comm = cfg->dp;
    p->n = p->tp = 1;
    if (cfg->dp) {
        weft_comm_rank(cfg->dp, &p->rank);
        weft_comm_size(cfg->dp, &p->n);
    }
    if (cfg->tp)
        weft_comm_size(cfg->tp, &p->tp);
    p->zero = p->n > 1 ? cfg->zero : 0;
    p->model = model;
    p->lay = lay;
    p->nunits = lay->nunits;
    p->keep = model_first(model) && model_last(model) ? 0 : -1; /* wte: embedding and head */
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
        if (acc >= cfg->bucket_bytes || u == 0) {
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
    p->kept.unit = -1;
    size_t whole = p->P, shard = p->S;
    size_t moments = p->zero >= 1 ? shard : whole;
    p->params = zalloc(p->zero == 3 ? shard : whole);
    p->grads = zalloc(p->zero >= 2 ? shard : whole);
    if (!p->params || !p->grads)
        goto oom;
    char err[512];
    size_t chunk = moments / 16;
    chunk = chunk < OFFLOAD_CHUNK_MIN ? OFFLOAD_CHUNK_MIN
                                      : chunk > OFFLOAD_CHUNK_MAX ? OFFLOAD_CHUNK_MAX : chunk;
    p->off = offload_create(&cfg->offload, cfg->world_rank, moments, 2, chunk, err, sizeof(err));
    if (p->off == NULL) {
        fprintf(stderr, "trainer: %s\n", err);
        goto fail;
    }
    size_t unit_floats = (size_t)p->n * p->smax;
    if (p->zero >= 2 || cfg->det)
        for (int i = 0; i < NSCRATCH; i++) {
            p->scr[i].full = zalloc(unit_floats);
            p->scr[i].part = zalloc(p->smax);
            if (!p->scr[i].full || !p->scr[i].part)
                goto oom;
            p->comm_bytes += (unit_floats + p->smax) * sizeof(float);
        }
    if (cfg->det) {
        p->acc = tacc_create(p->S, cfg->micro > 0 ? cfg->micro : 1);
        p->det_scratch = zalloc(unit_floats);
        if (!p->acc || !p->det_scratch)
            goto oom;
        int items = 0;
        for (int k = cfg->micro > 0 ? cfg->micro : 1; k > 0; k /= 2)
            items++;
        p->comm_bytes += ((size_t)(items + 1) * p->S + unit_floats) * sizeof(float);
    }
    if (p->zero == 3) {
        for (int i = 0; i < NSLOT; i++) {
            p->slot[i].buf = zalloc(unit_floats);
            if (!p->slot[i].buf)
                goto oom;
        }
        p->comm_bytes += NSLOT * unit_floats * sizeof(float);
        if (p->keep >= 0) {
            p->kept.buf = zalloc((size_t)p->n * p->s[p->keep]);
            if (!p->kept.buf)
                goto oom;
            p->comm_bytes += (size_t)p->n * p->s[p->keep] * sizeof(float);
        }
    }
    p->hooks = (struct model_hooks){p, hook_params, hook_params_done, hook_grads,
                                    hook_grads_done, hook_tp_allreduce};
    p->tie_unit = -1;
    return p;
oom:
    fprintf(stderr, "trainer: out of memory for the model state\n");
fail:
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
    free(p->kept.buf);
    free(p->params);
    free(p->grads);
    offload_destroy(p->off);
    tacc_destroy(p->acc);
    free(p->det_scratch);
    free(p->tp_scratch);
    free(p->pending);
    free(p->s);
    free(p->poff);
    free(p->soff);
    free(p->bucket_of);
    free(p->bucket_lo);
    free(p->bucket_left);
    free(p);
}

void par_tie(struct par *p, weft_comm_t comm, int peer, int unit, bool send)
{
    p->tie_comm = comm;
    p->tie_peer = peer;
    p->tie_unit = unit;
    p->tie_send = send;
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

/* The moments' layout: whole (zero 0) or this rank's shard. */
static bool moments_whole(const struct par *p)
{
    return p->zero == 0;
}

/* An unpadded local-layout array into the moments' layout (whole or this
 * rank's shard). */
static void to_moments(const struct par *p, const float *flat, float *mom)
{
    for (int u = 0; u < p->nunits; u++) {
        size_t off = p->lay->unit_off[u];
        if (moments_whole(p))
            memcpy(mom + p->poff[u], flat + off, unit_len(p, u) * sizeof(float));
        else
            memcpy(mom + p->soff[u], flat + off + (size_t)p->rank * p->s[u],
                   owned_len(p, u, p->rank) * sizeof(float));
    }
}

int par_import(struct par *p, const float *params, const float *m, const float *v, long step)
{
    for (int u = 0; u < p->nunits; u++) {
        const size_t off = p->lay->unit_off[u], len = unit_len(p, u);
        if (p->zero < 3)
            memcpy(p->params + p->poff[u], params + off, len * sizeof(float));
        else
            memcpy(owned(p, p->params, false, u), params + off + (size_t)p->rank * p->s[u],
                   owned_len(p, u, p->rank) * sizeof(float));
    }
    size_t nm = moments_whole(p) ? p->P : p->S;
    const float *src[2] = {m, v};
    float *tmp = NULL;
    for (int k = 0; k < 2; k++) {
        if (src[k] == NULL)
            continue;
        if (tmp == NULL && (tmp = zalloc(nm)) == NULL) {
            fprintf(stderr, "trainer: out of memory for the optimizer state\n");
            return -1;
        }
        to_moments(p, src[k], tmp);
        if (offload_store(p->off, k, tmp) != 0) {
            fprintf(stderr, "trainer: %s\n", offload_error(p->off));
            free(tmp);
            return -1;
        }
    }
    free(tmp);
    p->steps = step;
    p->kept.unit = -1;
    return 0;
}

/* Every unit of buf (whole: padded layout; else this rank's shards,
 * gathered into tmp) into out's unpadded layout. */
static weft_status_t export_units(struct par *p, float *buf, bool whole, float *out, float *tmp)
{
    weft_status_t st = WEFT_OK;
    for (int u = 0; u < p->nunits && st == WEFT_OK; u++) {
        const float *full = buf + p->poff[u];
        if (!whole) {
            double t0 = now_s();
            st = weft_allgather(buf + p->soff[u], tmp, p->s[u], WEFT_FLOAT32, p->comm);
            p->wait_s += now_s() - t0;
            full = tmp;
        }
        if (out)
            memcpy(out + p->lay->unit_off[u], full, unit_len(p, u) * sizeof(float));
    }
    return st;
}

weft_status_t par_export(struct par *p, int which, float *out)
{
    float *tmp = malloc((size_t)p->n * p->smax * sizeof(float));
    float *mom = which > 0 ? zalloc(moments_whole(p) ? p->P : p->S) : NULL;
    weft_status_t st = WEFT_ERR_NO_MEMORY;
    if (tmp && which == 0)
        st = export_units(p, p->params, p->zero < 3, out, tmp);
    else if (tmp && mom) {
        /* A failed load still takes part in the gathers (with zeros), so
         * the other ranks learn of it from the result, not a hang. */
        bool loaded = offload_load(p->off, which - 1, mom) == 0;
        if (!loaded)
            fail(p, WEFT_ERR_SYSTEM, "optimizer state", offload_error(p->off));
        st = export_units(p, mom, moments_whole(p), out, tmp);
        if (!loaded)
            st = WEFT_ERR_SYSTEM;
    }
    free(mom);
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
    if (p->acc)
        tacc_reset(p->acc);
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
    if (p->acc) {
        /* Units that get no gradient in this pass (a stage's wte copy)
         * must add zeros. */
        p->item = tacc_slot(p->acc);
        if (p->item)
            memset(p->item, 0, p->S * sizeof(float));
        else
            fail(p, WEFT_ERR_INVALID_ARG, "gradient accumulation", "more micro-batches than planned");
    }
}

weft_status_t par_end_backward(struct par *p)
{
    wait_pending(p, "gradient reduction");
    for (int i = 0; i < NSCRATCH; i++)
        retire(p, &p->scr[i]);
    for (int i = 0; i < NSLOT; i++) { /* prefetches nobody asked for */
        wait_req(p, &p->slot[i].req, "parameter gather");
        p->slot[i].unit = -1;
        p->slot[i].busy = false;
    }
    if (p->acc && p->item) {
        tacc_commit(p->acc);
        p->item = NULL;
    }
    p->backward = false;
    return p->err;
}

weft_status_t par_sum(struct par *p, double *v, int n)
{
    if (p->cfg.world == NULL)
        return WEFT_OK;
    double t0 = now_s();
    weft_status_t st = weft_allreduce(v, v, (size_t)n, WEFT_FLOAT64, WEFT_SUM, p->cfg.world);
    p->wait_s += now_s() - t0;
    if (st != WEFT_OK)
        fail(p, st, "sum over ranks", weft_last_error(p->cfg.world));
    return st;
}

/* Deterministic mode: the accumulated gradient shard into the gradient
 * buffer (whole for zero 0/1). */
static void det_finish(struct par *p)
{
    const float *sum = tacc_finish(p->acc, NULL);
    if (sum == NULL)
        return;
    if (p->zero >= 2) {
        memcpy(p->grads, sum, p->S * sizeof(float));
        return;
    }
    for (int u = 0; u < p->nunits && p->err == WEFT_OK; u++) {
        float *g = p->grads + p->poff[u];
        if (p->n == 1) {
            memcpy(g, sum + p->soff[u], p->s[u] * sizeof(float));
            continue;
        }
        double t0 = now_s();
        note(p, weft_allgather(sum + p->soff[u], g, p->s[u], WEFT_FLOAT32, p->comm),
             "gradient allgather");
        p->wait_s += now_s() - t0;
    }
}

/* The gradient the optimizer reads for unit u, and its length. */
static float *opt_grads(const struct par *p, int u, size_t *len)
{
    if (p->zero == 0) {
        *len = unit_len(p, u);
        return p->grads + p->poff[u];
    }
    *len = owned_len(p, u, p->rank);
    return owned(p, p->grads, p->zero == 1, u);
}

/* The first stage's wte gradient to the last stage's copy. */
static void tie_exchange(struct par *p)
{
    if (p->tie_comm == NULL || p->err != WEFT_OK)
        return;
    size_t len;
    float *g = opt_grads(p, p->tie_unit, &len);
    double t0 = now_s();
    weft_status_t st = p->tie_send ? weft_send(g, len, WEFT_FLOAT32, p->tie_peer, p->tie_comm)
                                   : weft_recv(g, len, WEFT_FLOAT32, p->tie_peer, p->tie_comm);
    p->wait_s += now_s() - t0;
    if (st != WEFT_OK)
        fail(p, st, "tied embedding gradient", weft_last_error(p->tie_comm));
}

/* The global gradient norm: the squares of what this rank alone holds,
 * binned so that any order of adding gives the same bits. */
static weft_status_t grad_norm(struct par *p, float scale, float *norm)
{
    int64_t bins[XSQ_BINS];
    memset(bins, 0, sizeof(bins));
    for (int u = 0; u < p->nunits; u++) {
        struct model_span sp[16];
        int ns = model_norm_spans(p->model, u, sp);
        /* Our slice of the unit, also where every rank holds it whole. */
        size_t glen;
        const float *g = opt_grads(p, u, &glen);
        size_t lo = (size_t)p->rank * p->s[u], hi = lo + owned_len(p, u, p->rank);
        size_t base = p->zero == 0 ? 0 : lo; /* the unit offset where g starts */
        for (int k = 0; k < ns; k++) {
            size_t a = sp[k].off > lo ? sp[k].off : lo;
            size_t b = sp[k].off + sp[k].len < hi ? sp[k].off + sp[k].len : hi;
            if (a < b)
                xsq_add(bins, g + (a - base), b - a, scale);
        }
    }
    if (p->cfg.world) {
        double t0 = now_s();
        weft_status_t st =
            weft_allreduce(bins, bins, XSQ_BINS, WEFT_INT64, WEFT_SUM, p->cfg.world);
        p->wait_s += now_s() - t0;
        if (st != WEFT_OK) {
            fail(p, st, "gradient norm", weft_last_error(p->cfg.world));
            return st;
        }
    }
    *norm = (float)sqrt(xsq_total(bins));
    return WEFT_OK;
}

/* AdamW over moments [off, off + len) (the moments' layout), mm and vv
 * pointing at that range. */
static void update_range(struct par *p, const struct adamw *o, float gs, float b1c, float b2c,
                         size_t off, size_t len, float *mm, float *vv)
{
    for (int u = 0; u < p->nunits && len > 0; u++) {
        size_t ulo = moments_whole(p) ? p->poff[u] : p->soff[u];
        size_t ulen = moments_whole(p) ? p->poff[u + 1] - ulo : p->s[u];
        if (off >= ulo + ulen)
            continue;
        size_t j0 = off - ulo, n = ulen - j0 < len ? ulen - j0 : len;
        float *w = moments_whole(p) ? p->params + off : owned(p, p->params, p->zero < 3, u) + j0;
        const float *g = moments_whole(p) ? p->grads + off
                                          : owned(p, p->grads, p->zero == 1, u) + j0;
        for (size_t i = 0; i < n; i++) {
            float gi = g[i] * gs;
            mm[i] = o->beta1 * mm[i] + (1.0f - o->beta1) * gi;
            vv[i] = o->beta2 * vv[i] + (1.0f - o->beta2) * gi * gi;
            float mh = mm[i] / b1c, vh = vv[i] / b2c;
            w[i] -= o->lr * (mh / (sqrtf(vh) + o->eps) + o->weight_decay * w[i]);
        }
        off += n;
        len -= n;
        mm += n;
        vv += n;
    }
}

weft_status_t par_step(struct par *p, const struct adamw *o, int global, float *norm)
{
    if (p->err != WEFT_OK)
        return p->err;
    if (p->acc)
        det_finish(p);
    tie_exchange(p);
    if (p->err != WEFT_OK)
        return p->err;
    const float scale = 1.0f / (float)global;
    if (grad_norm(p, scale, norm) != WEFT_OK)
        return p->err;
    float c = o->clip > 0 && *norm > o->clip ? o->clip / *norm : 1.0f;
    const float gs = scale * c;
    p->steps++;
    const float b1c = 1.0f - powf(o->beta1, (float)p->steps);
    const float b2c = 1.0f - powf(o->beta2, (float)p->steps);
    size_t off, len;
    float *ptr[2];
    int rc = offload_begin(p->off);
    while (rc == 0 && (rc = offload_next(p->off, &off, &len, ptr)) > 0)
        update_range(p, o, gs, b1c, b2c, off, len, ptr[0], ptr[1]), rc = 0;
    if (rc < 0) {
        fail(p, WEFT_ERR_SYSTEM, "optimizer state", offload_error(p->off));
        return p->err;
    }
    p->kept.unit = -1; /* gathered parameters are stale now */
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
        wait_pending(p, "parameter allgather");
    }
    return p->err;
}

struct par_memory par_memory(const struct par *p)
{
    size_t f = sizeof(float);
    struct offload_stats os = offload_stats(p->off);
    return (struct par_memory){
        .params = (p->zero == 3 ? p->S : p->P) * f,
        .grads = (p->zero >= 2 ? p->S : p->P) * f,
        .optimizer = os.resident_bytes,
        .comm = p->comm_bytes,
        .offloaded = os.stored_bytes,
    };
}

double par_wait_seconds(const struct par *p)
{
    return p->wait_s;
}

void par_add_wait(struct par *p, double s)
{
    p->wait_s += s;
}

struct offload_stats par_offload_stats(const struct par *p)
{
    return offload_stats(p->off);
}

long par_steps(const struct par *p)
{
    return p->steps;
}

const char *par_error(const struct par *p)
{
    return p->errtext;
}
