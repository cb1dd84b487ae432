/*
 * test_schedule.c - the schedule tests: every ring, recursive doubling and
 * binomial tree schedule proved correct by the checker in sched_sim.c, the
 * matrix of every algorithm x collective x rank count up to 4097, broken
 * schedules it must catch, engine deadlocks, and the schedule container.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sched_sim.h"

/* ---- the ring, checked -------------------------------------------------------- */

/* A plan bit of this file: build with desc.ordered set (deterministic mode). */
#define PLAN_ORDERED (1 << 16)

static void build_all(int algo, int coll, int p, int root, size_t count, size_t chunk,
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

static void free_all(int p, struct weft_schedule *sch)
{
    for (int rank = 0; rank < p; rank++)
        weft_sched_free(&sch[rank]);
}

static void check_sched(int algo, int coll, int p, int root, size_t count, size_t chunk,
                        int slots)
{
    struct weft_schedule *sch = calloc((size_t)p, sizeof(*sch));
    char err[700];
    cr_assert(sch);
    build_all(algo, coll, p, root, count, chunk, sch);
    bool ok = verify(algo & ~PLAN_ORDERED, coll, p, root, count, sch, slots, err, sizeof(err));
    free_all(p, sch);
    free(sch);
    cr_assert(ok, "%schunk %zu: %s", algo & PLAN_ORDERED ? "ordered, " : "", chunk, err);
}

/* The rank counts the per-algorithm matrices run (the matrix tests below
 * go further): at most 64. */
#define SMALLP 64

/* Fills ps with pmin..pmax, then 31 and 64 when with_big; returns how many. */
static int rank_counts(int pmin, int pmax, bool with_big, int ps[SMALLP])
{
    int np = 0;
    for (int p = pmin; p <= pmax; p++)
        ps[np++] = p;
    if (with_big) {
        ps[np++] = 31;
        ps[np++] = 64;
    }
    return np;
}

/* Ranks pmin..pmax, then 31 and 64 when with_big; slots: see verify. */
static void plan_matrix(int plan, int coll, int pmin, int pmax, bool with_big, int slots)
{
    int ps[SMALLP], np = rank_counts(pmin, pmax, with_big, ps);
    for (int i = 0; i < np; i++) {
        int p = ps[i];
        /* Allgather and reduce_scatter count per block, the others per
         * rank: their large and many-chunk cases are scaled so that steps
         * per rank stay comparable (the race check is quadratic in them). */
        bool per_block = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCE_SCATTER;
        size_t small = per_block ? 17 : 10 * (size_t)p + 7;
        size_t big = per_block ? 1 << 18 : 65536;
        /* 9p+1 in chunks of 3: block 0 has one chunk more than the rest. */
        size_t uneven = per_block ? 4 : 9 * (size_t)p + 1;
        size_t counts[] = { 0, 1, (size_t)p - 1, (size_t)p + 1, 1000003, small, uneven };
        size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, big, 3, 3 };
        int roots[SMALLP], nroots = 0;
        bool rooted = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
        if (!rooted || p <= 16) {
            for (int r = 0; r < (rooted ? p : 1); r++)
                roots[nroots++] = r;
        } else {
            int pick[] = { 0, 1, p / 2, p - 1 };
            for (int k = 0; k < 4; k++)
                roots[nroots++] = pick[k];
        }
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int r = 0; r < nroots; r++)
                check_sched(plan, coll, p, roots[r], counts[c], chunks[c], slots);
        /* Chunk 1: every element its own step. */
        check_sched(plan, coll, p, roots[nroots - 1], per_block ? 3 : (size_t)p + 1, 1, slots);
    }
}

static void ring_matrix(int coll, int pmin, int pmax, bool with_big, int slots)
{
    plan_matrix(WEFT_ALGO_RING, coll, pmin, pmax, with_big, slots);
}

Test(ring, allreduce_small_p) { ring_matrix(WEFT_COLL_ALLREDUCE, 1, 8, false, engine_slots()); }
Test(ring, allreduce_large_p) { ring_matrix(WEFT_COLL_ALLREDUCE, 9, 16, true, engine_slots()); }
Test(ring, reduce_scatter) { ring_matrix(WEFT_COLL_REDUCE_SCATTER, 1, 16, true, engine_slots()); }
Test(ring, allgather) { ring_matrix(WEFT_COLL_ALLGATHER, 1, 16, true, engine_slots()); }
Test(ring, broadcast) { ring_matrix(WEFT_COLL_BROADCAST, 1, 16, true, engine_slots()); }
Test(ring, reduce) { ring_matrix(WEFT_COLL_REDUCE, 1, 16, true, engine_slots()); }

/* Few staging slots: a RECV_REDUCE holds one from its post to its reduce,
 * and must not end up waiting for one that only a later step frees. */
Test(ring, no_buffering_needed)
{
    int colls[] = { WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_REDUCE };
    for (int slots = 1; slots <= 2; slots++)
        for (size_t c = 0; c < sizeof(colls) / sizeof(colls[0]); c++)
            ring_matrix(colls[c], 1, 9, false, slots);
}

/* The structure the engine relies on, beyond correctness. */
Test(ring, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    /* p=1: one COPY, or nothing for count 0. */
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        struct weft_coll_desc d = { coll, 0, 1, 0, 5, 2, WEFT_ALGO_RING, 0, 0, NULL, 0 };
        cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
        cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5 &&
                      s.scratch_count == 0,
                  "%s p=1: %zu steps", weft_coll_name(coll), s.nsteps);
        d.count = 0;
        cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    }
    /* Allreduce p=4, N=8, chunk 1: 2 elements per block, 2 chunks per round,
     * 3 + 3 rounds of (send, receive) per chunk = 24 steps; FINAL only on
     * the last reduce-scatter round. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 1, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
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
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 40);
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE, 2, 4, 0, 10, 4, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 10);
    d.rank = 0; /* the root */
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    d.rank = 1; /* first in the chain: sends its input only */
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK && s.scratch_count == 0 && s.nsteps == 3);
    weft_sched_free(&s);
}

Test(ring, bad_descriptions)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct {
        struct weft_coll_desc d;
        weft_status_t want;
        const char *needle;
    } c[] = {
#define RING_DESC(coll, rank, p, root, count, chunk)                                          \
    { coll, rank, p, root, count, chunk, WEFT_ALGO_RING, 0, 0, NULL, 0 }
        { RING_DESC(WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 1), WEFT_ERR_INVALID_ARG, "nranks" },
        { RING_DESC(WEFT_COLL_ALLREDUCE, -1, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "rank -1" },
        { RING_DESC(WEFT_COLL_ALLREDUCE, 4, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "rank 4" },
        { RING_DESC(WEFT_COLL_BROADCAST, 0, 4, 4, 4, 1), WEFT_ERR_INVALID_ARG, "root 4" },
        { RING_DESC(WEFT_COLL_REDUCE, 0, 4, -1, 4, 1), WEFT_ERR_INVALID_ARG, "root -1" },
        { RING_DESC(WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 0), WEFT_ERR_INVALID_ARG, "chunk" },
        { RING_DESC(99, 0, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "unknown collective" },
        { RING_DESC(-1, 0, 4, 0, 4, 1), WEFT_ERR_INVALID_ARG, "unknown collective" },
        { RING_DESC(WEFT_COLL_SEND, 0, 4, 0, 4, 1), WEFT_ERR_UNSUPPORTED, "point to point" },
        { RING_DESC(WEFT_COLL_ALLGATHER, 0, 4, 0, SIZE_MAX / 2, 1), WEFT_ERR_INVALID_ARG,
          "overflows" },
        { RING_DESC(WEFT_COLL_REDUCE_SCATTER, 0, 3, 0, SIZE_MAX / 2, 1), WEFT_ERR_INVALID_ARG,
          "overflows" },
#undef RING_DESC
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        weft_status_t st = weft_ring_build(&c[i].d, &s);
        cr_assert(st == c[i].want, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0);
    }
    /* Root does not matter where there is none. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 4, 77, 4, 1, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
    cr_assert(weft_ring_build(NULL, &s) == WEFT_ERR_INVALID_ARG);
    cr_assert(weft_ring_build(&d, NULL) == WEFT_ERR_INVALID_ARG);
    weft_sched_free(&s);
}

/* A rebuild into a used schedule starts from empty. */
Test(ring, rebuild_reuses_schedule)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 8, 0, 1000, 1, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
    size_t big = s.nsteps;
    d.count = 16;
    cr_assert(weft_ring_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps < big && s.nsteps == 56, "%zu steps", s.nsteps);
    weft_sched_free(&s);
}

/* ---- the binomial tree broadcast, checked -------------------------------------- */

/* Every root of every rank count 1..pmax (then 31 and 64), counts that
 * leave a partial last chunk, one chunk and many. */
static void tree_matrix(int pmin, int pmax, bool with_big, int slots)
{
    int ps[SMALLP], np = rank_counts(pmin, pmax, with_big, ps);
    for (int i = 0; i < np; i++) {
        size_t p = (size_t)ps[i];
        size_t counts[] = { 0, 1, p - 1, p + 1, 1000003, 10 * p + 7 };
        size_t chunks[] = { 1 << 20, 1 << 20, 1, 2, 65536, 3 };
        int roots[] = { 0, ps[i] - 1, ps[i] / 2 };
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (size_t r = 0; r < 3; r++)
                check_sched(PLAN_BINOMIAL, WEFT_COLL_BROADCAST, ps[i], roots[r], counts[c],
                            chunks[c], slots);
    }
}

Test(tree, broadcast_small_p) { tree_matrix(1, 9, false, engine_slots()); }
Test(tree, broadcast_large_p) { tree_matrix(10, 17, true, engine_slots()); }
Test(tree, broadcast_unbuffered) { tree_matrix(1, 9, false, 1); }

/* ceil(log2 p) hops: the root sends each chunk to that many children, and
 * no rank receives a chunk twice; other collectives are refused. */
Test(tree, shape_and_refusals)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    for (int p = 1; p <= 70; p++) {
        int L = 0;
        while ((1 << L) < p)
            L++;
        struct weft_coll_desc d = { WEFT_COLL_BROADCAST, 3 % p, p, 3 % p, 10, 4, WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, 0, NULL, 0 };
        cr_assert(weft_tree_build(&d, &s) == WEFT_OK);
        size_t sends = 0, recvs = 0;
        for (size_t i = 0; i < s.nsteps; i++) {
            sends += s.steps[i].kind == WEFT_STEP_SEND;
            recvs += s.steps[i].kind == WEFT_STEP_RECV;
        }
        cr_assert(sends == (size_t)L * 3 && recvs == 0, "p=%d root: %zu sends, %zu receives", p,
                  sends, recvs);
    }
    struct weft_coll_desc bad = { WEFT_COLL_ALLREDUCE, 0, 4, 0, 10, 4, WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, 0, NULL, 0 };
    cr_assert(weft_tree_build(&bad, &s) == WEFT_ERR_UNSUPPORTED);
    bad = (struct weft_coll_desc){ WEFT_COLL_BROADCAST, 0, 4, 4, 10, 4, WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, 0, NULL, 0 };
    cr_assert(weft_tree_build(&bad, &s) == WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(weft_last_error(NULL), "root 4"), "%s", weft_last_error(NULL));
    bad.root = 0;
    bad.chunk = 0;
    cr_assert(weft_tree_build(&bad, &s) == WEFT_ERR_INVALID_ARG);
    weft_sched_free(&s);
}

/* ---- recursive doubling, checked ---------------------------------------------- */

/* Allreduce over ranks pmin..pmax (then 31 and 64 when with_big): powers of
 * two, folded rank counts, counts that leave ranks without a full chunk.
 * slots: see verify. */
static void rd_matrix(int pmin, int pmax, bool with_big, int slots)
{
    int ps[SMALLP], np = rank_counts(pmin, pmax, with_big, ps);
    for (int i = 0; i < np; i++) {
        size_t p = (size_t)ps[i];
        size_t counts[] = { 0, 1, p - 1, p + 1, 1000003, 10 * p + 7, 9 * p + 1 };
        size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, 65536, 3, 3 };
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            check_sched(PLAN_RD, WEFT_COLL_ALLREDUCE, ps[i], 0, counts[c], chunks[c],
                        slots);
        check_sched(PLAN_RD, WEFT_COLL_ALLREDUCE, ps[i], 0, p + 1, 1, slots);
    }
}

Test(rd, allreduce_small_p) { rd_matrix(1, 8, false, engine_slots()); }
Test(rd, allreduce_large_p) { rd_matrix(9, 16, true, engine_slots()); }

/* A TCP send completes only once the kernel has taken all of it.  Both
 * partners of an exchange send first and make the reduce wait for their own
 * send; while the engine posted a RECV_REDUCE only once its deps were done,
 * a chunk larger than the socket buffers hung there (seen: 2 ranks,
 * WEFT_SOCKET_BUFSIZE=65536, 256 KiB float sum, "waiting on: send to rank
 * 1").  Now the receive goes out while the send is in flight; unbuffered
 * execution must not deadlock, down to one staging slot. */
Test(rd, no_buffering_needed)
{
    for (int slots = 1; slots <= 2; slots++)
        rd_matrix(1, 9, false, slots);
    rd_matrix(1, 9, false, SLOTS_UNLIMITED);
}

static int count_flag(const struct weft_schedule *s, int flag)
{
    int n = 0;
    for (size_t i = 0; i < s->nsteps; i++)
        n += (s->steps[i].flags & flag) != 0;
    return n;
}

/* The shape the cost model in src/tune.c assumes: log2(p) whole-vector
 * exchanges, plus the fold in and out for a rank count that is not a
 * power of two. */
Test(rd, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 1, 0, 5, 2, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 };
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK);
    cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5);
    d.count = 0;
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    /* p=4, rank 1, 8 elements in chunks of 3: round 0 with rank 0 (rank 1
     * is the upper half: RECV_FIRST), round 1 with rank 3 (lower: FINAL). */
    d = (struct weft_coll_desc){ WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 3, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 };
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK);
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
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 6);
    for (size_t i = 0; i < 6; i++)
        cr_assert(s.steps[i].kind == (i < 3 ? WEFT_STEP_SEND : WEFT_STEP_RECV) &&
                      s.steps[i].peer == 1 && s.steps[i].flags == 0,
                  "folded rank, step %zu", i);
    d.rank = 1;
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 18, "%zu steps", s.nsteps);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3);
    for (size_t i = 0; i < 3; i++)
        cr_assert(s.steps[i].kind == WEFT_STEP_RECV_REDUCE && s.steps[i].peer == 0 &&
                  s.steps[i].flags == WEFT_STEP_RECV_FIRST && s.steps[i].src_buf == WEFT_BUF_SEND);
    for (size_t i = 15; i < 18; i++)
        cr_assert(s.steps[i].kind == WEFT_STEP_SEND && s.steps[i].peer == 0 &&
                  s.steps[i].buf == WEFT_BUF_RECV);
    d.rank = 4;
    cr_assert(weft_rd_build(&d, &s) == WEFT_OK && s.nsteps == 12);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3);
    weft_sched_free(&s);
}

Test(rd, bad_descriptions)
{
    struct {
        struct weft_coll_desc d;
        weft_status_t want;
        const char *needle;
    } c[] = {
        { { WEFT_COLL_BROADCAST, 0, 4, 0, 4, 1, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 }, WEFT_ERR_UNSUPPORTED,
          "only allreduce, not broadcast" },
        { { WEFT_COLL_REDUCE_SCATTER, 0, 4, 0, 4, 1, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 }, WEFT_ERR_UNSUPPORTED,
          "only allreduce" },
        { { WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 1, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 }, WEFT_ERR_INVALID_ARG, "of 0" },
        { { WEFT_COLL_ALLREDUCE, -1, 4, 0, 4, 1, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 }, WEFT_ERR_INVALID_ARG,
          "rank -1" },
        { { WEFT_COLL_ALLREDUCE, 4, 4, 0, 4, 1, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 }, WEFT_ERR_INVALID_ARG, "rank 4" },
        { { WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 0, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 }, WEFT_ERR_INVALID_ARG, "chunk 0" },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct weft_schedule s;
        weft_sched_init(&s);
        weft_status_t st = weft_rd_build(&c[i].d, &s);
        cr_assert(st == c[i].want, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0);
        /* The dispatcher passes the same verdict on. */
        cr_assert(weft_sched_build(&c[i].d, &s) == c[i].want, "case %zu via sched_build", i);
        weft_sched_free(&s);
    }
}

/* Field by field: struct weft_step has padding that a copy may not keep. */
static bool same_steps(const struct weft_schedule *a, const struct weft_schedule *b)
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

/* weft_sched_build runs the algorithm the description names. */
Test(schedule, build_dispatches_on_algo)
{
    struct weft_schedule a, b;
    weft_sched_init(&a);
    weft_sched_init(&b);
    const int plans[] = { PLAN(WEFT_ALGO_RING, 0), PLAN_RD, PLAN_BINOMIAL };
    for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++) {
        int algo = PLAN_ALGO(plans[i]);
        int coll = algo == WEFT_ALGO_TREE ? WEFT_COLL_BROADCAST : WEFT_COLL_ALLREDUCE;
        struct weft_coll_desc d = { coll, 3, 6, 0, 100, 7, algo, PLAN_VAR(plans[i]), 0, NULL, 0 };
        cr_assert(weft_sched_build(&d, &a) == WEFT_OK);
        weft_status_t st = algo == WEFT_ALGO_RHD    ? weft_rd_build(&d, &b)
                           : algo == WEFT_ALGO_TREE ? weft_tree_build(&d, &b)
                                                    : weft_ring_build(&d, &b);
        cr_assert(st == WEFT_OK);
        cr_assert(same_steps(&a, &b), "%s", weft_algo_name(algo));
        /* They really differ: rd exchanges whole chunks with 3 partners. */
        if (algo == WEFT_ALGO_RHD)
            cr_assert(a.nsteps != 0 && count_flag(&a, WEFT_STEP_RECV_FIRST) > 0);
    }
    int bad[] = { WEFT_ALGO_COUNT, -1, 77 };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 1, bad[i], 0, 0, NULL, 0 };
        cr_assert(weft_sched_build(&d, &a) == WEFT_ERR_UNSUPPORTED);
        cr_assert(strstr(weft_last_error(NULL), "builds no"), "'%s'",
                  weft_last_error(NULL));
    }
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_RING), "ring");
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_RHD), "rhd");
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_DIRECT), "direct");
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_HIER), "hier");
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_TREE), "tree");
    cr_assert_str_eq(weft_algo_name(WEFT_ALGO_COUNT), "unknown");
    weft_sched_free(&a);
    weft_sched_free(&b);
}

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
    bool ok = verify_desc(&d, sch, engine_slots(), err, sizeof(err));
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
        bool rooted = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
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
        bool reduces = coll == WEFT_COLL_ALLREDUCE || coll == WEFT_COLL_REDUCE_SCATTER ||
                       coll == WEFT_COLL_REDUCE;
        for (int algo = 0; algo < WEFT_ALGO_COUNT; algo++)
            for (int var = 0; var < WEFT_VAR_COUNT; var++) {
                if (!weft_algo_serves(algo, var, coll))
                    continue;
                if (ordered && (algo != WEFT_ALGO_RING || !reduces))
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

/* Runs the matrix for each rank count in ps and says how long it took. */
static void matrix_group(const char *name, const int *ps, size_t nps, bool ordered)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct mstats ms = { 0 };
    for (size_t i = 0; i < nps; i++)
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

/* ---- the checker catches broken schedules ----------------------------------------- */

/* Builds a correct schedule set, lets mutate() break it, and expects the
 * checker to say so with a message containing needle. */
static void expect_caught_algo(int algo, int coll, int p, int root, size_t count, size_t chunk,
                               void (*mutate)(struct weft_schedule *sch, int p),
                               const char *needle)
{
    struct weft_schedule *sch = calloc((size_t)p, sizeof(*sch));
    char err[700] = "";
    int slots = engine_slots();
    cr_assert(sch);
    build_all(algo, coll, p, root, count, chunk, sch);
    cr_assert(verify(algo, coll, p, root, count, sch, slots, err, sizeof(err)),
              "baseline: %s", err);
    mutate(sch, p);
    bool ok = verify(algo, coll, p, root, count, sch, slots, err, sizeof(err));
    free_all(p, sch);
    free(sch);
    if (needle == NULL) {
        cr_assert(ok, "a harmless change was rejected: %s", err);
        return;
    }
    cr_assert(!ok, "the checker missed: %s", needle);
    cr_assert(strstr(err, needle), "wanted '%s', got: %s", needle, err);
}

static void expect_caught(int coll, int p, int root, size_t count, size_t chunk,
                          void (*mutate)(struct weft_schedule *sch, int p), const char *needle)
{
    expect_caught_algo(WEFT_ALGO_RING, coll, p, root, count, chunk, mutate, needle);
}

static struct weft_step *find_step(struct weft_schedule *s, int kind, int nth)
{
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == kind && nth-- == 0)
            return &s->steps[i];
    cr_assert_fail("no step of kind %d", kind);
    return NULL;
}

static void drop_final(struct weft_schedule *sch, int p)
{
    for (size_t i = 0; i < sch[1].nsteps; i++)
        sch[1].steps[i].flags = 0;
}

static void final_everywhere(struct weft_schedule *sch, int p)
{
    for (size_t i = 0; i < sch[0].nsteps; i++)
        if (sch[0].steps[i].kind == WEFT_STEP_RECV_REDUCE)
            sch[0].steps[i].flags = WEFT_STEP_FINAL;
}

static void drop_dep(struct weft_schedule *sch, int p)
{
    /* The second round's send no longer waits for the reduction it sends. */
    find_step(&sch[0], WEFT_STEP_SEND, 1)->deps[0] = -1;
}

static void drop_recv_dep(struct weft_schedule *sch, int p)
{
    /* An allgather receive may now overwrite a block still being sent. */
    struct weft_step *st = find_step(&sch[0], WEFT_STEP_RECV, 1);
    st->deps[0] = -1;
}

/* Turns the nth receive of s into a reduction with the partial sum the
 * rank already holds at that place. */
static void recv_to_reduce(struct weft_schedule *s, int nth)
{
    struct weft_step *st = find_step(s, WEFT_STEP_RECV, nth);
    st->kind = WEFT_STEP_RECV_REDUCE;
    st->src_buf = WEFT_BUF_RECV;
    st->src_off = st->off;
}

static void recv_reduce_allgather(struct weft_schedule *sch, int p)
{
    /* A reduction where the collective has none. */
    recv_to_reduce(&sch[2], 0);
}

static void recv_reduce_twice(struct weft_schedule *sch, int p)
{
    /* The allreduce's second allgather receive turned into a reduction with
     * the partial sum the rank made there: ranks counted twice. */
    recv_to_reduce(&sch[2], 1);
}

/* Swaps the destination (or with src, the source) offsets of the first two
 * steps of kind in s. */
static void swap_offs(struct weft_schedule *s, int kind, bool src)
{
    struct weft_step *a = find_step(s, kind, 0);
    struct weft_step *b = find_step(s, kind, 1);
    size_t *x = src ? &a->src_off : &a->off, *y = src ? &b->src_off : &b->off;
    size_t t = *x;
    *x = *y;
    *y = t;
}

static void swap_recv_dst(struct weft_schedule *sch, int p)
{
    /* Rank 3 is the end of the chain (root 0, p 4): its receives of chunks
     * 0 and 1 land in each other's place. */
    swap_offs(&sch[3], WEFT_STEP_RECV, false);
}

static void swap_reduce_src(struct weft_schedule *sch, int p)
{
    /* The root combines chunk 1 of its input with chunk 0 arriving. */
    swap_offs(&sch[0], WEFT_STEP_RECV_REDUCE, true);
}

static void swap_reduce_dst(struct weft_schedule *sch, int p)
{
    swap_offs(&sch[0], WEFT_STEP_RECV_REDUCE, false);
}

static void remove_last(struct weft_schedule *sch, int p)
{
    sch[1].nsteps--;
}

/* Every rank receives before it sends, and its send waits for that
 * receive: nobody sends first. */
static void receive_first(struct weft_schedule *sch, int p)
{
    for (int r = 0; r < p; r++) {
        struct weft_schedule *s = &sch[r];
        cr_assert(s->nsteps >= 2 && s->steps[0].kind == WEFT_STEP_SEND);
        struct weft_step t = s->steps[0];
        s->steps[0] = s->steps[1];
        s->steps[1] = t;
        for (size_t i = 2; i < s->nsteps; i++)
            for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
                if (s->steps[i].deps[k] == 0 || s->steps[i].deps[k] == 1)
                    s->steps[i].deps[k] ^= 1;
        s->steps[0].deps[0] = -1;
        s->steps[1].deps[0] = 0;
    }
}

static void write_sendbuf(struct weft_schedule *sch, int p)
{
    find_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0)->buf = WEFT_BUF_SEND;
}

static void count_mismatch(struct weft_schedule *sch, int p)
{
    find_step(&sch[0], WEFT_STEP_SEND, 0)->count -= 1;
}

static void reorder_sends(struct weft_schedule *sch, int p)
{
    /* The root sends chunk 1 before chunk 0: receivers get them swapped. */
    struct weft_step *a = find_step(&sch[0], WEFT_STEP_SEND, 0);
    struct weft_step *b = find_step(&sch[0], WEFT_STEP_SEND, 1);
    struct weft_step t = *a;
    *a = *b;
    *b = t;
}

Test(checker, catches_broken_schedules)
{
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 3, drop_final, "lacks FINAL");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 3, final_everywhere, "FINAL on a partial");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 100, drop_dep, "unordered");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 40, 100, drop_recv_dep, "unordered");
    expect_caught(WEFT_COLL_ALLGATHER, 4, 0, 10, 3, recv_reduce_allgather, "without reduction");
    expect_caught(WEFT_COLL_ALLREDUCE, 4, 0, 10, 3, recv_reduce_twice, "twice");
    expect_caught(WEFT_COLL_BROADCAST, 4, 0, 10, 3, swap_recv_dst, "position");
    expect_caught(WEFT_COLL_BROADCAST, 4, 0, 10, 3, reorder_sends, "position");
    expect_caught(WEFT_COLL_REDUCE, 4, 0, 10, 3, swap_reduce_src, "combines input positions");
    expect_caught(WEFT_COLL_REDUCE, 4, 0, 10, 3, swap_reduce_dst, "position");
    expect_caught(WEFT_COLL_ALLREDUCE, 3, 0, 30, 100, remove_last, "which receives");
    expect_caught(WEFT_COLL_ALLREDUCE, 2, 0, 2, 100, receive_first, "deadlock");
    expect_caught(WEFT_COLL_REDUCE_SCATTER, 3, 0, 30, 100, write_sendbuf, "writes sendbuf");
    expect_caught(WEFT_COLL_ALLREDUCE, 3, 0, 30, 100, count_mismatch, "step 0 sends");
}
/* Past 64 ranks the rank set is a count and a key sum (sched_sim.h); rank
 * 80's inputs are beyond the exact bits. */
static void drop_input_80(struct weft_schedule *sch, int p)
{
    /* Rank 80's first reduce-scatter step takes the partial sum without
     * adding its own input: block 79 ends up with 99 contributions. */
    struct weft_step *st = find_step(&sch[80], WEFT_STEP_RECV_REDUCE, 0);
    st->kind = WEFT_STEP_RECV;
    st->flags = 0;
}

static void reduce_twice_80(struct weft_schedule *sch, int p)
{
    recv_to_reduce(&sch[80], 1);
}

Test(checker, rank_sets_past_64)
{
    expect_caught(WEFT_COLL_ALLREDUCE, 100, 0, 1000, 1 << 20, drop_input_80,
                  "FINAL on a partial result (ranks {99 contributions, ranks<64 "
                  "0xffffffffffffffff");
    expect_caught(WEFT_COLL_ALLREDUCE, 100, 0, 1000, 1 << 20, reduce_twice_80,
                  "combines rank input twice");
    /* A count of 100 with rank 81 twice and 80 missing is not all ranks:
     * the exact bits agree, only the key sum tells. */
    struct rset all = { 0 }, swapped = { 0 };
    for (int r = 0; r < 100; r++) {
        all = rset_add(all, rset_one(r));
        swapped = rset_add(swapped, rset_one(r == 80 ? 81 : r));
    }
    cr_assert(all.n == 100 && swapped.n == 100 && all.low == swapped.low);
    cr_assert(!rset_eq(all, swapped));
    cr_assert(rset_eq(all, rset_add(rset_add((struct rset){ 0 }, swapped),
                                    (struct rset){ 0, rank_key(80) - rank_key(81), 0 })));
}

/* ---- broken recursive doubling schedules ---- */

static struct weft_step *nth_reduce(struct weft_schedule *s, int nth)
{
    return find_step(s, WEFT_STEP_RECV_REDUCE, nth);
}

static void rd_drop_recv_first(struct weft_schedule *sch, int p)
{
    /* Rank 1 computes x1 op x0 while its partner computes x0 op x1. */
    nth_reduce(&sch[1], 0)->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
}

static void rd_recv_first_both(struct weft_schedule *sch, int p)
{
    nth_reduce(&sch[0], 0)->flags |= WEFT_STEP_RECV_FIRST;
}

static void rd_swap_convention(struct weft_schedule *sch, int p)
{
    /* Both partners switch to x1 op x0: a different tree, but the same on
     * both, so results still agree bit for bit. */
    nth_reduce(&sch[1], 0)->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
    nth_reduce(&sch[0], 0)->flags |= WEFT_STEP_RECV_FIRST;
}

static void rd_drop_recv_first_last_round(struct weft_schedule *sch, int p)
{
    struct weft_schedule *s = &sch[p - 1];
    struct weft_step *st = &s->steps[s->nsteps - 1];
    cr_assert(st->kind == WEFT_STEP_RECV_REDUCE && (st->flags & WEFT_STEP_FINAL));
    st->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
}

static void rd_fold_in_order(struct weft_schedule *sch, int p)
{
    /* Only rank 1 computes the fold-in's (x1 op x0) and it ships that on:
     * the order there is a convention, not a matter of agreement. */
    nth_reduce(&sch[1], 0)->flags &= (uint8_t)~WEFT_STEP_RECV_FIRST;
}

static void rd_fold_out_early(struct weft_schedule *sch, int p)
{
    /* Rank 1 hands the result back before it has computed it. */
    struct weft_schedule *s = &sch[1];
    struct weft_step *st = &s->steps[s->nsteps - 1];
    cr_assert(st->kind == WEFT_STEP_SEND && st->peer == 0);
    st->deps[0] = -1;
}

static void rd_fold_out_input(struct weft_schedule *sch, int p)
{
    /* Rank 1 hands back its own input instead of the result. */
    struct weft_schedule *s = &sch[1];
    struct weft_step *st = &s->steps[s->nsteps - 1];
    st->buf = WEFT_BUF_SEND;
    st->deps[0] = -1;
}

static void rd_drop_fold_out_recv(struct weft_schedule *sch, int p)
{
    sch[0].nsteps--;
}

static void rd_drop_final(struct weft_schedule *sch, int p)
{
    for (size_t i = 0; i < sch[2].nsteps; i++)
        sch[2].steps[i].flags &= (uint8_t)~WEFT_STEP_FINAL;
}

static void rd_final_early(struct weft_schedule *sch, int p)
{
    nth_reduce(&sch[0], 0)->flags |= WEFT_STEP_FINAL;
}

static void rd_recv_first_on_send(struct weft_schedule *sch, int p)
{
    find_step(&sch[0], WEFT_STEP_SEND, 0)->flags |= WEFT_STEP_RECV_FIRST;
}

/* p=2, 2 elements in chunks of 1: rank 0 computes chunk 1 and sends the
 * result, rank 1 receives it instead of computing it (rank 1 still
 * computes chunk 0).  The values agree, but rank 1 mixes the two ways. */
static void rd_half_received(struct weft_schedule *sch, int p)
{
    struct weft_schedule *a = &sch[0], *b = &sch[1];
    cr_assert(a->nsteps == 4 && b->nsteps == 4);
    struct weft_step snd = a->steps[2], red = a->steps[3];
    red.deps[0] = red.deps[1] = -1;
    snd.buf = WEFT_BUF_RECV;
    snd.deps[0] = 2;
    a->steps[2] = red;
    a->steps[3] = snd;
    b->steps[3].kind = WEFT_STEP_RECV;
    b->steps[3].flags = 0;
}

Test(checker, catches_broken_rd_schedules)
{
    const int rd = PLAN_RD, ar = WEFT_COLL_ALLREDUCE;
    expect_caught_algo(rd, ar, 2, 0, 10, 3, rd_drop_recv_first, "same expression");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_drop_recv_first, "same expression");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_recv_first_both, "same expression");
    expect_caught_algo(rd, ar, 8, 0, 10, 3, rd_drop_recv_first_last_round, "same expression");
    expect_caught_algo(rd, ar, 6, 0, 10, 3, rd_drop_recv_first_last_round, "same expression");
    expect_caught_algo(rd, ar, 5, 0, 10, 3, rd_fold_out_early, "unordered");
    expect_caught_algo(rd, ar, 3, 0, 10, 100, rd_fold_out_input, "holds ranks 0x2");
    expect_caught_algo(rd, ar, 6, 0, 10, 3, rd_drop_fold_out_recv, "which receives");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_drop_final, "lacks FINAL");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_final_early, "FINAL on a partial");
    expect_caught_algo(rd, ar, 4, 0, 10, 3, rd_recv_first_on_send, "RECV_FIRST on a SEND");
    expect_caught_algo(rd, ar, 2, 0, 2, 1, rd_half_received, "reduced 1 of 2 elements");
    /* Changes that keep every rank's expression the same pass. */
    expect_caught_algo(rd, ar, 2, 0, 10, 3, rd_swap_convention, NULL);
    expect_caught_algo(rd, ar, 3, 0, 10, 3, rd_fold_in_order, NULL);
}

/* ---- deadlocks the engine would have ---------------------------------------------- */

/* Appends a one-element step to a hand-made schedule: SEND reads sendbuf,
 * RECV writes recvbuf, RECV_REDUCE combines sendbuf into recvbuf, all at
 * element off. */
static int32_t add_step(struct weft_schedule *s, int kind, int flags, int peer, size_t off,
                        int32_t dep)
{
    struct weft_step st = { .kind = (uint8_t)kind, .flags = (uint8_t)flags,
                            .buf = kind == WEFT_STEP_SEND ? WEFT_BUF_SEND : WEFT_BUF_RECV,
                            .src_buf = WEFT_BUF_SEND, .peer = peer, .deps = { dep, -1, -1 },
                            .off = off, .src_off = off, .count = 1 };
    int32_t i = weft_sched_add(s, &st);
    cr_assert(i >= 0);
    return i;
}

/* Runs hand-made allreduce schedules, 2 elements per rank, without asking
 * for a right result: only whether (and where) execution gets stuck. */
static bool run_hand(int p, struct weft_schedule *sch, int slots, char *err, size_t len)
{
    err[0] = '\0';
    return simulate(WEFT_ALGO_RING, WEFT_COLL_ALLREDUCE, p, 0, 2, sch, slots, false, err, len);
}

/* Two partners that each send and then receive, the receive waiting for
 * their own send.  A plain RECV is posted only once the send is done, and
 * the send is done only once the peer's receive is posted: that needs the
 * transport to buffer the message.  A RECV_REDUCE is posted while its send
 * is in flight, so it does not (rd's exchanges are built that way; the
 * engine that held RECV_REDUCE back like a RECV hung on them). */
Test(checker, send_then_dependent_receive)
{
    struct weft_schedule sch[2];
    char err[700];
    for (int kind = WEFT_STEP_RECV; kind <= WEFT_STEP_RECV_REDUCE; kind++) {
        for (int r = 0; r < 2; r++) {
            weft_sched_init(&sch[r]);
            int32_t snd = add_step(&sch[r], WEFT_STEP_SEND, 0, 1 - r, 0, -1);
            int flags = kind == WEFT_STEP_RECV_REDUCE ? WEFT_STEP_FINAL : 0;
            add_step(&sch[r], kind, flags, 1 - r, 0, snd);
        }
        cr_assert(run_hand(2, sch, SLOTS_BUFFERED, err, sizeof(err)), "%s", err);
        int slots[] = { 1, 2, SLOTS_UNLIMITED };
        for (size_t k = 0; k < sizeof(slots) / sizeof(slots[0]); k++) {
            bool ok = run_hand(2, sch, slots[k], err, sizeof(err));
            if (kind == WEFT_STEP_RECV_REDUCE) {
                cr_assert(ok, "%s", err);
                continue;
            }
            cr_assert(!ok, "a send that needs buffering passed (slots %d)", slots[k]);
            cr_assert(strstr(err, "deadlock: rank 0 step 0 (SEND, peer 1) never completes: "
                                  "posted, but rank 1 never posts step 1, its match"),
                      "%s", err);
        }
        free_all(2, sch);
    }
}

/* Each rank receives first and sends what it received: nobody ever sends,
 * buffered or not, a RECV_REDUCE (posted at once) no better than a RECV. */
Test(checker, receive_before_send)
{
    struct weft_schedule sch[2];
    char err[700];
    for (int kind = WEFT_STEP_RECV; kind <= WEFT_STEP_RECV_REDUCE; kind++) {
        for (int r = 0; r < 2; r++) {
            weft_sched_init(&sch[r]);
            int flags = kind == WEFT_STEP_RECV_REDUCE ? WEFT_STEP_FINAL : 0;
            int32_t rcv = add_step(&sch[r], kind, flags, 1 - r, 0, -1);
            struct weft_step st = { .kind = WEFT_STEP_SEND, .buf = WEFT_BUF_RECV,
                                    .peer = 1 - r, .deps = { rcv, -1, -1 }, .count = 1 };
            cr_assert(weft_sched_add(&sch[r], &st) == 1);
        }
        int slots[] = { SLOTS_BUFFERED, 1, SLOTS_UNLIMITED };
        for (size_t k = 0; k < sizeof(slots) / sizeof(slots[0]); k++) {
            cr_assert(!run_hand(2, sch, slots[k], err, sizeof(err)), "%s, slots %d: passed",
                      kind_name(kind), slots[k]);
            char want[120];
            snprintf(want, sizeof(want), "deadlock: rank 0 step 0 (%s, peer 1) never completes: "
                     "posted, but rank 1 never posts step 1", kind_name(kind));
            cr_assert(strstr(err, want), "%s", err);
        }
        free_all(2, sch);
    }
}

/* Messages on one link keep their order: rank 0's second receive from rank
 * 1 (a RECV_REDUCE free to go) is not posted before the first (a RECV that
 * waits for rank 0's send), so rank 1's first send, which that RECV takes,
 * blocks its second. */
Test(checker, link_order)
{
    struct weft_schedule sch[2];
    char err[700];
    weft_sched_init(&sch[0]);
    weft_sched_init(&sch[1]);
    int32_t snd = add_step(&sch[0], WEFT_STEP_SEND, 0, 1, 0, -1);
    add_step(&sch[0], WEFT_STEP_RECV, 0, 1, 0, snd);
    add_step(&sch[0], WEFT_STEP_RECV_REDUCE, WEFT_STEP_FINAL, 1, 1, -1);
    add_step(&sch[1], WEFT_STEP_SEND, 0, 0, 0, -1);
    snd = add_step(&sch[1], WEFT_STEP_SEND, 0, 0, 1, -1);
    add_step(&sch[1], WEFT_STEP_RECV, 0, 0, 1, snd);
    cr_assert(run_hand(2, sch, SLOTS_BUFFERED, err, sizeof(err)), "%s", err);
    cr_assert(!run_hand(2, sch, SLOTS_UNLIMITED, err, sizeof(err)), "a message overtook");
    cr_assert(strstr(err, "deadlock: rank 0 step 0 (SEND, peer 1) never completes"), "%s", err);
    /* With both links in the other order (the receive of rank 1 still
     * waiting for the send the RECV_REDUCE takes), all is well. */
    struct weft_step t = sch[0].steps[1];
    sch[0].steps[1] = sch[0].steps[2];
    sch[0].steps[2] = t;
    sch[1].steps[0].off = 1;
    sch[1].steps[1].off = 0;
    sch[1].steps[2].deps[0] = 0;
    cr_assert(run_hand(2, sch, SLOTS_UNLIMITED, err, sizeof(err)), "%s", err);
    free_all(2, sch);
}

/* A RECV_REDUCE holds its staging slot from its post to its reduce.  Rank 0
 * takes two messages, from rank 2 first in schedule order; rank 2 sends
 * only after rank 1 has sent it something, which rank 1 does only after
 * rank 0 took rank 1's message.  With one slot, the receive from rank 2
 * holds it and the one from rank 1 can never be posted. */
Test(checker, staging_slots_run_out)
{
    struct weft_schedule sch[3];
    char err[700];
    for (int r = 0; r < 3; r++)
        weft_sched_init(&sch[r]);
    add_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0, 2, 0, -1);
    add_step(&sch[0], WEFT_STEP_RECV_REDUCE, 0, 1, 1, -1);
    add_step(&sch[1], WEFT_STEP_SEND, 0, 0, 1, -1);
    add_step(&sch[1], WEFT_STEP_SEND, 0, 2, 0, 0);
    add_step(&sch[2], WEFT_STEP_RECV, 0, 1, 1, -1);
    add_step(&sch[2], WEFT_STEP_SEND, 0, 0, 0, 0);
    cr_assert(!run_hand(3, sch, 1, err, sizeof(err)), "one slot was enough");
    cr_assert(strstr(err, "1 staging slot: deadlock: rank 0 step 0 (RECV_REDUCE, peer 2) never "
                          "completes: posted, but rank 2 never posts step 1"),
              "%s", err);
    cr_assert(run_hand(3, sch, 2, err, sizeof(err)), "%s", err);
    cr_assert(run_hand(3, sch, SLOTS_UNLIMITED, err, sizeof(err)), "%s", err);
    cr_assert(run_hand(3, sch, SLOTS_BUFFERED, err, sizeof(err)), "%s", err);
    free_all(3, sch);
}
/* ---- schedule container and collective facts ---------------------------------------- */

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

/* ---- ordered schedules (deterministic mode) ------------------------------------- */

#define ORDERED_RING (WEFT_ALGO_RING | PLAN_ORDERED)

/* The checker proves them correct like any schedule: every output element
 * holds each rank's input once, allreduce ranks all hold the bits of one
 * FINAL reduction, no deadlock, no race, in place or not. */
static void ordered_matrix(int coll)
{
    plan_matrix(ORDERED_RING, coll, 1, 17, true, engine_slots());
}

Test(ordered, allreduce) { ordered_matrix(WEFT_COLL_ALLREDUCE); }
Test(ordered, reduce_scatter) { ordered_matrix(WEFT_COLL_REDUCE_SCATTER); }
Test(ordered, reduce) { ordered_matrix(WEFT_COLL_REDUCE); }

Test(ordered, no_buffering_needed)
{
    int colls[] = { WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_REDUCE };
    for (int slots = 1; slots <= 2; slots++)
        for (size_t c = 0; c < sizeof(colls) / sizeof(colls[0]); c++)
            plan_matrix(ORDERED_RING, colls[c], 1, 9, false, slots);
}

/* The shape that makes every element the left fold in rank order: rank 0
 * only sends its input to rank 1; rank r > 0 combines what rank r-1 sends
 * as the left operand (RECV_FIRST) with its own input at the same
 * position, and passes on exactly what it combined; only rank p-1 makes
 * final values.  With the checker's proof that each output holds every
 * input once, the value at the end of the chain is
 * ((x0 op x1) op ...) op x(p-1) and nothing else. */
static void check_chain(int coll, int p, int root, size_t count, size_t chunk)
{
    struct weft_schedule sch[SMALLP];
    build_all(ORDERED_RING, coll, p, root, count, chunk, sch);
    size_t inputs = coll == WEFT_COLL_REDUCE_SCATTER ? count * (size_t)p : count;
    for (int r = 0; r < p; r++) {
        const struct weft_schedule *s = &sch[r];
        size_t reduced = 0, passed = 0;
        for (size_t i = 0; i < s->nsteps; i++) {
            const struct weft_step *st = &s->steps[i];
            if (st->kind == WEFT_STEP_RECV_REDUCE) {
                cr_assert(r > 0 && st->peer == r - 1 && st->src_buf == WEFT_BUF_SEND &&
                              (st->flags & WEFT_STEP_RECV_FIRST) &&
                              !(st->flags & WEFT_STEP_FINAL) == (r < p - 1),
                          "%s p=%d rank %d step %zu: peer %d flags 0x%x src %d",
                          weft_coll_name(coll), p, r, i, st->peer, st->flags, st->src_buf);
                reduced += st->count;
            }
            if (st->kind != WEFT_STEP_SEND || st->peer != r + 1 || r == p - 1)
                continue;
            /* What goes up the chain: rank 0's input, else the partial
             * this rank just made, element for element. */
            passed += st->count;
            if (r == 0) {
                cr_assert(st->buf == WEFT_BUF_SEND, "p=%d rank 0 step %zu", p, i);
                continue;
            }
            cr_assert(st->deps[0] >= 0, "p=%d rank %d step %zu: no dep", p, r, i);
            const struct weft_step *made = &s->steps[st->deps[0]];
            cr_assert(made->kind == WEFT_STEP_RECV_REDUCE && made->buf == st->buf &&
                          made->off == st->off && made->count == st->count,
                      "%s p=%d rank %d step %zu sends what step %d did not make",
                      weft_coll_name(coll), p, r, i, st->deps[0]);
        }
        cr_assert_eq(reduced, r == 0 || p == 1 ? 0 : inputs, "%s p=%d rank %d reduced %zu of %zu",
                     weft_coll_name(coll), p, r, reduced, inputs);
        cr_assert_eq(passed, r == p - 1 ? 0 : inputs, "%s p=%d rank %d passed %zu of %zu",
                     weft_coll_name(coll), p, r, passed, inputs);
    }
    free_all(p, sch);
}

Test(ordered, left_fold_shape)
{
    int ps[SMALLP], np = rank_counts(1, 17, true, ps);
    for (int i = 0; i < np; i++) {
        int p = ps[i];
        check_chain(WEFT_COLL_ALLREDUCE, p, 0, 3 * (size_t)p + 2, 2);
        check_chain(WEFT_COLL_REDUCE_SCATTER, p, 0, 5, 2);
        for (int root = 0; root < p; root += p > 8 ? p / 3 : 1)
            check_chain(WEFT_COLL_REDUCE, p, root, 2 * (size_t)p + 1, 3);
    }
}

/* Allgather and broadcast combine nothing: ordered builds the same steps.
 * The reducing collectives get the chain, not the ring. */
Test(ordered, only_reductions_change)
{
    struct weft_schedule a, b;
    weft_sched_init(&a);
    weft_sched_init(&b);
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        for (int rank = 0; rank < 5; rank++) {
            struct weft_coll_desc d = { coll, rank, 5, 2, 37, 4, WEFT_ALGO_RING, 0, 0, NULL, 0 };
            cr_assert(weft_sched_build(&d, &a) == WEFT_OK);
            d.ordered = 1;
            cr_assert(weft_sched_build(&d, &b) == WEFT_OK);
            bool reduces = coll == WEFT_COLL_ALLREDUCE || coll == WEFT_COLL_REDUCE_SCATTER ||
                           coll == WEFT_COLL_REDUCE;
            if (!reduces)
                cr_assert(same_steps(&a, &b), "%s rank %d", weft_coll_name(coll), rank);
            else if (rank != 0 || coll != WEFT_COLL_REDUCE) /* the ring's root: its own */
                cr_assert(!same_steps(&a, &b), "%s rank %d", weft_coll_name(coll), rank);
        }
    }
    /* Allreduce, p=4, rank 1, 3 chunks: per chunk the partial comes from 0
     * and goes to 2, the result comes back from 2 and goes on to 0. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 4, 0, 7, 3, WEFT_ALGO_RING, 0, 1, NULL, 0 };
    cr_assert(weft_sched_build(&d, &a) == WEFT_OK);
    cr_assert(a.nsteps == 12 && a.scratch_count == 0, "%zu steps", a.nsteps);
    static const int kinds[4] = { WEFT_STEP_RECV_REDUCE, WEFT_STEP_SEND, WEFT_STEP_RECV,
                                  WEFT_STEP_SEND };
    static const int peers[4] = { 0, 2, 2, 0 };
    for (size_t i = 0; i < a.nsteps; i++) {
        const struct weft_step *st = &a.steps[i];
        cr_assert(st->kind == kinds[i % 4] && st->peer == peers[i % 4] && st->off == i / 4 * 3 &&
                      st->count == (i / 4 == 2 ? 1u : 3u) && st->buf == WEFT_BUF_RECV,
                  "step %zu", i);
        cr_assert(i % 4 == 0 ? st->deps[0] == -1 : st->deps[0] == (int32_t)i - 1, "step %zu", i);
    }
    cr_assert(count_flag(&a, WEFT_STEP_RECV_FIRST) == 3 && count_flag(&a, WEFT_STEP_FINAL) == 0);
    weft_sched_free(&a);
    weft_sched_free(&b);
}

/* ---- recursive halving/doubling, checked ----------------------------------------- */

#define PLAN_RHD PLAN(WEFT_ALGO_RHD, WEFT_VAR_RHD_RABENSEIFNER)

/* Every rhd collective over ranks pmin..pmax (then 31 and 64 when
 * with_big): powers of two and folded counts, every root up to 16 ranks
 * and four above, counts that leave virtual blocks empty or uneven, one
 * large odd count, and chunks of 3 and 1 so that rounds pipeline. */
static void rhd_matrix(int plan, int coll, int pmin, int pmax, bool with_big, int slots)
{
    int ps[SMALLP], np = rank_counts(pmin, pmax, with_big, ps);
    for (int i = 0; i < np; i++) {
        int p = ps[i];
        bool per_block = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCE_SCATTER;
        size_t small = per_block ? 17 : 10 * (size_t)p + 7;
        size_t big = per_block ? 1 << 18 : 65536;
        size_t counts[] = { 0, 1, (size_t)p - 1, (size_t)p + 1, 1000003, small,
                            per_block ? 5 : (size_t)p + 1 };
        size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, big, 3, 1 };
        int roots[SMALLP], nroots = 0;
        bool rooted = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
        if (!rooted || p <= 16) {
            for (int r = 0; r < (rooted ? p : 1); r++)
                roots[nroots++] = r;
        } else {
            int pick[] = { 0, 1, p / 2, p - 1 };
            for (int k = 0; k < 4; k++)
                roots[nroots++] = pick[k];
        }
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int r = 0; r < nroots; r++)
                check_sched(plan, coll, p, roots[r], counts[c], chunks[c], slots);
    }
}

Test(rhd, allreduce_small_p) { rhd_matrix(PLAN_RHD, WEFT_COLL_ALLREDUCE, 1, 9, false, engine_slots()); }
Test(rhd, allreduce_large_p)
{
    rhd_matrix(PLAN_RHD, WEFT_COLL_ALLREDUCE, 10, 17, true, engine_slots());
}
Test(rhd, allreduce_doubling) { rhd_matrix(PLAN_RD, WEFT_COLL_ALLREDUCE, 1, 17, false, engine_slots()); }
Test(rhd, reduce_scatter) { rhd_matrix(PLAN_RHD, WEFT_COLL_REDUCE_SCATTER, 1, 17, true, engine_slots()); }
Test(rhd, allgather) { rhd_matrix(PLAN_RHD, WEFT_COLL_ALLGATHER, 1, 17, true, engine_slots()); }
Test(rhd, broadcast) { rhd_matrix(PLAN_RHD, WEFT_COLL_BROADCAST, 1, 17, true, engine_slots()); }
Test(rhd, reduce) { rhd_matrix(PLAN_RHD, WEFT_COLL_REDUCE, 1, 17, true, engine_slots()); }

/* Unbuffered sends and one or two staging slots: no exchange may need the
 * transport to buffer a message. */
Test(rhd, no_buffering_needed)
{
    int colls[] = { WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_ALLGATHER,
                    WEFT_COLL_BROADCAST, WEFT_COLL_REDUCE };
    for (int slots = 1; slots <= 2; slots++)
        for (size_t c = 0; c < sizeof(colls) / sizeof(colls[0]); c++)
            rhd_matrix(PLAN_RHD, colls[c], 1, 9, false, slots);
}

/* The rhd variant 1 is recursive doubling, the same schedule as rd.c's. */
Test(rhd, doubling_variant_is_rd)
{
    struct weft_schedule a, b;
    weft_sched_init(&a);
    weft_sched_init(&b);
    for (int rank = 0; rank < 6; rank++) {
        struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, rank, 6, 0, 100, 7, WEFT_ALGO_RHD,
                                    WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 };
        cr_assert(weft_rhd_build(&d, &a) == WEFT_OK && weft_rd_build(&d, &b) == WEFT_OK);
        cr_assert(same_steps(&a, &b), "rank %d", rank);
    }
    weft_sched_free(&a);
    weft_sched_free(&b);
}

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
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK);
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
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK);
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
            cr_assert(weft_rhd_build(&d, &s) == WEFT_OK);
            size_t got = sum_counts(&s, WEFT_STEP_RECV);
            cr_assert(got == (rank == 1 % p ? 0u : 100u), "p=%d rank %d receives %zu", p, rank,
                      got);
        }
    /* Reduce_scatter keeps partial sums in scratch once there are two
     * halving rounds or a fold; p=2 reduces straight into recvbuf. */
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE_SCATTER, 0, 2, 0, 10, 4, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    d.nranks = 4;
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK && s.scratch_count == 40);
    /* p=3: rank 0 is folded: it sends its 30 and gets its 10 back. */
    d.nranks = 3;
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    cr_assert(sum_counts(&s, WEFT_STEP_SEND) == 30 && sum_counts(&s, WEFT_STEP_RECV) == 10);
    /* Reduce: scratch off the root only. */
    d = (struct weft_coll_desc){ WEFT_COLL_REDUCE, 2, 4, 2, 10, 4, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK && s.scratch_count == 0);
    d.rank = 3;
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK && s.scratch_count == 10);
    /* p=1: one COPY, or nothing for count 0. */
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        d = (struct weft_coll_desc){ coll, 0, 1, 0, 5, 2, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
        cr_assert(weft_rhd_build(&d, &s) == WEFT_OK);
        cr_assert(s.nsteps == 1 && s.steps[0].kind == WEFT_STEP_COPY && s.steps[0].count == 5);
        d.count = 0;
        cr_assert(weft_rhd_build(&d, &s) == WEFT_OK && s.nsteps == 0);
    }
    weft_sched_free(&s);
}

Test(rhd, bad_descriptions)
{
    struct {
        struct weft_coll_desc d;
        weft_status_t want;
        const char *needle;
    } c[] = {
#define RHD_DESC(coll, rank, p, root, count, chunk, var)                                      \
    { coll, rank, p, root, count, chunk, WEFT_ALGO_RHD, var, 0, NULL, 0 }
        { RHD_DESC(WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 1, 0), WEFT_ERR_INVALID_ARG, "of 0" },
        { RHD_DESC(WEFT_COLL_ALLGATHER, -1, 4, 0, 4, 1, 0), WEFT_ERR_INVALID_ARG, "rank -1" },
        { RHD_DESC(WEFT_COLL_REDUCE, 4, 4, 0, 4, 1, 0), WEFT_ERR_INVALID_ARG, "rank 4" },
        { RHD_DESC(WEFT_COLL_BROADCAST, 0, 4, 4, 4, 1, 0), WEFT_ERR_INVALID_ARG, "root 4" },
        { RHD_DESC(WEFT_COLL_REDUCE, 0, 4, -1, 4, 1, 0), WEFT_ERR_INVALID_ARG, "root -1" },
        { RHD_DESC(WEFT_COLL_REDUCE_SCATTER, 0, 4, 0, 4, 0, 0), WEFT_ERR_INVALID_ARG, "chunk 0" },
        { RHD_DESC(WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 1, 2), WEFT_ERR_INVALID_ARG,
          "unknown variant 2" },
        { RHD_DESC(WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 1, -1), WEFT_ERR_INVALID_ARG,
          "unknown variant -1" },
        { RHD_DESC(99, 0, 4, 0, 4, 1, 0), WEFT_ERR_INVALID_ARG, "unknown collective" },
        { RHD_DESC(WEFT_COLL_SEND, 0, 4, 0, 4, 1, 0), WEFT_ERR_UNSUPPORTED, "point to point" },
        { RHD_DESC(WEFT_COLL_BROADCAST, 0, 4, 0, 4, 1, WEFT_VAR_RHD_DOUBLING),
          WEFT_ERR_UNSUPPORTED, "only allreduce, not broadcast" },
        { RHD_DESC(WEFT_COLL_ALLGATHER, 0, 4, 0, SIZE_MAX / 2, 1, 0), WEFT_ERR_INVALID_ARG,
          "overflows" },
#undef RHD_DESC
    };
    struct weft_schedule s;
    weft_sched_init(&s);
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        weft_status_t st = weft_rhd_build(&c[i].d, &s);
        cr_assert(st == c[i].want, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0 && s.scratch_count == 0);
    }
    /* Root does not matter where there is none. */
    struct weft_coll_desc d = { WEFT_COLL_ALLGATHER, 0, 4, 77, 4, 1, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
    cr_assert(weft_rhd_build(&d, &s) == WEFT_OK && s.nsteps > 0);
    cr_assert(weft_rhd_build(NULL, &s) == WEFT_ERR_INVALID_ARG);
    cr_assert(weft_rhd_build(&d, NULL) == WEFT_ERR_INVALID_ARG);
    /* The dispatcher: variant 0 serves all five, variant 1 allreduce only. */
    for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
        d = (struct weft_coll_desc){ coll, 1, 5, 2, 9, 2, WEFT_ALGO_RHD, 0, 0, NULL, 0 };
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps > 0, "%s", weft_coll_name(coll));
        d.variant = WEFT_VAR_RHD_DOUBLING;
        cr_assert(weft_sched_build(&d, &s) ==
                      (coll == WEFT_COLL_ALLREDUCE ? WEFT_OK : WEFT_ERR_UNSUPPORTED),
                  "%s", weft_coll_name(coll));
    }
    weft_sched_free(&s);
}

/* ---- broken rhd schedules ---- */

/* The first step of kind on s that talks to peer. */
static struct weft_step *find_peer_step(struct weft_schedule *s, int kind, int peer)
{
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == kind && s->steps[i].peer == peer)
            return &s->steps[i];
    cr_assert_fail("no step of kind %d with peer %d", kind, peer);
    return NULL;
}

static void rhd_drop_final(struct weft_schedule *sch, int p)
{
    for (size_t i = 0; i < sch[2].nsteps; i++)
        sch[2].steps[i].flags &= (uint8_t)~WEFT_STEP_FINAL;
}

static void rhd_fold_out_early(struct weft_schedule *sch, int p)
{
    /* p=5: rank 1 hands its partner the result before it is complete. */
    struct weft_step *st = &sch[1].steps[sch[1].nsteps - 1];
    cr_assert(st->kind == WEFT_STEP_SEND && st->peer == 0);
    st->deps[0] = st->deps[1] = st->deps[2] = -1;
}

static void rhd_fold_out_input(struct weft_schedule *sch, int p)
{
    /* p=3: rank 1 hands back its input instead of the result. */
    struct weft_step *st = &sch[1].steps[sch[1].nsteps - 1];
    cr_assert(st->kind == WEFT_STEP_SEND && st->peer == 0);
    st->buf = WEFT_BUF_SEND;
    st->deps[0] = st->deps[1] = -1;
}

static void rhd_gather_early(struct weft_schedule *sch, int p)
{
    /* Allgather p=4, one chunk: rank 0's second-round send no longer waits
     * for the first round's receive. */
    struct weft_step *st = find_step(&sch[0], WEFT_STEP_SEND, 1);
    st->deps[0] = st->deps[1] = -1;
}

static void rhd_hand_back_early(struct weft_schedule *sch, int p)
{
    /* Reduce_scatter p=3: rank 1 hands rank 0 its block unreduced. */
    find_peer_step(&sch[1], WEFT_STEP_SEND, 0)->deps[0] = -1;
}

static void rhd_gather_overwrites(struct weft_schedule *sch, int p)
{
    /* Reduce p=4 root 0: the last gather receive no longer waits for the
     * halving's send of the same range (the same memory in place). */
    struct weft_step *st = &sch[0].steps[sch[0].nsteps - 1];
    cr_assert(st->kind == WEFT_STEP_RECV);
    st->deps[0] = st->deps[1] = st->deps[2] = -1;
}

static void rhd_scatter_reorder(struct weft_schedule *sch, int p)
{
    /* Broadcast p=4 root 0: the root's first two scatter sends read each
     * other's offsets: ranks get blocks at the wrong place. */
    struct weft_step *a = find_step(&sch[0], WEFT_STEP_SEND, 0);
    struct weft_step *b = find_step(&sch[0], WEFT_STEP_SEND, 1);
    size_t t = a->off;
    a->off = b->off;
    b->off = t;
    a->src_off = a->off;
    b->src_off = b->off;
}

static void rhd_flip_order(struct weft_schedule *sch, int p)
{
    /* Each element is computed by one rank and copied: another operand
     * order there is another expression, but the same on every rank. */
    nth_reduce(&sch[1], 0)->flags ^= WEFT_STEP_RECV_FIRST;
}

Test(checker, catches_broken_rhd_schedules)
{
    const int ar = WEFT_COLL_ALLREDUCE;
    expect_caught_algo(PLAN_RHD, ar, 4, 0, 10, 3, rhd_drop_final, "lacks FINAL");
    expect_caught_algo(PLAN_RHD, ar, 5, 0, 10, 3, rhd_fold_out_early, "unordered");
    expect_caught_algo(PLAN_RHD, ar, 3, 0, 10, 100, rhd_fold_out_input, "holds ranks 0x2");
    expect_caught_algo(PLAN_RHD, WEFT_COLL_ALLGATHER, 4, 0, 10, 100, rhd_gather_early,
                       "unordered");
    expect_caught_algo(PLAN_RHD, WEFT_COLL_REDUCE_SCATTER, 3, 0, 10, 100, rhd_hand_back_early,
                       "unordered");
    expect_caught_algo(PLAN_RHD, WEFT_COLL_REDUCE, 4, 0, 40, 100, rhd_gather_overwrites,
                       "unordered");
    expect_caught_algo(PLAN_RHD, WEFT_COLL_BROADCAST, 4, 0, 40, 100, rhd_scatter_reorder,
                       "position");
    expect_caught_algo(PLAN_RHD, ar, 4, 0, 10, 3, rhd_flip_order, NULL);
}

/* ---- hierarchical schedules, checked -------------------------------------------------- */

#define PLAN_HIER_RING PLAN(WEFT_ALGO_HIER, WEFT_VAR_HIER_RING)
#define PLAN_HIER_RHD PLAN(WEFT_ALGO_HIER, WEFT_VAR_HIER_RHD)

/* A node map: node[r] for p ranks, nnodes ids (some may be unused);
 * null: the schedules get no map at all (one node). */
struct layout {
    int p, nnodes;
    bool null;
    int node[SMALLP];
};

static struct layout block_layout(int p, int per_node)
{
    struct layout l = { p, (p + per_node - 1) / per_node, false, { 0 } };
    for (int r = 0; r < p; r++)
        l.node[r] = r / per_node;
    return l;
}

static struct layout interleaved_layout(int p, int k)
{
    struct layout l = { p, k, false, { 0 } };
    for (int r = 0; r < p; r++)
        l.node[r] = r % k;
    return l;
}

/* Nodes of the given sizes, one after the other in rank order. */
static struct layout sized_layout(const int *sizes, int n)
{
    struct layout l = { 0, n, false, { 0 } };
    for (int j = 0; j < n; j++)
        for (int k = 0; k < sizes[j]; k++)
            l.node[l.p++] = j;
    return l;
}

static void build_all_nodes(int algo, int coll, const struct layout *l, int root, size_t count,
                            size_t chunk, struct weft_schedule *sch)
{
    for (int rank = 0; rank < l->p; rank++) {
        struct weft_coll_desc d = { coll, rank, l->p, root, count, chunk, PLAN_ALGO(algo),
                                    PLAN_VAR(algo), 0, l->null ? NULL : l->node,
                                    l->null ? 0 : l->nnodes };
        weft_sched_init(&sch[rank]);
        weft_status_t st = weft_sched_build(&d, &sch[rank]);
        cr_assert(st == WEFT_OK, "hier/%d %s p=%d rank=%d root=%d count=%zu chunk=%zu: %s (%s)",
                  PLAN_VAR(algo), weft_coll_name(coll), l->p, rank, root, count, chunk,
                  weft_status_string(st), weft_last_error(NULL));
    }
}

static void describe(const struct layout *l, char *out, size_t len)
{
    size_t at = (size_t)snprintf(out, len, "nodes");
    for (int r = 0; r < l->p && at < len; r++)
        at += (size_t)snprintf(out + at, len - at, " %d", l->null ? 0 : l->node[r]);
}

static void check_sched_nodes(int algo, int coll, const struct layout *l, int root, size_t count,
                              size_t chunk, int slots)
{
    struct weft_schedule sch[SMALLP];
    char err[700], where[300];
    build_all_nodes(algo, coll, l, root, count, chunk, sch);
    bool ok = verify(algo, coll, l->p, root, count, sch, slots, err, sizeof(err));
    free_all(l->p, sch);
    describe(l, where, sizeof(where));
    cr_assert(ok, "hier variant %d, %s, chunk %zu: %s", PLAN_VAR(algo), where, chunk, err);
}

/* Every collective and both variants on one layout: counts 0, 1, p-1,
 * p+1, a large odd one, and many chunks (of 3 and of 1) to pipeline;
 * every root while p <= 8. */
static void hier_matrix(const struct layout *l, int slots)
{
    int p = l->p;
    for (int v = 0; v < 2; v++) {
        int plan = v ? PLAN_HIER_RHD : PLAN_HIER_RING;
        for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++) {
            bool per_block = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCE_SCATTER;
            size_t counts[] = { 0, 1, (size_t)p - 1, (size_t)p + 1,
                                per_block ? 100003 : 1000003, per_block ? 7 : 5 * (size_t)p + 2,
                                per_block ? 2 : (size_t)p + 3 };
            size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, per_block ? 1 << 18 : 65536,
                                3, 1 };
            int roots[SMALLP], nroots = 0;
            bool rooted = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
            if (!rooted) {
                roots[nroots++] = 0;
            } else if (p <= 8) {
                for (int r = 0; r < p; r++)
                    roots[nroots++] = r;
            } else {
                int pick[] = { 0, 1, p / 2, p - 1 };
                for (int k = 0; k < 4; k++)
                    roots[nroots++] = pick[k];
            }
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
                for (int r = 0; r < nroots; r++)
                    check_sched_nodes(plan, coll, l, roots[r], counts[c], chunks[c], slots);
        }
    }
}

Test(hier, block_layouts)
{
    for (int per = 2; per <= 4; per++)
        for (int p = 1; p <= 3 * per + 1; p++) {
            struct layout l = block_layout(p, per);
            hier_matrix(&l, engine_slots());
        }
}

Test(hier, block_layouts_large_p)
{
    /* 31 ranks in 3s: the last node has one. */
    struct layout ls[] = { block_layout(16, 2), block_layout(31, 3), block_layout(64, 4) };
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++)
        hier_matrix(&ls[i], engine_slots());
}

Test(hier, uneven_layouts)
{
    static const int s312[] = { 3, 1, 2 }, s15[] = { 1, 5 }, s51[] = { 5, 1 },
                     s1231[] = { 1, 2, 3, 1 };
    struct layout ls[] = {
        sized_layout(s312, 3), sized_layout(s15, 2), sized_layout(s51, 2),
        sized_layout(s1231, 4),
    };
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++)
        hier_matrix(&ls[i], engine_slots());
    /* Not contiguous and uneven: nodes 0: {0, 2, 5, 6}, 1: {1, 4}, 2: {3}. */
    struct layout mixed = { 7, 3, false, { 0, 1, 0, 2, 1, 0, 0 } };
    hier_matrix(&mixed, engine_slots());
    /* Node ids out of rank order, one of them unused. */
    struct layout ids = { 6, 5, false, { 4, 4, 0, 2, 0, 2 } };
    hier_matrix(&ids, engine_slots());
}

Test(hier, one_node_and_one_rank_per_node)
{
    for (int p = 1; p <= 9; p++) {
        struct layout none = { p, 0, true, { 0 } };
        hier_matrix(&none, engine_slots());
        struct layout one = { p, 2, false, { 0 } }; /* node 1 is empty */
        hier_matrix(&one, engine_slots());
        struct layout each = block_layout(p, 1);
        hier_matrix(&each, engine_slots());
        struct layout reversed = { p, p, false, { 0 } };
        for (int r = 0; r < p; r++)
            reversed.node[r] = p - 1 - r;
        hier_matrix(&reversed, engine_slots());
    }
}

Test(hier, interleaved_layouts)
{
    for (int k = 2; k <= 3; k++)
        for (int p = k; p <= 4 * k; p += k - 1) {
            struct layout l = interleaved_layout(p, k);
            hier_matrix(&l, engine_slots());
        }
}

/* One staging slot per rank, unbuffered: a later phase's RECV_REDUCE
 * must not take the slot an earlier one needs. */
Test(hier, one_staging_slot)
{
    static const int s312[] = { 3, 1, 2 };
    struct layout ls[] = { block_layout(8, 4), block_layout(7, 3), sized_layout(s312, 3),
                           interleaved_layout(6, 2) };
    for (size_t i = 0; i < sizeof(ls) / sizeof(ls[0]); i++)
        hier_matrix(&ls[i], 1);
}

/* Elements a rank sends to ranks of other nodes. */
static size_t sent_off_node(const struct weft_schedule *s, const int *node, int rank)
{
    size_t n = 0;
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == WEFT_STEP_SEND && node[s->steps[i].peer] != node[rank])
            n += s->steps[i].count;
    return n;
}

/* The shapes the design promises: equal nodes take the 2D allreduce (each
 * rank carries 1/L of the inter-node traffic, where the leader form puts
 * all of it on the leader); one node is the flat ring; the root's node
 * needs no hop to its leader. */
Test(hier, shape)
{
    struct weft_schedule s, f;
    weft_sched_init(&s);
    weft_sched_init(&f);
    /* 2 nodes of 4, 64 elements: slices of 16, a ring of 2 over each moves
     * 16 elements each way. */
    struct layout l = block_layout(8, 4);
    for (int rank = 0; rank < 8; rank++) {
        struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, rank, 8, 0, 64, 1 << 20, WEFT_ALGO_HIER,
                                    WEFT_VAR_HIER_RING, 0, l.node, l.nnodes };
        cr_assert(weft_hier_build(&d, &s) == WEFT_OK);
        cr_assert(sent_off_node(&s, l.node, rank) == 16, "rank %d sends %zu off node", rank,
                  sent_off_node(&s, l.node, rank));
    }
    /* Uneven nodes (3, 1, 2): only leaders cross, with the whole vector. */
    static const int s312[] = { 3, 1, 2 };
    l = sized_layout(s312, 3);
    for (int rank = 0; rank < 6; rank++) {
        struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, rank, 6, 0, 60, 1 << 20, WEFT_ALGO_HIER,
                                    WEFT_VAR_HIER_RING, 0, l.node, l.nnodes };
        cr_assert(weft_hier_build(&d, &s) == WEFT_OK);
        bool leader = rank == 0 || rank == 3 || rank == 4;
        size_t off = sent_off_node(&s, l.node, rank);
        cr_assert(leader ? off == 2 * 60 * 2 / 3 : off == 0, "rank %d sends %zu off node", rank,
                  off);
    }
    /* One node: reduce_scatter and allgather are the flat ring itself. */
    for (int coll = WEFT_COLL_REDUCE_SCATTER; coll <= WEFT_COLL_ALLGATHER; coll++)
        for (int rank = 0; rank < 5; rank++) {
            struct weft_coll_desc d = { coll, rank, 5, 0, 13, 4, WEFT_ALGO_HIER,
                                        WEFT_VAR_HIER_RING, 0, NULL, 0 };
            cr_assert(weft_hier_build(&d, &s) == WEFT_OK);
            d.algo = WEFT_ALGO_RING;
            cr_assert(weft_ring_build(&d, &f) == WEFT_OK);
            cr_assert(same_steps(&s, &f), "%s rank %d", weft_coll_name(coll), rank);
        }
    /* Broadcast from rank 2 of node {0, 1, 2}: it sends straight to the
     * other nodes' leaders (3 and 5) and starts its node's chain (2, 0,
     * 1); 0 and 1 never send off their node. */
    l = sized_layout(s312, 3);
    for (int rank = 0; rank < 6; rank++) {
        struct weft_coll_desc d = { WEFT_COLL_BROADCAST, rank, 6, 2, 10, 1 << 20, WEFT_ALGO_HIER,
                                    WEFT_VAR_HIER_RHD, 0, l.node, l.nnodes };
        cr_assert(weft_hier_build(&d, &s) == WEFT_OK);
        size_t sends = 0;
        for (size_t i = 0; i < s.nsteps; i++)
            sends += s.steps[i].kind == WEFT_STEP_SEND;
        if (rank == 2)
            cr_assert(sends == 3 && sent_off_node(&s, l.node, rank) == 20, "root: %zu sends",
                      sends);
        if (rank == 0 || rank == 1)
            cr_assert(sent_off_node(&s, l.node, rank) == 0);
    }
    weft_sched_free(&s);
    weft_sched_free(&f);
}

/* A node map the builder cannot use is refused with a message that names
 * the problem; nothing is left in the schedule. */
Test(hier, refusals)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    int bad_hi[4] = { 0, 0, 2, 1 }, bad_lo[4] = { 0, -1, 1, 1 }, ok[4] = { 0, 0, 1, 1 };
    struct {
        const int *node;
        int nnodes, coll, root;
        size_t count, chunk;
        const char *needle;
    } c[] = {
        { bad_hi, 2, WEFT_COLL_ALLREDUCE, 0, 8, 2, "node[2] = 2 is outside [0, 2)" },
        { bad_lo, 2, WEFT_COLL_ALLGATHER, 0, 8, 2, "node[1] = -1 is outside [0, 2)" },
        { ok, 0, WEFT_COLL_BROADCAST, 0, 8, 2, "nnodes 0" },
        { ok, -3, WEFT_COLL_REDUCE, 0, 8, 2, "nnodes -3" },
        { ok, 2, WEFT_COLL_REDUCE, 4, 8, 2, "root 4" },
        { ok, 2, WEFT_COLL_REDUCE_SCATTER, 0, 8, 0, "chunk" },
        { ok, 2, WEFT_COLL_ALLGATHER, 0, SIZE_MAX / 2, 2, "overflows" },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct weft_coll_desc d = { c[i].coll, 1, 4, c[i].root, c[i].count, c[i].chunk,
                                    WEFT_ALGO_HIER, WEFT_VAR_HIER_RING, 0, c[i].node, c[i].nnodes };
        s.nsteps = 1;
        weft_status_t st = weft_sched_build(&d, &s);
        cr_assert(st == WEFT_ERR_INVALID_ARG, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0, "case %zu", i);
    }
    /* Without a map, nnodes is not looked at. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 2, WEFT_ALGO_HIER,
                                WEFT_VAR_HIER_RHD, 0, NULL, -1 };
    cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps > 0);
    d.coll = WEFT_COLL_SEND;
    cr_assert(weft_sched_build(&d, &s) == WEFT_ERR_UNSUPPORTED);
    cr_assert(weft_hier_build(&d, &s) == WEFT_ERR_UNSUPPORTED);
    for (int v = 0; v < 2; v++)
        for (int coll = 0; coll <= WEFT_COLL_REDUCE; coll++)
            cr_assert(weft_algo_serves(WEFT_ALGO_HIER, v, coll));
    cr_assert(weft_hier_build(NULL, &s) == WEFT_ERR_INVALID_ARG);
    cr_assert(weft_hier_build(&d, NULL) == WEFT_ERR_INVALID_ARG);
    weft_sched_free(&s);
}

/* The checker sees what the phase dependencies are for: with a
 * cross-phase dependency dropped, the intra-node broadcast overwrites
 * (in place) memory the intra-node reduce still sends. */
static void hier_drop_cross_dep(struct weft_schedule *sch, int p)
{
    (void)p;
    struct weft_schedule *s = &sch[1]; /* a non-leader: reduce chain, then broadcast chain */
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].kind == WEFT_STEP_RECV) {
            for (int k = 0; k < WEFT_STEP_MAX_DEPS; k++)
                s->steps[i].deps[k] = -1;
            return;
        }
    cr_assert_fail("no RECV on rank 1");
}

Test(hier, checker_sees_phase_order)
{
    /* Uneven nodes (2, 1): allreduce takes the leader form. */
    struct layout l = { 3, 2, false, { 0, 0, 1 } };
    struct weft_schedule sch[SMALLP];
    char err[700];
    build_all_nodes(PLAN_HIER_RING, WEFT_COLL_ALLREDUCE, &l, 0, 6, 2, sch);
    cr_assert(verify(PLAN_HIER_RING, WEFT_COLL_ALLREDUCE, 3, 0, 6, sch, engine_slots(), err,
                     sizeof(err)), "%s", err);
    hier_drop_cross_dep(sch, 3);
    bool ok = verify(PLAN_HIER_RING, WEFT_COLL_ALLREDUCE, 3, 0, 6, sch, engine_slots(), err,
                     sizeof(err));
    free_all(3, sch);
    cr_assert(!ok && strstr(err, "touch the same memory unordered"), "%s", ok ? "passed" : err);
}

/* ---- the double binary tree and direct schedules, checked --------------------------- */

#define PLAN_DBT PLAN(WEFT_ALGO_TREE, WEFT_VAR_TREE_DOUBLE)
#define PLAN_DIRECT PLAN(WEFT_ALGO_DIRECT, 0)

/* Ranks pmin..pmax (then 31 and 64 when with_big); counts 0, 1, p-1, p+1,
 * a large odd one in large chunks, and many chunks of 3 and of 1
 * (pipelining); every root up to 16 ranks, 0, 1, p/2 and p-1 above, where
 * the last three counts take two of those roots each in turn.  The
 * per-block collectives, the direct rooted ones (whose root has a step per
 * rank and chunk) and, in chunks of 1, rank counts above 17 get smaller
 * many-chunk counts: the race check is quadratic in steps per rank. */
static void dbt_direct_matrix(int plan, int coll, int pmin, int pmax, bool with_big, int slots)
{
    int ps[SMALLP], np = rank_counts(pmin, pmax, with_big, ps);
    bool per_block = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCE_SCATTER;
    bool rooted = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
    bool star = rooted && PLAN_ALGO(plan) == WEFT_ALGO_DIRECT;
    for (int i = 0; i < np; i++) {
        int p = ps[i];
        size_t up = (size_t)p;
        size_t many = per_block ? 17 : star ? 3 * up + 7 : 10 * up + 7;
        size_t single = per_block ? 5 : star ? up + 1 : p > 17 ? 2 * up + 7 : 10 * up + 7;
        size_t counts[] = { 0, 1, up - 1, up + 1, 1000003, many, single };
        size_t chunks[] = { 1 << 20, 1 << 20, 1 << 20, 1 << 20, per_block ? 1 << 18 : 65536, 3,
                            1 };
        int pick[] = { 0, 1, p / 2, p - 1 };
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            if (!rooted) {
                check_sched(plan, coll, p, 0, counts[c], chunks[c], slots);
            } else if (p <= 16) {
                for (int r = 0; r < p; r++)
                    check_sched(plan, coll, p, r, counts[c], chunks[c], slots);
            } else {
                for (size_t k = 0; k < 4; k++)
                    if (c < 4 || k == c % 4 || k == (c + 2) % 4)
                        check_sched(plan, coll, p, pick[k], counts[c], chunks[c], slots);
            }
        }
    }
}

Test(dbt, allreduce) { dbt_direct_matrix(PLAN_DBT, WEFT_COLL_ALLREDUCE, 1, 17, true, engine_slots()); }
Test(dbt, reduce) { dbt_direct_matrix(PLAN_DBT, WEFT_COLL_REDUCE, 1, 17, true, engine_slots()); }
Test(dbt, broadcast) { dbt_direct_matrix(PLAN_DBT, WEFT_COLL_BROADCAST, 1, 17, true, engine_slots()); }

/* One staging slot: a receive-reduce holds it until its data is folded;
 * no rank may end up waiting for one that only a later step frees. */
Test(dbt, one_staging_slot)
{
    dbt_direct_matrix(PLAN_DBT, WEFT_COLL_ALLREDUCE, 1, 9, false, 1);
    dbt_direct_matrix(PLAN_DBT, WEFT_COLL_REDUCE, 1, 9, false, 1);
    dbt_direct_matrix(PLAN_BINOMIAL, WEFT_COLL_REDUCE, 1, 9, false, 1);
}

Test(tree, binomial_reduce)
{
    dbt_direct_matrix(PLAN_BINOMIAL, WEFT_COLL_REDUCE, 1, 17, true, engine_slots());
}

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
                cr_assert(weft_tree_build(&d, &sch[r]) == WEFT_OK);
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
    cr_assert(weft_tree_build(&d, &s) == WEFT_OK);
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
        cr_assert(weft_tree_build(&d, &s) == WEFT_OK);
        cr_assert(s.scratch_count == 0 || s.scratch_count == 6 || s.scratch_count == 5,
                  "rank %d: scratch %zu", r, s.scratch_count);
        cr_assert(r != 0 || s.scratch_count == 0);
        forwarded += s.scratch_count;
    }
    cr_assert(forwarded == 3 * 6 + 3 * 5, "%zu", forwarded);
    weft_sched_free(&s);
}

Test(dbt, refusals)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct {
        struct weft_coll_desc d;
        weft_status_t want;
        const char *needle;
    } c[] = {
#define TREE_DESC(coll, rank, p, root, chunk, var)                                            \
    { coll, rank, p, root, 10, chunk, WEFT_ALGO_TREE, var, 0, NULL, 0 }
        { TREE_DESC(WEFT_COLL_REDUCE_SCATTER, 0, 4, 0, 4, 0), WEFT_ERR_UNSUPPORTED,
          "no reducescatter" },
        { TREE_DESC(WEFT_COLL_ALLGATHER, 0, 4, 0, 4, 0), WEFT_ERR_UNSUPPORTED, "no allgather" },
        { TREE_DESC(WEFT_COLL_SEND, 0, 4, 0, 4, 0), WEFT_ERR_UNSUPPORTED, "no send" },
        { TREE_DESC(WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 1), WEFT_ERR_UNSUPPORTED,
          "(variant 1): no allreduce" },
        { TREE_DESC(WEFT_COLL_REDUCE_SCATTER, 0, 4, 0, 4, 1), WEFT_ERR_UNSUPPORTED,
          "no reducescatter" },
        { TREE_DESC(WEFT_COLL_REDUCE, 0, 4, 0, 4, 2), WEFT_ERR_UNSUPPORTED, "variant 2" },
        { TREE_DESC(WEFT_COLL_REDUCE, 0, 4, 0, 4, -1), WEFT_ERR_UNSUPPORTED, "variant -1" },
        { TREE_DESC(99, 0, 4, 0, 4, 0), WEFT_ERR_UNSUPPORTED, "no unknown" },
        { TREE_DESC(WEFT_COLL_REDUCE, 0, 4, 4, 4, 0), WEFT_ERR_INVALID_ARG, "root 4" },
        { TREE_DESC(WEFT_COLL_BROADCAST, 0, 4, -1, 4, 0), WEFT_ERR_INVALID_ARG, "root -1" },
        { TREE_DESC(WEFT_COLL_REDUCE, 0, 4, 5, 4, 1), WEFT_ERR_INVALID_ARG, "root 5" },
        { TREE_DESC(WEFT_COLL_ALLREDUCE, 4, 4, 0, 4, 0), WEFT_ERR_INVALID_ARG, "rank 4 of 4" },
        { TREE_DESC(WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 0), WEFT_ERR_INVALID_ARG, "rank 0 of 0" },
        { TREE_DESC(WEFT_COLL_ALLREDUCE, 0, 4, 0, 0, 0), WEFT_ERR_INVALID_ARG, "chunk" },
        { TREE_DESC(WEFT_COLL_REDUCE, 0, 4, 0, 0, 1), WEFT_ERR_INVALID_ARG, "chunk" },
#undef TREE_DESC
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        weft_status_t st = weft_tree_build(&c[i].d, &s);
        cr_assert(st == c[i].want, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0);
        cr_assert(weft_sched_build(&c[i].d, &s) == c[i].want, "case %zu via sched_build", i);
    }
    /* Allreduce has no root: any value is fine. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 4, 77, 10, 4, WEFT_ALGO_TREE,
                                WEFT_VAR_TREE_DOUBLE, 0, NULL, 0 };
    cr_assert(weft_tree_build(&d, &s) == WEFT_OK && s.nsteps > 0);
    cr_assert(weft_tree_build(NULL, &s) == WEFT_ERR_INVALID_ARG);
    cr_assert(weft_tree_build(&d, NULL) == WEFT_ERR_INVALID_ARG);
    /* What each variant serves. */
    cr_assert(weft_algo_serves(WEFT_ALGO_TREE, WEFT_VAR_TREE_DOUBLE, WEFT_COLL_ALLREDUCE));
    cr_assert(weft_algo_serves(WEFT_ALGO_TREE, WEFT_VAR_TREE_DOUBLE, WEFT_COLL_REDUCE));
    cr_assert(weft_algo_serves(WEFT_ALGO_TREE, WEFT_VAR_TREE_DOUBLE, WEFT_COLL_BROADCAST));
    cr_assert(!weft_algo_serves(WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, WEFT_COLL_ALLREDUCE));
    cr_assert(weft_algo_serves(WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, WEFT_COLL_REDUCE));
    weft_sched_free(&s);
}

/* ---- broken double tree schedules ---- */

/* The rank whose schedule holds a FINAL fold of element elem. */
static int final_rank(struct weft_schedule *sch, int p, size_t elem)
{
    for (int r = 0; r < p; r++)
        for (size_t i = 0; i < sch[r].nsteps; i++)
            if ((sch[r].steps[i].flags & WEFT_STEP_FINAL) && sch[r].steps[i].off <= elem &&
                elem < sch[r].steps[i].off + sch[r].steps[i].count)
                return r;
    cr_assert_fail("no FINAL for element %zu", elem);
    return -1;
}

static void dbt_drop_final(struct weft_schedule *sch, int p)
{
    /* Tree 1's root folds the last child in without FINAL. */
    struct weft_schedule *s = &sch[final_rank(sch, p, 9)];
    for (size_t i = 0; i < s->nsteps; i++)
        if (s->steps[i].off >= 5)
            s->steps[i].flags &= (uint8_t)~WEFT_STEP_FINAL;
}

static void dbt_recv_down_early(struct weft_schedule *sch, int p)
{
    /* Rank 0 (a leaf of tree 0) takes the result into memory its send up
     * may still be reading, in place. */
    struct weft_step *st = find_step(&sch[0], WEFT_STEP_RECV, 0);
    cr_assert(st->deps[0] >= 0);
    st->deps[0] = -1;
}

static void dbt_send_up_early(struct weft_schedule *sch, int p)
{
    /* Rank 1 (interior in tree 0) passes its partial sum up before the
     * second child's data is folded in. */
    for (size_t i = 0; i < sch[1].nsteps; i++) {
        struct weft_step *st = &sch[1].steps[i];
        if (st->kind == WEFT_STEP_SEND && st->deps[0] >= 0 &&
            sch[1].steps[st->deps[0]].kind == WEFT_STEP_RECV_REDUCE) {
            st->deps[0] = sch[1].steps[st->deps[0]].deps[0];
            return;
        }
    }
    cr_assert_fail("rank 1 forwards nothing");
}

static void dbt_swap_halves(struct weft_schedule *sch, int p)
{
    /* p=6: rank 1 (key 5 of tree 1, a leaf) sends its part of tree 1
     * from tree 0's half. */
    for (size_t i = 0; i < sch[1].nsteps; i++) {
        struct weft_step *st = &sch[1].steps[i];
        if (st->kind == WEFT_STEP_SEND && st->buf == WEFT_BUF_SEND && st->off >= 5) {
            st->off -= 5;
            return;
        }
    }
    cr_assert_fail("rank 1 sends nothing of tree 1");
}

static void dbt_root_order(struct weft_schedule *sch, int p)
{
    /* Reduce, p=2, root 1: the root takes tree 1's chunk before tree 0's
     * from rank 0, which sends them the other way round. */
    struct weft_schedule *s = &sch[1];
    cr_assert(s->nsteps >= 2 && s->steps[0].peer == s->steps[1].peer);
    struct weft_step t = s->steps[0];
    s->steps[0] = s->steps[1];
    s->steps[1] = t;
}

Test(checker, catches_broken_dbt_schedules)
{
    const int dbt = PLAN_DBT, ar = WEFT_COLL_ALLREDUCE;
    expect_caught_algo(dbt, ar, 5, 0, 10, 2, dbt_drop_final, "lacks FINAL");
    expect_caught_algo(dbt, ar, 5, 0, 10, 2, dbt_recv_down_early, "unordered");
    expect_caught_algo(dbt, ar, 7, 0, 10, 2, dbt_send_up_early, "unordered");
    expect_caught_algo(dbt, ar, 6, 0, 10, 100, dbt_swap_halves, "combines input positions");
    expect_caught_algo(dbt, WEFT_COLL_REDUCE, 2, 1, 10, 100, dbt_root_order, "position");
}

/* ---- direct, checked ------------------------------------------------------------ */

Test(direct, allreduce)
{
    dbt_direct_matrix(PLAN_DIRECT, WEFT_COLL_ALLREDUCE, 1, 17, true, engine_slots());
}
Test(direct, reduce_scatter)
{
    dbt_direct_matrix(PLAN_DIRECT, WEFT_COLL_REDUCE_SCATTER, 1, 17, true, engine_slots());
}
Test(direct, allgather)
{
    dbt_direct_matrix(PLAN_DIRECT, WEFT_COLL_ALLGATHER, 1, 17, true, engine_slots());
}
Test(direct, broadcast)
{
    dbt_direct_matrix(PLAN_DIRECT, WEFT_COLL_BROADCAST, 1, 17, true, engine_slots());
}
Test(direct, reduce) { dbt_direct_matrix(PLAN_DIRECT, WEFT_COLL_REDUCE, 1, 17, true, engine_slots()); }

Test(direct, one_staging_slot)
{
    int colls[] = { WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER, WEFT_COLL_REDUCE };
    for (size_t c = 0; c < sizeof(colls) / sizeof(colls[0]); c++)
        dbt_direct_matrix(PLAN_DIRECT, colls[c], 1, 9, false, 1);
}

/* Rank r sends to r+1, r+2, ... and folds what r-1, r-2, ... send, FINAL
 * on the last fold; the allgather half waits for that fold. */
Test(direct, step_structure)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    /* p=4, 8 elements (2 per block), one chunk: rank 1. */
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 1, 4, 0, 8, 100, WEFT_ALGO_DIRECT, 0, 0,
                                NULL, 0 };
    cr_assert(weft_direct_build(&d, &s) == WEFT_OK);
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
    cr_assert(weft_direct_build(&d, &s) == WEFT_OK && s.nsteps == 3 * 4 + 1);
    cr_assert(s.steps[0].peer == 3 && s.steps[3].peer == 1 && s.steps[12].kind == WEFT_STEP_COPY);
    d.coll = WEFT_COLL_REDUCE;
    cr_assert(weft_direct_build(&d, &s) == WEFT_OK && s.nsteps == 3 * 4);
    cr_assert(count_flag(&s, WEFT_STEP_FINAL) == 3 && s.steps[0].peer == 1 &&
              s.steps[3].peer == 3 && (s.steps[3].flags & WEFT_STEP_FINAL));
    d.rank = 4;
    cr_assert(weft_direct_build(&d, &s) == WEFT_OK && s.nsteps == 3 && s.steps[2].peer == 2);
    weft_sched_free(&s);
}

Test(direct, refusals)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct {
        struct weft_coll_desc d;
        weft_status_t want;
        const char *needle;
    } c[] = {
#define DIRECT_DESC(coll, rank, p, root, count, chunk, var)                                   \
    { coll, rank, p, root, count, chunk, WEFT_ALGO_DIRECT, var, 0, NULL, 0 }
        { DIRECT_DESC(WEFT_COLL_SEND, 0, 4, 0, 4, 1, 0), WEFT_ERR_UNSUPPORTED, "no send" },
        { DIRECT_DESC(WEFT_COLL_RECV, 0, 4, 0, 4, 1, 0), WEFT_ERR_UNSUPPORTED, "no recv" },
        { DIRECT_DESC(WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 1, 1), WEFT_ERR_UNSUPPORTED,
          "(variant 1): no allreduce" },
        { DIRECT_DESC(-1, 0, 4, 0, 4, 1, 0), WEFT_ERR_UNSUPPORTED, "no unknown" },
        { DIRECT_DESC(WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 1, 0), WEFT_ERR_INVALID_ARG, "nranks 0" },
        { DIRECT_DESC(WEFT_COLL_ALLREDUCE, -1, 4, 0, 4, 1, 0), WEFT_ERR_INVALID_ARG, "rank -1" },
        { DIRECT_DESC(WEFT_COLL_BROADCAST, 0, 4, 4, 4, 1, 0), WEFT_ERR_INVALID_ARG, "root 4" },
        { DIRECT_DESC(WEFT_COLL_REDUCE, 0, 4, -1, 4, 1, 0), WEFT_ERR_INVALID_ARG, "root -1" },
        { DIRECT_DESC(WEFT_COLL_ALLGATHER, 0, 4, 0, 4, 0, 0), WEFT_ERR_INVALID_ARG, "chunk" },
        { DIRECT_DESC(WEFT_COLL_ALLGATHER, 0, 4, 0, SIZE_MAX / 2, 1, 0), WEFT_ERR_INVALID_ARG,
          "overflows" },
        { DIRECT_DESC(WEFT_COLL_REDUCE_SCATTER, 0, 3, 0, SIZE_MAX / 2, 1, 0),
          WEFT_ERR_INVALID_ARG, "overflows" },
#undef DIRECT_DESC
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        weft_status_t st = weft_direct_build(&c[i].d, &s);
        cr_assert(st == c[i].want, "case %zu: %s", i, weft_status_string(st));
        cr_assert(strstr(weft_last_error(NULL), c[i].needle), "case %zu: message '%s'", i,
                  weft_last_error(NULL));
        cr_assert(s.nsteps == 0);
        cr_assert(weft_sched_build(&c[i].d, &s) == c[i].want, "case %zu via sched_build", i);
    }
    cr_assert(weft_direct_build(NULL, &s) == WEFT_ERR_INVALID_ARG);
    /* The dispatcher runs direct. */
    struct weft_schedule a;
    weft_sched_init(&a);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 3, 6, 0, 100, 7, WEFT_ALGO_DIRECT, 0, 0,
                                NULL, 0 };
    cr_assert(weft_sched_build(&d, &a) == WEFT_OK && weft_direct_build(&d, &s) == WEFT_OK);
    cr_assert(a.nsteps > 0 && same_steps(&a, &s));
    weft_sched_free(&a);
    weft_sched_free(&s);
}
