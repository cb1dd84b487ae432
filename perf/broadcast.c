/* broadcast_perf: weft_broadcast from -r root (all: every root in turn),
 * busbw = algbw. */
#include "common.h"

int main(int argc, char **argv)
{
    return perf_main(PERF_KIND_BROADCAST, argc, argv);
}
