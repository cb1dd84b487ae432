/* all_reduce_perf: weft_allreduce, busbw = algbw * 2(n-1)/n. */
#include "common.h"

static double bus_factor(int n)
{
    return 2.0 * (n - 1) / n;
}

static weft_status_t run(const perf_call_t *c, weft_comm_t comm)
{
    return weft_allreduce(c->sendbuf, c->recvbuf, c->count, c->dtype, c->op, comm);
}

static const perf_coll_t coll = {
    .name = "all_reduce", .kind = PERF_KIND_ALLREDUCE, .has_op = 1, .has_root = 0,
    .check_in_place = 1, .bus_factor = bus_factor, .run = run};

int main(int argc, char **argv)
{
    return perf_main(&coll, argc, argv);
}
