/* state_budget.c - the budget ring (the last reads of a key) and the
 * plan's fields: who waits, what is reserved (plan.h decides). */
#include "state_private.h"
#include "budget.h"
#include "rules.h"

#include <stdlib.h>
#include <string.h>

/* When may the key read again under `budget` reads per any 60 s span? */
int64_t st_budget_next(const struct st_keyent *k, int budget, int64_t now)
{
    if (k == NULL || budget <= 0)
        return now;
    if (budget > STATE_BUDGET_MAX)
        budget = STATE_BUDGET_MAX;
    /* ring entries from newest backwards; the budget-th newest decides
     * (rules_budget_free) */
    if (k->ring_n < budget)
        return now;
    int32_t idx = (k->ring_head - budget + STATE_BUDGET_MAX * 2) % STATE_BUDGET_MAX;
    return rules_budget_free(k->ring_n, budget, k->ring[idx], now);
}

void state_key_usage(struct state *st, const struct state_key *key, int64_t now, int *reads, bool *paused)
{
    *reads = 0;
    *paused = false;
    st_lock(st, now);
    const struct st_keyent *k = st_key_find(st, key);
    for (int32_t j = 0; k != NULL && j < k->ring_n && j < STATE_BUDGET_MAX; j++) { /* newest first */
        if (k->ring[(k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX] < now - PLAN_BUDGET_SPAN_MS)
            break;
        (*reads)++;
    }
    *paused = k != NULL && k->paused_until > now;
    st_unlock(st);
}

int64_t st_budget_push(struct st_keyent *k, int64_t now)
{
    int64_t newest = k->ring_n > 0 ? k->ring[(k->ring_head - 1 + STATE_BUDGET_MAX) % STATE_BUDGET_MAX] : 0;
    now = budget_stamp(newest, now); /* a name of its own in Redis's count (budget.h) */
    k->ring[k->ring_head] = now;
    k->ring_kind[k->ring_head] = RING_ASKING; /* until st_budget_answered */
    k->ring_who[k->ring_head] = 0;
    k->ring_nf[k->ring_head] = 0;
    k->ring_head = (k->ring_head + 1) % STATE_BUDGET_MAX;
    if (k->ring_n < STATE_BUDGET_MAX)
        k->ring_n++;
    return now;
}

void st_budget_answered(struct st_keyent *k, int64_t t)
{
    for (int32_t j = 0; j < k->ring_n; j++) { /* newest first: it is one of the last */
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] == t) {
            if (k->ring_kind[i] == RING_ASKING)
                k->ring_kind[i] = RING_OWN;
            return;
        }
    }
}

bool st_budget_heard(struct st_keyent *k, uint32_t who, int64_t now)
{
    for (int32_t j = 0; j < k->ring_n; j++) {
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] <= now - PLAN_BUDGET_SPAN_MS)
            break;
        if (k->ring_kind[i] == RING_HEARD && k->ring_who[i] == who)
            return false;
    }
    int64_t at = st_budget_push(k, now);
    int32_t i = (k->ring_head - 1 + STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
    k->ring[i] = at;
    k->ring_kind[i] = RING_HEARD;
    k->ring_who[i] = who;
    return true;
}

void st_budget_not_found(struct st_keyent *k, int64_t t)
{
    for (int32_t j = 0; j < k->ring_n; j++) { /* newest first: it is one of the last */
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] == t) {
            k->ring_nf[i] = RING_NF_404;
            return;
        }
    }
}

void st_budget_mark_probe(struct st_keyent *k, int64_t t, bool probe)
{
    for (int32_t j = 0; j < k->ring_n; j++) { /* newest first: it is one of the last */
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] == t) {
            if (probe)
                k->ring_nf[i] = RING_NF_PROBE;
            else if (k->ring_nf[i] == RING_NF_PROBE)
                k->ring_nf[i] = RING_NF_NO;
            return;
        }
    }
}

int64_t st_budget_nf_next(const struct st_keyent *k, int budget, int64_t lease_ms, int64_t now)
{
    if (k == NULL || budget <= 0)
        return now;
    int cap = rules_not_found_cap(budget), n = 0;
    int64_t at[STATE_BUDGET_MAX];
    bool probe[STATE_BUDGET_MAX];
    for (int32_t j = 0; j < k->ring_n && n < cap; j++) { /* newest first */
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] <= now - PLAN_BUDGET_SPAN_MS)
            break;
        /* a read under way counts until its lease ends (its process may
         * have died: then it never ends) */
        bool p = k->ring_nf[i] == RING_NF_PROBE && k->ring[i] + lease_ms > now;
        if (k->ring_nf[i] == RING_NF_404 || p) {
            at[n] = k->ring[i];
            probe[n++] = p;
        }
    }
    return rules_nf_free(at, probe, n, cap, ST_PLAN_RETRY_MS, now);
}

bool st_budget_only_404(const struct st_keyent *k, int64_t now)
{
    int32_t n = 0;
    for (int32_t j = 0; j < k->ring_n; j++) {
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] <= now - STATE_KEY_IDLE_MS)
            break;
        if (k->ring_nf[i] != RING_NF_404)
            return false;
        n++;
    }
    return n > 0;
}

/* Take back one read started at t (the newest such) from the ring: the
 * newer ones move down a place. */
void st_budget_unpush(struct st_keyent *k, int64_t t)
{
    for (int32_t j = 0; j < k->ring_n; j++) { /* newest first */
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] != t)
            continue;
        for (; j > 0; j--) {
            int32_t newer = (i + 1) % STATE_BUDGET_MAX;
            k->ring[i] = k->ring[newer];
            k->ring_kind[i] = k->ring_kind[newer];
            k->ring_who[i] = k->ring_who[newer];
            k->ring_nf[i] = k->ring_nf[newer];
            i = newer;
        }
        k->ring_head = (k->ring_head - 1 + STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        k->ring_n--;
        return;
    }
}

/* ---- the budget plan (plan.h): who waits, what is reserved ---- */

/* Entry idx of the key's waiting set still waits at `now`. */
/* e as the plan reads a transaction (plan.h), whichever store keeps it */
static struct plan_facts tx_facts(const struct st_tx *e)
{
    struct plan_facts x = {.holders = e->holders, .hold_until = e->hold_until, .reads = e->reads,
                           .last_start = e->last_start};
    x.cached_until = e->not_found || tx_status_final((enum tx_status)e->status) ? e->known_until : 0;
    x.floor_until = rules_floor(e->last_end);
    x.busy_until = e->inflight_until > e->remote_until ? e->inflight_until : e->remote_until;
    x.not_before = e->not_before > e->remote_not_before ? e->not_before : e->remote_not_before;
    return x;
}

struct st_tx *st_waiting_tx(struct state *st, const struct st_keyent *k, int32_t idx, int64_t now)
{
    if (idx < 0 || idx >= st->txn)
        return NULL;
    struct st_tx *e = &st->txs[idx];
    if (e->used != 1 || memcmp(e->key.b, k->key.b, 16) != 0)
        return NULL;
    struct plan_facts x = tx_facts(e);
    return plan_waits(&x, now) ? e : NULL; /* (a cached answer: from the cache from now on) */
}

void st_waiting_add(struct state *st, struct st_keyent *k, int32_t idx, int64_t now)
{
    int32_t w = 0;
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        if (k->waiting[i] == idx)
            return;
        if (st_waiting_tx(st, k, k->waiting[i], now) != NULL)
            k->waiting[w++] = k->waiting[i]; /* drop the stale ones on the way */
    }
    k->nwaiting = w;
    if (w < ST_WAITING_MAX)
        k->waiting[k->nwaiting++] = idx;
}

/* e as the plan counts a waiting transaction (plan.h). */
static struct plan_waiter tx_waiter(const struct st_tx *e)
{
    struct plan_facts x = tx_facts(e);
    struct plan_waiter w;
    plan_waiter_of(&x, &w);
    return w;
}

/* The pace alone (and its own windows) let e read now. */
static bool tx_may_read_now(const struct st_tx *e, const struct pace_schedule *sched, int64_t now)
{
    struct plan_waiter w = tx_waiter(e);
    return plan_ready(sched, &w, now);
}

static int cmp_time(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* The times the key's budget spans hold (reads of the last 60 s and the
 * reservations of waiting transactions, an overdue one at `now`), sorted,
 * into ev (capacity STATE_BUDGET_MAX + ST_WAITING_MAX). Returns how many. */
static int plan_events(struct state *st, const struct st_keyent *k, int64_t now, int64_t *ev)
{
    /* the ring's reads come in the order they started, all but a few
     * (processes' clocks read a moment before the lock): sorted by
     * insertion at the cost of a pass; the reservations, in no order,
     * sorted apart and merged in. This runs at every look of a held
     * request while the budget is planned. */
    int n = 0;
    for (int32_t i = k->ring_n - 1; i >= 0; i--) { /* oldest first */
        int64_t t = k->ring[(k->ring_head - 1 - i + STATE_BUDGET_MAX * 2) % STATE_BUDGET_MAX];
        if (t <= now - PLAN_BUDGET_SPAN_MS)
            continue;
        int j = n++;
        for (; j > 0 && ev[j - 1] > t; j--)
            ev[j] = ev[j - 1];
        ev[j] = t;
    }
    int64_t resv[ST_WAITING_MAX];
    int m = 0;
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        const struct st_tx *e = st_waiting_tx(st, k, k->waiting[i], now);
        if (e != NULL && e->resv_at != 0)
            resv[m++] = e->resv_at > now ? e->resv_at : now;
    }
    if (m == 0)
        return n;
    qsort(resv, (size_t)m, sizeof *resv, cmp_time);
    for (int i = n - 1, j = m - 1, o = n + m - 1; j >= 0; o--) /* merged from the end, in place */
        ev[o] = i >= 0 && ev[i] > resv[j] ? ev[i--] : resv[j--];
    return n + m;
}

/* Reads e's schedule still wants from `now` to its latest deadline (one,
 * for a transaction not held: the read asked for). */
static int tx_demand(const struct st_tx *e, const struct pace_schedule *sched, int64_t now)
{
    if (e == NULL)
        return 1;
    struct plan_waiter w = tx_waiter(e);
    return plan_demand(sched, &w, now);
}

/* The plan's view of key k for transaction self (NULL: not tracked yet). */
static void plan_gather(struct state *st, const struct st_keyent *k, const struct st_tx *self,
                        const struct pace_schedule *sched, int budget, int64_t now, struct plan_key *pk,
                        int64_t *arrivals_change, int64_t *ev, int *nev)
{
    memset(pk, 0, sizeof *pk);
    pk->budget = budget > STATE_BUDGET_MAX ? STATE_BUDGET_MAX : budget;
    pk->hold_ms = pace_hold_ms(sched);
    pk->eligible = 1; /* the one asking */
    int64_t at[ST_ARRIVALS];
    for (int32_t i = 0; i < k->arr_n; i++)
        at[i] = k->arrivals[(k->arr_head - 1 - i + ST_ARRIVALS * 2) % ST_ARRIVALS];
    *arrivals_change = plan_arrivals(pk, at, k->arr_n, now);
    pk->demand = tx_demand(self, sched, now);
    pk->schedule_reads = pace_reads_within(sched, pace_hold_ms(sched));
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        const struct st_tx *e = st_waiting_tx(st, k, k->waiting[i], now);
        if (e == NULL || e == self)
            continue;
        if (e->inflight_until <= now && pk->demand <= pk->budget) /* past the budget the sum decides nothing */
            pk->demand += tx_demand(e, sched, now);
        if (tx_may_read_now(e, sched, now)) {
            pk->eligible++;
            if (e->early_reads == 0)
                pk->starved = true;
        }
    }
    *nev = plan_events(st, k, now, ev);
    for (int i = 0; i < *nev && ev[i] <= now; i++)
        pk->recent += ev[i] > now - PLAN_BUDGET_SPAN_MS; /* reads (and overdue reservations) */
    pk->busiest = plan_busiest(ev, *nev, now, INT64_MIN);
    pk->busiest_late = plan_busiest(ev, *nev, now, now - plan_late_span(pk));
}

/* The plan's verdict on a read of e now (the pace allowing one); on
 * PLAN_NO, *retry is when it may change, and *own when e's own part of it
 * (its reservation) does (INT64_MAX: nothing of its own). */
enum plan_read st_plan_verdict(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                                   const struct pace_schedule *sched, int budget, int64_t now, int64_t *retry,
                                   int64_t *own)
{
    struct plan_key pk;
    int64_t oldest, ev[STATE_BUDGET_MAX + ST_WAITING_MAX];
    int nev;
    plan_gather(st, k, e, sched, budget, now, &pk, &oldest, ev, &nev);
    struct plan_tx pt;
    bool waiting = e != NULL && st_waiting_tx(st, k, (int32_t)(e - st->txs), now) != NULL;
    int reads = e != NULL && pace_in_episode(e->reads, e->last_start, now) ? e->reads : 0;
    plan_tx_fill(sched, waiting, e != NULL ? e->resv_at : 0, reads, e != NULL ? e->early_reads : 0,
                 e != NULL && e->withheld, now, &pt);
    enum plan_read r = plan_may_read(&pk, &pt, now);
    if (r != PLAN_NO)
        return r;
    /* what can change it: a read leaving the spans, the rush ending, its
     * own reservation's time, or another's turn */
    *retry = plan_retry(&pt, ev, nev, oldest, ST_PLAN_RETRY_MS, now);
    *own = pt.reserved && pt.resv_at > now ? pt.resv_at : INT64_MAX;
    return PLAN_NO;
}

/* The key-wide part of every waiting transaction's verdict (see state.h,
 * state_plan_open): plan_gather() for nobody in particular. */
bool st_plan_open(struct state *st, const struct st_keyent *k, const struct pace_schedule *sched, int budget,
                  int64_t now, int64_t *retry)
{
    struct plan_key pk;
    int64_t thins, ev[STATE_BUDGET_MAX + ST_WAITING_MAX];
    int nev;
    plan_gather(st, k, NULL, sched, budget, now, &pk, &thins, ev, &nev);
    /* when it looks again: as each of them would (plan_retry), a read
     * leaving the spans, the rush thinning, or the plan's recheck; not
     * sooner, so that a withheld read starts when it always has */
    struct plan_tx nobody = {0};
    *retry = plan_retry(&nobody, ev, nev, thins, ST_PLAN_RETRY_MS, now);
    /* plan_may_read() allows an early read only when everything is paid
     * for or there is room; nobody's demand (1) stands for the asker's own
     * and is taken back, so that this says yes whenever any of them may */
    return pk.recent + pk.demand - 1 + pk.arrivals * pk.schedule_reads <= pk.budget || plan_room(&pk) >= 1;
}

/* May e (waiting) reserve a last-chance read at `at`? */
bool st_plan_reserve_at(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                            const struct pace_schedule *sched, int budget, int64_t at, int64_t now)
{
    struct plan_key pk;
    int64_t oldest, ev[STATE_BUDGET_MAX + ST_WAITING_MAX];
    int nev;
    plan_gather(st, k, e, sched, budget, now, &pk, &oldest, ev, &nev);
    return plan_may_reserve(&pk, plan_busiest(ev, nev, at, INT64_MIN));
}

