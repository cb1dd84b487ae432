/*
 * pipeline.c - a stage's share of a step (see pipeline.h).
 *
 * Sends are non-blocking and waited for only before their buffer is used
 * again (a slot's output before the slot's next forward; d(input) and the
 * head's wte gradient before the next backward), so two stages that each
 * send before they receive never wait on each other.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "pipeline.h"

/*
 * Owner: the trainer.  Invariants: act_req[s] is the send of slot s's
 * output, if in flight; live counts the micro-batches forwarded and not
 * yet backwarded.
 */
struct pipe {
    struct pipe_config c;
    struct model *model;
    struct par *par;
    int slots;
    size_t act, dwte; /* floats of a stage's output and of the head's wte gradient */
    weft_request_t *act_req, grad_req, dwte_req;
    double compute;
    int live, peak;
};

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int pipe_held(const struct pipe_config *c)
{
    int m = c->micro;
    int warm = c->stages == 1 ? 0 : c->f1b1 ? c->stages - c->stage - 1 : m;
    return warm + 1 < m ? warm + 1 : m;
}

struct pipe *pipe_create(const struct pipe_config *c, struct model *model, struct par *par)
{
    struct pipe *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    const struct model_config *cfg = model_config(model);
    p->c = *c;
    p->model = model;
    p->par = par;
    p->slots = model_part(model)->slots;
    p->act = (size_t)c->B * c->T * cfg->channels;
    p->dwte = (size_t)cfg->vocab / model_part(model)->tp * cfg->channels;
    p->act_req = calloc((size_t)p->slots, sizeof(*p->act_req));
    if (p->act_req == NULL) {
        free(p);
        return NULL;
    }
    return p;
}

void pipe_destroy(struct pipe *p)
{
    if (p == NULL)
        return;
    free(p->act_req);
    free(p);
}

static bool first(const struct pipe *p)
{
    return p->c.stage == 0;
}

static bool last(const struct pipe *p)
{
    return p->c.stage == p->c.stages - 1;
}

static int wait_send(struct pipe *p, weft_request_t *req)
{
    if (*req == NULL)
        return 0;
    weft_status_t st = weft_wait(*req);
    *req = NULL;
    if (st != WEFT_OK) {
        fprintf(stderr, "weft-train: rank %d: pipeline send: %s\n", p->c.rank,
                weft_last_error(p->c.comm));
        return -1;
    }
    return 0;
}

static int precv(struct pipe *p, void *buf, size_t floats, int peer, const char *what)
{
    if (weft_recv(buf, floats, WEFT_FLOAT32, peer, p->c.comm) != WEFT_OK) {
        fprintf(stderr, "weft-train: rank %d: pipeline receive of %s: %s\n", p->c.rank, what,
                weft_last_error(p->c.comm));
        return -1;
    }
    return 0;
}

static int psend(struct pipe *p, const void *buf, size_t floats, int peer, weft_request_t *req)
{
    if (weft_isend(buf, floats, WEFT_FLOAT32, peer, p->c.comm, req) != WEFT_OK) {
        fprintf(stderr, "weft-train: rank %d: pipeline send: %s\n", p->c.rank,
                weft_last_error(p->c.comm));
        return -1;
    }
    return 0;
}

/* Forward of the micro-batch in slot: receive the input, run, send the
 * output on.  *loss gets the last stage's loss. */
static int forward(struct pipe *p, int slot, const uint8_t *tok, const uint8_t *tgt, float *loss)
{
    if (wait_send(p, &p->act_req[slot]) != 0)
        return -1;
    if (!first(p) &&
        precv(p, model_input(p->model, slot), p->act, p->c.stage - 1, "activations") != 0)
        return -1;
    double t0 = now_s(), w0 = par_wait_seconds(p->par);
    par_begin_forward(p->par);
    float l = model_forward_slot(p->model, slot, NULL, par_hooks(p->par), tok, tgt, p->c.B,
                                 p->c.T);
    p->compute += now_s() - t0 - (par_wait_seconds(p->par) - w0);
    if (isnan(l))
        return -1;
    if (++p->live > p->peak)
        p->peak = p->live;
    *loss = l;
    if (!last(p))
        return psend(p, model_output(p->model, slot), p->act, p->c.stage + 1,
                     &p->act_req[slot]);
    return 0;
}

/* Backward of the micro-batch in slot: receive d(output) (and, on the
 * first stage of a pipeline, the head's wte gradient), run, send d(input)
 * back (and the head's wte gradient to the first stage). */
static int backward(struct pipe *p, int slot, bool last_micro)
{
    bool split = p->c.stages > 1;
    if (wait_send(p, &p->grad_req) != 0 || wait_send(p, &p->dwte_req) != 0)
        return -1;
    if (!last(p) &&
        precv(p, model_dstream(p->model), p->act, p->c.stage + 1, "gradients") != 0)
        return -1;
    if (split && first(p) && precv(p, model_head_dwte(p->model), p->dwte, p->c.stages - 1,
                                   "the head's wte gradient") != 0)
        return -1;
    double t0 = now_s(), w0 = par_wait_seconds(p->par);
    par_begin_backward(p->par, last_micro);
    int rc = model_backward_slot(p->model, slot, NULL, NULL, par_hooks(p->par));
    if (par_end_backward(p->par) != WEFT_OK)
        rc = -1;
    p->compute += now_s() - t0 - (par_wait_seconds(p->par) - w0);
    p->live--;
    if (rc != 0)
        return -1;
    if (!first(p) &&
        psend(p, model_dstream(p->model), p->act, p->c.stage - 1, &p->grad_req) != 0)
        return -1;
    if (split && last(p) && psend(p, model_head_dwte(p->model), p->dwte, 0, &p->dwte_req) != 0)
        return -1;
    return 0;
}

int pipe_drain(struct pipe *p)
{
    int rc = 0;
    for (int s = 0; s < p->slots; s++)
        rc |= wait_send(p, &p->act_req[s]);
    rc |= wait_send(p, &p->grad_req);
    rc |= wait_send(p, &p->dwte_req);
    return rc;
}

/*
 * The schedule.  GPipe: every forward, then every backward (in micro-batch
 * order, which the deterministic accumulator needs).  1F1B: stages - stage
 * - 1 forwards to fill the pipe, then one forward and one backward in
 * turn, then the remaining backwards.  A slot is free again once its
 * backward is done, and the live micro-batches are consecutive, so j %
 * slots never collides.
 */
static int schedule(struct pipe *p, pipe_draw_fn draw, void *ctx, uint8_t *tok, uint8_t *tgt,
                    double *sum)
{
    int m = p->c.micro, ahead = pipe_held(&p->c) - 1;
    int f = 0, b = 0;
    float l = 0;
    while (b < m) {
        if (f < m && f - b <= ahead) {
            draw(ctx, f, tok, tgt);
            if (forward(p, f % p->slots, tok, tgt, &l) != 0)
                return -1;
            *sum += last(p) ? l : 0;
            f++;
        } else {
            if (backward(p, b % p->slots, b == m - 1) != 0)
                return -1;
            b++;
        }
    }
    return pipe_drain(p);
}

/*
 * The bubble: from the schedule's start until every stage has finished
 * its own (a barrier of the pipeline group), the time this stage was
 * neither computing nor waiting on data- or tensor-parallel communication.
 * That is its share of the (p-1)/(m+p-1) the schedule leaves idle,
 * wherever it falls: waiting for the first activations, for gradients, or
 * for the last stage to drain.
 */
int pipe_step(struct pipe *p, pipe_draw_fn draw, void *ctx, uint8_t *tok, uint8_t *tgt,
              double *loss_sum, double *bubble)
{
    double t0 = now_s(), w0 = par_wait_seconds(p->par), c0 = p->compute;
    *bubble = 0;
    if (schedule(p, draw, ctx, tok, tgt, loss_sum) != 0)
        return -1;
    if (p->c.comm == NULL)
        return 0;
    double token = 0;
    if (weft_allreduce(&token, &token, 1, WEFT_FLOAT64, WEFT_SUM, p->c.comm) != WEFT_OK) {
        fprintf(stderr, "weft-train: rank %d: pipeline barrier: %s\n", p->c.rank,
                weft_last_error(p->c.comm));
        return -1;
    }
    *bubble = now_s() - t0 - (p->compute - c0) - (par_wait_seconds(p->par) - w0);
    return 0;
}

int pipe_forward(struct pipe *p, const uint8_t *tok, const uint8_t *tgt, float *loss)
{
    if (forward(p, 0, tok, tgt, loss) != 0)
        return -1;
    p->live--; /* no backward follows */
    return 0;
}

double pipe_compute_seconds(const struct pipe *p)
{
    return p->compute;
}

int pipe_peak_held(const struct pipe *p)
{
    return p->peak;
}
