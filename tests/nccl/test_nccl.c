/*
 * test_nccl.c - programs written for NCCL run on weft: nccl_prog built
 * against weft's nccl.h and against NVIDIA's, linked to libweft_nccl, runs
 * 4 (and 5) ranks under weftrun; the same program linked to NVIDIA's
 * libnccl.so.2 runs on weft when LD_LIBRARY_PATH names weft's; and
 * ncclCommInitAll drives several ranks from one thread.
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/testcommon.h"
#include "tests/testutil.h"

/* The programs and weftrun sit beside this test binary. */
static const char *bindir(void)
{
    const char *d = weft_test_bindir();
    cr_assert(*d, "cannot find this test's folder");
    return d;
}

/* Runs a shell command with a deadline; returns its exit code (-1 on a
 * signal or timeout) and its output in out. */
static int run(const char *cmd, int timeout_s, char *out, size_t outlen)
{
    char full[4096];
    snprintf(full, sizeof(full), "cd '%s' && WEFT_SOCKET_IFNAME=lo timeout -k 5 %d %s 2>&1",
             bindir(), timeout_s, cmd);
    return weft_test_shell(full, out, outlen);
}

static bool exists(const char *prog)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", bindir(), prog);
    return access(path, X_OK) == 0;
}

static void expect_ok(const char *cmd)
{
    static char out[1 << 16];
    int rc = run(cmd, 120, out, sizeof(out));
    cr_assert_eq(rc, 0, "%s exited with %d:\n%s", cmd, rc, out);
}

Test(nccl, own_header_4_ranks, .timeout = 150)
{
    expect_ok("./weftrun -n 4 ./nccl_prog_own");
}

Test(nccl, own_header_5_ranks, .timeout = 150)
{
    expect_ok("./weftrun -n 5 ./nccl_prog_own");
}

Test(nccl, own_header_init_all_from_one_thread, .timeout = 60)
{
    expect_ok("./nccl_prog_own --init-all 3");
}

Test(nccl, nvidia_header_4_ranks, .timeout = 150)
{
    if (!exists("nccl_prog_nv"))
        cr_skip_test("NVIDIA's nccl.h was not found at configure time");
    /* A --disable-shared build (the sanitizer run) links weft in. */
    expect_ok(exists(".libs/libnccl.so.2")
                  ? "./weftrun -n 4 ./nccl_prog_nv --expect-lib libweft_nccl"
                  : "./weftrun -n 4 ./nccl_prog_nv");
}

Test(nccl, nvidia_header_init_all_from_one_thread, .timeout = 60)
{
    if (!exists("nccl_prog_nv"))
        cr_skip_test("NVIDIA's nccl.h was not found at configure time");
    expect_ok("./nccl_prog_nv --init-all 4");
}

/* A binary linked against NVIDIA's libnccl.so.2 picks weft's when
 * LD_LIBRARY_PATH names the folder that holds it. */
Test(nccl, nvidia_binary_runs_on_weft_via_ld_library_path, .timeout = 150)
{
    if (!exists("nccl_prog_nvlib"))
        cr_skip_test("NVIDIA's libnccl was not found at configure time");
    if (!exists(".libs/libnccl.so.2"))
        cr_skip_test("built with --disable-shared: there is no libnccl.so.2 of weft's to load");
    char out[4096];
    /* Without the variable the dynamic linker finds NVIDIA's library. */
    int rc = run("env -u LD_LIBRARY_PATH ./nccl_prog_nvlib --which", 30, out, sizeof(out));
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert_null(strstr(out, bindir()), "without LD_LIBRARY_PATH it loaded %s", out);
    char cmd[PATH_MAX + 200];
    snprintf(cmd, sizeof(cmd), "env LD_LIBRARY_PATH='%s/.libs' ./nccl_prog_nvlib --which",
             bindir());
    rc = run(cmd, 30, out, sizeof(out));
    cr_assert_eq(rc, 0, "%s", out);
    cr_assert(strstr(out, ".libs/libnccl.so.2") != NULL, "loaded %s", out);
    snprintf(cmd, sizeof(cmd),
             "env LD_LIBRARY_PATH='%s/.libs' ./weftrun -n 4 ./nccl_prog_nvlib --expect-lib "
             "'%s/.libs/libnccl.so.2'",
             bindir(), bindir());
    expect_ok(cmd);
}

/* NCCL's variables reach weft: NCCL_DEBUG=INFO turns weft's INFO lines on,
 * and an NCCL_ALGO naming an algorithm only NCCL has (NVLS) is reported and
 * ignored rather than failing the job ("Tree" and "Ring" name weft's). */
Test(nccl, nccl_env_aliases, .timeout = 150)
{
    static char out[1 << 20];
    int rc = run("env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT NCCL_ALGO=NVLS ./weftrun -n 2 "
                 "./nccl_prog_own",
                 120, out, sizeof(out));
    cr_assert_eq(rc, 0, "exited with %d:\n%.4000s", rc, out);
    cr_assert(strstr(out, "communicator ready") != NULL, "no INFO lines:\n%.4000s", out);
    cr_assert(strstr(out, "NCCL_ALGO=NVLS") != NULL, "no word on NCCL_ALGO:\n%.4000s", out);
}

Test(nccl, abort_from_another_thread_mid_collective, .timeout = 60)
{
    expect_ok("./weftrun -n 2 ./nccl_prog_own --abort");
}

Test(nccl, shrink_a_failed_communicator_after_a_death, .timeout = 120)
{
    expect_ok("env WEFT_TIMEOUT_MS=20000 ./weftrun -n 4 ./nccl_prog_own --shrink-after-death");
}
