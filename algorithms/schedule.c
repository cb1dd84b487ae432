/*
 * schedule.c - the schedule container every algorithm fills, and the
 * per-collective facts (names, kinds, buffer sizes) shared by the
 * builders, the engine and the checker.  The families are registry.c's.
 */
#include "algorithms/schedule.h"

#include <stdlib.h>
#include <string.h>

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
    if (s->nsteps >= (size_t)INT32_MAX || (s->max_steps && s->nsteps >= s->max_steps))
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

weft_status_t weft_sched_push(struct weft_schedule *s, const char *who, const struct weft_step *st,
                              int32_t *idx)
{
    int32_t i = weft_sched_add(s, st);
    if (i < 0 && s->max_steps && s->nsteps >= s->max_steps)
        return weft_error(NULL, WEFT_ERR_UNSUPPORTED, "%s: schedule over its limit of %zu steps",
                          who, s->max_steps);
    if (i < 0)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "%s: cannot grow a schedule past %zu steps",
                          who, s->nsteps);
    if (idx)
        *idx = i;
    return WEFT_OK;
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
    return weft_sched_push(s, who, &st, idx);
}

const char *weft_coll_name(enum weft_coll coll)
{
    static const char *const names[WEFT_COLL_COUNT] = {
        [WEFT_COLL_ALLREDUCE] = "allreduce", [WEFT_COLL_REDUCE_SCATTER] = "reducescatter",
        [WEFT_COLL_ALLGATHER] = "allgather", [WEFT_COLL_BROADCAST] = "broadcast",
        [WEFT_COLL_REDUCE] = "reduce",       [WEFT_COLL_SEND] = "send",
        [WEFT_COLL_RECV] = "recv",
    };
    if ((unsigned)coll >= WEFT_COLL_COUNT)
        return "unknown";
    return names[coll];
}

bool weft_coll_reduces(enum weft_coll coll)
{
    return coll == WEFT_COLL_ALLREDUCE || coll == WEFT_COLL_REDUCE_SCATTER ||
           coll == WEFT_COLL_REDUCE;
}

bool weft_coll_rooted(enum weft_coll coll)
{
    return coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
}

/* Elements of one buffer: count; count per rank for the collective whose
 * buffer holds every rank's block (all_ranks); 0 for the one that has no
 * such buffer (none), or an unknown one.  nranks * count saturates at
 * SIZE_MAX, so that an impossible size stays impossible instead of
 * wrapping to a small one (callers reject it). */
static size_t buffer_count(const struct weft_coll_desc *d, enum weft_coll all_ranks,
                           enum weft_coll none)
{
    if ((unsigned)d->coll >= WEFT_COLL_COUNT || d->coll == none)
        return 0;
    if (d->coll != all_ranks)
        return d->count;
    if (d->nranks <= 0)
        return 0;
    size_t p = (size_t)d->nranks;
    return d->count > SIZE_MAX / p ? SIZE_MAX : d->count * p;
}

size_t weft_coll_send_count(const struct weft_coll_desc *d)
{
    return buffer_count(d, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_RECV);
}

size_t weft_coll_recv_count(const struct weft_coll_desc *d)
{
    return buffer_count(d, WEFT_COLL_ALLGATHER, WEFT_COLL_SEND);
}
