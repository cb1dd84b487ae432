#!/usr/bin/env bash
# Multi-process runs with every rank under valgrind's memcheck: weft-soak
# over shm and tcp with 2 and 3 ranks (both algorithms, split communicators
# every 50 ops), and all_reduce_perf over every dtype and op with 2 ranks.
# Any error, any definitely lost block, or any fd the program opened and
# left open at exit fails the run.  30-50 s here (2 cores, shared).
#   tools/valgrind.sh [ITERS]     (weft-soak ops per run, default 2000)
# Logs: build/valgrind/<run>/vg.<pid>.log, one per rank.
set -euo pipefail
cd "$(dirname "$0")/.."
iters=${1:-2000}
if ! command -v valgrind >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    echo "installing: valgrind"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends valgrind >/dev/null
fi
[ -x build/weft-soak ] && [ -x build/weftrun ] || ./tools/build.sh
make -C build -j2 weft-soak weftrun all_reduce_perf >/dev/null
export WEFT_SOCKET_IFNAME=lo
out=build/valgrind
rm -rf "$out"
mkdir -p "$out"
# No suppressions: nothing of weft's needs one (shared memory and futexes
# included).
vg=(valgrind --tool=memcheck --error-exitcode=99 --leak-check=full
    --errors-for-leak-kinds=definite --track-fds=yes)

# A soak under valgrind checks fds and weft's shm files after a 100-op
# warm-up; RSS is valgrind's own there, so its bound is lifted.
soak=(--iters "$iters" --max-bytes 64K --warmup 100 --report 100000 --split-every 50
      --rss-slack 1G)

fail=0
# run NAME NRANKS ENV... -- PROG ARGS...: every rank runs "valgrind PROG".
run() {
    local name=$1 n=$2 env=() dir="$out/$1"
    shift 2
    while [ "$1" != -- ]; do env+=(--env "$1"); shift; done
    shift
    mkdir -p "$dir"
    local t0 rc=0
    t0=$(date +%s)
    # A libtool wrapper script (the perf tools) runs its program under
    # valgrind through libtool --mode=execute; weft-soak is the program.
    local pre=()
    head -c 4 "$1" | grep -q ELF || pre=(./build/libtool --mode=execute)
    ./build/weftrun -n "$n" --timeout 240 "${env[@]}" "${pre[@]}" \
        "${vg[@]}" --log-file="$dir/vg.%p.log" "$@" >"$dir/output.txt" 2>&1 || rc=$?
    local secs=$(($(date +%s) - t0)) logs errors leftfds why=""
    logs=$(find "$dir" -name 'vg.*.log' | wc -l)
    # Errors (definite leaks included) per log; fds the program opened and
    # did not close are "Open ..." entries without "<inherited from parent>".
    errors=$(cat "$dir"/vg.*.log 2>/dev/null |
             sed -n 's/.*ERROR SUMMARY: \([0-9]*\) errors.*/\1/p' | awk '{s += $1} END {print s + 0}')
    leftfds=$(cat "$dir"/vg.*.log 2>/dev/null | awk '
        /==[0-9]+== Open / {open = 1; next}
        open && /inherited from parent/ {open = 0; next}
        open && /==[0-9]+== +(at|by) / {n++; open = 0}
        END {print n + 0}')
    [ "$rc" = 0 ] || why="exit status $rc"
    [ "$logs" = "$n" ] || why="${why:+$why, }$logs valgrind logs for $n ranks"
    [ "$errors" = 0 ] || why="${why:+$why, }$errors errors"
    [ "$leftfds" = 0 ] || why="${why:+$why, }$leftfds fds left open"
    if [ -z "$why" ]; then
        printf '%-34s ok: %d ranks, 0 errors, 0 definitely lost, no fd left open (%d s)\n' \
            "$name" "$n" "$secs"
    else
        printf '%-34s FAILED: %s (%d s); logs in %s\n' "$name" "$why" "$secs" "$dir"
        grep -h -v -e '^--[0-9]*-- ' "$dir"/vg.*.log | grep -v '^==[0-9]*== *$' | head -60 || true
        tail -n 20 "$dir/output.txt"
        fail=1
    fi
}

echo "== memcheck, every rank: ${vg[*]}"
# Messages of at most 64 KiB would fit one chunk and one slot at the default
# sizes; smaller chunks, slots and staging make them take the paths of
# large messages (pipelined chunks, ring wrap-around, staging reuse), and
# WEFT_SHM_CMA_MIN the process_vm_readv path.
small=(WEFT_CHUNK_SIZE=8192 WEFT_STAGING_SLOTS=4)
run soak-2-shm-cma 2 WEFT_SHM_CMA_MIN=16384 -- ./build/weft-soak "${soak[@]}"
run soak-2-tcp 2 WEFT_TRANSPORT=tcp -- ./build/weft-soak "${soak[@]}"
run soak-3-shm-rhd-small 3 WEFT_ALGO=rhd "${small[@]}" WEFT_SHM_SLOTS=4 WEFT_SHM_SLOT_BYTES=4096 \
    -- ./build/weft-soak "${soak[@]}"
run soak-3-tcp-ring-small 3 WEFT_TRANSPORT=tcp WEFT_ALGO=ring "${small[@]}" \
    -- ./build/weft-soak "${soak[@]}"
run all_reduce_perf-2-shm 2 -- ./build/all_reduce_perf -b 8 -e 64K -f 8 -d all -o all -n 2 -w 1
# valgrind 3.19 (Debian 12) does not know pidfd_open (syscall 434) and says so
# on stderr; weft's shm transport then watches its peers with kill(pid, 0).
if grep -qs 'unhandled amd64-linux syscall: 434' "$out"/*/vg.*.log; then
    echo "note: this valgrind lacks pidfd_open (syscall 434); weft fell back to kill(pid, 0)"
fi
exit $fail
