/* test_state_budget.c - unit tests of src/state_budget.c: a key's budget
 * of reads, the reads it records for Redis's count, and its usage, with
 * simulated `now` values. */
#include "state_fixture.h"

/* The reads a key's budget recorded, as Redis's count is made whole from
 * them (budget.h): every read a time of its own, even in one ms; a read
 * given back leaves; those of the span only, newest first. */
static void test_key_reads_for_the_count(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a"), other = key_of(st, "sk_test_b");
    struct pace_schedule s = sched_default();
    struct state_ticket t[4];
    struct state_fact f;
    int64_t at[8], newest;
    assert_int_equal(state_key_reads(st, &k, T0, at, 8, &newest), 0);
    assert_int_equal(newest, 0);
    const char *ids[] = {"R1", "R2", "R3", "R4"};
    for (int i = 0; i < 3; i++) /* three reads in the same ms */
        assert_true(state_claim(st, &k, ids[i], &s, 100, TIMEOUT, T0, &t[i], &f));
    assert_int_equal(t[0].budget_at, T0);
    assert_int_equal(t[1].budget_at, T0 + 1);
    assert_int_equal(t[2].budget_at, T0 + 2);
    assert_int_equal(t[0].budget_prev, 0);
    assert_int_equal(t[2].budget_prev, T0 + 1);
    /* a read still waiting on Redis's answer is Redis's to count or refuse */
    assert_int_equal(state_key_reads(st, &k, T0 + 1, at, 8, &newest), 0);
    assert_int_equal(newest, T0 + 2);
    state_answered(st, &t[0], T0 + 3);
    state_answered(st, &t[2], T0 + 3);
    state_unclaim(st, &t[1], T0 + 5); /* never made: it leaves the count */
    assert_int_equal(state_key_reads(st, &k, T0 + 10, at, 8, &newest), 2);
    assert_int_equal(at[0], T0 + 2);
    assert_int_equal(at[1], T0);
    assert_int_equal(newest, T0 + 2);
    assert_int_equal(state_key_reads(st, &other, T0 + 10, at, 8, &newest), 0);
    /* a minute later they left the span; the newest is still known */
    assert_true(state_claim(st, &k, ids[3], &s, 100, TIMEOUT, T0 + 30000, &t[3], &f));
    state_answered(st, &t[3], T0 + 30000);
    assert_int_equal(state_key_reads(st, &k, T0 + 60003, at, 8, &newest), 1);
    assert_int_equal(at[0], T0 + 30000);
    assert_int_equal(state_key_reads(st, &k, T0 + 90000, at, 8, &newest), 0);
    assert_int_equal(newest, T0 + 30000);
    state_free(st);
}

/* Another host's read heard on the channel spends the key's budget here
 * too (so a host Redis left counts it), once however many processes hear
 * it, and is never sent as this host's. */
static void test_heard_reads_spend_the_budget(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    struct state_ticket t;
    struct state_fact f;
    int64_t at[8], newest;
    assert_true(state_heard(st, &k, 11, T0));
    assert_false(state_heard(st, &k, 11, T0 + 1)); /* another process heard it too */
    assert_true(state_heard(st, &k, 12, T0 + 2));
    assert_true(state_claim(st, &k, "H1", &s, 3, TIMEOUT, T0 + 3, &t, &f));
    state_answered(st, &t, T0 + 3);
    assert_false(state_claim(st, &k, "H2", &s, 3, TIMEOUT, T0 + 4, &t, &f)); /* 2 heard + 1 own */
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_int_equal(state_key_reads(st, &k, T0 + 5, at, 8, &newest), 1);
    assert_int_equal(at[0], T0 + 3);
    /* a minute on, heard again: a new read of the same name's span */
    assert_true(state_heard(st, &k, 11, T0 + 60001));
    state_free(st);
}

static void test_budget(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a"), k2 = key_of(st, "sk_test_b");
    struct pace_schedule s = sched_default();
    struct state_ticket t;
    struct state_fact f;
    const int budget = 3;
    const char *ids[] = {"T1", "T2", "T3"};
    for (int i = 0; i < 3; i++) {
        assert_true(state_claim(st, &k, ids[i], &s, budget, TIMEOUT, T0 + 10 * i, &t, &f));
        struct outcome o = oc_status(TXS_PENDING, NULL);
        struct state_report r;
        state_finish(st, &t, "toko-a", &o, T0 + 10 * i + 5, &r);
    }
    assert_false(state_claim(st, &k, "T4", &s, budget, TIMEOUT, T0 + 30, &t, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_true(f.next_read >= T0 + 60000);
    assert_true(f.next_read <= T0 + 61000);
    state_lookup(st, &k, "T1", &s, budget, T0 + 2000, &f);
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_false(state_claim(st, &k, "T4", &s, budget, TIMEOUT, T0 + 59999, &t, &f));
    /* another key has its own budget */
    assert_true(state_claim(st, &k2, "T4", &s, budget, TIMEOUT, T0 + 40, &t, &f));
    state_lookup(st, &k, "T4", &s, budget, T0 + 59999, &f);
    int64_t at = f.next_read;
    assert_true(state_claim(st, &k, "T4", &s, budget, TIMEOUT, at, &t, &f));
    /* and the next one waits for the second read + 60 s */
    assert_false(state_claim(st, &k, "T5", &s, budget, TIMEOUT, at + 1, &t, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_true(f.next_read >= T0 + 10 + 60000);
    state_free(st);
}

/* The metrics' view of a key: its reads of the last 60 s (a read counts
 * until 60 s after it started, as the budget counts it), and its pause. */
static void test_key_usage(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key ka = key_of(st, "sk_test_a"), kb = key_of(st, "sk_test_b"), kc = key_of(st, "sk_test_c");
    struct state_ticket t;
    int reads = -1;
    bool paused = true;
    state_key_usage(st, &kc, T0, &reads, &paused); /* never used: nothing, and no entry made */
    assert_int_equal(reads, 0);
    assert_false(paused);
    const char *ids[] = {"T1", "T2", "T3"};
    for (int i = 0; i < 3; i++) {
        assert_true(claim(st, &ka, ids[i], T0 + 1000 * i, &t, NULL));
        finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 1000 * i + 5);
    }
    state_key_usage(st, &ka, T0 + 2000, &reads, &paused);
    assert_int_equal(reads, 3);
    assert_false(paused);
    state_key_usage(st, &ka, T0 + 60000, &reads, &paused); /* the first still counts, */
    assert_int_equal(reads, 3);
    state_key_usage(st, &ka, T0 + 60001, &reads, &paused); /* and no longer */
    assert_int_equal(reads, 2);
    state_key_usage(st, &ka, T0 + 2000 + 60001, &reads, &paused);
    assert_int_equal(reads, 0);

    assert_true(claim(st, &kb, "T1", T0, &t, NULL));
    finish(st, &t, "toko-b", oc_kind(OUT_UNAUTHORIZED), T0 + 100);
    state_key_usage(st, &kb, T0 + 200, &reads, &paused);
    assert_int_equal(reads, 1); /* a rejected read counts */
    assert_true(paused);
    state_key_usage(st, &kb, T0 + 100 + 300001, &reads, &paused); /* after the 5 minutes */
    assert_int_equal(reads, 0);
    assert_false(paused);
    state_key_usage(st, &ka, T0 + 200, &reads, &paused); /* the other key is not paused */
    assert_false(paused);
    state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget),
        cmocka_unit_test(test_key_reads_for_the_count),
        cmocka_unit_test(test_heard_reads_spend_the_budget),
        cmocka_unit_test(test_key_usage),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
