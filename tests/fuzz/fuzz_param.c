/*
 * fuzz_param.c - the parsers of environment parameters (base/param.c and
 * the lists built on them): weft_parse_size (every "int" parameter),
 * weft_parse_mask (WEFT_DEBUG_SUBSYS, WEFT_ALGO, WEFT_TRANSPORT, checked
 * against a reference reading of the list), the two error-reporting
 * wrappers, and weft_ifname_match (WEFT_SOCKET_IFNAME).
 *
 * Input: mode (mod 6), then the value (cut at its first NUL; for
 * ifname, spec NUL ifname).
 */
#include <ctype.h>
#include <strings.h>

#include "fuzz.h"
#include "algorithms/schedule.h"
#include "src/comm.h"
#include "base/sock.h"
#include "select/topo.h"
#include "select/tune.h"

/* The built-in transports' link kinds, found by name as any caller would. */

static const char *const subsys[] = {"INIT", "NET", "COLL", "BOOT", "ENV", "ALL"};
static const char *const algos[] = {"ring", "rhd", "tree", "allreduce:", ";", "^"};
static const char *const transports[] = {"shm", "tcp"};

static void env_size(const char *s)
{
    int64_t v = 0x5a5a5a5a;
    if (!weft_parse_size(s, &v))
        return;
    /* The value prints and parses back the same. */
    char again[32];
    int64_t w = 0;
    snprintf(again, sizeof(again), "%lld", (long long)v);
    FUZZ_CHECK(weft_parse_size(again, &w) && w == v, "'%s' -> %lld -> %lld", s, (long long)v,
               (long long)w);
    /* A unit multiplies: the value is a multiple of it. */
    size_t n = strlen(s);
    if (n > 0 && (s[n - 1] == 'b' || s[n - 1] == 'B'))
        n--;
    char u = n > 0 ? (char)tolower((unsigned char)s[n - 1]) : 0;
    int64_t unit = u == 'k' ? 1 << 10 : u == 'm' ? 1 << 20 : u == 'g' ? 1 << 30 : 1;
    FUZZ_CHECK(v % unit == 0, "'%s' -> %lld, not a multiple of %lld", s, (long long)v,
               (long long)unit);
}

/* The reference: split on commas, skip empty entries, match without case. */
static bool mask_ref(const char *spec, const char *const *names, size_t n, unsigned *mask,
                     char *bad, size_t badlen)
{
    unsigned all = (1u << n) - 1, named = 0;
    if (*spec == '\0') {
        *mask = all;
        return true;
    }
    bool exclude = spec[0] == '^';
    for (const char *p = spec + exclude;;) {
        size_t len = strcspn(p, ",");
        if (len > 0) {
            size_t i = 0;
            while (i < n && !(strlen(names[i]) == len && strncasecmp(p, names[i], len) == 0))
                i++;
            if (i == n) {
                snprintf(bad, badlen, "%.*s", (int)len, p);
                return false;
            }
            named |= 1u << i;
        }
        if (p[len] == '\0')
            break;
        p += len + 1;
    }
    *mask = exclude ? all & ~named : named;
    return true;
}

static void env_list(const char *s, const char *const *names, size_t n)
{
    unsigned got = 0xdead, want = 0xbeef;
    char bad[64] = "", wbad[64] = "";
    bool ok = weft_parse_mask(s, names, n, &got, bad, sizeof(bad));
    bool wok = mask_ref(s, names, n, &want, wbad, sizeof(wbad));
    FUZZ_CHECK(ok == wok, "'%s': %s, the list %s (unknown '%s')", s, ok ? "accepted" : "refused",
               wok ? "is good" : "is not", ok ? wbad : bad);
    if (ok)
        FUZZ_CHECK(got == want, "'%s': mask %#x, expected %#x", s, got, want);
    else
        FUZZ_CHECK(strcmp(bad, wbad) == 0, "'%s': unknown '%s', expected '%s'", s, bad, wbad);
}

static void wrappers(const char *s)
{
    unsigned allowed = 0;
    char err[256];
    if (weft_topo_parse_transports(s, &allowed, err, sizeof(err)) == WEFT_OK)
        FUZZ_CHECK(allowed != 0 && (allowed & ~weft_transport_choosable()) == 0, "'%s' -> %#x", s,
                   allowed);
    else
        FUZZ_CHECK(fuzz_text_ok(err, sizeof(err)) && strncmp(err, "WEFT_TRANSPORT=", 15) == 0,
                   "'%s': message '%s'", s, err);
    unsigned algo[WEFT_COLL_COUNT] = {0};
    if (weft_tune_parse_algo(s, algo) == WEFT_OK)
        for (int c = 0; c < WEFT_COLL_COUNT; c++)
            FUZZ_CHECK(algo[c] != 0 && (algo[c] & ~WEFT_PLAN_ALL) == 0, "'%s' -> %#x", s,
                       algo[c]);
    else
        FUZZ_CHECK(strncmp(weft_thread_last_error(), "WEFT_ALGO=", 10) == 0, "'%s': '%s'", s,
                   weft_thread_last_error());
}

/* The reference: some non-empty entry names the interface, as a prefix
 * or (after '=') exactly; '^' turns the answer round. */
static bool ifname_ref(const char *spec, const char *name)
{
    if (*spec == '\0')
        return true;
    bool exclude = *spec == '^';
    spec += exclude;
    bool exact = *spec == '=';
    spec += exact;
    bool hit = false;
    char *list = strdup(spec), *save = NULL;
    if (list == NULL)
        abort();
    for (char *e = strtok_r(list, ",", &save); e && !hit; e = strtok_r(NULL, ",", &save))
        hit = exact ? strcmp(e, name) == 0 : strncmp(e, name, strlen(e)) == 0;
    free(list);
    return exclude ? !hit : hit;
}

static void ifname(struct fuzz_in *in)
{
    const char *p = (const char *)in->p;
    size_t n = strnlen(p, in->n);
    char *spec = strndup(p, n);
    char *name = n < in->n ? strndup(p + n + 1, in->n - n - 1) : strdup("");
    if (spec == NULL || name == NULL)
        abort();
    bool hit = weft_ifname_match(spec, name);
    FUZZ_CHECK(hit == ifname_ref(spec, name), "WEFT_SOCKET_IFNAME='%s' %s '%s'", spec,
               hit ? "takes" : "refuses", name);
    free(spec);
    free(name);
}

int weft_fuzz_param(const uint8_t *data, size_t size)
{
    weft_fuzz_setup();
    struct fuzz_in in = {data, size};
    int mode = fuzz_u8(&in) % 6;
    if (mode == 5) {
        ifname(&in);
        return 0;
    }
    char *s = fuzz_str(&in);
    switch (mode) {
    case 0: env_size(s); break;
    case 1: env_list(s, subsys, WEFT_ARRAY_SIZE(subsys)); break;
    case 2: env_list(s, algos, WEFT_ARRAY_SIZE(algos)); break;
    case 3: env_list(s, transports, WEFT_ARRAY_SIZE(transports)); break;
    default: wrappers(s); break;
    }
    free(s);
    return 0;
}

WEFT_FUZZ_ENTRY(weft_fuzz_param)
