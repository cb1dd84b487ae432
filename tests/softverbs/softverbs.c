/* softverbs.c - a software RC "HCA" for tests: LD_PRELOADed over the real
 * libibverbs, it defines the verbs entry points weft's transport uses.  This
 * file owns the device table, contexts (fault spec, GIDs, LID), PDs, MRs,
 * CQs, completion channels and async events; QPs live in sv_qp.c. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "softverbs.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define SV_EXPORT __attribute__((visibility("default")))

/* verbs.h wraps these in macros; we define the exported functions. */
#undef ibv_query_port
#undef ibv_reg_mr
#undef ibv_reg_mr_iova
#undef ibv_get_device_list

static struct sv_device *sv_devs;
static int sv_ndevs;
static pthread_once_t sv_once = PTHREAD_ONCE_INIT;

uint64_t sv_now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void *sv_zalloc(size_t n)
{
    void *p = calloc(1, n);

    if (!p)
        errno = ENOMEM;
    return p;
}

static uint32_t sv_random32(void)
{
    uint32_t v = 0;

    if (getrandom(&v, sizeof(v), 0) != sizeof(v))
        v = (uint32_t)sv_now_ns() ^ ((uint32_t)getpid() << 12);
    return v;
}

/* The table lives for the process: device pointers must stay valid after
 * ibv_free_device_list for contexts that were opened from them. */
static void sv_devs_init(void)
{
    const char *s = getenv("WEFT_SOFTVERBS_DEVICES");
    int n = s ? atoi(s) : 1;
    uint64_t base = ((uint64_t)sv_random32() << 32 | sv_random32()) & ~0xffull;

    if (n < 0 || n > 64)
        n = 1;
    sv_devs = calloc(n ? n : 1, sizeof(*sv_devs));
    if (!sv_devs)
        return;
    for (int i = 0; i < n; i++) {
        struct sv_device *d = &sv_devs[i];

        d->index = i;
        d->guid = __builtin_bswap64(base | (uint64_t)i);
        d->ibv.node_type = IBV_NODE_CA;
        d->ibv.transport_type = IBV_TRANSPORT_IB;
        snprintf(d->ibv.name, sizeof(d->ibv.name), "softverbs%d", i);
        snprintf(d->ibv.dev_name, sizeof(d->ibv.dev_name), "uverbs%d", i);
        snprintf(d->ibv.dev_path, sizeof(d->ibv.dev_path), "/nonexistent/softverbs/uverbs%d", i);
        snprintf(d->ibv.ibdev_path, sizeof(d->ibv.ibdev_path), "/nonexistent/softverbs/softverbs%d", i);
    }
    sv_ndevs = n;
}

SV_EXPORT struct ibv_device **ibv_get_device_list(int *num_devices)
{
    struct ibv_device **list;

    pthread_once(&sv_once, sv_devs_init);
    list = calloc(sv_ndevs + 1, sizeof(*list));
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < sv_ndevs; i++)
        list[i] = &sv_devs[i].ibv;
    if (num_devices)
        *num_devices = sv_ndevs;
    return list;
}

SV_EXPORT void ibv_free_device_list(struct ibv_device **list)
{
    free(list);
}

SV_EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
    return device->name;
}

SV_EXPORT __be64 ibv_get_device_guid(struct ibv_device *device)
{
    return ((struct sv_device *)device)->guid;
}

/* librdmacm's ucma_init indexes the devices it lists. */
SV_EXPORT int ibv_get_device_index(struct ibv_device *device)
{
    return ((struct sv_device *)device)->index;
}

SV_EXPORT int ibv_fork_init(void)
{
    return 0;
}

/* ---- fault spec ---- */

static int sv_status_parse(const char *s, enum ibv_wc_status *st)
{
    static const struct {
        const char *name;
        enum ibv_wc_status st;
    } names[] = {
        {"retry_exc", IBV_WC_RETRY_EXC_ERR},
        {"rem_access", IBV_WC_REM_ACCESS_ERR},
        {"rnr_retry_exc", IBV_WC_RNR_RETRY_EXC_ERR},
        {"loc_prot", IBV_WC_LOC_PROT_ERR},
    };

    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(s, names[i].name)) {
            *st = names[i].st;
            return 0;
        }
    return -1;
}

static int sv_u64_parse(const char *s, uint64_t *v)
{
    char *end;

    if (*s < '0' || *s > '9')
        return -1;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return (errno || *end) ? -1 : 0;
}

/* One item: key=value[@rank].  Items for another rank are parsed (so a
 * typo fails everywhere) but not applied. */
static int sv_fault_item(char *item, struct sv_fault *f)
{
    const char *rank = getenv("WEFT_RANK");
    char *at = strchr(item, '@'), *eq = strchr(item, '='), *colon;
    bool mine = true;
    uint64_t v, r;

    if (at) {
        *at = '\0';
        if (sv_u64_parse(at + 1, &r))
            return -1;
        mine = rank && sv_u64_parse(rank, &v) == 0 && v == r;
    }
    if (!eq)
        return -1;
    *eq = '\0';
    if (!strcmp(item, "fail")) {
        enum ibv_wc_status st = IBV_WC_RETRY_EXC_ERR;

        colon = strchr(eq + 1, ':');
        if (colon) {
            *colon = '\0';
            if (sv_status_parse(colon + 1, &st))
                return -1;
        }
        if (sv_u64_parse(eq + 1, &v) || v == 0)
            return -1;
        if (mine) {
            f->fail_n = v;
            f->fail_status = st;
        }
    } else if (!strcmp(item, "delay")) {
        if (sv_u64_parse(eq + 1, &v))
            return -1;
        if (mine)
            f->delay_us = v;
    } else if (!strcmp(item, "kill_qp")) {
        if (sv_u64_parse(eq + 1, &v) || v == 0)
            return -1;
        if (mine)
            f->kill_qp_n = v;
    } else if (!strcmp(item, "port_down")) {
        if (sv_u64_parse(eq + 1, &v))
            return -1;
        if (mine)
            f->port_down_ms = v ? v : 1;
    } else if (!strcmp(item, "cm_reject")) {
        if (sv_u64_parse(eq + 1, &v) || v == 0)
            return -1;
        if (mine)
            f->cm_reject_n = v;
    } else {
        return -1;
    }
    return 0;
}

static int sv_fault_parse(const char *spec, struct sv_fault *f)
{
    char *copy, *item, *save = NULL;
    int ret = 0;

    memset(f, 0, sizeof(*f));
    if (!spec || !*spec)
        return 0;
    copy = strdup(spec);
    if (!copy)
        return ENOMEM;
    for (item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char shown[128];

        snprintf(shown, sizeof(shown), "%s", item);
        if (sv_fault_item(item, f)) {
            fprintf(stderr, "softverbs: bad WEFT_SOFTVERBS_FAULT item '%s' "
                    "(want fail=N[:retry_exc|rem_access|rnr_retry_exc|loc_prot], "
                    "delay=US, kill_qp=N, port_down=MS, cm_reject=N, each optionally @RANK)\n", shown);
            ret = EINVAL;
            break;
        }
    }
    free(copy);
    return ret;
}

/* ---- GIDs ---- */

static void sv_gids_init(struct sv_context *ctx)
{
    struct ifaddrs *ifa, *i;
    union ibv_gid *g = &ctx->gid[0];

    memset(ctx->gid, 0, sizeof(ctx->gid));
    g->raw[0] = 0xfe;
    g->raw[1] = 0x80;
    memcpy(&g->raw[8], &ctx->dev->guid, 8);
    ctx->ngid = 1;
    if (ctx->link_ib || getifaddrs(&ifa))
        return;
    for (i = ifa; i && ctx->ngid < SV_MAX_GID; i = i->ifa_next) {
        const struct sockaddr_in *sin = (const void *)i->ifa_addr;

        if (!sin || sin->sin_family != AF_INET)
            continue;
        g = &ctx->gid[ctx->ngid++];
        g->raw[10] = 0xff;
        g->raw[11] = 0xff;
        memcpy(&g->raw[12], &sin->sin_addr, 4);
    }
    freeifaddrs(ifa);
}

/* ---- context ---- */

static int sv_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc);
static int sv_req_notify_cq(struct ibv_cq *cq, int solicited_only);

static struct ibv_mw *sv_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
    (void)pd;
    (void)type;
    errno = EOPNOTSUPP;
    return NULL;
}

static int sv_bind_mw(struct ibv_qp *qp, struct ibv_mw *mw, struct ibv_mw_bind *b)
{
    (void)qp;
    (void)mw;
    (void)b;
    return EOPNOTSUPP;
}

static int sv_dealloc_mw(struct ibv_mw *mw)
{
    (void)mw;
    return EOPNOTSUPP;
}

static int sv_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad)
{
    (void)srq;
    *bad = wr;
    return EOPNOTSUPP;
}

void sv_ring(struct sv_context *ctx)
{
    uint64_t one = 1;

    if (write(ctx->doorbell, &one, sizeof(one)) < 0) {
        /* the counter saturating still leaves the doorbell readable */
    }
}

SV_EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
    struct sv_device *dev = (struct sv_device *)device;
    const char *dir = getenv("WEFT_SOFTVERBS_DIR");
    const char *link = getenv("WEFT_SOFTVERBS_LINK");
    struct epoll_event ev = {.events = EPOLLIN};
    struct sv_context *ctx;
    char lidpath[SV_PATH_MAX];
    uint32_t lid;
    int err;

    pthread_once(&sv_once, sv_devs_init);
    if (!dev || dev < sv_devs || dev >= sv_devs + sv_ndevs) {
        errno = ENODEV;
        return NULL;
    }
    if (link && strcmp(link, "eth") && strcmp(link, "ib")) {
        fprintf(stderr, "softverbs: WEFT_SOFTVERBS_LINK must be eth or ib, not '%s'\n", link);
        errno = EINVAL;
        return NULL;
    }
    ctx = sv_zalloc(sizeof(*ctx));
    if (!ctx)
        return NULL;
    err = sv_fault_parse(getenv("WEFT_SOFTVERBS_FAULT"), &ctx->fault);
    if (err)
        goto err_free;
    if (dir)
        err = snprintf(ctx->dir, sizeof(ctx->dir), "%s", dir) >= (int)sizeof(ctx->dir);
    else
        snprintf(ctx->dir, sizeof(ctx->dir), "/tmp/weft-softverbs-%u", (unsigned)getuid());
    if (err) {
        err = ENAMETOOLONG;
        goto err_free;
    }
    if (mkdir(ctx->dir, 0700) && errno != EEXIST) {
        err = errno;
        goto err_free;
    }
    /* Peers read and write our memory with process_vm_*v; Yama's
     * ptrace_scope=1 would refuse them otherwise. */
    prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);

    ctx->dev = dev;
    ctx->link_ib = link && !strcmp(link, "ib");
    ctx->port_state = IBV_PORT_ACTIVE;
    ctx->ev_tail = &ctx->ev_head;
    ctx->lid_fd = -1;
    sv_gids_init(ctx);
    if (ctx->link_ib) {
        ctx->lid_fd = sv_bind_unique(ctx->dir, "lid", 1, 0xbffe, &lid, lidpath);
        if (ctx->lid_fd < 0) {
            err = errno;
            goto err_free;
        }
        ctx->lid = (uint16_t)lid;
    }
    ctx->ibv.device = device;
    ctx->ibv.ops.poll_cq = sv_poll_cq;
    ctx->ibv.ops.req_notify_cq = sv_req_notify_cq;
    ctx->ibv.ops.post_send = sv_post_send;
    ctx->ibv.ops.post_recv = sv_post_recv;
    ctx->ibv.ops.alloc_mw = sv_alloc_mw;
    ctx->ibv.ops.bind_mw = sv_bind_mw;
    ctx->ibv.ops.dealloc_mw = sv_dealloc_mw;
    ctx->ibv.ops.post_srq_recv = sv_post_srq_recv;
    ctx->ibv.cmd_fd = -1;
    ctx->ibv.num_comp_vectors = 1;
    /* abi_compat stays NULL: not __VERBS_ABI_IS_EXTENDED, so verbs.h's
     * extended inlines report EOPNOTSUPP and ibv_query_port takes the
     * exported compat path. */
    pthread_mutex_init(&ctx->ibv.mutex, NULL);
    pthread_mutex_init(&ctx->lock, NULL);
    pthread_cond_init(&ctx->cond, NULL);

    ctx->ibv.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (ctx->ibv.async_fd < 0) {
        err = errno;
        goto err_lid;
    }
    ctx->doorbell = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (ctx->doorbell < 0) {
        err = errno;
        goto err_async;
    }
    ctx->epfd = epoll_create1(EPOLL_CLOEXEC);
    if (ctx->epfd < 0) {
        err = errno;
        goto err_doorbell;
    }
    ev.data.ptr = NULL; /* NULL marks the doorbell */
    if (epoll_ctl(ctx->epfd, EPOLL_CTL_ADD, ctx->doorbell, &ev)) {
        err = errno;
        goto err_epoll;
    }
    ctx->open_ns = sv_now_ns();
    err = pthread_create(&ctx->thread, NULL, sv_service, ctx);
    if (err)
        goto err_epoll;
    return &ctx->ibv;

err_epoll:
    close(ctx->epfd);
err_doorbell:
    close(ctx->doorbell);
err_async:
    close(ctx->ibv.async_fd);
err_lid:
    if (ctx->lid_fd >= 0) {
        unlink(lidpath);
        close(ctx->lid_fd);
    }
    pthread_cond_destroy(&ctx->cond);
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&ctx->ibv.mutex);
err_free:
    free(ctx);
    errno = err;
    return NULL;
}

SV_EXPORT int ibv_close_device(struct ibv_context *context)
{
    struct sv_context *ctx = sv_ctx(context);
    char lidpath[SV_PATH_MAX + 16];

    pthread_mutex_lock(&ctx->lock);
    if (ctx->nobj[SV_PD] || ctx->nobj[SV_CQ] || ctx->nobj[SV_CHANNEL] || ctx->qps || ctx->mrs) {
        pthread_mutex_unlock(&ctx->lock);
        errno = EBUSY;
        return EBUSY;
    }
    ctx->stop = true;
    sv_ring(ctx);
    pthread_mutex_unlock(&ctx->lock);
    pthread_join(ctx->thread, NULL);

    /* Only closing sockets can be left. */
    for (struct sv_sock *s; (s = ctx->socks); sv_sock_free(s))
        ctx->socks = s->next;
    for (struct sv_event *e; (e = ctx->ev_head); free(e))
        ctx->ev_head = e->next;
    close(ctx->epfd);
    close(ctx->doorbell);
    close(ctx->ibv.async_fd);
    if (ctx->lid_fd >= 0) {
        snprintf(lidpath, sizeof(lidpath), "%s/lid-%04x", ctx->dir, ctx->lid);
        unlink(lidpath);
        close(ctx->lid_fd);
    }
    pthread_cond_destroy(&ctx->cond);
    pthread_mutex_destroy(&ctx->lock);
    pthread_mutex_destroy(&ctx->ibv.mutex);
    free(ctx);
    return 0;
}

SV_EXPORT int ibv_query_device(struct ibv_context *context, struct ibv_device_attr *a)
{
    struct sv_context *ctx = sv_ctx(context);

    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "softverbs-1.0");
    a->node_guid = ctx->dev->guid;
    a->sys_image_guid = ctx->dev->guid;
    a->max_mr_size = 1ull << 40;
    a->page_size_cap = 0xfffff000;
    a->vendor_id = 0x5746; /* "WF" */
    a->vendor_part_id = 1;
    a->hw_ver = 1;
    a->max_qp = 1 << 16;
    a->max_qp_wr = SV_MAX_WR;
    a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
    a->max_sge = SV_MAX_SGE;
    a->max_sge_rd = SV_MAX_SGE;
    a->max_cq = 1 << 16;
    a->max_cqe = SV_MAX_CQE;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = 16;
    a->max_qp_init_rd_atom = 16;
    a->max_res_rd_atom = 16 << 16;
    a->atomic_cap = IBV_ATOMIC_NONE;
    a->max_pkeys = 1;
    a->local_ca_ack_delay = 16;
    a->phys_port_cnt = 1;
    return 0;
}

/* The compat struct is the leading part of struct ibv_port_attr, up to and
 * including link_layer; verbs.h's inline zeroes the rest. */
SV_EXPORT int ibv_query_port(struct ibv_context *context, uint8_t port_num,
                             struct _compat_ibv_port_attr *compat)
{
    struct sv_context *ctx = sv_ctx(context);
    struct ibv_port_attr *a = (struct ibv_port_attr *)compat;

    if (port_num != 1)
        return EINVAL;
    pthread_mutex_lock(&ctx->lock);
    a->state = ctx->port_state;
    a->phys_state = ctx->port_state == IBV_PORT_ACTIVE ? 5 : 3; /* LinkUp : Disabled */
    pthread_mutex_unlock(&ctx->lock);
    a->max_mtu = IBV_MTU_4096;
    a->active_mtu = IBV_MTU_4096;
    a->gid_tbl_len = ctx->ngid;
    a->port_cap_flags = 0;
    a->max_msg_sz = 1u << 31;
    a->bad_pkey_cntr = 0;
    a->qkey_viol_cntr = 0;
    a->pkey_tbl_len = 1;
    a->lid = ctx->lid;
    a->sm_lid = ctx->link_ib ? 1 : 0;
    a->lmc = 0;
    a->max_vl_num = 1;
    a->sm_sl = 0;
    a->subnet_timeout = 18;
    a->init_type_reply = 0;
    a->active_width = 2;  /* 4x */
    a->active_speed = 32; /* EDR */
    a->link_layer = ctx->link_ib ? IBV_LINK_LAYER_INFINIBAND : IBV_LINK_LAYER_ETHERNET;
    return 0;
}

SV_EXPORT int ibv_query_gid(struct ibv_context *context, uint8_t port_num, int index,
                            union ibv_gid *gid)
{
    struct sv_context *ctx = sv_ctx(context);

    if (port_num != 1 || index < 0 || index >= ctx->ngid) {
        errno = EINVAL;
        return -1;
    }
    *gid = ctx->gid[index];
    return 0;
}

/* ---- PD and MR ---- */

/* One more object of kind on context. */
static void sv_count_one(struct ibv_context *context, int kind)
{
    struct sv_context *ctx = sv_ctx(context);

    pthread_mutex_lock(&ctx->lock);
    ctx->nobj[kind]++;
    pthread_mutex_unlock(&ctx->lock);
}

/* One object of kind less, unless *busy (read under the lock) says it is
 * in use: EBUSY then. */
static int sv_uncount_one(struct ibv_context *context, int kind, const int *busy)
{
    struct sv_context *ctx = sv_ctx(context);

    pthread_mutex_lock(&ctx->lock);
    if (*busy) {
        pthread_mutex_unlock(&ctx->lock);
        return EBUSY;
    }
    ctx->nobj[kind]--;
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

SV_EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
    struct sv_pd *pd = sv_zalloc(sizeof(*pd));

    if (!pd)
        return NULL;
    pd->ibv.context = context;
    pd->ibv.handle = sv_random32();
    sv_count_one(context, SV_PD);
    return &pd->ibv;
}

SV_EXPORT int ibv_dealloc_pd(struct ibv_pd *ibpd)
{
    struct sv_pd *pd = (struct sv_pd *)ibpd;
    int err = sv_uncount_one(ibpd->context, SV_PD, &pd->refs);

    if (!err)
        free(pd);
    return err;
}

/* Callers hold ctx->lock. */
struct sv_mr *sv_mr_find(struct sv_context *ctx, uint32_t key, bool remote)
{
    for (struct sv_mr *m = ctx->mrs; m; m = m->next)
        if ((remote ? m->ibv.rkey : m->ibv.lkey) == key)
            return m;
    return NULL;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova2(struct ibv_pd *ibpd, void *addr, size_t length,
                                          uint64_t iova, unsigned int access)
{
    struct sv_context *ctx = sv_ctx(ibpd->context);
    const unsigned known = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                           IBV_ACCESS_REMOTE_READ | IBV_ACCESS_RELAXED_ORDERING;
    struct sv_mr *mr;

    /* Remote write without local write is refused by every driver;
     * iova other than the address is not modelled. */
    if ((access & ~known) || iova != (uintptr_t)addr ||
        ((access & IBV_ACCESS_REMOTE_WRITE) && !(access & IBV_ACCESS_LOCAL_WRITE)) ||
        (!addr && length)) {
        errno = (access & ~known) || iova != (uintptr_t)addr ? EOPNOTSUPP : EINVAL;
        return NULL;
    }
    mr = sv_zalloc(sizeof(*mr));
    if (!mr)
        return NULL;
    mr->ibv.context = ibpd->context;
    mr->ibv.pd = ibpd;
    mr->ibv.addr = addr;
    mr->ibv.length = length;
    mr->access = (int)access;
    pthread_mutex_lock(&ctx->lock);
    do {
        mr->ibv.lkey = sv_random32();
    } while (!mr->ibv.lkey || sv_mr_find(ctx, mr->ibv.lkey, false) ||
             sv_mr_find(ctx, mr->ibv.lkey, true));
    do {
        mr->ibv.rkey = sv_random32();
    } while (!mr->ibv.rkey || mr->ibv.rkey == mr->ibv.lkey ||
             sv_mr_find(ctx, mr->ibv.rkey, false) || sv_mr_find(ctx, mr->ibv.rkey, true));
    mr->ibv.handle = mr->ibv.lkey;
    mr->next = ctx->mrs;
    ctx->mrs = mr;
    ((struct sv_pd *)ibpd)->refs++;
    pthread_mutex_unlock(&ctx->lock);
    return &mr->ibv;
}

SV_EXPORT struct ibv_mr *ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, (uintptr_t)addr, (unsigned)access);
}

SV_EXPORT struct ibv_mr *ibv_reg_mr_iova(struct ibv_pd *pd, void *addr, size_t length,
                                         uint64_t iova, int access)
{
    return ibv_reg_mr_iova2(pd, addr, length, iova, (unsigned)access);
}

SV_EXPORT int ibv_dereg_mr(struct ibv_mr *ibmr)
{
    struct sv_context *ctx = sv_ctx(ibmr->context);
    struct sv_mr **p;

    pthread_mutex_lock(&ctx->lock);
    for (p = &ctx->mrs; *p && &(*p)->ibv != ibmr; p = &(*p)->next)
        ;
    if (!*p) {
        pthread_mutex_unlock(&ctx->lock);
        return EINVAL;
    }
    *p = (*p)->next;
    ((struct sv_pd *)ibmr->pd)->refs--;
    pthread_mutex_unlock(&ctx->lock);
    free(ibmr);
    return 0;
}

/* ---- completion channels and CQs ---- */

SV_EXPORT struct ibv_comp_channel *ibv_create_comp_channel(struct ibv_context *context)
{
    struct sv_channel *ch = sv_zalloc(sizeof(*ch));

    if (!ch)
        return NULL;
    ch->ibv.fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
    if (ch->ibv.fd < 0) {
        int err = errno;

        free(ch);
        errno = err;
        return NULL;
    }
    ch->ibv.context = context;
    ch->tail = &ch->head;
    sv_count_one(context, SV_CHANNEL);
    return &ch->ibv;
}

SV_EXPORT int ibv_destroy_comp_channel(struct ibv_comp_channel *ibch)
{
    struct sv_channel *ch = (struct sv_channel *)ibch;

    if (sv_uncount_one(ibch->context, SV_CHANNEL, &ibch->refcnt))
        return EBUSY;
    for (struct sv_cq_ev *e; (e = ch->head); free(e))
        ch->head = e->next;
    close(ibch->fd);
    free(ch);
    return 0;
}

SV_EXPORT struct ibv_cq *ibv_create_cq(struct ibv_context *context, int cqe, void *cq_context,
                                       struct ibv_comp_channel *channel, int comp_vector)
{
    struct sv_context *ctx = sv_ctx(context);
    struct sv_cq *cq;

    if (cqe < 1 || cqe > SV_MAX_CQE || comp_vector < 0 || comp_vector >= 1 ||
        (channel && channel->context != context)) {
        errno = EINVAL;
        return NULL;
    }
    cq = calloc(1, sizeof(*cq));
    if (!cq || !(cq->ring = calloc((size_t)cqe, sizeof(*cq->ring)))) {
        free(cq);
        errno = ENOMEM;
        return NULL;
    }
    cq->ibv.context = context;
    cq->ibv.channel = channel;
    cq->ibv.cq_context = cq_context;
    cq->ibv.cqe = cqe;
    cq->size = cqe;
    cq->channel = (struct sv_channel *)channel;
    pthread_mutex_init(&cq->ibv.mutex, NULL);
    pthread_cond_init(&cq->ibv.cond, NULL);
    pthread_mutex_lock(&ctx->lock);
    if (channel)
        channel->refcnt++;
    ctx->nobj[SV_CQ]++;
    pthread_mutex_unlock(&ctx->lock);
    return &cq->ibv;
}

SV_EXPORT int ibv_destroy_cq(struct ibv_cq *ibcq)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);
    struct sv_cq *cq = (struct sv_cq *)ibcq;

    pthread_mutex_lock(&ctx->lock);
    for (struct sv_qp *qp = ctx->qps; qp; qp = qp->next)
        if (qp->ibv.send_cq == ibcq || qp->ibv.recv_cq == ibcq) {
            pthread_mutex_unlock(&ctx->lock);
            return EBUSY;
        }
    if (cq->events_got != cq->events_acked) {
        pthread_mutex_unlock(&ctx->lock);
        return EBUSY;
    }
    if (cq->channel) {
        /* drop events queued for this CQ but never fetched */
        struct sv_cq_ev **p = &cq->channel->head;

        while (*p) {
            struct sv_cq_ev *e = *p;
            uint64_t one;

            if (e->cq != cq) {
                p = &e->next;
                continue;
            }
            *p = e->next;
            free(e);
            if (read(cq->channel->ibv.fd, &one, sizeof(one)) < 0) {
                /* the count and the list move together under the lock */
            }
        }
        cq->channel->tail = &cq->channel->head;
        for (struct sv_cq_ev *e = cq->channel->head; e; e = e->next)
            cq->channel->tail = &e->next;
        cq->channel->ibv.refcnt--;
    }
    ctx->nobj[SV_CQ]--;
    pthread_mutex_unlock(&ctx->lock);
    pthread_cond_destroy(&cq->ibv.cond);
    pthread_mutex_destroy(&cq->ibv.mutex);
    free(cq->ring);
    free(cq);
    return 0;
}

/* Callers hold ctx->lock.  A full ring drops the entry, puts the QP that
 * produced it in error and raises IBV_EVENT_CQ_ERR once, as hardware does. */
void sv_cq_push(struct sv_context *ctx, struct sv_cq *cq, const struct ibv_wc *wc)
{
    if (cq->overflowed)
        return;
    if (cq->count == cq->size) {
        struct sv_qp *qp;

        cq->overflowed = true;
        sv_async_event(ctx, IBV_EVENT_CQ_ERR, (struct ibv_qp *)&cq->ibv);
        for (qp = ctx->qps; qp; qp = qp->next)
            if (qp->ibv.qp_num == wc->qp_num)
                sv_qp_set_err(ctx, qp);
        return;
    }
    cq->ring[(cq->head + cq->count) % cq->size] = *wc;
    cq->count++;
    if (cq->armed && cq->channel) {
        struct sv_cq_ev *e = malloc(sizeof(*e));
        uint64_t one = 1;

        if (!e)
            return; /* stays armed: the next entry tries again */
        cq->armed = false;
        e->cq = cq;
        e->next = NULL;
        *cq->channel->tail = e;
        cq->channel->tail = &e->next;
        if (write(cq->channel->ibv.fd, &one, sizeof(one)) < 0) {
            /* cannot overflow: one count per queued event */
        }
    }
}

static int sv_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);
    struct sv_cq *cq = (struct sv_cq *)ibcq;
    int got = 0;

    if (n < 0)
        return -1;
    pthread_mutex_lock(&ctx->lock);
    while (got < n && cq->count) {
        wc[got++] = cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->size;
        cq->count--;
    }
    pthread_mutex_unlock(&ctx->lock);
    return got;
}

static int sv_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);
    struct sv_cq *cq = (struct sv_cq *)ibcq;

    (void)solicited_only; /* every completion counts as solicited */
    pthread_mutex_lock(&ctx->lock);
    cq->armed = true;
    pthread_mutex_unlock(&ctx->lock);
    return 0;
}

SV_EXPORT int ibv_get_cq_event(struct ibv_comp_channel *ibch, struct ibv_cq **cq, void **cq_context)
{
    struct sv_context *ctx = sv_ctx(ibch->context);
    struct sv_channel *ch = (struct sv_channel *)ibch;
    struct sv_cq_ev *e;
    uint64_t one;

    /* Blocks or returns EAGAIN as the caller set O_NONBLOCK on fd. */
    if (read(ibch->fd, &one, sizeof(one)) != sizeof(one))
        return -1;
    pthread_mutex_lock(&ctx->lock);
    SV_QUEUE_POP(ch->head, ch->tail, e);
    if (e)
        e->cq->events_got++;
    pthread_mutex_unlock(&ctx->lock);
    if (!e) {
        errno = EAGAIN;
        return -1;
    }
    *cq = &e->cq->ibv;
    *cq_context = e->cq->ibv.cq_context;
    free(e);
    return 0;
}

SV_EXPORT void ibv_ack_cq_events(struct ibv_cq *ibcq, unsigned int nevents)
{
    struct sv_context *ctx = sv_ctx(ibcq->context);

    pthread_mutex_lock(&ctx->lock);
    ((struct sv_cq *)ibcq)->events_acked += nevents;
    ibcq->comp_events_completed += nevents;
    pthread_mutex_unlock(&ctx->lock);
}

/* ---- async events ---- */

/* Callers hold ctx->lock.  For CQ_ERR, qp carries the CQ. */
void sv_async_event(struct sv_context *ctx, enum ibv_event_type type, struct ibv_qp *qp)
{
    struct sv_event *e = calloc(1, sizeof(*e));
    uint64_t one = 1;

    if (!e)
        return;
    e->ev.event_type = type;
    if (type == IBV_EVENT_CQ_ERR)
        e->ev.element.cq = (struct ibv_cq *)qp;
    else if (type == IBV_EVENT_PORT_ERR || type == IBV_EVENT_PORT_ACTIVE)
        e->ev.element.port_num = 1;
    else
        e->ev.element.qp = qp;
    *ctx->ev_tail = e;
    ctx->ev_tail = &e->next;
    if (write(ctx->ibv.async_fd, &one, sizeof(one)) < 0) {
        /* one count per queued event: cannot overflow */
    }
}

SV_EXPORT int ibv_get_async_event(struct ibv_context *context, struct ibv_async_event *event)
{
    struct sv_context *ctx = sv_ctx(context);
    struct sv_event *e;
    uint64_t one;

    if (read(context->async_fd, &one, sizeof(one)) != sizeof(one))
        return -1;
    pthread_mutex_lock(&ctx->lock);
    SV_QUEUE_POP(ctx->ev_head, ctx->ev_tail, e);
    pthread_mutex_unlock(&ctx->lock);
    if (!e) {
        errno = EAGAIN;
        return -1;
    }
    *event = e->ev;
    free(e);
    return 0;
}

SV_EXPORT void ibv_ack_async_event(struct ibv_async_event *event)
{
    (void)event; /* objects are never waited on for async acks here */
}

/* ---- everything else a caller might reach: refuse cleanly ---- */

SV_EXPORT int ibv_query_pkey(struct ibv_context *c, uint8_t port, int index, __be16 *pkey)
{
    (void)c;
    if (port != 1 || index != 0)
        return EINVAL;
    *pkey = htons(0xffff);
    return 0;
}

SV_EXPORT int ibv_get_pkey_index(struct ibv_context *c, uint8_t port, __be16 pkey)
{
    (void)c;
    if (port == 1 && pkey == htons(0xffff))
        return 0;
    errno = EINVAL;
    return -1;
}

SV_EXPORT int _ibv_query_gid_ex(struct ibv_context *c, uint32_t port, uint32_t index,
                                struct ibv_gid_entry *entry, uint32_t flags, size_t size)
{
    (void)c, (void)port, (void)index, (void)entry, (void)flags, (void)size;
    errno = EOPNOTSUPP;
    return EOPNOTSUPP;
}

SV_EXPORT ssize_t _ibv_query_gid_table(struct ibv_context *c, struct ibv_gid_entry *e,
                                       size_t max, uint32_t flags, size_t size)
{
    (void)c, (void)e, (void)max, (void)flags, (void)size;
    errno = EOPNOTSUPP;
    return -EOPNOTSUPP;
}

SV_EXPORT struct ibv_mr *ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                           uint64_t iova, int fd, int access)
{
    (void)pd, (void)offset, (void)length, (void)iova, (void)fd, (void)access;
    errno = EOPNOTSUPP;
    return NULL;
}

SV_EXPORT int ibv_rereg_mr(struct ibv_mr *mr, int flags, struct ibv_pd *pd, void *addr,
                           size_t length, int access)
{
    (void)mr, (void)flags, (void)pd, (void)addr, (void)length, (void)access;
    errno = EOPNOTSUPP;
    return IBV_REREG_MR_ERR_INPUT;
}

SV_EXPORT int ibv_resize_cq(struct ibv_cq *cq, int cqe)
{
    (void)cq, (void)cqe;
    return EOPNOTSUPP;
}

SV_EXPORT struct ibv_srq *ibv_create_srq(struct ibv_pd *pd, struct ibv_srq_init_attr *attr)
{
    (void)pd, (void)attr;
    errno = EOPNOTSUPP;
    return NULL;
}

SV_EXPORT struct ibv_ah *ibv_create_ah(struct ibv_pd *pd, struct ibv_ah_attr *attr)
{
    (void)pd, (void)attr;
    errno = EOPNOTSUPP;
    return NULL;
}

SV_EXPORT struct ibv_ah *ibv_create_ah_from_wc(struct ibv_pd *pd, struct ibv_wc *wc,
                                               struct ibv_grh *grh, uint8_t port)
{
    (void)pd, (void)wc, (void)grh, (void)port;
    errno = EOPNOTSUPP;
    return NULL;
}

SV_EXPORT int ibv_init_ah_from_wc(struct ibv_context *c, uint8_t port, struct ibv_wc *wc,
                                  struct ibv_grh *grh, struct ibv_ah_attr *ah)
{
    (void)c, (void)port, (void)wc, (void)grh, (void)ah;
    errno = EOPNOTSUPP;
    return -1;
}

/* librdmacm's own rdma_create_qp_ex asks; "not supported" is what it
 * tolerates. */
SV_EXPORT int ibv_query_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
    (void)qp, (void)ece;
    return EOPNOTSUPP;
}

SV_EXPORT int ibv_set_ece(struct ibv_qp *qp, struct ibv_ece *ece)
{
    (void)qp, (void)ece;
    return EOPNOTSUPP;
}

SV_EXPORT int ibv_attach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    (void)qp, (void)gid, (void)lid;
    return EOPNOTSUPP;
}

SV_EXPORT int ibv_detach_mcast(struct ibv_qp *qp, const union ibv_gid *gid, uint16_t lid)
{
    (void)qp, (void)gid, (void)lid;
    return EOPNOTSUPP;
}
