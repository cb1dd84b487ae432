/*
 * verbs_desc.c - the verbs transport as the registry sees it: pairs on
 * other hosts when every rank has a usable device, its default cost and
 * its settings.  Built without libibverbs too, so that WEFT_TRANSPORT,
 * the topology file and weft-info know it and its settings.
 */
#include <dirent.h>

#include "transports/transport.h"

#ifdef HAVE_VERBS
#include "transports/verbs/verbs.h"
#endif

static const struct weft_param_desc verbs_params[] = {
    {"WEFT_IB_HCA", "str", "",
     "RDMA devices and ports to use (NCCL syntax: mlx5 prefixes, mlx5_0:1 one port; ^ excludes; = exact)", "NCCL_IB_HCA"},
    {"WEFT_IB_GID_INDEX", "int", "-1",
     "GID table index to use (-1: RoCE v2 with a WEFT_IB_ADDR_FAMILY address, index 0 on InfiniBand)", "NCCL_IB_GID_INDEX"},
    {"WEFT_IB_ADDR_FAMILY", "str", "AF_INET", "address family of the RoCE GID picked: AF_INET or AF_INET6", "NCCL_IB_ADDR_FAMILY"},
    {"WEFT_IB_TC", "int", "0", "traffic class of RoCE packets (GRH)", "NCCL_IB_TC"},
    {"WEFT_IB_SL", "int", "0", "InfiniBand service level", "NCCL_IB_SL"},
    {"WEFT_IB_TIMEOUT", "int", "20", "QP ack timeout exponent: 4.096 us x 2^N", "NCCL_IB_TIMEOUT"},
    {"WEFT_IB_RETRY_CNT", "int", "7", "QP retransmissions before a send fails (0-7)", "NCCL_IB_RETRY_CNT"},
    {"WEFT_IB_QPS_PER_CONNECTION", "int", "1", "queue pairs per connection; messages are split over them", "NCCL_IB_QPS_PER_CONNECTION"},
    {"WEFT_IB_CM", "str", "auto",
     "queue pair setup: auto (librdmacm where it serves the bootstrap's address, else oob), rdmacm (librdmacm or fail), oob (by hand, over the peers' authenticated tcp connection)", NULL},
    {"WEFT_IB_REGCACHE", "int", "0",
     "1: register any user buffer once and keep it (zero-copy; the program must not unmap memory weft has seen while the communicator lives); 0: user memory goes through registered bounce buffers (a copy each way)", NULL},
    {"WEFT_IB_SYSFS", "str", "/sys", "sysfs root the verbs transport reads GID types from (tests point it at fixtures)", NULL},
};

static bool verbs_can_reach(const struct weft_transport_pair *pair)
{
    return !pair->self;
}

/* verbs: what it would take. */
static void verbs_status(FILE *out)
{
#ifdef HAVE_VERBS
    bool built = true;
#else
    bool built = false;
#endif
    int ndev = 0;
    DIR *d = opendir("/sys/class/infiniband");
    if (d) {
        for (struct dirent *e; (e = readdir(d)) != NULL;)
            ndev += e->d_name[0] != '.';
        closedir(d);
    }
    if (!built)
        fprintf(out, "  verbs no: libibverbs was not found at configure\n");
    else if (ndev == 0)
        fprintf(out, "  verbs no: no RDMA device in /sys/class/infiniband\n");
    else
        fprintf(out, "  verbs yes: %d RDMA device%s in /sys/class/infiniband (used between hosts "
                "when every rank has an active port)\n", ndev, ndev == 1 ? "" : "s");
}

/* An RC write with immediate, one switch hop; 100 Gbit/s. */
const struct weft_transport_desc weft_verbs_desc = {
    .name = "verbs", .flags = WEFT_TP_ALL_RANKS, .priority = 20,
    .can_reach = verbs_can_reach,
    .alpha = 3e-6, .beta = 1.0 / 12e9,
    WEFT_TRANSPORT_PARAMS(verbs_params),
    .status = verbs_status,
#ifdef HAVE_VERBS
    .bind_oob = vb_bind_oob,
    .ops = &weft_verbs_ops,
#endif
};
