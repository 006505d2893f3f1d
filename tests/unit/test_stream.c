/* test_stream.c - the streamed page's decisions, with a fake clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "stream.h"

static void test_wanted(void **unused)
{
    (void)unused;
    assert_true(stream_wanted(false, false, "document", true, true));
    assert_false(stream_wanted(false, false, NULL, true, true));        /* curl, scripts, monitors */
    assert_false(stream_wanted(false, false, "empty", true, true));     /* fetch() from a storefront */
    assert_false(stream_wanted(false, false, "iframe", true, true));
    assert_false(stream_wanted(false, false, "Document", true, true));
    assert_false(stream_wanted(true, false, "document", true, true));   /* JSON */
    assert_false(stream_wanted(false, true, "document", true, true));   /* HEAD */
    assert_false(stream_wanted(false, false, "document", false, true)); /* progressive: false */
    assert_false(stream_wanted(false, false, "document", true, false)); /* templates without the parts */
}

static void test_undecided(void **unused)
{
    (void)unused;
    struct state_fact none = {.status = TXS_NONE};
    assert_false(stream_undecided(&none, true));
    struct state_fact pending = {.status = TXS_PENDING};
    assert_true(stream_undecided(&pending, false));
    assert_true(stream_undecided(&pending, true));
    struct state_fact odd = {.status = TXS_UNKNOWN};
    assert_true(stream_undecided(&odd, false));
    struct state_fact flying = {.status = TXS_NONE, .in_flight = true};
    assert_true(stream_undecided(&flying, true));   /* another request's read: under way when it came */
    assert_false(stream_undecided(&flying, false)); /* its own first read: not known yet */
    struct state_fact fin = {.status = TXS_SUCCEEDED, .final = true, .in_flight = true};
    assert_false(stream_undecided(&fin, true));
    struct state_fact gone = {.status = TXS_PENDING, .not_found = true};
    assert_false(stream_undecided(&gone, true));
}

static void test_paint_at_once_when_undecided(void **unused)
{
    (void)unused;
    struct stream_clock c = {.arrived = 5000};
    int64_t wake = 0;
    assert_int_equal(stream_step(&c, true, 1000, 5000, &wake), STREAM_PAINT);
    assert_int_equal(wake, 5000 + STREAM_COMMENT_MS);
    /* found undecided later (the first read came back pending at 5300) */
    assert_int_equal(stream_step(&c, false, 1000, 5000, &wake), STREAM_WAIT);
    assert_int_equal(wake, 6000);
    assert_int_equal(stream_step(&c, true, 1000, 5300, &wake), STREAM_PAINT);
}

static void test_paint_at_first_paint_ms(void **unused)
{
    (void)unused;
    struct stream_clock c = {.arrived = 100};
    int64_t wake = 0;
    assert_int_equal(stream_step(&c, false, 1000, 100, &wake), STREAM_WAIT);
    assert_int_equal(wake, 1100);
    assert_int_equal(stream_step(&c, false, 1000, 1099, &wake), STREAM_WAIT);
    assert_int_equal(wake, 1100);
    assert_int_equal(stream_step(&c, false, 1000, 1100, &wake), STREAM_PAINT);
    /* a late timer paints too */
    assert_int_equal(stream_step(&c, false, 1000, 9000, &wake), STREAM_PAINT);
    /* first_paint_ms 0: at once */
    assert_int_equal(stream_step(&c, false, 0, 100, &wake), STREAM_PAINT);
}

static void test_comments(void **unused)
{
    (void)unused;
    struct stream_clock c = {.arrived = 0, .painted = 700, .last_sent = 700};
    int64_t wake = 0;
    assert_int_equal(stream_step(&c, true, 1000, 700, &wake), STREAM_WAIT); /* painted: never again */
    assert_int_equal(wake, 700 + STREAM_COMMENT_MS);
    assert_int_equal(stream_step(&c, false, 1000, 700 + STREAM_COMMENT_MS - 1, &wake), STREAM_WAIT);
    assert_int_equal(stream_step(&c, false, 1000, 700 + STREAM_COMMENT_MS, &wake), STREAM_COMMENT);
    assert_int_equal(wake, 700 + 2 * STREAM_COMMENT_MS);
    c.last_sent = 700 + STREAM_COMMENT_MS;
    assert_int_equal(stream_step(&c, false, 1000, 700 + STREAM_COMMENT_MS + 5, &wake), STREAM_WAIT);
    assert_int_equal(wake, 700 + 2 * STREAM_COMMENT_MS);
}

/* Where the timer is armed when a request is held: first_paint_ms 0
 * means at once, even when the first read has said nothing yet (it
 * was armed for the comment, 20 s on). */
static void test_due_from_arrival(void **unused)
{
    (void)unused;
    struct stream_clock c = {.arrived = 100};
    assert_int_equal(stream_due(&c, false, 0), 100);
    assert_int_equal(stream_due(&c, true, 0), 100);
    assert_int_equal(stream_due(&c, false, 1000), 1100);
    assert_int_equal(stream_due(&c, true, 1000), 100);
    int64_t wake;
    assert_int_equal(stream_step(&c, false, 0, stream_due(&c, false, 0), &wake), STREAM_PAINT);
    c.painted = c.last_sent = 150;
    assert_int_equal(stream_due(&c, false, 0), 150 + STREAM_COMMENT_MS);
    assert_int_equal(stream_due(&c, true, 1000), 150 + STREAM_COMMENT_MS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wanted),
        cmocka_unit_test(test_undecided),
        cmocka_unit_test(test_paint_at_once_when_undecided),
        cmocka_unit_test(test_paint_at_first_paint_ms),
        cmocka_unit_test(test_comments),
        cmocka_unit_test(test_due_from_arrival),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
