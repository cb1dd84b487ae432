/*
 * pattern.h - the benchmarks' inputs and expected values (pattern.c), for
 * the driver in common.c.  Written against weft.h only.
 */
#ifndef WEFT_PERF_PATTERN_H
#define WEFT_PERF_PATTERN_H

#include <stddef.h>
#include <stdint.h>

#include <weft.h>

/* Every input is periodic in the element index with this period, so a table
 * of PERF_PERIOD values describes a whole buffer.  A prime, so that no
 * power-of-two shift of a chunk lands on an identical pattern. */
#define PERF_PERIOD 251u
#define PERF_MAX_ELEM 8
#define PERF_TAB_BYTES (2 * PERF_PERIOD * PERF_MAX_ELEM)

/*
 * The inputs.  Rank r's element i holds pattern_value(p, r, i % PERF_PERIOD);
 * every value is a small integer, chosen per op so that every partial result
 * of any reduction order is exactly representable in the dtype.  With
 * k = (key + r) % PERIOD and x = (37k^2 + 11k) % PERIOD (a scramble, so that
 * no shift of a chunk maps the pattern onto itself):
 *   RAW  (no reduction, MIN, MAX): k - 125 (k for unsigned types)
 *   SUM  (and integer AVG): 0 unless d divides x; else y = x / d and
 *        y % (2a+1) - a  (y % (a+1) unsigned); |sum of any subset| <= bound
 *   PROD: 2 where m divides x, else -1 where x % 3 == 1 (signed), else 1
 *   FAVG (float AVG): w + e with w = key % (2a+1) - a shared by all ranks and
 *        e = +-s for the two ranks of a pair (2j, 2j+1), s in {-1,0,1} from
 *        kp = (key + j) % PERIOD (0 unless d divides kp), 0 for an odd last
 *        rank; so the sum is exactly n*w and the average exactly w.
 * a, d and m are picked by pattern_fit from the rank count and the dtype;
 * d == 0 or m == 0 means "never", the fallback that is exact for any n.
 */
typedef enum { GEN_RAW, GEN_SUM, GEN_PROD, GEN_FAVG } gen_kind_t;

/* One (dtype, op) configuration of the inputs; a value, set by pattern_fit. */
typedef struct {
    gen_kind_t kind;
    weft_dtype_t dtype;
    weft_op_t op;
    int reduces;   /* the collective reduces; op applies */
    int is_signed; /* negative values allowed */
    int nranks;
    unsigned a, d, m;
} perf_pattern_t;

/* For messages only: 64-bit integers beyond 2^53 print rounded. */
double value_load(weft_dtype_t t, const void *src);
/* Picks the densest inputs that stay exact; sparser ones as ranks grow. */
void pattern_fit(perf_pattern_t *p, weft_dtype_t dtype, weft_op_t op, int reduces, int nranks);
/* Tables of 2*PERIOD encoded elements (the period twice), so that the PERIOD
 * elements from any phase are contiguous: rank r's input, the reduction of
 * every rank's input, one constant value. */
void table_of_rank(const perf_pattern_t *p, int r, unsigned char *tab);
void table_of_reduction(const perf_pattern_t *p, unsigned char *tab);
void table_of_constant(weft_dtype_t t, double v, unsigned char *tab);
/* Flipping one bit of every expected element gives a filler that can never
 * pass the check, so an element the collective forgot to write counts. */
void table_poison(const unsigned char *tab, size_t ts, unsigned char *out);
/* Writes count elements of ts bytes from tab, starting at phase. */
void buffer_fill(void *buf, size_t count, size_t ts, const unsigned char *tab, size_t phase);
/* Counts the elements that differ bitwise from the table; remembers the
 * first one in *first (left alone when all match). */
int64_t buffer_wrong(const void *buf, size_t count, size_t ts, const unsigned char *tab,
                     size_t phase, size_t *first);

#endif /* WEFT_PERF_PATTERN_H */
