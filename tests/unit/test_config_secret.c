/* test_config_secret.c - unit tests of src/config_secret.c: reading a
 * shop's secret key from its file (modes, owners, problems) and the keys
 * directory; the secret never appears in an error. */
#include "config_fixture.h"

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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_file_problems),
        cmocka_unit_test(test_secret_never_in_errors),
        cmocka_unit_test(test_keys_dir),
        cmocka_unit_test(test_key_file_modes),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
