/* reduce_perf: weft_reduce to -r root (all: every root in turn),
 * busbw = algbw. */
#include "common.h"

int main(int argc, char **argv)
{
    return perf_main(PERF_KIND_REDUCE, argc, argv);
}
