/* config_secret.c - the configuration's key and secret files: their mode
 * rules, keys_dir's confinement, tenants' files, and wiping. See
 * config_private.h. */
#include "config_private.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

/* the longest first line config_read_secret takes */
#define LINE_MAX_SECRET (SECRET_MAX > CONFIG_REDIS_PASSWORD_MAX ? SECRET_MAX : CONFIG_REDIS_PASSWORD_MAX)

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

char *config_read_secret(const char *path, const char *keys_dir, size_t max, const char *what, bool *oom,
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

bool config_tenant_file(const struct config *c, const char *name, const char *suffix, const char *given,
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
        if (!config_tenant_file(c, tenant, ".notify", nf, want, sizeof want, why, sizeof why)) {
            config_fail(e, file, key, "%s", why);
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
    s->notify_secret = config_read_secret(nf, c->keys_dir, SECRET_MAX, "notify secret", &oom, why, sizeof why);
    if (oom)
        config_fail_oom(e, file);
    else if (s->notify_secret == NULL)
        config_fail(e, file, key, "%s", why);
    else if (!check_secret(s->notify_secret))
        config_fail(e, file, key, "the notify secret must be 1-%d printable characters without spaces", SECRET_MAX);
}

/* The secrets of shop object o (at `where` in file) into s: its key
 * (secret_key_file or secret_key_env; a tenant's is keys_dir/NAME) and its
 * notify secret. Problems are recorded in e. */
void config_load_shop_secrets(struct config *c, struct cerr *e, const char *file, const char *where, json_t *o,
                              struct shop *s, const char *tenant)
{
    char why[600], path[160];
#define P(k) (snprintf(path, sizeof path, "%s%s", where, k), path)
    const char *kf = config_opt_str(e, file, where, o, "secret_key_file");
    const char *ke = config_opt_str(e, file, where, o, "secret_key_env");
    char tkf[PATH_MAX];
    if (tenant != NULL && ke != NULL) {
        config_fail(e, file, P("secret_key_env"), "is not allowed in a shop file in shops_dir (a tenant must not "
              "read kembali's environment): its key is the file keys_dir/%s", tenant);
    } else if (tenant != NULL && !config_tenant_file(c, tenant, "", kf, tkf, sizeof tkf, why, sizeof why)) {
        config_fail(e, file, P("secret_key_file"), "%s", why);
    } else if (tenant == NULL && (kf == NULL) == (ke == NULL)) {
        config_fail(e, file, P("secret_key_file"), "give exactly one of secret_key_file or secret_key_env");
    } else if (tenant != NULL || kf != NULL) {
        kf = tenant != NULL ? tkf : kf;
        bool oom = false;
        char real[PATH_MAX];
        s->secret = config_read_secret(kf, c->keys_dir, SECRET_MAX, "key", &oom, why, sizeof why);
        if (oom)
            config_fail_oom(e, file);
        else if (s->secret == NULL)
            config_fail(e, file, P("secret_key_file"), "%s", why);
        else if (realpath(kf, real) != NULL)
            s->key_file = config_dup(e, file, real);
    } else {
        const char *v = getenv(ke);
        if (v == NULL || *v == '\0')
            config_fail(e, file, P("secret_key_env"), "environment variable %s is not set", ke);
        else
            s->secret = config_dup(e, file, v);
    }
    if (s->secret != NULL && !check_secret(s->secret))
        config_fail(e, file, P(kf ? "secret_key_file" : "secret_key_env"),
              "the key must be 1-%d printable characters without spaces", SECRET_MAX);
    load_notify_secret(c, e, file, P("notify_secret_file"), config_opt_str(e, file, where, o, "notify_secret_file"), s,
                       tenant);
#undef P
}

void config_wipe(char *s)
{
    if (s == NULL)
        return;
    explicit_bzero(s, strlen(s));
    free(s);
}
