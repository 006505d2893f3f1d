/* test_ids.c - unit tests of src/ids.c: transaction ids, status words and
 * hex digits, the shapes kembali takes from outside. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <string.h>

#include "ids.h"

static void test_valid_id(void **unused)
{
    (void)unused;
    assert_true(ids_valid_id("a"));
    assert_true(ids_valid_id("T1"));
    assert_true(ids_valid_id("txn_01HZX-abc"));
    assert_true(ids_valid_id("ABCxyz0189_-"));
    assert_true(ids_valid_id("-"));
    char id[80];
    memset(id, 'a', sizeof id);
    id[64] = '\0';
    assert_true(ids_valid_id(id)); /* 64 */
    id[64] = 'b';
    id[65] = '\0';
    assert_false(ids_valid_id(id)); /* 65 */
    id[70] = '\0';
    id[65] = 'c';
    assert_false(ids_valid_id(id));
    assert_false(ids_valid_id(""));
    assert_false(ids_valid_id(NULL));
    assert_false(ids_valid_id("a b"));
    assert_false(ids_valid_id("a/b"));
    assert_false(ids_valid_id("\xc3\xa4"));
    assert_false(ids_valid_id("a\xc3\xa4"));
    assert_false(ids_valid_id("a.b"));
    assert_false(ids_valid_id("a%20"));
    assert_false(ids_valid_id("a\n"));
    assert_false(ids_valid_id("<x>"));
    assert_false(ids_valid_id("a+b"));
}

static void test_hex(void **unused)
{
    (void)unused;
    uint8_t b[16], back[16];
    for (int i = 0; i < 16; i++)
        b[i] = (uint8_t)(i * 17 + 3);
    char hex[33];
    ids_hex(b, 16, hex);
    assert_int_equal(strlen(hex), 32);
    assert_true(ids_unhex(hex, 32, back, 16));
    assert_memory_equal(b, back, 16);
    assert_false(ids_unhex(hex, 31, back, 16));
    hex[5] = 'G';
    assert_false(ids_unhex(hex, 32, back, 16));
    assert_true(ids_valid_word("expired", 7));
    assert_false(ids_valid_word("", 0));
    assert_false(ids_valid_word("a-b", 3));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid_id),
        cmocka_unit_test(test_hex),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
