/* fuzz_classify.c - an answer of GET /v1/transactions/:id (classify_response).
 *
 * Input: an HTTP answer as kasera.c receives it: the status on the first
 * line (a decimal number, "0" for no answer), header lines until an empty
 * line, then the body (any bytes, up to kasera.c's 64 KiB). Headers are
 * taken as kasera.c's on_header takes them (name matched case-insensitively,
 * value trimmed, printable ASCII only, its buffer sizes), the last one of a
 * name winning. Checked (classify.h): every field bounded,
 * NUL-terminated and printable; the kind follows the HTTP status; "failed"
 * only from a 200 whose body says so; nothing from a 5xx or no answer but
 * OUT_NO_ANSWER. */
#include <stdbool.h>
#include <strings.h>

#include "classify.h"
#include "fuzz.h"

#define BODY_MAX (64 * 1024)

struct headers {
    char retry_after[80], rl_limit[32], rl_remaining[32], rl_reset[32];
    char rl_sf[256], rl_policy[256];
};

/* kasera.c's take_header(). */
static void take_header(const char *p, size_t len, const char *name, char *dst, size_t cap)
{
    size_t nl = strlen(name);
    if (len <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
        return;
    p += nl + 1;
    len -= nl + 1;
    while (len > 0 && (*p == ' ' || *p == '\t'))
        p++, len--;
    while (len > 0 && (p[len - 1] == '\r' || p[len - 1] == '\n' || p[len - 1] == ' '))
        len--;
    size_t n = 0;
    for (size_t i = 0; i < len && n + 1 < cap; i++)
        if ((unsigned char)p[i] >= ' ' && (unsigned char)p[i] < 0x7f)
            dst[n++] = p[i];
    dst[n] = '\0';
}

static void check_clean(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);
    FUZZ_CHECK(n < cap);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK((unsigned char)s[i] >= ' ' && (unsigned char)s[i] < 0x7f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = {data, size};
    char *status = fuzz_field(&in, '\n', NULL);
    long http = 0;
    for (const char *s = status; *s >= '0' && *s <= '9' && http < 100000; s++)
        http = http * 10 + (*s - '0');
    free(status);

    struct headers h;
    memset(&h, 0, sizeof h);
    bool seen = false;
    for (;;) {
        size_t len;
        if (in.left == 0)
            break;
        char *line = fuzz_field(&in, '\n', &len);
        bool empty = len == 0 || (len == 1 && line[0] == '\r');
        if (!empty) {
            seen = true;
            take_header(line, len, "Retry-After", h.retry_after, sizeof h.retry_after);
            take_header(line, len, "RateLimit-Limit", h.rl_limit, sizeof h.rl_limit);
            take_header(line, len, "RateLimit-Remaining", h.rl_remaining, sizeof h.rl_remaining);
            take_header(line, len, "RateLimit-Reset", h.rl_reset, sizeof h.rl_reset);
            take_header(line, len, "RateLimit", h.rl_sf, sizeof h.rl_sf);
            take_header(line, len, "RateLimit-Policy", h.rl_policy, sizeof h.rl_policy);
        }
        free(line);
        if (empty)
            break;
    }
    (void)seen;
    size_t blen = in.left < BODY_MAX ? in.left : BODY_MAX;
    char *body = malloc(blen + 1); /* kasera.c keeps a NUL after the body; classify must not need it */
    FUZZ_CHECK(body != NULL);
    memcpy(body, in.p, blen);
    body[blen] = '\0';

    struct api_response r = {
        .http = http, .body = blen ? body : NULL, .body_len = blen,
        .retry_after = h.retry_after[0] ? h.retry_after : NULL,
        .rl_limit = h.rl_limit[0] ? h.rl_limit : NULL,
        .rl_remaining = h.rl_remaining[0] ? h.rl_remaining : NULL,
        .rl_reset = h.rl_reset[0] ? h.rl_reset : NULL,
        .rl_sf = h.rl_sf[0] ? h.rl_sf : NULL,
        .rl_policy = h.rl_policy[0] ? h.rl_policy : NULL,
    };
    struct outcome o;
    memset(&o, 0x5a, sizeof o);
    classify_response(&r, 1791590400, &o);

    FUZZ_CHECK(o.kind >= OUT_STATUS && o.kind <= OUT_NO_ANSWER);
    FUZZ_CHECK(strcmp(classify_outcome_name(o.kind), "?") != 0);
    check_clean(o.error_code, sizeof o.error_code);
    check_clean(o.request_id, sizeof o.request_id);
    check_clean(o.message, sizeof o.message);
    FUZZ_CHECK(o.retry_after_ms == -1 || (o.retry_after_ms >= 0 && o.retry_after_ms <= RL_MAX_WAIT_MS));
    FUZZ_CHECK(o.rl.scope == RL_NONE || o.rl.scope == RL_TX || o.rl.scope == RL_KEY);
    FUZZ_CHECK(o.rl.reset_ms >= 0 && o.rl.reset_ms <= RL_MAX_WAIT_MS);
    if (o.kind == OUT_STATUS) {
        FUZZ_CHECK(http == 200);
        FUZZ_CHECK(o.status >= TXS_PENDING && o.status <= TXS_UNKNOWN);
        size_t n = strnlen(o.status_word, sizeof o.status_word);
        FUZZ_CHECK(n >= 1 && n <= STATUS_WORD_MAX);
        for (size_t i = 0; i < n; i++) {
            char c = o.status_word[i];
            FUZZ_CHECK((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_');
        }
        if (o.status != TXS_UNKNOWN)
            FUZZ_CHECK(strcmp(o.status_word, tx_status_word(o.status)) == 0);
        if (o.status == TXS_FAILED) /* "failed" only when Kasera says so */
            FUZZ_CHECK(memmem(body, blen, "failed", 6) != NULL || memchr(body, '\\', blen) != NULL);
    }
    if (http == 404)
        FUZZ_CHECK(o.kind == OUT_NOT_FOUND);
    if (http == 401)
        FUZZ_CHECK(o.kind == OUT_UNAUTHORIZED);
    if (http == 0 || http >= 500 || (http >= 100 && http < 400 && http != 200))
        FUZZ_CHECK(o.kind == OUT_NO_ANSWER);
    if (http == 429)
        FUZZ_CHECK(o.kind == OUT_TX_LIMITED || o.kind == OUT_KEY_LIMITED || o.kind == OUT_AUTH_BLOCKED ||
                   o.kind == OUT_REJECTED);
    free(body);
    return 0;
}
