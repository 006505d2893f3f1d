/* test_state.c - unit tests of src/state.c: pace, cache, outcomes and
 * pauses, what the shop tells, leases and stale reads, rejected keys, and
 * what another host says (unclaim, defer), all with simulated `now`
 * values. Its other files have their own: test_state_table.c,
 * test_state_budget.c, test_state_snap.c, test_state_client.c (the
 * clients' 404s), test_state_shared.c (the file processes share). */
#include "state_fixture.h"
#include "state_private.h" /* st_tx_find: the entry a lookup must not change */

static void test_claim_fresh(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_fact f = lookup(st, &k, "T1", T0);
    assert_int_equal(f.status, TXS_NONE);
    assert_string_equal(f.status_word, "unknown");
    assert_false(f.final);
    assert_false(f.not_found);
    assert_false(f.in_flight);
    assert_int_equal(f.next_read, T0);
    assert_int_equal(f.wait, WAIT_NONE);

    struct state_ticket t;
    assert_true(claim(st, &k, "T1", T0, &t, &f));
    assert_string_equal(t.id, "T1");
    assert_int_equal(t.started, T0);
    assert_memory_equal(t.key.b, k.b, 16);
    assert_true(f.in_flight);
    assert_int_equal(f.in_flight_until, T0 + LEASE);

    f = lookup(st, &k, "T1", T0 + 10);
    assert_true(f.in_flight);
    assert_int_equal(f.in_flight_until, T0 + LEASE);
    state_free(st);
}

static void test_claim_while_in_flight(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t1, t2;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t1, &f));
    /* the pace would allow it at +1500; the read in flight does not */
    for (int64_t dt = 0; dt < LEASE; dt += 250) {
        assert_false(claim(st, &k, "T1", T0 + dt, &t2, &f));
        assert_true(f.in_flight);
        assert_int_equal(f.in_flight_until, T0 + LEASE);
    }
    /* another transaction of the same key is not held up */
    assert_true(claim(st, &k, "T2", T0 + 5, &t2, &f));
    state_free(st);
}

static void test_pending_next_read(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, &f));
    struct state_report r = finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 300);
    assert_false(r.key_paused);
    assert_false(r.host_paused);
    assert_false(r.first_unknown);
    assert_string_equal(r.last_401_shop, "");

    f = lookup(st, &k, "T1", T0 + 300);
    assert_int_equal(f.status, TXS_PENDING);
    assert_string_equal(f.status_word, "pending");
    assert_false(f.final);
    assert_false(f.in_flight);
    assert_int_equal(f.next_read, T0 + 1500);
    assert_int_equal(f.wait, WAIT_PACE);

    assert_false(claim(st, &k, "T1", T0 + 1499, &t, &f));
    assert_int_equal(f.next_read, T0 + 1500);
    assert_true(claim(st, &k, "T1", T0 + 1500, &t, &f));
    state_free(st);
}

/* The pace counts from when the request went out: a read that spent 250 ms
 * connecting moves the next one 250 ms later. A read never sent counts from
 * its claim, and a ticket whose lease another reader has taken over moves
 * nothing. */
static void test_pace_counts_from_send(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, &f));
    assert_int_equal(t.sent, 0);
    t.sent = T0 + 250;
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 300);
    f = lookup(st, &k, "T1", T0 + 300);
    assert_int_equal(f.next_read, T0 + 250 + 1500);
    assert_false(claim(st, &k, "T1", T0 + 1500, &t, &f));
    assert_int_equal(f.next_read, T0 + 1750);

    /* never sent (no connection): counted from the claim */
    assert_true(claim(st, &k, "T2", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 5000);
    /* (and the floor at Kasera: 1.1 s after its answer) */
    assert_int_equal(lookup(st, &k, "T2", T0 + 5000).next_read, T0 + 5000 + RULES_FLOOR_MS);

    /* a stale ticket (its lease ran out and another reader claimed): T3's
     * stale reader reports a late send, T4's none; the same pace follows */
    int64_t lease = TIMEOUT + 1000;
    const char *ids[2] = {"T3", "T4"};
    int64_t next[2];
    for (int i = 0; i < 2; i++) {
        struct state_ticket stale, fresh;
        assert_true(claim(st, &k, ids[i], T0, &stale, NULL));
        assert_true(claim(st, &k, ids[i], T0 + lease + 1, &fresh, NULL));
        stale.sent = i == 0 ? T0 + lease + 500 : 0;
        finish(st, &stale, "toko-a", oc_status(TXS_PENDING, NULL), T0 + lease + 600);
        finish(st, &fresh, "toko-a", oc_status(TXS_PENDING, NULL), T0 + lease + 700);
        next[i] = lookup(st, &k, ids[i], T0 + lease + 700).next_read;
    }
    assert_int_equal(next[0], next[1]);
    assert_int_equal(next[0], T0 + lease + 1 + 2000); /* the fresh read's claim + the schedule's third wait */
    state_free(st);
}

/* A held request on a fresh transaction: reads at 0, 1.5, 3.5, 6.5, 11.5,
 * 19.5 and 32.5 s, then every 13 s. */
static void test_default_schedule_exact(void **unused)
{
    (void)unused;
    static const int64_t want[] = {0, 1500, 3500, 6500, 11500, 19500, 32500, 45500, 58500, 71500, 84500};
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    int64_t now = T0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        struct state_ticket t;
        struct state_fact f = lookup(st, &k, "T1", now);
        assert_int_equal(f.next_read - T0, want[i]);
        if (i > 0) {
            assert_int_equal(f.wait, WAIT_PACE);
            assert_false(claim(st, &k, "T1", f.next_read - 1, &t, NULL));
        }
        now = f.next_read;
        assert_true(claim(st, &k, "T1", now, &t, NULL));
        assert_int_equal(t.started - T0, want[i]);
        now += 250;
        finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), now);
    }
    state_free(st);
}

/* Whatever `now` values callers bring, two claims of one transaction never
 * start less than 1100 ms apart (1500 with the default schedule). */
static void test_min_gap_random(void **unused)
{
    (void)unused;
    struct pace_schedule scheds[3];
    scheds[0] = sched_default();
    scheds[1] = (struct pace_schedule){.n = 2, .wait_ms = {0, 1100}};
    scheds[2] = (struct pace_schedule){.n = 1, .wait_ms = {0}};
    const int64_t min_gap[3] = {1500, 1100, 1100};
    uint64_t rng = 0x9e3779b97f4a7c15ULL;
#define RND() (rng = rng * 6364136223846793005ULL + 1442695040888963407ULL, (uint32_t)(rng >> 33))

    for (int si = 0; si < 3; si++) {
        struct state *st = mk(64);
        struct state_key keys[2] = {key_of(st, "sk_a"), key_of(st, "sk_b")};
        const char *ids[3] = {"T1", "T2", "T3"};
        int64_t last_claim[6];
        long nclaims[6] = {0};
        struct {
            struct state_ticket t;
            int64_t at;
            bool used;
        } out[16];
        memset(out, 0, sizeof out);
        int64_t now = T0;
        for (int step = 0; step < 30000; step++) {
            uint32_t r = RND();
            if (r % 64 == 0)
                now -= RND() % 5000; /* callers with a stale `now` */
            else
                now += RND() % 400;
            /* finish what is due */
            for (int i = 0; i < 16; i++) {
                if (!out[i].used || out[i].at > now)
                    continue;
                out[i].used = false;
                uint32_t w = RND() % 100;
                struct outcome o;
                if (w < 50)
                    o = oc_status(TXS_PENDING, NULL);
                else if (w < 65)
                    o = oc_kind(OUT_NO_ANSWER);
                else if (w < 75) {
                    o = oc_kind(OUT_TX_LIMITED);
                    o.retry_after_ms = RND() % 2500;
                } else if (w < 80)
                    o = oc_kind(OUT_REJECTED);
                else if (w < 85)
                    o = oc_kind(OUT_NOT_FOUND);
                else if (w < 92)
                    o = oc_status(TXS_UNKNOWN, "refunded");
                else if (w < 93)
                    o = oc_kind(OUT_KEY_LIMITED);
                else {
                    o = oc_status(TXS_PENDING, NULL);
                    o.rl.scope = RL_TX;
                    o.rl.reset_ms = RND() % 2000;
                }
                finish(st, &out[i].t, "toko", o, now);
            }
            int s = (int)(RND() % 6);
            struct state_ticket t;
            struct state_fact f;
            if (!state_claim(st, &keys[s / 3], ids[s % 3], &scheds[si], BUDGET, TIMEOUT, now, &t, &f)) {
                assert_true(f.final || f.not_found || f.in_flight || f.next_read > now || f.wait == WAIT_FULL);
                continue;
            }
            if (nclaims[s] > 0) {
                if (now - last_claim[s] < min_gap[si])
                    print_error("schedule %d stream %d: claims at %lld and %lld\n", si, s,
                                (long long)last_claim[s], (long long)now);
                assert_true(now - last_claim[s] >= min_gap[si]);
            }
            last_claim[s] = now;
            nclaims[s]++;
            if (RND() % 10 == 0)
                continue; /* a read never reported: its lease must expire */
            for (int i = 0; i < 16; i++) {
                if (!out[i].used) {
                    out[i].used = true;
                    out[i].t = t;
                    out[i].at = now + 50 + RND() % 7000;
                    break;
                }
            }
        }
        for (int s = 0; s < 6; s++)
            assert_true(nclaims[s] > 100); /* the loop really exercised claims */
        state_free(st);
    }
#undef RND
}

static void check_cached(enum tx_status status, int64_t ttl, int64_t finish_delay)
{
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, &f));
    int64_t done = T0 + finish_delay;
    finish(st, &t, "toko-a", oc_status(status, NULL), done);

    f = lookup(st, &k, "T1", done);
    assert_true(f.final);
    assert_int_equal(f.status, status);
    assert_string_equal(f.status_word, tx_status_word(status));
    assert_int_equal(f.known_until, done + ttl);

    f = lookup(st, &k, "T1", done + ttl - 1);
    assert_true(f.final);
    /* a cached final status is answered without a read */
    assert_false(claim(st, &k, "T1", done + ttl - 1, &t, &f));
    assert_true(f.final);

    f = lookup(st, &k, "T1", done + ttl);
    assert_false(f.final);
    assert_int_equal(f.status, status); /* still the last known status */
    assert_true(claim(st, &k, "T1", done + ttl, &t, &f));
    state_free(st);
}

static void test_cache_final_statuses(void **unused)
{
    (void)unused;
    check_cached(TXS_SUCCEEDED, 3600000, 0);
    check_cached(TXS_FAILED, 3600000, 0);
    check_cached(TXS_CANCELED, 3600000, 0);
    check_cached(TXS_EXPIRED, 60000, 0);
    /* counted from the answer */
    check_cached(TXS_SUCCEEDED, 3600000, 800);
    check_cached(TXS_EXPIRED, 60000, 800);
}

static void test_pending_never_cached(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_SUCCEEDED, NULL), T0 + 100);
    /* a later pending (after the cache ran out) replaces it */
    assert_true(claim(st, &k, "T1", T0 + 100 + 3600000, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 3600200);
    struct state_fact f = lookup(st, &k, "T1", T0 + 3600200);
    assert_false(f.final);
    assert_int_equal(f.status, TXS_PENDING);
    assert_int_equal(f.known_until, 0);
    state_free(st);
}

static void test_unknown_status(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    struct state_report r = finish(st, &t, "toko-a", oc_status(TXS_UNKNOWN, "refunded"), T0 + 200);
    assert_true(r.first_unknown);
    struct state_fact f = lookup(st, &k, "T1", T0 + 200);
    assert_int_equal(f.status, TXS_UNKNOWN);
    assert_string_equal(f.status_word, "refunded");
    assert_false(f.final);
    assert_int_equal(f.next_read, T0 + 1500); /* treated like pending */
    assert_true(claim(st, &k, "T1", T0 + 1500, &t, NULL));
    r = finish(st, &t, "toko-a", oc_status(TXS_UNKNOWN, "refunded"), T0 + 1700);
    assert_false(r.first_unknown); /* logged once */
    state_free(st);
}

static void test_not_found_remembered(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T404", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 100);

    f = lookup(st, &k, "T404", T0 + 100);
    assert_true(f.not_found);
    assert_false(f.final);
    assert_int_equal(f.known_until, T0 + 100 + 30000);
    assert_true(f.next_read >= T0 + 100 + 30000);

    f = lookup(st, &k, "T404", T0 + 30099);
    assert_true(f.not_found);
    assert_false(claim(st, &k, "T404", T0 + 30099, &t, &f));
    assert_true(f.not_found);

    f = lookup(st, &k, "T404", T0 + 30100);
    assert_false(f.not_found);
    assert_true(claim(st, &k, "T404", T0 + 30100, &t, &f));

    /* the 404 is about that key: another key may read the same id */
    struct state_key k2 = key_of(st, "sk_test_b");
    assert_true(claim(st, &k2, "T404", T0 + 200, &t, NULL));
    state_free(st);
}

static void test_tx_limited(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    struct outcome o = oc_kind(OUT_TX_LIMITED);
    o.retry_after_ms = 3000;
    int64_t done = T0 + 200;
    finish(st, &t, "toko-a", o, done);

    f = lookup(st, &k, "T1", done);
    assert_true(f.next_read >= done + 3000);
    assert_int_equal(f.wait, WAIT_RETRY);
    assert_false(claim(st, &k, "T1", done + 2999, &t, NULL));
    assert_true(claim(st, &k, "T1", done + 3000, &t, NULL));
    /* it is about that transaction only */
    assert_true(claim(st, &k, "T2", done + 1, &t, NULL));
    state_free(st);
}

static void test_key_limited(void **unused)
{
    (void)unused;
    for (int round = 0; round < 40; round++) {
        struct state *st = mk(64);
        struct state_key ka = key_of(st, "sk_test_a"), kb = key_of(st, "sk_test_b");
        struct state_ticket t1, t2, t;
        struct state_fact f;
        assert_true(claim(st, &ka, "T1", T0, &t1, NULL));
        assert_true(claim(st, &ka, "T2", T0 + 5, &t2, NULL));
        int64_t done = T0 + 100;
        struct state_report r = finish(st, &t1, "toko-a", oc_kind(OUT_KEY_LIMITED), done);
        assert_true(r.key_paused);
        r = finish(st, &t2, "toko-a", oc_kind(OUT_KEY_LIMITED), done + 1);
        assert_false(r.key_paused); /* already paused: one log line */

        /* every transaction of that key waits 60 s plus up to 10% */
        const char *ids[] = {"T1", "T2", "T3", "never-seen"};
        for (size_t i = 0; i < 4; i++) {
            f = lookup(st, &ka, ids[i], done + 10);
            assert_int_equal(f.wait, WAIT_KEY_PAUSE);
            assert_true(f.next_read >= done + 60000);
            assert_true(f.next_read <= done + 1 + 66000);
            assert_false(claim(st, &ka, ids[i], done + 59999, &t, NULL));
        }
        /* another key is not affected */
        assert_true(claim(st, &kb, "T1", done + 10, &t, &f));
        assert_true(claim(st, &kb, "T3", done + 20, &t, &f));
        /* after the pause, reads go on */
        assert_true(claim(st, &ka, "T3", done + 1 + 66000, &t, NULL));
        state_free(st);
    }
}

static void test_unauthorized(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key ka = key_of(st, "sk_test_a"), kb = key_of(st, "sk_test_b");
    struct state_ticket t1, t2, t;
    struct state_fact f;
    assert_true(claim(st, &ka, "T1", T0, &t1, NULL));
    assert_true(claim(st, &ka, "T2", T0 + 10, &t2, NULL));

    struct state_report r = finish(st, &t1, "toko-a", oc_kind(OUT_UNAUTHORIZED), T0 + 100);
    assert_true(r.key_paused);
    assert_string_equal(r.last_401_shop, "toko-a");
    r = finish(st, &t2, "toko-a", oc_kind(OUT_UNAUTHORIZED), T0 + 110);
    assert_false(r.key_paused); /* only the first time */
    assert_string_equal(r.last_401_shop, "toko-a");

    f = lookup(st, &ka, "T3", T0 + 200);
    assert_int_equal(f.wait, WAIT_KEY_PAUSE);
    assert_true(f.next_read >= T0 + 100 + 300000);
    assert_true(f.next_read <= T0 + 110 + 300000);
    assert_false(claim(st, &ka, "T3", T0 + 100 + 299999, &t, NULL));

    /* the other key reads on, and reports the shop of the last 401 */
    assert_true(claim(st, &kb, "T1", T0 + 200, &t, NULL));
    r = finish(st, &t, "toko-b", oc_status(TXS_PENDING, NULL), T0 + 300);
    assert_false(r.key_paused);
    assert_string_equal(r.last_401_shop, "toko-a");

    assert_true(claim(st, &ka, "T3", T0 + 110 + 300000, &t, NULL));
    state_free(st);
}

static void test_auth_blocked(void **unused)
{
    (void)unused;
    for (int round = 0; round < 20; round++) {
        struct state *st = mk(64);
        struct state_key ka = key_of(st, "sk_a"), kb = key_of(st, "sk_b"), kc = key_of(st, "sk_c");
        struct state_ticket t, t2;
        struct state_fact f;
        /* shop b's key got a 401 earlier */
        assert_true(claim(st, &kb, "T1", T0, &t, NULL));
        finish(st, &t, "toko-b", oc_kind(OUT_UNAUTHORIZED), T0 + 50);

        assert_true(claim(st, &ka, "T1", T0 + 100, &t, NULL));
        assert_true(claim(st, &ka, "T2", T0 + 110, &t2, NULL));
        int64_t done = T0 + 200;
        struct state_report r = finish(st, &t, "toko-a", oc_kind(OUT_AUTH_BLOCKED), done);
        assert_true(r.host_paused);
        assert_string_equal(r.last_401_shop, "toko-b");
        r = finish(st, &t2, "toko-a", oc_kind(OUT_AUTH_BLOCKED), done + 1);
        assert_false(r.host_paused);

        /* every key waits: a, c (never used) alike */
        const struct state_key *ks[] = {&ka, &kc};
        for (size_t i = 0; i < 2; i++) {
            f = lookup(st, ks[i], "T9", done + 5);
            assert_int_equal(f.wait, WAIT_HOST_PAUSE);
            assert_true(f.next_read >= done + 60000);
            assert_true(f.next_read <= done + 1 + 66000);
            assert_false(claim(st, ks[i], "T9", done + 59999, &t, NULL));
        }
        assert_true(claim(st, &kc, "T9", done + 1 + 66000, &t, NULL));
        state_free(st);
    }
}

static void test_auth_blocked_long_retry_after(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key ka = key_of(st, "sk_a"), kc = key_of(st, "sk_c");
    struct state_ticket t;
    assert_true(claim(st, &ka, "T1", T0, &t, NULL));
    struct outcome o = oc_kind(OUT_AUTH_BLOCKED);
    o.retry_after_ms = 600000;
    finish(st, &t, "toko-a", o, T0 + 100);
    struct state_fact f = lookup(st, &kc, "T1", T0 + 200);
    assert_int_equal(f.wait, WAIT_HOST_PAUSE);
    assert_true(f.next_read >= T0 + 100 + 600000);
    state_free(st);
}

static void test_rejected(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    /* a second read of the episode is rejected */
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100);
    int64_t last = T0 + 1500;
    assert_true(claim(st, &k, "T1", last, &t, NULL));
    struct outcome o = oc_kind(OUT_REJECTED);
    snprintf(o.error_code, sizeof o.error_code, "unverified_count_cap");
    finish(st, &t, "toko-a", o, last + 200);

    f = lookup(st, &k, "T1", last + 2000);
    assert_int_equal(f.wait, WAIT_RETRY);
    assert_true(f.next_read >= last + 60000);
    assert_true(f.next_read <= last + 61000);
    for (int64_t now = last + 200; now < last + 60000; now += 997)
        assert_false(claim(st, &k, "T1", now, &t, NULL));
    assert_false(claim(st, &k, "T1", last + 59999, &t, NULL));
    assert_true(claim(st, &k, "T1", f.next_read, &t, NULL));
    /* other transactions of the key are not held */
    assert_true(claim(st, &k, "T2", last + 300, &t, NULL));
    state_free(st);
}

static void test_no_answer_pace_goes_on(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    struct state_report r = finish(st, &t, "toko-a", oc_kind(OUT_NO_ANSWER), T0 + 5000); /* a timeout */
    assert_false(r.key_paused);
    assert_false(r.host_paused);
    f = lookup(st, &k, "T1", T0 + 5000);
    assert_int_equal(f.status, TXS_NONE);
    /* the 1.5 s have passed; the floor counts from the read's end */
    assert_int_equal(f.next_read, T0 + 5000 + RULES_FLOOR_MS);
    assert_int_equal(f.wait, WAIT_PACE);
    assert_true(claim(st, &k, "T1", T0 + 6100, &t, NULL));
    finish(st, &t, "toko-a", oc_kind(OUT_NO_ANSWER), T0 + 6200);
    f = lookup(st, &k, "T1", T0 + 6200);
    assert_int_equal(f.next_read, T0 + 6100 + 2000); /* the third wait */
    state_free(st);
}

/* The floor at Kasera (rules.h, rules_floor): a read never starts less than
 * RULES_FLOOR_MS after the previous read's answer came back, whatever the
 * schedule's wait from its start says. A slow first read (2 s) moves the
 * second read from 1.5 s to 3.1 s; a fast one leaves the schedule alone. */
static void test_floor_after_a_slow_read(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 2000);
    f = lookup(st, &k, "T1", T0 + 2000);
    assert_int_equal(f.next_read, T0 + 2000 + RULES_FLOOR_MS);
    assert_int_equal(f.wait, WAIT_PACE);
    assert_false(claim(st, &k, "T1", T0 + 2000 + RULES_FLOOR_MS - 1, &t, &f));
    assert_true(claim(st, &k, "T1", T0 + 2000 + RULES_FLOOR_MS, &t, NULL));
    /* answered in 10 ms: the schedule's 2 s from the start rule again */
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 3110);
    f = lookup(st, &k, "T1", T0 + 3110);
    assert_int_equal(f.next_read, T0 + 3100 + 2000);
    /* a read without answer (a timeout) ends too: the floor counts from there */
    assert_true(claim(st, &k, "T1", T0 + 5100, &t, NULL));
    finish(st, &t, "toko-a", oc_kind(OUT_NO_ANSWER), T0 + 8500);
    assert_int_equal(lookup(st, &k, "T1", T0 + 8500).next_read, T0 + 8500 + RULES_FLOOR_MS);
    state_free(st);
}

/* A stated exhausted per-transaction window slows that transaction only. */
static void test_rl_tx_window(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    struct outcome o = oc_status(TXS_PENDING, NULL);
    o.rl.scope = RL_TX;
    o.rl.reset_ms = 2000; /* (past the floor's 1.1 s) */
    finish(st, &t, "toko-a", o, T0 + 800);
    f = lookup(st, &k, "T1", T0 + 800);
    assert_int_equal(f.next_read, T0 + 2800);
    assert_int_equal(f.wait, WAIT_RETRY);
    /* RateLimit-Remaining: 0 on a 200 must not slow down other transactions */
    f = lookup(st, &k, "T2", T0 + 800);
    assert_int_equal(f.next_read, T0 + 800);
    assert_true(claim(st, &k, "T2", T0 + 800, &t, NULL));
    state_free(st);
}

static void test_rl_key_window(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a"), k2 = key_of(st, "sk_test_b");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    struct outcome o = oc_status(TXS_PENDING, NULL);
    o.rl.scope = RL_KEY;
    o.rl.reset_ms = 35000;
    finish(st, &t, "toko-a", o, T0 + 100);
    f = lookup(st, &k, "T2", T0 + 100);
    assert_int_equal(f.wait, WAIT_KEY_PAUSE);
    assert_int_equal(f.next_read, T0 + 100 + 35000);
    assert_true(claim(st, &k2, "T2", T0 + 100, &t, NULL));
    state_free(st);
}

static void test_tell_final_costs_no_read(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    uint32_t g = state_generation(st);
    assert_int_equal(tell(st, &k, "T1", TXS_SUCCEEDED, T0), STATE_TOLD_RECORDED);
    assert_int_not_equal(state_generation(st), g); /* held requests wake */
    struct state_fact f = lookup(st, &k, "T1", T0);
    assert_true(f.final);
    assert_int_equal(f.status, TXS_SUCCEEDED);
    assert_string_equal(f.status_word, "succeeded");
    assert_int_equal(f.known_until, T0 + 3600000);
    assert_false(claim(st, &k, "T1", T0 + 3599999, NULL, NULL));
    /* the budget was not spent and the pace not started: a new id of the
     * same key may read at once, and T1 once its cache is over */
    struct state_ticket t;
    assert_true(claim(st, &k, "T2", T0, &t, NULL));
    assert_true(claim(st, &k, "T1", T0 + 3600000, &t, &f));
    state_free(st);
}

static void test_tell_ttls(void **unused)
{
    (void)unused;
    static const struct {
        enum tx_status s;
        int64_t ttl;
    } cases[] = {{TXS_SUCCEEDED, 3600000}, {TXS_FAILED, 3600000}, {TXS_CANCELED, 3600000}, {TXS_EXPIRED, 60000}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct state *st = mk(64);
        struct state_key k = key_of(st, "sk_test_a");
        assert_int_equal(tell(st, &k, "T1", cases[i].s, T0 + 5), STATE_TOLD_RECORDED);
        assert_true(lookup(st, &k, "T1", T0 + 5 + cases[i].ttl - 1).final);
        struct state_fact f = lookup(st, &k, "T1", T0 + 5 + cases[i].ttl);
        assert_false(f.final);
        assert_int_equal(f.status, cases[i].s); /* still the last known status */
        state_free(st);
    }
}

static void test_tell_pending_changes_nothing_else(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100);
    struct state_fact before = lookup(st, &k, "T1", T0 + 200);
    assert_int_equal(tell(st, &k, "T1", TXS_PENDING, T0 + 200), STATE_TOLD_RECORDED);
    struct state_fact f = lookup(st, &k, "T1", T0 + 200);
    assert_int_equal(f.status, TXS_PENDING);
    assert_false(f.final);
    assert_int_equal(f.next_read, before.next_read); /* the pace is untouched */
    assert_int_equal(f.wait, before.wait);
    /* told pending for an id nobody asked about: known, nothing else */
    assert_int_equal(tell(st, &k, "T2", TXS_PENDING, T0 + 200), STATE_TOLD_RECORDED);
    f = lookup(st, &k, "T2", T0 + 200);
    assert_int_equal(f.status, TXS_PENDING);
    assert_string_equal(f.status_word, "pending");
    assert_false(f.final);
    assert_int_equal(f.next_read, T0 + 200);
    assert_true(claim(st, &k, "T2", T0 + 200, &t, NULL));
    state_free(st);
}

static void test_tell_never_backwards(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    /* final, then pending: kept, and still kept after its cache ran out */
    assert_int_equal(tell(st, &k, "T1", TXS_SUCCEEDED, T0), STATE_TOLD_RECORDED);
    uint32_t g = state_generation(st);
    assert_int_equal(tell(st, &k, "T1", TXS_PENDING, T0 + 10), STATE_TOLD_KEPT);
    assert_int_equal(state_generation(st), g);
    assert_true(lookup(st, &k, "T1", T0 + 10).final);
    assert_int_equal(tell(st, &k, "T1", TXS_PENDING, T0 + 3600000 + 1), STATE_TOLD_KEPT);
    assert_int_equal(lookup(st, &k, "T1", T0 + 3600000 + 1).status, TXS_SUCCEEDED);
    /* succeeded, failed, canceled are never replaced by another status */
    assert_int_equal(tell(st, &k, "T2", TXS_SUCCEEDED, T0), STATE_TOLD_RECORDED);
    assert_int_equal(tell(st, &k, "T2", TXS_EXPIRED, T0 + 1), STATE_TOLD_KEPT);
    assert_int_equal(tell(st, &k, "T2", TXS_FAILED, T0 + 2), STATE_TOLD_KEPT);
    assert_int_equal(lookup(st, &k, "T2", T0 + 2).status, TXS_SUCCEEDED);
    assert_int_equal(tell(st, &k, "T3", TXS_FAILED, T0), STATE_TOLD_RECORDED);
    assert_int_equal(tell(st, &k, "T3", TXS_SUCCEEDED, T0 + 1), STATE_TOLD_KEPT);
    assert_int_equal(tell(st, &k, "T4", TXS_CANCELED, T0), STATE_TOLD_RECORDED);
    assert_int_equal(tell(st, &k, "T4", TXS_EXPIRED, T0 + 1), STATE_TOLD_KEPT);
    assert_int_equal(lookup(st, &k, "T4", T0 + 1).status, TXS_CANCELED);
    /* the same status again restarts its cache */
    assert_int_equal(tell(st, &k, "T2", TXS_SUCCEEDED, T0 + 1000), STATE_TOLD_RECORDED);
    assert_int_equal(lookup(st, &k, "T2", T0 + 1000).known_until, T0 + 1000 + 3600000);
    /* expired may become succeeded (a late payment), never the reverse */
    assert_int_equal(tell(st, &k, "T5", TXS_EXPIRED, T0), STATE_TOLD_RECORDED);
    assert_int_equal(tell(st, &k, "T5", TXS_PENDING, T0 + 1), STATE_TOLD_KEPT);
    assert_int_equal(tell(st, &k, "T5", TXS_SUCCEEDED, T0 + 2), STATE_TOLD_RECORDED);
    struct state_fact f = lookup(st, &k, "T5", T0 + 2);
    assert_true(f.final);
    assert_int_equal(f.status, TXS_SUCCEEDED);
    assert_int_equal(f.known_until, T0 + 2 + 3600000);
    assert_int_equal(tell(st, &k, "T5", TXS_EXPIRED, T0 + 3), STATE_TOLD_KEPT);
    assert_int_equal(lookup(st, &k, "T5", T0 + 3).status, TXS_SUCCEEDED);
    state_free(st);
}

static void test_tell_over_reads(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    /* told while a read is in flight: final at once; the read's late
     * pending, or a late 404, does not clear it; the ticket is released */
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    assert_int_equal(tell(st, &k, "T1", TXS_SUCCEEDED, T0 + 50), STATE_TOLD_RECORDED);
    f = lookup(st, &k, "T1", T0 + 50);
    assert_true(f.final);
    assert_true(f.in_flight);
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 300);
    f = lookup(st, &k, "T1", T0 + 300);
    assert_true(f.final);
    assert_false(f.in_flight);
    assert_int_equal(f.status, TXS_SUCCEEDED);
    assert_true(claim(st, &k, "T2", T0, &t, NULL));
    assert_int_equal(tell(st, &k, "T2", TXS_FAILED, T0 + 50), STATE_TOLD_RECORDED);
    finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 300);
    f = lookup(st, &k, "T2", T0 + 300);
    assert_true(f.final);
    assert_false(f.not_found);
    /* a read's expired does not replace a told succeeded either */
    assert_true(claim(st, &k, "T3", T0, &t, NULL));
    assert_int_equal(tell(st, &k, "T3", TXS_SUCCEEDED, T0 + 50), STATE_TOLD_RECORDED);
    finish(st, &t, "toko-a", oc_status(TXS_EXPIRED, NULL), T0 + 300);
    assert_int_equal(lookup(st, &k, "T3", T0 + 300).status, TXS_SUCCEEDED);
    /* read expired, then told succeeded: a late payment */
    assert_true(claim(st, &k, "T4", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_EXPIRED, NULL), T0 + 100);
    assert_int_equal(tell(st, &k, "T4", TXS_SUCCEEDED, T0 + 200), STATE_TOLD_RECORDED);
    f = lookup(st, &k, "T4", T0 + 200);
    assert_true(f.final);
    assert_int_equal(f.status, TXS_SUCCEEDED);
    state_free(st);
}

static void test_tell_clears_404(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 100);
    assert_true(lookup(st, &k, "T1", T0 + 200).not_found);
    assert_int_equal(tell(st, &k, "T1", TXS_SUCCEEDED, T0 + 200), STATE_TOLD_RECORDED);
    struct state_fact f = lookup(st, &k, "T1", T0 + 200);
    assert_false(f.not_found);
    assert_true(f.final);
    /* pending too: the shop knows the transaction exists */
    assert_true(claim(st, &k, "T2", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 100);
    assert_int_equal(tell(st, &k, "T2", TXS_PENDING, T0 + 200), STATE_TOLD_RECORDED);
    f = lookup(st, &k, "T2", T0 + 200);
    assert_false(f.not_found);
    assert_false(f.final);
    assert_int_equal(f.status, TXS_PENDING);
    state_free(st);
}

/* A told status is newer than every read started before it: the last
 * read claimed before the tell, ending after its lease, does not replace
 * it with its pending or unknown word (it would if the tell counted only
 * as new as that read). */
static void test_a_told_status_is_newer_than_the_read_before_it(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    assert_int_equal(tell(st, &k, "T1", TXS_PENDING, T0 + 100), STATE_TOLD_RECORDED);
    finish(st, &t, "toko-a", oc_status(TXS_UNKNOWN, "settling"), t.lease_until + 1);
    struct state_fact f = lookup(st, &k, "T1", t.lease_until + 2);
    assert_int_equal(f.status, TXS_PENDING);
    assert_string_equal(f.status_word, "pending");
    state_free(st);
}

static void test_tell_refuses(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    assert_int_equal(state_tell(st, &k, "T1", TXS_UNKNOWN, "refunded", T0), STATE_TOLD_BAD);
    assert_int_equal(state_tell(st, &k, "T1", TXS_NONE, "unknown", T0), STATE_TOLD_BAD);
    assert_int_equal(tell(st, &k, "", TXS_SUCCEEDED, T0), STATE_TOLD_BAD);
    assert_int_equal(tell(st, &k, "bad id", TXS_SUCCEEDED, T0), STATE_TOLD_BAD);
    char long_id[STATE_ID_MAX + 2];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    assert_int_equal(tell(st, &k, long_id, TXS_SUCCEEDED, T0), STATE_TOLD_BAD);
    assert_int_equal(lookup(st, &k, "T1", T0).status, TXS_NONE);
    /* the told status is about that key only */
    struct state_key k2 = key_of(st, "sk_test_b");
    assert_int_equal(tell(st, &k, "T9", TXS_SUCCEEDED, T0), STATE_TOLD_RECORDED);
    assert_false(lookup(st, &k2, "T9", T0).final);
    state_free(st);
}

static void test_tell_full(void **unused)
{
    (void)unused;
    struct state *st = mk(16);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    for (int i = 0; i < 16; i++) { /* every slot holds a read in flight */
        char id[16];
        snprintf(id, sizeof id, "X%d", i);
        assert_true(claim(st, &k, id, T0 + i, &t, &f));
    }
    assert_false(claim(st, &k, "Y", T0 + 1, &t, &f)); /* a request finds no room */
    assert_int_equal(f.wait, WAIT_FULL);
    /* a told status always does (the table is its own key's only: the
     * least recently used of them goes, X0) */
    assert_int_equal(tell(st, &k, "new", TXS_SUCCEEDED, T0 + 1), STATE_TOLD_RECORDED);
    assert_true(lookup(st, &k, "new", T0 + 1).final);
    assert_int_equal(lookup(st, &k, "X0", T0 + 1).status, TXS_NONE);
    assert_false(lookup(st, &k, "X0", T0 + 1).in_flight);
    /* a known entry is told in place */
    assert_int_equal(tell(st, &k, "X3", TXS_SUCCEEDED, T0 + 1), STATE_TOLD_RECORDED);
    assert_true(lookup(st, &k, "X3", T0 + 1).final);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 16);
    assert_int_equal(m.evictions, 1);
    state_free(st);
}

static void test_lease_released(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t1, t2;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t1, &f));
    assert_int_equal(f.in_flight_until, T0 + TIMEOUT + 1000);
    f = lookup(st, &k, "T1", T0 + LEASE - 1);
    assert_true(f.in_flight);
    assert_false(claim(st, &k, "T1", T0 + LEASE - 1, &t2, NULL));
    f = lookup(st, &k, "T1", T0 + LEASE);
    assert_false(f.in_flight);
    assert_true(claim(st, &k, "T1", T0 + LEASE, &t2, &f));
    assert_int_not_equal(t1.serial, t2.serial);

    /* the late report of the first read records its outcome but does not
     * release the second read's lease */
    finish(st, &t1, "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 500);
    f = lookup(st, &k, "T1", T0 + LEASE + 500);
    assert_true(f.in_flight);
    assert_int_equal(f.in_flight_until, T0 + LEASE + LEASE);
    assert_int_equal(f.status, TXS_PENDING);
    finish(st, &t2, "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 600);
    f = lookup(st, &k, "T1", T0 + LEASE + 600);
    assert_false(f.in_flight);
    state_free(st);
}

static bool claim_to(struct state *st, const struct state_key *k, const char *id, int64_t timeout, int64_t now,
                     struct state_ticket *t, struct state_fact *f)
{
    struct pace_schedule s = sched_default();
    return state_claim(st, k, id, &s, BUDGET, timeout, now, t, f);
}

static void test_lease_is_the_claims_timeout(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    /* a process with a 20 s timeout: everybody waits 21 s for its read,
     * also one whose own timeout is 5 s */
    assert_true(claim_to(st, &k, "T1", 20000, T0, &t, &f));
    assert_int_equal(f.in_flight_until, T0 + 21000);
    assert_int_equal(t.lease_until, T0 + 21000);
    assert_false(claim_to(st, &k, "T1", 5000, T0 + LEASE + 1, &t, &f));
    assert_true(f.in_flight);
    assert_false(claim_to(st, &k, "T1", 5000, T0 + 20999, &t, &f));
    assert_true(claim_to(st, &k, "T1", 5000, T0 + 21000, &t, &f));
    assert_int_equal(f.in_flight_until, T0 + 21000 + 6000);
    /* no timeout given: the state's; more than the most allowed: capped */
    assert_true(claim_to(st, &k, "T2", 0, T0, &t, &f));
    assert_int_equal(t.lease_until, T0 + TIMEOUT + 1000);
    assert_true(claim_to(st, &k, "T3", 999999, T0, &t, &f));
    assert_int_equal(t.lease_until, T0 + STATE_LEASE_MAX_MS + 1000);
    state_free(st);
}

/* t1 claimed at T0 and given up (its lease passed), t2 claimed at `second`. */
static void two_reads(struct state *st, const struct state_key *k, const char *id, struct state_ticket *t1,
                      struct state_ticket *t2, int64_t second)
{
    assert_true(claim(st, k, id, T0, t1, NULL));
    assert_true(claim(st, k, id, second, t2, NULL));
    assert_true(t2->serial > t1->serial);
}

/* A read that ends late (after a newer read of the same transaction was
 * claimed and answered) against what that newer one recorded, one case a
 * row (state.h, "A read's outcome"): a late 404 never hides a status, a
 * late pending never clears a final one (its cache over or not), a late
 * final status moves what is known forward only. */
static void test_a_late_read_against_a_newer_one(void **unused)
{
    (void)unused;
    enum { NF = -1 };                     /* a 404, where a status would be */
    static const struct {
        int newer, older;                 /* what each found: a status, or NF */
        int64_t older_end;                /* the late one's end, from T0 */
        int want;                         /* the status known then */
        bool want_final;
    } cases[] = {
        {TXS_SUCCEEDED, NF, LEASE + 200, TXS_SUCCEEDED, true},
        {TXS_PENDING, NF, LEASE + 200, TXS_PENDING, false},
        {TXS_EXPIRED, NF, LEASE + 100 + STATE_TTL_EXPIRED_MS + 1, TXS_EXPIRED, false},
        {TXS_FAILED, TXS_PENDING, LEASE + 200, TXS_FAILED, true},
        {TXS_EXPIRED, TXS_PENDING, LEASE + 100 + STATE_TTL_EXPIRED_MS + 1, TXS_EXPIRED, false},
        {TXS_PENDING, TXS_SUCCEEDED, LEASE + 200, TXS_SUCCEEDED, true},
        {TXS_SUCCEEDED, TXS_EXPIRED, LEASE + 200, TXS_SUCCEEDED, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct state *st = mk(64);
        struct state_key k = key_of(st, "sk_test_a");
        struct state_ticket t1, t2;
        two_reads(st, &k, "T1", &t1, &t2, T0 + LEASE);
        struct outcome newer = cases[i].newer == NF ? oc_kind(OUT_NOT_FOUND)
                                                    : oc_status((enum tx_status)cases[i].newer, NULL);
        struct outcome older = cases[i].older == NF ? oc_kind(OUT_NOT_FOUND)
                                                    : oc_status((enum tx_status)cases[i].older, NULL);
        assert_false(finish(st, &t2, "toko-a", newer, T0 + LEASE + 100).stale);
        assert_true(finish(st, &t1, "toko-a", older, T0 + cases[i].older_end).stale);
        struct state_fact f = lookup(st, &k, "T1", T0 + cases[i].older_end);
        if (f.status != (enum tx_status)cases[i].want || f.not_found || f.final != cases[i].want_final || f.in_flight)
            fail_msg("case %zu: status %d (want %d), not_found %d, final %d, in_flight %d", i, f.status,
                     cases[i].want, f.not_found, f.final, f.in_flight);
        state_free(st);
    }
}

/* What the table above cannot say: a late 404 while the newer read is
 * still in flight, a current read after a final status's cache, a read
 * that outlived its lease with nothing newer. */
static void test_a_late_read_alone(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t1, t2;
    struct state_fact f;
    /* the newer read still in flight, nothing known: the late 404 is what
     * there is, but that lease stays */
    two_reads(st, &k, "T3", &t1, &t2, T0 + LEASE);
    struct state_report r = finish(st, &t1, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + LEASE + 200);
    assert_true(r.stale);
    f = lookup(st, &k, "T3", T0 + LEASE + 200);
    assert_true(f.not_found);
    assert_true(f.in_flight);
    /* the newer read's answer replaces it */
    finish(st, &t2, "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 300);
    f = lookup(st, &k, "T3", T0 + LEASE + 300);
    assert_false(f.not_found);
    assert_int_equal(f.status, TXS_PENDING);

    /* expired, its cache over: a current read's pending replaces it
     * (Kasera's word now) */
    two_reads(st, &k, "T2", &t1, &t2, T0 + LEASE);
    finish(st, &t2, "toko-a", oc_status(TXS_EXPIRED, NULL), T0 + LEASE + 100);
    int64_t late = T0 + LEASE + 100 + STATE_TTL_EXPIRED_MS + 1;
    finish(st, &t1, "toko-a", oc_status(TXS_PENDING, NULL), late);
    struct state_ticket t3;
    assert_true(claim(st, &k, "T2", late + RULES_FLOOR_MS, &t3, NULL));
    finish(st, &t3, "toko-a", oc_status(TXS_PENDING, NULL), late + RULES_FLOOR_MS + 100);
    assert_int_equal(lookup(st, &k, "T2", late + RULES_FLOOR_MS + 100).status, TXS_PENDING);

    /* a read that outlived its lease, with nothing newer: its pending is
     * recorded (the id exists), but it is reported stale */
    assert_true(claim(st, &k, "T4", T0, &t1, NULL));
    r = finish(st, &t1, "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 1);
    assert_true(r.stale);
    assert_int_equal(lookup(st, &k, "T4", T0 + LEASE + 1).status, TXS_PENDING);
    state_free(st);
}

static void test_late_limits_still_count(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t1, t2;
    struct state_fact f;
    /* a late 429 with Retry-After: it happened at Kasera */
    two_reads(st, &k, "T1", &t1, &t2, T0 + LEASE);
    struct outcome o = oc_kind(OUT_TX_LIMITED);
    o.retry_after_ms = 20000;
    finish(st, &t1, "toko-a", o, T0 + LEASE + 100);
    finish(st, &t2, "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 200);
    f = lookup(st, &k, "T1", T0 + LEASE + 200);
    assert_int_equal(f.wait, WAIT_RETRY);
    assert_int_equal(f.next_read, T0 + LEASE + 100 + 20000);
    /* a late key 429: the key pauses, and the report says so once */
    two_reads(st, &k, "T2", &t1, &t2, T0 + LEASE);
    struct state_report r = finish(st, &t1, "toko-a", oc_kind(OUT_KEY_LIMITED), T0 + LEASE + 100);
    assert_true(r.stale);
    assert_true(r.key_paused);
    f = lookup(st, &k, "T9", T0 + LEASE + 100);
    assert_int_equal(f.wait, WAIT_KEY_PAUSE);
    state_free(st);

    /* both reads stay counted in the budget */
    st = mk(64);
    k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    assert_true(state_claim(st, &k, "T1", &s, 2, TIMEOUT, T0, &t1, &f));
    assert_true(state_claim(st, &k, "T1", &s, 2, TIMEOUT, T0 + LEASE, &t2, &f));
    finish(st, &t1, "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 100);
    finish(st, &t2, "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 200);
    assert_false(state_claim(st, &k, "T2", &s, 2, TIMEOUT, T0 + LEASE + 300, &t1, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    state_free(st);
}

/* A state whose keys start unaccepted, as kembali's do. */
static struct state *mk_fresh(int tx_slots)
{
    struct state *st = mk(tx_slots);
    state_test_keys_accepted(st, false);
    return st;
}

/* Ten keys Kasera rejects, one request each, and a key it took: five reads
 * at most (the allowance), counted from the claim; the other rejected keys
 * make none until 60 s after the 401s (WAIT_AUTH); the accepted key reads
 * as usual throughout. */
static void test_auth_allowance_spares_accepted_keys(void **unused)
{
    (void)unused;
    struct state *st = mk_fresh(64);
    struct state_key good = key_of(st, "sk_test_good"), bad[10];
    struct state_ticket t, tb[10];
    struct state_fact f;
    struct state_metrics m;
    assert_true(claim(st, &good, "G0", T0, &t, &f));
    finish(st, &t, "good", oc_status(TXS_PENDING, NULL), T0 + 50);
    int64_t now = T0 + 100;
    int claimed = 0;
    for (int i = 0; i < 10; i++) {
        char secret[32];
        snprintf(secret, sizeof secret, "sk_test_bad_%d", i);
        bad[i] = key_of(st, secret);
        if (claim(st, &bad[i], "X", now + i, &tb[i], &f)) {
            claimed++;
        } else {
            assert_int_equal(f.wait, WAIT_AUTH);
            assert_int_equal(f.next_read, now + i + RULES_PLAN_RECHECK_MS); /* its places under way: soon */
        }
    }
    assert_int_equal(claimed, 5);
    state_metrics_at(st, &m, T0 + 100 + 10);
    assert_int_equal(m.auth_failures, 5);
    assert_int_equal(m.auth_allowance, 5);
    for (int i = 0; i < 5; i++) {
        struct state_report r = finish(st, &tb[i], "bad", oc_kind(OUT_UNAUTHORIZED), now + 200 + i);
        assert_true(r.key_paused); /* its own 5-minute pause, as before */
    }
    /* the allowance is spent for 60 s from the 401s: no read with the others */
    f = lookup(st, &bad[7], "X", now + 1000);
    assert_int_equal(f.wait, WAIT_AUTH);
    assert_int_equal(f.next_read, now + 200 + STATE_AUTH_SPAN_MS);
    assert_false(claim(st, &bad[7], "Y", now + STATE_AUTH_SPAN_MS + 199, &t, &f));
    assert_int_equal(f.wait, WAIT_AUTH);
    /* the accepted key reads as usual, several at once */
    for (int i = 1; i < 8; i++) {
        char id[8];
        snprintf(id, sizeof id, "G%d", i);
        assert_true(claim(st, &good, id, now + 1000 + i, NULL, NULL));
    }
    /* a rejected key keeps its own pause (5 minutes), whatever the allowance */
    f = lookup(st, &bad[0], "X", now + STATE_AUTH_SPAN_MS + 1000);
    assert_int_equal(f.wait, WAIT_KEY_PAUSE);
    /* 60 s after the first 401: room for one more, then the next, ... */
    assert_true(claim(st, &bad[5], "X", now + 200 + STATE_AUTH_SPAN_MS, &t, &f));
    assert_false(claim(st, &bad[6], "X", now + 200 + STATE_AUTH_SPAN_MS, NULL, &f));
    assert_int_equal(f.wait, WAIT_AUTH);
    assert_int_equal(f.next_read, now + 201 + STATE_AUTH_SPAN_MS);
    assert_true(claim(st, &bad[6], "X", now + 201 + STATE_AUTH_SPAN_MS, NULL, &f));
    state_free(st);
}

/* A key not accepted yet reads within the host's allowance: each of its
 * reads in flight holds a place of it (a burst cannot overshoot), given
 * back when it is never made or Kasera answers it otherwise than 401; once
 * Kasera answers it, it reads freely. */
static void test_auth_unaccepted_key_reads_within_the_allowance(void **unused)
{
    (void)unused;
    struct state *st = mk_fresh(64);
    state_auth_allowance(st, 2);
    struct state_key k = key_of(st, "sk_test_new"), other = key_of(st, "sk_test_other"),
                     more = key_of(st, "sk_test_more");
    struct state_ticket t1, t2, t3;
    struct state_fact f;
    struct state_metrics m;
    assert_true(claim(st, &k, "T1", T0, &t1, &f));
    assert_true(claim(st, &more, "M1", T0 + 10, &t2, &f)); /* the allowance's second place */
    assert_false(claim(st, &other, "O1", T0 + 11, NULL, &f)); /* both held by reads in flight */
    assert_int_equal(f.wait, WAIT_AUTH);
    /* unclaimed (another host's authority refused it): nothing counts */
    state_unclaim(st, &t2, T0 + 20);
    state_metrics_at(st, &m, T0 + 20);
    assert_int_equal(m.auth_failures, 1); /* T1's place, still under way */
    assert_true(claim(st, &other, "O1", T0 + 40, &t3, &f));
    t2 = t1;
    finish(st, &t3, "other", oc_kind(OUT_UNAUTHORIZED), T0 + 50); /* a failed authentication: counts from now */
    /* answered: accepted; its place is given back, and it reads at once */
    finish(st, &t2, "new", oc_kind(OUT_NOT_FOUND), T0 + 60);
    state_metrics_at(st, &m, T0 + 60);
    assert_int_equal(m.auth_failures, 1);
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "U%d", i);
        assert_true(claim(st, &k, id, T0 + 100 + i, NULL, NULL));
    }
    /* an accepted key's 401 counts against the host's allowance too */
    struct state_ticket t4;
    assert_true(claim(st, &k, "V", T0 + 200, &t4, NULL));
    finish(st, &t4, "new", oc_kind(OUT_UNAUTHORIZED), T0 + 210);
    state_metrics_at(st, &m, T0 + 210);
    assert_int_equal(m.auth_failures, 2);
    struct state_key third = key_of(st, "sk_test_third");
    assert_false(claim(st, &third, "W", T0 + 300, NULL, &f));
    assert_int_equal(f.wait, WAIT_AUTH);
    assert_int_equal(f.next_read, T0 + 50 + STATE_AUTH_SPAN_MS);
    /* a read with no answer (a timeout) is not the key's fault: given back */
    assert_true(claim(st, &third, "W", T0 + 50 + STATE_AUTH_SPAN_MS, &t3, &f));
    finish(st, &t3, "third", oc_kind(OUT_NO_ANSWER), T0 + 60 + STATE_AUTH_SPAN_MS);
    state_metrics_at(st, &m, T0 + 60 + STATE_AUTH_SPAN_MS);
    assert_int_equal(m.auth_failures, 1); /* the accepted key's 401 alone */
    state_free(st);
}

static void test_key_id(void **unused)
{
    (void)unused;
    struct state *st = mk(16), *st2 = mk(16);
    struct state_key a1 = key_of(st, "sk_live_aaaa"), a2 = key_of(st, "sk_live_aaaa");
    struct state_key b = key_of(st, "sk_live_aaab"), e = key_of(st, "");
    struct state_key other = key_of(st2, "sk_live_aaaa");
    assert_memory_equal(a1.b, a2.b, 16);
    assert_memory_not_equal(a1.b, b.b, 16);
    assert_memory_not_equal(a1.b, e.b, 16);
    /* the salt is the state's own: the id is not the key's plain hash */
    assert_memory_not_equal(a1.b, other.b, 16);
    /* the secret itself is not in the id */
    for (int i = 0; i + 7 <= 16; i++)
        assert_true(memcmp(a1.b + i, "sk_live", 7) != 0);
    state_free(st);
    state_free(st2);
}

static void test_defaults_and_metrics(void **unused)
{
    (void)unused;
    struct state_opts o = {0};
    char err[128];
    struct state *st = state_new(&o, err, sizeof err);
    assert_non_null(st);
    state_test_keys_accepted(st, true);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.tx_slots, 16384);
    assert_int_equal(m.tx_per_key, 16384 / 4); /* state_slots_per_key's default */
    assert_int_equal(m.tx_used, 0);
    struct state_key k = key_of(st, "sk");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, &f));
    assert_int_equal(f.in_flight_until, T0 + 5000 + 1000); /* default read_timeout_ms 5000 */
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 1);
    /* a lookup creates nothing */
    lookup(st, &k, "T2", T0);
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 1);
    state_free(st);
    state_free(NULL);
}

/* Every valid id, 64 characters included, is tracked on its own. */
static void test_long_ids(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk");
    char a[STATE_ID_MAX + 1], b[STATE_ID_MAX + 1];
    memset(a, 'a', STATE_ID_MAX);
    a[STATE_ID_MAX] = '\0';
    memcpy(b, a, sizeof b);
    b[STATE_ID_MAX - 1] = 'b';
    struct state_ticket t;
    assert_true(claim(st, &k, a, T0, &t, NULL));
    assert_string_equal(t.id, a);
    assert_true(claim(st, &k, b, T0, &t, NULL));
    assert_false(claim(st, &k, a, T0 + 1, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_FAILED, NULL), T0 + 10);
    assert_true(lookup(st, &k, b, T0 + 20).final);
    assert_false(lookup(st, &k, a, T0 + 20).final);
    state_free(st);
}

/* A claim undone leaves the transaction as if it had never been made: the
 * lease released, a claim at once succeeds, and after a real read the pace
 * is the one without the undone claim. */
static void test_unclaim_restores_the_pace(void **unused)
{
    (void)unused;
    struct state *st = mk(64), *ref = mk(64);
    struct state_key k = key_of(st, "sk_test_a"), kr = key_of(ref, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    assert_true(claim(st, &k, "T1", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 300);
    assert_true(claim(ref, &kr, "T1", T0, &t, NULL));
    finish(ref, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 300);

    assert_true(claim(st, &k, "T1", T0 + 1500, &t, &f));
    uint32_t gen = state_generation(st);
    state_unclaim(st, &t, T0 + 1505);
    assert_int_not_equal(state_generation(st), gen); /* waiters on the lease look again */
    f = lookup(st, &k, "T1", T0 + 1505);
    assert_false(f.in_flight);
    assert_int_equal(f.next_read, T0 + 1505);
    /* the real read, at once */
    assert_true(claim(st, &k, "T1", T0 + 1510, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 1800);
    assert_true(claim(ref, &kr, "T1", T0 + 1510, &t, NULL));
    finish(ref, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 1800);
    for (int64_t at = T0 + 1800; at < T0 + 5000; at += 100) {
        struct state_fact a = lookup(st, &k, "T1", at), b = lookup(ref, &kr, "T1", at);
        assert_int_equal(a.next_read, b.next_read);
        assert_int_equal(a.wait, b.wait);
    }
    assert_int_equal(lookup(st, &k, "T1", T0 + 1800).next_read, T0 + 1510 + 2000); /* the second wait */

    /* the first claim of an episode undone: the episode did not start */
    assert_true(claim(st, &k, "T2", T0, &t, NULL));
    state_unclaim(st, &t, T0 + 1);
    assert_true(claim(st, &k, "T2", T0 + 2, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100);
    assert_int_equal(lookup(st, &k, "T2", T0 + 100).next_read, T0 + 2 + 1500);
    state_free(st);
    state_free(ref);
}

/* The budget's ring no longer counts an undone claim. */
static void test_unclaim_gives_back_the_budget(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    struct state_ticket t, t2;
    struct state_fact f;
    const int budget = 2;
    known_ids(st, &k, "T", 1, 4, T0 - 1); /* not held back by the 404 quarter */
    assert_true(state_claim(st, &k, "T1", &s, budget, TIMEOUT, T0, &t, &f));
    state_unclaim(st, &t, T0 + 1);
    assert_true(state_claim(st, &k, "T1", &s, budget, TIMEOUT, T0 + 2, &t, &f));
    assert_true(state_claim(st, &k, "T2", &s, budget, TIMEOUT, T0 + 3, &t2, &f));
    assert_false(state_claim(st, &k, "T3", &s, budget, TIMEOUT, T0 + 4, &t2, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_int_equal(f.next_read, T0 + 2 + 60001); /* the first claim kept counts, not the undone one */
    /* a read undone after another one's claim: only its own place goes */
    state_unclaim(st, &t, T0 + 5);
    assert_true(state_claim(st, &k, "T3", &s, budget, TIMEOUT, T0 + 6, &t, &f));
    assert_false(state_claim(st, &k, "T4", &s, budget, TIMEOUT, T0 + 7, &t, &f));
    assert_int_equal(f.next_read, T0 + 3 + 60001);
    state_free(st);
}

/* A stale ticket (another claim since, or undone already) changes nothing. */
static void test_unclaim_stale_does_nothing(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    struct state_ticket old, t, fresh;
    struct state_fact f;
    const int budget = 4;
    known_ids(st, &k, "T", 1, 5, T0 - 1); /* not held back by the 404 quarter */
    /* a lease ran out and another read was claimed */
    assert_true(state_claim(st, &k, "T1", &s, budget, TIMEOUT, T0, &old, &f));
    assert_true(state_claim(st, &k, "T1", &s, budget, TIMEOUT, T0 + LEASE + 1, &fresh, &f));
    uint32_t gen = state_generation(st);
    state_unclaim(st, &old, T0 + LEASE + 2);
    assert_int_equal(state_generation(st), gen);
    f = lookup(st, &k, "T1", T0 + LEASE + 2);
    assert_true(f.in_flight);
    assert_int_equal(f.in_flight_until, fresh.lease_until);
    /* undone twice: the second time is stale (it takes no other read's place) */
    assert_true(state_claim(st, &k, "T2", &s, budget, TIMEOUT, T0 + LEASE + 3, &t, &f));
    assert_true(state_claim(st, &k, "T3", &s, budget, TIMEOUT, T0 + LEASE + 3, &fresh, &f));
    state_unclaim(st, &t, T0 + LEASE + 4);
    gen = state_generation(st);
    state_unclaim(st, &t, T0 + LEASE + 5);
    assert_int_equal(state_generation(st), gen);
    /* the budget counts the three reads kept: room for one more */
    assert_true(state_claim(st, &k, "T4", &s, budget, TIMEOUT, T0 + LEASE + 6, &t, &f));
    assert_false(state_claim(st, &k, "T5", &s, budget, TIMEOUT, T0 + LEASE + 7, &t, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    state_free(st);
}

/* state_reserve: the reservation another store decided (Redis) is the
 * transaction's here: none, then a later one; a transaction nobody holds
 * takes none; state_unhold says when its last holder let go. */
static void test_reserve_mirrors_another_store(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    struct state_ticket t;
    struct state_fact f;
    int64_t deadline = T0 + pace_hold_ms(&s);
    assert_true(state_plans(st));
    assert_true(state_hold(st, &k, "T1", &s, BUDGET, deadline, T0, NULL));
    assert_true(state_hold(st, &k, "T1", &s, BUDGET, deadline, T0, NULL));
    state_reserve(st, &k, "T1", false, 0, T0 + 1);
    /* no reservation: at its time, the read is an early one */
    assert_true(state_claim(st, &k, "T1", &s, BUDGET, TIMEOUT, deadline - PLAN_LEAD_MS, &t, &f));
    assert_false(t.undo.last_chance);
    state_unclaim(st, &t, deadline - PLAN_LEAD_MS);
    state_reserve(st, &k, "T1", true, deadline - PLAN_LEAD_MS + 100, T0 + 1);
    assert_false(state_claim(st, &k, "T1", &s, BUDGET, TIMEOUT, deadline - PLAN_LEAD_MS, &t, &f) && t.undo.last_chance);
    state_unclaim(st, &t, deadline - PLAN_LEAD_MS);
    assert_true(state_claim(st, &k, "T1", &s, BUDGET, TIMEOUT, deadline - PLAN_LEAD_MS + 100, &t, &f));
    assert_true(t.undo.last_chance);
    assert_false(state_unhold(st, &k, "T1", deadline - 10, NULL));
    assert_true(state_unhold(st, &k, "T1", deadline - 9, NULL));
    state_reserve(st, &k, "T1", true, deadline - 5, deadline - 8); /* nobody holds it: none */
    assert_false(state_unhold(st, &k, "T1", deadline - 7, NULL));
    state_free(st);
}

/* Holds and leaves are stamped in the order this state made them, over
 * its transactions and its processes (one counter in the mapped file), at
 * least now * STATE_STAMPS_PER_MS: Redis tells a host's leave from a later
 * hold by them (state_redis_left), over a restart too. */
static void test_holds_and_leaves_are_stamped_in_order(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    int64_t deadline = T0 + pace_hold_ms(&s);
    uint64_t a, b, c, d, e;
    assert_true(state_hold(st, &k, "T1", &s, BUDGET, deadline, T0, &a));
    assert_true(a >= (uint64_t)T0 * STATE_STAMPS_PER_MS);
    assert_true(state_hold(st, &k, "T2", &s, BUDGET, deadline, T0, &b)); /* same ms: still later */
    assert_true(b > a);
    assert_true(state_unhold(st, &k, "T1", T0 + 5, &c));
    assert_true(c > b && c >= (uint64_t)(T0 + 5) * STATE_STAMPS_PER_MS);
    assert_true(state_hold(st, &k, "T1", &s, BUDGET, deadline, T0 + 1, &d)); /* the clock went back */
    assert_true(d > c);
    assert_false(state_unhold(st, &k, "T9", T0 + 6, &e)); /* nothing held: stamped all the same */
    assert_true(e > d);
    state_free(st);
}

/* A last-chance read undone: its reservation is back, and it counts as no
 * last-chance read. */
static void test_unclaim_gives_back_the_reservation(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    struct state_ticket t;
    struct state_fact f;
    struct state_metrics m;
    int64_t deadline = T0 + pace_hold_ms(&s), at = deadline - PLAN_LEAD_MS;
    assert_true(state_hold(st, &k, "T1", &s, BUDGET, deadline, T0, NULL));
    assert_true(state_claim(st, &k, "T1", &s, BUDGET, TIMEOUT, at, &t, &f));
    state_metrics(st, &m);
    assert_int_equal(m.last_chance_reads, 1);
    state_unclaim(st, &t, at + 1);
    state_metrics(st, &m);
    assert_int_equal(m.last_chance_reads, 0);
    assert_true(state_claim(st, &k, "T1", &s, BUDGET, TIMEOUT, at + 2, &t, &f));
    state_metrics(st, &m);
    assert_int_equal(m.last_chance_reads, 1); /* the reserved read again */
    state_free(st);
}

static bool defer(struct state *st, const struct state_key *k, const char *id, int64_t until, bool in_flight,
                  enum state_wait why, int64_t now)
{
    return state_defer(st, k, id, until, in_flight, why, now);
}

/* Another host's read in flight: waited for, and no claim until it ends. */
static void test_defer_in_flight(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    uint32_t gen = state_generation(st);
    assert_true(defer(st, &k, "T1", T0 + 3000, true, WAIT_NONE, T0));
    assert_int_not_equal(state_generation(st), gen);
    f = lookup(st, &k, "T1", T0 + 10);
    assert_true(f.in_flight);
    assert_int_equal(f.in_flight_until, T0 + 3000);
    assert_true(state_fact_unknown(&f));
    assert_false(claim(st, &k, "T1", T0 + 2999, &t, &f));
    assert_true(f.in_flight);
    assert_int_equal(f.in_flight_until, T0 + 3000);
    /* extended, not shortened; no wake for that */
    gen = state_generation(st);
    assert_true(defer(st, &k, "T1", T0 + 4000, true, WAIT_NONE, T0 + 20));
    assert_true(defer(st, &k, "T1", T0 + 3500, true, WAIT_NONE, T0 + 30));
    assert_int_equal(state_generation(st), gen);
    assert_int_equal(lookup(st, &k, "T1", T0 + 40).in_flight_until, T0 + 4000);
    assert_false(claim(st, &k, "T1", T0 + 3999, &t, &f));
    assert_true(claim(st, &k, "T1", T0 + 4000, &t, &f));
    /* a mark beyond the longest lease is clamped */
    assert_true(defer(st, &k, "T2", T0 + 3600 * 1000LL, true, WAIT_NONE, T0));
    f = lookup(st, &k, "T2", T0);
    assert_true(f.in_flight);
    assert_true(f.in_flight_until <= T0 + STATE_LEASE_MAX_MS + 1000);
    /* a read in flight here and one there: the later */
    assert_true(claim(st, &k, "T3", T0, &t, &f));
    assert_true(defer(st, &k, "T3", T0 + 20000, true, WAIT_NONE, T0 + 10));
    assert_int_equal(lookup(st, &k, "T3", T0 + 20).in_flight_until, T0 + 20000);
    assert_false(defer(st, &k, "a;b", T0 + 1000, true, WAIT_NONE, T0)); /* not an id */
    state_free(st);
}

/* An entry another host's word holds up is in use: never evicted for
 * another (it would forget the wait). */
static void test_defer_keeps_its_entry(void **unused)
{
    (void)unused;
    for (int in_flight = 0; in_flight < 2; in_flight++) {
        struct state *st = mk(1);
        struct state_key k = key_of(st, "sk_test_a");
        struct state_fact f;
        assert_true(defer(st, &k, "T1", T0 + 5000, in_flight, WAIT_RETRY, T0));
        assert_false(claim(st, &k, "T2", T0 + 10, NULL, &f));
        assert_int_equal(f.wait, WAIT_FULL);
        assert_false(defer(st, &k, "T2", T0 + 5000, in_flight, WAIT_RETRY, T0 + 10));
        assert_true(claim(st, &k, "T2", T0 + 5000, NULL, &f)); /* once it ran out */
        state_free(st);
    }
}

/* What clears another host's read in flight: a told status, a 404 learnt,
 * the end of a read here, a defer that is not in flight; each wakes. */
static void test_defer_in_flight_cleared(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t;
    struct state_fact f;
    const char *ids[] = {"T1", "T2", "T3", "T4", "T5"};
    for (int i = 0; i < 5; i++) {
        if (i == 3)
            assert_true(claim(st, &k, ids[i], T0, &t, NULL)); /* claimed before the mark came */
        assert_true(defer(st, &k, ids[i], T0 + 20000, true, WAIT_NONE, T0 + 10));
        assert_true(lookup(st, &k, ids[i], T0 + 20).in_flight);
    }
    uint32_t gen = state_generation(st);
    assert_int_equal(tell(st, &k, "T1", TXS_PENDING, T0 + 100), STATE_TOLD_RECORDED);
    f = lookup(st, &k, "T1", T0 + 100);
    assert_false(f.in_flight);
    assert_int_equal(f.status, TXS_PENDING);
    assert_int_not_equal(state_generation(st), gen);

    gen = state_generation(st);
    assert_true(state_learn_not_found(st, &k, "T2", T0 + 10000, T0 + 100));
    f = lookup(st, &k, "T2", T0 + 100);
    assert_false(f.in_flight);
    assert_true(f.not_found);
    assert_int_not_equal(state_generation(st), gen);

    gen = state_generation(st);
    assert_true(defer(st, &k, "T3", T0 + 2000, false, WAIT_PACE, T0 + 100));
    f = lookup(st, &k, "T3", T0 + 100);
    assert_false(f.in_flight);
    assert_int_equal(f.next_read, T0 + 2000);
    assert_int_equal(f.wait, WAIT_PACE);
    assert_int_not_equal(state_generation(st), gen);

    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100);
    assert_false(lookup(st, &k, "T4", T0 + 100).in_flight);

    /* a final status already known stays; the mark goes all the same */
    assert_true(claim(st, &k, "T6", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_SUCCEEDED, NULL), T0 + 50);
    assert_true(defer(st, &k, "T6", T0 + 20000, true, WAIT_NONE, T0 + 60));
    gen = state_generation(st);
    assert_int_equal(tell(st, &k, "T6", TXS_PENDING, T0 + 100), STATE_TOLD_KEPT);
    f = lookup(st, &k, "T6", T0 + 100);
    assert_false(f.in_flight);
    assert_true(f.final);
    assert_int_not_equal(state_generation(st), gen);

    /* untouched: still in flight */
    assert_true(lookup(st, &k, "T5", T0 + 100).in_flight);
    state_free(st);
}

/* Another host's not-before: next_read and its reason; a later one wins;
 * the budget, the pace's reads and the cache are untouched. */
static void test_defer_not_before(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    struct state_ticket t;
    struct state_fact f;
    uint32_t gen = state_generation(st);
    assert_true(defer(st, &k, "T1", T0 + 5000, false, WAIT_BUDGET, T0));
    assert_int_equal(state_generation(st), gen); /* no mark set or cleared */
    f = lookup(st, &k, "T1", T0);
    assert_false(f.in_flight);
    assert_int_equal(f.next_read, T0 + 5000);
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_true(defer(st, &k, "T1", T0 + 3000, false, WAIT_PACE, T0 + 10)); /* earlier: kept */
    f = lookup(st, &k, "T1", T0 + 10);
    assert_int_equal(f.next_read, T0 + 5000);
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_true(defer(st, &k, "T1", T0 + 7000, false, WAIT_KEY_PAUSE, T0 + 20));
    f = lookup(st, &k, "T1", T0 + 20);
    assert_int_equal(f.next_read, T0 + 7000);
    assert_int_equal(f.wait, WAIT_KEY_PAUSE);
    assert_false(claim(st, &k, "T1", T0 + 6999, &t, &f));
    assert_int_equal(f.next_read, T0 + 7000);
    assert_true(claim(st, &k, "T1", T0 + 7000, &t, &f));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 7100);
    /* the pace is the first read's (the defers counted no read) */
    assert_int_equal(lookup(st, &k, "T1", T0 + 7100).next_read, T0 + 7000 + 1500);
    /* clamped to STATE_DEFER_MAX_MS; another reason reads as a retry */
    assert_true(defer(st, &k, "T2", T0 + 3600 * 1000LL, false, WAIT_FULL, T0));
    f = lookup(st, &k, "T2", T0);
    assert_int_equal(f.next_read, T0 + STATE_DEFER_MAX_MS);
    assert_int_equal(f.wait, WAIT_RETRY);
    /* the budget is not spent: budget 1, after defers a read may start */
    assert_true(state_claim(st, &k, "T3", &s, 1, TIMEOUT, T0 + 100000, &t, &f));
    /* the cache stays */
    assert_true(claim(st, &k, "T4", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_FAILED, NULL), T0 + 50);
    assert_true(defer(st, &k, "T4", T0 + 5000, false, WAIT_RETRY, T0 + 60));
    f = lookup(st, &k, "T4", T0 + 60);
    assert_true(f.final);
    assert_int_equal(f.status, TXS_FAILED);
    state_free(st);
}

/* Another host's 404: remembered as a read's here, not over a cached final
 * status, at no budget and no pace. */
static void test_learn_not_found(void **unused)
{
    (void)unused;
    struct state *st = mk(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct pace_schedule s = sched_default();
    struct state_ticket t;
    struct state_fact f;
    assert_true(state_learn_not_found(st, &k, "T1", T0 + 20000, T0));
    f = lookup(st, &k, "T1", T0 + 10);
    assert_true(f.not_found);
    assert_false(f.final);
    assert_true(state_fact_unknown(&f));
    assert_int_equal(f.known_until, T0 + 20000);
    assert_int_equal(f.next_read, T0 + 20000);
    assert_int_equal(f.wait, WAIT_RETRY);
    assert_false(claim(st, &k, "T1", T0 + 19999, &t, &f));
    assert_true(f.not_found);
    assert_false(lookup(st, &k, "T1", T0 + 20000).not_found);
    /* clamped to the 404's memory here; a longer one here keeps its end */
    assert_true(state_learn_not_found(st, &k, "T2", T0 + 3600 * 1000LL, T0));
    assert_int_equal(lookup(st, &k, "T2", T0).known_until, T0 + STATE_TTL_NOT_FOUND_MS);
    assert_true(state_learn_not_found(st, &k, "T2", T0 + 1000, T0 + 10));
    assert_int_equal(lookup(st, &k, "T2", T0 + 10).known_until, T0 + STATE_TTL_NOT_FOUND_MS);
    /* never over a cached final status */
    assert_true(claim(st, &k, "T3", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_SUCCEEDED, NULL), T0 + 50);
    assert_true(state_learn_not_found(st, &k, "T3", T0 + 20000, T0 + 60));
    f = lookup(st, &k, "T3", T0 + 60);
    assert_true(f.final);
    assert_false(f.not_found);
    /* a status over it, as over a read's 404 */
    assert_int_equal(tell(st, &k, "T1", TXS_PENDING, T0 + 100), STATE_TOLD_RECORDED);
    assert_false(lookup(st, &k, "T1", T0 + 100).not_found);
    /* the pace is untouched: the next read where the last read's put it */
    assert_true(claim(st, &k, "T4", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 300);
    assert_true(state_learn_not_found(st, &k, "T4", T0 + 400, T0 + 300));
    f = lookup(st, &k, "T4", T0 + 400);
    assert_false(f.not_found);
    assert_int_equal(f.next_read, T0 + 1500);
    assert_int_equal(f.wait, WAIT_PACE);
    /* nor the budget: budget 1, a read may start */
    assert_true(state_claim(st, &k, "T5", &s, 1, TIMEOUT, T0 + 100000, &t, &f));
    assert_false(state_learn_not_found(st, &k, "a;b", T0 + 1000, T0)); /* not an id */
    state_free(st);
}

/* A lookup is a query: in a flash sale, a read the plan holds back
 * (fact.withheld) is recorded by state_lookup_held() (hold_step's, for
 * the requests that wait for it) or by a refused claim, never by
 * state_lookup(); and once recorded it stays for the hold. */
static void test_a_lookup_changes_nothing(void **unused)
{
    (void)unused;
    enum { SALE = 40, SALE_BUDGET = 20 };
    struct state *st = mk(256);
    struct state_key k = key_of(st, "sk_test_sale");
    struct pace_schedule s = sched_default();
    char ids[SALE][16];
    int64_t deadline[SALE];
    bool seen = false;
    for (int i = 0; i < SALE; i++)
        snprintf(ids[i], sizeof ids[i], "sale-%d", i);
    for (int64_t now = T0; now < T0 + 40000 && !seen; now += 50) {
        for (int i = 0; i < SALE; i++)
            if (now == T0 + i * 500) {
                uint64_t stamp;
                deadline[i] = now + pace_hold_ms(&s);
                assert_true(state_hold(st, &k, ids[i], &s, SALE_BUDGET, deadline[i], now, &stamp));
            }
        for (int i = 0; i < SALE && !seen && now >= T0 + i * 500; i++) {
            if (now >= deadline[i])
                continue;
            struct state_fact f;
            state_lookup(st, &k, ids[i], &s, SALE_BUDGET, now, &f);
            struct st_tx *e = st_tx_find(st, &k, ids[i]);
            assert_non_null(e);
            if (f.withheld) {
                assert_int_equal(e->withheld, 0);
                struct state_fact g;
                state_lookup_held(st, &k, ids[i], &s, SALE_BUDGET, now, &g);
                assert_true(g.withheld);
                assert_int_equal(e->withheld, 1);
                state_lookup(st, &k, ids[i], &s, SALE_BUDGET, now, &f);
                assert_int_equal(e->withheld, 1);
                seen = true;
            } else if (!f.final && !f.in_flight && f.next_read <= now) {
                struct state_ticket t;
                struct state_fact g;
                assert_true(state_claim(st, &k, ids[i], &s, SALE_BUDGET, TIMEOUT, now, &t, &g));
                finish(st, &t, "shop", oc_status(TXS_PENDING, "pending"), now + 100);
            }
        }
    }
    assert_true(seen);
    state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_claim_fresh),
        cmocka_unit_test(test_a_lookup_changes_nothing),
        cmocka_unit_test(test_claim_while_in_flight),
        cmocka_unit_test(test_pending_next_read),
        cmocka_unit_test(test_pace_counts_from_send),
        cmocka_unit_test(test_default_schedule_exact),
        cmocka_unit_test(test_min_gap_random),
        cmocka_unit_test(test_cache_final_statuses),
        cmocka_unit_test(test_pending_never_cached),
        cmocka_unit_test(test_unknown_status),
        cmocka_unit_test(test_not_found_remembered),
        cmocka_unit_test(test_tx_limited),
        cmocka_unit_test(test_key_limited),
        cmocka_unit_test(test_unauthorized),
        cmocka_unit_test(test_auth_blocked),
        cmocka_unit_test(test_auth_blocked_long_retry_after),
        cmocka_unit_test(test_rejected),
        cmocka_unit_test(test_no_answer_pace_goes_on),
        cmocka_unit_test(test_floor_after_a_slow_read),
        cmocka_unit_test(test_rl_tx_window),
        cmocka_unit_test(test_rl_key_window),
        cmocka_unit_test(test_tell_final_costs_no_read),
        cmocka_unit_test(test_tell_ttls),
        cmocka_unit_test(test_tell_pending_changes_nothing_else),
        cmocka_unit_test(test_tell_never_backwards),
        cmocka_unit_test(test_tell_over_reads),
        cmocka_unit_test(test_tell_clears_404),
        cmocka_unit_test(test_tell_refuses),
        cmocka_unit_test(test_a_told_status_is_newer_than_the_read_before_it),
        cmocka_unit_test(test_tell_full),
        cmocka_unit_test(test_lease_released),
        cmocka_unit_test(test_lease_is_the_claims_timeout),
        cmocka_unit_test(test_a_late_read_against_a_newer_one),
        cmocka_unit_test(test_a_late_read_alone),
        cmocka_unit_test(test_late_limits_still_count),
        cmocka_unit_test(test_auth_allowance_spares_accepted_keys),
        cmocka_unit_test(test_auth_unaccepted_key_reads_within_the_allowance),
        cmocka_unit_test(test_key_id),
        cmocka_unit_test(test_defaults_and_metrics),
        cmocka_unit_test(test_long_ids),
        cmocka_unit_test(test_unclaim_restores_the_pace),
        cmocka_unit_test(test_unclaim_gives_back_the_budget),
        cmocka_unit_test(test_unclaim_stale_does_nothing),
        cmocka_unit_test(test_unclaim_gives_back_the_reservation),
        cmocka_unit_test(test_defer_in_flight),
        cmocka_unit_test(test_defer_keeps_its_entry),
        cmocka_unit_test(test_defer_in_flight_cleared),
        cmocka_unit_test(test_defer_not_before),
        cmocka_unit_test(test_learn_not_found),
        cmocka_unit_test(test_reserve_mirrors_another_store),
        cmocka_unit_test(test_holds_and_leaves_are_stamped_in_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
