/*
 * registry.c - the table of algorithm families (algorithms/list.h),
 * indexed by enum weft_algo, and what reads it: names, what each variant
 * serves, and weft_sched_build, which checks a description once for every
 * family before handing it to the family's builder.
 */
#include "algorithms/registry.h"

#include <strings.h>

/* Indexed by enum weft_algo, from the one list (algorithms/list.h). */
static const struct weft_algo_desc *const algos[WEFT_ALGO_COUNT] = {
#define WEFT_ALGO_ENTRY(e, d) [WEFT_ALGO_##e] = &weft_algo_##d,
#include "algorithms/list.h"
#undef WEFT_ALGO_ENTRY
};

/* algo's descriptor, or NULL for a value outside the enum. */
static const struct weft_algo_desc *algo_get(enum weft_algo algo)
{
    return (unsigned)algo < WEFT_ALGO_COUNT ? algos[algo] : NULL;
}

static bool name_is(const char *want, const char *name, size_t len)
{
    return want && strncasecmp(name, want, len) == 0 && want[len] == '\0';
}

const char *weft_algo_name(enum weft_algo algo)
{
    const struct weft_algo_desc *a = algo_get(algo);
    return a ? a->name : "unknown";
}

int weft_algo_from_name(const char *name, size_t len)
{
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        if (algos[a] && name_is(algos[a]->name, name, len))
            return a;
    return -1;
}

const char *weft_algo_variant_name(enum weft_algo algo, int variant)
{
    const struct weft_algo_desc *a = algo_get(algo);
    if (!a || variant < 0 || variant >= WEFT_VAR_COUNT)
        return NULL;
    return a->variants[variant];
}

int weft_algo_variant_from_name(enum weft_algo algo, const char *name, size_t len)
{
    for (int v = 0; v < WEFT_VAR_COUNT; v++)
        if (name_is(weft_algo_variant_name(algo, v), name, len))
            return v;
    return -1;
}

bool weft_algo_serves(enum weft_algo algo, int variant, enum weft_coll coll)
{
    const struct weft_algo_desc *a = algo_get(algo);
    if (!a || variant < 0 || variant >= WEFT_VAR_COUNT || (unsigned)coll >= WEFT_COLL_COUNT)
        return false;
    return (a->serves[variant] >> coll) & 1u;
}

/* What every builder needs of a description it serves. */
static weft_status_t check_desc(const struct weft_coll_desc *d)
{
    const char *algo = weft_algo_name(d->algo), *coll = weft_coll_name(d->coll);
    if (d->nranks < 1 || d->rank < 0 || d->rank >= d->nranks)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "%s %s: rank %d of %d ranks", algo, coll,
                          d->rank, d->nranks);
    if (weft_coll_rooted(d->coll) && (d->root < 0 || d->root >= d->nranks))
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "%s %s: root %d is outside [0, %d)", algo,
                          coll, d->root, d->nranks);
    if (d->chunk < 1)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "%s %s: chunk is 0 elements", algo, coll);
    bool blocks = d->coll == WEFT_COLL_REDUCE_SCATTER || d->coll == WEFT_COLL_ALLGATHER;
    if (blocks && d->count > SIZE_MAX / (size_t)d->nranks)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "%s %s: count %zu times %d ranks overflows size_t", algo, coll, d->count,
                          d->nranks);
    return WEFT_OK;
}

weft_status_t weft_sched_build(const struct weft_coll_desc *d, struct weft_schedule *s)
{
    if (!d || !s)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "schedule: %s is NULL",
                          !d ? "the collective description" : "the schedule");
    s->nsteps = 0;
    s->scratch_count = 0;
    if (!weft_algo_serves(d->algo, d->variant, d->coll))
        return weft_error(NULL, WEFT_ERR_UNSUPPORTED, "schedule: %s (variant %d) builds no %s",
                          weft_algo_name(d->algo), d->variant, weft_coll_name(d->coll));
    WEFT_CHECK(check_desc(d));
    weft_status_t st = algos[d->algo]->build(d, s);
    if (st != WEFT_OK) {
        s->nsteps = 0;
        s->scratch_count = 0;
    }
    return st;
}
