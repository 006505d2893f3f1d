/* hold.c - see hold.h. */
#include "hold.h"

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

void hold_plan(const struct state_fact *f, bool ours, bool stopping, const struct hold_waiter *w,
               size_t n, int64_t now, bool *answer, struct hold_plan *plan)
{
    plan->claim = false;
    plan->wake = HOLD_NEVER;
    plan->nanswer = 0;
    bool known = f->final || f->not_found || stopping;
    /* a read can start now, for somebody who can use it */
    bool can_read = !ours && !known && !f->in_flight && f->wait != WAIT_FULL && f->next_read <= now;
    bool wanted = false;
    for (size_t i = 0; i < n; i++) {
        bool late = w[i].deadline <= now;
        if (!known && !late && can_read && (!w[i].json || !w[i].wants_read))
            wanted = true;
    }
    plan->claim = can_read && wanted;

    int64_t deadlines = HOLD_NEVER;
    bool html_waits_for_pace = false;
    for (size_t i = 0; i < n; i++) {
        bool a;
        if (known || w[i].deadline <= now)
            a = true;
        else if (f->in_flight)
            a = false; /* wait for the read in flight, up to the deadline */
        else if (plan->claim)
            a = w[i].json && w[i].wants_read; /* its read ended; the new one is for others */
        else if (w[i].json)
            a = true; /* no read now: the last known status */
        else if (f->wait == WAIT_FULL || f->next_read > w[i].deadline)
            a = true; /* no read can start before its deadline */
        else {
            a = false;
            html_waits_for_pace = true;
        }
        answer[i] = a;
        if (a)
            plan->nanswer++;
        else
            deadlines = min64(deadlines, w[i].deadline);
    }
    plan->wake = deadlines;
    if (f->in_flight && !ours && !known)
        plan->wake = min64(plan->wake, f->in_flight_until); /* another's read: its lease */
    if (html_waits_for_pace)
        plan->wake = min64(plan->wake, f->next_read);
}

void hold_step(struct state *st, const struct state_key *key, const char *id,
               const struct pace_schedule *sched, int budget, int64_t timeout_ms,
               const struct state_client *client, bool ours, bool stopping,
               struct hold_waiter *w, size_t n, int64_t now, bool *answer,
               struct state_ticket *ticket, struct hold_result *out)
{
    out->claimed = false;
    state_lookup_held(st, key, id, sched, budget, now, &out->fact);
    hold_plan(&out->fact, ours, stopping, w, n, now, answer, &out->plan);
    if (!out->plan.claim)
        return;
    if (!state_claim_client(st, key, id, sched, budget, timeout_ms, client, now, ticket, &out->fact)) {
        /* the claim saw newer facts (a read in flight, a pace, no room),
         * which allow no claim now: plan from them */
        hold_plan(&out->fact, ours, stopping, w, n, now, answer, &out->plan);
        if (out->plan.claim) { /* cannot happen by state_claim's contract; never spin on it */
            out->plan.claim = false;
            out->plan.wake = now + 1;
        }
        return;
    }
    out->claimed = true;
    out->plan.claim = false;
    /* the fact as the waiters now see it: our read is in flight */
    for (size_t i = 0; i < n; i++)
        if (!answer[i] && w[i].json)
            w[i].wants_read = true;
    int64_t d = HOLD_NEVER;
    for (size_t i = 0; i < n; i++)
        if (!answer[i])
            d = min64(d, w[i].deadline);
    out->plan.wake = d;
}
