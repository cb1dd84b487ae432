#!/usr/bin/env bash
# weft's all_reduce_perf beside Open MPI's MPI_Allreduce over its TCP BTL
# (default malloc and "best" malloc tunables), on loopback, same session;
# plus iperf3 single-stream loopback bandwidth as the ceiling.  Each
# configuration runs REPS times (default 3), interleaved, and every figure
# is the median over those runs: one run on these VMs can be 30% off.
# Usage: bench/compare_tcp.sh [ranks...]   (default: 2 4)
set -euo pipefail
cd "$(dirname "$0")/.."
ranks=("${@:-2}")
[ $# -gt 0 ] || ranks=(2 4)
mpicc -O2 bench/mpi_coll_perf.c -o build/mpi_coll_perf
SZ=(-b 8 -e 64M -f 2 -n 20 -w 5 -c 0)
TUN=GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967295:glibc.malloc.trim_threshold=4294967295
MPI=(mpirun --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,tcp
     --mca btl_tcp_if_include lo)
rows() { awk '/^ *[0-9]+ +[0-9]+ /{print $1, $6, $8}'; }
# median over the runs of column $3 (2 = time, 3 = busbw) at size $2
pick() { cat "$1".* | awk -v s="$2" '$1==s{print $'"$3"'}' | sort -g | awk '{v[NR]=$1} END{print v[int((NR+1)/2)]}'; }
REPS=${REPS:-3}
tmp=$(mktemp -d)
for rep in $(seq "$REPS"); do
    for n in "${ranks[@]}"; do
        build/weftrun -n "$n" -q --no-prefix build/all_reduce_perf "${SZ[@]}" | rows >"$tmp/weft$n.$rep"
        "${MPI[@]}" -np "$n" build/mpi_coll_perf -C allreduce "${SZ[@]}" | rows >"$tmp/ompi$n.$rep"
        "${MPI[@]}" -np "$n" -x "$TUN" build/mpi_coll_perf -C allreduce "${SZ[@]}" | rows >"$tmp/best$n.$rep"
    done
done
ceiling="n/a"
if command -v iperf3 >/dev/null; then
    iperf3 -s -1 -B 127.0.0.1 -p 5299 >/dev/null 2>&1 &
    sleep 0.5
    ceiling=$(iperf3 -c 127.0.0.1 -p 5299 -t 3 -J | awk -F'[:,]' '/"bits_per_second"/{b=$2} END{printf "%.2f GB/s", b/8e9}')
fi
echo "| ranks | size | weft time (us) | weft busbw (GB/s) | Open MPI TCP busbw: default / best | weft / best |"
echo "|---|---|---|---|---|---|"
for n in "${ranks[@]}"; do
    for s in 8 1024 1048576 16777216 67108864; do
        wt=$(pick "$tmp/weft$n" "$s" 2); wb=$(pick "$tmp/weft$n" "$s" 3)
        ot=$(pick "$tmp/ompi$n" "$s" 2); ob=$(pick "$tmp/ompi$n" "$s" 3)
        bt=$(pick "$tmp/best$n" "$s" 2); bb=$(pick "$tmp/best$n" "$s" 3)
        if [ "$s" -le 1024 ]; then
            # latency-bound: compare times (lower is better), ratio = best peer time / weft time
            best=$(awk -v a="$ot" -v b="$bt" 'BEGIN{print (a<b)?a:b}')
            r=$(awk -v w="$wt" -v b="$best" 'BEGIN{printf "%.2fx (time)", b/w}')
            echo "| $n | $s B | $wt | $wb | ${ot} us / ${bt} us | $r |"
        else
            best=$(awk -v a="$ob" -v b="$bb" 'BEGIN{print (a>b)?a:b}')
            r=$(awk -v w="$wb" -v b="$best" 'BEGIN{printf "%.2fx", w/b}')
            echo "| $n | $((s / 1048576)) MiB | $wt | $wb | $ob / $bb | $r |"
        fi
    done
done
echo
echo "TCP loopback ceiling (iperf3, 1 stream): $ceiling"
rm -rf "$tmp"
