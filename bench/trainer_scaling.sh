#!/usr/bin/env bash
# Where distributed training pays here: tokens/s of weft-train serially and
# with 2 and 4 data-parallel ranks under ZeRO 0-3, with the split of each
# step into compute and waiting on communication.  Same model, same global
# batch (4 micro-batches of B x T per step) in every row.
#   [MODEL="--layers 2 ..."] bench/trainer_scaling.sh [data-file] [steps]
set -euo pipefail
cd "$(dirname "$0")/../build"
data=${1:-kjv.txt}
steps=${2:-40}
model=${MODEL:-"--layers 4 --channels 128 --heads 4 --context 64 --batch 8"}
model="$model --warmup 5 --sample 0 --val-batches 4"
export WEFT_SOCKET_IFNAME=lo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
row() { # label ranks args...
    local label=$1 n=$2
    shift 2
    if [ "$n" = 1 ]; then
        ./weft-train --data "$data" $model --steps "$steps" "$@" --log "$tmp/l.csv" >/dev/null
    else
        ./weftrun -n "$n" ./weft-train --data "$data" $model --steps "$steps" "$@" --log "$tmp/l.csv" >/dev/null
    fi
    # Mean over the steps after the first five (page faults, warm-up).
    awk -F, -v label="$label" 'NR > 2 && $1 > 5 {t += $5; c += $6; w += $7; k++}
        END {printf "%-22s %9.0f %12.1f %12.1f %8.0f%%\n", label, t / k, c / k, w / k, 100 * w / (c + w)}' "$tmp/l.csv"
}
printf '%-22s %9s %12s %12s %9s\n' "run" "tokens/s" "compute ms" "comm wait ms" "waiting"
row "serial (accum 4)" 1 --accum 4
for n in 2 4; do
    for z in 0 1 2 3; do
        row "dp $n ZeRO-$z" "$n" --accum $((4 / n)) --zero "$z"
    done
done
