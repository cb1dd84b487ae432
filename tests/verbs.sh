#!/bin/sh
# The verbs transport, unchanged, on the software verbs device
# (tests/softverbs): the collective matrix with every algorithm family, the
# transport suite and the fault tests, with the device preloaded in front of the real
# libibverbs.  Also checks that the library users get links libibverbs
# (and librdmacm) and not the software device.  Run from the build folder (make check
# does); skips (77) when configure did not build the transport.
build=$PWD
sv="$build/libweft-softverbs.so"
if [ ! -f "$sv" ]; then
    echo "verbs.sh: no software verbs device ($sv): weft was built without verbs"
    exit 77
fi
rc=0
lib="$build/.libs/libweft.so"
if [ -f "$lib" ]; then
    if ! ldd "$lib" | grep -q 'libibverbs\.so'; then
        echo "verbs.sh: FAIL: $lib does not link libibverbs"; rc=1
    fi
    if grep -q '^#define HAVE_RDMACM 1' "$build/config.h" && ! ldd "$lib" | grep -q 'librdmacm\.so'; then
        echo "verbs.sh: FAIL: $lib does not link librdmacm"; rc=1
    fi
    if ldd "$lib" | grep -q softverbs || nm -D --defined-only "$lib" | grep -q ' ibv_'; then
        echo "verbs.sh: FAIL: $lib carries the software device or defines ibv_ entry points"; rc=1
    fi
    echo "verbs.sh: $lib links $(ldd "$lib" | grep -o 'lib\(ibverbs\|rdmacm\)\.so[^ ]*' | sort -u | tr '\n' ' ')and no software device"
fi
# A sanitizer build loads its runtime first; the device comes after it.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export LD_PRELOAD="$sv${LD_PRELOAD:+:$LD_PRELOAD}"
export WEFT_TEST_SOFTVERBS=1
"$build/test_coll" --jobs 1 --filter 'verbs/*' || rc=1
# The suite every transport runs (tests/transport_suite.c), on verbs.
"$build/test_transport" --jobs 1 --filter 'verbs/*' || rc=1
# Registered buffers (zero-copy) and two queue pairs per peer, 3 ranks,
# every result checked by the perf tools themselves.
for tool in sendrecv all_reduce all_gather; do
    if ! WEFT_TRANSPORT=verbs WEFT_IB_QPS_PER_CONNECTION=2 timeout 120 \
        "$build/weftrun" -n 3 "$build/${tool}_perf" -b 8 -e 4M -f 8 -n 3 -w 1 -c 1 -R 1 \
        >"$build/verbs-$tool.out" 2>&1; then
        echo "verbs.sh: FAIL: ${tool}_perf -R 1 over verbs:"; tail -20 "$build/verbs-$tool.out"; rc=1
    else
        echo "verbs.sh: ${tool}_perf -R 1, 2 queue pairs, 3 ranks: $(grep 'Out of bounds' "$build/verbs-$tool.out")"
    fi
done
"$build/test_faults" --jobs 1 --filter 'faults/*verbs' || rc=1
"$build/test_security" --jobs 1 --filter 'security/*verbs' || rc=1
"$build/test_cluster" --jobs 1 --filter 'cluster/*verbs*' || rc=1
exit $rc
