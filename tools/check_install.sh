#!/usr/bin/env bash
# Installs the build into a scratch prefix and checks what a user of it
# gets: the libraries and headers are where the README says, libnccl.so.2
# exports only nccl*/pnccl* symbols, and a binary linked against NVIDIA's
# libnccl.so.2 loads weft's with LD_LIBRARY_PATH=<prefix>/lib.
set -euo pipefail
cd "$(dirname "$0")/../build"
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT
make -s install DESTDIR="$dest" >/dev/null 2>&1 || make install DESTDIR="$dest"
prefix="$dest$(sed -n 's/^prefix = //p' Makefile)"
for f in lib/libweft.so lib/libweft_nccl.so lib/libnccl.so.2 include/weft.h include/weft/nccl.h \
         lib/pkgconfig/weft.pc bin/weftrun bin/all_reduce_perf; do
    [ -e "$prefix/$f" ] || { echo "check_install: $f is not installed" >&2; exit 1; }
done
soname=$(objdump -p "$prefix/lib/libnccl.so.2" | awk '/SONAME/ {print $2}')
[ "$soname" = libnccl.so.2 ] || { echo "check_install: soname is '$soname'" >&2; exit 1; }
other=$(nm -D --defined-only "$prefix/lib/libnccl.so.2" | awk '{print $3}' | grep -Ev '^p?nccl[A-Z]' || true)
[ -z "$other" ] || { echo "check_install: libnccl.so.2 also exports: $other" >&2; exit 1; }
n=$(nm -D --defined-only "$prefix/lib/libnccl.so.2" | grep -c ' [TW] p\?nccl')
echo "check_install: $prefix/lib/libnccl.so.2 exports $n nccl*/pnccl* functions and nothing else"
if [ -x ./nccl_prog_nvlib ]; then
    got=$(env LD_LIBRARY_PATH="$prefix/lib" ./nccl_prog_nvlib --which)
    case "$got" in
    "$prefix"/lib/*) echo "check_install: an NVIDIA-linked binary loads $got" ;;
    *) echo "check_install: with LD_LIBRARY_PATH=$prefix/lib it loaded $got" >&2; exit 1 ;;
    esac
    env LD_LIBRARY_PATH="$prefix/lib" WEFT_SOCKET_IFNAME=lo timeout 120 \
        "$prefix/bin/weftrun" -n 2 ./nccl_prog_nvlib --expect-lib "$prefix/lib/"
fi
