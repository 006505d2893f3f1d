/* render.c - see render.h. */
#include "render.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

#define TEMPLATE_MAX (64 * 1024) /* bytes of one page: a tenant must not make every page cost megabytes */

static const char *const words[W_COUNT] = {
    "succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop",
};

const char *word_name(enum word w)
{
    return (unsigned)w < W_COUNT ? words[w] : "checking";
}

int word_http(enum word w)
{
    switch (w) {
    case W_NOT_FOUND:
    case W_UNKNOWN_SHOP:
        return 404;
    case W_INVALID:
        return 400;
    default:
        return 200;
    }
}

/* What html_escape writes for c, or NULL when c stays as it is. */
static const char *html_rep(char c)
{
    switch (c) {
    case '&': return "&amp;";
    case '<': return "&lt;";
    case '>': return "&gt;";
    case '"': return "&quot;";
    case '\'': return "&#39;";
    default: return NULL;
    }
}

enum dynbuf_rc html_escape(struct dynbuf *b, const char *s)
{
    const char *run = s;
    for (; *s; s++) {
        const char *rep = html_rep(*s);
        if (rep == NULL)
            continue;
        if (dynbuf_add(b, run, (size_t)(s - run)) != DYNBUF_OK || dynbuf_adds(b, rep) != DYNBUF_OK)
            return dynbuf_error(b);
        run = s + 1;
    }
    return dynbuf_add(b, run, (size_t)(s - run));
}

static const char *const placeholders[] = {"status", "id", "shop_name", "shop_url", "retry_url"};

/* Index of the placeholder starting at p ("{{name}}"), its length in *len;
 * -1 when p does not start a known placeholder. */
static int placeholder_at(const char *p, size_t avail, size_t *len)
{
    if (avail < 4 || p[0] != '{' || p[1] != '{')
        return -1;
    for (size_t i = 0; i < sizeof placeholders / sizeof placeholders[0]; i++) {
        size_t n = strlen(placeholders[i]);
        if (avail >= n + 4 && memcmp(p + 2, placeholders[i], n) == 0 && p[2 + n] == '}' && p[3 + n] == '}') {
            *len = n + 4;
            return (int)i;
        }
    }
    return -1;
}

/* The bytes of the page at `path` (a regular file of at most TEMPLATE_MAX bytes,
 * without NUL bytes), or NULL with a reason in err; *missing tells ENOENT.
 * With `confine`, the file must resolve inside that folder and is opened by
 * its resolved name without following a link swapped in since. */
static char *read_file(const char *path, const char *confine, size_t *len, char *err, size_t errlen, bool *missing)
{
    *missing = false;
    char real[PATH_MAX];
    const char *open_path = path;
    int oflags = O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
    if (confine != NULL) {
        if (realpath(path, real) == NULL) {
            *missing = errno == ENOENT;
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            return NULL;
        }
        if (!util_path_inside(real, confine)) {
            snprintf(err, errlen, "%s: resolves to %s, outside %s", path, real, confine);
            return NULL;
        }
        open_path = real;
        oflags |= O_NOFOLLOW;
    }
    int fd = open(open_path, oflags);
    if (fd < 0) {
        *missing = errno == ENOENT;
        snprintf(err, errlen, "%s: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        close(fd);
        return NULL;
    }
    if (st.st_size > TEMPLATE_MAX) {
        snprintf(err, errlen, "%s: larger than %d KiB", path, TEMPLATE_MAX / 1024);
        close(fd);
        return NULL;
    }
    char *data = malloc(TEMPLATE_MAX + 1);
    if (data == NULL) {
        snprintf(err, errlen, "%s: out of memory", path);
        close(fd);
        return NULL;
    }
    size_t n = 0;
    bool bad = false;
    while (n <= TEMPLATE_MAX) { /* one byte more than allowed tells "too large" */
        ssize_t r = read(fd, data + n, TEMPLATE_MAX + 1 - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            bad = true;
            break;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    close(fd);
    if (bad || n > TEMPLATE_MAX) {
        if (bad)
            snprintf(err, errlen, "%s: read error", path);
        else
            snprintf(err, errlen, "%s: larger than %d KiB", path, TEMPLATE_MAX / 1024);
        free(data);
        return NULL;
    }
    data[n] = '\0';
    if (strlen(data) != n) {
        snprintf(err, errlen, "%s: contains a NUL byte", path);
        free(data);
        return NULL;
    }
    *len = n;
    return data;
}

/* Check a page and find its placeholders (*slots, *nslots: the caller
 * frees *slots). False with a reason in err. */
static bool check_page(const char *path, const char *p, size_t n, struct templates_slot **slots, size_t *nslots,
                       char *err, size_t errlen)
{
    *slots = NULL;
    *nslots = 0;
    size_t cap = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        size_t len;
        if (p[i] != '{' || p[i + 1] != '{')
            continue;
        int ph = placeholder_at(p + i, n - i, &len);
        if (ph < 0) {
            snprintf(err, errlen, "%s: unknown placeholder near \"%.20s\" (known: {{status}} {{id}} "
                     "{{shop_name}} {{shop_url}} {{retry_url}})", path, p + i);
            return false;
        }
        if (*nslots == cap) {
            cap = cap ? cap * 2 : 8;
            struct templates_slot *ns = realloc(*slots, cap * sizeof *ns);
            if (ns == NULL) {
                snprintf(err, errlen, "%s: out of memory", path);
                return false;
            }
            *slots = ns;
        }
        (*slots)[(*nslots)++] = (struct templates_slot){.at = i, .len = (unsigned char)len, .ph = (unsigned char)ph};
        i += len - 1;
    }
    if (strstr(p, "data-status=\"{{status}}\"") == NULL) {
        snprintf(err, errlen, "%s: the <html> tag must carry data-status=\"{{status}}\"", path);
        return false;
    }
    return true;
}

struct templates *templates_load(const char *dir, const char *fallback, const char *locale, const char *confine,
                                 char *err, size_t errlen)
{
    struct templates *t = calloc(1, sizeof *t);
    if (t == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    atomic_init(&t->refs, 1);
    snprintf(t->locale, sizeof t->locale, "%s", locale);
    t->dir = strdup(dir);
    if (t->dir == NULL) {
        snprintf(err, errlen, "out of memory");
        free(t);
        return NULL;
    }
    for (int w = 0; w < W_COUNT; w++) {
        char path[PATH_MAX];
        bool missing = false;
        int pn = snprintf(path, sizeof path, "%s/%s/%s.html", dir, locale, words[w]);
        if (pn < 0 || (size_t)pn >= sizeof path) {
            snprintf(err, errlen, "%.200s...: the path is too long", dir);
            templates_free(t);
            return NULL;
        }
        t->page[w] = read_file(path, confine, &t->len[w], err, errlen, &missing);
        if (t->page[w] == NULL && missing && fallback != NULL && strcmp(fallback, dir) != 0) {
            pn = snprintf(path, sizeof path, "%s/%s/%s.html", fallback, locale, words[w]);
            if (pn < 0 || (size_t)pn >= sizeof path) {
                snprintf(err, errlen, "%.200s...: the path is too long", fallback);
                templates_free(t);
                return NULL;
            }
            t->page[w] = read_file(path, NULL, &t->len[w], err, errlen, &missing);
        }
        if (t->page[w] == NULL ||
            !check_page(path, t->page[w], t->len[w], &t->slots[w], &t->nslots[w], err, errlen)) {
            templates_free(t);
            return NULL;
        }
    }
    return t;
}

struct templates *templates_ref(struct templates *t)
{
    atomic_fetch_add(&t->refs, 1);
    return t;
}

void templates_free(struct templates *t)
{
    if (t == NULL || atomic_fetch_sub(&t->refs, 1) != 1)
        return;
    for (int w = 0; w < W_COUNT; w++) {
        free(t->page[w]);
        free(t->slots[w]);
    }
    free(t->dir);
    free(t);
}

enum dynbuf_rc render_html(const struct templates *t, enum word w, const struct page_vars *v, struct dynbuf *b)
{
    const char *p = t->page[w];
    size_t run = 0;
    const char *vals[] = {word_name(w), v->id, v->shop_name, v->shop_url, v->retry_url};
    for (size_t i = 0; i < t->nslots[w]; i++) {
        const struct templates_slot *sl = &t->slots[w][i];
        if (dynbuf_add(b, p + run, sl->at - run) != DYNBUF_OK ||
            html_escape(b, vals[sl->ph] ? vals[sl->ph] : "") != DYNBUF_OK)
            return dynbuf_error(b);
        run = sl->at + sl->len;
    }
    return dynbuf_add(b, p + run, t->len[w] - run);
}

/* The length of s once html_escape has escaped it. Can't fail. */
static size_t escaped_len(const char *s)
{
    size_t n = 0;
    for (; *s; s++) {
        const char *rep = html_rep(*s);
        n += rep ? strlen(rep) : 1;
    }
    return n;
}

void render_retry_url(char *buf, size_t len, const char *id_param, const char *id)
{
    if (len > 0)
        snprintf(buf, len, "?%s=%s", id_param, id);
}

size_t render_html_len(const struct templates *t, enum word w, const struct page_vars *v)
{
    const char *vals[] = {word_name(w), v->id, v->shop_name, v->shop_url, v->retry_url};
    size_t len[sizeof vals / sizeof vals[0]];
    for (size_t i = 0; i < sizeof vals / sizeof vals[0]; i++)
        len[i] = escaped_len(vals[i] ? vals[i] : "");
    size_t n = t->len[w];
    for (size_t i = 0; i < t->nslots[w]; i++) {
        const struct templates_slot *sl = &t->slots[w][i];
        if (len[sl->ph] > SIZE_MAX - n)
            return SIZE_MAX;
        n = n - sl->len + len[sl->ph];
    }
    return n;
}

enum dynbuf_rc render_json(const char *id, const char *status, bool final, struct dynbuf *b)
{
    json_t *o = json_pack("{s:s, s:s, s:b}", "id", id, "status", status, "final", final);
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    enum dynbuf_rc rc = DYNBUF_NO_MEMORY;
    if (s != NULL)
        rc = dynbuf_adds(b, s) != DYNBUF_OK ? dynbuf_error(b) : dynbuf_adds(b, "\n");
    free(s);
    json_decref(o);
    return rc;
}
