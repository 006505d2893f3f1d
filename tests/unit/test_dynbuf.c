/* test_dynbuf.c - unit tests of src/dynbuf.c: a buffer grows to its ceiling
 * and no further, and never hands out a cut text. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <locale.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include "dynbuf.h"

static void test_empty(void **unused)
{
    (void)unused;
    struct dynbuf b;
    dynbuf_init(&b, 100);
    assert_string_equal(dynbuf_ptr(&b), "");
    assert_int_equal(dynbuf_len(&b), 0);
    assert_int_equal(dynbuf_add(&b, NULL, 0), DYNBUF_OK);
    assert_int_equal(dynbuf_adds(&b, ""), DYNBUF_OK);
    assert_null(b.p); /* nothing added, nothing allocated */
    assert_int_equal(dynbuf_error(&b), DYNBUF_OK);
    dynbuf_free(&b);
}

/* Many small writes, and one formatted write far longer than any stack
 * array (render.c's old buf_printf cut at 511 bytes). */
static void test_grows(void **unused)
{
    (void)unused;
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    for (int i = 0; i < 2000; i++)
        assert_int_equal(dynbuf_addf(&b, "%04d,", i), DYNBUF_OK);
    assert_int_equal(dynbuf_len(&b), 2000 * 5);
    assert_int_equal(strlen(dynbuf_ptr(&b)), dynbuf_len(&b));
    assert_memory_equal(dynbuf_ptr(&b) + 1995 * 5, "1995,", 5);
    dynbuf_free(&b);
    assert_null(b.p);
    assert_int_equal(dynbuf_len(&b), 0);

    char *long_arg = malloc(5001);
    assert_non_null(long_arg);
    memset(long_arg, 'x', 5000);
    long_arg[5000] = '\0';
    assert_int_equal(dynbuf_adds(&b, "<"), DYNBUF_OK);
    assert_int_equal(dynbuf_addf(&b, "[%s|%d]\n%s", long_arg, 42, "tail"), DYNBUF_OK);
    assert_int_equal(dynbuf_len(&b), 1 + 1 + 5000 + 5 + 4);
    assert_memory_equal(dynbuf_ptr(&b), "<[xxx", 5);
    assert_string_equal(dynbuf_ptr(&b) + 1 + 1 + 5000, "|42]\ntail");
    dynbuf_free(&b);
    free(long_arg);
}

/* dynbuf_expect(): the first allocation holds the expected total, so
 * writing it in small steps never grows the buffer again; the ceiling is
 * kept whatever the hint, and dynbuf_free() forgets it. */
static void test_expect(void **unused)
{
    (void)unused;
    struct dynbuf b;
    dynbuf_init(&b, 1 << 20);
    dynbuf_expect(&b, 3000);
    assert_null(b.p); /* a hint allocates nothing */
    assert_int_equal(dynbuf_adds(&b, "<"), DYNBUF_OK);
    char *first = b.p;
    size_t cap = b.cap;
    assert_true(cap >= 3001);
    for (int i = 1; i < 3000; i++)
        assert_int_equal(dynbuf_add(&b, "x", 1), DYNBUF_OK);
    assert_int_equal(dynbuf_len(&b), 3000);
    assert_ptr_equal(b.p, first); /* never reallocated */
    assert_int_equal(b.cap, cap);
    assert_int_equal(dynbuf_adds(&b, "y"), DYNBUF_OK); /* past the hint: grows as usual */
    assert_int_equal(dynbuf_len(&b), 3001);
    assert_int_equal(strlen(dynbuf_ptr(&b)), 3001);
    dynbuf_free(&b);
    assert_int_equal(dynbuf_adds(&b, "<"), DYNBUF_OK);
    assert_true(b.cap < 3001); /* forgotten */
    dynbuf_free(&b);

    dynbuf_init(&b, 10);
    dynbuf_expect(&b, 4096);
    assert_int_equal(dynbuf_adds(&b, "0123456789"), DYNBUF_OK);
    assert_true(b.cap <= 11); /* the ceiling bounds the allocation */
    assert_int_equal(dynbuf_adds(&b, "a"), DYNBUF_TOO_BIG);
    assert_null(b.p);
    dynbuf_free(&b);
}

/* Exactly the ceiling fits; one byte more fails the buffer and frees what
 * it held; it stays failed until freed, then works again. */
static void test_ceiling(void **unused)
{
    (void)unused;
    struct dynbuf b;
    dynbuf_init(&b, 10);
    assert_int_equal(dynbuf_adds(&b, "0123456789"), DYNBUF_OK);
    assert_string_equal(dynbuf_ptr(&b), "0123456789");
    assert_true(b.cap <= 11); /* never allocates past the ceiling */
    assert_int_equal(dynbuf_adds(&b, "a"), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_error(&b), DYNBUF_TOO_BIG);
    assert_null(b.p);
    assert_string_equal(dynbuf_ptr(&b), "");
    assert_int_equal(dynbuf_len(&b), 0);
    /* sticky: even a write that would fit is refused, so a chain of writes
     * checked once at its end cannot come out with a hole in it */
    assert_int_equal(dynbuf_adds(&b, "b"), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_addf(&b, "%d", 1), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_add(&b, "", 0), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_len(&b), 0);
    dynbuf_free(&b);
    assert_int_equal(dynbuf_error(&b), DYNBUF_OK);
    assert_int_equal(b.max, 10);
    assert_int_equal(dynbuf_adds(&b, "again"), DYNBUF_OK);
    assert_string_equal(dynbuf_ptr(&b), "again");
    dynbuf_free(&b);
}

/* A formatted write that would cross the ceiling: nothing of it is kept. */
static void test_ceiling_formatted(void **unused)
{
    (void)unused;
    struct dynbuf b;
    dynbuf_init(&b, 600);
    assert_int_equal(dynbuf_addf(&b, "%*d", 590, 7), DYNBUF_OK);
    assert_int_equal(dynbuf_len(&b), 590);
    assert_int_equal(dynbuf_addf(&b, "%s", "0123456789"), DYNBUF_OK); /* 600: still fits */
    assert_int_equal(dynbuf_len(&b), 600);
    assert_int_equal(dynbuf_addf(&b, "%c", 'z'), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_len(&b), 0);
    dynbuf_free(&b);
    /* one write bigger than the whole ceiling, into an empty buffer */
    dynbuf_init(&b, 100);
    assert_int_equal(dynbuf_addf(&b, "%*s", 101, "x"), DYNBUF_TOO_BIG);
    assert_string_equal(dynbuf_ptr(&b), "");
    dynbuf_free(&b);
    /* the same through dynbuf_add: all or nothing */
    dynbuf_init(&b, 8);
    assert_int_equal(dynbuf_adds(&b, "abcd"), DYNBUF_OK);
    assert_int_equal(dynbuf_add(&b, "efghi", 5), DYNBUF_TOO_BIG);
    assert_int_equal(dynbuf_len(&b), 0);
    dynbuf_free(&b);
}

/* The ceiling holds however the growth steps fall (doubling from 256). */
static void test_ceiling_every_size(void **unused)
{
    (void)unused;
    for (size_t max = 1; max < 1100; max += 37) {
        struct dynbuf b;
        dynbuf_init(&b, max);
        size_t n = 0;
        enum dynbuf_rc rc;
        while ((rc = dynbuf_addf(&b, "%zu;", n % 10)) == DYNBUF_OK)
            n += 2;
        assert_int_equal(rc, DYNBUF_TOO_BIG);
        assert_true(n <= max && n + 2 > max);
        dynbuf_free(&b);
    }
}

/* vsnprintf() refusing its arguments is an error value, not a short text. */
static void test_bad_format(void **unused)
{
    (void)unused;
    setlocale(LC_ALL, "C"); /* no multibyte form for U+00E9 */
    struct dynbuf b;
    dynbuf_init(&b, 100);
    assert_int_equal(dynbuf_adds(&b, "before"), DYNBUF_OK);
    wchar_t w[] = {0xe9, 0};
    assert_int_equal(dynbuf_addf(&b, "%ls", w), DYNBUF_BAD_FORMAT);
    assert_int_equal(dynbuf_len(&b), 0);
    assert_int_equal(dynbuf_error(&b), DYNBUF_BAD_FORMAT);
    dynbuf_free(&b);
}

static void test_strerror(void **unused)
{
    (void)unused;
    assert_string_equal(dynbuf_strerror(DYNBUF_OK), "ok");
    assert_string_equal(dynbuf_strerror(DYNBUF_TOO_BIG), "too big");
    assert_string_equal(dynbuf_strerror(DYNBUF_NO_MEMORY), "out of memory");
    assert_string_equal(dynbuf_strerror(DYNBUF_BAD_FORMAT), "bad format");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty),
        cmocka_unit_test(test_grows),
        cmocka_unit_test(test_ceiling),
        cmocka_unit_test(test_expect),
        cmocka_unit_test(test_ceiling_formatted),
        cmocka_unit_test(test_ceiling_every_size),
        cmocka_unit_test(test_bad_format),
        cmocka_unit_test(test_strerror),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
