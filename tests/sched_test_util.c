/*
 * sched_test_util.c - the helpers the files of test_schedule share: see
 * sched_test_util.h.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "sched_test_util.h"

void build_all(int algo, int coll, int p, int root, size_t count, size_t chunk,
               struct weft_schedule *sch)
{
    int ordered = (algo & PLAN_ORDERED) != 0;
    algo &= ~PLAN_ORDERED;
    for (int rank = 0; rank < p; rank++) {
        struct weft_coll_desc d = { coll, rank, p, root, count, chunk, PLAN_ALGO(algo), PLAN_VAR(algo), ordered, NULL, 0 };
        weft_sched_init(&sch[rank]);
        weft_status_t st = weft_sched_build(&d, &sch[rank]);
        cr_assert(st == WEFT_OK, "%s %s p=%d rank=%d root=%d count=%zu chunk=%zu: %s (%s)",
                  weft_algo_name(PLAN_ALGO(algo)), weft_coll_name(coll), p, rank, root, count, chunk,
                  weft_status_string(st), weft_last_error(NULL));
    }
}

void free_all(int p, struct weft_schedule *sch)
{
    for (int rank = 0; rank < p; rank++)
        weft_sched_free(&sch[rank]);
}

int count_flag(const struct weft_schedule *s, int flag)
{
    int n = 0;
    for (size_t i = 0; i < s->nsteps; i++)
        n += (s->steps[i].flags & flag) != 0;
    return n;
}

/* Field by field: struct weft_step has padding that a copy may not keep. */
bool same_steps(const struct weft_schedule *a, const struct weft_schedule *b)
{
    if (a->nsteps != b->nsteps || a->scratch_count != b->scratch_count)
        return false;
    for (size_t i = 0; i < a->nsteps; i++) {
        const struct weft_step *x = &a->steps[i], *y = &b->steps[i];
        if (x->kind != y->kind || x->flags != y->flags || x->buf != y->buf ||
            x->src_buf != y->src_buf || x->peer != y->peer || x->off != y->off ||
            x->src_off != y->src_off || x->count != y->count ||
            memcmp(x->deps, y->deps, sizeof(x->deps)) != 0)
            return false;
    }
    return true;
}
