/* test_request.c - unit tests of src/request.c: query strings, Accept,
 * and the answer a request gets from what the state knows. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "request.h"

#define NOW 5000000LL

/* ---- request_query_param ---- */

static void expect_param(const char *q, const char *name, const char *want)
{
    char out[128];
    memset(out, 'Z', sizeof out);
    bool ok = request_query_param(q, name, out, sizeof out);
    if (want == NULL) {
        assert_false(ok);
    } else {
        assert_true(ok);
        assert_string_equal(out, want);
    }
}

static void test_query_first_value(void **unused)
{
    (void)unused;
    expect_param("id=T1", "id", "T1");
    expect_param("id=T1&id=T2", "id", "T1");
    expect_param("status=succeeded&id=T9&format=json", "id", "T9");
    expect_param("status=succeeded&id=T9&format=json", "format", "json");
    expect_param("id=", "id", "");
    expect_param("a=1&id=&id=2", "id", "");
}

static void test_query_decoding(void **unused)
{
    (void)unused;
    expect_param("id=a%20b", "id", "a b");
    expect_param("id=a+b+c", "id", "a b c");
    expect_param("id=%41%42%43", "id", "ABC");
    expect_param("id=%2f%2F", "id", "//");
    expect_param("id=%26x%3D1", "id", "&x=1");
    expect_param("id=%2B", "id", "+");
    /* broken escapes are kept as they are */
    expect_param("id=%zz", "id", "%zz");
    expect_param("id=%4", "id", "%4");
    expect_param("id=abc%", "id", "abc%");
    expect_param("id=%%41", "id", "%A");
    /* the escape must not reach into the next parameter */
    expect_param("id=%4&x=1", "id", "%4");
}

static void test_query_missing(void **unused)
{
    (void)unused;
    expect_param("", "id", NULL);
    expect_param(NULL, "id", NULL);
    expect_param("foo=1&bar=2", "id", NULL);
    expect_param("ID=1", "id", NULL);
    expect_param("idx=1", "id", NULL);
    expect_param("xid=1", "id", NULL);
    expect_param("&&&", "id", NULL);
    expect_param("i=1&d=2", "id", NULL);
}

static void test_query_name_without_value(void **unused)
{
    (void)unused;
    expect_param("id", "id", "");
    expect_param("id&id=2", "id", "");
    expect_param("x=1&id", "id", "");
    expect_param("x=1&id&y=2", "id", "");
    expect_param("x=1;id;y=2", "id", NULL); /* one parameter named "x" */
}

static void test_query_suffix_and_separators(void **unused)
{
    (void)unused;
    expect_param("xid=1&id=2", "id", "2");
    expect_param("a_id=1&id=2", "id", "2");
    /* '&' only separates (WHATWG; CVE-2021-23336): ';' is part of a value */
    expect_param("a=1;id=7", "id", NULL);
    expect_param("a=1;id=7;b=2", "a", "1;id=7;b=2");
    expect_param("id=7;8", "id", "7;8");
    expect_param("id=tx;1", "id", "tx;1");
    expect_param("id=tx;id=T2&id=T3", "id", "tx;id=T2");
    expect_param("id=tx%3B1", "id", "tx;1");
    expect_param("trx=T5&id=T6", "trx", "T5");
    expect_param("x=id=3&id=4", "id", "4");
    /* names are decoded like values: the first "id", however spelt, counts */
    expect_param("%69d=T7&id=T8", "id", "T7");
    expect_param("i%64=T7", "id", "T7");
    expect_param("id%3D=T7&id=T8", "id", "T8"); /* that name is "id=" */
    expect_param("i+d=T7&id=T8", "id", "T8");
    expect_param("%49D=T7&id=T8", "id", "T8");
}

static void test_query_too_long(void **unused)
{
    (void)unused;
    char out[4];
    assert_true(request_query_param("id=abc", "id", out, sizeof out));
    assert_string_equal(out, "abc");
    assert_false(request_query_param("id=abcd", "id", out, sizeof out));
    /* decoded length counts, not encoded */
    assert_true(request_query_param("id=%41%42%43", "id", out, sizeof out));
    assert_string_equal(out, "ABC");
    assert_false(request_query_param("id=%41%42%43%44", "id", out, sizeof out));
    assert_false(request_query_param("id=abc", "id", out, 0));

    /* a 65-character id does not fit a 64-character id buffer */
    char big[256], id[66];
    snprintf(big, sizeof big, "id=%s", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    assert_false(request_query_param(big, "id", id, 65));
    assert_true(request_query_param(big, "id", id, 66));
    assert_int_equal(strlen(id), 65);
}

/* A %00 must not cut the value short: "abc%00def" is not the id "abc". */
static void test_query_nul_escape(void **unused)
{
    (void)unused;
    char out[128];
    bool ok = request_query_param("id=abc%00def", "id", out, sizeof out);
    assert_false(ok && strcmp(out, "abc") == 0);
    ok = request_query_param("id=%00", "id", out, sizeof out);
    assert_false(ok && strcmp(out, "") == 0);
}

static void test_wants_json(void **unused)
{
    (void)unused;
    static const struct {
        const char *accept;
        bool json;
    } cases[] = {
        {"application/json", true},
        {"Application/JSON", true},
        {"text/html;q=0.9, application/json", true},
        {"application/json; charset=utf-8", true},
        {"application/json;charset=\"utf-8\"", true},
        {"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8", false},
        {"*/*", false},
        {"application/*", false},               /* not "given" */
        {"", false},
        {"   ", false},
        {",,,", false},
        /* q = 0 is "not acceptable" */
        {"application/json;q=0", false},
        {"application/json; q=0.000", false},
        {"application/json;Q=0", false},
        {"application/json ; q=0 , text/html", false},
        /* preferred, or not below text/html */
        {"application/json, text/html", true},
        {"text/html, application/json", true},  /* a tie is JSON */
        {"text/html;q=0.5, application/json;q=0.5", true},
        {"text/html;q=0.501, application/json;q=0.5", false},
        {"application/json;q=0.9, text/html", false},
        {"application/json;q=0.1", true},
        {"application/json;q=0.5, */*", false},  /* text/html gets 1 from * / * */
        {"application/json;q=0.5, */*;q=0.4", true},
        {"application/json;q=0.5, text/*;q=0.6", false},
        {"application/json;q=0.5, text/*;q=0.6, text/html;q=0.1", true}, /* the most specific counts */
        {"application/json;q=0.5, text/html;q=0, */*", true},
        {"application/json;q=1.000", true},
        {"application/json;q=1.", true},
        {"application/json;q=0.001", true},
        {"application/json;q=0.5;foo=bar, text/html;q=0.4", true},
        {"application/json;q=0.5;q=0, text/html;q=0.4", true}, /* a second q is an extension */
        {"application/json;q=0, application/json;q=0.2", true}, /* the highest given counts */
        {"  application/json  ;  q=0.7  ", true},
        {"\tapplication/json\t", true},
        {"text/plain, application/json;level=\"a,b;q=0\"", true},
        /* a malformed q: that range is ignored */
        {"application/json;q=1.5", false},
        {"application/json;q=.5", false},
        {"application/json;q=0.1234", false},
        {"application/json;q=2", false},
        {"application/json;q=-1", false},
        {"application/json;q=", false},
        {"application/json;q=\"1\"", false},
        {"application/json;q=1.001", false},
        {"application/json;q=0.5x", false},
        {"application/json;q = 0.5", false},
        {"text/html;q=abc, application/json;q=0.1", true}, /* the bad text/html is ignored */
        /* malformed ranges */
        {"application/jsonx", false},
        {"application/json-seq", false},
        {"xapplication/json", false},
        {"application / json", false},
        {"application/json junk", false},
        {"application/json;", false},
        {"application/json;=1", false},
        {"application/json;a=\"unterminated", false},
        {"*/json", false},
        {"application", false},
        {"garbage, application/json", true},
        {"application/json\"x\", text/html;q=0.1", false},
        {"text/html;x=\"a\\\"b,application/json\", application/xml", false}, /* the comma was quoted */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool got = request_wants_json(cases[i].accept);
        if (got != cases[i].json)
            print_error("Accept: %s -> %s\n", cases[i].accept, got ? "JSON" : "HTML");
        assert_true(got == cases[i].json);
    }
    assert_false(request_wants_json(NULL));
    /* a long header is read to its end, in linear time */
    static char big[64 * 1024];
    const char *item = "text/plain;q=0.1, ", *last = "application/json";
    size_t n = 0;
    for (int k = 0; k < 3000; k++, n += strlen(item))
        memcpy(big + n, item, strlen(item));
    memcpy(big + n, last, strlen(last) + 1);
    assert_true(request_wants_json(big));
}

/* ---- request_answer ---- */

static struct state_fact fact(enum tx_status s, const char *word)
{
    struct state_fact f;
    memset(&f, 0, sizeof f);
    f.status = s;
    snprintf(f.status_word, sizeof f.status_word, "%s", word);
    f.next_read = NOW;
    return f;
}

static struct answer answer(const struct state_fact *f, int64_t now)
{
    struct answer a;
    memset(&a, 0x5a, sizeof a);
    request_answer(f, now, &a);
    return a;
}

static void test_answer_final(void **unused)
{
    (void)unused;
    static const struct {
        enum tx_status s;
        const char *word;
        enum word w;
    } cases[] = {
        {TXS_SUCCEEDED, "succeeded", W_SUCCEEDED},
        {TXS_FAILED, "failed", W_FAILED},
        {TXS_CANCELED, "canceled", W_CANCELED},
        {TXS_EXPIRED, "expired", W_EXPIRED},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct state_fact f = fact(cases[i].s, cases[i].word);
        f.final = true;
        f.known_until = NOW + 3600000;
        struct answer a = answer(&f, NOW);
        assert_int_equal(a.word, cases[i].w);
        assert_true(a.final);
        assert_int_equal(a.retry_after_s, -1);
        assert_string_equal(a.json_status, cases[i].word);
        assert_string_equal(word_name(a.word), cases[i].word);
    }
}

static void test_answer_not_found(void **unused)
{
    (void)unused;
    struct state_fact f = fact(TXS_NONE, "unknown");
    f.not_found = true;
    f.known_until = NOW + 30000;
    f.next_read = NOW + 30000;
    struct answer a = answer(&f, NOW);
    assert_int_equal(a.word, W_NOT_FOUND);
    assert_false(a.final);
    assert_string_equal(a.json_status, "unknown");
    assert_int_equal(a.retry_after_s, 30);

    a = answer(&f, NOW + 100); /* 29.9 s: rounded up */
    assert_int_equal(a.retry_after_s, 30);
    a = answer(&f, NOW + 1000);
    assert_int_equal(a.retry_after_s, 29);
    a = answer(&f, NOW + 29999);
    assert_int_equal(a.retry_after_s, 1);
    a = answer(&f, NOW + 30000); /* at least 1 */
    assert_int_equal(a.retry_after_s, 1);

    /* a 404 after an earlier status: still not_found, status unknown */
    f = fact(TXS_PENDING, "pending");
    f.not_found = true;
    f.known_until = NOW + 5500;
    a = answer(&f, NOW);
    assert_int_equal(a.word, W_NOT_FOUND);
    assert_string_equal(a.json_status, "unknown");
    assert_int_equal(a.retry_after_s, 6);
}

static void test_answer_pending(void **unused)
{
    (void)unused;
    struct state_fact f = fact(TXS_PENDING, "pending");
    f.next_read = NOW + 1500;
    f.wait = WAIT_PACE;
    struct answer a = answer(&f, NOW);
    assert_int_equal(a.word, W_CHECKING);
    assert_false(a.final);
    assert_string_equal(a.json_status, "pending");
    assert_int_equal(a.retry_after_s, 2);

    f.next_read = NOW + 13000;
    assert_int_equal(answer(&f, NOW).retry_after_s, 13);
    f.next_read = NOW + 60001;
    assert_int_equal(answer(&f, NOW).retry_after_s, 61);
    f.next_read = NOW; /* may read now: ask again in a second */
    assert_int_equal(answer(&f, NOW).retry_after_s, 1);
}

static void test_answer_in_flight(void **unused)
{
    (void)unused;
    struct state_fact f = fact(TXS_PENDING, "pending");
    f.in_flight = true;
    f.in_flight_until = NOW + 4200;
    f.next_read = NOW + 1500;
    struct answer a = answer(&f, NOW);
    assert_int_equal(a.word, W_CHECKING);
    assert_false(a.final);
    /* the pace's next read, not the lease of the read in flight */
    assert_int_equal(a.retry_after_s, 2);

    /* nothing read yet: the first read is in flight */
    f = fact(TXS_NONE, "unknown");
    f.in_flight = true;
    f.in_flight_until = NOW + 6000;
    f.next_read = NOW + 1100;
    a = answer(&f, NOW);
    assert_int_equal(a.word, W_CHECKING);
    assert_string_equal(a.json_status, "unknown");
    assert_int_equal(a.retry_after_s, 2);
}

static void test_answer_unknown_word(void **unused)
{
    (void)unused;
    struct state_fact f = fact(TXS_UNKNOWN, "refunded");
    f.next_read = NOW + 2000;
    struct answer a = answer(&f, NOW);
    assert_int_equal(a.word, W_CHECKING);
    assert_false(a.final);
    assert_string_equal(a.json_status, "refunded");
    assert_int_equal(a.retry_after_s, 2);

    /* TXS_NONE never shows a stale word */
    f = fact(TXS_NONE, "garbage");
    a = answer(&f, NOW);
    assert_string_equal(a.json_status, "unknown");
}

static void test_answer_expired_cache_ran_out(void **unused)
{
    (void)unused;
    /* the last status was final but is no longer cached: checking, not final */
    struct state_fact f = fact(TXS_EXPIRED, "expired");
    f.next_read = NOW + 3000;
    struct answer a = answer(&f, NOW);
    assert_int_equal(a.word, W_CHECKING);
    assert_false(a.final);
    assert_string_equal(a.json_status, "expired");
    assert_int_equal(a.retry_after_s, 3);
}

/* ---- told by the shop ---- */

static bool notify(const char *body, enum tx_status *s, char *why)
{
    return request_notify_status(body, body ? strlen(body) : 0, s, why, 200);
}

static void test_notify_status_words(void **unused)
{
    (void)unused;
    static const char *const words[] = {"pending", "succeeded", "failed", "canceled", "expired"};
    static const enum tx_status want[] = {TXS_PENDING, TXS_SUCCEEDED, TXS_FAILED, TXS_CANCELED, TXS_EXPIRED};
    for (int i = 0; i < 5; i++) {
        char body[64], why[200] = "";
        enum tx_status s = TXS_NONE;
        snprintf(body, sizeof body, "{\"status\": \"%s\"}", words[i]);
        assert_true(notify(body, &s, why));
        assert_int_equal(s, want[i]);
    }
    /* other members (say, the webhook's own fields) are ignored */
    char why[200];
    enum tx_status s;
    assert_true(notify("{\"event\":\"payment.paid\",\"status\":\"succeeded\",\"amount\":150000}", &s, why));
    assert_int_equal(s, TXS_SUCCEEDED);
    /* not NUL-terminated: only len bytes count */
    const char b[] = "{\"status\":\"failed\"}garbage";
    assert_true(request_notify_status(b, 19, &s, why, sizeof why));
    assert_int_equal(s, TXS_FAILED);
}

static void test_notify_bad_bodies(void **unused)
{
    (void)unused;
    static const struct {
        const char *body, *reason;
    } bad[] = {
        {NULL, "empty"},
        {"", "empty"},
        {"status=succeeded", "not JSON"},
        {"{\"status\": \"succeeded\"", "not JSON"},
        {"[\"succeeded\"]", "JSON object"},
        {"\"succeeded\"", "JSON object"},
        {"{}", "no \"status\""},
        {"{\"Status\": \"succeeded\"}", "no \"status\""},
        {"{\"status\": 1}", "must be a string"},
        {"{\"status\": null}", "must be a string"},
        {"{\"status\": \"succ\\u0000eeded\"}", "not JSON"},
        {"{\"status\": \"paid\"}", "one of pending"},
        {"{\"status\": \"SUCCEEDED\"}", "one of pending"},
        {"{\"status\": \"unknown\"}", "one of pending"},
        {"{\"status\": \"\"}", "one of pending"},
        {"{\"status\": \"failed\", \"status\": \"succeeded\"}", "not JSON"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char why[200] = "";
        enum tx_status s = TXS_NONE;
        if (notify(bad[i].body, &s, why))
            fail_msg("accepted %s", bad[i].body);
        if (strstr(why, bad[i].reason) == NULL)
            fail_msg("%s: reason %s, want %s", bad[i].body ? bad[i].body : "NULL", why, bad[i].reason);
    }
    /* over the cap: refused unread */
    static char big[REQUEST_NOTIFY_BODY_MAX + 2];
    memset(big, ' ', sizeof big - 1);
    memcpy(big, "{\"status\":\"failed\"}", 19);
    char why[200];
    enum tx_status s;
    assert_false(request_notify_status(big, REQUEST_NOTIFY_BODY_MAX + 1, &s, why, sizeof why));
    assert_non_null(strstr(why, "larger than"));
    assert_true(request_notify_status(big, REQUEST_NOTIFY_BODY_MAX, &s, why, sizeof why));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_query_first_value),
        cmocka_unit_test(test_query_decoding),
        cmocka_unit_test(test_query_missing),
        cmocka_unit_test(test_query_name_without_value),
        cmocka_unit_test(test_query_suffix_and_separators),
        cmocka_unit_test(test_query_too_long),
        cmocka_unit_test(test_query_nul_escape),
        cmocka_unit_test(test_wants_json),
        cmocka_unit_test(test_answer_final),
        cmocka_unit_test(test_answer_not_found),
        cmocka_unit_test(test_answer_pending),
        cmocka_unit_test(test_answer_in_flight),
        cmocka_unit_test(test_answer_unknown_word),
        cmocka_unit_test(test_answer_expired_cache_ran_out),
        cmocka_unit_test(test_notify_status_words),
        cmocka_unit_test(test_notify_bad_bodies),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
