/*
 * test_trainer.c - the trainer end to end, as real processes: every
 * layout (data parallel with ZeRO 0-3, tensor parallel, pipelines under
 * both schedules, 3D) gives the serial gradient-accumulation run's loss
 * bit for bit under WEFT_DETERMINISTIC=1 and within 1e-5 without it; a
 * checkpoint saved under one layout resumes under others; offloading the
 * optimizer state changes nothing; the memory per rank follows the ZeRO
 * and pipeline formulas; bad input gives clear errors.
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
static int train_env(int n, const char *env, const char *args, char *out, size_t outlen)
{
    char cmd[8192], launcher[64] = "";
    if (n > 1)
        snprintf(launcher, sizeof(launcher), "./weftrun --no-prefix -n %d", n);
    snprintf(cmd, sizeof(cmd),
             "cd %s && WEFT_SOCKET_IFNAME=lo %s timeout -k 5 300 %s ./weft-train --data "
             "%s/text.txt --sample 0 %s 2>&1",
             dir, env, launcher, work, args);
    return weft_test_shell(cmd, out, outlen);
}

static int train(int n, const char *args, char *out, size_t outlen)
{
    return train_env(n, "", args, out, outlen);
}

/* Per-step training losses from a CSV log: the printed value, or (bits)
 * the exact double from its last column, "%a". */
static int read_log(const char *path, double *loss, int max, bool bits)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no log %s", path);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), f) && n < max) {
        long step;
        double l;
        const char *last = strrchr(line, ',');
        if (sscanf(line, "%ld,%lf,", &step, &l) == 2)
            loss[n++] = bits && last ? strtod(last + 1, NULL) : l;
    }
    fclose(f);
    return n;
}

static int read_losses(const char *path, double *loss, int max)
{
    return read_log(path, loss, max, false);
}

#define TINY "--layers 2 --channels 32 --heads 4 --context 32 --batch 4 --steps 20 --warmup 5 --lr 3e-3 "

static char out[1 << 20];

static void run_env_ok(int n, const char *env, const char *args)
{
    int rc = train_env(n, env, args, out, sizeof(out));
    cr_assert_eq(rc, 0, "%s weft-train (%d ranks) %s exited with %d:\n%.6000s", env, n, args, rc,
                 out);
}

static void run_ok(int n, const char *args)
{
    run_env_ok(n, "", args);
}

/* Steps [from, from + steps) of ref against other's first `steps` steps
 * (offset from: a resumed run's log starts at its checkpoint);
 * tolerance 0: the same bits. */
static void expect_losses_at(const char *ref, int from, const char *other, int steps,
                             double tol)
{
    double a[64], b[64];
    char pa[PATH_MAX + 64], pb[PATH_MAX + 64];
    snprintf(pa, sizeof(pa), "%s/%s", work, ref);
    snprintf(pb, sizeof(pb), "%s/%s", work, other);
    int na = read_log(pa, a, 64, tol == 0), nb = read_log(pb, b, 64, tol == 0);
    cr_assert_geq(na, from + steps, "%s has %d steps", ref, na);
    cr_assert_eq(nb, steps, "%s has %d steps", other, nb);
    for (int i = 0; i < steps; i++) {
        double x = a[from + i], y = b[i];
        if (tol == 0)
            cr_assert(memcmp(&x, &y, sizeof(x)) == 0, "step %d: %s loss %a, %s loss %a",
                      from + i + 1, ref, x, other, y);
        else
            cr_assert(fabs(x - y) <= tol * fabs(x),
                      "step %d: %s loss %.9g, %s loss %.9g (relative %.2g)", from + i + 1, ref,
                      x, other, y, fabs(x - y) / fabs(x));
    }
}

static void expect_same_losses(const char *ref, const char *other, int steps)
{
    expect_losses_at(ref, 0, other, steps, 1e-6);
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

#define TINY4                                                                                  \
    "--layers 4 --channels 32 --heads 4 --context 32 --batch 4 --steps 20 --warmup 5 --lr 3e-3 "
#define DET "WEFT_DETERMINISTIC=1"

/* Layouts of one global batch of 8 micro-batches. */
static const struct {
    int n;
    const char *args;
} layouts[] = {
    {2, "--dp 2 --accum 4 --zero 0"},
    {2, "--dp 2 --accum 4 --zero 1"},
    {2, "--dp 2 --accum 4 --zero 2"},
    {2, "--dp 2 --accum 4 --zero 3"},
    {4, "--dp 4 --accum 2 --zero 0"},
    {4, "--dp 4 --accum 2 --zero 1"},
    {4, "--dp 4 --accum 2 --zero 2"},
    {4, "--dp 4 --accum 2 --zero 3"},
    {2, "--tp 2 --accum 8"},
    {4, "--tp 4 --accum 8"},
    {2, "--pp 2 --schedule gpipe --accum 8"},
    {2, "--pp 2 --schedule 1f1b --accum 8"},
    {4, "--pp 4 --schedule gpipe --accum 8"},
    {4, "--pp 4 --schedule 1f1b --accum 8"},
    {8, "--dp 2 --tp 2 --pp 2 --zero 1 --accum 4"},
    {8, "--dp 2 --tp 2 --pp 2 --zero 3 --accum 4 --schedule gpipe"},
};

/* WEFT_TEST_QUICK=1 (the sanitizer pass): one layout of each kind (ZeRO-3,
 * TP 4, PP 4 1F1B, 3D), the plain pass runs them all. */
static bool layout_wanted(size_t k)
{
    const char *q = getenv("WEFT_TEST_QUICK");
    return !(q && strcmp(q, "0") != 0) || k == 3 || k == 9 || k == 13 || k == 15;
}

/* The memory table of the last run: every rank's activations equal the
 * schedule's formula (the micro-batches it held at once are those the
 * formula allows) and its model state is within 10% of the ZeRO formula
 * for its part. */
static void expect_memory_formulas(int n, const char *what)
{
    const char *t = strstr(out, "memory per rank");
    cr_assert_not_null(t, "%s: no memory table:\n%.4000s", what, out);
    for (int r = 0; r < n; r++) {
        char key[40];
        snprintf(key, sizeof(key), "\n%*d ", 26, r);
        const char *row = strstr(t, key);
        cr_assert_not_null(row, "%s: no row for rank %d:\n%s", what, r, t);
        double f[9];
        cr_assert_eq(sscanf(row, "%*d %lf %lf %lf %lf %lf %lf %lf | %lf %lf", &f[0], &f[1],
                            &f[2], &f[3], &f[4], &f[5], &f[6], &f[7], &f[8]),
                     9, "%s: %.200s", what, row);
        cr_assert(fabs(f[5] - f[7]) <= 0.10 * f[7],
                  "%s rank %d: model state %.2f MB, formula %.2f MB", what, r, f[5], f[7]);
        cr_assert(fabs(f[3] - f[8]) <= 0.01 * f[8],
                  "%s rank %d: activations %.2f MB, formula %.2f MB", what, r, f[3], f[8]);
    }
}

Test(trainer, every_layout_computes_the_serial_bits)
{
    char args[1024], name[64];
    snprintf(args, sizeof(args), TINY4 "--accum 8 --log %s/serial.csv", work);
    run_env_ok(1, DET, args);
    double l[20];
    char p[PATH_MAX + 32];
    snprintf(p, sizeof(p), "%s/serial.csv", work);
    cr_assert_eq(read_losses(p, l, 20), 20);
    cr_assert(l[19] < l[0] - 0.5, "serial loss went from %g to %g", l[0], l[19]);
    /* The comparison sees summation order: summing the micro-batches in
     * another order (a left fold: the serial run without determinism)
     * changes some bits. */
    snprintf(args, sizeof(args), TINY4 "--accum 8 --log %s/fold.csv", work);
    run_ok(1, args);
    double a[20], b[20];
    read_log(p, a, 20, true);
    snprintf(p, sizeof(p), "%s/fold.csv", work);
    read_log(p, b, 20, true);
    cr_assert(memcmp(a, b, sizeof(a)) != 0, "a left fold gave the tree's bits at every step");
    for (size_t k = 0; k < sizeof(layouts) / sizeof(layouts[0]); k++) {
        if (!layout_wanted(k))
            continue;
        snprintf(name, sizeof(name), "layout%zu.csv", k);
        snprintf(args, sizeof(args), TINY4 "%s --log %s/%s", layouts[k].args, work, name);
        run_env_ok(layouts[k].n, DET, args);
        cr_assert(strstr(out, "deterministic") != NULL, "%s", out);
        expect_losses_at("serial.csv", 0, name, 20, 0);
        expect_memory_formulas(layouts[k].n, layouts[k].args);
    }
}

Test(trainer, layouts_agree_without_determinism)
{
    char args[1024], name[64];
    snprintf(args, sizeof(args), TINY4 "--accum 8 --log %s/serial.csv", work);
    run_ok(1, args);
    for (size_t k = 7; k < sizeof(layouts) / sizeof(layouts[0]); k += 2) {
        if (!layout_wanted(k))
            continue;
        snprintf(name, sizeof(name), "layout%zu.csv", k);
        snprintf(args, sizeof(args), TINY4 "%s --log %s/%s", layouts[k].args, work, name);
        run_ok(layouts[k].n, args);
        expect_losses_at("serial.csv", 0, name, 20, 1e-5);
    }
}

/* dp2 x tp2 ZeRO-3 saves at step 6; pp2 resumes and saves at 9; a serial
 * run resumes from that: each continues the first run's bits. */
Test(trainer, checkpoints_cross_layouts_bit_for_bit)
{
    char args[1024];
    snprintf(args, sizeof(args),
             TINY4 "--steps 12 --dp 2 --tp 2 --zero 3 --accum 2 --save %s/x-%%d.bin "
                   "--save-every 6 --log %s/a.csv",
             work, work);
    run_env_ok(4, DET, args);
    snprintf(args, sizeof(args),
             TINY4 "--steps 12 --pp 2 --resume %s/x-6.bin --save %s/y-%%d.bin --save-every 9 "
                   "--log %s/b.csv",
             work, work, work);
    run_env_ok(2, DET, args);
    cr_assert(strstr(out, "[0, 2) [2, 4)") != NULL, "%s", out);
    snprintf(args, sizeof(args), TINY4 "--steps 12 --resume %s/y-9.bin --log %s/c.csv", work,
             work);
    run_env_ok(1, DET, args);
    expect_losses_at("a.csv", 6, "b.csv", 6, 0);
    expect_losses_at("a.csv", 9, "c.csv", 3, 0);
}

/* The AdamW moments in a file per rank, or a separate host store: the
 * same bits as keeping them in memory; the report says what moved. */
Test(trainer, offloaded_optimizer_state_changes_nothing)
{
    char args[1024];
    snprintf(args, sizeof(args), TINY "--accum 4 --log %s/mem.csv", work);
    run_env_ok(1, DET, args);
    snprintf(args, sizeof(args), TINY "--accum 4 --offload file:%s --log %s/file.csv", work, work);
    run_env_ok(1, DET, args);
    cr_assert(strstr(out, "offload file:") != NULL && strstr(out, "moved") != NULL, "%s", out);
    expect_losses_at("mem.csv", 0, "file.csv", 20, 0);
    snprintf(args, sizeof(args),
             TINY "--dp 2 --accum 2 --zero 2 --offload file:%s --log %s/file2.csv", work, work);
    run_env_ok(2, DET, args);
    expect_losses_at("mem.csv", 0, "file2.csv", 20, 0);
    snprintf(args, sizeof(args), TINY "--accum 4 --offload cpu --log %s/cpu.csv", work);
    run_env_ok(1, DET, args);
    expect_losses_at("mem.csv", 0, "cpu.csv", 20, 0);
    /* Each rank's file is gone afterwards. */
    char cmd[PATH_MAX + 64];
    snprintf(cmd, sizeof(cmd), "ls %s | grep -q weft-optim", work);
    cr_assert_neq(system(cmd), 0, "an offload file was left behind in %s", work);
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
    /* Layouts that cannot be built, each refused with its reason. */
    static const struct {
        int n;
        const char *args, *want;
    } bad[] = {
        {6, "--tp 3", "--tp 3 does not divide --heads 4"},
        {3, "--tp 2", "does not divide the 3 rank(s)"},
        {4, "--tp 2 --pp 2 --dp 2", "--dp 2 but 4 rank(s)"},
        {3, "--pp 3 --layers 2", "--pp 3 exceeds --layers 2"},
        {1, "--schedule gpipe", "--schedule needs a pipeline"},
        {1, "--schedule zigzag --pp 2", "--schedule is gpipe or 1f1b"},
        {2, "--pp 2 --layers 4 --stage-layers 1,2", "--stage-layers '1,2' must give 2"},
        {2, "--pp 2 --layers 4 --stage-layers 3,1,0", "--stage-layers"},
        {3, "--tp 3 --heads 6 --channels 48", "--tp 3 does not divide 16"},
        {1, "--offload gpu", "--offload"},
        {1, "--offload file:/nonexistent/dir", "/nonexistent/dir"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        rc = train(bad[k].n, bad[k].args, out, sizeof(out));
        cr_assert(rc != 0 && strstr(out, bad[k].want) != NULL, "%d ranks %s: rc %d, want '%s':\n%s",
                  bad[k].n, bad[k].args, rc, bad[k].want, out);
    }
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
    cr_assert(rc != 0 && strstr(out, "No space left on device") != NULL, "rc %d: %s", rc, out);
    /* An offload directory that fills up: the step fails with the reason,
     * and the checkpoint taken before still resumes. */
    snprintf(args, sizeof(args), TINY "--steps 2 --save %s/good.bin", work);
    run_ok(1, args);
    snprintf(args, sizeof(args), TINY "--steps 4 --resume %s/good.bin --offload file:%s", work,
             mnt);
    rc = train(1, args, out, sizeof(out));
    cr_assert(rc != 0 && strstr(out, "No space left on device") != NULL, "rc %d: %s", rc, out);
    snprintf(args, sizeof(args), TINY "--steps 4 --offload file:%s", mnt);
    rc = train(2, args, out, sizeof(out));
    cr_assert(rc != 0 && strstr(out, "No space left on device") != NULL, "rc %d: %s", rc, out);
    umount(mnt);
    snprintf(args, sizeof(args), TINY "--steps 4 --resume %s/good.bin", work);
    run_ok(1, args);
}
