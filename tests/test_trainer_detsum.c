/*
 * test_trainer_detsum.c - the canonical-tree sums of trainer/detsum.c: the
 * accumulator against the tree's definition, the allreduce and
 * reduce-scatter over real processes against the tree computed here from
 * every rank's seeded input, their composition as the trainer uses it, and
 * the binned sum of squares.
 *
 * Inputs span 2^24 in magnitude with full mantissas, so other orders round
 * differently: inputs_see_order proves it on the very inputs of the jobs,
 * and the accumulator test on its own, or a bitwise match would prove
 * nothing.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "detsum.h"
#include "harness.h"

/* ---- inputs and the reference tree ---------------------------------------------- */

/* Element j of the vector named key: random sign and 52-bit mantissa
 * times 2^e, e in [-12, 12]. */
static double wild(uint64_t key, size_t j)
{
    uint64_t h = weft_test_mix(weft_test_mix(key) ^ j);
    uint64_t g = weft_test_mix(h);
    double m = 1 + (double)(h >> 12) * 0x1p-52;
    int e = (int)(g % 25) - 12;
    return ldexp(g >> 63 ? -m : m, e);
}

static void fill(void *v, weft_dtype_t dt, size_t n, uint64_t key)
{
    for (size_t j = 0; j < n; j++)
        if (dt == WEFT_FLOAT32)
            ((float *)v)[j] = (float)wild(key, j);
        else
            ((double *)v)[j] = wild(key, j);
}

/* The name of item (or rank input) idx of a test. */
static uint64_t item_key(uint64_t salt, int idx)
{
    return weft_test_mix(salt ^ ((uint64_t)(unsigned)idx << 32));
}

static void add(void *dst, const void *src, size_t n, weft_dtype_t dt)
{
    for (size_t i = 0; i < n; i++)
        if (dt == WEFT_FLOAT32)
            ((float *)dst)[i] += ((const float *)src)[i];
        else
            ((double *)dst)[i] += ((const double *)src)[i];
}

/* The definition: items (G, n) contiguous; at level d every item i that is
 * a multiple of 2^(d+1) gets item i + 2^d; the result is item 0. */
static void canon(void *items, int G, size_t n, weft_dtype_t dt)
{
    size_t row = n * weft_dtype_size(dt);
    uint8_t *b = items;
    for (int step = 1; step < G; step *= 2)
        for (int i = 0; i + step < G; i += 2 * step)
            add(b + (size_t)i * row, b + (size_t)(i + step) * row, n, dt);
}

/* The left fold ((x0 + x1) + x2) ... into items[0]. */
static void fold(void *items, int G, size_t n, weft_dtype_t dt)
{
    size_t row = n * weft_dtype_size(dt);
    for (int i = 1; i < G; i++)
        add(items, (uint8_t *)items + (size_t)i * row, n, dt);
}

/* Elements of a and b whose bits differ; *first gets the first one. */
static size_t bits_differ(const void *a, const void *b, weft_dtype_t dt, size_t n, size_t *first)
{
    size_t d = 0;
    for (size_t i = n; i-- > 0;)
        if (weft_test_load_bits(a, dt, i) != weft_test_load_bits(b, dt, i)) {
            d++;
            if (first)
                *first = i;
        }
    return d;
}

/* In a child: 1 after saying where got and want differ, else 0. */
static int check_bits(int rank, const char *what, const void *got, const void *want,
                      weft_dtype_t dt, size_t n)
{
    size_t i = 0, d = bits_differ(got, want, dt, n, &i);
    if (d == 0)
        return 0;
    char g[64], w[64];
    return weft_test_fail(rank, "%s %s [%zu]: expected %s, got %s (%zu of %zu differ)", what,
                          weft_test_dtype_name(dt), i, weft_test_format(want, dt, i, w, sizeof(w)),
                          weft_test_format(got, dt, i, g, sizeof(g)), d, n);
}

/* In a child: 1 after saying why a det_* call returned st rather than
 * want, or why its message lacks `says` (NULL: anything goes); else 0. */
static int expect(int rank, weft_comm_t comm, const char *what, weft_status_t st,
                  weft_status_t want, const char *says)
{
    if (st == want && (!says || strstr(det_last_error(comm), says)))
        return 0;
    return weft_test_fail(rank, "%s returned %s (want %s): %s", what, weft_status_string(st),
                          weft_status_string(want), det_last_error(comm));
}

/* Rank q's whole input in the jobs below. */
static uint64_t rank_key(uint64_t salt, size_t count, int q)
{
    return item_key(salt ^ weft_test_mix(count), q);
}

/* Fills want (p, count) with every rank's input (the tree's items). */
static void all_inputs(void *want, weft_dtype_t dt, size_t count, int p, uint64_t salt)
{
    size_t row = count * weft_dtype_size(dt);
    for (int q = 0; q < p; q++)
        fill((uint8_t *)want + (size_t)q * row, dt, count, rank_key(salt, count, q));
}

/* Chunk c (s floats) of each rank's input of n * s floats: items (p, s). */
static void chunk_of_inputs(float *items, size_t s, int p, int c, uint64_t salt, float *tmp)
{
    for (int q = 0; q < p; q++) {
        fill(tmp, WEFT_FLOAT32, (size_t)p * s, rank_key(salt, s, q));
        memcpy(items + (size_t)q * s, tmp + (size_t)c * s, s * sizeof(float));
    }
}

/* Chunk c of global item g (n * s floats) into out. */
static void item_chunk(float *out, size_t s, int n, int g, int c, uint64_t salt, float *tmp)
{
    fill(tmp, WEFT_FLOAT32, (size_t)n * s, item_key(salt, g));
    memcpy(out, tmp + (size_t)c * s, s * sizeof(float));
}

#define SALT_AR 0xa11ull
#define SALT_RS 0x5ca7ull
#define SALT_COMP 0xc0deull
static const size_t ar_counts[] = {0, 1, 4099, 65537};
static const size_t rs_sizes[] = {1, 1027};
#define XSQ_COUNT 4099u

/* ---- the accumulator ---------------------------------------------------------- */

Test(detsum, tacc_is_the_canonical_tree)
{
    const size_t n = 61;
    const int maxg = 40;
    float *items = malloc((size_t)maxg * n * sizeof(float));
    float *want = malloc((size_t)maxg * n * sizeof(float));
    struct tacc *a = tacc_create(n, maxg);
    cr_assert(items && want && a);
    int order_seen = 0;
    for (int G = 1; G <= maxg; G++) {
        for (int g = 0; g < G; g++)
            fill(items + (size_t)g * n, WEFT_FLOAT32, n, item_key(0x7acc + (uint64_t)G, g));
        tacc_reset(a);
        for (int g = 0; g < G; g++) {
            float *slot = tacc_slot(a);
            cr_assert_not_null(slot, "G=%d: no slot for item %d", G, g);
            memcpy(slot, items + (size_t)g * n, n * sizeof(float));
            tacc_commit(a);
        }
        cr_assert_eq(tacc_items(a), G);
        cr_assert_eq(tacc_slot(a) == NULL, G == maxg, "G=%d: slot past max_items", G);
        size_t got_items = 0;
        const float *got = tacc_finish(a, &got_items);
        cr_assert_eq(got_items, (size_t)G);
        cr_assert_not_null(got);
        cr_assert_null(tacc_slot(a), "G=%d: a slot after finish, before reset", G);

        memcpy(want, items, (size_t)G * n * sizeof(float));
        canon(want, G, n, WEFT_FLOAT32);
        size_t i = 0, d = bits_differ(got, want, WEFT_FLOAT32, n, &i);
        cr_assert_eq(d, 0, "G=%d: %zu of %zu differ from the canonical tree, first [%zu]: %a, "
                     "want %a", G, d, n, i, (double)got[i], (double)want[i]);
        memcpy(want, items, (size_t)G * n * sizeof(float));
        fold(want, G, n, WEFT_FLOAT32);
        order_seen += bits_differ(got, want, WEFT_FLOAT32, n, NULL) > 0;
    }
    /* G <= 3 folds as the tree does; every larger G should show it. */
    cr_assert_geq(order_seen, maxg - 4, "the left fold matched the tree for %d of %d G",
                  maxg - order_seen, maxg);
    tacc_destroy(a);
    free(items);
    free(want);
}

Test(detsum, tacc_edges)
{
    cr_assert_null(tacc_create(8, 0));
    struct tacc *a = tacc_create(5, 1);
    cr_assert_not_null(a);
    size_t k = 99;
    cr_assert_null(tacc_finish(a, &k), "a sum of no items");
    cr_assert_eq(k, 0);
    tacc_reset(a);
    float *slot = tacc_slot(a);
    cr_assert_not_null(slot);
    cr_assert_eq(tacc_slot(a), slot, "the slot moved before commit");
    for (int i = 0; i < 5; i++)
        slot[i] = (float)i - 2.5f;
    tacc_commit(a);
    cr_assert_null(tacc_slot(a), "a slot past max_items = 1");
    const float *s = tacc_finish(a, NULL);
    cr_assert(s && s[0] == -2.5f && s[4] == 1.5f);
    /* Reused after reset, and with empty items. */
    tacc_reset(a);
    cr_assert_not_null(tacc_slot(a));
    tacc_destroy(a);
    tacc_destroy(NULL);
    a = tacc_create(0, 3);
    cr_assert_not_null(a);
    tacc_slot(a);
    tacc_commit(a);
    cr_assert_not_null(tacc_finish(a, &k));
    cr_assert_eq(k, 1);
    tacc_destroy(a);
}

/* ---- the jobs' inputs see the order ------------------------------------------------ */

Test(detsum, inputs_see_order)
{
    static const weft_dtype_t dts[] = {WEFT_FLOAT32, WEFT_FLOAT64};
    const size_t c = 4099;
    double *x = malloc(8 * c * 8), *y = malloc(8 * c * 8);
    cr_assert(x && y);
    for (int t = 0; t < 2; t++)
        for (int p = 4; p <= 8; p++) {
            all_inputs(x, dts[t], c, p, SALT_AR);
            memcpy(y, x, (size_t)p * c * 8);
            canon(x, p, c, dts[t]);
            fold(y, p, c, dts[t]);
            size_t d = bits_differ(x, y, dts[t], c, NULL);
            cr_assert_gt(d, c / 20, "allreduce p=%d %s: the fold differs in only %zu of %zu", p,
                         weft_test_dtype_name(dts[t]), d, c);
        }
    /* Reduce-scatter: chunk 1 of 4 and 8 ranks. */
    for (int p = 4; p <= 8; p *= 2) {
        size_t s = rs_sizes[1];
        float *items = (float *)x, *alt = (float *)y, *tmp = malloc((size_t)p * s * 4);
        cr_assert_not_null(tmp);
        chunk_of_inputs(items, s, p, 1, SALT_RS, tmp);
        memcpy(alt, items, (size_t)p * s * 4);
        canon(items, p, s, WEFT_FLOAT32);
        fold(alt, p, s, WEFT_FLOAT32);
        cr_assert_gt(bits_differ(items, alt, WEFT_FLOAT32, s, NULL), s / 20, "reduce_scatter p=%d",
                     p);
        free(tmp);
    }
    free(x);
    free(y);
}

/* The composition's other natural order, every rank's items first and
 * then the ranks, gives other bits than the tree over all items. */
Test(detsum, composition_sees_order)
{
    const size_t s = 333;
    for (int n = 2; n <= 4; n *= 2) {
        int k = n == 2 ? 3 : 5;
        float *items = malloc((size_t)n * k * s * 4), *ranks = malloc((size_t)n * s * 4);
        float *per = malloc((size_t)k * s * 4), *tmp = malloc((size_t)n * s * 4);
        cr_assert(items && ranks && per && tmp);
        for (int g = 0; g < n * k; g++)
            item_chunk(items + (size_t)g * s, s, n, g, 0, SALT_COMP, tmp);
        for (int r = 0; r < n; r++) {
            for (int j = 0; j < k; j++)
                memcpy(per + (size_t)j * s, items + (size_t)(j * n + r) * s, s * 4);
            canon(per, k, s, WEFT_FLOAT32);
            memcpy(ranks + (size_t)r * s, per, s * 4);
        }
        canon(ranks, n, s, WEFT_FLOAT32);
        canon(items, n * k, s, WEFT_FLOAT32);
        cr_assert_gt(bits_differ(items, ranks, WEFT_FLOAT32, s, NULL), s / 20, "n=%d k=%d", n, k);
        free(items);
        free(ranks);
        free(per);
        free(tmp);
    }
}

/* ---- allreduce -------------------------------------------------------------------- */

struct job {
    weft_dtype_t dt;
    int k; /* composition: items per rank */
};

/* The sum of squares of every rank's input, binned on each rank and summed
 * with weft's allreduce, against the bins of all inputs here. */
static int xsq_across(weft_comm_t comm, int rank, int p, float *x, float *all)
{
    int64_t mine[XSQ_BINS] = {0}, here[XSQ_BINS] = {0};
    fill(x, WEFT_FLOAT32, XSQ_COUNT, rank_key(SALT_AR ^ 0x59, XSQ_COUNT, rank));
    xsq_add(mine, x, XSQ_COUNT, 0.375f);
    WT_CHECK_OK(rank, comm, "weft_allreduce of the bins",
                weft_allreduce(mine, mine, XSQ_BINS, WEFT_INT64, WEFT_SUM, comm));
    all_inputs(all, WEFT_FLOAT32, XSQ_COUNT, p, SALT_AR ^ 0x59);
    for (int q = p - 1; q >= 0; q--)
        xsq_add(here, all + (size_t)q * XSQ_COUNT, XSQ_COUNT, 0.375f);
    double got = xsq_total(mine), want = xsq_total(here);
    if (memcmp(mine, here, sizeof(mine)) || memcmp(&got, &want, sizeof(got)))
        return weft_test_fail(rank, "xsq over ranks: %a, want %a", got, want);
    return 0;
}

static int allreduce_body(weft_comm_t comm, int rank, int p, void *arg)
{
    const struct job *jb = arg;
    size_t es = weft_dtype_size(jb->dt), maxc = ar_counts[3];
    uint8_t *buf = malloc(maxc * es), *scr = malloc(maxc * es), *all = malloc(p * maxc * es);
    int rc = 1;
    if (!buf || !scr || !all) {
        weft_test_fail(rank, "out of memory");
        goto out;
    }
    for (size_t t = 0; t < sizeof(ar_counts) / sizeof(ar_counts[0]); t++) {
        size_t c = ar_counts[t];
        char what[80];
        snprintf(what, sizeof(what), "det_allreduce p=%d count=%zu", p, c);
        fill(buf, jb->dt, c, rank_key(SALT_AR, c, rank));
        memset(scr, 0xff, c * es); /* NaNs: the scratch's contents must not matter */
        if (expect(rank, comm, what, det_allreduce(comm, buf, c, jb->dt, scr), WEFT_OK, NULL))
            goto out;
        all_inputs(all, jb->dt, c, p, SALT_AR);
        canon(all, p, c, jb->dt);
        if (check_bits(rank, what, buf, all, jb->dt, c))
            goto out;
    }
    if (jb->dt == WEFT_FLOAT32 && xsq_across(comm, rank, p, (float *)buf, (float *)all))
        goto out;
    /* A dtype the tree does not sum is refused, saying so. */
    if (expect(rank, comm, "det_allreduce of int32", det_allreduce(comm, buf, 1, WEFT_INT32, scr),
               WEFT_ERR_INVALID_ARG, "float32"))
        goto out;
    rc = 0;
out:
    free(buf);
    free(scr);
    free(all);
    return rc;
}

static void allreduce_job(int p, weft_dtype_t dt)
{
    struct job jb = {.dt = dt};
    int rc = weft_test_run(p, 60, allreduce_body, &jb);
    cr_assert_eq(rc, 0, "det_allreduce p=%d %s failed (see the ranks' lines above)", p,
                 weft_test_dtype_name(dt));
}

Test(detsum, allreduce_1, .timeout = 90) { allreduce_job(1, WEFT_FLOAT32); }
Test(detsum, allreduce_2, .timeout = 90) { allreduce_job(2, WEFT_FLOAT32); }
Test(detsum, allreduce_4, .timeout = 90) { allreduce_job(4, WEFT_FLOAT32); }
Test(detsum, allreduce_4_f64, .timeout = 90) { allreduce_job(4, WEFT_FLOAT64); }
Test(detsum, allreduce_8, .timeout = 90) { allreduce_job(8, WEFT_FLOAT32); }
Test(detsum, allreduce_3, .timeout = 90) { allreduce_job(3, WEFT_FLOAT32); }
Test(detsum, allreduce_5, .timeout = 90) { allreduce_job(5, WEFT_FLOAT32); }
Test(detsum, allreduce_5_f64, .timeout = 90) { allreduce_job(5, WEFT_FLOAT64); }
Test(detsum, allreduce_6, .timeout = 90) { allreduce_job(6, WEFT_FLOAT32); }

/* ---- reduce-scatter ------------------------------------------------------------------ */

static int reduce_scatter_body(weft_comm_t comm, int rank, int p, void *arg)
{
    (void)arg;
    size_t maxs = rs_sizes[1], ps = (size_t)p * maxs;
    float *full = malloc(ps * 4), *part = malloc(maxs * 4), *scr = malloc(ps * 4);
    float *want = malloc(ps * 4), *tmp = malloc(ps * 4);
    int rc = 1;
    if (!full || !part || !scr || !want || !tmp) {
        weft_test_fail(rank, "out of memory");
        goto out;
    }
    if (p & (p - 1)) {
        rc = expect(rank, comm, "det_reduce_scatter on a size not a power of two",
                    det_reduce_scatter(comm, full, part, 1, scr), WEFT_ERR_UNSUPPORTED,
                    "power of two");
        goto out;
    }
    for (size_t t = 0; t < sizeof(rs_sizes) / sizeof(rs_sizes[0]); t++)
        for (int inplace = 0; inplace < 2; inplace++) {
            size_t s = rs_sizes[t];
            char what[80];
            snprintf(what, sizeof(what), "det_reduce_scatter p=%d s=%zu%s", p, s,
                     inplace ? " in place" : "");
            fill(full, WEFT_FLOAT32, (size_t)p * s, rank_key(SALT_RS, s, rank));
            memset(scr, 0xff, (size_t)p * s * 4);
            float *out = inplace ? full + (size_t)rank * s : part;
            if (expect(rank, comm, what, det_reduce_scatter(comm, full, out, s, scr), WEFT_OK,
                       NULL))
                goto out;
            chunk_of_inputs(want, s, p, rank, SALT_RS, tmp);
            canon(want, p, s, WEFT_FLOAT32);
            if (check_bits(rank, what, out, want, WEFT_FLOAT32, s))
                goto out;
        }
    rc = 0;
out:
    free(full);
    free(part);
    free(scr);
    free(want);
    free(tmp);
    return rc;
}

static void reduce_scatter_job(int p)
{
    int rc = weft_test_run(p, 60, reduce_scatter_body, NULL);
    cr_assert_eq(rc, 0, "det_reduce_scatter p=%d failed (see the ranks' lines above)", p);
}

Test(detsum, reduce_scatter_1, .timeout = 90) { reduce_scatter_job(1); }
Test(detsum, reduce_scatter_2, .timeout = 90) { reduce_scatter_job(2); }
Test(detsum, reduce_scatter_4, .timeout = 90) { reduce_scatter_job(4); }
Test(detsum, reduce_scatter_8, .timeout = 90) { reduce_scatter_job(8); }
Test(detsum, reduce_scatter_3_refused, .timeout = 90) { reduce_scatter_job(3); }

/* ---- composition: what the trainer's data parallelism does ----------------------------- */

/*
 * Rank r holds global items g = j * n + r, j < k.  Reduce-scattering each
 * item and accumulating the k shards must give the canonical tree over all
 * n * k items of chunk r; allreducing each item and accumulating the whole
 * vectors, the tree over all items of every chunk.
 */
static int composition_body(weft_comm_t comm, int rank, int n, void *arg)
{
    const struct job *jb = arg;
    const size_t s = 333, ns = (size_t)n * s;
    int k = jb->k, G = n * k;
    struct tacc *shard = tacc_create(s, k), *whole = tacc_create(ns, k);
    float *full = malloc(ns * 4), *scr = malloc(ns * 4), *tmp = malloc(ns * 4);
    float *items = malloc((size_t)G * ns * 4);
    int rc = 1;
    if (!shard || !whole || !full || !scr || !tmp || !items) {
        weft_test_fail(rank, "out of memory");
        goto out;
    }
    for (int j = 0; j < k; j++) {
        int g = j * n + rank;
        float *w = tacc_slot(whole);
        fill(w, WEFT_FLOAT32, ns, item_key(SALT_COMP, g));
        memcpy(full, w, ns * 4);
        weft_status_t st = det_allreduce(comm, w, ns, WEFT_FLOAT32, scr);
        if (st == WEFT_OK)
            st = det_reduce_scatter(comm, full, tacc_slot(shard), s, scr);
        if (expect(rank, comm, "det_allreduce or det_reduce_scatter of an item", st, WEFT_OK,
                   NULL))
            goto out;
        tacc_commit(whole);
        tacc_commit(shard);
    }
    for (int g = 0; g < G; g++)
        item_chunk(items + (size_t)g * s, s, n, g, rank, SALT_COMP, tmp);
    canon(items, G, s, WEFT_FLOAT32);
    if (check_bits(rank, "reduce_scatter then tacc", tacc_finish(shard, NULL), items,
                   WEFT_FLOAT32, s))
        goto out;
    for (int g = 0; g < G; g++)
        fill(items + (size_t)g * ns, WEFT_FLOAT32, ns, item_key(SALT_COMP, g));
    canon(items, G, ns, WEFT_FLOAT32);
    if (check_bits(rank, "allreduce then tacc", tacc_finish(whole, NULL), items, WEFT_FLOAT32,
                   ns))
        goto out;
    rc = 0;
out:
    tacc_destroy(shard);
    tacc_destroy(whole);
    free(full);
    free(scr);
    free(tmp);
    free(items);
    return rc;
}

static void composition_job(int n, int k)
{
    struct job jb = {.dt = WEFT_FLOAT32, .k = k};
    int rc = weft_test_run(n, 60, composition_body, &jb);
    cr_assert_eq(rc, 0, "composition n=%d k=%d failed (see the ranks' lines above)", n, k);
}

Test(detsum, composition_2x3, .timeout = 90) { composition_job(2, 3); }
Test(detsum, composition_4x5, .timeout = 90) { composition_job(4, 5); }

/* ---- sum of squares ------------------------------------------------------------------- */

/* The bins as the definition reads, with frexp and ldexp. */
static void xsq_reference(int64_t *bins, const float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float g = x[i] * scale;
        if (isnan(g) || isinf(g)) {
            bins[isnan(g) ? XSQ_NAN : XSQ_INF]++;
            continue;
        }
        int e;
        double m = frexp((double)g * (double)g, &e);
        if (m != 0)
            bins[e - XSQ_EMIN] += (int64_t)ldexp(m, 31);
    }
}

#define XN 20011u

/* x: magnitudes 2^-40 .. 2^40 with full mantissas, a few zeros and
 * subnormals, and float's extremes. */
static void xsq_inputs(float *x)
{
    for (size_t i = 0; i < XN; i++) {
        uint64_t h = weft_test_mix(0x55 + i), g = weft_test_mix(h);
        float m = 1 + (float)(h >> 41) * 0x1p-23f;
        x[i] = ldexpf(g >> 63 ? -m : m, (int)(g % 81) - 40);
    }
    x[7] = 0;
    x[100] = -0.0f;
    x[200] = FLT_TRUE_MIN;
    x[300] = -FLT_MIN;
    x[400] = FLT_MAX;
    x[500] = 0x1p-140f;
}

Test(detsum, xsq_is_order_free_and_close)
{
    float *x = malloc(XN * 4), *y = malloc(XN * 4);
    int64_t *b = calloc(XSQ_BINS, 8), *c = calloc(XSQ_BINS, 8), *ref = calloc(XSQ_BINS, 8);
    cr_assert(x && y && b && c && ref);
    xsq_inputs(x);
    x[400] = 1; /* FLT_MAX would hide every other term; see xsq_extremes */
    const float scale = 0.3f;
    xsq_add(b, x, XN, scale);
    xsq_reference(ref, x, XN, scale);
    cr_assert_arr_eq(b, ref, XSQ_BINS * 8, "the bins differ from frexp's");
    double total = xsq_total(b);

    long double exact = 0;
    for (size_t i = 0; i < XN; i++) {
        float g = x[i] * scale;
        exact += (long double)g * g;
    }
    double rel = (double)fabsl((long double)total - exact) / (double)exact;
    cr_assert_lt(rel, 1e-8, "total %a, long double sum %La: relative error %g", total, exact, rel);

    /* Shuffled: the same bins and total, bit for bit. */
    memcpy(y, x, XN * 4);
    for (size_t i = XN - 1; i > 0; i--) {
        size_t j = weft_test_mix(0x5f + i) % (i + 1);
        float t = y[i];
        y[i] = y[j];
        y[j] = t;
    }
    xsq_add(c, y, XN, scale);
    cr_assert_arr_eq(c, b, XSQ_BINS * 8, "shuffled bins differ");
    double t2 = xsq_total(c);
    cr_assert(memcmp(&t2, &total, 8) == 0, "shuffled total %a, in order %a", t2, total);
    /* The float sum of the squares in these two orders differs, so the
     * match above is not an accident of the inputs. */
    float fx = 0, fy = 0;
    for (size_t i = 0; i < XN; i++) {
        float gx = x[i] * scale, gy = y[i] * scale;
        fx += gx * gx;
        fy += gy * gy;
    }
    cr_assert_neq(fx, fy, "a float sum in both orders agrees: the shuffle proves nothing");

    /* Split into uneven parts, each binned apart, bins added. */
    memset(c, 0, XSQ_BINS * 8);
    size_t at = 0;
    for (int part = 0; at < XN; part++) {
        size_t len = 1 + weft_test_mix(0x9a + (uint64_t)part) % 3000;
        if (len > XN - at)
            len = XN - at;
        int64_t p[XSQ_BINS] = {0};
        xsq_add(p, y + at, len, scale);
        for (int k = 0; k < XSQ_BINS; k++)
            c[k] += p[k];
        at += len;
    }
    cr_assert_arr_eq(c, b, XSQ_BINS * 8, "bins of the parts, added, differ");
    free(x);
    free(y);
    free(b);
    free(c);
    free(ref);
}

Test(detsum, xsq_extremes_and_non_finite)
{
    int64_t b[XSQ_BINS] = {0};
    float v = FLT_TRUE_MIN;
    xsq_add(b, &v, 1, 1);
    cr_assert_eq(xsq_total(b), 0x1p-298, "denormal min: %a", xsq_total(b));
    memset(b, 0, sizeof(b));
    v = FLT_MAX;
    xsq_add(b, &v, 1, 1);
    double want = (double)FLT_MAX * FLT_MAX, got = xsq_total(b);
    cr_assert(fabs(got - want) / want < 0x1p-29, "FLT_MAX^2: %a, want %a", got, want);
    memset(b, 0, sizeof(b));
    cr_assert_eq(xsq_total(b), 0);

    float *x = malloc(XN * 4);
    cr_assert_not_null(x);
    xsq_inputs(x);
    int64_t ref[XSQ_BINS] = {0};
    xsq_add(b, x, XN, 1);
    xsq_reference(ref, x, XN, 1);
    cr_assert_arr_eq(b, ref, sizeof(b), "the bins of extremes differ from frexp's");
    cr_assert(isfinite(xsq_total(b)));

    x[1234] = NAN;
    memset(b, 0, sizeof(b));
    xsq_add(b, x, XN, 1);
    cr_assert(isnan(xsq_total(b)), "a NaN gave %a", xsq_total(b));
    x[1234] = -INFINITY;
    memset(b, 0, sizeof(b));
    xsq_add(b, x, XN, 1);
    cr_assert(isinf(xsq_total(b)) && xsq_total(b) > 0, "-Inf gave %a", xsq_total(b));
    /* The scaled product is what counts: it overflows, or is Inf * 0. */
    x[1234] = 1e30f;
    memset(b, 0, sizeof(b));
    xsq_add(b, x + 1234, 1, 1e10f);
    cr_assert(isinf(xsq_total(b)), "1e30 * 1e10 gave %a", xsq_total(b));
    x[1234] = INFINITY;
    memset(b, 0, sizeof(b));
    xsq_add(b, x + 1234, 1, 0);
    cr_assert(isnan(xsq_total(b)), "Inf * 0 gave %a", xsq_total(b));
    free(x);
}
