/* state_redis_lua.c - the Redis store's scripts (Redis's Lua 5.1), run on
 * Redis's clock: their text, composed with the rules' prelude and the
 * plan's translated functions, and the keys each takes (each kind of key
 * declared once, each script's listed by kind, named in its text by the
 * same table). */
#include "state_redis_private.h"

#include <stdio.h>
#include <string.h>

#include "plan_lua.h"
#include "rules.h"
#include "state_redis_msg.h"

/* ---- the scripts (Redis's Lua 5.1), run on Redis's clock ---- */

/* Shared head: now (ms, Redis's TIME) and the transaction's fields.
 *
 * A transaction's hash (K_TX), field by field: s its status's word, fu
 * until when a final status is cached, nf until when a 404 is remembered,
 * fs the serial of the read whose outcome was recorded last (a told status:
 * the next one's), n its reads in the episode, er the early ones of them,
 * ls the last read's start, lu its lease's end (0: none under way), ser
 * the last read's serial, le the last read's end (the floor), ra no read
 * before (Retry-After), hu the latest deadline of a request held for it,
 * ho the hosts holding one, rv its reservation, wh the plan held a read
 * back during this hold, qn and qt the read under way counted in the 404
 * quarter (its name and start). */
#define LUA_HEAD                                                                           \
    "local t = redis.call('TIME')\n"                                                       \
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"              \
    "local h = redis.call('HMGET', K_TX, 's', 'fu', 'nf', 'n', 'ls', 'lu', 'ra', 'ser', 'le', 'fs')\n" \
    "local s = h[1]\n" /* false when none (HMGET's missing field) */                      \
    "local fu, nf = tonumber(h[2]) or 0, tonumber(h[3]) or 0\n"                            \
    "local n, ls, lu = tonumber(h[4]) or 0, tonumber(h[5]) or 0, tonumber(h[6]) or 0\n"    \
    "local ra, ser, le = tonumber(h[7]) or 0, tonumber(h[8]) or 0, tonumber(h[9]) or 0\n"   \
    "local fs = tonumber(h[10]) or 0\n" /* the serial of the read whose outcome was recorded last */ \
    "local function held()\n" /* rules_held: what answers without a read */                \
    "  return rules_held(s and fu or 0, nf, lu, now)\n"                                    \
    "end\n"                                                                                \
    "local function next_gate(kp)\n" /* struct rules_gate: the transaction's fields, its key's pause */ \
    "  return {reads = n, last_start = ls, last_end = le, not_before = ra, key_paused_until = kp}\n" \
    "end\n"                                                                                \
    "local WHY = {[RULES_WHY_PACE] = W_PACE, [RULES_WHY_RETRY] = W_RETRY, [RULES_WHY_KEY_PAUSE] = W_KEY}\n" \
    "local function schedule(waits)\n" /* struct pace_schedule, for plan_lua()'s functions */ \
    "  local ps = {n = 0, wait_ms = {}}\n"                                                 \
    "  for w in string.gmatch(waits, '%d+') do ps.wait_ms[ps.n] = tonumber(w); ps.n = ps.n + 1 end\n" \
    "  return ps\n"                                                                        \
    "end\n"

/* May status new replace old as a told one may (rules_may_replace, told: R)? */
#define LUA_FORWARD                                                                          \
    "local function forward(old, new)\n"                                                     \
    "  if not old or not R[old] then return true end\n"                                      \
    "  return R[old][new] == true\n"                                                         \
    "end\n"

/* Publish what is known now, and keep the transaction for as long as any
 * of its times matters. ARGV names: waits, channel, rkey, id. */
#define LUA_PUBLISH                                                                        \
    "local function publish(waits, channel, rkey, id, kp)\n"                               \
    "  local msg, hd = nil, held()\n"                                                       \
    "  if hd == RULES_HELD_FINAL then msg = MSG_FINAL .. ' ' .. rkey .. ' ' .. id .. ' ' .. (fu - now) .. ' ' .. s\n" \
    "  elseif hd == RULES_HELD_NOT_FOUND then msg = MSG_NOT_FOUND .. ' ' .. rkey .. ' ' .. id .. ' ' .. (nf - now)\n" \
    "  else\n"                                                                             \
    "    local nx = {}\n" /* the next read, as a claim would decide it */                 \
    "    rules_next_read(schedule(waits), next_gate(kp), now, nx)\n"                        \
    "    if s then msg = MSG_STATUS .. ' ' .. rkey .. ' ' .. id .. ' ' .. (nx.at - now) .. ' ' .. s\n" \
    "    else msg = MSG_NEXT .. ' ' .. rkey .. ' ' .. id .. ' ' .. (nx.at - now) end\n"     \
    "  end\n"                                                                              \
    "  redis.call('PUBLISH', channel, msg)\n"                                              \
    "  local hu = tonumber(redis.call('HGET', K_TX, 'hu')) or 0\n" /* held: kept as long */    \
    "  redis.call('PEXPIREAT', K_TX, math.max(now + KEEP, fu, nf, ra, lu, ls + KEEP, hu) + MARGIN)\n" \
    "end\n"

/* A transaction's fields (tx_fields), whether it waits (st_waiting_tx:
 * some host holds a request for it whose deadline has not passed, and no
 * final status or 404 is cached), and the copy of them the key keeps for
 * the waiting set (K_WAITERS, id -> packed: the plan's walk over the
 * waiting transactions reads only the keys a script is passed). Every
 * script that changes a transaction's fields ends with follow(), and
 * every one that drops an id from the waiting set drops its copy. */
#define LUA_TX                                                                             \
    "local function tx_fields(k)\n"                                                        \
    "  local f = redis.call('HMGET', k, 's', 'fu', 'nf', 'hu', 'ho', 'rv', 'n', 'ls', 'lu', 'ra', 'le', 'er', 'wh')\n" \
    "  local x = {s = f[1]}\n"                                                              \
    "  local names = {'fu', 'nf', 'hu', 'ho', 'rv', 'n', 'ls', 'lu', 'ra', 'le', 'er', 'wh'}\n" \
    "  for i = 1, #names do x[names[i]] = tonumber(f[i + 1]) or 0 end\n"                   \
    "  return x\n"                                                                         \
    "end\n"                                                                                \
    "local function cached_until(fu, nf)\n" /* a final status's or a 404's (fu is a final's only) */ \
    "  return math.max(fu, nf)\n"                                                          \
    "end\n"                                                                                \
    "local function tx_facts(f)\n" /* the hash's fields as struct plan_facts */           \
    "  return {holders = f.ho, hold_until = f.hu, cached_until = cached_until(f.fu, f.nf), reads = f.n,\n" \
    "          last_start = f.ls, floor_until = rules_floor(f.le), busy_until = f.lu, not_before = f.ra}\n" \
    "end\n"                                                                                \
    "local function tx_waits(f)\n"                                                         \
    "  return plan_waits(tx_facts(f), now)\n"                                              \
    "end\n"                                                                                \
    "local function keep_until(k, t)\n" /* k (if it exists) lives at least until t */      \
    "  local px = redis.call('PTTL', k)\n"                                                 \
    "  if px == -1 or (px >= 0 and now + px < t) then redis.call('PEXPIREAT', k, t) end\n" \
    "end\n"                                                                                \
    "local COPIED = {'fu', 'nf', 'hu', 'ho', 'n', 'ls', 'lu', 'ra', 'le', 'er'}\n"        \
    "local function copy_of(f)\n" /* the status first ('-': none), then COPIED */       \
    "  local out = {f.s or '-'}\n"                                                       \
    "  for i = 1, #COPIED do out[i + 1] = string.format('%.0f', f[COPIED[i]]) end\n"      \
    "  return table.concat(out, ' ')\n"                                                  \
    "end\n"                                                                              \
    "local function from_copy(id, text)\n" /* tx_fields() as copy_of() kept them */     \
    "  local x, i = {id = id}, 0\n"                                                      \
    "  for w in string.gmatch(text, '%S+') do\n"                                         \
    "    if i == 0 then\n"                                                               \
    "      if w ~= '-' then x.s = w end\n"                                               \
    "    else\n"                                                                         \
    "      x[COPIED[i]] = tonumber(w)\n"                                                 \
    "    end\n"                                                                          \
    "    i = i + 1\n"                                                                    \
    "  end\n"                                                                            \
    "  for j = 1, #COPIED do x[COPIED[j]] = x[COPIED[j]] or 0 end\n"                     \
    "  return x\n"                                                                       \
    "end\n"                                                                              \
    /* K_TX's copy follows it while it is in kw; f: its fields as they are \
     * now, when the caller has them (else they are read) */               \
    "local function follow(kw, kv, id, f)\n"                                             \
    "  if redis.call('ZSCORE', kw, id) then\n"                                           \
    "    redis.call('HSET', kv, id, copy_of(f or tx_fields(K_TX)))\n"                    \
    "    local px = redis.call('PTTL', kw)\n"                                            \
    "    if px > 0 then keep_until(kv, now + px) end\n"                                  \
    "  else\n"                                                                           \
    "    redis.call('HDEL', kv, id)\n"                                                   \
    "  end\n"                                                                            \
    "end\n"

/* What the budget's plan gathers (plan_gather in state_budget.c) from
 * Redis: a transaction's fields, whether it waits (st_waiting_tx: some host
 * holds a request for it whose deadline has not passed, and no final
 * status or 404 is cached), the key's waiting ones and the times its
 * spans hold (plan_events).
 *
 * The waiting set {K}w (id, scored by its hold's deadline) and the
 * reservations {K}r (id, scored by its reservation) are kept exact by
 * every script that changes them: {K}r holds the reservation of each
 * transaction of {K}w that has one, and nothing else (held, left, the
 * claim's last-chance read, a final status or 404 cached by finish or
 * tell); an id whose deadline passed leaves both (prune_waiting). The
 * spans' times are then {K}b and {K}r alone: no transaction's fields are
 * read for them, and a claim or a hold costs what its decision needs, not
 * one HMGET per waiting transaction. */
#define LUA_PLAN                                                                           \
    "local function tx_waiter(f)\n" /* struct plan_waiter, as tx_waiter() fills it */      \
    "  local w = {}\n"                                                                     \
    "  plan_waiter_of(tx_facts(f), w)\n"                                                   \
    "  return w\n"                                                                         \
    "end\n"                                                                                \
    "local function prune_waiting(kw, kr, kv)\n" /* the ids whose deadline passed leave w, r and v */ \
    "  local gone = redis.call('ZRANGEBYSCORE', kw, '-inf', now)\n"                        \
    "  for i = 1, #gone, 256 do\n"                                                         \
    "    redis.call('ZREM', kr, unpack(gone, i, math.min(i + 255, #gone)))\n"              \
    "    redis.call('HDEL', kv, unpack(gone, i, math.min(i + 255, #gone)))\n"              \
    "  end\n"                                                                              \
    "  if #gone > 0 then redis.call('ZREMRANGEBYSCORE', kw, '-inf', now) end\n"                                  \
    "end\n"                                                                                \
    /* The waiting transactions but `skip`, in the set's order (the first   \
     * cap of it): walk(i) gives the i-th one's fields (f.id), nil past the \
     * last, from their copies (K_WAITERS), 16 at a time and only as far as \
     * a caller asks. An id found not waiting any more is dropped from w, r \
     * and v by done(); one without a copy (evicted) is passed over and     \
     * left to leave w and r at its deadline (prune_waiting). */            \
    "local function waiters(kw, kr, kv, cap, skip)\n"                                      \
    "  local seen, stale, ids, fs, at, rank = {}, {}, {}, {}, 1, 0\n" /* ids[at..]: fetched, not read */ \
    "  local function walk(i)\n"                                                           \
    "    while #seen < i do\n"                                                             \
    "      if at > #ids then\n"                                                            \
    "        if rank >= cap then break end\n"                                              \
    "        ids, at = redis.call('ZRANGE', kw, rank, math.min(rank + 16, cap) - 1), 1\n"  \
    "        if #ids == 0 then break end\n"                                                \
    "        rank = rank + #ids\n"                                                         \
    "        fs = redis.call('HMGET', kv, unpack(ids))\n"                                  \
    "      end\n"                                                                          \
    "      local id, text = ids[at], fs[at]\n"                                             \
    "      at = at + 1\n"                                                                  \
    "      if id ~= skip then\n"                                                           \
    "        local f = text and from_copy(id, text)\n"                                     \
    "        if f and tx_waits(f) then seen[#seen + 1] = f elseif f then stale[#stale + 1] = id end\n" \
    "      end\n"                                                                          \
    "    end\n"                                                                            \
    "    return seen[i]\n"                                                                 \
    "  end\n"                                                                              \
    "  local function done()\n"                                                            \
    "    for i = 1, #stale do\n"                                                           \
    "      redis.call('ZREM', kw, stale[i]); redis.call('ZREM', kr, stale[i]); redis.call('HDEL', kv, stale[i])\n" \
    "    end\n"                                                                            \
    "  end\n"                                                                              \
    "  return walk, done\n"                                                                \
    "end\n"                                                                                \
    /* after prune_waiting(): the spans' times, sorted, an overdue           \
     * reservation at now, as plan_busiest() takes them (from 0) and their  \
     * number */                                                            \
    "local function plan_events(kb, kr)\n"                                                 \
    "  redis.call('ZREMRANGEBYSCORE', kb, '-inf', now - BUDGET_SPAN)\n"                    \
    "  local ev, rd = {}, redis.call('ZRANGEBYSCORE', kb, '-inf', '(+inf', 'WITHSCORES')\n" \
    "  for i = 2, #rd, 2 do ev[#ev + 1] = tonumber(rd[i]) end\n"                           \
    "  rd = redis.call('ZRANGE', kr, 0, -1, 'WITHSCORES')\n"                               \
    "  for i = 2, #rd, 2 do ev[#ev + 1] = math.max(tonumber(rd[i]), now) end\n"            \
    "  table.sort(ev)\n"                                                                   \
    "  local z = {}\n"                                                                     \
    "  for i = 1, #ev do z[i - 1] = ev[i] end\n"                                           \
    "  return z, #ev\n"                                                                    \
    "end\n"                                                                                \
    "local counted = {}\n"                                                                 \
    "local function span_count(kb, kr, from, to)\n" /* plan_events()' times in [from, to) */ \
    "  local memo = kb .. ' ' .. from .. ' ' .. to\n"                                      \
    "  if counted[memo] then return counted[memo] end\n"                                   \
    "  local c = redis.call('ZCOUNT', kb, from, '(' .. to)\n"                              \
    "  if from <= now and now < to then c = c + redis.call('ZCOUNT', kr, '-inf', '(' .. to)\n" \
    "  elseif from > now then c = c + redis.call('ZCOUNT', kr, from, '(' .. to) end\n"     \
    "  counted[memo] = c\n"                                                                \
    "  return c\n"                                                                         \
    "end\n"                                                                                \
    "local function busiest_at(kb, kr, t)\n" /* plan_busiest() of plan_events(), no bound */ \
    "  local ev, nev = plan_events(kb, kr)\n"                                              \
    "  return plan_busiest(ev, nev, t, -math.huge)\n"                                      \
    "end\n"                                                                                \
    "local function first_event(kb, kr)\n" /* plan_events()[0], nil for none */            \
    "  local b = redis.call('ZRANGEBYSCORE', kb, '-inf', '(+inf', 'WITHSCORES', 'LIMIT', 0, 1)\n" \
    "  local r = redis.call('ZRANGE', kr, 0, 0, 'WITHSCORES')\n"                            \
    "  local t = b[2] and tonumber(b[2])\n"                                                \
    "  if r[2] and (not t or math.max(tonumber(r[2]), now) < t) then t = math.max(tonumber(r[2]), now) end\n" \
    "  return t\n"                                                                         \
    "end\n"                                                                                \
    /* At least plan_busiest(plan_events(), t, from): the spans starting    \
     * at its first candidate and at t, which it counts too. */               \
    "local function busiest_at_least(kb, kr, t, from)\n"                                  \
    "  local lo = t - BUDGET_SPAN + 1\n"                                                   \
    "  if from and from > lo then lo = from end\n"                                         \
    "  return math.max(span_count(kb, kr, lo, lo + BUDGET_SPAN), span_count(kb, kr, t, t + BUDGET_SPAN))\n" \
    "end\n"                                                                                \
    ""

/* The 404 quarter {K}n: the key's reads that ended 404 (member: the
 * read's name, scored by its start), and its reads of ids never answered
 * under way ('p:' and the name, from the claim until the finish). At
 * most `cap` of them in the span ending now (st_budget_nf_next):
 * nf_spent(kn, cap, lease) gathers the newest and rules_nf_free decides
 * when there is room. A read under way counts until its lease ends (its
 * process may have died). */
#define LUA_NF_QUARTER                                                                     \
    "local function nf_spent(kn, cap, lease)\n"                                            \
    "  redis.call('ZREMRANGEBYSCORE', kn, '-inf', now - BUDGET_SPAN)\n"                    \
    "  if redis.call('ZCARD', kn) < cap then return now end\n"                           \
    "  local dead = {}\n" /* reads under way whose lease ended */                          \
    "  local old = redis.call('ZRANGEBYSCORE', kn, '-inf', now - lease)\n"                 \
    "  for i = 1, #old do if string.sub(old[i], 1, 2) == 'p:' then dead[#dead + 1] = old[i] end end\n" \
    "  if #dead > 0 then redis.call('ZREM', kn, unpack(dead)) end\n"                       \
    "  local top = redis.call('ZREVRANGE', kn, 0, cap - 1, 'WITHSCORES')\n"                \
    "  local at, probe = {}, {}\n" /* rules_nf_free's, newest first from 0 */             \
    "  for i = 1, #top, 2 do\n"                                                            \
    "    at[(i - 1) / 2], probe[(i - 1) / 2] = tonumber(top[i + 1]), string.sub(top[i], 1, 2) == 'p:'\n" \
    "  end\n"                                                                              \
    "  return rules_nf_free(at, probe, #top / 2, cap, PLAN_RECHECK, now)\n"                \
    "end\n"

/* The keys (K_*) are the ones scripts[] below gives the claim; after them
 * (from FIXED_KEYS + 1), for each of the client's tiers (none: no client;
 * its address, then an IPv6 address's /56 and /48) its block, its 404s and
 * its reads in flight. ARGV: 1 waits, 2 budget, 3 lease_ms, 4 has_client,
 * 5 id, 6 '1' to plan the budget (plan.h; '0': first come, first served),
 * 7 the waiting set's cap, 8 each tier's 404s that block (with its reads
 * in flight: "5,10,20"), 9 their window (ms), 10 the recheck (ms) of a
 * client at its count, 11 a hold's length (ms, rules_hold_ms), 12 a whole
 * schedule's reads within a hold (pace_reads_within), 13 the read's name
 * in the key's count (budget_member), 14 the channel, 15 the key's name
 * (K), 16 '1' when a count found gone was lost (budget_count_lost), 17 the
 * grace (ms, budget_grace_ms), 18 the 404 quarter (rules_not_found_cap).
 * Returns {W_GO, serial, W_EARLY or W_LAST} or why not (STATE_REDIS_WORDS). */
static const char lua_claim[] =
    LUA_HEAD LUA_TX LUA_PLAN LUA_NF_QUARTER
    "local hd = held()\n" /* as the C's claim decides it (rules_held) */
    "if hd == RULES_HELD_FINAL then return {W_FINAL, fu - now, s} end\n"
    "if hd == RULES_HELD_NOT_FOUND then return {W_NOT_FOUND, nf - now} end\n"
    "if hd == RULES_HELD_BUSY then return {W_BUSY, lu - now} end\n"
    /* an id nobody knows, for a client (each tier: the address, an IPv6
     * address's /56 and /48), as st_client_fly: blocked at any tier
     * (rules_client_blocked), or at one whose 404s and reads in flight are
     * already its allowance (rules_client_next: each host hears of
     * another's read's end only for its own ids, so it asks again soon) */
    "local fly = ARGV[4] == '1' and not s\n"
    "local tiers = {}\n" /* tier i: KEYS[base], [base + 1], [base + 2]: block, 404s, in flight */
    "if fly then\n"
    "  local lim = {}\n"
    "  for a in string.gmatch(ARGV[8], '%d+') do lim[#lim + 1] = tonumber(a) end\n"
    "  for base = FIXED_KEYS + 1, #KEYS - 2, 3 do tiers[#tiers + 1] = {base = base, allow = lim[#tiers + 1]} end\n"
    "  local blocks = {}\n" /* each tier's block's end, from 0 */
    "  for i, t in ipairs(tiers) do\n"
    "    local bl = redis.call('PTTL', KEYS[t.base])\n"
    "    blocks[i - 1] = bl > 0 and now + bl or 0\n"
    "  end\n"
    "  local bl = rules_client_blocked(blocks, #tiers, now)\n"
    "  if bl > 0 then return {W_BLOCKED, bl - now} end\n"
    "  for _, t in ipairs(tiers) do\n"
    "    local kc, kf = KEYS[t.base + 1], KEYS[t.base + 2]\n"
    "    redis.call('ZREMRANGEBYSCORE', kf, '-inf', now)\n"
    "    redis.call('ZREMRANGEBYSCORE', kc, '-inf', now - tonumber(ARGV[9]))\n"
    "    local o = redis.call('ZRANGE', kf, 0, 0, 'WITHSCORES')\n"
    "    local at = rules_client_next(redis.call('ZCARD', kc) + redis.call('ZCARD', kf), o[2] and tonumber(o[2]) or 0,\n"
    "                                 t.allow, tonumber(ARGV[10]), now)\n"
    "    if at > now then return {W_WAIT, at - now, W_CLIENT} end\n"
    "  end\n"
    "end\n"
    /* the pace, the floor at Kasera, Retry-After and the key's pause, as
     * the C decides them (rules_next_read) */
    "local kp = tonumber(redis.call('HGET', K_KEY, 'p')) or 0\n"
    "local me = tx_fields(K_TX)\n" /* before the episode's reads are reset below */
    "local ws = schedule(ARGV[1])\n"
    "local nx = {}\n"
    "rules_next_read(ws, next_gate(kp), now, nx)\n"
    "if nx.at > now then return {W_WAIT, nx.at - now, WHY[nx.why]} end\n"
    "if not pace_in_episode(n, ls, now) then n = 0 end\n"
    /* the key's count (budget.h): its mark '~' (scored +inf, never a
     * read) says it is whole; found gone, every host is asked for its
     * reads, and when this host read with the key lately (ARGV[16]: it was
     * lost, not forgotten) nothing is granted for GRACE while they come */
    "if not redis.call('ZSCORE', K_BUDGET, '~') then\n"
    "  redis.call('ZADD', K_BUDGET, '+inf', '~')\n"
    "  redis.call('PUBLISH', ARGV[14], MSG_SEED .. ' ' .. ARGV[15])\n"
    "  if ARGV[16] == '1' then redis.call('SET', K_GRACE, '1', 'PX', ARGV[17]) end\n"
    "end\n"
    "local grace = redis.call('PTTL', K_GRACE)\n"
    "if grace > 0 then\n"
    "  redis.call('PEXPIRE', K_BUDGET, MARK_KEEP)\n"
    "  return {W_WAIT, grace, W_SEED}\n"
    "end\n"
    "redis.call('ZREMRANGEBYSCORE', K_BUDGET, '-inf', now - BUDGET_SPAN)\n"
    "local used, budget, nth = redis.call('ZCOUNT', K_BUDGET, '-inf', '(+inf'), tonumber(ARGV[2]), 0\n"
    "if used >= budget and budget > 0 then\n" /* the budget-th newest read (the mark '~' is last), for rules_budget_free */
    "  nth = tonumber(redis.call('ZRANGE', K_BUDGET, used - budget, used - budget, 'WITHSCORES')[2])\n"
    "end\n"
    "local free = rules_budget_free(used, budget, nth, now)\n"
    "if free > now then return {W_WAIT, free - now, W_BUDGET} end\n"
    /* plan.c's decision on what plan_gather() and st_plan_verdict() gather,
     * every host's: the reads of the last 60 s, the waiting transactions
     * (their reservations, demand, pace) and the arrivals */
    "local kind, rv, er = PLAN_EARLY, me.rv, me.er\n"
    "if n == 0 then er = 0 end\n"
    "if ARGV[6] == '1' then\n"
    "  prune_waiting(K_WAITING, K_RESERVED, K_WAITERS)\n"
    "  local pk = {budget = tonumber(ARGV[2]), recent = 0, schedule_reads = tonumber(ARGV[12]), demand = 0,\n"
    "              busiest = 0, busiest_late = 0, arrivals = 0, arrivals_long = 0, eligible = 1,\n"
    "              starved = false, hold_ms = tonumber(ARGV[11])}\n"
    "  redis.call('ZREMRANGEBYSCORE', K_ARRIVALS, '-inf', now - PLAN_RATE_LONG_MS)\n"
    /* plan_arrivals() from counts (ZCOUNT), the arrivals not read */
    "  local function since(span)\n" /* the arrivals after now - span, the earliest of them */
    "    local n = redis.call('ZCOUNT', K_ARRIVALS, '(' .. (now - span), '+inf')\n"
    "    local f = redis.call('ZRANGEBYSCORE', K_ARRIVALS, '(' .. (now - span), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)\n"
    "    return n, f[2] and tonumber(f[2]) or math.huge\n"
    "  end\n"
    "  local n_short, first_short = since(PLAN_RATE_MS)\n"
    "  local n_long, first_long = since(PLAN_RATE_LONG_MS)\n"
    "  local thins = plan_arrival_rate(pk, n_short, first_short, n_long, first_long)\n"
    "  local pt = {}\n" /* as the C fills it (n: 0 once the episode ended) */
    "  plan_tx_fill(ws, tx_waits(me), me.rv, n, me.er, me.wh == 1, now, pt)\n"
    "  pk.demand = plan_demand(ws, tx_waiter(me), now)\n"
    /* A refusal first, cheaply (a flash sale's claims are mostly refused):
     * the reads of the last 60 s and the reservations counted, not read
     * (ZCOUNT), recent exactly, the busiest spans at least (two of the
     * spans plan_busiest counts), demand this transaction's only. Each
     * only lowers plan_room() or the `plenty` sum, and eligible = 1 never
     * refuses: a 'no' here is the answer the whole gather gives. */
    "  pk.recent = span_count(K_BUDGET, K_RESERVED, now - BUDGET_SPAN + 1, now + 1)\n"
    "  pk.busiest = busiest_at_least(K_BUDGET, K_RESERVED, now, nil)\n"
    "  pk.busiest_late = busiest_at_least(K_BUDGET, K_RESERVED, now, now - plan_late_span(pk))\n"
    "  if plan_may_read(pk, pt, now) == PLAN_NO then\n"
    "    redis.call('HSET', K_TX, 'wh', 1)\n"
    "    if redis.call('PTTL', K_TX) < 0 then redis.call('PEXPIREAT', K_TX, now + KEEP + MARGIN) end\n"
    "    local fe = first_event(K_BUDGET, K_RESERVED)\n"
    "    return {W_WAIT, plan_retry(pt, {[0] = fe}, fe and 1 or 0, thins, PLAN_RECHECK, now) - now, W_PLAN}\n"
    "  end\n"
    "  local ev, nev = plan_events(K_BUDGET, K_RESERVED)\n"
    "  pk.recent = 0\n"
    "  for i = 0, nev - 1 do\n"
    "    if ev[i] <= now and ev[i] > now - BUDGET_SPAN then pk.recent = pk.recent + 1 end\n"
    "  end\n"
    "  pk.busiest = plan_busiest(ev, nev, now, -math.huge)\n"
    "  pk.busiest_late = plan_busiest(ev, nev, now, now - plan_late_span(pk))\n"
    "  local mine = tx_waits(me) and redis.call('ZSCORE', K_WAITING, ARGV[5]) ~= false\n"
    "  local walk, done = waiters(K_WAITING, K_RESERVED, K_WAITERS, tonumber(ARGV[7]), ARGV[5])\n"
    /* The others' demand counts only in plan_may_read's `plenty` test
     * (recent + demand + arrivals * schedule_reads <= budget), and grows
     * with each: once the sum passes the budget no later one changes the
     * answer (plan_gather stops adding past the budget too), so the walk
     * stops there; in a flash sale, the reads of the last 60 s already
     * past it, it reads no transaction at all. */
    "  local i = 0\n"
    "  while pk.recent + pk.demand + pk.arrivals * pk.schedule_reads <= pk.budget do\n"
    "    i = i + 1\n"
    "    local f = walk(i)\n"
    "    if not f then break end\n"
    "    if f.lu <= now and pk.demand <= pk.budget then pk.demand = pk.demand + plan_demand(ws, tx_waiter(f), now) end\n"
    "  end\n"
    /* eligible and starved count only in `room < eligible and early_reads
     * > 0 and starved`, after every other answer: with eligible = 1 and
     * starved = false plan_may_read's 'no' or 'last' is already the
     * answer (the true counts can only turn 'early' into 'no'). Otherwise,
     * for a transaction that has had an early read, count the others whose
     * pace lets them read now until eligible passes plan_room() (more
     * cannot change `room < eligible`) and one of them is starved: the
     * answer is then the one the whole count gives. */
    "  pk.eligible, pk.starved = 1, false\n"
    "  kind = plan_may_read(pk, pt, now)\n"
    "  if kind == PLAN_EARLY and pt.early_reads > 0 then\n"
    "    local room = plan_room(pk)\n"
    "    i = 0\n"
    "    while pk.eligible <= room or not pk.starved do\n"
    "      i = i + 1\n"
    "      local f = walk(i)\n"
    "      if not f then break end\n"
    "      if plan_ready(ws, tx_waiter(f), now) then\n"
    "        pk.eligible = pk.eligible + 1\n"
    "        if f.er == 0 then pk.starved = true end\n"
    "      end\n"
    "    end\n"
    "    kind = plan_may_read(pk, pt, now)\n"
    "  end\n"
    "  done()\n"
    "  if kind == PLAN_NO then\n"
    "    redis.call('HSET', K_TX, 'wh', 1)\n"
    "    if redis.call('PTTL', K_TX) < 0 then redis.call('PEXPIREAT', K_TX, now + KEEP + MARGIN) end\n"
    "    return {W_WAIT, plan_retry(pt, ev, nev, thins, PLAN_RECHECK, now) - now, W_PLAN}\n"
    "  end\n"
    "  if kind == PLAN_LAST_CHANCE then\n"
    /* requests held later than the one it was for keep a chance too
     * (state_claim): the spans then hold this read where the reservation
     * was, at now */
    "    rv = 0\n"
    "    if not mine then\n" /* now into the sorted times */
    "      local j = nev\n"
    "      while j > 0 and ev[j - 1] > now do ev[j] = ev[j - 1]; j = j - 1 end\n"
    "      ev[j], nev = now, nev + 1\n"
    "    end\n"
    "    local at = plan_later_chance(me.ho, me.hu, now)\n"
    "    if at > 0 and plan_may_reserve(pk, plan_busiest(ev, nev, at, -math.huge)) then rv = at end\n"
    "    if mine and rv ~= 0 then\n"
    "      redis.call('ZADD', K_RESERVED, rv, ARGV[5])\n"
    "      keep_until(K_RESERVED, me.hu + MARGIN)\n"
    "    else\n"
    "      redis.call('ZREM', K_RESERVED, ARGV[5])\n"
    "    end\n"
    "  end\n"
    "end\n"
    /* the 404 quarter (state.c's compute): while the key's reads that
     * ended 404, or are of ids never answered and under way, are
     * ARGV[18] in the span ending now, an id never answered reads only
     * with a held request's last-chance read (granted by the plan, or
     * within PLAN_LEAD_MS of its deadline) */
    "if not s and kind ~= PLAN_LAST_CHANCE then\n"
    "  local til = rules_nf_until(nf_spent(K_NOT_FOUND, tonumber(ARGV[18]), tonumber(ARGV[3])), me.ho, me.hu, me.rv, now)\n"
    "  if til > now then return {W_WAIT, math.max(til - now, 1), W_BUDGET} end\n"
    "end\n"
    "if kind ~= PLAN_LAST_CHANCE then er = er + 1 end\n"
    "ser = ser + 1\n"
    "lu = now + tonumber(ARGV[3])\n"
    "redis.call('HSET', K_TX, 'n', n + 1, 'ls', now, 'lu', lu, 'ser', ser, 'er', er, 'rv', rv, 'qn', ARGV[13], 'qt', now)\n"
    "redis.call('PEXPIREAT', K_TX, math.max(now + KEEP, fu, nf, ra, lu, me.hu) + MARGIN)\n"
    "redis.call('ZADD', K_BUDGET, now, ARGV[13])\n" /* the read's name on its host (budget_member) */
    "redis.call('PUBLISH', ARGV[14], MSG_READ .. ' ' .. ARGV[15] .. ' ' .. ARGV[13])\n" /* every host counts it too */
    "redis.call('PEXPIRE', K_BUDGET, MARK_KEEP)\n"
    "for _, t in ipairs(tiers) do\n" /* in flight for each tier until its lease ends */
    "  local kf = KEYS[t.base + 2]\n"
    "  redis.call('ZADD', kf, lu, ARGV[5])\n"
    "  local px = redis.call('PTTL', kf)\n"
    "  if px < 0 or now + px < lu + MARGIN then redis.call('PEXPIREAT', kf, lu + MARGIN) end\n"
    "end\n"
    /* an id never answered: counted in the 404 quarter until its read
     * ends otherwise (finish) or its lease ends (nf_spent) */
    "if not s then\n"
    "  redis.call('ZADD', K_NOT_FOUND, now, 'p:' .. ARGV[13])\n"
    "  redis.call('PEXPIREAT', K_NOT_FOUND, now + BUDGET_SPAN + MARGIN)\n"
    "end\n"
    "follow(K_WAITING, K_WAITERS, ARGV[5])\n"
    "return {W_GO, ser, kind == PLAN_LAST_CHANCE and W_LAST or W_EARLY}\n";

/* A request for the transaction is held on host ARGV[1] (state_hold): the
 * hold as state_hold() makes it, every host's. ARGV: 1 host, 2 the
 * deadline (ms from now), 3 id, 4 budget, 5 '1' to plan, 6 the waiting
 * set's cap, 7 the arrivals' cap, 8 the hold's stamp (state_hold). Returns
 * the transaction's reservation in ms from now (0: due), -1 for none. */
static const char lua_held[] =
    LUA_HEAD LUA_TX LUA_PLAN
    "local me = tx_fields(K_TX)\n"
    "local dl = now + tonumber(ARGV[2])\n"
    "local hu, ho, rv = me.hu, me.ho, me.rv\n"
    "local fresh = plan_fresh_hold(ho, hu, now)\n"
    "if fresh then\n" /* a new holding period; hosts past their deadline may still leave */
    "  hu, rv, ho = 0, 0, redis.call('HLEN', K_HOLDERS)\n"
    "  redis.call('HSET', K_TX, 'wh', 0)\n"
    "  redis.call('ZREM', K_RESERVED, ARGV[3])\n"
    "end\n"
    "local st = redis.call('HGET', K_HOLDERS, ARGV[1])\n"
    "if not st then ho = ho + 1 end\n"
    "if not st or tonumber(st) < tonumber(ARGV[8]) then redis.call('HSET', K_HOLDERS, ARGV[1], ARGV[8]) end\n"
    "if dl > hu then hu = dl end\n"
    "redis.call('HSET', K_TX, 'hu', hu, 'ho', ho, 'rv', rv)\n"
    "keep_until(K_TX, hu + MARGIN)\n"
    "keep_until(K_HOLDERS, hu + MARGIN)\n"
    "me.hu, me.ho = hu, ho\n"
    "if tx_waits(me) and not fresh then\n" /* its score follows the latest deadline, and so do w's and r's lives */
    "  if redis.call('ZSCORE', K_WAITING, ARGV[3]) then\n"
    "    redis.call('ZADD', K_WAITING, hu, ARGV[3])\n"
    "    keep_until(K_WAITING, hu + MARGIN)\n"
    "    keep_until(K_RESERVED, hu + MARGIN)\n"
    "  end\n"
    "elseif tx_waits(me) then\n"
    /* st_waiting_add: the stale ones dropped, added unless the cap waits */
    "  prune_waiting(K_WAITING, K_RESERVED, K_WAITERS)\n"
    "  local others = redis.call('ZCARD', K_WAITING)\n"
    "  if redis.call('ZSCORE', K_WAITING, ARGV[3]) then others = others - 1 end\n"
    "  local added = others < tonumber(ARGV[6])\n"
    "  if added then redis.call('ZADD', K_WAITING, hu, ARGV[3]) end\n"
    "  keep_until(K_WAITING, hu + MARGIN)\n"
    "  redis.call('ZADD', K_ARRIVALS, now, now .. ':' .. ARGV[3])\n"
    "  redis.call('ZREMRANGEBYSCORE', K_ARRIVALS, '-inf', now - PLAN_RATE_LONG_MS)\n"
    "  redis.call('ZREMRANGEBYRANK', K_ARRIVALS, 0, -(tonumber(ARGV[7]) + 1))\n"
    "  redis.call('PEXPIREAT', K_ARRIVALS, now + PLAN_RATE_LONG_MS + MARGIN)\n"
    "  local at = plan_hold_chance(dl, now)\n"
    "  if ARGV[5] == '1' and at > 0 then\n"
    "    local bk = {budget = tonumber(ARGV[4])}\n" /* a full span refuses it without reading the spans */
    "    redis.call('ZREMRANGEBYSCORE', K_BUDGET, '-inf', now - BUDGET_SPAN)\n"
    "    if plan_may_reserve(bk, busiest_at_least(K_BUDGET, K_RESERVED, at, nil))\n"
    "       and plan_may_reserve(bk, busiest_at(K_BUDGET, K_RESERVED, at)) then\n"
    "      rv = at\n"
    "      redis.call('HSET', K_TX, 'rv', rv)\n"
    "      if added then\n" /* the spans count the reservations of the waiting set's */
    "        redis.call('ZADD', K_RESERVED, rv, ARGV[3])\n"
    "        keep_until(K_RESERVED, hu + MARGIN)\n"
    "      end\n"
    "    end\n"
    "  end\n"
    "end\n"
    "follow(K_WAITING, K_WAITERS, ARGV[3], me)\n" /* me: as written above */
    "if rv == 0 then return -1 end\n"
    "return math.max(rv - now, 0)\n";

/* The last request held for the transaction on host ARGV[1] is no longer
 * held (state_unhold). ARGV: 1 host, 2 id, 3 its stamp (state_unhold). A hold of the host stamped
 * later (another process's, on another connection, come first) stays.
 * When no host holds it any more its reservation goes (nobody is left to
 * use it). */
static const char lua_left[] =
    LUA_HEAD LUA_TX
    "local st = tonumber(redis.call('HGET', K_HOLDERS, ARGV[1]))\n"
    "if not st or st > tonumber(ARGV[3]) then return 0 end\n"
    "if redis.call('HDEL', K_HOLDERS, ARGV[1]) == 1 and redis.call('EXISTS', K_TX) == 1 then\n"
    "  local ho = (tonumber(redis.call('HGET', K_TX, 'ho')) or 1) - 1\n"
    "  if ho <= 0 then\n"
    "    redis.call('HSET', K_TX, 'ho', 0, 'rv', 0)\n"
    "    redis.call('ZREM', K_WAITING, ARGV[2])\n"
    "    redis.call('ZREM', K_RESERVED, ARGV[2])\n"
    "  else\n"
    "    redis.call('HSET', K_TX, 'ho', ho)\n"
    "  end\n"
    "end\n"
    "follow(K_WAITING, K_WAITERS, ARGV[2])\n"
    "return 1\n";

/* A final status or a 404 cached: the transaction no longer waits
 * (tx_waits), it leaves the key's waiting set, its reservations and the
 * waiting ones' fields (kw, kr, kv). */
#define LUA_UNWAIT                                                                         \
    "local function unwait(kw, kr, kv, id)\n"                                              \
    "  local hd = held()\n"                                                                \
    "  if hd == RULES_HELD_FINAL or hd == RULES_HELD_NOT_FOUND then\n"                     \
    "    redis.call('ZREM', kw, id)\n"                                                     \
    "    redis.call('ZREM', kr, id)\n"                                                     \
    "    redis.call('HDEL', kv, id)\n"                                                     \
    "  end\n"                                                                              \
    "end\n"

/* A read's end. After its keys (scripts[]), for each of the client's
 * tiers (as the claim's) its block, its 404s and its reads in flight. ARGV: 1 serial, 2 sent_ms, 3 word, 4 final, 5 ttl,
 *       6 not_found, 7 nf ttl, 8 charge, 9 retry_ms, 10 key_pause_ms, 11
 *       waits, 12 id, 13 channel, 14 rkey, 15 the client's tiers' names
 *       ("C,C56,C48"; '-': none), 16 each tier's 404s that block
 *       ("5,10,20"), 17 their window (ms), 18 the block (ms). Returns 1
 *       when this started a block of any tier. */
static const char lua_finish[] =
    LUA_HEAD LUA_TX LUA_FORWARD LUA_PUBLISH LUA_UNWAIT
    "local known = s\n" /* before this read's outcome */
    /* the floor at Kasera counts from any read's end */
    "le = now\n"
    "redis.call('HSET', K_TX, 'le', le)\n"
    /* the 404 quarter: this read no longer under way; counted on if it
     * ended 404 (any id's, as st_budget_not_found) */
    "if ARGV[1] ~= '0' and tonumber(ARGV[1]) == ser then\n"
    "  local q = redis.call('HMGET', K_TX, 'qn', 'qt')\n"
    "  if q[1] then\n"
    "    redis.call('ZREM', K_NOT_FOUND, 'p:' .. q[1])\n"
    "    if ARGV[6] == '1' and tonumber(q[2]) > now - BUDGET_SPAN then\n"
    "      redis.call('ZADD', K_NOT_FOUND, tonumber(q[2]), q[1])\n"
    "      redis.call('PEXPIREAT', K_NOT_FOUND, tonumber(q[2]) + BUDGET_SPAN + MARGIN)\n"
    "    end\n"
    "    redis.call('HDEL', K_TX, 'qn', 'qt')\n"
    "  end\n"
    "end\n"
    "local serial = tonumber(ARGV[1])\n"
    "local current = rules_read_current(serial, ser, lu, now)\n"
    "if serial ~= 0 and serial == ser and lu > 0 then\n" /* its lease ends */
    "  if current then ls = ls + tonumber(ARGV[2]) end\n" /* the pace counts from when it went out */
    "  lu = 0\n"
    "  redis.call('HDEL', K_TX, 'lu')\n"
    "  redis.call('HSET', K_TX, 'ls', ls)\n"
    "end\n"
    /* what it found, recorded as the C's finish decides (rules_read_records) */
    "local word, gone, final = ARGV[3], ARGV[6] == '1', ARGV[4] == '1'\n"
    "if word ~= '' or gone then\n"
    "  local fd = {current = current, older = serial < fs, not_found = gone, final = final,\n"
    "              forward = word ~= '' and forward(s, word), known = not not s, known_final = not not (s and R[s]),\n"
    "              final_cached = not not (s and R[s] and fu > now), nf_cached = nf > now}\n"
    "  if rules_read_records(fd) then\n"
    "    if gone then\n"
    "      nf = now + tonumber(ARGV[7])\n"
    "      redis.call('HSET', K_TX, 'nf', nf)\n"
    "    else\n"
    "      s, fu, nf = word, final and now + tonumber(ARGV[5]) or 0, 0\n"
    "      redis.call('HSET', K_TX, 's', s, 'fu', fu)\n"
    "      redis.call('HDEL', K_TX, 'nf')\n"
    "    end\n"
    "    if serial > fs then\n"
    "      fs = serial\n"
    "      redis.call('HSET', K_TX, 'fs', fs)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "local kp = tonumber(redis.call('HGET', K_KEY, 'p')) or 0\n"
    "local rw, kw = tonumber(ARGV[9]), tonumber(ARGV[10])\n"
    "if kw > 0 and now + kw > kp then\n"
    "  kp = now + kw\n"
    "  redis.call('HSET', K_KEY, 'p', kp)\n"
    "  redis.call('PEXPIREAT', K_KEY, kp + MARGIN)\n"
    "end\n"
    "if rw > 0 and now + rw > ra then\n"
    "  ra = now + rw\n"
    "  redis.call('HSET', K_TX, 'ra', ra)\n"
    "end\n"
    "local blocked = 0\n"
    "local names, lim = {}, {}\n"
    "for x in string.gmatch(ARGV[15], '%x+') do names[#names + 1] = x end\n"
    "for x in string.gmatch(ARGV[16], '%d+') do lim[#lim + 1] = tonumber(x) end\n"
    "for i = 1, math.floor((#KEYS - FIXED_KEYS) / 3) do\n" /* each tier: block, 404s, in flight */
    "  local b = FIXED_KEYS + 3 * i - 2\n"
    "  local kx, kc, kf = KEYS[b], KEYS[b + 1], KEYS[b + 2]\n"
    "  redis.call('ZREM', kf, ARGV[12])\n" /* no longer in flight */
    "  local bl = redis.call('PTTL', kx)\n"
    "  if ARGV[8] == '1' and not known and bl <= 0 then\n" /* charged (none while blocked) */
    "    local win, blk = tonumber(ARGV[17]), tonumber(ARGV[18])\n"
    "    redis.call('ZADD', kc, now, ARGV[12])\n"
    "    redis.call('ZREMRANGEBYSCORE', kc, '-inf', now - win)\n"
    "    redis.call('PEXPIREAT', kc, now + win)\n"
    "    if rules_client_blocks(bl > 0 and now + bl or 0, redis.call('ZCARD', kc), lim[i], now) then\n"
    "      redis.call('SET', kx, '1', 'PX', blk)\n"
    "      redis.call('DEL', kc)\n" /* its 404s start again after the block */
    "      blocked = 1\n"
    "      redis.call('PUBLISH', ARGV[13], MSG_BLOCK .. ' ' .. ARGV[14] .. ' ' .. names[i] .. ' ' .. blk)\n"
    "    end\n"
    "  end\n"
    "end\n"
    "unwait(K_WAITING, K_RESERVED, K_WAITERS, ARGV[12])\n"
    "follow(K_WAITING, K_WAITERS, ARGV[12])\n"
    "publish(ARGV[11], ARGV[13], ARGV[14], ARGV[12], kp)\n"
    "return blocked\n";

/* A status told (a notify, or one written back). ARGV: 1 word, 2 final, 3
 * ttl, 4 waits, 5 id, 6 channel, 7 rkey.
 * Returns '' when recorded, else the final status known that stays. */
static const char lua_tell[] =
    LUA_HEAD LUA_TX LUA_FORWARD LUA_PUBLISH LUA_UNWAIT
    "local kept = ''\n"
    /* as state_tell (rules_may_replace, told: the replace table R): a
     * final status only moves forward, pending replaces nothing final */
    "if forward(s, ARGV[1]) then\n"
    "  s, fu, nf = ARGV[1], ARGV[2] == '1' and now + tonumber(ARGV[3]) or 0, 0\n"
    "  redis.call('HSET', K_TX, 's', s, 'fu', fu, 'fs', ser + 1)\n" /* newer than every read started before it */
    "  redis.call('HDEL', K_TX, 'nf')\n"
    "else kept = s end\n"
    "unwait(K_WAITING, K_RESERVED, K_WAITERS, ARGV[5])\n"
    "follow(K_WAITING, K_WAITERS, ARGV[5])\n"
    "publish(ARGV[4], ARGV[6], ARGV[7], ARGV[5], 0)\n"
    "return kept\n";

/* A host's own reads of the span, for the key's count (budget.h: what
 * Redis did not have, after an outage, a stall, a restart or a flush).
 * ARGV: 1 the grace (ms,
 * budget_grace_ms), then pairs of a read's name (budget_member) and its
 * age in ms. A name already counted is not counted again (NX); when any
 * was new, the count is marked whole again and grants nothing for the
 * grace, while the other hosts send theirs.
 * Returns how many were new. */
static const char lua_seed[] =
    "local t = redis.call('TIME')\n"
    "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)\n"
    "local added = 0\n"
    "for i = 2, #ARGV - 1, 2 do\n"
    "  local at = now - tonumber(ARGV[i + 1])\n"
    "  if at > now - BUDGET_SPAN then added = added + redis.call('ZADD', K_BUDGET, 'NX', at, ARGV[i]) end\n"
    "end\n"
    "if added > 0 then\n"
    "  redis.call('ZADD', K_BUDGET, '+inf', '~')\n"
    "  redis.call('PEXPIRE', K_BUDGET, MARK_KEEP)\n"
    "  redis.call('SET', K_GRACE, '1', 'PX', ARGV[1])\n"
    "end\n"
    "return added\n";

/* ---- the keys: each kind once, each script's by kind ---- */

/* What each kind of key is named (VPREFIX{K}WHAT, then the id for a
 * transaction's, a client tier's name for a client's: state_redis_key) and
 * the local the scripts know it by. */
static const struct {
    const char *what;
    const char *lua;
} kinds[RK_N] = {
    [RK_TX] = {"t:", "K_TX"},             /* the transaction's fields */
    [RK_HOLDERS] = {"o:", "K_HOLDERS"},   /* its holders: host -> the newest stamp of its holds */
    [RK_KEY] = {"k", "K_KEY"},            /* the key's fields (p: its pause) */
    [RK_BUDGET] = {"b", "K_BUDGET"},      /* the key's count of reads (budget.h) */
    [RK_NOT_FOUND] = {"n", "K_NOT_FOUND"}, /* the 404 quarter */
    [RK_WAITING] = {"w", "K_WAITING"},    /* the waiting transactions, by deadline */
    [RK_WAITERS] = {"v", "K_WAITERS"},    /* their fields, for the plan's walk (LUA_TX) */
    [RK_ARRIVALS] = {"a", "K_ARRIVALS"},  /* the first holds of the last PLAN_RATE_LONG_MS */
    [RK_RESERVED] = {"r", "K_RESERVED"},  /* the reservations, by time */
    [RK_GRACE] = {"g", "K_GRACE"},        /* the count's grace (budget.h) */
};

/* The kinds of a client tier's keys, in the order they follow a script's
 * own: its block, its 404s and its reads in flight. */
static const char *const tier_whats[3] = {"x:", "c:", "f:"};

/* Each script: its text, its keys by kind (KEYS[1..n], named by the
 * locals the script text declares), whether a client's tiers' keys follow
 * them (FIXED_KEYS is then where they start), whether it paces and plans
 * (plan_lua). */
static const struct {
    const char *name;
    const char *body;
    enum rkey_kind keys[10];
    int nkeys;
    bool tiers, plans;
} scripts[SCRIPT_N] = {
    [SCRIPT_CLAIM] = {"claim", lua_claim,
                      {RK_TX, RK_KEY, RK_BUDGET, RK_NOT_FOUND, RK_WAITING, RK_ARRIVALS, RK_RESERVED, RK_GRACE, RK_WAITERS},
                      9, true, true},
    [SCRIPT_FINISH] = {"finish", lua_finish, {RK_TX, RK_KEY, RK_WAITING, RK_RESERVED, RK_NOT_FOUND, RK_WAITERS}, 6, true,
                       true},
    [SCRIPT_TELL] = {"tell", lua_tell, {RK_TX, RK_WAITING, RK_RESERVED, RK_WAITERS}, 4, false, true},
    [SCRIPT_HELD] = {"held", lua_held, {RK_TX, RK_HOLDERS, RK_WAITING, RK_ARRIVALS, RK_BUDGET, RK_RESERVED, RK_WAITERS},
                     7, false, true},
    [SCRIPT_LEFT] = {"left", lua_left, {RK_TX, RK_HOLDERS, RK_WAITING, RK_RESERVED, RK_WAITERS}, 5, false, true},
    [SCRIPT_SEED] = {"seed", lua_seed, {RK_BUDGET, RK_GRACE}, 2, false, false},
};

const char *state_redis_script_name(int script)
{
    return script >= 0 && script < SCRIPT_N ? scripts[script].name : NULL;
}

int state_redis_script_keys(int script, const char *vprefix, const struct state_redis_id *k, const char *id,
                            const struct state_redis_client *client, char names[][STATE_REDIS_KEY_MAX])
{
    int n = 0;
    for (int i = 0; i < scripts[script].nkeys; i++) {
        enum rkey_kind kind = scripts[script].keys[i];
        bool per_id = kind == RK_TX || kind == RK_HOLDERS;
        state_redis_key(names[n++], STATE_REDIS_KEY_MAX, vprefix, k, kinds[kind].what, per_id ? id : NULL);
    }
    for (int t = 0; scripts[script].tiers && client != NULL && t < client->n && t < STATE_CLIENT_TIERS; t++)
        for (int w = 0; w < 3; w++)
            state_redis_key(names[n++], STATE_REDIS_KEY_MAX, vprefix, k, tier_whats[w], client->tier[t].hex);
    return n;
}

/* "local K_TX, K_KEY = KEYS[1], KEYS[2]\nlocal FIXED_KEYS = 2\n" for the
 * script's keys, into buf; its length, or -1 when it does not fit. */
static int key_locals(int script, char *buf, size_t len)
{
    size_t at = 0;
    int nk = scripts[script].nkeys;
    for (int i = 0; i < 2 * nk + 1; i++) {
        int n;
        if (i < nk)
            n = snprintf(buf + at, len - at, "%s%s", i == 0 ? "local " : ", ", kinds[scripts[script].keys[i]].lua);
        else if (i < 2 * nk)
            n = snprintf(buf + at, len - at, "%sKEYS[%d]", i == nk ? " = " : ", ", i - nk + 1);
        else
            n = snprintf(buf + at, len - at, "\nlocal FIXED_KEYS = %d\n", nk);
        if (n < 0 || (size_t)n >= len - at)
            return -1;
        at += (size_t)n;
    }
    return (int)at;
}

char *state_redis_script_text(int script)
{
    const char *body = scripts[script].body;
    char prelude[2048], plan[PLAN_LUA_MAX] = "", locals[512], letters[STATE_REDIS_MSG_LUA_MAX];
    int n = rules_lua_prelude(prelude, sizeof prelude);
    int m = scripts[script].plans ? plan_lua(plan, sizeof plan) : 0;
    int q = key_locals(script, locals, sizeof locals);
    int r = state_redis_msg_lua(letters, sizeof letters);
    if (n < 0 || m < 0 || q < 0 || r < 0)
        return NULL;
    size_t len = (size_t)n + (size_t)m + (size_t)q + (size_t)r + strlen(body) + 1;
    char *t = malloc(len);
    if (t != NULL)
        snprintf(t, len, "%s%s%s%s%s", prelude, plan, letters, locals, body);
    return t;
}
