/*
 * tcp.h - private to the tcp transport: wire constants, the request, stream,
 * connection and context structs shared by the data path (tcp.c) and the
 * connection setup (tcp_setup.c), and the functions each calls in the other.
 */
#ifndef WEFT_TRANSPORT_TCP_H
#define WEFT_TRANSPORT_TCP_H

#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/queue.h>

#include "base/admit.h"
#include "base/auth.h"
#include "base/sock.h"
#include "transports/transport.h"
#include "transports/util/util.h"

#define TCP_HDR_LEN 24                 /* u32 magic, u32 reserved, u64 seq, u64 len */
#define TCP_MAGIC 0x31444657u          /* "WFD1" on the wire */
#define TCP_MAX_STREAMS 16
#define TCP_ACCEPT_TIMEOUT_NS (10ull * 1000000000ull)
#define TCP_IOV_MAX 64                 /* iovecs per sendmsg: 32 queued messages */
#define TCP_ERRMSG_LEN 384
#define TCP_ADDRSTR_LEN 64

_Static_assert(sizeof(union weft_sockaddr) <= WEFT_TRANSPORT_ADDR_MAX,
               "a published tcp address must fit WEFT_TRANSPORT_ADDR_MAX");

/* Send streams go IDLE -> CONNECTING -> HANDSHAKE -> READY; receive streams
 * go IDLE -> READY when an authenticated socket is installed.  FAILED is
 * final for both. */
enum { ST_IDLE, ST_CONNECTING, ST_HANDSHAKE, ST_READY, ST_FAILED };

struct tcp_ctx;
struct tcp_conn;

/*
 * One isend or irecv.  Owner: ctx's request pool; the caller borrows the
 * handle until test() reports it done or failed.  While base.status is
 * WEFT_INPROGRESS it sits in its stream's FIFO.  base.bytes is the
 * message's length (recv: from its header).
 */
struct tcp_req {
    struct weft_req base;      /* its conn, buffer, posted length, status */
    size_t done;               /* send: header + payload bytes written; recv: payload bytes */
    uint64_t seq;              /* message number in this direction of conn */
    bool hdr_ok;               /* recv: header read and validated */
    uint8_t hdr[TCP_HDR_LEN];  /* send: the frame header */
};

/*
 * One socket of one direction.  Invariants: fd >= 0 exactly in states
 * CONNECTING, HANDSHAKE and READY; `active` <=> linked into ctx's work list
 * <=> the stream has something to do (setup, or READY with requests);
 * `waits_fd` <=> a receive stream with requests but no socket yet.
 */
struct tcp_stream {
    struct tcp_conn *conn;
    int fd;
    int index;
    uint8_t state;
    bool is_send, active, waits_fd, installed;
    LIST_ENTRY(tcp_stream) work;             /* ctx work list */
    struct weft_req_queue q;                 /* FIFO of struct tcp_req */
    size_t rhave;                            /* recv: bytes of rhdr read ahead */
    uint8_t rhdr[TCP_HDR_LEN];
    struct weft_auth_connector auth;         /* send: during HANDSHAKE */
    uint64_t tried_at;                       /* send, CONNECTING: ns, this connect began */
    int unanswered;                          /* send: connects restarted without an answer */
};

/*
 * Everything toward one peer.  Owner: ctx (conns[peer]), freed at finalize.
 * Created by connect() or by the first accepted stream of that peer.
 * Once base.err is set (sticky), every stream is FAILED.
 */
struct tcp_conn {
    struct weft_conn base;                 /* failure record */
    struct tcp_ctx *ctx;
    int peer;
    union weft_sockaddr addr;              /* peer's published address, once have_addr */
    bool have_addr;
    char addrstr[TCP_ADDRSTR_LEN];
    uint64_t nsend, nrecv;                 /* messages posted per direction */
    uint64_t deadline;                     /* outgoing setup must finish by then (0: none) */
    struct tcp_stream *send, *recv;        /* nstreams each, inside streams[] */
    struct tcp_stream streams[];
};

/*
 * One rank's transport.  Owner: the engine, through init/finalize.  Used by
 * one thread at a time, except efd (written by wakeup from any thread).
 * The poll arrays hold room for every active stream plus the accepted
 * sockets in their handshake (door), the listener and the eventfd.
 */
struct tcp_ctx {
    struct weft_errsink *err;
    int rank, nranks, nstreams, bufsize;
    uint64_t job, timeout_ns;
    uint8_t secret[WEFT_SECRET_BYTES];
    int lfd, efd;
    union weft_sockaddr laddr;
    struct tcp_conn **conns;               /* (nranks), NULL until needed */
    LIST_HEAD(, tcp_stream) work;          /* active streams */
    size_t nactive, nwait_fd;
    unsigned tick;
    struct weft_admit door;                /* accepted sockets before their proof */
    struct pollfd *pfd;                    /* (pcap) streams, door, listener, efd */
    struct tcp_stream **pst;               /* (pcap) stream of pfd[i] */
    size_t pcap;
    struct weft_req_pool reqs;             /* of struct tcp_req */
};

/* ---- tcp.c: shared helpers ------------------------------------------------ */

/* Keeps `active` and `waits_fd` true to the invariants of tcp_stream. */
void tcp_stream_sync(struct tcp_stream *st) WEFT_HIDDEN;
/* Fails conn for good: records why, closes every socket toward the peer
 * (so the peer learns of it too) and fails every queued request. */
void tcp_conn_fail(struct tcp_conn *c, weft_status_t status, const char *fmt, ...)
    WEFT_HIDDEN WEFT_PRINTF(3, 4);
/* conns[peer], created (every stream IDLE) on first use; NULL without memory. */
struct tcp_conn *tcp_conn_get(struct tcp_ctx *ctx, int peer) WEFT_HIDDEN;

/* ---- checks on bytes from peers ------------------------------------------ */
/* Pure, so that the fuzz targets (tests/fuzz) run exactly what the
 * transport runs.  On refusal each writes the whole message for the error
 * record into why, NUL-terminated within whylen bytes. */

/* (tcp.c) The frame header hdr (TCP_HDR_LEN bytes from the peer) for the
 * receive of message seq into posted bytes on st: WEFT_OK and the payload
 * bytes in *len (<= posted), or WEFT_ERR_REMOTE. */
weft_status_t tcp_frame_parse(const struct tcp_stream *st, const uint8_t *hdr, uint64_t seq,
                              size_t posted, size_t *len, char *why, size_t whylen) WEFT_HIDDEN;
/* (tcp_setup.c) The hello of an authenticated socket on ctx's listener:
 * WEFT_OK when its kind, job size, rank and stream index may make it a
 * receive stream of ctx, else WEFT_ERR_REMOTE (whether that stream is free
 * is pending_install's business). */
weft_status_t tcp_hello_check(const struct tcp_ctx *ctx, const struct weft_auth_hello *h,
                              char *why, size_t whylen) WEFT_HIDDEN;
/* (tcp_setup.c) The address peer published in the rank table (addrlen
 * bytes): WEFT_OK and *out, or WEFT_ERR_INVALID_ARG. */
weft_status_t tcp_addr_parse(const struct tcp_ctx *ctx, int peer, const void *addr, size_t addrlen,
                             union weft_sockaddr *out, char *why, size_t whylen) WEFT_HIDDEN;

/* ---- tcp_setup.c: connection setup ---------------------------------------- */

/* Starts every send stream of c connecting; the handshakes finish in
 * progress(), so two ranks that connect to each other never wait. */
void tcp_conn_open(struct tcp_conn *c) WEFT_HIDDEN;
/* Advances the setup of a send stream; returns true if it moved. */
bool tcp_stream_setup(struct tcp_stream *st) WEFT_HIDDEN;
/* A connecting send stream whose connect gets no answer within its window
 * (sock.h) starts afresh: the ms until then, 0 when due, -1 when st is not
 * connecting. */
int tcp_stream_retry_ms(const struct tcp_stream *st, uint64_t now) WEFT_HIDDEN;
/* The listener's turn: pfd (NULL: poll here without waiting) holds the
 * door's entries and then the listener's from the caller's poll; steps the
 * handshakes with news and accepts what waits.  True if anything moved. */
bool tcp_ctx_service(struct tcp_ctx *ctx, const struct pollfd *pfd) WEFT_HIDDEN;
weft_tp_init_fn tcp_init WEFT_HIDDEN;
weft_tp_connect_fn tcp_connect WEFT_HIDDEN;
weft_tp_finalize_fn tcp_finalize WEFT_HIDDEN;

/* ---- the registry's view (tcp.c, tcp_desc.c) ---------------------------------- */
extern const struct weft_transport_ops weft_tcp_ops WEFT_HIDDEN;
extern const struct weft_transport_desc weft_tcp_desc WEFT_HIDDEN;

#endif /* WEFT_TRANSPORT_TCP_H */
