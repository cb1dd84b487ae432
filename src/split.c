/*
 * split.c - communicators made from another: weft_comm_split (every rank of
 * a live one takes part, grouped by color) and weft_comm_shrink (only the
 * survivors take part, and the parent may have failed).  Each new group
 * has a leader (its new rank 0) that runs the rendezvous: for split on a
 * listener it opens and publishes then, for shrink on the one it published
 * at init.  The group's secret is derived from the parent's, so no secret
 * ever crosses the wire.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm.h"

/* What a leader tells its group: whether it could open the rendezvous,
 * and the child's id (address and job; the secret bytes are zero). */
struct child_offer {
    int32_t status;
    weft_unique_id_t id;
};

struct split_entry {
    int32_t color, key;
};

/* The child's secret: only ranks that hold the parent's secret can compute
 * it, and every (parent, call, group, job) gets its own. */
static void child_secret(const struct weft_comm *parent, uint32_t seq, int32_t color,
                         uint64_t job, uint8_t out[WEFT_SECRET_BYTES])
{
    uint8_t msg[32];
    memcpy(msg, "weft-child", 10);
    memcpy(msg + 10, &parent->job, 8);
    memcpy(msg + 18, &seq, 4);
    memcpy(msg + 22, &color, 4);
    memcpy(msg + 26, &job, 6);
    uint8_t mac[32];
    weft_hmac_sha256(parent->secret, sizeof(parent->secret), msg, sizeof(msg), mac);
    memcpy(out, mac, WEFT_SECRET_BYTES);
}

/* Leader side: listens on the address this rank already publishes to its
 * peers (they can reach it), port chosen by the kernel. */
static void make_offer(struct weft_comm *parent, struct child_offer *offer)
{
    static const uint8_t zero[WEFT_SECRET_BYTES];
    memset(offer, 0, sizeof(*offer));
    union weft_sockaddr addr;
    memset(&addr, 0, sizeof(addr));
    memcpy(&addr, parent->taddr, WEFT_MIN(parent->taddr_len, sizeof(addr)));
    if (addr.sa.sa_family == AF_INET)
        addr.in.sin_port = 0;
    else
        addr.in6.sin6_port = 0;
    int fd = -1;
    weft_status_t st = weft_sock_listen(&addr, &fd);
    struct weft_uid uid;
    if (st == WEFT_OK)
        st = weft_uid_make(&offer->id, &addr, zero);
    if (st == WEFT_OK)
        st = weft_uid_parse(&offer->id, &uid);
    if (st != WEFT_OK) {
        if (fd >= 0)
            close(fd);
        offer->status = st;
        return;
    }
    weft_uid_hold_listener(uid.job, fd);
}

/* A child of split or shrink takes its parent's deterministic mode and
 * algorithms (weft_comm_set_deterministic, weft_comm_set_algo). */
static void inherit(struct weft_comm *child, struct weft_comm *parent)
{
    atomic_store(&child->deterministic, atomic_load(&parent->deterministic));
    memcpy(child->algos, parent->algos, sizeof(child->algos));
}

/* Every member: joins the group its leader offered. */
static weft_status_t join_offer(struct weft_comm *parent, const char *fn, uint32_t seq,
                                int32_t color, int leader, const struct child_offer *offer,
                                int n, int newrank, weft_comm_t *out)
{
    if (offer->status != WEFT_OK)
        return weft_error(weft_comm_err(parent), WEFT_ERR_REMOTE,
                          "%s: rank %d, the new communicator's rank 0, could not open its "
                          "rendezvous (%s)",
                          fn, leader, weft_status_string((weft_status_t)offer->status));
    struct weft_uid uid;
    WEFT_CHECK(weft_uid_parse(&offer->id, &uid));
    child_secret(parent, seq, color, uid.job, uid.secret);
    weft_status_t st = weft_comm_create(out, n, &uid, newrank);
    if (st != WEFT_OK)
        weft_error_quiet(weft_comm_err(parent), st, "%s: %s", fn, weft_thread_last_error());
    else /* every member's parent has the same settings, so the children agree */
        inherit(*out, parent);
    return st;
}

static weft_status_t split_acquired(struct weft_comm *comm, int color, int key,
                                    weft_comm_t *newcomm)
{
    const char *fn = "weft_comm_split";
    int p = comm->nranks;
    uint32_t seq = comm->nchildren++;
    uint64_t deadline = weft_now_ns() + comm->timeout_ns;
    struct split_entry me = {color < 0 ? -1 : color, key};
    struct split_entry *all = calloc((size_t)p, sizeof(*all));
    struct child_offer *offers = calloc((size_t)p, sizeof(*offers));
    weft_status_t st = WEFT_OK;
    if (all == NULL || offers == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "%s: out of memory for %d ranks", fn, p);
        goto out; /* the others time out in the exchange and name this rank */
    }
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bs, &me, all, sizeof(me), deadline), st, out);

    /* My group: the ranks of my color ordered by (key, parent rank). */
    int n = 0, newrank = 0, leader = -1;
    if (me.color >= 0) {
        for (int r = 0; r < p; r++) {
            if (all[r].color != me.color)
                continue;
            n++;
            bool before = all[r].key < me.key || (all[r].key == me.key && r < comm->rank);
            newrank += before;
            if (leader < 0 || all[r].key < all[leader].key)
                leader = r;
        }
    }
    struct child_offer mine = {0};
    if (leader == comm->rank)
        make_offer(comm, &mine);
    WEFT_CHECK_GOTO(weft_bootstrap_allgather(comm->bs, &mine, offers, sizeof(mine), deadline), st,
                    out);
    if (me.color >= 0)
        st = join_offer(comm, fn, seq, me.color, leader, &offers[leader], n, newrank, newcomm);
out:
    free(all);
    free(offers);
    return st;
}

weft_status_t weft_comm_split(weft_comm_t comm, int color, int key, weft_comm_t *newcomm)
{
    if (newcomm == NULL)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "weft_comm_split: newcomm is NULL");
    *newcomm = NULL;
    if (comm == NULL || !weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_split: invalid communicator (NULL, destroyed or "
                                "never created)");
    weft_status_t st = weft_comm_get_error(comm);
    if (st != WEFT_OK)
        st = weft_error_quiet(weft_comm_err(comm), st, "weft_comm_split: the communicator has failed (%s)",
                              weft_status_string(st));
    else
        st = split_acquired(comm, color, key, newcomm);
    weft_comm_release(comm);
    return st;
}

/* The child's job id: every survivor computes the same from the parent's
 * secret, the call's sequence number and who is gone. */
static uint64_t shrink_job(const struct weft_comm *parent, uint32_t seq, const bool *gone)
{
    uint8_t mac[32], msg[32] = "weft-shrink";
    uint64_t h = 1469598103934665603ull; /* FNV-1a over the excluded ranks */
    for (int r = 0; r < parent->nranks; r++)
        if (gone[r])
            h = (h ^ (uint64_t)r) * 1099511628211ull;
    memcpy(msg + 12, &seq, 4);
    memcpy(msg + 16, &h, 8);
    memcpy(msg + 24, &parent->job, 8);
    weft_hmac_sha256(parent->secret, sizeof(parent->secret), msg, sizeof(msg), mac);
    uint64_t job;
    memcpy(&job, mac, sizeof(job));
    return job;
}

/* No link of the parent is used (it may have failed): the new root is the
 * lowest survivor, on the listener it opened at init and published then;
 * id and secret are derived, so nothing needs to be exchanged first. */
static weft_status_t shrink_acquired(struct weft_comm *comm, const bool *gone,
                                     weft_comm_t *newcomm)
{
    const char *fn = "weft_comm_shrink";
    uint32_t seq = comm->nchildren++;
    int n = 0, newrank = 0, leader = -1;
    for (int r = 0; r < comm->nranks; r++) {
        if (gone[r])
            continue;
        if (leader < 0)
            leader = r;
        newrank += r < comm->rank;
        n++;
    }
    struct weft_uid uid = {.root = comm->rescue[leader], .job = shrink_job(comm, seq, gone)};
    if (uid.root.sa.sa_family != AF_INET && uid.root.sa.sa_family != AF_INET6)
        return weft_error(weft_comm_err(comm), WEFT_ERR_REMOTE, "%s: rank %d published no rendezvous address",
                          fn, leader);
    child_secret(comm, seq, -2, uid.job, uid.secret);
    if (leader == comm->rank) {
        /* The child's bootstrap takes (and closes) a duplicate, so that the
         * next shrink of this communicator finds the listener still here. */
        int fd = dup(comm->rescue_fd);
        if (fd < 0)
            return weft_error(weft_comm_err(comm), WEFT_ERR_SYSTEM, "%s: dup of the rendezvous listener: %s",
                              fn, strerror(errno));
        weft_uid_hold_listener(uid.job, fd);
    }
    weft_status_t st = weft_comm_create(newcomm, n, &uid, newrank);
    if (st == WEFT_OK)
        inherit(*newcomm, comm);
    if (st != WEFT_OK) {
        weft_error_quiet(weft_comm_err(comm), st, "%s: %s", fn, weft_thread_last_error());
        int left = leader == comm->rank ? weft_uid_take_listener(uid.job) : -1;
        if (left >= 0)
            close(left); /* the child never took it */
    }
    return st;
}

weft_status_t weft_comm_shrink(weft_comm_t comm, const int *excluded, int nexcluded,
                               weft_comm_t *newcomm)
{
    const char *fn = "weft_comm_shrink";
    if (newcomm == NULL)
        return weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: newcomm is NULL", fn);
    *newcomm = NULL;
    if (comm == NULL || !weft_comm_acquire(comm))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "%s: invalid communicator (NULL, destroyed or never created)", fn);
    weft_status_t st = WEFT_OK;
    bool *gone = calloc((size_t)comm->nranks, sizeof(*gone));
    if (gone == NULL) {
        st = weft_error(weft_comm_err(comm), WEFT_ERR_NO_MEMORY, "%s: out of memory", fn);
        goto out;
    }
    if (nexcluded < 0 || (nexcluded > 0 && excluded == NULL)) {
        st = weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG, "%s: %d excluded ranks at %p", fn,
                              nexcluded, (const void *)excluded);
        goto out;
    }
    for (int i = 0; i < nexcluded; i++) {
        int r = excluded[i];
        if (r < 0 || r >= comm->nranks || gone[r]) {
            st = weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                                  "%s: excluded[%d] = %d is out of range (0..%d) or repeated", fn,
                                  i, r, comm->nranks - 1);
            goto out;
        }
        gone[r] = true;
    }
    if (gone[comm->rank]) {
        st = weft_error_quiet(weft_comm_err(comm), WEFT_ERR_INVALID_ARG,
                              "%s: this rank (%d) is in the excluded list; excluded ranks do not "
                              "call it",
                              fn, comm->rank);
        goto out;
    }
    /* A failed communicator can shrink: that is what shrink is for. */
    st = shrink_acquired(comm, gone, newcomm);
out:
    free(gone);
    weft_comm_release(comm);
    return st;
}
