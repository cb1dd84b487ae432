/*
 * parallel.h - data parallelism and ZeRO stages 1-3 for the trainer, built
 * only from weft calls.  It owns the model state (parameters, gradients,
 * AdamW moments), whole or sharded, and gives the model hooks that gather
 * parameters before use and reduce gradients as soon as they are final.
 */
#ifndef WEFT_TRAINER_PARALLEL_H
#define WEFT_TRAINER_PARALLEL_H

#include <stdbool.h>
#include <stddef.h>

#include "model.h"
#include "weft.h"

struct adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float clip; /* max global gradient norm; <= 0: no clipping */
};

/* Bytes this rank holds, by kind (the peak is reached at the same time for
 * all of them: they are allocated once). */
struct par_memory {
    size_t params, grads, optimizer, comm;
};

struct par;

/* comm NULL (or 1 rank): serial.  zero 0..3.  bucket_bytes: gradient
 * bucket size for zero 0.  NULL with a message on stderr on failure. */
struct par *par_create(weft_comm_t comm, int zero, const struct model_layout *layout,
                       size_t bucket_bytes);
void par_destroy(struct par *p); /* NULL ok */
/* Takes this rank's part of whole (unpadded, Ψ floats each) state; m and
 * v may be NULL (zeros).  step: optimizer steps already taken. */
void par_import(struct par *p, const float *params, const float *m, const float *v, long step);
/* Collective: the whole state in the unpadded layout into out (Ψ floats)
 * on every rank where out is not NULL.  which: 0 params, 1 m, 2 v. */
weft_status_t par_export(struct par *p, int which, float *out);

/* The hooks for model_forward/model_backward; flat buffers are unused. */
const struct model_hooks *par_hooks(struct par *p);
/* Before the step's first micro-batch: zero the gradients. */
void par_zero_grads(struct par *p);
/* Brackets of one micro-batch's passes.  last: the step's final
 * micro-batch (gradients of zero 0/1 are reduced only then). */
void par_begin_forward(struct par *p);
void par_begin_backward(struct par *p, bool last);
weft_status_t par_end_backward(struct par *p);
/* Averages the gradients over `global` micro-batches, clips by global norm,
 * updates with AdamW (bias-corrected) and makes the parameters whole again
 * where the stage keeps them whole.  *norm gets the norm before clipping. */
weft_status_t par_step(struct par *p, const struct adamw *opt, int global, float *norm);
/* Collective: sums v over ranks (for losses). */
weft_status_t par_sum(struct par *p, double *v, int n);

struct par_memory par_memory(const struct par *p);
double par_wait_seconds(const struct par *p); /* time blocked on weft so far */
long par_steps(const struct par *p);

#endif /* WEFT_TRAINER_PARALLEL_H */
