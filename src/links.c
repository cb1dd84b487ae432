/*
 * links.c - which transport carries each pair: the link table built from
 * the init exchange, WEFT_TRANSPORT, calibration and the topology file,
 * and the transports opened and bound to every peer from it.
 */
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm_impl.h"
#include "select/topo.h"

/* The second round: the shm and verbs addresses (len 0: none on that rank). */
struct link_info {
    uint32_t shm_len, verbs_len;
    uint8_t shm[WEFT_TRANSPORT_ADDR_MAX];
    uint8_t verbs[WEFT_TRANSPORT_ADDR_MAX];
};

enum { TP_TCP, TP_SHM, TP_VERBS, TP_COUNT };

weft_status_t weft_links_table(struct weft_comm *comm, const struct weft_rank_info *all,
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

weft_status_t weft_links_open(struct weft_comm *comm, const struct weft_transport_init *targs,
                              void *tcp_ctx, const struct weft_rank_info *all, uint64_t deadline)
{
    int rank = comm->rank, n = comm->nranks;
    if (n < 1) { /* checked by every caller; said here for the allocations below */
        weft_tcp_ops.finalize(tcp_ctx);
        return weft_error(weft_comm_err(comm), WEFT_ERR_INTERNAL, "weft_links_open: %d ranks", n);
    }
    const char *spec = weft_param_str("WEFT_TRANSPORT");
    unsigned allowed;
    weft_status_t st = weft_links_table(comm, all, NULL, &allowed);
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
        WEFT_CHECK_GOTO(weft_links_table(comm, all, NULL, &allowed), st, out);
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
