/*
 * registry.h - what algorithms/ keeps to itself: the descriptor each family
 * file defines, and the list of them (registry.c) that weft_sched_build
 * and the name and serves look-ups read.
 */
#ifndef WEFT_ALGORITHMS_REGISTRY_H
#define WEFT_ALGORITHMS_REGISTRY_H

#include "algorithms/schedule.h"

/* Bit c of a serves mask: the variant builds collective c. */
#define WEFT_SERVES(c) (1u << WEFT_COLL_##c)
/* Every collective a family can build (send and recv are the engine's). */
#define WEFT_SERVES_ALL                                                                     \
    (WEFT_SERVES(ALLREDUCE) | WEFT_SERVES(REDUCE_SCATTER) | WEFT_SERVES(ALLGATHER) |       \
     WEFT_SERVES(BROADCAST) | WEFT_SERVES(REDUCE))

/* One algorithm family, defined once in its own file and never changed.
 * A variant exists where its serves mask is not 0. */
struct weft_algo_desc {
    const char *name;                     /* WEFT_ALGO, -a, weft-info, the logs */
    const char *variants[WEFT_VAR_COUNT]; /* "family/variant" names; NULL: unnamed */
    unsigned serves[WEFT_VAR_COUNT];      /* per variant: WEFT_SERVES bits */
    /* Builds d's schedule into s (empty on entry).  weft_sched_build has
     * checked d against what every family needs (rank, root, chunk, count
     * overflow) and that the variant serves d->coll; the builder checks
     * only what is its own.  On failure the caller empties s. */
    weft_status_t (*build)(const struct weft_coll_desc *d, struct weft_schedule *s);
};

/* The families' descriptors, one per file (algorithms/list.h). */
#define WEFT_ALGO_ENTRY(e, d) extern const struct weft_algo_desc weft_algo_##d;
#include "algorithms/list.h"
#undef WEFT_ALGO_ENTRY

/* Recursive doubling allreduce (rd.c), rhd's WEFT_VAR_RHD_DOUBLING. */
weft_status_t weft_rd_build(const struct weft_coll_desc *d, struct weft_schedule *s);

#endif /* WEFT_ALGORITHMS_REGISTRY_H */
