/*
 * verbs_mem.c - the verbs side of memory registration: the shared cache
 * and bounce pool (transports/util/regcache.c) register with this rank's
 * protection domain, and weft_mem_register pins ranges in that cache.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "transports/verbs/verbs.h"

#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static void *mem_reg(void *vctx, void *addr, size_t len)
{
    struct vb_ctx *ctx = vctx;
    return ibv_reg_mr(ctx->pd, addr, len, ACCESS);
}

static void mem_dereg(void *vctx, void *handle)
{
    (void)vctx;
    ibv_dereg_mr(handle);
}

void vb_mem_init(struct vb_ctx *ctx)
{
    struct weft_regcache *rc = &ctx->rc;
    rc->reg = mem_reg;
    rc->dereg = mem_dereg;
    rc->arg = ctx;
    rc->max_bytes = (size_t)1 << 40;
    rc->bounce_max = 64u << 20;
    snprintf(rc->name, sizeof(rc->name), "rank %d: %s", ctx->rank, ctx->devname);
}

weft_status_t vb_reg_mem(void *vctx, void *buf, size_t bytes, void **mh)
{
    struct vb_ctx *ctx = vctx;
    *mh = NULL;
    if (bytes == 0)
        return WEFT_OK;
    struct weft_rc_entry *m = weft_regcache_pin(&ctx->rc, buf, bytes);
    if (m == NULL)
        return weft_error(ctx->err, WEFT_ERR_SYSTEM,
                          "rank %d: %s: cannot register %zu bytes at %p: %s", ctx->rank,
                          ctx->devname, bytes, buf,
                          errno ? strerror(errno) : "overlaps a range in use");
    *mh = m;
    return WEFT_OK;
}

weft_status_t vb_dereg_mem(void *vctx, void *mh)
{
    struct vb_ctx *ctx = vctx;
    if (mh == NULL || weft_regcache_unpin(&ctx->rc, mh))
        return WEFT_OK;
    return weft_error(ctx->err, WEFT_ERR_INVALID_ARG,
                      "rank %d: %p is not a verbs registration of this communicator", ctx->rank,
                      mh);
}
