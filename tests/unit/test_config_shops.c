/* test_config_shops.c - unit tests of src/config_shops.c: the shops
 * directory and its tenant files, who holds a host, reloads, and the shop
 * a request is for. */
#include "config_fixture.h"

static struct config *two_shops(void)
{
    return expect_ok(load_fmt(
        HEAD "\"shops\": [{\"id\": \"toko-a\", \"hosts\": [\"toko-a.example\", \"www.toko-a.example\"], "
             "\"secret_key_file\": \"%s/key_a\"}, {\"id\": \"toko_b\", \"hosts\": [\"b.example\"], "
             "\"secret_key_file\": \"%s/key_b\"}]}",
        g_dir, g_dir));
}

static void expect_pick(const struct config *c, const char *param, const char *host, const char *want)
{
    const struct shop *s = config_pick_shop(c, param, host);
    if (want == NULL) {
        if (s != NULL)
            print_error("pick(%s, %s) gave %s\n", param ? param : "NULL", host ? host : "NULL", s->id);
        assert_null(s);
    } else {
        if (s == NULL)
            print_error("pick(%s, %s) gave nothing\n", param ? param : "NULL", host ? host : "NULL");
        assert_non_null(s);
        assert_string_equal(s->id, want);
    }
}

static void test_hosts_urls_origins(void **unused)
{
    (void)unused;
    char shop[512];
    /* a control byte, a space or raw UTF-8 would make the host registry
     * unreadable for every tenant (one word a line, printable ASCII) */
    const char *bad_hosts[] = {"[\"toko.example:8080\"]", "[\"https://toko.example\"]", "[\"\"]", "[5]", "\"toko.example\"",
                               "[\"toko\\nexample\"]", "[\"toko example\"]", "[\"t\u00f6ko.example\"]",
                               "[\"toko\\u0001.example\"]"};
    for (size_t i = 0; i < sizeof bad_hosts / sizeof bad_hosts[0]; i++) {
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"hosts\": %s", g_dir, bad_hosts[i]);
        expect_error(load_one_shop(shop), g_cfg, "shops[0].hosts", NULL);
    }
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"shop_url\": \"javascript:alert(1)\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].shop_url", NULL);
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"cors_origins\": [\"https://a.example/path\"]", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].cors_origins", NULL);
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"cors_origins\": \"https://a.example\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].cors_origins", NULL);
}

static void test_shops_dir(void **unused)
{
    (void)unused;
    make_keys_dir();
    put_tenant_key("shop-a", "sk_test_aaa");
    put_tenant_key("shop-b", "sk_test_bbb");
    put_tenant_key("shop-d", "sk_test_ddd");
    make_dir("shops_ok");
    /* shops_dir/NAME.json is the shop NAME, its key keys_dir/NAME: id and
     * secret_key_file may be left out, or must say just that */
    put_tenant("shops_ok", "shop-b", "\"id\": \"shop-b\", \"hosts\": [\"b.example\"], \"secret_key_file\": "
               "\"%s/keys/../keys/shop-b\"", g_dir);
    put_tenant("shops_ok", "shop-a", "\"hosts\": [\"a.example\"]");
    put_file("shops_ok/notes.txt", "not a shop");
    put_file("shops_ok/.hidden.json", "{ broken");
    put_file("shops_ok/shop-a.json.bak", "{ broken");
    struct config *c = expect_ok(load_dir("shops_ok", NULL));
    assert_int_equal(c->nshops, 2);
    assert_int_equal(c->nskipped, 0);
    assert_string_equal(c->shops[0].id, "shop-a"); /* name order */
    assert_string_equal(c->shops[1].id, "shop-b");
    assert_string_equal(c->shops[0].secret, "sk_test_aaa");
    assert_string_equal(c->shops[1].secret, "sk_test_bbb");
    assert_non_null(strstr(c->shops[0].source, "shops_ok/shop-a.json"));
    config_unref(c);

    /* together with inline shops */
    c = expect_ok(load_dir("shops_ok", "\"shops\": [{\"id\": \"inline\", \"secret_key_env\": \"KEMBALI_TEST_KEY_B\"}]"));
    assert_int_equal(c->nshops, 3);
    assert_string_equal(c->shops[0].id, "inline");
    assert_null(c->shops[0].source);
    config_unref(c);

    /* a broken file is skipped and named, with its line; the others load */
    make_dir("shops_bad");
    put_tenant("shops_bad", "shop-a", "\"hosts\": [\"a.example\"]");
    put_file("shops_bad/shop-c.json", "{\n  \"id\": \"shop-c\",\n  \"hosts\": [\"c.example\"\n}\n");
    c = expect_ok(load_dir("shops_bad", NULL));
    assert_int_equal(c->nshops, 1);
    assert_string_equal(c->shops[0].id, "shop-a");
    const struct config_skip *k = skipped(c, "shops_bad/shop-c.json");
    assert_non_null(strstr(k->why, "line"));
    assert_false(k->kept);
    assert_null(k->collides);
    config_unref(c);

    /* a bad key in a shop file is named with that file */
    make_dir("shops_key");
    put_tenant("shops_key", "shop-d", "\"locale\": \"fr\"");
    c = expect_ok(load_dir("shops_key", "\"shops\": [{\"id\": \"inline\", \"secret_key_env\": \"KEMBALI_TEST_KEY_B\"}]"));
    k = skipped(c, "shops_key/shop-d.json");
    assert_non_null(strstr(k->why, "shops_key/shop-d.json: locale"));
    config_unref(c);

    /* a shop file taking an id of the inline list: that file is skipped,
     * naming the shop it collided with */
    c = expect_ok(load_dir("shops_ok", "\"shops\": [{\"id\": \"shop-a\", \"secret_key_env\": \"KEMBALI_TEST_KEY_B\"}]"));
    assert_int_equal(c->nshops, 2);
    k = skipped(c, "shops_ok/shop-a.json");
    assert_non_null(strstr(k->why, "the id \"shop-a\" is the id of a shop of the main configuration"));
    assert_string_equal(k->collides, "shop-a");
    config_unref(c);

    /* a file's id is its name: another id is refused; so is every other
     * *.json name (named, never loaded) */
    make_dir("shops_names");
    put_tenant("shops_names", "shop-a", "\"id\": \"shop-b\", \"hosts\": [\"b.example\"]");
    put_tenant("shops_names", "Shop B", "\"locale\": \"id\"");
    put_tenant("shops_names", "shop.b", "\"locale\": \"id\"");
    put_tenant("shops_names", "x1234567890123456789012345678901234567890123456789012345678901234", "\"locale\": \"id\"");
    put_tenant("shops_names", "shop-b", "\"locale\": \"id\"");
    c = expect_ok(load_dir("shops_names", NULL));
    assert_int_equal(c->nshops, 1);
    assert_string_equal(c->shops[0].id, "shop-b");
    assert_int_equal(c->nskipped, 4);
    k = skipped(c, "shops_names/shop-a.json");
    assert_non_null(strstr(k->why, "shops_names/shop-a.json: id: \"shop-b\" is not the file's name"));
    const char *bad_names[] = {"Shop B", "shop.b", "x1234567890123456789012345678901234567890123456789012345678901234"};
    for (size_t i = 0; i < 3; i++) {
        char rel[200];
        snprintf(rel, sizeof rel, "shops_names/%s.json", bad_names[i]);
        k = skipped(c, rel);
        assert_non_null(strstr(k->why, rel));
        assert_non_null(strstr(k->why, "not loaded: a shop file is named NAME.json"));
        assert_false(k->kept);
    }
    config_unref(c);

    /* a missing folder is the main configuration's error */
    expect_error(load_dir("no_such_dir", NULL), g_cfg, "shops_dir", "no_such_dir");
    /* shops_dir needs keys_dir, and keys_dir must exist */
    expect_error(load_fmt(HEAD "\"shops_dir\": \"%s/shops_ok\"}", g_dir), g_cfg, "keys_dir", "required");
    expect_error(load_fmt(HEAD "\"keys_dir\": \"%s/no_keys\", \"shops_dir\": \"%s/shops_ok\"}", g_dir, g_dir), g_cfg,
                 "keys_dir", "no_keys");
}

/* One tenant's typo: that file is skipped with its name and the reason,
 * every other shop loads. */
static void test_shop_file_typo_others_load(void **unused)
{
    (void)unused;
    make_keys_dir();
    make_dir("shops_typo");
    char text[512];
    const char *ids[] = {"t1", "t2", "t3", "t4"};
    for (size_t i = 0; i < 4; i++) {
        snprintf(text, sizeof text, "{\"id\": \"%s\"%s}", ids[i], i == 2 ? ", \"read_budget_per_mnute\": 60" : "");
        char rel[64];
        snprintf(rel, sizeof rel, "shops_typo/%s.json", ids[i]);
        put_file(rel, text);
        put_tenant_key(ids[i], "sk_test_aaa");
    }
    struct config *c = expect_ok(load_dir("shops_typo", NULL));
    assert_int_equal(c->nshops, 3);
    assert_int_equal(c->nskipped, 1);
    const struct config_skip *k = skipped(c, "shops_typo/t3.json");
    assert_non_null(strstr(k->why, "read_budget_per_mnute: unknown key"));
    assert_null(config_pick_shop(c, "t3", NULL));
    assert_non_null(config_pick_shop(c, "t4", NULL));
    assert_null(strstr(k->why, "sk_test_aaa"));
    config_unref(c);
}

/* A shop file may not use secret_key_env, nor set templates_dir outside
 * shop_templates_root (nor at all without it). */
static void test_shop_file_tenant_rules(void **unused)
{
    (void)unused;
    make_keys_dir();
    make_dir("shops_env");
    put_file("shops_env/env.json", "{\"id\": \"env\", \"secret_key_env\": \"KEMBALI_TEST_KEY_B\"}");
    char text[600];
    put_tenant_key("fine", "sk_test_fine");
    put_file("shops_env/fine.json", "{}");
    struct config *c = expect_ok(load_dir("shops_env", NULL));
    assert_int_equal(c->nshops, 1);
    const struct config_skip *k = skipped(c, "shops_env/env.json");
    assert_non_null(strstr(k->why, "secret_key_env"));
    assert_null(strstr(k->why, "sk_env_bbb"));
    config_unref(c);

    /* tenants' templates: root/<tenant>/<locale>/<word>.html */
    make_dir("troot");
    make_dir("troot/t1");
    make_dir("troot/t1/id");
    put_file("troot/t1/id/failed.html", "<html data-status=\"{{status}}\">T1 GAGAL</html>");
    make_dir("troot/t2");
    make_dir("troot/t2/id");
    char link[512], target[512];
    snprintf(link, sizeof link, "%s/troot/t2/id/failed.html", g_dir);
    snprintf(target, sizeof target, "%s/outside_page.html", g_dir);
    put_file("outside_page.html", "<html data-status=\"{{status}}\">SECRET PAGE</html>");
    unlink(link);
    assert_int_equal(symlink(target, link), 0); /* a page linking out of the root */
    make_dir("tout");
    make_dir("tout/id");
    snprintf(link, sizeof link, "%s/troot/t3", g_dir);
    snprintf(target, sizeof target, "%s/tout", g_dir);
    unlink(link);
    assert_int_equal(symlink(target, link), 0); /* a folder linking out of the root */

    make_dir("shops_tpl");
    const struct {
        const char *file, *dir;
        bool ok;
    } cases[] = {
        {"shops_tpl/ok.json", "troot/t1", true},
        {"shops_tpl/outside.json", "tout", false},
        {"shops_tpl/dotdot.json", "troot/t1/../../tout", false},
        {"shops_tpl/root.json", "troot", false},
        {"shops_tpl/pagelink.json", "troot/t2", false},
        {"shops_tpl/dirlink.json", "troot/t3", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(text, sizeof text, "{\"templates_dir\": \"%s/%s\"}", g_dir, cases[i].dir);
        put_file(cases[i].file, text);
        char name[64];
        snprintf(name, sizeof name, "%s", strchr(cases[i].file, '/') + 1);
        *strrchr(name, '.') = '\0';
        put_tenant_key(name, "sk_test_aaa");
    }
    char more[300];
    snprintf(more, sizeof more, "\"shop_templates_root\": \"%s/troot\"", g_dir);
    c = expect_ok(load_dir("shops_tpl", more));
    assert_int_equal(c->nshops, 1);
    assert_int_equal(c->nskipped, 5);
    for (size_t i = 1; i < sizeof cases / sizeof cases[0]; i++) {
        k = skipped(c, cases[i].file);
        assert_non_null(strstr(k->why, "templates_dir"));
        assert_null(strstr(k->why, "SECRET PAGE"));
    }
    assert_non_null(strstr(skipped(c, "shops_tpl/pagelink.json")->why, "outside"));
    const struct shop *s = config_pick_shop(c, "ok", NULL);
    assert_non_null(s);
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    struct page_vars v = {.id = "T1"};
    assert_int_equal(render_html(s->tpl, W_FAILED, &v, &b), DYNBUF_OK);
    assert_string_equal(b.p, "<html data-status=\"failed\">T1 GAGAL</html>");
    dynbuf_free(&b);
    config_unref(c);

    /* without shop_templates_root, a shop file cannot set templates_dir */
    c = expect_ok(load_dir("shops_tpl", NULL));
    assert_int_equal(c->nshops, 0);
    k = skipped(c, "shops_tpl/ok.json");
    assert_non_null(strstr(k->why, "shop_templates_root"));
    config_unref(c);
    /* the main configuration's shops are trusted */
    c = expect_ok(load_fmt(HEAD "\"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/keys/a\", \"templates_dir\": "
                                "\"%s/tout\"}]}", g_dir, g_dir));
    config_unref(c);
    /* a shop_templates_root that does not exist */
    expect_error(load_dir("shops_tpl", "\"shop_templates_root\": \"/nonexistent/root\""), g_cfg,
                 "shop_templates_root", "/nonexistent/root");
}

/* A reload with one broken shop file: that shop keeps its previous version
 * (key, templates), the others load anew. */
static void test_reload_keeps_previous_version(void **unused)
{
    (void)unused;
    make_keys_dir();
    make_dir("shops_rl");
    char text[600];
    put_tenant_key("ra", "sk_test_aaa");
    put_tenant_key("rb", "sk_test_bbb");
    snprintf(text, sizeof text, "{\"id\": \"ra\", \"name\": \"A old\", \"hosts\": [\"ra.example\"], "
                                "\"secret_key_file\": \"%s/keys/ra\"}", g_dir);
    put_file("shops_rl/ra.json", text);
    put_file("shops_rl/rb.json", "{\"name\": \"B old\"}");
    struct config *old = expect_ok(load_dir("shops_rl", NULL));
    assert_int_equal(old->nshops, 2);

    snprintf(text, sizeof text, "{\"id\": \"ra\", \"name\": \"A new\", \"hosts\": [\"ra.example\"], "
                                "\"secret_key_file\": \"%s/keys/ra\", \"colour\": 1}", g_dir);
    put_file("shops_rl/ra.json", text);
    put_file("shops_rl/rb.json", "{\"name\": \"B new\"}");
    put_file("shops_rl/rc.json", "{\"id\": \"rc\"");
    memset(g_err, 0, sizeof g_err);
    struct config *c = config_reload(g_cfg, old, g_err, sizeof g_err);
    expect_ok(c);
    config_unref(old); /* the kept version must not depend on the old configuration */
    assert_int_equal(c->nshops, 2);
    const struct shop *a = config_pick_shop(c, "ra", NULL), *b = config_pick_shop(c, "rb", NULL);
    assert_non_null(a);
    assert_non_null(b);
    assert_string_equal(a->name, "A old");
    assert_string_equal(a->secret, "sk_test_aaa");
    assert_ptr_equal(config_pick_shop(c, NULL, "ra.example"), a);
    assert_string_equal(b->name, "B new");
    assert_true(skipped(c, "shops_rl/ra.json")->kept);
    assert_false(skipped(c, "shops_rl/rc.json")->kept); /* new and broken: nothing to keep */
    struct dynbuf buf;
    dynbuf_init(&buf, 1 << 20);
    struct page_vars v = {.id = "T1"};
    assert_int_equal(render_html(a->tpl, W_SUCCEEDED, &v, &buf), DYNBUF_OK);
    assert_non_null(strstr(buf.p, "data-status=\"succeeded\""));
    dynbuf_free(&buf);

    /* and again: still the old version, still kept */
    struct config *c2 = config_reload(g_cfg, c, g_err, sizeof g_err);
    expect_ok(c2);
    config_unref(c);
    a = config_pick_shop(c2, "ra", NULL);
    assert_non_null(a);
    assert_string_equal(a->name, "A old");
    /* a broken main configuration is refused as a whole */
    FILE *f = fopen(g_cfg, "w");
    assert_non_null(f);
    fputs("{\"shops_dir\": 5}", f);
    fclose(f);
    expect_error(config_reload(g_cfg, c2, g_err, sizeof g_err), g_cfg, "shops_dir", NULL);
    config_unref(c2);
}

/* A tenant's key is keys_dir/NAME and nothing else: a file naming another
 * tenant's key, a key file that is a link (two tenants would share a key),
 * a missing one, or the key of a shop of the main configuration is
 * skipped, naming the shop it collided with where there is one. */
static void test_tenant_key_is_its_own(void **unused)
{
    (void)unused;
    make_keys_dir();
    put_tenant_key("toko-a", "sk_test_tokoa");
    put_tenant_key("toko-b", "sk_test_tokob");
    put_tenant_key("owner", "sk_test_owner");
    char link[512];
    snprintf(link, sizeof link, "%s/keys/toko-l", g_dir);
    unlink(link);
    assert_int_equal(symlink("toko-a", link), 0); /* keys_dir/toko-l -> toko-a: sharing a key */
    make_dir("shops_keys");
    put_tenant("shops_keys", "toko-a", "\"hosts\": [\"a.example\"]");
    put_tenant("shops_keys", "toko-b", "\"secret_key_file\": \"%s/keys/toko-a\"", g_dir);
    put_tenant("shops_keys", "toko-l", "\"hosts\": [\"l.example\"]");
    put_tenant("shops_keys", "toko-m", "\"hosts\": [\"m.example\"]");
    put_tenant("shops_keys", "owner", "\"hosts\": [\"o.example\"]");
    char more[300];
    snprintf(more, sizeof more, "\"shops\": [{\"id\": \"main\", \"secret_key_file\": \"%s/keys/owner\"}]", g_dir);
    struct config *c = expect_ok(load_dir("shops_keys", more));
    assert_int_equal(c->nshops, 2);
    assert_string_equal(c->shops[0].id, "main");
    assert_string_equal(c->shops[1].id, "toko-a");
    assert_string_equal(c->shops[1].secret, "sk_test_tokoa");
    assert_int_equal(c->nskipped, 4);
    const struct config_skip *k = skipped(c, "shops_keys/toko-b.json");
    assert_non_null(strstr(k->why, "toko-b.json: secret_key_file: names"));
    assert_non_null(strstr(k->why, "keys/toko-a, but the shop file toko-b.json may only use"));
    k = skipped(c, "shops_keys/toko-l.json");
    assert_non_null(strstr(k->why, "keys/toko-l is a symbolic link"));
    k = skipped(c, "shops_keys/toko-m.json");
    assert_non_null(strstr(k->why, "keys/toko-m"));
    k = skipped(c, "shops_keys/owner.json");
    assert_non_null(strstr(k->why, "is the key file of shop \"main\" of the main configuration"));
    assert_string_equal(k->collides, "main");
    for (int i = 0; i < c->nskipped; i++)
        assert_null(strstr(c->skipped[i].why, "sk_test"));
    config_unref(c);
}

/* Hosts stay with the shop that has them: a file of the main
 * configuration's host, or of a host another tenant served before this
 * reload, is skipped whatever its name sorts as, naming that shop; two new
 * files claiming one host both wait; a host given up in the same reload
 * moves. */
static void test_tenant_hosts_never_taken_over(void **unused)
{
    (void)unused;
    make_keys_dir();
    const char *names[] = {"00-evil", "toko-b", "toko-c", "toko-d", "zz-late"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        put_tenant_key(names[i], "sk_test_tenant");
    make_dir("shops_hosts");
    put_tenant("shops_hosts", "toko-b", "\"name\": \"B v1\", \"hosts\": [\"b.example\", \"www.b.example\"]");
    put_tenant("shops_hosts", "toko-c", "\"hosts\": [\"c.example\"]");
    put_tenant("shops_hosts", "toko-d", "\"hosts\": [\"d.example\", \"main.example\"]");
    char more[300];
    snprintf(more, sizeof more, "\"shops\": [{\"id\": \"main\", \"hosts\": [\"main.example\"], "
                                "\"secret_key_file\": \"%s/keys/a\"}]", g_dir);
    struct config *c1 = expect_ok(load_dir("shops_hosts", more));
    expect_pick(c1, NULL, "b.example", "toko-b");
    expect_pick(c1, NULL, "main.example", "main");
    const struct config_skip *k = skipped(c1, "shops_hosts/toko-d.json");
    assert_non_null(strstr(k->why, "hosts: the host \"main.example\" is served by shop \"main\" of the main "
                                   "configuration"));
    assert_string_equal(k->collides, "main");
    expect_pick(c1, NULL, "d.example", NULL);

    /* a reload: 00-evil sorts first and claims toko-b's host; zz-late
     * claims toko-c's; toko-c gives c.example up for cc.example */
    put_tenant("shops_hosts", "00-evil", "\"name\": \"EVIL\", \"hosts\": [\"www.b.example\"]");
    put_tenant("shops_hosts", "zz-late", "\"hosts\": [\"c.example\"]");
    put_tenant("shops_hosts", "toko-c", "\"hosts\": [\"cc.example\", \"CC.example.\"]"); /* one host, twice */
    put_tenant("shops_hosts", "toko-d", "\"hosts\": [\"d.example\"]");
    memset(g_err, 0, sizeof g_err);
    struct config *c2 = expect_ok(config_reload(g_cfg, c1, g_err, sizeof g_err));
    config_unref(c1);
    expect_pick(c2, NULL, "www.b.example", "toko-b");
    assert_string_equal(config_pick_shop(c2, "toko-b", NULL)->name, "B v1");
    k = skipped(c2, "shops_hosts/00-evil.json");
    assert_non_null(strstr(k->why, "00-evil.json: hosts: the host \"www.b.example\" is held by shop \"toko-b\""));
    assert_string_equal(k->collides, "toko-b");
    assert_false(k->kept);
    expect_pick(c2, "00-evil", NULL, NULL);
    expect_pick(c2, NULL, "c.example", "zz-late"); /* toko-c gave it up in this reload */
    expect_pick(c2, NULL, "cc.example", "toko-c");
    expect_pick(c2, NULL, "d.example", "toko-d");
    assert_int_equal(c2->nskipped, 1);

    /* toko-b's file breaks: its kept version keeps its hosts against a
     * newcomer, and a newcomer's file never gains them */
    put_file("shops_hosts/toko-b.json", "{\"hosts\": [");
    memset(g_err, 0, sizeof g_err);
    struct config *c3 = expect_ok(config_reload(g_cfg, c2, g_err, sizeof g_err));
    expect_pick(c3, NULL, "www.b.example", "toko-b");
    assert_true(skipped(c3, "shops_hosts/toko-b.json")->kept);
    assert_string_equal(skipped(c3, "shops_hosts/00-evil.json")->collides, "toko-b");

    /* zz-late's new version wants toko-d's host too: it collides, and its
     * previous version (c.example) keeps serving */
    put_tenant("shops_hosts", "zz-late", "\"hosts\": [\"c.example\", \"d.example\"]");
    memset(g_err, 0, sizeof g_err);
    struct config *c4 = expect_ok(config_reload(g_cfg, c3, g_err, sizeof g_err));
    config_unref(c2);
    config_unref(c3);
    k = skipped(c4, "shops_hosts/zz-late.json");
    assert_true(k->kept);
    assert_string_equal(k->collides, "toko-d");
    expect_pick(c4, NULL, "c.example", "zz-late");
    expect_pick(c4, NULL, "d.example", "toko-d");
    config_unref(c4);

    /* at a start nobody had a host: two files claiming one both wait,
     * whatever their names sort as (each names the other) */
    put_tenant("shops_hosts", "toko-b", "\"hosts\": [\"b.example\", \"www.b.example\"]");
    put_tenant("shops_hosts", "zz-late", "\"hosts\": [\"c.example\"]");
    struct config *c5 = expect_ok(load_dir("shops_hosts", more));
    expect_pick(c5, NULL, "www.b.example", NULL);
    expect_pick(c5, NULL, "b.example", NULL);
    assert_string_equal(skipped(c5, "shops_hosts/00-evil.json")->collides, "toko-b");
    k = skipped(c5, "shops_hosts/toko-b.json");
    assert_string_equal(k->collides, "00-evil");
    assert_non_null(strstr(k->why, "the host \"www.b.example\" is also claimed by shop \"00-evil\""));
    expect_pick(c5, NULL, "c.example", "zz-late");
    config_unref(c5);
}

/* A broken file (its key missing) keeps and claims the hosts it lists: a
 * newcomer listing the same host never gets it, at a start or later. */
static void test_broken_tenant_claims_its_hosts(void **unused)
{
    (void)unused;
    make_keys_dir();
    put_tenant_key("sq-evil", "sk_test_evil");
    make_dir("shops_sq");
    put_tenant("shops_sq", "sq-victim", "\"hosts\": [\"a.example\"]"); /* keys/sq-victim missing */
    put_tenant("shops_sq", "sq-evil", "\"name\": \"EVIL\", \"hosts\": [\"a.example\", \"evil.example\"]");
    struct config *c = expect_ok(load_dir("shops_sq", NULL));
    expect_pick(c, NULL, "a.example", NULL);
    expect_pick(c, NULL, "evil.example", NULL);
    const struct config_skip *k = skipped(c, "shops_sq/sq-evil.json");
    assert_string_equal(k->collides, "sq-victim");
    assert_non_null(strstr(k->why, "the host \"a.example\" is also claimed by shop \"sq-victim\""));
    assert_null(hostreg_holder(&c->held, "a.example"));
    assert_string_equal(hostreg_holder(&c->contested, "a.example"), "sq-evil and sq-victim");
    assert_string_equal(hostreg_holder(&c->held, "evil.example"), "sq-evil");
    config_unref(c);
}

/* Two shops with different keys may not share a notify secret: the later
 * file is skipped naming the first (a shop that served before comes
 * first, whatever the names sort as); the same key may share it. */
static void test_tenant_notify_secret_is_its_own(void **unused)
{
    (void)unused;
    make_keys_dir();
    put_tenant_key("nz-first", "sk_test_first");
    put_tenant_key("na-late", "sk_test_late");
    put_tenant_key("nb-same", "sk_test_first");
    put_file("keys/nz-first.notify", "whsec_one\n");
    put_file("keys/na-late.notify", "whsec_one\n");
    put_file("keys/nb-same.notify", "whsec_one\n");
    make_dir("shops_notify");
    put_tenant("shops_notify", "nz-first", "\"hosts\": [\"z.example\"]");
    struct config *c1 = expect_ok(load_dir("shops_notify", NULL));
    expect_pick(c1, NULL, "z.example", "nz-first");
    put_tenant("shops_notify", "na-late", "\"hosts\": [\"a.example\"]");
    put_tenant("shops_notify", "nb-same", "\"hosts\": [\"b.example\"]");
    memset(g_err, 0, sizeof g_err);
    struct config *c2 = expect_ok(config_reload(g_cfg, c1, g_err, sizeof g_err));
    config_unref(c1);
    expect_pick(c2, NULL, "z.example", "nz-first");
    expect_pick(c2, NULL, "a.example", NULL);
    expect_pick(c2, NULL, "b.example", "nb-same");
    const struct config_skip *k = skipped(c2, "shops_notify/na-late.json");
    assert_string_equal(k->collides, "nz-first");
    assert_non_null(strstr(k->why, "notify_secret_file: the notify secret is the one of shop \"nz-first\""));
    assert_null(strstr(k->why, "whsec_one"));
    assert_int_equal(c2->nskipped, 1);
    config_unref(c2);

    /* in `shops`: refused, naming both */
    char more[600];
    snprintf(more, sizeof more, "\"shops\": [{\"id\": \"m1\", \"secret_key_file\": \"%s/keys/nz-first\", "
             "\"notify_secret_file\": \"%s/keys/nz-first.notify\"}, {\"id\": \"m2\", \"secret_key_file\": "
             "\"%s/keys/na-late\", \"notify_secret_file\": \"%s/keys/na-late.notify\"}]", g_dir, g_dir, g_dir, g_dir);
    make_dir("shops_notify_none");
    expect_error(load_dir("shops_notify_none", more), g_cfg, "shops",
                 "shops \"m1\" and \"m2\" have different keys and one notify secret");
}

/* Rule 3 of "Which shop": the only shop answers any host only without
 * shops_dir (a hosting box never answers one tenant's host with another
 * tenant's shop). */
static void test_pick_no_fallback_with_shops_dir(void **unused)
{
    (void)unused;
    make_keys_dir();
    put_tenant_key("solo", "sk_test_solo");
    make_dir("shops_solo");
    put_tenant("shops_solo", "solo", "\"hosts\": [\"solo.example\"]");
    struct config *c = expect_ok(load_dir("shops_solo", NULL));
    assert_int_equal(c->nshops, 1);
    expect_pick(c, NULL, "solo.example", "solo");
    expect_pick(c, NULL, "other.example", NULL);
    expect_pick(c, NULL, NULL, NULL);
    expect_pick(c, "solo", "other.example", "solo");
    config_unref(c);
    /* one inline shop and an empty shops_dir: no fallback either */
    make_dir("shops_none_here");
    c = expect_ok(load_dir("shops_none_here", "\"shops\": [{\"id\": \"only\", \"secret_key_env\": "
                                                "\"KEMBALI_TEST_KEY_B\"}]"));
    assert_int_equal(c->nshops, 1);
    expect_pick(c, NULL, "any.example", NULL);
    expect_pick(c, NULL, NULL, NULL);
    config_unref(c);
}

/* Found by fuzz_config: a shops_dir without any *.json file sorted a NULL
 * list (qsort(NULL, 0, ...): undefined behaviour, caught by UBSan). */
static void test_shops_dir_empty(void **unused)
{
    (void)unused;
    make_dir("shops_empty");
    make_dir("shops_none");
    put_file("shops_none/readme.txt", "no shop here");
    struct config *c = expect_ok(load_fmt(HEAD "\"shops\": [{\"id\": \"inline\", \"secret_key_env\": "
                                                "\"KEMBALI_TEST_KEY_B\"}], \"keys_dir\": \"%s\", "
                                                "\"shops_dir\": \"%s/shops_empty\"}",
                                          g_dir, g_dir));
    assert_int_equal(c->nshops, 1);
    config_unref(c);
    expect_error(load_fmt(HEAD "\"keys_dir\": \"%s\", \"shops_dir\": \"%s/shops_empty\"}", g_dir, g_dir), g_cfg,
                 "shops", "no shop");
    expect_error(load_fmt(HEAD "\"keys_dir\": \"%s\", \"shops_dir\": \"%s/shops_none\"}", g_dir, g_dir), g_cfg,
                 "shops", "no shop");
}

static void test_pick_shop(void **unused)
{
    (void)unused;
    struct config *c = two_shops();
    /* KEMBALI_SHOP first */
    expect_pick(c, "toko_b", "toko-a.example", "toko_b");
    expect_pick(c, "toko-a", NULL, "toko-a");
    expect_pick(c, "nope", "toko-a.example", NULL);
    expect_pick(c, "TOKO-A", NULL, NULL); /* ids are exact */
    /* then the host: port removed, case-insensitive, trailing dot */
    expect_pick(c, NULL, "toko-a.example", "toko-a");
    expect_pick(c, "", "b.example", "toko_b");
    expect_pick(c, NULL, "TOKO-A.Example:8443", "toko-a");
    expect_pick(c, NULL, "www.toko-a.example:80", "toko-a");
    expect_pick(c, NULL, "toko-a.example.", "toko-a");
    expect_pick(c, NULL, "B.EXAMPLE.:443", "toko_b");
    /* no match with two shops */
    expect_pick(c, NULL, "c.example", NULL);
    expect_pick(c, NULL, "toko-a.example.evil", NULL);
    expect_pick(c, NULL, "", NULL);
    expect_pick(c, NULL, NULL, NULL);
    expect_pick(c, NULL, "[::1]:8080", NULL);
    char longhost[600];
    memset(longhost, 'a', sizeof longhost - 1);
    longhost[sizeof longhost - 1] = '\0';
    expect_pick(c, NULL, longhost, NULL);
    config_unref(c);
}

static void test_pick_single_shop(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_fmt(HEAD "\"shops\": [{\"id\": \"only\", \"hosts\": [\"only.example\"], "
                                               "\"secret_key_file\": \"%s/key_a\"}]}",
                                          g_dir));
    expect_pick(c, NULL, "only.example", "only");
    expect_pick(c, NULL, "anything.example", "only");
    expect_pick(c, NULL, NULL, "only");
    expect_pick(c, NULL, "[2001:db8::1]:443", "only");
    expect_pick(c, "other", "only.example", NULL); /* a named shop we do not have */
    config_unref(c);
}

/* The host matching of config_pick_shop on bracketed IPv6 literals. */
static void test_pick_ipv6_host_matching(void **unused)
{
    (void)unused;
    struct shop shops[2];
    memset(shops, 0, sizeof shops);
    char h1[] = "[2001:db8::1]", h2[] = "b.example";
    snprintf(shops[0].id, sizeof shops[0].id, "v6");
    shops[0].hosts[0] = h1;
    shops[0].nhosts = 1;
    snprintf(shops[1].id, sizeof shops[1].id, "b");
    shops[1].hosts[0] = h2;
    shops[1].nhosts = 1;
    struct config c;
    memset(&c, 0, sizeof c);
    c.shops = shops;
    c.nshops = 2;
    expect_pick(&c, NULL, "[2001:db8::1]", "v6");
    expect_pick(&c, NULL, "[2001:DB8::1]:8443", "v6");
    expect_pick(&c, NULL, "[2001:db8::2]:8443", NULL);
    expect_pick(&c, NULL, "[2001:db8::1", NULL);
    expect_pick(&c, NULL, "b.example:1", "b");
}

/* A shop reached by an IPv6 literal must be configurable: config_pick_shop
 * matches "[2001:db8::1]" (brackets kept, port removed), so `hosts` has to
 * accept that form. */
static void test_ipv6_host_configurable(void **unused)
{
    (void)unused;
    struct config *c = load_fmt(HEAD "\"shops\": [{\"id\": \"v6\", \"hosts\": [\"[2001:db8::1]\"], "
                                     "\"secret_key_file\": \"%s/key_a\"}, {\"id\": \"b\", \"hosts\": [\"b.example\"], "
                                     "\"secret_key_file\": \"%s/key_b\"}]}",
                                g_dir, g_dir);
    if (c == NULL)
        print_error("refused: %s\n", g_err);
    assert_non_null(c);
    const struct shop *s = config_pick_shop(c, NULL, "[2001:DB8::1]:8443");
    const struct shop *want = &c->shops[0];
    config_unref(c);
    assert_ptr_equal(s, want);
}

/* "toko.example." names the same host as "toko.example" (config_pick_shop
 * strips the request's trailing dot); a configured entry written in that
 * absolute form must match too, not silently never match. */
static void test_host_trailing_dot_in_config(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_fmt(
        HEAD "\"shops\": [{\"id\": \"a\", \"hosts\": [\"Toko-A.Example.\"], \"secret_key_file\": \"%s/key_a\"},"
             "{\"id\": \"b\", \"hosts\": [\"b.example\"], \"secret_key_file\": \"%s/key_b\"}]}",
        g_dir, g_dir));
    const struct shop *s1 = config_pick_shop(c, NULL, "toko-a.example");
    const struct shop *s2 = config_pick_shop(c, NULL, "toko-a.example.:443");
    const struct shop *want = &c->shops[0];
    config_unref(c); /* before asserting: nothing leaks when this fails */
    assert_ptr_equal(s1, want);
    assert_ptr_equal(s2, want);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hosts_urls_origins),
        cmocka_unit_test(test_shops_dir),
        cmocka_unit_test(test_shop_file_typo_others_load),
        cmocka_unit_test(test_shop_file_tenant_rules),
        cmocka_unit_test(test_reload_keeps_previous_version),
        cmocka_unit_test(test_tenant_key_is_its_own),
        cmocka_unit_test(test_tenant_hosts_never_taken_over),
        cmocka_unit_test(test_broken_tenant_claims_its_hosts),
        cmocka_unit_test(test_tenant_notify_secret_is_its_own),
        cmocka_unit_test(test_pick_no_fallback_with_shops_dir),
        cmocka_unit_test(test_pick_shop),
        cmocka_unit_test(test_pick_single_shop),
        cmocka_unit_test(test_pick_ipv6_host_matching),
        cmocka_unit_test(test_ipv6_host_configurable),
        cmocka_unit_test(test_host_trailing_dot_in_config),
        cmocka_unit_test(test_shops_dir_empty),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
