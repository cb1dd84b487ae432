/*
 * test_tune.c - selection: WEFT_ALGO's syntax (NCCL_ALGO's, per collective,
 * variants), plan names, size classes, and what weft_tune_select picks on
 * link tables whose answer is known.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "algorithms/schedule.h"
#include "comm.h"
#include "select/topo.h"
#include "select/tune.h"

/* The built-in transports' link kinds, found by name as any caller would. */
#define SHM weft_transport_find("shm")
#define TCP weft_transport_find("tcp")

#define ALL WEFT_PLAN_ALL
#define FAM(a) WEFT_PLAN_FAMILY(WEFT_ALGO_##a)

static void expect_masks(const char *spec, const unsigned want[WEFT_COLL_COUNT])
{
    unsigned got[WEFT_COLL_COUNT];
    weft_status_t st = weft_tune_parse_algo(spec, got);
    cr_assert_eq(st, WEFT_OK, "'%s': %s", spec, weft_thread_last_error());
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        cr_expect_eq(got[c], want[c], "'%s' %s: 0x%x, want 0x%x", spec, weft_coll_name(c), got[c],
                     want[c]);
}

static void expect_same(const char *spec, unsigned mask)
{
    unsigned want[WEFT_COLL_COUNT];
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        want[c] = mask;
    expect_masks(spec, want);
}

Test(parse, lists_apply_to_every_collective)
{
    expect_same("", ALL);
    expect_same("ring", FAM(RING));
    expect_same("Ring,TREE", FAM(RING) | FAM(TREE));
    expect_same("^tree", ALL & ~FAM(TREE));
    expect_same("^rhd,tree,direct,hier", FAM(RING));
    expect_same("rhd/doubling", WEFT_PLAN_BIT(WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING));
    expect_same("tree/binomial,hier/rhd",
                WEFT_PLAN_BIT(WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL) |
                    WEFT_PLAN_BIT(WEFT_ALGO_HIER, WEFT_VAR_HIER_RHD));
    expect_same("^rhd/rabenseifner", ALL & ~WEFT_PLAN_BIT(WEFT_ALGO_RHD, 0));
    expect_same("ring,,ring,", FAM(RING));
}

Test(parse, per_collective_entries)
{
    unsigned want[WEFT_COLL_COUNT];
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        want[c] = ALL;
    want[WEFT_COLL_ALLREDUCE] = FAM(RHD);
    want[WEFT_COLL_ALLGATHER] = FAM(RING);
    expect_masks("allreduce:rhd;allgather:ring", want);
    /* A later entry overrides an earlier one; a plain list sets all. */
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        want[c] = FAM(TREE);
    want[WEFT_COLL_BROADCAST] = FAM(DIRECT) | FAM(RING);
    expect_masks("tree;broadcast:direct,ring", want);
    want[WEFT_COLL_BROADCAST] = FAM(TREE);
    want[WEFT_COLL_REDUCE_SCATTER] = ALL & ~FAM(HIER);
    expect_masks("broadcast:ring;tree;ReduceScatter:^hier;", want);
}

static void expect_refused(const char *spec, const char *needle)
{
    unsigned m[WEFT_COLL_COUNT];
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        m[c] = 0x5a;
    cr_assert_eq(weft_tune_parse_algo(spec, m), WEFT_ERR_INVALID_ARG, "'%s' parsed", spec);
    const char *msg = weft_thread_last_error();
    cr_expect(strstr(msg, needle) != NULL, "'%s': message '%s' lacks '%s'", spec, msg, needle);
    cr_expect(strncmp(msg, "WEFT_ALGO=", 10) == 0, "'%s': '%s'", spec, msg);
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        cr_expect_eq(m[c], 0x5au, "'%s' changed the masks", spec);
}

Test(parse, refusals_name_what_is_wrong)
{
    expect_refused("nvls", "unknown algorithm 'nvls'");
    expect_refused("ring,rd", "unknown algorithm 'rd'");
    expect_refused("rhd/fast", "unknown algorithm 'rhd/fast'");
    expect_refused("ring/doubling", "unknown algorithm 'ring/doubling'");
    expect_refused("alltoall:ring", "unknown collective 'alltoall'");
    expect_refused("^ring,tree,rhd,direct,hier", "leaves no algorithm");
    expect_refused("allreduce:ring;broadcast:^ring,tree,rhd,direct,hier", "leaves no algorithm");
    expect_refused(":ring", "unknown collective ''");
}

Test(names, plans_print_as_they_parse)
{
    char b[32];
    struct weft_plan pls[] = {
        {WEFT_ALGO_RING, 0}, {WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING},
        {WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL}, {WEFT_ALGO_HIER, WEFT_VAR_HIER_RHD},
        {WEFT_ALGO_DIRECT, 0}, {WEFT_ALGO_RHD, WEFT_VAR_RHD_RABENSEIFNER},
    };
    const char *want[] = {"ring", "rhd/doubling", "tree/binomial", "hier/rhd", "direct",
                          "rhd/rabenseifner"};
    for (size_t i = 0; i < sizeof(pls) / sizeof(pls[0]); i++) {
        cr_expect_str_eq(weft_plan_name(pls[i], b, sizeof(b)), want[i]);
        unsigned m[WEFT_COLL_COUNT];
        cr_assert_eq(weft_tune_parse_algo(b, m), WEFT_OK, "%s", b);
        /* A family without variant names stands for the whole family. */
        bool whole = strchr(b, '/') == NULL;
        cr_expect_eq(m[0], whole ? WEFT_PLAN_FAMILY(pls[i].algo)
                              : WEFT_PLAN_BIT(pls[i].algo, pls[i].variant), "%s", b);
    }
    cr_expect_eq(weft_tune_coll_from_name("ReduceScatter", 13), WEFT_COLL_REDUCE_SCATTER);
    cr_expect_eq(weft_tune_coll_from_name("reduce", 6), WEFT_COLL_REDUCE);
    cr_expect_eq(weft_tune_coll_from_name("reduc", 5), -1);
}

Test(classes, two_per_octave_and_monotonic)
{
    cr_expect_eq(weft_tune_class(0), 0);
    cr_expect_eq(weft_tune_class_bytes(0), 0u);
    int prev = 0;
    for (size_t b = 1; b < ((size_t)1 << 40); b = b * 5 / 4 + 1) {
        int c = weft_tune_class(b);
        cr_assert(c >= prev && c < WEFT_TUNE_CLASSES, "%zu -> %d after %d", b, c, prev);
        size_t rep = weft_tune_class_bytes(c);
        /* The representative lies within the class, at its low end. */
        cr_assert(rep <= b && weft_tune_class(rep) == c, "%zu -> class %d -> %zu", b, c, rep);
        cr_assert(b < 2 * rep, "%zu is more than an octave above %zu", b, rep);
        prev = c;
    }
    cr_expect_eq(weft_tune_class(SIZE_MAX), WEFT_TUNE_CLASSES - 1);
}

/* ---- the ranking ---------------------------------------------------------------- */

#define NPLANS (WEFT_ALGO_COUNT * WEFT_VAR_COUNT)

/* weft_tune_ranked's plans for coll on n ranks placed on hosts (NULL: one
 * host), as names joined by spaces into out; how many. */
static int ranking(int n, const char *const *hosts, unsigned mask, int coll, size_t bytes,
                   char *out, size_t len)
{
    struct weft_link_table tab;
    char err[256];
    cr_assert_eq(weft_topo_table_init(&tab, n, hosts, 1u << SHM | 1u << TCP,
                                      err, sizeof(err)),
                 WEFT_OK, "%s", err);
    struct weft_tune_in in = {.nranks = n, .links = &tab, .chunk_bytes = 512 * 1024,
                              .gamma = WEFT_TUNE_GAMMA, .mask = mask};
    struct weft_plan plans[NPLANS];
    double secs[NPLANS];
    bool fell_back;
    int k = weft_tune_ranked(&in, coll, bytes, 4, plans, secs, NULL, &fell_back);
    cr_expect(!fell_back);
    size_t o = 0;
    out[0] = 0;
    for (int i = 0; i < k && o < len; i++) {
        char name[32];
        o += (size_t)snprintf(out + o, len - o, " %s", weft_plan_name(plans[i], name, sizeof(name)));
        cr_expect(i == 0 || secs[i] >= secs[i - 1], "%s ranked after a slower plan", name);
    }
    weft_topo_table_fini(&tab);
    return k;
}

static bool lists(const char *names, const char *plan)
{
    char want[40];
    snprintf(want, sizeof(want), " %s", plan);
    size_t l = strlen(want);
    for (const char *p = strstr(names, want); p; p = strstr(p + 1, want))
        if (p[l] == 0 || p[l] == ' ')
            return true;
    return false;
}

Test(ranked, a_plan_that_runs_the_same_messages_as_another_is_ranked_once)
{
    char got[256];
    /* One node: both hierarchical broadcasts are its intra-node ring. */
    int k = ranking(4, NULL, ALL, WEFT_COLL_BROADCAST, 32768, got, sizeof(got));
    cr_expect_eq(k, 6, "one node:%s", got);
    cr_expect(lists(got, "hier/ring") && !lists(got, "hier/rhd"), "one node:%s", got);
    const char *plans[] = {"ring", "tree/double", "tree/binomial", "rhd/rabenseifner", "direct"};
    for (size_t i = 0; i < sizeof(plans) / sizeof(plans[0]); i++)
        cr_expect(lists(got, plans[i]), "one node: %s missing from%s", plans[i], got);
    /* Allowed alone, a twin is still the plan. */
    k = ranking(4, NULL, WEFT_PLAN_BIT(WEFT_ALGO_HIER, WEFT_VAR_HIER_RHD), WEFT_COLL_BROADCAST,
                32768, got, sizeof(got));
    cr_expect(k == 1 && lists(got, "hier/rhd"), "hier/rhd alone:%s", got);
    /* One rank a node: the hierarchical ring reduce is the flat ring. */
    const char *each[] = {"h0", "h1", "h2", "h3"};
    k = ranking(4, each, ALL, WEFT_COLL_REDUCE, 512, got, sizeof(got));
    cr_expect(lists(got, "ring") && !lists(got, "hier/ring"), "4 x 1:%s", got);
    /* Two nodes of two: the hierarchical ring reduce (1 -> 0 and 3 -> 2
     * in the nodes, 2 -> 0 between them) is the binomial tree; the
     * allreduce between the heads of hier/rhd is a plan of its own. */
    const char *two[] = {"a", "a", "b", "b"};
    k = ranking(4, two, ALL, WEFT_COLL_REDUCE, 512, got, sizeof(got));
    cr_expect(k == 6 && lists(got, "tree/binomial") && !lists(got, "hier/ring") &&
                  lists(got, "hier/rhd"),
              "2 x 2:%s", got);
}

/* ---- measured selection: the verdict ------------------------------------------- */

/* WEFT_TUNE_TRIALS -1: runs of about 3 ms by the model (8 to 80 calls), as
 * many rounds (up to 3) as runs of 8 of every candidate fit in 40 ms. */
Test(decide, runs_last_about_3_ms)
{
    static const struct {
        int ncand;
        double secs;
        int64_t reps, rounds;
    } cases[] = {
        {6, 10e-6, 240, 3},  /* 300 calls to 3 ms: runs of 80 */
        {6, 50e-6, 180, 3},  /* runs of 60; 8 of 6 candidates, 2.4 ms a round */
        {6, 160e-6, 57, 3},  /* runs of 19 (18.75 to 3 ms); 7.7 ms of 8 a round */
        {2, 100e-6, 90, 3},  /* runs of 30 */
        {4, 125e-6, 72, 3},  /* runs of 24 */
        {6, 400e-6, 16, 2},  /* runs of 8 (7.5 to 3 ms); 19.2 ms a round */
        {6, 600e-6, 8, 1},   /* 28.8 ms a round: one */
        {6, 5e-3, 8, 1},     /* a round over budget still runs once, 8 calls */
        {6, 1e-300, 240, 3}, /* no overflow on a degenerate prediction */
    };
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(cases); i++) {
        int64_t reps = -1, rounds = -1;
        weft_tune_shape(cases[i].ncand, cases[i].secs, &reps, &rounds);
        cr_expect(reps == cases[i].reps && rounds == cases[i].rounds,
                  "%d candidates of %g s: %lld calls in %lld rounds, expected %lld in %lld",
                  cases[i].ncand, cases[i].secs, (long long)reps, (long long)rounds,
                  (long long)cases[i].reps, (long long)cases[i].rounds);
    }
}

static struct weft_tune_measure three_by_three(void)
{
    struct weft_tune_measure m = {.ncand = 3, .reps = 3, .rounds = 1};
    for (int c = 0; c < 3; c++)
        m.cand[c] = (struct weft_plan){c, 0};
    return m;
}

Test(decide, trials_take_turns_in_rounds)
{
    struct weft_tune_measure m = {.ncand = 3, .reps = 6, .rounds = 2};
    const int want[18] = {0, 0, 0, 1, 1, 1, 2, 2, 2, 0, 0, 0, 1, 1, 1, 2, 2, 2};
    for (int i = 0; i < 18; i++)
        cr_expect_eq(weft_tune_trial_cand(&m, i), want[i], "trial %d", i);
}

Test(decide, slowest_rank_of_each_round_then_the_median_round)
{
    struct weft_tune_measure m = {.ncand = 2, .reps = 6, .rounds = 2};
    /* Two ranks; round 0 ran candidate 0 as calls 0-2 and candidate 1 as
     * 3-5, round 1 as 6-8 and 9-11.  A run's first call does not count,
     * however slow (90, 50) or fast (1).  Means of the rest: rank 0 c0
     * {11, 10}, c1 {9, 8}; rank 1 c0 {10, 11}, c1 {10, 9}.  Per round the
     * slower rank: c0 {11, 11}, c1 {10, 9}; the median round: c0 11, c1
     * 9.5, although rank 0's own numbers would have favoured c1 more and
     * rank 1's c0 in round 0. */
    const double all[2][12] = {{90, 10, 12, 90, 9, 9, 1, 10, 10, 1, 8, 8},
                               {50, 10, 10, 50, 10, 10, 1, 10, 12, 1, 9, 9}};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, &all[0][0], 2, per), 1);
    cr_expect_float_eq(per[0], 11.0, 1e-12);
    cr_expect_float_eq(per[1], 9.5, 1e-12);
    /* Every rank computes the same from the same rows. */
    for (int i = 0; i < 5; i++)
        cr_expect_eq(weft_tune_decide(&m, &all[0][0], 2, NULL), 1);
}

Test(decide, the_first_call_of_a_rooted_run_counts)
{
    /* Ranks sharing a core: during the root's first call of candidate 0
     * the others ran their whole run, and its later calls found their data
     * waiting (5 a call).  The run took 20 a call, as a loop does, more
     * than candidate 1's 12. */
    struct weft_tune_measure m = {.coll = WEFT_COLL_REDUCE, .ncand = 2, .reps = 4, .rounds = 1};
    const double all[8] = {65, 5, 5, 5, 12, 12, 12, 12};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 1);
    cr_expect_float_eq(per[0], 20.0, 1e-12);
    m.coll = WEFT_COLL_BROADCAST;
    cr_expect_eq(weft_tune_decide(&m, all, 1, NULL), 1);
    /* No rank of an allgather gets a call ahead of another: the first call
     * carries the barrier's skew and the fill, and is left out. */
    m.coll = WEFT_COLL_ALLGATHER;
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 0);
    cr_expect_float_eq(per[0], 5.0, 1e-12);
}

Test(decide, a_stray_call_of_another_class_charges_no_second_fill)
{
    /* The program called something else before candidate 0's last call
     * (stored negated): the run's pipeline drained and filled again (13,
     * as at the run's start).  The stretch before the cut stands: 37 / 7,
     * less than candidate 1's 45 / 8, as their loops are. */
    struct weft_tune_measure m = {.coll = WEFT_COLL_BROADCAST, .ncand = 2, .reps = 8,
                                  .rounds = 1};
    const double all[16] = {13, 4, 4, 4, 4, 4, 4, -13, 10, 5, 5, 5, 5, 5, 5, 5};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 0);
    cr_expect_float_eq(per[0], 37.0 / 7, 1e-12);
    cr_expect_float_eq(per[1], 45.0 / 8, 1e-12);
    /* Cut in the middle, an allgather's stretch drops its first call too;
     * of two as long, the first stands. */
    m.coll = WEFT_COLL_ALLGATHER;
    m.reps = 6;
    const double mid[12] = {50, 5, 5, -40, 7, 7, 50, 6, 6, 6, 6, 6};
    cr_expect_eq(weft_tune_decide(&m, mid, 1, per), 0);
    cr_expect_float_eq(per[0], 5.0, 1e-12);
    cr_expect_float_eq(per[1], 6.0, 1e-12);
}

Test(decide, a_pause_on_one_rank_cuts_the_run_on_all)
{
    /* Rank 0, the root, paused before candidate 0's last call (its time
     * negated); rank 1 paid for it in that call (13), a fresh fill.  The
     * cut holds on rank 1 too: 37 / 7 against candidate 1's 45 / 8. */
    struct weft_tune_measure m = {.coll = WEFT_COLL_BROADCAST, .ncand = 2, .reps = 8,
                                  .rounds = 1};
    const double all[2][16] = {{1, 1, 1, 1, 1, 1, 1, -1, 1, 1, 1, 1, 1, 1, 1, 1},
                               {13, 4, 4, 4, 4, 4, 4, 13, 10, 5, 5, 5, 5, 5, 5, 5}};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, &all[0][0], 2, per), 0);
    cr_expect_float_eq(per[0], 37.0 / 7, 1e-12);
    cr_expect_float_eq(per[1], 45.0 / 8, 1e-12);
}

Test(decide, calls_cut_all_along_count_whole)
{
    /* Every call of the runs followed another class's (the program
     * alternates them): no stretch holds half a run, and the whole run
     * counts, but for its first call. */
    struct weft_tune_measure m = {.coll = WEFT_COLL_ALLREDUCE, .ncand = 2, .reps = 4,
                                  .rounds = 1};
    const double all[8] = {9, -6, -6, -6, 9, -7, -7, -7};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 0);
    cr_expect_float_eq(per[0], 6.0, 1e-12);
    cr_expect_float_eq(per[1], 7.0, 1e-12);
}

Test(decide, a_wait_in_every_round_counts)
{
    /* Candidate 0's calls are 5 but every few waits 50 for a descheduled
     * peer: a loop of it pays 20 a call, more than candidate 1's 12. */
    struct weft_tune_measure m = {.ncand = 2, .reps = 8, .rounds = 2};
    const double all[16] = {0, 5, 5, 50, 0, 12, 12, 12, 0, 5, 50, 5, 0, 12, 12, 12};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 1);
    cr_expect_float_eq(per[0], 20.0, 1e-12);
    cr_expect_float_eq(per[1], 12.0, 1e-12);
}

Test(decide, ties_go_to_the_better_prediction)
{
    struct weft_tune_measure m = three_by_three();
    const double all[9] = {5, 5, 5, 5, 5, 5, 5, 5, 5};
    cr_expect_eq(weft_tune_decide(&m, all, 1, NULL), 0);
    const double later[9] = {6, 6, 6, 5, 5, 5, 5, 5, 5}; /* c1 and c2 tie: c1 */
    cr_expect_eq(weft_tune_decide(&m, later, 1, NULL), 1);
}

Test(decide, one_preempted_call_does_not_decide)
{
    struct weft_tune_measure m = {.ncand = 2, .reps = 9, .rounds = 3};
    /* Candidate 0 is faster but one of its calls was preempted (500). */
    const double all[18] = {9, 5, 500, 9, 6, 6, 9, 5, 5, 9, 6, 6, 9, 5, 5, 9, 6, 6};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 0);
    cr_expect_float_eq(per[0], 5.0, 1e-12);
    cr_expect_float_eq(per[1], 6.0, 1e-12);
}

Test(decide, no_candidate_is_faster_than_its_floor)
{
    /* Candidate 0's run went through in a burst (5 a call), but its busiest
     * port needs 20 a call in a loop; candidate 1's 12 is above its 8. */
    struct weft_tune_measure m = {.ncand = 2, .reps = 4, .rounds = 2, .floor = {20, 8}};
    const double all[8] = {9, 5, 9, 12, 9, 5, 9, 12};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 1);
    cr_expect_float_eq(per[0], 20.0, 1e-12);
    cr_expect_float_eq(per[1], 12.0, 1e-12);
    m.floor[0] = 0; /* no floor: the burst stands */
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 0);
}

Test(decide, one_call_a_candidate_counts_that_call)
{
    struct weft_tune_measure m = {.ncand = 2, .reps = 1, .rounds = 1};
    const double all[2] = {7, 6};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 1);
    cr_expect_float_eq(per[0], 7.0, 1e-12);
}

Test(decide, times_that_are_not_finite_are_left_out)
{
    struct weft_tune_measure m = three_by_three();
    const double all[9] = {1, NAN, 9, 1, 7, INFINITY, 1, 8, 8};
    double per[WEFT_TUNE_MAX_CANDS];
    cr_expect_eq(weft_tune_decide(&m, all, 1, per), 1);
    cr_expect_float_eq(per[0], 9.0, 1e-12);
    cr_expect_float_eq(per[1], 7.0, 1e-12);
    cr_expect_float_eq(per[2], 8.0, 1e-12);
    const double none[9] = {NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN, NAN};
    cr_expect_eq(weft_tune_decide(&m, none, 1, NULL), 0);
}
