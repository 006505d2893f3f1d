/* config.c - see config.h. */
#include "config.h"
#include "config_private.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "util.h"

void config_fail(struct cerr *e, const char *file, const char *key, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m >= (int)sizeof msg) /* never cut without a word */
        memcpy(msg + sizeof msg - 4, "...", 4);
    e->count++;
    if (e->len + 1 >= e->cap)
        return;
    int n = snprintf(e->buf + e->len, e->cap - e->len, "%s: %s%s%s\n", file, key ? key : "",
                     key ? ": " : "", msg);
    if (n > 0 && e->len + (size_t)n >= e->cap) { /* the buffer is full: say so at its end */
        e->len = e->cap - 1;
        if (e->cap >= 5)
            memcpy(e->buf + e->cap - 5, "...\n", 5);
    } else if (n > 0) {
        e->len += (size_t)n;
    }
}

/* Record that an allocation failed (once per load). */
void config_fail_oom(struct cerr *e, const char *file)
{
    if (!e->oom)
        config_fail(e, file, NULL, "out of memory");
    e->oom = true;
}

/* strdup, with a failure recorded in e (NULL is returned then). */
char *config_dup(struct cerr *e, const char *file, const char *s)
{
    char *d = strdup(s ? s : "");
    if (d == NULL)
        config_fail_oom(e, file);
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

void config_check_keys(struct cerr *e, const char *file, const char *where, json_t *obj, enum config_scope scope)
{
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        bool ok = false;
        for (size_t i = 0; i < CK_COUNT && !ok; i++)
            ok = config_keys[i].scope == scope && strcmp(k, config_keys[i].name) == 0;
        if (!ok) {
            char path[160];
            snprintf(path, sizeof path, "%s%.100s%s", where, k, strlen(k) > 100 ? "..." : "");
            config_fail(e, file, path, "unknown key (a typo must not silently change behaviour)");
        }
        (void)v;
    }
}

/* Optional string member; NULL when absent, error when not a string. */
const char *config_opt_str(struct cerr *e, const char *file, const char *where, json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL || json_is_null(v))
        return NULL;
    if (!json_is_string(v) || json_string_length(v) == 0 || strlen(json_string_value(v)) != json_string_length(v)) {
        char path[160];
        snprintf(path, sizeof path, "%s%s", where, key);
        config_fail(e, file, path, "must be a non-empty string");
        return NULL;
    }
    return json_string_value(v);
}

/* The templates of (dir, locale), loaded once per configuration. NULL with
 * an error recorded in e (out of memory included). */
const struct templates *config_templates(struct config *c, struct cerr *e, const char *file,
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
        config_fail(e, file, where, "%s", why);
        return NULL;
    }
    struct templates **arr = realloc(c->tpls, sizeof *arr * ((size_t)c->ntpls + 1));
    if (arr == NULL) {
        templates_free(t);
        config_fail_oom(e, file);
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
        config_fail(e, file, key, "%s: %s", dir, strerror(errno));
        return NULL;
    }
    if (stat(real, &st) != 0 || !S_ISDIR(st.st_mode)) {
        config_fail(e, file, key, "%s is not a folder", dir);
        return NULL;
    }
    return config_dup(e, file, real);
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
bool config_opt_long(struct cerr *e, const char *file, json_t *root, const char *key, long lo, long hi, long *out,
                     bool *given)
{
    json_t *v = json_object_get(root, key);
    if (given)
        *given = v != NULL;
    if (v == NULL)
        return true;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
        config_fail(e, file, key, "must be an integer from %ld to %ld", lo, hi);
        return false;
    }
    *out = (long)json_integer_value(v);
    return true;
}

struct config *config_load(const char *path, char *errbuf, size_t errlen)
{
    return config_reload(path, NULL, errbuf, errlen);
}

/* The JSON object at path; NULL with the reason in e. */
static json_t *read_root(struct cerr *e, const char *path)
{
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (root == NULL) {
        if (je.line < 1)
            config_fail(e, path, NULL, "%s", je.text);
        else
            config_fail(e, path, NULL, "line %d column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(root)) {
        config_fail(e, path, NULL, "the configuration must be a JSON object");
        json_decref(root);
        return NULL;
    }
    return root;
}

/* A top-level string key: its value, else its default in config_keys;
 * copied into *out (a failure recorded in e). */
static const char *top_str(struct config *c, struct cerr *e, json_t *root, enum config_key_id k, char **out)
{
    const char *v = config_opt_str(e, c->path, "", root, config_keys[k].name);
    *out = config_dup(e, c->path, v ? v : config_keys[k].def_str);
    return *out;
}

/* api_base, state_dir and templates_dir. */
static void load_places(struct config *c, struct cerr *e, json_t *root)
{
    char why[300];
    if (top_str(c, e, root, CK_API_BASE, &c->api_base) != NULL) {
        if (!check_api_base(c->api_base, why, sizeof why))
            config_fail(e, c->path, "api_base", "%s", why);
        size_t abl = strlen(c->api_base);
        while (abl > 0 && c->api_base[abl - 1] == '/')
            c->api_base[--abl] = '\0';
    }
    top_str(c, e, root, CK_STATE_DIR, &c->state_dir);
    top_str(c, e, root, CK_TEMPLATES_DIR, &c->templates_dir);
}

/* schedule_ms into c->sched (pace's default without it). */
static void load_schedule(struct config *c, struct cerr *e, json_t *root)
{
    char why[300];
    const char *path = c->path;
    pace_default(&c->sched);
    json_t *sm = json_object_get(root, "schedule_ms");
    if (sm == NULL)
        return;
    if (!json_is_array(sm) || json_array_size(sm) < 1 || json_array_size(sm) > PACE_MAX_STEPS) {
        config_fail(e, path, "schedule_ms", "must be a list of 1 to %d waits in milliseconds", PACE_MAX_STEPS);
        return;
    }
    size_t i;
    json_t *v;
    c->sched.n = (int)json_array_size(sm);
    json_array_foreach(sm, i, v) {
        if (!json_is_integer(v)) {
            config_fail(e, path, "schedule_ms", "wait %zu is not a whole number of milliseconds", i + 1);
            c->sched.wait_ms[i] = 0;
        } else {
            c->sched.wait_ms[i] = json_integer_value(v);
        }
    }
    if (!pace_valid(&c->sched, why, sizeof why))
        config_fail(e, path, "schedule_ms", "%s", why);
}

/* The plain integers the table fills (config_keys[].at), in its order:
 * each its default, then the file's value when in range. */
static void load_plain_ints(struct config *c, struct cerr *e, json_t *root)
{
    for (size_t i = 0; i < CK_COUNT; i++) {
        const struct config_key *k = &config_keys[i];
        if (k->at == 0)
            continue;
        long v = k->def;
        config_opt_long(e, c->path, root, k->name, k->lo, k->hi, &v, NULL);
        if (k->size == sizeof(int))
            *(int *)(void *)((char *)c + k->at) = (int)v;
        else
            *(long *)(void *)((char *)c + k->at) = v;
    }
}

/* state_slots_per_key, max_held and max_held_per_shop (after the plain
 * integers: state_slots bounds the first). */
static void load_limits(struct config *c, struct cerr *e, json_t *root)
{
    const char *path = c->path;
    long slots = c->state_slots;
    /* the most slots one key's requests may take; the default is the
     * state's (a quarter of the slots of the file it opens) */
    json_t *pk = json_object_get(root, "state_slots_per_key");
    if (pk != NULL && (!json_is_integer(pk) || json_integer_value(pk) < config_keys[CK_STATE_SLOTS_PER_KEY].lo ||
                       json_integer_value(pk) > slots))
        config_fail(e, path, "state_slots_per_key", "must be a whole number from 1 to state_slots (%ld): "
                    "the most transaction slots one shop's key may take", slots);
    else if (pk != NULL)
        c->state_slots_per_key = (int)json_integer_value(pk);

    /* held requests: what the file asks (or the default), then no more
     * than the descriptors allow */
    const struct config_key *kh = &config_keys[CK_MAX_HELD], *ks = &config_keys[CK_MAX_HELD_PER_SHOP];
    long mh = kh->def, mhs = 0;
    bool mh_given = false, mhs_given = false;
    bool mh_ok = config_opt_long(e, path, root, kh->name, kh->lo, kh->hi, &mh, &mh_given);
    bool mhs_ok = config_opt_long(e, path, root, ks->name, ks->lo, ks->hi, &mhs, &mhs_given);
    if (mh_ok && mhs_ok && mhs_given && mhs > mh)
        config_fail(e, path, "max_held_per_shop", "%ld is more than max_held (%ld)", mhs, mh);
    struct rlimit rl;
    long nofile = -1;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        nofile = rl.rlim_cur > (rlim_t)LONG_MAX ? -1 : (long)rl.rlim_cur;
    c->max_held_wanted = mh_given ? mh : 0;
    c->max_held = mh < config_held_cap(nofile) ? mh : config_held_cap(nofile);
    c->max_held_per_shop = mhs_given ? mhs : (c->max_held + 1) / 2;
    if (c->max_held_per_shop > c->max_held)
        c->max_held_per_shop = c->max_held;
}

/* keys_dir and shop_templates_root (resolved), and shops_dir's need of
 * keys_dir; shops_dir's value into *sdir (NULL: none). */
static void load_tenancy(struct config *c, struct cerr *e, json_t *root, const char **sdir)
{
    const char *path = c->path;
    const char *kd = config_opt_str(e, path, "", root, "keys_dir");
    if (kd != NULL)
        c->keys_dir = resolve_dir(e, path, "keys_dir", kd);
    const char *str = config_opt_str(e, path, "", root, "shop_templates_root");
    if (str != NULL)
        c->shop_templates_root = resolve_dir(e, path, "shop_templates_root", str);
    *sdir = config_opt_str(e, path, "", root, "shops_dir");
    if (*sdir != NULL && kd == NULL)
        config_fail(e, path, "keys_dir", "is required with shops_dir: every shop file's secret_key_file must lie "
                    "inside it, so that one tenant's file cannot name another tenant's key");
}

/* read_planning (its default in config_keys). */
static void load_planning(struct config *c, struct cerr *e, json_t *root)
{
    c->read_planning = config_keys[CK_READ_PLANNING].def != 0;
    json_t *rp = json_object_get(root, "read_planning");
    if (rp == NULL)
        return;
    if (!json_is_boolean(rp))
        config_fail(e, c->path, "read_planning", "must be true (plan a scarce budget) or false (first come, first "
                    "served)");
    else
        c->read_planning = json_is_true(rp);
}

struct config *config_reload(const char *path, const struct config *prev, char *errbuf, size_t errlen)
{
    return config_reload_hosts(path, prev, CONFIG_HOSTS_NONE, errbuf, errlen);
}

/* The host registry of c->state_dir into c->held_read, locked first for
 * CONFIG_HOSTS_KEEP (*lockfd, else -1). Problems recorded in e. */
static void registry_read(struct config *c, struct cerr *e, enum config_hosts hosts, int *lockfd)
{
    char why[600];
    *lockfd = -1;
    if (hosts == CONFIG_HOSTS_KEEP && (*lockfd = hostreg_lock(c->state_dir, why, sizeof why)) < 0) {
        config_fail(e, c->path, "state_dir", "the host registry: %s", why);
        return;
    }
    if (hostreg_load(c->state_dir, &c->held_read, why, sizeof why) != 0)
        config_fail(e, c->path, "state_dir", "the host registry: %s", why);
    else
        c->held_known = true;
}

struct config *config_reload_hosts(const char *path, const struct config *prev, enum config_hosts hosts,
                                   char *errbuf, size_t errlen)
{
    struct cerr e = {errbuf, errlen, 0, 0, false};
    errbuf[0] = '\0';
    json_t *root = read_root(&e, path);
    if (root == NULL)
        return NULL;
    struct config *c = calloc(1, sizeof *c);
    if (c == NULL || (c->path = strdup(path)) == NULL) {
        free(c);
        config_fail_oom(&e, path);
        json_decref(root);
        return NULL;
    }
    atomic_init(&c->refs, 1);
    config_check_keys(&e, path, "", root, CONFIG_TOP);
    load_places(c, &e, root);
    load_schedule(c, &e, root);
    load_plain_ints(c, &e, root);
    load_limits(c, &e, root);
    const char *sdir;
    load_tenancy(c, &e, root, &sdir);
    load_planning(c, &e, root);
    config_load_redis(c, &e, path, root);

    /* the default templates must load: shops fall back to them */
    if (e.count == 0)
        c->default_tpl = config_templates(c, &e, path, "templates_dir", c->templates_dir, "id", NULL);
    int lockfd = -1;
    if (e.count == 0 && sdir != NULL && hosts != CONFIG_HOSTS_NONE)
        registry_read(c, &e, hosts, &lockfd);
    if (e.count == 0)
        config_load_shops(c, prev, &e, path, root, sdir);
    json_decref(root);
    char why[600];
    if (e.count == 0 && !e.oom && lockfd >= 0 && !hostreg_equal(&c->held, &c->held_read) &&
        hostreg_save(c->state_dir, &c->held, why, sizeof why) != 0)
        config_fail(&e, path, "state_dir", "the host registry: %s", why);
    hostreg_unlock(lockfd);
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
        config_shop_clear(&c->shops[i]);
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
    hostreg_free(&c->held_read);
    hostreg_free(&c->held);
    hostreg_free(&c->contested);
    free(c->keys_dir);
    free(c->shop_templates_root);
    free(c->path);
    free(c->api_base);
    free(c->state_dir);
    free(c->templates_dir);
    config_wipe(c->redis.password);
    config_wipe(c->redis.sentinel_password);
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

