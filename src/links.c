/*
 * links.c - which transport carries each pair: the link table built from
 * the init exchange, WEFT_TRANSPORT, calibration and the topology file,
 * and the transports of the registry opened and bound to every peer from
 * it.  Nothing here names a transport: the descriptors say what differs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "comm_impl.h"
#include "select/topo.h"

/* The second round carries the address of every transport that reaches
 * other ranks but the base one (whose address went out in the first
 * round); len 0: that rank did not open it. */
struct link_addr {
    uint32_t len;
    uint8_t addr[WEFT_TRANSPORT_ADDR_MAX];
};

/* What one rank's links are made of while they open.  slot[t] is t's
 * place in a second-round record, -1 when t publishes none. */
struct opening {
    struct weft_comm *comm;
    const struct weft_rank_info *all;
    int ntr, base, nslots;
    int slot[WEFT_MAX_TRANSPORTS];
    bool want[WEFT_MAX_TRANSPORTS];            /* some pair of this rank's takes it */
    void *ctx[WEFT_MAX_TRANSPORTS];
    struct link_addr mine[WEFT_MAX_TRANSPORTS]; /* what each init wrote */
    struct link_addr *peers;                   /* (nranks * nslots) */
    unsigned allowed;
};

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
    if (st == WEFT_OK)
        *allowed &= ~comm->tp_off;
    for (int r = 0; hostid && r < n; r++)
        hostid[r] = all[r].host;
    if (st == WEFT_OK)
        st = weft_topo_table_init(&comm->topo, n, hostid, *allowed, why, sizeof(why));
    free(hostid);
    for (int t = 0; st == WEFT_OK && cal && t < weft_transport_count(); t++)
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

/* Rank r's address for transport t; false when r did not open it. */
static bool addr_of(const struct opening *o, int r, int t, const void **addr, size_t *len)
{
    if (t == o->base) {
        *addr = o->all[r].taddr;
        *len = o->all[r].taddr_len;
        return true;
    }
    if (o->slot[t] < 0) {
        /* It reaches only this rank: what it wrote here, if it opened. */
        *addr = o->mine[t].addr;
        *len = o->mine[t].len;
        return r == o->comm->rank && o->ctx[t];
    }
    const struct link_addr *a = &o->peers[(size_t)r * (size_t)o->nslots + (size_t)o->slot[t]];
    *addr = a->addr;
    *len = a->len;
    return a->len > 0;
}

/* Opens transport t for the ranks its can_reach accepts from here (and
 * this one: the group every rank of it computes alike). */
static void open_one(struct opening *o, int t, const struct weft_transport_init *targs)
{
    struct weft_comm *comm = o->comm;
    const struct weft_transport_desc *d = weft_transports[t];
    int n = comm->nranks, rank = comm->rank, ngroup = 0;
    int *group = malloc((size_t)n * sizeof(*group));
    if (group == NULL) {
        weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "out of memory for %d ranks", n);
        return; /* publishing len 0 tells the peers */
    }
    for (int r = 0; r < n; r++) {
        struct weft_transport_pair pair = {
            .self = r == rank, .same_host = strcmp(o->all[r].host, o->all[rank].host) == 0};
        if (r == rank || d->can_reach(&pair))
            group[ngroup++] = r;
    }
    struct weft_transport_init args = *targs;
    args.group = group;
    args.ngroup = ngroup;
    if (d->bind_oob) {
        args.oob_ops = weft_transports[o->base]->ops;
        args.oob_ctx = o->ctx[o->base];
    }
    size_t len = sizeof(o->mine[t].addr);
    weft_status_t st = d->ops->init(&args, &o->ctx[t], o->mine[t].addr, &len);
    free(group);
    if (st == WEFT_OK) {
        o->mine[t].len = (uint32_t)len;
    } else if (st != WEFT_ERR_UNSUPPORTED) {
        char why[WEFT_ERRMSG_LEN];
        WEFT_WARN(WEFT_SUB_INIT,
                  "rank %d: cannot open %s (%s); its peers here use another transport if "
                  "WEFT_TRANSPORT allows one",
                  rank, d->name, weft_comm_last_error_copy(comm, why, sizeof(why)));
    }
}

/* A WEFT_TP_ALL_RANKS transport some rank could not open: every rank
 * leaves it (all saw the same lengths), or fails when WEFT_TRANSPORT
 * leaves no other way. */
static weft_status_t drop_all_ranks(struct opening *o, bool *dropped)
{
    struct weft_comm *comm = o->comm;
    int n = comm->nranks, rank = comm->rank;
    *dropped = false;
    for (int t = 0; t < o->ntr; t++) {
        if (!(weft_transports[t]->flags & WEFT_TP_ALL_RANKS) || !(o->allowed & (1u << t)))
            continue;
        int without = -1;
        const void *addr;
        size_t len;
        for (int r = 0; r < n && without < 0; r++)
            if (!addr_of(o, r, t, &addr, &len))
                without = r;
        if (without < 0)
            continue;
        const char *name = weft_transports[t]->name;
        comm->tp_off |= 1u << t;
        *dropped = true;
        if (o->ctx[t]) {
            weft_transports[t]->ops->finalize(o->ctx[t]);
            o->ctx[t] = NULL;
            o->mine[t].len = 0;
        }
        if ((o->allowed & ~(1u << t)) == 0)
            return weft_error(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                              "rank %d: WEFT_TRANSPORT=%s allows only %s, and rank %d could not "
                              "open it%s",
                              rank, weft_param_str("WEFT_TRANSPORT"), name, without,
                              without == rank ? "" : " (its log at WEFT_DEBUG=INFO says why)");
        if (o->want[t] && rank == 0)
            WEFT_INFO(WEFT_SUB_INIT, "rank %d could not open %s: %s carries what it would have",
                      without, name, weft_transports[o->base]->name);
    }
    return WEFT_OK;
}

/* Binds peer r to the transport the table gives the pair, or to the base
 * one when that did not open at both ends; *t gets the one chosen. */
static weft_status_t bind_peer(struct opening *o, int r, int *t)
{
    struct weft_comm *comm = o->comm;
    int rank = comm->rank;
    struct weft_link l = {0};
    weft_topo_table_get(&comm->topo, rank, r, &l);
    *t = l.transport;
    const void *addr;
    size_t len;
    if (!o->ctx[*t] || !addr_of(o, rank, *t, &addr, &len) || !addr_of(o, r, *t, &addr, &len)) {
        if (r == rank || !(o->allowed & (1u << o->base)))
            return weft_error(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                              "rank %d cannot reach rank %d: %s is not open on both ranks and "
                              "WEFT_TRANSPORT=%s does not allow %s",
                              rank, r, weft_transports[*t]->name, weft_param_str("WEFT_TRANSPORT"),
                              weft_transports[o->base]->name);
        *t = o->base;
    }
    const struct weft_transport_desc *d = weft_transports[*t];
    addr_of(o, r, *t, &addr, &len);
    if (len > WEFT_TRANSPORT_ADDR_MAX)
        return weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE, "rank %d published a bad address",
                          r);
    if (d->bind_oob) {
        /* The base transport's connection carries its setup. */
        const void *baddr;
        size_t blen;
        void *oob;
        addr_of(o, r, o->base, &baddr, &blen);
        WEFT_CHECK(weft_transports[o->base]->ops->connect(o->ctx[o->base], r, baddr, blen, &oob));
        d->bind_oob(o->ctx[*t], r, oob);
    }
    comm->link_ops[r] = d->ops;
    comm->link_kind[r] = (uint8_t)*t;
    return d->ops->connect(o->ctx[*t], r, addr, len, &comm->conns[r]);
}

weft_status_t weft_links_open(struct weft_comm *comm, const struct weft_transport_init *targs,
                              void *base_ctx, const struct weft_rank_info *all, uint64_t deadline)
{
    int rank = comm->rank, n = comm->nranks;
    struct opening o = {.comm = comm, .all = all, .ntr = weft_transport_count(),
                        .base = weft_transport_base()};
    o.ctx[o.base] = base_ctx;
    if (n < 1) { /* checked by every caller; said here for the allocations below */
        weft_transports[o.base]->ops->finalize(base_ctx);
        return weft_error(weft_comm_err(comm), WEFT_ERR_INTERNAL, "weft_links_open: %d ranks", n);
    }
    weft_status_t st = weft_links_table(comm, all, NULL, &o.allowed);
    if (st != WEFT_OK) {
        weft_transports[o.base]->ops->finalize(base_ctx);
        return st;
    }
    for (int t = 0; t < o.ntr; t++)
        o.slot[t] = t != o.base && weft_transport_reaches_others(t) ? o.nslots++ : -1;
    /* The table says which transport each pair wants (self for this rank,
     * shm on one host, verbs across hosts, unless WEFT_TRANSPORT or the
     * topology file says otherwise): open those. */
    bool used[WEFT_MAX_TRANSPORTS] = {false};
    for (int r = 0; r < n; r++) {
        struct weft_link l;
        if (weft_topo_table_get(&comm->topo, rank, r, &l) == WEFT_OK)
            o.want[l.transport] = true;
    }
    size_t reclen = (size_t)o.nslots * sizeof(struct link_addr);
    struct link_addr *rec = calloc(o.nslots ? (size_t)o.nslots : 1, sizeof(*rec));
    o.peers = calloc((size_t)n * (o.nslots ? (size_t)o.nslots : 1), sizeof(*o.peers));
    if (rec == NULL || o.peers == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "out of memory for %d ranks", n);
        goto out; /* the others time out in the exchange and name this rank */
    }
    for (int t = 0; t < o.ntr; t++)
        if (o.want[t] && t != o.base && weft_transports[t]->ops)
            open_one(&o, t, targs);
    for (int t = 0; t < o.ntr; t++)
        if (o.slot[t] >= 0)
            rec[o.slot[t]] = o.mine[t];
    /* Every rank takes part, whatever it opened, so the rounds match. */
    if (o.nslots > 0)
        WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bs, rec, o.peers, reclen, deadline), st,
                        out);
    bool dropped;
    WEFT_CHECK_GOTO(drop_all_ranks(&o, &dropped), st, out);
    if (dropped)
        WEFT_CHECK_GOTO(weft_links_table(comm, all, NULL, &o.allowed), st, out);
    for (int r = 0; r < n; r++) {
        int t;
        WEFT_CHECK_GOTO(bind_peer(&o, r, &t), st, out);
        used[t] = true;
        used[o.base] |= weft_transports[t]->bind_oob != NULL;
    }
    /* Progress order: by priority; the base transport, last, is where the
     * communicator sleeps, and stays open whoever uses it. */
    int order[WEFT_MAX_TRANSPORTS], norder = weft_transport_by_priority(order);
    for (int k = 0; k < norder; k++) {
        int t = order[k];
        if (!o.ctx[t])
            continue;
        if (used[t] || t == o.base) {
            comm->tp[comm->ntp].ops = weft_transports[t]->ops;
            comm->tp[comm->ntp].kind = t;
            comm->tp[comm->ntp++].ctx = o.ctx[t];
        } else {
            weft_transports[t]->ops->finalize(o.ctx[t]);
        }
        o.ctx[t] = NULL;
    }
    for (int i = 0; i + 1 < comm->ntp; i++)
        WEFT_CHECK_GOTO(comm->tp[i].ops->set_waker(comm->tp[i].ctx,
                                                   comm->tp[comm->ntp - 1].ops->wakeup,
                                                   comm->tp[comm->ntp - 1].ctx),
                        st, out);
    /* A transport with a ready hook that some rank opened (every rank
     * sees the same records): once every peer has connected, after a
     * barrier, it may drop what only setup needed (shm unlinks its
     * segment names, so a crash from now on leaves nothing in /dev/shm). */
    bool any_ready = false;
    for (int t = 0; t < o.ntr; t++)
        for (int r = 0; r < n && o.slot[t] >= 0 && weft_transports[t]->ops &&
                        weft_transports[t]->ops->ready && !any_ready;
             r++)
            any_ready = o.peers[(size_t)r * (size_t)o.nslots + (size_t)o.slot[t]].len > 0;
    if (any_ready) {
        WEFT_CHECK_GOTO(weft_bootstrap_barrier(comm->bs, deadline), st, out);
        for (int i = 0; i < comm->ntp; i++)
            if (comm->tp[i].ops->ready)
                WEFT_CHECK_GOTO(comm->tp[i].ops->ready(comm->tp[i].ctx), st, out);
    }
    if (weft_log_level_ >= WEFT_LOG_INFO) {
        char line[256];
        int at = 0, peers[WEFT_MAX_TRANSPORTS] = {0};
        for (int r = 0; r < n; r++)
            peers[comm->link_kind[r]] += r != rank;
        line[0] = '\0';
        for (int i = 0; i < comm->ntp && at < (int)sizeof(line); i++)
            if (peers[comm->tp[i].kind] > 0)
                at += snprintf(line + at, sizeof(line) - (size_t)at, "%s%s to %d peer%s",
                               at ? ", " : "", weft_transports[comm->tp[i].kind]->name,
                               peers[comm->tp[i].kind], peers[comm->tp[i].kind] == 1 ? "" : "s");
        WEFT_INFO(WEFT_SUB_INIT, "rank %d: %s", rank, at ? line : "no peers");
    }
out:
    for (int t = 0; t < o.ntr; t++)
        if (o.ctx[t])
            weft_transports[t]->ops->finalize(o.ctx[t]);
    free(rec);
    free(o.peers);
    return st;
}
