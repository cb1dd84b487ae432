/*
 * tune.c - algorithm selection by an alpha-beta cost model.  alpha is one
 * message's latency, beta the time per byte, gamma the time per reduced
 * byte; figures measured on TCP loopback here (~2.5 GB/s per direction,
 * reductions ~10 GB/s).  The model only has to rank the candidates, not
 * predict absolute times; measured crossovers rd -> ring: ~1 MiB at p = 2,
 * 0.3-1 MiB at p = 4.
 */
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "algorithms/schedule.h"
#include "tune.h"

#define ALPHA 20e-6 /* 7.5 us with a core each; ~30 us per hop with 2 ranks a core */
#define BETA (1.0 / 2.5e9)
#define GAMMA (1.0 / 10e9)

int weft_tune_coll_from_name(const char *name, size_t len)
{
    static const char *const names[] = {
        [WEFT_COLL_ALLREDUCE] = "allreduce", [WEFT_COLL_REDUCE_SCATTER] = "reducescatter",
        [WEFT_COLL_ALLGATHER] = "allgather", [WEFT_COLL_BROADCAST] = "broadcast",
        [WEFT_COLL_REDUCE] = "reduce",
    };
    for (int c = 0; c < (int)WEFT_ARRAY_SIZE(names); c++)
        if (strncasecmp(name, names[c], len) == 0 && names[c][len] == '\0')
            return c;
    return -1;
}

/* One list ("ring,tree", "^tree") -> mask; false with the bad name. */
static bool parse_list(const char *tok, size_t len, unsigned *mask, char *bad, size_t badlen)
{
    unsigned all = (1u << WEFT_ALGO_COUNT) - 1, named = 0;
    bool exclude = len > 0 && tok[0] == '^';
    for (size_t i = exclude; i < len;) {
        size_t n = 0;
        while (i + n < len && tok[i + n] != ',')
            n++;
        if (n > 0) {
            int a = weft_algo_from_name(tok + i, n);
            if (a < 0) {
                snprintf(bad, badlen, "%.*s", (int)WEFT_MIN(n, (size_t)60), tok + i);
                return false;
            }
            named |= 1u << a;
        }
        i += n + 1;
    }
    *mask = exclude ? all & ~named : named;
    return true;
}

weft_status_t weft_tune_parse_algo(const char *spec, unsigned masks[WEFT_COLL_COUNT])
{
    unsigned m[WEFT_COLL_COUNT];
    for (int c = 0; c < WEFT_COLL_COUNT; c++)
        m[c] = (1u << WEFT_ALGO_COUNT) - 1;
    for (const char *e = spec ? spec : ""; *e;) {
        size_t len = strcspn(e, ";");
        const char *colon = memchr(e, ':', len);
        int coll = -1;
        const char *list = e;
        if (colon) {
            coll = weft_tune_coll_from_name(e, (size_t)(colon - e));
            if (coll < 0)
                return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                        "WEFT_ALGO=%s: unknown collective '%.*s' (available: "
                                        "allreduce, reducescatter, allgather, broadcast, reduce)",
                                        spec, (int)WEFT_MIN((size_t)(colon - e), (size_t)60), e);
            list = colon + 1;
        }
        size_t llen = len - (size_t)(list - e);
        char bad[64];
        unsigned mask;
        if (!parse_list(list, llen, &mask, bad, sizeof(bad)))
            return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                    "WEFT_ALGO=%s: unknown algorithm '%s' (available: ring, "
                                    "tree, rhd, direct, hier)", spec, bad);
        if (mask == 0 && llen > 0)
            return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                    "WEFT_ALGO=%s: '%.*s' leaves no algorithm (available: ring, "
                                    "tree, rhd, direct, hier)", spec, (int)WEFT_MIN(len, (size_t)60), e);
        if (llen > 0)
            for (int c = 0; c < WEFT_COLL_COUNT; c++)
                if (coll < 0 || c == coll)
                    m[c] = mask;
        e += len + (e[len] == ';');
    }
    memcpy(masks, m, sizeof(m));
    return WEFT_OK;
}

static double cost(struct weft_plan pl, int p, double n)
{
    if (pl.algo == WEFT_ALGO_RING) /* reduce-scatter + allgather */
        return 2.0 * (p - 1) * (ALPHA + n / p * BETA) + (p - 1) * n / p * GAMMA;
    int lg = 0, pof2 = 1;
    while (pof2 * 2 <= p) {
        pof2 *= 2;
        lg++;
    }
    int rounds = lg + (pof2 != p ? 2 : 0);
    return rounds * (ALPHA + n * BETA) + (lg + (pof2 != p)) * n * GAMMA;
}

struct weft_plan weft_tune_pick(unsigned mask, int coll, int nranks, size_t bytes)
{
    const struct weft_plan ring = {WEFT_ALGO_RING, 0};
    const struct weft_plan rd = {WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING};
    const struct weft_plan binomial = {WEFT_ALGO_TREE, WEFT_VAR_TREE_BINOMIAL};
    if (nranks < 2)
        return ring;
    /* tree exists for broadcast only, rd for allreduce only; the ring runs
     * everything, so a call nothing allowed can serve falls back to it. */
    /* The binomial tree (ceil(log2 p) hops against the chain's p - 1) is
     * not picked by itself yet: on this 2-core machine, with ranks sharing
     * cores, both move the same bytes and the chain measured faster from
     * 8 KiB (4 ranks) and at every size with 8 ranks.  Choosing it needs
     * the per-link costs and core counts, not a rank count alone. */
    if (coll == WEFT_COLL_BROADCAST && (mask & (1u << WEFT_ALGO_TREE)) &&
        !(mask & (1u << WEFT_ALGO_RING)))
        return binomial;
    if (coll != WEFT_COLL_ALLREDUCE || !(mask & (1u << WEFT_ALGO_RHD)))
        return ring;
    if (!(mask & (1u << WEFT_ALGO_RING)))
        return rd;
    return cost(rd, nranks, (double)bytes) < cost(ring, nranks, (double)bytes) ? rd : ring;
}
