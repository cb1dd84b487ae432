/*
 * parallel.h - data parallelism and ZeRO stages 1-3 for the trainer, inside
 * one (tensor, pipeline) cell of a 3D layout, built only from weft calls.
 * It owns the model state of this rank's part (parameters, gradients,
 * AdamW moments), whole or sharded over the data-parallel group, gives the
 * model hooks that gather parameters before use and reduce gradients as
 * soon as they are final, and runs the tensor-parallel reductions.
 *
 * Deterministic mode (WEFT_DETERMINISTIC=1) makes every layout compute the
 * serial run's bits: each micro-batch's gradient is taken alone, reduced
 * over the data-parallel ranks in the canonical tree (detsum.h; rank r
 * draws global micro-batches j*dp + r), and the micro-batches' results
 * meet in the canonical tree too; tensor-parallel sums continue the
 * model's chunk tree; the gradient norm is an order-free integer sum.
 */
#ifndef WEFT_TRAINER_PARALLEL_H
#define WEFT_TRAINER_PARALLEL_H

#include <stdbool.h>
#include <stddef.h>

#include "model.h"
#include "offload.h"
#include "weft.h"

struct adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float clip; /* max global gradient norm; <= 0: no clipping */
};

/* Bytes this rank holds, by kind (allocated once, so all at their peak
 * together).  optimizer: resident moments (chunk buffers when offloaded);
 * offloaded: moments kept out of the working set. */
struct par_memory {
    size_t params, grads, optimizer, comm, offloaded;
};

struct par_config {
    weft_comm_t dp;    /* data-parallel group; NULL: one rank */
    weft_comm_t tp;    /* tensor-parallel group; NULL: one rank */
    weft_comm_t world; /* every rank: the gradient norm, sums of losses; NULL: one */
    int zero;          /* 0..3 */
    size_t bucket_bytes; /* zero 0: gradient bucket size */
    bool det;          /* canonical-order sums */
    int micro;         /* micro-batches per step on this rank */
    struct offload_spec offload;
    int world_rank;    /* names the offload file */
};

struct par;

/* NULL with a message on stderr on failure. */
struct par *par_create(const struct par_config *cfg, const struct model *model);
void par_destroy(struct par *p); /* NULL ok */
/* The tied wte across pipeline stages: the first stage (send) hands its
 * final wte gradient to the last stage's copy (peer in comm) every step,
 * before either updates, so both take the same step. */
void par_tie(struct par *p, weft_comm_t comm, int peer, int unit, bool send);
/* Takes this rank's part of a whole local state (the part's layout,
 * unpadded); m and v may be NULL (zeros).  step: optimizer steps taken.
 * 0, or -1 (offload store failed, message on stderr). */
int par_import(struct par *p, const float *params, const float *m, const float *v, long step);
/* Collective over the dp group: the part's whole state (unpadded local
 * layout) into out where out is not NULL.  which: 0 params, 1 m, 2 v. */
weft_status_t par_export(struct par *p, int which, float *out);

/* The hooks for model passes; flat buffers are unused. */
const struct model_hooks *par_hooks(struct par *p);
/* Before the step's first micro-batch. */
void par_zero_grads(struct par *p);
/* Brackets of one micro-batch's passes.  last: the step's final
 * micro-batch on this rank. */
void par_begin_forward(struct par *p);
void par_begin_backward(struct par *p, bool last);
weft_status_t par_end_backward(struct par *p);
/* Averages the gradients over `global` micro-batches, clips by the global
 * norm (all ranks), updates with AdamW (bias-corrected) and makes the
 * parameters whole again where the stage keeps them whole.  *norm gets the
 * norm before clipping. */
weft_status_t par_step(struct par *p, const struct adamw *opt, int global, float *norm);
/* Collective over world: sums v (for losses). */
weft_status_t par_sum(struct par *p, double *v, int n);

struct par_memory par_memory(const struct par *p);
double par_wait_seconds(const struct par *p); /* time blocked on weft so far */
void par_add_wait(struct par *p, double s);   /* the caller's own waits */
/* Offload traffic so far (zeros without offload). */
struct offload_stats par_offload_stats(const struct par *p);
long par_steps(const struct par *p);
/* The first error's text (failed communication or offload). */
const char *par_error(const struct par *p);

#endif /* WEFT_TRAINER_PARALLEL_H */
