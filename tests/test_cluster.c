/*
 * test_cluster.c - the collectives between pretend nodes: tests/cluster/
 * cluster.sh puts ranks in network namespaces joined by veth links, shaped
 * with tc and, for latency, switched by the delaying relay, and the perf
 * tools run there with their exact check on.  Needs root; skips otherwise.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_ARGS 48
#define MAX_ALGOS 16
#define MAX_ROWS 64
#define RUN_TIMEOUT "120" /* seconds one cluster.sh run may take before its ranks are killed */
#define DELAY_US 200
#define GBIT_GBS 0.125 /* 1 Gbit/s in the perf tools' GB/s (1e9 bytes) */

static const char *const colls[] = {"all_reduce", "reduce_scatter", "all_gather", "broadcast",
                                    "reduce"};

/* One row of a perf tool's table. */
struct row {
    double bytes;
    double time_us[2]; /* out-of-place, in-place */
    double busbw[2];   /* GB/s */
    long wrong[2];     /* -1: N/A (not checked) */
};

/* One finished cluster.sh run; logdir is removed when it passed. */
struct run {
    pid_t pid;   /* cluster.sh's pid: its names start wc<pid>- */
    int status;  /* exit code, or 128 + signal */
    char logdir[64];
    char out[96]; /* cluster.sh's own stdout and stderr */
};

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Starts argv with stdout and stderr into `out`; returns the pid. */
static pid_t spawn(char *const argv[], const char *out)
{
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(126);
        setpgid(0, 0); /* Criterion's own signals stay with Criterion */
        execv(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        cr_assert(errno == EINTR, "waitpid: %s", strerror(errno));
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return strdup("");
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        fwrite(chunk, 1, n, m);
    fclose(m);
    fclose(f);
    return buf;
}

/* Everything a run made is gone: its namespaces (and with them the veths,
 * the bridge and the ranks), the relay, any link named after it. */
static void expect_no_leftovers(const struct run *r)
{
    char prefix[32], path[128];
    snprintf(prefix, sizeof(prefix), "wc%d-", (int)r->pid);
    const char *dirs[] = {"/run/netns", "/sys/class/net"};
    for (int d = 0; d < 2; d++) {
        DIR *dir = opendir(dirs[d]);
        if (dir == NULL)
            continue;
        for (struct dirent *e; (e = readdir(dir)) != NULL;)
            cr_expect(strncmp(e->d_name, prefix, strlen(prefix)) != 0,
                      "%s/%s is left over from the run in %s", dirs[d], e->d_name, r->logdir);
        closedir(dir);
    }
    snprintf(path, sizeof(path), "%s/relay.pid", r->logdir);
    FILE *f = fopen(path, "r");
    int relay;
    if (f && fscanf(f, "%d", &relay) == 1)
        cr_expect(kill(relay, 0) != 0 && errno == ESRCH, "relay pid %d outlived its run (%s)",
                  relay, r->logdir);
    if (f)
        fclose(f);
}

/* The reason this machine cannot run the cluster, or skips the test. */
static void need_cluster(void)
{
    if (geteuid() != 0)
        cr_skip_test("needs root for network namespaces, veth and tc (CI runs it as root)");
    char out[] = "/tmp/weft-cluster-check.XXXXXX";
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    char *argv[] = {"/bin/bash", WEFT_CLUSTER_SH, "check", NULL};
    int rc = wait_exit(spawn(argv, out));
    char *why = slurp(out);
    unlink(out);
    why[strcspn(why, "\n")] = '\0';
    if (rc == 77)
        cr_skip_test("%s", why);
    cr_assert_eq(rc, 0, "cluster.sh check: %s", why);
    free(why);
    cr_assert(access(WEFT_RELAY, X_OK) == 0, "%s is not built (make check builds it)",
              WEFT_RELAY);
}

/* Runs `cluster.sh run K M <opts> -- <cmd>`; both lists end with NULL. */
static void cluster_run(struct run *r, int k, int m, const char *const *opts,
                        const char *const *cmd)
{
    char ks[16], ms[16];
    snprintf(ks, sizeof(ks), "%d", k);
    snprintf(ms, sizeof(ms), "%d", m);
    snprintf(r->logdir, sizeof(r->logdir), "/tmp/weft-test-cluster.XXXXXX");
    cr_assert(mkdtemp(r->logdir) != NULL, "mkdtemp: %s", strerror(errno));
    snprintf(r->out, sizeof(r->out), "%s/cluster.log", r->logdir);
    const char *argv[MAX_ARGS];
    int n = 0;
    const char *head[] = {"/bin/bash", WEFT_CLUSTER_SH, "run", ks, ms, "--timeout", RUN_TIMEOUT,
                          "--logdir", r->logdir, "--relay", WEFT_RELAY};
    for (size_t i = 0; i < sizeof(head) / sizeof(head[0]); i++)
        argv[n++] = head[i];
    for (; opts && *opts; opts++)
        argv[n++] = *opts;
    argv[n++] = "--";
    for (; *cmd && n < MAX_ARGS - 1; cmd++)
        argv[n++] = *cmd;
    cr_assert(*cmd == NULL, "too many arguments");
    argv[n] = NULL;
    r->pid = spawn((char *const *)argv, r->out);
    r->status = wait_exit(r->pid);
    expect_no_leftovers(r);
}

/* The rows of rank 0's table; *ok is set when the summary says 0 wrong. */
static int parse_rows(const struct run *r, struct row *rows, int *ok)
{
    char path[128], line[512];
    snprintf(path, sizeof(path), "%s/rank0.out", r->logdir);
    FILE *f = fopen(path, "r");
    int n = 0;
    *ok = 0;
    if (f == NULL)
        return 0;
    while (fgets(line, sizeof(line), f) && n < MAX_ROWS) {
        if (strncmp(line, "# Out of bounds values : 0 OK", 29) == 0)
            *ok = 1;
        if (line[0] == '#')
            continue;
        char w0[16], w1[16], type[16], op[16];
        double count, root;
        struct row *w = &rows[n];
        if (sscanf(line, "%lf %lf %15s %15s %lf %lf %*f %lf %15s %lf %*f %lf %15s", &w->bytes,
                   &count, type, op, &root, &w->time_us[0], &w->busbw[0], w0, &w->time_us[1],
                   &w->busbw[1], w1) != 11)
            continue;
        w->wrong[0] = strcmp(w0, "N/A") == 0 ? -1 : strtol(w0, NULL, 10);
        w->wrong[1] = strcmp(w1, "N/A") == 0 ? -1 : strtol(w1, NULL, 10);
        n++;
    }
    fclose(f);
    return n;
}

/* Sizes -b 8 -e 4M -f 2 gives. */
#define FULL_ROWS 20

/* Removes a passed run's logs; a failed run's stay for the post-mortem. */
static void finish(const struct run *r, int passed)
{
    if (passed)
        nftw(r->logdir, remove_one, 8, FTW_DEPTH | FTW_PHYS);
    else
        cr_log_warn("logs of the failed run: %s\n", r->logdir);
}

/* A perf tool with -c 1 passed: every rank exited 0, one row per size,
 * every checked placement 0 wrong.  Returns the rows for further checks
 * and sets *passed. */
static int expect_checked(struct run *r, const char *what, int want_rows, struct row *rows,
                          int *passed)
{
    int ok, n = parse_rows(r, rows, &ok);
    char *log = slurp(r->out);
    cr_expect_eq(r->status, 0, "%s: cluster.sh exited %d:\n%s", what, r->status, log);
    cr_expect_eq(n, want_rows, "%s: %d rows, expected %d (%s)", what, n, want_rows, r->logdir);
    cr_expect(ok, "%s: no '# Out of bounds values : 0 OK' (%s)", what, r->logdir);
    int bad = r->status != 0 || n != want_rows || !ok;
    for (int i = 0; i < n; i++) {
        cr_expect(rows[i].wrong[0] == 0 && rows[i].wrong[1] <= 0,
                  "%s: %.0f bytes: %ld/%ld wrong (%s)", what, rows[i].bytes, rows[i].wrong[0],
                  rows[i].wrong[1], r->logdir);
        bad |= rows[i].wrong[0] != 0 || rows[i].wrong[1] > 0;
    }
    free(log);
    *passed = !bad;
    return n;
}

/* The algorithm names weft-info lists, e.g. ring tree rhd direct hier. */
static int algorithms(char names[MAX_ALGOS][16])
{
    char out[] = "/tmp/weft-cluster-info.XXXXXX";
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    char *argv[] = {WEFT_BUILDDIR "/weft-info", NULL};
    cr_assert_eq(wait_exit(spawn(argv, out)), 0, "weft-info failed");
    char *text = slurp(out);
    unlink(out);
    char *line = strstr(text, "\nalgorithms:");
    cr_assert(line, "weft-info printed no 'algorithms:' line:\n%s", text);
    int n = 0;
    char *save, *tok = strtok_r(line + strlen("\nalgorithms:"), " \n", &save);
    for (; tok && tok[0] != '(' && n < MAX_ALGOS; tok = strtok_r(NULL, " \n", &save))
        snprintf(names[n++], sizeof(names[0]), "%s", tok);
    free(text);
    cr_assert(n > 0, "weft-info lists no algorithms");
    return n;
}

/* Every collective with -c 1 over 8 B..maxbytes, once per algorithm
 * weft-info names (forced with -a) and once unforced. */
static void matrix(int k, int m, const char *const *opts, const char *maxbytes, int want_rows)
{
    char names[MAX_ALGOS][16];
    int nalgo = algorithms(names);
    for (size_t c = 0; c < sizeof(colls) / sizeof(colls[0]); c++) {
        char exe[256];
        snprintf(exe, sizeof(exe), "%s/%s_perf", WEFT_BUILDDIR, colls[c]);
        for (int a = -1; a < nalgo; a++) {
            const char *cmd[] = {exe, "-b", "8", "-e", maxbytes, "-f", "2", "-n", "2", "-w", "1",
                                 "-c", "1", a < 0 ? NULL : "-a", a < 0 ? NULL : names[a], NULL};
            char what[128];
            snprintf(what, sizeof(what), "%dx%d %s_perf -a %s", k, m, colls[c],
                     a < 0 ? "(unforced)" : names[a]);
            struct run r;
            struct row rows[MAX_ROWS];
            int passed;
            cluster_run(&r, k, m, opts, cmd);
            expect_checked(&r, what, want_rows, rows, &passed);
            finish(&r, passed);
        }
    }
}

Test(cluster, two_nodes_two_ranks_every_algorithm, .timeout = 240)
{
    need_cluster();
    matrix(2, 2, NULL, "4M", FULL_ROWS);
}

/* The same over verbs on the software verbs device (tests/verbs.sh
 * preloads it): shm inside each node, verbs between them, no tcp. */
Test(cluster, two_nodes_two_ranks_verbs_every_algorithm, .timeout = 300)
{
    if (!getenv("WEFT_TEST_SOFTVERBS"))
        cr_skip_test("needs the software verbs device preloaded (tests/verbs.sh)");
    need_cluster();
    setenv("WEFT_TRANSPORT", "shm,verbs", 1);
    matrix(2, 2, NULL, "1M", FULL_ROWS - 2);
}

Test(cluster, four_nodes_1gbit_every_algorithm_and_bandwidth, .timeout = 240)
{
    need_cluster();
    const char *opts[] = {"--rate", "1gbit", NULL};
    matrix(4, 1, opts, "1M", FULL_ROWS - 2);

    /* Point to point through the shaped links: each rank sends 16 MiB to
     * the next; both cable ends allow 1 Gbit/s, so the ring cannot beat
     * it (10% for htb's 1 ms burst and rounding) and must come near it. */
    const char *cmd[] = {WEFT_BUILDDIR "/sendrecv_perf", "-b", "1M", "-e", "16M", "-f", "16",
                         "-n", "3", "-w", "1", "-c", "1", NULL};
    struct run r;
    struct row rows[MAX_ROWS];
    int passed;
    cluster_run(&r, 4, 1, opts, cmd);
    const char *logdir = r.logdir;
    int n = expect_checked(&r, "4x1 1gbit sendrecv_perf", 2, rows, &passed);
    for (int p = 0; p < 2 && n == 2; p++) {
        double bw = rows[1].busbw[p];
        cr_expect(bw < GBIT_GBS * 1.1, "sendrecv of 16 MiB at %.3f GB/s beats the 1 Gbit/s "
                  "shaping (%.3f GB/s): tc is not limiting (%s)", bw, GBIT_GBS, logdir);
        cr_expect(bw > GBIT_GBS * 0.2, "sendrecv of 16 MiB at %.3f GB/s: far below 1 Gbit/s "
                  "(%s)", bw, logdir);
        passed &= bw < GBIT_GBS * 1.1 && bw > GBIT_GBS * 0.2;
        cr_log_info("4x1 1gbit sendrecv 16 MiB: %.3f GB/s (%s)\n", bw,
                    p ? "in-place" : "out-of-place");
    }
    finish(&r, passed);
}

/* -A: every plan on a communicator of its own in one job, each row
 * checked, one row per size and plan, named, in -A's order. */
Test(cluster, two_nodes_two_ranks_plans_side_by_side, .timeout = 240)
{
    need_cluster();
    static const char *const plans[] = {"auto", "ring", "rhd/doubling", "hier", "direct"};
    const char *cmd[] = {WEFT_BUILDDIR "/all_gather_perf", "-b", "8", "-e", "32K", "-f", "8",
                         "-n", "2", "-w", "1", "-N", "3", "-c", "1", "-A",
                         "auto,ring,rhd/doubling,hier,direct", NULL};
    struct run r;
    struct row rows[MAX_ROWS];
    int passed;
    cluster_run(&r, 2, 2, NULL, cmd);
    const char *logdir = r.logdir;
    int n = expect_checked(&r, "2x2 all_gather_perf -A", 5 * 5, rows, &passed);
    char *text = slurp(r.out), *save = NULL;
    int k = 0;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        double bytes;
        const char *last = strrchr(l, ' ');
        if (l[0] == '#' || sscanf(l, "%lf", &bytes) != 1 || last == NULL)
            continue;
        const char *want = plans[k++ % 5];
        cr_expect_str_eq(last + 1, want, "%.0f bytes names %s, expected %s (%s)", bytes, last + 1,
                         want, logdir);
        passed &= strcmp(last + 1, want) == 0;
    }
    cr_expect_eq(k, n, "%d named rows of %d (%s)", k, n, logdir);
    passed &= k == n;
    free(text);
    finish(&r, passed);
}

/* Each frame waits DELAY_US in the relay.  Any allreduce needs at least one
 * message hop; ring, tree and rhd on 4 ranks need at least two in a row
 * (rhd: log2(4) exchanges; tree: up and down; ring: 2(n-1) steps). */
Test(cluster, four_nodes_200us_relay_allreduce, .timeout = 240)
{
    need_cluster();
    char names[MAX_ALGOS][16];
    int nalgo = algorithms(names);
    const char *opts[] = {"--rate", "1gbit", "--delay-us", "200", NULL};
    for (int a = -1; a < nalgo; a++) {
        const char *cmd[] = {WEFT_BUILDDIR "/all_reduce_perf", "-b", "8", "-e", "1M", "-f", "4",
                             "-n", "5", "-w", "2", "-c", "1", a < 0 ? NULL : "-a",
                             a < 0 ? NULL : names[a], NULL};
        const char *name = a < 0 ? "(unforced)" : names[a];
        char what[96];
        snprintf(what, sizeof(what), "4x1 +200us all_reduce_perf -a %s", name);
        struct run r;
        struct row rows[MAX_ROWS];
        int passed;
        cluster_run(&r, 4, 1, opts, cmd);
        const char *logdir = r.logdir;
        if (expect_checked(&r, what, 9, rows, &passed) < 1) {
            finish(&r, 0);
            continue;
        }
        int hops = a >= 0 && (strcmp(name, "ring") == 0 || strcmp(name, "tree") == 0 ||
                              strcmp(name, "rhd") == 0) ? 2 : 1;
        for (int p = 0; p < 2; p++) {
            cr_expect(rows[0].time_us[p] >= 0.95 * hops * DELAY_US,
                      "%s: 8 bytes in %.1f us, less than %d x %d us: the relay does not delay "
                      "(%s)", what, rows[0].time_us[p], hops, DELAY_US, logdir);
            passed &= rows[0].time_us[p] >= 0.95 * hops * DELAY_US;
        }
        cr_log_info("%s: 8 bytes in %.1f / %.1f us\n", what, rows[0].time_us[0],
                    rows[0].time_us[1]);
        finish(&r, passed);
    }
}

/* A failing rank and a hanging one: cluster.sh names both, exits non-zero
 * and leaves nothing behind, relay included. */
Test(cluster, failed_and_hung_ranks_are_reported_and_cleaned_up, .timeout = 60)
{
    need_cluster();
    const char *opts[] = {"--delay-us", "50", "--timeout", "3", NULL};
    const char *cmd[] = {"/bin/sh", "-c",
                         "case $WEFT_RANK in 1) echo rank-one-fails >&2; exit 3;; "
                         "2) exec sleep 600;; esac", NULL};
    struct run r;
    time_t t0 = time(NULL);
    cluster_run(&r, 2, 2, opts, cmd);
    char *log = slurp(r.out);
    cr_expect_neq(r.status, 0, "cluster.sh passed a failed run:\n%s", log);
    cr_expect(strstr(log, "rank 1 (node 0) exited 3"), "rank 1's failure is not named:\n%s", log);
    cr_expect(strstr(log, "rank-one-fails"), "rank 1's stderr is not shown:\n%s", log);
    cr_expect(strstr(log, "rank 2 (node 1) timed out"), "rank 2's hang is not named:\n%s", log);
    cr_expect(strstr(log, "2 ok, 2 failed"), "the summary is wrong:\n%s", log);
    cr_expect(time(NULL) - t0 < 30, "the 3 s timeout took %ld s", (long)(time(NULL) - t0));
    free(log);
    finish(&r, 1);
}

/* cluster.sh killed in the middle of a run (a CI job cancelled) still
 * removes everything. */
Test(cluster, interrupted_run_cleans_up, .timeout = 60)
{
    need_cluster();
    char logdir[] = "/tmp/weft-test-cluster.XXXXXX", out[96], rank0[96];
    cr_assert(mkdtemp(logdir) != NULL);
    snprintf(out, sizeof(out), "%s/cluster.log", logdir);
    snprintf(rank0, sizeof(rank0), "%s/rank0.out", logdir);
    char *argv[] = {"/bin/bash", WEFT_CLUSTER_SH, "run", "2", "1", "--delay-us", "50",
                    "--logdir", logdir, "--relay", WEFT_RELAY, "--", "/bin/sleep", "600", NULL};
    struct run r = {.pid = spawn(argv, out)};
    snprintf(r.logdir, sizeof(r.logdir), "%s", logdir);
    for (int i = 0; i < 200 && access(rank0, F_OK) != 0; i++)
        usleep(50 * 1000);
    cr_assert(access(rank0, F_OK) == 0, "the ranks never started:\n%s", slurp(out));
    usleep(200 * 1000);
    kill(r.pid, SIGTERM);
    r.status = wait_exit(r.pid);
    cr_expect_neq(r.status, 0);
    expect_no_leftovers(&r);
    finish(&r, 1);
}
