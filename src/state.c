/* state.c - see state.h: the public calls. The region's layout and the
 * internal calls are in state_private.h; what an outcome does, which status
 * replaces which, a hold's length and the floor are rules.c's. */
#include "state_private.h"

#include <string.h>

#include "siphash.h"
#include "util.h"

uint64_t state_siphash(const uint8_t k[16], const void *data, size_t len)
{
    return siphash24(k, data, len);
}

/* A slot of the host's allowance of 401s for the read of claim `serial`
 * (0: a read that ended), counting until `until`: a free one, else (every
 * slot counts: only for a 401 the allowance did not gate) the one that
 * runs out first. */
static void auth_take(struct state *st, uint64_t serial, int64_t until, int64_t now)
{
    int best = 0;
    for (int i = 0; i < STATE_AUTH_FAILS_MAX; i++) {
        if (st->h->auth_until[i] <= now) {
            best = i;
            break;
        }
        if (st->h->auth_until[i] < st->h->auth_until[best])
            best = i;
    }
    st->h->auth_until[best] = until;
    st->h->auth_serial[best] = serial;
}

/* The read of claim `serial` ended with effect fx at `now` (fx NULL: it
 * was never made): its slot of the allowance, if it holds one, counts
 * from now when the read may have failed authentication, else is given
 * back; a 401 of a read that held none (an accepted key's) takes one. */
static void auth_land(struct state *st, uint64_t serial, const struct rules_effect *fx, int64_t now)
{
    int slot = -1;
    for (int i = 0; i < STATE_AUTH_FAILS_MAX && serial != 0; i++)
        if (st->h->auth_serial[i] == serial)
            slot = i;
    if (slot >= 0) {
        st->h->auth_serial[slot] = 0;
        st->h->auth_until[slot] = fx != NULL && fx->auth_failed ? now + STATE_AUTH_SPAN_MS : 0;
    } else if (fx != NULL && fx->unauthorized) {
        auth_take(st, 0, now + STATE_AUTH_SPAN_MS, now);
    }
}

static void raise_to(int64_t *next, enum state_wait *why, int64_t t, enum state_wait reason)
{
    if (t > *next) {
        *next = t;
        *why = reason;
    }
}

/* The fact about e (NULL: untracked) of key k (NULL: unused) at `now`;
 * *kind (may be NULL) says what a read started now would be. Writes
 * nothing: a lookup is a query (a withheld read is recorded by the claim,
 * or by state_lookup_held). */
static void compute(struct state *st, struct st_tx *e, struct st_keyent *k, const struct pace_schedule *sched,
                    int budget, int64_t now, struct state_fact *f, enum plan_read *kind)
{
    if (kind != NULL)
        *kind = PLAN_EARLY;
    memset(f, 0, sizeof *f);
    f->status = TXS_NONE;
    f->next_read = now;
    util_copy(f->status_word, sizeof f->status_word, e != NULL && e->status != TXS_NONE ? e->status_word : "unknown");
    if (e != NULL) {
        f->status = (enum tx_status)e->status;
        if (e->known_until > now) {
            f->known_until = e->known_until;
            if (e->not_found)
                f->not_found = true;
            else if (tx_status_final((enum tx_status)e->status))
                f->final = true;
        }
        /* a read here, or another host's (state_defer): the later */
        int64_t inflight = e->inflight_until > e->remote_until ? e->inflight_until : e->remote_until;
        if (inflight > now) {
            f->in_flight = true;
            f->in_flight_until = inflight;
        }
    }
    /* a cached final status, a remembered 404 or a read under way answers
     * without a read (as Redis's claim: rules_held) */
    f->held = (enum rules_held)rules_held(f->final ? f->known_until : 0, f->not_found ? f->known_until : 0,
                                          f->in_flight_until, now);
    if (f->held == RULES_HELD_FINAL)
        return; /* it answers, and no read starts while its cache runs: nothing else is asked */
    /* the pace, the floor, Retry-After and the key's pause, as Redis's
     * claim decides them (rules_next_read) */
    struct rules_gate g = {.key_paused_until = k != NULL ? k->paused_until : 0};
    if (e != NULL) {
        g.reads = e->reads;
        g.last_start = e->last_start;
        g.last_end = e->last_end;
        g.not_before = e->not_before;
    }
    static const enum state_wait why_of[] = {[RULES_WHY_NONE] = WAIT_NONE, [RULES_WHY_PACE] = WAIT_PACE,
                                             [RULES_WHY_RETRY] = WAIT_RETRY, [RULES_WHY_KEY_PAUSE] = WAIT_KEY_PAUSE};
    struct rules_next n;
    rules_next_read(sched, &g, now, &n);
    raise_to(&f->next_read, &f->wait, n.at, why_of[n.why]);
    if (e != NULL) /* another host's word */
        raise_to(&f->next_read, &f->wait, e->remote_not_before, (enum state_wait)e->remote_why);
    if (k != NULL)
        raise_to(&f->next_read, &f->wait, st_budget_next(k, budget, now), WAIT_BUDGET);
    raise_to(&f->next_read, &f->wait, st->h->host_paused_until, WAIT_HOST_PAUSE);
    if (!st->all_accepted && (k == NULL || !k->accepted)) { /* a key Kasera has not taken: within the allowance */
        int64_t at = rules_auth_next(st->h->auth_until, STATE_AUTH_FAILS_MAX, atomic_load(&st->auth_allowance), now);
        /* a place held by a read still under way is back when it lands
         * (most do, at once: its end bumps the generation): look again
         * soon rather than when it would count as a 401 */
        for (int i = 0; at > now + ST_PLAN_RETRY_MS && i < STATE_AUTH_FAILS_MAX; i++)
            if (st->h->auth_serial[i] != 0 && st->h->auth_until[i] > now)
                at = now + ST_PLAN_RETRY_MS;
        raise_to(&f->next_read, &f->wait, at, WAIT_AUTH);
    }
    if (f->not_found)
        raise_to(&f->next_read, &f->wait, f->known_until, WAIT_RETRY);
    bool held = f->held != RULES_HELD_NONE;
    /* everything else allows a read now: does the budget's plan? */
    enum plan_read r = PLAN_EARLY;
    bool elsewhere = atomic_load_explicit(&st->elsewhere, memory_order_relaxed);
    if (!st->greedy && k != NULL && !held && f->next_read <= now) {
        int64_t retry, own;
        r = st_plan_verdict(st, e, k, sched, budget, now, &retry, &own);
        if (r == PLAN_NO && elsewhere)
            r = PLAN_EARLY; /* another store's plan decides (its verdict is mirrored: state_defer) */
        if (r == PLAN_NO) {
            raise_to(&f->next_read, &f->wait, retry, WAIT_BUDGET);
            f->withheld = true;
            f->withheld_own = own;
        }
        if (kind != NULL)
            *kind = r;
    }
    /* the 404 quarter: while the key's reads that ended 404 (or, under
     * way, are of ids never answered) fill a quarter of its budget in the
     * span ending now, an id never answered reads only with a held
     * request's last-chance read (reserved, or within the lead of its
     * deadline) */
    if (k != NULL && !elsewhere && r != PLAN_NO && r != PLAN_LAST_CHANCE && (e == NULL || e->status == TXS_NONE) &&
        !held && f->next_read <= now) {
        int64_t until = rules_nf_until(st_budget_nf_next(k, budget, st->h->read_timeout_ms + 1000, now),
                                       e != NULL ? e->holders : 0, e != NULL ? e->hold_until : 0,
                                       e != NULL ? e->resv_at : 0, now);
        if (until > now) {
            raise_to(&f->next_read, &f->wait, until, WAIT_BUDGET);
            if (kind != NULL)
                *kind = PLAN_NO;
        }
    }
}

void state_lookup(struct state *st, const struct state_key *key, const char *id,
                  const struct pace_schedule *sched, int budget, int64_t now, struct state_fact *out)
{
    st_lock(st, now);
    compute(st, st_tx_find(st, key, id), st_key_get(st, key, now, false), sched, budget, now, out, NULL);
    st_unlock(st);
}

void state_lookup_held(struct state *st, const struct state_key *key, const char *id,
                       const struct pace_schedule *sched, int budget, int64_t now, struct state_fact *out)
{
    st_lock(st, now);
    struct st_tx *e = st_tx_find(st, key, id);
    compute(st, e, st_key_get(st, key, now, false), sched, budget, now, out, NULL);
    if (out->withheld && e != NULL)
        e->withheld = 1; /* for this hold (plan_drifted) */
    st_unlock(st);
}

bool state_plan_open(struct state *st, const struct state_key *key, const struct pace_schedule *sched, int budget,
                     int64_t now, int64_t *retry)
{
    *retry = now + ST_PLAN_RETRY_MS;
    if (st->greedy)
        return true; /* no plan: nothing is withheld */
    st_lock(st, now);
    struct st_keyent *k = st_key_get(st, key, now, false);
    bool open = k == NULL || st_plan_open(st, k, sched, budget, now, retry);
    st_unlock(st);
    return open;
}

bool state_claim(struct state *st, const struct state_key *key, const char *id,
                 const struct pace_schedule *sched, int budget, int64_t timeout_ms, int64_t now,
                 struct state_ticket *ticket, struct state_fact *out)
{
    return state_claim_client(st, key, id, sched, budget, timeout_ms, NULL, now, ticket, out);
}

bool state_claim_client(struct state *st, const struct state_key *key, const char *id,
                        const struct pace_schedule *sched, int budget, int64_t timeout_ms,
                        const struct state_client *client, int64_t now, struct state_ticket *ticket,
                        struct state_fact *out)
{
    bool claimed = false;
    bool charged = client != NULL && !st_client_none(client);
    if (strlen(id) > STATE_ID_MAX) { /* callers validate ids; never track a longer one */
        memset(out, 0, sizeof *out);
        out->wait = WAIT_FULL;
        out->next_read = now + 1000;
        return false;
    }
    st_lock(st, now);
    struct st_tx *e = st_tx_find(st, key, id);
    struct st_keyent *k = st_key_get(st, key, now, false);
    enum plan_read kind;
    compute(st, e, k, sched, budget, now, out, &kind);
    if (out->withheld && e != NULL)
        e->withheld = 1; /* the plan held this read back (plan_drifted) */
    if (out->next_read > now || out->held != RULES_HELD_NONE)
        goto done;
    if (k == NULL)
        k = st_key_get(st, key, now, true);
    if (e == NULL && k != NULL)
        e = st_tx_get(st, key, id, now, false, k);
    if (e == NULL || k == NULL) {
        out->wait = WAIT_FULL;
        out->next_read = now + 1000;
        goto done;
    }
    /* the lease is the timeout this read is made with (plus 1 s) */
    if (timeout_ms <= 0)
        timeout_ms = st->h->read_timeout_ms;
    if (timeout_ms > STATE_LEASE_MAX_MS)
        timeout_ms = STATE_LEASE_MAX_MS;
    /* an id nobody knows, for a client: its reads in flight count as 404s */
    charged = charged && e->status == TXS_NONE;
    int64_t client_until;
    if (charged && !st_client_fly(st, client, st_tx_what(st, key, id), now + timeout_ms + 1000, now, &client_until)) {
        out->wait = WAIT_CLIENT;
        out->next_read = client_until;
        goto done;
    }
    /* what state_unclaim() restores */
    ticket->undo.serial = e->inflight_serial;
    ticket->undo.last_start = e->last_start;
    ticket->undo.reads = e->reads;
    ticket->undo.early_reads = e->early_reads;
    ticket->undo.resv_at = e->resv_at;
    ticket->undo.last_chance = kind == PLAN_LAST_CHANCE;
    if (!pace_in_episode(e->reads, e->last_start, now))
        e->reads = e->early_reads = 0;
    e->reads++;
    if (kind == PLAN_LAST_CHANCE) {
        st->h->last_chance_reads++;
        e->resv_at = 0;
    } else {
        e->early_reads++;
    }
    e->last_start = now;
    e->last_used = now;
    e->inflight_until = now + timeout_ms + 1000;
    e->inflight_serial = ++st->h->serial;
    k->last_used = now;
    if (!k->accepted && !st->all_accepted) { /* counted against the allowance until it says otherwise (auth_land) */
        auth_take(st, e->inflight_serial, e->inflight_until + STATE_AUTH_SPAN_MS, now);
    }
    ticket->budget_prev = k->ring_n > 0 ? k->ring[(k->ring_head - 1 + STATE_BUDGET_MAX) % STATE_BUDGET_MAX] : 0;
    ticket->budget_at = st_budget_push(k, now);
    if (e->status == TXS_NONE) /* counted by the 404 quarter until it ends otherwise */
        st_budget_mark_probe(k, ticket->budget_at, true);
    /* requests held later than the one a last-chance read was for keep a
     * chance too (counted after this read) */
    int64_t later = kind == PLAN_LAST_CHANCE ? plan_later_chance(e->holders, e->hold_until, now) : 0;
    if (later > 0 && st_plan_reserve_at(st, e, k, sched, budget, later, now))
        e->resv_at = later;
    ticket->key = *key;
    util_copy(ticket->id, sizeof ticket->id, id);
    ticket->serial = e->inflight_serial;
    ticket->started = now;
    ticket->wait_ms = pace_wait(sched, e->reads);
    ticket->refused = 0; /* the reader says, before state_finish */
    ticket->lease_until = e->inflight_until;
    ticket->sent = 0;
    if (client != NULL)
        ticket->client = *client; /* a 404 is charged there; its read is in flight for it (charged) */
    else
        memset(&ticket->client, 0, sizeof ticket->client);
    ticket->undo.resv_left = e->resv_at;
    out->in_flight = true;
    out->in_flight_until = e->inflight_until;
    claimed = true;
done:
    st_unlock(st);
    return claimed;
}

#ifdef KEMBALI_TESTING
void state_test_keys_accepted(struct state *st, bool all)
{
    st->all_accepted = all;
}
#endif

void state_auth_allowance(struct state *st, int per_minute)
{
    if (per_minute < RULES_AUTH_FAILS_MIN)
        per_minute = RULES_AUTH_FAILS_MIN;
    if (per_minute > RULES_AUTH_FAILS_MAX)
        per_minute = RULES_AUTH_FAILS_MAX;
    atomic_store(&st->auth_allowance, per_minute);
}

void st_pause_until(int64_t *until, int64_t t)
{
    if (t > *until)
        *until = t;
}

/* A final status that is answered without reading (its cache runs). */
static bool final_cached(const struct st_tx *e, int64_t now)
{
    return !e->not_found && e->known_until > now && tx_status_final((enum tx_status)e->status);
}

/* May status s replace what e records? What is known never moves
 * backwards (see state_tell in state.h): from a final status only to the
 * same one (its cache restarts) or, from expired, to another final one. A
 * read's answer is Kasera's word at the time: once the final status's
 * cache has run out, it replaces it; a told one never replaces a final
 * status, cached or not. */
static bool status_may_replace(const struct st_tx *e, enum tx_status s, bool told, int64_t now)
{
    return rules_may_replace((enum tx_status)e->status, final_cached(e, now), s, told);
}

/* Record status s (as Kasera wrote it: word) as the last known one, with
 * its cache; forgets a remembered 404. */
static void status_record(struct st_tx *e, enum tx_status s, const char *word, int64_t now)
{
    e->status = (uint8_t)s;
    util_copy(e->status_word, sizeof e->status_word, word);
    e->not_found = 0;
    int64_t ttl = rules_status_ttl(s);
    e->known_until = ttl > 0 ? now + ttl : 0;
}

/* Record what the read of ticket t found (status s, or a 404)? The facts
 * of e as rules_read_records() takes them (state.h, "A read's
 * outcome"). `current`: t's lease holds and no other read of the
 * transaction started since (rules_read_current). */
static bool read_may_record(const struct st_tx *e, const struct state_ticket *t, bool current, bool not_found,
                            enum tx_status s, int64_t now)
{
    enum tx_status cur = (enum tx_status)e->status;
    struct rules_found f = {
        .current = current,
        .older = t->serial < e->facts_serial, /* a later read's outcome (or a told status) is recorded */
        .not_found = not_found,
        .final = tx_status_final(s),
        .forward = !not_found && rules_may_replace(cur, true, s, true),
        .known = cur != TXS_NONE,
        .known_final = tx_status_final(cur),
        .final_cached = final_cached(e, now),
        .nf_cached = e->not_found && e->known_until > now,
    };
    return rules_read_records(&f);
}

void state_finish(struct state *st, const struct state_ticket *t, const char *shop_id,
                  const struct outcome *oc, int64_t now, struct state_report *report)
{
    memset(report, 0, sizeof *report);
    st_lock(st, now);
    struct st_tx *e = st_tx_find(st, &t->key, t->id);
    if (!st_client_none(&t->client)) /* no longer in flight for its client (a 404 is charged below) */
        st_client_land(st, &t->client, st_tx_what(st, &t->key, t->id), now);
    struct st_keyent *k = st_key_get(st, &t->key, now, true);
    bool current = e != NULL && rules_read_current((int64_t)t->serial, (int64_t)e->inflight_serial, t->lease_until, now);
    report->stale = !current;
    if (e != NULL) {
        e->remote_until = 0; /* another host's read is no longer what to wait for */
        if (e->inflight_serial == t->serial) {
            e->inflight_until = 0;
            /* Kasera's window runs from the request's arrival, which a
             * new connection (TCP, TLS) delays after the claim: the pace
             * counts from when the request went out */
            if (t->sent > e->last_start && t->sent <= now)
                e->last_start = t->sent;
        }
        e->last_used = now;
    }
    /* what the outcome does (rules.h): the same effect Redis is sent */
    int64_t pace_start = current && e != NULL ? e->last_start : t->started;
    struct rules_effect *fx = &report->effect;
    rules_outcome(oc, pace_start, now, util_jitter(rules_jitter_max(STATE_KEY_PAUSE_MS)),
                  util_jitter(rules_jitter_max(STATE_HOST_PAUSE_MS)), fx);
    if (oc->kind == OUT_TX_LIMITED && current) /* never in lockstep */
        fx->retry_ms = rules_tx_limited_wait(fx->retry_ms, t->wait_ms, t->refused);
    if (e != NULL && now > e->last_end)
        e->last_end = now; /* the floor at Kasera counts from here, whatever the read found */
    if (fx->has_status && e != NULL) {
        if (read_may_record(e, t, current, false, oc->status, now)) {
            status_record(e, oc->status, oc->status_word, now);
            if (t->serial > e->facts_serial)
                e->facts_serial = t->serial;
        }
        if (oc->status == TXS_UNKNOWN && !e->unknown_seen) {
            e->unknown_seen = 1;
            report->first_unknown = true;
        }
    }
    if (!fx->not_found && k != NULL)
        st_budget_mark_probe(k, t->budget_at, false); /* not a 404: the quarter no longer counts it */
    if (fx->not_found) {
        /* charged to the client that asked, for an id kembali knows
         * nothing about (a 404 for an id with a known status is not
         * a probe), late or not: it happened at Kasera */
        if (k != NULL)
            st_budget_not_found(k, t->budget_at);
        if (fx->charge && !st_client_none(&t->client) && (e == NULL || e->status == TXS_NONE))
            report->client_blocked = st_client_charge(st, &t->client, st_tx_what(st, &t->key, t->id), now);
        if (e != NULL && read_may_record(e, t, current, true, TXS_NONE, now)) {
            e->not_found = 1;
            e->known_until = now + fx->ttl_ms;
            if (t->serial > e->facts_serial)
                e->facts_serial = t->serial;
        }
    }
    /* What limits and pauses say happened at Kasera, late or not: they
     * are kept however stale the read (each only ever extends a wait). */
    if (fx->retry_ms > 0 && e != NULL)
        st_pause_until(&e->not_before, now + fx->retry_ms);
    st_change_log(st, STATE_CHANGE_TX, &t->key, t->id);
    if (fx->key_pause_ms > 0 && k != NULL) {
        report->key_paused = k->paused_until <= now && (oc->kind == OUT_KEY_LIMITED || fx->unauthorized);
        if (k->paused_until < now + fx->key_pause_ms) /* the key's requests may have no read left */
            st_change_log(st, STATE_CHANGE_KEY, &t->key, NULL);
        st_pause_until(&k->paused_until, now + fx->key_pause_ms);
    }
    if (fx->unauthorized)
        util_copy(st->h->last_401_shop, sizeof st->h->last_401_shop, shop_id);
    auth_land(st, t->serial, fx, now);
    if (fx->key_accepted && k != NULL)
        k->accepted = 1;
    if (fx->host_pause_ms > 0) {
        report->host_paused = st->h->host_paused_until <= now;
        if (st->h->host_paused_until < now + fx->host_pause_ms)
            st_change_log(st, STATE_CHANGE_HOST, NULL, NULL);
        st_pause_until(&st->h->host_paused_until, now + fx->host_pause_ms);
    }
    util_copy(report->last_401_shop, sizeof report->last_401_shop, st->h->last_401_shop);
    st_unlock(st);
    st_bump(st); /* wake waiters in every process: they read the changes */
}

void state_unclaim(struct state *st, const struct state_ticket *t, int64_t now)
{
    st_lock(st, now);
    struct st_tx *e = st_tx_find(st, &t->key, t->id);
    /* never made: not in flight for its client (its other reads may start) */
    bool landed = !st_client_none(&t->client) && st_client_land(st, &t->client, st_tx_what(st, &t->key, t->id), now);
    bool undone = e != NULL && e->inflight_serial == t->serial;
    auth_land(st, t->serial, NULL, now); /* never made: it failed nothing */
    if (undone) {
        e->inflight_until = 0;
        e->inflight_serial = t->undo.serial; /* the claim before is the last one again */
        e->last_start = t->undo.last_start;
        e->reads = t->undo.reads;
        e->early_reads = t->undo.early_reads;
        if (e->resv_at == t->undo.resv_left) /* no hold changed it since */
            e->resv_at = t->undo.resv_at;
        if (t->undo.last_chance && st->h->last_chance_reads > 0)
            st->h->last_chance_reads--;
        struct st_keyent *k = st_key_get(st, &t->key, now, false);
        if (k != NULL)
            st_budget_unpush(k, t->budget_at);
        st_change_log(st, STATE_CHANGE_TX, &t->key, t->id);
    }
    if (undone || landed) /* a read back in the key's budget, or its client's count */
        st_change_log(st, STATE_CHANGE_KEY, &t->key, NULL);
    st_unlock(st);
    if (undone || landed)
        st_bump(st); /* processes waiting on the lease (or the client's count) look again */
}

enum state_told state_tell(struct state *st, const struct state_key *key, const char *id,
                           enum tx_status status, const char *word, int64_t now)
{
    if (!ids_valid_id(id) || status == TXS_NONE || status == TXS_UNKNOWN || word == NULL ||
        strlen(word) > STATUS_WORD_MAX)
        return STATE_TOLD_BAD;
    enum state_told done = STATE_TOLD_RECORDED;
    bool was_remote = false;
    st_lock(st, now);
    struct st_tx *e = st_tx_get(st, key, id, now, true, NULL);
    if (e == NULL) {
        done = STATE_TOLD_FULL;
    } else {
        e->last_used = now;
        was_remote = e->remote_until > now;
        e->remote_until = 0; /* what another host's read would say is told */
        if (status_may_replace(e, status, true, now)) {
            status_record(e, status, word, now);
            e->facts_serial = ++st->h->serial; /* a serial of its own: newer than every read claimed before it */
        } else {
            done = STATE_TOLD_KEPT;
            if (e->not_found) { /* the shop knows it: no 404 stands (a kept status is final) */
                e->not_found = 0;
                e->known_until = 0;
            }
        }
        if (done == STATE_TOLD_RECORDED || was_remote)
            st_change_log(st, STATE_CHANGE_TX, key, id);
    }
    st_unlock(st);
    if (done == STATE_TOLD_RECORDED || was_remote)
        st_bump(st); /* wake the requests held for it in every process */
    return done;
}

bool state_known(struct state *st, const struct state_key *key, const char *id, int64_t now)
{
    if (!ids_valid_id(id))
        return false;
    st_lock(st, now);
    const struct st_tx *e = st_tx_find(st, key, id);
    bool known = e != NULL && e->status != TXS_NONE;
    st_unlock(st);
    return known;
}

bool state_heard(struct state *st, const struct state_key *key, uint32_t who, int64_t now)
{
    st_lock(st, now);
    struct st_keyent *k = st_key_get(st, key, now, true);
    bool added = k != NULL && st_budget_heard(k, who, now);
    if (k != NULL)
        k->last_used = now;
    st_unlock(st);
    return added;
}

void state_answered(struct state *st, const struct state_ticket *t, int64_t now)
{
    st_lock(st, now);
    struct st_keyent *k = st_key_get(st, &t->key, now, false);
    if (k != NULL)
        st_budget_answered(k, t->budget_at);
    st_unlock(st);
}

int state_key_reads(struct state *st, const struct state_key *key, int64_t now, int64_t *at, int cap,
                    int64_t *newest)
{
    *newest = 0;
    st_lock(st, now);
    const struct st_keyent *k = st_key_get(st, key, now, false);
    int n = 0;
    if (k != NULL && k->ring_n > 0) {
        *newest = k->ring[(k->ring_head - 1 + STATE_BUDGET_MAX) % STATE_BUDGET_MAX];
        for (int32_t j = 0; j < k->ring_n && n < cap; j++) { /* newest first */
            int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
            if (k->ring[i] <= now - PLAN_BUDGET_SPAN_MS)
                break; /* older ones are older still */
            if (k->ring_kind[i] == RING_OWN) /* not another host's; not one whose claim Redis counts or refuses */
                at[n++] = k->ring[i];
        }
    }
    st_unlock(st);
    return n;
}

bool state_defer(struct state *st, const struct state_key *key, const char *id, int64_t until, bool in_flight,
                 enum state_wait why, int64_t now)
{
    if (!ids_valid_id(id))
        return false;
    if (why != WAIT_PACE && why != WAIT_RETRY && why != WAIT_KEY_PAUSE && why != WAIT_BUDGET)
        why = WAIT_RETRY;
    int64_t span = in_flight ? SPAN_LEASE : STATE_DEFER_MAX_MS; /* what the check allows */
    if (until > now + span)
        until = now + span;
    bool was = false, is = false;
    st_lock(st, now);
    struct st_tx *e = st_tx_get(st, key, id, now, false, NULL);
    if (e != NULL) {
        e->last_used = now;
        was = e->remote_until > now;
        if (in_flight) {
            st_pause_until(&e->remote_until, until);
        } else {
            e->remote_until = 0; /* that read ended: its not-before replaces it */
            if (until > e->remote_not_before) {
                e->remote_not_before = until;
                e->remote_why = (uint8_t)why;
            }
        }
        is = e->remote_until > now;
        if (was != is)
            st_change_log(st, STATE_CHANGE_TX, key, id);
    }
    st_unlock(st);
    if (was != is)
        st_bump(st);
    return e != NULL;
}

bool state_learn_not_found(struct state *st, const struct state_key *key, const char *id, int64_t until,
                           int64_t now)
{
    if (!ids_valid_id(id))
        return false;
    if (until > now + STATE_TTL_NOT_FOUND_MS)
        until = now + STATE_TTL_NOT_FOUND_MS;
    st_lock(st, now);
    struct st_tx *e = st_tx_get(st, key, id, now, false, NULL);
    if (e != NULL) {
        e->last_used = now;
        e->remote_until = 0;
        /* as a current read's 404 (read_may_record), newer than every read
         * started before it (as a told status) */
        if (until > now && !final_cached(e, now)) {
            if (!e->not_found || e->known_until < until)
                e->known_until = until;
            e->not_found = 1;
            e->facts_serial = ++st->h->serial;
        }
        st_change_log(st, STATE_CHANGE_TX, key, id);
    }
    st_unlock(st);
    if (e != NULL)
        st_bump(st);
    return e != NULL;
}

/* The next hold stamp (state_hold), under the lock. */
static uint64_t hold_stamp(struct state *st, int64_t now)
{
    uint64_t s = now > 0 ? (uint64_t)now * STATE_STAMPS_PER_MS : 0;
    if (s <= st->h->hold_stamp)
        s = st->h->hold_stamp + 1;
    st->h->hold_stamp = s;
    return s;
}

bool state_hold(struct state *st, const struct state_key *key, const char *id,
                const struct pace_schedule *sched, int budget, int64_t deadline, int64_t now, uint64_t *stamp)
{
    if (stamp != NULL)
        *stamp = 0;
    if (strlen(id) > STATE_ID_MAX)
        return false;
    st_lock(st, now);
    if (stamp != NULL)
        *stamp = hold_stamp(st, now);
    struct st_keyent *k = st_key_get(st, key, now, true);
    struct st_tx *e = k != NULL ? st_tx_get(st, key, id, now, false, k) : NULL;
    if (e != NULL && k != NULL) {
        e->last_used = k->last_used = now;
        bool fresh = plan_fresh_hold(e->holders, e->hold_until, now);
        if (fresh) {
            /* a new holding period; holders past their deadline may still
             * unhold (their count stays: st_waiting_tx ignores a hold whose
             * deadline passed, so what a dead process left does no harm) */
            if (e->holders < 0)
                e->holders = 0;
            e->resv_at = 0;
            e->hold_until = 0;
            e->withheld = 0;
        }
        e->holders++;
        if (deadline > e->hold_until)
            e->hold_until = deadline;
        if (fresh && st_waiting_tx(st, k, (int32_t)(e - st->txs), now) != NULL) {
            st_waiting_add(st, k, (int32_t)(e - st->txs), now);
            k->arrivals[k->arr_head] = now;
            k->arr_head = (k->arr_head + 1) % ST_ARRIVALS;
            if (k->arr_n < ST_ARRIVALS)
                k->arr_n++;
            int64_t at = plan_hold_chance(deadline, now);
            if (!st->greedy && at > 0 && st_plan_reserve_at(st, e, k, sched, budget, at, now))
                e->resv_at = at;
        }
    }
    st_unlock(st);
    return e != NULL && k != NULL;
}

bool state_unhold(struct state *st, const struct state_key *key, const char *id, int64_t now, uint64_t *stamp)
{
    bool last = false;
    st_lock(st, now);
    if (stamp != NULL)
        *stamp = hold_stamp(st, now);
    struct st_tx *e = st_tx_find(st, key, id);
    if (e != NULL && e->holders > 0 && --e->holders == 0) {
        e->resv_at = 0; /* nobody left to use it */
        last = true;
    }
    st_unlock(st);
    return last;
}

void state_reserve(struct state *st, const struct state_key *key, const char *id, bool reserved, int64_t at,
                   int64_t now)
{
    st_lock(st, now);
    struct st_tx *e = st_tx_find(st, key, id);
    if (e != NULL && e->holders > 0 && e->hold_until > now)
        e->resv_at = reserved ? (at > 0 ? at : 1) : 0;
    st_unlock(st);
}

bool state_plans(const struct state *st)
{
    return !st->greedy;
}

void state_plan_elsewhere(struct state *st, bool elsewhere)
{
    atomic_store_explicit(&st->elsewhere, elsewhere, memory_order_relaxed);
}

void state_metrics(struct state *st, struct state_metrics *out)
{
    state_metrics_at(st, out, util_mono_ms());
}

void state_metrics_at(struct state *st, struct state_metrics *out, int64_t now)
{
    memset(out, 0, sizeof *out);
    st_lock(st, now);
    out->tx_used = st->h->tx_used;
    out->tx_slots = st->txn;
    out->evictions = st->h->evictions;
    out->full = st->h->full;
    out->tx_per_key = st_tx_quota(st);
    out->quota_full = st->h->quota_full;
    out->recoveries = st->h->recoveries;
    out->repairs = st->h->repairs;
    out->key_used = st->h->key_used;
    out->key_slots = st->keyn;
    out->key_evictions = st->h->key_evictions;
    out->key_full = st->h->key_full;
    out->client_slots = st->cln;
    out->client_blocks = st->h->client_blocks;
    out->client_full = st->h->client_full;
    for (int32_t i = 0; i < st->cln; i++) /* bounded: client_slots */
        out->clients_blocked += st->clients[i].used && st->clients[i].blocked_until > now;
    out->host_paused = st->h->host_paused_until > now;
    for (int i = 0; i < STATE_AUTH_FAILS_MAX; i++)
        out->auth_failures += st->h->auth_until[i] > now;
    out->auth_allowance = atomic_load(&st->auth_allowance);
    out->stale_locks = st->h->stale_locks;
    out->last_chance_reads = st->h->last_chance_reads;
    out->reserved = 0;
    for (int32_t i = 0; i < st->keyn; i++) {
        const struct st_keyent *k = &st->keys[i];
        for (int32_t j = 0; k->used && j < k->nwaiting && j < ST_WAITING_MAX; j++) {
            const struct st_tx *e = st_waiting_tx(st, k, k->waiting[j], now);
            out->reserved += e != NULL && e->resv_at != 0;
        }
    }
    st_unlock(st);
}

int state_key_slots_for(int keys)
{
    if (keys < 0)
        keys = 0;
    if (keys > STATE_KEY_SLOTS_MAX / 2)
        return STATE_KEY_SLOTS_MAX;
    return keys * 2 < STATE_KEY_SLOTS_MIN ? STATE_KEY_SLOTS_MIN : keys * 2;
}

bool state_fact_unknown(const struct state_fact *f)
{
    return f->status == TXS_NONE;
}

