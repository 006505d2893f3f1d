/* config_redis.c - the configuration's Redis: redis://, unix:// and
 * redis-sentinel:// addresses, the password files, the prefix. See
 * config.h and config_private.h. */
#include "config_private.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

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

void config_load_redis(struct config *c, struct cerr *e, const char *file, json_t *root)
{
    struct config_redis *r = &c->redis;
    char why[600];
    util_copy(r->prefix, sizeof r->prefix, config_keys[CK_REDIS_PREFIX].def_str);
    r->hosts = (int)config_keys[CK_REDIS_HOSTS].def;
    const char *url = config_opt_str(e, file, "", root, "redis");
    static const char *const needs_redis[] = {"redis_password_file", "redis_sentinel_password_file", "redis_prefix",
                                              "redis_hosts"};
    if (url == NULL) {
        if (json_object_get(root, "redis") == NULL || json_is_null(json_object_get(root, "redis")))
            for (size_t i = 0; i < ARRAY_LEN(needs_redis); i++) {
                json_t *v = json_object_get(root, needs_redis[i]);
                if (v != NULL && !json_is_null(v))
                    config_fail(e, file, needs_redis[i], "is set but redis is not (give redis, or remove %s)",
                          needs_redis[i]);
            }
        return;
    }
    if (!parse_redis_url(url, r, why, sizeof why))
        config_fail(e, file, "redis", "%s", why);
    r->on = true;

    static const char *const pw_keys[] = {"redis_password_file", "redis_sentinel_password_file"};
    for (size_t k = 0; k < ARRAY_LEN(pw_keys); k++) {
        const char *pf = config_opt_str(e, file, "", root, pw_keys[k]);
        if (pf == NULL)
            continue;
        if (k == 1 && !r->sentinel) {
            config_fail(e, file, pw_keys[k], "is set but redis names no Sentinels (redis-sentinel://...): remove it");
            continue;
        }
        bool oom = false;
        char **pw = k == 0 ? &r->password : &r->sentinel_password;
        *pw = config_read_secret(pf, NULL, CONFIG_REDIS_PASSWORD_MAX, "password", &oom, why, sizeof why);
        if (oom)
            config_fail_oom(e, file);
        else if (*pw == NULL)
            config_fail(e, file, pw_keys[k], "%s", why);
        else if (!check_password(*pw))
            config_fail(e, file, pw_keys[k], "the password in %s must be 1-%d bytes without control characters", pf,
                  CONFIG_REDIS_PASSWORD_MAX);
    }
    const char *pre = config_opt_str(e, file, "", root, "redis_prefix");
    if (pre != NULL) {
        if (!check_redis_prefix(pre, why, sizeof why))
            config_fail(e, file, "redis_prefix", "%s", why);
        else
            util_copy(r->prefix, sizeof r->prefix, pre);
    }
    const struct config_key *kh = &config_keys[CK_REDIS_HOSTS];
    long hosts = kh->def;
    if (config_opt_long(e, file, root, kh->name, kh->lo, kh->hi, &hosts, NULL))
        r->hosts = (int)hosts;
}
