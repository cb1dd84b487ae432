/*
 * tune.h - which algorithm runs a call: every algorithm WEFT_ALGO allows
 * and that builds the collective is run through the schedule simulator
 * (select/sim.h) on the communicator's link table, and the fastest
 * prediction wins.  Plans are cached per (collective, size class, element
 * size), so the simulation runs once per class, not once per call.
 */
#ifndef WEFT_TUNE_H
#define WEFT_TUNE_H

#include <stdatomic.h>

#include "base/internal.h"
#include "select/topo.h"
#include "algorithms/schedule.h"

/* One call's choice. */
struct weft_plan {
    int algo;    /* enum weft_algo */
    int variant; /* WEFT_VAR_* */
};

/* Masks hold one bit per (algorithm, variant). */
#define WEFT_PLAN_BIT(algo, variant) (1u << ((algo) * WEFT_VAR_COUNT + (variant)))
#define WEFT_PLAN_FAMILY(algo) (((1u << WEFT_VAR_COUNT) - 1) << ((algo) * WEFT_VAR_COUNT))
#define WEFT_PLAN_ALL ((1u << (WEFT_ALGO_COUNT * WEFT_VAR_COUNT)) - 1)

/* WEFT_ALGO -> per collective, a mask of WEFT_PLAN_BITs.  The syntax
 * is NCCL_ALGO's: a list applies to every collective ("ring,tree",
 * "^tree"), "coll:list" to one, entries separated by ';'
 * ("allreduce:rhd;allgather:ring").  "family/variant" names one variant
 * ("rhd/doubling", "tree/binomial").  Later entries override earlier ones;
 * an empty spec allows everything.  Unknown names, and a list that leaves
 * nothing, are errors with a message; masks is unchanged then. */
weft_status_t weft_tune_parse_algo(const char *spec, unsigned masks[WEFT_COLL_COUNT]) WEFT_HIDDEN;
/* The collective a name stands for ("allreduce", "reducescatter",
 * "allgather", "broadcast", "reduce"; case-insensitive), or -1. */
int weft_tune_coll_from_name(const char *name, size_t len) WEFT_HIDDEN;
/* "ring", "rhd/doubling", "tree/binomial", "hier/rhd": how logs, tools and
 * WEFT_ALGO name a plan. */
const char *weft_plan_name(struct weft_plan pl, char *buf, size_t len) WEFT_HIDDEN;

/* Seconds per reduced byte: float32 sums ran at 8-11 GB/s on one core here
 * (reduce.c's vector kernels, data in cache and out of it). */
#define WEFT_TUNE_GAMMA (1.0 / 9e9)

/* What a choice depends on.  Every rank of a communicator holds the same
 * inputs (the link table is shared at init), so every rank picks the same. */
struct weft_tune_in {
    int nranks;
    const struct weft_link_table *links; /* costs per pair and the node of each rank */
    size_t chunk_bytes;                  /* the engine's pipelining unit */
    double gamma;                        /* seconds per reduced byte (WEFT_TUNE_GAMMA) */
    unsigned mask;                       /* WEFT_PLAN_BITs allowed for this collective */
    const int *cpu_group, *group_cores;  /* who shares cores (NULL: a core per rank) */
};

/* The fastest predicted plan for coll moving bytes per rank in elements of
 * esize bytes; *seconds (may be NULL) gets its prediction.  When no allowed
 * algorithm builds coll, the fastest of all, with *fell_back set. */
struct weft_plan weft_tune_select(const struct weft_tune_in *in, int coll, size_t bytes,
                                  size_t esize, double *seconds, bool *fell_back) WEFT_HIDDEN;

/* Every plan weft_tune_select chooses from, best predicted first, with its
 * prediction (secs) and, when ports is not NULL, its busiest port's load;
 * how many (0 when nothing builds coll: one rank, or esize 0).  A plan
 * that moves the same messages in the same predicted time as one earlier
 * in the family order (weft_sim_result's shape: hier on one
 * node, or with one rank a node, is often a flat plan) is left out, so the
 * measured refinement below never times one schedule twice.  plans and
 * secs (and ports) hold WEFT_ALGO_COUNT * WEFT_VAR_COUNT. */
int weft_tune_ranked(const struct weft_tune_in *in, int coll, size_t bytes, size_t esize,
                     struct weft_plan *plans, double *secs, double *ports,
                     bool *fell_back) WEFT_HIDDEN;

/*
 * Measured refinement (WEFT_TUNE_TRIALS > 0).  The model ranks the plans;
 * those predicted within WEFT_TUNE_SPREAD of the best (at most
 * WEFT_TUNE_CANDIDATES) are then timed on the caller's own first calls of
 * the size class.  First every candidate runs one call, untimed, in rank
 * order: what a plan pays once on a communicator (scratch memory faulted
 * in, at 11-18 us a 4 KiB page here, 2 ms for 512 KiB; a connection
 * opened) is not charged to its first run, which with one round is all
 * it gets.  Then reps calls each, in `rounds` rounds in which every
 * candidate runs reps / rounds calls in a row (weft_tune_trial_cand), for
 * ncand * reps calls (trial i is call ncand + i); the first call of each
 * run carries a barrier (an op
 * the engine runs before it, once every earlier op has finished, holding
 * back every later one), so that no rank's backlog from one plan lands on
 * the next.  Every rank numbers its calls of a class alike (collectives
 * are called in one order everywhere), so every rank runs the same plan.
 * The next call carries an exchange of every rank's times (an allgather the
 * engine runs before it, once every trial has finished), and from its
 * result every rank computes the same winner; that call and the ones
 * queued behind it wait for it.
 */
#define WEFT_TUNE_MAX_CANDS 8
#define WEFT_TUNE_MAX_ROUNDS 3
/* WEFT_TUNE_TRIALS -1: a candidate's run in a round lasts about
 * WEFT_TUNE_RUN_SECS by the model's clock, from WEFT_TUNE_RUN_MIN to
 * WEFT_TUNE_RUN_MAX calls, and a class gets as many rounds (up to 3) as
 * runs of WEFT_TUNE_RUN_MIN calls of its candidates fit WEFT_TUNE_BUDGET
 * seconds by that clock. */
#define WEFT_TUNE_RUN_MIN 8
#define WEFT_TUNE_RUN_MAX 80
#define WEFT_TUNE_RUN_SECS 3e-3
#define WEFT_TUNE_BUDGET 40e-3
#define WEFT_TUNE_MAX_REPS (WEFT_TUNE_MAX_ROUNDS * WEFT_TUNE_RUN_MAX)
#define WEFT_TUNE_SPREAD 4.0 /* candidates: predicted at most this x the best */
/* A gap between two calls of a run this long is the program's pause: the
 * pipeline drains, and the next call fills it again.  Longer than the
 * scheduler's time slices, which a loop meets too. */
#define WEFT_TUNE_PAUSE_NS 5000000

/* One size class being measured.  Owner: the communicator's tune cache;
 * `issued` is guarded by the engine's mutex, `t` written by the driver as
 * trials finish, `plan` final once `decided` is set. */
struct weft_tune_measure {
    int coll, esize_idx, cls;                /* where it is in the cache */
    int ncand, reps, rounds;                 /* trials = ncand * reps; rounds divides reps */
    struct weft_plan cand[WEFT_TUNE_MAX_CANDS]; /* best predicted first */
    double predicted[WEFT_TUNE_MAX_CANDS];   /* seconds */
    /* The least a call of the candidate can take in a loop, by the model:
     * its busiest network port's bytes * beta (weft_sim_run).  0: no floor. */
    double floor[WEFT_TUNE_MAX_CANDS];
    int issued;                              /* calls of the class planned so far */
    /* This rank's seconds per trial, negated when the trial was cut from
     * its run's call before on this rank: another op finished between
     * them (a call of another class or collective, a send or receive), or
     * it started WEFT_TUNE_PAUSE_NS or more after that call finished (the
     * program paused: computed, waited on another communicator). */
    double t[WEFT_TUNE_MAX_CANDS * WEFT_TUNE_MAX_REPS];
    _Atomic int decided;
    struct weft_plan plan;
};

/* How one call takes part in the measurement of its class. */
struct weft_tune_ticket {
    struct weft_tune_measure *m; /* NULL: the plan returned is final */
    int trial;                   /* >= 0: this call is that trial of m */
    bool decide;                 /* this call carries the exchange of m's times */
    bool sync;                   /* this trial starts a run: a barrier goes first */
    bool pending;                /* the plan is m's, once decided */
    bool prime;                  /* a candidate's untimed call before the trials */
};

/* WEFT_TUNE_TRIALS -1: the calls per candidate (*reps) and rounds for
 * ncand candidates, the best predicted to take secs a call. */
void weft_tune_shape(int ncand, double secs, int64_t *reps, int64_t *rounds) WEFT_HIDDEN;

/* The calls in one run of m. */
int weft_tune_run_calls(const struct weft_tune_measure *m) WEFT_HIDDEN;

/* The candidate trial i of m runs. */
int weft_tune_trial_cand(const struct weft_tune_measure *m, int i) WEFT_HIDDEN;

/* The winner of m given every rank's trial times (nranks rows of ncand *
 * reps seconds, the layout of m->t).  A candidate's time in a round is
 * the mean of its run's calls on the slowest rank, what a loop of
 * back-to-back calls pays a call.  The first call of a run, counted from
 * the barrier's end, carries the barrier's skew and the pipeline's fill,
 * which a loop pays once, and is left out; but for broadcast and reduce
 * it is counted: their ranks can run calls ahead of the root, and with
 * ranks sharing a core they run their whole run while the root waits in
 * its first call, whose later calls then find their data waiting.  The
 * calls that wait for a descheduled peer now and then are part of it; and
 * the slowest rank sets the pace (a broadcast's root that sends and leaves
 * does not).
 * A run that was cut (negated times, on any rank: the program called
 * something else in between, or paused) is split at the cuts into
 * stretches, each of which starts as a run does, its first call carrying
 * a fresh fill (and for broadcast and reduce counted); the longest
 * stretch stands for the run when it holds at least half its calls, so
 * that a stray call of another class charges no candidate a second fill;
 * otherwise the cuts are the program's own rhythm, falling on every
 * candidate alike, and the whole run counts.
 * Its time is the median over the rounds, so one preempted call does not
 * decide; and no less than its floor: a run of a few calls can go faster
 * than any loop (a shaped link lets a burst through at full speed after the
 * barrier's idle time; buffers soak up a run, not a loop), and the loop is
 * what the choice serves; the rounds interleave the candidates, so a slow spell does not
 * fall on one alone.  per_cand (may be NULL) gets them.  Times that are
 * not finite are left out; ties go to the better prediction.  Pure, so
 * every rank computes the same. */
int weft_tune_decide(const struct weft_tune_measure *m, const double *all, int nranks,
                     double *per_cand) WEFT_HIDDEN;

/* Per-communicator cache of selections, lock-free on a hit: entries are
 * written whole (algo | variant << 8 | valid bit).  Classes being measured
 * have a weft_tune_measure until the communicator is freed or its
 * algorithms change (weft_comm_set_algo). */
#define WEFT_TUNE_CLASSES 96 /* size classes: two per power of two, 0 B .. 2^47 B */
/* The tuning file's plans for a communicator (select/tune_file.h), the
 * same on every rank: rank 0 read its file at init and sent them.  Written
 * once at init; a pick takes its class's plan when the communicator's
 * algorithms allow it. */
#define WEFT_TUNE_PATH_MAX 256
struct weft_tune_table {
    int8_t plan[WEFT_COLL_COUNT][4][WEFT_TUNE_CLASSES]; /* algo * WEFT_VAR_COUNT + variant; -1 none */
    char path[WEFT_TUNE_PATH_MAX];                       /* rank 0's file; "": no table */
};
struct weft_tune_cache {
    _Atomic int32_t plan[WEFT_COLL_COUNT][4][WEFT_TUNE_CLASSES];
    _Atomic int warned[WEFT_COLL_COUNT];
    struct weft_tune_measure *measure[WEFT_COLL_COUNT][4][WEFT_TUNE_CLASSES];
    struct weft_tune_table file;
};
/* Forgets every choice and frees every measurement: empty, as new, but
 * for the tuning file's table, which weft_comm_set_algo keeps. */
void weft_tune_cache_free(struct weft_tune_cache *c) WEFT_HIDDEN;

/* The size class of a byte count, and the byte count that stands for it. */
int weft_tune_class(size_t bytes) WEFT_HIDDEN;
size_t weft_tune_class_bytes(int cls) WEFT_HIDDEN;
/* The cache's index of an element size (1, 2, 4, 8 bytes). */
int weft_tune_esize_index(size_t esize) WEFT_HIDDEN;

/* The measurement's pieces, for the communicator's plan cache (src/plan.c):
 * store a class's plan; how many ranked plans get timed (0: measuring is
 * off); a new measurement of a class over plans[0..n), or NULL (fewer than
 * two candidates, measuring off, no memory: the prediction stands). */
void weft_tune_cache_store(struct weft_tune_cache *c, int coll, int e, int cls,
                           struct weft_plan pl) WEFT_HIDDEN;
int weft_tune_measured(const double *secs, int n) WEFT_HIDDEN;
struct weft_tune_measure *weft_tune_measure_new(int coll, int e, int cls,
                                                const struct weft_plan *plans, const double *secs,
                                                const double *ports, int n) WEFT_HIDDEN;

#endif /* WEFT_TUNE_H */
