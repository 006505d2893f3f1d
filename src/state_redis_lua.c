/* state_redis_lua.c - the Redis store's scripts (Redis's Lua 5.1), run on
 * Redis's clock, and their composition with the rules' prelude. */
#include "state_redis_private.h"

#include <stdio.h>
#include <string.h>

#include "plan.h"
#include "rules.h"

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
 * 6 this host's reservations (ms from now, comma-separated), 7 host, 8 "last" for a last-chance read
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
    /* the times plan_events() gathers: the reads of the last 60 s and every
     * host's reservations, as each said at its last claim (ms from then,
     * kept for a hold's length, ARGV[12]), an overdue one at `now` */
    "local hold = tonumber(ARGV[12])\n"
    "local mine = {}\n"
    "for d in string.gmatch(ARGV[6], '%d+') do mine[#mine + 1] = now + tonumber(d) end\n"
    "redis.call('HSET', KEYS[5], ARGV[7], table.concat(mine, ',') .. ':' .. (now + hold))\n"
    "redis.call('PEXPIREAT', KEYS[5], now + math.max(KEEP, hold))\n"
    "local ev, rd = {}, redis.call('ZRANGE', KEYS[3], 0, -1, 'WITHSCORES')\n"
    "for i = 2, #rd, 2 do ev[#ev + 1] = tonumber(rd[i]) end\n"
    "local all = redis.call('HGETALL', KEYS[5])\n"
    "for i = 1, #all, 2 do\n"
    "  local ts, e = string.match(all[i + 1], '^([%d,]*):(%d+)$')\n"
    "  if ts and tonumber(e) > now then\n"
    "    for x in string.gmatch(ts, '%d+') do ev[#ev + 1] = math.max(tonumber(x), now) end\n"
    "  else redis.call('HDEL', KEYS[5], all[i]) end\n"
    "end\n"
    "table.sort(ev)\n"
    "local recent = 0\n"
    "for i = 1, #ev do if ev[i] <= now then recent = recent + 1 end end\n"
    /* plan.c's decision (plan_lua) on them, as plan_gather() makes recent,
     * busiest and busiest_late. Redis does not hold the rest of what
     * plan_gather() gathers (the waiting transactions' demand, taken as more
     * than the budget: never plenty; the arrivals: none; the others waiting:
     * none, so no fair share across hosts); each host shares its own early
     * reads fairly before it claims (state.c) */
    "local budget = tonumber(ARGV[2])\n"
    "local pk = {budget = budget, recent = recent, schedule_reads = 0, demand = budget + 1,\n"
    "            busiest = plan_busiest(ev, now, nil), busiest_late = 0, arrivals = 0, arrivals_long = 0,\n"
    "            eligible = 1, starved = false, hold_ms = hold}\n"
    "pk.busiest_late = plan_busiest(ev, now, now - plan_late_span(pk))\n"
    "local pt = {reserved = ARGV[8] == 'last', resv_at = now, next_gap = 0, drifted = false, early_reads = 0}\n"
    "if plan_may_read(pk, pt, now) == 'no' then\n"
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

static const char *const scripts[SCRIPT_N] = {lua_claim, lua_finish, lua_tell};

char *state_redis_script_text(int script)
{
    const char *body = scripts[script];
    char prelude[2048], plan[4096] = "";
    int n = rules_lua_prelude(prelude, sizeof prelude);
    int m = script == SCRIPT_CLAIM ? plan_lua(plan, sizeof plan) : 0; /* the claim decides as plan.c */
    if (n < 0 || m < 0)
        return NULL;
    size_t len = (size_t)n + (size_t)m + strlen(body) + 1;
    char *t = malloc(len);
    if (t != NULL)
        snprintf(t, len, "%s%s%s", prelude, plan, body);
    return t;
}
