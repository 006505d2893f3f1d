/* state.h - the facts every request for a transaction must agree on.
 *
 * This is the seam between "what is known" and everything else: the cache
 * of final statuses, each transaction's pace (episode, last read, the read
 * in flight), remembered 404s, Retry-After windows, key and host pauses and
 * each key's read budget. Callers ask and report through five calls:
 *
 *   state_key_id()  a key's identity (a keyed hash: the secret is not kept)
 *   state_lookup()  what is known now, and when the next read may start
 *   state_claim()   the same, and if a read may start now, take it (a ticket)
 *   state_finish()  report a read's outcome; releases the ticket
 *   state_tell()    record a status the shop was told (its webhook), no read
 *   state_metrics()  counters for the metrics page
 *
 * and, for several hosts sharing a pace (another authority, e.g. Redis,
 * says what other hosts do), four that mirror it here:
 *
 *   state_unclaim()  undo a claim whose read was never made
 *   state_defer()    another host's read in flight, or its next not-before
 *   state_learn_not_found()  another host's 404
 *   state_client_block()     another host's block of a client
 *
 * All data lives in one flat region (no pointers, fixed-size tables,
 * indexes instead of links) guarded by one mutex that is process-shared and
 * robust, so the same code can serve a region mapped by several processes.
 * No lock is ever held across I/O: callers hold none on return.
 * Times are CLOCK_MONOTONIC milliseconds (see util.h). Transaction ids are
 * validated by the caller (1..STATE_ID_MAX characters); state_claim() refuses
 * a longer one with WAIT_FULL. */
#ifndef KEMBALI_STATE_H
#define KEMBALI_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "classify.h"
#include "ids.h"
#include "pace.h"
#include "rules.h"

#define STATE_ID_MAX IDS_ID_MAX
#define STATE_SLOTS_DEFAULT 16384         /* transactions tracked at once */
#define STATE_READ_TIMEOUT_MS_DEFAULT 5000 /* one API read */
#define STATE_SHOP_MAX 64
#define STATE_BUDGET_MAX 300         /* Kasera's per-key limit per minute */

/* the rules' numbers (rules.h), under the names the state's callers know */
#define STATE_TTL_FINAL_MS RULES_TTL_FINAL_MS
#define STATE_TTL_EXPIRED_MS RULES_TTL_EXPIRED_MS
#define STATE_TTL_NOT_FOUND_MS RULES_TTL_NOT_FOUND_MS
#define STATE_KEY_PAUSE_MS RULES_KEY_PAUSE_MS
#define STATE_UNAUTH_PAUSE_MS RULES_UNAUTH_PAUSE_MS
#define STATE_HOST_PAUSE_MS RULES_HOST_PAUSE_MS
#define STATE_LEASE_MAX_MS (30 * 1000LL)   /* the longest read timeout a lease may have */
#define STATE_DEFER_MAX_MS (600 * 1000LL)  /* the longest not-before another host may set (state_defer) */
#define STATE_AUTH_SPAN_MS RULES_AUTH_SPAN_MS
#define STATE_AUTH_FAILS_MAX RULES_AUTH_FAILS_MAX
#define STATE_AUTH_FAILS_DEFAULT RULES_AUTH_FAILS_DEFAULT

struct state;

struct state_key {
    uint8_t b[16];
};

/* A client (REMOTE_ADDR) of one shop key as the state knows it: keyed
 * hashes of (key, address), never the address. b is the address (IPv4
 * whole, IPv6 by its /64); wide[0] and wide[1] its IPv6 /56 and /48 (all
 * zero for any other address): one request is a client at each, each
 * with its own allowance (STATE_CLIENT_404S_AT). b all zero: no client
 * (nothing is charged). */
#define STATE_CLIENT_TIERS 3 /* the address, its /56, its /48 */
struct state_client {
    uint8_t b[16];
    uint8_t wide[STATE_CLIENT_TIERS - 1][16];
};

#define STATE_CLIENT_404S 5                     /* distinct ids answered 404 (an address, an IPv6 /64) ... */
#define STATE_CLIENT_404S_56 10                 /* ... an IPv6 /56's, all its /64s together ... */
#define STATE_CLIENT_404S_48 20                 /* ... an IPv6 /48's ... */
#define STATE_CLIENT_404S_MAX STATE_CLIENT_404S_48
#define STATE_CLIENT_404S_AT(tier) ((tier) == 0 ? STATE_CLIENT_404S : (tier) == 1 ? STATE_CLIENT_404S_56 : STATE_CLIENT_404S_48)
#define STATE_CLIENT_WINDOW_MS (600 * 1000LL)   /* ... within 10 minutes ... */
#define STATE_CLIENT_BLOCK_MS (600 * 1000LL)    /* ... block unknown ids for 10 minutes */
#define STATE_CLIENT_RECHECK_MS 250             /* a client at its count looks again after this at most */
#define STATE_CLIENT_SLOTS_DEFAULT 4096
#define STATE_CLIENT_SLOTS_MAX (1 << 20)

/* Why the next read cannot start now. */
enum state_wait {
    WAIT_NONE = 0,
    WAIT_PACE,      /* the schedule */
    WAIT_RETRY,     /* a Retry-After, a stated reset, or a rejected episode */
    WAIT_KEY_PAUSE, /* per-key 429 or 401 */
    WAIT_HOST_PAUSE,/* failed-authentication 429 */
    WAIT_BUDGET,    /* read_budget_per_minute */
    WAIT_FULL,      /* no room to track this transaction */
    WAIT_CLIENT,    /* the client asking is blocked, or at its count with reads in flight */
    WAIT_AUTH,      /* a key Kasera has not accepted, while the host's auth_failures_per_minute is spent */
};

struct state_fact {
    enum tx_status status;                 /* last status read (TXS_NONE if none) */
    char status_word[STATUS_WORD_MAX + 1]; /* as Kasera wrote it */
    bool final;          /* a cached final status: answer without reading */
    bool not_found;      /* a remembered 404 */
    int64_t known_until; /* end of the cache or 404 memory */
    bool in_flight;      /* a read of this transaction is under way */
    int64_t in_flight_until;
    int64_t next_read;   /* earliest start of another read (>= now; now, WAIT_NONE, with final) */
    enum state_wait wait;
    bool withheld;       /* only the budget's plan holds the read back (wait WAIT_BUDGET,
                          * next_read: when it looks again); what can change that is the
                          * key's (state_plan_open) or, at withheld_own, its own */
    int64_t withheld_own; /* withheld: its own reservation's time (INT64_MAX: none) */
    enum rules_held held; /* what answers without a read (rules_held; RULES_HELD_NONE: a read may be asked) */
};

struct state_ticket {
    struct state_key key;
    char id[STATE_ID_MAX + 1];
    uint64_t serial;     /* this read's place among every read claimed */
    int64_t started;
    int64_t budget_at;   /* the time the key's budget records it under (budget_stamp) */
    int64_t budget_prev; /* the key's read recorded before it (0: none) */
    int64_t lease_until; /* started + its timeout + 1 s: waited for until then */
    int64_t sent; /* set by the reader: when the request went out (0: never) */
    struct state_client client; /* who asked (state_claim_client; zero: nobody is charged) */
    int64_t wait_ms;     /* the schedule's wait after this read (pace_wait, at state_claim) */
    int refused;         /* set by the reader: this process's reads of the transaction that
                          * Kasera's per-transaction window refused in a row before this one
                          * (rules_tx_limited_wait) */
    struct {                 /* set by state_claim, for state_unclaim: what the claim changed */
        uint64_t serial;     /* the transaction's last claim before this one */
        int64_t last_start;  /* the pace before it */
        int32_t reads, early_reads;
        int64_t resv_at;     /* its reservation before it ... */
        int64_t resv_left;   /* ... and after it */
        bool last_chance;    /* it was a last-chance read (plan.h) */
    } undo;
};

/* What state_finish() changed that the caller should log once. */
struct state_report {
    bool key_paused;       /* this outcome started a key pause */
    bool host_paused;      /* this outcome started a host pause */
    bool first_unknown;    /* first sighting of an unknown status for this transaction */
    bool stale;            /* the read ended after its lease, or after another read of it started */
    bool client_blocked;   /* this 404 started ticket->client's block (log one line) */
    char last_401_shop[STATE_SHOP_MAX + 1]; /* shop whose key last got a 401 here */
    struct rules_effect effect; /* what the outcome did (rules.h): what another store must apply too */
};

#define STATE_KEY_SLOTS_DEFAULT 256   /* key_slots when state_opts gives none */
#define STATE_KEY_SLOTS_MIN 64
#define STATE_KEY_SLOTS_MAX (1 << 20)
#define STATE_KEY_IDLE_MS (60 * 1000LL) /* a key read within this is in use (its budget ring) */

struct state_opts {
    int tx_slots;             /* transactions tracked at once (default STATE_SLOTS_DEFAULT) */
    int tx_per_key;           /* most of them one key's entries may take (<= 0: the default,
                               * state_per_key_default); see state_open for a shared file */
    int key_slots;            /* distinct keys (default STATE_KEY_SLOTS_DEFAULT; see state_key_slots_for) */
    int64_t read_timeout_ms;  /* the lease of a claim that gives no timeout (default STATE_READ_TIMEOUT_MS_DEFAULT) */
    int client_slots;         /* clients whose 404s are counted at once (default 4096) */
    bool greedy;              /* this process does not plan a scarce budget (plan.h): first come,
                               * first served, for comparison only */
    int layout;               /* the layout version the file is named by (<= 0: state_layout());
                               * another one only in tests, to run two layouts side by side */
};

struct state_metrics {
    long tx_used, tx_slots, evictions, full;
    long tx_per_key, quota_full; /* quota_full: a new entry refused by the per-key quota (checking) */
    long key_used, key_slots, key_evictions, key_full; /* key_full: a key found no slot (checking) */
    long clients_blocked;      /* clients blocked now (a gauge) */
    long host_paused;          /* 1 while Kasera's failed-authentication 429 pauses every key, else 0 */
    long client_blocks;        /* blocks started */
    long client_slots, client_full; /* client_full: a 404 or a read in flight that found no room to be counted */
    long recoveries;   /* a process died holding the lock; the next one repaired */
    long repairs;      /* checks (open, recovery) that found something to repair */
    long stale_locks;  /* opens that found the lock held with no live user (a copy, a crashed host) */
    long reserved, last_chance_reads; /* the budget plan (plan.h) */
    long auth_failures;        /* reads counted against auth_failures_per_minute now (state_auth_allowance) */
    long auth_allowance;       /* this process's auth_failures_per_minute */
};

/* The key slots for a configuration with `keys` keys (distinct secrets;
 * counting shops gives an upper bound): twice as many, at least
 * STATE_KEY_SLOTS_MIN, at most STATE_KEY_SLOTS_MAX, so that keys added by
 * reloads find room. A full key table makes room by forgetting the least
 * recently used idle key (no pause in force, nothing in its budget ring
 * newer than STATE_KEY_IDLE_MS: forgetting it forgets nothing that limits
 * a read), else the least recently used one whose reads of the last
 * minute all ended 404 (no pause: a prober's guesses never keep a key
 * out); a key finds no slot (WAIT_FULL: checking) only while every slot
 * holds a key in use otherwise. This function can't fail. */
int state_key_slots_for(int keys);

/* Room for every key: make the key table hold at least key_slots (at most
 * STATE_KEY_SLOTS_MAX) keys, for a reload that configures more keys than
 * it has slots (state_open does the same for its own options). The file
 * grows in place while other processes use it: every entry keeps what it
 * holds (budget rings, pauses, the plan's fields; transactions and
 * clients are not moved), and the other processes map it anew the next
 * time they take the lock. Never shrinks. Logs one line when it grew.
 * Returns 0, or -1 with a reason in err (the file cannot be made longer
 * or mapped: the table keeps its size, and idle keys make room as
 * before). */
int state_grow_keys(struct state *st, int key_slots, char *err, size_t errlen);

/* The per-key quota of a table of `tx_slots` transactions when none is
 * configured (state_slots_per_key): a quarter of it, at least 1. The one
 * place this default is decided. This function can't fail. */
int state_per_key_default(int tx_slots);

/* Create a state in this process's memory (tests). Returns NULL and writes
 * a reason into err on failure (allocation, mutex). */
struct state *state_new(const struct state_opts *opts, char *err, size_t errlen);

/* What the state holds for one transaction in hand, as a handover to a
 * process of another layout carries it (handover.h, docs/handover.md):
 * times are CLOCK_MONOTONIC milliseconds, which every process of a host
 * shares, 0 when none. */
struct state_snap {
    bool has_tx;              /* the transaction had an entry (else only the pauses mean something) */
    int32_t reads;            /* reads started in the current episode */
    int64_t last_start, last_end; /* the pace: the last read's start and end */
    int64_t inflight_until;   /* a read in flight until then (its lease) */
    int64_t not_before;       /* Retry-After, a stated reset, a rejected episode */
    enum tx_status status;    /* the last status read (TXS_NONE: none) */
    char status_word[STATUS_WORD_MAX + 1];
    int64_t known_until;      /* its cache, or the 404's memory */
    bool not_found;           /* known_until is a remembered 404 */
    int64_t key_paused_until; /* the key's pause */
    int64_t host_paused_until; /* the host's pause */
};

/* What st holds at `now` for (key, id), into *out (state_snap). This
 * function can't fail: an untracked transaction gives has_tx false. */
void state_snapshot(struct state *st, const struct state_key *key, const char *id, int64_t now,
                    struct state_snap *out);

/* A cached final status of the table (state_finals). */
struct state_final {
    struct state_key key;
    char id[STATE_ID_MAX + 1];
    struct state_snap snap;
};

/* Every transaction whose final status is cached at `now`, with its
 * snapshot (as state_snapshot), into *out (allocated; the caller frees
 * it). Returns how many; 0 with *out NULL when none (or no memory). Looks
 * at the whole table once, under the lock: for a handover, not a request. */
size_t state_finals(struct state *st, int64_t now, struct state_final **out);

/* Take in what a process of another layout knew of (key, id) (its
 * state_snapshot at handing over) without moving anything backwards: the
 * pace only when the snapshot's last read is newer than the one recorded
 * here (reads, last_start, last_end together), a read in flight
 * and Retry-After only lengthened, a status only as a read's answer would
 * replace it (rules_may_replace; a non-final one only where none is known,
 * a final one only while its cache runs, with the cache it has left), a
 * 404 only where nothing final is cached, pauses only extended. Logs a
 * change of the transaction (and of the key or host when their pause grew)
 * so that waits look again. Returns false when the transaction found no
 * room here (the pauses are taken in all the same) or id is invalid. */
bool state_import(struct state *st, const struct state_key *key, const char *id, const struct state_snap *snap,
                  int64_t now);

/* The layout version of this build's state file (ST_VERSION): its name is
 * kembali-vN.state. */
int state_layout(void);

/* The layout version st's file is named by: state_layout(), or the one a
 * test asked for (state_opts.layout). This function can't fail. */
int state_layout_of(const struct state *st);

/* Open the state shared by every process started with the same `dir`:
 * the file dir/kembali-vN.state, N its layout version (created 0600,
 * mapped shared), made, checked or reset under an flock of
 * dir/kembali.lock (every layout's). A file of that name from an
 * incompatible build (layout stamp) or one whose geometry does not fit
 * its size is replaced, never misread.
 *
 * Versions side by side: the files of other layouts (kembali-vM.state, and
 * kembali.state of the releases before layouts were named) are never
 * replaced or changed while a live process uses them (holds their users
 * file, below): both run, each with its own cache and pace, and one
 * warning says so. The ones no live process uses are removed (info).
 *
 * Every process holds a shared flock of dir/kembali-vN.users from this call
 * to state_free() (the kernel drops it when the process dies, however).
 * A process that can take it exclusively is the only live user: it makes
 * the lock anew (a copy taken while a process held it, after a power cut,
 * a restored snapshot or backup, would otherwise make everybody wait for
 * ever), releases the leases of reads in flight (their processes are
 * gone; the pace stays) and checks every table. Otherwise the tables are
 * checked under the lock (waiting at most 2 s for it: beyond that the
 * open fails with a reason rather than hang). The check bounds every index,
 * count, walk, string and enum, and every time to its longest span from now
 * (a file from another boot has another clock); what does not read as
 * whole is dropped or relinked from the entries, counted (metrics repairs)
 * and logged once after the locks are released.
 *
 * The directory is created 0700 when missing and refused when other users
 * can write it. An existing file keeps its tx_slots and client slots; its
 * key table grows to opts->key_slots when smaller (state_grow_keys).
 *
 * The per-key quota (tx_per_key) is the region's, not each process's: the
 * processes sharing a file may have been started with different
 * configurations, and one table needs one rule, or the most generous
 * process would decide how much of it one key may take. A process that
 * opens the file while no other live process uses it (after every process
 * stopped: a restart) sets it from its own options (clamped to 1 ..
 * tx_slots of the file; the default is taken from the file's tx_slots, so
 * a file kept at another size still gets a quarter); a process joining
 * others that asks for another quota keeps the region's and logs a warning.
 * Returns NULL with a reason in err. */
struct state *state_open(const char *dir, const struct state_opts *opts, char *err, size_t errlen);

/* Check that `dir` can hold the state (see state_open); 0 or -1 with err.
 * A missing dir is created (0700) when `create`, else only its parent is
 * checked. */
int state_check_dir(const char *dir, bool create, char *err, size_t errlen);

/* Unmap or free. Other processes keep using a shared state. */
void state_free(struct state *st);

/* A counter bumped (with a futex wake) every time a change is logged (see
 * state_changes: a read's outcome, a told status...) by any process.
 * state_wait_change() blocks until it differs from `seen` or timeout_ms
 * pass, and returns the current value: this is how a process learns,
 * within milliseconds, that something it waits on changed. */
uint32_t state_generation(struct state *st);
uint32_t state_wait_change(struct state *st, uint32_t seen, int timeout_ms);

/* What changed, for the requests held in every process: the change log.
 * Every call that may let a held request be answered or read sooner logs
 * what it concerns, then bumps the generation:
 *   - STATE_CHANGE_TX, (key, id): a read's end (state_finish), a claim
 *     given back (state_unclaim), a told status (state_tell), another
 *     host's read in flight set or cleared (state_defer), another host's
 *     404 (state_learn_not_found);
 *   - STATE_CHANGE_KEY, key: a pause of the key started or grew
 *     (state_finish), a read given back to its budget or a client's read
 *     in flight no longer counted (state_unclaim: a client is one key's);
 *   - STATE_CHANGE_HOST: the host's pause started or grew (state_finish).
 * A client's count (state_finish's 404s, reads landing) and the budget's
 * plan are not logged: a request waiting on them looks again by its own
 * clock (STATE_CLIENT_RECHECK_MS, the plan's retry). The log keeps the
 * last STATE_CHANGES changes; a reader further behind has lost some and
 * must look at everything. */
enum state_change_kind {
    STATE_CHANGE_TX = 0,
    STATE_CHANGE_KEY,
    STATE_CHANGE_HOST,
};

struct state_change {
    enum state_change_kind kind;
    struct state_key key;        /* TX and KEY */
    char id[STATE_ID_MAX + 1];   /* TX: a valid id; otherwise empty */
};

#define STATE_CHANGES 2048

/* The log's position now: a reader starting here reads the changes
 * logged after this call. This function can't fail. */
uint64_t state_changes_head(struct state *st);

/* Copy the changes logged after *cursor, oldest first, into out[0..max),
 * advance *cursor past the ones copied and return how many (fewer than
 * max: none is left). When some of them are no longer in the log (more
 * than STATE_CHANGES logged since *cursor; an entry that does not read
 * as whole; a cursor ahead of the log, from another file), *lost is set,
 * nothing is copied and *cursor moves to the newest change: the caller
 * must look at everything. One pass of the lock, at `now`. Can't fail. */
size_t state_changes(struct state *st, uint64_t *cursor, struct state_change *out, size_t max, int64_t now,
                     bool *lost);

#ifdef KEMBALI_TESTING
/* Tests only: take the lock, call `damage` (which may scribble on the
 * region, or copy the file), and _exit() while holding it, as a process
 * killed mid-update would. */
void state_test_die_holding_lock(struct state *st, void (*damage)(struct state *st));

/* Tests only: scribble on one kind of field, as a torn write or a
 * damaged copy would (no lock taken: the caller has the region to itself
 * or holds the lock in state_test_die_holding_lock). */
enum state_test_damage {
    STATE_TEST_BUCKET_OOB,  /* bucket heads out of range, both ways */
    STATE_TEST_CHAIN_LOOP,  /* an entry's next points at itself */
    STATE_TEST_CHAIN_OOB,   /* an entry's next far out of range */
    STATE_TEST_FREE_OOB,    /* the free list's head out of range */
    STATE_TEST_FREE_LOOP,   /* the free list loops */
    STATE_TEST_TX_USED,     /* tx_used wrong */
    STATE_TEST_USED_FLAG,   /* a free entry's used flag neither 0 nor 1 */
    STATE_TEST_ID_NUL,      /* an id without its NUL */
    STATE_TEST_WORD_NUL,    /* a status word without its NUL */
    STATE_TEST_STATUS,      /* a status and a flag out of their enums */
    STATE_TEST_TIMES,       /* times far in the future and past, negative reads */
    STATE_TEST_REMOTE_TIMES, /* another host's marks (state_defer) far in the future */
    STATE_TEST_REMOTE_WAIT, /* another host's reason out of its enum */
    STATE_TEST_KEY_RING,    /* a key's ring head and count out of range */
    STATE_TEST_KEY_TIMES,   /* a key's ring and pause far in the future */
    STATE_TEST_KEY_LINKS,   /* key bucket heads, a chain, the free list, key_used */
    STATE_TEST_KEY_USED_FLAG, /* a free key entry's used flag neither 0 nor 1 */
    STATE_TEST_CLIENTS,     /* client entries: flags, counts, out of their ways, times */
    STATE_TEST_HEADER,      /* geometry, strings, serial, counters */
};
#define STATE_TEST_DAMAGE_N (STATE_TEST_HEADER + 1)
void state_test_damage(struct state *st, enum state_test_damage what);

/* Tests only: every key counts as one Kasera has accepted (no gate of
 * state_auth_allowance), for the tests of everything else. */
void state_test_keys_accepted(struct state *st, bool all);

/* Tests only: how many transaction entries this process has looked at to
 * make room for a new one (a count, not a time). */
long state_test_looked(const struct state *st);
#endif

/* The identity of a secret key: a keyed hash with a salt kept in the state,
 * so keys are compared without being stored. This function can't fail. */
void state_key_id(const struct state *st, const char *secret, struct state_key *out);

/* What is known about (key, id) at `now`, and when a read could next start
 * under `sched` and `budget` reads per minute. A query: never reads
 * anything itself, and changes nothing. */
void state_lookup(struct state *st, const struct state_key *key, const char *id,
                  const struct pace_schedule *sched, int budget, int64_t now, struct state_fact *out);

/* As state_lookup(), for the requests held for (key, id): when the
 * budget's plan holds their read back (fact.withheld), that is recorded
 * for this hold, under the same lock, so that from now on its reads count
 * as off their schedule when late (plan_drifted). state_claim() records
 * it too when it is refused so. */
void state_lookup_held(struct state *st, const struct state_key *key, const char *id,
                       const struct pace_schedule *sched, int budget, int64_t now, struct state_fact *out);

/* The budget's plan for every transaction of `key` at once: false when it
 * holds back every early read of the key now (as state_lookup() finds for
 * each, fact.withheld), whichever transaction asks, whatever its own
 * state; true when one may be allowed (or the key has no plan: nothing is
 * withheld). *retry (set either way, after now) is when a withheld one
 * looks again, as each would (plan_retry): a read leaving the spans, the
 * rush thinning, at the latest after the plan's recheck
 * (RULES_PLAN_RECHECK_MS); so that a process holding many withheld
 * transactions of a key looks at the key once, not at each. A transaction's own reservation (fact.withheld_own)
 * is not the key's. Never reads anything itself. */
bool state_plan_open(struct state *st, const struct state_key *key, const struct pace_schedule *sched, int budget,
                     int64_t now, int64_t *retry);

/* As state_lookup(); in addition, when a read may start now (nothing final or
 * remembered, none in flight, fact.next_read <= now), records its start
 * (pace, budget), fills *ticket and returns true. The caller must then make
 * the read and call state_finish() exactly once with that ticket.
 * The read's lease is the timeout it is made with: `timeout_ms` (at most
 * STATE_LEASE_MAX_MS; <= 0: the state's read_timeout_ms) plus 1 s. Until
 * then every process waits for it rather than read again, whatever its own
 * timeout (ticket->lease_until, fact.in_flight_until). */
bool state_claim(struct state *st, const struct state_key *key, const char *id,
                 const struct pace_schedule *sched, int budget, int64_t timeout_ms, int64_t now,
                 struct state_ticket *ticket, struct state_fact *out);

/* As state_claim(), for a request of `client` (NULL or all zero: none,
 * exactly state_claim()), recorded on the ticket. When kembali knows
 * nothing of the id (state_fact_unknown), the read is also refused while
 * the client is blocked (state_client_blocked) or while its 404s within
 * STATE_CLIENT_WINDOW_MS and its reads still in flight of ids nobody knew
 * are its allowance together (STATE_CLIENT_404S_AT: the address, and an
 * IPv6 address's /56 and /48 each): fact.wait is WAIT_CLIENT and
 * fact.next_read the block's end, or the first of those reads' leases to
 * end but at most STATE_CLIENT_RECHECK_MS away (every read's end bumps
 * the generation: look again then). A read
 * claimed for an unknown id counts as in flight for the client until
 * state_finish() (a 404 becomes a charge, anything else releases it),
 * state_unclaim() or its lease ends. A client that finds no room in the
 * table is not counted (as state_client_blocked says).
 * Whoever asks (client or not), an id with no status read or told is
 * read only with a held request's last-chance read (reserved, or within
 * PLAN_LEAD_MS of its deadline) while the key's reads that ended 404, and
 * its reads under way of such ids, fill rules_not_found_cap(budget) in the
 * 60 s span ending now (the 404 quarter; not while another store plans:
 * state_plan_elsewhere): fact.wait WAIT_BUDGET, fact.next_read the first
 * of its last-chance time and the quarter's room (at most
 * RULES_PLAN_RECHECK_MS away while one of those reads is under way). */
bool state_claim_client(struct state *st, const struct state_key *key, const char *id,
                        const struct pace_schedule *sched, int budget, int64_t timeout_ms,
                        const struct state_client *client, int64_t now, struct state_ticket *ticket,
                        struct state_fact *out);

/* Record the outcome of the read of `ticket`, made for shop `shop_id`, at
 * `now`; updates the cache, pace and pauses and releases the ticket (the
 * pace counts from ticket->sent when set). *report says what started that
 * deserves one log line.
 *
 * A 404 is charged to ticket->client (unless all zero) when the id has no
 * known status (no entry, or only a remembered 404), stale or not: see
 * state_client_blocked().
 *
 * A read's outcome (rules_read_current and rules_read_records decide it,
 * in both stores): a read is current when it ends within its lease and no
 * other read of the transaction was claimed since; otherwise it is stale
 * (report->stale), and what it found never overwrites what is newer:
 *   - a status, current: recorded, except that a cached final status is
 *     only replaced as state_tell() allows (a late pending cannot clear it);
 *     once its cache ran out, a current read's word replaces it;
 *   - a final status, stale: recorded only forward, as state_tell() allows,
 *     whatever the cache (Kasera does not take a final status back);
 *   - pending or an unknown word, stale: recorded only when no later read's
 *     outcome or told status is recorded, no final status is known and no
 *     404 is remembered;
 *   - a 404, current: remembered unless a final status is cached;
 *   - a 404, stale: remembered only when nothing at all is known (no status,
 *     no 404 whose memory runs, no later outcome): a late 404 cannot hide a
 *     succeeded, cached or not;
 *   - Retry-After windows, stated exhausted windows, key pauses (429, 401),
 *     the host pause, a rejected episode (counted from this read's start):
 *     applied however stale, since they happened at Kasera and each only
 *     extends a wait;
 *   - the budget: the read was counted when claimed and stays counted.
 * Only the ticket that is the transaction's last claim releases the lease;
 * a stale one leaves a newer read's lease alone. Any read's end clears
 * another host's read in flight (state_defer) of the transaction. */
void state_finish(struct state *st, const struct state_ticket *ticket, const char *shop_id,
                  const struct outcome *oc, int64_t now, struct state_report *report);

/* Undo the claim of `ticket`, whose read was never made (another host's
 * authority refused it), at `now`, instead of state_finish(). While the
 * ticket is the transaction's last claim, the transaction is as if it had
 * never been claimed: the lease is released, the pace (reads of the
 * episode, the last read's start, the episode itself), the plan's fields
 * (early reads, a reservation the read used) and the last-chance count are
 * what they were, and the key's budget ring no longer counts the read (a
 * full ring's oldest start, which the claim pushed out, stays forgotten: it
 * was older than any budget's span, or the claim could not have been
 * made). The generation is bumped, so that processes waiting on the lease
 * look again. A stale ticket (another read was claimed since, or it was
 * unclaimed already) changes nothing. Can't fail. */
void state_unclaim(struct state *st, const struct state_ticket *ticket, int64_t now);

/* What state_tell() did. */
enum state_told {
    STATE_TOLD_RECORDED = 0, /* recorded as if a read had just returned it */
    STATE_TOLD_KEPT,         /* valid, but a final status already known stays */
    STATE_TOLD_FULL,         /* no room: every slot in use, none of them this key's */
    STATE_TOLD_BAD,          /* not a Kasera status word's status, or a bad id */
};

/* Record that the shop was told (a verified webhook) that (key, id) has
 * `status` (pending, succeeded, failed, canceled or expired; `word` is how
 * Kasera writes it), at `now`, as if a read had just returned it, but
 * without spending the key's budget or touching the pace, the read in
 * flight or any pause. A final status is cached with a read's TTLs and the
 * generation is bumped, so that requests held for it in every process are
 * answered at once; pending only becomes the last known status. A told
 * status clears a remembered 404 for that id, and another host's read in
 * flight (state_defer; the generation is bumped then too). What is known
 * never moves backwards:
 *   - a final status is never replaced by pending (nor by an unknown word);
 *   - expired may become succeeded (a late payment), failed or canceled;
 *   - succeeded, failed and canceled are never replaced by another status
 *     (telling the same one again restarts its cache).
 * A read's outcome (state_finish) keeps the same order while the final
 * status it would replace is cached.
 *
 * A told status finds room: a new entry of a key at its quota takes the
 * slot of that key's least recently used idle entry (among the next
 * EVICT_SAMPLE of its own, st_tx_get); otherwise (the key
 * under its quota, or none of its entries idle) a free slot, else the least
 * recently used idle entry of any key. Only when every slot holds an entry
 * in use does it take one in use, and only one of its own key's (no read
 * in flight and no held request if there is one, least recently used
 * first): another key's entry in use is never taken, so one tenant's
 * notifies cannot cost another tenant's buyers their pace or reservation.
 * Each key holds at most tx_per_key entries in use, so STATE_TOLD_FULL
 * (the notify POST's 503, --notify's exit 1) needs at least
 * tx_slots / tx_per_key other keys (four, by default) each flooded up to
 * its quota while this key has no entry; the shop's webhook tries again.
 * Returns what was done; never blocks on anything but the state's lock. */
enum state_told state_tell(struct state *st, const struct state_key *key, const char *id,
                           enum tx_status status, const char *word, int64_t now);

/* Another host made a read with `key` that Redis granted (heard on its
 * channel; `who` a hash of the read's name there): it spends the key's
 * budget here too, from `now` for the span, so that while Redis is away
 * this host counts what the others spent before (budget.h). Every process
 * of the host hears it: recorded once. true when recorded now, false when
 * it was already (or the key table is full). */
bool state_heard(struct state *st, const struct state_key *key, uint32_t who, int64_t now);

/* The read of ticket t (claimed here) is no longer waiting on Redis's
 * answer: Redis granted it (and counts it), or was not asked (the read is
 * this host's alone). Until then state_key_reads() leaves it out: a claim
 * Redis refuses is given back (state_unclaim), and sent meanwhile it
 * would be counted though never made. Can't fail. */
void state_answered(struct state *st, const struct state_ticket *t, int64_t now);

/* The reads of `key` this state recorded in the budget's span ending at
 * `now` (every process's, whether Redis granted them or not; not those
 * still waiting on Redis's answer, state_answered), each at the time its
 * ring holds it (budget_stamp): at most cap of them, newest first, into
 * at[]; *newest is the newest read ever recorded (0: none), in the span
 * or not. Returns how many. Never creates an entry; can't fail. */
int state_key_reads(struct state *st, const struct state_key *key, int64_t now, int64_t *at, int cap,
                    int64_t *newest);

/* Does this state hold a status (read or told) for (key, id)? Never
 * creates an entry. This function can't fail. */
bool state_known(struct state *st, const struct state_key *key, const char *id, int64_t now);

/* Another host's state says that no read of (key, id) may start here
 * before `until` (this process's monotonic ms, like every time here):
 *   - in_flight: because a read of it is in flight on another host, until
 *     `until` at the latest (clamped to the longest lease, STATE_LEASE_MAX_MS
 *     + 1 s, from now). state_lookup() and state_claim() report
 *     fact.in_flight with in_flight_until (the later of this mark and a
 *     read in flight here), and no claim succeeds until then. The mark only
 *     ever extends; it is cleared by state_tell(), state_learn_not_found(),
 *     the end of any read of the transaction here (state_finish) or a
 *     defer that is not in flight;
 *   - otherwise: the other host's next not-before (its read ended, or its
 *     pace, Retry-After, key pause or budget says so): clears the mark;
 *     fact.next_read is then at least `until` (clamped to
 *     STATE_DEFER_MAX_MS from now) with fact.wait `why` (WAIT_PACE,
 *     WAIT_RETRY, WAIT_KEY_PAUSE or WAIT_BUDGET; any other reads as
 *     WAIT_RETRY). A not-before only ever extends: the later `until` wins,
 *     with its `why`.
 * The budget, the pace's own fields and the cache are not touched. The
 * generation is bumped only when the mark is set or cleared (waiters look
 * again). Creates the transaction's entry when missing; returns false when
 * there is no room to track it (as STATE_TOLD_FULL) or the id is not
 * valid. Never blocks on anything but the state's lock. */
bool state_defer(struct state *st, const struct state_key *key, const char *id, int64_t until, bool in_flight,
                 enum state_wait why, int64_t now);

/* Another host read a 404 for (key, id): remember it until `until`
 * (clamped to STATE_TTL_NOT_FOUND_MS from now; a 404 remembered longer
 * keeps its end) as a current read's 404 is remembered here (not while a
 * final status is cached; what replaces it is what replaces a read's 404:
 * see state_finish and state_tell), without spending the budget, touching
 * the pace or charging a client. Clears another host's
 * read in flight (state_defer) and bumps the generation. Creates the
 * transaction's entry when missing; returns false when there is no room
 * to track it or the id is not valid. */
bool state_learn_not_found(struct state *st, const struct state_key *key, const char *id, int64_t until,
                           int64_t now);

#define STATE_STAMPS_PER_MS 1024 /* hold stamps: at least now (ms) times this, so they grow over restarts */

/* A request for (key, id) is held until `deadline` (a held HTML request):
 * the transaction waits, and the first request of a holding period reserves
 * its last-chance read, PLAN_LEAD_MS before that deadline, when the key's
 * budget allows (plan.h). Every process holding requests for it calls this
 * once per request, and state_unhold() once when that request is answered
 * or gone; a holder that dies is forgotten at its deadline. Returns false
 * when there is no room to track the transaction (the request then gets no
 * reservation). *stamp (when stamp is not NULL) gets the hold's stamp:
 * larger than any stamp state_hold() or state_unhold() gave before in any
 * process of this state, and at least now * STATE_STAMPS_PER_MS (this
 * host's holds and leaves in the order they were made, for Redis, which
 * hears each process on its own connection: state_redis_left). */
bool state_hold(struct state *st, const struct state_key *key, const char *id,
                const struct pace_schedule *sched, int budget, int64_t deadline, int64_t now, uint64_t *stamp);

/* One request held with state_hold() no longer waits. When none is left,
 * the transaction's unused reservation goes back to the budget, and true
 * is returned (no request of this state holds it any more). *stamp (when
 * not NULL) gets a stamp as state_hold() gives. Can't fail. */
bool state_unhold(struct state *st, const struct state_key *key, const char *id, int64_t now, uint64_t *stamp);

/* The transaction's reservation is the one another store decided (Redis,
 * for every host: state_redis_held): from `at` (reserved), or none. Only
 * for a transaction held here (state_hold). Can't fail. */
void state_reserve(struct state *st, const struct state_key *key, const char *id, bool reserved, int64_t at,
                   int64_t now);

/* Rejected keys (docs/configuration.md, auth_failures_per_minute; rules_auth_next): this host makes at most
 * `per_minute` (RULES_AUTH_FAILS_MIN .. RULES_AUTH_FAILS_MAX, clamped;
 * STATE_AUTH_FAILS_DEFAULT until called) reads that end in 401 in any
 * STATE_AUTH_SPAN_MS, all keys together, counted over every process
 * sharing the state (each process applies its own configuration's value
 * to the shared count). A key Kasera has not accepted since its entry was
 * made here (no answer that only an authenticated read gets: a status, a
 * 404, a 429) counts each of its reads against the allowance from its
 * claim (until its lease ends plus the span), keeps it there when it
 * fails (a 401, the failed-authentication 429: from its end) and gives
 * it back otherwise (a lost answer too: a timeout is not the key's); while the allowance is spent such a key
 * makes no read (fact.wait WAIT_AUTH, fact.next_read when a count runs
 * out). A 401 of an accepted key is counted too; an accepted key reads as
 * usual (a 401 pauses it as before). A changed key is another key: not
 * accepted. For this process; can't fail. */
void state_auth_allowance(struct state *st, int per_minute);

/* Does this state plan a scarce budget (plan.h; state_opts.greedy off)? */
bool state_plans(const struct state *st);

/* Another store plans the budget for this process (Redis, up: it sees
 * every host's reads, holds and arrivals, and this state only this
 * host's): this state withholds no read for the plan, though it still
 * tells a last-chance read from an early one. false: this state plans.
 * For this process's state only; can't fail. */
void state_plan_elsewhere(struct state *st, bool elsewhere);

#define STATE_WAITING_MAX 512        /* transactions one key waits on at once, for the plan */
#define STATE_ARRIVALS 64            /* the latest first holds of a key: its arrival rate */

/* Counters and gauges for the metrics page (clients_blocked counts the
 * client table: bounded by client_slots). This function can't fail. */
void state_metrics(struct state *st, struct state_metrics *out);

/* state_metrics() as seen at `now` (what counts "in the last minute"):
 * for tests on a fake clock. Can't fail. */
void state_metrics_at(struct state *st, struct state_metrics *out, int64_t now);

/* What the state knows of `key` at `now`, for the metrics page: the reads
 * started with it within the budget's span (the last 60 s, as
 * read_budget_per_minute counts them: every process sharing this state,
 * rejected reads included, and with Redis the other hosts' it heard of)
 * and whether its reads are paused now (a 401 or
 * a per-key 429). A key the state does not hold: 0 and false. Never
 * creates an entry; this function can't fail. */
void state_key_usage(struct state *st, const struct state_key *key, int64_t now, int *reads, bool *paused);

/* Ids nobody has paid for (docs/operations.md). The client of a request to the
 * shop of `key`: keyed hashes (the state's salt) of (key, its address),
 * never stored in clear: one address is another client of each key, so
 * its charge and block are per key.
 * IPv4 addresses count whole; IPv6 ones by their /64 (a site chooses its
 * interface ids freely, so one prober would otherwise be 2^64 clients),
 * and also by their /56 and /48 (out->wide: a prefix spread over many
 * /64s counts there); IPv4-mapped IPv6 as the IPv4; anything else (or
 * NULL) as written. out->b is never all zero. This function can't fail. */
void state_client_id(const struct state *st, const struct state_key *key, const char *addr,
                     struct state_client *out);

/* The address alone (no key) under another key (Redis uses a fixed one,
 * and its key names carry the API key: the same address is the same client
 * on every host), read as state_client_id() reads one. This function can't
 * fail. */
void state_client_hash(const uint8_t salt[16], const char *addr, struct state_client *out);

/* Is `client` blocked at `now`? Once STATE_CLIENT_404S distinct ids asked
 * for by one client were answered 404 (state_finish with ticket->client)
 * within STATE_CLIENT_WINDOW_MS, it is blocked for STATE_CLIENT_BLOCK_MS;
 * an IPv6 /56 or /48 (client->wide) likewise at STATE_CLIENT_404S_56 or
 * _48, and a request is blocked when any of its clients is
 * (reads still in flight count toward the 5 at the claim:
 * state_claim_client)
 * (report->client_blocked when it starts; counted in the metrics). While
 * blocked, its requests for ids kembali knows nothing about
 * (state_fact_unknown) must cost no read: the caller answers checking
 * without claiming. Ids with a known status (pending included) are read
 * as for anybody. Many buyers behind one address (an office, a school)
 * come back for ids that exist at Kasera, which never answer 404, so they
 * are not charged; an address is blocked only by probing from it, and
 * even then its buyers' known ids are still read (a buyer's first return
 * for an id no process has read yet gets checking for that block, which
 * docs/operations.md accepts for an address that probes). Clients are kept in a
 * fixed table of client_slots (8 ways per set): a new client takes a free
 * way, else the least recently used idle one (no block, no 404 within the
 * window, no read in flight), else the least recently used unblocked
 * one; a blocked client is never forgotten before its block ends. A client that finds no room is
 * not counted (metrics client_full). Never blocks on anything but the
 * state's lock. */
bool state_client_blocked(struct state *st, const struct state_client *client, int64_t now);

/* Another host's count blocked `client` (its address: client->b, not
 * its wider prefixes): block it here until `until`
 * (clamped to STATE_CLIENT_BLOCK_MS from now; a block that ends later
 * keeps its end), as if its 404s had been counted here:
 * state_client_blocked() says true until then, and the metrics count a
 * block started when it was not blocked already. A client that finds no
 * room is not blocked (metrics client_full); an all-zero client or an
 * `until` not after `now` changes nothing. Can't fail. */
void state_client_block(struct state *st, const struct state_client *client, int64_t until, int64_t now);

/* Does `f` say kembali knows nothing about the transaction (no status read
 * or told: no entry, or only a remembered 404)? This function can't fail. */
bool state_fact_unknown(const struct state_fact *f);

/* SipHash-2-4 of data under a 16-byte key; exposed for tests. */
uint64_t state_siphash(const uint8_t k[16], const void *data, size_t len);

#endif
