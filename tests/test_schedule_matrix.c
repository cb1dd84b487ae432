/*
 * test_schedule_matrix.c - the matrix of every algorithm, variant,
 * collective and rank count up to 4097, each schedule set proved correct
 * by the checker in sched_sim.c (part of test_schedule).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "sched_sim.h"
#include "sched_test_util.h"

/* ---- the matrix: every algorithm, variant, collective and rank count ----------------- */

/* What the matrix ran in one group, for its timing line. */
struct mstats {
    size_t cases;       /* schedule sets checked (each in and out of place) */
    size_t steps;       /* steps in them, all ranks */
    size_t unsupported; /* combinations a builder refused with WEFT_ERR_UNSUPPORTED */
    size_t over;        /* schedule sets over MATRIX_STEPS, not checked */
};

/* Most steps (all ranks) one checked schedule set may have: about 1.3 us
 * a step in and out of place here, so a second.  A ring allgather has
 * 2p^2 steps, 2M at p = 1000: at the largest rank counts only what grows
 * slower than p^2 (or counts 0 and 1) fits; the group line says how many
 * sets were left out. */
#define MATRIX_STEPS ((size_t)1 << 20)
/* Past 128 ranks a step costs more (the memory runs a write shifts grow
 * with p: ~4 us a step at p = 1000, ~15 us at p = 4097), so the limit
 * falls to keep each group near ten seconds. */
static size_t matrix_limit(int p)
{
    return p <= 128 ? MATRIX_STEPS : p <= 1024 ? MATRIX_STEPS / 8 : MATRIX_STEPS / 16;
}

/* Builds d's schedule on every rank and checks it.  weft_algo_serves
 * claims the combination, so any error but WEFT_ERR_UNSUPPORTED (a rank
 * count or node map the variant does not take) fails. */
static void matrix_case(struct weft_coll_desc d, struct mstats *ms)
{
    int p = d.nranks;
    struct weft_schedule *sch = calloc((size_t)p, sizeof(*sch));
    cr_assert(sch);
    size_t steps = 0, limit = matrix_limit(p);
    int built = 0;
    weft_status_t st = WEFT_OK;
    for (; built < p; built++) {
        d.rank = built;
        weft_sched_init(&sch[built]);
        st = weft_sched_build(&d, &sch[built]);
        if (st != WEFT_OK)
            break;
        steps += sch[built].nsteps;
        if (steps > limit) {
            ms->over++;
            free_all(built + 1, sch);
            free(sch);
            return;
        }
    }
    if (st == WEFT_ERR_UNSUPPORTED) {
        ms->unsupported++;
        free_all(built + 1, sch);
        free(sch);
        return;
    }
    cr_assert(st == WEFT_OK, "%s variant %d %s p=%d rank %d root=%d count=%zu chunk=%zu "
              "ordered=%d nnodes=%d: %s (%s)", weft_algo_name(d.algo), d.variant,
              weft_coll_name(d.coll), p, built, d.root, d.count, d.chunk, d.ordered, d.nnodes,
              weft_status_string(st), weft_last_error(NULL));
    char err[700];
    /* One staging slot: what the engine guarantees the oldest op in
     * flight (post_ready); more only let receives post earlier. */
    bool ok = verify_desc(&d, sch, 1, err, sizeof(err));
    free_all(p, sch);
    free(sch);
    cr_assert(ok, "chunk %zu: %s", d.chunk, err);
    ms->cases++;
    ms->steps += steps;
}

/* Node maps hier runs under: one node, blocks of 2 and of 4 ranks, and
 * uneven nodes of 3, 1, 2, 3, 1, 2, ... ranks.  Returns how many; node[m]
 * is NULL for the one-node map. */
static int node_maps(int p, int *node[4], int nnodes[4])
{
    node[0] = NULL;
    nnodes[0] = 1;
    for (int m = 1; m < 4; m++) {
        node[m] = malloc((size_t)p * sizeof(int));
        cr_assert(node[m]);
    }
    static const int uneven[] = { 3, 1, 2 };
    int n = 0, left = uneven[0];
    for (int r = 0; r < p; r++) {
        node[1][r] = r / 2;
        node[2][r] = r / 4;
        if (left == 0)
            left = uneven[++n % 3];
        node[3][r] = n;
        left--;
    }
    nnodes[1] = (p + 1) / 2;
    nnodes[2] = (p + 3) / 4;
    nnodes[3] = n + 1;
    return 4;
}

/* Every (algo, variant) that serves coll, on p ranks: counts 0, 1, p-1, p+1
 * and a large odd one in single chunks, below 17 ranks also a pipelined
 * 10p+7 in chunks of 3; rooted collectives from roots 0, p-1, p/2 (all of
 * them up to 8 ranks); hier under every node map of node_maps; with
 * ordered, the ring's reductions in deterministic mode only. */
static void matrix_p(int p, bool ordered, struct mstats *ms)
{
    int *node[4], nnodes[4];
    int nmaps = node_maps(p, node, nnodes);
    size_t up = (size_t)p;
    size_t counts[] = { 0, 1, up - 1, up + 1, 1000003, 10 * up + 7 };
    size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, 1 << 20, 3 };
    size_t ncounts = p <= 16 ? 6 : 5;
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        bool rooted = weft_coll_rooted(coll);
        int roots[8], nroots = 0;
        if (rooted && p <= 8) {
            for (int r = 0; r < p; r++)
                roots[nroots++] = r;
        } else if (rooted) {
            int pick[] = { 0, p - 1, p / 2 };
            for (int k = 0; k < 3; k++)
                roots[nroots++] = pick[k];
        } else {
            roots[nroots++] = 0;
        }
        for (int algo = 0; algo < WEFT_ALGO_COUNT; algo++)
            for (int var = 0; var < WEFT_VAR_COUNT; var++) {
                if (!weft_algo_serves(algo, var, coll))
                    continue;
                if (ordered && (algo != WEFT_ALGO_RING || !weft_coll_reduces(coll)))
                    continue;
                int maps = algo == WEFT_ALGO_HIER ? nmaps : 1;
                for (int m = 0; m < maps; m++)
                    for (size_t c = 0; c < ncounts; c++)
                        for (int r = 0; r < nroots; r++) {
                            struct weft_coll_desc d = {
                                coll, 0, p, roots[r], counts[c], chunks[c], algo, var,
                                ordered, node[m], nnodes[m] };
                            matrix_case(d, ms);
                        }
            }
    }
    for (int m = 1; m < nmaps; m++)
        free(node[m]);
}

/* Runs the matrix for each rank count in ps and says how long it took.
 * WEFT_TEST_MAX_P leaves out larger rank counts (the sanitizer pass: the
 * code is the same at p = 128 and p = 4097, only ten times slower there). */
static void matrix_group(const char *name, const int *ps, size_t nps, bool ordered)
{
    const char *env = getenv("WEFT_TEST_MAX_P");
    long maxp = env && *env ? strtol(env, NULL, 10) : 0;
    size_t left = 0;
    for (size_t i = 0; i < nps; i++)
        left += maxp <= 0 || ps[i] <= maxp;
    if (left == 0)
        cr_skip_test("matrix %s: every p is above WEFT_TEST_MAX_P=%ld", name, maxp);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct mstats ms = { 0 };
    for (size_t i = 0; i < nps; i++)
        if (maxp <= 0 || ps[i] <= maxp)
            matrix_p(ps[i], ordered, &ms);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    fprintf(stderr, "matrix %s: %zu schedule sets, %zu steps, %zu unsupported, %zu over the "
            "step limit, %.2f s\n", name, ms.cases, ms.steps, ms.unsupported, ms.over, s);
    cr_assert(ms.cases > 0, "matrix %s checked nothing", name);
}

static void matrix_range(const char *name, int pmin, int pmax, bool ordered)
{
    int ps[64];
    size_t n = 0;
    for (int p = pmin; p <= pmax; p++)
        ps[n++] = p;
    matrix_group(name, ps, n, ordered);
}

Test(matrix, p1_16) { matrix_range("p=1..16", 1, 16, false); }
Test(matrix, p17_40) { matrix_range("p=17..40", 17, 40, false); }
Test(matrix, p41_64) { matrix_range("p=41..64", 41, 64, false); }
Test(matrix, p96_128)
{
    int ps[] = { 96, 100, 127, 128 };
    matrix_group("p=96,100,127,128", ps, 4, false);
}
Test(matrix, p1000_1024)
{
    int ps[] = { 1000, 1024 };
    matrix_group("p=1000,1024", ps, 2, false);
}
Test(matrix, p4097)
{
    int ps[] = { 4097 };
    matrix_group("p=4097", ps, 1, false);
}

/* Deterministic mode: the ring's allreduce, reduce_scatter and reduce must
 * fold every element as ((x0 op x1) op x2) ... op x(p-1). */
Test(matrix, ordered)
{
    int ps[] = { 1, 2, 3, 4, 5, 7, 8, 13, 16, 31, 64, 100, 128 };
    matrix_group("ordered", ps, sizeof(ps) / sizeof(ps[0]), true);
}
