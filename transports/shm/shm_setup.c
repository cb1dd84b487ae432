/*
 * shm_setup.c - shared-memory transport setup: the parameters, our segment
 * (created, reserved and touched once at init, unlinked by ready()), the
 * mapping of a peer's segment at connect, the CMA probe, the liveness
 * check of a peer's process, and finalize.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "transports/shm/shm.h"
#include "transports/transport.h"

/*
 * WEFT_SHM_CMA_MIN's default: off, because the ring won at every size we
 * measured.  2 processes on the 2 vCPUs of MEASURED.md's machines, best of
 * interleaved runs, one-way GB/s of a ping-pong, ring (8 x 256 KiB) vs CMA:
 *   64 KiB 7.8 vs 5.5 | 256 KiB 19 vs 6.1 | 1 MiB 27 vs 8.8 | 4 MiB 31 vs 12
 *   16 MiB 9.8 vs 5.9 | 64 MiB 8.6 vs 4.7;  8 messages of 16 MiB in flight:
 *   9.0 vs 8.1.
 * process_vm_readv pins the peer's pages on every call, and the ring's two
 * copies run on two cores at once.  CMA only came out ahead, for 16 MiB and
 * more, while other jobs kept descheduling one of the two ranks (the ring
 * needs both running; a pull needs only the receiver).  The engine's
 * messages are WEFT_CHUNK_SIZE (512 KiB) at most, where the ring is ~3x
 * faster.  WEFT_SHM_CMA_MIN=16M suits large point-to-point transfers on
 * oversubscribed nodes.
 */
#define SHM_DEFAULT_CMA_MIN 0

static size_t round_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

/* Bytes of a ring's header: slot descriptors and the two short-message
 * slots, rounded up to a page. */
static size_t ring_hdr_size(const struct shm_ctx *ctx, uint32_t nslots)
{
    return round_up(shm_ll_off(nslots) + 2 * shm_ll_slot(ctx->ll_bytes), ctx->page);
}

/*
 * Shrinks the rings so that the segment (a ring per other rank of the host)
 * fits max_bytes: slots down to SHM_MIN_SLOT_BYTES first, then fewer of
 * them, down to 2.  Every page of the segment is allocated, mapped and
 * touched at init, here and in the peer that sends into it (~10 us a page
 * altogether here: fallocate 3, MAP_POPULATE 3-5, the peer's 1.5-4), so
 * without a bound the host's work and memory grow with the square of its
 * ranks: 64 ranks took 8 GiB and 33 s.  Touching less would not help much:
 * fallocate allocates every page anyway, and the first calls would fault.
 * Slots of 64 KiB move as fast as 256 KiB through the ring (MEASURED.md),
 * so the default bound costs nothing measured up to ~64 ranks (60 KiB) and
 * leaves 16 ranks the full rings; 128 ranks get 24 KiB, ~25% slower point
 * to point.  The least ring (2 slots) may still pass the bound.
 */
static void ring_fit(struct shm_ctx *ctx, size_t max_bytes)
{
    size_t rings = (size_t)ctx->ngroup - 1;
    size_t hdr = round_up(sizeof(struct shm_seg), ctx->page);
    if (max_bytes == 0 || rings == 0)
        return;
    size_t per_ring = max_bytes > hdr ? (max_bytes - hdr) / rings : 0;
    size_t floor = WEFT_MIN(ctx->slot_bytes, round_up(SHM_MIN_SLOT_BYTES, ctx->page));
    uint32_t least = WEFT_MIN(ctx->nslots, 2u);
    for (;;) {
        size_t rh = ring_hdr_size(ctx, ctx->nslots);
        size_t data = per_ring > rh ? per_ring - rh : 0;
        if (ctx->nslots * ctx->slot_bytes <= data)
            return;
        if (ctx->slot_bytes > floor)
            ctx->slot_bytes = WEFT_MAX(floor, data / ctx->nslots / ctx->page * ctx->page);
        else if (ctx->nslots > least)
            ctx->nslots = (uint32_t)WEFT_MAX(least, WEFT_MIN(ctx->nslots - 1, data / floor));
        else
            return;
    }
}

/* Position of rank r in the group (every rank when there is no group
 * list), or -1 when it is not in it. */
static int group_pos(const struct shm_ctx *ctx, int r)
{
    if (ctx->group == NULL)
        return r >= 0 && r < ctx->nranks ? r : -1;
    int lo = 0, hi = ctx->ngroup - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (ctx->group[mid] == r)
            return mid;
        if (ctx->group[mid] < r)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

/* Index of sender's ring in a segment owned by rank owner: one ring per
 * other member of the group, in group order. */
static int ring_index(const struct shm_ctx *ctx, int owner, int sender)
{
    int s = group_pos(ctx, sender);
    return s < group_pos(ctx, owner) ? s : s - 1;
}

/* An integer parameter from the environment (getenv until the param table
 * has it): dflt when unset, an error naming it when out of [lo, hi]. */
static weft_status_t env_size(const struct weft_transport_init *args, const char *name,
                              int64_t dflt, int64_t lo, int64_t hi, int64_t *out)
{
    const char *v = getenv(name);
    *out = dflt;
    if (v == NULL || *v == '\0')
        return WEFT_OK;
    if (!weft_parse_size(v, out) || *out < lo || *out > hi)
        return weft_error(args->err, WEFT_ERR_INVALID_ARG,
                          "%s=%s is not a size in %lld..%lld", name, v, (long long)lo,
                          (long long)hi);
    return WEFT_OK;
}

static int seg_open(const struct shm_ctx *ctx, const char *name, bool path, int flags)
{
    if (path)
        return open(name, flags | O_CLOEXEC | O_NOFOLLOW, 0600);
    return shm_open(name, flags, 0600);
}

static int seg_unlink(const char *name, bool path)
{
    return path ? unlink(name) : shm_unlink(name);
}

static bool pid_alive(pid_t pid)
{
    return kill(pid, 0) == 0 || errno == EPERM;
}

/* A segment of our name exists: a crashed earlier run of the same job (a
 * fixed WEFT_ROOT and secret give the same job number) is removed, a live
 * owner is an error. */
static weft_status_t seg_stale(struct shm_ctx *ctx)
{
    int fd = seg_open(ctx, ctx->name, ctx->use_path, O_RDONLY);
    struct shm_seg old;
    memset(&old, 0, sizeof(old));
    if (fd >= 0) {
        if (pread(fd, &old, sizeof(old), 0) != (ssize_t)sizeof(old))
            memset(&old, 0, sizeof(old));
        close(fd);
    }
    if (old.magic == SHM_SEG_MAGIC && old.pid > 0 && old.pid != ctx->pid && pid_alive(old.pid))
        return weft_error(ctx->err, WEFT_ERR_SYSTEM,
                          "rank %d: shared-memory segment %s exists and belongs to the live "
                          "process %d (is rank %d of this job running twice?)",
                          ctx->rank, ctx->name, (int)old.pid, ctx->rank);
    WEFT_WARN(WEFT_SUB_NET, "rank %d: removing the stale shared-memory segment %s (pid %d is gone)",
              ctx->rank, ctx->name, (int)old.pid);
    if (seg_unlink(ctx->name, ctx->use_path) < 0 && errno != ENOENT)
        return weft_error(ctx->err, WEFT_ERR_SYSTEM,
                          "rank %d: cannot remove the stale shared-memory segment %s: %s",
                          ctx->rank, ctx->name, strerror(errno));
    return WEFT_OK;
}

/* The error of a failed reservation or mapping of our segment in dir. */
static weft_status_t seg_error(struct shm_ctx *ctx, int fd, const char *dir, const char *what,
                               int err)
{
    if (err == ENOSPC) {
        struct statvfs sv;
        unsigned long long avail = 0;
        if (fstatvfs(fd, &sv) == 0)
            avail = (unsigned long long)sv.f_bavail * sv.f_frsize;
        return weft_error(ctx->err, WEFT_ERR_SYSTEM,
                          "rank %d: cannot create the shared-memory segment %s: %s is full "
                          "(%llu bytes free, %zu needed for %d ring%s of %u slots x %zu bytes; "
                          "see WEFT_SHM_MAX_BYTES, WEFT_SHM_SLOTS and WEFT_SHM_SLOT_BYTES)",
                          ctx->rank, ctx->name, dir, avail, ctx->seg_bytes, ctx->ngroup - 1,
                          ctx->ngroup == 2 ? "" : "s", ctx->nslots, ctx->slot_bytes);
    }
    return weft_error(ctx->err, err == ENOMEM ? WEFT_ERR_NO_MEMORY : WEFT_ERR_SYSTEM,
                      "rank %d: cannot %s the shared-memory segment %s of %zu bytes: %s",
                      ctx->rank, what, ctx->name, ctx->seg_bytes, strerror(err));
}

/* Creates, reserves, maps and touches our segment and fills its header. */
static weft_status_t seg_create(struct shm_ctx *ctx, const char *dir)
{
    int fd = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        fd = seg_open(ctx, ctx->name, ctx->use_path, O_RDWR | O_CREAT | O_EXCL);
        if (fd >= 0 || errno != EEXIST || attempt == 1)
            break;
        WEFT_CHECK(seg_stale(ctx));
    }
    if (fd < 0)
        return weft_error(ctx->err, WEFT_ERR_SYSTEM,
                          "rank %d: cannot create the shared-memory segment %s in %s: %s",
                          ctx->rank, ctx->name, dir, strerror(errno));
    weft_status_t st;
    /* Reserve every page now: a full /dev/shm is an error here instead of a
     * SIGBUS on first touch. */
    int rc = fallocate(fd, 0, 0, (off_t)ctx->seg_bytes);
    if (rc < 0 && (errno == EOPNOTSUPP || errno == ENOSYS))
        rc = ftruncate(fd, (off_t)ctx->seg_bytes);
    if (rc < 0) {
        st = seg_error(ctx, fd, dir, "reserve", errno);
        goto fail;
    }
    void *p = mmap(NULL, ctx->seg_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) {
        st = seg_error(ctx, fd, dir, "map", errno);
        goto fail;
    }
    close(fd);
    ctx->seg = p;
    /* First touch costs ~18 us a page in a fresh segment: pay it now, not
     * in the data path. */
    for (size_t off = 0; off < ctx->seg_bytes; off += ctx->page)
        ((volatile char *)p)[off] = 0;
    struct shm_seg *s = ctx->seg;
    s->magic = SHM_SEG_MAGIC;
    s->version = SHM_VERSION;
    s->rank = ctx->rank;
    s->nranks = ctx->nranks;
    s->pid = (int32_t)ctx->pid;
    s->job = ctx->job;
    s->nslots = ctx->nslots;
    s->slot_bytes = ctx->slot_bytes;
    s->ll_bytes = (uint32_t)ctx->ll_bytes;
    s->hdr_bytes = round_up(sizeof(struct shm_seg), ctx->page);
    s->ring_bytes = ctx->ring_bytes;
    s->ring_hdr_bytes = ctx->ring_hdr_bytes;
    s->seg_bytes = ctx->seg_bytes;
    ctx->probe = SHM_SEG_MAGIC ^ ctx->job ^ (uint64_t)ctx->pid;
    s->probe_addr = (uint64_t)(uintptr_t)&ctx->probe;
    s->probe_value = ctx->probe;
    return WEFT_OK;
fail:
    close(fd);
    seg_unlink(ctx->name, ctx->use_path);
    return st;
}

weft_status_t shm_init(const struct weft_transport_init *args, void **vctx, void *addr,
                       size_t *addrlen)
{
    if (args == NULL || vctx == NULL || addr == NULL || addrlen == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "shm init: NULL argument");
    *vctx = NULL;
    if (args->nranks < 1 || args->rank < 0 || args->rank >= args->nranks)
        return weft_error_quiet(args->err, WEFT_ERR_INVALID_ARG,
                                "shm init: rank %d of %d ranks is not valid", args->rank,
                                args->nranks);
    if (*addrlen < sizeof(struct shm_addr))
        return weft_error_quiet(args->err, WEFT_ERR_INVALID_ARG,
                                "shm init: address buffer of %zu bytes, %zu needed", *addrlen,
                                sizeof(struct shm_addr));
    int64_t nslots, slot_bytes, cma_min, ll_bytes, max_bytes;
    WEFT_CHECK(env_size(args, "WEFT_SHM_SLOTS", SHM_DEFAULT_SLOTS, 1, 1024, &nslots));
    WEFT_CHECK(env_size(args, "WEFT_SHM_SLOT_BYTES", SHM_DEFAULT_SLOT_BYTES, 4096, 1 << 30,
                        &slot_bytes));
    WEFT_CHECK(env_size(args, "WEFT_SHM_CMA_MIN", SHM_DEFAULT_CMA_MIN, 0, INT64_MAX, &cma_min));
    WEFT_CHECK(env_size(args, "WEFT_SHM_LL_BYTES", SHM_DEFAULT_LL_BYTES, 0, SHM_LL_MAX, &ll_bytes));
    WEFT_CHECK(env_size(args, "WEFT_SHM_MAX_BYTES", SHM_DEFAULT_MAX_BYTES, 0, INT64_MAX,
                        &max_bytes));
    const char *dir = getenv("WEFT_SHM_DIR");
    if (dir == NULL || *dir == '\0')
        dir = SHM_DEFAULT_DIR;

    struct shm_ctx *ctx;
    WEFT_TP_CTX_NEW(ctx, args, "shm");
    weft_status_t st;
    ctx->ngroup = args->group ? args->ngroup : args->nranks;
    if (args->group) {
        ctx->group = malloc((size_t)args->ngroup * sizeof(*ctx->group));
        bool sane = ctx->group != NULL && args->ngroup >= 1 && args->ngroup <= args->nranks;
        for (int i = 0; sane && i < args->ngroup; i++) {
            ctx->group[i] = args->group[i];
            sane = args->group[i] >= 0 && args->group[i] < args->nranks &&
                   (i == 0 || args->group[i] > args->group[i - 1]);
        }
        if (!sane || group_pos(ctx, args->rank) < 0) {
            st = weft_error(args->err, ctx->group ? WEFT_ERR_INVALID_ARG : WEFT_ERR_NO_MEMORY,
                            "shm init: rank %d: bad group of %d ranks", args->rank,
                            args->ngroup);
            goto fail;
        }
    }
    ctx->job = args->job;
    ctx->pid = getpid();
    ctx->page = (size_t)sysconf(_SC_PAGESIZE);
    ctx->nslots = (uint32_t)nslots;
    ctx->slot_bytes = round_up((size_t)slot_bytes, ctx->page);
    ctx->cma_min = (size_t)cma_min;
    ctx->ll_bytes = (size_t)ll_bytes;
    ring_fit(ctx, (size_t)max_bytes);
    ctx->ring_hdr_bytes = ring_hdr_size(ctx, ctx->nslots);
    ctx->ring_bytes = ctx->ring_hdr_bytes + ctx->nslots * ctx->slot_bytes;
    size_t hdr = round_up(sizeof(struct shm_seg), ctx->page);
    if ((size_t)(ctx->ngroup - 1) > (SIZE_MAX / 2 - hdr) / ctx->ring_bytes) {
        st = weft_error(args->err, WEFT_ERR_INVALID_ARG,
                        "rank %d: %d rings of %zu bytes do not fit in memory", args->rank,
                        ctx->ngroup - 1, ctx->ring_bytes);
        goto fail;
    }
    ctx->seg_bytes = hdr + (size_t)(ctx->ngroup - 1) * ctx->ring_bytes;
    ctx->conns = calloc((size_t)args->nranks, sizeof(*ctx->conns));
    if (ctx->conns == NULL) {
        st = weft_error(args->err, WEFT_ERR_NO_MEMORY, "shm init: out of memory");
        goto fail;
    }
    ctx->use_path = strcmp(dir, "/dev/shm") != 0 && strcmp(dir, "/dev/shm/") != 0;
    int len = ctx->use_path ? snprintf(ctx->name, sizeof(ctx->name), "%s/weft-%016" PRIx64 "-%d",
                                       dir, ctx->job, ctx->rank)
                            : snprintf(ctx->name, sizeof(ctx->name), "/weft-%016" PRIx64 "-%d",
                                       ctx->job, ctx->rank);
    if (len < 0 || (size_t)len >= sizeof(ctx->name)) {
        st = weft_error(args->err, WEFT_ERR_INVALID_ARG,
                        "WEFT_SHM_DIR=%s is too long for a segment name (%zu bytes at most)", dir,
                        sizeof(ctx->name) - 30);
        goto fail;
    }
    uint64_t t0 = weft_now_ns();
    st = seg_create(ctx, dir);
    if (st < 0)
        goto fail; /* seg_create removed what it made */
    struct shm_addr a;
    memset(&a, 0, sizeof(a));
    a.magic = SHM_ADDR_MAGIC;
    a.version = SHM_VERSION;
    a.pid = (int32_t)ctx->pid;
    a.rank = ctx->rank;
    a.flags = ctx->use_path ? SHM_ADDR_PATH : 0;
    memcpy(a.name, ctx->name, sizeof(a.name));
    memset(addr, 0, *addrlen);
    memcpy(addr, &a, sizeof(a));
    *addrlen = sizeof(a);
    *vctx = ctx;
    WEFT_INFO(WEFT_SUB_NET,
              "rank %d: shm segment %s: %d rings of %u x %zu bytes (%s), %zu bytes mapped and "
              "touched in %.1f ms; CMA from %zu bytes",
              ctx->rank, ctx->name, ctx->ngroup - 1, ctx->nslots, ctx->slot_bytes,
              ctx->nslots == nslots && ctx->slot_bytes == round_up((size_t)slot_bytes, ctx->page)
                  ? "as set"
                  : "shrunk to WEFT_SHM_MAX_BYTES",
              ctx->seg_bytes, (double)(weft_now_ns() - t0) / 1e6, ctx->cma_min);
    return WEFT_OK;
fail:
    shm_finalize(ctx);
    return st;
}

/* ---- connect -------------------------------------------------------------- */

/* The geometry a peer wrote in its header, checked against its file. */
static bool seg_hdr_sane(const struct shm_seg *h, const struct shm_ctx *ctx, int peer,
                         off_t file_bytes)
{
    size_t page = ctx->page;
    if (h->magic != SHM_SEG_MAGIC || h->version != SHM_VERSION || h->rank != peer ||
        h->nranks != ctx->nranks || h->job != ctx->job || h->nslots < 1 || h->nslots > 1024)
        return false;
    if (h->slot_bytes == 0 || h->slot_bytes % page || h->hdr_bytes % page ||
        h->ring_hdr_bytes % page || h->slot_bytes > (1u << 30) || h->hdr_bytes > (1u << 20))
        return false;
    if (h->ll_bytes > SHM_LL_MAX ||
        h->ring_hdr_bytes < shm_ll_off(h->nslots) + 2 * shm_ll_slot(h->ll_bytes) ||
        h->ring_hdr_bytes > (64u << 20))
        return false;
    if (h->ring_bytes != h->ring_hdr_bytes + h->nslots * h->slot_bytes)
        return false;
    return h->seg_bytes == h->hdr_bytes + (uint64_t)(ctx->ngroup - 1) * h->ring_bytes &&
           h->seg_bytes == (uint64_t)file_bytes;
}

/* Tests whether we can pull from the peer with process_vm_readv. */
static void cma_probe(struct shm_ctx *ctx, struct shm_conn *c)
{
    if (ctx->cma_min == 0 || ctx->cma_broken)
        return;
    uint64_t v = 0;
    struct iovec local = {&v, sizeof(v)};
    struct iovec remote = {(void *)(uintptr_t)c->peer_seg->probe_addr, sizeof(v)};
    ssize_t k = process_vm_readv(c->pid, &local, 1, &remote, 1, 0);
    if (k == (ssize_t)sizeof(v) && v == c->peer_seg->probe_value) {
        atomic_store_explicit(&c->rx->cma_ok, 1, memory_order_relaxed);
        return;
    }
    int err = k < 0 ? errno : EIO;
    WEFT_INFO(WEFT_SUB_NET,
              "rank %d: process_vm_readv from rank %d (pid %d) does not work (%s); large "
              "shared-memory messages %s go through the ring",
              ctx->rank, c->peer, (int)c->pid, k < 0 ? strerror(err) : "wrong bytes",
              err == EPERM || err == ENOSYS ? "from every peer" : "from it");
    if (err == EPERM || err == ENOSYS)
        ctx->cma_broken = true;
}

/* How we will know that the peer's process is gone: a pidfd (it also
 * reports a zombie, which kill(pid, 0) does not), or kill(pid, 0) on old
 * kernels; neither when its pid is not in our pid namespace. */
static void conn_watch_pid(struct shm_ctx *ctx, struct shm_conn *c)
{
#ifdef SYS_pidfd_open
    c->pidfd = (int)syscall(SYS_pidfd_open, c->pid, 0);
    if (c->pidfd >= 0) {
        fcntl(c->pidfd, F_SETFD, FD_CLOEXEC);
        c->pid_visible = true;
        return;
    }
#endif
    c->pidfd = -1;
    c->pid_visible = pid_alive(c->pid);
    if (!c->pid_visible)
        WEFT_INFO(WEFT_SUB_NET,
                  "rank %d: pid %d of rank %d is not visible here (another pid namespace?); "
                  "its death will only show as a timeout",
                  ctx->rank, (int)c->pid, c->peer);
}

bool shm_peer_dead(struct shm_conn *c)
{
    if (!c->pid_visible)
        return false;
    if (c->pidfd >= 0) {
        struct pollfd p = {.fd = c->pidfd, .events = POLLIN};
        return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR));
    }
    return kill(c->pid, 0) < 0 && errno == ESRCH;
}

weft_status_t shm_connect(void *vctx, int peer, const void *addr, size_t addrlen,
                          void **vconn)
{
    struct shm_ctx *ctx = vctx;
    WEFT_TP_CONNECT_CHECK(ctx, addr, vconn, "shm");
    if (peer < 0 || peer >= ctx->nranks || peer == ctx->rank || group_pos(ctx, peer) < 0)
        return weft_error_quiet(ctx->err, WEFT_ERR_INVALID_ARG,
                                "rank %d: shm connect to rank %d: not a peer on this host (0..%d)",
                                ctx->rank, peer, ctx->nranks - 1);
    struct shm_addr a;
    if (addrlen != sizeof(a))
        return weft_error_quiet(ctx->err, WEFT_ERR_INVALID_ARG,
                                "rank %d: shm address of rank %d has %zu bytes, expected %zu",
                                ctx->rank, peer, addrlen, sizeof(a));
    memcpy(&a, addr, sizeof(a));
    a.name[sizeof(a.name) - 1] = '\0';
    if (a.magic != SHM_ADDR_MAGIC || a.version != SHM_VERSION || a.rank != peer || a.pid <= 0)
        return weft_error_quiet(ctx->err, WEFT_ERR_INVALID_ARG,
                                "rank %d: the shm address of rank %d is not one (magic 0x%08x, "
                                "version %u, rank %d)",
                                ctx->rank, peer, a.magic, a.version, a.rank);
    if (ctx->conns[peer]) {
        if (memcmp(&ctx->conns[peer]->addr, &a, sizeof(a)) != 0)
            return weft_error_quiet(ctx->err, WEFT_ERR_INVALID_ARG,
                                    "rank %d: shm connect to rank %d twice with different "
                                    "addresses",
                                    ctx->rank, peer);
        *vconn = ctx->conns[peer];
        return WEFT_OK;
    }

    bool path = (a.flags & SHM_ADDR_PATH) != 0;
    int fd = seg_open(ctx, a.name, path, O_RDWR);
    if (fd < 0) {
        int err = errno;
        return weft_error(ctx->err, err == ENOENT ? WEFT_ERR_REMOTE : WEFT_ERR_SYSTEM,
                          "rank %d: cannot open the shared-memory segment %s of rank %d (pid "
                          "%d): %s",
                          ctx->rank, a.name, peer, (int)a.pid, strerror(err));
    }
    struct shm_seg h;
    struct stat sb;
    if (fstat(fd, &sb) < 0 || pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) ||
        !seg_hdr_sane(&h, ctx, peer, sb.st_size) || h.pid != a.pid) {
        close(fd);
        return weft_error(ctx->err, WEFT_ERR_REMOTE,
                          "rank %d: the shared-memory segment %s of rank %d (pid %d) is not a "
                          "segment of this job's rank %d (%lld bytes)",
                          ctx->rank, a.name, peer, (int)a.pid, peer, (long long)sb.st_size);
    }
    weft_status_t st = WEFT_OK;
    struct shm_conn *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        close(fd);
        return weft_error(ctx->err, WEFT_ERR_NO_MEMORY, "rank %d: no memory for a connection",
                          ctx->rank);
    }
    c->base.reqs = &ctx->reqs;
    c->ctx = ctx;
    c->peer = peer;
    c->pid = a.pid;
    c->pidfd = -1;
    c->addr = a;
    c->tx_nslots = h.nslots;
    c->tx_slot_bytes = h.slot_bytes;
    c->tx_map_bytes = h.ring_bytes;
    off_t off = (off_t)(h.hdr_bytes + (uint64_t)ring_index(ctx, peer, ctx->rank) * h.ring_bytes);
    /* Eager: the page tables are filled now, not on the first send. */
    void *ring = mmap(NULL, h.ring_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd,
                      off);
    void *hdr = mmap(NULL, h.hdr_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    int err = errno;
    close(fd);
    if (ring == MAP_FAILED || hdr == MAP_FAILED) {
        if (ring != MAP_FAILED)
            munmap(ring, h.ring_bytes);
        if (hdr != MAP_FAILED)
            munmap(hdr, h.hdr_bytes);
        free(c);
        return weft_error(ctx->err, err == ENOMEM ? WEFT_ERR_NO_MEMORY : WEFT_ERR_SYSTEM,
                          "rank %d: cannot map %llu bytes of the shared-memory segment %s of "
                          "rank %d: %s",
                          ctx->rank, (unsigned long long)h.ring_bytes, a.name, peer,
                          strerror(err));
    }
    c->tx_map = ring;
    c->tx = ring;
    c->tx_data = (char *)ring + h.ring_hdr_bytes;
    c->peer_seg = hdr;
    c->peer_seg_bytes = h.hdr_bytes;
    char *mine = (char *)ctx->seg + ctx->seg->hdr_bytes +
                 (size_t)ring_index(ctx, ctx->rank, peer) * ctx->ring_bytes;
    c->rx = (struct shm_ring *)mine;
    c->rx_data = mine + ctx->ring_hdr_bytes;
    c->ll_tx = (char *)ring + shm_ll_off(h.nslots);
    c->ll_tx_bytes = h.ll_bytes;
    c->ll_rx = mine + shm_ll_off(ctx->nslots);
    c->ll_rx_bytes = ctx->ll_bytes;
    conn_watch_pid(ctx, c);
    cma_probe(ctx, c);
    ctx->conns[peer] = c;
    *vconn = c;
    WEFT_INFO(WEFT_SUB_NET, "rank %d: shm to rank %d (pid %d, %s) mapped: %u x %zu bytes%s",
              ctx->rank, peer, (int)c->pid, a.name, c->tx_nslots, c->tx_slot_bytes,
              atomic_load(&c->rx->cma_ok) ? ", we pull large messages by CMA" : "");
    return st;
}

/* Removes every segment name of the job: at ready (every rank has mapped
 * every segment), and at finalize when the communicator never became
 * ready (so it never will), including names of ranks that died or stopped
 * before they could remove their own: a crash during init leaves nothing
 * behind. */
static void unlink_job(const struct shm_ctx *ctx)
{
    const char *slash = strrchr(ctx->name, '/'), *dash = strrchr(ctx->name, '-');
    if (slash == NULL || dash == NULL || dash < slash)
        return;
    char dir[sizeof(ctx->name)], prefix[64];
    snprintf(dir, sizeof(dir), "%.*s", (int)(slash - ctx->name), ctx->name);
    snprintf(prefix, sizeof(prefix), "%.*s", (int)(dash + 1 - slash - 1), slash + 1);
    DIR *d = opendir(ctx->use_path ? dir : "/dev/shm");
    if (d == NULL)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char name[sizeof(ctx->name) + sizeof(e->d_name) + 2];
        snprintf(name, sizeof(name), "%s/%s", ctx->use_path ? dir : "", e->d_name);
        seg_unlink(name, ctx->use_path);
    }
    closedir(d);
}

/* ---- ready and finalize --------------------------------------------------- */

weft_status_t shm_ready(void *vctx)
{
    struct shm_ctx *ctx = vctx;
    if (ctx == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "shm ready: NULL context");
    if (ctx->unlinked)
        return WEFT_OK;
    /* Every peer has mapped every segment: the names can go, so that a
     * crash from now on leaves nothing behind.  Each rank removes all of
     * the job's, not only its own: one stopped or killed right after the
     * barrier would leave its own behind. */
    ctx->unlinked = true;
    if (seg_unlink(ctx->name, ctx->use_path) < 0 && errno != ENOENT)
        WEFT_WARN(WEFT_SUB_NET, "rank %d: cannot remove the shared-memory name %s: %s",
                  ctx->rank, ctx->name, strerror(errno));
    unlink_job(ctx);
    return WEFT_OK;
}

void shm_finalize(void *vctx)
{
    struct shm_ctx *ctx = vctx;
    if (ctx == NULL)
        return;
    shm_waker_stop(ctx);
    for (int i = 0; ctx->conns && i < ctx->nranks; i++) {
        struct shm_conn *c = ctx->conns[i];
        if (c == NULL)
            continue;
        /* A peer still waiting on us fails now instead of at its timeout. */
        if (c->base.err == WEFT_OK && atomic_load(&c->rx->failed) == 0) {
            snprintf(c->rx->why, sizeof(c->rx->why), "rank %d closed its shared-memory transport",
                     ctx->rank);
            atomic_store_explicit(&c->rx->failed, 1, memory_order_release);
            shm_signal(c);
        }
        munmap(c->tx_map, c->tx_map_bytes);
        munmap(c->peer_seg, c->peer_seg_bytes);
        if (c->pidfd >= 0)
            close(c->pidfd);
        free(c);
    }
    if (ctx->seg)
        munmap(ctx->seg, ctx->seg_bytes);
    if (!ctx->unlinked && ctx->seg)
        unlink_job(ctx);
    weft_req_pool_fini(&ctx->reqs);
    free(ctx->conns);
    free(ctx->group);
    free(ctx);
}
