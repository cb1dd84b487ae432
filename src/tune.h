/*
 * tune.h - which algorithm runs a call: the one the cost model predicts
 * fastest among those WEFT_ALGO allows and that exist for the collective.
 */
#ifndef WEFT_TUNE_H
#define WEFT_TUNE_H

#include "internal.h"

/* WEFT_ALGO (NCCL_ALGO syntax: "ring,rd", "^rd") -> bit mask of enum
 * weft_algo; an empty spec allows all.  Unknown names and a spec that
 * leaves nothing are errors with a message. */
weft_status_t weft_tune_parse_algo(const char *spec, unsigned *mask) WEFT_HIDDEN;
/* The algorithm for one call of coll moving bytes (per rank) over nranks.
 * An algorithm in mask that cannot serve coll is passed over; when none
 * can, the ring (it serves every collective). */
int weft_tune_pick(unsigned mask, int coll, int nranks, size_t bytes) WEFT_HIDDEN;

#endif /* WEFT_TUNE_H */
