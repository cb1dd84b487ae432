/*
 * kernels.c - the names of the CUDA reduction kernels, from the same
 * tables kernels_body.h defines them with, and the empty fatbin of a build
 * without nvcc (with nvcc the build generates kernels_fatbin.c).
 */
#include "config.h"

#include "src/cuda/kernels.h"

#include "src/reduce_elem.h"

#define WEFT_K_NAME(op, OP, name) [OP] = "weft_k_" #name "_" #op,
#define WEFT_K_ROW(name, E, ...) [E] = { WEFT_ELEM_OPS(WEFT_K_NAME, name) },
static const char *const kernel_names[WEFT_NUM_DTYPES][WEFT_NUM_OPS] = {
    WEFT_ELEM_DTYPES(WEFT_K_ROW)
};
#undef WEFT_K_ROW
#undef WEFT_K_NAME

const char *weft_cuda_kernel_name(weft_dtype_t dtype, weft_op_t op)
{
    if ((unsigned)dtype >= WEFT_NUM_DTYPES || (unsigned)op >= WEFT_NUM_OPS)
        return NULL;
    return kernel_names[dtype][op];
}

#ifndef HAVE_NVCC
/* C has no empty arrays; the length says there is nothing. */
const unsigned char weft_cuda_fatbin[1] = { 0 };
const size_t weft_cuda_fatbin_len = 0;
#endif
