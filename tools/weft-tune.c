/*
 * weft-tune - times every plan weft has for each collective and size on
 * this job's communicator shape and writes the fastest into the tuning
 * file, which later jobs of that shape read at init (docs/design.md,
 * Selection).  The timing is the perf tools' -A: a communicator per plan,
 * interleaved rounds, the slowest rank's time, the median round.
 */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "base/internal.h"
#include "perf/util.h"
#include "select/tune_file.h"
#include "src/comm.h"
#include "src/plan.h"

#define NPLANS (WEFT_ALGO_COUNT * WEFT_VAR_COUNT)
#define ROUNDS 5
#define FEW_ROUNDS 3        /* where the budget is short */
#define RUN_MIN_S 0.5e-3    /* a run of calls lasts at least this... */
#define RUN_MAX_S 4e-3      /* ...and at most this, budget allowing */
#define MAX_ITERS 1000

static void usage(FILE *f)
{
    fprintf(f,
            "usage: weftrun -n N weft-tune [options]   (or under mpirun)\n"
            "Times every plan weft has for each collective and size on this job's shape\n"
            "(ranks, nodes, ranks per node, transports) and writes the fastest into the\n"
            "tuning file; later jobs of the same shape run those plans from their first\n"
            "call.  Only this shape's section of the file is replaced.\n"
            "  -o, --output FILE    the tuning file (default: WEFT_TUNE_FILE, else\n"
            "                       $XDG_CACHE_HOME/weft/tune, else ~/.cache/weft/tune)\n"
            "  -b, --minbytes SIZE  smallest size, bytes per call (default 8)\n"
            "  -e, --maxbytes SIZE  largest size (default 64M); one size per power of two\n"
            "  -c, --colls LIST     allreduce,reducescatter,allgather,broadcast,reduce\n"
            "                       (default: all)\n"
            "  -t, --budget SECS    time to aim for (default 90): fewer rounds and shorter\n"
            "                       runs where it is short, never fewer than 3 rounds\n"
            "  -h, --help           this text\n"
            "Sizes are count x element size as the call passes them (per rank for\n"
            "reducescatter and allgather).  Reductions are timed on float32 sums, the\n"
            "others on float32 (bytes below 4: uint8) and stand for every type.  Each plan\n"
            "runs on a communicator of its own: one untimed call, a timed one to size its\n"
            "runs, then rounds in which every plan runs 0.5-4 ms of calls behind a\n"
            "barrier, in an order drawn per round; a plan's time is the median round of\n"
            "the slowest rank's time per call.  File format: docs/design.md (Selection);\n"
            "lines read 'allreduce float32 8K ring  # us: ring 12.1, ...'.\n");
}

/* The command line. */
struct opts {
    const char *out;
    size_t minbytes, maxbytes;
    bool colls[WEFT_COLL_COUNT];
    double budget; /* seconds */
};

/* 0: go on; 1: --help; 2: bad arguments (said on stderr). */
static int parse(int argc, char **argv, struct opts *o)
{
    static const struct option longs[] = {
        {"output", required_argument, NULL, 'o'}, {"minbytes", required_argument, NULL, 'b'},
        {"maxbytes", required_argument, NULL, 'e'}, {"colls", required_argument, NULL, 'c'},
        {"budget", required_argument, NULL, 't'},   {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *o = (struct opts){.minbytes = 8, .maxbytes = 64u << 20, .budget = 90};
    bool named = false;
    for (int c; (c = getopt_long(argc, argv, "o:b:e:c:t:h", longs, NULL)) != -1;) {
        char *end;
        switch (c) {
        case 'o': o->out = optarg; break;
        case 'b':
        case 'e':
            if (perf_parse_size(optarg, c == 'b' ? &o->minbytes : &o->maxbytes) != 0) {
                fprintf(stderr, "weft-tune: -%c %s is not a size (8, 64K, 32M)\n", c, optarg);
                return 2;
            }
            break;
        case 'c':
            named = true;
            for (char *s = optarg; *s;) {
                size_t len = strcspn(s, ",");
                int k = weft_tune_coll_from_name(s, len);
                if (k < 0) {
                    fprintf(stderr, "weft-tune: --colls: unknown collective '%.*s'\n", (int)len, s);
                    return 2;
                }
                o->colls[k] = true;
                s += len + (s[len] == ',');
            }
            break;
        case 't':
            errno = 0;
            o->budget = strtod(optarg, &end);
            if (errno || *end || !(o->budget > 0)) {
                fprintf(stderr, "weft-tune: --budget %s is not a number of seconds\n", optarg);
                return 2;
            }
            break;
        case 'h': usage(stdout); return 1;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "weft-tune: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    if (o->minbytes == 0 || o->minbytes > o->maxbytes || o->maxbytes > (1ull << 34)) {
        fprintf(stderr, "weft-tune: wants 0 < -b <= -e <= 16G\n");
        return 2;
    }
    for (int k = 0; k < WEFT_COLL_COUNT; k++)
        o->colls[k] |= !named;
    return 0;
}

/* The job: the world, a communicator per plan, the buffers. */
struct job {
    weft_comm_t world, comm[NPLANS]; /* comm[algo * WEFT_VAR_COUNT + variant] */
    int rank, nranks;
    void *send, *recv; /* nranks * maxbytes each */
    double t0;         /* us, when timing began */
    int pairs_left;    /* (collective, size) pairs still to time */
};

static weft_status_t run(const struct job *j, weft_comm_t c, int coll, size_t count,
                         weft_dtype_t dt)
{
    switch (coll) {
    case WEFT_COLL_ALLREDUCE:
        return weft_allreduce(j->send, j->recv, count, dt, WEFT_SUM, c);
    case WEFT_COLL_REDUCE_SCATTER:
        return weft_reduce_scatter(j->send, j->recv, count, dt, WEFT_SUM, c);
    case WEFT_COLL_ALLGATHER:
        return weft_allgather(j->send, j->recv, count, dt, c);
    case WEFT_COLL_BROADCAST:
        return weft_broadcast(j->send, j->recv, count, dt, 0, c);
    default:
        return weft_reduce(j->send, j->recv, count, dt, WEFT_SUM, 0, c);
    }
}

/* The calls one run: calls of est seconds for about target seconds. */
static int iters_for(double est, double target)
{
    double k = est > 0 ? target / est : MAX_ITERS;
    return k >= MAX_ITERS ? MAX_ITERS : k <= 1 ? 1 : (int)k;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define TRY(what, call)                                                                          \
    do {                                                                                         \
        weft_status_t st_ = (call);                                                              \
        if (st_ != WEFT_OK) {                                                                    \
            fprintf(stderr, "weft-tune: rank %d: %s: %s\n", j->rank, what,                       \
                    weft_last_error(j->world));                                                  \
            return st_;                                                                          \
        }                                                                                        \
    } while (0)

/* Times the plans pl[0..np) of coll for count elements of dt; *best gets
 * the winner's index, us[] each plan's median time per call. */
static weft_status_t time_plans(struct job *j, const struct opts *o, int coll, size_t count,
                                weft_dtype_t dt, const struct weft_plan *pl, int np, int *best,
                                double *us)
{
    double est[NPLANS + 1], t[ROUNDS][NPLANS];
    int iters[NPLANS];
    for (int i = 0; i < np; i++) {
        weft_comm_t c = j->comm[pl[i].algo * WEFT_VAR_COUNT + pl[i].variant];
        TRY("warm-up call", run(j, c, coll, count, dt));
        double t0 = perf_now_us();
        TRY("warm-up call", run(j, c, coll, count, dt));
        est[i] = (perf_now_us() - t0) * 1e-6;
    }
    /* Everything that sizes the rounds is agreed: slowest rank's call, and
     * the time spent so far. */
    est[np] = (perf_now_us() - j->t0) * 1e-6;
    TRY("allreduce (estimates)", weft_allreduce(est, est, (size_t)np + 1, WEFT_FLOAT64, WEFT_MAX,
                                                j->world));
    double share = (o->budget - est[np]) / j->pairs_left, sum = 0;
    for (int i = 0; i < np; i++)
        sum += est[i];
    int rounds = sum * ROUNDS * 2 > share ? FEW_ROUNDS : ROUNDS;
    double target = share / (np * rounds);
    target = target < RUN_MIN_S ? RUN_MIN_S : target > RUN_MAX_S ? RUN_MAX_S : target;
    for (int i = 0; i < np; i++)
        iters[i] = iters_for(est[i], target);
    uint64_t draw = 0x9e3779b97f4a7c15ull ^ ((uint64_t)coll << 40) ^ count;
    double sync = 0;
    for (int r = 0; r < rounds; r++) {
        int order[NPLANS];
        for (int i = 0; i < np; i++)
            order[i] = i;
        for (int i = np - 1; i > 0; i--) { /* Fisher-Yates on a fixed LCG: alike everywhere */
            draw = draw * 6364136223846793005ull + 1442695040888963407ull;
            int k = (int)((draw >> 33) % (uint64_t)(i + 1)), x = order[i];
            order[i] = order[k];
            order[k] = x;
        }
        for (int k = 0; k < np; k++) {
            int i = order[k];
            weft_comm_t c = j->comm[pl[i].algo * WEFT_VAR_COUNT + pl[i].variant];
            TRY("allreduce (sync)", weft_allreduce(&sync, &sync, 1, WEFT_FLOAT64, WEFT_SUM,
                                                   j->world));
            double t0 = perf_now_us();
            for (int it = 0; it < iters[i]; it++)
                TRY(weft_coll_name(coll), run(j, c, coll, count, dt));
            t[r][i] = (perf_now_us() - t0) / iters[i];
        }
        TRY("allreduce (times)", weft_allreduce(t[r], t[r], (size_t)np, WEFT_FLOAT64, WEFT_MAX,
                                                j->world));
    }
    *best = 0;
    for (int i = 0; i < np; i++) {
        double v[ROUNDS];
        for (int r = 0; r < rounds; r++)
            v[r] = t[r][i];
        qsort(v, (size_t)rounds, sizeof(double), cmp_double);
        us[i] = rounds % 2 ? v[rounds / 2] : (v[rounds / 2 - 1] + v[rounds / 2]) / 2;
        if (us[i] < us[*best]) /* ties: the better predicted */
            *best = i;
    }
    return WEFT_OK;
}

/* "8", "64K", "32M": how the file names a size. */
static const char *size_text(size_t b, char *buf, size_t len)
{
    if (b >= (1u << 20) && b % (1u << 20) == 0)
        snprintf(buf, len, "%zuM", b >> 20);
    else if (b >= 1024 && b % 1024 == 0)
        snprintf(buf, len, "%zuK", b >> 10);
    else
        snprintf(buf, len, "%zu", b);
    return buf;
}

/* Appends to the growing text *body (rank 0). */
static bool append(char **body, size_t *len, const char *fmt, ...) WEFT_PRINTF(3, 4);
static bool append(char **body, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *b = k >= 0 ? realloc(*body, *len + (size_t)k + 1) : NULL;
    if (b == NULL)
        return false;
    va_start(ap, fmt);
    vsnprintf(b + *len, (size_t)k + 1, fmt, ap);
    va_end(ap);
    *body = b;
    *len += (size_t)k;
    return true;
}

/* Times every (collective, size) the options ask for; rank 0 gets the
 * section's lines in *body. */
static weft_status_t tune_all(struct job *j, const struct opts *o, char **body, size_t *blen)
{
    for (int coll = 0; coll < WEFT_COLL_COUNT; coll++)
        for (size_t b = o->minbytes; o->colls[coll] && b <= o->maxbytes; b *= 2)
            j->pairs_left += !weft_coll_reduces(coll) || b >= 4;
    j->t0 = perf_now_us();
    for (int coll = 0; coll < WEFT_COLL_COUNT; coll++) {
        for (size_t b = o->minbytes; o->colls[coll] && b <= o->maxbytes; b *= 2) {
            bool red = weft_coll_reduces(coll);
            weft_dtype_t dt = b % 4 == 0 ? WEFT_FLOAT32 : WEFT_UINT8;
            if (red && dt != WEFT_FLOAT32)
                continue;
            size_t count = b / weft_dtype_size(dt);
            struct weft_plan pl[NPLANS];
            double us[NPLANS] = {0};
            int np = weft_tune_distinct(j->world, coll, count, weft_dtype_size(dt), pl), best = 0;
            if (np > 1)
                WEFT_CHECK(time_plans(j, o, coll, count, dt, pl, np, &best, us));
            j->pairs_left--;
            if (j->rank != 0 || np == 0)
                continue;
            char name[32], sz[24], line[512];
            size_t at = 0;
            line[0] = '\0';
            for (int i = 0; i < np && np > 1 && at < sizeof(line); i++)
                at += (size_t)snprintf(line + at, sizeof(line) - at, "%s%s %.1f", i ? ", " : "",
                                       weft_plan_name(pl[i], name, sizeof(name)), us[i]);
            weft_plan_name(pl[best], name, sizeof(name));
            if (!append(body, blen, "%-13s %-7s %5s %-16s # %s%s\n", weft_coll_name(coll),
                        red ? "float32" : "*", size_text(b, sz, sizeof(sz)), name,
                        np > 1 ? "us: " : "the only plan", line))
                return WEFT_ERR_NO_MEMORY;
            printf("%-13s %6s: %-16s %s%s\n", weft_coll_name(coll), sz, name,
                   np > 1 ? "us: " : "the only plan", line);
            fflush(stdout);
        }
    }
    return WEFT_OK;
}

/* A communicator per plan that runs one of the collectives asked for. */
static weft_status_t open_plans(struct job *j, const struct opts *o)
{
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        for (int v = 0; v < WEFT_VAR_COUNT; v++) {
            bool wanted = false;
            for (int coll = 0; coll < WEFT_COLL_COUNT; coll++)
                wanted |= o->colls[coll] && weft_algo_serves(a, v, coll);
            if (!wanted)
                continue;
            char name[32];
            weft_comm_t *c = &j->comm[a * WEFT_VAR_COUNT + v];
            TRY("weft_comm_split", weft_comm_split(j->world, 0, j->rank, c));
            TRY("weft_comm_set_algo",
                weft_comm_set_algo(*c, weft_plan_name((struct weft_plan){a, v}, name,
                                                      sizeof(name))));
        }
    return WEFT_OK;
}

/* Rank 0: the file's path (-o, else where jobs look), its folders made
 * when it is the default one. */
static bool out_path(const struct opts *o, char *path, size_t len)
{
    bool named;
    if (o->out) {
        snprintf(path, len, "%s", o->out);
        return true;
    }
    if (!weft_tune_file_path(path, len, &named)) {
        fprintf(stderr, "weft-tune: no HOME, XDG_CACHE_HOME or WEFT_TUNE_FILE: say -o FILE\n");
        return false;
    }
    for (char *s = path + 1; !named && (s = strchr(s, '/')) != NULL; s++) {
        *s = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            fprintf(stderr, "weft-tune: cannot make %s: %s\n", path, strerror(errno));
            return false;
        }
        *s = '/';
    }
    return true;
}

int main(int argc, char **argv)
{
    struct opts o;
    struct job job = {0}, *j = &job;
    const char *r = getenv("WEFT_RANK");
    int rc = parse(argc, argv, &o);
    if (rc != 0)
        return rc == 1 ? 0 : 2;
    weft_status_t st = weft_comm_init_env(&j->world);
    if (st != WEFT_OK) {
        fprintf(stderr, "weft-tune: rank %s: weft_comm_init_env: %s (run it under weftrun -n N "
                "or mpirun)\n", r ? r : "?", weft_last_error(NULL));
        return 1;
    }
    weft_comm_rank(j->world, &j->rank);
    weft_comm_size(j->world, &j->nranks);
    char *key = weft_tune_shape_key(&j->world->topo), *body = NULL, path[4096], err[1024];
    size_t blen = 0;
    int32_t fail = 0;
    if (j->nranks < 2 || key == NULL) {
        if (j->rank == 0)
            fprintf(stderr, "weft-tune: %s\n", key ? "one rank has nothing to choose: run it "
                    "under weftrun -n N" : "out of memory");
        goto out;
    }
    fail = j->rank == 0 && !out_path(&o, path, sizeof(path));
    if ((st = weft_allreduce(&fail, &fail, 1, WEFT_INT32, WEFT_MAX, j->world)) != WEFT_OK || fail)
        goto out;
    /* Every plan, whatever WEFT_ALGO says. */
    if ((st = weft_comm_set_algo(j->world, NULL)) != WEFT_OK || (st = open_plans(j, &o)) != WEFT_OK)
        goto out;
    size_t bytes = (size_t)j->nranks * o.maxbytes;
    j->send = perf_alloc_touched(bytes);
    j->recv = perf_alloc_touched(bytes);
    fail = j->send == NULL || j->recv == NULL;
    if ((st = weft_allreduce(&fail, &fail, 1, WEFT_INT32, WEFT_MAX, j->world)) != WEFT_OK || fail) {
        if (st == WEFT_OK && j->rank == 0)
            fprintf(stderr, "weft-tune: out of memory for 2 x %zu bytes (lower -e)\n", bytes);
        goto out;
    }
    if (j->rank == 0)
        printf("# weft-tune: [%s], %zu..%zu bytes, budget %.0f s\n", key, o.minbytes, o.maxbytes,
               o.budget);
    time_t now = time(NULL);
    char when[32];
    strftime(when, sizeof(when), "%Y-%m-%d %H:%M", localtime(&now));
    if (j->rank == 0 &&
        !append(&body, &blen, "# weft-tune %s, weft %d.%d.%d: %zu..%zu bytes; us per call (the "
                "slowest rank's, median of the rounds)\n", when, WEFT_VERSION_MAJOR,
                WEFT_VERSION_MINOR, WEFT_VERSION_PATCH, o.minbytes, o.maxbytes))
        st = WEFT_ERR_NO_MEMORY;
    if (st != WEFT_OK || (st = tune_all(j, &o, &body, &blen)) != WEFT_OK)
        goto out;
    if (j->rank == 0) {
        fail = weft_tune_file_write(path, key, body, err, sizeof(err)) != WEFT_OK;
        if (fail)
            fprintf(stderr, "weft-tune: %s; the file is unchanged\n", err);
        else
            printf("# weft-tune: wrote [%s] to %s (%.1f s)\n", key, path,
                   (perf_now_us() - j->t0) * 1e-6);
    }
    st = weft_allreduce(&fail, &fail, 1, WEFT_INT32, WEFT_MAX, j->world);
out:
    for (int i = 0; i < NPLANS; i++)
        weft_comm_destroy(j->comm[i]);
    if (st != WEFT_OK) {
        fprintf(stderr, "weft-tune: rank %d: %s: %s\n", j->rank, weft_status_string(st),
                weft_last_error(j->world));
        weft_comm_abort(j->world);
    } else {
        weft_comm_destroy(j->world);
    }
    free(j->send);
    free(j->recv);
    free(key);
    free(body);
    return st != WEFT_OK || fail || j->nranks < 2 ? 1 : 0;
}
