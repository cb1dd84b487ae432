/*
 * relay.c - the cluster harness's delaying switch: a userspace learning
 * switch between veth ports (AF_PACKET raw sockets) that holds every frame
 * for a fixed time before forwarding it.  It exists because this kernel's tc
 * has rate limits (htb, tbf) but no netem, so tc cannot add latency.
 *
 * Runs inside the harness's switch namespace:  relay --delay-us 200 p0 p1 p2
 * Test tooling only: built by `make check`, never installed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <linux/if_packet.h>
#include <linux/virtio_net.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define RELAY_MAX_PORTS 64
#define RELAY_MAX_MACS 1024
#define RELAY_RX_BATCH 64 /* frames read from one port per wakeup, for fairness */
/* One received frame: the virtio-net header that PACKET_VNET_HDR puts in
 * front (it carries the GSO and checksum state, so 64 KiB TSO segments pass
 * whole and need no checksum here), then the Ethernet frame. */
#define RELAY_VNET_BYTES ((int)sizeof(struct virtio_net_hdr))
#define RELAY_FRAME_MAX (256u << 10)

/* A frame waiting in a port's queue; owned by that queue until sent. */
struct frame {
    struct frame *next;
    uint64_t due_ns; /* CLOCK_MONOTONIC time it may leave */
    uint32_t len;    /* bytes of data: vnet header + Ethernet frame */
    unsigned char data[];
};

/* One switch port.  Invariants: head..tail is in due_ns order (every frame
 * gets the same delay and the clock is monotonic), queued is the sum of
 * their len, queued <= queue_cap; blocked means the socket said EAGAIN and
 * head waits for POLLOUT. */
struct port {
    const char *name;
    int ifindex;
    int fd;
    struct frame *head, *tail;
    size_t queued, queued_peak; /* bytes */
    int blocked;
    uint64_t rx_frames, rx_bytes, tx_frames, tx_bytes;
    uint64_t drop_queue; /* frames refused because this port's queue was full */
    uint64_t drop_tx;    /* frames the kernel refused (qdisc full, link down) */
    uint64_t drop_trunc; /* frames larger than RELAY_FRAME_MAX */
    uint64_t drop_kernel; /* frames the socket's receive buffer lost */
};

/* The learning table: source MAC -> port it was last seen on. */
struct mac_entry {
    unsigned char mac[ETH_ALEN];
    int port;
};

static struct port ports[RELAY_MAX_PORTS];
static int nports;
static struct mac_entry macs[RELAY_MAX_MACS];
static int nmacs, mac_next_evict;
static uint64_t delay_ns;
static size_t queue_cap = 8u << 20;
static volatile sig_atomic_t stop_flag, stats_flag;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("relay: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void on_signal(int sig)
{
    if (sig == SIGUSR1)
        stats_flag = 1;
    else
        stop_flag = 1;
}

static void print_stats(void)
{
    for (int i = 0; i < nports; i++) {
        struct port *p = &ports[i];
        struct tpacket_stats ks;
        socklen_t len = sizeof(ks);
        /* Reading resets the kernel's counters: accumulate them. */
        if (getsockopt(p->fd, SOL_PACKET, PACKET_STATISTICS, &ks, &len) == 0)
            p->drop_kernel += ks.tp_drops;
        fprintf(stderr,
                "relay: %s: rx %" PRIu64 " frames %" PRIu64 " bytes, tx %" PRIu64 " frames %" PRIu64
                " bytes, queue peak %zu bytes, dropped: queue-full %" PRIu64 " tx %" PRIu64
                " oversize %" PRIu64 " socket %" PRIu64 "\n",
                p->name, p->rx_frames, p->rx_bytes, p->tx_frames, p->tx_bytes, p->queued_peak,
                p->drop_queue, p->drop_tx, p->drop_trunc, p->drop_kernel);
    }
    fflush(stderr);
}

static int port_open(struct port *p, const char *name)
{
    p->name = name;
    p->ifindex = (int)if_nametoindex(name);
    if (p->ifindex == 0)
        die("no interface '%s' in this network namespace (the harness runs relay inside its "
            "switch namespace: ip netns exec NS relay ...)",
            name);
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
    if (fd < 0) {
        if (errno == EPERM || errno == EACCES)
            die("cannot open an AF_PACKET socket: %s (needs root or CAP_NET_RAW)",
                strerror(errno));
        die("socket(AF_PACKET): %s", strerror(errno));
    }
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name);
    if (ioctl(fd, SIOCGIFFLAGS, &ifr) != 0)
        die("%s: SIOCGIFFLAGS: %s", name, strerror(errno));
    if (!(ifr.ifr_flags & IFF_UP))
        die("interface '%s' is down (ip link set %s up)", name, name);
    int one = 1, bufsz = 8 << 20;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof(one)) != 0)
        die("%s: PACKET_VNET_HDR: %s", name, strerror(errno));
    /* Our own transmissions would come back as PACKET_OUTGOING; older
     * kernels lack the option, and rx_port() filters them too. */
    (void)setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof(one));
    /* FORCE variants go past rmem_max/wmem_max (we are root); plain ones
     * are the fallback. */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bufsz, sizeof(bufsz)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsz, sizeof(bufsz));
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bufsz, sizeof(bufsz)) != 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsz, sizeof(bufsz));
    struct sockaddr_ll sll;
    memset(&sll, 0, sizeof(sll));
    sll.sll_family = AF_PACKET;
    sll.sll_protocol = htons(ETH_P_ALL);
    sll.sll_ifindex = p->ifindex;
    if (bind(fd, (struct sockaddr *)&sll, sizeof(sll)) != 0)
        die("%s: bind: %s", name, strerror(errno));
    /* A switch port sees frames for every MAC, not only its own. */
    struct packet_mreq mr;
    memset(&mr, 0, sizeof(mr));
    mr.mr_ifindex = p->ifindex;
    mr.mr_type = PACKET_MR_PROMISC;
    if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &mr, sizeof(mr)) != 0)
        die("%s: promiscuous mode: %s", name, strerror(errno));
    p->fd = fd;
    return 0;
}

/* Records that `mac` lives behind port `pi`; a full table forgets the
 * oldest entry (a test network has a handful of hosts). */
static void mac_learn(const unsigned char *mac, int pi)
{
    if (mac[0] & 1)
        return; /* a multicast source is bogus; never learn it */
    for (int i = 0; i < nmacs; i++)
        if (memcmp(macs[i].mac, mac, ETH_ALEN) == 0) {
            macs[i].port = pi;
            return;
        }
    int slot = nmacs < RELAY_MAX_MACS ? nmacs++ : mac_next_evict++ % RELAY_MAX_MACS;
    memcpy(macs[slot].mac, mac, ETH_ALEN);
    macs[slot].port = pi;
}

static int mac_lookup(const unsigned char *mac)
{
    if (mac[0] & 1)
        return -1; /* broadcast and multicast: flood */
    for (int i = 0; i < nmacs; i++)
        if (memcmp(macs[i].mac, mac, ETH_ALEN) == 0)
            return macs[i].port;
    return -1;
}

static void enqueue(struct port *out, const unsigned char *buf, uint32_t len, uint64_t due)
{
    if (out->queued + len > queue_cap) {
        out->drop_queue++;
        return;
    }
    struct frame *f = malloc(sizeof(*f) + len);
    if (f == NULL) {
        out->drop_queue++;
        return;
    }
    f->next = NULL;
    f->due_ns = due;
    f->len = len;
    memcpy(f->data, buf, len);
    if (out->tail)
        out->tail->next = f;
    else
        out->head = f;
    out->tail = f;
    out->queued += len;
    if (out->queued > out->queued_peak)
        out->queued_peak = out->queued;
}

/* Reads what port pi has received, learns sources and queues each frame on
 * its way out, due delay_ns from now. */
static void rx_port(int pi)
{
    static unsigned char buf[RELAY_FRAME_MAX];
    struct port *in = &ports[pi];
    for (int n = 0; n < RELAY_RX_BATCH; n++) {
        struct sockaddr_ll from;
        socklen_t fromlen = sizeof(from);
        ssize_t got = recvfrom(in->fd, buf, sizeof(buf), MSG_TRUNC, (struct sockaddr *)&from,
                               &fromlen);
        if (got < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
                return;
            die("%s: receive: %s", in->name, strerror(errno));
        }
        if (from.sll_pkttype == PACKET_OUTGOING)
            continue;
        if ((size_t)got > sizeof(buf)) {
            in->drop_trunc++;
            continue;
        }
        if (got < RELAY_VNET_BYTES + ETH_HLEN)
            continue; /* runt: nothing to switch on */
        in->rx_frames++;
        in->rx_bytes += (uint64_t)got - RELAY_VNET_BYTES;
        const unsigned char *eth = buf + RELAY_VNET_BYTES;
        mac_learn(eth + ETH_ALEN, pi);
        int to = mac_lookup(eth);
        uint64_t due = now_ns() + delay_ns;
        if (to == pi)
            continue; /* the destination is behind the port it came from */
        for (int o = 0; o < nports; o++)
            if (o != pi && (to < 0 || o == to))
                enqueue(&ports[o], buf, (uint32_t)got, due);
    }
}

/* Sends every frame of port p that is due by `now`, in order; stops at the
 * first one the socket cannot take yet. */
static void tx_port(struct port *p, uint64_t now)
{
    while (p->head && p->head->due_ns <= now) {
        struct frame *f = p->head;
        ssize_t put = send(p->fd, f->data, f->len, 0);
        if (put < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            p->blocked = 1;
            return;
        }
        if (put < 0 && errno == EINTR)
            continue;
        if (put < 0) {
            p->drop_tx++; /* ENOBUFS: the qdisc dropped it, as a full link would */
        } else {
            p->tx_frames++;
            p->tx_bytes += f->len - RELAY_VNET_BYTES;
        }
        p->head = f->next;
        if (p->head == NULL)
            p->tail = NULL;
        p->queued -= f->len;
        free(f);
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: relay [--delay-us US] [--queue-bytes N] IFACE IFACE...\n"
               "  a learning switch between the given interfaces (AF_PACKET, needs root) that\n"
               "  holds every frame US microseconds (default 0) before forwarding it; each\n"
               "  output port queues at most N bytes (default 8388608), more is dropped and\n"
               "  counted.  SIGUSR1 prints the counters; SIGTERM/SIGINT print them and exit.\n");
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {{"delay-us", required_argument, NULL, 'd'},
                                             {"queue-bytes", required_argument, NULL, 'q'},
                                             {"help", no_argument, NULL, 'h'},
                                             {NULL, 0, NULL, 0}};
    int c;
    char *end;
    while ((c = getopt_long(argc, argv, "d:q:h", longopts, NULL)) != -1) {
        switch (c) {
        case 'd': {
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || *end || end == optarg || v > 10000000ull)
                die("--delay-us wants microseconds, 0..10000000 (got '%s')", optarg);
            delay_ns = v * 1000u;
            break;
        }
        case 'q': {
            errno = 0;
            unsigned long long v = strtoull(optarg, &end, 10);
            if (errno || *end || end == optarg || v < RELAY_FRAME_MAX || v > (1ull << 34))
                die("--queue-bytes wants %u..2^34 (got '%s')", RELAY_FRAME_MAX, optarg);
            queue_cap = (size_t)v;
            break;
        }
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (argc - optind < 2) {
        usage(stderr);
        return 2;
    }
    if (argc - optind > RELAY_MAX_PORTS)
        die("at most %d ports", RELAY_MAX_PORTS);
    for (int i = optind; i < argc; i++)
        port_open(&ports[nports++], argv[i]);

    /* The delay is the point: wake within a microsecond of a frame's due
     * time instead of the default 50 us timer slack. */
    (void)prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
    /* Signals stay blocked except inside ppoll, so a stop request cannot
     * fall between the flag check and the sleep. */
    sigset_t block, waitmask;
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGUSR1);
    sigprocmask(SIG_BLOCK, &block, &waitmask);
    sigdelset(&waitmask, SIGTERM);
    sigdelset(&waitmask, SIGINT);
    sigdelset(&waitmask, SIGUSR1);
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR1, &sa, NULL);

    fprintf(stderr, "relay: ready: %d ports, delay %" PRIu64 " us, queue %zu bytes per port\n",
            nports, delay_ns / 1000u, queue_cap);
    fflush(stderr);

    struct pollfd pfd[RELAY_MAX_PORTS];
    while (!stop_flag) {
        if (stats_flag) {
            stats_flag = 0;
            print_stats();
        }
        uint64_t now = now_ns(), next = UINT64_MAX;
        for (int i = 0; i < nports; i++) {
            struct port *p = &ports[i];
            if (!p->blocked)
                tx_port(p, now);
            if (!p->blocked && p->head && p->head->due_ns < next)
                next = p->head->due_ns;
            pfd[i].fd = p->fd;
            pfd[i].events = (short)(POLLIN | (p->blocked ? POLLOUT : 0));
            pfd[i].revents = 0;
        }
        struct timespec ts, *tsp = NULL;
        if (next != UINT64_MAX) {
            uint64_t wait = next > now ? next - now : 0;
            ts.tv_sec = (time_t)(wait / 1000000000u);
            ts.tv_nsec = (long)(wait % 1000000000u);
            tsp = &ts;
        }
        int ready = ppoll(pfd, (nfds_t)nports, tsp, &waitmask);
        if (ready < 0) {
            if (errno == EINTR)
                continue;
            die("ppoll: %s", strerror(errno));
        }
        for (int i = 0; i < nports && ready > 0; i++) {
            struct port *p = &ports[i];
            if (pfd[i].revents & (POLLERR | POLLHUP | POLLNVAL)) {
                int err = 0;
                socklen_t len = sizeof(err);
                getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                /* ENETDOWN: the link went down or away (a teardown). */
                print_stats();
                die("%s: socket error: %s", p->name, err ? strerror(err) : "hang-up");
            }
            if (pfd[i].revents & POLLOUT)
                p->blocked = 0;
            if (pfd[i].revents & POLLIN)
                rx_port(i);
        }
    }
    print_stats();
    for (int i = 0; i < nports; i++) {
        while (ports[i].head) {
            struct frame *f = ports[i].head;
            ports[i].head = f->next;
            free(f);
        }
        close(ports[i].fd);
    }
    return 0;
}
