/*
 * comm.h - the communicator: who we are, how to reach every peer, the
 * engine that runs our operations and the sticky error record.
 */
#ifndef WEFT_COMM_H
#define WEFT_COMM_H

#include <pthread.h>
#include <stdatomic.h>

#include "base/internal.h"
#include "base/sock.h"
#include "select/topo.h"
#include "algorithms/schedule.h"
#include "plan.h"

struct weft_bootstrap;
struct weft_engine;
struct weft_transport_ops;
struct weft_reg;
struct weft_dev;
struct weft_ll;

/*
 * Owner: the application (created by weft_comm_init*, freed by
 * weft_comm_destroy/abort).  Invariants: rank < nranks; every conns[i] is
 * a live connection of link_ops[i]'s transport (conns[rank] the self
 * transport's); `error` is WEFT_OK until the first fatal failure and
 * never changes after that.
 */
struct weft_comm {
    int rank, nranks;
    uint64_t job;                      /* identity, covered by every handshake */
    uint8_t secret[16];
    uint64_t timeout_ns;               /* WEFT_TIMEOUT_MS */
    unsigned algos[WEFT_COLL_COUNT];   /* WEFT_ALGO: per collective, WEFT_PLAN_BITs */
    struct weft_tune_cache tune;       /* plans chosen so far (tune.c) */
    int *cpu_group;                    /* (nranks) ranks sharing a machine's cores, from 0 */
    int *group_cores;                  /* cores of each such machine */
    _Atomic int deterministic;         /* WEFT_DETERMINISTIC / weft_comm_set_deterministic:
                                          reducing collectives run the ordered chain */
    struct weft_bootstrap *bs;
    /* The transports this rank uses, in the order progress visits them
     * (by the registry's priority: self, shm, verbs, then the base one,
     * tcp, where it sleeps and which is always open) and, per peer, the
     * one that carries its bytes. */
    struct {
        const struct weft_transport_ops *ops;
        void *ctx;
        int kind;                      /* index in weft_transports[] */
    } tp[WEFT_MAX_TRANSPORTS];
    int ntp;
    unsigned tp_off;                   /* 1u << kind: WEFT_TP_ALL_RANKS transports some
                                          rank could not open, so none uses them */
    struct weft_reg *regs;             /* weft_mem_register's, under regs_mu */
    pthread_mutex_t regs_mu;
    const struct weft_transport_ops **link_ops; /* (nranks) */
    uint8_t *link_kind;                /* (nranks) link_ops[i]'s index in weft_transports[] */
    struct weft_link_table topo;       /* per-pair transport and cost */
    void **conns;                      /* (nranks) */
    uint8_t taddr[128];                /* our published tcp address */
    size_t taddr_len;                  /* (a union weft_sockaddr) */
    struct weft_engine *eng;
    struct weft_ll *ll;                /* small calls in one shm exchange (ll.c), or NULL */
    _Atomic int error;                 /* sticky weft_status_t */
    _Atomic int aborting;              /* weft_comm_abort in progress */
    _Atomic int told_peers;            /* weft_comm_tell_peers ran */
    _Atomic int users;                 /* threads inside an API call on it */
    uint32_t nchildren;                /* split/shrink calls so far (all ranks agree) */
    /* Shrink's rendezvous, opened at init so that it needs no working link:
     * our listener, and every rank's address (the lowest survivor's is the
     * new communicator's root). */
    int rescue_fd;
    union weft_sockaddr *rescue;       /* (nranks) */
    struct weft_errsink err;           /* the last error message (weft_error) */
    /* Device buffers (src/devbuf.c): the worker, made by the first call
     * that needs it; whether plain calls look for device pointers (-1:
     * not decided yet). */
    _Atomic(struct weft_dev *) dev;
    _Atomic int cuda_on;
};

/* comm's error record, or NULL (the calling thread's) when there is no
 * communicator yet: what weft_error takes. */
static inline struct weft_errsink *weft_comm_err(struct weft_comm *comm)
{
    return comm ? &comm->err : NULL;
}

struct weft_uid;
/* Moves bytes on every transport; waits at most timeout_ms for an event. */
weft_status_t weft_comm_progress(struct weft_comm *comm, int timeout_ms) WEFT_HIDDEN;
/* Makes a blocked weft_comm_progress return soon; any thread. */
void weft_comm_wakeup(struct weft_comm *comm) WEFT_HIDDEN;
/* The whole init once the id is known; rank and nranks are checked. */
weft_status_t weft_comm_create(struct weft_comm **out, int nranks, const struct weft_uid *uid,
                               int rank) WEFT_HIDDEN;
/* Makes status the sticky error of comm if it has none yet; returns the
 * sticky error. */
weft_status_t weft_comm_fail(struct weft_comm *comm, weft_status_t status) WEFT_HIDDEN;
/* Once the communicator has failed: fails every link and tells every peer
 * why (the abort broadcast), so that ranks waiting on us end now instead of
 * at their timeout.  Runs once; the thread that drives the transports. */
void weft_comm_tell_peers(struct weft_comm *comm) WEFT_HIDDEN;
/* Enters an API call: true (and counted in comm->users) only while comm is
 * live, so destroy/abort can wait for every caller to leave before freeing. */
bool weft_comm_acquire(struct weft_comm *comm) WEFT_HIDDEN;
void weft_comm_release(struct weft_comm *comm) WEFT_HIDDEN;
/* True when comm is a live communicator (created and not yet destroyed). */
bool weft_comm_valid(struct weft_comm *comm) WEFT_HIDDEN;
/* Copies comm's last error into buf (thread-safe); returns buf. */
const char *weft_comm_last_error_copy(struct weft_comm *comm, char *buf, size_t len) WEFT_HIDDEN;

/* Ping-pongs each ring edge over the open links (all ranks call it, after
 * the links are up and before any operation), then shares the fits.
 * Nothing measured (nedges 0) with WEFT_CALIBRATE=0 or one rank.  A peer
 * that dies or stalls fails it (REMOTE, TIMEOUT at the deadline). */
weft_status_t weft_comm_calibrate(struct weft_comm *comm, struct weft_cal *cal,
                                  uint64_t deadline) WEFT_HIDDEN;
void weft_cal_free(struct weft_cal *cal) WEFT_HIDDEN;

#endif /* WEFT_COMM_H */
