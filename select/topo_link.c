/*
 * topo_link.c - the per-pair link table: which transport joins ranks i and
 * j and what a message costs on it (alpha + beta * bytes), computed on
 * demand from layers (defaults, calibration, the topology file of
 * topo_file.c); and the alpha-beta fit of ping-pong times.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "select/topo_impl.h"

const char *weft_topo_quote(const char *s, size_t n, char *out, size_t len)
{
    size_t at = 0;
    for (size_t i = 0; i < n && at + 8 < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (at >= 40) {
            memcpy(out + at, "...", 3);
            at += 3;
            break;
        }
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[at++] = (char)c;
        else
            at += (size_t)snprintf(out + at, len - at, "\\x%02x", c);
    }
    out[at] = '\0';
    return out;
}

/* ---- the pair map ------------------------------------------------------------ */

static size_t slot_of(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static struct weft_link_pair *map_find(const struct weft_link_rules *r, uint64_t key)
{
    if (r->cap == 0)
        return NULL;
    for (size_t s = slot_of(key, r->cap);; s = (s + 1) & (r->cap - 1)) {
        if (r->slots[s].key == key)
            return &r->slots[s];
        if (r->slots[s].key == 0)
            return NULL;
    }
}

bool weft_link_map_reserve(struct weft_link_rules *r, size_t extra)
{
    size_t want = r->used + extra;
    if (want * 2 <= r->cap)
        return true;
    size_t cap = r->cap ? r->cap : 64;
    while (cap < want * 2)
        cap *= 2;
    struct weft_link_pair *slots = calloc(cap, sizeof(*slots));
    if (slots == NULL)
        return false;
    for (size_t i = 0; i < r->cap; i++) {
        if (r->slots[i].key == 0)
            continue;
        size_t s = slot_of(r->slots[i].key, cap);
        while (slots[s].key != 0)
            s = (s + 1) & (cap - 1);
        slots[s] = r->slots[i];
    }
    free(r->slots);
    r->slots = slots;
    r->cap = cap;
    return true;
}

struct weft_link_pair *weft_link_map_get(struct weft_link_rules *r, uint64_t key)
{
    size_t s = slot_of(key, r->cap);
    while (r->slots[s].key != 0 && r->slots[s].key != key)
        s = (s + 1) & (r->cap - 1);
    if (r->slots[s].key == 0) {
        r->slots[s].key = key;
        r->slots[s].file = WEFT_LINK_NO_SETTING;
        r->slots[s].meas = WEFT_LINK_NO_SETTING;
        r->used++;
    }
    return &r->slots[s];
}

/* ---- building the table ------------------------------------------------------- */

weft_status_t weft_topo_parse_transports(const char *spec, unsigned *allowed, char *err,
                                         size_t errlen)
{
    /* weft_parse_mask numbers names from bit 0: map bit k back to the
     * k-th transport the operator may name. */
    const char *names[WEFT_MAX_TRANSPORTS];
    int index[WEFT_MAX_TRANSPORTS], n = 0;
    unsigned choosable = weft_transport_choosable(), mask;
    for (int t = 0; weft_transports[t]; t++)
        if (choosable & (1u << t)) {
            index[n] = t;
            names[n++] = weft_transports[t]->name;
        }
    char bad[64], avail[128];
    weft_transport_list(choosable, ", ", avail, sizeof(avail));
    if (!weft_parse_mask(spec, names, (size_t)n, &mask, bad, sizeof(bad))) {
        char q[64], qb[64];
        weft_errf(err, errlen, "WEFT_TRANSPORT=%s: unknown transport '%s' (available: %s)",
                       weft_topo_quote(spec, strlen(spec), q, sizeof(q)),
                       weft_topo_quote(bad, strlen(bad), qb, sizeof(qb)), avail);
        return WEFT_ERR_INVALID_ARG;
    }
    if (mask == 0) {
        char q[64];
        weft_errf(err, errlen, "WEFT_TRANSPORT=%s leaves no transport (available: %s)",
                       weft_topo_quote(spec, strlen(spec), q, sizeof(q)), avail);
        return WEFT_ERR_INVALID_ARG;
    }
    *allowed = 0;
    for (int k = 0; k < n; k++)
        if (mask & (1u << k))
            *allowed |= 1u << index[k];
    return WEFT_OK;
}

void weft_topo_table_fini(struct weft_link_table *tab)
{
    if (tab == NULL)
        return;
    if (tab->rules) {
        for (int i = 0; i < tab->rules->nhosts_rules; i++)
            free(tab->rules->hosts[i].match);
        free(tab->rules->hosts);
        free(tab->rules->slots);
        free(tab->rules);
    }
    if (tab->hostid)
        for (int h = 0; h < tab->nhosts; h++)
            free(tab->hostid[h]);
    free(tab->hostid);
    free(tab->host);
    memset(tab, 0, sizeof(*tab));
}

struct rank_host {
    const char *id;
    int rank;
};

static int cmp_rank_host(const void *a, const void *b)
{
    const struct rank_host *x = a, *y = b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->rank > y->rank) - (x->rank < y->rank);
}

static int cmp_int(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* host[r] for every rank, hosts numbered by their first rank. */
static weft_status_t group_hosts(struct weft_link_table *tab, const char *const *hostid, char *err,
                                 size_t errlen)
{
    int n = tab->n;
    struct rank_host *rh = calloc((size_t)n, sizeof(*rh));
    int *first = calloc((size_t)n, sizeof(*first)); /* first rank of each group, then sorted */
    int *group = calloc((size_t)n, sizeof(*group)); /* rank -> group (sorted order) */
    weft_status_t st = WEFT_OK;
    if (rh == NULL || first == NULL || group == NULL) {
        weft_errf(err, errlen, "out of memory for %d ranks", n);
        st = WEFT_ERR_NO_MEMORY;
        goto out;
    }
    for (int r = 0; r < n; r++) {
        if (hostid && hostid[r] == NULL) {
            weft_errf(err, errlen, "rank %d has no host id", r);
            st = WEFT_ERR_INVALID_ARG;
            goto out;
        }
        rh[r].id = hostid ? hostid[r] : "local";
        rh[r].rank = r;
    }
    qsort(rh, (size_t)n, sizeof(*rh), cmp_rank_host);
    int ng = 0;
    for (int k = 0; k < n; k++) {
        if (k == 0 || strcmp(rh[k].id, rh[k - 1].id) != 0)
            first[ng++] = rh[k].rank; /* sorted by rank inside a group */
        group[rh[k].rank] = ng - 1;
    }
    /* Renumber groups by first rank: the order of first[] after sorting. */
    int *order = calloc((size_t)ng, sizeof(*order));
    int *firsts = malloc((size_t)ng * sizeof(*firsts));
    tab->hostid = calloc((size_t)ng, sizeof(*tab->hostid));
    if (order == NULL || firsts == NULL || tab->hostid == NULL) {
        free(order);
        free(firsts);
        weft_errf(err, errlen, "out of memory for %d hosts", ng);
        st = WEFT_ERR_NO_MEMORY;
        goto out;
    }
    memcpy(firsts, first, (size_t)ng * sizeof(*firsts));
    qsort(firsts, (size_t)ng, sizeof(*firsts), cmp_int);
    tab->nhosts = ng;
    for (int g = 0; g < ng; g++) {
        /* The group whose first rank is firsts[g]: that rank's group. */
        order[group[firsts[g]]] = g;
        tab->hostid[g] = strdup(hostid ? hostid[firsts[g]] : "local");
        if (tab->hostid[g] == NULL)
            st = WEFT_ERR_NO_MEMORY;
    }
    for (int r = 0; r < n; r++)
        tab->host[r] = order[group[r]];
    free(order);
    free(firsts);
    if (st != WEFT_OK)
        weft_errf(err, errlen, "out of memory for the host ids");
out:
    free(rh);
    free(first);
    free(group);
    return st;
}

/* The allowed transport of lowest priority that reaches such a pair (the
 * implicit ones are always allowed), or -1. */
static int pick_for(unsigned allowed, bool same_host, bool self)
{
    const struct weft_transport_pair pair = {.self = self, .same_host = same_host || self};
    int order[WEFT_MAX_TRANSPORTS], n = weft_transport_by_priority(order);
    for (int k = 0; k < n; k++) {
        const struct weft_transport_desc *d = weft_transports[order[k]];
        if (((allowed & (1u << order[k])) || (d->flags & WEFT_TP_IMPLICIT)) && d->can_reach(&pair))
            return order[k];
    }
    return -1;
}

/* Every class of pair the layout has must have a transport. */
static weft_status_t check_reach(const struct weft_link_table *tab, char *err, size_t errlen)
{
    char names[128], a[64], b[64];
    weft_transport_list(tab->allowed, ", ", names, sizeof(names));
    if (tab->pick[2] < 0) {
        weft_errf(err, errlen, "link table: no transport carries a rank's messages to itself");
        return WEFT_ERR_INVALID_ARG;
    }
    int r = 1;
    if (tab->nhosts > 1 && tab->pick[0] < 0) {
        while (tab->host[r] == 0)
            r++;
        weft_errf(err, errlen,
                       "ranks 0 and %d are on different hosts (%s, %s) but only %s %s allowed "
                       "(WEFT_TRANSPORT)",
                       r, weft_topo_quote(tab->hostid[0], strlen(tab->hostid[0]), a, sizeof(a)),
                       weft_topo_quote(tab->hostid[tab->host[r]], strlen(tab->hostid[tab->host[r]]),
                                       b, sizeof(b)),
                       names, __builtin_popcount(tab->allowed) > 1 ? "are" : "is");
        return WEFT_ERR_INVALID_ARG;
    }
    if (tab->nhosts < tab->n && tab->pick[1] < 0) {
        /* Hosts are numbered by first rank, so until the first rank that
         * shares a host, rank r is on host r. */
        for (r = 0; tab->host[r] == r; r++)
            ;
        weft_errf(err, errlen,
                       "rank %d shares its host (%s) with a lower rank but only %s %s allowed "
                       "(WEFT_TRANSPORT)",
                       r, weft_topo_quote(tab->hostid[tab->host[r]],
                                          strlen(tab->hostid[tab->host[r]]), a, sizeof(a)),
                       names, __builtin_popcount(tab->allowed) > 1 ? "are" : "is");
        return WEFT_ERR_INVALID_ARG;
    }
    return WEFT_OK;
}

weft_status_t weft_topo_table_init(struct weft_link_table *tab, int n, const char *const *hostid,
                                   unsigned allowed, char *err, size_t errlen)
{
    memset(tab, 0, sizeof(*tab));
    if (n < 1 || n > (1 << 30)) {
        weft_errf(err, errlen, "link table: %d ranks (must be 1 to 2^30)", n);
        return WEFT_ERR_INVALID_ARG;
    }
    allowed &= weft_transport_choosable();
    if (allowed == 0) {
        weft_errf(err, errlen, "link table: no transport allowed");
        return WEFT_ERR_INVALID_ARG;
    }
    tab->n = n;
    tab->allowed = allowed;
    for (int t = 0; weft_transports[t]; t++) {
        tab->alpha[t] = weft_transports[t]->alpha;
        tab->beta[t] = weft_transports[t]->beta;
    }
    for (int c = 0; c < 3; c++)
        tab->pick[c] = pick_for(allowed, c == 1, c == 2);
    tab->host = calloc((size_t)n, sizeof(*tab->host));
    tab->rules = calloc(1, sizeof(*tab->rules));
    weft_status_t st;
    if (tab->host == NULL || tab->rules == NULL) {
        weft_errf(err, errlen, "out of memory for %d ranks", n);
        st = WEFT_ERR_NO_MEMORY;
        goto fail;
    }
    if ((st = group_hosts(tab, hostid, err, errlen)) != WEFT_OK ||
        (st = check_reach(tab, err, errlen)) != WEFT_OK)
        goto fail;
    return WEFT_OK;
fail:
    weft_topo_table_fini(tab);
    return st;
}

weft_status_t weft_topo_table_set_default(struct weft_link_table *tab, int transport, double alpha,
                                          double beta)
{
    if (transport < 0 || transport >= weft_transport_count() || !isfinite(alpha) ||
        !isfinite(beta) || alpha < 0 || beta < 0)
        return WEFT_ERR_INVALID_ARG;
    tab->alpha[transport] = alpha;
    tab->beta[transport] = beta;
    return WEFT_OK;
}

/* ---- computing one link ---------------------------------------------------------- */

static bool rule_matches(const struct weft_link_hosts_rule *h, int hi, int hj)
{
    return ((h->match[hi] & 1) && (h->match[hj] & 2)) || ((h->match[hj] & 1) && (h->match[hi] & 2));
}

/* Applies the costs s names, if s is for transport t (or for any). */
static void apply(struct weft_link *l, const struct weft_link_setting *s, int source)
{
    if (s->transport >= 0 && s->transport != l->transport)
        return;
    if (!isnan(s->alpha))
        l->alpha = s->alpha;
    if (!isnan(s->beta))
        l->beta = s->beta;
    if (!isnan(s->alpha) || !isnan(s->beta)) {
        l->source = source;
        l->line = s->line;
    }
}

weft_status_t weft_topo_table_get(const struct weft_link_table *tab, int i, int j,
                                  struct weft_link *out)
{
    if (tab == NULL || tab->host == NULL || i < 0 || j < 0 || i >= tab->n || j >= tab->n)
        return WEFT_ERR_INVALID_ARG;
    struct weft_link l = {.transport = tab->pick[2], .source = WEFT_LINK_FROM_DEFAULT};
    if (i == j) {
        l.alpha = tab->alpha[l.transport];
        l.beta = tab->beta[l.transport];
        *out = l;
        return WEFT_OK;
    }
    const struct weft_link_rules *r = tab->rules;
    int hi = tab->host[i], hj = tab->host[j];
    l.transport = tab->pick[hi == hj];
    for (int k = 0; k < r->nhosts_rules; k++)
        if (r->hosts[k].s.transport >= 0 && rule_matches(&r->hosts[k], hi, hj))
            l.transport = r->hosts[k].s.transport;
    const struct weft_link_pair *e = map_find(r, weft_link_pair_key(i, j));
    if (e && e->file.transport >= 0)
        l.transport = e->file.transport;
    l.alpha = tab->alpha[l.transport];
    l.beta = tab->beta[l.transport];
    if (e && e->meas.transport >= 0)
        apply(&l, &e->meas, WEFT_LINK_FROM_MEASURED);
    for (int k = 0; k < r->nhosts_rules; k++)
        if (rule_matches(&r->hosts[k], hi, hj))
            apply(&l, &r->hosts[k].s, WEFT_LINK_FROM_FILE);
    if (e && e->file.line)
        apply(&l, &e->file, WEFT_LINK_FROM_FILE);
    *out = l;
    return WEFT_OK;
}

weft_status_t weft_topo_table_set_measured(struct weft_link_table *tab, int i, int j, double alpha,
                                           double beta)
{
    struct weft_link now;
    if (i == j || weft_topo_table_get(tab, i, j, &now) != WEFT_OK || !isfinite(alpha) ||
        !isfinite(beta) || alpha < 0 || beta < 0)
        return WEFT_ERR_INVALID_ARG;
    if (!weft_link_map_reserve(tab->rules, 1))
        return WEFT_ERR_NO_MEMORY;
    struct weft_link_pair *e = weft_link_map_get(tab->rules, weft_link_pair_key(i, j));
    e->meas = (struct weft_link_setting){now.transport, alpha, beta, 0};
    return WEFT_OK;
}

/* ---- printing ----------------------------------------------------------------------- */

static void print_cost(FILE *f, double alpha, double beta)
{
    fprintf(f, "alpha %8.2f us  ", alpha * 1e6);
    if (beta > 0)
        fprintf(f, "%8.3f GB/s", 1e-9 / beta);
    else
        fprintf(f, "%8s GB/s", "inf");
}

/* The ranks of host h as ranges, "0-3,8", cut after a few. */
static void print_ranks(const struct weft_link_table *tab, int h, FILE *f)
{
    int ranges = 0;
    for (int r = 0; r < tab->n; r++) {
        if (tab->host[r] != h)
            continue;
        int e = r;
        while (e + 1 < tab->n && tab->host[e + 1] == h)
            e++;
        if (ranges++ == 8) {
            fprintf(f, ",...");
            return;
        }
        fprintf(f, e == r ? "%s%d" : "%s%d-%d", ranges > 1 ? "," : "", r, e);
        r = e;
    }
}

/* A transport's letter in the matrix: '.' for the implicit ones (self). */
static char mark(int t)
{
    return weft_transports[t]->flags & WEFT_TP_IMPLICIT ? '.' : weft_transports[t]->name[0];
}

struct link_class {
    struct weft_link l;
    long pairs;
};

void weft_topo_table_print(const struct weft_link_table *tab, FILE *f)
{
    if (tab == NULL || tab->host == NULL) {
        fprintf(f, "link table: empty\n");
        return;
    }
    fprintf(f, "link table: %d rank(s) on %d host(s); transports allowed:", tab->n, tab->nhosts);
    for (int t = 0; weft_transports[t]; t++)
        if (tab->allowed & (1u << t))
            fprintf(f, " %s", weft_transports[t]->name);
    fprintf(f, "\n");
    for (int t = 0; weft_transports[t]; t++) {
        fprintf(f, "  %-8s %-4s  ", t == 0 ? "default" : "", weft_transports[t]->name);
        print_cost(f, tab->alpha[t], tab->beta[t]);
        fprintf(f, "\n");
    }
    int shown = WEFT_MIN(tab->nhosts, 16);
    for (int h = 0; h < shown; h++) {
        char q[64];
        fprintf(f, "  %-8s %d %-20s ranks ", h == 0 ? "hosts" : "", h,
                weft_topo_quote(tab->hostid[h], strlen(tab->hostid[h]), q, sizeof(q)));
        print_ranks(tab, h, f);
        fprintf(f, "\n");
    }
    if (tab->nhosts > shown)
        fprintf(f, "           ... and %d more hosts\n", tab->nhosts - shown);
    struct weft_link l;
    if (tab->n <= 64 && tab->n > 1) {
        fprintf(f, "  transport from row to column (");
        for (int t = 0; weft_transports[t]; t++)
            fprintf(f, "%s%c %s", t ? ", " : "", mark(t), weft_transports[t]->name);
        fprintf(f, "; upper case: cost from file or calibration)\n        ");
        for (int j = 0; j < tab->n; j++)
            fprintf(f, "%c", j % 10 == 0 ? '0' + (j / 10) % 10 : ' ');
        fprintf(f, "\n        ");
        for (int j = 0; j < tab->n; j++)
            fprintf(f, "%d", j % 10);
        fprintf(f, "\n");
        for (int i = 0; i < tab->n; i++) {
            fprintf(f, "  %4d  ", i);
            for (int j = 0; j < tab->n; j++) {
                weft_topo_table_get(tab, i, j, &l);
                char ch = mark(l.transport);
                fprintf(f, "%c", l.source == WEFT_LINK_FROM_DEFAULT ? ch : ch - 'a' + 'A');
            }
            fprintf(f, "\n");
        }
    }
    /* Distinct links among pairs i < j (over the first 512 ranks). */
    struct link_class cls[32];
    int ncls = 0, upto = WEFT_MIN(tab->n, 512);
    long other = 0;
    for (int i = 0; i < upto; i++)
        for (int j = i + 1; j < upto; j++) {
            weft_topo_table_get(tab, i, j, &l);
            int k = 0;
            while (k < ncls && (cls[k].l.transport != l.transport || cls[k].l.alpha != l.alpha ||
                                cls[k].l.beta != l.beta || cls[k].l.source != l.source ||
                                cls[k].l.line != l.line))
                k++;
            if (k == ncls && ncls == (int)WEFT_ARRAY_SIZE(cls)) {
                other++;
                continue;
            }
            if (k == ncls)
                cls[ncls++] = (struct link_class){l, 0};
            cls[k].pairs++;
        }
    if (ncls > 0)
        fprintf(f, "  links (pairs i < j%s):\n", upto < tab->n ? ", first 512 ranks" : "");
    static const char *const from[] = {"default", "measured", "file line"};
    for (int k = 0; k < ncls; k++) {
        fprintf(f, "    %-4s  ", weft_transport_name(cls[k].l.transport));
        print_cost(f, cls[k].l.alpha, cls[k].l.beta);
        fprintf(f, "  %7ld pair(s)  %s", cls[k].pairs, from[cls[k].l.source]);
        if (cls[k].l.source == WEFT_LINK_FROM_FILE)
            fprintf(f, " %d", cls[k].l.line);
        fprintf(f, "\n");
    }
    if (other)
        fprintf(f, "    ... %ld more pair(s) with other costs\n", other);
}

/* ---- the alpha-beta fit ---------------------------------------------------------------- */

struct sample {
    double x, y; /* bytes, seconds */
};

static int cmp_sample(const void *a, const void *b)
{
    const struct sample *p = a, *q = b;
    if (p->x != q->x)
        return p->x < q->x ? -1 : 1;
    return (p->y > q->y) - (p->y < q->y);
}

/* Least squares of y = a + b x with weights 1 / y^2, skipping point skip;
 * a, b >= 0 (a negative one is pinned to 0 and the other refitted). */
static void wls(const struct sample *s, int m, int skip, double *a, double *b)
{
    double sw = 0, sx = 0, sy = 0;
    for (int k = 0; k < m; k++) {
        if (k == skip)
            continue;
        double w = 1.0 / (s[k].y * s[k].y);
        sw += w;
        sx += w * s[k].x;
        sy += w * s[k].y;
    }
    double xm = sx / sw, ym = sy / sw, sxx = 0, sxy = 0;
    for (int k = 0; k < m; k++) {
        if (k == skip)
            continue;
        double w = 1.0 / (s[k].y * s[k].y);
        sxx += w * (s[k].x - xm) * (s[k].x - xm);
        sxy += w * (s[k].x - xm) * (s[k].y - ym);
    }
    *b = sxx > 0 ? sxy / sxx : 0;
    *a = ym - *b * xm;
    if (*b < 0) {
        *b = 0;
        *a = ym;
    } else if (*a < 0) {
        /* Through the origin: b = sum w x y / sum w x^2. */
        double num = 0, den = 0;
        for (int k = 0; k < m; k++) {
            if (k == skip)
                continue;
            double w = 1.0 / (s[k].y * s[k].y);
            num += w * s[k].x * s[k].y;
            den += w * s[k].x * s[k].x;
        }
        *a = 0;
        *b = den > 0 ? num / den : 0;
    }
}

/* How far point k is from the fit, relative to the fit. */
static double rel_miss(const struct sample *s, int k, double a, double b)
{
    double p = a + b * s[k].x;
    return p > 0 ? fabs(s[k].y - p) / p : INFINITY;
}

weft_status_t weft_topo_fit(const double *bytes, const double *seconds, int n, double *alpha,
                            double *beta)
{
    if (bytes == NULL || seconds == NULL || alpha == NULL || beta == NULL || n < 2 || n > (1 << 24))
        return WEFT_ERR_INVALID_ARG;
    for (int k = 0; k < n; k++)
        if (!isfinite(bytes[k]) || bytes[k] < 0 || bytes[k] > 1e15 || !isfinite(seconds[k]) ||
            seconds[k] <= 0 || seconds[k] > 1e6)
            return WEFT_ERR_INVALID_ARG;
    struct sample *s = malloc((size_t)n * sizeof(*s));
    if (s == NULL)
        return WEFT_ERR_NO_MEMORY;
    for (int k = 0; k < n; k++)
        s[k] = (struct sample){bytes[k], seconds[k]};
    qsort(s, (size_t)n, sizeof(*s), cmp_sample);
    /* One point per size: the median of its repeats (sorted by time). */
    int m = 0;
    for (int k = 0; k < n;) {
        int e = k;
        while (e < n && s[e].x == s[k].x)
            e++;
        int c = e - k;
        double med = c % 2 ? s[k + c / 2].y : 0.5 * (s[k + c / 2 - 1].y + s[k + c / 2].y);
        s[m++] = (struct sample){s[k].x, med};
        k = e;
    }
    if (m < 2) {
        free(s);
        return WEFT_ERR_INVALID_ARG;
    }
    double a, b;
    wls(s, m, -1, &a, &b);
    if (m >= 4) {
        /* The point whose removal leaves the others fitting best. */
        int worst = -1;
        double best = INFINITY, wa = 0, wb = 0;
        for (int k = 0; k < m; k++) {
            double ka, kb, ss = 0;
            wls(s, m, k, &ka, &kb);
            for (int q = 0; q < m; q++)
                if (q != k)
                    ss += rel_miss(s, q, ka, kb) * rel_miss(s, q, ka, kb);
            if (ss < best) {
                best = ss;
                worst = k;
                wa = ka;
                wb = kb;
            }
        }
        double spread = sqrt(best / (m - 1));
        double miss = rel_miss(s, worst, wa, wb);
        if (miss > 0.5 && miss > 5 * spread) {
            a = wa;
            b = wb;
        }
    }
    free(s);
    *alpha = a;
    *beta = b;
    return WEFT_OK;
}
