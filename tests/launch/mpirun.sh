#!/usr/bin/env bash
# mpirun.sh - weft started by real MPI launchers on this machine: Debian's
# Open MPI mpirun (OMPI_COMM_WORLD_*) and MPICH's mpiexec (PMI_RANK,
# PMI_SIZE) run the perf tools with checking on and the trainer, 4 ranks.
# Each rank sees only the launcher's environment plus WEFT_ROOT and
# WEFT_SECRET.  Exit 77: neither launcher is installed.
#
#   tests/launch/mpirun.sh [LOGDIR]       (default build/launch/mpirun)
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=common.sh
. "$(dirname "$0")/common.sh"
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
trap 'rm -rf "$WORK"' EXIT
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
launch_summary
