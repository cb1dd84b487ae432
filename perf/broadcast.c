/* broadcast_perf: weft_broadcast from -r root (all: every root in turn),
 * busbw = algbw. */
#include "common.h"

static double bus_factor(int n)
{
    (void)n;
    return 1.0;
}

static weft_status_t run(const perf_call_t *c, weft_comm_t comm)
{
    return weft_broadcast(c->sendbuf, c->recvbuf, c->count, c->dtype, c->root, comm);
}

static const perf_coll_t coll = {
    .name = "broadcast", .kind = PERF_KIND_BROADCAST, .has_op = 0, .has_root = 1,
    .check_in_place = 1, .bus_factor = bus_factor, .run = run};

int main(int argc, char **argv)
{
    return perf_main(&coll, argc, argv);
}
