/* all_gather_perf: weft_allgather; size is the whole output (count*n
 * elements), busbw = algbw * (n-1)/n. */
#include "common.h"

static double bus_factor(int n)
{
    return (double)(n - 1) / n;
}

static weft_status_t run(const perf_call_t *c, weft_comm_t comm)
{
    return weft_allgather(c->sendbuf, c->recvbuf, c->count, c->dtype, comm);
}

static const perf_coll_t coll = {
    .name = "all_gather", .kind = PERF_KIND_ALLGATHER, .has_op = 0, .has_root = 0,
    .check_in_place = 1, .bus_factor = bus_factor, .run = run};

int main(int argc, char **argv)
{
    return perf_main(&coll, argc, argv);
}
