/*
 * soak.c - weft-soak: a long run of random collectives, every result
 * checked, and a watch on the process's open fds, RSS and weft's /dev/shm
 * files, which must not grow once the run is warm.  Every rank draws the
 * same operations from a shared seed (collective, size, dtype, op, root,
 * placement, blocking or not, now and then a split communicator), so no
 * rank needs a reference run: the expected values come from perf/pattern.h.
 * The algorithm is weft's choice per call; WEFT_ALGO (--algo) narrows it
 * and tools/soak.sh runs each setting.  Written against weft.h only.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <weft.h>

#include "perf/common.h"
#include "perf/pattern.h"
#include "soak_usage.h"

#define SOAK_SEED 0x5eedc0ffee2026ull
#define SOAK_MAX_OFF 7          /* elements: buffers start 0..7 elements in */
#define SOAK_PAD (SOAK_MAX_OFF * PERF_MAX_ELEM)

typedef enum {
    SOAK_ALLREDUCE,
    SOAK_REDUCE_SCATTER,
    SOAK_ALLGATHER,
    SOAK_BROADCAST,
    SOAK_REDUCE,
    SOAK_SENDRECV, /* to rank + shift, from rank - shift, in a group or non-blocking */
    SOAK_NCOLLS
} soak_coll_t;

/* How the call is made. */
typedef enum { SOAK_BLOCKING, SOAK_WAIT, SOAK_TEST, SOAK_NMODES } soak_mode_t;

static const char *const coll_names[SOAK_NCOLLS] = {
    "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "sendrecv"};
static const char *const mode_names[SOAK_NMODES] = {"blocking", "nonblocking+wait",
                                                    "nonblocking+test"};
static const char *const dtype_names[WEFT_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"};
static const char *const op_names[WEFT_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

/* The command line, parsed once; a value. */
typedef struct {
    uint64_t seed;
    uint64_t iters;       /* operations to run */
    uint64_t start;       /* index of the first one (to replay a failure) */
    uint64_t report;      /* rank 0 prints progress every this many */
    uint64_t warmup;      /* the resource baseline is taken after this many */
    uint64_t split_every; /* every this many, one op runs on a fresh split; 0 never */
    size_t max_bytes;
    size_t rss_slack;     /* bytes RSS may grow after the warm-up (see soak_parse) */
    const char *algo;     /* --algo, or NULL */
} soak_opts_t;

/* One operation: a pure function of (seed, index) and the size of the
 * communicator it runs on, so every rank of that communicator draws the
 * same one. */
typedef struct {
    uint64_t index;
    soak_coll_t coll;
    weft_dtype_t dtype;
    weft_op_t op;        /* reductions only */
    size_t count;        /* the call's count: per rank for reduce_scatter and allgather */
    size_t bytes;        /* the size drawn: the largest buffer of the call */
    int root;            /* broadcast, reduce */
    int shift;           /* sendrecv: 0 (to itself) .. nranks-1 */
    int in_place;
    soak_mode_t mode;
    unsigned phase;      /* element i holds the pattern's value at (i + phase) % PERIOD */
    size_t send_off, recv_off; /* elements */
    int null_unused;     /* NULL for the buffers this rank's call may not touch */
    uint64_t split_draw; /* drawn for the split, when this op runs on one */
    int on_split;        /* set by soak_step: it runs on a split communicator */
} soak_op_t;

/* The pattern of one (dtype, op, reduces) for one rank count, and its
 * tables; pattern_fit searches, so the fits are cached. */
typedef struct {
    int nranks; /* 0: not fitted yet */
    perf_pattern_t pat;
} soak_fit_t;

/* The run's state; lives in main's frame.  The buffers are allocated once
 * at the largest size and reused by every operation. */
typedef struct {
    soak_opts_t opt;
    weft_comm_t world;
    int rank, nranks;                   /* in world */
    unsigned char *sendbase, *recvbase; /* bufbytes each */
    size_t bufbytes;
    soak_shm_t shm;                     /* weft's segment files, ours noted */
    soak_fit_t fits[WEFT_NUM_DTYPES][WEFT_NUM_OPS + 1]; /* [op] or [NUM_OPS]: no reduction */
    unsigned char tab_in[PERF_TAB_BYTES], tab_want[PERF_TAB_BYTES];
    unsigned char tab_poison[PERF_TAB_BYTES];
    uint64_t per_coll[SOAK_NCOLLS], per_mode[SOAK_NMODES], in_place, zero, splits;
    size_t largest;
    double total_bytes;                 /* of the sizes drawn */
} soak_ctx_t;

/* ---- the shared random sequence ------------------------------------------- */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Each op seeds its own stream, so an op depends on (seed, index) alone:
 * replaying op k (--start k) does not need the ops before it. */
static uint64_t op_stream(uint64_t seed, uint64_t index)
{
    uint64_t s = seed ^ (index * 0xd1b54a32d192ed03ull);
    return splitmix64(&s);
}

static uint64_t draw(uint64_t *s, uint64_t n)
{
    return splitmix64(s) % n;
}

/* Log-uniform in [1, max] (so every power of two is as likely as the
 * next), and 0 one time in 32. */
static size_t draw_bytes(uint64_t *s, size_t max)
{
    uint64_t u = splitmix64(s);
    if (max == 0 || u % 32 == 0)
        return 0;
    double x = (double)(splitmix64(s) >> 11) * 0x1p-53;
    size_t b = (size_t)pow((double)max + 1.0, x);
    return b < 1 ? 1 : b > max ? max : b;
}

static int is_split_op(const soak_opts_t *o, uint64_t index)
{
    return o->split_every > 0 && (index + 1) % o->split_every == 0;
}

static void op_draw(const soak_opts_t *o, uint64_t index, int nranks, soak_op_t *op)
{
    uint64_t s = op_stream(o->seed, index);
    memset(op, 0, sizeof(*op));
    op->index = index;
    op->split_draw = splitmix64(&s);
    op->coll = (soak_coll_t)draw(&s, SOAK_NCOLLS);
    op->dtype = (weft_dtype_t)draw(&s, WEFT_NUM_DTYPES);
    op->op = (weft_op_t)draw(&s, WEFT_NUM_OPS);
    op->bytes = draw_bytes(&s, o->max_bytes);
    op->root = (int)draw(&s, (uint64_t)nranks);
    op->shift = (int)draw(&s, (uint64_t)nranks);
    op->in_place = op->coll != SOAK_SENDRECV && draw(&s, 2);
    op->mode = (soak_mode_t)draw(&s, SOAK_NMODES);
    op->phase = (unsigned)draw(&s, PERF_PERIOD);
    op->send_off = (size_t)draw(&s, SOAK_MAX_OFF + 1);
    op->recv_off = (size_t)draw(&s, SOAK_MAX_OFF + 1);
    op->null_unused = (int)draw(&s, 2);
    size_t ts = weft_dtype_size(op->dtype), elems = op->bytes / ts;
    int split = op->coll == SOAK_REDUCE_SCATTER || op->coll == SOAK_ALLGATHER;
    op->count = split ? elems / (size_t)nranks : elems;
}

/* ---- options -------------------------------------------------------------- */

/* base 0 takes 0x... (seeds); counts are decimal. */
static int parse_u64(const char *s, int base, uint64_t max, uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    if (errno || *end != '\0' || v > max)
        return -1;
    *out = v;
    return 0;
}

/* perf's sizes, bounded so that the few buffers of that size add up. */
static int parse_size(const char *s, size_t *out)
{
    size_t v;
    if (perf_parse_size(s, &v) != 0 || v > SIZE_MAX / 4)
        return -1;
    *out = v;
    return 0;
}

static void soak_usage(FILE *f)
{
    fprintf(f,
            "usage: weft-soak [options]   (one process per rank: weftrun -n N, mpirun, srun)\n"
            "Random collectives from a shared seed, every element checked; fds, RSS and\n"
            "weft's /dev/shm files must not grow after the warm-up.\n"
            "  -n, --iters N         operations (default 10000)\n"
            "  -e, --max-bytes SIZE  largest buffer of a call (default 4M; K/M/G suffixes);\n"
            "                        sizes are log-uniform in 1..SIZE, and 0 one time in 32\n"
            "  -s, --seed S          the shared seed (default 0x%llx)\n"
            "      --start K         index of the first operation (replays op K on)\n"
            "  -r, --report N        rank 0 prints progress every N operations (default 1000)\n"
            "  -w, --warmup N        resources are compared with those after N operations\n"
            "                        (default 1000; no comparison when --iters <= N)\n"
            "      --rss-slack SIZE  RSS growth allowed after the warm-up (default: twice\n"
            "                        --max-bytes, at least 8M)\n"
            "      --split-every N   every N-th operation runs on a fresh weft_comm_split\n"
            "                        communicator, destroyed after it (default 250; 0 never)\n"
            "  -a, --algo ALGO       sets WEFT_ALGO before init (ring, rd, ...)\n"
            "  -h, --help            this text\n",
            (unsigned long long)SOAK_SEED);
}

/* 0 to run, 1 for --help, -1 on a bad command line. */
static int soak_parse(int argc, char **argv, soak_opts_t *o)
{
    enum { O_START = 256, O_SLACK, O_SPLIT };
    static const struct option longopts[] = {
        {"iters", required_argument, NULL, 'n'},     {"max-bytes", required_argument, NULL, 'e'},
        {"seed", required_argument, NULL, 's'},      {"start", required_argument, NULL, O_START},
        {"report", required_argument, NULL, 'r'},    {"warmup", required_argument, NULL, 'w'},
        {"rss-slack", required_argument, NULL, O_SLACK},
        {"split-every", required_argument, NULL, O_SPLIT},
        {"algo", required_argument, NULL, 'a'},      {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    *o = (soak_opts_t){.seed = SOAK_SEED, .iters = 10000, .report = 1000, .warmup = 1000,
                       .split_every = 250, .max_bytes = 4u << 20};
    int slack_given = 0;
    const uint64_t big = UINT64_C(1) << 40;
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "n:e:s:r:w:a:h", longopts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 'n': if (parse_u64(optarg, 10, big, &o->iters)) bad = "--iters wants a count"; break;
        case 'e': if (parse_size(optarg, &o->max_bytes)) bad = "--max-bytes wants a size like 64K or 4M"; break;
        case 's': if (parse_u64(optarg, 0, UINT64_MAX, &o->seed)) bad = "--seed wants a number (0x... for hex)"; break;
        case O_START: if (parse_u64(optarg, 10, big, &o->start)) bad = "--start wants an op index"; break;
        case 'r': if (parse_u64(optarg, 10, big, &o->report) || o->report == 0) bad = "--report wants a count >= 1"; break;
        case 'w': if (parse_u64(optarg, 10, big, &o->warmup)) bad = "--warmup wants a count"; break;
        case O_SLACK: if (parse_size(optarg, &o->rss_slack)) bad = "--rss-slack wants a size like 16M"; slack_given = 1; break;
        case O_SPLIT: if (parse_u64(optarg, 10, big, &o->split_every)) bad = "--split-every wants a count"; break;
        case 'a': o->algo = optarg; break;
        case 'h': soak_usage(stdout); return 1;
        default: bad = "unknown option or missing argument"; break;
        }
        if (bad) {
            fprintf(stderr, "weft-soak: %s (got '%s')\n", bad,
                    c == '?' || c == ':' ? argv[optind - 1] : optarg);
            soak_usage(stderr);
            return -1;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "weft-soak: unexpected argument '%s'\n", argv[optind]);
        return -1;
    }
    /* What may still grow once warm: weft's scratch buffer, when a call
     * needs more than any before (at most --max-bytes, less what it had),
     * and malloc's per-thread arenas and cached thread stacks from the
     * split communicators' progress threads (measured well under 1 MiB).
     * A leak of 1 KiB per op, or of one ring per split, goes far beyond. */
    if (!slack_given)
        o->rss_slack = o->max_bytes > (4u << 20) ? 2 * o->max_bytes : 8u << 20;
    return 0;
}

/* ---- one operation -------------------------------------------------------- */

static const perf_pattern_t *soak_pattern(soak_ctx_t *ctx, const soak_op_t *op, int nranks)
{
    int reduces = op->coll == SOAK_ALLREDUCE || op->coll == SOAK_REDUCE_SCATTER ||
                  op->coll == SOAK_REDUCE;
    soak_fit_t *f = &ctx->fits[op->dtype][reduces ? (int)op->op : WEFT_NUM_OPS];
    if (f->nranks != nranks) {
        pattern_fit(&f->pat, op->dtype, op->op, reduces, nranks);
        f->nranks = nranks;
    }
    return &f->pat;
}

/* Where one operation puts its data on this rank. */
typedef struct {
    const void *sendbuf; /* the call's arguments */
    void *recvbuf;
    unsigned char *in;   /* this rank's input (NULL: it has none) */
    size_t in_count;
    int in_kept;         /* the input must be unchanged after the call */
    unsigned char *out;  /* the output (count per block), recvbuf without NULL */
    int out_expect;      /* 0: must still hold the poison (reduce off root) */
} soak_layout_t;

static void soak_layout(soak_ctx_t *ctx, const soak_op_t *op, int rank, int nranks,
                        soak_layout_t *l)
{
    size_t ts = weft_dtype_size(op->dtype), c = op->count, n = (size_t)nranks, r = (size_t)rank;
    unsigned char *send = ctx->sendbase + op->send_off * ts;
    unsigned char *recv = ctx->recvbase + op->recv_off * ts;
    int root = rank == op->root;
    memset(l, 0, sizeof(*l));
    l->in_count = op->coll == SOAK_REDUCE_SCATTER ? c * n : c;
    l->out_expect = 1;
    if (op->in_place) {
        l->out = recv;
        l->in = recv;
        if (op->coll == SOAK_REDUCE_SCATTER)
            l->out = recv + r * c * ts;
        else if (op->coll == SOAK_ALLGATHER)
            l->in = recv + r * c * ts;
        l->sendbuf = l->in;
        l->recvbuf = l->out;
        if (op->coll == SOAK_BROADCAST && !root)
            l->in = NULL; /* its buffer is all output */
        if (op->coll == SOAK_REDUCE && !root) {
            l->out = NULL; /* its buffer is only input, and must stay so */
            l->in_kept = 1;
        }
    } else {
        l->in = send;
        l->out = recv;
        l->in_kept = 1;
        l->sendbuf = send;
        l->recvbuf = recv;
        if (op->coll == SOAK_BROADCAST && !root && op->null_unused) {
            l->in = NULL;
            l->sendbuf = NULL;
        }
        if (op->coll == SOAK_REDUCE && !root) {
            l->out_expect = 0;
            if (op->null_unused)
                l->out = l->recvbuf = NULL;
        }
    }
    if (c == 0 && op->null_unused) {
        l->sendbuf = NULL;
        l->recvbuf = NULL;
    }
}

/* The expected table of output block b (the whole output is block 0
 * except for allgather) and the phase its first element has. */
static void soak_want(soak_ctx_t *ctx, const soak_op_t *op, const perf_pattern_t *p, int rank,
                      int nranks, int b, size_t *phase)
{
    *phase = op->phase;
    switch (op->coll) {
    case SOAK_ALLREDUCE:
    case SOAK_REDUCE:
        table_of_reduction(p, ctx->tab_want);
        break;
    case SOAK_REDUCE_SCATTER:
        table_of_reduction(p, ctx->tab_want);
        *phase = (op->phase + (size_t)rank * op->count) % PERF_PERIOD;
        break;
    case SOAK_ALLGATHER: table_of_rank(p, b, ctx->tab_want); break;
    case SOAK_BROADCAST: table_of_rank(p, op->root, ctx->tab_want); break;
    case SOAK_SENDRECV:
        table_of_rank(p, (rank - op->shift + nranks) % nranks, ctx->tab_want);
        break;
    default: break;
    }
}

static weft_status_t soak_call(const soak_op_t *op, const soak_layout_t *l, int rank, int nranks,
                               weft_comm_t comm)
{
    const void *s = l->sendbuf;
    void *r = l->recvbuf;
    size_t c = op->count;
    weft_dtype_t t = op->dtype;
    int to = (rank + op->shift) % nranks, from = (rank - op->shift + nranks) % nranks;
    weft_status_t st;
    if (op->mode == SOAK_BLOCKING) {
        switch (op->coll) {
        case SOAK_ALLREDUCE: return weft_allreduce(s, r, c, t, op->op, comm);
        case SOAK_REDUCE_SCATTER: return weft_reduce_scatter(s, r, c, t, op->op, comm);
        case SOAK_ALLGATHER: return weft_allgather(s, r, c, t, comm);
        case SOAK_BROADCAST: return weft_broadcast(s, r, c, t, op->root, comm);
        case SOAK_REDUCE: return weft_reduce(s, r, c, t, op->op, op->root, comm);
        case SOAK_SENDRECV:
            if ((st = weft_group_start()) != WEFT_OK)
                return st;
            weft_status_t s1 = weft_send(s, c, t, to, comm);
            weft_status_t s2 = weft_recv(r, c, t, from, comm);
            st = weft_group_end(); /* always: the group must be closed */
            return s1 != WEFT_OK ? s1 : s2 != WEFT_OK ? s2 : st;
        default: return WEFT_ERR_INTERNAL;
        }
    }
    weft_request_t req[2] = {NULL, NULL};
    int nreq = 1;
    switch (op->coll) {
    case SOAK_ALLREDUCE: st = weft_iallreduce(s, r, c, t, op->op, comm, &req[0]); break;
    case SOAK_REDUCE_SCATTER: st = weft_ireduce_scatter(s, r, c, t, op->op, comm, &req[0]); break;
    case SOAK_ALLGATHER: st = weft_iallgather(s, r, c, t, comm, &req[0]); break;
    case SOAK_BROADCAST: st = weft_ibroadcast(s, r, c, t, op->root, comm, &req[0]); break;
    case SOAK_REDUCE: st = weft_ireduce(s, r, c, t, op->op, op->root, comm, &req[0]); break;
    case SOAK_SENDRECV:
        nreq = 2;
        st = weft_irecv(r, c, t, from, comm, &req[0]);
        if (st == WEFT_OK)
            st = weft_isend(s, c, t, to, comm, &req[1]);
        break;
    default: return WEFT_ERR_INTERNAL;
    }
    if (st != WEFT_OK)
        return st; /* the caller aborts the communicator, which voids the requests */
    for (int i = 0; i < nreq; i++) {
        weft_status_t w;
        if (op->mode == SOAK_WAIT) {
            w = weft_wait(req[i]);
        } else {
            /* WEFT_INPROGRESS until done; then the op's status. */
            int done = 0;
            while ((w = weft_test(req[i], &done)) == WEFT_INPROGRESS && !done)
                sched_yield();
        }
        if (st == WEFT_OK)
            st = w;
    }
    return st;
}

/* The op, for messages; rank and nranks are those of the communicator it
 * ran on. */
static void soak_describe(const soak_op_t *op, int rank, int nranks, char *buf, size_t len)
{
    int reduces = op->coll == SOAK_ALLREDUCE || op->coll == SOAK_REDUCE_SCATTER ||
                  op->coll == SOAK_REDUCE;
    int rooted = op->coll == SOAK_BROADCAST || op->coll == SOAK_REDUCE;
    char extra[32] = "", where[64] = "";
    if (rooted)
        snprintf(extra, sizeof(extra), " root %d", op->root);
    else if (op->coll == SOAK_SENDRECV)
        snprintf(extra, sizeof(extra), " shift %d", op->shift);
    if (op->on_split)
        snprintf(where, sizeof(where), " of a split communicator, where this is rank %d", rank);
    snprintf(buf, len, "op %" PRIu64 ": %s %s%s%s count %zu%s on %d ranks%s, %s, %s", op->index,
             coll_names[op->coll], dtype_names[op->dtype], reduces ? " " : "",
             reduces ? op_names[op->op] : "", op->count, extra, nranks, where,
             op->in_place ? "in place" : "out of place", mode_names[op->mode]);
}

/* Compares count elements at buf with the table; on the first difference
 * says where and returns -1. */
static int soak_compare(const soak_ctx_t *ctx, const soak_op_t *op, int rank, int nranks,
                        const char *what, const unsigned char *buf, size_t base, size_t count,
                        const unsigned char *tab, size_t phase)
{
    size_t ts = weft_dtype_size(op->dtype), first = 0;
    int64_t wrong = buffer_wrong(buf, count, ts, tab, phase, &first);
    if (wrong == 0)
        return 0;
    char desc[256];
    soak_describe(op, rank, nranks, desc, sizeof(desc));
    fprintf(stderr,
            "weft-soak: rank %d: %s: %s element %zu is %.17g, expected %.17g "
            "(%" PRId64 " of %zu elements wrong)\n",
            ctx->rank, desc, what, base + first, value_load(op->dtype, buf + first * ts),
            value_load(op->dtype, tab + (phase + first) % PERF_PERIOD * ts), wrong, count);
    fprintf(stderr,
            "weft-soak: replay it (%d ranks, the same WEFT_* environment): weft-soak --seed 0x%"
            PRIx64 " --start %" PRIu64 " --iters 1 --max-bytes %zu --split-every %" PRIu64 "\n",
            ctx->nranks, ctx->opt.seed, op->index, ctx->opt.max_bytes, ctx->opt.split_every);
    return -1;
}

/* Runs one operation on comm and checks everything it wrote and left.
 * 0 when right, -1 after a message. */
static int soak_run_op(soak_ctx_t *ctx, const soak_op_t *op, weft_comm_t comm, int rank,
                       int nranks)
{
    const perf_pattern_t *p = soak_pattern(ctx, op, nranks);
    size_t ts = weft_dtype_size(op->dtype), c = op->count;
    soak_layout_t l;
    soak_layout(ctx, op, rank, nranks, &l);

    /* Every output block is poisoned (so a block nobody wrote is caught),
     * then the input written, which for in place overwrites its block. */
    int nblocks = op->coll == SOAK_ALLGATHER ? nranks : 1;
    for (int b = 0; l.out && b < nblocks; b++) {
        size_t phase;
        soak_want(ctx, op, p, rank, nranks, b, &phase);
        table_poison(ctx->tab_want, ts, ctx->tab_poison);
        buffer_fill(l.out + (size_t)b * c * ts, c, ts, ctx->tab_poison, phase);
    }
    table_of_rank(p, rank, ctx->tab_in);
    if (l.in)
        buffer_fill(l.in, l.in_count, ts, ctx->tab_in, op->phase);

    weft_status_t st = soak_call(op, &l, rank, nranks, comm);
    if (st != WEFT_OK) {
        char desc[256];
        soak_describe(op, rank, nranks, desc, sizeof(desc));
        fprintf(stderr, "weft-soak: rank %d: %s: failed: %s: %s\n", ctx->rank, desc,
                weft_status_string(st), weft_last_error(comm));
        return -1;
    }

    for (int b = 0; l.out && b < nblocks; b++) {
        size_t phase, base = (size_t)b * c;
        char what[48] = "recvbuf";
        soak_want(ctx, op, p, rank, nranks, b, &phase);
        if (op->coll == SOAK_ALLGATHER)
            snprintf(what, sizeof(what), "recvbuf (block of rank %d)", b);
        const unsigned char *want = ctx->tab_want;
        if (!l.out_expect) {
            table_poison(ctx->tab_want, ts, ctx->tab_poison);
            want = ctx->tab_poison;
            snprintf(what, sizeof(what), "recvbuf off the root (must stay unwritten)");
        }
        if (soak_compare(ctx, op, rank, nranks, what, l.out + base * ts, base, c, want, phase))
            return -1;
    }
    if (l.in && l.in_kept &&
        soak_compare(ctx, op, rank, nranks, "sendbuf (must stay unchanged)", l.in, 0, l.in_count,
                     ctx->tab_in, op->phase))
        return -1;
    return 0;
}

/* One op, on world or on a communicator split from it for this op alone. */
static int soak_step(soak_ctx_t *ctx, uint64_t index)
{
    weft_comm_t comm = ctx->world, sub = NULL;
    int rank = ctx->rank, nranks = ctx->nranks, rc = 0;
    soak_op_t op;
    if (is_split_op(&ctx->opt, index)) {
        /* Each rank's color and key from the op's stream and its rank: two
         * groups, some ranks in none, keys that reorder them. */
        op_draw(&ctx->opt, index, nranks, &op);
        uint64_t s = op.split_draw ^ ((uint64_t)(ctx->rank + 1) * 0x9e3779b97f4a7c15ull);
        int color = (int)draw(&s, 3) - 1, key = (int)draw(&s, 4);
        weft_status_t st = weft_comm_split(ctx->world, color < 0 ? WEFT_SPLIT_NOCOLOR : color, key,
                                           &sub);
        if (st == WEFT_OK && sub)
            st = weft_comm_rank(sub, &rank);
        if (st == WEFT_OK && sub)
            st = weft_comm_size(sub, &nranks);
        if (st != WEFT_OK) {
            fprintf(stderr, "weft-soak: rank %d: op %" PRIu64 ": weft_comm_split(color %d, key %d) "
                    "failed: %s: %s\n", ctx->rank, index, color, key, weft_status_string(st),
                    weft_last_error(sub ? sub : ctx->world));
            weft_comm_abort(sub);
            return -1;
        }
        ctx->splits++;
        if (sub == NULL)
            return 0; /* not in a group this time */
        soak_shm_note_jobs(&ctx->shm);
        comm = sub;
    }
    op_draw(&ctx->opt, index, nranks, &op);
    op.on_split = sub != NULL;
    rc = soak_run_op(ctx, &op, comm, rank, nranks);
    ctx->per_coll[op.coll]++;
    ctx->per_mode[op.mode]++;
    ctx->in_place += (uint64_t)op.in_place;
    ctx->zero += op.count == 0;
    if (op.bytes > ctx->largest)
        ctx->largest = op.bytes;
    ctx->total_bytes += (double)op.bytes;
    if (sub) {
        weft_status_t st = rc == 0 ? weft_comm_destroy(sub) : weft_comm_abort(sub);
        if (st != WEFT_OK && rc == 0) {
            fprintf(stderr, "weft-soak: rank %d: op %" PRIu64 ": destroying the split "
                    "communicator failed: %s: %s\n", ctx->rank, index, weft_status_string(st),
                    weft_last_error(NULL));
            rc = -1;
        }
    }
    return rc;
}

/* ---- the run -------------------------------------------------------------- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void soak_progress(const soak_ctx_t *ctx, uint64_t done, double t0, double *t_last,
                          uint64_t *done_last)
{
    double t = now_s();
    soak_usage_t u;
    soak_usage_read(&ctx->shm, &u);
    printf("# %8" PRIu64 " ops  %7.1f ops/s (%7.1f since the last line)  fds %" PRId64
           "  rss %.1f MiB (shmem %.1f)  %s weft files %" PRId64 " (ours %" PRId64 ")\n",
           done, (double)done / (t - t0), (double)(done - *done_last) / (t - *t_last), u.fds,
           (double)u.rss_kib / 1024.0, (double)u.rss_shmem_kib / 1024.0, ctx->shm.dir,
           u.shm_files, u.shm_ours);
    fflush(stdout);
    *t_last = t;
    *done_last = done;
}

/* Rank 0 prints every rank's usage at warm-up and at the end; each rank
 * judges its own.  0 when nothing grew beyond what is allowed. */
static int soak_judge(soak_ctx_t *ctx, const soak_usage_t *w, const soak_usage_t *e)
{
    enum { N = 7 };
    int64_t mine[N] = {w->fds,     e->fds,      w->rss_kib,  e->rss_kib,
                       w->shm_ours, e->shm_ours, e->shm_files};
    int64_t *all = calloc((size_t)ctx->nranks * N, sizeof(*all));
    int bad = 0;
    weft_status_t st = all ? weft_allgather(mine, all, N, WEFT_INT64, ctx->world)
                           : WEFT_ERR_NO_MEMORY;
    if (st != WEFT_OK) {
        fprintf(stderr, "weft-soak: rank %d: gathering the usage failed: %s: %s\n", ctx->rank,
                weft_status_string(st), weft_last_error(ctx->world));
        free(all);
        return -1;
    }
    if (ctx->rank == 0) {
        printf("# usage after the warm-up (%" PRIu64 " ops) and at the end:\n", ctx->opt.warmup);
        printf("#  rank   fds warm/end   RSS MiB warm/end (growth)   weft files in %s: "
               "ours warm/end (anyone's at the end)\n", ctx->shm.dir);
        for (int r = 0; r < ctx->nranks; r++) {
            const int64_t *a = all + N * r;
            printf("#  %4d   %4" PRId64 " / %-4" PRId64 "   %7.1f / %-7.1f (%+.1f)   %" PRId64
                   " / %" PRId64 " (%" PRId64 ")\n",
                   r, a[0], a[1], (double)a[2] / 1024.0, (double)a[3] / 1024.0,
                   (double)(a[3] - a[2]) / 1024.0, a[4], a[5], a[6]);
        }
        fflush(stdout);
    }
    free(all);
    if (e->fds != w->fds) {
        fprintf(stderr, "weft-soak: rank %d: open fds went from %" PRId64 " after the warm-up to %"
                PRId64 " at the end: a leak; now:", ctx->rank, w->fds, e->fds);
        soak_list_fds(stderr);
        fprintf(stderr, "\n");
        bad = 1;
    }
    if (e->rss_kib - w->rss_kib > (int64_t)(ctx->opt.rss_slack >> 10)) {
        fprintf(stderr, "weft-soak: rank %d: RSS grew by %.1f MiB after the warm-up (%.1f -> %.1f "
                "MiB), more than the %.1f MiB allowed (--rss-slack)\n", ctx->rank,
                (double)(e->rss_kib - w->rss_kib) / 1024.0, (double)w->rss_kib / 1024.0,
                (double)e->rss_kib / 1024.0, (double)ctx->opt.rss_slack / 1048576.0);
        bad = 1;
    }
    if (e->shm_ours != w->shm_ours) {
        int64_t ours;
        fprintf(stderr, "weft-soak: rank %d: files of this job's communicators in %s went from %"
                PRId64 " after the warm-up to %" PRId64 " at the end: a leak; now:", ctx->rank,
                ctx->shm.dir, w->shm_ours, e->shm_ours);
        soak_shm_count(&ctx->shm, &ours, stderr);
        fprintf(stderr, "\n");
        bad = 1;
    }
    return bad ? -1 : 0;
}

/* Before a resource reading: every rank is out of its last split, so no
 * peer is still between creating its segment and removing the name. */
static int soak_barrier(soak_ctx_t *ctx)
{
    int32_t one = 1;
    weft_status_t st = weft_allreduce(&one, &one, 1, WEFT_INT32, WEFT_SUM, ctx->world);
    if (st != WEFT_OK)
        fprintf(stderr, "weft-soak: rank %d: barrier failed: %s: %s\n", ctx->rank,
                weft_status_string(st), weft_last_error(ctx->world));
    return st == WEFT_OK ? 0 : -1;
}

/* Every rank must have been started with the same settings, or their
 * sequences differ and the first mismatch would be a riddle. */
static int soak_agree(soak_ctx_t *ctx)
{
    const soak_opts_t *o = &ctx->opt;
    uint64_t mine[5] = {o->seed, o->iters, o->start, o->max_bytes, o->split_every}, root[5];
    memcpy(root, mine, sizeof(root));
    weft_status_t st = weft_broadcast(root, root, 5, WEFT_UINT64, 0, ctx->world);
    if (st != WEFT_OK) {
        fprintf(stderr, "weft-soak: rank %d: broadcast of the settings failed: %s: %s\n",
                ctx->rank, weft_status_string(st), weft_last_error(ctx->world));
        return -1;
    }
    int32_t differ = memcmp(root, mine, sizeof(mine)) != 0;
    if (differ)
        fprintf(stderr, "weft-soak: rank %d: --seed, --iters, --start, --max-bytes or "
                "--split-every differ from rank 0's\n", ctx->rank);
    st = weft_allreduce(&differ, &differ, 1, WEFT_INT32, WEFT_MAX, ctx->world);
    return st == WEFT_OK && !differ ? 0 : -1;
}

static void soak_header(const soak_ctx_t *ctx)
{
    const soak_opts_t *o = &ctx->opt;
    const char *algo = getenv("WEFT_ALGO"), *tp = getenv("WEFT_TRANSPORT");
    printf("# weft-soak (weft %d.%d.%d): %d ranks, %" PRIu64 " ops from op %" PRIu64
           ", seed 0x%" PRIx64 "\n",
           WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH, ctx->nranks, o->iters,
           o->start, o->seed);
    printf("# sizes 0..%zu B (log-uniform), every dtype and op, split every %" PRIu64
           ", warm-up %" PRIu64 " ops, RSS slack %.1f MiB\n",
           o->max_bytes, o->split_every, o->warmup, (double)o->rss_slack / 1048576.0);
    printf("# WEFT_ALGO=%s  WEFT_TRANSPORT=%s\n",
           algo && *algo ? algo : "(unset: the cost model picks per call)",
           tp && *tp ? tp : "(unset: shm on this host, tcp otherwise)");
    fflush(stdout);
}

static void soak_summary(const soak_ctx_t *ctx, double secs, uint64_t done)
{
    printf("# %" PRIu64 " ops in %.1f s: %.1f ops/s; rank 0 ran", done, secs,
           secs > 0 ? (double)done / secs : 0.0);
    for (int c = 0; c < SOAK_NCOLLS; c++)
        printf(" %s %" PRIu64 ",", coll_names[c], ctx->per_coll[c]);
    uint64_t ran = 0;
    for (int c = 0; c < SOAK_NCOLLS; c++)
        ran += ctx->per_coll[c];
    printf(" %" PRIu64 " in place, %" PRIu64 " non-blocking, %" PRIu64 " of count 0; sizes: mean %.0f B,"
           " largest %zu B; %" PRIu64 " split communicators\n",
           ctx->in_place, ctx->per_mode[SOAK_WAIT] + ctx->per_mode[SOAK_TEST], ctx->zero,
           ran ? ctx->total_bytes / (double)ran : 0.0, ctx->largest, ctx->splits);
    fflush(stdout);
}

int main(int argc, char **argv)
{
    static soak_ctx_t ctx; /* static: the tables are large */
    int rc = soak_parse(argc, argv, &ctx.opt), exit_code = 1;
    if (rc != 0)
        return rc > 0 ? 0 : 2;
    const soak_opts_t *o = &ctx.opt;
    if (o->algo && setenv("WEFT_ALGO", o->algo, 1) != 0) {
        fprintf(stderr, "weft-soak: setenv WEFT_ALGO: %s\n", strerror(errno));
        return 1;
    }
    soak_shm_init(&ctx.shm);
    weft_status_t st = weft_comm_init_env(&ctx.world);
    if (st != WEFT_OK) {
        fprintf(stderr, "weft-soak: weft_comm_init_env failed: %s: %s\n", weft_status_string(st),
                weft_last_error(NULL));
        return 1;
    }
    if ((st = weft_comm_rank(ctx.world, &ctx.rank)) != WEFT_OK ||
        (st = weft_comm_size(ctx.world, &ctx.nranks)) != WEFT_OK) {
        fprintf(stderr, "weft-soak: weft_comm_rank/size failed: %s\n", weft_status_string(st));
        goto out_abort;
    }

    /* A local failure is agreed on before the first collective, so every
     * rank stops cleanly together. */
    int32_t failed = 0;
    ctx.bufbytes = o->max_bytes + SOAK_PAD + 1;
    ctx.sendbase = perf_alloc_touched(ctx.bufbytes);
    ctx.recvbase = perf_alloc_touched(ctx.bufbytes);
    if (ctx.sendbase == NULL || ctx.recvbase == NULL) {
        fprintf(stderr, "weft-soak: rank %d: cannot allocate 2 x %zu bytes\n", ctx.rank,
                ctx.bufbytes);
        failed = 1;
    }
    st = weft_allreduce(&failed, &failed, 1, WEFT_INT32, WEFT_MAX, ctx.world);
    if (st != WEFT_OK || failed || soak_agree(&ctx) != 0)
        goto out_abort;
    soak_shm_note_jobs(&ctx.shm);
    if (ctx.rank == 0)
        soak_header(&ctx);

    soak_usage_t warm = {0}, end = {0};
    int have_warm = 0;
    double t0 = now_s(), t_last = t0;
    uint64_t done = 0, done_last = 0;
    for (; done < o->iters; done++) {
        if (soak_step(&ctx, o->start + done) != 0)
            goto out_abort;
        if (done + 1 == o->warmup) {
            if (soak_barrier(&ctx) != 0)
                goto out_abort;
            soak_usage_read(&ctx.shm, &warm);
            have_warm = 1;
        }
        if (ctx.rank == 0 && (done + 1) % o->report == 0)
            soak_progress(&ctx, done + 1, t0, &t_last, &done_last);
    }
    double secs = now_s() - t0;
    if (ctx.rank == 0)
        soak_summary(&ctx, secs, done);
    exit_code = 0;
    if (have_warm && done > o->warmup) {
        if (soak_barrier(&ctx) != 0)
            goto out_abort;
        soak_usage_read(&ctx.shm, &end);
        if (soak_judge(&ctx, &warm, &end) != 0)
            exit_code = 1;
    } else if (ctx.rank == 0) {
        printf("# %" PRIu64 " ops are not more than the warm-up (%" PRIu64
               "): resource growth not checked\n", done, o->warmup);
    }
    st = weft_comm_destroy(ctx.world);
    if (st != WEFT_OK) {
        fprintf(stderr, "weft-soak: rank %d: weft_comm_destroy failed: %s: %s\n", ctx.rank,
                weft_status_string(st), weft_last_error(NULL));
        exit_code = 1;
    }
    if (ctx.rank == 0 && exit_code == 0)
        printf("# weft-soak: OK\n");
    goto out_free;
out_abort:
    weft_comm_abort(ctx.world);
    exit_code = 1;
out_free:
    soak_shm_fini(&ctx.shm);
    free(ctx.recvbase);
    free(ctx.sendbase);
    return exit_code;
}
