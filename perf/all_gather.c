/* all_gather_perf: weft_allgather; size is the whole output (count*n
 * elements), busbw = algbw * (n-1)/n. */
#include "common.h"

int main(int argc, char **argv)
{
    return perf_main(PERF_KIND_ALLGATHER, argc, argv);
}
