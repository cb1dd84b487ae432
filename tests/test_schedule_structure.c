/*
 * test_schedule_structure.c - the step structure each schedule builder
 * promises beyond correctness (part of test_schedule): the schedule
 * container and the registry of families, and the shapes of the ring, binomial tree, rd,
 * rhd, double tree and direct schedules that the engine and the cost model
 * rely on.
 */
#include <criterion/criterion.h>
#include <ctype.h>
#include <stdint.h>
#include <string.h>

#include "sched_sim.h"
#include "sched_test_util.h"

/* ---- the schedule container, the registry and collective facts -------------------- */

Test(schedule, add_grows_and_keeps_order)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    cr_assert(s.steps == NULL && s.nsteps == 0 && s.cap == 0 && s.scratch_count == 0);
    for (int i = 0; i < 1000; i++) {
        struct weft_step st = { .kind = WEFT_STEP_SEND, .peer = i, .deps = { -1, -1, -1 },
                                .count = (size_t)i + 1 };
        cr_assert(weft_sched_add(&s, &st) == i);
    }
    cr_assert(s.nsteps == 1000 && s.cap >= 1000 && s.cap < 4000);
    for (int i = 0; i < 1000; i++)
        cr_assert(s.steps[i].peer == i && s.steps[i].count == (size_t)i + 1);
    weft_sched_free(&s);
    cr_assert(s.steps == NULL && s.nsteps == 0);
    weft_sched_free(&s);
    weft_sched_free(NULL);
}

Test(schedule, coll_counts_and_names)
{
    struct {
        int coll;
        size_t send, recv;
        const char *name;
    } c[] = {
        { WEFT_COLL_ALLREDUCE, 10, 10, "allreduce" },
        { WEFT_COLL_REDUCE_SCATTER, 40, 10, "reducescatter" },
        { WEFT_COLL_ALLGATHER, 10, 40, "allgather" },
        { WEFT_COLL_BROADCAST, 10, 10, "broadcast" },
        { WEFT_COLL_REDUCE, 10, 10, "reduce" },
        { WEFT_COLL_SEND, 10, 0, "send" },
        { WEFT_COLL_RECV, 0, 10, "recv" },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct weft_coll_desc d = { c[i].coll, 1, 4, 0, 10, 1, WEFT_ALGO_RING, 0, 0, NULL, 0 };
        cr_assert(weft_coll_send_count(&d) == c[i].send, "%s send", c[i].name);
        cr_assert(weft_coll_recv_count(&d) == c[i].recv, "%s recv", c[i].name);
        cr_assert_str_eq(weft_coll_name(c[i].coll), c[i].name);
    }
    cr_assert_str_eq(weft_coll_name(WEFT_COLL_COUNT), "unknown");
    cr_assert_str_eq(weft_coll_name(-3), "unknown");
    struct weft_coll_desc big = { WEFT_COLL_ALLGATHER, 0, 4, 0, SIZE_MAX / 2, 1,
                                  WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_coll_recv_count(&big) == SIZE_MAX, "an overflowing size saturates");
}

/* The registry: every family's name reads back in any case, so do its
 * variants' names, a named variant builds something, and names outside
 * the registry are refused. */
Test(schedule, registry_names)
{
    for (int a = 0; a < WEFT_ALGO_COUNT; a++) {
        const char *name = weft_algo_name(a);
        cr_assert_str_neq(name, "unknown", "algorithm %d is not in the registry", a);
        char up[32];
        size_t n = strlen(name);
        cr_assert(n > 1 && n < sizeof(up));
        for (size_t i = 0; i <= n; i++)
            up[i] = (char)toupper((unsigned char)name[i]);
        cr_assert(weft_algo_from_name(name, n) == a && weft_algo_from_name(up, n) == a);
        cr_assert(weft_algo_from_name(name, n - 1) != a, "a prefix of %s named it", name);
        for (int v = 0; v < WEFT_VAR_COUNT; v++) {
            bool builds = false;
            for (int coll = 0; coll < WEFT_COLL_COUNT; coll++)
                builds |= weft_algo_serves(a, v, coll);
            cr_assert(builds || v > 0, "%s builds nothing", name);
            const char *vn = weft_algo_variant_name(a, v);
            if (vn)
                cr_assert(builds && weft_algo_variant_from_name(a, vn, strlen(vn)) == v,
                          "%s/%s", name, vn);
        }
    }
    const char *names[WEFT_ALGO_COUNT] = { [WEFT_ALGO_RING] = "ring", [WEFT_ALGO_TREE] = "tree",
                                           [WEFT_ALGO_RHD] = "rhd", [WEFT_ALGO_DIRECT] = "direct",
                                           [WEFT_ALGO_HIER] = "hier" };
    /* Users' WEFT_ALGO strings name these: they stay (a family added later
     * has its own name, checked above). */
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        if (names[a])
            cr_assert_str_eq(weft_algo_name(a), names[a]);
    cr_assert_str_eq(weft_algo_variant_name(WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING), "doubling");
    cr_assert_str_eq(weft_algo_variant_name(WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL), "binomial");
    cr_assert(weft_algo_variant_from_name(WEFT_ALGO_HIER, "RHD", 3) == WEFT_VAR_HIER_RHD);
    cr_assert(weft_algo_variant_name(WEFT_ALGO_RING, 0) == NULL);
    cr_assert(weft_algo_variant_name(WEFT_ALGO_RHD, WEFT_VAR_COUNT) == NULL);
    cr_assert(weft_algo_variant_name(WEFT_ALGO_COUNT, 0) == NULL);
    cr_assert(weft_algo_variant_from_name(WEFT_ALGO_RHD, "halving", 7) == -1);
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_COUNT), "unknown");
    cr_assert_str_eq(weft_algo_name(-1), "unknown");
    cr_assert(weft_algo_from_name("rings", 5) == -1 && weft_algo_from_name("", 0) == -1);
}

/* What each plan builds: docs/design.md's table of the families. */
Test(schedule, plans_serve_what_the_design_says)
{
    const unsigned ar = 1u << WEFT_COLL_ALLREDUCE;
    const unsigned rooted = 1u << WEFT_COLL_BROADCAST | 1u << WEFT_COLL_REDUCE;
    const unsigned all = (1u << (WEFT_COLL_REDUCE + 1)) - 1;
    struct {
        int plan;
        unsigned colls;
    } c[] = {
        { PLAN(WEFT_ALGO_RING, 0), all },     { PLAN(WEFT_ALGO_RING, 1), 0 },
        { PLAN_DBT, ar | rooted },            { PLAN_BINOMIAL, rooted },
        { PLAN_RHD, all },                    { PLAN_RD, ar },
        { PLAN_DIRECT, all },                 { PLAN(WEFT_ALGO_DIRECT, 1), 0 },
        { PLAN(WEFT_ALGO_HIER, WEFT_VAR_HIER_RING), all },
        { PLAN(WEFT_ALGO_HIER, WEFT_VAR_HIER_RHD), all },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
        for (int coll = 0; coll < WEFT_COLL_COUNT; coll++)
            cr_assert(weft_algo_serves(PLAN_ALGO(c[i].plan), PLAN_VAR(c[i].plan), coll) ==
                          ((c[i].colls >> coll) & 1u),
                      "%s/%d %s", weft_algo_name(PLAN_ALGO(c[i].plan)), PLAN_VAR(c[i].plan),
                      weft_coll_name(coll));
}

/* ---- the ring -------------------------------------------------------------------- */

/* The structure the engine relies on, beyond correctness. */
Test(ring, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    /* p=1: one COPY, or nothing for count 0. */
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        struct weft_coll_desc d = { coll, 0, 1, 0, 5, 2, WEFT_ALGO_RING, 0, 0, NULL, 0 };
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
        cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5 &&
                      s.scratch_count == 0,
                  "%s p=1: %zu steps", weft_coll_name(coll), s.nsteps);
        d.count = 0;
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    }
    /* Allreduce p=4, N=8, chunk 1: 2 elements per block, 2 chunks per round,
     * 3 + 3 rounds of (send, receive) per chunk = 24 steps; FINAL only on
     * the last reduce-scatter round. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 1, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 24 && s.scratch_count == 0, "%zu steps", s.nsteps);
    int finals = 0;
    for (size_t i = 0; i < s.nsteps; i++) {
        const struct weft_step *st = &s.steps[i];
        cr_assert(st->count == 1);
        cr_assert(st->kind == WEFT_STEP_SEND ? st->peer == 2 : st->peer == 0);
        if (st->flags & WEFT_STEP_FINAL) {
            finals++;
            cr_assert(i >= 8 && i < 12, "FINAL at step %zu", i);
        }
        /* chunk c of round k+1 depends on chunk c of round k only */
        if (st->kind == WEFT_STEP_SEND && i >= 4)
            cr_assert(st->deps[0] == (int32_t)i - 3, "step %zu deps on %d", i, st->deps[0]);
    }
    cr_assert(finals == 2);
    /* Reduce_scatter asks for scratch; reduce only on middle ranks. */
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE_SCATTER, 0, 4, 0, 10, 4, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 40);
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE, 2, 4, 0, 10, 4, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 10);
    d.rank = 0; /* the root */
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    d.rank = 1; /* first in the chain: sends its input only */
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 0 && s.nsteps == 3);
    weft_sched_free(&s);
}

/* A rebuild into a used schedule starts from empty. */
Test(ring, rebuild_reuses_schedule)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 8, 0, 1000, 1, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    size_t big = s.nsteps;
    d.count = 16;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps < big && s.nsteps == 56, "%zu steps", s.nsteps);
    weft_sched_free(&s);
}

/* ---- the binomial tree broadcast ------------------------------------------------- */

/* ceil(log2 p) hops: the root sends each chunk to that many children, and
 * no rank receives a chunk twice. */
Test(tree, binomial_shape)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    for (int p = 1; p <= 70; p++) {
        int L = 0;
        while ((1 << L) < p)
            L++;
        struct weft_coll_desc d = { WEFT_COLL_BROADCAST, 3 % p, p, 3 % p, 10, 4, WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, 0, NULL, 0 };
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
        size_t sends = 0, recvs = 0;
        for (size_t i = 0; i < s.nsteps; i++) {
            sends += s.steps[i].kind == WEFT_STEP_SEND;
            recvs += s.steps[i].kind == WEFT_STEP_RECV;
        }
        cr_assert(sends == (size_t)L * 3 && recvs == 0, "p=%d root: %zu sends, %zu receives", p,
                  sends, recvs);
    }
    weft_sched_free(&s);
}

/* ---- recursive doubling ---------------------------------------------------------- */

/* The shape the cost model in select/tune.c assumes: log2(p) whole-vector
 * exchanges, plus the fold in and out for a rank count that is not a
 * power of two. */
Test(rd, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 1, 0, 5, 2, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5);
    d.count = 0;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    /* p=4, rank 1, 8 elements in chunks of 3: round 0 with rank 0 (rank 1
     * is the upper half: RECV_FIRST), round 1 with rank 3 (lower: FINAL). */
    d = (struct weft_coll_desc){ WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 3, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 12 && s.scratch_count == 0, "%zu steps", s.nsteps);
    for (size_t i = 0; i < s.nsteps; i++) {
        const struct weft_step *st = &s.steps[i];
        bool round0 = i < 6, send = i % 2 == 0;
        cr_assert(st->kind == (send ? WEFT_STEP_SEND : WEFT_STEP_RECV_REDUCE), "step %zu", i);
        cr_assert(st->peer == (round0 ? 0 : 3), "step %zu peer %d", i, st->peer);
        cr_assert(st->off == i / 2 % 3 * 3 && st->count == (i / 2 % 3 == 2 ? 2u : 3u));
        int want = send ? 0 : round0 ? WEFT_STEP_RECV_FIRST : WEFT_STEP_FINAL;
        cr_assert(st->flags == want, "step %zu flags %d", i, st->flags);
        if (send)
            cr_assert(st->buf == (round0 ? WEFT_BUF_SEND : WEFT_BUF_RECV));
        else
            cr_assert(st->buf == WEFT_BUF_RECV && st->deps[0] == (int32_t)i - 1);
        /* chunk c of round 1 waits for chunk c of round 0 only */
        if (!round0 && send)
            cr_assert(st->deps[0] == (int32_t)i - 5, "step %zu deps on %d", i, st->deps[0]);
    }
    /* p=5 folds rank 0 into rank 1. */
    d = (struct weft_coll_desc){ WEFT_COLL_ALLREDUCE, 0, 5, 0, 8, 3, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 6);
    for (size_t i = 0; i < 6; i++)
        cr_assert(s.steps[i].kind == (i < 3 ? WEFT_STEP_SEND : WEFT_STEP_RECV) &&
                      s.steps[i].peer == 1 && s.steps[i].flags == 0,
                  "folded rank, step %zu", i);
    d.rank = 1;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 18, "%zu steps", s.nsteps);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3);
    for (size_t i = 0; i < 3; i++)
        cr_assert(s.steps[i].kind == WEFT_STEP_RECV_REDUCE && s.steps[i].peer == 0 &&
                  s.steps[i].flags == WEFT_STEP_RECV_FIRST && s.steps[i].src_buf == WEFT_BUF_SEND);
    for (size_t i = 15; i < 18; i++)
        cr_assert(s.steps[i].kind == WEFT_STEP_SEND && s.steps[i].peer == 0 &&
                  s.steps[i].buf == WEFT_BUF_RECV);
    d.rank = 4;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 12);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3);
    weft_sched_free(&s);
}

/* ---- recursive halving/doubling -------------------------------------------------- */

static size_t sum_counts(const struct weft_schedule *s, int kind)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nsteps; i++)
        n += s->steps[i].kind == kind ? s->steps[i].count : 0;
    return n;
}

/* The shape the cost model may assume: log2(p) halving rounds of shrinking
 * halves, log2(p) doubling rounds, one FINAL block per rank; broadcast
 * receives every element once; scratch only where partial sums need it. */
Test(rhd, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    /* p=8, 64 elements in one chunk: sends of 32, 16, 8, then 8, 16, 32. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 3, 8, 0, 64, 1 << 20, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 12 && s.scratch_count == 0, "%zu steps", s.nsteps);
    size_t want[] = { 32, 16, 8, 8, 16, 32 };
    for (size_t i = 0; i < s.nsteps; i++) {
        const struct weft_step *st = &s.steps[i];
        cr_assert(st->count == want[i / 2], "step %zu count %zu", i, st->count);
        cr_assert(st->kind == (i % 2 ? (i < 6 ? WEFT_STEP_RECV_REDUCE : WEFT_STEP_RECV)
                                     : WEFT_STEP_SEND), "step %zu", i);
        cr_assert(!(st->flags & WEFT_STEP_FINAL) == (i != 5), "step %zu flags %d", i, st->flags);
    }
    /* Chunks of 3: each piece of a round waits for its chunk's piece only. */
    d.chunk = 3;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    for (size_t i = 0; i < s.nsteps; i++) {
        const struct weft_step *st = &s.steps[i];
        cr_assert(st->count <= 3 && st->off / 3 == (st->off + st->count - 1) / 3);
        for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
            if (st->deps[k] >= 0)
                cr_assert(s.steps[st->deps[k]].off / 3 == st->off / 3, "step %zu", i);
    }
    /* Broadcast: a non-root receives each element once; the root only sends. */
    for (int p = 2; p <= 12; p++)
        for (int rank = 0; rank < p; rank++) {
            d = (struct weft_coll_desc){ WEFT_COLL_BROADCAST, rank, p, 1 % p, 100, 7,
                                         WEFT_ALGO_RHD, 0, 0, NULL, 0 };
            cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
            size_t got = sum_counts(&s, WEFT_STEP_RECV);
            cr_assert(got == (rank == 1 % p ? 0u : 100u), "p=%d rank %d receives %zu", p, rank,
                      got);
        }
    /* Reduce_scatter keeps partial sums in scratch once there are two
     * halving rounds or a fold; p=2 reduces straight into recvbuf. */
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE_SCATTER, 0, 2, 0, 10, 4, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    d.nranks = 4;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 40);
    /* p=3: rank 0 is folded: it sends its 30 and gets its 10 back. */
    d.nranks = 3;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    cr_assert(sum_counts(&s, WEFT_STEP_SEND) == 30 && sum_counts(&s, WEFT_STEP_RECV) == 10);
    /* Reduce: scratch off the root only. */
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE, 2, 4, 2, 10, 4, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    d.rank = 3;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.scratch_count == 10);
    /* p=1: one COPY, or nothing for count 0. */
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        d = (struct weft_coll_desc){ coll, 0, 1, 0, 5, 2, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
        cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5);
        d.count = 0;
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    }
    weft_sched_free(&s);
}

/* ---- the double binary tree ------------------------------------------------------ */

/* One rank's place in one tree, read off its allreduce (rooted: reduce)
 * schedule of 2 elements, one per tree: the children are the peers of the
 * receive-reduces of that element, the parent the peer of its receive
 * (rooted: its send). */
struct tree_place {
    int parent, nkids, finals;
};

/* The vector element step i of s works on: a step on scratch is traced
 * back through its deps to the fold that read sendbuf or recvbuf. */
static size_t elem_of(const struct weft_schedule *s, size_t i)
{
    const struct weft_step *st = &s->steps[i];
    while (st->kind == WEFT_STEP_RECV_REDUCE ? st->src_buf == WEFT_BUF_SCRATCH
                                             : st->buf == WEFT_BUF_SCRATCH) {
        cr_assert(st->deps[0] >= 0);
        st = &s->steps[st->deps[0]];
    }
    return st->kind == WEFT_STEP_RECV_REDUCE ? st->src_off : st->off;
}

static struct tree_place place_of(const struct weft_schedule *s, size_t elem, bool rooted)
{
    struct tree_place pl = { -1, 0, 0 };
    for (size_t i = 0; i < s->nsteps; i++) {
        const struct weft_step *st = &s->steps[i];
        if (st->kind == WEFT_STEP_COPY || elem_of(s, i) != elem)
            continue;
        if (st->kind == WEFT_STEP_RECV_REDUCE) {
            pl.nkids++;
            pl.finals += (st->flags & WEFT_STEP_FINAL) != 0;
        } else if (st->kind == (rooted ? WEFT_STEP_SEND : WEFT_STEP_RECV)) {
            cr_assert(pl.parent < 0, "two parents");
            pl.parent = st->peer;
        }
    }
    return pl;
}

/* The two trees are complementary: no rank forwards in both (so each
 * forwards half the data at most), a rank has two children at most, the
 * two allreduce roots differ, and the depth is ceil(log2(p + 1)) levels
 * (rooted: the root above both trees, over the other p - 1 ranks). */
Test(dbt, complementary_trees)
{
    enum { PMAX = 130 };
    static struct weft_schedule sch[PMAX];
    for (int rooted = 0; rooted < 2; rooted++) {
        for (int p = 1; p <= PMAX; p++) {
            int root = rooted ? p / 3 : 0, n = rooted ? p - 1 : p;
            int coll = rooted ? WEFT_COLL_REDUCE : WEFT_COLL_ALLREDUCE;
            struct tree_place pl[2][PMAX];
            for (int r = 0; r < p; r++) {
                struct weft_coll_desc d = { coll, r, p, root, 2, 64, WEFT_ALGO_TREE,
                                            WEFT_VAR_TREE_DOUBLE, 0, NULL, 0 };
                weft_sched_init(&sch[r]);
                cr_assert(weft_sched_build(&d, &sch[r]) == WEFT_OK);
                for (int t = 0; t < 2; t++)
                    pl[t][r] = place_of(&sch[r], (size_t)t, rooted);
            }
            int levels = 0; /* ceil(log2(n + 1)) */
            while ((1 << levels) < n + 1)
                levels++;
            int tree_root[2] = { -1, -1 };
            for (int t = 0; t < 2; t++) {
                int finals = 0;
                for (int r = 0; r < p; r++) {
                    cr_assert(pl[t][r].nkids <= 2, "p=%d tree %d rank %d: %d children", p, t, r,
                              pl[t][r].nkids);
                    finals += pl[t][r].finals;
                    if (pl[t][r].parent < 0)
                        tree_root[t] = r;
                    if (rooted && r == root)
                        cr_assert(pl[t][r].nkids == (p > 1) && pl[t][r].parent < 0);
                    else if (r != tree_root[t] || rooted)
                        cr_assert(pl[t][r].parent >= 0, "p=%d tree %d rank %d has no parent", p,
                                  t, r);
                    /* the depth of r: hops up to the root */
                    int depth = 0;
                    for (int q = r; pl[t][q].parent >= 0; q = pl[t][q].parent)
                        cr_assert(++depth <= p, "p=%d tree %d: a cycle", p, t);
                    cr_assert(depth <= levels - 1 + rooted, "p=%d tree %d rank %d: depth %d", p,
                              t, r, depth);
                }
                cr_assert(finals == (p > 1), "p=%d tree %d: %d FINAL folds", p, t, finals);
                cr_assert(rooted ? tree_root[t] == root : tree_root[t] >= 0);
            }
            for (int r = 0; r < p; r++)
                if (!(rooted && r == root))
                    cr_assert(pl[0][r].nkids == 0 || pl[1][r].nkids == 0,
                              "p=%d rooted=%d: rank %d forwards in both trees", p, rooted, r);
            if (!rooted && p > 1)
                cr_assert(tree_root[0] != tree_root[1], "p=%d: one root for both trees", p);
            /* Some rank is as deep as the bound: the trees are not chains
             * cut short, nor deeper than they need. */
            if (n >= 1) {
                int deepest = 0;
                for (int r = 0; r < p; r++) {
                    int depth = 0;
                    for (int q = r; pl[0][q].parent >= 0; q = pl[0][q].parent)
                        depth++;
                    deepest = depth > deepest ? depth : deepest;
                }
                cr_assert(deepest == levels - 1 + rooted, "p=%d rooted=%d: depth %d, want %d", p,
                          rooted, deepest, levels - 1 + rooted);
            }
            free_all(p, sch);
        }
    }
}

/* Pipelining: chunk c of the broadcast waits for chunk c of the reduce
 * only, so the two phases overlap.  p=3, 12 elements in chunks of 2: tree
 * 0 carries 6 (3 chunks), rooted at rank 1 (key 2), which has children 0
 * and 2 and, in tree 1, is a leaf below rank 2. */
Test(dbt, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 3, 0, 12, 2, WEFT_ALGO_TREE,
                                WEFT_VAR_TREE_DOUBLE, 0, NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    cr_assert(s.scratch_count == 0);
    int finals = 0;
    size_t downs = 0;
    for (size_t i = 0; i < s.nsteps; i++) {
        const struct weft_step *st = &s.steps[i];
        cr_assert(st->count == 2, "step %zu: %zu elements", i, st->count);
        if (st->off < 6) { /* tree 0: the root */
            cr_assert(st->kind == WEFT_STEP_RECV_REDUCE || st->kind == WEFT_STEP_SEND);
            if (st->kind == WEFT_STEP_RECV_REDUCE && (st->flags & WEFT_STEP_FINAL)) {
                finals++;
                cr_assert(st->peer == 2 && st->deps[0] == (int32_t)i - 1 &&
                          s.steps[i - 1].peer == 0 && s.steps[i - 1].off == st->off);
            }
            if (st->kind == WEFT_STEP_SEND) {
                const struct weft_step *fin = &s.steps[st->deps[0]];
                cr_assert(st->buf == WEFT_BUF_RECV && (fin->flags & WEFT_STEP_FINAL) &&
                          fin->off == st->off, "step %zu: a send down before its reduction", i);
                downs++;
            }
        } else { /* tree 1: a leaf below rank 2 */
            cr_assert(st->peer == 2 && st->kind != WEFT_STEP_RECV_REDUCE);
            if (st->kind == WEFT_STEP_RECV) {
                const struct weft_step *up = &s.steps[st->deps[0]];
                cr_assert(up->kind == WEFT_STEP_SEND && up->off == st->off &&
                          up->buf == WEFT_BUF_SEND);
            }
        }
    }
    cr_assert(finals == 3 && downs == 6, "%d FINAL, %zu sends down", finals, downs);
    /* Reduce: forwarding ranks fold in scratch, the half they forward. */
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE, 0, 8, 0, 11, 4, WEFT_ALGO_TREE,
                                 WEFT_VAR_TREE_DOUBLE, 0, NULL, 0 };
    size_t forwarded = 0;
    for (int r = 0; r < 8; r++) {
        d.rank = r;
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
        cr_assert(s.scratch_count == 0 || s.scratch_count == 6 || s.scratch_count == 5,
                  "rank %d: scratch %zu", r, s.scratch_count);
        cr_assert(r != 0 || s.scratch_count == 0);
        forwarded += s.scratch_count;
    }
    cr_assert(forwarded == 3 * 6 + 3 * 5, "%zu", forwarded);
    weft_sched_free(&s);
}

/* ---- direct ---------------------------------------------------------------------- */

/* Rank r sends to r+1, r+2, ... and folds what r-1, r-2, ... send, FINAL
 * on the last fold; the allgather half waits for that fold. */
Test(direct, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    /* p=4, 8 elements (2 per block), one chunk: rank 1. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 100, WEFT_ALGO_DIRECT, 0, 0,
                                NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 12 && s.scratch_count == 0, "%zu steps", s.nsteps);
    int kinds[] = { WEFT_STEP_SEND, WEFT_STEP_SEND, WEFT_STEP_SEND,
                    WEFT_STEP_RECV_REDUCE, WEFT_STEP_RECV_REDUCE, WEFT_STEP_RECV_REDUCE,
                    WEFT_STEP_SEND, WEFT_STEP_SEND, WEFT_STEP_SEND,
                    WEFT_STEP_RECV, WEFT_STEP_RECV, WEFT_STEP_RECV };
    int peers[] = { 2, 3, 0, 0, 3, 2, 2, 3, 0, 0, 3, 2 };
    size_t offs[] = { 4, 6, 0, 2, 2, 2, 2, 2, 2, 0, 6, 4 };
    for (size_t i = 0; i < 12; i++) {
        const struct weft_step *st = &s.steps[i];
        cr_assert(st->kind == kinds[i] && st->peer == peers[i] && st->off == offs[i] &&
                      st->count == 2,
                  "step %zu: kind %d peer %d off %zu", i, st->kind, st->peer, st->off);
        cr_assert((st->flags == WEFT_STEP_FINAL) == (i == 5), "step %zu flags %d", i, st->flags);
    }
    cr_assert(s.steps[6].deps[0] == 5 && s.steps[9].deps[0] == 2 && s.steps[11].deps[0] == 0);
    /* Broadcast: the root sends each chunk to every rank; reduce: folds. */
    d = (struct weft_coll_desc){ WEFT_COLL_BROADCAST, 2, 5, 2, 10, 4, WEFT_ALGO_DIRECT, 0, 0,
                                 NULL, 0 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 3 * 4 + 1);
    cr_assert(s.steps[0].peer == 3 && s.steps[3].peer == 1 && s.steps[12].kind == WEFT_STEP_COPY);
    d.coll = WEFT_COLL_REDUCE;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 3 * 4);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3 && s.steps[0].peer == 1 &&
              s.steps[3].peer == 3 && (s.steps[3].flags & WEFT_STEP_FINAL));
    d.rank = 4;
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps == 3 && s.steps[2].peer == 2);
    weft_sched_free(&s);
}
