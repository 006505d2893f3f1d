/* test_loop.c - the event loop: timer order, timers stopped and moved, an
 * io removed by another's callback in the same turn (the urgent pass
 * included) is never called, and bulk ones run after the others, a slice a
 * turn. Real descriptors (pipes), no sleeping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <cmocka.h>

#include "loop.h"
#include "util.h"

struct rec {
    int order[16];
    int n;
};

static void on_timer(struct loop *l, struct loop_timer *t)
{
    (void)l;
    struct rec *r = t->data;
    r->order[r->n++] = (int)t->at;
}

static void test_timers_in_order(void **unused)
{
    (void)unused;
    char err[64];
    struct loop *l = loop_new(err, sizeof err);
    assert_non_null(l);
    struct rec r = {.n = 0};
    struct loop_timer t[5];
    int64_t now = loop_now(l);
    int64_t at[5] = {now - 3, now - 5, now - 1, now - 4, now - 2};
    for (int i = 0; i < 5; i++) {
        loop_timer_init(&t[i], on_timer, &r);
        assert_int_equal(loop_timer_at(l, &t[i], at[i]), 0);
    }
    loop_timer_stop(l, &t[3]);                 /* now - 4 never runs */
    assert_int_equal(loop_timer_at(l, &t[0], now - 6), 0); /* moved first */
    assert_int_equal(loop_turn(l, 0), 0);
    assert_int_equal(r.n, 4);
    for (int i = 1; i < r.n; i++)
        assert_true(r.order[i - 1] < r.order[i]);
    assert_int_equal(r.order[0], (int)(now - 6));
    for (int i = 0; i < 5; i++)
        assert_false(loop_timer_armed(&t[i]));
    loop_free(l);
}

static void rearm(struct loop *l, struct loop_timer *t)
{
    struct rec *r = t->data;
    r->n++;
    loop_timer_at(l, t, loop_now(l)); /* again, at once */
}

static void test_timer_rearmed_for_now_does_not_spin(void **unused)
{
    (void)unused;
    char err[64];
    struct loop *l = loop_new(err, sizeof err);
    struct rec r = {.n = 0};
    struct loop_timer t;
    loop_timer_init(&t, rearm, &r);
    loop_timer_at(l, &t, loop_now(l));
    assert_int_equal(loop_turn(l, 0), 0); /* returns: at most once per timer per turn */
    assert_int_equal(r.n, 1);
    assert_int_equal(loop_turn(l, 0), 0);
    assert_int_equal(r.n, 2);
    loop_timer_stop(l, &t);
    loop_free(l);
}

struct pair {
    struct loop_io a, b; /* b's callback removes a */
    int a_calls, b_calls;
};

static void on_a(struct loop *l, struct loop_io *io, uint32_t ev)
{
    (void)l, (void)ev;
    ((struct pair *)io->data)->a_calls++;
}

static void on_b(struct loop *l, struct loop_io *io, uint32_t ev)
{
    (void)ev;
    struct pair *p = io->data;
    p->b_calls++;
    loop_io_set(l, &p->a, 0); /* a connection closing its sibling: a may be freed now */
    p->a.fn = NULL;           /* calling it now would crash */
}

static void run_pair(bool b_first, bool a_bulk)
{
    char err[64];
    struct loop *l = loop_new(err, sizeof err);
    int pa[2], pb[2];
    assert_int_equal(pipe(pa), 0);
    assert_int_equal(pipe(pb), 0);
    struct pair p = {.a_calls = 0, .b_calls = 0};
    loop_io_init(&p.a, pa[0], on_a, &p);
    loop_io_init(&p.b, pb[0], on_b, &p);
    p.b.first = b_first;
    p.a.bulk = a_bulk; /* b, not bulk, runs before it whatever the order */
    assert_int_equal(loop_io_set(l, &p.a, EPOLLIN), 0);
    assert_int_equal(loop_io_set(l, &p.b, EPOLLIN), 0);
    /* both ready in one turn; in readiness order, a after b (b removes a
     * before a's turn comes) or, for the urgent b or the bulk a, a first
     * (the urgent pass runs b ahead of a, and a bulk a waits for the
     * others: it is still to run) */
    if (b_first || a_bulk) {
        assert_int_equal(write(pa[1], "x", 1), 1);
        assert_int_equal(write(pb[1], "x", 1), 1);
    } else {
        assert_int_equal(write(pb[1], "x", 1), 1);
        assert_int_equal(write(pa[1], "x", 1), 1);
    }
    assert_int_equal(loop_turn(l, 1000), 0);
    assert_int_equal(p.b_calls, 1);
    assert_int_equal(p.a_calls, 0);
    loop_io_set(l, &p.b, 0);
    close(pa[0]), close(pa[1]), close(pb[0]), close(pb[1]);
    loop_free(l);
}

static void test_io_removed_in_the_same_turn_is_not_called(void **unused)
{
    (void)unused;
    run_pair(false, false);
}

static void test_io_removed_by_an_urgent_one_is_not_called(void **unused)
{
    (void)unused;
    run_pair(true, false); /* a signal handled first frees a connection earlier in the batch */
}

static void test_bulk_io_removed_before_its_turn_is_not_called(void **unused)
{
    (void)unused;
    run_pair(false, true); /* an API socket closed by a request's callback */
}

struct bulk {
    struct loop_io io[5]; /* 0: an ordinary one; 1-4: bulk */
    int fds[5][2];
    int order[16], n;
};

static void on_bulk_io(struct loop *l, struct loop_io *io, uint32_t ev)
{
    (void)l, (void)ev;
    struct bulk *b = io->data;
    char c;
    assert_int_equal(read(io->fd, &c, 1), 1);
    b->order[b->n++] = (int)(io - b->io);
    if (io->bulk) /* a read's end that answers many: it outlasts the slice (the clock's own ms) */
        for (int64_t t0 = util_mono_ms(); util_mono_ms() < t0 + 2;)
            ;
}

static void test_bulk_ones_run_last_a_slice_a_turn(void **unused)
{
    (void)unused;
    char err[64];
    struct loop *l = loop_new(err, sizeof err);
    struct bulk b = {.n = 0};
    for (int i = 4; i >= 0; i--) { /* every one ready; the ordinary one last */
        assert_int_equal(pipe(b.fds[i]), 0);
        loop_io_init(&b.io[i], b.fds[i][0], on_bulk_io, &b);
        b.io[i].bulk = i > 0;
        assert_int_equal(loop_io_set(l, &b.io[i], EPOLLIN), 0);
        assert_int_equal(write(b.fds[i][1], "x", 1), 1);
    }
    /* the ordinary one first, then one bulk (it spent the slice); those not
     * run are still ready and come, one a turn, without waiting */
    assert_int_equal(loop_turn(l, 0), 0);
    assert_int_equal(b.n, 2);
    assert_int_equal(b.order[0], 0);
    for (int turn = 0; turn < 3; turn++) {
        assert_int_equal(loop_turn(l, 0), 0);
        assert_int_equal(b.n, 3 + turn);
    }
    int seen = 0;
    for (int i = 1; i < b.n; i++)
        seen |= 1 << b.order[i];
    assert_int_equal(seen, 0x1e); /* each bulk one once */
    for (int i = 0; i < 5; i++) {
        loop_io_set(l, &b.io[i], 0);
        close(b.fds[i][0]), close(b.fds[i][1]);
    }
    loop_free(l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timers_in_order),
        cmocka_unit_test(test_timer_rearmed_for_now_does_not_spin),
        cmocka_unit_test(test_io_removed_in_the_same_turn_is_not_called),
        cmocka_unit_test(test_io_removed_by_an_urgent_one_is_not_called),
        cmocka_unit_test(test_bulk_ones_run_last_a_slice_a_turn),
        cmocka_unit_test(test_bulk_io_removed_before_its_turn_is_not_called),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
