/*
 * test_schedule.c - the schedule tests: every ring, recursive doubling and
 * binomial tree schedule proved correct by the checker in sched_sim.c, broken schedules it
 * must catch, engine deadlocks, and the schedule container itself.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_sim.h"

/* ---- the ring, checked -------------------------------------------------------- */

static void build_all(int algo, int coll, int p, int root, size_t count, size_t chunk,
                      struct weft_schedule *sch)
{
    for (int rank = 0; rank < p; rank++) {
        struct weft_coll_desc d = { coll, rank, p, root, count, chunk, PLAN_ALGO(algo), PLAN_VAR(algo), 0, NULL, 0 };
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
    struct weft_schedule sch[MAXP];
    char err[700];
    build_all(algo, coll, p, root, count, chunk, sch);
    bool ok = verify(algo, coll, p, root, count, sch, slots, err, sizeof(err));
    free_all(p, sch);
    cr_assert(ok, "chunk %zu: %s", chunk, err);
}

/* Fills ps with pmin..pmax, then 31 and 64 when with_big; returns how many. */
static int rank_counts(int pmin, int pmax, bool with_big, int ps[MAXP])
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
static void ring_matrix(int coll, int pmin, int pmax, bool with_big, int slots)
{
    int ps[MAXP], np = rank_counts(pmin, pmax, with_big, ps);
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
        int roots[MAXP], nroots = 0;
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
                check_sched(WEFT_ALGO_RING, coll, p, roots[r], counts[c], chunks[c], slots);
        /* Chunk 1: every element its own step. */
        check_sched(WEFT_ALGO_RING, coll, p, roots[nroots - 1], per_block ? 3 : (size_t)p + 1,
                    1, slots);
    }
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
    int ps[MAXP], np = rank_counts(pmin, pmax, with_big, ps);
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
    int ps[MAXP], np = rank_counts(pmin, pmax, with_big, ps);
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

/* ---- the checker catches broken schedules ----------------------------------------- */

/* Builds a correct schedule set, lets mutate() break it, and expects the
 * checker to say so with a message containing needle. */
static void expect_caught_algo(int algo, int coll, int p, int root, size_t count, size_t chunk,
                               void (*mutate)(struct weft_schedule *sch, int p),
                               const char *needle)
{
    struct weft_schedule sch[MAXP];
    char err[700] = "";
    int slots = engine_slots();
    build_all(algo, coll, p, root, count, chunk, sch);
    cr_assert(verify(algo, coll, p, root, count, sch, slots, err, sizeof(err)),
              "baseline: %s", err);
    mutate(sch, p);
    bool ok = verify(algo, coll, p, root, count, sch, slots, err, sizeof(err));
    free_all(p, sch);
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
