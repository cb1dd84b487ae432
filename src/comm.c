/*
 * comm.c - communicator lifecycle: init from an id (the environment's
 * part is launch.c, the links' links.c), the registry of live
 * communicators, destroy and abort, and the sticky error record.
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm_impl.h"
#include "engine.h"
#include "devbuf.h"
#include "ll.h"
#include "plan.h"
#include "select/topo.h"
#include "select/tune.h"

weft_status_t weft_comm_progress(struct weft_comm *comm, int timeout_ms)
{
    int last = comm->ntp - 1;
    const struct weft_transport_ops *sleeper = comm->tp[last].ops;
    void *sctx = comm->tp[last].ctx;
    if (last == 0)
        return sleeper->progress(sctx, timeout_ms);
    /* The others without waiting, then sleep in the last one (the base
     * transport: tcp's poll).
     * Their waker threads turn a shm doorbell or a verbs completion into
     * its wakeup while their notification is armed. */
    for (int i = 0; i < last; i++)
        WEFT_CHECK(comm->tp[i].ops->progress(comm->tp[i].ctx, 0));
    if (timeout_ms <= 0)
        return sleeper->progress(sctx, 0);
    int begun = 0;
    bool news = false;
    while (begun < last && !news) {
        news = comm->tp[begun].ops->sleep_begin(comm->tp[begun].ctx);
        begun++;
    }
    weft_status_t st = sleeper->progress(sctx, news ? 0 : timeout_ms);
    for (int i = 0; i < begun; i++)
        comm->tp[i].ops->sleep_end(comm->tp[i].ctx);
    return st;
}

void weft_comm_wakeup(struct weft_comm *comm)
{
    for (int i = 0; i < comm->ntp; i++)
        comm->tp[i].ops->wakeup(comm->tp[i].ctx);
}

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
        weft_comm_wakeup(c);
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

bool weft_comm_valid(struct weft_comm *c)
{
    return weft_registry_find(&reg, c, NULL);
}

const char *weft_comm_last_error_copy(struct weft_comm *comm, char *buf, size_t len)
{
    if (comm == NULL) {
        snprintf(buf, len, "%s", weft_thread_last_error());
        return buf;
    }
    return weft_errsink_read(&comm->err, buf, len);
}

weft_status_t weft_comm_fail(struct weft_comm *comm, weft_status_t status)
{
    int expected = WEFT_OK;
    if (status < 0)
        atomic_compare_exchange_strong(&comm->error, &expected, (int)status);
    return (weft_status_t)atomic_load(&comm->error);
}

void weft_comm_tell_peers(struct weft_comm *comm)
{
    if (atomic_exchange(&comm->told_peers, 1))
        return;
    char msg[WEFT_ERRMSG_LEN], why[WEFT_ERRMSG_LEN + 32];
    weft_comm_last_error_copy(comm, msg, sizeof(msg));
    snprintf(why, sizeof(why), "rank %d failed: %s", comm->rank,
             *msg ? msg : weft_status_string(atomic_load(&comm->error)));
    for (int i = 0; i < comm->ntp; i++)
        if (comm->tp[i].ops->abort)
            comm->tp[i].ops->abort(comm->tp[i].ctx, WEFT_ERR_REMOTE, why);
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
    free(comm->cpu_group);
    free(comm->group_cores);
    weft_dev_destroy(comm);
    weft_ll_free(comm);
    weft_engine_destroy(comm->eng);
    weft_tune_cache_free(&comm->tune);
    weft_memreg_free_all(comm);
    for (int i = 0; i < comm->ntp; i++)
        comm->tp[i].ops->finalize(comm->tp[i].ctx);
    weft_bootstrap_close(comm->bs);
    if (comm->rescue_fd >= 0)
        close(comm->rescue_fd);
    free(comm->rescue);
    free(comm->conns);
    free(comm->link_ops);
    free(comm->link_kind);
    weft_topo_table_fini(&comm->topo);
    weft_errsink_destroy(&comm->err);
    pthread_mutex_destroy(&comm->regs_mu);
    free(comm);
}

weft_status_t weft_comm_create(struct weft_comm **out, int nranks, const struct weft_uid *uid,
                               int rank)
{
    weft_status_t st;
    struct weft_rank_info *all = NULL;
    unsigned algos[WEFT_COLL_COUNT];
    weft_status_t ast = weft_tune_parse_algo(weft_param_str("WEFT_ALGO"), algos);
    const char *asrc = weft_param_source("WEFT_ALGO");
    if (ast != WEFT_OK && asrc && strcmp(asrc, "WEFT_ALGO") != 0) {
        /* NCCL_ALGO may name algorithms only NCCL has (NVLS, CollNet...;
         * Ring and Tree are weft's too): a program written for NCCL must
         * still run, so weft picks for itself. */
        static _Atomic int warned;
        if (!atomic_exchange(&warned, 1))
            WEFT_WARN(WEFT_SUB_INIT, "%s=%s: %s; ignoring it", asrc,
                      weft_param_str("WEFT_ALGO"), weft_thread_last_error());
        weft_tune_parse_algo("", algos);
        ast = WEFT_OK;
    }
    WEFT_CHECK(ast);
    struct weft_comm *comm = calloc(1, sizeof(*comm));
    if (comm == NULL)
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot allocate a communicator");
    memcpy(comm->algos, algos, sizeof(algos));
    atomic_init(&comm->deterministic, weft_param_int("WEFT_DETERMINISTIC") != 0);
    comm->rescue_fd = -1;
    atomic_init(&comm->cuda_on, -1);
    weft_errsink_init(&comm->err);
    pthread_mutex_init(&comm->regs_mu, NULL);
    comm->rank = rank;
    comm->nranks = nranks;
    comm->job = uid->job;
    memcpy(comm->secret, uid->secret, sizeof(comm->secret));
    int64_t tmo = weft_param_int("WEFT_TIMEOUT_MS");
    comm->timeout_ns = (uint64_t)(tmo > 0 ? tmo : 300000) * 1000000ull;
    uint64_t deadline = weft_now_ns() + comm->timeout_ns;
    weft_log_set_rank(rank);

    comm->conns = calloc((size_t)nranks, sizeof(void *));
    comm->rescue = calloc((size_t)nranks, sizeof(*comm->rescue));
    comm->link_ops = calloc((size_t)nranks, sizeof(*comm->link_ops));
    comm->link_kind = calloc((size_t)nranks, sizeof(*comm->link_kind));
    all = calloc((size_t)nranks, sizeof(*all));
    if (comm->conns == NULL || comm->link_ops == NULL || comm->link_kind == NULL ||
        comm->rescue == NULL || all == NULL) {
        st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot allocate tables for %d ranks", nranks);
        goto fail;
    }
    WEFT_CHECK_GOTO(weft_engine_create(comm, &comm->eng), st, fail);

    struct weft_transport_init targs = {
        .err = &comm->err, .rank = rank, .nranks = nranks, .job = uid->job,
        .secret = comm->secret, .timeout_ns = comm->timeout_ns,
    };
    char ifname[64];
    WEFT_CHECK_GOTO(weft_sock_pick_iface(&uid->root, &targs.local, ifname, sizeof(ifname)), st,
                    fail);
    struct weft_rank_info me = {.pid = (uint32_t)getpid()};
    cpu_set_t cpus;
    me.cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? (uint32_t)CPU_COUNT(&cpus) : 1;
    weft_host_identity(me.host, sizeof(me.host), false);
    weft_host_identity(me.machine, sizeof(me.machine), true);
    me.check = weft_param_int("WEFT_CHECK") != 0;
    /* The base transport (tcp) opens before the rendezvous: its address
     * goes out with our record. */
    const struct weft_transport_desc *base = weft_transports[weft_transport_base()];
    size_t alen = sizeof(me.taddr);
    void *base_ctx = NULL;
    WEFT_CHECK_GOTO(base->ops->init(&targs, &base_ctx, me.taddr, &alen), st, fail);
    me.taddr_len = (uint32_t)alen;
    memcpy(comm->taddr, me.taddr, alen);
    comm->taddr_len = alen;
    /* Shrink's listener: on the base transport's address, port chosen by
     * the kernel. */
    memcpy(&me.rescue, me.taddr, WEFT_MIN(alen, sizeof(me.rescue)));
    me.rescue.in.sin_port = 0; /* same offset in both families */
    st = weft_sock_listen(&me.rescue, &comm->rescue_fd);
    if (st != WEFT_OK) {
        base->ops->finalize(base_ctx);
        goto fail;
    }
    char buf[96];
    WEFT_INFO(WEFT_SUB_INIT, "rank %d/%d: %s on %s (%s)", rank, nranks, base->name,
              weft_sock_str(&targs.local, buf, sizeof(buf)), ifname);

    st = weft_bootstrap_init(comm, uid, rank, nranks, &me, sizeof(me), all, deadline, &comm->bs);
    if (st != WEFT_OK) {
        base->ops->finalize(base_ctx);
        goto fail;
    }
    int local = 0, below = 0; /* ranks on our cores (spin policy), those of lower rank */
    for (int r = 0; r < nranks; r++) {
        all[r].host[sizeof(all[r].host) - 1] = '\0'; /* peers' bytes: terminate */
        all[r].machine[sizeof(all[r].machine) - 1] = '\0';
        comm->rescue[r] = all[r].rescue; /* checked when used */
        bool here = strcmp(all[r].machine, me.machine) == 0;
        local += here;
        below += here && r < rank;
        if (all[r].check != all[0].check) {
            /* A rank without fingerprints would read them as data. */
            st = weft_error(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                            "rank %d: WEFT_CHECK differs between ranks (rank 0: %u, rank %d: %u); "
                            "set it the same on every rank",
                            rank, all[0].check, r, all[r].check);
            base->ops->finalize(base_ctx);
            goto fail;
        }
    }
    st = weft_cpu_groups(comm, all);
    if (st != WEFT_OK) {
        base->ops->finalize(base_ctx);
        goto fail;
    }
    if (weft_param_int("WEFT_BIND"))
        weft_cpu_bind(rank, below, local);
    weft_engine_tune(comm->eng, local);
    WEFT_CHECK_GOTO(weft_links_open(comm, &targs, base_ctx, all, deadline), st, fail);
    struct weft_cal cal = {0};
    unsigned allowed;
    st = weft_comm_calibrate(comm, &cal, deadline);
    if (st == WEFT_OK && cal.nedges > 0)
        st = weft_links_table(comm, all, &cal, &allowed);
    weft_cal_free(&cal);
    if (st == WEFT_OK)
        st = weft_tune_file_share(comm, deadline);
    if (st != WEFT_OK)
        goto fail;
    weft_ll_setup(comm);
    if (!weft_registry_add(&reg, comm)) {
        st = weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot register the communicator");
        goto fail;
    }
    free(all);
    *out = comm;
    WEFT_INFO(WEFT_SUB_INIT, "rank %d/%d: communicator ready", rank, nranks);
    return WEFT_OK;
fail:
    if (comm->err.msg[0]) /* keep the reason: the comm it was recorded on goes away */
        weft_error_quiet(NULL, st, "%s", comm->err.msg);
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

weft_status_t weft_comm_destroy(weft_comm_t comm)
{
    if (comm == NULL)
        return WEFT_OK;
    if (!weft_registry_remove(&reg, comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_destroy: not a live communicator (destroyed twice?)");
    weft_status_t st = weft_dev_drain(comm);
    weft_status_t est = weft_engine_drain(comm);
    wait_users(comm);
    comm_free(comm);
    return st != WEFT_OK ? st : est;
}

weft_status_t weft_comm_abort(weft_comm_t comm)
{
    if (comm == NULL)
        return WEFT_OK;
    if (!weft_registry_remove(&reg, comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_abort: not a live communicator");
    weft_error_quiet(weft_comm_err(comm), WEFT_ERR_ABORTED, "rank %d: communicator aborted", comm->rank);
    weft_dev_abort(comm);
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
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "weft_comm_rank: rank is NULL");
    *rank = comm->rank;
    return WEFT_OK;
}

weft_status_t weft_comm_size(weft_comm_t comm, int *nranks)
{
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_size: invalid communicator");
    if (nranks == NULL)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "weft_comm_size: nranks is NULL");
    *nranks = comm->nranks;
    return WEFT_OK;
}

weft_status_t weft_comm_set_deterministic(weft_comm_t comm, int on)
{
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_set_deterministic: invalid communicator");
    if (on != 0 && on != 1)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                                "weft_comm_set_deterministic: on is %d, not 0 or 1", on);
    atomic_store(&comm->deterministic, on);
    return WEFT_OK;
}

weft_status_t weft_comm_get_error(weft_comm_t comm)
{
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_get_error: invalid communicator");
    return (weft_status_t)atomic_load(&comm->error);
}
