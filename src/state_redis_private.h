/* state_redis_private.h - what the files of the Redis store share
 * (state_redis.c: the operations; state_redis_conn.c: the connections,
 * joining and the Sentinels; state_redis_lua.c: the scripts); not for
 * other modules. */
#ifndef KEMBALI_STATE_REDIS_PRIVATE_H
#define KEMBALI_STATE_REDIS_PRIVATE_H

#include <arpa/inet.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "log.h"
#include "state_redis.h"
#include "state_redis_name.h"

/* the longest versioned prefix, PREFIXvN: (state_redis_name.h), with its NUL */
#define STATE_REDIS_VPREFIX_MAX (CONFIG_REDIS_PREFIX_MAX + STATE_REDIS_SCHEMA_MAX + 1)
/* the longest key: VPREFIX{32 hex}t:ID or VPREFIX{32 hex}x:32 hex */
#define STATE_REDIS_KEY_MAX (STATE_REDIS_VPREFIX_MAX + 2 + 32 + 2 + (STATE_ID_MAX > 32 ? STATE_ID_MAX : 32))

enum { SCRIPT_CLAIM, SCRIPT_FINISH, SCRIPT_TELL, SCRIPT_HELD, SCRIPT_LEFT, SCRIPT_SEED, SCRIPT_N };

/* The kinds of key kept for one API key (state_redis_lua.c names them
 * and says which script takes which). */
enum rkey_kind {
    RK_TX, RK_HOLDERS, RK_KEY, RK_BUDGET, RK_NOT_FOUND, RK_WAITING, RK_WAITERS, RK_ARRIVALS, RK_RESERVED, RK_GRACE,
    RK_N
};

/* the most keys a script takes: its own, then a client's tiers' */
#define STATE_REDIS_SCRIPT_KEYS_MAX (10 + 3 * STATE_CLIENT_TIERS)

struct rconn {
    struct state_redis *r;    /* NULL once it is not r's any more */
    redisAsyncContext *ac;
    struct loop *loop;
    struct loop_io io;
    bool sub;
    bool sentinel;            /* to a Sentinel (r->sconn) */
    bool freeing;             /* we asked hiredis to free it */
    bool dead;                /* hiredis freed it while we were in its handler */
    int busy;
};

enum op_kind {
    OP_CLAIM, OP_TELL, OP_HELD, OP_FIRE, OP_PING, OP_JOIN_SCRIPT, OP_JOIN_OTHER, OP_JOIN_ROLE, OP_SUBSCRIBE, OP_S_AUTH, OP_S_ASK,
    OP_N
};

struct state_redis_op {
    struct state_redis *r;
    enum op_kind kind;
    int script;               /* OP_JOIN_SCRIPT */
    state_redis_claim_fn *fn; /* OP_CLAIM; NULL once cancelled */
    state_redis_told_fn *told_fn; /* OP_TELL; NULL once cancelled */
    state_redis_held_fn *held_fn; /* OP_HELD */
    void *data;
    bool charge;              /* OP_FIRE of a finish that charged a client: a reply of 1 started its block */
    char shop[STATE_SHOP_MAX + 1], id[STATE_ID_MAX + 1]; /* ... of this read (charge) */
    uint64_t wb_seq;          /* OP_FIRE of a write-back: the entry its answer lets go (0: none) */
    int64_t sent;             /* when it went out (queued: until then, when it was sent) */
    bool queued;              /* on r's list of waiting operations */
    bool out;                 /* queued, and its bytes handed to the socket (sent restamped) */
    struct state_redis_op *prev, *next;
};

struct writeback {
    char *secret;             /* a copy, wiped when freed */
    char id[STATE_ID_MAX + 1];
    char word[STATUS_WORD_MAX + 1];
    int64_t at;               /* when it was read or told (its cache time counts from there) */
    uint64_t seq;             /* this version of it (its tell, once sent, answers for it) */
};

enum phase { PH_DOWN, PH_JOINING, PH_UP };

struct state_redis {
    struct loop *loop;
    struct config_redis cfg;  /* password: our own copy */
    state_redis_msg_fn *on_msg;
    state_redis_blocked_fn *on_blocked;
    state_redis_seed_fn *on_seed;
    void *ctx;
    enum phase phase;
    bool ever_up, unreachable_logged, stopping;
    struct rconn *main, *sub;
    int join_left;            /* join steps still to come */
    char why[160];            /* the last failure, for the log */
    uint8_t salt[16];         /* STATE_REDIS_NAME_LABEL: what the client names derive from */
    char sha[SCRIPT_N][41];
    char *text[SCRIPT_N];     /* each script after the rules' prelude (script_text) */
    char vprefix[STATE_REDIS_VPREFIX_MAX]; /* cfg.prefix and the schema: every key's and the channel's */
    char channel[STATE_REDIS_VPREFIX_MAX + 8];
    struct state_redis_op *head, *tail; /* waiting operations, oldest first */
    struct loop_timer slow_timer, retry_timer, teardown_timer, join_timer, ping_timer;
    struct writeback wb[STATE_REDIS_WRITEBACK_MAX];
    size_t nwb;
    uint64_t wb_seq;          /* the last writeback.seq given */
    struct state_redis_metrics m;
    /* a host name is resolved at start (the loop is not running yet), then
     * again at every attempt to join, by a thread of its own (struct
     * lookup): hiredis itself would resolve it in the loop, blocking it */
    char ip[INET6_ADDRSTRLEN];
    int port;                 /* the port to connect to: cfg.port, or the master's the Sentinel named */
    bool ip_ok, literal;
    struct lookup *lookup;    /* a background lookup under way, or NULL */
    /* With Sentinels (cfg.sentinel): the master is asked of them at every
     * join, and every STATE_REDIS_SENTINEL_CHECK_MS while up (a failover
     * moves the master without closing our connections at once) */
    char sip[CONFIG_REDIS_SENTINELS_MAX][INET6_ADDRSTRLEN]; /* each Sentinel's address */
    bool sip_ok[CONFIG_REDIS_SENTINELS_MAX];
    bool sfail_logged[CONFIG_REDIS_SENTINELS_MAX]; /* its failure is logged (until it answers) */
    int order[CONFIG_REDIS_SENTINELS_MAX]; /* who is asked first: the last to answer */
    int sasking;              /* the position in order asked now; -1: no question under way */
    bool sfor_join;           /* the answer is for a join (else a check while up) */
    bool sanswered;           /* the one asked answered (sfound_*) */
    char sfail[200];          /* why the one asked failed ("" : no answer in time) */
    char sfound_ip[STATE_REDIS_ADDR_MAX];
    int sfound_port;
    int snamed;               /* which Sentinel (cfg index) named the master joined or joining; -1 */
    int snamed_next;          /* which one answered the question that just ended */
    char swhy[520];           /* the last Sentinel failure of the question under way */
    struct rconn *sconn;      /* the connection to the one asked */
    struct loop_timer sentinel_timer, scheck_timer;
    char master_ip[INET6_ADDRSTRLEN]; /* the master last joined ("" : none yet) */
    int master_port;
    char not_master[INET6_ADDRSTRLEN + 8]; /* the last address logged as not a master, until a join */
};

/* A host name looked up by a thread of its own: the loop polls `done`. The
 * thread frees the job when the loop has left it (`abandoned`). */
struct lookup {
    int n;                    /* 1, or one per Sentinel */
    char host[CONFIG_REDIS_SENTINELS_MAX][256];
    char ip[CONFIG_REDIS_SENTINELS_MAX][INET6_ADDRSTRLEN];
    bool ok[CONFIG_REDIS_SENTINELS_MAX];
    atomic_int state;         /* LOOKUP_RUNNING, LOOKUP_DONE, LOOKUP_ABANDONED */
};
enum { LOOKUP_RUNNING, LOOKUP_DONE, LOOKUP_ABANDONED };

static inline bool reply_is(const redisReply *x, int type)
{
    return x != NULL && x->type == type;
}

static inline int64_t reply_int(const redisReply *x)
{
    if (x == NULL)
        return 0;
    if (x->type == REDIS_REPLY_INTEGER)
        return x->integer;
    if (x->type == REDIS_REPLY_STRING)
        return strtoll(x->str, NULL, 10);
    return 0;
}

/* ---- state_redis_lua.c ---- */

/* Script `script` (SCRIPT_*) as it is loaded: the rules' numbers and
 * replace table (rules_lua_prelude: no number is typed in the Lua), for
 * every script but `seed` the pace's and the budget plan's functions
 * translated from the C (plan_lua), then its keys' locals and its body. Returns NULL
 * when out of memory; the caller frees it. */
char *state_redis_script_text(int script);

/* The names of the keys script `script` takes (KEYS, in its order) for API
 * key k and transaction id (used only by the kinds of a transaction; may
 * be NULL for a script that has none), then, for the claim and the finish
 * when client is not NULL, each of its tiers' block, 404s and reads in
 * flight; VPREFIX from state_redis_prefix(). Written into names (room for
 * STATE_REDIS_SCRIPT_KEYS_MAX); returns how many. Can't fail. */
int state_redis_script_keys(int script, const char *vprefix, const struct state_redis_id *k, const char *id,
                            const struct state_redis_client *client, char names[][STATE_REDIS_KEY_MAX]);

/* The script's name ("claim", ...), NULL for no such script. */
const char *state_redis_script_name(int script);

/* ---- state_redis_conn.c ---- */

/* A new operation of r (calloc'd), or NULL when out of memory. */
struct state_redis_op *state_redis_op_new(struct state_redis *r, enum op_kind kind);

/* Send argv on rc for op (queued for the slow timer unless a join step).
 * false when hiredis refused it (op is freed then). */
bool state_redis_op_send(struct rconn *rc, struct state_redis_op *op, int argc, const char **argv,
                         const size_t *lens);

/* Take op off r's list of waiting operations (if it is on it). */
void state_redis_op_unqueue(struct state_redis_op *op);

/* Arm (or stop) the timer that says the oldest waiting operation is slow. */
void state_redis_arm_slow(struct state_redis *r);

/* Hand rc's pending bytes to its socket now (non-blocking: what does not
 * fit waits for the socket), starting the 100 ms of the waiting operations
 * among them. Not from inside hiredis' own handlers. */
void state_redis_rc_write(struct rconn *rc);

/* Mark r down for `why` (logged once), tear its connections down from a
 * timer and retry later. */
void state_redis_went_down(struct state_redis *r, const char *why);

/* Start joining: resolve, connect, authenticate, load, subscribe. */
void state_redis_join(struct state_redis *r);

/* One step of a join answered well; the last one makes r up. */
void state_redis_join_step_done(struct state_redis *r);

/* Close r's two connections (their operations answer DOWN). */
void state_redis_teardown(struct state_redis *r);

/* A connection to ip:port (NULL: cfg's Unix socket) for r, to Redis (sub:
 * its subscriber) or a Sentinel; hiredis gets an address, never a name.
 * NULL with the reason in r->why. */
struct rconn *state_redis_rc_open_at(struct state_redis *r, const char *ip, int port, bool sub, bool sentinel);

/* Free rc's connection (never from inside a hiredis callback). */
void state_redis_rc_close(struct rconn *rc);

/* Connect to the Redis at r->ip / r->port (or the Unix socket) and join. */
void state_redis_join_connect(struct state_redis *r);

/* The Redis used or tried, into a log line (redis=, port=, and with
 * Sentinels the master's name and the Sentinel that named it). */
void state_redis_log_where(struct state_redis *r, struct log_line *l);

/* ---- state_redis_sentinel.c ---- */

/* Ask the Sentinels which master they name (for_join: then join it); a
 * question under way serves, its answer ends it. */
void state_redis_sentinel_ask(struct state_redis *r, bool for_join);

/* From a callback: the Sentinel asked failed (why), or answered (why NULL). */
void state_redis_sentinel_failed(struct state_redis *r, const char *why);

/* Set up r's timers of the Sentinels (the question's, the ROLE check's). */
void state_redis_sentinel_timers_init(struct state_redis *r);

/* Close the connection to the Sentinel asked, if any. */
void state_redis_sentinel_close(struct state_redis *r);

/* A reply (or NULL: its connection dropped) of a Sentinel question. */
void state_redis_sentinel_reply(struct state_redis *r, enum op_kind kind, const redisReply *x, const char *errstr);

/* From a callback: the address a Sentinel named is not a master. */
void state_redis_not_a_master(struct state_redis *r, const redisReply *x);

/* The first address of `host` as text into ip (INET6_ADDRSTRLEN); blocks. */
bool state_redis_resolve_now(const char *host, char *ip);

/* Set up r's timers of the connections, the join and the Sentinels. */
void state_redis_timers_init(struct state_redis *r);

/* ---- state_redis.c ---- */

/* Write back what was told while down (from joined); each entry stays
 * queued until its tell is answered, for the next join otherwise. */
void state_redis_writeback_flush(struct state_redis *r);

/* Every reply, and every operation dropped with its connection (reply NULL). */
void state_redis_on_reply(redisAsyncContext *ac, void *reply, void *privdata);

#endif
