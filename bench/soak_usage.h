/*
 * soak_usage.h - what weft-soak watches in its own process: open fds, RSS,
 * and weft's shared-memory files, its own told apart from other jobs'.
 * Read from /proc and the shm folder only; no weft call.
 */
#ifndef WEFT_SOAK_USAGE_H
#define WEFT_SOAK_USAGE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define SOAK_JOB_LEN 40 /* a "weft-<job>-" prefix of segment names, and its NUL */

/* The folder weft makes its segments in, and the "weft-<job>-" name
 * prefixes of every communicator this process has been part of (a job's
 * files are ours).  Owned by the caller; soak_shm_fini frees jobs. */
typedef struct {
    const char *dir;            /* WEFT_SHM_DIR, or /dev/shm */
    char (*jobs)[SOAK_JOB_LEN]; /* njobs prefixes, room for cap */
    size_t njobs, cap;
} soak_shm_t;

/* One reading; -1 where /proc or the folder could not be read. */
typedef struct {
    int64_t fds;
    int64_t rss_kib;
    int64_t rss_shmem_kib; /* of rss_kib: mapped shared memory (weft's rings) */
    int64_t shm_files;     /* weft* files in the folder, anyone's */
    int64_t shm_ours;      /* of those, the ones of our communicators */
} soak_usage_t;

void soak_shm_init(soak_shm_t *s);
void soak_shm_fini(soak_shm_t *s);
/* Notes the jobs of the segments mapped now: call it after each
 * communicator this process joins is made. */
void soak_shm_note_jobs(soak_shm_t *s);
/* weft* files in the folder; *ours of them are ours.  With list, also
 * writes their names there. */
int64_t soak_shm_count(const soak_shm_t *s, int64_t *ours, FILE *list);

void soak_usage_read(const soak_shm_t *s, soak_usage_t *u);
/* Writes " fd->target" for each open fd: what a leak is. */
void soak_list_fds(FILE *out);

#endif /* WEFT_SOAK_USAGE_H */
