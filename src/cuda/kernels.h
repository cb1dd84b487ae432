/*
 * kernels.h - the CUDA reduction kernels as the library sees them: the
 * fatbin nvcc built from kernels.cu (embedded at build time) and the name
 * of the kernel for each (dtype, op), for cuModuleGetFunction.
 */
#ifndef WEFT_CUDA_KERNELS_H
#define WEFT_CUDA_KERNELS_H

#include <stddef.h>

#include "base/internal.h"

/* "weft_k_<dtype>_<op>"; NULL for an invalid dtype or op.  Each kernel is
 * void (void *dst, const void *a, const void *b, size_t n, int div) and
 * computes weft_reduce_local(dst, a, b, n, dtype, op, div) on the device
 * (same bits, except which NaN a NaN result is), for any grid and block. */
const char *weft_cuda_kernel_name(weft_dtype_t dtype, weft_op_t op) WEFT_HIDDEN;

/* The fatbin for cuModuleLoadData: SASS for each of configure's
 * CUDA_ARCHS and PTX of the last, for newer GPUs.  Built without nvcc the
 * library has no kernels: weft_cuda_fatbin_len is 0. */
extern const unsigned char weft_cuda_fatbin[] WEFT_HIDDEN;
extern const size_t weft_cuda_fatbin_len WEFT_HIDDEN;

#endif /* WEFT_CUDA_KERNELS_H */
