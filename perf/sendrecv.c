/* sendrecv_perf: a ring, each rank sends to rank+1 and receives from rank-1
 * in one group; busbw = algbw.  In place sends and receives the same buffer
 * at once, so, as in nccl-tests, it is timed but not checked. */
#include "common.h"

int main(int argc, char **argv)
{
    return perf_main(PERF_KIND_SENDRECV, argc, argv);
}
