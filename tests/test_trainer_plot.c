/*
 * test_trainer_plot.c - weft-plot (trainer/plot.c, built with
 * -DWEFT_PLOT_NO_MAIN) run as a function on CSV fixtures written to a
 * fresh temp dir: what the SVG holds (points per polyline, legend labels,
 * tick labels, the NaN comment), the exit codes and the messages that name
 * the bad file, and --png with a missing, a working and a failing converter.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* asprintf, mkdtemp, setenv */
#endif
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int weft_plot_main(int argc, char **argv);

#define HDR "step,train_loss,val_loss,lr,tokens_per_s,compute_ms,comm_ms\n"

/* Each Criterion test runs in its own process, so this state is per test. */
static char dir[64];
static char *err_text; /* stderr of the last plot() */
static char *paths[32];
static int npaths;

static void setup(void)
{
    strcpy(dir, "/tmp/weft-plot-test-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown(void)
{
    for (int i = 0; i < npaths; i++) {
        unlink(paths[i]);
        free(paths[i]);
    }
    rmdir(dir);
    free(err_text);
}

TestSuite(plot, .init = setup, .fini = teardown);

/* A path inside the temp dir; removed (if it exists) at teardown. */
static char *tpath(const char *name)
{
    cr_assert_lt(npaths, 32);
    char *p;
    cr_assert_gt(asprintf(&p, "%s/%s", dir, name), 0);
    return paths[npaths++] = p;
}

static char *fixture(const char *name, const char *text)
{
    char *p = tpath(name);
    FILE *f = fopen(p, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    cr_assert_eq(fclose(f), 0);
    return p;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    int c;
    while ((c = fgetc(f)) != EOF)
        fputc(c, m);
    fclose(m);
    fclose(f);
    return buf;
}

/* Runs weft_plot_main on a NULL-terminated argv and keeps its stderr in err_text. */
static int plot_argv(char **argv)
{
    int argc = 0;
    while (argv[argc])
        argc++;
    char errp[96];
    snprintf(errp, sizeof(errp), "%s/stderr.txt", dir);
    int fd = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600), saved = dup(2);
    cr_assert(fd >= 0 && saved >= 0);
    fflush(stderr);
    dup2(fd, 2);
    int rc = weft_plot_main(argc, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    free(err_text);
    err_text = slurp(errp);
    unlink(errp);
    return rc;
}
#define plot(...) plot_argv((char *[]){"weft-plot", __VA_ARGS__, NULL})

static int count(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* Coordinate pairs in the points attribute of the given polyline, or -1 if it is absent. */
static int points(const char *svg, const char *cls, int run)
{
    cr_assert_not_null(svg, "no SVG written");
    char key[96];
    snprintf(key, sizeof(key), "<polyline class=\"%s\" data-run=\"%d\"", cls, run);
    const char *p = strstr(svg, key);
    if (!p)
        return -1;
    const char *end = strstr(p, "/>");
    p = strstr(p, " points=\"");
    cr_assert(p && end && p < end);
    int n = 0;
    for (p += 9; *p != '"'; p++)
        n += *p == ',';
    /* The data-points attribute must agree with what is actually drawn. */
    char attr[48];
    snprintf(attr, sizeof(attr), "data-points=\"%d\"", n);
    const char *q = strstr(svg, key);
    cr_assert(strstr(q, attr) && strstr(q, attr) < end, "%s: %s disagrees", key, attr);
    return n;
}

/* Header, label comment, empty val cells, non-finite losses (printf's "-nan" too), and the
 * header again halfway (logs joined after a resume). */
static const char *const log_a = "# written by the weft trainer\n" HDR
                                 "# label: baseline & <friends>\n"
                                 "0,5.50,5.60,6e-4,1000,10,1\n"
                                 "10,4.00,,6e-4,1000,10,1\n"
                                 "20,nan,,6e-4,1000,10,1\n"
                                 "30,3.00,3.20,6e-4,1000,10,1\n"
                                 "40,2.50,inf,6e-4,1000,10,1\n"
                                 "50,2.25,,6e-4,1000,10,1\n" HDR
                                 "60,2.20,-nan,6e-4,1000,10,1\n";

Test(plot, parses_rows_labels_and_skips_non_finite)
{
    char *in = fixture("a.csv", log_a), *out = tpath("a.svg");
    cr_assert_eq(plot("-o", out, "--title", "GPT <small>", in), 0, "stderr: %s", err_text);
    char *svg = slurp(out);
    cr_assert_not_null(svg);
    cr_expect_eq(points(svg, "train", 0), 6); /* 7 rows, one NaN */
    cr_expect_eq(points(svg, "val", 0), 2);   /* 0 and 30; 40 and 60 not finite, the rest empty */
    cr_expect_eq(count(svg, "<circle"), 2, "one marker per val point");
    cr_expect(strstr(svg, "skipped 3 non-finite value(s)"), "NaN/inf count in a comment");
    cr_expect(strstr(svg, ">baseline &amp; &lt;friends&gt;</text>"), "escaped legend label");
    cr_expect(strstr(svg, ">GPT &lt;small&gt;</text>"), "escaped title");
    cr_expect(strstr(svg, "stroke-dasharray"), "val is dashed");
    cr_expect(strstr(svg, "</svg>\n"));
    free(svg);
}

Test(plot, label_defaults_to_file_name_without_extension)
{
    char *in = fixture("run-b.v2.csv", HDR "0,3,,1,1,1,1\n5,2,,1,1,1,1\n");
    char *out = tpath("b.svg");
    cr_assert_eq(plot("-o", out, in), 0, "stderr: %s", err_text);
    char *svg = slurp(out);
    cr_expect(strstr(svg, ">run-b.v2</text>"));
    cr_expect(strstr(svg, ">loss</text>"), "default title");
    cr_expect_eq(points(svg, "train", 0), 2);
    cr_expect_eq(points(svg, "val", 0), -1, "no val values, no val polyline");
    free(svg);
}

Test(plot, several_runs_get_their_own_colour_and_legend_entry)
{
    char *a = fixture("a.csv", log_a);
    char *b = fixture("b.csv", HDR "# label: zero3\n0,6,,1,1,1,1\n10,5,4.9,1,1,1,1\n");
    char *out = tpath("ab.svg");
    cr_assert_eq(plot("-o", out, a, b), 0, "stderr: %s", err_text);
    char *svg = slurp(out);
    cr_expect_eq(points(svg, "train", 0), 6);
    cr_expect_eq(points(svg, "train", 1), 2);
    cr_expect_eq(points(svg, "val", 1), 1);
    cr_expect(strstr(svg, ">zero3</text>") && strstr(svg, ">baseline &amp;"));
    cr_expect_eq(count(svg, "stroke=\"#1f77b4\""), 3, "run 0: train, val, legend");
    cr_expect_eq(count(svg, "stroke=\"#ff7f0e\""), 3, "run 1: train, val, legend");
    free(svg);
}

/* Steps 0..10, loss 4 -> 2: ticks 0,2,..,10 and 2.0,2.5,..,4.0, and y does not start at 0. */
Test(plot, nice_ticks_and_data_driven_y_range)
{
    char csv[1024] = HDR;
    for (int s = 0; s <= 10; s++)
        snprintf(csv + strlen(csv), sizeof(csv) - strlen(csv), "%d,%.1f,,1,1,1,1\n", s,
                 4.0 - 0.2 * s);
    char *in = fixture("t.csv", csv), *out = tpath("t.svg");
    cr_assert_eq(plot("-o", out, in), 0, "stderr: %s", err_text);
    char *svg = slurp(out);
    const char *x[] = {">0</text>", ">2</text>", ">4</text>", ">6</text>", ">8</text>",
                       ">10</text>"};
    const char *y[] = {">2.0</text>", ">2.5</text>", ">3.0</text>", ">3.5</text>", ">4.0</text>"};
    for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++)
        cr_expect_eq(count(svg, x[i]), 1, "x tick %s", x[i]);
    for (size_t i = 0; i < sizeof(y) / sizeof(y[0]); i++)
        cr_expect_eq(count(svg, y[i]), 1, "y tick %s", y[i]);
    cr_expect_eq(count(svg, "class=\"tick\""), 11, "6 x ticks + 5 y ticks, no others");
    cr_expect_null(strstr(svg, ">0.0</text>"), "y axis is not forced to 0");
    cr_expect_null(strstr(svg, ">1.5</text>"), "padding is small");
    cr_expect_eq(points(svg, "train", 0), 11);
    free(svg);
}

Test(plot, single_point_is_drawn)
{
    char *in = fixture("one.csv", HDR "7,3.25,,1,1,1,1\n"), *out = tpath("one.svg");
    cr_assert_eq(plot("-o", out, in), 0, "stderr: %s", err_text);
    char *svg = slurp(out);
    cr_expect_eq(points(svg, "train", 0), 1);
    cr_expect_eq(count(svg, "<circle"), 1, "a lone point needs a marker to be seen");
    cr_expect(strstr(svg, ">7</text>") && strstr(svg, ">3.25</text>"));
    cr_expect_null(strstr(svg, "nan"), "no NaN coordinates");
    cr_expect_null(strstr(svg, "inf,"), "no infinite coordinates");
    free(svg);
}

Test(plot, missing_file_is_named_and_exits_1)
{
    char *good = fixture("good.csv", log_a), *missing = tpath("missing.csv");
    cr_expect_eq(plot("-o", tpath("m.svg"), good, missing), 1);
    cr_expect(strstr(err_text, missing), "stderr names the file: %s", err_text);
    cr_expect_null(strstr(err_text, good));
}

Test(plot, empty_file_is_named_and_exits_1)
{
    char *empty = fixture("empty.csv", ""), *hdr = fixture("hdr.csv", "# label: x\n" HDR);
    cr_expect_eq(plot("-o", tpath("e.svg"), empty), 1);
    cr_expect(strstr(err_text, empty) && strstr(err_text, "empty"), "%s", err_text);
    cr_expect_eq(plot("-o", tpath("h.svg"), hdr), 1);
    cr_expect(strstr(err_text, hdr) && strstr(err_text, "no data rows"), "%s", err_text);
}

Test(plot, bad_rows_and_headers_name_file_and_line)
{
    char *bad = fixture("bad.csv", HDR "0,3,,1,1,1,1\n1,oops,,1,1,1,1\n2,3,,1,1,1,1\n");
    cr_expect_eq(plot("-o", tpath("x.svg"), bad), 1);
    cr_expect(strstr(err_text, "bad.csv:3: malformed row"), "%s", err_text);
    char *nostep = fixture("nostep.csv", HDR "0,3,,1,1,1,1\n,2.5,,1,1,1,1\n");
    cr_expect_eq(plot("-o", tpath("z.svg"), nostep), 1, "a row needs a step");
    cr_expect(strstr(err_text, "nostep.csv:3: malformed row"), "%s", err_text);
    char *hdr = fixture("hdr.csv", "loss,step\n1,2\n");
    cr_expect_eq(plot("-o", tpath("y.svg"), hdr), 1);
    cr_expect(strstr(err_text, "hdr.csv:1"), "%s", err_text);
}

Test(plot, truncated_last_line_is_ignored)
{
    char *in = fixture("cut.csv", HDR "0,3,,1,1,1,1\n1,2.9,2.95,1,1,1,1\n2,2.");
    char *out = tpath("cut.svg");
    cr_expect_eq(plot("-o", out, in), 0, "%s", err_text);
    cr_expect(strstr(err_text, "truncated"));
    char *svg = slurp(out);
    cr_expect_eq(points(svg, "train", 0), 2);
    free(svg);
}

Test(plot, all_values_non_finite_exits_1)
{
    char *in = fixture("nan.csv", HDR "0,nan,,1,1,1,1\n1,inf,-inf,1,1,1,1\n");
    cr_expect_eq(plot("-o", tpath("n.svg"), in), 1);
    cr_expect(strstr(err_text, "no finite"), "%s", err_text);
}

Test(plot, bad_arguments_print_usage_and_exit_2)
{
    char *in = fixture("a.csv", log_a);
    cr_expect_eq(plot(in), 2, "no -o");
    cr_expect(strstr(err_text, "usage: weft-plot"));
    cr_expect_eq(plot("-o", tpath("x.svg")), 2, "no inputs");
    cr_expect_eq(plot("-o"), 2, "-o without a value");
    cr_expect_eq(plot("--title"), 2);
    cr_expect_eq(plot("--bogus", "-o", tpath("y.svg"), in), 2);
    cr_expect(strstr(err_text, "--bogus") && strstr(err_text, "usage:"), "%s", err_text);
}

Test(plot, more_runs_than_colours_warns)
{
    char *in = fixture("a.csv", log_a), *out = tpath("many.svg");
    cr_expect_eq(plot("-o", out, in, in, in, in, in, in, in, in, in, in, in), 0);
    cr_expect(strstr(err_text, "colours repeat"), "%s", err_text);
    char *svg = slurp(out);
    cr_expect_eq(points(svg, "train", 10), 6);
    cr_expect_eq(count(svg, "class=\"label\""), 11);
    free(svg);
}

Test(plot, png_without_converter_writes_svg_only)
{
    char *in = fixture("a.csv", log_a), *out = tpath("p.svg"), *png = tpath("p.png");
    cr_assert_eq(setenv("PATH", dir, 1), 0); /* an empty dir: no rsvg-convert */
    cr_expect_eq(plot("-o", out, "--png", in), 0);
    cr_expect(strstr(err_text, "no converter"), "%s", err_text);
    cr_expect_eq(access(out, F_OK), 0);
    cr_expect_neq(access(png, F_OK), 0);
}

/* A stand-in rsvg-convert on PATH: checks its arguments and writes the PNG, or fails. */
static void fake_converter(int status)
{
    char script[256];
    snprintf(script, sizeof(script),
             "#!/bin/sh\n[ \"$1 $2 $3\" = \"-f png -o\" ] || exit 9\necho png > \"$4\"\nexit %d\n",
             status);
    char *p = fixture("rsvg-convert", script);
    cr_assert_eq(chmod(p, 0700), 0);
    cr_assert_eq(setenv("PATH", dir, 1), 0);
}

Test(plot, png_with_converter)
{
    char *in = fixture("a.csv", log_a), *out = tpath("p.svg"), *png = tpath("p.png");
    fake_converter(0);
    cr_expect_eq(plot("-o", out, "--png", in), 0, "%s", err_text);
    cr_expect_eq(access(png, F_OK), 0, "OUT.svg -> OUT.png");
}

Test(plot, png_converter_failure_is_reported)
{
    char *in = fixture("a.csv", log_a), *out = tpath("p.svg");
    tpath("p.png"); /* the fake writes it before failing */
    fake_converter(3);
    cr_expect_eq(plot("-o", out, "--png", in), 1);
    cr_expect(strstr(err_text, "rsvg-convert failed (exit 3)"), "%s", err_text);
}

/* A label too long for the legend is cut at a character boundary, not inside UTF-8. */
Test(plot, long_label_is_cut_on_a_character_boundary)
{
    char csv[512] = "# label: a";
    for (int i = 0; i < 20; i++)
        strcat(csv, "\u00e9"); /* 2 bytes each: byte 30 is inside one */
    strcat(csv, "\n" HDR "0,3,,1,1,1,1\n");
    char *in = fixture("long.csv", csv), *out = tpath("long.svg");
    cr_assert_eq(plot("-o", out, in), 0, "%s", err_text);
    char *svg = slurp(out);
    char want[128] = ">a";
    for (int i = 0; i < 14; i++)
        strcat(want, "\u00e9");
    strcat(want, "\u2026</text>");
    cr_expect(strstr(svg, want), "legend label cut to %s", want);
    free(svg);
}
