#!/bin/sh
# Inside the guests (2-guest shape): perftest's ib_write_lat, ib_send_lat and
# ib_write_bw between rxe0 of guest 0 (server) and guest 1 (client), then
# weft's sendrecv_perf over verbs on the same pair, so the ratios come from
# one run on one emulated link.  Prints "perf NAME VALUE UNIT" lines for
# run.sh to compare.
gid=$(for t in /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/*; do
          [ "$(cat "$t" 2>/dev/null)" = "RoCE v2" ] && echo "${t##*/}"
      done | sort -n | while read -r i; do
          case "$(cat /sys/class/infiniband/rxe0/ports/1/gids/"$i")" in
          0000:0000:0000:0000:0000:ffff:*) echo "$i"; break ;;
          esac
      done)
: "${PERF_ITERS:=500}"
pt() { # NAME perftest-args...: server on guest 0, client on guest 1
    name=$1
    shift
    if [ "$WEFT_RXE_GUEST" = 0 ]; then
        timeout 120 "$@" -d rxe0 -x "$gid" -F >/tmp/pt.out 2>&1
    else
        sleep 3 # the server listens first
        tries=0
        until timeout 120 "$@" -d rxe0 -x "$gid" -F 10.99.0.1 >/tmp/pt.out 2>&1; do
            tries=$((tries + 1))
            [ $tries -lt 3 ] || break
            sleep 2
        done
        cat /tmp/pt.out
    fi
    # Wait for both ends before the next test starts.
    sleep 2
}
pt write_lat ib_write_lat -s 8 -n "$PERF_ITERS"
pt send_lat ib_send_lat -s 8 -n "$PERF_ITERS"
pt write_bw ib_write_bw -s 4194304 -n 20
pt write_bw_bidir ib_write_bw -s 4194304 -n 20 -b
r() { WEFT_TRANSPORT=verbs sh "$(dirname "$0")/ranks.sh" 1 build/sendrecv_perf -c 1 "$@"; }
r -b 8 -e 8 -n "$PERF_ITERS" -w 5
r -b 4M -e 4M -n 20 -w 5
