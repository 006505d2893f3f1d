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

enum word {
    W_SUCCEEDED, W_FAILED, W_CANCELED, W_EXPIRED, W_CHECKING,
    W_NOT_FOUND, W_INVALID, W_UNKNOWN_SHOP, W_COUNT
};

/* The status word of the interface ("succeeded" ... "unknown_shop"). */
const char *word_name(enum word w);
/* The HTTP status for a word (200, 404 or 400). */
int word_http(enum word w);

/* A growable output buffer. On allocation failure `oom` is set and further
 * writes are dropped; the caller answers with what it can. */
struct buf {
    char *p;
    size_t len, cap;
    bool oom;
};
void buf_put(struct buf *b, const char *s, size_t n);
void buf_puts(struct buf *b, const char *s);
void buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void buf_free(struct buf *b);

/* Append s to b with & < > " ' escaped. The one HTML escaping function. */
void html_escape(struct buf *b, const char *s);

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
 * under 256 KiB, only known placeholders, and carrying
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

/* Render page `w` into b. This function can't fail (see struct buf). */
void render_html(const struct templates *t, enum word w, const struct page_vars *v, struct buf *b);

/* The streamed page (interface.md, "What a browser sees while it waits").
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
 * {{more}}. Only when templates_stream(t). This function can't fail (see
 * struct buf). */
void render_wait_top(const struct templates *t, const struct page_vars *v, struct buf *b);

/* The rest of the streamed page for word w into b: from {{more}} to the
 * end, with {{status}} w and {{card}} w's card (rendered with v). Only
 * when templates_stream(t). This function can't fail (see struct buf). */
void render_wait_result(const struct templates *t, enum word w, const struct page_vars *v, struct buf *b);

/* {"id": id, "status": status, "final": final} into b. */
void render_json(const char *id, const char *status, bool final, struct buf *b);

#endif
