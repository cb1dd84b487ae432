/*
 * schedule.c - the schedule container every algorithm fills, and the
 * per-collective facts (names, buffer sizes) shared by the builders, the
 * engine and the checker.
 */
#include "algorithms/schedule.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

void weft_sched_init(struct weft_schedule *s)
{
    memset(s, 0, sizeof(*s));
}

void weft_sched_free(struct weft_schedule *s)
{
    if (!s)
        return;
    free(s->steps);
    memset(s, 0, sizeof(*s));
}

int32_t weft_sched_add(struct weft_schedule *s, const struct weft_step *st)
{
    /* Steps are named by int32 indices in deps[], so that is the limit. */
    if (s->nsteps >= (size_t)INT32_MAX)
        return -1;
    if (s->nsteps == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        if (cap > (size_t)INT32_MAX)
            cap = (size_t)INT32_MAX;
        struct weft_step *steps = realloc(s->steps, cap * sizeof(*steps));
        if (!steps)
            return -1;
        s->steps = steps;
        s->cap = cap;
    }
    s->steps[s->nsteps] = *st;
    return (int32_t)s->nsteps++;
}

weft_status_t weft_sched_step(struct weft_schedule *s, const char *who, int kind, int flags,
                              int buf, int src_buf, int peer, size_t off, size_t src_off,
                              size_t count, int32_t dep, int32_t *idx)
{
    struct weft_step st = {
        .kind = (uint8_t)kind,
        .flags = (uint8_t)flags,
        .buf = (uint8_t)buf,
        .src_buf = (uint8_t)src_buf,
        .peer = peer,
        .deps = {dep, -1, -1},
        .off = off,
        .src_off = src_off,
        .count = count,
    };
    int32_t i = weft_sched_add(s, &st);
    if (i < 0)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "%s: cannot grow a schedule past %zu steps",
                          who, s->nsteps);
    if (idx)
        *idx = i;
    return WEFT_OK;
}

const char *weft_coll_name(int coll)
{
    static const char *const names[WEFT_COLL_COUNT] = {
        [WEFT_COLL_ALLREDUCE] = "allreduce", [WEFT_COLL_REDUCE_SCATTER] = "reducescatter",
        [WEFT_COLL_ALLGATHER] = "allgather", [WEFT_COLL_BROADCAST] = "broadcast",
        [WEFT_COLL_REDUCE] = "reduce",       [WEFT_COLL_SEND] = "send",
        [WEFT_COLL_RECV] = "recv",
    };
    if (coll < 0 || coll >= WEFT_COLL_COUNT)
        return "unknown";
    return names[coll];
}

bool weft_coll_reduces(int coll)
{
    return coll == WEFT_COLL_ALLREDUCE || coll == WEFT_COLL_REDUCE_SCATTER ||
           coll == WEFT_COLL_REDUCE;
}

/* nranks * count, saturated at SIZE_MAX so that an impossible size stays
 * impossible instead of wrapping to a small one (callers reject it). */
static size_t times_ranks(const struct weft_coll_desc *d)
{
    if (d->nranks <= 0)
        return 0;
    size_t p = (size_t)d->nranks;
    if (d->count > SIZE_MAX / p)
        return SIZE_MAX;
    return d->count * p;
}

size_t weft_coll_send_count(const struct weft_coll_desc *d)
{
    switch (d->coll) {
    case WEFT_COLL_ALLREDUCE:
    case WEFT_COLL_ALLGATHER:
    case WEFT_COLL_BROADCAST:
    case WEFT_COLL_REDUCE:
    case WEFT_COLL_SEND:
        return d->count;
    case WEFT_COLL_REDUCE_SCATTER:
        return times_ranks(d);
    default:
        return 0;
    }
}

size_t weft_coll_recv_count(const struct weft_coll_desc *d)
{
    switch (d->coll) {
    case WEFT_COLL_ALLREDUCE:
    case WEFT_COLL_REDUCE_SCATTER:
    case WEFT_COLL_BROADCAST:
    case WEFT_COLL_REDUCE:
    case WEFT_COLL_RECV:
        return d->count;
    case WEFT_COLL_ALLGATHER:
        return times_ranks(d);
    default:
        return 0;
    }
}

static const char *const algo_names[WEFT_ALGO_COUNT] = {
    [WEFT_ALGO_RING] = "ring", [WEFT_ALGO_TREE] = "tree", [WEFT_ALGO_RHD] = "rhd",
    [WEFT_ALGO_DIRECT] = "direct", [WEFT_ALGO_HIER] = "hier",
};

const char *weft_algo_name(int algo)
{
    if (algo < 0 || algo >= WEFT_ALGO_COUNT)
        return "unknown";
    return algo_names[algo];
}

int weft_algo_from_name(const char *name, size_t len)
{
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        if (strncasecmp(name, algo_names[a], len) == 0 && algo_names[a][len] == '\0')
            return a;
    return -1;
}

/* Bit c: the variant builds collective c. */
#define C(x) (1u << WEFT_COLL_##x)
static const unsigned serves[WEFT_ALGO_COUNT][WEFT_VAR_COUNT] = {
    [WEFT_ALGO_RING] = {C(ALLREDUCE) | C(REDUCE_SCATTER) | C(ALLGATHER) | C(BROADCAST) | C(REDUCE)},
    [WEFT_ALGO_TREE] = {C(ALLREDUCE) | C(BROADCAST) | C(REDUCE), C(BROADCAST) | C(REDUCE)},
    [WEFT_ALGO_RHD] = {C(ALLREDUCE) | C(REDUCE_SCATTER) | C(ALLGATHER) | C(BROADCAST) | C(REDUCE), C(ALLREDUCE)},
    [WEFT_ALGO_DIRECT] = {C(ALLREDUCE) | C(REDUCE_SCATTER) | C(ALLGATHER) | C(BROADCAST) |
                          C(REDUCE)},
    [WEFT_ALGO_HIER] = {C(ALLREDUCE) | C(REDUCE_SCATTER) | C(ALLGATHER) | C(BROADCAST) | C(REDUCE),
                        C(ALLREDUCE) | C(REDUCE_SCATTER) | C(ALLGATHER) | C(BROADCAST) | C(REDUCE)},
};
#undef C

bool weft_algo_serves(int algo, int variant, int coll)
{
    if (algo < 0 || algo >= WEFT_ALGO_COUNT || variant < 0 || variant >= WEFT_VAR_COUNT ||
        coll < 0 || coll >= WEFT_COLL_COUNT)
        return false;
    return (serves[algo][variant] >> coll) & 1u;
}

weft_status_t weft_sched_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    if (!weft_algo_serves(d->algo, d->variant, d->coll))
        return weft_error(NULL, WEFT_ERR_UNSUPPORTED, "schedule: %s (variant %d) builds no %s",
                          weft_algo_name(d->algo), d->variant, weft_coll_name(d->coll));
    switch (d->algo) {
    case WEFT_ALGO_RING: return weft_ring_build(d, s);
    case WEFT_ALGO_TREE: return weft_tree_build(d, s);
    case WEFT_ALGO_RHD: return weft_rhd_build(d, s);
    case WEFT_ALGO_DIRECT: return weft_direct_build(d, s);
    case WEFT_ALGO_HIER: return weft_hier_build(d, s);
    default:
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "schedule: unknown algorithm %d", d->algo);
    }
}
