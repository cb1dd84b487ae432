/*
 * sock.h - socket plumbing shared by the bootstrap and the tcp transport:
 * addresses, interface choice (NCCL_SOCKET_IFNAME syntax), non-blocking
 * listen/connect, and deadline-bounded blocking I/O.
 */
#ifndef WEFT_SOCK_H
#define WEFT_SOCK_H

#include <netinet/in.h>
#include <stdbool.h>
#include <sys/socket.h>

#include "base/internal.h"

union weft_sockaddr {
    struct sockaddr sa;
    struct sockaddr_in in;
    struct sockaddr_in6 in6;
    struct sockaddr_storage ss;
};

socklen_t weft_sock_len(const union weft_sockaddr *a) WEFT_HIDDEN;
/* "host:port", "[v6addr]:port"; host may be a name.  Clear error text. */
weft_status_t weft_sock_parse(const char *str, union weft_sockaddr *out) WEFT_HIDDEN;
/* "1.2.3.4:5678" / "[::1]:5678" into buf; returns buf. */
const char *weft_sock_str(const union weft_sockaddr *a, char *buf, size_t len) WEFT_HIDDEN;
bool weft_sock_is_loopback(const union weft_sockaddr *a) WEFT_HIDDEN;
/* NCCL_SOCKET_IFNAME syntax: "eth,ib" prefixes, "^docker" excludes,
 * "=eth0" exact names, "^=a,b" exact excludes. */
bool weft_ifname_match(const char *spec, const char *ifname) WEFT_HIDDEN;
/* The local address to listen on (port 0): the first up interface that
 * WEFT_SOCKET_IFNAME accepts when it is set; otherwise the interface that
 * routes toward `toward` (when given); otherwise the first up non-loopback,
 * non-docker interface; otherwise loopback.  ifname gets its name. */
weft_status_t weft_sock_pick_iface(const union weft_sockaddr *toward, union weft_sockaddr *out,
                                   char *ifname, size_t ifname_len) WEFT_HIDDEN;
/* Listen queue of every weft listener; the kernel caps it at somaxconn.
 * A full queue drops a connector's SYN without a word, and TCP sends it
 * again only after 1 s: strangers must not fill it. */
#define WEFT_LISTEN_BACKLOG 4096
/* A connect with no answer within this window (ms) is started afresh:
 * 20 ms, then 40, ... up to 1.3 s for long round trips.  A listener that
 * drains a flood has room again within milliseconds. */
static inline int weft_sock_connect_window_ms(int unanswered)
{
    return 20 << (unanswered < 6 ? unanswered : 6);
}
/* Non-blocking, close-on-exec listening socket on *addr (port 0 picks one;
 * the bound address is written back). */
weft_status_t weft_sock_listen(union weft_sockaddr *addr, int *fd) WEFT_HIDDEN;
/* Non-blocking accept; *fd = -1 when nothing is waiting. */
weft_status_t weft_sock_accept(int lfd, int *fd) WEFT_HIDDEN;
/* Starts a non-blocking connect; the fd becomes writable when done
 * (check with weft_sock_connect_finish). */
weft_status_t weft_sock_connect_start(const union weft_sockaddr *addr, int *fd) WEFT_HIDDEN;
weft_status_t weft_sock_connect_finish(int fd) WEFT_HIDDEN; /* OK, INPROGRESS or error */
/* Connects, retrying refused connections (the peer may not listen yet)
 * until deadline_ns. */
weft_status_t weft_sock_connect(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd)
    WEFT_HIDDEN;
/* Whole-buffer I/O on a non-blocking fd, waiting with poll until
 * deadline_ns (0: no deadline).  EOF or reset -> WEFT_ERR_REMOTE. */
weft_status_t weft_sock_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
    WEFT_HIDDEN;
weft_status_t weft_sock_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns) WEFT_HIDDEN;
/* TCP_NODELAY, keepalive, and send/receive buffers of bufsize (0: leave). */
void weft_sock_tune(int fd, int bufsize) WEFT_HIDDEN;

#endif /* WEFT_SOCK_H */
