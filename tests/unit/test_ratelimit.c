/* test_ratelimit.c - unit tests of src/ratelimit.c: Retry-After and the
 * RateLimit headers in Kasera's legacy form and the RFC 9651 form. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "ratelimit.h"

/* 2026-10-10 12:00:00 UTC, a Saturday. */
#define NOW_WALL 1791633600LL

static void test_retry_after_seconds(void **unused)
{
    (void)unused;
    assert_int_equal(rl_retry_after_ms("1", NOW_WALL), 1000);
    assert_int_equal(rl_retry_after_ms(" 2 ", NOW_WALL), 2000);
    assert_int_equal(rl_retry_after_ms("\t3", NOW_WALL), 3000);
    assert_int_equal(rl_retry_after_ms("0", NOW_WALL), 0);
    assert_int_equal(rl_retry_after_ms("60", NOW_WALL), 60000);
    assert_int_equal(rl_retry_after_ms("007", NOW_WALL), 7000);
}

static void test_retry_after_capped(void **unused)
{
    (void)unused;
    assert_int_equal(rl_retry_after_ms("3600", NOW_WALL), RL_MAX_WAIT_MS);
    assert_int_equal(rl_retry_after_ms("3601", NOW_WALL), RL_MAX_WAIT_MS);
    assert_int_equal(rl_retry_after_ms("86400", NOW_WALL), RL_MAX_WAIT_MS);
    assert_int_equal(rl_retry_after_ms("99999999999", NOW_WALL), RL_MAX_WAIT_MS);
    assert_int_equal(rl_retry_after_ms("999999999999999999999999999999", NOW_WALL), RL_MAX_WAIT_MS);
}

static void test_retry_after_invalid(void **unused)
{
    (void)unused;
    assert_int_equal(rl_retry_after_ms(NULL, NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms(" ", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("-1", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("1.5", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("abc", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("1 2", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("+5", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("5s", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("0x10", NOW_WALL), -1);
}

static void test_retry_after_imf_fixdate(void **unused)
{
    (void)unused;
    assert_int_equal(rl_retry_after_ms("Sat, 10 Oct 2026 12:00:05 GMT", NOW_WALL), 5000);
    assert_int_equal(rl_retry_after_ms("Sat, 10 Oct 2026 12:01:00 GMT", NOW_WALL), 60000);
    assert_int_equal(rl_retry_after_ms("Sat, 10 Oct 2026 12:00:00 GMT", NOW_WALL), 0);
    /* past: 0 */
    assert_int_equal(rl_retry_after_ms("Sat, 10 Oct 2026 11:59:59 GMT", NOW_WALL), 0);
    assert_int_equal(rl_retry_after_ms("Sun, 06 Nov 1994 08:49:37 GMT", NOW_WALL), 0);
    /* far future: capped */
    assert_int_equal(rl_retry_after_ms("Sun, 11 Oct 2026 12:00:00 GMT", NOW_WALL), RL_MAX_WAIT_MS);
    assert_int_equal(rl_retry_after_ms("Thu, 01 Jan 2099 00:00:00 GMT", NOW_WALL), RL_MAX_WAIT_MS);
}

static void test_retry_after_rfc850(void **unused)
{
    (void)unused;
    assert_int_equal(rl_retry_after_ms("Saturday, 10-Oct-26 12:00:07 GMT", NOW_WALL), 7000);
    assert_int_equal(rl_retry_after_ms("Friday, 09-Oct-26 12:00:07 GMT", NOW_WALL), 0);
    assert_int_equal(rl_retry_after_ms("Sunday, 06-Nov-94 08:49:37 GMT", NOW_WALL), 0);
}

static void test_retry_after_asctime(void **unused)
{
    (void)unused;
    assert_int_equal(rl_retry_after_ms("Sat Oct 10 12:00:09 2026", NOW_WALL), 9000);
    assert_int_equal(rl_retry_after_ms("Fri Oct  9 12:00:09 2026", NOW_WALL), 0);
    assert_int_equal(rl_retry_after_ms("Sun Nov  6 08:49:37 1994", NOW_WALL), 0);
}

static void test_retry_after_bad_dates(void **unused)
{
    (void)unused;
    assert_int_equal(rl_retry_after_ms("Sat, 10 Oct 2026 12:00:05 GMT junk", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("Sat, 10 Foo 2026 12:00:05 GMT", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("Sat, 10 Oct 2026", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("2026-10-10T12:00:05Z", NOW_WALL), -1);
    assert_int_equal(rl_retry_after_ms("Sat, 10 Oct 2026 25:00:05 GMT", NOW_WALL), -1);
}

/* ---- rl_parse ---- */

static struct rl_info parse(const char *limit, const char *rem, const char *reset, const char *sf, const char *pol)
{
    struct rl_info r;
    memset(&r, 0xa5, sizeof r); /* the function must set every field */
    rl_parse(limit, rem, reset, sf, pol, &r);
    return r;
}

static void test_parse_nothing(void **unused)
{
    (void)unused;
    struct rl_info r = parse(NULL, NULL, NULL, NULL, NULL);
    assert_int_equal(r.scope, RL_NONE);
    assert_int_equal(r.reset_ms, 0);
}

static void test_parse_legacy(void **unused)
{
    (void)unused;
    struct rl_info r = parse("1", "0", "1", NULL, NULL);
    assert_int_equal(r.scope, RL_TX);
    assert_int_equal(r.reset_ms, 1000);

    r = parse(NULL, "0", "3", NULL, NULL);
    assert_int_equal(r.scope, RL_TX);
    assert_int_equal(r.reset_ms, 3000);

    r = parse("5", "3", "1", NULL, NULL);
    assert_int_equal(r.scope, RL_NONE);

    r = parse("1", "0", NULL, NULL, NULL); /* no reset stated: nothing to act on */
    assert_int_equal(r.scope, RL_NONE);

    r = parse("1", "0", "999999", NULL, NULL);
    assert_int_equal(r.scope, RL_TX);
    assert_int_equal(r.reset_ms, RL_MAX_WAIT_MS);
}

static void test_parse_legacy_garbage(void **unused)
{
    (void)unused;
    const char *bad[] = {"", "abc", "-1", "0.5", "1e3", " ", "0 0", "\x01"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct rl_info r = parse("1", bad[i], "1", NULL, NULL);
        assert_int_equal(r.scope, RL_NONE);
        r = parse("1", "0", bad[i], NULL, NULL);
        assert_int_equal(r.scope, RL_NONE);
        r = parse(bad[i], "2", bad[i], NULL, NULL);
        assert_int_equal(r.scope, RL_NONE);
    }
}

static void test_parse_sf_tx(void **unused)
{
    (void)unused;
    struct rl_info r = parse(NULL, NULL, NULL, "\"tx\";r=0;t=1", "\"tx\";q=1;w=1");
    assert_int_equal(r.scope, RL_TX);
    assert_int_equal(r.reset_ms, 1000);
}

static void test_parse_sf_key(void **unused)
{
    (void)unused;
    struct rl_info r = parse(NULL, NULL, NULL, "\"key\";r=0;t=35", "\"key\";q=300;w=60");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 35000);
}

static void test_parse_sf_remaining(void **unused)
{
    (void)unused;
    struct rl_info r = parse(NULL, NULL, NULL, "\"key\";r=842;t=35", "\"key\";q=1000;w=60");
    assert_int_equal(r.scope, RL_NONE);
    r = parse(NULL, NULL, NULL, "\"tx\";r=1;t=1", "\"tx\";q=1;w=1");
    assert_int_equal(r.scope, RL_NONE);
}

static void test_parse_sf_policy_missing(void **unused)
{
    (void)unused;
    /* a window we cannot match to a policy is taken as the key's: conservative */
    struct rl_info r = parse(NULL, NULL, NULL, "\"tx\";r=0;t=1", NULL);
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 1000);
    r = parse(NULL, NULL, NULL, "\"tx\";r=0;t=2", "\"other\";q=1;w=1");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 2000);
}

static void test_parse_sf_lists(void **unused)
{
    (void)unused;
    /* two windows, only the per-transaction one exhausted */
    struct rl_info r = parse(NULL, NULL, NULL, "\"key\";r=200;t=40, \"tx\";r=0;t=1",
                             "\"key\";q=300;w=60, \"tx\";q=1;w=1");
    assert_int_equal(r.scope, RL_TX);
    assert_int_equal(r.reset_ms, 1000);

    /* the key's exhausted, the transaction's not */
    r = parse(NULL, NULL, NULL, "\"tx\";r=1;t=1,\"key\";r=0;t=40", "\"tx\";q=1;w=1,\"key\";q=300;w=60");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 40000);

    /* both exhausted: the key's outranks, whatever the order */
    r = parse(NULL, NULL, NULL, "\"key\";r=0;t=20, \"tx\";r=0;t=50", "\"key\";q=300;w=60, \"tx\";q=1;w=1");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 20000);
    r = parse(NULL, NULL, NULL, "\"tx\";r=0;t=50, \"key\";r=0;t=20", "\"key\";q=300;w=60, \"tx\";q=1;w=1");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 20000);

    /* two key windows exhausted: the longer wait wins */
    r = parse(NULL, NULL, NULL, "\"a\";r=0;t=5, \"b\";r=0;t=30", "\"a\";q=10;w=10, \"b\";q=300;w=60");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 30000);
    r = parse(NULL, NULL, NULL, "\"b\";r=0;t=30, \"a\";r=0;t=5", "\"a\";q=10;w=10, \"b\";q=300;w=60");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 30000);

    /* parameters in any order, spaces after ';' */
    r = parse(NULL, NULL, NULL, "\"tx\"; t=3; r=0", "\"tx\"; w=1; q=1");
    assert_int_equal(r.scope, RL_TX);
    assert_int_equal(r.reset_ms, 3000);
}

static void test_parse_both_forms(void **unused)
{
    (void)unused;
    /* legacy tx window plus an exhausted key window: the key's wins */
    struct rl_info r = parse("1", "0", "1", "\"key\";r=0;t=35", "\"key\";q=300;w=60");
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, 35000);
    /* legacy tx window and a longer structured tx window: the longer */
    r = parse("1", "0", "1", "\"tx\";r=0;t=4", "\"tx\";q=1;w=1");
    assert_int_equal(r.scope, RL_TX);
    assert_int_equal(r.reset_ms, 4000);
}

static void test_parse_malformed_never_crashes(void **unused)
{
    (void)unused;
    const char *sf[] = {
        "", ",", ",,,", ";", ";;;", "\"", "\"unterminated", "\";r=0;t=1", "r=0;t=1", "\"a\";r=;t=",
        "\"a\";r=0;t=", "\"a\";r=0;t=-1", "\"a\";r=-0;t=1", "\"a\";r=0;t=1.5", "\"a\";r;t", "\"a\";=0;=1",
        "\"a\";r=0;t=99999999999999999999999999", "\"a\";r=00;t=01", "a;r=0;t=1", " \"a\" ; r=0 ; t=1 ",
        "\"a\";r=0;t=1;r=0;t=2", "=;=;=,=;", "\"\";r=0;t=1", "\x01\x02;r=0\x7f;t=1",
    };
    const char *pol[] = {NULL, "", ",", "\"a\";q=1", "\"a\";q=", "\"a\";q=x;w=1", "\"\";q=1", "\"a\"",
                         "\"a\";q=1;w=1,\"a\";q=300;w=60", ";;;q=1"};
    for (size_t i = 0; i < sizeof sf / sizeof sf[0]; i++) {
        for (size_t j = 0; j < sizeof pol / sizeof pol[0]; j++) {
            struct rl_info r = parse(NULL, NULL, NULL, sf[i], pol[j]);
            assert_true(r.scope == RL_NONE || r.scope == RL_TX || r.scope == RL_KEY);
            assert_true(r.reset_ms >= 0 && r.reset_ms <= RL_MAX_WAIT_MS);
            if (r.scope == RL_NONE)
                assert_int_equal(r.reset_ms, 0);
        }
    }
    /* a few with known meaning */
    struct rl_info r = parse(NULL, NULL, NULL, "\"a\";r=0;t=99999999999999999999999999", NULL);
    assert_int_equal(r.scope, RL_KEY);
    assert_int_equal(r.reset_ms, RL_MAX_WAIT_MS);
    r = parse(NULL, NULL, NULL, "\"a\";r=0;t=-1", "\"a\";q=1;w=1");
    assert_int_equal(r.scope, RL_NONE);
    r = parse(NULL, NULL, NULL, "\"a\";r=0;t=1.5", "\"a\";q=1;w=1");
    assert_int_equal(r.scope, RL_NONE);

    /* very long values: no overflow of the fixed name buffers */
    size_t n = 20000;
    char *longv = malloc(n + 1);
    assert_non_null(longv);
    longv[0] = '"';
    memset(longv + 1, 'n', n - 1);
    longv[n] = '\0';
    r = parse(NULL, NULL, NULL, longv, longv);
    assert_int_equal(r.scope, RL_NONE);
    memcpy(longv + n - 10, "\";r=0;t=2", 9);
    longv[n - 1] = '\0';
    r = parse(longv, longv, longv, longv, longv);
    assert_int_not_equal(r.scope, RL_NONE); /* exhausted, whatever its policy reads as */
    assert_int_equal(r.reset_ms, 2000);
    for (size_t i = 0; i < n; i++)
        longv[i] = (i % 3 == 0) ? ';' : (i % 3 == 1) ? 'r' : '=';
    longv[n] = '\0';
    r = parse(NULL, longv, longv, longv, longv);
    assert_true(r.scope == RL_NONE || r.reset_ms <= RL_MAX_WAIT_MS);
    free(longv);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_retry_after_seconds),
        cmocka_unit_test(test_retry_after_capped),
        cmocka_unit_test(test_retry_after_invalid),
        cmocka_unit_test(test_retry_after_imf_fixdate),
        cmocka_unit_test(test_retry_after_rfc850),
        cmocka_unit_test(test_retry_after_asctime),
        cmocka_unit_test(test_retry_after_bad_dates),
        cmocka_unit_test(test_parse_nothing),
        cmocka_unit_test(test_parse_legacy),
        cmocka_unit_test(test_parse_legacy_garbage),
        cmocka_unit_test(test_parse_sf_tx),
        cmocka_unit_test(test_parse_sf_key),
        cmocka_unit_test(test_parse_sf_remaining),
        cmocka_unit_test(test_parse_sf_policy_missing),
        cmocka_unit_test(test_parse_sf_lists),
        cmocka_unit_test(test_parse_both_forms),
        cmocka_unit_test(test_parse_malformed_never_crashes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
