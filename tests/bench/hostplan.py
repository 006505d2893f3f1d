"""make bench, a flash sale across hosts: is Redis's plan worth its cost?

Three kembali hosts (each its own state_dir), one shop, the default budget
(120 reads a minute), the flash sale's buyers (flash.py: coming back over
10 s, each payment succeeding 1 to 25 s after its buyer came back), each
buyer on one host, the hosts chosen round-robin or skewed 70/20/10 (a
load balancer that favours one host). Two ways to share the budget:

  - "redis plan": the hosts on one real redis-server, which decides every
    read over every host's held buyers (the claim script's plan);
  - "own share": each host planning alone over its share of the budget
    (redis_hosts 3: 40 reads a minute each), what kembali does while Redis
    is unreachable; here Redis is configured at an address nobody listens
    on, so every host runs that way throughout.

Per case: the buyers who saw succeeded, the reads at the sandbox and the
most in any 60 s. The plan's gain is the difference in buyers served."""

import os
import random
import socket
import threading
import time

import testenv
import kit

SIZES = (40, 80, 150)
SPREADS = ("round-robin", "70/20/10")
HOSTS = 3


def _host_of(spread, i, rnd):
    if spread == "round-robin":
        return i % HOSTS
    u = rnd.random()
    return 0 if u < 0.7 else 1 if u < 0.9 else 2


def _dead_redis_url():
    """A TCP address on loopback that nobody listens on (a port bound, then
    released without listening: connecting is refused at once)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return "redis://127.0.0.1:%d" % port


def run_case(tmp, n, spread, redis, seed=1, window=10.0):
    """One rush; redis: a testenv.Redis (the plan across hosts) or None (each
    host its own share). Returns a dict of figures."""
    mode = "redis plan" if redis is not None else "own share"
    d = os.path.join(tmp, "hostplan-%d-%s-%s" % (n, spread.replace("/", "-"), mode.replace(" ", "-")))
    os.makedirs(d, exist_ok=True)
    # a prefix per case: the cases side by side on one Redis share no budget
    top = {"redis_hosts": HOSTS, "redis_prefix": "kembali-%s:" % os.path.basename(d)}
    url = redis.unix_url() if redis is not None else _dead_redis_url()
    sb, ks = kit.start_hosts(d, HOSTS, url, schedule=None, top=top)
    if redis is not None:
        for k in ks:
            k.wait_log(10, event="redis_joined")
    rnd = random.Random(seed)
    buyers = sorted((rnd.uniform(0, window), rnd.uniform(1.0, 25.0)) for _ in range(n))
    hrnd = random.Random(seed + 1)
    host = [_host_of(spread, i, hrnd) for i in range(n)]
    results = [None] * n
    prefix = "hp%d%s%s" % (n, spread[0], "r" if redis is not None else "o")
    t0 = time.monotonic()

    def buyer(i, at, pays_after):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        tx = "%s-%d" % (prefix, i)
        sb.put_tx(tx, [(0, "pending"), (int(pays_after * 1000), "succeeded")])
        r = ks[host[i]].get("id=" + tx, timeout=60)
        results[i] = r.header("kembali-status")

    th = [threading.Thread(target=buyer, args=(i, at, p)) for i, (at, p) in enumerate(buyers)]
    try:
        for t in th:
            t.start()
        for t in th:
            t.join(90)
        starts = sorted(r["t_ms"] for r in sb.reads())
    finally:
        for k in ks:
            k.stop()
        sb.stop()
    busiest = max((sum(1 for t in starts if s <= t < s + 60000) for s in starts), default=0)
    return {"n": n, "spread": spread, "mode": mode, "saw": results.count("succeeded"),
            "checking": results.count("checking"), "other": n - results.count("succeeded") - results.count("checking"),
            "per_host": [host.count(h) for h in range(HOSTS)], "reads": len(starts), "busiest": busiest}


def run(tmp, sizes=SIZES):
    """Every case (both modes, both spreads, every size), side by side: they
    mostly wait. Redis's cases share one redis-server (their transactions'
    names differ). Returns the case dicts, or [{"skipped": why}]."""
    rdir = os.path.join(tmp, "hostplan-redis")
    os.makedirs(rdir, exist_ok=True)
    try:
        redis = testenv.Redis(rdir)
    except Exception as e:  # noqa: BLE001 - reported as skipped
        return [{"skipped": str(e)}]
    cases = [(n, s, r) for n in sizes for s in SPREADS for r in (redis, None)]
    out = [None] * len(cases)
    try:
        th = [threading.Thread(target=lambda i=i, c=c: out.__setitem__(i, run_case(tmp, *c)))
              for i, c in enumerate(cases)]
        for t in th:
            t.start()
        for t in th:
            t.join(240)
    finally:
        redis.stop()
    return [c for c in out if c]


def print_table(cases, table):
    """cases: run()'s; table: bench.py's table()."""
    print("Flash sale across %d hosts: one shop, budget 120, buyers over 10 s, each paying 1 to 25 s after "
          "coming back; Redis's plan over every host against each host planning alone over its share (40):"
          % HOSTS)
    if cases and "skipped" in cases[0]:
        print("  skipped: %s" % cases[0]["skipped"])
        return
    rows = []
    by = {(c["n"], c["spread"], c["mode"]): c for c in cases}
    for c in sorted(cases, key=lambda c: (c["n"], SPREADS.index(c["spread"]), c["mode"])):
        other = by.get((c["n"], c["spread"], "own share" if c["mode"] == "redis plan" else "redis plan"))
        gain = ""
        if c["mode"] == "redis plan" and other is not None:
            gain = "%+.0f points" % (100.0 * (c["saw"] - other["saw"]) / c["n"])
        rows.append(["%d" % c["n"], c["spread"], "/".join("%d" % x for x in c["per_host"]), c["mode"],
                     "%d" % c["saw"], "%d" % c["checking"], "%d" % c["other"], "%d" % c["reads"],
                     "%d" % c["busiest"], gain])
    table(["buyers", "spread", "per host", "budget shared by", "saw succeeded", "checking", "other", "reads",
           "most in 60 s", "plan's gain"], rows)
    print("  a gain under 5 points in both spreads would not pay for the plan's cost in Redis")
