/* all_reduce_perf: weft_allreduce, busbw = algbw * 2(n-1)/n. */
#include "common.h"

int main(int argc, char **argv)
{
    return perf_main(PERF_KIND_ALLREDUCE, argc, argv);
}
