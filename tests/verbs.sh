#!/bin/sh
# The verbs transport, unchanged, on the software verbs device
# (tests/softverbs): the collective matrix with every algorithm family and
# the fault tests, with the device preloaded in front of the real
# libibverbs.  Skips (77) when configure did not build the transport.
here=$(cd "$(dirname "$0")" && pwd)
sv="$here/.libs/libweft-softverbs.so"
if [ ! -f "$sv" ]; then
    echo "verbs.sh: no software verbs device ($sv): weft was built without verbs"
    exit 77
fi
# A sanitizer build loads its runtime first; the device comes after it.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"
export LD_PRELOAD="$sv${LD_PRELOAD:+:$LD_PRELOAD}"
export WEFT_TEST_SOFTVERBS=1
rc=0
"$here/test_coll" --jobs 1 --filter 'verbs/*' || rc=1
"$here/test_faults" --jobs 1 --filter 'faults/*verbs' || rc=1
exit $rc
