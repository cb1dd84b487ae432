/*
 * plot.c - weft-plot: draws the trainer's CSV loss logs as one SVG (and,
 * with --png, a PNG through rsvg-convert when it is installed).
 *   weft-plot -o loss.svg [--title T] [--png] run1.csv [run2.csv ...]
 */
#define _DEFAULT_SOURCE /* getline, strsep */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

extern char **environ;

/* Callable from tests; main() below is only a wrapper. */
int weft_plot_main(int argc, char **argv);

/* Tableau 10: distinct in colour and in lightness, so runs stay apart in print. */
static const char *const colours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define NCOLOURS (int)(sizeof(colours) / sizeof(colours[0]))

/* Canvas layout (px).  The legend sits right of the plot so it never hides a curve; its
 * 210 px hold ~32 characters, so longer labels are cut (librsvg ignores textLength). */
enum { W = 960, H = 500, ML = 70, MR = 260, MT = 45, MB = 50 };

/* The log's first columns, in the order of its header; struct run keeps these three. */
enum { STEP, TRAIN, VAL, NCOL };
#define HEADER "step,train_loss,val_loss"

/* One log file, owned by weft_plot_main.  An absent (empty) or non-finite loss is NAN in
 * row, so drawing only tests isfinite(); the non-finite ones are counted in skipped. */
struct run {
    const char *path;       /* borrowed from argv */
    char label[128];        /* run_load's sscanf reads at most 127 chars into it */
    double (*row)[NCOL];    /* (n, NCOL): step, train_loss, val_loss */
    size_t n, cap, skipped; /* rows, rows allocated, NaN/inf cells seen in the file */
};

static void usage(FILE *f)
{
    fprintf(f, "usage: weft-plot -o OUT.svg [--title T] [--png] run1.csv [run2.csv ...]\n"
               "  -o OUT.svg   where to write the plot (required)\n"
               "  --title T    title drawn above the plot (default \"loss\")\n"
               "  --png        also write OUT.png with rsvg-convert, if it is on PATH\n"
               "Inputs are trainer logs (" HEADER ",...); '# label: TEXT' names a run.\n");
}

/* 0: empty cell (absent: "not measured this step"), 1: a number, NaN/inf included, -1: junk. */
static int parse_cell(const char *s, double *v)
{
    char *end;
    s += strspn(s, " \t");
    *v = NAN;
    if (!*s)
        return 0;
    *v = strtod(s, &end);
    return end != s && end[strspn(end, " \t")] == '\0' ? 1 : -1;
}

static int run_load(struct run *r)
{
    const char *path = r->path, *base = strrchr(path, '/');
    char *line = NULL, *field[NCOL];
    size_t cap = 0, lineno = 0, hl = strlen(HEADER);
    bool header = false;
    int ret = -1;
    FILE *f = fopen(path, "r");
    if (!f) {
        fprintf(stderr, "weft-plot: %s: %s\n", path, strerror(errno));
        return -1;
    }
    /* Default label: the file name without directory and extension. */
    snprintf(r->label, sizeof(r->label), "%s", base ? base + 1 : path);
    char *dot = strrchr(r->label, '.');
    if (dot && dot != r->label)
        *dot = '\0';
    for (ssize_t len; (len = getline(&line, &cap, f)) > 0;) {
        lineno++;
        bool cut = line[len - 1] != '\n';
        if (line[0] == '#') { /* sscanf leaves label alone unless the line is a label */
            sscanf(line, "# label: %127[^\r\n]", r->label);
            continue;
        }
        if (strspn(line, " \t\r\n") == (size_t)len)
            continue;
        /* Later columns may come and go; these three must be where the trainer puts them.
         * A header again further down (logs joined after a resume) is skipped too. */
        if (strncmp(line, HEADER, hl) == 0 && strchr(",\r\n", line[hl])) {
            header = true;
            continue;
        } else if (!header) {
            fprintf(stderr, "weft-plot: %s:%zu: expected header " HEADER "\n", path, lineno);
            goto out;
        }
        int nf = 0;
        line[strcspn(line, "\r\n")] = '\0';
        for (char *p = line; p && nf < NCOL;) /* strsep, unlike strtok, keeps empty cells */
            field[nf++] = strsep(&p, ",");
        double v[NCOL];
        bool ok = nf == NCOL;
        for (int c = 0; c < NCOL && ok; c++) {
            int k = parse_cell(field[c], &v[c]);
            ok = k >= 0 && (c != STEP || isfinite(v[c]));
            if (c != STEP && k == 1 && !isfinite(v[c]))
                r->skipped++, v[c] = NAN;
        }
        if (!ok && cut) { /* a run killed mid-write (or still running) cuts its last line */
            fprintf(stderr, "weft-plot: %s:%zu: ignoring truncated last line\n", path, lineno);
            break;
        } else if (!ok) {
            fprintf(stderr, "weft-plot: %s:%zu: malformed row\n", path, lineno);
            goto out;
        }
        if (r->n == r->cap) {
            size_t ncap = r->cap ? 2 * r->cap : 256;
            double(*row)[NCOL] = realloc(r->row, ncap * sizeof(*row));
            if (!row) {
                fprintf(stderr, "weft-plot: %s: out of memory\n", path);
                goto out;
            }
            r->row = row, r->cap = ncap;
        }
        memcpy(r->row[r->n++], v, sizeof(v));
    }
    if (ferror(f) || r->n == 0) {
        const char *why = ferror(f) ? strerror(errno) : header ? "no data rows" : "empty file";
        fprintf(stderr, "weft-plot: %s: %s\n", path, why);
        goto out;
    }
    ret = 0;
out:
    free(line);
    fclose(f);
    return ret;
}

/* 1-2-5 steps: the tick spacing a person would pick for about `target` ticks. */
static double nice_step(double range, int target, double min_step)
{
    double mag = pow(10, floor(log10(range / target))), f = range / target / mag;
    double s = (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
    return s < min_step ? min_step : s;
}

/* Escapes for text and attribute values; control bytes are not allowed in XML 1.0. */
static void xml_putn(FILE *f, const char *s, size_t n)
{
    static const char special[] = "&<>\"", *const entity[] = {"&amp;", "&lt;", "&gt;", "&quot;"};
    for (; n-- && *s; s++) {
        const char *hit = strchr(special, *s);
        if (hit)
            fputs(entity[hit - special], f);
        else
            fputc((unsigned char)*s < 0x20 ? ' ' : *s, f);
    }
}

/* The data range shown, in data units; px()/py() map it onto the plot area. */
struct frame {
    double x0, x1, y0, y1;
};

static double px(const struct frame *fr, double x)
{
    return ML + (x - fr->x0) / (fr->x1 - fr->x0) * (W - ML - MR);
}

static double py(const struct frame *fr, double y)
{
    return H - MB - (y - fr->y0) / (fr->y1 - fr->y0) * (H - MT - MB);
}

/* Grid lines and labels for one axis; steps are integers, so x ticks are at least 1 apart. */
static void draw_ticks(FILE *f, const struct frame *fr, bool yaxis)
{
    double lo = yaxis ? fr->y0 : fr->x0, hi = yaxis ? fr->y1 : fr->x1;
    double s = nice_step(hi - lo, 6, yaxis ? 0 : 1);
    int dec = s >= 1 ? 0 : (int)ceil(-log10(s) - 1e-9); /* 0.5-steps print "2.5", not "2.500000" */
    fprintf(f, "<g class=\"%cticks\" text-anchor=\"%s\">\n", yaxis ? 'y' : 'x',
            yaxis ? "end" : "middle");
    /* Integer multiples, not v += s, so 0.1-steps do not drift off the last tick; the cap
     * ends the loop where lo / s is too large for i0 + j to move (absurd data, not a hang). */
    double i0 = ceil(lo / s - 1e-9), nt = floor(hi / s + 1e-9) - i0;
    for (int j = 0; j <= nt && j < 50; j++) {
        double v = (i0 + j) * s + 0.0; /* -0.0 + 0.0 is +0.0: no "-0" label */
        double p = yaxis ? py(fr, v) : px(fr, v);
        fprintf(f,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                "<text class=\"tick\" x=\"%.1f\" y=\"%.1f\">%.*f</text>\n",
                yaxis ? ML : p, yaxis ? p : MT, yaxis ? W - MR : p, yaxis ? p : H - MB,
                yaxis ? ML - 6 : p, yaxis ? p + 4 : H - MB + 16, dec, v);
    }
    fputs("</g>\n", f);
}

/* One curve through the finite points (NaN/inf and absent cells are left out). */
static void draw_series(FILE *f, const struct frame *fr, const struct run *r, int idx, int col)
{
    size_t n = 0;
    for (size_t i = 0; i < r->n; i++)
        n += isfinite(r->row[i][col]) != 0;
    if (n == 0)
        return; /* e.g. a run that never validated: no empty polyline */
    const char *c = colours[idx % NCOLOURS];
    fprintf(f,
            "<polyline class=\"%s\" data-run=\"%d\" data-points=\"%zu\" fill=\"none\" "
            "stroke=\"%s\" stroke-width=\"1.5\"%s points=\"",
            col == VAL ? "val" : "train", idx, n, c, col == VAL ? " stroke-dasharray=\"6,4\"" : "");
    for (size_t i = 0, k = 0; i < r->n; i++)
        if (isfinite(r->row[i][col]))
            fprintf(f, "%s%.1f,%.1f", k++ ? " " : "", px(fr, r->row[i][STEP]),
                    py(fr, r->row[i][col]));
    fputs("\"/>\n", f);
    if (col != VAL && n > 1)
        return;
    /* Validation is sparse: dots show where it was measured (and a lone point needs one). */
    fprintf(f, "<g class=\"markers\" data-run=\"%d\" fill=\"%s\">\n", idx, c);
    for (size_t i = 0; i < r->n; i++)
        if (isfinite(r->row[i][col]))
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\"/>\n", px(fr, r->row[i][STEP]),
                    py(fr, r->row[i][col]));
    fputs("</g>\n", f);
}

static int write_svg(const char *out, const char *title, const struct run *runs, int nruns)
{
    struct frame fr = {INFINITY, -INFINITY, INFINITY, -INFINITY};
    size_t skipped = 0;
    for (int k = 0; k < nruns; k++) {
        skipped += runs[k].skipped;
        for (size_t i = 0; i < runs[k].n; i++)
            for (int c = TRAIN; c <= VAL; c++) {
                const double *row = runs[k].row[i];
                if (!isfinite(row[c]))
                    continue;
                fr.x0 = fmin(fr.x0, row[STEP]), fr.x1 = fmax(fr.x1, row[STEP]);
                fr.y0 = fmin(fr.y0, row[c]), fr.y1 = fmax(fr.y1, row[c]);
            }
    }
    if (!isfinite(fr.y0)) {
        fprintf(stderr, "weft-plot: no finite loss values in any input\n");
        return -1;
    }
    /* From the data, not from 0: the interesting part of a loss curve is the bend. */
    double pad = fr.y1 > fr.y0 ? 0.05 * (fr.y1 - fr.y0) : fr.y0 != 0 ? 0.05 * fabs(fr.y0) : 0.5;
    fr.y0 -= pad, fr.y1 += pad;
    if (fr.x1 == fr.x0)
        fr.x0 -= 1, fr.x1 += 1;

    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "weft-plot: %s: %s\n", out, strerror(errno));
        return -1;
    }
    fprintf(f,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
            "viewBox=\"0 0 %d %d\" font-family=\"sans-serif\" font-size=\"12\">\n"
            "<!-- weft-plot: %d run(s); skipped %zu non-finite value(s) (NaN/inf) -->\n"
            "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n"
            "<text class=\"title\" x=\"%d\" y=\"%d\" text-anchor=\"middle\" font-size=\"16\">",
            W, H, W, H, nruns, skipped, W, H, (ML + W - MR) / 2, MT - 18);
    xml_putn(f, title, strlen(title));
    fputs("</text>\n", f);
    draw_ticks(f, &fr, false);
    draw_ticks(f, &fr, true);
    fprintf(f,
            "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n"
            "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n"
            "<text x=\"18\" y=\"%d\" text-anchor=\"middle\" transform=\"rotate(-90 18 %d)\">"
            "loss</text>\n",
            ML, MT, W - ML - MR, H - MT - MB, (ML + W - MR) / 2, H - 12, (MT + H - MB) / 2,
            (MT + H - MB) / 2);
    for (int k = 0; k < nruns; k++) {
        draw_series(f, &fr, &runs[k], k, TRAIN);
        draw_series(f, &fr, &runs[k], k, VAL);
    }
    int lx = W - MR + 15, ly = MT + 10;
    fputs("<g class=\"legend\">\n", f);
    for (int k = 0; k < nruns; k++, ly += 18) {
        fprintf(f,
                "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"/>"
                "<text class=\"label\" x=\"%d\" y=\"%d\">",
                lx, ly, lx + 24, ly, colours[k % NCOLOURS], lx + 30, ly + 4);
        const char *lab = runs[k].label;
        size_t len = strlen(lab), cut = len > 32 ? 30 : len;
        while (cut < len && (lab[cut] & 0xC0) == 0x80) /* not inside a UTF-8 sequence */
            cut--;
        xml_putn(f, lab, cut);
        fputs(cut < len ? "\u2026</text>\n" : "</text>\n", f);
    }
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" fill=\"#555\">solid train, dashed val</text>\n</g>\n</svg>\n",
            lx, ly + 6);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad) {
        fprintf(stderr, "weft-plot: %s: write failed\n", out);
        return -1;
    }
    return 0;
}

/* 0: PNG written, or no converter (said so, SVG only); -1: the converter failed. */
static int write_png(const char *svg)
{
    int ret = -1, status = 0, err;
    size_t n = strlen(svg);
    char *png = malloc(n + 5);
    if (!png)
        return -1;
    bool ext = n > 4 && strcmp(svg + n - 4, ".svg") == 0;
    snprintf(png, n + 5, "%.*s.png", (int)(ext ? n - 4 : n), svg);
    char *argv[] = {"rsvg-convert", "-f", "png", "-o", png, (char *)svg, NULL};
    pid_t pid;
    if ((err = posix_spawnp(&pid, argv[0], NULL, NULL, argv, environ)) == ENOENT) {
        fprintf(stderr, "weft-plot: no converter (rsvg-convert, librsvg2-bin): only %s\n", svg);
        ret = 0;
    } else if (err) {
        fprintf(stderr, "weft-plot: cannot run rsvg-convert: %s\n", strerror(err));
    } else {
        while ((err = waitpid(pid, &status, 0) < 0 ? errno : 0) == EINTR)
            continue;
        if (!err && WIFEXITED(status) && WEXITSTATUS(status) == 0)
            ret = 0;
        else if (err)
            fprintf(stderr, "weft-plot: waitpid: %s\n", strerror(err));
        else /* a signal reads as the shell shows it: 128 + signal number */
            fprintf(stderr, "weft-plot: rsvg-convert failed (exit %d); %s not written\n",
                    WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), png);
    }
    free(png);
    return ret;
}

/* Exit codes: 0 ok, 1 an input or output failed, 2 bad arguments. */
int weft_plot_main(int argc, char **argv)
{
    const char *out = NULL, *title = "loss";
    bool png = false;
    int ret = 1, nruns = 0;
    struct run *runs = calloc(argc > 0 ? (size_t)argc : 1, sizeof(*runs));
    if (!runs)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (a[0] != '-' || a[1] == '\0') {
            runs[nruns++].path = a; /* ./-odd.csv for a file whose name starts with '-' */
        } else if (strcmp(a, "--png") == 0) {
            png = true;
        } else if (strcmp(a, "-o") == 0 || strcmp(a, "--title") == 0) {
            if (i + 1 == argc) {
                fprintf(stderr, "weft-plot: %s needs a value\n", a);
                goto bad_args;
            }
            if (a[1] == 'o')
                out = argv[++i];
            else
                title = argv[++i];
        } else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(stdout);
            ret = 0;
            goto out;
        } else {
            fprintf(stderr, "weft-plot: unknown option %s\n", a);
            goto bad_args;
        }
    }
    if (!out || nruns == 0) {
        fprintf(stderr, "weft-plot: %s\n", !out ? "-o OUT.svg is required" : "no input files");
        goto bad_args;
    }
    if (nruns > NCOLOURS)
        fprintf(stderr, "weft-plot: %d runs but %d colours: colours repeat\n", nruns, NCOLOURS);
    for (int k = 0; k < nruns; k++)
        if (run_load(&runs[k]) < 0)
            goto out;
    if (write_svg(out, title, runs, nruns) == 0 && (!png || write_png(out) == 0))
        ret = 0;
    goto out;
bad_args:
    usage(stderr);
    ret = 2;
out:
    for (int k = 0; k < nruns; k++)
        free(runs[k].row);
    free(runs);
    return ret;
}

#ifndef WEFT_PLOT_NO_MAIN
int main(int argc, char **argv)
{
    return weft_plot_main(argc, argv);
}
#endif
