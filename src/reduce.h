/*
 * reduce.h - element-wise reductions for every datatype and op.
 * f16/bf16 are computed in f32 and rounded once (round to nearest even).
 */
#ifndef WEFT_REDUCE_H
#define WEFT_REDUCE_H

#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"

/* dst[i] = a[i] op b[i] for i < n; dst may alias a or b.  WEFT_AVG sums;
 * with divisor > 0 the result is divided by divisor before it is stored
 * (once, in the same rounding: this is the final step of an AVG).  For
 * integer types the division truncates toward zero.  (Not weft_reduce:
 * that name is the public Reduce collective in weft.h.) */
void weft_reduce_local(void *dst, const void *a, const void *b, size_t n, weft_dtype_t dtype,
                       weft_op_t op, int divisor) WEFT_HIDDEN;

/* True (the default) lets f16 blocks use the CPU's F16C instructions where
 * it has them; tests clear it to check the portable converters too. */
extern bool weft_reduce_f16c_ WEFT_HIDDEN;

float weft_half_to_float(uint16_t h) WEFT_HIDDEN;
uint16_t weft_float_to_half(float f) WEFT_HIDDEN;       /* round to nearest even */
float weft_bf16_to_float(uint16_t h) WEFT_HIDDEN;
uint16_t weft_float_to_bf16(float f) WEFT_HIDDEN;       /* round to nearest even */

#endif /* WEFT_REDUCE_H */
