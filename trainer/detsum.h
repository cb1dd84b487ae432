/*
 * detsum.h - sums whose bits do not depend on the parallel layout: the
 * canonical tree over items (a local accumulator and its allreduce and
 * reduce-scatter across ranks), and an order-free sum of squares.
 *
 * Canonical tree over items 0..G-1: at level d = 0, 1, 2, ... every item i
 * that is a multiple of 2^(d+1) gets item i + 2^d added to it, if that item
 * exists; the result is item 0.  Float addition is commutative bit for bit
 * but not associative, so only this shape is fixed, never operand order.
 * With a power-of-two rank count n and global item g = j * n + r on rank r,
 * det_reduce_scatter (or det_allreduce) of each local item j, then a tacc
 * over j, is the canonical tree over all n * k items.
 *
 * NaN payloads are the one exception to commutativity (x86 keeps the first
 * operand's): two different NaNs summed may give either, rank by rank.
 */
#ifndef WEFT_TRAINER_DETSUM_H
#define WEFT_TRAINER_DETSUM_H

#include <stddef.h>
#include <stdint.h>

#include "tacc.h"
#include "weft.h"

/* ---- across ranks -------------------------------------------------------------- */

/*
 * Collective over comm: buf (count elements of WEFT_FLOAT32 or
 * WEFT_FLOAT64) becomes, on every rank, the canonical tree over ranks of
 * the ranks' buf, bitwise the same everywhere.  scratch: count elements,
 * any contents, clobbered.  A power-of-two size n exchanges the whole
 * vector with rank r ^ 2^d at step d (distance 1 first) below 2048
 * elements a rank; from there it reduce-scatters n chunks by recursive
 * halving in the same tree (det_reduce_scatter), allgathers them and
 * doubles the count % n left over: half the bytes at 8 ranks, about twice
 * as fast at 4 and 8 ranks (detsum_bench).  Any other size reduces to rank
 * 0 level by level in the same tree and broadcasts.  One rank: nothing.
 */
weft_status_t det_allreduce(weft_comm_t comm, void *buf, size_t count, weft_dtype_t dtype,
                            void *scratch);

/*
 * Collective over comm of n ranks, n a power of two (else
 * WEFT_ERR_UNSUPPORTED before any communication): full holds n chunks of s
 * floats (chunk c = full[c * s, (c + 1) * s)); part (s floats, may be
 * full + r * s) gets on rank r the canonical tree over ranks of chunk r.
 * Recursive halving, distance 1 first; each rank sends s * (n - 1) floats.
 * full is clobbered; scratch: n * s floats, clobbered.
 */
weft_status_t det_reduce_scatter(weft_comm_t comm, float *full, float *part, size_t s,
                                 float *scratch);

/* Why the last det_* call of this thread failed: its own refusal (size,
 * dtype), or weft_last_error(comm) when a weft call failed. */
const char *det_last_error(weft_comm_t comm);

/* ---- order-free sum of squares ---------------------------------------------------- */

/*
 * Squares binned by binary exponent as integers, so that bins add in any
 * order (across elements, calls and ranks: weft_allreduce of XSQ_BINS
 * WEFT_INT64 with WEFT_SUM) and give the same total.  Each square
 * m * 2^e (m in [0.5, 1)) adds floor(m * 2^31) to bin e - XSQ_EMIN:
 * truncation loses under 2^-30 of the square, always downwards, so the
 * total is low by less than 2^-30 (~9.3e-10) relative, plus the final
 * conversion's rounding.  Squares of finite floats are in [2^-298, 2^256);
 * the last two bins count non-finite scaled inputs (a NaN makes the total
 * NaN, an infinity +Inf).  A bin overflows only past 2^32 elements summed
 * over every call and rank.
 */
#define XSQ_EMIN (-300)
#define XSQ_EMAX 260
#define XSQ_NAN (XSQ_EMAX - XSQ_EMIN + 1) /* bin index: NaN count */
#define XSQ_INF (XSQ_NAN + 1)             /* bin index: infinity count */
#define XSQ_BINS (XSQ_INF + 1)

/* bins[XSQ_BINS] += the squares of x[i] * scale, the product rounded to
 * float first, i < n.  Zero bins before the first call. */
void xsq_add(int64_t *bins, const float *x, size_t n, float scale);
/* The sum the bins hold, converted in a fixed order. */
double xsq_total(const int64_t *bins);

#endif /* WEFT_TRAINER_DETSUM_H */
