/*
 * ib_select.c - the verbs transport's choice of device, port and GID, kept
 * apart from libibverbs so that it builds everywhere and its rules are
 * tested against fixture sysfs trees rather than against whatever NIC CI has.
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "transports/verbs/ib_select.h"

/* sysfs GID tables are contiguous and at most a few hundred entries long
 * (mlx5: 255); the bound only stops a runaway read of a strange tree. */
#define GID_TABLE_MAX 4096

/* ---- WEFT_IB_HCA -------------------------------------------------------- */

/* Characters of kernel RDMA device names (mlx5_0, mlx5_bond_0, rxe-eth0,
 * irdma.1); anything else in a name is a typo we would rather report than
 * silently match nothing with. */
static bool name_char(char ch)
{
    return isalnum((unsigned char)ch) || ch == '_' || ch == '-' || ch == '.';
}

weft_status_t weft_ib_hca_parse(const char *spec, struct weft_ib_hca_list *out, char *why,
                                size_t whylen)
{
    /* Built aside and copied at the end, so a refusal leaves out as it was. */
    struct weft_ib_hca_list l;
    memset(&l, 0, sizeof(l));
    weft_errf(why, whylen, "%s", "");
    if (spec == NULL || *spec == '\0') {
        *out = l;
        return WEFT_OK;
    }
    const char *p = spec;
    if (*p == '^') {
        l.exclude = true;
        p++;
    }
    if (*p == '=') {
        l.exact = true;
        p++;
    }
    if (*p == '\0') {
        weft_errf(why, whylen, "WEFT_IB_HCA=\"%s\": no device after \"%s\"", spec, spec);
        return WEFT_ERR_INVALID_ARG;
    }
    for (int k = 1;; k++) {
        int len = (int)WEFT_MIN(strcspn(p, ","), (size_t)INT_MAX);
        const char *colon = memchr(p, ':', (size_t)len);
        int nlen = colon ? (int)(colon - p) : len;
        /* An empty entry would be a prefix of every name: as an inclusion it
         * would select everything, as an exclusion nothing. */
        if (len == 0) {
            weft_errf(why, whylen, "WEFT_IB_HCA=\"%s\": entry %d is empty", spec, k);
            return WEFT_ERR_INVALID_ARG;
        }
        if (l.n == WEFT_IB_HCA_MAX) {
            weft_errf(why, whylen, "WEFT_IB_HCA=\"%s\": more than %d entries", spec, WEFT_IB_HCA_MAX);
            return WEFT_ERR_INVALID_ARG;
        }
        if (nlen == 0) {
            weft_errf(why, whylen, "WEFT_IB_HCA entry \"%.*s\" has no device name", len, p);
            return WEFT_ERR_INVALID_ARG;
        }
        if (nlen > WEFT_IB_NAME_MAX) {
            weft_errf(why, whylen, "WEFT_IB_HCA entry \"%.*s\": device name longer than %d characters",
                len, p, WEFT_IB_NAME_MAX);
            return WEFT_ERR_INVALID_ARG;
        }
        for (int i = 0; i < nlen; i++) {
            if (!name_char(p[i])) {
                weft_errf(why, whylen, "WEFT_IB_HCA entry \"%.*s\": unexpected character '%c'", len, p,
                    p[i]);
                return WEFT_ERR_INVALID_ARG;
            }
        }
        struct weft_ib_hca_entry *e = &l.e[l.n];
        memcpy(e->name, p, (size_t)nlen);
        e->name[nlen] = '\0';
        e->port = 0;
        if (colon) {
            const char *d = colon + 1, *end = p + len;
            int v = 0;
            bool ok = d < end;
            for (; ok && d < end; d++) {
                ok = *d >= '0' && *d <= '9';
                v = WEFT_MIN(v * 10 + (*d - '0'), WEFT_IB_PORT_MAX + 1); /* no overflow */
            }
            if (!ok || v < 1 || v > WEFT_IB_PORT_MAX) {
                weft_errf(why, whylen, "WEFT_IB_HCA entry \"%.*s\": port must be a number from 1 to %d",
                    len, p, WEFT_IB_PORT_MAX);
                return WEFT_ERR_INVALID_ARG;
            }
            e->port = v;
        }
        l.n++;
        p += len;
        if (*p == '\0')
            break;
        p++; /* the comma; a trailing one yields an empty entry next round */
    }
    *out = l;
    return WEFT_OK;
}

bool weft_ib_hca_match(const struct weft_ib_hca_list *l, const char *dev, int port)
{
    if (l == NULL || l->n == 0)
        return true;
    bool hit = false;
    for (int i = 0; i < l->n && !hit; i++) {
        const struct weft_ib_hca_entry *e = &l->e[i];
        bool name = l->exact ? strcmp(dev, e->name) == 0
                             : strncmp(dev, e->name, strlen(e->name)) == 0;
        hit = name && (e->port == 0 || e->port == port);
    }
    return l->exclude ? !hit : hit;
}

/* ---- GID tables in sysfs ------------------------------------------------ */

/* One sysfs attribute into buf without its trailing newline; 0 or errno.
 * read() is what fails for the kernel's unused GID entries (EINVAL), so a
 * successful open() proves nothing. */
static int read_attr(const char *path, char *buf, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno;
    ssize_t r = read(fd, buf, len - 1);
    int err = r < 0 ? errno : 0;
    close(fd);
    if (err)
        return err;
    while (r > 0 && isspace((unsigned char)buf[r - 1]))
        r--;
    buf[r] = '\0';
    return 0;
}

static bool all_zero(const uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (b[i])
            return false;
    return true;
}

weft_status_t weft_ib_gids_from_sysfs(const char *sysfs_root, const char *dev, int port,
                                      struct weft_ib_gid *out, int max, int *n, char *why,
                                      size_t whylen)
{
    weft_errf(why, whylen, "%s", "");
    *n = 0;
    /* dev comes from ibv_get_device_list, but it becomes a path: refuse
     * anything that would leave the device's folder. */
    if (dev == NULL || *dev == '\0' || strchr(dev, '/') || strcmp(dev, ".") == 0 ||
        strcmp(dev, "..") == 0 || port < 1 || port > WEFT_IB_PORT_MAX || max < 0) {
        weft_errf(why, whylen, "bad device \"%s\" or port %d", dev ? dev : "(null)", port);
        return WEFT_ERR_INVALID_ARG;
    }
    char base[PATH_MAX], path[PATH_MAX + 32];
    int bl = snprintf(base, sizeof(base), "%s/class/infiniband/%s/ports/%d", sysfs_root, dev, port);
    if (bl < 0 || (size_t)bl >= sizeof(base)) {
        weft_errf(why, whylen, "sysfs path for %s port %d is too long", dev, port);
        return WEFT_ERR_INVALID_ARG;
    }
    struct stat st;
    snprintf(path, sizeof(path), "%s/gids", base);
    if (stat(path, &st) != 0) {
        weft_errf(why, whylen, "%s: %s", path, strerror(errno));
        return WEFT_ERR_SYSTEM;
    }
    if (!S_ISDIR(st.st_mode)) {
        weft_errf(why, whylen, "%s: not a folder", path);
        return WEFT_ERR_SYSTEM;
    }
    /* "IB/RoCE v1" names both: the link layer tells which. */
    char ll[32];
    snprintf(path, sizeof(path), "%s/link_layer", base);
    int link = -1; /* 1 InfiniBand, 0 Ethernet, -1 unknown */
    if (read_attr(path, ll, sizeof(ll)) == 0)
        link = strcmp(ll, "InfiniBand") == 0 ? 1 : strcmp(ll, "Ethernet") == 0 ? 0 : -1;

    for (int i = 0; i < GID_TABLE_MAX && *n < max; i++) {
        char text[64], type[32];
        snprintf(path, sizeof(path), "%s/gids/%d", base, i);
        int err = read_attr(path, text, sizeof(text));
        if (err == ENOENT)
            break; /* past the end of the table */
        struct weft_ib_gid g;
        memset(&g, 0, sizeof(g));
        g.index = i;
        if (err != 0 || inet_pton(AF_INET6, text, g.raw) != 1 || all_zero(g.raw, 16))
            continue;
        snprintf(path, sizeof(path), "%s/gid_attrs/ndevs/%d", base, i);
        if (read_attr(path, g.ndev, sizeof(g.ndev)) != 0)
            g.ndev[0] = '\0'; /* InfiniBand, or a kernel without ndevs */
        snprintf(path, sizeof(path), "%s/gid_attrs/types/%d", base, i);
        err = read_attr(path, type, sizeof(type));
        if (err == ENOENT) {
            g.type = WEFT_GID_UNKNOWN; /* no gid_attrs: a kernel too old to say */
        } else if (err != 0) {
            continue; /* the kernel's "no such entry" */
        } else if (strcmp(type, "RoCE v2") == 0) {
            g.type = WEFT_GID_ROCE_V2;
        } else if (strcmp(type, "IB/RoCE v1") == 0) {
            bool ib = link == 1 || (link == -1 && g.ndev[0] == '\0');
            g.type = ib ? WEFT_GID_IB : WEFT_GID_ROCE_V1;
        } else {
            g.type = WEFT_GID_UNKNOWN;
        }
        out[(*n)++] = g;
    }
    return WEFT_OK;
}

/* ---- GID choice ----------------------------------------------------------- */

static bool v4_mapped(const uint8_t *r)
{
    static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(r, prefix, sizeof(prefix)) == 0;
}

static bool link_local(const uint8_t *r)
{
    return r[0] == 0xfe && (r[1] & 0xc0) == 0x80;
}

/* A device without sysfs types still carries a v2 GID for each IPv4
 * address (every RoCE NIC since ConnectX-4 does): count it as one. */
static int effective_type(const struct weft_ib_gid *g)
{
    return g->type == WEFT_GID_UNKNOWN && v4_mapped(g->raw) ? WEFT_GID_ROCE_V2 : g->type;
}

static int type_rank(int type)
{
    switch (type) {
    case WEFT_GID_ROCE_V2: return 3;
    case WEFT_GID_ROCE_V1: return 2;
    case WEFT_GID_UNKNOWN: return 1;
    default: return 0;
    }
}

static const char *type_name(int type)
{
    switch (type) {
    case WEFT_GID_ROCE_V2: return "RoCE v2";
    case WEFT_GID_ROCE_V1: return "RoCE v1";
    case WEFT_GID_IB: return "IB";
    default: return "unknown type";
    }
}

static bool has_family(const struct weft_ib_gid *g, int family)
{
    if (family == AF_INET)
        return v4_mapped(g->raw);
    return !v4_mapped(g->raw) && !link_local(g->raw);
}

static bool has_ip(const struct weft_ib_gid *g, int family, const uint8_t *ip)
{
    return family == AF_INET ? memcmp(g->raw + 12, ip, 4) == 0 : memcmp(g->raw, ip, 16) == 0;
}

int weft_ib_gid_pick(const struct weft_ib_gid *c, int n, bool roce, int want_index, int family,
                     const uint8_t *local_ip, char *why, size_t whylen)
{
    char a[INET6_ADDRSTRLEN], b[INET6_ADDRSTRLEN];
    weft_errf(why, whylen, "%s", "");
    if (c == NULL || n <= 0) {
        weft_errf(why, whylen, "the port has no GIDs");
        return -1;
    }
    if (want_index >= 0) {
        for (int i = 0; i < n; i++)
            if (c[i].index == want_index)
                return i;
        weft_errf(why, whylen, "GID index %d (WEFT_IB_GID_INDEX) is empty or absent on this port",
            want_index);
        return -1;
    }
    if (!roce) {
        for (int i = 0; i < n; i++)
            if (c[i].index == 0)
                return i;
        weft_errf(why, whylen, "InfiniBand port without GID 0 (the port GID)");
        return -1;
    }
    if (family != AF_INET && family != AF_INET6) {
        weft_errf(why, whylen, "address family %d is neither AF_INET nor AF_INET6", family);
        return -1;
    }
    const char *fam = family == AF_INET ? "IPv4" : "IPv6";
    /* The address goes first: it is what the peer routes to, and the kernel
     * gives every address both a v1 and a v2 entry, so the type in practice
     * chooses between the entries of one address. */
    int best = -1;
    bool best_ip = false;
    for (int i = 0; i < n; i++) {
        if (!has_family(&c[i], family))
            continue;
        bool ip = local_ip && has_ip(&c[i], family, local_ip);
        int r = type_rank(effective_type(&c[i]));
        if (best >= 0) {
            int br = type_rank(effective_type(&c[best]));
            if (ip != best_ip ? !ip : r != br ? r < br : c[i].index >= c[best].index)
                continue;
        }
        best = i;
        best_ip = ip;
    }
    if (best >= 0) {
        if (local_ip && !best_ip)
            weft_errf(why, whylen, "no %s GID carries the local address %s; took index %d (%s, %s)",
                fam, inet_ntop(family, local_ip, a, sizeof(a)) ? a : "?", c[best].index,
                weft_ib_gid_str(c[best].raw, b, sizeof(b)), type_name(effective_type(&c[best])));
        return best;
    }
    /* No address of the family: a link-local v2 still works on one subnet. */
    for (int i = 0; i < n; i++)
        if (effective_type(&c[i]) == WEFT_GID_ROCE_V2 &&
            (best < 0 || c[i].index < c[best].index))
            best = i;
    if (best >= 0) {
        weft_errf(why, whylen, "no RoCE GID with an %s address; falling back to index %d (%s, RoCE v2)",
            fam, c[best].index, weft_ib_gid_str(c[best].raw, b, sizeof(b)));
        return best;
    }
    for (int i = 0; i < n; i++)
        if (best < 0 || c[i].index < c[best].index)
            best = i;
    weft_errf(why, whylen,
        "no RoCE GID with an %s address and none of RoCE v2; falling back to index %d (%s, %s)",
        fam, c[best].index, weft_ib_gid_str(c[best].raw, b, sizeof(b)),
        type_name(effective_type(&c[best])));
    return best;
}

int weft_ib_addr_family(const char *s)
{
    if (s == NULL)
        return -1;
    if (strcasecmp(s, "AF_INET") == 0 || strcmp(s, "4") == 0)
        return AF_INET;
    if (strcasecmp(s, "AF_INET6") == 0 || strcmp(s, "6") == 0)
        return AF_INET6;
    return -1;
}

const char *weft_ib_gid_str(const uint8_t raw[16], char *buf, size_t len)
{
    if (len == 0)
        return buf;
    if (inet_ntop(AF_INET6, raw, buf, (socklen_t)WEFT_MIN(len, (size_t)INT_MAX)) == NULL)
        buf[0] = '\0';
    return buf;
}
