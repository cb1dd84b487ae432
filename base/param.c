/*
 * param.c - the one table of environment parameters: name, type, default
 * and a line of documentation.  Each is read once per process, the first
 * time anyone asks.  `weft-info --params` and the README print this table.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/internal.h"

static const struct weft_param_desc table[] = {
    {"WEFT_DEBUG", "str", "WARN", "log level: NONE, WARN, INFO or TRACE", "NCCL_DEBUG"},
    {"WEFT_DEBUG_SUBSYS", "str", "ALL", "log subsystems: INIT,NET,COLL,BOOT,ENV,ALL (^ excludes)", "NCCL_DEBUG_SUBSYS"},
    {"WEFT_DEBUG_FILE", "str", "", "log to this file instead of stderr (%h host, %p pid)", "NCCL_DEBUG_FILE"},
    {"WEFT_TIMEOUT_MS", "int", "300000",
     "deadline for init and for any operation that makes no progress", NULL},
    {"WEFT_SOCKET_IFNAME", "str", "",
     "interfaces to use (NCCL syntax: eth,ib prefixes; ^ excludes; = exact)", "NCCL_SOCKET_IFNAME"},
    {"WEFT_SOCKET_NSTREAMS", "int", "1", "TCP connections per peer and direction (1-16)", NULL},
    {"WEFT_SOCKET_BUFSIZE", "int", "4194304", "TCP socket send/receive buffer bytes (0: kernel's)", NULL},
    {"WEFT_CHUNK_SIZE", "int", "524288", "bytes one pipelined step carries", NULL},
    {"WEFT_STAGING_SLOTS", "int", "16", "receive-reduce chunks in flight per communicator", NULL},
    {"WEFT_SPIN_US", "int", "-1",
     "microseconds to poll busily before sleeping (-1: 40, or 1000 yielding the core when this host has more ranks than cores)", NULL},
    {"WEFT_TRANSPORT", "str", "", "transports allowed (list, ^ excludes): shm carries pairs on one host, tcp the rest", NULL},
    {"WEFT_HOSTID", "str", "", "this host's identity (default hostname + boot id); ranks with equal ones use shm", NULL},
    {"WEFT_SHM_SLOTS", "int", "8", "slots per shared-memory ring (one ring per peer), 1..1024", NULL},
    {"WEFT_SHM_SLOT_BYTES", "int", "262144", "bytes per shared-memory slot, rounded up to a page; messages move in slot-sized chunks", NULL},
    {"WEFT_SHM_CMA_MIN", "int", "0", "messages at least this long are pulled with process_vm_readv instead of the ring (0: never; the ring measured faster here)", NULL},
    {"WEFT_SHM_DIR", "str", "/dev/shm", "folder for shared-memory segments (shm_open in /dev/shm, open() elsewhere)", NULL},
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
    {"WEFT_BIND", "int", "0", "1: pin each rank's threads to one CPU of those allowed, the k-th rank of a machine to the k-th CPU (0: the kernel places them)", NULL},
    {"WEFT_CALIBRATE", "int", "1", "1: time a short ping-pong between ring neighbours at init and start the link table from it; 0: built-in defaults", NULL},
    {"WEFT_TOPO_FILE", "str", "", "topology file: per-transport defaults, per-host and per-pair link costs and transports (format in src/topo.h)", NULL},
    {"WEFT_CHECK", "int", "0",
     "1: before each collective the ranks exchange fingerprints (sequence, collective, count, dtype, op, root, algorithm); a disagreement fails the communicator with WEFT_ERR_MISMATCH naming both calls instead of hanging (one extra message round per collective; set it on every rank)", NULL},
    {"WEFT_DETERMINISTIC", "int", "0",
     "1: allreduce, reduce_scatter and reduce combine every element in rank order on a pipelined chain, so results are bitwise identical on every rank and run whatever the algorithm, chunk or message size; costs p-1 hops before the first chunk of the result and the chain in place of the fastest algorithm (README: Deterministic mode). weft_comm_set_deterministic sets it per communicator", NULL},
    {"WEFT_TUNE_TRIALS", "int", "-1",
     "calls per candidate plan, timed on the first calls of each size class before the automatic choice settles, after one untimed call each: the candidates take turns in up to 3 rounds, each run behind a barrier; a round's time is the mean call of the run on the slowest rank (the first call of each run not counted, but for broadcast and reduce), and the lowest median round wins, no plan counting less than its busiest network port's bytes x beta by the model; ranks agree through one exchange. -1: runs of about 3 ms by the model's clock (8 to 80 calls) in as many rounds (1 to 3) as runs of 8 fit in about 40 ms, so 8 to 240 calls; 0: the cost model's prediction alone. WEFT_ALGO and weft_comm_set_algo bound the candidates", NULL},
    {"WEFT_TUNE_CANDIDATES", "int", "6",
     "plans timed per size class: the best predicted, within 4x of the best prediction (at most 8); a plan that moves the same messages as another in the same predicted time (hier on one node, say) counts once", NULL},
    {"WEFT_ALGO", "str", "", "algorithms allowed, NCCL_ALGO syntax: ring, tree, rhd, direct, hier; ^tree excludes; allreduce:rhd;allgather:ring per collective. A call none of them serves gets the automatic choice. weft_comm_set_algo sets it per communicator", "NCCL_ALGO"},
    {"WEFT_UNIQUE_ID", "str", "", "weft_comm_init_env: the unique id in hex (set by weftrun)", NULL},
    {"WEFT_ROOT", "str", "", "host:port where rank 0 listens: weft_comm_init_env, and weft_get_unique_id then returns the same id everywhere (torchrun style)", "NCCL_COMM_ID"},
    {"WEFT_SECRET", "str", "", "weft_comm_init_env with WEFT_ROOT: shared job secret", NULL},
    {"WEFT_RANK", "str", "", "weft_comm_init_env: this process's rank", NULL},
    {"WEFT_NRANKS", "str", "", "weft_comm_init_env: number of ranks", NULL},
};

static char *values[WEFT_ARRAY_SIZE(table)];
static const char *sources[WEFT_ARRAY_SIZE(table)]; /* the variable that set it, or NULL */
static int64_t ints[WEFT_ARRAY_SIZE(table)];
static pthread_once_t once = PTHREAD_ONCE_INIT;

bool weft_parse_size(const char *s, int64_t *out)
{
    if (s == NULL || *s == '\0')
        return false;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 0);
    if (errno != 0 || end == s)
        return false;
    int shift = 0;
    switch (*end) {
    case 'k': case 'K': shift = 10; end++; break;
    case 'm': case 'M': shift = 20; end++; break;
    case 'g': case 'G': shift = 30; end++; break;
    default: break;
    }
    if (*end == 'B' || *end == 'b')
        end++;
    if (*end != '\0')
        return false;
    if (v < 0 ? v < (INT64_MIN >> shift) : v > (INT64_MAX >> shift))
        return false;
    *out = (int64_t)v * ((int64_t)1 << shift);
    return true;
}

bool weft_parse_mask(const char *spec, const char *const *names, size_t n, unsigned *mask,
                     char *bad, size_t badlen)
{
    unsigned all = n >= 32 ? ~0u : (1u << n) - 1;
    *mask = all;
    if (spec == NULL || *spec == '\0')
        return true;
    bool exclude = spec[0] == '^';
    unsigned named = 0;
    /* Entries are read in place: a copy into a fixed buffer once dropped
     * whatever came after its end, unknown names included. */
    for (const char *tok = spec + exclude;; tok++) {
        size_t len = strcspn(tok, ",");
        if (len > 0) {
            size_t i = 0;
            while (i < n && !(strncasecmp(tok, names[i], len) == 0 && names[i][len] == '\0'))
                i++;
            if (i == n) {
                snprintf(bad, badlen, "%.*s", (int)WEFT_MIN(len, (size_t)INT_MAX), tok);
                return false;
            }
            named |= 1u << i;
        }
        tok += len;
        if (*tok == '\0')
            break;
    }
    *mask = exclude ? all & ~named : named;
    return true;
}

static void load(void)
{
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(table); i++) {
        const char *env = getenv(table[i].name);
        sources[i] = env ? table[i].name : NULL;
        /* NCCL's name counts only when weft's own is unset. */
        if (env == NULL && table[i].alias && (env = getenv(table[i].alias)) != NULL)
            sources[i] = table[i].alias;
        values[i] = strdup(env ? env : table[i].dflt);
        if (strcmp(table[i].type, "int") != 0)
            continue;
        if (!weft_parse_size(values[i], &ints[i])) {
            /* A bad value must not silently become 0: warn and keep the default. */
            fprintf(stderr, "weft: %s=\"%s\" is not a number; using the default %s\n",
                    sources[i], values[i], table[i].dflt);
            weft_parse_size(table[i].dflt, &ints[i]);
        }
    }
}

void weft_param_reload(void)
{
    pthread_once(&once, load);
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(table); i++)
        free(values[i]);
    load();
}

static size_t find(const char *name)
{
    pthread_once(&once, load);
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(table); i++)
        if (strcmp(table[i].name, name) == 0)
            return i;
    fprintf(stderr, "weft: internal error: unknown parameter %s\n", name);
    return WEFT_ARRAY_SIZE(table);
}

int64_t weft_param_int(const char *name)
{
    size_t i = find(name);
    return i < WEFT_ARRAY_SIZE(table) ? ints[i] : 0;
}

const char *weft_param_str(const char *name)
{
    size_t i = find(name);
    return i < WEFT_ARRAY_SIZE(table) && values[i] ? values[i] : "";
}

const char *weft_param_source(const char *name)
{
    size_t i = find(name);
    return i < WEFT_ARRAY_SIZE(table) ? sources[i] : NULL;
}

const struct weft_param_desc *weft_param_table(size_t *n)
{
    *n = WEFT_ARRAY_SIZE(table);
    return table;
}
