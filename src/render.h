/* render.h - pages and JSON answers; the only place bytes reach HTML.
 *
 * Templates are plain HTML files with placeholders {{status}}, {{id}},
 * {{shop_name}}, {{shop_url}} and {{retry_url}}. Every value substituted
 * goes through html_escape(), which escapes & < > " ' so it is safe in text
 * and in quoted attribute values. JSON is produced by jansson. */
#ifndef KEMBALI_RENDER_H
#define KEMBALI_RENDER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "dynbuf.h"
#include "word.h"

/* Append s to b with & < > " ' escaped. The one HTML escaping function.
 * DYNBUF_OK, or b's failure (dynbuf.h: nothing is cut silently). */
enum dynbuf_rc html_escape(struct dynbuf *b, const char *s) DYNBUF_CHECKED;

/* Where a placeholder sits in a page, found once when the page is loaded. */
struct templates_slot {
    size_t at;              /* offset of its "{{" */
    unsigned char len;      /* length of "{{name}}" */
    unsigned char ph;       /* which value (status, id, shop_name, shop_url, retry_url) */
};

struct templates {
    atomic_int refs;        /* templates_ref / templates_free */
    char locale[3];
    char *dir;              /* where they were loaded from */
    char *page[W_COUNT];
    size_t len[W_COUNT];
    struct templates_slot *slots[W_COUNT];
    size_t nslots[W_COUNT];
    /* the streamed page: waiting.html, and where each word's card lies */
    char *wait;             /* NULL: none found, single answers only */
    size_t wait_len;
    struct templates_slot *wait_slots;
    size_t nwait_slots;
    size_t card_at[W_COUNT], card_end[W_COUNT];
    bool streams;           /* waiting.html and every card a held request can end with */
};

/* Load the pages of `locale` from dir/<locale>/<word>.html; a missing file
 * is taken from fallback/<locale>/ (fallback may be NULL). Each page is
 * checked: a regular file (a FIFO or device is refused, never waited on),
 * at most 64 KiB, only known placeholders, and carrying
 * data-status="{{status}}". When `confine` is not NULL (an absolute path
 * with symbolic links resolved), every page taken from `dir` must lie
 * inside that folder after resolving symbolic links (a tenant's folder
 * cannot make kembali read another file); pages from `fallback` are not
 * confined. Returns a set holding one reference, or NULL with a reason in
 * err (out of memory included). */
struct templates *templates_load(const char *dir, const char *fallback, const char *locale, const char *confine,
                                 char *err, size_t errlen);
/* Take one more reference to t (shared by two configurations). Returns t.
 * This function can't fail. */
struct templates *templates_ref(struct templates *t);
/* Drop one reference; the last one frees the set. NULL is ignored. */
void templates_free(struct templates *t);


struct page_vars {
    const char *id, *shop_name, *shop_url, *retry_url; /* NULL reads as "" */
};

/* Render page `w` into b. DYNBUF_OK, or b's failure (its ceiling, memory):
 * then b holds nothing and the caller has no page to send. */
enum dynbuf_rc render_html(const struct templates *t, enum word w, const struct page_vars *v,
                           struct dynbuf *b) DYNBUF_CHECKED;

/* The streamed page (docs/answers.md, "While a browser waits").
 * One source per word: waiting.html holds the page around the result, and
 * each word's page marks its card, <!--card--> ... <!--/card-->, which the
 * result reuses. waiting.html is a whole page with {{more}} where its top
 * ends (the first part sent) and, after it, an element carrying
 * data-status="{{status}}" around {{card}}. templates_load() reads it from
 * dir/<locale>/waiting.html (or fallback's); without it, or when a word's
 * page has no card, templates_stream() is false and requests get the
 * single page. */
bool templates_stream(const struct templates *t);

/* The top of the streamed page into b ({{status}} is "checking"), up to
 * {{more}}. Only when templates_stream(t). DYNBUF_OK, or b's failure:
 * then b holds nothing and the caller has no top to send. */
enum dynbuf_rc render_wait_top(const struct templates *t, const struct page_vars *v,
                               struct dynbuf *b) DYNBUF_CHECKED;

/* The rest of the streamed page for word w into b: from {{more}} to the
 * end, with {{status}} w and {{card}} w's card (rendered with v). Only
 * when templates_stream(t). DYNBUF_OK, or b's failure: then b holds
 * nothing and the caller has no result to send. */
enum dynbuf_rc render_wait_result(const struct templates *t, enum word w, const struct page_vars *v,
                                  struct dynbuf *b) DYNBUF_CHECKED;

/* The most bytes one rendered page may have: a page is its template (at
 * most 64 KiB) with each placeholder replaced, and a shop whose values
 * would make a page larger is refused (config_shops.c), so that no tenant makes
 * every page cost megabytes. A streamed page (its top and its result
 * together) is a page too. */
#define RENDER_PAGE_MAX (256 * 1024)

/* The retry link of a page, "?ID_PARAM=ID", into buf (cut to len, always
 * NUL-terminated when len > 0). Can't fail. */
void render_retry_url(char *buf, size_t len, const char *id_param, const char *id);

/* The length in bytes render_html(t, w, v) gives (its escaping included).
 * Pure; can't fail (SIZE_MAX on overflow). */
size_t render_html_len(const struct templates *t, enum word w, const struct page_vars *v);

/* The length in bytes of the streamed page that ends with word w:
 * render_wait_top(t, v) and render_wait_result(t, w, v) together. Only
 * when templates_stream(t). Pure; can't fail (SIZE_MAX on overflow). */
size_t render_stream_len(const struct templates *t, enum word w, const struct page_vars *v);

/* {"id": id, "status": status, "final": final} and a newline into b.
 * DYNBUF_OK, or b's failure (DYNBUF_NO_MEMORY when jansson runs out). */
enum dynbuf_rc render_json(const char *id, const char *status, bool final, struct dynbuf *b) DYNBUF_CHECKED;

#endif
