/*
 * regcache.h - memory registration for zero-copy transports: a cache of
 * registered page-aligned ranges (reference counted, bounded in bytes,
 * least recently used evicted first) and a pool of registered bounce
 * buffers for memory the cache may not hold.  The transport says how to
 * register (reg/dereg); the cache decides when.
 *
 * Why a user buffer is cached only when asked: a pinned registration keeps
 * the pages it pinned.  A buffer the user frees and a new one mapped at the
 * same address would be served by the old pages, and data would land where
 * nobody reads it.  So by default user memory is copied through bounce
 * buffers, and only ranges pinned through the transport's reg_mem are
 * zero-copy (their owner deregisters before unmapping); a transport may
 * offer to cache every buffer (verbs: WEFT_IB_REGCACHE=1), for programs
 * that never unmap what weft saw.
 */
#ifndef WEFT_TRANSPORT_REGCACHE_H
#define WEFT_TRANSPORT_REGCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"

/*
 * A registered range.  Owner: its cache, which keeps entries sorted by
 * start; refs counts requests and user registrations holding it (an entry
 * with refs > 0 is never evicted); pinned entries (from weft_mem_register)
 * stay until unpinned.
 */
struct weft_rc_entry {
    uintptr_t start, end;  /* page aligned, end exclusive */
    void *handle;          /* what reg returned (verbs: struct ibv_mr *) */
    uint32_t refs;
    uint64_t tick;         /* last use, for LRU */
};

/* A registered buffer of the bounce pool (size a power of two). */
struct weft_bounce {
    struct weft_bounce *next;
    size_t size;
    char *buf;
    void *handle;          /* what reg returned */
};

/*
 * One context's registrations.  Owner: the transport's context, which sets
 * the first fields (a zeroed cache with them is empty) and calls
 * weft_regcache_fini while reg's resources (a protection domain) still
 * stand.  One thread at a time.
 */
struct weft_regcache {
    /* Registers [addr, addr + len): a handle, or NULL with errno set. */
    void *(*reg)(void *arg, void *addr, size_t len);
    void (*dereg)(void *arg, void *handle);
    void *arg;
    size_t max_bytes;               /* registered bytes the cache may hold */
    size_t bounce_max;              /* bytes of idle bounce buffers kept */
    char name[96];                  /* "rank 3: mlx5_0", for the log */
    struct weft_rc_entry **v;       /* (cap) sorted by start */
    size_t n, cap;
    size_t bytes;
    uint64_t tick;
    uint64_t hits, misses, evictions;
    struct weft_bounce *bounce_free;
    size_t bounce_cached;
};

/* The entry covering [buf, buf + len), registering it when absent (and
 * `any` or it lies in a pinned range); takes a reference.  NULL: not
 * registered (the caller bounces). */
struct weft_rc_entry *weft_regcache_get(struct weft_regcache *rc, const void *buf, size_t len,
                                        bool any) WEFT_HIDDEN;
/* Drops get's reference (NULL ok). */
void weft_regcache_put(struct weft_regcache *rc, struct weft_rc_entry *e) WEFT_HIDDEN;
/* weft_mem_register: an entry covering [buf, buf + bytes) held until
 * unpinned.  NULL: reg failed (errno) or the range overlaps one in use. */
struct weft_rc_entry *weft_regcache_pin(struct weft_regcache *rc, void *buf, size_t bytes)
    WEFT_HIDDEN;
/* Drops a pin, unregistering the range when nobody else holds it (its
 * owner may unmap it next).  False: e is not an entry of rc. */
bool weft_regcache_unpin(struct weft_regcache *rc, struct weft_rc_entry *e) WEFT_HIDDEN;
/* Unregisters and frees everything, bounce buffers included. */
void weft_regcache_fini(struct weft_regcache *rc) WEFT_HIDDEN;

/* A registered buffer of at least bytes, from the pool or new; NULL
 * without memory or registration. */
struct weft_bounce *weft_bounce_get(struct weft_regcache *rc, size_t bytes) WEFT_HIDDEN;
/* Back to the pool, or freed beyond bounce_max (NULL ok). */
void weft_bounce_put(struct weft_regcache *rc, struct weft_bounce *b) WEFT_HIDDEN;

#endif /* WEFT_TRANSPORT_REGCACHE_H */
