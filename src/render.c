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

static const char *const placeholders[] = {"status", "id", "shop_name", "shop_url", "retry_url", "more", "card"};
enum { PH_STATUS, PH_MORE = 5, PH_CARD = 6, PH_COUNT = 7 }; /* more and card: the waiting page's own */
_Static_assert(sizeof placeholders / sizeof placeholders[0] == PH_COUNT, "one PH_ per placeholder");

static const char card_open[] = "<!--card-->", card_close[] = "<!--/card-->";

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
static bool check_page(const char *path, const char *p, size_t n, bool waiting, struct templates_slot **slots,
                       size_t *nslots, char *err, size_t errlen)
{
    *slots = NULL;
    *nslots = 0;
    size_t cap = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        size_t len;
        if (p[i] != '{' || p[i + 1] != '{')
            continue;
        int ph = placeholder_at(p + i, n - i, &len);
        if (ph >= PH_MORE && !waiting) {
            snprintf(err, errlen, "%s: {{more}} and {{card}} belong in waiting.html only", path);
            return false;
        }
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
    if (waiting) { /* the top, {{more}}, then the result with its data-status and {{card}} */
        size_t more = SIZE_MAX, card = SIZE_MAX, nmore = 0, ncard = 0;
        for (size_t i = 0; i < *nslots; i++) {
            if ((*slots)[i].ph == PH_MORE)
                more = (*slots)[i].at, nmore++;
            else if ((*slots)[i].ph == PH_CARD)
                card = (*slots)[i].at, ncard++;
        }
        const char *st = nmore == 1 ? strstr(p + more, "data-status=\"{{status}}\"") : NULL;
        if (nmore != 1 || ncard != 1 || card < more || st == NULL || (size_t)(st - p) > card) {
            snprintf(err, errlen, "%s: needs one {{more}} (where the top ends), then an element carrying "
                     "data-status=\"{{status}}\" around one {{card}} (the result)", path);
            return false;
        }
    }
    return true;
}

/* Where page w's result card lies (between <!--card--> and <!--/card-->):
 * false when the page has no such pair. */
static bool find_card(struct templates *t, int w)
{
    const char *a = strstr(t->page[w], card_open);
    const char *b = a ? strstr(a, card_close) : NULL;
    if (b == NULL)
        return false;
    t->card_at[w] = (size_t)(a - t->page[w]) + sizeof card_open - 1;
    t->card_end[w] = (size_t)(b - t->page[w]);
    return true;
}

/* Load dir/<locale>/waiting.html (or fallback's) into t: the streamed
 * page. Missing everywhere: t does not stream (false, no error). */
static bool load_waiting(struct templates *t, const char *dir, const char *fallback, const char *confine,
                         char *err, size_t errlen)
{
    char path[PATH_MAX];
    bool missing = false;
    int pn = snprintf(path, sizeof path, "%s/%s/waiting.html", dir, t->locale);
    if (pn < 0 || (size_t)pn >= sizeof path) {
        snprintf(err, errlen, "%.200s...: the path is too long", dir);
        return false;
    }
    t->wait = read_file(path, confine, &t->wait_len, err, errlen, &missing);
    if (t->wait == NULL && missing && fallback != NULL && strcmp(fallback, dir) != 0) {
        pn = snprintf(path, sizeof path, "%s/%s/waiting.html", fallback, t->locale);
        if (pn < 0 || (size_t)pn >= sizeof path) {
            snprintf(err, errlen, "%.200s...: the path is too long", fallback);
            return false;
        }
        t->wait = read_file(path, NULL, &t->wait_len, err, errlen, &missing);
    }
    if (t->wait == NULL)
        return missing; /* an old templates folder: single answers only */
    if (!check_page(path, t->wait, t->wait_len, true, &t->wait_slots, &t->nwait_slots, err, errlen))
        return false;
    bool cards = true;
    for (int w = W_SUCCEEDED; w <= W_NOT_FOUND; w++) /* the words a held request can end with */
        cards = find_card(t, w) && cards;
    t->streams = cards;
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
        int pn = snprintf(path, sizeof path, "%s/%s/%s.html", dir, locale, word_name((enum word)w));
        if (pn < 0 || (size_t)pn >= sizeof path) {
            snprintf(err, errlen, "%.200s...: the path is too long", dir);
            templates_free(t);
            return NULL;
        }
        t->page[w] = read_file(path, confine, &t->len[w], err, errlen, &missing);
        if (t->page[w] == NULL && missing && fallback != NULL && strcmp(fallback, dir) != 0) {
            pn = snprintf(path, sizeof path, "%s/%s/%s.html", fallback, locale, word_name((enum word)w));
            if (pn < 0 || (size_t)pn >= sizeof path) {
                snprintf(err, errlen, "%.200s...: the path is too long", fallback);
                templates_free(t);
                return NULL;
            }
            t->page[w] = read_file(path, NULL, &t->len[w], err, errlen, &missing);
        }
        if (t->page[w] == NULL ||
            !check_page(path, t->page[w], t->len[w], false, &t->slots[w], &t->nslots[w], err, errlen)) {
            templates_free(t);
            return NULL;
        }
    }
    if (!load_waiting(t, dir, fallback, confine, err, errlen)) {
        templates_free(t);
        return NULL;
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
    free(t->wait);
    free(t->wait_slots);
    free(t->dir);
    free(t);
}

/* Bytes [from, to) of page p (slots sl[0..n)), every placeholder in it
 * replaced: {{card}} by word w's card, {{more}} by nothing, the others by
 * vals[] through html_escape(). DYNBUF_OK, or b's failure. */
static enum dynbuf_rc render_span(const struct templates *t, enum word w, const char *p,
                                  const struct templates_slot *sl, size_t n, size_t from, size_t to,
                                  const char *const *vals, struct dynbuf *b)
{
    size_t run = from;
    for (size_t i = 0; i < n; i++) {
        if (sl[i].at < from || sl[i].at >= to)
            continue;
        enum dynbuf_rc rc = dynbuf_add(b, p + run, sl[i].at - run);
        if (rc == DYNBUF_OK && sl[i].ph == PH_CARD)
            rc = render_span(t, w, t->page[w], t->slots[w], t->nslots[w], t->card_at[w], t->card_end[w], vals, b);
        else if (rc == DYNBUF_OK && sl[i].ph != PH_MORE)
            rc = html_escape(b, vals[sl[i].ph] ? vals[sl[i].ph] : "");
        if (rc != DYNBUF_OK)
            return rc;
        run = sl[i].at + sl[i].len;
    }
    return dynbuf_add(b, p + run, to - run);
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

/* The length render_span() gives for the same span, with lens[] the
 * escaped lengths of its vals[] (0 for {{more}}). SIZE_MAX on overflow.
 * Can't fail. */
static size_t span_len(const struct templates *t, enum word w, const struct templates_slot *sl, size_t n,
                       size_t from, size_t to, const size_t *lens)
{
    size_t total = to - from;
    for (size_t i = 0; i < n; i++) {
        if (sl[i].at < from || sl[i].at >= to)
            continue;
        size_t add = sl[i].ph == PH_CARD
                         ? span_len(t, w, t->slots[w], t->nslots[w], t->card_at[w], t->card_end[w], lens)
                         : lens[sl[i].ph];
        if (add > SIZE_MAX - total)
            return SIZE_MAX;
        total = total - sl[i].len + add;
    }
    return total;
}

/* The values of word w's placeholders, by placeholder (none for {{more}}
 * and {{card}}), and with lens their escaped lengths. Can't fail. */
static void page_vals(enum word w, const struct page_vars *v, const char *vals[PH_COUNT], size_t lens[PH_COUNT])
{
    const char *vs[PH_COUNT] = {word_name(w), v->id, v->shop_name, v->shop_url, v->retry_url, NULL, NULL};
    for (size_t i = 0; i < PH_COUNT; i++) {
        vals[i] = vs[i];
        if (lens != NULL)
            lens[i] = escaped_len(vs[i] ? vs[i] : "");
    }
}

enum dynbuf_rc render_html(const struct templates *t, enum word w, const struct page_vars *v, struct dynbuf *b)
{
    const char *vals[PH_COUNT];
    page_vals(w, v, vals, NULL);
    return render_span(t, w, t->page[w], t->slots[w], t->nslots[w], 0, t->len[w], vals, b);
}

size_t render_html_len(const struct templates *t, enum word w, const struct page_vars *v)
{
    const char *vals[PH_COUNT];
    size_t lens[PH_COUNT];
    page_vals(w, v, vals, lens);
    return span_len(t, w, t->slots[w], t->nslots[w], 0, t->len[w], lens);
}

bool templates_stream(const struct templates *t)
{
    return t->streams;
}

/* Where {{more}} ends the waiting page's top. */
static size_t more_at(const struct templates *t, size_t *after)
{
    for (size_t i = 0; i < t->nwait_slots; i++)
        if (t->wait_slots[i].ph == PH_MORE) {
            *after = t->wait_slots[i].at + t->wait_slots[i].len;
            return t->wait_slots[i].at;
        }
    *after = t->wait_len;
    return t->wait_len; /* cannot happen: check_page() wants one */
}

/* The word whose card ends a streamed page answered with w: its own, or
 * checking's for a word without one (never for a held request). */
static enum word result_word(enum word w)
{
    return w >= W_SUCCEEDED && w <= W_NOT_FOUND ? w : W_CHECKING;
}

enum dynbuf_rc render_wait_top(const struct templates *t, const struct page_vars *v, struct dynbuf *b)
{
    size_t after, at = more_at(t, &after);
    const char *vals[PH_COUNT];
    page_vals(W_CHECKING, v, vals, NULL);
    return render_span(t, W_CHECKING, t->wait, t->wait_slots, t->nwait_slots, 0, at, vals, b);
}

enum dynbuf_rc render_wait_result(const struct templates *t, enum word w, const struct page_vars *v,
                                  struct dynbuf *b)
{
    size_t after;
    more_at(t, &after);
    w = result_word(w);
    const char *vals[PH_COUNT];
    page_vals(w, v, vals, NULL);
    return render_span(t, w, t->wait, t->wait_slots, t->nwait_slots, after, t->wait_len, vals, b);
}

size_t render_stream_len(const struct templates *t, enum word w, const struct page_vars *v)
{
    size_t after, at = more_at(t, &after);
    const char *vals[PH_COUNT];
    size_t lens[PH_COUNT];
    page_vals(W_CHECKING, v, vals, lens);
    size_t top = span_len(t, W_CHECKING, t->wait_slots, t->nwait_slots, 0, at, lens);
    w = result_word(w);
    page_vals(w, v, vals, lens);
    size_t rest = span_len(t, w, t->wait_slots, t->nwait_slots, after, t->wait_len, lens);
    return rest > SIZE_MAX - top ? SIZE_MAX : top + rest;
}

void render_retry_url(char *buf, size_t len, const char *id_param, const char *id)
{
    if (len > 0)
        snprintf(buf, len, "?%s=%s", id_param, id);
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
