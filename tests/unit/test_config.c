/* test_config.c - unit tests of src/config.c: loading a configuration,
 * its top-level and per-shop values, and its errors (each names the file
 * and the key). The shops' files and hosts, the key files and Redis have
 * their own: test_config_shops.c, test_config_secret.c, test_config_redis.c. */
#include "config_fixture.h"

static void test_good_config(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_fmt(
        HEAD "\"api_base\": \"https://pay.kasera.id/\", \"schedule_ms\": [0, 1100, 2000], "
             "\"read_timeout_ms\": 3000, \"state_slots\": 1024, \"state_slots_per_key\": 100, \"shops\": ["
             "{\"id\": \"toko-a\", \"name\": \"Toko A\", \"hosts\": [\"Toko-A.Example\", \"www.toko-a.example\"], "
             "\"secret_key_file\": \"%s/key_a\", \"shop_url\": \"https://toko-a.example/\", \"locale\": \"en\", "
             "\"read_budget_per_minute\": 60, \"cors_origins\": [\"https://toko-a.example\"], \"id_param\": \"trx\"},"
             "{\"id\": \"toko_b\", \"secret_key_env\": \"KEMBALI_TEST_KEY_B\"}]}",
        g_dir));
    assert_string_equal(c->path, g_cfg);
    assert_string_equal(c->api_base, "https://pay.kasera.id");
    assert_string_equal(c->state_dir, "/tmp");
    assert_string_equal(c->templates_dir, TEMPLATES);
    assert_int_equal(c->sched.n, 3);
    assert_int_equal(c->sched.wait_ms[1], 1100);
    assert_int_equal(c->sched.wait_ms[2], 2000);
    assert_int_equal(c->read_timeout_ms, 3000);
    assert_int_equal(c->state_slots, 1024);
    assert_int_equal(c->state_slots_per_key, 100);
    assert_non_null(c->default_tpl);
    assert_string_equal(c->default_tpl->locale, "id");
    assert_int_equal(c->nshops, 2);

    const struct shop *a = &c->shops[0], *b = &c->shops[1];
    assert_string_equal(a->id, "toko-a");
    assert_string_equal(a->name, "Toko A");
    assert_int_equal(a->nhosts, 2);
    assert_string_equal(a->hosts[0], "toko-a.example"); /* lowercased */
    assert_string_equal(a->hosts[1], "www.toko-a.example");
    assert_string_equal(a->secret, "sk_test_aaa"); /* first line, trimmed */
    assert_string_equal(a->shop_url, "https://toko-a.example/");
    assert_string_equal(a->locale, "en");
    assert_int_equal(a->read_budget, 60);
    assert_int_equal(a->norigins, 1);
    assert_string_equal(a->origins[0], "https://toko-a.example");
    assert_string_equal(a->id_param, "trx");
    assert_non_null(a->tpl);
    assert_string_equal(a->tpl->locale, "en");

    assert_string_equal(b->id, "toko_b");
    assert_string_equal(b->name, "toko_b");
    assert_string_equal(b->secret, "sk_env_bbb");
    assert_string_equal(b->locale, "id");
    assert_int_equal(b->read_budget, 120);
    assert_string_equal(b->id_param, "id");
    assert_int_equal(b->nhosts, 0);
    assert_int_equal(b->norigins, 0);
    assert_non_null(b->tpl);
    assert_string_equal(b->tpl->locale, "id");
    config_unref(c);
}

static void test_defaults(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_fmt(HEAD "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}", g_dir));
    assert_string_equal(c->api_base, "https://pay.kasera.id");
    struct pace_schedule def;
    pace_default(&def);
    assert_int_equal(c->sched.n, def.n);
    assert_memory_equal(c->sched.wait_ms, def.wait_ms, sizeof def.wait_ms[0] * (size_t)def.n);
    assert_int_equal(c->read_timeout_ms, 5000);
    assert_int_equal(c->shops[0].read_budget, 120);
    assert_string_equal(c->shops[0].secret, "sk_test_bbb");
    config_unref(c);
}

static void test_refs_and_bind_state(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_fmt(
        HEAD "\"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}, {\"id\": \"b\", \"secret_key_file\": \"%s/key_b\"},"
             "{\"id\": \"a2\", \"secret_key_file\": \"%s/key_a_copy\"}]}",
        g_dir, g_dir, g_dir));
    struct state_opts o = {.tx_slots = 16};
    char err[128];
    struct state *st = state_new(&o, err, sizeof err);
    assert_non_null(st);
    config_bind_state(c, st);
    /* shops that share a key share its identity (and its budget) */
    assert_memory_equal(c->shops[0].key.b, c->shops[2].key.b, 16);
    assert_memory_not_equal(c->shops[0].key.b, c->shops[1].key.b, 16);
    struct state_key direct;
    state_key_id(st, "sk_test_aaa", &direct);
    assert_memory_equal(direct.b, c->shops[0].key.b, 16);
    state_free(st);

    assert_ptr_equal(config_ref(c), c);
    config_unref(c);
    assert_string_equal(c->shops[0].id, "a"); /* still alive */
    config_unref(c);
    config_unref(NULL);
}

static void test_unknown_top_level_key(void **unused)
{
    (void)unused;
    struct config *c = load_fmt(HEAD "\"colour\": \"blue\", \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}",
                                g_dir);
    expect_error(c, g_cfg, "colour", "unknown key");
}

/* An error is never cut without a word: a long key name ends in "...",
 * and a full error buffer ends its last line with "...". */
static void test_errors_cut_visibly(void **unused)
{
    (void)unused;
    char key[301];
    memset(key, 'k', 300);
    key[300] = '\0';
    struct config *c = load_fmt(HEAD "\"%s\": 1, \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}",
                                key, g_dir);
    assert_null(c);
    assert_non_null(strstr(g_err, "kkk...: unknown key"));
    char small[48];
    c = config_load(g_cfg, small, sizeof small);
    assert_null(c);
    assert_int_equal(strlen(small), sizeof small - 1);
    assert_string_equal(small + sizeof small - 5, "...\n");
}

static void test_unknown_shop_key(void **unused)
{
    (void)unused;
    struct config *c = load_fmt(HEAD "\"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"},"
                                     "{\"id\": \"b\", \"secret_key_file\": \"%s/key_b\", \"colour\": 1}]}",
                                g_dir, g_dir);
    expect_error(c, g_cfg, "shops[1].colour", "unknown key");
    c = load_fmt(HEAD "\"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\", \"secret_key\": \"sk_x\"}]}", g_dir);
    expect_error(c, g_cfg, "shops[0].secret_key", "unknown key");
}

static void test_api_base(void **unused)
{
    (void)unused;
    static const struct {
        const char *url;
        bool ok;
    } cases[] = {
        {"https://pay.kasera.id", true},
        {"https://x", true},
        {"https://x:8443/base/", true},
        {"http://127.0.0.1:8080", true},
        {"http://127.1.2.3", true},
        {"http://localhost", true},
        {"http://LOCALHOST:9000/v", true},
        {"http://[::1]:8080", true},
        {"ftp://pay.kasera.id", false},
        {"http://example.com", false},
        {"http://pay.kasera.id", false},
        {"http://localhost.evil.example", false},
        {"http://127.0.0.1.evil.example", false},
        {"http://10.0.0.1", false},
        {"http://[::2]", false},
        {"https://", false},
        {"https://:443", false},
        {"https://user:pw@pay.kasera.id", false},
        {"http://127.0.0.1@evil.example", false},
        {"https://pay.kasera.id/?x=1", false},
        {"https://pay.kasera.id/#f", false},
        {"https://pay kasera.id", false},
        {"pay.kasera.id", false},
        {"HTTPS//pay.kasera.id", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct config *c = load_fmt(HEAD "\"api_base\": \"%s\", \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}",
                                    cases[i].url, g_dir);
        if (cases[i].ok != (c != NULL))
            print_error("api_base %s: %s (%s)\n", cases[i].url, c ? "accepted" : "refused", g_err);
        if (cases[i].ok) {
            assert_non_null(c);
            config_unref(c);
        } else {
            expect_error(c, g_cfg, "api_base", NULL);
        }
    }
    /* an empty or non-string value */
    expect_error(load_fmt(HEAD "\"api_base\": \"\", \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", g_dir),
                 g_cfg, "api_base", NULL);
    expect_error(load_fmt(HEAD "\"api_base\": 5, \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", g_dir),
                 g_cfg, "api_base", NULL);
}

static void test_schedule(void **unused)
{
    (void)unused;
    struct config *c = load_fmt(HEAD "\"schedule_ms\": [0, 1000], \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", g_dir);
    expect_error(c, g_cfg, "schedule_ms", "1100");

    c = expect_ok(load_fmt(HEAD "\"schedule_ms\": [0, 1100], \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", g_dir));
    assert_int_equal(c->sched.n, 2);
    assert_int_equal(pace_hold_ms(&c->sched), 1100 + PACE_GRACE_MS);
    config_unref(c);

    const char *bad[] = {
        "[]", "[0, 1500, 1099]", "[0, 30001]", "[0, \"1500\"]", "[0, 1500.5]", "5000", "\"0,1500\"",
        "[0,1100,1100,1100,1100,1100,1100,1100,1100,1100,1100,1100,1100,1100,1100,1100,1100]", "[-1, 1500]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c = load_fmt(HEAD "\"schedule_ms\": %s, \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", bad[i], g_dir);
        expect_error(c, g_cfg, "schedule_ms", NULL);
    }
}

static void test_read_timeout_and_slots(void **unused)
{
    (void)unused;
    const char *bad[] = {"\"read_timeout_ms\": 99", "\"read_timeout_ms\": 30001", "\"read_timeout_ms\": \"5000\"",
                         "\"state_slots\": 15", "\"state_slots\": 4194305", "\"state_slots\": 1.5"};
    const char *keys[] = {"read_timeout_ms", "read_timeout_ms", "read_timeout_ms", "state_slots", "state_slots", "state_slots"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct config *c = load_fmt(HEAD "%s, \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", bad[i], g_dir);
        expect_error(c, g_cfg, keys[i], NULL);
    }
    /* state_slots_per_key: 1 .. state_slots (its default: 0, the state's) */
    const char *bad_pk[] = {"\"state_slots_per_key\": 0", "\"state_slots_per_key\": -1",
                            "\"state_slots_per_key\": 16385", "\"state_slots\": 64, \"state_slots_per_key\": 65",
                            "\"state_slots_per_key\": \"8\"", "\"state_slots_per_key\": 2.5"};
    for (size_t i = 0; i < sizeof bad_pk / sizeof bad_pk[0]; i++) {
        struct config *c = load_fmt(HEAD "%s, \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", bad_pk[i], g_dir);
        expect_error(c, g_cfg, "state_slots_per_key", "from 1 to state_slots");
    }
    const char *good_pk[] = {"\"state_slots\": 64, \"state_slots_per_key\": 64", "\"state_slots_per_key\": 1", "\"state_slots\": 64"};
    const int want_pk[] = {64, 1, 0};
    for (size_t i = 0; i < sizeof good_pk / sizeof good_pk[0]; i++) {
        struct config *c = expect_ok(load_fmt(HEAD "%s, \"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]}", good_pk[i], g_dir));
        assert_int_equal(c->state_slots_per_key, want_pk[i]);
        config_unref(c);
    }
}

static void test_read_budget(void **unused)
{
    (void)unused;
    char shop[512];
    const char *bad[] = {"0", "301", "-5", "\"12\"", "1.5", "null", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"read_budget_per_minute\": %s", g_dir, bad[i]);
        expect_error(load_one_shop(shop), g_cfg, "shops[0].read_budget_per_minute", NULL);
    }
    const int good[] = {1, 120, 300};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"read_budget_per_minute\": %d", g_dir, good[i]);
        struct config *c = expect_ok(load_one_shop(shop));
        assert_int_equal(c->shops[0].read_budget, good[i]);
        config_unref(c);
    }
}

static void test_locale(void **unused)
{
    (void)unused;
    char shop[512];
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"locale\": \"fr\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].locale", NULL);
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"locale\": \"EN\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].locale", NULL);
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"locale\": \"en\"", g_dir);
    struct config *c = expect_ok(load_one_shop(shop));
    assert_string_equal(c->shops[0].locale, "en");
    config_unref(c);
}

static void test_duplicates(void **unused)
{
    (void)unused;
    struct config *c = load_fmt(HEAD "\"shops\": [{\"id\": \"toko-a\", \"secret_key_file\": \"%s/key_a\"},"
                                     "{\"id\": \"toko-a\", \"secret_key_file\": \"%s/key_b\"}]}",
                                g_dir, g_dir);
    expect_error(c, g_cfg, "shops", "toko-a");

    c = load_fmt(HEAD "\"shops\": [{\"id\": \"a\", \"hosts\": [\"shop.example\"], \"secret_key_file\": \"%s/key_a\"},"
                      "{\"id\": \"b\", \"hosts\": [\"other.example\", \"Shop.Example\"], \"secret_key_file\": \"%s/key_b\"}]}",
                 g_dir, g_dir);
    expect_error(c, g_cfg, "shops", "shop.example");
}

static void test_invalid_shop_id(void **unused)
{
    (void)unused;
    const char *bad[] = {"toko a", "", "toko/a", "\\u00e4", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct config *c = load_fmt(HEAD "\"shops\": [{\"id\": \"%s\", \"secret_key_file\": \"%s/key_a\"}]}", bad[i], g_dir);
        expect_error(c, g_cfg, "shops[0].id", NULL);
    }
    expect_error(load_fmt(HEAD "\"shops\": [{\"secret_key_file\": \"%s/key_a\"}]}", g_dir), g_cfg, "shops[0].id", NULL);
    expect_error(load_fmt(HEAD "\"shops\": [{\"id\": 5, \"secret_key_file\": \"%s/key_a\"}]}", g_dir), g_cfg, "shops[0].id", NULL);
}

static void test_id_param(void **unused)
{
    (void)unused;
    char shop[512];
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"id_param\": \"trx_id\"", g_dir);
    struct config *c = expect_ok(load_one_shop(shop));
    assert_string_equal(c->shops[0].id_param, "trx_id");
    config_unref(c);
    const char *bad[] = {"a b", "a&b", "a=b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" /* 33 */};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"id_param\": \"%s\"", g_dir, bad[i]);
        expect_error(load_one_shop(shop), g_cfg, "shops[0].id_param", NULL);
    }
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"id_param\": \"%s\"", g_dir,
             "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" /* 32 */);
    c = expect_ok(load_one_shop(shop));
    assert_int_equal(strlen(c->shops[0].id_param), 32);
    config_unref(c);
}

/* A name of at most 200 characters (not bytes) and at most 32 hosts; more
 * is refused naming the file and the key, in the main configuration and
 * in a tenant's file alike. */
static void test_size_caps(void **unused)
{
    (void)unused;
    make_keys_dir();
    char name[1200], hosts[2400], shop[4000];
    for (int len = 199; len <= 201; len++) {
        for (int utf8 = 0; utf8 <= 1; utf8++) {
            name[0] = '\0';
            for (int i = 0; i < len; i++)
                strcat(name, utf8 ? "\xc3\xa9" : "n"); /* é: 2 bytes, 1 character */
            snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"name\": \"%s\"", g_dir, name);
            struct config *c = load_one_shop(shop);
            if (len <= 200) {
                expect_ok(c);
                assert_string_equal(c->shops[0].name, name);
                config_unref(c);
            } else {
                expect_error(c, g_cfg, "shops[0].name", "is 201 characters long: at most 200");
            }
        }
    }
    for (int n = 32; n <= 33; n++) {
        hosts[0] = '\0';
        for (int i = 0; i < n; i++)
            snprintf(hosts + strlen(hosts), sizeof hosts - strlen(hosts), "%s\"h%d.example\"", i ? ", " : "", i);
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"hosts\": [%s]", g_dir, hosts);
        struct config *c = load_one_shop(shop);
        if (n == 32) {
            expect_ok(c);
            assert_int_equal(c->shops[0].nhosts, 32);
            config_unref(c);
        } else {
            expect_error(c, g_cfg, "shops[0].hosts", "at most 32 hosts");
        }
    }
    /* in a tenant's file: that file is skipped by name */
    put_tenant_key("big", "sk_test_big");
    make_dir("shops_big");
    put_tenant("shops_big", "big", "\"name\": \"%s\", \"hosts\": [%s]", name, hosts);
    struct config *c = expect_ok(load_dir("shops_big", "\"shops\": [{\"id\": \"main\", \"secret_key_env\": "
                                                        "\"KEMBALI_TEST_KEY_B\"}]"));
    const struct config_skip *k = skipped(c, "shops_big/big.json");
    assert_non_null(strstr(k->why, "shops_big/big.json: name: is 201 characters long"));
    assert_non_null(strstr(k->why, "shops_big/big.json: hosts: at most 32 hosts"));
    config_unref(c);
}

/* A page is its template with the shop's values in: a shop whose name
 * and shop_url would make a page larger than RENDER_PAGE_MAX (256 KiB, with
 * the longest id) is refused, however small its templates. */
static void test_rendered_page_cap(void **unused)
{
    (void)unused;
    make_dir("tpl_amp");
    make_dir("tpl_amp/id");
    /* 1000 {{shop_url}}: a 250-byte shop_url makes a 250 KB page, 300 bytes 293 KiB */
    static char page[64 * 1024];
    strcpy(page, "<html data-status=\"{{status}}\">");
    for (int i = 0; i < 1000; i++)
        strcat(page, "{{shop_url}}");
    strcat(page, "</html>");
    put_file("tpl_amp/id/failed.html", page);
    char url[400], shop[1200];
    for (int len = 250; len <= 300; len += 50) {
        snprintf(url, sizeof url, "https://a.example/?");
        while (strlen(url) < (size_t)len)
            strcat(url, "x");
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"templates_dir\": \"%s/tpl_amp\", "
                 "\"shop_url\": \"%s\"", g_dir, g_dir, url);
        struct config *c = load_one_shop(shop);
        if (len == 250) {
            expect_ok(c);
            config_unref(c);
        } else {
            expect_error(c, g_cfg, "shops[0].templates_dir", "the failed page would be 293 KiB with this shop's "
                                                             "name and shop_url: at most 256 KiB");
        }
    }
    /* escaping counts: 55 '&' are 275 bytes on the page */
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"templates_dir\": \"%s/tpl_amp\", "
             "\"shop_url\": \"https://a.example/?%s\"", g_dir, g_dir,
             "&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&&");
    expect_error(load_one_shop(shop), g_cfg, "shops[0].templates_dir", "the failed page would be");
}

/* The streamed page (its waiting top and the result card for each word,
 * together) is a page too: a shop whose values make it larger than
 * RENDER_PAGE_MAX is refused, though each single page fits; with
 * `progressive` false it never gets one, and loads. */
static void test_streamed_page_cap(void **unused)
{
    (void)unused;
    make_dir("tpl_wait");
    make_dir("tpl_wait/id");
    /* 500 {{shop_url}} in the top and 500 in the failed card: a 300-byte
     * shop_url makes a 150 KB single page, a 300 KB streamed one */
    static char page[16 * 1024], wait[16 * 1024];
    strcpy(page, "<html data-status=\"{{status}}\"><!--card-->");
    strcpy(wait, "<html data-status=\"{{status}}\">");
    for (int i = 0; i < 500; i++) {
        strcat(page, "{{shop_url}}");
        strcat(wait, "{{shop_url}}");
    }
    strcat(page, "<!--/card--></html>");
    strcat(wait, "{{more}}<div data-status=\"{{status}}\">{{card}}</div></html>");
    put_file("tpl_wait/id/failed.html", page);
    put_file("tpl_wait/id/waiting.html", wait);
    char url[400], shop[1200];
    snprintf(url, sizeof url, "https://a.example/?");
    while (strlen(url) < 300)
        strcat(url, "x");
    for (int progressive = 0; progressive <= 1; progressive++) {
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"templates_dir\": \"%s/tpl_wait\", "
                 "\"shop_url\": \"%s\", \"progressive\": %s", g_dir, g_dir, url, progressive ? "true" : "false");
        struct config *c = load_one_shop(shop);
        if (!progressive) {
            expect_ok(c);
            assert_false(c->shops[0].progressive);
            assert_true(templates_stream(c->shops[0].tpl));
            config_unref(c);
        } else {
            expect_error(c, g_cfg, "shops[0].templates_dir", "the streamed failed page would be 293 KiB with this "
                                                             "shop's name and shop_url: at most 256 KiB");
        }
    }
}

static void test_max_held(void **unused)
{
    (void)unused;
    char shop[512];
    snprintf(shop, sizeof shop, "\"shops\": [{\"id\": \"a\", \"secret_key_file\": \"%s/key_a\"}]", g_dir);
    struct rlimit saved;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &saved), 0);
    struct rlimit big = saved;
    if (big.rlim_max == RLIM_INFINITY || big.rlim_max >= 65536)
        big.rlim_cur = 65536;
    setrlimit(RLIMIT_NOFILE, &big);
    long cap = config_held_cap(big.rlim_cur == RLIM_INFINITY ? -1 : (long)big.rlim_cur);

    struct config *c = expect_ok(load_fmt(HEAD "%s}", shop));
    assert_int_equal(c->max_held, cap < 10000 ? cap : 10000);
    assert_int_equal(c->max_held_per_shop, (c->max_held + 1) / 2);
    assert_int_equal(c->max_held_wanted, 0);
    config_unref(c);
    c = expect_ok(load_fmt(HEAD "\"max_held\": 300, \"max_held_per_shop\": 300, %s}", shop));
    assert_int_equal(c->max_held, 300);
    assert_int_equal(c->max_held_per_shop, 300);
    config_unref(c);
    c = expect_ok(load_fmt(HEAD "\"max_held\": 301, %s}", shop));
    assert_int_equal(c->max_held_per_shop, 151);
    config_unref(c);
    c = expect_ok(load_fmt(HEAD "\"max_held\": 1, %s}", shop));
    assert_int_equal(c->max_held_per_shop, 1);
    config_unref(c);
    c = expect_ok(load_fmt(HEAD "\"max_held_per_shop\": 7000, %s}", shop));
    assert_int_equal(c->max_held_per_shop, 7000 < c->max_held ? 7000 : c->max_held);
    config_unref(c);

    const char *bad[] = {"\"max_held\": 0", "\"max_held\": 1000001", "\"max_held\": \"10\"", "\"max_held\": 1.5",
                         "\"max_held_per_shop\": 0", "\"max_held_per_shop\": -1",
                         "\"max_held\": 100, \"max_held_per_shop\": 101", "\"max_held_per_shop\": 10001"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_error(load_fmt(HEAD "%s, %s}", bad[i], shop), g_cfg, i < 4 ? "max_held" : "max_held_per_shop", NULL);

    /* the cap from the open-files limit */
    assert_int_equal(config_held_cap(1024), 1024 - 64 - 256);
    assert_int_equal(config_held_cap(65536), 65536 - 64 - 16384);
    assert_int_equal(config_held_cap(80), 1);
    assert_int_equal(config_held_cap(0), 1);
    assert_int_equal(config_held_cap(-1), 1000000);
    assert_int_equal(config_held_cap(1L << 40), 1000000);
    struct rlimit small = saved;
    small.rlim_cur = 1024;
    if (setrlimit(RLIMIT_NOFILE, &small) == 0) {
        c = expect_ok(load_fmt(HEAD "\"max_held\": 5000, %s}", shop));
        assert_int_equal(c->max_held, 704);
        assert_int_equal(c->max_held_wanted, 5000);
        assert_int_equal(c->max_held_per_shop, 352);
        config_unref(c);
        c = expect_ok(load_fmt(HEAD "\"max_held_per_shop\": 1000, %s}", shop));
        assert_int_equal(c->max_held, 704);
        assert_int_equal(c->max_held_per_shop, 704);
        config_unref(c);
    }
    setrlimit(RLIMIT_NOFILE, &saved);
}

static void test_syntax_errors(void **unused)
{
    (void)unused;
    struct config *c = load_fmt("{\n  \"api_base\": \"https://x\",\n  \"shops\": [\n}\n");
    expect_error(c, g_cfg, "line 4", NULL);
    c = load_fmt("{\"a\": 1, \"a\": 2}");
    expect_error(c, g_cfg, NULL, NULL);
    c = load_fmt("[]");
    expect_error(c, g_cfg, NULL, "object");
    c = load_fmt("%s", "");
    expect_error(c, g_cfg, NULL, NULL);
    memset(g_err, 0, sizeof g_err);
    c = config_load("/nonexistent/kembali.json", g_err, sizeof g_err);
    expect_error(c, "/nonexistent/kembali.json", NULL, NULL);
}

static void test_no_shops(void **unused)
{
    (void)unused;
    expect_error(load_fmt(HEAD "\"shops\": []}"), g_cfg, "shops", NULL);
    expect_error(load_fmt(HEAD "\"api_base\": \"https://x\"}"), g_cfg, "shops", NULL);
    expect_error(load_fmt(HEAD "\"shops\": {\"id\": \"a\"}}"), g_cfg, "shops", NULL);
    expect_error(load_fmt(HEAD "\"shops\": [5]}"), g_cfg, "shops", NULL);
}

static void test_templates_problems(void **unused)
{
    (void)unused;
    /* the default templates_dir must load */
    struct config *c = load_fmt("{\"templates_dir\": \"%s/no_templates\", \"shops\": [{\"id\": \"a\", "
                                "\"secret_key_file\": \"%s/key_a\"}]}",
                                g_dir, g_dir);
    expect_error(c, g_cfg, "templates_dir", "no_templates");

    /* a shop's own templates: one page with an unknown placeholder */
    make_dir("tpl");
    make_dir("tpl/id");
    put_file("tpl/id/failed.html", "<html data-status=\"{{status}}\">{{nope}}</html>");
    char shop[512], file[512];
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"templates_dir\": \"%s/tpl\"", g_dir, g_dir);
    snprintf(file, sizeof file, "%s/tpl/id/failed.html", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].templates_dir", file);

    /* one good custom page: the rest come from the defaults */
    put_file("tpl/id/failed.html", "<html data-status=\"{{status}}\">GAGAL {{id}}</html>");
    c = expect_ok(load_one_shop(shop));
    assert_non_null(c->shops[0].tpl);
    assert_ptr_not_equal(c->shops[0].tpl, c->default_tpl);
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    struct page_vars v = {.id = "T1"};
    assert_int_equal(render_html(c->shops[0].tpl, W_FAILED, &v, &b), DYNBUF_OK);
    assert_string_equal(b.p, "<html data-status=\"failed\">GAGAL T1</html>");
    dynbuf_free(&b);
    assert_int_equal(render_html(c->shops[0].tpl, W_SUCCEEDED, &v, &b), DYNBUF_OK);
    assert_non_null(strstr(b.p, "data-status=\"succeeded\""));
    dynbuf_free(&b);
    config_unref(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good_config),
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_refs_and_bind_state),
        cmocka_unit_test(test_unknown_top_level_key),
        cmocka_unit_test(test_errors_cut_visibly),
        cmocka_unit_test(test_unknown_shop_key),
        cmocka_unit_test(test_api_base),
        cmocka_unit_test(test_schedule),
        cmocka_unit_test(test_read_timeout_and_slots),
        cmocka_unit_test(test_read_budget),
        cmocka_unit_test(test_locale),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_invalid_shop_id),
        cmocka_unit_test(test_id_param),
        cmocka_unit_test(test_size_caps),
        cmocka_unit_test(test_rendered_page_cap),
        cmocka_unit_test(test_streamed_page_cap),
        cmocka_unit_test(test_max_held),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_no_shops),
        cmocka_unit_test(test_templates_problems),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
