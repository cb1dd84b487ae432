/*
 * nccl_comm.c - NCCL's communicator life cycle on top of weft: unique ids,
 * init (blocking, non-blocking, inside a group, all ranks of a process at
 * once), split, shrink, finalize/destroy/abort, queries, errors, memory.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bootstrap.h"
#include "compat.h"

#define COMM_MAGIC 0x6e63636cu /* "nccl" */
#define CONFIG_MAGIC 0xcafebeefu

static __thread char tl_err[COMPAT_ERR_LEN];

/* ---- registry and errors ------------------------------------------------- */

static struct weft_registry reg = WEFT_REGISTRY_INIT;

static bool reg_add(struct ncclComm *c)
{
    return weft_registry_add(&reg, c);
}

/* True when c was registered (and is now removed). */
static bool reg_remove(struct ncclComm *c)
{
    return weft_registry_remove(&reg, c);
}

bool compat_valid(const struct ncclComm *c)
{
    return weft_registry_find(&reg, c, NULL);
}

ncclResult_t compat_fail(struct ncclComm *c, ncclResult_t r, const char *fmt, ...)
{
    (void)c;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_err, sizeof(tl_err), fmt, ap);
    va_end(ap);
    return r;
}

static ncclResult_t map_status(weft_status_t st)
{
    switch (st) {
    case WEFT_OK: return ncclSuccess;
    case WEFT_INPROGRESS: return ncclInProgress;
    case WEFT_ERR_INVALID_ARG: return ncclInvalidArgument;
    case WEFT_ERR_NO_MEMORY:
    case WEFT_ERR_SYSTEM: return ncclSystemError;
    case WEFT_ERR_REMOTE:
    case WEFT_ERR_TIMEOUT: return ncclRemoteError;
    case WEFT_ERR_ABORTED:
    case WEFT_ERR_UNSUPPORTED:
    case WEFT_ERR_MISMATCH: return ncclInvalidUsage;
    case WEFT_ERR_INTERNAL: return ncclInternalError;
    }
    return ncclInternalError;
}

ncclResult_t compat_status(struct ncclComm *c, const char *fn, weft_status_t st)
{
    if (st == WEFT_OK)
        return ncclSuccess;
    return compat_fail(c, map_status(st), "%s: %s", fn,
                       weft_last_error(c && c->wc ? c->wc : NULL));
}

static void count_user(const void *c)
{
    atomic_fetch_add(&((struct ncclComm *)c)->users, 1);
}

ncclResult_t compat_release(struct ncclComm *c, ncclResult_t r)
{
    atomic_fetch_sub(&c->users, 1);
    return r;
}

/* The live handle behind comm (any state), counted as in use until
 * compat_release, or NULL with the error set. */
static struct ncclComm *comm_get(ncclComm_t comm, const char *fn, ncclResult_t *r)
{
    if (comm == NULL || !weft_registry_find(&reg, comm, count_user)) {
        *r = compat_fail(NULL, ncclInvalidArgument,
                         "%s: invalid communicator (NULL, destroyed or never created)", fn);
        return NULL;
    }
    return comm;
}

struct ncclComm *compat_ready(ncclComm_t comm, const char *fn, ncclResult_t *r)
{
    struct ncclComm *c = comm_get(comm, fn, r);
    if (c == NULL)
        return NULL;
    pthread_mutex_lock(&c->mu);
    ncclResult_t state = c->state;
    pthread_mutex_unlock(&c->mu);
    if (state == ncclInProgress) {
        *r = compat_release(c, compat_fail(c, ncclInvalidUsage,
                                           "%s: the communicator is still initializing; poll "
                                           "ncclCommGetAsyncError until it returns ncclSuccess",
                                           fn));
        return NULL;
    }
    if (state != ncclSuccess) {
        *r = compat_release(c, compat_fail(c, ncclInvalidUsage,
                                           "%s: the communicator failed to initialize (%s)", fn,
                                           ncclGetErrorString(state)));
        return NULL;
    }
    if (c->wc == NULL) {
        *r = compat_release(c, compat_fail(c, ncclInvalidUsage,
                                           "%s: this rank passed NCCL_SPLIT_NOCOLOR and has no "
                                           "communicator",
                                           fn));
        return NULL;
    }
    if (c->finalized) {
        *r = compat_release(c, compat_fail(c, ncclInvalidUsage,
                                           "%s: the communicator was finalized; only "
                                           "ncclCommDestroy is allowed",
                                           fn));
        return NULL;
    }
    return c;
}

const char *pncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the weft developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclNumResults: break;
    }
    return "unknown result code";
}
NCCL_ALIAS(ncclGetErrorString);

const char *pncclGetLastError(ncclComm_t comm)
{
    (void)comm; /* like NCCL: the last error of this thread */
    return tl_err;
}
NCCL_ALIAS(ncclGetLastError);

/* Deprecated in NCCL's header, still exported for old binaries. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void pncclResetDebugInit()
{
    /* weft reads its parameters once per process; nothing to reload. */
}
NCCL_ALIAS(ncclResetDebugInit);
#pragma GCC diagnostic pop

ncclResult_t pncclGetVersion(int *version)
{
    if (version == NULL)
        return compat_fail(NULL, ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
NCCL_ALIAS(ncclGetVersion);

ncclResult_t pncclGetUniqueId(ncclUniqueId *out)
{
    if (out == NULL)
        return compat_fail(NULL, ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    _Static_assert(sizeof(ncclUniqueId) == sizeof(weft_unique_id_t), "id sizes differ");
    /* Under weftrun the job's id is in the environment: the first id asked
     * for is that one, so every rank gets it without passing it around. */
    static int env_used;
    const char *hex = getenv("WEFT_UNIQUE_ID");
    weft_unique_id_t id;
    weft_status_t st;
    if (hex && *hex && !__atomic_exchange_n(&env_used, 1, __ATOMIC_SEQ_CST))
        st = weft_uid_from_hex(hex, &id);
    else
        st = weft_get_unique_id(&id);
    if (st != WEFT_OK)
        return compat_status(NULL, "ncclGetUniqueId", st);
    memcpy(out, &id, sizeof(id));
    return ncclSuccess;
}
NCCL_ALIAS(ncclGetUniqueId);

/* ---- init -------------------------------------------------------------- */

enum init_kind { INIT_RANK, INIT_SPLIT, INIT_SHRINK };

/* What a (possibly background) init needs; owned by the init. */
struct init_job {
    enum init_kind kind;
    struct ncclComm *c;
    weft_unique_id_t id;                 /* INIT_RANK */
    weft_comm_t parent;                  /* INIT_SPLIT, INIT_SHRINK */
    int color, key;                      /* INIT_SPLIT */
    int *excluded, nexcluded;            /* INIT_SHRINK */
};

static void comm_free(struct ncclComm *c)
{
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    c->magic = 0;
    free(c);
}

static weft_status_t run_init(struct init_job *j, weft_comm_t *wc)
{
    switch (j->kind) {
    case INIT_RANK: return weft_comm_init(wc, j->c->nranks, j->id, j->c->rank);
    case INIT_SPLIT: return weft_comm_split(j->parent, j->color, j->key, wc);
    case INIT_SHRINK: return weft_comm_shrink(j->parent, j->excluded, j->nexcluded, wc);
    }
    return WEFT_ERR_INTERNAL;
}

/* Runs the init and publishes its result; frees the job.  Returns the
 * NCCL result (for blocking callers). */
static ncclResult_t finish_init(struct init_job *j, const char *fn)
{
    struct ncclComm *c = j->c;
    weft_comm_t wc = NULL;
    weft_status_t st = run_init(j, &wc);
    ncclResult_t r = st == WEFT_OK ? ncclSuccess : compat_status(NULL, fn, st);
    if (st == WEFT_OK && wc != NULL) {
        weft_comm_rank(wc, &c->rank);
        weft_comm_size(wc, &c->nranks);
    }
    free(j->excluded);
    free(j);
    pthread_mutex_lock(&c->mu);
    bool abandoned = c->abandoned;
    c->wc = wc;
    c->state = r;
    c->thread_running = false;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (abandoned) {
        weft_comm_abort(wc);
        comm_free(c);
    }
    return r;
}

static void *init_main(void *arg)
{
    finish_init(arg, "ncclCommInitRank (background)");
    return NULL;
}

static struct ncclComm *comm_new(int rank, int nranks, int cudaDev, const ncclConfig_t *config)
{
    struct ncclComm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->magic = COMM_MAGIC;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->state = ncclInProgress;
    c->rank = rank;
    c->nranks = nranks;
    c->cudaDev = cudaDev;
    c->blocking = true;
    if (config) {
        c->blocking = config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
        if (config->commName)
            snprintf(c->name, sizeof(c->name), "%s", config->commName);
    }
    if (!reg_add(c)) {
        comm_free(c);
        return NULL;
    }
    return c;
}

static ncclResult_t check_config(const ncclConfig_t *config, const char *fn)
{
    if (config == NULL)
        return ncclSuccess;
    if (config->magic != CONFIG_MAGIC || config->size < offsetof(ncclConfig_t, cgaClusterSize) ||
        config->size > 4096)
        return compat_fail(NULL, ncclInvalidArgument,
                           "%s: config was not initialized with NCCL_CONFIG_INITIALIZER", fn);
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 &&
        config->blocking != 1)
        return compat_fail(NULL, ncclInvalidArgument, "%s: config->blocking is %d (0 or 1)", fn,
                           config->blocking);
    return ncclSuccess;
}

/* Starts j for a new handle c: in this thread when blocking and outside a
 * group, else in a background thread (the caller polls, or ncclGroupEnd
 * joins). */
static ncclResult_t start_init(struct init_job *j, const char *fn)
{
    struct ncclComm *c = j->c;
    bool in_group = compat_group_depth() > 0;
    if (c->blocking && !in_group)
        return finish_init(j, fn);
    pthread_mutex_lock(&c->mu);
    c->thread_running = true;
    int err = pthread_create(&c->thread, NULL, init_main, j);
    if (err != 0)
        c->thread_running = false;
    else
        pthread_detach(c->thread);
    pthread_mutex_unlock(&c->mu);
    if (err != 0) {
        ncclResult_t r = finish_init(j, fn); /* no thread: do it here */
        return r == ncclSuccess && !c->blocking ? ncclInProgress : r;
    }
    if (in_group && c->blocking) {
        compat_group_add_init(c);
        return ncclSuccess;
    }
    return ncclInProgress;
}

static ncclResult_t init_rank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                              const ncclConfig_t *config, const char *fn)
{
    if (comm == NULL)
        return compat_fail(NULL, ncclInvalidArgument, "%s: comm is NULL", fn);
    *comm = NULL;
    ncclResult_t r = check_config(config, fn);
    if (r != ncclSuccess)
        return r;
    if (nranks < 1 || rank < 0 || rank >= nranks)
        return compat_fail(NULL, ncclInvalidArgument, "%s: rank %d of %d ranks is out of range",
                           fn, rank, nranks);
    struct init_job *j = calloc(1, sizeof(*j));
    struct ncclComm *c = j ? comm_new(rank, nranks, 0, config) : NULL;
    if (c == NULL) {
        free(j);
        return compat_fail(NULL, ncclSystemError, "%s: out of memory", fn);
    }
    j->kind = INIT_RANK;
    j->c = c;
    memcpy(&j->id, &id, sizeof(j->id));
    *comm = c;
    r = start_init(j, fn);
    if (r != ncclSuccess && r != ncclInProgress) {
        reg_remove(c);
        comm_free(c);
        *comm = NULL;
    }
    return r;
}

ncclResult_t pncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return init_rank(comm, nranks, id, rank, NULL, "ncclCommInitRank");
}
NCCL_ALIAS(ncclCommInitRank);

ncclResult_t pncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                     ncclConfig_t *config)
{
    return init_rank(comm, nranks, id, rank, config, "ncclCommInitRankConfig");
}
NCCL_ALIAS(ncclCommInitRankConfig);

ncclResult_t pncclCommInitRankScalable(ncclComm_t *comm, int nranks, int rank, int nId,
                                       ncclUniqueId *ids, ncclConfig_t *config)
{
    if (nId < 1 || ids == NULL)
        return compat_fail(NULL, ncclInvalidArgument,
                           "ncclCommInitRankScalable: %d ids at %p", nId, (void *)ids);
    /* Every rank has the same ids in the same order; the first was made
     * by rank 0, which serves the whole rendezvous. */
    return init_rank(comm, nranks, ids[0], rank, config, "ncclCommInitRankScalable");
}
NCCL_ALIAS(ncclCommInitRankScalable);

ncclResult_t pncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    const char *fn = "ncclCommInitAll";
    if (comms == NULL || ndev < 1)
        return compat_fail(NULL, ncclInvalidArgument, "%s: comms %p, ndev %d", fn,
                           (void *)comms, ndev);
    weft_unique_id_t id;
    weft_status_t st = weft_get_unique_id(&id);
    if (st != WEFT_OK)
        return compat_status(NULL, fn, st);
    ncclUniqueId nid;
    memcpy(&nid, &id, sizeof(nid));
    /* One rank per device, all in this process: the inits run together in
     * a group, so this one thread starts them all and waits for all. */
    ncclResult_t r = ncclSuccess;
    int made = 0;
    pncclGroupStart();
    for (int i = 0; i < ndev && r == ncclSuccess; i++, made++) {
        r = init_rank(&comms[i], ndev, nid, i, NULL, fn);
        if (r == ncclSuccess)
            comms[i]->cudaDev = devlist ? devlist[i] : i;
    }
    ncclResult_t g = pncclGroupEnd();
    if (r == ncclSuccess)
        r = g;
    if (r != ncclSuccess) {
        char why[COMPAT_ERR_LEN];
        snprintf(why, sizeof(why), "%s", tl_err);
        for (int i = 0; i < made; i++)
            if (comms[i])
                pncclCommAbort(comms[i]);
        for (int i = 0; i < ndev; i++)
            comms[i] = NULL;
        compat_fail(NULL, r, "%s", why);
    }
    return r;
}
NCCL_ALIAS(ncclCommInitAll);

/* Split and Shrink: the parent must be ready; *newcomm starts NULL. */
static struct ncclComm *child_enter(ncclComm_t comm, ncclComm_t *newcomm, ncclConfig_t *config,
                                    const char *fn, ncclResult_t *r)
{
    struct ncclComm *p = compat_ready(comm, fn, r);
    if (p == NULL)
        return NULL;
    if (newcomm == NULL) {
        *r = compat_release(p, compat_fail(p, ncclInvalidArgument, "%s: newcomm is NULL", fn));
        return NULL;
    }
    *newcomm = NULL;
    *r = check_config(config, fn);
    if (*r != ncclSuccess) {
        compat_release(p, *r);
        return NULL;
    }
    return p;
}

/* Starts the child's init (job: kind and arguments; owns its excluded
 * list).  Without a config the child inherits the parent's blocking mode.
 * A NOCOLOR rank takes part in the split but keeps no handle. */
static ncclResult_t child_start(struct ncclComm *p, ncclConfig_t *config, struct init_job job,
                                bool nocolor, ncclComm_t *newcomm, const char *fn)
{
    struct init_job *j = calloc(1, sizeof(*j));
    ncclConfig_t inherit = NCCL_CONFIG_INITIALIZER;
    inherit.blocking = p->blocking;
    struct ncclComm *c = j ? comm_new(-1, 0, p->cudaDev, config ? config : &inherit) : NULL;
    if (c == NULL) {
        free(j);
        free(job.excluded);
        return compat_fail(p, ncclSystemError, "%s: out of memory", fn);
    }
    job.c = c;
    job.parent = p->wc;
    *j = job;
    ncclResult_t r = start_init(j, fn);
    if ((r != ncclSuccess && r != ncclInProgress) || (r == ncclSuccess && nocolor)) {
        reg_remove(c);
        comm_free(c);
        return r;
    }
    *newcomm = c;
    return r;
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm,
                            ncclConfig_t *config)
{
    const char *fn = "ncclCommSplit";
    ncclResult_t r;
    struct ncclComm *p = child_enter(comm, newcomm, config, fn, &r);
    if (p == NULL)
        return r;
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
        return compat_release(p, compat_fail(p, ncclInvalidArgument,
                                             "%s: color %d is negative and not "
                                             "NCCL_SPLIT_NOCOLOR",
                                             fn, color));
    struct init_job job = {.kind = INIT_SPLIT, .color = color, .key = key};
    return compat_release(p,
                          child_start(p, config, job, color == NCCL_SPLIT_NOCOLOR, newcomm, fn));
}
NCCL_ALIAS(ncclCommSplit);

ncclResult_t pncclCommShrink(ncclComm_t comm, int *excluded, int nexcluded, ncclComm_t *newcomm,
                             ncclConfig_t *config, int flags)
{
    const char *fn = "ncclCommShrink";
    ncclResult_t r;
    struct ncclComm *p = child_enter(comm, newcomm, config, fn, &r);
    if (p == NULL)
        return r;
    if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT)
        return compat_release(
            p, compat_fail(p, ncclInvalidArgument, "%s: unknown flags %#x", fn, flags));
    if (nexcluded < 0 || (nexcluded > 0 && excluded == NULL))
        return compat_release(p, compat_fail(p, ncclInvalidArgument,
                                             "%s: %d excluded ranks at %p", fn, nexcluded,
                                             (void *)excluded));
    /* Operations on host buffers have all completed by now, so there is
     * nothing in flight for NCCL_SHRINK_ABORT to stop. */
    int *copy = malloc(sizeof(int) * (size_t)(nexcluded ? nexcluded : 1));
    if (copy == NULL)
        return compat_release(p, compat_fail(p, ncclSystemError, "%s: out of memory", fn));
    if (nexcluded)
        memcpy(copy, excluded, sizeof(int) * (size_t)nexcluded);
    struct init_job job = {.kind = INIT_SHRINK, .excluded = copy, .nexcluded = nexcluded};
    return compat_release(p, child_start(p, config, job, false, newcomm, fn));
}
NCCL_ALIAS(ncclCommShrink);

/* ---- end of life ------------------------------------------------------- */

ncclResult_t pncclCommFinalize(ncclComm_t comm)
{
    ncclResult_t r;
    struct ncclComm *c = compat_ready(comm, "ncclCommFinalize", &r);
    if (c == NULL)
        return r;
    /* Operations on host buffers completed inside their calls (or their
     * group), so nothing is left to flush. */
    c->finalized = true;
    return compat_release(c, ncclSuccess);
}
NCCL_ALIAS(ncclCommFinalize);

static ncclResult_t comm_end(ncclComm_t comm, const char *fn, bool abort)
{
    if (comm == NULL)
        return abort ? ncclSuccess
                     : compat_fail(NULL, ncclInvalidArgument, "%s: comm is NULL", fn);
    if (!reg_remove(comm))
        return compat_fail(NULL, ncclInvalidArgument,
                           "%s: invalid communicator (destroyed or never created)", fn);
    struct ncclComm *c = comm;
    pthread_mutex_lock(&c->mu);
    bool running = c->thread_running;
    if (running)
        c->abandoned = true; /* the init thread frees it when it returns */
    weft_comm_t wc = c->wc;
    pthread_mutex_unlock(&c->mu);
    if (running)
        return ncclSuccess;
    /* weft returns once no thread is inside weft on wc (abort fails their
     * operations first); then wait for those threads to leave this layer,
     * which they do without blocking, before freeing the handle. */
    weft_status_t st = abort ? weft_comm_abort(wc) : weft_comm_destroy(wc);
    ncclResult_t r = compat_status(NULL, fn, st);
    while (atomic_load(&c->users) > 0) {
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    comm_free(c);
    return r;
}

ncclResult_t pncclCommDestroy(ncclComm_t comm)
{
    return comm_end(comm, "ncclCommDestroy", false);
}
NCCL_ALIAS(ncclCommDestroy);

ncclResult_t pncclCommAbort(ncclComm_t comm)
{
    return comm_end(comm, "ncclCommAbort", true);
}
NCCL_ALIAS(ncclCommAbort);

/* A call weft does not support on a valid comm: ncclInvalidUsage + why. */
static ncclResult_t unsupported(ncclComm_t comm, const char *fn, const char *why)
{
    ncclResult_t r;
    struct ncclComm *c = comm_get(comm, fn, &r);
    if (c == NULL)
        return r;
    return compat_release(c, compat_fail(c, ncclInvalidUsage, "%s: %s", fn, why));
}

ncclResult_t pncclCommRevoke(ncclComm_t comm, int flags)
{
    (void)flags;
    return unsupported(comm, "ncclCommRevoke",
                       "not supported by weft yet (use ncclCommAbort, or ncclCommShrink among "
                       "the healthy ranks)");
}
NCCL_ALIAS(ncclCommRevoke);

/* ---- queries ----------------------------------------------------------- */

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async)
{
    ncclResult_t r;
    struct ncclComm *c = comm_get(comm, "ncclCommGetAsyncError", &r);
    if (c == NULL)
        return r;
    if (async == NULL)
        return compat_release(c, compat_fail(c, ncclInvalidArgument,
                                             "ncclCommGetAsyncError: asyncError is NULL"));
    pthread_mutex_lock(&c->mu);
    ncclResult_t state = c->state;
    pthread_mutex_unlock(&c->mu);
    if (state != ncclSuccess || c->wc == NULL) {
        *async = state;
        return compat_release(c, ncclSuccess);
    }
    weft_status_t st = weft_comm_get_error(c->wc);
    *async = st == WEFT_OK ? ncclSuccess : compat_status(c, "asynchronous error", st);
    return compat_release(c, ncclSuccess);
}
NCCL_ALIAS(ncclCommGetAsyncError);

#define QUERY(fname, out, expr)                                                               \
    ncclResult_t p##fname(const ncclComm_t comm, int *out)                                    \
    {                                                                                         \
        ncclResult_t r;                                                                       \
        struct ncclComm *c = compat_ready(comm, #fname, &r);                                  \
        if (c == NULL)                                                                        \
            return r;                                                                         \
        if (out == NULL)                                                                      \
            return compat_release(                                                            \
                c, compat_fail(c, ncclInvalidArgument, #fname ": " #out " is NULL"));         \
        *out = (expr);                                                                        \
        return compat_release(c, ncclSuccess);                                                \
    }                                                                                         \
    NCCL_ALIAS(fname)

QUERY(ncclCommCount, count, c->nranks);
QUERY(ncclCommUserRank, rank, c->rank);
QUERY(ncclCommCuDevice, device, c->cudaDev);

/* ---- memory ------------------------------------------------------------ */

/* Host buffers carry their mapping size in a header one page long, so
 * the pointer handed out stays page-aligned. */
#define MEM_HDR 4096

ncclResult_t pncclMemAlloc(void **ptr, size_t size)
{
    if (ptr == NULL)
        return compat_fail(NULL, ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
    *ptr = NULL;
    if (size == 0)
        return ncclSuccess;
    if (size > SIZE_MAX - 2 * MEM_HDR)
        return compat_fail(NULL, ncclInvalidArgument, "ncclMemAlloc: %zu bytes", size);
    size_t total = (size + MEM_HDR + MEM_HDR - 1) & ~(size_t)(MEM_HDR - 1);
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return compat_fail(NULL, ncclSystemError, "ncclMemAlloc: mmap of %zu bytes: %s", total,
                           strerror(errno));
    if (total >= (2u << 20))
        madvise(p, total, MADV_HUGEPAGE); /* first touches are 30x cheaper */
    *(size_t *)p = total;
    *ptr = (char *)p + MEM_HDR;
    return ncclSuccess;
}
NCCL_ALIAS(ncclMemAlloc);

ncclResult_t pncclMemFree(void *ptr)
{
    if (ptr == NULL)
        return ncclSuccess;
    if (((uintptr_t)ptr & (MEM_HDR - 1)) != 0)
        return compat_fail(NULL, ncclInvalidArgument,
                           "ncclMemFree: %p was not returned by ncclMemAlloc", ptr);
    void *base = (char *)ptr - MEM_HDR;
    if (munmap(base, *(size_t *)base) != 0)
        return compat_fail(NULL, ncclSystemError, "ncclMemFree(%p): %s", ptr, strerror(errno));
    return ncclSuccess;
}
NCCL_ALIAS(ncclMemFree);

/* Registration: weft_mem_register (zero-copy over verbs; a record of the
 * range elsewhere). */
ncclResult_t pncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    ncclResult_t r;
    struct ncclComm *c = compat_ready(comm, "ncclCommRegister", &r);
    if (c == NULL)
        return r;
    if (handle == NULL || (buff == NULL && size > 0))
        return compat_release(c, compat_fail(c, ncclInvalidArgument,
                                             "ncclCommRegister: buff %p, handle %p", buff,
                                             (void *)handle));
    return compat_release(c, compat_status(c, "ncclCommRegister", weft_mem_register(c->wc, buff, size, handle)));
}
NCCL_ALIAS(ncclCommRegister);

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void *handle)
{
    ncclResult_t r;
    struct ncclComm *c = comm_get(comm, "ncclCommDeregister", &r);
    if (c == NULL)
        return r;
    return compat_release(c, compat_status(c, "ncclCommDeregister", weft_mem_deregister(c->wc, handle)));
}
NCCL_ALIAS(ncclCommDeregister);

ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                                     int flags)
{
    (void)buff, (void)size, (void)win, (void)flags;
    return unsupported(comm, "ncclCommWindowRegister",
                       "symmetric memory windows need GPU memory; weft does not support them");
}
NCCL_ALIAS(ncclCommWindowRegister);

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    (void)win;
    return unsupported(comm, "ncclCommWindowDeregister", "weft registers no windows");
}
NCCL_ALIAS(ncclCommWindowDeregister);
