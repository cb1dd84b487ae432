/*
 * log.c - logging (WEFT_DEBUG, WEFT_DEBUG_SUBSYS, WEFT_DEBUG_FILE), status
 * strings and the last-error records of communicators and threads.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "base/internal.h"

int weft_log_level_ = WEFT_LOG_WARN;
unsigned weft_log_subsys_ = WEFT_SUB_ALL;

static FILE *log_file;
static char log_host[64];
static pthread_once_t log_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static __thread int log_rank = -1;
static __thread char thread_error[WEFT_ERRMSG_LEN];

/* Bit i of the mask is names[i]; the last one, ALL, stands for every bit. */
static unsigned parse_subsys(const char *spec)
{
    static const char *const names[] = {"INIT", "NET", "COLL", "BOOT", "ENV", "ALL"};
    unsigned mask;
    char bad[64];
    if (!weft_parse_mask(spec, names, WEFT_ARRAY_SIZE(names), &mask, bad, sizeof(bad))) {
        fprintf(stderr, "weft: WEFT_DEBUG_SUBSYS: unknown subsystem '%s'; logging all\n", bad);
        return WEFT_SUB_ALL;
    }
    bool exclude = spec[0] == '^';
    unsigned all_bit = 1u << (WEFT_ARRAY_SIZE(names) - 1);
    if (exclude)
        return (mask & all_bit) ? mask & ~all_bit : 0;
    return (mask & all_bit) ? WEFT_SUB_ALL : mask;
}

static void log_init_once(void)
{
    const char *lvl = weft_param_str("WEFT_DEBUG");
    if (strcasecmp(lvl, "NONE") == 0 || strcasecmp(lvl, "OFF") == 0)
        weft_log_level_ = WEFT_LOG_NONE;
    else if (strcasecmp(lvl, "INFO") == 0)
        weft_log_level_ = WEFT_LOG_INFO;
    else if (strcasecmp(lvl, "TRACE") == 0)
        weft_log_level_ = WEFT_LOG_TRACE;
    else
        weft_log_level_ = WEFT_LOG_WARN;
    weft_log_subsys_ = parse_subsys(weft_param_str("WEFT_DEBUG_SUBSYS"));
    gethostname(log_host, sizeof(log_host) - 1);
    char *dot = strchr(log_host, '.');
    if (dot)
        *dot = '\0';
    const char *path = weft_param_str("WEFT_DEBUG_FILE");
    if (*path) {
        /* %h host, %p pid, as NCCL_DEBUG_FILE does. */
        char name[512];
        size_t o = 0;
        for (const char *c = path; *c && o + 32 < sizeof(name); c++) {
            if (c[0] == '%' && c[1] == 'h') {
                o += (size_t)snprintf(name + o, sizeof(name) - o, "%s", log_host);
                c++;
            } else if (c[0] == '%' && c[1] == 'p') {
                o += (size_t)snprintf(name + o, sizeof(name) - o, "%d", (int)getpid());
                c++;
            } else {
                name[o++] = *c;
            }
        }
        name[o] = '\0';
        log_file = fopen(name, "a");
        if (log_file == NULL)
            fprintf(stderr, "weft: cannot open WEFT_DEBUG_FILE %s: %s; logging to stderr\n", name,
                    strerror(errno));
    }
}

void weft_log_init(void)
{
    pthread_once(&log_once, log_init_once);
}

void weft_log_set_rank(int rank)
{
    log_rank = rank;
}

void weft_log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
{
    static const char *const names[] = {"", "WARN", "INFO", "TRACE"};
    weft_log_init();
    if (level > weft_log_level_ || !(weft_log_subsys_ & subsys))
        return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    const char *base = strrchr(file, '/');
    FILE *out = log_file ? log_file : stderr;
    pthread_mutex_lock(&log_mu);
    if (level == WEFT_LOG_TRACE)
        fprintf(out, "%s:%d:%d weft %s %s:%d %s\n", log_host, (int)getpid(), log_rank,
                names[level], base ? base + 1 : file, line, msg);
    else
        fprintf(out, "%s:%d:%d weft %s %s\n", log_host, (int)getpid(), log_rank, names[level], msg);
    fflush(out);
    pthread_mutex_unlock(&log_mu);
}

const char *weft_status_string(weft_status_t status)
{
    switch (status) {
    case WEFT_OK: return "success";
    case WEFT_INPROGRESS: return "in progress";
    case WEFT_ERR_INVALID_ARG: return "invalid argument";
    case WEFT_ERR_NO_MEMORY: return "out of memory";
    case WEFT_ERR_SYSTEM: return "system error";
    case WEFT_ERR_REMOTE: return "remote peer failed";
    case WEFT_ERR_TIMEOUT: return "timed out";
    case WEFT_ERR_ABORTED: return "aborted";
    case WEFT_ERR_UNSUPPORTED: return "unsupported";
    case WEFT_ERR_INTERNAL: return "internal error";
    case WEFT_ERR_MISMATCH: return "collective mismatch between ranks";
    }
    return "unknown status";
}

void weft_errsink_init(struct weft_errsink *sink)
{
    pthread_mutex_init(&sink->mu, NULL);
    sink->msg[0] = '\0';
}

void weft_errsink_destroy(struct weft_errsink *sink)
{
    pthread_mutex_destroy(&sink->mu);
}

const char *weft_errsink_read(struct weft_errsink *sink, char *buf, size_t len)
{
    pthread_mutex_lock(&sink->mu);
    snprintf(buf, len, "%s", sink->msg);
    pthread_mutex_unlock(&sink->mu);
    return buf;
}

static weft_status_t record(struct weft_errsink *sink, bool log, weft_status_t status,
                            const char *fmt, va_list ap)
{
    char msg[WEFT_ERRMSG_LEN];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    if (sink != NULL) {
        pthread_mutex_lock(&sink->mu);
        memcpy(sink->msg, msg, sizeof(msg));
        pthread_mutex_unlock(&sink->mu);
    } else {
        memcpy(thread_error, msg, sizeof(msg));
    }
    if (log && status < 0)
        WEFT_WARN(WEFT_SUB_ALL, "%s: %s", weft_status_string(status), msg);
    return status;
}

weft_status_t weft_error(struct weft_errsink *sink, weft_status_t status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(sink, true, status, fmt, ap);
    va_end(ap);
    return status;
}

weft_status_t weft_error_quiet(struct weft_errsink *sink, weft_status_t status,
                               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    record(sink, false, status, fmt, ap);
    va_end(ap);
    return status;
}

const char *weft_thread_last_error(void)
{
    return thread_error;
}

weft_status_t weft_errno_status(int err)
{
    switch (err) {
    case ENOMEM: return WEFT_ERR_NO_MEMORY;
    case ETIMEDOUT: return WEFT_ERR_TIMEOUT;
    case ECONNRESET:
    case EPIPE:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EHOSTUNREACH:
    case ENETUNREACH: return WEFT_ERR_REMOTE;
    default: return WEFT_ERR_SYSTEM;
    }
}
