/*
 * shm_desc.c - the shm transport as the registry sees it: ranks of one
 * host, its default cost and its settings.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "transports/shm/shm.h"

static const struct weft_param_desc shm_params[] = {
    {"WEFT_SHM_SLOTS", "int", "8", "slots per shared-memory ring (one ring per peer), 1..1024", NULL},
    {"WEFT_SHM_SLOT_BYTES", "int", "262144", "bytes per shared-memory slot, rounded up to a page; messages move in slot-sized chunks", NULL},
    {"WEFT_SHM_MAX_BYTES", "int", "33554432", "most bytes of a rank's shared-memory segment (its rings from the other ranks of the host, allocated and touched at init): with many ranks on a host the slots shrink to 16 KiB, then fewer of them, down to 2; 0: no bound", NULL},
    {"WEFT_SHM_CMA_MIN", "int", "0", "messages at least this long are pulled with process_vm_readv instead of the ring (0: never; the ring measured faster here)", NULL},
    {"WEFT_SHM_LL_BYTES", "int", "16384", "largest message of the one-exchange path for small collectives among ranks all on shared memory (data and flag in one cache line up to 48 bytes; 0: off), 0..1048576", NULL},
    {"WEFT_SHM_DIR", "str", "/dev/shm", "folder for shared-memory segments (shm_open in /dev/shm, open() elsewhere)", NULL},
};

static bool shm_can_reach(const struct weft_transport_pair *pair)
{
    return !pair->self && pair->same_host;
}

/* shm: a writable folder with room for one ring. */
static void shm_status(FILE *out)
{
    const char *dir = getenv("WEFT_SHM_DIR");
    if (dir == NULL || *dir == '\0')
        dir = "/dev/shm";
    int64_t need = weft_param_int("WEFT_SHM_SLOTS") * weft_param_int("WEFT_SHM_SLOT_BYTES");
    struct statvfs v;
    if (statvfs(dir, &v) != 0) {
        fprintf(out, "  shm   no: %s: %s (WEFT_SHM_DIR); ranks on one host use tcp\n", dir,
                strerror(errno));
        return;
    }
    if (access(dir, W_OK) != 0) {
        fprintf(out, "  shm   no: %s is not writable here; ranks on one host use tcp\n", dir);
        return;
    }
    double free_mib = (double)v.f_bavail * (double)v.f_frsize / (1 << 20);
    fprintf(out, "  shm   yes: %s, %.0f MiB free (a ring to one peer takes %.1f MiB)", dir,
            free_mib, (double)need / (1 << 20));
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
    int scope = -1;
    if (f) {
        if (fscanf(f, "%d", &scope) != 1)
            scope = -1;
        fclose(f);
    }
    fprintf(out, "; process_vm_readv %s\n",
            scope >= 2 ? "refused by ptrace_scope >= 2 (the ring carries everything)"
                       : "allowed (used from WEFT_SHM_CMA_MIN; off by default)");
}

/* Flag ping-pong 0.27 us one way, Open MPI's 8 B shm allreduce 0.55 us;
 * the ring and process_vm_readv move 11-19 GB/s at chunk sizes, 6.5-17
 * for 64 MiB (docs/MEASURED, the development machine). */
const struct weft_transport_desc weft_shm_desc = {
    .name = "shm", .priority = 10,
    .can_reach = shm_can_reach,
    .alpha = 0.5e-6, .beta = 1.0 / 12e9,
    WEFT_TRANSPORT_PARAMS(shm_params),
    .status = shm_status,
    .ops = &weft_shm_ops,
};
