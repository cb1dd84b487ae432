#!/usr/bin/env bash
# slurm.sh - weft started by a real Slurm on this one machine: the test
# starts munged, slurmctld and slurmd from a throw-away slurm.conf (as
# root), srun -n 4 runs the perf tools with checking on and the trainer,
# then every daemon, process, namespace and temp dir it made goes, on any
# exit.  First one node (this host); then two nodes, each a network
# namespace with its own address and host name, slurmctld in a third.
# Exit 77: the Slurm or munge packages are absent.
#
#   tests/launch/slurm.sh [LOGDIR]      (default build/launch/slurm)
#   WEFT_LAUNCH_TWO=ports: the two nodes as two slurmd on this host even
#   where namespaces can be made.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$(dirname "$0")/netns.sh"
LOGDIR=${1:-$BUILD/launch/slurm}
UP_TIMEOUT=60   # seconds for the daemons to start and the nodes to go idle

missing=""
for c in munged slurmctld slurmd srun sinfo sbatch scontrol scancel; do
    command -v "$c" >/dev/null 2>&1 || missing="$missing $c"
done
if [ -n "$missing" ]; then
    echo "slurm.sh: SKIPPED: not installed:$missing (Debian: slurmctld slurmd slurm-client munge)"
    exit 77
fi
[ "$(id -u)" = 0 ] || launch_die "needs root: it starts slurmctld, slurmd and munged"
launch_need_build
mkdir -p "$LOGDIR"

# Everything the run makes, so cleanup can undo exactly that.
TOP=$(mktemp -d /tmp/weft-slurm.XXXXXX)
chmod 755 "$TOP"  # munged wants every folder above its socket searchable
DAEMONS=()        # pids, in start order
T=""              # the current cluster's folder under $TOP

# Processes that carry this run's SLURM_CONF: slurmstepd and the tasks
# outlive slurmd when it is killed mid-step.
stray_pids() {
    local d
    for d in /proc/[0-9]*; do
        [ "${d#/proc/}" != $$ ] || continue
        # Not `tr | grep -q`: under pipefail tr's SIGPIPE would fail it.
        grep -qxF "SLURM_CONF=$T/slurm.conf" < <(tr '\0' '\n' 2>/dev/null <"$d/environ") \
            2>/dev/null && echo "${d#/proc/}"
    done
    return 0
}

# Stops the current cluster: its jobs, its daemons in reverse order, any
# process left with its configuration, its namespaces; keeps the logs.
cluster_down() {
    [ -n "$T" ] || return 0
    local i
    if [ "${#DAEMONS[@]}" -gt 0 ]; then
        timeout 10 "${CTL[@]}" scancel --quiet --user=root 2>/dev/null || true
        for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do
            stop_pids "${DAEMONS[i]}"
        done
        wait 2>/dev/null || true
        DAEMONS=()
    fi
    # shellcheck disable=SC2046  # a list of pids
    stop_pids $(stray_pids)
    netns_down
    for i in "$T"/*.log "$T"/*.out; do
        [ ! -f "$i" ] || cp "$i" "$LOGDIR/${T##*/}-${i##*/}"
    done
    T=""
}

cleanup() {
    local rc=$?
    cluster_down
    rm -rf "$TOP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: a daemon in the foreground, in the background.
start() {
    local name=$1
    shift
    "$@" >>"$T/$name.out" 2>&1 </dev/null &
    DAEMONS+=($!)
}

# The munge key and daemon of this cluster; the socket is a file, so one
# munged serves every namespace.
munge_up() {
    mkdir -m 755 "$T/munge"
    dd if=/dev/urandom of="$T/munge/key" bs=1024 count=1 status=none
    chmod 600 "$T/munge/key"
    start munged munged -F --key-file="$T/munge/key" --socket="$T/munge/sock" \
        --pid-file="$T/munge/pid" --log-file="$T/munged.log" --seed-file="$T/munge/seed"
    local i
    for i in $(seq 1 $((UP_TIMEOUT * 5))); do
        [ -S "$T/munge/sock" ] && return 0
        kill -0 "${DAEMONS[-1]}" 2>/dev/null || break
        sleep 0.2
    done
    echo "slurm.sh: munged did not start:" >&2
    tail -n 5 "$T/munged.out" "$T/munged.log" >&2 2>/dev/null || true
    return 1
}

# write_conf CTLADDR NODES...: slurm.conf for nodes given as
# NAME=ADDR:CPUS, or NAME=ADDR:CPUS:PORT for a slurmd of its own port.
# No cgroups, no accounting; state, spool, pids and logs under $T.
write_conf() {
    local ctl=$1 n name addr cpus port
    shift
    free_port
    local cport=$PORT
    free_port
    local dport=$PORT
    cat >"$T/slurm.conf" <<EOF
ClusterName=weft
SlurmctldHost=$(hostname -s)($ctl)
SlurmctldPort=$cport
SlurmdPort=$dport
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge/sock
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool-%n
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd-%n.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$T/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# The CPUs below, not the machine's: 4 ranks on a 2-core runner.
SlurmdParameters=config_overrides
ReturnToService=2
InactiveLimit=0
KillWait=5
MinJobAge=5
MessageTimeout=20
SlurmctldTimeout=60
SlurmdTimeout=60
MailProg=/bin/true
EOF
    for n in "$@"; do
        IFS=: read -r addr cpus port <<<"${n#*=}"
        name=${n%%=*}
        echo "NodeName=$name NodeAddr=$addr CPUs=$cpus${port:+ NodeHostname=$(hostname -s) Port=$port}" \
            "State=UNKNOWN" >>"$T/slurm.conf"
        mkdir -p "$T/spool-$name"
    done
    echo "PartitionName=weft Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$T/slurm.conf"
    : >"$T/plugstack.conf"
    mkdir -p "$T/state"
}

# wait_idle N: until sinfo shows N nodes, all idle.
wait_idle() {
    local n=$1 i p states=""
    for i in $(seq 1 $((UP_TIMEOUT * 2))); do
        states=$(timeout 10 "${CTL[@]}" sinfo -h -N -o "%N %T" 2>/dev/null || true)
        [ "$(grep -c " idle$" <<<"$states")" = "$n" ] && return 0
        for p in "${DAEMONS[@]}"; do
            kill -0 "$p" 2>/dev/null || { echo "slurm.sh: a daemon exited (pid $p)" >&2; break 2; }
        done
        sleep 0.5
    done
    echo "slurm.sh: the nodes did not go idle in ${UP_TIMEOUT} s; sinfo says: ${states:-nothing}" >&2
    tail -n 8 "$T"/*.log "$T"/*.out >&2 2>/dev/null || true
    return 1
}

# srun_launch ARGS...: sets LAUNCH, srun with a clean environment, only
# this run's slurm.conf and the rendezvous passed on (by name).  ROOTHOST:
# where rank 0 will run.
srun_launch() {
    free_port
    # shellcheck disable=SC2054  # the comma is srun's
    LAUNCH=("${CLEAN_ENV[@]}" "SLURM_CONF=$T/slurm.conf" "WEFT_ROOT=$ROOTHOST:$PORT"
            "WEFT_SECRET=$SECRET" "${CTL[@]}" srun --export=WEFT_ROOT,WEFT_SECRET "$@")
}

# sbatch_case NAME KIND: the batch script on stdin as an sbatch --wait
# job of $NP tasks; the case's log is the job's output.
sbatch_case() {
    local name=$1 kind=$2 job="$T/job-${1//\//-}"
    { echo "#!/bin/bash"; echo "set -e"; cat; } >"$job.sh"
    # shellcheck disable=SC2016  # expanded by that bash
    run_case "$name" "$kind" "$NP" "${CLEAN_ENV[@]}" "SLURM_CONF=$T/slurm.conf" \
        "WEFT_SECRET=$SECRET" bash -c 'rc=0; sbatch --wait --quiet -n "$1" -o "$2" "$3" || rc=$?
            cat "$2"; exit $rc' - "$NP" "$job.out" "$job.sh"
}

SECRET=$(new_secret)
make_text "$TOP/text.txt"

# --- one node: this host, as it is ----------------------------------------
T=$TOP/one
mkdir "$T"
CTL=()
export SLURM_CONF=$T/slurm.conf
HOST=$(hostname -s)
ROOTHOST=127.0.0.1
t0=$SECONDS
if munge_up && write_conf 127.0.0.1 "$HOST=127.0.0.1:$NP" &&
    start slurmctld slurmctld -D -i && start slurmd slurmd -D -N "$HOST" && wait_idle 1; then
    echo "slurm.sh: one node up in $((SECONDS - t0)) s"
    standard_cases slurm SLURM_PROCID 1 srun_launch -n "$NP"
    # The other PMI flavours Debian's srun offers set PMI_RANK/PMI_SIZE
    # (pmi2) or PMIX_RANK (pmix) beside SLURM_PROCID.
    for mpi in pmi2:PMI_RANK pmix:PMIX_RANK; do
        if [ "${mpi%:*}" = pmix ] && ! grep -q "libpmix\.so\.2 " <<<"$(ldconfig -p)"; then
            echo "launch: SKIP slurm/pmix: no libpmix.so.2 (Debian: libpmix2)"
            continue
        fi
        srun_launch -n "$NP" --mpi="${mpi%:*}"
        run_case "slurm/${mpi%:*}-env" "env:${mpi#*:}" "$NP" "${LAUNCH[@]}" /usr/bin/env
        srun_launch -n "$NP" --mpi="${mpi%:*}"
        # shellcheck disable=SC2086
        run_case "slurm/${mpi%:*}-all_reduce" perf:1 "$NP" "${LAUNCH[@]}" \
            "$BUILD/all_reduce_perf" $PERF_ARGS
    done
    # A batch job as users write one: rank 0's host is the allocation's
    # first node; its NodeAddr where the name does not resolve.
    free_port
    sbatch_case slurm/sbatch-all_reduce perf:1 <<EOF
host=\$(scontrol show hostnames "\$SLURM_JOB_NODELIST" | head -n 1)
getent hosts "\$host" >/dev/null ||
    host=\$(scontrol show node "\$host" | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p')
export WEFT_ROOT=\$host:$PORT
srun --export=WEFT_ROOT,WEFT_SECRET $BUILD/all_reduce_perf $PERF_ARGS
EOF
    # The same without srun: the script itself has SLURM_PROCID=0 and
    # SLURM_NTASKS=4; it must say so at once, not wait for 3 more ranks.
    free_port
    sbatch_case slurm/sbatch-no-srun nostep <<EOF
export WEFT_ROOT=127.0.0.1:$PORT
$BUILD/all_reduce_perf $PERF_ARGS
EOF
else
    echo "launch: FAIL slurm/up: Slurm did not come up on this host (logs in $LOGDIR)"
    FAILED=$((FAILED + 1))
fi
cluster_down

# --- two nodes ------------------------------------------------------------
# Each node a network and UTS namespace of its own (netns.sh): its own
# address, the same slurmd port, its own host name; slurmctld and srun
# sit in the control namespace.  Where namespaces cannot be made, two
# slurmd of their own ports on this host (slurmd -N; Debian builds it with
# multiple-slurmd support): two nodes to Slurm, one host to weft.

# Two nodes weftn0, weftn1 in namespaces; sets CTL and ROOTHOST.
two_up_netns() {
    in_ctl
    CTL=("${IN_CTL[@]}")
    ROOTHOST=$SUBNET.11
    net_up weftn0 weftn1 && munge_up &&
        write_conf "$SUBNET.1" "weftn0=$SUBNET.11:2" "weftn1=$SUBNET.12:2" &&
        start slurmctld "${CTL[@]}" slurmctld -D -i && node_slurmd weftn0 && node_slurmd weftn1
}

# node_slurmd NODE: NODE's slurmd, in its namespaces.
node_slurmd() {
    on_node "$1"
    start "slurmd-$1" "${ON_NODE[@]}" slurmd -D -N "$1"
}

# Two slurmd on this host's loopback, each on its own port.
two_up_ports() {
    CTL=()
    ROOTHOST=127.0.0.1
    free_port
    local p0=$PORT
    free_port
    munge_up && write_conf 127.0.0.1 "weftn0=127.0.0.1:2:$p0" "weftn1=127.0.0.1:2:$PORT" &&
        start slurmctld slurmctld -D -i &&
        start slurmd-weftn0 slurmd -D -N weftn0 && start slurmd-weftn1 slurmd -D -N weftn1
}

T=$TOP/two
mkdir "$T"
export SLURM_CONF=$T/slurm.conf
why=$(netns_why_not)
[ "${WEFT_LAUNCH_TWO:-}" != ports ] || why="WEFT_LAUNCH_TWO=ports"
if [ -z "$why" ]; then
    up=two_up_netns hosts=2 how="network namespaces"
else
    up=two_up_ports hosts=1 how="two slurmd on this host ($why)"
fi
t0=$SECONDS
if $up && wait_idle 2; then
    echo "slurm.sh: two nodes up in $((SECONDS - t0)) s: $how"
    # Ranks 0, 1 on weftn0 (where WEFT_ROOT points), 2, 3 on weftn1.
    standard_cases slurm2 SLURM_PROCID "$hosts" srun_launch -N 2 -n "$NP" -m block \
        -w weftn0,weftn1
else
    echo "launch: FAIL slurm2/up: the two-node Slurm did not come up: $how (logs in $LOGDIR)"
    FAILED=$((FAILED + 1))
fi
cluster_down
launch_summary
