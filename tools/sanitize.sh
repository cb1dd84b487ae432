#!/usr/bin/env bash
# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer, in
# ./build-asan.  Any report fails the run.  Criterion's runner itself leaks
# a few bytes at exit; that one stack is suppressed, nothing of weft's.
set -euo pipefail
cd "$(dirname "$0")/.."
./tools/build.sh >/dev/null   # dependencies and ./configure
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
mkdir -p build-asan
cd build-asan
if [ ! -f Makefile ] || [ ../configure -nt Makefile ]; then
    ../configure --enable-werror --disable-shared CFLAGS="-O1 -g $san" LDFLAGS="$san" >/dev/null
fi
make -j"$(nproc)" >/dev/null
printf 'leak:libcriterion\n' >lsan.supp
export LSAN_OPTIONS="suppressions=$PWD/lsan.supp"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
export UBSAN_OPTIONS="print_stacktrace=1"
# The symbolic checker's matrix up to p = 128: above, the same code runs ten
# times longer under the sanitizers (about 5 minutes); the plain pass checks
# every p.
export WEFT_TEST_MAX_P=128
# The trainer's layouts: one of each kind (ZeRO-3, TP, PP, 3D) instead of
# all sixteen; the plain pass runs every one.
export WEFT_TEST_QUICK=1
make -j1 check || { tail -n 100 tests/*.log test-suite.log 2>/dev/null; exit 1; }
