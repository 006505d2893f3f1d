/* test_watchset.c - unit tests of src/watchset.c against the state's
 * change log (src/state_change.c): what a read's end, a told status, a
 * pause or a lost log wakes among many held transactions. A fake clock;
 * nothing is timed. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "state.h"
#include "watchset.h"

#define T0 10000000LL /* an arbitrary monotonic start, far from 0 */
#define TIMEOUT 5000
#define BUDGET 120
#define NTX 1000      /* held transactions besides the four named ones */

struct fixture {
    struct state *st;
    struct state_key k1, k2;
    struct watchset ws;
    struct watchset_node a, b, c, d;   /* k1 tx-a, k1 tx-b, k2 tx-c, k2 tx-a */
    struct watchset_node many[NTX];    /* k1 or k2, wide-0 ... */
    uint64_t cursor;                   /* this process's place in the log */
};

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f); /* large: not on the stack */
    assert_non_null(f);
    struct state_opts o = {.tx_slots = 4096, .tx_per_key = 4096, .read_timeout_ms = TIMEOUT};
    char err[256] = "";
    f->st = state_new(&o, err, sizeof err);
    if (f->st == NULL)
        print_error("state_new: %s\n", err);
    assert_non_null(f->st);
    state_key_id(f->st, "sk_test_one", &f->k1);
    state_key_id(f->st, "sk_test_two", &f->k2);
    watchset_init(&f->ws);
    watchset_add(&f->ws, &f->a, &f->k1, "tx-a");
    watchset_add(&f->ws, &f->b, &f->k1, "tx-b");
    watchset_add(&f->ws, &f->c, &f->k2, "tx-c");
    watchset_add(&f->ws, &f->d, &f->k2, "tx-a");
    for (int i = 0; i < NTX; i++) {
        char id[32];
        snprintf(id, sizeof id, "wide-%d", i);
        watchset_add(&f->ws, &f->many[i], i % 2 ? &f->k2 : &f->k1, id);
    }
    f->cursor = state_changes_head(f->st);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    state_free(f->st);
    free(f);
    return 0;
}

static struct outcome oc_kind(enum outcome_kind k)
{
    struct outcome o;
    memset(&o, 0, sizeof o);
    o.kind = k;
    o.retry_after_ms = -1;
    return o;
}

static struct outcome oc_pending(void)
{
    struct outcome o = oc_kind(OUT_STATUS);
    o.status = TXS_PENDING;
    snprintf(o.status_word, sizeof o.status_word, "pending");
    return o;
}

/* Claim a read of (k, id) at `now`, then end it with `oc` at now + 300. */
static void read_ends(struct fixture *f, const struct state_key *k, const char *id, const struct outcome *oc,
                      int64_t now)
{
    struct pace_schedule s;
    pace_default(&s);
    struct state_ticket t;
    struct state_fact fact;
    struct state_report rep;
    assert_true(state_claim(f->st, k, id, &s, BUDGET, TIMEOUT, now, &t, &fact));
    state_finish(f->st, &t, "shop", oc, now + 300, &rep);
}

/* Read the log from the fixture's cursor, as a woken process does, and
 * mark what it concerns; returns how many nodes are marked. */
static size_t wake(struct fixture *f, int64_t now, bool *lost)
{
    struct state_change ch[16];
    size_t n, marked = 0;
    bool l = false;
    do {
        n = state_changes(f->st, &f->cursor, ch, 16, now, &l);
        for (size_t i = 0; i < n; i++)
            marked += watchset_mark_change(&f->ws, &ch[i]);
    } while (n == 16);
    if (l)
        watchset_mark_all(&f->ws);
    if (lost != NULL)
        *lost = l;
    return marked;
}

/* Pop every marked node: how many, and whether `want` was among them. */
static size_t popped(struct fixture *f, const struct watchset_node *want, bool *found)
{
    size_t n = 0;
    struct watchset_node *x;
    *found = false;
    while ((x = watchset_pop(&f->ws)) != NULL) {
        n++;
        if (x == want)
            *found = true;
    }
    return n;
}

static void test_a_read_end_wakes_its_transaction_only(void **state)
{
    struct fixture *f = *state;
    struct outcome oc = oc_pending();
    read_ends(f, &f->k1, "tx-a", &oc, T0);
    bool lost, found;
    assert_int_equal(wake(f, T0 + 301, &lost), 1);
    assert_false(lost);
    /* tx-a of k1: not tx-b of the same key, not tx-a of the other key,
     * none of the thousand others */
    assert_int_equal(popped(f, &f->a, &found), 1);
    assert_true(found);
    /* read once: nothing more */
    assert_int_equal(wake(f, T0 + 302, NULL), 0);
    assert_null(watchset_pop(&f->ws));
}

static void test_many_read_ends_wake_each_its_own(void **state)
{
    struct fixture *f = *state;
    struct outcome oc = oc_pending();
    for (int i = 0; i < 10; i++) {
        char id[32];
        snprintf(id, sizeof id, "wide-%d", i * 7);
        read_ends(f, (i * 7) % 2 ? &f->k2 : &f->k1, id, &oc, T0 + i);
    }
    /* caught up in one pass: ten changes, ten watches */
    bool lost;
    assert_int_equal(wake(f, T0 + 400, &lost), 10);
    assert_false(lost);
    size_t n = 0;
    struct watchset_node *x;
    while ((x = watchset_pop(&f->ws)) != NULL) {
        n++;
        assert_true(x >= &f->many[0] && x < &f->many[NTX]);
        assert_int_equal((x - &f->many[0]) % 7, 0);
    }
    assert_int_equal(n, 10);
}

static void test_a_told_status_wakes_its_transaction_only(void **state)
{
    struct fixture *f = *state;
    assert_int_equal(state_tell(f->st, &f->k2, "tx-c", TXS_SUCCEEDED, "succeeded", T0), STATE_TOLD_RECORDED);
    bool found;
    assert_int_equal(wake(f, T0 + 1, NULL), 1);
    assert_int_equal(popped(f, &f->c, &found), 1);
    assert_true(found);
}

static void test_a_key_pause_wakes_its_key(void **state)
{
    struct fixture *f = *state;
    struct outcome oc = oc_kind(OUT_KEY_LIMITED); /* a 429 without Retry-After: the key pauses */
    read_ends(f, &f->k2, "tx-c", &oc, T0);
    wake(f, T0 + 301, NULL);
    size_t n = 0;
    struct watchset_node *x;
    while ((x = watchset_pop(&f->ws)) != NULL) {
        n++;
        assert_memory_equal(x->key.b, f->k2.b, sizeof f->k2.b);
    }
    assert_int_equal(n, 2 + NTX / 2); /* tx-c, tx-a of k2, and half the others */
}

static void test_the_host_pause_wakes_everybody(void **state)
{
    struct fixture *f = *state;
    struct outcome oc = oc_kind(OUT_AUTH_BLOCKED);
    read_ends(f, &f->k1, "tx-b", &oc, T0);
    wake(f, T0 + 301, NULL);
    bool found;
    assert_int_equal(popped(f, &f->d, &found), 4 + NTX);
    assert_true(found);
}

static void test_a_log_read_too_late_wakes_everybody(void **state)
{
    struct fixture *f = *state;
    for (int i = 0; i <= STATE_CHANGES; i++)
        assert_int_equal(state_tell(f->st, &f->k1, "tx-z", TXS_SUCCEEDED, "succeeded", T0 + i),
                         STATE_TOLD_RECORDED);
    bool lost, found;
    wake(f, T0 + STATE_CHANGES + 1, &lost);
    assert_true(lost);
    assert_int_equal(popped(f, &f->b, &found), 4 + NTX);
    assert_true(found);
    /* and the cursor is at the newest change: nothing more is lost */
    assert_int_equal(wake(f, T0 + STATE_CHANGES + 2, &lost), 0);
    assert_false(lost);
}

static void test_a_claim_given_back_wakes_its_transaction_and_key(void **state)
{
    struct fixture *f = *state;
    struct pace_schedule s;
    pace_default(&s);
    struct state_ticket t;
    struct state_fact fact;
    assert_true(state_claim(f->st, &f->k1, "tx-b", &s, BUDGET, TIMEOUT, T0, &t, &fact));
    assert_int_equal(wake(f, T0 + 1, NULL), 0); /* a claim wakes nobody */
    state_unclaim(f->st, &t, T0 + 2);
    wake(f, T0 + 3, NULL);
    size_t n = 0;
    struct watchset_node *x;
    while ((x = watchset_pop(&f->ws)) != NULL) {
        n++;
        assert_memory_equal(x->key.b, f->k1.b, sizeof f->k1.b); /* the budget is the key's */
    }
    assert_int_equal(n, 2 + NTX / 2);
}

static void test_removed_nodes_are_never_popped(void **state)
{
    struct fixture *f = *state;
    watchset_mark_all(&f->ws);
    watchset_remove(&f->ws, &f->a);
    watchset_remove(&f->ws, &f->many[3]);
    assert_null(watchset_find(&f->ws, &f->k1, "tx-a"));
    assert_ptr_equal(watchset_find(&f->ws, &f->k2, "tx-a"), &f->d);
    assert_ptr_equal(watchset_id_first(&f->ws, "tx-a"), &f->d);
    assert_null(watchset_id_next(&f->d, "tx-a"));
    size_t n = 0;
    struct watchset_node *x;
    while ((x = watchset_pop(&f->ws)) != NULL) {
        n++;
        assert_true(x != &f->a && x != &f->many[3]);
        if (x == &f->b) /* removing a marked node while popping */
            watchset_remove(&f->ws, &f->c);
    }
    assert_true(n == 4 + NTX - 2 || n == 4 + NTX - 3); /* c went before or after it was popped */
    assert_int_equal(watchset_size(&f->ws), 4 + NTX - 3);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_a_read_end_wakes_its_transaction_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_read_ends_wake_each_its_own, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_told_status_wakes_its_transaction_only, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_key_pause_wakes_its_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_the_host_pause_wakes_everybody, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_log_read_too_late_wakes_everybody, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_claim_given_back_wakes_its_transaction_and_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_removed_nodes_are_never_popped, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
