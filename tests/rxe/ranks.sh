#!/bin/sh
# Inside a guest: ranks.sh M CMD [ARGS...] starts M ranks of CMD per host of
# the job and waits for them.  1 guest: two posed hosts (WEFT_HOSTID a and b,
# each on its own rxe device and veth end); 2 guests: this guest's M ranks,
# the other guest runs the same line for its own.  Every call in a guest
# must be matched by the same call in the other, in the same order: jobs are
# numbered, and job k's root listens on port 20000 + k of host 0.
# Output: each rank's lines prefixed "[rank] ", then "ranks: rank R exit S
# after T s" for each; the status is the first failing rank's, 124 if the
# job ran past RANKS_TIMEOUT (default 300 s).  RANKS_AFTER=S RANKS_DO=CMD
# runs CMD in this guest S seconds after the ranks start (CMD sees the
# ranks' pid files as $dir/R.pid), for the fault tests.
m=$1
shift
: "${RANKS_TIMEOUT:=300}"
k=$(cat /tmp/weft-rxe-job 2>/dev/null || echo 0)
echo $((k + 1)) >/tmp/weft-rxe-job
port=$((20000 + k))
if [ "$WEFT_RXE_GUESTS" = 1 ]; then
    hosts="0 1"
    root=10.88.0.1
else
    hosts=$WEFT_RXE_GUEST
    root=10.99.0.1
fi
nr=$((m * 2))
dir=$(mktemp -d)
for h in $hosts; do
    if [ "$WEFT_RXE_GUESTS" = 1 ]; then
        if [ "$h" = 0 ]; then set -- va rxea a "$@"; else set -- vb rxeb b "$@"; fi
    else
        set -- eth0 rxe0 "guest$h" "$@"
    fi
    ifname=$1 dev=$2 hostid=$3
    shift 3
    i=0
    while [ $i -lt "$m" ]; do
        r=$((h * m + i))
        (
            t0=$(date +%s.%N)
            WEFT_RANK=$r WEFT_NRANKS=$nr WEFT_LOCAL_RANK=$i WEFT_LOCAL_SIZE=$m \
                WEFT_ROOT="$root:$port" WEFT_HOSTID="$hostid" WEFT_SOCKET_IFNAME="$ifname" \
                WEFT_IB_HCA="=$dev" timeout -k 5 "$RANKS_TIMEOUT" \
                sh -c 'echo $$ >"$0"; exec "$@"' "$dir/$r.pid" "$@" >"$dir/$r.out" 2>&1
            echo "$? $(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')" >"$dir/$r.rc"
        ) &
        i=$((i + 1))
    done
done
if [ -n "${RANKS_DO:-}" ]; then
    sleep "${RANKS_AFTER:-1}"
    dir=$dir sh -c "$RANKS_DO"
fi
wait
rc=0
for f in "$dir"/*.rc; do
    r=$(basename "$f" .rc)
    sed "s/^/[$r] /" "$dir/$r.out"
    read -r s t <"$f"
    echo "ranks: rank $r exit $s after $t s"
    [ "$rc" = 0 ] && [ "$s" != 0 ] && rc=$s
done
rm -rf "$dir"
exit "$rc"
