/*
 * topo_impl.h - the link table's layers, shared by topo_link.c (building
 * and reading the table) and topo_file.c (the topology file).  Internal to
 * those two files.
 */
#ifndef WEFT_TOPO_IMPL_H
#define WEFT_TOPO_IMPL_H

#include <math.h>

#include "select/topo.h"

/* What one file line (or a calibration) asks of a link: transport -1 and
 * NAN costs for what it leaves alone; line 0 for "nothing". */
struct weft_link_setting {
    int transport;
    double alpha, beta;
    int line;
};
#define WEFT_LINK_NO_SETTING ((struct weft_link_setting){-1, NAN, NAN, 0})

/* A `hosts` line: match[h] bit 0 when host h matches pattern a, bit 1 b. */
struct weft_link_hosts_rule {
    struct weft_link_setting s;
    unsigned char *match; /* (nhosts) */
};

/* Per-pair layers, keyed i << 32 | j with i < j (so never 0, the empty
 * slot); open addressing, linear probing, at most half full. */
struct weft_link_pair {
    uint64_t key;
    struct weft_link_setting file; /* merged `pair` lines */
    struct weft_link_setting meas; /* calibration; transport -1 when none */
};

struct weft_link_rules {
    struct weft_link_hosts_rule *hosts;
    int nhosts_rules, hosts_cap;
    struct weft_link_pair *slots;
    size_t cap, used; /* cap: a power of two, or 0 */
};

/* The key of the unordered pair i, j (i != j). */
static inline uint64_t weft_link_pair_key(int i, int j)
{
    if (i > j) {
        int t = i;
        i = j;
        j = t;
    }
    return (uint64_t)(uint32_t)i << 32 | (uint32_t)j;
}
/* Makes room for extra more entries, so that weft_link_map_get cannot fail. */
bool weft_link_map_reserve(struct weft_link_rules *r, size_t extra) WEFT_HIDDEN;
/* The entry for key, added empty if absent; room must be reserved. */
struct weft_link_pair *weft_link_map_get(struct weft_link_rules *r, uint64_t key) WEFT_HIDDEN;

/* snprintf into err (NULL or errlen 0: nothing). */
/* n bytes of s for a message: printable ASCII kept, the rest as \xNN, cut
 * after ~40 characters; returns out. */
const char *weft_topo_quote(const char *s, size_t n, char *out, size_t len) WEFT_HIDDEN;

#endif /* WEFT_TOPO_IMPL_H */
