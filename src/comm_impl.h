/*
 * comm_impl.h - what communicator init shares across its files: comm.c
 * (lifecycle), launch.c (the launcher's environment, host identity),
 * cpu.c (core groups, pinning), links.c (the link table and opening the
 * transports) and memreg.c (user memory registration).  Private to them.
 */
#ifndef WEFT_COMM_IMPL_H
#define WEFT_COMM_IMPL_H

#include "comm.h"
#include "transports/registry.h"

/* What every rank publishes at init: where it runs and the base
 * transport's (tcp) address; the others' addresses follow in a second
 * round (links.c), once ranks know which transports their pairs take. */
struct weft_rank_info {
    char host[64];       /* WEFT_HOSTID, or hostname + boot id */
    char machine[64];    /* hostname + boot id: who shares our cores */
    uint32_t check;      /* WEFT_CHECK: every rank must agree */
    union weft_sockaddr rescue; /* shrink's rendezvous listener */
    uint32_t pid;
    uint32_t cores;      /* CPUs this rank may run on (selection's model) */
    uint32_t taddr_len;
    uint8_t taddr[WEFT_TRANSPORT_ADDR_MAX];
};

/* (launch.c) */
/* This host's identity: ranks with equal ones share memory.  WEFT_HOSTID
 * lets one machine pose as several hosts, unless `machine` asks for the
 * real one (ranks that share the cores, whatever they pose as). */
void weft_host_identity(char *out, size_t len, bool machine) WEFT_HIDDEN;

/* (cpu.c) */
/* Which ranks share a machine's cores, and how many cores it has (the
 * fewest any of its ranks may use): selection's model needs them, and all
 * ranks compute the same from the same table. */
weft_status_t weft_cpu_groups(struct weft_comm *comm, const struct weft_rank_info *all) WEFT_HIDDEN;
/* WEFT_BIND=1: the k-th rank of this machine runs on the k-th CPU it may
 * use (threads made later inherit it).  A failure is logged, not fatal. */
void weft_cpu_bind(int rank, int k, int local) WEFT_HIDDEN;

/* (links.c) */
/* Builds the link table: hosts from the init exchange, WEFT_TRANSPORT,
 * the calibration (when cal has any: it beats only the defaults), then
 * WEFT_TOPO_FILE, the operator's last word.  On error it says why. */
weft_status_t weft_links_table(struct weft_comm *comm, const struct weft_rank_info *all,
                               const struct weft_cal *cal, unsigned *allowed) WEFT_HIDDEN;
/* Opens every transport the link table gives a pair of this rank (as
 * WEFT_TRANSPORT allows), exchanges their addresses, picks a transport
 * per peer and binds every peer, this rank included; fills comm->tp in
 * progress order.  base_ctx (the base transport's) is already open and
 * is always kept; the others no peer uses are closed again.  A pair
 * whose transport did not open at both ends falls back to the base
 * transport; a WEFT_TP_ALL_RANKS one (verbs) that some rank could not
 * open is left by every rank (or fails init, when WEFT_TRANSPORT leaves
 * no other way).  On error base_ctx is closed too. */
weft_status_t weft_links_open(struct weft_comm *comm, const struct weft_transport_init *targs,
                              void *base_ctx, const struct weft_rank_info *all,
                              uint64_t deadline) WEFT_HIDDEN;

/* (memreg.c) Frees comm's registrations at destroy; the transports
 * release what they hold when they finalize. */
void weft_memreg_free_all(struct weft_comm *comm) WEFT_HIDDEN;

#endif /* WEFT_COMM_IMPL_H */
