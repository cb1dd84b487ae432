/*
 * internal.h - what every part of the library shares: status checks,
 * logging, parameters, clocks and the error record of a communicator.
 * Nothing here is installed or exported.
 */
#ifndef WEFT_INTERNAL_H
#define WEFT_INTERNAL_H

#include <stdarg.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "weft.h"

#define WEFT_HIDDEN __attribute__((visibility("hidden")))
#define WEFT_EXPORT __attribute__((visibility("default")))
#define WEFT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define WEFT_LIKELY(x) __builtin_expect(!!(x), 1)
#define WEFT_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define WEFT_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define WEFT_MIN(a, b) ((a) < (b) ? (a) : (b))
#define WEFT_MAX(a, b) ((a) > (b) ? (a) : (b))

/* ---- logging (base/log.c) -------------------------------------------- */
enum weft_log_level { WEFT_LOG_NONE = 0, WEFT_LOG_WARN, WEFT_LOG_INFO, WEFT_LOG_TRACE };
enum weft_subsys {
    WEFT_SUB_INIT = 1u << 0,
    WEFT_SUB_NET = 1u << 1,
    WEFT_SUB_COLL = 1u << 2,
    WEFT_SUB_BOOT = 1u << 3,
    WEFT_SUB_ENV = 1u << 4,
    WEFT_SUB_ALL = ~0u
};
extern int weft_log_level_ WEFT_HIDDEN;          /* set once by weft_log_init */
extern unsigned weft_log_subsys_ WEFT_HIDDEN;
void weft_log_init(void) WEFT_HIDDEN;            /* idempotent, thread-safe */
void weft_log_set_rank(int rank) WEFT_HIDDEN;    /* per thread: the "host:pid:rank" prefix */
void weft_log(int level, unsigned subsys, const char *file, int line, const char *fmt, ...)
    WEFT_HIDDEN WEFT_PRINTF(5, 6);
#define WEFT_LOG_(lvl, sub, ...)                                                       \
    do {                                                                               \
        if (WEFT_UNLIKELY(weft_log_level_ >= (lvl)) && (weft_log_subsys_ & (sub)))     \
            weft_log((lvl), (sub), __FILE__, __LINE__, __VA_ARGS__);                   \
    } while (0)
#define WEFT_WARN(sub, ...) WEFT_LOG_(WEFT_LOG_WARN, sub, __VA_ARGS__)
#define WEFT_INFO(sub, ...) WEFT_LOG_(WEFT_LOG_INFO, sub, __VA_ARGS__)
#define WEFT_TRACE(sub, ...) WEFT_LOG_(WEFT_LOG_TRACE, sub, __VA_ARGS__)

/* Breadcrumbs on the way up: at TRACE each failed check logs file:line. */
#define WEFT_CHECK(call)                                                               \
    do {                                                                               \
        weft_status_t s_ = (call);                                                     \
        if (WEFT_UNLIKELY(s_ < 0)) {                                                   \
            WEFT_TRACE(WEFT_SUB_ALL, "%s -> %s", #call, weft_status_string(s_));       \
            return s_;                                                                 \
        }                                                                              \
    } while (0)
#define WEFT_CHECK_GOTO(call, st, label)                                               \
    do {                                                                               \
        (st) = (call);                                                                 \
        if (WEFT_UNLIKELY((st) < 0)) {                                                 \
            WEFT_TRACE(WEFT_SUB_ALL, "%s -> %s", #call, weft_status_string(st));       \
            goto label;                                                                \
        }                                                                              \
    } while (0)

/* ---- error record (base/log.c) ---------------------------------------- */
#define WEFT_ERRMSG_LEN 512
/* Where error messages are kept: each communicator embeds one and reads it
 * for weft_comm_last_error; transports are handed their communicator's.
 * Owner: whoever embeds it (weft_errsink_init/_destroy). */
struct weft_errsink {
    pthread_mutex_t mu;
    char msg[WEFT_ERRMSG_LEN]; /* under mu */
};
void weft_errsink_init(struct weft_errsink *sink) WEFT_HIDDEN;
void weft_errsink_destroy(struct weft_errsink *sink) WEFT_HIDDEN;
/* Copies the last message into buf (thread-safe); returns buf. */
const char *weft_errsink_read(struct weft_errsink *sink, char *buf, size_t len) WEFT_HIDDEN;
/* Records msg in sink (or the calling thread's record, sink == NULL), logs
 * it at WARN when status is an error, and returns status so callers can
 * write `return weft_error(sink, WEFT_ERR_..., "...")`. */
weft_status_t weft_error(struct weft_errsink *sink, weft_status_t status, const char *fmt, ...)
    WEFT_HIDDEN WEFT_PRINTF(3, 4);
/* Same, without logging: for argument errors the caller sees directly. */
weft_status_t weft_error_quiet(struct weft_errsink *sink, weft_status_t status,
                               const char *fmt, ...) WEFT_HIDDEN WEFT_PRINTF(3, 4);
/* The calling thread's last message (errors raised with no sink). */
const char *weft_thread_last_error(void) WEFT_HIDDEN;
/* errno -> status: ENOMEM -> NO_MEMORY, ETIMEDOUT -> TIMEOUT,
 * ECONNRESET/EPIPE/ECONNREFUSED -> REMOTE, else SYSTEM. */
weft_status_t weft_errno_status(int err) WEFT_HIDDEN;

/* ---- parameters (base/param.c) ------------------------------------------ */
/* A set of live handles.  Owner: a file-scope static of the module whose
 * handles it tracks; entries are borrowed pointers. */
struct weft_registry {
    pthread_mutex_t mu;
    const void **v;
    size_t n, cap;
};
#define WEFT_REGISTRY_INIT {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0}
bool weft_registry_add(struct weft_registry *r, const void *p) WEFT_HIDDEN; /* false: no memory */
bool weft_registry_remove(struct weft_registry *r, const void *p) WEFT_HIDDEN; /* false: absent */
/* True when p is in r; found(p) (may be NULL) then runs before the lock is
 * released, so p cannot be removed meanwhile. */
bool weft_registry_find(struct weft_registry *r, const void *p, void (*found)(const void *p))
    WEFT_HIDDEN;

/* Tables of environment parameters, read once: the core one, and each
 * transport's once it is registered.  The getters take the full name
 * ("WEFT_SOCKET_NSTREAMS"); asking for a name missing from every table is
 * a programming error caught by the tests. */
int64_t weft_param_int(const char *name) WEFT_HIDDEN;
/* Reads the environment again: for a forked child (tests) that sets its own
 * values before any other thread runs.  Not thread-safe. */
void weft_param_reload(void) WEFT_HIDDEN;
const char *weft_param_str(const char *name) WEFT_HIDDEN; /* never NULL */

/* Formats into a caller's message buffer (err may be NULL or len 0: nothing). */
void weft_errf(char *err, size_t len, const char *fmt, ...) WEFT_HIDDEN WEFT_PRINTF(3, 4);
/* Reads path whole (a regular file of at most max bytes) into *text,
 * malloc'd and NUL-terminated, its length in *len.  Errors name the file
 * in err: WEFT_ERR_SYSTEM (open or read; errno says which, e.g. ENOENT),
 * WEFT_ERR_INVALID_ARG (not a regular file, or larger), or
 * WEFT_ERR_NO_MEMORY; *text is NULL then (base/file.c). */
weft_status_t weft_file_read(const char *path, size_t max, char **text, size_t *len, char *err,
                             size_t errlen) WEFT_HIDDEN;
struct weft_param_desc {
    const char *name;
    const char *type; /* "int" or "str" */
    const char *dflt;
    const char *doc;
    const char *alias; /* NCCL's name for it, read when ours is unset, or NULL */
};
/* The environment variable that gave name its value (name itself or its
 * NCCL alias), or NULL when it has the default. */
const char *weft_param_source(const char *name) WEFT_HIDDEN;
/* Adds a table of a layer above (a transport's): its values are read now,
 * and the getters know its names from then on.  The table is borrowed for
 * the life of the process; registering it again does nothing.  Any thread. */
void weft_param_register(const struct weft_param_desc *desc, size_t n) WEFT_HIDDEN;
/* Table k (0: the core one, then the registered ones in the order they
 * came), for weft-info --params and the README; NULL past the last. */
const struct weft_param_desc *weft_param_table(size_t k, size_t *n) WEFT_HIDDEN;
/* A list in NCCL's syntax, "a,b" or "^a,b" (exclude), matched without case
 * against names[i] for bit i.  *mask gets what it selects (everything for
 * an empty spec).  An unknown name returns false and is copied into bad. */
bool weft_parse_mask(const char *spec, const char *const *names, size_t n, unsigned *mask,
                     char *bad, size_t badlen) WEFT_HIDDEN;
/* Parses "123", "4K", "2M", "1G" (binary units); false on junk/overflow. */
bool weft_parse_size(const char *s, int64_t *out) WEFT_HIDDEN;

/* ---- time ---------------------------------------------------------------- */
static inline uint64_t weft_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
/* Milliseconds left until deadline (ns), clamped at 0; -1 if none. */
static inline int weft_ms_left(uint64_t deadline_ns)
{
    if (deadline_ns == 0)
        return -1;
    uint64_t now = weft_now_ns();
    if (now >= deadline_ns)
        return 0;
    uint64_t ms = (deadline_ns - now + 999999) / 1000000;
    return ms > 0x7fffffff ? 0x7fffffff : (int)ms;
}

/* ---- memory -------------------------------------------------------------- */
/* Page-aligned, touched once, huge pages asked for when large.  Freed with
 * weft_buf_free(p, bytes). */
void *weft_buf_alloc(size_t bytes) WEFT_HIDDEN;
/* The same mapping, not touched: for memory whose used part is decided
 * (and touched) later.  Freed with weft_buf_free. */
void *weft_buf_reserve(size_t bytes) WEFT_HIDDEN;
void weft_buf_free(void *p, size_t bytes) WEFT_HIDDEN;

#endif /* WEFT_INTERNAL_H */
