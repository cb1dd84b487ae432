/*
 * nccl_coll.c - NCCL's operations on top of weft: the collectives, the
 * ones weft builds from point-to-point (AlltoAll, Gather, Scatter),
 * Send/Recv, PreMulSum operators and groups.  A stream or a device buffer
 * makes a call weft's _stream form (NCCL's semantics: it returns at once,
 * ordered on the stream; NULL is the legacy default stream).  Host buffers
 * with stream == NULL: the call completes before it returns, or at the
 * ncclGroupEnd that closes its group.
 */
#include <stdlib.h>
#include <string.h>

#include "compat.h"
#include "reduce.h"
#include "devbuf.h"

/* True when the call must go on a stream: one was given, or a buffer is
 * device memory (NCCL's NULL stream is then the legacy default one). */
static bool streamed(struct ncclComm *c, cudaStream_t stream, const void *a, const void *b)
{
    return stream != NULL || weft_dev_on_device(c->wc, a, b);
}

/* ---- per-thread group state ---------------------------------------------- */

/* A buffer lent to a PreMulSum call until its group ends; kept for reuse. */
struct scratch {
    void *p;
    size_t cap;
    bool busy;
};

static __thread int depth;
static __thread struct ncclComm **inits;          /* started in this group */
static __thread size_t ninits, cap_inits;
static __thread struct ncclComm *touched[8];       /* comms this group used */
static __thread size_t ntouched;
static __thread struct scratch scratch[16];

int compat_group_depth(void)
{
    return depth;
}

void compat_group_add_init(struct ncclComm *c)
{
    if (ninits == cap_inits) {
        size_t cap = cap_inits ? 2 * cap_inits : 8;
        struct ncclComm **n = realloc(inits, cap * sizeof(*n));
        if (n == NULL) {
            /* Cannot track it: wait for it now instead of at GroupEnd. */
            pthread_mutex_lock(&c->mu);
            while (c->thread_running)
                pthread_cond_wait(&c->cv, &c->mu);
            pthread_mutex_unlock(&c->mu);
            return;
        }
        inits = n;
        cap_inits = cap;
    }
    inits[ninits++] = c;
}

ncclResult_t compat_group_join_inits(void)
{
    ncclResult_t first = ncclSuccess;
    for (size_t i = 0; i < ninits; i++) {
        struct ncclComm *c = inits[i];
        pthread_mutex_lock(&c->mu);
        while (c->thread_running)
            pthread_cond_wait(&c->cv, &c->mu);
        ncclResult_t r = c->state;
        pthread_mutex_unlock(&c->mu);
        if (first == ncclSuccess && r != ncclSuccess)
            first = compat_fail(c, r, "ncclGroupEnd: rank %d of %d failed to initialize: %s",
                                c->rank, c->nranks, weft_last_error(NULL));
    }
    ninits = 0;
    return first;
}

void compat_scratch_release(void)
{
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(scratch); i++)
        scratch[i].busy = false;
}

void compat_group_touch(struct ncclComm *c)
{
    for (size_t i = 0; i < ntouched; i++)
        if (touched[i] == c)
            return;
    if (ntouched < WEFT_ARRAY_SIZE(touched))
        touched[ntouched++] = c;
}

struct ncclComm *compat_group_failed_comm(void)
{
    for (size_t i = 0; i < ntouched; i++)
        if (compat_valid(touched[i]) && touched[i]->wc &&
            weft_comm_get_error(touched[i]->wc) != WEFT_OK)
            return touched[i];
    return ntouched && compat_valid(touched[0]) ? touched[0] : NULL;
}

/* A buffer of at least n bytes, busy until the group (or call) ends. */
static void *scratch_get(size_t n)
{
    struct scratch *pick = NULL;
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(scratch); i++) {
        struct scratch *s = &scratch[i];
        if (s->busy)
            continue;
        if (s->cap >= n) {
            pick = s;
            break;
        }
        if (pick == NULL || s->cap > pick->cap)
            pick = s;
    }
    if (pick == NULL)
        return NULL;
    if (pick->cap < n) {
        void *p = realloc(pick->p, n);
        if (p == NULL)
            return NULL;
        pick->p = p;
        pick->cap = n;
    }
    pick->busy = true;
    return pick->p;
}

ncclResult_t pncclGroupStart()
{
    if (depth++ == 0)
        ntouched = 0;
    return weft_group_start() == WEFT_OK ? ncclSuccess : ncclInternalError;
}
NCCL_ALIAS(ncclGroupStart);

ncclResult_t pncclGroupEnd()
{
    if (depth == 0)
        return compat_fail(NULL, ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    weft_status_t st = weft_group_end();
    if (--depth > 0)
        return ncclSuccess;
    ncclResult_t r = compat_group_join_inits();
    if (st != WEFT_OK) {
        struct ncclComm *c = compat_group_failed_comm();
        ncclResult_t e = compat_status(c, "ncclGroupEnd", st);
        if (r == ncclSuccess)
            r = e;
    }
    compat_scratch_release();
    ntouched = 0;
    return r;
}
NCCL_ALIAS(ncclGroupEnd);

ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t *info)
{
    (void)info;
    return compat_fail(NULL, ncclInvalidUsage,
                       "ncclGroupSimulateEnd: not supported by weft (weft-sim predicts "
                       "schedule times instead); the group stays open");
}
NCCL_ALIAS(ncclGroupSimulateEnd);

/* ---- types and operators ------------------------------------------------- */

/* fp8 moves as bytes; it cannot be reduced. */
static bool map_dtype(ncclDataType_t t, bool reducing, weft_dtype_t *out)
{
    if ((int)t >= 0 && (int)t < WEFT_NUM_DTYPES) {
        *out = (weft_dtype_t)t;
        return true;
    }
    if ((t == ncclFloat8e4m3 || t == ncclFloat8e5m2) && !reducing) {
        *out = WEFT_UINT8;
        return true;
    }
    return false;
}

static ncclResult_t bad_dtype(struct ncclComm *c, const char *fn, ncclDataType_t t)
{
    if (t == ncclFloat8e4m3 || t == ncclFloat8e5m2)
        return compat_fail(c, ncclInvalidUsage,
                           "%s: weft cannot reduce fp8 (datatype %d); it only moves it", fn,
                           (int)t);
    return compat_fail(c, ncclInvalidArgument, "%s: invalid datatype %d", fn, (int)t);
}

static ncclResult_t premulsum_create(struct ncclComm *c, ncclRedOp_t *op, void *scalar,
                                     ncclDataType_t dtype, ncclScalarResidence_t residence)
{
    const char *fn = "ncclRedOpCreatePreMulSum";
    weft_dtype_t wt;
    if (op == NULL || scalar == NULL)
        return compat_fail(c, ncclInvalidArgument, "%s: op %p, scalar %p", fn, (void *)op,
                           scalar);
    if (!map_dtype(dtype, true, &wt))
        return bad_dtype(c, fn, dtype);
    if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
        return compat_fail(c, ncclInvalidArgument, "%s: residence %d", fn, (int)residence);
    pthread_mutex_lock(&c->mu);
    int slot = -1;
    for (int i = 0; i < COMPAT_MAX_REDOPS && slot < 0; i++)
        if (!c->ops[i].used)
            slot = i;
    if (slot >= 0) {
        struct compat_redop *o = &c->ops[slot];
        *o = (struct compat_redop){.used = true, .dtype = dtype, .ptr = scalar,
                                   .immediate = residence == ncclScalarHostImmediate};
        memcpy(o->val, scalar, weft_dtype_size(wt));
    }
    pthread_mutex_unlock(&c->mu);
    if (slot < 0)
        return compat_fail(c, ncclInvalidUsage, "%s: %d operators already exist on this "
                           "communicator; destroy some", fn, COMPAT_MAX_REDOPS);
    *op = (ncclRedOp_t)(ncclNumOps + slot);
    return ncclSuccess;
}

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t dtype,
                                       ncclScalarResidence_t residence, ncclComm_t comm)
{
    ncclResult_t r;
    struct ncclComm *c = compat_ready(comm, "ncclRedOpCreatePreMulSum", &r);
    if (c == NULL)
        return r;
    return compat_release(c, premulsum_create(c, op, scalar, dtype, residence));
}
NCCL_ALIAS(ncclRedOpCreatePreMulSum);

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    ncclResult_t r;
    struct ncclComm *c = compat_ready(comm, "ncclRedOpDestroy", &r);
    if (c == NULL)
        return r;
    int slot = (int)op - ncclNumOps;
    pthread_mutex_lock(&c->mu);
    bool ok = slot >= 0 && slot < COMPAT_MAX_REDOPS && c->ops[slot].used;
    if (ok)
        c->ops[slot].used = false;
    pthread_mutex_unlock(&c->mu);
    if (!ok)
        return compat_release(c, compat_fail(c, ncclInvalidArgument,
                                             "ncclRedOpDestroy: op %d was not created on this "
                                             "communicator",
                                             (int)op));
    return compat_release(c, ncclSuccess);
}
NCCL_ALIAS(ncclRedOpDestroy);

/* dst[i] = src[i] * scalar in the type's own arithmetic (f16/bf16 through
 * f32, rounded once). */
static void premul(void *dst, const void *src, size_t n, weft_dtype_t t, const void *scalar)
{
#define SCALE(T)                                                                              \
    do {                                                                                      \
        T s_, *d_ = dst;                                                                      \
        const T *x_ = src;                                                                    \
        memcpy(&s_, scalar, sizeof(s_));                                                      \
        for (size_t i = 0; i < n; i++)                                                        \
            d_[i] = (T)(x_[i] * s_);                                                          \
    } while (0)
    switch (t) {
    case WEFT_INT8: SCALE(int8_t); break;
    case WEFT_UINT8: SCALE(uint8_t); break;
    case WEFT_INT32: SCALE(int32_t); break;
    case WEFT_UINT32: SCALE(uint32_t); break;
    case WEFT_INT64: SCALE(int64_t); break;
    case WEFT_UINT64: SCALE(uint64_t); break;
    case WEFT_FLOAT32: SCALE(float); break;
    case WEFT_FLOAT64: SCALE(double); break;
    case WEFT_FLOAT16:
    case WEFT_BFLOAT16: {
        bool h = t == WEFT_FLOAT16;
        uint16_t s16, *d = dst;
        const uint16_t *x = src;
        memcpy(&s16, scalar, 2);
        float s = h ? weft_half_to_float(s16) : weft_bf16_to_float(s16);
        for (size_t i = 0; i < n; i++) {
            float v = (h ? weft_half_to_float(x[i]) : weft_bf16_to_float(x[i])) * s;
            d[i] = h ? weft_float_to_half(v) : weft_float_to_bf16(v);
        }
        break;
    }
    default: break;
    }
#undef SCALE
}

/* ---- calls ---------------------------------------------------------------- */

/* A reduction's inputs after operator mapping: a PreMulSum operator turns
 * into a sum over scaled copies of sendbuf. */
struct red {
    const void *send;
    weft_op_t op;
};

static ncclResult_t map_op(struct ncclComm *c, const char *fn, ncclRedOp_t op, ncclDataType_t t,
                           weft_dtype_t wt, const void *send, size_t n, struct red *out)
{
    out->send = send;
    if ((int)op >= 0 && (int)op < ncclNumOps) {
        out->op = (weft_op_t)op;
        return ncclSuccess;
    }
    int slot = (int)op - ncclNumOps;
    pthread_mutex_lock(&c->mu);
    bool ok = slot >= 0 && slot < COMPAT_MAX_REDOPS && c->ops[slot].used;
    struct compat_redop o = ok ? c->ops[slot] : (struct compat_redop){0};
    pthread_mutex_unlock(&c->mu);
    if (!ok)
        return compat_fail(c, ncclInvalidArgument, "%s: invalid reduction operator %d", fn,
                           (int)op);
    if (o.dtype != t)
        return compat_fail(c, ncclInvalidArgument,
                           "%s: operator %d was created for datatype %d, not %d", fn, (int)op,
                           (int)o.dtype, (int)t);
    size_t esz = weft_dtype_size(wt);
    if (n > 0 && send == NULL)
        return compat_fail(c, ncclInvalidArgument, "%s: sendbuff is NULL", fn);
    void *tmp = scratch_get(n * esz > 0 ? n * esz : 1);
    if (tmp == NULL)
        return compat_fail(c, ncclSystemError, "%s: out of memory for %zu bytes", fn, n * esz);
    premul(tmp, send, n, wt, o.immediate ? o.val : o.ptr);
    out->send = tmp;
    out->op = WEFT_SUM;
    return ncclSuccess;
}

/* Common checks of every operation: a ready comm and a dtype. */
static struct ncclComm *enter(ncclComm_t comm, const char *fn, cudaStream_t stream,
                              ncclDataType_t t, bool reducing, weft_dtype_t *wt, ncclResult_t *r)
{
    struct ncclComm *c = compat_ready(comm, fn, r);
    if (c == NULL)
        return NULL;
    if (!map_dtype(t, reducing, wt)) {
        *r = compat_release(c, bad_dtype(c, fn, t));
        return NULL;
    }
    if (depth > 0)
        compat_group_touch(c);
    return c;
}

/* Ends a call begun by enter() with result r: outside a group its scratch
 * buffers are free again. */
static ncclResult_t leave_with(struct ncclComm *c, ncclResult_t r)
{
    if (depth == 0)
        compat_scratch_release();
    return compat_release(c, r);
}

static ncclResult_t leave(struct ncclComm *c, const char *fn, weft_status_t st)
{
    return leave_with(c, compat_status(c, fn, st));
}

enum red_kind { ALLREDUCE, REDUCE, REDUCE_SCATTER };

/* The reductions: operator mapping (PreMulSum scales a copy of the input,
 * which is then no longer "in place" for weft), then the weft call. */
static ncclResult_t red_coll(enum red_kind kind, const char *fn, const void *sendbuff,
                             void *recvbuff, size_t count, ncclDataType_t datatype,
                             ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r;
    weft_dtype_t t;
    struct red red = {0};
    struct ncclComm *c = enter(comm, fn, stream, datatype, true, &t, &r);
    if (c == NULL)
        return r;
    size_t n = count; /* input elements */
    if (kind == REDUCE_SCATTER) {
        if (count > SIZE_MAX / (size_t)c->nranks / 8)
            return leave_with(c, compat_fail(c, ncclInvalidArgument,
                                             "%s: recvcount %zu is too large", fn, count));
        n = count * (size_t)c->nranks;
    }
    bool on_stream = streamed(c, stream, sendbuff, recvbuff);
    if (on_stream && op >= ncclNumOps)
        return leave_with(c, compat_fail(c, ncclInvalidUsage,
                                         "%s: PreMulSum operators work on host buffers without a "
                                         "stream only",
                                         fn));
    if ((r = map_op(c, fn, op, datatype, t, sendbuff, n, &red)) != ncclSuccess)
        return leave_with(c, r);
    weft_status_t st;
    if (on_stream)
        st = kind == ALLREDUCE ? weft_allreduce_stream(red.send, recvbuff, count, t, red.op, c->wc, stream)
           : kind == REDUCE    ? weft_reduce_stream(red.send, recvbuff, count, t, red.op, root, c->wc, stream)
                               : weft_reduce_scatter_stream(red.send, recvbuff, count, t, red.op, c->wc, stream);
    else
        st = kind == ALLREDUCE ? weft_allreduce(red.send, recvbuff, count, t, red.op, c->wc)
           : kind == REDUCE    ? weft_reduce(red.send, recvbuff, count, t, red.op, root, c->wc)
                               : weft_reduce_scatter(red.send, recvbuff, count, t, red.op, c->wc);
    return leave(c, fn, st);
}

ncclResult_t pncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                            cudaStream_t stream)
{
    return red_coll(ALLREDUCE, "ncclAllReduce", sendbuff, recvbuff, count, datatype, op, 0, comm,
                    stream);
}
NCCL_ALIAS(ncclAllReduce);

ncclResult_t pncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                         cudaStream_t stream)
{
    return red_coll(REDUCE, "ncclReduce", sendbuff, recvbuff, count, datatype, op, root, comm,
                    stream);
}
NCCL_ALIAS(ncclReduce);

ncclResult_t pncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream)
{
    return red_coll(REDUCE_SCATTER, "ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype,
                    op, 0, comm, stream);
}
NCCL_ALIAS(ncclReduceScatter);

enum move_kind { ALLGATHER, BROADCAST, SEND, RECV, ALLTOALL, GATHER, SCATTER };

/* The point-to-point collectives, on c as enter() returned it: one group
 * of sends and receives, so they progress together (and join the
 * caller's group when there is one). */
/* One send or receive of a group, on the stream when there is one. */
static weft_status_t p2p_one(struct ncclComm *c, bool send, const void *buf, size_t count,
                             weft_dtype_t t, int peer, bool on_stream, cudaStream_t stream)
{
    if (send)
        return on_stream ? weft_send_stream(buf, count, t, peer, c->wc, stream)
                         : weft_send(buf, count, t, peer, c->wc);
    return on_stream ? weft_recv_stream((void *)buf, count, t, peer, c->wc, stream)
                     : weft_recv((void *)buf, count, t, peer, c->wc);
}

static ncclResult_t p2p_group(struct ncclComm *c, enum move_kind kind, const char *fn,
                              const void *sendbuff, void *recvbuff, size_t count, weft_dtype_t t,
                              int root, bool on_stream, cudaStream_t stream)
{
    int p = c->nranks, me = c->rank;
    size_t esz = weft_dtype_size(t);
    if (kind != ALLTOALL && (root < 0 || root >= p))
        return leave_with(c, compat_fail(c, ncclInvalidArgument,
                                         "%s: root %d out of range (0..%d)", fn, root, p - 1));
    if (count > SIZE_MAX / (size_t)p / esz)
        return leave_with(
            c, compat_fail(c, ncclInvalidArgument, "%s: count %zu is too large", fn, count));
    size_t blk = count * esz;
    const char *s = sendbuff;
    char *d = recvbuff;
    bool root_side = kind == ALLTOALL || me == root;
    /* Buffers that hold p blocks: all of AlltoAll's, Gather's receive at
     * root and Scatter's send at root. */
    bool many_send = kind == ALLTOALL || (kind == SCATTER && root_side);
    bool many_recv = kind == ALLTOALL || (kind == GATHER && root_side);
    if (count > 0 && ((s == NULL && (many_send || kind == GATHER)) ||
                      (d == NULL && (many_recv || kind == SCATTER))))
        return leave_with(c, compat_fail(c, ncclInvalidArgument, "%s: NULL buffer", fn));
    if (kind == ALLTOALL && count > 0 && s < d + blk * p && d < s + blk * p)
        return leave_with(c, compat_fail(c, ncclInvalidArgument,
                                         "%s: sendbuff and recvbuff overlap (in-place AlltoAll "
                                         "is not supported)",
                                         fn));
    /* NCCL's in place: the root's own block already sits where it goes. */
    bool in_place = kind == GATHER ? root_side && s == d + (size_t)root * blk
                                   : kind == SCATTER && root_side && d == s + (size_t)root * blk;
    weft_group_start();
    weft_status_t st = WEFT_OK;
    for (int k = 0; k < p && st == WEFT_OK; k++) {
        /* Start at the next rank so the sends fan out rather than all
         * hitting rank 0 first. */
        int q = (me + k) % p;
        if (in_place && q == me)
            continue;
        if (kind == ALLTOALL) {
            st = p2p_one(c, true, s + (size_t)q * blk, count, t, q, on_stream, stream);
            if (st == WEFT_OK)
                st = p2p_one(c, false, d + (size_t)q * blk, count, t, q, on_stream, stream);
        } else if (kind == GATHER) {
            if (q == me)
                st = p2p_one(c, true, s, count, t, root, on_stream, stream);
            if (st == WEFT_OK && root_side)
                st = p2p_one(c, false, d + (size_t)q * blk, count, t, q, on_stream, stream);
        } else {
            if (root_side)
                st = p2p_one(c, true, s + (size_t)q * blk, count, t, q, on_stream, stream);
            if (st == WEFT_OK && q == me)
                st = p2p_one(c, false, d, count, t, root, on_stream, stream);
        }
    }
    weft_status_t end = weft_group_end();
    return leave(c, fn, st != WEFT_OK ? st : end);
}

/* The calls that move data without an operator: any datatype, then the
 * weft calls.  peer is the root of broadcast, gather and scatter, or the
 * peer of send and receive. */
static ncclResult_t move_coll(enum move_kind kind, const char *fn, const void *sendbuff,
                              void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                              ncclComm_t comm, cudaStream_t stream)
{
    ncclResult_t r;
    weft_dtype_t t;
    struct ncclComm *c = enter(comm, fn, stream, datatype, false, &t, &r);
    if (c == NULL)
        return r;
    bool on_stream = streamed(c, stream, sendbuff, recvbuff);
    if (kind >= ALLTOALL)
        return p2p_group(c, kind, fn, sendbuff, recvbuff, count, t, peer, on_stream, stream);
    weft_status_t st;
    if (kind == SEND || kind == RECV)
        st = p2p_one(c, kind == SEND, kind == SEND ? sendbuff : recvbuff, count, t, peer, on_stream,
                     stream);
    else if (on_stream)
        st = kind == ALLGATHER ? weft_allgather_stream(sendbuff, recvbuff, count, t, c->wc, stream)
                               : weft_broadcast_stream(sendbuff, recvbuff, count, t, peer, c->wc, stream);
    else
        st = kind == ALLGATHER ? weft_allgather(sendbuff, recvbuff, count, t, c->wc)
                               : weft_broadcast(sendbuff, recvbuff, count, t, peer, c->wc);
    return leave(c, fn, st);
}

ncclResult_t pncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return move_coll(ALLGATHER, "ncclAllGather", sendbuff, recvbuff, sendcount, datatype, 0, comm,
                     stream);
}
NCCL_ALIAS(ncclAllGather);

ncclResult_t pncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                            ncclDataType_t datatype, int root, ncclComm_t comm,
                            cudaStream_t stream)
{
    return move_coll(BROADCAST, "ncclBroadcast", sendbuff, recvbuff, count, datatype, root, comm,
                     stream);
}
NCCL_ALIAS(ncclBroadcast);

ncclResult_t pncclBcast(void *buff, size_t count, ncclDataType_t datatype, int root,
                        ncclComm_t comm, cudaStream_t stream)
{
    return pncclBroadcast(buff, buff, count, datatype, root, comm, stream);
}
NCCL_ALIAS(ncclBcast);

ncclResult_t pncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream)
{
    return move_coll(SEND, "ncclSend", sendbuff, NULL, count, datatype, peer, comm, stream);
}
NCCL_ALIAS(ncclSend);

ncclResult_t pncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream)
{
    return move_coll(RECV, "ncclRecv", NULL, recvbuff, count, datatype, peer, comm, stream);
}
NCCL_ALIAS(ncclRecv);

ncclResult_t pncclAlltoAll(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return move_coll(ALLTOALL, "ncclAlltoAll", sendbuff, recvbuff, count, datatype, 0, comm,
                     stream);
}
NCCL_ALIAS(ncclAlltoAll);

ncclResult_t pncclGather(const void *sendbuff, void *recvbuff, size_t count,
                         ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream)
{
    return move_coll(GATHER, "ncclGather", sendbuff, recvbuff, count, datatype, root, comm,
                     stream);
}
NCCL_ALIAS(ncclGather);

ncclResult_t pncclScatter(const void *sendbuff, void *recvbuff, size_t count,
                          ncclDataType_t datatype, int root, ncclComm_t comm,
                          cudaStream_t stream)
{
    return move_coll(SCATTER, "ncclScatter", sendbuff, recvbuff, count, datatype, root, comm,
                     stream);
}
NCCL_ALIAS(ncclScatter);
