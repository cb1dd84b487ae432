/*
 * ib_select.h - which RDMA devices, ports and GIDs the verbs transport uses:
 * WEFT_IB_HCA lists, GID tables read from sysfs and NCCL's GID choice.
 * Pure: no libibverbs, so it builds and is tested on any machine.
 */
#ifndef WEFT_IB_SELECT_H
#define WEFT_IB_SELECT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/internal.h"

#define WEFT_IB_HCA_MAX 32  /* entries in one WEFT_IB_HCA list */
#define WEFT_IB_NAME_MAX 63 /* characters in a device name (ibv's IBV_SYSFS_NAME_MAX - 1) */
#define WEFT_IB_PORT_MAX 255

/* One "name[:port]" of a WEFT_IB_HCA list; port 0 stands for every port. */
struct weft_ib_hca_entry {
    char name[WEFT_IB_NAME_MAX + 1];
    int port; /* 1..WEFT_IB_PORT_MAX, or 0: any */
};

/* A parsed WEFT_IB_HCA.  Owner: the caller (plain value, no allocation).
 * Invariants: 0 <= n <= WEFT_IB_HCA_MAX; every entry's name is non-empty;
 * n == 0 only for an empty spec, which selects every device and port. */
struct weft_ib_hca_list {
    int n;
    bool exclude; /* "^": the entries name what is left out */
    bool exact;   /* "=": names match whole, not as prefixes */
    struct weft_ib_hca_entry e[WEFT_IB_HCA_MAX];
};

/* Parses NCCL_IB_HCA syntax: "[^][=]name[:port],...".  NULL or "" selects
 * everything.  On a malformed spec returns WEFT_ERR_INVALID_ARG with why
 * naming the bad entry and leaves out untouched; why is "" on success. */
weft_status_t weft_ib_hca_parse(const char *spec, struct weft_ib_hca_list *out, char *why,
                                size_t whylen) WEFT_HIDDEN;
/* True when port of device dev is selected by l. */
bool weft_ib_hca_match(const struct weft_ib_hca_list *l, const char *dev, int port) WEFT_HIDDEN;

enum weft_ib_gid_type {
    WEFT_GID_UNKNOWN = 0, /* no gid_attrs in sysfs (containers, old kernels) */
    WEFT_GID_IB,          /* "IB/RoCE v1" on an InfiniBand port */
    WEFT_GID_ROCE_V1,     /* "IB/RoCE v1" on an Ethernet port */
    WEFT_GID_ROCE_V2,     /* "RoCE v2": UDP/IP, routable */
};

/* One non-empty entry of a port's GID table. */
struct weft_ib_gid {
    int index;      /* position in the port's GID table */
    uint8_t raw[16]; /* network order, as ibv_gid.raw */
    int type;       /* enum weft_ib_gid_type */
    char ndev[32];  /* the netdev it belongs to; "" on InfiniBand or when unknown */
};

/* Reads the non-empty GIDs of dev's port from <sysfs_root>/class/infiniband
 * (production: "/sys") into out[0..*n), lowest index first, at most max of
 * them (further ones are not read).  All-zero entries and those the kernel
 * refuses to describe (types/<i> fails: EINVAL for an unused entry) are
 * skipped.  A missing port folder is WEFT_ERR_SYSTEM with why; the caller
 * then falls back to ibv_query_gid and WEFT_GID_UNKNOWN types. */
weft_status_t weft_ib_gids_from_sysfs(const char *sysfs_root, const char *dev, int port,
                                      struct weft_ib_gid *out, int max, int *n, char *why,
                                      size_t whylen) WEFT_HIDDEN;

/* NCCL's choice of GID among c[0..n): returns its position in c, or -1
 * with why.  want_index >= 0 (WEFT_IB_GID_INDEX) takes that index or
 * nothing.  InfiniBand (roce false) takes index 0.  RoCE takes, of the GIDs
 * with an address of family (AF_INET: ::ffff:a.b.c.d; AF_INET6: global,
 * not mapped), the one equal to local_ip (4 or 16 bytes, may be NULL), then
 * RoCE v2 over v1 over unknown (unknown and IPv4-mapped counts as v2), then
 * the lowest index.  When none has such an address it falls back to the
 * lowest-index v2, then the lowest index of all.  Whenever the choice left
 * the first rule (a fallback, local_ip not found) why says how, for the
 * caller to log at INFO; otherwise why is "". */
int weft_ib_gid_pick(const struct weft_ib_gid *c, int n, bool roce, int want_index, int family,
                     const uint8_t *local_ip, char *why, size_t whylen) WEFT_HIDDEN;

/* WEFT_IB_ADDR_FAMILY: "AF_INET" or "4" -> AF_INET, "AF_INET6" or "6" ->
 * AF_INET6 (case ignored); anything else, NULL included, -1. */
int weft_ib_addr_family(const char *s) WEFT_HIDDEN;

/* raw as text (inet_ntop's IPv6 form) into buf; returns buf, "" if len is
 * too small (INET6_ADDRSTRLEN, 46, always suffices). */
const char *weft_ib_gid_str(const uint8_t raw[16], char *buf, size_t len) WEFT_HIDDEN;

#endif /* WEFT_IB_SELECT_H */
