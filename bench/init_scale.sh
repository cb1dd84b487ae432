#!/usr/bin/env bash
# init_scale.sh - how long weft_comm_init takes for many ranks on this one
# host: N ranks of a tiny driver started by build/weftrun, RUNS runs each,
# medians.  Per run, from CLOCK_MONOTONIC stamps the ranks print and rank
# 0's bootstrap line (WEFT_DEBUG=INFO, subsystem BOOT):
#   spawn_s  last rank's start - first rank's start (weftrun's fork/exec)
#   job_s    last rank past init - last rank started: the whole job's init
#            once every rank exists
#   root_s   rank 0's own weft_comm_init (it starts first and waits)
#   join_s   rank 0: bootstrap start to the last rank's record
#   table_s  rank 0: sending the table (nranks * record bytes) to each rank
#   cpu_s    user + sys seconds of all ranks together
#   MiB      peak of the ranks' summed RSS (shared pages count per rank)
# Usage: bench/init_scale.sh [-n "64 128 256"] [-r RUNS] [-t "tcp shm"] [-e K=V]...
#   -e K=V  extra environment for the ranks (e.g. -e WEFT_STAGING_SLOTS=1)
# Needs build/ (tools/build.sh).  Raises ulimit -n if it must; skips a shm
# size whose rings (every rank maps 8 x 256 KiB per peer, at most
# WEFT_SHM_MAX_BYTES = 32 MiB a rank, touched at init) would not fit in
# half the available memory.
set -euo pipefail
cd "$(dirname "$0")/.."
sizes="64 128 256" runs=3 transports="tcp shm" extra=()
while getopts "n:r:t:e:" o; do
    case $o in
    n) sizes=$OPTARG ;;
    r) runs=$OPTARG ;;
    t) transports=$OPTARG ;;
    e) extra+=(-x "$OPTARG") ;;
    *) echo "usage: $0 [-n SIZES] [-r RUNS] [-t TRANSPORTS] [-e K=V]..." >&2; exit 2 ;;
    esac
done
[ -x build/weftrun ] && [ -f build/.libs/libweft.so ] || {
    echo "build first: tools/build.sh" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The driver: stamps at main and after init, one allreduce as a check.
cat >"$tmp/drv.c" <<'C'
#include <stdio.h>
#include <time.h>
#include "weft.h"
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
int main(void)
{
    double t0 = now();
    weft_comm_t comm;
    if (weft_comm_init_env(&comm) != WEFT_OK) {
        fprintf(stderr, "init: %s\n", weft_last_error(NULL));
        return 1;
    }
    double t1 = now();
    int rank, n, x = 1, sum = 0;
    weft_comm_rank(comm, &rank);
    weft_comm_size(comm, &n);
    if (weft_allreduce(&x, &sum, 1, WEFT_INT32, WEFT_SUM, comm) != WEFT_OK || sum != n) {
        fprintf(stderr, "rank %d: allreduce gave %d, not %d\n", rank, sum, n);
        return 1;
    }
    printf("STAMP %d %.6f %.6f\n", rank, t0, t1);
    return weft_comm_destroy(comm) == WEFT_OK ? 0 : 1;
}
C
cc -O2 -Iinclude -Ibuild -o "$tmp/drv" "$tmp/drv.c" -Lbuild/.libs -lweft \
    -Wl,-rpath,"$PWD/build/.libs"

max=0
for n in $sizes; do [ "$n" -gt "$max" ] && max=$n; done
# The root holds a connection per rank, every rank a few listeners and
# data sockets: 4 per rank is plenty for one process.
need=$((max * 4 + 64))
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
    ulimit -n "$need" 2>/dev/null || {
        echo "ulimit -n is $(ulimit -n); $need needed for $max ranks" >&2; exit 1; }
fi
avail_mib=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
echo "# $(nproc) cores, $avail_mib MiB available, ulimit -n $(ulimit -n), load $(cut -d' ' -f1-3 /proc/loadavg)${extra[*]+, ${extra[*]}}"
printf "%-5s %5s %3s %8s %8s %8s %8s %8s %8s %7s\n" tp ranks run spawn_s job_s root_s \
    join_s table_s cpu_s MiB
for t in $transports; do
    for n in $sizes; do
        seg=$((2 * (n - 1) < 32 ? 2 * (n - 1) : 32))
        if [ "$t" = shm ] && [ $((n * seg)) -gt $((avail_mib / 2)) ]; then
            echo "# shm $n ranks skipped: its rings need $((n * seg)) MiB"
            continue
        fi
        for r in $(seq "$runs"); do
            out="$tmp/out.$t.$n.$r"
            echo 0 >"$tmp/peak"
            (peak=0; while sleep 0.2; do
                 m=$(ps -C drv -o rss= 2>/dev/null | awk '{s += $1} END {print int(s / 1024)}')
                 [ "${m:-0}" -gt "$peak" ] && peak=$m && echo "$peak" >"$tmp/peak"
             done) &
            mon=$!
            if ! /usr/bin/time -f "CPU %U %S" -o "$tmp/cpu" build/weftrun -n "$n" --no-prefix \
                --timeout 600 -x WEFT_TRANSPORT="$t" -x WEFT_TIMEOUT_MS=600000 \
                -x WEFT_DEBUG=INFO -x WEFT_DEBUG_SUBSYS=BOOT ${extra[@]+"${extra[@]}"} "$tmp/drv" \
                >"$out" 2>&1; then
                kill "$mon" 2>/dev/null || true
                echo "$t $n ranks, run $r failed:" >&2; tail -5 "$out" >&2; exit 1
            fi
            kill "$mon" 2>/dev/null || true
            wait "$mon" 2>/dev/null || true
            awk -v t="$t" -v n="$n" -v r="$r" -v peak="$(cat "$tmp/peak")" \
                -v cpu="$(awk '/^CPU/ {print $2 + $3}' "$tmp/cpu")" '
                $1 == "STAMP" { k++; if (min0 == "" || $3 < min0) min0 = $3
                                if ($3 > max0) max0 = $3; if ($4 > max1) max1 = $4
                                if ($2 == 0) root = $4 - $3 }
                / weft INFO bootstrap: [0-9]+ ranks joined in / {
                    for (i = 1; i <= NF; i++) { if ($i == "in" && $(i - 1) == "joined") join = $(i + 1)
                                                if ($i == "in" && $(i - 1) == "each") table = $(i + 1) } }
                END { if (k != n) { print "only " k " of " n " ranks stamped" > "/dev/stderr"; exit 1 }
                      printf "%-5s %5d %3d %8.3f %8.3f %8.3f %8.3f %8.3f %8.2f %7d\n", t, n, r,
                             max0 - min0, max1 - max0, root, join / 1e3, table / 1e3, cpu, peak }' "$out"
        done
    done
done | tee "$tmp/table"
echo "# medians"
printf "%-5s %5s %8s %8s %8s %8s %8s %8s\n" tp ranks spawn_s job_s root_s join_s table_s cpu_s
awk '!/^#/ && NF == 10 { key = $1 " " $2; keys[key] = 1
                         for (c = 4; c <= 9; c++) v[key, c, ++cnt[key, c]] = $c }
     END { for (key in keys) { split(key, kk, " "); line = sprintf("%-5s %5d", kk[1], kk[2])
           for (c = 4; c <= 9; c++) { m = cnt[key, c]; for (i = 1; i <= m; i++) a[i] = v[key, c, i]
               for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
               line = line sprintf(" %8.3f", a[int((m + 1) / 2)]) }
           print line } }' "$tmp/table" | sort -k1,1 -k2,2n
