/*
 * kernels_host.c - host emulations of weft's CUDA kernels, for the fake
 * driver's cuModuleGetFunction.  The emulations come with weft's kernels;
 * until then the table is empty (the fake's own test kernel is in
 * fc_stream.c) and a lookup of any of weft's kernels is NOT_FOUND.
 */
#include "fakecuda.h"

const struct fakecuda_kernel fakecuda_kernels[] = {{0}};
const size_t fakecuda_nkernels = 0;
