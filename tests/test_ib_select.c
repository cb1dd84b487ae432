/*
 * test_ib_select.c - the verbs transport's device and GID choice without a
 * NIC: WEFT_IB_HCA lists, GID tables read from the fixture sysfs trees of
 * tests/fixtures/sysfs (README there), NCCL's GID rules, the IB params.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "transports/registry.h"
#include "transports/verbs/ib_select.h"

#ifndef SYSFS_FIXTURES
#define SYSFS_FIXTURES "tests/fixtures/sysfs"
#endif
#define ROCE SYSFS_FIXTURES "/roce"
#define IB SYSFS_FIXTURES "/ib"
#define MULTI SYSFS_FIXTURES "/multi"

/* ---- WEFT_IB_HCA ---------------------------------------------------------- */

static struct weft_ib_hca_list parse_ok(const char *spec)
{
    struct weft_ib_hca_list l;
    char why[256] = "junk";
    weft_status_t st = weft_ib_hca_parse(spec, &l, why, sizeof(why));
    cr_assert_eq(st, WEFT_OK, "'%s': %s", spec ? spec : "(null)", why);
    cr_assert_str_empty(why, "'%s': why '%s' on success", spec ? spec : "(null)", why);
    return l;
}

/* A refusal returns INVALID_ARG with exactly want and leaves out's bytes as
 * they were. */
static void refused(const char *spec, const char *want)
{
    struct weft_ib_hca_list l, before;
    memset(&l, 0xa5, sizeof(l));
    memcpy(&before, &l, sizeof(l));
    char why[256] = "";
    weft_status_t st = weft_ib_hca_parse(spec, &l, why, sizeof(why));
    cr_assert_eq(st, WEFT_ERR_INVALID_ARG, "'%s' accepted", spec);
    cr_expect_str_eq(why, want, "'%s'", spec);
    cr_expect_eq(memcmp(&l, &before, sizeof(l)), 0, "'%s': out changed on refusal", spec);
}

static void expect_match(const char *spec, const char *dev, int port, bool want)
{
    struct weft_ib_hca_list l = parse_ok(spec);
    cr_expect_eq(weft_ib_hca_match(&l, dev, port), want, "'%s' on %s:%d: want %s", spec, dev,
                 port, want ? "selected" : "not selected");
}

Test(hca, empty_selects_everything)
{
    struct weft_ib_hca_list l = parse_ok("");
    cr_expect_eq(l.n, 0);
    cr_expect(!l.exclude && !l.exact);
    l = parse_ok(NULL);
    cr_expect_eq(l.n, 0);
    cr_expect(weft_ib_hca_match(&l, "mlx5_0", 1));
    cr_expect(weft_ib_hca_match(&l, "rxe0", 2));
    cr_expect(weft_ib_hca_match(NULL, "mlx5_0", 1));
}

Test(hca, entries_are_parsed)
{
    struct weft_ib_hca_list l = parse_ok("mlx5_0:1,mlx5_1,rxe-eth0:255");
    cr_assert_eq(l.n, 3);
    cr_expect(!l.exclude && !l.exact);
    cr_expect_str_eq(l.e[0].name, "mlx5_0");
    cr_expect_eq(l.e[0].port, 1);
    cr_expect_str_eq(l.e[1].name, "mlx5_1");
    cr_expect_eq(l.e[1].port, 0);
    cr_expect_str_eq(l.e[2].name, "rxe-eth0");
    cr_expect_eq(l.e[2].port, 255);

    l = parse_ok("^=mlx5_2:2");
    cr_assert_eq(l.n, 1);
    cr_expect(l.exclude && l.exact);
    cr_expect_str_eq(l.e[0].name, "mlx5_2");
    cr_expect_eq(l.e[0].port, 2);
    l = parse_ok("^mlx5");
    cr_expect(l.exclude && !l.exact);
    l = parse_ok("=mlx5_0");
    cr_expect(!l.exclude && l.exact);
}

Test(hca, prefix_matches)
{
    expect_match("mlx5", "mlx5_0", 1, true);
    expect_match("mlx5", "mlx5_1", 2, true);
    expect_match("mlx5", "mlx5_bond_0", 1, true);
    expect_match("mlx5", "mlx4_0", 1, false);
    expect_match("mlx5", "rxe0", 1, false);
    expect_match("mlx5_1", "mlx5_10", 1, true); /* NCCL's prefix rule, hence "=" */
    expect_match("mlx5_0", "mlx5", 1, false);   /* the entry longer than the name */
    expect_match("rxe0,mlx5_1", "mlx5_1", 1, true);
    expect_match("rxe0,mlx5_1", "rxe0", 3, true);
    expect_match("rxe0,mlx5_1", "mlx5_0", 1, false);
}

Test(hca, exact_matches)
{
    expect_match("=mlx5_1", "mlx5_1", 1, true);
    expect_match("=mlx5_1", "mlx5_10", 1, false);
    expect_match("=mlx5", "mlx5_0", 1, false);
    expect_match("=mlx5_0,mlx5_1", "mlx5_1", 2, true);
    expect_match("=mlx5_0:1", "mlx5_0", 1, true);
    expect_match("=mlx5_0:1", "mlx5_0", 2, false);
}

Test(hca, ports)
{
    expect_match("mlx5_0:1", "mlx5_0", 1, true);
    expect_match("mlx5_0:1", "mlx5_0", 2, false);
    expect_match("mlx5_0:1,mlx5_0:2", "mlx5_0", 2, true);
    expect_match("mlx5_0:2,mlx5_1", "mlx5_1", 7, true);
    expect_match("mlx5:2", "mlx5_3", 2, true);
    expect_match("mlx5:2", "mlx5_3", 1, false);
}

Test(hca, exclusion)
{
    expect_match("^mlx5_0", "mlx5_0", 1, false);
    expect_match("^mlx5_0", "mlx5_0", 2, false);
    expect_match("^mlx5_0", "mlx5_1", 1, true);
    expect_match("^mlx5_0", "rxe0", 1, true);
    expect_match("^mlx5_0:1", "mlx5_0", 1, false);
    expect_match("^mlx5_0:1", "mlx5_0", 2, true);
    expect_match("^mlx5_1", "mlx5_10", 1, false); /* prefix */
    expect_match("^=mlx5_1", "mlx5_10", 1, true);  /* exact */
    expect_match("^=mlx5_1", "mlx5_1", 1, false);
    expect_match("^mlx5_0,mlx5_bond", "mlx5_bond_0", 1, false);
    expect_match("^mlx5_0,mlx5_bond", "mlx5_1", 1, true);
}

Test(hca, refusals)
{
    refused("mlx5_0,,mlx5_1", "WEFT_IB_HCA=\"mlx5_0,,mlx5_1\": entry 2 is empty");
    refused("mlx5_0,", "WEFT_IB_HCA=\"mlx5_0,\": entry 2 is empty");
    refused(",mlx5_0", "WEFT_IB_HCA=\",mlx5_0\": entry 1 is empty");
    refused("^,mlx5_0", "WEFT_IB_HCA=\"^,mlx5_0\": entry 1 is empty");
    refused("^", "WEFT_IB_HCA=\"^\": no device after \"^\"");
    refused("=", "WEFT_IB_HCA=\"=\": no device after \"=\"");
    refused("^=", "WEFT_IB_HCA=\"^=\": no device after \"^=\"");
    const char *port = "\": port must be a number from 1 to 255";
    const char *bad_ports[] = {"mlx5_0:x", "mlx5_0:0", "mlx5_0:-1", "mlx5_0:256", "mlx5_0:",
                               "mlx5_0:1:2", "mlx5_0:99999999999", "mlx5_0:1x", "mlx5_0:+1"};
    for (size_t i = 0; i < sizeof(bad_ports) / sizeof(bad_ports[0]); i++) {
        char want[128];
        snprintf(want, sizeof(want), "WEFT_IB_HCA entry \"%s%s", bad_ports[i], port);
        refused(bad_ports[i], want);
    }
    refused("mlx5_1,mlx5_0:0", "WEFT_IB_HCA entry \"mlx5_0:0\": port must be a number from 1 to 255");
    refused(":1", "WEFT_IB_HCA entry \":1\" has no device name");
    refused("mlx5_0 ", "WEFT_IB_HCA entry \"mlx5_0 \": unexpected character ' '");
    refused("^^mlx5", "WEFT_IB_HCA entry \"^mlx5\": unexpected character '^'");
    refused("=^mlx5", "WEFT_IB_HCA entry \"^mlx5\": unexpected character '^'");
    refused("mlx5_0;mlx5_1", "WEFT_IB_HCA entry \"mlx5_0;mlx5_1\": unexpected character ';'");
    refused("mlx5/0", "WEFT_IB_HCA entry \"mlx5/0\": unexpected character '/'");
}

Test(hca, name_length_limit)
{
    char name[80], spec[96], want[160];
    memset(name, 'a', 63);
    name[63] = '\0';
    snprintf(spec, sizeof(spec), "%s:2", name);
    struct weft_ib_hca_list l = parse_ok(spec);
    cr_assert_eq(l.n, 1);
    cr_expect_str_eq(l.e[0].name, name);
    cr_expect_eq(l.e[0].port, 2);
    name[63] = 'a';
    name[64] = '\0';
    snprintf(want, sizeof(want),
             "WEFT_IB_HCA entry \"%s\": device name longer than 63 characters", name);
    refused(name, want);
}

Test(hca, entry_count_limit)
{
    char spec[512] = "", want[600];
    for (int i = 0; i < 32; i++)
        snprintf(spec + strlen(spec), sizeof(spec) - strlen(spec), "%sd%d", i ? "," : "", i);
    struct weft_ib_hca_list l = parse_ok(spec);
    cr_assert_eq(l.n, 32);
    cr_expect_str_eq(l.e[31].name, "d31");
    strcat(spec, ",d32");
    snprintf(want, sizeof(want), "WEFT_IB_HCA=\"%s\": more than 32 entries", spec);
    refused(spec, want);
}

/* The devices of a fixture tree that spec selects on port 1, sorted, joined
 * with commas: what the transport's device loop would open. */
static void selected(const char *root, const char *spec, char *out, size_t len)
{
    struct weft_ib_hca_list l = parse_ok(spec);
    char path[512], names[8][256];
    int n = 0;
    snprintf(path, sizeof(path), "%s/class/infiniband", root);
    DIR *d = opendir(path);
    cr_assert_not_null(d, "%s", path);
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.' && n < 8 && weft_ib_hca_match(&l, e->d_name, 1))
            snprintf(names[n++], sizeof(names[0]), "%s", e->d_name);
    closedir(d);
    qsort(names, (size_t)n, sizeof(names[0]), (int (*)(const void *, const void *))strcmp);
    out[0] = '\0';
    for (int i = 0; i < n; i++)
        snprintf(out + strlen(out), len - strlen(out), "%s%s", i ? "," : "", names[i]);
}

Test(hca, fixture_devices)
{
    struct {
        const char *spec, *want;
    } cases[] = {
        {"", "mlx5_0,mlx5_1,mlx5_bond_0"},
        {"mlx5", "mlx5_0,mlx5_1,mlx5_bond_0"},
        {"mlx5_bond", "mlx5_bond_0"},
        {"=mlx5_0,mlx5_1", "mlx5_0,mlx5_1"},
        {"=mlx5", ""},
        {"^mlx5_bond", "mlx5_0,mlx5_1"},
        {"^=mlx5_0", "mlx5_1,mlx5_bond_0"},
        {"mlx5_bond_0:2", ""},
        {"mlx5_1:1", "mlx5_1"},
        {"^mlx5_0:2", "mlx5_0,mlx5_1,mlx5_bond_0"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char got[256];
        selected(MULTI, cases[i].spec, got, sizeof(got));
        cr_expect_str_eq(got, cases[i].want, "'%s'", cases[i].spec);
    }
}

/* ---- GID tables ------------------------------------------------------------- */

static void gid_of(const char *text, uint8_t raw[16])
{
    cr_assert_eq(inet_pton(AF_INET6, text, raw), 1, "%s", text);
}

static void expect_gid(const struct weft_ib_gid *g, int index, const char *addr, int type,
                       const char *ndev)
{
    uint8_t raw[16];
    gid_of(addr, raw);
    char got[INET6_ADDRSTRLEN];
    cr_expect_eq(g->index, index);
    cr_expect_eq(memcmp(g->raw, raw, 16), 0, "index %d: %s, want %s", index,
                 weft_ib_gid_str(g->raw, got, sizeof(got)), addr);
    cr_expect_eq(g->type, type, "index %d: type %d, want %d", index, g->type, type);
    cr_expect_str_eq(g->ndev, ndev, "index %d", index);
}

static int read_gids(const char *root, const char *dev, struct weft_ib_gid *g, int max)
{
    int n = -1;
    char why[256] = "junk";
    weft_status_t st = weft_ib_gids_from_sysfs(root, dev, 1, g, max, &n, why, sizeof(why));
    cr_assert_eq(st, WEFT_OK, "%s %s: %s", root, dev, why);
    cr_expect_str_empty(why);
    return n;
}

Test(gids, roce_port)
{
    struct weft_ib_gid g[32];
    int n = read_gids(ROCE, "mlx5_0", g, 32);
    /* 6, 10, 11 are zero, 7's GID and 12's type cannot be read. */
    cr_assert_eq(n, 8);
    expect_gid(&g[0], 0, "fe80::202:c9ff:fe00:1", WEFT_GID_ROCE_V1, "eth2");
    expect_gid(&g[1], 1, "fe80::202:c9ff:fe00:1", WEFT_GID_ROCE_V2, "eth2");
    expect_gid(&g[2], 2, "::ffff:10.0.0.5", WEFT_GID_ROCE_V1, "eth2");
    expect_gid(&g[3], 3, "::ffff:10.0.0.5", WEFT_GID_ROCE_V2, "eth2");
    expect_gid(&g[4], 4, "2001:db8::5", WEFT_GID_ROCE_V1, "eth2");
    expect_gid(&g[5], 5, "2001:db8::5", WEFT_GID_ROCE_V2, "eth2");
    expect_gid(&g[6], 8, "::ffff:10.0.0.6", WEFT_GID_ROCE_V1, "eth2");
    expect_gid(&g[7], 9, "::ffff:10.0.0.6", WEFT_GID_ROCE_V2, "eth2");
}

Test(gids, max_keeps_the_lowest_indices)
{
    struct weft_ib_gid g[4];
    memset(g, 0x5a, sizeof(g));
    int n = read_gids(ROCE, "mlx5_0", g, 3);
    cr_assert_eq(n, 3);
    cr_expect_eq(g[2].index, 2);
    cr_expect_eq(g[3].index, 0x5a5a5a5a, "wrote past max");
    cr_expect_eq(read_gids(ROCE, "mlx5_0", g, 0), 0);
}

Test(gids, ib_port)
{
    struct weft_ib_gid g[8];
    int n = read_gids(IB, "mlx5_2", g, 8);
    cr_assert_eq(n, 1);
    expect_gid(&g[0], 0, "fe80::2:c903:1:2345", WEFT_GID_IB, "");
}

Test(gids, multi_devices)
{
    struct weft_ib_gid g[8];
    cr_assert_eq(read_gids(MULTI, "mlx5_0", g, 8), 4);
    expect_gid(&g[3], 3, "::ffff:10.1.0.1", WEFT_GID_ROCE_V2, "ens1f0");
    cr_assert_eq(read_gids(MULTI, "mlx5_bond_0", g, 8), 4);
    expect_gid(&g[2], 2, "::ffff:10.2.0.1", WEFT_GID_ROCE_V1, "bond0");
    /* No gid_attrs: types unknown, no netdev. */
    cr_assert_eq(read_gids(MULTI, "mlx5_1", g, 8), 2);
    expect_gid(&g[0], 0, "fe80::e42:a1ff:fe00:11", WEFT_GID_UNKNOWN, "");
    expect_gid(&g[1], 1, "::ffff:10.1.1.1", WEFT_GID_UNKNOWN, "");
}

Test(gids, missing_and_bad_arguments)
{
    struct weft_ib_gid g[4];
    int n = 7;
    char why[512];
    weft_status_t st = weft_ib_gids_from_sysfs(ROCE, "mlx5_9", 1, g, 4, &n, why, sizeof(why));
    cr_expect_eq(st, WEFT_ERR_SYSTEM);
    cr_expect_eq(n, 0);
    cr_expect_str_eq(why, ROCE "/class/infiniband/mlx5_9/ports/1/gids: No such file or directory");
    st = weft_ib_gids_from_sysfs(ROCE, "mlx5_0", 2, g, 4, &n, why, sizeof(why));
    cr_expect_eq(st, WEFT_ERR_SYSTEM);
    cr_expect_str_eq(why, ROCE "/class/infiniband/mlx5_0/ports/2/gids: No such file or directory");
    /* A file where the folder should be. */
    st = weft_ib_gids_from_sysfs(ROCE "/class/infiniband/mlx5_0/ports/1/gids/3/../../../../../..",
                                 "mlx5_0", 1, g, 4, &n, why, sizeof(why));
    cr_expect_eq(st, WEFT_ERR_SYSTEM, "a path through a file");
    st = weft_ib_gids_from_sysfs(ROCE, "../x", 1, g, 4, &n, why, sizeof(why));
    cr_expect_eq(st, WEFT_ERR_INVALID_ARG);
    cr_expect_str_eq(why, "bad device \"../x\" or port 1");
    cr_expect_eq(weft_ib_gids_from_sysfs(ROCE, "..", 1, g, 4, &n, why, sizeof(why)),
                 WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_ib_gids_from_sysfs(ROCE, "", 1, g, 4, &n, why, sizeof(why)),
                 WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_ib_gids_from_sysfs(ROCE, "mlx5_0", 0, g, 4, &n, why, sizeof(why)),
                 WEFT_ERR_INVALID_ARG);
    cr_expect_eq(weft_ib_gids_from_sysfs(ROCE, "mlx5_0", 256, g, 4, &n, why, sizeof(why)),
                 WEFT_ERR_INVALID_ARG);
}

/* ---- GID choice ------------------------------------------------------------- */

static struct weft_ib_gid mk(int index, const char *addr, int type)
{
    struct weft_ib_gid g;
    memset(&g, 0, sizeof(g));
    g.index = index;
    gid_of(addr, g.raw);
    g.type = type;
    return g;
}

/* The GID index picked (not the position), or -1; why into why. */
static int pick(const struct weft_ib_gid *c, int n, bool roce, int want, int family,
                const char *local, char *why, size_t whylen)
{
    uint8_t ip[16];
    if (local)
        cr_assert_eq(inet_pton(family, local, ip), 1, "%s", local);
    int pos = weft_ib_gid_pick(c, n, roce, want, family, local ? ip : NULL, why, whylen);
    cr_assert(pos >= -1 && pos < n, "position %d of %d", pos, n);
    return pos < 0 ? -1 : c[pos].index;
}

static void expect_pick(const struct weft_ib_gid *c, int n, bool roce, int want, int family,
                        const char *local, int index, const char *why_want)
{
    char why[256] = "junk";
    int got = pick(c, n, roce, want, family, local, why, sizeof(why));
    cr_expect_eq(got, index, "roce %d want %d family %d local %s: index %d, want %d (%s)", roce,
                 want, family, local ? local : "-", got, index, why);
    cr_expect_str_eq(why, why_want, "roce %d want %d family %d local %s", roce, want, family,
                     local ? local : "-");
}

Test(pick, roce_fixture)
{
    struct weft_ib_gid g[32];
    int n = read_gids(ROCE, "mlx5_0", g, 32);
    /* v2 of the lowest IPv4 address, over its v1 at a lower index. */
    expect_pick(g, n, true, -1, AF_INET, NULL, 3, "");
    expect_pick(g, n, true, -1, AF_INET, "10.0.0.5", 3, "");
    expect_pick(g, n, true, -1, AF_INET, "10.0.0.6", 9, "");
    expect_pick(g, n, true, -1, AF_INET, "10.0.0.99", 3,
                "no IPv4 GID carries the local address 10.0.0.99; took index 3 "
                "(::ffff:10.0.0.5, RoCE v2)");
    /* IPv6: the global address, never the link-local one nor a mapped one. */
    expect_pick(g, n, true, -1, AF_INET6, NULL, 5, "");
    expect_pick(g, n, true, -1, AF_INET6, "2001:db8::5", 5, "");
    expect_pick(g, n, true, -1, AF_INET6, "2001:db8::6", 5,
                "no IPv6 GID carries the local address 2001:db8::6; took index 5 "
                "(2001:db8::5, RoCE v2)");
}

Test(pick, want_index)
{
    struct weft_ib_gid g[32];
    int n = read_gids(ROCE, "mlx5_0", g, 32);
    expect_pick(g, n, true, 4, AF_INET, NULL, 4, "");   /* v1 of IPv6: asked for */
    expect_pick(g, n, true, 0, AF_INET, NULL, 0, "");
    expect_pick(g, n, false, 9, AF_INET, NULL, 9, ""); /* before the IB rule too */
    expect_pick(g, n, true, 6, AF_INET, NULL, -1,
                "GID index 6 (WEFT_IB_GID_INDEX) is empty or absent on this port");
    expect_pick(g, n, true, 12, AF_INET, NULL, -1,
                "GID index 12 (WEFT_IB_GID_INDEX) is empty or absent on this port");
    expect_pick(g, n, true, 200, AF_INET6, NULL, -1,
                "GID index 200 (WEFT_IB_GID_INDEX) is empty or absent on this port");
}

Test(pick, infiniband_takes_index_0)
{
    struct weft_ib_gid g[8];
    int n = read_gids(IB, "mlx5_2", g, 8);
    expect_pick(g, n, false, -1, AF_INET, NULL, 0, "");
    expect_pick(g, n, false, -1, AF_INET6, NULL, 0, "");
    expect_pick(g, n, false, 1, AF_INET, NULL, -1,
                "GID index 1 (WEFT_IB_GID_INDEX) is empty or absent on this port");
    struct weft_ib_gid no0[] = {mk(1, "fe80::2:c903:1:2345", WEFT_GID_IB)};
    expect_pick(no0, 1, false, -1, AF_INET, NULL, -1,
                "InfiniBand port without GID 0 (the port GID)");
}

Test(pick, type_order)
{
    /* Lowest index among equals, whatever the order of the array. */
    struct weft_ib_gid a[] = {mk(9, "::ffff:10.0.0.6", WEFT_GID_ROCE_V2),
                              mk(3, "::ffff:10.0.0.5", WEFT_GID_ROCE_V2),
                              mk(2, "::ffff:10.0.0.5", WEFT_GID_ROCE_V1)};
    expect_pick(a, 3, true, -1, AF_INET, NULL, 3, "");
    /* v1 over unknown (IPv6: unknown does not count as v2 there). */
    struct weft_ib_gid b[] = {mk(1, "2001:db8::1", WEFT_GID_UNKNOWN),
                              mk(5, "2001:db8::2", WEFT_GID_ROCE_V1)};
    expect_pick(b, 2, true, -1, AF_INET6, NULL, 5, "");
    /* Unknown and IPv4-mapped counts as v2: above v1. */
    struct weft_ib_gid c[] = {mk(1, "::ffff:10.0.0.1", WEFT_GID_ROCE_V1),
                              mk(2, "::ffff:10.0.0.2", WEFT_GID_UNKNOWN)};
    expect_pick(c, 2, true, -1, AF_INET, NULL, 2, "");
    /* ... but ties with a real v2 go to the lower index. */
    struct weft_ib_gid d[] = {mk(4, "::ffff:10.0.0.2", WEFT_GID_UNKNOWN),
                              mk(3, "::ffff:10.0.0.1", WEFT_GID_ROCE_V2)};
    expect_pick(d, 2, true, -1, AF_INET, NULL, 3, "");
    /* The local address beats the type. */
    struct weft_ib_gid e[] = {mk(2, "::ffff:10.0.0.5", WEFT_GID_ROCE_V1),
                              mk(3, "::ffff:10.0.0.6", WEFT_GID_ROCE_V2)};
    expect_pick(e, 2, true, -1, AF_INET, "10.0.0.5", 2, "");
    expect_pick(e, 2, true, -1, AF_INET, NULL, 3, "");
}

Test(pick, unknown_types_from_sysfs)
{
    struct weft_ib_gid g[8];
    int n = read_gids(MULTI, "mlx5_1", g, 8);
    expect_pick(g, n, true, -1, AF_INET, NULL, 1, "");
    expect_pick(g, n, true, -1, AF_INET, "10.1.1.1", 1, "");
    /* No IPv6 address; the mapped unknown one counts as the v2 to fall to. */
    expect_pick(g, n, true, -1, AF_INET6, NULL, 1,
                "no RoCE GID with an IPv6 address; falling back to index 1 "
                "(::ffff:10.1.1.1, RoCE v2)");
}

Test(pick, fallbacks)
{
    struct weft_ib_gid g[8];
    int n = read_gids(MULTI, "mlx5_0", g, 8);
    expect_pick(g, n, true, -1, AF_INET6, NULL, 1,
                "no RoCE GID with an IPv6 address; falling back to index 1 "
                "(fe80::e42:a1ff:fe00:10, RoCE v2)");
    n = read_gids(MULTI, "mlx5_bond_0", g, 8);
    expect_pick(g, n, true, -1, AF_INET, NULL, 3, "");
    expect_pick(g, n, true, -1, AF_INET6, NULL, 1,
                "no RoCE GID with an IPv6 address; falling back to index 1 "
                "(fe80::e42:a1ff:fe00:20, RoCE v2)");
    struct weft_ib_gid v1[] = {mk(2, "fe80::2", WEFT_GID_ROCE_V1),
                               mk(0, "fe80::1", WEFT_GID_ROCE_V1)};
    expect_pick(v1, 2, true, -1, AF_INET, NULL, 0,
                "no RoCE GID with an IPv4 address and none of RoCE v2; falling back to index 0 "
                "(fe80::1, RoCE v1)");
    expect_pick(NULL, 0, true, -1, AF_INET, NULL, -1, "the port has no GIDs");
    expect_pick(v1, 0, false, -1, AF_INET, NULL, -1, "the port has no GIDs");
    expect_pick(v1, 2, true, -1, -1, NULL, -1,
                "address family -1 is neither AF_INET nor AF_INET6");
}

/* ---- small parts ------------------------------------------------------------- */

Test(misc, addr_family)
{
    cr_expect_eq(weft_ib_addr_family("AF_INET"), AF_INET);
    cr_expect_eq(weft_ib_addr_family("AF_INET6"), AF_INET6);
    cr_expect_eq(weft_ib_addr_family("af_inet6"), AF_INET6);
    cr_expect_eq(weft_ib_addr_family("4"), AF_INET);
    cr_expect_eq(weft_ib_addr_family("6"), AF_INET6);
    const char *bad[] = {"", "AF_INET7", "46", " 4", "4 ", "inet", "AF_UNIX", "AF_INET6x"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        cr_expect_eq(weft_ib_addr_family(bad[i]), -1, "'%s'", bad[i]);
    cr_expect_eq(weft_ib_addr_family(NULL), -1);
}

Test(misc, gid_str)
{
    uint8_t raw[16];
    char buf[INET6_ADDRSTRLEN];
    gid_of("::ffff:10.0.0.5", raw);
    cr_expect_str_eq(weft_ib_gid_str(raw, buf, sizeof(buf)), "::ffff:10.0.0.5");
    gid_of("fe80:0000:0000:0000:0202:c9ff:fe00:0001", raw);
    cr_expect_str_eq(weft_ib_gid_str(raw, buf, sizeof(buf)), "fe80::202:c9ff:fe00:1");
    cr_expect_str_eq(weft_ib_gid_str(raw, buf, 8), "");
}

static void clear_ib_env(void)
{
    const char *names[] = {"WEFT_IB_HCA", "NCCL_IB_HCA", "WEFT_IB_GID_INDEX", "NCCL_IB_GID_INDEX",
                           "WEFT_IB_ADDR_FAMILY", "NCCL_IB_ADDR_FAMILY", "WEFT_IB_TC",
                           "NCCL_IB_TC", "WEFT_IB_SL", "NCCL_IB_SL", "WEFT_IB_TIMEOUT",
                           "NCCL_IB_TIMEOUT", "WEFT_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT",
                           "WEFT_IB_QPS_PER_CONNECTION", "NCCL_IB_QPS_PER_CONNECTION",
                           "WEFT_IB_CM", "WEFT_IB_SYSFS"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        unsetenv(names[i]);
    weft_transport_register_params(); /* the WEFT_IB_* table is the verbs transport's */
    weft_param_reload();
}

/* Each test runs in its own process (Criterion's default), so the
 * environment set here stays here. */
Test(params, defaults)
{
    clear_ib_env();
    cr_expect_str_eq(weft_param_str("WEFT_IB_HCA"), "");
    cr_expect_eq(weft_param_int("WEFT_IB_GID_INDEX"), -1);
    cr_expect_str_eq(weft_param_str("WEFT_IB_ADDR_FAMILY"), "AF_INET");
    cr_expect_eq(weft_ib_addr_family(weft_param_str("WEFT_IB_ADDR_FAMILY")), AF_INET);
    cr_expect_eq(weft_param_int("WEFT_IB_TC"), 0);
    cr_expect_eq(weft_param_int("WEFT_IB_SL"), 0);
    cr_expect_eq(weft_param_int("WEFT_IB_TIMEOUT"), 20);
    cr_expect_eq(weft_param_int("WEFT_IB_RETRY_CNT"), 7);
    cr_expect_eq(weft_param_int("WEFT_IB_QPS_PER_CONNECTION"), 1);
    cr_expect_str_eq(weft_param_str("WEFT_IB_CM"), "auto");
    cr_expect_str_eq(weft_param_str("WEFT_IB_SYSFS"), "/sys");
    cr_expect_null(weft_param_source("WEFT_IB_GID_INDEX"));
}

Test(params, nccl_aliases)
{
    clear_ib_env();
    setenv("NCCL_IB_HCA", "=mlx5_1:1", 1);
    setenv("NCCL_IB_GID_INDEX", "3", 1);
    setenv("NCCL_IB_ADDR_FAMILY", "AF_INET6", 1);
    setenv("NCCL_IB_TC", "106", 1);
    setenv("NCCL_IB_SL", "3", 1);
    setenv("NCCL_IB_TIMEOUT", "22", 1);
    setenv("NCCL_IB_RETRY_CNT", "5", 1);
    setenv("NCCL_IB_QPS_PER_CONNECTION", "4", 1);
    setenv("WEFT_IB_TIMEOUT", "18", 1); /* weft's name wins */
    weft_param_reload();
    cr_expect_str_eq(weft_param_str("WEFT_IB_HCA"), "=mlx5_1:1");
    cr_expect_eq(weft_param_int("WEFT_IB_GID_INDEX"), 3);
    cr_expect_str_eq(weft_param_source("WEFT_IB_GID_INDEX"), "NCCL_IB_GID_INDEX");
    cr_expect_str_eq(weft_param_str("WEFT_IB_ADDR_FAMILY"), "AF_INET6");
    cr_expect_eq(weft_param_int("WEFT_IB_TC"), 106);
    cr_expect_eq(weft_param_int("WEFT_IB_SL"), 3);
    cr_expect_eq(weft_param_int("WEFT_IB_TIMEOUT"), 18);
    cr_expect_str_eq(weft_param_source("WEFT_IB_TIMEOUT"), "WEFT_IB_TIMEOUT");
    cr_expect_eq(weft_param_int("WEFT_IB_RETRY_CNT"), 5);
    cr_expect_eq(weft_param_int("WEFT_IB_QPS_PER_CONNECTION"), 4);
    clear_ib_env();
}
