/* state_redis.h - the state shared by every host, on Redis.
 *
 * With `redis` configured, Redis is the authority on what may be read, for
 * every process on every host: each transaction's pace and read in flight,
 * the cache of final statuses, remembered 404s, Retry-After windows, key
 * pauses, each key's budget over any 60 s and the 404s charged to clients.
 * Each host keeps its own state (state.h) as well: its processes coalesce
 * there first, and it holds what this host learnt (a final status answers
 * with no round trip), so a read is claimed twice, first in the local state
 * (state_claim), then here (state_redis_claim); a claim Redis refuses is
 * given back (state_unclaim) and what Redis said is mirrored locally
 * (state_defer, state_tell, state_learn_not_found, state_client_block).
 *
 * Claims, outcomes and told statuses are Lua scripts (EVALSHA; loaded on
 * every connect, so a restarted or failed-over Redis gets them again), run
 * on Redis's clock (TIME): times cross hosts only as spans ("in 1500 ms").
 * Every outcome is published; every process subscribes (one connection)
 * and hears of every read's end within milliseconds (state_redis_msg_fn).
 *
 * Keys: PREFIX{K}t:ID (a transaction), PREFIX{K}o:ID (the hosts holding a
 * request for it, each with its deadline), PREFIX{K}w (the key's waiting
 * transactions), PREFIX{K}r (their reservations), PREFIX{K}a (its
 * arrivals), PREFIX{K}k (the key's pause),
 * PREFIX{K}b (the key's budget), PREFIX{K}n (its reads that ended 404 and
 * its reads of ids never answered still under way: the 404 quarter),
 * PREFIX{K}c:C, PREFIX{K}f:C and PREFIX{K}x:C
 * (a client's 404s, its reads in flight and its block, per key; an IPv6
 * address is a client at its /64, /56 and /48: three Cs), where K is
 * HMAC-SHA256 keyed by the shop's secret over a fixed label
 * (state_redis_name.h: a function of the secret alone, so every host
 * derives the same names for good and Redis holds nothing they depend on)
 * and C a hash of the client's address, so that no secret and no address
 * is stored. Every key of one API key shares a hash tag: the claim reads
 * the waiting transactions' hashes, which it finds in PREFIX{K}w rather
 * than in its KEYS, all in K's slot. Every key has a TTL. The channel is
 * PREFIXwake.
 *
 * Redis on a bad day: a connection that fails or closes, an error, or a
 * reply slower than STATE_REDIS_SLOW_MS (from when the question went out
 * on the socket) puts this process "down" (while up
 * and with nothing else waiting, a PING every STATE_REDIS_PING_MS keeps
 * that true of an idle process too, whose held requests may wait on another
 * host's read): every
 * operation waiting is answered STATE_REDIS_DOWN at once (its caller decides
 * locally), and until Redis answers again (tried every second) claims
 * return NULL and reads are decided by the local state with
 * state_redis_budget()'s share of each budget. Final statuses read or told
 * meanwhile are written back when it answers again.
 *
 * With Sentinels (redis-sentinel://), every join first asks them, in
 * turn and without blocking, which server is the master, and checks that
 * its ROLE says so (a replica named is not used); while up, the Sentinels
 * are asked again every STATE_REDIS_SENTINEL_CHECK_MS, and a master that
 * changed makes this process leave and join the new one at once. The
 * metrics name the master joined (state_redis_metrics: master).
 *
 * Everything runs on the loop's thread; no call blocks. Callbacks are never
 * called from inside the call that registers them. */
#ifndef KEMBALI_STATE_REDIS_H
#define KEMBALI_STATE_REDIS_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "budget.h"
#include "config.h"
#include "loop.h"
#include "pace.h"
#include "state.h"
#include "state_redis_msg.h"

#define STATE_REDIS_SLOW_MS 100      /* a reply later than this: Redis is down for us */
#define STATE_REDIS_JOIN_MS 1000     /* connect, authenticate, load the scripts, subscribe */
#define STATE_REDIS_RETRY_MS 1000    /* between attempts while down */
_Static_assert(BUDGET_GRACE_MS >= STATE_REDIS_RETRY_MS + STATE_REDIS_JOIN_MS &&
                   BUDGET_GRACE_SENTINEL_MS >= 5000, /* the failover's promise (docs/redis.md, Redis Sentinel) */
               "a count made whole waits for every host that lost Redis to join again (budget.h)");
#define STATE_REDIS_PING_MS 500      /* while up and idle: a PING this often */
#define STATE_REDIS_WRITEBACK_MAX 1024
#define STATE_REDIS_WRITEBACK_PER_KEY (STATE_REDIS_WRITEBACK_MAX / 4) /* one key's share: no tenant fills it */
#define STATE_REDIS_SENTINEL_MS 300  /* one Sentinel: connect, authenticate and answer within this */
#define STATE_REDIS_SENTINEL_CHECK_MS 1000 /* while up: the Sentinels are asked this often for the master */

struct state_redis;
struct state_redis_op;


/* Called for every message published by any process (this one included). */
typedef void state_redis_msg_fn(void *ctx, const struct state_redis_msg *m);

/* Called when the 404 of a read this process finished (state_redis_finish,
 * o->shop_id) started its client's block in Redis, by every host's count:
 * once per block, in this process only. */
typedef void state_redis_blocked_fn(void *ctx, const char *shop_id, const char *id);

/* Called when this process's count of reads should reach Redis
 * (budget.h): at every join, before anything is asked (rkey NULL: every
 * key this host read with in the span), and when a key's count was found
 * gone (rkey: that key). The callee answers with state_redis_seed(). */
typedef void state_redis_seed_fn(void *ctx, const struct state_redis_id *rkey);

/* A client (an address) as Redis knows it: as state_client_id() reads
 * one, a client at each of its tiers: tier[0] the address (IPv4 whole,
 * IPv6 by its /64), then for IPv6 its /56 and /48; n of them (1 or 3). */
struct state_redis_client {
    struct state_redis_id tier[STATE_CLIENT_TIERS];
    int n;
};

/* Redis's answer to a claim. */
enum state_redis_verdict {
    STATE_REDIS_GO,        /* the read is ours: make it, then state_redis_finish() with serial */
    STATE_REDIS_FINAL,     /* word is final, cached for ms more: no read */
    STATE_REDIS_NOT_FOUND, /* a 404 is remembered for ms more */
    STATE_REDIS_BUSY,      /* another read is in flight, its lease ends in ms */
    STATE_REDIS_WAIT,      /* no read for ms (why: WAIT_PACE, WAIT_RETRY, WAIT_KEY_PAUSE, WAIT_BUDGET) */
    STATE_REDIS_BLOCKED,   /* the client is blocked for ms and nothing is known of the id */
    STATE_REDIS_DOWN,      /* no answer: decide locally */
};

struct state_redis_claim {
    enum state_redis_verdict v;
    int64_t ms;
    enum state_wait why;
    char word[STATUS_WORD_MAX + 1];
    uint64_t serial;
};

typedef void state_redis_claim_fn(void *data, const struct state_redis_claim *c);

/* Redis's answer to a hold (state_redis_held). */
struct state_redis_held {
    bool down;                 /* no answer: this host's own reservation stands */
    bool reserved;             /* the transaction holds a reservation, */
    int64_t resv_ms;           /* from this many ms from now (0: due) */
};

typedef void state_redis_held_fn(void *data, const struct state_redis_held *h);

/* A read's outcome, as this host's state recorded it (state_finish). */
struct state_redis_outcome {
    const struct pace_schedule *sched; /* the schedule the read was made under */
    const char *shop_id;      /* the shop it was made for (the log line of a block it starts) */
    uint64_t serial;          /* the claim's; 0: a read Redis did not grant (made while down) */
    int64_t sent_ms;          /* from the claim to the request going out: the pace counts from there */
    const char *word;         /* the status read, or NULL */
    bool final;
    int64_t ttl_ms;           /* final: its cache */
    bool not_found;           /* a 404 remembered for ttl_ms */
    bool charge;              /* a 404 for an id nobody knew: charge `client` */
    bool has_client;          /* the read was claimed for `client`: no longer in flight for it */
    struct state_redis_client client;
    int64_t retry_ms;         /* > 0: no read of this transaction for that long (Retry-After, a
                               * stated window, a rejected episode) */
    int64_t key_pause_ms;     /* > 0: no read with this key for that long (429, 401, a stated window) */
};

struct state_redis_metrics {
    long up;                  /* 1 while joined, else 0 */
    long joins, leaves;       /* times this process joined Redis, and left it */
    long round_trips;         /* commands sent (the idle PINGs not counted: pings) */
    long pings;               /* idle PINGs sent */
    long claims, granted;     /* claims asked, and granted */
    long messages;            /* messages heard */
    long written_back;        /* final statuses written back after a stay down (with time left) */
    long seeded;              /* reads of this host's sent to make a key's count whole (budget.h) */
    long sentinel;            /* 1: the master is asked of Sentinels (the fields below), else 0 */
    long master_changes;      /* with Sentinels: joins of another master than the last */
    long sentinel_asks;       /* with Sentinels: questions put to one Sentinel */
    long sentinel_failures;   /* ... that it did not answer (down, too slow, refused, no such master) */
    char master[INET6_ADDRSTRLEN + 8]; /* with Sentinels: the master last joined, "IP:PORT" ("" : none yet) */
};

/* Start on loop l with the settings in cfg (copied, password included); the
 * first connect begins at once. on_msg(ctx, m) is called for every message,
 * on_blocked(ctx, ...) (may be NULL) for every block a finish started,
 * on_seed(ctx, ...) (may be NULL) when this host's reads should be sent.
 * NULL with a reason in err only when out of memory: an unreachable Redis
 * is not an error (this process is down until it answers). */
struct state_redis *state_redis_new(struct loop *l, const struct config_redis *cfg, state_redis_msg_fn *on_msg,
                                    state_redis_blocked_fn *on_blocked, state_redis_seed_fn *on_seed, void *ctx,
                                    char *err, size_t errlen);

/* Close the connections and free everything. Operations still waiting are
 * answered STATE_REDIS_DOWN first. r may be NULL. */
void state_redis_free(struct state_redis *r);

/* Is this process using Redis now (joined, not down)? */
bool state_redis_up(const struct state_redis *r);

/* Is this process's first join still under way (neither joined nor failed
 * yet)? A CGI process waits for it before its one request (at most
 * STATE_REDIS_JOIN_MS, the join's own limit), so that its claim is
 * decided with every host's. false when r is NULL. */
bool state_redis_joining(const struct state_redis *r);

/* The reads per minute this process may count on for a key whose budget is
 * `budget`: all of it while up (Redis counts it once for every host), else
 * its share, budget / redis_hosts (at least 1). r may be NULL (budget). */
int state_redis_budget(const struct state_redis *r, int budget);

/* The identity in Redis of a shop's secret, or of a client address (as
 * state_client_id() reads one, each of its tiers): the same on every host,
 * whether or not Redis has been reached yet. false only when r is NULL (no
 * Redis). */
bool state_redis_key_id(const struct state_redis *r, const char *secret, struct state_redis_id *out);
bool state_redis_client_id(const struct state_redis *r, const char *addr, struct state_redis_client *out);

/* The budget's plan (plan.h) in Redis, every host's: a transaction waits
 * while a host holds a request for it (state_redis_held, until
 * state_redis_left), and Redis decides its reservation and, at each claim,
 * the plan's verdict over every host's reads, waiting transactions and
 * arrivals. */
struct state_redis_plan {
    bool plans;                /* plan the budget; false: first come, first served (read_planning off) */
    int schedule_reads;        /* the reads of one whole schedule within a hold (pace_reads_within) */
};

/* A request for (secret's key, id) is held on `host` (this host's name in
 * Redis, the same in each of its processes) until deadline_ms from now,
 * under `budget`: recorded in Redis as state_hold() records
 * it here (a new holding period counts as an arrival and may reserve the
 * transaction's last-chance read). `stamp` is state_hold()'s: Redis keeps
 * the host's newest (see state_redis_left). fn(data, answer) is called
 * exactly once, later, with the transaction's reservation as Redis decided
 * it (down: no answer). Returns NULL when not up (or out of memory): fn is
 * never called. */
struct state_redis_op *state_redis_held(struct state_redis *r, const char *secret, const char *id, int budget,
                                        int64_t deadline_ms, uint64_t stamp,
                                        const struct state_redis_id *host, const struct state_redis_plan *plan,
                                        state_redis_held_fn *fn, void *data);

/* This host no longer holds a request for (secret's key, id)
 * (state_unhold() let its last one go, giving `stamp`). Each process has
 * its own connection: a hold another process of the host made after that
 * (a newer stamp) may reach Redis first, and then it stays held. Not up:
 * nothing (Redis's TTLs end the hold at its deadline). Can't fail. */
void state_redis_left(struct state_redis *r, const char *secret, const char *id, const struct state_redis_id *host,
                      uint64_t stamp);

/* The read a claim asks for, as the key's count in Redis names it. */
struct state_redis_count {
    char member[BUDGET_MEMBER_MAX]; /* budget_member(): this host, the time its state recorded */
    bool lost;                      /* budget_count_lost(): a count found gone was lost */
};

/* Ask Redis for the read of (secret's key, id) that this process claimed in
 * its own state: under schedule s, `budget` reads per minute, a lease of
 * lease_ms; `client` (may be NULL) is who asked (a request one of whose
 * tiers is blocked gets STATE_REDIS_BLOCKED for an id nobody knows; one
 * with a tier whose 404s and reads in flight, every host's, make its
 * allowance, STATE_CLIENT_404S_AT, gets STATE_REDIS_WAIT, WAIT_CLIENT,
 * until its first lease ends, for at most STATE_CLIENT_RECHECK_MS; a read
 * granted for an unknown id is in flight at each tier until
 * state_redis_finish() or its lease ends); the 404 quarter (state.h, every
 * host's: rules_not_found_cap of the key's reads in any 60 s ended 404 or
 * are of ids never answered and under way) refuses an id never answered
 * STATE_REDIS_WAIT, WAIT_BUDGET, until it frees up, but for its held
 * request's last-chance read; `plan` as above (a
 * read the plan refuses gets STATE_REDIS_WAIT, WAIT_BUDGET, until what may
 * change it, plan_retry: at most RULES_PLAN_RECHECK_MS); `count` names the
 * read in the key's count (budget.h: while the count is being made whole,
 * STATE_REDIS_WAIT, WAIT_BUDGET, until it is). fn(data,
 * verdict) is called exactly once, later, unless state_redis_cancel(). Returns NULL when not up
 * (or out of memory): decide locally, fn is never called. */
struct state_redis_op *state_redis_claim(struct state_redis *r, const char *secret, const char *id,
                                         const struct pace_schedule *s, int budget, int64_t lease_ms,
                                         const struct state_redis_client *client, const struct state_redis_plan *plan,
                                         const struct state_redis_count *count, state_redis_claim_fn *fn, void *data);

/* fn of a pending claim (or told status) will not be called. Can't fail. */
void state_redis_cancel(struct state_redis_op *op);

/* This host's reads with the key named rkey (Redis's name), recorded at
 * at[0..n) by its state (state_key_reads), sent to make the key's count
 * whole: those of the span ending at `now`, each named by budget_member()
 * with host, so that none is counted twice. Not up: nothing (the next
 * join asks again, on_seed). Can't fail. */
void state_redis_seed(struct state_redis *r, const struct state_redis_id *rkey, const struct state_redis_id *host,
                      const int64_t *at, int n, int64_t now);

/* Record a read's outcome (after state_finish() here) and publish it. A
 * read made while down is not sent; its final status is kept (at most
 * STATE_REDIS_WRITEBACK_MAX, of which at most STATE_REDIS_WRITEBACK_PER_KEY
 * with one key, the latest word of an id replacing its earlier one) and
 * written back when Redis answers again, cached there only for what is
 * left of its time (rules_ttl_left), not at all once that has run out.
 * Never fails: what cannot be sent is dropped (Redis's lease and TTLs
 * forget a claim whose outcome never came). */
void state_redis_finish(struct state_redis *r, const char *secret, const char *id,
                        const struct state_redis_outcome *o);

/* Record a status the shop was told (state_tell() here) and publish it, as
 * state_tell() rules: a final status never moves backwards (`sched`, the
 * shop's schedule, tells the others when a read may next start; NULL: the
 * shortest). While down,
 * a final status is kept for the write-back (as state_redis_finish's).
 * Never fails. */
void state_redis_tell(struct state_redis *r, const char *secret, const char *id, const char *word, bool final,
                      const struct pace_schedule *sched);

/* Redis's answer to a told status (state_redis_tell_ask). */
struct state_redis_told {
    bool down;                         /* no answer: decide locally */
    bool kept;                         /* a final status known in Redis stays (word); Redis changed nothing */
    char word[STATUS_WORD_MAX + 1];
};

typedef void state_redis_told_fn(void *data, const struct state_redis_told *t);

/* Record a status the shop was told, as state_redis_tell() does, and ask
 * what Redis did: fn(data, answer) is called exactly once, later, unless
 * state_redis_cancel(): kept (with the final status known in Redis) when
 * this one may not replace it (state_tell()'s order; nothing changed), else
 * recorded and published; down when no answer came. Returns NULL when not
 * up (or out of memory): decide locally, fn is never called. */
struct state_redis_op *state_redis_tell_ask(struct state_redis *r, const char *secret, const char *id,
                                            const char *word, bool final, const struct pace_schedule *sched,
                                            state_redis_told_fn *fn, void *data);

/* Counters for the metrics page. Can't fail. */
void state_redis_metrics(const struct state_redis *r, struct state_redis_metrics *out);

/* The one blocking call, for `kembali --notify` (no loop): connect within
 * timeout_ms, record the told status as state_redis_tell() does, publish.
 * 0, or -1 with a reason in err (unreachable, refused). */
int state_redis_tell_once(const struct config_redis *cfg, const char *secret, const char *id, const char *word,
                          bool final, int timeout_ms, char *err, size_t errlen);

#endif
