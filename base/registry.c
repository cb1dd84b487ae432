/*
 * registry.c - sets of live handles (communicators, NCCL handles), so that
 * a destroyed or made-up handle is refused instead of dereferenced.
 */
#include <stdlib.h>

#include "base/internal.h"

bool weft_registry_add(struct weft_registry *r, const void *p)
{
    pthread_mutex_lock(&r->mu);
    if (r->n == r->cap) {
        size_t cap = r->cap ? 2 * r->cap : 16;
        const void **v = realloc(r->v, cap * sizeof(*v));
        if (v == NULL) {
            pthread_mutex_unlock(&r->mu);
            return false;
        }
        r->v = v;
        r->cap = cap;
    }
    r->v[r->n++] = p;
    pthread_mutex_unlock(&r->mu);
    return true;
}

/* Index of p, or r->n when it is not there; r->mu held. */
static size_t find_locked(const struct weft_registry *r, const void *p)
{
    size_t i = 0;
    while (i < r->n && r->v[i] != p)
        i++;
    return i;
}

bool weft_registry_remove(struct weft_registry *r, const void *p)
{
    pthread_mutex_lock(&r->mu);
    size_t i = find_locked(r, p);
    bool found = i < r->n;
    if (found)
        r->v[i] = r->v[--r->n];
    pthread_mutex_unlock(&r->mu);
    return found;
}

bool weft_registry_find(struct weft_registry *r, const void *p, void (*found)(const void *p))
{
    pthread_mutex_lock(&r->mu);
    bool in = find_locked(r, p) < r->n;
    if (in && found)
        found(p);
    pthread_mutex_unlock(&r->mu);
    return in;
}
