/*
 * registry.c - the list of transports.  Adding one is its folder (with a
 * struct weft_transport_desc named weft_<name>_desc) and one line in
 * TRANSPORTS below; docs/design.md, "How to add a transport", says more.
 */
#include <stdio.h>
#include <string.h>

#include "transports/registry.h"

/* Link-kind order: the topology file's and weft-info's listings follow it.
 * A new transport goes at the end: ranks exchange link kinds. */
#define TRANSPORTS(X) \
    X(self)           \
    X(shm)            \
    X(tcp)            \
    X(verbs)          \
    /* end of the list */

#define DECLARE(name) extern const struct weft_transport_desc weft_##name##_desc WEFT_HIDDEN;
TRANSPORTS(DECLARE)
#define ENTRY(name) &weft_##name##_desc,
const struct weft_transport_desc *const weft_transports[] = {TRANSPORTS(ENTRY) NULL};

_Static_assert(WEFT_ARRAY_SIZE(weft_transports) - 1 <= WEFT_MAX_TRANSPORTS,
               "raise WEFT_MAX_TRANSPORTS");

int weft_transport_count(void)
{
    return (int)WEFT_ARRAY_SIZE(weft_transports) - 1;
}

int weft_transport_find(const char *name)
{
    for (int t = 0; weft_transports[t]; t++)
        if (strcmp(weft_transports[t]->name, name) == 0)
            return t;
    return -1;
}

const char *weft_transport_name(int t)
{
    return t >= 0 && t < weft_transport_count() ? weft_transports[t]->name : "?";
}

bool weft_transport_reaches_others(int t)
{
    const struct weft_transport_pair here = {.same_host = true}, there = {.same_host = false};
    return weft_transports[t]->can_reach(&here) || weft_transports[t]->can_reach(&there);
}

int weft_transport_base(void)
{
    int t = 0;
    while (weft_transports[t] && !(weft_transports[t]->flags & WEFT_TP_BASE))
        t++;
    return t; /* test_topo checks that there is exactly one */
}

int weft_transport_by_priority(int order[WEFT_MAX_TRANSPORTS])
{
    int n = 0;
    for (int t = 0; weft_transports[t]; t++) {
        int k = n++;
        for (; k > 0 && weft_transports[order[k - 1]]->priority > weft_transports[t]->priority; k--)
            order[k] = order[k - 1];
        order[k] = t;
    }
    return n;
}

unsigned weft_transport_choosable(void)
{
    unsigned mask = 0;
    for (int t = 0; weft_transports[t]; t++)
        if (!(weft_transports[t]->flags & WEFT_TP_IMPLICIT))
            mask |= 1u << t;
    return mask;
}

const char *weft_transport_list(unsigned mask, const char *last_sep, char *buf, size_t len)
{
    int left = __builtin_popcount(mask & ((1u << weft_transport_count()) - 1));
    size_t at = 0;
    buf[0] = '\0';
    for (int t = 0; weft_transports[t] && at < len; t++) {
        if (!(mask & (1u << t)))
            continue;
        left--;
        at += (size_t)snprintf(buf + at, len - at, "%s%s", weft_transports[t]->name,
                               left > 1 ? ", " : left == 1 ? last_sep : "");
    }
    return buf;
}

static pthread_once_t params_once = PTHREAD_ONCE_INIT;

static void register_params(void)
{
    for (int t = 0; weft_transports[t]; t++)
        if (weft_transports[t]->nparams > 0)
            weft_param_register(weft_transports[t]->params, weft_transports[t]->nparams);
}

void weft_transport_register_params(void)
{
    pthread_once(&params_once, register_params);
}
