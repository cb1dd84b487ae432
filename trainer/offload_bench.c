/*
 * offload_bench.c - what an optimizer pass costs with each offload kind:
 * an AdamW update over m and v (and a parameter array kept in memory)
 * through offload_next, against the same update with --offload none.
 * Prints bytes moved, I/O time, the caller's wait and the share hidden.
 * cold:DIR is file:DIR with the file's pages synced and dropped from the
 * page cache before each pass, so that the reads come from the disk.
 *
 *     weft-offload-bench [MB of m+v] [file:DIR|cold:DIR|cpu|none ...]
 */
#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "offload.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Writes back and evicts the offload's file (rank 0 of this process). */
static void drop_cache(const char *dir)
{
    char path[4200];
    snprintf(path, sizeof(path), "%s/weft-optim-rank0.%ld.bin", dir, (long)getpid());
    int fd = open(path, O_RDONLY);
    if (fd < 0)
        return;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
}

/* The trainer's AdamW step for elements off..off+len (bias-corrected). */
static void adamw(float *param, const float *grad, float *m, float *v, size_t len, long t)
{
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    float c1 = 1.0f - powf(b1, (float)t), c2 = 1.0f - powf(b2, (float)t);
    for (size_t i = 0; i < len; i++) {
        m[i] = b1 * m[i] + (1.0f - b1) * grad[i];
        v[i] = b2 * v[i] + (1.0f - b2) * grad[i] * grad[i];
        float mh = m[i] / c1, vh = v[i] / c2;
        param[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * param[i]);
    }
}

static int run(const char *text, size_t n, size_t chunk, int passes, float *param,
               const float *grad, double *pass_s)
{
    struct offload_spec spec;
    char err[8192], file[4200];
    bool cold = strncmp(text, "cold:", 5) == 0;
    if (cold)
        snprintf(file, sizeof(file), "file:%s", text + 5);
    if (offload_parse(cold ? file : text, &spec, err, sizeof(err)) != 0) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    struct offload *o = offload_create(&spec, 0, n, 2, chunk, err, sizeof(err));
    if (o == NULL) {
        fprintf(stderr, "%s\n", err);
        return -1;
    }
    double best = INFINITY;
    struct offload_stats first = {0};
    int rc = 0;
    for (int p = 1; p <= passes && rc == 0; p++) {
        if (cold)
            drop_cache(spec.dir);
        double t0 = now();
        size_t off, len;
        float *ptr[2];
        rc = offload_begin(o);
        while (rc == 0 && (rc = offload_next(o, &off, &len, ptr)) > 0) {
            adamw(param + off, grad + off, ptr[0], ptr[1], len, p);
            rc = 0;
        }
        double dt = now() - t0;
        best = dt < best ? dt : best;
        /* The first pass writes the sparse file's blocks (or faults in the
         * host buffer's pages): shown apart, left out of the counts. */
        if (p == 1 && rc == 0) {
            first = offload_stats(o);
            printf("  %-12s first pass %.3f s, io %.3f s, wait %.3f s\n", text, dt, first.io_s,
                   first.wait_s);
        }
    }
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", text, offload_error(o));
        offload_destroy(o);
        return -1;
    }
    struct offload_stats st = offload_stats(o);
    st.bytes_read -= first.bytes_read;
    st.bytes_written -= first.bytes_written;
    st.io_s -= first.io_s;
    st.wait_s -= first.wait_s;
    st.chunks -= first.chunks;
    st.chunks_ready -= first.chunks_ready;
    double hidden = st.io_s > 0 ? 1.0 - st.wait_s / st.io_s : 1.0;
    printf("  %-12s best pass %.3f s; passes 2-%d: read %.1f MB, wrote %.1f MB, io %.3f s, "
           "wait %.3f s, hidden %.0f%%, ready %llu/%llu, resident %.1f MB\n",
           text, best, passes, (double)st.bytes_read / 1e6, (double)st.bytes_written / 1e6,
           st.io_s, st.wait_s, 100.0 * (hidden < 0 ? 0 : hidden),
           (unsigned long long)st.chunks_ready, (unsigned long long)st.chunks,
           (double)st.resident_bytes / 1e6);
    *pass_s = best;
    offload_destroy(o);
    return 0;
}

int main(int argc, char **argv)
{
    double mb = argc > 1 ? atof(argv[1]) : 64;
    size_t n = (size_t)(mb * 1e6 / 8); /* m and v: 8 bytes per element */
    size_t chunk = 256 * 1024;          /* 1 MiB of floats per stream */
    int passes = 4;
    float *param = malloc(n * sizeof(float)), *grad = malloc(n * sizeof(float));
    if (param == NULL || grad == NULL) {
        fprintf(stderr, "out of memory for %zu floats\n", n);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        param[i] = (float)(i % 101) * 0.01f;
        grad[i] = (float)(i % 37) * 0.001f - 0.018f;
    }
    printf("m+v %.1f MB (%zu floats each), chunk %zu floats, %d passes\n", (double)n * 8 / 1e6,
           n, chunk, passes);
    double base = 0;
    if (run("none", n, chunk, passes, param, grad, &base) != 0)
        return 1;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "none") == 0)
            continue;
        double t;
        if (run(argv[i], n, chunk, passes, param, grad, &t) != 0)
            return 1;
        printf("  %-12s pass time %.2fx none\n", argv[i], t / base);
    }
    free(param);
    free(grad);
    return 0;
}
