"""make bench, flash sale: one shop, the default budget (120 reads a minute),
buyers coming back over 10 s, each payment turning succeeded at a random
moment 1 to 25 s after its buyer arrived. kembali with its plan against the
seed's greedy order (read_planning false), 1 and 4 processes (on one
state_dir, buyers spread over them), real sandbox, real reads.

Per case: buyers who saw succeeded and checking, reads at the sandbox, the
most reads in any 60 s, and the median and 90th percentile of the delay
between a payment succeeding and its buyer seeing it. Also the uncontended
case: one buyer, its reads must come at 0, 1.5, 3.5, 6.5, 11.5, 19.5, 32.5 s."""

import os
import random
import threading
import time

import testenv
import kit

SIZES = (20, 40, 80, 150)


def _percentile(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def run_case(tmp, n, procs, planning, seed=1, spread=10.0):
    """One rush; returns a dict of figures."""
    d = os.path.join(tmp, "flash-%d-%d-%s" % (n, procs, "plan" if planning else "greedy"))
    os.makedirs(d, exist_ok=True)
    sb, ks = kit.start_many(d, procs, schedule=None, top={"read_planning": planning})
    rnd = random.Random(seed)
    buyers = sorted((rnd.uniform(0, spread), rnd.uniform(1.0, 25.0)) for _ in range(n))
    results = [None] * n
    t0 = time.monotonic()

    def buyer(i, at, pays_after):
        time.sleep(max(0.0, t0 + at - time.monotonic()))
        tx = "fs%d" % i
        sb.put_tx(tx, [(0, "pending"), (int(pays_after * 1000), "succeeded")])
        paid = time.monotonic() + pays_after
        r = ks[i % procs].get("id=" + tx, timeout=60)
        results[i] = (r.header("kembali-status"), time.monotonic() - paid)

    th = [threading.Thread(target=buyer, args=(i, at, p)) for i, (at, p) in enumerate(buyers)]
    for t in th:
        t.start()
    for t in th:
        t.join(90)
    reads = sb.reads()
    starts = sorted(r["t_ms"] for r in reads)
    busiest = max((sum(1 for t in starts if s <= t < s + 60000) for s in starts), default=0)
    words = [w for w, _ in filter(None, results)]
    delays = [dl for w, dl in filter(None, results) if w == "succeeded"]
    for k in ks:
        k.stop()
    sb.stop()
    return {"n": n, "procs": procs, "planning": planning, "saw": words.count("succeeded"),
            "checking": words.count("checking"), "other": len(words) - words.count("succeeded") - words.count("checking"),
            "lost": n - len(words), "reads": len(reads), "busiest": busiest,
            "median": _percentile(delays, 0.5), "p90": _percentile(delays, 0.9)}


def uncontended(tmp):
    d = os.path.join(tmp, "flash-one")
    os.makedirs(d, exist_ok=True)
    sb, ks = kit.start_many(d, 1, schedule=None)
    sb.put_tx("one", "pending")
    ks[0].get("id=one", timeout=60)
    starts = [r["t_ms"] for r in sb.reads("one")]
    ks[0].stop()
    sb.stop()
    return [round((t - starts[0]) / 1000, 3) for t in starts]


def run(tmp, sizes=SIZES):
    """Every case at once (each its own sandbox and kembali processes: they
    mostly wait), then the uncontended one beside them."""
    cases = [(n, p, plan) for n in sizes for p in (1, 4) for plan in (False, True)]
    out = [None] * len(cases)
    one = {}
    th = [threading.Thread(target=lambda i=i, c=c: out.__setitem__(i, run_case(tmp, *c))) for i, c in enumerate(cases)]
    th.append(threading.Thread(target=lambda: one.setdefault("reads", uncontended(tmp))))
    for t in th:
        t.start()
    for t in th:
        t.join(180)
    return [c for c in out if c], one.get("reads")
