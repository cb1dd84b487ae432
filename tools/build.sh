#!/usr/bin/env bash
# Installs what is missing (Debian), then configures and builds weft in
# ./build.  Used by tools/demo.sh, tools/test.sh and CI.  --werror makes
# compiler warnings errors.
set -euo pipefail
cd "$(dirname "$0")/.."
. tools/apt_need.sh
apt_need build-essential autoconf automake libtool pkg-config libcriterion-dev \
    libhwloc-dev libibverbs-dev librdmacm-dev
conf=()
[ "${1:-}" = --werror ] && conf+=(--enable-werror)
[ -x configure ] && [ configure -nt configure.ac ] || autoreconf -fi >/dev/null
mkdir -p build
cd build
if [ ! -f Makefile ] || [ ../configure -nt Makefile ] || [ "${#conf[@]}" -gt 0 ]; then
    ../configure "${conf[@]}" >/dev/null
fi
make -j"$(nproc)" >/dev/null
make -j"$(nproc)" check TESTS= >/dev/null
