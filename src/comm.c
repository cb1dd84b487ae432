/*
 * comm.c - communicator lifecycle: init from an id or from the environment
 * (weftrun, torchrun-style WEFT_ROOT, Open MPI, PMI, Slurm), the registry
 * of live communicators, destroy and abort, and the sticky error record.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"
#include "engine.h"
#include "tune.h"
#include "transports/transport.h"

/* What every rank publishes at init. */
struct rank_info {
    char host[64];
    uint32_t pid;
    uint32_t taddr_len;
    uint8_t taddr[WEFT_TRANSPORT_ADDR_MAX];
};

/* Live communicators, so that a destroyed handle is refused, not used. */
static struct weft_registry reg = WEFT_REGISTRY_INIT;

static void count_user(const void *c)
{
    atomic_fetch_add(&((struct weft_comm *)c)->users, 1);
}

bool weft_comm_acquire(struct weft_comm *c)
{
    return weft_registry_find(&reg, c, count_user);
}

void weft_comm_release(struct weft_comm *c)
{
    atomic_fetch_sub(&c->users, 1);
}

/* After the comm left the registry: waits for the threads still inside a
 * call on it (their operations have finished or failed) to return. */
static void wait_users(struct weft_comm *c)
{
    while (atomic_load(&c->users) > 0) {
        c->tops->wakeup(c->tctx);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

bool weft_comm_valid(struct weft_comm *c)
{
    return weft_registry_find(&reg, c, NULL);
}

void weft_comm_record_error(struct weft_comm *comm, const char *msg)
{
    pthread_mutex_lock(&comm->err_mu);
    snprintf(comm->last_error, sizeof(comm->last_error), "%s", msg);
    pthread_mutex_unlock(&comm->err_mu);
}

const char *weft_comm_last_error_copy(struct weft_comm *comm, char *buf, size_t len)
{
    if (comm == NULL) {
        snprintf(buf, len, "%s", weft_thread_last_error());
        return buf;
    }
    pthread_mutex_lock(&comm->err_mu);
    snprintf(buf, len, "%s", comm->last_error);
    pthread_mutex_unlock(&comm->err_mu);
    return buf;
}

weft_status_t weft_comm_fail(struct weft_comm *comm, weft_status_t status)
{
    int expected = WEFT_OK;
    if (status < 0)
        atomic_compare_exchange_strong(&comm->error, &expected, (int)status);
    return (weft_status_t)atomic_load(&comm->error);
}

const char *weft_last_error(weft_comm_t comm)
{
    static __thread char buf[WEFT_ERRMSG_LEN];
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_thread_last_error();
    return weft_comm_last_error_copy(comm, buf, sizeof(buf));
}

static void comm_free(struct weft_comm *comm)
{
    if (comm == NULL)
        return;
    weft_engine_destroy(comm->eng);
    if (comm->tops)
        comm->tops->finalize(comm->tctx);
    weft_bootstrap_close(comm->bs);
    free(comm->conns);
    pthread_mutex_destroy(&comm->err_mu);
    free(comm);
}

weft_status_t weft_comm_create(struct weft_comm **out, int nranks, const struct weft_uid *uid,
                               int rank)
{
    weft_status_t st;
    struct rank_info *all = NULL;
    unsigned algos;
    weft_status_t ast = weft_tune_parse_algo(weft_param_str("WEFT_ALGO"), &algos);
    const char *asrc = weft_param_source("WEFT_ALGO");
    if (ast != WEFT_OK && asrc && strcmp(asrc, "WEFT_ALGO") != 0) {
        /* NCCL_ALGO names NCCL's algorithms (Tree, NVLS...): a program
         * written for NCCL must still run, so weft picks for itself. */
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1))
            WEFT_WARN(WEFT_SUB_INIT, "%s=%s: %s; ignoring it", asrc,
                      weft_param_str("WEFT_ALGO"), weft_thread_last_error());
        weft_tune_parse_algo("", &algos);
        ast = WEFT_OK;
    }
    WEFT_CHECK(ast);
    struct weft_comm *comm = calloc(1, sizeof(*comm));
    if (comm == NULL)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot allocate a communicator");
    comm->algos = algos;
    pthread_mutex_init(&comm->err_mu, NULL);
    comm->rank = rank;
    comm->nranks = nranks;
    comm->job = uid->job;
    memcpy(comm->secret, uid->secret, sizeof(comm->secret));
    int64_t tmo = weft_param_int("WEFT_TIMEOUT_MS");
    comm->timeout_ns = (uint64_t)(tmo > 0 ? tmo : 300000) * 1000000ull;
    uint64_t deadline = weft_now_ns() + comm->timeout_ns;
    weft_log_set_rank(rank);

    comm->conns = calloc((size_t)nranks, sizeof(void *));
    all = calloc((size_t)nranks, sizeof(*all));
    if (comm->conns == NULL || all == NULL) {
        st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot allocate tables for %d ranks", nranks);
        goto fail;
    }
    WEFT_CHECK_GOTO(weft_engine_create(comm, &comm->eng), st, fail);

    struct weft_transport_init targs = {
        .comm = comm, .rank = rank, .nranks = nranks, .job = uid->job,
        .secret = comm->secret, .timeout_ns = comm->timeout_ns,
    };
    char ifname[64];
    WEFT_CHECK_GOTO(weft_sock_pick_iface(&uid->root, &targs.local, ifname, sizeof(ifname)), st,
                    fail);
    struct rank_info me = {.pid = (uint32_t)getpid()};
    gethostname(me.host, sizeof(me.host) - 1);
    size_t alen = sizeof(me.taddr);
    comm->tops = &weft_tcp_ops;
    WEFT_CHECK_GOTO(comm->tops->init(&targs, &comm->tctx, me.taddr, &alen), st, fail);
    me.taddr_len = (uint32_t)alen;
    memcpy(comm->taddr, me.taddr, alen);
    comm->taddr_len = alen;
    char buf[96];
    WEFT_INFO(WEFT_SUB_INIT, "rank %d/%d: tcp on %s (%s)", rank, nranks,
              weft_sock_str(&targs.local, buf, sizeof(buf)), ifname);

    WEFT_CHECK_GOTO(weft_bootstrap_init(comm, uid, rank, nranks, &me, sizeof(me), all, deadline,
                                        &comm->bs),
                    st, fail);
    int local = 0;
    for (int r = 0; r < nranks; r++)
        local += strncmp(all[r].host, me.host, sizeof(me.host)) == 0;
    weft_engine_tune(comm->eng, local);
    for (int r = 0; r < nranks; r++) {
        if (r == rank)
            continue;
        if (all[r].taddr_len > WEFT_TRANSPORT_ADDR_MAX) {
            st = weft_error(comm, WEFT_ERR_REMOTE, "rank %d published a bad address", r);
            goto fail;
        }
        WEFT_CHECK_GOTO(comm->tops->connect(comm->tctx, r, all[r].taddr, all[r].taddr_len,
                                            &comm->conns[r]),
                        st, fail);
    }
    if (!weft_registry_add(&reg, comm)) {
        st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot register the communicator");
        goto fail;
    }
    free(all);
    *out = comm;
    WEFT_INFO(WEFT_SUB_INIT, "rank %d/%d: communicator ready", rank, nranks);
    return WEFT_OK;
fail:
    if (comm->last_error[0]) /* keep the reason: the comm it was recorded on goes away */
        weft_error_quiet(NULL, st, "%s", comm->last_error);
    free(all);
    comm_free(comm);
    return st;
}

weft_status_t weft_comm_init(weft_comm_t *out, int nranks, weft_unique_id_t id, int rank)
{
    weft_log_init();
    if (out == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init: comm is NULL");
    *out = NULL;
    if (nranks < 1 || nranks > (1 << 20))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init: nranks %d out of range (1..%d)", nranks, 1 << 20);
    if (rank < 0 || rank >= nranks)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init: rank %d out of range for %d ranks", rank, nranks);
    struct weft_uid uid;
    weft_status_t st = weft_uid_parse(&id, &uid);
    if (st != WEFT_OK)
        return weft_error_quiet(NULL, st, "weft_comm_init: %s", weft_thread_last_error());
    return weft_comm_create(out, nranks, &uid, rank);
}

/* First of the variables that is set; strict decimal. */
static weft_status_t env_int(const char *const *names, const char *what, int *out,
                             const char **used)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v == NULL || *v == '\0')
            continue;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end != '\0' || x < 0 || x > INT_MAX)
            return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "%s=\"%s\" is not a valid %s",
                                    *names, v, what);
        *out = (int)x;
        *used = *names;
        return WEFT_OK;
    }
    return WEFT_INPROGRESS; /* none set */
}

weft_status_t weft_comm_init_env(weft_comm_t *out)
{
    static const char *const rank_vars[] = {"WEFT_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                            "PMI_RANK", "SLURM_PROCID", NULL};
    static const char *const size_vars[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                            "SLURM_NTASKS", "SLURM_NPROCS", NULL};
    weft_log_init();
    if (out == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init_env: comm is NULL");
    *out = NULL;
    int rank = -1, nranks = -1;
    const char *rvar = NULL, *svar = NULL;
    weft_status_t st = env_int(rank_vars, "rank", &rank, &rvar);
    if (st < 0)
        return st;
    if (st == WEFT_INPROGRESS)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: no rank in the environment (WEFT_RANK, "
                                "OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID)");
    st = env_int(size_vars, "rank count", &nranks, &svar);
    if (st < 0)
        return st;
    if (st == WEFT_INPROGRESS)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: no rank count in the environment (WEFT_NRANKS, "
                                "OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS)");
    if (nranks < 1 || rank >= nranks)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: %s=%d is out of range for %s=%d", rvar, rank,
                                svar, nranks);

    weft_log_set_rank(rank);
    weft_unique_id_t id;
    struct weft_uid uid;
    const char *hex = getenv("WEFT_UNIQUE_ID");
    const char *root = weft_param_str("WEFT_ROOT");
    if (hex && *hex) {
        WEFT_CHECK(weft_uid_from_hex(hex, &id));
        WEFT_CHECK(weft_uid_parse(&id, &uid));
    } else if (*root) {
        WEFT_CHECK(weft_uid_from_root(root, &uid));
    } else {
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: no rendezvous in the environment: set "
                                "WEFT_UNIQUE_ID (weftrun does) or WEFT_ROOT=host:port");
    }
    return weft_comm_create(out, nranks, &uid, rank);
}

weft_status_t weft_comm_destroy(weft_comm_t comm)
{
    if (comm == NULL)
        return WEFT_OK;
    if (!weft_registry_remove(&reg, comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_destroy: not a live communicator (destroyed twice?)");
    weft_status_t st = weft_engine_drain(comm);
    wait_users(comm);
    comm_free(comm);
    return st;
}

weft_status_t weft_comm_abort(weft_comm_t comm)
{
    if (comm == NULL)
        return WEFT_OK;
    if (!weft_registry_remove(&reg, comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_abort: not a live communicator");
    weft_error_quiet(comm, WEFT_ERR_ABORTED, "rank %d: communicator aborted", comm->rank);
    weft_engine_abort(comm, WEFT_ERR_ABORTED);
    wait_users(comm);
    comm_free(comm);
    return WEFT_OK;
}

weft_status_t weft_comm_rank(weft_comm_t comm, int *rank)
{
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_rank: invalid communicator");
    if (rank == NULL)
        return weft_error_quiet(comm, WEFT_ERR_INVALID_ARG, "weft_comm_rank: rank is NULL");
    *rank = comm->rank;
    return WEFT_OK;
}

weft_status_t weft_comm_size(weft_comm_t comm, int *nranks)
{
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_size: invalid communicator");
    if (nranks == NULL)
        return weft_error_quiet(comm, WEFT_ERR_INVALID_ARG, "weft_comm_size: nranks is NULL");
    *nranks = comm->nranks;
    return WEFT_OK;
}

weft_status_t weft_comm_get_error(weft_comm_t comm)
{
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_get_error: invalid communicator");
    return (weft_status_t)atomic_load(&comm->error);
}
