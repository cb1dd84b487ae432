# shellcheck shell=bash disable=SC2034  # the variables are for the callers
# common.sh - what the launcher tests share: the build's binaries, free
# ports, the training text, one timed case (launch, log, check, one
# PASS/FAIL line) and the cases every launcher runs.  Sourced by
# mpirun.sh and slurm.sh; not run alone.

LAUNCH_TOP=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
BUILD=${WEFT_BUILD:-$LAUNCH_TOP/build}
NP=4  # ranks a launch starts
PERF_TOOLS="all_reduce all_gather reduce_scatter broadcast sendrecv"
# Small sizes, every result checked: this is about the launch, not speed.
PERF_ARGS="-b 8 -e 64K -f 8 -n 2 -w 1 -c 1"
TRAIN_STEPS=3
TRAIN_ARGS="--sample 0 --layers 2 --channels 32 --heads 4 --context 32 --batch 4
    --steps $TRAIN_STEPS --warmup 1 --lr 3e-3 --val-batches 2 --zero 1"
CASE_TIMEOUT=${WEFT_LAUNCH_TIMEOUT:-60}  # seconds a launch may take
# What a launcher starts from: none of the caller's WEFT_* settings, so a
# rank's rank and size can only come from the launcher itself.
PATH_CLEAN=/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin
CLEAN_ENV=(env -i "PATH=$PATH_CLEAN" "HOME=${HOME:-/root}" "TMPDIR=${TMPDIR:-/tmp}")
FAILED=0
PASSED=0
USED_PORTS=" "

launch_die() {
    echo "$(basename "$0"): $*" >&2
    exit 2
}

launch_need_build() {
    local t
    for t in $PERF_TOOLS; do
        [ -x "$BUILD/${t}_perf" ] || launch_die "no $BUILD/${t}_perf: build first (tools/build.sh)"
    done
    [ -x "$BUILD/weft-train" ] || launch_die "no $BUILD/weft-train: build first (tools/build.sh)"
}

# A TCP port nobody on this machine holds in any state (so no TIME_WAIT
# either) and that this run has not handed out yet, in PORT (not echoed:
# a $(...) subshell would forget what was handed out).
free_port() {
    local p _
    for _ in $(seq 1 200); do
        p=$((20000 + RANDOM % 20000))
        case "$USED_PORTS" in *" $p "*) continue ;; esac
        # The local address column; a busy machine has tens of thousands
        # of lines here, so one grep per candidate, not a parse.
        grep -qE "^ *[0-9]+: [0-9A-F]+:$(printf '%04X' "$p") " /proc/net/tcp /proc/net/tcp6 \
            2>/dev/null && continue
        USED_PORTS="$USED_PORTS$p "
        PORT=$p
        return 0
    done
    launch_die "no free TCP port found"
}

new_secret() {
    od -An -tx1 -N16 /dev/urandom | tr -d ' \n'
}

# The text the trainer learns from, in TEXT: every Debian machine has it.
make_text() {
    TEXT=$1
    cat /usr/share/common-licenses/* >"$TEXT" || launch_die "cannot write $TEXT"
}

# case_check KIND N LOG RC: does the output of a case of this kind with N
# ranks say it worked?  Prints why not.
case_check() {
    local kind=$1 n=$2 log=$3 rc=$4 r
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        echo "timed out after ${CASE_TIMEOUT} s"
        return 1
    fi
    # Every launch passes a secret: a launcher that lost it on the way runs
    # the job unauthenticated, and weft says so.
    if grep -q "without WEFT_SECRET" "$log"; then
        echo "a rank ran without WEFT_SECRET"
        return 1
    fi
    case "$kind" in
    perf | perf:*)
        [ "$rc" = 0 ] || { echo "exit status $rc"; return 1; }
        grep -q "^# Out of bounds values : 0 OK" "$log" || { echo "no '0 OK' line"; return 1; }
        grep -q "^# Collective test concluded" "$log" || { echo "not concluded"; return 1; }
        # Every rank 0..N-1 is listed once: no two ranks took one number.
        for r in $(seq 0 $((n - 1))); do
            [ "$(grep -cE "^# +Rank +$r +Pid" "$log")" = 1 ] ||
                { echo "rank $r is not listed exactly once"; return 1; }
        done
        [ "$(grep -cE "^# +Rank +[0-9]+ +Pid" "$log")" = "$n" ] ||
            { echo "not $n ranks listed"; return 1; }
        # perf:H: the ranks ran on H distinct hosts.
        if [ "$kind" != perf ]; then
            local hosts
            hosts=$(grep -E "^# +Rank +[0-9]+ +Pid" "$log" | awk '{ print $NF }' | sort -u | wc -l)
            [ "$hosts" = "${kind#perf:}" ] ||
                { echo "the ranks ran on $hosts host(s), not ${kind#perf:}"; return 1; }
        fi
        ;;
    train)
        [ "$rc" = 0 ] || { echo "exit status $rc"; return 1; }
        grep -Eq ", $n rank\(s\)[,:]" "$log" || { echo "the trainer did not see $n ranks"; return 1; }
        grep -qE "^step +$TRAIN_STEPS/$TRAIN_STEPS " "$log" || { echo "no last step"; return 1; }
        grep -q "^validation loss" "$log" || { echo "no validation loss"; return 1; }
        ;;
    norendezvous)
        # Without WEFT_ROOT the ranks stop at init with the reason (the
        # launcher may kill the others before they say it too).
        [ "$rc" != 0 ] || { echo "exit status 0 without a rendezvous"; return 1; }
        grep -q "no rendezvous in the environment" "$log" ||
            { echo "no rank said 'no rendezvous in the environment'"; return 1; }
        ;;
    nostep)
        # A Slurm batch script is not a rank: init refuses it at once.
        [ "$rc" != 0 ] || { echo "exit status 0 outside a step"; return 1; }
        grep -q "not a step's (no SLURM_STEP_ID).*start one process per rank with srun" "$log" ||
            { echo "no 'start one process per rank with srun'"; return 1; }
        ;;
    env:*)
        # `env` under the launcher: each rank's only WEFT_* variables are
        # the two passed, and the launcher's rank variable numbers the
        # ranks 0..N-1 once each.
        local var=${kind#env:} extra
        [ "$rc" = 0 ] || { echo "exit status $rc"; return 1; }
        extra=$(grep "^WEFT_" "$log" | grep -vE "^WEFT_(ROOT|SECRET)=" | sort -u | head -n 3)
        [ -z "$extra" ] || { echo "a rank saw" "$extra"; return 1; }
        [ "$(grep -c "^WEFT_ROOT=" "$log")" = "$n" ] || { echo "not $n WEFT_ROOT"; return 1; }
        [ "$(grep -c "^WEFT_SECRET=" "$log")" = "$n" ] || { echo "not $n WEFT_SECRET"; return 1; }
        [ "$(grep "^$var=" "$log" | sort)" = "$(seq 0 $((n - 1)) | sed "s/^/$var=/")" ] ||
            { echo "$var is not 0..$((n - 1)) once each"; return 1; }
        ;;
    *)
        echo "unknown case kind $kind"
        return 1
        ;;
    esac
}

# run_case NAME KIND N CMD...: runs CMD under the case timeout with its
# output in $LOGDIR/NAME.log, checks it, and prints one line.
run_case() {
    local name=$1 kind=$2 n=$3 log why rc=0 t0 t1
    shift 3
    log="$LOGDIR/${name//\//-}.log"
    t0=$EPOCHREALTIME
    timeout -k 5 "$CASE_TIMEOUT" "$@" >"$log" 2>&1 </dev/null || rc=$?
    t1=$EPOCHREALTIME
    local secs
    secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    if why=$(case_check "$kind" "$n" "$log" "$rc"); then
        printf 'launch: PASS %-28s %6s s\n' "$name" "$secs"
        PASSED=$((PASSED + 1))
    else
        printf 'launch: FAIL %-28s %6s s  %s (log %s)\n' "$name" "$secs" "$why" "$log"
        tail -n 15 "$log" | sed 's/^/    | /'
        FAILED=$((FAILED + 1))
    fi
}

# standard_cases PREFIX RANKVAR HOSTS FN ARGS...: `env`, every perf tool
# and the trainer, each under the launch command FN ARGS... leaves in
# LAUNCH (a fresh port each time).  RANKVAR: the variable the launcher
# numbers ranks with; HOSTS: how many hosts the ranks must report.
standard_cases() {
    local prefix=$1 var=$2 hosts=$3 t
    shift 3
    "$@"
    run_case "$prefix/env" "env:$var" "$NP" "${LAUNCH[@]}" /usr/bin/env
    for t in $PERF_TOOLS; do
        "$@"
        # shellcheck disable=SC2086  # PERF_ARGS is a list of words
        run_case "$prefix/$t" "perf:$hosts" "$NP" "${LAUNCH[@]}" "$BUILD/${t}_perf" $PERF_ARGS
    done
    "$@"
    # shellcheck disable=SC2086  # TRAIN_ARGS too
    run_case "$prefix/train" train "$NP" "${LAUNCH[@]}" "$BUILD/weft-train" --data "$TEXT" \
        $TRAIN_ARGS
}

launch_summary() {
    echo "$(basename "$0"): $PASSED passed, $FAILED failed; logs in $LOGDIR"
    [ "$FAILED" = 0 ]
}
