/*
 * launch.c - what the launcher tells a rank: weft_comm_init_env reads rank,
 * size and rendezvous from weftrun, torchrun-style WEFT_ROOT, Open MPI,
 * PMI or Slurm variables; and this host's identity.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bootstrap.h"
#include "comm_impl.h"

void weft_host_identity(char *out, size_t len, bool machine)
{
    /* Read at every init, not once per process: a process may make
     * communicators as different "hosts" (tests do). */
    const char *forced = machine ? NULL : getenv("WEFT_HOSTID");
    if (forced && *forced) {
        snprintf(out, len, "%s", forced);
        return;
    }
    char host[64] = "", boot[40] = "";
    gethostname(host, sizeof(host) - 1);
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (fgets(boot, sizeof(boot), f) == NULL)
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    snprintf(out, len, "%.26s/%.36s", host, boot);
}

/* First of the variables that is set; strict decimal. */
static weft_status_t env_int(const char *const *names, const char *what, int *out,
                             const char **used)
{
    for (; *names; names++) {
        const char *v = getenv(*names);
        if (v == NULL || *v == '\0')
            continue;
        char *end;
        errno = 0;
        long x = strtol(v, &end, 10);
        if (errno || *end != '\0' || x < 0 || x > INT_MAX)
            return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "%s=\"%s\" is not a valid %s",
                                    *names, v, what);
        *out = (int)x;
        *used = *names;
        return WEFT_OK;
    }
    return WEFT_INPROGRESS; /* none set */
}

weft_status_t weft_comm_init_env(weft_comm_t *out)
{
    static const char *const rank_vars[] = {"WEFT_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK",
                                            "PMI_RANK", "SLURM_PROCID", NULL};
    static const char *const size_vars[] = {"WEFT_NRANKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE",
                                            "SLURM_NTASKS", "SLURM_NPROCS", NULL};
    weft_log_init();
    if (out == NULL)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG, "weft_comm_init_env: comm is NULL");
    *out = NULL;
    int rank = -1, nranks = -1;
    const char *rvar = NULL, *svar = NULL;
    weft_status_t st = env_int(rank_vars, "rank", &rank, &rvar);
    if (st < 0)
        return st;
    if (st == WEFT_INPROGRESS)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: no rank in the environment (WEFT_RANK, "
                                "OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID)");
    st = env_int(size_vars, "rank count", &nranks, &svar);
    if (st < 0)
        return st;
    if (st == WEFT_INPROGRESS)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: no rank count in the environment (WEFT_NRANKS, "
                                "OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS)");
    if (nranks < 1 || rank >= nranks)
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: %s=%d is out of range for %s=%d", rvar, rank,
                                svar, nranks);
    /* A batch script has the job's SLURM_PROCID=0 and SLURM_NTASKS too:
     * taken at their word, one process waits out WEFT_TIMEOUT_MS for ranks
     * nobody started.  Only tasks that srun started are in a step. */
    const char *step = getenv("SLURM_STEP_ID");
    if ((strncmp(rvar, "SLURM_", 6) == 0 || strncmp(svar, "SLURM_", 6) == 0) &&
        (step == NULL || *step == '\0')) {
        const char *job = getenv("SLURM_JOB_ID");
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: %s=%d and %s=%d are Slurm job %s's, not a "
                                "step's (no SLURM_STEP_ID): this is its batch script; start one "
                                "process per rank with srun",
                                rvar, rank, svar, nranks, job && *job ? job : "?");
    }

    weft_log_set_rank(rank);
    weft_unique_id_t id;
    struct weft_uid uid;
    const char *hex = getenv("WEFT_UNIQUE_ID");
    const char *root = weft_param_str("WEFT_ROOT");
    if (hex && *hex) {
        WEFT_CHECK(weft_uid_from_hex(hex, &id));
        WEFT_CHECK(weft_uid_parse(&id, &uid));
    } else if (*root) {
        WEFT_CHECK(weft_uid_from_root(root, &uid));
    } else {
        return weft_error_quiet(NULL, WEFT_ERR_INVALID_ARG,
                                "weft_comm_init_env: no rendezvous in the environment: set "
                                "WEFT_UNIQUE_ID (weftrun does) or WEFT_ROOT=host:port");
    }
    return weft_comm_create(out, nranks, &uid, rank);
}
