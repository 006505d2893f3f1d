/* notify_sig.h - the signature of a told status (the admin POST
 * ?format=notify): `Kembali-Signature: t=UNIX_SECONDS,v1=HEX`, HEX the
 * lowercase hex HMAC-SHA256, keyed with the shop's notify secret, of
 * `T.ID.BODY` (the timestamp as sent, '.', the transaction id, '.', the raw
 * body bytes). Pure: the clock is an argument. */
#ifndef KEMBALI_NOTIFY_SIG_H
#define KEMBALI_NOTIFY_SIG_H

#include <stddef.h>
#include <stdint.h>

#define NOTIFY_SIG_WINDOW_S 300 /* a timestamp further than this from our clock is stale */
#define NOTIFY_SIG_HEADER_MAX 512 /* a longer header is malformed */

enum notify_sig {
    NOTIFY_SIG_OK = 0,
    NOTIFY_SIG_MISSING,   /* no header (NULL or empty) */
    NOTIFY_SIG_MALFORMED, /* not t=DIGITS,v1=64 lowercase hex digits */
    NOTIFY_SIG_WRONG,     /* the HMAC differs */
    NOTIFY_SIG_STALE,     /* right, but t is more than NOTIFY_SIG_WINDOW_S from now */
    NOTIFY_SIG_ERROR,     /* the HMAC could not be computed (out of memory) */
};

/* Check `header` (the Kembali-Signature value, NULL when absent) against
 * `secret` (NUL-terminated), `id` and the body (len bytes, any bytes) at
 * now_s (Unix seconds). The header holds comma-separated key=value items
 * (spaces around them allowed): exactly one t (1 to 19 decimal digits) and
 * exactly one v1; other keys are ignored (a later scheme). The HMAC is
 * compared in constant time (CRYPTO_memcmp); the timestamp is checked only
 * when the HMAC is right. Returns NOTIFY_SIG_OK, or another value with a
 * reason in plain words in why (never holding the secret or the expected
 * HMAC). Can't crash on any input. */
enum notify_sig notify_sig_check(const char *header, const char *secret, const char *id, const void *body,
                                 size_t len, int64_t now_s, char *why, size_t whylen);

/* The lowercase hex HMAC-SHA256 of `T.ID.BODY` keyed with secret, into
 * hex (65 bytes, NUL-terminated). 0, or -1 when it could not be computed. */
int notify_sig_hmac(const char *secret, const char *t, size_t tlen, const char *id, const void *body, size_t len,
                    char hex[65]);

#endif
