/* test_coord.c - unit tests of src/coord.c: what Redis's answers leave in
 * this host's state, with simulated `now` values (no Redis: the answers
 * are made here as state_redis.c hands them over). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "coord.h"
#include "pace.h"
#include "state.h"
#include "state_redis_msg.h"

#define T0 10000000LL /* an arbitrary monotonic start, far from 0 */
#define BUDGET 120

struct fixture {
    struct state *st;
    struct shop shop;
    struct pace_schedule sched;
    struct coord_read cr;
};

/* A state, a shop, and this host's claim of `id` at T0 (asked of Redis). */
static void setup(struct fixture *f, const char *id)
{
    memset(f, 0, sizeof *f);
    struct state_opts o = {.tx_slots = 64, .read_timeout_ms = 5000};
    char err[256] = "";
    f->st = state_new(&o, err, sizeof err);
    if (f->st == NULL)
        print_error("state_new: %s\n", err);
    assert_non_null(f->st);
    pace_default(&f->sched);
    snprintf(f->shop.id, sizeof f->shop.id, "toko-a");
    state_key_id(f->st, "sk_test_coord", &f->shop.key);
    f->shop.read_budget = BUDGET;
    struct state_fact fact;
    assert_true(state_claim(f->st, &f->shop.key, id, &f->sched, BUDGET, 0, T0, &f->cr.ticket, &fact));
    f->cr.shop = &f->shop;
    f->cr.sched = &f->sched;
}

/* Another host's read of `id` ended (pending): its message, heard at now. */
static void hear_pending(struct fixture *f, const char *id, int64_t next_ms, int64_t now)
{
    struct state_redis_msg m = {.kind = STATE_REDIS_MSG_STATUS, .ms = next_ms};
    snprintf(m.id, sizeof m.id, "%s", id);
    snprintf(m.word, sizeof m.word, "pending");
    coord_mirror(f->st, &f->shop.key, id, &m, now);
}

static void lookup(struct fixture *f, const char *id, int64_t now, struct state_fact *out)
{
    state_lookup(f->st, &f->shop.key, id, &f->sched, BUDGET, now, out);
}

/* "busy" (another host reads it, its lease 6 s away) answered a claim
 * whose transaction's read this process heard end after the claim went
 * out: the answer is older than the message (they come on two
 * connections), so the read it saw is not waited for again: the next read
 * is the message's, not the lease's end. */
static void test_busy_older_than_a_heard_end_is_not_mirrored(void **unused)
{
    (void)unused;
    struct fixture f;
    setup(&f, "tx1");
    hear_pending(&f, "tx1", 1100, T0 + 2);
    struct state_redis_claim busy = {.v = STATE_REDIS_BUSY, .ms = 6000};
    assert_int_equal(coord_claimed(f.st, &f.cr, &busy, true, T0 + 3), COORD_AGAIN);
    struct state_fact fact;
    lookup(&f, "tx1", T0 + 3, &fact);
    assert_false(fact.in_flight);
    assert_int_equal(fact.status, TXS_PENDING);
    assert_int_equal(fact.next_read, T0 + 2 + 1100);
    state_free(f.st);
}

/* The same answer with nothing heard since the claim went out is Redis's
 * latest word: the read in flight elsewhere is waited for, until its lease. */
static void test_busy_with_nothing_heard_waits_for_the_lease(void **unused)
{
    (void)unused;
    struct fixture f;
    setup(&f, "tx2");
    struct state_redis_claim busy = {.v = STATE_REDIS_BUSY, .ms = 6000};
    assert_int_equal(coord_claimed(f.st, &f.cr, &busy, false, T0 + 3), COORD_AGAIN);
    struct state_fact fact;
    lookup(&f, "tx2", T0 + 3, &fact);
    assert_true(fact.in_flight);
    assert_int_equal(fact.in_flight_until, T0 + 3 + 6000);
    /* and its end, heard after that answer, ends the wait */
    hear_pending(&f, "tx2", 1100, T0 + 5);
    lookup(&f, "tx2", T0 + 5, &fact);
    assert_false(fact.in_flight);
    assert_int_equal(fact.next_read, T0 + 5 + 1100);
    state_free(f.st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_busy_older_than_a_heard_end_is_not_mirrored),
        cmocka_unit_test(test_busy_with_nothing_heard_waits_for_the_lease),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
