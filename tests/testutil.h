/*
 * testutil.h - small helpers shared by test binaries that do not link the
 * multi-process harness: a reproducible RNG and the folder of the running
 * test (where the programs it launches were built).
 */
#ifndef WEFT_TESTUTIL_H
#define WEFT_TESTUTIL_H

#include <libgen.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* xorshift64*: deterministic, so a failure reproduces.  Seed by assigning
 * weft_test_rng_state (each test binary has its own copy). */
static uint64_t weft_test_rng_state = 0x9e3779b97f4a7c15ull;

static inline uint64_t weft_test_rnd(void)
{
    weft_test_rng_state ^= weft_test_rng_state >> 12;
    weft_test_rng_state ^= weft_test_rng_state << 25;
    weft_test_rng_state ^= weft_test_rng_state >> 27;
    return weft_test_rng_state * 0x2545f4914f6cdd1dull;
}

/* The folder of this test binary, without libtool's trailing /.libs;
 * "" if /proc/self/exe cannot be read. */
static inline const char *weft_test_bindir(void)
{
    static char dir[PATH_MAX];
    if (dir[0] == '\0') {
        ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
        if (n <= 0)
            return "";
        dir[n] = '\0';
        char *d = dirname(dir);
        memmove(dir, d, strlen(d) + 1);
        size_t len = strlen(dir);
        if (len > 6 && strcmp(dir + len - 6, "/.libs") == 0)
            dir[len - 6] = '\0';
    }
    return dir;
}

#endif /* WEFT_TESTUTIL_H */
