/*
 * test_split.c - communicators made from communicators: split by color and
 * key (with NOCOLOR, 5 and 7 ranks), shrink around excluded ranks, bad
 * arguments; and one thread driving several ranks' communicators in a
 * group (what ncclCommInitAll users do).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* child's rank and size must be want_rank and n; 0, or 1 after printing
 * them with what, the communicator's name in the message. */
static int expect_rank_size(weft_comm_t child, int rank, const char *what, int want_rank, int n)
{
    int crank = -1, csize = -1;
    weft_comm_rank(child, &crank);
    weft_comm_size(child, &csize);
    if (crank != want_rank || csize != n)
        return weft_test_fail(rank, "%s rank/size %d/%d, expected %d/%d", what, crank, csize,
                              want_rank, n);
    return 0;
}

/* Sum over the group of (parent rank + 1): every member must see it. */
static int check_group_sum(weft_comm_t child, int rank, const int *members, int n)
{
    int64_t want = 0;
    for (int i = 0; i < n; i++)
        want += members[i] + 1;
    int64_t v = rank + 1;
    weft_status_t st = weft_allreduce(&v, &v, 1, WEFT_INT64, WEFT_SUM, child);
    if (weft_test_expect_status(rank, child, "allreduce on the child", st, WEFT_OK))
        return 1;
    if (v != want)
        return weft_test_fail(rank, "child allreduce: expected %lld, got %lld", (long long)want,
                              (long long)v);
    return 0;
}

/* Colors rank % 3 with rank 1 opting out; keys reverse the order. */
static int split_body(weft_comm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    int color = rank == 1 ? WEFT_SPLIT_NOCOLOR : rank % 3;
    weft_comm_t child = (weft_comm_t)&child; /* must be overwritten */
    weft_status_t st = weft_comm_split(comm, color, -rank, &child);
    if (weft_test_expect_status(rank, comm, "weft_comm_split", st, WEFT_OK))
        return 1;
    if (color == WEFT_SPLIT_NOCOLOR) {
        if (child != NULL)
            return weft_test_fail(rank, "NOCOLOR rank got a communicator");
    } else {
        int members[WEFT_TEST_MAX_RANKS], n = 0, want_rank = 0;
        for (int r = 0; r < nranks; r++)
            if (r != 1 && r % 3 == color) {
                members[n++] = r;
                want_rank += r > rank; /* key -r: higher parent ranks come first */
            }
        if (expect_rank_size(child, rank, "child", want_rank, n) ||
            check_group_sum(child, rank, members, n))
            return 1;
    }
    /* The parent still works, and a second split is independent. */
    int64_t v = 1;
    st = weft_allreduce(&v, &v, 1, WEFT_INT64, WEFT_SUM, comm);
    if (weft_test_expect_status(rank, comm, "parent allreduce", st, WEFT_OK) || v != nranks)
        return weft_test_fail(rank, "parent allreduce gave %lld", (long long)v);
    weft_comm_t all;
    st = weft_comm_split(comm, 0, rank, &all);
    if (weft_test_expect_status(rank, comm, "second split", st, WEFT_OK))
        return 1;
    int every[WEFT_TEST_MAX_RANKS];
    for (int r = 0; r < nranks; r++)
        every[r] = r;
    int bad = check_group_sum(all, rank, every, nranks);
    weft_comm_destroy(all);
    weft_comm_destroy(child);
    return bad;
}

Test(split, colors_keys_and_nocolor_5_ranks, .timeout = 60)
{
    cr_assert_eq(weft_test_run(5, 50, split_body, NULL), 0);
}

Test(split, colors_keys_and_nocolor_7_ranks, .timeout = 60)
{
    cr_assert_eq(weft_test_run(7, 50, split_body, NULL), 0);
}

static int split_args_body(weft_comm_t comm, int rank, int nranks, void *arg)
{
    (void)nranks;
    (void)arg;
    weft_status_t st = weft_comm_split(comm, 0, 0, NULL);
    if (weft_test_expect_status(rank, comm, "split with NULL newcomm", st, WEFT_ERR_INVALID_ARG))
        return 1;
    weft_comm_t c = (weft_comm_t)&c;
    st = weft_comm_split(NULL, 0, 0, &c);
    if (weft_test_expect_status(rank, NULL, "split of NULL", st, WEFT_ERR_INVALID_ARG) ||
        c != NULL)
        return weft_test_fail(rank, "split of NULL left newcomm set");
    int me = rank;
    st = weft_comm_shrink(comm, &me, 1, &c);
    if (weft_test_expect_status(rank, comm, "shrink excluding self", st, WEFT_ERR_INVALID_ARG))
        return 1;
    int bad[2] = {nranks, 0};
    st = weft_comm_shrink(comm, bad, 1, &c);
    if (weft_test_expect_status(rank, comm, "shrink of an out-of-range rank", st,
                                WEFT_ERR_INVALID_ARG))
        return 1;
    int twice[2] = {(rank + 1) % nranks, (rank + 1) % nranks};
    st = weft_comm_shrink(comm, twice, 2, &c);
    if (weft_test_expect_status(rank, comm, "shrink with a repeated rank", st,
                                WEFT_ERR_INVALID_ARG))
        return 1;
    st = weft_comm_shrink(comm, NULL, 1, &c);
    return weft_test_expect_status(rank, comm, "shrink with a NULL list", st,
                                   WEFT_ERR_INVALID_ARG);
}

Test(split, bad_arguments, .timeout = 30)
{
    cr_assert_eq(weft_test_run(3, 25, split_args_body, NULL), 0);
}

/* Ranks 0 and 3 leave (they call nothing); the rest continue. */
static int shrink_body(weft_comm_t comm, int rank, int nranks, void *arg)
{
    (void)arg;
    static const int excluded[] = {0, 3};
    if (rank == 0 || rank == 3)
        return 0;
    weft_comm_t child;
    weft_status_t st = weft_comm_shrink(comm, excluded, 2, &child);
    if (weft_test_expect_status(rank, comm, "weft_comm_shrink", st, WEFT_OK))
        return 1;
    int members[WEFT_TEST_MAX_RANKS], n = 0, want_rank = -1;
    for (int r = 0; r < nranks; r++)
        if (r != 0 && r != 3) {
            if (r == rank)
                want_rank = n;
            members[n++] = r;
        }
    if (expect_rank_size(child, rank, "shrunk", want_rank, n))
        return 1;
    int bad = check_group_sum(child, rank, members, n);
    weft_comm_destroy(child);
    return bad;
}

Test(split, shrink_around_two_ranks, .timeout = 60)
{
    cr_assert_eq(weft_test_run(6, 50, shrink_body, NULL), 0);
}

/* ---- several ranks in one process, one thread driving the group --------- */

struct init_arg {
    weft_unique_id_t id;
    int rank, nranks;
    weft_comm_t comm;
    weft_status_t st;
};

static void *init_thread(void *p)
{
    struct init_arg *a = p;
    a->st = weft_comm_init(&a->comm, a->nranks, a->id, a->rank);
    return NULL;
}

Test(split, one_thread_drives_a_group_of_three_comms, .timeout = 60)
{
    enum { N = 3, COUNT = 100000 };
    weft_test_env();
    struct init_arg a[N];
    pthread_t th[N];
    weft_unique_id_t id;
    cr_assert_eq(weft_get_unique_id(&id), WEFT_OK);
    for (int r = 0; r < N; r++) {
        a[r] = (struct init_arg){.id = id, .rank = r, .nranks = N};
        cr_assert_eq(pthread_create(&th[r], NULL, init_thread, &a[r]), 0);
    }
    for (int r = 0; r < N; r++) {
        pthread_join(th[r], NULL);
        cr_assert_eq(a[r].st, WEFT_OK, "rank %d init: %s", r, weft_last_error(NULL));
    }
    float *buf[N];
    for (int r = 0; r < N; r++) {
        buf[r] = malloc(COUNT * sizeof(float));
        for (int i = 0; i < COUNT; i++)
            buf[r][i] = (float)(r + i % 7);
    }
    /* Without the group this would block on rank 0 forever. */
    cr_assert_eq(weft_group_start(), WEFT_OK);
    for (int r = 0; r < N; r++)
        cr_assert_eq(weft_allreduce(buf[r], buf[r], COUNT, WEFT_FLOAT32, WEFT_SUM, a[r].comm),
                     WEFT_OK);
    cr_assert_eq(weft_group_end(), WEFT_OK, "%s", weft_last_error(NULL));
    for (int r = 0; r < N; r++)
        for (int i = 0; i < COUNT; i++)
            cr_assert_eq(buf[r][i], (float)(3 + 3 * (i % 7)), "rank %d [%d] = %g", r, i,
                         buf[r][i]);
    /* A ring of sends in one group, across the three comms. */
    cr_assert_eq(weft_group_start(), WEFT_OK);
    int32_t out[N], in[N];
    for (int r = 0; r < N; r++) {
        out[r] = 100 + r;
        weft_send(&out[r], 1, WEFT_INT32, (r + 1) % N, a[r].comm);
        weft_recv(&in[r], 1, WEFT_INT32, (r + N - 1) % N, a[r].comm);
    }
    cr_assert_eq(weft_group_end(), WEFT_OK, "%s", weft_last_error(NULL));
    for (int r = 0; r < N; r++) {
        cr_assert_eq(in[r], 100 + (r + N - 1) % N);
        free(buf[r]);
        cr_assert_eq(weft_comm_destroy(a[r].comm), WEFT_OK);
    }
}
