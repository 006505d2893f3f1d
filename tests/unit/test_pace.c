/* test_pace.c - unit tests of src/pace.c: the read schedule as arithmetic. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "pace.h"

#define T0 1000000LL /* an arbitrary monotonic start */

static void test_default_schedule(void **unused)
{
    (void)unused;
    struct pace_schedule s;
    memset(&s, 0xff, sizeof s);
    pace_default(&s);
    static const int64_t want[] = {0, 1500, 2000, 3000, 5000, 8000, 13000};
    assert_int_equal(s.n, 7);
    for (int i = 0; i < 7; i++)
        assert_int_equal(s.wait_ms[i], want[i]);
    assert_int_equal(pace_sum(&s), 32500);
    assert_int_equal(pace_hold_ms(&s), 34000);
    char err[256] = "";
    assert_true(pace_valid(&s, err, sizeof err));
}

/* Each read starts as soon as the schedule allows. */
static void test_reads_as_soon_as_allowed(void **unused)
{
    (void)unused;
    struct pace_schedule s;
    pace_default(&s);
    static const int64_t want[] = {0,     1500,  3500,  6500,  11500, 19500, 32500,
                                   45500, 58500, 71500, 84500, 97500, 110500};
    int reads = 0;
    int64_t last = 0, now = T0;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        int64_t next = pace_next_read(&s, reads, last, now);
        assert_int_equal(next - T0, want[i]);
        if (reads > 0) {
            /* one ms earlier is not allowed: the answer does not depend on now */
            assert_int_equal(pace_next_read(&s, reads, last, next - 1), next);
            assert_int_equal(pace_next_read(&s, reads, last, last), next);
        }
        reads++;
        last = next;
        now = next;
    }
}

static void test_first_read_is_now(void **unused)
{
    (void)unused;
    struct pace_schedule s;
    pace_default(&s);
    assert_int_equal(pace_next_read(&s, 0, 0, T0), T0);
    assert_int_equal(pace_next_read(&s, 0, T0 - 10, T0), T0);
    assert_int_equal(pace_next_read(&s, 0, 12345, 7), 7);
}

static void test_episode_end(void **unused)
{
    (void)unused;
    struct pace_schedule s;
    pace_default(&s);
    assert_false(pace_in_episode(0, T0, T0));
    assert_true(pace_in_episode(1, T0, T0));
    assert_true(pace_in_episode(1, T0, T0 + PACE_EPISODE_MS));
    assert_false(pace_in_episode(1, T0, T0 + PACE_EPISODE_MS + 1));
    assert_true(pace_in_episode(7, T0, T0 + 59999));

    /* within the episode: the pace */
    assert_int_equal(pace_next_read(&s, 7, T0, T0 + 60000), T0 + 13000);
    assert_int_equal(pace_next_read(&s, 2, T0, T0 + 60000), T0 + 2000);
    /* after it: a new episode, a read may start now */
    assert_int_equal(pace_next_read(&s, 7, T0, T0 + 60001), T0 + 60001);
    assert_int_equal(pace_next_read(&s, 1, T0, T0 + 90000), T0 + 90000);
}

static void test_restart_after_episode(void **unused)
{
    (void)unused;
    struct pace_schedule s;
    pace_default(&s);
    /* a full episode, then a long silence, then the schedule starts over */
    int reads = 7;
    int64_t last = T0 + 32500;
    int64_t now = last + 61000;
    int64_t next = pace_next_read(&s, reads, last, now);
    assert_int_equal(next, now);
    reads = 1; /* what the caller does on a new episode */
    last = next;
    assert_int_equal(pace_next_read(&s, reads, last, last), last + 1500);
}

static void test_one_step_schedules(void **unused)
{
    (void)unused;
    struct pace_schedule s = {.n = 1, .wait_ms = {0}};
    char err[256];
    assert_true(pace_valid(&s, err, sizeof err));
    /* a one-step schedule repeats its first wait, never below the minimum */
    assert_int_equal(pace_next_read(&s, 1, T0, T0), T0 + PACE_MIN_WAIT_MS);
    assert_int_equal(pace_next_read(&s, 5, T0, T0), T0 + PACE_MIN_WAIT_MS);
    s.wait_ms[0] = 5000;
    assert_int_equal(pace_next_read(&s, 1, T0, T0), T0 + 5000);
    assert_int_equal(pace_sum(&s), 5000);
    assert_int_equal(pace_hold_ms(&s), 5000 + PACE_GRACE_MS);
}

static void test_short_schedule(void **unused)
{
    (void)unused;
    struct pace_schedule s = {.n = 3, .wait_ms = {0, 1100, 1200}};
    char err[256];
    assert_true(pace_valid(&s, err, sizeof err));
    assert_int_equal(pace_sum(&s), 2300);
    assert_int_equal(pace_hold_ms(&s), 3800);
    assert_int_equal(pace_next_read(&s, 1, T0, T0), T0 + 1100);
    assert_int_equal(pace_next_read(&s, 2, T0, T0), T0 + 1200);
    assert_int_equal(pace_next_read(&s, 3, T0, T0), T0 + 1200);
    assert_int_equal(pace_next_read(&s, 15, T0, T0), T0 + 1200);
}

/* No schedule pace_valid accepts lets two reads start < 1100 ms apart. */
static void test_valid_schedules_keep_min_gap(void **unused)
{
    (void)unused;
    uint32_t rng = 12345;
    for (int round = 0; round < 500; round++) {
        struct pace_schedule s;
        rng = rng * 1103515245u + 12345u;
        s.n = 1 + (int)(rng >> 16) % PACE_MAX_STEPS;
        for (int i = 0; i < s.n; i++) {
            rng = rng * 1103515245u + 12345u;
            s.wait_ms[i] = (int64_t)((rng >> 8) % 31001);
        }
        char err[256];
        if (!pace_valid(&s, err, sizeof err))
            continue;
        int64_t last = T0;
        for (int reads = 1; reads < 40; reads++) {
            int64_t next = pace_next_read(&s, reads, last, last);
            assert_true(next - last >= PACE_MIN_WAIT_MS);
            last = next;
        }
    }
}

static void test_valid_rejects(void **unused)
{
    (void)unused;
    char err[256];
    struct pace_schedule s;

    pace_default(&s);
    s.wait_ms[1] = 1000;
    err[0] = '\0';
    assert_false(pace_valid(&s, err, sizeof err));
    assert_non_null(strstr(err, "1100"));

    pace_default(&s);
    s.wait_ms[6] = 1099;
    assert_false(pace_valid(&s, err, sizeof err));

    pace_default(&s);
    s.wait_ms[3] = 0;
    assert_false(pace_valid(&s, err, sizeof err));

    pace_default(&s);
    s.wait_ms[2] = -1500;
    assert_false(pace_valid(&s, err, sizeof err));

    pace_default(&s);
    s.wait_ms[6] = 30001;
    err[0] = '\0';
    assert_false(pace_valid(&s, err, sizeof err));
    assert_true(strlen(err) > 0);

    pace_default(&s);
    s.wait_ms[0] = -1;
    assert_false(pace_valid(&s, err, sizeof err));
    s.wait_ms[0] = 30001;
    assert_false(pace_valid(&s, err, sizeof err));

    s.n = 0; /* empty */
    err[0] = '\0';
    assert_false(pace_valid(&s, err, sizeof err));
    assert_true(strlen(err) > 0);

    s.n = -1;
    assert_false(pace_valid(&s, err, sizeof err));

    s.n = PACE_MAX_STEPS + 1; /* too many */
    assert_false(pace_valid(&s, err, sizeof err));
}

static void test_valid_accepts(void **unused)
{
    (void)unused;
    char err[256];
    struct pace_schedule s = {.n = 2, .wait_ms = {0, 1100}};
    assert_true(pace_valid(&s, err, sizeof err));
    s.wait_ms[1] = 30000;
    assert_true(pace_valid(&s, err, sizeof err));
    s.wait_ms[0] = 30000;
    assert_true(pace_valid(&s, err, sizeof err));
    s.n = PACE_MAX_STEPS;
    for (int i = 1; i < s.n; i++)
        s.wait_ms[i] = 1100;
    assert_true(pace_valid(&s, err, sizeof err));
    /* a tiny error buffer is fine */
    s.wait_ms[3] = 5;
    char tiny[4];
    assert_false(pace_valid(&s, tiny, sizeof tiny));
    assert_true(strlen(tiny) < sizeof tiny);
}

static void test_reads_within(void **unused)
{
    (void)unused;
    struct pace_schedule s;
    pace_default(&s);
    assert_int_equal(pace_reads_within(&s, pace_hold_ms(&s)), 7); /* 0 .. 32.5 s */
    assert_int_equal(pace_reads_within(&s, 32499), 6);
    assert_int_equal(pace_reads_within(&s, 0), 1);
    assert_int_equal(pace_reads_within(&s, 45500), 8); /* the last wait repeats */
    struct pace_schedule fast = {.n = 4, .wait_ms = {0, 1100, 1100, 1100}};
    assert_int_equal(pace_reads_within(&fast, pace_hold_ms(&fast)), 5); /* 0, 1.1, 2.2, 3.3, 4.4 of 4.8 s */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reads_within),
        cmocka_unit_test(test_default_schedule),
        cmocka_unit_test(test_reads_as_soon_as_allowed),
        cmocka_unit_test(test_first_read_is_now),
        cmocka_unit_test(test_episode_end),
        cmocka_unit_test(test_restart_after_episode),
        cmocka_unit_test(test_one_step_schedules),
        cmocka_unit_test(test_short_schedule),
        cmocka_unit_test(test_valid_schedules_keep_min_gap),
        cmocka_unit_test(test_valid_rejects),
        cmocka_unit_test(test_valid_accepts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
