/*
 * test_topo.c - the host probe (this machine, fixture /sys trees, missing
 * and garbled files), the transport registry, the link table's defaults
 * per host layout and WEFT_TRANSPORT, the topology file (good, each kind of bad line, random
 * bytes) and the alpha-beta fit.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "testutil.h"
#include "select/topo.h"

/* The built-in transports' link kinds, found by name as any caller would. */
#define SELF weft_transport_find("self")
#define SHM weft_transport_find("shm")
#define TCP weft_transport_find("tcp")
#define VERBS weft_transport_find("verbs")

/* The tables these tests model join hosts with tcp (verbs has its own rows). */
#define SHM_TCP ((1u << SHM) | (1u << TCP))

/* ---- fixture trees --------------------------------------------------------- */

static char fixture[256];

static void mkdirs(const char *path)
{
    char p[1024];
    snprintf(p, sizeof(p), "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(p, 0755);
            *s = '/';
        }
    mkdir(p, 0755);
}

/* Writes len bytes (strlen when len < 0) to fixture/rel, making folders. */
static void put_n(const char *rel, const char *text, long len)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", fixture, rel);
    char *slash = strrchr(path, '/');
    *slash = '\0';
    mkdirs(path);
    *slash = '/';
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s: %s", path, strerror(errno));
    size_t n = len < 0 ? strlen(text) : (size_t)len;
    cr_assert_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}

static void put(const char *rel, const char *text)
{
    put_n(rel, text, -1);
}

static void putf(const char *rel_fmt, const char *arg, const char *text)
{
    char rel[512];
    snprintf(rel, sizeof(rel), rel_fmt, arg);
    put(rel, text);
}

static void dir(const char *rel)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", fixture, rel);
    mkdirs(path);
}

static void link_(const char *rel, const char *target)
{
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", fixture, rel);
    cr_assert_eq(symlink(target, path), 0, "%s: %s", path, strerror(errno));
}

static void new_fixture(void)
{
    snprintf(fixture, sizeof(fixture), "/tmp/weft-topo-XXXXXX");
    cr_assert_not_null(mkdtemp(fixture));
}

static void drop_fixture(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", fixture);
    cr_assert_eq(system(cmd), 0);
}

/* Two sockets x 2 cores x 2 threads, two NUMA nodes, four NICs of the
 * kinds /sys shows (PCI through virtio, virtual, old-style directory, one
 * with numa_node -1 placed by local_cpulist), three NVIDIA GPUs among
 * other PCI devices. */
static void two_socket_fixture(void)
{
    new_fixture();
    put("sys/devices/system/cpu/online", "0-7\n");
    for (int c = 0; c < 8; c++) {
        char rel[256], v[16];
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
        snprintf(v, sizeof(v), "%d\n", c / 4);
        put(rel, v);
        snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu%d/topology/core_id", c);
        snprintf(v, sizeof(v), "%d\n", (c % 4) / 2);
        put(rel, v);
    }
    /* cpu0's caches, index by index: level, type, size. */
    static const char *const files[3] = {"level", "type", "size"};
    static const char *const caches[4][3] = {
        {"1\n", "Data\n", "32K\n"},
        {"1\n", "Instruction\n", "32K\n"},
        {"2\n", "Unified\n", "1024K\n"},
        {"3\n", "Unified\n", "16M\n"},
    };
    for (int i = 0; i < 4; i++)
        for (int f = 0; f < 3; f++) {
            char rel[256];
            snprintf(rel, sizeof(rel), "sys/devices/system/cpu/cpu0/cache/index%d/%s", i, files[f]);
            put(rel, caches[i][f]);
        }
    put("sys/devices/system/cpu/cpu0/cache/index3/shared_cpu_list", "0-3\n");
    put("sys/devices/system/node/online", "0-1\n");
    put("sys/devices/system/node/has_cpu", "0-1\n");
    put("sys/devices/system/node/node0/cpulist", "0-3\n");
    put("sys/devices/system/node/node0/meminfo",
        "Node 0 MemTotal:       1024 kB\nNode 0 MemFree:        512 kB\n");
    put("sys/devices/system/node/node1/cpulist", "4-7\n");
    put("proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Fake CPU @ "
        "2.0GHz\nflags\t\t: fpu\n\nprocessor\t: 1\nmodel name\t: Fake CPU @ 2.0GHz\n");
    put("proc/self/status", "Name:\tweft\nCpus_allowed:\t3c\nCpus_allowed_list:\t2-5\n");
    /* NICs */
    put("sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0/speed", "25000\n");
    put("sys/devices/pci0000:00/0000:00:03.0/virtio2/net/eth0/operstate", "up\n");
    put("sys/devices/virtual/net/lo/operstate", "unknown\n");
    put("sys/devices/pci0000:80/0000:81:00.0/net/ib0/speed", "100000\n");
    put("sys/devices/pci0000:80/0000:81:00.0/net/ib0/operstate", "up\n");
    dir("sys/devices/pci0000:00/0000:00:05.0");
    dir("sys/class/net/eth9");
    put("sys/class/net/eth9/operstate", "down\n");
    put("sys/class/net/bonding_masters", "\n");
    link_("sys/class/net/eth0", "../../devices/pci0000:00/0000:00:03.0/virtio2/net/eth0");
    link_("sys/class/net/lo", "../../devices/virtual/net/lo");
    link_("sys/class/net/ib0", "../../devices/pci0000:80/0000:81:00.0/net/ib0");
    link_("sys/class/net/eth9/device", "../../../devices/pci0000:00/0000:00:05.0");
    /* PCI */
    putf("sys/bus/pci/devices/%s/numa_node", "0000:00:03.0", "1\n");
    putf("sys/bus/pci/devices/%s/class", "0000:00:03.0", "0x020000\n");
    putf("sys/bus/pci/devices/%s/vendor", "0000:00:03.0", "0x1af4\n");
    putf("sys/bus/pci/devices/%s/numa_node", "0000:00:05.0", "0\n");
    putf("sys/bus/pci/devices/%s/numa_node", "0000:81:00.0", "-1\n");
    putf("sys/bus/pci/devices/%s/local_cpulist", "0000:81:00.0", "4-7\n");
    putf("sys/bus/pci/devices/%s/class", "0000:81:00.0", "0x020700\n");
    putf("sys/bus/pci/devices/%s/vendor", "0000:81:00.0", "0x15b3\n");
    putf("sys/bus/pci/devices/%s/class", "0000:3b:00.0", "0x030200\n");
    putf("sys/bus/pci/devices/%s/vendor", "0000:3b:00.0", "0x10de\n");
    putf("sys/bus/pci/devices/%s/device", "0000:3b:00.0", "0x2330\n");
    putf("sys/bus/pci/devices/%s/numa_node", "0000:3b:00.0", "0\n");
    putf("sys/bus/pci/devices/%s/class", "0000:af:00.0", "0x030000\n");
    putf("sys/bus/pci/devices/%s/vendor", "0000:af:00.0", "0x10de\n");
    putf("sys/bus/pci/devices/%s/device", "0000:af:00.0", "0x20b0\n");
    putf("sys/bus/pci/devices/%s/numa_node", "0000:af:00.0", "-1\n");
    putf("sys/bus/pci/devices/%s/local_cpulist", "0000:af:00.0", "4-7\n");
    putf("sys/bus/pci/devices/%s/class", "0000:02:00.0", "0x030000\n"); /* ASPEED VGA */
    putf("sys/bus/pci/devices/%s/vendor", "0000:02:00.0", "0x1a03\n");
    putf("sys/bus/pci/devices/%s/class", "0001:00:00.0", "0x030000\n"); /* no numa info */
    putf("sys/bus/pci/devices/%s/vendor", "0001:00:00.0", "0x10de\n");
}

static char *print_topo(const struct weft_topo *t)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    weft_topo_print(t, f);
    fclose(f);
    return buf;
}

/* ---- the probe ---------------------------------------------------------------- */

Test(probe, this_machine_is_sane, .timeout = 60)
{
    static struct weft_topo t;
    weft_topo_probe(&t);
    cr_assert(strncmp(t.source, "hwloc", 5) == 0 || strcmp(t.source, "sysfs") == 0, "%s", t.source);
    cr_assert_geq(t.threads, 1);
    cr_assert_geq(t.cores, 1);
    cr_assert_leq(t.cores, t.threads);
    cr_assert_geq(t.sockets, 1);
    cr_assert_leq(t.sockets, t.cores);
    cr_assert_geq(t.nallowed, 1);
    cr_assert_eq(CPU_COUNT(&t.allowed), t.nallowed);
    cr_assert_geq(t.nnuma, 1);
    for (int i = 0; i < t.nnuma; i++)
        cr_assert_geq(t.numa[i].id, 0);
    cr_assert_leq(t.nnics, t.nics_found);
    cr_assert_leq(t.ngpus, t.gpus_found);
    for (int i = 0; i < t.nnics; i++)
        cr_assert(t.nics[i].name[0] != '\0');
    char *out = print_topo(&t);
    cr_assert(strstr(out, "host topology") && strstr(out, "layout"), "%s", out);
    free(out);

    /* The sysfs reader alone agrees that there is a machine here. */
    static struct weft_topo s;
    weft_topo_probe_root(&s, "/");
    cr_assert_str_eq(s.source, "sysfs");
    cr_assert_geq(s.threads, 1);
    cr_assert_geq(s.nallowed, 1);
    cr_assert_eq(s.nnics, t.nnics);
}

Test(probe, fixture_tree)
{
    two_socket_fixture();
    static struct weft_topo t;
    weft_topo_probe_root(&t, fixture);
    cr_assert_str_eq(t.source, "sysfs");
    cr_assert_str_eq(t.cpu_model, "Fake CPU @ 2.0GHz");
    cr_assert_eq(t.sockets, 2);
    cr_assert_eq(t.cores, 4);
    cr_assert_eq(t.threads, 8);
    cr_assert_eq(t.l2_bytes, 1 << 20);
    cr_assert_eq(t.l3_bytes, 16 << 20);
    cr_assert_eq(t.l3_cpus, 4);
    cr_assert_eq(t.nnuma, 2);
    cr_assert_eq(t.numa[0].id, 0);
    cr_assert_eq(t.numa[0].ncpus, 4);
    cr_assert(CPU_ISSET(3, &t.numa[0].cpus) && !CPU_ISSET(4, &t.numa[0].cpus));
    cr_assert_eq(t.numa[0].mem_bytes, 1024 * 1024);
    cr_assert_eq(t.numa[1].id, 1);
    cr_assert_eq(t.numa[1].mem_bytes, -1);
    cr_assert_eq(t.nallowed, 4);
    cr_assert(CPU_ISSET(2, &t.allowed) && CPU_ISSET(5, &t.allowed) && !CPU_ISSET(6, &t.allowed));

    cr_assert_eq(t.nics_found, 4); /* bonding_masters is a file, not a NIC */
    cr_assert_eq(t.nnics, 4);
    const struct weft_topo_nic *n = t.nics;
    cr_assert_str_eq(n[0].name, "eth0");
    cr_assert_str_eq(n[0].bus_id, "0000:00:03.0");
    cr_assert_eq(n[0].numa, 1);
    cr_assert_eq(n[0].speed_mbps, 25000);
    cr_assert_str_eq(n[0].state, "up");
    cr_assert_str_eq(n[1].name, "eth9");
    cr_assert_str_eq(n[1].bus_id, "0000:00:05.0");
    cr_assert_eq(n[1].numa, 0);
    cr_assert_eq(n[1].speed_mbps, -1);
    cr_assert_str_eq(n[2].name, "ib0");
    cr_assert_str_eq(n[2].bus_id, "0000:81:00.0");
    cr_assert_eq(n[2].numa, 1, "numa_node -1: placed by local_cpulist");
    cr_assert_eq(n[2].speed_mbps, 100000);
    cr_assert_str_eq(n[3].name, "lo");
    cr_assert_str_eq(n[3].bus_id, "virtual");
    cr_assert_eq(n[3].numa, -1);
    cr_assert_eq(n[3].speed_mbps, -1);

    cr_assert_eq(t.gpus_found, 3);
    cr_assert_str_eq(t.gpus[0].bus_id, "0000:3b:00.0");
    cr_assert_eq(t.gpus[0].device_id, 0x2330);
    cr_assert_eq(t.gpus[0].numa, 0);
    cr_assert_str_eq(t.gpus[1].bus_id, "0000:af:00.0");
    cr_assert_eq(t.gpus[1].numa, 1);
    cr_assert_str_eq(t.gpus[2].bus_id, "0001:00:00.0");
    cr_assert_eq(t.gpus[2].numa, -1, "two nodes and no hint: unknown");

    char *out = print_topo(&t);
    cr_assert(strstr(out, "2 socket(s), 4 core(s), 8 hardware thread(s)"), "%s", out);
    cr_assert(strstr(out, "4 CPU(s): 2-5"), "%s", out);
    cr_assert(strstr(out, "L3 16 MiB shared by 4 CPU(s)"), "%s", out);
    cr_assert(strstr(out, "ib0") && strstr(out, "100 Gbit/s"), "%s", out);
    free(out);
    drop_fixture();
}

Test(probe, nothing_there)
{
    static struct weft_topo t;
    new_fixture();
    const char *roots[] = {fixture, "/nonexistent/weft", "relative/path"};
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(roots); k++) {
        weft_topo_probe_root(&t, roots[k]);
        cr_assert_str_eq(t.source, "sysfs");
        cr_assert_str_eq(t.cpu_model, "");
        cr_assert_eq(t.sockets, -1);
        cr_assert_eq(t.cores, -1);
        cr_assert_eq(t.threads, -1);
        cr_assert_eq(t.l2_bytes, -1);
        cr_assert_eq(t.l3_bytes, -1);
        cr_assert_eq(t.nnuma, 0);
        cr_assert_eq(t.nnics, 0);
        cr_assert_eq(t.ngpus, 0);
        cr_assert_eq(t.nallowed, -1);
        char *out = print_topo(&t);
        cr_assert(strstr(out, "unknown"), "%s", out);
        free(out);
    }
    /* A root longer than any path: nothing readable, no overflow. */
    char longroot[8192];
    memset(longroot, 'a', sizeof(longroot) - 1);
    longroot[0] = '/';
    longroot[sizeof(longroot) - 1] = '\0';
    weft_topo_probe_root(&t, longroot);
    cr_assert_eq(t.threads, -1);
    drop_fixture();
}

Test(probe, garbled_files)
{
    new_fixture();
    put("sys/devices/system/cpu/online", "0-3\n");
    put("sys/devices/system/cpu/cpu0/topology/physical_package_id", "abc\n");
    put("sys/devices/system/cpu/cpu0/topology/core_id", "0\n");
    put("sys/devices/system/cpu/cpu0/cache/index2/level", "2\n");
    put("sys/devices/system/cpu/cpu0/cache/index2/type", "Unified\n");
    put("sys/devices/system/cpu/cpu0/cache/index2/size", "lots\n");
    put("sys/devices/system/cpu/cpu0/cache/index3/level", "99999999999999999999\n");
    put("sys/devices/system/node/node0/cpulist", "99999999999999-2\n");
    put("sys/devices/system/node/node1/cpulist", "garbage\n");
    put("sys/devices/system/node/node1/meminfo", "MemTotal: -5 kB");
    put("sys/devices/system/node/nodeX/cpulist", "0\n");
    put("sys/devices/system/node/node99999999999999999999/cpulist", "0\n");
    put("sys/class/net/eth0/speed", "fast\n");
    put_n("sys/class/net/eth0/operstate", "u\x01\xffp\0zz", 7);
    put("sys/class/net/this-name-is-much-longer-than-ifnamsiz-allows/speed", "1\n");
    put("sys/bus/pci/devices/0000:00:01.0/class", "0x030000\n");
    put("sys/bus/pci/devices/0000:00:01.0/vendor", "0x10de\n");
    put("sys/bus/pci/devices/0000:00:01.0/numa_node", "zz\n");
    put("sys/bus/pci/devices/not-a-pci-id/class", "0x030000\n");
    put("sys/bus/pci/devices/not-a-pci-id/vendor", "0x10de\n");
    static const char cpuinfo[] = "model name\t: \x01\x02\xff\xfe\n\0\0\0garbage";
    put_n("proc/cpuinfo", cpuinfo, sizeof(cpuinfo) - 1);
    put("proc/self/status", "Cpus_allowed_list:\t5-2\n");
    static struct weft_topo t;
    weft_topo_probe_root(&t, fixture);
    cr_assert_eq(t.threads, 4);
    cr_assert_eq(t.sockets, -1, "an unreadable CPU leaves the count unknown");
    cr_assert_eq(t.cores, -1);
    cr_assert_eq(t.l2_bytes, -1);
    cr_assert_eq(t.l3_bytes, -1);
    cr_assert_eq(t.nnuma, 2);
    cr_assert_eq(t.numa[0].ncpus, 0);
    cr_assert_eq(t.numa[1].ncpus, 0);
    cr_assert_eq(t.numa[1].mem_bytes, -1);
    cr_assert_eq(t.nnics, 1);
    cr_assert_str_eq(t.nics[0].name, "eth0");
    cr_assert_eq(t.nics[0].speed_mbps, -1);
    for (const char *s = t.nics[0].state; *s; s++)
        cr_assert(*s >= 0x20 && *s < 0x7f);
    for (const char *s = t.cpu_model; *s; s++)
        cr_assert(*s >= 0x20 && *s < 0x7f);
    cr_assert_eq(t.ngpus, 1);
    cr_assert_eq(t.gpus[0].numa, -1);
    cr_assert_eq(t.nallowed, -1);
    free(print_topo(&t));
    drop_fixture();
}

Test(probe, many_nics_are_capped)
{
    new_fixture();
    for (int i = 0; i < WEFT_TOPO_MAX_NICS + 6; i++) {
        char rel[128];
        snprintf(rel, sizeof(rel), "sys/class/net/veth%03d/operstate", i);
        put(rel, "up\n");
    }
    static struct weft_topo t;
    weft_topo_probe_root(&t, fixture);
    cr_assert_eq(t.nnics, WEFT_TOPO_MAX_NICS);
    cr_assert_eq(t.nics_found, WEFT_TOPO_MAX_NICS + 6);
    char *out = print_topo(&t);
    cr_assert(strstr(out, "and 6 more"), "%s", out);
    free(out);
    drop_fixture();
}

Test(probe, cpulist_format)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    char buf[64];
    weft_topo_cpulist(&s, buf, sizeof(buf));
    cr_assert_str_eq(buf, "");
    CPU_SET(0, &s);
    CPU_SET(1, &s);
    CPU_SET(2, &s);
    CPU_SET(5, &s);
    CPU_SET(7, &s);
    CPU_SET(8, &s);
    weft_topo_cpulist(&s, buf, sizeof(buf));
    cr_assert_str_eq(buf, "0-2,5,7-8");
    for (int c = 0; c < 200; c += 2)
        CPU_SET(c, &s);
    char small[16];
    weft_topo_cpulist(&s, small, sizeof(small));
    cr_assert(strlen(small) < sizeof(small) && strstr(small, "..."), "%s", small);
}

/* ---- the link table: defaults ------------------------------------------------------ */

static struct weft_link get(const struct weft_link_table *tab, int i, int j)
{
    struct weft_link l;
    cr_assert_eq(weft_topo_table_get(tab, i, j, &l), WEFT_OK, "get(%d, %d)", i, j);
    struct weft_link r;
    cr_assert_eq(weft_topo_table_get(tab, j, i, &r), WEFT_OK);
    cr_assert(l.transport == r.transport && l.alpha == r.alpha && l.beta == r.beta,
              "link %d-%d is not symmetric", i, j);
    return l;
}

static bool close_to(double a, double b)
{
    return fabs(a - b) <= 1e-9 * fabs(b) + 1e-300;
}

/* What generic code relies on: one base transport, last in progress order
 * (progress sleeps in it), reaching every other rank; unique names;
 * distinct priorities; a default cost; settings named WEFT_*. */
Test(registry, descriptors_are_consistent)
{
    int order[WEFT_MAX_TRANSPORTS], n = weft_transport_by_priority(order), bases = 0;
    cr_assert(n == weft_transport_count() && n >= 1 && n <= WEFT_MAX_TRANSPORTS);
    cr_assert_null(weft_transports[n]);
    for (int t = 0; t < n; t++) {
        const struct weft_transport_desc *d = weft_transports[t];
        cr_assert(d->name && d->can_reach, "transport %d", t);
        cr_assert_eq(weft_transport_find(d->name), t, "%s is named twice", d->name);
        cr_assert(d->alpha >= 0 && d->beta > 0 && isfinite(d->alpha), "%s", d->name);
        for (size_t i = 0; i < d->nparams; i++)
            cr_assert(strncmp(d->params[i].name, "WEFT_", 5) == 0, "%s", d->params[i].name);
        bases += (d->flags & WEFT_TP_BASE) != 0;
        if (t > 0)
            cr_assert_lt(weft_transports[order[t - 1]]->priority,
                         weft_transports[order[t]]->priority, "priorities must differ");
    }
    cr_assert_eq(bases, 1);
    const struct weft_transport_desc *base = weft_transports[weft_transport_base()];
    const struct weft_transport_pair here = {.same_host = true}, there = {.same_host = false};
    cr_assert_eq(order[n - 1], weft_transport_base(), "the base transport must come last");
    cr_assert(base->ops && base->can_reach(&here) && base->can_reach(&there));
    cr_assert_eq(weft_transport_find("no-such"), -1);
    cr_assert_str_eq(weft_transport_name(n), "?");
}

Test(table, one_host)
{
    struct weft_link_table tab;
    char err[256];
    cr_assert_eq(weft_topo_table_init(&tab, 4, NULL, SHM_TCP, err, sizeof(err)),
                 WEFT_OK, "%s", err);
    cr_assert_eq(tab.nhosts, 1);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            struct weft_link l = get(&tab, i, j);
            cr_assert_eq(l.transport, i == j ? SELF : SHM);
            cr_assert_eq(l.source, WEFT_LINK_FROM_DEFAULT);
            cr_assert(close_to(l.alpha, i == j ? weft_transports[SELF]->alpha : weft_transports[SHM]->alpha));
            cr_assert(close_to(l.beta, i == j ? weft_transports[SELF]->beta : weft_transports[SHM]->beta));
        }
    struct weft_link l;
    cr_assert_eq(weft_topo_table_get(&tab, 0, 4, &l), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_table_get(&tab, -1, 0, &l), WEFT_ERR_INVALID_ARG);
    weft_topo_table_fini(&tab);
    weft_topo_table_fini(&tab); /* twice is fine */
    weft_topo_table_fini(NULL);
}

Test(table, host_layouts)
{
    struct weft_link_table tab;
    char err[256];
    const char *inter[] = {"a", "b", "a", "b", "c"};
    cr_assert_eq(weft_topo_table_init(&tab, 5, inter, SHM_TCP, err, sizeof(err)),
                 WEFT_OK, "%s", err);
    cr_assert_eq(tab.nhosts, 3);
    cr_assert_eq(tab.host[0], 0);
    cr_assert_eq(tab.host[1], 1);
    cr_assert_eq(tab.host[2], 0);
    cr_assert_eq(tab.host[4], 2);
    cr_assert_str_eq(tab.hostid[1], "b");
    cr_assert_eq(get(&tab, 0, 2).transport, SHM);
    cr_assert_eq(get(&tab, 1, 3).transport, SHM);
    cr_assert_eq(get(&tab, 0, 1).transport, TCP);
    cr_assert_eq(get(&tab, 3, 4).transport, TCP);
    cr_assert(close_to(get(&tab, 0, 1).alpha, weft_transports[TCP]->alpha));
    cr_assert(close_to(get(&tab, 0, 1).beta, weft_transports[TCP]->beta));
    cr_assert_eq(get(&tab, 4, 4).transport, SELF);
    weft_topo_table_fini(&tab);

    /* One rank per host: everything over tcp. */
    const char *each[] = {"h0", "h1", "h2"};
    cr_assert_eq(weft_topo_table_init(&tab, 3, each, SHM_TCP, err, sizeof(err)),
                 WEFT_OK);
    for (int i = 0; i < 3; i++)
        for (int j = 0; j < 3; j++)
            cr_assert_eq(get(&tab, i, j).transport, i == j ? SELF : TCP);
    weft_topo_table_fini(&tab);
}

Test(table, many_ranks_stay_small, .timeout = 30)
{
    enum { N = 10000, H = 100 };
    static char names[H][16];
    static const char *ids[N];
    for (int h = 0; h < H; h++)
        snprintf(names[h], sizeof(names[h]), "node%03d", h);
    for (int r = 0; r < N; r++)
        ids[r] = names[r / (N / H)];
    struct weft_link_table tab;
    char err[256];
    cr_assert_eq(weft_topo_table_init(&tab, N, ids, SHM_TCP, err, sizeof(err)),
                 WEFT_OK);
    cr_assert_eq(tab.nhosts, H);
    cr_assert_eq(get(&tab, 0, 99).transport, SHM);
    cr_assert_eq(get(&tab, 0, 100).transport, TCP);
    cr_assert_eq(get(&tab, 9999, 9900).transport, SHM);
    const char *file = "hosts node00* node09* alpha_us=99\npair 0 9999 gbit=1\n";
    cr_assert_eq(weft_topo_table_parse(&tab, file, strlen(file), "t", err, sizeof(err)), WEFT_OK,
                 "%s", err);
    cr_assert(close_to(get(&tab, 5, 9500).alpha, 99e-6));
    cr_assert(close_to(get(&tab, 0, 9999).beta, 8e-9));
    cr_assert(close_to(get(&tab, 5, 100).alpha, weft_transports[TCP]->alpha));
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    weft_topo_table_print(&tab, f);
    fclose(f);
    cr_assert(strstr(buf, "first 512 ranks") && strstr(buf, "and 84 more hosts"), "%s", buf);
    free(buf);
    weft_topo_table_fini(&tab);
}

Test(table, weft_transport)
{
    struct weft_link_table tab;
    char err[256];
    unsigned allowed;
    const char *two[] = {"a", "a", "b", "b"};
    /* tcp only, or shm excluded: every pair over tcp, on one host too. */
    const char *tcp_only[] = {"tcp", "^shm,verbs", "TCP"};
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(tcp_only); k++) {
        cr_assert_eq(weft_topo_parse_transports(tcp_only[k], &allowed, err, sizeof(err)), WEFT_OK);
        cr_assert_eq(allowed, 1u << TCP);
        cr_assert_eq(weft_topo_table_init(&tab, 4, two, allowed, err, sizeof(err)), WEFT_OK);
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                cr_assert_eq(get(&tab, i, j).transport, i == j ? SELF : TCP);
        weft_topo_table_fini(&tab);
    }
    cr_assert_eq(weft_topo_parse_transports("", &allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(allowed, weft_transport_choosable());
    cr_assert_eq(weft_topo_parse_transports("shm,tcp", &allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(allowed, SHM_TCP);
    /* With verbs allowed, pairs across hosts take it; one host keeps shm. */
    cr_assert_eq(weft_topo_parse_transports("shm,verbs", &allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(weft_topo_table_init(&tab, 4, two, allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(get(&tab, 0, 1).transport, SHM);
    cr_assert_eq(get(&tab, 0, 2).transport, VERBS);
    weft_topo_table_fini(&tab);
    cr_assert_eq(weft_topo_parse_transports("verbs", &allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(weft_topo_table_init(&tab, 4, two, allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(get(&tab, 0, 1).transport, VERBS);
    weft_topo_table_fini(&tab);
    /* shm alone works on one host and is refused across hosts. */
    cr_assert_eq(weft_topo_parse_transports("shm", &allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(weft_topo_table_init(&tab, 2, two, allowed, err, sizeof(err)), WEFT_OK);
    cr_assert_eq(get(&tab, 0, 1).transport, SHM);
    weft_topo_table_fini(&tab);
    cr_assert_eq(weft_topo_table_init(&tab, 4, two, allowed, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "ranks 0 and 2") && strstr(err, "only shm"), "%s", err);
    cr_assert_null(tab.host);
    weft_topo_table_fini(&tab);
    /* Bad lists. */
    cr_assert_eq(weft_topo_parse_transports("ib", &allowed, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "'ib'"), "%s", err);
    cr_assert_eq(weft_topo_parse_transports("^shm,tcp,verbs", &allowed, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "leaves no transport"), "%s", err);
    cr_assert_eq(weft_topo_table_init(&tab, 2, NULL, 0, err, sizeof(err)), WEFT_ERR_INVALID_ARG);
}

Test(table, bad_init)
{
    struct weft_link_table tab;
    char err[256];
    cr_assert_eq(weft_topo_table_init(&tab, 0, NULL, SHM_TCP, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    const char *holes[] = {"a", NULL};
    cr_assert_eq(weft_topo_table_init(&tab, 2, holes, SHM_TCP, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "rank 1"), "%s", err);
    weft_topo_table_fini(&tab);
    /* Hostile host ids are quoted, not printed raw. */
    const char *odd[] = {"a\x01\xff", "b"};
    cr_assert_eq(weft_topo_table_init(&tab, 2, odd, 1u << SHM, err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "a\\x01\\xff"), "%s", err);
}

Test(table, measured)
{
    struct weft_link_table tab;
    char err[256];
    const char *ids[] = {"a", "a", "b"};
    cr_assert_eq(weft_topo_table_init(&tab, 3, ids, SHM_TCP, err, sizeof(err)),
                 WEFT_OK);
    cr_assert_eq(weft_topo_table_set_measured(&tab, 1, 0, 2e-6, 1e-10), WEFT_OK);
    cr_assert_eq(weft_topo_table_set_measured(&tab, 0, 2, 30e-6, 1e-9), WEFT_OK);
    struct weft_link l = get(&tab, 0, 1);
    cr_assert_eq(l.source, WEFT_LINK_FROM_MEASURED);
    cr_assert_eq(l.transport, SHM);
    cr_assert(close_to(l.alpha, 2e-6) && close_to(l.beta, 1e-10));
    cr_assert(close_to(get(&tab, 2, 0).alpha, 30e-6));
    /* Bad measurements change nothing. */
    cr_assert_eq(weft_topo_table_set_measured(&tab, 0, 0, 1e-6, 1e-9), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_table_set_measured(&tab, 0, 3, 1e-6, 1e-9), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_table_set_measured(&tab, 0, 1, NAN, 1e-9), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_table_set_measured(&tab, 0, 1, 1e-6, -1), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_table_set_measured(&tab, 0, 1, INFINITY, 0), WEFT_ERR_INVALID_ARG);
    cr_assert(close_to(get(&tab, 0, 1).alpha, 2e-6));
    /* The file beats calibration, key by key... */
    const char *f1 = "pair 0 1 alpha_us=9\n";
    cr_assert_eq(weft_topo_table_parse(&tab, f1, strlen(f1), "f1", err, sizeof(err)), WEFT_OK);
    l = get(&tab, 0, 1);
    cr_assert(close_to(l.alpha, 9e-6) && close_to(l.beta, 1e-10));
    cr_assert_eq(l.source, WEFT_LINK_FROM_FILE);
    cr_assert_eq(l.line, 1);
    /* ...and a measurement taken on shm means nothing once the file forces tcp. */
    const char *f2 = "pair 0 1 tcp\n";
    cr_assert_eq(weft_topo_table_parse(&tab, f2, strlen(f2), "f2", err, sizeof(err)), WEFT_OK);
    l = get(&tab, 0, 1);
    cr_assert_eq(l.transport, TCP);
    cr_assert(close_to(l.alpha, weft_transports[TCP]->alpha) && close_to(l.beta, weft_transports[TCP]->beta));
    cr_assert_eq(l.source, WEFT_LINK_FROM_DEFAULT);
    /* Defaults can be replaced (say from the NIC's speed). */
    cr_assert_eq(weft_topo_table_set_default(&tab, TCP, 5e-6, 1e-9), WEFT_OK);
    cr_assert(close_to(get(&tab, 0, 1).alpha, 5e-6));
    cr_assert_eq(weft_topo_table_set_default(&tab, 7, 5e-6, 1e-9), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_table_set_default(&tab, TCP, NAN, 1e-9), WEFT_ERR_INVALID_ARG);
    weft_topo_table_fini(&tab);
}

/* ---- the topology file ---------------------------------------------------------------- */

/* 6 ranks: 0-2 on host0, 3-5 on host1. */
static void six_ranks(struct weft_link_table *tab, unsigned allowed)
{
    static const char *ids[] = {"host0", "host0", "host0", "host1", "host1", "host1"};
    char err[256];
    cr_assert_eq(weft_topo_table_init(tab, 6, ids, allowed, err, sizeof(err)), WEFT_OK, "%s", err);
}

static const char good_file[] = "# test topology: alpha-beta costs (comments may say \xce\xb1)\n"
                                "default shm alpha_us=1.5 gbps=10   # trailing comment\n"
                                "default tcp\talpha_us=25 gbit=12\r\n"
                                "\t  \n"
                                "hosts host0 host1 alpha_us=40 gbit=10\n"
                                "pair 0 3 tcp alpha_us=200 gbps=0.125\n"
                                "pair 1 2 tcp\n"
                                "pair 4 5 gbps=0.5\n"
                                "hosts host1 host1 alpha_us=3";

Test(file, good_file_applies)
{
    struct weft_link_table tab;
    six_ranks(&tab, SHM_TCP);
    char err[256] = "";
    cr_assert_eq(
        weft_topo_table_parse(&tab, good_file, strlen(good_file), "good", err, sizeof(err)),
        WEFT_OK, "%s", err);
    struct weft_link l = get(&tab, 0, 1);
    cr_assert_eq(l.transport, SHM);
    cr_assert(close_to(l.alpha, 1.5e-6) && close_to(l.beta, 1e-10));
    cr_assert_eq(l.source, WEFT_LINK_FROM_DEFAULT);
    l = get(&tab, 1, 2); /* forced tcp on one host */
    cr_assert_eq(l.transport, TCP);
    cr_assert(close_to(l.alpha, 25e-6) && close_to(l.beta, 8 / 12e9));
    l = get(&tab, 0, 4);
    cr_assert_eq(l.transport, TCP);
    cr_assert(close_to(l.alpha, 40e-6) && close_to(l.beta, 8 / 10e9));
    cr_assert_eq(l.source, WEFT_LINK_FROM_FILE);
    cr_assert_eq(l.line, 5);
    l = get(&tab, 3, 0);
    cr_assert(close_to(l.alpha, 200e-6) && close_to(l.beta, 8e-9));
    cr_assert_eq(l.line, 6);
    l = get(&tab, 4, 5);
    cr_assert_eq(l.transport, SHM);
    cr_assert(close_to(l.alpha, 3e-6) && close_to(l.beta, 2e-9), "%g %g", l.alpha, l.beta);
    l = get(&tab, 3, 4);
    cr_assert(close_to(l.alpha, 3e-6) && close_to(l.beta, 1e-10));
    cr_assert_eq(l.line, 9);
    cr_assert_eq(get(&tab, 2, 2).transport, SELF);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    weft_topo_table_print(&tab, f);
    fclose(f);
    cr_assert(strstr(buf, "6 rank(s) on 2 host(s)") && strstr(buf, "file line 6") &&
                  strstr(buf, "TTT") && strstr(buf, "host1"),
              "%s", buf);
    free(buf);

    /* The same through a real file. */
    char path[] = "/tmp/weft-topo-file-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, good_file, strlen(good_file)), (ssize_t)strlen(good_file));
    close(fd);
    struct weft_link_table t2;
    six_ranks(&t2, SHM_TCP);
    cr_assert_eq(weft_topo_table_load(&t2, path, err, sizeof(err)), WEFT_OK, "%s", err);
    cr_assert(close_to(get(&t2, 0, 3).alpha, 200e-6));
    unlink(path);
    weft_topo_table_fini(&t2);
    weft_topo_table_fini(&tab);
}

Test(file, patterns)
{
    const char *ids[] = {"rackA-n1", "rackA-n2", "rackB-n1", "rackB-n22", "odd"};
    struct weft_link_table tab;
    char err[256];
    cr_assert_eq(weft_topo_table_init(&tab, 5, ids, SHM_TCP, err, sizeof(err)),
                 WEFT_OK);
    const char *f = "hosts rackA-* rackB-* alpha_us=40\n"
                    "hosts rackB-n? rackB-n?? alpha_us=7\n"
                    "hosts *a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b *** alpha_us=1\n"
                    "hosts odd nomatch shm\n"; /* matches no pair: shm is harmless */
    cr_assert_eq(weft_topo_table_parse(&tab, f, strlen(f), "p", err, sizeof(err)), WEFT_OK, "%s",
                 err);
    cr_assert(close_to(get(&tab, 0, 2).alpha, 40e-6));
    cr_assert(close_to(get(&tab, 3, 1).alpha, 40e-6));
    cr_assert(close_to(get(&tab, 2, 3).alpha, 7e-6));
    cr_assert(close_to(get(&tab, 0, 1).alpha, 40e-6) == false);
    cr_assert(close_to(get(&tab, 0, 4).alpha, weft_transports[TCP]->alpha));
    weft_topo_table_fini(&tab);

    /* A pathological pattern against long host ids answers at once. */
    static char longid[2][300];
    memset(longid[0], 'a', 299);
    memset(longid[1], 'a', 299);
    longid[1][0] = 'b';
    const char *l2[] = {longid[0], longid[1]};
    cr_assert_eq(weft_topo_table_init(&tab, 2, l2, SHM_TCP, err, sizeof(err)), WEFT_OK);
    const char *slow = "hosts *a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*c * "
                       "alpha_us=1\n";
    for (int k = 0; k < 100; k++)
        cr_assert_eq(weft_topo_table_parse(&tab, slow, strlen(slow), "s", err, sizeof(err)),
                     WEFT_OK);
    weft_topo_table_fini(&tab);
}

struct bad_case {
    const char *line; /* appended as line 3 */
    size_t len;       /* 0: strlen */
    const char *want; /* in the message, besides "name:3:" */
};

Test(file, each_bad_line_names_line_and_token)
{
    static char longline[2100];
    memset(longline, 'x', sizeof(longline) - 1);
    static const struct bad_case cases[] = {
        {"frob 1 2", 0, "'frob'"},
        {"default", 0, "default needs a transport"},
        {"default ib alpha_us=1", 0, "'ib'"},
        {"default tcp", 0, "'tcp'"},
        {"default tcp alpha_us=abc", 0, "'alpha_us=abc'"},
        {"default tcp alpha_us=-1", 0, "'alpha_us=-1'"},
        {"default tcp alpha_us=nan", 0, "'alpha_us=nan'"},
        {"default tcp alpha_us=inf", 0, "'alpha_us=inf'"},
        {"default tcp alpha_us=1e400", 0, "'alpha_us=1e400'"},
        {"default tcp alpha_us=1e-400", 0, "'alpha_us=1e-400'"},
        {"default tcp alpha_us=1.0000001e7", 0, "'alpha_us=1.0000001e7'"},
        {"default tcp gbps=0", 0, "'gbps=0'"},
        {"default tcp gbit=-8", 0, "'gbit=-8'"},
        {"default tcp gbps=1e999999999999", 0, "'gbps=1e999999999999'"},
        {"default tcp alpha_us=", 0, "'alpha_us='"},
        {"default tcp alpha_us= 3", 0, "'alpha_us='"},
        {"default tcp alpha_us=1 alpha_us=2", 0, "'alpha_us=2'"},
        {"default tcp gbps=1 gbit=8", 0, "'gbit=8'"},
        {"default tcp speed=3", 0, "'speed=3'"},
        {"default tcp =3", 0, "'=3'"},
        {"default tcp shm", 0, "'shm'"},
        {"pair 0", 0, "'0'"},
        {"pair 0 9 tcp", 0, "'9'"},
        {"pair 0 -1 tcp", 0, "'-1'"},
        {"pair 0 99999999999999999999 tcp", 0, "'99999999999999999999'"},
        {"pair 0 0x1 tcp", 0, "'0x1'"},
        {"pair 1 1 tcp", 0, "'1'"},
        {"pair 0 1", 0, "sets nothing"},
        {"pair 0 4 shm", 0, "'shm'"},
        {"pair 0 1 self", 0, "'self'"},
        {"pair 0 1 tcp shm", 0, "second transport 'shm'"},
        {"pair 0 1 udp", 0, "'udp'"},
        {"hosts host0", 0, "'host0'"},
        {"hosts host0 host1", 0, "sets nothing"},
        {"hosts * * shm", 0, "'shm'"},
        {"hosts host0 host? shm alpha_us=1", 0, "'shm'"},
        {"pair 0 1 tcp alpha_us=1 a b c d e f g h i j k l", 0,
         "more than 16 tokens on a line, at 'l'"},
        {longline, 0, "longer than 1024"},
        {"pair 0 1 t\x01"
         "cp",
         0, "control byte 0x01 at column 11 in 't\\x01cp'"},
        {"pair 0 1 tcp\0 alpha_us=1", 24, "control byte 0x00"},
        {"default tcp alpha_us=1 \xc3\xa9", 0, "non-ASCII byte 0xc3"},
        {"default tcp alpha_us=1 \x7f", 0, "control byte 0x7f"},
    };
    for (size_t k = 0; k < WEFT_ARRAY_SIZE(cases); k++) {
        struct weft_link_table tab;
        six_ranks(&tab, SHM_TCP);
        const char *head =
            "# two good lines first, so nothing may change\ndefault tcp alpha_us=1\n";
        size_t hl = strlen(head), ll = cases[k].len ? cases[k].len : strlen(cases[k].line);
        char *text = malloc(hl + ll + 32);
        memcpy(text, head, hl);
        memcpy(text + hl, cases[k].line, ll);
        memcpy(text + hl + ll, "\npair 0 1 tcp\n", 14);
        char err[256] = "";
        weft_status_t st =
            weft_topo_table_parse(&tab, text, hl + ll + 14, "bad.topo", err, sizeof(err));
        cr_assert_eq(st, WEFT_ERR_INVALID_ARG, "case %zu (%s) was accepted", k, cases[k].line);
        cr_assert(strncmp(err, "bad.topo:3: ", 12) == 0, "case %zu: %s", k, err);
        cr_assert(strstr(err, cases[k].want), "case %zu: wanted \"%s\" in: %s", k, cases[k].want,
                  err);
        /* Nothing applied: not line 2's default, not line 4's pair. */
        cr_assert(close_to(tab.alpha[TCP], weft_transports[TCP]->alpha), "case %zu", k);
        cr_assert_eq(get(&tab, 0, 1).transport, SHM);
        free(text);
        weft_topo_table_fini(&tab);
    }
}

Test(file, transport_excluded_and_limits)
{
    struct weft_link_table tab;
    char err[256];
    six_ranks(&tab, 1u << TCP);
    const char *shm = "pair 0 1 shm\n";
    cr_assert_eq(weft_topo_table_parse(&tab, shm, strlen(shm), "x", err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "x:1:") && strstr(err, "excluded") && strstr(err, "'shm'"), "%s", err);
    /* A default for an excluded transport is harmless. */
    const char *d = "default shm alpha_us=3\n";
    cr_assert_eq(weft_topo_table_parse(&tab, d, strlen(d), "x", err, sizeof(err)), WEFT_OK);
    weft_topo_table_fini(&tab);

    /* At most 256 hosts lines. */
    six_ranks(&tab, SHM_TCP);
    size_t cap = 300 * 40, len = 0;
    char *many = malloc(cap);
    for (int k = 0; k < 257; k++)
        len += (size_t)snprintf(many + len, cap - len, "hosts host%d * alpha_us=%d\n", k % 2, k);
    cr_assert_eq(weft_topo_table_parse(&tab, many, len, "m", err, sizeof(err)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "m:257:"), "%s", err);
    free(many);
    /* Tiny and absent error buffers. */
    char tiny[8];
    cr_assert_eq(weft_topo_table_parse(&tab, "x", 1, "m", tiny, sizeof(tiny)),
                 WEFT_ERR_INVALID_ARG);
    cr_assert_eq(strlen(tiny), 7);
    cr_assert_eq(weft_topo_table_parse(&tab, "x", 1, "m", NULL, 0), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_table_parse(&tab, "", 0, "m", NULL, 0), WEFT_OK);
    weft_topo_table_fini(&tab);
}

Test(file, load_errors)
{
    struct weft_link_table tab;
    char err[256];
    six_ranks(&tab, SHM_TCP);
    cr_assert_eq(weft_topo_table_load(&tab, "/nonexistent/weft.topo", err, sizeof(err)),
                 WEFT_ERR_SYSTEM);
    cr_assert(strstr(err, "/nonexistent/weft.topo") && strstr(err, "No such file"), "%s", err);
    cr_assert_eq(weft_topo_table_load(&tab, "/tmp", err, sizeof(err)), WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "not a regular file"), "%s", err);
    cr_assert_eq(weft_topo_table_load(&tab, "/dev/zero", err, sizeof(err)), WEFT_ERR_INVALID_ARG);
    char path[] = "/tmp/weft-topo-big-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (2 << 20)), 0);
    close(fd);
    cr_assert_eq(weft_topo_table_load(&tab, path, err, sizeof(err)), WEFT_ERR_INVALID_ARG);
    cr_assert(strstr(err, "larger than 1 MiB"), "%s", err);
    unlink(path);
    weft_topo_table_fini(&tab);
}

/* Every link is a valid transport with finite, non-negative costs. */
static void check_links(const struct weft_link_table *tab)
{
    for (int i = 0; i < tab->n; i++)
        for (int j = 0; j < tab->n; j++) {
            struct weft_link l;
            cr_assert_eq(weft_topo_table_get(tab, i, j, &l), WEFT_OK);
            cr_assert(l.transport >= 0 && l.transport < weft_transport_count());
            cr_assert((i == j) == (l.transport == SELF));
            cr_assert(tab->host[i] == tab->host[j] || l.transport == TCP);
            cr_assert(isfinite(l.alpha) && l.alpha >= 0 && isfinite(l.beta) && l.beta >= 0);
        }
}

Test(file, random_input_never_crashes, .timeout = 120)
{
    static const char *const words[] = {"default",
                                        "pair",
                                        "hosts",
                                        "shm",
                                        "tcp",
                                        "self",
                                        "0",
                                        "1",
                                        "3",
                                        "5",
                                        "-1",
                                        "*",
                                        "host?",
                                        "host1",
                                        "alpha_us=",
                                        "alpha_us=1",
                                        "alpha_us=1e7",
                                        "gbps=1e-7",
                                        "gbit=8",
                                        "gbps=nan",
                                        "#",
                                        "\t",
                                        "=",
                                        "x=y",
                                        "99999999999",
                                        "gbps=1e308",
                                        "\r",
                                        "\xff",
                                        "\x00",
                                        "pair 0 1 tcp",
                                        "default tcp alpha_us=3"};
    weft_test_rng_state = 0x7e57707011ull;
    char buf[4096], err[256];
    struct weft_link_table tab;
    six_ranks(&tab, SHM_TCP);
    int ok = 0;
    for (int it = 0; it < 30000; it++) {
        size_t len = 0;
        if (it % 2 == 0) { /* raw bytes */
            len = weft_test_rnd() % 400;
            for (size_t k = 0; k < len; k++)
                buf[k] = (char)weft_test_rnd();
        } else { /* token soup, closer to what the parser expects */
            int nw = (int)(weft_test_rnd() % 24);
            for (int w = 0; w < nw && len < sizeof(buf) - 64; w++) {
                const char *s = words[weft_test_rnd() % WEFT_ARRAY_SIZE(words)];
                size_t sl = *s ? strlen(s) : 1;
                memcpy(buf + len, s, sl);
                len += sl;
                buf[len++] = weft_test_rnd() % 5 == 0 ? '\n' : ' ';
            }
        }
        err[0] = '\0';
        weft_status_t st = weft_topo_table_parse(&tab, buf, len, "fuzz", err, sizeof(err));
        cr_assert(st == WEFT_OK || st == WEFT_ERR_INVALID_ARG, "status %d", st);
        if (st != WEFT_OK) {
            cr_assert(strncmp(err, "fuzz:", 5) == 0 && memchr(err, '\0', sizeof(err)), "%s", err);
            for (const char *s = err; *s; s++)
                cr_assert(*s >= 0x20 && *s < 0x7f, "raw byte in message: %s", err);
        } else {
            ok++;
        }
        if (it % 64 == 0) {
            check_links(&tab);
            weft_topo_table_fini(&tab);
            six_ranks(&tab, SHM_TCP);
        }
    }
    check_links(&tab);
    weft_topo_table_fini(&tab);
    cr_assert_gt(ok, 100, "the soup should sometimes parse (%d did)", ok);
}

/* ---- the alpha-beta fit ------------------------------------------------------------- */

static double noise(double rel)
{
    return 1.0 + rel * (2.0 * (double)(weft_test_rnd() % 1000001) / 1e6 - 1.0);
}

static void expect_fit(const double *x, const double *y, int n, double alpha, double beta,
                       double tol)
{
    double a, b;
    cr_assert_eq(weft_topo_fit(x, y, n, &a, &b), WEFT_OK);
    cr_assert(fabs(a - alpha) <= tol * alpha + 1e-12, "alpha %g, want %g", a, alpha);
    cr_assert(fabs(b - beta) <= tol * beta, "beta %g, want %g", b, beta);
}

Test(fit, exact_data)
{
    double x[13], y[13];
    for (int k = 0; k < 13; k++) {
        x[k] = 8.0 * pow(4, k); /* 8 B .. 128 MiB */
        y[k] = 10e-6 + x[k] / 2e9;
    }
    expect_fit(x, y, 13, 10e-6, 1 / 2e9, 1e-6);
    expect_fit(x, y, 2, 10e-6, 1 / 2e9, 1e-6); /* two sizes are enough */
    double x0[] = {0, 1 << 20};
    double y0[] = {5e-6, 5e-6 + (1 << 20) / 1e9};
    expect_fit(x0, y0, 2, 5e-6, 1e-9, 1e-6);
}

Test(fit, noise_and_one_outlier_among_repeats)
{
    weft_test_rng_state = 12345;
    enum { SIZES = 12, REPS = 5 };
    double x[SIZES * REPS], y[SIZES * REPS];
    for (int s = 0; s < SIZES; s++)
        for (int r = 0; r < REPS; r++) {
            int k = s * REPS + r;
            x[k] = 8.0 * pow(4, s);
            y[k] = (20e-6 + x[k] / 1.5e9) * noise(0.03);
        }
    y[7] *= 30; /* a descheduled sample at 32 B */
    y[53] /= 8; /* and an impossible one at 8 MiB */
    expect_fit(x, y, SIZES * REPS, 20e-6, 1 / 1.5e9, 0.05);
}

Test(fit, one_bad_size_is_dropped)
{
    weft_test_rng_state = 777;
    for (int bad = 0; bad < 12; bad++) {
        double x[12], y[12];
        for (int s = 0; s < 12; s++) {
            x[s] = 8.0 * pow(4, s);
            y[s] = (12e-6 + x[s] / 1.75e9) * noise(0.02);
        }
        y[bad] *= bad % 2 ? 10 : 0.1;
        expect_fit(x, y, 12, 12e-6, 1 / 1.75e9, 0.1);
    }
}

Test(fit, clamps_to_non_negative)
{
    /* Pure bandwidth with a little noise: alpha would come out negative. */
    double x[] = {1e3, 1e4, 1e5, 1e6, 1e7}, y[5];
    for (int k = 0; k < 5; k++)
        y[k] = x[k] / 1e9 * (k == 0 ? 0.97 : 1.0);
    double a, b;
    cr_assert_eq(weft_topo_fit(x, y, 5, &a, &b), WEFT_OK);
    cr_assert(a >= 0 && fabs(b - 1e-9) < 0.05e-9, "%g %g", a, b);
    /* Time falling with size: beta pinned to 0, alpha the (weighted) mean. */
    double x2[] = {8, 64, 512}, y2[] = {3e-6, 2.9e-6, 2.8e-6};
    cr_assert_eq(weft_topo_fit(x2, y2, 3, &a, &b), WEFT_OK);
    cr_assert(b == 0 && a > 2.8e-6 && a < 3e-6, "%g %g", a, b);
}

Test(fit, refuses_bad_input)
{
    double a = -1, b = -1;
    double x[] = {8, 8, 8}, y[] = {1e-6, 2e-6, 3e-6};
    cr_assert_eq(weft_topo_fit(x, y, 3, &a, &b), WEFT_ERR_INVALID_ARG, "one size only");
    double x2[] = {8, 64}, y2[] = {1e-6, NAN};
    cr_assert_eq(weft_topo_fit(x2, y2, 2, &a, &b), WEFT_ERR_INVALID_ARG);
    double y3[] = {1e-6, 0};
    cr_assert_eq(weft_topo_fit(x2, y3, 2, &a, &b), WEFT_ERR_INVALID_ARG);
    double y4[] = {1e-6, -1};
    cr_assert_eq(weft_topo_fit(x2, y4, 2, &a, &b), WEFT_ERR_INVALID_ARG);
    double x5[] = {-8, 64}, y5[] = {1e-6, 2e-6};
    cr_assert_eq(weft_topo_fit(x5, y5, 2, &a, &b), WEFT_ERR_INVALID_ARG);
    double x6[] = {INFINITY, 64};
    cr_assert_eq(weft_topo_fit(x6, y5, 2, &a, &b), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_fit(x2, y5, 1, &a, &b), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_fit(NULL, y5, 2, &a, &b), WEFT_ERR_INVALID_ARG);
    cr_assert_eq(weft_topo_fit(x2, y5, 2, NULL, &b), WEFT_ERR_INVALID_ARG);
    cr_assert(a == -1 && b == -1, "outputs untouched on error");
}
