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
#include <stddef.h>

#include "state_redis_msg.h"

#define STATE_REDIS_NAME_LABEL "kembali-names-v1" /* 16 bytes, no NUL: fixed for good */

/* The schema of what kembali keeps in Redis: the keys' names and fields,
 * what the scripts do with them, and the wake channel's messages. Every
 * key and the channel are named PREFIX "v" SCHEMA ":" ..., so hosts of two
 * versions on one Redis keep their own keys and their own channel while
 * both run (a rolling upgrade: see docs/redis.md, "Upgrading several hosts") and never read
 * or write the other's. Bump it with any change to those.
 * 1: the names without a version (releases before this one);
 * 2: the version in the names; the wake channel's S and R lines;
 * 3: the waiting transactions' fields copied for the plan ({K}v), the
 *    scripts' keys by kind (state_redis_lua.c) and no key prefix passed. */
#define STATE_REDIS_SCHEMA 3
#define STATE_REDIS_SCHEMA_MAX 12 /* the most "v" SCHEMA ":" adds to the prefix */

/* PREFIX "v" SCHEMA ":" into out (cap bytes); schema <= 0 means
 * STATE_REDIS_SCHEMA (another one only in tests: two versions from one
 * build). false when it does not fit (out is then empty). */
bool state_redis_prefix(char *out, size_t cap, const char *prefix, int schema);

/* A key: VPREFIX{K}WHAT TAIL (tail may be NULL), VPREFIX from
 * state_redis_prefix(). The API key's name K alone is in braces, the hash
 * tag: every key of one API key, whatever its schema, lies in one Redis
 * Cluster slot, which the scripts need (prefix characters exclude braces,
 * config_redis.c). Cut short if it does not fit cap. */
void state_redis_key(char *out, size_t cap, const char *vprefix, const struct state_redis_id *k, const char *what,
                     const char *tail);

/* K for `secret` into out->hex. false when libcrypto fails (out of memory):
 * out is then an empty string, and the caller must not use Redis for that
 * key (one all-zero name would put every tenant's transactions under one
 * name). */
bool state_redis_name(const char *secret, struct state_redis_id *out);

#endif
