/*
 * gpu_copy - the device-to-device copy bandwidth of one GPU (cuMemcpyAsync
 * between two device buffers on a stream), the yardstick tools/gpu-check.sh
 * holds the perf tools' -G 1 busbw against.
 *
 *   gpu_copy [-d DEVICE] [SIZE...]     sizes as -b takes them (default 64M 1G)
 *
 * Prints "copy_bw BYTES GBPS ..." per size: bytes copied per second (each
 * byte is read once and written once), the median of PERF_COPY_ROUNDS
 * rounds, each timed by the host clock around a batch of copies and the
 * stream's completion.  Exit 1, with one line saying why, without a driver
 * or a device.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/cudrv.h"
#include "perf/util.h"

#define PERF_COPY_ROUNDS 7
#define PERF_COPY_BATCH_BYTES (4ull << 30) /* copies per round: about this much data */

static const struct weft_cu *cu;

/* Prints "gpu_copy: what: CUDA_ERROR_... (text)"; 1 when r failed. */
static int failed(CUresult r, const char *what)
{
    if (r == CUDA_SUCCESS)
        return 0;
    const char *name = NULL, *text = NULL;
    if (cu->cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (cu->cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    fprintf(stderr, "gpu_copy: %s: %s (%s)\n", what, name ? name : "unknown CUDA error",
            text ? text : "no description");
    return 1;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times copies of bytes from src to dst; GB/s into *gbps. */
static int measure(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s, double *gbps,
                   int *batch_out)
{
    int batch = (int)(PERF_COPY_BATCH_BYTES / bytes);
    if (batch < 2)
        batch = 2;
    if (batch > 200)
        batch = 200;
    double t[PERF_COPY_ROUNDS];
    /* One untimed copy first: page mappings and clocks settle. */
    if (failed(cu->cuMemcpyAsync(dst, src, bytes, s), "cuMemcpyAsync") ||
        failed(cu->cuStreamSynchronize(s), "cuStreamSynchronize"))
        return 1;
    for (int r = 0; r < PERF_COPY_ROUNDS; r++) {
        double t0 = perf_now_us();
        for (int k = 0; k < batch; k++)
            if (failed(cu->cuMemcpyAsync(dst, src, bytes, s), "cuMemcpyAsync"))
                return 1;
        if (failed(cu->cuStreamSynchronize(s), "cuStreamSynchronize"))
            return 1;
        t[r] = (perf_now_us() - t0) / batch;
    }
    qsort(t, PERF_COPY_ROUNDS, sizeof(double), cmp_double);
    *gbps = (double)bytes / 1e3 / t[PERF_COPY_ROUNDS / 2];
    *batch_out = batch;
    return 0;
}

int main(int argc, char **argv)
{
    size_t sizes[16];
    int nsizes = 0, devno = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-d") == 0 && i + 1 < argc) {
            devno = atoi(argv[++i]);
        } else if (nsizes < 16 && perf_parse_size(argv[i], &sizes[nsizes]) == 0 &&
                   sizes[nsizes] > 0) {
            nsizes++;
        } else {
            fprintf(stderr, "usage: gpu_copy [-d DEVICE] [SIZE...]  (SIZE like 64M, 1G)\n");
            return 2;
        }
    }
    if (nsizes == 0) {
        sizes[nsizes++] = 64u << 20;
        sizes[nsizes++] = 1u << 30;
    }
    size_t maxb = 0;
    for (int i = 0; i < nsizes; i++)
        maxb = sizes[i] > maxb ? sizes[i] : maxb;

    const char *why = NULL;
    if ((cu = weft_cu_get(&why)) == NULL) {
        fprintf(stderr, "gpu_copy: %s\n", why ? why : "the CUDA driver is unavailable");
        return 1;
    }
    if (devno < 0 || devno >= cu->ndev) {
        fprintf(stderr, "gpu_copy: -d %d: the driver lists %d device(s)\n", devno, cu->ndev);
        return 1;
    }
    int rc = 1;
    CUdevice dev;
    CUcontext ctx;
    CUstream s = NULL;
    CUdeviceptr a = 0, b = 0;
    char name[96] = "";
    if (failed(cu->cuDeviceGet(&dev, devno), "cuDeviceGet") ||
        failed(cu->cuDeviceGetName(name, (int)sizeof(name), dev), "cuDeviceGetName") ||
        failed(cu->cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain"))
        return 1;
    if (failed(cu->cuCtxSetCurrent(ctx), "cuCtxSetCurrent") ||
        failed(cu->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "cuStreamCreate"))
        goto out_ctx;
    if (failed(cu->cuMemAlloc(&a, maxb), "cuMemAlloc (source)") ||
        failed(cu->cuMemAlloc(&b, maxb), "cuMemAlloc (destination)"))
        goto out_mem;
    printf("gpu_copy: device %d [%s], driver %d.%d\n", devno, name, cu->version / 1000,
           cu->version % 1000 / 10);
    rc = 0;
    for (int i = 0; i < nsizes && rc == 0; i++) {
        double gbps;
        int batch;
        if (measure(b, a, sizes[i], s, &gbps, &batch) != 0) {
            rc = 1;
            break;
        }
        printf("copy_bw %zu %.2f GB/s (cuMemcpyAsync device to device, median of %d rounds of "
               "%d copies)\n", sizes[i], gbps, PERF_COPY_ROUNDS, batch);
        fflush(stdout);
    }
out_mem:
    if (b && failed(cu->cuMemFree(b), "cuMemFree"))
        rc = 1;
    if (a && failed(cu->cuMemFree(a), "cuMemFree"))
        rc = 1;
    if (s && failed(cu->cuStreamDestroy(s), "cuStreamDestroy"))
        rc = 1;
out_ctx:
    if (failed(cu->cuDevicePrimaryCtxRelease(dev), "cuDevicePrimaryCtxRelease"))
        rc = 1;
    return rc;
}
