/*
 * regcache.c - the registration cache and bounce pool of regcache.h: a
 * sorted array searched by binary search (a hit costs no registration and
 * no allocation), evicted least recently used first.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "transports/util/regcache.h"

#define RC_MAX_ENTRIES 4096

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
static size_t rc_lower(const struct weft_regcache *rc, uintptr_t a)
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

static void rc_remove_at(struct weft_regcache *rc, size_t i)
{
    struct weft_rc_entry *m = rc->v[i];
    rc->bytes -= m->end - m->start;
    memmove(&rc->v[i], &rc->v[i + 1], (rc->n - i - 1) * sizeof(rc->v[0]));
    rc->n--;
    rc->dereg(rc->arg, m->handle);
    free(m);
}

/* Drops idle entries, oldest first, until `need` more bytes and one more
 * entry fit. */
static void rc_evict(struct weft_regcache *rc, size_t need)
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
static struct weft_rc_entry *rc_insert(struct weft_regcache *rc, uintptr_t start, uintptr_t end)
{
    for (size_t i = rc_lower(rc, start); i < rc->n && rc->v[i]->start < end;) {
        if (rc->v[i]->refs != 0)
            return NULL; /* overlaps a held range: bounce this once */
        rc_remove_at(rc, i);
    }
    rc_evict(rc, end - start);
    if (rc->n == rc->cap) {
        size_t cap = rc->cap ? 2 * rc->cap : 64;
        struct weft_rc_entry **v = realloc(rc->v, cap * sizeof(*v));
        if (v == NULL)
            return NULL;
        rc->v = v;
        rc->cap = cap;
    }
    struct weft_rc_entry *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return NULL;
    m->handle = rc->reg(rc->arg, (void *)start, end - start);
    if (m->handle == NULL) {
        WEFT_INFO(WEFT_SUB_NET, "%s: cannot register %zu bytes at %p (%s); bouncing", rc->name,
                  (size_t)(end - start), (void *)start, strerror(errno));
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

struct weft_rc_entry *weft_regcache_get(struct weft_regcache *rc, const void *buf, size_t len,
                                        bool any)
{
    uintptr_t a = (uintptr_t)buf, ps = page_size();
    if (len == 0 || a + len < a)
        return NULL;
    size_t i = rc_lower(rc, a);
    struct weft_rc_entry *m = NULL;
    if (i < rc->n && rc->v[i]->start <= a && a + len <= rc->v[i]->end) {
        m = rc->v[i];
        rc->hits++;
    } else if (any) {
        rc->misses++;
        m = rc_insert(rc, a & ~(ps - 1), (a + len + ps - 1) & ~(ps - 1));
    }
    if (m) {
        m->refs++;
        m->tick = ++rc->tick;
    }
    return m;
}

void weft_regcache_put(struct weft_regcache *rc, struct weft_rc_entry *e)
{
    (void)rc;
    if (e && e->refs > 0)
        e->refs--;
}

struct weft_rc_entry *weft_regcache_pin(struct weft_regcache *rc, void *buf, size_t bytes)
{
    uintptr_t ps = page_size(), a = (uintptr_t)buf;
    struct weft_rc_entry *m = weft_regcache_get(rc, buf, bytes, false);
    if (m == NULL)
        m = rc_insert(rc, a & ~(ps - 1), (a + bytes + ps - 1) & ~(ps - 1));
    else
        m->refs--; /* get took one; the pin below is the registration's */
    if (m == NULL)
        return NULL;
    m->refs++;
    m->tick = ++rc->tick;
    return m;
}

bool weft_regcache_unpin(struct weft_regcache *rc, struct weft_rc_entry *e)
{
    for (size_t i = 0; i < rc->n; i++) {
        if (rc->v[i] != e)
            continue;
        if (e->refs > 0)
            e->refs--;
        /* Unregister now: the owner may unmap it next. */
        if (e->refs == 0)
            rc_remove_at(rc, i);
        return true;
    }
    return false;
}

void weft_regcache_fini(struct weft_regcache *rc)
{
    while (rc->n > 0)
        rc_remove_at(rc, rc->n - 1);
    free(rc->v);
    rc->v = NULL;
    rc->cap = 0;
    while (rc->bounce_free) {
        struct weft_bounce *b = rc->bounce_free;
        rc->bounce_free = b->next;
        rc->dereg(rc->arg, b->handle);
        free(b->buf);
        free(b);
    }
    rc->bounce_cached = 0;
}

/* ---- bounce buffers ------------------------------------------------------- */

struct weft_bounce *weft_bounce_get(struct weft_regcache *rc, size_t bytes)
{
    size_t size = 4096;
    while (size < bytes && size < ((size_t)1 << 62))
        size <<= 1;
    for (struct weft_bounce **p = &rc->bounce_free; *p; p = &(*p)->next) {
        if ((*p)->size == size) {
            struct weft_bounce *b = *p;
            *p = b->next;
            rc->bounce_cached -= size;
            return b;
        }
    }
    struct weft_bounce *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return NULL;
    b->size = size;
    if (posix_memalign((void **)&b->buf, page_size(), size) != 0) {
        free(b);
        return NULL;
    }
    b->handle = rc->reg(rc->arg, b->buf, size);
    if (b->handle == NULL) {
        free(b->buf);
        free(b);
        return NULL;
    }
    return b;
}

void weft_bounce_put(struct weft_regcache *rc, struct weft_bounce *b)
{
    if (b == NULL)
        return;
    if (rc->bounce_cached + b->size > rc->bounce_max) {
        rc->dereg(rc->arg, b->handle);
        free(b->buf);
        free(b);
        return;
    }
    b->next = rc->bounce_free;
    rc->bounce_free = b;
    rc->bounce_cached += b->size;
}
