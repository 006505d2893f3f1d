/* state_redis_name.c - see state_redis_name.h. */
#include "state_redis_name.h"

#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "ids.h"

_Static_assert(sizeof STATE_REDIS_NAME_LABEL == 17, "the label is 16 bytes");

bool state_redis_name(const char *secret, struct state_redis_id *out)
{
    uint8_t mac[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    out->hex[0] = '\0';
    if (HMAC(EVP_sha256(), secret, (int)strlen(secret), (const uint8_t *)STATE_REDIS_NAME_LABEL, 16, mac, &n) ==
            NULL ||
        n < 16)
        return false;
    ids_hex(mac, 16, out->hex);
    return true;
}

bool state_redis_prefix(char *out, size_t cap, const char *prefix, int schema)
{
    int n = snprintf(out, cap, "%sv%d:", prefix, schema > 0 ? schema : STATE_REDIS_SCHEMA);
    if (n < 0 || (size_t)n >= cap) {
        if (cap > 0)
            out[0] = '\0';
        return false;
    }
    return true;
}

void state_redis_key(char *out, size_t cap, const char *vprefix, const struct state_redis_id *k, const char *what,
                     const char *tail)
{
    snprintf(out, cap, "%s{%s}%s%s", vprefix, k->hex, what, tail ? tail : "");
}
