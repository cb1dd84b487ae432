/*
 * pipeline.h - one pipeline stage's share of a training step: micro-batches
 * through this rank's model part under GPipe or 1F1B, activations and
 * gradients to and from the neighbouring stages with weft send/recv, and
 * the time the stage spends computing and idle (the bubble).
 */
#ifndef WEFT_TRAINER_PIPELINE_H
#define WEFT_TRAINER_PIPELINE_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "parallel.h"
#include "weft.h"

struct pipe_config {
    weft_comm_t comm;  /* the pipeline group; NULL: one stage */
    int stage, stages; /* this rank's place, and pp */
    bool f1b1;         /* 1F1B, else GPipe */
    int micro;         /* micro-batches per step (m) */
    int B, T;          /* a micro-batch's shape */
    int rank;          /* for messages */
};

/* Micro-batches a stage holds at once: 1 without a pipeline, m under
 * GPipe, min(m, stages - stage) under 1F1B.  The model part needs this
 * many slots. */
int pipe_held(const struct pipe_config *c);

/* Owner: the trainer.  Holds neither the model nor the model state, only
 * the sends in flight and the clocks. */
struct pipe;

struct pipe *pipe_create(const struct pipe_config *c, struct model *model, struct par *par);
void pipe_destroy(struct pipe *p); /* NULL ok */

/* Fills micro-batch j of the step into tok, tgt. */
typedef void (*pipe_draw_fn)(void *ctx, int j, uint8_t *tok, uint8_t *tgt);

/* One step's forward and backward passes under the schedule; tok, tgt:
 * B*T bytes each, the draw's buffers.  *loss_sum gets the sum of the
 * micro-batches' losses on the last stage (0 elsewhere); *bubble this
 * stage's idle time, from the schedule's start until every stage is done.
 * 0, or -1 with the reason on stderr. */
int pipe_step(struct pipe *p, pipe_draw_fn draw, void *ctx, uint8_t *tok, uint8_t *tgt,
              double *loss_sum, double *bubble);
/* A forward pass only (evaluation), in slot 0; *loss: the last stage's.
 * pipe_drain after the last one. */
int pipe_forward(struct pipe *p, const uint8_t *tok, const uint8_t *tgt, float *loss);
int pipe_drain(struct pipe *p);

double pipe_compute_seconds(const struct pipe *p); /* in passes so far, less weft waits */
int pipe_peak_held(const struct pipe *p);          /* micro-batches held at once, at most */

#endif /* WEFT_TRAINER_PIPELINE_H */
