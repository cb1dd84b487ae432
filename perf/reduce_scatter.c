/* reduce_scatter_perf: weft_reduce_scatter; size is the whole input (count*n
 * elements), busbw = algbw * (n-1)/n. */
#include "common.h"

int main(int argc, char **argv)
{
    return perf_main(PERF_KIND_REDUCE_SCATTER, argc, argv);
}
