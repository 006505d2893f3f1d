/* fuzz_ratelimit.c - the RateLimit header forms (rl_parse).
 *
 * Input: five fields separated by newlines: RateLimit-Limit,
 * RateLimit-Remaining, RateLimit-Reset, RateLimit and RateLimit-Policy (each
 * cut at a NUL byte); a field that is exactly "\x01" is an absent header
 * (NULL). Checked: scope is one of the three, a reset from 0 to
 * RL_MAX_WAIT_MS, nothing stated means reset 0, the same answer twice, and
 * headers that state nothing exhausted state nothing. */
#include <stdbool.h>

#include "fuzz.h"
#include "ratelimit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct fuzz_in in = {data, size};
    char *f[5];
    const char *v[5];
    for (int i = 0; i < 5; i++) {
        f[i] = fuzz_field(&in, '\n', NULL);
        v[i] = strcmp(f[i], "\x01") == 0 ? NULL : f[i];
    }
    struct rl_info a, b;
    memset(&a, 0x5a, sizeof a);
    rl_parse(v[0], v[1], v[2], v[3], v[4], &a);
    FUZZ_CHECK(a.scope == RL_NONE || a.scope == RL_TX || a.scope == RL_KEY);
    FUZZ_CHECK(a.reset_ms >= 0 && a.reset_ms <= RL_MAX_WAIT_MS);
    if (a.scope == RL_NONE)
        FUZZ_CHECK(a.reset_ms == 0);
    rl_parse(v[0], v[1], v[2], v[3], v[4], &b);
    FUZZ_CHECK(a.scope == b.scope && a.reset_ms == b.reset_ms);
    /* nothing says "0 remaining": nothing is exhausted */
    if ((v[1] == NULL || strchr(v[1], '0') == NULL) && (v[3] == NULL || strstr(v[3], "r=") == NULL))
        FUZZ_CHECK(a.scope == RL_NONE);
    rl_parse(NULL, NULL, NULL, NULL, NULL, &b);
    FUZZ_CHECK(b.scope == RL_NONE && b.reset_ms == 0);
    for (int i = 0; i < 5; i++)
        free(f[i]);
    return 0;
}
