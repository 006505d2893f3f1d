/* state_redis_name.h - the name of an API key in Redis.
 *
 * Every Redis key kembali writes for a shop's API key carries a name K
 * derived from the secret: the first 16 bytes of HMAC-SHA256(key = the
 * secret, message = STATE_REDIS_NAME_LABEL), in hex. A keyed hash, so the
 * name tells nothing of the secret; a pure function of it, so every host,
 * at any time, derives the same name (no random salt kept in Redis that
 * could expire, be deleted or differ between hosts). Changing the label
 * splits the key space between hosts that run different versions. */
#ifndef KEMBALI_STATE_REDIS_NAME_H
#define KEMBALI_STATE_REDIS_NAME_H

#include <stdbool.h>

#include "state_redis_msg.h"

#define STATE_REDIS_NAME_LABEL "kembali-names-v1" /* 16 bytes, no NUL: fixed for good */

/* K for `secret` into out->hex. false when libcrypto fails (out of memory):
 * out is then an empty string, and the caller must not use Redis for that
 * key (one all-zero name would put every tenant's transactions under one
 * name). */
bool state_redis_name(const char *secret, struct state_redis_id *out);

#endif
