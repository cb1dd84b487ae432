/*
 * registry.h - the transports this build knows, listed once in
 * transports/registry.c.  The communicator, the link table, calibration,
 * the topology file and weft-info loop over it instead of naming
 * transports; a transport's index in it is its link kind.
 */
#ifndef WEFT_REGISTRY_H
#define WEFT_REGISTRY_H

#include "transports/transport.h"

#define WEFT_MAX_TRANSPORTS 8 /* room in per-transport arrays */

/* The descriptors in link-kind order, NULL-terminated. */
extern const struct weft_transport_desc *const weft_transports[] WEFT_HIDDEN;

/* How many there are (at most WEFT_MAX_TRANSPORTS). */
int weft_transport_count(void) WEFT_HIDDEN;
/* The index of the transport called name (exactly), or -1. */
int weft_transport_find(const char *name) WEFT_HIDDEN;
/* t's name; "?" when t is not an index. */
const char *weft_transport_name(int t) WEFT_HIDDEN;
/* Whether t can reach a rank other than the caller (its can_reach holds
 * for some pair of two ranks): only those publish an address. */
bool weft_transport_reaches_others(int t) WEFT_HIDDEN;
/* The index of the WEFT_TP_BASE transport. */
int weft_transport_base(void) WEFT_HIDDEN;
/* Fills order[] with every index, by ascending priority; returns how many. */
int weft_transport_by_priority(int order[WEFT_MAX_TRANSPORTS]) WEFT_HIDDEN;
/* The transports WEFT_TRANSPORT may name (all but the implicit ones), as
 * a mask of 1u << index. */
unsigned weft_transport_choosable(void) WEFT_HIDDEN;
/* Writes the names of the transports in mask, registry order, as "a, b
 * or c" (last_sep " or ", " and "...) into buf; returns buf. */
const char *weft_transport_list(unsigned mask, const char *last_sep, char *buf, size_t len)
    WEFT_HIDDEN;
/* Registers every transport's settings with the parameter tables, in
 * registry order (weft-info lists them so); once per process. */
void weft_transport_register_params(void) WEFT_HIDDEN;

#endif /* WEFT_REGISTRY_H */
