/*
 * weft-info - what this weft build has and how it is configured:
 *   weft-info                  version, optional parts, interface choice
 *   weft-info --params         every environment parameter (name, default, value, doc)
 *   weft-info --params-md      the same as a Markdown table (the README's)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "src/internal.h"
#include "src/sock.h"

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
    if (argc > 1) {
        fprintf(stderr, "usage: weft-info [--params | --params-md]\n");
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
