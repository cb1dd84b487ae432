/* softverbs.h - internal state of the software RC verbs device used by the
 * tests.  softverbs.c owns devices, contexts, PDs, MRs, CQs, completion
 * channels and async events; sv_qp.c owns QPs and their queues; sv_wire.c
 * owns the per-context service thread and the protocol between processes;
 * sv_cm.c emulates librdmacm's connection manager on top of them. */
#ifndef WEFT_SOFTVERBS_H
#define WEFT_SOFTVERBS_H

#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>

#define SV_MAX_SGE 16
#define SV_MAX_INLINE 256
#define SV_MAX_WR 4096
#define SV_MAX_CQE 65536
#define SV_MAX_GID 16
#define SV_PATH_MAX 108 /* sizeof(sockaddr_un.sun_path) */

/* Objects of a context counted by kind (sv_context.nobj). */
enum { SV_PD, SV_CQ, SV_CHANNEL, SV_NKINDS };

/* Event queues are a head and a tail (&last->next, &head when empty):
 * takes the first into e (NULL when empty).  Callers hold the lock. */
#define SV_QUEUE_POP(head, tail, e)                                                       \
    do {                                                                                  \
        (e) = (head);                                                                     \
        if ((e) && !((head) = (e)->next))                                                 \
            (tail) = &(head);                                                             \
    } while (0)

/* One fake HCA; the table is built once per process and never freed. */
struct sv_device {
    struct ibv_device ibv;
    int index;
    uint64_t guid; /* network byte order, per process and device */
};

/* Parsed WEFT_SOFTVERBS_FAULT; zero means off. */
struct sv_fault {
    uint64_t fail_n;
    enum ibv_wc_status fail_status;
    uint64_t delay_us;
    uint64_t kill_qp_n;
    uint64_t port_down_ms; /* 0: never */
    uint64_t cm_reject_n;  /* sv_cm.c: the N-th CONNECT_REQUEST is rejected */
};

struct sv_event {
    struct ibv_async_event ev;
    struct sv_event *next;
};

struct sv_pd {
    struct ibv_pd ibv;
    int refs; /* MRs and QPs on it */
};

struct sv_mr {
    struct ibv_mr ibv;
    int access;
    struct sv_mr *next;
};

/* One queued "CQ has an event" on a channel; the eventfd counts them. */
struct sv_cq_ev {
    struct sv_cq *cq;
    struct sv_cq_ev *next;
};

struct sv_channel {
    struct ibv_comp_channel ibv;
    struct sv_cq_ev *head, **tail;
};

/* Ring of cqe entries.  events_got/acked follow rdma-core's rule that a CQ
 * with unacknowledged events cannot be destroyed. */
struct sv_cq {
    struct ibv_cq ibv;
    struct sv_channel *channel;
    struct ibv_wc *ring;
    int size, head, count;
    bool armed, overflowed;
    unsigned events_got, events_acked;
};

/* A growable byte queue for the non-blocking sockets. */
struct sv_buf {
    char *data;
    size_t len, cap, off;
};

enum sv_sock_kind { SV_SOCK_LISTEN, SV_SOCK_IN, SV_SOCK_OUT };

/* A socket of the service thread.  Freed only by the reaper at the top of
 * the service loop, so an epoll event fetched before a close never points
 * at freed memory. */
struct sv_sock {
    int fd;
    enum sv_sock_kind kind;
    struct sv_qp *qp;
    struct sv_buf in, out;
    bool closing, want_out;
    /* inbound only: who connected and what it believes it reached */
    bool hello;
    pid_t peer_pid;
    uint32_t src_qpn;
    uint8_t dgid[16];
    uint16_t dlid;
    uint32_t expect; /* next request seq (go-back-N after a NAK) */
    struct sv_sock *next;
};

/* A send WQE.  sge holds requester virtual addresses, read by the
 * responder with process_vm_readv; inline data is copied at post time. */
struct sv_swqe {
    uint64_t wr_id;
    enum ibv_wr_opcode opcode;
    bool signaled, inl;
    uint32_t seq, imm, rkey, len; /* len: bytes */
    uint64_t raddr;
    int nsge;
    struct iovec sge[SV_MAX_SGE];
    uint8_t data[SV_MAX_INLINE];
    enum ibv_wc_status preset; /* fails with this when it reaches the head */
    uint64_t post_ns;
    int rnr_left; /* -1: forever */
};

struct sv_rwqe {
    uint64_t wr_id;
    int nsge;
    struct iovec sge[SV_MAX_SGE];
    uint64_t len;
    bool bad_lkey;
};

enum sv_conn { SV_CONN_NONE, SV_CONN_UP, SV_CONN_RETRY, SV_CONN_LOST };

/* An RC QP.  SQ and RQ are rings indexed by free-running counters:
 * head <= send <= tail; head..send are on the wire, send..tail not yet. */
struct sv_qp {
    struct ibv_qp ibv;
    struct ibv_qp_attr attr;
    struct ibv_qp_cap cap;
    bool sig_all, zombie, freed;
    struct sv_swqe *sq;
    uint32_t sq_head, sq_send, sq_tail, next_seq;
    struct sv_rwqe *rq;
    uint32_t rq_head, rq_tail;
    struct sv_sock *listen, *out;
    enum sv_conn conn;
    uint64_t lost_ns;   /* when the path broke; 0 while healthy */
    uint64_t retry_at;  /* next connect attempt */
    uint64_t resend_at; /* after an RNR or not-ready NAK */
    char path[SV_PATH_MAX];
    struct sv_qp *next;
};

struct sv_context {
    struct ibv_context ibv;
    struct sv_device *dev;
    pthread_mutex_t lock; /* everything below, and every object's state */
    pthread_cond_t cond;  /* signalled when the reaper frees a QP */
    pthread_t thread;
    bool stop;
    int epfd, doorbell, lid_fd;
    char dir[SV_PATH_MAX - 20]; /* room for /qp-<qpn> */
    bool link_ib;
    enum ibv_port_state port_state;
    uint16_t lid;
    union ibv_gid gid[SV_MAX_GID];
    int ngid;
    struct sv_fault fault;
    uint64_t open_ns, send_cqes, send_posts;
    int nobj[SV_NKINDS]; /* PDs, CQs and channels open, which close waits on */
    struct sv_mr *mrs;
    struct sv_qp *qps;
    struct sv_sock *socks;
    struct sv_event *ev_head, **ev_tail;
};

static inline struct sv_context *sv_ctx(struct ibv_context *c)
{
    return (struct sv_context *)c;
}

static inline struct sv_swqe *sq_at(struct sv_qp *qp, uint32_t i)
{
    return &qp->sq[i % qp->cap.max_send_wr];
}

static inline struct sv_rwqe *rq_at(struct sv_qp *qp, uint32_t i)
{
    return &qp->rq[i % (qp->cap.max_recv_wr ? qp->cap.max_recv_wr : 1)];
}

/* softverbs.c */
uint64_t sv_now_ns(void);
/* Zeroed memory, or NULL with errno ENOMEM, as a verbs call reports it. */
void *sv_zalloc(size_t n);
void sv_cq_push(struct sv_context *ctx, struct sv_cq *cq, const struct ibv_wc *wc);
void sv_async_event(struct sv_context *ctx, enum ibv_event_type type, struct ibv_qp *qp);
struct sv_mr *sv_mr_find(struct sv_context *ctx, uint32_t key, bool remote);
void sv_ring(struct sv_context *ctx);

/* sv_wire.c */
void *sv_service(void *arg);
/* Zeroed size bytes, fd watched for input on epfd with them as the
 * event's data; NULL (nothing watched) on failure. */
void *sv_watch_new(int epfd, int fd, size_t size);
/* Closes s's fd and frees it, unlinked from ctx->socks. */
void sv_sock_free(struct sv_sock *s);
void sv_qp_set_err(struct sv_context *ctx, struct sv_qp *qp);
void sv_qp_close_conns(struct sv_context *ctx, struct sv_qp *qp);
struct sv_sock *sv_sock_new(struct sv_context *ctx, int fd, enum sv_sock_kind kind,
                            struct sv_qp *qp);
void sv_push_send_wc(struct sv_context *ctx, struct sv_qp *qp, const struct sv_swqe *w,
                     enum ibv_wc_status st);
void sv_push_recv_wc(struct sv_context *ctx, struct sv_qp *qp, uint64_t wr_id,
                     enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len,
                     bool with_imm, uint32_t imm, uint32_t src_qp);
int sv_bind_unique(const char *dir, const char *prefix, uint32_t lo, uint32_t span,
                   uint32_t *id, char *path);

/* sv_qp.c */
int sv_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
int sv_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad);

#endif
