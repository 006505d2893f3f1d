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
/* A per-transaction 429: the first honoured as Kasera says (its
 * Retry-After: the tables of the rule episodes keep their times); from
 * the second in a row, the schedule's wait counts from the window's end,
 * so two paces on one transaction (two layouts side by side) move a
 * second apart instead of staying in lockstep. */
static void test_tx_limited_moves_away(void **unused)
{
    (void)unused;
    assert_int_equal(rules_tx_limited_wait(1000, 1500, 0), 1000); /* the first: as stated */
    /* then: the wait after the window, and the pace's margin over Kasera's second */
    assert_int_equal(rules_tx_limited_wait(1000, 1500, 1), 2500 + 100);
    assert_int_equal(rules_tx_limited_wait(300, 1100, 4), 1400 + 100);
    assert_int_equal(rules_tx_limited_wait(-1, 1100, 0), 0);
    assert_int_equal(rules_tx_limited_wait(1000, -5, 2), 1000 + 100);
    assert_int_equal(RULES_APART_MARGIN_MS, 100);
}

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
    assert_non_null(strstr(buf, "MIN_WAIT, EPISODE, PLAN_RECHECK, BUDGET_SPAN = 1100, 60000, 250, 60000\n"));
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

/* Which answers say Kasera took the key, and which may have fed its
 * failed-authentication limiter. */
static void test_key_accepted_and_auth_failed(void **unused)
{
    (void)unused;
    struct rules_effect fx;
    const enum outcome_kind accepted[] = {OUT_STATUS, OUT_NOT_FOUND, OUT_TX_LIMITED, OUT_KEY_LIMITED};
    const enum outcome_kind failed[] = {OUT_UNAUTHORIZED, OUT_AUTH_BLOCKED};
    for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
        struct outcome o = oc_kind(accepted[i]);
        o.status = TXS_PENDING;
        rules_outcome(&o, T0, T0 + 100, 0, 0, &fx);
        assert_true(fx.key_accepted);
        assert_false(fx.auth_failed);
    }
    for (size_t i = 0; i < sizeof failed / sizeof failed[0]; i++) {
        struct outcome o = oc_kind(failed[i]);
        rules_outcome(&o, T0, T0 + 100, 0, 0, &fx);
        assert_false(fx.key_accepted);
        assert_true(fx.auth_failed);
    }
    /* a 4xx after authentication or not, an answer that never came: neither */
    const enum outcome_kind neither[] = {OUT_REJECTED, OUT_NO_ANSWER};
    for (size_t i = 0; i < sizeof neither / sizeof neither[0]; i++) {
        struct outcome o = oc_kind(neither[i]);
        rules_outcome(&o, T0, T0 + 100, 0, 0, &fx);
        assert_false(fx.key_accepted);
        assert_false(fx.auth_failed);
    }
}

/* The host's allowance of reads that may end in 401, with a fake clock. */
static void test_auth_allowance(void **unused)
{
    (void)unused;
    int64_t u[RULES_AUTH_FAILS_MAX] = {0};
    const int64_t span = RULES_AUTH_SPAN_MS;
    /* nothing counts: room */
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 5, T0), T0);
    /* five 401s at T0 .. T0 + 4000 (in any order in the slots) */
    int64_t at[5] = {T0 + 3000, T0, T0 + 4000, T0 + 1000, T0 + 2000};
    for (int i = 0; i < 5; i++)
        u[2 * i % RULES_AUTH_FAILS_MAX] = at[i] + span;
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 6, T0 + 5000), T0 + 5000); /* a sixth fits */
    /* five of five: spent until the earliest runs out, 60 s after it */
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 5, T0 + 5000), T0 + span);
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 5, T0 + span - 1), T0 + span);
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 5, T0 + span), T0 + span);
    /* an allowance of three: two must run out first */
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 3, T0 + 5000), T0 + 2000 + span);
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 3, T0 + 2000 + span), T0 + 2000 + span);
    /* out of range: 0 counts as 1, 20 as 9 */
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 0, T0 + 5000), T0 + 4000 + span);
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 20, T0 + 5000), T0 + 5000);
    /* a read in flight counts until its lease's end plus the span */
    u[1] = T0 + 5000 + 6000 + span;
    assert_int_equal(rules_auth_next(u, RULES_AUTH_FAILS_MAX, 6, T0 + 5000), T0 + span);
    /* in any 60 s, never more than the allowance: walk a second at a time,
     * taking a slot whenever there is room, and count */
    int64_t w[RULES_AUTH_FAILS_MAX] = {0}, taken[400];
    int nt = 0;
    for (int64_t t = T0; t < T0 + 300000 && nt < 400; t += 1000) {
        if (rules_auth_next(w, RULES_AUTH_FAILS_MAX, 5, t) > t)
            continue;
        int free = -1;
        for (int i = 0; i < RULES_AUTH_FAILS_MAX && free < 0; i++)
            if (w[i] <= t)
                free = i;
        assert_true(free >= 0);
        w[free] = t + span; /* ended in 401 at once */
        taken[nt++] = t;
    }
    assert_int_equal(nt, 25); /* 5 at the start of each of five minutes */
    for (int i = 5; i < nt; i++)
        assert_true(taken[i] - taken[i - 5] >= span);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_status_effects),
        cmocka_unit_test(test_key_accepted_and_auth_failed),
        cmocka_unit_test(test_auth_allowance),
        cmocka_unit_test(test_ttl_left),
        cmocka_unit_test(test_not_found_is_remembered_and_charged),
        cmocka_unit_test(test_waits_and_pauses),
        cmocka_unit_test(test_tx_limited_moves_away),
        cmocka_unit_test(test_replace_table),
        cmocka_unit_test(test_hold_and_floor),
        cmocka_unit_test(test_lua_prelude),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
