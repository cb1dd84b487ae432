/*
 * regcache.c - the verbs transport's memory: a registration cache of
 * page-aligned ranges sorted by address (reference counted, bounded in
 * bytes, least recently used evicted first) and a pool of registered
 * bounce buffers for memory the cache may not hold.
 *
 * Why a user buffer is cached only when asked: a pinned registration keeps
 * the pages it pinned.  A buffer the user frees and a new one mapped at the
 * same address would be served by the old pages, and data would land where
 * nobody reads it.  So by default user memory is copied through bounce
 * buffers, and only ranges registered through the transport's reg_mem are
 * zero-copy (their owner deregisters before unmapping); WEFT_IB_REGCACHE=1
 * caches every buffer, for programs that never unmap what weft saw.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transports/verbs/verbs.h"

#define RC_MAX_ENTRIES 4096
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ)

static uintptr_t page_size(void)
{
    static uintptr_t ps;
    if (ps == 0) {
        long v = sysconf(_SC_PAGESIZE);
        ps = v > 0 ? (uintptr_t)v : 4096;
    }
    return ps;
}

/* First entry whose end is above a (entries do not overlap). */
static size_t rc_lower(const struct vb_regcache *rc, uintptr_t a)
{
    size_t lo = 0, hi = rc->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (rc->v[mid]->end <= a)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void rc_remove_at(struct vb_regcache *rc, size_t i)
{
    struct vb_mr *m = rc->v[i];
    rc->bytes -= m->end - m->start;
    memmove(&rc->v[i], &rc->v[i + 1], (rc->n - i - 1) * sizeof(rc->v[0]));
    rc->n--;
    ibv_dereg_mr(m->mr);
    free(m);
}

/* Drops idle entries, oldest first, until `need` more bytes and one more
 * entry fit. */
static void rc_evict(struct vb_regcache *rc, size_t need)
{
    while (rc->n > 0 && (rc->bytes + need > rc->max_bytes || rc->n >= RC_MAX_ENTRIES)) {
        size_t victim = SIZE_MAX;
        for (size_t i = 0; i < rc->n; i++)
            if (rc->v[i]->refs == 0 && (victim == SIZE_MAX || rc->v[i]->tick < rc->v[victim]->tick))
                victim = i;
        if (victim == SIZE_MAX)
            return;
        rc_remove_at(rc, victim);
        rc->evictions++;
    }
}

/* Registers [start, end) and inserts it; entries it overlaps that nobody
 * holds are replaced (the new range covers them). */
static struct vb_mr *rc_insert(struct vb_ctx *ctx, uintptr_t start, uintptr_t end)
{
    struct vb_regcache *rc = &ctx->rc;
    for (size_t i = rc_lower(rc, start); i < rc->n && rc->v[i]->start < end;) {
        if (rc->v[i]->refs != 0)
            return NULL; /* overlaps a held range: bounce this once */
        rc_remove_at(rc, i);
    }
    rc_evict(rc, end - start);
    if (rc->n == rc->cap) {
        size_t cap = rc->cap ? 2 * rc->cap : 64;
        struct vb_mr **v = realloc(rc->v, cap * sizeof(*v));
        if (v == NULL)
            return NULL;
        rc->v = v;
        rc->cap = cap;
    }
    struct vb_mr *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->mr = ibv_reg_mr(ctx->pd, (void *)start, end - start, ACCESS);
    if (m->mr == NULL) {
        WEFT_INFO(WEFT_SUB_NET, "rank %d: %s: cannot register %zu bytes at %p (%s); bouncing",
                  ctx->rank, ctx->devname, (size_t)(end - start), (void *)start,
                  strerror(errno));
        free(m);
        return NULL;
    }
    m->start = start;
    m->end = end;
    size_t i = rc_lower(rc, start);
    memmove(&rc->v[i + 1], &rc->v[i], (rc->n - i) * sizeof(rc->v[0]));
    rc->v[i] = m;
    rc->n++;
    rc->bytes += end - start;
    return m;
}

struct vb_mr *vb_rc_get(struct vb_ctx *ctx, const void *buf, size_t len, bool any)
{
    struct vb_regcache *rc = &ctx->rc;
    uintptr_t a = (uintptr_t)buf, ps = page_size();
    if (len == 0 || a + len < a)
        return NULL;
    size_t i = rc_lower(rc, a);
    struct vb_mr *m = NULL;
    if (i < rc->n && rc->v[i]->start <= a && a + len <= rc->v[i]->end) {
        m = rc->v[i];
        rc->hits++;
    } else if (any) {
        rc->misses++;
        m = rc_insert(ctx, a & ~(ps - 1), (a + len + ps - 1) & ~(ps - 1));
    }
    if (m) {
        m->refs++;
        m->tick = ++rc->tick;
    }
    return m;
}

void vb_rc_put(struct vb_ctx *ctx, struct vb_mr *m)
{
    (void)ctx;
    if (m && m->refs > 0)
        m->refs--;
}

weft_status_t vb_reg_mem(void *vctx, void *buf, size_t bytes, void **mh)
{
    struct vb_ctx *ctx = vctx;
    *mh = NULL;
    if (bytes == 0)
        return WEFT_OK;
    uintptr_t ps = page_size(), a = (uintptr_t)buf;
    struct vb_mr *m = vb_rc_get(ctx, buf, bytes, false);
    if (m == NULL)
        m = rc_insert(ctx, a & ~(ps - 1), (a + bytes + ps - 1) & ~(ps - 1));
    else
        m->refs--; /* get took one; the pin below is the registration's */
    if (m == NULL)
        return weft_error(ctx->err, WEFT_ERR_SYSTEM,
                          "rank %d: %s: cannot register %zu bytes at %p: %s", ctx->rank,
                          ctx->devname, bytes, buf, errno ? strerror(errno) : "overlaps a range in use");
    m->refs++;
    m->tick = ++ctx->rc.tick;
    *mh = m;
    return WEFT_OK;
}

weft_status_t vb_dereg_mem(void *vctx, void *mh)
{
    struct vb_ctx *ctx = vctx;
    struct vb_regcache *rc = &ctx->rc;
    for (size_t i = 0; mh && i < rc->n; i++) {
        if (rc->v[i] != mh)
            continue;
        if (rc->v[i]->refs > 0)
            rc->v[i]->refs--;
        /* Unregister now: the owner may unmap it next. */
        if (rc->v[i]->refs == 0)
            rc_remove_at(rc, i);
        return WEFT_OK;
    }
    return mh == NULL ? WEFT_OK
                      : weft_error(ctx->err, WEFT_ERR_INVALID_ARG,
                                   "rank %d: %p is not a verbs registration of this communicator",
                                   ctx->rank, mh);
}

void vb_rc_fini(struct vb_ctx *ctx)
{
    struct vb_regcache *rc = &ctx->rc;
    while (rc->n > 0)
        rc_remove_at(rc, rc->n - 1);
    free(rc->v);
    rc->v = NULL;
    rc->cap = 0;
    while (ctx->bounce_free) {
        struct vb_bounce *b = ctx->bounce_free;
        ctx->bounce_free = b->next;
        ibv_dereg_mr(b->mr);
        free(b->buf);
        free(b);
    }
    ctx->bounce_cached = 0;
}

/* ---- bounce buffers ------------------------------------------------------- */

struct vb_bounce *vb_bounce_get(struct vb_ctx *ctx, size_t bytes)
{
    size_t size = 4096;
    while (size < bytes && size < ((size_t)1 << 62))
        size <<= 1;
    for (struct vb_bounce **p = &ctx->bounce_free; *p; p = &(*p)->next) {
        if ((*p)->size == size) {
            struct vb_bounce *b = *p;
            *p = b->next;
            ctx->bounce_cached -= size;
            return b;
        }
    }
    struct vb_bounce *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->size = size;
    if (posix_memalign((void **)&b->buf, page_size(), size) != 0) {
        free(b);
        return NULL;
    }
    b->mr = ibv_reg_mr(ctx->pd, b->buf, size, ACCESS);
    if (b->mr == NULL) {
        free(b->buf);
        free(b);
        return NULL;
    }
    return b;
}

void vb_bounce_put(struct vb_ctx *ctx, struct vb_bounce *b)
{
    if (b == NULL)
        return;
    if (ctx->bounce_cached + b->size > ctx->bounce_max) {
        ibv_dereg_mr(b->mr);
        free(b->buf);
        free(b);
        return;
    }
    b->next = ctx->bounce_free;
    ctx->bounce_free = b;
    ctx->bounce_cached += b->size;
}
