/* test_turnset.c - unit tests of src/turnset.c and of state_plan_open()
 * (src/state_budget.c): the transactions the budget's plan holds back wait
 * in their key's turn, looked at as one. A fake clock; nothing is timed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"
#include "turnset.h"

#define T0 10000000LL /* an arbitrary monotonic start, far from 0 */
#define TIMEOUT 5000
#define NTX 1000      /* withheld transactions of one key */
#define SALE_TX 40    /* buyers of the flash sale */
#define SALE_BUDGET 100
#define TICK 50       /* the fake clock's step in the flash sale */
#define READ_MS 300   /* how long a read takes there */

static struct state *new_state(void)
{
    struct state_opts o = {.tx_slots = 4096, .tx_per_key = 4096, .read_timeout_ms = TIMEOUT};
    char err[256] = "";
    struct state *st = state_new(&o, err, sizeof err);
    if (st == NULL)
        print_error("state_new: %s\n", err);
    assert_non_null(st);
    return st;
}

/* Turns by key: a key's members are its own, however many wait in
 * another's; they come out in the order they joined. */
static void test_turns_by_key_in_joining_order(void **unused)
{
    (void)unused;
    struct state *st = new_state();
    struct state_key k1, k2;
    state_key_id(st, "sk_test_one", &k1);
    state_key_id(st, "sk_test_two", &k2);
    struct turnset ts;
    turnset_init(&ts);
    struct turnset_node *many = calloc(NTX, sizeof *many), lone = {0};
    assert_non_null(many);
    bool made;
    struct turnset_turn *t1 = NULL;
    for (int i = 0; i < NTX; i++) {
        struct turnset_turn *t = turnset_join(&ts, &many[i], &k1, &made);
        assert_non_null(t);
        assert_int_equal(made, i == 0);
        if (i == 0)
            t1 = t;
        assert_ptr_equal(t, t1);
    }
    struct turnset_turn *t2 = turnset_join(&ts, &lone, &k2, &made);
    assert_true(made);
    assert_ptr_equal(turnset_find(&ts, &k1), t1);
    assert_ptr_equal(turnset_find(&ts, &k2), t2);
    assert_int_equal(t1->n, NTX);

    /* joining order; one leaving from the middle; taking */
    assert_ptr_equal(turnset_leave(&many[1]), t1);
    assert_null(turnset_leave(&many[1])); /* in none now */
    assert_ptr_equal(turnset_take(t1), &many[0]);
    assert_ptr_equal(turnset_take(t1), &many[2]);
    assert_ptr_equal(turnset_join(&ts, &many[0], &k1, &made), t1); /* back, last */
    assert_false(made);
    assert_int_equal(t1->n, NTX - 2);
    for (int i = 3; i < NTX; i++)
        assert_ptr_equal(turnset_take(t1), &many[i]);
    assert_ptr_equal(turnset_take(t1), &many[0]);
    assert_null(turnset_take(t1));
    assert_int_equal(t1->n, 0);
    turnset_drop(&ts, t1);
    assert_null(turnset_find(&ts, &k1));
    assert_ptr_equal(turnset_first(&ts), t2);
    assert_int_equal(t2->n, 1); /* k2's one member never moved with k1's */
    turnset_drop(&ts, t2); /* with its member: it leaves */
    assert_null(lone.turn);
    assert_null(turnset_first(&ts));
    free(many);
    state_free(st);
}

/* A flash sale on one key (more buyers than the budget pays for), run
 * with a fake clock: whenever the plan lets a transaction it held back
 * read (before that one's own reservation), the key says so
 * (state_plan_open); every transaction the plan holds back says so
 * (fact.withheld) and its own part is its reservation, still to come. So
 * a process may look at the key alone while it is shut, however many
 * wait, and at its members only when it is open, and miss nobody's read. */
static void test_the_key_is_open_whenever_anybody_may_read(void **unused)
{
    (void)unused;
    struct state *st = new_state();
    struct state_key k;
    state_key_id(st, "sk_test_sale", &k);
    struct pace_schedule s;
    pace_default(&s);
    char ids[SALE_TX][16];
    int64_t deadline[SALE_TX];
    struct state_ticket tk[SALE_TX];
    int64_t ends[SALE_TX];
    int64_t own[SALE_TX];  /* withheld at the last look: its own time; 0: not withheld */
    struct outcome pending;
    memset(&pending, 0, sizeof pending);
    pending.kind = OUT_STATUS;
    pending.retry_after_ms = -1;
    pending.status = TXS_PENDING;
    snprintf(pending.status_word, sizeof pending.status_word, "pending");
    for (int i = 0; i < SALE_TX; i++) {
        snprintf(ids[i], sizeof ids[i], "sale-%d", i);
        ends[i] = own[i] = 0;
    }
    int reads = 0, shut = 0, withheld = 0, open_nobody = 0, let = 0;
    for (int64_t now = T0; now < T0 + 60000; now += TICK) {
        /* a buyer every 500 ms for the first 20 s */
        for (int i = 0; i < SALE_TX; i++)
            if (now == T0 + i * 500) {
                uint64_t stamp;
                deadline[i] = now + pace_hold_ms(&s);
                assert_true(state_hold(st, &k, ids[i], &s, SALE_BUDGET, deadline[i], now, &stamp));
            }
        for (int i = 0; i < SALE_TX; i++)
            if (ends[i] != 0 && ends[i] <= now) {
                struct state_report rep;
                state_finish(st, &tk[i], "shop", &pending, now, &rep);
                ends[i] = 0;
            }
        int64_t retry;
        bool open = state_plan_open(st, &k, &s, SALE_BUDGET, now, &retry);
        assert_true(retry > now);
        shut += !open;
        bool any = false;
        for (int i = 0; i < SALE_TX; i++) {
            if (now < T0 + i * 500 || now >= deadline[i] || ends[i] != 0)
                continue;
            struct state_fact f;
            state_lookup_held(st, &k, ids[i], &s, SALE_BUDGET, now, &f); /* as hold_step() looks */
            if (f.withheld) {
                withheld++;
                assert_int_equal(f.wait, WAIT_BUDGET);
                assert_true(f.next_read > now);
                assert_true(f.withheld_own > now);
                own[i] = f.withheld_own;
                continue;
            }
            bool was = own[i] != 0 && now < own[i]; /* in its key's turn, its own time not come */
            own[i] = 0;
            if (f.in_flight || f.next_read > now)
                continue;
            /* the plan lets one it held back read: the key must have said so */
            if (was) {
                assert_true(open);
                let++;
            }
            any = true;
            struct state_fact cf;
            if (state_claim(st, &k, ids[i], &s, SALE_BUDGET, TIMEOUT, now, &tk[i], &cf)) {
                ends[i] = now + READ_MS;
                reads++;
                open = state_plan_open(st, &k, &s, SALE_BUDGET, now, &retry); /* its read counts now */
            }
        }
        open_nobody += open && !any;
    }
    /* the sale did what it is for: the key was shut a good part of the
     * time, transactions were held back, and reads were still made */
    assert_true(shut > 50);
    assert_true(withheld > 500);
    assert_true(reads >= SALE_BUDGET);
    assert_true(let > 10);
    print_message("reads %d (%d of them let through after being held back), ticks shut %d, withheld looks %d, "
                  "open with nobody ready %d\n", reads, let, shut, withheld, open_nobody);
    state_free(st);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_turns_by_key_in_joining_order),
        cmocka_unit_test(test_the_key_is_open_whenever_anybody_may_read),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
