/* test_state_redis_name.c - unit tests of src/state_redis_name.c: an API
 * key's name in Redis, and what happens when libcrypto fails. HMAC() is
 * interposed here (this program's definition is the one the module calls):
 * it fails on demand, else it calls libcrypto's. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dlfcn.h>
#include <string.h>

#include <openssl/hmac.h>

#include "state_redis_name.h"

static int hmac_fails; /* a test's switch: the next HMAC() calls return NULL */

unsigned char *HMAC(const EVP_MD *md, const void *key, int key_len, const unsigned char *d, size_t n,
                    unsigned char *out, unsigned int *out_len)
{
    if (hmac_fails)
        return NULL; /* as libcrypto out of memory */
    unsigned char *(*real)(const EVP_MD *, const void *, int, const unsigned char *, size_t, unsigned char *,
                           unsigned int *);
    *(void **)&real = dlsym(RTLD_NEXT, "HMAC");
    assert_non_null(real);
    return real(md, key, key_len, d, n, out, out_len);
}

/* The name is HMAC-SHA256(secret, "kembali-names-v1")'s first 16 bytes in
 * hex, as Python's hmac module computes it (tests/integration/test_redis.py
 * checks the same against a real Redis). */
static void test_name_of_a_secret(void **state)
{
    (void)state;
    hmac_fails = 0;
    struct state_redis_id k;
    assert_true(state_redis_name("sk_test_kembali_0000000000000001", &k));
    assert_string_equal(k.hex, "da40e0d44d1a8f8a2336ab07a98a922c");
    struct state_redis_id k2;
    assert_true(state_redis_name("sk_test_kembali_0000000000000002", &k2));
    assert_string_not_equal(k.hex, k2.hex);
}

/* libcrypto failing gives no name at all, never one name shared by every
 * key (all zeros, as before): the caller then leaves Redis out. */
static void test_no_name_when_libcrypto_fails(void **state)
{
    (void)state;
    hmac_fails = 1;
    struct state_redis_id k;
    memset(k.hex, 'x', sizeof k.hex);
    assert_false(state_redis_name("sk_test_kembali_0000000000000001", &k));
    assert_string_equal(k.hex, "");
    hmac_fails = 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_of_a_secret),
        cmocka_unit_test(test_no_name_when_libcrypto_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
