/*
 * sim_sym.c - the simulator's symmetry search: which group of rank
 * permutations keeps both the link costs and the schedules (sim.h), checked
 * against the schedules the builders make; sim.c then runs its classes.
 */
#include "select/sim.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/* A symmetry check builds every rank when that is at most CHECK_ALL_STEPS
 * steps and CHECK_ALL_RANKS ranks, else CHECK_SOME ranks of each class. */
#define CHECK_ALL_STEPS ((size_t)4 << 20)
#define CHECK_ALL_RANKS 2048
#define CHECK_SOME 4

/* A candidate group: representatives 0 .. nrep-1 of p ranks, moved by
 * kind (enum weft_sim_group); lives for one weft_sim_symmetric call. */
struct group {
    const struct weft_sim_model *m;
    int p, nrep, kind;
};

/* Whether got (rank b's schedule) is rep (its representative's) with every
 * peer moved as the representative is moved to b. */
static bool moved_same(const struct group *g, int b, const struct weft_schedule *rep,
                       const struct weft_schedule *got)
{
    if (rep->nsteps != got->nsteps)
        return false;
    for (size_t k = 0; k < rep->nsteps; k++) {
        const struct weft_step *x = &rep->steps[k], *y = &got->steps[k];
        if (x->kind != y->kind || x->count != y->count || x->deps[0] != y->deps[0] ||
            x->deps[1] != y->deps[1] || x->deps[2] != y->deps[2])
            return false;
        if (x->kind != WEFT_STEP_COPY && y->peer != weft_sim_from_rep(g->p, g->nrep, g->kind, b, x->peer))
            return false;
    }
    return true;
}

/* splitmix64 of x: the pseudo-random members a sampled check looks at. */
static uint64_t mix(uint64_t x)
{
    uint64_t z = x + 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Whether every rank's schedule is its representative's (reps, ranks
 * 0 .. g->nrep-1) moved by group g->kind; see sim.h for which ranks are
 * built.  A failed build is an error (*st). */
static bool group_fits(const struct group *g, const struct weft_coll_desc *tmpl,
                       const struct weft_schedule *reps, struct weft_schedule *tmp,
                       weft_status_t *st)
{
    int orbit = g->p / g->nrep; /* ranks per class */
    size_t steps = 0;
    for (int a = 0; a < g->nrep; a++)
        steps += reps[a].nsteps;
    bool all = (double)steps * orbit <= (double)CHECK_ALL_STEPS && g->p <= CHECK_ALL_RANKS;
    int pick[CHECK_SOME], npick = 0;
    if (!all) {
        /* The next rank of the orbit, the far side, the last, one more. */
        pick[npick++] = 1;
        pick[npick++] = orbit / 2;
        pick[npick++] = orbit - 1;
        pick[npick++] = 1 + (int)(mix((uint64_t)orbit) % (uint64_t)(orbit - 1));
    }
    for (int a = 0; a < g->nrep; a++)
        for (int i = 0; i < (all ? orbit - 1 : npick); i++) {
            int b = a + (all ? i + 1 : pick[i]) * g->nrep;
            *st = weft_sim_build_rank(tmpl, b, g->m->max_steps, tmp);
            if (*st != WEFT_OK || !moved_same(g, b, &reps[a], tmp))
                return false;
        }
    return true;
}

static bool pow2(int x)
{
    return x > 0 && (x & (x - 1)) == 0;
}

weft_status_t weft_sim_symmetric(const struct weft_coll_desc *tmpl,
                                 const struct weft_sim_model *m, struct weft_sim_result *res,
                                 bool *found)
{
    int p = tmpl->nranks, ppn = m->sym_ppn < p ? m->sym_ppn : p;
    *found = false;
    if (p % ppn != 0)
        return WEFT_OK;
    bool one_level = ppn == p || ppn == 1;
    const struct {
        int unit, kind;
        bool ok;
    } cand[] = {
        {1, WEFT_SIM_G_XOR, pow2(p) && pow2(ppn)},
        {1, WEFT_SIM_G_ROT, one_level},
        {ppn, WEFT_SIM_G_XOR, !one_level && pow2(p) && pow2(ppn)},
        {ppn, WEFT_SIM_G_ROT, !one_level},
    };
    int ncand = (int)(sizeof(cand) / sizeof(cand[0]));
    struct weft_schedule *reps = calloc((size_t)ppn, sizeof(*reps)), tmp;
    if (!reps)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "sim: cannot hold %d schedules", ppn);
    weft_sched_init(&tmp);
    for (int a = 0; a < ppn; a++)
        weft_sched_init(&reps[a]);
    int built = 0;
    weft_status_t st = WEFT_OK;
    for (int c = 0; c < ncand && !*found; c++) {
        if (!cand[c].ok)
            continue;
        for (; built < cand[c].unit; built++)
            WEFT_CHECK_GOTO(weft_sim_build_rank(tmpl, built, m->max_steps, &reps[built]), st, out);
        struct group g = {.m = m, .p = p, .nrep = cand[c].unit, .kind = cand[c].kind};
        if (!group_fits(&g, tmpl, reps, &tmp, &st)) {
            if (st != WEFT_OK)
                goto out;
            continue;
        }
        bool open = false;
        st = weft_sim_simulate(tmpl, m, g.nrep, g.kind, reps, res, &open);
        /* A group that fits the sampled ranks but does not close, or that
         * meets an error, leaves it to the run of every rank. */
        *found = st == WEFT_OK && !open;
        st = WEFT_OK;
    }
out:
    for (int a = 0; a < ppn; a++)
        weft_sched_free(&reps[a]);
    free(reps);
    weft_sched_free(&tmp);
    return st;
}
