/* notify_sig.c - see notify_sig.h. */
#include "notify_sig.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

int notify_sig_hmac(const char *secret, const char *t, size_t tlen, const char *id, const void *body, size_t len,
                    char hex[65])
{
    static const char digits[] = "0123456789abcdef";
    unsigned char mac[32];
    size_t maclen = 0;
    int rc = -1;
    EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
    EVP_MAC_CTX *ctx = m ? EVP_MAC_CTX_new(m) : NULL;
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0), OSSL_PARAM_END};
    if (ctx != NULL && EVP_MAC_init(ctx, (const unsigned char *)secret, strlen(secret), params) &&
        EVP_MAC_update(ctx, (const unsigned char *)t, tlen) && EVP_MAC_update(ctx, (const unsigned char *)".", 1) &&
        EVP_MAC_update(ctx, (const unsigned char *)id, strlen(id)) &&
        EVP_MAC_update(ctx, (const unsigned char *)".", 1) &&
        (len == 0 || EVP_MAC_update(ctx, body, len)) && EVP_MAC_final(ctx, mac, &maclen, sizeof mac) &&
        maclen == sizeof mac) {
        for (size_t i = 0; i < sizeof mac; i++) {
            hex[2 * i] = digits[mac[i] >> 4];
            hex[2 * i + 1] = digits[mac[i] & 15];
        }
        hex[64] = '\0';
        rc = 0;
    }
    OPENSSL_cleanse(mac, sizeof mac);
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(m);
    return rc;
}

/* One item of the header: [a, b) trimmed of spaces, split at its first '='. */
struct item {
    const char *k, *v;
    size_t kl, vl;
};

static bool split_item(const char *a, const char *b, struct item *it)
{
    while (a < b && (*a == ' ' || *a == '\t'))
        a++;
    while (b > a && (b[-1] == ' ' || b[-1] == '\t'))
        b--;
    const char *eq = memchr(a, '=', (size_t)(b - a));
    if (eq == NULL || eq == a)
        return false;
    *it = (struct item){.k = a, .kl = (size_t)(eq - a), .v = eq + 1, .vl = (size_t)(b - eq - 1)};
    return true;
}

static bool all_of(const char *s, size_t n, const char *set)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] == '\0' || strchr(set, s[i]) == NULL)
            return false;
    return true;
}

enum notify_sig notify_sig_check(const char *header, const char *secret, const char *id, const void *body,
                                 size_t len, int64_t now_s, char *why, size_t whylen)
{
    static const char form[] = "t=UNIX_SECONDS,v1=HEX (64 lowercase hex digits)";
    if (header == NULL || *header == '\0') {
        snprintf(why, whylen, "no Kembali-Signature header: sign the notify with the shop's notify secret");
        return NOTIFY_SIG_MISSING;
    }
    size_t hl = strnlen(header, NOTIFY_SIG_HEADER_MAX + 1);
    const char *t = NULL, *v1 = NULL;
    size_t tlen = 0;
    int nt = 0, nv = 0;
    bool bad = hl > NOTIFY_SIG_HEADER_MAX;
    for (const char *a = header; !bad && a <= header + hl;) {
        const char *b = memchr(a, ',', (size_t)(header + hl - a));
        if (b == NULL)
            b = header + hl;
        struct item it;
        if (!split_item(a, b, &it)) {
            bad = true;
            break;
        }
        if (it.kl == 1 && it.k[0] == 't') {
            t = it.v;
            tlen = it.vl;
            nt++;
        } else if (it.kl == 2 && memcmp(it.k, "v1", 2) == 0) {
            v1 = it.v;
            nv++;
            bad = it.vl != 64 || !all_of(it.v, 64, "0123456789abcdef");
        }
        a = b + 1;
    }
    if (bad || nt != 1 || nv != 1 || tlen < 1 || tlen > 19 || !all_of(t, tlen, "0123456789")) {
        snprintf(why, whylen, "the Kembali-Signature header must be %s", form);
        return NOTIFY_SIG_MALFORMED;
    }
    char want[65];
    if (notify_sig_hmac(secret, t, tlen, id, body, len, want) != 0) {
        snprintf(why, whylen, "the signature cannot be checked now (out of memory); try again");
        return NOTIFY_SIG_ERROR;
    }
    int differ = CRYPTO_memcmp(want, v1, 64);
    OPENSSL_cleanse(want, sizeof want);
    if (differ != 0) {
        snprintf(why, whylen, "the signature is wrong: v1 must be the HMAC-SHA256 of T.ID.BODY keyed with the "
                 "shop's notify secret");
        return NOTIFY_SIG_WRONG;
    }
    int64_t ts = 0;
    for (size_t i = 0; i < tlen; i++)
        ts = ts > (INT64_MAX - 9) / 10 ? INT64_MAX : ts * 10 + (t[i] - '0');
    if (ts > now_s + NOTIFY_SIG_WINDOW_S || ts < now_s - NOTIFY_SIG_WINDOW_S) {
        snprintf(why, whylen, "the signature's timestamp t=%.*s is more than %d s from kembali's clock (%lld)",
                 (int)tlen, t, NOTIFY_SIG_WINDOW_S, (long long)now_s);
        return NOTIFY_SIG_STALE;
    }
    return NOTIFY_SIG_OK;
}
