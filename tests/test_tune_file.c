/*
 * test_tune_file.c - the tuning file: section keys, the parser (a good
 * file, every malformed case, other shapes' sections skipped), the fill of
 * the per-class table, the atomic writer; in jobs, rank 0's file reaching
 * every rank whatever the others see, its plans run and logged, WEFT_ALGO
 * overriding them, a malformed file warned about; and weft-tune's file
 * loaded by a second job.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "comm.h"
#include "harness.h"
#include "select/tune_file.h"

/* These calls are small: without this the shared-memory one-exchange path
 * (src/ll.c) would run them and no plan would be chosen or measured. */
__attribute__((constructor)) static void plans_not_ll(void)
{
    setenv("WEFT_SHM_LL_BYTES", "0", 1);
}

#define TIMEOUT_S 120
#define KEY2 "nranks=2 nodes=1 ppn=2 transports=shm"
#define KEY3 "nranks=3 nodes=1 ppn=3 transports=shm"

static int parse(const char *text, const char *key, struct weft_tune_point *pts, int *n,
                 char *err, size_t errlen)
{
    return weft_tune_file_parse(text, strlen(text), "f", key, pts, n, err, errlen);
}

static struct weft_tune_point pts[WEFT_TUNE_MAX_POINTS];

/* A fresh folder under /tmp; the test removes what it made. */
static void tmpdir(char *out, size_t len)
{
    snprintf(out, len, "/tmp/weft-tune-test-XXXXXX");
    cr_assert_not_null(mkdtemp(out), "mkdtemp: %s", strerror(errno));
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    fputs(text, f);
    fclose(f);
}

/* The file's text, malloc'd. */
static char *slurp(const char *path)
{
    char *text, err[256];
    size_t len;
    cr_assert_eq(weft_tune_file_read(path, &text, &len, err, sizeof(err)), WEFT_OK, "%s", err);
    return text;
}

static void rm_rf(const char *dir)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "chmod -R u+rwx %s; rm -rf %s", dir, dir);
    cr_assert_eq(system(cmd), 0);
}

/* ---- keys ------------------------------------------------------------------ */

Test(key, from_the_link_table)
{
    struct weft_link_table t;
    char why[256];
    const char *block[] = {"a", "a", "b", "b"}, *rr[] = {"a", "b", "a", "b"};
    unsigned allowed; /* not verbs, which a build may lack */
    cr_assert_eq(weft_topo_parse_transports("shm,tcp", &allowed, why, sizeof(why)), WEFT_OK);
    cr_assert_eq(weft_topo_table_init(&t, 4, block, allowed, why, sizeof(why)),
                 WEFT_OK, "%s", why);
    char *k = weft_tune_shape_key(&t);
    cr_assert_str_eq(k, "nranks=4 nodes=2 ppn=2 transports=shm,tcp");
    free(k);
    weft_topo_table_fini(&t);
    cr_assert_eq(weft_topo_table_init(&t, 4, rr, allowed, why, sizeof(why)),
                 WEFT_OK, "%s", why);
    k = weft_tune_shape_key(&t);
    cr_assert_str_eq(k, "nranks=4 nodes=2 layout=0,1,0,1 transports=shm,tcp");
    free(k);
    weft_topo_table_fini(&t);
    cr_assert_eq(weft_topo_table_init(&t, 3, NULL, allowed, why, sizeof(why)),
                 WEFT_OK, "%s", why);
    k = weft_tune_shape_key(&t);
    cr_assert_str_eq(k, KEY3);
    free(k);
    weft_topo_table_fini(&t);
}

/* Headers are compared canonically: field order, transport order, and a
 * layout that is blocks of equal size are all the same key. */
Test(key, headers_match_in_any_spelling)
{
    static const char *const same[] = {
        "[nranks=4 nodes=2 ppn=2 transports=shm,tcp]",
        "[transports=tcp,shm  ppn=2 nodes=2 nranks=4]",
        "[nranks=4 nodes=2 layout=7,7,3,3 transports=tcp,shm,tcp]",
    };
    char err[256], text[256];
    int n;
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(same); i++) {
        snprintf(text, sizeof(text), "%s\nallreduce float32 8 ring\n", same[i]);
        cr_assert_eq(parse(text, "nranks=4 nodes=2 ppn=2 transports=shm,tcp", pts, &n, err,
                           sizeof(err)), WEFT_OK, "%s: %s", same[i], err);
        cr_assert_eq(n, 1, "%s did not match", same[i]);
    }
    cr_assert_eq(parse("[nranks=4 nodes=2 layout=0,1,0,1 transports=shm,tcp]\nallreduce 4 8 ring\n",
                       "nranks=4 nodes=2 ppn=2 transports=shm,tcp", pts, &n, err, sizeof(err)),
                 WEFT_OK, "%s", err);
    cr_assert_eq(n, 0, "a round-robin layout matched blocks");
}

/* ---- parsing --------------------------------------------------------------- */

Test(parse, a_good_file)
{
    const char *text = "# written by hand\n"
                       "\n"
                       "[nranks=8 nodes=2 ppn=4 transports=shm,tcp]\n"
                       "allreduce float32 8 tree/double\n"
                       "[ nranks=2 nodes=1 ppn=2 transports=shm ]   # ours\n"
                       "  allreduce   float32  8   rhd/doubling   # us: ...\n"
                       "ALLREDUCE 4 64K ring\r\n"
                       "allreduce float64 1M direct\n"
                       "allgather * 32 rhd/rabenseifner\n"
                       "broadcast uint8 1G tree/binomial\n"
                       "reducescatter bfloat16 16 hier/ring\n"
                       "reduce int64 100 ring\n"
                       "[nranks=3 nodes=1 ppn=3 transports=shm]\n"
                       "reduce float32 8 direct\n";
    char err[256];
    int n;
    cr_assert_eq(parse(text, KEY2, pts, &n, err, sizeof(err)), WEFT_OK, "%s", err);
    cr_assert_eq(n, 7);
    struct weft_tune_point want[] = {
        {WEFT_COLL_ALLREDUCE, 2, (uint8_t)weft_tune_class(8), WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING},
        {WEFT_COLL_ALLREDUCE, 2, (uint8_t)weft_tune_class(65536), WEFT_ALGO_RING, 0},
        {WEFT_COLL_ALLREDUCE, 3, (uint8_t)weft_tune_class(1 << 20), WEFT_ALGO_DIRECT, 0},
        {WEFT_COLL_ALLGATHER, WEFT_TUNE_ANY_ESIZE, (uint8_t)weft_tune_class(32), WEFT_ALGO_RHD, 0},
        {WEFT_COLL_BROADCAST, 0, (uint8_t)weft_tune_class(1u << 30), WEFT_ALGO_TREE, 1},
        {WEFT_COLL_REDUCE_SCATTER, 1, (uint8_t)weft_tune_class(16), WEFT_ALGO_HIER, 0},
        {WEFT_COLL_REDUCE, 3, (uint8_t)weft_tune_class(100), WEFT_ALGO_RING, 0},
    };
    for (int i = 0; i < n; i++)
        cr_expect(memcmp(&pts[i], &want[i], sizeof(want[i])) == 0,
                  "point %d: coll %d esize %d class %d plan %d/%d", i, pts[i].coll,
                  pts[i].esize_idx, pts[i].cls, pts[i].algo, pts[i].variant);
    /* No section for the shape: nothing, and no error. */
    cr_assert_eq(parse(text, "nranks=5 nodes=1 ppn=5 transports=shm", pts, &n, err, sizeof(err)),
                 WEFT_OK, "%s", err);
    cr_assert_eq(n, 0);
}

/* Lines of other shapes' sections are not read: a plan this build does
 * not have, there, is no error here. */
Test(parse, other_shapes_sections_are_skipped)
{
    const char *text = "[nranks=64 nodes=8 ppn=8 transports=shm,verbs]\n"
                       "allreduce float32 8 nvls\n"
                       "whatever a newer weft writes\n"
                       "[nranks=2 nodes=1 ppn=2 transports=shm]\n"
                       "allreduce float32 8 ring\n";
    char err[256];
    int n;
    cr_assert_eq(parse(text, KEY2, pts, &n, err, sizeof(err)), WEFT_OK, "%s", err);
    cr_assert_eq(n, 1);
}

Test(parse, every_malformed_line_is_named)
{
    static const struct {
        const char *text;
        int line;
        const char *says;
    } cases[] = {
        {"allreduce float32 8 ring\n", 1, "before the first section"},
        {"[" KEY2 "]\nallreduce float32 8 frob\n", 2, "unknown plan 'frob'"},
        {"[" KEY2 "]\nallreduce float32 8 rhd/frob\n", 2, "unknown plan"},
        {"[" KEY2 "]\n\n# c\nallgatherv float32 8 ring\n", 4, "unknown collective"},
        {"[" KEY2 "]\nallreduce float128 8 ring\n", 2, "unknown element type"},
        {"[" KEY2 "]\nallreduce 3 8 ring\n", 2, "unknown element type"},
        {"[" KEY2 "]\nallreduce float32 8X ring\n", 2, "not a size"},
        {"[" KEY2 "]\nallreduce float32 0 ring\n", 2, "not a size"},
        {"[" KEY2 "]\nallreduce float32 99999999999999999 ring\n", 2, "not a size"},
        {"[" KEY2 "]\nallreduce float32 8 tree\n", 2, "family"},
        {"[" KEY2 "]\nallgather * 8 tree/binomial\n", 2, "does not run allgather"},
        {"[" KEY2 "]\nallreduce float32 8\n", 2, "wants 'collective type bytes plan'"},
        {"[" KEY2 "]\nallreduce float32 8 ring ring\n", 2, "wants 'collective type bytes plan'"},
        {"[" KEY2 "]\nallreduce float32 8 ring\nallreduce 4 9 direct\n", 3, "as line 2"},
        {"[nranks=2 nodes=1\n", 1, "ends in ']'"},
        {"[nranks=2 nodes=1 ppn=2 transports=shm color=red]\n", 1, "'color=red'"},
        {"[nranks=2 nodes=1 ppn=2]\n", 1, "wants nranks="},
        {"[nranks=2 nodes=1 ppn=2 layout=0,0 transports=shm]\n", 1, "wants nranks="},
        {"[nranks=2 nranks=2 nodes=1 ppn=2 transports=shm]\n", 1, "given twice"},
        {"[nranks=0 nodes=1 ppn=2 transports=shm]\n", 1, "not a count"},
        {"[nranks=4 nodes=1 ppn=2 transports=shm]\n", 1, "is not nranks=4"},
        {"[nranks=3 nodes=2 layout=0,1 transports=shm]\n", 1, "each of the 3 ranks"},
        {"[nranks=3 nodes=3 layout=0,1,1 transports=shm]\n", 1, "on 2 nodes"},
        {"[nranks=2 nodes=1 ppn=2 transports=shm;tcp]\n", 1, "transport names"},
        {"[" KEY2 "]\n[transports=shm nranks=2 ppn=2 nodes=1]\n", 2, "second section"},
        {"[nranks=9 nodes=1 ppn=9 transports=shm]\nok\n[nranks=9 nodes=2 ppn=9 transports=x]\n", 3,
         "is not nranks=9"},
    };
    char err[256], want[64];
    int n;
    for (size_t i = 0; i < WEFT_ARRAY_SIZE(cases); i++) {
        err[0] = '\0';
        cr_expect_eq(parse(cases[i].text, KEY2, pts, &n, err, sizeof(err)), WEFT_ERR_INVALID_ARG,
                     "case %zu accepted", i);
        snprintf(want, sizeof(want), "f:%d: ", cases[i].line);
        cr_expect(strncmp(err, want, strlen(want)) == 0 && strstr(err, cases[i].says),
                  "case %zu: '%s' (want '%s...%s')", i, err, want, cases[i].says);
        cr_expect_eq(n, 0);
    }
    /* A NUL byte. */
    const char bin[] = "[" KEY2 "]\nallreduce\0 float32 8 ring\n";
    cr_assert_eq(weft_tune_file_parse(bin, sizeof(bin) - 1, "f", KEY2, pts, &n, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "f:2: ") && strstr(err, "NUL"), "%s", err);
}

/* ---- the table ------------------------------------------------------------- */

static int plan_at(const struct weft_tune_table *t, int coll, size_t esize, size_t bytes)
{
    return t->plan[coll][weft_tune_esize_index(esize)][weft_tune_class(bytes)];
}

#define P(a, v) ((a) * WEFT_VAR_COUNT + (v))

Test(fill, nearest_measured_class_within_a_power_of_two)
{
    const char *text = "[" KEY2 "]\n"
                       "allreduce float32 1K ring\n"
                       "allreduce float32 4K direct\n"
                       "allgather * 64 rhd/rabenseifner\n"
                       "allgather int8 64 ring\n";
    char err[256];
    int n;
    struct weft_tune_table t;
    cr_assert_eq(parse(text, KEY2, pts, &n, err, sizeof(err)), WEFT_OK, "%s", err);
    weft_tune_table_fill(&t, pts, n);
    int ring = P(WEFT_ALGO_RING, 0), direct = P(WEFT_ALGO_DIRECT, 0), rhd = P(WEFT_ALGO_RHD, 0);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 1024), ring);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 1536), ring);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 2047), ring);   /* log-nearer 1K */
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 2048), direct); /* a tie: the larger */
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 4096), direct);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 512), ring);    /* a power of two beyond */
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 8191), direct);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 511), -1);      /* further: the model */
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 4, 8192), -1);
    /* Other element sizes of the collective borrow the nearest. */
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 8, 4096), direct);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLREDUCE, 1, 1024), ring);
    /* "*" stands for every element size, an element size's own line wins. */
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLGATHER, 1, 64), ring);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLGATHER, 4, 64), rhd);
    cr_expect_eq(plan_at(&t, WEFT_COLL_ALLGATHER, 8, 64), rhd);
    /* Nothing for collectives the file does not name. */
    cr_expect_eq(plan_at(&t, WEFT_COLL_BROADCAST, 4, 64), -1);
    cr_expect_eq(plan_at(&t, WEFT_COLL_REDUCE, 4, 1024), -1);
}

/* ---- writing --------------------------------------------------------------- */

Test(write, replaces_only_its_section)
{
    char dir[64], path[128], err[256];
    tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/tune", dir);
    cr_assert_eq(weft_tune_file_write(path, KEY2, "allreduce float32 8 ring\n", err, sizeof(err)),
                 WEFT_OK, "%s", err);
    char *t = slurp(path);
    cr_assert_str_eq(t, "[" KEY2 "]\nallreduce float32 8 ring\n");
    free(t);
    /* A hand-written prologue and another shape stay; ours is replaced in
     * place, once, whatever its header's spelling. */
    put(path, "# mine\n[transports=shm ppn=2 nodes=1 nranks=2]\nallreduce float32 8 ring\n"
              "reduce float32 8 ring\n[" KEY3 "]\nreduce float32 8 direct");
    cr_assert_eq(weft_tune_file_write(path, KEY2, "allreduce float32 8 direct\n", err, sizeof(err)),
                 WEFT_OK, "%s", err);
    t = slurp(path);
    cr_assert_str_eq(t, "# mine\n[" KEY2 "]\nallreduce float32 8 direct\n[" KEY3
                        "]\nreduce float32 8 direct\n");
    free(t);
    cr_assert_eq(weft_tune_file_write(path, "nranks=4 nodes=1 ppn=4 transports=shm",
                                      "broadcast * 8 ring\n", err, sizeof(err)), WEFT_OK, "%s", err);
    t = slurp(path);
    int n;
    cr_assert_eq(parse(t, KEY3, pts, &n, err, sizeof(err)), WEFT_OK, "%s", err);
    cr_assert_eq(n, 1);
    cr_assert_eq(parse(t, "nranks=4 nodes=1 ppn=4 transports=shm", pts, &n, err, sizeof(err)),
                 WEFT_OK, "%s", err);
    cr_assert_eq(n, 1);
    cr_assert_eq(pts[0].coll, WEFT_COLL_BROADCAST);
    free(t);
    DIR *d = opendir(dir);
    int files = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        files += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, 1, "a temporary file was left behind");
    rm_rf(dir);
}

/* The write as an unprivileged user (root writes anywhere): 0 when it
 * failed cleanly, err in the pipe. */
static int write_unprivileged(const char *path, char *err, size_t errlen)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0))
            _exit(3);
        char e[256] = "";
        weft_status_t st = weft_tune_file_write(path, KEY2, "allreduce float32 8 direct\n", e,
                                                sizeof(e));
        if (write(fds[1], e, strlen(e)) < 0)
            _exit(4);
        _exit(st == WEFT_ERR_SYSTEM ? 0 : 1);
    }
    close(fds[1]);
    ssize_t k = read(fds[0], err, errlen - 1);
    err[k > 0 ? k : 0] = '\0';
    close(fds[0]);
    int ws;
    waitpid(pid, &ws, 0);
    return WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
}

Test(write, an_unwritable_folder_fails_and_leaves_the_file)
{
    char dir[64], path[128], err[256];
    tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/tune", dir);
    const char *old = "[" KEY2 "]\nallreduce float32 8 ring\n";
    put(path, old);
    chmod(path, 0644);
    chmod(dir, 0555);
    cr_assert_eq(write_unprivileged(path, err, sizeof(err)), 0, "the write did not fail: %s", err);
    cr_assert(strstr(err, path) && strstr(err, "Permission denied"), "%s", err);
    char *t = slurp(path);
    cr_assert_str_eq(t, old);
    free(t);
    DIR *d = opendir(dir);
    int files = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        files += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, 1, "a temporary file was left behind");
    /* A folder that is not there. */
    snprintf(path, sizeof(path), "%s/none/tune", dir);
    cr_assert_eq(weft_tune_file_write(path, KEY2, "x\n", err, sizeof(err)), WEFT_ERR_SYSTEM);
    cr_assert(strstr(err, "No such file"), "%s", err);
    rm_rf(dir);
}

/* ---- in jobs --------------------------------------------------------------- */

/* What the ranks of a job check. */
struct expect {
    char path[128];        /* rank 0's file: the table's; "" when none loads */
    int plan32, plan64;    /* allreduce of 32 and 64 B: the file's plans, -1 the model's */
    const char *file_of[WEFT_TEST_MAX_RANKS]; /* each rank's WEFT_TUNE_FILE */
    const char *key;
    bool mask; /* the file says direct at 32 B: try WEFT_ALGO against it */
};

/* Every rank's table is rank 0's: the same bytes everywhere. */
static int same_table(weft_comm_t comm, int rank, int p, const struct expect *x)
{
    const struct weft_tune_table *t = &comm->tune.file;
    if (strcmp(t->path, x->path) != 0)
        return weft_test_fail(rank, "table from '%s', want '%s'", t->path, x->path);
    uint64_t h = 1469598103934665603ull, all[WEFT_TEST_MAX_RANKS];
    const uint8_t *b = (const uint8_t *)t;
    for (size_t i = 0; i < sizeof(*t); i++)
        h = (h ^ b[i]) * 1099511628211ull;
    WT_CHECK_OK(rank, comm, "allgather", weft_allgather(&h, all, 1, WEFT_UINT64, comm));
    for (int q = 0; q < p; q++)
        if (all[q] != h)
            return weft_test_fail(rank, "rank %d holds another tuning table", q);
    return 0;
}

/* An allreduce of count floats, checked; then the plan its class settled on. */
static int settled(weft_comm_t comm, int rank, int p, size_t count, int *plan)
{
    float s[16] = {0}, r[16];
    for (size_t i = 0; i < count; i++)
        s[i] = (float)(rank + (int)i);
    WT_CHECK_OK(rank, comm, "allreduce", weft_allreduce(s, r, count, WEFT_FLOAT32, WEFT_SUM, comm));
    for (size_t i = 0; i < count; i++)
        if (r[i] != (float)(p * (p - 1) / 2 + p * (int)i))
            return weft_test_fail(rank, "allreduce [%zu] = %g", i, (double)r[i]);
    int32_t got = atomic_load(&comm->tune.plan[WEFT_COLL_ALLREDUCE][weft_tune_esize_index(4)]
                                               [weft_tune_class(count * 4)]);
    if (!(got & 0x10000))
        return weft_test_fail(rank, "allreduce of %zu floats: no plan settled", count);
    *plan = (got & 0xff) * WEFT_VAR_COUNT + ((got >> 8) & 0xff);
    return 0;
}

static int file_job(int rank, int p, const weft_unique_id_t *id, void *arg)
{
    const struct expect *x = arg;
    weft_comm_t comm, child;
    if (x->file_of[rank])
        setenv("WEFT_TUNE_FILE", x->file_of[rank], 1);
    else
        unsetenv("WEFT_TUNE_FILE");
    weft_param_reload();
    if (weft_test_child_init(&comm, p, id, rank))
        return 1;
    char *key = weft_tune_shape_key(&comm->topo);
    if (strcmp(key, x->key) != 0)
        return weft_test_fail(rank, "this job's shape is [%s], the test wrote [%s]", key, x->key);
    free(key);
    int plan;
    if (same_table(comm, rank, p, x) || settled(comm, rank, p, 8, &plan))
        return 1;
    if (x->plan32 >= 0 && plan != x->plan32)
        return weft_test_fail(rank, "32 B allreduce ran plan %d, the file says %d", plan, x->plan32);
    if (settled(comm, rank, p, 16, &plan))
        return 1;
    if (x->plan64 >= 0 && plan != x->plan64)
        return weft_test_fail(rank, "64 B allreduce ran plan %d, the file says %d", plan, x->plan64);
    /* A child of split loads rank 0's file too. */
    WT_CHECK_OK(rank, comm, "split", weft_comm_split(comm, 0, rank, &child));
    if (same_table(child, rank, p, x) || settled(child, rank, p, 8, &plan))
        return 1;
    if (x->plan32 >= 0 && plan != x->plan32)
        return weft_test_fail(rank, "split: 32 B allreduce ran plan %d, the file says %d", plan,
                              x->plan32);
    /* WEFT_ALGO's word is the last: a plan it forbids is not run, and
     * with one plan allowed the log says WEFT_ALGO. */
    if (x->mask) {
        WT_CHECK_OK(rank, child, "set_algo", weft_comm_set_algo(child, "^direct"));
        if (settled(child, rank, p, 8, &plan))
            return 1;
        if (plan == x->plan32)
            return weft_test_fail(rank, "WEFT_ALGO=^direct ran direct from the file");
        WT_CHECK_OK(rank, child, "set_algo", weft_comm_set_algo(child, "allreduce:ring"));
        if (settled(child, rank, p, 16, &plan))
            return 1;
    }
    WT_CHECK_OK(rank, child, "destroy child", weft_comm_destroy(child));
    WT_CHECK_OK(rank, comm, "destroy", weft_comm_destroy(comm));
    return 0;
}

/* Runs x's job with the log at INFO in dir/log.<pid>; the logs' text,
 * concatenated (malloc'd). */
static char *run_logged(int p, struct expect *x, const char *dir)
{
    char pat[160];
    snprintf(pat, sizeof(pat), "%s/log.%%p", dir);
    setenv("WEFT_DEBUG", "INFO", 1);
    setenv("WEFT_DEBUG_SUBSYS", "INIT,COLL", 1);
    setenv("WEFT_DEBUG_FILE", pat, 1);
    setenv("WEFT_TIMEOUT_MS", "30000", 1);
    struct weft_test_job job;
    cr_assert_eq(weft_test_job_start_proc(&job, p, file_job, x), 0);
    cr_assert_eq(weft_test_job_wait(&job, TIMEOUT_S), 0, "see the rank messages above");
    size_t len = 0;
    char *all = calloc(1, 1);
    DIR *d = opendir(dir);
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "log.", 4) != 0)
            continue;
        char f[512];
        snprintf(f, sizeof(f), "%s/%s", dir, e->d_name);
        char *t = slurp(f);
        all = realloc(all, len + strlen(t) + 1);
        memcpy(all + len, t, strlen(t) + 1);
        len += strlen(t);
        free(t);
    }
    closedir(d);
    return all;
}

/* How many of the ranks 0..p-1 logged a line holding both a and b. */
static int ranks_saying(const char *log, int p, const char *a, const char *b)
{
    bool said[WEFT_TEST_MAX_RANKS] = {false};
    int n = 0;
    for (const char *l = log; *l;) {
        const char *nl = strchr(l, '\n');
        size_t len = nl ? (size_t)(nl - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof(line), "%.*s", (int)WEFT_MIN(len, sizeof(line) - 1), l);
        /* host:pid:rank ... */
        const char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        int r = c2 ? atoi(c2 + 1) : -1;
        if (r >= 0 && r < p && strstr(line, a) && strstr(line, b) && !said[r])
            said[r] = true, n++;
        l += len + (nl != NULL);
    }
    return n;
}

/* Rank 0, 1 and 2 each see another file (rank 2 none): rank 0's reaches
 * every rank, its plans run on every rank and its children, and every
 * rank logs why. */
Test(job, rank_0s_file_reaches_every_rank_and_runs, .timeout = TIMEOUT_S)
{
    char dir[64], a[128], b[128], c[128];
    tmpdir(dir, sizeof(dir));
    snprintf(a, sizeof(a), "%s/a", dir);
    snprintf(b, sizeof(b), "%s/b", dir);
    snprintf(c, sizeof(c), "%s/missing", dir);
    put(a, "[nranks=2 nodes=1 ppn=2 transports=shm]\nallreduce float32 32 ring\n"
           "[" KEY3 "]\nallreduce float32 32 direct\nallreduce float32 64 rhd/doubling\n");
    put(b, "[" KEY3 "]\nallreduce float32 32 ring\nallreduce float32 64 ring\n");
    struct expect x = {.plan32 = P(WEFT_ALGO_DIRECT, 0),
                       .plan64 = P(WEFT_ALGO_RHD, WEFT_VAR_RHD_DOUBLING),
                       .file_of = {a, b, c}, .key = KEY3, .mask = true};
    snprintf(x.path, sizeof(x.path), "%s", a);
    char *log = run_logged(3, &x, dir);
    char why[160];
    snprintf(why, sizeof(why), "(tune file %s)", a);
    cr_expect_eq(ranks_saying(log, 3, "allreduce of ~32 bytes on 3 ranks: direct", why), 3,
                 "the 32 B class's reason on every rank:\n%s", log);
    cr_expect_eq(ranks_saying(log, 3, "allreduce of ~64 bytes on 3 ranks: rhd/doubling", why), 3,
                 "%s", log);
    cr_expect_eq(ranks_saying(log, 3, "allreduce of ~32 bytes on 3 ranks", "(model, predicted "),
                 3, "after ^direct, the model's reason:\n%s", log);
    cr_expect_eq(ranks_saying(log, 3, "allreduce of ~64 bytes on 3 ranks: ring", "(WEFT_ALGO)"),
                 3, "with one plan allowed, WEFT_ALGO:\n%s", log);
    cr_expect_eq(ranks_saying(log, 3, "WARN", ""), 0, "%s", log);
    free(log);
    rm_rf(dir);
}

/* A malformed file on rank 0: one WARN naming file:line, no table on any
 * rank, the model's plans. */
Test(job, a_malformed_file_is_one_warning_and_the_model, .timeout = TIMEOUT_S)
{
    char dir[64], a[128], b[128];
    tmpdir(dir, sizeof(dir));
    snprintf(a, sizeof(a), "%s/a", dir);
    snprintf(b, sizeof(b), "%s/b", dir);
    put(a, "[" KEY3 "]\nallreduce float32 32 direct\nallreduce float32 64 hyperring\n");
    put(b, "[" KEY3 "]\nallreduce float32 32 direct\n");
    struct expect x = {.path = "", .plan32 = -1, .plan64 = -1, .file_of = {a, b, b}, .key = KEY3};
    char *log = run_logged(3, &x, dir);
    char want[160];
    snprintf(want, sizeof(want), "%s:3: unknown plan 'hyperring'", a);
    cr_expect_eq(ranks_saying(log, 3, "WARN", want), 1, "%s", log);
    int times = 0;
    for (const char *at = log; (at = strstr(at, want)) != NULL; at++)
        times++;
    cr_expect_eq(times, 1, "warned %d times:\n%s", times, log);
    cr_expect_eq(ranks_saying(log, 3, "allreduce of ~32 bytes on 3 ranks", "(model, predicted "),
                 3, "%s", log);
    free(log);
    rm_rf(dir);
}

/* weft-tune on 2 ranks writes a file; a second job of that shape loads it
 * and runs its plans. */
Test(job, weft_tune_writes_what_a_second_job_runs, .timeout = 2 * TIMEOUT_S)
{
    char dir[64], path[128], cmd[1024], err[256];
    tmpdir(dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/tune", dir);
    snprintf(cmd, sizeof(cmd), "cd %s && WEFT_SOCKET_IFNAME=lo timeout 100 ./weftrun -n 2 -q "
             "./weft-tune -b 8 -e 64 --colls allreduce,broadcast --budget 5 -o %s > %s/out 2>&1",
             WEFT_BUILDDIR, path, dir);
    int rc = system(cmd);
    snprintf(cmd, sizeof(cmd), "%s/out", dir);
    char *out = slurp(cmd);
    cr_assert_eq(rc, 0, "weft-tune failed:\n%s", out);
    cr_assert(strstr(out, path), "weft-tune did not say where it wrote:\n%s", out);
    free(out);
    char *text = slurp(path);
    int n;
    cr_assert_eq(weft_tune_file_parse(text, strlen(text), path, KEY2, pts, &n, err, sizeof(err)),
                 WEFT_OK, "%s", err);
    cr_assert_eq(n, 8, "want 4 sizes of 2 collectives:\n%s", text);
    free(text);
    struct expect x = {.plan32 = -1, .plan64 = -1, .file_of = {path, path}, .key = KEY2};
    snprintf(x.path, sizeof(x.path), "%s", path);
    for (int i = 0; i < n; i++)
        if (pts[i].coll == WEFT_COLL_ALLREDUCE && pts[i].cls == weft_tune_class(32))
            x.plan32 = pts[i].algo * WEFT_VAR_COUNT + pts[i].variant;
        else if (pts[i].coll == WEFT_COLL_ALLREDUCE && pts[i].cls == weft_tune_class(64))
            x.plan64 = pts[i].algo * WEFT_VAR_COUNT + pts[i].variant;
    cr_assert(x.plan32 >= 0 && x.plan64 >= 0, "no allreduce lines for 32 and 64 B");
    char *log = run_logged(2, &x, dir), why[160];
    snprintf(why, sizeof(why), "(tune file %s)", path);
    cr_expect_eq(ranks_saying(log, 2, "allreduce of ~32 bytes on 2 ranks", why), 2, "%s", log);
    free(log);
    rm_rf(dir);
}
