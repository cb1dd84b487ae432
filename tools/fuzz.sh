#!/usr/bin/env bash
# libFuzzer over every parser of untrusted bytes (tests/fuzz/fuzz_*.c), in
# ./build-fuzz: the library sources and each target built with clang
# -fsanitize=fuzzer,address,undefined, then each target run for SECONDS
# (default 60) from a copy of its committed seed corpus, two at a time.
# Fails if any target crashes, leaks, hangs or breaks an invariant; the
# input that did it is kept in build-fuzz/run/<target>/.
#   tools/fuzz.sh [SECONDS]   fuzz
#   tools/fuzz.sh --seed      rewrite tests/fuzz/corpus with the real encoders
set -euo pipefail
cd "$(dirname "$0")/.."
secs=60 seed=no
case "${1:-}" in
--seed) seed=yes ;;
'') ;;
*[!0-9]* | 0) echo "usage: $0 [seconds-per-target] | --seed" >&2; exit 2 ;;
*) secs=$1 ;;
esac

# clang only recommends its sanitizer and libFuzzer runtimes (libclang-rt-dev).
. tools/apt_need.sh
apt_need clang libclang-rt-dev

# Targets and the longest input each gets.
targets=(uid:512 bs_msg:1024 auth:512 tcp:8192 param:1024 topo:4096)
jobs=$(nproc); [ "$jobs" -gt 2 ] && jobs=2

out=build-fuzz
mkdir -p "$out/obj"
# Only select/topo.c reads config.h (for hwloc); the fuzz build needs none of
# the optional libraries.
[ -f "$out/config.h" ] || echo '/* build-fuzz: no optional libraries */' >"$out/config.h"
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
cflags="-std=gnu11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wno-unused-parameter
        -Wno-unknown-pragmas -D_GNU_SOURCE -Iinclude -I. -Isrc -I$out $san"

# The library: every source, rebuilt when it or any header is newer.
# verbs is left out but for its descriptor, as configure does without
# libibverbs (the fuzz build has no optional library).
# CUDA is left out as configure --without-cuda does (devbuf_none.c).
srcs=()
for s in base/*.c algorithms/*.c select/*.c src/*.c transports/*.c transports/util/*.c \
         transports/self/*.c transports/tcp/*.c transports/shm/*.c transports/verbs/verbs_desc.c; do
    case $s in base/cudrv.c | src/devbuf.c | src/devipc.c) ;; *) srcs+=("$s") ;; esac
done
newest_h=$(ls -t base/*.h select/*.h src/*.h algorithms/*.h transports/*.h transports/*/*.h include/*.h | head -n 1)
stale=()
for s in "${srcs[@]}"; do
    o="$out/obj/$(echo "${s%.c}" | tr / _).o"
    if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ "$newest_h" -nt "$o" ]; then
        stale+=("$s")
    fi
done
if [ ${#stale[@]} -gt 0 ]; then
    echo "fuzz: compiling ${#stale[@]} library sources"
    export out cflags
    printf '%s\n' "${stale[@]}" | xargs -P "$jobs" -I{} sh -c \
        'clang $cflags -fsanitize=fuzzer-no-link -c "{}" -o "$out/obj/$(echo "{}" | sed "s/\.c$//; s|/|_|g").o"'
    rm -f "$out/libweft_fuzz.a"
fi
[ -f "$out/libweft_fuzz.a" ] || ar rcs "$out/libweft_fuzz.a" "$out"/obj/*.o
libs="$out/libweft_fuzz.a -lm -lpthread"

if [ "$seed" = yes ]; then
    # shellcheck disable=SC2086
    clang $cflags -Werror -fsanitize=fuzzer-no-link tests/fuzz/gen_corpus.c $libs -o "$out/gen_corpus"
    "$out/gen_corpus" tests/fuzz/corpus
    du -sh tests/fuzz/corpus
    exit 0
fi

for t in "${targets[@]}"; do
    name=${t%%:*}
    bin="$out/fuzz_$name"
    if [ ! -x "$bin" ] || [ "tests/fuzz/fuzz_$name.c" -nt "$bin" ] || [ tests/fuzz/fuzz.h -nt "$bin" ] ||
       [ "$out/libweft_fuzz.a" -nt "$bin" ]; then
        # shellcheck disable=SC2086
        clang $cflags -Werror -fsanitize=fuzzer "tests/fuzz/fuzz_$name.c" $libs -o "$bin"
    fi
done

# One target: a fresh copy of its corpus (the committed one is never
# written), SECONDS of fuzzing, its summary on one line.
run_one() {
    local name=$1 maxlen=$2 dir="$out/run/$1"
    rm -rf "$dir"
    mkdir -p "$dir/corpus"
    cp tests/fuzz/corpus/"$name"/* "$dir/corpus/"
    local rc=0
    ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" UBSAN_OPTIONS="print_stacktrace=1" \
        "./$out/fuzz_$name" -max_total_time="$secs" -max_len="$maxlen" -timeout=10 \
        -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$dir/" "$dir/corpus" \
        >"$dir/log" 2>&1 || rc=$?
    local execs crashes
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -n 1)
    crashes=$(find "$dir" -maxdepth 1 \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
              -o -name 'oom-*' \) | wc -l)
    printf 'fuzz_%-8s %10s executions, %s crashes, corpus %d -> %d inputs\n' "$name" \
        "${execs:-?}" "$crashes" "$(ls tests/fuzz/corpus/"$name" | wc -l)" "$(ls "$dir/corpus" | wc -l)"
    if [ "$rc" -ne 0 ] || [ "$crashes" -ne 0 ]; then
        echo "fuzz_$name FAILED (exit $rc); input and log in $dir:" >&2
        grep -E -A 30 'ERROR: |invariant broken|runtime error' "$dir/log" | head -n 60 >&2 || tail -n 40 "$dir/log" >&2
        return 1
    fi
}

echo "fuzz: ${#targets[@]} targets, ${secs}s each, $jobs at a time"
failed=0
pids=()
for t in "${targets[@]}"; do
    run_one "${t%%:*}" "${t##*:}" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
        wait "${pids[0]}" || failed=1
        pids=("${pids[@]:1}")
    fi
done
for p in "${pids[@]}"; do
    wait "$p" || failed=1
done
[ "$failed" = 0 ] && echo "fuzz: no crashes" || { echo "fuzz: FAILED" >&2; exit 1; }
