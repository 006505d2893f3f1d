/* test_word.c - unit tests of src/word.c: the status words and their HTTP
 * statuses. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "word.h"

static const char *const all_words[W_COUNT] = {
    "succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop",
};

static void test_words(void **unused)
{
    (void)unused;
    static const int http[W_COUNT] = {200, 200, 200, 200, 200, 404, 400, 404};
    for (int w = 0; w < W_COUNT; w++) {
        assert_string_equal(word_name((enum word)w), all_words[w]);
        assert_int_equal(word_http((enum word)w), http[w]);
    }
    assert_string_equal(word_name(W_COUNT), "checking");
    assert_string_equal(word_name((enum word)99), "checking");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_words),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
