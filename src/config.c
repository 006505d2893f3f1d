/* config.c - see config.h. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ids.h"
#include "stream.h"
#include "util.h"

#ifndef KEMBALI_TEMPLATES_DIR
#define KEMBALI_TEMPLATES_DIR "/usr/local/share/kembali/templates"
#endif
#ifndef KEMBALI_STATE_DIR
#define KEMBALI_STATE_DIR "/var/lib/kembali"
#endif

#define SECRET_MAX 256
/* the longest first line read_first_line takes */
#define LINE_MAX_SECRET (SECRET_MAX > CONFIG_REDIS_PASSWORD_MAX ? SECRET_MAX : CONFIG_REDIS_PASSWORD_MAX)
#define SHOP_FILE_MAX (64 * 1024) /* bytes of one file in shops_dir */
#define SHOP_ERR_MAX 2048         /* bytes of the reasons kept for one skipped file */

/* Where errors go while loading: appended one per line. */
struct cerr {
    char *buf;
    size_t cap, len;
    int count;
    bool oom;                  /* an allocation failed: the load is refused whatever else */
};

static void cfail(struct cerr *e, const char *file, const char *key, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void cfail(struct cerr *e, const char *file, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    e->count++;
    if (e->len + 1 >= e->cap)
        return;
    int n = snprintf(e->buf + e->len, e->cap - e->len, "%s: %s%s%s\n", file, key ? key : "",
                     key ? ": " : "", msg);
    if (n > 0)
        e->len = e->len + (size_t)n < e->cap ? e->len + (size_t)n : e->cap - 1;
}

/* Record that an allocation failed (once per load). */
static void cfail_oom(struct cerr *e, const char *file)
{
    if (!e->oom)
        cfail(e, file, NULL, "out of memory");
    e->oom = true;
}

/* strdup, with a failure recorded in e (NULL is returned then). */
static char *cdup(struct cerr *e, const char *file, const char *s)
{
    char *d = strdup(s ? s : "");
    if (d == NULL)
        cfail_oom(e, file);
    return d;
}

/* Is `host` (no port, brackets kept for IPv6) a loopback name? */
static bool is_loopback(const char *host, size_t n)
{
    if (n == 9 && strncasecmp(host, "localhost", 9) == 0)
        return true;
    if (n == 5 && strncmp(host, "[::1]", 5) == 0)
        return true;
    if (n >= 4 && strncmp(host, "127.", 4) == 0) {
        for (size_t i = 4; i < n; i++)
            if (!isdigit((unsigned char)host[i]) && host[i] != '.')
                return false;
        return true;
    }
    return false;
}

/* api_base: https://host[:port][/path], or http:// on loopback only. */
static bool check_api_base(const char *v, char *why, size_t whylen)
{
    const char *rest;
    bool https = strncmp(v, "https://", 8) == 0;
    if (https)
        rest = v + 8;
    else if (strncmp(v, "http://", 7) == 0)
        rest = v + 7;
    else {
        snprintf(why, whylen, "must start with https:// (or http:// for a loopback test server)");
        return false;
    }
    size_t hostlen = strcspn(rest, "/?#");
    const char *hp = rest;
    size_t h = hostlen;
    if (*hp == '[') {
        const char *close = memchr(hp, ']', hostlen);
        h = close ? (size_t)(close - hp) + 1 : hostlen;
    } else {
        const char *colon = memchr(hp, ':', hostlen);
        if (colon)
            h = (size_t)(colon - hp);
    }
    if (h == 0 || strpbrk(v, "?# \t\r\n@") != NULL) {
        snprintf(why, whylen, "is not a plain base URL (scheme://host[:port][/path], no user, query or fragment)");
        return false;
    }
    if (!https && !is_loopback(hp, h)) {
        snprintf(why, whylen, "plain http:// is accepted only for loopback hosts (127.0.0.0/8, localhost, [::1])");
        return false;
    }
    return true;
}

/* A configured host, lowercased, trailing dots removed: a name or IPv4
 * address without port, or an IPv6 address in brackets. NULL if malformed,
 * or with *oom set when out of memory. */
static char *normalize_host(const char *hv, bool *oom)
{
    if (hv == NULL || *hv == '\0' || strlen(hv) > 253)
        return NULL;
    char *lc = strdup(hv);
    if (lc == NULL) {
        *oom = true;
        return NULL;
    }
    size_t n = strlen(lc);
    for (char *p = lc; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    while (n > 0 && lc[n - 1] == '.')
        lc[--n] = '\0';
    bool ok;
    if (lc[0] == '[') {
        struct in6_addr a;
        char inner[64];
        ok = n > 2 && lc[n - 1] == ']' && n - 2 < sizeof inner;
        if (ok) {
            memcpy(inner, lc + 1, n - 2);
            inner[n - 2] = '\0';
            ok = inet_pton(AF_INET6, inner, &a) == 1;
        }
    } else {
        ok = n > 0 && strpbrk(lc, ":/ \t[]@") == NULL;
    }
    if (!ok) {
        free(lc);
        return NULL;
    }
    return lc;
}

static bool check_url(const char *v)
{
    if (strncmp(v, "https://", 8) != 0 && strncmp(v, "http://", 7) != 0)
        return false;
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p <= ' ' || *p == 0x7f)
            return false;
    return true;
}

static bool check_secret(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > SECRET_MAX)
        return false;
    for (; *s; s++)
        if ((unsigned char)*s <= ' ' || (unsigned char)*s >= 0x7f)
            return false; /* it goes into an HTTP header */
    return true;
}

/* First line of a secret's file (a shop's key, the Redis password),
 * trimmed; NULL with a reason on failure (with *oom set when out of
 * memory). `what` names the secret in the reasons ("key", "password");
 * a first line longer than max + 63 bytes is refused rather than cut. With
 * keys_dir (resolved), the file must lie inside it after resolving symbolic
 * links, and is opened by its resolved name without following a link
 * swapped in since. The mode is checked on the opened descriptor (fstat, no
 * window between the check and the read): a regular file that others cannot
 * read and that group and others cannot write. The reasons never hold the
 * file's content. */
static char *read_first_line(const char *path, const char *keys_dir, size_t max, const char *what, bool *oom,
                             char *why, size_t whylen)
{
    char real[PATH_MAX];
    const char *open_path = path;
    int oflags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY; /* a FIFO must not block a reload */
    if (keys_dir != NULL) {
        if (realpath(path, real) == NULL) {
            snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
            return NULL;
        }
        if (!util_path_inside(real, keys_dir) || strcmp(real, keys_dir) == 0) {
            snprintf(why, whylen, "%.200s resolves to %.200s, outside keys_dir %.150s", path, real, keys_dir);
            return NULL;
        }
        open_path = real;
        oflags |= O_NOFOLLOW;
    }
    int fd = open(open_path, oflags);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "%s is not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_mode & (S_IROTH | S_IWOTH | S_IWGRP)) {
        snprintf(why, whylen, "%s has mode %04o: a %s file must not be readable by others nor writable by "
                 "group or others (chmod 0600, or 0640 with the group kembali runs as)",
                 path, (unsigned)(st.st_mode & 07777), what);
        close(fd);
        return NULL;
    }
    char line[LINE_MAX_SECRET + 64];
    size_t limit = max + 64 < sizeof line ? max + 64 : sizeof line;
    size_t n = 0;
    bool eof = false, bad = false;
    int read_errno = 0;
    while (n + 1 < limit && memchr(line, '\n', n) == NULL) {
        ssize_t r = read(fd, line + n, limit - 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            bad = true;
            read_errno = errno;
            break;
        }
        if (r == 0) {
            eof = true;
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    line[n] = '\0';
    char *nl = memchr(line, '\n', n);
    if (bad) {
        explicit_bzero(line, sizeof line);
        snprintf(why, whylen, "cannot read %s: %s", path, strerror(read_errno));
        return NULL;
    }
    if (n == 0) {
        snprintf(why, whylen, "%s is empty", path);
        return NULL;
    }
    if (nl == NULL && !eof) { /* never use a cut-off key */
        explicit_bzero(line, sizeof line);
        snprintf(why, whylen, "the first line of %s is longer than a %s can be", path, what);
        return NULL;
    }
    if (nl != NULL)
        *nl = '\0';
    if (strlen(line) != (size_t)((nl ? nl : line + n) - line)) {
        explicit_bzero(line, sizeof line);
        snprintf(why, whylen, "the first line of %s contains a NUL byte", path);
        return NULL;
    }
    size_t m = strcspn(line, "\r");
    line[m] = '\0';
    char *s = line;
    while (*s == ' ' || *s == '\t')
        s++;
    m = strlen(s);
    while (m > 0 && (s[m - 1] == ' ' || s[m - 1] == '\t'))
        s[--m] = '\0';
    char *out = strdup(s);
    explicit_bzero(line, sizeof line);
    if (out == NULL) { /* no key material in why */
        *oom = true;
        snprintf(why, whylen, "out of memory");
    }
    return out;
}

/* The Redis password: 1..CONFIG_REDIS_PASSWORD_MAX bytes, no control
 * characters (it goes into an AUTH command, never into a header). */
static bool check_password(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > CONFIG_REDIS_PASSWORD_MAX)
        return false;
    for (; *s; s++)
        if ((unsigned char)*s < ' ' || (unsigned char)*s == 0x7f)
            return false;
    return true;
}

/* A database number: 1 to 9 decimal digits and nothing else. */
static bool parse_db(const char *v, int *db)
{
    size_t n = strlen(v);
    if (n == 0 || n > 9 || strspn(v, "0123456789") != n)
        return false;
    *db = atoi(v);
    return true;
}

/* HOST:PORT at p (HOST a name, an IPv4 address or an IPv6 address in
 * brackets), ending at one of "/?#,:" or the end: into host (without
 * brackets; capacity 256) and port, *rest after the port. `form` is the
 * whole form for messages ("redis://HOST:PORT[/DB]"). False with the
 * reason in why. */
static bool parse_host_port(const char *p, const char *form, char *host_out, int *port_out, const char **rest_out,
                            char *why, size_t whylen)
{
    const char *host = p, *end;
    size_t hlen;
    if (*p == '[') {
        const char *close = strchr(p, ']');
        char inner[64];
        struct in6_addr a;
        hlen = close ? (size_t)(close - p - 1) : 0;
        if (close == NULL || hlen == 0 || hlen >= sizeof inner) {
            snprintf(why, whylen, "the IPv6 address in brackets is not closed or not valid ([2001:db8::1])");
            return false;
        }
        memcpy(inner, p + 1, hlen);
        inner[hlen] = '\0';
        if (inet_pton(AF_INET6, inner, &a) != 1) {
            snprintf(why, whylen, "\"[%s]\" is not an IPv6 address", inner);
            return false;
        }
        host = p + 1;
        end = close + 1;
    } else {
        hlen = strcspn(p, ":/?#,");
        end = p + hlen;
        if (hlen == 0) {
            snprintf(why, whylen, "the host is missing (%s)", form);
            return false;
        }
        if (hlen > 253) {
            snprintf(why, whylen, "the host is longer than 253 characters");
            return false;
        }
        for (size_t i = 0; i < hlen; i++) {
            char ch = host[i];
            if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
                  ch == '.' || ch == '_')) {
                snprintf(why, whylen, "the host \"%.*s\" is not a host name or an IPv4 address (an IPv6 address "
                         "goes in brackets: [::1]:6379)", (int)(hlen > 80 ? 80 : hlen), host);
                return false;
            }
        }
    }
    if (*end != ':') {
        snprintf(why, whylen, "the port is missing after \"%.*s\": %s", (int)(hlen > 80 ? 80 : hlen), host, form);
        return false;
    }
    const char *ps = end + 1;
    size_t plen = strcspn(ps, "/?#,");
    if (plen == 0) {
        snprintf(why, whylen, "the port is missing after \"%.*s\": %s", (int)(hlen > 80 ? 80 : hlen), host, form);
        return false;
    }
    if (strspn(ps, "0123456789") != plen) {
        snprintf(why, whylen, "the port \"%.*s\" is not a number (1-65535)", (int)(plen > 20 ? 20 : plen), ps);
        return false;
    }
    long port = plen > 6 ? 100000 : strtol(ps, NULL, 10);
    if (port < 1 || port > 65535) {
        snprintf(why, whylen, "the port %.*s is out of range (1-65535)", (int)(plen > 20 ? 20 : plen), ps);
        return false;
    }
    memcpy(host_out, host, hlen);
    host_out[hlen] = '\0';
    *port_out = (int)port;
    *rest_out = ps + plen;
    return true;
}

#define SENTINEL_FORM "redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[?db=N]"

/* redis-sentinel://HOST:PORT[,HOST:PORT...]/MASTER[?db=N] (v after the
 * scheme) into r (sentinel, nsentinels, sentinels, master, db). False with
 * the reason in why. */
static bool parse_sentinel_url(const char *p, struct config_redis *r, char *why, size_t whylen)
{
    if (memchr(p, '@', strcspn(p, "/?#")) != NULL) {
        snprintf(why, whylen, "must not carry a user or password (user:password@): give the Sentinels' password "
                 "in redis_sentinel_password_file and the master's in redis_password_file");
        return false;
    }
    r->nsentinels = 0;
    for (;;) {
        if (r->nsentinels == CONFIG_REDIS_SENTINELS_MAX) {
            snprintf(why, whylen, "more than %d Sentinels", CONFIG_REDIS_SENTINELS_MAX);
            return false;
        }
        struct config_sentinel *s = &r->sentinels[r->nsentinels];
        const char *rest;
        if (*p == '\0' || *p == '/' || *p == ',') {
            snprintf(why, whylen, "a Sentinel's HOST:PORT is missing (%s)", SENTINEL_FORM);
            return false;
        }
        if (!parse_host_port(p, SENTINEL_FORM, s->host, &s->port, &rest, why, whylen))
            return false;
        r->nsentinels++;
        p = rest;
        if (*p != ',')
            break;
        p++;
    }
    if (*p != '/' || p[1] == '\0' || p[1] == '?' || p[1] == '#') {
        snprintf(why, whylen, "the master's name is missing after the Sentinels: %s (the name in Sentinel's "
                 "\"sentinel monitor NAME ...\")", SENTINEL_FORM);
        return false;
    }
    p++;
    size_t n = strcspn(p, "?#");
    if (n > CONFIG_REDIS_MASTER_MAX) {
        snprintf(why, whylen, "the master's name is longer than %d characters", CONFIG_REDIS_MASTER_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' ||
              ch == '.' || ch == '_' || ch == ':')) {
            snprintf(why, whylen, "the master's name \"%.*s\" may only hold A-Z a-z 0-9 _ - . :", (int)n, p);
            return false;
        }
    }
    memcpy(r->master, p, n);
    r->master[n] = '\0';
    p += n;
    r->db = 0;
    if (*p == '#') {
        snprintf(why, whylen, "a fragment (#...) is not accepted: %s", SENTINEL_FORM);
        return false;
    }
    if (*p == '?') {
        if (strncmp(p + 1, "db=", 3) != 0) {
            snprintf(why, whylen, "the only query parameter is db: %s", SENTINEL_FORM);
            return false;
        }
        if (!parse_db(p + 4, &r->db)) {
            snprintf(why, whylen, "the db \"%.40s\" is not a number (0, 1, 2, ...)", p + 4);
            return false;
        }
    }
    r->sentinel = true;
    r->unix_socket = false;
    return true;
}

/* `redis`: redis://HOST:PORT[/DB] (HOST a name, an IPv4 address or an IPv6
 * address in brackets) or unix:///PATH[?db=N], into r (host, port, path,
 * db, unix_socket). False with the reason in why, which quotes only the
 * part at fault (never a user:password@ part). */
static bool parse_redis_url(const char *v, struct config_redis *r, char *why, size_t whylen)
{
    for (const unsigned char *p = (const unsigned char *)v; *p; p++)
        if (*p <= ' ' || *p >= 0x7f) {
            snprintf(why, whylen, "must not contain spaces or control characters");
            return false;
        }
    if (strncmp(v, "unix://", 7) == 0) {
        const char *p = v + 7;
        if (*p != '/') {
            snprintf(why, whylen, "the socket's path must be absolute: unix:///PATH (three slashes), e.g. "
                     "unix:///run/redis/redis-server.sock");
            return false;
        }
        size_t plen = strcspn(p, "?#");
        if (plen >= sizeof r->path) {
            snprintf(why, whylen, "the socket's path is longer than %zu bytes (a Unix socket's limit)",
                     sizeof r->path - 1);
            return false;
        }
        memcpy(r->path, p, plen);
        r->path[plen] = '\0';
        r->db = 0;
        if (p[plen] == '#') {
            snprintf(why, whylen, "a fragment (#...) is not accepted: unix:///PATH[?db=N]");
            return false;
        }
        if (p[plen] == '?') {
            const char *q = p + plen + 1;
            if (strncmp(q, "db=", 3) != 0) {
                snprintf(why, whylen, "the only query parameter is db: unix:///PATH?db=N");
                return false;
            }
            if (!parse_db(q + 3, &r->db)) {
                snprintf(why, whylen, "the db \"%.40s\" is not a number (0, 1, 2, ...)", q + 3);
                return false;
            }
        }
        r->unix_socket = true;
        return true;
    }
    if (strncmp(v, "redis-sentinel://", 17) == 0)
        return parse_sentinel_url(v + 17, r, why, whylen);
    if (strncmp(v, "rediss://", 9) == 0) {
        snprintf(why, whylen, "TLS (rediss://) is not supported: give redis://HOST:PORT[/DB] or unix:///PATH[?db=N]");
        return false;
    }
    if (strncmp(v, "redis://", 8) != 0) {
        snprintf(why, whylen, "must start with redis://, unix:// or redis-sentinel:// (redis://HOST:PORT[/DB], "
                 "unix:///PATH[?db=N] or " SENTINEL_FORM ")");
        return false;
    }
    const char *p = v + 8;
    if (memchr(p, '@', strcspn(p, "/?#")) != NULL) {
        snprintf(why, whylen, "must not carry a user or password (user:password@): give the password in "
                 "redis_password_file");
        return false;
    }
    char host[256];
    int port;
    const char *rest;
    if (!parse_host_port(p, "redis://HOST:PORT[/DB]", host, &port, &rest, why, whylen))
        return false;
    r->db = 0;
    if (*rest == '/') {
        if (!parse_db(rest + 1, &r->db)) {
            snprintf(why, whylen, "the db \"%.40s\" after the port is not a number (0, 1, 2, ...)", rest + 1);
            return false;
        }
    } else if (*rest != '\0') {
        snprintf(why, whylen, "\"%.40s\" after the port is not accepted: redis://HOST:PORT[/DB]", rest);
        return false;
    }
    util_copy(r->host, sizeof r->host, host);
    r->port = port;
    r->unix_socket = false;
    return true;
}

/* redis_prefix: 1..CONFIG_REDIS_PREFIX_MAX of A-Z a-z 0-9 : _ - . */
static bool check_redis_prefix(const char *v, char *why, size_t whylen)
{
    size_t n = strlen(v);
    if (n > CONFIG_REDIS_PREFIX_MAX) {
        snprintf(why, whylen, "is %zu characters long: at most %d", n, CONFIG_REDIS_PREFIX_MAX);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)v[i];
        if (!((ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == ':' ||
              ch == '_' || ch == '-' || ch == '.')) {
            if (ch == ' ')
                snprintf(why, whylen, "a space (at %zu) is not allowed: only A-Z a-z 0-9 : _ - .", i + 1);
            else if (ch > ' ' && ch < 0x7f)
                snprintf(why, whylen, "the character '%c' (at %zu) is not allowed: only A-Z a-z 0-9 : _ - .", ch,
                         i + 1);
            else
                snprintf(why, whylen, "the byte 0x%02x (at %zu) is not allowed: only A-Z a-z 0-9 : _ - .", ch, i + 1);
            return false;
        }
    }
    return n > 0;
}

void config_redis_address(const struct config_redis *r, char *buf, size_t len)
{
    if (len == 0)
        return;
    int n;
    if (!r->on)
        n = snprintf(buf, len, "-");
    else if (r->unix_socket)
        n = r->db ? snprintf(buf, len, "unix://%s?db=%d", r->path, r->db) : snprintf(buf, len, "unix://%s", r->path);
    else if (r->sentinel) {
        n = snprintf(buf, len, "redis-sentinel://");
        for (int i = 0; i < r->nsentinels && n >= 0 && (size_t)n < len; i++) {
            bool v6 = strchr(r->sentinels[i].host, ':') != NULL;
            n += snprintf(buf + n, len - (size_t)n, "%s%s%s%s:%d", i ? "," : "", v6 ? "[" : "",
                          r->sentinels[i].host, v6 ? "]" : "", r->sentinels[i].port);
        }
        if (n >= 0 && (size_t)n < len)
            n += snprintf(buf + n, len - (size_t)n, "/%s", r->master);
        if (n >= 0 && (size_t)n < len && r->db)
            snprintf(buf + n, len - (size_t)n, "?db=%d", r->db);
    } else {
        bool v6 = strchr(r->host, ':') != NULL;
        n = snprintf(buf, len, "redis://%s%s%s:%d", v6 ? "[" : "", r->host, v6 ? "]" : "", r->port);
        if (n > 0 && (size_t)n < len && r->db)
            snprintf(buf + n, len - (size_t)n, "/%d", r->db);
    }
    if (n < 0)
        buf[0] = '\0';
}

static const char *const top_keys[] = {
    "api_base", "state_dir", "templates_dir", "shops", "shops_dir", "keys_dir", "shop_templates_root",
    "schedule_ms", "read_timeout_ms", "state_slots", "state_slots_per_key", "max_held", "max_held_per_shop",
    "read_planning", "redis", "redis_password_file", "redis_sentinel_password_file", "redis_prefix", "redis_hosts",
    "first_paint_ms",
};
static const char *const shop_keys[] = {
    "id", "name", "hosts", "secret_key_file", "secret_key_env", "shop_url", "locale",
    "read_budget_per_minute", "cors_origins", "templates_dir", "id_param", "notify_secret_file", "progressive",
};

static void check_keys(struct cerr *e, const char *file, const char *where, json_t *obj,
                       const char *const *allowed, size_t n)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        bool ok = false;
        for (size_t i = 0; i < n && !ok; i++)
            ok = strcmp(k, allowed[i]) == 0;
        if (!ok) {
            char path[160];
            snprintf(path, sizeof path, "%s%s", where, k);
            cfail(e, file, path, "unknown key (a typo must not silently change behaviour)");
        }
        (void)v;
    }
}

/* Optional string member; NULL when absent, error when not a string. */
static const char *opt_str(struct cerr *e, const char *file, const char *where, json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v))
        return NULL;
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v)) {
        char path[160];
        snprintf(path, sizeof path, "%s%s", where, key);
        cfail(e, file, path, "must be a non-empty string");
        return NULL;
    }
    return json_string_value(v);
}

/* The templates of (dir, locale), loaded once per configuration. NULL with
 * an error recorded in e (out of memory included). */
static const struct templates *get_templates(struct config *c, struct cerr *e, const char *file,
                                             const char *where, const char *dir, const char *locale,
                                             const char *confine)
{
    for (int i = 0; i < c->ntpls; i++)
        if (strcmp(c->tpls[i]->locale, locale) == 0 && strcmp(c->tpls[i]->dir, dir) == 0)
            return c->tpls[i];
    char why[600];
    struct templates *t = templates_load(dir, strcmp(dir, c->templates_dir) ? c->templates_dir : NULL,
                                         locale, confine, why, sizeof why);
    if (t == NULL) {
        cfail(e, file, where, "%s", why);
        return NULL;
    }
    struct templates **arr = realloc(c->tpls, sizeof *arr * ((size_t)c->ntpls + 1));
    if (arr == NULL) {
        templates_free(t);
        cfail_oom(e, file);
        return NULL;
    }
    c->tpls = arr;
    c->tpls[c->ntpls++] = t;
    return t;
}

/* A folder named by the main configuration, resolved; NULL with an error. */
static char *resolve_dir(struct cerr *e, const char *file, const char *key, const char *dir)
{
    char real[PATH_MAX];
    struct stat st;
    if (realpath(dir, real) == NULL) {
        cfail(e, file, key, "%s: %s", dir, strerror(errno));
        return NULL;
    }
    if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
        cfail(e, file, key, "%s is not a folder", dir);
        return NULL;
    }
    return cdup(e, file, real);
}

/* The file keys_dir/NAME<suffix> of the tenant NAME (suffix "" for its key)
 * into out (capacity outlen). `given`: the path the tenant's file names for
 * it (NULL: left out), which must resolve to that very file. The file must
 * not be a symbolic link, so two tenants never share one. A missing file
 * is not this function's error (the reader says so). False with the reason
 * in why. */
static bool tenant_file(const struct config *c, const char *name, const char *suffix, const char *given,
                        char *out, size_t outlen, char *why, size_t whylen)
{
    size_t kl = strlen(c->keys_dir);
    int n = snprintf(out, outlen, "%s%s%s%s", c->keys_dir, kl > 0 && c->keys_dir[kl - 1] == '/' ? "" : "/", name,
                     suffix);
    if (n < 0 || (size_t)n >= outlen) {
        snprintf(why, whylen, "the path of keys_dir/%s%s is too long", name, suffix);
        return false;
    }
    struct stat st;
    if (lstat(out, &st) == 0 && S_ISLNK(st.st_mode)) {
        snprintf(why, whylen, "%.300s is a symbolic link: a tenant's file in keys_dir must be the file itself "
                 "(two tenants must never share one)", out);
        return false;
    }
    if (given != NULL) {
        char real[PATH_MAX];
        if (realpath(given, real) == NULL) {
            snprintf(why, whylen, "cannot open %.300s: %s", given, strerror(errno));
            return false;
        }
        if (strcmp(real, out) != 0) {
            snprintf(why, whylen, "names %.200s, but the shop file %s.json may only use %.200s (or leave it out)",
                     given, name, out);
            return false;
        }
    }
    return true;
}

/* A shop's notify secret (told by the shop, signed): the first line of nf
 * (`notify_secret_file`, may be NULL), read like a key file. For a tenant
 * (the file shops_dir/NAME.json; tenant is NAME) it is keys_dir/NAME.notify
 * (tenant_file), used when that file exists; nf, when given, must name
 * exactly that file. No secret: s->notify_secret stays NULL (telling is
 * off for the shop). */
static void load_notify_secret(struct config *c, struct cerr *e, const char *file, const char *key,
                               const char *nf, struct shop *s, const char *tenant)
{
    char want[PATH_MAX], why[600];
    if (tenant != NULL) {
        if (!tenant_file(c, tenant, ".notify", nf, want, sizeof want, why, sizeof why)) {
            cfail(e, file, key, "%s", why);
            return;
        }
        struct stat st;
        if (nf == NULL && lstat(want, &st) != 0 && errno == ENOENT)
            return; /* no secret: telling is off for this shop */
        nf = want;
    }
    if (nf == NULL)
        return;
    bool oom = false;
    s->notify_secret = read_first_line(nf, c->keys_dir, SECRET_MAX, "notify secret", &oom, why, sizeof why);
    if (oom)
        cfail_oom(e, file);
    else if (s->notify_secret == NULL)
        cfail(e, file, key, "%s", why);
    else if (!check_secret(s->notify_secret))
        cfail(e, file, key, "the notify secret must be 1-%d printable characters without spaces", SECRET_MAX);
}

/* A shop whose name and shop_url would make one of its pages larger than
 * RENDER_PAGE_MAX (for the longest id a request can carry) is refused
 * (recorded in e under `key`): each word's page and, when the shop's
 * browsers get the streamed page, that page ending with each word (its top
 * and its result together). */
static void check_page_sizes(struct cerr *e, const char *file, const char *key, const struct shop *s)
{
    char id[STATE_ID_MAX + 1], retry[STATE_ID_MAX + 40];
    memset(id, 'x', STATE_ID_MAX);
    id[STATE_ID_MAX] = '\0';
    render_retry_url(retry, sizeof retry, s->id_param, id);
    struct page_vars v = {.id = id, .shop_name = s->name, .shop_url = s->shop_url, .retry_url = retry};
    bool streams = s->progressive && templates_stream(s->tpl);
    for (int w = 0; w < W_COUNT; w++) {
        size_t n = render_html_len(s->tpl, (enum word)w, &v);
        const char *kind = "";
        if (n <= RENDER_PAGE_MAX && streams) {
            n = render_stream_len(s->tpl, (enum word)w, &v);
            kind = "streamed ";
        }
        if (n > RENDER_PAGE_MAX) {
            cfail(e, file, key, "the %s%s page would be %zu KiB with this shop's name and shop_url: at most %d KiB "
                  "(fewer placeholders, or a shorter name or shop_url)", kind, word_name((enum word)w), n / 1024,
                  RENDER_PAGE_MAX / 1024);
            return;
        }
    }
}

/* Characters (UTF-8 code points) of s. Can't fail. */
static size_t utf8_chars(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += ((unsigned char)*s & 0xC0) != 0x80;
    return n;
}

/* Load one shop object into s. `tenant`: NULL for an entry of `shops`; the
 * NAME of shops_dir/NAME.json for a file that a hosting control panel
 * writes for one tenant: its id is NAME, its key keys_dir/NAME, no
 * secret_key_env, and templates_dir only inside shop_templates_root. */
static void load_shop(struct config *c, struct cerr *e, const char *file,
                      const char *where, json_t *o, struct shop *s, const char *tenant)
{
    char why[600];
    if (!json_is_object(o)) {
        cfail(e, file, where[0] ? where : NULL, "a shop must be a JSON object");
        return;
    }
    check_keys(e, file, where, o, shop_keys, ARRAY_LEN(shop_keys));
    char path[160];
#define P(k) (snprintf(path, sizeof path, "%s%s", where, k), path)

    const char *id = opt_str(e, file, where, o, "id");
    if (tenant != NULL && id != NULL && strcmp(id, tenant) != 0)
        cfail(e, file, P("id"), "\"%.80s\" is not the file's name: the file %s.json describes the shop \"%s\" "
              "(give that id, or leave id out)", id, tenant, tenant);
    else if (tenant != NULL)
        util_copy(s->id, sizeof s->id, tenant);
    else if (id == NULL)
        cfail(e, file, P("id"), "is required (1-64 characters of A-Z a-z 0-9 _ -)");
    else if (!ids_valid_id(id))
        cfail(e, file, P("id"), "\"%.80s\" must be 1-64 characters of A-Z a-z 0-9 _ -", id);
    else
        util_copy(s->id, sizeof s->id, id);

    const char *name = opt_str(e, file, where, o, "name");
    if (name != NULL && utf8_chars(name) > CONFIG_NAME_MAX)
        cfail(e, file, P("name"), "is %zu characters long: at most %d", utf8_chars(name), CONFIG_NAME_MAX);
    s->name = cdup(e, file, name ? name : s->id);

    json_t *hosts = json_object_get(o, "hosts");
    if (hosts != NULL && !json_is_array(hosts))
        cfail(e, file, P("hosts"), "must be a list of host names");
    else if (json_array_size(hosts) > CONFIG_MAX_HOSTS)
        cfail(e, file, P("hosts"), "at most %d hosts", CONFIG_MAX_HOSTS);
    else {
        size_t i;
        json_t *h;
        json_array_foreach(hosts, i, h) {
            bool oom = false;
            char *lc = normalize_host(json_string_value(h), &oom);
            if (oom) {
                cfail_oom(e, file);
                continue;
            }
            if (lc == NULL) {
                cfail(e, file, P("hosts"), "entry %zu must be a host name without port or scheme "
                      "(an IPv6 address in brackets: [2001:db8::1])", i + 1);
                continue;
            }
            s->hosts[s->nhosts++] = lc;
        }
    }

    const char *kf = opt_str(e, file, where, o, "secret_key_file");
    const char *ke = opt_str(e, file, where, o, "secret_key_env");
    char tkf[PATH_MAX];
    if (tenant != NULL && ke != NULL) {
        cfail(e, file, P("secret_key_env"), "is not allowed in a shop file in shops_dir (a tenant must not "
              "read kembali's environment): its key is the file keys_dir/%s", tenant);
    } else if (tenant != NULL && !tenant_file(c, tenant, "", kf, tkf, sizeof tkf, why, sizeof why)) {
        cfail(e, file, P("secret_key_file"), "%s", why);
    } else if (tenant == NULL && (kf == NULL) == (ke == NULL)) {
        cfail(e, file, P("secret_key_file"), "give exactly one of secret_key_file or secret_key_env");
    } else if (tenant != NULL || kf != NULL) {
        kf = tenant != NULL ? tkf : kf;
        bool oom = false;
        char real[PATH_MAX];
        s->secret = read_first_line(kf, c->keys_dir, SECRET_MAX, "key", &oom, why, sizeof why);
        if (oom)
            cfail_oom(e, file);
        else if (s->secret == NULL)
            cfail(e, file, P("secret_key_file"), "%s", why);
        else if (realpath(kf, real) != NULL)
            s->key_file = cdup(e, file, real);
    } else {
        const char *v = getenv(ke);
        if (v == NULL || *v == '\0')
            cfail(e, file, P("secret_key_env"), "environment variable %s is not set", ke);
        else
            s->secret = cdup(e, file, v);
    }
    if (s->secret != NULL && !check_secret(s->secret))
        cfail(e, file, P(kf ? "secret_key_file" : "secret_key_env"),
              "the key must be 1-%d printable characters without spaces", SECRET_MAX);
    load_notify_secret(c, e, file, P("notify_secret_file"), opt_str(e, file, where, o, "notify_secret_file"), s,
                       tenant);

    const char *url = opt_str(e, file, where, o, "shop_url");
    if (url != NULL && !check_url(url))
        cfail(e, file, P("shop_url"), "must be an http:// or https:// URL");
    s->shop_url = cdup(e, file, url ? url : "/");

    const char *loc = opt_str(e, file, where, o, "locale");
    if (loc != NULL && strcmp(loc, "id") != 0 && strcmp(loc, "en") != 0)
        cfail(e, file, P("locale"), "must be \"id\" or \"en\"");
    util_copy(s->locale, sizeof s->locale, loc && strcmp(loc, "en") == 0 ? "en" : "id");

    s->read_budget = 120;
    json_t *b = json_object_get(o, "read_budget_per_minute");
    if (b != NULL) {
        if (!json_is_integer(b) || json_integer_value(b) < 1 || json_integer_value(b) > STATE_BUDGET_MAX)
            cfail(e, file, P("read_budget_per_minute"), "must be an integer from 1 to %d (Kasera allows 300 per key)",
                  STATE_BUDGET_MAX);
        else
            s->read_budget = (int)json_integer_value(b);
    }

    json_t *ori = json_object_get(o, "cors_origins");
    if (ori != NULL && (!json_is_array(ori) || json_array_size(ori) > CONFIG_MAX_ORIGINS))
        cfail(e, file, P("cors_origins"), "must be a list of at most %d origins", CONFIG_MAX_ORIGINS);
    else {
        size_t i;
        json_t *v;
        json_array_foreach(ori, i, v) {
            const char *ov = json_string_value(v);
            if (ov == NULL || !check_url(ov) || strchr(strchr(ov, ':') + 3, '/') != NULL) {
                cfail(e, file, P("cors_origins"), "entry %zu must be an origin like https://shop.example", i + 1);
                continue;
            }
            char *d = cdup(e, file, ov);
            if (d != NULL)
                s->origins[s->norigins++] = d;
        }
    }

    s->progressive = true;
    json_t *pg = json_object_get(o, "progressive");
    if (pg != NULL && !json_is_boolean(pg))
        cfail(e, file, P("progressive"), "must be true (a browser sees a waiting page at once) or false (one answer)");
    else if (pg != NULL)
        s->progressive = json_is_true(pg);

    const char *ip = opt_str(e, file, where, o, "id_param");
    if (ip != NULL && (strlen(ip) > 32 || !ids_valid_id(ip)))
        cfail(e, file, P("id_param"), "must be 1-32 characters of A-Z a-z 0-9 _ -");
    util_copy(s->id_param, sizeof s->id_param, ip && strlen(ip) <= 32 && ids_valid_id(ip) ? ip : "id");

    const char *td = opt_str(e, file, where, o, "templates_dir");
    if (td != NULL && tenant != NULL) {
        char real[PATH_MAX];
        if (c->shop_templates_root == NULL)
            cfail(e, file, P("templates_dir"), "a shop file in shops_dir may set templates_dir only when the "
                  "main configuration sets shop_templates_root");
        else if (realpath(td, real) == NULL)
            cfail(e, file, P("templates_dir"), "%s: %s", td, strerror(errno));
        else if (!util_path_inside(real, c->shop_templates_root) || strcmp(real, c->shop_templates_root) == 0)
            cfail(e, file, P("templates_dir"), "%s resolves to %s, outside shop_templates_root %s", td, real,
                  c->shop_templates_root);
        else if (!e->oom)
            s->tpl = get_templates(c, e, file, P("templates_dir"), real, s->locale, c->shop_templates_root);
    } else if (!e->oom) {
        s->tpl = get_templates(c, e, file, P("templates_dir"), td ? td : c->templates_dir, s->locale, NULL);
    }
    if (s->tpl != NULL && s->name != NULL && s->shop_url != NULL)
        check_page_sizes(e, file, P("templates_dir"), s);
#undef P
}

static void shop_clear(struct shop *s)
{
    free(s->name);
    for (int i = 0; i < s->nhosts; i++)
        free(s->hosts[i]);
    if (s->secret) {
        explicit_bzero(s->secret, strlen(s->secret));
        free(s->secret);
    }
    if (s->notify_secret) {
        explicit_bzero(s->notify_secret, strlen(s->notify_secret));
        free(s->notify_secret);
    }
    free(s->shop_url);
    for (int i = 0; i < s->norigins; i++)
        free(s->origins[i]);
    free(s->source);
    free(s->key_file);
    memset(s, 0, sizeof *s);
}

/* A new zeroed shop at the end of c->shops; NULL with an error in e. */
static struct shop *add_shop(struct config *c, struct cerr *e, const char *file)
{
    struct shop *arr = realloc(c->shops, sizeof *arr * ((size_t)c->nshops + 1));
    if (arr == NULL) {
        cfail_oom(e, file);
        return NULL;
    }
    c->shops = arr;
    memset(&arr[c->nshops], 0, sizeof arr[0]);
    return &arr[c->nshops++];
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Copy the previous version of a shop (kept after its file went bad) into
 * dst; its templates are shared by reference. False when out of memory. */
static bool shop_copy(struct config *c, struct shop *dst, const struct shop *src)
{
    *dst = *src;
    dst->name = NULL;
    dst->secret = NULL;
    dst->notify_secret = NULL;
    dst->shop_url = NULL;
    dst->source = NULL;
    dst->key_file = NULL;
    dst->nhosts = dst->norigins = 0;
    dst->tpl = NULL;
    bool ok = (dst->name = strdup(src->name)) != NULL && (dst->shop_url = strdup(src->shop_url)) != NULL &&
              (dst->source = strdup(src->source)) != NULL && (dst->secret = strdup(src->secret)) != NULL &&
              (src->key_file == NULL || (dst->key_file = strdup(src->key_file)) != NULL) &&
              (src->notify_secret == NULL || (dst->notify_secret = strdup(src->notify_secret)) != NULL);
    for (int i = 0; ok && i < src->nhosts; i++)
        ok = (dst->hosts[dst->nhosts++] = strdup(src->hosts[i])) != NULL;
    for (int i = 0; ok && i < src->norigins; i++)
        ok = (dst->origins[dst->norigins++] = strdup(src->origins[i])) != NULL;
    if (ok) {
        struct templates **arr = realloc(c->kept_tpls, sizeof *arr * ((size_t)c->nkept_tpls + 1));
        ok = arr != NULL;
        if (ok) {
            c->kept_tpls = arr;
            c->kept_tpls[c->nkept_tpls++] = templates_ref((struct templates *)src->tpl);
            dst->tpl = src->tpl;
        }
    }
    return ok;
}

/* The bytes of one shop file: a regular file (a FIFO is never waited on)
 * of at most SHOP_FILE_MAX bytes, parsed. NULL with the reason in e. */
static json_t *read_shop_file(struct cerr *e, const char *path)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        cfail(e, path, NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        cfail(e, path, NULL, "not a regular file");
        close(fd);
        return NULL;
    }
    char *buf = malloc(SHOP_FILE_MAX + 1);
    if (buf == NULL) {
        cfail_oom(e, path);
        close(fd);
        return NULL;
    }
    size_t n = 0;
    int rerr = 0;
    while (n <= SHOP_FILE_MAX) {
        ssize_t r = read(fd, buf + n, SHOP_FILE_MAX + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rerr = r < 0 ? errno : 0;
            break;
        }
        n += (size_t)r;
    }
    close(fd);
    json_t *o = NULL;
    if (rerr != 0) {
        cfail(e, path, NULL, "cannot read: %s", strerror(rerr));
    } else if (n > SHOP_FILE_MAX) {
        cfail(e, path, NULL, "larger than %d KiB", SHOP_FILE_MAX / 1024);
    } else {
        json_error_t je;
        o = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
        if (o == NULL)
            cfail(e, path, NULL, "line %d: %s", je.line, je.text);
    }
    free(buf);
    return o;
}

/* Record file as skipped, with the reasons `why` ("file: key: reason"
 * lines); collides: the shop it collided with, or NULL; kept: whether its
 * previous version serves. False when out of memory. */
static bool add_skip(struct config *c, const char *file, const char *why, const char *collides, bool kept)
{
    struct config_skip *arr = realloc(c->skipped, sizeof *arr * ((size_t)c->nskipped + 1));
    if (arr == NULL)
        return false;
    c->skipped = arr;
    struct config_skip *k = &arr[c->nskipped];
    k->file = strdup(file);
    k->why = strdup(why);
    k->collides = collides != NULL && *collides ? strdup(collides) : NULL;
    k->kept = kept;
    if (k->file == NULL || k->why == NULL || (collides != NULL && *collides && k->collides == NULL)) {
        free(k->file);
        free(k->why);
        free(k->collides);
        return false;
    }
    size_t l = strlen(k->why);
    if (l > 0 && k->why[l - 1] == '\n')
        k->why[l - 1] = '\0';
    c->nskipped++;
    return true;
}

/* One file of shops_dir while the folder loads. */
struct tenant {
    char *path;                    /* shops_dir/NAME.json */
    struct shop shop;              /* its new version, when it loaded */
    bool loaded;                   /* shop loaded without a problem */
    const struct shop *old;        /* its version in prev, or NULL */
    const struct shop *claims;     /* the version whose hosts it claims: &shop if loaded, else old, else NULL */
    char *why;                     /* its problems, "file: key: reason" lines; NULL: none */
    size_t whylen;
    bool lost;                     /* `claims` collides with another shop */
    char collides[STATE_ID_MAX + 1]; /* the first shop it collided with */
    bool oom;
};

static void tenant_note(struct tenant *t, const char *collides, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Append a problem of t's file ("path: msg") to t->why; collides: the
 * shop it collided with (the first one is kept), or NULL. Out of memory
 * sets t->oom. */
static void tenant_note(struct tenant *t, const char *collides, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (collides != NULL && t->collides[0] == '\0')
        util_copy(t->collides, sizeof t->collides, collides);
    size_t add = strlen(t->path) + strlen(msg) + 3;
    if (t->whylen + add >= SHOP_ERR_MAX)
        return; /* enough said */
    char *w = realloc(t->why, t->whylen + add + 1);
    if (w == NULL) {
        t->oom = true;
        return;
    }
    t->why = w;
    t->whylen += (size_t)snprintf(w + t->whylen, add + 1, "%s: %s\n", t->path, msg);
}

/* One host claimed by a shop while shops_dir loads. */
struct claim {
    const char *host;
    int who;                       /* >= 0: that tenant; < 0: the main configuration's shop -1 - who */
    bool had;                      /* the tenant served it before this reload */
};

static int cmp_claim(const void *a, const void *b)
{
    const struct claim *x = a, *y = b;
    int d = strcmp(x->host, y->host);
    return d ? d : (x->who > y->who) - (x->who < y->who);
}

/* The claim that owns the one host of cl[a..b) (sorted by who): the main
 * configuration's shop, else the tenant that served it before and still
 * claims it, else the only claimant (a shop listing the host twice is one
 * claimant); -1 when two or more tenants claim it anew (a name that sorts
 * first must not win it: none does). Pure; can't fail. */
static long claim_owner(const struct claim *cl, size_t a, size_t b)
{
    for (size_t i = a; i < b; i++)
        if (cl[i].who < 0)
            return (long)i;
    for (size_t i = a; i < b; i++)
        if (cl[i].had)
            return (long)i;
    return cl[a].who == cl[b - 1].who ? (long)a : -1;
}

/* The range [*a, *b) of the claims on `host` in the sorted cl. */
static void claims_on(const struct claim *cl, size_t n, const char *host, size_t *a, size_t *b)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (strcmp(cl[mid].host, host) < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    *a = lo;
    while (lo < n && strcmp(cl[lo].host, host) == 0)
        lo++;
    *b = lo;
}

static bool shop_has_host(const struct shop *s, const char *host)
{
    for (int i = 0; i < s->nhosts; i++)
        if (strcmp(s->hosts[i], host) == 0)
            return true;
    return false;
}

/* Does tenant shop s take the id or the key file of one of the main
 * configuration's shops c->shops[0..ninline)? Noted in t. */
static bool tenant_takes_inline(const struct config *c, int ninline, struct tenant *t, const struct shop *s)
{
    for (int j = 0; j < ninline; j++) {
        const struct shop *o = &c->shops[j];
        if (strcmp(o->id, s->id) == 0) {
            tenant_note(t, o->id, "the id \"%s\" is the id of a shop of the main configuration", s->id);
            return true;
        }
        if (o->key_file != NULL && s->key_file != NULL && strcmp(o->key_file, s->key_file) == 0) {
            tenant_note(t, o->id, "secret_key_file: %s is the key file of shop \"%s\" of the main configuration",
                        s->key_file, o->id);
            return true;
        }
    }
    return false;
}

/* Can tenant i's previous version serve again (its new one collided)? Only
 * when nothing else claims any of its hosts nor is its id or key. */
static bool old_fits(const struct config *c, int ninline, const struct claim *cl, size_t ncl, struct tenant *t,
                     int i)
{
    if (tenant_takes_inline(c, ninline, t, t->old))
        return false;
    for (int h = 0; h < t->old->nhosts; h++) {
        size_t a, b;
        claims_on(cl, ncl, t->old->hosts[h], &a, &b);
        for (size_t k = a; k < b; k++)
            if (cl[k].who != i)
                return false;
    }
    return true;
}

/* Decide which tenants serve (interface.md, "Tenants"): each claimed
 * host goes to its owner (claim_owner); a tenant whose version claims a
 * host another shop owns, or that takes the id or key file of a shop of
 * the main configuration, is noted in t (lost, why, collides). False when
 * out of memory. */
static bool tenants_resolve(const struct config *c, struct tenant *t, size_t nt)
{
    int ninline = c->nshops;
    size_t ncl = 0;
    for (int j = 0; j < ninline; j++)
        ncl += (size_t)c->shops[j].nhosts;
    for (size_t i = 0; i < nt; i++)
        ncl += t[i].claims ? (size_t)t[i].claims->nhosts : 0;
    struct claim *cl = malloc(sizeof *cl * (ncl ? ncl : 1));
    if (cl == NULL)
        return false;
    size_t n = 0;
    for (int j = 0; j < ninline; j++)
        for (int h = 0; h < c->shops[j].nhosts; h++)
            cl[n++] = (struct claim){c->shops[j].hosts[h], -1 - j, false};
    for (size_t i = 0; i < nt; i++)
        for (int h = 0; t[i].claims && h < t[i].claims->nhosts; h++)
            cl[n++] = (struct claim){t[i].claims->hosts[h], (int)i,
                                     t[i].old != NULL && shop_has_host(t[i].old, t[i].claims->hosts[h])};
    qsort(cl, ncl, sizeof *cl, cmp_claim);

    for (size_t i = 0; i < nt; i++)
        if (t[i].claims != NULL && tenant_takes_inline(c, ninline, &t[i], t[i].claims))
            t[i].lost = true;
    for (size_t a = 0; a < ncl;) {
        size_t b = a + 1;
        while (b < ncl && strcmp(cl[b].host, cl[a].host) == 0)
            b++;
        long own = claim_owner(cl, a, b);
        for (size_t k = a; k < b; k++) {
            if (cl[k].who < 0 || (own >= 0 && cl[k].who == cl[own].who) || (k > a && cl[k].who == cl[k - 1].who))
                continue;
            struct tenant *me = &t[cl[k].who];
            me->lost = true;
            if (own >= 0 && cl[own].who < 0) {
                const char *id = c->shops[-1 - cl[own].who].id;
                tenant_note(me, id, "hosts: the host \"%s\" is served by shop \"%s\" of the main configuration",
                            cl[k].host, id);
            } else if (own >= 0) {
                const char *id = t[cl[own].who].claims->id;
                tenant_note(me, id, "hosts: the host \"%s\" is served by shop \"%s\" (%s): a new file never "
                            "takes over a host", cl[k].host, id, t[cl[own].who].path);
            } else {
                size_t o = cl[k].who == cl[a].who ? b - 1 : a; /* another claimant */
                const char *id = t[cl[o].who].claims->id;
                tenant_note(me, id, "hosts: the host \"%s\" is also claimed by shop \"%s\" (%s): no shop serves "
                            "it until one of the files gives it up", cl[k].host, id, t[cl[o].who].path);
            }
        }
        a = b;
    }
    /* a new version that collided: its previous one, if nothing else wants it */
    for (size_t i = 0; i < nt; i++)
        if (t[i].lost && t[i].claims == &t[i].shop && t[i].old != NULL) {
            char *why = t[i].why;
            size_t whylen = t[i].whylen;
            t[i].why = NULL;
            t[i].whylen = 0;
            bool fits = old_fits(c, ninline, cl, ncl, &t[i], (int)i);
            free(t[i].why); /* the old version's own collisions: the new one's say it */
            t[i].why = why;
            t[i].whylen = whylen;
            t[i].claims = fits ? t[i].old : NULL;
            t[i].lost = !fits;
        }
    free(cl);
    return true;
}

/* Every *.json file of dir, one shop each, in name order: NAME.json is
 * the shop NAME (a file of another name is skipped). A bad file, or one
 * colliding with another shop (tenants_resolve), is skipped
 * (c->skipped), keeping its previous version from prev when there is one
 * that does not collide; only a missing folder or running out of memory
 * fails the load. */
static void load_shops_dir(struct config *c, const struct config *prev, struct cerr *e, const char *file,
                           const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        cfail(e, file, "shops_dir", "cannot open %s: %s", dir, strerror(errno));
        return;
    }
    char **names = NULL;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] == '.' || l < 6 || strcmp(de->d_name + l - 5, ".json") != 0)
            continue;
        char **nn = realloc(names, sizeof *nn * (n + 1));
        char *nm = nn ? strdup(de->d_name) : NULL;
        if (nm == NULL) {
            if (nn != NULL)
                names = nn;
            cfail_oom(e, file);
            break;
        }
        names = nn;
        names[n++] = nm;
    }
    closedir(d);
    if (n > 0)
        qsort(names, n, sizeof *names, cmp_str);
    struct tenant *t = e->oom ? NULL : calloc(n ? n : 1, sizeof *t);
    if (t == NULL)
        cfail_oom(e, file);
    size_t nt = 0;
    for (size_t i = 0; t != NULL && i < n && !e->oom; i++) {
        char path[PATH_MAX];
        int pn = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        char *dot = names[i] + strlen(names[i]) - 5;
        *dot = '\0'; /* NAME */
        if (!ids_valid_id(names[i]) || pn < 0 || (size_t)pn >= sizeof path) {
            *dot = '.';
            char why[400];
            snprintf(why, sizeof why, "%s/%s: not loaded: a shop file is named NAME.json, NAME (the shop's id) "
                     "being 1-%d characters of A-Z a-z 0-9 _ -", dir, names[i], STATE_ID_MAX);
            if (!add_skip(c, pn >= 0 && (size_t)pn < sizeof path ? path : names[i], why, NULL, false))
                cfail_oom(e, file);
            continue;
        }
        struct tenant *tt = &t[nt++];
        tt->path = strdup(path);
        if (tt->path == NULL) {
            cfail_oom(e, file);
            break;
        }
        char ebuf[SHOP_ERR_MAX];
        ebuf[0] = '\0';
        struct cerr fe = {ebuf, sizeof ebuf, 0, 0, false};
        json_t *o = read_shop_file(&fe, path);
        if (o != NULL)
            load_shop(c, &fe, path, "", o, &tt->shop, names[i]);
        json_decref(o);
        if (fe.oom) {
            cfail_oom(e, file);
            break;
        }
        tt->loaded = fe.count == 0;
        if (!tt->loaded) {
            tt->why = strdup(ebuf);
            tt->whylen = strlen(ebuf);
            if (tt->why == NULL) {
                cfail_oom(e, file);
                break;
            }
        }
        for (int j = 0; prev != NULL && j < prev->nshops && tt->old == NULL; j++)
            if (prev->shops[j].source != NULL && strcmp(prev->shops[j].id, names[i]) == 0)
                tt->old = &prev->shops[j];
        tt->claims = tt->loaded ? &tt->shop : tt->old;
    }
    if (t != NULL && !e->oom && !tenants_resolve(c, t, nt))
        cfail_oom(e, file);
    for (size_t i = 0; t != NULL && i < nt && !e->oom; i++) {
        struct tenant *tt = &t[i];
        if (tt->oom) {
            cfail_oom(e, file);
            break;
        }
        if (tt->claims == &tt->shop && !tt->lost) {
            struct shop *s = add_shop(c, e, file);
            if (s == NULL)
                break;
            *s = tt->shop;
            memset(&tt->shop, 0, sizeof tt->shop);
            s->source = tt->path;
            tt->path = NULL;
            continue;
        }
        bool kept = tt->claims != NULL && tt->claims == tt->old && !tt->lost;
        if (kept) {
            struct shop *s = add_shop(c, e, file);
            if (s == NULL)
                break;
            if (!shop_copy(c, s, tt->old)) {
                shop_clear(s);
                c->nshops--;
                cfail_oom(e, file);
                break;
            }
        }
        if (!add_skip(c, tt->path, tt->why ? tt->why : "", tt->collides, kept)) {
            cfail_oom(e, file);
            break;
        }
    }
    for (size_t i = 0; t != NULL && i < nt; i++) {
        shop_clear(&t[i].shop);
        free(t[i].path);
        free(t[i].why);
    }
    free(t);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

long config_held_cap(long nofile)
{
    if (nofile < 0 || nofile > 4 * CONFIG_MAX_HELD_MAX)
        return CONFIG_MAX_HELD_MAX;
    long cap = nofile - CONFIG_FD_RESERVE - nofile / 4;
    return cap < 1 ? 1 : cap > CONFIG_MAX_HELD_MAX ? CONFIG_MAX_HELD_MAX : cap;
}

/* An optional integer member in [lo, hi]; *out keeps its value when absent.
 * False (error recorded) when present and not such an integer. */
static bool opt_long(struct cerr *e, const char *file, json_t *root, const char *key, long lo, long hi, long *out,
                     bool *given)
{
    json_t *v = json_object_get(root, key);
    if (given)
        *given = v != NULL;
    if (v == NULL)
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        cfail(e, file, key, "must be an integer from %ld to %ld", lo, hi);
        return false;
    }
    *out = (long)json_integer_value(v);
    return true;
}

/* The top-level Redis keys into c->redis (the defaults without them).
 * The password is read like a key file (same mode rules), but never
 * confined to keys_dir: it is the operator's, named by the main
 * configuration. */
static void load_redis(struct config *c, struct cerr *e, const char *file, json_t *root)
{
    struct config_redis *r = &c->redis;
    char why[600];
    util_copy(r->prefix, sizeof r->prefix, "kembali:");
    r->hosts = 2;
    const char *url = opt_str(e, file, "", root, "redis");
    static const char *const needs_redis[] = {"redis_password_file", "redis_sentinel_password_file", "redis_prefix",
                                              "redis_hosts"};
    if (url == NULL) {
        if (json_object_get(root, "redis") == NULL || json_is_null(json_object_get(root, "redis")))
            for (size_t i = 0; i < ARRAY_LEN(needs_redis); i++) {
                json_t *v = json_object_get(root, needs_redis[i]);
                if (v != NULL && !json_is_null(v))
                    cfail(e, file, needs_redis[i], "is set but redis is not (give redis, or remove %s)",
                          needs_redis[i]);
            }
        return;
    }
    if (!parse_redis_url(url, r, why, sizeof why))
        cfail(e, file, "redis", "%s", why);
    r->on = true;

    static const char *const pw_keys[] = {"redis_password_file", "redis_sentinel_password_file"};
    for (size_t k = 0; k < ARRAY_LEN(pw_keys); k++) {
        const char *pf = opt_str(e, file, "", root, pw_keys[k]);
        if (pf == NULL)
            continue;
        if (k == 1 && !r->sentinel) {
            cfail(e, file, pw_keys[k], "is set but redis names no Sentinels (redis-sentinel://...): remove it");
            continue;
        }
        bool oom = false;
        char **pw = k == 0 ? &r->password : &r->sentinel_password;
        *pw = read_first_line(pf, NULL, CONFIG_REDIS_PASSWORD_MAX, "password", &oom, why, sizeof why);
        if (oom)
            cfail_oom(e, file);
        else if (*pw == NULL)
            cfail(e, file, pw_keys[k], "%s", why);
        else if (!check_password(*pw))
            cfail(e, file, pw_keys[k], "the password in %s must be 1-%d bytes without control characters", pf,
                  CONFIG_REDIS_PASSWORD_MAX);
    }
    const char *pre = opt_str(e, file, "", root, "redis_prefix");
    if (pre != NULL) {
        if (!check_redis_prefix(pre, why, sizeof why))
            cfail(e, file, "redis_prefix", "%s", why);
        else
            util_copy(r->prefix, sizeof r->prefix, pre);
    }
    long hosts = 2;
    if (opt_long(e, file, root, "redis_hosts", 1, CONFIG_REDIS_HOSTS_MAX, &hosts, NULL))
        r->hosts = (int)hosts;
}

struct config *config_load(const char *path, char *errbuf, size_t errlen)
{
    return config_reload(path, NULL, errbuf, errlen);
}

struct config *config_reload(const char *path, const struct config *prev, char *errbuf, size_t errlen)
{
    struct cerr e = {errbuf, errlen, 0, 0, false};
    errbuf[0] = '\0';
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        if (je.line < 1)
            cfail(&e, path, NULL, "%s", je.text);
        else
            cfail(&e, path, NULL, "line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        cfail(&e, path, NULL, "the configuration must be a JSON object");
        json_decref(root);
        return NULL;
    }
    struct config *c = calloc(1, sizeof *c);
    if (c == NULL) {
        cfail_oom(&e, path);
        json_decref(root);
        return NULL;
    }
    atomic_init(&c->refs, 1);
    c->path = cdup(&e, path, path);
    check_keys(&e, path, "", root, top_keys, ARRAY_LEN(top_keys));

    char why[300];
    const char *ab = opt_str(&e, path, "", root, "api_base");
    ab = ab ? ab : "https://pay.kasera.id";
    if (!check_api_base(ab, why, sizeof why))
        cfail(&e, path, "api_base", "%s", why);
    c->api_base = cdup(&e, path, ab);
    size_t abl = c->api_base ? strlen(c->api_base) : 0;
    while (abl > 0 && c->api_base[abl - 1] == '/')
        c->api_base[--abl] = '\0';

    const char *sd = opt_str(&e, path, "", root, "state_dir");
    c->state_dir = cdup(&e, path, sd ? sd : KEMBALI_STATE_DIR);
    const char *td = opt_str(&e, path, "", root, "templates_dir");
    c->templates_dir = cdup(&e, path, td ? td : KEMBALI_TEMPLATES_DIR);

    pace_default(&c->sched);
    json_t *sm = json_object_get(root, "schedule_ms");
    if (sm != NULL) {
        if (!json_is_array(sm) || json_array_size(sm) < 1 || json_array_size(sm) > PACE_MAX_STEPS) {
            cfail(&e, path, "schedule_ms", "must be a list of 1 to %d waits in milliseconds", PACE_MAX_STEPS);
        } else {
            size_t i;
            json_t *v;
            c->sched.n = (int)json_array_size(sm);
            json_array_foreach(sm, i, v) {
                if (!json_is_integer(v)) {
                    cfail(&e, path, "schedule_ms", "wait %zu is not a whole number of milliseconds", i + 1);
                    c->sched.wait_ms[i] = 0;
                } else {
                    c->sched.wait_ms[i] = json_integer_value(v);
                }
            }
            if (!pace_valid(&c->sched, why, sizeof why))
                cfail(&e, path, "schedule_ms", "%s", why);
        }
    }
    c->read_timeout_ms = 5000;
    opt_long(&e, path, root, "read_timeout_ms", 100, 30000, &c->read_timeout_ms, NULL);
    c->first_paint_ms = STREAM_FIRST_PAINT_MS_DEFAULT;
    opt_long(&e, path, root, "first_paint_ms", STREAM_FIRST_PAINT_MS_MIN, STREAM_FIRST_PAINT_MS_MAX,
             &c->first_paint_ms, NULL);
    long slots = 16384;
    opt_long(&e, path, root, "state_slots", 16, 4194304, &slots, NULL);
    c->state_slots = (int)slots;
    /* the most slots one key's requests may take; the default is the
     * state's (a quarter of the slots of the file it opens) */
    json_t *pk = json_object_get(root, "state_slots_per_key");
    if (pk != NULL && (!json_is_integer(pk) || json_integer_value(pk) < 1 || json_integer_value(pk) > slots))
        cfail(&e, path, "state_slots_per_key", "must be a whole number from 1 to state_slots (%ld): "
              "the most transaction slots one shop's key may take", slots);
    else if (pk != NULL)
        c->state_slots_per_key = (int)json_integer_value(pk);

    /* held requests: what the file asks (or the default), then no more
     * than the descriptors allow */
    long mh = CONFIG_MAX_HELD_DEFAULT, mhs = 0;
    bool mh_given = false, mhs_given = false;
    bool mh_ok = opt_long(&e, path, root, "max_held", 1, CONFIG_MAX_HELD_MAX, &mh, &mh_given);
    bool mhs_ok = opt_long(&e, path, root, "max_held_per_shop", 1, CONFIG_MAX_HELD_MAX, &mhs, &mhs_given);
    if (mh_ok && mhs_ok && mhs_given && mhs > mh)
        cfail(&e, path, "max_held_per_shop", "%ld is more than max_held (%ld)", mhs, mh);
    struct rlimit rl;
    long nofile = -1;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        nofile = rl.rlim_cur > (rlim_t)LONG_MAX ? -1 : (long)rl.rlim_cur;
    c->max_held_wanted = mh_given ? mh : 0;
    c->max_held = mh < config_held_cap(nofile) ? mh : config_held_cap(nofile);
    c->max_held_per_shop = mhs_given ? mhs : (c->max_held + 1) / 2;
    if (c->max_held_per_shop > c->max_held)
        c->max_held_per_shop = c->max_held;

    /* tenants' files */
    const char *kd = opt_str(&e, path, "", root, "keys_dir");
    if (kd != NULL)
        c->keys_dir = resolve_dir(&e, path, "keys_dir", kd);
    const char *str = opt_str(&e, path, "", root, "shop_templates_root");
    if (str != NULL)
        c->shop_templates_root = resolve_dir(&e, path, "shop_templates_root", str);
    const char *sdir = opt_str(&e, path, "", root, "shops_dir");
    if (sdir != NULL && kd == NULL)
        cfail(&e, path, "keys_dir", "is required with shops_dir: every shop file's secret_key_file must lie "
              "inside it, so that one tenant's file cannot name another tenant's key");
    c->read_planning = true;
    json_t *rp = json_object_get(root, "read_planning");
    if (rp != NULL) {
        if (!json_is_boolean(rp))
            cfail(&e, path, "read_planning", "must be true (plan a scarce budget) or false (first come, first served)");
        else
            c->read_planning = json_is_true(rp);
    }

    load_redis(c, &e, path, root);

    /* the default templates must load: shops fall back to them */
    if (e.count == 0)
        c->default_tpl = get_templates(c, &e, path, "templates_dir", c->templates_dir, "id", NULL);
    if (e.count == 0) {
        json_t *shops = json_object_get(root, "shops");
        if (shops != NULL && !json_is_array(shops))
            cfail(&e, path, "shops", "must be a list of shop objects");
        size_t i;
        json_t *so;
        json_array_foreach(shops, i, so) {
            char where[48];
            snprintf(where, sizeof where, "shops[%zu].", i);
            struct shop *s = add_shop(c, &e, path);
            if (s == NULL)
                break;
            load_shop(c, &e, path, where, so, s, NULL);
        }
        for (int a = 0; a < c->nshops; a++) {
            for (int b = a + 1; b < c->nshops; b++) {
                if (c->shops[a].id[0] && strcmp(c->shops[a].id, c->shops[b].id) == 0)
                    cfail(&e, path, "shops", "the id \"%s\" is used by two shops", c->shops[a].id);
                for (int x = 0; x < c->shops[a].nhosts; x++)
                    for (int y = 0; y < c->shops[b].nhosts; y++)
                        if (strcmp(c->shops[a].hosts[x], c->shops[b].hosts[y]) == 0)
                            cfail(&e, path, "shops", "the host \"%s\" is claimed by shops \"%s\" and \"%s\"",
                                  c->shops[a].hosts[x], c->shops[a].id, c->shops[b].id);
            }
        }
        c->has_shops_dir = sdir != NULL;
        if (sdir != NULL && e.count == 0)
            load_shops_dir(c, prev, &e, path, sdir);
        if (c->nshops == 0 && e.count == 0 && c->nskipped == 0)
            cfail(&e, path, "shops", "no shop is configured (give \"shops\" or \"shops_dir\")");
    }
    json_decref(root);
    if (e.count > 0 || e.oom) {
        config_unref(c);
        return NULL;
    }
    return c;
}

void config_bind_state(struct config *c, const struct state *st)
{
    for (int i = 0; i < c->nshops; i++)
        state_key_id(st, c->shops[i].secret, &c->shops[i].key);
}

struct config *config_ref(struct config *c)
{
    atomic_fetch_add(&c->refs, 1);
    return c;
}

void config_unref(struct config *c)
{
    if (c == NULL || atomic_fetch_sub(&c->refs, 1) != 1)
        return;
    for (int i = 0; i < c->nshops; i++)
        shop_clear(&c->shops[i]);
    free(c->shops);
    for (int i = 0; i < c->ntpls; i++)
        templates_free(c->tpls[i]);
    free(c->tpls);
    for (int i = 0; i < c->nkept_tpls; i++)
        templates_free(c->kept_tpls[i]);
    free(c->kept_tpls);
    for (int i = 0; i < c->nskipped; i++) {
        free(c->skipped[i].file);
        free(c->skipped[i].why);
        free(c->skipped[i].collides);
    }
    free(c->skipped);
    free(c->keys_dir);
    free(c->shop_templates_root);
    free(c->path);
    free(c->api_base);
    free(c->state_dir);
    free(c->templates_dir);
    char *pws[] = {c->redis.password, c->redis.sentinel_password};
    for (size_t i = 0; i < ARRAY_LEN(pws); i++)
        if (pws[i] != NULL) {
            explicit_bzero(pws[i], strlen(pws[i]));
            free(pws[i]);
        }
    free(c);
}

const struct shop *config_pick_shop(const struct config *c, const char *shop_param, const char *host)
{
    if (shop_param != NULL && *shop_param != '\0') {
        for (int i = 0; i < c->nshops; i++)
            if (strcmp(c->shops[i].id, shop_param) == 0)
                return &c->shops[i];
        return NULL; /* the web server named a shop we do not have: say so */
    }
    if (host != NULL && *host != '\0') {
        char h[256];
        size_t n;
        if (host[0] == '[') {
            const char *close = strchr(host, ']');
            n = close ? (size_t)(close - host) + 1 : strlen(host);
        } else {
            n = strcspn(host, ":");
        }
        if (n < sizeof h) {
            for (size_t i = 0; i < n; i++)
                h[i] = (char)tolower((unsigned char)host[i]);
            h[n] = '\0';
            while (n > 0 && h[n - 1] == '.')
                h[--n] = '\0'; /* "shop.example." names the same host */
            for (int i = 0; i < c->nshops; i++)
                for (int j = 0; j < c->shops[i].nhosts; j++)
                    if (strcmp(c->shops[i].hosts[j], h) == 0)
                        return &c->shops[i];
        }
    }
    return c->nshops == 1 && !c->has_shops_dir ? &c->shops[0] : NULL;
}
