/*
 * sock.c - socket plumbing for the bootstrap and the tcp transport:
 * address parsing and printing, interface choice, non-blocking listen,
 * accept and connect, and whole-buffer I/O bounded by a deadline.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/sock.h"

#define CONNECT_BACKOFF_MIN_NS 1000000ull    /* 1 ms */
#define CONNECT_BACKOFF_MAX_NS 100000000ull  /* 100 ms */

socklen_t weft_sock_len(const union weft_sockaddr *a)
{
    switch (a->sa.sa_family) {
    case AF_INET: return sizeof(struct sockaddr_in);
    case AF_INET6: return sizeof(struct sockaddr_in6);
    default: return 0; /* makes bind/connect fail with EINVAL, never guess */
    }
}

const char *weft_sock_str(const union weft_sockaddr *a, char *buf, size_t len)
{
    char host[INET6_ADDRSTRLEN];
    if (len == 0)
        return buf;
    if (a->sa.sa_family == AF_INET && inet_ntop(AF_INET, &a->in.sin_addr, host, sizeof(host)))
        snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(a->in.sin_port));
    else if (a->sa.sa_family == AF_INET6 &&
             inet_ntop(AF_INET6, &a->in6.sin6_addr, host, sizeof(host)))
        snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(a->in6.sin6_port));
    else
        snprintf(buf, len, "<address family %d>", (int)a->sa.sa_family);
    return buf;
}

bool weft_sock_is_loopback(const union weft_sockaddr *a)
{
    if (a->sa.sa_family == AF_INET)
        return (ntohl(a->in.sin_addr.s_addr) >> 24) == 127;
    if (a->sa.sa_family == AF_INET6) {
        const struct in6_addr *x = &a->in6.sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(x))
            return true;
        return IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127;
    }
    return false;
}

/* Decimal 1..65535, nothing else (no sign, no spaces, no service names). */
static bool parse_port(const char *s, uint16_t *port)
{
    unsigned long v = 0;
    if (*s == '\0')
        return false;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return false;
        v = v * 10 + (unsigned long)(*s - '0');
        if (v > 65535)
            return false;
    }
    if (v == 0)
        return false;
    *port = (uint16_t)v;
    return true;
}

weft_status_t weft_sock_parse(const char *str, union weft_sockaddr *out)
{
    char host[256];
    const char *port_str;
    bool bracketed = false;

    if (str == NULL)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG, "socket address is NULL");
    memset(out, 0, sizeof(*out));
    if (str[0] == '[') {
        const char *end = strchr(str, ']');
        if (end == NULL)
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "bad socket address \"%s\": missing ']'", str);
        if (end[1] != ':')
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "bad socket address \"%s\": expected \":port\" after ']'", str);
        size_t n = (size_t)(end - str - 1);
        if (n == 0 || n >= sizeof(host))
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "bad socket address \"%s\": bad IPv6 address length", str);
        memcpy(host, str + 1, n);
        host[n] = '\0';
        port_str = end + 2;
        bracketed = true;
    } else {
        const char *colon = strrchr(str, ':');
        if (colon == NULL)
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "bad socket address \"%s\": expected host:port", str);
        if (memchr(str, ':', (size_t)(colon - str)) != NULL)
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "bad socket address \"%s\": write IPv6 addresses as [addr]:port",
                              str);
        size_t n = (size_t)(colon - str);
        if (n == 0 || n >= sizeof(host))
            return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                              "bad socket address \"%s\": empty or overlong host", str);
        memcpy(host, str, n);
        host[n] = '\0';
        port_str = colon + 1;
    }
    uint16_t port;
    if (!parse_port(port_str, &port))
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "bad socket address \"%s\": port \"%s\" is not a number in 1..65535",
                          str, port_str);

    struct addrinfo hints = {.ai_socktype = SOCK_STREAM};
    hints.ai_family = bracketed ? AF_INET6 : AF_UNSPEC;
    hints.ai_flags = bracketed ? AI_NUMERICHOST : 0;
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0)
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "bad socket address \"%s\": cannot resolve \"%s\": %s", str, host,
                          gai_strerror(rc));
    /* Prefer IPv4, as the interface choice does, so a name that maps to
     * both reaches a listener picked by weft_sock_pick_iface. */
    const struct addrinfo *pick = NULL;
    for (const struct addrinfo *r = res; r; r = r->ai_next) {
        if (r->ai_family == AF_INET) {
            pick = r;
            break;
        }
        if (r->ai_family == AF_INET6 && pick == NULL)
            pick = r;
    }
    if (pick == NULL || pick->ai_addrlen > sizeof(*out)) {
        freeaddrinfo(res);
        return weft_error(NULL, WEFT_ERR_INVALID_ARG,
                          "bad socket address \"%s\": \"%s\" has no IPv4 or IPv6 address", str,
                          host);
    }
    memcpy(out, pick->ai_addr, pick->ai_addrlen);
    freeaddrinfo(res);
    if (out->sa.sa_family == AF_INET)
        out->in.sin_port = htons(port);
    else
        out->in6.sin6_port = htons(port);
    return WEFT_OK;
}

bool weft_ifname_match(const char *spec, const char *ifname)
{
    if (spec == NULL || *spec == '\0')
        return true;
    bool exclude = false, exact = false;
    if (*spec == '^') {
        exclude = true;
        spec++;
    }
    if (*spec == '=') {
        exact = true;
        spec++;
    }
    bool hit = false;
    size_t namelen = strlen(ifname);
    while (*spec && !hit) {
        size_t n = strcspn(spec, ",");
        /* An empty entry ("eth,,ib", a trailing comma) names nothing; as a
         * prefix it would otherwise match every interface. */
        if (n > 0) {
            if (exact)
                hit = n == namelen && strncmp(spec, ifname, n) == 0;
            else
                hit = n <= namelen && strncmp(spec, ifname, n) == 0;
        }
        spec += n;
        if (*spec == ',')
            spec++;
    }
    return exclude ? !hit : hit;
}

static bool is_v6_link_local(const struct sockaddr *sa)
{
    return sa->sa_family == AF_INET6 &&
           IN6_IS_ADDR_LINKLOCAL(&((const struct sockaddr_in6 *)sa)->sin6_addr);
}

static void copy_ifaddr(const struct ifaddrs *ifa, union weft_sockaddr *out, char *ifname,
                        size_t ifname_len)
{
    memset(out, 0, sizeof(*out));
    if (ifa->ifa_addr->sa_family == AF_INET)
        memcpy(&out->in, ifa->ifa_addr, sizeof(out->in));
    else
        memcpy(&out->in6, ifa->ifa_addr, sizeof(out->in6));
    out->in.sin_port = 0; /* same offset for both families */
    if (ifname != NULL && ifname_len > 0)
        snprintf(ifname, ifname_len, "%s", ifa->ifa_name);
}

enum pick_rule { PICK_SPEC, PICK_DEFAULT, PICK_LOOPBACK };

/* First usable address of the rule, IPv4 before IPv6. */
static const struct ifaddrs *pick_from(const struct ifaddrs *list, enum pick_rule rule,
                                       const char *spec)
{
    static const int families[] = {AF_INET, AF_INET6};
    for (size_t f = 0; f < WEFT_ARRAY_SIZE(families); f++) {
        for (const struct ifaddrs *ifa = list; ifa; ifa = ifa->ifa_next) {
            if (ifa->ifa_addr == NULL || ifa->ifa_addr->sa_family != families[f] ||
                !(ifa->ifa_flags & IFF_UP) || is_v6_link_local(ifa->ifa_addr))
                continue;
            bool loop = (ifa->ifa_flags & IFF_LOOPBACK) != 0;
            bool ok = false;
            switch (rule) {
            case PICK_SPEC: ok = weft_ifname_match(spec, ifa->ifa_name); break;
            case PICK_DEFAULT: ok = !loop && strncmp(ifa->ifa_name, "docker", 6) != 0; break;
            case PICK_LOOPBACK: ok = loop; break;
            }
            if (ok)
                return ifa;
        }
    }
    return NULL;
}

static bool same_ip(const struct sockaddr *a, const union weft_sockaddr *b)
{
    if (a->sa_family != b->sa.sa_family)
        return false;
    if (a->sa_family == AF_INET)
        return ((const struct sockaddr_in *)a)->sin_addr.s_addr == b->in.sin_addr.s_addr;
    if (a->sa_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr, &b->in6.sin6_addr,
                      sizeof(struct in6_addr)) == 0;
    return false;
}

/* The local address the kernel would send from toward `toward`: connect a
 * UDP socket (this sends nothing) and read its name back. */
static bool route_source(const union weft_sockaddr *toward, union weft_sockaddr *src)
{
    union weft_sockaddr dst = *toward;
    if (dst.in.sin_port == 0)
        dst.in.sin_port = htons(9); /* connect() wants a port; nothing is sent */
    int fd = socket(dst.sa.sa_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    socklen_t len = sizeof(*src);
    bool ok = connect(fd, &dst.sa, weft_sock_len(&dst)) == 0 &&
              getsockname(fd, &src->sa, &len) == 0;
    close(fd);
    return ok;
}

weft_status_t weft_sock_pick_iface(const union weft_sockaddr *toward, union weft_sockaddr *out,
                                   char *ifname, size_t ifname_len)
{
    const char *spec = weft_param_str("WEFT_SOCKET_IFNAME");
    struct ifaddrs *list = NULL;
    if (getifaddrs(&list) != 0)
        return weft_error(NULL, WEFT_ERR_SYSTEM, "getifaddrs failed: %s", strerror(errno));

    weft_status_t st = WEFT_OK;
    const struct ifaddrs *ifa = NULL;
    if (*spec != '\0') {
        ifa = pick_from(list, PICK_SPEC, spec);
        if (ifa == NULL)
            st = weft_error(NULL, WEFT_ERR_INVALID_ARG,
                            "no up interface with an IPv4/IPv6 address matches "
                            "WEFT_SOCKET_IFNAME=\"%s\"",
                            spec);
        goto done;
    }
    union weft_sockaddr src;
    if (toward != NULL && route_source(toward, &src)) {
        src.in.sin_port = 0;
        *out = src;
        if (ifname != NULL && ifname_len > 0)
            snprintf(ifname, ifname_len, "?");
        for (const struct ifaddrs *i = list; i; i = i->ifa_next) {
            if (i->ifa_addr != NULL && same_ip(i->ifa_addr, &src)) {
                copy_ifaddr(i, out, ifname, ifname_len);
                break;
            }
        }
        goto done;
    }
    if (toward != NULL) {
        char buf[64];
        WEFT_INFO(WEFT_SUB_NET, "no route toward %s; choosing an interface without it",
                  weft_sock_str(toward, buf, sizeof(buf)));
    }
    ifa = pick_from(list, PICK_DEFAULT, NULL);
    if (ifa == NULL)
        ifa = pick_from(list, PICK_LOOPBACK, NULL);
    if (ifa == NULL) {
        /* No loopback interface listed (odd namespaces): 127.0.0.1 still
         * works wherever there is an IPv4 stack at all. */
        memset(out, 0, sizeof(*out));
        out->in.sin_family = AF_INET;
        out->in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (ifname != NULL && ifname_len > 0)
            snprintf(ifname, ifname_len, "lo");
    }
done:
    if (ifa != NULL)
        copy_ifaddr(ifa, out, ifname, ifname_len);
    freeifaddrs(list);
    return st;
}

void weft_sock_tune(int fd, int bufsize)
{
    int domain = 0, type = 0, one = 1;
    socklen_t len = sizeof(domain);
    if (getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0)
        return;
    len = sizeof(type);
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0)
        return;
    bool tcp = (domain == AF_INET || domain == AF_INET6) && type == SOCK_STREAM;
    /* Tuning is best effort: a socket that refuses an option still works. */
    if (tcp) {
        if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0)
            WEFT_TRACE(WEFT_SUB_NET, "TCP_NODELAY on fd %d: %s", fd, strerror(errno));
        if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one)) != 0)
            WEFT_TRACE(WEFT_SUB_NET, "SO_KEEPALIVE on fd %d: %s", fd, strerror(errno));
    }
    if (bufsize > 0) {
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bufsize, sizeof(bufsize)) != 0 && tcp)
            WEFT_TRACE(WEFT_SUB_NET, "SO_SNDBUF %d on fd %d: %s", bufsize, fd, strerror(errno));
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bufsize, sizeof(bufsize)) != 0 && tcp)
            WEFT_TRACE(WEFT_SUB_NET, "SO_RCVBUF %d on fd %d: %s", bufsize, fd, strerror(errno));
    }
}

weft_status_t weft_sock_listen(union weft_sockaddr *addr, int *fd)
{
    char name[64];
    int one = 1;
    *fd = -1;
    int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0)
        return weft_error(NULL, weft_errno_status(errno), "socket for listening on %s: %s",
                          weft_sock_str(addr, name, sizeof(name)), strerror(errno));
    /* Restarted jobs must not wait out TIME_WAIT of the last run. */
    if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
        goto fail;
    if (bind(s, &addr->sa, weft_sock_len(addr)) != 0)
        goto fail;
    if (listen(s, WEFT_LISTEN_BACKLOG) != 0)
        goto fail;
    socklen_t len = sizeof(*addr);
    if (getsockname(s, &addr->sa, &len) != 0)
        goto fail;
    *fd = s;
    return WEFT_OK;
fail:;
    int err = errno;
    close(s);
    return weft_error(NULL, weft_errno_status(err), "listen on %s: %s",
                      weft_sock_str(addr, name, sizeof(name)), strerror(err));
}

weft_status_t weft_sock_accept(int lfd, int *fd)
{
    *fd = -1;
    for (;;) {
        int s = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (s >= 0) {
            weft_sock_tune(s, 0);
            *fd = s;
            return WEFT_OK;
        }
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return WEFT_OK;
        /* A connection that died in the queue is not our error. */
        if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO)
            continue;
        return weft_error(NULL, weft_errno_status(errno), "accept on fd %d: %s", lfd,
                          strerror(errno));
    }
}

/* Starts a connect without recording anything: 0 connected, 1 in
 * progress, -1 failed with *err set (fd closed). */
static int connect_raw(const union weft_sockaddr *addr, int *fd, int *err)
{
    *fd = -1;
    int s = socket(addr->sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        *err = errno;
        return -1;
    }
    weft_sock_tune(s, 0);
    if (connect(s, &addr->sa, weft_sock_len(addr)) == 0) {
        *fd = s;
        return 0;
    }
    /* After EINTR the connect goes on asynchronously, as after EINPROGRESS. */
    if (errno == EINPROGRESS || errno == EINTR) {
        *fd = s;
        return 1;
    }
    *err = errno;
    close(s);
    return -1;
}

/* 0 connected, 1 still in progress, -1 failed with *err. */
static int connect_check(int fd, int *err)
{
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    int rc = poll(&p, 1, 0);
    if (rc < 0) {
        *err = errno;
        return errno == EINTR ? 1 : -1;
    }
    if (rc == 0)
        return 1;
    int soerr = 0;
    socklen_t len = sizeof(soerr);
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len) != 0) {
        *err = errno;
        return -1;
    }
    if (soerr != 0) {
        *err = soerr;
        return -1;
    }
    return 0;
}

weft_status_t weft_sock_connect_start(const union weft_sockaddr *addr, int *fd)
{
    char name[64];
    int err = 0;
    int rc = connect_raw(addr, fd, &err);
    if (rc < 0)
        return weft_error(NULL, weft_errno_status(err), "connect to %s: %s",
                          weft_sock_str(addr, name, sizeof(name)), strerror(err));
    return rc == 0 ? WEFT_OK : WEFT_INPROGRESS;
}

weft_status_t weft_sock_connect_finish(int fd)
{
    int err = 0;
    int rc = connect_check(fd, &err);
    if (rc < 0)
        return weft_error(NULL, weft_errno_status(err), "connect (fd %d): %s", fd,
                          strerror(err));
    return rc == 0 ? WEFT_OK : WEFT_INPROGRESS;
}

static bool connect_retryable(int err)
{
    return err == ECONNREFUSED || err == ETIMEDOUT || err == EHOSTUNREACH;
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000ull),
                          .tv_nsec = (long)(ns % 1000000000ull)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

weft_status_t weft_sock_connect(const union weft_sockaddr *addr, uint64_t deadline_ns, int *fd)
{
    char name[64];
    uint64_t backoff = CONNECT_BACKOFF_MIN_NS;
    int last_err = ETIMEDOUT;
    *fd = -1;
    for (;;) {
        int s = -1, err = 0;
        int rc = connect_raw(addr, &s, &err);
        while (rc == 1) {
            struct pollfd p = {.fd = s, .events = POLLOUT};
            int ms = weft_ms_left(deadline_ns);
            if (ms == 0) {
                /* Our deadline, not the kernel's verdict: keep reporting
                 * the last real error (a refusal, usually). */
                close(s);
                goto timed_out;
            }
            if (poll(&p, 1, ms) < 0 && errno != EINTR) {
                err = errno;
                close(s);
                rc = -1;
                break;
            }
            rc = connect_check(s, &err);
            if (rc < 0)
                close(s);
        }
        if (rc == 0) {
            *fd = s;
            return WEFT_OK;
        }
        if (!connect_retryable(err))
            return weft_error(NULL, weft_errno_status(err), "connect to %s: %s",
                              weft_sock_str(addr, name, sizeof(name)), strerror(err));
        last_err = err;
        uint64_t now = weft_now_ns();
        if (deadline_ns != 0 && now >= deadline_ns)
            break;
        /* The peer may simply not listen yet: wait a little, more each time. */
        uint64_t nap = backoff;
        if (deadline_ns != 0 && deadline_ns - now < nap)
            nap = deadline_ns - now;
        sleep_ns(nap);
        backoff = WEFT_MIN(backoff * 2, CONNECT_BACKOFF_MAX_NS);
    }
timed_out:
    return weft_error(NULL, WEFT_ERR_TIMEOUT, "connect to %s: deadline passed (last error: %s)",
                      weft_sock_str(addr, name, sizeof(name)), strerror(last_err));
}

/* "1.2.3.4:5" of the fd's peer, or "fd N" when it has none. */
static const char *peer_name(int fd, char *buf, size_t len)
{
    union weft_sockaddr a;
    socklen_t alen = sizeof(a);
    if (getpeername(fd, &a.sa, &alen) == 0 &&
        (a.sa.sa_family == AF_INET || a.sa.sa_family == AF_INET6))
        return weft_sock_str(&a, buf, len);
    snprintf(buf, len, "fd %d", fd);
    return buf;
}

/* One loop for both directions: the error handling is the same. */
static weft_status_t sock_io_all(int fd, uint8_t *p, size_t len, uint64_t deadline_ns,
                                 bool sending)
{
    char name[64];
    const char *what = sending ? "send to" : "receive from";
    while (len > 0) {
        ssize_t n = sending ? send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT)
                            : recv(fd, p, len, MSG_DONTWAIT);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return weft_error(NULL, WEFT_ERR_REMOTE, "%s %s: peer closed the connection", what,
                              peer_name(fd, name, sizeof(name)));
        int err = errno;
        if (err == EINTR)
            continue;
        if (err == EAGAIN || err == EWOULDBLOCK) {
            int ms = weft_ms_left(deadline_ns);
            if (ms == 0)
                return weft_error(NULL, WEFT_ERR_TIMEOUT, "%s %s: deadline passed, %zu bytes left",
                                  what, peer_name(fd, name, sizeof(name)), len);
            struct pollfd pfd = {.fd = fd, .events = sending ? POLLOUT : POLLIN};
            if (poll(&pfd, 1, ms) < 0 && errno != EINTR)
                return weft_error(NULL, WEFT_ERR_SYSTEM, "poll on %s: %s",
                                  peer_name(fd, name, sizeof(name)), strerror(errno));
            continue;
        }
        if (err == ECONNRESET || err == EPIPE)
            return weft_error(NULL, WEFT_ERR_REMOTE, "%s %s: %s", what,
                              peer_name(fd, name, sizeof(name)), strerror(err));
        return weft_error(NULL, weft_errno_status(err), "%s %s: %s", what,
                          peer_name(fd, name, sizeof(name)), strerror(err));
    }
    return WEFT_OK;
}

weft_status_t weft_sock_send_all(int fd, const void *buf, size_t len, uint64_t deadline_ns)
{
    return sock_io_all(fd, (uint8_t *)(uintptr_t)buf, len, deadline_ns, true);
}

weft_status_t weft_sock_recv_all(int fd, void *buf, size_t len, uint64_t deadline_ns)
{
    return sock_io_all(fd, buf, len, deadline_ns, false);
}
