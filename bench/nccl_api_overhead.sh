#!/usr/bin/env bash
# What weft's NCCL layer costs: AllReduce (float, sum) timed through the NCCL
# API (nccl_allreduce_perf, linked to libweft_nccl) and through weft's own
# API (all_reduce_perf), interleaved, RUNS times each; prints the median
# time per size of each and the ratio NCCL-API / weft-API.
#   bench/nccl_api_overhead.sh [ranks...]     (default: 2 4; RUNS=3)
set -euo pipefail
cd "$(dirname "$0")/../build"
RUNS=${RUNS:-3}
SIZES="8 2097152 33554432"
export WEFT_SOCKET_IFNAME=lo
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for n in "${@:-2 4}"; do
    for r in $(seq "$RUNS"); do
        ./weftrun -n "$n" ./all_reduce_perf -b 8 -e 32M -f 4 -n 20 -w 5 -c 0 |
            awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {print $2, $7}' >"$tmp/weft.$n.$r"
        ./weftrun -n "$n" ./nccl_allreduce_perf -b 8 -e 32M -f 4 -n 20 -w 5 |
            awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ {print $2, $3}' >"$tmp/nccl.$n.$r"
    done
done
median() { sort -g | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
printf '%6s %10s %14s %14s %8s\n' ranks bytes "weft API us" "NCCL API us" ratio
for n in "${@:-2 4}"; do
    for s in $SIZES; do
        w=$(cat "$tmp"/weft."$n".* | awk -v s="$s" '$1 == s {print $2}' | median)
        c=$(cat "$tmp"/nccl."$n".* | awk -v s="$s" '$1 == s {print $2}' | median)
        printf '%6d %10d %14.1f %14.1f %8.3f\n' "$n" "$s" "$w" "$c" "$(awk -v a="$c" -v b="$w" 'BEGIN {print a / b}')"
    done
done
