/*
 * model.c - the GPT-2-shaped model of model.h: parameter layouts (whole and
 * per part), seeded initialisation, and the staged forward and backward
 * passes with their hook calls and canonical-order sums.  The arithmetic
 * lives in kernels.c.
 *
 * Hook sequence of a whole model (u = local unit; "p" params, "pd"
 * params_done, "g" grads, "gd" grads_done; WTE = 0, WPE = 1, LAYER l =
 * 2 + l, LNF = L + 2):
 *   forward:  p(WTE) p(WPE) pd(WPE) pd(WTE)
 *             for l = 0..L-1: p(2+l) pd(2+l)
 *             p(LNF) p(WTE) pd(WTE) pd(LNF)
 *   backward: p(LNF) p(WTE) g(LNF) pd(WTE) pd(LNF) gd(LNF)
 *             for l = L-1..0: p(2+l) g(2+l) pd(2+l) gd(2+l)
 *             g(WPE) gd(WPE) g(WTE) gd(WTE)
 * A part makes the calls of the units it has, in the same order; on a last
 * stage that is not first, "WTE" is its copy (the last local unit), which
 * gets no grads calls.  The embedding backward reads no parameters.
 */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "tacc.h"

/* How a tensor is cut across tensor-parallel ranks. */
enum cut { CUT_NONE, CUT_ROWS, CUT_ROWS3, CUT_COLS };

/* A tensor of the whole model and its cut: (rows, cols) floats at off in
 * the global unit; a part holds rows/tp (CUT_ROWS), three blocks of
 * rows/3/tp (CUT_ROWS3) or cols/tp of every row (CUT_COLS). */
struct tdesc {
    size_t off, rows, cols;
    enum cut cut;
};

enum { T_LN1W, T_LN1B, T_QKVW, T_QKVB, T_APW, T_APB, T_LN2W, T_LN2B, T_FCW, T_FCB, T_FPW,
       T_FPB, T_NLAYER };

/* Offsets (floats) of a LAYER unit's tensors from the start of the unit. */
struct layer_off {
    size_t t[T_NLAYER];
    size_t size;
};

/* One layer's saved activations in a slot.  N = B*T rows; Cl = C/tp. */
struct layer_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* (N, C), (N), (N) */
    float *qkv;                       /* (N, 3Cl) */
    float *atty;                      /* (N, Cl) attention output, pre-projection */
    float *att;                       /* (B, NHl, T, T) probabilities */
    float *res2;                      /* (N, C) residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* (N, C), (N), (N) */
    float *fch;                       /* (N, 4Cl) fc output, then GELU' of it */
    float *fch_gelu;                  /* (N, 4Cl) */
    float *res3;                      /* (N, C) block output */
};

enum { ACT_LN1, ACT_LN1_MEAN, ACT_LN1_RSTD, ACT_QKV, ACT_ATTY, ACT_ATT, ACT_RES2, ACT_LN2,
       ACT_LN2_MEAN, ACT_LN2_RSTD, ACT_FCH, ACT_FCH_GELU, ACT_RES3, ACT_NUM };

/* A slot: one micro-batch's activations and data. */
struct slot {
    float *acts;              /* per-layer tensors, then x0 and the head's */
    float *x0;                /* (N, C) stage input: embedding or received */
    float *lnf, *lnf_mean, *lnf_rstd, *logits, *lse; /* last stage */
    uint8_t *tokens, *targets;
    int B, T;                 /* B == 0: no complete forward */
};

/*
 * Owner: the trainer (model_create / model_destroy).  Invariants:
 *  - layout is fixed at create; local units are WTE, WPE (first stage),
 *    layers lo..hi-1, LNF and the wte copy (last stage).
 *  - each slot's buffers are sized for (max_b, max_t); per-layer tensors
 *    sit at act_off[k] + (l - lo) * act_len[k] in slot.acts.
 *  - No parameter, gradient or optimizer memory is owned here.
 */
struct model {
    struct model_config cfg;
    struct model_part part;
    struct model_layout layout;
    struct layer_off lo;
    int Cl, NHl, Vl, v0; /* local channels, heads, vocabulary and its first row */
    int u_wte, u_wpe, u_layer0, u_lnf, u_head; /* local units (-1: none) */
    int max_b, max_t;

    struct slot *slots;
    size_t act_off[ACT_NUM], act_len[ACT_NUM], slot_floats;
    int cur; /* slot of the pass in progress */

    /* Backward scratch, shared by the slots. */
    float *dres;    /* (N, C) gradient of the residual stream */
    float *dtmp;    /* (N, C) */
    float *dbig;    /* (N, 4Cl): d fch, then d qkv */
    float *dlogits; /* (N, Vl) */
    float *dwte;    /* (Vl, C) the pass's wte gradient, added to grads once */
    float *wt;      /* transposed weights for the forward matmuls */
    float *mx;      /* (N) row maxima */
    double *ce;     /* (2N) softmax sums and target logits */
    struct tacc *tree; /* the canonical chunk sums, (N, C) items */
    float *scratch; /* everything above, one block */
    size_t scratch_floats;
    double *dscratch; /* kernel reductions */
    size_t dscratch_len;
    bool failed; /* a tensor-parallel reduction failed in this pass */
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

/* ---- tensors and layouts -------------------------------------------------- */

/* The tensors of global unit g (at most T_NLAYER), offsets within the
 * global unit. */
static int unit_tensors(const struct model_config *cfg, int g, struct tdesc *t)
{
    size_t V = (size_t)cfg->vocab, C = (size_t)cfg->channels, MT = (size_t)cfg->max_t;
    int L = cfg->layers;
    if (g == MODEL_WTE) {
        t[0] = (struct tdesc){0, V, C, CUT_ROWS};
        return 1;
    }
    if (g == MODEL_WPE) {
        t[0] = (struct tdesc){0, MT, C, CUT_NONE};
        return 1;
    }
    if (g == MODEL_LNF(L)) {
        t[0] = (struct tdesc){0, C, 1, CUT_NONE};
        t[1] = (struct tdesc){C, C, 1, CUT_NONE};
        return 2;
    }
    static const struct {
        size_t r, c; /* in units of C */
        enum cut cut;
    } shape[T_NLAYER] = {
        [T_LN1W] = {1, 0, CUT_NONE}, [T_LN1B] = {1, 0, CUT_NONE}, [T_QKVW] = {3, 1, CUT_ROWS3},
        [T_QKVB] = {3, 0, CUT_ROWS3}, [T_APW] = {1, 1, CUT_COLS}, [T_APB] = {1, 0, CUT_NONE},
        [T_LN2W] = {1, 0, CUT_NONE}, [T_LN2B] = {1, 0, CUT_NONE}, [T_FCW] = {4, 1, CUT_ROWS},
        [T_FCB] = {4, 0, CUT_ROWS},   [T_FPW] = {1, 4, CUT_COLS}, [T_FPB] = {1, 0, CUT_NONE},
    };
    size_t off = 0;
    for (int k = 0; k < T_NLAYER; k++) {
        size_t cols = shape[k].c ? shape[k].c * C : 1;
        t[k] = (struct tdesc){off, shape[k].r * C, cols, shape[k].cut};
        off += t[k].rows * cols;
    }
    return T_NLAYER;
}

static size_t local_len(const struct tdesc *t, int tp)
{
    return t->cut == CUT_NONE ? t->rows * t->cols : t->rows * t->cols / (size_t)tp;
}

static size_t global_unit_len(const struct model_config *cfg, int g)
{
    struct tdesc t[T_NLAYER];
    int n = unit_tensors(cfg, g, t);
    return t[n - 1].off + t[n - 1].rows * t[n - 1].cols;
}

/* Copies tensor t between the global unit at gu and the local unit at lu
 * (loff: its offset there), either way. */
static void copy_tensor(const struct tdesc *t, int tp, int r, const float *gsrc, float *gdst,
                        const float *lsrc, float *ldst, size_t loff)
{
    size_t R = t->rows, Cc = t->cols;
    const float *gs = gsrc ? gsrc + t->off : NULL;
    float *gd = gdst ? gdst + t->off : NULL;
    const float *ls = lsrc ? lsrc + loff : NULL;
    float *ld = ldst ? ldst + loff : NULL;
#define MOVE(goff, lofs, n)                                                                    \
    do {                                                                                       \
        if (ld)                                                                                \
            memcpy(ld + (lofs), gs + (goff), (n) * sizeof(float));                             \
        else                                                                                   \
            memcpy(gd + (goff), ls + (lofs), (n) * sizeof(float));                             \
    } while (0)
    switch (t->cut) {
    case CUT_NONE:
        MOVE(0, 0, R * Cc);
        break;
    case CUT_ROWS:
        MOVE((size_t)r * (R / tp) * Cc, 0, R / tp * Cc);
        break;
    case CUT_ROWS3:
        for (size_t b = 0; b < 3; b++)
            MOVE((b * (R / 3) + (size_t)r * (R / 3 / tp)) * Cc, b * (R / 3 / tp) * Cc,
                 R / 3 / tp * Cc);
        break;
    case CUT_COLS:
        for (size_t i = 0; i < R; i++)
            MOVE(i * Cc + (size_t)r * (Cc / tp), i * (Cc / tp), Cc / tp);
        break;
    }
#undef MOVE
}

static size_t global_unit_off(const struct model *m, int g)
{
    size_t off = 0;
    for (int u = 0; u < g; u++)
        off += global_unit_len(&m->cfg, u);
    return off;
}

/* Moves every tensor of the part between global and local buffers. */
static void move_all(const struct model *m, const float *gsrc, float *gdst, const float *lsrc,
                     float *ldst, bool owned)
{
    int tp = m->part.tp, r = m->part.tp_rank;
    for (int u = 0; u < m->layout.nunits; u++) {
        int g = m->layout.unit_id[u];
        if (owned && u == m->u_head && m->u_wte < 0)
            continue; /* the last stage's copy of wte */
        struct tdesc t[T_NLAYER];
        int n = unit_tensors(&m->cfg, g, t);
        size_t goff = global_unit_off(m, g), loff = m->layout.unit_off[u];
        for (int k = 0; k < n; k++) {
            if (!(owned && t[k].cut == CUT_NONE && r != 0))
                copy_tensor(&t[k], tp, r, gsrc ? gsrc + goff : NULL, gdst ? gdst + goff : NULL,
                            lsrc ? lsrc + loff : NULL, ldst ? ldst + loff : NULL, 0);
            loff += local_len(&t[k], tp);
        }
    }
}

void model_to_local(const struct model *m, const float *global, float *local)
{
    move_all(m, global, NULL, NULL, local, false);
}

void model_to_global(const struct model *m, const float *local, float *global, bool owned)
{
    move_all(m, NULL, global, local, NULL, owned);
}

size_t model_global_size(const struct model *m)
{
    return global_unit_off(m, MODEL_UNITS(m->cfg.layers));
}

int model_norm_spans(const struct model *m, int u, struct model_span *out)
{
    if (u == m->u_head && m->u_wte < 0)
        return 0;
    struct tdesc t[T_NLAYER];
    int n = unit_tensors(&m->cfg, m->layout.unit_id[u], t), k = 0;
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t len = local_len(&t[i], m->part.tp);
        if (t[i].cut != CUT_NONE || m->part.tp_rank == 0) {
            if (k > 0 && out[k - 1].off + out[k - 1].len == off)
                out[k - 1].len += len;
            else
                out[k++] = (struct model_span){off, len};
        }
        off += len;
    }
    return k;
}

/* ---- create / destroy ----------------------------------------------------- */

static int check_config(const struct model_config *cfg, const struct model_part *pt, int max_b,
                        int max_t)
{
    const char *why = NULL;
    if (!cfg || !pt)
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
    else if (pt->tp < 1 || pt->tp_rank < 0 || pt->tp_rank >= pt->tp)
        why = "tensor-parallel rank out of range";
    else if (cfg->heads % pt->tp)
        why = "the tensor-parallel width must divide the heads";
    else if (MODEL_VCHUNKS % pt->tp || cfg->vocab % MODEL_VCHUNKS)
        why = "the tensor-parallel width must divide 16 (the vocabulary is cut in 16 chunks)";
    else if (pt->lo < 0 || pt->hi > cfg->layers || pt->lo >= pt->hi)
        why = "a part needs a non-empty range of layers";
    else if (pt->slots < 1 || pt->slots > 4096)
        why = "slots must be in 1..4096";
    if (why) {
        fprintf(stderr, "model_create: %s\n", why);
        return -1;
    }
    return 0;
}

/* Local units and the part's layout. */
static int build_layout(struct model *m)
{
    const struct model_config *cfg = &m->cfg;
    int L = cfg->layers, tp = m->part.tp, n = 0;
    bool first = m->part.lo == 0, last = m->part.hi == L;
    int ids[MODEL_UNITS(1 << 12)];
    m->u_wte = m->u_wpe = m->u_lnf = m->u_head = -1;
    if (first) {
        m->u_wte = n, ids[n++] = MODEL_WTE;
        m->u_wpe = n, ids[n++] = MODEL_WPE;
    }
    m->u_layer0 = n;
    for (int l = m->part.lo; l < m->part.hi; l++)
        ids[n++] = MODEL_LAYER0 + l;
    if (last) {
        m->u_lnf = n, ids[n++] = MODEL_LNF(L);
        if (first)
            m->u_head = m->u_wte;
        else
            m->u_head = n, ids[n++] = MODEL_WTE;
    }
    m->layout.nunits = n;
    m->layout.unit_off = malloc(sizeof(size_t) * ((size_t)n + 1));
    m->layout.unit_id = malloc(sizeof(int) * (size_t)n);
    if (!m->layout.unit_off || !m->layout.unit_id)
        return -1;
    m->layout.unit_off[0] = 0;
    for (int u = 0; u < n; u++) {
        struct tdesc t[T_NLAYER];
        int nt = unit_tensors(cfg, ids[u], t);
        size_t len = 0;
        for (int k = 0; k < nt; k++)
            len += local_len(&t[k], tp);
        m->layout.unit_id[u] = ids[u];
        m->layout.unit_off[u + 1] = m->layout.unit_off[u] + len;
    }
    m->layout.total = m->layout.unit_off[n];
    /* Local offsets of a layer's tensors. */
    struct tdesc t[T_NLAYER];
    unit_tensors(cfg, MODEL_LAYER0, t);
    size_t o = 0;
    for (int k = 0; k < T_NLAYER; k++)
        m->lo.t[k] = o, o += local_len(&t[k], tp);
    m->lo.size = o;
    return 0;
}

static float *alloc_floats(size_t n)
{
    return malloc((n ? n : 1) * sizeof(float));
}

struct model *model_create_part(const struct model_config *cfg, const struct model_part *pt,
                                int max_b, int max_t)
{
    if (check_config(cfg, pt, max_b, max_t))
        return NULL;
    struct model *m = calloc(1, sizeof *m);
    if (!m)
        goto fail_nomem;
    m->cfg = *cfg;
    m->part = *pt;
    m->max_b = max_b;
    m->max_t = max_t;
    int tp = pt->tp;
    m->Cl = cfg->channels / tp;
    m->NHl = cfg->heads / tp;
    m->Vl = cfg->vocab / tp;
    m->v0 = pt->tp_rank * m->Vl;
    if (build_layout(m))
        goto fail_nomem;

    int bad = 0;
    size_t C = (size_t)cfg->channels, Cl = (size_t)m->Cl, Vl = (size_t)m->Vl;
    size_t nl = (size_t)(pt->hi - pt->lo);
    size_t N = mul((size_t)max_b, (size_t)max_t, &bad), NC = mul(N, C, &bad);
    size_t per_row[ACT_NUM] = {
        [ACT_LN1] = C,      [ACT_LN1_MEAN] = 1, [ACT_LN1_RSTD] = 1, [ACT_QKV] = 3 * Cl,
        [ACT_ATTY] = Cl,    [ACT_ATT] = 0,      [ACT_RES2] = C,     [ACT_LN2] = C,
        [ACT_LN2_MEAN] = 1, [ACT_LN2_RSTD] = 1, [ACT_FCH] = 4 * Cl, [ACT_FCH_GELU] = 4 * Cl,
        [ACT_RES3] = C,
    };
    size_t total = 0;
    for (int k = 0; k < ACT_NUM; k++) {
        m->act_len[k] = k == ACT_ATT ? mul(mul(N, (size_t)m->NHl, &bad), (size_t)max_t, &bad)
                                     : mul(N, per_row[k], &bad);
        m->act_off[k] = total;
        total = add(total, mul(m->act_len[k], nl, &bad), &bad);
    }
    total = add(total, NC, &bad); /* x0 */
    if (pt->hi == cfg->layers) /* lnf, mean, rstd, logits, lse */
        total = add(total, add(add(NC, 3 * N, &bad), mul(N, Vl, &bad), &bad), &bad);
    m->slot_floats = total;

    /* Shared scratch, in carving order. */
    size_t rest[] = {
        NC, NC, mul(N, 4 * Cl, &bad), /* dres, dtmp, dbig */
        mul(N, Vl, &bad), Vl * C,     /* dlogits, dwte */
        max_sz(max_sz(4 * Cl * C, Vl * C), 3 * Cl * C), /* wt */
        N,                            /* mx */
    };
    size_t sc = 0;
    for (size_t k = 0; k < sizeof rest / sizeof rest[0]; k++)
        sc = add(sc, rest[k], &bad);
    if (bad || total > SIZE_MAX / sizeof(float) / (size_t)pt->slots ||
        sc > SIZE_MAX / sizeof(float)) {
        fprintf(stderr, "model_create: sizes overflow\n");
        goto fail;
    }
    m->scratch_floats = sc;
    m->scratch = alloc_floats(sc);
    m->dscratch_len = max_sz(max_sz(4 * C, (size_t)cfg->vocab), max_sz((size_t)max_t, 2 * N));
    m->dscratch = malloc(m->dscratch_len * sizeof(double));
    m->ce = malloc(2 * N * sizeof(double));
    m->slots = calloc((size_t)pt->slots, sizeof(*m->slots));
    m->tree = tacc_create(NC, m->NHl > MODEL_VCHUNKS / tp ? m->NHl : MODEL_VCHUNKS / tp);
    if (!m->scratch || !m->dscratch || !m->ce || !m->slots || !m->tree)
        goto fail_nomem;
    float *p = m->scratch;
    float **dst[] = {&m->dres, &m->dtmp, &m->dbig, &m->dlogits, &m->dwte, &m->wt, &m->mx};
    for (size_t k = 0; k < sizeof rest / sizeof rest[0]; k++) {
        *dst[k] = p;
        p += rest[k];
    }
    for (int s = 0; s < pt->slots; s++) {
        struct slot *sl = &m->slots[s];
        sl->acts = alloc_floats(total);
        sl->tokens = malloc(N);
        sl->targets = malloc(N);
        if (!sl->acts || !sl->tokens || !sl->targets)
            goto fail_nomem;
        float *q = sl->acts + m->act_off[ACT_NUM - 1] + nl * m->act_len[ACT_NUM - 1];
        sl->x0 = q, q += NC;
        if (pt->hi == cfg->layers) {
            sl->lnf = q, q += NC;
            sl->lnf_mean = q, q += N;
            sl->lnf_rstd = q, q += N;
            sl->logits = q, q += N * Vl;
            sl->lse = q;
        }
    }
    return m;

fail_nomem:
    fprintf(stderr, "model_create: out of memory\n");
fail:
    model_destroy(m);
    return NULL;
}

struct model *model_create(const struct model_config *cfg, int max_b, int max_t)
{
    struct model_part whole = {1, 0, 0, cfg ? cfg->layers : 0, 1};
    return model_create_part(cfg, &whole, max_b, max_t);
}

void model_destroy(struct model *m)
{
    if (!m)
        return;
    for (int s = 0; m->slots && s < m->part.slots; s++) {
        free(m->slots[s].acts);
        free(m->slots[s].tokens);
        free(m->slots[s].targets);
    }
    free(m->slots);
    tacc_destroy(m->tree);
    free(m->ce);
    free(m->dscratch);
    free(m->scratch);
    free(m->layout.unit_off);
    free(m->layout.unit_id);
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

const struct model_part *model_part(const struct model *m)
{
    return &m->part;
}

bool model_first(const struct model *m)
{
    return m->part.lo == 0;
}

bool model_last(const struct model *m)
{
    return m->part.hi == m->cfg.layers;
}

size_t model_slot_bytes(const struct model *m)
{
    return m->slot_floats * sizeof(float) + 2 * (size_t)m->max_b * m->max_t;
}

size_t model_activation_bytes(const struct model *m)
{
    return (size_t)m->part.slots * model_slot_bytes(m) + m->scratch_floats * sizeof(float) +
           (m->dscratch_len + 2 * (size_t)m->max_b * m->max_t) * sizeof(double);
}

float *model_input(struct model *m, int slot)
{
    return m->slots[slot].x0;
}

const float *model_output(const struct model *m, int slot)
{
    struct slot *sl = &m->slots[slot];
    return sl->acts + m->act_off[ACT_RES3] + (size_t)(m->part.hi - m->part.lo - 1) *
                                                 m->act_len[ACT_RES3];
}

float *model_dstream(struct model *m)
{
    return m->dres;
}

float *model_head_dwte(struct model *m)
{
    return m->dwte;
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
    double std = 0.02, std_res = 0.02 / sqrt(2.0 * (double)L);
    uint64_t tensor = 0;
    struct tdesc t[T_NLAYER];
    unit_tensors(&m->cfg, MODEL_LAYER0, t);

    fill_normal(params, V * C, std, seed, tensor++);
    fill_normal(params + V * C, MT * C, std, seed, tensor++);
    for (size_t l = 0; l < L; l++) {
        float *u = params + global_unit_off(m, MODEL_LAYER0 + (int)l);
        fill_const(u + t[T_LN1W].off, C, 1.0f);
        fill_const(u + t[T_LN1B].off, C, 0.0f);
        fill_normal(u + t[T_QKVW].off, 3 * C * C, std, seed, tensor++);
        fill_const(u + t[T_QKVB].off, 3 * C, 0.0f);
        fill_normal(u + t[T_APW].off, C * C, std_res, seed, tensor++);
        fill_const(u + t[T_APB].off, C, 0.0f);
        fill_const(u + t[T_LN2W].off, C, 1.0f);
        fill_const(u + t[T_LN2B].off, C, 0.0f);
        fill_normal(u + t[T_FCW].off, 4 * C * C, std, seed, tensor++);
        fill_const(u + t[T_FCB].off, 4 * C, 0.0f);
        fill_normal(u + t[T_FPW].off, 4 * C * C, std_res, seed, tensor++);
        fill_const(u + t[T_FPB].off, C, 0.0f);
    }
    float *f = params + global_unit_off(m, MODEL_LNF((int)L));
    fill_const(f, C, 1.0f);
    fill_const(f + C, C, 0.0f);
}

/* ---- canonical sums ------------------------------------------------------- */

/* The tensor-parallel reduction of what this rank's chunks summed to. */
static int tp_reduce(struct model *m, const struct model_hooks *h, void *buf, size_t n, bool dbl,
                     int op)
{
    if (m->part.tp == 1)
        return 0;
    if (!h || !h->tp_allreduce || h->tp_allreduce(h->ctx, buf, n, dbl, op) != 0) {
        if (!m->failed)
            fprintf(stderr, "model: the tensor-parallel reduction failed\n");
        m->failed = true;
        return -1;
    }
    return 0;
}

/* Row-parallel product: out (N, O) = inp (N, I) · w^T over the whole input
 * dimension (the group's), + bias.  The local I is cut in `chunks` equal
 * chunks, each summed from zero, meeting in the canonical tree. */
static void rowpar_forward(struct model *m, const struct model_hooks *h, float *out,
                           const float *inp, const float *w, const float *bias, size_t N, int I,
                           int O, int chunks)
{
    int cw = I / chunks;
    kern_transpose(m->wt, w, O, I);
    tacc_reset_len(m->tree, N * (size_t)O);
    for (int j = 0; j < chunks; j++) {
        kern_gemm(tacc_slot(m->tree), (size_t)O, inp + (size_t)j * cw, (size_t)I, 1,
                  m->wt + (size_t)j * cw * O, (size_t)O, N, (size_t)cw, (size_t)O, NULL, 0);
        tacc_commit(m->tree);
    }
    float *s = tacc_finish(m->tree, NULL);
    tp_reduce(m, h, s, N * (size_t)O, false, 0);
    for (size_t n = 0; n < N; n++)
        kern_add(out + n * O, s + n * O, bias, (size_t)O);
}

/* Column-parallel input gradient: the sum over output rows of
 * dout (N, O) · w (O, I), in `chunks` chunks; chunk j is `nb` blocks of
 * O/nb/chunks rows starting at b*O/nb + j*rows (q, k and v of a head).
 * Returns the whole group's sum (valid until the next canonical sum). */
static float *colpar_dinput(struct model *m, const struct model_hooks *h, const float *dout,
                            const float *w, size_t N, int I, int O, int chunks, int nb)
{
    int rows = O / nb / chunks;
    tacc_reset_len(m->tree, N * (size_t)I);
    for (int j = 0; j < chunks; j++) {
        float *c = tacc_slot(m->tree);
        for (int b = 0; b < nb; b++) {
            size_t r0 = (size_t)b * (O / nb) + (size_t)j * rows;
            kern_gemm(c, (size_t)I, dout + r0, (size_t)O, 1, w + r0 * I, (size_t)I, N,
                      (size_t)rows, (size_t)I, NULL, b > 0);
        }
        tacc_commit(m->tree);
    }
    float *s = tacc_finish(m->tree, NULL);
    tp_reduce(m, h, s, N * (size_t)I, false, 0);
    return s;
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

/* Layer l's (global index) activations in slot sl. */
static void layer_acts(const struct model *m, const struct slot *sl, int l,
                       struct layer_acts *a)
{
    float **f[ACT_NUM] = {
        [ACT_LN1] = &a->ln1,           [ACT_LN1_MEAN] = &a->ln1_mean, [ACT_LN1_RSTD] = &a->ln1_rstd,
        [ACT_QKV] = &a->qkv,           [ACT_ATTY] = &a->atty,         [ACT_ATT] = &a->att,
        [ACT_RES2] = &a->res2,         [ACT_LN2] = &a->ln2,           [ACT_LN2_MEAN] = &a->ln2_mean,
        [ACT_LN2_RSTD] = &a->ln2_rstd, [ACT_FCH] = &a->fch,           [ACT_FCH_GELU] = &a->fch_gelu,
        [ACT_RES3] = &a->res3,
    };
    for (int k = 0; k < ACT_NUM; k++)
        *f[k] = sl->acts + m->act_off[k] + (size_t)(l - m->part.lo) * m->act_len[k];
}

/* The block input of layer l: the stage input or the previous block's output. */
static const float *layer_input(const struct model *m, const struct slot *sl, int l)
{
    if (l == m->part.lo)
        return sl->x0;
    struct layer_acts prev;
    layer_acts(m, sl, l - 1, &prev);
    return prev.res3;
}

static void block_forward(struct model *m, const struct model_hooks *h, struct slot *sl, int l,
                          const float *p)
{
    const size_t *t = m->lo.t;
    int C = m->cfg.channels, Cl = m->Cl, B = sl->B, T = sl->T;
    size_t N = (size_t)B * T;
    struct layer_acts a;
    layer_acts(m, sl, l, &a);
    const float *x = layer_input(m, sl, l);

    kern_layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, p + t[T_LN1W], p + t[T_LN1B], N, C);
    kern_matmul_forward(a.qkv, a.ln1, p + t[T_QKVW], p + t[T_QKVB], m->wt, N, C, 3 * Cl);
    kern_attention_forward(a.atty, a.att, a.qkv, B, T, Cl, m->NHl);
    rowpar_forward(m, h, a.res2, a.atty, p + t[T_APW], p + t[T_APB], N, Cl, C, m->NHl);
    kern_add(a.res2, a.res2, x, N * C);
    kern_layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, p + t[T_LN2W], p + t[T_LN2B],
                           N, C);
    kern_matmul_forward(a.fch, a.ln2, p + t[T_FCW], p + t[T_FCB], m->wt, N, C, 4 * Cl);
    kern_gelu_forward(a.fch_gelu, a.fch, a.fch, N * 4 * Cl);
    rowpar_forward(m, h, a.res3, a.fch_gelu, p + t[T_FPW], p + t[T_FPB], N, 4 * Cl, C, m->NHl);
    kern_add(a.res3, a.res3, a.res2, N * C);
}

/* x0 = wte[token] + wpe[t]; a vocabulary slice adds the rows it holds and
 * the group sums them (one rank's row plus zeros: exact). */
static void embed_forward(struct model *m, const struct model_hooks *h, struct slot *sl,
                          const float *wte, const float *wpe)
{
    int C = m->cfg.channels, B = sl->B, T = sl->T;
    if (m->part.tp == 1) {
        kern_encoder_forward(sl->x0, sl->tokens, wte, wpe, B, T, C);
        return;
    }
    size_t N = (size_t)B * T;
    for (size_t n = 0; n < N; n++) {
        int v = sl->tokens[n] - m->v0;
        if (v >= 0 && v < m->Vl)
            memcpy(sl->x0 + n * C, wte + (size_t)v * C, sizeof(float) * (size_t)C);
        else
            memset(sl->x0 + n * C, 0, sizeof(float) * (size_t)C);
    }
    tp_reduce(m, h, sl->x0, N * (size_t)C, false, 0);
    for (size_t n = 0; n < N; n++)
        kern_add(sl->x0 + n * C, sl->x0 + n * C, wpe + (size_t)(n % (size_t)T) * C, (size_t)C);
}

/* LM head and loss: logits over the vocabulary slice, a softmax whose
 * maximum and normaliser the group combines, never the whole logits. */
static double head_forward(struct model *m, const struct model_hooks *h, struct slot *sl,
                           const float *lnf, const float *wte)
{
    int C = m->cfg.channels, Vl = m->Vl;
    size_t N = (size_t)sl->B * sl->T;
    kern_layernorm_forward(sl->lnf, sl->lnf_mean, sl->lnf_rstd,
                           layer_input(m, sl, m->part.hi), lnf, lnf + C, N, C);
    kern_matmul_forward(sl->logits, sl->lnf, wte, NULL, m->wt, N, C, Vl); /* tied: W = wte */
    kern_rowmax(m->mx, sl->logits, N, Vl);
    tp_reduce(m, h, m->mx, N, false, 1);
    double *sum = m->ce, *tl = m->ce + N;
    kern_sumexp_tree(sum, sl->logits, m->mx, m->dscratch, N, Vl);
    for (size_t n = 0; n < N; n++) {
        int v = sl->targets[n] - m->v0;
        tl[n] = v >= 0 && v < Vl ? sl->logits[n * Vl + v] : 0.0;
    }
    tp_reduce(m, h, m->ce, 2 * N, true, 0);
    double loss = 0.0;
    for (size_t n = 0; n < N; n++) {
        double ls = m->mx[n] + log(sum[n]);
        sl->lse[n] = (float)ls;
        loss += ls - tl[n];
    }
    return loss;
}

float model_forward_slot(struct model *m, int slot, const float *params,
                         const struct model_hooks *hooks, const uint8_t *tokens,
                         const uint8_t *targets, int B, int T)
{
    if (!m)
        return NAN;
    const char *why = NULL;
    if (slot < 0 || slot >= m->part.slots)
        why = "slot out of range";
    else if (!tokens || !targets)
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
    struct slot *sl = &m->slots[slot];
    sl->B = 0; /* no valid activations until this pass completes */
    m->failed = false;
    memcpy(sl->tokens, tokens, N);
    memcpy(sl->targets, targets, N);
    sl->B = B, sl->T = T; /* the passes read the shape from the slot */

    if (model_first(m)) {
        const float *wte = get_params(m, params, hooks, m->u_wte);
        const float *wpe = get_params(m, params, hooks, m->u_wpe);
        embed_forward(m, hooks, sl, wte, wpe);
        put_params(hooks, m->u_wpe);
        put_params(hooks, m->u_wte);
    }
    for (int l = m->part.lo; l < m->part.hi; l++) {
        int u = m->u_layer0 + l - m->part.lo;
        const float *p = get_params(m, params, hooks, u);
        block_forward(m, hooks, sl, l, p);
        put_params(hooks, u);
    }
    double loss = 0.0;
    if (model_last(m)) {
        const float *lnf = get_params(m, params, hooks, m->u_lnf);
        const float *wte = get_params(m, params, hooks, m->u_head);
        loss = head_forward(m, hooks, sl, lnf, wte) / (double)N;
        put_params(hooks, m->u_head);
        put_params(hooks, m->u_lnf);
    }
    if (m->failed) {
        sl->B = 0;
        return NAN;
    }
    return (float)loss;
}

float model_forward(struct model *m, const float *params, const struct model_hooks *hooks,
                    const uint8_t *tokens, const uint8_t *targets, int B, int T)
{
    return model_forward_slot(m, 0, params, hooks, tokens, targets, B, T);
}

/* ---- backward ------------------------------------------------------------- */

/* On entry m->dres is d(block l output); on return d(block l input). */
static void block_backward(struct model *m, const struct model_hooks *h, struct slot *sl, int l,
                           const float *p, float *g)
{
    const size_t *t = m->lo.t;
    int C = m->cfg.channels, Cl = m->Cl, NHl = m->NHl, B = sl->B, T = sl->T;
    size_t N = (size_t)B * T;
    double *ds = m->dscratch;
    struct layer_acts a;
    layer_acts(m, sl, l, &a);
    const float *x = layer_input(m, sl, l);

    /* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
    kern_matmul_backward(m->dbig, g + t[T_FPW], g + t[T_FPB], m->dres, a.fch_gelu, p + t[T_FPW],
                         ds, N, 4 * Cl, C);
    kern_gelu_backward(m->dbig, a.fch, N * 4 * Cl);
    kern_matmul_backward(NULL, g + t[T_FCW], g + t[T_FCB], m->dbig, a.ln2, p + t[T_FCW], ds, N,
                         C, 4 * Cl);
    const float *dln2 = colpar_dinput(m, h, m->dbig, p + t[T_FCW], N, C, 4 * Cl, NHl, 1);
    kern_layernorm_backward(m->dres, g + t[T_LN2W], g + t[T_LN2B], dln2, a.res2, p + t[T_LN2W],
                            a.ln2_mean, a.ln2_rstd, ds, N, C);
    /* res2 = x + attproj(attention(qkv(ln1(x)))) */
    kern_matmul_backward(m->dtmp, g + t[T_APW], g + t[T_APB], m->dres, a.atty, p + t[T_APW], ds,
                         N, Cl, C);
    kern_attention_backward(m->dbig, m->dtmp, a.qkv, a.att, ds, B, T, Cl, NHl);
    kern_matmul_backward(NULL, g + t[T_QKVW], g + t[T_QKVB], m->dbig, a.ln1, p + t[T_QKVW], ds,
                         N, C, 3 * Cl);
    const float *dln1 = colpar_dinput(m, h, m->dbig, p + t[T_QKVW], N, C, 3 * Cl, NHl, 3);
    kern_layernorm_backward(m->dres, g + t[T_LN1W], g + t[T_LN1B], dln1, x, p + t[T_LN1W],
                            a.ln1_mean, a.ln1_rstd, ds, N, C);
}

/* Head: loss <- logits = lnf · wte^T <- lnf = LN(x).  The wte gradient of
 * the whole pass (head and embedding) is summed in m->dwte and added to
 * the caller's buffer once, so a pass's gradient is the same whether it is
 * accumulated alone or onto others. */
static void head_backward(struct model *m, const struct model_hooks *h, struct slot *sl,
                          const float *lnf, const float *wte, float *glnf)
{
    int C = m->cfg.channels, Vl = m->Vl;
    size_t N = (size_t)sl->B * sl->T;
    kern_crossentropy_backward(m->dlogits, sl->logits, sl->lse, sl->targets, N, Vl, m->v0,
                               (float)(1.0 / (double)N));
    memset(m->dwte, 0, sizeof(float) * (size_t)Vl * C);
    kern_matmul_backward(NULL, m->dwte, NULL, m->dlogits, sl->lnf, wte, m->dscratch, N, C, Vl);
    const float *dlnf = colpar_dinput(m, h, m->dlogits, wte, N, C, Vl,
                                      MODEL_VCHUNKS / m->part.tp, 1);
    memset(m->dres, 0, sizeof(float) * N * C);
    kern_layernorm_backward(m->dres, glnf, glnf + C, dlnf, layer_input(m, sl, m->part.hi), lnf,
                            sl->lnf_mean, sl->lnf_rstd, m->dscratch, N, C);
}

int model_backward_slot(struct model *m, int slot, const float *params, float *grads,
                        const struct model_hooks *hooks)
{
    if (!m)
        return -1;
    const char *why = NULL;
    if (slot < 0 || slot >= m->part.slots)
        why = "slot out of range";
    else if (m->slots[slot].B == 0)
        why = "no forward pass to differentiate";
    else if (!params && !(hooks && hooks->params))
        why = "no parameters";
    else if (!grads && !(hooks && hooks->grads))
        why = "no gradient buffer";
    if (why) {
        fprintf(stderr, "model_backward: %s\n", why);
        return -1;
    }
    struct slot *sl = &m->slots[slot];
    int C = m->cfg.channels;
    m->failed = false;

    if (model_last(m)) {
        const float *lnf = get_params(m, params, hooks, m->u_lnf);
        const float *wte = get_params(m, params, hooks, m->u_head);
        float *glnf = get_grads(m, grads, hooks, m->u_lnf);
        head_backward(m, hooks, sl, lnf, wte, glnf);
        put_params(hooks, m->u_head);
        put_params(hooks, m->u_lnf);
        put_grads(hooks, m->u_lnf);
    }
    for (int l = m->part.hi - 1; l >= m->part.lo; l--) {
        int u = m->u_layer0 + l - m->part.lo;
        const float *p = get_params(m, params, hooks, u);
        float *g = get_grads(m, grads, hooks, u);
        block_backward(m, hooks, sl, l, p, g);
        put_params(hooks, u);
        put_grads(hooks, u);
    }
    if (model_first(m)) {
        float *gwpe = get_grads(m, grads, hooks, m->u_wpe);
        kern_encoder_backward(m->dwte, gwpe, m->dres, sl->tokens, m->v0, m->Vl, m->dscratch,
                              sl->B, sl->T, C);
        put_grads(hooks, m->u_wpe);
        float *gwte = get_grads(m, grads, hooks, m->u_wte);
        kern_add(gwte, gwte, m->dwte, (size_t)m->Vl * C);
        put_grads(hooks, m->u_wte);
    }
    return m->failed ? -1 : 0;
}

void model_backward(struct model *m, const float *params, float *grads,
                    const struct model_hooks *hooks)
{
    model_backward_slot(m, 0, params, grads, hooks);
}

const float *model_last_logits(const struct model *m, int T)
{
    if (!m || m->part.tp != 1 || !model_last(m) || m->slots[0].B == 0 || T < 1 ||
        T > m->slots[0].T)
        return NULL;
    return m->slots[0].logits + (size_t)(T - 1) * m->cfg.vocab; /* row 0 comes first */
}
