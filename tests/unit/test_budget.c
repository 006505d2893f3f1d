/* test_budget.c - unit tests of src/budget.c: what one host may spend with
 * one key, from what it knows, on a fake clock. The last test runs the
 * invariant through a fault: two hosts, a count that is lost and made
 * whole again from their own records (Redis's part, the scripts, is
 * tests/integration/test_redis_scripts.py's; the real faults,
 * test_redis_faults.py's). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "budget.h"

#define T0 5000000LL /* an arbitrary monotonic start */

static void test_share(void **unused)
{
    (void)unused;
    assert_int_equal(budget_share(120, 3, true), 120);  /* Redis counts every host's */
    assert_int_equal(budget_share(120, 3, false), 40);
    assert_int_equal(budget_share(120, 0, false), 120); /* no hosts said: one */
    assert_int_equal(budget_share(2, 3, false), 1);     /* never nothing */
}

static void test_stamps_are_unique_and_never_early(void **unused)
{
    (void)unused;
    assert_int_equal(budget_stamp(0, T0), T0);
    assert_int_equal(budget_stamp(T0 - 5, T0), T0);
    int64_t newest = 0;
    for (int i = 0; i < 5; i++) { /* a burst in one ms */
        int64_t t = budget_stamp(newest, T0);
        assert_int_equal(t, T0 + i);
        newest = t;
    }
    assert_int_equal(budget_stamp(newest, T0 + 100), T0 + 100);
}

static void test_members(void **unused)
{
    (void)unused;
    char a[BUDGET_MEMBER_MAX], b[BUDGET_MEMBER_MAX], c[BUDGET_MEMBER_MAX];
    budget_member(a, sizeof a, "0123456789abcdef", T0);
    budget_member(b, sizeof b, "0123456789abcdef", T0);
    assert_string_equal(a, b); /* sent again: the same name */
    assert_string_equal(a, "0123456789abcdef:5000000");
    budget_member(c, sizeof c, "fedcba9876543210", T0); /* another host, the same ms */
    assert_string_not_equal(a, c);
    budget_member(c, sizeof c, "0123456789abcdef", INT64_MIN); /* the longest fits */
    assert_int_equal(strlen(c), BUDGET_MEMBER_MAX - 1);
}

static void test_seed_takes_the_span(void **unused)
{
    (void)unused;
    const int64_t at[] = {T0 - 70000, T0 - BUDGET_SPAN_MS, T0 - BUDGET_SPAN_MS + 1, T0 - 10, T0, T0 + 2};
    int idx[6];
    int64_t ago[6];
    int n = budget_seed(at, 6, T0, idx, ago);
    assert_int_equal(n, 4);
    assert_int_equal(idx[0], 2);
    assert_int_equal(ago[0], BUDGET_SPAN_MS - 1);
    assert_int_equal(idx[1], 3);
    assert_int_equal(ago[1], 10);
    assert_int_equal(ago[2], 0);
    assert_int_equal(idx[3], 5); /* stamped ahead in a burst: counted as now */
    assert_int_equal(ago[3], 0);
    assert_int_equal(budget_seed(at, 0, T0, idx, ago), 0);
}

static void test_count_lost_or_forgotten(void **unused)
{
    (void)unused;
    assert_false(budget_count_lost(0, T0));                           /* never read with it */
    assert_true(budget_count_lost(T0 - 1000, T0));                    /* read lately: lost */
    assert_true(budget_count_lost(T0 - BUDGET_MARK_KEEP_MS + 1, T0));
    assert_false(budget_count_lost(T0 - BUDGET_MARK_KEEP_MS, T0));    /* its count simply ended */
    assert_true(budget_grace_ms(true) >= budget_grace_ms(false));     /* a failover takes longer */
}

/* ---- the invariant through a fault, on a fake clock ---- */

#define HOSTS 2
#define BUDGET 20
#define MAXR 256

struct host {
    char hex[17];
    int64_t ring[MAXR]; /* every read it made, as its state records them */
    int n;
};

struct count { /* Redis's count: names and times */
    char name[MAXR * HOSTS][BUDGET_MEMBER_MAX];
    int64_t at[MAXR * HOSTS];
    int n;
};

static int in_span(const int64_t *t, int n, int64_t now)
{
    int c = 0;
    for (int i = 0; i < n; i++)
        c += t[i] > now - BUDGET_SPAN_MS && t[i] <= now + 1000;
    return c;
}

static bool count_add(struct count *c, const char *name, int64_t at)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->name[i], name) == 0)
            return false; /* NX */
    snprintf(c->name[c->n], sizeof c->name[c->n], "%s", name);
    c->at[c->n++] = at;
    return true;
}

static int64_t record(struct host *h, int64_t now)
{
    int64_t t = budget_stamp(h->n > 0 ? h->ring[h->n - 1] : 0, now);
    h->ring[h->n++] = t;
    return t;
}

/* A read through Redis: granted under the budget, named by its host. */
static bool read_through(struct host *h, struct count *c, int64_t now)
{
    if (in_span(c->at, c->n, now) >= BUDGET)
        return false;
    char name[BUDGET_MEMBER_MAX];
    budget_member(name, sizeof name, h->hex, record(h, now));
    assert_true(count_add(c, name, now));
    return true;
}

/* A read while Redis is away: the host's own share of its own reads. */
static bool read_away(struct host *h, int64_t now)
{
    if (in_span(h->ring, h->n, now) >= budget_share(BUDGET, HOSTS, false))
        return false;
    record(h, now);
    return true;
}

/* A join: the host's reads of the span, as budget_seed picks them. */
static int seed(const struct host *h, struct count *c, int64_t now)
{
    int idx[MAXR], added = 0;
    int64_t ago[MAXR];
    int m = budget_seed(h->ring, h->n, now, idx, ago);
    for (int i = 0; i < m; i++) {
        char name[BUDGET_MEMBER_MAX];
        budget_member(name, sizeof name, h->hex, h->ring[idx[i]]);
        added += count_add(c, name, now - ago[i]);
    }
    return added;
}

static int total_in_span(const struct host *hs, int64_t now)
{
    int t = 0;
    for (int i = 0; i < HOSTS; i++)
        t += in_span(hs[i].ring, hs[i].n, now);
    return t;
}

static void test_a_fault_changes_who_counts_never_the_total(void **unused)
{
    (void)unused;
    static struct host hs[HOSTS] = {{.hex = "aaaaaaaaaaaaaaaa"}, {.hex = "bbbbbbbbbbbbbbbb"}};
    static struct count c;
    int64_t now = T0;
    /* a stall: both hosts away, each reads its share */
    int away = 0;
    for (int i = 0; i < 3 * BUDGET; i++, now += 5)
        away += read_away(&hs[i % HOSTS], now);
    assert_int_equal(away, BUDGET);
    /* back: every host sends its reads before anything is granted */
    for (int i = 0; i < HOSTS; i++)
        assert_int_equal(seed(&hs[i], &c, now), BUDGET / HOSTS);
    assert_int_equal(seed(&hs[0], &c, now), 0); /* again: nothing twice */
    int granted = 0;
    for (int i = 0; i < 3 * BUDGET; i++, now += 5)
        granted += read_through(&hs[i % HOSTS], &c, now);
    assert_int_equal(granted, 0);
    assert_true(total_in_span(hs, now) <= BUDGET);
    /* a minute on, the budget again, through Redis */
    now += BUDGET_SPAN_MS;
    for (int i = 0; i < 3 * BUDGET; i++, now += 5)
        granted += read_through(&hs[i % HOSTS], &c, now);
    assert_int_equal(granted, BUDGET);
    /* Redis restarted empty: the hosts' own records make it whole */
    memset(&c, 0, sizeof c);
    for (int i = 0; i < HOSTS; i++)
        seed(&hs[i], &c, now);
    assert_int_equal(in_span(c.at, c.n, now), BUDGET);
    for (int i = 0; i < 3 * BUDGET; i++, now += 5) {
        assert_false(read_through(&hs[i % HOSTS], &c, now));
        assert_true(total_in_span(hs, now) <= BUDGET);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_share),
        cmocka_unit_test(test_stamps_are_unique_and_never_early),
        cmocka_unit_test(test_members),
        cmocka_unit_test(test_seed_takes_the_span),
        cmocka_unit_test(test_count_lost_or_forgotten),
        cmocka_unit_test(test_a_fault_changes_who_counts_never_the_total),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
