#!/bin/sh
# Runs in each guest (started by the image's init, see guest.sh): sets up
# the network and the rxe devices for the shape, then runs the command the
# host left in /weft-out/cmd from the repository root.
#   1 guest:  veth va (10.88.0.1) <-> vb (10.88.0.2), rxea on va, rxeb on vb,
#             with policy routing so that traffic between the two addresses
#             really crosses the veth instead of the local table's loopback.
#   2 guests: eth0 10.99.0.<g+1>/24 on the wire between the guests, rxe0.
g=$1
n=$(cat /weft-out/guests)
cd "$(dirname "$0")/../.." || exit 2
hostname "weft-guest$g"
ip link set lo up
if [ "$n" = 1 ]; then
    ip link add va type veth peer name vb
    ip addr add 10.88.0.1/24 dev va
    ip addr add 10.88.0.2/24 dev vb
    ip link set va up
    ip link set vb up
    for i in all va vb; do
        sysctl -qw net.ipv4.conf.$i.rp_filter=0 net.ipv4.conf.$i.accept_local=1
    done
    ip rule add pref 10 oif va lookup 100
    ip route add 10.88.0.2 dev va src 10.88.0.1 table 100
    ip rule add pref 11 oif vb lookup 101
    ip route add 10.88.0.1 dev vb src 10.88.0.2 table 101
    ip rule add pref 1000 lookup local
    ip rule del pref 0 lookup local
    rdma link add rxea type rxe netdev va
    rdma link add rxeb type rxe netdev vb
else
    # The initrd's udev renamed the virtio NIC; give it the name ranks.sh uses.
    for i in /sys/class/net/*; do
        [ "${i##*/}" = lo ] || ip link set "${i##*/}" name eth0
    done
    ip link set eth0 up
    ip addr add "10.99.0.$((g + 1))/24" dev eth0
    rdma link add rxe0 type rxe netdev eth0
fi
export WEFT_RXE_GUEST="$g" WEFT_RXE_GUESTS="$n"
WEFT_SECRET=$(cat /weft-out/secret)
export WEFT_SECRET
echo "== guest $g of $n: $(uname -r), $(nproc) cpus"
rdma link show
eval "$(cat /weft-out/cmd)"
