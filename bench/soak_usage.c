/*
 * soak_usage.c - weft-soak's view of its own process: open fds, RSS and
 * weft's files in the shared-memory folder, read from /proc and readdir.
 */
#include "soak_usage.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Entries of /proc/self/fd, less the one the listing itself holds. */
static int64_t count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    int64_t n = 0;
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n - 1;
}

void soak_list_fds(FILE *out)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        char path[300], target[256];
        if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d))
            continue;
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        fprintf(out, " %s->%s", e->d_name, target);
    }
    closedir(d);
}

/* VmRSS, and the part of it that is mapped shared memory, in KiB. */
static int64_t rss_kib(int64_t *shmem_kib)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long long kib = -1, sh = -1;
    if (f == NULL)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        sscanf(line, "VmRSS: %lld kB", &kib);
        sscanf(line, "RssShmem: %lld kB", &sh);
    }
    fclose(f);
    *shmem_kib = sh;
    return kib;
}

void soak_shm_init(soak_shm_t *s)
{
    const char *dir = getenv("WEFT_SHM_DIR");
    memset(s, 0, sizeof(*s));
    s->dir = dir && *dir ? dir : "/dev/shm";
}

void soak_shm_fini(soak_shm_t *s)
{
    free(s->jobs);
    s->jobs = NULL;
    s->njobs = s->cap = 0;
}

/*
 * weft names a segment "weft-<job>-<rank>" and removes the name once every
 * peer has mapped it, so a name that stays is a leak.  Other weft jobs on
 * the host make and remove such files too; to keep them out of the check,
 * the prefixes of the segments this process has mapped are noted (they show
 * in /proc/self/maps, "(deleted)" once the name is gone) and only files
 * with one of them count as ours.
 */
void soak_shm_note_jobs(soak_shm_t *s)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[4096];
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f)) {
        const char *base = strrchr(line, '/'), *dash = NULL;
        if (base && strncmp(base + 1, "weft-", 5) == 0)
            dash = strchr(base + 6, '-');
        size_t len = dash ? (size_t)(dash - base) : 0; /* of "weft-<job>-" */
        if (len == 0 || len >= SOAK_JOB_LEN)
            continue;
        size_t i = 0;
        while (i < s->njobs && strncmp(s->jobs[i], base + 1, len) != 0)
            i++;
        if (i < s->njobs)
            continue;
        if (s->njobs == s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 16;
            void *p = realloc(s->jobs, cap * sizeof(*s->jobs));
            if (p == NULL)
                break; /* ours then counts too few, never files of others */
            s->jobs = p;
            s->cap = cap;
        }
        memcpy(s->jobs[s->njobs], base + 1, len);
        s->jobs[s->njobs++][len] = '\0';
    }
    fclose(f);
}

static int is_ours(const soak_shm_t *s, const char *name)
{
    for (size_t i = 0; i < s->njobs; i++)
        if (strncmp(name, s->jobs[i], strlen(s->jobs[i])) == 0)
            return 1;
    return 0;
}

int64_t soak_shm_count(const soak_shm_t *s, int64_t *ours, FILE *list)
{
    DIR *d = opendir(s->dir);
    int64_t n = 0;
    *ours = 0;
    if (d == NULL)
        return -1;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (strncmp(e->d_name, "weft", 4) != 0)
            continue;
        int mine = is_ours(s, e->d_name);
        n++;
        *ours += mine;
        if (list)
            fprintf(list, " %s%s", e->d_name, mine ? " (ours)" : "");
    }
    closedir(d);
    return n;
}

void soak_usage_read(const soak_shm_t *s, soak_usage_t *u)
{
    u->fds = count_fds();
    u->rss_kib = rss_kib(&u->rss_shmem_kib);
    u->shm_files = soak_shm_count(s, &u->shm_ours, NULL);
}
