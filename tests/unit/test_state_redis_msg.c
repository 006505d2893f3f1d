/* test_state_redis_msg.c - unit tests of src/state_redis_msg.c: the lines
 * kembali processes publish to each other on Redis, read back, and
 * everything else (anybody who reaches the Redis can publish) refused. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "state_redis_msg.h"

#define K "0123456789abcdef0123456789abcdef"

static bool parse(const char *line, struct state_redis_msg *m)
{
    return state_redis_msg_parse(line, strlen(line), m);
}

static void test_each_kind(void **unused)
{
    (void)unused;
    struct state_redis_msg m;
    assert_true(parse("F " K " tx_1 3600000 succeeded", &m));
    assert_int_equal(m.kind, STATE_REDIS_MSG_FINAL);
    assert_string_equal(m.key.hex, K);
    assert_string_equal(m.id, "tx_1");
    assert_string_equal(m.word, "succeeded");
    assert_int_equal(m.ms, 3600000);
    assert_true(parse("P " K " T-2 1500 pending", &m));
    assert_int_equal(m.kind, STATE_REDIS_MSG_STATUS);
    assert_string_equal(m.word, "pending");
    assert_int_equal(m.ms, 1500);
    assert_true(parse("W " K " t3 0", &m));
    assert_int_equal(m.kind, STATE_REDIS_MSG_NEXT);
    assert_int_equal(m.ms, 0);
    assert_string_equal(m.word, "");
    assert_true(parse("N " K " t4 30000", &m));
    assert_int_equal(m.kind, STATE_REDIS_MSG_NOT_FOUND);
    assert_true(parse("B " K " fedcba9876543210fedcba9876543210 600000", &m));
    assert_int_equal(m.kind, STATE_REDIS_MSG_BLOCK);
    assert_string_equal(m.id, "fedcba9876543210fedcba9876543210");
    assert_true(parse("F " K " t 86400000 a_9", &m)); /* the longest span */
    assert_true(parse("R " K " 0123456789abcdef:4971809", &m)); /* a read granted */
    assert_int_equal(m.kind, STATE_REDIS_MSG_READ);
    assert_string_equal(m.id, "0123456789abcdef:4971809");
    assert_true(parse("R " K " 0123456789abcdef:-9223372036854775808", &m) == false);
    assert_true(parse("R " K " 0123456789abcdef:18446744073709551615", &m));
    assert_true(parse("S " K, &m)); /* a key's count found gone */
    assert_int_equal(m.kind, STATE_REDIS_MSG_SEED);
    assert_string_equal(m.key.hex, K);
}

/* The scripts' names for the letters and the claim's words: every one,
 * in a buffer of STATE_REDIS_MSG_LUA_MAX, and each word read back as
 * itself. */
static void test_the_scripts_words(void **unused)
{
    (void)unused;
    char buf[STATE_REDIS_MSG_LUA_MAX];
    int n = state_redis_msg_lua(buf, sizeof buf);
    assert_true(n > 0);
    assert_non_null(strstr(buf, "local MSG_FINAL, MSG_STATUS, MSG_NEXT, MSG_NOT_FOUND, MSG_BLOCK, MSG_SEED, MSG_READ = "
                                "'F', 'P', 'W', 'N', 'B', 'S', 'R'\n"));
    assert_non_null(strstr(buf, "local W_GO, W_FINAL, W_NOT_FOUND, "));
    assert_int_equal(state_redis_msg_lua(buf, 40), -1);
    static const char *const said[SRW_N] = {"go", "final", "nf", "busy", "blocked", "wait", "pace",
                                            "retry", "key", "budget", "plan", "seed", "client", "early", "last"};
    for (int i = 0; i < SRW_N; i++)
        assert_int_equal(state_redis_word_of(said[i], strlen(said[i])), i);
    assert_int_equal(state_redis_word_of("gone", 4), SRW_N);
    assert_int_equal(state_redis_word_of("go", 1), SRW_N);
    /* a line's first field is one character: each letter is one, and no two alike */
    static const char *const letters[] = {
#define LETTER(kind, name, letter) letter,
        STATE_REDIS_MSG_LETTERS(LETTER)
#undef LETTER
    };
    for (size_t i = 0; i < sizeof letters / sizeof letters[0]; i++) {
        assert_int_equal(strlen(letters[i]), 1);
        for (size_t j = 0; j < i; j++)
            assert_int_not_equal(letters[i][0], letters[j][0]);
    }
}

static void test_refused(void **unused)
{
    (void)unused;
    static const char *const bad[] = {
        "", "F", "F " K, "F " K " t1", "F " K " t1 100", /* a final without its word */
        "W " K " t1 100 pending",                         /* a word where none goes */
        "X " K " t1 100", "FF " K " t1 100 succeeded", "f " K " t1 100 succeeded",
        "F " K "0 t1 100 succeeded", "F 0123456789ABCDEF0123456789abcdef t1 100 succeeded",
        "F " K " t1! 100 succeeded", "F " K " t/1 100 succeeded",
        "F " K " t1 -1 succeeded", "F " K " t1 +5 succeeded", "F " K " t1 1e3 succeeded",
        "F " K " t1 86400001 succeeded", "F " K " t1 9999999999 succeeded",
        "F " K " t1 100 Succeeded", "F " K " t1 100 succeeded ", "F  " K " t1 100 succeeded",
        "F " K " t1  100 succeeded", " F " K " t1 100 succeeded", "F " K " t1 100 succeeded extra",
        "B " K " t1 600000", "B " K " zz23456789abcdef0123456789abcdef 600000",
        "R " K, "R " K " t1", "R " K " 0123456789abcdef", "R " K " 0123456789abcdef:", "R " K " 0123456789ABCDEF:1",
        "R " K " 0123456789abcdef:1 x", "R " K " 0123456789abcde:12", "R " K " 0123456789abcdef:1a",
        "R " K " 0123456789abcdef:123456789012345678901",
        "S", "S ", "S " K " t1", "S " K " t1 100", "S 0123456789ABCDEF0123456789abcdef", "S " K "0", "W " K,
        "F " K " 0123456789012345678901234567890123456789012345678901234567890123456789 1 failed",
        "F " K " t1 100 abcdefghijklmnopqrstuvwxyzabcdefg", /* a word of 33 */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct state_redis_msg m;
        if (parse(bad[i], &m))
            fail_msg("accepted: \"%s\"", bad[i]);
    }
    /* a NUL inside, and a line longer than any real one */
    struct state_redis_msg m;
    static const char nul[] = "W " K " t1 100\0x";
    assert_false(state_redis_msg_parse(nul, sizeof nul - 1, &m));
    char big[600];
    memset(big, 'a', sizeof big);
    assert_false(state_redis_msg_parse(big, sizeof big, &m));
}

static const char *addr(const char *ip, const char *port, char *out, int *p)
{
    return state_redis_master_addr(ip, strlen(ip), port, strlen(port), out, p);
}

/* A Sentinel's answer: an address and a port, nothing else. */
static void test_master_addr(void **unused)
{
    (void)unused;
    char out[STATE_REDIS_ADDR_MAX];
    int port = 0;
    assert_null(addr("10.0.0.5", "6379", out, &port));
    assert_string_equal(out, "10.0.0.5");
    assert_int_equal(port, 6379);
    assert_null(addr("2001:db8::1", "1", out, &port));
    assert_string_equal(out, "2001:db8::1");
    assert_int_equal(port, 1);
    assert_null(addr("::ffff:255.255.255.255", "65535", out, &port));
    assert_int_equal(port, 65535);
    /* not written when refused */
    strcpy(out, "kept");
    port = 7;
    assert_string_equal(addr("redis-1.internal", "6379", out, &port),
                        "the Sentinel names a host name, not an address (kembali takes addresses)");
    assert_string_equal(out, "kept");
    assert_int_equal(port, 7);
    assert_non_null(strstr(addr("", "6379", out, &port), "not an address"));
    assert_non_null(strstr(addr("10.0.0.5 ", "6379", out, &port), "host name"));
    assert_non_null(strstr(addr("1.2.3.4.5", "6379", out, &port), "host name"));
    char longip[80];
    memset(longip, '1', sizeof longip - 1);
    longip[sizeof longip - 1] = '\0';
    assert_non_null(strstr(addr(longip, "6379", out, &port), "not an address"));
    static const char *const ports[] = {"", "0", "65536", "-1", "+1", "63 79", "6379x", "99999999999"};
    for (size_t i = 0; i < sizeof ports / sizeof ports[0]; i++)
        assert_string_equal(addr("10.0.0.5", ports[i], out, &port), "the Sentinel's answer has no valid port");
    assert_int_equal(port, 7);
    /* lengths are what counts, not a NUL: "10.0.0.5" then bytes beyond */
    assert_null(state_redis_master_addr("10.0.0.5xyz", 8, "6379999", 4, out, &port));
    assert_string_equal(out, "10.0.0.5");
    assert_int_equal(port, 6379);
    assert_non_null(state_redis_master_addr("10.0\0.0.5", 10, "6379", 4, out, &port));
}

static void order_is(const int *order, int n, const char *want)
{
    char got[32] = "";
    for (int i = 0; i < n; i++)
        got[i] = (char)('0' + order[i]);
    assert_string_equal(got, want);
}

/* The Sentinel that answered goes first; one that named a replica last. */
static void test_order_move(void **unused)
{
    (void)unused;
    int o[4] = {0, 1, 2, 3};
    state_redis_order_move(o, 4, 2, true);
    order_is(o, 4, "2013");
    state_redis_order_move(o, 4, 0, true);
    order_is(o, 4, "2013");
    state_redis_order_move(o, 4, 3, true);
    order_is(o, 4, "3201");
    state_redis_order_move(o, 4, 0, false);
    order_is(o, 4, "2013");
    state_redis_order_move(o, 4, 3, false);
    order_is(o, 4, "2013");
    state_redis_order_move(o, 4, 1, false);
    order_is(o, 4, "2130");
    state_redis_order_move(o, 4, 4, true); /* out of range: nothing */
    state_redis_order_move(o, 4, -1, false);
    order_is(o, 4, "2130");
    int one[1] = {0};
    state_redis_order_move(one, 1, 0, false);
    order_is(one, 1, "0");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_each_kind),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_the_scripts_words),
        cmocka_unit_test(test_master_addr),
        cmocka_unit_test(test_order_move),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
