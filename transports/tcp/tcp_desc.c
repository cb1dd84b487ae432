/*
 * tcp_desc.c - the tcp transport as the registry sees it: the base
 * transport (opened first, reaches every other rank), its default cost
 * and its settings.
 */
#include "transports/tcp/tcp.h"

static const struct weft_param_desc tcp_params[] = {
    {"WEFT_SOCKET_NSTREAMS", "int", "1", "TCP connections per peer and direction (1-16)", NULL},
    {"WEFT_SOCKET_BUFSIZE", "int", "4194304", "TCP socket send/receive buffer bytes (0: kernel's)", NULL},
};

static bool tcp_can_reach(const struct weft_transport_pair *pair)
{
    return !pair->self;
}

/* Where weft_get_unique_id would listen. */
static void tcp_status(FILE *out)
{
    union weft_sockaddr a;
    char ifname[64], buf[96];
    if (weft_sock_pick_iface(NULL, &a, ifname, sizeof(ifname)) == WEFT_OK)
        fprintf(out, "  tcp   yes: weft_get_unique_id would listen on %s (%s)\n",
                weft_sock_str(&a, buf, sizeof(buf)), ifname);
    else
        fprintf(out, "  tcp   no: %s\n", weft_thread_last_error());
}

/* Loopback 8 B ping-pong 9-14 us one way, iperf3 14 Gbit/s on one stream
 * (docs/MEASURED, the development machine). */
const struct weft_transport_desc weft_tcp_desc = {
    .name = "tcp", .flags = WEFT_TP_BASE, .priority = 30,
    .can_reach = tcp_can_reach,
    .alpha = 12e-6, .beta = 1.0 / 1.75e9,
    WEFT_TRANSPORT_PARAMS(tcp_params),
    .status = tcp_status,
    .ops = &weft_tcp_ops,
};
