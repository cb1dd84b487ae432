/*
 * sched_sim.h - the symbolic schedule checker of test_schedule (sched_mem.c,
 * sched_sim.c): runs the schedules of all ranks of a collective and proves
 * them correct.
 */

/*
 * The schedules of all ranks are built, sends are matched to receives (the
 * k-th send from A to B meets the k-th receive on B from A), and steps run
 * by the engine's rules (see advance): a send completes only once its
 * receive is posted (no buffering in between; in buffered mode, at once),
 * a RECV_REDUCE's receive is posted as soon as its dependencies are in
 * flight but its reduce waits for them to be done, and a limited number of
 * staging slots can be modelled.  Instead of numbers, every element carries
 * which ranks' inputs it holds and which input position it came from, kept
 * as runs over each rank's memory, so a million elements cost a few runs.
 * A separate static check requires that any two steps of a rank touching
 * the same memory (one of them writing) are ordered by dependencies, with
 * and without sendbuf and recvbuf being the same memory, so that every
 * execution order the engine may pick computes the same thing.
 *
 * Each element also carries the expression tree that made it, operand
 * order included (hash-consed, so equal trees have equal ids).  Equal trees
 * mean equal bits whatever the datatype and op; that is how the recursive
 * doubling schedules, where every rank computes the result itself, are
 * proved to give all ranks the same bits, and how deterministic mode is
 * proved to fold x0 op x1 op ... op x(p-1) left to right.  Trees are built
 * only where a check reads them (rhd allreduce, ordered, p <= 64): a ring
 * at thousands of ranks would make p^2 distinct nodes nobody compares.
 *
 * Which ranks' inputs an element holds is a struct rset: exact for ranks
 * 0..63 (a bitset, as before), and for all ranks a contribution count plus
 * the sum mod 2^64 of a fixed pseudo-random 64-bit key per rank.  A value
 * holds every rank exactly once when its count is p and its sum is the sum
 * of all keys.  Why that is sound: a multiset M of ranks with |M| = p that
 * is not {0..p-1} differs from it by a non-zero vector c of multiplicities
 * with |c_i| <= p, and its sum matches only when sum c_i*key_i = 0 mod 2^64;
 * for independent uniform keys that happens with probability 2^-(64-v),
 * where 2^v (v <= log2 p) is the largest power of two dividing every c_i,
 * so below 2^-51 even at p = 8192.  The keys come from splitmix64, fixed
 * for reproducible runs; schedules are not built against them.  A value
 * with more than p contributions, or two that share a rank below 64, is
 * caught as a duplicate where it is combined; any other duplicate or loss
 * shows as a wrong count or sum at the FINAL step or in the output.
 *
 * Cost: the race check and the execution are close to linear in the steps
 * of all ranks (see check_races), about 1.3 us a step in and out of place;
 * the steps themselves (2p^2 for a ring allgather) are the limit.
 */
#ifndef WEFT_TEST_SCHED_SIM_H
#define WEFT_TEST_SCHED_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/schedule.h"

/* The tests name a schedule by one int, algo | variant << 8. */
#define PLAN(a, v) ((a) | (v) << 8)
#define PLAN_ALGO(x) ((x) & 0xff)
#define PLAN_VAR(x) ((x) >> 8)
#define PLAN_RD PLAN(WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING)
#define PLAN_BINOMIAL PLAN(WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL)

/* verify's slots: a staging slot count, or one of these. */
#define SLOTS_UNLIMITED 0 /* unbuffered, any number of receive-reduces in flight */
#define SLOTS_BUFFERED (-1) /* buffered sends: see struct sim */

/* ---- sched_mem.c: values, memory runs, expressions ---------------------------- */

enum { V_UNINIT = 1, V_DUP = 2, V_MISPLACED = 4 };

/* The ranks whose inputs are combined in a value (see the comment above):
 * low is exact for ranks 0..63; n and sum cover every rank. */
struct rset {
    uint64_t low; /* bit r: rank r < 64 contributes */
    uint64_t sum; /* sum of rank_key(r) over the contributions, mod 2^64 */
    uint32_t n;   /* contributions */
};

/* What one element holds: the set of ranks whose input is combined in it,
 * the input position it stands for (address + delta, so a run of elements
 * copied together shares one delta), the FINAL reduction it came from, and
 * the expression that computed it. */
struct val {
    struct rset ranks;
    int64_t delta;
    int64_t origin; /* rank << 32 | step of the FINAL reduction, or -1 */
    uint32_t flags; /* V_* */
    int32_t expr;   /* < exprs.base: that rank's input; above: a node of sim.ex; -1: none */
};

/* A run inside a region read out of memory: off is relative to the region,
 * and so is v.delta (position = off-in-region + delta). */
struct run {
    size_t off;
    struct val v;
};

struct runs {
    struct run *r;
    size_t n, cap;
};

/* One rank's memory: runs sorted by start, covering [0, size). */
struct segmap {
    struct run *s;
    size_t n, cap, size;
};

/* Hash-consed expression nodes: node i (id base + i) is l op r, in that
 * operand order; a pair is stored once, so two trees are the same
 * expression exactly when their ids are equal.  Ids below base are the
 * ranks' inputs (base = p). */
struct exprs {
    int32_t (*node)[2];
    size_t n, cap;
    int32_t *slot; /* open addressing over node ids, -1 empty; hcap a power of two */
    size_t hcap;
    int32_t base;
};

/* Rank r's key: splitmix64 of r, fixed. */
uint64_t rank_key(int r);
/* {r}; and the union of two sets (as multisets: counts and sums add). */
struct rset rset_one(int r);
struct rset rset_add(struct rset a, struct rset b);
bool rset_eq(struct rset a, struct rset b);
/* Writes s for messages: "0x..." (the bitset) when p <= 64, else its count,
 * low bits and key sum. */
const char *rset_format(struct rset s, int p, char *buf, size_t len);

bool val_eq(const struct val *a, const struct val *b);
/* Appends the value v from off on (merged into the last run when equal). */
void runs_push(struct runs *rs, size_t off, struct val v);
/* size elements, all uninitialized. */
void seg_init(struct segmap *m, size_t size);
/* The runs of [addr, addr + len), offsets and deltas relative to addr. */
void seg_read(const struct segmap *m, size_t addr, size_t len, struct runs *out);
/* Overwrites [addr, addr + len) with in (relative to addr), merging equal runs. */
void seg_write(struct segmap *m, size_t addr, size_t len, const struct runs *in);
/* The id of (l op r). */
int32_t expr_node(struct exprs *e, int32_t l, int32_t r);
/* Writes expression id as text, "(x0 x1)" for x0 op x1; returns the
 * length it wanted (like snprintf), truncating at len. */
size_t expr_format(const struct exprs *e, int32_t id, char *out, size_t len, size_t at);

/* ---- sched_sim.c: the simulator ------------------------------------------------- */

/* The slot count the engine runs with (src/op.c clamps it the same way). */
int engine_slots(void);
/* "SEND", "RECV", "RECV_REDUCE", "COPY" for a step kind, "?" for others. */
const char *kind_name(int k);
/* Runs the given schedules (one per rank) of a collective, made by algo
 * (a PLAN), in and out of place; false with err filled on the first
 * problem.  With outputs false, only the static checks and the execution
 * (deadlocks, what the reductions combine) count, not what the ranks end up
 * holding. */
bool simulate(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
              int slots, bool outputs, char *err, size_t errlen);
/* Checks the given schedules of a collective completely. */
bool verify(int algo, int coll, int p, int root, size_t count, struct weft_schedule *sch,
            int slots, char *err, size_t errlen);
/* The same for schedules built from d (d->rank ignored): with d->ordered,
 * every reduced output element must also be the left fold
 * ((x0 op x1) op x2) ... op x(p-1). */
bool verify_desc(const struct weft_coll_desc *d, struct weft_schedule *sch, int slots, char *err,
                 size_t errlen);

#endif /* WEFT_TEST_SCHED_SIM_H */
