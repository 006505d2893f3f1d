/* state.c - see state.h.
 *
 * Layout of the region (all offsets from its start, no pointers inside):
 *   struct st_hdr | int32 buckets[nbuckets] | struct st_tx txs[tx_slots]
 *   | int32 key_buckets[key_nbuckets] | struct st_keyent keys[key_slots]
 *   | struct st_client clients[client_slots]
 * Transactions are kept in a chained hash table (bucket heads and `next`
 * are indexes; -1 ends a chain; unused entries on a free list) keyed by
 * SipHash(salt, key id || tx id); keys likewise, by their id (itself a
 * keyed hash). Clients (the 404s charged to an address) live in a
 * set-associative table: a client's entry is one of CLIENT_WAYS slots from
 * its home slot, so a lookup looks at no more than CLIENT_WAYS entries and
 * nothing links them.
 * When the table is full, an idle entry is evicted: like Redis' approximate
 * LRU, a sample of entries is examined and the least recently used idle one
 * goes. An entry is idle when no read of it is in flight, its episode is
 * over and no Retry-After or pause of its own is running, nor any wait
 * another host's word set (state_defer); entries in use are never evicted.
 * No key's entries take more than the region's tx_per_key slots (see
 * tx_get): one shop's public URL, however hammered, leaves the rest of the
 * table to the other shops. Each key entry counts its transaction entries
 * (ntx), recounted from the table whenever a key entry is made or the
 * region is checked. */
#include "state.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <arpa/inet.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "ids.h"
#include "log.h"
#include "plan.h"
#include "ratelimit.h"
#include "util.h"

#define ST_MAGIC 0x696c61626d656bULL /* "kembali" */
#define ST_VERSION 8 /* 6: the per-key quota (tx_per_key, quota_full, ntx); 7: a client's reads in flight; 8: last_end */
#define ST_WAITING_MAX 512    /* transactions one key waits on at once, for the plan */
#define ST_ARRIVALS 64        /* the latest first holds of a key: its arrival rate */
#define ST_PLAN_RETRY_MS RULES_PLAN_RECHECK_MS  /* a read withheld for fairness looks again after this */
#define EVICT_SAMPLE 64

struct st_tx {
    int32_t next;
    uint8_t used;
    uint8_t status;         /* enum tx_status of the last status read */
    uint8_t not_found;      /* known_until is a 404's memory */
    uint8_t unknown_seen;
    uint8_t remote_why;     /* enum state_wait of remote_not_before */
    int32_t reads;          /* reads started in the current episode */
    struct state_key key;
    char id[STATE_ID_MAX + 1];
    char status_word[STATUS_WORD_MAX + 1];
    int64_t known_until;    /* cache of a final status, or 404 memory */
    int64_t last_start;     /* start of the last read */
    int64_t last_end;       /* when the last read's answer came back (the floor, rules_floor) */
    int64_t not_before;     /* Retry-After, stated reset, rejected episode */
    int64_t inflight_until; /* lease of the read in flight; 0 when none */
    uint64_t inflight_serial; /* serial of the last read claimed */
    uint64_t facts_serial;    /* serial of the read whose outcome is recorded (a told one: the last claimed) */
    int64_t last_used;
    /* what other hosts say (state_defer) */
    int64_t remote_until;      /* a read of it in flight there until then; 0: none */
    int64_t remote_not_before; /* no read here before then */
    /* the budget plan (plan.h) */
    int32_t holders;        /* held requests, over every process */
    int32_t withheld;       /* the plan held a read of it back in this hold */
    int32_t early_reads;    /* reads of this episode other than last-chance ones */
    int64_t hold_until;     /* the latest deadline of a held request */
    int64_t resv_at;        /* its reserved last-chance read may start then; 0: none */
};

struct st_keyent {
    struct state_key key;
    int32_t next;
    uint8_t used;
    int32_t ntx;                        /* transaction entries of this key (tx_get) */
    int64_t paused_until;
    int64_t last_used;
    int32_t ring_head, ring_n;          /* the last STATE_BUDGET_MAX read starts */
    int64_t ring[STATE_BUDGET_MAX];
    /* the budget plan: transactions waiting (indexes into txs, checked on
     * every use), and when the latest ones were first held */
    int32_t nwaiting;
    int32_t waiting[ST_WAITING_MAX];
    int32_t arr_head, arr_n;
    int64_t arrivals[ST_ARRIVALS];
};

struct st_client {
    struct state_client id;
    uint8_t used;
    uint8_t nhits;              /* 404s in hit_*[0..nhits), oldest first */
    uint8_t nfly;               /* reads in flight of ids nobody knew, in fly_*[0..nfly) */
    int64_t blocked_until;
    int64_t last_used;
    uint32_t hit_what[STATE_CLIENT_404S]; /* a hash of (key, id): ids counted once */
    int64_t hit_at[STATE_CLIENT_404S];
    uint32_t fly_what[STATE_CLIENT_404S];
    int64_t fly_until[STATE_CLIENT_404S]; /* their leases */
};

#define CLIENT_WAYS 8

struct st_hdr {
    uint64_t magic, version, size;
    pthread_mutex_t mu;
    uint8_t salt[16];
    uint32_t gen;             /* futex word: bumped when a read ends */
    uint32_t pad0;
    uint64_t serial;
    int32_t tx_slots, key_slots, nbuckets, free_head;
    int32_t key_nbuckets, key_free_head;
    int32_t client_slots, tx_per_key; /* tx_per_key: the per-key quota (state_open) */
    int64_t read_timeout_ms;
    int64_t host_paused_until;
    char last_401_shop[STATE_SHOP_MAX + 1];
    long tx_used, evictions, full, recoveries, repairs, stale_locks;
    long key_used, key_evictions, key_full;
    long client_blocks, client_full;
    long last_chance_reads;
    long quota_full;          /* new entries refused by the per-key quota */
    size_t buckets_off, txs_off, key_buckets_off, keys_off, clients_off;
};

/* What a check or repair found, kept in the process (never in the shared
 * region) while the lock is held and logged once after it is released. */
enum st_damage {
    DMG_HEADER = 0, /* geometry, free list head, counters, serial, strings */
    DMG_TX_ENTRY,   /* an entry that did not read as whole: dropped */
    DMG_TX_LINKS,   /* bucket heads, chains, free list or tx_used: relinked */
    DMG_KEY_ENTRY,  /* a key entry whose ring did not read as whole: dropped */
    DMG_KEY_LINKS,  /* key bucket heads, chains, free list or key_used: relinked */
    DMG_CLIENT,     /* a client entry that did not read as whole, or out of its ways: dropped */
    DMG_TIME,       /* a time beyond its longest span (another boot's clock): clamped */
    DMG_N
};

struct st_notice {
    bool owner_died;   /* EOWNERDEAD: a process died holding the lock */
    long dmg[DMG_N];
};

struct state {
    bool greedy;              /* this process does not plan (state_opts.greedy) */
    size_t mapped;            /* length of a file mapping; 0 for state_new() memory */
    int users_fd;             /* kembali.users, flocked LOCK_SH while mapped; -1 for memory */
    /* the geometry, copied when attached: every index is checked against
     * these, never against the (writable, shared) header */
    int32_t txn, keyn, nb, knb, cln;
    struct st_hdr *h;
    int32_t *buckets;
    struct st_tx *txs;
    int32_t *key_buckets;
    struct st_keyent *keys;
    struct st_client *clients;
    struct st_notice notice;  /* written only under the lock; logged by st_unlock() */
};

/* ---- SipHash-2-4 (Aumasson & Bernstein), for key ids and hashing ---- */

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

#define ROTL(x, b) (uint64_t)(((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                          \
    do {                                                                  \
        v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);        \
        v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                            \
        v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                            \
        v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);        \
    } while (0)

uint64_t state_siphash(const uint8_t k[16], const void *data, size_t len)
{
    const uint8_t *in = data;
    uint64_t k0 = le64(k), k1 = le64(k + 8);
    uint64_t v0 = 0x736f6d6570736575ULL ^ k0, v1 = 0x646f72616e646f6dULL ^ k1;
    uint64_t v2 = 0x6c7967656e657261ULL ^ k0, v3 = 0x7465646279746573ULL ^ k1;
    uint64_t b = (uint64_t)len << 56;
    const uint8_t *end = in + len - (len % 8);
    for (; in != end; in += 8) {
        uint64_t m = le64(in);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    for (int i = (int)(len & 7) - 1; i >= 0; i--)
        b |= (uint64_t)in[i] << (8 * i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}

/* ---- checking the region ---- */

static bool nul_within(const char *s, size_t cap)
{
    return strnlen(s, cap) < cap;
}

static uint32_t tx_bucket(struct state *st, const struct state_key *key, const char *id);

/* The longest a time can honestly lie ahead of `now`: anything later was
 * written by another boot's clock (a restored file) or is damage. */
#define SPAN_LEASE (STATE_LEASE_MAX_MS + 1000)
#define SPAN_RETRY (RL_MAX_WAIT_MS > PACE_EPISODE_MS + 1 ? RL_MAX_WAIT_MS : PACE_EPISODE_MS + 1)
#define SPAN_KEY_PAUSE (RL_MAX_WAIT_MS > STATE_UNAUTH_PAUSE_MS ? RL_MAX_WAIT_MS : STATE_UNAUTH_PAUSE_MS)
#define SPAN_HOST_PAUSE (RL_MAX_WAIT_MS > STATE_HOST_PAUSE_MS * 2 ? RL_MAX_WAIT_MS : STATE_HOST_PAUSE_MS * 2)

/* Callers' clocks may lag a little behind the one a check reads. */
#define SPAN_HOLD ((int64_t)PACE_MAX_STEPS * PACE_MAX_WAIT_MS + PACE_GRACE_MS) /* the longest a request is held */
#define SPAN_SLACK 10000

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
 * copy (the region was sized by it); counters and strings are made sane. */
static void hdr_check(struct state *st, int64_t now, long *dmg)
{
    struct st_hdr *h = st->h;
    if (h->tx_slots != st->txn || h->key_slots != st->keyn || h->nbuckets != st->nb || h->key_nbuckets != st->knb ||
        h->client_slots != st->cln) {
        h->client_slots = st->cln;
        h->tx_slots = st->txn;
        h->key_slots = st->keyn;
        h->nbuckets = st->nb;
        h->key_nbuckets = st->knb;
        dmg[DMG_HEADER]++;
    }
    if (!nul_within(h->last_401_shop, sizeof h->last_401_shop)) {
        memset(h->last_401_shop, 0, sizeof h->last_401_shop);
        dmg[DMG_HEADER]++;
    }
    long *counters[] = {&h->evictions, &h->full, &h->recoveries, &h->repairs, &h->stale_locks,
                        &h->key_evictions, &h->key_full, &h->client_blocks, &h->client_full, &h->quota_full};
    for (size_t i = 0; i < sizeof counters / sizeof counters[0]; i++)
        if (*counters[i] < 0) {
            *counters[i] = 0;
            dmg[DMG_HEADER]++;
        }
    clamp_time(&h->host_paused_until, now, SPAN_HOST_PAUSE, dmg);
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
            if (!e->used || tx_bucket(st, &e->key, e->id) != (uint32_t)b)
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
            uint32_t b = tx_bucket(st, &e->key, e->id);
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
    /* the budget plan's: every waiting index is checked where it is used
     * (waiting_tx); only the counts can hurt */
    if (k->nwaiting < 0 || k->nwaiting > ST_WAITING_MAX || k->arr_head < 0 || k->arr_head >= ST_ARRIVALS ||
        k->arr_n < 0 || k->arr_n > ST_ARRIVALS) {
        k->nwaiting = k->arr_head = k->arr_n = 0;
        dmg[DMG_KEY_ENTRY]++;
    }
    for (int32_t j = 0; j < k->arr_n; j++)
        clamp_time(&k->arrivals[j], now, 0, dmg);
    for (int32_t j = 0; j < k->ring_n; j++) /* only the ring_n newest are ever read */
        clamp_time(&k->ring[(k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX], now, 0, dmg);
}

static uint32_t key_bucket(const struct state *st, const struct state_key *key);
static void key_recount(struct state *st);
static int32_t client_home(const struct state *st, const struct state_client *c);

/* One client entry: dropped unless whole and within its ways (a lookup
 * would never find it elsewhere); its times clamped. */
static void client_check_entry(struct state *st, int32_t idx, int64_t now, long *dmg)
{
    struct st_client *c = &st->clients[idx];
    if (c->used == 0)
        return;
    int32_t ways = st->cln < CLIENT_WAYS ? st->cln : CLIENT_WAYS;
    int32_t off = (idx - client_home(st, &c->id) + st->cln) % st->cln;
    if (c->used != 1 || c->nhits > STATE_CLIENT_404S || c->nfly > STATE_CLIENT_404S || off >= ways) {
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
            if (!st->keys[i].used || key_bucket(st, &st->keys[i].key) != (uint32_t)b)
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

static void key_relink(struct state *st)
{
    struct st_hdr *h = st->h;
    for (int32_t i = 0; i < st->knb; i++)
        st->key_buckets[i] = -1;
    h->key_free_head = -1;
    h->key_used = 0;
    for (int32_t i = st->keyn - 1; i >= 0; i--) {
        struct st_keyent *k = &st->keys[i];
        if (k->used) {
            uint32_t b = key_bucket(st, &k->key);
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
static long region_check(struct state *st, int64_t now, bool full)
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
        key_relink(st);
        dmg[DMG_KEY_LINKS]++;
    }
    key_recount(st); /* derived: never trusted from the file */
    for (int32_t i = 0; i < st->cln; i++)
        client_check_entry(st, i, now, dmg);
out:
    for (int i = 0; i < DMG_N; i++)
        after += dmg[i];
    if (after > before)
        st->h->repairs++;
    return after - before;
}

/* ---- locking ---- */

static void st_lock(struct state *st, int64_t now)
{
    int rc = pthread_mutex_lock(&st->h->mu);
    if (rc == EOWNERDEAD) {
        /* A process died holding the lock (SIGKILL at any moment): what it
         * was changing may be half done. Leases of its reads stay and
         * expire on their own. */
        st->notice.owner_died = true;
        region_check(st, now, true);
        st->h->recoveries++;
        pthread_mutex_consistent(&st->h->mu);
    }
}

static const char *const dmg_names[DMG_N] = {"header", "tx_entries", "tx_links", "key_entries", "key_links", "clients", "times"};

/* Log what a check found (never under the lock). */
static void notice_log(const struct st_notice *n, const char *msg)
{
    struct log_line ll;
    log_begin(&ll, "warn", "state");
    log_str(&ll, "msg", msg);
    for (int i = 0; i < DMG_N; i++)
        if (n->dmg[i] > 0)
            log_int(&ll, dmg_names[i], n->dmg[i]);
    log_end(&ll);
}

static bool notice_any(const struct st_notice *n)
{
    if (n->owner_died)
        return true;
    for (int i = 0; i < DMG_N; i++)
        if (n->dmg[i] > 0)
            return true;
    return false;
}

static void st_unlock(struct state *st)
{
    struct st_notice n = st->notice;
    if (notice_any(&n))
        memset(&st->notice, 0, sizeof st->notice);
    pthread_mutex_unlock(&st->h->mu);
    if (n.owner_died)
        notice_log(&n, "a kembali process died holding the state lock; state checked and repaired");
}

/* ---- waiting for reads of other processes ---- */

static long futex(uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    return syscall(SYS_futex, addr, op, val, ts, NULL, 0);
}

static void st_bump(struct state *st)
{
    __atomic_add_fetch(&st->h->gen, 1, __ATOMIC_SEQ_CST);
    futex(&st->h->gen, FUTEX_WAKE, INT_MAX, NULL); /* shared mapping: not FUTEX_PRIVATE */
}

uint32_t state_generation(struct state *st)
{
    return __atomic_load_n(&st->h->gen, __ATOMIC_SEQ_CST);
}

uint32_t state_wait_change(struct state *st, uint32_t seen, int timeout_ms)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    if (state_generation(st) == seen)
        futex(&st->h->gen, FUTEX_WAIT, seen, &ts);
    return state_generation(st);
}

/* The mutex's lock word (glibc: the first int of pthread_mutex_t). Read
 * only when nobody else can use the region, to say in the log whether a
 * copy was taken while the lock was held. */
static uint32_t mutex_word(const pthread_mutex_t *mu)
{
    uint32_t w;
    memcpy(&w, mu, sizeof w);
    return w;
}

static int mutex_init(pthread_mutex_t *mu, char *err, size_t errlen)
{
    pthread_mutexattr_t a;
    pthread_mutexattr_init(&a);
    pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
    int rc = pthread_mutex_init(mu, &a);
    pthread_mutexattr_destroy(&a);
    if (rc != 0) {
        snprintf(err, errlen, "pthread_mutex_init: %s", strerror(rc));
        return -1;
    }
    return 0;
}

#ifdef KEMBALI_TESTING
void state_test_die_holding_lock(struct state *st, void (*damage)(struct state *st))
{
    pthread_mutex_lock(&st->h->mu);
    if (damage != NULL)
        damage(st);
    _exit(0);
}

/* The first entry in use (or the first free one), for the scribbles. */
static int32_t test_pick(struct state *st, bool used)
{
    for (int32_t i = 0; i < st->txn; i++)
        if ((st->txs[i].used != 0) == used)
            return i;
    return 0;
}

void state_test_damage(struct state *st, enum state_test_damage what)
{
    struct st_hdr *h = st->h;
    struct st_tx *u = &st->txs[test_pick(st, true)], *f = &st->txs[test_pick(st, false)];
    struct st_keyent *k = &st->keys[0];
    switch (what) {
    case STATE_TEST_BUCKET_OOB:
        for (int32_t b = 0; b < st->nb; b++)
            st->buckets[b] = b % 2 ? st->txn + b : -2 - b;
        break;
    case STATE_TEST_CHAIN_LOOP:
        u->next = (int32_t)(u - st->txs);
        break;
    case STATE_TEST_CHAIN_OOB:
        u->next = INT32_MAX;
        break;
    case STATE_TEST_FREE_OOB:
        h->free_head = st->txn;
        break;
    case STATE_TEST_FREE_LOOP:
        f->next = (int32_t)(f - st->txs);
        h->free_head = (int32_t)(f - st->txs);
        break;
    case STATE_TEST_TX_USED:
        h->tx_used = -3;
        break;
    case STATE_TEST_USED_FLAG:
        f->used = 7;
        break;
    case STATE_TEST_ID_NUL:
        memset(u->id, 'A', sizeof u->id);
        break;
    case STATE_TEST_WORD_NUL:
        memset(u->status_word, 'w', sizeof u->status_word);
        break;
    case STATE_TEST_STATUS:
        u->status = 200;
        u->not_found = 9;
        break;
    case STATE_TEST_TIMES:
        u->last_start = INT64_MAX;
        u->not_before = INT64_MAX - 5;
        u->known_until = INT64_MAX;
        u->inflight_until = INT64_MIN;
        u->reads = -4;
        h->host_paused_until = INT64_MAX;
        break;
    case STATE_TEST_REMOTE_TIMES:
        u->remote_until = INT64_MAX;
        u->remote_not_before = INT64_MAX - 3;
        u->remote_why = WAIT_PACE;
        break;
    case STATE_TEST_REMOTE_WAIT:
        u->remote_why = 200;
        break;
    case STATE_TEST_KEY_RING:
        k->ring_head = -1;
        k->ring_n = 100000;
        break;
    case STATE_TEST_KEY_TIMES:
        for (int32_t i = 0; i < STATE_BUDGET_MAX; i++)
            k->ring[i] = INT64_MAX - i;
        k->paused_until = INT64_MAX;
        break;
    case STATE_TEST_KEY_LINKS:
        for (int32_t b = 0; b < st->knb; b++)
            st->key_buckets[b] = b % 2 ? -9 : st->keyn;
        k->next = 0;
        h->key_free_head = INT32_MIN;
        h->key_used = st->keyn + 9;
        break;
    case STATE_TEST_KEY_USED_FLAG:
        for (int32_t i = 0; i < st->keyn; i++)
            if (!st->keys[i].used) {
                st->keys[i].used = 3;
                break;
            }
        break;
    case STATE_TEST_CLIENTS:
        for (int32_t i = 0; i < st->cln; i += 3) {
            st->clients[i].used = (uint8_t)(i % 2 ? 1 : 5);
            st->clients[i].nhits = (uint8_t)(i % 4 ? 200 : 1);
            st->clients[i].id.b[0] = (uint8_t)i;
            st->clients[i].blocked_until = INT64_MAX;
            st->clients[i].hit_at[0] = INT64_MAX;
        }
        break;
    case STATE_TEST_HEADER:
        h->tx_slots = 1 << 30;
        h->client_slots = 0;
        h->nbuckets = 3;
        h->key_slots = -1;
        h->key_nbuckets = 6;
        memset(h->last_401_shop, 'x', sizeof h->last_401_shop);
        h->serial = 0;
        h->recoveries = -8;
        h->read_timeout_ms = -1;
        h->tx_per_key = 0;
        break;
    }
}
#endif

/* ---- creation ---- */

/* The region's geometry for the given options. */
struct layout {
    int32_t txn, keyn, nb, knb, cln, per_key;
    size_t off_b, off_t, off_kb, off_k, off_c, size;
};

int state_per_key_default(int tx_slots)
{
    return tx_slots / 4 > 0 ? tx_slots / 4 : 1;
}

/* The quota `opts` asks for in a table of txn slots: its own, clamped to
 * 1 .. txn, or the default for txn. */
static int32_t per_key_for(const struct state_opts *opts, int32_t txn)
{
    if (opts->tx_per_key <= 0)
        return state_per_key_default(txn);
    return opts->tx_per_key < txn ? opts->tx_per_key : txn;
}

static void layout_for(const struct state_opts *opts, struct layout *l)
{
    l->txn = opts->tx_slots > 0 ? opts->tx_slots : STATE_SLOTS_DEFAULT;
    l->per_key = per_key_for(opts, l->txn);
    l->keyn = opts->key_slots > 0 ? opts->key_slots : STATE_KEY_SLOTS_DEFAULT;
    if (l->keyn > STATE_KEY_SLOTS_MAX)
        l->keyn = STATE_KEY_SLOTS_MAX;
    l->nb = 1;
    while (l->nb < l->txn && l->nb < (1 << 28))
        l->nb <<= 1;
    l->off_b = (sizeof(struct st_hdr) + 63) & ~(size_t)63;
    l->off_t = (l->off_b + (size_t)l->nb * sizeof(int32_t) + 63) & ~(size_t)63;
    l->knb = 1;
    while (l->knb < l->keyn && l->knb < (1 << 28))
        l->knb <<= 1;
    l->off_kb = (l->off_t + (size_t)l->txn * sizeof(struct st_tx) + 63) & ~(size_t)63;
    l->off_k = (l->off_kb + (size_t)l->knb * sizeof(int32_t) + 63) & ~(size_t)63;
    l->cln = opts->client_slots > 0 ? opts->client_slots : STATE_CLIENT_SLOTS_DEFAULT;
    if (l->cln > STATE_CLIENT_SLOTS_MAX)
        l->cln = STATE_CLIENT_SLOTS_MAX;
    l->off_c = (l->off_k + (size_t)l->keyn * sizeof(struct st_keyent) + 63) & ~(size_t)63;
    l->size = l->off_c + (size_t)l->cln * sizeof(struct st_client);
}

/* A fingerprint of this build's data layout: a region written by a build
 * with other structure sizes must not be read. */
static uint64_t layout_stamp(void)
{
    return ((uint64_t)ST_VERSION << 48) ^ ((uint64_t)sizeof(struct st_hdr) << 32) ^
           ((uint64_t)sizeof(struct st_tx) << 16) ^ (uint64_t)sizeof(struct st_keyent) ^
           ((uint64_t)sizeof(pthread_mutex_t) << 40);
}

/* Point st at a region laid out as the header says (checked by
 * region_usable() for a file) and keep a copy of its geometry. */
static void attach(struct state *st, uint8_t *base)
{
    st->h = (struct st_hdr *)base;
    st->txn = st->h->tx_slots;
    st->keyn = st->h->key_slots;
    st->nb = st->h->nbuckets;
    st->knb = st->h->key_nbuckets;
    st->cln = st->h->client_slots;
    st->buckets = (int32_t *)(base + st->h->buckets_off);
    st->txs = (struct st_tx *)(base + st->h->txs_off);
    st->key_buckets = (int32_t *)(base + st->h->key_buckets_off);
    st->keys = (struct st_keyent *)(base + st->h->keys_off);
    st->clients = (struct st_client *)(base + st->h->clients_off);
}

/* Initialise a zeroed region of l->size bytes. */
static int region_init(uint8_t *base, const struct layout *l, const struct state_opts *opts,
                       char *err, size_t errlen)
{
    struct st_hdr *h = (struct st_hdr *)base;
    h->magic = ST_MAGIC;
    h->version = layout_stamp();
    h->size = l->size;
    h->tx_slots = l->txn;
    h->key_slots = l->keyn;
    h->nbuckets = l->nb;
    h->key_nbuckets = l->knb;
    h->client_slots = l->cln;
    h->tx_per_key = l->per_key;
    h->read_timeout_ms = opts->read_timeout_ms > 0 ? opts->read_timeout_ms : STATE_READ_TIMEOUT_MS_DEFAULT;
    h->buckets_off = l->off_b;
    h->txs_off = l->off_t;
    h->key_buckets_off = l->off_kb;
    h->keys_off = l->off_k;
    h->clients_off = l->off_c;
    if (getrandom(h->salt, sizeof h->salt, 0) != (ssize_t)sizeof h->salt) {
        snprintf(err, errlen, "getrandom: %s", strerror(errno));
        return -1;
    }
    if (mutex_init(&h->mu, err, errlen) != 0)
        return -1;
    int32_t *buckets = (int32_t *)(base + l->off_b);
    struct st_tx *txs = (struct st_tx *)(base + l->off_t);
    for (int32_t i = 0; i < l->nb; i++)
        buckets[i] = -1;
    for (int32_t i = 0; i < l->txn; i++)
        txs[i].next = i + 1 < l->txn ? i + 1 : -1;
    h->free_head = 0;
    int32_t *kb = (int32_t *)(base + l->off_kb);
    struct st_keyent *keys = (struct st_keyent *)(base + l->off_k);
    for (int32_t i = 0; i < l->knb; i++)
        kb[i] = -1;
    for (int32_t i = 0; i < l->keyn; i++)
        keys[i].next = i + 1 < l->keyn ? i + 1 : -1;
    h->key_free_head = 0;
    return 0;
}

struct state *state_new(const struct state_opts *opts, char *err, size_t errlen)
{
    struct layout l;
    layout_for(opts, &l);
    struct state *st = calloc(1, sizeof *st);
    uint8_t *base = calloc(1, l.size);
    if (st == NULL || base == NULL || region_init(base, &l, opts, err, errlen) != 0) {
        if (st != NULL && base == NULL)
            snprintf(err, errlen, "cannot allocate %zu bytes of state", l.size);
        free(st);
        free(base);
        return NULL;
    }
    attach(st, base);
    st->greedy = opts->greedy;
    st->users_fd = -1;
    return st;
}

/* Does [off, off + n * size) lie within [lo, len), aligned for 64-bit
 * fields? Overflow-safe for any values read from a file. */
static bool span_ok(size_t off, int32_t n, size_t size, size_t lo, size_t len)
{
    return n >= 1 && off % 64 == 0 && off >= lo && off <= len && (size_t)n <= (len - off) / size;
}

/* Is the region at base (len bytes, from a file) one this build can use? */
static bool region_usable(const uint8_t *base, size_t len)
{
    const struct st_hdr *h = (const struct st_hdr *)base;
    if (len < sizeof *h || h->magic != ST_MAGIC || h->version != layout_stamp() || h->size != len)
        return false;
    if (h->tx_slots < 1 || h->key_slots < 1 || h->nbuckets < 1 || (h->nbuckets & (h->nbuckets - 1)) != 0 ||
        h->key_nbuckets < 1 || (h->key_nbuckets & (h->key_nbuckets - 1)) != 0)
        return false;
    return span_ok(h->buckets_off, h->nbuckets, sizeof(int32_t), sizeof *h, len) &&
           span_ok(h->txs_off, h->tx_slots, sizeof(struct st_tx), h->buckets_off + (size_t)h->nbuckets * sizeof(int32_t), len) &&
           span_ok(h->key_buckets_off, h->key_nbuckets, sizeof(int32_t), h->txs_off + (size_t)h->tx_slots * sizeof(struct st_tx), len) &&
           span_ok(h->keys_off, h->key_slots, sizeof(struct st_keyent), h->key_buckets_off + (size_t)h->key_nbuckets * sizeof(int32_t), len) &&
           span_ok(h->clients_off, h->client_slots, sizeof(struct st_client), h->keys_off + (size_t)h->key_slots * sizeof(struct st_keyent), len);
}

int state_check_dir(const char *dir, bool create, char *err, size_t errlen)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno == ENOENT && create && mkdir(dir, 0700) == 0)
            return 0;
        if (errno == ENOENT && !create) {
            char parent[4096];
            util_copy(parent, sizeof parent, dir);
            char *slash = strrchr(parent, '/');
            if (slash != NULL)
                *(slash == parent ? slash + 1 : slash) = '\0';
            if (slash != NULL && access(parent, W_OK | X_OK) == 0)
                return 0; /* it will be created, 0700 */
        }
        snprintf(err, errlen, "state_dir %s: %s", dir, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(sb.st_mode)) {
        snprintf(err, errlen, "state_dir %s is not a directory", dir);
        return -1;
    }
    if (sb.st_uid != geteuid() && sb.st_uid != 0) {
        snprintf(err, errlen, "state_dir %s belongs to another user (uid %u); it must be this user's",
                 dir, (unsigned)sb.st_uid);
        return -1;
    }
    if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(err, errlen, "state_dir %s can be written by other users (mode %03o); "
                 "chmod go-w it, or use a folder only this user can write", dir, (unsigned)(sb.st_mode & 0777));
        return -1;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        snprintf(err, errlen, "state_dir %s: %s", dir, strerror(errno));
        return -1;
    }
    return 0;
}

/* Create a fresh state file at `path` (via path.new and rename). */
static int create_file(const char *path, const struct layout *l, const struct state_opts *opts,
                       char *err, size_t errlen)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.new", path);
    unlink(tmp); /* left by a process that died while creating it */
    int fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd < 0) {
        snprintf(err, errlen, "%s: %s", tmp, strerror(errno));
        return -1;
    }
    uint8_t *base = MAP_FAILED;
    int rc = -1;
    if (ftruncate(fd, (off_t)l->size) != 0) {
        snprintf(err, errlen, "%s: cannot size it to %zu bytes: %s", tmp, l->size, strerror(errno));
        goto out;
    }
    base = mmap(NULL, l->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        snprintf(err, errlen, "%s: mmap: %s", tmp, strerror(errno));
        goto out;
    }
    if (region_init(base, l, opts, err, errlen) != 0)
        goto out;
    if (rename(tmp, path) != 0) {
        snprintf(err, errlen, "rename %s: %s", tmp, strerror(errno));
        goto out;
    }
    rc = 0;
out:
    if (base != MAP_FAILED)
        munmap(base, l->size);
    close(fd);
    if (rc != 0)
        unlink(tmp);
    return rc;
}

/* What state_open() found, logged once it holds no lock. */
struct open_notes {
    bool replaced;          /* an incompatible or damaged file was replaced */
    bool other_size;        /* the file has another tx_slots than asked */
    int32_t keys_wanted;    /* more key slots asked for than the file has: how many */
    int32_t per_key_wanted; /* joining others, another per-key quota asked for: which (0: none) */
    int32_t per_key;        /* the region's quota */
    bool alone;             /* no other live process used the file */
    bool lock_was_held;     /* alone, yet its lock word said held */
    long leases;            /* alone: reads in flight of dead processes, released */
    struct st_notice n;     /* what the check found */
};

/* Nobody else uses the region (we hold kembali.users exclusively): forget
 * what only a live process could still hold (the lock, its reads in
 * flight) and check every table. What counts is whether a live process
 * uses the file, not the boot: a copy taken while a process held the lock
 * (power cut, VM snapshot, backup) has a lock word that no kernel will
 * ever release, so the mutex is made anew. */
static int region_reset(struct state *st, int64_t now, struct open_notes *on, char *err, size_t errlen)
{
    on->lock_was_held = mutex_word(&st->h->mu) != 0;
    if (mutex_init(&st->h->mu, err, errlen) != 0)
        return -1;
    for (int32_t i = 0; i < st->txn; i++) {
        if (st->txs[i].inflight_until != 0) {
            st->txs[i].inflight_until = 0;
            on->leases++;
        }
        /* nobody holds a request any more: the plan's holds and reservations go */
        st->txs[i].holders = 0;
        st->txs[i].resv_at = 0;
    }
    region_check(st, now, true);
    if (on->lock_was_held)
        st->h->stale_locks++;
    return 0;
}

/* Others use the region: it was checked whole when the first of them took
 * it over, and again after any crash under its lock (the only ways it can
 * be damaged), so only its header is checked here, under the lock, waiting
 * at most OPEN_LOCK_MS (it is never held for more than microseconds): an
 * open (a CGI request) must not hold every process up for a whole walk. */
#define OPEN_LOCK_MS 2000
static int region_check_locked(struct state *st, int64_t now, char *err, size_t errlen)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += OPEN_LOCK_MS / 1000;
    int rc = pthread_mutex_timedlock(&st->h->mu, &ts);
    if (rc != 0 && rc != EOWNERDEAD) {
        snprintf(err, errlen, "the state lock has been held for more than %d s by a live kembali process "
                 "(%s); stop every kembali process using this state_dir and start again",
                 OPEN_LOCK_MS / 1000, strerror(rc));
        return -1;
    }
    if (rc == EOWNERDEAD) {
        st->notice.owner_died = true;
        st->h->recoveries++;
    }
    region_check(st, now, rc == EOWNERDEAD);
    if (rc == EOWNERDEAD)
        pthread_mutex_consistent(&st->h->mu);
    pthread_mutex_unlock(&st->h->mu);
    return 0;
}

static void open_notes_log(const struct open_notes *on, int32_t slots, int32_t key_slots)
{
    struct log_line ll;
    if (on->replaced)
        log_msg("warn", "state", "the state file is from an incompatible version or damaged; replacing it");
    if (on->other_size) {
        log_begin(&ll, "warn", "state");
        log_str(&ll, "msg", "the state file was made with another state_slots; "
                            "keeping its size (remove it while no kembali runs to change it)");
        log_int(&ll, "slots", slots);
        log_end(&ll);
    }
    if (on->per_key_wanted > 0) {
        log_begin(&ll, "warn", "state");
        log_str(&ll, "msg", "other running kembali processes share this state file with another "
                            "state_slots_per_key; theirs applies (one table, one rule) until every process "
                            "has stopped and one starts again");
        log_int(&ll, "state_slots_per_key", on->per_key);
        log_int(&ll, "wanted", on->per_key_wanted);
        log_end(&ll);
    }
    if (on->keys_wanted > 0) {
        log_begin(&ll, "warn", "state");
        log_str(&ll, "msg", "more keys are configured than the state file has key slots: the least recently "
                            "used idle keys make room, and a key finds none only while every slot holds a key "
                            "in use (paused, or read within 60 s); remove the file while no kembali runs to resize it");
        log_int(&ll, "key_slots", key_slots);
        log_int(&ll, "wanted", on->keys_wanted);
        log_end(&ll);
    }
    if (on->alone && (on->lock_was_held || on->leases > 0 || notice_any(&on->n))) {
        log_begin(&ll, "warn", "state");
        log_str(&ll, "msg", on->lock_was_held
                                ? "no live process uses the state file, yet its lock is held (a copy taken while "
                                  "a process held it, or a crashed host): lock and reads in flight reset, tables checked"
                                : "no live process uses the state file: reads in flight of stopped processes "
                                  "released, tables checked");
        log_int(&ll, "lock_was_held", on->lock_was_held);
        log_int(&ll, "leases", on->leases);
        for (int i = 0; i < DMG_N; i++)
            if (on->n.dmg[i] > 0)
                log_int(&ll, dmg_names[i], on->n.dmg[i]);
        log_end(&ll);
    } else if (!on->alone && notice_any(&on->n)) {
        notice_log(&on->n, on->n.owner_died ? "a kembali process died holding the state lock; state checked "
                                              "and repaired"
                                            : "the state file was damaged; repaired");
    }
}

struct state *state_open(const char *dir, const struct state_opts *opts, char *err, size_t errlen)
{
    char path[4096], lockpath[4096], userspath[4096];
    struct layout l;
    layout_for(opts, &l);
    if (state_check_dir(dir, true, err, errlen) != 0)
        return NULL;
    /* a path cut short would name another file: refused instead */
    int pn = snprintf(path, sizeof path, "%s/kembali.state", dir);
    int ln = snprintf(lockpath, sizeof lockpath, "%s/kembali.lock", dir);
    int un = snprintf(userspath, sizeof userspath, "%s/kembali.users", dir);
    if (pn < 0 || (size_t)pn >= sizeof path || ln < 0 || (size_t)ln >= sizeof lockpath || un < 0 ||
        (size_t)un >= sizeof userspath) {
        snprintf(err, errlen, "state_dir %.200s...: the path is too long", dir);
        return NULL;
    }

    /* One process at a time checks, creates, replaces or resets the file,
     * and decides under this lock whether it is alone (below): two
     * processes starting together are ordered by it. */
    int lk = open(lockpath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (lk < 0 || flock(lk, LOCK_EX) != 0) {
        snprintf(err, errlen, "%s: %s", lockpath, strerror(errno));
        if (lk >= 0)
            close(lk);
        return NULL;
    }
    /* Every process that maps the file holds a shared flock of
     * kembali.users for as long as it does (the kernel drops it when the
     * process dies, however it dies). Getting it exclusively means that no
     * live process uses the file. */
    struct open_notes on;
    memset(&on, 0, sizeof on);
    int users = open(userspath, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (users < 0) {
        snprintf(err, errlen, "%s: %s", userspath, strerror(errno));
        flock(lk, LOCK_UN);
        close(lk);
        return NULL;
    }
    on.alone = flock(users, LOCK_EX | LOCK_NB) == 0;
    int64_t now = util_mono_ms();
    struct state *st = NULL;
    uint8_t *base = MAP_FAILED;
    size_t len = 0;
    for (int attempt = 0; attempt < 2 && st == NULL; attempt++) {
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0 && errno != ENOENT) {
            snprintf(err, errlen, "%s: %s", path, strerror(errno));
            break;
        }
        if (fd >= 0) {
            struct stat sb;
            if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_uid != geteuid() || (sb.st_mode & 077)) {
                snprintf(err, errlen, "%s must be a regular file of this user with mode 0600 "
                         "(remove it and restart)", path);
                close(fd);
                break;
            }
            len = (size_t)sb.st_size;
            base = len >= sizeof(struct st_hdr)
                       ? mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
            close(fd);
            if (base != MAP_FAILED && region_usable(base, len)) {
                st = calloc(1, sizeof *st);
                if (st == NULL) {
                    snprintf(err, errlen, "out of memory");
                    munmap(base, len);
                    break;
                }
                attach(st, base);
                st->mapped = len;
                st->greedy = opts->greedy;
                st->users_fd = users;
                on.other_size = st->txn != l.txn;
                if (l.keyn > st->keyn)
                    on.keys_wanted = l.keyn;
                int rc = on.alone ? region_reset(st, now, &on, err, errlen)
                                  : region_check_locked(st, now, err, errlen);
                /* one quota per region: a restart (nobody else uses it) sets
                 * it; a process joining others keeps theirs (see state.h) */
                int32_t want = per_key_for(opts, st->txn);
                if (on.alone)
                    st->h->tx_per_key = want;
                else if (want != __atomic_load_n(&st->h->tx_per_key, __ATOMIC_RELAXED))
                    on.per_key_wanted = want;
                on.per_key = __atomic_load_n(&st->h->tx_per_key, __ATOMIC_RELAXED);
                on.n = st->notice;
                memset(&st->notice, 0, sizeof st->notice);
                if (rc != 0) {
                    st->users_fd = -1;
                    state_free(st);
                    st = NULL;
                }
                break;
            }
            if (base != MAP_FAILED)
                munmap(base, len);
            base = MAP_FAILED;
            on.replaced = true;
        }
        if (attempt == 0 && create_file(path, &l, opts, err, errlen) != 0)
            break;
    }
    /* from now on a user like any other (a conversion: under kembali.lock,
     * no other process can be deciding whether it is alone meanwhile) */
    if (st != NULL && flock(users, LOCK_SH) != 0) {
        snprintf(err, errlen, "%s: %s", userspath, strerror(errno));
        st->users_fd = -1;
        state_free(st);
        st = NULL;
    }
    flock(lk, LOCK_UN);
    close(lk);
    if (st == NULL)
        close(users);
    else
        open_notes_log(&on, st->txn, st->keyn);
    return st;
}

void state_free(struct state *st)
{
    if (st == NULL)
        return;
    if (st->mapped) {
        munmap(st->h, st->mapped); /* others may still use it: no destroy */
    } else {
        pthread_mutex_destroy(&st->h->mu);
        free(st->h);
    }
    if (st->users_fd >= 0)
        close(st->users_fd); /* no longer a user of the file */
    free(st);
}

void state_key_id(const struct state *st, const char *secret, struct state_key *out)
{
    uint8_t salt2[16];
    memcpy(salt2, st->h->salt, 16);
    salt2[0] ^= 0x5a;
    uint64_t a = state_siphash(st->h->salt, secret, strlen(secret));
    uint64_t b = state_siphash(salt2, secret, strlen(secret));
    memcpy(out->b, &a, 8);
    memcpy(out->b + 8, &b, 8);
}

/* ---- tables (callers hold the lock) ---- */

static uint32_t tx_bucket(struct state *st, const struct state_key *key, const char *id)
{
    uint8_t buf[16 + STATE_ID_MAX];
    size_t n = strnlen(id, STATE_ID_MAX);
    memcpy(buf, key->b, 16);
    memcpy(buf + 16, id, n);
    return (uint32_t)(state_siphash(st->h->salt, buf, 16 + n) & (uint64_t)(st->nb - 1));
}

/* What a client's 404 is counted against: (key, id), hashed. */
static uint32_t tx_what(struct state *st, const struct state_key *key, const char *id)
{
    uint8_t buf[17 + STATE_ID_MAX];
    size_t n = strnlen(id, STATE_ID_MAX);
    buf[0] = 'w';
    memcpy(buf + 1, key->b, 16);
    memcpy(buf + 17, id, n);
    uint32_t w = (uint32_t)state_siphash(st->h->salt, buf, 17 + n);
    return w != 0 ? w : 1; /* 0: none */
}

static struct st_tx *tx_find(struct state *st, const struct state_key *key, const char *id)
{
    int32_t steps = 0;
    for (int32_t i = st->buckets[tx_bucket(st, key, id)]; i >= 0 && i < st->txn && steps++ < st->txn; i = st->txs[i].next) {
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
    int32_t *pp = &st->buckets[tx_bucket(st, &e->key, e->id)], steps = 0;
    while (*pp >= 0 && *pp < st->txn && *pp != idx && steps++ < st->txn)
        pp = &st->txs[*pp].next;
    if (*pp == idx)
        *pp = e->next;
}

static struct st_keyent *key_find(struct state *st, const struct state_key *key);
static struct st_keyent *key_make(struct state *st, const struct state_key *key, int64_t now);

/* The per-key quota, from the region (state_open), kept within 1 .. txn. */
static int32_t tx_quota(const struct state *st)
{
    int32_t q = st->h->tx_per_key;
    return q < 1 ? 1 : q > st->txn ? st->txn : q;
}

/* The entries of `key` in the table, counted (O(slots): for a key entry
 * being made, and when its key table has no room). */
static int32_t tx_count(const struct state *st, const struct state_key *key)
{
    int32_t n = 0;
    for (int32_t i = 0; i < st->txn; i++)
        n += st->txs[i].used && memcmp(st->txs[i].key.b, key->b, 16) == 0;
    return n;
}

/* Every key entry's ntx, from the table (O(slots + keys)). */
static void key_recount(struct state *st)
{
    for (int32_t i = 0; i < st->keyn; i++)
        st->keys[i].ntx = 0;
    for (int32_t i = 0; i < st->txn; i++) {
        struct st_keyent *k = st->txs[i].used ? key_find(st, &st->txs[i].key) : NULL;
        if (k != NULL)
            k->ntx++;
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
        if (tx_evictable(&st->txs[i], only, now) && (best < 0 || st->txs[i].last_used < st->txs[best].last_used))
            best = i;
    }
    if (best < 0) { /* the sample found nothing: look everywhere once */
        for (int32_t i = 0; i < n; i++)
            if (tx_evictable(&st->txs[i], only, now) && (best < 0 || st->txs[i].last_used < st->txs[best].last_used))
                best = i;
    }
    return best;
}

/* Every slot holds an entry in use, and a told status of `key` needs one
 * (state_tell, state.h): the entry whose loss harms least, or -1 only for
 * an empty table. Ranked, first to last: another key's before `key`'s
 * own; no read in flight (forgetting one would let a second read start
 * beside it); of the key with the most entries (a flood, when the table is
 * full of entries in use: at least tx_slots / tx_per_key keys at their
 * quota); no held request (its reservation would go); least recently
 * used. O(slots): only with every slot in use. */
static int32_t tx_least_harm(struct state *st, const struct state_key *key, int64_t now)
{
    int32_t best = -1;
    int64_t best_rank[4] = {0, 0, 0, 0};
    for (int32_t i = 0; i < st->txn; i++) {
        const struct st_tx *e = &st->txs[i];
        if (!e->used)
            continue;
        const struct st_keyent *k = key_find(st, &e->key);
        int64_t rank[4] = {
            memcmp(e->key.b, key->b, 16) != 0,
            e->inflight_until <= now,
            k != NULL ? k->ntx : 0,
            !(e->holders > 0 && e->hold_until > now),
        };
        int c = 0;
        for (int j = 0; j < 4 && c == 0; j++)
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
 *   - a key already at its quota (tx_per_key entries) takes its own least
 *     recently used idle entry's slot; with none idle, a request's entry
 *     (`told` false) finds no room (counted: quota_full; full when the
 *     quota is the whole table), however many other slots are free: the
 *     rest of the table is the other keys';
 *   - otherwise a free slot, else the least recently used idle entry of
 *     any key (counted: evictions); with none, no room (counted: full),
 *     unless `told`: a status told by the shop (state_tell) then takes
 *     the slot of an entry in use (tx_least_harm) and always finds room.
 * A told entry may so take a key past its quota; it is idle (evictable)
 * unless a request holds it, and a request's entry of that key finds
 * room only by evicting one of the key's own. `k`: the key's entry when
 * the caller has it, else NULL. */
static struct st_tx *tx_get(struct state *st, const struct state_key *key, const char *id, int64_t now, bool told,
                           struct st_keyent *k)
{
    struct st_tx *e = tx_find(st, key, id);
    if (e != NULL)
        return e;
    if (k == NULL) /* the caller has none: find or make it (NULL: every key slot in use) */
        k = key_make(st, key, now);
    int32_t mine = k != NULL ? k->ntx : tx_count(st, key);
    int32_t idx = -1;
    if (mine >= tx_quota(st)) {
        idx = tx_lru_idle(st, key, now);
        if (idx < 0 && !told) {
            if (tx_quota(st) < st->txn)
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
        struct st_keyent *owner = key_find(st, &st->txs[idx].key);
        if (owner != NULL && owner->ntx > 0)
            owner->ntx--;
        tx_unlink(st, idx);
        st->h->evictions++;
    }
    e = &st->txs[idx];
    memset(e, 0, sizeof *e);
    e->used = 1;
    e->key = *key;
    util_copy(e->id, sizeof e->id, id);
    uint32_t b = tx_bucket(st, key, id);
    e->next = st->buckets[b];
    st->buckets[b] = idx;
    if (k != NULL)
        k->ntx++;
    return e;
}

static uint32_t key_bucket(const struct state *st, const struct state_key *key)
{
    uint32_t v;
    memcpy(&v, key->b, sizeof v); /* a key id is a keyed hash already */
    return v & (uint32_t)(st->knb - 1);
}

static struct st_keyent *key_find(struct state *st, const struct state_key *key)
{
    int32_t steps = 0;
    for (int32_t i = st->key_buckets[key_bucket(st, key)]; i >= 0 && i < st->keyn && steps++ < st->keyn;
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
    int32_t *pp = &st->key_buckets[key_bucket(st, &k->key)], steps = 0;
    while (*pp >= 0 && *pp < st->keyn && *pp != idx && steps++ < st->keyn)
        pp = &st->keys[*pp].next;
    if (*pp == idx)
        *pp = k->next;
}

/* Find the key entry, or make one: a free slot, or the least recently
 * used idle key's. NULL when every slot holds a key in use (not counted:
 * see key_get). */
static struct st_keyent *key_make(struct state *st, const struct state_key *key, int64_t now)
{
    struct st_keyent *k = key_find(st, key);
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
    k->ntx = tx_count(st, key); /* what a forgotten entry of this key counted */
    uint32_t b = key_bucket(st, key);
    k->next = st->key_buckets[b];
    st->key_buckets[b] = idx;
    return k;
}

/* Find the key entry; with `create`, make one when missing (key_make).
 * NULL when every slot holds a key in use (counted: key_full: a read or a
 * hold of that key finds no room, checking). */
static struct st_keyent *key_get(struct state *st, const struct state_key *key, int64_t now, bool create)
{
    struct st_keyent *k = key_find(st, key);
    if (k != NULL || !create)
        return k;
    k = key_make(st, key, now);
    if (k == NULL)
        st->h->key_full++;
    return k;
}

/* ---- clients: 404s charged to an address ---- */

static bool client_none(const struct state_client *c)
{
    static const struct state_client zero;
    return memcmp(c->b, zero.b, sizeof c->b) == 0;
}

static int32_t client_home(const struct state *st, const struct state_client *c)
{
    uint32_t v;
    memcpy(&v, c->b + 4, sizeof v); /* a keyed hash already */
    return (int32_t)(v % (uint32_t)st->cln);
}

/* Forget the reads in flight whose lease ended (a process that died
 * mid-read, a finish that never came). */
static void client_fly_expire(struct st_client *c, int64_t now)
{
    int keep = 0;
    for (int i = 0; i < c->nfly; i++)
        if (c->fly_until[i] > now) {
            c->fly_what[keep] = c->fly_what[i];
            c->fly_until[keep] = c->fly_until[i];
            keep++;
        }
    c->nfly = (uint8_t)keep;
}

/* Is the entry worth keeping at `now`? A block, a 404 inside the window,
 * or a read in flight. */
static bool client_busy(const struct st_client *c, int64_t now)
{
    for (int i = 0; i < c->nfly; i++)
        if (c->fly_until[i] > now)
            return true;
    return c->blocked_until > now || (c->nhits > 0 && c->hit_at[c->nhits - 1] > now - STATE_CLIENT_WINDOW_MS);
}

/* Find the client's entry among its ways; with `create`, make one: a free
 * way, else the least recently used idle one, else the least recently used
 * that is not blocked (its 404s forgotten: only a flood of addresses in one
 * set does that). NULL when every way holds a blocked client (client_full). */
static struct st_client *client_get(struct state *st, const struct state_client *id, int64_t now, bool create)
{
    int32_t home = client_home(st, id), ways = st->cln < CLIENT_WAYS ? st->cln : CLIENT_WAYS;
    int32_t free_i = -1, idle = -1, open = -1;
    for (int32_t w = 0; w < ways; w++) {
        int32_t i = (home + w) % st->cln;
        struct st_client *c = &st->clients[i];
        if (c->used && memcmp(c->id.b, id->b, sizeof id->b) == 0)
            return c;
        if (!c->used) {
            if (free_i < 0)
                free_i = i;
        } else if (!client_busy(c, now)) {
            if (idle < 0 || c->last_used < st->clients[idle].last_used)
                idle = i;
        } else if (c->blocked_until <= now) {
            if (open < 0 || c->last_used < st->clients[open].last_used)
                open = i;
        }
    }
    if (!create)
        return NULL;
    int32_t i = free_i >= 0 ? free_i : idle >= 0 ? idle : open;
    if (i < 0) {
        st->h->client_full++;
        return NULL;
    }
    struct st_client *c = &st->clients[i];
    memset(c, 0, sizeof *c);
    c->used = 1;
    c->id = *id;
    c->last_used = now;
    return c;
}

/* Forget the 404s that left the window, and (what != 0) an earlier 404 of
 * `what`. */
static void client_hits_expire(struct st_client *c, uint32_t what, int64_t now)
{
    int keep = 0;
    for (int i = 0; i < c->nhits; i++)
        if (c->hit_at[i] > now - STATE_CLIENT_WINDOW_MS && (what == 0 || c->hit_what[i] != what)) {
            c->hit_what[keep] = c->hit_what[i];
            c->hit_at[keep] = c->hit_at[i];
            keep++;
        }
    c->nhits = (uint8_t)keep;
}

/* May client id's read of `what` (an id nobody knows) start at `now`? Not
 * while it is blocked, nor while its 404s in the window and its reads in
 * flight are STATE_CLIENT_404S together: false, *until the block's end, or
 * the first lease to end but at most STATE_CLIENT_RECHECK_MS away (a read
 * ends long before its lease, and a held request must not give up on a
 * lease past its deadline). When it may, its read is counted in flight
 * until `lease_until`. A client that finds no room is not counted (true). */
static bool client_fly(struct state *st, const struct state_client *id, uint32_t what, int64_t lease_until,
                       int64_t now, int64_t *until)
{
    struct st_client *c = client_get(st, id, now, true);
    if (c == NULL)
        return true;
    c->last_used = now;
    if (c->blocked_until > now) {
        *until = c->blocked_until;
        return false;
    }
    client_fly_expire(c, now);
    client_hits_expire(c, 0, now);
    if (c->nhits + c->nfly >= STATE_CLIENT_404S) {
        *until = now + STATE_CLIENT_RECHECK_MS;
        for (int i = 0; i < c->nfly; i++)
            if (c->fly_until[i] < *until)
                *until = c->fly_until[i];
        return false;
    }
    c->fly_what[c->nfly] = what;
    c->fly_until[c->nfly] = lease_until;
    c->nfly++;
    return true;
}

/* Client id's read of `what` ended (or was never made): no longer in
 * flight. Returns whether it was. */
static bool client_land(struct state *st, const struct state_client *id, uint32_t what, int64_t now)
{
    struct st_client *c = client_get(st, id, now, false);
    if (c == NULL)
        return false;
    for (int i = 0; i < c->nfly; i++)
        if (c->fly_what[i] == what) {
            c->nfly--;
            c->fly_what[i] = c->fly_what[c->nfly];
            c->fly_until[i] = c->fly_until[c->nfly];
            return true;
        }
    return false;
}

/* Charge a 404 for `what` to client id at `now`. Returns true when this
 * starts the client's block. */
static bool client_charge(struct state *st, const struct state_client *id, uint32_t what, int64_t now)
{
    struct st_client *c = client_get(st, id, now, true);
    if (c == NULL || c->blocked_until > now)
        return false;
    c->last_used = now;
    client_hits_expire(c, what, now);
    int keep = c->nhits;
    if (keep >= STATE_CLIENT_404S) /* cannot happen: a full window blocks */
        keep = STATE_CLIENT_404S - 1;
    c->hit_what[keep] = what;
    c->hit_at[keep] = now;
    c->nhits = (uint8_t)(keep + 1);
    if (c->nhits < STATE_CLIENT_404S)
        return false;
    c->blocked_until = now + STATE_CLIENT_BLOCK_MS;
    c->nhits = 0;
    st->h->client_blocks++;
    return true;
}

/* When may the key read again under `budget` reads per any 60 s span? */
static int64_t budget_next(const struct st_keyent *k, int budget, int64_t now)
{
    if (k == NULL || budget <= 0)
        return now;
    if (budget > STATE_BUDGET_MAX)
        budget = STATE_BUDGET_MAX;
    /* ring entries from newest backwards; the budget-th newest decides */
    if (k->ring_n < budget)
        return now;
    int32_t idx = (k->ring_head - budget + STATE_BUDGET_MAX * 2) % STATE_BUDGET_MAX;
    int64_t t = k->ring[idx] + PLAN_BUDGET_SPAN_MS + 1;
    return t > now ? t : now;
}

static void budget_push(struct st_keyent *k, int64_t now)
{
    k->ring[k->ring_head] = now;
    k->ring_head = (k->ring_head + 1) % STATE_BUDGET_MAX;
    if (k->ring_n < STATE_BUDGET_MAX)
        k->ring_n++;
}

/* Take back one read started at t (the newest such) from the ring: the
 * newer ones move down a place. */
static void budget_unpush(struct st_keyent *k, int64_t t)
{
    for (int32_t j = 0; j < k->ring_n; j++) { /* newest first */
        int32_t i = (k->ring_head - 1 - j + 2 * STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        if (k->ring[i] != t)
            continue;
        for (; j > 0; j--) {
            int32_t newer = (i + 1) % STATE_BUDGET_MAX;
            k->ring[i] = k->ring[newer];
            i = newer;
        }
        k->ring_head = (k->ring_head - 1 + STATE_BUDGET_MAX) % STATE_BUDGET_MAX;
        k->ring_n--;
        return;
    }
}

/* ---- the budget plan (plan.h): who waits, what is reserved ---- */

/* Entry idx of the key's waiting set still waits at `now`. */
static struct st_tx *waiting_tx(struct state *st, const struct st_keyent *k, int32_t idx, int64_t now)
{
    if (idx < 0 || idx >= st->txn)
        return NULL;
    struct st_tx *e = &st->txs[idx];
    if (e->used != 1 || memcmp(e->key.b, k->key.b, 16) != 0 || e->holders <= 0 || e->hold_until <= now)
        return NULL;
    if (e->known_until > now && (e->not_found || tx_status_final((enum tx_status)e->status)))
        return NULL; /* answered from the cache from now on */
    return e;
}

static void waiting_add(struct state *st, struct st_keyent *k, int32_t idx, int64_t now)
{
    int32_t w = 0;
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        if (k->waiting[i] == idx)
            return;
        if (waiting_tx(st, k, k->waiting[i], now) != NULL)
            k->waiting[w++] = k->waiting[i]; /* drop the stale ones on the way */
    }
    k->nwaiting = w;
    if (w < ST_WAITING_MAX)
        k->waiting[k->nwaiting++] = idx;
}

/* The pace alone (and its own windows) let e read now. */
static bool tx_may_read_now(const struct st_tx *e, const struct pace_schedule *sched, int64_t now)
{
    return e->inflight_until <= now && e->not_before <= now && e->remote_until <= now &&
           e->remote_not_before <= now && pace_next_read(sched, e->reads, e->last_start, now) <= now;
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
    int n = 0;
    for (int32_t i = k->ring_n - 1; i >= 0; i--) { /* oldest first */
        int64_t t = k->ring[(k->ring_head - 1 - i + STATE_BUDGET_MAX * 2) % STATE_BUDGET_MAX];
        if (t > now - PLAN_BUDGET_SPAN_MS)
            ev[n++] = t;
    }
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        const struct st_tx *e = waiting_tx(st, k, k->waiting[i], now);
        if (e != NULL && e->resv_at != 0)
            ev[n++] = e->resv_at > now ? e->resv_at : now;
    }
    qsort(ev, (size_t)n, sizeof *ev, cmp_time);
    return n;
}

/* Reads e's schedule still wants from `now` to its latest deadline (one,
 * for a transaction not held: the read asked for). */
static int tx_demand(const struct st_tx *e, const struct pace_schedule *sched, int64_t now)
{
    if (e == NULL || e->holders <= 0 || e->hold_until <= now)
        return 1;
    int reads = pace_in_episode(e->reads, e->last_start, now) ? e->reads : 0;
    int64_t t = reads > 0 ? pace_next_read(sched, reads, e->last_start, now) : now;
    if (t < now)
        t = now;
    int n = 0;
    while (t <= e->hold_until && n < 64) {
        n++;
        int step = reads + n < sched->n ? reads + n : sched->n - 1;
        t += sched->wait_ms[step] > PACE_MIN_WAIT_MS ? sched->wait_ms[step] : PACE_MIN_WAIT_MS;
    }
    return n;
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
    int64_t *oldest_arrival = arrivals_change;
    *oldest_arrival = INT64_MAX;
    for (int32_t i = 0; i < k->arr_n; i++) {
        int64_t t = k->arrivals[(k->arr_head - 1 - i + ST_ARRIVALS * 2) % ST_ARRIVALS];
        if (t <= now - PLAN_RATE_LONG_MS)
            break;
        /* when the oldest arrival that counts leaves its span, the headroom shrinks */
        int64_t leaves = t + PLAN_RATE_LONG_MS + 1;
        pk->arrivals_long++;
        if (t > now - PLAN_RATE_MS) {
            pk->arrivals++;
            leaves = t + PLAN_RATE_MS + 1;
        }
        if (leaves < *oldest_arrival)
            *oldest_arrival = leaves;
    }
    pk->demand = tx_demand(self, sched, now);
    pk->schedule_reads = pace_reads_within(sched, pace_hold_ms(sched));
    for (int32_t i = 0; i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        const struct st_tx *e = waiting_tx(st, k, k->waiting[i], now);
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
 * PLAN_NO, *retry is when it may change. */
static enum plan_read plan_verdict(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                                   const struct pace_schedule *sched, int budget, int64_t now, int64_t *retry)
{
    struct plan_key pk;
    int64_t oldest, ev[STATE_BUDGET_MAX + ST_WAITING_MAX];
    int nev;
    plan_gather(st, k, e, sched, budget, now, &pk, &oldest, ev, &nev);
    struct plan_tx pt = {0};
    if (e != NULL && waiting_tx(st, k, (int32_t)(e - st->txs), now) != NULL) {
        pt.reserved = e->resv_at != 0;
        pt.resv_at = e->resv_at;
    }
    int reads = e != NULL && pace_in_episode(e->reads, e->last_start, now) ? e->reads : 0;
    if (reads > 0)
        pt.early_reads = e->early_reads;
    pt.next_gap = pace_next_read(sched, reads + 1, now, now + 1) - now; /* the wait after this read */
    if (pt.reserved) {
        /* where the seed's schedule, counted back from the reservation (its
         * last read), puts this read: later than that, the schedule no longer
         * ends at the reserved read */
        int64_t due = e->resv_at - pace_sum(sched);
        for (int i = 1; i <= reads; i++)
            due += sched->wait_ms[i < sched->n ? i : sched->n - 1];
        pt.drifted = e->withheld && now > due + PLAN_DRIFT_MS;
    }
    enum plan_read r = plan_may_read(&pk, &pt, now);
    if (r != PLAN_NO)
        return r;
    /* what can change it: a read leaving the spans, the rush ending, its
     * own reservation's time, or another's turn */
    int64_t t = now + ST_PLAN_RETRY_MS;
    if (nev > 0 && ev[0] + PLAN_BUDGET_SPAN_MS + 1 < t)
        t = ev[0] + PLAN_BUDGET_SPAN_MS + 1;
    if (pt.reserved && pt.resv_at < t)
        t = pt.resv_at;
    if (oldest < t)
        t = oldest; /* the rush may have thinned by then */
    *retry = t > now ? t : now + 1;
    return PLAN_NO;
}

/* May e (waiting) reserve a last-chance read at `at`? */
static bool plan_reserve_at(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                            const struct pace_schedule *sched, int budget, int64_t at, int64_t now)
{
    struct plan_key pk;
    int64_t oldest, ev[STATE_BUDGET_MAX + ST_WAITING_MAX];
    int nev;
    plan_gather(st, k, e, sched, budget, now, &pk, &oldest, ev, &nev);
    return plan_may_reserve(&pk, plan_busiest(ev, nev, at, INT64_MIN));
}

static void raise_to(int64_t *next, enum state_wait *why, int64_t t, enum state_wait reason)
{
    if (t > *next) {
        *next = t;
        *why = reason;
    }
}

/* The fact about e (NULL: untracked) of key k (NULL: unused) at `now`;
 * *kind (may be NULL) says what a read started now would be. */
static void compute(struct state *st, struct st_tx *e, struct st_keyent *k, const struct pace_schedule *sched,
                    int budget, int64_t now, struct state_fact *f, enum plan_read *kind)
{
    if (kind != NULL)
        *kind = PLAN_EARLY;
    memset(f, 0, sizeof *f);
    f->status = TXS_NONE;
    util_copy(f->status_word, sizeof f->status_word, "unknown");
    f->next_read = now;
    if (e != NULL) {
        f->status = (enum tx_status)e->status;
        if (e->status != TXS_NONE)
            util_copy(f->status_word, sizeof f->status_word, e->status_word);
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
        raise_to(&f->next_read, &f->wait, pace_next_read(sched, e->reads, e->last_start, now), WAIT_PACE);
        raise_to(&f->next_read, &f->wait, rules_floor(e->last_end), WAIT_PACE);
        raise_to(&f->next_read, &f->wait, e->not_before, WAIT_RETRY);
        raise_to(&f->next_read, &f->wait, e->remote_not_before, (enum state_wait)e->remote_why);
    }
    if (k != NULL) {
        raise_to(&f->next_read, &f->wait, k->paused_until, WAIT_KEY_PAUSE);
        raise_to(&f->next_read, &f->wait, budget_next(k, budget, now), WAIT_BUDGET);
    }
    raise_to(&f->next_read, &f->wait, st->h->host_paused_until, WAIT_HOST_PAUSE);
    if (f->not_found)
        raise_to(&f->next_read, &f->wait, f->known_until, WAIT_RETRY);
    /* everything else allows a read now: does the budget's plan? */
    if (!st->greedy && k != NULL && !f->final && !f->not_found && !f->in_flight && f->next_read <= now) {
        int64_t retry;
        enum plan_read r = plan_verdict(st, e, k, sched, budget, now, &retry);
        if (r == PLAN_NO) {
            raise_to(&f->next_read, &f->wait, retry, WAIT_BUDGET);
            if (e != NULL)
                e->withheld = 1;
        }
        if (kind != NULL)
            *kind = r;
    }
}

void state_lookup(struct state *st, const struct state_key *key, const char *id,
                  const struct pace_schedule *sched, int budget, int64_t now, struct state_fact *out)
{
    st_lock(st, now);
    compute(st, tx_find(st, key, id), key_get(st, key, now, false), sched, budget, now, out, NULL);
    st_unlock(st);
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
    bool charged = client != NULL && !client_none(client);
    if (strlen(id) > STATE_ID_MAX) { /* callers validate ids; never track a longer one */
        memset(out, 0, sizeof *out);
        out->wait = WAIT_FULL;
        out->next_read = now + 1000;
        return false;
    }
    st_lock(st, now);
    struct st_tx *e = tx_find(st, key, id);
    struct st_keyent *k = key_get(st, key, now, false);
    enum plan_read kind;
    compute(st, e, k, sched, budget, now, out, &kind);
    if (out->final || out->not_found || out->in_flight || out->next_read > now)
        goto done;
    if (k == NULL)
        k = key_get(st, key, now, true);
    if (e == NULL && k != NULL)
        e = tx_get(st, key, id, now, false, k);
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
    if (charged && !client_fly(st, client, tx_what(st, key, id), now + timeout_ms + 1000, now, &client_until)) {
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
    budget_push(k, now);
    /* requests held later than the one a last-chance read was for keep a
     * chance too (counted after this read) */
    if (kind == PLAN_LAST_CHANCE && e->holders > 0 && e->hold_until - PLAN_LEAD_MS >= now + PACE_MIN_WAIT_MS &&
        plan_reserve_at(st, e, k, sched, budget, e->hold_until - PLAN_LEAD_MS, now))
        e->resv_at = e->hold_until - PLAN_LEAD_MS;
    ticket->key = *key;
    util_copy(ticket->id, sizeof ticket->id, id);
    ticket->serial = e->inflight_serial;
    ticket->started = now;
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

static void pause_until(int64_t *until, int64_t t)
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

/* Record what the read of ticket t found (status s, or a 404), by the
 * rules of state.h ("A read's outcome"). `current`: t's lease holds and no
 * other read of the transaction started since. */
static bool read_may_record(const struct st_tx *e, const struct state_ticket *t, bool current, bool not_found,
                            enum tx_status s, int64_t now)
{
    bool older = t->serial < e->facts_serial; /* a later read's outcome (or a told status) is recorded */
    if (not_found) {
        if (current)
            return !final_cached(e, now); /* a 404 cannot hide a cached final status */
        return !older && e->status == TXS_NONE && !e->not_found; /* nothing known at all */
    }
    if (current)
        return status_may_replace(e, s, false, now);
    if (tx_status_final(s)) /* a final status stays true: only forward, never backwards */
        return status_may_replace(e, s, true, now);
    /* a late pending (or unknown word) only fills what nothing else says */
    return !older && !tx_status_final((enum tx_status)e->status) && !(e->not_found && e->known_until > now);
}

void state_finish(struct state *st, const struct state_ticket *t, const char *shop_id,
                  const struct outcome *oc, int64_t now, struct state_report *report)
{
    memset(report, 0, sizeof *report);
    st_lock(st, now);
    struct st_tx *e = tx_find(st, &t->key, t->id);
    if (!client_none(&t->client)) /* no longer in flight for its client (a 404 is charged below) */
        client_land(st, &t->client, tx_what(st, &t->key, t->id), now);
    struct st_keyent *k = key_get(st, &t->key, now, true);
    bool current = e != NULL && e->inflight_serial == t->serial && now <= t->lease_until;
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
    if (fx->not_found) {
        /* charged to the client that asked, for an id kembali knows
         * nothing about (a 404 for an id with a known status is not
         * a probe), late or not: it happened at Kasera */
        if (fx->charge && !client_none(&t->client) && (e == NULL || e->status == TXS_NONE))
            report->client_blocked = client_charge(st, &t->client, tx_what(st, &t->key, t->id), now);
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
        pause_until(&e->not_before, now + fx->retry_ms);
    if (fx->key_pause_ms > 0 && k != NULL) {
        report->key_paused = k->paused_until <= now && (oc->kind == OUT_KEY_LIMITED || fx->unauthorized);
        pause_until(&k->paused_until, now + fx->key_pause_ms);
    }
    if (fx->unauthorized)
        util_copy(st->h->last_401_shop, sizeof st->h->last_401_shop, shop_id);
    if (fx->host_pause_ms > 0) {
        report->host_paused = st->h->host_paused_until <= now;
        pause_until(&st->h->host_paused_until, now + fx->host_pause_ms);
    }
    util_copy(report->last_401_shop, sizeof report->last_401_shop, st->h->last_401_shop);
    st_unlock(st);
    st_bump(st); /* wake waiters in every process */
}

void state_unclaim(struct state *st, const struct state_ticket *t, int64_t now)
{
    st_lock(st, now);
    struct st_tx *e = tx_find(st, &t->key, t->id);
    /* never made: not in flight for its client (its other reads may start) */
    bool landed = !client_none(&t->client) && client_land(st, &t->client, tx_what(st, &t->key, t->id), now);
    bool undone = e != NULL && e->inflight_serial == t->serial;
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
        struct st_keyent *k = key_get(st, &t->key, now, false);
        if (k != NULL)
            budget_unpush(k, t->started);
    }
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
    struct st_tx *e = tx_get(st, key, id, now, true, NULL);
    if (e == NULL) {
        done = STATE_TOLD_FULL;
    } else {
        e->last_used = now;
        was_remote = e->remote_until > now;
        e->remote_until = 0; /* what another host's read would say is told */
        if (status_may_replace(e, status, true, now)) {
            status_record(e, status, word, now);
            e->facts_serial = st->h->serial; /* newer than every read started before it */
        } else {
            done = STATE_TOLD_KEPT;
            if (e->not_found) { /* the shop knows it: no 404 stands (a kept status is final) */
                e->not_found = 0;
                e->known_until = 0;
            }
        }
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
    const struct st_tx *e = tx_find(st, key, id);
    bool known = e != NULL && e->status != TXS_NONE;
    st_unlock(st);
    return known;
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
    struct st_tx *e = tx_get(st, key, id, now, false, NULL);
    if (e != NULL) {
        e->last_used = now;
        was = e->remote_until > now;
        if (in_flight) {
            pause_until(&e->remote_until, until);
        } else {
            e->remote_until = 0; /* that read ended: its not-before replaces it */
            if (until > e->remote_not_before) {
                e->remote_not_before = until;
                e->remote_why = (uint8_t)why;
            }
        }
        is = e->remote_until > now;
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
    struct st_tx *e = tx_get(st, key, id, now, false, NULL);
    if (e != NULL) {
        e->last_used = now;
        e->remote_until = 0;
        /* as a current read's 404 (read_may_record), newer than every read
         * started before it (as a told status) */
        if (until > now && !final_cached(e, now)) {
            if (!e->not_found || e->known_until < until)
                e->known_until = until;
            e->not_found = 1;
            e->facts_serial = st->h->serial;
        }
    }
    st_unlock(st);
    if (e != NULL)
        st_bump(st);
    return e != NULL;
}

bool state_hold(struct state *st, const struct state_key *key, const char *id,
                const struct pace_schedule *sched, int budget, int64_t deadline, int64_t now)
{
    if (strlen(id) > STATE_ID_MAX)
        return false;
    st_lock(st, now);
    struct st_keyent *k = key_get(st, key, now, true);
    struct st_tx *e = k != NULL ? tx_get(st, key, id, now, false, k) : NULL;
    if (e != NULL && k != NULL) {
        e->last_used = k->last_used = now;
        bool fresh = e->holders <= 0 || e->hold_until <= now;
        if (fresh) {
            /* a new holding period; holders past their deadline may still
             * unhold (their count stays: waiting_tx ignores a hold whose
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
        if (fresh && waiting_tx(st, k, (int32_t)(e - st->txs), now) != NULL) {
            waiting_add(st, k, (int32_t)(e - st->txs), now);
            k->arrivals[k->arr_head] = now;
            k->arr_head = (k->arr_head + 1) % ST_ARRIVALS;
            if (k->arr_n < ST_ARRIVALS)
                k->arr_n++;
            if (!st->greedy && deadline - PLAN_LEAD_MS > now &&
                plan_reserve_at(st, e, k, sched, budget, deadline - PLAN_LEAD_MS, now))
                e->resv_at = deadline - PLAN_LEAD_MS;
        }
    }
    st_unlock(st);
    return e != NULL && k != NULL;
}

void state_unhold(struct state *st, const struct state_key *key, const char *id, int64_t now)
{
    st_lock(st, now);
    struct st_tx *e = tx_find(st, key, id);
    if (e != NULL && e->holders > 0 && --e->holders == 0)
        e->resv_at = 0; /* nobody left to use it */
    st_unlock(st);
}

int state_key_reserved(struct state *st, const struct state_key *key, int64_t now)
{
    int n = 0;
    st_lock(st, now);
    const struct st_keyent *k = key_find(st, key);
    for (int32_t i = 0; k != NULL && i < k->nwaiting && i < ST_WAITING_MAX; i++) {
        const struct st_tx *e = waiting_tx(st, k, k->waiting[i], now);
        n += e != NULL && e->resv_at != 0;
    }
    st_unlock(st);
    return n;
}

void state_metrics(struct state *st, struct state_metrics *out)
{
    memset(out, 0, sizeof *out);
    st_lock(st, util_mono_ms());
    out->tx_used = st->h->tx_used;
    out->tx_slots = st->txn;
    out->evictions = st->h->evictions;
    out->full = st->h->full;
    out->tx_per_key = tx_quota(st);
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
    int64_t now = util_mono_ms();
    for (int32_t i = 0; i < st->cln; i++) /* bounded: client_slots */
        out->clients_blocked += st->clients[i].used && st->clients[i].blocked_until > now;
    out->stale_locks = st->h->stale_locks;
    out->last_chance_reads = st->h->last_chance_reads;
    out->reserved = 0;
    for (int32_t i = 0; i < st->keyn; i++) {
        const struct st_keyent *k = &st->keys[i];
        for (int32_t j = 0; k->used && j < k->nwaiting && j < ST_WAITING_MAX; j++) {
            const struct st_tx *e = waiting_tx(st, k, k->waiting[j], now);
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

void state_client_id(const struct state *st, const struct state_key *key, const char *addr,
                     struct state_client *out)
{
    /* the address's hash, hashed again with the key: another client of
     * each key (its charge and block are the key's) */
    struct state_client a;
    uint8_t buf[32];
    state_client_hash(st->h->salt, addr, &a);
    memcpy(buf, a.b, 16);
    memcpy(buf + 16, key->b, 16);
    uint8_t salt2[16];
    memcpy(salt2, st->h->salt, 16);
    salt2[5] ^= 0xa5; /* neither the address's hash nor a key id's */
    uint64_t x = state_siphash(salt2, buf, sizeof buf);
    salt2[6] ^= 0x3c;
    uint64_t y = state_siphash(salt2, buf, sizeof buf);
    memcpy(out->b, &x, 8);
    memcpy(out->b + 8, &y, 8);
    if (client_none(out))
        out->b[0] = 1; /* all zero means "no client" */
}

void state_client_hash(const uint8_t salt[16], const char *addr, struct state_client *out)
{
    /* the address as a client: IPv4 whole; IPv6 by its /64 (one site or
     * household, whose interface ids it chooses freely); an IPv4-mapped
     * IPv6 as its IPv4; anything else as written */
    uint8_t buf[1 + 64];
    size_t n;
    char a[64];
    util_copy(a, sizeof a, addr != NULL ? addr : "");
    char *zone = strchr(a, '%');
    if (zone != NULL)
        *zone = '\0';
    struct in_addr v4;
    struct in6_addr v6;
    static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    if (inet_pton(AF_INET, a, &v4) == 1) {
        buf[0] = 4;
        memcpy(buf + 1, &v4, 4);
        n = 5;
    } else if (inet_pton(AF_INET6, a, &v6) == 1 && memcmp(v6.s6_addr, mapped, 12) == 0) {
        buf[0] = 4;
        memcpy(buf + 1, v6.s6_addr + 12, 4);
        n = 5;
    } else if (inet_pton(AF_INET6, a, &v6) == 1) {
        buf[0] = 6;
        memcpy(buf + 1, v6.s6_addr, 8);
        n = 9;
    } else {
        buf[0] = 0;
        n = strlen(a);
        memcpy(buf + 1, a, n);
        n++;
    }
    uint8_t salt2[16];
    memcpy(salt2, salt, 16);
    salt2[1] ^= 0xc1; /* not the key ids' hash */
    salt2[2] ^= 0x1e;
    uint64_t x = state_siphash(salt2, buf, n);
    salt2[3] ^= 0x77;
    uint64_t y = state_siphash(salt2, buf, n);
    memcpy(out->b, &x, 8);
    memcpy(out->b + 8, &y, 8);
    if (client_none(out))
        out->b[0] = 1; /* all zero means "no client" */
}

bool state_client_blocked(struct state *st, const struct state_client *c, int64_t now)
{
    if (client_none(c))
        return false;
    st_lock(st, now);
    const struct st_client *e = client_get(st, c, now, false);
    bool blocked = e != NULL && e->blocked_until > now;
    st_unlock(st);
    return blocked;
}

void state_client_block(struct state *st, const struct state_client *client, int64_t until, int64_t now)
{
    if (client_none(client))
        return;
    if (until > now + STATE_CLIENT_BLOCK_MS)
        until = now + STATE_CLIENT_BLOCK_MS;
    if (until <= now)
        return;
    st_lock(st, now);
    struct st_client *c = client_get(st, client, now, true); /* NULL: counted as client_full */
    if (c != NULL) {
        c->last_used = now;
        if (c->blocked_until <= now) { /* a block starts, as client_charge's */
            c->nhits = 0;
            st->h->client_blocks++;
        }
        pause_until(&c->blocked_until, until);
    }
    st_unlock(st);
}

bool state_fact_unknown(const struct state_fact *f)
{
    return f->status == TXS_NONE;
}
