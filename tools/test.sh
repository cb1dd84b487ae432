#!/usr/bin/env bash
# The whole test suite: build (installing what is missing), then make check.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/build.sh "$@"
cd build
if ! make -j1 check; then
    tail -n 200 test_*.log 2>/dev/null
    exit 1
fi
