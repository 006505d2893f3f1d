/* config_shops.c - the configuration's shops: the `shops` list, the shop
 * files of shops_dir (tenants) and who owns which host. See config.h and
 * config_private.h. */
#include "config_private.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "hostreg.h"
#include "ids.h"
#include "util.h"

#define SHOP_FILE_MAX (64 * 1024) /* bytes of one file in shops_dir */
#define SHOP_ERR_MAX 2048         /* bytes of the reasons kept for one skipped file */

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
        ok = n > 0 && strpbrk(lc, ":/[]@") == NULL;
        /* printable ASCII only (an international name in its punycode
         * form): the host registry keeps hosts one word a line */
        for (const unsigned char *c = (const unsigned char *)lc; ok && *c; c++)
            ok = *c > 0x20 && *c < 0x7f;
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
            config_fail(e, file, key, "the %s%s page would be %zu KiB with this shop's name and shop_url: at most %d KiB "
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
    if (!json_is_object(o)) {
        config_fail(e, file, where[0] ? where : NULL, "a shop must be a JSON object");
        return;
    }
    config_check_keys(e, file, where, o, CONFIG_SHOP);
    char path[160];
#define P(k) (snprintf(path, sizeof path, "%s%s", where, k), path)

    const char *id = config_opt_str(e, file, where, o, "id");
    if (tenant != NULL && id != NULL && strcmp(id, tenant) != 0)
        config_fail(e, file, P("id"), "\"%.80s\" is not the file's name: the file %s.json describes the shop \"%s\" "
              "(give that id, or leave id out)", id, tenant, tenant);
    else if (tenant != NULL)
        util_copy(s->id, sizeof s->id, tenant);
    else if (id == NULL)
        config_fail(e, file, P("id"), "is required (1-64 characters of A-Z a-z 0-9 _ -)");
    else if (!ids_valid_id(id))
        config_fail(e, file, P("id"), "\"%.80s\" must be 1-64 characters of A-Z a-z 0-9 _ -", id);
    else
        util_copy(s->id, sizeof s->id, id);

    const char *name = config_opt_str(e, file, where, o, "name");
    if (name != NULL && utf8_chars(name) > CONFIG_NAME_MAX)
        config_fail(e, file, P("name"), "is %zu characters long: at most %d", utf8_chars(name), CONFIG_NAME_MAX);
    s->name = config_dup(e, file, name ? name : s->id);

    json_t *hosts = json_object_get(o, "hosts");
    if (hosts != NULL && !json_is_array(hosts))
        config_fail(e, file, P("hosts"), "must be a list of host names");
    else if (json_array_size(hosts) > CONFIG_MAX_HOSTS)
        config_fail(e, file, P("hosts"), "at most %d hosts", CONFIG_MAX_HOSTS);
    else {
        size_t i;
        json_t *h;
        json_array_foreach(hosts, i, h) {
            bool oom = false;
            char *lc = normalize_host(json_string_value(h), &oom);
            if (oom) {
                config_fail_oom(e, file);
                continue;
            }
            if (lc == NULL) {
                config_fail(e, file, P("hosts"), "entry %zu must be a host name without port or scheme "
                      "(an IPv6 address in brackets: [2001:db8::1])", i + 1);
                continue;
            }
            s->hosts[s->nhosts++] = lc;
        }
    }

    config_load_shop_secrets(c, e, file, where, o, s, tenant);

    const char *url = config_opt_str(e, file, where, o, "shop_url");
    if (url != NULL && !check_url(url))
        config_fail(e, file, P("shop_url"), "must be an http:// or https:// URL");
    s->shop_url = config_dup(e, file, url ? url : config_keys[CK_SHOP_SHOP_URL].def_str);

    const char *loc = config_opt_str(e, file, where, o, "locale");
    if (loc != NULL && strcmp(loc, "id") != 0 && strcmp(loc, "en") != 0)
        config_fail(e, file, P("locale"), "must be \"id\" or \"en\"");
    util_copy(s->locale, sizeof s->locale, loc && strcmp(loc, "en") == 0 ? "en" : config_keys[CK_SHOP_LOCALE].def_str);

    const struct config_key *kb = &config_keys[CK_SHOP_READ_BUDGET];
    s->read_budget = (int)kb->def;
    json_t *b = json_object_get(o, kb->name);
    if (b != NULL) {
        if (!json_is_integer(b) || json_integer_value(b) < kb->lo || json_integer_value(b) > kb->hi)
            config_fail(e, file, P(kb->name), "must be an integer from %ld to %ld (Kasera allows %d per key)", kb->lo,
                        kb->hi, STATE_BUDGET_MAX);
        else
            s->read_budget = (int)json_integer_value(b);
    }

    json_t *ori = json_object_get(o, "cors_origins");
    if (ori != NULL && (!json_is_array(ori) || json_array_size(ori) > CONFIG_MAX_ORIGINS))
        config_fail(e, file, P("cors_origins"), "must be a list of at most %d origins", CONFIG_MAX_ORIGINS);
    else {
        size_t i;
        json_t *v;
        json_array_foreach(ori, i, v) {
            const char *ov = json_string_value(v);
            if (ov == NULL || !check_url(ov) || strchr(strchr(ov, ':') + 3, '/') != NULL) {
                config_fail(e, file, P("cors_origins"), "entry %zu must be an origin like https://shop.example", i + 1);
                continue;
            }
            char *d = config_dup(e, file, ov);
            if (d != NULL)
                s->origins[s->norigins++] = d;
        }
    }

    s->progressive = config_keys[CK_SHOP_PROGRESSIVE].def != 0;
    json_t *pg = json_object_get(o, "progressive");
    if (pg != NULL && !json_is_boolean(pg))
        config_fail(e, file, P("progressive"), "must be true (a browser sees a waiting page at once) or false (one answer)");
    else if (pg != NULL)
        s->progressive = json_is_true(pg);

    const char *ip = config_opt_str(e, file, where, o, "id_param");
    if (ip != NULL && (strlen(ip) > 32 || !ids_valid_id(ip)))
        config_fail(e, file, P("id_param"), "must be 1-32 characters of A-Z a-z 0-9 _ -");
    util_copy(s->id_param, sizeof s->id_param, ip && strlen(ip) <= 32 && ids_valid_id(ip) ? ip : config_keys[CK_SHOP_ID_PARAM].def_str);

    const char *td = config_opt_str(e, file, where, o, "templates_dir");
    if (td != NULL && tenant != NULL) {
        char real[PATH_MAX];
        if (c->shop_templates_root == NULL)
            config_fail(e, file, P("templates_dir"), "a shop file in shops_dir may set templates_dir only when the "
                  "main configuration sets shop_templates_root");
        else if (realpath(td, real) == NULL)
            config_fail(e, file, P("templates_dir"), "%s: %s", td, strerror(errno));
        else if (!util_path_inside(real, c->shop_templates_root) || strcmp(real, c->shop_templates_root) == 0)
            config_fail(e, file, P("templates_dir"), "%s resolves to %s, outside shop_templates_root %s", td, real,
                  c->shop_templates_root);
        else if (!e->oom)
            s->tpl = config_templates(c, e, file, P("templates_dir"), real, s->locale, c->shop_templates_root);
    } else if (!e->oom) {
        s->tpl = config_templates(c, e, file, P("templates_dir"), td ? td : c->templates_dir, s->locale, NULL);
    }
    if (s->tpl != NULL && s->name != NULL && s->shop_url != NULL)
        check_page_sizes(e, file, P("templates_dir"), s);
#undef P
}

void config_shop_clear(struct shop *s)
{
    free(s->name);
    for (int i = 0; i < s->nhosts; i++)
        free(s->hosts[i]);
    config_wipe(s->secret);
    config_wipe(s->notify_secret);
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
        config_fail_oom(e, file);
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
        config_fail(e, path, NULL, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        config_fail(e, path, NULL, "not a regular file");
        close(fd);
        return NULL;
    }
    char *buf = malloc(SHOP_FILE_MAX + 1);
    if (buf == NULL) {
        config_fail_oom(e, path);
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
        config_fail(e, path, NULL, "cannot read: %s", strerror(rerr));
    } else if (n > SHOP_FILE_MAX) {
        config_fail(e, path, NULL, "larger than %d KiB", SHOP_FILE_MAX / 1024);
    } else {
        json_error_t je;
        o = json_loadb(buf, n, JSON_REJECT_DUPLICATES, &je);
        if (o == NULL)
            config_fail(e, path, NULL, "line %d: %s", je.line, je.text);
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
    char name[STATE_ID_MAX + 1];   /* NAME of shops_dir/NAME.json */
    char *path;                    /* shops_dir/NAME.json */
    struct shop shop;              /* its new version (when broken: what could be read, its hosts included) */
    bool loaded;                   /* shop loaded without a problem */
    const struct shop *old;        /* its version in prev, or NULL */
    const struct shop *serves;     /* out: &shop, old (kept) or NULL (skipped) */
    bool refused;                  /* its new version takes another shop's id, key or notify secret */
    bool old_refused;              /* its old version's notify secret is now another shop's */
    char *why;                     /* its problems, "file: key: reason" lines; NULL: none */
    size_t whylen;
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
    int m = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (m >= (int)sizeof msg) /* never cut without a word */
        memcpy(msg + sizeof msg - 4, "...", 4);
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

/* Does tenant shop s take the id or the key file of one of the main
 * configuration's shops c->shops[0..ninline)? Noted in t when `note`. */
static bool tenant_takes_inline(const struct config *c, int ninline, struct tenant *t, const struct shop *s,
                                bool note)
{
    for (int j = 0; j < ninline; j++) {
        const struct shop *o = &c->shops[j];
        if (!note && (strcmp(o->id, s->id) == 0 || (o->key_file != NULL && s->key_file != NULL &&
                                                    strcmp(o->key_file, s->key_file) == 0)))
            return true;
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

/* Do shops a and b have one notify secret and different keys (docs/tenants.md:
 * a notify signed for one shop must never be accepted by another)? */
static bool notify_shared(const struct shop *a, const struct shop *b)
{
    return a->notify_secret != NULL && b->notify_secret != NULL && strcmp(a->notify_secret, b->notify_secret) == 0 &&
           a->secret != NULL && b->secret != NULL && strcmp(a->secret, b->secret) != 0;
}

/* The first of acc[0..n) that shares s's notify secret with another key, or NULL. */
static const struct shop *notify_taken(const struct shop *const *acc, size_t n, const struct shop *s)
{
    for (size_t i = 0; i < n; i++)
        if (notify_shared(acc[i], s))
            return acc[i];
    return NULL;
}

/* Which version of each tenant may keep its notify secret: the main
 * configuration's shops first, then the tenants that served before (in
 * name order), then the new ones; a version whose secret an earlier shop
 * with another key has is refused (t->refused for a new version, noted
 * naming that shop; t->old_refused for a previous one). False when out of
 * memory. */
static bool tenants_notify(const struct config *c, int ninline, struct tenant *t, size_t nt)
{
    const struct shop **acc = malloc(sizeof *acc * ((size_t)ninline + nt + 1));
    if (acc == NULL)
        return false;
    size_t n = 0;
    for (int j = 0; j < ninline; j++)
        acc[n++] = &c->shops[j];
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < nt; i++) {
            struct tenant *tt = &t[i];
            if ((tt->old != NULL) != (pass == 0))
                continue;
            if (tt->loaded && !tt->refused) {
                const struct shop *o = notify_taken(acc, n, &tt->shop);
                if (o == NULL) {
                    acc[n++] = &tt->shop;
                    continue;
                }
                tt->refused = true;
                tenant_note(tt, o->id, "notify_secret_file: the notify secret is the one of shop \"%s\"%s%s%s, whose "
                            "key is another: a notify signed for one shop must never be accepted by another (give "
                            "each shop its own)", o->id, o->source ? " (" : "", o->source ? o->source : "",
                            o->source ? ")" : "");
            }
            if (tt->old != NULL) {
                if (notify_taken(acc, n, tt->old) != NULL)
                    tt->old_refused = true;
                else
                    acc[n++] = tt->old;
            }
        }
    free(acc);
    return true;
}

/* The shop of the main configuration listing host (c->shops[0..ninline)). */
static const char *inline_with_host(const struct config *c, int ninline, const char *host)
{
    for (int j = 0; j < ninline; j++)
        for (int h = 0; h < c->shops[j].nhosts; h++)
            if (strcmp(c->shops[j].hosts[h], host) == 0)
                return c->shops[j].id;
    return "?";
}

/* Note in t one host it lists and does not hold. */
static void note_clash(const struct config *c, int ninline, struct tenant *t, const struct hostreg_clash *k)
{
    struct tenant *me = &t[k->file];
    if (k->kind == HOSTREG_MAIN) {
        const char *id = inline_with_host(c, ninline, k->host);
        tenant_note(me, id, "hosts: the host \"%s\" is served by shop \"%s\" of the main configuration", k->host, id);
    } else if (k->kind == HOSTREG_HELD) {
        const struct tenant *o = &t[k->other];
        tenant_note(me, o->name, "hosts: the host \"%s\" is held by shop \"%s\" (%s): a host belongs to the shop "
                    "that held it first, until that file is removed or stops listing it", k->host, o->name, o->path);
    } else {
        const struct tenant *o = &t[k->other];
        tenant_note(me, o->name, "hosts: the host \"%s\" is also claimed by shop \"%s\" (%s), and nobody held it: "
                    "no shop serves it until one of the files gives it up", k->host, o->name, o->path);
    }
}

/* The registry to decide from: c->held_read, and for each host it does
 * not name, the tenant of prev that served it (a registry lost, or not
 * read, never hands a served host to a newcomer). False when out of
 * memory. */
static bool held_before(const struct config *c, const struct config *prev, struct hostreg *held)
{
    for (size_t i = 0; i < c->held_read.n; i++)
        if (hostreg_put(held, c->held_read.e[i].host, c->held_read.e[i].shop) != 0)
            return false;
    for (int j = 0; prev != NULL && j < prev->nshops; j++)
        for (int h = 0; prev->shops[j].source != NULL && h < prev->shops[j].nhosts; h++)
            if (hostreg_holder(held, prev->shops[j].hosts[h]) == NULL &&
                hostreg_put(held, prev->shops[j].hosts[h], prev->shops[j].id) != 0)
                return false;
    return true;
}

/* Can tenant t's previous version serve again (its new one does not)?
 * When it is not refused and holds every host it lists. */
static bool old_fits(const struct config *c, int ninline, struct tenant *t)
{
    if (t->old_refused || tenant_takes_inline(c, ninline, t, t->old, false))
        return false;
    for (int h = 0; h < t->old->nhosts; h++) {
        const char *who = hostreg_holder(&c->held, t->old->hosts[h]);
        if (who == NULL || strcmp(who, t->name) != 0)
            return false;
    }
    return true;
}

/* Decide which tenants serve and who holds which host (docs/tenants.md;
 * the rules in hostreg_decide) into c->held and c->contested,
 * each t->serves, and the notes of the files that collided (why,
 * collides). False when out of memory. */
static bool tenants_resolve(struct config *c, const struct config *prev, struct tenant *t, size_t nt)
{
    int ninline = c->nshops;
    size_t nmain = 0, nclaims = 0;
    for (int j = 0; j < ninline; j++)
        nmain += (size_t)c->shops[j].nhosts;
    for (size_t i = 0; i < nt; i++)
        nclaims += (size_t)t[i].shop.nhosts;
    const char **main = malloc(sizeof *main * (nmain ? nmain : 1));
    struct hostreg_file *f = calloc(nt ? nt : 1, sizeof *f);
    struct hostreg_clash *cl = malloc(sizeof *cl * (nclaims ? nclaims : 1));
    struct hostreg held = {NULL, 0};
    for (size_t i = 0; i < nt; i++)
        if (t[i].loaded && tenant_takes_inline(c, ninline, &t[i], &t[i].shop, true))
            t[i].refused = true;
    bool ok = main != NULL && f != NULL && cl != NULL && held_before(c, prev, &held) && tenants_notify(c, ninline, t, nt);
    size_t m = 0, ncl = 0;
    for (int j = 0; ok && j < ninline; j++)
        for (int h = 0; h < c->shops[j].nhosts; h++)
            main[m++] = c->shops[j].hosts[h];
    for (size_t i = 0; ok && i < nt; i++)
        f[i] = (struct hostreg_file){t[i].name, (const char *const *)t[i].shop.hosts, t[i].shop.nhosts,
                                     t[i].loaded, t[i].refused, false};
    ok = ok && hostreg_decide(&held, main, nmain, f, nt, &c->held, cl, &ncl) == 0;
    for (size_t k = 0; ok && k < ncl; k++) {
        note_clash(c, ninline, t, &cl[k]);
        if (cl[k].kind == HOSTREG_BOTH && hostreg_holder(&c->contested, cl[k].host) == NULL) {
            char both[2 * STATE_ID_MAX + 8];
            snprintf(both, sizeof both, "%s and %s", t[cl[k].file].name, t[cl[k].other].name);
            ok = hostreg_put(&c->contested, cl[k].host, both) == 0;
        }
    }
    for (size_t i = 0; ok && i < nt; i++)
        t[i].serves = f[i].wins ? &t[i].shop : t[i].old != NULL && old_fits(c, ninline, &t[i]) ? t[i].old : NULL;
    hostreg_free(&held);
    free(main);
    free(f);
    free(cl);
    return ok;
}

/* Every *.json file of dir, one shop each, in name order: NAME.json is
 * the shop NAME (a file of another name is skipped). A bad file, or one
 * colliding with another shop (tenants_resolve), is skipped
 * (c->skipped), keeping its previous version from prev when there is one
 * that still holds its hosts; who holds which host is decided from
 * c->held_read into c->held. Only a missing folder or running out of
 * memory fails the load. */
static void load_shops_dir(struct config *c, const struct config *prev, struct cerr *e, const char *file,
                           const char *dir)
{
    DIR *d = opendir(dir);
    if (d == NULL) {
        config_fail(e, file, "shops_dir", "cannot open %s: %s", dir, strerror(errno));
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
            config_fail_oom(e, file);
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
        config_fail_oom(e, file);
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
                config_fail_oom(e, file);
            continue;
        }
        struct tenant *tt = &t[nt++];
        tt->path = strdup(path);
        if (tt->path == NULL) {
            config_fail_oom(e, file);
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
            config_fail_oom(e, file);
            break;
        }
        tt->loaded = fe.count == 0;
        if (!tt->loaded) {
            tt->why = strdup(ebuf);
            tt->whylen = strlen(ebuf);
            if (tt->why == NULL) {
                config_fail_oom(e, file);
                break;
            }
        }
        for (int j = 0; prev != NULL && j < prev->nshops && tt->old == NULL; j++)
            if (prev->shops[j].source != NULL && strcmp(prev->shops[j].id, names[i]) == 0)
                tt->old = &prev->shops[j];
        util_copy(tt->name, sizeof tt->name, names[i]);
    }
    if (t != NULL && !e->oom && !tenants_resolve(c, prev, t, nt))
        config_fail_oom(e, file);
    for (size_t i = 0; t != NULL && i < nt && !e->oom; i++) {
        struct tenant *tt = &t[i];
        if (tt->oom) {
            config_fail_oom(e, file);
            break;
        }
        if (tt->serves == &tt->shop) {
            struct shop *s = add_shop(c, e, file);
            if (s == NULL)
                break;
            *s = tt->shop;
            memset(&tt->shop, 0, sizeof tt->shop);
            s->source = tt->path;
            tt->path = NULL;
            continue;
        }
        bool kept = tt->serves != NULL && tt->serves == tt->old;
        if (kept) {
            struct shop *s = add_shop(c, e, file);
            if (s == NULL)
                break;
            if (!shop_copy(c, s, tt->old)) {
                config_shop_clear(s);
                c->nshops--;
                config_fail_oom(e, file);
                break;
            }
        }
        if (!add_skip(c, tt->path, tt->why ? tt->why : "", tt->collides, kept)) {
            config_fail_oom(e, file);
            break;
        }
    }
    for (size_t i = 0; t != NULL && i < nt; i++) {
        config_shop_clear(&t[i].shop);
        free(t[i].path);
        free(t[i].why);
    }
    free(t);
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

void config_load_shops(struct config *c, const struct config *prev, struct cerr *e, const char *file, json_t *root,
                       const char *sdir)
{
    json_t *shops = json_object_get(root, "shops");
    if (shops != NULL && !json_is_array(shops))
        config_fail(e, file, "shops", "must be a list of shop objects");
    size_t i;
    json_t *so;
    json_array_foreach(shops, i, so) {
        char where[48];
        snprintf(where, sizeof where, "shops[%zu].", i);
        struct shop *s = add_shop(c, e, file);
        if (s == NULL)
            break;
        load_shop(c, e, file, where, so, s, NULL);
    }
    for (int a = 0; a < c->nshops; a++) {
        for (int b = a + 1; b < c->nshops; b++) {
            if (c->shops[a].id[0] && strcmp(c->shops[a].id, c->shops[b].id) == 0)
                config_fail(e, file, "shops", "the id \"%s\" is used by two shops", c->shops[a].id);
            if (notify_shared(&c->shops[a], &c->shops[b]))
                config_fail(e, file, "shops", "shops \"%s\" and \"%s\" have different keys and one notify secret: "
                            "a notify signed for one shop must never be accepted by another (give each its own)",
                            c->shops[a].id, c->shops[b].id);
            for (int x = 0; x < c->shops[a].nhosts; x++)
                for (int y = 0; y < c->shops[b].nhosts; y++)
                    if (strcmp(c->shops[a].hosts[x], c->shops[b].hosts[y]) == 0)
                        config_fail(e, file, "shops", "the host \"%s\" is claimed by shops \"%s\" and \"%s\"",
                                    c->shops[a].hosts[x], c->shops[a].id, c->shops[b].id);
        }
    }
    c->has_shops_dir = sdir != NULL;
    if (sdir != NULL && e->count == 0)
        load_shops_dir(c, prev, e, file, sdir);
    if (c->nshops == 0 && e->count == 0 && c->nskipped == 0)
        config_fail(e, file, "shops", "no shop is configured (give \"shops\" or \"shops_dir\")");
}
