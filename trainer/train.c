/*
 * train.c - weft-train: trains the GPT of model.h on a text file, serially
 * or data-parallel with ZeRO 0-3 over weft.  Launch N ranks with weftrun
 * (or mpirun/srun):
 *
 *   weftrun -n 4 weft-train --data text.txt --zero 3 --steps 200
 *
 * Every rank draws the micro-batches of its slice of the global batch
 * (data.h), so a run with --dp N --accum K sees exactly the batches of a
 * serial run with --accum N*K.
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
#include "parallel.h"
#include "weft.h"

struct opts {
    const char *data, *save, *resume, *log, *label, *prompt;
    struct model_config cfg;
    int B, T, steps, accum, dp, zero, warmup, eval_every, val_batches, save_every, sample;
    bool accum_set;
    float lr, min_lr_frac, clip, wd;
    uint64_t seed;
    double bucket_mb, val_fraction;
};

/* What one run needs besides the options. */
struct run {
    struct opts o;
    weft_comm_t comm;
    int rank, n, global;
    struct dataset data;
    struct model *model;
    struct par *par;
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
            "  batch:    --batch B (8) --accum K (1) --dp N (ranks started) --zero 0|1|2|3 (0)\n"
            "  optimizer: --steps S (100) --lr X (1e-3) --min-lr-frac F (0.1) --warmup W (10)\n"
            "            --weight-decay D (0.1) --clip G (1.0) --bucket-mb M (1)\n"
            "  data:     --seed S (1) --val-fraction F (0.1) --val-batches V (8)\n"
            "            --eval-every E (0: at the end)\n"
            "  output:   --log CSV --label TEXT --save CKPT (%%d: the step) --save-every E\n"
            "            --resume CKPT\n"
            "            --sample NBYTES (200) --prompt TEXT\n");
}

static int parse(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.cfg = {MODEL_VOCAB, 64, 2, 64, 4}, .B = 8, .T = 64, .steps = 100,
                       .accum = 1, .dp = 0, .zero = 0, .warmup = 10, .val_batches = 8,
                       .sample = 200, .lr = 1e-3f, .min_lr_frac = 0.1f, .clip = 1.0f,
                       .wd = 0.1f, .seed = 1, .bucket_mb = 1, .val_fraction = 0.1,
                       .prompt = "\n"};
    static const struct option lo[] = {
        {"data", 1, 0, 'd'}, {"layers", 1, 0, 'L'}, {"channels", 1, 0, 'C'},
        {"heads", 1, 0, 'H'}, {"context", 1, 0, 'T'}, {"batch", 1, 0, 'B'},
        {"accum", 1, 0, 'K'}, {"dp", 1, 0, 'N'}, {"zero", 1, 0, 'Z'}, {"steps", 1, 0, 's'},
        {"lr", 1, 0, 'r'}, {"min-lr-frac", 1, 0, 'm'}, {"warmup", 1, 0, 'w'},
        {"weight-decay", 1, 0, 'D'}, {"clip", 1, 0, 'c'}, {"bucket-mb", 1, 0, 'b'},
        {"seed", 1, 0, 'S'}, {"val-fraction", 1, 0, 'v'}, {"val-batches", 1, 0, 'V'},
        {"eval-every", 1, 0, 'e'}, {"log", 1, 0, 'l'}, {"label", 1, 0, 'a'},
        {"save", 1, 0, 'o'}, {"save-every", 1, 0, 'E'}, {"resume", 1, 0, 'R'},
        {"sample", 1, 0, 'x'}, {"prompt", 1, 0, 'p'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
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
        case 'h': usage(stdout); exit(0);
        case '?': usage(stderr); return -1;
        default: break;
        }
        if (!num || v < 0) {
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
        o->val_fraction >= 1 || o->val_batches < 1) {
        fprintf(stderr, "weft-train: --zero 0..3, --batch >= 1, --context >= 2, --accum >= 1, "
                        "0 < --val-fraction < 1, --val-batches >= 1\n");
        return -1;
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

/* Mean loss over V validation batches shared among the ranks. */
static int validate(struct run *r, double *loss)
{
    int per = (r->o.val_batches + r->n - 1) / r->n, total = per * r->n;
    double sum = 0;
    for (int k = 0; k < per; k++) {
        data_val_batch(&r->data, r->rank * per + k, total, r->o.B, r->o.T, r->tok, r->tgt);
        par_begin_forward(r->par);
        sum += model_forward(r->model, NULL, par_hooks(r->par), r->tok, r->tgt, r->o.B, r->o.T);
    }
    if (par_sum(r->par, &sum, 1) != WEFT_OK)
        return -1;
    *loss = sum / total;
    return 0;
}

/* Collective: the whole state to rank 0, which writes it; every rank
 * learns whether it worked. */
static int save(struct run *r, const char *path, long step)
{
    const struct model_layout *lay = model_layout(r->model);
    float *buf[3] = {0};
    int ok = 1;
    for (int k = 0; k < 3; k++) {
        if (r->rank == 0 && (buf[k] = malloc(lay->total * sizeof(float))) == NULL)
            ok = 0;
        if (par_export(r->par, k, buf[k]) != WEFT_OK)
            ok = 0;
    }
    char err[512] = "out of memory";
    if (r->rank == 0 && ok) {
        struct ckpt_header h = {*model_config(r->model), lay->total, step, r->global, r->o.B,
                                r->o.T, r->o.seed};
        ok = ckpt_write(path, &h, buf[0], buf[1], buf[2], err, sizeof(err)) == 0;
        if (!ok)
            fprintf(stderr, "weft-train: %s\n", err);
    }
    for (int k = 0; k < 3; k++)
        free(buf[k]);
    double agree = ok;
    if (r->n > 1 && weft_broadcast(&agree, &agree, 1, WEFT_FLOAT64, 0, r->comm) != WEFT_OK)
        return -1;
    return agree > 0 ? 0 : -1;
}

/* The checkpoint path for step: the first "%d" of pattern becomes it. */
static const char *save_path(const char *pattern, long step, char *out, size_t len)
{
    const char *at = strstr(pattern, "%d");
    if (at == NULL)
        snprintf(out, len, "%s", pattern);
    else
        snprintf(out, len, "%.*s%ld%s", (int)(at - pattern), pattern, step, at + 2);
    return out;
}

static void sample(struct run *r)
{
    int T = r->o.T, len = 0;
    uint8_t *ctx = calloc((size_t)T, 1), *zero = calloc((size_t)T, 1);
    char *out = malloc((size_t)r->o.sample + 1);
    if (!ctx || !zero || !out)
        goto done;
    for (const char *p = r->o.prompt; *p && len < T; p++)
        ctx[len++] = (uint8_t)*p;
    if (len == 0)
        ctx[len++] = '\n';
    uint64_t rng = r->o.seed * 7919u + 17;
    for (int i = 0; i < r->o.sample; i++) {
        par_begin_forward(r->par);
        model_forward(r->model, NULL, par_hooks(r->par), ctx, zero, 1, len);
        const float *logit = model_last_logits(r->model, len);
        /* Temperature 0.8; identical on every rank, so ZeRO-3's gathers
         * stay in step. */
        double mx = logit[0], z = 0, cum = 0;
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
    if (r->rank == 0) {
        for (int i = 0; i < r->o.sample; i++) /* keep the terminal sane */
            if ((unsigned char)out[i] < 32 && out[i] != '\n' && out[i] != '\t')
                out[i] = '?';
        printf("--- sample (%d bytes after \"%s\") ---\n%s\n---\n", r->o.sample,
               r->o.prompt[0] == '\n' ? "\\n" : r->o.prompt, out);
    }
done:
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

/* Every rank's memory, printed by rank 0. */
static void report_memory(struct run *r)
{
    struct par_memory m = par_memory(r->par);
    double mine[6] = {(double)m.params, (double)m.grads, (double)m.optimizer,
                      (double)model_activation_bytes(r->model), (double)m.comm,
                      (double)peak_rss_bytes()};
    double *all = calloc((size_t)r->n * 6, sizeof(double));
    if (all == NULL)
        return;
    memcpy(all, mine, sizeof(mine));
    if (r->n > 1 && weft_allgather(mine, all, 6, WEFT_FLOAT64, r->comm) != WEFT_OK) {
        free(all);
        return;
    }
    if (r->rank == 0) {
        printf("memory per rank (MB): rank  params   grads  optimizer  activations  comm-buffers"
               "  model-state  peak-RSS\n");
        for (int q = 0; q < r->n; q++) {
            double *a = all + 6 * q;
            printf("                      %4d %8.2f %7.2f %10.2f %12.2f %13.2f %12.2f %9.1f\n",
                   q, a[0] / 1e6, a[1] / 1e6, a[2] / 1e6, a[3] / 1e6, a[4] / 1e6,
                   (a[0] + a[1] + a[2]) / 1e6, a[5] / 1e6);
        }
    }
    free(all);
}

static int world(struct run *r)
{
    static const char *const sizes[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                        "SLURM_NTASKS", NULL};
    r->n = 1;
    for (const char *const *v = sizes; *v; v++)
        if (getenv(*v) && atoi(getenv(*v)) > 1) {
            if (weft_comm_init_env(&r->comm) != WEFT_OK) {
                fprintf(stderr, "weft-train: %s\n", weft_last_error(NULL));
                return -1;
            }
            weft_comm_rank(r->comm, &r->rank);
            weft_comm_size(r->comm, &r->n);
            break;
        }
    if (r->o.dp && r->o.dp != r->n) {
        fprintf(stderr, "weft-train: --dp %d but %d rank(s) were started (weftrun -n %d ...)\n",
                r->o.dp, r->n, r->o.dp);
        return -1;
    }
    return 0;
}

static int train(struct run *r)
{
    struct opts *o = &r->o;
    const struct model_layout *lay = model_layout(r->model);
    long start = 0;
    float *full = NULL, *m = NULL, *v = NULL;
    if (o->resume) {
        struct ckpt_header h;
        char err[512];
        if (ckpt_read(o->resume, &h, &full, &m, &v, err, sizeof(err)) != 0) {
            fprintf(stderr, "weft-train: %s\n", err);
            return -1;
        }
        start = h.step;
    } else {
        full = malloc(lay->total * sizeof(float));
        if (full == NULL)
            return -1;
        model_init_params(r->model, full, o->seed);
    }
    par_import(r->par, full, m, v, start);
    free(full);
    free(m);
    free(v);

    long tokens_per_step = (long)r->global * o->B * o->T;
    double t_start = now_s(), loss = 0;
    if (r->rank == 0 && r->log)
        fprintf(r->log, "step,train_loss,val_loss,lr,tokens_per_s,compute_ms,comm_ms\n# label: "
                        "%s\n",
                o->label ? o->label : "run");
    for (long step = start; step < o->steps; step++) {
        double t0 = now_s(), w0 = par_wait_seconds(r->par), sum = 0;
        char path[4096];
        float lr = lr_at(o, step), norm = 0;
        par_zero_grads(r->par);
        for (int k = 0; k < o->accum; k++) {
            data_train_batch(&r->data, o->seed, (uint64_t)step, r->rank * o->accum + k,
                             r->global, o->B, o->T, r->tok, r->tgt);
            par_begin_forward(r->par);
            sum += model_forward(r->model, NULL, par_hooks(r->par), r->tok, r->tgt, o->B, o->T);
            par_begin_backward(r->par, k == o->accum - 1);
            model_backward(r->model, NULL, NULL, par_hooks(r->par));
            if (par_end_backward(r->par) != WEFT_OK)
                return -1;
        }
        struct adamw opt = {lr, 0.9f, 0.95f, 1e-8f, o->wd, o->clip};
        if (par_sum(r->par, &sum, 1) != WEFT_OK || par_step(r->par, &opt, r->global, &norm) != WEFT_OK)
            return -1;
        loss = sum / r->global;
        double dt = now_s() - t0, wait = par_wait_seconds(r->par) - w0;
        double val = NAN;
        bool last = step + 1 == o->steps;
        if ((o->eval_every && (step + 1) % o->eval_every == 0) || last)
            if (validate(r, &val) != 0)
                return -1;
        if (r->rank == 0) {
            double eta = (now_s() - t_start) / (double)(step + 1 - start) * (double)(o->steps - step - 1);
            printf("step %5ld/%d | loss %.4f | lr %.2e | norm %.2f | %6.1f ktok/s | compute %.1f ms "
                   "+ comm wait %.1f ms | ETA %dm%02ds",
                   step + 1, o->steps, loss, lr, norm, tokens_per_step / dt / 1e3,
                   (dt - wait) * 1e3, wait * 1e3, (int)eta / 60, (int)eta % 60);
            if (!isnan(val))
                printf(" | val %.4f", val);
            printf("\n");
            fflush(stdout);
            if (r->log) {
                fprintf(r->log, "%ld,%.9g,", step + 1, loss);
                if (!isnan(val))
                    fprintf(r->log, "%.9g", val);
                fprintf(r->log, ",%.6g,%.1f,%.3f,%.3f\n", lr, tokens_per_step / dt,
                        (dt - wait) * 1e3, wait * 1e3);
                fflush(r->log);
            }
        }
        if (last && r->rank == 0)
            printf("validation loss %.4f nats/byte; byte-unigram entropy of the training text "
                   "%.4f nats/byte\n",
                   val, data_unigram_entropy(&r->data));
        if (o->save && ((o->save_every && (step + 1) % o->save_every == 0) || last) &&
            save(r, save_path(o->save, step + 1, path, sizeof(path)), step + 1) != 0) {
            if (r->rank == 0)
                fprintf(stderr, "weft-train: checkpoint at step %ld not saved; %s\n", step + 1,
                        last ? "giving up" : "training goes on");
            if (last)
                return -1;
        }
    }
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
    if (o->resume) { /* the checkpoint fixes the model and the data order */
        struct ckpt_header h;
        float *a, *b, *c;
        char err[512];
        if (ckpt_read(o->resume, &h, &a, &b, &c, err, sizeof(err)) != 0) {
            fprintf(stderr, "weft-train: %s\n", err);
            goto out;
        }
        free(a);
        free(b);
        free(c);
        o->cfg = h.cfg;
        o->seed = h.seed;
        if (h.batch != o->B || h.t != o->T) {
            o->B = h.batch;
            o->T = h.t;
        }
        if (!o->accum_set && h.global % r.n == 0)
            o->accum = h.global / r.n;
        if (o->accum * r.n != h.global) {
            fprintf(stderr, "weft-train: %s was trained with %d micro-batches per step; %d "
                            "ranks x --accum %d differ\n",
                    o->resume, h.global, r.n, o->accum);
            goto out;
        }
    }
    r.global = r.n * o->accum;
    char err[512];
    if (data_load(o->data, o->val_fraction, (size_t)(o->T + 2) * (size_t)r.global, &r.data, err,
                  sizeof(err)) != 0) {
        fprintf(stderr, "weft-train: %s\n", err);
        goto out;
    }
    r.model = model_create(&o->cfg, o->B, o->T);
    if (r.model == NULL)
        goto out;
    r.par = par_create(r.comm, o->zero, model_layout(r.model), (size_t)(o->bucket_mb * 1048576));
    r.tok = malloc((size_t)o->B * o->T);
    r.tgt = malloc((size_t)o->B * o->T);
    if (r.par == NULL || r.tok == NULL || r.tgt == NULL)
        goto out;
    if (r.rank == 0) {
        if (o->log && (r.log = fopen(o->log, "w")) == NULL) {
            perror(o->log);
            goto out;
        }
        printf("weft-train: %zu parameters (L=%d C=%d H=%d T=%d), %d rank(s), ZeRO-%d, %d x %d "
               "micro-batches of %dx%d bytes per step, %zu training bytes\n",
               model_layout(r.model)->total, o->cfg.layers, o->cfg.channels, o->cfg.heads, o->T,
               r.n, r.n > 1 ? o->zero : 0, r.n, o->accum, o->B, o->T, r.data.train_n);
    }
    if (train(&r) != 0)
        goto out;
    report_memory(&r);
    if (o->sample > 0)
        sample(&r);
    rc = 0;
out:
    if (r.log)
        fclose(r.log);
    free(r.tok);
    free(r.tgt);
    par_destroy(r.par);
    model_destroy(r.model);
    data_free(&r.data);
    if (rc == 0)
        weft_comm_destroy(r.comm);
    else
        weft_comm_abort(r.comm); /* the others learn it from the broken links */
    return rc;
}
