/*
 * test_sim.c - the schedule simulator (select/sim.c) against the
 * textbook costs of Thakur, Rabenseifner & Gropp 2005, its pipelining and
 * two-level behaviour, its errors, and the weft-sim tool.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "algorithms/schedule.h"
#include "select/sim.h"
#include "select/topo.h"
#include "testcommon.h"
#include "testutil.h"

/* The built-in transports' link kinds, found by name as any caller would. */
#define SHM weft_transport_find("shm")
#define TCP weft_transport_find("tcp")

/* A uniform network: every link costs the same. */
struct uniform {
    double alpha, beta;
};

static void uniform_link(const void *ctx, int i, int j, double *alpha, double *beta)
{
    (void)i;
    (void)j;
    const struct uniform *u = ctx;
    *alpha = u->alpha;
    *beta = u->beta;
}

/* Awkward values, so that a formula matching by accident is unlikely. */
static const struct uniform U = {.alpha = 3.7e-6, .beta = 1 / 2.9e9};
static const double GAMMA = 1 / 7.3e9;
#define ESIZE 4

static struct weft_sim_model uniform_model(void)
{
    return (struct weft_sim_model){
        .link = uniform_link, .ctx = &U, .gamma = GAMMA, .copy = 0, .esize = ESIZE};
}

static double sim(const struct weft_sim_model *m, int algo, int var, int coll, int p,
                  size_t count, size_t chunk)
{
    struct weft_coll_desc d = {
        .coll = coll, .rank = 0, .nranks = p, .root = 0, .count = count,
        .chunk = chunk, .algo = algo, .variant = var,
    };
    double t = -1;
    weft_status_t st = weft_sim_predict(&d, m, &t);
    cr_assert_eq(st, WEFT_OK, "%s/%d %s p=%d count=%zu: status %d", weft_algo_name(algo), var,
                 weft_coll_name(coll), p, count, st);
    return t;
}

static void expect(double got, double want, const char *what, int p, size_t n)
{
    cr_expect(fabs(got - want) <= 1e-9 * want, "%s p=%d n=%zu B: simulated %.12g s, formula %.12g s",
              what, p, n, got, want);
}

static double lg(int p)
{
    double l = 0;
    while ((1 << (int)l) < p)
        l++;
    return l; /* ceil(log2 p) */
}

/* Rank counts and per-block element counts of the formula tests. */
static const int ps[] = {2, 3, 4, 5, 7, 8, 12, 16, 33, 64};
static const size_t blocks[] = {1, 7, 1000, 65536};
#define NPS (sizeof(ps) / sizeof(ps[0]))
#define NBLOCKS (sizeof(blocks) / sizeof(blocks[0]))

static struct weft_sim_result run_one(const struct weft_sim_model *m, int algo, int var,
                                      int coll, int p, size_t count, size_t chunk)
{
    struct weft_coll_desc d = {
        .coll = coll, .rank = 0, .nranks = p, .root = 0, .count = count,
        .chunk = chunk, .algo = algo, .variant = var,
    };
    struct weft_sim_result r = {.seconds = -1, .port_seconds = -1};
    cr_assert_eq(weft_sim_run(&d, m, &r), WEFT_OK);
    return r;
}

Test(sim, the_busiest_port_bounds_a_loop)
{
    /* A reduce of n bytes: direct lands p - 1 messages on the root's
     * receive port, a binomial tree ceil(log2 p), a ring one on each port
     * (however many chunks); alpha is latency, not load. */
    struct weft_sim_model m = uniform_model();
    const size_t count = 10007, n = count * ESIZE;
    for (int p = 2; p <= 9; p++) {
        struct weft_sim_result r =
            run_one(&m, WEFT_ALGO_DIRECT, 0, WEFT_COLL_REDUCE, p, count, count);
        expect(r.port_seconds, (p - 1) * n * U.beta, "direct reduce's root port", p, n);
        cr_expect_gt(r.seconds, r.port_seconds);
        r = run_one(&m, WEFT_ALGO_TREE, 1, WEFT_COLL_REDUCE, p, count, count);
        expect(r.port_seconds, lg(p) * n * U.beta, "binomial reduce's root port", p, n);
        r = run_one(&m, WEFT_ALGO_RING, 0, WEFT_COLL_REDUCE, p, count, 1000);
        expect(r.port_seconds, n * U.beta, "ring reduce's busiest port", p, n);
    }
    struct weft_coll_desc d = {.coll = WEFT_COLL_REDUCE, .nranks = 2, .count = 1, .chunk = 1};
    cr_expect_eq(weft_sim_run(&d, &m, NULL), WEFT_ERR_INVALID_ARG);
}

Test(sim, only_messages_between_machines_load_a_port)
{
    /* Direct reduce on 2 machines of 2: the root's receive port carries
     * the other machine's two messages; its neighbour's arrives by a core's
     * copy, as on one machine, where no port carries anything. */
    struct weft_sim_model m = uniform_model();
    const size_t count = 10007, n = count * ESIZE;
    const int two[] = {0, 0, 1, 1}, one[] = {0, 0, 0, 0};
    m.host = two;
    struct weft_sim_result r = run_one(&m, WEFT_ALGO_DIRECT, 0, WEFT_COLL_REDUCE, 4, count, count);
    expect(r.port_seconds, 2 * n * U.beta, "direct reduce's root port, 2 machines", 4, n);
    m.host = one;
    struct weft_sim_result same = run_one(&m, WEFT_ALGO_DIRECT, 0, WEFT_COLL_REDUCE, 4, count, count);
    cr_expect_eq(same.port_seconds, 0.0);
    cr_expect_float_eq(same.seconds, r.seconds, 1e-12, "the host array changes no time");
}

/* The ring's allgather and reduce-scatter: p - 1 steps of one block each
 * way; gamma is what each byte costs to reduce (0 for allgather). */
static void expect_ring_blocks(int coll, double gamma, const char *what)
{
    struct weft_sim_model m = uniform_model();
    for (size_t i = 0; i < NPS; i++)
        for (size_t j = 0; j < NBLOCKS; j++) {
            int p = ps[i];
            size_t c = blocks[j];
            double n = (double)(c * (size_t)p * ESIZE); /* bytes gathered or reduced */
            double want = (p - 1) * U.alpha + (p - 1.0) / p * n * (U.beta + gamma);
            expect(sim(&m, WEFT_ALGO_RING, 0, coll, p, c, c), want, what, p, (size_t)n);
        }
}

Test(sim, ring_allgather_formula)
{
    expect_ring_blocks(WEFT_COLL_ALLGATHER, 0, "ring allgather");
}

Test(sim, ring_reduce_scatter_formula)
{
    expect_ring_blocks(WEFT_COLL_REDUCE_SCATTER, GAMMA, "ring reduce-scatter");
}

Test(sim, ring_allreduce_formula)
{
    struct weft_sim_model m = uniform_model();
    for (size_t i = 0; i < NPS; i++)
        for (size_t j = 0; j < NBLOCKS; j++) {
            int p = ps[i];
            size_t count = blocks[j] * (size_t)p; /* p equal blocks */
            double n = (double)(count * ESIZE);
            double want = 2 * (p - 1) * U.alpha + 2 * (p - 1.0) / p * n * U.beta +
                          (p - 1.0) / p * n * GAMMA;
            expect(sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_ALLREDUCE, p, count, count), want,
                   "ring allreduce", p, (size_t)n);
        }
}

Test(sim, recursive_doubling_allreduce_formula)
{
    struct weft_sim_model m = uniform_model();
    for (int p = 2; p <= 256; p *= 2)
        for (size_t j = 0; j < NBLOCKS; j++) {
            size_t count = blocks[j] * 3;
            double n = (double)(count * ESIZE);
            double want = lg(p) * (U.alpha + n * U.beta + n * GAMMA);
            expect(sim(&m, WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING, WEFT_COLL_ALLREDUCE, p, count,
                       count),
                   want, "recursive doubling allreduce", p, (size_t)n);
        }
}

Test(sim, binomial_broadcast_formula)
{
    struct weft_sim_model m = uniform_model();
    for (size_t i = 0; i < NPS; i++)
        for (size_t j = 0; j < NBLOCKS; j++) {
            int p = ps[i];
            size_t count = blocks[j] * 5;
            double n = (double)(count * ESIZE);
            double want = lg(p) * (U.alpha + n * U.beta);
            expect(sim(&m, WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, WEFT_COLL_BROADCAST, p, count,
                       count),
                   want, "binomial broadcast", p, (size_t)n);
        }
}

/* The rhd rows run once their builders exist (other branches add them). */
static void rhd_rows(int coll, const char *what)
{
    cr_assert(weft_algo_serves(WEFT_ALGO_RHD, WEFT_VAR_RHD_RABENSEIFNER, coll),
              "rhd builds no %s", what);
    struct weft_sim_model m = uniform_model();
    for (int p = 2; p <= 128; p *= 2)
        for (size_t j = 0; j < NBLOCKS; j++) {
            size_t c = blocks[j];
            size_t count = coll == WEFT_COLL_ALLREDUCE ? c * (size_t)p : c;
            double n = (double)(c * (size_t)p * ESIZE), f = (p - 1.0) / p, want;
            if (coll == WEFT_COLL_ALLREDUCE)
                want = 2 * lg(p) * U.alpha + 2 * f * n * U.beta + f * n * GAMMA;
            else if (coll == WEFT_COLL_REDUCE_SCATTER)
                want = lg(p) * U.alpha + f * n * (U.beta + GAMMA);
            else
                want = lg(p) * U.alpha + f * n * U.beta;
            size_t chunk = c * (size_t)p; /* every message in one piece */
            expect(sim(&m, WEFT_ALGO_RHD, WEFT_VAR_RHD_RABENSEIFNER, coll, p, count, chunk), want,
                   what, p, (size_t)n);
        }
}

Test(sim, rabenseifner_allreduce_formula)
{
    rhd_rows(WEFT_COLL_ALLREDUCE, "allreduce");
}

Test(sim, recursive_halving_reduce_scatter_formula)
{
    rhd_rows(WEFT_COLL_REDUCE_SCATTER, "reduce-scatter");
}

Test(sim, recursive_doubling_allgather_formula)
{
    rhd_rows(WEFT_COLL_ALLGATHER, "allgather");
}

/* A chain of p ranks carrying k chunks: the last chunk leaves the root
 * after k-1 others and then crosses p-1 links, one chunk-time each. */
Test(sim, ring_broadcast_pipelines)
{
    struct weft_sim_model m = uniform_model();
    static const int pk[][2] = {{2, 1}, {2, 9}, {5, 7}, {8, 3}, {16, 64}, {31, 2}};
    for (size_t i = 0; i < sizeof(pk) / sizeof(pk[0]); i++) {
        int p = pk[i][0], k = pk[i][1];
        size_t chunk = 1000, count = chunk * (size_t)k;
        double n = (double)(count * ESIZE);
        double want = (p - 1 + k - 1) * (U.alpha + n / k * U.beta);
        expect(sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_BROADCAST, p, count, chunk), want,
               "pipelined ring broadcast", p, (size_t)n);
        /* More chunks than one pay more latency but overlap the hops. */
        if (k > 1 && p > 2)
            cr_expect_lt(want, sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_BROADCAST, p, count, count),
                         "p=%d: %d chunks are not faster than one", p, k);
    }
}

/* A copy is charged to the rank's CPU: a lone rank pays for its copy. */
Test(sim, one_rank)
{
    struct weft_sim_model m = uniform_model();
    cr_expect_eq(sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_ALLREDUCE, 1, 1000, 1000), 0.0);
    m.copy = 1e-10;
    expect(sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_ALLREDUCE, 1, 1000, 1000), 1000 * ESIZE * 1e-10,
           "lone copy", 1, 1000 * ESIZE);
    expect(sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_ALLGATHER, 1, 1000, 64), 1000 * ESIZE * 1e-10,
           "lone allgather copy", 1, 1000 * ESIZE);
    cr_expect_eq(sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_BROADCAST, 1, 0, 64), 0.0);
}

/* Broadcast of 12 KiB in three 4 KiB chunks over 4 nodes of 4 ranks.  On
 * a uniform network the binomial tree (4 hops per chunk) beats the chain
 * of 16 ranks (15 hops).  Make the links between nodes 20 times slower
 * (10 us, 1 GB/s) and the chain wins: it crosses a node boundary 3 times
 * and each inter-node link carries a chunk once, while the tree's first
 * two hops both cross nodes and its root sends each chunk across nodes
 * twice, one after the other. */
Test(sim, two_level_ranks_ring_and_tree)
{
    struct weft_sim_cluster flat = {.ppn = 4, .intra_alpha = 0.5e-6, .intra_beta = 1e-10,
                                    .inter_alpha = 0.5e-6, .inter_beta = 1e-10};
    struct weft_sim_cluster slow = flat;
    slow.inter_alpha = 10e-6;
    slow.inter_beta = 1e-9;
    struct weft_sim_model m = uniform_model();
    size_t count = 3072, chunk = 1024;

    weft_sim_two_level(&m, &flat);
    double ring_flat = sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_BROADCAST, 16, count, chunk);
    double tree_flat =
        sim(&m, WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, WEFT_COLL_BROADCAST, 16, count, chunk);
    weft_sim_two_level(&m, &slow);
    double ring_slow = sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_BROADCAST, 16, count, chunk);
    double tree_slow =
        sim(&m, WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL, WEFT_COLL_BROADCAST, 16, count, chunk);

    cr_expect_lt(tree_flat, ring_flat, "uniform: tree %g s, ring %g s", tree_flat, ring_flat);
    cr_expect_lt(ring_slow, tree_slow, "slow inter: ring %g s, tree %g s", ring_slow, tree_slow);
    /* The uniform cluster is the uniform model. */
    struct uniform u = {0.5e-6, 1e-10};
    struct weft_sim_model um = uniform_model();
    um.ctx = &u;
    expect(sim(&um, WEFT_ALGO_RING, 0, WEFT_COLL_BROADCAST, 16, count, chunk), ring_flat,
           "two-level with equal levels", 16, count * ESIZE);
}

Test(sim, invalid_input)
{
    struct weft_sim_model m = uniform_model();
    struct weft_coll_desc d = {.coll = WEFT_COLL_ALLREDUCE, .nranks = 4, .count = 10, .chunk = 10};
    double t = 42;
    cr_expect_eq(weft_sim_predict(&d, NULL, &t), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_sim_predict(NULL, &m, &t), WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_sim_predict(&d, &m, NULL), WEFT_ERR_INVALID_ARG);
    d.nranks = 0;
    cr_expect_eq(weft_sim_predict(&d, &m, &t), WEFT_ERR_INVALID_ARG);
    d.nranks = -3;
    cr_expect_eq(weft_sim_predict(&d, &m, &t), WEFT_ERR_INVALID_ARG);
    d.nranks = 4;

    struct weft_sim_model bad = m;
    bad.link = NULL;
    cr_expect_eq(weft_sim_predict(&d, &bad, &t), WEFT_ERR_INVALID_ARG);
    bad = m;
    bad.esize = 0;
    cr_expect_eq(weft_sim_predict(&d, &bad, &t), WEFT_ERR_INVALID_ARG);
    bad = m;
    bad.gamma = -1;
    cr_expect_eq(weft_sim_predict(&d, &bad, &t), WEFT_ERR_INVALID_ARG);
    bad = m;
    bad.copy = NAN;
    cr_expect_eq(weft_sim_predict(&d, &bad, &t), WEFT_ERR_INVALID_ARG);
    /* A link cost the model cannot give (ppn 0) fails the run. */
    struct weft_sim_cluster cl = {.ppn = 0};
    bad = m;
    weft_sim_two_level(&bad, &cl);
    cr_expect_eq(weft_sim_predict(&d, &bad, &t), WEFT_ERR_INVALID_ARG);
    struct uniform neg = {.alpha = -1, .beta = 0};
    bad = m;
    bad.ctx = &neg;
    cr_expect_eq(weft_sim_predict(&d, &bad, &t), WEFT_ERR_INVALID_ARG);

    /* What the builder rejects comes back. */
    d.chunk = 0;
    cr_expect_eq(weft_sim_predict(&d, &m, &t), WEFT_ERR_INVALID_ARG);
    d.chunk = 10;
    d.algo = WEFT_ALGO_TREE;
    d.variant = WEFT_VAR_TREE_BINOMIAL; /* broadcast only */
    cr_expect_eq(weft_sim_predict(&d, &m, &t), WEFT_ERR_UNSUPPORTED);
    cr_expect_eq(t, 42, "a failed prediction changed *seconds");
}

/* p = 1024, ring allreduce with one chunk per block: 4 million steps. */
Test(sim, large_ring_is_fast, .timeout = 60)
{
    struct weft_sim_model m = uniform_model();
    int p = 1024;
    size_t count = (size_t)p * 256;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    double t = sim(&m, WEFT_ALGO_RING, 0, WEFT_COLL_ALLREDUCE, p, count, count);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double n = (double)(count * ESIZE);
    expect(t, 2 * (p - 1) * U.alpha + 2 * (p - 1.0) / p * n * U.beta + (p - 1.0) / p * n * GAMMA,
           "ring allreduce", p, (size_t)n);
    double secs = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) * 1e-9;
    cr_log_info("ring allreduce p=1024: simulated in %.3f s", secs);
}

/* ---- weft-sim ------------------------------------------------------------------- */

/* Runs ./weft-sim ARGS beside this binary; returns the exit code, out gets
 * stdout and stderr. */
static int weft_sim(const char *args, char *out, size_t outlen)
{
    char cmd[8192];
    int n = snprintf(cmd, sizeof(cmd), "cd %s && timeout -k 5 120 ./weft-sim %s 2>&1",
                     weft_test_bindir(), args);
    cr_assert(n > 0 && (size_t)n < sizeof(cmd), "the weft-sim command line is too long");
    return weft_test_shell(cmd, out, outlen);
}

Test(weft_sim, argument_errors)
{
    static const struct {
        const char *args, *flag;
    } cases[] = {
        {"", "-n"},
        {"-n 0", "-n"},
        {"-n x", "-n"},
        {"-n 8 --gbps 0", "--gbps"},
        {"-n 8 --gbps abc", "--gbps"},
        {"-n 8 --alpha-us -1", "--alpha-us"},
        {"-n 8 --inter-gbps=-2", "--inter-gbps"},
        {"-n 8 --reduce-gbps nan", "--reduce-gbps"},
        {"-n 8 -c allsum", "-c"},
        {"-n 8 -a ring,bogus", "-a"},
        {"-n 8 -a rhd/sideways", "-a"},
        {"-n 8 -b 1K -e 8", "-e"},
        {"-n 8 -f 1", "-f"},
        {"-n 8 --chunk 0", "--chunk"},
        {"-n 8 --dtype-bytes 3", "--dtype-bytes"},
        {"-n 8 --nodes 3", "--nodes"},
        {"-n 8 --nodes 4 --ppn 4", "--nodes"},
        {"-n 8 --frobnicate 1", "--frobnicate"},
        {"-n 8 --full --compare", "--compare"},
        {"-n 8 --max-steps x", "--max-steps"},
        {"-n 8 --max-build-s -1", "--max-build-s"},
        {"-n", "-n"},
    };
    char out[8192];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int rc = weft_sim(cases[i].args, out, sizeof(out));
        cr_expect_eq(rc, 2, "weft-sim %s: exit %d, output:\n%s", cases[i].args, rc, out);
        char want[64];
        snprintf(want, sizeof(want), "weft-sim: %s:", cases[i].flag);
        cr_expect(strstr(out, want), "weft-sim %s: no '%s' in:\n%s", cases[i].args, want, out);
    }
    cr_expect_eq(weft_sim("--help", out, sizeof(out)), 0);
    cr_expect(strstr(out, "usage: weft-sim"), "%s", out);
}

Test(weft_sim, allreduce_crossover_at_8_ranks)
{
    static char out[1 << 16];
    int rc = weft_sim("-n 8 -c allreduce -a ring,rhd/doubling", out, sizeof(out));
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    cr_expect(strstr(out, "# crossover allreduce: rhd/doubling -> ring at "),
              "no rhd/doubling -> ring crossover in:\n%s", out);
    /* The table has both columns and marks a fastest in each row. */
    cr_expect(strstr(out, "ring") && strstr(out, "rhd/doubling") && strstr(out, "*"), "%s", out);
    /* The crossover lies inside the table's range, between two rows. */
    const char *x = strstr(out, "rhd/doubling -> ring at ");
    cr_assert_not_null(x);
    double bytes = atof(x + strlen("rhd/doubling -> ring at "));
    cr_expect(bytes > 8 && bytes < 64 << 20, "crossover at %g B", bytes);
}

Test(weft_sim, every_collective_and_hier_nodes)
{
    static char out[1 << 17];
    int rc = weft_sim("--nodes 2 --ppn 3 -b 8 -e 1M", out, sizeof(out));
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    static const char *const names[] = {"allreduce", "reducescatter", "allgather", "broadcast",
                                        "reduce"};
    for (size_t i = 0; i < 5; i++) {
        char want[64];
        snprintf(want, sizeof(want), "# crossover %s: ", names[i]);
        cr_expect(strstr(out, want), "no crossover line for %s in:\n%s", names[i], out);
    }
    cr_expect(strstr(out, "6 ranks (2 nodes x 3)"), "%s", out);
}

/* The link-table model reads what the table says: two hosts, shm inside
 * and tcp between, give what the two-level cluster with those costs does. */
Test(sim, link_table_model)
{
    const char *hosts[8] = {"a", "a", "a", "a", "b", "b", "b", "b"};
    struct weft_link_table tab;
    char err[256];
    cr_assert_eq(weft_topo_table_init(&tab, 8, hosts, 1u << SHM | 1u << TCP,
                                      err, sizeof(err)),
                 WEFT_OK, "%s", err);
    cr_assert_eq(weft_topo_table_set_default(&tab, SHM, 0.7e-6, 1 / 9e9), WEFT_OK);
    cr_assert_eq(weft_topo_table_set_default(&tab, TCP, 6e-6, 1 / 2.5e9), WEFT_OK);
    struct weft_sim_cluster cl = {.ppn = 4, .intra_alpha = 0.7e-6, .intra_beta = 1 / 9e9,
                                  .inter_alpha = 6e-6, .inter_beta = 1 / 2.5e9};
    struct weft_sim_model mt = uniform_model(), mc = uniform_model();
    weft_sim_link_table(&mt, &tab);
    weft_sim_two_level(&mc, &cl);
    for (size_t count = 8; count <= 800000; count *= 10) {
        double t = sim(&mt, WEFT_ALGO_RING, 0, WEFT_COLL_ALLREDUCE, 8, count, 4096);
        expect(t, sim(&mc, WEFT_ALGO_RING, 0, WEFT_COLL_ALLREDUCE, 8, count, 4096),
               "ring allreduce over a link table", 8, count * ESIZE);
        /* Slower than if every link were shm. */
        struct weft_sim_model mu = uniform_model();
        struct uniform fast = {0.7e-6, 1 / 9e9};
        mu.ctx = &fast;
        cr_expect_gt(t, sim(&mu, WEFT_ALGO_RING, 0, WEFT_COLL_ALLREDUCE, 8, count, 4096));
    }
    /* More ranks than the table has: the model cannot cost them. */
    struct weft_coll_desc d = {.coll = WEFT_COLL_ALLREDUCE, .nranks = 9, .count = 90, .chunk = 90};
    double t;
    cr_expect_eq(weft_sim_predict(&d, &mt, &t), WEFT_ERR_INVALID_ARG);
    weft_topo_table_fini(&tab);
}

/* ---- symmetry ------------------------------------------------------------------ */

/* Seconds of one run, and how many ranks it ran, on a two-level cluster;
 * sym false runs every rank. */
static struct weft_sim_result run_two_level(const struct weft_sim_cluster *cl, bool sym,
                                            const struct weft_coll_desc *d)
{
    struct weft_sim_model m = uniform_model();
    weft_sim_two_level(&m, cl);
    if (!sym)
        m.sym_ppn = 0;
    struct weft_sim_result r = {.seconds = -1};
    weft_status_t st = weft_sim_run(d, &m, &r);
    cr_assert_eq(st, WEFT_OK, "%s/%d %s p=%d count=%zu chunk=%zu: status %d (%s)",
                 weft_algo_name(d->algo), d->variant, weft_coll_name(d->coll), d->nranks, d->count,
                 d->chunk, st, weft_thread_last_error());
    return r;
}

/* Every family, variant and collective, on 16, 64 and 256 ranks in nodes
 * of 4 or 8 with links 10 times slower between nodes, at counts whose
 * blocks are whole (where the symmetries hold) and at ragged ones (where
 * they must not be taken): running one rank per class agrees with running
 * every rank within 1%, and the busiest port's load exactly. */
Test(sim, symmetric_runs_agree_with_every_rank, .timeout = 120)
{
    static const struct {
        int p, ppn;
    } shapes[] = {{16, 4}, {64, 8}, {256, 8}};
    static const int coll_list[] = {WEFT_COLL_ALLREDUCE, WEFT_COLL_REDUCE_SCATTER,
                                    WEFT_COLL_ALLGATHER, WEFT_COLL_BROADCAST, WEFT_COLL_REDUCE};
    double worst = 0;
    int nsym = 0, ncases = 0;
    for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++) {
        int p = shapes[si].p;
        struct weft_sim_cluster cl = {.ppn = shapes[si].ppn, .intra_alpha = 0.7e-6,
                                      .intra_beta = 1 / 150e9, .inter_alpha = 7e-6,
                                      .inter_beta = 1 / 15e9};
        int *node = malloc((size_t)p * sizeof(*node));
        cr_assert_not_null(node);
        for (int r = 0; r < p; r++)
            node[r] = r / cl.ppn;
        /* Per-block counts for allgather and reduce_scatter, per rank for
         * the others: ragged, one chunk a block, four (not on 256 ranks:
         * the run of every rank is what takes the time). */
        const size_t chunk = 64;
        size_t per_block[] = {3, chunk, 4 * chunk};
        int ncounts = p >= 256 ? 2 : 3;
        for (int algo = 0; algo < WEFT_ALGO_COUNT; algo++)
            for (int var = 0; var < WEFT_VAR_COUNT; var++)
                for (size_t ci = 0; ci < sizeof(coll_list) / sizeof(coll_list[0]); ci++) {
                    int coll = coll_list[ci];
                    if (!weft_algo_serves(algo, var, coll))
                        continue;
                    bool blocks = coll == WEFT_COLL_ALLGATHER || coll == WEFT_COLL_REDUCE_SCATTER;
                    for (int k = 0; k < ncounts; k++) {
                        size_t count = blocks ? per_block[k] : per_block[k] * (size_t)p;
                        if (k == 0 && !blocks)
                            count = (size_t)p * 5 + 3; /* ragged blocks */
                        struct weft_coll_desc d = {
                            .coll = coll, .nranks = p, .root = p / 2 + 1, .count = count,
                            .chunk = chunk, .algo = algo, .variant = var, .node = node,
                            .nnodes = p / cl.ppn,
                        };
                        struct weft_sim_result s = run_two_level(&cl, true, &d);
                        struct weft_sim_result f = run_two_level(&cl, false, &d);
                        cr_assert_eq(f.ranks_run, p);
                        double gap = fabs(s.seconds - f.seconds) / f.seconds;
                        cr_expect(gap <= 0.01,
                                  "%s/%d %s p=%d count=%zu: %d ranks run (%s) %.9g s, every "
                                  "rank %.9g s",
                                  weft_algo_name(algo), var, weft_coll_name(coll), p, count,
                                  s.ranks_run, s.symmetry, s.seconds, f.seconds);
                        cr_expect_float_eq(s.port_seconds, f.port_seconds,
                                           1e-9 * f.port_seconds + 1e-15);
                        worst = fmax(worst, gap);
                        ncases++;
                        nsym += s.ranks_run < p;
                        /* Whole blocks through the unrooted rings and
                         * direct are symmetric, or the test proves little. */
                        if ((algo == WEFT_ALGO_RING || algo == WEFT_ALGO_DIRECT) &&
                            !weft_coll_rooted(coll) && k > 0)
                            cr_expect_lt(s.ranks_run, p, "%s %s p=%d count=%zu: no symmetry",
                                         weft_algo_name(algo), weft_coll_name(coll), p, count);
                    }
                }
        free(node);
    }
    cr_log_info("symmetric vs every rank: %d runs, %d with a symmetry, largest gap %.4f%%",
                ncases, nsym, worst * 100);
}

/* The classes are found only where they exist: a rooted chain, a double
 * tree and ragged ring blocks run every rank; whole ring blocks on 2
 * nodes run one rank per node slot, and on one node a single rank. */
Test(sim, symmetry_is_found_where_it_holds)
{
    struct weft_sim_cluster two = {.ppn = 8, .intra_alpha = 1e-6, .intra_beta = 1e-10,
                                   .inter_alpha = 5e-6, .inter_beta = 1e-9};
    struct weft_sim_cluster one = two;
    one.ppn = 16;
    int node[16];
    for (int r = 0; r < 16; r++)
        node[r] = r / 8;
    struct weft_coll_desc d = {.coll = WEFT_COLL_ALLREDUCE, .nranks = 16, .count = 16 * 100,
                               .chunk = 100, .algo = WEFT_ALGO_RING, .node = node, .nnodes = 2};
    /* On 2 nodes r ^ 8 is r + 8: the xor group is tried first. */
    cr_expect_eq(run_two_level(&two, true, &d).ranks_run, 8);
    cr_expect_eq(run_two_level(&one, true, &d).ranks_run, 1);
    d.count = 16 * 100 + 1;
    cr_expect_eq(run_two_level(&two, true, &d).ranks_run, 16, "ragged ring blocks");
    d.count = 1600;
    d.algo = WEFT_ALGO_TREE;
    cr_expect_eq(run_two_level(&two, true, &d).ranks_run, 16, "double tree");
    d.algo = WEFT_ALGO_RING;
    d.coll = WEFT_COLL_BROADCAST;
    cr_expect_eq(run_two_level(&two, true, &d).ranks_run, 16, "rooted chain");
    d.coll = WEFT_COLL_ALLGATHER;
    d.count = 100;
    struct weft_sim_cluster four = two; /* 4 nodes of 4: r ^ 4 is no rotation */
    four.ppn = 4;
    struct weft_sim_result r = run_two_level(&four, true, &d);
    cr_expect_eq(r.ranks_run, 4);
    cr_expect_str_eq(r.symmetry, "rotation");
    d.algo = WEFT_ALGO_RHD; /* one chunk a message: every rank keeps alike */
    d.chunk = 1600;
    r = run_two_level(&one, true, &d);
    cr_expect_eq(r.ranks_run, 1);
    cr_expect_str_eq(r.symmetry, "xor");
}

/* 4096 ranks on 512 nodes whose links cost the same inside and between:
 * too many to compare every rank, so four ranks of each class are; the
 * ring allreduce of 8 representatives is still the textbook formula. */
Test(sim, sampled_symmetry_matches_the_formula, .timeout = 60)
{
    struct weft_sim_cluster cl = {.ppn = 8, .intra_alpha = U.alpha, .intra_beta = U.beta,
                                  .inter_alpha = U.alpha, .inter_beta = U.beta};
    int p = 4096;
    size_t count = (size_t)p * 64;
    struct weft_coll_desc d = {.coll = WEFT_COLL_ALLREDUCE, .nranks = p, .count = count,
                               .chunk = count, .algo = WEFT_ALGO_RING};
    struct weft_sim_result r = run_two_level(&cl, true, &d);
    cr_expect_eq(r.ranks_run, 8);
    double n = (double)(count * ESIZE);
    expect(r.seconds,
           2 * (p - 1) * U.alpha + 2 * (p - 1.0) / p * n * U.beta + (p - 1.0) / p * n * GAMMA,
           "ring allreduce, one rank per class", p, (size_t)n);
}

/* The step limit refuses a run of every rank before building it all, and
 * a symmetric one is not held to it. */
Test(sim, step_limit)
{
    struct weft_sim_cluster cl = {.ppn = 4, .intra_alpha = 1e-6, .intra_beta = 1e-10,
                                  .inter_alpha = 5e-6, .inter_beta = 1e-9};
    struct weft_sim_model m = uniform_model();
    weft_sim_two_level(&m, &cl);
    m.max_steps = 1000;
    struct weft_coll_desc d = {.coll = WEFT_COLL_ALLREDUCE, .nranks = 64, .count = 64 * 10,
                               .chunk = 10, .algo = WEFT_ALGO_RING};
    struct weft_sim_result r;
    cr_expect_eq(weft_sim_run(&d, &m, &r), WEFT_OK, "%s", weft_thread_last_error());
    cr_expect_eq(r.ranks_run, 4);
    d.count += 1; /* ragged: every rank, 64 x 252 steps */
    cr_expect_eq(weft_sim_run(&d, &m, &r), WEFT_ERR_UNSUPPORTED);
    cr_expect(strstr(weft_thread_last_error(), "over the limit of 1000"), "%s",
              weft_thread_last_error());
    m.max_steps = 0;
    cr_expect_eq(weft_sim_run(&d, &m, &r), WEFT_OK);
    m.max_build_seconds = -1;
    cr_expect_eq(weft_sim_run(&d, &m, &r), WEFT_ERR_INVALID_ARG);
}

/* One schedule larger than the limit (direct's broadcast root: p - 1 sends
 * a chunk) is refused by its builder at the limit, not built whole and
 * then counted, so memory stays within it. */
Test(sim, step_limit_stops_the_builder)
{
    struct weft_coll_desc d = {.coll = WEFT_COLL_BROADCAST, .nranks = 64, .count = 1000,
                               .chunk = 1, .algo = WEFT_ALGO_DIRECT};
    struct weft_schedule s;
    weft_sched_init(&s);
    s.max_steps = 500; /* the root's schedule: 63 x 1000 sends and a copy */
    cr_expect_eq(weft_sched_build(&d, &s), WEFT_ERR_UNSUPPORTED);
    cr_expect_eq(s.nsteps, 0);
    cr_expect_leq(s.cap, 512, "the builder grew the schedule to %zu steps", s.cap);
    cr_expect(strstr(weft_thread_last_error(), "limit of 500"), "%s", weft_thread_last_error());
    d.rank = 1; /* 1000 receives: over too */
    cr_expect_eq(weft_sched_build(&d, &s), WEFT_ERR_UNSUPPORTED);
    d.count = 400;
    cr_expect_eq(weft_sched_build(&d, &s), WEFT_OK);
    cr_expect_eq(s.nsteps, 400);
    weft_sched_free(&s);

    struct weft_sim_cluster cl = {.ppn = 4, .intra_alpha = 1e-6, .intra_beta = 1e-10,
                                  .inter_alpha = 5e-6, .inter_beta = 1e-9};
    struct weft_sim_model m = uniform_model();
    weft_sim_two_level(&m, &cl);
    m.max_steps = 10000;
    d.count = 1000;
    struct weft_sim_result r;
    cr_expect_eq(weft_sim_run(&d, &m, &r), WEFT_ERR_UNSUPPORTED);
    cr_expect(strstr(weft_thread_last_error(), "limit of 10000"), "%s", weft_thread_last_error());
    m.max_steps = 0;
    cr_expect_eq(weft_sim_run(&d, &m, &r), WEFT_OK, "%s", weft_thread_last_error());
}

/* weft-sim --compare: the p = 1024 comparison's tool, here on 32 ranks. */
Test(weft_sim, compare_symmetric_with_every_rank)
{
    static char out[1 << 17];
    int rc = weft_sim("--nodes 4 --ppn 8 -c allreduce -b 8 -e 4M --compare", out, sizeof(out));
    cr_assert_eq(rc, 0, "exit %d:\n%s", rc, out);
    const char *x = strstr(out, "# compare: ");
    cr_assert_not_null(x, "%s", out);
    size_t n = 0, nsym = 0;
    double gap = -1;
    cr_assert_eq(sscanf(x, "# compare: %zu predictions (%zu with a symmetry), largest gap %lf%%",
                        &n, &nsym, &gap),
                 3, "%s", x);
    cr_expect_gt(nsym, 0, "%s", x);
    cr_expect_gt(n, nsym, "%s", x);
    cr_expect(gap >= 0 && gap <= 1, "%s", x);
}
