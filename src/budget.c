/* budget.c - see budget.h. */
#include "budget.h"

#include <stdio.h>

int budget_share(int budget, int hosts, bool together)
{
    if (together)
        return budget;
    int share = budget / (hosts > 0 ? hosts : 1);
    return share > 0 ? share : 1;
}

int64_t budget_grace_ms(bool sentinel)
{
    return sentinel ? BUDGET_GRACE_SENTINEL_MS : BUDGET_GRACE_MS;
}

int64_t budget_stamp(int64_t newest, int64_t now)
{
    return newest >= now ? newest + 1 : now;
}

void budget_member(char *out, size_t cap, const char *host_hex, int64_t at)
{
    snprintf(out, cap, "%.16s:%lld", host_hex, (long long)at);
}

int budget_seed(const int64_t *at, int n, int64_t now, int *idx, int64_t *ago)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        /* in the span (now - BUDGET_SPAN_MS, now]; a time a little ahead of
         * now (budget_stamp in a burst) counts as now */
        if (at[i] <= now - BUDGET_SPAN_MS)
            continue;
        idx[m] = i;
        ago[m] = at[i] < now ? now - at[i] : 0;
        m++;
    }
    return m;
}

bool budget_count_lost(int64_t own_last, int64_t now)
{
    return own_last > 0 && now - own_last < BUDGET_MARK_KEEP_MS;
}
