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
    assert_ptr_equal(back.out, buf + n - 1 - r.out_len); /* in place, not copied */
    assert_false(back.has_snap);

    struct handover_rec idle = {.kind = HANDOVER_IDLE, .idle_since = 77};
    n = handover_encode(&idle, buf, sizeof buf);
    assert_int_equal(n, HANDOVER_FIXED);
    assert_int_equal(buf[0], 2);
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
    buf[7 + 48 + 2] = 0; /* a NUL inside the shop's id (after the times and its length byte) */
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

static struct handover_rec with_snap(void)
{
    struct handover_rec r = sample();
    r.layout = 14;
    r.has_snap = true;
    r.snap = (struct state_snap){.has_tx = true, .reads = 3, .last_start = 9000, .last_end = 9100,
                                 .inflight_until = 12000, .not_before = 15000,
                                 .status = TXS_SUCCEEDED, .known_until = 40000, .not_found = false,
                                 .key_paused_until = 20000, .host_paused_until = 21000};
    strcpy(r.snap.status_word, "succeeded");
    return r;
}

/* Format 2: the sender's layout and what its state held, and back. */
static void test_snapshot(void **unused)
{
    (void)unused;
    struct handover_rec r = with_snap(), back;
    uint8_t buf[768];
    char why[128];
    size_t n = handover_encode(&r, buf, sizeof buf);
    assert_int_equal(n, HANDOVER_FIXED + 6 + 7 + 11 + 19 + r.out_len + HANDOVER_SNAP_FIXED + 9);
    assert_true(n <= HANDOVER_REC_MAX + r.out_len);
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), 0);
    assert_int_equal(back.layout, 14);
    assert_true(back.has_snap);
    assert_true(back.snap.has_tx);
    assert_false(back.snap.not_found);
    assert_int_equal(back.snap.reads, 3);
    assert_int_equal(back.snap.last_start, 9000);
    assert_int_equal(back.snap.last_end, 9100);
    assert_int_equal(back.snap.inflight_until, 12000);
    assert_int_equal(back.snap.not_before, 15000);
    assert_int_equal(back.snap.status, TXS_SUCCEEDED);
    assert_string_equal(back.snap.status_word, "succeeded");
    assert_int_equal(back.snap.known_until, 40000);
    assert_int_equal(back.snap.key_paused_until, 20000);
    assert_int_equal(back.snap.host_paused_until, 21000);
    assert_memory_equal(back.out, r.out, r.out_len);
    for (size_t cut = 0; cut < n; cut++)
        assert_int_equal(handover_decode(buf, cut, &back, why, sizeof why), -1);
    /* a status no version knows, a snapshot marked other than 0 or 1 */
    size_t snap_at = n - (HANDOVER_SNAP_FIXED + 9) - 1;
    assert_int_equal(buf[snap_at], 1);
    buf[snap_at + 1] = 99;
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), -1);
    assert_non_null(strstr(why, "status"));
    buf[snap_at + 1] = TXS_SUCCEEDED;
    buf[snap_at] = 2;
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), -1);
    assert_non_null(strstr(why, "snapshot"));
    /* a fact: no connection, only what the state held */
    struct handover_rec fact = with_snap();
    fact.kind = HANDOVER_FACT;
    fact.out = NULL;
    fact.out_len = 0;
    n = handover_encode(&fact, buf, sizeof buf);
    assert_int_not_equal(n, 0);
    assert_int_equal(handover_decode(buf, n, &back, why, sizeof why), 0);
    assert_int_equal(back.kind, HANDOVER_FACT);
    assert_int_equal(back.snap.known_until, 40000);
    /* a word too long for a status */
    r.snap.status_word[0] = '\0';
    r.has_snap = true;
    memset(r.snap.status_word, 'w', STATUS_WORD_MAX);
    r.snap.status_word[STATUS_WORD_MAX] = '\0';
    assert_int_not_equal(handover_encode(&r, buf, sizeof buf), 0);
}

/* A format 1 record (the version before: no layout, no snapshot) is read;
 * an unknown format is refused with a reason. */
static void test_format_1(void **unused)
{
    (void)unused;
    struct handover_rec r = sample(), back;
    uint8_t v2[512], v1[512];
    char why[128];
    size_t n = handover_encode(&r, v2, sizeof v2);
    /* format 1: the same without the u16 layout (after the flags) and the snapshot's byte (last) */
    v1[0] = 1;
    memcpy(v1 + 1, v2 + 1, 4);
    memcpy(v1 + 5, v2 + 7, n - 7 - 1);
    size_t n1 = n - 3;
    /* ... as handover_encode_as writes it for an older reader, a snapshot or not */
    uint8_t as1[512];
    struct handover_rec rs = with_snap();
    assert_int_equal(handover_encode_as(&rs, 1, as1, sizeof as1), n1);
    assert_memory_equal(as1, v1, n1);
    rs.kind = HANDOVER_FACT;
    assert_int_equal(handover_encode_as(&rs, 1, as1, sizeof as1), 0);
    assert_int_equal(handover_encode_as(&rs, 3, as1, sizeof as1), 0);
    assert_int_equal(handover_decode(v1, n1, &back, why, sizeof why), 0);
    assert_int_equal(back.layout, 0);
    assert_false(back.has_snap);
    assert_int_equal(back.deadline, 35000);
    assert_string_equal(back.origin, "https://toko-a.test");
    assert_memory_equal(back.out, r.out, r.out_len);
    assert_int_equal(handover_decode(v1, n1 + 1, &back, why, sizeof why), -1); /* a snapshot byte is not format 1's */
    v1[1] = HANDOVER_FACT; /* format 2's kind */
    assert_int_equal(handover_decode(v1, n1, &back, why, sizeof why), -1);
    assert_non_null(strstr(why, "kind"));
    v1[1] = HANDOVER_HELD;
    for (unsigned f = 0; f < 256; f++) {
        if (f == 1 || f == 2)
            continue;
        v1[0] = (uint8_t)f;
        assert_int_equal(handover_decode(v1, n1, &back, why, sizeof why), -1);
        assert_non_null(strstr(why, "format"));
    }
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
        cmocka_unit_test(test_snapshot),
        cmocka_unit_test(test_format_1),
        cmocka_unit_test(test_frames),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
