/*
 * fakecuda.h - the test-control side of libweft-fakecuda.so, a CUDA driver
 * that runs on the CPU (tests set WEFT_CUDA_DRIVER to it), and the table of
 * host kernels cuModuleGetFunction looks names up in.
 *
 * What it emulates, and what it does not:
 *  - Env knobs, read at cuInit: FAKECUDA_DEVICES (default 1, at most 16;
 *    0 makes cuInit fail with CUDA_ERROR_NO_DEVICE), FAKECUDA_NO_MEMOPS=1
 *    (CAN_MAP_HOST_MEMORY reads 0, cuStreamWaitValue32/WriteValue32 return
 *    CUDA_ERROR_NOT_SUPPORTED).
 *  - Before cuInit every call fails with NOT_INITIALIZED but
 *    cuGetErrorString/Name and cuDriverGetVersion (13000).  Allocation,
 *    streams, events, copies, modules, launches and IPC need a context
 *    current on the calling thread (INVALID_CONTEXT without one,
 *    CONTEXT_IS_DESTROYED once its primary context is released to zero);
 *    cuPointerGetAttributes, cuDevice*, cuCtxSetCurrent/GetCurrent do not.
 *    A host function running on a stream gets NOT_PERMITTED from any call.
 *  - Device memory lives at addresses reserved PROT_NONE: the CPU touching
 *    one faults.  Its bytes are in a memfd-backed "shadow" that copies,
 *    kernels and other processes (IPC, through /proc/<pid>/fd) use.
 *    Pinned host memory is plain host memory (memory type HOST, its device
 *    pointer its own address); cuMemAllocManaged memory is host memory
 *    whose attributes say IS_MANAGED.  Pointers the fake did not allocate
 *    are pageable host memory: their attributes are all zero.
 *  - Each stream is a thread running its commands in order.  The NULL
 *    stream, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are one legacy
 *    stream per context, which orders against blocking streams (created
 *    without CU_STREAM_NON_BLOCKING) as the real legacy stream does.
 *    cuStreamDestroy returns at once; queued work still runs.
 *  - cuMemFree, cuMemFreeHost and cuIpcCloseMemHandle wait for the work
 *    already queued on the streams of the memory's context (of every
 *    context for pinned memory), as the real ones synchronize.
 *  - Copies are checked as the driver checks them: a device range past
 *    its allocation, device memory named as host memory in a 2D copy, or
 *    pageable memory named as device memory, is INVALID_VALUE.  Stream
 *    memory operations take pinned, device or managed memory only.
 *  - IPC: handles only of an allocation's base; opening one of this
 *    process is INVALID_CONTEXT (the driver refuses it too), of a freed
 *    allocation or an exited process INVALID_HANDLE; a second open of one
 *    handle returns the same address and needs a second close.
 *  - Kernels: one-dimensional grids and blocks, kernelParams only (not
 *    extra), run as host functions from a table (struct fakecuda_kernel).
 *  - Not emulated: timing (cuEventElapsedTime), peer access, arrays and
 *    textures, graphs, sticky device errors, the teardown of a primary
 *    context's streams and memory when it is released to zero, dma-buf
 *    (cuMemGetHandleForAddressRange is NOT_SUPPORTED).
 *  - fork: a child starts un-initialized with none of the parent's
 *    contexts, streams, events, modules or allocations (its copies of the
 *    parent's device addresses stay PROT_NONE, their shadows are unmapped);
 *    it calls cuInit again and starts empty.
 */
#ifndef WEFT_FAKECUDA_H
#define WEFT_FAKECUDA_H

#include <cuda.h>
#include <stddef.h>

#define FAKECUDA_MAX_PARAMS 16

/* One kernel the fake can launch: cuModuleGetFunction(name) finds it (in
 * the fake's own test kernels, then in fakecuda_kernels[]).  run executes
 * the whole grid on the stream's thread; params are the kernel's arguments
 * as in cuLaunchKernel's kernelParams (copied at launch, as the driver
 * copies them); xlat turns a device address into the host address of its
 * bytes and passes host addresses through.  param_bytes lists the size of
 * each argument in order, 0-terminated: the launch copies that many bytes
 * from each kernelParams[i]. */
struct fakecuda_kernel {
    const char *name;
    void (*run)(void **params, unsigned grid_x, unsigned block_x, void *(*xlat)(CUdeviceptr p));
    size_t param_bytes[FAKECUDA_MAX_PARAMS];
};

/* Host emulations of weft's kernels (tests/fakecuda/kernels_host.c). */
extern const struct fakecuda_kernel fakecuda_kernels[];
extern const size_t fakecuda_nkernels;

/* Stops stream (NULL or CU_STREAM_LEGACY: the legacy stream of the current
 * context) before its next command until as many releases as holds:
 * simulates long GPU work.  The command running when it is called
 * finishes.  cuStreamDestroy drops the holds of the stream it destroys.
 * Needs a current context; INVALID_HANDLE for an unknown stream. */
CUresult fakecuda_stream_hold(CUstream stream);
CUresult fakecuda_stream_release(CUstream stream);

/* Device, managed and pinned host allocations not yet freed, plus IPC
 * mappings not yet closed, in this process: 0 when everything was
 * released. */
size_t fakecuda_live_allocations(void);

/* The host address of a device address's bytes (its shadow), NULL when p
 * is not device memory of this process: lets a test look at device memory
 * without a copy.  Host addresses are not passed through. */
void *fakecuda_shadow(CUdeviceptr p);

#endif /* WEFT_FAKECUDA_H */
