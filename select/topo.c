/*
 * topo.c - the host probe: CPUs, caches and NUMA nodes from hwloc when
 * weft has it (else /sys and /proc), NICs from /sys/class/net and GPUs from
 * PCI.  Reading never fails: a missing or odd file leaves a field unknown,
 * because containers and network namespaces hide different parts of /sys.
 */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef HAVE_HWLOC
#include <hwloc.h>
#endif

#include "select/topo.h"

/* Where the files are: "" for the real /sys and /proc. */
struct probe {
    char root[PATH_MAX / 2];
    bool real;
};

/* ---- small readers --------------------------------------------------------- */

static bool path_of(const struct probe *p, char *out, size_t len, const char *fmt, va_list ap)
{
    size_t r = strlen(p->root);
    if (r >= len)
        return false;
    memcpy(out, p->root, r);
    int k = vsnprintf(out + r, len - r, fmt, ap);
    return k >= 0 && (size_t)k < len - r;
}

static bool make_path(const struct probe *p, char *out, size_t len, const char *fmt, ...)
    WEFT_PRINTF(4, 5);
static bool make_path(const struct probe *p, char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    bool ok = path_of(p, out, len, fmt, ap);
    va_end(ap);
    return ok;
}

/* The folder rel under the probe's root, or NULL when it cannot be read. */
static DIR *open_dir(const struct probe *p, const char *rel)
{
    char path[PATH_MAX];
    return make_path(p, path, sizeof(path), "%s", rel) ? opendir(path) : NULL;
}

/* The file's first len-1 bytes, trailing white space cut; false when it
 * cannot be read or is empty. */
static bool read_path(const char *path, char *buf, size_t len)
{
    if (len == 0)
        return false;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return false;
    size_t got = 0;
    while (got < len - 1) {
        ssize_t k = read(fd, buf + got, len - 1 - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    buf[got] = '\0';
    got = strlen(buf); /* a NUL inside ends it */
    while (got > 0 && isspace((unsigned char)buf[got - 1]))
        buf[--got] = '\0';
    return got > 0;
}

static bool read_file(const struct probe *p, char *buf, size_t len, const char *fmt, ...)
    WEFT_PRINTF(4, 5);
static bool read_file(const struct probe *p, char *buf, size_t len, const char *fmt, ...)
{
    char path[PATH_MAX];
    va_list ap;
    va_start(ap, fmt);
    bool ok = path_of(p, path, sizeof(path), fmt, ap);
    va_end(ap);
    return ok && read_path(path, buf, len);
}

/* fopen(path, "r") that cannot hang on a FIFO planted in a fixture. */
static FILE *open_stream(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return NULL;
    FILE *f = fdopen(fd, "r");
    if (f == NULL)
        close(fd);
    return f;
}

/* A decimal (or 0x hex) integer that is the whole string, in [lo, hi]. */
static bool parse_long(const char *s, long lo, long hi, long *out)
{
    while (isspace((unsigned char)*s))
        s++;
    if (*s == '\0')
        return false;
    errno = 0;
    char *end;
    long v = strtol(s, &end, 0);
    if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi)
        return false;
    *out = v;
    return true;
}

static bool read_long(const struct probe *p, long lo, long hi, long *out, const char *fmt, ...)
    WEFT_PRINTF(5, 6);
static bool read_long(const struct probe *p, long lo, long hi, long *out, const char *fmt, ...)
{
    char path[PATH_MAX], buf[64];
    va_list ap;
    va_start(ap, fmt);
    bool ok = path_of(p, path, sizeof(path), fmt, ap);
    va_end(ap);
    return ok && read_path(path, buf, sizeof(buf)) && parse_long(buf, lo, hi, out);
}

/* "0-3,8,10-11" -> set; the number of CPUs, or -1 on anything else (CPUs
 * past CPU_SETSIZE are junk too: we could not represent them). */
static int parse_cpulist(const char *s, cpu_set_t *set)
{
    CPU_ZERO(set);
    while (isspace((unsigned char)*s))
        s++;
    while (*s) {
        if (!isdigit((unsigned char)*s))
            return -1;
        char *end;
        errno = 0;
        unsigned long a = strtoul(s, &end, 10), b = a;
        if (errno || a >= CPU_SETSIZE)
            return -1;
        s = end;
        if (*s == '-') {
            s++;
            if (!isdigit((unsigned char)*s))
                return -1;
            b = strtoul(s, &end, 10);
            if (errno || b >= CPU_SETSIZE || b < a)
                return -1;
            s = end;
        }
        for (unsigned long c = a; c <= b; c++)
            CPU_SET(c, set);
        if (*s == ',')
            s++;
        else if (*s != '\0' && !isspace((unsigned char)*s))
            return -1;
        while (isspace((unsigned char)*s))
            s++;
    }
    return CPU_COUNT(set);
}

/* "32768K", "1M", "512" -> bytes; -1 on junk. */
static int64_t parse_cache_size(const char *s)
{
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0 || v > (1ll << 40))
        return -1;
    int shift = *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
    if (shift)
        end++;
    return *end == '\0' ? (int64_t)v << shift : -1;
}

/* Copies s into out, printable ASCII only (hostile or odd files). */
static void copy_clean(char *out, size_t len, const char *s)
{
    size_t i = 0;
    for (; s[i] && i + 1 < len; i++)
        out[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
    out[i] = '\0';
}

/* "dddd:bb:dd.f" (domain 4-8 hex digits), lower or upper case. */
static bool is_pci_id(const char *s, size_t n)
{
    size_t d = 0;
    while (d < n && isxdigit((unsigned char)s[d]))
        d++;
    if (d < 4 || d > 8 || n != d + 8)
        return false;
    s += d;
    return s[0] == ':' && isxdigit((unsigned char)s[1]) && isxdigit((unsigned char)s[2]) &&
           s[3] == ':' && isxdigit((unsigned char)s[4]) && isxdigit((unsigned char)s[5]) &&
           s[6] == '.' && s[7] >= '0' && s[7] <= '7';
}

/* The last path component of link that is a PCI address, into out. */
static bool last_pci_component(const char *link, char *out, size_t len)
{
    bool found = false;
    for (const char *c = link; *c;) {
        size_t n = strcspn(c, "/");
        if (is_pci_id(c, n) && n < len) {
            memcpy(out, c, n);
            out[n] = '\0';
            found = true;
        }
        c += n;
        c += *c == '/';
    }
    return found;
}

/* ---- CPUs, caches, NUMA from sysfs ------------------------------------------ */

static void sysfs_cpus(const struct probe *p, struct weft_topo *t)
{
    char buf[16384];
    cpu_set_t online;
    if (!read_file(p, buf, sizeof(buf), "/sys/devices/system/cpu/online") ||
        parse_cpulist(buf, &online) <= 0) {
        long n = p->real ? sysconf(_SC_NPROCESSORS_ONLN) : -1;
        t->threads = n > 0 && n < INT_MAX ? (int)n : -1;
        return;
    }
    t->threads = CPU_COUNT(&online);
    /* Distinct packages and (package, core) pairs; any unreadable CPU
     * leaves both unknown rather than undercounted. */
    long pkg[CPU_SETSIZE], core[CPU_SETSIZE];
    int n = 0, npkg = 0, ncore = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &online))
            continue;
        if (!read_long(p, -1, INT_MAX, &pkg[n],
                       "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c) ||
            !read_long(p, -1, INT_MAX, &core[n], "/sys/devices/system/cpu/cpu%d/topology/core_id",
                       c))
            return;
        bool new_pkg = true, new_core = true;
        for (int k = 0; k < n; k++) {
            new_pkg &= pkg[k] != pkg[n];
            new_core &= pkg[k] != pkg[n] || core[k] != core[n];
        }
        npkg += new_pkg;
        ncore += new_core;
        n++;
    }
    t->sockets = npkg;
    t->cores = ncore;
}

static void sysfs_caches(const struct probe *p, struct weft_topo *t)
{
    int cpu = 0; /* cpu0, or the first online one when cpu0 has no cache dir */
    char buf[16384];
    cpu_set_t set;
    if (read_file(p, buf, sizeof(buf), "/sys/devices/system/cpu/online") &&
        parse_cpulist(buf, &set) > 0 && !CPU_ISSET(0, &set))
        while (cpu < CPU_SETSIZE - 1 && !CPU_ISSET(cpu, &set))
            cpu++;
    for (int i = 0; i < 16; i++) {
        long level;
        char type[32], size[32];
        if (!read_long(p, 0, 9, &level, "/sys/devices/system/cpu/cpu%d/cache/index%d/level", cpu,
                       i))
            continue;
        if (!read_file(p, type, sizeof(type), "/sys/devices/system/cpu/cpu%d/cache/index%d/type",
                       cpu, i) ||
            strcmp(type, "Instruction") == 0 ||
            !read_file(p, size, sizeof(size), "/sys/devices/system/cpu/cpu%d/cache/index%d/size",
                       cpu, i))
            continue;
        int64_t bytes = parse_cache_size(size);
        if (bytes <= 0)
            continue;
        if (level == 2) {
            t->l2_bytes = bytes;
        } else if (level == 3) {
            t->l3_bytes = bytes;
            if (read_file(p, buf, sizeof(buf),
                          "/sys/devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", cpu, i)) {
                int k = parse_cpulist(buf, &set);
                t->l3_cpus = k > 0 ? k : -1;
            }
        }
    }
}

static int cmp_numa(const void *a, const void *b)
{
    const struct weft_topo_numa *x = a, *y = b;
    return (x->id > y->id) - (x->id < y->id);
}

static void sysfs_numa(const struct probe *p, struct weft_topo *t)
{
    DIR *d = open_dir(p, "/sys/devices/system/node");
    if (d == NULL)
        return;
    struct dirent *e;
    char buf[16384];
    while ((e = readdir(d)) != NULL && t->nnuma < WEFT_TOPO_MAX_NUMA) {
        long id;
        if (strncmp(e->d_name, "node", 4) != 0 || !isdigit((unsigned char)e->d_name[4]) ||
            !parse_long(e->d_name + 4, 0, INT_MAX, &id))
            continue;
        struct weft_topo_numa *nd = &t->numa[t->nnuma];
        nd->id = (int)id;
        nd->mem_bytes = -1;
        nd->ncpus = 0;
        CPU_ZERO(&nd->cpus);
        if (read_file(p, buf, sizeof(buf), "/sys/devices/system/node/node%ld/cpulist", id)) {
            int k = parse_cpulist(buf, &nd->cpus);
            nd->ncpus = k < 0 ? 0 : k;
        }
        /* "Node 0 MemTotal:       8029892 kB" */
        if (read_file(p, buf, 512, "/sys/devices/system/node/node%ld/meminfo", id)) {
            const char *m = strstr(buf, "MemTotal:");
            long long kb;
            if (m && sscanf(m + 9, "%lld", &kb) == 1 && kb >= 0 && kb < (1ll << 52))
                nd->mem_bytes = (int64_t)kb * 1024;
        }
        t->nnuma++;
    }
    closedir(d);
    qsort(t->numa, (size_t)t->nnuma, sizeof(t->numa[0]), cmp_numa);
}

static void sysfs_model(const struct probe *p, struct weft_topo *t)
{
    char path[PATH_MAX];
    if (!make_path(p, path, sizeof(path), "/proc/cpuinfo"))
        return;
    FILE *f = open_stream(path);
    if (f == NULL)
        return;
    /* x86 "model name", MIPS "cpu model", POWER "cpu", old ARM "Processor". */
    static const char *const keys[] = {"model name", "cpu model", "Processor", "cpu"};
    char line[512];
    int best = (int)WEFT_ARRAY_SIZE(keys);
    for (int lines = 0; lines < 4096 && fgets(line, sizeof(line), f); lines++) {
        char *colon = strchr(line, ':');
        if (colon == NULL)
            continue;
        char *k = line, *ke = colon;
        while (ke > k && isspace((unsigned char)ke[-1]))
            ke--;
        for (int i = 0; i < best; i++) {
            if ((size_t)(ke - k) == strlen(keys[i]) && strncmp(k, keys[i], (size_t)(ke - k)) == 0) {
                char *v = colon + 1;
                while (isspace((unsigned char)*v))
                    v++;
                v[strcspn(v, "\n")] = '\0';
                if (*v) {
                    copy_clean(t->cpu_model, sizeof(t->cpu_model), v);
                    best = i;
                }
                break;
            }
        }
        if (best == 0)
            break;
    }
    fclose(f);
}

/* ---- PCI locality, NICs, GPUs ----------------------------------------------- */

/* The NUMA node of a PCI device: its numa_node file, else the node that
 * holds its local CPUs, else the only node there is. */
static int pci_numa(const struct probe *p, const struct weft_topo *t, const char *bus)
{
    long v;
    if (read_long(p, -1, INT_MAX, &v, "/sys/bus/pci/devices/%s/numa_node", bus) && v >= 0)
        return (int)v;
    char buf[16384];
    cpu_set_t local, both;
    if (read_file(p, buf, sizeof(buf), "/sys/bus/pci/devices/%s/local_cpulist", bus) &&
        parse_cpulist(buf, &local) > 0) {
        int found = -1, hits = 0;
        for (int i = 0; i < t->nnuma; i++) {
            CPU_AND(&both, &local, &t->numa[i].cpus);
            if (CPU_COUNT(&both) > 0) {
                found = t->numa[i].id;
                hits++;
            }
        }
        if (hits == 1)
            return found;
    }
    return t->nnuma == 1 ? t->numa[0].id : -1;
}

static int cmp_nic(const void *a, const void *b)
{
    return strcmp(((const struct weft_topo_nic *)a)->name, ((const struct weft_topo_nic *)b)->name);
}

static void sysfs_nics(const struct probe *p, struct weft_topo *t)
{
    char path[PATH_MAX], link[PATH_MAX], real[PATH_MAX];
    if (!make_path(p, path, sizeof(path), "/sys/class/net"))
        return;
    DIR *d = opendir(path);
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= sizeof(t->nics[0].name))
            continue;
        /* Skip plain files such as bonding_masters. */
        struct stat st;
        if (!make_path(p, path, sizeof(path), "/sys/class/net/%s", e->d_name) ||
            lstat(path, &st) != 0 || S_ISREG(st.st_mode))
            continue;
        if (t->nics_found++ >= WEFT_TOPO_MAX_NICS)
            continue;
        struct weft_topo_nic *nic = &t->nics[t->nnics++];
        memset(nic, 0, sizeof(*nic));
        copy_clean(nic->name, sizeof(nic->name), e->d_name);
        nic->numa = -1;
        nic->speed_mbps = -1;
        /* /sys/class/net/X links to .../devices/pci0000:00/0000:00:03.0/virtio2/net/X
         * or to .../devices/virtual/net/X; older kernels have a directory
         * with a device link instead. */
        ssize_t k = S_ISLNK(st.st_mode) ? readlink(path, link, sizeof(link) - 1) : -1;
        link[k > 0 ? k : 0] = '\0';
        char dev[PATH_MAX];
        if (strstr(link, "/virtual/") != NULL) {
            snprintf(nic->bus_id, sizeof(nic->bus_id), "virtual");
        } else if (!last_pci_component(link, nic->bus_id, sizeof(nic->bus_id)) &&
                   make_path(p, dev, sizeof(dev), "/sys/class/net/%s/device", e->d_name)) {
            if (realpath(dev, real) != NULL)
                last_pci_component(real, nic->bus_id, sizeof(nic->bus_id));
            else if (errno == ENOENT && k <= 0)
                snprintf(nic->bus_id, sizeof(nic->bus_id), "virtual");
        }
        if (strcmp(nic->bus_id, "virtual") != 0 && nic->bus_id[0])
            nic->numa = pci_numa(p, t, nic->bus_id);
        long v;
        if (read_long(p, -1, INT_MAX, &v, "/sys/class/net/%s/speed", e->d_name) && v > 0)
            nic->speed_mbps = (int)v;
        char state[32];
        if (read_file(p, state, sizeof(state), "/sys/class/net/%s/operstate", e->d_name))
            copy_clean(nic->state, sizeof(nic->state), state);
    }
    closedir(d);
    qsort(t->nics, (size_t)t->nnics, sizeof(t->nics[0]), cmp_nic);
}

static int cmp_gpu(const void *a, const void *b)
{
    return strcmp(((const struct weft_topo_gpu *)a)->bus_id,
                  ((const struct weft_topo_gpu *)b)->bus_id);
}

static void sysfs_gpus(const struct probe *p, struct weft_topo *t)
{
    DIR *d = open_dir(p, "/sys/bus/pci/devices");
    if (d == NULL)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long cls, vendor, device;
        if (!is_pci_id(e->d_name, strlen(e->d_name)) ||
            !read_long(p, 0, 0xffffff, &cls, "/sys/bus/pci/devices/%s/class", e->d_name) ||
            !read_long(p, 0, 0xffff, &vendor, "/sys/bus/pci/devices/%s/vendor", e->d_name) ||
            (cls >> 16) != 0x03 || vendor != 0x10de)
            continue;
        if (t->gpus_found++ >= WEFT_TOPO_MAX_GPUS)
            continue;
        struct weft_topo_gpu *g = &t->gpus[t->ngpus++];
        copy_clean(g->bus_id, sizeof(g->bus_id), e->d_name); /* a PCI id: fits */
        g->device_id = read_long(p, 0, 0xffff, &device, "/sys/bus/pci/devices/%s/device", e->d_name)
                           ? (unsigned)device
                           : 0;
        g->numa = pci_numa(p, t, g->bus_id);
    }
    closedir(d);
    qsort(t->gpus, (size_t)t->ngpus, sizeof(t->gpus[0]), cmp_gpu);
}

static void allowed_cpus(const struct probe *p, struct weft_topo *t)
{
    CPU_ZERO(&t->allowed);
    t->nallowed = -1;
    if (p->real) {
        if (sched_getaffinity(0, sizeof(t->allowed), &t->allowed) == 0)
            t->nallowed = CPU_COUNT(&t->allowed);
        return;
    }
    char path[PATH_MAX], line[8192];
    if (!make_path(p, path, sizeof(path), "/proc/self/status"))
        return;
    FILE *f = open_stream(path);
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "Cpus_allowed_list:", 18) == 0) {
            int k = parse_cpulist(line + 18, &t->allowed);
            t->nallowed = k > 0 ? k : -1;
            break;
        }
    }
    fclose(f);
}

/* ---- hwloc ----------------------------------------------------------------- */

#ifdef HAVE_HWLOC
static int hwloc_count(hwloc_topology_t topo, hwloc_obj_type_t type)
{
    int n = hwloc_get_nbobjs_by_type(topo, type);
    return n > 0 ? n : -1;
}

static int hwloc_numa_of(hwloc_topology_t topo, hwloc_obj_t obj)
{
    hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(topo, obj);
    if (a && a->nodeset && hwloc_bitmap_weight(a->nodeset) == 1)
        return hwloc_bitmap_first(a->nodeset);
    return -1;
}

/* CPUs, caches, NUMA nodes and GPUs; false when hwloc will not load. */
static bool hwloc_fill(struct weft_topo *t)
{
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0)
        return false;
    hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
    if (hwloc_topology_load(topo) != 0) {
        hwloc_topology_destroy(topo);
        return false;
    }
    t->sockets = hwloc_count(topo, HWLOC_OBJ_PACKAGE);
    t->cores = hwloc_count(topo, HWLOC_OBJ_CORE);
    t->threads = hwloc_count(topo, HWLOC_OBJ_PU);
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_PACKAGE, 0);
    const char *model = o ? hwloc_obj_get_info_by_name(o, "CPUModel") : NULL;
    if (model == NULL)
        model = hwloc_obj_get_info_by_name(hwloc_get_root_obj(topo), "CPUModel");
    if (model)
        copy_clean(t->cpu_model, sizeof(t->cpu_model), model);
    if ((o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L2CACHE, 0)) != NULL)
        t->l2_bytes = (int64_t)o->attr->cache.size;
    if ((o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_L3CACHE, 0)) != NULL) {
        t->l3_bytes = (int64_t)o->attr->cache.size;
        t->l3_cpus = o->cpuset ? hwloc_bitmap_weight(o->cpuset) : -1;
    }
    int nn = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
    for (int i = 0; i < nn && t->nnuma < WEFT_TOPO_MAX_NUMA; i++) {
        o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, (unsigned)i);
        struct weft_topo_numa *nd = &t->numa[t->nnuma++];
        nd->id = (int)o->os_index;
        /* 0 when hwloc could not read it (no /sys): unknown, not empty. */
        nd->mem_bytes = o->attr && o->attr->numanode.local_memory
                            ? (int64_t)o->attr->numanode.local_memory
                            : -1;
        CPU_ZERO(&nd->cpus);
        unsigned c;
        hwloc_bitmap_foreach_begin(c, o->cpuset)
        {
            if (c < CPU_SETSIZE)
                CPU_SET(c, &nd->cpus);
        }
        hwloc_bitmap_foreach_end();
        nd->ncpus = CPU_COUNT(&nd->cpus);
    }
    int npci = 0;
    for (o = hwloc_get_next_pcidev(topo, NULL); o; o = hwloc_get_next_pcidev(topo, o)) {
        struct hwloc_pcidev_attr_s *pa = &o->attr->pcidev;
        npci++;
        if ((pa->class_id >> 8) != 0x03 || pa->vendor_id != 0x10de)
            continue;
        if (t->gpus_found++ >= WEFT_TOPO_MAX_GPUS)
            continue;
        struct weft_topo_gpu *g = &t->gpus[t->ngpus++];
        snprintf(g->bus_id, sizeof(g->bus_id), "%04x:%02x:%02x.%x", (unsigned)pa->domain,
                 (unsigned)pa->bus, (unsigned)pa->dev, (unsigned)pa->func);
        g->device_id = pa->device_id;
        g->numa = hwloc_numa_of(topo, o);
        if (g->numa < 0 && t->nnuma == 1)
            g->numa = t->numa[0].id;
    }
    hwloc_topology_destroy(topo);
    if (npci == 0) {
        /* hwloc without its PCI plugin sees no device at all: ask sysfs. */
        struct probe p = {.real = true};
        sysfs_gpus(&p, t);
    }
#ifdef HWLOC_VERSION
    snprintf(t->source, sizeof(t->source), "hwloc %s", HWLOC_VERSION);
#else
    snprintf(t->source, sizeof(t->source), "hwloc");
#endif
    return true;
}
#endif

/* ---- entry points ----------------------------------------------------------- */

static void clear(struct weft_topo *t)
{
    memset(t, 0, sizeof(*t));
    t->sockets = t->cores = t->threads = -1;
    t->l2_bytes = t->l3_bytes = -1;
    t->l3_cpus = -1;
    t->nallowed = -1;
}

static void probe_sysfs(const struct probe *p, struct weft_topo *t)
{
    snprintf(t->source, sizeof(t->source), "sysfs");
    sysfs_model(p, t);
    sysfs_cpus(p, t);
    sysfs_caches(p, t);
    sysfs_numa(p, t);
    sysfs_gpus(p, t);
}

void weft_topo_probe_root(struct weft_topo *t, const char *root)
{
    clear(t);
    struct probe p = {.real = root == NULL || *root == '\0' || strcmp(root, "/") == 0};
    if (!p.real && strlen(root) < sizeof(p.root))
        snprintf(p.root, sizeof(p.root), "%s", root);
    else if (!p.real)
        snprintf(p.root, sizeof(p.root), "/nonexistent"); /* too long: nothing readable */
    probe_sysfs(&p, t);
    sysfs_nics(&p, t);
    allowed_cpus(&p, t);
}

#ifdef HAVE_HWLOC
/* hwloc's view is taken once per process: a load costs ~50 ms and its PCI
 * plugin leaks ~1 KiB each time, and sockets, caches and NUMA nodes do not
 * change under a running job.  NICs and the allowed CPUs are read per call. */
static pthread_once_t hwloc_once = PTHREAD_ONCE_INIT;
static struct weft_topo hwloc_view;
static bool hwloc_ok;

static void hwloc_load_once(void)
{
    clear(&hwloc_view);
    hwloc_ok = hwloc_fill(&hwloc_view);
}
#endif

void weft_topo_probe(struct weft_topo *t)
{
    clear(t);
    struct probe p = {.real = true};
#ifdef HAVE_HWLOC
    pthread_once(&hwloc_once, hwloc_load_once);
    if (hwloc_ok)
        *t = hwloc_view;
    else
        probe_sysfs(&p, t);
#else
    probe_sysfs(&p, t);
#endif
    if (t->cpu_model[0] == '\0')
        sysfs_model(&p, t);
    sysfs_nics(&p, t);
    allowed_cpus(&p, t);
}

/* ---- printing ---------------------------------------------------------------- */

void weft_topo_cpulist(const cpu_set_t *s, char *buf, size_t len)
{
    size_t at = 0;
    if (len == 0)
        return;
    buf[0] = '\0';
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, s))
            continue;
        int e = c;
        while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, s))
            e++;
        int k = e == c ? snprintf(buf + at, len - at, "%s%d", at ? "," : "", c)
                       : snprintf(buf + at, len - at, "%s%d-%d", at ? "," : "", c, e);
        if (k < 0 || (size_t)k >= len - at) {
            /* Out of room: end with "..." where it fits. */
            if (len >= 4)
                memcpy(buf + len - 4, "...", 4);
            return;
        }
        at += (size_t)k;
        c = e;
    }
}

static const char *bytes_str(int64_t b, char *buf, size_t len)
{
    if (b < 0)
        snprintf(buf, len, "unknown");
    else if (b >= (1ll << 30) && b % (1ll << 30) == 0)
        snprintf(buf, len, "%lld GiB", (long long)(b >> 30));
    else if (b >= (1ll << 30))
        snprintf(buf, len, "%.1f GiB", (double)b / (1ll << 30));
    else if (b >= (1ll << 20) && b % (1ll << 20) == 0)
        snprintf(buf, len, "%lld MiB", (long long)(b >> 20));
    else if (b >= (1ll << 20))
        snprintf(buf, len, "%.1f MiB", (double)b / (1ll << 20));
    else if (b >= 1024)
        snprintf(buf, len, "%lld KiB", (long long)(b >> 10));
    else
        snprintf(buf, len, "%lld B", (long long)b);
    return buf;
}

static const char *count_str(int v, char *buf, size_t len)
{
    if (v < 0)
        snprintf(buf, len, "?");
    else
        snprintf(buf, len, "%d", v);
    return buf;
}

void weft_topo_print(const struct weft_topo *t, FILE *f)
{
    char a[32], b[32], c[32], list[512];
    fprintf(f, "host topology (from %s)\n", t->source[0] ? t->source : "nothing");
    fprintf(f, "  cpu      %s\n", t->cpu_model[0] ? t->cpu_model : "unknown model");
    fprintf(f, "  layout   %s socket(s), %s core(s), %s hardware thread(s)\n",
            count_str(t->sockets, a, sizeof(a)), count_str(t->cores, b, sizeof(b)),
            count_str(t->threads, c, sizeof(c)));
    if (t->nallowed > 0) {
        weft_topo_cpulist(&t->allowed, list, sizeof(list));
        fprintf(f, "  allowed  %d CPU(s): %s\n", t->nallowed, list);
    } else {
        fprintf(f, "  allowed  unknown\n");
    }
    fprintf(f, "  caches   L2 %s, L3 %s", bytes_str(t->l2_bytes, a, sizeof(a)),
            bytes_str(t->l3_bytes, b, sizeof(b)));
    if (t->l3_bytes > 0 && t->l3_cpus > 0)
        fprintf(f, " shared by %d CPU(s)", t->l3_cpus);
    fprintf(f, "\n");
    if (t->nnuma == 0)
        fprintf(f, "  numa     unknown\n");
    for (int i = 0; i < t->nnuma; i++) {
        weft_topo_cpulist(&t->numa[i].cpus, list, sizeof(list));
        fprintf(f, "  %-8s node %d: %d CPU(s) %s%s, memory %s\n", i == 0 ? "numa" : "",
                t->numa[i].id, t->numa[i].ncpus, list, t->numa[i].ncpus ? "" : "(none)",
                bytes_str(t->numa[i].mem_bytes, a, sizeof(a)));
    }
    if (t->nnics == 0)
        fprintf(f, "  nics     none found\n");
    for (int i = 0; i < t->nnics; i++) {
        const struct weft_topo_nic *n = &t->nics[i];
        char speed[32] = "speed unknown", numa[48] = "";
        if (n->speed_mbps > 0 && n->speed_mbps % 1000 == 0)
            snprintf(speed, sizeof(speed), "%d Gbit/s", n->speed_mbps / 1000);
        else if (n->speed_mbps > 0)
            snprintf(speed, sizeof(speed), "%d Mbit/s", n->speed_mbps);
        bool virt = strcmp(n->bus_id, "virtual") == 0;
        if (!virt)
            snprintf(numa, sizeof(numa), "numa %s", count_str(n->numa, a, sizeof(a)));
        fprintf(f, "  %-8s %-12s %-14s %-8s %-8s %s\n", i == 0 ? "nics" : "", n->name,
                n->bus_id[0] ? n->bus_id : "bus unknown", numa, n->state[0] ? n->state : "?",
                virt && n->speed_mbps < 0 ? "" : speed);
    }
    if (t->nics_found > t->nnics)
        fprintf(f, "           ... and %d more\n", t->nics_found - t->nnics);
    if (t->ngpus == 0)
        fprintf(f, "  gpus     none found\n");
    for (int i = 0; i < t->ngpus; i++)
        fprintf(f, "  %-8s %s device 0x%04x numa %s\n", i == 0 ? "gpus" : "", t->gpus[i].bus_id,
                t->gpus[i].device_id, count_str(t->gpus[i].numa, a, sizeof(a)));
    if (t->gpus_found > t->ngpus)
        fprintf(f, "           ... and %d more\n", t->gpus_found - t->ngpus);
}
