/*
 * model.c - the GPT-2-shaped model of model.h: parameter layout, seeded
 * initialisation, and the staged forward and backward passes with their
 * hook calls.  The arithmetic lives in kernels.c.
 *
 * Hook sequence (u = unit; "p" params, "pd" params_done, "g" grads,
 * "gd" grads_done; EMB = 0, LAYER l = 1 + l, LNF = L + 1):
 *   forward:  p(EMB) pd(EMB)
 *             for l = 0..L-1: p(1+l) pd(1+l)
 *             p(LNF) p(EMB) pd(EMB) pd(LNF)
 *   backward: p(LNF) p(EMB) g(LNF) g(EMB) pd(EMB) pd(LNF) gd(LNF)
 *             for l = L-1..0: p(1+l) g(1+l) pd(1+l) gd(1+l)
 *             gd(EMB)
 * The embedding backward reads no parameters, so it asks for none.  The
 * pointer from g(EMB) is held from the head to gd(EMB).
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

enum { UNIT_EMB = 0 };

/* Offsets (floats) of a LAYER unit's tensors from the start of the unit,
 * in model.h's order; fixed at model_create, shared by params and grads. */
struct layer_off {
    size_t ln1w, ln1b, qkvw, qkvb, attprojw, attprojb;
    size_t ln2w, ln2b, fcw, fcb, fcprojw, fcprojb;
    size_t size;
};

/* One layer's saved activations, pointers into model.acts (a view built
 * on demand by layer_acts).  N = B*T rows. */
struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (N, C), (N), (N) */
    float *qkv;                       /* (N, 3C) */
    float *atty;                      /* (N, C) attention output, pre-projection */
    float *att;                       /* (B, NH, T, T) probabilities */
    float *res2;                      /* (N, C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (N, C), (N), (N) */
    float *fch;                       /* (N, 4C) fc output, then GELU' of it */
    float *fch_gelu;                  /* (N, 4C) */
    float *res3;                      /* (N, C) block output */
};

/* The per-layer activation tensors, in the order they are carved from acts. */
enum { ACT_LN1, ACT_LN1_MEAN, ACT_LN1_RSTD, ACT_QKV, ACT_ATTY, ACT_ATT, ACT_RES2, ACT_LN2,
       ACT_LN2_MEAN, ACT_LN2_RSTD, ACT_FCH, ACT_FCH_GELU, ACT_RES3, ACT_NUM };

/*
 * Owner: the trainer (model_create / model_destroy).  Invariants:
 *  - layout.unit_off[] is fixed at create; units are EMB, LAYER 0..L-1, LNF.
 *  - acts and scratch are sized for (max_b, max_t) and never reallocated;
 *    per-layer tensors sit at act_off[k] + l * act_len[k] in acts and are
 *    packed for the current (B, T) within that room.
 *  - B > 0 exactly when the activations, tokens and targets are those of a
 *    complete forward pass of shape (B, T); model_backward needs that.
 *  - No parameter, gradient or optimizer memory is owned here.
 */
struct model {
    struct model_config cfg;
    struct model_layout layout;
    struct layer_off lo;
    size_t wpe_off; /* floats from the start of EMB */
    int max_b, max_t;
    int B, T; /* shape of the last forward; B == 0: none */

    uint8_t *tokens, *targets; /* (max_b * max_t) copies from the forward */

    float *acts;                    /* one block for everything below */
    size_t act_off[ACT_NUM];        /* floats: start of layer 0's tensor */
    size_t act_len[ACT_NUM];        /* floats per layer */
    float *encoded;                 /* (N, C) */
    float *lnf, *lnf_mean, *lnf_rstd; /* (N, C), (N), (N) */
    float *logits;                  /* (N, V) raw logits, kept for model_last_logits */
    float *lse;                     /* (N) log-sum-exp of each logits row */
    /* Backward scratch, overwritten by every pass. */
    float *dres;    /* (N, C) gradient of the residual stream */
    float *dtmp;    /* (N, C) */
    float *dbig;    /* (N, 4C): d fch, then d qkv */
    float *dlogits; /* (N, V) */
    float *dwte;    /* (V, C) the pass's wte gradient, added to grads once */
    float *wt;      /* max(4C*C, V*C): transposed weight for the forward matmul */
    size_t acts_floats;

    double *dscratch; /* max(4C, V, max_t) doubles for kernel reductions */
    size_t dscratch_len;
};

/* ---- size arithmetic ------------------------------------------------------ */

/* a*b and a+b; on overflow they set *bad. */
static size_t mul(size_t a, size_t b, int *bad)
{
    size_t r;
    if (__builtin_mul_overflow(a, b, &r))
        *bad = 1;
    return r;
}

static size_t add(size_t a, size_t b, int *bad)
{
    size_t r;
    if (__builtin_add_overflow(a, b, &r))
        *bad = 1;
    return r;
}

static size_t max_sz(size_t a, size_t b)
{
    return a > b ? a : b;
}

/* ---- create / destroy ----------------------------------------------------- */

static int check_config(const struct model_config *cfg, int max_b, int max_t)
{
    const char *why = NULL;
    if (!cfg)
        why = "no config";
    else if (cfg->vocab < 1 || cfg->vocab > MODEL_VOCAB)
        why = "vocab must be in 1..256 (tokens are bytes)";
    else if (cfg->max_t < 1 || cfg->layers < 1 || cfg->channels < 1 || cfg->heads < 1)
        why = "max_t, layers, channels and heads must be positive";
    else if (cfg->channels % cfg->heads)
        why = "channels must be a multiple of heads";
    else if (cfg->channels > (1 << 16) || cfg->layers > (1 << 12) || cfg->max_t > (1 << 20))
        why = "config too large";
    else if (max_b < 1 || max_t < 1)
        why = "max_b and max_t must be positive";
    else if (max_t > cfg->max_t)
        why = "max_t exceeds the config's max_t";
    if (why) {
        fprintf(stderr, "model_create: %s\n", why);
        return -1;
    }
    return 0;
}

struct model *model_create(const struct model_config *cfg, int max_b, int max_t)
{
    if (check_config(cfg, max_b, max_t))
        return NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        goto fail_nomem;
    m->cfg = *cfg;
    m->max_b = max_b;
    m->max_t = max_t;

    int bad = 0;
    size_t V = (size_t)cfg->vocab, C = (size_t)cfg->channels, L = (size_t)cfg->layers;
    size_t NH = (size_t)cfg->heads, MT = (size_t)cfg->max_t;

    /* Parameter layout (model.h). */
    struct layer_off *lo = &m->lo;
    size_t o = 0;
    lo->ln1w = o, o += C;
    lo->ln1b = o, o += C;
    lo->qkvw = o, o += 3 * C * C;
    lo->qkvb = o, o += 3 * C;
    lo->attprojw = o, o += C * C;
    lo->attprojb = o, o += C;
    lo->ln2w = o, o += C;
    lo->ln2b = o, o += C;
    lo->fcw = o, o += 4 * C * C;
    lo->fcb = o, o += 4 * C;
    lo->fcprojw = o, o += 4 * C * C;
    lo->fcprojb = o, o += C;
    lo->size = o;
    m->wpe_off = V * C;

    m->layout.nunits = (int)L + 2;
    m->layout.unit_off = malloc(sizeof(size_t) * (L + 3));
    if (!m->layout.unit_off)
        goto fail_nomem;
    size_t *uo = m->layout.unit_off;
    uo[0] = 0;
    uo[1] = mul(V + MT, C, &bad);
    for (size_t l = 0; l < L; l++)
        uo[2 + l] = add(uo[1 + l], lo->size, &bad);
    uo[L + 2] = add(uo[L + 1], 2 * C, &bad);
    m->layout.total = uo[L + 2];

    /* Activations: per-layer tensors (rows of N = max_b * max_t), then the
     * rest.  The attention probabilities take NH * T floats per row. */
    size_t N = mul((size_t)max_b, (size_t)max_t, &bad);
    size_t NC = mul(N, C, &bad);
    size_t per_row[ACT_NUM] = {
        [ACT_LN1] = C,      [ACT_LN1_MEAN] = 1, [ACT_LN1_RSTD] = 1, [ACT_QKV] = 3 * C,
        [ACT_ATTY] = C,     [ACT_ATT] = 0,      [ACT_RES2] = C,     [ACT_LN2] = C,
        [ACT_LN2_MEAN] = 1, [ACT_LN2_RSTD] = 1, [ACT_FCH] = 4 * C,  [ACT_FCH_GELU] = 4 * C,
        [ACT_RES3] = C,
    };
    size_t total = 0;
    for (int k = 0; k < ACT_NUM; k++) {
        m->act_len[k] = k == ACT_ATT ? mul(mul(N, NH, &bad), (size_t)max_t, &bad)
                                     : mul(N, per_row[k], &bad);
        m->act_off[k] = total;
        total = add(total, mul(m->act_len[k], L, &bad), &bad);
    }
    /* The remaining buffers, in carving order. */
    size_t rest[] = {
        NC,                                   /* encoded */
        NC, N, N,                             /* lnf, lnf_mean, lnf_rstd */
        mul(N, V, &bad), N,                   /* logits, lse */
        NC, NC, mul(NC, 4, &bad),             /* dres, dtmp, dbig */
        mul(N, V, &bad), V * C,               /* dlogits, dwte */
        max_sz(4 * C * C, V * C),             /* wt */
    };
    size_t rest_start = total;
    for (size_t k = 0; k < sizeof rest / sizeof rest[0]; k++)
        total = add(total, rest[k], &bad);
    if (bad || total > SIZE_MAX / sizeof(float)) {
        fprintf(stderr, "model_create: sizes overflow\n");
        goto fail;
    }
    m->acts_floats = total;
    m->acts = malloc(total * sizeof(float));
    m->dscratch_len = max_sz(max_sz(4 * C, V), (size_t)max_t);
    m->dscratch = malloc(m->dscratch_len * sizeof(double));
    m->tokens = malloc(N);
    m->targets = malloc(N);
    if (!m->acts || !m->dscratch || !m->tokens || !m->targets)
        goto fail_nomem;
    float *p = m->acts + rest_start;
    float **dst[] = { &m->encoded, &m->lnf,  &m->lnf_mean, &m->lnf_rstd, &m->logits, &m->lse,
                      &m->dres,    &m->dtmp, &m->dbig,     &m->dlogits,  &m->dwte,   &m->wt };
    for (size_t k = 0; k < sizeof rest / sizeof rest[0]; k++) {
        *dst[k] = p;
        p += rest[k];
    }
    return m;

fail_nomem:
    fprintf(stderr, "model_create: out of memory\n");
fail:
    model_destroy(m);
    return NULL;
}

void model_destroy(struct model *m)
{
    if (!m)
        return;
    free(m->targets);
    free(m->tokens);
    free(m->dscratch);
    free(m->acts);
    free(m->layout.unit_off);
    free(m);
}

const struct model_layout *model_layout(const struct model *m)
{
    return &m->layout;
}

const struct model_config *model_config(const struct model *m)
{
    return &m->cfg;
}

size_t model_activation_bytes(const struct model *m)
{
    return m->acts_floats * sizeof(float) + m->dscratch_len * sizeof(double) +
           2 * (size_t)m->max_b * m->max_t;
}

/* ---- initialisation ------------------------------------------------------- */

/* splitmix64: a full-period generator and a good mixer, so each tensor gets
 * its own stream from (seed, tensor index) and a tensor's values do not
 * depend on the sizes of the tensors before it. */
static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Box-Muller in double, rounded once to float.  Only products of libm
 * results (no sums, so no FMA contraction can change them): machines whose
 * libm agrees on log/cos give bit-identical parameters, and a last-bit
 * difference in double only shows in float about once in 2^29 values. */
static void fill_normal(float *x, size_t n, double std, uint64_t seed, uint64_t tensor)
{
    uint64_t s = seed;
    uint64_t t = tensor + 1;
    s ^= splitmix64(&t);
    for (size_t i = 0; i < n; i++) {
        double u1 = (double)((splitmix64(&s) >> 11) + 1) * 0x1p-53; /* (0, 1] */
        double u2 = (double)(splitmix64(&s) >> 11) * 0x1p-53;       /* [0, 1) */
        x[i] = (float)(std * (sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2)));
    }
}

static void fill_const(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

void model_init_params(const struct model *m, float *params, uint64_t seed)
{
    size_t V = (size_t)m->cfg.vocab, C = (size_t)m->cfg.channels, L = (size_t)m->cfg.layers;
    size_t MT = (size_t)m->cfg.max_t;
    const struct layer_off *lo = &m->lo;
    double std = 0.02, std_res = 0.02 / sqrt(2.0 * (double)L);
    uint64_t tensor = 0;

    fill_normal(params, V * C, std, seed, tensor++);
    fill_normal(params + m->wpe_off, MT * C, std, seed, tensor++);
    for (size_t l = 0; l < L; l++) {
        float *u = params + m->layout.unit_off[1 + l];
        fill_const(u + lo->ln1w, C, 1.0f);
        fill_const(u + lo->ln1b, C, 0.0f);
        fill_normal(u + lo->qkvw, 3 * C * C, std, seed, tensor++);
        fill_const(u + lo->qkvb, 3 * C, 0.0f);
        fill_normal(u + lo->attprojw, C * C, std_res, seed, tensor++);
        fill_const(u + lo->attprojb, C, 0.0f);
        fill_const(u + lo->ln2w, C, 1.0f);
        fill_const(u + lo->ln2b, C, 0.0f);
        fill_normal(u + lo->fcw, 4 * C * C, std, seed, tensor++);
        fill_const(u + lo->fcb, 4 * C, 0.0f);
        fill_normal(u + lo->fcprojw, 4 * C * C, std_res, seed, tensor++);
        fill_const(u + lo->fcprojb, C, 0.0f);
    }
    float *f = params + m->layout.unit_off[L + 1];
    fill_const(f, C, 1.0f);
    fill_const(f + C, C, 0.0f);
}

/* ---- hooks ---------------------------------------------------------------- */

static const float *get_params(const struct model *m, const float *flat,
                               const struct model_hooks *h, int u)
{
    if (h && h->params)
        return h->params(h->ctx, u);
    return flat + m->layout.unit_off[u];
}

static void put_params(const struct model_hooks *h, int u)
{
    if (h && h->params_done)
        h->params_done(h->ctx, u);
}

static float *get_grads(const struct model *m, float *flat, const struct model_hooks *h, int u)
{
    if (h && h->grads)
        return h->grads(h->ctx, u);
    return flat + m->layout.unit_off[u];
}

static void put_grads(const struct model_hooks *h, int u)
{
    if (h && h->grads_done)
        h->grads_done(h->ctx, u);
}

/* ---- forward -------------------------------------------------------------- */

static void layer_acts(const struct model *m, int l, struct layer_acts *a)
{
    float **f[ACT_NUM] = {
        [ACT_LN1] = &a->ln1,           [ACT_LN1_MEAN] = &a->ln1_mean, [ACT_LN1_RSTD] = &a->ln1_rstd,
        [ACT_QKV] = &a->qkv,           [ACT_ATTY] = &a->atty,         [ACT_ATT] = &a->att,
        [ACT_RES2] = &a->res2,         [ACT_LN2] = &a->ln2,           [ACT_LN2_MEAN] = &a->ln2_mean,
        [ACT_LN2_RSTD] = &a->ln2_rstd, [ACT_FCH] = &a->fch,           [ACT_FCH_GELU] = &a->fch_gelu,
        [ACT_RES3] = &a->res3,
    };
    for (int k = 0; k < ACT_NUM; k++)
        *f[k] = m->acts + m->act_off[k] + (size_t)l * m->act_len[k];
}

/* The block input of layer l: the embedding or the previous block's output. */
static const float *layer_input(const struct model *m, int l)
{
    if (l == 0)
        return m->encoded;
    struct layer_acts prev;
    layer_acts(m, l - 1, &prev);
    return prev.res3;
}

static void block_forward(struct model *m, int l, const float *p, int B, int T)
{
    const struct layer_off *lo = &m->lo;
    int C = m->cfg.channels;
    size_t N = (size_t)B * T;
    struct layer_acts a;
    layer_acts(m, l, &a);
    const float *x = layer_input(m, l);

    kern_layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p + lo->ln1w, p + lo->ln1b, N, C);
    kern_matmul_forward(a.qkv, a.ln1, p + lo->qkvw, p + lo->qkvb, m->wt, N, C, 3 * C);
    kern_attention_forward(a.atty, a.att, a.qkv, B, T, C, m->cfg.heads);
    kern_matmul_forward(a.res2, a.atty, p + lo->attprojw, p + lo->attprojb, m->wt, N, C, C);
    kern_add(a.res2, a.res2, x, N * C);
    kern_layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p + lo->ln2w, p + lo->ln2b,
                           N, C);
    kern_matmul_forward(a.fch, a.ln2, p + lo->fcw, p + lo->fcb, m->wt, N, C, 4 * C);
    kern_gelu_forward(a.fch_gelu, a.fch, a.fch, N * 4 * C);
    kern_matmul_forward(a.res3, a.fch_gelu, p + lo->fcprojw, p + lo->fcprojb, m->wt, N, 4 * C,
                        C);
    kern_add(a.res3, a.res3, a.res2, N * C);
}

float model_forward(struct model *m, const float *params, const struct model_hooks *hooks,
                    const uint8_t *tokens, const uint8_t *targets, int B, int T)
{
    if (!m)
        return NAN;
    m->B = 0; /* no valid activations until this pass completes */
    const char *why = NULL;
    if (!tokens || !targets)
        why = "no tokens or targets";
    else if (B < 1 || B > m->max_b || T < 1 || T > m->max_t)
        why = "B or T out of range";
    else if (!params && !(hooks && hooks->params))
        why = "no parameters";
    size_t N = why ? 0 : (size_t)B * T;
    for (size_t n = 0; n < N && !why; n++)
        if (tokens[n] >= m->cfg.vocab || targets[n] >= m->cfg.vocab)
            why = "token or target outside the vocabulary";
    if (why) {
        fprintf(stderr, "model_forward: %s\n", why);
        return NAN;
    }
    int C = m->cfg.channels, V = m->cfg.vocab, L = m->cfg.layers;
    int LNF = L + 1;
    memcpy(m->tokens, tokens, N);
    memcpy(m->targets, targets, N);

    const float *emb = get_params(m, params, hooks, UNIT_EMB);
    kern_encoder_forward(m->encoded, tokens, emb, emb + m->wpe_off, B, T, C);
    put_params(hooks, UNIT_EMB);

    for (int l = 0; l < L; l++) {
        const float *p = get_params(m, params, hooks, 1 + l);
        block_forward(m, l, p, B, T);
        put_params(hooks, 1 + l);
    }

    const float *lnf = get_params(m, params, hooks, LNF);
    emb = get_params(m, params, hooks, UNIT_EMB);
    kern_layernorm_forward(m->lnf, m->lnf_mean, m->lnf_rstd, layer_input(m, L), lnf, lnf + C, N,
                           C);
    kern_matmul_forward(m->logits, m->lnf, emb, NULL, m->wt, N, C, V); /* tied: W = wte */
    double loss = kern_crossentropy_forward(m->lse, m->logits, targets, N, V) / (double)N;
    put_params(hooks, UNIT_EMB);
    put_params(hooks, LNF);

    m->B = B;
    m->T = T;
    return (float)loss;
}

/* ---- backward ------------------------------------------------------------- */

/* On entry m->dres is d(block l output); on return d(block l input). */
static void block_backward(struct model *m, int l, const float *p, float *g)
{
    const struct layer_off *lo = &m->lo;
    int C = m->cfg.channels, B = m->B, T = m->T;
    size_t N = (size_t)B * T;
    double *ds = m->dscratch;
    struct layer_acts a;
    layer_acts(m, l, &a);
    const float *x = layer_input(m, l);

    /* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    kern_matmul_backward(m->dbig, g + lo->fcprojw, g + lo->fcprojb, m->dres, a.fch_gelu,
                         p + lo->fcprojw, ds, N, 4 * C, C);
    kern_gelu_backward(m->dbig, a.fch, N * 4 * C);
    kern_matmul_backward(m->dtmp, g + lo->fcw, g + lo->fcb, m->dbig, a.ln2, p + lo->fcw, ds, N,
                         C, 4 * C);
    kern_layernorm_backward(m->dres, g + lo->ln2w, g + lo->ln2b, m->dtmp, a.res2, p + lo->ln2w,
                            a.ln2_mean, a.ln2_rstd, ds, N, C);
    /* res2 = x + attproj(attention(qkv(ln1(x)))) */
    kern_matmul_backward(m->dtmp, g + lo->attprojw, g + lo->attprojb, m->dres, a.atty,
                         p + lo->attprojw, ds, N, C, C);
    kern_attention_backward(m->dbig, m->dtmp, a.qkv, a.att, ds, B, T, C, m->cfg.heads);
    kern_matmul_backward(m->dtmp, g + lo->qkvw, g + lo->qkvb, m->dbig, a.ln1, p + lo->qkvw, ds,
                         N, C, 3 * C);
    kern_layernorm_backward(m->dres, g + lo->ln1w, g + lo->ln1b, m->dtmp, x, p + lo->ln1w,
                            a.ln1_mean, a.ln1_rstd, ds, N, C);
}

void model_backward(struct model *m, const float *params, float *grads,
                    const struct model_hooks *hooks)
{
    if (!m)
        return;
    const char *why = NULL;
    if (m->B == 0)
        why = "no forward pass to differentiate";
    else if (!params && !(hooks && hooks->params))
        why = "no parameters";
    else if (!grads && !(hooks && hooks->grads))
        why = "no gradient buffer";
    if (why) {
        fprintf(stderr, "model_backward: %s\n", why);
        return;
    }
    int C = m->cfg.channels, V = m->cfg.vocab, L = m->cfg.layers;
    int LNF = L + 1, B = m->B, T = m->T;
    size_t N = (size_t)B * T;

    /* Head: loss <- logits = lnf · wte^T <- lnf = LN(x_L).  The wte
     * gradient of the whole pass (head and embedding) is summed in m->dwte
     * and added to the caller's buffer once, so that accumulating two
     * identical passes gives exactly twice one pass. */
    const float *lnf = get_params(m, params, hooks, LNF);
    const float *emb = get_params(m, params, hooks, UNIT_EMB);
    float *glnf = get_grads(m, grads, hooks, LNF);
    float *gemb = get_grads(m, grads, hooks, UNIT_EMB);
    kern_crossentropy_backward(m->dlogits, m->logits, m->lse, m->targets, N, V,
                               (float)(1.0 / (double)N));
    memset(m->dwte, 0, sizeof(float) * (size_t)V * C);
    kern_matmul_backward(m->dtmp, m->dwte, NULL, m->dlogits, m->lnf, emb, m->dscratch, N, C, V);
    memset(m->dres, 0, sizeof(float) * N * C);
    kern_layernorm_backward(m->dres, glnf, glnf + C, m->dtmp, layer_input(m, L), lnf,
                            m->lnf_mean, m->lnf_rstd, m->dscratch, N, C);
    put_params(hooks, UNIT_EMB);
    put_params(hooks, LNF);
    put_grads(hooks, LNF);

    for (int l = L - 1; l >= 0; l--) {
        const float *p = get_params(m, params, hooks, 1 + l);
        float *g = get_grads(m, grads, hooks, 1 + l);
        block_backward(m, l, p, g);
        put_params(hooks, 1 + l);
        put_grads(hooks, 1 + l);
    }

    kern_encoder_backward(m->dwte, gemb + m->wpe_off, m->dres, m->tokens, m->dscratch, B, T, C);
    kern_add(gemb, gemb, m->dwte, (size_t)V * C);
    put_grads(hooks, UNIT_EMB);
}

const float *model_last_logits(const struct model *m, int T)
{
    if (!m || m->B == 0 || T < 1 || T > m->T)
        return NULL;
    return m->logits + (size_t)(T - 1) * m->cfg.vocab; /* row 0 comes first */
}
