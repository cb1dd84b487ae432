/*
 * topo.h - what this host is made of (the probe: CPUs, NUMA nodes, caches,
 * NICs, GPUs) and what connects each pair of ranks (the link table: a
 * transport and its cost, alpha seconds per message plus beta seconds per
 * byte).  The probe is topo.c; the table and the fit topo_link.c; the
 * topology file topo_file.c.
 *
 * The topology file's format and how it layers over the defaults and
 * the calibration: docs/topology-file.md.
 */
#ifndef WEFT_TOPO_H
#define WEFT_TOPO_H

#include <sched.h>
#include <stdint.h>
#include <stdio.h>

#include "base/internal.h"
#include "transports/registry.h"

/* ---- the probe (topo.c) -------------------------------------------------- */

#define WEFT_TOPO_MAX_NUMA 64
#define WEFT_TOPO_MAX_NICS 64
#define WEFT_TOPO_MAX_GPUS 64

struct weft_topo_numa {
    int id;            /* the OS's node number */
    int ncpus;         /* CPUs in cpus */
    int64_t mem_bytes; /* -1: unknown */
    cpu_set_t cpus;
};

struct weft_topo_nic {
    char name[32];
    char bus_id[24];  /* PCI "0000:03:00.0", "virtual", or "" unknown */
    char state[16];   /* operstate: "up", "down", ... or "" unknown */
    int numa;         /* -1: unknown */
    int speed_mbps;   /* -1: unknown (virtual, link down, not reported) */
};

struct weft_topo_gpu {
    char bus_id[24];
    unsigned device_id; /* PCI device id (vendor is always NVIDIA, 0x10de) */
    int numa;           /* -1: unknown */
};

/* A snapshot of this host, filled by weft_topo_probe*.  Every count or size
 * is -1 when it could not be read (nnuma/nnics/ngpus are 0 then); the
 * strings are "" when unknown.  Arrays keep the first WEFT_TOPO_MAX_* found,
 * *_found counts them all.  Plain data: copy it, free nothing. */
struct weft_topo {
    char source[32];     /* "hwloc 2.9.0" or "sysfs": who described CPUs/caches/NUMA */
    char cpu_model[128];
    int sockets, cores, threads; /* threads: hardware threads (PUs) online */
    int64_t l2_bytes, l3_bytes;  /* one instance of the cache */
    int l3_cpus;                 /* CPUs sharing one L3 */
    int nnuma;
    struct weft_topo_numa numa[WEFT_TOPO_MAX_NUMA];
    int nnics, nics_found;       /* always from /sys/class/net (so virtual ones show) */
    struct weft_topo_nic nics[WEFT_TOPO_MAX_NICS];
    int ngpus, gpus_found;       /* PCI class 0x03xxxx, vendor 0x10de */
    struct weft_topo_gpu gpus[WEFT_TOPO_MAX_GPUS];
    int nallowed;                /* CPUs this process may run on */
    cpu_set_t allowed;
};

/* Describes this host: with hwloc when weft was built with it and hwloc
 * loads, else from /sys and /proc.  Never fails: whatever cannot be read
 * (containers, network namespaces, odd kernels) is left unknown.  hwloc's
 * part (CPUs, caches, NUMA, GPUs) is read once per process; NICs and the
 * allowed CPUs at every call.  Thread-safe. */
void weft_topo_probe(struct weft_topo *t) WEFT_HIDDEN;
/* The sysfs reader only, on root/sys/... and root/proc/... (tests point it
 * at fixture trees; "" or "/" is the real one).  The allowed CPUs come from
 * root/proc/self/status when root is not the real one. */
void weft_topo_probe_root(struct weft_topo *t, const char *root) WEFT_HIDDEN;
/* A readable multi-line summary. */
void weft_topo_print(const struct weft_topo *t, FILE *f) WEFT_HIDDEN;
/* Writes s as a cpulist ("0-3,8,10-11"; "" when empty) into buf. */
void weft_topo_cpulist(const cpu_set_t *s, char *buf, size_t len) WEFT_HIDDEN;

/* ---- the link table (topo_link.c) ----------------------------------------- */

/* A link's transport is its index in the transport registry
 * (transports/registry.h, weft_transports[]): its link kind. */

/* Where a link's cost came from. */
enum weft_link_source { WEFT_LINK_FROM_DEFAULT, WEFT_LINK_FROM_MEASURED, WEFT_LINK_FROM_FILE };

/* One direction of one pair, as weft_topo_table_get computes it. */
struct weft_link {
    int transport; /* index in weft_transports[] */
    int source;    /* enum weft_link_source of the cost */
    int line;      /* the file line that set the cost last (source FILE), else 0 */
    double alpha;  /* seconds per message */
    double beta;   /* seconds per byte */
};

struct weft_link_rules; /* topo_link.c */

/* Per-pair transport and cost for n ranks, stored as host layout +
 * per-transport defaults + sparse overrides, so 10,000 ranks cost O(n)
 * memory, not n^2.  Owner: whoever called weft_topo_table_init, which
 * releases it with weft_topo_table_fini.  Invariants: 0 <= host[r] <
 * nhosts; hosts are numbered by their first rank; every class of pair
 * that occurs has a transport (pick).  A pair takes the allowed transport
 * of lowest priority that reaches it (shm on one host, else verbs, else
 * tcp; self for a rank with itself), unless the file says otherwise. */
struct weft_link_table {
    int n;                 /* ranks */
    int nhosts;
    int *host;             /* (n) host index of each rank */
    char **hostid;         /* (nhosts) owned copies of the host ids */
    unsigned allowed;      /* 1u << transport, as WEFT_TRANSPORT allows (implicit ones
                              such as self are not in it, and always usable) */
    int pick[3];           /* the default transport of a pair across hosts [0], on one
                              host [1], of a rank with itself [2]; -1: none reaches */
    double alpha[WEFT_MAX_TRANSPORTS]; /* defaults, seconds */
    double beta[WEFT_MAX_TRANSPORTS];  /* defaults, seconds per byte */
    struct weft_link_rules *rules;       /* file lines and measurements */
};

/* WEFT_TRANSPORT ("shm,tcp", "tcp", "^shm", "verbs"; "" allows all) -> allowed mask
 * (1u << transport, the implicit ones never in it).
 * An unknown name or a list that leaves nothing is WEFT_ERR_INVALID_ARG,
 * with a message in err. */
weft_status_t weft_topo_parse_transports(const char *spec, unsigned *allowed, char *err,
                                         size_t errlen) WEFT_HIDDEN;
/* Builds the default table: hostid[r] is rank r's host identity (NULL: all
 * on one host; the strings are copied).  Every pair needs an allowed
 * transport that reaches it (ranks on different hosts: tcp or verbs), else
 * WEFT_ERR_INVALID_ARG naming two such ranks.  On error *tab is left empty
 * (fini is still safe). */
weft_status_t weft_topo_table_init(struct weft_link_table *tab, int n, const char *const *hostid,
                                   unsigned allowed, char *err, size_t errlen) WEFT_HIDDEN;
/* Releases what init allocated; accepts NULL and a zeroed or failed table. */
void weft_topo_table_fini(struct weft_link_table *tab) WEFT_HIDDEN;
/* (topo_file.c) Applies a topology file (docs/topology-file.md); may be
 * called more than once, later files stacking on earlier ones.
 * WEFT_ERR_SYSTEM when it cannot be read, WEFT_ERR_INVALID_ARG on a bad
 * line; either way err says why and the table is unchanged. */
weft_status_t weft_topo_table_load(struct weft_link_table *tab, const char *path, char *err,
                                   size_t errlen) WEFT_HIDDEN;
/* The same on text in memory (len bytes, NULs included); name is what
 * messages call it. */
weft_status_t weft_topo_table_parse(struct weft_link_table *tab, const char *text, size_t len,
                                    const char *name, char *err, size_t errlen) WEFT_HIDDEN;
/* Replaces a transport's default cost (say, tcp from the NIC's speed). */
weft_status_t weft_topo_table_set_default(struct weft_link_table *tab, int transport,
                                          double alpha, double beta) WEFT_HIDDEN;
/* Records a calibration result for the pair i, j (both directions) on the
 * transport the pair uses now.  alpha, beta finite and >= 0. */
weft_status_t weft_topo_table_set_measured(struct weft_link_table *tab, int i, int j,
                                           double alpha, double beta) WEFT_HIDDEN;
/* The link from i to j; WEFT_ERR_INVALID_ARG when a rank is out of range. */
weft_status_t weft_topo_table_get(const struct weft_link_table *tab, int i, int j,
                                  struct weft_link *out) WEFT_HIDDEN;
/* Layout, defaults, a transport matrix (up to 64 ranks) and every distinct
 * link cost with how many pairs have it and where it came from. */
void weft_topo_table_print(const struct weft_link_table *tab, FILE *f) WEFT_HIDDEN;

/* ---- calibration (topo_link.c) -------------------------------------------- */

/* Fits seconds = alpha + beta * bytes to n one-way ping-pong times, in
 * relative terms (a 5% miss at 8 B weighs what a 5% miss at 64 MiB does).
 * Repeats of one size are reduced to their median first; with four or more
 * sizes left, one size that misses the fit of the others badly (> 50% and
 * > 5x their spread) is dropped.  alpha, beta >= 0.  Needs two distinct
 * sizes, finite bytes >= 0 and seconds > 0: else WEFT_ERR_INVALID_ARG. */
weft_status_t weft_topo_fit(const double *bytes, const double *seconds, int n, double *alpha,
                            double *beta) WEFT_HIDDEN;

/* ---- calibration at init (calibrate.c) ------------------------------------ */

/* The edge i -> i+1 (mod n) as its pinger measured it. */
struct weft_cal_edge {
    int i, j;
    int transport; /* index in weft_transports[] */
    double alpha, beta;
};

/* What the init ping-pong found: per measured edge, and per transport the
 * median over its edges (have[t] false: none measured).  Every rank of the
 * communicator holds the same. */
struct weft_cal {
    int nedges;
    struct weft_cal_edge *edges; /* owned; weft_cal_free */
    bool have[WEFT_MAX_TRANSPORTS];
    double alpha[WEFT_MAX_TRANSPORTS], beta[WEFT_MAX_TRANSPORTS];
};


#endif /* WEFT_TOPO_H */
