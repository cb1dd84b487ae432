#!/usr/bin/env bash
# The main job on this one machine: build, then a 4-rank AllReduce sweep over
# TCP loopback with nccl-tests columns (#wrong must be 0 everywhere).
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/build.sh
./build/weftrun -n 4 --no-prefix ./build/all_reduce_perf -b 4 -e 64M -f 4 -d float -o sum -c 1
