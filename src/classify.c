/* classify.c - see classify.h. */
#include "classify.h"

#include <jansson.h>
#include <string.h>

#include "ids.h"
#include "util.h"

static const char *const status_words[] = {
    [TXS_NONE] = "unknown", [TXS_PENDING] = "pending", [TXS_SUCCEEDED] = "succeeded",
    [TXS_FAILED] = "failed", [TXS_CANCELED] = "canceled", [TXS_EXPIRED] = "expired",
    [TXS_UNKNOWN] = "unknown",
};

const char *tx_status_word(enum tx_status s)
{
    return (unsigned)s < ARRAY_LEN(status_words) ? status_words[s] : "unknown";
}

enum tx_status tx_status_parse(const char *word)
{
    for (int s = TXS_PENDING; s <= TXS_EXPIRED; s++)
        if (strcmp(word, status_words[s]) == 0)
            return (enum tx_status)s;
    return TXS_UNKNOWN;
}

int tx_status_final(enum tx_status s)
{
    return s == TXS_SUCCEEDED || s == TXS_FAILED || s == TXS_CANCELED || s == TXS_EXPIRED;
}

const char *classify_outcome_name(enum outcome_kind k)
{
    static const char *const names[] = {
        [OUT_STATUS] = "status", [OUT_NOT_FOUND] = "not_found", [OUT_TX_LIMITED] = "tx_limited",
        [OUT_KEY_LIMITED] = "key_limited", [OUT_UNAUTHORIZED] = "unauthorized",
        [OUT_AUTH_BLOCKED] = "auth_blocked", [OUT_REJECTED] = "rejected", [OUT_NO_ANSWER] = "no_answer",
    };
    return (unsigned)k < ARRAY_LEN(names) ? names[k] : "?";
}

/* Copy a string from the peer, keeping printable ASCII only. */
static void copy_clean(char *dst, size_t cap, const char *src)
{
    size_t n = 0;
    for (; src && *src && n + 1 < cap; src++)
        if ((unsigned char)*src >= ' ' && (unsigned char)*src < 0x7f)
            dst[n++] = *src;
    dst[n] = '\0';
}

void classify_response(const struct api_response *resp, int64_t now_wall, struct outcome *out)
{
    memset(out, 0, sizeof *out);
    out->kind = OUT_NO_ANSWER;
    out->retry_after_ms = rl_retry_after_ms(resp->retry_after, now_wall);
    rl_parse(resp->rl_limit, resp->rl_remaining, resp->rl_reset, resp->rl_sf, resp->rl_policy, &out->rl);

    json_t *root = NULL;
    if (resp->body != NULL && resp->body_len > 0)
        root = json_loadb(resp->body, resp->body_len, JSON_REJECT_DUPLICATES, NULL);
    json_t *err = json_is_object(root) ? json_object_get(root, "error") : NULL;
    if (json_is_object(err)) {
        copy_clean(out->error_code, sizeof out->error_code, json_string_value(json_object_get(err, "code")));
        copy_clean(out->request_id, sizeof out->request_id, json_string_value(json_object_get(err, "request_id")));
        copy_clean(out->message, sizeof out->message, json_string_value(json_object_get(err, "message")));
    }

    long h = resp->http;
    if (h == 200) {
        const char *st = json_is_object(root) ? json_string_value(json_object_get(root, "status")) : NULL;
        if (st != NULL && *st != '\0') {
            out->kind = OUT_STATUS;
            out->status = tx_status_parse(st);
            util_copy(out->status_word, sizeof out->status_word, ids_valid_word(st, strlen(st)) ? st : "unknown");
        } /* else: malformed 200, a read that gave no answer */
    } else if (h == 404) {
        out->kind = OUT_NOT_FOUND;
    } else if (h == 401) {
        out->kind = OUT_UNAUTHORIZED;
    } else if (h == 429) {
        const char *code = out->error_code;
        if (strcmp(code, "unverified_count_cap") == 0 || strcmp(code, "unverified_amount_cap") == 0)
            out->kind = OUT_REJECTED;
        else if (util_contains_ci(out->message, strlen(out->message), "authentication") ||
                 util_contains_ci(out->message, strlen(out->message), "autentikasi"))
            out->kind = OUT_AUTH_BLOCKED; /* the documented exception: recognised by its message */
        else if (out->retry_after_ms >= 0)
            out->kind = OUT_TX_LIMITED;
        else
            out->kind = OUT_KEY_LIMITED; /* rate_limited, or a 429 we cannot read: assume the key */
    } else if (h >= 400 && h < 500) {
        out->kind = OUT_REJECTED;
    } /* 5xx, 1xx/3xx, 0: no answer */

    json_decref(root);
}
