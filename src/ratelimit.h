/* ratelimit.h - reading the rate-limit headers of a Kasera answer.
 *
 * Pure functions: no clocks (the caller passes the wall-clock time), no I/O.
 * Two header forms are understood:
 *   - Kasera's: RateLimit-Limit / RateLimit-Remaining / RateLimit-Reset (seconds).
 *     On GET /v1/transactions/:id they describe the per-transaction window.
 *   - RFC 9651 structured fields: RateLimit-Policy: "p";q=1000;w=60 and
 *     RateLimit: "p";r=0;t=35 (t relative seconds). A policy whose quota q is
 *     1 is a per-transaction window; any other policy (or one we cannot match)
 *     is taken as the key's budget, which is the conservative reading.
 * A stated reset is only acted upon when the window is exhausted (remaining 0). */
#ifndef KEMBALI_RATELIMIT_H
#define KEMBALI_RATELIMIT_H

#include <stdbool.h>
#include <stdint.h>

#define RL_MAX_WAIT_MS (3600 * 1000LL) /* a stated wait is capped at one hour */

enum rl_scope { RL_NONE = 0, RL_TX, RL_KEY };

struct rl_info {
    enum rl_scope scope; /* RL_NONE: nothing exhausted is stated */
    int64_t reset_ms;    /* relative to the answer's arrival */
};

/* Parse a Retry-After value: delay-seconds or an HTTP date (IMF-fixdate,
 * RFC 850 or asctime form), relative to now_wall (epoch seconds).
 * Returns the wait in ms (0 for a date in the past, capped at RL_MAX_WAIT_MS),
 * or -1 when value is NULL, empty or unparseable. */
int64_t rl_retry_after_ms(const char *value, int64_t now_wall);

/* Read both header forms (any argument may be NULL) into *out.
 * This function can't fail: malformed headers read as "nothing stated". */
void rl_parse(const char *limit, const char *remaining, const char *reset,
              const char *sf_ratelimit, const char *sf_policy, struct rl_info *out);

#endif
