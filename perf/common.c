/*
 * common.c - the driver shared by all_reduce_perf & co.: flags, buffers, the
 * timing loop, the exact check of every result, the nccl-tests table on
 * rank 0 and the optional JSON file.  Uses the public weft.h API only; with
 * -G 1 the buffers it fills and checks are host copies of device ones
 * (gpu.c).
 */
#include "common.h"
#include "gpu.h"
#include "pattern.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PERF_MAX_REPORTS 8 /* per rank, so a broken build does not flood stderr */
#define PERF_MAX_PLANS 16  /* -A entries */
#define PERF_MAX_ROUNDS 64 /* -N */

static const char *const dtype_names[WEFT_NUM_DTYPES] = {
    "int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double", "bfloat16"};
static const char *const op_names[WEFT_NUM_OPS] = {"sum", "prod", "max", "min", "avg"};

/* -d accepts these aliases besides the printed names. */
static const struct {
    const char *name;
    weft_dtype_t dtype;
} dtype_aliases[] = {
    {"float16", WEFT_FLOAT16}, {"float32", WEFT_FLOAT32}, {"float64", WEFT_FLOAT64},
    {"bf16", WEFT_BFLOAT16},   {"fp16", WEFT_FLOAT16},    {"fp32", WEFT_FLOAT32},
    {"fp64", WEFT_FLOAT64},
};

/* One collective the tools measure: a static constant, never changed. */
typedef struct {
    const char *name;      /* "all_reduce", printed in the header */
    perf_kind_t kind;
    int has_op;            /* -o applies; the redop column shows "none" otherwise */
    int has_root;          /* -r applies; the root column shows -1 otherwise */
    int check_in_place;    /* 0 where in place aliases the data (sendrecv) */
    double (*bus_factor)(int nranks);  /* busbw = algbw * bus_factor(n) */
} perf_coll_t;

/* The bus factors of nccl-tests: what each rank's link carries per byte
 * of the size column. */
static double bus_allreduce(int n)
{
    return 2.0 * (n - 1) / n;
}

static double bus_split(int n) /* reduce_scatter, allgather */
{
    return (double)(n - 1) / n;
}

static double bus_one(int n) /* rooted and point to point */
{
    (void)n;
    return 1.0;
}

/* Every collective the tools measure, by kind.  In place, sendrecv sends
 * and receives the same buffer at once, so, as in nccl-tests, it is timed
 * but not checked. */
static const perf_coll_t perf_colls[] = {
    [PERF_KIND_ALLREDUCE] = {"all_reduce", PERF_KIND_ALLREDUCE, 1, 0, 1, bus_allreduce},
    [PERF_KIND_REDUCE_SCATTER] = {"reduce_scatter", PERF_KIND_REDUCE_SCATTER, 1, 0, 1, bus_split},
    [PERF_KIND_ALLGATHER] = {"all_gather", PERF_KIND_ALLGATHER, 0, 0, 1, bus_split},
    [PERF_KIND_BROADCAST] = {"broadcast", PERF_KIND_BROADCAST, 0, 1, 1, bus_one},
    [PERF_KIND_REDUCE] = {"reduce", PERF_KIND_REDUCE, 1, 1, 1, bus_one},
    [PERF_KIND_SENDRECV] = {"sendrecv", PERF_KIND_SENDRECV, 0, 0, 0, bus_one},
};

/* A ring: each rank sends to rank+1 and receives from rank-1 in one group. */
static weft_status_t perf_sendrecv(const perf_call_t *c, weft_comm_t comm)
{
    int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
    weft_status_t st = weft_group_start();
    if (st != WEFT_OK)
        return st;
    weft_status_t st_send = weft_send(c->sendbuf, c->count, c->dtype, next, comm);
    weft_status_t st_recv = weft_recv(c->recvbuf, c->count, c->dtype, prev, comm);
    /* The group must be closed even when queueing failed. */
    st = weft_group_end();
    return st_send != WEFT_OK ? st_send : st_recv != WEFT_OK ? st_recv : st;
}

/* -G 1: the same ring on the stream. */
static weft_status_t perf_sendrecv_stream(const perf_call_t *c, weft_comm_t comm)
{
    int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
    weft_status_t st = weft_group_start();
    if (st != WEFT_OK)
        return st;
    weft_status_t st_send = weft_send_stream(c->sendbuf, c->count, c->dtype, next, comm, c->stream);
    weft_status_t st_recv = weft_recv_stream(c->recvbuf, c->count, c->dtype, prev, comm, c->stream);
    st = weft_group_end();
    return st_send != WEFT_OK ? st_send : st_recv != WEFT_OK ? st_recv : st;
}

/* -G 1: the call is queued on c->stream and returns at once. */
static weft_status_t perf_run_stream(perf_kind_t kind, const perf_call_t *c, weft_comm_t comm)
{
    switch (kind) {
    case PERF_KIND_ALLREDUCE:
        return weft_allreduce_stream(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm,
                                     c->stream);
    case PERF_KIND_REDUCE_SCATTER:
        return weft_reduce_scatter_stream(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op,
                                          comm, c->stream);
    case PERF_KIND_ALLGATHER:
        return weft_allgather_stream(c->sendbuf, c->recvbuf, c->count, c->dtype, comm, c->stream);
    case PERF_KIND_BROADCAST:
        return weft_broadcast_stream(c->sendbuf, c->recvbuf, c->count, c->dtype, c->root, comm,
                                     c->stream);
    case PERF_KIND_REDUCE:
        return weft_reduce_stream(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->root,
                                  comm, c->stream);
    case PERF_KIND_SENDRECV:
        return perf_sendrecv_stream(c, comm);
    }
    return WEFT_ERR_INVALID_ARG;
}

/* The weft call a benchmark of this kind times. */
static weft_status_t perf_run(perf_kind_t kind, const perf_call_t *c, weft_comm_t comm)
{
    if (c->on_stream)
        return perf_run_stream(kind, c, comm);
    switch (kind) {
    case PERF_KIND_ALLREDUCE:
        return weft_allreduce(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm);
    case PERF_KIND_REDUCE_SCATTER:
        return weft_reduce_scatter(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm);
    case PERF_KIND_ALLGATHER:
        return weft_allgather(c->sendbuf, c->recvbuf, c->count, c->dtype, comm);
    case PERF_KIND_BROADCAST:
        return weft_broadcast(c->sendbuf, c->recvbuf, c->count, c->dtype, c->root, comm);
    case PERF_KIND_REDUCE:
        return weft_reduce(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, c->root, comm);
    case PERF_KIND_SENDRECV:
        return perf_sendrecv(c, comm);
    }
    return WEFT_ERR_INVALID_ARG;
}

/* The command line, parsed once; a value. */
typedef struct {
    size_t minbytes, maxbytes, stepbytes;
    long stepfactor;
    int iters, warmup, check, blocking;
    int dtype_all, op_all, root_all;
    int dtype;             /* -d: a weft_dtype_t */
    int op;                /* -o: a weft_op_t */
    int root;
    const char *algo;      /* -a, or NULL */
    const char *plans;     /* -A, or NULL */
    int rounds;            /* -N */
    const char *json_path; /* -J, or NULL */
    int reg;               /* -R: weft_mem_register the buffers */
    int gpu;               /* -G: buffers in GPU memory, calls on a stream */
} perf_opts_t;

/* One rank's line of the header, gathered to every rank. */
typedef struct {
    int32_t rank;
    int32_t pid;
    char host[64];
    int32_t dev;       /* -G 1: the device ordinal */
    char devname[64];  /* -G 1: its name */
} perf_rank_rec_t;

/* The state of one benchmark run; lives in perf_main's frame.  The buffers
 * are allocated once at the largest size and reused for every row. */
typedef struct {
    const perf_coll_t *coll;
    perf_opts_t opt;
    weft_comm_t comm;
    int rank, nranks;
    unsigned char *sendbuf, *recvbuf; /* bufbytes each, touched once */
    perf_gpu_t *gpu;                  /* -G 1: device twins of sendbuf and recvbuf */
    void *reg[2];                     /* -R: their registrations (the device ones with -G 1) */
    size_t bufbytes;
    double sync[1];
    int nplans;                             /* -A: entries, each on a communicator of its own */
    char *plan_list;                        /* -A's text, cut at the commas */
    const char *plan_name[PERF_MAX_PLANS];  /* into plan_list */
    weft_comm_t plan_comm[PERF_MAX_PLANS];  /* split from comm, then weft_comm_set_algo */
    FILE *json;      /* rank 0 with -J only */
    int json_rows;   /* rows written so far, for the commas */
    double bw_sum;   /* busbw of every timed placement, for the average */
    long bw_count;
    int64_t wrong_total;
    int reported;    /* wrong results described on stderr so far */
    /* Every round's time of the size being measured, per placement and
     * plan, in the order they ran (-J writes them with -N > 1). */
    double rounds_us[2][PERF_MAX_PLANS][PERF_MAX_ROUNDS];
    perf_pattern_t pat;
    unsigned char tab_in[PERF_TAB_BYTES], tab_want[PERF_TAB_BYTES], tab_tmp[PERF_TAB_BYTES];
} perf_ctx_t;

static weft_status_t perf_fail(perf_ctx_t *ctx, const char *what, weft_status_t st)
{
    fprintf(stderr, "# rank %d: %s failed: %s: %s\n", ctx->rank, what, weft_status_string(st),
            weft_last_error(ctx->comm));
    return st;
}

#define PERF_CHECK(ctx, what, call)                                                           \
    do {                                                                                      \
        weft_status_t st_ = (call);                                                           \
        if (st_ != WEFT_OK)                                                                   \
            return perf_fail((ctx), (what), st_);                                             \
    } while (0)

static int parse_int(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* The datatype -d names (its printed name or an alias), or -1. */
static long dtype_of(const char *s)
{
    for (int t = 0; t < WEFT_NUM_DTYPES; t++)
        if (strcmp(s, dtype_names[t]) == 0)
            return t;
    for (size_t k = 0; k < sizeof(dtype_aliases) / sizeof(dtype_aliases[0]); k++)
        if (strcmp(s, dtype_aliases[k].name) == 0)
            return (long)dtype_aliases[k].dtype;
    return -1;
}

/* The op -o names, or -1. */
static long op_of(const char *s)
{
    for (int k = 0; k < WEFT_NUM_OPS; k++)
        if (strcmp(s, op_names[k]) == 0)
            return k;
    return -1;
}

/* -d and -o: *all says whether s is "all"; otherwise lookup(s), when it
 * knows s, goes to *value.  0, or -1 when s is neither. */
static int parse_choice(const char *s, long (*lookup)(const char *), int *all, int *value)
{
    *all = strcmp(s, "all") == 0;
    long v = *all ? -1 : lookup(s);
    if (v >= 0)
        *value = (int)v;
    return *all || v >= 0 ? 0 : -1;
}

static void perf_usage(const perf_coll_t *coll, FILE *f)
{
    fprintf(f,
            "usage: %s_perf [options]   (one process per rank: weftrun -n N, mpirun, srun)\n"
            "  -b, --minbytes SIZE      smallest size (default 32M; K/M/G suffixes)\n"
            "  -e, --maxbytes SIZE      largest size (default 32M)\n"
            "  -i, --stepbytes SIZE     increment between sizes (default 1M)\n"
            "  -f, --stepfactor N       multiply sizes by N instead (default 1: use -i)\n"
            "  -n, --iters N            timed iterations per size (default 20)\n"
            "  -w, --warmup_iters N     untimed iterations before each size (default: 80 to\n"
            "                           1500, at least 60 ms; the automatic choice times\n"
            "                           its candidates on the first calls of each size)\n"
            "  -c, --check 0/1          check every result exactly (default 1)\n"
            "  -d, --datatype T         int8 uint8 int32 uint32 int64 uint64 half float\n"
            "                           double bfloat16 (or float16 float32 float64 bf16), all\n"
            "  -o, --op OP              sum prod max min avg, all (default sum)\n"
            "  -r, --root R             root rank, or all (-1 too) (default 0)\n"
            "  -z, --blocking 0/1       accepted; weft's calls always block\n"
            "  -a, --algo ALGO          sets WEFT_ALGO before init\n"
            "  -A, --plans LIST         times each entry of LIST (comma-separated: WEFT_ALGO\n"
            "                           values such as ring or tree/double, auto for weft's\n"
            "                           own choice) on a communicator of its own, every entry\n"
            "                           once per round in an order of the round's own\n"
            "  -N, --rounds N           timed rounds of -n iterations per size; the median\n"
            "                           round is reported (default 1; 5 with -A)\n"
            "  -J, --json FILE          also write every row as JSON to FILE (with -N > 1,\n"
            "                           every round's time too, in the order they ran)\n"
            "  -R, --register 0/1       weft_mem_register the buffers (zero-copy over verbs)\n"
            "  -G, --gpu 0/1            buffers in GPU memory (device: local rank modulo the\n"
            "                           device count) and the calls on a CUDA stream, timed\n"
            "                           to the stream's completion (default 0: host memory)\n"
            "  -h, --help               this text\n",
            coll->name);
}

static int perf_parse(const perf_coll_t *coll, int argc, char **argv, perf_opts_t *o)
{
    static const struct option longopts[] = {
        {"minbytes", required_argument, NULL, 'b'}, {"maxbytes", required_argument, NULL, 'e'},
        {"stepbytes", required_argument, NULL, 'i'}, {"stepfactor", required_argument, NULL, 'f'},
        {"iters", required_argument, NULL, 'n'}, {"warmup_iters", required_argument, NULL, 'w'},
        {"check", required_argument, NULL, 'c'}, {"datatype", required_argument, NULL, 'd'},
        {"op", required_argument, NULL, 'o'}, {"root", required_argument, NULL, 'r'},
        {"blocking", required_argument, NULL, 'z'}, {"algo", required_argument, NULL, 'a'},
        {"json", required_argument, NULL, 'J'}, {"register", required_argument, NULL, 'R'},
        {"plans", required_argument, NULL, 'A'}, {"rounds", required_argument, NULL, 'N'},
        {"gpu", required_argument, NULL, 'G'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    memset(o, 0, sizeof(*o));
    o->minbytes = o->maxbytes = 32u << 20;
    o->stepbytes = 1u << 20;
    o->stepfactor = 1;
    o->iters = 20;
    o->warmup = -1; /* perf_warmup */
    o->check = 1;
    o->dtype = WEFT_FLOAT32;
    o->op = WEFT_SUM;
    int c;
    long v;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "b:e:i:f:n:w:c:d:o:r:z:a:A:N:J:R:G:h", longopts, NULL)) != -1) {
        const char *bad = NULL;
        switch (c) {
        case 'b': if (perf_parse_size(optarg, &o->minbytes)) bad = "-b wants a size like 8, 64K, 32M"; break;
        case 'e': if (perf_parse_size(optarg, &o->maxbytes)) bad = "-e wants a size like 8, 64K, 32M"; break;
        case 'i': if (perf_parse_size(optarg, &o->stepbytes)) bad = "-i wants a size like 1M"; break;
        case 'f': if (parse_int(optarg, 1, 1 << 20, &o->stepfactor)) bad = "-f wants an integer >= 1"; break;
        case 'n': if (parse_int(optarg, 1, 1 << 30, &v)) bad = "-n wants an integer >= 1"; else o->iters = (int)v; break;
        case 'w': if (parse_int(optarg, 0, 1 << 30, &v)) bad = "-w wants an integer >= 0"; else o->warmup = (int)v; break;
        case 'c': if (parse_int(optarg, 0, 1 << 30, &v)) bad = "-c wants 0 or 1"; else o->check = v > 0; break;
        case 'z': if (parse_int(optarg, 0, 1, &v)) bad = "-z wants 0 or 1"; else o->blocking = (int)v; break;
        case 'a': o->algo = optarg; break;
        case 'A': o->plans = optarg; bad = *optarg ? NULL : "-A wants plans like auto,ring,tree"; break;
        case 'N': if (parse_int(optarg, 1, PERF_MAX_ROUNDS, &v)) bad = "-N wants 1 to 64"; else o->rounds = (int)v; break;
        case 'J': o->json_path = optarg; break;
        case 'R': if (parse_int(optarg, 0, 1, &v)) bad = "-R wants 0 or 1"; else o->reg = (int)v; break;
        case 'G': if (parse_int(optarg, 0, 1, &v)) bad = "-G wants 0 or 1"; else o->gpu = (int)v; break;
        case 'd': if (parse_choice(optarg, dtype_of, &o->dtype_all, &o->dtype)) bad = "-d wants a datatype name or all"; break;
        case 'o': if (parse_choice(optarg, op_of, &o->op_all, &o->op)) bad = "-o wants sum, prod, max, min, avg or all"; break;
        case 'r':
            if (strcmp(optarg, "all") == 0 || strcmp(optarg, "-1") == 0)
                o->root_all = 1;
            else if (parse_int(optarg, 0, INT32_MAX, &v))
                bad = "-r wants a rank, all or -1";
            else
                o->root = (int)v;
            break;
        case 'h': perf_usage(coll, stdout); return 1;
        default: bad = "unknown option or missing argument"; break;
        }
        if (bad) {
            fprintf(stderr, "%s_perf: %s (got '%s')\n", coll->name, bad,
                    c == '?' || c == ':' ? argv[optind - 1] : optarg);
            perf_usage(coll, stderr);
            return -1;
        }
    }
    const char *bad = NULL;
    if (optind < argc)
        bad = "unexpected argument";
    else if (o->minbytes > o->maxbytes)
        bad = "-b is larger than -e";
    else if (o->stepfactor <= 1 && o->stepbytes == 0 && o->minbytes < o->maxbytes)
        bad = "-i 0 with -f 1 never reaches -e";
    if (bad) {
        fprintf(stderr, "%s_perf: %s\n", coll->name, bad);
        return -1;
    }
    if (o->rounds == 0)
        o->rounds = o->plans ? 5 : 1;
    return 0;
}

/* Where one placement of one size puts its data. */
typedef struct {
    perf_call_t call;
    unsigned char *in; /* where this rank's input goes */
    size_t in_count;
    size_t total;      /* elements in the size column (count*n for rs/ag) */
} perf_layout_t;

static void perf_layout(perf_ctx_t *ctx, size_t bytes, int in_place, perf_layout_t *l)
{
    const perf_pattern_t *p = &ctx->pat;
    size_t ts = weft_dtype_size(p->dtype), n = (size_t)ctx->nranks, r = (size_t)ctx->rank;
    perf_kind_t kind = ctx->coll->kind;
    int split = kind == PERF_KIND_REDUCE_SCATTER || kind == PERF_KIND_ALLGATHER;
    memset(l, 0, sizeof(*l));
    l->total = split ? bytes / ts / n * n : bytes / ts;
    l->call.count = split ? l->total / n : l->total;
    l->call.dtype = p->dtype;
    l->call.op = p->op;
    l->call.rank = ctx->rank;
    l->call.nranks = ctx->nranks;
    l->call.recvbuf = ctx->recvbuf;
    l->call.sendbuf = in_place ? ctx->recvbuf : ctx->sendbuf;
    l->in = in_place ? ctx->recvbuf : ctx->sendbuf;
    l->in_count = l->call.count;
    if (kind == PERF_KIND_REDUCE_SCATTER) {
        l->in_count = l->total;
        if (in_place)
            l->call.recvbuf = ctx->recvbuf + r * l->call.count * ts;
    } else if (kind == PERF_KIND_ALLGATHER && in_place) {
        l->in = ctx->recvbuf + r * l->call.count * ts;
        l->call.sendbuf = l->in;
    }
}

/* -G 1: the device address that mirrors host address p of sendbuf or
 * recvbuf (same offset in the twin buffer). */
static void *perf_dev(const perf_ctx_t *ctx, const void *p)
{
    const unsigned char *h = p;
    int which = !(h >= ctx->sendbuf && h < ctx->sendbuf + ctx->bufbytes);
    size_t off = (size_t)(h - (which ? ctx->recvbuf : ctx->sendbuf));
    return (unsigned char *)perf_gpu_buf(ctx->gpu, which) + off;
}

/* -G 1: copies bytes at host address p (in sendbuf or recvbuf) to its
 * device twin, or back. */
static weft_status_t perf_put(perf_ctx_t *ctx, const void *p, size_t bytes)
{
    return perf_gpu_put(ctx->gpu, perf_dev(ctx, p), p, bytes);
}

static weft_status_t perf_get(perf_ctx_t *ctx, void *p, size_t bytes)
{
    return perf_gpu_get(ctx->gpu, p, perf_dev(ctx, p), bytes);
}

/* -G 1: the bytes at the start of recvbuf that a placement's outputs and
 * in-place input cover, copied to the device before a checked call and
 * back after it. */
static size_t perf_recv_extent(const perf_ctx_t *ctx, const perf_layout_t *l, int in_place)
{
    perf_kind_t kind = ctx->coll->kind;
    size_t ts = weft_dtype_size(l->call.dtype);
    if (kind == PERF_KIND_ALLGATHER || (kind == PERF_KIND_REDUCE_SCATTER && in_place))
        return l->total * ts;
    return l->call.count * ts;
}

/* Poisons (wrong == NULL) or checks every output region of this rank. */
static void perf_outputs(perf_ctx_t *ctx, const perf_layout_t *l, int root, int64_t *wrong)
{
    const perf_pattern_t *p = &ctx->pat;
    perf_kind_t kind = ctx->coll->kind;
    size_t ts = weft_dtype_size(p->dtype), c = l->call.count, first = 0;
    int prev = (ctx->rank + ctx->nranks - 1) % ctx->nranks;
    for (int src = 0; src < ctx->nranks; src++) {
        unsigned char *out = l->call.recvbuf;
        const unsigned char *tab = ctx->tab_tmp;
        size_t phase = 0;
        if (kind == PERF_KIND_ALLGATHER) {
            out = ctx->recvbuf + (size_t)src * c * ts;
        } else if (kind == PERF_KIND_BROADCAST || kind == PERF_KIND_SENDRECV) {
            if (src != (kind == PERF_KIND_BROADCAST ? root : prev))
                continue;
        } else {
            /* The reductions: one region, rank r's block of the result. */
            if (src != 0 || (kind == PERF_KIND_REDUCE && ctx->rank != root))
                continue;
            tab = ctx->tab_want;
            if (kind == PERF_KIND_REDUCE_SCATTER)
                phase = (size_t)ctx->rank * c % PERF_PERIOD;
        }
        if (tab == ctx->tab_tmp)
            table_of_rank(p, src, ctx->tab_tmp);
        if (wrong == NULL) {
            unsigned char poison[PERF_TAB_BYTES];
            table_poison(tab, ts, poison);
            buffer_fill(out, c, ts, poison, phase);
            continue;
        }
        int64_t w = buffer_wrong(out, c, ts, tab, phase, &first);
        if (w && ctx->reported++ < PERF_MAX_REPORTS)
            fprintf(stderr, "# rank %d: %s %s%s%s count %zu: element %zu is %.17g, expected %.17g\n",
                    ctx->rank, ctx->coll->name, dtype_names[p->dtype],
                    ctx->coll->has_op ? " " : "", ctx->coll->has_op ? op_names[p->op] : "", c,
                    (size_t)(out - ctx->recvbuf) / ts + first,
                    value_load(p->dtype, out + first * ts),
                    value_load(p->dtype, tab + (phase + first) % PERF_PERIOD * ts));
        *wrong += w;
    }
}

/* -w N: N calls.  By default, enough for the automatic choice's trials on
 * the first calls of a size (src/plan.c): up to 6 x (1 + 3 x 80) + 1
 * calls, which take about 54 ms by the model's clock, and 6 x (1 + 8) + 1
 * where one call takes more than 0.4 ms.  So batches of PERF_WARM_BATCH
 * until PERF_WARM_MAX calls have run, or PERF_WARM_MS have passed on the
 * slowest rank (an allreduce tells every rank, so all stop at the same
 * call) and at least PERF_WARM_MIN calls have run. */
#define PERF_WARM_BATCH 20
#define PERF_WARM_MIN 80
#define PERF_WARM_MAX 1500
#define PERF_WARM_MS 60.0

/* -G 1: returns when the calls queued on the stream have finished, and
 * fails when one of them did (the communicator's sticky error says so). */
static weft_status_t perf_wait(perf_ctx_t *ctx, const perf_call_t *call, weft_comm_t c)
{
    if (!call->on_stream)
        return WEFT_OK;
    weft_status_t st = perf_gpu_sync(ctx->gpu);
    if (st != WEFT_OK)
        return st; /* perf_gpu_sync said what failed */
    if ((st = weft_comm_get_error(c)) != WEFT_OK)
        fprintf(stderr, "# rank %d: %s on the stream failed: %s: %s\n", ctx->rank,
                ctx->coll->name, weft_status_string(st), weft_last_error(c));
    return st;
}

static weft_status_t perf_warm(perf_ctx_t *ctx, const perf_call_t *call, weft_comm_t c)
{
    if (ctx->opt.warmup >= 0) {
        for (int k = 0; k < ctx->opt.warmup; k++)
            PERF_CHECK(ctx, ctx->coll->name, perf_run(ctx->coll->kind, call, c));
        return perf_wait(ctx, call, c);
    }
    double t0 = perf_now_us(), ms = 0;
    for (int done = 0; done < PERF_WARM_MAX && (done < PERF_WARM_MIN || ms < PERF_WARM_MS);
         done += PERF_WARM_BATCH) {
        for (int k = 0; k < PERF_WARM_BATCH; k++)
            PERF_CHECK(ctx, ctx->coll->name, perf_run(ctx->coll->kind, call, c));
        weft_status_t st = perf_wait(ctx, call, c);
        if (st != WEFT_OK)
            return st;
        ms = (perf_now_us() - t0) * 1e-3;
        PERF_CHECK(ctx, "weft_allreduce (warm-up)",
                   weft_allreduce(&ms, &ms, 1, WEFT_FLOAT64, WEFT_MAX, ctx->comm));
    }
    return WEFT_OK;
}

/* The plans to time: -A's communicators, or comm alone. */
static int perf_nplans(const perf_ctx_t *ctx)
{
    return ctx->nplans ? ctx->nplans : 1;
}

static weft_comm_t perf_plan_comm(const perf_ctx_t *ctx, int i)
{
    return ctx->nplans ? ctx->plan_comm[i] : ctx->comm;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times every plan on one placement of one size: -w warm-ups each, then
 * -N rounds, each running every plan's -n iterations once, in an order
 * drawn for the round (the same on every rank), so that drift and slow
 * spells fall on all plans alike.  A round's time is its slowest rank's;
 * t[i] gets plan i's rounds in the order they ran, time_us[i] its median
 * round. */
static weft_status_t perf_time(perf_ctx_t *ctx, const perf_call_t *call,
                               double (*t)[PERF_MAX_ROUNDS], double *time_us)
{
    const perf_coll_t *coll = ctx->coll;
    int np = perf_nplans(ctx), rounds = ctx->opt.rounds;
    for (int i = 0; i < np; i++) {
        weft_status_t st = perf_warm(ctx, call, perf_plan_comm(ctx, i));
        if (st != WEFT_OK)
            return st; /* perf_warm said what failed */
    }
    uint64_t draw = 0x9e3779b97f4a7c15ull ^ call->count;
    for (int r = 0; r < rounds; r++) {
        int order[PERF_MAX_PLANS];
        for (int i = 0; i < np; i++)
            order[i] = i;
        for (int i = np - 1; i > 0; i--) { /* Fisher-Yates on a fixed LCG */
            draw = draw * 6364136223846793005ull + 1442695040888963407ull;
            int j = (int)((draw >> 33) % (uint64_t)(i + 1)), x = order[i];
            order[i] = order[j];
            order[j] = x;
        }
        for (int k = 0; k < np; k++) {
            int i = order[k];
            weft_comm_t c = perf_plan_comm(ctx, i);
            PERF_CHECK(ctx, "weft_allreduce (sync)",
                       weft_allreduce(ctx->sync, ctx->sync, 1, WEFT_FLOAT64, WEFT_SUM, ctx->comm));
            double t0 = perf_now_us();
            for (int it = 0; it < ctx->opt.iters; it++)
                PERF_CHECK(ctx, coll->name, perf_run(coll->kind, call, c));
            weft_status_t st = perf_wait(ctx, call, c); /* -G 1: the stream's completion */
            if (st != WEFT_OK)
                return st;
            double us = (perf_now_us() - t0) / ctx->opt.iters;
            PERF_CHECK(ctx, "weft_allreduce (time)",
                       weft_allreduce(&us, &us, 1, WEFT_FLOAT64, WEFT_MAX, ctx->comm));
            t[i][r] = us;
        }
    }
    for (int i = 0; i < np; i++) {
        double sorted[PERF_MAX_ROUNDS];
        memcpy(sorted, t[i], (size_t)rounds * sizeof(double));
        qsort(sorted, (size_t)rounds, sizeof(double), cmp_double);
        time_us[i] = rounds % 2 ? sorted[rounds / 2]
                                : 0.5 * (sorted[rounds / 2 - 1] + sorted[rounds / 2]);
    }
    return WEFT_OK;
}

/* Times one placement of one size for every plan, then (with -c) runs
 * each once more on the pattern and counts wrong elements over all ranks.
 * wrong[i] is -1 when nothing was checked. */
static weft_status_t perf_measure(perf_ctx_t *ctx, size_t bytes, int root, int in_place,
                                  double *time_us, int64_t *wrong)
{
    const perf_coll_t *coll = ctx->coll;
    const perf_pattern_t *p = &ctx->pat;
    size_t ts = weft_dtype_size(p->dtype);
    perf_layout_t l;
    perf_layout(ctx, bytes, in_place, &l);
    l.call.root = root;
    /* What runs: l.call itself, or with -G 1 its twin on the device
     * buffers, whose data goes through the host ones. */
    perf_call_t run = l.call;
    size_t recv_bytes = 0;
    if (ctx->gpu) {
        run.sendbuf = perf_dev(ctx, l.call.sendbuf);
        run.recvbuf = perf_dev(ctx, l.call.recvbuf);
        run.on_stream = 1;
        run.stream = perf_gpu_stream(ctx->gpu);
        recv_bytes = perf_recv_extent(ctx, &l, in_place);
    }

    /* Values that repeated in-place reductions leave unchanged: no overflow,
     * no denormals, no infinities while timing. */
    table_of_constant(p->dtype, p->reduces && p->op == WEFT_SUM ? 0.0 : 1.0, ctx->tab_tmp);
    buffer_fill(l.in, l.in_count, ts, ctx->tab_tmp, 0);
    weft_status_t st;
    if (ctx->gpu && (st = perf_put(ctx, l.in, l.in_count * ts)) != WEFT_OK)
        return st;
    if ((st = perf_time(ctx, &run, ctx->rounds_us[in_place], time_us)) != WEFT_OK)
        return st;

    for (int i = 0; i < perf_nplans(ctx); i++) {
        wrong[i] = -1;
        if (!ctx->opt.check || (in_place && !coll->check_in_place))
            continue;
        int64_t w = 0;
        weft_comm_t c = perf_plan_comm(ctx, i);
        perf_outputs(ctx, &l, root, NULL);
        if (coll->kind != PERF_KIND_BROADCAST || ctx->rank == root)
            buffer_fill(l.in, l.in_count, ts, ctx->tab_in, 0);
        /* -G 1: the poisoned outputs (and an in-place input) live in the
         * first recv_bytes of recvbuf; an out-of-place input in sendbuf. */
        if (ctx->gpu && ((st = perf_put(ctx, ctx->recvbuf, recv_bytes)) != WEFT_OK ||
                         (!in_place && (st = perf_put(ctx, l.in, l.in_count * ts)) != WEFT_OK)))
            return st;
        PERF_CHECK(ctx, coll->name, perf_run(coll->kind, &run, c));
        if (ctx->gpu && ((st = perf_wait(ctx, &run, c)) != WEFT_OK ||
                         (st = perf_get(ctx, ctx->recvbuf, recv_bytes)) != WEFT_OK))
            return st;
        perf_outputs(ctx, &l, root, &w);
        PERF_CHECK(ctx, "weft_allreduce (check)",
                   weft_allreduce(&w, &w, 1, WEFT_INT64, WEFT_SUM, ctx->comm));
        wrong[i] = w;
    }
    return WEFT_OK;
}

static void json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

/* One row: both placements of one size (of plan i, with -A). */
static void perf_row(perf_ctx_t *ctx, size_t size, size_t count, const char *op, int root, int i,
                     const double *time_us, const int64_t *wrong)
{
    const char *plan = ctx->nplans ? ctx->plan_name[i] : NULL;
    double factor = ctx->coll->bus_factor(ctx->nranks);
    printf("%12zu  %12zu  %8s  %6s  %6d", size, count, dtype_names[ctx->pat.dtype], op, root);
    if (ctx->json) {
        fprintf(ctx->json, "%s\n    {\"size\": %zu, \"count\": %zu, \"type\": \"%s\", "
                "\"redop\": \"%s\", \"root\": %d",
                ctx->json_rows++ ? "," : "", size, count, dtype_names[ctx->pat.dtype], op, root);
        if (plan) {
            fprintf(ctx->json, ", \"plan\": ");
            json_string(ctx->json, plan);
        }
    }
    for (int place = 0; place < 2; place++) {
        double us = time_us[place];
        double algbw = us > 0 ? (double)size / 1e3 / us : 0.0, busbw = algbw * factor;
        char tstr[32], wstr[32];
        snprintf(tstr, sizeof(tstr), us >= 10000.0 ? "%7.0f" : us >= 100.0 ? "%7.1f" : "%7.2f", us);
        if (wrong[place] < 0)
            snprintf(wstr, sizeof(wstr), "N/A");
        else
            snprintf(wstr, sizeof(wstr), "%" PRId64, wrong[place]);
        printf("  %7s  %6.2f  %6.2f  %6s", tstr, algbw, busbw, wstr);
        ctx->bw_sum += busbw;
        ctx->bw_count++;
        if (ctx->json) {
            fprintf(ctx->json, ", \"%s\": {\"time_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, "
                    "\"wrong\": ", place ? "in_place" : "out_of_place", us, algbw, busbw);
            if (wrong[place] < 0)
                fprintf(ctx->json, "null");
            else
                fprintf(ctx->json, "%" PRId64, wrong[place]);
            if (ctx->opt.rounds > 1) {
                fprintf(ctx->json, ", \"rounds_us\": [");
                for (int r = 0; r < ctx->opt.rounds; r++)
                    fprintf(ctx->json, "%s%.3f", r ? ", " : "", ctx->rounds_us[place][i][r]);
                fprintf(ctx->json, "]");
            }
            fprintf(ctx->json, "}");
        }
    }
    printf(plan ? "  %s\n" : "\n", plan);
    fflush(stdout);
    if (ctx->json)
        fprintf(ctx->json, "}");
}

/* All sizes of one (dtype, op, root). */
static weft_status_t perf_case(perf_ctx_t *ctx, weft_dtype_t dtype, weft_op_t op, int root)
{
    const perf_coll_t *coll = ctx->coll;
    int reduces = coll->has_op;
    pattern_fit(&ctx->pat, dtype, op, reduces, ctx->nranks);
    table_of_rank(&ctx->pat, ctx->rank, ctx->tab_in);
    if (reduces)
        table_of_reduction(&ctx->pat, ctx->tab_want);
    const char *opname = reduces ? op_names[op] : "none";
    size_t ts = weft_dtype_size(dtype);
    for (size_t bytes = ctx->opt.minbytes;;) {
        double t[2][PERF_MAX_PLANS];
        int64_t wrong[2][PERF_MAX_PLANS];
        for (int place = 0; place < 2; place++) {
            weft_status_t st = perf_measure(ctx, bytes, root, place, t[place], wrong[place]);
            if (st != WEFT_OK)
                return st;
        }
        perf_layout_t l;
        perf_layout(ctx, bytes, 0, &l);
        for (int i = 0; i < perf_nplans(ctx); i++) {
            double ti[2] = {t[0][i], t[1][i]};
            int64_t wi[2] = {wrong[0][i], wrong[1][i]};
            for (int place = 0; place < 2; place++)
                if (wi[place] > 0)
                    ctx->wrong_total += wi[place];
            if (ctx->rank == 0)
                perf_row(ctx, l.total * ts, l.total, opname, root, i, ti, wi);
        }
        if (ctx->opt.stepfactor > 1) {
            if (bytes > ctx->opt.maxbytes / (size_t)ctx->opt.stepfactor)
                break;
            bytes = bytes ? bytes * (size_t)ctx->opt.stepfactor : 1;
        } else {
            if (ctx->opt.stepbytes == 0 || bytes > ctx->opt.maxbytes - ctx->opt.stepbytes)
                break;
            bytes += ctx->opt.stepbytes;
        }
        if (bytes > ctx->opt.maxbytes)
            break;
    }
    return WEFT_OK;
}

/* Gathers every rank's pid and host and prints the header on rank 0. */
static weft_status_t perf_header(perf_ctx_t *ctx)
{
    perf_rank_rec_t mine, *all = calloc((size_t)ctx->nranks, sizeof(*all));
    if (all == NULL)
        return perf_fail(ctx, "calloc of the rank table", WEFT_ERR_NO_MEMORY);
    memset(&mine, 0, sizeof(mine));
    mine.rank = ctx->rank;
    mine.pid = (int32_t)getpid();
    mine.dev = -1;
    if (ctx->gpu) {
        mine.dev = perf_gpu_device(ctx->gpu);
        snprintf(mine.devname, sizeof(mine.devname), "%s", perf_gpu_name(ctx->gpu));
    }
    if (gethostname(mine.host, sizeof(mine.host) - 1) != 0)
        snprintf(mine.host, sizeof(mine.host), "unknown");
    weft_status_t st = weft_allgather(&mine, all, sizeof(mine), WEFT_UINT8, ctx->comm);
    if (st != WEFT_OK) {
        free(all);
        return perf_fail(ctx, "weft_allgather (rank table)", st);
    }
    if (ctx->rank == 0) {
        const perf_opts_t *o = &ctx->opt;
        const char *algo = getenv("WEFT_ALGO");
        char step[48];
        perf_step_text(step, sizeof(step), o->stepfactor, o->stepbytes);
        printf("# weft %d.%d.%d %s_perf\n", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR,
               WEFT_VERSION_PATCH, ctx->coll->name);
        char warm[24] = "auto";
        if (o->warmup >= 0)
            snprintf(warm, sizeof(warm), "%d", o->warmup);
        printf("# nRanks %d minBytes %zu maxBytes %zu step: %s warmup iters: %s iters: %d "
               "validation: %d blocking: %d algo: %s\n",
               ctx->nranks, o->minbytes, o->maxbytes, step, warm, o->iters, o->check,
               o->blocking, algo && *algo ? algo : "default");
        if (ctx->nplans || o->rounds > 1)
            printf("# plans: %s (each on a communicator of its own) rounds: %d\n",
                   o->plans ? o->plans : "-", o->rounds);
        if (ctx->gpu) {
            int v = perf_gpu_driver_version(ctx->gpu);
            printf("# gpu: 1 (buffers in device memory, calls on a CUDA stream; driver %d.%d)\n",
                   v / 1000, v % 1000 / 10);
        }
        printf("#\n# Using ranks\n");
        for (int r = 0; r < ctx->nranks; r++) {
            all[r].host[sizeof(all[r].host) - 1] = '\0';
            all[r].devname[sizeof(all[r].devname) - 1] = '\0';
            if (ctx->gpu)
                printf("#  Rank %2d Pid %6d on %10s device %2d [%s]\n", (int)all[r].rank,
                       (int)all[r].pid, all[r].host, (int)all[r].dev, all[r].devname);
            else
                printf("#  Rank %2d Pid %6d on %10s\n", (int)all[r].rank, (int)all[r].pid,
                       all[r].host);
        }
        printf("#\n");
        perf_print_columns();
        fflush(stdout);
    }
    if (ctx->json) {
        const perf_opts_t *o = &ctx->opt;
        fprintf(ctx->json, "{\n  \"benchmark\": \"%s_perf\",\n  \"weft_version\": \"%d.%d.%d\",\n"
                "  \"nranks\": %d,\n  \"options\": {\"minbytes\": %zu, \"maxbytes\": %zu, "
                "\"stepbytes\": %zu, \"stepfactor\": %ld, \"iters\": %d, \"warmup_iters\": %d, "
                "\"check\": %d, \"blocking\": %d, \"algo\": ",
                ctx->coll->name, WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH,
                ctx->nranks, o->minbytes, o->maxbytes, o->stepbytes, o->stepfactor, o->iters,
                o->warmup, o->check, o->blocking);
        const char *algo = getenv("WEFT_ALGO");
        json_string(ctx->json, algo && *algo ? algo : "default");
        fprintf(ctx->json, ", \"rounds\": %d, \"plans\": ", o->rounds);
        json_string(ctx->json, o->plans ? o->plans : "");
        if (ctx->gpu) /* -G 0 files stay as they were */
            fprintf(ctx->json, ", \"gpu\": 1");
        fprintf(ctx->json, "},\n  \"ranks\": [");
        for (int r = 0; r < ctx->nranks; r++) {
            fprintf(ctx->json, "%s\n    {\"rank\": %d, \"pid\": %d, \"host\": ", r ? "," : "",
                    (int)all[r].rank, (int)all[r].pid);
            json_string(ctx->json, all[r].host);
            if (ctx->gpu) {
                fprintf(ctx->json, ", \"device\": %d, \"device_name\": ", (int)all[r].dev);
                json_string(ctx->json, all[r].devname);
            }
            fprintf(ctx->json, "}");
        }
        fprintf(ctx->json, "\n  ],\n  \"rows\": [");
    }
    free(all);
    return WEFT_OK;
}

/* -A: one communicator per entry, split from comm, allowed the entry's
 * algorithms ("auto": all).  1 when an entry names no algorithm (every
 * rank finds the same), with ctx->nplans the communicators made. */
static int perf_plans_open(perf_ctx_t *ctx)
{
    const char *what = "strdup";
    weft_status_t st = WEFT_ERR_NO_MEMORY;
    if (ctx->opt.plans == NULL)
        return 0;
    if ((ctx->plan_list = strdup(ctx->opt.plans)) == NULL)
        goto fail;
    for (char *save = NULL, *e = strtok_r(ctx->plan_list, ",", &save); e;
         e = strtok_r(NULL, ",", &save)) {
        if (ctx->nplans == PERF_MAX_PLANS) {
            if (ctx->rank == 0)
                fprintf(stderr, "%s_perf: -A names more than %d plans\n", ctx->coll->name,
                        PERF_MAX_PLANS);
            return 1;
        }
        weft_comm_t c;
        what = "weft_comm_split (-A)";
        if ((st = weft_comm_split(ctx->comm, 0, ctx->rank, &c)) != WEFT_OK)
            goto fail;
        ctx->plan_name[ctx->nplans] = e;
        ctx->plan_comm[ctx->nplans++] = c;
        if ((st = weft_comm_set_algo(c, strcmp(e, "auto") == 0 ? NULL : e)) != WEFT_OK) {
            if (ctx->rank == 0)
                fprintf(stderr, "%s_perf: -A %s: %s\n", ctx->coll->name, e, weft_last_error(c));
            return 1;
        }
    }
    return 0;
fail:
    perf_fail(ctx, what, st);
    return -1;
}

static weft_status_t perf_all_cases(perf_ctx_t *ctx)
{
    const perf_coll_t *coll = ctx->coll;
    const perf_opts_t *o = &ctx->opt;
    int t0 = o->dtype_all ? 0 : o->dtype, t1 = o->dtype_all ? WEFT_NUM_DTYPES - 1 : t0;
    int op0 = o->op_all && coll->has_op ? 0 : o->op;
    int op1 = o->op_all && coll->has_op ? WEFT_NUM_OPS - 1 : op0;
    int r0 = !coll->has_root ? -1 : o->root_all ? 0 : o->root;
    int r1 = !coll->has_root ? -1 : o->root_all ? ctx->nranks - 1 : o->root;
    for (int t = t0; t <= t1; t++)
        for (int op = op0; op <= op1; op++)
            for (int root = r0; root <= r1; root++) {
                weft_status_t st = perf_case(ctx, (weft_dtype_t)t, (weft_op_t)op, root);
                if (st != WEFT_OK)
                    return st;
            }
    return WEFT_OK;
}

/* The local rank, as nccl-tests picks a GPU per process: weftrun's, Open
 * MPI's, MPICH's or Slurm's, else the rank. */
static int perf_local_rank(int rank)
{
    static const char *const vars[] = {"WEFT_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                                       "MPI_LOCALRANKID", "SLURM_LOCALID"};
    for (size_t k = 0; k < sizeof(vars) / sizeof(vars[0]); k++) {
        const char *v = getenv(vars[k]);
        long n;
        if (v && *v && parse_int(v, 0, INT32_MAX, &n) == 0)
            return (int)n;
    }
    return rank;
}

/* -G 1: the device buffers, zeroed like the host ones, and the stream;
 * why[len] says what failed. */
static weft_status_t perf_open_gpu(perf_ctx_t *ctx, char *why, size_t len)
{
    ctx->gpu = perf_gpu_open(ctx->rank, perf_local_rank(ctx->rank), ctx->bufbytes, why, len);
    if (ctx->gpu == NULL)
        return WEFT_ERR_UNSUPPORTED;
    for (int i = 0; i < 2; i++) {
        weft_status_t st = perf_gpu_put(ctx->gpu, perf_gpu_buf(ctx->gpu, i),
                                        i ? ctx->recvbuf : ctx->sendbuf, ctx->bufbytes);
        if (st != WEFT_OK) {
            snprintf(why, len, "zeroing the device buffers failed (see above)");
            return st;
        }
    }
    return WEFT_OK;
}

int perf_main(perf_kind_t kind, int argc, char **argv)
{
    const perf_coll_t *coll = &perf_colls[kind];
    perf_ctx_t *ctx = calloc(1, sizeof(*ctx));
    int exit_code = 1;
    if (ctx == NULL) {
        fprintf(stderr, "%s_perf: out of memory\n", coll->name);
        return 1;
    }
    ctx->coll = coll;
    int rc = perf_parse(coll, argc, argv, &ctx->opt);
    if (rc != 0) {
        free(ctx);
        return rc > 0 ? 0 : 2;
    }
    if (ctx->opt.algo && setenv("WEFT_ALGO", ctx->opt.algo, 1) != 0) {
        fprintf(stderr, "%s_perf: setenv WEFT_ALGO: %s\n", coll->name, strerror(errno));
        goto out_free;
    }
    weft_status_t st = weft_comm_init_env(&ctx->comm);
    if (st != WEFT_OK) {
        fprintf(stderr, "%s_perf: weft_comm_init_env failed: %s: %s\n", coll->name,
                weft_status_string(st), weft_last_error(NULL));
        goto out_free;
    }
    if ((st = weft_comm_rank(ctx->comm, &ctx->rank)) != WEFT_OK ||
        (st = weft_comm_size(ctx->comm, &ctx->nranks)) != WEFT_OK) {
        perf_fail(ctx, "weft_comm_rank/size", st);
        goto out_abort;
    }
    if (coll->has_root && !ctx->opt.root_all && ctx->opt.root >= ctx->nranks) {
        if (ctx->rank == 0)
            fprintf(stderr, "%s_perf: -r %d is not a rank of this %d-rank job\n", coll->name,
                    ctx->opt.root, ctx->nranks);
        exit_code = 2;
        goto out_destroy;
    }

    /* Local failures (memory, the device, the JSON file) are agreed on
     * before anyone enters a collective, so every rank stops cleanly
     * together.  failed[1]: n - (the lowest rank whose -G 1 failed), so
     * that one line says why rather than one per rank. */
    int32_t failed[2] = {0, 0};
    char gpu_why[320] = "";
    ctx->bufbytes = ctx->opt.maxbytes ? ctx->opt.maxbytes : 1;
    ctx->sendbuf = perf_alloc_touched(ctx->bufbytes);
    ctx->recvbuf = perf_alloc_touched(ctx->bufbytes);
    if (ctx->sendbuf == NULL || ctx->recvbuf == NULL) {
        fprintf(stderr, "# rank %d: cannot allocate 2 x %zu bytes\n", ctx->rank, ctx->bufbytes);
        failed[0] = 1;
    } else if (ctx->opt.gpu && perf_open_gpu(ctx, gpu_why, sizeof(gpu_why)) != WEFT_OK) {
        failed[1] = ctx->nranks - ctx->rank;
    }
    if (!failed[0] && !failed[1] && ctx->opt.reg) {
        void *b0 = ctx->gpu ? perf_gpu_buf(ctx->gpu, 0) : ctx->sendbuf;
        void *b1 = ctx->gpu ? perf_gpu_buf(ctx->gpu, 1) : ctx->recvbuf;
        if (weft_mem_register(ctx->comm, b0, ctx->bufbytes, &ctx->reg[0]) != WEFT_OK ||
            weft_mem_register(ctx->comm, b1, ctx->bufbytes, &ctx->reg[1]) != WEFT_OK) {
            fprintf(stderr, "# rank %d: weft_mem_register: %s\n", ctx->rank,
                    weft_last_error(ctx->comm));
            failed[0] = 1;
        }
    }
    if (ctx->rank == 0 && ctx->opt.json_path) {
        ctx->json = fopen(ctx->opt.json_path, "w");
        if (ctx->json == NULL) {
            fprintf(stderr, "%s_perf: cannot write %s: %s\n", coll->name, ctx->opt.json_path,
                    strerror(errno));
            failed[0] = 1;
        }
    }
    st = weft_allreduce(failed, failed, 2, WEFT_INT32, WEFT_MAX, ctx->comm);
    if (st != WEFT_OK) {
        perf_fail(ctx, "weft_allreduce (setup)", st);
        goto out_abort;
    }
    if (failed[1] && ctx->rank == ctx->nranks - failed[1]) {
        if (ctx->rank == 0)
            fprintf(stderr, "%s_perf: -G 1: %s\n", coll->name, gpu_why);
        else
            fprintf(stderr, "%s_perf: -G 1: %s (rank %d)\n", coll->name, gpu_why, ctx->rank);
    }
    /* No rank exits before that line is out: a launcher stops the others
     * when the first one fails. */
    if (failed[1] &&
        (st = weft_allreduce(failed, failed, 1, WEFT_INT32, WEFT_MAX, ctx->comm)) != WEFT_OK) {
        perf_fail(ctx, "weft_allreduce (setup)", st);
        goto out_abort;
    }
    if (failed[0] || failed[1])
        goto out_destroy;
    int bad_plans = perf_plans_open(ctx);
    if (bad_plans < 0)
        goto out_abort;
    if (bad_plans > 0) {
        exit_code = 2;
        goto out_destroy;
    }

    if (perf_header(ctx) != WEFT_OK || perf_all_cases(ctx) != WEFT_OK)
        goto out_abort;

    double avg = ctx->bw_count ? ctx->bw_sum / (double)ctx->bw_count : 0.0;
    if (ctx->rank == 0) {
        printf("# Out of bounds values : %" PRId64 " %s\n", ctx->wrong_total,
               ctx->wrong_total ? "FAILED" : "OK");
        printf("# Avg bus bandwidth    : %g \n#\n", avg);
        printf("# Collective test concluded: %s_perf\n", coll->name);
        fflush(stdout);
    }
    if (ctx->json) {
        fprintf(ctx->json, "\n  ],\n  \"out_of_bounds\": %" PRId64 ",\n  \"avg_busbw\": %g,\n"
                "  \"ok\": %s\n}\n", ctx->wrong_total, avg, ctx->wrong_total ? "false" : "true");
    }
    exit_code = ctx->wrong_total ? 1 : 0;

out_destroy:
    for (int i = 0; i < 2; i++)
        if (ctx->reg[i])
            weft_mem_deregister(ctx->comm, ctx->reg[i]);
    for (int i = 0; i < ctx->nplans; i++)
        if ((st = weft_comm_destroy(ctx->plan_comm[i])) != WEFT_OK)
            fprintf(stderr, "# rank %d: weft_comm_destroy (-A %s) failed: %s\n", ctx->rank,
                    ctx->plan_name[i], weft_status_string(st));
    st = weft_comm_destroy(ctx->comm);
    if (st != WEFT_OK) {
        fprintf(stderr, "# rank %d: weft_comm_destroy failed: %s: %s\n", ctx->rank,
                weft_status_string(st), weft_last_error(NULL));
        exit_code = 1;
    }
    goto out_close;
out_abort:
    for (int i = 0; i < ctx->nplans; i++)
        weft_comm_abort(ctx->plan_comm[i]);
    weft_comm_abort(ctx->comm);
    exit_code = 1;
out_close:
    /* After the communicators: they may hold the device buffers. */
    if (perf_gpu_close(ctx->gpu) != WEFT_OK)
        exit_code = 1;
    if (ctx->json && fclose(ctx->json) != 0) {
        fprintf(stderr, "%s_perf: writing %s: %s\n", coll->name, ctx->opt.json_path,
                strerror(errno));
        exit_code = 1;
    }
    free(ctx->recvbuf);
    free(ctx->sendbuf);
    free(ctx->plan_list);
out_free:
    free(ctx);
    return exit_code;
}
