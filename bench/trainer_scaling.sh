#!/usr/bin/env bash
# Where distributed training pays here: tokens/s of weft-train serially and
# in data-, tensor- and pipeline-parallel layouts and their 3D mixes, with
# the split of each step into compute, waiting on communication and
# pipeline bubble, the bubble beside (p-1)/(m+p-1), and the speed-up over
# the serial run.  Same model, same global batch (8 micro-batches of B x T
# per step) in every row.
#   [MODEL="--layers 4 ..."] [ROWS="serial tp2 ..."] bench/trainer_scaling.sh [data-file] [steps]
set -euo pipefail
cd "$(dirname "$0")/../build"
data=${1:-kjv.txt}
steps=${2:-30}
model=${MODEL:-"--layers 4 --channels 128 --heads 4 --context 64 --batch 8"}
model="$model --warmup 5 --sample 0 --val-batches 4"
export WEFT_SOCKET_IFNAME=lo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
serial=""
row() { # label ranks args...
    local label=$1 n=$2
    shift 2
    local launch=()
    [ "$n" = 1 ] || launch=(./weftrun --no-prefix -n "$n")
    "${launch[@]}" ./weft-train --data "$data" $model --steps "$steps" "$@" --log "$tmp/l.csv" >"$tmp/out"
    # Mean over the steps after the first five (page faults, warm-up).
    local line
    line=$(awk -F, 'NR > 2 && $1 > 5 {t += $5; c += $6; w += $7; b += $8; k++}
        END {printf "%.0f %.1f %.1f %.1f", t / k, c / k, w / k, b / k}' "$tmp/l.csv")
    set -- $line
    [ -n "$serial" ] || serial=$1
    # The summary line: bubble measured, (p-1)/(m+p-1), and the schedule's
    # prediction from the stages' own compute times.
    local bub
    bub=$(sed -n 's/.*bubble \([0-9.]*\)% measured, \([0-9.]*\)% by.*, \([0-9.]*\)% from.*/\1 \2 \3/p' "$tmp/out")
    set -- $line $bub
    printf "%-26s %9s %11s %11s %10s %8.0f%% %7.2fx %8s%% %8s%% %8s%%\n" "$label" "$1" "$2" "$3" \
        "$4" "$(echo "100 * ($3 + $4) / ($2 + $3 + $4)" | bc -l)" "$(echo "$1 / $serial" | bc -l)" \
        "$5" "$6" "$7"
}
printf '%-26s %9s %11s %11s %10s %9s %8s %9s %9s %9s\n' "run" "tokens/s" "compute ms" "comm ms" \
    "bubble ms" "waiting" "speed-up" "bubble" "formula" "stages"
want=${ROWS:-all}
has() { [ "$want" = all ] || [[ " $want " == *" $1 "* ]]; }
has serial && row "serial (accum 8)" 1 --accum 8
for n in 2 4; do
    for z in 0 1 2 3; do
        has "dp$n-z$z" && row "dp $n ZeRO-$z" "$n" --accum $((8 / n)) --zero "$z"
    done
done
for t in 2 4; do
    has "tp$t" && row "tp $t" "$t" --tp "$t" --accum 8
done
for p in 2 4; do
    for s in gpipe 1f1b; do
        has "pp$p-$s" && row "pp $p $s" "$p" --pp "$p" --schedule "$s" --accum 8
    done
done
has dp2tp2 && row "dp 2 x tp 2, ZeRO-1" 4 --dp 2 --tp 2 --zero 1 --accum 4
has dp2pp2 && row "dp 2 x pp 2 1f1b, ZeRO-1" 4 --dp 2 --pp 2 --zero 1 --accum 4
has tp2pp2 && row "tp 2 x pp 2 1f1b" 4 --tp 2 --pp 2 --accum 8
has 3d && row "dp2 x tp2 x pp2, ZeRO-1" 8 --dp 2 --tp 2 --pp 2 --zero 1 --accum 4
true
