#!/usr/bin/env bash
# The main job on this one machine: build (installing what is missing), a
# tuning run (weft-tune) for 4 ranks, a 4-rank AllReduce sweep with nccl-tests columns (#wrong
# must be 0 everywhere), then about a minute of training a small GPT on the
# King James Bible with 4 ranks and ZeRO-3, printing the falling loss, the
# validation loss beside the text's byte-unigram entropy, and a sample.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/build.sh
if ! command -v bible >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "installing: bible-kjv (the demo's training text)"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends bible-kjv >/dev/null
fi
# Time every plan on this machine once (about 20 s) and keep the fastest per
# collective and size: the runs below take their plans from the first call.
tune=$PWD/build/weft-tune.txt
[ -s "$tune" ] || ./build/weftrun -n 4 -q ./build/weft-tune -e 16M -o "$tune"
export WEFT_TUNE_FILE=$tune
./build/weftrun -n 4 --no-prefix ./build/all_reduce_perf -b 4 -e 16M -f 4 -d float -o sum -c 1
# One verse per line, without the references (about 4 MB).
[ -s build/kjv.txt ] || bible -f gen1:1-rev22:21 | sed 's/^[^ ]* //' >build/kjv.txt
./build/weftrun -n 4 --no-prefix ./build/weft-train --data build/kjv.txt \
    --layers 4 --channels 128 --heads 4 --context 64 --batch 8 --zero 3 \
    --steps 250 --warmup 20 --lr 2e-3 --eval-every 50 \
    --log build/demo-zero3.csv --label "4 ranks, ZeRO-3" --prompt "And God said"
./build/weft-plot -o build/demo-loss.svg --title "weft-train on the KJV Bible" build/demo-zero3.csv
echo "loss curve: build/demo-loss.svg"
