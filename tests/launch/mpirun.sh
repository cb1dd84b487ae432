#!/usr/bin/env bash
# mpirun.sh - weft started by real MPI launchers on this machine: Debian's
# Open MPI mpirun (OMPI_COMM_WORLD_*) and MPICH's mpiexec (PMI_RANK,
# PMI_SIZE) run the perf tools with checking on and the trainer, 4 ranks.
# Each rank sees only the launcher's environment plus WEFT_ROOT and
# WEFT_SECRET.  First on this host; then (as root) on two posed nodes
# (netns.sh), reached through an agent that stands in for ssh, so the
# rendezvous must travel by the launcher's own forwarding.  Exit 77:
# neither launcher is installed.
#
#   tests/launch/mpirun.sh [LOGDIR]       (default build/launch/mpirun)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
# shellcheck source-path=SCRIPTDIR source=netns.sh
. "$(dirname "$0")/netns.sh"
LOGDIR=${1:-$BUILD/launch/mpirun}

OMPI=$(command -v mpirun.openmpi || true)
MPICH=$(command -v mpiexec.mpich || true)
if [ -z "$OMPI" ] && [ -z "$MPICH" ]; then
    echo "mpirun.sh: SKIPPED: neither mpirun.openmpi nor mpiexec.mpich (Debian: openmpi-bin, mpich)"
    exit 77
fi
launch_need_build
mkdir -p "$LOGDIR"
WORK=$(mktemp -d /tmp/weft-mpirun.XXXXXX)
cleanup() {
    local rc=$?
    netns_down
    rm -rf "$WORK"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
make_text "$WORK/text.txt"
SECRET=$(new_secret)

# Open MPI starts local ranks with mpirun's own environment, which
# CLEAN_ENV has emptied; -x adds the rendezvous.  As root it wants
# --allow-run-as-root; --oversubscribe: 4 ranks on fewer cores.  Sets
# LAUNCH, the command line up to the program, with a fresh port.
ompi() {
    free_port
    LAUNCH=("${CLEAN_ENV[@]}" "$OMPI" --allow-run-as-root --oversubscribe -np "$NP"
            -x "WEFT_ROOT=127.0.0.1:$PORT" -x "WEFT_SECRET=$SECRET")
}

# MPICH's hydra: -genvnone forwards none of mpiexec's (already clean)
# environment, -genv adds the rendezvous.
mpich() {
    free_port
    LAUNCH=("${CLEAN_ENV[@]}" "$MPICH" -n "$NP" -genvnone
            -genv WEFT_ROOT "127.0.0.1:$PORT" -genv WEFT_SECRET "$SECRET")
}

# --- one host ---------------------------------------------------------------
if [ -n "$OMPI" ]; then
    standard_cases openmpi OMPI_COMM_WORLD_RANK 1 ompi
    # No -x WEFT_ROOT: the ranks must fail at init with the reason, and
    # mpirun must come back rather than hang.
    run_case openmpi/no-rendezvous norendezvous "$NP" "${CLEAN_ENV[@]}" "$OMPI" \
        --allow-run-as-root --oversubscribe -np "$NP" "$BUILD/all_reduce_perf" -b 8 -e 8
else
    echo "launch: SKIP openmpi: no mpirun.openmpi (Debian: openmpi-bin)"
fi
if [ -n "$MPICH" ]; then
    standard_cases mpich PMI_RANK 1 mpich
else
    echo "launch: SKIP mpich: no mpiexec.mpich (Debian: mpich)"
fi

# --- two posed nodes ----------------------------------------------------------
# The launcher runs in the control namespace and starts its daemons (orted,
# hydra_pmi_proxy) on weftn0 and weftn1 through $AGENT, called as ssh
# would be: [options] HOST COMMAND...; the daemon starts with a clean
# environment, as a remote login would.  Ranks 0, 1 on weftn0, where
# WEFT_ROOT points; 2, 3 on weftn1.

write_agent() {
    AGENT=$WORK/agent.sh
    cat >"$AGENT" <<EOF
#!/bin/sh
# Stands in for ssh: runs the command line on a posed node.
while [ "\${1#-}" != "\$1" ]; do shift; done
host=\$1
shift
exec env -i PATH="$PATH_CLEAN" HOME="\$HOME" nsenter --net="/run/netns/$NS_PREFIX\$host" \\
    unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
EOF
    chmod 755 "$AGENT"
}

# The rendezvous rides in the launcher's environment and is forwarded by
# name, as docs/launchers.md says to.
ompi2() {
    free_port
    # shellcheck disable=SC2054  # the commas are mpirun's
    LAUNCH=("${CLEAN_ENV[@]}" "WEFT_ROOT=$SUBNET.11:$PORT" "WEFT_SECRET=$SECRET" "${IN_CTL[@]}"
            "$OMPI" --allow-run-as-root --oversubscribe -np "$NP" -H weftn0:2,weftn1:2
            --mca plm_rsh_agent "$AGENT" -x WEFT_ROOT -x WEFT_SECRET)
}

# -localhost: hydra's proxies must call back to the control namespace's
# address, not to this host's name.  Hydra forwards its whole (clean)
# environment by default; not -genvlist WEFT_ROOT,WEFT_SECRET: MPICH
# 4.0.2's drops whichever listed variable comes last in its environment,
# and the job would run unauthenticated.
mpich2() {
    free_port
    # shellcheck disable=SC2054  # the comma is mpiexec's
    LAUNCH=("${CLEAN_ENV[@]}" "WEFT_ROOT=$SUBNET.11:$PORT" "WEFT_SECRET=$SECRET" "${IN_CTL[@]}"
            "$MPICH" -launcher ssh -launcher-exec "$AGENT" -localhost "$SUBNET.1"
            -hosts weftn0:2,weftn1:2 -n "$NP")
}

why=$(netns_why_not)
if [ -n "$why" ]; then
    echo "launch: SKIP openmpi2, mpich2: no posed nodes: $why"
elif net_up weftn0 weftn1; then
    in_ctl
    write_agent
    [ -z "$OMPI" ] || standard_cases openmpi2 OMPI_COMM_WORLD_RANK 2 ompi2
    [ -z "$MPICH" ] || standard_cases mpich2 PMI_RANK 2 mpich2
    netns_down
else
    echo "launch: FAIL mpirun2/up: could not pose the two nodes"
    FAILED=$((FAILED + 1))
fi
launch_summary
