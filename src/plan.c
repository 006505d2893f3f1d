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

int plan_room(const struct plan_key *k)
{
    int room = k->budget - k->busiest;
    int late = k->budget - k->busiest_late - plan_headroom(k);
    return late < room ? late : room;
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
    int room = plan_room(k);
    if (room < 1)
        return PLAN_NO;
    /* not everybody who may read now can: share the early reads fairly */
    if (room < k->eligible && t->early_reads > 0 && k->starved)
        return PLAN_NO;
    return PLAN_EARLY;
}

int plan_demand(const struct pace_schedule *s, const struct plan_waiter *w, int64_t now)
{
    if (w->hold_until <= now)
        return 1;
    int reads = pace_in_episode(w->reads, w->last_start, now) ? w->reads : 0;
    int64_t t = reads > 0 ? w->last_start + pace_wait(s, reads) : now;
    if (t < now)
        t = now;
    int n = 0;
    while (t <= w->hold_until && n < PLAN_DEMAND_MAX) {
        n++;
        t += pace_wait(s, reads + n);
    }
    return n;
}

bool plan_ready(const struct pace_schedule *s, const struct plan_waiter *w, int64_t now)
{
    if (w->busy_until > now || w->not_before > now)
        return false;
    return !pace_in_episode(w->reads, w->last_start, now) || w->last_start + pace_wait(s, w->reads) <= now;
}

int64_t plan_next_gap(const struct pace_schedule *s, int reads)
{
    return pace_wait(s, reads + 1);
}

bool plan_drifted(const struct pace_schedule *s, int64_t resv_at, int reads, bool withheld, int64_t now)
{
    int64_t due = resv_at - pace_sum(s);
    for (int i = 1; i <= reads; i++)
        due += pace_wait(s, i);
    return withheld && now > due + PLAN_DRIFT_MS;
}

int64_t plan_arrival_rate(struct plan_key *k, int n_short, int64_t first_short, int n_long, int64_t first_long)
{
    k->arrivals = n_short;
    k->arrivals_long = n_long;
    /* the first to leave its span: the earliest of the last PLAN_RATE_MS,
     * or the earliest of the longer span when it is not one of those */
    int64_t thins = INT64_MAX;
    if (n_short > 0)
        thins = first_short + PLAN_RATE_MS + 1;
    if (n_long > n_short && first_long + PLAN_RATE_LONG_MS + 1 < thins)
        thins = first_long + PLAN_RATE_LONG_MS + 1;
    return thins;
}

int64_t plan_arrivals(struct plan_key *k, const int64_t *at, int n, int64_t now)
{
    int n_short = 0, n_long = 0;
    int64_t first_short = INT64_MAX, first_long = INT64_MAX;
    for (int i = 0; i < n; i++) {
        if (at[i] <= now - PLAN_RATE_LONG_MS)
            continue;
        n_long++;
        if (at[i] < first_long)
            first_long = at[i];
        if (at[i] > now - PLAN_RATE_MS) {
            n_short++;
            if (at[i] < first_short)
                first_short = at[i];
        }
    }
    return plan_arrival_rate(k, n_short, first_short, n_long, first_long);
}

int64_t plan_retry(const struct plan_tx *t, const int64_t *ev, int n, int64_t thins, int64_t recheck, int64_t now)
{
    int64_t r = now + recheck;
    if (n > 0 && ev[0] + PLAN_BUDGET_SPAN_MS + 1 < r)
        r = ev[0] + PLAN_BUDGET_SPAN_MS + 1;
    if (t->reserved && t->resv_at < r)
        r = t->resv_at;
    if (thins < r)
        r = thins;
    return r > now ? r : now + 1;
}

/* Line for line the C above (Lua's numbers are doubles: the divisions are
 * floored, as the C's integer ones of non-negative numbers are). */
int plan_lua(char *buf, size_t len)
{
    int n = snprintf(
        buf, len,
        "local PLAN_LEAD, PLAN_RATE, PLAN_RATE_LONG, PLAN_SPAN, PLAN_MIN_WAIT, PLAN_EPISODE, PLAN_DRIFT,"
        " PLAN_DEMAND_MAX = %d, %d, %d, %d, %d, %d, %d, %d\n"
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
        "local function plan_room(k)\n"
        "  local room = k.budget - k.busiest\n"
        "  local late = k.budget - k.busiest_late - plan_headroom(k)\n"
        "  if late < room then return late end\n"
        "  return room\n"
        "end\n"
        "local function plan_may_read(k, t, now)\n"
        "  if t.reserved and now >= t.resv_at then return 'last' end\n"
        "  if t.reserved and t.drifted and now + t.next_gap > t.resv_at then return 'no' end\n"
        "  if k.recent + k.demand + k.arrivals * k.schedule_reads <= k.budget then return 'early' end\n"
        "  local room = plan_room(k)\n"
        "  if room < 1 then return 'no' end\n"
        "  if room < k.eligible and t.early_reads > 0 and k.starved then return 'no' end\n"
        "  return 'early'\n"
        "end\n"
        "local function plan_wait_at(ws, step)\n"
        "  local w = ws[math.min(step, #ws - 1) + 1]\n"
        "  if w > PLAN_MIN_WAIT then return w end\n"
        "  return PLAN_MIN_WAIT\n"
        "end\n"
        "local function plan_in_episode(reads, last_start, now)\n"
        "  return reads > 0 and now - last_start <= PLAN_EPISODE\n"
        "end\n"
        "local function plan_demand(ws, w, now)\n"
        "  if w.hold_until <= now then return 1 end\n"
        "  local reads = 0\n"
        "  if plan_in_episode(w.reads, w.last_start, now) then reads = w.reads end\n"
        "  local t = now\n"
        "  if reads > 0 then t = w.last_start + plan_wait_at(ws, reads) end\n"
        "  if t < now then t = now end\n"
        "  local n = 0\n"
        "  while t <= w.hold_until and n < PLAN_DEMAND_MAX do\n"
        "    n = n + 1\n"
        "    t = t + plan_wait_at(ws, reads + n)\n"
        "  end\n"
        "  return n\n"
        "end\n"
        "local function plan_ready(ws, w, now)\n"
        "  if w.busy_until > now or w.not_before > now then return false end\n"
        "  return not plan_in_episode(w.reads, w.last_start, now) or w.last_start + plan_wait_at(ws, w.reads) <= now\n"
        "end\n"
        "local function plan_next_gap(ws, reads)\n"
        "  return plan_wait_at(ws, reads + 1)\n"
        "end\n"
        "local function plan_drifted(ws, resv_at, reads, withheld, now)\n"
        "  local due = resv_at\n"
        "  for i = 1, #ws do due = due - ws[i] end\n"
        "  for i = 1, reads do due = due + plan_wait_at(ws, i) end\n"
        "  return withheld and now > due + PLAN_DRIFT\n"
        "end\n"
        "local function plan_arrival_rate(k, n_short, first_short, n_long, first_long)\n"
        "  k.arrivals, k.arrivals_long = n_short, n_long\n"
        "  local thins = nil\n"
        "  if n_short > 0 then thins = first_short + PLAN_RATE + 1 end\n"
        "  if n_long > n_short and (not thins or first_long + PLAN_RATE_LONG + 1 < thins) then\n"
        "    thins = first_long + PLAN_RATE_LONG + 1\n"
        "  end\n"
        "  return thins\n"
        "end\n"
        "local function plan_arrivals(k, at, now)\n"
        "  local n_short, n_long, first_short, first_long = 0, 0, nil, nil\n"
        "  for i = 1, #at do\n"
        "    if at[i] > now - PLAN_RATE_LONG then\n"
        "      n_long = n_long + 1\n"
        "      if not first_long or at[i] < first_long then first_long = at[i] end\n"
        "      if at[i] > now - PLAN_RATE then\n"
        "        n_short = n_short + 1\n"
        "        if not first_short or at[i] < first_short then first_short = at[i] end\n"
        "      end\n"
        "    end\n"
        "  end\n"
        "  return plan_arrival_rate(k, n_short, first_short, n_long, first_long)\n"
        "end\n"
        "local function plan_retry(t, ev, thins, recheck, now)\n"
        "  local r = now + recheck\n"
        "  if #ev > 0 and ev[1] + PLAN_SPAN + 1 < r then r = ev[1] + PLAN_SPAN + 1 end\n"
        "  if t.reserved and t.resv_at < r then r = t.resv_at end\n"
        "  if thins and thins < r then r = thins end\n"
        "  if r > now then return r end\n"
        "  return now + 1\n"
        "end\n",
        PLAN_LEAD_MS, PLAN_RATE_MS, PLAN_RATE_LONG_MS, PLAN_BUDGET_SPAN_MS, PACE_MIN_WAIT_MS, PACE_EPISODE_MS,
        PLAN_DRIFT_MS, PLAN_DEMAND_MAX);
    return n < 0 || (size_t)n >= len ? -1 : n;
}
