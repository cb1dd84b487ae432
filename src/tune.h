/*
 * tune.h - which algorithm runs a call: the one the cost model predicts
 * fastest among those WEFT_ALGO allows and that exist for the collective.
 */
#ifndef WEFT_TUNE_H
#define WEFT_TUNE_H

#include "internal.h"
#include "algorithms/schedule.h"

/* One call's choice. */
struct weft_plan {
    int algo;    /* enum weft_algo */
    int variant; /* WEFT_VAR_* */
};

/* WEFT_ALGO -> per collective, a bit mask of enum weft_algo.  The syntax
 * is NCCL_ALGO's: a list applies to every collective ("ring,tree",
 * "^tree"), "coll:list" to one, entries separated by ';'
 * ("allreduce:rhd;allgather:ring").  Later entries override earlier ones;
 * an empty spec allows everything.  Unknown names, and a list that leaves
 * nothing, are errors with a message; masks is unchanged then. */
weft_status_t weft_tune_parse_algo(const char *spec, unsigned masks[WEFT_COLL_COUNT]) WEFT_HIDDEN;
/* The collective a name stands for ("allreduce", "reducescatter",
 * "allgather", "broadcast", "reduce"; case-insensitive), or -1. */
int weft_tune_coll_from_name(const char *name, size_t len) WEFT_HIDDEN;
/* The plan for one call of coll moving bytes (per rank) over nranks.  An
 * algorithm in mask that cannot serve coll is passed over; when none can,
 * the automatic choice among all (reported once at INFO). */
struct weft_plan weft_tune_pick(unsigned mask, int coll, int nranks, size_t bytes) WEFT_HIDDEN;

#endif /* WEFT_TUNE_H */
