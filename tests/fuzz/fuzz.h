/*
 * fuzz.h - what the libFuzzer targets in tests/fuzz share with their replay
 * in tests/test_fuzz_regress.c.  Each target is a function
 * weft_fuzz_<name>(data, size); built by tools/fuzz.sh it is also
 * LLVMFuzzerTestOneInput, built with -DWEFT_FUZZ_NO_MAIN (the Criterion
 * test) it is only the function.  A broken invariant calls weft_fuzz_fail:
 * abort() under libFuzzer, which saves the input as a crash; a failed
 * assertion under Criterion.
 */
#ifndef WEFT_FUZZ_H
#define WEFT_FUZZ_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/internal.h"

/* The targets: each returns 0 (libFuzzer's convention) or does not return. */
int weft_fuzz_uid(const uint8_t *data, size_t size);
int weft_fuzz_bs_msg(const uint8_t *data, size_t size);
int weft_fuzz_auth(const uint8_t *data, size_t size);
int weft_fuzz_tcp(const uint8_t *data, size_t size);
int weft_fuzz_param(const uint8_t *data, size_t size);
int weft_fuzz_topo(const uint8_t *data, size_t size);

_Noreturn void weft_fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
    WEFT_PRINTF(4, 5);

#define FUZZ_CHECK(cond, ...)                                                          \
    do {                                                                               \
        if (!(cond))                                                                   \
            weft_fuzz_fail(__FILE__, __LINE__, #cond, __VA_ARGS__);                    \
    } while (0)

#ifndef WEFT_FUZZ_NO_MAIN
_Noreturn void weft_fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s:%d: invariant broken: %s: ", file, line, cond);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}
#endif

/* libFuzzer's entry point, running target; none in the Criterion replay. */
#ifdef WEFT_FUZZ_NO_MAIN
#define WEFT_FUZZ_ENTRY(target)
#else
#define WEFT_FUZZ_ENTRY(target)                                                        \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)                       \
    {                                                                                  \
        return target(data, size);                                                     \
    }
#endif

/* Quiet logs and a known secret, before the first parameter is read (the
 * table is read once per process). */
static inline void weft_fuzz_setup(void)
{
    static bool done;
    if (done)
        return;
    done = true;
    setenv("WEFT_DEBUG", "NONE", 1);
    setenv("WEFT_SECRET", "fuzz", 1);
}

/* Reads the input front to back; past the end every read gives zeros, so a
 * short input is a valid input with its tail zero. */
struct fuzz_in {
    const uint8_t *p;
    size_t n;
};

static inline uint8_t fuzz_u8(struct fuzz_in *in)
{
    if (in->n == 0)
        return 0;
    in->n--;
    return *in->p++;
}

static inline uint64_t fuzz_le(struct fuzz_in *in, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)fuzz_u8(in) << (8 * i);
    return v;
}

/* The rest of the input as a NUL-terminated string (cut at its first NUL);
 * malloc'ed, the caller frees it. */
static inline char *fuzz_str(struct fuzz_in *in)
{
    size_t n = strnlen((const char *)in->p, in->n);
    char *s = malloc(n + 1);
    if (s == NULL)
        abort();
    memcpy(s, in->p, n);
    s[n] = '\0';
    in->p += in->n;
    in->n = 0;
    return s;
}

/* A message for people: NUL-terminated within len, printable ASCII only. */
static inline bool fuzz_text_ok(const char *s, size_t len)
{
    const char *end = memchr(s, '\0', len);
    if (end == NULL)
        return false;
    for (; s < end; s++)
        if (*s < 0x20 || *s > 0x7e)
            return false;
    return true;
}

/* A target of several modes: the first byte picks one of modes[0..n),
 * which reads the rest of the input.  Returns 0, for libFuzzer. */
typedef void (*fuzz_mode_t)(struct fuzz_in *in);

static inline int fuzz_modes(const uint8_t *data, size_t size, const fuzz_mode_t *modes, int n)
{
    weft_fuzz_setup();
    struct fuzz_in in = {data, size};
    modes[fuzz_u8(&in) % n](&in);
    return 0;
}

#endif /* WEFT_FUZZ_H */
