/*
 * test_trainer_offload.c - the optimizer-state offload: every kind gives
 * bitwise the arrays that plain arrays give, reads run ahead of a slow
 * caller on another thread, bad directories, a full disk and injected I/O
 * errors fail with the file and the reason and lose nothing, and the
 * --offload values parse.  pread/pwrite are wrapped (-Wl,--wrap) so that
 * errors and short transfers can be injected into offload.c's calls.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "offload.h"
#include "testutil.h"

/* ---- fault injection into offload.c's pread/pwrite ---- */

ssize_t __real_pread(int fd, void *buf, size_t count, off_t pos);
ssize_t __real_pwrite(int fd, const void *buf, size_t count, off_t pos);
ssize_t __wrap_pread(int fd, void *buf, size_t count, off_t pos);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t count, off_t pos);

/* countdown k > 0: the k-th call from now fails with fault_errno. */
static atomic_long read_countdown, write_countdown;
static int fault_errno = EIO;
static atomic_bool halve;          /* move a bit over half of each request */
static pthread_t caller;           /* the test's thread ... */
static atomic_bool io_on_caller;   /* ... did a pread/pwrite itself */
static atomic_bool watch_caller;

static bool inject(atomic_long *countdown)
{
    if (atomic_load(&watch_caller) && pthread_equal(pthread_self(), caller))
        atomic_store(&io_on_caller, true);
    if (atomic_load(countdown) > 0 && atomic_fetch_sub(countdown, 1) == 1) {
        errno = fault_errno;
        return true;
    }
    return false;
}

static size_t shrink(size_t count)
{
    return atomic_load(&halve) && count > 8 ? count / 2 + 1 : count;
}

ssize_t __wrap_pread(int fd, void *buf, size_t count, off_t pos)
{
    return inject(&read_countdown) ? -1 : __real_pread(fd, buf, shrink(count), pos);
}

ssize_t __wrap_pwrite(int fd, const void *buf, size_t count, off_t pos)
{
    return inject(&write_countdown) ? -1 : __real_pwrite(fd, buf, shrink(count), pos);
}

/* ---- helpers ---- */

static char work[256];

static void setup(void)
{
    snprintf(work, sizeof(work), "/tmp/weft-offload-test.%d", (int)getpid());
    cr_assert_eq(mkdir(work, 0700), 0, "mkdir %s: %s", work, strerror(errno));
}

static void teardown(void)
{
    char cmd[320];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", work);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", work);
}

TestSuite(offload, .init = setup, .fini = teardown, .timeout = 120);

static struct offload_spec spec_of(enum offload_kind kind, const char *dir)
{
    struct offload_spec s = {.kind = kind};
    snprintf(s.dir, sizeof(s.dir), "%s", dir);
    return s;
}

static const char *kind_name(enum offload_kind k)
{
    return k == OFFLOAD_NONE ? "none" : k == OFFLOAD_CPU ? "cpu" : "file";
}

static const enum offload_kind kinds[] = {OFFLOAD_NONE, OFFLOAD_CPU, OFFLOAD_FILE};

/* An offload for rank 0 (its file in the scratch folder); the test fails
 * if it cannot be made. */
static struct offload *make(enum offload_kind kind, size_t n, int nstreams, size_t chunk)
{
    struct offload_spec spec = spec_of(kind, work);
    char err[1024];
    struct offload *o = offload_create(&spec, 0, n, nstreams, chunk, err, sizeof(err));
    cr_assert(o != NULL, "%s: %s", kind_name(kind), err);
    return o;
}

/* The file offload_create makes for rank in dir. */
static void file_of(char *path, size_t size, const char *dir, int rank)
{
    snprintf(path, size, "%s/weft-optim-rank%d.%d.bin", dir, rank, (int)getpid());
}

/* An AdamW-like update of elements off..off+len, the same float operations
 * whether p points into a chunk or into a whole plain array. */
static void update(float **p, size_t off, size_t len, int nstreams, int pass)
{
    for (size_t i = 0; i < len; i++) {
        float x = (float)((off + i) % 97) * 0.37f - 11.0f + (float)pass;
        p[0][i] = 0.9f * p[0][i] + 0.1f * x;
        if (nstreams > 1)
            p[1][i] = 0.999f * p[1][i] + 0.001f * x * x;
    }
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* update() on a chunk handed out and on the same elements of ref. */
static void update_both(float **ptr, float **ref, size_t off, size_t len, int nstreams, int pass)
{
    update(ptr, off, len, nstreams, pass);
    float *r[2] = {ref[0] + off, nstreams > 1 ? ref[1] + off : NULL};
    update(r, off, len, nstreams, pass);
}

/* One pass that applies update() through the offload and, to exactly the
 * chunks it was handed, to ref.  Checks the chunks tile [0, n) in order.
 * Returns offload_next's last rc. */
static int pass(struct offload *o, float **ref, size_t n, size_t chunk, int nstreams, int p)
{
    if (offload_begin(o) != 0)
        return -1;
    size_t off, len, expect = 0;
    float *ptr[OFFLOAD_MAX_STREAMS];
    int rc;
    while ((rc = offload_next(o, &off, &len, ptr)) > 0) {
        cr_assert_eq(off, expect, "chunk at %zu, expected %zu", off, expect);
        cr_assert(len > 0 && len <= chunk && off + len <= n, "chunk %zu+%zu of %zu", off, len, n);
        update_both(ptr, ref, off, len, nstreams, p);
        expect = off + len;
    }
    if (rc == 0)
        cr_assert_eq(expect, n, "pass ended at %zu of %zu", expect, n);
    return rc;
}

/* Every stream of o is bitwise ref. */
static void assert_state(struct offload *o, float **ref, size_t n, int nstreams)
{
    float *got = malloc((n ? n : 1) * sizeof(float));
    for (int k = 0; k < nstreams; k++) {
        memset(got, 0xa5, (n ? n : 1) * sizeof(float));
        cr_assert_eq(offload_load(o, k, got), 0, "load: %s", offload_error(o));
        cr_assert(memcmp(got, ref[k], n * sizeof(float)) == 0, "stream %d differs", k);
    }
    free(got);
}

static float **alloc_ref(size_t n)
{
    float **ref = malloc(2 * sizeof(float *));
    ref[0] = calloc(n ? n : 1, sizeof(float));
    ref[1] = calloc(n ? n : 1, sizeof(float));
    return ref;
}

static void free_ref(float **ref)
{
    free(ref[0]);
    free(ref[1]);
    free(ref);
}

/* ---- tests ---- */

Test(offload, passes_match_plain_arrays)
{
    static const size_t shapes[][2] = {{1000, 64}, {1024, 256}, {1000, 3}, {5, 16}, {1, 1},
                                       {0, 16}};
    for (int ki = 0; ki < 3; ki++)
        for (size_t si = 0; si < sizeof(shapes) / sizeof(shapes[0]); si++)
            for (int ns = 1; ns <= 2; ns++) {
                size_t n = shapes[si][0], chunk = shapes[si][1];
                struct offload *o = make(kinds[ki], n, ns, chunk);
                float **ref = alloc_ref(n);
                for (int p = 0; p < 5; p++) {
                    int rc = pass(o, ref, n, chunk, ns, p);
                    cr_assert_eq(rc, 0, "%s n %zu chunk %zu streams %d pass %d: %s",
                                 kind_name(kinds[ki]), n, chunk, ns, p, offload_error(o));
                }
                assert_state(o, ref, n, ns);
                struct offload_stats st = offload_stats(o);
                size_t nchunks = (n + chunk - 1) / chunk;
                cr_assert_eq(st.chunks, 5 * nchunks);
                uint64_t moved = kinds[ki] == OFFLOAD_NONE ? 0 : 5 * n * ns * sizeof(float);
                /* Plus up to 4 chunks read ahead for a sixth pass. */
                size_t warm = kinds[ki] == OFFLOAD_NONE ? 0
                              : (n < 4 * chunk ? n : 4 * chunk) * ns * sizeof(float);
                cr_assert(st.bytes_read >= moved && st.bytes_read <= moved + warm,
                          "%s read %llu of %llu", kind_name(kinds[ki]),
                          (unsigned long long)st.bytes_read, (unsigned long long)moved);
                cr_assert_eq(st.bytes_written, moved);
                if (kinds[ki] == OFFLOAD_NONE)
                    cr_assert_eq(st.resident_bytes, n * ns * sizeof(float));
                else
                    cr_assert(st.resident_bytes <= 4 * chunk * ns * sizeof(float) &&
                              st.stored_bytes == n * ns * sizeof(float));
                free_ref(ref);
                offload_destroy(o);
            }
}

Test(offload, store_load_round_trip_bitwise)
{
    const size_t n = 777, chunk = 100;
    for (int ki = 0; ki < 3; ki++) {
        struct offload *o = make(kinds[ki], n, 2, chunk);
        /* Any bits, NaN payloads and denormals included, come back as they went. */
        float **ref = alloc_ref(n);
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < n; i++) {
                uint32_t bits = (uint32_t)weft_test_rnd();
                memcpy(&ref[k][i], &bits, sizeof(bits));
            }
        for (int k = 0; k < 2; k++)
            cr_assert_eq(offload_store(o, k, ref[k]), 0, "%s", offload_error(o));
        assert_state(o, ref, n, 2);
        /* A pass then starts from what was stored. */
        for (int k = 0; k < 2; k++)
            for (size_t i = 0; i < n; i++)
                ref[k][i] = (float)(i % 13) - 6.5f + (float)k;
        for (int k = 0; k < 2; k++)
            cr_assert_eq(offload_store(o, k, ref[k]), 0, "%s", offload_error(o));
        cr_assert_eq(pass(o, ref, n, chunk, 2, 1), 0, "%s", offload_error(o));
        assert_state(o, ref, n, 2);
        /* A store after a pass: the chunks read ahead for the next one
         * (waited for here, so that they are surely there) are stale and
         * must not be used. */
        uint64_t read = offload_stats(o).bytes_read;
        if (kinds[ki] != OFFLOAD_NONE)
            for (int ms = 0; ms < 5000; ms++) {
                if (offload_stats(o).bytes_read >= read + 4 * chunk * 2 * sizeof(float))
                    break;
                sleep_ms(1);
            }
        for (size_t i = 0; i < n; i++)
            ref[1][i] = (float)(i % 7) * 0.25f;
        cr_assert_eq(offload_store(o, 1, ref[1]), 0, "%s", offload_error(o));
        cr_assert_eq(pass(o, ref, n, chunk, 2, 2), 0, "%s", offload_error(o));
        assert_state(o, ref, n, 2);
        cr_assert_eq(offload_store(o, 2, ref[0]), -1, "stream 2 of 2 accepted");
        free_ref(ref);
        offload_destroy(o);
    }
}

/* A slow caller finds its chunks already read, the reads reach at least 2
 * chunks ahead, and no pread/pwrite runs on the caller's thread: all of
 * which fail if the transfers were done synchronously in offload_next. */
Test(offload, reads_run_ahead_of_a_slow_caller)
{
    const size_t chunk = 16384, nchunks = 24, n = chunk * nchunks;
    struct offload *o = make(OFFLOAD_FILE, n, 2, chunk);
    float **ref = alloc_ref(n);
    cr_assert_eq(pass(o, ref, n, chunk, 2, 0), 0, "%s", offload_error(o)); /* allocate blocks */
    struct offload_stats before = offload_stats(o);

    caller = pthread_self();
    atomic_store(&watch_caller, true);
    cr_assert_eq(offload_begin(o), 0);
    size_t off, len;
    float *ptr[2];
    int rc;
    while ((rc = offload_next(o, &off, &len, ptr)) > 0) {
        sleep_ms(10);
        update_both(ptr, ref, off, len, 2, 1);
    }
    atomic_store(&watch_caller, false);
    cr_assert_eq(rc, 0, "%s", offload_error(o));
    struct offload_stats st = offload_stats(o);
    uint64_t ready = st.chunks_ready - before.chunks_ready;
    cr_log_info("slow caller: %llu of %zu chunks ready, ahead %llu, io %.4f s, wait %.4f s",
                (unsigned long long)ready, nchunks, (unsigned long long)st.ahead_max,
                st.io_s - before.io_s, st.wait_s - before.wait_s);
    cr_assert(ready >= nchunks - 2, "only %llu of %zu chunks were read ahead",
              (unsigned long long)ready, nchunks);
    cr_assert(st.ahead_max >= 2, "reads reached only %llu chunks ahead",
              (unsigned long long)st.ahead_max);
    cr_assert(!atomic_load(&io_on_caller), "pread/pwrite ran on the caller's thread");
    assert_state(o, ref, n, 2);
    free_ref(ref);
    offload_destroy(o);
}

Test(offload, bad_directories_name_the_path)
{
    char err[8192], dir[512], path[640];
    struct offload_spec spec;

    snprintf(dir, sizeof(dir), "%s/missing", work);
    spec = spec_of(OFFLOAD_FILE, dir);
    cr_assert_null(offload_create(&spec, 0, 1000, 2, 100, err, sizeof(err)));
    file_of(path, sizeof(path), dir, 0);
    cr_assert(strstr(err, path) && strstr(err, "No such file or directory"), "%s", err);

    /* A file where the directory should be. */
    snprintf(dir, sizeof(dir), "%s/plain", work);
    FILE *f = fopen(dir, "w");
    cr_assert(f != NULL);
    fclose(f);
    spec = spec_of(OFFLOAD_FILE, dir);
    cr_assert_null(offload_create(&spec, 1, 1000, 2, 100, err, sizeof(err)));
    file_of(path, sizeof(path), dir, 1);
    cr_assert(strstr(err, path) && strstr(err, "Not a directory"), "%s", err);

    /* Root ignores permission bits, so /proc, where even root cannot
     * create a file, stands in for a read-only directory; as another user
     * a 0500 directory is tried too. */
    spec = spec_of(OFFLOAD_FILE, "/proc");
    cr_assert_null(offload_create(&spec, 2, 1000, 2, 100, err, sizeof(err)));
    file_of(path, sizeof(path), "/proc", 2);
    cr_assert(strstr(err, path) && strstr(err, "cannot create"), "%s", err);
    if (geteuid() != 0) {
        snprintf(dir, sizeof(dir), "%s/readonly", work);
        cr_assert_eq(mkdir(dir, 0500), 0);
        spec = spec_of(OFFLOAD_FILE, dir);
        cr_assert_null(offload_create(&spec, 0, 1000, 2, 100, err, sizeof(err)));
        file_of(path, sizeof(path), dir, 0);
        cr_assert(strstr(err, path) && strstr(err, "Permission denied"), "%s", err);
    }

    /* Bad arguments. */
    spec = spec_of(OFFLOAD_CPU, "");
    cr_assert_null(offload_create(&spec, 0, 10, 0, 100, err, sizeof(err)));
    cr_assert_null(offload_create(&spec, 0, 10, OFFLOAD_MAX_STREAMS + 1, 100, err, sizeof(err)));
    cr_assert_null(offload_create(&spec, 0, 10, 2, 0, err, sizeof(err)));
    cr_assert(strstr(err, "chunk 0"), "%s", err);
}

/* A pass that fails part way: the rest of the offload's life is clean
 * failures with the first reason, and what the pass left is recoverable. */
static void assert_failed_cleanly(struct offload *o, float **ref, size_t n, const char *reason)
{
    cr_assert(strstr(offload_error(o), reason), "error: %s", offload_error(o));
    /* The chunks the caller finished and the rest, as one consistent state. */
    assert_state(o, ref, n, 2);
    char first[8192];
    snprintf(first, sizeof(first), "%s", offload_error(o));
    cr_assert_eq(offload_begin(o), -1, "a failed offload began a pass");
    size_t off, len;
    float *ptr[2];
    cr_assert_eq(offload_next(o, &off, &len, ptr), -1);
    cr_assert_eq(offload_store(o, 0, ref[0]), -1);
    cr_assert_str_eq(offload_error(o), first);
}

Test(offload, full_disk_fails_and_loses_nothing)
{
    char mnt[512], path[640];
    snprintf(mnt, sizeof(mnt), "%s/small", work);
    cr_assert_eq(mkdir(mnt, 0700), 0);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=256k") != 0)
        cr_skip_test("cannot mount a small tmpfs here (not root?): full-disk case not run");
    const size_t n = 256 * 1024, chunk = 16384; /* 2 MB of state on 256 KiB */
    struct offload_spec spec = spec_of(OFFLOAD_FILE, mnt);
    char err[512];
    struct offload *o = offload_create(&spec, 0, n, 2, chunk, err, sizeof(err));
    file_of(path, sizeof(path), mnt, 0);
    if (o == NULL)
        umount(mnt);
    cr_assert(o != NULL, "%s", err);
    float **ref = alloc_ref(n);
    int rc = pass(o, ref, n, chunk, 2, 0);
    cr_assert_eq(rc, -1, "2 MB fit in a 256 KiB tmpfs");
    cr_assert(strstr(offload_error(o), path), "error: %s", offload_error(o));
    assert_failed_cleanly(o, ref, n, "No space left on device");
    offload_destroy(o);
    int gone = access(path, F_OK) != 0 && errno == ENOENT;
    umount(mnt);
    cr_assert(gone, "%s is still there after destroy", path);
    free_ref(ref);
}

Test(offload, io_errors_fail_cleanly_and_lose_nothing)
{
    const size_t n = 10000, chunk = 512;
    char path[640];
    file_of(path, sizeof(path), work, 0);

    /* EIO on a write in the middle of the third pass. */
    struct offload *o = make(OFFLOAD_FILE, n, 2, chunk);
    float **ref = alloc_ref(n);
    for (int p = 0; p < 2; p++)
        cr_assert_eq(pass(o, ref, n, chunk, 2, p), 0, "%s", offload_error(o));
    atomic_store(&write_countdown, 7);
    cr_assert_eq(pass(o, ref, n, chunk, 2, 2), -1);
    cr_assert(strstr(offload_error(o), path) && strstr(offload_error(o), "write"), "%s",
              offload_error(o));
    assert_failed_cleanly(o, ref, n, "Input/output error");
    offload_destroy(o);
    cr_assert(access(path, F_OK) != 0, "%s survived destroy", path);
    free_ref(ref);

    /* EIO on a read. */
    o = make(OFFLOAD_FILE, n, 2, chunk);
    ref = alloc_ref(n);
    cr_assert_eq(pass(o, ref, n, chunk, 2, 0), 0, "%s", offload_error(o));
    atomic_store(&read_countdown, 5);
    cr_assert_eq(pass(o, ref, n, chunk, 2, 1), -1);
    cr_assert(strstr(offload_error(o), "read"), "%s", offload_error(o));
    assert_failed_cleanly(o, ref, n, "Input/output error");
    offload_destroy(o);
    free_ref(ref);

    /* Short reads and writes are resumed, not errors. */
    atomic_store(&halve, true);
    o = make(OFFLOAD_FILE, n, 2, chunk);
    ref = alloc_ref(n);
    for (int p = 0; p < 3; p++)
        cr_assert_eq(pass(o, ref, n, chunk, 2, p), 0, "%s", offload_error(o));
    assert_state(o, ref, n, 2);
    atomic_store(&halve, false);

    /* A file cut short behind the offload's back: the reads hit its end. */
    cr_assert_eq(truncate(path, 1000), 0);
    cr_assert_eq(pass(o, ref, n, chunk, 2, 3), -1);
    cr_assert(strstr(offload_error(o), "unexpected end of file") &&
                  strstr(offload_error(o), path),
              "%s", offload_error(o));
    float *got = malloc(n * sizeof(float));
    cr_assert_eq(offload_load(o, 0, got), -1, "loaded a truncated file");
    free(got);
    offload_destroy(o);
    free_ref(ref);
}

Test(offload, misuse_is_refused_without_harm)
{
    const size_t n = 3000, chunk = 256;
    for (int ki = 0; ki < 3; ki++) {
        struct offload *o = make(kinds[ki], n, 2, chunk);
        float **ref = alloc_ref(n);
        size_t off, len;
        float *ptr[2];
        cr_assert_eq(offload_next(o, &off, &len, ptr), -1);
        cr_assert(strstr(offload_error(o), "without offload_begin"), "%s", offload_error(o));
        cr_assert_eq(pass(o, ref, n, chunk, 2, 0), 0, "%s", offload_error(o));
        /* Mid-pass: a second begin and a load are refused, the pass goes on. */
        cr_assert_eq(offload_begin(o), 0);
        cr_assert_eq(offload_next(o, &off, &len, ptr), 1);
        cr_assert_eq(offload_begin(o), -1);
        cr_assert_eq(offload_load(o, 0, ref[0]), -1);
        cr_assert(strstr(offload_error(o), "middle of a pass"), "%s", offload_error(o));
        int rc;
        do {
            update_both(ptr, ref, off, len, 2, 1);
        } while ((rc = offload_next(o, &off, &len, ptr)) > 0);
        cr_assert_eq(rc, 0, "%s", offload_error(o));
        assert_state(o, ref, n, 2);
        /* Destroy in the middle of a pass neither hangs nor leaks. */
        cr_assert_eq(offload_begin(o), 0);
        cr_assert_eq(offload_next(o, &off, &len, ptr), 1);
        offload_destroy(o);
        free_ref(ref);
    }
}

Test(offload, parse)
{
    struct offload_spec s;
    char err[256];
    cr_assert_eq(offload_parse("none", &s, err, sizeof(err)), 0);
    cr_assert_eq(s.kind, OFFLOAD_NONE);
    cr_assert_eq(offload_parse("cpu", &s, err, sizeof(err)), 0);
    cr_assert_eq(s.kind, OFFLOAD_CPU);
    cr_assert_eq(offload_parse("file:/tmp", &s, err, sizeof(err)), 0);
    cr_assert(s.kind == OFFLOAD_FILE && strcmp(s.dir, "/tmp") == 0);
    cr_assert_eq(offload_parse("file:a:b", &s, err, sizeof(err)), 0);
    cr_assert_str_eq(s.dir, "a:b");

    cr_assert_eq(offload_parse("file:", &s, err, sizeof(err)), -1);
    cr_assert(strstr(err, "needs a directory"), "%s", err);
    cr_assert_eq(offload_parse("gpu", &s, err, sizeof(err)), -1);
    cr_assert(strstr(err, "gpu") && strstr(err, "none, cpu or file:DIR"), "%s", err);
    cr_assert_eq(offload_parse("", &s, err, sizeof(err)), -1);
    cr_assert(strstr(err, "empty"), "%s", err);
    cr_assert_eq(offload_parse("CPU", &s, err, sizeof(err)), -1);
    cr_assert_eq(offload_parse("file", &s, err, sizeof(err)), -1);
    char *long_dir = malloc(6000);
    memcpy(long_dir, "file:", 5);
    memset(long_dir + 5, 'd', 5000);
    long_dir[5005] = '\0';
    cr_assert_eq(offload_parse(long_dir, &s, err, sizeof(err)), -1);
    cr_assert(strstr(err, "too long"), "%s", err);
    free(long_dir);
}
