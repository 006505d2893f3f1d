/* coord.c - see coord.h. */
#include "coord.h"

#include "budget.h"
#include "siphash.h"

#include <stdlib.h>

#include <string.h>

bool coord_hold(struct state *st, struct state_redis *redis, const struct shop *shop, const char *id,
                const struct pace_schedule *sched, int budget, int64_t deadline, const struct state_redis_id *host,
                int64_t now, state_redis_held_fn *fn, void *data, bool *asked)
{
    *asked = false;
    uint64_t stamp;
    if (!state_hold(st, &shop->key, id, sched, budget, deadline, now, &stamp))
        return false;
    struct state_redis_plan plan = {.plans = state_plans(st)};
    *asked = state_redis_held(redis, shop->secret, id, budget, deadline - now, stamp, host, &plan, fn, data) != NULL;
    return true;
}

void coord_held(struct state *st, const struct state_key *key, const char *id, const struct state_redis_held *h,
                int64_t now)
{
    if (!h->down)
        state_reserve(st, key, id, h->reserved, now + h->resv_ms, now);
}

void coord_unhold(struct state *st, struct state_redis *redis, const struct shop *shop, const char *id,
                  const struct state_redis_id *host, int64_t now)
{
    uint64_t stamp;
    if (state_unhold(st, &shop->key, id, now, &stamp) && redis != NULL)
        state_redis_left(redis, shop->secret, id, host, stamp);
}

void coord_plan(struct state *st, const struct state_redis *redis)
{
    state_plan_elsewhere(st, state_redis_up(redis));
}

struct state_redis_op *coord_ask(struct state *st, struct state_redis *redis, const struct coord_read *cr,
                                 const struct state_redis_id *host, state_redis_claim_fn *fn, void *data)
{
    if (redis == NULL)
        return NULL;
    const struct state_ticket *t = &cr->ticket;
    struct state_redis_plan plan = {.plans = state_plans(st),
                                    .schedule_reads = pace_reads_within(cr->sched, pace_hold_ms(cr->sched))};
    struct state_redis_count count = {.lost = budget_count_lost(t->budget_prev, t->started)};
    budget_member(count.member, sizeof count.member, host->hex, t->budget_at);
    struct state_redis_op *op = state_redis_claim(redis, cr->shop->secret, t->id, cr->sched, cr->shop->read_budget,
                                                  t->lease_until - t->started, cr->has_rclient ? &cr->rclient : NULL,
                                                  &plan, &count, fn, data);
    if (op == NULL) /* read on this host's claim alone: the count gets it when Redis is back */
        state_answered(st, t, t->started);
    return op;
}

void coord_seed(struct state *st, struct state_redis *redis, const struct coord_names *names,
                const struct state_redis_id *host, const struct state_redis_id *only, int64_t now)
{
    if (!state_redis_up(redis))
        return;
    int64_t at[STATE_BUDGET_MAX], newest;
    if (only != NULL) {
        const struct state_key *key = coord_names_find(names, only);
        if (key != NULL)
            state_redis_seed(redis, only, host, at, state_key_reads(st, key, now, at, STATE_BUDGET_MAX, &newest), now);
        return;
    }
    for (int i = 0; i < names->n; i++) { /* a key two shops share is one name */
        int n = state_key_reads(st, &names->e[i].key, now, at, STATE_BUDGET_MAX, &newest);
        state_redis_seed(redis, &names->e[i].rkey, host, at, n, now);
    }
}

void coord_mirror_final(struct state *st, const struct state_key *key, const char *id, const char *word,
                        int64_t now)
{
    enum tx_status s = tx_status_parse(word);
    if (tx_status_final(s))
        state_tell(st, key, id, s, word, now);
}

enum coord_next coord_claimed(struct state *st, struct coord_read *cr, const struct state_redis_claim *c,
                              bool heard_since, int64_t now)
{
    if (c->v == STATE_REDIS_GO) {
        cr->redis_serial = c->serial;
        state_answered(st, &cr->ticket, now); /* Redis counts it */
        return COORD_READ;
    }
    state_unclaim(st, &cr->ticket, now);
    const struct state_key *k = &cr->ticket.key;
    const char *id = cr->ticket.id;
    switch (c->v) {
    case STATE_REDIS_FINAL:
        coord_mirror_final(st, k, id, c->word, now);
        break;
    case STATE_REDIS_NOT_FOUND:
        state_learn_not_found(st, k, id, now + c->ms, now);
        break;
    case STATE_REDIS_BUSY:
        if (!heard_since) /* else the read it saw in flight has ended since */
            state_defer(st, k, id, now + c->ms, true, WAIT_PACE, now);
        break;
    case STATE_REDIS_WAIT:
        state_defer(st, k, id, now + c->ms, false, c->why, now);
        break;
    case STATE_REDIS_BLOCKED:
        /* the client that led the claim is blocked (counted on another
         * host) and nobody knows the id: its requests get no read (here
         * from now on too) */
        state_client_block(st, &cr->ticket.client, now + c->ms, now);
        return COORD_BLOCKED;
    case STATE_REDIS_GO:
    case STATE_REDIS_DOWN:
        break; /* down: decide again, on this host's state alone */
    }
    return COORD_AGAIN;
}

void coord_finish(struct state *st, struct state_redis *redis, struct coord_keys *ks, struct coord_read *cr,
                  const struct outcome *oc, int64_t sent, int64_t now, struct state_report *report)
{
    cr->ticket.sent = sent;
    state_finish(st, &cr->ticket, cr->shop->id, oc, now, report);
    if (redis == NULL)
        return;
    coord_keys_learn(ks, redis, cr->shop, now);
    if (state_redis_up(redis)) /* Redis counts every host's 404s: its word starts the block */
        report->client_blocked = false;
    const struct rules_effect *fx = &report->effect;
    struct state_redis_outcome o = {.sched = cr->sched, .shop_id = cr->shop->id, .serial = cr->redis_serial};
    if (sent > cr->ticket.started)
        o.sent_ms = sent - cr->ticket.started;
    if (fx->has_status) {
        o.word = oc->status_word;
        o.final = fx->final;
    }
    o.ttl_ms = fx->ttl_ms;
    o.not_found = fx->not_found;
    o.charge = fx->charge;
    o.has_client = cr->has_rclient; /* a read for it is no longer in flight */
    o.client = cr->rclient;
    o.retry_ms = fx->retry_ms;
    o.key_pause_ms = fx->key_pause_ms;
    state_redis_finish(redis, cr->shop->secret, cr->ticket.id, &o);
}

void coord_abandon(struct state *st, const struct coord_read *cr, int64_t now)
{
    state_unclaim(st, &cr->ticket, now);
}

void coord_mirror(struct state *st, const struct state_key *key, const char *id, const struct state_redis_msg *m,
                  int64_t now)
{
    enum tx_status s = tx_status_parse(m->word);
    switch (m->kind) {
    case STATE_REDIS_MSG_FINAL:
        coord_mirror_final(st, key, id, m->word, now);
        break;
    case STATE_REDIS_MSG_STATUS:
        if (s == TXS_PENDING)
            state_tell(st, key, id, s, m->word, now);
        state_defer(st, key, id, now + m->ms, false, WAIT_PACE, now);
        break;
    case STATE_REDIS_MSG_NEXT:
        state_defer(st, key, id, now + m->ms, false, WAIT_PACE, now);
        break;
    case STATE_REDIS_MSG_NOT_FOUND:
        state_learn_not_found(st, key, id, now + m->ms, now);
        break;
    case STATE_REDIS_MSG_BLOCK:
    case STATE_REDIS_MSG_SEED:
    case STATE_REDIS_MSG_READ:
        break;
    }
}

void coord_told_here(struct state *st, struct state_redis *redis, struct coord_keys *ks, const struct shop *shop,
                     const char *id, const struct pace_schedule *sched, int64_t now)
{
    if (redis == NULL)
        return;
    coord_keys_learn(ks, redis, shop, now);
    struct state_fact f; /* every host's: what this state now holds for it */
    state_lookup(st, &shop->key, id, sched, shop->read_budget, now, &f);
    if (f.status != TXS_NONE && f.status != TXS_UNKNOWN)
        state_redis_tell(redis, shop->secret, id, f.status_word, f.final, sched);
}

/* The heard reads' names are hashed only to be told apart (no secret) */
static const uint8_t NAME_HASH_KEY[16] = "kembali-heard-v1";

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct coord_name *)a)->rkey.hex, ((const struct coord_name *)b)->rkey.hex);
}

void coord_names_for(struct coord_names *names, struct state_redis *redis, struct config *cfg)
{
    if (names->cfg == cfg)
        return;
    coord_names_free(names);
    names->cfg = config_ref(cfg);
    names->e = calloc(cfg->nshops > 0 ? (size_t)cfg->nshops : 1, sizeof *names->e);
    if (names->e == NULL)
        return;
    for (int i = 0; i < cfg->nshops; i++)
        if (state_redis_key_id(redis, cfg->shops[i].secret, &names->e[names->n].rkey)) {
            names->e[names->n].key = cfg->shops[i].key;
            names->n++;
        }
    qsort(names->e, (size_t)names->n, sizeof *names->e, name_cmp);
}

const struct state_key *coord_names_find(const struct coord_names *names, const struct state_redis_id *rkey)
{
    struct coord_name want = {.rkey = *rkey};
    const struct coord_name *e =
        names->e ? bsearch(&want, names->e, (size_t)names->n, sizeof *names->e, name_cmp) : NULL;
    return e ? &e->key : NULL;
}

void coord_names_free(struct coord_names *names)
{
    free(names->e);
    config_unref(names->cfg);
    memset(names, 0, sizeof *names);
}

void coord_heard(struct state *st, const struct coord_names *names, const struct state_redis_id *host,
                 const struct state_redis_msg *m, int64_t now)
{
    if (m->kind != STATE_REDIS_MSG_READ || strncmp(m->id, host->hex, 16) == 0)
        return; /* this host's own read is in its ring already */
    const struct state_key *key = coord_names_find(names, &m->key);
    if (key != NULL)
        state_heard(st, key, (uint32_t)siphash24(NAME_HASH_KEY, m->id, strlen(m->id)), now);
}

void coord_keys_learn(struct coord_keys *ks, struct state_redis *redis, const struct shop *shop, int64_t now)
{
    struct state_redis_id rk;
    if (ks == NULL || !state_redis_key_id(redis, shop->secret, &rk))
        return;
    int slot = 0;
    for (int i = 0; i < COORD_KEYS; i++) {
        if (ks->e[i].used != 0 && strcmp(ks->e[i].rkey.hex, rk.hex) == 0) {
            ks->e[i].used = now > 0 ? now : 1;
            return;
        }
        if (ks->e[i].used < ks->e[slot].used)
            slot = i; /* a free one (0) or the least recently used */
    }
    ks->e[slot].rkey = rk;
    ks->e[slot].key = shop->key;
    ks->e[slot].used = now > 0 ? now : 1;
}

const struct state_key *coord_keys_find(const struct coord_keys *ks, const struct state_redis_id *rkey)
{
    if (ks == NULL)
        return NULL;
    for (int i = 0; i < COORD_KEYS; i++)
        if (ks->e[i].used != 0 && strcmp(ks->e[i].rkey.hex, rkey->hex) == 0)
            return &ks->e[i].key;
    return NULL;
}

void coord_mirror_unwatched(struct state *st, const struct coord_keys *ks, const struct state_redis_msg *m,
                            int64_t now)
{
    if (m->kind != STATE_REDIS_MSG_FINAL)
        return;
    const struct state_key *key = coord_keys_find(ks, &m->key);
    if (key != NULL && state_known(st, key, m->id, now)) /* nothing known here: nothing to mirror */
        coord_mirror_final(st, key, m->id, m->word, now);
}
