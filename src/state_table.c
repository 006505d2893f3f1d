/* state_table.c - the transaction and key tables (callers hold the
 * lock): finding, making and evicting entries, and the per-key quota. */
#include "state_private.h"

#include <string.h>

#include "siphash.h"
#include "util.h"

/* ---- tables (callers hold the lock) ---- */

uint32_t st_tx_bucket(struct state *st, const struct state_key *key, const char *id)
{
    uint8_t buf[16 + STATE_ID_MAX];
    size_t n = strnlen(id, STATE_ID_MAX);
    memcpy(buf, key->b, 16);
    memcpy(buf + 16, id, n);
    return (uint32_t)(siphash24(st->h->salt, buf, 16 + n) & (uint64_t)(st->nb - 1));
}

/* What a client's 404 is counted against: (key, id), hashed. */
uint32_t st_tx_what(struct state *st, const struct state_key *key, const char *id)
{
    uint8_t buf[17 + STATE_ID_MAX];
    size_t n = strnlen(id, STATE_ID_MAX);
    buf[0] = 'w';
    memcpy(buf + 1, key->b, 16);
    memcpy(buf + 17, id, n);
    uint32_t w = (uint32_t)siphash24(st->h->salt, buf, 17 + n);
    return w != 0 ? w : 1; /* 0: none */
}

struct st_tx *st_tx_find(struct state *st, const struct state_key *key, const char *id)
{
    int32_t steps = 0;
    for (int32_t i = st->buckets[st_tx_bucket(st, key, id)]; i >= 0 && i < st->txn && steps++ < st->txn; i = st->txs[i].next) {
        struct st_tx *e = &st->txs[i];
        if (e->used && memcmp(e->key.b, key->b, 16) == 0 && strcmp(e->id, id) == 0)
            return e;
    }
    return NULL;
}

static bool tx_idle(const struct st_tx *e, int64_t now)
{
    return e->inflight_until <= now && now - e->last_start > PACE_EPISODE_MS && e->not_before <= now &&
           e->remote_until <= now && e->remote_not_before <= now && !(e->holders > 0 && e->hold_until > now);
}

static void tx_unlink(struct state *st, int32_t idx)
{
    struct st_tx *e = &st->txs[idx];
    int32_t *pp = &st->buckets[st_tx_bucket(st, &e->key, e->id)], steps = 0;
    while (*pp >= 0 && *pp < st->txn && *pp != idx && steps++ < st->txn)
        pp = &st->txs[*pp].next;
    if (*pp == idx)
        *pp = e->next;
}

static struct st_keyent *key_make(struct state *st, const struct state_key *key, int64_t now);

/* The per-key quota, from the region (state_open), kept within 1 .. txn. */
int32_t st_tx_quota(const struct state *st)
{
    int32_t q = st->h->tx_per_key;
    return q < 1 ? 1 : q > st->txn ? st->txn : q;
}

/* Put entry idx on key k's ring, just behind where the next look starts
 * (it is looked at last). */
static void ring_add(struct state *st, struct st_keyent *k, int32_t idx)
{
    struct st_tx *e = &st->txs[idx];
    int32_t c = k->kcursor;
    if (c < 0 || c >= st->txn) {
        e->knext = e->kprev = idx;
        k->kcursor = idx;
        return;
    }
    int32_t p = st->txs[c].kprev;
    if (p < 0 || p >= st->txn)
        p = c; /* (rebuilt on every check; bounds kept anyway) */
    e->knext = c;
    e->kprev = p;
    st->txs[p].knext = idx;
    st->txs[c].kprev = idx;
}

/* Take entry idx off key k's ring. */
static void ring_del(struct state *st, struct st_keyent *k, int32_t idx)
{
    struct st_tx *e = &st->txs[idx];
    int32_t n = e->knext, p = e->kprev;
    if (n == idx || n < 0 || n >= st->txn || p < 0 || p >= st->txn) {
        if (k->kcursor == idx || n == idx)
            k->kcursor = -1;
    } else {
        st->txs[p].knext = n;
        st->txs[n].kprev = p;
        if (k->kcursor == idx)
            k->kcursor = n;
    }
    e->knext = e->kprev = -1;
}

/* May an entry of the table be of a key that has no key entry (an
 * orphan)? Only after a key entry was forgotten (key_evictions), an entry
 * was made when no key slot was free (key_full: st_tx_get counts its
 * own), or the file was repaired or recovered (a key entry dropped): the
 * header's counters, which only grow, say so for every process. Until
 * then a new key's entry adopts nothing, and its making looks at no
 * transaction slot (a box with many shops makes many). */
static bool orphans_may_exist(const struct state *st)
{
    const struct st_hdr *h = st->h;
    return h->key_evictions != 0 || h->key_full != 0 || h->repairs != 0 || h->recoveries != 0;
}

/* Count the entries of k's key in the table and put them on its ring
 * (O(slots), for a key entry being made, and only when orphans may exist;
 * the ring of a key whose entry was forgotten means nothing). */
static void ring_adopt(struct state *st, struct st_keyent *k)
{
    k->ntx = 0;
    k->kcursor = -1;
    if (!orphans_may_exist(st))
        return; /* every entry's key has its entry: none is this new key's */
    st->looked += st->txn;
    for (int32_t i = 0; i < st->txn; i++)
        if (st->txs[i].used && memcmp(st->txs[i].key.b, k->key.b, 16) == 0) {
            ring_add(st, k, i);
            k->ntx++;
        }
}

/* The entries of `key` in the table, counted (O(slots): only when every
 * key slot is in use and the key has none). */
static int32_t tx_count(const struct state *st, const struct state_key *key)
{
    int32_t n = 0;
    for (int32_t i = 0; i < st->txn; i++)
        n += st->txs[i].used && memcmp(st->txs[i].key.b, key->b, 16) == 0;
    return n;
}

/* Every key entry's ntx and ring, from the table (O(slots + keys)). */
void st_key_recount(struct state *st)
{
    for (int32_t i = 0; i < st->keyn; i++) {
        st->keys[i].ntx = 0;
        st->keys[i].kcursor = -1;
    }
    for (int32_t i = 0; i < st->txn; i++) {
        st->txs[i].knext = st->txs[i].kprev = -1;
        struct st_keyent *k = st->txs[i].used ? st_key_find(st, &st->txs[i].key) : NULL;
        if (k != NULL) {
            ring_add(st, k, i);
            k->ntx++;
        }
    }
}

/* May entry i make room: idle, and of `only` when given? */
static bool tx_evictable(const struct st_tx *e, const struct state_key *only, int64_t now)
{
    return tx_idle(e, now) && (only == NULL || memcmp(e->key.b, only->b, 16) == 0);
}

/* The least recently used idle entry (of `only`, when given), or -1. Like
 * Redis' approximate LRU: a spread-out sample first, then, when it found
 * nothing, the whole table once. */
static int32_t tx_lru_idle(struct state *st, const struct state_key *only, int64_t now)
{
    int32_t n = st->txn, best = -1;
    int32_t start = (int32_t)util_jitter(n - 1);
    for (int32_t k = 0; k < EVICT_SAMPLE && k < n; k++) {
        int32_t i = (start + k * 97) % n; /* a spread-out sample */
        st->looked++;
        if (tx_evictable(&st->txs[i], only, now) && (best < 0 || st->txs[i].last_used < st->txs[best].last_used))
            best = i;
    }
    if (best < 0) { /* the sample found nothing: look everywhere once */
        st->looked += n;
        for (int32_t i = 0; i < n; i++)
            if (tx_evictable(&st->txs[i], only, now) && (best < 0 || st->txs[i].last_used < st->txs[best].last_used))
                best = i;
    }
    return best;
}

/* The least recently used idle entry among the next EVICT_SAMPLE of key
 * k's own (its ring, from its cursor), or -1; the cursor moves past them,
 * so that the next look sees the ones after. O(EVICT_SAMPLE), whatever the
 * table's size or the key's quota. */
static int32_t ring_lru_idle(struct state *st, struct st_keyent *k, int64_t now)
{
    int32_t best = -1, first = k->kcursor, i = first;
    for (int32_t n = 0; n < EVICT_SAMPLE && i >= 0 && i < st->txn; n++) {
        const struct st_tx *e = &st->txs[i];
        st->looked++;
        if (e->used && memcmp(e->key.b, k->key.b, 16) == 0 && tx_idle(e, now) &&
            (best < 0 || e->last_used < st->txs[best].last_used))
            best = i;
        i = e->knext;
        if (i == first)
            break; /* round them all */
    }
    if (i >= 0 && i < st->txn)
        k->kcursor = i;
    return best;
}

/* Every slot holds an entry in use, and a told status of `key` needs one
 * (state_tell, state.h): the one of `key`'s own entries whose loss harms
 * least, or -1 when `key` has none (another key's entry in use is never
 * taken: one tenant's notifies must not cost another tenant's buyers their
 * pace or reservation). Ranked, first to last: no read in flight
 * (forgetting one would let a second read start beside it); no held
 * request (its reservation would go); least recently used. O(slots): only
 * with every slot in use. */
static int32_t tx_least_harm(struct state *st, const struct state_key *key, int64_t now)
{
    int32_t best = -1;
    int64_t best_rank[2] = {0, 0};
    for (int32_t i = 0; i < st->txn; i++) {
        const struct st_tx *e = &st->txs[i];
        if (!e->used || memcmp(e->key.b, key->b, 16) != 0)
            continue;
        int64_t rank[2] = {
            e->inflight_until <= now,
            !(e->holders > 0 && e->hold_until > now),
        };
        int c = 0;
        for (int j = 0; j < 2 && c == 0; j++)
            c = rank[j] > best_rank[j] ? 1 : rank[j] < best_rank[j] ? -1 : 0;
        if (best < 0 || c > 0 || (c == 0 && e->last_used < st->txs[best].last_used)) {
            best = i;
            memcpy(best_rank, rank, sizeof rank);
        }
    }
    return best;
}

/* Find or create the entry of (key, id); NULL when there is no room.
 * Room for a new entry, in this order:
 *   - a key already at its quota (tx_per_key entries) takes the slot of
 *     the least recently used idle entry among the next EVICT_SAMPLE of its
 *     own (ring_lru_idle); with none idle there, a request's entry
 *     (`told` false) finds no room (counted: quota_full; full when the
 *     quota is the whole table), however many other slots are free: the
 *     rest of the table is the other keys';
 *   - otherwise a free slot, else the least recently used idle entry of
 *     any key (counted: evictions); with none, no room (counted: full),
 *     unless `told`: a status told by the shop (state_tell) then takes
 *     the slot of one of its own key's entries in use (tx_least_harm), if
 *     the key has any.
 * A told entry may so take a key past its quota; it is idle (evictable)
 * unless a request holds it, and a request's entry of that key finds
 * room only by evicting one of the key's own. `k`: the key's entry when
 * the caller has it, else NULL. */
struct st_tx *st_tx_get(struct state *st, const struct state_key *key, const char *id, int64_t now, bool told,
                           struct st_keyent *k)
{
    struct st_tx *e = st_tx_find(st, key, id);
    if (e != NULL)
        return e;
    if (k == NULL) { /* the caller has none: find or make it (NULL: every key slot in use) */
        k = key_make(st, key, now);
        if (k == NULL)
            st->h->key_full++; /* the entry made below is an orphan (orphans_may_exist) */
    }
    int32_t mine = k != NULL ? k->ntx : tx_count(st, key);
    int32_t idx = -1;
    if (mine >= st_tx_quota(st)) {
        idx = k != NULL ? ring_lru_idle(st, k, now) : tx_lru_idle(st, key, now);
        if (idx < 0 && !told) {
            if (st_tx_quota(st) < st->txn)
                st->h->quota_full++;
            else
                st->h->full++; /* no quota: the key's entries fill the table */
            return NULL;
        }
    }
    if (idx < 0) {
        idx = st->h->free_head;
        if (idx >= 0 && idx < st->txn) { /* (checked on open and after a crash; bounds kept anyway) */
            st->h->free_head = st->txs[idx].next;
            st->h->tx_used++;
        } else {
            idx = tx_lru_idle(st, NULL, now);
            if (idx < 0 && told)
                idx = tx_least_harm(st, key, now);
            if (idx < 0) {
                st->h->full++;
                return NULL;
            }
        }
    }
    if (st->txs[idx].used) { /* evicted */
        struct st_keyent *owner = st_key_find(st, &st->txs[idx].key);
        if (owner != NULL && owner->ntx > 0)
            owner->ntx--;
        if (owner != NULL)
            ring_del(st, owner, idx);
        tx_unlink(st, idx);
        st->h->evictions++;
    }
    e = &st->txs[idx];
    memset(e, 0, sizeof *e);
    e->used = 1;
    e->key = *key;
    util_copy(e->id, sizeof e->id, id);
    uint32_t b = st_tx_bucket(st, key, id);
    e->next = st->buckets[b];
    st->buckets[b] = idx;
    e->knext = e->kprev = -1;
    if (k != NULL) {
        k->ntx++;
        ring_add(st, k, idx);
    }
    return e;
}

uint32_t st_key_bucket(const struct state *st, const struct state_key *key)
{
    uint32_t v;
    memcpy(&v, key->b, sizeof v); /* a key id is a keyed hash already */
    return v & (uint32_t)(st->knb - 1);
}

struct st_keyent *st_key_find(struct state *st, const struct state_key *key)
{
    int32_t steps = 0;
    for (int32_t i = st->key_buckets[st_key_bucket(st, key)]; i >= 0 && i < st->keyn && steps++ < st->keyn;
         i = st->keys[i].next) {
        struct st_keyent *k = &st->keys[i];
        if (k->used && memcmp(k->key.b, key->b, 16) == 0)
            return k;
    }
    return NULL;
}

/* May this key's entry be forgotten? Only when that forgets nothing in
 * force: no pause runs and its budget ring holds no read newer than the
 * budget's span (so a new entry's empty ring allows exactly as much), and
 * so no read of it is in flight either (a claim pushes the ring). */
static bool key_idle(const struct st_keyent *k, int64_t now)
{
    if (!k->used || k->paused_until > now)
        return false;
    if (k->ring_n > 0 && k->ring[(k->ring_head - 1 + STATE_BUDGET_MAX) % STATE_BUDGET_MAX] > now - STATE_KEY_IDLE_MS)
        return false;
    return true;
}

static void key_unlink(struct state *st, int32_t idx)
{
    struct st_keyent *k = &st->keys[idx];
    int32_t *pp = &st->key_buckets[st_key_bucket(st, &k->key)], steps = 0;
    while (*pp >= 0 && *pp < st->keyn && *pp != idx && steps++ < st->keyn)
        pp = &st->keys[*pp].next;
    if (*pp == idx)
        *pp = k->next;
}

/* Find the key entry, or make one: a free slot, or the least recently
 * used idle key's, else the least recently used one whose only reads in
 * the last 60 s were 404s (no pause): probing never keeps a key out. NULL
 * when every slot holds a key in use (not counted: see st_key_get). */
static struct st_keyent *key_make(struct state *st, const struct state_key *key, int64_t now)
{
    struct st_keyent *k = st_key_find(st, key);
    if (k != NULL)
        return k;
    int32_t idx = st->h->key_free_head;
    if (idx >= 0 && idx < st->keyn) {
        st->h->key_free_head = st->keys[idx].next;
        st->h->key_used++;
    } else {
        int32_t best = -1;
        for (int32_t i = 0; i < st->keyn; i++) /* rare: only when full; bounded */
            if (key_idle(&st->keys[i], now) && (best < 0 || st->keys[i].last_used < st->keys[best].last_used))
                best = i;
        bool idle = best >= 0;
        /* then a key whose only recent reads were 404s (a prober's guesses
         * on a shop, or a removed shop's): it never keeps a key out */
        for (int32_t i = 0; i < st->keyn && !idle; i++)
            if (st->keys[i].used && st->keys[i].paused_until <= now && st_budget_only_404(&st->keys[i], now) &&
                (best < 0 || st->keys[i].last_used < st->keys[best].last_used))
                best = i;
        if (best < 0)
            return NULL;
        key_unlink(st, best);
        st->h->key_evictions++;
        idx = best;
    }
    k = &st->keys[idx];
    memset(k, 0, sizeof *k);
    k->used = 1;
    k->key = *key;
    k->last_used = now;
    ring_adopt(st, k); /* what a forgotten entry of this key counted */
    uint32_t b = st_key_bucket(st, key);
    k->next = st->key_buckets[b];
    st->key_buckets[b] = idx;
    return k;
}

/* Find the key entry; with `create`, make one when missing (key_make).
 * NULL when every slot holds a key in use (counted: key_full: a read or a
 * hold of that key finds no room, checking). */
struct st_keyent *st_key_get(struct state *st, const struct state_key *key, int64_t now, bool create)
{
    struct st_keyent *k = st_key_find(st, key);
    if (k != NULL || !create)
        return k;
    k = key_make(st, key, now);
    if (k == NULL)
        st->h->key_full++;
    return k;
}


#ifdef KEMBALI_TESTING
long state_test_looked(const struct state *st)
{
    return st->looked;
}
#endif
