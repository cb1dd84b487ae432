/*
 * comm.c - communicator lifecycle: init from an id or from the environment
 * (weftrun, torchrun-style WEFT_ROOT, Open MPI, PMI, Slurm), the registry
 * of live communicators, destroy and abort, and the sticky error record.
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"
#include "engine.h"
#include "select/topo.h"
#include "select/tune.h"
#include "transports/transport.h"

/* What every rank publishes at init: where it runs and its tcp address
 * (shm addresses follow in a second round, once ranks know who is local). */
struct rank_info {
    char host[64];       /* WEFT_HOSTID, or hostname + boot id */
    char machine[64];    /* hostname + boot id: who shares our cores */
    uint32_t check;      /* WEFT_CHECK: every rank must agree */
    union weft_sockaddr rescue; /* shrink's rendezvous listener */
    uint32_t pid;
    uint32_t cores;      /* CPUs this rank may run on (selection's model) */
    uint32_t taddr_len;
    uint8_t taddr[WEFT_TRANSPORT_ADDR_MAX];
};

/* The second round: the shm and verbs addresses (len 0: none on that rank). */
struct link_info {
    uint32_t shm_len, verbs_len;
    uint8_t shm[WEFT_TRANSPORT_ADDR_MAX];
    uint8_t verbs[WEFT_TRANSPORT_ADDR_MAX];
};

enum { TP_TCP, TP_SHM, TP_VERBS, TP_COUNT };

#define REG_MAGIC 0x4d474552u /* "REGM" */

/* What weft_mem_register hands out: per transport of comm, its handle. */
struct weft_reg {
    uint32_t magic;
    struct weft_reg *next;      /* comm->regs, under regs_mu */
    struct weft_comm *comm;
    void *buf;
    size_t bytes;
    void *mh[WEFT_MAX_TRANSPORTS];
};


/* This host's identity: ranks with equal ones share memory.  WEFT_HOSTID
 * lets one machine pose as several hosts, unless `machine` asks for the
 * real one (ranks that share the cores, whatever they pose as). */
static void host_identity(char *out, size_t len, bool machine)
{
    /* Read at every init, not once per process: a process may make
     * communicators as different "hosts" (tests do). */
    const char *forced = machine ? NULL : getenv("WEFT_HOSTID");
    if (forced && *forced) {
        snprintf(out, len, "%s", forced);
        return;
    }
    char host[64] = "", boot[40] = "";
    gethostname(host, sizeof(host) - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(out, len, "%.26s/%.36s", host, boot);
}

weft_status_t weft_comm_progress(struct weft_comm *comm, int timeout_ms)
{
    int last = comm->ntp - 1;
    const struct weft_transport_ops *sleeper = comm->tp[last].ops;
    void *sctx = comm->tp[last].ctx;
    if (last == 0)
        return sleeper->progress(sctx, timeout_ms);
    /* The others without waiting, then sleep in the last one (tcp's poll).
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

static const struct rank_info *sort_all; /* cmp_machine's table (under sort_mu) */
static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

static int cmp_machine(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    int c = strcmp(sort_all[x].machine, sort_all[y].machine);
    return c ? c : (x > y) - (x < y);
}

/* Which ranks share a machine's cores, and how many cores it has (the
 * fewest any of its ranks may use): selection's model needs them, and all
 * ranks compute the same from the same table. */
static weft_status_t cpu_groups(struct weft_comm *comm, const struct rank_info *all)
{
    int n = comm->nranks;
    int *order = malloc((size_t)n * sizeof(int));
    comm->cpu_group = malloc((size_t)n * sizeof(int));
    comm->group_cores = malloc((size_t)n * sizeof(int));
    if (!order || !comm->cpu_group || !comm->group_cores) {
        free(order);
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot allocate core groups for %d ranks", n);
    }
    for (int r = 0; r < n; r++)
        order[r] = r;
    pthread_mutex_lock(&sort_mu);
    sort_all = all;
    qsort(order, (size_t)n, sizeof(int), cmp_machine);
    pthread_mutex_unlock(&sort_mu);
    int g = -1;
    for (int k = 0; k < n; k++) {
        int r = order[k];
        int cores = all[r].cores >= 1 && all[r].cores <= (1u << 20) ? (int)all[r].cores : 1;
        if (k == 0 || strcmp(all[r].machine, all[order[k - 1]].machine) != 0)
            comm->group_cores[++g] = cores;
        comm->cpu_group[r] = g;
        comm->group_cores[g] = WEFT_MIN(comm->group_cores[g], cores);
    }
    free(order);
    return WEFT_OK;
}

static void comm_free(struct weft_comm *comm)
{
    if (comm == NULL)
        return;
    free(comm->cpu_group);
    free(comm->group_cores);
    weft_engine_destroy(comm->eng);
    weft_tune_cache_free(&comm->tune);
    while (comm->regs) { /* the transports below release what they hold */
        struct weft_reg *r = comm->regs;
        comm->regs = r->next;
        free(r);
    }
    for (int i = 0; i < comm->ntp; i++)
        comm->tp[i].ops->finalize(comm->tp[i].ctx);
    weft_bootstrap_close(comm->bs);
    if (comm->rescue_fd >= 0)
        close(comm->rescue_fd);
    free(comm->rescue);
    free(comm->conns);
    free(comm->link_ops);
    weft_topo_table_fini(&comm->topo);
    weft_errsink_destroy(&comm->err);
    pthread_mutex_destroy(&comm->regs_mu);
    free(comm);
}

/* Builds the link table: hosts from the init exchange, WEFT_TRANSPORT,
 * the calibration (when cal has any: it beats only the defaults), then
 * WEFT_TOPO_FILE, the operator's last word.  On error it says why. */
static weft_status_t table_build(struct weft_comm *comm, const struct rank_info *all,
                                 const struct weft_cal *cal, unsigned *allowed)
{
    int n = comm->nranks;
    const char *spec = weft_param_str("WEFT_TRANSPORT"), *file = weft_param_str("WEFT_TOPO_FILE");
    char why[256];
    weft_topo_table_fini(&comm->topo);
    const char **hostid = calloc((size_t)n, sizeof(*hostid));
    weft_status_t st = hostid ? weft_topo_parse_transports(spec, allowed, why, sizeof(why))
                              : WEFT_ERR_NO_MEMORY;
    if (comm->verbs_off)
        *allowed &= ~(1u << WEFT_LINK_VERBS);
    for (int r = 0; hostid && r < n; r++)
        hostid[r] = all[r].host;
    if (st == WEFT_OK)
        st = weft_topo_table_init(&comm->topo, n, hostid, *allowed, why, sizeof(why));
    free(hostid);
    for (int t = 0; st == WEFT_OK && cal && t < WEFT_LINK_NTRANSPORTS; t++)
        if (cal->have[t])
            st = weft_topo_table_set_default(&comm->topo, t, cal->alpha[t], cal->beta[t]);
    for (int k = 0; st == WEFT_OK && cal && k < cal->nedges; k++) {
        const struct weft_cal_edge *e = &cal->edges[k];
        struct weft_link l;
        /* Only where the table agrees on the transport measured (a pair
         * the table puts on shm runs tcp when shm could not open). */
        if (weft_topo_table_get(&comm->topo, e->i, e->j, &l) == WEFT_OK &&
            l.transport == e->transport)
            st = weft_topo_table_set_measured(&comm->topo, e->i, e->j, e->alpha, e->beta);
    }
    if (st == WEFT_OK && *file)
        st = weft_topo_table_load(&comm->topo, file, why, sizeof(why));
    if (st != WEFT_OK)
        return weft_error(weft_comm_err(comm), st, "rank %d: %s", comm->rank,
                          st == WEFT_ERR_NO_MEMORY ? "out of memory" : why);
    return WEFT_OK;
}

static const struct weft_transport_ops *tp_ops(int t)
{
#ifdef HAVE_VERBS
    if (t == TP_VERBS)
        return &weft_verbs_ops;
#endif
    return t == TP_SHM ? &weft_shm_ops : &weft_tcp_ops;
}

/* Opens shm when a peer shares this host and verbs when a pair wants it
 * (both as WEFT_TRANSPORT allows), picks a transport per peer from the
 * link table and binds every peer.  tcp_ctx is already open; transports
 * no peer uses are closed again.  verbs is all or nothing: when a rank
 * has no usable device, every rank leaves it for tcp (or fails, when
 * WEFT_TRANSPORT leaves no other way). */
static weft_status_t open_links(struct weft_comm *comm, const struct weft_transport_init *targs,
                                void *tcp_ctx, const struct rank_info *all, uint64_t deadline)
{
    int rank = comm->rank, n = comm->nranks;
    if (n < 1) { /* checked by every caller; said here for the allocations below */
        weft_tcp_ops.finalize(tcp_ctx);
        return weft_error(weft_comm_err(comm), WEFT_ERR_INTERNAL, "open_links: %d ranks", n);
    }
    const char *spec = weft_param_str("WEFT_TRANSPORT");
    unsigned allowed;
    weft_status_t st = table_build(comm, all, NULL, &allowed);
    if (st != WEFT_OK) {
        weft_tcp_ops.finalize(tcp_ctx);
        return st;
    }
    /* The table says which transport each pair wants (shm on one host,
     * verbs across hosts, unless WEFT_TRANSPORT or the topology file says
     * otherwise). */
    bool want[WEFT_LINK_NTRANSPORTS] = {false};
    for (int r = 0; r < n; r++) {
        struct weft_link l;
        if (r != rank && weft_topo_table_get(&comm->topo, rank, r, &l) == WEFT_OK)
            want[l.transport] = true;
    }
    struct link_info mine = {0};
    struct link_info *peers = calloc((size_t)n, sizeof(*peers));
    void *ctx[TP_COUNT] = {tcp_ctx, NULL, NULL};
    if (peers == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "out of memory for %d ranks", n);
        goto out; /* the others time out in the exchange and name this rank */
    }
    if (want[WEFT_LINK_SHM]) {
        /* Rings only for the ranks of this host (all of them agree on it). */
        struct weft_transport_init sargs = *targs;
        int *group = malloc((size_t)n * sizeof(*group)), ngroup = 0;
        for (int r = 0; group && r < n; r++)
            if (strcmp(all[r].host, all[rank].host) == 0)
                group[ngroup++] = r;
        sargs.group = group;
        sargs.ngroup = ngroup;
        size_t len = sizeof(mine.shm);
        st = group ? weft_shm_ops.init(&sargs, &ctx[TP_SHM], mine.shm, &len)
                   : weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "out of memory for %d ranks", n);
        free(group);
        if (st == WEFT_OK)
            mine.shm_len = (uint32_t)len;
        else if (allowed & (1u << WEFT_LINK_TCP))
            WEFT_WARN(WEFT_SUB_INIT, "no shared memory (%s); peers on this host use tcp",
                      weft_thread_last_error());
        st = WEFT_OK; /* publishing len 0 tells the local peers */
    }
#ifdef HAVE_VERBS
    if (want[WEFT_LINK_VERBS]) {
        struct weft_transport_init vargs = *targs;
        vargs.oob_ops = &weft_tcp_ops;
        vargs.oob_ctx = tcp_ctx;
        size_t len = sizeof(mine.verbs);
        st = weft_verbs_ops.init(&vargs, &ctx[TP_VERBS], mine.verbs, &len);
        if (st == WEFT_OK)
            mine.verbs_len = (uint32_t)len;
        else if (st != WEFT_ERR_UNSUPPORTED)
            WEFT_WARN(WEFT_SUB_INIT, "rank %d: verbs: %s", rank, weft_thread_last_error());
        st = WEFT_OK; /* len 0: every rank leaves verbs */
    }
#endif
    /* Every rank takes part, whatever it opened, so the rounds match. */
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bs, &mine, peers, sizeof(mine), deadline), st,
                    out);
    int no_verbs = -1;
    for (int r = 0; r < n && no_verbs < 0; r++)
        if (peers[r].verbs_len == 0)
            no_verbs = r;
    if ((allowed & (1u << WEFT_LINK_VERBS)) && no_verbs >= 0) {
        /* The same on every rank: all saw the same lengths. */
        comm->verbs_off = true;
        if (ctx[TP_VERBS]) {
            tp_ops(TP_VERBS)->finalize(ctx[TP_VERBS]);
            ctx[TP_VERBS] = NULL;
        }
        if ((allowed & ~(1u << WEFT_LINK_VERBS)) == 0) {
            st = weft_error(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                            "rank %d: WEFT_TRANSPORT=%s allows only verbs, and rank %d has no "
                            "usable RDMA device%s",
                            rank, spec, no_verbs,
                            no_verbs == rank ? "" : " (its log at WEFT_DEBUG=INFO says why)");
            goto out;
        }
        if (want[WEFT_LINK_VERBS] && rank == 0)
            WEFT_INFO(WEFT_SUB_INIT, "rank %d has no usable RDMA device: tcp carries what verbs "
                      "would have", no_verbs);
        WEFT_CHECK_GOTO(table_build(comm, all, NULL, &allowed), st, out);
    }
    bool used[TP_COUNT] = {false}, any_shm = false;
    for (int r = 0; r < n; r++) {
        any_shm |= peers[r].shm_len > 0;
        if (r == rank)
            continue;
        bool same = strcmp(all[r].host, all[rank].host) == 0;
        struct weft_link l = {0};
        weft_topo_table_get(&comm->topo, rank, r, &l);
        int t = l.transport == WEFT_LINK_SHM && mine.shm_len && peers[r].shm_len ? TP_SHM
                : l.transport == WEFT_LINK_VERBS && ctx[TP_VERBS]                ? TP_VERBS
                : (allowed & (1u << WEFT_LINK_TCP))                              ? TP_TCP
                                                                                 : -1;
        if (t < 0) {
            st = weft_error(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                            "rank %d cannot reach rank %d: WEFT_TRANSPORT=%s does not allow tcp, "
                            "and rank %d is %s",
                            rank, r, spec, r,
                            same ? "on this host but has no shared memory" : "on another host");
            goto out;
        }
        const void *addr = t == TP_SHM ? peers[r].shm : t == TP_VERBS ? peers[r].verbs : all[r].taddr;
        size_t alen = t == TP_SHM     ? peers[r].shm_len
                      : t == TP_VERBS ? peers[r].verbs_len
                                      : all[r].taddr_len;
        if (alen > WEFT_TRANSPORT_ADDR_MAX) {
            st = weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE, "rank %d published a bad address", r);
            goto out;
        }
#ifdef HAVE_VERBS
        if (t == TP_VERBS) {
            /* Its tcp connection carries the queue pair exchange. */
            void *oob;
            WEFT_CHECK_GOTO(weft_tcp_ops.connect(tcp_ctx, r, all[r].taddr, all[r].taddr_len, &oob),
                            st, out);
            weft_verbs_bind_oob(ctx[TP_VERBS], r, oob);
            used[TP_TCP] = true;
        }
#endif
        comm->link_ops[r] = tp_ops(t);
        used[t] = true;
        WEFT_CHECK_GOTO(tp_ops(t)->connect(ctx[t], r, addr, alen, &comm->conns[r]), st, out);
    }
    /* Progress order: shm, verbs, then tcp, where the communicator sleeps. */
    static const int order[TP_COUNT] = {TP_SHM, TP_VERBS, TP_TCP};
    for (int k = 0; k < TP_COUNT; k++) {
        int t = order[k];
        if (!ctx[t])
            continue;
        if (used[t] || (t == TP_TCP && (n == 1 || comm->ntp > 0))) {
            comm->tp[comm->ntp].ops = tp_ops(t);
            comm->tp[comm->ntp++].ctx = ctx[t];
        } else {
            tp_ops(t)->finalize(ctx[t]);
        }
        ctx[t] = NULL;
    }
    for (int i = 0; i + 1 < comm->ntp; i++)
        WEFT_CHECK_GOTO(comm->tp[i].ops->set_waker(comm->tp[i].ctx,
                                                   comm->tp[comm->ntp - 1].ops->wakeup,
                                                   comm->tp[comm->ntp - 1].ctx),
                        st, out);
    if (any_shm) {
        /* Every peer has mapped our segment: its name can go, so a crash
         * from now on leaves nothing in /dev/shm. */
        WEFT_CHECK_GOTO(weft_bootstrap_barrier(comm->bs, deadline), st, out);
        for (int i = 0; i < comm->ntp; i++)
            if (comm->tp[i].ops->ready)
                WEFT_CHECK_GOTO(comm->tp[i].ops->ready(comm->tp[i].ctx), st, out);
    }
    WEFT_INFO(WEFT_SUB_INIT, "rank %d: %s%s%s%s%s", rank,
              used[TP_SHM] ? "shm to this host's ranks" : "",
              used[TP_SHM] && used[TP_VERBS] ? ", " : "", used[TP_VERBS] ? "verbs to " : "",
              used[TP_VERBS] ? (used[TP_SHM] ? "the others" : "every peer") : "",
              used[TP_TCP] && !used[TP_VERBS] ? (used[TP_SHM] ? ", tcp to the others" : "tcp to every peer") : "");
out:
    for (int t = 0; t < TP_COUNT; t++)
        if (ctx[t])
            tp_ops(t)->finalize(ctx[t]);
    free(peers);
    return st;
}

/* WEFT_BIND=1: the k-th rank of this machine runs on the k-th CPU it may
 * use (threads made later inherit it).  A failure is logged, not fatal. */
static void bind_cpu(int rank, int k, int local)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return;
    int n = CPU_COUNT(&allowed), want = k % n, cpu = -1;
    for (int c = 0, seen = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, &allowed) && seen++ == want)
            cpu = c;
    if (local > n)
        WEFT_WARN(WEFT_SUB_INIT, "rank %d: WEFT_BIND: %d ranks on this machine share %d CPUs",
                  rank, local, n);
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0)
        WEFT_WARN(WEFT_SUB_INIT, "rank %d: WEFT_BIND: cannot pin to CPU %d: %s", rank, cpu,
                  strerror(errno));
    else
        WEFT_INFO(WEFT_SUB_INIT, "rank %d: pinned to CPU %d (local rank %d of %d)", rank, cpu, k,
                  local);
}

weft_status_t weft_comm_create(struct weft_comm **out, int nranks, const struct weft_uid *uid,
                               int rank)
{
    weft_status_t st;
    struct rank_info *all = NULL;
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
    all = calloc((size_t)nranks, sizeof(*all));
    if (comm->conns == NULL || comm->link_ops == NULL || comm->rescue == NULL || all == NULL) {
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
    struct rank_info me = {.pid = (uint32_t)getpid()};
    cpu_set_t cpus;
    me.cores = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 ? (uint32_t)CPU_COUNT(&cpus) : 1;
    host_identity(me.host, sizeof(me.host), false);
    host_identity(me.machine, sizeof(me.machine), true);
    me.check = weft_param_int("WEFT_CHECK") != 0;
    size_t alen = sizeof(me.taddr);
    void *tcp_ctx = NULL;
    WEFT_CHECK_GOTO(weft_tcp_ops.init(&targs, &tcp_ctx, me.taddr, &alen), st, fail);
    me.taddr_len = (uint32_t)alen;
    memcpy(comm->taddr, me.taddr, alen);
    comm->taddr_len = alen;
    /* Shrink's listener: on the tcp address, port chosen by the kernel. */
    memcpy(&me.rescue, me.taddr, WEFT_MIN(alen, sizeof(me.rescue)));
    me.rescue.in.sin_port = 0; /* same offset in both families */
    st = weft_sock_listen(&me.rescue, &comm->rescue_fd);
    if (st != WEFT_OK) {
        weft_tcp_ops.finalize(tcp_ctx);
        goto fail;
    }
    char buf[96];
    WEFT_INFO(WEFT_SUB_INIT, "rank %d/%d: tcp on %s (%s)", rank, nranks,
              weft_sock_str(&targs.local, buf, sizeof(buf)), ifname);

    st = weft_bootstrap_init(comm, uid, rank, nranks, &me, sizeof(me), all, deadline, &comm->bs);
    if (st != WEFT_OK) {
        weft_tcp_ops.finalize(tcp_ctx);
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
            weft_tcp_ops.finalize(tcp_ctx);
            goto fail;
        }
    }
    st = cpu_groups(comm, all);
    if (st != WEFT_OK) {
        weft_tcp_ops.finalize(tcp_ctx);
        goto fail;
    }
    if (weft_param_int("WEFT_BIND"))
        bind_cpu(rank, below, local);
    weft_engine_tune(comm->eng, local);
    WEFT_CHECK_GOTO(open_links(comm, &targs, tcp_ctx, all, deadline), st, fail);
    struct weft_cal cal = {0};
    unsigned allowed;
    st = weft_comm_calibrate(comm, &cal, deadline);
    if (st == WEFT_OK && cal.nedges > 0)
        st = table_build(comm, all, &cal, &allowed);
    weft_cal_free(&cal);
    if (st != WEFT_OK)
        goto fail;
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
    weft_error_quiet(weft_comm_err(comm), WEFT_ERR_ABORTED, "rank %d: communicator aborted", comm->rank);
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

/* ---- memory registration --------------------------------------------------------- */

struct reg_call {
    struct weft_comm *comm;
    struct weft_reg *r;
    bool undo;
};

/* As the driver: every transport that registers memory. */
static weft_status_t reg_apply(void *arg)
{
    struct reg_call *rc = arg;
    struct weft_comm *comm = rc->comm;
    weft_status_t st = WEFT_OK;
    for (int i = 0; i < comm->ntp; i++) {
        const struct weft_transport_ops *t = comm->tp[i].ops;
        if (t->reg_mem == NULL)
            continue;
        if (rc->undo) {
            weft_status_t s2 = rc->r->mh[i] ? t->dereg_mem(comm->tp[i].ctx, rc->r->mh[i]) : WEFT_OK;
            if (st == WEFT_OK)
                st = s2;
            rc->r->mh[i] = NULL;
        } else if (rc->r->bytes > 0) {
            st = t->reg_mem(comm->tp[i].ctx, rc->r->buf, rc->r->bytes, &rc->r->mh[i]);
            if (st != WEFT_OK)
                break;
        }
    }
    return st;
}

weft_status_t weft_mem_register(weft_comm_t comm, void *buf, size_t bytes, void **handle)
{
    if (comm == NULL || handle == NULL || (buf == NULL && bytes > 0))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_mem_register: comm %p, buf %p, handle %p", (void *)comm, buf,
                                (void *)handle);
    *handle = NULL;
    if (!weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_mem_register: invalid communicator");
    struct weft_reg *r = calloc(1, sizeof(*r));
    weft_status_t st;
    if (r == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "weft_mem_register: out of memory");
    } else {
        *r = (struct weft_reg){.magic = REG_MAGIC, .comm = comm, .buf = buf, .bytes = bytes};
        struct reg_call rc = {comm, r, false};
        st = weft_engine_exclusive(comm, reg_apply, &rc);
        if (st != WEFT_OK) {
            rc.undo = true;
            weft_engine_exclusive(comm, reg_apply, &rc);
            free(r);
        } else {
            pthread_mutex_lock(&comm->regs_mu);
            r->next = comm->regs;
            comm->regs = r;
            pthread_mutex_unlock(&comm->regs_mu);
            *handle = r;
        }
    }
    weft_comm_release(comm);
    return st;
}

/* Takes r out of comm's list; false when it is not there (never was, or
 * deregistered already): nothing of it is read before it is found. */
static bool reg_unlink(struct weft_comm *comm, const void *r)
{
    bool found = false;
    pthread_mutex_lock(&comm->regs_mu);
    for (struct weft_reg **p = &comm->regs; *p; p = &(*p)->next) {
        if (*p == r) {
            *p = (*p)->next;
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&comm->regs_mu);
    return found;
}

weft_status_t weft_mem_deregister(weft_comm_t comm, void *handle)
{
    struct weft_reg *r = handle;
    if (comm == NULL || !weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_mem_deregister: invalid communicator");
    weft_status_t st;
    if (r == NULL || !reg_unlink(comm, r)) {
        st = weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                              "weft_mem_deregister: %p is not a registration of this communicator",
                              handle);
    } else {
        struct reg_call rc = {comm, r, true};
        st = weft_engine_exclusive(comm, reg_apply, &rc);
        r->magic = 0;
        free(r);
    }
    weft_comm_release(comm);
    return st;
}

weft_status_t weft_comm_get_error(weft_comm_t comm)
{
    if (comm == NULL || !weft_comm_valid(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_get_error: invalid communicator");
    return (weft_status_t)atomic_load(&comm->error);
}
