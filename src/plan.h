/*
 * plan.h - the plan of each call on a communicator: the cached choice of
 * its size class (WEFT_ALGO's one plan, the tuning file's, or the model's),
 * or the trial that measures the candidates (select/tune.h ranks them;
 * this is where a communicator's calls take part).
 */
#ifndef WEFT_PLAN_H
#define WEFT_PLAN_H

#include "select/tune.h"

struct weft_comm;
/* The plan for one call on comm (cached; the first call of a class runs the
 * simulator).  A forced algorithm that cannot build coll falls back to the
 * automatic choice and says so once per collective at INFO.  *tk says how
 * the call takes part in a measurement; with tk->pending the plan returned
 * is not the one to run (weft_tune_decided gives it later).  Called with
 * the engine's mutex not held. */
struct weft_plan weft_tune_pick(struct weft_comm *comm, int coll, size_t count, size_t esize,
                                struct weft_tune_ticket *tk) WEFT_HIDDEN;
/* The plans a call of coll could run on comm, best predicted first: those
 * its size class is measured over, or the one predicted; how many (room
 * for WEFT_ALGO_COUNT * WEFT_VAR_COUNT).  Changes nothing. */
int weft_tune_plans(struct weft_comm *comm, int coll, size_t count, size_t esize,
                    struct weft_plan *plans) WEFT_HIDDEN;
/* Every plan comm's algorithms allow that builds coll for count elements
 * of esize bytes, best predicted first, twins left out (weft_tune_ranked);
 * how many (0: none, or one rank).  weft-tune times these. */
int weft_tune_distinct(struct weft_comm *comm, int coll, size_t count, size_t esize,
                       struct weft_plan *plans) WEFT_HIDDEN;
/* At init, once the link table is final: rank 0 reads the section of its
 * tuning file (WEFT_TUNE_FILE, else the per-user default) for comm's shape,
 * and every rank gets it through the bootstrap (a round of 4 bytes, and a
 * second only when rank 0 found a section), so all hold the same table
 * and pick alike whatever files they see.  A file rank 0 cannot use is
 * one WARN (once a process) and no table; only a failed exchange fails. */
weft_status_t weft_tune_file_share(struct weft_comm *comm, uint64_t deadline) WEFT_HIDDEN;
/* Records m's winner from every rank's times (driver only; see
 * weft_tune_decide); later picks of the class get it straight away. */
void weft_tune_record(struct weft_comm *comm, struct weft_tune_measure *m, const double *all)
    WEFT_HIDDEN;

#endif /* WEFT_PLAN_H */
