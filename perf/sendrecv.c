/* sendrecv_perf: a ring, each rank sends to rank+1 and receives from rank-1
 * in one group; busbw = algbw.  In place sends and receives the same buffer
 * at once, so, as in nccl-tests, it is timed but not checked. */
#include "common.h"

static double bus_factor(int n)
{
    (void)n;
    return 1.0;
}

static weft_status_t run(const perf_call_t *c, weft_comm_t comm)
{
    int next = (c->rank + 1) % c->nranks, prev = (c->rank + c->nranks - 1) % c->nranks;
    weft_status_t st = weft_group_start();
    if (st != WEFT_OK)
        return st;
    weft_status_t st_send = weft_send(c->sendbuf, c->count, c->dtype, next, comm);
    weft_status_t st_recv = weft_recv(c->recvbuf, c->count, c->dtype, prev, comm);
    /* The group must be closed even when queueing failed. */
    st = weft_group_end();
    return st_send != WEFT_OK ? st_send : st_recv != WEFT_OK ? st_recv : st;
}

static const perf_coll_t coll = {
    .name = "sendrecv", .kind = PERF_KIND_SENDRECV, .has_op = 0, .has_root = 0,
    .check_in_place = 0, .bus_factor = bus_factor, .run = run};

int main(int argc, char **argv)
{
    return perf_main(&coll, argc, argv);
}
