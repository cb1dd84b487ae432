#!/bin/sh
# Inside one guest with two rxe devices on the two ends of a veth pair
# (inside.sh), ranks posing as two hosts: connections that cross devices of
# one kernel, through the real librdmacm (the default) and by hand.  rdma_cm
# asked to resolve a peer's address without a source routes by destination
# alone and can hand back another device than the listener's: the case that
# found weft's connect resolving without one.
cd "$(dirname "$0")/../.." || exit 2
. tests/rxe/jobs.sh
for cm in auto oob; do
    for m in 1 2; do
        job "all_reduce $((2 * m)) ranks WEFT_IB_CM=$cm across rxea and rxeb" "$m" WEFT_IB_CM=$cm -- \
            build/all_reduce_perf -b 8 -e 1M -f 32 -n 2 -w 1 -A ring,tree,rhd,direct -N 1
    done
done
echo "rxe: $fails failed"
[ "$fails" = 0 ]
