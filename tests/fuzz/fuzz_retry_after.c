/* fuzz_retry_after.c - Retry-After values (rl_retry_after_ms).
 *
 * Input: the header's value (cut at a NUL byte), read at three wall
 * clocks (the epoch, 2026, 2100). Checked: -1 or a wait from 0 to
 * RL_MAX_WAIT_MS; delay-seconds give exactly that many seconds (capped). */
#include <ctype.h>
#include <stdbool.h>

#include "fuzz.h"
#include "ratelimit.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *v = malloc(size + 1);
    FUZZ_CHECK(v != NULL);
    memcpy(v, data, size);
    v[size] = '\0';
    static const int64_t nows[] = {0, 1791590400, 4102444800};
    for (size_t i = 0; i < sizeof nows / sizeof nows[0]; i++) {
        int64_t ms = rl_retry_after_ms(v, nows[i]);
        FUZZ_CHECK(ms == -1 || (ms >= 0 && ms <= RL_MAX_WAIT_MS));
        if (ms >= 0)
            FUZZ_CHECK(ms == RL_MAX_WAIT_MS || ms % 1000 == 0);
        /* a plain number of seconds, spaces around it allowed */
        const char *p = v;
        while (*p == ' ' || *p == '\t')
            p++;
        size_t nd = 0;
        while (isdigit((unsigned char)p[nd]))
            nd++;
        const char *q = p + nd;
        while (*q == ' ' || *q == '\t')
            q++;
        if (nd > 0 && nd <= 9 && *q == '\0') {
            long long s = strtoll(p, NULL, 10);
            FUZZ_CHECK(ms == (s * 1000 > RL_MAX_WAIT_MS ? RL_MAX_WAIT_MS : s * 1000));
        }
    }
    FUZZ_CHECK(rl_retry_after_ms(NULL, 0) == -1 && rl_retry_after_ms("", 0) == -1);
    free(v);
    return 0;
}
