/* state_redis.c - see state_redis.h.
 *
 * Two hiredis asynchronous connections per process, driven by the loop
 * (hiredis calls our hooks to watch its socket): `main` for the scripts and
 * `sub` subscribed to the wake channel. A process is DOWN, JOINING (both
 * connecting, authenticating, the scripts loaded, subscribed) or UP.
 *
 * Rules that keep the teardown simple: a connection is never freed from
 * inside one of hiredis' callbacks (a failure seen there only marks the
 * process down and arms `teardown`, a timer at once); every operation gets
 * its callback exactly once from hiredis, with a reply or with NULL when its
 * connection is freed, and an operation that dies with its connection
 * answers STATE_REDIS_DOWN from there. Waiting operations are kept oldest
 * first (Redis answers in order): the oldest one's age is the one timer
 * that says "slower than 100 ms". */
#include "state_redis.h"
#include "state_redis_msg.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/time.h>
#include <netdb.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "log.h"
#include "rules.h"
#include "state_redis_check.h"
#include "util.h"

/* What every key name is derived from besides the secret (key_hash): fixed
 * for good, so that every host derives the same names from the same secret,
 * whatever is in Redis, and never anything else. Changing it splits the key
 * space between hosts that run different versions. */
static const uint8_t key_name_label[16] = "kembali-names-v1";
/* the longest key: PREFIX{32 hex}t:ID or PREFIX{32 hex}x:32 hex */
#define STATE_REDIS_KEY_MAX (CONFIG_REDIS_PREFIX_MAX + 2 + 32 + 2 + (STATE_ID_MAX > 32 ? STATE_ID_MAX : 32) + 1)

/* ---- the scripts (Redis's Lua 5.1), run on Redis's clock ---- */

/* Shared head: now (ms, Redis's TIME) and the transaction's fields. */
#define LUA_HEAD                                                                           \
    "local t = redis.call('TIME')\n"                                                       \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"              \
    "local h = redis.call('HMGET', KEYS[1], 's', 'fu', 'nf', 'n', 'ls', 'lu', 'ra', 'ser', 'le')\n" \
    "local s = h[1]\n"                                                                     \
    "local fu, nf = tonumber(h[2]) or 0, tonumber(h[3]) or 0\n"                            \
    "local n, ls, lu = tonumber(h[4]) or 0, tonumber(h[5]) or 0, tonumber(h[6]) or 0\n"    \
    "local ra, ser, le = tonumber(h[7]) or 0, tonumber(h[8]) or 0, tonumber(h[9]) or 0\n"   \
    "local function wait_for(waits, reads)\n"                                              \
    "  local ws = {}\n"                                                                    \
    "  for w in string.gmatch(waits, '%d+') do ws[#ws + 1] = tonumber(w) end\n"            \
    "  local w = ws[math.min(reads, #ws - 1) + 1] or MIN_WAIT\n"                           \
    "  if w < MIN_WAIT then w = MIN_WAIT end\n"                                            \
    "  return w\n"                                                                         \
    "end\n"

/* A final status may replace what is known (state_tell's order)? */
#define LUA_FORWARD                                                                          \
    "local function forward(old, new)\n"                                                     \
    "  if not old or not R[old] then return true end\n"                                      \
    "  return R[old][new] == true\n"                                                         \
    "end\n"

/* Publish what is known now, and keep the transaction for as long as any
 * of its times matters. ARGV names: waits, channel, rkey, id. */
#define LUA_PUBLISH                                                                        \
    "local function publish(waits, channel, rkey, id, kp)\n"                               \
    "  local msg\n"                                                                        \
    "  if s and fu > now then msg = 'F ' .. rkey .. ' ' .. id .. ' ' .. (fu - now) .. ' ' .. s\n" \
    "  elseif nf > now then msg = 'N ' .. rkey .. ' ' .. id .. ' ' .. (nf - now)\n"         \
    "  else\n"                                                                             \
    "    local nx = now\n"                                                                 \
    "    if n > 0 and now - ls <= EPISODE then nx = math.max(nx, ls + wait_for(waits, n)) end\n" \
    "    if le > 0 then nx = math.max(nx, le + FLOOR) end\n"                                \
    "    nx = math.max(nx, ra, kp)\n"                                                      \
    "    if s then msg = 'P ' .. rkey .. ' ' .. id .. ' ' .. (nx - now) .. ' ' .. s\n"      \
    "    else msg = 'W ' .. rkey .. ' ' .. id .. ' ' .. (nx - now) end\n"                   \
    "  end\n"                                                                              \
    "  redis.call('PUBLISH', channel, msg)\n"                                              \
    "  redis.call('PEXPIREAT', KEYS[1], math.max(now + KEEP, fu, nf, ra, lu, ls + KEEP) + MARGIN)\n" \
    "end\n"

/* KEYS: tx, key, budget, block, reservations, client's 404s, client's
 * reads in flight. ARGV: 1 waits, 2 budget, 3 lease_ms, 4 has_client, 5 id,
 * 6 this host's reservations, 7 host, 8 "last" for a last-chance read
 * (plan.h), 9 the client's 404s that block (with its reads in flight), 10
 * their window (ms), 11 the recheck (ms) of a client at its count, 12 a
 * hold's length (ms, rules_hold_ms). */
static const char lua_claim[] =
    LUA_HEAD
    "if s and fu > now then return {'final', fu - now, s} end\n"
    "if nf > now then return {'nf', nf - now} end\n"
    "if lu > now then return {'busy', lu - now} end\n"
    /* an id nobody knows, for a client: blocked, or its 404s and reads in
     * flight are already the count (each host hears of another's read's
     * end only for its own ids: ask again soon) */
    "local fly = ARGV[4] == '1' and not s\n"
    "if fly and redis.call('EXISTS', KEYS[4]) == 1 then\n"
    "  return {'blocked', math.max(redis.call('PTTL', KEYS[4]), 1)}\n"
    "end\n"
    "if fly then\n"
    "  redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now)\n"
    "  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', now - tonumber(ARGV[10]))\n"
    "  if redis.call('ZCARD', KEYS[6]) + redis.call('ZCARD', KEYS[7]) >= tonumber(ARGV[9]) then\n"
    "    local o = redis.call('ZRANGE', KEYS[7], 0, 0, 'WITHSCORES')\n"
    "    local w = tonumber(ARGV[11])\n"
    "    if o[2] then w = math.max(math.min(w, tonumber(o[2]) - now), 1) end\n"
    "    return {'wait', w, 'client'}\n"
    "  end\n"
    "end\n"
    "local kp = tonumber(redis.call('HGET', KEYS[2], 'p')) or 0\n"
    "if kp > now then return {'wait', kp - now, 'key'} end\n"
    "if ra > now then return {'wait', ra - now, 'retry'} end\n"
    "if n > 0 and now - ls <= EPISODE then\n"
    "  local nx = ls + wait_for(ARGV[1], n)\n"
    "  if nx > now then return {'wait', nx - now, 'pace'} end\n"
    "else\n"
    "  n = 0\n"
    "end\n"
    /* the floor at Kasera: after the previous read's answer */
    "if le > 0 and le + FLOOR > now then return {'wait', le + FLOOR - now, 'pace'} end\n"
    "redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - BUDGET_SPAN)\n"
    "local used = redis.call('ZCARD', KEYS[3])\n"
    "if used >= tonumber(ARGV[2]) then\n"
    "  local o = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')\n"
    "  return {'wait', math.max(tonumber(o[2]) + BUDGET_SPAN - now, 1), 'budget'}\n"
    "end\n"
    /* every host's reserved last-chance reads, as each said at its last
     * claim (for a hold's length, ARGV[12]): an early read must leave room */
    "redis.call('HSET', KEYS[5], ARGV[7], ARGV[6] .. ':' .. (now + tonumber(ARGV[12])))\n"
    "redis.call('PEXPIREAT', KEYS[5], now + math.max(KEEP, tonumber(ARGV[12])))\n"
    "local resv, all = 0, redis.call('HGETALL', KEYS[5])\n"
    "for i = 1, #all, 2 do\n"
    "  local c, e = string.match(all[i + 1], '^(%d+):(%d+)$')\n"
    "  if c and tonumber(e) > now then resv = resv + tonumber(c)\n"
    "  else redis.call('HDEL', KEYS[5], all[i]) end\n"
    "end\n"
    "if ARGV[8] ~= 'last' and used + resv >= tonumber(ARGV[2]) then\n"
    "  return {'wait', PLAN_RECHECK, 'plan'}\n"
    "end\n"
    "ser = ser + 1\n"
    "lu = now + tonumber(ARGV[3])\n"
    "redis.call('HSET', KEYS[1], 'n', n + 1, 'ls', now, 'lu', lu, 'ser', ser)\n"
    "redis.call('PEXPIREAT', KEYS[1], math.max(now + KEEP, fu, nf, ra, lu) + MARGIN)\n"
    "redis.call('ZADD', KEYS[3], now, ARGV[5] .. ':' .. ser .. ':' .. now)\n"
    "redis.call('PEXPIREAT', KEYS[3], now + BUDGET_SPAN + MARGIN)\n"
    "if fly then\n" /* in flight for the client until its lease ends */
    "  redis.call('ZADD', KEYS[7], lu, ARGV[5])\n"
    "  local px = redis.call('PTTL', KEYS[7])\n"
    "  if px < 0 or now + px < lu + MARGIN then redis.call('PEXPIREAT', KEYS[7], lu + MARGIN) end\n"
    "end\n"
    "return {'go', ser}\n";

/* KEYS: tx, key, client's 404s, client's block, client's reads in flight.
 * ARGV: 1 serial, 2 sent_ms, 3 word, 4 final, 5 ttl, 6 not_found, 7 nf ttl,
 *       8 charge, 9 retry_ms, 10 key_pause_ms, 11 waits, 12 id, 13 channel,
 *       14 rkey, 15 client ('-': none), 16 the 404s that block, 17 their
 *       window (ms), 18 the block (ms). */
static const char lua_finish[] =
    LUA_HEAD LUA_FORWARD LUA_PUBLISH
    "local known, current = s, false\n"
    /* the floor at Kasera counts from any read's end */
    "le = now\n"
    "redis.call('HSET', KEYS[1], 'le', le)\n"
    "if ARGV[1] ~= '0' and tonumber(ARGV[1]) == ser and lu > 0 then\n"
    "  current = lu > now\n" /* ended within its lease */
    "  if current then ls = ls + tonumber(ARGV[2]) end\n"
    "  lu = 0\n"
    "  redis.call('HDEL', KEYS[1], 'lu')\n"
    "  redis.call('HSET', KEYS[1], 'ls', ls)\n"
    "end\n"
    /* a stale read's pending or 404 only where nothing is known */
    "local open = current or (not s and nf <= now)\n"
    "local fin = s and fu > now\n"
    "local word = ARGV[3]\n"
    "if word ~= '' and ARGV[4] == '1' then\n"
    "  if forward(s, word) or (current and not fin) then\n"
    "    s, fu, nf = word, now + tonumber(ARGV[5]), 0\n"
    "    redis.call('HSET', KEYS[1], 's', s, 'fu', fu)\n"
    "    redis.call('HDEL', KEYS[1], 'nf')\n"
    "  end\n"
    "elseif word ~= '' then\n"
    "  if not fin and open then\n"
    "    s, fu, nf = word, 0, 0\n"
    "    redis.call('HSET', KEYS[1], 's', s, 'fu', 0)\n"
    "    redis.call('HDEL', KEYS[1], 'nf')\n"
    "  end\n"
    "elseif ARGV[6] == '1' then\n"
    "  if not fin and open then\n"
    "    nf = now + tonumber(ARGV[7])\n"
    "    redis.call('HSET', KEYS[1], 'nf', nf)\n"
    "  end\n"
    "end\n"
    "local kp = tonumber(redis.call('HGET', KEYS[2], 'p')) or 0\n"
    "local rw, kw = tonumber(ARGV[9]), tonumber(ARGV[10])\n"
    "if kw > 0 and now + kw > kp then\n"
    "  kp = now + kw\n"
    "  redis.call('HSET', KEYS[2], 'p', kp)\n"
    "  redis.call('PEXPIREAT', KEYS[2], kp + MARGIN)\n"
    "end\n"
    "if rw > 0 and now + rw > ra then\n"
    "  ra = now + rw\n"
    "  redis.call('HSET', KEYS[1], 'ra', ra)\n"
    "end\n"
    "local blocked = 0\n"
    "if ARGV[15] ~= '-' then redis.call('ZREM', KEYS[5], ARGV[12]) end\n" /* no longer in flight */
    "if ARGV[8] == '1' and not known then\n"
    "  local win, blk = tonumber(ARGV[17]), tonumber(ARGV[18])\n"
    "  redis.call('ZADD', KEYS[3], now, ARGV[12])\n"
    "  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now - win)\n"
    "  redis.call('PEXPIREAT', KEYS[3], now + win)\n"
    "  if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[16]) and redis.call('EXISTS', KEYS[4]) == 0 then\n"
    "    redis.call('SET', KEYS[4], '1', 'PX', blk)\n"
    "    blocked = 1\n"
    "    redis.call('PUBLISH', ARGV[13], 'B ' .. ARGV[14] .. ' ' .. ARGV[15] .. ' ' .. blk)\n"
    "  end\n"
    "end\n"
    "publish(ARGV[11], ARGV[13], ARGV[14], ARGV[12], kp)\n"
    "return blocked\n";

/* KEYS: tx. ARGV: 1 word, 2 final, 3 ttl, 4 waits, 5 id, 6 channel, 7 rkey.
 * Returns '' when recorded, else the final status known that stays. */
static const char lua_tell[] =
    LUA_HEAD LUA_FORWARD LUA_PUBLISH
    "local kept = ''\n"
    "if ARGV[2] == '1' then\n"
    "  if forward(s, ARGV[1]) then\n"
    "    s, fu, nf = ARGV[1], now + tonumber(ARGV[3]), 0\n"
    "    redis.call('HSET', KEYS[1], 's', s, 'fu', fu)\n"
    "    redis.call('HDEL', KEYS[1], 'nf')\n"
    "  else kept = s end\n"
    /* pending replaces nothing final, cached or not: only nothing, pending or an unknown word */
    "elseif not (s and R[s]) then\n"
    "  s, nf = ARGV[1], 0\n"
    "  redis.call('HSET', KEYS[1], 's', s)\n"
    "  redis.call('HDEL', KEYS[1], 'nf')\n"
    "else kept = s end\n"
    "publish(ARGV[4], ARGV[6], ARGV[7], ARGV[5], 0)\n"
    "return kept\n";

enum { SCRIPT_CLAIM, SCRIPT_FINISH, SCRIPT_TELL, SCRIPT_N };
static const char *const scripts[SCRIPT_N] = {lua_claim, lua_finish, lua_tell};

/* A script as it is loaded: the rules' numbers and replace table
 * (rules_lua_prelude: no number is typed in the Lua) then its body.
 * Returns NULL when out of memory. */
static char *script_text(const char *body)
{
    char prelude[2048];
    int n = rules_lua_prelude(prelude, sizeof prelude);
    if (n < 0)
        return NULL;
    size_t len = (size_t)n + strlen(body) + 1;
    char *t = malloc(len);
    if (t != NULL)
        snprintf(t, len, "%s%s", prelude, body);
    return t;
}

/* ---- types ---- */

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
    OP_CLAIM, OP_TELL, OP_FIRE, OP_PING, OP_JOIN_SCRIPT, OP_JOIN_OTHER, OP_JOIN_ROLE, OP_SUBSCRIBE, OP_S_AUTH, OP_S_ASK
};

struct state_redis_op {
    struct state_redis *r;
    enum op_kind kind;
    int script;               /* OP_JOIN_SCRIPT */
    state_redis_claim_fn *fn; /* OP_CLAIM; NULL once cancelled */
    state_redis_told_fn *told_fn; /* OP_TELL; NULL once cancelled */
    void *data;
    bool charge;              /* OP_FIRE of a finish that charged a client: a reply of 1 started its block */
    char shop[STATE_SHOP_MAX + 1], id[STATE_ID_MAX + 1]; /* ... of this read (charge) */
    int64_t sent;
    bool queued;              /* on r's list of waiting operations */
    struct state_redis_op *prev, *next;
};

struct writeback {
    char *secret;             /* a copy, wiped when freed */
    char id[STATE_ID_MAX + 1];
    char word[STATUS_WORD_MAX + 1];
};

enum phase { PH_DOWN, PH_JOINING, PH_UP };

struct state_redis {
    struct loop *loop;
    struct config_redis cfg;  /* password: our own copy */
    state_redis_msg_fn *on_msg;
    state_redis_blocked_fn *on_blocked;
    void *ctx;
    enum phase phase;
    bool ever_up, unreachable_logged, stopping;
    struct rconn *main, *sub;
    int join_left;            /* join steps still to come */
    char why[160];            /* the last failure, for the log */
    uint8_t salt[16];         /* key_name_label: what key_hash() takes */
    char sha[SCRIPT_N][41];
    char *text[SCRIPT_N];     /* each script after the rules' prelude (script_text) */
    char channel[80];
    struct state_redis_op *head, *tail; /* waiting operations, oldest first */
    struct loop_timer slow_timer, retry_timer, teardown_timer, join_timer, ping_timer;
    struct writeback wb[STATE_REDIS_WRITEBACK_MAX];
    size_t nwb;
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

static void went_down(struct state_redis *r, const char *why);
static void join(struct state_redis *r);
static void sentinel_failed(struct state_redis *r, const char *why);

/* ---- hiredis' hooks on our loop ---- */

static void rc_set(struct rconn *rc, uint32_t add, uint32_t del)
{
    uint32_t ev = (rc->io.events | add) & ~del;
    if (ev != rc->io.events && loop_io_set(rc->loop, &rc->io, ev) != 0 && rc->r != NULL)
        went_down(rc->r, "epoll failed");
}

static void ev_add_read(void *p) { rc_set(p, EPOLLIN, 0); }
static void ev_del_read(void *p) { rc_set(p, 0, EPOLLIN); }
static void ev_add_write(void *p) { rc_set(p, EPOLLOUT, 0); }
static void ev_del_write(void *p) { rc_set(p, 0, EPOLLOUT); }

/* hiredis frees the context: this is the last we hear of it. */
static void ev_cleanup(void *p)
{
    struct rconn *rc = p;
    loop_io_set(rc->loop, &rc->io, 0);
    rc->ac->data = NULL;
    struct state_redis *r = rc->r;
    if (r != NULL && rc->sentinel) {
        if (r->sconn == rc)
            r->sconn = NULL;
        if (!rc->freeing)
            sentinel_failed(r, rc->ac->errstr[0] ? rc->ac->errstr : "connection closed");
    } else if (r != NULL) {
        if (r->main == rc)
            r->main = NULL;
        if (r->sub == rc)
            r->sub = NULL;
        if (!rc->freeing)
            went_down(r, rc->ac->errstr[0] ? rc->ac->errstr : "connection closed");
    }
    if (rc->busy > 0)
        rc->dead = true;
    else
        free(rc);
}

static void on_rc_io(struct loop *l, struct loop_io *io, uint32_t events)
{
    struct rconn *rc = io->data;
    (void)l;
    rc->busy++;
    if (events & EPOLLOUT)
        redisAsyncHandleWrite(rc->ac);
    if (!rc->dead && (events & (EPOLLIN | EPOLLERR | EPOLLHUP)))
        redisAsyncHandleRead(rc->ac);
    if (--rc->busy == 0 && rc->dead)
        free(rc);
}

/* A connection to ip:port (NULL: cfg's Unix socket) for r; hiredis gets
 * an address, never a name (it would resolve it on the loop). NULL with
 * the reason in r->why. */
static struct rconn *rc_open_at(struct state_redis *r, const char *ip, int port, bool sub, bool sentinel)
{
    struct rconn *rc = calloc(1, sizeof *rc);
    if (rc == NULL) {
        util_copy(r->why, sizeof r->why, "out of memory");
        return NULL;
    }
    redisAsyncContext *ac = ip == NULL ? redisAsyncConnectUnix(r->cfg.path) : redisAsyncConnect(ip, port);
    if (ac == NULL || ac->err) {
        snprintf(r->why, sizeof r->why, "cannot connect: %s", ac ? ac->errstr : "out of memory");
        if (ac)
            redisAsyncFree(ac);
        free(rc);
        return NULL;
    }
    rc->r = r;
    rc->ac = ac;
    rc->loop = r->loop;
    rc->sub = sub;
    rc->sentinel = sentinel;
    ac->data = rc;
    loop_io_init(&rc->io, ac->c.fd, on_rc_io, rc);
    ac->ev.data = rc;
    ac->ev.addRead = ev_add_read;
    ac->ev.delRead = ev_del_read;
    ac->ev.addWrite = ev_add_write;
    ac->ev.delWrite = ev_del_write;
    ac->ev.cleanup = ev_cleanup;
    return rc;
}

static struct rconn *rc_open(struct state_redis *r, bool sub)
{
    return rc_open_at(r, r->cfg.unix_socket ? NULL : r->ip, r->port, sub, false);
}

/* Free rc's connection (never from inside a hiredis callback: see top). */
static void rc_close(struct rconn *rc)
{
    if (rc == NULL || rc->freeing)
        return;
    rc->freeing = true;
    redisAsyncFree(rc->ac); /* its operations are answered with NULL, then ev_cleanup */
}

/* ---- operations ---- */

static void arm_slow(struct state_redis *r)
{
    if (r->head == NULL)
        loop_timer_stop(r->loop, &r->slow_timer);
    else
        loop_timer_at(r->loop, &r->slow_timer, r->head->sent + STATE_REDIS_SLOW_MS);
}

static void op_unqueue(struct state_redis_op *op)
{
    struct state_redis *r = op->r;
    if (!op->queued)
        return;
    op->queued = false;
    bool was_head = r->head == op;
    if (op->prev)
        op->prev->next = op->next;
    else
        r->head = op->next;
    if (op->next)
        op->next->prev = op->prev;
    else
        r->tail = op->prev;
    op->prev = op->next = NULL;
    if (was_head)
        arm_slow(r);
}

static void on_reply(redisAsyncContext *ac, void *reply, void *privdata);

/* Send argv on rc for op (queued for the slow timer unless a join step).
 * false when hiredis refused it (op is freed then). */
static bool op_send(struct rconn *rc, struct state_redis_op *op, int argc, const char **argv, const size_t *lens)
{
    struct state_redis *r = op->r;
    op->sent = util_mono_ms();
    if (rc == NULL || rc->freeing ||
        redisAsyncCommandArgv(rc->ac, on_reply, op, argc, argv, lens) != REDIS_OK) {
        free(op);
        return false;
    }
    if (op->kind == OP_PING)
        r->m.pings++;
    else
        r->m.round_trips++;
    if (op->kind == OP_CLAIM || op->kind == OP_TELL || op->kind == OP_FIRE || op->kind == OP_PING) {
        op->queued = true;
        op->prev = r->tail;
        if (r->tail)
            r->tail->next = op;
        else
            r->head = op;
        r->tail = op;
        if (r->head == op)
            arm_slow(r);
    }
    /* a read's end goes out now, before the answer it allows: a request
     * that answer leads to (a notify on another host) then finds it in
     * Redis, as it would find it in the mapped file (not from inside
     * hiredis' own handlers: their write follows) */
    if (op->kind == OP_FIRE && rc->busy == 0) {
        rc->busy++;
        redisAsyncHandleWrite(rc->ac);
        if (--rc->busy == 0 && rc->dead)
            free(rc);
    }
    return true;
}

static struct state_redis_op *op_new(struct state_redis *r, enum op_kind kind)
{
    struct state_redis_op *op = calloc(1, sizeof *op);
    if (op != NULL) {
        op->r = r;
        op->kind = kind;
    }
    return op;
}

static bool send_join(struct state_redis *r, struct rconn *rc, enum op_kind kind, int script, int argc,
                      const char **argv)
{
    size_t lens[8];
    if (argc > 8)
        return false;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    struct state_redis_op *op = op_new(r, kind);
    if (op == NULL)
        return false;
    op->script = script;
    if (!op_send(rc, op, argc, argv, lens))
        return false;
    r->join_left++;
    return true;
}

/* ---- ids and keys ---- */

/* The name K of an API key in Redis: the first 16 bytes of
 * HMAC-SHA256(key = the secret, message = salt), in hex, salt being
 * key_name_label. A keyed hash, so the name tells nothing of the secret,
 * and a pure function of the secret, so every host, at any time, derives
 * the same name (no random salt kept in Redis that could expire, be deleted
 * or differ between hosts). Should libcrypto fail (out of memory), the name
 * is all zeros: keys then share one name (fewer reads, never more) rather
 * than one host using a name the others do not. */
static void key_hash(const uint8_t salt[16], const char *secret, struct state_redis_id *out)
{
    uint8_t mac[EVP_MAX_MD_SIZE] = {0};
    unsigned int n = 0;
    if (HMAC(EVP_sha256(), secret, (int)strlen(secret), salt, 16, mac, &n) == NULL || n < 16)
        memset(mac, 0, 16);
    ids_hex(mac, 16, out->hex);
}

bool state_redis_key_id(const struct state_redis *r, const char *secret, struct state_redis_id *out)
{
    if (r == NULL)
        return false;
    key_hash(r->salt, secret, out);
    return true;
}

bool state_redis_client_id(const struct state_redis *r, const char *addr, struct state_redis_id *out)
{
    if (r == NULL)
        return false;
    /* SipHash under a fixed key, so every host names a client alike: the
     * address is not stored in clear, though whoever reads Redis can test
     * a guessed one (as when the key was a salt kept in Redis itself) */
    struct state_client c;
    uint8_t s2[16];
    memcpy(s2, r->salt, 16);
    s2[5] ^= 0x3c; /* not the key ids' hash */
    state_client_hash(s2, addr, &c);
    ids_hex(c.b, 16, out->hex);
    return true;
}

/* PREFIX{K}what */
static void rkey_name(char *out, size_t cap, const char *prefix, const struct state_redis_id *k, const char *what,
                      const char *tail)
{
    snprintf(out, cap, "%s{%s}%s%s", prefix, k->hex, what, tail ? tail : "");
}

static void waits_csv(const struct pace_schedule *s, char *out, size_t cap)
{
    size_t n = 0;
    out[0] = '\0';
    for (int i = 0; i < s->n && n + 24 < cap; i++)
        n += (size_t)snprintf(out + n, cap - n, "%s%lld", i ? "," : "", (long long)s->wait_ms[i]);
}

/* ---- joining and leaving ---- */

static void teardown(struct state_redis *r)
{
    struct rconn *m = r->main, *s = r->sub;
    r->main = r->sub = NULL;
    if (m)
        m->r = NULL;
    if (s)
        s->r = NULL;
    rc_close(m); /* operations answer DOWN from on_reply */
    rc_close(s);
}

static void on_teardown_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase != PH_UP)
        teardown(r);
}

/* The Redis used or tried, into a log line: redis= and port= (with
 * Sentinels: the master's address, its name and the Sentinel that named
 * it; before any, the master's name alone). */
static void log_where(struct state_redis *r, struct log_line *l)
{
    if (r->cfg.sentinel) {
        if (r->snamed >= 0) {
            log_str(l, "redis", r->ip);
            log_int(l, "port", r->port);
        }
        log_str(l, "master", r->cfg.master);
        if (r->snamed >= 0) {
            char sn[300];
            snprintf(sn, sizeof sn, "%s:%d", r->cfg.sentinels[r->snamed].host, r->cfg.sentinels[r->snamed].port);
            log_str(l, "sentinel", sn);
        }
        return;
    }
    log_str(l, "redis", r->cfg.unix_socket ? r->cfg.path : r->cfg.host);
    if (!r->cfg.unix_socket)
        log_int(l, "port", r->cfg.port);
}

static void log_failure(struct state_redis *r, const char *event, const char *why)
{
    struct log_line l;
    log_begin(&l, "warn", event);
    log_where(r, &l);
    log_str(&l, "why", why);
    log_str(&l, "msg", "reads are decided by this host's own state with its share of each key's budget "
                       "until Redis answers again");
    log_end(&l);
}

/* Something failed: this process stops using Redis (at once), closes its
 * connections (soon, outside hiredis' callbacks) and tries again later.
 * Safe from anywhere, any number of times. */
static void went_down(struct state_redis *r, const char *why)
{
    if (r->phase == PH_UP) {
        r->m.leaves++;
        log_failure(r, "redis_left", why);
    } else if (r->phase == PH_JOINING && !r->unreachable_logged && !r->ever_up) {
        r->unreachable_logged = true;
        log_failure(r, "redis_unreachable", why);
    }
    if (r->phase != PH_DOWN) {
        r->phase = PH_DOWN;
        r->m.up = 0;
        loop_timer_stop(r->loop, &r->join_timer);
        loop_timer_stop(r->loop, &r->ping_timer);
        loop_timer_stop(r->loop, &r->scheck_timer);
        loop_timer_at(r->loop, &r->teardown_timer, loop_now(r->loop));
        if (!r->stopping)
            loop_timer_at(r->loop, &r->retry_timer, util_mono_ms() + STATE_REDIS_RETRY_MS);
    }
}

static void writeback_flush(struct state_redis *r);

static void joined(struct state_redis *r)
{
    r->phase = PH_UP;
    r->m.up = 1;
    r->m.joins++;
    loop_timer_stop(r->loop, &r->join_timer);
    r->not_master[0] = '\0';
    struct log_line l;
    if (r->cfg.sentinel && (strcmp(r->master_ip, r->ip) != 0 || r->master_port != r->port)) {
        /* a new master (or the first): the metrics say which */
        if (r->master_ip[0] != '\0') {
            char from[INET6_ADDRSTRLEN + 8];
            snprintf(from, sizeof from, "%s:%d", r->master_ip, r->master_port);
            log_begin(&l, "info", "redis_master_changed");
            log_where(r, &l);
            log_str(&l, "from", from);
            log_end(&l);
            r->m.master_changes++;
        }
        util_copy(r->master_ip, sizeof r->master_ip, r->ip);
        r->master_port = r->port;
        snprintf(r->m.master, sizeof r->m.master, "%s:%d", r->ip, r->port);
    }
    log_begin(&l, "info", r->ever_up ? "redis_rejoined" : "redis_joined");
    log_where(r, &l);
    if (r->nwb > 0)
        log_int(&l, "written_back", (long long)r->nwb);
    log_end(&l);
    if (r->cfg.sentinel)
        loop_timer_at(r->loop, &r->scheck_timer, util_mono_ms() + STATE_REDIS_SENTINEL_CHECK_MS);
    r->ever_up = true;
    r->unreachable_logged = false;
    loop_timer_at(r->loop, &r->ping_timer, util_mono_ms() + STATE_REDIS_PING_MS);
    writeback_flush(r);
}

/* While up: with nothing waiting (whose age the slow timer watches), a PING,
 * so that a Redis that stopped answering is noticed within
 * STATE_REDIS_PING_MS + STATE_REDIS_SLOW_MS by a process that asks nothing
 * of it (its held requests may wait on a read another host made). */
static void on_ping_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase != PH_UP || r->stopping)
        return;
    if (r->head == NULL) {
        const char *argv[] = {"PING"};
        const size_t lens[] = {4};
        struct state_redis_op *op = op_new(r, OP_PING);
        if (op == NULL || !op_send(r->main, op, 1, argv, lens)) {
            went_down(r, "cannot send a PING");
            return;
        }
    }
    loop_timer_at(r->loop, &r->ping_timer, util_mono_ms() + STATE_REDIS_PING_MS);
}

static void join_step_done(struct state_redis *r)
{
    if (--r->join_left == 0 && r->phase == PH_JOINING)
        joined(r);
}

static void on_join_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    went_down(r, "no answer within 1 s");
}

static void on_retry_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase == PH_DOWN && !r->stopping) {
        teardown(r); /* what is left of the last attempt */
        join(r);
    }
}

/* The first address of `host` as text into ip (INET6_ADDRSTRLEN); blocks. */
static bool resolve_now(const char *host, char *ip)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC}, *ai = NULL;
    bool ok = false;
    if (getaddrinfo(host, NULL, &hints, &ai) == 0 && ai != NULL) {
        const void *a = ai->ai_family == AF_INET6
                            ? (const void *)&((const struct sockaddr_in6 *)ai->ai_addr)->sin6_addr
                            : (const void *)&((const struct sockaddr_in *)ai->ai_addr)->sin_addr;
        ok = inet_ntop(ai->ai_family, a, ip, INET6_ADDRSTRLEN) != NULL;
    }
    if (ai != NULL)
        freeaddrinfo(ai);
    return ok;
}

static void *lookup_main(void *arg)
{
    struct lookup *j = arg;
    for (int i = 0; i < j->n; i++)
        j->ok[i] = resolve_now(j->host[i], j->ip[i]);
    int running = LOOKUP_RUNNING;
    if (!atomic_compare_exchange_strong(&j->state, &running, LOOKUP_DONE))
        free(j); /* abandoned by state_redis_free */
    return NULL;
}

/* The address to connect to: a finished background lookup replaces the one
 * in use; then a new one starts (the next attempt may find the host moved). */
static void resolve_poll(struct state_redis *r)
{
    if (r->cfg.unix_socket || r->literal)
        return;
    if (r->lookup != NULL) {
        if (atomic_load(&r->lookup->state) == LOOKUP_RUNNING)
            return;
        for (int i = 0; i < r->lookup->n; i++) {
            if (!r->lookup->ok[i])
                continue;
            if (r->cfg.sentinel) {
                memcpy(r->sip[i], r->lookup->ip[i], sizeof r->sip[i]);
                r->sip_ok[i] = true;
            } else {
                memcpy(r->ip, r->lookup->ip[i], sizeof r->ip);
                r->ip_ok = true;
            }
        }
        free(r->lookup);
        r->lookup = NULL;
    }
    struct lookup *j = calloc(1, sizeof *j);
    if (j == NULL)
        return;
    j->n = r->cfg.sentinel ? r->cfg.nsentinels : 1;
    for (int i = 0; i < j->n; i++)
        util_copy(j->host[i], sizeof j->host[i], r->cfg.sentinel ? r->cfg.sentinels[i].host : r->cfg.host);
    atomic_init(&j->state, LOOKUP_RUNNING);
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, lookup_main, j) == 0)
        r->lookup = j;
    else
        free(j);
    pthread_attr_destroy(&at);
}

static void sentinel_ask(struct state_redis *r, bool for_join);

/* Connect to the Redis at r->ip / r->port (or the Unix socket) and join. */
static void join_connect(struct state_redis *r);

static void join(struct state_redis *r)
{
    resolve_poll(r);
    if (r->cfg.sentinel) { /* the master first: join_connect when a Sentinel names it */
        r->phase = PH_JOINING;
        r->join_left = 0;
        sentinel_ask(r, true);
        return;
    }
    join_connect(r);
}

static void join_connect(struct state_redis *r)
{
    if (!r->cfg.unix_socket && !r->ip_ok) {
        char why[300];
        snprintf(why, sizeof why, "cannot resolve %s", r->cfg.host);
        r->phase = PH_JOINING;
        went_down(r, why);
        return;
    }
    r->phase = PH_JOINING;
    r->join_left = 0;
    loop_timer_at(r->loop, &r->join_timer, util_mono_ms() + STATE_REDIS_JOIN_MS);
    r->main = rc_open(r, false);
    r->sub = r->main ? rc_open(r, true) : NULL;
    if (r->main == NULL || r->sub == NULL) {
        char why[sizeof r->why];
        util_copy(why, sizeof why, r->why);
        went_down(r, why);
        return;
    }
    char db[16];
    snprintf(db, sizeof db, "%d", r->cfg.db);
    bool ok = true;
    for (int c = 0; c < 2 && ok; c++) {
        struct rconn *rc = c == 0 ? r->main : r->sub;
        if (r->cfg.password != NULL)
            ok = ok && send_join(r, rc, OP_JOIN_OTHER, 0, 2, (const char *[]){"AUTH", r->cfg.password});
        if (c == 0 && r->cfg.db != 0)
            ok = ok && send_join(r, rc, OP_JOIN_OTHER, 0, 2, (const char *[]){"SELECT", db});
    }
    if (r->cfg.sentinel) /* the address a Sentinel named must be a master */
        ok = ok && send_join(r, r->main, OP_JOIN_ROLE, 0, 1, (const char *[]){"ROLE"});
    for (int i = 0; i < SCRIPT_N && ok; i++)
        ok = send_join(r, r->main, OP_JOIN_SCRIPT, i, 3, (const char *[]){"SCRIPT", "LOAD", r->text[i]});
    ok = ok && send_join(r, r->sub, OP_SUBSCRIBE, 0, 2, (const char *[]){"SUBSCRIBE", r->channel});
    if (!ok)
        went_down(r, "cannot send to Redis");
}

/* ---- replies ---- */

static bool reply_is(const redisReply *x, int type)
{
    return x != NULL && x->type == type;
}

static int64_t reply_int(const redisReply *x)
{
    if (x == NULL)
        return 0;
    if (x->type == REDIS_REPLY_INTEGER)
        return x->integer;
    if (x->type == REDIS_REPLY_STRING)
        return strtoll(x->str, NULL, 10);
    return 0;
}

/* ---- the Sentinels (the Sentinel client rules: redis.io's "Sentinel
 * client guidelines") ----
 *
 * A question (sentinel_ask) goes to the Sentinels in `order`, one at a
 * time, each with STATE_REDIS_SENTINEL_MS to connect, authenticate and
 * answer SENTINEL get-master-addr-by-name; the first that names an address
 * ends it and goes to the front of `order`. Every step that leaves a
 * hiredis callback (an answer, a failure) arms sentinel_timer at once, and
 * its handler moves on: a connection is never freed inside a callback. */

static void sentinel_close(struct state_redis *r)
{
    struct rconn *rc = r->sconn;
    r->sconn = NULL;
    if (rc != NULL) {
        rc->r = NULL;
        rc_close(rc);
    }
}

/* From a callback: the Sentinel asked failed (why), or answered (why NULL). */
static void sentinel_failed(struct state_redis *r, const char *why)
{
    if (r->sasking < 0 || r->sanswered || r->sfail[0] != '\0')
        return; /* not asking, or its end is already known */
    util_copy(r->sfail, sizeof r->sfail, why);
    loop_timer_at(r->loop, &r->sentinel_timer, loop_now(r->loop));
}

static void sentinel_send(struct state_redis *r, enum op_kind kind, int argc, const char **argv)
{
    size_t lens[4];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    struct state_redis_op *op = op_new(r, kind);
    if (op == NULL || r->sconn == NULL ||
        redisAsyncCommandArgv(r->sconn->ac, on_reply, op, argc, argv, lens) != REDIS_OK) {
        free(op);
        sentinel_failed(r, "cannot send to the Sentinel");
    }
}

/* Ask the Sentinel at position r->sasking of order, or the next one that
 * can be tried; when none is left, the question ends unanswered. */
static void sentinel_answer(struct state_redis *r, bool ok);

/* The Sentinel asked (at r->sasking) failed, r->sfail says why: counted,
 * kept for the log line of a question no Sentinel answers, and logged
 * once until it answers again. */
static void sentinel_one_failed(struct state_redis *r)
{
    int i = r->order[r->sasking];
    r->m.sentinel_failures++;
    char where[300];
    snprintf(where, sizeof where, "%s:%d", r->cfg.sentinels[i].host, r->cfg.sentinels[i].port);
    snprintf(r->swhy, sizeof r->swhy, "%s: %s", where, r->sfail);
    if (!r->sfail_logged[i]) {
        r->sfail_logged[i] = true;
        struct log_line ll;
        log_begin(&ll, "warn", "redis_sentinel_failed");
        log_str(&ll, "sentinel", where);
        log_str(&ll, "master", r->cfg.master);
        log_str(&ll, "why", r->sfail);
        log_str(&ll, "msg", "the other Sentinels are asked");
        log_end(&ll);
    }
}

static void sentinel_try(struct state_redis *r)
{
    for (; r->sasking < r->cfg.nsentinels; r->sasking++) {
        int i = r->order[r->sasking];
        r->sfail[0] = '\0';
        r->sanswered = false;
        r->m.sentinel_asks++;
        if (!r->sip_ok[i]) {
            snprintf(r->sfail, sizeof r->sfail, "cannot resolve %.100s", r->cfg.sentinels[i].host);
            sentinel_one_failed(r);
            continue;
        }
        r->sconn = rc_open_at(r, r->sip[i], r->cfg.sentinels[i].port, false, true);
        if (r->sconn == NULL) {
            util_copy(r->sfail, sizeof r->sfail, r->why);
            sentinel_one_failed(r);
            continue;
        }
        if (r->cfg.sentinel_password != NULL)
            sentinel_send(r, OP_S_AUTH, 2, (const char *[]){"AUTH", r->cfg.sentinel_password});
        sentinel_send(r, OP_S_ASK, 3, (const char *[]){"SENTINEL", "get-master-addr-by-name", r->cfg.master});
        if (r->sfail[0] == '\0')
            loop_timer_at(r->loop, &r->sentinel_timer, util_mono_ms() + STATE_REDIS_SENTINEL_MS);
        return;
    }
    sentinel_answer(r, false);
}

static void sentinel_ask(struct state_redis *r, bool for_join)
{
    if (r->sasking >= 0) { /* a question under way: its answer serves */
        r->sfor_join = r->sfor_join || for_join;
        return;
    }
    r->sfor_join = for_join;
    r->sasking = 0;
    r->swhy[0] = '\0';
    sentinel_try(r);
}

/* A Sentinel's reply (on its connection, inside hiredis; NULL: the
 * connection failed, errstr says why). */
static void sentinel_reply(struct state_redis *r, enum op_kind kind, const redisReply *x, const char *errstr)
{
    if (x == NULL) {
        sentinel_failed(r, errstr[0] ? errstr : "connection lost");
        return;
    }
    if (x->type == REDIS_REPLY_ERROR) {
        if (strncmp(x->str, "WRONGPASS", 9) == 0 || (kind == OP_S_AUTH && strncmp(x->str, "ERR", 3) == 0))
            sentinel_failed(r, "the password is refused (redis_sentinel_password_file)");
        else if (strncmp(x->str, "NOAUTH", 6) == 0)
            sentinel_failed(r, "the Sentinel asks for a password (redis_sentinel_password_file)");
        else
            sentinel_failed(r, x->str);
        return;
    }
    if (kind == OP_S_AUTH)
        return;
    const char *bad;
    if (x->type == REDIS_REPLY_NIL) {
        char why[160];
        snprintf(why, sizeof why, "the Sentinel does not know the master \"%s\"", r->cfg.master);
        sentinel_failed(r, why);
    } else if (!reply_is(x, REDIS_REPLY_ARRAY) || x->elements != 2 || !reply_is(x->element[0], REDIS_REPLY_STRING) ||
               !reply_is(x->element[1], REDIS_REPLY_STRING)) {
        sentinel_failed(r, "the Sentinel's answer is not an address and a port");
    } else if ((bad = state_redis_master_addr(x->element[0]->str, x->element[0]->len, x->element[1]->str,
                                              x->element[1]->len, r->sfound_ip, &r->sfound_port)) != NULL) {
        sentinel_failed(r, bad);
    } else {
        r->sanswered = true;
        loop_timer_at(r->loop, &r->sentinel_timer, loop_now(r->loop));
    }
}

/* The Sentinel asked answered, failed, or took too long: on to the next,
 * or the end of the question. */
static void on_sentinel_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->sasking < 0)
        return;
    sentinel_close(r);
    int i = r->order[r->sasking];
    if (r->sanswered) {
        r->sfail_logged[i] = false;
        state_redis_order_move(r->order, r->cfg.nsentinels, r->sasking, true);
        r->snamed_next = i;
        sentinel_answer(r, true);
        return;
    }
    if (r->sfail[0] == '\0')
        snprintf(r->sfail, sizeof r->sfail, "no answer within %d ms", STATE_REDIS_SENTINEL_MS);
    sentinel_one_failed(r);
    r->sasking++;
    sentinel_try(r);
}

/* The end of a question: ok, a Sentinel (r->snamed_next) named
 * r->sfound_ip:sfound_port. */
static void sentinel_answer(struct state_redis *r, bool ok)
{
    bool for_join = r->sfor_join;
    r->sasking = -1;
    r->sfor_join = false;
    if (for_join && r->phase == PH_JOINING) {
        if (!ok) {
            char why[600];
            snprintf(why, sizeof why, "no Sentinel named the master (the last: %s)", r->swhy);
            went_down(r, why);
            return;
        }
        util_copy(r->ip, sizeof r->ip, r->sfound_ip);
        r->port = r->sfound_port;
        r->ip_ok = true;
        r->snamed = r->snamed_next;
        join_connect(r);
        return;
    }
    if (r->phase != PH_UP)
        return;
    loop_timer_at(r->loop, &r->scheck_timer, util_mono_ms() + STATE_REDIS_SENTINEL_CHECK_MS);
    if (ok && (strcmp(r->sfound_ip, r->ip) != 0 || r->sfound_port != r->port)) {
        char why[300];
        snprintf(why, sizeof why, "the Sentinels name another master: %s:%d", r->sfound_ip, r->sfound_port);
        went_down(r, why);
        loop_timer_at(r->loop, &r->retry_timer, util_mono_ms()); /* join the new one now */
    }
}

/* While up: is the master still the one the Sentinels name? */
static void on_scheck_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    (void)l;
    if (r->phase == PH_UP && !r->stopping)
        sentinel_ask(r, false);
}

/* From a callback: the address a Sentinel named answered ROLE with
 * something else than master (a replica): not used; the Sentinel goes to
 * the back of the order (the next question asks another first). */
static void not_a_master(struct state_redis *r, const redisReply *x)
{
    char role[40] = "?", addr[sizeof r->not_master];
    if (reply_is(x, REDIS_REPLY_ARRAY) && x->elements >= 1 && reply_is(x->element[0], REDIS_REPLY_STRING))
        snprintf(role, sizeof role, "%.30s", x->element[0]->str);
    snprintf(addr, sizeof addr, "%s:%d", r->ip, r->port);
    if (strcmp(addr, r->not_master) != 0) { /* once per address, not every second */
        util_copy(r->not_master, sizeof r->not_master, addr);
        struct log_line l;
        log_begin(&l, "warn", "redis_not_master");
        log_where(r, &l);
        log_str(&l, "role", role);
        log_str(&l, "msg", "the address the Sentinel named is not a master: not used; the Sentinels are asked again");
        log_end(&l);
    }
    int k = 0;
    while (k < r->cfg.nsentinels && r->order[k] != r->snamed)
        k++;
    state_redis_order_move(r->order, r->cfg.nsentinels, k, false);
    char why[80];
    snprintf(why, sizeof why, "ROLE says %s, not master", role);
    went_down(r, why);
}

static void claim_verdict(const redisReply *x, struct state_redis_claim *c)
{
    memset(c, 0, sizeof *c);
    c->v = STATE_REDIS_DOWN;
    if (!reply_is(x, REDIS_REPLY_ARRAY) || x->elements < 2 || !reply_is(x->element[0], REDIS_REPLY_STRING))
        return;
    const char *v = x->element[0]->str;
    int64_t n = reply_int(x->element[1]);
    if (n < 0)
        n = 0;
    c->ms = n;
    if (strcmp(v, "go") == 0) {
        c->v = STATE_REDIS_GO;
        c->serial = (uint64_t)n;
        c->ms = 0;
    } else if (strcmp(v, "final") == 0 && x->elements >= 3 && reply_is(x->element[2], REDIS_REPLY_STRING) &&
               ids_valid_word(x->element[2]->str, x->element[2]->len)) {
        c->v = STATE_REDIS_FINAL;
        util_copy(c->word, sizeof c->word, x->element[2]->str);
    } else if (strcmp(v, "nf") == 0) {
        c->v = STATE_REDIS_NOT_FOUND;
    } else if (strcmp(v, "busy") == 0) {
        c->v = STATE_REDIS_BUSY;
    } else if (strcmp(v, "blocked") == 0) {
        c->v = STATE_REDIS_BLOCKED;
    } else if (strcmp(v, "wait") == 0 && x->elements >= 3 && reply_is(x->element[2], REDIS_REPLY_STRING)) {
        const char *why = x->element[2]->str;
        c->v = STATE_REDIS_WAIT;
        c->why = strcmp(why, "key") == 0 ? WAIT_KEY_PAUSE : strcmp(why, "retry") == 0 ? WAIT_RETRY
                 : strcmp(why, "budget") == 0 || strcmp(why, "plan") == 0           ? WAIT_BUDGET
                 : strcmp(why, "client") == 0                                       ? WAIT_CLIENT
                                                                                     : WAIT_PACE;
    }
}

static void on_sub_reply(struct state_redis *r, const redisReply *x)
{
    if (!reply_is(x, REDIS_REPLY_ARRAY) || x->elements < 3 || !reply_is(x->element[0], REDIS_REPLY_STRING))
        return;
    const char *type = x->element[0]->str;
    if (strcmp(type, "subscribe") == 0) {
        if (r->phase == PH_JOINING)
            join_step_done(r);
        return;
    }
    if (strcmp(type, "message") != 0 || !reply_is(x->element[2], REDIS_REPLY_STRING))
        return;
    struct state_redis_msg m;
    if (r->phase == PH_UP && state_redis_msg_parse(x->element[2]->str, x->element[2]->len, &m)) {
        r->m.messages++;
        r->on_msg(r->ctx, &m);
    }
}

static void sentinel_reply(struct state_redis *r, enum op_kind kind, const redisReply *x, const char *errstr);
static void not_a_master(struct state_redis *r, const redisReply *x);

/* Every reply, and every operation dropped with its connection (reply NULL). */
static void on_reply(redisAsyncContext *ac, void *reply, void *privdata)
{
    struct state_redis_op *op = privdata;
    struct rconn *rc = ac->data;
    struct state_redis *r = rc != NULL ? rc->r : NULL; /* NULL: not r's connection any more */
    const redisReply *x = reply;
    if (op->kind == OP_S_AUTH || op->kind == OP_S_ASK) {
        if (r != NULL && r->sconn == rc)
            sentinel_reply(r, op->kind, x, ac->errstr);
        free(op);
        return;
    }
    if (op->kind == OP_SUBSCRIBE) {
        if (r != NULL && x != NULL) {
            on_sub_reply(r, x);
            return; /* the subscription's callback stays for every message */
        }
        if (r != NULL)
            went_down(r, ac->errstr[0] ? ac->errstr : "subscription lost");
        free(op);
        return;
    }
    op_unqueue(op);
    bool failed = x == NULL || x->type == REDIS_REPLY_ERROR;
    if (r != NULL && failed) {
        char why[160];
        snprintf(why, sizeof why, "%s", x != NULL ? x->str : ac->errstr[0] ? ac->errstr : "connection lost");
        if (op->kind == OP_JOIN_OTHER && x != NULL && strncmp(x->str, "WRONGPASS", 9) == 0)
            snprintf(why, sizeof why, "the password is refused (redis_password_file)");
        went_down(r, why);
    }
    switch (op->kind) {
    case OP_CLAIM:
        if (op->fn != NULL) {
            struct state_redis_claim c;
            claim_verdict(failed ? NULL : x, &c);
            if (c.v == STATE_REDIS_DOWN && r != NULL && !failed)
                went_down(r, "a claim's answer makes no sense");
            op->r->m.granted += c.v == STATE_REDIS_GO;
            op->fn(op->data, &c);
        }
        break;
    case OP_TELL:
        if (op->told_fn != NULL) {
            struct state_redis_told t = {.down = true};
            if (!failed && reply_is(x, REDIS_REPLY_STRING) && x->len == 0) {
                t.down = false;
            } else if (!failed && reply_is(x, REDIS_REPLY_STRING) && ids_valid_word(x->str, x->len)) {
                t.down = false;
                t.kept = true;
                util_copy(t.word, sizeof t.word, x->str);
            } else if (r != NULL && !failed) {
                went_down(r, "a told status's answer makes no sense");
            }
            op->told_fn(op->data, &t);
        }
        break;
    case OP_JOIN_OTHER:
        if (!failed && r != NULL && r->phase == PH_JOINING)
            join_step_done(r);
        break;
    case OP_JOIN_ROLE:
        if (!failed && r != NULL && r->phase == PH_JOINING) {
            if (reply_is(x, REDIS_REPLY_ARRAY) && x->elements >= 1 && reply_is(x->element[0], REDIS_REPLY_STRING) &&
                strcmp(x->element[0]->str, "master") == 0)
                join_step_done(r);
            else
                not_a_master(r, x);
        }
        break;
    case OP_S_AUTH: /* answered above, by sentinel_reply */
    case OP_S_ASK:
        break;
    case OP_JOIN_SCRIPT:
        if (!failed && r != NULL && r->phase == PH_JOINING) {
            if (!reply_is(x, REDIS_REPLY_STRING) || x->len != 40) {
                went_down(r, "SCRIPT LOAD gave no digest");
            } else {
                memcpy(r->sha[op->script], x->str, 41);
                join_step_done(r);
            }
        }
        break;
    case OP_FIRE:
        if (op->charge && !failed && r != NULL && r->on_blocked != NULL && reply_is(x, REDIS_REPLY_INTEGER) &&
            x->integer == 1)
            r->on_blocked(r->ctx, op->shop, op->id);
        break;
    case OP_PING:
    case OP_SUBSCRIBE:
        break;
    }
    free(op);
}

/* The oldest operation may be slower than STATE_REDIS_SLOW_MS. Only
 * Redis's slowness counts: replies that came while this process could not
 * run (a starved machine) are read first, and when the timer itself fired
 * late the operations waiting get a fresh STATE_REDIS_SLOW_MS. */
static void on_slow_timer(struct loop *l, struct loop_timer *t)
{
    struct state_redis *r = t->data;
    int64_t now = util_mono_ms(), late = now - t->at;
    (void)l;
    struct rconn *rc = r->main;
    if (rc != NULL && !rc->freeing && r->head != NULL) {
        rc->busy++;
        redisAsyncHandleRead(rc->ac); /* non-blocking: nothing there is nothing */
        if (--rc->busy == 0 && rc->dead)
            free(rc);
    }
    if (r->head != NULL && late > STATE_REDIS_SLOW_MS / 2) {
        for (struct state_redis_op *op = r->head; op; op = op->next)
            op->sent = now;
    } else if (r->head != NULL && r->head->sent + STATE_REDIS_SLOW_MS <= now) {
        went_down(r, "slower than 100 ms");
        return;
    }
    arm_slow(r);
}

/* ---- the interface ---- */

struct state_redis *state_redis_new(struct loop *l, const struct config_redis *cfg, state_redis_msg_fn *on_msg,
                                    state_redis_blocked_fn *on_blocked,
                                    void *ctx, char *err, size_t errlen)
{
    struct state_redis *r = calloc(1, sizeof *r);
    if (r == NULL) {
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    r->loop = l;
    r->cfg = *cfg;
    r->cfg.password = cfg->password ? strdup(cfg->password) : NULL;
    if (cfg->password && r->cfg.password == NULL) {
        free(r);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    for (int i = 0; i < SCRIPT_N; i++) {
        r->text[i] = script_text(scripts[i]);
        if (r->text[i] == NULL) {
            for (int j = 0; j < i; j++)
                free(r->text[j]);
            free(r->cfg.password);
            free(r);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
    }
    r->on_msg = on_msg;
    r->on_blocked = on_blocked;
    r->ctx = ctx;
    memcpy(r->salt, key_name_label, sizeof r->salt);
    snprintf(r->channel, sizeof r->channel, "%swake", cfg->prefix);
    loop_timer_init(&r->slow_timer, on_slow_timer, r);
    loop_timer_init(&r->retry_timer, on_retry_timer, r);
    loop_timer_init(&r->teardown_timer, on_teardown_timer, r);
    loop_timer_init(&r->join_timer, on_join_timer, r);
    loop_timer_init(&r->ping_timer, on_ping_timer, r);
    loop_timer_init(&r->sentinel_timer, on_sentinel_timer, r);
    loop_timer_init(&r->scheck_timer, on_scheck_timer, r);
    r->port = cfg->port;
    r->m.sentinel = cfg->sentinel ? 1 : 0;
    r->sasking = -1;
    r->snamed = r->snamed_next = -1;
    struct in6_addr a6;
    r->literal = cfg->sentinel;
    for (int i = 0; i < cfg->nsentinels; i++) { /* once, before the loop runs, as below */
        const char *h = cfg->sentinels[i].host;
        r->order[i] = i;
        r->sip_ok[i] = resolve_now(h, r->sip[i]);
        r->literal = r->literal && (inet_pton(AF_INET, h, &a6) == 1 || inet_pton(AF_INET6, h, &a6) == 1);
    }
    if (cfg->sentinel) {
        r->cfg.sentinel_password = cfg->sentinel_password ? strdup(cfg->sentinel_password) : NULL;
        if (cfg->sentinel_password && r->cfg.sentinel_password == NULL) {
            for (int i = 0; i < SCRIPT_N; i++)
                free(r->text[i]);
            free(r->cfg.password);
            free(r);
            snprintf(err, errlen, "out of memory");
            return NULL;
        }
    } else if (!cfg->unix_socket) {
        r->literal = inet_pton(AF_INET, cfg->host, &a6) == 1 || inet_pton(AF_INET6, cfg->host, &a6) == 1;
        if (r->literal) {
            util_copy(r->ip, sizeof r->ip, cfg->host);
            r->ip_ok = true;
        } else { /* once, before the loop runs; later lookups are in the background */
            r->ip_ok = resolve_now(cfg->host, r->ip);
        }
    }
    join(r);
    return r;
}

static void writeback_clear(struct writeback *w)
{
    if (w->secret) {
        explicit_bzero(w->secret, strlen(w->secret));
        free(w->secret);
        w->secret = NULL;
    }
}

void state_redis_free(struct state_redis *r)
{
    if (r == NULL)
        return;
    r->stopping = true;
    r->phase = PH_DOWN;
    r->m.up = 0;
    teardown(r);
    /* operations of connections hiredis could not free yet (none: we are
     * never inside its callbacks here) */
    loop_timer_stop(r->loop, &r->slow_timer);
    loop_timer_stop(r->loop, &r->retry_timer);
    loop_timer_stop(r->loop, &r->teardown_timer);
    loop_timer_stop(r->loop, &r->join_timer);
    loop_timer_stop(r->loop, &r->ping_timer);
    loop_timer_stop(r->loop, &r->sentinel_timer);
    loop_timer_stop(r->loop, &r->scheck_timer);
    sentinel_close(r);
    for (size_t i = 0; i < r->nwb; i++)
        writeback_clear(&r->wb[i]);
    if (r->lookup != NULL) {
        int running = LOOKUP_RUNNING;
        if (atomic_compare_exchange_strong(&r->lookup->state, &running, LOOKUP_ABANDONED))
            r->lookup = NULL; /* its thread frees it when its lookup ends */
        else
            free(r->lookup);
    }
    char *pws[] = {r->cfg.password, r->cfg.sentinel_password};
    for (size_t i = 0; i < ARRAY_LEN(pws); i++)
        if (pws[i] != NULL) {
            explicit_bzero(pws[i], strlen(pws[i]));
            free(pws[i]);
        }
    for (int i = 0; i < SCRIPT_N; i++)
        free(r->text[i]);
    free(r);
}

bool state_redis_up(const struct state_redis *r)
{
    return r != NULL && r->phase == PH_UP;
}

int state_redis_budget(const struct state_redis *r, int budget)
{
    if (r == NULL || r->phase == PH_UP)
        return budget;
    int share = budget / (r->cfg.hosts > 0 ? r->cfg.hosts : 1);
    return share > 0 ? share : 1;
}

/* The client rule's numbers, as the scripts take them (state.h's). */
static void client_args(char *limit, size_t limitlen, char *window, size_t windowlen)
{
    snprintf(limit, limitlen, "%d", STATE_CLIENT_404S);
    snprintf(window, windowlen, "%lld", (long long)STATE_CLIENT_WINDOW_MS);
}

struct state_redis_op *state_redis_claim(struct state_redis *r, const char *secret, const char *id,
                                         const struct pace_schedule *s, int budget, int64_t lease_ms,
                                         const struct state_redis_id *client, const struct state_redis_plan *plan,
                                         state_redis_claim_fn *fn, void *data)
{
    if (!state_redis_up(r))
        return NULL;
    struct state_redis_id k;
    key_hash(r->salt, secret, &k);
    char ktx[STATE_REDIS_KEY_MAX], kkey[STATE_REDIS_KEY_MAX], kbud[STATE_REDIS_KEY_MAX], kblk[STATE_REDIS_KEY_MAX],
        kres[STATE_REDIS_KEY_MAX], kcl[STATE_REDIS_KEY_MAX], kfly[STATE_REDIS_KEY_MAX], waits[PACE_MAX_STEPS * 12],
        sb[16], sl[24], sr[16], climit[16], cwin[24], crecheck[24], shold[24];
    rkey_name(ktx, sizeof ktx, r->cfg.prefix, &k, "t:", id);
    rkey_name(kkey, sizeof kkey, r->cfg.prefix, &k, "k", NULL);
    rkey_name(kbud, sizeof kbud, r->cfg.prefix, &k, "b", NULL);
    rkey_name(kblk, sizeof kblk, r->cfg.prefix, &k, "x:", client ? client->hex : "-");
    rkey_name(kres, sizeof kres, r->cfg.prefix, &k, "r", NULL);
    rkey_name(kcl, sizeof kcl, r->cfg.prefix, &k, "c:", client ? client->hex : "-");
    rkey_name(kfly, sizeof kfly, r->cfg.prefix, &k, "f:", client ? client->hex : "-");
    client_args(climit, sizeof climit, cwin, sizeof cwin);
    snprintf(crecheck, sizeof crecheck, "%lld", (long long)STATE_CLIENT_RECHECK_MS);
    snprintf(sr, sizeof sr, "%d", plan->reserved > 0 ? plan->reserved : 0);
    snprintf(shold, sizeof shold, "%lld", (long long)rules_hold_ms(s));
    waits_csv(s, waits, sizeof waits);
    snprintf(sb, sizeof sb, "%d", budget > 0 ? budget : 1);
    snprintf(sl, sizeof sl, "%lld", (long long)(lease_ms > 0 ? lease_ms : 1000));
    const char *argv[] = {"EVALSHA", r->sha[SCRIPT_CLAIM], "7", ktx, kkey, kbud, kblk, kres, kcl, kfly,
                          waits, sb, sl, client ? "1" : "0", id, sr, plan->host.hex,
                          plan->last_chance ? "last" : "early", climit, cwin, crecheck, shold};
    size_t lens[sizeof argv / sizeof argv[0]];
    for (size_t i = 0; i < sizeof argv / sizeof argv[0]; i++)
        lens[i] = strlen(argv[i]);
    struct state_redis_op *op = op_new(r, OP_CLAIM);
    if (op == NULL)
        return NULL;
    op->fn = fn;
    op->data = data;
    if (!op_send(r->main, op, (int)(sizeof argv / sizeof argv[0]), argv, lens))
        return NULL;
    r->m.claims++;
    return op;
}

void state_redis_cancel(struct state_redis_op *op)
{
    if (op != NULL) {
        op->fn = NULL;
        op->told_fn = NULL;
    }
}

#define ARGC(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* Send a script whose reply matters only for a finish that charged a
 * client (shop and id non-NULL): 1 means its block started. */
static void fire_for(struct state_redis *r, int argc, const char **argv, const char *shop, const char *id)
{
    size_t lens[32];
    if (argc > 32)
        return;
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    struct state_redis_op *op = op_new(r, OP_FIRE);
    if (op == NULL)
        return;
    if (shop != NULL && id != NULL) {
        op->charge = true;
        util_copy(op->shop, sizeof op->shop, shop);
        util_copy(op->id, sizeof op->id, id);
    }
    op_send(r->main, op, argc, argv, lens);
}

static void fire(struct state_redis *r, int argc, const char **argv)
{
    fire_for(r, argc, argv, NULL, NULL);
}

/* EVALSHA the tell script for (secret's key, id) as op (NULL: fire and
 * forget). false when it could not be sent (op is freed then). */
static bool send_tell_op(struct state_redis *r, const char *secret, const char *id, const char *word, bool final,
                         const struct pace_schedule *sched, struct state_redis_op *op)
{
    struct state_redis_id k;
    key_hash(r->salt, secret, &k);
    char ktx[STATE_REDIS_KEY_MAX], ttl[24], waits[PACE_MAX_STEPS * 12];
    rkey_name(ktx, sizeof ktx, r->cfg.prefix, &k, "t:", id);
    snprintf(ttl, sizeof ttl, "%lld", (long long)rules_status_ttl(tx_status_parse(word)));
    if (sched != NULL) /* the others' next read, by the pace the reads made */
        waits_csv(sched, waits, sizeof waits);
    else
        snprintf(waits, sizeof waits, "0,%d", PACE_MIN_WAIT_MS);
    const char *argv[] = {"EVALSHA", r->sha[SCRIPT_TELL], "1", ktx, word, final ? "1" : "0", ttl, waits, id,
                          r->channel, k.hex};
    if (op == NULL) {
        fire(r, ARGC(argv), argv);
        return true;
    }
    size_t lens[ARGC(argv)];
    for (int i = 0; i < ARGC(argv); i++)
        lens[i] = strlen(argv[i]);
    return op_send(r->main, op, ARGC(argv), argv, lens);
}

static void send_tell(struct state_redis *r, const char *secret, const char *id, const char *word, bool final,
                      const struct pace_schedule *sched)
{
    send_tell_op(r, secret, id, word, final, sched, NULL);
}

static void writeback_add(struct state_redis *r, const char *secret, const char *id, const char *word)
{
    if (r->nwb >= STATE_REDIS_WRITEBACK_MAX)
        return; /* the oldest are kept: Redis's own TTLs would have dropped the rest first */
    struct writeback *w = &r->wb[r->nwb];
    w->secret = strdup(secret);
    if (w->secret == NULL)
        return;
    util_copy(w->id, sizeof w->id, id);
    util_copy(w->word, sizeof w->word, word);
    r->nwb++;
}

static void writeback_flush(struct state_redis *r)
{
    for (size_t i = 0; i < r->nwb; i++) {
        send_tell(r, r->wb[i].secret, r->wb[i].id, r->wb[i].word, true, NULL);
        writeback_clear(&r->wb[i]);
    }
    r->m.written_back += (long)r->nwb;
    r->nwb = 0;
}

void state_redis_finish(struct state_redis *r, const char *secret, const char *id,
                        const struct state_redis_outcome *o)
{
    if (r == NULL)
        return;
    if (!state_redis_up(r)) {
        if (o->word != NULL && o->final)
            writeback_add(r, secret, id, o->word);
        return;
    }
    struct state_redis_id k;
    key_hash(r->salt, secret, &k);
    char ktx[STATE_REDIS_KEY_MAX], kkey[STATE_REDIS_KEY_MAX], kcl[STATE_REDIS_KEY_MAX], kblk[STATE_REDIS_KEY_MAX],
        kfly[STATE_REDIS_KEY_MAX], ser[24], sent[24], ttl[24], nfttl[24], rw[24], kw[24], climit[16], cwin[24],
        cblock[24];
    char waits[PACE_MAX_STEPS * 12];
    const char *cl = o->has_client ? o->client.hex : "-";
    rkey_name(ktx, sizeof ktx, r->cfg.prefix, &k, "t:", id);
    rkey_name(kkey, sizeof kkey, r->cfg.prefix, &k, "k", NULL);
    rkey_name(kcl, sizeof kcl, r->cfg.prefix, &k, "c:", cl);
    rkey_name(kblk, sizeof kblk, r->cfg.prefix, &k, "x:", cl);
    rkey_name(kfly, sizeof kfly, r->cfg.prefix, &k, "f:", cl);
    client_args(climit, sizeof climit, cwin, sizeof cwin);
    snprintf(cblock, sizeof cblock, "%lld", (long long)STATE_CLIENT_BLOCK_MS);
    snprintf(ser, sizeof ser, "%llu", (unsigned long long)o->serial);
    snprintf(sent, sizeof sent, "%lld", (long long)(o->sent_ms > 0 && o->sent_ms < PACE_EPISODE_MS ? o->sent_ms : 0));
    snprintf(ttl, sizeof ttl, "%lld", (long long)(o->ttl_ms > 0 ? o->ttl_ms : 1));
    snprintf(nfttl, sizeof nfttl, "%lld", (long long)(o->ttl_ms > 0 ? o->ttl_ms : 1));
    snprintf(rw, sizeof rw, "%lld", (long long)(o->retry_ms > 0 ? o->retry_ms : 0));
    snprintf(kw, sizeof kw, "%lld", (long long)(o->key_pause_ms > 0 ? o->key_pause_ms : 0));
    /* the schedule tells the others when the next read may start */
    if (o->sched != NULL)
        waits_csv(o->sched, waits, sizeof waits);
    else
        snprintf(waits, sizeof waits, "0,%d", PACE_MIN_WAIT_MS);
    const char *argv[] = {"EVALSHA", r->sha[SCRIPT_FINISH], "5", ktx, kkey, kcl, kblk, kfly, ser, sent,
                          o->word ? o->word : "", o->final ? "1" : "0", ttl, o->not_found ? "1" : "0", nfttl,
                          o->charge && o->has_client ? "1" : "0", rw, kw, waits, id, r->channel, k.hex, cl,
                          climit, cwin, cblock};
    bool charge = o->charge && o->has_client;
    fire_for(r, ARGC(argv), argv, charge ? o->shop_id : NULL, charge ? id : NULL);
}

void state_redis_tell(struct state_redis *r, const char *secret, const char *id, const char *word, bool final,
                      const struct pace_schedule *sched)
{
    if (r == NULL)
        return;
    if (!state_redis_up(r)) {
        if (final)
            writeback_add(r, secret, id, word);
        return;
    }
    send_tell(r, secret, id, word, final, sched);
}

struct state_redis_op *state_redis_tell_ask(struct state_redis *r, const char *secret, const char *id,
                                            const char *word, bool final, const struct pace_schedule *sched,
                                            state_redis_told_fn *fn, void *data)
{
    if (!state_redis_up(r))
        return NULL;
    struct state_redis_op *op = op_new(r, OP_TELL);
    if (op == NULL)
        return NULL;
    op->told_fn = fn;
    op->data = data;
    return send_tell_op(r, secret, id, word, final, sched, op) ? op : NULL;
}

void state_redis_metrics(const struct state_redis *r, struct state_redis_metrics *out)
{
    if (r == NULL) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = r->m;
}

/* ---- the blocking one, for --notify ---- */

static redisReply *sync_cmd(redisContext *c, int argc, const char **argv, char *err, size_t errlen)
{
    size_t lens[16];
    if (argc > 16) {
        snprintf(err, errlen, "too many arguments");
        return NULL;
    }
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    redisReply *x = redisCommandArgv(c, argc, argv, lens);
    if (x == NULL) {
        snprintf(err, errlen, "%s", c->errstr[0] ? c->errstr : "no answer");
        return NULL;
    }
    if (x->type == REDIS_REPLY_ERROR) {
        snprintf(err, errlen, "%s", strncmp(x->str, "WRONGPASS", 9) == 0 ? "the password is refused" : x->str);
        freeReplyObject(x);
        return NULL;
    }
    return x;
}

int state_redis_tell_once(const struct config_redis *cfg, const char *secret, const char *id, const char *word,
                          bool final, int timeout_ms, char *err, size_t errlen)
{
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    const char *host = cfg->host;
    int port = cfg->port;
    char mip[INET6_ADDRSTRLEN + 1];
    if (cfg->sentinel) { /* the master, as the first Sentinel that answers names it */
        int which = -1;
        char why[600];
        state_redis_sentinel_master(cfg, timeout_ms, mip, sizeof mip, &port, &which, NULL, why, sizeof why);
        if (which < 0) {
            snprintf(err, errlen, "%s", why);
            return -1;
        }
        host = mip;
    }
    redisContext *c = cfg->unix_socket ? redisConnectUnixWithTimeout(cfg->path, tv)
                                       : redisConnectWithTimeout(host, port, tv);
    if (c == NULL || c->err) {
        snprintf(err, errlen, "cannot connect: %s", c ? c->errstr : "out of memory");
        if (c)
            redisFree(c);
        return -1;
    }
    redisSetTimeout(c, tv);
    int rc = -1;
    redisReply *x = NULL;
    char db[16], ktx[STATE_REDIS_KEY_MAX], ttl[24], waits[32], channel[80];
    snprintf(db, sizeof db, "%d", cfg->db);
    if (cfg->password && (x = sync_cmd(c, 2, (const char *[]){"AUTH", cfg->password}, err, errlen)) == NULL)
        goto out;
    freeReplyObject(x);
    x = NULL; /* not freed again below when db is 0 */
    if (cfg->db != 0 && (x = sync_cmd(c, 2, (const char *[]){"SELECT", db}, err, errlen)) == NULL)
        goto out;
    freeReplyObject(x);
    x = NULL;
    struct state_redis_id k;
    key_hash(key_name_label, secret, &k);
    rkey_name(ktx, sizeof ktx, cfg->prefix, &k, "t:", id);
    snprintf(ttl, sizeof ttl, "%lld", (long long)rules_status_ttl(tx_status_parse(word)));
    snprintf(waits, sizeof waits, "0,%d", PACE_MIN_WAIT_MS);
    snprintf(channel, sizeof channel, "%swake", cfg->prefix);
    char *text = script_text(lua_tell);
    if (text == NULL) {
        snprintf(err, errlen, "out of memory");
        goto out;
    }
    const char *argv[] = {"EVAL", text, "1", ktx, word, final ? "1" : "0", ttl, waits, id, channel, k.hex};
    x = sync_cmd(c, ARGC(argv), argv, err, errlen);
    free(text);
    if (x == NULL)
        goto out;
    rc = 0;
out:
    if (x)
        freeReplyObject(x);
    redisFree(c);
    return rc;
}
