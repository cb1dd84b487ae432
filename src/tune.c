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

weft_status_t weft_tune_parse_algo(const char *spec, unsigned *mask)
{
    const char *names[WEFT_ALGO_COUNT];
    for (int a = 0; a < WEFT_ALGO_COUNT; a++)
        names[a] = weft_algo_name(a);
    char bad[64];
    if (!weft_parse_mask(spec, names, WEFT_ALGO_COUNT, mask, bad, sizeof(bad)))
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "WEFT_ALGO=%s: unknown algorithm '%s' (available: ring, rd, tree)",
                                spec, bad);
    /* A call no allowed algorithm serves runs the ring (weft_tune_pick). */
    if (*mask == 0)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "WEFT_ALGO=%s leaves no algorithm (available: ring, rd, tree)",
                                spec);
    return WEFT_OK;
}

static double cost(int algo, int p, double n)
{
    if (algo == WEFT_ALGO_RING) /* reduce-scatter + allgather */
        return 2.0 * (p - 1) * (ALPHA + n / p * BETA) + (p - 1) * n / p * GAMMA;
    int lg = 0, pof2 = 1;
    while (pof2 * 2 <= p) {
        pof2 *= 2;
        lg++;
    }
    int rounds = lg + (pof2 != p ? 2 : 0);
    return rounds * (ALPHA + n * BETA) + (lg + (pof2 != p)) * n * GAMMA;
}

int weft_tune_pick(unsigned mask, int coll, int nranks, size_t bytes)
{
    if (nranks < 2)
        return WEFT_ALGO_RING;
    /* tree exists for broadcast only, rd for allreduce only; the ring runs
     * everything, so a call nothing allowed can serve falls back to it. */
    /* The binomial tree (ceil(log2 p) hops against the chain's p - 1) is
     * not picked by itself yet: on this 2-core machine, with ranks sharing
     * cores, both move the same bytes and the chain measured faster from
     * 8 KiB (4 ranks) and at every size with 8 ranks.  Choosing it needs
     * the per-link costs and core counts, not a rank count alone. */
    if (coll == WEFT_COLL_BROADCAST && (mask & (1u << WEFT_ALGO_TREE)) &&
        !(mask & (1u << WEFT_ALGO_RING)))
        return WEFT_ALGO_TREE;
    if (coll != WEFT_COLL_ALLREDUCE || !(mask & (1u << WEFT_ALGO_RD)))
        return WEFT_ALGO_RING;
    if (!(mask & (1u << WEFT_ALGO_RING)))
        return WEFT_ALGO_RD;
    return cost(WEFT_ALGO_RD, nranks, (double)bytes) < cost(WEFT_ALGO_RING, nranks, (double)bytes)
               ? WEFT_ALGO_RD
               : WEFT_ALGO_RING;
}
