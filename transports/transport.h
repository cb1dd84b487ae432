/*
 * transport.h - the one vtable every transport implements (tcp, shm,
 * verbs).  Shaped after NCCL's net plugin: a per-communicator context,
 * a connection per peer, non-blocking isend/irecv/test, optional memory
 * registration, and an explicit progress call.
 * Transports move bytes between pairs and know nothing about collectives.
 */
#ifndef WEFT_TRANSPORT_H
#define WEFT_TRANSPORT_H

#include <stddef.h>
#include <stdint.h>

#include "config.h" /* HAVE_VERBS */
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
    /* shm: the ranks it may connect to, ascending, this rank included (the
     * same list on each of them); NULL: every rank. */
    const int *group;
    int ngroup;
    /* verbs: the transport whose connections carry the queue pair
     * exchange (tcp; each peer's conn given by weft_verbs_bind_oob). */
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
     * address peers connect to (at most WEFT_TRANSPORT_ADDR_MAX bytes). */
    weft_status_t (*init)(const struct weft_transport_init *args, void **ctx, void *addr,
                          size_t *addrlen);
    /* Binds peer's published address to a conn; the transport may connect
     * now or on first use. */
    weft_status_t (*connect)(void *ctx, int peer, const void *addr, size_t addrlen, void **conn);
    /* Optional: called once every rank of the communicator has connected to
     * all its peers of this transport (after a barrier), e.g. to unlink
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
};

extern const struct weft_transport_ops weft_tcp_ops WEFT_HIDDEN;
extern const struct weft_transport_ops weft_shm_ops WEFT_HIDDEN;
#ifdef HAVE_VERBS
extern const struct weft_transport_ops weft_verbs_ops WEFT_HIDDEN;
/* Before connect(peer): the out-of-band (tcp) connection to that peer. */
void weft_verbs_bind_oob(void *ctx, int peer, void *oob_conn) WEFT_HIDDEN;
#endif


#endif /* WEFT_TRANSPORT_H */
