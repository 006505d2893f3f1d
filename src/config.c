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

bool config_valid_id(const char *id)
{
    size_t n = 0;
    if (id == NULL)
        return false;
    for (; id[n]; n++) {
        char c = id[n];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
        if (n >= STATE_ID_MAX)
            return false;
    }
    return n >= 1;
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
};
static const char *const shop_keys[] = {
    "id", "name", "hosts", "secret_key_file", "secret_key_env", "shop_url", "locale",
    "read_budget_per_minute", "cors_origins", "templates_dir", "id_param", "notify_secret_file",
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

/* A shop's notify secret (told by the shop, signed): the first line of nf
 * (`notify_secret_file`, may be NULL), read like a key file. For a tenant
 * (a file shops_dir/NAME.json) it is keys_dir/NAME.notify, used when that
 * file exists; nf, when given, must name exactly that file. No secret:
 * s->notify_secret stays NULL (telling is off for the shop). */
static void load_notify_secret(struct config *c, struct cerr *e, const char *file, const char *key,
                               const char *nf, struct shop *s, bool tenant)
{
    char want[PATH_MAX], why[600];
    if (tenant) {
        const char *base = strrchr(file, '/');
        base = base ? base + 1 : file;
        size_t bl = strlen(base);
        int n = snprintf(want, sizeof want, "%s/%.*s.notify", c->keys_dir ? c->keys_dir : "",
                         (int)(bl > 5 ? bl - 5 : bl), base); /* NAME.json: NAME */
        if (c->keys_dir == NULL || n < 0 || (size_t)n >= sizeof want)
            return;
        char real[PATH_MAX];
        if (nf != NULL && (realpath(nf, real) == NULL || strcmp(real, want) != 0)) {
            cfail(e, file, key, "must be %s (a tenant's notify secret is keys_dir/NAME.notify)", want);
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

/* Load one shop object into s. `tenant`: it comes from a file in shops_dir,
 * which a hosting control panel writes for one tenant: no secret_key_env,
 * and templates_dir only inside shop_templates_root. */
static void load_shop(struct config *c, struct cerr *e, const char *file,
                      const char *where, json_t *o, struct shop *s, bool tenant)
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
    if (id == NULL)
        cfail(e, file, P("id"), "is required (1-64 characters of A-Z a-z 0-9 _ -)");
    else if (!config_valid_id(id))
        cfail(e, file, P("id"), "\"%.80s\" must be 1-64 characters of A-Z a-z 0-9 _ -", id);
    else
        util_copy(s->id, sizeof s->id, id);

    const char *name = opt_str(e, file, where, o, "name");
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
    if (tenant && ke != NULL) {
        cfail(e, file, P("secret_key_env"), "is not allowed in a shop file in shops_dir (a tenant must not "
              "read kembali's environment): use secret_key_file inside keys_dir");
    } else if ((kf == NULL) == (ke == NULL)) {
        cfail(e, file, P("secret_key_file"), "give exactly one of secret_key_file or secret_key_env");
    } else if (kf != NULL) {
        bool oom = false;
        s->secret = read_first_line(kf, c->keys_dir, SECRET_MAX, "key", &oom, why, sizeof why);
        if (oom)
            cfail_oom(e, file);
        else if (s->secret == NULL)
            cfail(e, file, P("secret_key_file"), "%s", why);
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

    const char *ip = opt_str(e, file, where, o, "id_param");
    if (ip != NULL && (strlen(ip) > 32 || !config_valid_id(ip)))
        cfail(e, file, P("id_param"), "must be 1-32 characters of A-Z a-z 0-9 _ -");
    util_copy(s->id_param, sizeof s->id_param, ip && strlen(ip) <= 32 && config_valid_id(ip) ? ip : "id");

    const char *td = opt_str(e, file, where, o, "templates_dir");
    if (td != NULL && tenant) {
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

/* Does shop s (not yet in c->shops[0..n)) share its id or a host with one
 * of them? Writes the reason into why. */
static bool shop_collides(const struct config *c, int n, const struct shop *s, char *why, size_t whylen)
{
    for (int a = 0; a < n; a++) {
        const struct shop *o = &c->shops[a];
        if (s->id[0] && strcmp(o->id, s->id) == 0) {
            snprintf(why, whylen, "the id \"%s\" is already used by %s", s->id, o->source ? o->source : "the main configuration");
            return true;
        }
        for (int x = 0; x < o->nhosts; x++)
            for (int y = 0; y < s->nhosts; y++)
                if (strcmp(o->hosts[x], s->hosts[y]) == 0) {
                    snprintf(why, whylen, "the host \"%s\" is already claimed by shop \"%s\"", s->hosts[y], o->id);
                    return true;
                }
    }
    return false;
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
    dst->nhosts = dst->norigins = 0;
    dst->tpl = NULL;
    bool ok = (dst->name = strdup(src->name)) != NULL && (dst->shop_url = strdup(src->shop_url)) != NULL &&
              (dst->source = strdup(src->source)) != NULL && (dst->secret = strdup(src->secret)) != NULL &&
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

/* Record file as skipped, with the reasons in fe; kept: whether its
 * previous version serves. False when out of memory. */
static bool add_skip(struct config *c, const char *file, const struct cerr *fe, bool kept)
{
    struct config_skip *arr = realloc(c->skipped, sizeof *arr * ((size_t)c->nskipped + 1));
    if (arr == NULL)
        return false;
    c->skipped = arr;
    struct config_skip *k = &arr[c->nskipped];
    k->file = strdup(file);
    k->why = strdup(fe->buf);
    k->kept = kept;
    if (k->file == NULL || k->why == NULL) {
        free(k->file);
        free(k->why);
        return false;
    }
    size_t l = strlen(k->why);
    if (l > 0 && k->why[l - 1] == '\n')
        k->why[l - 1] = '\0';
    c->nskipped++;
    return true;
}

/* Every *.json file of dir, one shop each, in name order. A bad file is
 * skipped (c->skipped), keeping its previous version from prev when there
 * is one; only a missing folder or running out of memory fails the load. */
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
    for (size_t i = 0; i < n && !e->oom; i++) {
        char path[PATH_MAX];
        int pn = snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (pn < 0 || (size_t)pn >= sizeof path) {
            cfail(e, file, "shops_dir", "the path of %s is too long", names[i]);
            continue;
        }
        char ebuf[SHOP_ERR_MAX];
        ebuf[0] = '\0';
        struct cerr fe = {ebuf, sizeof ebuf, 0, 0, false};
        struct shop tmp;
        memset(&tmp, 0, sizeof tmp);
        json_t *o = read_shop_file(&fe, path);
        if (o != NULL)
            load_shop(c, &fe, path, "", o, &tmp, true);
        json_decref(o);
        char why[300];
        if (fe.count == 0 && shop_collides(c, c->nshops, &tmp, why, sizeof why))
            cfail(&fe, path, NULL, "%s", why);
        if (fe.oom) {
            shop_clear(&tmp);
            cfail_oom(e, file);
            break;
        }
        if (fe.count == 0) {
            struct shop *s = add_shop(c, e, file);
            tmp.source = s ? strdup(path) : NULL;
            if (s == NULL || tmp.source == NULL) {
                shop_clear(&tmp);
                cfail_oom(e, file);
                break;
            }
            *s = tmp;
            continue;
        }
        shop_clear(&tmp);
        /* skipped: its previous version, if it had one, keeps serving */
        const struct shop *old = NULL;
        for (int j = 0; prev != NULL && j < prev->nshops && old == NULL; j++)
            if (prev->shops[j].source != NULL && strcmp(prev->shops[j].source, path) == 0)
                old = &prev->shops[j];
        bool kept = false;
        if (old != NULL && !shop_collides(c, c->nshops, old, why, sizeof why)) {
            struct shop *s = add_shop(c, e, file);
            if (s == NULL)
                break;
            if (!shop_copy(c, s, old)) {
                shop_clear(s);
                c->nshops--;
                cfail_oom(e, file);
                break;
            }
            kept = true;
        }
        if (!add_skip(c, path, &fe, kept)) {
            cfail_oom(e, file);
            break;
        }
    }
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
            load_shop(c, &e, path, where, so, s, false);
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
    return c->nshops == 1 ? &c->shops[0] : NULL;
}
