/* test_rules.c - unit tests of src/rules.c: what an outcome does, which
 * status replaces which, a hold's length, the floor, and the Lua prelude
 * generated from the same constants. Pure: the clock is a number. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "rules.h"

#define T0 1000000LL /* an arbitrary monotonic start */

static struct outcome oc_kind(enum outcome_kind k)
{
    struct outcome o;
    memset(&o, 0, sizeof o);
    o.kind = k;
    o.retry_after_ms = -1;
    return o;
}

static void test_status_effects(void **unused)
{
    (void)unused;
    struct rules_effect fx;
    struct outcome o = oc_kind(OUT_STATUS);
    o.status = TXS_SUCCEEDED;
    rules_outcome(&o, T0, T0 + 300, 0, 0, &fx);
    assert_true(fx.has_status && fx.final);
    assert_int_equal(fx.ttl_ms, 3600 * 1000);
    assert_int_equal(fx.retry_ms, 0);
    o.status = TXS_EXPIRED;
    rules_outcome(&o, T0, T0 + 300, 0, 0, &fx);
    assert_true(fx.final);
    assert_int_equal(fx.ttl_ms, 60 * 1000);
    o.status = TXS_PENDING;
    rules_outcome(&o, T0, T0 + 300, 0, 0, &fx);
    assert_true(fx.has_status);
    assert_false(fx.final);
    assert_int_equal(fx.ttl_ms, 0);
    o.status = TXS_UNKNOWN; /* treated like pending */
    rules_outcome(&o, T0, T0 + 300, 0, 0, &fx);
    assert_false(fx.final);
    assert_int_equal(fx.ttl_ms, 0);
}

static void test_not_found_is_remembered_and_charged(void **unused)
{
    (void)unused;
    struct rules_effect fx;
    struct outcome o = oc_kind(OUT_NOT_FOUND);
    rules_outcome(&o, T0, T0 + 100, 0, 0, &fx);
    assert_true(fx.not_found && fx.charge);
    assert_false(fx.has_status);
    assert_int_equal(fx.ttl_ms, 30 * 1000);
}

static void test_waits_and_pauses(void **unused)
{
    (void)unused;
    struct rules_effect fx;
    struct outcome o = oc_kind(OUT_TX_LIMITED);
    o.retry_after_ms = 5000;
    rules_outcome(&o, T0, T0 + 100, 0, 0, &fx);
    assert_int_equal(fx.retry_ms, 5000);
    o.retry_after_ms = -1; /* unreadable: a second */
    rules_outcome(&o, T0, T0 + 100, 0, 0, &fx);
    assert_int_equal(fx.retry_ms, RULES_RETRY_DEFAULT_MS);

    /* the key's 429: 60 s plus the caller's jitter, clamped to a tenth */
    o = oc_kind(OUT_KEY_LIMITED);
    rules_outcome(&o, T0, T0 + 100, 1234, 0, &fx);
    assert_int_equal(fx.key_pause_ms, 60000 + 1234);
    rules_outcome(&o, T0, T0 + 100, 999999, 0, &fx);
    assert_int_equal(fx.key_pause_ms, 60000 + 6000);
    rules_outcome(&o, T0, T0 + 100, -5, 0, &fx);
    assert_int_equal(fx.key_pause_ms, 60000);
    assert_int_equal(rules_jitter_max(RULES_KEY_PAUSE_MS), 6000);

    o = oc_kind(OUT_UNAUTHORIZED);
    rules_outcome(&o, T0, T0 + 100, 1234, 0, &fx);
    assert_int_equal(fx.key_pause_ms, 300000); /* no jitter: a fixed 5 minutes */
    assert_true(fx.unauthorized);

    /* the failed-authentication 429: the host, 60 s plus jitter, or a longer Retry-After */
    o = oc_kind(OUT_AUTH_BLOCKED);
    rules_outcome(&o, T0, T0 + 100, 0, 500, &fx);
    assert_int_equal(fx.host_pause_ms, 60500);
    assert_int_equal(fx.key_pause_ms, 0);
    o.retry_after_ms = 90000;
    rules_outcome(&o, T0, T0 + 100, 0, 500, &fx);
    assert_int_equal(fx.host_pause_ms, 90000);

    /* a rejected read: no further read until its episode ends (from its pace start) */
    o = oc_kind(OUT_REJECTED);
    rules_outcome(&o, T0, T0 + 400, 0, 0, &fx);
    assert_true(fx.rejected);
    assert_int_equal(T0 + 400 + fx.retry_ms, T0 + PACE_EPISODE_MS + 1);

    /* no answer: nothing but the pace */
    o = oc_kind(OUT_NO_ANSWER);
    rules_outcome(&o, T0, T0 + 400, 0, 0, &fx);
    assert_int_equal(fx.retry_ms + fx.key_pause_ms + fx.host_pause_ms, 0);
    assert_false(fx.has_status || fx.not_found || fx.charge);

    /* stated windows extend what they describe */
    o = oc_kind(OUT_STATUS);
    o.status = TXS_PENDING;
    o.rl.scope = RL_TX;
    o.rl.reset_ms = 2000;
    rules_outcome(&o, T0, T0 + 400, 0, 0, &fx);
    assert_int_equal(fx.retry_ms, 2000);
    o.rl.scope = RL_KEY;
    rules_outcome(&o, T0, T0 + 400, 0, 0, &fx);
    assert_int_equal(fx.retry_ms, 0);
    assert_int_equal(fx.key_pause_ms, 2000);
}

/* The replace table, whole. */
static void test_replace_table(void **unused)
{
    (void)unused;
    enum tx_status all[] = {TXS_NONE, TXS_PENDING, TXS_SUCCEEDED, TXS_FAILED, TXS_CANCELED, TXS_EXPIRED,
                            TXS_UNKNOWN};
    for (size_t i = 0; i < 7; i++)
        for (size_t j = 1; j < 7; j++) {
            enum tx_status cur = all[i], s = all[j];
            bool told = rules_may_replace(cur, true, s, true);
            bool want = !tx_status_final(cur) || s == cur ||
                        (cur == TXS_EXPIRED && tx_status_final(s));
            assert_int_equal(told, want);
            /* a read's answer after the cache ran out replaces anything */
            assert_true(rules_may_replace(cur, false, s, false));
            /* a told status never replaces a final one whose cache ran out, but by the table */
            assert_int_equal(rules_may_replace(cur, false, s, true), want);
        }
    assert_false(rules_may_replace(TXS_SUCCEEDED, true, TXS_FAILED, true));
    assert_true(rules_may_replace(TXS_EXPIRED, true, TXS_SUCCEEDED, true));
    assert_false(rules_may_replace(TXS_SUCCEEDED, true, TXS_EXPIRED, true));
    assert_false(rules_may_replace(TXS_FAILED, true, TXS_PENDING, false));
}

static void test_hold_and_floor(void **unused)
{
    (void)unused;
    struct pace_schedule s = {.n = 4, .wait_ms = {0, 1100, 12000, 25000}};
    assert_int_equal(rules_hold_ms(&s), 38100 + PACE_GRACE_MS);
    assert_int_equal(rules_floor(0), 0);
    assert_int_equal(rules_floor(T0), T0 + 1100);
}

/* The prelude carries the C numbers and the same table. */
static void test_lua_prelude(void **unused)
{
    (void)unused;
    char buf[2048];
    int n = rules_lua_prelude(buf, sizeof buf);
    assert_true(n > 0 && (size_t)n == strlen(buf));
    assert_non_null(strstr(buf, "MIN_WAIT, EPISODE, FLOOR, PLAN_RECHECK, BUDGET_SPAN = 1100, 60000, 1100, 250, 60000\n"));
    assert_non_null(strstr(buf, "R['expired'] = {['succeeded'] = true, ['failed'] = true, ['canceled'] = true, "
                                "['expired'] = true, }"));
    assert_non_null(strstr(buf, "R['succeeded'] = {['succeeded'] = true, }"));
    assert_null(strstr(buf, "R['pending']"));
    assert_int_equal(rules_lua_prelude(buf, 10), -1);
}

/* A status kept through a Redis outage keeps its age (rules_ttl_left):
 * an expired read 64 s ago has nothing left, a succeeded the rest of its
 * hour, pending none. */
static void test_ttl_left(void **unused)
{
    (void)unused;
    const int64_t t0 = 1000000;
    assert_int_equal(rules_ttl_left(TXS_EXPIRED, t0, t0), RULES_TTL_EXPIRED_MS);
    assert_int_equal(rules_ttl_left(TXS_EXPIRED, t0, t0 + 59000), 1000);
    assert_int_equal(rules_ttl_left(TXS_EXPIRED, t0, t0 + 64000), 0);
    assert_int_equal(rules_ttl_left(TXS_SUCCEEDED, t0, t0 + 64000), RULES_TTL_FINAL_MS - 64000);
    assert_int_equal(rules_ttl_left(TXS_SUCCEEDED, t0, t0 + RULES_TTL_FINAL_MS), 0);
    assert_int_equal(rules_ttl_left(TXS_PENDING, t0, t0), 0);
    assert_int_equal(rules_ttl_left(TXS_FAILED, t0 + 5, t0), RULES_TTL_FINAL_MS); /* a clock read early */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_effects),
        cmocka_unit_test(test_ttl_left),
        cmocka_unit_test(test_not_found_is_remembered_and_charged),
        cmocka_unit_test(test_waits_and_pauses),
        cmocka_unit_test(test_replace_table),
        cmocka_unit_test(test_hold_and_floor),
        cmocka_unit_test(test_lua_prelude),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
