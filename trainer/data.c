/*
 * data.c - loading the text and drawing batches (see data.h).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data.h"

uint64_t data_mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int data_load(const char *path, double val_fraction, size_t need, struct dataset *d, char *err,
              size_t errlen)
{
    memset(d, 0, sizeof(*d));
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 20, n = 0;
    uint8_t *buf = malloc(cap);
    while (buf != NULL) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        uint8_t *bigger = realloc(buf, cap * 2);
        if (bigger == NULL) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = bigger;
        cap *= 2;
    }
    int bad = ferror(f);
    fclose(f);
    if (buf == NULL || bad) {
        snprintf(err, errlen, "cannot read %s: %s", path, buf ? strerror(errno) : "out of memory");
        free(buf);
        return -1;
    }
    size_t val = (size_t)((double)n * val_fraction);
    if (n - val < need || val < need) {
        snprintf(err, errlen,
                 "%s has %zu bytes: too small for a %zu-byte training and validation window "
                 "(validation is the last %.0f%%)",
                 path, n, need, val_fraction * 100);
        free(buf);
        return -1;
    }
    d->bytes = buf;
    d->n = n;
    d->train_n = n - val;
    return 0;
}

void data_free(struct dataset *d)
{
    free(d->bytes);
    memset(d, 0, sizeof(*d));
}

static void window(const struct dataset *d, size_t start, int T, uint8_t *tokens,
                   uint8_t *targets)
{
    memcpy(tokens, d->bytes + start, (size_t)T);
    memcpy(targets, d->bytes + start + 1, (size_t)T);
}

void data_train_batch(const struct dataset *d, uint64_t seed, uint64_t step, int index,
                      int count, int B, int T, uint8_t *tokens, uint8_t *targets)
{
    size_t stripe = d->train_n / (size_t)count;
    size_t lo = stripe * (size_t)index;
    /* Windows may reach past the stripe by T bytes, never past the split. */
    size_t span = lo + stripe + (size_t)T + 1 <= d->train_n ? stripe
                                                            : d->train_n - lo - (size_t)T - 1;
    if (span == 0)
        span = 1;
    for (int b = 0; b < B; b++) {
        uint64_t r = data_mix(seed ^ data_mix(step * 0x10001ull + (uint64_t)index * 977u +
                                              (uint64_t)b * 0x9e37u));
        window(d, lo + r % span, T, tokens + (size_t)b * T, targets + (size_t)b * T);
    }
}

void data_val_batch(const struct dataset *d, int i, int n, int B, int T, uint8_t *tokens,
                    uint8_t *targets)
{
    size_t room = d->n - d->train_n - (size_t)T - 1;
    size_t rows = (size_t)n * (size_t)B;
    for (int b = 0; b < B; b++) {
        size_t k = (size_t)i * (size_t)B + (size_t)b;
        window(d, d->train_n + room * k / (rows ? rows : 1), T, tokens + (size_t)b * T,
               targets + (size_t)b * T);
    }
}

double data_unigram_entropy(const struct dataset *d)
{
    double count[256] = {0};
    for (size_t i = 0; i < d->train_n; i++)
        count[d->bytes[i]]++;
    double h = 0;
    for (int c = 0; c < 256; c++)
        if (count[c] > 0) {
            double p = count[c] / (double)d->train_n;
            h -= p * log(p);
        }
    return h;
}
