/*
 * offload.c - the optimizer-state offload of offload.h: a ring of chunk
 * buffers that one worker thread fills ahead of the caller and writes back
 * behind it, from a sparse file (pread/pwrite) or a host buffer (memcpy).
 */
#include "offload.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

/* Ring slots: the chunk the caller holds, two read ahead and one being
 * written back; when the writes keep up, the fourth reads a third ahead. */
#define SLOTS 4
/* Longest dir: the file name after it must still fit a 4096-byte path. */
#define DIR_MAX 4000

/* A slot goes FREE -> READING -> READY (worker), READY -> HELD -> DIRTY
 * (caller), DIRTY -> WRITING -> FREE (worker).  A failed read goes back to
 * FREE, a failed write back to DIRTY: its buffer still has the caller's
 * values, which offload_load then returns. */
enum slot_state { FREE, READING, READY, HELD, DIRTY, WRITING };

struct slot {
    enum slot_state state;
    long chunk; /* -1: none */
    float *buf; /* (nstreams, len): stream k of the chunk at k * len */
};

/* One per rank, owned by its creator.  The fields above `lock` are set by
 * create and only read afterwards; the rest is shared with the worker and
 * changed under the lock.  The worker writes only inside an open pass and
 * reads only there or while warm, never after a failure; store first ends
 * the warm reads, so the store is never written by two threads at once.
 * Chunk c of the store (file or host buffer) sits at byte
 * c * chunk * nstreams * 4 and holds its streams one after the other, so
 * one pread moves all of them. */
struct offload {
    enum offload_kind kind;
    int nstreams;
    size_t n, chunk, nchunks;
    size_t slot_bytes;                  /* one slot's buffer */
    float *arrays[OFFLOAD_MAX_STREAMS]; /* NONE: (n) each */
    char *host;                         /* CPU: the store, n * nstreams floats */
    int fd;                             /* FILE: the store; -1 otherwise */
    char path[4200];                    /* FILE: the file; CPU: a name for messages */
    bool has_worker;
    pthread_t worker;

    pthread_mutex_t lock;
    pthread_cond_t to_worker, to_caller;
    struct slot slot[SLOTS];
    bool stop;    /* destroy: the worker exits */
    bool open;    /* a pass is between begin and next's 0 or -1 */
    bool warm;    /* no pass: the next one's first chunks may be read */
    bool failed;  /* sticky after an I/O error; err says which */
    bool holding; /* the caller holds chunk `need` */
    long need;    /* the lowest chunk the caller has not finished */
    struct offload_stats st;
    char err[4400];
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int offload_parse(const char *text, struct offload_spec *spec, char *err, size_t errlen)
{
    memset(spec, 0, sizeof(*spec));
    if (text == NULL)
        text = "";
    if (strcmp(text, "none") == 0) {
        spec->kind = OFFLOAD_NONE;
        return 0;
    }
    if (strcmp(text, "cpu") == 0) {
        spec->kind = OFFLOAD_CPU;
        return 0;
    }
    if (strncmp(text, "file:", 5) == 0) {
        const char *dir = text + 5;
        size_t len = strlen(dir);
        if (len == 0) {
            snprintf(err, errlen, "--offload file: needs a directory, e.g. file:/tmp");
            return -1;
        }
        if (len > DIR_MAX) {
            snprintf(err, errlen, "--offload file: directory name too long (%zu bytes, at most %d)",
                     len, DIR_MAX);
            return -1;
        }
        spec->kind = OFFLOAD_FILE;
        memcpy(spec->dir, dir, len + 1);
        return 0;
    }
    if (text[0] == '\0')
        snprintf(err, errlen, "--offload: empty value; expected none, cpu or file:DIR");
    else
        snprintf(err, errlen, "--offload %.64s: unknown; expected none, cpu or file:DIR", text);
    return -1;
}

static size_t chunk_len(const struct offload *o, long c)
{
    size_t off = (size_t)c * o->chunk;
    return o->n - off < o->chunk ? o->n - off : o->chunk;
}

static off_t chunk_pos(const struct offload *o, long c)
{
    return (off_t)((size_t)c * o->chunk * (size_t)o->nstreams * sizeof(float));
}

/* Short transfers are retried; one that moves nothing at all (end of file
 * on a read) is an error of its own, reported as -1 instead of an errno. */
#define SHORT_IO (-1)

/* Moves bytes between buf and the store at *pos: 0, an errno or SHORT_IO,
 * with *pos where it stopped. */
static int move(struct offload *o, bool write, void *buf, size_t bytes, off_t *pos)
{
    if (o->kind == OFFLOAD_CPU) {
        if (write)
            memcpy(o->host + *pos, buf, bytes);
        else
            memcpy(buf, o->host + *pos, bytes);
        *pos += (off_t)bytes;
        return 0;
    }
    char *p = buf;
    while (bytes > 0) {
        ssize_t r = write ? pwrite(o->fd, p, bytes, *pos) : pread(o->fd, p, bytes, *pos);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return errno;
        if (r == 0)
            return SHORT_IO;
        p += r;
        bytes -= (size_t)r;
        *pos += r;
    }
    return 0;
}

/* Under the lock (or with no pass open): the first error wins, later ones
 * are its consequences. */
static void fail_io(struct offload *o, bool write, off_t from, size_t bytes, off_t at, int e)
{
    if (o->failed)
        return;
    o->failed = true;
    const char *what = e == SHORT_IO ? (write ? "no bytes written" : "unexpected end of file")
                                     : strerror(e);
    snprintf(o->err, sizeof(o->err), "offload: %s %s at byte %lld (of %zu from %lld): %s",
             write ? "write to" : "read from", o->path, (long long)at, bytes, (long long)from,
             what);
}

/* A caller mistake: reported, but the state is intact, so not sticky. */
static int misuse(struct offload *o, const char *what)
{
    if (!o->failed)
        snprintf(o->err, sizeof(o->err), "offload: %s", what);
    return -1;
}

/* The worker's next transfer, by when the caller needs it: the chunks
 * from the caller's on, reading each into its slot or first writing back
 * what still occupies it; then the oldest chunk left to write.  NULL: none. */
static struct slot *pick(struct offload *o, bool *write)
{
    if (!(o->open || o->warm) || o->failed)
        return NULL;
    long end = o->need + SLOTS < (long)o->nchunks ? o->need + SLOTS : (long)o->nchunks;
    for (long t = o->need; t < end; t++) {
        struct slot *s = &o->slot[t % SLOTS];
        if (s->chunk == t)
            continue;
        if (s->state == FREE) {
            s->state = READING;
            s->chunk = t;
            if (o->holding && (uint64_t)(t - o->need) > o->st.ahead_max)
                o->st.ahead_max = (uint64_t)(t - o->need);
            *write = false;
            return s;
        }
        if (s->state == DIRTY) {
            s->state = WRITING;
            *write = true;
            return s;
        }
        break;
    }
    struct slot *oldest = NULL;
    for (int i = 0; i < SLOTS; i++)
        if (o->slot[i].state == DIRTY && (!oldest || o->slot[i].chunk < oldest->chunk))
            oldest = &o->slot[i];
    if (oldest) {
        oldest->state = WRITING;
        *write = true;
    }
    return oldest;
}

static void *worker_main(void *arg)
{
    struct offload *o = arg;
    pthread_mutex_lock(&o->lock);
    for (;;) {
        struct slot *s = NULL;
        bool write = false;
        while (!o->stop && (s = pick(o, &write)) == NULL)
            pthread_cond_wait(&o->to_worker, &o->lock);
        if (o->stop)
            break;
        size_t bytes = chunk_len(o, s->chunk) * (size_t)o->nstreams * sizeof(float);
        off_t pos = chunk_pos(o, s->chunk);
        pthread_mutex_unlock(&o->lock);
        double t0 = now();
        off_t at = pos;
        int e = move(o, write, s->buf, bytes, &at);
        double dt = now() - t0;
        pthread_mutex_lock(&o->lock);
        o->st.io_s += dt;
        if (e != 0) {
            fail_io(o, write, pos, bytes, at, e);
            s->state = write ? DIRTY : FREE;
            if (!write)
                s->chunk = -1;
        } else if (write) {
            s->state = FREE;
            s->chunk = -1;
            o->st.bytes_written += bytes;
        } else {
            s->state = READY;
            o->st.bytes_read += bytes;
        }
        pthread_cond_broadcast(&o->to_caller);
    }
    pthread_mutex_unlock(&o->lock);
    return NULL;
}

/* Signals go to the trainer's threads, never to the worker: its I/O is
 * then not interrupted and the trainer's handlers run where it expects. */
static int start_worker(struct offload *o)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&o->worker, NULL, worker_main, o);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        o->has_worker = true;
    return rc;
}

struct offload *offload_create(const struct offload_spec *spec, int rank, size_t n,
                               int nstreams, size_t chunk, char *err, size_t errlen)
{
    if (nstreams < 1 || nstreams > OFFLOAD_MAX_STREAMS || chunk == 0 || rank < 0) {
        snprintf(err, errlen, "offload: bad arguments (streams %d, chunk %zu, rank %d)",
                 nstreams, chunk, rank);
        return NULL;
    }
    /* The store's size must fit a size_t and an off_t. */
    size_t stream_max = (size_t)INT64_MAX / sizeof(float) / (size_t)nstreams;
    if (n > stream_max || n > SIZE_MAX / sizeof(float) / (size_t)nstreams) {
        snprintf(err, errlen, "offload: %zu floats per stream is too many", n);
        return NULL;
    }
    struct offload *o = calloc(1, sizeof(*o));
    if (o == NULL) {
        snprintf(err, errlen, "offload: out of memory");
        return NULL;
    }
    o->kind = spec->kind;
    o->nstreams = nstreams;
    o->n = n;
    o->chunk = chunk;
    o->nchunks = (n + chunk - 1) / chunk;
    o->fd = -1;
    o->need = 0;
    pthread_mutex_init(&o->lock, NULL);
    pthread_cond_init(&o->to_worker, NULL);
    pthread_cond_init(&o->to_caller, NULL);
    for (int i = 0; i < SLOTS; i++)
        o->slot[i].chunk = -1;
    size_t total = n * (size_t)nstreams * sizeof(float);

    if (o->kind == OFFLOAD_NONE) {
        for (int k = 0; k < nstreams; k++) {
            o->arrays[k] = calloc(n ? n : 1, sizeof(float));
            if (o->arrays[k] == NULL)
                goto nomem;
        }
        o->st.resident_bytes = total;
        return o;
    }
    if (o->kind == OFFLOAD_CPU) {
        /* calloc of a large block maps zero pages: like the sparse file,
         * the store costs memory only once the first pass writes it. */
        o->host = calloc(total ? total : 1, 1);
        if (o->host == NULL)
            goto nomem;
        snprintf(o->path, sizeof(o->path), "the host buffer");
    } else {
        if (strlen(spec->dir) > DIR_MAX) {
            snprintf(err, errlen, "offload: directory name too long (%zu bytes, at most %d)",
                     strlen(spec->dir), DIR_MAX);
            goto fail;
        }
        snprintf(o->path, sizeof(o->path), "%s/weft-optim-rank%d.%ld.bin", spec->dir, rank,
                 (long)getpid());
        o->fd = open(o->path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (o->fd < 0) {
            snprintf(err, errlen, "offload: cannot create %s: %s", o->path, strerror(errno));
            goto fail;
        }
        if (ftruncate(o->fd, (off_t)total) != 0) {
            snprintf(err, errlen, "offload: cannot size %s to %zu bytes: %s", o->path, total,
                     strerror(errno));
            goto fail;
        }
    }
    o->slot_bytes = (n < chunk ? n : chunk) * (size_t)nstreams * sizeof(float);
    for (int i = 0; i < SLOTS; i++) {
        o->slot[i].buf = malloc(o->slot_bytes ? o->slot_bytes : 1);
        if (o->slot[i].buf == NULL)
            goto nomem;
    }
    o->st.resident_bytes = SLOTS * o->slot_bytes;
    o->st.stored_bytes = total;
    o->warm = true;
    int rc = start_worker(o);
    if (rc != 0) {
        snprintf(err, errlen, "offload: cannot start the I/O thread: %s", strerror(rc));
        goto fail;
    }
    return o;
nomem:
    snprintf(err, errlen, "offload: out of memory for %zu floats in %d streams", n, nstreams);
fail:
    offload_destroy(o);
    return NULL;
}

void offload_destroy(struct offload *o)
{
    if (o == NULL)
        return;
    if (o->has_worker) {
        pthread_mutex_lock(&o->lock);
        o->stop = true;
        pthread_cond_signal(&o->to_worker);
        pthread_mutex_unlock(&o->lock);
        pthread_join(o->worker, NULL);
    }
    if (o->fd >= 0) {
        close(o->fd);
        unlink(o->path);
    }
    for (int i = 0; i < SLOTS; i++)
        free(o->slot[i].buf);
    free(o->host);
    for (int k = 0; k < OFFLOAD_MAX_STREAMS; k++)
        free(o->arrays[k]);
    pthread_cond_destroy(&o->to_caller);
    pthread_cond_destroy(&o->to_worker);
    pthread_mutex_destroy(&o->lock);
    free(o);
}

static bool none_reading(const struct offload *o)
{
    for (int i = 0; i < SLOTS; i++)
        if (o->slot[i].state == READING)
            return false;
    return true;
}

/* Before a store: the chunks read ahead for the next pass would be stale.
 * The next pass then reads them itself. */
static void drop_warm(struct offload *o)
{
    o->warm = false;
    while (!o->failed && !none_reading(o))
        pthread_cond_wait(&o->to_caller, &o->lock);
    for (int i = 0; i < SLOTS; i++)
        if (o->slot[i].state == READY) {
            o->slot[i].state = FREE;
            o->slot[i].chunk = -1;
        }
}

/* Checks shared by store and load; the lock is held on return 0. */
static int whole_stream(struct offload *o, int stream)
{
    pthread_mutex_lock(&o->lock);
    const char *bad = stream < 0 || stream >= o->nstreams ? "no such stream"
                      : o->open ? "store or load in the middle of a pass"
                                : NULL;
    if (bad == NULL)
        return 0;
    misuse(o, bad);
    pthread_mutex_unlock(&o->lock);
    return -1;
}

int offload_store(struct offload *o, int stream, const float *src)
{
    if (whole_stream(o, stream) != 0)
        return -1;
    int rc = 0;
    if (o->failed) {
        rc = -1;
    } else if (o->kind == OFFLOAD_NONE) {
        memcpy(o->arrays[stream], src, o->n * sizeof(float));
    } else {
        drop_warm(o);
        rc = o->failed ? -1 : 0;
        for (long c = 0; c < (long)o->nchunks && rc == 0; c++) {
            size_t len = chunk_len(o, c);
            off_t pos = chunk_pos(o, c) + (off_t)((size_t)stream * len * sizeof(float));
            off_t at = pos;
            int e = move(o, true, (void *)(src + (size_t)c * o->chunk), len * sizeof(float), &at);
            if (e != 0) {
                fail_io(o, true, pos, len * sizeof(float), at, e);
                rc = -1;
            }
        }
    }
    pthread_mutex_unlock(&o->lock);
    return rc;
}

int offload_load(struct offload *o, int stream, float *dst)
{
    if (whole_stream(o, stream) != 0)
        return -1;
    int rc = 0;
    if (o->kind == OFFLOAD_NONE) {
        memcpy(dst, o->arrays[stream], o->n * sizeof(float));
        pthread_mutex_unlock(&o->lock);
        return 0;
    }
    for (long c = 0; c < (long)o->nchunks && rc == 0; c++) {
        size_t len = chunk_len(o, c);
        float *out = dst + (size_t)c * o->chunk;
        /* Left DIRTY only by a failed pass: newer than the store. */
        const struct slot *kept = NULL;
        for (int i = 0; i < SLOTS; i++)
            if (o->slot[i].state == DIRTY && o->slot[i].chunk == c)
                kept = &o->slot[i];
        if (kept) {
            memcpy(out, kept->buf + (size_t)stream * len, len * sizeof(float));
            continue;
        }
        off_t pos = chunk_pos(o, c) + (off_t)((size_t)stream * len * sizeof(float));
        off_t at = pos;
        int e = move(o, false, out, len * sizeof(float), &at);
        if (e != 0) {
            fail_io(o, false, pos, len * sizeof(float), at, e);
            rc = -1;
        }
    }
    pthread_mutex_unlock(&o->lock);
    return rc;
}

int offload_begin(struct offload *o)
{
    pthread_mutex_lock(&o->lock);
    int rc = 0;
    if (o->failed)
        rc = -1;
    else if (o->open)
        rc = misuse(o, "offload_begin while a pass is open");
    if (rc == 0) {
        o->open = true;
        o->warm = false;
        o->holding = false;
        o->need = 0;
        pthread_cond_signal(&o->to_worker);
    }
    pthread_mutex_unlock(&o->lock);
    return rc;
}

/* The caller blocks until done() or a failure; the time counts as wait. */
static void wait_for(struct offload *o, bool (*done)(const struct offload *))
{
    if (o->failed || done(o))
        return;
    double t0 = now();
    while (!o->failed && !done(o))
        pthread_cond_wait(&o->to_caller, &o->lock);
    o->st.wait_s += now() - t0;
}

static bool chunk_ready(const struct offload *o)
{
    const struct slot *s = &o->slot[o->need % SLOTS];
    return s->chunk == o->need && s->state == READY;
}

static bool all_written(const struct offload *o)
{
    for (int i = 0; i < SLOTS; i++)
        if (o->slot[i].state == DIRTY || o->slot[i].state == WRITING)
            return false;
    return true;
}

int offload_next(struct offload *o, size_t *off, size_t *len, float **ptr)
{
    pthread_mutex_lock(&o->lock);
    int rc = 1;
    if (!o->open) {
        rc = o->failed ? -1 : misuse(o, "offload_next without offload_begin");
        goto out;
    }
    if (o->holding) {
        if (o->kind != OFFLOAD_NONE)
            o->slot[o->need % SLOTS].state = DIRTY;
        o->need++;
        o->holding = false;
        pthread_cond_signal(&o->to_worker);
    }
    if (o->failed) {
        rc = -1;
        o->open = false;
        goto out;
    }
    if (o->need == (long)o->nchunks) {
        if (o->kind != OFFLOAD_NONE)
            wait_for(o, all_written);
        rc = o->failed ? -1 : 0;
        o->open = false;
        /* The next pass starts at chunk 0 too, and the caller has other
         * work (the next forward and backward) to hide its first reads. */
        o->need = 0;
        o->warm = rc == 0;
        pthread_cond_signal(&o->to_worker);
        goto out;
    }
    *off = (size_t)o->need * o->chunk;
    *len = chunk_len(o, o->need);
    if (o->kind == OFFLOAD_NONE) {
        for (int k = 0; k < o->nstreams; k++)
            ptr[k] = o->arrays[k] + *off;
        o->st.chunks_ready++;
    } else {
        if (chunk_ready(o))
            o->st.chunks_ready++;
        else
            wait_for(o, chunk_ready);
        if (o->failed) {
            rc = -1;
            o->open = false;
            goto out;
        }
        struct slot *s = &o->slot[o->need % SLOTS];
        s->state = HELD;
        for (int k = 0; k < o->nstreams; k++)
            ptr[k] = s->buf + (size_t)k * *len;
    }
    o->holding = true;
    o->st.chunks++;
out:
    pthread_mutex_unlock(&o->lock);
    return rc;
}

const char *offload_error(const struct offload *o)
{
    return o->err;
}

struct offload_stats offload_stats(const struct offload *o)
{
    /* The counters change under the lock on the worker's side; locking
     * does not change what the caller sees of *o. */
    pthread_mutex_t *lock = (pthread_mutex_t *)&o->lock;
    pthread_mutex_lock(lock);
    struct offload_stats st = o->st;
    pthread_mutex_unlock(lock);
    return st;
}
