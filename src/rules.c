/* rules.c - see rules.h. */
#include "rules.h"

#include "budget.h"

#include <stdio.h>

#include "plan.h"

int64_t rules_jitter_max(int64_t pause_ms)
{
    return pause_ms / 10;
}

static int64_t clamp_jitter(int64_t j, int64_t pause_ms)
{
    int64_t max = rules_jitter_max(pause_ms);
    return j < 0 ? 0 : j > max ? max : j;
}

int64_t rules_status_ttl(enum tx_status s)
{
    if (s == TXS_EXPIRED)
        return RULES_TTL_EXPIRED_MS;
    return tx_status_final(s) ? RULES_TTL_FINAL_MS : 0;
}

int64_t rules_ttl_left(enum tx_status s, int64_t at, int64_t now)
{
    int64_t left = rules_status_ttl(s) - (now > at ? now - at : 0);
    return left > 0 ? left : 0;
}

static void extend(int64_t *span, int64_t v)
{
    if (v > *span)
        *span = v;
}

void rules_outcome(const struct outcome *oc, int64_t pace_start, int64_t now, int64_t key_jitter,
                   int64_t host_jitter, struct rules_effect *out)
{
    *out = (struct rules_effect){.status = TXS_NONE};
    switch (oc->kind) {
    case OUT_STATUS:
        out->has_status = true;
        out->status = oc->status;
        out->final = tx_status_final(oc->status);
        out->ttl_ms = rules_status_ttl(oc->status);
        break;
    case OUT_NOT_FOUND:
        out->not_found = true;
        out->charge = true;
        out->ttl_ms = RULES_TTL_NOT_FOUND_MS;
        break;
    case OUT_TX_LIMITED:
        out->retry_ms = oc->retry_after_ms > 0 ? oc->retry_after_ms : RULES_RETRY_DEFAULT_MS;
        break;
    case OUT_KEY_LIMITED:
        out->key_pause_ms = RULES_KEY_PAUSE_MS + clamp_jitter(key_jitter, RULES_KEY_PAUSE_MS);
        break;
    case OUT_UNAUTHORIZED:
        out->key_pause_ms = RULES_UNAUTH_PAUSE_MS;
        out->unauthorized = true;
        break;
    case OUT_AUTH_BLOCKED:
        out->host_pause_ms = RULES_HOST_PAUSE_MS + clamp_jitter(host_jitter, RULES_HOST_PAUSE_MS);
        extend(&out->host_pause_ms, oc->retry_after_ms);
        break;
    case OUT_REJECTED:
        /* no further read until the episode of that read ends */
        out->rejected = true;
        extend(&out->retry_ms, pace_start + PACE_EPISODE_MS + 1 - now);
        break;
    case OUT_NO_ANSWER:
        break;
    }
    /* only an authenticated read gets these answers: Kasera took the key */
    out->key_accepted = oc->kind == OUT_STATUS || oc->kind == OUT_NOT_FOUND || oc->kind == OUT_TX_LIMITED ||
                        oc->kind == OUT_KEY_LIMITED;
    /* what Kasera's failed-authentication limiter counted (an answer
     * that never came, or a 5xx, is a fault of the way, not of the key:
     * counting it would stop a new key's reads for a minute after five
     * timeouts) */
    out->auth_failed = oc->kind == OUT_UNAUTHORIZED || oc->kind == OUT_AUTH_BLOCKED;
    /* a stated exhausted window: honoured for what it describes */
    if (oc->rl.scope == RL_TX)
        extend(&out->retry_ms, oc->rl.reset_ms);
    else if (oc->rl.scope == RL_KEY)
        extend(&out->key_pause_ms, oc->rl.reset_ms);
}

int64_t rules_auth_next(const int64_t *until, int n, int allowance, int64_t now)
{
    int64_t live[RULES_AUTH_FAILS_MAX];
    int c = 0;
    if (allowance < RULES_AUTH_FAILS_MIN)
        allowance = RULES_AUTH_FAILS_MIN;
    if (allowance > RULES_AUTH_FAILS_MAX)
        allowance = RULES_AUTH_FAILS_MAX;
    for (int i = 0; i < n && i < RULES_AUTH_FAILS_MAX; i++) {
        if (until[i] <= now)
            continue;
        int j = c++; /* kept in order, earliest first */
        while (j > 0 && live[j - 1] > until[i]) {
            live[j] = live[j - 1];
            j--;
        }
        live[j] = until[i];
    }
    /* once the c - allowance + 1 earliest have run out, allowance - 1 count */
    return c < allowance ? now : live[c - allowance];
}

bool rules_may_replace(enum tx_status cur, bool cached, enum tx_status s, bool told)
{
    if (!tx_status_final(cur) || (!told && !cached))
        return true;
    if (s == cur)
        return true;
    if (!tx_status_final(s))
        return false;
    return cur == TXS_EXPIRED;
}

int64_t rules_hold_ms(const struct pace_schedule *s)
{
    return pace_hold_ms(s);
}

int64_t rules_tx_limited_wait(int64_t retry_ms, int64_t wait_ms, int refused)
{
    if (retry_ms < 0)
        retry_ms = 0;
    if (refused <= 0)
        return retry_ms;
    return retry_ms + (wait_ms > 0 ? wait_ms : 0) + RULES_APART_MARGIN_MS;
}

int64_t rules_floor(int64_t last_end)
{
    return last_end > 0 ? last_end + RULES_FLOOR_MS : 0;
}

void rules_raise(struct rules_next *n, int64_t t, int why)
{
    if (t > n->at) {
        n->at = t;
        n->why = why;
    }
}

void rules_next_read(const struct pace_schedule *s, const struct rules_gate *g, int64_t now, struct rules_next *n)
{
    n->at = now;
    n->why = RULES_WHY_NONE;
    rules_raise(n, pace_next_read(s, g->reads, g->last_start, now), RULES_WHY_PACE);
    rules_raise(n, rules_floor(g->last_end), RULES_WHY_PACE);
    rules_raise(n, g->not_before, RULES_WHY_RETRY);
    rules_raise(n, g->key_paused_until, RULES_WHY_KEY_PAUSE);
}

int64_t rules_nf_free(const int64_t *at, const bool *probe, int n, int cap, int64_t recheck, int64_t now)
{
    if (n < cap)
        return now;
    int64_t t = at[cap - 1] + PLAN_BUDGET_SPAN_MS + 1;
    for (int i = 0; i < cap - 1; i++)
        if (probe[i] && now + recheck < t)
            t = now + recheck;
    return t > now ? t : now;
}

int64_t rules_nf_until(int64_t free_at, int holders, int64_t hold_until, int64_t resv_at, int64_t now)
{
    int64_t last = holders > 0 && hold_until > now ? hold_until - PLAN_LEAD_MS : 0;
    if (free_at <= now || (last > 0 && last <= now))
        return now;
    if (last > now && last < free_at)
        free_at = last;
    if (resv_at > now && resv_at < free_at)
        free_at = resv_at;
    return free_at;
}

int rules_held(int64_t final_until, int64_t nf_until, int64_t busy_until, int64_t now)
{
    if (final_until > now)
        return RULES_HELD_FINAL;
    if (nf_until > now)
        return RULES_HELD_NOT_FOUND;
    if (busy_until > now)
        return RULES_HELD_BUSY;
    return RULES_HELD_NONE;
}

int64_t rules_client_blocked(const int64_t *blocked_until, int n, int64_t now)
{
    int64_t last = 0;
    for (int i = 0; i < n; i++)
        if (blocked_until[i] > now && blocked_until[i] > last)
            last = blocked_until[i];
    return last;
}

int64_t rules_client_next(int counted, int64_t first_flight_end, int allowance, int64_t recheck, int64_t now)
{
    if (counted < allowance)
        return now;
    int64_t at = now + recheck;
    if (first_flight_end > now && first_flight_end < at)
        at = first_flight_end;
    return at;
}

bool rules_client_blocks(int64_t blocked_until, int counted, int allowance, int64_t now)
{
    return blocked_until <= now && counted >= allowance;
}

int64_t rules_budget_free(int used, int budget, int64_t nth_newest, int64_t now)
{
    if (used < budget)
        return now;
    int64_t t = nth_newest + PLAN_BUDGET_SPAN_MS + 1;
    return t > now ? t : now;
}

bool rules_read_current(int64_t serial, int64_t latest_serial, int64_t lease_until, int64_t now)
{
    return serial != 0 && serial == latest_serial && now <= lease_until;
}

bool rules_read_records(const struct rules_found *f)
{
    if (f->not_found) {
        if (f->current)
            return !f->final_cached; /* a 404 cannot hide a cached final status */
        return !f->older && !f->known && !f->nf_cached; /* nothing known at all */
    }
    if (f->current)
        return f->forward || !f->final_cached;
    if (f->final) /* a final status stays true: only forward, never backwards */
        return f->forward;
    /* a late pending (or unknown word) only fills what nothing else says */
    return !f->older && !f->known_final && !f->nf_cached;
}

int rules_not_found_cap(int budget)
{
    int cap = budget / RULES_NOT_FOUND_SHARE;
    return cap > 1 ? cap : 1;
}

int rules_lua_prelude(char *buf, size_t len)
{
    size_t off = 0;
    int n = snprintf(buf, len,
                     "local MIN_WAIT, EPISODE, PLAN_RECHECK, BUDGET_SPAN = %d, %d, %d, %d\n"
                     "local MARGIN = %lld\n" /* Redis keeps a key this much longer than it matters */
                     "local KEEP = EPISODE + MARGIN\n"
                     "local MARK_KEEP = %lld\n" /* budget.h */
                     "local R = {}\n",
                     PACE_MIN_WAIT_MS, PACE_EPISODE_MS, RULES_PLAN_RECHECK_MS,
                     PLAN_BUDGET_SPAN_MS, (long long)RULES_KEEP_MARGIN_MS,
                     (long long)BUDGET_MARK_KEEP_MS);
    if (n < 0 || (size_t)n >= len)
        return -1;
    off = (size_t)n;
    /* the replace table of final statuses, told (rules_may_replace) */
    for (int c = TXS_PENDING; c <= TXS_EXPIRED; c++) {
        if (!tx_status_final((enum tx_status)c))
            continue;
        n = snprintf(buf + off, len - off, "R['%s'] = {", tx_status_word((enum tx_status)c));
        if (n < 0 || (size_t)n >= len - off)
            return -1;
        off += (size_t)n;
        for (int s = TXS_PENDING; s <= TXS_EXPIRED; s++) {
            if (!rules_may_replace((enum tx_status)c, true, (enum tx_status)s, true))
                continue;
            n = snprintf(buf + off, len - off, "['%s'] = true, ", tx_status_word((enum tx_status)s));
            if (n < 0 || (size_t)n >= len - off)
                return -1;
            off += (size_t)n;
        }
        n = snprintf(buf + off, len - off, "}\n");
        if (n < 0 || (size_t)n >= len - off)
            return -1;
        off += (size_t)n;
    }
    return (int)off;
}
