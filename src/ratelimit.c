/* ratelimit.c - see ratelimit.h. */
#include "ratelimit.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Parse a non-negative decimal integer filling the whole (trimmed) string.
 * Returns -1 on anything else. Values are capped to avoid overflow. */
static long long parse_uint(const char *s)
{
    long long v = 0;
    if (s == NULL)
        return -1;
    while (*s == ' ' || *s == '\t')
        s++;
    if (!isdigit((unsigned char)*s))
        return -1;
    for (; isdigit((unsigned char)*s); s++) {
        if (v < 1000000000LL)
            v = v * 10 + (*s - '0');
    }
    while (*s == ' ' || *s == '\t')
        s++;
    return *s == '\0' ? v : -1;
}

static int64_t cap_ms(long long seconds)
{
    if (seconds < 0)
        return 0;
    if (seconds * 1000LL > RL_MAX_WAIT_MS)
        return RL_MAX_WAIT_MS;
    return (int64_t)seconds * 1000;
}

int64_t rl_retry_after_ms(const char *value, int64_t now_wall)
{
    static const char *const forms[] = {
        "%a, %d %b %Y %H:%M:%S GMT", /* IMF-fixdate */
        "%A, %d-%b-%y %H:%M:%S GMT", /* RFC 850 */
        "%a %b %d %H:%M:%S %Y",      /* asctime */
    };
    if (value == NULL || *value == '\0')
        return -1;
    long long secs = parse_uint(value);
    if (secs >= 0)
        return cap_ms(secs);
    for (size_t i = 0; i < sizeof forms / sizeof forms[0]; i++) {
        struct tm tm;
        memset(&tm, 0, sizeof tm);
        const char *end = strptime(value, forms[i], &tm);
        if (end == NULL)
            continue;
        while (*end == ' ')
            end++;
        if (*end != '\0')
            continue;
        time_t t = timegm(&tm);
        if (t == (time_t)-1)
            return -1;
        return cap_ms((long long)t - now_wall);
    }
    return -1;
}

/* Structured-field helpers: find parameter `name` (e.g. "r") in one list
 * member `item` (a string up to a comma); returns its integer value or -1. */
static long long sf_param(const char *item, size_t len, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < len; i++) {
        if (item[i] != ';')
            continue;
        size_t j = i + 1;
        while (j < len && item[j] == ' ')
            j++;
        if (j + nl < len && strncmp(item + j, name, nl) == 0 && item[j + nl] == '=') {
            char num[24];
            size_t k = j + nl + 1, n = 0;
            while (k < len && n + 1 < sizeof num && item[k] != ';' && item[k] != ',')
                num[n++] = item[k++];
            num[n] = '\0';
            return parse_uint(num);
        }
    }
    return -1;
}

/* The quoted name at the start of a list member, copied into out. */
static void sf_name(const char *item, size_t len, char *out, size_t cap)
{
    size_t i = 0, n = 0;
    while (i < len && item[i] == ' ')
        i++;
    if (i < len && item[i] == '"') {
        for (i++; i < len && item[i] != '"' && n + 1 < cap; i++)
            out[n++] = item[i];
    } else {
        for (; i < len && item[i] != ';' && n + 1 < cap; i++)
            out[n++] = item[i];
    }
    out[n] = '\0';
}

/* The quota q of the policy called `name` in a RateLimit-Policy list, or -1. */
static long long policy_quota(const char *policy, const char *name)
{
    if (policy == NULL)
        return -1;
    const char *p = policy;
    while (*p) {
        size_t len = strcspn(p, ",");
        char pname[64];
        sf_name(p, len, pname, sizeof pname);
        if (strcmp(pname, name) == 0)
            return sf_param(p, len, "q");
        p += len;
        if (*p == ',')
            p++;
    }
    return -1;
}

static void exhaust(struct rl_info *out, enum rl_scope scope, long long reset_s)
{
    int64_t ms = cap_ms(reset_s);
    /* A key-wide exhaustion outranks a per-transaction one: it stops more. */
    if (out->scope == RL_NONE || scope == RL_KEY || (out->scope == RL_TX && ms > out->reset_ms)) {
        if (out->scope == RL_KEY && scope == RL_TX)
            return;
        if (out->scope == scope && ms < out->reset_ms)
            return;
        out->scope = scope;
        out->reset_ms = ms;
    }
}

void rl_parse(const char *limit, const char *remaining, const char *reset,
              const char *sf_ratelimit, const char *sf_policy, struct rl_info *out)
{
    out->scope = RL_NONE;
    out->reset_ms = 0;
    (void)limit; /* the legacy limit adds nothing: these headers describe the tx window */

    long long rem = parse_uint(remaining), rst = parse_uint(reset);
    if (rem == 0 && rst >= 0)
        exhaust(out, RL_TX, rst);

    if (sf_ratelimit != NULL) {
        const char *p = sf_ratelimit;
        while (*p) {
            size_t len = strcspn(p, ",");
            long long r = sf_param(p, len, "r"), t = sf_param(p, len, "t");
            if (r == 0 && t >= 0) {
                char name[64];
                sf_name(p, len, name, sizeof name);
                exhaust(out, policy_quota(sf_policy, name) == 1 ? RL_TX : RL_KEY, t);
            }
            p += len;
            if (*p == ',')
                p++;
        }
    }
}
