/* reduce_scatter_perf: weft_reduce_scatter; size is the whole input (count*n
 * elements), busbw = algbw * (n-1)/n. */
#include "common.h"

static double bus_factor(int n)
{
    return (double)(n - 1) / n;
}

static weft_status_t run(const perf_call_t *c, weft_comm_t comm)
{
    return weft_reduce_scatter(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm);
}

static const perf_coll_t coll = {
    .name = "reduce_scatter", .kind = PERF_KIND_REDUCE_SCATTER, .has_op = 1, .has_root = 0,
    .check_in_place = 1, .bus_factor = bus_factor, .run = run};

int main(int argc, char **argv)
{
    return perf_main(&coll, argc, argv);
}
