"""The budget plan decided alike in C and in Redis's Lua (issue 16: where
Redis decides on its side, its Lua decides exactly what plan.c does).

plan_lua() (plan.h) gives plan.c's functions in Lua, as contrib/c2lua.py
translates them from the C, with plan.c's constants written in by the C. This test runs that Lua, as
tests/unit/plan-lua prints it, on a real redis-server (EVAL, Redis's own
Lua 5.1) for every case of tests/unit/plan_vectors.txt and asserts the
answer the file gives, the one tests/unit/test_plan.c asserts of plan.c:
one table, both versions, case by case."""

import os
import re
import subprocess

import testenv
from testenv import assert_eq

# Test code only: the case's fields into the tables plan_lua()'s functions
# take (an absent field is 0, a boolean 0 or 1, as the file says), then the
# function the case names.
DRIVER = r"""
local op, k, t, ev = ARGV[1], {}, {}, {}
for _, f in ipairs({'budget', 'recent', 'schedule_reads', 'demand', 'busiest', 'busiest_late',
                    'arrivals', 'arrivals_long', 'eligible', 'hold_ms'}) do k[f] = 0 end
for _, f in ipairs({'resv_at', 'next_gap', 'early_reads'}) do t[f] = 0 end
k.starved, t.reserved, t.drifted = false, false, false
local waiting = false
local w, ws, withheld = {reads = 0, last_start = 0, hold_until = 0, busy_until = 0, not_before = 0}, {n = 0, wait_ms = {}}, false
local now, at, tt, from, thins, recheck, nev = 0, 0, 0, -math.huge, math.huge, 0, 0
local first_short, first_long = math.huge, math.huge
local x = {holders = 0, cached_until = 0, floor_until = 0}
local probe, cap, free_at = {}, 0, 0
local last_end, key_paused_until = 0, 0
local n = {final_until = 0, nf_until = 0, blocked_until = 0, first_flight_end = 0, counted = 0, allowance = 0,
           used = 0, nth_newest = 0, serial = 0, latest_serial = 0, lease_until = 0, deadline = 0}
local found = {current = false, older = false, not_found = false, final = false, forward = false, known = false,
               known_final = false, final_cached = false, nf_cached = false}
for i = 2, #ARGV do
  local name, val = string.match(ARGV[i], '^([%w_]+)=(.*)$')
  if name == 'ev' then
    for x in string.gmatch(val, '-?%d+') do ev[nev] = tonumber(x); nev = nev + 1 end
  elseif name == 'ws' then
    for x in string.gmatch(val, '-?%d+') do ws.wait_ms[ws.n] = tonumber(x); ws.n = ws.n + 1 end
  elseif name == 'probe' then
    local i = 0
    for b in string.gmatch(val, '%d+') do probe[i] = b ~= '0'; i = i + 1 end
  elseif name == 'cap' then cap = tonumber(val)
  elseif name == 'free_at' then free_at = tonumber(val)
  elseif name == 'last_end' then last_end = tonumber(val)
  elseif name == 'key_paused_until' then key_paused_until = tonumber(val)
  elseif name == 'withheld' then withheld = val == '1'
  elseif name == 'waiting' then waiting = val == '1'
  elseif name and n[name] ~= nil then n[name] = tonumber(val)
  elseif name and found[name] ~= nil then found[name] = val == '1'
  elseif name and w[name] ~= nil then w[name] = tonumber(val)
  elseif name and x[name] ~= nil then x[name] = tonumber(val)
  elseif name == 'starved' then k.starved = val == '1'
  elseif name == 'reserved' or name == 'drifted' then t[name] = val == '1'
  elseif name == 'now' then now = tonumber(val)
  elseif name == 'at_busiest' then at = tonumber(val)
  elseif name == 't' then tt = tonumber(val)
  elseif name == 'from' then from = tonumber(val)
  elseif name == 'thins' then thins = tonumber(val)
  elseif name == 'recheck' then recheck = tonumber(val)
  elseif name == 'first_short' then first_short = tonumber(val)
  elseif name == 'first_long' then first_long = tonumber(val)
  elseif name and k[name] ~= nil then k[name] = tonumber(val)
  elseif name and t[name] ~= nil then t[name] = tonumber(val)
  else return redis.error_reply('unknown field ' .. tostring(ARGV[i])) end
end
if op == 'late_span' then return tostring(plan_late_span(k)) end
if op == 'headroom' then return tostring(plan_headroom(k)) end
if op == 'room' then return tostring(plan_room(k)) end
if op == 'reserve' then return plan_may_reserve(k, at) and '1' or '0' end
local function thinning(th) if th == math.huge then return 'none' end return tostring(th) end
if op == 'busiest' then return tostring(plan_busiest(ev, nev, tt, from)) end
if op == 'read' then return ({[PLAN_NO] = 'no', [PLAN_EARLY] = 'early', [PLAN_LAST_CHANCE] = 'last'})[plan_may_read(k, t, now)] end
if op == 'arrivals' then
  local th = plan_arrivals(k, ev, nev, now)
  return k.arrivals .. ',' .. k.arrivals_long .. ',' .. thinning(th)
end
if op == 'arrival_rate' then
  local th = plan_arrival_rate(k, k.arrivals, first_short, k.arrivals_long, first_long)
  return k.arrivals .. ',' .. k.arrivals_long .. ',' .. thinning(th)
end
if op == 'retry' then return tostring(plan_retry(t, ev, nev, thins, recheck, now)) end
if op == 'demand' then return tostring(plan_demand(ws, w, now)) end
if op == 'ready' then return plan_ready(ws, w, now) and '1' or '0' end
if op == 'gap' then return tostring(plan_next_gap(ws, w.reads)) end
if op == 'next_read' then
  local nx = {}
  rules_next_read(ws, {reads = w.reads, last_start = w.last_start, last_end = last_end, not_before = w.not_before,
                       key_paused_until = key_paused_until}, now, nx)
  local why = ({[RULES_WHY_PACE] = 'pace', [RULES_WHY_RETRY] = 'retry', [RULES_WHY_KEY_PAUSE] = 'key'})[nx.why] or 'none'
  return nx.at .. ',' .. why
end
if op == 'nf_free' then return tostring(rules_nf_free(ev, probe, nev, cap, recheck, now)) end
if op == 'nf_until' then return tostring(rules_nf_until(free_at, x.holders, w.hold_until, t.resv_at, now)) end
if op == 'waits' or op == 'waiter' then
  x.reads, x.last_start, x.hold_until, x.busy_until, x.not_before = w.reads, w.last_start, w.hold_until, w.busy_until, w.not_before
  if op == 'waits' then return plan_waits(x, now) and '1' or '0' end
  local o = {}
  plan_waiter_of(x, o)
  return o.reads .. ',' .. o.last_start .. ',' .. o.hold_until .. ',' .. o.busy_until .. ',' .. o.not_before
end
if op == 'held' then
  return ({[RULES_HELD_NONE] = 'none', [RULES_HELD_FINAL] = 'final', [RULES_HELD_NOT_FOUND] = 'nf',
           [RULES_HELD_BUSY] = 'busy'})[rules_held(n.final_until, n.nf_until, w.busy_until, now)]
end
if op == 'client_next' then
  return tostring(rules_client_next(n.counted, n.first_flight_end, n.allowance, recheck, now))
end
if op == 'client_blocked' then return tostring(rules_client_blocked(ev, nev, now)) end
if op == 'client_blocks' then return rules_client_blocks(n.blocked_until, n.counted, n.allowance, now) and '1' or '0' end
if op == 'budget_free' then return tostring(rules_budget_free(n.used, k.budget, n.nth_newest, now)) end
if op == 'read_current' then return rules_read_current(n.serial, n.latest_serial, n.lease_until, now) and '1' or '0' end
if op == 'read_records' then return rules_read_records(found) and '1' or '0' end
if op == 'tx_fill' then
  local o = {}
  plan_tx_fill(ws, waiting, t.resv_at, w.reads, t.early_reads, withheld, now, o)
  return (o.reserved and '1' or '0') .. ',' .. o.resv_at .. ',' .. o.early_reads .. ',' .. o.next_gap .. ',' ..
         (o.drifted and '1' or '0')
end
if op == 'fresh_hold' then return plan_fresh_hold(x.holders, w.hold_until, now) and '1' or '0' end
if op == 'hold_chance' then return tostring(plan_hold_chance(n.deadline, now)) end
if op == 'later_chance' then return tostring(plan_later_chance(x.holders, w.hold_until, now)) end
if op == 'drifted' then return plan_drifted(ws, t.resv_at, w.reads, withheld, now) and '1' or '0' end
return redis.error_reply('unknown op ' .. op)
"""


def vectors():
    """The cases: (line, op, [FIELD=VALUE ...], answer)."""
    out = []
    with open(os.path.join(testenv.top_srcdir(), "tests", "unit", "plan_vectors.txt")) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            case, want = line.split("->")
            words = case.split()
            out.append((line, words[0], words[1:], want.strip()))
    return out


def plan_lua():
    exe = os.path.join(testenv.top_builddir(), "tests", "unit", "plan-lua")
    return subprocess.run([exe], check=True, capture_output=True, text=True).stdout


@testenv.timeout(60)
def test_the_lua_plan_decides_every_case_as_plan_c(tmpdir):
    redis = testenv.Redis(tmpdir)
    script = plan_lua() + DRIVER
    cases = vectors()
    assert len(cases) >= 30, "the shared table has %d cases" % len(cases)
    assert_eq(sorted({c[1] for c in cases}), ["arrival_rate", "arrivals", "budget_free", "busiest", "client_blocked", "client_blocks",
                                              "client_next", "demand", "drifted", "fresh_hold", "gap", "headroom", "held",
                                              "hold_chance", "late_span", "later_chance", "next_read", "nf_free",
                                              "nf_until", "read", "read_current", "read_records", "ready", "reserve",
                                              "retry", "room", "tx_fill", "waiter", "waits"])
    wrong = []
    with redis.client() as c:
        for line, op, fields, want in cases:
            got = c.cmd("EVAL", script, "0", op, *fields)
            if got != want:
                wrong.append("Lua answers %s to: %s" % (got, line))
    assert_eq(wrong, [])


@testenv.timeout(60)
def test_the_lua_plan_has_no_number_of_its_own(tmpdir):
    # plan.c's constants are written in by the C: the Lua's functions (after
    # the line that names them) hold no number but 0 and 1
    body = plan_lua().split("\n", 1)[1]
    assert_eq(sorted(set(re.findall(r"\b\d+\b", body))), ["0", "1"])


def c2lua():
    import importlib.util
    path = os.path.join(testenv.top_srcdir(), "contrib", "c2lua.py")
    spec = importlib.util.spec_from_file_location("c2lua", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@testenv.timeout(60)
def test_c2lua_refuses_the_c_that_lua_would_read_otherwise(tmpdir):
    # what Lua would decide differently is refused, with the place: an int
    # as a condition (Lua holds 0 true), a ?: whose first branch may be
    # false, a continue (Lua 5.1 has none), a name that is a word of Lua's
    mod = c2lua()
    cases = {
        "int f(int n)\n{\n    if (n)\n        return 1;\n    return 0;\n}\n": "not a truth value",
        "bool f(bool a, int n)\n{\n    return n > 0 ? a : false;\n}\n": "must be a number",
        "int f(int n)\n{\n    for (int i = 0; i < n; i++)\n        continue;\n    return 0;\n}\n": "continue",
        "int f(int end)\n{\n    return end + 1;\n}\n": "word of Lua's",
        "bool f(int n)\n{\n    return n;\n}\n": "not a truth value",
        "int f(int a, int b)\n{\n    return a + (a > b);\n}\n": "where C would count it as 0 or 1",
        "int f(int a)\n{\n    return g(a);\n}\n": "not translated before it",
        "int f(int a)\n{\n    return a + 010;\n}\n": "octal",
    }
    for src, why in cases.items():
        f = mod.functions("t.c", src)["f"]
        try:
            mod.Translator(f, set(), set(), set()).function()
        except mod.Refused as e:
            assert why in str(e) and "t.c:" in str(e), str(e)
        else:
            raise AssertionError("c2lua translated: %s" % src)
    # and what it takes it translates: C's division truncates, a block is
    # a scope, a loop's step is the loop's, a break leaves the loop
    src = ("int f(int a, int b)\n{\n    return a / b;\n}\n"
           "int g(int a)\n{\n    int x = 1;\n    {\n        int x = 2;\n        a += x;\n    }\n    return a + x;\n}\n"
           "int h(int n)\n{\n    int s = 0;\n    for (int i = 0; i < n; i++) {\n        int i = 100;\n"
           "        s += i;\n        if (s > 250)\n            break;\n        s += 1;\n    }\n    return s;\n}\n")
    funcs = mod.functions("t.c", src)
    lua = mod.C_DIV + "".join(mod.Translator(funcs[n], set(), set(), set()).function() for n in "fgh")
    redis = testenv.Redis(tmpdir)
    with redis.client() as c:
        got = c.cmd("EVAL", lua + "return {f(7, 2), f(-7, 2), f(6, 3), g(0), h(5)}", "0")
        assert_eq(got, [3, -3, 2, 3, 302])


if __name__ == "__main__":
    testenv.run(globals())
