/*
 * ckpt.c - writing and reading checkpoints (see ckpt.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt.h"

#define MAGIC "WEFTCKPT"
#define VERSION 1u

struct sink {
    FILE *f;
    uint64_t sum; /* FNV-1a of everything written or read */
    int err;      /* errno of the first failure */
};

static void hash(struct sink *s, const void *p, size_t n)
{
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++)
        s->sum = (s->sum ^ b[i]) * 0x100000001b3ull;
}

static void put(struct sink *s, const void *p, size_t n)
{
    if (s->err)
        return;
    if (fwrite(p, 1, n, s->f) != n)
        s->err = errno ? errno : EIO;
    hash(s, p, n);
}

static void get(struct sink *s, void *p, size_t n)
{
    if (s->err)
        return;
    if (fread(p, 1, n, s->f) != n)
        s->err = ferror(s->f) ? (errno ? errno : EIO) : -1; /* -1: truncated */
    hash(s, p, n);
}

/* The header as bytes, little-endian (the machines weft supports). */
#define HDR_BYTES (5 * 4 + 8 + 8 + 3 * 4 + 8)

static void pack(const struct ckpt_header *h, uint8_t *b)
{
    int32_t cfg[5] = {h->cfg.vocab, h->cfg.max_t, h->cfg.layers, h->cfg.channels,
                      h->cfg.heads};
    int32_t small[3] = {h->global, h->batch, h->t};
    memcpy(b, cfg, 20);
    memcpy(b + 20, &h->psi, 8);
    memcpy(b + 28, &h->step, 8);
    memcpy(b + 36, small, 12);
    memcpy(b + 48, &h->seed, 8);
}

static void unpack(const uint8_t *b, struct ckpt_header *h)
{
    int32_t cfg[5], small[3];
    memcpy(cfg, b, 20);
    memcpy(&h->psi, b + 20, 8);
    memcpy(&h->step, b + 28, 8);
    memcpy(small, b + 36, 12);
    memcpy(&h->seed, b + 48, 8);
    h->cfg = (struct model_config){cfg[0], cfg[1], cfg[2], cfg[3], cfg[4]};
    h->global = small[0];
    h->batch = small[1];
    h->t = small[2];
}

int ckpt_write(const char *path, const struct ckpt_header *h, const float *params,
               const float *m, const float *v, char *err, size_t errlen)
{
    char tmp[4096];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
    struct sink s = {fopen(tmp, "wb"), 0xcbf29ce484222325ull, 0};
    if (s.f == NULL) {
        snprintf(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
        return -1;
    }
    uint32_t version = VERSION;
    uint8_t hdr[HDR_BYTES];
    pack(h, hdr);
    put(&s, MAGIC, 8);
    put(&s, &version, sizeof(version));
    put(&s, hdr, sizeof(hdr));
    put(&s, params, h->psi * sizeof(float));
    put(&s, m, h->psi * sizeof(float));
    put(&s, v, h->psi * sizeof(float));
    uint64_t sum = s.sum;
    put(&s, &sum, sizeof(sum));
    if (!s.err && (fflush(s.f) != 0 || fsync(fileno(s.f)) != 0))
        s.err = errno;
    if (fclose(s.f) != 0 && !s.err)
        s.err = errno;
    if (!s.err && rename(tmp, path) != 0)
        s.err = errno;
    if (s.err) {
        snprintf(err, errlen, "cannot write checkpoint %s (%.1f MB): %s; the previous one, if "
                              "any, is unchanged",
                 path, 3.0 * (double)h->psi * 4 / 1e6, strerror(s.err));
        unlink(tmp);
        return -1;
    }
    return 0;
}

int ckpt_read(const char *path, struct ckpt_header *h, float **params, float **m, float **v,
              char *err, size_t errlen)
{
    *params = *m = *v = NULL;
    struct sink s = {fopen(path, "rb"), 0xcbf29ce484222325ull, 0};
    if (s.f == NULL) {
        snprintf(err, errlen, "cannot open checkpoint %s: %s", path, strerror(errno));
        return -1;
    }
    char magic[8];
    uint32_t version = 0;
    get(&s, magic, 8);
    get(&s, &version, sizeof(version));
    if (s.err || memcmp(magic, MAGIC, 8) != 0 || version != VERSION) {
        snprintf(err, errlen, "%s is not a weft trainer checkpoint of version %u", path,
                 VERSION);
        fclose(s.f);
        return -1;
    }
    uint8_t hdr[HDR_BYTES];
    get(&s, hdr, sizeof(hdr));
    unpack(hdr, h);
    if (s.err || h->psi == 0 || h->psi > (1ull << 34)) {
        snprintf(err, errlen, "%s: damaged header", path);
        fclose(s.f);
        return -1;
    }
    float *buf[3] = {0};
    for (int k = 0; k < 3; k++) {
        buf[k] = malloc(h->psi * sizeof(float));
        if (buf[k] == NULL) {
            s.err = ENOMEM;
            break;
        }
        get(&s, buf[k], h->psi * sizeof(float));
    }
    uint64_t want = s.sum, sum = 0;
    get(&s, &sum, sizeof(sum));
    fclose(s.f);
    if (s.err || sum != want) {
        snprintf(err, errlen, "%s: %s", path,
                 s.err == -1     ? "truncated"
                 : s.err         ? strerror(s.err)
                                 : "checksum mismatch (the file is corrupt)");
        for (int k = 0; k < 3; k++)
            free(buf[k]);
        return -1;
    }
    *params = buf[0];
    *m = buf[1];
    *v = buf[2];
    return 0;
}
