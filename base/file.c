/*
 * file.c - reading a small text file whole (topology and tuning files):
 * bounded, NUL-terminated, with a message that names the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/internal.h"

void weft_errf(char *err, size_t len, const char *fmt, ...)
{
    if (err == NULL || len == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
}

weft_status_t weft_file_read(const char *path, size_t max, char **text, size_t *len, char *err,
                             size_t errlen)
{
    struct stat sb;
    *text = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &sb) != 0) {
        int e = errno;
        weft_errf(err, errlen, "%s: %s", path, strerror(e));
        if (fd >= 0)
            close(fd);
        errno = e;
        return WEFT_ERR_SYSTEM;
    }
    if (!S_ISREG(sb.st_mode) || (uint64_t)sb.st_size > max) {
        if (S_ISREG(sb.st_mode) && max % (1u << 20) == 0)
            weft_errf(err, errlen, "%s: larger than %zu MiB", path, max >> 20);
        else if (S_ISREG(sb.st_mode))
            weft_errf(err, errlen, "%s: larger than %zu bytes", path, max);
        else
            weft_errf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return WEFT_ERR_INVALID_ARG;
    }
    size_t cap = (size_t)sb.st_size + 1, got = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        weft_errf(err, errlen, "%s: out of memory", path);
        close(fd);
        return WEFT_ERR_NO_MEMORY;
    }
    while (got < cap) {
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            weft_errf(err, errlen, "%s: %s", path, strerror(e));
            free(buf);
            close(fd);
            errno = e;
            return WEFT_ERR_SYSTEM;
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    got = WEFT_MIN(got, cap - 1); /* what grew while we read is the next reader's */
    buf[got] = '\0';
    *text = buf;
    *len = got;
    return WEFT_OK;
}
