/*
 * tacc.h - the canonical tree of the trainer's sums, on one rank: float
 * vectors pushed in item order meet pairwise, adjacent pairs first (see
 * detsum.h for the tree and its continuation across ranks).  Used by the
 * model for its chunk sums and by parallel.c for micro-batch gradients.
 */
#ifndef WEFT_TRAINER_TACC_H
#define WEFT_TRAINER_TACC_H

#include <stddef.h>

/*
 * Sums a stream of equal-length float vectors, pushed in item order, in the
 * canonical tree, holding floor(log2(max_items)) + 2 vectors: a binary
 * counter whose partial sums merge while their sizes are equal, and at
 * finish from the smallest up (7 items: S0123 + (S45 + m6)).
 */
struct tacc;

/* n floats per item, at most max_items (>= 1) items between resets.  NULL
 * when out of memory or max_items < 1. */
struct tacc *tacc_create(size_t n, int max_items);
void tacc_destroy(struct tacc *a); /* NULL ok */
/* Forgets every item pushed. */
void tacc_reset(struct tacc *a);
/* The same, and items of n floats from now on (n <= the n of create):
 * one accumulator serves every shape up to the largest. */
void tacc_reset_len(struct tacc *a, size_t n);
/* Where the caller writes the next item: n floats of undefined contents,
 * owned by a, valid until the next tacc_commit or tacc_reset.  The same
 * buffer until commit.  NULL once max_items items were pushed. */
float *tacc_slot(struct tacc *a);
/* Pushes the slot's contents as the next item. */
void tacc_commit(struct tacc *a);
/* Items pushed since the last reset. */
int tacc_items(const struct tacc *a);
/* The canonical sum of the items pushed (n floats owned by a, valid until
 * the next reset; the caller may change them, e.g. to reduce them across
 * ranks in place); *items (may be NULL) gets their count.  NULL when no
 * item was pushed.  Reset before pushing again. */
float *tacc_finish(struct tacc *a, size_t *items);
/* dst[i] += src[i], i < n: the float add of every tree here. */
void tacc_add_into(float *dst, const float *src, size_t n);

#endif /* WEFT_TRAINER_TACC_H */
