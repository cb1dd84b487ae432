/*
 * train.c - weft-train: trains the GPT of model.h on a text file, serially
 * or in any 3D layout over weft: data-parallel with ZeRO 0-3 (--dp,
 * --zero), tensor-parallel (--tp) and pipelined (--pp, --schedule).
 * Launch dp*tp*pp ranks with weftrun (or mpirun/srun):
 *
 *   weftrun -n 8 weft-train --data text.txt --dp 2 --tp 2 --pp 2 --zero 1
 *
 * Rank = tp_idx + tp * (dp_idx + dp * pp_idx): tensor-parallel groups are
 * adjacent ranks.  Data-parallel rank d draws global micro-batches
 * j*dp + d (j < accum), and a step's micro-batches are exactly those of a
 * serial run with --accum dp*accum; every rank of a (tensor, pipeline)
 * cell draws the same ones.
 */
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckpt.h"
#include "data.h"
#include "model.h"
#include "offload.h"
#include "parallel.h"
#include "pipeline.h"
#include "weft.h"

#define MAX_STAGES 64

struct opts {
    const char *data, *save, *resume, *log, *label, *prompt, *stage_layers, *offload;
    struct model_config cfg;
    int B, T, steps, accum, dp, tp, pp, zero, warmup, eval_every, val_batches, save_every, sample;
    bool accum_set, schedule_set, f1b1;
    float lr, min_lr_frac, clip, wd;
    uint64_t seed;
    double bucket_mb, val_fraction;
};

/* What one run needs besides the options. */
struct run {
    struct opts o;
    weft_comm_t world, dpc, tpc, ppc;
    int rank, n, global;
    int dpi, tpi, ppi; /* this rank's coordinates */
    int stage_lo[MAX_STAGES + 1];
    bool det;
    struct dataset data;
    struct model *model;
    struct par *par;
    struct pipe_config pc;
    struct pipe *pipe;
    uint8_t *tok, *tgt;
    FILE *log;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: weft-train --data FILE [options]   (N ranks: weftrun -n N weft-train ...)\n"
            "  model:    --layers L (2) --channels C (64) --heads H (4) --context T (64)\n"
            "  batch:    --batch B (8) --accum K (1: micro-batches per step per data-parallel rank)\n"
            "  layout:   --dp N (ranks / (tp*pp)) --tp N (1) --pp N (1) --zero 0|1|2|3 (0)\n"
            "            --schedule gpipe|1f1b (1f1b; needs --pp) --stage-layers A,B,... (balanced)\n"
            "            --offload none|cpu|file:DIR (none: the AdamW moments stay in memory)\n"
            "  optimizer: --steps S (100) --lr X (1e-3) --min-lr-frac F (0.1) --warmup W (10)\n"
            "            --weight-decay D (0.1) --clip G (1.0) --bucket-mb M (1)\n"
            "  data:     --seed S (1) --val-fraction F (0.1) --val-batches V (8)\n"
            "            --eval-every E (0: at the end)\n"
            "  output:   --log CSV (\"%%r\": one per rank) --label TEXT --save CKPT (%%d: the step) --save-every E\n"
            "            --resume CKPT\n"
            "            --sample NBYTES (200) --prompt TEXT\n"
            "  WEFT_DETERMINISTIC=1: every layout computes the serial run's bits\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.cfg = {MODEL_VOCAB, 64, 2, 64, 4}, .B = 8, .T = 64, .steps = 100,
                       .accum = 1, .dp = 0, .tp = 1, .pp = 1, .zero = 0, .warmup = 10,
                       .val_batches = 8, .sample = 200, .lr = 1e-3f, .min_lr_frac = 0.1f,
                       .clip = 1.0f, .wd = 0.1f, .seed = 1, .bucket_mb = 1,
                       .val_fraction = 0.1, .prompt = "\n", .f1b1 = true};
    static const struct option lo[] = {
        {"data", 1, 0, 'd'}, {"layers", 1, 0, 'L'}, {"channels", 1, 0, 'C'},
        {"heads", 1, 0, 'H'}, {"context", 1, 0, 'T'}, {"batch", 1, 0, 'B'},
        {"accum", 1, 0, 'K'}, {"dp", 1, 0, 'N'}, {"zero", 1, 0, 'Z'}, {"steps", 1, 0, 's'},
        {"lr", 1, 0, 'r'}, {"min-lr-frac", 1, 0, 'm'}, {"warmup", 1, 0, 'w'},
        {"weight-decay", 1, 0, 'D'}, {"clip", 1, 0, 'c'}, {"bucket-mb", 1, 0, 'b'},
        {"seed", 1, 0, 'S'}, {"val-fraction", 1, 0, 'v'}, {"val-batches", 1, 0, 'V'},
        {"eval-every", 1, 0, 'e'}, {"log", 1, 0, 'l'}, {"label", 1, 0, 'a'},
        {"save", 1, 0, 'o'}, {"save-every", 1, 0, 'E'}, {"resume", 1, 0, 'R'},
        {"sample", 1, 0, 'x'}, {"prompt", 1, 0, 'p'}, {"tp", 1, 0, 't'}, {"pp", 1, 0, 'P'},
        {"schedule", 1, 0, 'g'}, {"stage-layers", 1, 0, 'y'}, {"offload", 1, 0, 'O'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int c, li = 0;
    while ((c = getopt_long(argc, argv, "", lo, &li)) != -1) {
        char *end = NULL;
        double v = optarg ? strtod(optarg, &end) : 0;
        bool num = optarg && end != optarg && *end == '\0';
        int iv = (int)v;
        switch (c) {
        case 'd': o->data = optarg; continue;
        case 'l': o->log = optarg; continue;
        case 'a': o->label = optarg; continue;
        case 'o': o->save = optarg; continue;
        case 'R': o->resume = optarg; continue;
        case 'p': o->prompt = optarg; continue;
        case 'y': o->stage_layers = optarg; continue;
        case 'O': o->offload = optarg; continue;
        case 'g':
            if (strcmp(optarg, "gpipe") && strcmp(optarg, "1f1b")) {
                fprintf(stderr, "weft-train: --schedule is gpipe or 1f1b, not '%s'\n", optarg);
                return -1;
            }
            o->f1b1 = strcmp(optarg, "1f1b") == 0;
            o->schedule_set = true;
            continue;
        case 'h': usage(stdout); exit(0);
        case '?': usage(stderr); return -1;
        default: break;
        }
        if (!num || v < 0 || v > 1e9) {
            fprintf(stderr, "weft-train: --%s wants a non-negative number, not '%s'\n",
                    lo[li].name, optarg);
            return -1;
        }
        switch (c) {
        case 'L': o->cfg.layers = iv; break;
        case 'C': o->cfg.channels = iv; break;
        case 'H': o->cfg.heads = iv; break;
        case 'T': o->T = o->cfg.max_t = iv; break;
        case 'B': o->B = iv; break;
        case 'K': o->accum = iv; o->accum_set = true; break;
        case 'N': o->dp = iv; break;
        case 't': o->tp = iv; break;
        case 'P': o->pp = iv; break;
        case 'Z': o->zero = iv; break;
        case 's': o->steps = iv; break;
        case 'r': o->lr = (float)v; break;
        case 'm': o->min_lr_frac = (float)v; break;
        case 'w': o->warmup = iv; break;
        case 'D': o->wd = (float)v; break;
        case 'c': o->clip = (float)v; break;
        case 'b': o->bucket_mb = v; break;
        case 'S': o->seed = (uint64_t)v; break;
        case 'v': o->val_fraction = v; break;
        case 'V': o->val_batches = iv; break;
        case 'e': o->eval_every = iv; break;
        case 'E': o->save_every = iv; break;
        case 'x': o->sample = iv; break;
        }
    }
    if (optind < argc || o->data == NULL) {
        fprintf(stderr, "weft-train: %s\n", o->data ? "unexpected argument" : "--data is required");
        usage(stderr);
        return -1;
    }
    if (o->zero > 3 || o->B < 1 || o->T < 2 || o->accum < 1 || o->val_fraction <= 0 ||
        o->val_fraction >= 1 || o->val_batches < 1 || o->tp < 1 || o->pp < 1) {
        fprintf(stderr, "weft-train: --zero 0..3, --batch >= 1, --context >= 2, --accum >= 1, "
                        "--tp >= 1, --pp >= 1, 0 < --val-fraction < 1, --val-batches >= 1\n");
        return -1;
    }
    if (o->schedule_set && o->pp < 2) {
        fprintf(stderr, "weft-train: --schedule needs a pipeline (--pp 2 or more)\n");
        return -1;
    }
    if (o->stage_layers && o->pp < 2) {
        fprintf(stderr, "weft-train: --stage-layers needs a pipeline (--pp 2 or more)\n");
        return -1;
    }
    return 0;
}

/* The model-shape rules of a layout, checked before any rank starts work. */
static int check_layout(const struct opts *o)
{
    const struct model_config *c = &o->cfg;
    if (c->layers < 1 || c->heads < 1 || c->channels < 1 || c->channels % c->heads) {
        fprintf(stderr, "weft-train: --channels %d must be a positive multiple of --heads %d\n",
                c->channels, c->heads);
        return -1;
    }
    if (c->heads % o->tp) {
        fprintf(stderr, "weft-train: --tp %d does not divide --heads %d (each rank takes whole "
                        "heads)\n", o->tp, c->heads);
        return -1;
    }
    if ((4 * c->channels) % o->tp) {
        fprintf(stderr, "weft-train: --tp %d does not divide the MLP width %d\n", o->tp,
                4 * c->channels);
        return -1;
    }
    if (MODEL_VCHUNKS % o->tp) {
        fprintf(stderr, "weft-train: --tp %d does not divide 16 (the vocabulary of 256 bytes is "
                        "cut in 16 chunks): use 1, 2, 4, 8 or 16\n", o->tp);
        return -1;
    }
    if (o->pp > c->layers || o->pp > MAX_STAGES) {
        fprintf(stderr, "weft-train: --pp %d exceeds --layers %d (each stage needs a layer)\n",
                o->pp, c->layers);
        return -1;
    }
    return 0;
}

/* Layers per stage: --stage-layers, or contiguous ranges that minimise the
 * largest stage's parameter count (the first stage holds the embeddings,
 * the last the final LayerNorm and its copy of wte). */
static int split_stages(struct run *r)
{
    const struct opts *o = &r->o;
    int L = o->cfg.layers, pp = o->pp;
    int *lo = r->stage_lo;
    if (o->stage_layers) {
        int k = 0;
        const char *s = o->stage_layers;
        lo[0] = 0;
        for (;;) {
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s || v < 1 || v > L || k == pp || (*end != ',' && *end != '\0'))
                break;
            lo[k + 1] = lo[k] + (int)v;
            k++;
            if (*end == '\0') {
                if (k == pp && lo[k] == L)
                    return 0;
                break;
            }
            s = end + 1;
        }
        fprintf(stderr, "weft-train: --stage-layers '%s' must give %d positive layer counts "
                        "summing to --layers %d\n", o->stage_layers, pp, L);
        return -1;
    }
    double C = o->cfg.channels, V = o->cfg.vocab, MT = o->cfg.max_t;
    double layer = 12 * C * C + 13 * C, first = (V + MT) * C, last = V * C + 2 * C;
    /* best[s][l]: the smallest largest-stage cost of layers [0, l) on
     * stages [0, s); from[s][l]: where stage s-1 starts. */
    static double best[MAX_STAGES + 1][4097];
    static int from[MAX_STAGES + 1][4097];
    for (int s = 0; s <= pp; s++)
        for (int l = 0; l <= L; l++)
            best[s][l] = INFINITY;
    best[0][0] = 0;
    for (int s = 1; s <= pp; s++)
        for (int l = s; l <= L - (pp - s); l++)
            for (int a = s - 1; a < l; a++) {
                double cost = (l - a) * layer + (s == 1 ? first : 0) + (s == pp ? last : 0);
                double worst = fmax(best[s - 1][a], cost);
                if (worst < best[s][l]) {
                    best[s][l] = worst;
                    from[s][l] = a;
                }
            }
    lo[pp] = L;
    for (int s = pp; s > 0; s--)
        lo[s - 1] = from[s][lo[s]];
    return 0;
}

static int world(struct run *r)
{
    static const char *const sizes[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                        "SLURM_NTASKS", NULL};
    struct opts *o = &r->o;
    r->n = 1;
    for (const char *const *v = sizes; *v; v++)
        if (getenv(*v) && atoi(getenv(*v)) > 1) {
            if (weft_comm_init_env(&r->world) != WEFT_OK) {
                fprintf(stderr, "weft-train: %s\n", weft_last_error(NULL));
                return -1;
            }
            weft_comm_rank(r->world, &r->rank);
            weft_comm_size(r->world, &r->n);
            break;
        }
    int cell = o->tp * o->pp;
    if (r->n % cell) {
        fprintf(stderr, "weft-train: --tp %d x --pp %d = %d does not divide the %d rank(s) "
                        "started\n", o->tp, o->pp, cell, r->n);
        return -1;
    }
    if (o->dp && o->dp * cell != r->n) {
        fprintf(stderr, "weft-train: --dp %d but %d rank(s) were started; --dp x --tp x --pp "
                        "must be the rank count (weftrun -n %d ...)\n", o->dp, r->n,
                o->dp * cell);
        return -1;
    }
    o->dp = r->n / cell;
    r->tpi = r->rank % o->tp;
    r->dpi = r->rank / o->tp % o->dp;
    r->ppi = r->rank / (o->tp * o->dp);
    if (r->n == 1)
        return 0;
    /* Groups by colour: ranks that share the other two coordinates. */
    int tpcol = r->dpi + o->dp * r->ppi, dpcol = r->tpi + o->tp * r->ppi,
        ppcol = r->tpi + o->tp * r->dpi;
    weft_comm_t *dst[3] = {&r->tpc, &r->dpc, &r->ppc};
    int col[3] = {tpcol, dpcol, ppcol}, key[3] = {r->tpi, r->dpi, r->ppi};
    int size[3] = {o->tp, o->dp, o->pp};
    for (int k = 0; k < 3; k++) {
        weft_comm_t c = NULL;
        if (weft_comm_split(r->world, col[k], key[k], &c) != WEFT_OK) {
            fprintf(stderr, "weft-train: rank %d: split: %s\n", r->rank,
                    weft_last_error(r->world));
            return -1;
        }
        if (size[k] > 1)
            *dst[k] = c;
        else
            weft_comm_destroy(c);
    }
    return 0;
}

/* Cosine decay to min_lr_frac * lr after a linear warm-up. */
static float lr_at(const struct opts *o, long step)
{
    if (step < o->warmup)
        return o->lr * (float)(step + 1) / (float)o->warmup;
    double span = o->steps > o->warmup ? o->steps - o->warmup : 1;
    double t = (double)(step - o->warmup) / span;
    double lo = o->lr * o->min_lr_frac;
    return (float)(lo + 0.5 * (o->lr - lo) * (1 + cos(M_PI * (t > 1 ? 1 : t))));
}

/* Micro-batch j of this step on this rank's cell. */
struct draw_ctx {
    struct run *r;
    long step;
};

static void draw(void *ctx, int j, uint8_t *tok, uint8_t *tgt)
{
    struct draw_ctx *d = ctx;
    struct run *r = d->r;
    data_train_batch(&r->data, r->o.seed, (uint64_t)d->step, j * r->o.dp + r->dpi, r->global,
                     r->o.B, r->o.T, tok, tgt);
}

static bool last_stage(const struct run *r)
{
    return r->ppi == r->o.pp - 1;
}

/* ---- evaluation, checkpoints, sampling ------------------------------------- */

/* Mean loss over V validation batches shared among the data-parallel
 * ranks, through the pipeline (forward only, slot 0). */
static int validate(struct run *r, double *loss)
{
    int dp = r->o.dp, per = (r->o.val_batches + dp - 1) / dp, total = per * dp;
    double sum = 0;
    for (int k = 0; k < per; k++) {
        float l = 0;
        data_val_batch(&r->data, r->dpi * per + k, total, r->o.B, r->o.T, r->tok, r->tgt);
        if (pipe_forward(r->pipe, r->tok, r->tgt, &l) != 0)
            return -1;
        sum += last_stage(r) && r->tpi == 0 ? l : 0;
    }
    if (pipe_drain(r->pipe) != 0 || par_sum(r->par, &sum, 1) != WEFT_OK)
        return -1;
    *loss = sum / total;
    return 0;
}

/* Collective: the whole model's params, m and v (global layout) on world
 * rank 0 (out[k], Ψ floats each; NULL elsewhere).  Each cell's first
 * data-parallel rank puts what it alone holds in a zeroed buffer and the
 * world sums them: one rank's value plus zeros, exact. */
static int gather_whole(struct run *r, float *out[3], int nwhich)
{
    const struct model_layout *lay = model_layout(r->model);
    size_t psi = model_global_size(r->model);
    float *local = malloc(lay->total * sizeof(float));
    float *glob = calloc(psi, sizeof(float));
    int ok = local && glob;
    for (int k = 0; k < nwhich; k++) {
        if (par_export(r->par, k, ok ? local : NULL) != WEFT_OK)
            ok = 0;
        if (ok) {
            memset(glob, 0, psi * sizeof(float));
            if (r->dpi == 0)
                model_to_global(r->model, local, glob, true);
        }
        if (r->n > 1) {
            double okd = ok;
            if (weft_allreduce(&okd, &okd, 1, WEFT_FLOAT64, WEFT_MIN, r->world) != WEFT_OK)
                okd = 0;
            ok = okd > 0;
            if (ok && weft_reduce(glob, r->rank == 0 ? out[k] : NULL, psi, WEFT_FLOAT32,
                                  WEFT_SUM, 0, r->world) != WEFT_OK)
                ok = 0;
        } else if (ok) {
            memcpy(out[k], glob, psi * sizeof(float));
        }
    }
    free(local);
    free(glob);
    return ok ? 0 : -1;
}

/* Collective: the whole state to rank 0, which writes it; every rank
 * learns whether it worked. */
static int save(struct run *r, const char *path, long step)
{
    size_t psi = model_global_size(r->model);
    float *buf[3] = {0};
    int ok = 1;
    for (int k = 0; k < 3 && r->rank == 0; k++)
        if ((buf[k] = malloc(psi * sizeof(float))) == NULL)
            ok = 0;
    if (r->n > 1) {
        double okd = ok;
        if (weft_allreduce(&okd, &okd, 1, WEFT_FLOAT64, WEFT_MIN, r->world) != WEFT_OK)
            okd = 0;
        ok = okd > 0;
    }
    if (ok && gather_whole(r, buf, 3) != 0)
        ok = 0;
    char err[512] = "out of memory";
    if (r->rank == 0 && ok) {
        struct ckpt_header h = {*model_config(r->model), psi, step, r->global, r->o.B, r->o.T,
                                r->o.seed};
        ok = ckpt_write(path, &h, buf[0], buf[1], buf[2], err, sizeof(err)) == 0;
        if (!ok)
            fprintf(stderr, "weft-train: %s\n", err);
    }
    for (int k = 0; k < 3; k++)
        free(buf[k]);
    double agree = ok;
    if (r->n > 1 && weft_broadcast(&agree, &agree, 1, WEFT_FLOAT64, 0, r->world) != WEFT_OK)
        return -1;
    return agree > 0 ? 0 : -1;
}

/* pattern with its first `key` ("%d", "%r") replaced by v. */
static const char *subst(const char *pattern, const char *key, long v, char *out, size_t len)
{
    const char *at = strstr(pattern, key);
    if (at == NULL)
        snprintf(out, len, "%s", pattern);
    else
        snprintf(out, len, "%.*s%ld%s", (int)(at - pattern), pattern, v, at + 2);
    return out;
}

/* Rank 0 samples from the whole model, gathered from every part. */
static void sample(struct run *r)
{
    int T = r->o.T, len = 0;
    size_t psi = model_global_size(r->model);
    float *params = r->rank == 0 ? malloc(psi * sizeof(float)) : NULL;
    float *bufs[3] = {params, NULL, NULL};
    if (gather_whole(r, bufs, 1) != 0 || r->rank != 0) {
        free(params);
        return;
    }
    struct model *m = model_create(&r->o.cfg, 1, T);
    uint8_t *ctx = calloc((size_t)T, 1), *zero = calloc((size_t)T, 1);
    char *out = malloc((size_t)r->o.sample + 1);
    if (!m || !ctx || !zero || !out)
        goto done;
    for (const char *p = r->o.prompt; *p && len < T; p++)
        ctx[len++] = (uint8_t)*p;
    if (len == 0)
        ctx[len++] = '\n';
    uint64_t rng = r->o.seed * 7919u + 17;
    for (int i = 0; i < r->o.sample; i++) {
        model_forward(m, params, NULL, ctx, zero, 1, len);
        const float *logit = model_last_logits(m, len);
        double mx = logit[0], z = 0, cum = 0; /* temperature 0.8 */
        for (int v = 1; v < MODEL_VOCAB; v++)
            mx = logit[v] > mx ? logit[v] : mx;
        for (int v = 0; v < MODEL_VOCAB; v++)
            z += exp((logit[v] - mx) / 0.8);
        rng = data_mix(rng);
        double u = (double)(rng >> 11) / 9007199254740992.0 * z;
        int pick = MODEL_VOCAB - 1;
        for (int v = 0; v < MODEL_VOCAB; v++)
            if ((cum += exp((logit[v] - mx) / 0.8)) >= u) {
                pick = v;
                break;
            }
        out[i] = (char)pick;
        if (len == T) {
            memmove(ctx, ctx + 1, (size_t)T - 1);
            len--;
        }
        ctx[len++] = (uint8_t)pick;
    }
    out[r->o.sample] = '\0';
    for (int i = 0; i < r->o.sample; i++) /* keep the terminal sane */
        if ((unsigned char)out[i] < 32 && out[i] != '\n' && out[i] != '\t')
            out[i] = '?';
    printf("--- sample (%d bytes after \"%s\") ---\n%s\n---\n", r->o.sample,
           r->o.prompt[0] == '\n' ? "\\n" : r->o.prompt, out);
done:
    model_destroy(m);
    free(params);
    free(ctx);
    free(zero);
    free(out);
}

static long peak_rss_bytes(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1)
            break;
    if (f)
        fclose(f);
    return kb * 1024;
}

/* ---- the report ---------------------------------------------------------- */

enum { R_PARAMS, R_GRADS, R_OPT, R_ACT, R_COMM, R_RSS, R_STATE_F, R_ACT_F, R_BUBBLE, R_BUSY,
       R_OFFLOADED, R_IO, R_IOWAIT, R_MOVED, R_NUM };

/* Every rank's memory and time split, printed by rank 0, then the run's
 * summary line.  busy/bubble: seconds over the timed steps. */
static void report(struct run *r, double busy, double bubble, double tok_s)
{
    struct par_memory m = par_memory(r->par);
    struct offload_stats os = par_offload_stats(r->par);
    const struct opts *o = &r->o;
    double psi = (double)model_layout(r->model)->total, dp = o->dp, z = o->zero;
    bool off = r->o.offload && strcmp(r->o.offload, "none") != 0;
    double state_f = psi * (4 / (z >= 3 && dp > 1 ? dp : 1) + 4 / (z >= 2 && dp > 1 ? dp : 1) +
                            (off ? 0 : 8 / (z >= 1 && dp > 1 ? dp : 1)));
    double slot = (double)model_slot_bytes(r->model);
    double mine[R_NUM] = {
        [R_PARAMS] = (double)m.params,  [R_GRADS] = (double)m.grads,
        [R_OPT] = (double)m.optimizer,  [R_ACT] = slot * pipe_peak_held(r->pipe),
        [R_COMM] = (double)m.comm,      [R_RSS] = (double)peak_rss_bytes(),
        [R_STATE_F] = state_f,          [R_ACT_F] = slot * pipe_held(&r->pc),
        [R_BUBBLE] = bubble,            [R_BUSY] = busy,
        [R_OFFLOADED] = (double)m.offloaded, [R_IO] = os.io_s, [R_IOWAIT] = os.wait_s,
        [R_MOVED] = (double)(os.bytes_read + os.bytes_written),
    };
    double *all = calloc((size_t)r->n * R_NUM, sizeof(double));
    if (all == NULL)
        return;
    memcpy(all, mine, sizeof(mine));
    if (r->n > 1 && weft_allgather(mine, all, R_NUM, WEFT_FLOAT64, r->world) != WEFT_OK) {
        free(all);
        return;
    }
    if (r->rank == 0) {
        printf("memory per rank (MB): rank  params   grads  optimizer  activations  comm-buffers"
               "  model-state  peak-RSS | formulas: model-state activations | bubble\n");
        double fb = 0, wb = 0;
        for (int q = 0; q < r->n; q++) {
            double *a = all + R_NUM * q;
            double frac = a[R_BUSY] + a[R_BUBBLE] > 0 ? a[R_BUBBLE] / (a[R_BUSY] + a[R_BUBBLE]) : 0;
            printf("                      %4d %8.2f %7.2f %10.2f %12.2f %13.2f %12.2f %9.1f | "
                   "%8.2f %8.2f | %5.1f%%\n",
                   q, a[R_PARAMS] / 1e6, a[R_GRADS] / 1e6, a[R_OPT] / 1e6, a[R_ACT] / 1e6,
                   a[R_COMM] / 1e6, (a[R_PARAMS] + a[R_GRADS] + a[R_OPT]) / 1e6, a[R_RSS] / 1e6,
                   a[R_STATE_F] / 1e6, a[R_ACT_F] / 1e6, 100 * frac);
            fb += frac;
            wb += a[R_MOVED];
        }
        if (off) {
            double *a = all;
            printf("offload %s: %.1f MB of moments kept out of memory per rank (rank 0); %.1f MB "
                   "moved in all; rank 0 spent %.3f s in I/O, %.3f s of it waiting\n",
                   o->offload, a[R_OFFLOADED] / 1e6, wb / 1e6, a[R_IO], a[R_IOWAIT]);
        }
        /* The schedule's own prediction with the stages' measured compute
         * (unequal stages idle more than the formula's equal ones): a
         * stage of t per micro-batch, makespan sum(t) + (m-1) max(t). */
        double p = o->pp, mm = o->accum, tsum = 0, tmax = 0, t[MAX_STAGES] = {0};
        int per = r->n / o->pp;
        for (int q = 0; q < r->n; q++)
            t[q / per] += all[R_NUM * q + R_BUSY] / per / mm;
        for (int st = 0; st < o->pp; st++) {
            tsum += t[st];
            tmax = fmax(tmax, t[st]);
        }
        double span = tsum + (mm - 1) * tmax, pred = 0;
        for (int st = 0; st < o->pp && span > 0; st++)
            pred += (1 - mm * t[st] / span) / o->pp;
        printf("layout dp %d tp %d pp %d zero %d%s%s: %.0f tokens/s; bubble %.1f%% measured, "
               "%.1f%% by (p-1)/(m+p-1), %.1f%% from the stages' own compute times\n",
               o->dp, o->tp, o->pp, o->zero,
               o->pp > 1 ? (o->f1b1 ? " 1f1b" : " gpipe") : "", r->det ? " deterministic" : "",
               tok_s, 100 * fb / r->n, 100 * (p - 1) / (mm + p - 1), 100 * pred);
    }
    free(all);
}

/* ---- training -------------------------------------------------------------- */

/* Initial or resumed state of this rank's part. */
static int load_state(struct run *r, long *start)
{
    const struct opts *o = &r->o;
    const struct model_layout *lay = model_layout(r->model);
    size_t psi = model_global_size(r->model);
    float *whole[3] = {0}, *local[3] = {0};
    int rc = -1;
    *start = 0;
    if (o->resume) {
        struct ckpt_header h;
        char err[512];
        if (ckpt_read(o->resume, &h, &whole[0], &whole[1], &whole[2], err, sizeof(err)) != 0) {
            fprintf(stderr, "weft-train: %s\n", err);
            return -1;
        }
        *start = h.step;
    } else {
        if ((whole[0] = malloc(psi * sizeof(float))) == NULL)
            goto out;
        model_init_params(r->model, whole[0], o->seed);
    }
    for (int k = 0; k < 3; k++) {
        if (whole[k] == NULL)
            continue;
        if ((local[k] = malloc(lay->total * sizeof(float))) == NULL)
            goto out;
        model_to_local(r->model, whole[k], local[k]);
    }
    rc = par_import(r->par, local[0], local[1], local[2], *start);
out:
    for (int k = 0; k < 3; k++) {
        free(whole[k]);
        free(local[k]);
    }
    if (rc != 0)
        fprintf(stderr, "weft-train: cannot set up the model state\n");
    return rc;
}

static int train(struct run *r)
{
    struct opts *o = &r->o;
    long start;
    if (load_state(r, &start) != 0)
        return -1;
    long tokens_per_step = (long)r->global * o->B * o->T;
    double t_start = now_s(), busy = 0, bubble = 0, timed = 0;
    long ntimed = 0;
    if (r->log)
        fprintf(r->log, "step,train_loss,val_loss,lr,tokens_per_s,compute_ms,comm_ms,bubble_ms,"
                        "loss_bits\n# label: %s\n",
                o->label ? o->label : "run");
    for (long step = start; step < o->steps; step++) {
        double t0 = now_s(), w0 = par_wait_seconds(r->par), sum = 0;
        char path[4096];
        float lr = lr_at(o, step), norm = 0;
        double c0 = pipe_compute_seconds(r->pipe), pb;
        struct draw_ctx dc = {r, step};
        par_zero_grads(r->par);
        if (pipe_step(r->pipe, draw, &dc, r->tok, r->tgt, &sum, &pb) != 0)
            return -1;
        if (r->tpi != 0) /* the tensor-parallel group computed one loss */
            sum = 0;
        struct adamw opt = {lr, 0.9f, 0.95f, 1e-8f, o->wd, o->clip};
        if (par_sum(r->par, &sum, 1) != WEFT_OK || par_step(r->par, &opt, r->global, &norm) != WEFT_OK)
            return -1;
        double loss = sum / r->global;
        double dt = now_s() - t0, wait = par_wait_seconds(r->par) - w0;
        if (step > start) { /* the first step pays page faults and connection set-up */
            busy += pipe_compute_seconds(r->pipe) - c0;
            bubble += pb;
            timed += dt;
            ntimed++;
        }
        double val = NAN;
        bool last = step + 1 == o->steps;
        if ((o->eval_every && (step + 1) % o->eval_every == 0) || last)
            if (validate(r, &val) != 0)
                return -1;
        if (r->rank == 0) {
            double eta = (now_s() - t_start) / (double)(step + 1 - start) * (double)(o->steps - step - 1);
            printf("step %5ld/%d | loss %.4f | lr %.2e | norm %.2f | %6.1f ktok/s | compute %.1f ms "
                   "+ comm wait %.1f ms + bubble %.1f ms | ETA %dm%02ds",
                   step + 1, o->steps, loss, lr, norm, tokens_per_step / dt / 1e3,
                   (dt - wait - pb) * 1e3, wait * 1e3, pb * 1e3, (int)eta / 60, (int)eta % 60);
            if (!isnan(val))
                printf(" | val %.4f", val);
            printf("\n");
            fflush(stdout);
        }
        if (r->log) {
            fprintf(r->log, "%ld,%.9g,", step + 1, loss);
            if (!isnan(val))
                fprintf(r->log, "%.9g", val);
            fprintf(r->log, ",%.6g,%.1f,%.3f,%.3f,%.3f,%a\n", lr, tokens_per_step / dt,
                    (dt - wait - pb) * 1e3, wait * 1e3, pb * 1e3, loss);
            fflush(r->log);
        }
        if (last && r->rank == 0)
            printf("validation loss %.4f nats/byte; byte-unigram entropy of the training text "
                   "%.4f nats/byte\n",
                   val, data_unigram_entropy(&r->data));
        if (o->save && ((o->save_every && (step + 1) % o->save_every == 0) || last) &&
            save(r, subst(o->save, "%d", step + 1, path, sizeof(path)), step + 1) != 0) {
            if (r->rank == 0)
                fprintf(stderr, "weft-train: checkpoint at step %ld not saved; %s\n", step + 1,
                        last ? "giving up" : "training goes on");
            if (last)
                return -1;
        }
    }
    report(r, busy, bubble, ntimed ? tokens_per_step * ntimed / timed : 0);
    return 0;
}

/* The checkpoint fixes the model, the batch shape and the data order. */
static int adopt_checkpoint(struct run *r)
{
    struct opts *o = &r->o;
    struct ckpt_header h;
    float *a, *b, *c;
    char err[512];
    if (ckpt_read(o->resume, &h, &a, &b, &c, err, sizeof(err)) != 0) {
        fprintf(stderr, "weft-train: %s\n", err);
        return -1;
    }
    free(a);
    free(b);
    free(c);
    o->cfg = h.cfg;
    o->seed = h.seed;
    o->B = h.batch;
    o->T = h.t;
    if (!o->accum_set && h.global % o->dp == 0)
        o->accum = h.global / o->dp;
    if (o->accum * o->dp != h.global) {
        fprintf(stderr, "weft-train: %s was trained with %d micro-batches per step; --dp %d x "
                        "--accum %d differ\n",
                o->resume, h.global, o->dp, o->accum);
        return -1;
    }
    return 0;
}

static int setup(struct run *r)
{
    struct opts *o = &r->o;
    char err[512];
    if (check_layout(o) != 0 || split_stages(r) != 0)
        return -1;
    r->global = o->dp * o->accum;
    if (data_load(o->data, o->val_fraction, (size_t)(o->T + 2) * (size_t)r->global, &r->data,
                  err, sizeof(err)) != 0) {
        fprintf(stderr, "weft-train: %s\n", err);
        return -1;
    }
    r->pc = (struct pipe_config){r->ppc, r->ppi, o->pp, o->f1b1, o->accum, o->B, o->T, r->rank};
    struct model_part part = {o->tp, r->tpi, r->stage_lo[r->ppi], r->stage_lo[r->ppi + 1],
                              pipe_held(&r->pc)};
    r->model = model_create_part(&o->cfg, &part, o->B, o->T);
    if (r->model == NULL)
        return -1;
    const char *det = getenv("WEFT_DETERMINISTIC");
    r->det = det && strcmp(det, "0") != 0;
    struct par_config pc = {r->dpc, r->tpc, r->world, o->zero, (size_t)(o->bucket_mb * 1048576),
                            r->det, o->accum, {OFFLOAD_NONE, ""}, r->rank};
    if (o->offload && offload_parse(o->offload, &pc.offload, err, sizeof(err)) != 0) {
        fprintf(stderr, "weft-train: --offload: %s\n", err);
        return -1;
    }
    r->par = par_create(&pc, r->model);
    if (r->par == NULL)
        return -1;
    bool first = r->ppi == 0;
    if (o->pp > 1 && (first || last_stage(r)))
        par_tie(r->par, r->ppc, first ? o->pp - 1 : 0,
                first ? 0 : model_layout(r->model)->nunits - 1, first);
    r->tok = malloc((size_t)o->B * o->T);
    r->tgt = malloc((size_t)o->B * o->T);
    r->pipe = pipe_create(&r->pc, r->model, r->par);
    if (r->tok == NULL || r->tgt == NULL || r->pipe == NULL)
        return -1;
    return 0;
}

int main(int argc, char **argv)
{
    struct run r = {0};
    int rc = 1;
    if (parse(argc, argv, &r.o) != 0)
        return 2;
    if (world(&r) != 0)
        goto out;
    struct opts *o = &r.o;
    if (o->resume && adopt_checkpoint(&r) != 0)
        goto out;
    if (setup(&r) != 0)
        goto out;
    if (r.rank == 0) {
        printf("weft-train: %zu parameters (L=%d C=%d H=%d T=%d), %d rank(s): dp %d x tp %d x "
               "pp %d, ZeRO-%d, %d x %d micro-batches of %dx%d bytes per step, %zu training "
               "bytes%s\n",
               model_global_size(r.model), o->cfg.layers, o->cfg.channels, o->cfg.heads, o->T,
               r.n, o->dp, o->tp, o->pp, o->dp > 1 ? o->zero : 0, o->dp, o->accum, o->B, o->T,
               r.data.train_n, r.det ? ", deterministic" : "");
        if (o->pp > 1) {
            printf("stages (layers):");
            for (int s = 0; s < o->pp; s++)
                printf(" [%d, %d)", r.stage_lo[s], r.stage_lo[s + 1]);
            printf(", %s schedule\n", o->f1b1 ? "1F1B" : "GPipe");
        }
    }
    /* Rank 0 logs; with "%r" in the path, every rank logs its own times. */
    char logpath[4096];
    if (o->log && (r.rank == 0 || strstr(o->log, "%r")) &&
        (r.log = fopen(subst(o->log, "%r", r.rank, logpath, sizeof(logpath)), "w")) == NULL) {
        perror(logpath);
        goto out;
    }
    if (train(&r) != 0)
        goto out;
    if (o->sample > 0)
        sample(&r);
    rc = 0;
out:
    if (r.log)
        fclose(r.log);
    free(r.tok);
    free(r.tgt);
    pipe_destroy(r.pipe);
    par_destroy(r.par);
    model_destroy(r.model);
    data_free(&r.data);
    weft_comm_t sub[3] = {r.tpc, r.dpc, r.ppc};
    for (int k = 0; k < 3; k++)
        if (sub[k])
            (rc == 0 ? weft_comm_destroy : weft_comm_abort)(sub[k]);
    if (rc == 0)
        weft_comm_destroy(r.world);
    else
        weft_comm_abort(r.world); /* the others learn it from the broken links */
    return rc;
}
