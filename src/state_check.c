/* state_check.c - checking and repairing the region (see state_private.h):
 * every field read as whole, every link in range, every time within its
 * longest span; what was found is noted for st_unlock() to log. */
#include "state_private.h"

#include <string.h>

/* ---- checking the region ---- */

static bool nul_within(const char *s, size_t cap)
{
    return strnlen(s, cap) < cap;
}

/* Keep *t within [0, now + span (+ slack)]; counts a clamp. */
static void clamp_time(int64_t *t, int64_t now, int64_t span, long *dmg)
{
    if (*t < 0) {
        *t = 0;
        dmg[DMG_TIME]++;
    } else if (*t > now + span + SPAN_SLACK) {
        *t = now + span;
        dmg[DMG_TIME]++;
    }
}

/* The header's own fields. The geometry is restored from the process's
 * copy (the region was sized by it, or st_lock adopted a growth that was
 * whole; a growth whose process died before it bumped geom is so undone:
 * the entries it kept stay, and the links are rebuilt from them);
 * counters and strings are made sane. */
static void hdr_check(struct state *st, int64_t now, long *dmg)
{
    struct st_hdr *h = st->h;
    if (h->tx_slots != st->txn || h->key_slots != st->keyn || h->nbuckets != st->nb || h->key_nbuckets != st->knb ||
        h->client_slots != st->cln || h->size != st->size || h->buckets_off != st->buckets_off ||
        h->txs_off != st->txs_off || h->clients_off != st->clients_off || h->keys_off != st->keys_off ||
        h->key_buckets_off != st->key_buckets_off || h->geom != st->geom) {
        h->client_slots = st->cln;
        h->tx_slots = st->txn;
        h->key_slots = st->keyn;
        h->nbuckets = st->nb;
        h->key_nbuckets = st->knb;
        h->size = st->size;
        h->buckets_off = st->buckets_off;
        h->txs_off = st->txs_off;
        h->clients_off = st->clients_off;
        h->keys_off = st->keys_off;
        h->key_buckets_off = st->key_buckets_off;
        h->geom = st->geom;
        dmg[DMG_HEADER]++;
    }
    if (!nul_within(h->last_401_shop, sizeof h->last_401_shop)) {
        memset(h->last_401_shop, 0, sizeof h->last_401_shop);
        dmg[DMG_HEADER]++;
    }
    long *counters[] = {&h->evictions, &h->full, &h->recoveries, &h->repairs, &h->stale_locks,
                        &h->key_evictions, &h->key_full, &h->client_blocks, &h->client_full, &h->quota_full,
                        &h->key_growths};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        if (*counters[i] < 0) {
            *counters[i] = 0;
            dmg[DMG_HEADER]++;
        }
    clamp_time(&h->host_paused_until, now, SPAN_HOST_PAUSE, dmg);
    for (int i = 0; i < STATE_AUTH_FAILS_MAX; i++) {
        clamp_time(&h->auth_until[i], now, SPAN_LEASE + STATE_AUTH_SPAN_MS, dmg);
        if (h->auth_serial[i] > h->serial) { /* a claim's serial: never one not handed out */
            h->auth_serial[i] = 0;
            dmg[DMG_HEADER]++;
        }
    }
    if (h->tx_per_key < 1 || h->tx_per_key > st->txn) {
        h->tx_per_key = state_per_key_default(st->txn);
        dmg[DMG_HEADER]++;
    }
    if (h->read_timeout_ms < 1 || h->read_timeout_ms > STATE_LEASE_MAX_MS) {
        h->read_timeout_ms = STATE_READ_TIMEOUT_MS_DEFAULT;
        dmg[DMG_HEADER]++;
    }
}

/* One transaction entry: drop it unless every field reads as whole. */
static void tx_check_entry(struct state *st, struct st_tx *e, int64_t now, long *dmg)
{
    if (e->used == 0)
        return;
    if (e->used != 1 || !ids_valid_id(e->id) || e->status > TXS_UNKNOWN ||
        !nul_within(e->status_word, sizeof e->status_word) || e->not_found > 1 || e->unknown_seen > 1 ||
        e->reads < 0 || e->early_reads < 0 || e->holders < 0 || e->withheld < 0 || e->withheld > 1 ||
        e->remote_why > WAIT_BUDGET || (e->remote_why == WAIT_NONE && e->remote_not_before > 0)) {
        int32_t next = e->next;
        memset(e, 0, sizeof *e);
        e->next = next; /* the links are checked (and rebuilt) next */
        dmg[DMG_TX_ENTRY]++;
        return;
    }
    clamp_time(&e->known_until, now,
               e->not_found ? STATE_TTL_NOT_FOUND_MS
               : e->status == TXS_EXPIRED ? STATE_TTL_EXPIRED_MS : STATE_TTL_FINAL_MS, dmg);
    clamp_time(&e->last_start, now, 0, dmg);
    clamp_time(&e->last_end, now, 0, dmg);
    clamp_time(&e->not_before, now, SPAN_RETRY, dmg);
    clamp_time(&e->inflight_until, now, SPAN_LEASE, dmg);
    clamp_time(&e->remote_until, now, SPAN_LEASE, dmg);
    clamp_time(&e->remote_not_before, now, STATE_DEFER_MAX_MS, dmg);
    /* the budget plan's: a hold lasts at most a held request's deadline */
    clamp_time(&e->hold_until, now, SPAN_HOLD, dmg);
    clamp_time(&e->resv_at, now, SPAN_HOLD, dmg);
    clamp_time(&e->last_used, now, 0, dmg);
    if (e->inflight_serial > st->h->serial || e->facts_serial > st->h->serial) {
        /* no serial may be handed out twice */
        st->h->serial = e->inflight_serial > e->facts_serial ? e->inflight_serial : e->facts_serial;
        dmg[DMG_HEADER]++;
    }
}

/* Are bucket heads, chains, the free list and tx_used exactly what the
 * entries say? Every walk is bounded by the table size. */
static bool tx_links_ok(struct state *st)
{
    int32_t n = st->txn, steps = 0, in_chains = 0, in_free = 0, used = 0;
    for (int32_t b = 0; b < st->nb; b++) {
        for (int32_t i = st->buckets[b]; i != -1; i = st->txs[i].next) {
            if (i < 0 || i >= n || steps++ >= n)
                return false;
            const struct st_tx *e = &st->txs[i];
            if (!e->used || st_tx_bucket(st, &e->key, e->id) != (uint32_t)b)
                return false; /* in no chain or in two: a count below says so */
            in_chains++;
        }
    }
    for (int32_t i = st->h->free_head; i != -1; i = st->txs[i].next) {
        if (i < 0 || i >= n || steps++ >= n || st->txs[i].used)
            return false;
        in_free++;
    }
    for (int32_t i = 0; i < n; i++)
        used += st->txs[i].used != 0;
    return in_chains == used && in_free == n - used && st->h->tx_used == used;
}

/* Rebuild everything derived (hash chains, free list, tx_used) from the
 * entries themselves. O(slots). */
static void tx_relink(struct state *st)
{
    struct st_hdr *h = st->h;
    for (int32_t i = 0; i < st->nb; i++)
        st->buckets[i] = -1;
    h->free_head = -1;
    h->tx_used = 0;
    for (int32_t i = st->txn - 1; i >= 0; i--) {
        struct st_tx *e = &st->txs[i];
        if (e->used) {
            uint32_t b = st_tx_bucket(st, &e->key, e->id);
            e->next = st->buckets[b];
            st->buckets[b] = i;
            h->tx_used++;
        } else {
            memset(e, 0, sizeof *e);
            e->next = h->free_head;
            h->free_head = i;
        }
    }
}

/* One key entry: a budget ring that does not read as whole is dropped
 * (a budget forgotten is better than an index out of bounds); its times
 * are clamped, so that a damaged ring can never pause a key for longer
 * than its spans. */
static void key_check_entry(struct st_keyent *k, int64_t now, long *dmg)
{
    if (k->used == 0)
        return;
    if (k->used != 1 || k->ring_head < 0 || k->ring_head >= STATE_BUDGET_MAX || k->ring_n < 0 ||
        k->ring_n > STATE_BUDGET_MAX) {
        int32_t next = k->next;
        memset(k, 0, sizeof *k);
        k->next = next; /* the links are checked (and rebuilt) next */
        dmg[DMG_KEY_ENTRY]++;
        return;
    }
    clamp_time(&k->paused_until, now, SPAN_KEY_PAUSE, dmg);
    clamp_time(&k->last_used, now, 0, dmg);
    if (k->accepted > 1) { /* not a flag: not accepted (its reads count until one is) */
        k->accepted = 0;
        dmg[DMG_KEY_ENTRY]++;
    }
    /* the budget plan's: every waiting index is checked where it is used
     * (st_waiting_tx); only the counts can hurt */
    if (k->nwaiting < 0 || k->nwaiting > ST_WAITING_MAX || k->arr_head < 0 || k->arr_head >= ST_ARRIVALS ||
        k->arr_n < 0 || k->arr_n > ST_ARRIVALS) {
        k->nwaiting = k->arr_head = k->arr_n = 0;
        dmg[DMG_KEY_ENTRY]++;
    }
    for (int32_t j = 0; j < k->arr_n; j++)
        clamp_time(&k->arrivals[j], now, 0, dmg);
    for (int32_t j = 0; j < k->ring_n; j++) { /* only the ring_n newest are ever read */
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        clamp_time(&k->ring[i], now, 0, dmg);
        if (k->ring_nf[i] > RING_NF_PROBE) {
            k->ring_nf[i] = 0;
            dmg[DMG_KEY_ENTRY]++;
        }
        if (k->ring_kind[i] > RING_HEARD) {
            k->ring_kind[i] = RING_HEARD; /* never sent as this host's */
            dmg[DMG_KEY_ENTRY]++;
        }
    }
}

/* One client entry: dropped unless whole and within its ways (a lookup
 * would never find it elsewhere); its times clamped. */
static void client_check_entry(struct state *st, int32_t idx, int64_t now, long *dmg)
{
    struct st_client *c = &st->clients[idx];
    if (c->used == 0)
        return;
    int32_t ways = st->cln < CLIENT_WAYS ? st->cln : CLIENT_WAYS;
    int32_t off = (idx - st_client_home(st, c->id) + st->cln) % st->cln;
    if (c->used != 1 || c->tier >= STATE_CLIENT_TIERS || c->nhits > STATE_CLIENT_404S_AT(c->tier) ||
        c->nfly > STATE_CLIENT_404S_AT(c->tier) || off >= ways) {
        memset(c, 0, sizeof *c);
        dmg[DMG_CLIENT]++;
        return;
    }
    clamp_time(&c->blocked_until, now, STATE_CLIENT_BLOCK_MS, dmg);
    clamp_time(&c->last_used, now, 0, dmg);
    for (int i = 0; i < c->nhits; i++)
        clamp_time(&c->hit_at[i], now, 0, dmg);
    for (int i = 0; i < c->nfly; i++)
        clamp_time(&c->fly_until[i], now, SPAN_LEASE, dmg);
}

/* As tx_links_ok(), for the key table. */
static bool key_links_ok(struct state *st)
{
    int32_t n = st->keyn, steps = 0, in_chains = 0, in_free = 0, used = 0;
    for (int32_t b = 0; b < st->knb; b++) {
        for (int32_t i = st->key_buckets[b]; i != -1; i = st->keys[i].next) {
            if (i < 0 || i >= n || steps++ >= n)
                return false;
            if (!st->keys[i].used || st_key_bucket(st, &st->keys[i].key) != (uint32_t)b)
                return false;
            in_chains++;
        }
    }
    for (int32_t i = st->h->key_free_head; i != -1; i = st->keys[i].next) {
        if (i < 0 || i >= n || steps++ >= n || st->keys[i].used)
            return false;
        in_free++;
    }
    for (int32_t i = 0; i < n; i++)
        used += st->keys[i].used != 0;
    return in_chains == used && in_free == n - used && st->h->key_used == used;
}

void st_key_relink(struct state *st)
{
    struct st_hdr *h = st->h;
    for (int32_t i = 0; i < st->knb; i++)
        st->key_buckets[i] = -1;
    h->key_free_head = -1;
    h->key_used = 0;
    for (int32_t i = st->keyn - 1; i >= 0; i--) {
        struct st_keyent *k = &st->keys[i];
        if (k->used) {
            uint32_t b = st_key_bucket(st, &k->key);
            k->next = st->key_buckets[b];
            st->key_buckets[b] = i;
            h->key_used++;
        } else {
            memset(k, 0, sizeof *k);
            k->next = h->key_free_head;
            h->key_free_head = i;
        }
    }
}

/* Check every table of the region (`full`), or only the header, and
 * repair what is wrong, with the region to ourselves (the lock held, or no
 * other user). Returns the number of repairs; what was found is added to
 * st->notice. */
long st_region_check(struct state *st, int64_t now, bool full)
{
    long *dmg = st->notice.dmg, before = 0, after = 0;
    for (int i = 0; i < DMG_N; i++)
        before += dmg[i];
    hdr_check(st, now, dmg);
    if (!full)
        goto out;
    for (int32_t i = 0; i < st->txn; i++)
        tx_check_entry(st, &st->txs[i], now, dmg);
    if (!tx_links_ok(st)) {
        tx_relink(st);
        dmg[DMG_TX_LINKS]++;
    }
    for (int32_t i = 0; i < st->keyn; i++)
        key_check_entry(&st->keys[i], now, dmg);
    if (!key_links_ok(st)) {
        st_key_relink(st);
        dmg[DMG_KEY_LINKS]++;
    }
    st_key_recount(st); /* derived: never trusted from the file */
    for (int32_t i = 0; i < st->cln; i++)
        client_check_entry(st, i, now, dmg);
out:
    for (int i = 0; i < DMG_N; i++)
        after += dmg[i];
    if (after > before)
        st->h->repairs++;
    return after - before;
}
