/* test_siphash.c - SipHash-2-4 (siphash.h) against the reference
 * implementation's test vectors (vectors.h, SipHash-2-4, 64-bit): key
 * 00..0f, messages 00..(n-1). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "siphash.h"

static void test_reference_vectors(void **unused)
{
    (void)unused;
    uint8_t k[16], in[64];
    for (int i = 0; i < 16; i++)
        k[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++)
        in[i] = (uint8_t)i;
    assert_int_equal(siphash24(k, in, 0), 0x726fdb47dd0e0e31ULL);
    assert_int_equal(siphash24(k, in, 1), 0x74f839c593dc67fdULL);
    assert_int_equal(siphash24(k, in, 7), 0xab0200f58b01d137ULL);
    assert_int_equal(siphash24(k, in, 8), 0x93f5f5799a932462ULL);
    assert_int_equal(siphash24(k, in, 15), 0xa129ca6149be45e5ULL);
    assert_int_equal(siphash24(k, in, 16), 0x3f2acc7f57c29bdbULL);
    assert_int_equal(siphash24(k, in, 63), 0x958a324ceb064572ULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_vectors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
