#!/usr/bin/env bash
# The soak test: 4 ranks of build/weft-soak, ITERS random collectives each
# (default 10000), every result checked, and no growth of fds, RSS or
# weft's /dev/shm files after the warm-up.  Runs once per transport (the
# default, which is shm for ranks on one host, then WEFT_TRANSPORT=tcp) and
# per algorithm setting (WEFT_ALGO unset: selection picks per call; then
# each family alone: ring, tree, rhd, direct, hier), each stopped after
# 600 s.
#   tools/soak.sh [ITERS]         SOAK_ALGOS="" tools/soak.sh: the default only
# Extra weft-soak options go in SOAK_ARGS (e.g. SOAK_ARGS="--seed 7").
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-10000}
algos=${SOAK_ALGOS-default ring tree rhd direct hier}
[ -x build/weft-soak ] && [ -x build/weftrun ] || ./tools/build.sh
# Rebuild what changed (quietly); a fresh tree was just built above.
make -C build -j2 weft-soak weftrun >/dev/null
export WEFT_SOCKET_IFNAME=lo
fail=0
for transport in default tcp; do
    for algo in ${algos:-default}; do
        env=()
        [ "$transport" = default ] || env+=(--env "WEFT_TRANSPORT=$transport")
        [ "$algo" = default ] || env+=(--env "WEFT_ALGO=$algo")
        echo "== weft-soak: 4 ranks, $iters ops, transport $transport, algorithm $algo"
        t0=$(date +%s)
        # shellcheck disable=SC2086
        if ./build/weftrun -n 4 --timeout 600 "${env[@]}" ./build/weft-soak --iters "$iters" \
                ${SOAK_ARGS:-}; then
            echo "== passed in $(($(date +%s) - t0)) s"
        else
            echo "== FAILED (exit status $?) after $(($(date +%s) - t0)) s: transport $transport, algorithm $algo"
            fail=1
        fi
    done
done
exit $fail
