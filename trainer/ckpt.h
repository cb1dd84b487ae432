/*
 * ckpt.h - checkpoints that do not depend on the parallel layout: the
 * model config, the step, the data-order settings and the whole
 * parameters and AdamW moments in the model's unpadded flat layout.
 *
 * File: "WEFTCKPT", u32 version, then little-endian fields (struct
 * ckpt_header order), params, m, v as float32 (Ψ each), and a 64-bit
 * FNV-1a checksum of everything before it.
 */
#ifndef WEFT_TRAINER_CKPT_H
#define WEFT_TRAINER_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "model.h"

struct ckpt_header {
    struct model_config cfg;
    uint64_t psi;       /* parameters */
    int64_t step;       /* optimizer steps taken */
    int32_t global;     /* micro-batches per step (dp * accum) */
    int32_t batch, t;   /* B and T of a micro-batch */
    uint64_t seed;      /* data order */
};

/* Writes path atomically (a temporary file renamed over it after fsync);
 * on failure (a full disk...) the old file is untouched and err says why.
 * Returns 0 or -1. */
int ckpt_write(const char *path, const struct ckpt_header *h, const float *params,
               const float *m, const float *v, char *err, size_t errlen);
/* Reads a checkpoint; *params, *m, *v are malloc'd (Ψ floats each).
 * Returns 0, or -1 with err set (missing, truncated, corrupt, other
 * version). */
int ckpt_read(const char *path, struct ckpt_header *h, float **params, float **m, float **v,
              char *err, size_t errlen);

#endif /* WEFT_TRAINER_CKPT_H */
