/*
 * tune_file.c - the tuning file (tune_file.h): section keys from a
 * communicator's link table, the parser of one shape's section, the fill
 * of the per-class table from the measured points, and the writer that
 * replaces one section atomically.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transports/registry.h"
#include "select/tune_file.h"

#define MAX_NAMES 16  /* transports a header may name */
#define NAME_LEN 24
#define MAX_RANKS (1 << 20) /* weft_comm_init's bound */

/* ---- section keys ---------------------------------------------------------- */

static int cmp_name(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* The canonical key of n ranks on the nodes node[] names (any ids) with
 * the transports names[0..nn) (sorted here, repeats dropped): nodes
 * renumbered as they first appear, "ppn=P" when rank r is on node r / P,
 * else the layout.  malloc'd; NULL when out of memory. */
static char *key_make(int n, const int *node, char (*names)[NAME_LEN], int nn)
{
    int *num = malloc((size_t)n * sizeof(*num)), nodes = 0;
    char *key = NULL;
    if (num == NULL)
        return NULL;
    for (int r = 0; r < n; r++) {
        int q = 0;
        while (q < r && node[q] != node[r])
            q++;
        num[r] = q < r ? num[q] : nodes++;
    }
    int ppn = n % nodes == 0 ? n / nodes : 0;
    for (int r = 0; r < n && ppn; r++)
        if (num[r] != r / ppn)
            ppn = 0;
    qsort(names, (size_t)nn, NAME_LEN, cmp_name);
    size_t cap = 96 + (size_t)nn * NAME_LEN + (ppn ? 0 : (size_t)n * 8);
    if ((key = malloc(cap)) == NULL)
        goto out;
    size_t o = (size_t)snprintf(key, cap, "nranks=%d nodes=%d ", n, nodes);
    if (ppn)
        o += (size_t)snprintf(key + o, cap - o, "ppn=%d", ppn);
    for (int r = 0; r < n && !ppn; r++)
        o += (size_t)snprintf(key + o, cap - o, "%s%d", r ? "," : "layout=", num[r]);
    o += (size_t)snprintf(key + o, cap - o, " transports=");
    int shown = 0;
    for (int i = 0; i < nn; i++)
        if (i == 0 || strcmp(names[i], names[i - 1]) != 0)
            o += (size_t)snprintf(key + o, cap - o, "%s%s", shown++ ? "," : "", names[i]);
    if (shown == 0)
        snprintf(key + o, cap - o, "none");
out:
    free(num);
    return key;
}

char *weft_tune_shape_key(const struct weft_link_table *tab)
{
    bool used[WEFT_MAX_TRANSPORTS] = {false};
    char names[WEFT_MAX_TRANSPORTS][NAME_LEN];
    int nn = 0;
    /* The table is symmetric: one direction of each pair. */
    for (int i = 0; i < tab->n; i++)
        for (int j = i + 1; j < tab->n; j++) {
            struct weft_link l;
            if (weft_topo_table_get(tab, i, j, &l) == WEFT_OK && l.transport >= 0 &&
                l.transport < WEFT_MAX_TRANSPORTS)
                used[l.transport] = true;
        }
    for (int t = 0; t < weft_transport_count(); t++)
        if (used[t])
            snprintf(names[nn++], NAME_LEN, "%s", weft_transport_name(t));
    return key_make(tab->n, tab->host, names, nn);
}

/* A positive decimal integer of s[0..len) no larger than max; -1 if not. */
static long small_int(const char *s, size_t len, long max)
{
    long v = 0;
    if (len == 0 || len > 9)
        return -1;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v >= 1 && v <= max ? v : -1;
}

/* The fields of a header, text between the brackets: nranks=N nodes=K,
 * ppn=P or layout=a,b,..., transports=x,y, in any order. */
struct header {
    long nranks, nodes, ppn;
    const char *layout, *transports;
    size_t layout_len, transports_len;
};

static bool header_fields(const char *s, size_t len, struct header *h, char *why, size_t wl)
{
    memset(h, 0, sizeof(*h));
    for (size_t i = 0; i < len;) {
        while (i < len && (s[i] == ' ' || s[i] == '\t'))
            i++;
        size_t b = i;
        while (i < len && s[i] != ' ' && s[i] != '\t')
            i++;
        if (i == b)
            break;
        const char *tok = s + b, *eq = memchr(tok, '=', i - b);
        size_t kl = eq ? (size_t)(eq - tok) : 0, vl = eq ? i - b - kl - 1 : 0;
        const char *v = eq ? eq + 1 : NULL;
        long *num = NULL;
        if (eq && kl == 6 && memcmp(tok, "nranks", 6) == 0)
            num = &h->nranks;
        else if (eq && kl == 5 && memcmp(tok, "nodes", 5) == 0)
            num = &h->nodes;
        else if (eq && kl == 3 && memcmp(tok, "ppn", 3) == 0)
            num = &h->ppn;
        if (num) {
            if (*num) {
                weft_errf(why, wl, "section header: '%.*s' given twice", (int)kl, tok);
                return false;
            }
            if ((*num = small_int(v, vl, MAX_RANKS)) < 0) {
                weft_errf(why, wl, "section header: '%.*s' is not a count from 1 to %d",
                     (int)WEFT_MIN(i - b, (size_t)60), tok, MAX_RANKS);
                return false;
            }
        } else if (eq && kl == 6 && memcmp(tok, "layout", 6) == 0 && !h->layout) {
            h->layout = v, h->layout_len = vl;
        } else if (eq && kl == 10 && memcmp(tok, "transports", 10) == 0 && !h->transports) {
            h->transports = v, h->transports_len = vl;
        } else {
            weft_errf(why, wl, "section header: '%.*s' is not nranks=, nodes=, ppn=, layout= or "
                 "transports= (each once)", (int)WEFT_MIN(i - b, (size_t)60), tok);
            return false;
        }
    }
    if (!h->nranks || !h->nodes || !h->transports || !h->ppn == !h->layout) {
        weft_errf(why, wl, "section header: wants nranks=, nodes=, transports= and one of ppn= or "
             "layout=");
        return false;
    }
    return true;
}

/* The canonical key of a header's text (between the brackets), malloc'd
 * into *key; false with why when it is malformed (*key NULL), or out of
 * memory (why empty). */
static bool header_key(const char *s, size_t len, char **key, char *why, size_t wl)
{
    struct header h;
    char names[MAX_NAMES][NAME_LEN];
    int nn = 0;
    *key = NULL;
    why[0] = '\0';
    if (!header_fields(s, len, &h, why, wl))
        return false;
    int n = (int)h.nranks;
    if (h.ppn && h.ppn * h.nodes != h.nranks) {
        weft_errf(why, wl, "section header: nodes=%ld times ppn=%ld is not nranks=%ld", h.nodes,
             h.ppn, h.nranks);
        return false;
    }
    for (size_t i = 0, b; i <= h.transports_len && !(h.transports_len == 4 &&
                                                     memcmp(h.transports, "none", 4) == 0);
         i++) {
        for (b = i; i < h.transports_len && h.transports[i] != ','; i++) {
            char c = h.transports[i];
            if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
                break;
        }
        if (i == b || i - b >= NAME_LEN || nn == MAX_NAMES ||
            (i < h.transports_len && h.transports[i] != ',')) {
            weft_errf(why, wl, "section header: transports=%.*s is not a list of transport names "
                 "(shm,tcp)", (int)WEFT_MIN(h.transports_len, (size_t)60), h.transports);
            return false;
        }
        snprintf(names[nn++], NAME_LEN, "%.*s", (int)(i - b), h.transports + b);
    }
    int *node = malloc((size_t)n * sizeof(*node)), seen = 0;
    if (node == NULL)
        return false;
    bool ok = true;
    if (h.ppn) {
        for (int r = 0; r < n; r++)
            node[r] = r / (int)h.ppn;
        seen = (int)h.nodes;
    } else {
        int r = 0;
        for (size_t i = 0, b; i <= h.layout_len && ok; i++, r++) {
            for (b = i; i < h.layout_len && h.layout[i] != ','; i++)
                ;
            long v = i > b && h.layout[b] == '0' && i - b == 1 ? 0
                                                               : small_int(h.layout + b, i - b, MAX_RANKS);
            ok = r < n && v >= 0;
            if (ok)
                node[r] = (int)v;
        }
        for (int q = 0; q < r && ok; q++) { /* distinct node ids */
            int k = 0;
            while (k < q && node[k] != node[q])
                k++;
            seen += k == q;
        }
        if (!ok || r != n) {
            weft_errf(why, wl, "section header: layout= wants the node of each of the %d ranks "
                 "(0,0,1,1)", n);
            ok = false;
        }
    }
    if (ok && seen != h.nodes) {
        weft_errf(why, wl, "section header: layout= puts the ranks on %d nodes, not nodes=%ld", seen,
             h.nodes);
        ok = false;
    }
    if (ok && (*key = key_make(n, node, names, nn)) == NULL)
        why[0] = '\0';
    free(node);
    return *key != NULL;
}

/* ---- lines ----------------------------------------------------------------- */

int weft_tune_file_esize(const char *s, size_t len)
{
    static const struct {
        const char *name;
        int size;
    } types[] = {
        {"int8", 1},    {"uint8", 1},   {"int32", 4},   {"uint32", 4},  {"int64", 8},
        {"uint64", 8},  {"float16", 2}, {"float32", 4}, {"float64", 8}, {"bfloat16", 2},
        {"1", 1},       {"2", 2},       {"4", 4},       {"8", 8},
    };
    if (len == 1 && s[0] == '*')
        return WEFT_TUNE_ANY_ESIZE;
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(types); i++)
        if (strlen(types[i].name) == len && strncasecmp(s, types[i].name, len) == 0)
            return weft_tune_esize_index((size_t)types[i].size);
    return -1;
}

/* "8", "64K", "32M", "1G" (powers of 1024) -> bytes > 0; false if not. */
static bool parse_bytes(const char *s, size_t len, size_t *out)
{
    size_t mult = 1, v = 0, i = 0;
    if (len > 0 && strchr("kKmMgG", s[len - 1])) {
        char u = (char)(s[len - 1] | 0x20);
        mult = u == 'k' ? (size_t)1 << 10 : u == 'm' ? (size_t)1 << 20 : (size_t)1 << 30;
        len--;
    }
    if (len == 0 || len > 15)
        return false;
    for (; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (size_t)(s[i] - '0');
    }
    if (v == 0 || v > SIZE_MAX / mult)
        return false;
    *out = v * mult;
    return true;
}

/* One plan's name, as WEFT_ALGO names one ("ring", "tree/binomial"). */
static bool parse_plan(const char *s, size_t len, struct weft_plan *pl, char *why, size_t wl)
{
    const char *slash = memchr(s, '/', len);
    size_t fl = slash ? (size_t)(slash - s) : len;
    int a = weft_algo_from_name(s, fl);
    if (a < 0) {
        weft_errf(why, wl, "unknown plan '%.*s' (weft-info --plans lists them)",
             (int)WEFT_MIN(len, (size_t)40), s);
        return false;
    }
    int v = slash ? weft_algo_variant_from_name(a, slash + 1, len - fl - 1) : 0;
    if (v < 0) {
        weft_errf(why, wl, "unknown plan '%.*s' (weft-info --plans lists them)",
             (int)WEFT_MIN(len, (size_t)40), s);
        return false;
    }
    if (!slash && weft_algo_variant_name(a, 0) != NULL) {
        weft_errf(why, wl, "'%s' is a family of plans: name one (%s/%s, %s/%s)", weft_algo_name(a),
             weft_algo_name(a), weft_algo_variant_name(a, 0), weft_algo_name(a),
             weft_algo_variant_name(a, 1) ? weft_algo_variant_name(a, 1) : "?");
        return false;
    }
    *pl = (struct weft_plan){a, v};
    return true;
}

/* Splits s[0..len) at blanks into at most max tokens; how many (max + 1
 * when there are more). */
static int tokens(const char *s, size_t len, const char **tok, size_t *tl, int max)
{
    int n = 0;
    for (size_t i = 0; i < len;) {
        while (i < len && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
            i++;
        if (i == len)
            break;
        if (n == max)
            return max + 1;
        size_t b = i;
        while (i < len && s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            i++;
        tok[n] = s + b;
        tl[n++] = i - b;
    }
    return n;
}

/* One entry line of the matching section into *p; false with why. */
static bool parse_entry(const char *s, size_t len, struct weft_tune_point *p, char *why,
                        size_t wl)
{
    const char *tok[4];
    size_t tl[4], bytes;
    struct weft_plan pl;
    if (tokens(s, len, tok, tl, 4) != 4) {
        weft_errf(why, wl, "wants 'collective type bytes plan' (allreduce float32 8 ring)");
        return false;
    }
    int coll = weft_tune_coll_from_name(tok[0], tl[0]);
    int e = weft_tune_file_esize(tok[1], tl[1]);
    if (coll < 0) {
        weft_errf(why, wl, "unknown collective '%.*s' (allreduce, reducescatter, allgather, "
             "broadcast, reduce)", (int)WEFT_MIN(tl[0], (size_t)40), tok[0]);
        return false;
    }
    if (e < 0) {
        weft_errf(why, wl, "unknown element type '%.*s' (a dtype such as float32, a size 1, 2, 4 "
             "or 8, or *)", (int)WEFT_MIN(tl[1], (size_t)40), tok[1]);
        return false;
    }
    if (!parse_bytes(tok[2], tl[2], &bytes)) {
        weft_errf(why, wl, "'%.*s' is not a size in bytes (8, 64K, 32M)",
             (int)WEFT_MIN(tl[2], (size_t)40), tok[2]);
        return false;
    }
    if (!parse_plan(tok[3], tl[3], &pl, why, wl))
        return false;
    if (!weft_algo_serves(pl.algo, pl.variant, coll)) {
        char name[32];
        weft_errf(why, wl, "%s does not run %s", weft_plan_name(pl, name, sizeof(name)),
             weft_coll_name(coll));
        return false;
    }
    *p = (struct weft_tune_point){(uint8_t)coll, (uint8_t)e, (uint8_t)weft_tune_class(bytes),
                                  (uint8_t)pl.algo, (uint8_t)pl.variant};
    return true;
}

/* The parser's place in the text. */
struct cursor {
    const char *name;
    char *err;
    size_t errlen;
    int line;
};

static weft_status_t bad(const struct cursor *c, const char *why)
{
    weft_errf(c->err, c->errlen, "%s:%d: %s", c->name, c->line, why);
    return WEFT_ERR_INVALID_ARG;
}

weft_status_t weft_tune_file_parse(const char *text, size_t len, const char *name, const char *key,
                                   struct weft_tune_point *pts, int *n, char *err, size_t errlen)
{
    struct cursor c = {.name = name, .err = err, .errlen = errlen};
    char why[160];
    /* The line of each point so far, per (collective, element size, class). */
    static const size_t seen_n = (size_t)WEFT_COLL_COUNT * 5 * WEFT_TUNE_CLASSES;
    int *seen = calloc(seen_n, sizeof(*seen));
    int in = -1, found = 0; /* in: 1 in key's section, 0 in another, -1 before any */
    weft_status_t st = WEFT_OK;
    *n = 0;
    if (seen == NULL) {
        weft_errf(err, errlen, "%s: out of memory", name);
        return WEFT_ERR_NO_MEMORY;
    }
    for (size_t at = 0; at < len && st == WEFT_OK;) {
        const char *s = text + at, *nl = memchr(s, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - s) : len - at;
        at += ll + (nl != NULL);
        c.line++;
        if (memchr(s, '\0', ll)) {
            st = bad(&c, "a NUL byte: not a text file");
            break;
        }
        const char *hash = memchr(s, '#', ll);
        if (hash)
            ll = (size_t)(hash - s);
        while (ll > 0 && (s[0] == ' ' || s[0] == '\t'))
            s++, ll--;
        while (ll > 0 && (s[ll - 1] == ' ' || s[ll - 1] == '\t' || s[ll - 1] == '\r'))
            ll--;
        if (ll == 0)
            continue;
        if (s[0] == '[') {
            char *k;
            if (s[ll - 1] != ']') {
                st = bad(&c, "a section header ends in ']'");
            } else if (!header_key(s + 1, ll - 2, &k, why, sizeof(why))) {
                st = why[0] ? bad(&c, why) : bad(&c, "out of memory");
            } else {
                in = strcmp(k, key) == 0;
                free(k);
                if (in && found) {
                    snprintf(why, sizeof(why), "a second section for this shape (the first "
                             "at line %d)", found);
                    st = bad(&c, why);
                }
                found = in ? c.line : found;
            }
            continue;
        }
        if (in < 0) {
            st = bad(&c, "a line before the first section header ([nranks=... nodes=... ppn=... "
                     "transports=...])");
        } else if (in == 1) {
            struct weft_tune_point p;
            if (!parse_entry(s, ll, &p, why, sizeof(why))) {
                st = bad(&c, why);
                break;
            }
            int *where = &seen[((size_t)p.coll * 5 + p.esize_idx) * WEFT_TUNE_CLASSES + p.cls];
            if (*where) {
                snprintf(why, sizeof(why), "the same collective, type and size class as line %d",
                         *where);
                st = bad(&c, why);
                break;
            }
            *where = c.line;
            pts[(*n)++] = p;
        }
    }
    free(seen);
    if (st != WEFT_OK)
        *n = 0;
    return st;
}

/* ---- the table ------------------------------------------------------------- */

void weft_tune_table_fill(struct weft_tune_table *t, const struct weft_tune_point *pts, int n)
{
    /* Per element size (and "*"), the points' plans by class. */
    int8_t at[WEFT_TUNE_ANY_ESIZE + 1][WEFT_TUNE_CLASSES];
    memset(t->plan, -1, sizeof(t->plan));
    for (int coll = 0; coll < WEFT_COLL_COUNT; coll++) {
        int8_t own[4][WEFT_TUNE_CLASSES];
        bool any[4] = {false};
        memset(at, -1, sizeof(at));
        for (int i = 0; i < n; i++)
            if (pts[i].coll == coll)
                at[pts[i].esize_idx][pts[i].cls] =
                    (int8_t)(pts[i].algo * WEFT_VAR_COUNT + pts[i].variant);
        for (int e = 0; e < 4; e++)
            for (int cls = 0; cls < WEFT_TUNE_CLASSES; cls++) {
                own[e][cls] = at[e][cls] >= 0 ? at[e][cls] : at[WEFT_TUNE_ANY_ESIZE][cls];
                any[e] |= own[e][cls] >= 0;
            }
        for (int e = 0; e < 4; e++) {
            /* The nearest element size with points (ties: the larger); then
             * from half the smallest size measured to under twice the
             * largest (two classes per power of two). */
            int from = -1;
            for (int d = 0; d < 4 && from < 0; d++)
                from = e + d < 4 && any[e + d] ? e + d : e - d >= 0 && any[e - d] ? e - d : -1;
            if (from < 0)
                continue;
            const int8_t *pt = own[from];
            int lo = 0, hi = WEFT_TUNE_CLASSES - 1;
            while (pt[lo] < 0)
                lo++;
            while (pt[hi] < 0)
                hi--;
            for (int cls = WEFT_MAX(lo - 2, 1); cls <= WEFT_MIN(hi + 1, WEFT_TUNE_CLASSES - 1);
                 cls++) {
                int below = cls, above = cls;
                while (below >= lo && pt[below] < 0)
                    below--;
                while (above <= hi && pt[above] < 0)
                    above++;
                double b = (double)weft_tune_class_bytes(cls);
                bool up = below < lo || (above <= hi && b * b >= (double)weft_tune_class_bytes(below) *
                                                                   (double)weft_tune_class_bytes(above));
                t->plan[coll][e][cls] = pt[up ? above : below];
            }
        }
    }
}

/* ---- files ----------------------------------------------------------------- */

bool weft_tune_file_path(char *buf, size_t len, bool *named)
{
    const char *f = weft_param_str("WEFT_TUNE_FILE"), *x = getenv("XDG_CACHE_HOME"),
               *h = getenv("HOME");
    int k;
    *named = f && *f;
    if (*named)
        k = snprintf(buf, len, "%s", f);
    else if (x && *x == '/')
        k = snprintf(buf, len, "%s/weft/tune", x);
    else if (h && *h)
        k = snprintf(buf, len, "%s/.cache/weft/tune", h);
    else
        return false;
    return k > 0 && (size_t)k < len;
}

weft_status_t weft_tune_file_read(const char *path, char **text, size_t *len, char *err,
                                  size_t errlen)
{
    weft_status_t st = weft_file_read(path, WEFT_TUNE_FILE_MAX, text, len, err, errlen);
    if (st == WEFT_ERR_SYSTEM && errno == ENOENT)
        return WEFT_ERR_UNSUPPORTED;
    return st == WEFT_OK ? WEFT_OK : WEFT_ERR_SYSTEM;
}

/* Writes all of buf to fd; false with errno. */
static bool write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            if (w == 0)
                errno = EIO;
            return false;
        }
        buf += w;
        n -= (size_t)w;
    }
    return true;
}

/* old's text without key's section (its header to the next header): into
 * fd, then the new section; false with errno. */
static bool write_merged(int fd, const char *old, size_t len, const char *key, const char *body)
{
    bool skip = false, done = false;
    for (size_t at = 0; at < len;) {
        const char *s = old + at, *nl = memchr(s, '\n', len - at);
        size_t ll = nl ? (size_t)(nl - s) + 1 : len - at;
        at += ll;
        size_t i = 0;
        while (i < ll && (s[i] == ' ' || s[i] == '\t'))
            i++;
        if (i < ll && s[i] == '[') {
            const char *end = memchr(s + i, ']', ll - i);
            char *k = NULL, why[8];
            bool mine = end && header_key(s + i + 1, (size_t)(end - s - i - 1), &k, why,
                                          sizeof(why)) && strcmp(k, key) == 0;
            free(k);
            if (mine && !done) {
                /* The new section where the old one was. */
                if (dprintf(fd, "[%s]\n", key) < 0 || !write_all(fd, body, strlen(body)))
                    return false;
                done = true;
            }
            skip = mine;
        }
        if (!skip && !write_all(fd, s, ll))
            return false;
        if (!skip && !nl && !write_all(fd, "\n", 1))
            return false;
    }
    if (!done && (dprintf(fd, "%s[%s]\n", len ? "\n" : "", key) < 0 ||
                  !write_all(fd, body, strlen(body))))
        return false;
    return true;
}

weft_status_t weft_tune_file_write(const char *path, const char *key, const char *body, char *err,
                                   size_t errlen)
{
    char *old = NULL, *tmp = NULL;
    size_t len = 0;
    int fd = -1;
    weft_status_t st = weft_tune_file_read(path, &old, &len, err, errlen);
    if (st == WEFT_ERR_UNSUPPORTED)
        st = WEFT_OK; /* a new file */
    if (st != WEFT_OK)
        return st;
    size_t tl = strlen(path) + 16;
    if ((tmp = malloc(tl)) == NULL) {
        weft_errf(err, errlen, "%s: out of memory", path);
        st = WEFT_ERR_NO_MEMORY;
        goto out;
    }
    snprintf(tmp, tl, "%s.XXXXXX", path);
    if ((fd = mkstemp(tmp)) < 0) {
        weft_errf(err, errlen, "cannot create a file next to %s: %s", path, strerror(errno));
        st = WEFT_ERR_SYSTEM;
        goto out;
    }
    /* Readable as a plain file would be (mkstemp makes it 0600). */
    mode_t um = umask(0);
    umask(um);
    if (fchmod(fd, 0666 & ~um) != 0 || !write_merged(fd, old ? old : "", len, key, body) ||
        fsync(fd) != 0) {
        weft_errf(err, errlen, "writing %s: %s", tmp, strerror(errno));
        st = WEFT_ERR_SYSTEM;
        goto out;
    }
    int cfd = fd;
    fd = -1;
    if (close(cfd) != 0 || rename(tmp, path) != 0) {
        weft_errf(err, errlen, "replacing %s: %s", path, strerror(errno));
        st = WEFT_ERR_SYSTEM;
        goto out;
    }
    free(tmp);
    tmp = NULL;
out:
    if (fd >= 0)
        close(fd);
    if (tmp)
        unlink(tmp);
    free(tmp);
    free(old);
    return st;
}
