/*
 * testcommon.h - helpers shared by Criterion tests that run programs built
 * beside them (weft-sim, weft-train, the NCCL programs).
 */
#ifndef WEFT_TESTCOMMON_H
#define WEFT_TESTCOMMON_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <sys/wait.h>

/* Runs a shell command line; returns its exit code (-1 when a signal
 * ended it) and, in out, the first outlen - 1 bytes it wrote to stdout
 * (stderr too where cmd redirects it). */
static inline int weft_test_shell(const char *cmd, char *out, size_t outlen)
{
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f, "cannot run: %s", cmd);
    size_t got = fread(out, 1, outlen - 1, f);
    out[got] = '\0';
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#endif /* WEFT_TESTCOMMON_H */
