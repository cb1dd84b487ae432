/*
 * tacc.c - the binary-counter accumulator of tacc.h.
 */
#include <stdbool.h>
#include <stdlib.h>

#include "tacc.h"

#define ALIGN_FLOATS 16 /* 64 bytes: each buffer starts on a cache line */

/*
 * Owner: the caller of tacc_create.  buf[k] is stack level k; levels
 * 0..depth-1 hold partial sums of size[k] items (powers of two, strictly
 * decreasing upwards) in item order; buf[depth] is the slot.  Level k is
 * never needed above floor(log2(max_items)) + 1, so nbuf levels suffice.
 */
struct tacc {
    size_t n, stride;  /* floats per item; floats between buffers */
    int max_items, nbuf;
    float *mem;        /* (nbuf, stride) */
    float **buf;       /* (nbuf) */
    int *size;         /* (nbuf) items in each level */
    int depth, items;
    bool finished;
};

struct tacc *tacc_create(size_t n, int max_items)
{
    if (max_items < 1)
        return NULL;
    struct tacc *a = calloc(1, sizeof(*a));
    if (!a)
        return NULL;
    int levels = 1;
    while (levels < 31 && (1 << levels) <= max_items)
        levels++;
    a->n = n;
    a->stride = (n + ALIGN_FLOATS - 1) / ALIGN_FLOATS * ALIGN_FLOATS;
    a->max_items = max_items;
    a->nbuf = levels + 1;
    size_t bytes = a->stride * (size_t)a->nbuf * sizeof(float);
    a->mem = aligned_alloc(ALIGN_FLOATS * sizeof(float), bytes ? bytes : ALIGN_FLOATS * 4);
    a->buf = calloc((size_t)a->nbuf, sizeof(*a->buf));
    a->size = calloc((size_t)a->nbuf, sizeof(*a->size));
    if (!a->mem || !a->buf || !a->size) {
        tacc_destroy(a);
        return NULL;
    }
    for (int k = 0; k < a->nbuf; k++)
        a->buf[k] = a->mem + (size_t)k * a->stride;
    return a;
}

void tacc_destroy(struct tacc *a)
{
    if (!a)
        return;
    free(a->size);
    free(a->buf);
    free(a->mem);
    free(a);
}

void tacc_reset(struct tacc *a)
{
    a->depth = 0;
    a->items = 0;
    a->finished = false;
}

void tacc_reset_len(struct tacc *a, size_t n)
{
    tacc_reset(a);
    a->n = n <= a->stride ? n : a->stride;
}

float *tacc_slot(struct tacc *a)
{
    if (a->finished || a->items >= a->max_items)
        return NULL;
    return a->buf[a->depth];
}

void tacc_commit(struct tacc *a)
{
    if (a->finished || a->items >= a->max_items)
        return;
    a->size[a->depth++] = 1;
    a->items++;
    /* Two equal neighbours are sibling subtrees of the canonical tree. */
    while (a->depth >= 2 && a->size[a->depth - 2] == a->size[a->depth - 1]) {
        tacc_add_into(a->buf[a->depth - 2], a->buf[a->depth - 1], a->n);
        a->size[a->depth - 2] *= 2;
        a->depth--;
    }
}

int tacc_items(const struct tacc *a)
{
    return a->items;
}

float *tacc_finish(struct tacc *a, size_t *items)
{
    if (items)
        *items = (size_t)a->items;
    if (a->items == 0)
        return NULL;
    /* A partial top subtree joins its left sibling before that one joins
     * its own: smallest first, as the levels of the canonical tree do. */
    for (; a->depth > 1; a->depth--)
        tacc_add_into(a->buf[a->depth - 2], a->buf[a->depth - 1], a->n);
    a->finished = true;
    return a->buf[0];
}

void tacc_add_into(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}
