/* fuzz_templates.c - template pages (templates_load, render_html).
 *
 * Input: 1 byte choosing the page (which word, or waiting.html, which
 * locale, whether the other pages come from a fallback folder), the page's bytes up to a 0xFF
 * byte (which UTF-8 never holds), then the four values a page shows (id,
 * shop name, shop URL, retry URL), separated by 0xFF, each cut at a NUL byte.
 * The page is written into a private folder (fuzz_fs.h) as
 * own/<locale>/<word>.html; the other pages are those of fallback/ (or
 * missing, so the load must fail). Checked: a loaded set renders every
 * page; each output carries data-status="<word>"; a set that streams
 * renders its waiting top and every result part, whose last data-status
 * is the word; values arrive escaped (html_escape: no raw < > " ' and
 * every & starts an entity). */
#include <stdbool.h>

#include "fuzz.h"
#include "fuzz_fs.h"
#include "render.h"

static const char *const wordfile[W_COUNT] = {
    "succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop",
};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    fuzz_fs_init("templates");
    fuzz_write_templates("fallback", 0);
    static const char wait[] = "<!doctype html><html data-status=\"{{status}}\"><p>{{shop_name}} {{id}}</p>"
                               "{{more}}<div role=\"alert\" data-status=\"{{status}}\">{{card}}</div></html>\n";
    fuzz_write("fallback/id/waiting.html", wait, sizeof wait - 1, 0644);
    fuzz_write("fallback/en/waiting.html", wait, sizeof wait - 1, 0644);
    fuzz_mkdir("own");
    fuzz_mkdir("own/id");
    fuzz_mkdir("own/en");
    return 0;
}

static void check_escaped(const char *s, size_t n)
{
    static const char *const ents[] = {"&amp;", "&lt;", "&gt;", "&quot;", "&#39;"};
    for (size_t i = 0; i < n; i++) {
        FUZZ_CHECK(s[i] != '<' && s[i] != '>' && s[i] != '"' && s[i] != '\'');
        if (s[i] != '&')
            continue;
        bool ok = false;
        for (size_t e = 0; e < 5 && !ok; e++)
            ok = strncmp(s + i, ents[e], strlen(ents[e])) == 0;
        FUZZ_CHECK(ok);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t sel = data[0];
    struct fuzz_in in = {data + 1, size - 1};
    enum word w = (enum word)(sel % W_COUNT);
    const char *loc = (sel & 0x08) ? "en" : "id";
    bool with_fallback = !(sel & 0x10);
    size_t plen;
    char *page = fuzz_field(&in, 0xFF, &plen);
    char *vals[4];
    for (int i = 0; i < 4; i++)
        vals[i] = fuzz_field(&in, 0xFF, NULL);

    char rel[64], own[PATH_MAX], fb[PATH_MAX];
    bool waiting = sel & 0x20; /* the page is waiting.html */
    snprintf(rel, sizeof rel, "own/%s/%s.html", loc, waiting ? "waiting" : wordfile[w]);
    fuzz_write(rel, page, plen, 0644);
    fuzz_path(own, sizeof own, "own");
    fuzz_path(fb, sizeof fb, "fallback");

    char err[300];
    memset(err, 'E', sizeof err);
    struct templates *t = templates_load(own, with_fallback ? fb : NULL, loc, with_fallback ? NULL : own, err, sizeof err);
    if (t == NULL) {
        FUZZ_CHECK(strnlen(err, sizeof err) < sizeof err && err[0] != '\0');
    } else {
        FUZZ_CHECK(with_fallback);
        FUZZ_CHECK(waiting || (t->len[w] == plen && memcmp(t->page[w], page, plen) == 0));
        struct page_vars v = {vals[0], vals[1], vals[2], vals[3]};
        for (int x = 0; x < W_COUNT; x++) {
            struct dynbuf b;
            dynbuf_init(&b, 64 << 20);
            FUZZ_CHECK(render_html(t, (enum word)x, &v, &b) == DYNBUF_OK);
            FUZZ_CHECK(b.p != NULL && strlen(b.p) == b.len);
            FUZZ_CHECK(render_html_len(t, (enum word)x, &v) == b.len);
            char want[64];
            snprintf(want, sizeof want, "data-status=\"%s\"", word_name((enum word)x));
            FUZZ_CHECK(strstr(b.p, want) != NULL);
            dynbuf_free(&b);
        }
        if (templates_stream(t)) {
            struct dynbuf b;
            dynbuf_init(&b, 64 << 20);
            FUZZ_CHECK(render_wait_top(t, &v, &b) == DYNBUF_OK);
            FUZZ_CHECK(b.len == 0 || strlen(b.p) == b.len);
            for (int x = W_SUCCEEDED; x <= W_NOT_FOUND; x++) {
                struct dynbuf r;
                dynbuf_init(&r, 64 << 20);
                FUZZ_CHECK(render_wait_result(t, (enum word)x, &v, &r) == DYNBUF_OK);
                FUZZ_CHECK(r.p != NULL && strlen(r.p) == r.len);
                FUZZ_CHECK(render_stream_len(t, (enum word)x, &v) == b.len + r.len); /* what the load-time cap counts */
                char want[64];
                snprintf(want, sizeof want, "data-status=\"%s\"", word_name((enum word)x));
                FUZZ_CHECK(strstr(r.p, want) != NULL);
                dynbuf_free(&r);
            }
            dynbuf_free(&b);
        }
        templates_free(t);
    }
    for (int i = 0; i < 4; i++) {
        struct dynbuf b;
        dynbuf_init(&b, 64 << 20);
        FUZZ_CHECK(html_escape(&b, vals[i]) == DYNBUF_OK);
        if (b.len > 0)
            check_escaped(b.p, b.len);
        dynbuf_free(&b);
        free(vals[i]);
    }
    fuzz_unlink(rel);
    free(page);
    return 0;
}
