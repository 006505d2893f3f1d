/* plan.c - see plan.h. */
#include "plan.h"

#include <stdio.h>

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
    /* the spans worth trying start at lo, at an event in (lo, t], or at t
     * itself (the one that reaches furthest: times after t, reservations,
     * may fill it more than any span starting earlier) */
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
        /* the next start: the next event after w while it holds t, then t */
        while (i < n && ev[i] <= w)
            i++;
        int64_t next = i < n && ev[i] <= t ? ev[i] : t;
        if (next <= w)
            break;
        w = next;
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

/* Line for line the C above (Lua's numbers are doubles: the divisions are
 * floored, as the C's integer ones of non-negative numbers are). */
int plan_lua(char *buf, size_t len)
{
    int n = snprintf(
        buf, len,
        "local PLAN_LEAD, PLAN_RATE, PLAN_RATE_LONG, PLAN_SPAN = %d, %d, %d, %d\n"
        "local function plan_late_span(k)\n"
        "  local span = PLAN_SPAN - (k.hold_ms - PLAN_LEAD)\n"
        "  if span > 0 then return span end\n"
        "  return 0\n"
        "end\n"
        "local function plan_headroom(k)\n"
        "  local span = plan_late_span(k)\n"
        "  local a = math.floor(k.arrivals * span / PLAN_RATE)\n"
        "  local b = math.floor(k.arrivals_long * span / PLAN_RATE_LONG)\n"
        "  local h = a > b and a or b\n"
        "  if h > k.budget then return k.budget end\n"
        "  return h\n"
        "end\n"
        "local function plan_may_reserve(k, busiest)\n"
        "  return busiest + 1 <= k.budget\n"
        "end\n"
        "local function plan_busiest(ev, t, from)\n"
        "  local lo = t - PLAN_SPAN + 1\n"
        "  if from and from > lo then lo = from end\n"
        "  local n, best, i, j = #ev, 0, 1, 1\n"
        "  while i <= n and ev[i] < lo do i = i + 1 end\n"
        "  local w = lo\n"
        "  while true do\n"
        "    while j <= n and ev[j] < w + PLAN_SPAN do j = j + 1 end\n"
        "    if j - i > best then best = j - i end\n"
        "    while i <= n and ev[i] <= w do i = i + 1 end\n"
        "    local nx = t\n"
        "    if i <= n and ev[i] <= t then nx = ev[i] end\n"
        "    if nx <= w then break end\n"
        "    w = nx\n"
        "  end\n"
        "  return best\n"
        "end\n"
        "local function plan_may_read(k, t, now)\n"
        "  if t.reserved and now >= t.resv_at then return 'last' end\n"
        "  if t.reserved and t.drifted and now + t.next_gap > t.resv_at then return 'no' end\n"
        "  if k.recent + k.demand + k.arrivals * k.schedule_reads <= k.budget then return 'early' end\n"
        "  local room = k.budget - k.busiest\n"
        "  local late = k.budget - k.busiest_late - plan_headroom(k)\n"
        "  if late < room then room = late end\n"
        "  if room < 1 then return 'no' end\n"
        "  if room < k.eligible and t.early_reads > 0 and k.starved then return 'no' end\n"
        "  return 'early'\n"
        "end\n",
        PLAN_LEAD_MS, PLAN_RATE_MS, PLAN_RATE_LONG_MS, PLAN_BUDGET_SPAN_MS);
    return n < 0 || (size_t)n >= len ? -1 : n;
}
