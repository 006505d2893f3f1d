/* test_classify.c - unit tests of src/classify.c: every case of
 * Kasera's answers (tests/sandbox/README.md) mapped to one outcome. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "classify.h"

/* 2026-10-10 12:00:00 UTC, a Saturday. */
#define NOW_WALL 1791633600LL

static struct api_response resp(long http, const char *body)
{
    struct api_response r;
    memset(&r, 0, sizeof r);
    r.http = http;
    r.body = body;
    r.body_len = body ? strlen(body) : 0;
    return r;
}

static struct outcome run(const struct api_response *r)
{
    struct outcome o;
    memset(&o, 0x5a, sizeof o); /* classify must reset everything */
    classify_response(r, NOW_WALL, &o);
    return o;
}

static struct outcome run_simple(long http, const char *body)
{
    struct api_response r = resp(http, body);
    return run(&r);
}

static const char *err_body(const char *code, const char *message)
{
    static char buf[512];
    snprintf(buf, sizeof buf,
             "{\"error\": {\"code\": \"%s\", \"message\": \"%s\", \"request_id\": \"req_01HZX\"}}", code, message);
    return buf;
}

/* ---- 200 ---- */

static void test_200_each_status(void **unused)
{
    (void)unused;
    static const struct {
        const char *word;
        enum tx_status st;
        int final;
    } cases[] = {
        {"pending", TXS_PENDING, 0},     {"succeeded", TXS_SUCCEEDED, 1}, {"failed", TXS_FAILED, 1},
        {"canceled", TXS_CANCELED, 1},   {"expired", TXS_EXPIRED, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"id\": \"T1\", \"status\": \"%s\", \"amount\": 10000}", cases[i].word);
        struct outcome o = run_simple(200, body);
        assert_int_equal(o.kind, OUT_STATUS);
        assert_int_equal(o.status, cases[i].st);
        assert_string_equal(o.status_word, cases[i].word);
        assert_int_equal(tx_status_final(o.status) != 0, cases[i].final);
        assert_int_equal(o.retry_after_ms, -1);
        assert_int_equal(o.rl.scope, RL_NONE);
        assert_string_equal(o.error_code, "");
        assert_string_equal(o.request_id, "");
        assert_string_equal(o.message, "");
    }
}

static void test_200_unknown_word(void **unused)
{
    (void)unused;
    struct outcome o = run_simple(200, "{\"status\": \"refunded\"}");
    assert_int_equal(o.kind, OUT_STATUS);
    assert_int_equal(o.status, TXS_UNKNOWN);
    assert_string_equal(o.status_word, "refunded");
    assert_false(tx_status_final(o.status));

    o = run_simple(200, "{\"status\": \"partially_paid_2\"}");
    assert_int_equal(o.status, TXS_UNKNOWN);
    assert_string_equal(o.status_word, "partially_paid_2");
}

static void test_200_weird_word(void **unused)
{
    (void)unused;
    const char *bodies[] = {
        "{\"status\": \"Refunded\"}",
        "{\"status\": \"on hold\"}",
        "{\"status\": \"SUCCEEDED\"}",
        "{\"status\": \"succeeded \"}",
        "{\"status\": \"<script>\"}",
        "{\"status\": \"a\\nb\"}",
        "{\"status\": \"dibayar\\u00e9\"}",
        "{\"status\": \"abcdefghijklmnopqrstuvwxyz0123456\"}", /* 33 characters */
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        struct outcome o = run_simple(200, bodies[i]);
        assert_int_equal(o.kind, OUT_STATUS);
        assert_int_equal(o.status, TXS_UNKNOWN);
        assert_string_equal(o.status_word, "unknown");
    }
    /* 32 characters is still a word */
    struct outcome o = run_simple(200, "{\"status\": \"abcdefghijklmnopqrstuvwxyz012345\"}");
    assert_string_equal(o.status_word, "abcdefghijklmnopqrstuvwxyz012345");
}

static void test_200_no_answer(void **unused)
{
    (void)unused;
    const char *bodies[] = {
        NULL,
        "",
        "{",
        "not json",
        "{\"status\": }",
        "{\"id\": \"T1\"}",
        "{\"status\": \"\"}",
        "{\"status\": 3}",
        "{\"status\": null}",
        "{\"status\": [\"succeeded\"]}",
        "[\"succeeded\"]",
        "\"succeeded\"",
        "{\"status\": \"succeeded\", \"status\": \"failed\"}", /* duplicate keys: ambiguous */
        "{\"data\": {\"status\": \"succeeded\"}}",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        struct outcome o = run_simple(200, bodies[i]);
        assert_int_equal(o.kind, OUT_NO_ANSWER);
    }
    /* body_len shorter than the string: only body_len bytes count */
    struct api_response r = resp(200, "{\"status\": \"succeeded\"}");
    r.body_len = 10;
    struct outcome o = run(&r);
    assert_int_equal(o.kind, OUT_NO_ANSWER);
}

static void test_200_legacy_headers(void **unused)
{
    (void)unused;
    struct api_response r = resp(200, "{\"status\": \"pending\"}");
    r.rl_limit = "1";
    r.rl_remaining = "0";
    r.rl_reset = "1";
    struct outcome o = run(&r);
    assert_int_equal(o.kind, OUT_STATUS);
    assert_int_equal(o.status, TXS_PENDING);
    assert_int_equal(o.rl.scope, RL_TX);
    assert_int_equal(o.rl.reset_ms, 1000);

    r.rl_remaining = "1";
    o = run(&r);
    assert_int_equal(o.rl.scope, RL_NONE);

    r.rl_remaining = NULL;
    r.rl_sf = "\"key\";r=0;t=35";
    r.rl_policy = "\"key\";q=300;w=60";
    o = run(&r);
    assert_int_equal(o.kind, OUT_STATUS);
    assert_int_equal(o.rl.scope, RL_KEY);
    assert_int_equal(o.rl.reset_ms, 35000);
}

/* ---- 4xx ---- */

static void test_404(void **unused)
{
    (void)unused;
    struct outcome o = run_simple(404, err_body("not_found", "transaction not found"));
    assert_int_equal(o.kind, OUT_NOT_FOUND);
    assert_string_equal(o.error_code, "not_found");
    assert_string_equal(o.request_id, "req_01HZX");
    o = run_simple(404, NULL);
    assert_int_equal(o.kind, OUT_NOT_FOUND);
    o = run_simple(404, "<html>nginx</html>");
    assert_int_equal(o.kind, OUT_NOT_FOUND);
}

static void test_401(void **unused)
{
    (void)unused;
    struct outcome o = run_simple(401, err_body("unauthorized", "invalid API key"));
    assert_int_equal(o.kind, OUT_UNAUTHORIZED);
    assert_string_equal(o.error_code, "unauthorized");
    assert_string_equal(o.message, "invalid API key");
    o = run_simple(401, NULL);
    assert_int_equal(o.kind, OUT_UNAUTHORIZED);
}

static void test_429_tx_limited_seconds(void **unused)
{
    (void)unused;
    struct api_response r = resp(429, err_body("rate_limited",
                                               "at most one read per second per transaction; use webhooks for status updates"));
    r.retry_after = "1";
    struct outcome o = run(&r);
    assert_int_equal(o.kind, OUT_TX_LIMITED);
    assert_int_equal(o.retry_after_ms, 1000);
    assert_string_equal(o.error_code, "rate_limited");
    assert_string_equal(o.request_id, "req_01HZX");

    r.retry_after = "0";
    o = run(&r);
    assert_int_equal(o.kind, OUT_TX_LIMITED);
    assert_int_equal(o.retry_after_ms, 0);
}

static void test_429_tx_limited_date(void **unused)
{
    (void)unused;
    struct api_response r = resp(429, err_body("rate_limited", "at most one read per second per transaction"));
    r.retry_after = "Sat, 10 Oct 2026 12:00:02 GMT";
    struct outcome o = run(&r);
    assert_int_equal(o.kind, OUT_TX_LIMITED);
    assert_int_equal(o.retry_after_ms, 2000);

    r.retry_after = "Sat, 10 Oct 2026 11:00:00 GMT"; /* in the past: may read now */
    o = run(&r);
    assert_int_equal(o.kind, OUT_TX_LIMITED);
    assert_int_equal(o.retry_after_ms, 0);
}

static void test_429_key_limited(void **unused)
{
    (void)unused;
    struct outcome o = run_simple(429, err_body("rate_limited", "rate limit exceeded"));
    assert_int_equal(o.kind, OUT_KEY_LIMITED);
    assert_int_equal(o.retry_after_ms, -1);
    assert_string_equal(o.error_code, "rate_limited");

    /* a 429 we cannot read: assume the key */
    o = run_simple(429, NULL);
    assert_int_equal(o.kind, OUT_KEY_LIMITED);
    o = run_simple(429, "Too Many Requests");
    assert_int_equal(o.kind, OUT_KEY_LIMITED);
}

static void test_429_auth_blocked(void **unused)
{
    (void)unused;
    const char *msgs[] = {
        "too many failed authentication attempts",
        "Too many Authentication attempts from this IP",
        "terlalu banyak percobaan autentikasi",
    };
    for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
        struct outcome o = run_simple(429, err_body("rate_limited", msgs[i]));
        assert_int_equal(o.kind, OUT_AUTH_BLOCKED);
        assert_int_equal(o.retry_after_ms, -1);

        struct api_response r = resp(429, err_body("rate_limited", msgs[i]));
        r.retry_after = "120";
        o = run(&r);
        assert_int_equal(o.kind, OUT_AUTH_BLOCKED);
        assert_int_equal(o.retry_after_ms, 120000);
    }
}

static void test_429_unverified_caps(void **unused)
{
    (void)unused;
    struct outcome o = run_simple(429, err_body("unverified_count_cap", "verify your account"));
    assert_int_equal(o.kind, OUT_REJECTED);
    assert_string_equal(o.error_code, "unverified_count_cap");
    o = run_simple(429, err_body("unverified_amount_cap", "verify your account"));
    assert_int_equal(o.kind, OUT_REJECTED);
    assert_string_equal(o.error_code, "unverified_amount_cap");
    /* even with a Retry-After: waiting never helps */
    struct api_response r = resp(429, err_body("unverified_count_cap", "x"));
    r.retry_after = "5";
    o = run(&r);
    assert_int_equal(o.kind, OUT_REJECTED);
}

static void test_other_4xx_rejected(void **unused)
{
    (void)unused;
    const long codes[] = {400, 403, 405, 409, 410, 422, 451, 499};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        struct outcome o = run_simple(codes[i], err_body("amount_too_small", "amount below minimum"));
        assert_int_equal(o.kind, OUT_REJECTED);
        assert_string_equal(o.error_code, "amount_too_small");
        assert_string_equal(o.request_id, "req_01HZX");
        o = run_simple(codes[i], NULL);
        assert_int_equal(o.kind, OUT_REJECTED);
    }
}

static void test_5xx_and_transport(void **unused)
{
    (void)unused;
    const long codes[] = {500, 502, 503, 504, 0, 100, 204, 301, 302, 304, 600};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
        struct outcome o = run_simple(codes[i], err_body("internal", "oops"));
        assert_int_equal(o.kind, OUT_NO_ANSWER);
        o = run_simple(codes[i], NULL);
        assert_int_equal(o.kind, OUT_NO_ANSWER);
    }
    /* a 5xx with a status-looking body is still not an answer */
    struct outcome o = run_simple(503, "{\"status\": \"succeeded\"}");
    assert_int_equal(o.kind, OUT_NO_ANSWER);
    /* Retry-After is still read on a 503 (for the log) */
    struct api_response r = resp(503, NULL);
    r.retry_after = "30";
    o = run(&r);
    assert_int_equal(o.kind, OUT_NO_ANSWER);
    assert_int_equal(o.retry_after_ms, 30000);
}

static void test_error_fields_sanitised(void **unused)
{
    (void)unused;
    struct outcome o = run_simple(422, "{\"error\": {\"code\": \"bad\\u0007_code\\n\", "
                                       "\"message\": \"line1\\r\\nline2\\t\\u001b[31mred \\u00e9t\\u00e9\", "
                                       "\"request_id\": \"req\\u0001_1\\u007f2\"}}");
    assert_int_equal(o.kind, OUT_REJECTED);
    assert_string_equal(o.error_code, "bad_code");
    assert_string_equal(o.message, "line1line2[31mred t");
    assert_string_equal(o.request_id, "req_12");
    for (const char *p = o.message; *p; p++)
        assert_true((unsigned char)*p >= ' ' && (unsigned char)*p < 0x7f);
}

static void test_error_fields_truncated(void **unused)
{
    (void)unused;
    char body[2048], longs[600];
    memset(longs, 'x', sizeof longs - 1);
    longs[sizeof longs - 1] = '\0';
    snprintf(body, sizeof body, "{\"error\": {\"code\": \"%s\", \"message\": \"%s\", \"request_id\": \"%s\"}}",
             longs, longs, longs);
    struct outcome o = run_simple(400, body);
    assert_int_equal(o.kind, OUT_REJECTED);
    assert_int_equal(strlen(o.error_code), sizeof o.error_code - 1);
    assert_int_equal(strlen(o.request_id), sizeof o.request_id - 1);
    assert_int_equal(strlen(o.message), sizeof o.message - 1);
}

static void test_error_fields_wrong_types(void **unused)
{
    (void)unused;
    const char *bodies[] = {
        "{\"error\": \"rate_limited\"}",
        "{\"error\": {\"code\": 5, \"message\": [], \"request_id\": null}}",
        "{\"error\": []}",
        "[1,2]",
    };
    for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
        struct outcome o = run_simple(429, bodies[i]);
        assert_int_equal(o.kind, OUT_KEY_LIMITED);
        assert_string_equal(o.error_code, "");
        assert_string_equal(o.request_id, "");
        assert_string_equal(o.message, "");
    }
}

/* ---- helpers ---- */

static void test_status_words(void **unused)
{
    (void)unused;
    const enum tx_status all[] = {TXS_PENDING, TXS_SUCCEEDED, TXS_FAILED, TXS_CANCELED, TXS_EXPIRED};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        assert_int_equal(tx_status_parse(tx_status_word(all[i])), all[i]);
    assert_string_equal(tx_status_word(TXS_NONE), "unknown");
    assert_string_equal(tx_status_word(TXS_UNKNOWN), "unknown");
    assert_string_equal(tx_status_word((enum tx_status)99), "unknown");
    assert_string_equal(tx_status_word(TXS_SUCCEEDED), "succeeded");
    assert_string_equal(tx_status_word(TXS_CANCELED), "canceled");
    assert_int_equal(tx_status_parse("refunded"), TXS_UNKNOWN);
    assert_int_equal(tx_status_parse("unknown"), TXS_UNKNOWN);
    assert_int_equal(tx_status_parse(""), TXS_UNKNOWN);
    assert_int_equal(tx_status_parse("Succeeded"), TXS_UNKNOWN);
    assert_int_equal(tx_status_parse("cancelled"), TXS_UNKNOWN);

    assert_false(tx_status_final(TXS_NONE));
    assert_false(tx_status_final(TXS_PENDING));
    assert_false(tx_status_final(TXS_UNKNOWN));
    assert_true(tx_status_final(TXS_SUCCEEDED));
    assert_true(tx_status_final(TXS_FAILED));
    assert_true(tx_status_final(TXS_CANCELED));
    assert_true(tx_status_final(TXS_EXPIRED));
}

static void test_outcome_names(void **unused)
{
    (void)unused;
    assert_string_equal(classify_outcome_name(OUT_STATUS), "status");
    assert_string_equal(classify_outcome_name(OUT_NOT_FOUND), "not_found");
    assert_string_equal(classify_outcome_name(OUT_TX_LIMITED), "tx_limited");
    assert_string_equal(classify_outcome_name(OUT_KEY_LIMITED), "key_limited");
    assert_string_equal(classify_outcome_name(OUT_UNAUTHORIZED), "unauthorized");
    assert_string_equal(classify_outcome_name(OUT_AUTH_BLOCKED), "auth_blocked");
    assert_string_equal(classify_outcome_name(OUT_REJECTED), "rejected");
    assert_string_equal(classify_outcome_name(OUT_NO_ANSWER), "no_answer");
    assert_string_equal(classify_outcome_name((enum outcome_kind)42), "?");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_200_each_status),
        cmocka_unit_test(test_200_unknown_word),
        cmocka_unit_test(test_200_weird_word),
        cmocka_unit_test(test_200_no_answer),
        cmocka_unit_test(test_200_legacy_headers),
        cmocka_unit_test(test_404),
        cmocka_unit_test(test_401),
        cmocka_unit_test(test_429_tx_limited_seconds),
        cmocka_unit_test(test_429_tx_limited_date),
        cmocka_unit_test(test_429_key_limited),
        cmocka_unit_test(test_429_auth_blocked),
        cmocka_unit_test(test_429_unverified_caps),
        cmocka_unit_test(test_other_4xx_rejected),
        cmocka_unit_test(test_5xx_and_transport),
        cmocka_unit_test(test_error_fields_sanitised),
        cmocka_unit_test(test_error_fields_truncated),
        cmocka_unit_test(test_error_fields_wrong_types),
        cmocka_unit_test(test_status_words),
        cmocka_unit_test(test_outcome_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
