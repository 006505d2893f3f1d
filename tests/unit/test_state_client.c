/* test_state_client.c - unit tests of src/state_client.c: ids nobody has
 * paid for, 404s charged to the client (IPv4, IPv6 /64, /56 and /48),
 * the 404 quarter of a key's budget, the clients' table and another
 * host's block, with simulated `now` values. */
#include "state_fixture.h"

/* ---- ids nobody has paid for: 404s charged to the client ---- */

static struct state *mk_clients(int client_slots)
{
    return mk_opts((struct state_opts){.tx_slots = 1024, .client_slots = client_slots});
}

/* The client at addr of key k. */
static struct state_client client_for(struct state *st, const struct state_key *k, const char *addr)
{
    struct state_client c;
    state_client_id(st, k, addr, &c);
    return c;
}

/* The client at addr of the key "sk_test_a". */
static struct state_client client_of(struct state *st, const char *addr)
{
    struct state_key k = key_of(st, "sk_test_a");
    return client_for(st, &k, addr);
}

/* A read of `id` for client c at now, answered 404. */
static struct state_report probe(struct state *st, const struct state_key *k, const struct state_client *c,
                                 const char *id, int64_t now)
{
    struct state_ticket t;
    assert_true(claim(st, k, id, now, &t, NULL));
    if (c != NULL)
        t.client = *c;
    return finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), now + 100);
}

static void probe_n(struct state *st, const struct state_key *k, const struct state_client *c, const char *prefix,
                    int n, int64_t now, int64_t step)
{
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof id, "%s%d", prefix, i);
        assert_false(probe(st, k, c, id, now + i * step).client_blocked);
    }
}

static void test_client_id(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64), *other = mk_clients(64);
    struct state_client a = client_of(st, "192.0.2.7"), b = client_of(st, "192.0.2.8"), z;
    assert_memory_equal(a.b, client_of(st, "192.0.2.7").b, 16);
    assert_memory_not_equal(a.b, b.b, 16);
    assert_memory_equal(a.b, client_of(st, "::ffff:192.0.2.7").b, 16);
    /* one IPv6 /64 is one client */
    assert_memory_equal(client_of(st, "2001:db8:1:2::1").b, client_of(st, "2001:db8:1:2:ffff:1:2:3").b, 16);
    assert_memory_not_equal(client_of(st, "2001:db8:1:2::1").b, client_of(st, "2001:db8:1:3::1").b, 16);
    assert_memory_equal(client_of(st, "fe80::1%eth0").b, client_of(st, "fe80::2").b, 16);
    /* keyed: another state's salt gives another id; never all zero */
    assert_memory_not_equal(a.b, client_of(other, "192.0.2.7").b, 16);
    memset(&z, 0, sizeof z);
    assert_memory_not_equal(client_of(st, NULL).b, z.b, 16);
    assert_memory_not_equal(client_of(st, "").b, z.b, 16);
    /* per key: one address is another client of each key */
    struct state_key kb = key_of(st, "sk_test_b");
    assert_memory_not_equal(a.b, client_for(st, &kb, "192.0.2.7").b, 16);
    assert_memory_equal(client_for(st, &kb, "192.0.2.7").b, client_for(st, &kb, "::ffff:192.0.2.7").b, 16);
    state_free(st);
    state_free(other);
}

/* A claim of `id` at now for client c (NULL: nobody). */
static bool claim_for(struct state *st, const struct state_key *k, const char *id, const struct state_client *c,
                      int64_t now, struct state_ticket *t, struct state_fact *f)
{
    struct pace_schedule s = sched_default();
    struct state_fact ff;
    return state_claim_client(st, k, id, &s, BUDGET, TIMEOUT, c, now, t, f ? f : &ff);
}

static void test_client_burst_counts_reads_in_flight(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client c = client_of(st, "203.0.113.7"), d = client_of(st, "203.0.113.8");
    struct state_ticket t[25];
    struct state_fact f;
    /* 25 guesses at once: 5 reads start, the 6th waits for them */
    for (int i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof id, "G%d", i);
        assert_true(claim_for(st, &k, id, &c, T0 + i, &t[i], NULL));
        assert_memory_equal(t[i].client.b, c.b, 16); /* the ticket carries its client */
    }
    for (int i = 5; i < 25; i++) {
        char id[8];
        snprintf(id, sizeof id, "G%d", i);
        assert_false(claim_for(st, &k, id, &c, T0 + 10, &t[i], &f));
        assert_int_equal(f.wait, WAIT_CLIENT);
        assert_true(f.next_read == T0 + 10 + STATE_CLIENT_RECHECK_MS); /* a lease is further */
        assert_false(f.in_flight);
    }
    /* another client, and nobody, are not held back */
    assert_true(claim_for(st, &k, "D0", &d, T0 + 10, &t[5], NULL));
    assert_true(claim_for(st, &k, "N0", NULL, T0 + 10, &t[6], NULL));
    /* the first lease to end bounds the wait */
    assert_false(claim_for(st, &k, "G9", &c, T0 + LEASE - 100, &t[7], &f));
    assert_true(f.next_read == T0 + LEASE);
    /* the 5 answer 404: blocked, the last one starts it */
    for (int i = 0; i < 5; i++)
        assert_int_equal(finish(st, &t[i], "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 300).client_blocked, i == 4);
    assert_true(state_client_blocked(st, &c, T0 + 300));
    assert_false(claim_for(st, &k, "G9", &c, T0 + 400, &t[7], &f));
    assert_int_equal(f.wait, WAIT_CLIENT);
    assert_true(f.next_read == T0 + 300 + STATE_CLIENT_BLOCK_MS); /* the block's end: past any deadline */
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.client_blocks, 1);
    state_free(st);
}

static void test_client_reads_in_flight_released(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client c = client_of(st, "192.0.2.50"); /* an office: ten buyers */
    struct state_ticket t[8];
    struct state_fact f;
    for (int i = 0; i < 5; i++) {
        char id[8];
        snprintf(id, sizeof id, "B%d", i);
        assert_true(claim_for(st, &k, id, &c, T0, &t[i], NULL));
    }
    assert_false(claim_for(st, &k, "B5", &c, T0 + 1, &t[5], &f));
    /* a payment that exists answers 200: its count is released */
    finish(st, &t[0], "toko-a", oc_status(TXS_SUCCEEDED, NULL), T0 + 300);
    assert_true(claim_for(st, &k, "B5", &c, T0 + 301, &t[5], NULL));
    assert_false(claim_for(st, &k, "B6", &c, T0 + 302, &t[6], &f));
    /* a read that gave no answer is released too */
    finish(st, &t[1], "toko-a", oc_kind(OUT_NO_ANSWER), T0 + 400);
    assert_true(claim_for(st, &k, "B6", &c, T0 + 401, &t[6], NULL));
    /* a claim never made (another host's authority refused it) as well */
    state_unclaim(st, &t[2], T0 + 500);
    assert_true(claim_for(st, &k, "B7", &c, T0 + 501, &t[7], NULL));
    assert_false(claim_for(st, &k, "B2", &c, T0 + 502, &t[2], &f));
    /* and a read whose lease ended (its process died) */
    assert_true(claim_for(st, &k, "B2", &c, T0 + LEASE, &t[2], NULL));
    /* ids with a known status are not counted, nor held back */
    for (int i = 3; i < 8; i++)
        finish(st, &t[i], "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 10);
    finish(st, &t[2], "toko-a", oc_status(TXS_PENDING, NULL), T0 + LEASE + 10);
    int64_t later = T0 + 2 * LEASE + 100000; /* each transaction's pace allows a read */
    for (int i = 2; i < 8; i++)
        assert_true(claim_for(st, &k, t[i].id, &c, later, &t[i], NULL));
    assert_false(state_client_blocked(st, &c, later));
    state_free(st);
}

static void test_client_per_key(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_key ka = key_of(st, "sk_test_a"), kb = key_of(st, "sk_test_b");
    struct state_client ca = client_for(st, &ka, "203.0.113.7"), cb = client_for(st, &kb, "203.0.113.7");
    probe_n(st, &ka, &ca, "X", 4, T0, 100);
    assert_true(probe(st, &ka, &ca, "X4", T0 + 1000).client_blocked);
    assert_true(state_client_blocked(st, &ca, T0 + 2000));
    /* the same address on another shop (key): not blocked, reads go on */
    assert_false(state_client_blocked(st, &cb, T0 + 2000));
    struct state_ticket t;
    assert_true(claim_for(st, &kb, "PAID", &cb, T0 + 2000, &t, NULL));
    finish(st, &t, "toko-b", oc_status(TXS_SUCCEEDED, NULL), T0 + 2100);
    assert_true(claim_for(st, &kb, "GUESS", &cb, T0 + 2200, &t, NULL));
    assert_false(finish(st, &t, "toko-b", oc_kind(OUT_NOT_FOUND), T0 + 2300).client_blocked);
    struct state_fact f;
    assert_false(claim_for(st, &ka, "GUESS", &ca, T0 + 2400, &t, &f));
    assert_int_equal(f.wait, WAIT_CLIENT);
    state_free(st);
}

static void test_client_five_404s_block(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client c = client_of(st, "198.51.100.1");
    int64_t now = T0;
    probe_n(st, &k, &c, "X", 4, now, 1000);
    assert_false(state_client_blocked(st, &c, now + 5000)); /* 4 do not */
    struct state_report r = probe(st, &k, &c, "X4", now + 5000);
    assert_true(r.client_blocked); /* the 5th does: one log line */
    int64_t from = now + 5100;
    assert_true(state_client_blocked(st, &c, from));
    /* the block lasts 10 minutes */
    assert_true(state_client_blocked(st, &c, from + STATE_CLIENT_BLOCK_MS - 1));
    assert_false(state_client_blocked(st, &c, from + STATE_CLIENT_BLOCK_MS));
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.client_blocks, 1);
    /* after it, the count starts again: one 404 does not block */
    assert_false(probe(st, &k, &c, "Y0", from + STATE_CLIENT_BLOCK_MS).client_blocked);
    assert_false(state_client_blocked(st, &c, from + STATE_CLIENT_BLOCK_MS + 200));
    state_free(st);
}

static void test_client_window_slides(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client c = client_of(st, "198.51.100.1");
    /* 5 404s, but spread over more than 10 minutes: never 5 within one */
    probe_n(st, &k, &c, "X", 5, T0, STATE_CLIENT_WINDOW_MS / 4 + 1);
    assert_false(state_client_blocked(st, &c, T0 + STATE_CLIENT_WINDOW_MS + 5000));
    /* the same id again and again is one id (a buyer reloading a typo) */
    for (int i = 0; i < 8; i++)
        assert_false(probe(st, &k, &c, "TYPO", T0 + 3 * STATE_CLIENT_WINDOW_MS + i * 31000).client_blocked);
    assert_false(state_client_blocked(st, &c, T0 + 3 * STATE_CLIENT_WINDOW_MS + 9 * 31000));
    state_free(st);
}

static void test_client_blocked_known_ids_still_read(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client c = client_of(st, "203.0.113.9");
    struct state_ticket t;
    /* a payment that exists, read once (pending) */
    assert_true(claim(st, &k, "PAID", T0, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 100);
    probe_n(st, &k, &c, "X", 4, T0 + 1000, 1000);
    assert_true(probe(st, &k, &c, "X4", T0 + 5000).client_blocked);
    /* blocked: an id kembali knows nothing about (none, or only a 404) is
     * not read; a known one (pending included) is */
    assert_true(state_client_blocked(st, &c, T0 + 6000));
    assert_true(state_fact_unknown(&(struct state_fact){.status = TXS_NONE}));
    struct state_fact f = lookup(st, &k, "NEW", T0 + 6000);
    assert_true(state_fact_unknown(&f));
    f = lookup(st, &k, "X1", T0 + 6000);
    assert_true(state_fact_unknown(&f)); /* only a remembered 404 */
    f = lookup(st, &k, "PAID", T0 + 6000);
    assert_false(state_fact_unknown(&f));
    assert_true(claim(st, &k, "PAID", T0 + 6000, &t, NULL)); /* the state itself does not refuse */
    t.client = c;
    /* a 404 for an id with a known status is not a probe: not charged */
    struct state_client d = client_of(st, "203.0.113.10");
    t.client = d;
    finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 6100);
    for (int i = 0; i < 4; i++) {
        char id[8];
        snprintf(id, sizeof id, "K%d", i);
        struct state_ticket tk;
        assert_true(claim(st, &k, id, T0 + 7000 + i, &tk, NULL));
        finish(st, &tk, "toko-a", oc_status(TXS_PENDING, NULL), T0 + 7100 + i);
        struct state_fact g;
        struct pace_schedule s = sched_default();
        assert_true(state_claim(st, &k, id, &s, BUDGET, TIMEOUT, T0 + 9000 + i, &tk, &g));
        tk.client = d;
        finish(st, &tk, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 9100 + i);
    }
    assert_false(state_client_blocked(st, &d, T0 + 10000));
    /* no client on the ticket: nothing charged */
    for (int i = 0; i < 6; i++) {
        char id[8];
        snprintf(id, sizeof id, "Z%d", i);
        assert_false(probe(st, &k, NULL, id, T0 + 11000 + i).client_blocked);
    }
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.client_blocks, 1);
    state_free(st);
}

static void test_clients_independent(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client a = client_of(st, "192.0.2.1"), b = client_of(st, "192.0.2.2");
    probe_n(st, &k, &a, "A", 4, T0, 100);
    probe_n(st, &k, &b, "B", 4, T0, 100);
    assert_true(probe(st, &k, &a, "A4", T0 + 1000).client_blocked);
    assert_true(state_client_blocked(st, &a, T0 + 2000));
    assert_false(state_client_blocked(st, &b, T0 + 2000));
    /* a late (stale) 404 still counts: it happened at Kasera */
    struct state_ticket t1, t2;
    assert_true(claim(st, &k, "B4", T0 + 3000, &t1, NULL));
    assert_true(claim(st, &k, "B4", T0 + 3000 + LEASE, &t2, NULL));
    t1.client = b;
    struct state_report r = finish(st, &t1, "toko-a", oc_kind(OUT_NOT_FOUND), T0 + 3100 + LEASE);
    assert_true(r.stale);
    assert_true(r.client_blocked);
    state_free(st);
}

static void test_clients_blocked_gauge(void **unused)
{
    (void)unused;
    /* the gauge counts blocks running now (the metrics page's clock) */
    struct state *st = mk_clients(64);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client c = client_of(st, "192.0.2.1");
    int64_t now = util_mono_ms();
    probe_n(st, &k, &c, "A", 5 - 1, now, 1);
    assert_true(probe(st, &k, &c, "A9", now + 10).client_blocked);
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.clients_blocked, 1);
    state_free(st);
}

/* The ids of an IPv6 address: its /64 (b), its /56 and /48 (wide); none
 * wide for IPv4. */
static void test_client_prefix_ids(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    static const uint8_t zero[16];
    struct state_client a = client_of(st, "2001:db8:ab:cd01::1"), b = client_of(st, "2001:db8:ab:cd02::1");
    struct state_client c = client_of(st, "2001:db8:ab:ce01::1"), v4 = client_of(st, "192.0.2.7");
    assert_memory_not_equal(a.b, b.b, 16);            /* two /64s ... */
    assert_memory_equal(a.wide[0], b.wide[0], 16);    /* ... of one /56 */
    assert_memory_not_equal(a.wide[0], c.wide[0], 16); /* another /56 ... */
    assert_memory_equal(a.wide[1], c.wide[1], 16);    /* ... of the same /48 */
    assert_memory_not_equal(a.wide[0], a.wide[1], 16);
    assert_memory_not_equal(client_of(st, "2001:db8:ac::1").wide[1], a.wide[1], 16);
    assert_memory_equal(v4.wide[0], zero, 16);
    assert_memory_equal(v4.wide[1], zero, 16);
    assert_memory_equal(client_of(st, "::ffff:192.0.2.7").wide[1], zero, 16);
    /* per key, as the address's own id */
    struct state_key kb = key_of(st, "sk_test_b");
    assert_memory_not_equal(a.wide[1], client_for(st, &kb, "2001:db8:ab:cd01::1").wide[1], 16);
    state_free(st);
}

/* Random ids from the /64s of one IPv6 prefix, one after the other (each
 * answered 404 at once), `per` from each of n64 addresses
 * 2001:db8:ab:X::1, X = base + i * step: how many were read. */
static int prefix_probe(struct state *st, const struct state_key *k, int base, int step, int n64, int per,
                        int64_t now)
{
    int reads = 0;
    for (int i = 0; i < n64; i++) {
        char a[64];
        snprintf(a, sizeof a, "2001:db8:ab:%x::1", base + i * step);
        struct state_client c = client_for(st, k, a);
        for (int j = 0; j < per; j++) {
            char id[32];
            struct state_ticket t;
            snprintf(id, sizeof id, "G%d_%d", i, j);
            now += 500; /* 96 over 48 s: the key's quarter (BUDGET / 4 = 30) is not what stops them */
            if (!claim_for(st, k, id, &c, now, &t, NULL))
                continue;
            reads++;
            finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), now + 100);
        }
    }
    return reads;
}

static void test_client_ipv6_prefix_spread(void **unused)
{
    (void)unused;
    /* 96 ids from the 16 /64s of one /60 (6 each): one /56's 10 */
    struct state *st = mk_clients(256);
    struct state_key k = key_of(st, "sk_test_a");
    assert_int_equal(prefix_probe(st, &k, 0xcd00, 1, 16, 6, T0), STATE_CLIENT_404S_56);
    /* blocked at the /56: another /64 of it too, but not another /56 */
    struct state_client other = client_for(st, &k, "2001:db8:ab:cdff::9");
    assert_true(state_client_blocked(st, &other, T0 + 60000));
    other = client_for(st, &k, "2001:db8:ab:ce00::9");
    assert_false(state_client_blocked(st, &other, T0 + 60000));
    state_free(st);
    /* 96 ids from 96 /56s of one /48: the /48's 20 */
    st = mk_clients(256);
    k = key_of(st, "sk_test_a");
    assert_int_equal(prefix_probe(st, &k, 0, 0x100, 96, 1, T0), STATE_CLIENT_404S_48);
    other = client_for(st, &k, "2001:db8:ab:ffff::1");
    assert_true(state_client_blocked(st, &other, T0 + 60000));
    /* a known id is read for the blocked prefix as for anybody */
    tell(st, &k, "PAID", TXS_PENDING, T0 + 60000);
    struct state_ticket t;
    assert_true(claim_for(st, &k, "PAID", &other, T0 + 60000, &t, NULL));
    /* the /48's block ends with its 10 minutes */
    assert_false(state_client_blocked(st, &other, T0 + 48000 + 100 + STATE_CLIENT_BLOCK_MS + 1000));
    state_free(st);
    /* one /64's allowance is still its own 5 */
    st = mk_clients(256);
    k = key_of(st, "sk_test_a");
    assert_int_equal(prefix_probe(st, &k, 0xcd00, 1, 1, 9, T0), STATE_CLIENT_404S);
    state_free(st);
}

/* A client blocked at its /56 waits for that block, whatever its /64's
 * count says (every tier's block is asked first, as the Redis claim does:
 * rules_client_blocked), not the soon recheck of a /64 at its count. */
static void test_client_blocked_at_a_prefix_whatever_its_64s_count(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(256);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_client x = client_for(st, &k, "2001:db8:ab:cd01::1");
    struct state_ticket t;
    for (int i = 0; i < STATE_CLIENT_404S; i++) { /* the /64's allowance, in flight */
        char id[16];
        snprintf(id, sizeof id, "F%d", i);
        assert_true(claim_for(st, &k, id, &x, T0, &t, NULL));
    }
    struct state_client p56 = {0}; /* its /56, as a client of its own */
    memcpy(p56.b, x.wide[0], sizeof p56.b);
    state_client_block(st, &p56, T0 + 100000, T0);
    struct state_fact f;
    assert_false(claim_for(st, &k, "F9", &x, T0 + 10, &t, &f));
    assert_int_equal(f.wait, WAIT_CLIENT);
    assert_int_equal(f.next_read, T0 + 100000);
    state_free(st);
}

/* Reads in flight count at every prefix: a burst from many /64s of one
 * /56 all at once starts the /56's allowance, no more. */
static void test_client_prefix_counts_reads_in_flight(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(256);
    struct state_key k = key_of(st, "sk_test_a");
    struct state_ticket t[16];
    int reads = 0;
    for (int i = 0; i < 16; i++) {
        char a[64], id[16];
        snprintf(a, sizeof a, "2001:db8:ab:cd0%x::1", i);
        snprintf(id, sizeof id, "B%d", i);
        struct state_client c = client_for(st, &k, a);
        struct state_fact f;
        if (claim_for(st, &k, id, &c, T0, &t[reads], &f))
            reads++;
        else
            assert_int_equal(f.wait, WAIT_CLIENT);
    }
    assert_int_equal(reads, STATE_CLIENT_404S_56);
    /* one ends with a status: in flight no more at any prefix, room for one */
    finish(st, &t[0], "toko-a", oc_status(TXS_PENDING, NULL), T0 + 200);
    struct state_client c = client_for(st, &k, "2001:db8:ab:cd99::1");
    assert_true(claim_for(st, &k, "B99", &c, T0 + 300, &t[0], NULL));
    state_free(st);
}

/* The 404 quarter: reads of ids never answered that end 404 take at most
 * BUDGET / 4 of the key's budget in any 60 s, whatever the addresses. */
static void test_not_found_quarter(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(1024);
    struct state_key k = key_of(st, "sk_test_a");
    const int cap = rules_not_found_cap(BUDGET);
    assert_int_equal(cap, BUDGET / 4);
    int reads = 0;
    int64_t now = T0;
    struct state_fact f;
    for (int i = 0; i < 64; i++) { /* 64 addresses, 2 guesses each: every one under its own 5 */
        char a[32];
        snprintf(a, sizeof a, "198.51.100.%d", i + 1);
        struct state_client c = client_for(st, &k, a);
        for (int j = 0; j < 2; j++) {
            char id[16];
            struct state_ticket t;
            snprintf(id, sizeof id, "Q%d_%d", i, j);
            now += 100;
            if (!claim_for(st, &k, id, &c, now, &t, &f)) {
                assert_int_equal(f.wait, WAIT_BUDGET);
                continue;
            }
            reads++;
            finish(st, &t, "toko-a", oc_kind(OUT_NOT_FOUND), now + 50);
        }
    }
    assert_int_equal(reads, cap);
    /* a known id reads as ever; an unknown one, not held, waits for the
     * first 404 to leave the span */
    tell(st, &k, "KNOWN", TXS_PENDING, now);
    struct state_ticket t;
    assert_true(claim_for(st, &k, "KNOWN", NULL, now + 10, &t, NULL));
    finish(st, &t, "toko-a", oc_status(TXS_PENDING, NULL), now + 20);
    assert_false(claim_for(st, &k, "NEW", NULL, now + 30, &t, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_int_equal(f.next_read, T0 + 100 + 60001);
    /* an unknown id held (a buyer's real payment kembali has never seen):
     * read with its last-chance read, shortly before its deadline */
    struct pace_schedule s = sched_default();
    int64_t dl = now + 30000;
    assert_true(state_hold(st, &k, "BUYER", &s, BUDGET, dl, now + 40, NULL));
    assert_false(claim_for(st, &k, "BUYER", NULL, now + 50, &t, &f));
    assert_int_equal(f.wait, WAIT_BUDGET);
    assert_true(f.next_read <= dl - PLAN_LEAD_MS);
    assert_true(claim_for(st, &k, "BUYER", NULL, dl - PLAN_LEAD_MS, &t, &f));
    finish(st, &t, "toko-a", oc_status(TXS_SUCCEEDED, NULL), dl - PLAN_LEAD_MS + 100);
    /* once the 404s leave the span, unknown ids are read again */
    assert_true(claim_for(st, &k, "NEW", NULL, T0 + 100 + 60001 + 100 * cap, &t, NULL));
    state_free(st);
}

/* Reads of ids never answered that are still under way count toward the
 * quarter (a burst sent at once from many addresses), until they end
 * otherwise or their lease runs out. */
static void test_not_found_quarter_counts_reads_under_way(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(1024);
    struct state_key k = key_of(st, "sk_test_a");
    const int cap = rules_not_found_cap(BUDGET);
    struct state_ticket t[64];
    struct state_fact f;
    int reads = 0;
    for (int i = 0; i < 64; i++) {
        char a[32], id[16];
        snprintf(a, sizeof a, "198.51.100.%d", i + 1);
        snprintf(id, sizeof id, "U%d", i);
        struct state_client c = client_for(st, &k, a);
        if (claim_for(st, &k, id, &c, T0 + i, &t[reads], &f))
            reads++;
        else
            assert_true(f.next_read <= T0 + i + RULES_PLAN_RECHECK_MS);
    }
    assert_int_equal(reads, cap);
    /* one ends pending (a real payment): room for one more */
    finish(st, &t[0], "toko-a", oc_status(TXS_PENDING, NULL), T0 + 200);
    assert_true(claim_for(st, &k, "U100", NULL, T0 + 300, &t[0], NULL));
    assert_false(claim_for(st, &k, "U101", NULL, T0 + 301, &t[1], NULL));
    /* reads whose lease ran out (their process died) count no longer */
    assert_true(claim_for(st, &k, "U101", NULL, T0 + 300 + LEASE + 1, &t[1], NULL));
    state_free(st);
}

static void test_clients_table_full(void **unused)
{
    (void)unused;
    /* 8 slots: one set of 8 ways */
    struct state *st = mk_clients(8);
    struct state_client c[10];
    struct state_key ks[10]; /* a key each: no key's 404 quarter is spent */
    for (int i = 0; i < 10; i++) {
        char a[32];
        snprintf(a, sizeof a, "10.0.0.%d", i + 1);
        ks[i] = key_n(st, i);
        c[i] = client_for(st, &ks[i], a);
    }
    int64_t now = T0;
    for (int i = 0; i < 8; i++) { /* 8 blocked clients fill the table */
        char p[8];
        snprintf(p, sizeof p, "P%d_", i);
        probe_n(st, &ks[i], &c[i], p, 4, now, 10);
        snprintf(p, sizeof p, "P%d_9", i);
        assert_true(probe(st, &ks[i], &c[i], p, now + 100).client_blocked);
    }
    /* a 9th finds no room: not counted, and no blocked client is forgotten */
    probe_n(st, &ks[8], &c[8], "Q", 5, now + 1000, 10);
    assert_false(state_client_blocked(st, &c[8], now + 2000));
    for (int i = 0; i < 8; i++)
        assert_true(state_client_blocked(st, &c[i], now + 2000));
    struct state_metrics m;
    state_metrics(st, &m);
    assert_int_equal(m.client_full, 5);
    assert_int_equal(m.client_slots, 8);
    /* once the blocks are over, the oldest idle ones make room */
    int64_t later = now + 200 + STATE_CLIENT_BLOCK_MS + STATE_CLIENT_WINDOW_MS;
    probe_n(st, &ks[8], &c[8], "R", 4, later, 10);
    assert_true(probe(st, &ks[8], &c[8], "R9", later + 100).client_blocked);
    probe_n(st, &ks[9], &c[9], "S", 4, later, 10);
    assert_true(probe(st, &ks[9], &c[9], "S9", later + 100).client_blocked);
    state_metrics(st, &m);
    assert_int_equal(m.client_full, 5);
    state_free(st);
}

/* Another host's block of a client: blocked here until then. */
static void test_client_block(void **unused)
{
    (void)unused;
    struct state *st = mk_clients(64);
    struct state_client c = client_of(st, "203.0.113.9"), none;
    struct state_metrics m;
    memset(&none, 0, sizeof none);
    assert_false(state_client_blocked(st, &c, T0));
    state_client_block(st, &c, T0 + 5000, T0);
    assert_true(state_client_blocked(st, &c, T0 + 1));
    assert_true(state_client_blocked(st, &c, T0 + 4999));
    assert_false(state_client_blocked(st, &c, T0 + 5000));
    state_metrics(st, &m);
    assert_int_equal(m.client_blocks, 1);
    /* while blocked: extended, no new block counted; never shortened */
    state_client_block(st, &c, T0 + 1000, T0 + 10);
    assert_true(state_client_blocked(st, &c, T0 + 4999));
    state_client_block(st, &c, T0 + 8000, T0 + 20);
    state_metrics(st, &m);
    assert_int_equal(m.client_blocks, 1);
    assert_true(state_client_blocked(st, &c, T0 + 7999));
    assert_false(state_client_blocked(st, &c, T0 + 8000));
    /* clamped to a block's length here; a new block counted */
    state_client_block(st, &c, T0 + 3600 * 1000LL, T0 + 10000);
    assert_true(state_client_blocked(st, &c, T0 + 10000 + STATE_CLIENT_BLOCK_MS - 1));
    assert_false(state_client_blocked(st, &c, T0 + 10000 + STATE_CLIENT_BLOCK_MS));
    state_metrics(st, &m);
    assert_int_equal(m.client_blocks, 2);
    /* nothing for no client or a time gone */
    state_client_block(st, &none, T0 + 5000, T0);
    assert_false(state_client_blocked(st, &none, T0 + 1));
    struct state_client d = client_of(st, "203.0.113.10");
    state_client_block(st, &d, T0, T0);
    assert_false(state_client_blocked(st, &d, T0));
    state_metrics(st, &m);
    assert_int_equal(m.client_blocks, 2);
    state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_client_id),
        cmocka_unit_test(test_client_burst_counts_reads_in_flight),
        cmocka_unit_test(test_client_reads_in_flight_released),
        cmocka_unit_test(test_client_per_key),
        cmocka_unit_test(test_client_five_404s_block),
        cmocka_unit_test(test_client_window_slides),
        cmocka_unit_test(test_client_blocked_known_ids_still_read),
        cmocka_unit_test(test_clients_independent),
        cmocka_unit_test(test_clients_blocked_gauge),
        cmocka_unit_test(test_client_prefix_ids),
        cmocka_unit_test(test_client_ipv6_prefix_spread),
        cmocka_unit_test(test_client_prefix_counts_reads_in_flight),
        cmocka_unit_test(test_client_blocked_at_a_prefix_whatever_its_64s_count),
        cmocka_unit_test(test_not_found_quarter),
        cmocka_unit_test(test_not_found_quarter_counts_reads_under_way),
        cmocka_unit_test(test_clients_table_full),
        cmocka_unit_test(test_client_block),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
