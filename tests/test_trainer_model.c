/*
 * test_trainer_model.c - the trainer's model (trainer/model.c): gradients
 * against finite differences, the hook protocol, gradient accumulation,
 * shapes below the maximum, initialisation and config validation.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

/* ---- helpers -------------------------------------------------------------- */

#include "testutil.h"


static double rnd_unit(void) /* [0, 1) */
{
    return (double)(weft_test_rnd() >> 11) * 0x1p-53;
}

static double rnd_normal(void)
{
    double u1 = rnd_unit() + 0x1p-54, u2 = rnd_unit();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

static void rnd_bytes(uint8_t *x, size_t n, int vocab)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (uint8_t)(weft_test_rnd() % (uint64_t)vocab);
}

/* The tiny model of the gradient check: small enough to differentiate
 * numerically, with every dimension > 1 and two heads. */
static const struct model_config tiny = { .vocab = 256, .max_t = 8, .layers = 2, .channels = 16,
                                          .heads = 2 };

/* One named tensor of the flat layout, rebuilt here from model.h's text
 * (not from model.c) so the layout itself is under test. */
struct tensor {
    char name[24];
    size_t off, len; /* floats */
    int unit;
};

static void add_tensor(struct tensor *t, int *n, size_t *off, const char *name, int l, int unit,
                       size_t len)
{
    if (l >= 0)
        snprintf(t[*n].name, sizeof t[*n].name, "l%d.%s", l, name);
    else
        snprintf(t[*n].name, sizeof t[*n].name, "%s", name);
    t[*n].off = *off;
    t[*n].len = len;
    t[*n].unit = unit;
    *off += len;
    (*n)++;
}

static int build_tensors(const struct model_config *c, struct tensor *t)
{
    size_t V = c->vocab, C = c->channels, MT = c->max_t, off = 0;
    int n = 0;
    add_tensor(t, &n, &off, "wte", -1, 0, V * C);
    add_tensor(t, &n, &off, "wpe", -1, 1, MT * C);
    static const char *const names[12] = { "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                           "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb" };
    const size_t lens[12] = { C, C, 3 * C * C, 3 * C, C * C,     C,
                              C, C, 4 * C * C, 4 * C, C * 4 * C, C };
    for (int l = 0; l < c->layers; l++)
        for (int k = 0; k < 12; k++)
            add_tensor(t, &n, &off, names[k], l, 2 + l, lens[k]);
    add_tensor(t, &n, &off, "lnfw", -1, c->layers + 2, C);
    add_tensor(t, &n, &off, "lnfb", -1, c->layers + 2, C);
    return n;
}

#define MAX_TENSORS (2 + 12 * 4 + 2) /* configs here have L <= 4 */

static float *falloc(size_t n)
{
    float *p = calloc(n ? n : 1, sizeof(float));
    cr_assert(p, "out of memory");
    return p;
}

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- layout and initialisation ------------------------------------------- */

Test(model, layout_matches_header)
{
    struct model *m = model_create(&tiny, 2, 8);
    cr_assert(m);
    const struct model_layout *lay = model_layout(m);
    struct tensor t[MAX_TENSORS];
    int nt = build_tensors(&tiny, t);
    cr_assert_eq(lay->nunits, tiny.layers + 3);
    cr_assert_eq(lay->total, t[nt - 1].off + t[nt - 1].len);
    for (int u = 0; u < lay->nunits; u++) {
        size_t lo = SIZE_MAX, hi = 0;
        for (int k = 0; k < nt; k++)
            if (t[k].unit == u) {
                lo = t[k].off < lo ? t[k].off : lo;
                hi = t[k].off + t[k].len > hi ? t[k].off + t[k].len : hi;
            }
        cr_assert(lay->unit_off[u] == lo && lay->unit_off[u + 1] == hi,
                  "unit %d is [%zu, %zu), want [%zu, %zu)", u, lay->unit_off[u],
                  lay->unit_off[u + 1], lo, hi);
    }
    cr_assert_eq(model_config(m)->channels, tiny.channels);
    cr_assert(model_activation_bytes(m) > 0);
    model_destroy(m);
}

Test(model, init_is_seeded_and_gpt2_shaped)
{
    struct model_config c = { 256, 32, 3, 64, 4 };
    struct model *m = model_create(&c, 1, 32);
    cr_assert(m);
    size_t P = model_layout(m)->total;
    float *a = falloc(P), *b = falloc(P), *d = falloc(P);
    model_init_params(m, a, 42);
    model_init_params(m, b, 42);
    model_init_params(m, d, 43);
    cr_assert(memcmp(a, b, P * sizeof(float)) == 0, "same seed, different parameters");
    cr_assert(memcmp(a, d, P * sizeof(float)) != 0, "the seed is ignored");

    struct tensor t[MAX_TENSORS];
    int nt = build_tensors(&c, t);
    double res_std = 0.02 / sqrt(2.0 * c.layers);
    for (int k = 0; k < nt; k++) {
        const char *nm = strchr(t[k].name, '.') ? strchr(t[k].name, '.') + 1 : t[k].name;
        size_t len = strlen(nm);
        int is_bias = nm[len - 1] == 'b' && strcmp(nm, "wte") != 0;
        int is_lnw = !strcmp(nm, "ln1w") || !strcmp(nm, "ln2w") || !strcmp(nm, "lnfw");
        double s = 0, s2 = 0;
        for (size_t i = 0; i < t[k].len; i++) {
            float v = a[t[k].off + i];
            if (is_lnw)
                cr_assert(v == 1.0f, "%s[%zu] = %g, want 1", t[k].name, i, v);
            else if (is_bias)
                cr_assert(v == 0.0f, "%s[%zu] = %g, want 0", t[k].name, i, v);
            s += v;
            s2 += (double)v * v;
        }
        if (is_lnw || is_bias)
            continue;
        double want = strstr(nm, "proj") ? res_std : 0.02;
        double mean = s / t[k].len, sd = sqrt(s2 / t[k].len - mean * mean);
        /* n >= 2048 samples: the sample sd is within 5% with overwhelming odds */
        cr_assert(fabs(sd / want - 1) < 0.05 && fabs(mean) < 0.1 * want,
                  "%s: mean %g sd %g, want 0 and %g", t[k].name, mean, sd, want);
    }
    free(a);
    free(b);
    free(d);
    model_destroy(m);
}

Test(model, init_values_are_pinned)
{
    /* The generator is part of the file format in effect: every rank, and
     * a rerun next year, must draw the same values from the same seed.  If
     * the initialisation changes on purpose, update these. */
    struct model *m = model_create(&tiny, 1, 8);
    cr_assert(m);
    float *p = falloc(model_layout(m)->total);
    model_init_params(m, p, 1);
    struct tensor t[MAX_TENSORS];
    build_tensors(&tiny, t);
    const struct {
        int tensor;
        size_t i;
        float want;
    } pin[] = {
        { 0, 0, 0x1.169b92p-10f },  { 0, 1, -0x1.38e976p-10f }, { 0, 2, -0x1.3370e8p-10f },
        { 0, 3, 0x1.a2fd2ap-6f },   { 1, 0, 0x1.3b4e3cp-8f },   /* wpe */
        { 6, 0, 0x1.f2a89ap-11f },  /* l0.attprojw */
    };
    for (size_t k = 0; k < sizeof pin / sizeof pin[0]; k++) {
        float got = p[t[pin[k].tensor].off + pin[k].i];
        cr_assert(fbits(got) == fbits(pin[k].want), "%s[%zu] = %a, pinned %a",
                  t[pin[k].tensor].name, pin[k].i, got, pin[k].want);
    }
    free(p);
    model_destroy(m);
}

/* ---- finite differences --------------------------------------------------- */

struct fd_ctx {
    struct model *m;
    float *params;
    const uint8_t *tok, *tgt;
    int B, T;
};

static double loss_at(struct fd_ctx *f)
{
    return model_forward(f->m, f->params, NULL, f->tok, f->tgt, f->B, f->T);
}

/*
 * Why these steps and tolerances.  The loss comes back as a float near 5.5
 * (half an ulp: 2.4e-7) and every activation carries float rounding, so a
 * central difference over a step h has an error of roughly 1e-6 / h from
 * noise, plus O(h^2) from truncation.
 *  - Directional check: the whole tensor moves along its own gradient, by a
 *    step sized so the loss changes by ~2e-3 (no element moved by more than
 *    0.05).  The error is then ~1e-4 relative (measured 0.7-1.7e-4 on every
 *    tensor); we allow 2e-3.  The deltas used are the ones float rounding
 *    actually produced, not the intended ones.
 *  - Element check: the 3 largest-gradient elements and 2 random ones, step
 *    h = 1e-2 (parameters are O(0.1)-O(1)); an element must agree within 1%
 *    of its value + 0.2% of the tensor's largest gradient (the worst
 *    element measured uses 12% of that).
 * Each of these, tried on a copy of kernels.c, fails the test: dropping
 * LayerNorm's mean(g) or xhat*mean(g xhat) term or its weight in dx, or
 * its dw; dropping softmax's sum(p dp) term, the attention scale, dv or dk;
 * GELU' with a x^2 for 3a x^2; the loss gradient scaled by 0.99; the bias
 * gradient scaled by 0.9; wpe missing all rows but b = 0.
 * MODEL_TEST_VERBOSE=1 prints every comparison.
 */
static void check_direction(struct fd_ctx *f, const struct tensor *t, const float *g,
                            float *scratch)
{
    float *p = f->params + t->off;
    double gn = 0, gmax = 0;
    for (size_t i = 0; i < t->len; i++) {
        gn += (double)g[i] * g[i];
        gmax = fmax(gmax, fabs(g[i]));
    }
    gn = sqrt(gn);
    cr_assert(gn > 0, "%s: gradient is all zero", t->name);
    double eps = 1e-3 / gn; /* step along g/|g| */
    if (eps * gmax / gn > 0.05)
        eps = 0.05 * gn / gmax;
    memcpy(scratch, p, t->len * sizeof(float));
    double pred = 0;
    for (size_t i = 0; i < t->len; i++)
        p[i] = (float)(scratch[i] + eps * g[i] / gn);
    double lp = loss_at(f);
    for (size_t i = 0; i < t->len; i++) {
        float plus = p[i];
        p[i] = (float)(scratch[i] - eps * g[i] / gn);
        pred += (double)g[i] * ((double)plus - p[i]);
    }
    double lm = loss_at(f);
    memcpy(p, scratch, t->len * sizeof(float));
    double meas = lp - lm;
    if (getenv("MODEL_TEST_VERBOSE"))
        fprintf(stderr, "%-12s dir: pred %.4e rel err %.2e\n", t->name, pred,
                fabs(meas - pred) / fabs(pred));
    cr_assert(fabs(meas - pred) <= 2e-3 * fabs(pred),
              "%s: along the gradient the loss changes by %.6g, the gradient predicts %.6g "
              "(rel err %.3g)",
              t->name, meas, pred, fabs(meas - pred) / fabs(pred));
}

static void check_element(struct fd_ctx *f, const struct tensor *t, const float *g, size_t i,
                          double gmax)
{
    float *p = f->params + t->off + i;
    float p0 = *p;
    const double h = 1e-2;
    *p = (float)(p0 + h);
    double up = (double)*p - p0;
    double lp = loss_at(f);
    *p = (float)(p0 - h);
    double dn = p0 - (double)*p;
    double lm = loss_at(f);
    *p = p0;
    double fd = (lp - lm) / (up + dn);
    double an = g[i];
    if (getenv("MODEL_TEST_VERBOSE"))
        fprintf(stderr, "%-12s [%4zu] an %+.4e fd %+.4e err/tol %.3f\n", t->name, i,
                an, fd, fabs(fd - an) / (0.01 * fabs(an) + 0.002 * gmax));
    cr_assert(fabs(fd - an) <= 0.01 * fabs(an) + 0.002 * gmax,
              "%s[%zu]: analytic %.6g, finite difference %.6g (tensor max |g| %.3g)", t->name, i,
              an, fd, gmax);
}

Test(model, gradients_match_finite_differences)
{
    int B = 2, T = 5;
    struct model *m = model_create(&tiny, B, T);
    cr_assert(m);
    size_t P = model_layout(m)->total;
    float *params = falloc(P), *grads = falloc(P), *scratch = falloc(P);
    model_init_params(m, params, 7);
    /* Move every parameter off its init value: LayerNorm weights of exactly
     * 1 and biases of 0 would hide a backward pass that forgets them, and
     * 0.02-sized weights leave the blocks nearly linear. */
    weft_test_rng_state = 0x1234567;
    struct tensor t[MAX_TENSORS];
    int nt = build_tensors(&tiny, t);
    for (int k = 0; k < nt; k++) {
        const char *nm = strchr(t[k].name, '.') ? strchr(t[k].name, '.') + 1 : t[k].name;
        double sd = strncmp(nm, "ln", 2) == 0 ? 0.3 : 0.1;
        for (size_t i = 0; i < t[k].len; i++)
            params[t[k].off + i] += (float)(sd * rnd_normal());
    }
    uint8_t tok[10], tgt[10];
    rnd_bytes(tok, sizeof tok, 256);
    rnd_bytes(tgt, sizeof tgt, 256);
    /* Repeat a token so wte rows gather from several positions. */
    tok[7] = tok[2];

    float loss = model_forward(m, params, NULL, tok, tgt, B, T);
    cr_assert(isfinite(loss));
    model_backward(m, params, grads, NULL);

    struct fd_ctx f = { m, params, tok, tgt, B, T };
    for (int k = 0; k < nt; k++) {
        const float *g = grads + t[k].off;
        if (!strcmp(t[k].name, "wpe")) {
            /* Rows >= T never reach the loss: exactly zero. */
            for (size_t i = (size_t)T * tiny.channels; i < t[k].len; i++)
                cr_assert(g[i] == 0.0f, "wpe[%zu] = %g past T", i, g[i]);
        }
        check_direction(&f, &t[k], g, scratch);
        double gmax = 0;
        size_t top[3] = { 0, 0, 0 };
        for (size_t i = 0; i < t[k].len; i++) {
            double a = fabs(g[i]);
            gmax = fmax(gmax, a);
            if (a > fabs(g[top[2]])) {
                top[2] = i;
                for (int j = 2; j > 0 && fabs(g[top[j]]) > fabs(g[top[j - 1]]); j--) {
                    size_t s = top[j];
                    top[j] = top[j - 1];
                    top[j - 1] = s;
                }
            }
        }
        for (int j = 0; j < 3; j++)
            check_element(&f, &t[k], g, top[j], gmax);
        for (int j = 0; j < 2; j++)
            check_element(&f, &t[k], g, weft_test_rnd() % t[k].len, gmax);
    }
    free(params);
    free(grads);
    free(scratch);
    model_destroy(m);
}

/* ---- hooks ---------------------------------------------------------------- */

enum { EV_P, EV_PD, EV_G, EV_GD };
static const char *const ev_name[] = { "params", "params_done", "grads", "grads_done" };

/* Records every hook call; returns the flat buffers' unit slices. */
struct rec {
    const struct model_layout *lay;
    const float *params;
    float *grads;
    int n;
    int ev[256], unit[256];
};

static void rec_add(struct rec *r, int ev, int u)
{
    cr_assert(r->n < 256, "too many hook calls");
    r->ev[r->n] = ev;
    r->unit[r->n++] = u;
}

static const float *rec_params(void *ctx, int u)
{
    struct rec *r = ctx;
    rec_add(r, EV_P, u);
    return r->params + r->lay->unit_off[u];
}

static void rec_params_done(void *ctx, int u)
{
    rec_add(ctx, EV_PD, u);
}

static float *rec_grads(void *ctx, int u)
{
    struct rec *r = ctx;
    rec_add(r, EV_G, u);
    return r->grads + r->lay->unit_off[u];
}

static void rec_grads_done(void *ctx, int u)
{
    rec_add(ctx, EV_GD, u);
}

/* Runs forward + backward into zeroed grads; returns the loss. */
static float step(struct model *m, const float *params, float *grads,
                  const struct model_hooks *h, const uint8_t *tok, const uint8_t *tgt, int B, int T)
{
    memset(grads, 0, model_layout(m)->total * sizeof(float));
    float loss = model_forward(m, params, h, tok, tgt, B, T);
    model_backward(m, params, grads, h);
    return loss;
}

/* A model of the tiny config with initialised parameters, two zeroed
 * gradient buffers and random tokens: the setup several tests share. */
struct case_ {
    struct model *m;
    const struct model_layout *lay;
    size_t P;
    int B, T;
    float *params, *g0, *g1;
    uint8_t tok[16], tgt[16];
};

static void case_make(struct case_ *c, int B, int T, uint64_t init_seed, uint64_t rng_seed)
{
    c->B = B;
    c->T = T;
    c->m = model_create(&tiny, B, T);
    cr_assert(c->m);
    c->lay = model_layout(c->m);
    c->P = c->lay->total;
    c->params = falloc(c->P);
    c->g0 = falloc(c->P);
    c->g1 = falloc(c->P);
    model_init_params(c->m, c->params, init_seed);
    weft_test_rng_state = rng_seed;
    rnd_bytes(c->tok, (size_t)B * T, 256);
    rnd_bytes(c->tgt, (size_t)B * T, 256);
}

static void case_free(struct case_ *c)
{
    free(c->params);
    free(c->g0);
    free(c->g1);
    model_destroy(c->m);
}

/* step() on the case's model and tokens. */
static float case_step(struct case_ *c, const float *params, float *grads,
                       const struct model_hooks *h)
{
    return step(c->m, params, grads, h, c->tok, c->tgt, c->B, c->T);
}

Test(model, hooks_flat_offsets_are_bitwise_equal_and_ordered)
{
    int L = tiny.layers;
    struct case_ c;
    case_make(&c, 2, 5, 3, 99);
    size_t bytes = c.P * sizeof(float);
    float l0 = case_step(&c, c.params, c.g0, NULL);

    struct rec r = { .lay = c.lay, .params = c.params, .grads = c.g1 };
    struct model_hooks h = { &r, rec_params, rec_params_done, rec_grads, rec_grads_done, NULL };
    /* The model must use the hooks' pointers, not the flat buffers: pass
     * none. */
    memset(c.g1, 0, bytes);
    float l1 = model_forward(c.m, NULL, &h, c.tok, c.tgt, c.B, c.T);
    model_backward(c.m, NULL, NULL, &h);
    cr_assert(fbits(l0) == fbits(l1), "loss %a with hooks, %a without", l1, l0);
    cr_assert(memcmp(c.g0, c.g1, bytes) == 0, "gradients differ with hooks");

    /* The documented sequence (model.c's header), for L = 2. */
    int WTE = 0, WPE = 1, LNF = L + 2, want_ev[64], want_u[64], n = 0;
#define W_(e, u) (want_ev[n] = (e), want_u[n++] = (u))
    W_(EV_P, WTE), W_(EV_P, WPE), W_(EV_PD, WPE), W_(EV_PD, WTE);
    for (int l = 0; l < L; l++)
        W_(EV_P, 2 + l), W_(EV_PD, 2 + l);
    W_(EV_P, LNF), W_(EV_P, WTE), W_(EV_PD, WTE), W_(EV_PD, LNF);
    W_(EV_P, LNF), W_(EV_P, WTE), W_(EV_G, LNF);
    W_(EV_PD, WTE), W_(EV_PD, LNF), W_(EV_GD, LNF);
    for (int l = L - 1; l >= 0; l--)
        W_(EV_P, 2 + l), W_(EV_G, 2 + l), W_(EV_PD, 2 + l), W_(EV_GD, 2 + l);
    W_(EV_G, WPE), W_(EV_GD, WPE), W_(EV_G, WTE), W_(EV_GD, WTE);
#undef W_
    for (int i = 0; i < n && i < r.n; i++)
        cr_assert(r.ev[i] == want_ev[i] && r.unit[i] == want_u[i],
                  "hook call %d: %s(%d), want %s(%d)", i, ev_name[r.ev[i]], r.unit[i],
                  ev_name[want_ev[i]], want_u[i]);
    cr_assert_eq(r.n, n, "%d hook calls, want %d", r.n, n);

    /* Hooks with NULL members fall back to the flat buffers per member. */
    struct model_hooks partial = { &r, rec_params, NULL, NULL, rec_grads_done, NULL };
    r.n = 0;
    float l2 = case_step(&c, c.params, c.g1, &partial);
    cr_assert(fbits(l0) == fbits(l2) && memcmp(c.g0, c.g1, bytes) == 0,
              "partial hooks change the result");
    case_free(&c);
}

/* ZeRO-like hooks: params(u) hands out a private copy that params_done
 * poisons with NaN; grads(u) hands out a zeroed private buffer that
 * grads_done adds into the flat gradients and poisons.  Any use of a
 * pointer outside its window shows up as NaN or lost gradient. */
struct gather {
    const struct model_layout *lay;
    const float *params;
    float *grads;
    float *pbuf[8], *gbuf[8];
    int pheld[8], gheld[8];
};

static const float *gather_params(void *ctx, int u)
{
    struct gather *g = ctx;
    size_t off = g->lay->unit_off[u], len = g->lay->unit_off[u + 1] - off;
    cr_assert(!g->pheld[u]++, "params(%d) while held", u);
    memcpy(g->pbuf[u], g->params + off, len * sizeof(float));
    return g->pbuf[u];
}

static void gather_params_done(void *ctx, int u)
{
    struct gather *g = ctx;
    size_t len = g->lay->unit_off[u + 1] - g->lay->unit_off[u];
    cr_assert(g->pheld[u]--, "params_done(%d) without params", u);
    for (size_t i = 0; i < len; i++)
        g->pbuf[u][i] = NAN;
}

static float *gather_grads(void *ctx, int u)
{
    struct gather *g = ctx;
    size_t len = g->lay->unit_off[u + 1] - g->lay->unit_off[u];
    cr_assert(!g->gheld[u]++, "grads(%d) while held", u);
    memset(g->gbuf[u], 0, len * sizeof(float));
    return g->gbuf[u];
}

static void gather_grads_done(void *ctx, int u)
{
    struct gather *g = ctx;
    size_t off = g->lay->unit_off[u], len = g->lay->unit_off[u + 1] - off;
    cr_assert(g->gheld[u]--, "grads_done(%d) without grads", u);
    for (size_t i = 0; i < len; i++) {
        g->grads[off + i] += g->gbuf[u][i];
        g->gbuf[u][i] = NAN;
    }
}

Test(model, hooks_with_private_buffers)
{
    struct case_ c;
    case_make(&c, 2, 5, 5, 7);
    const struct model_layout *lay = c.lay;
    float l0 = case_step(&c, c.params, c.g0, NULL);

    struct gather g = { .lay = lay, .params = c.params, .grads = c.g1 };
    cr_assert(lay->nunits <= 8);
    for (int u = 0; u < lay->nunits; u++) {
        g.pbuf[u] = falloc(lay->unit_off[u + 1] - lay->unit_off[u]);
        g.gbuf[u] = falloc(lay->unit_off[u + 1] - lay->unit_off[u]);
    }
    struct model_hooks h = { &g, gather_params, gather_params_done, gather_grads,
                             gather_grads_done, NULL };
    float l1 = case_step(&c, NULL, c.g1, &h);
    cr_assert(fbits(l0) == fbits(l1), "loss %a with private buffers, %a without", l1, l0);
    /* Each unit's gradient arrives as one private sum added to zero: the
     * same bits as accumulating straight into the flat buffer. */
    cr_assert(memcmp(c.g0, c.g1, c.P * sizeof(float)) == 0, "gradients differ");
    for (int u = 0; u < lay->nunits; u++) {
        cr_assert(!g.pheld[u] && !g.gheld[u], "unit %d still held", u);
        free(g.pbuf[u]);
        free(g.gbuf[u]);
    }
    case_free(&c);
}

/* ---- accumulation, loss, shapes -------------------------------------------- */

Test(model, gradients_accumulate)
{
    struct case_ c;
    case_make(&c, 2, 8, 11, 12);
    size_t P = c.P;
    float *g1 = c.g0, *g2 = c.g1;
    case_step(&c, c.params, g1, NULL);
    case_step(&c, c.params, g2, NULL);
    model_forward(c.m, c.params, NULL, c.tok, c.tgt, c.B, c.T);
    model_backward(c.m, c.params, g2, NULL);
    /* Every kernel sums a pass's contribution on its own and adds it to the
     * caller's buffer once, so the second pass adds exactly the first's
     * value: x + x = 2x has no rounding.  Asserted bitwise. */
    size_t nonzero = 0;
    for (size_t i = 0; i < P; i++) {
        cr_assert(fbits(g2[i]) == fbits(2.0f * g1[i]), "grad[%zu]: two passes %a, one pass %a",
                  i, g2[i], g1[i]);
        nonzero += g1[i] != 0.0f;
    }
    cr_assert(nonzero > P / 2, "only %zu of %zu gradients are nonzero", nonzero, P);
    case_free(&c);
}

Test(model, initial_loss_is_uniform)
{
    /* Small init weights give near-uniform logits: loss ~ ln V. */
    struct model_config cs[] = { tiny, { 256, 64, 4, 64, 4 } };
    for (size_t c = 0; c < 2; c++) {
        int B = 4, T = cs[c].max_t;
        struct model *m = model_create(&cs[c], B, T);
        cr_assert(m);
        float *params = falloc(model_layout(m)->total);
        model_init_params(m, params, 1);
        uint8_t *tok = malloc((size_t)B * T), *tgt = malloc((size_t)B * T);
        weft_test_rng_state = 0xabc + c;
        rnd_bytes(tok, (size_t)B * T, 256);
        rnd_bytes(tgt, (size_t)B * T, 256);
        float loss = model_forward(m, params, NULL, tok, tgt, B, T);
        cr_assert(fabs(loss - log(256.0)) < 0.1, "config %zu: loss %g, want ~%g", c, loss,
                  log(256.0));
        free(tok);
        free(tgt);
        free(params);
        model_destroy(m);
    }
}

Test(model, smaller_batches_than_allocated)
{
    int B = 2, T = 5;
    struct model *big = model_create(&tiny, 4, 8), *exact = model_create(&tiny, B, T);
    cr_assert(big && exact);
    size_t P = model_layout(big)->total;
    float *params = falloc(P), *g0 = falloc(P), *g1 = falloc(P);
    model_init_params(big, params, 21);
    uint8_t tok[32], tgt[32];
    weft_test_rng_state = 22;
    rnd_bytes(tok, 32, 256);
    rnd_bytes(tgt, 32, 256);

    /* A full-size pass first, so stale activations would show. */
    step(big, params, g0, NULL, tok, tgt, 4, 8);
    float lb = step(big, params, g0, NULL, tok, tgt, B, T);
    float le = step(exact, params, g1, NULL, tok, tgt, B, T);
    /* Same rows, same order of operations: the same bits. */
    cr_assert(fbits(lb) == fbits(le), "loss %a in the big model, %a in the exact one", lb, le);
    cr_assert(memcmp(g0, g1, P * sizeof(float)) == 0, "gradients differ");
    const float *zb = model_last_logits(big, T), *ze = model_last_logits(exact, T);
    cr_assert(zb && ze && memcmp(zb, ze, 256 * sizeof(float)) == 0, "last logits differ");
    cr_assert_null(model_last_logits(big, T + 1), "logits past the forward's T");
    cr_assert_null(model_last_logits(big, 0));

    /* Causal: position t's logits do not depend on later tokens, so a
     * shorter forward gives (up to rounding) the same logits at t. */
    float copy[256];
    memcpy(copy, model_last_logits(big, 3), sizeof copy);
    model_forward(exact, params, NULL, tok, tgt, 1, 3);
    const float *z3 = model_last_logits(exact, 3);
    for (int v = 0; v < 256; v++)
        cr_assert(fabsf(z3[v] - copy[v]) <= 1e-5f * (1 + fabsf(copy[v])),
                  "logit %d at t=2: %g vs %g", v, z3[v], copy[v]);

    /* B = 1, T = 1: the loss is exactly the cross-entropy of the logits. */
    float l11 = model_forward(big, params, NULL, tok, tgt, 1, 1);
    const float *z = model_last_logits(big, 1);
    double mx = z[0], s = 0;
    for (int v = 1; v < 256; v++)
        mx = fmax(mx, z[v]);
    for (int v = 0; v < 256; v++)
        s += exp(z[v] - mx);
    double want = mx + log(s) - z[tgt[0]];
    cr_assert(fabs(l11 - want) < 1e-5, "B=T=1 loss %g, from the logits %g", l11, want);
    free(params);
    free(g0);
    free(g1);
    model_destroy(big);
    model_destroy(exact);
}

Test(model, rejects_bad_configs_and_calls)
{
    struct model_config bad[] = {
        { 256, 8, 2, 15, 2 },  /* C not a multiple of heads */
        { 0, 8, 2, 16, 2 },    { 257, 8, 2, 16, 2 }, { 256, 0, 2, 16, 2 },
        { 256, 8, 0, 16, 2 },  { 256, 8, 2, 0, 2 },  { 256, 8, 2, 16, 0 },
        { 256, -8, 2, 16, 2 }, { 256, 8, -2, 16, 2 }, { 256, 8, 2, -16, -2 },
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_null(model_create(&bad[i], 1, 1), "bad config %zu accepted", i);
    cr_assert_null(model_create(NULL, 1, 8));
    cr_assert_null(model_create(&tiny, 0, 8), "max_b 0");
    cr_assert_null(model_create(&tiny, 1, 0), "max_t 0");
    cr_assert_null(model_create(&tiny, -1, 8), "max_b < 0");
    cr_assert_null(model_create(&tiny, 1, 9), "max_t above cfg.max_t");
    cr_assert_null(model_create(&(struct model_config){ 256, 1 << 20, 1 << 12, 1 << 16, 1 },
                                1 << 30, 1 << 20),
                   "absurd sizes");
    model_destroy(NULL);

    /* Calls outside the contract do nothing and say so. */
    struct model *m = model_create(&tiny, 2, 4);
    cr_assert(m);
    size_t P = model_layout(m)->total;
    float *params = falloc(P), *grads = falloc(P);
    model_init_params(m, params, 1);
    uint8_t tok[8] = { 0 }, tgt[8] = { 0 };
    model_backward(m, params, grads, NULL); /* no forward yet */
    for (size_t i = 0; i < P; i++)
        cr_assert(grads[i] == 0.0f);
    cr_assert(isnan(model_forward(m, params, NULL, tok, tgt, 3, 4)), "B > max_b");
    cr_assert(isnan(model_forward(m, params, NULL, tok, tgt, 2, 5)), "T > max_t");
    cr_assert(isnan(model_forward(m, params, NULL, tok, tgt, 0, 4)), "B = 0");
    cr_assert(isnan(model_forward(m, NULL, NULL, tok, tgt, 2, 4)), "no params");
    cr_assert_null(model_last_logits(m, 1), "logits after a failed forward");
    free(params);
    free(grads);
    model_destroy(m);
}
