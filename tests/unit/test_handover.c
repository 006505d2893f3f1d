/* test_handover.c - a request in hand as bytes, and back. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "handover.h"

static struct handover_rec sample(void)
{
    static const uint8_t out[] = "\x01\x06\x00\x01\x00\x05\x03\x00hello\0\0\0";
    struct handover_rec r = {.kind = HANDOVER_HELD, .fcgi_id = 0x1234, .keep_conn = true, .out_since = -5,
                             .out = out, .out_len = sizeof out - 1, .json = false, .head = true, .stream = true,
                             .undecided = true, .wants_read = false, .arrived = 1000, .deadline = 35000,
                             .painted = 1200, .last_sent = 1300, .idle_since = 0};
    strcpy(r.shop, "toko-a");
    strcpy(r.id, "tx_0001");
    strcpy(r.addr, "2001:db8::1");
    strcpy(r.origin, "https://toko-a.test");
    return r;
}

static void test_round_trip(void **unused)
{
    (void)unused;
    struct handover_rec r = sample(), back;
    uint8_t buf[512];
    size_t n = handover_encode(&r, buf, sizeof buf);
    assert_int_equal(n, handover_size(&r));
    assert_int_equal(n, HANDOVER_FIXED + 6 + 7 + 11 + 19 + r.out_len);
    char why[128];
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), 0);
    assert_int_equal(back.kind, HANDOVER_HELD);
    assert_int_equal(back.fcgi_id, 0x1234);
    assert_true(back.keep_conn && back.head && back.stream && back.undecided);
    assert_false(back.json || back.wants_read);
    assert_int_equal(back.out_since, -5);
    assert_int_equal(back.arrived, 1000);
    assert_int_equal(back.deadline, 35000);
    assert_int_equal(back.painted, 1200);
    assert_int_equal(back.last_sent, 1300);
    assert_string_equal(back.shop, "toko-a");
    assert_string_equal(back.id, "tx_0001");
    assert_string_equal(back.addr, "2001:db8::1");
    assert_string_equal(back.origin, "https://toko-a.test");
    assert_int_equal(back.out_len, r.out_len);
    assert_memory_equal(back.out, r.out, r.out_len);
    assert_ptr_equal(back.out, buf + n - r.out_len); /* in place, not copied */

    struct handover_rec idle = {.kind = HANDOVER_IDLE, .idle_since = 77};
    n = handover_encode(&idle, buf, sizeof buf);
    assert_int_equal(n, HANDOVER_FIXED);
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), 0);
    assert_int_equal(back.kind, HANDOVER_IDLE);
    assert_int_equal(back.idle_since, 77);
    assert_null(back.out);
    assert_string_equal(back.shop, "");
}

static void test_refused(void **unused)
{
    (void)unused;
    struct handover_rec r = sample(), back;
    uint8_t buf[512];
    char why[128];
    size_t n = handover_encode(&r, buf, sizeof buf);
    for (size_t cut = 0; cut < n; cut++) /* every prefix is refused, never read past */
        assert_int_equal(handover_decode(buf, cut, &back, why, sizeof why), -1);
    assert_int_equal(handover_encode(&r, buf, n - 1), 0); /* no room */
    buf[n] = 0;
    assert_int_equal(handover_decode(buf, n + 1, &back, why, sizeof why), -1);
    assert_non_null(strstr(why, "after the record"));
    buf[0] = HANDOVER_FORMAT + 1;
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), -1);
    assert_non_null(strstr(why, "format"));
    buf[0] = HANDOVER_FORMAT;
    buf[1] = 9;
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), -1);
    assert_non_null(strstr(why, "kind"));
    buf[1] = HANDOVER_HELD;
    buf[5 + 48 + 2] = 0; /* a NUL inside the shop's id (after the times and its length byte) */
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), -1);
    assert_non_null(strstr(why, "NUL"));
    struct handover_rec r2 = sample();
    memset(r2.addr, 'a', HANDOVER_STR_MAX);
    r2.addr[HANDOVER_STR_MAX] = '\0';
    assert_int_not_equal(handover_size(&r2), SIZE_MAX); /* at the limit: fine */
    r2.out_len = HANDOVER_OUT_MAX + 1;
    assert_int_equal(handover_size(&r2), SIZE_MAX);
    assert_int_equal(handover_encode(&r2, buf, sizeof buf), 0);
}

static void test_frames(void **unused)
{
    (void)unused;
    uint8_t buf[64];
    handover_frame(buf, 7, 3);
    memcpy(buf + 8, "abc", 3);
    handover_frame(buf + 11, 8, 0);
    size_t off = 0, l;
    uint32_t idx;
    const uint8_t *rec;
    assert_int_equal(handover_next(buf, 19, &off, &idx, &rec, &l), 1);
    assert_int_equal(idx, 7);
    assert_int_equal(l, 3);
    assert_memory_equal(rec, "abc", 3);
    assert_int_equal(handover_next(buf, 19, &off, &idx, &rec, &l), 1);
    assert_int_equal(idx, 8);
    assert_int_equal(l, 0);
    assert_int_equal(handover_next(buf, 19, &off, &idx, &rec, &l), 0);
    off = 0;
    assert_int_equal(handover_next(buf, 10, &off, &idx, &rec, &l), -1); /* cut inside the first */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refused),
        cmocka_unit_test(test_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
