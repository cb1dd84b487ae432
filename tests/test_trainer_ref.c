/*
 * test_trainer_ref.c - trainer/model.c against an independent PyTorch
 * reference: loss and every gradient element for the fixtures written by
 * trainer/reference/gen_fixtures.py (format documented there).
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

#ifndef FIXTURE_DIR
#define FIXTURE_DIR "tests/fixtures/trainer"
#endif

/* ---- fixture -------------------------------------------------------------- */

/* One case as gen_fixtures.py wrote it; owned by the test that loaded it. */
struct fixture {
    struct model_config cfg;
    int B, T;
    size_t P;         /* number of parameters */
    float *params;    /* (P) */
    uint8_t *tokens;  /* (B, T) */
    uint8_t *targets; /* (B, T) */
    double loss;
    float *grads; /* (P), reference d(loss)/d(params) */
};

/* Little-endian decoders, so the fixtures read the same on any host. */
static uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
    return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static void le_floats(float *dst, const uint8_t *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u = le32(src + 4 * i);
        memcpy(&dst[i], &u, sizeof u);
    }
}

static void fixture_load(struct fixture *fx, const char *name)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", FIXTURE_DIR, name);
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f, "cannot open fixture %s", path);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    cr_assert(size >= 44, "%s: %ld bytes, too short for a header", path, size);
    uint8_t *buf = malloc((size_t)size);
    cr_assert_not_null(buf);
    cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size, "%s: short read", path);
    fclose(f);

    cr_assert(memcmp(buf, "WEFTREF1", 8) == 0, "%s: bad magic", path);
    int32_t h[7];
    for (int i = 0; i < 7; i++)
        h[i] = (int32_t)le32(buf + 8 + 4 * i);
    fx->cfg = (struct model_config){ .vocab = h[0], .max_t = h[1], .layers = h[2],
                                     .channels = h[3], .heads = h[4] };
    fx->B = h[5];
    fx->T = h[6];
    fx->P = (size_t)le64(buf + 36);
    size_t bt = (size_t)fx->B * (size_t)fx->T;
    size_t want = 44 + 4 * fx->P + 2 * bt + 8 + 4 * fx->P;
    cr_assert_eq((size_t)size, want, "%s: %ld bytes, header says %zu", path, size, want);

    const uint8_t *p = buf + 44;
    fx->params = malloc(fx->P * sizeof(float));
    fx->grads = malloc(fx->P * sizeof(float));
    fx->tokens = malloc(bt);
    fx->targets = malloc(bt);
    cr_assert(fx->params && fx->grads && fx->tokens && fx->targets);
    le_floats(fx->params, p, fx->P);
    p += 4 * fx->P;
    memcpy(fx->tokens, p, bt);
    p += bt;
    memcpy(fx->targets, p, bt);
    p += bt;
    uint64_t lb = le64(p);
    memcpy(&fx->loss, &lb, sizeof lb);
    p += 8;
    le_floats(fx->grads, p, fx->P);
    free(buf);
}

static void fixture_free(struct fixture *fx)
{
    free(fx->params);
    free(fx->grads);
    free(fx->tokens);
    free(fx->targets);
}

/* ---- tensor table ---------------------------------------------------------- */

/* model.h's layout, rebuilt here from the config so the test does not trust
 * model_layout() for the names it reports. */
struct tensor {
    char name[32];
    int unit;
    size_t off, n;
};

static const char *const layer_names[12] = { "ln1w",     "ln1b",     "qkvw", "qkvb",
                                             "attprojw", "attprojb", "ln2w", "ln2b",
                                             "fcw",      "fcb",      "fcprojw", "fcprojb" };

/* Fills t (room for 4 + 12 L); returns the count. */
static int tensor_table(const struct model_config *c, struct tensor *t)
{
    size_t C = (size_t)c->channels, off = 0;
    size_t lsz[12] = { C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C };
    int k = 0;
#define ADD(u, sz, ...)                                                                    \
    do {                                                                                   \
        snprintf(t[k].name, sizeof t[k].name, __VA_ARGS__);                                \
        t[k].unit = (u);                                                                   \
        t[k].off = off;                                                                    \
        t[k].n = (sz);                                                                     \
        off += (sz);                                                                       \
        k++;                                                                               \
    } while (0)
    ADD(0, (size_t)c->vocab * C, "wte");
    ADD(1, (size_t)c->max_t * C, "wpe");
    for (int l = 0; l < c->layers; l++)
        for (int i = 0; i < 12; i++)
            ADD(2 + l, lsz[i], "l%d.%s", l, layer_names[i]);
    ADD(c->layers + 2, C, "lnfw");
    ADD(c->layers + 2, C, "lnfb");
#undef ADD
    return k;
}

/* ---- comparison ------------------------------------------------------------ */

/*
 * got vs scale * ref, tensor by tensor.  The reference is float64 rounded
 * once; the model sums in float32 over at most a few hundred terms, so its
 * error is a small multiple of 2^-24 times the tensor's largest gradient:
 * tol = 1e-4 * max|ref| (of that tensor) + 1e-6 leaves ~100x headroom and
 * still catches a wrong term (those are O(max|ref|)).
 */
static void compare_grads(const struct fixture *fx, const float *got, double scale,
                          const char *what)
{
    struct tensor *t = calloc((size_t)(4 + 12 * fx->cfg.layers), sizeof *t);
    cr_assert_not_null(t);
    int nt = tensor_table(&fx->cfg, t);

    double worst_ratio = 0;
    int worst_t = -1;
    size_t worst_i = 0;
    for (int k = 0; k < nt; k++) {
        double gmax = 0, emax = 0;
        for (size_t i = 0; i < t[k].n; i++)
            gmax = fmax(gmax, fabs(scale * fx->grads[t[k].off + i]));
        double tol_k = 1e-4 * gmax + 1e-6 * scale;
        for (size_t i = 0; i < t[k].n; i++) {
            size_t j = t[k].off + i;
            double err = fabs((double)got[j] - scale * fx->grads[j]);
            double ratio = isfinite(got[j]) ? err / tol_k : INFINITY;
            emax = fmax(emax, isfinite(got[j]) ? err : INFINITY);
            if (worst_t < 0 || ratio > worst_ratio) {
                worst_ratio = ratio;
                worst_t = k;
                worst_i = i;
            }
        }
        cr_log_info("%s %-12s max|ref| %.3e  max|err| %.3e  (%.2e of max)", what, t[k].name,
                    gmax, emax, gmax > 0 ? emax / gmax : 0.0);
    }
    size_t j = t[worst_t].off + worst_i;
    cr_expect(worst_ratio <= 1.0,
              "%s: worst gradient %s[%zu] (flat %zu): model %.9g, reference %.9g, "
              "err %.3g = %.3g x tolerance",
              what, t[worst_t].name, worst_i, j, (double)got[j], scale * fx->grads[j],
              fabs((double)got[j] - scale * fx->grads[j]), worst_ratio);
    free(t);
}

/* ---- the check ------------------------------------------------------------- */

static void check_fixture(const char *name)
{
    struct fixture fx;
    fixture_load(&fx, name);
    struct model *m = model_create(&fx.cfg, fx.B, fx.T);
    cr_assert_not_null(m, "%s: model_create refused the fixture's config", name);

    /* The layout must be the one the fixture was written in. */
    const struct model_layout *lay = model_layout(m);
    cr_assert_eq(lay->total, fx.P, "%s: model has %zu params, fixture %zu", name, lay->total,
                 fx.P);
    cr_assert_eq(lay->nunits, fx.cfg.layers + 3);
    struct tensor *t = calloc((size_t)(4 + 12 * fx.cfg.layers), sizeof *t);
    cr_assert_not_null(t);
    int nt = tensor_table(&fx.cfg, t);
    for (int k = 0; k < nt; k++) {
        int u = t[k].unit;
        cr_assert(t[k].off >= lay->unit_off[u] && t[k].off + t[k].n <= lay->unit_off[u + 1],
                  "%s: %s [%zu, %zu) is not inside unit %d [%zu, %zu)", name, t[k].name,
                  t[k].off, t[k].off + t[k].n, u, lay->unit_off[u], lay->unit_off[u + 1]);
    }
    free(t);

    float loss = model_forward(m, fx.params, NULL, fx.tokens, fx.targets, fx.B, fx.T);
    cr_log_info("%s loss model %.9g reference %.12g rel %.2e", name, (double)loss, fx.loss,
                fabs(loss - fx.loss) / fx.loss);
    cr_expect(fabs(loss - fx.loss) <= 1e-5 * fabs(fx.loss),
              "%s: loss model %.9g, reference %.12g (rel err %.3g)", name, (double)loss,
              fx.loss, fabs(loss - fx.loss) / fabs(fx.loss));

    float *grads = calloc(fx.P, sizeof(float));
    cr_assert_not_null(grads);
    model_backward(m, fx.params, grads, NULL);
    compare_grads(&fx, grads, 1.0, name);

    /* model_backward accumulates: a second pass into the same buffer doubles it. */
    char what[64];
    snprintf(what, sizeof what, "%s (2nd pass, accumulated)", name);
    float loss2 = model_forward(m, fx.params, NULL, fx.tokens, fx.targets, fx.B, fx.T);
    cr_expect(fabs(loss2 - fx.loss) <= 1e-5 * fabs(fx.loss), "%s: second forward %.9g", name,
              (double)loss2);
    model_backward(m, fx.params, grads, NULL);
    compare_grads(&fx, grads, 2.0, what);

    free(grads);
    model_destroy(m);
    fixture_free(&fx);
}

/* Two layers, T = maxT. */
Test(trainer_ref, tiny)
{
    check_fixture("tiny.bin");
}

/* One layer, four heads, odd T < maxT (wpe rows past T get no gradient). */
Test(trainer_ref, short_t)
{
    check_fixture("short_t.bin");
}
