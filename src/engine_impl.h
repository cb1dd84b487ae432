/*
 * engine_impl.h - what the two halves of the engine share: op.c (op
 * objects, the schedule cache, scratch buffers) and engine.c (driving).
 * Private to those two files.
 */
#ifndef WEFT_ENGINE_IMPL_H
#define WEFT_ENGINE_IMPL_H

#include <pthread.h>

#include "algorithms/schedule.h"
#include "check.h"
#include "engine.h"

/* Step states.  LANDED: a RECV_REDUCE whose bytes are in its staging slot
 * while its dependencies are still in flight; the reduce waits for them. */
enum { ST_PENDING = 0, ST_POSTED, ST_LANDED, ST_DONE };

#define SCHED_CACHE 64   /* schedules kept per communicator */
#define MAX_ACTIVE 32    /* ops in flight at once; later ones wait queued */
#define SCAN_BUDGET 512  /* unposted steps examined per posting pass */
#define POLL_SLICE_MS 100
/* A spin this long without news starts yielding the core on every turn. */
#define YIELD_AFTER_NS 50000

/* A cached schedule; refs counts the ops using it (evicted only at 0). */
struct sched_entry {
    struct weft_coll_desc desc;
    struct weft_schedule s;
    int refs;
    uint64_t last_use;
    bool valid;
};

/* What an op is: a caller's operation, (WEFT_CHECK=1) the fingerprint
 * exchange the engine runs before a caller's collective, the exchange of
 * trial times that ends a measurement (tune.h), or the barrier before each
 * run of trials.  The last three have no waiter: the engine frees them
 * when they retire or fail. */
enum op_kind { OP_USER = 0, OP_CHECK, OP_TUNE, OP_SYNC };

struct weft_tune_measure;

/* A scratch buffer, kept for the communicator's life once touched. */
struct scratch {
    void *p;
    size_t bytes;
    bool busy;
};

/*
 * One operation (also what a weft_request_t points to).  Owner: the engine
 * from submit until the waiter frees it through wait/test.  Per-step arrays
 * have room for cap steps and are reused when the op is recycled.
 */
/* A RECV_REDUCE's staging slot.  Over a transport with irecv_take the
 * chunks are combined straight out of its memory once the step's inputs
 * are final; those offered earlier go to the slot: [0, staged) is there. */
struct weft_rr {
    struct weft_engine *eng;
    struct weft_op *op;
    uint32_t step;
    int32_t slot;
    size_t staged;
};

struct weft_op {
    struct weft_op *next;        /* queue, active list or free list */
    struct weft_comm *comm;
    struct weft_op_args a;
    uint64_t seq;
    struct sched_entry *ent;     /* cached schedule, or NULL for p2p */
    struct weft_schedule own;    /* p2p: a one-step schedule */
    const struct weft_schedule *s;
    size_t cap;
    uint8_t *st;                 /* (cap) step state */
    void **treq;                 /* (cap) transport request */
    struct weft_rr *rr;          /* (cap) a RECV_REDUCE's staging */
    uint32_t *posted;            /* (cap) indices of posted steps */
    size_t nposted, first_pending, ndone;
    struct scratch *scratch;
    char *bufs[3];
    size_t esize;
    weft_status_t status;
    bool done;                   /* guarded by eng->mu */
    bool started;                /* the driver has set it up */
    uint64_t t0;                 /* ns when it started */

    /* Measured selection (tune.h): a trial records its time in tm->t; a
     * pending op has no schedule (s == NULL) until tm is decided; a tune
     * op (OP_TUNE) allgathers tm's times; a sync op (OP_SYNC) starts once
     * every op before it has retired, and ends once every rank's has. */
    struct weft_tune_measure *tm;
    int trial;                   /* >= 0: this op is that trial of tm */
    bool pending;
    bool prime;                  /* a candidate's untimed call before the trials */
    struct weft_op *tune_pre;    /* user op from op_new to submit: its tune op */
    double *times;               /* tune op: (cap_times) every rank's trial times;
                                    sync op: one per rank */
    size_t cap_times;

    /* WEFT_CHECK=1 only. */
    uint8_t kind;                /* enum op_kind */
    bool gated;                  /* user op: its check has not passed yet, so
                                    neither it nor any later op posts a step */
    bool verified;               /* check op: the records agreed */
    struct weft_op *pre;         /* user op from op_new to submit: its check op */
    struct weft_op *target;      /* check op: the user op it holds back */
    struct weft_fingerprint *fps; /* check op: (nranks) records, ours at [rank];
                                    kept when the op is recycled */
};

/*
 * Invariants: only the thread with driving == true touches `active`, the
 * transport, staging slots and step state; everything else below the
 * mutex is guarded by mu.
 */
struct weft_engine {
    struct weft_comm *comm;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct weft_op *qhead, *qtail;   /* submitted, not yet active (mu) */
    struct weft_op *free_ops;        /* recycled ops (mu) */
    size_t nlive;                    /* submitted and not finished (mu) */
    bool driving;                    /* (mu) */
    bool thread_started, stop;       /* (mu) */
    pthread_t thread;
    uint64_t next_seq;               /* (mu) */

    /* driver-only state */
    struct weft_op *active, *active_tail;
    size_t nactive;
    uint32_t *stamp;                 /* (2 * nranks) peer-blocked marks */
    uint32_t gen;
    char *staging;                   /* (nslots * chunk_bytes) */
    int32_t *free_slots;
    int nslots, nfree_slots;
    size_t chunk_bytes;
    int spin_us;
    bool yield;                      /* spin with sched_yield: more ranks than cores */
    uint64_t last_event_ns;
    uint64_t last_finish_ns;         /* when the last user or sync op finished */
    /* The last user op that finished: its measurement and trial (NULL, -1
     * when it was none), to tell whether a trial followed the one before. */
    const struct weft_tune_measure *last_tm;
    int last_trial;

    struct sched_entry cache[SCHED_CACHE];   /* (mu) */
    uint64_t cache_clock;
    struct sched_entry *cache_hot;           /* (mu) the last one used: looked at first */
    struct scratch scratch[MAX_ACTIVE];      /* (driver) */

    /* WEFT_CHECK=1 with more than one rank: every collective is preceded
     * by a check op running check_sched. */
    bool check;
    struct weft_schedule check_sched;        /* the fingerprint exchange */
    uint64_t coll_seq;                       /* collectives submitted (mu) */
    struct weft_engine_stats stats;          /* ops, checks (mu); sends (driver) */
};


/* Returns a finished op to the free list; its status. */
weft_status_t weft_engine_reap(struct weft_engine *eng, struct weft_op *op) WEFT_HIDDEN;
/* Builds the schedule of a pending op whose measurement has decided
 * (driver only). */
weft_status_t weft_engine_op_plan(struct weft_engine *eng, struct weft_op *op) WEFT_HIDDEN;
/* Gives op a scratch buffer of its schedule's size (driver only). */
weft_status_t weft_engine_scratch_acquire(struct weft_engine *eng, struct weft_op *op) WEFT_HIDDEN;

#endif /* WEFT_ENGINE_IMPL_H */
