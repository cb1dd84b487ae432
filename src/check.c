/*
 * check.c - mismatch detection (WEFT_CHECK=1).  Before each collective the
 * ranks exchange fixed-size fingerprints of their calls (sequence,
 * collective, count, dtype, op, root, and the plan derived from them); the
 * engine holds the collective back until the records agree.  This file
 * owns the record, its exchange schedule and the verdict.
 */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "comm.h"

_Static_assert(sizeof(struct weft_fingerprint) == 48, "the record goes on the wire as is");

const char *weft_dtype_name(weft_dtype_t t)
{
    static const char *const names[] = {"int8",    "uint8",   "int32",   "uint32",  "int64",
                                        "uint64",  "float16", "float32", "float64", "bfloat16"};
    return (unsigned)t < WEFT_ARRAY_SIZE(names) ? names[t] : "?";
}

const char *weft_op_name(weft_op_t op)
{
    static const char *const names[] = {"sum", "prod", "max", "min", "avg"};
    return (unsigned)op < WEFT_ARRAY_SIZE(names) ? names[op] : "?";
}

void weft_fp_fill(struct weft_fingerprint *fp, const struct weft_op_args *a, int algo,
                  size_t chunk_bytes)
{
    /* Fields the collective ignores are zeroed, so that they never differ. */
    *fp = (struct weft_fingerprint){
        .magic = WEFT_FP_MAGIC,
        .coll = a->coll,
        .dtype = (int32_t)a->dtype,
        .op = weft_coll_reduces(a->coll) ? (int32_t)a->op : 0,
        .root = weft_coll_rooted(a->coll) ? a->root : 0,
        .algo = algo,
        .count = a->count,
        .chunk = chunk_bytes,
    };
}

weft_status_t weft_check_sched_build(int rank, int nranks, struct weft_schedule *s)
{
    const size_t rec = sizeof(struct weft_fingerprint);
    s->nsteps = 0;
    s->scratch_count = 0;
    /* Round k: receive from rank - k, send to rank + k.  Every pair carries
     * one message each way and nothing waits for anything, so the exchange
     * costs one message latency whatever the rank count. */
    for (int k = 1; k < nranks; k++) {
        int from = (rank - k + nranks) % nranks, to = (rank + k) % nranks;
        struct weft_step recv = {.kind = WEFT_STEP_RECV, .buf = WEFT_BUF_RECV, .peer = from,
                                 .deps = {-1, -1, -1}, .off = (size_t)from * rec, .count = rec};
        struct weft_step send = {.kind = WEFT_STEP_SEND, .buf = WEFT_BUF_SEND, .peer = to,
                                 .deps = {-1, -1, -1}, .off = 0, .count = rec};
        if (weft_sched_add(s, &recv) < 0 || weft_sched_add(s, &send) < 0)
            return weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot allocate the fingerprint exchange");
    }
    return WEFT_OK;
}

static bool call_equal(const struct weft_fingerprint *a, const struct weft_fingerprint *b)
{
    return a->coll == b->coll && a->count == b->count && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root && a->seq == b->seq;
}

static bool plan_equal(const struct weft_fingerprint *a, const struct weft_fingerprint *b)
{
    return a->algo == b->algo && a->chunk == b->chunk;
}

/* "allreduce(count=1024, float32, sum)", "broadcast(count=8, int32, root=1)". */
static const char *describe(const struct weft_fingerprint *f, bool with_seq, char *buf, size_t len)
{
    int o = snprintf(buf, len, "%s(count=%llu, %s", weft_coll_name(f->coll),
                     (unsigned long long)f->count, weft_dtype_name((weft_dtype_t)f->dtype));
    if (weft_coll_reduces(f->coll) && o >= 0 && (size_t)o < len)
        o += snprintf(buf + o, len - (size_t)o, ", %s", weft_op_name((weft_op_t)f->op));
    if (weft_coll_rooted(f->coll) && o >= 0 && (size_t)o < len)
        o += snprintf(buf + o, len - (size_t)o, ", root=%d", f->root);
    if (o >= 0 && (size_t)o < len)
        snprintf(buf + o, len - (size_t)o, with_seq ? ") as its collective #%llu" : ")",
                 (unsigned long long)f->seq);
    return buf;
}

weft_status_t weft_check_verify(struct weft_comm *comm, const struct weft_fingerprint *all)
{
    int p = comm->nranks, me = comm->rank;
    unsigned long long seq = (unsigned long long)all[me].seq;
    char mine[128];
    for (int r = 0; r < p; r++)
        if (all[r].magic != WEFT_FP_MAGIC)
            /* The stream between us is out of step: a send or receive met
             * the exchange on one side and not on the other. */
            return weft_error(weft_comm_err(comm), WEFT_ERR_MISMATCH,
                              "rank %d: collective mismatch at collective #%llu, %s: rank %d sent "
                              "something other than a fingerprint (are sends and receives placed "
                              "the same way among the collectives on every rank?)",
                              me, seq, describe(&all[me], false, mine, sizeof(mine)), r);
    const struct weft_fingerprint *ref = &all[0];
    int first = -1, ndiff = 0;
    for (int r = 1; r < p; r++)
        if (!call_equal(ref, &all[r]) || !plan_equal(ref, &all[r])) {
            if (first < 0)
                first = r;
            ndiff++;
        }
    if (first < 0)
        return WEFT_OK;
    const struct weft_fingerprint *odd = &all[first];
    /* When everyone else agrees, rank 0 is the odd one: say so. */
    int like_odd = 0;
    for (int r = first; r < p; r++)
        like_odd += call_equal(odd, &all[r]) && plan_equal(odd, &all[r]);
    char a[128], b[128], others[80] = "";
    if (p > 2 && like_odd == p - 1)
        snprintf(others, sizeof(others), " (every other rank called what rank %d did)", first);
    else if (ndiff > 1)
        snprintf(others, sizeof(others), " (%d of the %d other ranks differ from rank 0)", ndiff,
                 p - 1);
    bool ordered0 = ref->algo >> 12 & 1, ordered1 = odd->algo >> 12 & 1;
    if (call_equal(ref, odd) && ordered0 != ordered1)
        return weft_error(weft_comm_err(comm), WEFT_ERR_MISMATCH,
                          "rank %d: collective mismatch at collective #%llu, %s: deterministic "
                          "mode is %s on rank 0 but %s on rank %d (WEFT_DETERMINISTIC or "
                          "weft_comm_set_deterministic differ between ranks)%s",
                          me, seq, describe(ref, false, a, sizeof(a)), ordered0 ? "on" : "off",
                          ordered1 ? "on" : "off", first, others);
    bool run0 = ref->algo >> 13 & 1, run1 = odd->algo >> 13 & 1;
    if (call_equal(ref, odd) && (ref->algo & 0xfff) == (odd->algo & 0xfff) && run0 != run1)
        return weft_error(weft_comm_err(comm), WEFT_ERR_MISMATCH,
                          "rank %d: collective mismatch at collective #%llu, %s: rank %d times "
                          "plans for its size class here and rank %d does not (WEFT_ALGO, "
                          "weft_comm_set_algo or WEFT_TUNE_* differ between ranks)%s",
                          me, seq, describe(ref, false, a, sizeof(a)), run0 ? 0 : first,
                          run0 ? first : 0, others);
    if (call_equal(ref, odd))
        return weft_error(weft_comm_err(comm), WEFT_ERR_MISMATCH,
                          "rank %d: collective mismatch at collective #%llu, %s: rank 0 runs it "
                          "with %s and %llu-byte chunks but rank %d with %s and %llu-byte chunks "
                          "(WEFT_ALGO, weft_comm_set_algo or WEFT_CHUNK_SIZE differ between "
                          "ranks)%s",
                          me, seq, describe(ref, false, a, sizeof(a)), weft_algo_name(ref->algo & 0xff),
                          (unsigned long long)ref->chunk, first, weft_algo_name(odd->algo & 0xff),
                          (unsigned long long)odd->chunk, others);
    bool seqs = ref->seq != odd->seq;
    return weft_error(weft_comm_err(comm), WEFT_ERR_MISMATCH,
                      "rank %d: collective mismatch at collective #%llu: rank 0 called %s but "
                      "rank %d called %s%s",
                      me, seq, describe(ref, seqs, a, sizeof(a)), first,
                      describe(odd, seqs, b, sizeof(b)), others);
}
