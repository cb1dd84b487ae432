/*
 * weft-info - what this weft build has and how it is configured:
 *   weft-info                  version, optional parts, interface choice
 *   weft-info --params         every environment parameter (name, default, value, doc)
 *   weft-info --params-md      the same as a Markdown table (the README's)
 *   weft-info --topo           this host as the probe sees it (hwloc or sysfs)
 *   weft-info --table -n N [--hosts K]
 *                              the link table for N ranks in blocks over K hosts
 *                              (named host0..), after WEFT_TRANSPORT and WEFT_TOPO_FILE
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "src/internal.h"
#include "src/sock.h"
#include "src/topo.h"

static void params(bool markdown)
{
    size_t n;
    const struct weft_param_desc *t = weft_param_table(&n);
    if (markdown) {
        printf("| variable | default | meaning |\n|---|---|---|\n");
        for (size_t i = 0; i < n; i++)
            printf("| `%s`%s%s%s | %s%s%s | %s |\n", t[i].name, t[i].alias ? " (`" : "",
                   t[i].alias ? t[i].alias : "", t[i].alias ? "`)" : "", *t[i].dflt ? "`" : "",
                   *t[i].dflt ? t[i].dflt : "(unset)", *t[i].dflt ? "`" : "", t[i].doc);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        const char *src = weft_param_source(t[i].name);
        const char *env = src ? getenv(src) : NULL;
        printf("%-22s default %-10s now %-10s %s\n", t[i].name, *t[i].dflt ? t[i].dflt : "\"\"",
               env ? env : "(default)", t[i].doc);
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

/* weft-info --table -n N [--hosts K]: ranks in contiguous blocks per host,
 * as weftrun and Slurm's block distribution place them. */
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
    char **ids = calloc((size_t)n, sizeof(*ids));
    char (*names)[32] = calloc((size_t)k, sizeof(*names));
    if (ids == NULL || names == NULL) {
        fprintf(stderr, "weft-info: out of memory\n");
        free(ids);
        free(names);
        return 1;
    }
    for (long h = 0; h < k; h++)
        snprintf(names[h], sizeof(names[h]), "host%ld", h);
    for (long r = 0; r < n; r++)
        ids[r] = names[r * k / n];
    char err[512];
    unsigned allowed;
    struct weft_link_table tab;
    int rc = 1;
    const char *spec = getenv("WEFT_TRANSPORT"), *file = getenv("WEFT_TOPO_FILE");
    if (weft_topo_parse_transports(spec ? spec : "", &allowed, err, sizeof(err)) != WEFT_OK ||
        weft_topo_table_init(&tab, (int)n, (const char *const *)ids, allowed, err, sizeof(err)) !=
            WEFT_OK) {
        fprintf(stderr, "weft-info: %s\n", err);
        goto out;
    }
    if (file && *file && weft_topo_table_load(&tab, file, err, sizeof(err)) != WEFT_OK) {
        fprintf(stderr, "weft-info: WEFT_TOPO_FILE: %s\n", err);
        weft_topo_table_fini(&tab);
        goto out;
    }
    if (file && *file)
        printf("topology file: %s\n", file);
    weft_topo_table_print(&tab, stdout);
    weft_topo_table_fini(&tab);
    rc = 0;
out:
    free(ids);
    free(names);
    return rc;
}

static const char *yes(int v)
{
    return v ? "yes" : "no";
}

int main(int argc, char **argv)
{
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
    if (argc > 1 && strcmp(argv[1], "--table") == 0)
        return table(argc, argv);
    if (argc > 1) {
        fprintf(stderr,
                "usage: weft-info [--params | --params-md | --topo | --table -n N [--hosts K]]\n");
        return 2;
    }
#ifdef HAVE_VERBS
    int verbs = 1;
#else
    int verbs = 0;
#endif
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
    printf("transports: tcp\nalgorithms: ring\n");
    printf("configure found: libibverbs %s, hwloc %s, CUDA %s (no transport uses them yet)\n",
           yes(verbs), yes(hwloc), yes(cuda));
    union weft_sockaddr a;
    char ifname[64], buf[96];
    if (weft_sock_pick_iface(NULL, &a, ifname, sizeof(ifname)) == WEFT_OK)
        printf("weft_get_unique_id would listen on %s (%s)\n", weft_sock_str(&a, buf, sizeof(buf)),
               ifname);
    return 0;
}
