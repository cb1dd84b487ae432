#!/usr/bin/env bash
# gpu-check.sh - the device check, for a machine with an NVIDIA GPU: builds
# weft --with-cuda into build-gpu/, measures the GPU's copy bandwidth, runs
# the six perf tools with -G 1 -c 1 on 2 and 4 ranks sharing the GPU, an
# NCCL program that relies on stream order, and verbs with GPUDirect when
# there is an HCA.  Every step is bounded and recorded; a failed step does
# not stop the next.  See docs/gpu.md ("The GPU check").
#
#   tools/gpu-check.sh [RESULTS]     (default ./gpu-check.txt; also $OUT/gpu-check.txt)
#
# GPU_CHECK_BUDGET (seconds, default 450) bounds the whole run,
# GPU_CHECK_JOBS (default 16) is make's -j; CUDA_HOME (default
# /usr/local/cuda) is the toolkit; CUDA_ARCHS (default: the GPU's compute
# capability, else 90) the architectures weft's kernels are built for.  Exit 0 when no step failed (a busbw
# under the goal is BELOW, not a failure).
set -u

res=$(realpath -m -- "${1:-gpu-check.txt}")
cd "$(dirname "$0")/.." || exit 2
src=$PWD
bld=$src/build-gpu
logs=$bld/gpu-check-logs
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export CUDA_HOME PATH="$CUDA_HOME/bin:$PATH"
# One host, no network needed: every rank talks over loopback and shm.
export WEFT_SOCKET_IFNAME=${WEFT_SOCKET_IFNAME:-lo}
budget=${GPU_CHECK_BUDGET:-450}
jobs=${GPU_CHECK_JOBS:-16}
t_end=$((SECONDS + budget))
mkdir -p "$(dirname "$res")" "$logs" || exit 2
: >"$res" || exit 2

S_NAME=() S_STAT=() S_NOTE=()

say() { printf '%s\n' "$@" | tee -a "$res"; }

# step NAME STATUS NOTE: one row of the final table.
step() {
    S_NAME+=("$1") S_STAT+=("$2") S_NOTE+=("$3")
    say "== $1: $2${3:+ - $3}"
}

# allow MAX [KEEP]: seconds a command may run: MAX, cut so that KEEP
# seconds of the budget stay for the steps after it (0 or less: none).
allow() {
    local want=$1 left=$((t_end - ${2:-0} - SECONDS))
    ((left < want)) && want=$left
    echo "$want"
}

# run DIR LOG SECS CMD...: CMD in DIR under a timeout, its output in LOG
# and in the results; the tail on the terminal when it fails.  CMD's status.
run() {
    local dir=$1 log=$2 secs=$3
    shift 3
    if ((secs < 5)); then
        say "\$ $* - not run: the time budget (${budget}s) is spent"
        return 125
    fi
    say "\$ $*   (in ${dir#"$src"/}, timeout ${secs}s)"
    (cd "$dir" && timeout -k 5 "$secs" "$@") >"$log" 2>&1
    local rc=$?
    cat "$log" >>"$res"
    ((rc == 124 || rc == 137)) && say "(timed out after ${secs}s)"
    if ((rc != 0)); then
        say "(exit $rc; last lines:)"
        tail -n 15 "$log"
    fi
    return $rc
}

say "# weft gpu-check $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname)"
say "# source $src ($(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo 'not a git checkout'))"

# ---- (a) the GPU ------------------------------------------------------------
say "" "## (a) the GPU"
gpu_ok=0
if command -v nvidia-smi >/dev/null; then
    run "$src" "$logs/nvidia-smi.log" "$(allow 30)" nvidia-smi -L
    run "$src" "$logs/nvidia-smi-q.log" "$(allow 30)" nvidia-smi \
        --query-gpu=name,driver_version,memory.total,pci.bus_id --format=csv
    if grep -q '^GPU ' "$logs/nvidia-smi.log"; then
        gpu_ok=1
        step "a gpu" PASS "$(grep -m1 '^GPU ' "$logs/nvidia-smi.log" | sed 's/ (UUID.*//'), driver $(tail -n1 "$logs/nvidia-smi-q.log" | cut -d, -f2 | tr -d ' ')"
    else
        step "a gpu" FAIL "nvidia-smi lists no GPU"
    fi
else
    step "a gpu" FAIL "no nvidia-smi"
fi
run "$src" "$logs/nvcc.log" "$(allow 30)" nvcc --version || true
# The kernels are built for this GPU only: faster, and a toolkit too old
# for configure's newest default architecture still builds.
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. ')
case $cc in *[!0-9]* | "") cc=90 ;; esac
archs=${CUDA_ARCHS:-$cc}

# ---- (b) build --------------------------------------------------------------
say "" "## (b) build weft --with-cuda into build-gpu/"
built=0
have() { command -v "$1" >/dev/null; }
gen=ok
if have autoreconf && have automake && have libtoolize; then
    run "$src" "$logs/autoreconf.log" "$(allow 120 300)" autoreconf -fi || gen=failed
fi
if [ "$gen" = failed ] || ! { have autoreconf && have automake && have libtoolize; }; then
    if [ -x "$src/configure" ] && [ -f "$src/Makefile.in" ] && [ -d "$src/build-aux" ]; then
        # Use the carried generated files as they are: newer than every
        # source, so make never tries to run automake.
        say "(autotools missing or failed: using the carried configure, Makefile.in, build-aux)"
        touch "$src/aclocal.m4" && sleep 1 &&
            find "$src" -path "$bld" -prune -o \( -name Makefile.in -o -name configure \
                -o -name config.h.in \) -print0 | xargs -0 touch
        gen=ok
    else
        gen=missing
    fi
fi
if [ "$gen" = missing ]; then
    step "b build" FAIL "no configure script and no autotools (carry configure, Makefile.in, aclocal.m4, config.h.in, build-aux, m4)"
elif run "$bld" "$logs/configure.log" "$(allow 120 240)" "$src/configure" --with-cuda \
    CUDA_HOME="$CUDA_HOME" CUDA_ARCHS="$archs"; then
    grep 'configure: weft' "$logs/configure.log" | tee -a "$res"
    perf_progs="all_reduce_perf reduce_scatter_perf all_gather_perf broadcast_perf reduce_perf sendrecv_perf"
    # shellcheck disable=SC2086
    if run "$bld" "$logs/make.log" "$(allow 240 180)" make -j"$jobs" weftrun weft-info gpu_copy \
        libweft_nccl.la $perf_progs; then
        built=1
        step "b build" PASS "$(grep -o 'cuda=[a-z]* nvcc=[a-z]*' "$logs/configure.log" | head -n1)"
        run "$bld" "$logs/weft-info.log" "$(allow 30)" env WEFT_DEBUG=INFO WEFT_DEBUG_SUBSYS=INIT \
            ./weft-info || true
    else
        step "b build" FAIL "make failed (build-gpu/gpu-check-logs/make.log)"
    fi
else
    tail -n 30 "$bld/config.log" >>"$res" 2>/dev/null
    step "b build" FAIL "configure --with-cuda failed (build-gpu/config.log)"
fi

# ---- (c) copy bandwidth -----------------------------------------------------
say "" "## (c) device-to-device copy bandwidth (cuMemcpyAsync)"
copy64=0 copy1g=0
if ((built)) && run "$bld" "$logs/gpu_copy.log" "$(allow 60 150)" ./gpu_copy 64M 1G; then
    copy64=$(awk '$1 == "copy_bw" && $2 == 67108864 {print $3}' "$logs/gpu_copy.log")
    copy1g=$(awk '$1 == "copy_bw" && $2 == 1073741824 {print $3}' "$logs/gpu_copy.log")
    step "c copy bw" PASS "64 MiB ${copy64:-?} GB/s, 1 GiB ${copy1g:-?} GB/s"
else
    step "c copy bw" "$( ((built)) && echo FAIL || echo SKIP)" "$( ((built)) && echo 'gpu_copy failed' || echo 'not built')"
fi

# ---- (d) the perf tools with -G 1 -------------------------------------------
# rows LOG: "rows bad oob": table rows, rows with #wrong != 0, and the
# "Out of bounds" verdict (rank 0's lines, "[0] " stripped).
rows() {
    sed -n 's/^\[0\] //p' "$1" | awk '
        /^ *[0-9]+ +[0-9]+ +[a-z0-9]+ / { n++; if (($9 != "N/A" && $9 != 0) || ($13 != "N/A" && $13 != 0)) bad++ }
        /Out of bounds values/ { oob = $7 " " $8 }
        END { printf "%d %d %s\n", n, bad, (oob == "" ? "none" : oob) }'
}
# busbw LOG BYTES: out-of-place and in-place busbw of the row of that size.
busbw() {
    sed -n 's/^\[0\] //p' "$1" | awk -v b="$2" '$1 == b && $3 == "float" { print $8, $12; exit }'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "?" }'; }

say "" "## (d) perf tools, -G 1 -c 1, ranks sharing the one GPU"
keep_d=100 # seconds kept for (e) and (f)
if ((built)); then
    # First the numbers the goal is about: all_reduce at 64 MiB and 1 GiB.
    for n in 2 4; do
        log=$logs/busbw-n$n.log
        run "$bld" "$log" "$(allow 90 $keep_d)" ./weftrun -n "$n" ./all_reduce_perf -G 1 -c 1 \
            -b 64M -e 1G -f 16 -w 5 -n 20
        rc=$?
        if ((rc == 0)); then
            read -r o64 i64 <<<"$(busbw "$log" 67108864)"
            read -r o1g i1g <<<"$(busbw "$log" 1073741824)"
            note="busbw 64 MiB ${o64:-?} GB/s = $(ratio "${o64:-0}" "$copy64") x copy, 1 GiB ${o1g:-?} GB/s = $(ratio "${o1g:-0}" "$copy1g") x copy (in place $(ratio "${i64:-0}" "$copy64"), $(ratio "${i1g:-0}" "$copy1g"))"
            ok=PASS
            if [ "$n" = 2 ]; then
                good=$(awk -v a="$(ratio "${o1g:-0}" "$copy1g")" 'BEGIN { print (a + 0 >= 0.8) }')
                ((good)) || ok=BELOW
                note="$note; goal >= 0.8"
            fi
            step "d busbw n=$n" $ok "$note"
        else
            read -r nrows nbad oob <<<"$(rows "$log")"
            step "d busbw n=$n" FAIL "exit $rc, $nrows rows (2 expected), $nbad with #wrong != 0, out of bounds: $oob"
        fi
    done
    # Every tool over 8 B .. 1 GiB.
    for n in 2 4; do
        for tool in all_reduce reduce_scatter all_gather broadcast reduce sendrecv; do
            log=$logs/$tool-n$n.log
            run "$bld" "$log" "$(allow 60 $keep_d)" ./weftrun -n "$n" "./${tool}_perf" -G 1 -c 1 \
                -b 8 -e 1G -f 8 -w 2 -n 5
            rc=$?
            read -r nrows nbad oob <<<"$(rows "$log")"
            if ((rc == 0 && nrows == 10 && nbad == 0)); then
                step "d $tool n=$n" PASS "$nrows sizes 8 B..1 GiB, #wrong 0 on every row"
            else
                step "d $tool n=$n" FAIL "exit $rc, $nrows rows (10 expected), $nbad with #wrong != 0, out of bounds: $oob"
            fi
        done
    done
    # Every datatype and op of all_reduce at a few sizes.
    for n in 2 4; do
        log=$logs/all_reduce-dtypes-n$n.log
        run "$bld" "$log" "$(allow 60 $keep_d)" ./weftrun -n "$n" ./all_reduce_perf -G 1 -c 1 \
            -d all -o all -b 4 -e 64M -f 16 -w 1 -n 1
        rc=$?
        read -r nrows nbad oob <<<"$(rows "$log")"
        if ((rc == 0 && nrows == 350 && nbad == 0)); then
            step "d all_reduce -d all -o all n=$n" PASS "$nrows rows (10 dtypes x 5 ops x 7 sizes), #wrong 0"
        else
            step "d all_reduce -d all -o all n=$n" FAIL "exit $rc, $nrows rows (350 expected), $nbad with #wrong != 0, out of bounds: $oob"
        fi
    done
else
    step "d perf -G 1" SKIP "not built"
fi

# ---- (e) NCCL stream semantics ----------------------------------------------
say "" "## (e) NCCL program on streams (tests/nccl/nccl_stream.cu, libweft_nccl)"
if ((built)) && [ -f "$bld/.libs/libweft_nccl.so" ]; then
    inc=$CUDA_HOME/include
    [ -f "$inc/nccl.h" ] || {
        inc=$src/compat/nccl
        say "(no nccl.h in $CUDA_HOME/include: compiling against weft's)"
    }
    built_e=0
    for arch in -arch=native -arch=sm_90; do
        if run "$src" "$logs/nvcc-nccl_stream.log" "$(allow 120 40)" nvcc -O2 "$arch" -I"$inc" \
            -o "$bld/nccl_stream" tests/nccl/nccl_stream.cu -L"$bld/.libs" -lweft_nccl \
            -Xlinker -rpath="$bld/.libs"; then
            built_e=1
            break
        fi
    done
    if ((built_e)); then
        log=$logs/nccl_stream.log
        run "$bld" "$log" "$(allow 90 30)" ./weftrun -n 2 ./nccl_stream
        rc=$?
        npass=$(grep -c '^\[0\] PASS' "$log")
        nfail=$(grep -c 'FAIL' "$log")
        if ((rc == 0 && nfail == 0 && npass > 0)); then
            step "e nccl_stream" PASS "$npass PASS lines (one stream, two comms on two streams, groups)"
        else
            step "e nccl_stream" FAIL "exit $rc, $npass PASS, $nfail FAIL lines"
        fi
    else
        step "e nccl_stream" FAIL "nvcc failed"
    fi
else
    step "e nccl_stream" SKIP "not built"
fi

# ---- (f) verbs and GPUDirect ------------------------------------------------
say "" "## (f) verbs with device buffers (GPUDirect RDMA through dma-buf)"
if ! have ibv_devices; then
    step "f verbs" SKIP "no ibv_devices (rdma-core not installed)"
elif ! ibv_devices 2>/dev/null | awk 'NR > 2 && NF {found = 1} END {exit !found}'; then
    step "f verbs" SKIP "ibv_devices lists no HCA"
elif ((!built)); then
    step "f verbs" SKIP "not built"
else
    log=$logs/verbs.log
    run "$bld" "$log" "$(allow 90 5)" ./weftrun -n 2 --env WEFT_TRANSPORT=verbs \
        --env WEFT_DEBUG=INFO ./all_reduce_perf -G 1 -R 1 -c 1 -b 8 -e 64M -f 8 -w 2 -n 5
    rc=$?
    read -r nrows nbad oob <<<"$(rows "$log")"
    gd=$(grep -m1 -iE 'dma-buf|GPUDirect' "$log")
    if ((rc == 0 && nbad == 0)); then
        step "f verbs" PASS "$nrows rows #wrong 0; GPUDirect: ${gd:-no dma-buf/GPUDirect line (staged through host memory)}"
    else
        step "f verbs" FAIL "exit $rc, $nbad rows with #wrong != 0; ${gd:-no dma-buf/GPUDirect line}"
    fi
fi

# ---- (g) summary ------------------------------------------------------------
say "" "## summary ($((SECONDS))s of ${budget}s)"
fails=0 below=0
for i in "${!S_NAME[@]}"; do
    say "$(printf '%-32s %-5s %s' "${S_NAME[$i]}" "${S_STAT[$i]}" "${S_NOTE[$i]}")"
    [ "${S_STAT[$i]}" = FAIL ] && fails=$((fails + 1))
    [ "${S_STAT[$i]}" = BELOW ] && below=$((below + 1))
done
say "gpu-check: $fails step(s) failed, $below below the busbw goal; results in $res"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then
    cp "$res" "$OUT/gpu-check.txt"
    cp "$bld/config.log" "$OUT/config.log" 2>/dev/null
fi
((gpu_ok)) || say "gpu-check: no GPU was seen"
exit $((fails > 0))
