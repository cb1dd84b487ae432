#!/usr/bin/env bash
# Soft-RoCE guests: builds (once, cached by a hash of what goes in) a Debian
# 12 root image whose kernel has rdma_rxe, boots one or two guests under
# software emulation with this repository shared at its own path, runs
# tests/rxe/inside.sh there and powers off.  Used by tests/rxe/run.sh (CI)
# and by hand; docs/verbs.md says how.
set -euo pipefail

usage() {
    cat <<'USAGE'
usage: tests/rxe/guest.sh image
       tests/rxe/guest.sh run [--guests 1|2] [--timeout S] [--out DIR] -- CMD [ARGS...]
  image   build the root image if the cache lacks it (debootstrap: 2-4 min)
  run     boot the guests; each runs CMD from this repository (at this same
          path) under tests/rxe/inside.sh, which sets up the network and the
          rxe devices first.  1 guest: two rxe devices on a veth pair
          (ranks pose as two hosts); 2 guests: one rxe device each, on a
          virtual wire between them.  CMD's output: DIR/guest<i>.log,
          its exit status: DIR/guest<i>.rc; run exits with the first
          nonzero one (124 when a guest did not finish in S seconds).
          Exit 3: the image could not be built (debootstrap failed).
environment:
  WEFT_RXE_CACHE   image cache (default ${XDG_CACHE_HOME:-~/.cache}/weft/rxe)
  WEFT_RXE_MIRROR  Debian mirror for debootstrap (default http://deb.debian.org/debian)
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
cache=${WEFT_RXE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/weft/rxe}
mirror=${WEFT_RXE_MIRROR:-http://deb.debian.org/debian}
# The kernel with rdma_rxe, the real rdma-core userland and perftest, and the
# runtime libraries weft's host-built binaries load.
packages=(linux-image-amd64 kmod iproute2 procps rdma-core ibverbs-providers
          ibverbs-utils rdmacm-utils perftest libibverbs1 librdmacm1 libhwloc15
          libcriterion3)

# The image's own init: mounts, loads modules, mounts the shares and hands
# over to the repository's inside.sh; everything else lives in the share so
# that changing it does not rebuild the image.
init_script() {
    cat <<'INIT'
#!/bin/sh
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
for d in /dev/shm /tmp /run; do mount -t tmpfs tmpfs "$d"; done
for m in 9pnet_virtio 9p virtio_net rdma_rxe; do modprobe "$m"; done
src= ; guest=0
for a in $(cat /proc/cmdline); do
    case "$a" in
    weft.src=*) src=${a#weft.src=} ;;
    weft.guest=*) guest=${a#weft.guest=} ;;
    esac
done
mkdir -p "$src" /weft-out
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 weft "$src"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 out /weft-out
ulimit -l unlimited
sh "$src/tests/rxe/inside.sh" "$guest" >/weft-out/guest$guest.log 2>&1
echo $? >/weft-out/guest$guest.rc
sync
echo o >/proc/sysrq-trigger
sleep 60
INIT
}

key() { { printf '%s\n' "${packages[@]}" "$mirror"; init_script; } | sha256sum | cut -c1-16; }

image() {
    local k dir
    k=$(key)
    dir="$cache/$k"
    if [ -f "$dir/root.img" ] && [ -f "$dir/vmlinuz" ] && [ -f "$dir/initrd.img" ]; then
        echo "$dir"
        return
    fi
    local need=()
    command -v debootstrap >/dev/null || need+=(debootstrap)
    command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
    command -v mke2fs >/dev/null || need+=(e2fsprogs)
    if [ ${#need[@]} -gt 0 ]; then
        echo "guest.sh: missing ${need[*]} (apt-get install ${need[*]})" >&2
        exit 2
    fi
    [ "$(id -u)" = 0 ] || { echo "guest.sh: building the image needs root (debootstrap)" >&2; exit 2; }
    mkdir -p "$cache"
    local tmp t0=$SECONDS
    tmp=$(mktemp -d "$cache/build.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    echo "guest.sh: building the root image $k (debootstrap from $mirror)" >&2
    local inc
    inc=$(IFS=,; echo "${packages[*]}")
    if ! debootstrap --variant=minbase --include="$inc" bookworm "$tmp/root" "$mirror" \
        >"$tmp/debootstrap.log" 2>&1; then
        tail -20 "$tmp/debootstrap.log" >&2
        echo "guest.sh: debootstrap failed (log above)" >&2
        exit 3 # the mirror, not weft: run.sh says so and skips
    fi
    init_script >"$tmp/root/sbin/weft-init"
    chmod 755 "$tmp/root/sbin/weft-init"
    rm -rf "$tmp/root/var/cache/apt/archives"/*.deb "$tmp/root/var/lib/apt/lists"/*
    mkdir -p "$tmp/out"
    cp "$tmp"/root/boot/vmlinuz-* "$tmp/out/vmlinuz"
    cp "$tmp"/root/boot/initrd.img-* "$tmp/out/initrd.img"
    mke2fs -q -t ext4 -d "$tmp/root" "$tmp/out/root.img" 2G
    rm -rf "$dir"
    mv "$tmp/out" "$dir"
    rm -rf "$tmp"
    trap - EXIT
    echo "guest.sh: image $k built in $((SECONDS - t0)) s" >&2
    echo "$dir"
}

run() {
    local guests=1 timeout=600 out="" smp=""
    while [ $# -gt 0 ]; do
        case "$1" in
        --guests) guests=$2; shift 2 ;;
        --timeout) timeout=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        --smp) smp=$2; shift 2 ;;
        --) shift; break ;;
        *) usage >&2; exit 2 ;;
        esac
    done
    [ $# -gt 0 ] || { usage >&2; exit 2; }
    case "$guests" in 1 | 2) ;; *) echo "guest.sh: --guests is 1 or 2" >&2; exit 2 ;; esac
    # Every virtual CPU is a host thread: two guests of one CPU each keep
    # the 2-core host from switching between four busy-polling CPUs.
    [ -n "$smp" ] || smp=$((3 - guests))
    case "$repo" in *[[:space:]]*) echo "guest.sh: the repository path has spaces" >&2; exit 2 ;; esac
    local dir
    dir=$(image)
    [ -n "$out" ] || out=$(mktemp -d "${TMPDIR:-/tmp}/weft-rxe.XXXXXX")
    mkdir -p "$out"
    out=$(cd "$out" && pwd)
    rm -f "$out"/guest*.rc "$out"/guest*.log "$out"/console*.log
    # What inside.sh runs, and the job's shared secret (both guests' ranks
    # must hold it; it never leaves the out folder).
    printf '%q ' "$@" >"$out/cmd"
    od -An -N16 -tx1 /dev/urandom | tr -d ' \n' >"$out/secret"
    echo "$guests" >"$out/guests"
    # The wire between two guests: qemu's socket netdev over UDP on the
    # host's loopback, one datagram a frame (a TCP stream would hold small
    # frames back for Nagle and delayed acks: 22 ms a round trip), on two
    # random ports.
    local ports=($((20000 + RANDOM % 20000)) $((40000 + RANDOM % 20000)))
    # A guest drains its end more slowly than the other can fill it; a
    # frame the host's socket drops costs rxe a retransmission timeout
    # (4 s at weft's default), so qemu's sockets get 16 MiB buffers: the
    # default is raised while they are made and put back at once.
    local rmem=""
    if [ "$guests" = 2 ] && [ -w /proc/sys/net/core/rmem_default ]; then
        rmem=$(cat /proc/sys/net/core/rmem_default)
        echo $((16 << 20)) >/proc/sys/net/core/rmem_default
        trap "echo $rmem >/proc/sys/net/core/rmem_default" EXIT
    fi
    local pids=() g
    for ((g = 0; g < guests; g++)); do
        local net=(-nic none)
        if [ "$guests" = 2 ]; then
            local end="udp=127.0.0.1:${ports[1 - g]},localaddr=127.0.0.1:${ports[g]}"
            net=(-netdev "socket,id=wire,$end"
                 -device "virtio-net-pci,netdev=wire,rx_queue_size=1024,tx_queue_size=1024,mac=52:54:00:77:00:0$((g + 1))")
        fi
        qemu-system-x86_64 -accel tcg -smp "$smp" -m 2G -display none -no-reboot \
            -kernel "$dir/vmlinuz" -initrd "$dir/initrd.img" \
            -drive "file=$dir/root.img,format=raw,if=virtio,snapshot=on" \
            -virtfs "local,path=$repo,mount_tag=weft,security_model=none" \
            -virtfs "local,path=$out,mount_tag=out,security_model=none" \
            "${net[@]}" -serial "file:$out/console$g.log" \
            -append "console=ttyS0 root=/dev/vda rw quiet init=/sbin/weft-init weft.src=$repo weft.guest=$g" &
        pids+=($!)
    done
    if [ -n "$rmem" ]; then
        sleep 2 # qemu has made its socket by now
        echo "$rmem" >/proc/sys/net/core/rmem_default
        trap - EXIT
    fi
    local t0=$SECONDS rc=0
    while :; do
        local alive=0 p
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        [ $alive = 0 ] && break
        if [ $((SECONDS - t0)) -ge "$timeout" ]; then
            echo "guest.sh: guests still running after $timeout s; stopping them" >&2
            kill "${pids[@]}" 2>/dev/null || true
            rc=124
            break
        fi
        sleep 1
    done
    wait 2>/dev/null || true
    for ((g = 0; g < guests; g++)); do
        local r
        r=$(cat "$out/guest$g.rc" 2>/dev/null || echo 125)
        echo "guest.sh: guest $g: exit $r ($out/guest$g.log)" >&2
        [ "$rc" = 0 ] && [ "$r" != 0 ] && rc=$r
    done
    echo "guest.sh: $((SECONDS - t0)) s, output in $out" >&2
    return "$rc"
}

case "${1:-}" in
image) image >/dev/null ;;
run) shift; run "$@" ;;
*) usage; [ "${1:-}" = -h ] || [ "${1:-}" = --help ] || exit 2 ;;
esac
