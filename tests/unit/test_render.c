/* test_render.c - unit tests of src/render.c: escaping, templates, JSON. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "render.h"

#define TEMPLATES TEST_SRCDIR "/templates"

static const char *const all_words[W_COUNT] = {
    "succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop",
};

/* ---- helpers: a scratch directory per test ---- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static int setup_dir(void **state)
{
    char *dir = strdup("/tmp/kembali-test-render-XXXXXX");
    if (dir == NULL || mkdtemp(dir) == NULL)
        return -1;
    *state = dir;
    return 0;
}

static int teardown_dir(void **state)
{
    char *dir = *state;
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    free(dir);
    return 0;
}

static void write_file(const char *dir, const char *sub, const char *name, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, sub);
    assert_true(mkdir(path, 0700) == 0 || errno == EEXIST);
    snprintf(path, sizeof path, "%s/%s/%s", dir, sub, name);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Write all eight pages of `locale` in dir from one text. */
static void write_all(const char *dir, const char *locale, const char *text)
{
    for (int w = 0; w < W_COUNT; w++) {
        char name[64];
        snprintf(name, sizeof name, "%s.html", all_words[w]);
        write_file(dir, locale, name, text);
    }
}

static char *escaped(const char *s)
{
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(html_escape(&b, s), DYNBUF_OK);
    char *e = strdup(dynbuf_ptr(&b));
    dynbuf_free(&b);
    return e;
}

/* ---- escaping ---- */

static void test_html_escape(void **unused)
{
    (void)unused;
    char *e = escaped("&<>\"'");
    assert_string_equal(e, "&amp;&lt;&gt;&quot;&#39;");
    free(e);
    e = escaped("Toko \"A\" & Sons <b>'s</b>");
    assert_string_equal(e, "Toko &quot;A&quot; &amp; Sons &lt;b&gt;&#39;s&lt;/b&gt;");
    free(e);
    e = escaped("plain text 123");
    assert_string_equal(e, "plain text 123");
    free(e);
    e = escaped("");
    assert_string_equal(e, "");
    free(e);
    e = escaped("Kopi \xe2\x98\x95 & caf\xc3\xa9 \xf0\x9f\x98\x80");
    assert_string_equal(e, "Kopi \xe2\x98\x95 &amp; caf\xc3\xa9 \xf0\x9f\x98\x80");
    free(e);
    e = escaped("&amp;"); /* escaped again, never interpreted */
    assert_string_equal(e, "&amp;amp;");
    free(e);
}

/* ---- render_html ---- */

static struct templates *load_ok(const char *dir, const char *fallback, const char *locale)
{
    char err[1024] = "";
    struct templates *t = templates_load(dir, fallback, locale, NULL, err, sizeof err);
    if (t == NULL)
        print_error("templates_load(%s, %s): %s\n", dir, locale, err);
    assert_non_null(t);
    return t;
}

static void test_render_substitutes_and_escapes(void **state)
{
    const char *dir = *state;
    write_all(dir, "id", "<html data-status=\"{{status}}\">[{{id}}|{{shop_name}}|{{shop_url}}|{{retry_url}}] "
                         "{ {x} } {{status}}\n</html>{{retry_url}}");
    struct templates *t = load_ok(dir, NULL, "id");
    assert_string_equal(t->locale, "id");
    struct page_vars v = {
        .id = "T1",
        .shop_name = "<script>\"'&",
        .shop_url = "https://toko.example/?a=1&b=2",
        .retry_url = "/r?id=T1&x=\"",
    };
    for (int w = 0; w < W_COUNT; w++) {
        struct dynbuf b;
        dynbuf_init(&b, 1 << 20);
        assert_int_equal(render_html(t, (enum word)w, &v, &b), DYNBUF_OK);
        char want[1024];
        snprintf(want, sizeof want,
                 "<html data-status=\"%s\">[T1|&lt;script&gt;&quot;&#39;&amp;|https://toko.example/?a=1&amp;b=2|"
                 "/r?id=T1&amp;x=&quot;] { {x} } %s\n</html>/r?id=T1&amp;x=&quot;",
                 all_words[w], all_words[w]);
        assert_string_equal(b.p, want);
        assert_int_equal(b.len, strlen(want));
        dynbuf_free(&b);
    }
    /* NULL values read as "" */
    struct page_vars none = {0};
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(render_html(t, W_CHECKING, &none, &b), DYNBUF_OK);
    assert_string_equal(b.p, "<html data-status=\"checking\">[|||] { {x} } checking\n</html>");
    dynbuf_free(&b);
    templates_free(t);
}

/* A page bigger than its buffer's ceiling is an error and no page, never
 * a page cut short (the caller answers 503). */
static void test_render_over_the_ceiling(void **state)
{
    const char *dir = *state;
    write_all(dir, "id", "<html data-status=\"{{status}}\">{{shop_name}}{{shop_name}}</html>");
    struct templates *t = load_ok(dir, NULL, "id");
    struct page_vars v = {.shop_name = "&&&&&&&&&&"}; /* 50 bytes escaped, twice */
    struct dynbuf b;
    dynbuf_init(&b, 140);
    assert_int_equal(render_html(t, W_FAILED, &v, &b), DYNBUF_OK); /* 134 bytes */
    assert_int_equal(dynbuf_len(&b), 134);
    dynbuf_free(&b);
    dynbuf_init(&b, 133);
    assert_int_equal(render_html(t, W_FAILED, &v, &b), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_len(&b), 0);
    assert_string_equal(dynbuf_ptr(&b), "");
    dynbuf_free(&b);
    dynbuf_init(&b, 20);
    assert_int_equal(html_escape(&b, "&&&&&"), DYNBUF_TOO_BIG); /* 25 bytes */
    assert_int_equal(dynbuf_len(&b), 0);
    dynbuf_free(&b);
    dynbuf_init(&b, 10);
    assert_int_equal(render_json("T1", "succeeded", true, &b), DYNBUF_TOO_BIG);
    dynbuf_free(&b);
    templates_free(t);
}

static void check_default_locale(const char *locale)
{
    struct templates *t = load_ok(TEMPLATES, NULL, locale);
    struct page_vars v = {.id = "TX<1>", .shop_name = "Toko <A> & \"B\"", .shop_url = "https://a.example/",
                          .retry_url = "?id=TX"};
    char lang[32];
    snprintf(lang, sizeof lang, "lang=\"%s\"", locale);
    for (int w = 0; w < W_COUNT; w++) {
        struct dynbuf b;
        dynbuf_init(&b, 1 << 20);
        assert_int_equal(render_html(t, (enum word)w, &v, &b), DYNBUF_OK);
        assert_non_null(b.p);
        char attr[64];
        snprintf(attr, sizeof attr, "data-status=\"%s\"", all_words[w]);
        char *html = strstr(b.p, "<html");
        assert_non_null(html);
        char *end = strchr(html, '>');
        assert_non_null(end);
        /* both on the <html> tag */
        char *a = strstr(html, attr), *l = strstr(html, lang);
        assert_true(a != NULL && a < end);
        assert_true(l != NULL && l < end);
        /* no placeholder left, nothing unescaped */
        assert_null(strstr(b.p, "{{"));
        assert_null(strstr(b.p, "<A>"));
        assert_null(strstr(b.p, "TX<1>"));
        dynbuf_free(&b);
    }
    templates_free(t);
}

static void test_default_templates(void **unused)
{
    (void)unused;
    check_default_locale("id");
    check_default_locale("en");
}

static void test_default_templates_show_values(void **unused)
{
    (void)unused;
    struct templates *t = load_ok(TEMPLATES, NULL, "id");
    struct page_vars v = {.id = "ref-12345", .shop_name = "Toko Kopi & Teh", .shop_url = "https://a.example/",
                          .retry_url = "?id=ref-12345"};
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(render_html(t, W_CHECKING, &v, &b), DYNBUF_OK);
    assert_non_null(strstr(b.p, "ref-12345"));
    assert_non_null(strstr(b.p, "Toko Kopi &amp; Teh"));
    assert_non_null(strstr(b.p, "https://a.example/"));
    dynbuf_free(&b);
    templates_free(t);
}

static void test_fallback_for_missing_pages(void **state)
{
    const char *dir = *state;
    write_file(dir, "en", "succeeded.html", "<html lang=\"en\" data-status=\"{{status}}\">CUSTOM {{shop_name}}</html>");
    struct templates *t = load_ok(dir, TEMPLATES, "en");
    struct page_vars v = {.shop_name = "S"};
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(render_html(t, W_SUCCEEDED, &v, &b), DYNBUF_OK);
    assert_string_equal(b.p, "<html lang=\"en\" data-status=\"succeeded\">CUSTOM S</html>");
    dynbuf_free(&b);
    assert_int_equal(render_html(t, W_FAILED, &v, &b), DYNBUF_OK);
    assert_null(strstr(b.p, "CUSTOM"));
    assert_non_null(strstr(b.p, "data-status=\"failed\""));
    assert_non_null(strstr(b.p, "lang=\"en\""));
    dynbuf_free(&b);
    templates_free(t);

    /* without a fallback the missing pages are an error naming the file */
    char err[1024] = "";
    t = templates_load(dir, NULL, "en", NULL, err, sizeof err);
    assert_null(t);
    assert_non_null(strstr(err, dir));
    assert_non_null(strstr(err, ".html"));
}

static void test_refuses_unknown_placeholder(void **state)
{
    const char *dir = *state;
    write_all(dir, "id", "<html data-status=\"{{status}}\">ok</html>");
    write_file(dir, "id", "failed.html", "<html data-status=\"{{status}}\">{{nope}}</html>");
    char err[1024] = "";
    struct templates *t = templates_load(dir, TEMPLATES, "id", NULL, err, sizeof err);
    assert_null(t);
    assert_non_null(strstr(err, "failed.html"));
    assert_non_null(strstr(err, dir));
    assert_non_null(strstr(err, "{{nope}}"));

    /* a near miss is unknown too */
    write_file(dir, "id", "failed.html", "<html data-status=\"{{status}}\">{{ id }}</html>");
    t = templates_load(dir, TEMPLATES, "id", NULL, err, sizeof err);
    assert_null(t);
    assert_non_null(strstr(err, "failed.html"));
}

static void test_refuses_missing_data_status(void **state)
{
    const char *dir = *state;
    write_all(dir, "id", "<html data-status=\"{{status}}\">ok</html>");
    write_file(dir, "id", "expired.html", "<html lang=\"id\">{{status}}</html>");
    char err[1024] = "";
    struct templates *t = templates_load(dir, TEMPLATES, "id", NULL, err, sizeof err);
    assert_null(t);
    assert_non_null(strstr(err, "expired.html"));
    assert_non_null(strstr(err, "data-status"));
}

static void test_refuses_bad_files(void **state)
{
    const char *dir = *state;
    char err[1024] = "";
    /* a NUL byte */
    write_all(dir, "id", "<html data-status=\"{{status}}\">ok</html>");
    char path[1024];
    snprintf(path, sizeof path, "%s/id/invalid.html", dir);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fwrite("<html data-status=\"{{status}}\">\0</html>", 1, 39, f);
    fclose(f);
    assert_null(templates_load(dir, TEMPLATES, "id", NULL, err, sizeof err));
    assert_non_null(strstr(err, "invalid.html"));

    /* 64 KiB is the most a page may be (a tenant must not make every page
     * cost megabytes): exactly that loads, one byte more is refused by name */
    static const char head[] = "<html data-status=\"{{status}}\">";
    for (long extra = 0; extra <= 1; extra++) {
        f = fopen(path, "wb");
        assert_non_null(f);
        fputs(head, f);
        for (long i = 0; i < 64 * 1024 - (long)(sizeof head - 1) + extra; i++)
            fputc('x', f);
        fclose(f);
        struct templates *t = templates_load(dir, TEMPLATES, "id", NULL, err, sizeof err);
        if (extra == 0) {
            assert_non_null(t);
            assert_int_equal(t->len[W_INVALID], 64 * 1024);
            templates_free(t);
        } else {
            assert_null(t);
            assert_non_null(strstr(err, "invalid.html: larger than 64 KiB"));
        }
    }

    /* a directory where a page should be: unreadable, not "missing" */
    remove(path);
    assert_int_equal(mkdir(path, 0700), 0);
    assert_null(templates_load(dir, TEMPLATES, "id", NULL, err, sizeof err));
    assert_non_null(strstr(err, "invalid.html"));
    rmdir(path);

    /* no such directory, no fallback */
    assert_null(templates_load("/nonexistent/kembali", NULL, "id", NULL, err, sizeof err));
    assert_non_null(strstr(err, "/nonexistent/kembali"));
}

/* ---- the streamed page ---- */

/* The last data-status="..." value in s, into out. */
static void last_status(const char *s, char *out, size_t cap)
{
    const char *last = NULL;
    for (const char *p = s; (p = strstr(p, "data-status=\"")) != NULL; p++)
        last = p + 13;
    assert_non_null(last);
    size_t n = strcspn(last, "\"");
    assert_true(n < cap);
    memcpy(out, last, n);
    out[n] = '\0';
}

static void check_stream_locale(const char *locale)
{
    struct templates *t = load_ok(TEMPLATES, NULL, locale);
    assert_true(templates_stream(t));
    struct page_vars v = {.id = "TX<1>", .shop_name = "Toko <A> & \"B\"", .shop_url = "https://a.example/",
                          .retry_url = "?id=TX"};
    struct dynbuf top;
    dynbuf_init(&top, 1 << 20);
    assert_int_equal(render_wait_top(t, &v, &top), DYNBUF_OK);
    assert_non_null(strstr(top.p, "role=\"status\""));
    assert_non_null(strstr(top.p, "TX&lt;1&gt;"));       /* the reference, escaped */
    assert_non_null(strstr(top.p, "Toko &lt;A&gt; &amp; &quot;B&quot;"));
    assert_null(strstr(top.p, "{{"));
    assert_null(strstr(top.p, "<script"));
    assert_null(strstr(top.p, "</html>"));                /* more to come */
    assert_non_null(strstr(top.p, "prefers-reduced-motion"));
    char w0[32];
    last_status(top.p, w0, sizeof w0);
    assert_string_equal(w0, "checking");
    for (int w = W_SUCCEEDED; w <= W_NOT_FOUND; w++) {
        struct dynbuf res, single;
        dynbuf_init(&res, 1 << 20);
        dynbuf_init(&single, 1 << 20);
        assert_int_equal(render_wait_result(t, (enum word)w, &v, &res), DYNBUF_OK);
        assert_int_equal(render_html(t, (enum word)w, &v, &single), DYNBUF_OK);
        assert_null(strstr(res.p, "{{"));
        assert_null(strstr(res.p, "TX<1>"));
        assert_non_null(strstr(res.p, "</html>"));
        /* the word's own card, byte for byte as on its single page */
        const char *a = strstr(single.p, "<!--card-->"), *b = strstr(single.p, "<!--/card-->");
        assert_true(a != NULL && b != NULL && b > a);
        a += strlen("<!--card-->");
        char *card = strndup(a, (size_t)(b - a));
        assert_non_null(card);
        assert_non_null(strstr(res.p, card));
        free(card);
        /* the last data-status of the whole page is its final word */
        struct dynbuf page;
        dynbuf_init(&page, 1 << 20);
        assert_int_equal(dynbuf_add(&page, top.p, top.len), DYNBUF_OK);
        assert_int_equal(dynbuf_add(&page, res.p, res.len), DYNBUF_OK);
        char last[32];
        last_status(page.p, last, sizeof last);
        assert_string_equal(last, all_words[w]);
        assert_non_null(strstr(res.p, "role=\"alert\""));
        /* the streamed page's length, as the load-time cap counts it */
        assert_int_equal(render_stream_len(t, (enum word)w, &v), page.len);
        dynbuf_free(&page);
        dynbuf_free(&res);
        dynbuf_free(&single);
    }
    dynbuf_free(&top);
    templates_free(t);
}

static void test_stream_default_templates(void **unused)
{
    (void)unused;
    check_stream_locale("id");
    check_stream_locale("en");
}

static void test_stream_custom(void **state)
{
    const char *dir = *state;
    write_all(dir, "en", "<html data-status=\"{{status}}\">x<!--card-->C {{shop_name}} {{status}}<!--/card-->y</html>");
    write_file(dir, "en", "waiting.html",
               "<html data-status=\"{{status}}\">T {{id}}{{more}}<p data-status=\"{{status}}\">{{card}}</p></html>");
    struct templates *t = load_ok(dir, NULL, "en");
    assert_true(templates_stream(t));
    struct page_vars v = {.id = "a&b", .shop_name = "<S>"};
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(render_wait_top(t, &v, &b), DYNBUF_OK);
    assert_string_equal(b.p, "<html data-status=\"checking\">T a&amp;b");
    dynbuf_free(&b);
    assert_int_equal(render_wait_result(t, W_FAILED, &v, &b), DYNBUF_OK);
    assert_string_equal(b.p, "<p data-status=\"failed\">C &lt;S&gt; failed</p></html>");
    dynbuf_free(&b);
    assert_int_equal(render_html(t, W_FAILED, &v, &b), DYNBUF_OK); /* the single page is unchanged, markers and all */
    assert_string_equal(b.p, "<html data-status=\"failed\">x<!--card-->C &lt;S&gt; failed<!--/card-->y</html>");
    dynbuf_free(&b);
    /* over its buffer's ceiling, a part is an error and holds nothing, never a part cut short */
    assert_int_equal(render_stream_len(t, W_FAILED, &v), 38 + 53);
    dynbuf_init(&b, 37);
    assert_int_equal(render_wait_top(t, &v, &b), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_len(&b), 0);
    dynbuf_free(&b);
    dynbuf_init(&b, 52);
    assert_int_equal(render_wait_result(t, W_FAILED, &v, &b), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_len(&b), 0);
    dynbuf_free(&b);
    dynbuf_init(&b, 53);
    assert_int_equal(render_wait_result(t, W_FAILED, &v, &b), DYNBUF_OK);
    dynbuf_free(&b);
    templates_free(t);

    /* a word's page without its card: single answers only */
    write_file(dir, "en", "expired.html", "<html data-status=\"{{status}}\">no card</html>");
    t = load_ok(dir, NULL, "en");
    assert_false(templates_stream(t));
    templates_free(t);

    /* {{card}} and {{more}} belong in waiting.html only */
    char err[1024] = "";
    write_file(dir, "en", "expired.html", "<html data-status=\"{{status}}\">{{card}}</html>");
    assert_null(templates_load(dir, NULL, "en", NULL, err, sizeof err));
    assert_non_null(strstr(err, "expired.html"));
    write_file(dir, "en", "expired.html", "<html data-status=\"{{status}}\"><!--card-->c<!--/card--></html>");

    /* the top must end before the result, which carries its word */
    static const char *const bad[] = {
        "<html data-status=\"{{status}}\">{{card}}{{more}}<p data-status=\"{{status}}\"></p></html>",
        "<html data-status=\"{{status}}\">{{more}}<p>{{card}}</p></html>",
        "<html data-status=\"{{status}}\"><p data-status=\"{{status}}\">{{card}}</p></html>",
        "<html data-status=\"{{status}}\">{{more}}{{more}}<p data-status=\"{{status}}\">{{card}}</p></html>",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(dir, "en", "waiting.html", bad[i]);
        err[0] = '\0';
        assert_null(templates_load(dir, NULL, "en", NULL, err, sizeof err));
        assert_non_null(strstr(err, "waiting.html"));
    }
}

/* ---- JSON ---- */

static void check_json(const char *id, const char *status, bool final)
{
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    assert_int_equal(render_json(id, status, final, &b), DYNBUF_OK);
    assert_non_null(b.p);
    json_error_t je;
    json_t *o = json_loads(b.p, 0, &je);
    if (o == NULL)
        print_error("not JSON: %s (%s)\n", b.p, je.text);
    assert_non_null(o);
    assert_true(json_is_object(o));
    assert_int_equal(json_object_size(o), 3);
    assert_string_equal(json_string_value(json_object_get(o, "id")), id);
    assert_string_equal(json_string_value(json_object_get(o, "status")), status);
    assert_true(json_is_boolean(json_object_get(o, "final")));
    assert_int_equal(json_is_true(json_object_get(o, "final")), final);
    /* ASCII only: safe whatever charset the client assumes */
    for (const char *p = b.p; *p; p++)
        assert_true((unsigned char)*p < 0x80);
    json_decref(o);
    dynbuf_free(&b);
}

/* render_html_len is the length render_html gives, escaping included,
 * on every page and for every kind of value. */
static void test_render_len_is_the_rendered_length(void **state)
{
    const char *dir = *state;
    write_all(dir, "id", "<html data-status=\"{{status}}\">{{id}} {{shop_name}}{{shop_name}} <a href=\"{{shop_url}}\">"
                         "{{retry_url}}</a>{{status}}</html>");
    struct templates *t = load_ok(dir, NULL, "id");
    const struct page_vars vars[] = {
        {.id = "T1", .shop_name = "Toko <A> & \"B\" 'C'", .shop_url = "https://x/?a=1&b=2", .retry_url = "?id=T1"},
        {.id = NULL, .shop_name = NULL, .shop_url = NULL, .retry_url = NULL},
        {.id = "", .shop_name = "caf\xc3\xa9", .shop_url = "&&&&", .retry_url = "'"},
    };
    char retry[128];
    render_retry_url(retry, sizeof retry, "order", "T-9");
    assert_string_equal(retry, "?order=T-9");
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        for (int w = 0; w < W_COUNT; w++) {
            struct dynbuf b;
            dynbuf_init(&b, 1 << 20);
            assert_int_equal(render_html(t, (enum word)w, &vars[i], &b), DYNBUF_OK);
            assert_int_equal(render_html_len(t, (enum word)w, &vars[i]), b.len);
            dynbuf_free(&b);
        }
    templates_free(t);
    t = load_ok(TEMPLATES, NULL, "en");
    for (int w = 0; w < W_COUNT; w++) {
        struct dynbuf b;
        dynbuf_init(&b, 1 << 20);
        assert_int_equal(render_html(t, (enum word)w, &vars[0], &b), DYNBUF_OK);
        assert_int_equal(render_html_len(t, (enum word)w, &vars[0]), b.len);
        dynbuf_free(&b);
    }
    templates_free(t);
}

static void test_render_json(void **unused)
{
    (void)unused;
    check_json("T1", "succeeded", true);
    check_json("T-2_x", "pending", false);
    check_json("a\"b\\c</script>", "unknown", false);
    check_json("line\nbreak\t\x01", "refunded", false);
    check_json("caf\xc3\xa9", "expired", true);
    check_json("", "unknown", false);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_html_escape),
        cmocka_unit_test_setup_teardown(test_render_substitutes_and_escapes, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_render_over_the_ceiling, setup_dir, teardown_dir),
        cmocka_unit_test(test_default_templates),
        cmocka_unit_test(test_default_templates_show_values),
        cmocka_unit_test_setup_teardown(test_fallback_for_missing_pages, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_refuses_unknown_placeholder, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_refuses_missing_data_status, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_refuses_bad_files, setup_dir, teardown_dir),
        cmocka_unit_test_setup_teardown(test_render_len_is_the_rendered_length, setup_dir, teardown_dir),
        cmocka_unit_test(test_render_json),
        cmocka_unit_test(test_stream_default_templates),
        cmocka_unit_test_setup_teardown(test_stream_custom, setup_dir, teardown_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
