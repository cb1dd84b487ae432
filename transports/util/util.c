/*
 * util.c - the slow side of util.h: a new context, a slab of requests
 * when a pool runs dry, a connection's first failure, and starting a waker thread.
 */
#include <stdio.h>
#include <stdlib.h>

#include "transports/transport.h"
#include "transports/util/util.h"

#define REQ_SLAB 64    /* requests per slab */
#define SLAB_ALIGN 64  /* verbs uses a request's address, low bits clear, as a work request id */

void *weft_tp_ctx_alloc(const struct weft_transport_init *args, size_t size, const char *tname)
{
    void *ctx = calloc(1, size);
    if (ctx == NULL)
        weft_error(args->err, WEFT_ERR_NO_MEMORY, "%s init: out of memory", tname);
    return ctx;
}

bool weft_req_pool_grow(struct weft_req_pool *p, size_t size)
{
    char *s;
    if (posix_memalign((void **)&s, SLAB_ALIGN, SLAB_ALIGN + REQ_SLAB * size) != 0)
        return false;
    *(void **)s = p->slabs;
    p->slabs = s;
    /* Pushed last to first: the first request taken is the slab's first. */
    for (int i = REQ_SLAB - 1; i >= 0; i--) {
        struct weft_req *r = (struct weft_req *)(s + SLAB_ALIGN + (size_t)i * size);
        r->next = p->free;
        p->free = r;
    }
    return true;
}

void weft_req_pool_fini(struct weft_req_pool *p)
{
    while (p->slabs) {
        void *s = p->slabs;
        p->slabs = *(void **)s;
        free(s);
    }
    p->free = NULL;
}

void weft_conn_vfail(struct weft_conn *c, weft_conn_close_fn *close_conn,
                     weft_status_t status, const char *fmt, va_list ap)
{
    if (c->err != WEFT_OK)
        return;
    vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
    c->err = status;
    weft_error(c->reqs->err, status, "%s", c->errmsg);
    close_conn(c, status);
}

void weft_conn_abort(struct weft_conn *c, weft_conn_close_fn *close_conn,
                     weft_status_t status, const char *why)
{
    if (c->err != WEFT_OK)
        return;
    snprintf(c->errmsg, sizeof(c->errmsg), "%s", why);
    c->err = status;
    close_conn(c, status);
}

int weft_waker_start(struct weft_waker *w, void *(*main)(void *), void *arg, void (*fn)(void *),
                     void *fn_arg)
{
    w->fn = fn;
    w->fn_arg = fn_arg;
    int err = pthread_create(&w->thread, NULL, main, arg);
    w->on = err == 0;
    return err;
}
