/*
 * topo_file.c - the topology file (WEFT_TOPO_FILE; format in
 * docs/topology-file.md): read whole, parsed line by line into a staging
 * copy and applied only when every line is good.  Input is hostile:
 * lengths, bytes and numbers are checked before use and every error names
 * the line and the token.
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "select/topo_impl.h"

#define LINE_MAX_BYTES 1024
#define FILE_MAX_BYTES (1 << 20)
#define MAX_TOKENS 16
#define MAX_HOSTS_RULES 256

/* Everything one parse would change, applied only when the whole text is
 * good. */
struct staging {
    double alpha[WEFT_MAX_TRANSPORTS], beta[WEFT_MAX_TRANSPORTS];
    struct weft_link_hosts_rule *hosts;
    int nhosts, hosts_cap;
    struct {
        uint64_t key;
        struct weft_link_setting s;
    } * pairs;
    size_t npairs, pairs_cap;
};

/* The line being parsed, for messages. */
struct ctx {
    const struct weft_link_table *tab;
    const char *name;
    int line;
    char *err;
    size_t errlen;
};

static weft_status_t bad(const struct ctx *c, const char *what, const char *tok)
{
    char q[64];
    if (tok)
        weft_errf(c->err, c->errlen, "%s:%d: %s '%s'", c->name, c->line, what,
                       weft_topo_quote(tok, strlen(tok), q, sizeof(q)));
    else
        weft_errf(c->err, c->errlen, "%s:%d: %s", c->name, c->line, what);
    return WEFT_ERR_INVALID_ARG;
}

static weft_status_t no_memory(const struct ctx *c)
{
    weft_errf(c->err, c->errlen, "%s:%d: out of memory", c->name, c->line);
    return WEFT_ERR_NO_MEMORY;
}

/* The "C" locale, so that "1.5" means 1.5 whatever LC_NUMERIC the
 * application set; (locale_t)0 if it cannot be made. */
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;
static locale_t c_locale;

static void make_c_locale(void)
{
    c_locale = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
}

/* A number that is the whole of s, finite, in [lo, hi]. */
static bool parse_number(const char *s, double lo, double hi, double *out)
{
    if (*s == '\0' || isspace((unsigned char)*s))
        return false;
    pthread_once(&c_locale_once, make_c_locale);
    errno = 0;
    char *end;
    double v = c_locale ? strtod_l(s, &end, c_locale) : strtod(s, &end);
    if (errno != 0 || *end != '\0' || !isfinite(v) || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

/* Does the KEY of token "KEY=VALUE" (klen bytes) equal name? */
static bool key_is(const char *tok, size_t klen, const char *name)
{
    return strlen(name) == klen && memcmp(tok, name, klen) == 0;
}

/* Reads [transport] KEY=VALUE... from tok[0..n) into s. */
static weft_status_t parse_settings(const struct ctx *c, char **tok, int n, bool transport_ok,
                                    struct weft_link_setting *s)
{
    bool have_alpha = false, have_bw = false;
    for (int k = 0; k < n; k++) {
        const char *eq = strchr(tok[k], '=');
        if (eq == NULL) {
            int t = weft_transport_find(tok[k]);
            if (t >= 0 && (weft_transports[t]->flags & WEFT_TP_IMPLICIT))
                return bad(c, "not a transport one can force (only its own cost)", tok[k]);
            if (t < 0 || !transport_ok) {
                char names[128], what[192];
                snprintf(what, sizeof(what), "expected %s or KEY=VALUE, got",
                         weft_transport_list(weft_transport_choosable(), ", ", names,
                                             sizeof(names)));
                return bad(c, transport_ok ? what : "expected KEY=VALUE, got", tok[k]);
            }
            if (s->transport >= 0)
                return bad(c, "second transport", tok[k]);
            s->transport = t;
            continue;
        }
        size_t klen = (size_t)(eq - tok[k]);
        double v;
        if (key_is(tok[k], klen, "alpha_us")) {
            if (have_alpha)
                return bad(c, "alpha_us given twice", tok[k]);
            if (!parse_number(eq + 1, 0, 1e7, &v))
                return bad(c, "alpha_us must be a number from 0 to 1e7 (microseconds), got",
                           tok[k]);
            s->alpha = v * 1e-6;
            have_alpha = true;
        } else if (key_is(tok[k], klen, "gbps")) {
            if (have_bw)
                return bad(c, "bandwidth given twice", tok[k]);
            if (!parse_number(eq + 1, 1e-6, 1e5, &v))
                return bad(c, "gbps must be a number from 1e-6 to 1e5 (GB/s), got", tok[k]);
            s->beta = 1.0 / (v * 1e9);
            have_bw = true;
        } else if (key_is(tok[k], klen, "gbit")) {
            if (have_bw)
                return bad(c, "bandwidth given twice", tok[k]);
            if (!parse_number(eq + 1, 8e-6, 8e5, &v))
                return bad(c, "gbit must be a number from 8e-6 to 8e5 (Gbit/s), got", tok[k]);
            s->beta = 8.0 / (v * 1e9);
            have_bw = true;
        } else {
            return bad(c, "unknown key (expected alpha_us, gbps or gbit)", tok[k]);
        }
    }
    return WEFT_OK;
}

/* A rank: decimal digits only, below the table's n. */
static weft_status_t parse_rank(const struct ctx *c, const char *tok, int *out)
{
    size_t len = strlen(tok);
    long long v = 0;
    bool ok = len > 0 && len <= 10;
    for (size_t i = 0; ok && i < len; i++) {
        ok = isdigit((unsigned char)tok[i]);
        v = v * 10 + (tok[i] - '0');
    }
    if (!ok || v >= c->tab->n) {
        char what[96];
        snprintf(what, sizeof(what), "expected a rank from 0 to %d, got", c->tab->n - 1);
        return bad(c, what, tok);
    }
    *out = (int)v;
    return WEFT_OK;
}

/* Glob with '*' and '?' over the whole of s; linear-time backtracking
 * (only the last star is retried), so no pattern can make it slow. */
static bool glob_match(const char *p, const char *s)
{
    const char *star = NULL, *retry = NULL;
    while (*s) {
        if (*p == '?' || (*p && *p != '*' && *p == *s)) {
            p++;
            s++;
        } else if (*p == '*') {
            star = p++;
            retry = s;
        } else if (star) {
            p = star + 1;
            s = ++retry;
        } else {
            return false;
        }
    }
    while (*p == '*')
        p++;
    return *p == '\0';
}

/* Can transport t be forced on a pair of hosts (ha, hb)? */
static weft_status_t check_forced(const struct ctx *c, int t, int ha, int hb, const char *tok)
{
    if (t < 0)
        return WEFT_OK;
    if (!(c->tab->allowed & (1u << t)))
        return bad(c, "transport excluded by WEFT_TRANSPORT", tok);
    const struct weft_transport_pair pair = {.same_host = ha == hb};
    if (!weft_transports[t]->can_reach(&pair)) {
        char a[64], b[64], what[256];
        snprintf(what, sizeof(what), "%s cannot join ranks of %s and %s:", weft_transports[t]->name,
                 weft_topo_quote(c->tab->hostid[ha], strlen(c->tab->hostid[ha]), a, sizeof(a)),
                 weft_topo_quote(c->tab->hostid[hb], strlen(c->tab->hostid[hb]), b, sizeof(b)));
        return bad(c, what, tok);
    }
    return WEFT_OK;
}

static const char *transport_token(char **tok, int n)
{
    for (int k = 0; k < n; k++)
        if (strchr(tok[k], '=') == NULL)
            return tok[k];
    return "";
}

static weft_status_t parse_line(const struct ctx *c, char **tok, int ntok, struct staging *sg)
{
    const struct weft_link_table *tab = c->tab;
    struct weft_link_setting s = WEFT_LINK_NO_SETTING;
    s.line = c->line;
    weft_status_t st;
    if (strcmp(tok[0], "default") == 0) {
        char names[128], what[192];
        snprintf(what, sizeof(what), "default needs a transport (%s)",
                 weft_transport_list(~0u, " or ", names, sizeof(names)));
        if (ntok < 2)
            return bad(c, what, NULL);
        int t = weft_transport_find(tok[1]);
        if (t < 0) {
            snprintf(what, sizeof(what), "expected a transport (%s), got", names);
            return bad(c, what, tok[1]);
        }
        if (ntok < 3)
            return bad(c, "default sets nothing: add alpha_us=, gbps= or gbit= after", tok[1]);
        if ((st = parse_settings(c, tok + 2, ntok - 2, false, &s)) != WEFT_OK)
            return st;
        if (!isnan(s.alpha))
            sg->alpha[t] = s.alpha;
        if (!isnan(s.beta))
            sg->beta[t] = s.beta;
        return WEFT_OK;
    }
    if (strcmp(tok[0], "pair") == 0) {
        int i, j;
        if (ntok < 3)
            return bad(c, "pair needs two ranks", ntok == 2 ? tok[1] : NULL);
        if ((st = parse_rank(c, tok[1], &i)) != WEFT_OK ||
            (st = parse_rank(c, tok[2], &j)) != WEFT_OK)
            return st;
        if (i == j)
            return bad(c, "a pair needs two different ranks, got twice", tok[1]);
        if (ntok < 4)
            return bad(c, "pair sets nothing: add a transport or alpha_us=, gbps=, gbit=", NULL);
        if ((st = parse_settings(c, tok + 3, ntok - 3, true, &s)) != WEFT_OK ||
            (st = check_forced(c, s.transport, tab->host[i], tab->host[j],
                               transport_token(tok + 3, ntok - 3))) != WEFT_OK)
            return st;
        if (sg->npairs == sg->pairs_cap) {
            size_t cap = sg->pairs_cap ? 2 * sg->pairs_cap : 16;
            void *p = realloc(sg->pairs, cap * sizeof(*sg->pairs));
            if (p == NULL)
                return no_memory(c);
            sg->pairs = p;
            sg->pairs_cap = cap;
        }
        sg->pairs[sg->npairs].key = weft_link_pair_key(i, j);
        sg->pairs[sg->npairs++].s = s;
        return WEFT_OK;
    }
    if (strcmp(tok[0], "hosts") == 0) {
        if (ntok < 3)
            return bad(c, "hosts needs two host patterns", ntok == 2 ? tok[1] : NULL);
        if (ntok < 4)
            return bad(c, "hosts sets nothing: add a transport or alpha_us=, gbps=, gbit=", NULL);
        if (tab->rules->nhosts_rules + sg->nhosts >= MAX_HOSTS_RULES)
            return bad(c, "more than 256 hosts lines", NULL);
        if ((st = parse_settings(c, tok + 3, ntok - 3, true, &s)) != WEFT_OK)
            return st;
        struct weft_link_hosts_rule h = {s, calloc((size_t)tab->nhosts, 1)};
        if (h.match == NULL)
            return no_memory(c);
        /* Two different hosts the line pairs up, if any: a pair (m < k)
         * shows when k is reached, against the first host of the other side. */
        int ha = -1, hb = -1, first_a = -1, first_b = -1;
        for (int k = 0; k < tab->nhosts; k++) {
            h.match[k] = (unsigned char)(glob_match(tok[1], tab->hostid[k]) |
                                         glob_match(tok[2], tab->hostid[k]) << 1);
            if (ha < 0 && (h.match[k] & 1) && first_b >= 0)
                ha = first_b, hb = k;
            if (ha < 0 && (h.match[k] & 2) && first_a >= 0)
                ha = first_a, hb = k;
            if ((h.match[k] & 1) && first_a < 0)
                first_a = k;
            if ((h.match[k] & 2) && first_b < 0)
                first_b = k;
        }
        st = check_forced(c, s.transport, ha < 0 ? 0 : ha, hb < 0 ? 0 : hb,
                          transport_token(tok + 3, ntok - 3));
        if (st != WEFT_OK) {
            free(h.match);
            return st;
        }
        if (sg->nhosts == sg->hosts_cap) {
            int cap = sg->hosts_cap ? 2 * sg->hosts_cap : 8;
            void *p = realloc(sg->hosts, (size_t)cap * sizeof(*sg->hosts));
            if (p == NULL) {
                free(h.match);
                return no_memory(c);
            }
            sg->hosts = p;
            sg->hosts_cap = cap;
        }
        sg->hosts[sg->nhosts++] = h;
        return WEFT_OK;
    }
    return bad(c, "unknown directive (expected default, hosts or pair)", tok[0]);
}

/* Applies a whole good staging; the allocations come first so that nothing
 * changes unless everything fits. */
static weft_status_t commit(struct weft_link_table *tab, struct staging *sg, const struct ctx *c)
{
    struct weft_link_rules *r = tab->rules;
    if (sg->nhosts > 0 && r->nhosts_rules + sg->nhosts > r->hosts_cap) {
        int cap = r->nhosts_rules + sg->nhosts;
        void *p = realloc(r->hosts, (size_t)cap * sizeof(*r->hosts));
        if (p == NULL)
            goto nomem;
        r->hosts = p;
        r->hosts_cap = cap;
    }
    if (!weft_link_map_reserve(r, sg->npairs))
        goto nomem;
    memcpy(tab->alpha, sg->alpha, sizeof(tab->alpha));
    memcpy(tab->beta, sg->beta, sizeof(tab->beta));
    for (int k = 0; k < sg->nhosts; k++)
        r->hosts[r->nhosts_rules++] = sg->hosts[k];
    sg->nhosts = 0; /* the table owns the match arrays now */
    for (size_t k = 0; k < sg->npairs; k++) {
        struct weft_link_pair *e = weft_link_map_get(r, sg->pairs[k].key);
        const struct weft_link_setting *s = &sg->pairs[k].s;
        if (s->transport >= 0 && s->transport != e->file.transport) {
            /* Costs meant for another transport no longer apply. */
            e->file.alpha = e->file.beta = NAN;
            e->file.transport = s->transport;
        }
        if (!isnan(s->alpha))
            e->file.alpha = s->alpha;
        if (!isnan(s->beta))
            e->file.beta = s->beta;
        e->file.line = s->line;
    }
    return WEFT_OK;
nomem:
    weft_errf(c->err, c->errlen, "%s: out of memory", c->name);
    return WEFT_ERR_NO_MEMORY;
}

weft_status_t weft_topo_table_parse(struct weft_link_table *tab, const char *text, size_t len,
                                    const char *name, char *err, size_t errlen)
{
    if (tab == NULL || tab->rules == NULL || (text == NULL && len > 0))
        return WEFT_ERR_INVALID_ARG;
    struct staging sg = {0};
    memcpy(sg.alpha, tab->alpha, sizeof(sg.alpha));
    memcpy(sg.beta, tab->beta, sizeof(sg.beta));
    struct ctx c = {tab, name ? name : "topology", 0, err, errlen};
    char buf[LINE_MAX_BYTES + 1];
    char *tok[MAX_TOKENS];
    weft_status_t st = WEFT_OK;
    for (size_t pos = 0; pos < len && st == WEFT_OK;) {
        c.line++;
        const char *nl = memchr(text + pos, '\n', len - pos);
        size_t end = nl ? (size_t)(nl - text) : len, n = end - pos;
        if (n > 0 && text[end - 1] == '\r')
            n--;
        if (n > LINE_MAX_BYTES) {
            char q[160];
            weft_errf(err, errlen, "%s:%d: line longer than %d bytes, starting '%s'", c.name,
                           c.line, LINE_MAX_BYTES, weft_topo_quote(text + pos, 24, q, sizeof(q)));
            st = WEFT_ERR_INVALID_ARG;
            break;
        }
        memcpy(buf, text + pos, n);
        buf[n] = '\0';
        pos = end + 1;
        bool comment = false;
        for (size_t k = 0; k < n; k++) {
            unsigned char ch = (unsigned char)buf[k];
            comment |= ch == '#';
            if ((ch >= 0x20 && ch != 0x7f && ch < 0x80) || ch == '\t' || (ch >= 0x80 && comment))
                continue;
            /* Name the token around the byte, escaped. */
            size_t from = k, to = k;
            while (from > 0 && k - from < 16 && buf[from - 1] != ' ' && buf[from - 1] != '\t')
                from--;
            while (to < n && to - from < 32 && buf[to] != ' ' && buf[to] != '\t')
                to++;
            char q[160];
            weft_errf(err, errlen, "%s:%d: %s byte 0x%02x at column %zu in '%s'", c.name,
                           c.line, ch >= 0x80 ? "non-ASCII" : "control", ch, k + 1,
                           weft_topo_quote(buf + from, to - from, q, sizeof(q)));
            st = WEFT_ERR_INVALID_ARG;
            break;
        }
        if (st != WEFT_OK)
            break;
        buf[strcspn(buf, "#")] = '\0';
        int ntok = 0;
        char *save = NULL;
        for (char *t = strtok_r(buf, " \t", &save); t; t = strtok_r(NULL, " \t", &save)) {
            if (ntok == MAX_TOKENS) {
                st = bad(&c, "more than 16 tokens on a line, at", t);
                break;
            }
            tok[ntok++] = t;
        }
        if (st == WEFT_OK && ntok > 0)
            st = parse_line(&c, tok, ntok, &sg);
    }
    if (st == WEFT_OK)
        st = commit(tab, &sg, &c);
    for (int k = 0; k < sg.nhosts; k++)
        free(sg.hosts[k].match);
    free(sg.hosts);
    free(sg.pairs);
    return st;
}

weft_status_t weft_topo_table_load(struct weft_link_table *tab, const char *path, char *err,
                                   size_t errlen)
{
    char *text;
    size_t len;
    weft_status_t st = weft_file_read(path, FILE_MAX_BYTES, &text, &len, err, errlen);
    if (st != WEFT_OK)
        return st;
    st = weft_topo_table_parse(tab, text, len, path, err, errlen);
    free(text);
    return st;
}
