/*
 * mpi_coll_perf.c - the MPI twin of weft's perf tools, for side-by-side
 * comparisons: same flags (a subset), same timing method, same columns.
 * float / sum only.  Not built by automake; see bench/README.md:
 *     mpicc -O2 bench/mpi_coll_perf.c -o /tmp/mpi_coll_perf
 *     mpirun -np 2 /tmp/mpi_coll_perf -C allreduce -b 8 -e 64M -f 2
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../perf/util.h" /* relative: mpicc gets no -I */

#define PERIOD 251 /* inputs repeat with this period in the element index */

enum coll { C_ALLREDUCE, C_REDUCE_SCATTER, C_ALLGATHER, C_BROADCAST, C_REDUCE, C_NUM };
static const char *const coll_names[C_NUM] = {"allreduce", "reduce_scatter", "allgather",
                                              "broadcast", "reduce"};

/* The command line; a value. */
struct opts {
    enum coll coll;
    size_t minbytes, maxbytes, stepbytes;
    long stepfactor, iters, warmup, check, root;
};

static int rank, nranks;

/* Inputs are small integers so every float sum is exact in any order.
 * Reductions: rank r's element i is (i + r) % 7 - 3, the sum is exact.
 * Copies (allgather, broadcast): (i + r) % 251 - 125. */
static float value_sum(int r, size_t i)
{
    return (float)((i + (size_t)r) % 7) - 3.0f;
}

static float value_raw(int r, size_t i)
{
    return (float)((i + (size_t)r) % PERIOD) - 125.0f;
}

static float sum_table[7]; /* the reduced value at element i is sum_table[i % 7] */

static float expected_sum(size_t i)
{
    return sum_table[i % 7];
}

static double bus_factor(enum coll c)
{
    switch (c) {
    case C_ALLREDUCE: return 2.0 * (nranks - 1) / nranks;
    case C_REDUCE_SCATTER:
    case C_ALLGATHER: return (double)(nranks - 1) / nranks;
    default: return 1.0;
    }
}

static int parse_long(const char *s, long min, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min)
        return -1;
    *out = v;
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: mpi_coll_perf -C allreduce|reduce_scatter|allgather|broadcast|reduce\n"
               "       [-b minbytes] [-e maxbytes] [-i stepbytes] [-f stepfactor] [-n iters]\n"
               "       [-w warmup] [-c 0/1] [-r root]   (float, sum; sizes take K/M/G)\n");
}

/* 0: run; 1: help printed; -1: bad arguments (message printed by rank 0). */
static int parse(int argc, char **argv, struct opts *o)
{
    o->coll = C_NUM;
    o->minbytes = o->maxbytes = 32u << 20;
    o->stepbytes = 1u << 20;
    o->stepfactor = 1;
    o->iters = 20;
    o->warmup = 5;
    o->check = 1;
    o->root = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (strcmp(a, "-h") == 0) {
            if (rank == 0)
                usage(stdout);
            return 1;
        }
        if (a[0] != '-' || a[1] == '\0' || a[2] != '\0' || v == NULL) {
            bad = 1;
        } else {
            switch (a[1]) {
            case 'b': bad = perf_parse_size(v, &o->minbytes); break;
            case 'e': bad = perf_parse_size(v, &o->maxbytes); break;
            case 'i': bad = perf_parse_size(v, &o->stepbytes); break;
            case 'f': bad = parse_long(v, 1, &o->stepfactor); break;
            case 'n': bad = parse_long(v, 1, &o->iters); break;
            case 'w': bad = parse_long(v, 0, &o->warmup); break;
            case 'c': bad = parse_long(v, 0, &o->check); break;
            case 'r': bad = parse_long(v, 0, &o->root); break;
            case 'C':
                bad = 1;
                for (int c = 0; c < C_NUM; c++)
                    if (strcmp(v, coll_names[c]) == 0)
                        o->coll = (enum coll)c, bad = 0;
                break;
            default: bad = 1; break;
            }
            i++;
        }
        if (bad) {
            if (rank == 0) {
                fprintf(stderr, "mpi_coll_perf: bad argument '%s%s%s'\n", a, v ? " " : "",
                        v ? v : "");
                usage(stderr);
            }
            return -1;
        }
    }
    const char *bad = NULL;
    if (o->coll == C_NUM)
        bad = "-C is required";
    else if (o->minbytes > o->maxbytes)
        bad = "-b is larger than -e";
    else if (o->stepfactor <= 1 && o->stepbytes == 0 && o->minbytes < o->maxbytes)
        bad = "-i 0 with -f 1 never reaches -e";
    else if (o->root >= nranks)
        bad = "-r is not a rank of this job";
    else if (o->maxbytes / sizeof(float) > INT_MAX)
        bad = "-e is beyond MPI's int counts";
    if (bad) {
        if (rank == 0)
            fprintf(stderr, "mpi_coll_perf: %s\n", bad);
        return -1;
    }
    return 0;
}

/* One call: c is MPI's count argument (per rank for reduce_scatter and
 * allgather).  In place follows MPI: MPI_IN_PLACE on the receive side;
 * broadcast has a single buffer, so both of its columns run the same call. */
static void run(const struct opts *o, float *sbuf, float *rbuf, int c, int in_place)
{
    const void *s = in_place ? MPI_IN_PLACE : sbuf;
    int root = (int)o->root;
    switch (o->coll) {
    case C_ALLREDUCE: MPI_Allreduce(s, rbuf, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); break;
    case C_REDUCE_SCATTER:
        MPI_Reduce_scatter_block(s, rbuf, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        break;
    case C_ALLGATHER:
        MPI_Allgather(s, c, MPI_FLOAT, rbuf, c, MPI_FLOAT, MPI_COMM_WORLD);
        break;
    case C_BROADCAST: MPI_Bcast(rbuf, c, MPI_FLOAT, root, MPI_COMM_WORLD); break;
    case C_REDUCE:
        if (in_place && rank != root)
            s = rbuf; /* MPI_IN_PLACE is for the root only */
        MPI_Reduce(s, rbuf, c, MPI_FLOAT, MPI_SUM, root, MPI_COMM_WORLD);
        break;
    default: break;
    }
}

/* Fills the inputs with the pattern and the outputs with NaN, runs once and
 * counts the wrong output elements of this rank. */
static long check(const struct opts *o, float *sbuf, float *rbuf, size_t c, int in_place)
{
    size_t n = (size_t)nranks, r = (size_t)rank, i;
    long wrong = 0;
    size_t out_count = o->coll == C_ALLGATHER ? c * n : c;
    for (i = 0; i < out_count; i++)
        rbuf[i] = __builtin_nanf("");
    switch (o->coll) {
    case C_ALLREDUCE:
    case C_REDUCE:
        for (i = 0; i < c; i++)
            (in_place ? rbuf : sbuf)[i] = value_sum(rank, i);
        break;
    case C_REDUCE_SCATTER:
        for (i = 0; i < c * n; i++)
            (in_place ? rbuf : sbuf)[i] = value_sum(rank, i);
        break;
    case C_ALLGATHER:
        for (i = 0; i < c; i++)
            (in_place ? rbuf + r * c : sbuf)[i] = value_raw(rank, i);
        break;
    case C_BROADCAST:
        if (rank == o->root)
            for (i = 0; i < c; i++)
                rbuf[i] = value_raw(rank, i);
        break;
    default: break;
    }
    run(o, sbuf, rbuf, (int)c, in_place);
    for (i = 0; i < out_count; i++) {
        float want;
        switch (o->coll) {
        case C_ALLREDUCE: want = expected_sum(i); break;
        case C_REDUCE:
            if (rank != o->root)
                return 0;
            want = expected_sum(i);
            break;
        case C_REDUCE_SCATTER: want = expected_sum(r * c + i); break;
        case C_ALLGATHER: want = value_raw((int)(i / c), i % c); break;
        default: want = value_raw((int)o->root, i); break;
        }
        wrong += rbuf[i] != want;
    }
    return wrong;
}

/* Times one placement of one size; the time is the maximum over ranks. */
static void measure(const struct opts *o, float *sbuf, float *rbuf, size_t c, int in_place,
                    double *us, long *wrong)
{
    /* Zeros: a sum repeated in place stays finite while timing. */
    size_t total = o->coll == C_REDUCE_SCATTER || o->coll == C_ALLGATHER ? c * nranks : c;
    memset(sbuf, 0, total * sizeof(float));
    memset(rbuf, 0, total * sizeof(float));
    for (long i = 0; i < o->warmup; i++)
        run(o, sbuf, rbuf, (int)c, in_place);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = perf_now_us();
    for (long i = 0; i < o->iters; i++)
        run(o, sbuf, rbuf, (int)c, in_place);
    double t = (perf_now_us() - t0) / (double)o->iters;
    MPI_Allreduce(MPI_IN_PLACE, &t, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    *us = t;
    *wrong = -1;
    if (o->check) {
        long w = check(o, sbuf, rbuf, c, in_place);
        MPI_Allreduce(&w, wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    }
}

static void print_header(const struct opts *o)
{
    char lib[MPI_MAX_LIBRARY_VERSION_STRING], host[64] = "unknown", *all = NULL;
    int len = 0;
    MPI_Get_library_version(lib, &len);
    lib[strcspn(lib, ",\n")] = '\0';
    gethostname(host, sizeof(host) - 1);
    int pid = (int)getpid(), *pids = rank == 0 ? malloc(sizeof(int) * nranks) : NULL;
    all = rank == 0 ? malloc(sizeof(host) * nranks) : NULL;
    MPI_Gather(&pid, 1, MPI_INT, pids, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Gather(host, sizeof(host), MPI_CHAR, all, sizeof(host), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        char step[48];
        perf_step_text(step, sizeof(step), o->stepfactor, o->stepbytes);
        printf("# mpi_coll_perf %s (%s)\n", coll_names[o->coll], lib);
        printf("# nRanks %d minBytes %zu maxBytes %zu step: %s warmup iters: %ld iters: %ld "
               "validation: %ld\n#\n# Using ranks\n",
               nranks, o->minbytes, o->maxbytes, step, o->warmup, o->iters, o->check);
        for (int r = 0; r < nranks; r++) {
            all[(r + 1) * sizeof(host) - 1] = '\0';
            printf("#  Rank %2d Pid %6d on %10s\n", r, pids[r], all + r * sizeof(host));
        }
        printf("#\n");
        perf_print_columns();
        fflush(stdout);
    }
    free(pids);
    free(all);
}

int main(int argc, char **argv)
{
    struct opts o;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    int rc = parse(argc, argv, &o);
    if (rc != 0) {
        MPI_Finalize();
        return rc > 0 ? 0 : 2;
    }
    size_t bytes_max = o.maxbytes ? o.maxbytes : 1;
    float *sbuf = perf_alloc_touched(bytes_max), *rbuf = perf_alloc_touched(bytes_max);
    int failed = sbuf == NULL || rbuf == NULL;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (failed) {
        if (rank == 0)
            fprintf(stderr, "mpi_coll_perf: cannot allocate 2 x %zu bytes\n", bytes_max);
        MPI_Finalize();
        return 1;
    }
    for (int k = 0; k < 7; k++)
        for (int r = 0; r < nranks; r++)
            sum_table[k] += value_sum(r, (size_t)k);
    print_header(&o);

    int split = o.coll == C_REDUCE_SCATTER || o.coll == C_ALLGATHER;
    int has_root = o.coll == C_BROADCAST || o.coll == C_REDUCE;
    int has_op = o.coll != C_ALLGATHER && o.coll != C_BROADCAST;
    double bw_sum = 0.0;
    long bw_count = 0, wrong_total = 0;
    for (size_t bytes = o.minbytes;;) {
        size_t total = bytes / sizeof(float);
        if (split)
            total = total / nranks * nranks;
        size_t c = split ? total / nranks : total;
        double us[2];
        long wrong[2];
        for (int place = 0; place < 2; place++)
            measure(&o, sbuf, rbuf, c, place, &us[place], &wrong[place]);
        if (rank == 0) {
            printf("%12zu  %12zu  %8s  %6s  %6d", total * sizeof(float), total, "float",
                   has_op ? "sum" : "none", has_root ? (int)o.root : -1);
            for (int place = 0; place < 2; place++) {
                double algbw = us[place] > 0 ? (double)(total * sizeof(float)) / 1e3 / us[place] : 0;
                char t[32], w[32];
                snprintf(t, sizeof(t), us[place] >= 10000.0 ? "%7.0f" : us[place] >= 100.0 ? "%7.1f"
                                                                                          : "%7.2f",
                         us[place]);
                if (wrong[place] < 0)
                    snprintf(w, sizeof(w), "N/A");
                else
                    snprintf(w, sizeof(w), "%ld", wrong[place]);
                printf("  %7s  %6.2f  %6.2f  %6s", t, algbw, algbw * bus_factor(o.coll), w);
                bw_sum += algbw * bus_factor(o.coll);
                bw_count++;
            }
            printf("\n");
            fflush(stdout);
        }
        for (int place = 0; place < 2; place++)
            wrong_total += wrong[place] > 0 ? wrong[place] : 0;
        if (o.stepfactor > 1) {
            if (bytes > o.maxbytes / (size_t)o.stepfactor)
                break;
            bytes = bytes ? bytes * (size_t)o.stepfactor : 1;
        } else {
            if (o.stepbytes == 0 || bytes > o.maxbytes - o.stepbytes)
                break;
            bytes += o.stepbytes;
        }
        if (bytes > o.maxbytes)
            break;
    }
    if (rank == 0) {
        printf("# Out of bounds values : %ld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n#\n", bw_count ? bw_sum / bw_count : 0.0);
    }
    free(sbuf);
    free(rbuf);
    MPI_Finalize();
    return wrong_total ? 1 : 0;
}
