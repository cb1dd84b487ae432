/*
 * transport.h - the one vtable every transport implements, and the
 * descriptor each declares for the registry (transports/registry.c).
 * Shaped after NCCL's net plugin: a per-communicator context, a connection
 * per peer, non-blocking isend/irecv/test, optional memory registration,
 * and an explicit progress call.
 * Transports move bytes between pairs and know nothing about collectives.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "config.h" /* HAVE_VERBS, HAVE_RDMACM: what configure built */
#include "base/internal.h"
#include "base/sock.h"

#define WEFT_TRANSPORT_ADDR_MAX 128 /* bytes of a published address */

struct weft_transport_init {
    struct weft_errsink *err;   /* the communicator's error record (weft_error) */
    int rank, nranks;
    uint64_t job;               /* communicator identity, covered by the handshake */
    const uint8_t *secret;      /* WEFT_SECRET_BYTES, authenticates every connection */
    union weft_sockaddr local;  /* interface address to listen on (port 0) */
    uint64_t timeout_ns;        /* WEFT_TIMEOUT_MS: bound on connection setup */
    /* The ranks the descriptor's can_reach accepts from this one, and this
     * one, ascending (the same list on each of them); NULL: every rank. */
    const int *group;
    int ngroup;
    /* The base transport (WEFT_TP_BASE), whose connection to each peer a
     * transport with a bind_oob hook may use for its own setup. */
    const struct weft_transport_ops *oob_ops;
    void *oob_ctx;
};

/*
 * Ownership: the transport owns ctx, conns and requests; the caller owns the
 * buffers, which stay borrowed until test() reports the request done.
 * Matching: on one conn, the k-th isend of A to B lands in the k-th irecv B
 * posts for A.  A message longer than the posted receive is an error on
 * both sides; a shorter one completes with its length in *bytes.
 * A failed connection fails every request on it with WEFT_ERR_REMOTE (the
 * message names the peer); other peers carry on.
 */
typedef bool (*weft_take_fn)(void *arg, size_t off, const void *data, size_t len);

struct weft_transport_ops {
    const char *name;
    /* Opens the transport for one rank: starts listening, writes the
     * address peers connect to (at most WEFT_TRANSPORT_ADDR_MAX bytes; a
     * transport that reaches no other rank publishes nothing). */
    weft_status_t (*init)(const struct weft_transport_init *args, void **ctx, void *addr,
                          size_t *addrlen);
    /* Binds peer's published address to a conn; the transport may connect
     * now or on first use. */
    weft_status_t (*connect)(void *ctx, int peer, const void *addr, size_t addrlen, void **conn);
    /* Optional: called once every rank of the communicator has connected to
     * all its peers of this transport (after a barrier, held when some rank
     * published an address for a transport with this hook), e.g. to unlink
     * shared-memory names nobody needs any more. */
    weft_status_t (*ready)(void *ctx);
    /* Optional (NULL in tcp): memory handles for zero-copy transports. */
    weft_status_t (*reg_mem)(void *ctx, void *buf, size_t bytes, void **mh);
    weft_status_t (*dereg_mem)(void *ctx, void *mh);
    weft_status_t (*isend)(void *conn, const void *buf, size_t bytes, void **req);
    weft_status_t (*irecv)(void *conn, void *buf, size_t bytes, void **req);
    /* Optional (shm): a receive whose bytes the caller may consume straight
     * out of the transport's memory.  Each chunk, in order, is offered as
     * take(arg, off, data, len): true means the caller consumed it; false
     * makes the transport copy it to buf + off as irecv would.  Bytes the
     * transport had to place in buf itself are offered with data = buf +
     * off (the caller may consume them from there).  Chunks other than the
     * last are multiples of 8 bytes.  take runs inside progress. */
    weft_status_t (*irecv_take)(void *conn, void *buf, size_t bytes, weft_take_fn take,
                                void *arg, void **req);
    /* *done = 1: the request is finished and freed; *bytes holds the length
     * moved.  An error return also frees the request. */
    weft_status_t (*test)(void *req, int *done, size_t *bytes);
    /* Moves bytes on every connection and accepts new ones; waits at most
     * timeout_ms (0: do not wait) for something to happen.  Returns an error
     * only when the whole context is unusable. */
    weft_status_t (*progress)(void *ctx, int timeout_ms);
    /* Makes a progress() blocked in its wait return soon; any thread. */
    void (*wakeup)(void *ctx);
    /* Optional: the communicator failed (why says how).  Fails every
     * connection with status and lets each peer know at once, so that none
     * waits for its timeout; logs nothing.  The thread that drives. */
    void (*abort)(void *ctx, weft_status_t status, const char *why);
    /* Closes every connection, fails pending requests, frees ctx.  NULL ok. */
    void (*finalize)(void *ctx);
    /* Optional, for a transport a communicator does not sleep in (shm,
     * verbs) while another one's wait (tcp's poll) does: set_waker starts
     * a thread that calls fn(arg) (the sleeper's wakeup) whenever this
     * transport has news; around that wait, sleep_begin moves what it can
     * and arms the notification (true: something happened, do not sleep),
     * sleep_end disarms.  The thread ends in finalize. */
    weft_status_t (*set_waker)(void *ctx, void (*fn)(void *), void *arg);
    bool (*sleep_begin)(void *ctx);
    void (*sleep_end)(void *ctx);
    /* Optional (shm): short messages outside the request queues, for
     * collectives of one exchange that skip the engine (src/ll.c).
     * ll_bytes: the most one message carries toward conn's peer, as the
     * peer sized its end (0: none).  ll_put: the next message to the peer,
     * data then its flag, in one cache line when it fits; it may be made
     * only once the peer's message before it has been taken (ll_get), so
     * puts and gets alternate on a conn.  ll_get: the peer's next message,
     * or NULL while it has not arrived (or is longer than ll_bytes: then
     * *len says so); valid until our next ll_put on conn.  ll_check:
     * WEFT_OK while the peer lives and has not failed the connection, else
     * the error, with a message naming it.  Any thread, one per conn. */
    size_t (*ll_bytes)(void *conn);
    void (*ll_put)(void *conn, const void *buf, size_t len);
    const void *(*ll_get)(void *conn, size_t *len);
    weft_status_t (*ll_check)(void *conn);
};

/* A vtable from functions named <prefix>_<op>: the nine every transport
 * has, then the optional ones it adds (designated initializers), e.g.
 * WEFT_TRANSPORT_OPS("shm", shm, .ready = shm_ready). */
#define WEFT_TRANSPORT_OPS(tname, prefix, ...)                                             \
    {                                                                                      \
        .name = tname, .init = prefix##_init, .connect = prefix##_connect,                 \
        .isend = prefix##_isend, .irecv = prefix##_irecv, .test = prefix##_test,           \
        .progress = prefix##_progress, .wakeup = prefix##_wakeup, .abort = prefix##_abort, \
        .finalize = prefix##_finalize, __VA_ARGS__                                         \
    }
/* The three a transport that does not sleep itself gives together. */
#define WEFT_TRANSPORT_SLEEPER(prefix)                                                     \
    .set_waker = prefix##_set_waker, .sleep_begin = prefix##_sleep_begin,                  \
    .sleep_end = prefix##_sleep_end

/* What the link table knows of a pair of ranks; a transport's reach may
 * depend on nothing else, so the table stays O(n) for n ranks. */
struct weft_transport_pair {
    bool self;      /* a rank with itself */
    bool same_host; /* equal host identities (WEFT_HOSTID, else hostname + boot id) */
};

/* Descriptor flags. */
enum {
    /* The transport every rank opens first, before the rendezvous: its
     * address travels in the bootstrap record, it reaches every other
     * rank, carries the pairs whose own transport did not open on both
     * ends, lends its connections to bind_oob hooks, and progress sleeps
     * in it.  Its address is a union weft_sockaddr (split and shrink
     * listen on its host).  Exactly one transport has it (tcp). */
    WEFT_TP_BASE = 1u << 0,
    /* Used by no rank unless every rank opened it (verbs: whether a rank
     * has a device is not known before the exchange, and tcp carries
     * every pair as well). */
    WEFT_TP_ALL_RANKS = 1u << 1,
    /* Not the operator's choice: WEFT_TRANSPORT does not name it and the
     * topology file cannot force it (self). */
    WEFT_TP_IMPLICIT = 1u << 2,
};

/*
 * What the registry knows of a transport.  Each transport defines one, in
 * its folder, and transports/registry.c lists them; the index in that list
 * is the transport's link kind everywhere (link table, calibration,
 * topology file).  Plain constant data.
 */
struct weft_transport_desc {
    const char *name;   /* WEFT_TRANSPORT, the topology file, logs */
    unsigned flags;     /* WEFT_TP_* */
    /* Lower first: the link table gives a pair the first allowed
     * transport that reaches it, and progress visits transports in this
     * order (the base one, where it sleeps, comes last). */
    int priority;
    bool (*can_reach)(const struct weft_transport_pair *pair);
    double alpha;       /* default cost: seconds per message */
    double beta;        /* seconds per byte */
    /* Its settings (WEFT_<NAME>_*), or NULL.  weft-info lists them; a
     * transport that reads them with weft_param_* calls
     * weft_transport_register_params (transports/registry.h) in its init
     * first, since tests call init directly. */
    const struct weft_param_desc *params;
    size_t nparams;
#define WEFT_TRANSPORT_PARAMS(table) .params = (table), .nparams = WEFT_ARRAY_SIZE(table)
    /* Optional: before connect(peer), the base transport's connection to
     * that peer, for the transport's own setup (verbs' queue pair
     * exchange).  init then gets oob_ops/oob_ctx. */
    void (*bind_oob)(void *ctx, int peer, void *oob_conn);
    /* Optional: weft-info's line on whether it can run on this host, and
     * why not. */
    void (*status)(FILE *out);
    const struct weft_transport_ops *ops; /* NULL: not built (configure left it out) */
};

#endif /* WEFT_TRANSPORT_H */
