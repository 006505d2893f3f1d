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

/* `width` decimal digits of v (v >= 0), zero-padded, at p. */
static void put_digits(char *p, long v, int width)
{
    for (int i = width - 1; i >= 0; i--, v /= 10)
        p[i] = (char)('0' + v % 10);
}

void log_begin(struct log_line *l, enum log_level level, const char *event)
{
    static const char *const names[] = {[LOG_LV_INFO] = "info", [LOG_LV_WARN] = "warn", [LOG_LV_ERROR] = "error"};
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    /* ts=YYYY-MM-DDTHH:MM:SS.mmmZ, without printf: one of these per request */
    char ts[] = "ts=0000-00-00T00:00:00.000Z level=";
    put_digits(ts + 3, tm.tm_year + 1900, 4);
    put_digits(ts + 8, tm.tm_mon + 1, 2);
    put_digits(ts + 11, tm.tm_mday, 2);
    put_digits(ts + 14, tm.tm_hour, 2);
    put_digits(ts + 17, tm.tm_min, 2);
    put_digits(ts + 20, tm.tm_sec, 2);
    put_digits(ts + 23, (long)(tv.tv_usec / 1000), 3);
    l->len = 0;
    append(l, ts, sizeof ts - 1);
    const char *name = (unsigned)level < sizeof names / sizeof names[0] ? names[level] : "error";
    append(l, name, strlen(name));
    append(l, " event=", 7);
    append(l, event, strlen(event));
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
    char tmp[24];
    size_t i = sizeof tmp;
    unsigned long long u = value < 0 ? 0 - (unsigned long long)value : (unsigned long long)value;
    do
        tmp[--i] = (char)('0' + u % 10);
    while ((u /= 10) > 0);
    if (value < 0)
        tmp[--i] = '-';
    append(l, " ", 1);
    append(l, key, strlen(key));
    append(l, "=", 1);
    append(l, tmp + i, sizeof tmp - i);
}

static void write_all(const char *p, size_t n)
{
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(STDERR_FILENO, p + off, n - off);
        if (w <= 0)
            break; /* nowhere to report a failing stderr */
        off += (size_t)w;
    }
}

void log_end(struct log_line *l)
{
    l->buf[l->len++] = '\n';
    l->buf[l->len] = '\0';
    write_all(l->buf, l->len);
}

void log_msg(enum log_level level, const char *event, const char *msg)
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
        log_begin(&l, LOG_LV_ERROR, "log");
        log_str(&l, "msg", "cannot reopen the log file; logging on in the old one");
        log_str(&l, "error", err);
        log_end(&l);
    }
}
