/* test_softverbs.c - the software verbs device (tests/softverbs) against
 * the real libibverbs: every test forks one or two peers that re-execute
 * this binary with the device preloaded, exchange QP numbers, GIDs, rkeys
 * and addresses over a socketpair, and check what hardware would do.  The
 * cm_* scenarios drive the device's connection manager (sv_cm.c) through
 * the real librdmacm's entry points.  Peers look their scenario up in one
 * table (scenarios[]): a pair of QPs, or of connection manager ids, is set
 * up and closed the same way for all, each row saying what differs. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SOFTVERBS_LIB
#error "SOFTVERBS_LIB must name build/libweft-softverbs.so"
#endif

/* ---- peer side: runs with the device preloaded ---- */

extern char **environ;

static const char *role = "?";
static int peer_fd = -1;

#define CHECK(c)                                                                        \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "peer %s: %s:%d: CHECK(%s) failed (errno %d: %s)\n", role,  \
                    __FILE__, __LINE__, #c, errno, strerror(errno));                    \
            exit(1);                                                                    \
        }                                                                               \
    } while (0)

struct info {
    uint32_t qpn, rkey;
    uint16_t lid;
    union ibv_gid gid;
    uint64_t addr;
    pid_t pid;
};

struct side {
    struct ibv_context *ctx;
    struct ibv_pd *pd;
    struct ibv_comp_channel *ch;
    struct ibv_cq *cq;
    struct ibv_qp *qp;
    struct ibv_mr *mr;
    char *buf;
    size_t len;
    int gid_index;
};

struct qpopt {
    int sq, rq;
    uint8_t timeout, retry, rnr_retry, min_rnr;
    int access;
    bool channel;
};

static const struct qpopt dflt = {64, 64, 14, 2, 7, 1,
                                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                      IBV_ACCESS_REMOTE_READ,
                                  false};

static uint64_t now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void full_io(bool wr, void *p, size_t n)
{
    char *c = p;

    while (n) {
        ssize_t r = wr ? write(peer_fd, c, n) : read(peer_fd, c, n);

        CHECK(r > 0);
        c += r;
        n -= (size_t)r;
    }
}

static void sync_peer(void)
{
    char b = 1;

    full_io(true, &b, 1);
    full_io(false, &b, 1);
}

static void open_side(struct side *s, size_t len, const struct qpopt *o)
{
    struct ibv_device **list = ibv_get_device_list(NULL);
    struct ibv_qp_init_attr ia = {0};
    struct ibv_port_attr pa;

    memset(s, 0, sizeof(*s));
    CHECK(list && list[0]);
    s->ctx = ibv_open_device(list[0]);
    CHECK(s->ctx);
    ibv_free_device_list(list);
    CHECK(ibv_query_port(s->ctx, 1, &pa) == 0);
    s->gid_index = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? 1 : 0;
    s->pd = ibv_alloc_pd(s->ctx);
    CHECK(s->pd);
    if (o->channel) {
        s->ch = ibv_create_comp_channel(s->ctx);
        CHECK(s->ch);
    }
    s->cq = ibv_create_cq(s->ctx, 256, s, s->ch, 0);
    CHECK(s->cq);
    s->len = len;
    s->buf = calloc(1, len ? len : 1);
    CHECK(s->buf);
    s->mr = ibv_reg_mr(s->pd, s->buf, len, o->access);
    CHECK(s->mr);
    ia.send_cq = ia.recv_cq = s->cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = (uint32_t)o->sq;
    ia.cap.max_recv_wr = (uint32_t)o->rq;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 4;
    ia.cap.max_inline_data = 64;
    s->qp = ibv_create_qp(s->pd, &ia);
    CHECK(s->qp);
}

static void my_info(struct side *s, struct info *i)
{
    struct ibv_port_attr pa;

    memset(i, 0, sizeof(*i));
    CHECK(ibv_query_port(s->ctx, 1, &pa) == 0);
    CHECK(ibv_query_gid(s->ctx, 1, s->gid_index, &i->gid) == 0);
    i->lid = pa.lid;
    i->qpn = s->qp->qp_num;
    i->rkey = s->mr->rkey;
    i->addr = (uintptr_t)s->buf;
    i->pid = getpid();
}

static void exchange(struct side *s, struct info *peer)
{
    struct info mine;

    my_info(s, &mine);
    full_io(true, &mine, sizeof(mine));
    full_io(false, peer, sizeof(*peer));
}

static void to_rts(struct side *s, const struct info *p, const struct qpopt *o)
{
    struct ibv_qp_attr a = {0};

    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
                                       IBV_QP_ACCESS_FLAGS) == 0);
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_4096;
    a.dest_qp_num = p->qpn;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = o->min_rnr;
    a.ah_attr.port_num = 1;
    a.ah_attr.dlid = p->lid;
    if (!p->lid) {
        a.ah_attr.is_global = 1;
        a.ah_attr.grh.dgid = p->gid;
        a.ah_attr.grh.sgid_index = (uint8_t)s->gid_index;
        a.ah_attr.grh.hop_limit = 1;
    }
    CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) == 0);
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = o->timeout;
    a.retry_cnt = o->retry;
    a.rnr_retry = o->rnr_retry;
    a.max_rd_atomic = 16;
    CHECK(ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                       IBV_QP_MAX_QP_RD_ATOMIC) == 0);
}

static void wait_wc(struct side *s, struct ibv_wc *wc, int ms)
{
    uint64_t end = now_ms() + (uint64_t)ms;
    int n;

    while ((n = ibv_poll_cq(s->cq, 1, wc)) == 0) {
        CHECK(now_ms() < end);
        usleep(100);
    }
    CHECK(n == 1);
}

static void expect_wc(struct side *s, uint64_t wr_id, enum ibv_wc_status st)
{
    struct ibv_wc wc;

    wait_wc(s, &wc, 10000);
    if (wc.wr_id != wr_id || wc.status != st)
        fprintf(stderr, "peer %s: got wr_id %llu status %s, want %llu %s\n", role,
                (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status),
                (unsigned long long)wr_id, ibv_wc_status_str(st));
    CHECK(wc.wr_id == wr_id && wc.status == st);
}

static void no_more_wc(struct side *s, int ms)
{
    struct ibv_wc wc;

    usleep((useconds_t)ms * 1000);
    CHECK(ibv_poll_cq(s->cq, 1, &wc) == 0);
}

static void wait_stopped(pid_t pid)
{
    char path[64], buf[256], *st;
    uint64_t end = now_ms() + 5000;

    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    for (;;) {
        FILE *f = fopen(path, "r");

        CHECK(f && fgets(buf, sizeof(buf), f));
        fclose(f);
        st = strrchr(buf, ')');
        if (st && st[2] == 'T')
            return;
        CHECK(now_ms() < end);
        usleep(1000);
    }
}

static uint32_t lkey_xor; /* corrupts the lkey post() uses */

static int post(struct side *s, enum ibv_wr_opcode op, uint64_t wr_id, size_t off, uint32_t len,
                const struct info *p, uint64_t roff, uint32_t rkey, int flags, uint32_t imm)
{
    struct ibv_sge sg = {(uintptr_t)s->buf + off, len, s->mr->lkey ^ lkey_xor};
    struct ibv_send_wr wr = {0}, *bad = NULL;
    int rc;

    wr.wr_id = wr_id;
    wr.opcode = op;
    wr.send_flags = (unsigned)flags;
    wr.sg_list = &sg;
    wr.num_sge = len ? 1 : 0;
    wr.imm_data = htonl(imm);
    if (p) {
        wr.wr.rdma.remote_addr = p->addr + roff;
        wr.wr.rdma.rkey = rkey;
    }
    rc = ibv_post_send(s->qp, &wr, &bad);
    if (rc)
        CHECK(bad == &wr);
    return rc;
}

static void post_recv(struct side *s, uint64_t wr_id, size_t off, uint32_t len)
{
    struct ibv_sge sg = {(uintptr_t)s->buf + off, len, s->mr->lkey};
    struct ibv_recv_wr wr = {.wr_id = wr_id, .sg_list = &sg, .num_sge = 1}, *bad;

    CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
}

static void fill(char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        b[i] = (char)((i * 2654435761u + seed) >> 13);
}

static bool filled(const char *b, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] != (char)((i * 2654435761u + seed) >> 13))
            return false;
    return true;
}

static void teardown(struct side *s)
{
    if (s->qp)
        CHECK(ibv_destroy_qp(s->qp) == 0);
    CHECK(ibv_dereg_mr(s->mr) == 0);
    CHECK(ibv_destroy_cq(s->cq) == 0);
    if (s->ch)
        CHECK(ibv_destroy_comp_channel(s->ch) == 0);
    CHECK(ibv_dealloc_pd(s->pd) == 0);
    CHECK(ibv_close_device(s->ctx) == 0);
    free(s->buf);
}

static bool is_a(void)
{
    return role[0] == 'a';
}

static const size_t MiB = 1 << 20;

static int scn_query(void)
{
    const char *link = getenv("WEFT_SOFTVERBS_LINK");
    bool ib = link && !strcmp(link, "ib");
    struct ibv_device **list;
    struct ibv_device_attr da;
    struct ibv_port_attr pa;
    struct ibv_context *ctx;
    union ibv_gid g;
    int n = -1;
    bool lo = false;

    list = ibv_get_device_list(&n);
    CHECK(list && n == 2 && list[2] == NULL);
    CHECK(!strcmp(ibv_get_device_name(list[0]), "softverbs0"));
    CHECK(!strcmp(ibv_get_device_name(list[1]), "softverbs1"));
    CHECK(ibv_get_device_guid(list[0]) != ibv_get_device_guid(list[1]));
    ctx = ibv_open_device(list[1]);
    CHECK(ctx);
    ibv_free_device_list(list);
    CHECK(ibv_query_device(ctx, &da) == 0);
    CHECK(da.max_qp_wr == 4096 && da.max_sge == 16 && da.max_cqe == 65536 &&
          da.max_qp_rd_atom == 16 && da.phys_port_cnt == 1 && da.max_mr_size >= (1ull << 32));
    CHECK(ibv_query_port(ctx, 1, &pa) == 0);
    CHECK(pa.state == IBV_PORT_ACTIVE && pa.active_mtu == IBV_MTU_4096 &&
          pa.max_mtu == IBV_MTU_4096);
    CHECK(pa.link_layer == (ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET));
    CHECK(ib ? pa.lid != 0 : pa.lid == 0);
    CHECK(ibv_query_gid(ctx, 1, 0, &g) == 0);
    CHECK(g.raw[0] == 0xfe && g.raw[1] == 0x80);
    for (int i = 1; ibv_query_gid(ctx, 1, i, &g) == 0; i++) {
        static const uint8_t want[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};

        CHECK(!ib);
        lo = lo || !memcmp(g.raw, want, 16);
    }
    CHECK(ib || lo);
    CHECK(ibv_query_port(ctx, 2, &pa) != 0);
    {
        /* only RC; bad transitions are refused */
        struct ibv_pd *pd = ibv_alloc_pd(ctx);
        struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
        struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
                                      .cap = {.max_send_wr = 1, .max_recv_wr = 1}};
        struct ibv_qp_attr a = {.qp_state = IBV_QPS_RTS};
        struct ibv_qp *qp;
        struct ibv_send_wr wr = {.opcode = IBV_WR_RDMA_WRITE}, *bad;

        CHECK(pd && cq);
        errno = 0;
        CHECK(!ibv_create_qp(pd, &ia) && errno == EOPNOTSUPP);
        ia.qp_type = IBV_QPT_RC;
        qp = ibv_create_qp(pd, &ia);
        CHECK(qp && qp->qp_num < (1u << 24));
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL);
        a.qp_state = IBV_QPS_INIT;
        a.port_num = 1;
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT) == EINVAL);
        CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX |
                                        IBV_QP_ACCESS_FLAGS) == 0);
        CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL && bad == &wr);
        CHECK(ibv_query_qp(qp, &a, IBV_QP_STATE, &ia) == 0 && a.qp_state == IBV_QPS_INIT);
        CHECK(ibv_dealloc_pd(pd) == EBUSY);
        CHECK(ibv_close_device(ctx) != 0);
        CHECK(ibv_destroy_qp(qp) == 0);
        CHECK(ibv_destroy_cq(cq) == 0);
        CHECK(!ibv_alloc_mw(pd, IBV_MW_TYPE_1) && errno == EOPNOTSUPP);
        CHECK(ibv_dealloc_pd(pd) == 0);
    }
    CHECK(ibv_close_device(ctx) == 0);
    return 0;
}

static int scn_badfault(void)
{
    struct ibv_device **list = ibv_get_device_list(NULL);

    CHECK(list);
    errno = 0;
    CHECK(ibv_open_device(list[0]) == NULL && errno == EINVAL);
    ibv_free_device_list(list);
    return 0;
}

static int count_dir(const char *path)
{
    DIR *d = opendir(path);
    int n = 0;

    CHECK(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Two QPs of one context talking to each other, then everything closed:
 * no fd and no thread may outlive the context. */
static int scn_fdleak(void)
{
    int fds = count_dir("/proc/self/fd"), tasks = count_dir("/proc/self/task");

    for (int round = 0; round < 3; round++) {
        struct side s, t;
        struct info si, ti;

        open_side(&s, MiB, &dflt);
        t = s;
        {
            struct ibv_qp_init_attr ia = {.send_cq = s.cq, .recv_cq = s.cq, .qp_type = IBV_QPT_RC,
                                          .cap = {.max_send_wr = 8, .max_recv_wr = 8,
                                                  .max_send_sge = 1, .max_recv_sge = 1}};

            t.qp = ibv_create_qp(s.pd, &ia);
            CHECK(t.qp);
        }
        my_info(&s, &si);
        my_info(&t, &ti);
        to_rts(&s, &ti, &dflt);
        to_rts(&t, &si, &dflt);
        fill(s.buf, 4096, 7);
        CHECK(post(&s, IBV_WR_RDMA_WRITE, 1, 0, 4096, &ti, 8192, ti.rkey, IBV_SEND_SIGNALED, 0) == 0);
        expect_wc(&s, 1, IBV_WC_SUCCESS);
        CHECK(filled(s.buf + 8192, 4096, 7));
        CHECK(count_dir("/proc/self/task") == tasks + 1);
        CHECK(ibv_destroy_qp(t.qp) == 0);
        teardown(&s);
    }
    CHECK(count_dir("/proc/self/fd") == fds);
    /* a joined thread can linger in /proc for a moment */
    for (int i = 0; i < 100 && count_dir("/proc/self/task") != tasks; i++)
        usleep(10000);
    CHECK(count_dir("/proc/self/task") == tasks);
    return 0;
}

/* ---- QP scenarios: one setup and teardown, what each side does in a table ---- */

/* A 64-byte RDMA WRITE to the start of the peer's buffer. */
static void write_64(struct side *s, const struct info *p, uint64_t wr_id, int flags)
{
    CHECK(post(s, IBV_WR_RDMA_WRITE, wr_id, 0, 64, p, 0, p->rkey, flags, 0) == 0);
}

/* One signalled, wr_id 1, that must complete with st; returns the ms it
 * took. */
static uint64_t write_64_ms(struct side *s, const struct info *p, enum ibv_wc_status st)
{
    uint64_t t0 = now_ms();

    write_64(s, p, 1, IBV_SEND_SIGNALED);
    expect_wc(s, 1, st);
    return now_ms() - t0;
}

static void write_a(struct side *s, const struct info *p)
{
    fill(s->buf, s->len, 1);
    CHECK(post(s, IBV_WR_RDMA_WRITE, 7, 0, (uint32_t)s->len, p, 0, p->rkey, IBV_SEND_SIGNALED,
               0) == 0);
    expect_wc(s, 7, IBV_WC_SUCCESS);
    sync_peer();
}

static void write_b(struct side *s, const struct info *p)
{
    sync_peer(); /* no verbs call at all on the target */
    CHECK(filled(s->buf, s->len, 1));
    no_more_wc(s, 10);
}

static void write_imm_prep(struct side *s)
{
    if (!is_a()) {
        post_recv(s, 100, 0, 0);
        post_recv(s, 101, 0, 0);
    }
}

static void write_imm_a(struct side *s, const struct info *p)
{
    fill(s->buf, MiB, 3);
    CHECK(post(s, IBV_WR_RDMA_WRITE_WITH_IMM, 1, 0, 65536, p, 4096, p->rkey, 0, 0xabcd) == 0);
    CHECK(post(s, IBV_WR_RDMA_WRITE_WITH_IMM, 2, 0, 0, p, 0, 0, IBV_SEND_SIGNALED, 7) == 0);
    expect_wc(s, 2, IBV_WC_SUCCESS); /* the unsignalled first made none */
    no_more_wc(s, 10);
}

static void write_imm_b(struct side *s, const struct info *p)
{
    struct ibv_wc wc;

    wait_wc(s, &wc, 10000);
    CHECK(filled(s->buf + 4096, 65536, 3)); /* data before the CQE */
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 100 &&
          wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && (wc.wc_flags & IBV_WC_WITH_IMM) &&
          ntohl(wc.imm_data) == 0xabcd && wc.byte_len == 65536 && wc.qp_num == s->qp->qp_num);
    wait_wc(s, &wc, 10000);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 101 && wc.byte_len == 0 &&
          ntohl(wc.imm_data) == 7);
}

static void send_recv_prep(struct side *s)
{
    struct ibv_sge sg[2] = {{(uintptr_t)s->buf, 100, s->mr->lkey},
                            {(uintptr_t)s->buf + 1000, 5000, s->mr->lkey}};
    struct ibv_recv_wr wr = {.wr_id = 10, .sg_list = sg, .num_sge = 2}, *bad;

    if (is_a())
        return;
    CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0);
    post_recv(s, 11, 8192, 64);
    post_recv(s, 12, 16384, 16);
}

static void send_recv_a(struct side *s, const struct info *p)
{
    fill(s->buf, 8192, 5);
    CHECK(post(s, IBV_WR_SEND, 1, 0, 3000, NULL, 0, 0, IBV_SEND_SIGNALED, 0) == 0);
    CHECK(post(s, IBV_WR_SEND_WITH_IMM, 2, 4096, 50, NULL, 0, 0,
               IBV_SEND_SIGNALED | IBV_SEND_INLINE, 42) == 0);
    memset(s->buf + 4096, 0, 50); /* inline data was copied at post time */
    expect_wc(s, 1, IBV_WC_SUCCESS);
    expect_wc(s, 2, IBV_WC_SUCCESS);
    sync_peer();
    /* longer than the posted buffer */
    CHECK(post(s, IBV_WR_SEND, 3, 0, 17, NULL, 0, 0, IBV_SEND_SIGNALED, 0) == 0);
    expect_wc(s, 3, IBV_WC_REM_INV_REQ_ERR);
}

static void send_recv_b(struct side *s, const struct info *p)
{
    char want[8192];
    struct ibv_wc wc;

    fill(want, sizeof(want), 5);
    wait_wc(s, &wc, 10000);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 10 && wc.opcode == IBV_WC_RECV &&
          wc.byte_len == 3000 && !(wc.wc_flags & IBV_WC_WITH_IMM));
    CHECK(!memcmp(s->buf, want, 100) && !memcmp(s->buf + 1000, want + 100, 2900));
    wait_wc(s, &wc, 10000);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 && wc.byte_len == 50 &&
          (wc.wc_flags & IBV_WC_WITH_IMM) && ntohl(wc.imm_data) == 42);
    CHECK(!memcmp(s->buf + 8192, want + 4096, 50));
    sync_peer();
    expect_wc(s, 12, IBV_WC_LOC_LEN_ERR);
}

static void read_prep(struct side *s)
{
    if (!is_a())
        fill(s->buf, s->len, 11);
}

static void read_a(struct side *s, const struct info *p)
{
    CHECK(post(s, IBV_WR_RDMA_READ, 1, 4096, (uint32_t)MiB, p, 0, p->rkey, IBV_SEND_SIGNALED,
               0) == 0);
    expect_wc(s, 1, IBV_WC_SUCCESS);
    CHECK(filled(s->buf + 4096, MiB, 11));
}

static void sq_10(struct qpopt *o)
{
    o->sq = 10;
}

static void signal_a(struct side *s, const struct info *p)
{
    struct ibv_wc wc[16];
    int got = 0;

    for (int i = 0; i < 10; i++)
        CHECK(post(s, IBV_WR_RDMA_WRITE, (uint64_t)i, 0, 128, p, 0, p->rkey,
                   i % 5 == 4 ? IBV_SEND_SIGNALED : 0, 0) == 0 || i > 9);
    /* the queue is full until they complete */
    {
        struct ibv_send_wr w2 = {.wr_id = 99, .opcode = IBV_WR_RDMA_WRITE}, w1 = w2, *bad = NULL;
        int rc;

        w1.next = &w2;
        rc = ibv_post_send(s->qp, &w1, &bad);
        /* either both fit because some completed already, or one bounced */
        CHECK(rc == 0 || (rc == ENOMEM && (bad == &w1 || bad == &w2)));
        if (rc == 0 || bad == &w2)
            got -= rc == 0 ? 2 : 1; /* they make no CQEs: unsignalled */
    }
    got = 0;
    for (uint64_t end = now_ms() + 5000; got < 2 && now_ms() < end;)
        got += ibv_poll_cq(s->cq, 16 - got, wc + got);
    CHECK(got == 2 && wc[0].wr_id == 4 && wc[1].wr_id == 9);
    no_more_wc(s, 50);
}

/* Full send queue: with the peer stopped nothing completes, so the bound is
 * exact. */
static void sq_4_no_timeout(struct qpopt *o)
{
    o->sq = 4;
    o->timeout = 0; /* never give up while the peer is stopped */
}

static void sqfull_a(struct side *s, const struct info *p)
{
    struct ibv_send_wr w[6] = {{0}}, *bad = NULL;

    CHECK(kill(p->pid, SIGSTOP) == 0);
    wait_stopped(p->pid);
    for (int i = 0; i < 6; i++) {
        w[i].wr_id = (uint64_t)i;
        w[i].opcode = IBV_WR_RDMA_WRITE;
        w[i].send_flags = IBV_SEND_SIGNALED;
        w[i].next = i < 5 ? &w[i + 1] : NULL;
    }
    CHECK(ibv_post_send(s->qp, w, &bad) == ENOMEM && bad == &w[4]);
    kill(p->pid, SIGCONT);
    for (int i = 0; i < 4; i++)
        expect_wc(s, (uint64_t)i, IBV_WC_SUCCESS);
}

static void bad_rkey_a(struct side *s, const struct info *p)
{
    write_64(s, p, 1, 0);
    CHECK(post(s, IBV_WR_RDMA_WRITE, 2, 0, 64, p, 0, p->rkey ^ 0x5a5a, 0, 0) == 0);
    write_64(s, p, 3, 0);
    CHECK(post(s, IBV_WR_RDMA_READ, 4, 0, 64, p, 0, p->rkey, IBV_SEND_SIGNALED, 0) == 0);
    expect_wc(s, 2, IBV_WC_REM_ACCESS_ERR);
    expect_wc(s, 3, IBV_WC_WR_FLUSH_ERR);
    expect_wc(s, 4, IBV_WC_WR_FLUSH_ERR);
    write_64(s, p, 5, 0);
    expect_wc(s, 5, IBV_WC_WR_FLUSH_ERR);
}

/* The next async event: of type want, on s's QP or port 1. */
static void expect_async(struct side *s, enum ibv_event_type want)
{
    struct ibv_async_event ev;

    CHECK(ibv_get_async_event(s->ctx, &ev) == 0);
    CHECK(ev.event_type == want &&
          (want == IBV_EVENT_PORT_ERR ? ev.element.port_num == 1 : ev.element.qp == s->qp));
    ibv_ack_async_event(&ev);
}

static void bad_rkey_b(struct side *s, const struct info *p)
{
    expect_async(s, IBV_EVENT_QP_ACCESS_ERR);
}

/* Writes past the end of the MR, reads without REMOTE_READ, a local SGE
 * with a bad lkey. */
static void past_mr_end_a(struct side *s, const struct info *p)
{
    CHECK(post(s, IBV_WR_RDMA_WRITE, 1, 0, 8192, p, MiB - 4096, p->rkey, 0, 0) == 0);
    expect_wc(s, 1, IBV_WC_REM_ACCESS_ERR);
}

static void no_remote_read(struct qpopt *o)
{
    o->access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
}

static void read_refused_a(struct side *s, const struct info *p)
{
    CHECK(post(s, IBV_WR_RDMA_READ, 1, 0, 64, p, 0, p->rkey, 0, 0) == 0);
    expect_wc(s, 1, IBV_WC_REM_ACCESS_ERR);
}

static void bad_lkey_a(struct side *s, const struct info *p)
{
    lkey_xor = 1;
    write_64(s, p, 1, 0);
    lkey_xor = 0;
    expect_wc(s, 1, IBV_WC_LOC_PROT_ERR);
}

static void rnr_2_retries(struct qpopt *o)
{
    o->rnr_retry = 2;
    o->min_rnr = 14; /* 1.28 ms */
}

static void rnr_a(struct side *s, const struct info *p)
{
    CHECK(post(s, IBV_WR_SEND, 1, 0, 64, NULL, 0, 0, IBV_SEND_SIGNALED, 0) == 0);
    expect_wc(s, 1, IBV_WC_RNR_RETRY_EXC_ERR);
}

/* RNR then a late recv: the retried SEND lands. */
static void rnr_10ms(struct qpopt *o)
{
    o->min_rnr = 20; /* 10 ms */
}

static void rnr_late_a(struct side *s, const struct info *p)
{
    fill(s->buf, 64, 9);
    CHECK(post(s, IBV_WR_SEND, 1, 0, 64, NULL, 0, 0, IBV_SEND_SIGNALED, 0) == 0);
    expect_wc(s, 1, IBV_WC_SUCCESS);
}

static void rnr_late_b(struct side *s, const struct info *p)
{
    struct ibv_wc wc;

    usleep(100000);
    post_recv(s, 5, 0, 64);
    wait_wc(s, &wc, 10000);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 5 && filled(s->buf, 64, 9));
}

/* b is killed before a's writes... */
static void killed_a(struct side *s, const struct info *p)
{
    uint64_t t0, dt;

    CHECK(kill(p->pid, SIGKILL) == 0);
    usleep(100000);
    t0 = now_ms();
    write_64(s, p, 1, IBV_SEND_SIGNALED);
    write_64(s, p, 2, 0);
    expect_wc(s, 1, IBV_WC_RETRY_EXC_ERR);
    dt = now_ms() - t0;
    /* 4.096 us * 2^14 * (2 + 1) = 201 ms */
    fprintf(stderr, "peer a: RETRY_EXC_ERR after %llu ms\n", (unsigned long long)dt);
    CHECK(dt >= 190 && dt < 1500);
    expect_wc(s, 2, IBV_WC_WR_FLUSH_ERR);
}

/* ... or dies with them already on its socket. */
static void killed_inflight_a(struct side *s, const struct info *p)
{
    write_64_ms(s, p, IBV_WC_SUCCESS); /* connected */
    CHECK(kill(p->pid, SIGSTOP) == 0);
    wait_stopped(p->pid);
    write_64(s, p, 2, IBV_SEND_SIGNALED);
    usleep(20000);
    CHECK(kill(p->pid, SIGKILL) == 0);
    expect_wc(s, 2, IBV_WC_RETRY_EXC_ERR);
}

/* a's QP points at a QP number nobody has, or somebody who does not
 * expect it (qpn_xor). */
static void wrong_qpn_a(struct side *s, const struct info *p)
{
    CHECK(write_64_ms(s, p, IBV_WC_RETRY_EXC_ERR) >= 190);
}

static void with_channel(struct qpopt *o)
{
    o->channel = true;
}

static void recv_77_on_b(struct side *s)
{
    if (!is_a())
        post_recv(s, 77, 0, 64);
}

static void channel_a(struct side *s, const struct info *p)
{
    sync_peer();
    CHECK(post(s, IBV_WR_SEND, 1, 0, 64, NULL, 0, 0, IBV_SEND_SIGNALED, 0) == 0);
    expect_wc(s, 1, IBV_WC_SUCCESS);
}

/* A non-blocking channel: no event until the completion, one then; and
 * what holds up destroying the CQ and the channel. */
static void channel_b(struct side *s, const struct info *p)
{
    struct pollfd pfd = {.fd = s->ch->fd, .events = POLLIN};
    struct ibv_cq *cq;
    void *cqctx;
    struct ibv_wc wc;

    CHECK(fcntl(s->ch->fd, F_SETFL, fcntl(s->ch->fd, F_GETFL) | O_NONBLOCK) == 0);
    CHECK(ibv_req_notify_cq(s->cq, 0) == 0);
    errno = 0;
    CHECK(ibv_get_cq_event(s->ch, &cq, &cqctx) == -1 && errno == EAGAIN);
    sync_peer();
    CHECK(poll(&pfd, 1, 10000) == 1);
    CHECK(ibv_get_cq_event(s->ch, &cq, &cqctx) == 0 && cq == s->cq && cqctx == s);
    CHECK(ibv_get_cq_event(s->ch, &cq, &cqctx) == -1 && errno == EAGAIN);
    CHECK(ibv_poll_cq(s->cq, 1, &wc) == 1 && wc.wr_id == 77);
    CHECK(ibv_destroy_qp(s->qp) == 0);
    s->qp = NULL;
    CHECK(ibv_destroy_cq(s->cq) == EBUSY); /* event not acknowledged */
    ibv_ack_cq_events(s->cq, 1);
    CHECK(ibv_destroy_comp_channel(s->ch) == EBUSY);
}

/* Five writes, the first signalled, on a whose device fails the third
 * (WEFT_SOFTVERBS_FAULT=fail=3:rem_access@0 with WEFT_RANK=0; b, rank 1,
 * ignores it): the rest flush and b's requests go unanswered. */
static void fault_fail_a(struct side *s, const struct info *p)
{
    for (int i = 1; i <= 5; i++)
        write_64(s, p, (uint64_t)i, i == 1 ? IBV_SEND_SIGNALED : 0);
    expect_wc(s, 1, IBV_WC_SUCCESS);
    expect_wc(s, 3, IBV_WC_REM_ACCESS_ERR);
    expect_wc(s, 4, IBV_WC_WR_FLUSH_ERR);
    expect_wc(s, 5, IBV_WC_WR_FLUSH_ERR);
    sync_peer();
}

static void fault_fail_b(struct side *s, const struct info *p)
{
    sync_peer();
    for (int i = 1; i <= 5; i++)
        write_64(s, p, (uint64_t)i, IBV_SEND_SIGNALED);
    /* a's QP is in error now: our requests are dropped */
    expect_wc(s, 1, IBV_WC_RETRY_EXC_ERR);
}

/* WEFT_SOFTVERBS_FAULT=delay=300000 on a. */
static void fault_delay_a(struct side *s, const struct info *p)
{
    CHECK(write_64_ms(s, p, IBV_WC_SUCCESS) >= 300);
}

/* WEFT_SOFTVERBS_FAULT=kill_qp=2 on a. */
static void fault_kill_qp_a(struct side *s, const struct info *p)
{
    write_64_ms(s, p, IBV_WC_SUCCESS);
    write_64(s, p, 2, 0);
    write_64(s, p, 3, 0);
    expect_wc(s, 2, IBV_WC_WR_FLUSH_ERR);
    expect_wc(s, 3, IBV_WC_WR_FLUSH_ERR);
    expect_async(s, IBV_EVENT_QP_FATAL);
    sync_peer();
}

static void fault_kill_qp_b(struct side *s, const struct info *p)
{
    sync_peer();
    write_64_ms(s, p, IBV_WC_RETRY_EXC_ERR);
}

/* WEFT_SOFTVERBS_FAULT=port_down=300 on a. */
static void recv_9(struct side *s)
{
    post_recv(s, 9, 0, 64);
}

static void fault_port_down_a(struct side *s, const struct info *p)
{
    struct ibv_port_attr pa;
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr ia;

    expect_async(s, IBV_EVENT_PORT_ERR);
    CHECK(ibv_query_port(s->ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN);
    CHECK(ibv_query_qp(s->qp, &qa, IBV_QP_STATE, &ia) == 0 && qa.qp_state == IBV_QPS_ERR);
    expect_wc(s, 9, IBV_WC_WR_FLUSH_ERR);
}

/*
 * A scenario a peer runs, by name.  run, where set, is the whole of it.
 * passive and active, where set, are b's and a's parts of a connection
 * through the connection manager (cm_pair).  Otherwise peers a and b each
 * have one RC QP connected to the other's, and run_qp_pair does the rest:
 * opens each side with len bytes registered (0: 1 MiB) and dflt changed by
 * tune, exchanges what the peers need to know (a XORs b's QP number with
 * qpn_xor), takes the QPs to RTS, runs prep on both sides, puts them in
 * step, runs a and b, puts them in step again and closes.
 */
struct scenario {
    const char *name;
    int (*run)(void);
    size_t len;
    void (*tune)(struct qpopt *o);
    uint32_t qpn_xor;
    void (*prep)(struct side *s);
    void (*a)(struct side *s, const struct info *p);
    void (*b)(struct side *s, const struct info *p);
    bool b_dies; /* b waits to be killed; a ends alone */
    void (*passive)(struct rdma_event_channel *ch, struct rdma_cm_id *l);
    void (*active)(struct rdma_event_channel *ch, const char *ip, uint16_t port);
};

/* ---- connection manager ---- */

struct cm_side {
    struct rdma_event_channel *ch;
    struct rdma_cm_id *id;
    struct ibv_pd *pd;
    struct ibv_cq *cq;
    struct ibv_mr *mr;
    char *buf;
};

/* What the passive side tells the active one in its accept. */
struct cm_offer {
    uint64_t addr;
    uint32_t rkey;
    pid_t pid;
};

static struct rdma_event_channel *cm_channel(void)
{
    struct rdma_event_channel *ch = rdma_create_event_channel();

    CHECK(ch);
    CHECK(fcntl(ch->fd, F_SETFL, fcntl(ch->fd, F_GETFL) | O_NONBLOCK) == 0);
    return ch;
}

static struct rdma_cm_event *cm_expect(struct rdma_event_channel *ch,
                                       enum rdma_cm_event_type want, int ms)
{
    struct pollfd pfd = {.fd = ch->fd, .events = POLLIN};
    uint64_t end = now_ms() + (uint64_t)ms;
    struct rdma_cm_event *ev;

    while (rdma_get_cm_event(ch, &ev)) {
        CHECK(errno == EAGAIN);
        CHECK(now_ms() < end);
        CHECK(poll(&pfd, 1, 50) >= 0);
    }
    if (ev->event != want)
        fprintf(stderr, "peer %s: got %s (status %d), want %s\n", role, rdma_event_str(ev->event),
                ev->status, rdma_event_str(want));
    CHECK(ev->event == want);
    return ev;
}

static void cm_no_event(struct rdma_event_channel *ch, int ms)
{
    struct rdma_cm_event *ev;

    usleep((useconds_t)ms * 1000);
    errno = 0;
    CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN);
}

static struct sockaddr_in cm_sin(const char *ip, uint16_t port_be)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = port_be};

    CHECK(inet_pton(AF_INET, ip, &sin.sin_addr) == 1);
    return sin;
}

/* PD, CQ and MR on the id's own context, and the QP through rdma_cm. */
static void cm_qp(struct cm_side *s, struct rdma_cm_id *id)
{
    struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
                                  .cap = {.max_send_wr = 16, .max_recv_wr = 16,
                                          .max_send_sge = 1, .max_recv_sge = 1}};

    CHECK(id->verbs && id->port_num == 1);
    s->pd = ibv_alloc_pd(id->verbs);
    CHECK(s->pd);
    s->cq = ibv_create_cq(id->verbs, 64, NULL, NULL, 0);
    CHECK(s->cq);
    s->buf = calloc(1, MiB);
    CHECK(s->buf);
    s->mr = ibv_reg_mr(s->pd, s->buf, MiB, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    CHECK(s->mr);
    ia.send_cq = ia.recv_cq = s->cq;
    CHECK(rdma_create_qp(id, s->pd, &ia) == 0 && id->qp);
    s->id = id;
}

static void cm_qp_free(struct cm_side *s)
{
    rdma_destroy_qp(s->id);
    CHECK(ibv_dereg_mr(s->mr) == 0);
    CHECK(ibv_destroy_cq(s->cq) == 0);
    CHECK(ibv_dealloc_pd(s->pd) == 0);
    free(s->buf);
}

static struct ibv_wc cm_wc(struct cm_side *s)
{
    uint64_t end = now_ms() + 10000;
    struct ibv_wc wc;
    int n;

    while ((n = ibv_poll_cq(s->cq, 1, &wc)) == 0) {
        CHECK(now_ms() < end);
        usleep(100);
    }
    CHECK(n == 1);
    return wc;
}

/* A listener on ip, its port sent to the peer. */
static struct rdma_cm_id *cm_listen(struct rdma_event_channel *ch, const char *ip, void *ctx)
{
    struct sockaddr_in sin = cm_sin(ip, 0);
    struct rdma_cm_id *l;
    uint16_t port;

    CHECK(rdma_create_id(ch, &l, ctx, RDMA_PS_TCP) == 0);
    CHECK(rdma_bind_addr(l, (struct sockaddr *)&sin) == 0);
    CHECK(rdma_listen(l, 8) == 0);
    port = rdma_get_src_port(l);
    CHECK(port != 0);
    full_io(true, &port, sizeof(port));
    return l;
}

/* Resolves and connects a new id with a QP; the outcome is the caller's. */
static void cm_dial(struct cm_side *s, struct rdma_event_channel *ch, const char *ip,
                    uint16_t port, const char *priv)
{
    struct sockaddr_in dst = cm_sin(ip, port);
    struct rdma_conn_param cp = {.private_data = priv,
                                 .private_data_len = (uint8_t)(strlen(priv) + 1),
                                 .responder_resources = 1, .initiator_depth = 1,
                                 .retry_count = 7, .rnr_retry_count = 7};
    struct rdma_cm_id *id;

    CHECK(rdma_create_id(ch, &id, s, RDMA_PS_TCP) == 0);
    CHECK(rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) == 0);
    rdma_ack_cm_event(cm_expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 5000));
    CHECK(rdma_resolve_route(id, 2000) == 0);
    rdma_ack_cm_event(cm_expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000));
    cm_qp(s, id);
    CHECK(rdma_get_dst_port(id) == port);
    CHECK(rdma_connect(id, &cp) == 0);
}

/* The passive side's CONNECT_REQUEST, checked against the listener. */
static struct rdma_cm_id *cm_request(struct rdma_event_channel *ch, struct rdma_cm_id *l,
                                     const char *want_priv)
{
    struct rdma_cm_event *ev = cm_expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, 10000);
    const char *p = ev->param.conn.private_data;
    size_t n = strlen(want_priv) + 1;
    struct rdma_cm_id *id = ev->id;

    CHECK(ev->listen_id == l && id != l && id->context == l->context && id->verbs);
    /* IB and RoCE deliver the whole REQ area, zero-padded */
    CHECK(ev->param.conn.private_data_len == 56 && !memcmp(p, want_priv, n));
    for (size_t i = n; i < 56; i++)
        CHECK(p[i] == 0);
    CHECK(ev->param.conn.retry_count == 7 && ev->param.conn.rnr_retry_count == 7);
    CHECK(rdma_get_src_port(id) == rdma_get_src_port(l));
    rdma_ack_cm_event(ev);
    return id;
}

static int scn_cm_basic(void)
{
    struct rdma_event_channel *ch = cm_channel();
    struct sockaddr_in far = cm_sin("192.0.2.1", htons(7471)), lo = cm_sin("127.0.0.1", 0);
    struct rdma_cm_id *a, *b, *c, *d;
    struct rdma_cm_event *ev;
    struct cm_side s = {0};
    struct rdma_addrinfo *res = NULL;
    uint8_t tos = 0;
    uint16_t a_port;
    int marker;

    errno = 0;
    CHECK(rdma_get_cm_event(ch, &ev) == -1 && errno == EAGAIN);
    errno = 0;
    CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_UDP) == -1 &&
          (errno == EINVAL || errno == EOPNOTSUPP));
    CHECK(rdma_create_id(ch, &a, &marker, RDMA_PS_TCP) == 0 && a->context == &marker);
    CHECK(a->verbs == NULL);
    errno = 0;
    CHECK(rdma_bind_addr(a, (struct sockaddr *)&far) == -1 && errno == EADDRNOTAVAIL);
    CHECK(rdma_bind_addr(a, (struct sockaddr *)&lo) == 0);
    CHECK(rdma_get_src_port(a) != 0 && a->verbs && a->port_num == 1);
    CHECK(((struct sockaddr_in *)rdma_get_local_addr(a))->sin_addr.s_addr == htonl(0x7f000001));
    /* the same port again is taken */
    lo.sin_port = a_port = rdma_get_src_port(a);
    CHECK(rdma_create_id(ch, &b, NULL, RDMA_PS_TCP) == 0);
    errno = 0;
    CHECK(rdma_bind_addr(b, (struct sockaddr *)&lo) == -1 && errno == EADDRINUSE);
    /* a is bound, not listening: a REQ to it finds nobody */
    CHECK(rdma_create_id(ch, &c, NULL, RDMA_PS_TCP) == 0);
    CHECK(rdma_connect(c, NULL) == -1 && errno == EINVAL); /* no route yet */
    CHECK(rdma_resolve_addr(c, NULL, (struct sockaddr *)&lo, 2000) == 0);
    ev = cm_expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 5000);
    CHECK(ev->id == c && ev->status == 0 && c->verbs == a->verbs && c->port_num == 1);
    rdma_ack_cm_event(ev);
    CHECK(((struct sockaddr_in *)rdma_get_peer_addr(c))->sin_port == lo.sin_port);
    CHECK(rdma_resolve_route(c, 2000) == 0);
    rdma_ack_cm_event(cm_expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000));
    errno = 0;
    CHECK(rdma_connect(c, NULL) == -1 && errno == EINVAL); /* no QP */
    cm_qp(&s, c);
    CHECK(rdma_connect(c, NULL) == 0);
    ev = cm_expect(ch, RDMA_CM_EVENT_UNREACHABLE, 5000);
    CHECK(ev->id == c);
    rdma_ack_cm_event(ev);
    {
        struct ibv_qp_attr qa;
        struct ibv_qp_init_attr qia;

        CHECK(ibv_query_qp(c->qp, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_ERR);
    }
    cm_qp_free(&s);
    /* nobody at all on that port; the id's own PD and CQs made by rdma_cm */
    CHECK(rdma_create_id(ch, &d, NULL, RDMA_PS_TCP) == 0);
    lo.sin_port = htons(1);
    CHECK(rdma_resolve_addr(d, NULL, (struct sockaddr *)&lo, 2000) == 0);
    rdma_ack_cm_event(cm_expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, 5000));
    CHECK(rdma_resolve_route(d, 2000) == 0);
    rdma_ack_cm_event(cm_expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, 5000));
    {
        struct ibv_qp_init_attr ia = {.qp_type = IBV_QPT_RC,
                                      .cap = {.max_send_wr = 4, .max_recv_wr = 4,
                                              .max_send_sge = 1, .max_recv_sge = 1}};

        CHECK(d->pd && rdma_create_qp(d, NULL, &ia) == 0 && d->send_cq && d->recv_cq);
    }
    CHECK(rdma_connect(d, NULL) == 0);
    ev = cm_expect(ch, RDMA_CM_EVENT_UNREACHABLE, 5000);
    CHECK(ev->id == d);
    rdma_ack_cm_event(ev);
    rdma_destroy_qp(d);
    /* the real librdmacm's own code on our objects fails, never crashes */
    CHECK(!strcmp(rdma_event_str(RDMA_CM_EVENT_ESTABLISHED), "RDMA_CM_EVENT_ESTABLISHED"));
    CHECK(rdma_set_option(b, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS, &tos, sizeof(tos)) != 0);
    if (rdma_getaddrinfo("127.0.0.1", "7471", NULL, &res) == 0)
        rdma_freeaddrinfo(res);
    {
        struct ibv_context **devs = rdma_get_devices(NULL);

        if (devs)
            rdma_free_devices(devs);
    }
    cm_no_event(ch, 10);
    CHECK(rdma_destroy_id(d) == 0);
    CHECK(rdma_destroy_id(c) == 0);
    CHECK(rdma_destroy_id(b) == 0);
    CHECK(rdma_destroy_id(a) == 0);
    /* the port is free again */
    CHECK(rdma_create_id(ch, &a, NULL, RDMA_PS_TCP) == 0);
    lo.sin_port = a_port;
    CHECK(rdma_bind_addr(a, (struct sockaddr *)&lo) == 0);
    CHECK(rdma_destroy_id(a) == 0);
    rdma_destroy_event_channel(ch);
    return 0;
}

/* ---- connection manager pairs: b listens, a dials ---- */

/* Frees what cm_qp made, and the id. */
static void cm_close(struct cm_side *s)
{
    cm_qp_free(s);
    CHECK(rdma_destroy_id(s->id) == 0);
}

/* b's side of a connection: the request with priv, a QP (recv_id's
 * receive posted on it, 0: none), the accept with cp (NULL: none) that
 * offers our buffer, then ESTABLISHED. */
static void cm_accept(struct cm_side *s, struct rdma_event_channel *ch, struct rdma_cm_id *l,
                      const char *priv, const struct rdma_conn_param *cp, uint64_t recv_id)
{
    struct rdma_cm_id *id = cm_request(ch, l, priv);
    struct rdma_conn_param offer = cp ? *cp : (struct rdma_conn_param){0};
    struct cm_offer o;
    struct rdma_cm_event *ev;

    cm_qp(s, id);
    if (recv_id)
        post_recv(&(struct side){.qp = id->qp, .buf = s->buf, .mr = s->mr}, recv_id, 0, 0);
    o = (struct cm_offer){.addr = (uintptr_t)s->buf, .rkey = s->mr->rkey, .pid = getpid()};
    offer.private_data = &o;
    offer.private_data_len = sizeof(o);
    CHECK(rdma_accept(id, cp ? &offer : NULL) == 0);
    ev = cm_expect(ch, RDMA_CM_EVENT_ESTABLISHED, 10000);
    CHECK(ev->id == id && ev->listen_id == NULL);
    rdma_ack_cm_event(ev);
}

/* a's side: dials ip:port with priv up to ESTABLISHED; returns b's offer
 * (zeros where b made none). */
static struct cm_offer cm_connect(struct cm_side *s, struct rdma_event_channel *ch,
                                  const char *ip, uint16_t port, const char *priv)
{
    struct cm_offer o;
    struct rdma_cm_event *ev;

    cm_dial(s, ch, ip, port, priv);
    ev = cm_expect(ch, RDMA_CM_EVENT_ESTABLISHED, 10000);
    CHECK(ev->id == s->id && ev->param.conn.private_data_len == 196);
    memcpy(&o, ev->param.conn.private_data, sizeof(o));
    rdma_ack_cm_event(ev);
    return o;
}

/* The next event is DISCONNECTED, on s's id. */
static void cm_disconnected(struct cm_side *s, struct rdma_event_channel *ch, int ms)
{
    struct rdma_cm_event *ev = cm_expect(ch, RDMA_CM_EVENT_DISCONNECTED, ms);

    CHECK(ev->id == s->id);
    rdma_ack_cm_event(ev);
}

/* A signalled RDMA WRITE WITH IMM of the first len bytes of s's buffer to
 * the peer's addr; returns its completion. */
static struct ibv_wc cm_write_imm(struct cm_side *s, uint64_t wr_id, uint32_t len,
                                  uint64_t addr, uint32_t rkey, uint32_t imm)
{
    struct ibv_sge sg = {(uintptr_t)s->buf, len, s->mr->lkey};
    struct ibv_send_wr wr = {.wr_id = wr_id, .sg_list = &sg, .num_sge = 1,
                             .opcode = IBV_WR_RDMA_WRITE_WITH_IMM,
                             .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(imm)},
                       *bad;

    wr.wr.rdma.remote_addr = addr;
    wr.wr.rdma.rkey = rkey;
    CHECK(ibv_post_send(s->id->qp, &wr, &bad) == 0);
    return cm_wc(s);
}

/* b listens on ip and tells a the port; then b runs passive, a active. */
static int cm_pair(const char *ip,
                   void (*passive)(struct rdma_event_channel *ch, struct rdma_cm_id *l),
                   void (*active)(struct rdma_event_channel *ch, const char *ip, uint16_t port))
{
    struct rdma_event_channel *ch = cm_channel();

    if (!is_a()) {
        struct rdma_cm_id *l = cm_listen(ch, ip, ch); /* ids it spawns inherit ch */

        passive(ch, l);
        CHECK(rdma_destroy_id(l) == 0);
    } else {
        uint16_t port;

        full_io(false, &port, sizeof(port));
        active(ch, ip, port);
    }
    rdma_destroy_event_channel(ch);
    return 0;
}

/* Listen, resolve, connect, accept; a WRITE WITH IMM over the QPs; then a
 * disconnects and both sides hear of it. */
static void connect_b(struct rdma_event_channel *ch, struct rdma_cm_id *l)
{
    struct rdma_conn_param cp = {.responder_resources = 1, .initiator_depth = 1,
                                 .rnr_retry_count = 7};
    struct cm_side s = {0};
    struct ibv_wc wc;

    cm_accept(&s, ch, l, "weft-cm-hello", &cp, 55);
    wc = cm_wc(&s);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 55 &&
          wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && ntohl(wc.imm_data) == 0xc0ffee &&
          wc.byte_len == 65536 && filled(s.buf + 4096, 65536, 11));
    cm_disconnected(&s, ch, 10000);
    CHECK(rdma_disconnect(s.id) == 0); /* answers; no second event */
    cm_no_event(ch, 50);
    cm_close(&s);
}

static void connect_a(struct rdma_event_channel *ch, const char *ip, uint16_t port)
{
    struct cm_side s = {0};
    struct cm_offer o = cm_connect(&s, ch, ip, port, "weft-cm-hello");
    struct ibv_wc wc;

    CHECK(((struct sockaddr_in *)rdma_get_peer_addr(s.id))->sin_port == port);
    fill(s.buf, 65536, 11);
    wc = cm_write_imm(&s, 9, 65536, o.addr + 4096, o.rkey, 0xc0ffee);
    CHECK(wc.wr_id == 9 && wc.status == IBV_WC_SUCCESS);
    CHECK(rdma_disconnect(s.id) == 0);
    cm_disconnected(&s, ch, 10000);
    /* the QP went to ERR: new work flushes */
    wc = cm_write_imm(&s, 10, 65536, o.addr + 4096, o.rkey, 0xc0ffee);
    CHECK(wc.wr_id == 10 && wc.status == IBV_WC_WR_FLUSH_ERR);
    cm_close(&s);
}

static const char reject_no[] = "not today";

static void reject_b(struct rdma_event_channel *ch, struct rdma_cm_id *l)
{
    struct rdma_cm_id *id = cm_request(ch, l, "please");

    CHECK(rdma_reject(id, reject_no, sizeof(reject_no)) == 0);
    CHECK(rdma_accept(id, NULL) == -1 && errno == EINVAL);
    sync_peer();
    cm_no_event(ch, 10);
    CHECK(rdma_destroy_id(id) == 0);
}

static void reject_a(struct rdma_event_channel *ch, const char *ip, uint16_t port)
{
    struct cm_side s = {0};
    struct rdma_cm_event *ev;
    struct ibv_qp_attr qa;
    struct ibv_qp_init_attr qia;

    cm_dial(&s, ch, ip, port, "please");
    ev = cm_expect(ch, RDMA_CM_EVENT_REJECTED, 10000);
    CHECK(ev->id == s.id && ev->status == 28 && ev->param.conn.private_data_len == 148 &&
          !memcmp(ev->param.conn.private_data, reject_no, sizeof(reject_no)));
    rdma_ack_cm_event(ev);
    CHECK(ibv_query_qp(s.id->qp, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_ERR);
    sync_peer();
    cm_close(&s);
}

/* b dies once connected: a hears DISCONNECTED. */
static void killed_b(struct rdma_event_channel *ch, struct rdma_cm_id *l)
{
    struct cm_side s = {0};

    cm_accept(&s, ch, l, "x", &(struct rdma_conn_param){0}, 0);
    for (;;)
        pause();
}

static void cm_killed_a(struct rdma_event_channel *ch, const char *ip, uint16_t port)
{
    struct cm_side s = {0};
    struct cm_offer o = cm_connect(&s, ch, ip, port, "x");
    uint64_t t0;

    usleep(50000); /* b is in pause() by now, or about to be */
    t0 = now_ms();
    CHECK(kill(o.pid, SIGKILL) == 0);
    cm_disconnected(&s, ch, 5000);
    fprintf(stderr, "peer a: DISCONNECTED %llu ms after the kill\n",
            (unsigned long long)(now_ms() - t0));
    CHECK(rdma_disconnect(s.id) == 0);
    cm_close(&s);
}

/* WEFT_SOFTVERBS_FAULT=cm_reject=1@1 on b (WEFT_RANK=1): the device rejects
 * the first request unseen; the second connects. */
static void fault_b(struct rdma_event_channel *ch, struct rdma_cm_id *l)
{
    struct cm_side s = {0};

    cm_accept(&s, ch, l, "second", NULL, 0);
    cm_disconnected(&s, ch, 10000);
    cm_no_event(ch, 10);
    cm_close(&s);
}

static void fault_a(struct rdma_event_channel *ch, const char *ip, uint16_t port)
{
    struct cm_side s = {0}, t = {0};
    struct rdma_cm_event *ev;
    const char *p;

    cm_dial(&s, ch, ip, port, "first");
    ev = cm_expect(ch, RDMA_CM_EVENT_REJECTED, 10000);
    p = ev->param.conn.private_data;
    CHECK(ev->id == s.id && ev->status == 28 && ev->param.conn.private_data_len == 148);
    for (int i = 0; i < 148; i++)
        CHECK(p[i] == 0);
    rdma_ack_cm_event(ev);
    cm_connect(&t, ch, ip, port, "second");
    CHECK(rdma_disconnect(t.id) == 0);
    cm_disconnected(&t, ch, 10000);
    cm_close(&t);
    cm_close(&s);
}

/* Each peer in its own network namespace with its own address on lo; the
 * registry is the filesystem, so the listener's IP still reaches it. */
static void netns_b(struct rdma_event_channel *ch, struct rdma_cm_id *l)
{
    struct cm_side s = {0};
    struct ibv_wc wc;

    cm_accept(&s, ch, l, "across", &(struct rdma_conn_param){0}, 3);
    CHECK(((struct sockaddr_in *)rdma_get_peer_addr(s.id))->sin_addr.s_addr ==
          inet_addr("10.77.0.1"));
    wc = cm_wc(&s);
    CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 3 && filled(s.buf, 4096, 5));
    cm_disconnected(&s, ch, 10000);
    cm_close(&s);
}

static void netns_a(struct rdma_event_channel *ch, const char *ip, uint16_t port)
{
    struct cm_side s = {0};
    struct cm_offer o = cm_connect(&s, ch, ip, port, "across");

    CHECK(((struct sockaddr_in *)rdma_get_local_addr(s.id))->sin_addr.s_addr ==
          inet_addr("10.77.0.1"));
    fill(s.buf, 4096, 5);
    CHECK(cm_write_imm(&s, 0, 4096, o.addr, o.rkey, 0).status == IBV_WC_SUCCESS);
    CHECK(rdma_disconnect(s.id) == 0);
    cm_disconnected(&s, ch, 10000);
    cm_close(&s);
}

static int scn_cm_netns(void)
{
    const char *mine = is_a() ? "10.77.0.1" : "10.77.0.2";
    struct ifreq ifr;
    struct sockaddr_in *sin = (struct sockaddr_in *)&ifr.ifr_addr;
    int fd;

    if (unshare(CLONE_NEWNET)) {
        fprintf(stderr, "peer %s: unshare(CLONE_NEWNET): %s: skipped\n", role, strerror(errno));
        return 77;
    }
    fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    CHECK(ioctl(fd, SIOCGIFFLAGS, &ifr) == 0);
    ifr.ifr_flags |= IFF_UP;
    CHECK(ioctl(fd, SIOCSIFFLAGS, &ifr) == 0);
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo:1");
    sin->sin_family = AF_INET;
    CHECK(inet_pton(AF_INET, mine, &sin->sin_addr) == 1);
    CHECK(ioctl(fd, SIOCSIFADDR, &ifr) == 0);
    close(fd);
    return cm_pair("10.77.0.2", netns_b, netns_a);
}

static int run_qp_pair(const struct scenario *c)
{
    struct qpopt o = dflt;
    struct side s;
    struct info p;
    void (*mine)(struct side *, const struct info *) = is_a() ? c->a : c->b;

    if (c->tune)
        c->tune(&o);
    open_side(&s, c->len ? c->len : MiB, &o);
    exchange(&s, &p);
    if (is_a())
        p.qpn ^= c->qpn_xor;
    to_rts(&s, &p, &o);
    if (c->prep)
        c->prep(&s);
    sync_peer();
    while (c->b_dies && !is_a())
        pause();
    if (mine)
        mine(&s, &p);
    if (!c->b_dies)
        sync_peer();
    teardown(&s);
    return 0;
}

/* Every scenario a test can ask a peer for. */
static const struct scenario scenarios[] = {
    {"query", .run = scn_query},
    {"badfault", .run = scn_badfault},
    {"fdleak", .run = scn_fdleak},
    {"write", .len = 4 * MiB, .a = write_a, .b = write_b},
    {"big", .len = 64 * MiB, .a = write_a, .b = write_b},
    {"write_imm", .prep = write_imm_prep, .a = write_imm_a, .b = write_imm_b},
    {"send_recv", .prep = send_recv_prep, .a = send_recv_a, .b = send_recv_b},
    {"read", .len = 2 * MiB, .prep = read_prep, .a = read_a},
    {"signal", .tune = sq_10, .a = signal_a},
    {"sqfull", .tune = sq_4_no_timeout, .a = sqfull_a},
    {"bad_rkey", .a = bad_rkey_a, .b = bad_rkey_b},
    {"past_mr_end", .a = past_mr_end_a},
    {"read_refused", .tune = no_remote_read, .a = read_refused_a},
    {"bad_lkey", .a = bad_lkey_a},
    {"rnr", .tune = rnr_2_retries, .a = rnr_a},
    {"rnr_late", .tune = rnr_10ms, .a = rnr_late_a, .b = rnr_late_b},
    {"killed", .a = killed_a, .b_dies = true},
    {"killed_inflight", .a = killed_inflight_a, .b_dies = true},
    {"wrong_qpn", .qpn_xor = 0x800001, .a = wrong_qpn_a},
    {"channel", .tune = with_channel, .prep = recv_77_on_b, .a = channel_a, .b = channel_b},
    {"fault_fail", .a = fault_fail_a, .b = fault_fail_b},
    {"fault_delay", .a = fault_delay_a},
    {"fault_kill_qp", .a = fault_kill_qp_a, .b = fault_kill_qp_b},
    {"fault_port_down", .prep = recv_9, .a = fault_port_down_a},
    {"cm_basic", .run = scn_cm_basic},
    {"cm_connect", .passive = connect_b, .active = connect_a},
    {"cm_reject", .passive = reject_b, .active = reject_a},
    {"cm_killed", .passive = killed_b, .active = cm_killed_a, .b_dies = true},
    {"cm_fault", .passive = fault_b, .active = fault_a},
    {"cm_netns", .run = scn_cm_netns},
};

static const struct scenario *find_scenario(const char *name)
{
    for (size_t i = 0; i < sizeof(scenarios) / sizeof(scenarios[0]); i++)
        if (!strcmp(scenarios[i].name, name))
            return &scenarios[i];
    return NULL;
}

static int peer_main(const char *scn, const char *r, int fd)
{
    const struct scenario *c = find_scenario(scn);

    role = r;
    peer_fd = fd;
    if (!c)
        return 2;
    if (c->run)
        return c->run();
    return c->passive ? cm_pair("127.0.0.1", c->passive, c->active) : run_qp_pair(c);
}

/* ---- test side: plain process, the device preloaded only in peers ---- */

/* A peer in role r ("a": WEFT_RANK=0, "b": 1) with env and env_more,
 * "NAME=value" lists separated by ';', added to its environment. */
static pid_t spawn(const char *scn, const char *r, int fd, const char *env, const char *env_more)
{
    pid_t pid = fork();

    cr_assert(pid >= 0);
    if (pid == 0) {
        char fdstr[16], e[512], *save = NULL;

        prctl(PR_SET_PDEATHSIG, SIGKILL);
        /* Criterion's worker markers would make the peer a test worker. */
        for (char **ev = environ; *ev;) {
            if (!strncmp(*ev, "BXF", 3) || !strncmp(*ev, "CRITERION", 9)) {
                char name[128];

                snprintf(name, sizeof(name), "%.*s", (int)strcspn(*ev, "="), *ev);
                unsetenv(name);
            } else {
                ev++;
            }
        }
        snprintf(fdstr, sizeof(fdstr), "%d", fd);
        setenv("LD_PRELOAD", SOFTVERBS_LIB, 1);
        setenv("ASAN_OPTIONS", "verify_asan_link_order=0:detect_leaks=0", 1);
        unsetenv("WEFT_SOFTVERBS_FAULT");
        unsetenv("WEFT_SOFTVERBS_LINK");
        unsetenv("WEFT_SOFTVERBS_DEVICES");
        snprintf(e, sizeof(e), "WEFT_RANK=%d;%s;%s", r[0] == 'b', env ? env : "",
                 env_more ? env_more : "");
        for (char *kv = strtok_r(e, ";", &save); kv; kv = strtok_r(NULL, ";", &save))
            putenv(kv);
        {
            char spec[128];

            snprintf(spec, sizeof(spec), "%s %s %s", scn, r, fdstr);
            setenv("WEFT_SV_PEER", spec, 1);
        }
        execl("/proc/self/exe", "test_softverbs", (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Peers a and b with env, a with env_a too.  b must exit 0, or where the
 * scenario has it wait to be killed, die of SIGKILL.  A peer a that exits
 * 77 lacks a privilege the scenario needs: the test is skipped. */
static void run_pair(const char *scn, const char *env, const char *env_a)
{
    int sv[2], st;
    pid_t a, b;
    int b_sig = find_scenario(scn)->b_dies ? SIGKILL : 0;

    cr_assert(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
    a = spawn(scn, "a", sv[0], env, env_a);
    b = spawn(scn, "b", sv[1], env, NULL);
    close(sv[0]);
    close(sv[1]);
    cr_assert(waitpid(a, &st, 0) == a);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        kill(b, SIGKILL);
        waitpid(b, &st, 0);
        cr_skip_test("%s: needs a privilege this run lacks", scn);
    }
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: peer a status 0x%x", scn, st);
    if (b_sig)
        kill(b, SIGKILL);
    cr_assert(waitpid(b, &st, 0) == b);
    if (b_sig)
        cr_expect(WIFSIGNALED(st) && WTERMSIG(st) == b_sig, "%s: peer b status 0x%x", scn, st);
    else
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: peer b status 0x%x", scn, st);
}

static void run_one(const char *scn, const char *env)
{
    int st;
    pid_t a = spawn(scn, "a", -1, env, NULL);

    cr_assert(waitpid(a, &st, 0) == a);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status 0x%x", scn, st);
}

TestSuite(softverbs, .timeout = 30);
#define FAULT "WEFT_SOFTVERBS_FAULT="

Test(softverbs, query_eth) { run_one("query", "WEFT_SOFTVERBS_DEVICES=2"); }
Test(softverbs, query_ib) { run_one("query", "WEFT_SOFTVERBS_DEVICES=2;WEFT_SOFTVERBS_LINK=ib"); }
Test(softverbs, bad_fault_spec)
{
    run_one("badfault", FAULT "delay=5,fail=x");
    run_one("badfault", FAULT "frobnicate=1@0");
    run_one("badfault", FAULT "fail=2:nope");
    run_one("badfault", FAULT "cm_reject=0");
}
Test(softverbs, no_fd_or_thread_leak) { run_one("fdleak", NULL); }
Test(softverbs, write_lands_without_target) { run_pair("write", NULL, NULL); }
Test(softverbs, write_ib_link) { run_pair("write", "WEFT_SOFTVERBS_LINK=ib", NULL); }
Test(softverbs, write_64mib, .timeout = 60) { run_pair("big", NULL, NULL); }
Test(softverbs, write_with_imm) { run_pair("write_imm", NULL, NULL); }
Test(softverbs, send_recv_inline_len_err) { run_pair("send_recv", NULL, NULL); }
Test(softverbs, rdma_read) { run_pair("read", NULL, NULL); }
Test(softverbs, selective_signalling) { run_pair("signal", NULL, NULL); }
Test(softverbs, sq_full_enomem) { run_pair("sqfull", NULL, NULL); }
Test(softverbs, bad_rkey_then_flush) { run_pair("bad_rkey", NULL, NULL); }
Test(softverbs, out_of_bounds) { run_pair("past_mr_end", NULL, NULL); }
Test(softverbs, read_without_remote_read) { run_pair("read_refused", NULL, NULL); }
Test(softverbs, bad_lkey) { run_pair("bad_lkey", NULL, NULL); }
Test(softverbs, rnr_retry_exceeded) { run_pair("rnr", NULL, NULL); }
Test(softverbs, rnr_then_recv) { run_pair("rnr_late", NULL, NULL); }
Test(softverbs, peer_killed) { run_pair("killed", NULL, NULL); }
Test(softverbs, peer_killed_inflight) { run_pair("killed_inflight", NULL, NULL); }
Test(softverbs, wrong_dest_qpn) { run_pair("wrong_qpn", NULL, NULL); }
Test(softverbs, comp_channel_nonblock) { run_pair("channel", NULL, NULL); }
/* Faults of a's device; fault_fail's item applies to rank 0, a. */
Test(softverbs, fault_fail) { run_pair("fault_fail", FAULT "fail=3:rem_access@0", NULL); }
Test(softverbs, fault_delay) { run_pair("fault_delay", NULL, FAULT "delay=300000"); }
Test(softverbs, fault_kill_qp) { run_pair("fault_kill_qp", NULL, FAULT "kill_qp=2"); }
Test(softverbs, fault_port_down) { run_pair("fault_port_down", NULL, FAULT "port_down=300"); }

Test(softverbs, cm_basics) { run_one("cm_basic", NULL); }
Test(softverbs, cm_connect_write_disconnect) { run_pair("cm_connect", NULL, NULL); }
Test(softverbs, cm_reject_private_data) { run_pair("cm_reject", NULL, NULL); }
Test(softverbs, cm_peer_killed) { run_pair("cm_killed", NULL, NULL); }
Test(softverbs, cm_fault_reject) { run_pair("cm_fault", FAULT "cm_reject=1@1", NULL); }
Test(softverbs, cm_across_netns) { run_pair("cm_netns", NULL, NULL); }

/* A peer is this binary re-executed with WEFT_SV_PEER="scenario role fd";
 * it runs before Criterion's main ever sees it. */
__attribute__((constructor)) static void peer_hook(void)
{
    const char *spec = getenv("WEFT_SV_PEER");
    static char scn[64], r[8];
    int fd;

    if (!spec || sscanf(spec, "%63s %7s %d", scn, r, &fd) != 3)
        return;
    exit(peer_main(scn, r, fd));
}
