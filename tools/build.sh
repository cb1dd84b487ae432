#!/usr/bin/env bash
# Installs what is missing (Debian), then configures and builds weft in
# ./build.  Used by tools/demo.sh, tools/test.sh and CI.  --werror makes
# compiler warnings errors.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
for pkg in build-essential autoconf automake libtool pkg-config libcriterion-dev \
           libhwloc-dev libibverbs-dev librdmacm-dev; do
    dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "installing: ${need[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
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
