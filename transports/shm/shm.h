/*
 * shm.h - private to the shared-memory transport: the layout of a rank's
 * segment (one incoming ring per peer), the address it publishes, and the
 * request, connection and context structs shared by the data path (shm.c)
 * and setup (shm_setup.c).
 */
#ifndef WEFT_TRANSPORT_SHM_H
#define WEFT_TRANSPORT_SHM_H

#include <stdalign.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/queue.h>
#include <sys/types.h>

#include "transports/transport.h"
#include "transports/util/util.h"

#define SHM_SEG_MAGIC 0x31304d5354464557ull /* "WEFTSM01" in memory */
#define SHM_ADDR_MAGIC 0x41534657u          /* "WFSA" */
#define SHM_VERSION 2
#define SHM_LINE 64
#define SHM_WHY_LEN 384                     /* a failure reason, as the peer reads it */
#define SHM_CHECK_NS (100ull * 1000000ull)  /* a stalled peer's pid is checked this often */
#define SHM_CMA_CHUNK (4u << 20)            /* bytes per process_vm_readv call */

/* Defaults of the parameters (read with getenv until the param table has
 * them; see shm_setup.c for WEFT_SHM_CMA_MIN's default and why). */
#define SHM_DEFAULT_SLOTS 8
#define SHM_DEFAULT_SLOT_BYTES (256u << 10)
#define SHM_DEFAULT_MAX_BYTES (32u << 20) /* a rank's segment; see ring_fit() */
#define SHM_MIN_SLOT_BYTES (16u << 10)    /* ring_fit() shrinks slots no further */
#define SHM_DEFAULT_LL_BYTES 16384
#define SHM_LL_MAX (1u << 20)
#define SHM_DEFAULT_DIR "/dev/shm"

/* What a slot carries (shm_slot.kind). */
enum { SHM_KIND_DATA = 1, SHM_KIND_CMA = 2 };

/*
 * The descriptor of one slot, one cache line.  Owner: whoever `full` says
 * (0: the producer may write the slot, 1: the consumer may read it); the
 * flag is stored with release after every other field and loaded with
 * acquire before any is read.  Everything here comes from another process:
 * the reader copies it once and checks it before use.
 */
struct shm_slot {
    alignas(SHM_LINE) _Atomic uint32_t full;
    uint32_t kind;      /* SHM_KIND_* */
    uint64_t seq;       /* message number in this direction */
    uint64_t msglen;    /* bytes of the whole message */
    uint64_t off;       /* DATA: offset of this chunk in the message */
    uint64_t len;       /* DATA: bytes in this slot's data */
    uint64_t addr;      /* CMA: the message in the producer's memory */
    uint32_t nack;      /* CMA, set by the consumer: "could not pull, send it through the ring" */
};

/*
 * The header of one ring (producer: the peer, consumer: the segment's
 * owner), followed by its slot descriptors; the slot data follows at the
 * next page.  The consumer's line is written only by the consumer, the
 * producer's line only by the producer, so neither bounces.
 */
struct shm_ring {
    /* Consumer's control line(s): whether it can pull by CMA, and its
     * failure record (why is written before failed is released). */
    alignas(SHM_LINE) _Atomic uint32_t cma_ok;
    _Atomic uint32_t failed;
    char why[SHM_WHY_LEN];
    alignas(SHM_LINE) _Atomic uint64_t head; /* slots filled so far (producer) */
    alignas(SHM_LINE) _Atomic uint64_t tail; /* slots emptied so far (consumer) */
    struct shm_slot slot[];                  /* (nslots) */
    /* Then, at shm_ll_off(nslots), two short-message slots (shm_ll_slot
     * bytes each): the producer's k-th message goes in slot k % 2. */
};

/* A short message: its number (the flag, stored last with release, so a
 * reader that sees it sees the rest) and length, then its data; up to 48
 * bytes travel in the flag's own cache line. */
struct shm_ll {
    alignas(SHM_LINE) _Atomic uint64_t flag; /* the message's number, from 1 */
    uint64_t len;
    unsigned char data[];
};

static inline size_t shm_ll_off(uint32_t nslots)
{
    size_t end = sizeof(struct shm_ring) + (size_t)nslots * sizeof(struct shm_slot);
    return (end + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
}

static inline size_t shm_ll_slot(size_t ll_bytes)
{
    return (sizeof(struct shm_ll) + ll_bytes + SHM_LINE - 1) / SHM_LINE * SHM_LINE;
}

/*
 * The first page of a rank's segment.  Written once by the owner at init,
 * except doorbell (incremented by any peer that made progress toward the
 * owner while it sleeps; the owner's futex word) and sleeping (the owner).
 */
struct shm_seg {
    uint64_t magic;
    uint32_t version;
    int32_t rank, nranks;
    int32_t pid;
    uint64_t job;
    uint32_t nslots;
    uint32_t ll_bytes;     /* capacity of each ring's short-message slots */
    uint64_t slot_bytes;   /* bytes of data per slot */
    uint64_t hdr_bytes;    /* this header, rounded up to a page */
    uint64_t ring_bytes;   /* per ring: header page(s) + slot data */
    uint64_t ring_hdr_bytes;
    uint64_t seg_bytes;
    uint64_t probe_addr;   /* a word in the owner's memory, read to test CMA */
    uint64_t probe_value;
    alignas(SHM_LINE) _Atomic uint32_t doorbell;
    _Atomic uint32_t sleeping;
};

/* The published address (WEFT_TRANSPORT_ADDR_MAX bytes at most). */
#define SHM_ADDR_PATH 1u /* name is a file path (WEFT_SHM_DIR), not a shm_open name */
struct shm_addr {
    uint32_t magic, version;
    int32_t pid, rank;
    uint32_t flags;
    char name[WEFT_TRANSPORT_ADDR_MAX - 20];
};
_Static_assert(sizeof(struct shm_addr) <= WEFT_TRANSPORT_ADDR_MAX,
               "a published shm address must fit WEFT_TRANSPORT_ADDR_MAX");

struct shm_ctx;
struct shm_conn;

/*
 * One isend or irecv.  Owner: ctx's request pool; the caller borrows the
 * handle until test() reports it done or failed.  While base.status is
 * WEFT_INPROGRESS it sits in its conn's queue.  base.bytes is the message's
 * length (recv: from its first slot).
 */
struct shm_req {
    struct weft_req base;   /* its conn, buffer, posted length, status */
    size_t done;            /* send: bytes put in slots; recv: bytes taken out */
    uint64_t seq;           /* message number in this direction of conn */
    uint64_t cma_slot;      /* send by CMA: ring position of its slot */
    bool started;           /* a slot of it has been written (send) or read (recv) */
    bool cma;               /* send: published for the peer to pull; waits for the ack */
    bool no_cma;            /* send: the peer refused to pull it; the ring carries it */
    weft_take_fn take;      /* recv by irecv_take: offered each chunk first */
    void *take_arg;
};

/*
 * Everything toward one peer.  Owner: ctx (conns[peer]), made by connect,
 * freed at finalize.  tx is our ring in the peer's segment (mapped here),
 * rx the peer's ring in ours.  Once base.err is set (sticky), both queues
 * are empty and stay so.  `active` <=> linked into ctx's work list <=> a
 * queue is not empty.
 */
struct shm_conn {
    struct weft_conn base;              /* failure record */
    struct shm_ctx *ctx;
    int peer;
    pid_t pid;
    int pidfd;                          /* -1: checked with kill() (or not at all) */
    bool pid_visible;                   /* false: the peer's pid is not ours to check */
    bool active, moved;                 /* moved: since the last liveness check */
    LIST_ENTRY(shm_conn) work;          /* ctx work list */
    struct shm_addr addr;
    /* Send side. */
    struct shm_seg *peer_seg;           /* the first page(s) of the peer's segment */
    size_t peer_seg_bytes;
    struct shm_ring *tx;
    char *tx_data;                      /* (tx_nslots, tx_slot_bytes) */
    void *tx_map;
    size_t tx_map_bytes;
    uint32_t tx_nslots;
    size_t tx_slot_bytes;
    /* Receive side (geometry of ctx). */
    struct shm_ring *rx;
    char *rx_data;
    uint64_t nsend, nrecv;              /* messages posted per direction */
    /* Short messages: our two slots in the peer's ring, the peer's in
     * ours, their capacities, and the messages put and taken so far. */
    char *ll_tx, *ll_rx;
    size_t ll_tx_bytes, ll_rx_bytes;
    uint64_t ll_sent, ll_got;
    struct weft_req_queue sq, rq;       /* sends, receives (struct shm_req) */
};

/* Counters for tests and logs; one context's view. */
struct weft_shm_stats {
    uint64_t ring_sends;   /* messages sent through the ring */
    uint64_t cma_sends;    /* messages the peer pulled with process_vm_readv */
    uint64_t cma_nacks;    /* CMA sends the peer refused (resent through the ring) */
    uint64_t cma_pulls;    /* messages we pulled */
    uint64_t sleeps;       /* futex waits */
};

/*
 * One rank's transport.  Owner: the engine, through init/finalize.  Used by
 * one thread at a time, except wake_pending and the doorbell (wakeup, any
 * thread).  seg is our segment, mapped for the whole context; its name is
 * unlinked by ready() or finalize.
 */
struct shm_ctx {
    struct weft_errsink *err;
    int rank, nranks;
    int *group, ngroup;                 /* ranks with a ring here (ascending); NULL: all */
    pid_t pid;
    uint64_t job;
    struct shm_seg *seg;
    size_t seg_bytes;
    char name[sizeof(((struct shm_addr *)0)->name)];
    bool use_path, unlinked;
    uint32_t nslots;
    size_t slot_bytes, ring_hdr_bytes, ring_bytes, page;
    size_t cma_min;                     /* sends this long or longer go by CMA; 0: never */
    size_t ll_bytes;                    /* short-message capacity of our rings */
    bool cma_broken;                    /* we cannot pull (EPERM/ENOSYS): ring only */
    volatile uint64_t probe;            /* read by peers to test CMA */
    _Atomic uint32_t wake_pending;
    struct shm_conn **conns;            /* (nranks) NULL until connected */
    LIST_HEAD(, shm_conn) work;         /* conns with requests */
    size_t nactive;
    unsigned passes;
    uint64_t next_check;                /* ns: next liveness check of stalled peers */
    struct weft_req_pool reqs;          /* of struct shm_req */
    struct weft_shm_stats stats;
    /* Sleeping in another transport (shm_set_waker). */
    struct weft_waker waker;
    _Atomic int waker_stop;
};

/* ---- shm.c ---------------------------------------------------------------- */

/* Fails conn for good: records why, tells the peer through our ring's
 * failure record, fails every queued request. */
void shm_conn_fail(struct shm_conn *c, weft_status_t status, const char *fmt, ...)
    WEFT_HIDDEN WEFT_PRINTF(3, 4);
/* The message for a peer that failed the connection on its side: its
 * failure record's reason, after ours (SHM_FAILURE_LEN holds it whole). */
#define SHM_FAILURE_LEN (SHM_WHY_LEN + 96)
void shm_peer_failure(const struct shm_conn *c, char *msg, size_t len) WEFT_HIDDEN;
/* Rings the peer's doorbell if it sleeps (after a fence: see shm.c). */
void shm_signal(struct shm_conn *c) WEFT_HIDDEN;

/* ---- shm_setup.c ---------------------------------------------------------- */

weft_tp_init_fn shm_init WEFT_HIDDEN;
weft_tp_connect_fn shm_connect WEFT_HIDDEN;
weft_status_t shm_ready(void *vctx) WEFT_HIDDEN;
weft_tp_finalize_fn shm_finalize WEFT_HIDDEN;
/* Ends the waker thread, if any (shm.c). */
void shm_waker_stop(struct shm_ctx *ctx) WEFT_HIDDEN;
/* True when the peer's process has exited (or is a zombie). */
bool shm_peer_dead(struct shm_conn *c) WEFT_HIDDEN;

/* ---- shm_ll.c: short messages (transport.h's ll_* ops) ----------------- */

size_t shm_ll_bytes(void *conn) WEFT_HIDDEN;
void shm_ll_put(void *conn, const void *buf, size_t len) WEFT_HIDDEN;
const void *shm_ll_get(void *conn, size_t *len) WEFT_HIDDEN;
weft_status_t shm_ll_check(void *conn) WEFT_HIDDEN;

/* For tests and benchmarks: this context's counters. */
void weft_shm_get_stats(void *ctx, struct weft_shm_stats *out) WEFT_HIDDEN;

/* ---- the registry's view (shm.c, shm_desc.c) ---------------------------------- */
extern const struct weft_transport_ops weft_shm_ops WEFT_HIDDEN;
extern const struct weft_transport_desc weft_shm_desc WEFT_HIDDEN;


#endif /* WEFT_TRANSPORT_SHM_H */
