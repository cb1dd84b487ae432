/*
 * kernels_body.h - the CUDA reduction kernels: weft_k_<dtype>_<op>, one per
 * row of src/reduce_elem.h's tables, dst[i] = a[i] op b[i] over a
 * grid-stride loop.  nvcc builds it (kernels.cu); the fake CUDA driver
 * builds it as C with the grid emulated (tests/fakecuda/kernels_host.c).
 */
#ifndef WEFT_CUDA_KERNELS_BODY_H
#define WEFT_CUDA_KERNELS_BODY_H

#include "src/reduce_elem.h"

/* The names must stay unmangled: the library looks them up by name
 * (cuModuleGetFunction).  The C emulation has no linkage to choose. */
#ifdef __cplusplus
#define WEFT_K_EXTERN_C extern "C"
#else
#define WEFT_K_EXTERN_C
#endif

/* The only CUDA names used below are __global__, blockIdx.x, blockDim.x,
 * threadIdx.x and gridDim.x, which the emulation defines.
 *
 * Every launch shape is correct: each thread takes the elements i = its
 * global index + k * (threads in the grid).  An element is read and written
 * by one thread only, so dst may be a or b exactly.  Indices are size_t:
 * grid * block can exceed 2^32 with n above it.
 *
 * AVG with div > 0 divides as weft_reduce_local does; with div <= 0 it is
 * a sum (see src/reduce.h), so the avg kernels carry the sum loop too.
 * The divisor converts to WT in the loop (the compilers hoist it): a
 * variable for it would be unused in four ops of five, which nvcc warns
 * about even when it is cast to void. */
#define WEFT_K_LOOP(op, T, CT, U, WT, LD, ST, kind)                                         \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;                   \
         i += (size_t)blockDim.x * gridDim.x) {                                             \
        CT x = LD(a[i]), y = LD(b[i]);                                                      \
        d[i] = ST(WEFT_ELEM_EXPR(kind, op, T, U, WT, x, y, (WT)div));                       \
    }

#define WEFT_K_DEF(op, OP, name, E, T, CT, U, WT, LD, ST, kind)                             \
    WEFT_K_EXTERN_C __global__ void weft_k_##name##_##op(void *dv, const void *av,          \
                                                         const void *bv, size_t n, int div) \
    {                                                                                       \
        T *d = (T *)dv;                                                                     \
        const T *a = (const T *)av, *b = (const T *)bv;                                     \
        if (OP == WEFT_AVG && div <= 0)                                                     \
            WEFT_K_LOOP(sum, T, CT, U, WT, LD, ST, kind)                                    \
        else                                                                                \
            WEFT_K_LOOP(op, T, CT, U, WT, LD, ST, kind)                                     \
    }

#define WEFT_K_ROW(...) WEFT_ELEM_OPS(WEFT_K_DEF, __VA_ARGS__)
WEFT_ELEM_DTYPES(WEFT_K_ROW)
#undef WEFT_K_ROW
#undef WEFT_K_DEF
#undef WEFT_K_LOOP

#endif /* WEFT_CUDA_KERNELS_BODY_H */
