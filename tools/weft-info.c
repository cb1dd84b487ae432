/*
 * weft-info - what this weft build has and how it is configured:
 *   weft-info                  version, transports (and why one is not
 *                              available), algorithms, interface choice
 *   weft-info --params         every environment parameter (name, default, value, doc)
 *   weft-info --params-md      the same as a Markdown table (the README's)
 *   weft-info --topo           this host as the probe sees it (hwloc or sysfs)
 *   weft-info --table -n N [--hosts K]
 *                              the link table for N ranks in blocks over K hosts
 *                              (named host0..), after WEFT_TRANSPORT and WEFT_TOPO_FILE
 *   weft-info --plans          per collective, the plans (algorithm/variant)
 *                              that build it, as WEFT_ALGO and -a name them
 *   weft-info --tune -n N | --nodes K --ppn M [--alpha-us A] [--gbps B]
 *             [--inter-alpha-us A] [--inter-gbps B] [--chunk BYTES] [--cores C]
 *                              the algorithm weft would choose for each
 *                              collective and size on that topology (links
 *                              inside a node: shm defaults or the first two
 *                              flags; between nodes: tcp defaults or the
 *                              inter flags; on this host its ranks share
 *                              its cores, else --cores per node or a core
 *                              per rank), with the predictions
 *   weftrun -n N weft-info --job
 *                              joins the job as a rank; rank 0 prints the table
 *                              the communicator really built (hosts, transports
 *                              per pair, calibrated costs)
 */
#include <dirent.h>
#include <sched.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "config.h"
#include "algorithms/schedule.h"
#include "src/comm.h"
#include "transports/registry.h"
#include "base/internal.h"
#include "base/sock.h"
#include "select/topo.h"
#include "select/tune.h"
#ifdef HAVE_CUDA
#include "base/cudrv.h"
#include "src/cuda/kernels.h"
#endif

/* Every table: the core one, then each transport's in registry order. */
static void params(bool markdown)
{
    size_t n;
    const struct weft_param_desc *t;
    if (markdown)
        printf("| variable | default | meaning |\n|---|---|---|\n");
    for (size_t k = 0; (t = weft_param_table(k, &n)) != NULL; k++) {
        for (size_t i = 0; i < n && markdown; i++)
            printf("| `%s`%s%s%s | %s%s%s | %s |\n", t[i].name, t[i].alias ? " (`" : "",
                   t[i].alias ? t[i].alias : "", t[i].alias ? "`)" : "", *t[i].dflt ? "`" : "",
                   *t[i].dflt ? t[i].dflt : "(unset)", *t[i].dflt ? "`" : "", t[i].doc);
        for (size_t i = 0; i < n && !markdown; i++) {
            const char *src = weft_param_source(t[i].name);
            const char *env = src ? getenv(src) : NULL;
            printf("%-22s default %-10s now %-10s %s\n", t[i].name,
                   *t[i].dflt ? t[i].dflt : "\"\"", env ? env : "(default)", t[i].doc);
        }
    }
}

static int topo(void)
{
    struct weft_topo t;
    weft_topo_probe(&t);
    weft_topo_print(&t, stdout);
    return 0;
}

static bool parse_count(const char *s, long *out)
{
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (s == NULL || errno || end == s || *end || v < 1 || v > 1000000)
        return false;
    *out = v;
    return true;
}

/* The link table of n ranks in contiguous blocks over k hosts (host0..),
 * as weftrun and Slurm's block distribution place them, after
 * WEFT_TRANSPORT and WEFT_TOPO_FILE.  Nonzero (said on stderr) on error. */
static int host_table(long n, long k, struct weft_link_table *tab)
{
    char **ids = calloc((size_t)n, sizeof(*ids));
    char (*names)[32] = calloc((size_t)k, sizeof(*names));
    int rc = 1;
    if (ids == NULL || names == NULL) {
        fprintf(stderr, "weft-info: out of memory\n");
        goto out;
    }
    for (long h = 0; h < k; h++)
        snprintf(names[h], sizeof(names[h]), "host%ld", h);
    for (long r = 0; r < n; r++)
        ids[r] = names[r * k / n];
    char err[512];
    unsigned allowed;
    const char *spec = getenv("WEFT_TRANSPORT"), *file = getenv("WEFT_TOPO_FILE");
    bool ok = weft_topo_parse_transports(spec ? spec : "", &allowed, err, sizeof(err)) == WEFT_OK;
    /* Hosts joined by tcp, unless WEFT_TRANSPORT names verbs: whether a
     * real job gets a WEFT_TP_ALL_RANKS transport depends on devices this
     * model does not see. */
    for (int t = 0; weft_transports[t]; t++)
        if ((weft_transports[t]->flags & WEFT_TP_ALL_RANKS) &&
            !(spec && strstr(spec, weft_transports[t]->name) && spec[0] != '^'))
            allowed &= ~(1u << t);
    if (!ok ||
        weft_topo_table_init(tab, (int)n, (const char *const *)ids, allowed, err, sizeof(err)) !=
            WEFT_OK) {
        fprintf(stderr, "weft-info: %s\n", err);
        goto out;
    }
    if (file && *file && weft_topo_table_load(tab, file, err, sizeof(err)) != WEFT_OK) {
        fprintf(stderr, "weft-info: WEFT_TOPO_FILE: %s\n", err);
        weft_topo_table_fini(tab);
        goto out;
    }
    if (file && *file)
        printf("topology file: %s\n", file);
    rc = 0;
out:
    free(ids);
    free(names);
    return rc;
}

/* weft-info --table -n N [--hosts K] */
static int table(int argc, char **argv)
{
    long n = 0, k = 1;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "-n") == 0 && i + 1 < argc && parse_count(argv[i + 1], &n))
            i++;
        else if (strcmp(argv[i], "--hosts") == 0 && i + 1 < argc && parse_count(argv[i + 1], &k))
            i++;
        else {
            fprintf(stderr, "weft-info --table: bad argument '%s' (expected -n N [--hosts K])\n",
                    argv[i]);
            return 2;
        }
    }
    if (n < 1 || k > n) {
        fprintf(stderr, "weft-info --table needs -n N (1 or more) and at most N hosts\n");
        return 2;
    }
    struct weft_link_table tab;
    if (host_table(n, k, &tab))
        return 1;
    weft_topo_table_print(&tab, stdout);
    weft_topo_table_fini(&tab);
    return 0;
}

static bool parse_real(const char *s, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = s ? strtod(s, &end) : 0;
    if (s == NULL || errno || end == s || *end || !(v >= lo && v <= hi))
        return false;
    *out = v;
    return true;
}

/* weft-info --plans: per collective, every plan that builds it, by the
 * names WEFT_ALGO and the perf tools' -a take. */
static int plans(void)
{
    for (int coll = 0; coll < WEFT_COLL_SEND; coll++) {
        printf("%s:", weft_coll_name(coll));
        for (int a = 0; a < WEFT_ALGO_COUNT; a++)
            for (int v = 0; v < WEFT_VAR_COUNT; v++)
                if (weft_algo_serves(a, v, coll)) {
                    char b[32];
                    printf(" %s", weft_plan_name((struct weft_plan){a, v}, b, sizeof(b)));
                }
        printf("\n");
    }
    return 0;
}

/* weft-info --tune: what weft_tune_select picks, size by size, for every
 * collective, with the predictions behind it.  Link costs: the defaults
 * (shm inside a node, tcp between), WEFT_TOPO_FILE, then the flags. */
static int tune(int argc, char **argv)
{
    long n = 0, nodes = 0, ppn = 0, cores = 0;
    double a_in = -1, g_in = -1, a_out = -1, g_out = -1, chunk = 524288;
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (strcmp(f, "-n") == 0)
            ok = ok && parse_count(v, &n);
        else if (strcmp(f, "--nodes") == 0)
            ok = ok && parse_count(v, &nodes);
        else if (strcmp(f, "--ppn") == 0)
            ok = ok && parse_count(v, &ppn);
        else if (strcmp(f, "--alpha-us") == 0)
            ok = ok && parse_real(v, 0, 1e7, &a_in);
        else if (strcmp(f, "--gbps") == 0)
            ok = ok && parse_real(v, 1e-6, 1e5, &g_in);
        else if (strcmp(f, "--inter-alpha-us") == 0)
            ok = ok && parse_real(v, 0, 1e7, &a_out);
        else if (strcmp(f, "--inter-gbps") == 0)
            ok = ok && parse_real(v, 1e-6, 1e5, &g_out);
        else if (strcmp(f, "--chunk") == 0)
            ok = ok && parse_real(v, 64, 1 << 30, &chunk);
        else if (strcmp(f, "--cores") == 0)
            ok = ok && parse_count(v, &cores);
        else
            ok = false;
        if (!ok) {
            fprintf(stderr, "weft-info --tune: bad argument '%s'%s%s (expected -n N | --nodes K "
                    "--ppn M, [--alpha-us A] [--gbps B] [--inter-alpha-us A] [--inter-gbps B] "
                    "[--chunk BYTES] [--cores C])\n", f, v ? " " : "", v ? v : "");
            return 2;
        }
        i++;
    }
    if (nodes || ppn) {
        if (!nodes || !ppn || (n && n != nodes * ppn)) {
            fprintf(stderr, "weft-info --tune: --nodes K and --ppn M go together, and -n, when "
                    "given, must be K * M\n");
            return 2;
        }
        n = nodes * ppn;
    } else {
        nodes = 1;
        /* This host: its ranks share the cores this process may use. */
        cpu_set_t set;
        if (cores == 0 && sched_getaffinity(0, sizeof(set), &set) == 0)
            cores = CPU_COUNT(&set);
    }
    if (n < 1) {
        fprintf(stderr, "weft-info --tune needs -n N or --nodes K --ppn M\n");
        return 2;
    }
    struct weft_link_table tab;
    if (host_table(n, nodes, &tab))
        return 1;
    /* The model's two link kinds: shm inside a node, tcp between nodes. */
    int shm = weft_transport_find("shm"), tcp = weft_transport_find("tcp");
    if (a_in >= 0 || g_in > 0)
        weft_topo_table_set_default(&tab, shm, a_in >= 0 ? a_in * 1e-6 : tab.alpha[shm],
                                    g_in > 0 ? 1e-9 / g_in : tab.beta[shm]);
    if (a_out >= 0 || g_out > 0)
        weft_topo_table_set_default(&tab, tcp, a_out >= 0 ? a_out * 1e-6 : tab.alpha[tcp],
                                    g_out > 0 ? 1e-9 / g_out : tab.beta[tcp]);
    int *group = NULL, *group_cores = NULL;
    if (cores > 0) {
        group = calloc((size_t)n, sizeof(int));
        group_cores = calloc((size_t)nodes, sizeof(int));
        if (!group || !group_cores) {
            fprintf(stderr, "weft-info: out of memory\n");
            free(group);
            free(group_cores);
            weft_topo_table_fini(&tab);
            return 1;
        }
        for (long r = 0; r < n; r++)
            group[r] = tab.host[r];
        for (long h = 0; h < nodes; h++)
            group_cores[h] = (int)cores;
    }
    unsigned masks[WEFT_COLL_COUNT];
    const char *algo = getenv("WEFT_ALGO");
    if (weft_tune_parse_algo(algo ? algo : "", masks) != WEFT_OK) {
        fprintf(stderr, "weft-info: %s\n", weft_thread_last_error());
        weft_topo_table_fini(&tab);
        free(group);
        free(group_cores);
        return 2;
    }
    char cores_text[64] = "a core per rank";
    if (cores > 0)
        snprintf(cores_text, sizeof(cores_text), "%ld cores per node", cores);
    printf("selection for %ld ranks on %ld node%s (%ld per node); links: inside a node %s "
           "alpha %.2f us %.2f GB/s, between nodes alpha %.2f us %.2f GB/s; chunk %.0f B; %s\n",
           n, nodes, nodes > 1 ? "s" : "", n / nodes,
           weft_transport_name(tab.allowed & (1u << shm) ? shm : tcp), tab.alpha[shm] * 1e6,
           1e-9 / tab.beta[shm], tab.alpha[tcp] * 1e6, 1e-9 / tab.beta[tcp], chunk, cores_text);
    for (int coll = 0; coll < WEFT_COLL_SEND; coll++) {
        printf("\n%s (float32)\n%12s  %-18s %12s  %-18s %12s\n", weft_coll_name(coll), "bytes",
               "chosen", "predicted us", "runner-up", "its us");
        for (size_t bytes = 8; bytes <= ((size_t)64 << 20); bytes *= 4) {
            struct weft_tune_in in = {
                .nranks = (int)n, .links = &tab, .chunk_bytes = (size_t)chunk,
                .gamma = WEFT_TUNE_GAMMA, .mask = masks[coll], .cpu_group = group,
                .group_cores = group_cores,
            };
            double t, t2 = 0;
            bool fell;
            struct weft_plan pl = weft_tune_select(&in, coll, bytes, 4, &t, &fell), p2 = {-1, 0};
            /* The runner-up: the best with the winner taken out. */
            in.mask &= ~WEFT_PLAN_BIT(pl.algo, pl.variant);
            if (in.mask && n > 1) {
                p2 = weft_tune_select(&in, coll, bytes, 4, &t2, &fell);
                if (fell)
                    p2.algo = -1;
            }
            char a[32], b[32];
            printf("%12zu  %-18s %12.2f  %-18s", bytes, weft_plan_name(pl, a, sizeof(a)), t * 1e6,
                   p2.algo >= 0 ? weft_plan_name(p2, b, sizeof(b)) : "-");
            if (p2.algo >= 0)
                printf(" %12.2f", t2 * 1e6);
            printf("\n");
        }
    }
    weft_topo_table_fini(&tab);
    free(group);
    free(group_cores);
    return 0;
}

static const char *yes(int v)
{
    return v ? "yes" : "no";
}

/* weftrun -n N weft-info --job: every rank joins; rank 0 prints. */
static int job(void)
{
    weft_comm_t comm;
    if (weft_comm_init_env(&comm) != WEFT_OK) {
        fprintf(stderr, "weft-info --job: %s\n", weft_last_error(NULL));
        return 1;
    }
    if (comm->rank == 0) {
        printf("job: %d ranks; WEFT_CALIBRATE=%lld\n", comm->nranks,
               (long long)weft_param_int("WEFT_CALIBRATE"));
        for (int h = 0; h < comm->topo.nhosts; h++)
            printf("  host %d: %s\n", h, comm->topo.hostid[h]);
        for (int i = 0; i < comm->ntp; i++)
            printf("  rank 0 uses %s\n", weft_transports[comm->tp[i].kind]->name);
        weft_topo_table_print(&comm->topo, stdout);
        fflush(stdout);
    }
    return weft_comm_destroy(comm) == WEFT_OK ? 0 : 1;
}

int main(int argc, char **argv)
{
    weft_transport_register_params(); /* --params lists them; the status lines read them */
    if (argc > 1 && strcmp(argv[1], "--params") == 0) {
        params(false);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--params-md") == 0) {
        params(true);
        return 0;
    }
    if (argc > 1 && strcmp(argv[1], "--topo") == 0)
        return topo();
    if (argc == 2 && strcmp(argv[1], "--plans") == 0)
        return plans();
    if (argc > 1 && strcmp(argv[1], "--tune") == 0)
        return tune(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--table") == 0)
        return table(argc, argv);
    if (argc == 2 && strcmp(argv[1], "--job") == 0)
        return job();
    if (argc > 1) {
        fprintf(stderr, "usage: weft-info [--params | --params-md | --topo | --plans | --table -n N "
                        "[--hosts K] | --tune -n N | --tune --nodes K --ppn M | --job (under weftrun)]\n");
        return 2;
    }
#ifdef HAVE_HWLOC
    int hwloc = 1;
#else
    int hwloc = 0;
#endif
#ifdef HAVE_CUDA
    int cuda = 1;
#else
    int cuda = 0;
#endif
    printf("weft %d.%d.%d\n", WEFT_VERSION_MAJOR, WEFT_VERSION_MINOR, WEFT_VERSION_PATCH);
    printf("transports:\n");
    for (int t = 0; weft_transports[t]; t++)
        if (weft_transports[t]->status)
            weft_transports[t]->status(stdout);
    printf("algorithms:");
    for (int i = 0; i < WEFT_ALGO_COUNT; i++)
        printf(" %s", weft_algo_name(i));
    printf(" (WEFT_ALGO restricts them)\n");
    printf("configure found: hwloc %s (topology: %s), CUDA %s\n", yes(hwloc),
           hwloc ? "hwloc" : "/sys and /proc", yes(cuda));
#ifdef HAVE_CUDA
    const char *why = NULL;
    const struct weft_cu *cu = weft_cu_get(&why);
    if (cu != NULL)
        printf("CUDA: driver %d.%d, %d device(s), streams wait %s; GPU kernels %s\n",
               cu->version / 1000, cu->version % 1000 / 10, cu->ndev,
               cu->memops ? "on a flag (stream memory operations)" : "in host functions",
               weft_cuda_fatbin_len ? "built (nvcc)" : "not built (device reductions through host memory)");
    else
        printf("CUDA: %s; device buffers and streams unavailable\n", why);
#endif
    return 0;
}
