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

bool plan_waits(const struct plan_facts *x, int64_t now)
{
    return x->holders > 0 && x->hold_until > now && x->cached_until <= now;
}

void plan_waiter_of(const struct plan_facts *x, struct plan_waiter *w)
{
    w->reads = x->reads;
    w->last_start = x->last_start;
    w->hold_until = x->holders > 0 ? x->hold_until : 0;
    w->busy_until = x->busy_until;
    w->not_before = x->floor_until > x->not_before ? x->floor_until : x->not_before;
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

bool plan_fresh_hold(int holders, int64_t hold_until, int64_t now)
{
    return holders <= 0 || hold_until <= now;
}

int64_t plan_hold_chance(int64_t deadline, int64_t now)
{
    int64_t at = deadline - PLAN_LEAD_MS;
    return at > now ? at : 0;
}

int64_t plan_later_chance(int holders, int64_t hold_until, int64_t now)
{
    int64_t at = hold_until - PLAN_LEAD_MS;
    if (holders <= 0 || at < now + PACE_MIN_WAIT_MS)
        return 0;
    return at;
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
        if (at[i] > now - PLAN_RATE_LONG_MS) {
            n_long++;
            if (at[i] < first_long)
                first_long = at[i];
        }
        if (at[i] > now - PLAN_RATE_MS) {
            n_short++;
            if (at[i] < first_short)
                first_short = at[i];
        }
    }
    return plan_arrival_rate(k, n_short, first_short, n_long, first_long);
}

void plan_tx_fill(const struct pace_schedule *s, bool waiting, int64_t resv_at, int reads, int early_reads,
                  bool withheld, int64_t now, struct plan_tx *t)
{
    t->reserved = waiting && resv_at != 0;
    t->resv_at = 0;
    if (waiting)
        t->resv_at = resv_at;
    t->early_reads = 0;
    if (reads > 0)
        t->early_reads = early_reads;
    t->next_gap = plan_next_gap(s, reads); /* the wait after this read */
    /* later than where the schedule, counted back from the reservation
     * (its last read), puts this read: the schedule no longer ends at the
     * reserved read */
    t->drifted = t->reserved && plan_drifted(s, resv_at, reads, withheld, now);
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
