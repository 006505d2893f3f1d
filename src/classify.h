/* classify.h - what one answer of GET /v1/transactions/:id means.
 *
 * classify_response() is a pure function over (HTTP status, headers, body): it does
 * no I/O and reads no clock (the caller passes the wall-clock time, used
 * only for HTTP-date Retry-After values). Every case of the API (tests/sandbox/README.md) maps
 * to one outcome kind; what to do about it is the state module's business. */
#ifndef KEMBALI_CLASSIFY_H
#define KEMBALI_CLASSIFY_H

#include <stddef.h>
#include <stdint.h>

#include "ids.h"
#include "ratelimit.h"

enum tx_status {
    TXS_NONE = 0,  /* nothing known yet */
    TXS_PENDING,
    TXS_SUCCEEDED,
    TXS_FAILED,
    TXS_CANCELED,
    TXS_EXPIRED,
    TXS_UNKNOWN,   /* a status word kembali does not know: treated like pending */
};

enum outcome_kind {
    OUT_STATUS,       /* 200 with a readable status */
    OUT_NOT_FOUND,    /* 404: no such transaction for this key */
    OUT_TX_LIMITED,   /* 429 rate_limited with Retry-After: per-transaction window */
    OUT_KEY_LIMITED,  /* 429 rate_limited without Retry-After: the key's 300/min */
    OUT_UNAUTHORIZED, /* 401: wrong or revoked key */
    OUT_AUTH_BLOCKED, /* 429 from the failed-authentication limiter: this host's IP */
    OUT_REJECTED,     /* other 4xx, unverified caps: waiting does not help */
    OUT_NO_ANSWER,    /* 5xx, transport error, timeout, malformed body */
};

#define STATUS_WORD_MAX IDS_WORD_MAX

/* One answer as the API client received it. http is 0 when no HTTP answer
 * arrived (refused, reset, timed out); body may be NULL. */
struct api_response {
    long http;
    const char *body;
    size_t body_len;
    const char *retry_after;
    const char *rl_limit, *rl_remaining, *rl_reset; /* RateLimit-Limit/-Remaining/-Reset */
    const char *rl_sf, *rl_policy;                  /* RateLimit / RateLimit-Policy */
};

struct outcome {
    enum outcome_kind kind;
    enum tx_status status;                /* OUT_STATUS only */
    char status_word[STATUS_WORD_MAX + 1]; /* as Kasera wrote it, if [a-z0-9_]{1,32}; else "unknown" */
    int64_t retry_after_ms;               /* -1 when absent or unparseable */
    struct rl_info rl;                    /* stated exhausted windows */
    char error_code[48];                  /* error.code, sanitised; "" when none */
    char request_id[80];                  /* error.request_id, sanitised */
    char message[160];                    /* error.message, sanitised, for the log only */
};

/* Classify one answer into *out. This function can't fail: anything it
 * does not understand becomes OUT_NO_ANSWER or, for 4xx, OUT_REJECTED. */
void classify_response(const struct api_response *resp, int64_t now_wall, struct outcome *out);

/* The word of a status ("pending", ..., "unknown"); never NULL. */
const char *tx_status_word(enum tx_status s);
/* Map a word to a status; unknown words give TXS_UNKNOWN. */
enum tx_status tx_status_parse(const char *word);
/* True for the statuses that end the schedule. */
int tx_status_final(enum tx_status s);
/* Name of an outcome kind, for logs and metrics. */
const char *classify_outcome_name(enum outcome_kind k);

#endif
