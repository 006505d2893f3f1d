/* coord.h - the two stores kept as one: this host's state (state.h) and,
 * across hosts, Redis (state_redis.h).
 *
 * The moves between them are here, so that the resolver holds requests
 * and the front answers them, and neither decides what goes where (two
 * remain outside: the POST notify's question to Redis, serve.c's
 * state_redis_tell_ask(), whose answer is mirrored here, and --notify's
 * blocking tell in notify.c):
 *
 *   coord_hold()     a request held here is held in Redis too: Redis
 *                    decides the transaction's reservation, every host's
 *                    (coord_held() mirrors it here)
 *   coord_unhold()   this host's last request for it let go: in Redis too
 *   coord_ask()      a read claimed here is asked of Redis too
 *   coord_seed()     this host's reads sent to make Redis's count whole
 *   coord_claimed()  Redis's answer: read, or give our claim back and
 *                    mirror what Redis says (a final status, a 404, a read
 *                    in flight elsewhere, a wait, a blocked client)
 *   coord_finish()   a read's end: recorded here, and the very effect this
 *                    state applied (rules.h) sent to Redis
 *   coord_abandon()  a claim never read (stopping): given back here
 *   coord_mirror()   another host's published news, mirrored here
 *   coord_told_here() a status the shop told, recorded here: sent to Redis
 *   coord_mirror_final() Redis's final status mirrored here
 *   coord_keys_*()   which of this host's keys a published name is, so that
 *                    news of an id nobody holds a request for still
 *                    reaches what this host knows of it
 *
 * With no Redis (NULL) or Redis down, each is this host's state alone.
 * No call blocks; none reads a clock (the caller passes `now`). */
#ifndef KEMBALI_COORD_H
#define KEMBALI_COORD_H

#include <stdbool.h>
#include <stdint.h>

#include "classify.h"
#include "config.h"
#include "state.h"
#include "state_redis.h"

/* One read as both stores know it. */
struct coord_read {
    struct state_ticket ticket;     /* this host's claim */
    uint64_t redis_serial;          /* Redis's claim (0: a read Redis did not grant) */
    struct state_redis_client rclient; /* who asked, as Redis knows clients */
    bool has_rclient;
    const struct shop *shop;        /* the shop the read is made for (its secret, budget) */
    const struct pace_schedule *sched;
};

/* Hold a request for (shop's key, id) until `deadline` here (state_hold,
 * with `budget`) and, with Redis up, there too as held on `host` (this
 * host's name in Redis): fn(data, answer) then comes once with Redis's
 * reservation for coord_held(), and *asked is true (false: fn is never
 * called). Returns state_hold()'s answer: whether the request is held
 * (then coord_unhold() when it no longer waits). */
bool coord_hold(struct state *st, struct state_redis *redis, const struct shop *shop, const char *id,
                const struct pace_schedule *sched, int budget, int64_t deadline, const struct state_redis_id *host,
                int64_t now, state_redis_held_fn *fn, void *data, bool *asked);

/* Redis answered a hold of (key, id) with h: its reservation is this
 * host's too (down: this host's own stands). Can't fail. */
void coord_held(struct state *st, const struct state_key *key, const char *id, const struct state_redis_held *h,
                int64_t now);

/* A request held with coord_hold() no longer waits: state_unhold() here,
 * and when it was this host's last for the transaction, Redis hears that
 * this host left. Can't fail. */
void coord_unhold(struct state *st, struct state_redis *redis, const struct shop *shop, const char *id,
                  const struct state_redis_id *host, int64_t now);

/* Before a claim here: while Redis is up, its plan decides for every host
 * (state_plan_elsewhere), not this host's partial view. Can't fail. */
void coord_plan(struct state *st, const struct state_redis *redis);

/* Ask Redis for the read cr->ticket claimed here (Redis decides the budget's
 * plan over every host's reads, holds and arrivals). Returns the operation
 * (fn is called once with Redis's answer), or NULL when Redis is not used
 * or down: read on this host's claim alone. */
struct state_redis_op *coord_ask(struct state *st, struct state_redis *redis, const struct coord_read *cr,
                                 const struct state_redis_id *host, state_redis_claim_fn *fn, void *data);

/* What coord_claimed() asks of the caller. */
enum coord_next {
    COORD_READ,     /* Redis granted it (cr->redis_serial is set): make the read */
    COORD_AGAIN,    /* given back and mirrored: decide again */
    COORD_BLOCKED,  /* given back: cr's client is blocked (another host counted it): answer
                     * its requests now, then decide again for the others */
};

/* Redis answered the claim of cr (c->v; down: decide on this host's state
 * alone). Unless granted, our claim is given back (state_unclaim) and
 * what Redis says is mirrored here. `heard_since`: this process heard a
 * read of the transaction end (a message) after the claim went out; a
 * "busy" answer is then older than what it heard (the answer and the
 * message come on two connections) and is not mirrored: decide again.
 * Can't fail. */
enum coord_next coord_claimed(struct state *st, struct coord_read *cr, const struct state_redis_claim *c,
                              bool heard_since, int64_t now);

struct coord_keys;

/* The read of cr ended with `oc` at `now` (`sent`: when its request went
 * out, 0: never): state_finish() here, then the same effect to Redis
 * (report->effect), and its key is learnt (ks, coord_keys_learn). With
 * Redis up, a client's block is Redis's to start (report->client_blocked
 * is then false: its word comes as on_blocked). Can't fail. */
void coord_finish(struct state *st, struct state_redis *redis, struct coord_keys *ks, struct coord_read *cr,
                  const struct outcome *oc, int64_t sent, int64_t now, struct state_report *report);

/* The claim of cr was never asked of Redis's answer or never read
 * (stopping, or freed while Redis was deciding): give it back here. */
void coord_abandon(struct state *st, const struct coord_read *cr, int64_t now);

/* Another host published `m` about (key, id) (the key as this state knows
 * it): mirror it here (a final status, a pending status and the next
 * read's time, a next read's time, a 404). A client's block is not
 * mirrored (Redis refuses that client's claims itself). Can't fail. */
void coord_mirror(struct state *st, const struct state_key *key, const char *id, const struct state_redis_msg *m,
                  int64_t now);

/* Redis's final status `word` for (key, id) stays (a told status it may
 * not replace): mirror it here, where what this host was told before may
 * still stand. Can't fail. */
void coord_mirror_final(struct state *st, const struct state_key *key, const char *id, const char *word,
                        int64_t now);

/* The shop told this host a status for (shop, id) and it was recorded
 * here (Redis did not answer or is not used): send Redis what this state
 * now holds for it (while Redis is down, a final status waits for the
 * write-back), and learn its key (ks). Can't fail. */
void coord_told_here(struct state *st, struct state_redis *redis, struct coord_keys *ks, const struct shop *shop,
                     const char *id, const struct pace_schedule *sched, int64_t now);


/* Every shop key of one configuration by its name in Redis, so that a
 * message naming any of them finds it (coord_heard), however many shops. */
struct coord_names {
    struct config *cfg;        /* the configuration they are of (a reference), or NULL */
    int n;
    struct coord_name {
        struct state_redis_id rkey;
        struct state_key key;
    } *e;                      /* sorted by rkey */
};

/* Make names those of cfg's shops, unless they are already. Out of memory:
 * names is left empty (found: nothing). Can't fail otherwise. */
void coord_names_for(struct coord_names *names, struct state_redis *redis, struct config *cfg);

/* The state's key named rkey in Redis, or NULL. Can't fail. */
const struct state_key *coord_names_find(const struct coord_names *names, const struct state_redis_id *rkey);

/* Let names go (the configuration's reference too). Can't fail. */
void coord_names_free(struct coord_names *names);

/* Redis asks for this host's reads (budget.h; state_redis_seed_fn): of the
 * key named `only`, or of every key of names (only NULL), as this host's
 * state recorded them in the span ending at `now`, sent as read by
 * `host`. Redis not up: nothing. Can't fail. */
void coord_seed(struct state *st, struct state_redis *redis, const struct coord_names *names,
                const struct state_redis_id *host, const struct state_redis_id *only, int64_t now);

/* Another host's read was granted (m: STATE_REDIS_MSG_READ): unless it is
 * this host's (`host`), it spends the key's budget here too
 * (state_heard), so that this host counts it if Redis goes away. Can't
 * fail. */
void coord_heard(struct state *st, const struct coord_names *names, const struct state_redis_id *host,
                 const struct state_redis_msg *m, int64_t now);

/* The keys this host used with Redis lately: Redis's name of each
 * (state_redis_key_id) and this state's (state_key_id), at most COORD_KEYS,
 * the least recently used forgotten first. A name is derived from its
 * secret for good, so an entry is never wrong, only perhaps unused. */
#define COORD_KEYS 256
struct coord_keys {
    struct {
        struct state_redis_id rkey;
        struct state_key key;
        int64_t used;          /* 0: a free entry */
    } e[COORD_KEYS];
};

/* Remember shop's key (a read or a told status of it is recorded here). No
 * Redis: nothing. Can't fail. */
void coord_keys_learn(struct coord_keys *ks, struct state_redis *redis, const struct shop *shop, int64_t now);

/* This state's key whose name in Redis is `rkey`, or NULL when it is not
 * one this host used lately. Can't fail. */
const struct state_key *coord_keys_find(const struct coord_keys *ks, const struct state_redis_id *rkey);

/* Another host published a final status (m) of an id no request here
 * waits for: when this host's state knows the id under one of its keys
 * (ks), mirror it, so that what it answers from its cache (an expired a
 * late payment replaced) is what Redis holds. Can't fail. */
void coord_mirror_unwatched(struct state *st, const struct coord_keys *ks, const struct state_redis_msg *m,
                            int64_t now);

#endif
