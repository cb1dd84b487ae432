#!/bin/bash
# tests/torch/run.sh [BUILD_DIR] - builds the "weft" torch.distributed
# backend (python/) against weft's build tree (default ./build) and runs
# its tests: the collective sweep on 4 ranks and on 1, DDP against Gloo,
# the failures.  Exit 77 (skip) without Debian's python3-torch.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=$(cd "${1:-build}" 2>/dev/null && pwd) || { echo "torch tests: no build dir ${1:-build}" >&2; exit 2; }
py=/usr/bin/python3 # the system Python, which has Debian's torch
if ! [ -x $py ] || ! $py -c 'import torch.distributed as d; assert d.is_available()' 2>/dev/null; then
    echo "torch tests: skipped, $py has no torch.distributed (apt-get install python3-torch)"
    exit 77
fi
inc=$($py -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "include"))')
if ! [ -f "$inc/torch/extension.h" ] || ! [ -f /usr/include/pybind11/pybind11.h ]; then
    echo "torch tests: torch's C++ headers or pybind11 are missing:" \
        "apt-get install libtorch-dev pybind11-dev python3-dev g++" >&2
    exit 2
fi
make -s -C python WEFT_BUILD="$build"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
# torchrun's own banner and the OMP_NUM_THREADS notice are noise here.
torchrun() {
    n=$1
    shift
    timeout -k 5 120 $py -m torch_weft.torchrun --standalone --nproc_per_node "$n" "$@" 2>&1 |
        { grep -v -e '^\*\*\*' -e 'OMP_NUM_THREADS' -e '^WARNING:torch.distributed.run' || true; }
}
step() {
    echo "== $*"
    start=$(date +%s)
    "$@" || { echo "torch tests: FAILED: $*"; exit 1; }
    echo "   ($(($(date +%s) - start)) s)"
}
step torchrun 4 tests/torch/sweep.py
step torchrun 1 tests/torch/sweep.py
# 2 ranks: Gloo's sum of two is one addition, so the bits must agree;
# 4 ranks: Gloo's ring groups the additions per chunk (ddp.py says how).
export WEFT_DETERMINISTIC=1
step torchrun 2 tests/torch/ddp.py --bitwise
step torchrun 4 tests/torch/ddp.py --rtol 1e-6
unset WEFT_DETERMINISTIC
step timeout -k 5 120 $py tests/torch/errors.py -n 3
echo "torch tests: all passed"
