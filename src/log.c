/* log.c - see log.h. */
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static void append(struct log_line *l, const char *s, size_t n)
{
    size_t room = sizeof l->buf - 2 - l->len; /* keep space for "\n\0" */
    if (n > room)
        n = room;
    memcpy(l->buf + l->len, s, n);
    l->len += n;
}

static bool needs_quotes(const char *v)
{
    if (*v == '\0')
        return true;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p <= ' ' || *p == '"' || *p == '=' || *p == '\\' || *p >= 0x7f)
            return true;
    return false;
}

size_t log_format_value(char *out, size_t cap, const char *v)
{
    size_t n = 0;
    if (cap == 0)
        return 0;
    if (!needs_quotes(v)) {
        for (; *v && n + 1 < cap; v++)
            out[n++] = *v;
        out[n] = '\0';
        return n;
    }
    if (cap < 3) { /* no room for "" */
        out[0] = '\0';
        return 0;
    }
    /* Room is kept for the closing quote, and an escape is written only
     * whole, so a truncated value is still one well-formed quoted value. */
    size_t limit = cap - 2; /* last index usable before '"' and NUL */
    out[n++] = '"';
    for (const unsigned char *p = (const unsigned char *)v; *p; p++) {
        char esc[4];
        size_t k = 0;
        if (*p == '"' || *p == '\\') {
            esc[k++] = '\\';
            esc[k++] = (char)*p;
        } else if (*p < ' ' || *p == 0x7f) {
            static const char hex[] = "0123456789abcdef";
            esc[k++] = '\\';
            esc[k++] = 'x';
            esc[k++] = hex[*p >> 4];
            esc[k++] = hex[*p & 15];
        } else {
            esc[k++] = (char)*p; /* UTF-8 passes through unchanged */
        }
        if (n + k > limit)
            break;
        memcpy(out + n, esc, k);
        n += k;
    }
    out[n++] = '"';
    out[n] = '\0';
    return n;
}

void log_begin(struct log_line *l, const char *level, const char *event)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    int n = snprintf(l->buf, sizeof l->buf, "ts=%04d-%02d-%02dT%02d:%02d:%02d.%03dZ level=%s event=%s",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, (int)(tv.tv_usec / 1000), level, event);
    l->len = n < 0 ? 0 : (size_t)n < sizeof l->buf - 2 ? (size_t)n : sizeof l->buf - 2;
}

void log_str(struct log_line *l, const char *key, const char *value)
{
    char tmp[512];
    if (value == NULL)
        return;
    append(l, " ", 1);
    append(l, key, strlen(key));
    append(l, "=", 1);
    append(l, tmp, log_format_value(tmp, sizeof tmp, value));
}

void log_int(struct log_line *l, const char *key, long long value)
{
    char tmp[32];
    snprintf(tmp, sizeof tmp, "%lld", value);
    log_str(l, key, tmp);
}

void log_end(struct log_line *l)
{
    l->buf[l->len++] = '\n';
    l->buf[l->len] = '\0';
    size_t off = 0;
    while (off < l->len) {
        ssize_t w = write(STDERR_FILENO, l->buf + off, l->len - off);
        if (w <= 0)
            break; /* nowhere to report a failing stderr */
        off += (size_t)w;
    }
}

void log_msg(const char *level, const char *event, const char *msg)
{
    struct log_line l;
    log_begin(&l, level, event);
    log_str(&l, "msg", msg);
    log_end(&l);
}

int log_open(const char *path, char *err, size_t errlen)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC | O_NOCTTY, 0640);
    if (fd < 0) {
        snprintf(err, errlen, "--log %s: %s", path, strerror(errno));
        return -1;
    }
    if (fd != STDERR_FILENO) {
        /* flags 0: descriptor 2 stays open across exec, as standard error does */
        if (dup3(fd, STDERR_FILENO, 0) < 0) {
            snprintf(err, errlen, "--log %s: %s", path, strerror(errno));
            close(fd);
            return -1;
        }
        close(fd);
    }
    return 0;
}

void log_reopen(const char *path)
{
    char err[512];
    if (path == NULL)
        return;
    if (log_open(path, err, sizeof err) != 0) {
        struct log_line l;
        log_begin(&l, "error", "log");
        log_str(&l, "msg", "cannot reopen the log file; logging on in the old one");
        log_str(&l, "error", err);
        log_end(&l);
    }
}
