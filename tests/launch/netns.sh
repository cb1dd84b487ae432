# shellcheck shell=bash disable=SC2034  # the variables are for the callers
# netns.sh - two posed nodes on this machine for the launcher tests: a
# control namespace holding a bridge at $SUBNET.1, and one network
# namespace per node at $SUBNET.11, .12, ...; a node's processes also get a
# UTS namespace with the node's name as host name, so weft sees hosts of
# their own and goes over TCP between them.  Owns the namespaces it makes
# and the processes left in them.  Sourced; the host's network is left
# untouched.

SUBNET=10.78.0            # the posed cluster's network, inside its namespaces
NS_PREFIX="weft-launch$$-" # namespace names: prefix + ctl or the node's name
NETNS=()                  # namespaces this run made, in order

# stop_pids PID...: TERM, up to 10 s to go, then KILL.
stop_pids() {
    local p _
    [ $# -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    for _ in $(seq 1 50); do
        for p in "$@"; do
            kill -0 "$p" 2>/dev/null && break
            p=""
        done
        [ -n "$p" ] || return 0
        sleep 0.2
    done
    kill -KILL "$@" 2>/dev/null || true
}

# Why this machine cannot pose nodes, or nothing.
netns_why_not() {
    local c probe="${NS_PREFIX}probe"
    [ "$(id -u)" = 0 ] || { echo "not root"; return; }
    for c in ip nsenter unshare hostname; do
        command -v "$c" >/dev/null 2>&1 || { echo "no '$c' command"; return; }
    done
    if ! ip netns add "$probe" 2>/dev/null; then
        echo "cannot create a network namespace"
        return
    fi
    if ! ip -n "$probe" link add name probe0 type bridge 2>/dev/null; then
        ip netns del "$probe" 2>/dev/null || true
        echo "cannot create a bridge in a network namespace"
        return
    fi
    ip netns del "$probe" 2>/dev/null || true
    unshare --uts true 2>/dev/null || echo "cannot create a UTS namespace"
}

# ns_add NAME: the namespace $NS_PREFIX$NAME with its loopback up.
ns_add() {
    ip netns add "$NS_PREFIX$1" || return 1
    NETNS+=("$NS_PREFIX$1")
    ip -n "$NS_PREFIX$1" link set lo up
}

# net_up NODE...: the control namespace and the nodes, cabled to its
# bridge by veth pairs; node i at $SUBNET.(11 + i).
net_up() {
    local c="${NS_PREFIX}ctl" i=0 n
    ns_add ctl && ip -n "$c" link add br0 type bridge &&
        ip -n "$c" addr add "$SUBNET.1/24" dev br0 && ip -n "$c" link set br0 up || return 1
    for n in "$@"; do
        ns_add "$n" && ip -n "$c" link add "p$i" type veth peer name eth0 netns "$NS_PREFIX$n" &&
            ip -n "$c" link set "p$i" master br0 && ip -n "$c" link set "p$i" up &&
            ip -n "$NS_PREFIX$n" addr add "$SUBNET.$((11 + i))/24" dev eth0 &&
            ip -n "$NS_PREFIX$n" link set eth0 up || return 1
        i=$((i + 1))
    done
}

# The command prefix that runs in the control namespace (launchers, srun).
# nsenter, not `ip netns exec`: that remounts /sys without
# /sys/fs/cgroup, and slurmd will not start without it.
in_ctl() {
    IN_CTL=(nsenter --net="/run/netns/${NS_PREFIX}ctl")
}

# on_node NODE: ON_NODE, the command prefix that runs a command in NODE's
# network namespace under NODE's host name (each step execs the next, so
# a pid taken of it is the command's).
on_node() {
    # shellcheck disable=SC2016  # expanded by that sh
    ON_NODE=(nsenter --net="/run/netns/$NS_PREFIX$1" unshare --uts
             sh -c 'hostname "$1" && shift && exec "$@"' - "$1")
}

# Every process in a namespace this run made: ranks, daemons and the
# launchers' helpers, which deleting the namespace would not stop.
netns_pids() {
    local n ino d l want=" "
    for n in "${NETNS[@]}"; do
        ino=$(stat -L -c %i "/run/netns/$n" 2>/dev/null) && want+="net:[$ino] "
    done
    [ "$want" != " " ] || return 0
    for d in /proc/[0-9]*; do
        l=$(readlink "$d/ns/net" 2>/dev/null) || continue
        case "$want" in *" $l "*) echo "${d#/proc/}" ;; esac
    done
}

# Stops what runs in the namespaces, then deletes them.
netns_down() {
    local n
    # shellcheck disable=SC2046  # a list of pids
    stop_pids $(netns_pids)
    for n in "${NETNS[@]}"; do
        ip netns del "$n" 2>/dev/null || true
    done
    NETNS=()
}
