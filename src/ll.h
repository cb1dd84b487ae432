/*
 * ll.h - small collectives in one shared-memory exchange, beside the
 * engine (ll.c): used when every peer is reached by a transport with
 * short-message slots (shm) and the call fits them.
 */
#ifndef WEFT_LL_H
#define WEFT_LL_H

#include "comm.h"
#include "engine.h"

/* After the links are open: comm->ll, or NULL when some peer's transport
 * has no short messages (or they are off: WEFT_SHM_LL_BYTES=0).  Every
 * rank reaches the same answer and the same size limit: the link table is
 * shared, and the limit is the least any rank gave its slots. */
void weft_ll_setup(struct weft_comm *comm) WEFT_HIDDEN;
void weft_ll_free(struct weft_comm *comm) WEFT_HIDDEN;
/* The largest message of the path (0: off). */
size_t weft_ll_max(const struct weft_comm *comm) WEFT_HIDDEN;

/* Runs a checked, blocking, host-buffer call here when it fits: every
 * rank makes the same decision from the arguments and comm alone (the
 * automatic choice for the collective, WEFT_CHECK off, each message at
 * most weft_ll_max bytes).  True: *st is the call's status. */
bool weft_ll_run(struct weft_comm *comm, const struct weft_op_args *a, weft_status_t *st) WEFT_HIDDEN;

#endif /* WEFT_LL_H */
