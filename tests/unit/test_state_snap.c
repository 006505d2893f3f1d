/* test_state_snap.c - unit tests of src/state_snap.c: what a state knows
 * of a transaction in hand, carried into a state of another layout (a
 * handover). */
#include "state_fixture.h"

/* What one state knows of a transaction in hand goes into another (of
 * another layout, at a handover) and gives the same next read. */
static void test_import_carries_the_pace(void **unused)
{
    (void)unused;
    struct state *a = mk(64), *b = mk(64);
    struct state_key ka = key_of(a, "sk_test_a"), kb = key_of(b, "sk_test_a");
    struct state_ticket t;
    assert_true(claim(a, &ka, "T1", T0, &t, NULL));
    finish(a, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100);
    struct state_fact fa = lookup(a, &ka, "T1", T0 + 200);
    assert_true(claim(a, &ka, "T1", fa.next_read, &t, NULL));
    finish(a, &t, "toko-a", oc_status(TXS_PENDING, NULL), fa.next_read + 100);
    assert_true(claim(a, &ka, "T2", T0, &t, NULL));
    finish(a, &t, "toko-a", oc_status(TXS_SUCCEEDED, NULL), T0 + 100);
    int64_t now = fa.next_read + 300;
    fa = lookup(a, &ka, "T1", now);
    assert_int_equal(fa.wait, WAIT_PACE);
    assert_true(fa.next_read > now);

    struct state_snap s1, s2;
    state_snapshot(a, &ka, "T1", now, &s1);
    state_snapshot(a, &ka, "T2", now, &s2);
    assert_true(s1.has_tx && s2.has_tx);
    assert_int_equal(s1.reads, 2);
    uint64_t head = state_changes_head(b);
    assert_true(state_import(b, &kb, "T1", &s1, now));
    assert_true(state_import(b, &kb, "T2", &s2, now));
    assert_true(state_changes_head(b) > head); /* watches look again */
    struct state_fact fb = lookup(b, &kb, "T1", now);
    assert_int_equal(fb.wait, WAIT_PACE);
    assert_int_equal(fb.next_read, fa.next_read); /* one pace */
    assert_false(claim(b, &kb, "T1", fa.next_read - 1, NULL, NULL));
    assert_true(claim(b, &kb, "T1", fa.next_read, NULL, NULL));
    fb = lookup(b, &kb, "T2", now);
    assert_true(fb.final);
    assert_int_equal(fb.status, TXS_SUCCEEDED);
    assert_string_equal(fb.status_word, "succeeded");
    assert_int_equal(fb.known_until, lookup(a, &ka, "T2", now).known_until); /* the cache it had left */
    /* an untracked one: nothing to take but the pauses */
    struct state_snap s3;
    state_snapshot(a, &ka, "T9", now, &s3);
    assert_false(s3.has_tx);
    assert_true(state_import(b, &kb, "T9", &s3, now));
    assert_false(lookup(b, &kb, "T9", now).final);
    state_free(a);
    state_free(b);
}

/* What is newer here stays: no pace moves backwards, no final status is
 * replaced by an older word, pauses only grow. */
static void test_import_never_backwards(void **unused)
{
    (void)unused;
    struct state *b = mk(64);
    struct state_key k = key_of(b, "sk_test_a");
    struct state_ticket t;
    /* T1 read here at T0 + 5000: a snapshot of a read at T0 leaves it */
    assert_true(claim(b, &k, "T1", T0 + 5000, &t, NULL));
    finish(b, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 5100);
    struct state_fact before = lookup(b, &k, "T1", T0 + 5200);
    struct state_snap old = {.has_tx = true, .reads = 1, .last_start = T0, .last_end = T0 + 100,
                             .status = TXS_PENDING, .key_paused_until = T0 + 1000,
                             .host_paused_until = T0 + 2000};
    strcpy(old.status_word, "pending");
    assert_true(state_import(b, &k, "T1", &old, T0 + 5200));
    struct state_fact after = lookup(b, &k, "T1", T0 + 5200);
    assert_int_equal(after.next_read, before.next_read);
    assert_int_equal(after.wait, before.wait);
    /* T2 succeeded here: an older pending, or a failed, does not replace it */
    assert_int_equal(tell(b, &k, "T2", TXS_SUCCEEDED, T0 + 5000), STATE_TOLD_RECORDED);
    struct state_snap p = {.has_tx = true, .status = TXS_PENDING};
    strcpy(p.status_word, "pending");
    assert_true(state_import(b, &k, "T2", &p, T0 + 5200));
    assert_int_equal(lookup(b, &k, "T2", T0 + 5200).status, TXS_SUCCEEDED);
    struct state_snap fl = {.has_tx = true, .status = TXS_FAILED, .known_until = T0 + 60000};
    strcpy(fl.status_word, "failed");
    assert_true(state_import(b, &k, "T2", &fl, T0 + 5200));
    assert_int_equal(lookup(b, &k, "T2", T0 + 5200).status, TXS_SUCCEEDED);
    /* T3 pending here: a cached succeeded there is newer; a 404 there is not */
    tell(b, &k, "T3", TXS_PENDING, T0 + 5000);
    struct state_snap nf = {.has_tx = true, .not_found = true, .known_until = T0 + 9000};
    assert_true(state_import(b, &k, "T3", &nf, T0 + 5200));
    assert_false(lookup(b, &k, "T3", T0 + 5200).not_found);
    struct state_snap ok = {.has_tx = true, .status = TXS_SUCCEEDED, .known_until = T0 + 60000};
    strcpy(ok.status_word, "succeeded");
    assert_true(state_import(b, &k, "T3", &ok, T0 + 5200));
    struct state_fact f3 = lookup(b, &k, "T3", T0 + 5200);
    assert_true(f3.final);
    assert_int_equal(f3.known_until, T0 + 60000);
    /* ... but not once its cache has run out there */
    ok.known_until = T0 + 5100;
    tell(b, &k, "T4", TXS_PENDING, T0 + 5000);
    assert_true(state_import(b, &k, "T4", &ok, T0 + 5200));
    assert_int_equal(lookup(b, &k, "T4", T0 + 5200).status, TXS_PENDING);
    /* pauses: a longer one is taken, a shorter one leaves the longer */
    struct state_snap pause = {.key_paused_until = T0 + 20000, .host_paused_until = T0 + 8000};
    assert_true(state_import(b, &k, "T5", &pause, T0 + 5200));
    struct state_fact f5 = lookup(b, &k, "T5", T0 + 5200);
    assert_int_equal(f5.next_read, T0 + 20000);
    assert_int_equal(f5.wait, WAIT_KEY_PAUSE);
    pause.key_paused_until = T0 + 10000;
    assert_true(state_import(b, &k, "T5", &pause, T0 + 5200));
    assert_int_equal(lookup(b, &k, "T5", T0 + 5200).next_read, T0 + 20000);
    assert_int_equal(lookup(b, &k, "T6", T0 + 9000).next_read, T0 + 20000); /* the key's */
    struct state_key k2 = key_of(b, "sk_test_b");
    struct state_fact h = lookup(b, &k2, "T1", T0 + 5200);
    assert_int_equal(h.wait, WAIT_HOST_PAUSE);
    assert_int_equal(h.next_read, T0 + 8000);
    /* a time further ahead than anything honest is cut to its span */
    struct state_snap far = {.has_tx = true, .not_before = T0 + 1000000000LL};
    assert_true(state_import(b, &k2, "T7", &far, T0 + 5200));
    assert_true(lookup(b, &k2, "T7", T0 + 5200).next_read < T0 + 100000000LL);
    state_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_import_carries_the_pace),
        cmocka_unit_test(test_import_never_backwards),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
