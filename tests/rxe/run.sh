#!/usr/bin/env bash
# The verbs transport on the kernel's own RDMA stack (Soft-RoCE, rdma_rxe)
# in emulated guests, from the host's build in ./build: one guest with two
# rxe devices (pair.sh), two guests on a virtual wire (matrix.sh: every
# collective and family, the fault cases), and perftest beside weft on the
# same wire (perf.sh).  Needs root, qemu-system-x86 and debootstrap; the
# first run builds the root image (2-4 min, cached after).  Used by CI.
set -euo pipefail
cd "$(dirname "$0")/../.."
g=tests/rxe/guest.sh
out=${1:-build/rxe}
mkdir -p "$out"
[ -x build/all_reduce_perf ] || { echo "run.sh: build first (tools/build.sh)" >&2; exit 2; }
t0=$SECONDS
# Exit 77 (skipped) when the image cannot be built: the mirror is out of
# reach, which says nothing about weft.
st=0
$g image || st=$?
if [ "$st" = 3 ]; then
    echo "run.sh: SKIPPED: no root image (debootstrap could not fetch from the mirror)"
    exit 77
fi
[ "$st" = 0 ] || exit "$st"
rc=0
$g run --guests 1 --timeout 600 --out "$out/pair" -- sh tests/rxe/pair.sh || rc=1
$g run --guests 2 --timeout 1200 --out "$out/wire" -- sh tests/rxe/matrix.sh || rc=1
$g run --guests 2 --timeout 600 --out "$out/perf" -- sh tests/rxe/perf.sh || rc=1
grep -h "^rxe: " "$out"/pair/guest0.log "$out"/wire/guest*.log || true
# perftest beside weft on the same wire: client-side (guest 1) perftest
# lines, rank 0's sendrecv_perf rows.
awk -v lf="$out/perf/guest1.log" -v wlog="$out/perf/guest0.log" '
BEGIN {
    while ((getline l < lf) > 0) {
        if (l ~ /#bytes/) { getline l < lf; n++
            split(l, f); if (n <= 2) { lat[n] = f[5]; avg[n] = f[6] } else bw[n - 2] = f[4] }
    }
    while ((getline l < wlog) > 0)
        if (l ~ /^\[0\] +[0-9]+ +[0-9]+ +float/) { split(l, f); t[f[2]] = f[7] }
    printf "rxe perf: ib_write_lat 8 B %s us typical (%s avg), ib_send_lat %s us (%s avg)\n", lat[1], avg[1], lat[2], avg[2]
    printf "rxe perf: ib_write_bw 4 MiB %s MB/s, bidirectional %s MB/s\n", bw[1], bw[2]
    if (t[8] > 0 && t[4194304] > 0) {
        wbw = 4194304 / t[4194304]
        printf "rxe perf: weft sendrecv_perf 8 B %.1f us = %.2fx ib_write_lat; 4 MiB %.1f MB/s a direction = %.2fx ib_write_bw, %.2fx half the bidirectional\n", t[8], t[8] / lat[1], wbw, wbw / bw[1], wbw / (bw[2] / 2)
    }
}'
echo "run.sh: $((SECONDS - t0)) s, logs in $out"
exit $rc
