#!/bin/sh
# Inside the guests (2-guest shape; each guest runs this same script, so the
# jobs pair up in order): the collective matrix with WEFT_TRANSPORT=verbs
# across the two hosts, then the fault cases.  Prints "rxe: PASS|FAIL name"
# per job and exits 1 if any failed.
cd "$(dirname "$0")/../.." || exit 2
. tests/rxe/jobs.sh
fams=ring,tree,rhd,direct
# 2 ranks (one a host): every collective and family, rdma_cm, bounce buffers.
for t in all_reduce reduce_scatter all_gather broadcast reduce; do
    job "$t 2 ranks rdma_cm bounce" 1 -- build/${t}_perf -b 8 -e 1M -f 32 -n 2 -w 1 -A "$fams" -N 1
done
job "sendrecv 2 ranks rdma_cm bounce" 1 -- build/sendrecv_perf -b 8 -e 4M -f 16 -n 2 -w 1
# 4 ranks (two a host, shm between them): every family (hier too),
# registered buffers, two queue pairs a peer.
for t in all_reduce reduce_scatter all_gather broadcast reduce; do
    job "$t 4 ranks rdma_cm registered 2 qps" 2 WEFT_IB_QPS_PER_CONNECTION=2 -- \
        build/${t}_perf -b 8 -e 1M -f 32 -n 2 -w 1 -R 1 -A "$fams,hier" -N 1
done
job "sendrecv 4 ranks rdma_cm registered 2 qps" 2 WEFT_IB_QPS_PER_CONNECTION=2 -- \
    build/sendrecv_perf -b 8 -e 4M -f 16 -n 2 -w 1 -R 1
# Queue pairs set up by hand (over tcp), and the registration cache for
# every buffer.
job "all_reduce 4 ranks oob bounce 2 qps" 2 WEFT_IB_CM=oob WEFT_IB_QPS_PER_CONNECTION=2 -- \
    build/all_reduce_perf -b 8 -e 4M -f 8 -n 2 -w 1 -A "$fams,hier" -N 1
job "all_gather 2 ranks rdma_cm regcache" 1 WEFT_IB_REGCACHE=1 -- \
    build/all_gather_perf -b 8 -e 4M -f 8 -n 2 -w 1

# fault NAME DO LIMIT ENV... -- TOOL ARGS: DO runs in this guest once its
# rxe device has sent 5000 packets for the job (about 80 iterations of the
# timed loop: past bootstrap and setup however slow the emulation; at most
# 120 s).  Every surviving rank must then fail (nonzero, its error naming a
# rank or the device) within LIMIT seconds of that moment.
sent=/sys/class/infiniband/rxe0/ports/1/hw_counters/sent_pkts
busy="n=0; while [ \$((\$(cat $sent) - \$RXE_SENT0)) -lt 5000 ] && [ \$n -lt 1200 ]; do
      sleep 0.1; n=\$((n + 1)); done; date +%s.%N >/tmp/fault.at"
fault() {
    name=$1 do=$2 limit=$3
    shift 3
    echo "== $name"
    rm -f /tmp/fault.at
    t0=$(date +%s.%N)
    RXE_SENT0=$(cat $sent) RANKS_AFTER=1 RANKS_DO="$busy; $do" "$@" >/tmp/job.out 2>&1
    grep -E "weft WARN|failed|^ranks:" /tmp/job.out | head -20
    at=$(awk -v a="$(cat /tmp/fault.at 2>/dev/null || echo "$t0")" -v b="$t0" 'BEGIN { print a - b }')
    echo "fault at $at s"
    st=0
    while read -r _ _ r _ s _ t _; do
        case "$s" in
        0) echo "rank $r finished: the fault did not reach it"; st=1 ;;
        137) ;; # the rank the test killed
        *) if [ "$(awk -v t="$t" -v a="$at" -v l="$limit" 'BEGIN { print (t - a > l) }')" = 1 ]; then
               echo "rank $r failed $t s after its start, over $limit s after the fault"; st=1
           fi
           grep "^\[$r\]" /tmp/job.out | grep -Eq "rank [0-9]+|rxe0" || { echo "rank $r: no rank or device named"; st=1; } ;;
        esac
    done <<EOT
$(grep "^ranks:" /tmp/job.out)
EOT
    result "$name" "$st"
}
# A rank of the other host killed mid-collective (rank 3, in guest 1).
kill3='[ "$WEFT_RXE_GUEST" = 1 ] && kill -9 "$(cat "$dir/3.pid")"'
fault "rank 3 killed mid-all_reduce" "$kill3" 40 \
    env sh "$rs" 2 build/all_reduce_perf -b 64K -e 64K -n 1000000 -w 1 -c 0
# The port taken down under the ranks (guest 1's link; the retry timeout
# short so that guest 0's ranks learn of it from their queue pairs).
down='[ "$WEFT_RXE_GUEST" = 1 ] && ip link set eth0 down'
fault "eth0 down mid-all_reduce" "$down" 60 env WEFT_IB_TIMEOUT=14 WEFT_IB_RETRY_CNT=3 WEFT_TIMEOUT_MS=30000 \
    sh "$rs" 1 build/all_reduce_perf -b 64K -e 64K -n 1000000 -w 1 -c 0
echo "rxe: $fails failed"
[ "$fails" = 0 ]
