/*
 * verbs.h - private to the verbs transport: the wire formats (published
 * address, queue-pair info, immediate data), the request, connection and
 * context structs shared by the data path (verbs.c), the setup
 * (verbs_setup.c) and memory registration (verbs_mem.c).
 *
 * Protocol, per connection (one set of RC queue pairs per peer, both
 * directions): the receiver of message k writes a descriptor {addr, len,
 * rkey, seq} into slot k % VB_FIFO of the sender's FIFO with an inline
 * RDMA WRITE WITH IMMEDIATE; the sender, woken by that completion, writes
 * the payload straight into the described buffer, striped across the
 * queue pairs, each stripe ending in a WRITE WITH IMMEDIATE.  Descriptors
 * are the credits: at most VB_FIFO messages are described at once, and
 * every queue pair keeps enough receives posted for all of them, so no
 * write ever meets an empty receive queue.
 *
 * A send that fits inline and finds no descriptor yet goes eagerly: inline
 * into the next of VB_FIFO small slots the receiver keeps for this peer
 * (beside the FIFO), on queue pair 0, with no wait for a descriptor.  The
 * receiver copies it out when its receive is posted (or at once if it
 * is), and still describes that receive, so descriptors stay one per
 * message; the sender drops those for messages already sent.  Each
 * descriptor carries how many small messages the receiver has consumed:
 * the credits for the slots.  Sends complete on their acknowledgement.
 */
#ifndef WEFT_TRANSPORT_VERBS_H
#define WEFT_TRANSPORT_VERBS_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/auth.h"
#include "transports/transport.h"
#include "transports/util/regcache.h"
#include "transports/util/util.h"

#define VB_FIFO 32                 /* messages described at once per direction */
#define VB_MAX_QPS 8               /* WEFT_IB_QPS_PER_CONNECTION upper bound */
#define VB_MIN_STRIPE 65536        /* bytes; smaller messages use one QP */
#define VB_MAX_WR_BYTES (1u << 30) /* one work request moves at most this */
#define VB_INLINE 64               /* payloads this small go inline */
#define VB_SQ_DEPTH (4 * VB_FIFO + 16)
#define VB_CQ_DEPTH 4096
#define VB_ERRMSG_LEN 384
#define VB_ADDR_MAGIC 0x31425657u  /* "WVB1" */
#define VB_INFO_MAGIC 0x32515657u  /* "WVQ2": descriptors carry eager credits */
#define VB_FAILED_BYTE 0x46        /* "F" on the tcp watch: the sender failed the connection */

/* Immediate data: kind in bits 31-30, stripes - 1 in 29-24, seq in 23-0. */
enum { VB_IMM_DATA = 0, VB_IMM_FIFO = 1, VB_IMM_TOOLONG = 2, VB_IMM_EAGER = 3 };
#define VB_IMM(kind, nstripes, seq)                                                     \
    ((uint32_t)(kind) << 30 | (uint32_t)((nstripes) - 1) << 24 | ((uint32_t)(seq) & 0xffffffu))
#define VB_IMM_KIND(imm) ((imm) >> 30)
#define VB_IMM_STRIPES(imm) ((((imm) >> 24) & 0x3fu) + 1)
#define VB_IMM_SEQ(imm) ((imm) & 0xffffffu)
#define VB_MAX_STRIPES 64

/* What a rank publishes in the rank table: its port, little endian. */
struct vb_addr {
    uint32_t magic;
    uint16_t version;
    uint8_t link_layer; /* IBV_LINK_LAYER_* */
    uint8_t port;
    uint16_t lid;
    uint8_t mtu;        /* enum ibv_mtu, active */
    uint8_t nqps;
    uint8_t gid[16];
    uint32_t gid_index;
    uint8_t cm;         /* 1: queue pairs to us connect through rdma_cm at cm_ip:cm_port */
    uint8_t cm_family;  /* AF_INET or AF_INET6 */
    uint16_t cm_port;   /* network order */
    uint8_t cm_ip[16];
    char dev[32];
};

/* What two ranks exchange over their authenticated tcp connection to join
 * their queue pairs (fixed size, little endian). */
struct vb_qpinfo {
    uint32_t magic;
    uint32_t nqps;
    uint32_t qpn[VB_MAX_QPS];
    uint32_t psn[VB_MAX_QPS];
    uint64_t fifo_addr;  /* our FIFO: the peer writes descriptors there */
    uint32_t fifo_rkey;
    uint32_t mtu;
    uint32_t lid;
    uint8_t gid[16];
    uint8_t nonce[16];   /* rdma_cm: connection requests prove they know it */
};

/* One FIFO slot: a receive buffer described to the sender. */
struct vb_desc {
    uint64_t addr;
    uint64_t len;
    uint32_t rkey;
    uint32_t seq;   /* the message's sequence number + 1 (0: never written) */
    uint32_t eager_done; /* small messages the writer has consumed so far */
    uint32_t pad;
};
_Static_assert(sizeof(struct vb_desc) == 32, "a descriptor is 32 bytes");

/* What one peer writes into, registered once per rank: descriptors for our
 * sends, and slots for its small messages to us. */
struct vb_peer_mem {
    struct vb_desc desc[VB_FIFO];
    uint8_t eager[VB_FIFO][VB_INLINE];
};

/* A small message that arrived before its receive was described. */
struct vb_eager {
    uint32_t seq, slot, len;
};
_Static_assert(sizeof(struct vb_addr) <= WEFT_TRANSPORT_ADDR_MAX, "vb_addr must fit");

struct vb_ctx;
struct vb_conn;
struct rdma_cm_id;
struct rdma_event_channel;

/*
 * One isend or irecv.  Owner: ctx's request pool; the caller borrows it
 * until test() says done.  `wrs` counts the work requests of this request
 * whose completion is still due: a request is recycled only when it has
 * been returned to the caller AND wrs is 0, so a late completion never
 * touches a recycled request.  base.bytes: send, the message's bytes;
 * recv, the bytes landed.
 */
struct vb_req {
    struct weft_req base;       /* its conn, buffer, posted length, status */
    bool returned;
    uint32_t seq;               /* message number in its direction */
    uint32_t stripes, got;      /* recv: stripes announced, stripes landed */
    uint32_t wrs;               /* completions still due */
    bool writing;               /* send: written, counted in its conn's `writing` */
    struct weft_rc_entry *mr;   /* cache entry holding buf, or NULL */
    struct weft_bounce *bounce; /* bounce buffer in use, or NULL */
} __attribute__((aligned(64))); /* its address is a work request id */

struct vb_qp {
    struct ibv_qp *qp;
    struct vb_conn *conn;
    int index;
    uint32_t sq_used;                 /* WRs posted, not yet retired */
    uint32_t unsignaled;              /* since the last signalled one */
    uint32_t sig_retire[VB_SQ_DEPTH]; /* per signalled WR, in post order: WRs it retires */
    uint32_t sig_head, sig_tail;
    struct rdma_cm_id *cm_id;         /* rdma_cm: the id that owns qp */
    bool up;                          /* RTS toward the peer */
} __attribute__((aligned(64))); /* its address is a work request id */

enum { VB_IDLE, VB_WAIT_PEER, VB_READY, VB_FAILED };
enum { VB_PH_INFO, VB_PH_READY, VB_PH_WATCH };

/*
 * Everything toward one peer.  Owner: ctx (conns[peer]).  Sends and
 * receives each queue in posting order; `sdesc` counts descriptors the
 * peer has written into our FIFO, `rdesc` those we wrote into the peer's.
 */
struct vb_conn {
    struct weft_conn base;           /* failure record */
    struct vb_ctx *ctx;
    int peer;
    int state;
    struct vb_addr addr;             /* peer's published port */
    void *oob;                       /* tcp conn to the peer */
    void *oob_rreq;                  /* the receive of this phase */
    void *oob_sreq[2];               /* our info, our ready */
    int phase;                       /* VB_PH_*: what oob_rreq receives */
    uint32_t ready_out, ready_in;
    uint8_t watch_byte;              /* the watch's buffer: nothing may arrive */
    struct vb_qpinfo mine, theirs;
    bool peer_gone;                  /* the watch saw the peer leave while idle */
    bool cm;                         /* queue pairs through rdma_cm (both sides publish it) */
    bool got_info, ready_sent, peer_ready;
    int nup;                         /* queue pairs up */
    int nqps;
    struct vb_qp qps[VB_MAX_QPS];
    struct vb_peer_mem *mem;         /* ours, written by the peer */
    uint64_t peer_fifo;              /* the peer's struct vb_peer_mem for us */
    uint32_t peer_fifo_rkey;
    /* sends */
    struct weft_req_queue sq;        /* posted, not yet written (struct vb_req) */
    uint32_t nsend;                  /* sends posted */
    uint32_t nwritten;               /* sends written, eagerly or to a descriptor */
    uint32_t writing;                /* written sends whose completion is still due */
    uint32_t sdesc;                  /* descriptors arrived */
    bool desc_seen[VB_FIFO];         /* slot holds an unread descriptor */
    uint32_t eager_out;              /* small messages sent eagerly */
    uint32_t eager_credit;           /* of those, consumed by the peer (its latest word) */
    /* receives */
    struct weft_req_queue rq;        /* posted, not yet described (struct vb_req) */
    uint32_t nrecv;                  /* receives posted */
    uint32_t rdesc;                  /* descriptors written */
    struct vb_req *rslot[VB_FIFO];   /* described receives, by seq % VB_FIFO */
    uint32_t eager_in;               /* small messages arrived */
    uint32_t eager_done;             /* small messages consumed (copied out) */
    struct vb_eager pend[VB_FIFO];   /* arrived before their receive was described */
    uint32_t pend_head, npend;
    struct vb_conn *next_work;       /* ctx work list: something to move */
    struct vb_conn *next_setup;      /* ctx setup list: exchange in flight */
    bool on_work, on_setup;
};

/*
 * One rank's verbs transport.  Owner: the engine via init/finalize.  One
 * thread drives it at a time; the waker thread only reads the completion
 * channel and calls the sleeper's wakeup.
 */
struct vb_ctx {
    struct weft_errsink *err;
    int rank, nranks;
    uint8_t secret[WEFT_SECRET_BYTES];
    const struct weft_transport_ops *oob_ops; /* tcp */
    void *oob_ctx;
    void **oob_conn;                /* (nranks) from vb_bind_oob */
    struct ibv_context *dev;
    bool dev_borrowed;              /* rdma_cm's context: not ours to close */
    struct rdma_event_channel *cm_chan; /* NULL: queue pairs set up by hand */
    struct rdma_cm_id *cm_listen;
    int cm_setup;                   /* conns whose rdma_cm connection is not up yet */
    uint16_t cm_port;               /* the listener's, network order */
    union weft_sockaddr cm_src;     /* the listener's address, port 0: what we resolve from */
    struct ibv_pd *pd;
    struct ibv_comp_channel *chan;
    struct ibv_cq *cq;
    char devname[64];
    int port, nqps;
    struct vb_addr me;
    struct ibv_port_attr pattr;
    int timeout, retry_cnt, tc, sl, max_inline;
    bool regcache_all;              /* WEFT_IB_REGCACHE: cache any user buffer */
    bool finished;                  /* a request finished since the last sleep_begin */
    struct vb_conn **conns;         /* (nranks) */
    struct vb_conn *work;           /* conns with something to do */
    struct vb_conn *setup;          /* conns whose exchange is in flight */
    uint64_t next_sweep;            /* ns: next look at every conn's out-of-band receive */
    struct weft_req_pool reqs;      /* of struct vb_req */
    struct weft_regcache rc;        /* registers with pd (verbs_mem.c) */
    struct ibv_mr *fifo_mr;
    char *fifo_mem;                 /* (nranks * VB_FIFO) descriptors, registered once */
    weft_status_t fatal;            /* set by a fatal async event */
    char fatalmsg[VB_ERRMSG_LEN];
    struct weft_waker waker;
    int stopfd;                     /* eventfd: ends the waker */
};

/* ---- verbs.c ------------------------------------------------------------------ */
void vb_conn_fail(struct vb_conn *c, weft_status_t st, const char *fmt, ...) WEFT_HIDDEN
    WEFT_PRINTF(3, 4);
void vb_work_add(struct vb_conn *c) WEFT_HIDDEN;
/* Handles every completion waiting; returns how many. */
int vb_poll_cq(struct vb_ctx *ctx) WEFT_HIDDEN;
/* Posts n receives (no buffer: writes with immediate carry their own). */
weft_status_t vb_post_recv(struct vb_qp *q, int n) WEFT_HIDDEN;

/* ---- verbs_setup.c ------------------------------------------------------------ */
/* Creates c's queue pairs (INIT, receives posted) and sends our info. */
weft_status_t vb_conn_start(struct vb_conn *c) WEFT_HIDDEN;
/* Advances the out-of-band exchange; returns true if something moved. */
bool vb_conn_setup(struct vb_conn *c) WEFT_HIDDEN;
/* (Pure) the peer's info, n bytes from the wire, for conn c. */
weft_status_t vb_qpinfo_check(const struct vb_qpinfo *q, size_t n, int nqps, bool cm, char *why,
                              size_t whylen) WEFT_HIDDEN;
/* Reads one async event if any; a fatal one fails the context. */
void vb_async_drain(struct vb_ctx *ctx) WEFT_HIDDEN;
weft_tp_init_fn vb_init WEFT_HIDDEN;
weft_tp_connect_fn vb_connect WEFT_HIDDEN;
/* The descriptor's bind_oob: before connect(peer), the tcp connection to
 * that peer, which carries the queue pair exchange. */
void vb_bind_oob(void *vctx, int peer, void *oob_conn) WEFT_HIDDEN;
weft_tp_finalize_fn vb_finalize WEFT_HIDDEN;

/* Our queue pairs are up and the peer's info is here: say ready. */
void vb_conn_try_ready(struct vb_conn *c) WEFT_HIDDEN;
/* Posts the receives of a new queue pair and records its number. */
weft_status_t vb_qp_prepare(struct vb_conn *c, struct vb_qp *q) WEFT_HIDDEN;
/* The init attributes of every queue pair of ctx. */
void vb_qp_init_attr(struct vb_ctx *ctx, struct vb_qp *q, struct ibv_qp_init_attr *ia) WEFT_HIDDEN;

/* ---- verbs_cm.c: rdma_cm (built without librdmacm, vb_cm_open says no) ------------ */
/* WEFT_IB_CM=auto: binds a listener to local's address; true when rdma_cm
 * works there and its device passes the filter (ctx->dev is then its
 * context, borrowed). */
bool vb_cm_open(struct vb_ctx *ctx, const union weft_sockaddr *local, const void *filter) WEFT_HIDDEN;
/* The lower rank of a pair: starts one connection per queue pair. */
weft_status_t vb_cm_connect(struct vb_conn *c) WEFT_HIDDEN;
/* Handles every connection manager event waiting. */
void vb_cm_drain(struct vb_ctx *ctx) WEFT_HIDDEN;
void vb_cm_qp_destroy(struct vb_qp *q) WEFT_HIDDEN;
void vb_cm_close(struct vb_ctx *ctx) WEFT_HIDDEN;
/* The connection request's private data, and its check (pure). */
#define VB_CM_MAGIC 0x314d4357u /* "WCM1" */
struct vb_cm_req {
    uint32_t magic;
    uint32_t rank;
    uint32_t qp;
    uint8_t proof[32];   /* HMAC(secret, "weft-cm" nonce rank qp) */
};
void vb_cm_proof(const uint8_t *secret, const uint8_t *nonce, uint32_t rank, uint32_t qp,
                 uint8_t out[32]) WEFT_HIDDEN;

/* ---- verbs_mem.c --------------------------------------------------------------- */
/* Makes ctx->rc register with ctx->pd (read at each registration, the
 * first of which comes after init). */
void vb_mem_init(struct vb_ctx *ctx) WEFT_HIDDEN;
/* The verbs registration behind a cache entry's or bounce buffer's handle. */
static inline struct ibv_mr *vb_mr(void *handle)
{
    return handle;
}
/* weft_mem_register: a pinned entry of ctx->rc (its handle is the entry). */
weft_status_t vb_reg_mem(void *vctx, void *buf, size_t bytes, void **mh) WEFT_HIDDEN;
weft_status_t vb_dereg_mem(void *vctx, void *mh) WEFT_HIDDEN;

/* ---- the registry's view (verbs.c, verbs_desc.c) ------------------------------- */
extern const struct weft_transport_ops weft_verbs_ops WEFT_HIDDEN;
extern const struct weft_transport_desc weft_verbs_desc WEFT_HIDDEN;

#endif /* WEFT_TRANSPORT_VERBS_H */
