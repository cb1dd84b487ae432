/*
 * test_trainer.c - the trainer end to end, as real processes: data
 * parallel and ZeRO 1/2/3 on 2 and 4 ranks reproduce the serial
 * gradient-accumulation run over the same micro-batches; a checkpoint
 * saved under one layout resumes under others; the model state per rank
 * follows the ZeRO formulas; bad input gives clear errors.
 */
#include <criterion/criterion.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testcommon.h"
#include "testutil.h"

static char dir[PATH_MAX], work[PATH_MAX];

/* The folder of this binary (weft-train and weftrun sit beside it), a
 * scratch folder, and a text every Debian machine has. */
static void setup(void)
{
    snprintf(dir, sizeof(dir), "%s", weft_test_bindir());
    cr_assert(dir[0], "cannot find this test's folder");
    snprintf(work, sizeof(work), "/tmp/weft-trainer-test.%d", (int)getpid());
    mkdir(work, 0700);
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof(cmd), "cat /usr/share/common-licenses/* > %s/text.txt", work);
    cr_assert_eq(system(cmd), 0);
}

static void teardown(void)
{
    char cmd[PATH_MAX + 32];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", work);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", work);
}

/* Runs `weftrun -n N weft-train ARGS` (N == 1: no weftrun); returns the
 * exit code and the output. */
static int train(int n, const char *args, char *out, size_t outlen)
{
    char cmd[8192], launcher[64] = "";
    if (n > 1)
        snprintf(launcher, sizeof(launcher), "./weftrun --no-prefix -n %d", n);
    snprintf(cmd, sizeof(cmd),
             "cd %s && WEFT_SOCKET_IFNAME=lo timeout -k 5 300 %s ./weft-train --data "
             "%s/text.txt --sample 0 %s 2>&1",
             dir, launcher, work, args);
    return weft_test_shell(cmd, out, outlen);
}

/* Per-step training losses from a CSV log. */
static int read_losses(const char *path, double *loss, int max)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no log %s", path);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), f) && n < max) {
        long step;
        double l;
        if (sscanf(line, "%ld,%lf,", &step, &l) == 2)
            loss[n++] = l;
    }
    fclose(f);
    return n;
}

#define TINY "--layers 2 --channels 32 --heads 4 --context 32 --batch 4 --steps 20 --warmup 5 --lr 3e-3 "

static char out[1 << 20];

static void run_ok(int n, const char *args)
{
    int rc = train(n, args, out, sizeof(out));
    cr_assert_eq(rc, 0, "weft-train (%d ranks) %s exited with %d:\n%.6000s", n, args, rc, out);
}

static void expect_same_losses(const char *ref, const char *other, int steps)
{
    double a[64], b[64];
    char pa[PATH_MAX + 64], pb[PATH_MAX + 64];
    snprintf(pa, sizeof(pa), "%s/%s", work, ref);
    snprintf(pb, sizeof(pb), "%s/%s", work, other);
    int na = read_losses(pa, a, 64), nb = read_losses(pb, b, 64);
    cr_assert_eq(na, steps, "%s has %d steps", ref, na);
    cr_assert_eq(nb, steps, "%s has %d steps", other, nb);
    for (int i = 0; i < steps; i++)
        cr_assert(fabs(a[i] - b[i]) <= 1e-6 * fabs(a[i]),
                  "step %d: %s loss %.9g, %s loss %.9g (relative %.2g)", i + 1, ref, a[i], other,
                  b[i], fabs(a[i] - b[i]) / fabs(a[i]));
}

TestSuite(trainer, .init = setup, .fini = teardown, .timeout = 600);

Test(trainer, dp_and_zero_reproduce_serial_accumulation)
{
    char args[1024];
    snprintf(args, sizeof(args), TINY "--accum 4 --log %s/serial.csv", work);
    run_ok(1, args);
    /* The loss falls: the run trains. */
    double l[20];
    char p[PATH_MAX + 32];
    snprintf(p, sizeof(p), "%s/serial.csv", work);
    read_losses(p, l, 20);
    cr_assert(l[19] < l[0] - 0.5, "serial loss went from %g to %g", l[0], l[19]);
    for (int n = 2; n <= 4; n += 2)
        for (int zero = 0; zero <= 3; zero++) {
            char name[64];
            snprintf(name, sizeof(name), "dp%d-zero%d.csv", n, zero);
            snprintf(args, sizeof(args), TINY "--accum %d --zero %d --log %s/%s", 4 / n, zero,
                     work, name);
            run_ok(n, args);
            expect_same_losses("serial.csv", name, 20);
        }
}

Test(trainer, checkpoint_resumes_under_another_layout)
{
    char args[1024];
    /* Uninterrupted: 4 ranks, ZeRO-3, checkpoints at steps 10 and 12. */
    snprintf(args, sizeof(args),
             TINY "--steps 12 --zero 3 --save %s/ck-%%d.bin --save-every 10 --log %s/a.csv",
             work, work);
    run_ok(4, args);
    /* Resumed at step 10 under ZeRO-1 on 2 ranks, and serially. */
    snprintf(args, sizeof(args), TINY "--steps 12 --zero 1 --resume %s/ck-10.bin --log %s/b.csv",
             work, work);
    run_ok(2, args);
    snprintf(args, sizeof(args), TINY "--steps 12 --resume %s/ck-10.bin --log %s/c.csv", work,
             work);
    run_ok(1, args);
    double a[12], b[2], c[2];
    char p[PATH_MAX + 32];
    snprintf(p, sizeof(p), "%s/a.csv", work);
    cr_assert_eq(read_losses(p, a, 12), 12);
    snprintf(p, sizeof(p), "%s/b.csv", work);
    cr_assert_eq(read_losses(p, b, 2), 2);
    snprintf(p, sizeof(p), "%s/c.csv", work);
    cr_assert_eq(read_losses(p, c, 2), 2);
    for (int i = 0; i < 2; i++) {
        cr_assert(fabs(a[10 + i] - b[i]) <= 1e-6 * a[10 + i], "step %d: %.9g vs ZeRO-1 %.9g",
                  11 + i, a[10 + i], b[i]);
        cr_assert(fabs(a[10 + i] - c[i]) <= 1e-6 * a[10 + i], "step %d: %.9g vs serial %.9g",
                  11 + i, a[10 + i], c[i]);
    }
}

/* Model state per rank: 16Ψ (DP), 8Ψ + 8Ψ/N, 4Ψ + 12Ψ/N, 16Ψ/N bytes. */
Test(trainer, model_state_follows_the_zero_formulas)
{
    const int n = 4;
    for (int zero = 0; zero <= 3; zero++) {
        char args[512];
        snprintf(args, sizeof(args),
                 "--layers 4 --channels 192 --heads 4 --context 16 --batch 1 --steps 1 "
                 "--val-batches 4 --zero %d",
                 zero);
        run_ok(n, args);
        double psi = 0;
        const char *h = strstr(out, "weft-train: ");
        cr_assert(h && sscanf(h, "weft-train: %lf parameters", &psi) == 1, "%.2000s", out);
        static const double a[] = {16, 8, 4, 0}, b[] = {0, 8, 12, 16};
        double want = (a[zero] * psi + b[zero] * psi / n) / 1e6;
        const char *t = strstr(out, "memory per rank");
        cr_assert_not_null(t, "%.4000s", out);
        for (int r = 0; r < n; r++) {
            char key[40];
            snprintf(key, sizeof(key), "\n%*d ", 26, r);
            const char *row = strstr(t, key);
            cr_assert_not_null(row, "no row for rank %d:\n%s", r, t);
            double f[7];
            cr_assert_eq(sscanf(row, "%*d %lf %lf %lf %lf %lf %lf %lf", &f[0], &f[1], &f[2],
                                &f[3], &f[4], &f[5], &f[6]),
                         7);
            cr_assert(fabs(f[5] - want) <= 0.10 * want,
                      "ZeRO-%d rank %d: model state %.2f MB, formula %.2f MB", zero, r, f[5],
                      want);
        }
    }
}

Test(trainer, bad_input_gives_clear_errors)
{
    char args[1024];
    int rc = train(1, "--data /nonexistent/file", out, sizeof(out));
    cr_assert(rc != 0 && strstr(out, "/nonexistent/file") != NULL, "rc %d: %s", rc, out);
    rc = train(1, "--steps banana", out, sizeof(out));
    cr_assert(rc == 2 && strstr(out, "--steps") != NULL, "rc %d: %s", rc, out);
    rc = train(2, "--dp 4", out, sizeof(out));
    cr_assert(rc != 0 && strstr(out, "--dp 4 but 2 rank") != NULL, "rc %d: %s", rc, out);
    /* A damaged checkpoint is refused with its name. */
    snprintf(args, sizeof(args), TINY "--steps 2 --save %s/ck.bin", work);
    run_ok(1, args);
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof(cmd),
             "printf 'xx' | dd of=%s/ck.bin bs=1 seek=100 conv=notrunc 2>/dev/null", work);
    cr_assert_eq(system(cmd), 0);
    snprintf(args, sizeof(args), TINY "--steps 3 --resume %s/ck.bin", work);
    rc = train(1, args, out, sizeof(out));
    cr_assert(rc != 0 && strstr(out, "checksum") != NULL, "rc %d: %s", rc, out);
    /* A full disk: the save fails with the reason, the old file survives. */
    char mnt[PATH_MAX + 8];
    snprintf(mnt, sizeof(mnt), "%s/small", work);
    mkdir(mnt, 0700);
    if (mount("tmpfs", mnt, "tmpfs", 0, "size=64k") != 0)
        cr_skip_test("cannot mount a small tmpfs here (not root?): full-disk case not run");
    snprintf(args, sizeof(args), TINY "--steps 2 --save %s/ck.bin", mnt);
    rc = train(1, args, out, sizeof(out));
    umount(mnt);
    cr_assert(rc != 0 && strstr(out, "No space left on device") != NULL, "rc %d: %s", rc, out);
}
