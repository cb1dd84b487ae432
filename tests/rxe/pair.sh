#!/bin/sh
# Inside one guest with two rxe devices on the two ends of a veth pair
# (inside.sh), ranks posing as two hosts: connections that cross devices of
# one kernel, through the real librdmacm (the default) and by hand.  rdma_cm
# asked to resolve a peer's address without a source routes by destination
# alone and can hand back another device than the listener's: the case that
# found weft's connect resolving without one.
cd "$(dirname "$0")/../.." || exit 2
rs=tests/rxe/ranks.sh
fails=0
export WEFT_TRANSPORT=verbs WEFT_CALIBRATE=0
for cm in auto oob; do
    for m in 1 2; do
        name="all_reduce $((2 * m)) ranks WEFT_IB_CM=$cm across rxea and rxeb"
        echo "== $name"
        if WEFT_IB_CM=$cm sh "$rs" "$m" build/all_reduce_perf -b 8 -e 1M -f 32 -n 2 -w 1 -c 1 \
            -A ring,tree,rhd,direct -N 1 >/tmp/job.out 2>&1 &&
            ! grep "Out of bounds" /tmp/job.out | grep -qv ": 0 OK"; then
            grep -E "Out of bounds|^ranks:" /tmp/job.out
            echo "rxe: PASS $name"
        else
            tail -30 /tmp/job.out
            echo "rxe: FAIL $name"
            fails=$((fails + 1))
        fi
    done
done
echo "rxe: $fails failed"
[ "$fails" = 0 ]
