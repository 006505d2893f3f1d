/* state_private.h - the state module's own header (state.h is its
 * public one): the region's layout and the calls its files share.
 *
 * Layout of the region (all offsets from its start, no pointers inside):
 *   struct st_hdr | int32 buckets[nbuckets] | struct st_tx txs[tx_slots]
 *   | struct st_client clients[client_slots] | struct st_keyent keys[key_slots]
 *   | int32 key_buckets[key_nbuckets]
 * The key table comes last so that it can grow in place (st_grow_keys): its
 * entries keep their indexes, and only the bucket heads move to the new
 * end. The geometry is the header's, numbered by `geom`; every process
 * compares it with its own copy each time it takes the lock and maps the
 * file anew when it changed (st_lock). The lock itself is always taken
 * through the first mapping, which is never moved while the state is open.
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
 * st_tx_get): one shop's public URL, however hammered, leaves the rest of the
 * table to the other shops. Each key entry counts its transaction entries
 * (ntx) and keeps them on a ring (knext, kprev: indexes, circular; kcursor
 * where the next look at them starts), so that a key at its quota looks
 * at EVICT_SAMPLE of its own entries, never the whole table; both are
 * derived, rebuilt from the table whenever a key entry is made or the
 * region is checked (the links of a key without an entry mean nothing). */
#ifndef KEMBALI_STATE_PRIVATE_H
#define KEMBALI_STATE_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "plan.h"
#include "ratelimit.h"
#include "state.h"

#define ST_MAGIC 0x696c61626d656bULL /* "kembali" */
#define ST_VERSION 14 /* 6: the per-key quota (tx_per_key, quota_full, ntx); 7: a client's reads in flight; 8: last_end;
                       * 9: hold_stamp; 10: the change log (chg_head, chg); 11: ring_kind, ring_who;
                       * 12: the key table last, growing in place (geom), ring_nf;
                       * 13: a key's ring of its entries (knext, kprev, kcursor), auth_until,
                       *     auth_serial, accepted;
                       * 14: a client's tier (IPv6 /56, /48) and its larger arrays, ring_nf 2 */
#define ST_WAITING_MAX STATE_WAITING_MAX
#define ST_ARRIVALS STATE_ARRIVALS
#define ST_PLAN_RETRY_MS RULES_PLAN_RECHECK_MS  /* a read withheld for fairness looks again after this */
#define EVICT_SAMPLE 64

struct st_tx {
    int32_t next;
    int32_t knext, kprev;   /* the ring of its key's entries (st_keyent.kcursor) */
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
    uint64_t facts_serial;    /* serial of the read whose outcome is recorded (a told one, or another
                               * host's 404: a serial of its own, after every read claimed before it) */
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
    int32_t ntx;                        /* transaction entries of this key (st_tx_get) */
    int32_t kcursor;                    /* its entries' ring: where the next look starts (-1: none) */
    uint8_t accepted;                   /* Kasera took the key since this entry was made (state_auth_allowance) */
    int64_t paused_until;
    int64_t last_used;
    int32_t ring_head, ring_n;          /* the last STATE_BUDGET_MAX read starts */
    int64_t ring[STATE_BUDGET_MAX];
    uint8_t ring_kind[STATE_BUDGET_MAX]; /* RING_*: whose read, and whether Redis has answered its claim */
    uint32_t ring_who[STATE_BUDGET_MAX]; /* RING_HEARD: a hash of its name in Redis's count (heard once) */
    uint8_t ring_nf[STATE_BUDGET_MAX];   /* RING_NF_*: whether that read ended 404 (st_budget_not_found) */
    /* the budget plan: transactions waiting (indexes into txs, checked on
     * every use), and when the latest ones were first held */
    int32_t nwaiting;
    int32_t waiting[ST_WAITING_MAX];
    int32_t arr_head, arr_n;
    int64_t arrivals[ST_ARRIVALS];
};

struct st_client {
    uint8_t id[16];             /* one of a struct state_client's ids */
    uint8_t used;
    uint8_t tier;               /* which: 0 the address, 1 an IPv6 /56, 2 a /48 (its allowance) */
    uint8_t nhits;              /* 404s in hit_*[0..nhits), oldest first */
    uint8_t nfly;               /* reads in flight of ids nobody knew, in fly_*[0..nfly) */
    int64_t blocked_until;
    int64_t last_used;
    uint32_t hit_what[STATE_CLIENT_404S_MAX]; /* a hash of (key, id): ids counted once */
    int64_t hit_at[STATE_CLIENT_404S_MAX];
    uint32_t fly_what[STATE_CLIENT_404S_MAX];
    int64_t fly_until[STATE_CLIENT_404S_MAX]; /* their leases */
};

#define CLIENT_WAYS 8

/* One change of the change log (state_change.c): change number seq (1, 2,
 * ...: it is checked when read, so a torn or damaged entry reads as lost)
 * of kind (enum state_change_kind) about key and id. */
struct st_change {
    uint64_t seq;
    uint8_t kind;
    struct state_key key;
    char id[STATE_ID_MAX + 1];
};

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
    uint64_t hold_stamp;      /* the last stamp state_hold() or state_unhold() gave */
    uint64_t chg_head;        /* changes logged so far; change s is chg[(s - 1) % STATE_CHANGES] */
    struct st_change chg[STATE_CHANGES];
    /* the host's auth_failures_per_minute (rules_auth_next): each slot
     * counts until auth_until (0: free); auth_serial: the claim of the read
     * in flight that holds it (0: a read that ended) */
    int64_t auth_until[STATE_AUTH_FAILS_MAX];
    uint64_t auth_serial[STATE_AUTH_FAILS_MAX];
    size_t buckets_off, txs_off, key_buckets_off, keys_off, clients_off;
    uint32_t geom;            /* bumped (last, under the lock) when the geometry above changed */
    uint32_t pad1;
    long key_growths;         /* times the key table grew (st_grow_keys) */
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
    atomic_bool elsewhere;    /* another store plans (state_plan_elsewhere): no read withheld here */
    atomic_int auth_allowance; /* this process's auth_failures_per_minute (state_auth_allowance) */
    bool all_accepted;        /* tests only: every key counts as accepted (state_test_keys_accepted) */
    size_t mapped;            /* length of the first file mapping (h's); 0 for state_new() memory */
    int users_fd;             /* kembali.users, flocked LOCK_SH while mapped; -1 for memory */
    int fd;                   /* the state file, for growing and mapping it anew; -1 for memory */
    int lock_fd;              /* kembali.lock (flocked by state_open and st_grow_keys); -1 for memory */
    uint8_t *body;            /* the tables' mapping when not the first one (after a growth); else NULL */
    size_t body_len;
    /* the geometry, copied when attached: every index is checked against
     * these, never against the (writable, shared) header */
    int32_t txn, keyn, nb, knb, cln;
    uint32_t geom;            /* the header's geom when copied */
    size_t size, buckets_off, txs_off, clients_off, keys_off, key_buckets_off;
    struct st_hdr *h;
    int32_t *buckets;
    struct st_tx *txs;
    int32_t *key_buckets;
    struct st_keyent *keys;
    struct st_client *clients;
    struct st_notice notice;  /* written only under the lock; logged by st_unlock() */
    long looked;              /* entries st_tx_get looked at to make room, or a new key's adoption scanned (tests) */
    int layout;               /* the layout its file is named by (state_layout_of) */
};

/* The longest a time can honestly lie ahead of `now`: anything later was
 * written by another boot's clock (a restored file) or is damage
 * (st_region_check clamps to these; state_defer too). */
#define SPAN_LEASE (STATE_LEASE_MAX_MS + 1000)
#define SPAN_RETRY (RL_MAX_WAIT_MS > PACE_EPISODE_MS + 1 ? RL_MAX_WAIT_MS : PACE_EPISODE_MS + 1)
#define SPAN_KEY_PAUSE (RL_MAX_WAIT_MS > STATE_UNAUTH_PAUSE_MS ? RL_MAX_WAIT_MS : STATE_UNAUTH_PAUSE_MS)
#define SPAN_HOST_PAUSE (RL_MAX_WAIT_MS > STATE_HOST_PAUSE_MS * 2 ? RL_MAX_WAIT_MS : STATE_HOST_PAUSE_MS * 2)

/* Callers' clocks may lag a little behind the one a check reads. */
#define SPAN_HOLD ((int64_t)PACE_MAX_STEPS * PACE_MAX_WAIT_MS + PACE_GRACE_MS) /* the longest a request is held */
#define SPAN_SLACK 10000

/* ---- state_check.c: checking and repairing the region ---- */
/* Check every table of the region (`full`), or only the header, and
 * repair what is wrong, with the region to ourselves (the lock held, or no
 * other user). Returns the number of repairs; what was found is added to
 * st->notice. */
long st_region_check(struct state *st, int64_t now, bool full);

/* ---- state_file.c: the file, the lock, the futex ---- */

/* Take the region's lock; when the geometry changed (another process grew
 * the key table: the header's geom differs from ours), map the file anew
 * first; when its holder died (EOWNERDEAD), check and repair the whole
 * region (st_region_check) and count a recovery. A grown file this
 * process cannot map (out of address space) ends it (logged): its tables
 * are no longer where it knows them. */
void st_lock(struct state *st, int64_t now);

/* Grow the key table to key_slots (under kembali.lock's flock and the
 * region's lock, both taken by the caller): the file is made longer, the
 * new slots are free, every entry keeps its index and content, the bucket
 * heads move to the new end and are rebuilt, and geom is bumped last so
 * that the other processes map the file anew at their next lock. 0, or
 * -1 with a reason (the file cannot be made longer, or mapped) and
 * nothing changed. */
int st_grow_keys(struct state *st, int32_t key_slots, char *err, size_t errlen);

/* Release the lock, then log once what checks found while it was held
 * (st->notice), and forget it. */
void st_unlock(struct state *st);

/* Something was logged (st_change_log): bump the futex word and wake every
 * process waiting on it (state_wait_change). After the lock is released. */
void st_bump(struct state *st);

/* ---- state_change.c: the change log (under the lock) ---- */

/* Log a change of `kind` about (key, id) (key NULL for STATE_CHANGE_HOST,
 * id NULL but for STATE_CHANGE_TX) for every process's state_changes();
 * the caller bumps the generation (st_bump) once the lock is released.
 * The oldest change is overwritten. */
void st_change_log(struct state *st, enum state_change_kind kind, const struct state_key *key, const char *id);

/* ---- state_table.c: the tables (callers hold the lock) ---- */

/* The bucket of (key, id) in the transaction table. */
uint32_t st_tx_bucket(struct state *st, const struct state_key *key, const char *id);

/* What a client's 404 is counted against: (key, id), hashed. */
uint32_t st_tx_what(struct state *st, const struct state_key *key, const char *id);

/* The entry of (key, id), or NULL when none is in use. */
struct st_tx *st_tx_find(struct state *st, const struct state_key *key, const char *id);

/* The per-key quota, from the region (state_open), kept within 1 .. txn. */
int32_t st_tx_quota(const struct state *st);

/* Every key entry's ntx and ring, from the table (O(slots + keys)). */
void st_key_recount(struct state *st);

/* Find or create the entry of (key, id); NULL when there is no room.
 * Room for a new entry, in this order:
 *   - a key already at its quota (tx_per_key entries) takes the slot of
 *     the least recently used idle entry among the next EVICT_SAMPLE of its
 *     own (its ring, from where the last look stopped: bounded whatever the
 *     table's size, and successive looks go round all of them); with none
 *     idle there, a request's entry
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
struct st_tx *st_tx_get(struct state *st, const struct state_key *key, const char *id, int64_t now, bool told,
                        struct st_keyent *k);

/* The bucket of key in the key table. */
uint32_t st_key_bucket(const struct state *st, const struct state_key *key);

/* The key's entry, or NULL when none is in use. */
struct st_keyent *st_key_find(struct state *st, const struct state_key *key);

/* Find the key entry; with `create`, make one when missing (key_make).
 * NULL when every slot holds a key in use (counted: key_full: a read or a
 * hold of that key finds no room, checking). */
struct st_keyent *st_key_get(struct state *st, const struct state_key *key, int64_t now, bool create);

/* Rebuild the key table's links (bucket heads, chains, free list,
 * key_used) from its entries. O(key slots). */
void st_key_relink(struct state *st);

/* ---- state_client.c: clients (callers hold the lock, but for st_client_none) ---- */

/* Is c all zero, "no client" (nothing is charged to it)? */
bool st_client_none(const struct state_client *c);

/* The home slot of the client entry named id (16 bytes: one of a struct
 * state_client's ids): its entry is one of the CLIENT_WAYS slots from
 * there. */
int32_t st_client_home(const struct state *st, const uint8_t *id);

/* May client id's read of `what` (an id nobody knows) start at `now`? Not
 * while any of its ids (the address, and an IPv6 address's /56 and /48)
 * is blocked, nor while the 404s in the window and the reads in flight of
 * any of them are its allowance (STATE_CLIENT_404S_AT) together: false,
 * *until the block's end, or the first lease to end but at most
 * STATE_CLIENT_RECHECK_MS away (a read ends long before its lease, and a
 * held request must not give up on a lease past its deadline). When it
 * may, its read is counted in flight for each of them until
 * `lease_until`. An id that finds no room is not counted. */
bool st_client_fly(struct state *st, const struct state_client *id, uint32_t what, int64_t lease_until,
                   int64_t now, int64_t *until);

/* Client id's read of `what` ended (or was never made): no longer in
 * flight for any of its ids. Returns whether it was for one. */
bool st_client_land(struct state *st, const struct state_client *id, uint32_t what, int64_t now);

/* Charge a 404 for `what` to each of client id's ids at `now`. Returns
 * true when this starts a block of one of them. */
bool st_client_charge(struct state *st, const struct state_client *id, uint32_t what, int64_t now);

/* ---- state_budget.c: the budget ring and the plan's fields (under the lock) ---- */

/* When may the key read again under `budget` reads per any 60 s span? */
int64_t st_budget_next(const struct st_keyent *k, int budget, int64_t now);

/* Count a read of the key started at `now` in its ring. Returns the time
 * it is recorded under (budget_stamp: unique among the key's). */
int64_t st_budget_push(struct st_keyent *k, int64_t now);

/* What a ring entry is (budget.h): this host's read, counted wherever it
 * should be; this host's read whose claim Redis has not answered (not
 * sent to make Redis's count whole: its claim counts it, or is refused
 * and given back); another host's read that Redis granted, heard on the
 * channel (it spends the key's budget here too, and is never sent as
 * this host's). */
enum { RING_OWN = 0, RING_ASKING = 1, RING_HEARD = 2 };

/* Redis answered the claim of the read the ring holds at t (granted it,
 * or was not asked): it is no longer RING_ASKING. */
void st_budget_answered(struct st_keyent *k, int64_t t);

/* Another host's read named `who` (a hash of its name) heard at `now`:
 * pushed as RING_HEARD unless the ring holds it already (every process of
 * this host hears it). false when it was there. */
bool st_budget_heard(struct st_keyent *k, uint32_t who, int64_t now);

/* Whether a ring entry's read ended 404 (ring_nf): not known to; it did;
 * a read of an id never answered (the 404 quarter counts it until it
 * ends otherwise: st_budget_answered_status). */
enum { RING_NF_NO = 0, RING_NF_404 = 1, RING_NF_PROBE = 2 };

/* The read the ring holds at t ended 404. */
void st_budget_not_found(struct st_keyent *k, int64_t t);

/* The read the ring holds at t is of an id never answered (RING_NF_PROBE),
 * or (probe false) ended with anything but a 404: no longer counted by
 * st_budget_nf_next. */
void st_budget_mark_probe(struct st_keyent *k, int64_t t, bool probe);

/* When may a read of an id never answered start, under the 404 quarter
 * (rules_not_found_cap(budget) reads that ended 404 or are such reads
 * still under way, within lease_ms of their start, in any 60 s span)? `now`
 * when the span ending now holds fewer; else when the newest cap-th of
 * them leaves it, or ST_PLAN_RETRY_MS from now when one of them is under
 * way (it may end otherwise). */
int64_t st_budget_nf_next(const struct st_keyent *k, int budget, int64_t lease_ms, int64_t now);

/* Were the key's reads in the budget's span ending at `now` all answered
 * 404 (at least one; none in flight, none heard from another host)? Such
 * a key is a prober's, never one to keep a configured key out (key_make). */
bool st_budget_only_404(const struct st_keyent *k, int64_t now);

/* Take back one read started at t (the newest such) from the ring: the
 * newer ones move down a place. */
void st_budget_unpush(struct st_keyent *k, int64_t t);

/* Entry idx of the key's waiting set still waits at `now`. */
struct st_tx *st_waiting_tx(struct state *st, const struct st_keyent *k, int32_t idx, int64_t now);

/* Add entry idx to the key's waiting set, once, dropping on the way the
 * entries that no longer wait; not added when ST_WAITING_MAX still wait. */
void st_waiting_add(struct state *st, struct st_keyent *k, int32_t idx, int64_t now);

/* The plan's verdict on a read of e now (the pace allowing one); on
 * PLAN_NO, *retry is when it may change, *own when e's own part of it (its
 * reservation) does (INT64_MAX: nothing of its own). */
enum plan_read st_plan_verdict(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                               const struct pace_schedule *sched, int budget, int64_t now, int64_t *retry,
                               int64_t *own);

/* state_plan_open() on key k (found, the plan in use). */
bool st_plan_open(struct state *st, const struct st_keyent *k, const struct pace_schedule *sched, int budget,
                  int64_t now, int64_t *retry);

/* May e (waiting) reserve a last-chance read at `at`? */
bool st_plan_reserve_at(struct state *st, const struct st_tx *e, const struct st_keyent *k,
                        const struct pace_schedule *sched, int budget, int64_t at, int64_t now);

/* ---- state.c: the public calls ---- */

/* Raise *until to t (a pause or block only ever grows). */
void st_pause_until(int64_t *until, int64_t t);

#endif
