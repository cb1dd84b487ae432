/*
 * model.h - a GPT-2-shaped decoder-only transformer with hand-written
 * forward and backward passes, byte-level vocabulary, that can be cut into
 * tensor-parallel slices and pipeline stages.
 *
 * The whole model's parameters live in one flat float buffer cut into
 * units, in this order (the checkpoint layout):
 *   unit 0            WTE: wte (V, C)
 *   unit 1            WPE: wpe (maxT, C)
 *   unit 2 + l        LAYER l (l < L): ln1w (C), ln1b (C), qkvw (3C, C),
 *                     qkvb (3C), attprojw (C, C), attprojb (C), ln2w (C),
 *                     ln2b (C), fcw (4C, C), fcb (4C), fcprojw (C, 4C),
 *                     fcprojb (C)
 *   unit L + 2        LNF: lnfw (C), lnfb (C)
 * Weights are (out, in), row-major: y = x W^T + b.  The LM head is wte
 * (tied).  Gradients and optimizer state use the same layout.
 *
 * A part (struct model_part) is one rank's share: layers [lo, hi) of a
 * pipeline stage, each cut Megatron-style into tp slices: qkv, fc (and
 * their biases) by output rows, attproj and fcproj by input columns, wte
 * by vocabulary rows; LayerNorms, wpe and the row-parallel biases are
 * replicated.  A part has its own flat layout of local units in this
 * order: WTE, WPE (first stage), its layers, then LNF and a copy of WTE
 * (last stage; the copy only when the first stage is another part).
 *
 * Sums that a cut splits are done in one canonical order whatever the
 * cut, so every layout computes the same bits: a sum over the heads (the
 * attention projection's and the MLP's row-parallel products, cut in
 * `heads` chunks; the column-parallel backward products likewise) and over
 * 16 vocabulary chunks (the head's backward) is a pairwise tree over the
 * chunks, adjacent pairs first, each chunk summed from zero; the softmax
 * normaliser is a pairwise tree over the vocabulary.  The tensor-parallel
 * partial sums meet in the caller's allreduce (hooks.tp_allreduce), which
 * must continue the same tree across ranks (rank r holds chunks
 * [r*K/tp, (r+1)*K/tp)); a power-of-two number of chunks per rank keeps
 * that tree exact.
 */
#ifndef WEFT_TRAINER_MODEL_H
#define WEFT_TRAINER_MODEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define MODEL_VOCAB 256
#define MODEL_VCHUNKS 16 /* vocabulary chunks of the head's canonical sums */

struct model_config {
    int vocab;    /* V: 256 (bytes) */
    int max_t;    /* maxT: positions */
    int layers;   /* L */
    int channels; /* C, a multiple of heads */
    int heads;    /* NH */
};

/* Global units. */
enum { MODEL_WTE = 0, MODEL_WPE = 1, MODEL_LAYER0 = 2 };
#define MODEL_LNF(L) ((L) + 2)
#define MODEL_UNITS(L) ((L) + 3)

/* One rank's share of the model. */
struct model_part {
    int tp, tp_rank;   /* tensor-parallel width (divides heads and 16) and place */
    int lo, hi;        /* layers [lo, hi) */
    int slots;         /* micro-batches whose activations are held at once */
};

/* Where each local unit lies in the part's flat buffers (floats). */
struct model_layout {
    int nunits;       /* local units */
    size_t total;     /* floats in the part */
    size_t *unit_off; /* (nunits + 1): unit u is [unit_off[u], unit_off[u+1]) */
    int *unit_id;     /* (nunits): the global unit of each local unit */
};

/* A range of a local unit whose gradient this rank counts in the global
 * gradient norm (replicated tensors count on tp rank 0 only; the last
 * stage's copy of wte not at all). */
struct model_span {
    size_t off, len; /* floats from the unit's start */
};

/*
 * Memory and communication a pass needs, supplied by the caller.  Every
 * memory call names a local unit u.
 *  params(u)      the unit's parameters, valid until params_done(u).
 *  params_done(u) the stage no longer reads them.
 *  grads(u)       where the backward pass ACCUMULATES (+=) the unit's
 *                 gradients; once per backward pass per unit that gets any.
 *  grads_done(u)  the unit's gradients of this backward pass are complete.
 *  tp_allreduce   in place over the tensor-parallel group: op 0 sums
 *                 (continuing the canonical tree), op 1 takes the maximum;
 *                 dbl: doubles, else floats.  0 or -1.  Needed when tp > 1.
 * Memory hooks may be NULL; then they fall back to the flat buffers given
 * to model_forward/model_backward.
 */
struct model_hooks {
    void *ctx;
    const float *(*params)(void *ctx, int unit);
    void (*params_done)(void *ctx, int unit);
    float *(*grads)(void *ctx, int unit);
    void (*grads_done)(void *ctx, int unit);
    int (*tp_allreduce)(void *ctx, void *buf, size_t count, bool dbl, int op);
};

/*
 * Owner: the trainer (model_create/model_destroy).  Holds the config, the
 * part's layout and the activations of `slots` micro-batches of up to
 * (max_b, max_t) tokens; never owns parameters, gradients or optimizer
 * state.
 */
struct model;

/* The whole model, one slot.  NULL with a message on stderr for a bad
 * config or no memory. */
struct model *model_create(const struct model_config *cfg, int max_b, int max_t);
/* A part; NULL with the reason on stderr (tp not dividing heads...). */
struct model *model_create_part(const struct model_config *cfg, const struct model_part *part,
                                int max_b, int max_t);
void model_destroy(struct model *m); /* NULL ok */
const struct model_layout *model_layout(const struct model *m);
const struct model_config *model_config(const struct model *m);
const struct model_part *model_part(const struct model *m);
bool model_first(const struct model *m); /* holds the embeddings */
bool model_last(const struct model *m);  /* holds the head and the loss */
/* Bytes of activations: all of them, and those of one slot. */
size_t model_activation_bytes(const struct model *m);
size_t model_slot_bytes(const struct model *m);
/* Spans of local unit u counted in the gradient norm; returns how many
 * (at most 16) were written to out. */
int model_norm_spans(const struct model *m, int unit, struct model_span *out);

/* GPT-2 initialisation from seed, of the WHOLE model (Ψ floats, global
 * layout): N(0, 0.02) weights, residual projections N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weights 1. */
void model_init_params(const struct model *m, float *params, uint64_t seed);
/* Whole-model size Ψ. */
size_t model_global_size(const struct model *m);
/* This part's slice of a global-layout buffer into a local one. */
void model_to_local(const struct model *m, const float *global, float *local);
/* The part's slice into a global-layout buffer; with `owned`, only what
 * this rank alone holds (replicated tensors on tp rank 0, no wte copy), so
 * that summing every rank's buffer gives the whole model. */
void model_to_global(const struct model *m, const float *local, float *global, bool owned);

/*
 * One micro-batch through the part, activations kept in `slot`.
 * tokens, targets: (B, T) bytes, B <= max_b, T <= max_t.  A first stage
 * reads tokens; a later one reads its input (B*T, C) from
 * model_input(m, slot).  The last stage returns the mean cross-entropy
 * over the B*T positions; others return 0 and leave their output in
 * model_output(m, slot).  NaN on an error (message on stderr).
 */
float model_forward_slot(struct model *m, int slot, const float *params,
                         const struct model_hooks *hooks, const uint8_t *tokens,
                         const uint8_t *targets, int B, int T);
/*
 * The backward pass of slot's micro-batch, accumulating into grads (or the
 * hooks' buffers).  A stage that is not last finds d(output) in
 * model_dstream(m) (the caller puts it there); a stage that is not first
 * leaves d(input) there.  Tied wte across stages: the last stage leaves
 * the head's share of the wte gradient in model_head_dwte(m); a first
 * stage without the head expects the caller to put it there.
 * 0, or -1 on an error (message on stderr).
 */
int model_backward_slot(struct model *m, int slot, const float *params, float *grads,
                        const struct model_hooks *hooks);
float *model_input(struct model *m, int slot);
const float *model_output(const struct model *m, int slot);
float *model_dstream(struct model *m);  /* (max_b * max_t, C) */
float *model_head_dwte(struct model *m); /* (V / tp, C) */

/* Slot 0 of a whole model: the serial calls. */
float model_forward(struct model *m, const float *params, const struct model_hooks *hooks,
                    const uint8_t *tokens, const uint8_t *targets, int B, int T);
void model_backward(struct model *m, const float *params, float *grads,
                    const struct model_hooks *hooks);

/* Logits of the last position of row 0 after model_forward of a whole
 * model (V floats). */
const float *model_last_logits(const struct model *m, int T);

#endif /* WEFT_TRAINER_MODEL_H */
