/*
 * test_schedule_families.c - every algorithm family's schedules proved
 * correct by the checker in sched_sim.c (part of test_schedule): ring,
 * binomial tree, rd, ordered, rhd, hier, double tree and direct, each over
 * every root, pipelined counts, and one and two staging slots; with the
 * shape tests of ordered and hier, which run on the same rank counts and
 * node maps.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_sim.h"
#include "sched_test_util.h"

/* ---- one checked schedule set, and the rank counts ------------------------------- */

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

/* The rank counts the per-algorithm matrices run (the matrix tests in
 * test_schedule_matrix.c go further): at most 64. */
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

/* The roots a matrix checks coll from on p ranks: 0 alone where there is
 * none, every rank up to all_upto ranks, else 0, 1, p/2 and p-1.  Returns
 * how many. */
static int matrix_roots(int coll, int p, int all_upto, int roots[SMALLP])
{
    bool rooted = coll == WEFT_COLL_BROADCAST || coll == WEFT_COLL_REDUCE;
    int n = 0;
    if (!rooted) {
        roots[n++] = 0;
    } else if (p <= all_upto) {
        for (int r = 0; r < p; r++)
            roots[n++] = r;
    } else {
        int pick[] = { 0, 1, p / 2, p - 1 };
        for (int k = 0; k < 4; k++)
            roots[n++] = pick[k];
    }
    return n;
}

/* Ranks pmin..pmax, then 31 and 64 when with_big; slots: see verify.  The
 * last count is 9p+1 in chunks of 3, and then p+1 in chunks of 1 goes from
 * one root; with rhd_last, the last count is p+1 in chunks of 1 from every
 * root instead (see rhd_matrix). */
static void plan_matrix_counts(int plan, int coll, int pmin, int pmax, bool with_big, int slots,
                               bool rhd_last)
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
        if (rhd_last) {
            counts[6] = per_block ? 5 : (size_t)p + 1;
            chunks[6] = 1;
        }
        int roots[SMALLP], nroots = matrix_roots(coll, p, 16, roots);
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++)
            for (int r = 0; r < nroots; r++)
                check_sched(plan, coll, p, roots[r], counts[c], chunks[c], slots);
        /* Chunk 1: every element its own step. */
        if (!rhd_last)
            check_sched(plan, coll, p, roots[nroots - 1], per_block ? 3 : (size_t)p + 1, 1,
                        slots);
    }
}

static void plan_matrix(int plan, int coll, int pmin, int pmax, bool with_big, int slots)
{
    plan_matrix_counts(plan, coll, pmin, pmax, with_big, slots, false);
}

/* ---- the ring, checked ----------------------------------------------------------- */

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

/* Every rhd collective over ranks pmin..pmax (then 31 and 64 when
 * with_big): powers of two and folded counts, every root up to 16 ranks
 * and four above, counts that leave virtual blocks empty or uneven, one
 * large odd count, and chunks of 3 and 1 so that rounds pipeline. */
static void rhd_matrix(int plan, int coll, int pmin, int pmax, bool with_big, int slots)
{
    plan_matrix_counts(plan, coll, pmin, pmax, with_big, slots, true);
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
            int roots[SMALLP], nroots = matrix_roots(coll, p, 8, roots);
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
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
        cr_assert(sent_off_node(&s, l.node, rank) == 16, "rank %d sends %zu off node", rank,
                  sent_off_node(&s, l.node, rank));
    }
    /* Uneven nodes (3, 1, 2): only leaders cross, with the whole vector. */
    static const int s312[] = { 3, 1, 2 };
    l = sized_layout(s312, 3);
    for (int rank = 0; rank < 6; rank++) {
        struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, rank, 6, 0, 60, 1 << 20, WEFT_ALGO_HIER,
                                    WEFT_VAR_HIER_RING, 0, l.node, l.nnodes };
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
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
            cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
            d.algo = WEFT_ALGO_RING;
            cr_assert(weft_sched_build(&d, &f) == WEFT_OK);
            cr_assert(same_steps(&s, &f), "%s rank %d", weft_coll_name(coll), rank);
        }
    /* Broadcast from rank 2 of node {0, 1, 2}: it sends straight to the
     * other nodes' leaders (3 and 5) and starts its node's chain (2, 0,
     * 1); 0 and 1 never send off their node. */
    l = sized_layout(s312, 3);
    for (int rank = 0; rank < 6; rank++) {
        struct weft_coll_desc d = { WEFT_COLL_BROADCAST, rank, 6, 2, 10, 1 << 20, WEFT_ALGO_HIER,
                                    WEFT_VAR_HIER_RHD, 0, l.node, l.nnodes };
        cr_assert(weft_sched_build(&d, &s) == WEFT_OK);
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

/* A node map the builder cannot use, or a count past its address space,
 * is refused with a message that names the problem; nothing is left in
 * the schedule. */
Test(hier, refusals)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    int bad_hi[4] = { 0, 0, 2, 1 }, bad_lo[4] = { 0, -1, 1, 1 }, ok[4] = { 0, 0, 1, 1 };
    struct {
        const int *node;
        int nnodes, coll;
        size_t count;
        const char *needle;
    } c[] = {
        { bad_hi, 2, WEFT_COLL_ALLREDUCE, 8, "node[2] = 2 is outside [0, 2)" },
        { bad_lo, 2, WEFT_COLL_ALLGATHER, 8, "node[1] = -1 is outside [0, 2)" },
        { ok, 0, WEFT_COLL_BROADCAST, 8, "nnodes 0" },
        { ok, -3, WEFT_COLL_REDUCE, 8, "nnodes -3" },
        { ok, 2, WEFT_COLL_ALLGATHER, SIZE_MAX / 4 / 4 + 1, "hier allgather: count" },
    };
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
        struct weft_coll_desc d = { c[i].coll, 1, 4, 0, c[i].count, 2, WEFT_ALGO_HIER,
                                    WEFT_VAR_HIER_RING, 0, c[i].node, c[i].nnodes };
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
