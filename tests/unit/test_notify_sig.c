/* test_notify_sig.c - unit tests of src/notify_sig.c: the signature of a
 * told status, with a fake clock. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "notify_sig.h"

#define SECRET "whsec-toko-a"
#define NOW 1764000000LL /* the fake clock */
#define BODY "{\"status\": \"succeeded\"}"

/* The header the shop's backend sends: hash_hmac('sha256', "$t.$id.$body", $secret). */
static void sign(char *out, size_t n, const char *t, const char *id, const char *body, const char *secret)
{
    char hex[65];
    assert_int_equal(notify_sig_hmac(secret, t, strlen(t), id, body, strlen(body), hex), 0);
    snprintf(out, n, "t=%s,v1=%s", t, hex);
}

static enum notify_sig check(const char *header, int64_t now)
{
    char why[256] = "";
    enum notify_sig r = notify_sig_check(header, SECRET, "T1", BODY, strlen(BODY), now, why, sizeof why);
    if (r != NOTIFY_SIG_OK) {
        assert_true(why[0] != '\0');
        assert_null(strstr(why, SECRET)); /* the secret is never in a reason */
    }
    return r;
}

/* A known vector: HMAC-SHA256("key", "1764000000.T1.body"), computed by
 * another implementation (python3 -c 'import hmac,hashlib; ...'). */
static void test_known_vector(void **unused)
{
    (void)unused;
    char hex[65];
    assert_int_equal(notify_sig_hmac("key", "1764000000", 10, "T1", "body", 4, hex), 0);
    assert_string_equal(hex, "2a618fa28fbaae5cb85fece0134d1b3ce739667ce0d061c20d30669268054481");
}

static void test_right_signature(void **unused)
{
    (void)unused;
    char h[160];
    sign(h, sizeof h, "1764000000", "T1", BODY, SECRET);
    assert_int_equal(check(h, NOW), NOTIFY_SIG_OK);
    /* spaces around items, and an unknown scheme beside v1, are fine */
    char h2[200];
    snprintf(h2, sizeof h2, " %s , v0=whatever", h);
    assert_int_equal(check(h2, NOW), NOTIFY_SIG_OK);
}

static void test_window(void **unused)
{
    (void)unused;
    char h[160];
    sign(h, sizeof h, "1764000000", "T1", BODY, SECRET);
    assert_int_equal(check(h, NOW + NOTIFY_SIG_WINDOW_S), NOTIFY_SIG_OK);
    assert_int_equal(check(h, NOW - NOTIFY_SIG_WINDOW_S), NOTIFY_SIG_OK);
    assert_int_equal(check(h, NOW + NOTIFY_SIG_WINDOW_S + 1), NOTIFY_SIG_STALE); /* 301 s old */
    assert_int_equal(check(h, NOW - NOTIFY_SIG_WINDOW_S - 1), NOTIFY_SIG_STALE); /* from the future */
    /* a huge timestamp saturates, never overflows */
    sign(h, sizeof h, "9999999999999999999", "T1", BODY, SECRET);
    assert_int_equal(check(h, NOW), NOTIFY_SIG_STALE);
    sign(h, sizeof h, "0", "T1", BODY, SECRET);
    assert_int_equal(check(h, NOW), NOTIFY_SIG_STALE);
}

static void test_wrong(void **unused)
{
    (void)unused;
    char h[160];
    sign(h, sizeof h, "1764000000", "T1", BODY, "whsec-toko-b"); /* another shop's secret */
    assert_int_equal(check(h, NOW), NOTIFY_SIG_WRONG);
    sign(h, sizeof h, "1764000000", "T2", BODY, SECRET); /* another id */
    assert_int_equal(check(h, NOW), NOTIFY_SIG_WRONG);
    sign(h, sizeof h, "1764000000", "T1", "{\"status\": \"failed\"}", SECRET); /* another body */
    assert_int_equal(check(h, NOW), NOTIFY_SIG_WRONG);
    sign(h, sizeof h, "1764000001", "T1", BODY, SECRET);
    memcpy(h + 2, "1764000000", 10); /* the timestamp changed after signing */
    assert_int_equal(check(h, NOW), NOTIFY_SIG_WRONG);
    sign(h, sizeof h, "1764000000", "T1", BODY, SECRET);
    h[strlen(h) - 1] = h[strlen(h) - 1] == '0' ? '1' : '0'; /* one digit off */
    assert_int_equal(check(h, NOW), NOTIFY_SIG_WRONG);
    /* a stale and wrong one says wrong: the clock is only told to signers */
    sign(h, sizeof h, "1", "T1", BODY, "whsec-toko-b");
    assert_int_equal(check(h, NOW), NOTIFY_SIG_WRONG);
}

static void test_missing_and_malformed(void **unused)
{
    (void)unused;
    assert_int_equal(check(NULL, NOW), NOTIFY_SIG_MISSING);
    assert_int_equal(check("", NOW), NOTIFY_SIG_MISSING);
    char h[160], x[300];
    sign(h, sizeof h, "1764000000", "T1", BODY, SECRET);
    const char *v1 = strstr(h, "v1=");
    static const char *const bad[] = {"t=1764000000", "v1=00", ",", "t=,v1=", "garbage", "t=1764000000;v1=0",
                                      "t=-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(check(bad[i], NOW), NOTIFY_SIG_MALFORMED);
    snprintf(x, sizeof x, "%s", v1); /* no t */
    assert_int_equal(check(x, NOW), NOTIFY_SIG_MALFORMED);
    snprintf(x, sizeof x, "t=+1764000000,%s", v1); /* a sign */
    assert_int_equal(check(x, NOW), NOTIFY_SIG_MALFORMED);
    snprintf(x, sizeof x, "t=17640000000000000000,%s", v1); /* 20 digits */
    assert_int_equal(check(x, NOW), NOTIFY_SIG_MALFORMED);
    snprintf(x, sizeof x, "%s,t=1764000000", h); /* two t */
    assert_int_equal(check(x, NOW), NOTIFY_SIG_MALFORMED);
    snprintf(x, sizeof x, "%s,%s", h, v1); /* two v1 */
    assert_int_equal(check(x, NOW), NOTIFY_SIG_MALFORMED);
    snprintf(x, sizeof x, "%s,", h); /* an empty item */
    assert_int_equal(check(x, NOW), NOTIFY_SIG_MALFORMED);
    for (char *p = strstr(h, "v1=") + 3; *p; p++) /* upper case hex */
        if (*p >= 'a' && *p <= 'f')
            *p = (char)(*p - 'a' + 'A');
    assert_int_equal(check(h, NOW), NOTIFY_SIG_MALFORMED);
    char big[NOTIFY_SIG_HEADER_MAX + 200];
    sign(h, sizeof h, "1764000000", "T1", BODY, SECRET);
    snprintf(big, sizeof big, "%s,v0=%0*d", h, NOTIFY_SIG_HEADER_MAX, 0); /* too long */
    assert_int_equal(check(big, NOW), NOTIFY_SIG_MALFORMED);
}

/* The body is raw bytes: a NUL inside it is signed like any byte. */
static void test_body_bytes(void **unused)
{
    (void)unused;
    static const char body[] = {'{', '}', '\0', 'x'};
    char hex[65], h[160], why[128];
    assert_int_equal(notify_sig_hmac(SECRET, "5", 1, "T1", body, sizeof body, hex), 0);
    snprintf(h, sizeof h, "t=5,v1=%s", hex);
    assert_int_equal(notify_sig_check(h, SECRET, "T1", body, sizeof body, 5, why, sizeof why), NOTIFY_SIG_OK);
    assert_int_equal(notify_sig_check(h, SECRET, "T1", body, 2, 5, why, sizeof why), NOTIFY_SIG_WRONG);
    /* a tiny reason buffer still ends in a NUL */
    char one[1] = {'x'};
    assert_int_equal(notify_sig_check(NULL, SECRET, "T1", body, 2, 5, one, sizeof one), NOTIFY_SIG_MISSING);
    assert_int_equal(one[0], '\0');
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_known_vector),
        cmocka_unit_test(test_right_signature),
        cmocka_unit_test(test_window),
        cmocka_unit_test(test_wrong),
        cmocka_unit_test(test_missing_and_malformed),
        cmocka_unit_test(test_body_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
