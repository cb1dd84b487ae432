/*
 * kernels_host.c - the reduction kernels of src/cuda/kernels_body.h built
 * as C for the fake CUDA driver: a launch calls the kernel body once per
 * (block, thread) of its grid, on the calling thread.
 */
#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

#include "tests/fakecuda/fakecuda.h"

/* What the body reads of CUDA: the grid coordinates, set before each call;
 * thread-local, so launches on several host threads (streams) do not mix. */
struct fakecuda_dim3 {
    unsigned x, y, z;
};
static _Thread_local struct fakecuda_dim3 blockIdx, blockDim, threadIdx, gridDim;
#define __global__ static

#include "src/cuda/kernels_body.h"

typedef void kernel_fn(void *dst, const void *a, const void *b, size_t n, int div);

/* params as cuLaunchKernel passes them: pointers to dst, a, b (device
 * pointers), n (size_t) and div (int).  Threads run one after another;
 * the kernels are correct in any order (each element is one thread's). */
static void launch(kernel_fn *k, void **params, unsigned grid_x, unsigned block_x,
                   void *(*xlat)(CUdeviceptr p))
{
    size_t n = *(const size_t *)params[3];
    int div = *(const int *)params[4];
    /* With nothing to do a kernel reads no pointer, so any value is valid
     * (NULL included): do not ask the driver about them. */
    if (n == 0)
        return;
    void *dst = xlat(*(const CUdeviceptr *)params[0]);
    const void *a = xlat(*(const CUdeviceptr *)params[1]);
    const void *b = xlat(*(const CUdeviceptr *)params[2]);
    gridDim = (struct fakecuda_dim3){ grid_x, 1, 1 };
    blockDim = (struct fakecuda_dim3){ block_x, 1, 1 };
    for (unsigned bx = 0; bx < grid_x; bx++) {
        blockIdx = (struct fakecuda_dim3){ bx, 0, 0 };
        for (unsigned tx = 0; tx < block_x; tx++) {
            threadIdx = (struct fakecuda_dim3){ tx, 0, 0 };
            k(dst, a, b, n, div);
        }
    }
}

#define FK_RUN(op, OP, name, ...)                                                           \
    static void run_##name##_##op(void **params, unsigned grid_x, unsigned block_x,         \
                                  void *(*xlat)(CUdeviceptr p))                             \
    {                                                                                       \
        launch(weft_k_##name##_##op, params, grid_x, block_x, xlat);                        \
    }
#define FK_RUN_ROW(...) WEFT_ELEM_OPS(FK_RUN, __VA_ARGS__)
WEFT_ELEM_DTYPES(FK_RUN_ROW)
#undef FK_RUN_ROW
#undef FK_RUN

/* The name is spelled from the same tokens as the kernel it runs, so an
 * entry cannot name a kernel that kernels_body.h does not define. */
/* Launch arguments: dst, a, b (CUdeviceptr), n (size_t), div (int). */
#define FK_PARAMS { sizeof(CUdeviceptr), sizeof(CUdeviceptr), sizeof(CUdeviceptr), sizeof(size_t), sizeof(int), 0 }
#define FK_ENTRY(op, OP, name, ...) { "weft_k_" #name "_" #op, run_##name##_##op, FK_PARAMS },
#define FK_ENTRY_ROW(...) WEFT_ELEM_OPS(FK_ENTRY, __VA_ARGS__)
const struct fakecuda_kernel fakecuda_kernels[] = { WEFT_ELEM_DTYPES(FK_ENTRY_ROW) };
#undef FK_ENTRY_ROW
#undef FK_ENTRY
const size_t fakecuda_nkernels = sizeof fakecuda_kernels / sizeof fakecuda_kernels[0];
