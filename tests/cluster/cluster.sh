#!/usr/bin/env bash
# cluster.sh - a pretend cluster on one machine: K network namespaces
# ("nodes") joined through a switch namespace over veth pairs, the links
# shaped with tc, M ranks of a command in each node.  Owns every namespace,
# link and relay process it makes, and removes them on any exit.
#
#   cluster.sh check                         can this machine run it? (77: no)
#   cluster.sh up K [--rate R] [--delay-us D] [--relay PATH]
#   cluster.sh run K M [--rate R] [--delay-us D] [--timeout S] [--logdir DIR]
#                      [--relay PATH] [--env VAR=VAL]... -- CMD ARGS...
#   cluster.sh down [PREFIX]
#
# Layout: namespace <prefix>sw holds the switch; node i is namespace
# <prefix>n<i> with eth0 = 10.77.0.<i+1>/24, cabled to port p<i> of the
# switch.  Without a delay the switch is a kernel bridge (br0); with
# --delay-us it is tests/cluster/relay, a userspace learning switch that
# holds each frame D microseconds (the kernel has no netem).  --rate puts an
# htb limit on both ends of every cable, so each node sends and receives at
# most R.  Nothing is created in the caller's namespace.
set -euo pipefail

readonly SUBNET=10.77.0
readonly ROOT_PORT=29500
PREFIX="wc$$-"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

K=0 M=0 RATE="" DELAY_US=0 TIMEOUT=300 LOGDIR="" RELAY="${WEFT_CLUSTER_RELAY:-}"
EXTRA_ENV=() CMD=()
OWNED=0       # 1 once this process may have made something: the EXIT trap tears down
RELAY_PID=""
RANK_PIDS=()  # the subshells that run one rank each and record its exit status

usage() {
    sed -n '7,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit 2
}

die() {
    echo "cluster.sh: $*" >&2
    exit 2
}

have() { command -v "$1" >/dev/null 2>&1; }

# Why this machine cannot run a cluster, or nothing.
why_not() {
    [ "$(id -u)" -eq 0 ] || { echo "needs root (network namespaces, veth, tc)"; return; }
    local c
    for c in ip tc timeout; do
        have "$c" || { echo "'$c' is not installed"; return; }
    done
    local probe="${PREFIX}probe" err
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "cannot create a network namespace: $err"
        return
    fi
    if ! err=$(ip -n "$probe" link add name probe0 type veth peer name probe1 2>&1); then
        ip netns del "$probe" 2>/dev/null || true
        echo "cannot create a veth pair: $err"
        return
    fi
    if ! err=$(tc -n "$probe" qdisc add dev probe0 root handle 1: htb default 1 2>&1); then
        ip netns del "$probe" 2>/dev/null || true
        echo "tc cannot add an htb qdisc: $err"
        return
    fi
    ip netns del "$probe"
}

# Namespaces whose names start with $1.
namespaces_of() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -F -- "$1" | grep "^$1" || true
}

# Kills every process inside the namespaces of prefix $1 (they are all ours:
# nothing else runs in them), waits for them, then deletes the namespaces,
# which takes their veths and bridge with them.
teardown() {
    local prefix=$1 ns pids all=() tries
    rm -rf "${TMPDIR:-/tmp}/weft-cluster-${prefix%-}" # cmd_up's log dir
    for ns in $(namespaces_of "$prefix"); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        # shellcheck disable=SC2206
        [ -n "$pids" ] && all+=($pids)
    done
    if [ ${#all[@]} -gt 0 ]; then
        kill -KILL "${all[@]}" 2>/dev/null || true
        for ((tries = 0; tries < 50; tries++)); do
            kill -0 "${all[@]}" 2>/dev/null || break
            sleep 0.1
        done
    fi
    for ns in $(namespaces_of "$prefix"); do
        ip netns del "$ns" 2>/dev/null || echo "cluster.sh: could not delete namespace $ns" >&2
    done
}

on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    if [ "$OWNED" = 1 ]; then
        stop_relay
        teardown "$PREFIX"
        # Their ranks are dead now; let them write the status and go.
        [ ${#RANK_PIDS[@]} -eq 0 ] || wait "${RANK_PIDS[@]}" 2>/dev/null || true
    fi
    exit "$rc"
}

# The relay prints its counters when asked to stop; give it a second.
stop_relay() {
    [ -n "$RELAY_PID" ] || return 0
    kill -TERM "$RELAY_PID" 2>/dev/null || true
    local tries
    for ((tries = 0; tries < 20; tries++)); do
        kill -0 "$RELAY_PID" 2>/dev/null || break
        sleep 0.05
    done
    wait "$RELAY_PID" 2>/dev/null || true
    RELAY_PID=""
}

find_relay() {
    [ "$DELAY_US" -gt 0 ] || return 0
    if [ -z "$RELAY" ]; then
        local c
        for c in "$HERE/relay" "$HERE/../../build/tests/cluster/relay"; do
            [ -x "$c" ] && RELAY=$c && break
        done
    fi
    if [ -z "$RELAY" ] || [ ! -x "$RELAY" ]; then
        die "--delay-us needs the relay binary: build it with 'make check' (or" \
            "'make tests/cluster/relay') and pass --relay PATH or WEFT_CLUSTER_RELAY"
    fi
}

parse_opts() {
    while [ $# -gt 0 ]; do
        case $1 in
        --rate) RATE=${2:?--rate wants a tc rate like 1gbit}; shift 2 ;;
        --delay-us) DELAY_US=${2:?--delay-us wants microseconds}; shift 2 ;;
        --timeout) TIMEOUT=${2:?--timeout wants seconds}; shift 2 ;;
        --logdir) LOGDIR=${2:?--logdir wants a folder}; shift 2 ;;
        --relay) RELAY=${2:?--relay wants a path}; shift 2 ;;
        --env)
            [[ ${2:-} == [A-Za-z_]*=* ]] || die "--env wants VAR=VALUE"
            EXTRA_ENV+=("$2"); shift 2 ;;
        --) shift; CMD=("$@"); return 0 ;;
        *) die "unknown option '$1' (see: cluster.sh help)" ;;
        esac
    done
}

check_numbers() {
    if ! [[ $K =~ ^[0-9]+$ ]] || [ "$K" -lt 1 ] || [ "$K" -gt 64 ]; then die "K wants 1..64 nodes"; fi
    [[ $DELAY_US =~ ^[0-9]+$ ]] || die "--delay-us wants an integer"
    if ! [[ $TIMEOUT =~ ^[0-9]+$ ]] || [ "$TIMEOUT" -lt 1 ]; then die "--timeout wants seconds >= 1"; fi
    if [ -n "$RATE" ]; then
        rate_bits "$RATE" >/dev/null ||
            die "--rate wants a tc rate like 1gbit or 100mbit (got '$RATE')"
    fi
}

# Bits per second of a tc rate like 1gbit, 100mbit or 10mbps.
rate_bits() {
    local num unit mult
    [[ $1 =~ ^([0-9]+)([kmgt]?)(bit|bps)$ ]] || return 1
    num=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
    case $unit in k) mult=1000 ;; m) mult=1000000 ;; g) mult=1000000000 ;;
        t) mult=1000000000000 ;; *) mult=1 ;; esac
    [ "${BASH_REMATCH[3]}" = bps ] && mult=$((mult * 8))
    echo $((num * mult))
}

# Caps what leaves interface $2 of namespace $1 at $RATE with a bucket of 2
# frames, so an idle link banks next to no burst, as a real one banks none
# (why not 1 ms of traffic, or capped TSO segments: README.md, "Shaping").
shape() {
    tc -n "$1" qdisc add dev "$2" root handle 1: htb default 1
    tc -n "$1" class add dev "$2" parent 1: classid 1:1 htb rate "$RATE" ceil "$RATE" \
        burst 3028 cburst 3028 quantum 65536
}

# Builds the switch and K nodes under $PREFIX; $1 is where the relay logs.
build() {
    local logdir=$1 sw="${PREFIX}sw" i ns ports=()
    why=$(why_not)
    [ -z "$why" ] || die "cannot build a cluster here: $why"
    OWNED=1
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    for ((i = 0; i < K; i++)); do
        ns="${PREFIX}n$i"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # Quiet links: no IPv6 neighbour discovery chatter through the switch.
        ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6' \
            2>/dev/null || true
        ip -n "$sw" link add name "p$i" type veth peer name eth0 netns "$ns"
        ip -n "$ns" addr add "$SUBNET.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$sw" link set "p$i" up
        ports+=("p$i")
        if [ -n "$RATE" ]; then
            shape "$ns" eth0
            shape "$sw" "p$i"
        fi
    done
    ip netns exec "$sw" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6' \
        2>/dev/null || true
    if [ "$DELAY_US" -gt 0 ]; then
        local tries
        ip netns exec "$sw" "$RELAY" --delay-us "$DELAY_US" "${ports[@]}" \
            >"$logdir/relay.log" 2>&1 &
        RELAY_PID=$!
        echo "$RELAY_PID" >"$logdir/relay.pid"
        for ((tries = 0; tries < 100; tries++)); do
            grep -q '^relay: ready' "$logdir/relay.log" && break
            kill -0 "$RELAY_PID" 2>/dev/null ||
                die "the relay did not start: $(cat "$logdir/relay.log")"
            sleep 0.05
        done
        grep -q '^relay: ready' "$logdir/relay.log" || die "the relay did not get ready in 5 s"
    else
        ip -n "$sw" link add br0 type bridge
        for ((i = 0; i < K; i++)); do
            ip -n "$sw" link set "p$i" master br0
        done
        ip -n "$sw" link set br0 up
    fi
    # Wait until node 0 answers from every node: the bridge's ports are
    # forwarding and the relay is switching.
    for ((i = 1; i < K; i++)); do
        local tries ok=0 out
        for ((tries = 0; tries < 50; tries++)); do
            # "connection refused" is an answer too: the path works.
            out=$(timeout 2 ip netns exec "${PREFIX}n$i" bash -c \
                "exec 3<>/dev/tcp/$SUBNET.1/9" 2>&1) && ok=1
            [[ $out == *refused* ]] && ok=1
            [ "$ok" = 1 ] && break
            sleep 0.1
        done
        [ "$ok" = 1 ] || die "node $i cannot reach node 0 at $SUBNET.1"
    done
}

cmd_up() {
    K=${1:?usage: cluster.sh up K [--rate R] [--delay-us D]}
    shift
    parse_opts "$@"
    [ ${#CMD[@]} -eq 0 ] || die "up takes no command (use run)"
    check_numbers
    find_relay
    # Named after the prefix, so that 'down' finds it.
    local logdir="${TMPDIR:-/tmp}/weft-cluster-${PREFIX%-}"
    mkdir -m 700 "$logdir"
    build "$logdir"
    # Success: leave it all standing; 'cluster.sh down' removes it.
    OWNED=0
    trap - EXIT INT TERM
    echo "cluster ${PREFIX%-}: $K nodes${RATE:+, $RATE links}${RELAY_PID:+, relay pid $RELAY_PID delaying $DELAY_US us (log $logdir/relay.log)}"
    local i
    for ((i = 0; i < K; i++)); do
        echo "  node $i: ip netns exec ${PREFIX}n$i ...   eth0 $SUBNET.$((i + 1))"
    done
    echo "  ranks: WEFT_ROOT=$SUBNET.1:$ROOT_PORT WEFT_SOCKET_IFNAME=eth0 WEFT_HOSTID=node<i>"
    echo "  remove with: $0 down ${PREFIX}"
}

cmd_run() {
    K=${1:?usage: cluster.sh run K M [options] -- CMD ARGS...}
    M=${2:?usage: cluster.sh run K M [options] -- CMD ARGS...}
    shift 2
    parse_opts "$@"
    [ ${#CMD[@]} -gt 0 ] || die "run wants a command after --"
    check_numbers
    if ! [[ $M =~ ^[0-9]+$ ]] || [ "$M" -lt 1 ] || [ "$M" -gt 64 ]; then
        die "M wants 1..64 ranks per node"
    fi
    find_relay
    if [ -z "$LOGDIR" ]; then
        LOGDIR=$(mktemp -d "${TMPDIR:-/tmp}/weft-cluster.XXXXXX")
    else
        mkdir -p "$LOGDIR"
        rm -f "$LOGDIR"/rank*.out "$LOGDIR"/rank*.err "$LOGDIR"/rank*.rc "$LOGDIR"/relay.*
    fi
    local t0=$SECONDS
    build "$LOGDIR"
    local n=$((K * M)) secret i m r
    secret=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    for ((i = 0; i < K; i++)); do
        for ((m = 0; m < M; m++)); do
            r=$((i * M + m))
            (
                rc=0
                timeout -k 3 "$TIMEOUT" ip netns exec "${PREFIX}n$i" env \
                    WEFT_RANK=$r WEFT_NRANKS=$n WEFT_LOCAL_RANK=$m WEFT_LOCAL_SIZE="$M" \
                    WEFT_ROOT="$SUBNET.1:$ROOT_PORT" WEFT_SECRET="$secret" \
                    WEFT_HOSTID="node$i" WEFT_SOCKET_IFNAME=eth0 \
                    WEFT_CLUSTER_NODE=$i WEFT_CLUSTER_NODES="$K" \
                    "${EXTRA_ENV[@]}" "${CMD[@]}" \
                    >"$LOGDIR/rank$r.out" 2>"$LOGDIR/rank$r.err" </dev/null || rc=$?
                echo "$rc" >"$LOGDIR/rank$r.rc"
            ) &
            RANK_PIDS+=($!)
        done
    done
    local p
    for p in "${RANK_PIDS[@]}"; do
        wait "$p" || true
    done
    stop_relay
    teardown "$PREFIX"
    OWNED=0

    local failed=0 rc what
    for ((r = 0; r < n; r++)); do
        rc=$(cat "$LOGDIR/rank$r.rc" 2>/dev/null || echo "none")
        [ "$rc" = 0 ] && continue
        failed=$((failed + 1))
        case $rc in
        124 | 137) what="timed out after ${TIMEOUT}s" ;;
        none) what="left no exit status" ;;
        *) what="exited $rc" ;;
        esac
        echo "cluster.sh: rank $r (node $((r / M))) $what; last lines of $LOGDIR/rank$r.err:" >&2
        tail -n 5 "$LOGDIR/rank$r.err" 2>/dev/null | sed 's/^/    /' >&2 || true
    done
    [ -s "$LOGDIR/rank0.out" ] && cat "$LOGDIR/rank0.out"
    if [ -f "$LOGDIR/relay.log" ]; then
        grep -v '^relay: ready' "$LOGDIR/relay.log" | sed 's/^/cluster.sh: /' >&2 || true
    fi
    local links=${RATE:+, $RATE links}
    [ "$DELAY_US" -gt 0 ] && links+=", +${DELAY_US}us through the relay"
    echo "cluster.sh: $n ranks on $K nodes$links:" \
        "$((n - failed)) ok, $failed failed, $((SECONDS - t0))s; logs in $LOGDIR" >&2
    [ "$failed" -eq 0 ]
}

# Removes what crashed runs and 'up' left: every wc<pid>- set whose <pid>
# is no longer running, or exactly the prefix given.
cmd_down() {
    [ "$(id -u)" -eq 0 ] || die "needs root"
    if [ $# -gt 0 ]; then
        [[ $1 =~ ^wc[0-9]+-$ ]] || die "a prefix looks like wc1234-"
        teardown "$1"
        return 0
    fi
    local ns pid done_list=" "
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^wc[0-9]+-' || true); do
        pid=${ns#wc}
        pid=${pid%%-*}
        [[ $done_list == *" $pid "* ]] && continue
        done_list+="$pid "
        if kill -0 "$pid" 2>/dev/null && [ "$pid" != $$ ] &&
            grep -q cluster.sh "/proc/$pid/cmdline" 2>/dev/null; then
            echo "cluster.sh: wc$pid- belongs to a running cluster.sh; left alone" >&2
            continue
        fi
        echo "cluster.sh: removing wc$pid-*" >&2
        teardown "wc$pid-"
    done
}

trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

case ${1:-help} in
check)
    why=$(why_not)
    if [ -n "$why" ]; then
        echo "cluster.sh: $why"
        exit 77
    fi
    echo "cluster.sh: ok"
    ;;
up) shift; cmd_up "$@" ;;
run) shift; cmd_run "$@" ;;
down) shift; cmd_down "$@" ;;
*) usage ;;
esac
