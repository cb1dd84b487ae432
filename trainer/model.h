/*
 * model.h - a GPT-2-shaped decoder-only transformer with hand-written
 * forward and backward passes, byte-level vocabulary.
 *
 * Parameters live in one flat float buffer cut into units, in this order:
 *   unit 0            EMB: wte (V, C) then wpe (maxT, C)
 *   unit 1 + l        LAYER l (l < L): ln1w (C), ln1b (C), qkvw (3C, C),
 *                     qkvb (3C), attprojw (C, C), attprojb (C), ln2w (C),
 *                     ln2b (C), fcw (4C, C), fcb (4C), fcprojw (C, 4C),
 *                     fcprojb (C)
 *   unit L + 1        LNF: lnfw (C), lnfb (C)
 * Weights are (out, in), row-major: y = x W^T + b.  The LM head is wte
 * (tied).  Gradients and optimizer state use the same layout, so a
 * data-parallel shard of any of them is a range of offsets, and a unit is
 * one contiguous range (what ZeRO-3 gathers before using it).
 *
 * The passes run in stages and ask hooks for memory (struct model_hooks),
 * so a parallel trainer can gather a unit's parameters just before a stage
 * uses them and reduce its gradients as soon as they are final.  Without
 * hooks (NULL) the model reads params and accumulates into grads, both
 * flat, whole buffers.
 */
#ifndef WEFT_TRAINER_MODEL_H
#define WEFT_TRAINER_MODEL_H

#include <stddef.h>
#include <stdint.h>

#define MODEL_VOCAB 256

struct model_config {
    int vocab;    /* V: 256 (bytes) */
    int max_t;    /* maxT: positions */
    int layers;   /* L */
    int channels; /* C, a multiple of heads */
    int heads;    /* NH */
};

/* Where each unit and tensor lies in the flat buffers (floats). */
struct model_layout {
    int nunits;               /* L + 2 */
    size_t total;             /* Ψ: number of parameters */
    size_t *unit_off;         /* (nunits + 1): unit u is [unit_off[u], unit_off[u+1]) */
};

/*
 * Memory a stage needs, supplied by the caller.  Every call names a unit u.
 *  params(u)      the unit's parameters (unit_off[u+1]-unit_off[u] floats),
 *                 valid until params_done(u).  Called before each stage that
 *                 reads them (EMB twice per pass: embedding and LM head).
 *  params_done(u) the stage no longer reads them.
 *  grads(u)       where the backward stages ACCUMULATE (+=) the unit's
 *                 gradients; called once per backward pass per unit, before
 *                 the unit's first gradient is written.
 *  grads_done(u)  the unit's gradients of this backward pass are complete:
 *                 LNF after the head, LAYER l after block l, EMB last (its
 *                 wte gets both the head's and the embedding's share).
 * Any hook may be NULL; then params/grads fall back to the flat buffers
 * given to model_forward/model_backward.
 */
struct model_hooks {
    void *ctx;
    const float *(*params)(void *ctx, int unit);
    void (*params_done)(void *ctx, int unit);
    float *(*grads)(void *ctx, int unit);
    void (*grads_done)(void *ctx, int unit);
};

/*
 * Owner: the trainer (model_create/model_destroy).  Holds the config,
 * layout and the activations for up to (B, T) tokens; never owns
 * parameters, gradients or optimizer state.
 */
struct model;

/* NULL with a message on stderr for a bad config or no memory. */
struct model *model_create(const struct model_config *cfg, int max_b, int max_t);
void model_destroy(struct model *m); /* NULL ok */
const struct model_layout *model_layout(const struct model *m);
const struct model_config *model_config(const struct model *m);
/* Bytes of activations held for (max_b, max_t). */
size_t model_activation_bytes(const struct model *m);

/* GPT-2 initialisation from seed (same values on every machine): N(0, 0.02)
 * weights, residual projections (attprojw, fcprojw) N(0, 0.02/sqrt(2L)),
 * biases 0, LayerNorm weights 1.  params: Ψ floats. */
void model_init_params(const struct model *m, float *params, uint64_t seed);

/*
 * tokens, targets: (B, T) bytes; B <= max_b, T <= max_t and <= cfg.max_t.
 * Returns the mean cross-entropy over the B*T positions (targets < 0 are
 * not allowed).  params: the flat buffer (used where hooks give none).
 */
float model_forward(struct model *m, const float *params, const struct model_hooks *hooks,
                    const uint8_t *tokens, const uint8_t *targets, int B, int T);
/* After model_forward with the same (B, T): accumulates d(mean loss)/dθ
 * into grads (or the hooks' buffers). */
void model_backward(struct model *m, const float *params, float *grads,
                    const struct model_hooks *hooks);

/* Logits of the last position of row 0 after model_forward (V floats). */
const float *model_last_logits(const struct model *m, int T);

#endif /* WEFT_TRAINER_MODEL_H */
