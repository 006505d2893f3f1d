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
#include <stdio.h>
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

/* Redis Cluster's hash tag: what lies between the first '{' and the first
 * '}' after it (when not empty), else the whole key. */
static void hash_tag(const char *key, char *out, size_t cap)
{
    const char *a = strchr(key, '{'), *b = a ? strchr(a + 1, '}') : NULL;
    if (a == NULL || b == NULL || b == a + 1)
        snprintf(out, cap, "%s", key);
    else
        snprintf(out, cap, "%.*s", (int)(b - a - 1), a + 1);
}

/* Key names carry the schema version: two versions on one Redis name
 * every key apart, yet one API key's keys share one slot in either. */
static void test_keys_carry_the_schema(void **state)
{
    (void)state;
    hmac_fails = 0;
    struct state_redis_id k;
    assert_true(state_redis_name("sk_test_kembali_0000000000000001", &k));
    char p0[80], p7[80], a[200], b[200], c[200], tag[80];
    assert_true(state_redis_prefix(p0, sizeof p0, "kembali:", 0));
    assert_true(state_redis_prefix(p7, sizeof p7, "kembali:", 7));
    char want[80];
    snprintf(want, sizeof want, "kembali:v%d:", STATE_REDIS_SCHEMA);
    assert_string_equal(p0, want);
    assert_string_equal(p7, "kembali:v7:");
    state_redis_key(a, sizeof a, p0, &k, "t:", "T1");
    snprintf(want, sizeof want, "kembali:v%d:{da40e0d44d1a8f8a2336ab07a98a922c}t:T1", STATE_REDIS_SCHEMA);
    assert_string_equal(a, want);
    state_redis_key(b, sizeof b, p7, &k, "t:", "T1");
    assert_string_equal(b, "kembali:v7:{da40e0d44d1a8f8a2336ab07a98a922c}t:T1");
    state_redis_key(c, sizeof c, p0, &k, "b", NULL);
    hash_tag(a, tag, sizeof tag);
    assert_string_equal(tag, k.hex);
    hash_tag(b, tag, sizeof tag);
    assert_string_equal(tag, k.hex);
    hash_tag(c, tag, sizeof tag);
    assert_string_equal(tag, k.hex);
    /* the releases before: kembali:{K}t:T1, which neither name equals */
    assert_string_not_equal(a, "kembali:{da40e0d44d1a8f8a2336ab07a98a922c}t:T1");
    /* a prefix that does not fit leaves nothing to misuse */
    char small[10];
    assert_false(state_redis_prefix(small, sizeof small, "kembali:", 0));
    assert_string_equal(small, "");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_of_a_secret),
        cmocka_unit_test(test_no_name_when_libcrypto_fails),
        cmocka_unit_test(test_keys_carry_the_schema),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
