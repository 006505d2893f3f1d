/* test_state_table.c - unit tests of src/state_table.c: the key slots,
 * eviction of idle entries, and the per-key quota, with simulated `now`
 * values. */
#include "state_fixture.h"

static void test_key_slots_follow_the_configuration(void **unused)
{
    (void)unused;
    assert_int_equal(state_key_slots_for(0), STATE_KEY_SLOTS_MIN);
    assert_int_equal(state_key_slots_for(20), STATE_KEY_SLOTS_MIN);
    assert_int_equal(state_key_slots_for(300), 600);
    assert_int_equal(state_key_slots_for(1 << 30), STATE_KEY_SLOTS_MAX);
    /* 300 shops with their own keys: the 257th key reads like the first */
    struct state *st = mk_keys(state_key_slots_for(300));
    for (int i = 0; i < 300; i++) {
        struct state_key k = key_n(st, i);
        assert_true(claim(st, &k, "T1", T0 + i, NULL, NULL));
    }
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.key_slots, 600);
    assert_int_equal(m.key_used, 300);
    assert_int_equal(m.key_full, 0);
    state_free(st);
}

static void test_key_full_evicts_an_idle_key(void **unused)
{
    (void)unused;
    struct state *st = mk_keys(4);
    struct state_key k[6];
    for (int i = 0; i < 6; i++)
        k[i] = key_n(st, i);
    for (int i = 0; i < 4; i++)
        assert_true(claim(st, &k[i], "T1", T0 + i, NULL, NULL));
    /* every key read within 60 s: its budget ring is in force, none goes */
    struct state_fact f;
    assert_false(claim(st, &k[4], "T1", T0 + 1000, NULL, &f));
    assert_int_equal(f.wait, WAIT_FULL);
    /* key 0 paused (a 429): never evicted while the pause runs */
    struct state_ticket t;
    assert_true(claim(st, &k[0], "T2", T0 + 2000, &t, NULL));
    finish(st, &t, "toko-a", oc_kind(OUT_KEY_LIMITED), T0 + 2100);
    /* 60 s after their last reads keys 1..3 are idle; the oldest goes */
    int64_t later = T0 + STATE_KEY_IDLE_MS + 2101;
    assert_true(claim(st, &k[4], "T1", later, NULL, NULL));
    assert_true(claim(st, &k[5], "T1", later + 1, NULL, NULL));
    f = lookup(st, &k[0], "T3", later + 2);
    assert_int_equal(f.wait, WAIT_KEY_PAUSE); /* kept, with its pause */
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.key_evictions, 2);
    assert_int_equal(m.key_full, 1);
    assert_int_equal(m.key_used, 4);
    /* an evicted key comes back with an empty ring */
    assert_true(claim(st, &k[3], "T9", later + 3, NULL, NULL) || lookup(st, &k[3], "T9", later + 3).wait == WAIT_FULL);
    state_free(st);
}

/* A key whose only reads of the last minute were 404s (guessed ids on its
 * shop) never keeps another key out: the least recently used of them makes
 * room; a key with a read that found something, or one in flight, stays. */
static void test_key_of_404s_only_makes_room(void **unused)
{
    (void)unused;
    struct state *st = mk_keys(4);
    struct state_key k[6];
    for (int i = 0; i < 6; i++)
        k[i] = key_n(st, i);
    struct state_ticket t;
    for (int i = 0; i < 4; i++) {
        assert_true(claim(st, &k[i], "G1", T0 + i, &t, NULL));
        if (i < 2)
            finish(st, &t, "toko", oc_kind(OUT_NOT_FOUND), T0 + 10 + i);
        else if (i == 2)
            finish(st, &t, "toko", oc_status(TXS_PENDING, "pending"), T0 + 10 + i);
        /* key 3's read is still in flight */
    }
    /* keys 0 and 1 only guessed: they make room, oldest first */
    assert_true(claim(st, &k[4], "T1", T0 + 100, NULL, NULL));
    assert_true(claim(st, &k[5], "T1", T0 + 101, NULL, NULL));
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.key_evictions, 2);
    assert_int_equal(m.key_full, 0);
    /* now every key has a read that found something or is in flight */
    struct state_fact f;
    assert_false(claim(st, &k[0], "T2", T0 + 200, NULL, &f));
    assert_int_equal(f.wait, WAIT_FULL);
    state_free(st);
}

static void test_key_eviction_keeps_the_budget(void **unused)
{
    (void)unused;
    /* a key with reads inside the last 60 s is never forgotten, so its
     * budget cannot be reset by other keys coming and going */
    struct state *st = mk_keys(2);
    struct state_key a = key_n(st, 0), b = key_n(st, 1), c = key_n(st, 2);
    struct pace_schedule s = sched_default();
    struct state_ticket t;
    struct state_fact f;
    known_ids(st, &a, "A", 0, 3, T0); /* small budgets: no quarter for unknown ids to pass */
    for (int i = 0; i < 3; i++) {
        char id[8];
        snprintf(id, sizeof id, "A%d", i);
        assert_true(state_claim(st, &a, id, &s, 3, TIMEOUT, T0 + 30000 + i * 5000, &t, &f));
    }
    assert_true(claim(st, &b, "B", T0, NULL, NULL));
    /* at T0 + 61 s: b is idle, a is not (3 reads within 31 s) */
    assert_true(claim(st, &c, "C", T0 + 61000, NULL, NULL));
    assert_false(state_claim(st, &a, "A9", &s, 3, TIMEOUT, T0 + 61000, &t, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    state_free(st);
}

static int count_known(struct state *st, const struct state_key *k, int n, int64_t now)
{
    int known = 0;
    for (int i = 0; i < n; i++) {
        char id[16];
        snprintf(id, sizeof id, "T%d", i);
        if (lookup(st, k, id, now).status == TXS_PENDING)
            known++;
    }
    return known;
}

static void test_evict_idle(void **unused)
{
    (void)unused;
    struct state *st = mk(16);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_metrics m;
    struct state_ticket t;
    for (int i = 0; i < 16; i++) {
        char id[16];
        snprintf(id, sizeof id, "T%d", i);
        assert_true(claim(st, &k, id, T0 + 100 * i, &t, NULL));
        finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100 * i + 50);
    }
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 16);
    assert_int_equal(m.tx_slots, 16);
    assert_int_equal(m.evictions, 0);
    assert_int_equal(m.full, 0);

    int64_t later = T0 + 200000;
    assert_true(claim(st, &k, "new", later, &t, NULL));
    state_metrics(st, &m);
    assert_int_equal(m.evictions, 1);
    assert_int_equal(m.tx_used, 16);
    assert_int_equal(m.full, 0);
    assert_int_equal(count_known(st, &k, 16, later), 15);
    assert_true(lookup(st, &k, "new", later).in_flight);

    /* and again, for as long as idle entries remain */
    for (int i = 0; i < 10; i++) {
        char id[16];
        snprintf(id, sizeof id, "N%d", i);
        assert_true(claim(st, &k, id, later + 10 + i, &t, NULL));
    }
    state_metrics(st, &m);
    assert_int_equal(m.evictions, 11);
    assert_int_equal(count_known(st, &k, 16, later + 100), 5);
    state_free(st);
}

static void test_evict_never_in_use(void **unused)
{
    (void)unused;
    struct state *st = mk(16);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t, busy;
    for (int i = 0; i < 15; i++) {
        char id[16];
        snprintf(id, sizeof id, "T%d", i);
        assert_true(claim(st, &k, id, T0 + 100 * i, &t, NULL));
        finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100 * i + 50);
    }
    /* the oldest entry (least recently used) is the one in flight now */
    int64_t later = T0 + 200000;
    assert_true(claim(st, &k, "T0", later, &busy, NULL));
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 15);
    assert_true(claim(st, &k, "busy", later + 1, &t, NULL)); /* takes the last free slot */
    for (int i = 0; i < 14; i++) {
        char id[16];
        snprintf(id, sizeof id, "N%d", i);
        assert_true(claim(st, &k, id, later + 10 + i, &t, NULL));
        /* the transactions in flight are still tracked */
        assert_true(lookup(st, &k, "T0", later + 10 + i).in_flight);
        assert_true(lookup(st, &k, "busy", later + 10 + i).in_flight);
    }
    /* 16 entries, all in use: no room */
    struct state_fact f;
    assert_false(claim(st, &k, "X", later + 100, &t, &f));
    assert_int_equal(f.wait, WAIT_FULL);
    state_metrics(st, &m);
    assert_int_equal(m.evictions, 14);
    assert_true(m.full >= 1);
    finish(st, &busy, "toko-a", oc_status(TXS_PENDING, NULL), later + 200);
    assert_int_equal(lookup(st, &k, "T0", later + 200).status, TXS_PENDING);
    state_free(st);
}

static void test_full_in_flight(void **unused)
{
    (void)unused;
    struct state *st = mk(16);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket tickets[16], t;
    struct state_fact f;
    for (int i = 0; i < 16; i++) {
        char id[16];
        snprintf(id, sizeof id, "T%d", i);
        assert_true(claim(st, &k, id, T0 + i, &tickets[i], NULL));
    }
    for (int i = 0; i < 5; i++) {
        char id[16];
        snprintf(id, sizeof id, "X%d", i);
        memset(&f, 0, sizeof f);
        assert_false(claim(st, &k, id, T0 + 100 + i, &t, &f));
        assert_int_equal(f.wait, WAIT_FULL);
        assert_true(f.next_read > T0 + 100 + i);
        f = lookup(st, &k, id, T0 + 100 + i);
        assert_int_equal(f.status, TXS_NONE);
    }
    struct state_metrics m;
    state_metrics(st, &m);
    assert_true(m.full >= 5);
    assert_int_equal(m.evictions, 0);
    assert_int_equal(m.tx_used, 16);
    /* the tracked ones still answer */
    for (int i = 0; i < 16; i++) {
        char id[16];
        snprintf(id, sizeof id, "T%d", i);
        assert_true(lookup(st, &k, id, T0 + 200).in_flight);
    }
    /* leases expired but episodes still running: still no room */
    assert_false(claim(st, &k, "X0", T0 + LEASE + 100, &t, &f));
    assert_int_equal(f.wait, WAIT_FULL);
    /* once the episodes are over, room again */
    int64_t later = T0 + 16 + 60001;
    assert_true(claim(st, &k, "X0", later, &t, &f));
    state_metrics(st, &m);
    assert_int_equal(m.evictions, 1);
    /* reports of reads whose entry was evicted do not crash nor confuse */
    for (int i = 0; i < 16; i++)
        finish(st, &tickets[i], "toko-a", oc_status(TXS_SUCCEEDED, NULL), later + 1);
    assert_true(lookup(st, &k, "X0", later + 2).in_flight);
    state_free(st);
}

/* Claim (and, when `done`, finish with pending) ids PREFIX0.. of key k. */
static void claim_n(struct state *st, const struct state_key *k, const char *prefix, int n, int64_t now, bool done)
{
    for (int i = 0; i < n; i++) {
        char id[24];
        struct state_ticket t;
        snprintf(id, sizeof id, "%s%d", prefix, i);
        assert_true(claim(st, k, id, now + i, &t, NULL));
        if (done)
            finish(st, &t, "toko", oc_status(TXS_PENDING, NULL), now + i + 1);
    }
}

/* A key at its quota whose entries are idle makes room from its own,
 * however much of the table is free. */
static void test_quota_evicts_own_idle(void **unused)
{
    (void)unused;
    struct state *st = mk_quota(32, 8);
    struct state_key a = key_of(st, "sk_test_a");
    struct state_metrics m;
    claim_n(st, &a, "T", 8, T0, true);
    int64_t later = T0 + 200000; /* the episodes are over: idle */
    struct state_ticket t;
    assert_true(claim(st, &a, "new", later, &t, NULL));
    state_metrics(st, &m);
    assert_int_equal(m.tx_per_key, 8);
    assert_int_equal(m.tx_used, 8); /* 24 slots free, yet 8 of a's */
    assert_int_equal(m.evictions, 1);
    assert_int_equal(m.quota_full, 0);
    assert_int_equal(lookup(st, &a, "T0", later).status, TXS_NONE); /* its least recently used */
    assert_int_equal(count_known(st, &a, 8, later), 7);
    assert_true(lookup(st, &a, "new", later).in_flight);
    state_free(st);
}

/* A key whose quota is all in use gets checking; other keys find room;
 * a told status of that key still finds room. */
static void test_quota_all_own_busy(void **unused)
{
    (void)unused;
    struct state *st = mk_quota(32, 8);
    struct state_key a = key_of(st, "sk_test_a"), b = key_of(st, "sk_test_b"), c = key_of(st, "sk_test_c");
    struct pace_schedule s = sched_default();
    struct state_metrics m;
    /* a's flood: 8 held requests, their reads in flight */
    for (int i = 0; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof id, "F%d", i);
        assert_true(state_hold(st, &a, id, &s, BUDGET, T0 + 34000, T0 + i, NULL));
    }
    claim_n(st, &a, "F", 8, T0 + 10, false);
    struct state_ticket t;
    struct state_fact f;
    for (int i = 0; i < 5; i++) {
        char id[16];
        snprintf(id, sizeof id, "G%d", i);
        assert_false(state_hold(st, &a, id, &s, BUDGET, T0 + 34000, T0 + 100 + i, NULL));
        assert_false(claim(st, &a, id, T0 + 100 + i, &t, &f));
        assert_int_equal(f.wait, WAIT_FULL);
        assert_int_equal(lookup(st, &a, id, T0 + 100 + i).status, TXS_NONE);
    }
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 8);
    assert_int_equal(m.quota_full, 10);
    assert_int_equal(m.full, 0);
    assert_int_equal(m.evictions, 0);
    /* other keys: the rest of the table */
    claim_n(st, &b, "B", 8, T0 + 200, false);
    assert_true(state_hold(st, &c, "paid", &s, BUDGET, T0 + 34000, T0 + 300, NULL));
    assert_true(claim(st, &c, "paid", T0 + 300, &t, &f));
    finish(st, &t, "toko-c", oc_status(TXS_SUCCEEDED, NULL), T0 + 400);
    assert_true(lookup(st, &c, "paid", T0 + 400).final);
    /* a status told for a's id finds room past its quota (a free slot) */
    assert_int_equal(tell(st, &a, "told", TXS_SUCCEEDED, T0 + 500), STATE_TOLD_RECORDED);
    assert_true(lookup(st, &a, "told", T0 + 500).final);
    /* the flood is untouched */
    for (int i = 0; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof id, "F%d", i);
        assert_true(lookup(st, &a, id, T0 + 500).in_flight);
    }
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 8 + 8 + 1 + 1);
    assert_int_equal(m.evictions, 0);
    /* a's next request: over its quota, its one idle entry (the told one,
     * cached, idle) makes room; then none */
    assert_true(claim(st, &a, "G9", T0 + 600, &t, &f));
    assert_int_equal(lookup(st, &a, "told", T0 + 600).status, TXS_NONE);
    assert_false(claim(st, &a, "G10", T0 + 601, &t, &f));
    assert_int_equal(f.wait, WAIT_FULL);
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 8 + 8 + 1 + 1);
    assert_int_equal(m.evictions, 1);
    assert_int_equal(m.quota_full, 11);
    state_free(st);
}

/* Every slot in use by four flooded keys, each at its quota: a request of
 * a fifth key gets checking, and so does its told status (STATE_TOLD_FULL:
 * another key's entry in use is never taken); a flooded key's own told
 * status takes the least harmful of its own: no read in flight, least
 * recently used. */
static void test_tell_finds_room_in_a_busy_table(void **unused)
{
    (void)unused;
    struct state *st = mk_quota(32, 8);
    struct state_key k[5];
    for (int i = 0; i < 5; i++)
        k[i] = key_n(st, i);
    claim_n(st, &k[0], "A", 8, T0, false);       /* reads in flight */
    claim_n(st, &k[1], "B", 8, T0 + 100, true);  /* read, episode running */
    claim_n(st, &k[2], "C", 8, T0 + 200, false);
    claim_n(st, &k[3], "D", 8, T0 + 300, false);
    struct state_ticket t;
    struct state_fact f;
    assert_false(claim(st, &k[4], "paid", T0 + 400, &t, &f));
    assert_int_equal(f.wait, WAIT_FULL);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.full, 1);
    assert_int_equal(m.tx_used, 32);
    /* the fifth key has no entry of its own: refused, nothing taken */
    for (int i = 0; i < 40; i++) {
        char id[16];
        snprintf(id, sizeof id, "P%d", i);
        assert_int_equal(tell(st, &k[4], id, TXS_SUCCEEDED, T0 + 500 + i), STATE_TOLD_FULL);
        assert_false(lookup(st, &k[4], id, T0 + 500 + i).final);
    }
    for (int i = 0; i < 8; i++) {
        char a[16], b[16];
        snprintf(a, sizeof a, "A%d", i);
        snprintf(b, sizeof b, "B%d", i);
        assert_true(lookup(st, &k[0], a, T0 + 600).in_flight);
        assert_int_equal(lookup(st, &k[1], b, T0 + 600).status, TXS_PENDING);
    }
    state_metrics(st, &m);
    assert_int_equal(m.evictions, 0);
    /* a flooded key's own told status: its own B0 goes (no read in flight,
     * least recently used); no other key loses anything */
    assert_int_equal(tell(st, &k[1], "paid-b", TXS_SUCCEEDED, T0 + 700), STATE_TOLD_RECORDED);
    assert_true(lookup(st, &k[1], "paid-b", T0 + 700).final);
    assert_int_equal(lookup(st, &k[1], "B0", T0 + 700).status, TXS_NONE);
    for (int i = 1; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof id, "B%d", i);
        assert_int_equal(lookup(st, &k[1], id, T0 + 700).status, TXS_PENDING);
    }
    /* a key whose every entry has a read in flight: one of them goes, the
     * least recently used (A0), and still no other key's */
    assert_int_equal(tell(st, &k[0], "paid-a", TXS_SUCCEEDED, T0 + 800), STATE_TOLD_RECORDED);
    assert_true(lookup(st, &k[0], "paid-a", T0 + 800).final);
    assert_int_equal(lookup(st, &k[0], "A0", T0 + 800).status, TXS_NONE);
    for (int i = 0; i < 8; i++) {
        char id[16];
        snprintf(id, sizeof id, "C%d", i);
        assert_true(lookup(st, &k[2], id, T0 + 800).in_flight);
    }
    state_metrics(st, &m);
    assert_int_equal(m.tx_used, 32);
    assert_int_equal(m.evictions, 2);
    state_free(st);
}

/* A key's count survives the loss of its key entry: made again, it is
 * counted from the table, and the quota holds. */
static void test_quota_after_key_eviction(void **unused)
{
    (void)unused;
    struct state *st = mk_opts((struct state_opts){.tx_slots = 256, .tx_per_key = 8, .key_slots = STATE_KEY_SLOTS_MIN});
    struct state_key a = key_of(st, "sk_test_a");
    claim_n(st, &a, "T", 8, T0, true);
    int64_t later = T0 + STATE_KEY_IDLE_MS + PACE_EPISODE_MS + 1000;
    for (int i = 0; i < STATE_KEY_SLOTS_MIN; i++) { /* a's key entry, the oldest idle one, goes */
        struct state_key k = key_n(st, i);
        assert_true(claim(st, &k, "X", later + i, NULL, NULL));
    }
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.key_evictions, 1);
    assert_int_equal(count_known(st, &a, 8, later + 100), 8);
    /* once the others' keys are idle, a's entry is made again */
    int64_t then = later + STATE_KEY_IDLE_MS + 1000;
    long ev = m.evictions;
    assert_true(claim(st, &a, "new", then, NULL, NULL));
    state_metrics(st, &m);
    assert_int_equal(m.key_evictions, 2);
    assert_int_equal(m.evictions, ev + 1); /* one of its own, not a free slot */
    assert_int_equal(count_known(st, &a, 8, then), 7);
    state_free(st);
}

/* A request refused at its key's quota looks at EVICT_SAMPLE (64) of the
 * key's entries at most, never the table (which today's 16384 slots and
 * a quota of 4096 would make 16,448 entries a refusal); successive looks
 * go round the key's entries, so an idle one is found within
 * quota / 64 requests, and only ever the key's own. */
static void test_quota_refusal_looks_at_few(void **unused)
{
    (void)unused;
    struct state *st = mk_quota(16384, 4096);
    struct state_key a = key_of(st, "sk_test_a"), b = key_of(st, "sk_test_b");
    struct pace_schedule s = sched_default();
    int64_t deadline = T0 + 34000;
    for (int i = 0; i < 4096; i++) { /* another key's idle entries */
        char id[16];
        snprintf(id, sizeof id, "B%d", i);
        assert_int_equal(tell(st, &b, id, TXS_SUCCEEDED, T0), STATE_TOLD_RECORDED);
    }
    for (int i = 0; i < 4096; i++) { /* a's whole quota held */
        char id[16];
        snprintf(id, sizeof id, "A%d", i);
        assert_true(state_hold(st, &a, id, &s, BUDGET, deadline, T0 + 1, NULL));
    }
    for (int i = 0; i < 20; i++) {
        char id[16];
        snprintf(id, sizeof id, "N%d", i);
        long before = state_test_looked(st);
        assert_false(state_hold(st, &a, id, &s, BUDGET, deadline, T0 + 10 + i, NULL));
        assert_in_range(state_test_looked(st) - before, 1, 64);
    }
    /* one of a's entries lets go (idle now); a's requests find it within
     * 4096 / 64 looks, each of 64 entries at most */
    assert_true(state_unhold(st, &a, "A3000", T0 + 100, NULL));
    int tries = 0;
    bool held = false;
    while (!held && tries < 4096 / 64 + 1) {
        char id[16];
        snprintf(id, sizeof id, "M%d", tries);
        long before = state_test_looked(st);
        held = state_hold(st, &a, id, &s, BUDGET, deadline, T0 + 200 + tries, NULL);
        assert_in_range(state_test_looked(st) - before, 1, 64);
        tries++;
    }
    assert_true(held);
    assert_int_equal(lookup(st, &a, "A3000", T0 + 300).status, TXS_NONE);
    for (int i = 0; i < 4096; i += 7) { /* b lost nothing */
        char id[16];
        snprintf(id, sizeof id, "B%d", i);
        assert_true(lookup(st, &b, id, T0 + 300).final);
    }
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.evictions, 1);
    state_free(st);
}

/* A new key's entry adopts the table's entries of its key only when such
 * orphans may exist (a key entry forgotten, or none free when an entry was
 * made): a box that makes a key entry per shop looks at no transaction
 * slot for it; once a key entry was forgotten, a key made again finds
 * its entries (its quota counts them). */
static void test_new_key_scans_only_after_orphans(void **unused)
{
    (void)unused;
    struct state *st = mk_quota(16384, 4);
    struct pace_schedule s = sched_default();
    long before = state_test_looked(st);
    for (int i = 0; i < 50; i++) {
        char name[32];
        snprintf(name, sizeof name, "sk_test_shop_%d", i);
        struct state_key k = key_of(st, name);
        assert_true(state_hold(st, &k, "t1", &s, BUDGET, T0 + 34000, T0 + i, NULL));
    }
    assert_int_equal(state_test_looked(st) - before, 0);
    state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_slots_follow_the_configuration),
        cmocka_unit_test(test_key_full_evicts_an_idle_key),
        cmocka_unit_test(test_key_eviction_keeps_the_budget),
        cmocka_unit_test(test_key_of_404s_only_makes_room),
        cmocka_unit_test(test_evict_idle),
        cmocka_unit_test(test_evict_never_in_use),
        cmocka_unit_test(test_full_in_flight),
        cmocka_unit_test(test_quota_evicts_own_idle),
        cmocka_unit_test(test_quota_all_own_busy),
        cmocka_unit_test(test_tell_finds_room_in_a_busy_table),
        cmocka_unit_test(test_quota_after_key_eviction),
        cmocka_unit_test(test_quota_refusal_looks_at_few),
        cmocka_unit_test(test_new_key_scans_only_after_orphans),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
