"""The Redis store's plan, its cost at Redis: the microseconds Redis spends
(INFO commandstats, usec_per_call) on a claim the plan refuses and on a
fresh hold, with N = 0, 64 and 512 (the cap) transactions waiting on one key
in a flash sale: budget 120, the reads of the last 60 s one short of it
(the claim is then the plan's to refuse, not the budget's), arrivals at the
cap in the last second (the headroom takes the whole budget).

The scripts are kembali's own text (tests/unit/redis-scripts prints it,
built with kembali), run with EVALSHA on a private
redis-server on a Unix socket. Not part of `make check`: figures, not
pass/fail. Run by hand, from the build directory:

    make bench-redis    (or: top_builddir=$PWD top_srcdir=.. python3 ../tests/bench/redis_plan.py)

The keys and arguments are those of this version's scripts (the printer
gives the keys): to measure another version, run its own bench.

A fresh hold's cost is measured on ids held once each (the hold's cleanup
runs as EVAL, which commandstats counts apart from EVALSHA)."""

import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))

import testenv  # noqa: E402

BUDGET = 120
WAITS = "0,1500,2000,3000,5000,8000,13000"  # the default schedule
HOLD_MS = 34000                            # its sum plus the grace
SCHEDULE_READS = 7
CAP = 512
ARRIVALS_CAP = 64
CALLS = 200   # per round
ROUNDS = 5    # the median round's figure: other work on the machine comes and goes
K = "bench:{k}"

# Test set-up only: undo one fresh hold of ARGV[1] (KEYS: tx, holders,
# waiting, reservations, the waiting ones' fields).
UNDO = """
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return 1
"""


def script(name):
    return testenv.redis_script_text(name)


def keys(name, i):
    """The keys kembali passes script `name` for transaction i (no client)."""
    return testenv.redis_script_keys(name, "bench:", "k", i)


def hold(c, sha, text, i, host="h1"):
    ks = keys("held", i)
    return c.cmd("EVALSHA", sha, str(len(ks)), *ks, host, str(HOLD_MS), str(i), str(BUDGET), "1",
                 str(CAP), str(ARRIVALS_CAP), str(i))


def claim(c, sha, text, i):
    ks = keys("claim", i)
    return c.cmd("EVALSHA", sha, str(len(ks)), *ks, WAITS, str(BUDGET), "10000", "0", str(i), "1",
                 str(CAP), "5,10,20", "600000", "250", str(HOLD_MS), str(SCHEDULE_READS), "h1:%d" % i, "bench:wake",
                 "k", "0", "2000", str(max(BUDGET // 4, 1)))


def usec(c, name):
    for line in c.cmd("INFO", "commandstats").splitlines():
        if line.startswith("cmdstat_%s:" % name):
            f = dict(kv.split("=") for kv in line.split(":", 1)[1].split(","))
            return float(f["usec_per_call"]), int(f["calls"])
    return None, 0


def case(redis, n, sha, text):
    with redis.client() as c:
        c.cmd("FLUSHALL")
        # the waiting transactions, held now (their reservations while the
        # budget has room), then the reads of the last 60 s
        for i in range(1, n + 1):
            hold(c, sha["held"], text["held"], i)
        now = int(c.cmd("TIME")[0]) * 1000
        for j in range(BUDGET - 1):
            t = now - 50000 + j * 400
            c.cmd("ZADD", K + "b", str(t), "r%d:1:%d" % (j, t))
        for j in range(ARRIVALS_CAP):  # as many as the hold keeps
            c.cmd("ZADD", K + "a", str(now - j), "%d:x%d" % (now - j, j))
        c.cmd("ZREMRANGEBYRANK", K + "a", "0", str(-(ARRIVALS_CAP + 1)))
        # the asking transaction: held too (one of the n, or its own)
        me = 1 if n > 0 else 100000
        if n == 0:
            hold(c, sha["held"], text["held"], me)
            c.cmd("ZREM", K + "w", str(me))
        claims, holds = [], []
        for _ in range(ROUNDS):
            c.cmd("CONFIG", "RESETSTAT")
            for _ in range(CALLS):
                r = claim(c, sha["claim"], text["claim"], me)
                assert r[0] == "wait" and r[2] == "plan", "the claim is not the plan's to refuse: %r" % (r,)
            us, calls = usec(c, "evalsha")
            assert calls == CALLS
            claims.append(us)
        # fresh holds, each undone (EVAL) before the next
        for rnd in range(ROUNDS):
            c.cmd("CONFIG", "RESETSTAT")
            for i in range(200000 + rnd * CALLS, 200000 + (rnd + 1) * CALLS):
                hold(c, sha["held"], text["held"], i, host="h2")
                c.cmd("EVAL", UNDO, "5", K + "t:%d" % i, K + "o:%d" % i, K + "w", K + "r", K + "v", str(i))
            holds.append(usec(c, "evalsha")[0])
        waiting = c.cmd("ZCARD", K + "w")
    return sorted(claims)[ROUNDS // 2], sorted(holds)[ROUNDS // 2], waiting


def main():
    tmp = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="redis-plan-")
    redis = testenv.Redis(tmp)
    try:
        text = {name: script(name) for name in ("claim", "held")}
        sha = {}
        with redis.client() as c:
            for name in text:
                sha[name] = c.cmd("SCRIPT", "LOAD", text[name])
        print("%8s %8s %18s %18s" % ("waiting", "(in w)", "refused claim us", "fresh hold us"))
        for n in (0, 64, 512):
            claim_us, hold_us, waiting = case(redis, n, sha, text)
            print("%8d %8d %18.1f %18.1f" % (n, waiting, claim_us, hold_us))
    finally:
        redis.stop()


if __name__ == "__main__":
    main()
