/* test_config.c - unit tests of src/config*.c: loading, validation and
 * error messages (each names the file and the key), shop selection. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "config.h"

#define TEMPLATES TEST_SRCDIR "/templates"
/* The start of every configuration written here. */
#define HEAD "{\"templates_dir\": \"" TEMPLATES "\", \"state_dir\": \"/tmp\", "

static char g_dir[64];       /* scratch directory of the group */
static char g_cfg[128];      /* g_dir/kembali.json */
static char g_err[8192];

/* ---- helpers ---- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void put_file(const char *rel, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static void make_dir(const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    assert_true(mkdir(path, 0700) == 0 || errno == EEXIST);
}

static int group_setup(void **state)
{
    (void)state;
    umask(077); /* key files 0600: others' modes are tested one by one */
    snprintf(g_dir, sizeof g_dir, "/tmp/kembali-test-config-XXXXXX");
    if (mkdtemp(g_dir) == NULL)
        return -1;
    snprintf(g_cfg, sizeof g_cfg, "%s/kembali.json", g_dir);
    put_file("key_a", "  sk_test_aaa \t \nsecond line is ignored\n");
    put_file("key_b", "sk_test_bbb\n");
    put_file("key_a_copy", "sk_test_aaa");
    put_file("key_space", "sk test\n");
    put_file("key_empty", "");
    setenv("KEMBALI_TEST_KEY_B", "sk_env_bbb", 1);
    unsetenv("KEMBALI_TEST_UNSET");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 0;
}

static struct config *load_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Write the configuration (printf format) to g_cfg and load it. */
static struct config *load_fmt(const char *fmt, ...)
{
    char text[8192];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    assert_true(n >= 0 && (size_t)n < sizeof text);
    FILE *f = fopen(g_cfg, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
    memset(g_err, 0, sizeof g_err);
    return config_load(g_cfg, g_err, sizeof g_err);
}

/* The load failed and the message names the file and every `needle`. */
static void expect_error(struct config *c, const char *file, const char *key, const char *also)
{
    if (c != NULL)
        config_unref(c);
    assert_null(c);
    if (strstr(g_err, file) == NULL || (key && strstr(g_err, key) == NULL) || (also && strstr(g_err, also) == NULL))
        print_error("error text was: %s\n(wanted %s, %s, %s)\n", g_err, file, key ? key : "-", also ? also : "-");
    assert_non_null(strstr(g_err, file));
    if (key != NULL)
        assert_non_null(strstr(g_err, key));
    if (also != NULL)
        assert_non_null(strstr(g_err, also));
}

static struct config *expect_ok(struct config *c)
{
    if (c == NULL)
        print_error("config_load failed: %s\n", g_err);
    assert_non_null(c);
    return c;
}

/* A configuration with one shop whose members are `shop` (text). */
static struct config *load_one_shop(const char *shop)
{
    return load_fmt(HEAD "\"shops\": [{\"id\": \"toko-a\", %s}]}", shop);
}

/* ---- a good configuration ---- */

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

/* ---- errors: each names the file and the key ---- */

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

static void test_key_file_problems(void **unused)
{
    (void)unused;
    char shop[512];
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/no_such_key\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].secret_key_file", "no_such_key");

    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_empty\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].secret_key_file", NULL);

    /* a key that cannot go into a header is refused, and never shown */
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_space\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].secret_key_file", NULL);
    assert_null(strstr(g_err, "sk test"));

    /* a first line longer than any key is refused, not cut to size */
    char longkey[402];
    memset(longkey, 'k', 400);
    longkey[400] = '\n';
    longkey[401] = '\0';
    put_file("key_long", longkey);
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_long\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].secret_key_file", "longer than a key");

    /* both, or neither */
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s/key_a\", \"secret_key_env\": \"KEMBALI_TEST_KEY_B\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].secret_key", "exactly one");
    expect_error(load_one_shop("\"name\": \"A\""), g_cfg, "shops[0].secret_key", "exactly one");

    /* an environment variable that is not set */
    expect_error(load_one_shop("\"secret_key_env\": \"KEMBALI_TEST_UNSET\""), g_cfg, "shops[0].secret_key_env",
                 "KEMBALI_TEST_UNSET");
}

static void test_secret_never_in_errors(void **unused)
{
    (void)unused;
    /* a shop with a good key and several problems elsewhere */
    struct config *c = load_fmt(HEAD "\"shops\": [{\"id\": \"bad id\", \"secret_key_file\": \"%s/key_a\", "
                                     "\"locale\": \"fr\", \"shop_url\": \"javascript:x\"},"
                                     "{\"id\": \"b\", \"secret_key_env\": \"KEMBALI_TEST_KEY_B\", \"colour\": 1}]}",
                                g_dir);
    expect_error(c, g_cfg, "shops[0].id", NULL);
    assert_non_null(strstr(g_err, "shops[0].locale"));
    assert_non_null(strstr(g_err, "shops[0].shop_url"));
    assert_non_null(strstr(g_err, "shops[1].colour"));
    assert_null(strstr(g_err, "sk_test_aaa"));
    assert_null(strstr(g_err, "sk_env_bbb"));
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

/* The configuration text that names shops_dir `sub` with keys_dir g_dir/keys
 * (and `more` top-level members). */
static struct config *load_dir(const char *sub, const char *more)
{
    return load_fmt(HEAD "\"keys_dir\": \"%s/keys\", \"shops_dir\": \"%s/%s\"%s%s}", g_dir, g_dir, sub,
                    more ? ", " : "", more ? more : "");
}

/* The skipped entry of c for shops_dir file `rel` (relative to g_dir), or fail. */
static const struct config_skip *skipped(const struct config *c, const char *rel)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, rel);
    for (int i = 0; i < c->nskipped; i++)
        if (strcmp(c->skipped[i].file, path) == 0)
            return &c->skipped[i];
    print_error("%s was not skipped (%d skipped)\n", path, c->nskipped);
    fail();
    return NULL;
}

static void make_keys_dir(void)
{
    make_dir("keys");
    put_file("keys/a", "sk_test_aaa\n");
    put_file("keys/b", "sk_test_bbb\n");
}

/* The key of tenant `name`: keys_dir/NAME (keys_dir is g_dir/keys). */
static void put_tenant_key(const char *name, const char *key)
{
    char rel[128], text[128];
    snprintf(rel, sizeof rel, "keys/%s", name);
    snprintf(text, sizeof text, "%s\n", key);
    put_file(rel, text);
}

/* The shop file `dir`/NAME.json holding `members` (JSON text without the
 * braces, printf format). */
static void put_tenant(const char *dir, const char *name, const char *members, ...)
    __attribute__((format(printf, 3, 4)));
static void put_tenant(const char *dir, const char *name, const char *members, ...)
{
    char rel[200], body[4096], text[4200];
    va_list ap;
    va_start(ap, members);
    vsnprintf(body, sizeof body, members, ap);
    va_end(ap);
    snprintf(rel, sizeof rel, "%s/%s.json", dir, name);
    snprintf(text, sizeof text, "{%s}", body);
    put_file(rel, text);
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

/* keys_dir: every secret_key_file must lie inside it after resolving
 * symbolic links; a `..` or a link out is refused. */
static void test_keys_dir(void **unused)
{
    (void)unused;
    make_keys_dir();
    make_dir("keys/sub");
    put_file("keys/sub/c", "sk_test_ccc\n");
    put_file("outside_key", "sk_test_out\n");
    char link[512], target[512];
    snprintf(link, sizeof link, "%s/keys/escape", g_dir);
    snprintf(target, sizeof target, "%s/outside_key", g_dir);
    unlink(link);
    assert_int_equal(symlink(target, link), 0);
    snprintf(link, sizeof link, "%s/keys/inner", g_dir);
    unlink(link);
    assert_int_equal(symlink("sub/c", link), 0); /* a link that stays inside */
    snprintf(link, sizeof link, "%s/keys/up", g_dir);
    unlink(link);
    assert_int_equal(symlink("..", link), 0); /* a folder link out */
    make_dir("keys2"); /* a sibling whose name starts like keys_dir */
    put_file("keys2/a", "sk_test_k2\n");

    const char *bad[] = {"keys/escape", "keys/../outside_key", "keys/sub/../../outside_key", "keys/up/outside_key",
                         "keys2/a", "outside_key", "keys"};
    char shop[600];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* inline shops are held to keys_dir too */
        struct config *c = load_fmt(HEAD "\"keys_dir\": \"%s/keys/\", \"shops\": [{\"id\": \"a\", "
                                         "\"secret_key_file\": \"%s/%s\"}]}", g_dir, g_dir, bad[i]);
        expect_error(c, g_cfg, "shops[0].secret_key_file", i < 6 ? "outside keys_dir" : NULL);
        assert_null(strstr(g_err, "sk_test_out"));
        /* in a shop file: the file is skipped */
        make_dir("shops_esc");
        snprintf(shop, sizeof shop, "{\"id\": \"esc\", \"secret_key_file\": \"%s/%s\"}", g_dir, bad[i]);
        put_file("shops_esc/esc.json", shop);
        put_tenant_key("fine", "sk_test_fine");
        put_file("shops_esc/fine.json", "{}");
        c = expect_ok(load_dir("shops_esc", NULL));
        assert_int_equal(c->nshops, 1);
        const struct config_skip *k = skipped(c, "shops_esc/esc.json");
        assert_non_null(strstr(k->why, "secret_key_file"));
        config_unref(c);
    }
    const char *good[] = {"keys/a", "keys/sub/c", "keys/inner", "keys/sub/../a"};
    const char *want[] = {"sk_test_aaa", "sk_test_ccc", "sk_test_ccc", "sk_test_aaa"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        struct config *c = expect_ok(load_fmt(HEAD "\"keys_dir\": \"%s/keys\", \"shops\": [{\"id\": \"a\", "
                                                   "\"secret_key_file\": \"%s/%s\"}]}", g_dir, g_dir, good[i]));
        assert_string_equal(c->shops[0].secret, want[i]);
        config_unref(c);
    }
    /* keys_dir itself through a link: resolved once */
    snprintf(link, sizeof link, "%s/keys_link", g_dir);
    snprintf(target, sizeof target, "%s/keys", g_dir);
    unlink(link);
    assert_int_equal(symlink(target, link), 0);
    struct config *c = expect_ok(load_fmt(HEAD "\"keys_dir\": \"%s/keys_link\", \"shops\": [{\"id\": \"a\", "
                                               "\"secret_key_file\": \"%s/keys/a\"}]}", g_dir, g_dir));
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

static void expect_pick(const struct config *c, const char *param, const char *host, const char *want);

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

/* Key files others can read, or group or others can write, are refused
 * with a message naming the file; 0600 and 0640 are fine. */
static void test_key_file_modes(void **unused)
{
    (void)unused;
    const struct {
        mode_t mode;
        bool ok;
    } cases[] = {{0644, false}, {0660, false}, {0602, false}, {0604, false}, {0620, false},
                 {0600, true}, {0640, true}, {0400, true}, {0440, true}};
    char path[512], shop[600];
    snprintf(path, sizeof path, "%s/key_mode", g_dir);
    put_file("key_mode", "sk_test_mode\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(chmod(path, cases[i].mode), 0);
        snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s\"", path);
        struct config *c = load_one_shop(shop);
        if (cases[i].ok != (c != NULL))
            print_error("mode %04o: %s (%s)\n", (unsigned)cases[i].mode, c ? "accepted" : "refused", g_err);
        if (cases[i].ok) {
            assert_non_null(c);
            assert_string_equal(c->shops[0].secret, "sk_test_mode");
            config_unref(c);
        } else {
            expect_error(c, g_cfg, "shops[0].secret_key_file", path);
            assert_non_null(strstr(g_err, "mode"));
            assert_null(strstr(g_err, "sk_test_mode"));
        }
    }
    /* not a regular file: refused, never waited on (a FIFO would block) */
    snprintf(path, sizeof path, "%s/key_fifo", g_dir);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s\"", path);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].secret_key_file", "not a regular file");
    snprintf(shop, sizeof shop, "\"secret_key_file\": \"%s\"", g_dir);
    expect_error(load_one_shop(shop), g_cfg, "shops[0].secret_key_file", NULL);
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

/* ---- choosing the shop of a request ---- */

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

/* ---- the shared state's Redis ---- */

/* A configuration with one good shop and the top-level members `top` (text). */
static struct config *load_top(const char *top)
{
    return load_fmt(HEAD "%s, \"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}", top, g_dir);
}

/* load_top with "redis": url; the load succeeds. */
static struct config *load_redis_ok(const char *url)
{
    char top[1000];
    snprintf(top, sizeof top, "\"redis\": \"%s\"", url);
    return expect_ok(load_top(top));
}

/* load_top with "redis": url; refused, the message names redis and `also`. */
static void expect_redis_error(const char *url, const char *also)
{
    char top[1000];
    snprintf(top, sizeof top, "\"redis\": \"%s\"", url);
    expect_error(load_top(top), g_cfg, "redis: ", also);
}

static void expect_address(const struct config_redis *r, const char *want)
{
    char buf[400];
    config_redis_address(r, buf, sizeof buf);
    assert_string_equal(buf, want);
}

static void test_redis_absent(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_top("\"read_planning\": true"));
    assert_false(c->redis.on);
    assert_null(c->redis.password);
    assert_string_equal(c->redis.prefix, "kembali:");
    assert_int_equal(c->redis.hosts, 2);
    expect_address(&c->redis, "-");
    config_unref(c);
    /* null is absent */
    c = expect_ok(load_top("\"redis\": null"));
    assert_false(c->redis.on);
    config_unref(c);
}

static void test_redis_tcp_forms(void **unused)
{
    (void)unused;
    struct config *c = load_redis_ok("redis://127.0.0.1:6379");
    assert_true(c->redis.on);
    assert_false(c->redis.unix_socket);
    assert_string_equal(c->redis.host, "127.0.0.1");
    assert_int_equal(c->redis.port, 6379);
    assert_int_equal(c->redis.db, 0);
    assert_null(c->redis.password);
    assert_string_equal(c->redis.prefix, "kembali:");
    assert_int_equal(c->redis.hosts, 2);
    expect_address(&c->redis, "redis://127.0.0.1:6379");
    config_unref(c);

    c = load_redis_ok("redis://Redis-1.internal_b.example:6380/15");
    assert_string_equal(c->redis.host, "Redis-1.internal_b.example");
    assert_int_equal(c->redis.port, 6380);
    assert_int_equal(c->redis.db, 15);
    expect_address(&c->redis, "redis://Redis-1.internal_b.example:6380/15");
    config_unref(c);

    /* IPv6 in brackets, kept without them (as getaddrinfo takes it) */
    c = load_redis_ok("redis://[::1]:1/0");
    assert_string_equal(c->redis.host, "::1");
    assert_int_equal(c->redis.port, 1);
    assert_int_equal(c->redis.db, 0);
    expect_address(&c->redis, "redis://[::1]:1");
    config_unref(c);

    c = load_redis_ok("redis://[2001:db8::7]:65535/123456789");
    assert_string_equal(c->redis.host, "2001:db8::7");
    assert_int_equal(c->redis.port, 65535);
    assert_int_equal(c->redis.db, 123456789);
    expect_address(&c->redis, "redis://[2001:db8::7]:65535/123456789");
    config_unref(c);

    c = load_redis_ok("redis://localhost:06379");
    assert_string_equal(c->redis.host, "localhost");
    assert_int_equal(c->redis.port, 6379);
    config_unref(c);

    /* a short buffer: cut, terminated */
    c = load_redis_ok("redis://127.0.0.1:6379/2");
    char small[12];
    memset(small, 'x', sizeof small);
    config_redis_address(&c->redis, small, sizeof small);
    assert_string_equal(small, "redis://127");
    config_unref(c);
}

static void test_redis_unix_forms(void **unused)
{
    (void)unused;
    struct config *c = load_redis_ok("unix:///run/redis/redis-server.sock");
    assert_true(c->redis.on);
    assert_true(c->redis.unix_socket);
    assert_string_equal(c->redis.path, "/run/redis/redis-server.sock");
    assert_int_equal(c->redis.db, 0);
    expect_address(&c->redis, "unix:///run/redis/redis-server.sock");
    config_unref(c);

    c = load_redis_ok("unix:///tmp/r.sock?db=7");
    assert_string_equal(c->redis.path, "/tmp/r.sock");
    assert_int_equal(c->redis.db, 7);
    expect_address(&c->redis, "unix:///tmp/r.sock?db=7");
    config_unref(c);

    /* the longest path a Unix socket takes: 107 bytes */
    char url[200] = "unix://";
    size_t n = strlen(url);
    url[n++] = '/';
    while (n < 7 + 107)
        url[n++] = 'p';
    url[n] = '\0';
    c = load_redis_ok(url);
    assert_int_equal(strlen(c->redis.path), 107);
    config_unref(c);
    strcat(url, "p");
    expect_redis_error(url, "longer than 107 bytes");
}

static void test_redis_refused_urls(void **unused)
{
    (void)unused;
    static const struct {
        const char *url, *why;
    } cases[] = {
        {"http://127.0.0.1:6379", "must start with redis://, unix:// or redis-sentinel://"},
        {"127.0.0.1:6379", "must start with redis://, unix:// or redis-sentinel://"},
        {"REDIS://127.0.0.1:6379", "must start with redis://, unix:// or redis-sentinel://"},
        {"rediss://127.0.0.1:6379", "TLS (rediss://) is not supported"},
        {"redis://127.0.0.1", "the port is missing"},
        {"redis://127.0.0.1:", "the port is missing"},
        {"redis://127.0.0.1:/1", "the port is missing"},
        {"redis://127.0.0.1/1", "the port is missing"},
        {"redis://[::1]", "the port is missing"},
        {"redis://:6379", "the host is missing"},
        {"redis://", "the host is missing"},
        {"redis://127.0.0.1:0", "the port 0 is out of range (1-65535)"},
        {"redis://127.0.0.1:65536", "the port 65536 is out of range (1-65535)"},
        {"redis://127.0.0.1:99999999999999999999", "out of range (1-65535)"},
        {"redis://127.0.0.1:63a9", "the port \"63a9\" is not a number"},
        {"redis://127.0.0.1:-1", "the port \"-1\" is not a number"},
        {"redis://127.0.0.1:6379/x", "the db \"x\" after the port is not a number"},
        {"redis://127.0.0.1:6379/", "the db \"\" after the port is not a number"},
        {"redis://127.0.0.1:6379/-1", "the db \"-1\" after the port is not a number"},
        {"redis://127.0.0.1:6379/1/2", "the db \"1/2\" after the port is not a number"},
        {"redis://127.0.0.1:6379/1234567890", "is not a number"},
        {"redis://127.0.0.1:6379?db=1", "\"?db=1\" after the port is not accepted"},
        {"redis://127.0.0.1:6379#x", "after the port is not accepted"},
        {"redis://[::1:6379", "IPv6 address in brackets is not closed"},
        {"redis://[]:6379", "IPv6 address in brackets"},
        {"redis://[zz::1]:6379", "\"[zz::1]\" is not an IPv6 address"},
        {"redis://::1:6379", "the host is missing"},
        {"redis://a!b:6379", "the host \"a!b\" is not a host name"},
        {"redis://a b:6379", "must not contain spaces"},
        {"redis://a:6379\\n", "control characters"},
        {"unix://run/redis.sock", "the socket's path must be absolute"},
        {"unix://", "the socket's path must be absolute"},
        {"unix:///tmp/r.sock?db=x", "the db \"x\" is not a number"},
        {"unix:///tmp/r.sock?db=", "the db \"\" is not a number"},
        {"unix:///tmp/r.sock?db=1&x=2", "the db \"1&x=2\" is not a number"},
        {"unix:///tmp/r.sock?timeout=1", "the only query parameter is db"},
        {"unix:///tmp/r.sock#x", "fragment"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_redis_error(cases[i].url, cases[i].why);

    /* a password in the URL is refused without being quoted */
    expect_redis_error("redis://:hunter2@127.0.0.1:6379", "give the password in redis_password_file");
    assert_null(strstr(g_err, "hunter2"));
    expect_redis_error("redis://user:hunter2@127.0.0.1:6379/0", "user or password");
    assert_null(strstr(g_err, "hunter2"));

    /* not a string */
    expect_error(load_top("\"redis\": 6379"), g_cfg, "redis: ", "must be a non-empty string");
    expect_error(load_top("\"redis\": \"\""), g_cfg, "redis: ", "must be a non-empty string");
    expect_error(load_top("\"redis\": [\"redis://127.0.0.1:6379\"]"), g_cfg, "redis: ", "non-empty string");
}

static void test_redis_sentinel_forms(void **unused)
{
    (void)unused;
    struct config *c = load_redis_ok("redis-sentinel://127.0.0.1:26379/mymaster");
    assert_true(c->redis.on);
    assert_true(c->redis.sentinel);
    assert_false(c->redis.unix_socket);
    assert_int_equal(c->redis.nsentinels, 1);
    assert_string_equal(c->redis.sentinels[0].host, "127.0.0.1");
    assert_int_equal(c->redis.sentinels[0].port, 26379);
    assert_string_equal(c->redis.master, "mymaster");
    assert_int_equal(c->redis.db, 0);
    assert_null(c->redis.sentinel_password);
    expect_address(&c->redis, "redis-sentinel://127.0.0.1:26379/mymaster");
    config_unref(c);

    c = load_redis_ok("redis-sentinel://s1.example:26379,[::1]:26380,10.0.0.3:1/Shop_m-1.a:b?db=3");
    assert_int_equal(c->redis.nsentinels, 3);
    assert_string_equal(c->redis.sentinels[0].host, "s1.example");
    assert_string_equal(c->redis.sentinels[1].host, "::1");
    assert_int_equal(c->redis.sentinels[1].port, 26380);
    assert_string_equal(c->redis.sentinels[2].host, "10.0.0.3");
    assert_int_equal(c->redis.sentinels[2].port, 1);
    assert_string_equal(c->redis.master, "Shop_m-1.a:b");
    assert_int_equal(c->redis.db, 3);
    expect_address(&c->redis, "redis-sentinel://s1.example:26379,[::1]:26380,10.0.0.3:1/Shop_m-1.a:b?db=3");
    config_unref(c);

    /* the most Sentinels, and the longest master name */
    char url[800], name[80];
    memset(name, 'n', CONFIG_REDIS_MASTER_MAX);
    name[CONFIG_REDIS_MASTER_MAX] = '\0';
    int n = snprintf(url, sizeof url, "redis-sentinel://");
    for (int i = 0; i < CONFIG_REDIS_SENTINELS_MAX; i++)
        n += snprintf(url + n, sizeof url - (size_t)n, "%s127.0.0.%d:%d", i ? "," : "", i + 1, 26379 + i);
    snprintf(url + n, sizeof url - (size_t)n, "/%s", name);
    c = load_redis_ok(url);
    assert_int_equal(c->redis.nsentinels, CONFIG_REDIS_SENTINELS_MAX);
    assert_int_equal(c->redis.sentinels[CONFIG_REDIS_SENTINELS_MAX - 1].port, 26379 + CONFIG_REDIS_SENTINELS_MAX - 1);
    assert_string_equal(c->redis.master, name);
    config_unref(c);
    /* one more of each: refused */
    snprintf(url + n, sizeof url - (size_t)n, "/%sn", name);
    expect_redis_error(url, "the master's name is longer than 64 characters");
    snprintf(url + n, sizeof url - (size_t)n, ",127.0.0.9:1/m");
    expect_redis_error(url, "more than 8 Sentinels");
}

static void test_redis_sentinel_refused(void **unused)
{
    (void)unused;
    static const struct {
        const char *url, *why;
    } cases[] = {
        {"redis-sentinel://", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel:///m", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel://127.0.0.1:26379,/m", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel://,127.0.0.1:26379/m", "a Sentinel's HOST:PORT is missing"},
        {"redis-sentinel://127.0.0.1/m", "the port is missing after \"127.0.0.1\""},
        {"redis-sentinel://127.0.0.1:26379,s2/m", "the port is missing after \"s2\""},
        {"redis-sentinel://127.0.0.1:26379,s2:x/m", "the port \"x\" is not a number"},
        {"redis-sentinel://127.0.0.1:0/m", "the port 0 is out of range"},
        {"redis-sentinel://[::1/m", "IPv6 address in brackets is not closed"},
        {"redis-sentinel://a!b:1/m", "the host \"a!b\" is not a host name"},
        {"redis-sentinel://127.0.0.1:26379", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379/", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379/?db=1", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379?db=1", "the master's name is missing"},
        {"redis-sentinel://127.0.0.1:26379/my/master", "the master's name \"my/master\" may only hold"},
        {"redis-sentinel://127.0.0.1:26379/m?db=x", "the db \"x\" is not a number"},
        {"redis-sentinel://127.0.0.1:26379/m?db=", "the db \"\" is not a number"},
        {"redis-sentinel://127.0.0.1:26379/m?timeout=1", "the only query parameter is db"},
        {"redis-sentinel://127.0.0.1:26379/m#x", "fragment"},
        {"redis-sentinel://127.0.0.1:26379 /m", "must not contain spaces"},
        {"Redis-Sentinel://127.0.0.1:26379/m", "must start with redis://, unix:// or redis-sentinel://"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_redis_error(cases[i].url, cases[i].why);
    /* a password in the URL is refused without being quoted */
    expect_redis_error("redis-sentinel://:hunter2@127.0.0.1:26379/m", "redis_sentinel_password_file");
    assert_null(strstr(g_err, "hunter2"));
}

static void test_redis_sentinel_password_file(void **unused)
{
    (void)unused;
    char top[700];
    put_file("redis_pw", "master-pw\n");
    put_file("sentinel_pw", " sentinel pw \n");
    snprintf(top, sizeof top,
             "\"redis\": \"redis-sentinel://127.0.0.1:26379/m\", \"redis_password_file\": \"%s/redis_pw\", "
             "\"redis_sentinel_password_file\": \"%s/sentinel_pw\"", g_dir, g_dir);
    struct config *c = expect_ok(load_top(top));
    assert_string_equal(c->redis.password, "master-pw");
    assert_string_equal(c->redis.sentinel_password, "sentinel pw");
    config_unref(c);
    /* the same rules as redis_password_file: a control character, a missing file */
    put_file("sentinel_pw", "zqx\001word\n");
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "without control characters");
    assert_null(strstr(g_err, "zqx"));
    snprintf(top, sizeof top,
             "\"redis\": \"redis-sentinel://127.0.0.1:26379/m\", \"redis_sentinel_password_file\": \"%s/nope_pw\"",
             g_dir);
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "nope_pw");
    /* without Sentinels, or without redis: refused */
    put_file("sentinel_pw", "pw\n");
    snprintf(top, sizeof top,
             "\"redis\": \"redis://127.0.0.1:6379\", \"redis_sentinel_password_file\": \"%s/sentinel_pw\"", g_dir);
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "redis names no Sentinels");
    snprintf(top, sizeof top, "\"redis_sentinel_password_file\": \"%s/sentinel_pw\"", g_dir);
    expect_error(load_top(top), g_cfg, "redis_sentinel_password_file", "is set but redis is not");
}

static void test_redis_prefix(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"Shop_2-a.b:\""));
    assert_string_equal(c->redis.prefix, "Shop_2-a.b:");
    config_unref(c);

    char top[400], prefix[70];
    memset(prefix, 'p', 64);
    prefix[64] = '\0';
    snprintf(top, sizeof top, "\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"%s\"", prefix);
    c = expect_ok(load_top(top));
    assert_string_equal(c->redis.prefix, prefix);
    config_unref(c);
    strcat(prefix, "p");
    snprintf(top, sizeof top, "\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"%s\"", prefix);
    expect_error(load_top(top), g_cfg, "redis_prefix", "is 65 characters long: at most 64");

    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"kembali/\""), g_cfg,
                 "redis_prefix", "the character '/' (at 8) is not allowed");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"a b\""), g_cfg,
                 "redis_prefix", "a space (at 2) is not allowed");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"k\\u00e9\""), g_cfg,
                 "redis_prefix", "the byte 0xc3 (at 2) is not allowed");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"k*\""), g_cfg,
                 "redis_prefix", "only A-Z a-z 0-9 : _ - .");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": \"\""), g_cfg,
                 "redis_prefix", "non-empty string");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_prefix\": 1"), g_cfg,
                 "redis_prefix", "non-empty string");
}

static void test_redis_hosts(void **unused)
{
    (void)unused;
    struct config *c = expect_ok(load_top("\"redis\": \"unix:///tmp/r.sock\", \"redis_hosts\": 1"));
    assert_int_equal(c->redis.hosts, 1);
    config_unref(c);
    c = expect_ok(load_top("\"redis\": \"unix:///tmp/r.sock\", \"redis_hosts\": 64"));
    assert_int_equal(c->redis.hosts, CONFIG_REDIS_HOSTS_MAX);
    config_unref(c);
    static const char *const bad[] = {"0", "65", "-1", "\"2\"", "2.5", "true"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char top[200];
        snprintf(top, sizeof top, "\"redis\": \"unix:///tmp/r.sock\", \"redis_hosts\": %s", bad[i]);
        expect_error(load_top(top), g_cfg, "redis_hosts", "must be an integer from 1 to 64");
    }
}

/* redis_password_file, redis_prefix and redis_hosts mean nothing without redis */
static void test_redis_keys_need_redis(void **unused)
{
    (void)unused;
    char top[600];
    snprintf(top, sizeof top, "\"redis_password_file\": \"%s/key_b\"", g_dir);
    expect_error(load_top(top), g_cfg, "redis_password_file", "is set but redis is not");
    expect_error(load_top("\"redis_prefix\": \"x:\""), g_cfg, "redis_prefix", "is set but redis is not");
    expect_error(load_top("\"redis_hosts\": 3"), g_cfg, "redis_hosts", "is set but redis is not");
    expect_error(load_top("\"redis\": null, \"redis_hosts\": 3"), g_cfg, "redis_hosts", "is set but redis is not");
    /* all three named at once */
    snprintf(top, sizeof top, "\"redis_password_file\": \"%s/key_b\", \"redis_prefix\": \"x:\", \"redis_hosts\": 3",
             g_dir);
    expect_error(load_top(top), g_cfg, "redis_password_file", "is set but redis is not");
    assert_non_null(strstr(g_err, "redis_prefix: is set"));
    assert_non_null(strstr(g_err, "redis_hosts: is set"));
    assert_null(strstr(g_err, "sk_test_bbb"));
}

/* load_top with redis and redis_password_file = g_dir/rel */
static struct config *load_password(const char *rel)
{
    char top[600];
    snprintf(top, sizeof top, "\"redis\": \"redis://127.0.0.1:6379\", \"redis_password_file\": \"%s/%s\"", g_dir,
             rel);
    return load_top(top);
}

static void test_redis_password_file(void **unused)
{
    (void)unused;
    /* the first line, trimmed; spaces inside are the password's */
    put_file("redis_pw", " \tpass word:x \t\r\nsecond line\n");
    struct config *c = expect_ok(load_password("redis_pw"));
    assert_string_equal(c->redis.password, "pass word:x");
    config_unref(c);
    put_file("redis_pw", "no-newline");
    c = expect_ok(load_password("redis_pw"));
    assert_string_equal(c->redis.password, "no-newline");
    config_unref(c);

    /* the longest: 512 bytes */
    char big[700];
    memset(big, 'w', 512);
    big[512] = '\n';
    big[513] = '\0';
    put_file("redis_pw", big);
    c = expect_ok(load_password("redis_pw"));
    assert_int_equal(strlen(c->redis.password), CONFIG_REDIS_PASSWORD_MAX);
    config_unref(c);
    /* longer: refused, never quoted */
    memset(big, 'w', 520);
    big[520] = '\n';
    big[521] = '\0';
    put_file("redis_pw", big);
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "must be 1-512 bytes");
    assert_null(strstr(g_err, "wwwwwwww"));
    memset(big, 'w', 650);
    big[650] = '\0';
    put_file("redis_pw", big);
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "longer than a password can be");
    assert_null(strstr(g_err, "wwwwwwww"));

    /* empty, blank, a control character */
    put_file("redis_pw", "");
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "is empty");
    put_file("redis_pw", "  \t\n");
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "must be 1-512 bytes");
    put_file("redis_pw", "zqx\001word\n");
    expect_error(load_password("redis_pw"), g_cfg, "redis_password_file", "without control characters");
    assert_null(strstr(g_err, "zqx"));

    /* missing: the message names the file */
    expect_error(load_password("no_such_password"), g_cfg, "redis_password_file", "no_such_password");
    /* not a regular file */
    expect_error(load_password(""), g_cfg, "redis_password_file", "is not a regular file");
    expect_error(load_top("\"redis\": \"redis://127.0.0.1:6379\", \"redis_password_file\": \"\""), g_cfg,
                 "redis_password_file", "non-empty string");
}

/* The password file follows the key files' rules: others may not read it,
 * group and others may not write it; the message names the file. */
static void test_redis_password_file_modes(void **unused)
{
    (void)unused;
    const struct {
        mode_t mode;
        bool ok;
    } cases[] = {{0644, false}, {0660, false}, {0602, false}, {0604, false}, {0620, false}, {0666, false},
                 {0600, true}, {0640, true}, {0400, true}, {0440, true}};
    char path[512];
    snprintf(path, sizeof path, "%s/redis_pw_mode", g_dir);
    put_file("redis_pw_mode", "pw-mode-secret\n");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        assert_int_equal(chmod(path, cases[i].mode), 0);
        struct config *c = load_password("redis_pw_mode");
        if (cases[i].ok != (c != NULL))
            print_error("mode %04o: %s (%s)\n", (unsigned)cases[i].mode, c ? "accepted" : "refused", g_err);
        if (cases[i].ok) {
            assert_non_null(c);
            assert_string_equal(c->redis.password, "pw-mode-secret");
            config_unref(c);
        } else {
            expect_error(c, g_cfg, "redis_password_file", path);
            assert_non_null(strstr(g_err, "a password file must not be readable by others"));
            assert_null(strstr(g_err, "pw-mode-secret"));
        }
    }
    /* a FIFO is refused, never waited on */
    snprintf(path, sizeof path, "%s/redis_pw_fifo", g_dir);
    unlink(path);
    assert_int_equal(mkfifo(path, 0600), 0);
    expect_error(load_password("redis_pw_fifo"), g_cfg, "redis_password_file", "not a regular file");
}

/* keys_dir confines the shops' keys, not the operator's Redis password */
static void test_redis_password_outside_keys_dir(void **unused)
{
    (void)unused;
    make_dir("rkeys");
    put_file("rkeys/key", "sk_test_rkeys\n");
    put_file("redis_pw_out", "outside-pw\n");
    struct config *c = expect_ok(load_fmt(
        HEAD "\"keys_dir\": \"%s/rkeys\", \"redis\": \"unix:///tmp/r.sock?db=1\", "
             "\"redis_password_file\": \"%s/redis_pw_out\", "
             "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/rkeys/key\"}]}",
        g_dir, g_dir, g_dir));
    assert_string_equal(c->redis.password, "outside-pw");
    assert_string_equal(c->shops[0].secret, "sk_test_rkeys");
    config_unref(c);
}

/* Every other error of a configuration with a password: the password is
 * never in the messages. */
static void test_redis_password_never_in_errors(void **unused)
{
    (void)unused;
    put_file("redis_pw_quiet", "quiet-password-42\n");
    struct config *c = load_fmt(HEAD "\"redis\": \"redis://127.0.0.1:0\", \"redis_password_file\": \"%s/redis_pw_quiet\", "
                                     "\"redis_prefix\": \"a b\", \"redis_hosts\": 0, \"colour\": 1, "
                                     "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}",
                                g_dir, g_dir);
    expect_error(c, g_cfg, "redis: the port 0 is out of range", NULL);
    assert_non_null(strstr(g_err, "redis_prefix"));
    assert_non_null(strstr(g_err, "redis_hosts"));
    assert_non_null(strstr(g_err, "colour"));
    assert_null(strstr(g_err, "quiet-password"));
}

/* A reload reads the password (and the rest) again; the serving
 * configuration keeps its own. */
static void test_redis_reload_reads_again(void **unused)
{
    (void)unused;
    put_file("redis_pw_reload", "first-pw\n");
    struct config *c1 = expect_ok(load_fmt(
        HEAD "\"redis\": \"redis://127.0.0.1:6379/1\", \"redis_password_file\": \"%s/redis_pw_reload\", "
             "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}",
        g_dir, g_dir));
    assert_string_equal(c1->redis.password, "first-pw");
    put_file("redis_pw_reload", "second-pw\n");
    FILE *f = fopen(g_cfg, "w");
    assert_non_null(f);
    fprintf(f, HEAD "\"redis\": \"unix:///tmp/r2.sock?db=2\", \"redis_password_file\": \"%s/redis_pw_reload\", "
                    "\"redis_prefix\": \"k2:\", \"redis_hosts\": 5, "
                    "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}",
            g_dir, g_dir);
    assert_int_equal(fclose(f), 0);
    struct config *c2 = expect_ok(config_reload(g_cfg, c1, g_err, sizeof g_err));
    assert_string_equal(c2->redis.password, "second-pw");
    assert_true(c2->redis.unix_socket);
    assert_string_equal(c2->redis.path, "/tmp/r2.sock");
    assert_int_equal(c2->redis.db, 2);
    assert_string_equal(c2->redis.prefix, "k2:");
    assert_int_equal(c2->redis.hosts, 5);
    assert_string_equal(c1->redis.password, "first-pw");
    assert_false(c1->redis.unix_socket);
    config_unref(c1);
    /* and without redis again: no password kept */
    f = fopen(g_cfg, "w");
    assert_non_null(f);
    fprintf(f, HEAD "\"shops\": [{\"id\": \"s\", \"secret_key_file\": \"%s/key_b\"}]}", g_dir);
    assert_int_equal(fclose(f), 0);
    struct config *c3 = expect_ok(config_reload(g_cfg, c2, g_err, sizeof g_err));
    assert_false(c3->redis.on);
    assert_null(c3->redis.password);
    config_unref(c2);
    config_unref(c3);
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
        cmocka_unit_test(test_key_file_problems),
        cmocka_unit_test(test_secret_never_in_errors),
        cmocka_unit_test(test_duplicates),
        cmocka_unit_test(test_invalid_shop_id),
        cmocka_unit_test(test_id_param),
        cmocka_unit_test(test_hosts_urls_origins),
        cmocka_unit_test(test_shops_dir),
        cmocka_unit_test(test_shop_file_typo_others_load),
        cmocka_unit_test(test_keys_dir),
        cmocka_unit_test(test_shop_file_tenant_rules),
        cmocka_unit_test(test_reload_keeps_previous_version),
        cmocka_unit_test(test_tenant_key_is_its_own),
        cmocka_unit_test(test_tenant_hosts_never_taken_over),
        cmocka_unit_test(test_broken_tenant_claims_its_hosts),
        cmocka_unit_test(test_tenant_notify_secret_is_its_own),
        cmocka_unit_test(test_pick_no_fallback_with_shops_dir),
        cmocka_unit_test(test_size_caps),
        cmocka_unit_test(test_rendered_page_cap),
        cmocka_unit_test(test_streamed_page_cap),
        cmocka_unit_test(test_key_file_modes),
        cmocka_unit_test(test_max_held),
        cmocka_unit_test(test_syntax_errors),
        cmocka_unit_test(test_no_shops),
        cmocka_unit_test(test_templates_problems),
        cmocka_unit_test(test_pick_shop),
        cmocka_unit_test(test_pick_single_shop),
        cmocka_unit_test(test_pick_ipv6_host_matching),
        cmocka_unit_test(test_ipv6_host_configurable),
        cmocka_unit_test(test_host_trailing_dot_in_config),
        cmocka_unit_test(test_shops_dir_empty),
        cmocka_unit_test(test_redis_absent),
        cmocka_unit_test(test_redis_tcp_forms),
        cmocka_unit_test(test_redis_unix_forms),
        cmocka_unit_test(test_redis_refused_urls),
        cmocka_unit_test(test_redis_sentinel_forms),
        cmocka_unit_test(test_redis_sentinel_refused),
        cmocka_unit_test(test_redis_sentinel_password_file),
        cmocka_unit_test(test_redis_prefix),
        cmocka_unit_test(test_redis_hosts),
        cmocka_unit_test(test_redis_keys_need_redis),
        cmocka_unit_test(test_redis_password_file),
        cmocka_unit_test(test_redis_password_file_modes),
        cmocka_unit_test(test_redis_password_outside_keys_dir),
        cmocka_unit_test(test_redis_password_never_in_errors),
        cmocka_unit_test(test_redis_reload_reads_again),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
