/*
 * sim.h - predicts how long a collective takes: builds every rank's
 * schedule and runs them together, as a discrete-event simulation, under
 * an alpha-beta-gamma cost model.  Selection and weft-sim use it.
 */
#ifndef WEFT_SIM_H
#define WEFT_SIM_H

#include <stddef.h>
#include <stdint.h>

#include "algorithms/schedule.h"

struct weft_link_table; /* select/topo.h */

/* The cost model.  Borrowed by weft_sim_predict for the call only.
 * Invariant: every cost the model gives is finite and >= 0. */
struct weft_sim_model {
    /* alpha (s per message) and beta (s per byte) of the link i -> j */
    void (*link)(const void *ctx, int i, int j, double *alpha, double *beta);
    const void *ctx;
    double gamma; /* s per byte reduced (RECV_REDUCE), on the receiving rank */
    double copy;  /* s per byte of a COPY step */
    size_t esize; /* bytes per element, >= 1 */
    /* Shared cores (NULL: a CPU of its own for every rank).  Ranks with the
     * same cpu_group[r] run on one machine's group_cores[cpu_group[r]]
     * cores: their reduces and copies, and every message between two of
     * them (shared memory: a CPU copies it), each take one of those cores
     * for their duration, so more ranks than cores slow whatever runs at
     * once.  Groups are numbered from 0 and have at least one core. */
    const int *cpu_group;
    const int *group_cores;
    /* The machine of each rank (NULL: a machine of its own for every
     * rank); only messages between two machines count towards
     * port_seconds. */
    const int *host;
    /* The symmetry the link costs have (weft_sim_two_level sets it): when
     * > 0, the cost of i -> j depends only on whether i / sym_ppn equals
     * j / sym_ppn.  weft_sim_run then looks for a group of rank
     * permutations that keeps both the costs and the schedules, and runs
     * one rank per class (see there).  0: every rank is run. */
    int sym_ppn;
    /* Most steps a run of every rank may hold (0: as many as memory
     * allows); a schedule over the limit is WEFT_ERR_UNSUPPORTED, found
     * before most of it is built: every build is capped at the steps left
     * (weft_schedule.max_steps), so memory stays within the limit even
     * for one rank's schedule larger than it. */
    size_t max_steps;
    /* Most seconds building every rank's schedule may take (0: no limit),
     * projected from the first 64 ranks: ring and direct build in time
     * proportional to their steps, but hier scans the node table, so p
     * ranks cost O(p^2) whatever the steps (1.4 s at 16,384 ranks).  Over
     * it is WEFT_ERR_UNSUPPORTED; being a clock, it decides only whether
     * a prediction is made, never its value. */
    double max_build_seconds;
};

/* Predicted seconds for the collective tmpl describes (tmpl->rank is ignored:
 * all tmpl->nranks ranks' schedules are built and run together).
 *
 * The model (Thakur, Rabenseifner & Gropp 2005, with the engine's posting
 * rules):
 * - SEND, RECV and COPY start once their deps are done; a RECV_REDUCE's
 *   receive is posted once its deps are posted, its reduce waits for them
 *   to be done.  Messages of one link (peer and direction) are posted in
 *   schedule order.
 * - A message i -> j moves once its send and its receive are both posted,
 *   taking alpha(i,j) + bytes * beta(i,j).  Each rank has one send port and
 *   one receive port (full duplex): a message waits until the sender's send
 *   port and the receiver's receive port are both free, and messages claim
 *   the ports in the order they became ready (ties: by post time, then
 *   the send's place in its rank's schedule, then rank; sim.c says why).
 *   The send completes when the message has arrived (no buffering).
 * - A RECV_REDUCE then costs bytes * gamma of the receiving rank's CPU, a
 *   COPY bytes * copy (even one whose source and destination coincide);
 *   one CPU per rank runs them one at a time, in the order they become
 *   ready.  With cpu_group set, each also needs a free core of its
 *   machine, and so does a message between two ranks of one machine.
 *   Staging slots are unlimited.
 * *seconds gets the time the last step of any rank completes (0 when no
 * rank has a step).  Errors: WEFT_ERR_INVALID_ARG for a bad tmpl or model
 * (nranks < 1, NULL model, a cost not finite or negative), a schedule
 * whose sends and receives do not match or that deadlocks; what
 * weft_sched_build returns; WEFT_ERR_NO_MEMORY.  *seconds is set only on
 * success.  Cost: O(S log S) time and at most about 70 bytes of memory per step
 * for S steps over the ranks run (weft_sim_run: all, or one per class),
 * plus building every rank's schedule, or the few a symmetry checks. */
weft_status_t weft_sim_predict(const struct weft_coll_desc *tmpl, const struct weft_sim_model *m,
                               double *seconds) WEFT_HIDDEN;

/* What one simulated call gives. */
struct weft_sim_result {
    double seconds; /* weft_sim_predict's */
    /* The most bytes * beta any one port (a rank's sends, or its receives)
     * carried to or from other machines (model->host): the least a call
     * can take on average in a loop of calls back to back, however far
     * ranks run ahead and overlap them, since a network port carries one
     * message at a time.  alpha is left out (latency overlaps; occupancy
     * does not).  Within a machine there is no port: cores copy the bytes
     * (cpu_group), at a rate that depends on what else they run. */
    double port_seconds;
    /* A hash of what every rank does, step by step: each message's kind,
     * peer and size, each copy's size (a copy onto itself, which the
     * engine skips, left out).  Two plans with the same shape, seconds and
     * port_seconds move the same messages in the same order and are, for
     * timing, one plan (a hierarchical schedule on one node is its
     * intra-node phase alone). */
    uint64_t shape;
    /* Ranks actually run: nranks, or the classes' representatives. */
    int ranks_run;
    /* The permutations that stood in for the other ranks: "none",
     * "rotation" (r -> r + k * ranks_run) or "xor" (r -> r ^ k * ranks_run). */
    const char *symmetry;
};

/* weft_sim_predict, with the busiest port's load too.  Errors as there
 * (a NULL res: WEFT_ERR_INVALID_ARG); *res is set only on success.
 *
 * Symmetry (m->sym_ppn > 0, no cpu_group and no host): a group G of rank
 * permutations acting freely, each keeping every link's cost, such that
 * rank g(r)'s schedule is rank r's with every peer q replaced by g(q)
 * (same kinds, counts and deps, step by step), makes every rank of an
 * orbit run the same steps at the same times, so only one rank per orbit
 * (0 .. ranks_run - 1) is run: a message to rank q meets the matching step
 * of q's representative, a message from rank r the representative's port.
 * The groups tried, fewest classes first: r ^ k and r + k (one class;
 * xor needs a power-of-two rank count and node size, rotation one node or
 * one rank a node), then r ^ k*sym_ppn and r + k*sym_ppn (sym_ppn classes).
 * A group counts when every rank's schedule is the moved one: all ranks
 * are built and compared when that costs at most a few million steps and
 * 2048 ranks, else every representative against four ranks of its
 * orbit (the next, the far side, the last and one pseudo-random).
 * Dependencies count: rhd's ranks with more than one chunk a message keep
 * different halves, so a send depends on another chunk of the stage
 * before, and such ranks really run differently (up to 12% apart in
 * test_sim when taken as one).  When no group fits, or the pairing of
 * messages does not close under G, every rank is run.  With a group,
 * shape hashes the representatives and the group. */
weft_status_t weft_sim_run(const struct weft_coll_desc *tmpl, const struct weft_sim_model *m,
                           struct weft_sim_result *res) WEFT_HIDDEN;

/* A two-level cluster: rank r sits on node r / ppn; ranks of one node talk
 * at intra cost, others at inter cost (seconds, seconds per byte). */
struct weft_sim_cluster {
    int ppn; /* ranks per node, >= 1 */
    double intra_alpha, intra_beta;
    double inter_alpha, inter_beta;
};

/* Sets m->link and m->ctx to the cluster's (c is borrowed: it must outlive
 * every use of m) and m->sym_ppn to c->ppn; gamma, copy and esize are the
 * caller's to set. */
void weft_sim_two_level(struct weft_sim_model *m, const struct weft_sim_cluster *c) WEFT_HIDDEN;

/* Sets m->link and m->ctx to read costs from a link table (borrowed, as
 * above).  A pair outside the table gets a NaN cost, which
 * weft_sim_predict rejects. */
void weft_sim_link_table(struct weft_sim_model *m, const struct weft_link_table *tab) WEFT_HIDDEN;

/* ---- between sim.c and sim_sym.c (nothing else uses these) ----------------
 * sim_sym.c looks for a group and builds its representatives, sim.c runs
 * them.  A group's classes are ranks 0 .. nrep-1 (rank q's is q % nrep);
 * rotation moves rank q to its representative by q - q % nrep, xor by
 * q ^ (q - q % nrep). */
enum weft_sim_group { WEFT_SIM_G_NONE, WEFT_SIM_G_ROT, WEFT_SIM_G_XOR };

/* x moved by the permutation (of kind, on p ranks) that takes rank q to
 * its representative. */
static inline int weft_sim_to_rep(int p, int nrep, int kind, int q, int x)
{
    int d = q - q % nrep;
    if (kind == WEFT_SIM_G_XOR)
        return x ^ d;
    return x - d < 0 ? x - d + p : x - d;
}

/* x moved by the permutation that takes rank b's representative to b. */
static inline int weft_sim_from_rep(int p, int nrep, int kind, int b, int x)
{
    int d = b - b % nrep;
    if (kind == WEFT_SIM_G_XOR)
        return x ^ d;
    return x + d >= p ? x + d - p : x + d;
}

/* Builds rank r's schedule of tmpl into sch, of at most limit steps (0:
 * any); over the limit is WEFT_ERR_UNSUPPORTED (sim.c). */
weft_status_t weft_sim_build_rank(const struct weft_coll_desc *tmpl, int r, size_t limit,
                                  struct weft_schedule *sch) WEFT_HIDDEN;
/* Runs ranks 0 .. nrep-1 (reps: their schedules, or NULL to build every
 * rank, nrep == p) under group kind; *open: the pairing of messages did
 * not close under the group, and nothing was run (sim.c). */
weft_status_t weft_sim_simulate(const struct weft_coll_desc *tmpl, const struct weft_sim_model *m,
                                int nrep, int kind, const struct weft_schedule *reps,
                                struct weft_sim_result *res, bool *open) WEFT_HIDDEN;
/* Runs the representatives of the first group that fits (weft_sim_run's
 * comment); *found is false when none does (sim_sym.c). */
weft_status_t weft_sim_symmetric(const struct weft_coll_desc *tmpl,
                                 const struct weft_sim_model *m, struct weft_sim_result *res,
                                 bool *found) WEFT_HIDDEN;

#endif /* WEFT_SIM_H */
