/*
 * fuzz_topo.c - the topology file (WEFT_TOPO_FILE, select/topo_file.c) on a
 * table of up to 8 ranks on up to 3 hosts.  A good file leaves every link
 * consistent (self on the diagonal, shm only within a host, allowed
 * transports only, finite costs, both directions alike); a bad one is
 * refused with a printable message naming the file and changes nothing.
 *
 * Input: ranks u8 (1 + b % 8), hosts u16 (2 bits a rank), allowed u8
 * (mod 3: all, tcp, shm), then the file.
 */
#include <math.h>

#include "fuzz.h"
#include "select/topo.h"

/* The built-in transports' link kinds, found by name as any caller would. */
#define SELF weft_transport_find("self")
#define SHM weft_transport_find("shm")
#define TCP weft_transport_find("tcp")

#define MAX_RANKS 8

static bool same_link(const struct weft_link *a, const struct weft_link *b)
{
    return a->transport == b->transport && a->source == b->source && a->line == b->line &&
           a->alpha == b->alpha && a->beta == b->beta;
}

static void links(const struct weft_link_table *tab, struct weft_link *out)
{
    for (int i = 0; i < tab->n; i++)
        for (int j = 0; j < tab->n; j++)
            FUZZ_CHECK(weft_topo_table_get(tab, i, j, &out[i * tab->n + j]) == WEFT_OK,
                       "get %d %d", i, j);
}

int weft_fuzz_topo(const uint8_t *data, size_t size)
{
    static const char *const hostnames[] = {"rackA-n1", "rackA-n2", "rackB-n1", "rackB-n1"};
    const unsigned allow[] = {weft_transport_choosable(), 1u << TCP, 1u << SHM};
    weft_fuzz_setup();
    struct fuzz_in in = {data, size};
    int n = 1 + fuzz_u8(&in) % MAX_RANKS;
    unsigned hosts = (unsigned)fuzz_le(&in, 2);
    unsigned allowed = allow[fuzz_u8(&in) % 3];
    const char *ids[MAX_RANKS];
    for (int r = 0; r < n; r++)
        ids[r] = hostnames[hosts >> (2 * r) & 3];
    struct weft_link_table tab;
    char err[256];
    if (weft_topo_table_init(&tab, n, ids, allowed, err, sizeof(err)) != WEFT_OK) {
        /* shm only across hosts: refused, as it must be; use both. */
        weft_topo_table_fini(&tab);
        allowed = weft_transport_choosable();
        FUZZ_CHECK(weft_topo_table_init(&tab, n, ids, allowed, err, sizeof(err)) == WEFT_OK,
                   "%s", err);
    }
    struct weft_link before[MAX_RANKS * MAX_RANKS], after[MAX_RANKS * MAX_RANKS];
    links(&tab, before);

    err[0] = '\0';
    weft_status_t st = weft_topo_table_parse(&tab, (const char *)in.p, in.n, "fuzz.topo", err,
                                             sizeof(err));
    links(&tab, after);
    if (st != WEFT_OK) {
        FUZZ_CHECK(st == WEFT_ERR_INVALID_ARG, "status %d: %s", st, err);
        FUZZ_CHECK(fuzz_text_ok(err, sizeof(err)) && strncmp(err, "fuzz.topo:", 10) == 0,
                   "message '%s'", err);
        for (int k = 0; k < n * n; k++)
            FUZZ_CHECK(same_link(&before[k], &after[k]), "a refused file changed link %d-%d",
                       k / n, k % n);
    }
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            const struct weft_link *l = &after[i * n + j];
            FUZZ_CHECK(l->transport >= 0 && l->transport < weft_transport_count(), "transport %d",
                       l->transport);
            FUZZ_CHECK((i == j) == (l->transport == SELF), "%d-%d: %s", i, j,
                       weft_transport_name(l->transport));
            FUZZ_CHECK(l->transport != SHM || tab.host[i] == tab.host[j],
                       "%d-%d: shm across hosts", i, j);
            FUZZ_CHECK(i == j || (allowed & 1u << l->transport), "%d-%d: %s is not allowed", i,
                       j, weft_transport_name(l->transport));
            FUZZ_CHECK(isfinite(l->alpha) && l->alpha >= 0 && isfinite(l->beta) && l->beta >= 0,
                       "%d-%d: alpha %g beta %g", i, j, l->alpha, l->beta);
            FUZZ_CHECK(same_link(l, &after[j * n + i]), "%d-%d differs from %d-%d", i, j, j, i);
        }
    weft_topo_table_fini(&tab);
    return 0;
}

WEFT_FUZZ_ENTRY(weft_fuzz_topo)
