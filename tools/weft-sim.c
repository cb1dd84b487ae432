/*
 * weft-sim - predicts collective times from the schedules themselves
 * (select/sim.c) on a two-level cluster, and where the fastest
 * algorithm changes with the message size.
 *
 * SYNOPSIS
 *   weft-sim -n P [--nodes K --ppn M] [--alpha-us A --gbps B]
 *            [--inter-alpha-us A2 --inter-gbps B2] [--reduce-gbps G] [--copy-gbps C]
 *            [-c allreduce|reducescatter|allgather|broadcast|reduce|all] [-a ALGOS]
 *            [-b MIN -e MAX -f FACTOR] [--chunk BYTES] [--dtype-bytes E]
 *            [--full | --compare] [--max-steps N] [--max-build-s S] [--max-chunks K]
 *
 * DESCRIPTION
 *   For each collective, prints a table of the predicted time (us) of every
 *   algorithm variant that serves it, at each size (nccl-tests sizes: bytes
 *   of the larger buffer of one rank), marks the fastest of each row with
 *   '*', then the crossovers: the sizes where the fastest variant changes,
 *   found by bisection between table sizes: to the element, or, for the
 *   collectives whose count is per rank (allreduce, broadcast, reduce)
 *   above P elements, to a multiple of P elements, where every rank's
 *   block is the same size and the schedules stay symmetric.
 *
 *   Ranks whose schedules are the same up to a rotation or xor of the
 *   ranks that keeps the links' costs are simulated once (select/sim.h);
 *   what has no such symmetry runs every rank, up to --max-steps steps
 *   (beyond: n/a, with the reason under the table).
 *
 * OPTIONS
 *   -n P                ranks (default: K * M when both are given)
 *   --nodes K, --ppn M  K nodes of M ranks, rank r on node r / M (default:
 *                       one node holding all ranks)
 *   --alpha-us A        intra-node latency per message, us (0.5)
 *   --gbps B            intra-node bandwidth, GB/s = 1e9 bytes/s (10)
 *   --inter-alpha-us A2 inter-node latency per message, us (5)
 *   --inter-gbps B2     inter-node bandwidth, GB/s (3)
 *   --reduce-gbps G     bytes reduced per second on one rank, GB/s (10)
 *   --copy-gbps C       bytes copied per second on one rank, GB/s (10)
 *   -c COLL             the collective, or all (default)
 *   -a ALGOS            comma-separated: a family (ring, tree, rhd, direct,
 *                       hier: all its variants) or one variant (rhd/doubling,
 *                       tree/binomial, hier/rhd, rhd/rabenseifner,
 *                       tree/double, hier/ring); default: all
 *   -b MIN, -e MAX      sizes in bytes, K/M/G suffixes (8, 64M)
 *   -f FACTOR           size multiplier between rows, > 1 (4)
 *   --chunk BYTES       most bytes one step carries (WEFT_CHUNK_SIZE)
 *   --dtype-bytes E     bytes per element: 1, 2, 4 or 8 (4)
 *   --max-chunks K      larger chunks where a count would have more than K
 *                       (0: none, the engine's chunks); selection simulates
 *                       with 16, coarser pipelines than the engine runs
 *   --full              run every rank, no symmetry (the reference)
 *   --compare           run both, and print the largest relative gap
 *                       between them over every prediction made
 *   --max-steps N       most steps a run of every rank may hold, K/M/G
 *                       suffixes (4M: about 0.3 GB; 0: no limit)
 *   --max-build-s S     above 2048 ranks, most seconds building every
 *                       rank's schedule may take, projected from 64 ranks
 *                       (1; 0: no limit): the builders cost O(P) a rank,
 *                       so O(P^2) in all
 *   -h, --help          this text
 *
 * EXIT STATUS
 *   0 on success, 2 on a bad argument (the message names the flag), 1 when
 *   a prediction cannot be made at all.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/schedule.h"
#include "select/sim.h"
#include "src/comm.h"
#include "base/internal.h"

static const char usage[] =
    "usage: weft-sim -n P [--nodes K --ppn M] [--alpha-us A --gbps B]\n"
    "                [--inter-alpha-us A2 --inter-gbps B2] [--reduce-gbps G] [--copy-gbps C]\n"
    "                [-c allreduce|reducescatter|allgather|broadcast|reduce|all] [-a ALGOS]\n"
    "                [-b MIN -e MAX -f FACTOR] [--chunk BYTES] [--dtype-bytes E]\n"
    "                [--full | --compare] [--max-steps N] [--max-build-s S] [--max-chunks K]\n"
    "Predicts each algorithm's time (us) per size and prints where the fastest changes.\n"
    "  -n P                 ranks (default K*M with --nodes and --ppn)\n"
    "  --nodes K --ppn M    K nodes of M ranks (default: one node)\n"
    "  --alpha-us, --gbps   intra-node link: us per message (0.5), GB/s (10)\n"
    "  --inter-alpha-us, --inter-gbps\n"
    "                       inter-node link: us per message (5), GB/s (3)\n"
    "  --reduce-gbps G      reduction speed of one rank, GB/s (10)\n"
    "  --copy-gbps C        copy speed of one rank, GB/s (10)\n"
    "  -c COLL              allreduce, reducescatter, allgather, broadcast, reduce or all\n"
    "  -a ALGOS             comma list: ring, tree, rhd, direct, hier (all variants) or\n"
    "                       one variant: rhd/doubling, tree/binomial, hier/rhd, ...\n"
    "  -b MIN -e MAX -f F   sizes in bytes (K/M/G suffixes; 8, 64M, x4)\n"
    "  --chunk BYTES        most bytes one step carries (WEFT_CHUNK_SIZE)\n"
    "  --dtype-bytes E      bytes per element: 1, 2, 4, 8 (4)\n"
    "  --max-chunks K       chunks of at least count/K elements (0: the engine's; 16: selection's)\n"
    "  --full               run every rank (no symmetry); --compare: both, and the gap\n"
    "  --max-steps N        most steps a run of every rank may hold (4M; 0: none)\n"
    "  --max-build-s S      above 2048 ranks, most seconds building every rank may\n"
    "                       take (1; 0: none)\n";

static const struct {
    const char *name;
    int coll;
} colls[] = {
    {"allreduce", WEFT_COLL_ALLREDUCE}, {"reducescatter", WEFT_COLL_REDUCE_SCATTER},
    {"allgather", WEFT_COLL_ALLGATHER}, {"broadcast", WEFT_COLL_BROADCAST},
    {"reduce", WEFT_COLL_REDUCE},
};
#define NCOLLS (sizeof(colls) / sizeof(colls[0]))

/* Everything the command line sets; filled once by parse. */
struct opts {
    int n, nodes, ppn;
    double alpha_us, gbps, inter_alpha_us, inter_gbps, reduce_gbps, copy_gbps;
    unsigned colls; /* bit i: colls[i] */
    bool sel[WEFT_ALGO_COUNT][WEFT_VAR_COUNT];
    int64_t minb, maxb, chunk, max_steps;
    double factor, max_build_s;
    int esize;
    int mode;       /* M_SYM, M_FULL or M_COMPARE */
    int max_chunks; /* 0, or the most chunks of a count (--max-chunks) */
};

enum { M_SYM, M_FULL, M_COMPARE };

/* Ranks above which --max-build-s applies. */
#define BUILD_LIMIT_RANKS 2048

/* Variant 0 is shown as the family alone. */
static void display_name(int algo, int var, char *out, size_t len)
{
    if (var == 0)
        snprintf(out, len, "%s", weft_algo_name(algo));
    else
        snprintf(out, len, "%s/%s", weft_algo_name(algo), weft_algo_variant_name(algo, var));
}

static _Noreturn WEFT_PRINTF(2, 3) void bad(const char *flag, const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "weft-sim: %s: ", flag);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nTry 'weft-sim --help'.\n");
    exit(2);
}

static int parse_int(const char *flag, const char *v, int min, int max)
{
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end || x < min || x > max)
        bad(flag, "expected an integer in [%d, %d], got '%s'", min, max, v);
    return (int)x;
}

/* A finite number > 0 (or >= 0 when zero_ok). */
static double parse_num(const char *flag, const char *v, bool zero_ok)
{
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x) || x < 0 || (!zero_ok && x == 0))
        bad(flag, "expected a finite number %s 0, got '%s'", zero_ok ? ">=" : ">", v);
    return x;
}

static int64_t parse_bytes(const char *flag, const char *v)
{
    int64_t x;
    if (!weft_parse_size(v, &x) || x < 1)
        bad(flag, "expected a size >= 1 in bytes (K, M, G suffixes), got '%s'", v);
    return x;
}

static void parse_algos(struct opts *o, const char *spec)
{
    memset(o->sel, 0, sizeof(o->sel));
    const char *p = spec;
    for (;;) {
        size_t len = strcspn(p, ",");
        size_t flen = strcspn(p, "/,");
        int a = flen ? weft_algo_from_name(p, flen) : -1;
        if (a < 0)
            bad("-a", "unknown algorithm '%.*s' (ring, tree, rhd, direct, hier)", (int)len, p);
        if (flen == len) {
            /* Every variant; the ones a family lacks serve nothing. */
            for (int v = 0; v < WEFT_VAR_COUNT; v++)
                o->sel[a][v] = true;
        } else {
            const char *vn = p + flen + 1;
            size_t vlen = len - flen - 1;
            int found = weft_algo_variant_from_name(a, vn, vlen);
            if (found < 0)
                bad("-a", "%s has no variant '%.*s'", weft_algo_name(a), (int)vlen, vn);
            o->sel[a][found] = true;
        }
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
}

static unsigned parse_coll(const char *v)
{
    if (strcmp(v, "all") == 0)
        return (1u << NCOLLS) - 1;
    if (strcmp(v, "reduce_scatter") == 0)
        v = "reducescatter";
    for (size_t i = 0; i < NCOLLS; i++)
        if (strcmp(v, colls[i].name) == 0)
            return 1u << i;
    bad("-c", "unknown collective '%s' (allreduce, reducescatter, allgather, broadcast, "
              "reduce, all)",
        v);
}

static void parse(int argc, char **argv, struct opts *o)
{
    int64_t chunk = weft_param_int("WEFT_CHUNK_SIZE");
    *o = (struct opts){
        .alpha_us = 0.5, .gbps = 10, .inter_alpha_us = 5, .inter_gbps = 3,
        .reduce_gbps = 10, .copy_gbps = 10, .colls = (1u << NCOLLS) - 1,
        .minb = 8, .maxb = 64 << 20, .factor = 4, .chunk = chunk > 0 ? chunk : 524288,
        .esize = 4, .max_steps = 4 << 20, .max_build_s = 1.0,
    };
    parse_algos(o, "ring,tree,rhd,direct,hier");
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            fputs(usage, stdout);
            exit(0);
        }
        if (strcmp(a, "--full") == 0 || strcmp(a, "--compare") == 0) {
            if (o->mode != M_SYM)
                bad(a, "--full and --compare are given together");
            o->mode = a[2] == 'f' ? M_FULL : M_COMPARE;
            continue;
        }
        /* Every other flag takes a value: "--flag V" or "--flag=V". */
        char flag[64];
        const char *v;
        const char *eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
        if (eq) {
            snprintf(flag, sizeof(flag), "%.*s", (int)(eq - a), a);
            v = eq + 1;
        } else {
            snprintf(flag, sizeof(flag), "%s", a);
            if (i + 1 >= argc)
                bad(flag, a[0] == '-' ? "needs a value" : "unexpected argument");
            v = argv[++i];
        }
        if (strcmp(flag, "-n") == 0)
            o->n = parse_int(flag, v, 1, 1 << 20);
        else if (strcmp(flag, "--nodes") == 0)
            o->nodes = parse_int(flag, v, 1, 1 << 20);
        else if (strcmp(flag, "--ppn") == 0)
            o->ppn = parse_int(flag, v, 1, 1 << 20);
        else if (strcmp(flag, "--alpha-us") == 0)
            o->alpha_us = parse_num(flag, v, true);
        else if (strcmp(flag, "--gbps") == 0)
            o->gbps = parse_num(flag, v, false);
        else if (strcmp(flag, "--inter-alpha-us") == 0)
            o->inter_alpha_us = parse_num(flag, v, true);
        else if (strcmp(flag, "--inter-gbps") == 0)
            o->inter_gbps = parse_num(flag, v, false);
        else if (strcmp(flag, "--reduce-gbps") == 0)
            o->reduce_gbps = parse_num(flag, v, false);
        else if (strcmp(flag, "--copy-gbps") == 0)
            o->copy_gbps = parse_num(flag, v, false);
        else if (strcmp(flag, "-c") == 0)
            o->colls = parse_coll(v);
        else if (strcmp(flag, "-a") == 0)
            parse_algos(o, v);
        else if (strcmp(flag, "-b") == 0)
            o->minb = parse_bytes(flag, v);
        else if (strcmp(flag, "-e") == 0)
            o->maxb = parse_bytes(flag, v);
        else if (strcmp(flag, "-f") == 0) {
            o->factor = parse_num(flag, v, false);
            if (o->factor <= 1)
                bad(flag, "the size factor must be above 1, got '%s'", v);
        } else if (strcmp(flag, "--chunk") == 0)
            o->chunk = parse_bytes(flag, v);
        else if (strcmp(flag, "--max-steps") == 0)
            o->max_steps = strcmp(v, "0") == 0 ? 0 : parse_bytes(flag, v);
        else if (strcmp(flag, "--max-chunks") == 0)
            o->max_chunks = parse_int(flag, v, 0, 1 << 20);
        else if (strcmp(flag, "--max-build-s") == 0)
            o->max_build_s = parse_num(flag, v, true);
        else if (strcmp(flag, "--dtype-bytes") == 0) {
            o->esize = parse_int(flag, v, 1, 8);
            if (o->esize & (o->esize - 1))
                bad(flag, "expected 1, 2, 4 or 8, got '%s'", v);
        } else
            bad(flag, "unknown option");
    }
    if (o->maxb < o->minb)
        bad("-e", "the largest size (%lld) is below the smallest (-b %lld)",
            (long long)o->maxb, (long long)o->minb);
    if (o->n == 0) {
        if (!o->nodes || !o->ppn)
            bad("-n", "the rank count is required (or give both --nodes and --ppn)");
        if ((long long)o->nodes * o->ppn > 1 << 20)
            bad("--nodes", "%d nodes x %d ranks is more than %d ranks", o->nodes, o->ppn, 1 << 20);
        o->n = o->nodes * o->ppn;
    } else if (o->nodes && o->ppn) {
        if ((long long)o->nodes * o->ppn != o->n)
            bad("--nodes", "%d nodes x --ppn %d is not -n %d ranks", o->nodes, o->ppn, o->n);
    } else if (o->nodes) {
        if (o->n % o->nodes)
            bad("--nodes", "%d ranks do not split evenly over %d nodes", o->n, o->nodes);
        o->ppn = o->n / o->nodes;
    } else if (o->ppn) {
        if (o->n % o->ppn)
            bad("--ppn", "%d ranks are not whole nodes of %d", o->n, o->ppn);
        o->nodes = o->n / o->ppn;
    } else {
        o->nodes = 1;
        o->ppn = o->n;
    }
}

/* One collective's setting: what a prediction needs besides algo and count. */
struct ctx {
    const struct opts *o;
    struct weft_sim_model m;
    int coll;
    int *node;
    int ncand;
    int cand[WEFT_ALGO_COUNT * WEFT_VAR_COUNT][2]; /* (algo, variant) */
    char why[WEFT_ALGO_COUNT * WEFT_VAR_COUNT][320]; /* the first n/a's reason, per candidate */
};

/* What --compare found, over the whole run. */
static struct {
    double worst;   /* largest |symmetric - full| / full */
    size_t n, nsym; /* predictions compared; of them, run with a symmetry */
    char where[200];
} cmp;

/* Elements per rank (desc.count) for a row of size bytes. */
static size_t count_of(const struct ctx *c, int64_t bytes)
{
    size_t elems = (size_t)bytes / (size_t)c->o->esize;
    if (c->coll == WEFT_COLL_ALLGATHER || c->coll == WEFT_COLL_REDUCE_SCATTER)
        elems /= (size_t)c->o->n;
    return elems ? elems : 1;
}

static double bytes_of(const struct ctx *c, size_t count)
{
    double b = (double)count * c->o->esize;
    if (c->coll == WEFT_COLL_ALLGATHER || c->coll == WEFT_COLL_REDUCE_SCATTER)
        b *= c->o->n;
    return b;
}

/* One prediction: seconds, or NAN with the reason in c->why[k]. */
static double predict_one(struct ctx *c, int k, const struct weft_coll_desc *d,
                          const struct weft_sim_model *m, struct weft_sim_result *r)
{
    if (weft_sim_run(d, m, r) == WEFT_OK)
        return r->seconds;
    if (!c->why[k][0])
        snprintf(c->why[k], sizeof(c->why[k]), "%s", weft_thread_last_error());
    return NAN;
}

/* Predicted seconds of candidate k at count; NAN when it cannot be built. */
static double predict(struct ctx *c, int k, size_t count)
{
    size_t chunk = (size_t)c->o->chunk / (size_t)c->o->esize;
    if (c->o->max_chunks > 0)
        chunk = WEFT_MAX(chunk, count / (size_t)c->o->max_chunks); /* select/tune.c's rule */
    struct weft_coll_desc d = {
        .coll = c->coll, .nranks = c->o->n, .root = 0, .count = count,
        .chunk = chunk ? chunk : 1, .algo = c->cand[k][0], .variant = c->cand[k][1],
        .node = c->node, .nnodes = c->o->nodes,
    };
    struct weft_sim_model full = c->m;
    full.sym_ppn = 0;
    struct weft_sim_result r;
    if (c->o->mode == M_FULL)
        return predict_one(c, k, &d, &full, &r);
    double t = predict_one(c, k, &d, &c->m, &r);
    if (c->o->mode != M_COMPARE || isnan(t))
        return t;
    struct weft_sim_result rf;
    double tf = predict_one(c, k, &d, &full, &rf);
    if (isnan(tf))
        return t;
    double gap = tf > 0 ? fabs(t - tf) / tf : fabs(t - tf);
    cmp.n++;
    cmp.nsym += r.ranks_run < c->o->n;
    if (gap > cmp.worst || cmp.n == 1) {
        char name[64];
        display_name(c->cand[k][0], c->cand[k][1], name, sizeof(name));
        cmp.worst = gap;
        snprintf(cmp.where, sizeof(cmp.where),
                 "%s %s count %zu (%s, %d ranks run): %.6g us, full %.6g us", name,
                 weft_coll_name(c->coll), count, r.symmetry, r.ranks_run, t * 1e6, tf * 1e6);
    }
    return t;
}

/* Index of the fastest candidate (first among equals), -1 if none works;
 * t (ncand) gets every time. */
static int fastest(struct ctx *c, size_t count, double *t, const bool *active)
{
    int best = -1;
    for (int k = 0; k < c->ncand; k++) {
        t[k] = !active || active[k] ? predict(c, k, count) : NAN;
        if (!isnan(t[k]) && (best < 0 || t[k] < t[best]))
            best = k;
    }
    return best;
}

static const char *cand_name(const struct ctx *c, int k, char *buf, size_t len)
{
    if (k < 0)
        return "(none)";
    display_name(c->cand[k][0], c->cand[k][1], buf, len);
    return buf;
}

/* The step of the crossover search at count: P elements for a per-rank
 * count at or above P (the schedules of uneven blocks have no symmetry),
 * else one. */
static size_t grain_at(const struct ctx *c, size_t count)
{
    size_t p = (size_t)c->o->n;
    bool per_rank = c->coll != WEFT_COLL_ALLGATHER && c->coll != WEFT_COLL_REDUCE_SCATTER;
    return per_rank && count >= p ? p : 1;
}

/* Between counts lo (fastest wlo) and hi (fastest whi): every change of
 * the fastest, each found by bisection to the grain (grain_at).  tlo and
 * thi are every candidate's times at lo and hi.  Taking a time never to
 * fall as the size grows, a candidate slower at lo than the fastest at hi
 * cannot be the fastest in between and is not run there. */
static int crossovers(struct ctx *c, const char *cname, size_t lo, int wlo, size_t hi,
                      int whi, const double *tlo, const double *thi, double *t)
{
    bool lo_na = wlo >= 0 && isnan(thi[wlo]), hi_na = whi >= 0 && isnan(tlo[whi]);
    if (lo_na || hi_na) {
        /* One of the two could not be simulated at one end: where they
         * cross is not known. */
        char n1[64], n2[64];
        printf("# crossover %s: %s -> %s between %.0f and %.0f B (%s n/a at one end)\n", cname,
               cand_name(c, wlo, n1, sizeof(n1)), cand_name(c, whi, n2, sizeof(n2)),
               bytes_of(c, lo), bytes_of(c, hi), lo_na ? n1 : n2);
        return 1;
    }
    /* Both are simulated at both ends from here on (wlo, whi >= 0). */
    bool active[WEFT_ALGO_COUNT * WEFT_VAR_COUNT];
    for (int k = 0; k < c->ncand; k++)
        active[k] = !isnan(thi[k]) && !(tlo[k] > thi[whi]);
    int found = 0;
    while (wlo != whi && found < 16) {
        size_t a = lo, b = hi;
        int wb = whi;
        while (b - a > grain_at(c, a)) {
            size_t g = grain_at(c, a), mid = a + (b - a) / 2;
            if (g > 1) {
                /* A multiple of the grain strictly inside (a, b), if any. */
                size_t m = (mid + g - 1) / g * g;
                if (m >= b)
                    m = mid / g * g;
                if (m <= a)
                    break;
                mid = m;
            }
            int w = fastest(c, mid, t, active);
            if (w == wlo) {
                a = mid;
            } else {
                b = mid;
                wb = w;
            }
        }
        char n1[64], n2[64];
        printf("# crossover %s: %s -> %s at %.0f B\n", cname, cand_name(c, wlo, n1, sizeof(n1)),
               cand_name(c, wb, n2, sizeof(n2)), bytes_of(c, b));
        found++;
        lo = b;
        wlo = wb;
    }
    return found;
}

static int one_coll(const struct opts *o, size_t ci, int *node)
{
    struct weft_sim_cluster cl = {
        .ppn = o->ppn,
        .intra_alpha = o->alpha_us * 1e-6, .intra_beta = 1 / (o->gbps * 1e9),
        .inter_alpha = o->inter_alpha_us * 1e-6, .inter_beta = 1 / (o->inter_gbps * 1e9),
    };
    struct ctx c = {.o = o, .coll = colls[ci].coll, .node = node};
    weft_sim_two_level(&c.m, &cl);
    c.m.gamma = 1 / (o->reduce_gbps * 1e9);
    c.m.copy = 1 / (o->copy_gbps * 1e9);
    c.m.esize = (size_t)o->esize;
    c.m.max_steps = (size_t)o->max_steps;
    /* A clock makes n/a depend on the machine's load: only where the
     * builders' O(P^2) runs to seconds. */
    c.m.max_build_seconds = o->n > BUILD_LIMIT_RANKS ? o->max_build_s : 0;
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        for (int v = 0; v < WEFT_VAR_COUNT; v++)
            if (o->sel[a][v] && weft_algo_serves(a, v, c.coll)) {
                c.cand[c.ncand][0] = a;
                c.cand[c.ncand][1] = v;
                c.ncand++;
            }
    const char *cname = colls[ci].name;
    printf("#\n# %s\n", cname);
    /* A variant that cannot build this rank count is named once and dropped. */
    char name[64];
    for (int k = 0; k < c.ncand;) {
        /* Over a limit at one end is n/a there, not the end of it. */
        if (!isnan(predict(&c, k, count_of(&c, o->minb))) ||
            !isnan(predict(&c, k, count_of(&c, o->maxb)))) {
            c.why[k][0] = '\0';
            k++;
            continue;
        }
        printf("# %s: not simulated: %s\n", cand_name(&c, k, name, sizeof(name)), c.why[k]);
        memmove(c.cand[k], c.cand[k + 1], (size_t)(c.ncand - k - 1) * sizeof(c.cand[0]));
        memmove(c.why[k], c.why[k + 1], (size_t)(c.ncand - k - 1) * sizeof(c.why[0]));
        c.ncand--;
    }
    if (c.ncand == 0) {
        printf("# crossover %s: none (no selected algorithm builds it)\n", cname);
        return 0;
    }
    printf("# %12s %12s", "size(B)", "count");
    for (int k = 0; k < c.ncand; k++)
        printf(" %14s", cand_name(&c, k, name, sizeof(name)));
    printf("\n");

    enum { NC = WEFT_ALGO_COUNT * WEFT_VAR_COUNT };
    double t[NC], *times = NULL; /* (rows, NC) */
    size_t nrows = 0, cap = 0, *counts = NULL;
    int *wins = NULL, nbuilt = 0;
    for (double sz = (double)o->minb; sz <= (double)o->maxb; sz *= o->factor) {
        size_t count = count_of(&c, (int64_t)sz);
        if (nrows > 0 && count == counts[nrows - 1])
            continue; /* rounded to the same row as the last one */
        if (nrows == cap) {
            cap = cap ? 2 * cap : 64;
            size_t *nc = realloc(counts, cap * sizeof(*nc));
            if (nc)
                counts = nc;
            int *nw = nc ? realloc(wins, cap * sizeof(*nw)) : NULL;
            if (nw)
                wins = nw;
            double *nt = nw ? realloc(times, cap * NC * sizeof(*nt)) : NULL;
            if (!nt) {
                free(counts);
                free(wins);
                free(times);
                fprintf(stderr, "weft-sim: out of memory for %zu rows\n", cap);
                return 1;
            }
            times = nt;
        }
        int w = fastest(&c, count, t, NULL);
        memcpy(&times[nrows * NC], t, sizeof(t));
        printf("  %12.0f %12zu", bytes_of(&c, count), count);
        for (int k = 0; k < c.ncand; k++) {
            if (isnan(t[k]))
                printf(" %14s", "n/a");
            else
                printf(" %13.2f%c", t[k] * 1e6, k == w ? '*' : ' ');
        }
        printf("\n");
        nbuilt += w >= 0;
        counts[nrows] = count;
        wins[nrows++] = w;
    }
    int rc = 0, found = 0;
    if (nbuilt == 0) {
        printf("# crossover %s: none (no algorithm could be simulated: %s)\n", cname,
               weft_thread_last_error());
        rc = 1;
        goto out;
    }
    for (size_t r = 1; r < nrows; r++)
        if (wins[r] != wins[r - 1])
            found += crossovers(&c, cname, counts[r - 1], wins[r - 1], counts[r], wins[r],
                                &times[(r - 1) * NC], &times[r * NC], t);
    if (found == 0)
        printf("# crossover %s: none (%s fastest at every size)\n", cname,
               cand_name(&c, wins[0], name, sizeof(name)));
    for (int k = 0; k < c.ncand; k++)
        if (c.why[k][0])
            printf("# %s: n/a where %s\n", cand_name(&c, k, name, sizeof(name)), c.why[k]);
out:
    free(counts);
    free(wins);
    free(times);
    return rc;
}

int main(int argc, char **argv)
{
    struct opts o;
    parse(argc, argv, &o);
    int *node = malloc((size_t)o.n * sizeof(*node));
    if (!node) {
        fprintf(stderr, "weft-sim: out of memory for %d ranks\n", o.n);
        return 1;
    }
    for (int r = 0; r < o.n; r++)
        node[r] = r / o.ppn;
    printf("# weft-sim: %d ranks (%d node%s x %d), intra %g us %g GB/s, inter %g us %g GB/s,\n"
           "# reduce %g GB/s, copy %g GB/s, chunk %lld B, %d-byte elements\n"
           "# predicted time in us; * marks the fastest of each row\n",
           o.n, o.nodes, o.nodes == 1 ? "" : "s", o.ppn, o.alpha_us, o.gbps, o.inter_alpha_us,
           o.inter_gbps, o.reduce_gbps, o.copy_gbps, (long long)o.chunk, o.esize);
    int rc = 0;
    for (size_t ci = 0; ci < NCOLLS; ci++)
        if (o.colls & 1u << ci)
            rc |= one_coll(&o, ci, node);
    if (o.mode == M_COMPARE)
        printf("# compare: %zu predictions (%zu with a symmetry), largest gap %.4f%%%s%s\n",
               cmp.n, cmp.nsym, cmp.worst * 100, cmp.n ? ": " : "", cmp.where);
    free(node);
    return rc;
}
