#!/usr/bin/env bash
# run.sh - weft under real launchers, from the build in ./build: Open MPI's
# mpirun and MPICH's mpiexec (mpirun.sh), a real Slurm on this machine
# (slurm.sh, as root), each also on two posed nodes.  Each case prints one
# PASS/FAIL line with its time; then one line per script.  Exit 0: all
# passed (a script may be skipped); 77: every script was skipped (no
# launcher installed); 1: a case failed.
# Used by CI; 30-35 s on this 2-core machine at load 16-24.
#
#   tests/launch/run.sh [LOGDIR]        (default build/launch)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/../../build/launch}
mkdir -p "$out"
t0=$SECONDS
failed=0 ran=0 summary=()
for s in mpirun slurm; do
    t=$SECONDS
    rc=0
    "$here/$s.sh" "$out/$s" || rc=$?
    case $rc in
    0) st=PASS ran=$((ran + 1)) ;;
    77) st=SKIP ;;
    *) st="FAIL (exit $rc)" failed=1 ran=$((ran + 1)) ;;
    esac
    summary+=("$(printf 'launch: %-7s %-6s %4d s' "$s.sh" "$st" $((SECONDS - t)))")
done
printf '%s\n' "${summary[@]}"
echo "run.sh: $((SECONDS - t0)) s, logs in $out"
[ "$failed" = 0 ] || exit 1
[ "$ran" -gt 0 ] || exit 77
