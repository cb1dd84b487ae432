/* sv_qp.c - RC QPs of the software verbs device: creation, the state
 * machine with the attribute masks drivers enforce, and posting to the send
 * and receive queues.  sv_wire.c carries the WRs out. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "softverbs.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SV_EXPORT __attribute__((visibility("default")))

/* ---- verbs ---- */

SV_EXPORT struct ibv_qp *ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
    struct sv_context *ctx = sv_ctx(pd->context);
    struct ibv_qp_cap *c = &init->cap;
    struct sv_qp *qp;
    uint32_t qpn;
    int fd, err;

    if (init->qp_type != IBV_QPT_RC || init->srq) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    if (!init->send_cq || !init->recv_cq || init->send_cq->context != pd->context ||
        init->recv_cq->context != pd->context || c->max_send_wr < 1 ||
        c->max_send_wr > SV_MAX_WR || c->max_recv_wr > SV_MAX_WR ||
        c->max_send_sge > SV_MAX_SGE || c->max_recv_sge > SV_MAX_SGE ||
        c->max_inline_data > SV_MAX_INLINE) {
        errno = EINVAL;
        return NULL;
    }
    c->max_inline_data = SV_MAX_INLINE;
    qp = sv_zalloc(sizeof(*qp));
    if (!qp)
        return NULL;
    qp->cap = *c;
    qp->sq = calloc(c->max_send_wr, sizeof(*qp->sq));
    qp->rq = calloc(c->max_recv_wr ? c->max_recv_wr : 1, sizeof(*qp->rq));
    if (!qp->sq || !qp->rq) {
        err = ENOMEM;
        goto err_free;
    }
    fd = sv_bind_unique(ctx->dir, "qp", 2, (1u << 24) - 2, &qpn, qp->path);
    if (fd < 0) {
        err = errno;
        goto err_free;
    }
    qp->sig_all = init->sq_sig_all;
    qp->ibv.context = pd->context;
    qp->ibv.qp_context = init->qp_context;
    qp->ibv.pd = pd;
    qp->ibv.send_cq = init->send_cq;
    qp->ibv.recv_cq = init->recv_cq;
    qp->ibv.qp_num = qpn;
    qp->ibv.handle = qpn;
    qp->ibv.state = IBV_QPS_RESET;
    qp->ibv.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&qp->ibv.mutex, NULL);
    pthread_cond_init(&qp->ibv.cond, NULL);
    pthread_mutex_lock(&ctx->lock);
    qp->listen = sv_sock_new(ctx, fd, SV_SOCK_LISTEN, qp);
    if (!qp->listen) {
        pthread_mutex_unlock(&ctx->lock);
        err = ENOMEM;
        goto err_sock;
    }
    qp->next = ctx->qps;
    ctx->qps = qp;
    ((struct sv_pd *)pd)->refs++;
    pthread_mutex_unlock(&ctx->lock);
    return &qp->ibv;

err_sock:
    pthread_cond_destroy(&qp->ibv.cond);
    pthread_mutex_destroy(&qp->ibv.mutex);
    unlink(qp->path);
    close(fd);
err_free:
    free(qp->rq);
    free(qp->sq);
    free(qp);
    errno = err;
    return NULL;
}

SV_EXPORT int ibv_destroy_qp(struct ibv_qp *ibqp)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = (struct sv_qp *)ibqp;

    pthread_mutex_lock(&ctx->lock);
    /* The name goes now, so a peer connecting from here on is refused. */
    unlink(qp->path);
    qp->zombie = true;
    ((struct sv_pd *)ibqp->pd)->refs--;
    sv_ring(ctx);
    while (!qp->freed)
        pthread_cond_wait(&ctx->cond, &ctx->lock);
    pthread_mutex_unlock(&ctx->lock);
    pthread_cond_destroy(&qp->ibv.cond);
    pthread_mutex_destroy(&qp->ibv.mutex);
    free(qp->rq);
    free(qp->sq);
    free(qp);
    return 0;
}

/* Required and optional attributes per RC transition (IBTA 11.2.4.2, as
 * the kernel's ib_modify_qp_is_ok enforces them). */
static int transition_masks(enum ibv_qp_state cur, enum ibv_qp_state next, int *req, int *opt)
{
    *req = *opt = 0;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR)
        return 0;
    if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
        *req = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
        *opt = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
        *req = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
        *opt = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX;
    } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        *req = IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
               IBV_QP_MAX_QP_RD_ATOMIC;
        *opt = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS |
               IBV_QP_MIN_RNR_TIMER | IBV_QP_PATH_MIG_STATE;
    } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
        *opt = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH |
               IBV_QP_PATH_MIG_STATE | IBV_QP_MIN_RNR_TIMER;
    } else {
        return -1;
    }
    return 0;
}

static bool attr_values_ok(struct sv_context *ctx, const struct ibv_qp_attr *a, int mask)
{
    if ((mask & IBV_QP_PORT) && a->port_num != 1)
        return false;
    if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
        return false;
    if ((mask & IBV_QP_PATH_MTU) && (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096))
        return false;
    if ((mask & IBV_QP_AV) && (a->ah_attr.port_num > 1 ||
                               (ctx->link_ib ? !a->ah_attr.is_global && !a->ah_attr.dlid
                                             : !a->ah_attr.is_global)))
        return false;
    if ((mask & IBV_QP_DEST_QPN) && a->dest_qp_num >= (1u << 24))
        return false;
    if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
        return false;
    if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
        return false;
    if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
        return false;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
        return false;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > 16)
        return false;
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > 16)
        return false;
    return true;
}

static void qp_reset(struct sv_context *ctx, struct sv_qp *qp)
{
    sv_qp_close_conns(ctx, qp);
    qp->conn = SV_CONN_NONE;
    qp->sq_head = qp->sq_send = qp->sq_tail = qp->next_seq = 0;
    qp->rq_head = qp->rq_tail = 0;
    qp->lost_ns = qp->retry_at = qp->resend_at = 0;
    memset(&qp->attr, 0, sizeof(qp->attr));
}

SV_EXPORT int ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = (struct sv_qp *)ibqp;
    enum ibv_qp_state cur, next;
    int req, opt, m = mask & ~IBV_QP_STATE;

    pthread_mutex_lock(&ctx->lock);
    cur = ibqp->state;
    next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
    if (((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur) ||
        transition_masks(cur, next, &req, &opt) || (m & req) != req || (m & ~(req | opt)) ||
        !attr_values_ok(ctx, a, m) || (next != IBV_QPS_RESET && next != IBV_QPS_ERR &&
                                      ctx->port_state != IBV_PORT_ACTIVE && next != IBV_QPS_INIT)) {
        pthread_mutex_unlock(&ctx->lock);
        return EINVAL;
    }
    if (next == IBV_QPS_RESET) {
        qp_reset(ctx, qp);
    } else if (next == IBV_QPS_ERR) {
        sv_qp_set_err(ctx, qp);
    } else {
        if (m & IBV_QP_PKEY_INDEX)
            qp->attr.pkey_index = a->pkey_index;
        if (m & IBV_QP_PORT)
            qp->attr.port_num = a->port_num;
        if (m & IBV_QP_ACCESS_FLAGS)
            qp->attr.qp_access_flags = a->qp_access_flags;
        if (m & IBV_QP_AV)
            qp->attr.ah_attr = a->ah_attr;
        if (m & IBV_QP_PATH_MTU)
            qp->attr.path_mtu = a->path_mtu;
        if (m & IBV_QP_DEST_QPN)
            qp->attr.dest_qp_num = a->dest_qp_num;
        if (m & IBV_QP_RQ_PSN)
            qp->attr.rq_psn = a->rq_psn;
        if (m & IBV_QP_MAX_DEST_RD_ATOMIC)
            qp->attr.max_dest_rd_atomic = a->max_dest_rd_atomic;
        if (m & IBV_QP_MIN_RNR_TIMER)
            qp->attr.min_rnr_timer = a->min_rnr_timer;
        if (m & IBV_QP_TIMEOUT)
            qp->attr.timeout = a->timeout;
        if (m & IBV_QP_RETRY_CNT)
            qp->attr.retry_cnt = a->retry_cnt;
        if (m & IBV_QP_RNR_RETRY)
            qp->attr.rnr_retry = a->rnr_retry;
        if (m & IBV_QP_SQ_PSN)
            qp->attr.sq_psn = a->sq_psn;
        if (m & IBV_QP_MAX_QP_RD_ATOMIC)
            qp->attr.max_rd_atomic = a->max_rd_atomic;
        if (m & IBV_QP_PATH_MIG_STATE)
            qp->attr.path_mig_state = a->path_mig_state;
        ibqp->state = next;
        qp->attr.qp_state = next;
    }
    ibqp->state = next;
    qp->attr.qp_state = next;
    sv_ring(ctx);
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

SV_EXPORT int ibv_query_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask,
                           struct ibv_qp_init_attr *init)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = (struct sv_qp *)ibqp;

    (void)mask; /* everything is cheap to report */
    pthread_mutex_lock(&ctx->lock);
    *a = qp->attr;
    a->qp_state = ibqp->state;
    a->cur_qp_state = ibqp->state;
    a->cap = qp->cap;
    if (init) {
        memset(init, 0, sizeof(*init));
        init->qp_context = ibqp->qp_context;
        init->send_cq = ibqp->send_cq;
        init->recv_cq = ibqp->recv_cq;
        init->cap = qp->cap;
        init->qp_type = IBV_QPT_RC;
        init->sq_sig_all = qp->sig_all;
    }
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

/* An SGE is valid when a local MR of this QP's PD covers it. */
static bool lkey_ok(struct sv_context *ctx, struct sv_qp *qp, const struct ibv_sge *sg, int need)
{
    struct sv_mr *mr = sv_mr_find(ctx, sg->lkey, false);
    uint64_t lo, hi;

    if (!mr || mr->ibv.pd != qp->ibv.pd || (need && !(mr->access & need)))
        return false;
    lo = (uintptr_t)mr->ibv.addr;
    hi = lo + mr->ibv.length;
    return sg->addr >= lo && sg->addr <= hi && sg->length <= hi - sg->addr;
}

int sv_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = (struct sv_qp *)ibqp;
    int err = 0;

    pthread_mutex_lock(&ctx->lock);
    for (; wr; wr = wr->next) {
        bool inl = (wr->send_flags & IBV_SEND_INLINE) && wr->opcode != IBV_WR_RDMA_READ;
        uint64_t len = 0;
        struct sv_swqe *w;

        if (ibqp->state != IBV_QPS_RTS && ibqp->state != IBV_QPS_ERR) {
            err = EINVAL;
            break;
        }
        if (wr->num_sge < 0 || wr->num_sge > (int)qp->cap.max_send_sge ||
            (wr->num_sge && !wr->sg_list)) {
            err = EINVAL;
            break;
        }
        if (wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_WRITE_WITH_IMM &&
            wr->opcode != IBV_WR_SEND && wr->opcode != IBV_WR_SEND_WITH_IMM &&
            wr->opcode != IBV_WR_RDMA_READ) {
            err = EINVAL;
            break;
        }
        for (int i = 0; i < wr->num_sge; i++)
            len += wr->sg_list[i].length;
        if (len > (1ull << 31) || (inl && len > SV_MAX_INLINE)) {
            err = EINVAL;
            break;
        }
        if (ibqp->state == IBV_QPS_ERR) {
            struct sv_swqe f = {.wr_id = wr->wr_id, .opcode = wr->opcode};

            sv_push_send_wc(ctx, qp, &f, IBV_WC_WR_FLUSH_ERR);
            continue;
        }
        if (qp->sq_tail - qp->sq_head >= qp->cap.max_send_wr) {
            err = ENOMEM;
            break;
        }
        w = sq_at(qp, qp->sq_tail);
        memset(w, 0, offsetof(struct sv_swqe, sge));
        w->wr_id = wr->wr_id;
        w->opcode = wr->opcode;
        w->signaled = (wr->send_flags & IBV_SEND_SIGNALED) || qp->sig_all;
        w->inl = inl;
        w->seq = qp->next_seq++;
        w->imm = wr->imm_data;
        w->rkey = wr->wr.rdma.rkey;
        w->raddr = wr->wr.rdma.remote_addr;
        w->len = (uint32_t)len;
        w->nsge = wr->num_sge;
        w->preset = IBV_WC_SUCCESS;
        w->post_ns = sv_now_ns();
        w->rnr_left = qp->attr.rnr_retry == 7 ? -1 : qp->attr.rnr_retry;
        for (int i = 0, off = 0; i < wr->num_sge; i++) {
            const struct ibv_sge *sg = &wr->sg_list[i];

            w->sge[i].iov_base = (void *)(uintptr_t)sg->addr;
            w->sge[i].iov_len = sg->length;
            if (inl) {
                memcpy(w->data + off, (void *)(uintptr_t)sg->addr, sg->length);
                off += (int)sg->length;
            } else if (sg->length &&
                       !lkey_ok(ctx, qp, sg,
                                wr->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_LOCAL_WRITE : 0)) {
                w->preset = IBV_WC_LOC_PROT_ERR;
            }
        }
        qp->sq_tail++;
        if (ctx->fault.kill_qp_n && ++ctx->send_posts == ctx->fault.kill_qp_n) {
            sv_async_event(ctx, IBV_EVENT_QP_FATAL, ibqp);
            sv_qp_set_err(ctx, qp);
        }
    }
    if (err)
        *bad = wr;
    sv_ring(ctx);
    pthread_mutex_unlock(&ctx->lock);
    return err;
}

int sv_post_recv(struct ibv_qp *ibqp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    struct sv_context *ctx = sv_ctx(ibqp->context);
    struct sv_qp *qp = (struct sv_qp *)ibqp;
    int err = 0;

    pthread_mutex_lock(&ctx->lock);
    for (; wr; wr = wr->next) {
        struct sv_rwqe *r;

        if (ibqp->state == IBV_QPS_RESET || wr->num_sge < 0 ||
            wr->num_sge > (int)qp->cap.max_recv_sge || (wr->num_sge && !wr->sg_list)) {
            err = EINVAL;
            break;
        }
        if (ibqp->state == IBV_QPS_ERR) {
            sv_push_recv_wc(ctx, qp, wr->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_RECV, 0, false, 0, 0);
            continue;
        }
        if (qp->rq_tail - qp->rq_head >= qp->cap.max_recv_wr) {
            err = ENOMEM;
            break;
        }
        r = rq_at(qp, qp->rq_tail++);
        r->wr_id = wr->wr_id;
        r->nsge = wr->num_sge;
        r->len = 0;
        r->bad_lkey = false;
        for (int i = 0; i < wr->num_sge; i++) {
            const struct ibv_sge *sg = &wr->sg_list[i];

            r->sge[i].iov_base = (void *)(uintptr_t)sg->addr;
            r->sge[i].iov_len = sg->length;
            r->len += sg->length;
            if (sg->length && !lkey_ok(ctx, qp, sg, IBV_ACCESS_LOCAL_WRITE))
                r->bad_lkey = true;
        }
    }
    if (err)
        *bad = wr;
    pthread_mutex_unlock(&ctx->lock);
    return err;
}
