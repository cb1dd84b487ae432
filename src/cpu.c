/*
 * cpu.c - where ranks run: which ranks share a machine's cores (the cost
 * model's core groups) and WEFT_BIND's pinning.
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "comm_impl.h"

static const struct weft_rank_info *sort_all; /* cmp_machine's table (under sort_mu) */
static pthread_mutex_t sort_mu = PTHREAD_MUTEX_INITIALIZER;

static int cmp_machine(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    int c = strcmp(sort_all[x].machine, sort_all[y].machine);
    return c ? c : (x > y) - (x < y);
}

weft_status_t weft_cpu_groups(struct weft_comm *comm, const struct weft_rank_info *all)
{
    int n = comm->nranks;
    int *order = malloc((size_t)n * sizeof(int));
    comm->cpu_group = malloc((size_t)n * sizeof(int));
    comm->group_cores = malloc((size_t)n * sizeof(int));
    if (!order || !comm->cpu_group || !comm->group_cores) {
        free(order);
        return weft_error(NULL, WEFT_ERR_NO_MEMORY, "cannot allocate core groups for %d ranks", n);
    }
    for (int r = 0; r < n; r++)
        order[r] = r;
    pthread_mutex_lock(&sort_mu);
    sort_all = all;
    qsort(order, (size_t)n, sizeof(int), cmp_machine);
    pthread_mutex_unlock(&sort_mu);
    int g = -1;
    for (int k = 0; k < n; k++) {
        int r = order[k];
        int cores = all[r].cores >= 1 && all[r].cores <= (1u << 20) ? (int)all[r].cores : 1;
        if (k == 0 || strcmp(all[r].machine, all[order[k - 1]].machine) != 0)
            comm->group_cores[++g] = cores;
        comm->cpu_group[r] = g;
        comm->group_cores[g] = WEFT_MIN(comm->group_cores[g], cores);
    }
    free(order);
    return WEFT_OK;
}

void weft_cpu_bind(int rank, int k, int local)
{
    cpu_set_t allowed, one;
    if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0)
        return;
    int n = CPU_COUNT(&allowed), want = k % n, cpu = -1;
    for (int c = 0, seen = 0; c < CPU_SETSIZE && cpu < 0; c++)
        if (CPU_ISSET(c, &allowed) && seen++ == want)
            cpu = c;
    if (local > n)
        WEFT_WARN(WEFT_SUB_INIT, "rank %d: WEFT_BIND: %d ranks on this machine share %d CPUs",
                  rank, local, n);
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0)
        WEFT_WARN(WEFT_SUB_INIT, "rank %d: WEFT_BIND: cannot pin to CPU %d: %s", rank, cpu,
                  strerror(errno));
    else
        WEFT_INFO(WEFT_SUB_INIT, "rank %d: pinned to CPU %d (local rank %d of %d)", rank, cpu, k,
                  local);
}
