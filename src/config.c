/* config.c - see config.h. */
#include "config.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "util.h"

#ifndef KEMBALI_TEMPLATES_DIR
#define KEMBALI_TEMPLATES_DIR "/usr/local/share/kembali/templates"
#endif
#ifndef KEMBALI_STATE_DIR
#define KEMBALI_STATE_DIR "/var/lib/kembali"
#endif

#define SECRET_MAX 256

/* Where errors go while loading: appended one per line. */
struct cerr {
    char *buf;
    size_t cap, len;
    int count;
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

static char *xstrdup(const char *s)
{
    char *d = strdup(s ? s : "");
    if (d == NULL) {
        fputs("kembali: out of memory\n", stderr);
        abort();
    }
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
 * address without port, or an IPv6 address in brackets. NULL if malformed. */
static char *normalize_host(const char *hv)
{
    if (hv == NULL || *hv == '\0' || strlen(hv) > 253)
        return NULL;
    char *lc = xstrdup(hv);
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

/* First line of a key file, trimmed; NULL with a reason on failure. */
static char *read_secret(const char *path, char *why, size_t whylen)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        snprintf(why, whylen, "cannot open %s: %s", path, strerror(errno));
        return NULL;
    }
    char line[SECRET_MAX + 64];
    char *got = fgets(line, sizeof line, f);
    bool whole = got != NULL && (strchr(line, '\n') != NULL || feof(f));
    fclose(f);
    if (got == NULL) {
        snprintf(why, whylen, "%s is empty", path);
        return NULL;
    }
    if (!whole) { /* never use a cut-off key */
        explicit_bzero(line, sizeof line);
        snprintf(why, whylen, "the first line of %s is longer than a key can be", path);
        return NULL;
    }
    size_t n = strcspn(line, "\r\n");
    line[n] = '\0';
    char *s = line;
    while (*s == ' ' || *s == '\t')
        s++;
    n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t'))
        s[--n] = '\0';
    char *out = xstrdup(s);
    explicit_bzero(line, sizeof line);
    return out;
}

static const char *const top_keys[] = {
    "api_base", "state_dir", "templates_dir", "shops", "shops_dir", "schedule_ms", "read_timeout_ms", "state_slots",
};
static const char *const shop_keys[] = {
    "id", "name", "hosts", "secret_key_file", "secret_key_env", "shop_url", "locale",
    "read_budget_per_minute", "cors_origins", "templates_dir", "id_param",
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

static const struct templates *get_templates(struct config *c, struct cerr *e, const char *file,
                                             const char *where, const char *dir, const char *locale)
{
    for (int i = 0; i < c->ntpls; i++)
        if (strcmp(c->tpls[i]->locale, locale) == 0 && strcmp(c->tpls[i]->dir, dir) == 0)
            return c->tpls[i];
    char why[600];
    struct templates *t = templates_load(dir, strcmp(dir, c->templates_dir) ? c->templates_dir : NULL,
                                         locale, why, sizeof why);
    if (t == NULL) {
        cfail(e, file, where, "%s", why);
        return NULL;
    }
    struct templates **arr = realloc(c->tpls, sizeof *arr * (size_t)(c->ntpls + 1));
    if (arr == NULL) {
        templates_free(t);
        return NULL;
    }
    c->tpls = arr;
    c->tpls[c->ntpls++] = t;
    return t;
}

static void load_shop(struct config *c, struct cerr *e, const char *file,
                      const char *where, json_t *o, struct shop *s)
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
    s->name = xstrdup(name ? name : s->id);

    json_t *hosts = json_object_get(o, "hosts");
    if (hosts != NULL && !json_is_array(hosts))
        cfail(e, file, P("hosts"), "must be a list of host names");
    else if (json_array_size(hosts) > CONFIG_MAX_HOSTS)
        cfail(e, file, P("hosts"), "at most %d hosts", CONFIG_MAX_HOSTS);
    else {
        size_t i;
        json_t *h;
        json_array_foreach(hosts, i, h) {
            char *lc = normalize_host(json_string_value(h));
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
    if ((kf == NULL) == (ke == NULL)) {
        cfail(e, file, P("secret_key_file"), "give exactly one of secret_key_file or secret_key_env");
    } else if (kf != NULL) {
        s->secret = read_secret(kf, why, sizeof why);
        if (s->secret == NULL)
            cfail(e, file, P("secret_key_file"), "%s", why);
    } else {
        const char *v = getenv(ke);
        if (v == NULL || *v == '\0')
            cfail(e, file, P("secret_key_env"), "environment variable %s is not set", ke);
        else
            s->secret = xstrdup(v);
    }
    if (s->secret != NULL && !check_secret(s->secret))
        cfail(e, file, P(kf ? "secret_key_file" : "secret_key_env"),
              "the key must be 1-%d printable characters without spaces", SECRET_MAX);

    const char *url = opt_str(e, file, where, o, "shop_url");
    if (url != NULL && !check_url(url))
        cfail(e, file, P("shop_url"), "must be an http:// or https:// URL");
    s->shop_url = xstrdup(url ? url : "/");

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
            s->origins[s->norigins++] = xstrdup(ov);
        }
    }

    const char *ip = opt_str(e, file, where, o, "id_param");
    if (ip != NULL && (strlen(ip) > 32 || !config_valid_id(ip)))
        cfail(e, file, P("id_param"), "must be 1-32 characters of A-Z a-z 0-9 _ -");
    util_copy(s->id_param, sizeof s->id_param, ip && strlen(ip) <= 32 && config_valid_id(ip) ? ip : "id");

    const char *td = opt_str(e, file, where, o, "templates_dir");
    s->tpl = get_templates(c, e, file, P("templates_dir"), td ? td : c->templates_dir, s->locale);
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
    free(s->shop_url);
    for (int i = 0; i < s->norigins; i++)
        free(s->origins[i]);
}

static struct shop *add_shop(struct config *c)
{
    struct shop *arr = realloc(c->shops, sizeof *arr * (size_t)(c->nshops + 1));
    if (arr == NULL) {
        fputs("kembali: out of memory\n", stderr);
        abort();
    }
    c->shops = arr;
    memset(&arr[c->nshops], 0, sizeof arr[0]);
    return &arr[c->nshops++];
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void load_shops_dir(struct config *c, struct cerr *e, const char *file, const char *dir)
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
        if (nn == NULL)
            break;
        names = nn;
        names[n++] = xstrdup(de->d_name);
    }
    closedir(d);
    if (n > 1) /* names is NULL when the folder holds no shop file */
        qsort(names, n, sizeof *names, cmp_str);
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        json_error_t je;
        json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
        if (o == NULL)
            cfail(e, path, NULL, "line %d: %s", je.line, je.text);
        else
            load_shop(c, e, path, "", o, add_shop(c));
        json_decref(o);
        free(names[i]);
    }
    free(names);
}

struct config *config_load(const char *path, char *errbuf, size_t errlen)
{
    struct cerr e = {errbuf, errlen, 0, 0};
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
        cfail(&e, path, NULL, "out of memory");
        json_decref(root);
        return NULL;
    }
    atomic_init(&c->refs, 1);
    c->path = xstrdup(path);
    check_keys(&e, path, "", root, top_keys, ARRAY_LEN(top_keys));

    char why[300];
    const char *ab = opt_str(&e, path, "", root, "api_base");
    ab = ab ? ab : "https://pay.kasera.id";
    if (!check_api_base(ab, why, sizeof why))
        cfail(&e, path, "api_base", "%s", why);
    c->api_base = xstrdup(ab);
    size_t abl = strlen(c->api_base);
    while (abl > 0 && c->api_base[abl - 1] == '/')
        c->api_base[--abl] = '\0';

    const char *sd = opt_str(&e, path, "", root, "state_dir");
    c->state_dir = xstrdup(sd ? sd : KEMBALI_STATE_DIR);
    const char *td = opt_str(&e, path, "", root, "templates_dir");
    c->templates_dir = xstrdup(td ? td : KEMBALI_TEMPLATES_DIR);

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
    json_t *rt = json_object_get(root, "read_timeout_ms");
    if (rt != NULL) {
        if (!json_is_integer(rt) || json_integer_value(rt) < 100 || json_integer_value(rt) > 30000)
            cfail(&e, path, "read_timeout_ms", "must be an integer from 100 to 30000");
        else
            c->read_timeout_ms = (long)json_integer_value(rt);
    }
    c->state_slots = 16384;
    json_t *ss = json_object_get(root, "state_slots");
    if (ss != NULL) {
        if (!json_is_integer(ss) || json_integer_value(ss) < 16 || json_integer_value(ss) > 4194304)
            cfail(&e, path, "state_slots", "must be an integer from 16 to 4194304");
        else
            c->state_slots = (int)json_integer_value(ss);
    }

    /* the default templates must load: shops fall back to them */
    if (e.count == 0)
        c->default_tpl = get_templates(c, &e, path, "templates_dir", c->templates_dir, "id");
    if (e.count == 0) {
        json_t *shops = json_object_get(root, "shops");
        if (shops != NULL && !json_is_array(shops))
            cfail(&e, path, "shops", "must be a list of shop objects");
        size_t i;
        json_t *so;
        json_array_foreach(shops, i, so) {
            char where[48];
            snprintf(where, sizeof where, "shops[%zu].", i);
            load_shop(c, &e, path, where, so, add_shop(c));
        }
        const char *sdir = opt_str(&e, path, "", root, "shops_dir");
        if (sdir != NULL)
            load_shops_dir(c, &e, path, sdir);
        if (c->nshops == 0 && e.count == 0)
            cfail(&e, path, "shops", "no shop is configured (give \"shops\" or \"shops_dir\")");
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
    }
    json_decref(root);
    if (e.count > 0) {
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
    free(c->path);
    free(c->api_base);
    free(c->state_dir);
    free(c->templates_dir);
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
