/*
 * test_schedule.c - the schedule tests that must see a failure (one binary
 * with test_schedule_structure.c, _families.c and _matrix.c): descriptions
 * weft_sched_build refuses for every family, broken schedules the checker
 * in sched_sim.c must catch, and deadlocks the engine would have.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sched_sim.h"
#include "sched_test_util.h"

/* ---- weft_sched_build refuses bad descriptions ----------------------------------- */

/* The statement after it runs for every plan (algo, var) of the registry
 * that serves coll. */
#define FOR_EACH_SERVING(algo, var, coll)                                                 \
    for (int algo = 0; algo < WEFT_ALGO_COUNT; algo++)                                    \
        for (int var = 0; var < WEFT_VAR_COUNT; var++)                                    \
            if (weft_algo_serves(algo, var, coll))

/* Builds d into a schedule that holds steps from before; expects want with
 * a message containing needle, and the schedule left empty. */
static void expect_refused(struct weft_coll_desc d, weft_status_t want, const char *needle)
{
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc ok = { WEFT_COLL_ALLREDUCE, 0, 2, 0, 4, 1, WEFT_ALGO_RING, 0, 0, NULL,
                                 0 };
    cr_assert(weft_sched_build(&ok, &s) == WEFT_OK && s.nsteps > 0);
    s.scratch_count = 1;
    weft_status_t st = weft_sched_build(&d, &s);
    cr_assert(st == want, "%s/%d %s: %s (%s)", weft_algo_name(d.algo), d.variant,
              weft_coll_name(d.coll), weft_status_string(st), weft_last_error(NULL));
    cr_assert(strstr(weft_last_error(NULL), needle), "%s/%d %s: wanted '%s' in '%s'",
              weft_algo_name(d.algo), d.variant, weft_coll_name(d.coll), needle,
              weft_last_error(NULL));
    cr_assert(s.nsteps == 0 && s.scratch_count == 0);
    weft_sched_free(&s);
}

/* Checked once for every family, before its builder runs. */
Test(schedule, bad_descriptions)
{
    setenv("WEFT_DEBUG", "NONE", 1); /* every refusal would log */
    struct {
        int coll, rank, p, root;
        size_t count, chunk;
        const char *needle;
    } c[] = {
        { WEFT_COLL_ALLREDUCE, 0, 0, 0, 4, 1, "rank 0 of 0 ranks" },
        { WEFT_COLL_ALLGATHER, -1, 4, 0, 4, 1, "rank -1 of 4 ranks" },
        { WEFT_COLL_REDUCE, 4, 4, 0, 4, 1, "rank 4 of 4 ranks" },
        { WEFT_COLL_BROADCAST, 0, 4, 4, 4, 1, "broadcast: root 4 is outside [0, 4)" },
        { WEFT_COLL_REDUCE, 0, 4, -1, 4, 1, "reduce: root -1 is outside [0, 4)" },
        { WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 0, "allreduce: chunk is 0 elements" },
        { WEFT_COLL_REDUCE, 0, 4, 0, 4, 0, "reduce: chunk is 0 elements" },
        { WEFT_COLL_ALLGATHER, 0, 4, 0, SIZE_MAX / 2, 1, "times 4 ranks overflows size_t" },
        { WEFT_COLL_REDUCE_SCATTER, 0, 3, 0, SIZE_MAX / 2, 1, "times 3 ranks overflows size_t" },
    };
    size_t tried = 0;
    for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++)
        FOR_EACH_SERVING(algo, var, c[i].coll) {
            struct weft_coll_desc d = { c[i].coll, c[i].rank, c[i].p, c[i].root, c[i].count,
                                        c[i].chunk, algo, var, 0, NULL, 0 };
            expect_refused(d, WEFT_ERR_INVALID_ARG, c[i].needle);
            tried++;
        }
    cr_assert(tried >= sizeof(c) / sizeof(c[0]) * 2);
    /* A root does not matter where there is none. */
    for (int coll = 0; coll < WEFT_COLL_COUNT; coll++)
        FOR_EACH_SERVING(algo, var, coll) {
            if (weft_coll_rooted(coll))
                continue;
            struct weft_schedule s;
            weft_sched_init(&s);
            struct weft_coll_desc d = { coll, 0, 4, 77, 4, 1, algo, var, 0, NULL, 0 };
            cr_assert(weft_sched_build(&d, &s) == WEFT_OK && s.nsteps > 0, "%s/%d %s",
                      weft_algo_name(algo), var, weft_coll_name(coll));
            weft_sched_free(&s);
        }
    struct weft_schedule s;
    weft_sched_init(&s);
    struct weft_coll_desc d = { WEFT_COLL_ALLREDUCE, 0, 4, 0, 4, 1, WEFT_ALGO_RING, 0, 0, NULL, 0 };
    cr_assert(weft_sched_build(NULL, &s) == WEFT_ERR_INVALID_ARG);
    cr_assert(weft_sched_build(&d, NULL) == WEFT_ERR_INVALID_ARG);
    weft_sched_free(&s);
}

/* Anything the registry does not say a plan serves is refused as
 * unsupported, however else the description is wrong; unknown families,
 * variants and collectives included. */
Test(schedule, unsupported)
{
    setenv("WEFT_DEBUG", "NONE", 1);
    for (int algo = -1; algo <= WEFT_ALGO_COUNT; algo++)
        for (int var = -1; var <= WEFT_VAR_COUNT; var++)
            for (int coll = -1; coll <= WEFT_COLL_COUNT; coll++) {
                if (weft_algo_serves(algo, var, coll))
                    continue;
                struct weft_coll_desc d = { coll, 0, 0, 9, 4, 0, algo, var, 0, NULL, 0 };
                expect_refused(d, WEFT_ERR_UNSUPPORTED, "builds no");
            }
    struct weft_coll_desc d = { 99, 0, 4, 0, 4, 1, 77, 0, 0, NULL, 0 };
    expect_refused(d, WEFT_ERR_UNSUPPORTED, "schedule: unknown (variant 0) builds no unknown");
    d = (struct weft_coll_desc){ WEFT_COLL_BROADCAST, 0, 4, 0, 4, 1, WEFT_ALGO_RHD,
                                 WEFT_VAR_RHD_DOUBLING, 0, NULL, 0 };
    expect_refused(d, WEFT_ERR_UNSUPPORTED, "schedule: rhd (variant 1) builds no broadcast");
}

/* ---- the checker catches broken schedules ----------------------------------------- */

/* One way to break a correct schedule set: the plan's schedules of a call,
 * then mutate; needle: what the checker must say (NULL: the change is
 * harmless and must pass). */
struct breakage {
    int plan, coll, p, root;
    size_t count, chunk;
    void (*mutate)(struct weft_schedule *sch, int p);
    const char *needle;
};

/* Expects the checker to catch every breakage of b[0..n). */
static void expect_caught(const struct breakage *b, size_t n)
{
    int slots = engine_slots();
    for (size_t i = 0; i < n; i++) {
        struct weft_schedule *sch = calloc((size_t)b[i].p, sizeof(*sch));
        char err[700] = "";
        cr_assert(sch);
        build_all(b[i].plan, b[i].coll, b[i].p, b[i].root, b[i].count, b[i].chunk, sch);
        cr_assert(verify(b[i].plan, b[i].coll, b[i].p, b[i].root, b[i].count, sch, slots, err,
                         sizeof(err)),
                  "case %zu baseline: %s", i, err);
        b[i].mutate(sch, b[i].p);
        bool ok = verify(b[i].plan, b[i].coll, b[i].p, b[i].root, b[i].count, sch, slots, err,
                         sizeof(err));
        free_all(b[i].p, sch);
        free(sch);
        if (b[i].needle == NULL) {
            cr_assert(ok, "case %zu: a harmless change was rejected: %s", i, err);
            continue;
        }
        cr_assert(!ok, "case %zu: the checker missed: %s", i, b[i].needle);
        cr_assert(strstr(err, b[i].needle), "case %zu: wanted '%s', got: %s", i, b[i].needle,
                  err);
    }
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

Test(checker, rank_set_key_sums)
{
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

/* ---- every breakage, caught ------------------------------------------------------- */

Test(checker, catches_broken_schedules)
{
    const int ring = PLAN(WEFT_ALGO_RING, 0), rd = PLAN_RD, rhd = PLAN_RHD, dbt = PLAN_DBT;
    const int ar = WEFT_COLL_ALLREDUCE, rs = WEFT_COLL_REDUCE_SCATTER, ag = WEFT_COLL_ALLGATHER;
    const int bc = WEFT_COLL_BROADCAST, red = WEFT_COLL_REDUCE;
    const struct breakage b[] = {
        { ring, ar, 4, 0, 40, 3, drop_final, "lacks FINAL" },
        { ring, ar, 4, 0, 40, 3, final_everywhere, "FINAL on a partial" },
        { ring, ar, 4, 0, 40, 100, drop_dep, "unordered" },
        { ring, ar, 4, 0, 40, 100, drop_recv_dep, "unordered" },
        { ring, ag, 4, 0, 10, 3, recv_reduce_allgather, "without reduction" },
        { ring, ar, 4, 0, 10, 3, recv_reduce_twice, "twice" },
        { ring, bc, 4, 0, 10, 3, swap_recv_dst, "position" },
        { ring, bc, 4, 0, 10, 3, reorder_sends, "position" },
        { ring, red, 4, 0, 10, 3, swap_reduce_src, "combines input positions" },
        { ring, red, 4, 0, 10, 3, swap_reduce_dst, "position" },
        { ring, ar, 3, 0, 30, 100, remove_last, "which receives" },
        { ring, ar, 2, 0, 2, 100, receive_first, "deadlock" },
        { ring, rs, 3, 0, 30, 100, write_sendbuf, "writes sendbuf" },
        { ring, ar, 3, 0, 30, 100, count_mismatch, "step 0 sends" },
        /* Past 64 ranks the rank set is a count and a key sum. */
        { ring, ar, 100, 0, 1000, 1 << 20, drop_input_80,
          "FINAL on a partial result (ranks {99 contributions, ranks<64 0xffffffffffffffff" },
        { ring, ar, 100, 0, 1000, 1 << 20, reduce_twice_80, "combines rank input twice" },
        /* Recursive doubling. */
        { rd, ar, 2, 0, 10, 3, rd_drop_recv_first, "same expression" },
        { rd, ar, 4, 0, 10, 3, rd_drop_recv_first, "same expression" },
        { rd, ar, 4, 0, 10, 3, rd_recv_first_both, "same expression" },
        { rd, ar, 8, 0, 10, 3, rd_drop_recv_first_last_round, "same expression" },
        { rd, ar, 6, 0, 10, 3, rd_drop_recv_first_last_round, "same expression" },
        { rd, ar, 5, 0, 10, 3, rd_fold_out_early, "unordered" },
        { rd, ar, 3, 0, 10, 100, rd_fold_out_input, "holds ranks 0x2" },
        { rd, ar, 6, 0, 10, 3, rd_drop_fold_out_recv, "which receives" },
        { rd, ar, 4, 0, 10, 3, rd_drop_final, "lacks FINAL" },
        { rd, ar, 4, 0, 10, 3, rd_final_early, "FINAL on a partial" },
        { rd, ar, 4, 0, 10, 3, rd_recv_first_on_send, "RECV_FIRST on a SEND" },
        { rd, ar, 2, 0, 2, 1, rd_half_received, "reduced 1 of 2 elements" },
        /* Changes that keep every rank's expression the same pass. */
        { rd, ar, 2, 0, 10, 3, rd_swap_convention, NULL },
        { rd, ar, 3, 0, 10, 3, rd_fold_in_order, NULL },
        /* rhd. */
        { rhd, ar, 4, 0, 10, 3, rhd_drop_final, "lacks FINAL" },
        { rhd, ar, 5, 0, 10, 3, rhd_fold_out_early, "unordered" },
        { rhd, ar, 3, 0, 10, 100, rhd_fold_out_input, "holds ranks 0x2" },
        { rhd, ag, 4, 0, 10, 100, rhd_gather_early, "unordered" },
        { rhd, rs, 3, 0, 10, 100, rhd_hand_back_early, "unordered" },
        { rhd, red, 4, 0, 40, 100, rhd_gather_overwrites, "unordered" },
        { rhd, bc, 4, 0, 40, 100, rhd_scatter_reorder, "position" },
        { rhd, ar, 4, 0, 10, 3, rhd_flip_order, NULL }, /* the same on every rank */
        /* The double binary tree. */
        { dbt, ar, 5, 0, 10, 2, dbt_drop_final, "lacks FINAL" },
        { dbt, ar, 5, 0, 10, 2, dbt_recv_down_early, "unordered" },
        { dbt, ar, 7, 0, 10, 2, dbt_send_up_early, "unordered" },
        { dbt, ar, 6, 0, 10, 100, dbt_swap_halves, "combines input positions" },
        { dbt, red, 2, 1, 10, 100, dbt_root_order, "position" },
    };
    expect_caught(b, WEFT_ARRAY_SIZE(b));
}
