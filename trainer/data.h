/*
 * data.h - training text: a file of bytes split into train and validation,
 * and micro-batches that depend only on (seed, step, index), so any
 * data-parallel layout sees the same batches as a serial run.
 */
#ifndef WEFT_TRAINER_DATA_H
#define WEFT_TRAINER_DATA_H

#include <stddef.h>
#include <stdint.h>

/*
 * Owner: the trainer (data_load / data_free).  bytes[0, train_n) is the
 * training split, bytes[train_n, n) the validation split (the last
 * val_fraction of the file).
 */
struct dataset {
    uint8_t *bytes;
    size_t n, train_n;
};

/* Reads path whole.  Each split must hold at least `need` bytes; returns 0,
 * or -1 with a message in err. */
int data_load(const char *path, double val_fraction, size_t need, struct dataset *d, char *err,
              size_t errlen);
void data_free(struct dataset *d);

/*
 * Micro-batch `index` (0 <= index < count) of optimizer step `step`: B rows
 * of T tokens and their next-byte targets.  The training split is cut into
 * `count` equal stripes and micro-batch i draws its windows from stripe i,
 * so the micro-batches of one step never overlap, whichever rank draws them.
 */
void data_train_batch(const struct dataset *d, uint64_t seed, uint64_t step, int index,
                      int count, int B, int T, uint8_t *tokens, uint8_t *targets);
/* Validation batch i of n: evenly spaced windows, the same every call. */
void data_val_batch(const struct dataset *d, int i, int n, int B, int T, uint8_t *tokens,
                    uint8_t *targets);
/* Entropy of the training split's byte frequencies, in nats per byte: the
 * loss of the best model that ignores context. */
double data_unigram_entropy(const struct dataset *d);

/* splitmix64: the trainer's one source of reproducible randomness. */
uint64_t data_mix(uint64_t x);

#endif /* WEFT_TRAINER_DATA_H */
