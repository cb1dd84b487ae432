/*
 * param.c - the tables of environment parameters: name, type, default and
 * a line of documentation.  The core table is here; each transport
 * declares its own in its folder and registers it (weft_param_register).
 * Each is read once per process, the first time anyone asks.
 * `weft-info --params` and the README print the tables.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "base/internal.h"

static const struct weft_param_desc core[] = {
    {"WEFT_DEBUG", "str", "WARN", "log level: NONE, WARN, INFO or TRACE", "NCCL_DEBUG"},
    {"WEFT_DEBUG_SUBSYS", "str", "ALL", "log subsystems: INIT,NET,COLL,BOOT,ENV,ALL (^ excludes)", "NCCL_DEBUG_SUBSYS"},
    {"WEFT_DEBUG_FILE", "str", "", "log to this file instead of stderr (%h host, %p pid)", "NCCL_DEBUG_FILE"},
    {"WEFT_TIMEOUT_MS", "int", "300000",
     "deadline for init and for any operation that makes no progress", NULL},
    {"WEFT_SOCKET_IFNAME", "str", "",
     "interfaces to use (NCCL syntax: eth,ib prefixes; ^ excludes; = exact)", "NCCL_SOCKET_IFNAME"},
    {"WEFT_CHUNK_SIZE", "int", "524288", "bytes one pipelined step carries", NULL},
    {"WEFT_STAGING_SLOTS", "int", "16", "receive-reduce chunks in flight per communicator; unset: 16, fewer when a host's ranks would hold over 256 MiB of them together (64 ranks get 8, 256 get 2; 2 at least)", NULL},
    {"WEFT_SPIN_US", "int", "-1",
     "microseconds to poll busily before sleeping (-1: 1000; yielding the core on every turn when this host has more ranks than cores)", NULL},
    {"WEFT_TRANSPORT", "str", "", "transports allowed (list, ^ excludes): shm carries pairs on one host, tcp the rest", NULL},
    {"WEFT_HOSTID", "str", "", "this host's identity (default hostname + boot id); ranks with equal ones use shm", NULL},
    {"WEFT_BIND", "int", "0", "1: pin each rank's threads to one CPU of those allowed, the k-th rank of a machine to the k-th CPU (0: the kernel places them)", NULL},
    {"WEFT_CALIBRATE", "int", "1", "1: time a short ping-pong between ring neighbours at init and start the link table from it; 0: built-in defaults", NULL},
    {"WEFT_TOPO_FILE", "str", "", "topology file: per-transport defaults, per-host and per-pair link costs and transports (format in docs/topology-file.md)", NULL},
    {"WEFT_CHECK", "int", "0",
     "1: before each collective the ranks exchange fingerprints (sequence, collective, count, dtype, op, root, algorithm); a disagreement fails the communicator with WEFT_ERR_MISMATCH naming both calls instead of hanging (one extra message round per collective; set it on every rank)", NULL},
    {"WEFT_DETERMINISTIC", "int", "0",
     "1: allreduce, reduce_scatter and reduce combine every element in rank order on a pipelined chain, so results are bitwise identical on every rank and run whatever the algorithm, chunk or message size; costs p-1 hops before the first chunk of the result and the chain in place of the fastest algorithm (README: Deterministic mode). weft_comm_set_deterministic sets it per communicator", NULL},
    {"WEFT_CUDA_DRIVER", "str", "libcuda.so.1", "the CUDA driver library loaded (dlopen) when a call meets a stream or a device pointer", NULL},
    {"WEFT_CUDA_STAGE_BYTES", "int", "4194304", "device buffers through host memory: bytes per pipelined segment (copies of one overlap the collective of another)", NULL},
    {"WEFT_CUDA_IPC", "int", "1", "1: ranks of one host with device buffers reduce through CUDA IPC with GPU kernels; 0: always through pinned host memory", NULL},
    {"WEFT_TUNE_TRIALS", "int", "0",
     "calls per candidate plan, timed on the first calls of each size class the tuning file does not settle (0: none, the cost model's prediction alone; run weft-tune instead): after one untimed call each, the candidates take turns in up to 3 rounds, each run behind a barrier; a round's time is the mean call of the run on the slowest rank (the first call of each run not counted, but for broadcast and reduce), and the lowest median round wins, no plan counting less than its busiest network port's bytes x beta by the model; ranks agree through one exchange. -1: runs of about 3 ms by the model's clock (8 to 80 calls) in as many rounds (1 to 3) as runs of 8 fit in about 40 ms, so 8 to 240 calls. WEFT_ALGO and weft_comm_set_algo bound the candidates", NULL},
    {"WEFT_TUNE_FILE", "str", "",
     "tuning file written by weft-tune (format in docs/design.md, Selection): rank 0 reads the section for the communicator's shape at init and every rank runs its plans; unset: $XDG_CACHE_HOME/weft/tune, else $HOME/.cache/weft/tune, if it exists. WEFT_ALGO and weft_comm_set_algo still bound the plans", NULL},
    {"WEFT_TUNE_CANDIDATES", "int", "6",
     "plans timed per size class: the best predicted, within 4x of the best prediction (at most 8); a plan that moves the same messages as another in the same predicted time (hier on one node, say) counts once", NULL},
    {"WEFT_ALGO", "str", "", "algorithms allowed, NCCL_ALGO syntax: ring, tree, rhd, direct, hier; ^tree excludes; allreduce:rhd;allgather:ring per collective. A call none of them serves gets the automatic choice. weft_comm_set_algo sets it per communicator", "NCCL_ALGO"},
    {"WEFT_UNIQUE_ID", "str", "", "weft_comm_init_env: the unique id in hex (set by weftrun)", NULL},
    {"WEFT_ROOT", "str", "", "host:port where rank 0 listens: weft_comm_init_env, and weft_get_unique_id then returns the same id everywhere (torchrun style)", "NCCL_COMM_ID"},
    {"WEFT_SECRET", "str", "", "weft_comm_init_env with WEFT_ROOT: shared job secret", NULL},
    {"WEFT_RANK", "str", "", "weft_comm_init_env: this process's rank", NULL},
    {"WEFT_NRANKS", "str", "", "weft_comm_init_env: number of ranks", NULL},
};

/* A registered table and the values read for it.  Entries are written
 * once, under reg_mu, before nsets counts them; readers need no lock. */
struct param_set {
    const struct weft_param_desc *desc;
    size_t n;
    char **values;
    const char **sources; /* the variable that set it, or NULL */
    int64_t *ints;
};

#define MAX_SETS 16

static struct param_set sets[MAX_SETS];
static _Atomic size_t nsets;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
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

static void load(struct param_set *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        const struct weft_param_desc *d = &ps->desc[i];
        const char *env = getenv(d->name);
        ps->sources[i] = env ? d->name : NULL;
        /* NCCL's name counts only when weft's own is unset. */
        if (env == NULL && d->alias && (env = getenv(d->alias)) != NULL)
            ps->sources[i] = d->alias;
        ps->values[i] = strdup(env ? env : d->dflt);
        if (strcmp(d->type, "int") != 0)
            continue;
        if (!weft_parse_size(ps->values[i], &ps->ints[i])) {
            /* A bad value must not silently become 0: warn and keep the default. */
            fprintf(stderr, "weft: %s=\"%s\" is not a number; using the default %s\n",
                    ps->sources[i], ps->values[i], d->dflt);
            weft_parse_size(d->dflt, &ps->ints[i]);
        }
    }
}

/* Makes desc set k and reads it; false when out of memory. */
static bool add_set(size_t k, const struct weft_param_desc *desc, size_t n)
{
    struct param_set *ps = &sets[k];
    ps->values = calloc(n ? n : 1, sizeof(*ps->values));
    ps->sources = calloc(n ? n : 1, sizeof(*ps->sources));
    ps->ints = calloc(n ? n : 1, sizeof(*ps->ints));
    if (!ps->values || !ps->sources || !ps->ints) {
        free(ps->values);
        free(ps->sources);
        free(ps->ints);
        return false;
    }
    ps->desc = desc;
    ps->n = n;
    load(ps);
    atomic_store(&nsets, k + 1);
    return true;
}

static void load_core(void)
{
    if (!add_set(0, core, WEFT_ARRAY_SIZE(core)))
        fprintf(stderr, "weft: out of memory for the parameter table\n");
}

void weft_param_register(const struct weft_param_desc *desc, size_t n)
{
    pthread_once(&once, load_core);
    pthread_mutex_lock(&reg_mu);
    size_t k = atomic_load(&nsets), i = 0;
    while (i < k && sets[i].desc != desc)
        i++;
    if (i == k && (k == MAX_SETS || !add_set(k, desc, n)))
        fprintf(stderr, "weft: internal error: cannot register parameters %s...\n",
                n ? desc[0].name : "");
    pthread_mutex_unlock(&reg_mu);
}

void weft_param_reload(void)
{
    pthread_once(&once, load_core);
    for (size_t k = 0; k < atomic_load(&nsets); k++) {
        for (size_t i = 0; i < sets[k].n; i++)
            free(sets[k].values[i]);
        load(&sets[k]);
    }
}

/* The set and row of name; NULL (said on stderr) when no table has it. */
static const struct param_set *find(const char *name, size_t *row)
{
    pthread_once(&once, load_core);
    size_t k = atomic_load(&nsets);
    for (size_t s = 0; s < k; s++)
        for (size_t i = 0; i < sets[s].n; i++)
            if (strcmp(sets[s].desc[i].name, name) == 0) {
                *row = i;
                return &sets[s];
            }
    fprintf(stderr, "weft: internal error: unknown parameter %s\n", name);
    return NULL;
}

int64_t weft_param_int(const char *name)
{
    size_t i;
    const struct param_set *ps = find(name, &i);
    return ps ? ps->ints[i] : 0;
}

const char *weft_param_str(const char *name)
{
    size_t i;
    const struct param_set *ps = find(name, &i);
    return ps && ps->values[i] ? ps->values[i] : "";
}

const char *weft_param_source(const char *name)
{
    size_t i;
    const struct param_set *ps = find(name, &i);
    return ps ? ps->sources[i] : NULL;
}

const struct weft_param_desc *weft_param_table(size_t k, size_t *n)
{
    pthread_once(&once, load_core);
    if (k >= atomic_load(&nsets))
        return NULL;
    *n = sets[k].n;
    return sets[k].desc;
}
