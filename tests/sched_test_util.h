/*
 * sched_test_util.h - what the files of test_schedule share
 * (sched_test_util.c): the plans more than one of them names, building and
 * freeing a collective's schedules on every rank, and reading their steps.
 */
#ifndef WEFT_TEST_SCHED_TEST_UTIL_H
#define WEFT_TEST_SCHED_TEST_UTIL_H

#include <stdbool.h>
#include <stddef.h>

#include "sched_sim.h"

/* A plan bit of these tests: build with desc.ordered set (deterministic mode). */
#define PLAN_ORDERED (1 << 16)
#define PLAN_RHD PLAN(WEFT_ALGO_RHD, WEFT_VAR_RHD_RABENSEIFNER)
#define PLAN_DBT PLAN(WEFT_ALGO_TREE, WEFT_VAR_TREE_DOUBLE)
#define PLAN_DIRECT PLAN(WEFT_ALGO_DIRECT, 0)

/* Builds the schedule of every rank 0..p-1 of a collective made by algo (a
 * PLAN, with PLAN_ORDERED) into sch[0..p-1]; fails the test on an error.
 * The caller frees them with free_all. */
void build_all(int algo, int coll, int p, int root, size_t count, size_t chunk,
               struct weft_schedule *sch);
/* Frees sch[0..p-1]. */
void free_all(int p, struct weft_schedule *sch);
/* How many steps of s have flag set. */
int count_flag(const struct weft_schedule *s, int flag);
/* Whether a and b are the same steps and scratch. */
bool same_steps(const struct weft_schedule *a, const struct weft_schedule *b);

#endif /* WEFT_TEST_SCHED_TEST_UTIL_H */
