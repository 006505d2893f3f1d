/* plan.c - see plan.h. */
#include "plan.h"

int64_t plan_late_span(const struct plan_key *k)
{
    int64_t span = PLAN_BUDGET_SPAN_MS - (k->hold_ms - PLAN_LEAD_MS);
    return span > 0 ? span : 0;
}

int plan_headroom(const struct plan_key *k)
{
    int64_t span = plan_late_span(k);
    int64_t a = (int64_t)k->arrivals * span / PLAN_RATE_MS;
    int64_t b = (int64_t)k->arrivals_long * span / PLAN_RATE_LONG_MS;
    int64_t h = a > b ? a : b;
    return h > k->budget ? k->budget : (int)h;
}

bool plan_may_reserve(const struct plan_key *k, int busiest)
{
    return busiest + 1 <= k->budget;
}

int plan_busiest(const int64_t *ev, int n, int64_t t, int64_t from)
{
    /* the spans worth trying start at an event in [lo, t], or at lo itself */
    int64_t lo = t - PLAN_BUDGET_SPAN_MS + 1;
    if (from > lo)
        lo = from;
    int best = 0, i = 0, j = 0;
    while (i < n && ev[i] < lo)
        i++;
    for (int64_t w = lo;;) {
        while (j < n && ev[j] < w + PLAN_BUDGET_SPAN_MS)
            j++;
        if (j - i > best)
            best = j - i;
        /* the next start: the next event after w, if it still holds t */
        while (i < n && ev[i] <= w)
            i++;
        if (i >= n || ev[i] > t)
            break;
        w = ev[i];
    }
    return best;
}

enum plan_read plan_may_read(const struct plan_key *k, const struct plan_tx *t, int64_t now)
{
    if (t->reserved && now >= t->resv_at)
        return PLAN_LAST_CHANCE;
    /* a transaction the plan held back, read later than its schedule, must
     * not take an early read whose next wait pushes its reserved one past
     * the deadline; on its schedule the reserved one is where the schedule
     * ends (and a delay the plan did not make, a Retry-After, is the
     * schedule's own business) */
    if (t->reserved && t->drifted && now + t->next_gap > t->resv_at)
        return PLAN_NO;
    /* plenty: every held request's schedule is paid for, and so are those
     * of the buyers the last second's arrivals say come in the next one */
    if (k->recent + k->demand + k->arrivals * k->schedule_reads <= k->budget)
        return PLAN_EARLY;
    int room = k->budget - k->busiest;
    int late = k->budget - k->busiest_late - plan_headroom(k);
    if (late < room)
        room = late;
    if (room < 1)
        return PLAN_NO;
    /* not everybody who may read now can: share the early reads fairly */
    if (room < k->eligible && t->early_reads > 0 && k->starved)
        return PLAN_NO;
    return PLAN_EARLY;
}
