/*
 * memreg.c - weft_mem_register/deregister: a user buffer registered with
 * every transport of the communicator that registers memory, run as the
 * communicator's driver.
 */
#include <stdlib.h>

#include "comm_impl.h"
#include "devbuf.h"
#include "engine.h"

#define REG_MAGIC 0x4d474552u /* "REGM" */

/* What weft_mem_register hands out: per transport of comm, its handle. */
struct weft_reg {
    uint32_t magic;
    struct weft_reg *next;      /* comm->regs, under regs_mu */
    struct weft_comm *comm;
    void *buf;
    size_t bytes;
    void *mh[WEFT_MAX_TRANSPORTS];
    bool device;                /* device memory: the transports never see it
                                   (device buffers are staged or go through
                                   CUDA IPC), so nothing is registered */
};

struct reg_call {
    struct weft_comm *comm;
    struct weft_reg *r;
    bool undo;
};

/* As the driver: every transport that registers memory. */
static weft_status_t reg_apply(void *arg)
{
    struct reg_call *rc = arg;
    struct weft_comm *comm = rc->comm;
    weft_status_t st = WEFT_OK;
    for (int i = 0; i < comm->ntp; i++) {
        const struct weft_transport_ops *t = comm->tp[i].ops;
        if (t->reg_mem == NULL || rc->r->device)
            continue;
        if (rc->undo) {
            weft_status_t s2 = rc->r->mh[i] ? t->dereg_mem(comm->tp[i].ctx, rc->r->mh[i]) : WEFT_OK;
            if (st == WEFT_OK)
                st = s2;
            rc->r->mh[i] = NULL;
        } else if (rc->r->bytes > 0) {
            st = t->reg_mem(comm->tp[i].ctx, rc->r->buf, rc->r->bytes, &rc->r->mh[i]);
            if (st != WEFT_OK)
                break;
        }
    }
    return st;
}

weft_status_t weft_mem_register(weft_comm_t comm, void *buf, size_t bytes, void **handle)
{
    if (comm == NULL || handle == NULL || (buf == NULL && bytes > 0))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_mem_register: comm %p, buf %p, handle %p", (void *)comm, buf,
                                (void *)handle);
    *handle = NULL;
    if (!weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_mem_register: invalid communicator");
    struct weft_reg *r = calloc(1, sizeof(*r));
    weft_status_t st;
    if (r == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "weft_mem_register: out of memory");
    } else {
        *r = (struct weft_reg){.magic = REG_MAGIC, .comm = comm, .buf = buf, .bytes = bytes,
                               .device = weft_dev_on_device(comm, buf, NULL)};
        struct reg_call rc = {comm, r, false};
        st = weft_engine_exclusive(comm, reg_apply, &rc);
        if (st != WEFT_OK) {
            rc.undo = true;
            weft_engine_exclusive(comm, reg_apply, &rc);
            free(r);
        } else {
            pthread_mutex_lock(&comm->regs_mu);
            r->next = comm->regs;
            comm->regs = r;
            pthread_mutex_unlock(&comm->regs_mu);
            *handle = r;
        }
    }
    weft_comm_release(comm);
    return st;
}

/* Takes r out of comm's list; false when it is not there (never was, or
 * deregistered already): nothing of it is read before it is found. */
static bool reg_unlink(struct weft_comm *comm, const void *r)
{
    bool found = false;
    pthread_mutex_lock(&comm->regs_mu);
    for (struct weft_reg **p = &comm->regs; *p; p = &(*p)->next) {
        if (*p == r) {
            *p = (*p)->next;
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&comm->regs_mu);
    return found;
}

weft_status_t weft_mem_deregister(weft_comm_t comm, void *handle)
{
    struct weft_reg *r = handle;
    if (comm == NULL || !weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_mem_deregister: invalid communicator");
    weft_status_t st;
    if (r == NULL || !reg_unlink(comm, r)) {
        st = weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                              "weft_mem_deregister: %p is not a registration of this communicator",
                              handle);
    } else {
        struct reg_call rc = {comm, r, true};
        st = weft_engine_exclusive(comm, reg_apply, &rc);
        r->magic = 0;
        free(r);
    }
    weft_comm_release(comm);
    return st;
}

void weft_memreg_free_all(struct weft_comm *comm)
{
    while (comm->regs) { /* the transports below release what they hold */
        struct weft_reg *r = comm->regs;
        comm->regs = r->next;
        free(r);
    }
}
