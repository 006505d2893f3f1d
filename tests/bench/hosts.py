"""make bench, several hosts: three kembali processes with their own
state_dir on one real redis-server (Unix socket, no persistence), against
the same work on one host (three processes on one state_dir, no Redis):

  - cross-host wake latency: a read made on one host ends, a request held
    on another for the same transaction is answered (its log line against
    the reader's), median and p99 over 30 samples;
  - Redis round trips (kembali's own counter) and kembali CPU per cached
    answer (hot: this host has seen the final status) and per held request;
  - reads and their smallest spacing for 30 tabs (10 per host) on one
    pending transaction (the default schedule: one schedule is 7 reads)."""

import os
import statistics
import threading
import time

import testenv
import kit


def _cpu_s(ks):
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for k in ks:
        with open("/proc/%d/stat" % k.pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def _round_trips(ks):
    return sum(int(k.metrics().get("kembali_redis_round_trips_total", 0)) for k in ks)


def _pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p * (len(xs) - 1))))]


def _wake(sb, ks, n, prefix):
    lat = []
    for i in range(n):
        t = "%s%d" % (prefix, i)
        sb.put_tx(t, "succeeded", responses=[{"delay_ms": 300}])
        a, b = ks[i % len(ks)], ks[(i + 1) % len(ks)]
        out = kit.parallel([lambda: a.get("id=" + t), lambda: (time.sleep(0.1), b.get("id=" + t))[1]])
        assert all(r.header("kembali-status") == "succeeded" for r in out)
        reader = [k for k in (a, b) if k.find_log(event="read", id=t)]
        if len(reader) != 1:
            continue
        waiter = b if reader[0] is a else a
        end = kit.log_time(reader[0].wait_log(5, event="read", id=t))
        lat.append((kit.log_time(waiter.wait_log(5, event="request", id=t)) - end) * 1000)
    return lat


def _case(tmp, name, redis):
    d = os.path.join(tmp, name)
    os.makedirs(d, exist_ok=True)
    if redis is not None:
        sb, ks = kit.start_hosts(d, 3, redis, schedule=None, top={"redis": redis.unix_url()})
        for k in ks:
            k.wait_log(10, event="redis_joined")
    else:
        sb, ks = kit.start_many(d, 3, schedule=None)
    try:
        row = {"name": name}
        lat = _wake(sb, ks, 30, "wk")
        row["wake"] = (statistics.median(lat), _pct(lat, 0.99)) if lat else None
        # cached answers: every host has seen it
        sb.put_tx("hot", "succeeded")
        for k in ks:
            k.get("id=hot")
        rt0, cpu0 = _round_trips(ks), _cpu_s(ks)
        n = 3000
        for i in range(n):
            ks[i % 3].get("id=hot")
        row["cached_rt"] = (_round_trips(ks) - rt0) / n
        row["cached_cpu_us"] = (_cpu_s(ks) - cpu0) / n * 1e6
        # held requests: 30 tabs on a transaction that stays pending
        sb.put_tx("tabs", "pending")
        rt0, cpu0 = _round_trips(ks), _cpu_s(ks)
        kit.parallel([lambda k=k: k.get("id=tabs", timeout=60) for k in ks for _ in range(10)])
        row["held_rt"] = (_round_trips(ks) - rt0) / 30
        row["held_cpu_us"] = (_cpu_s(ks) - cpu0) / 30 * 1e6
        times = kit.read_times(sb, "tabs")
        row["reads"], row["gap"] = len(times), kit.min_gap(times)
        return row
    finally:
        for p in ks + [sb]:
            p.stop()


def run(tmp):
    """Returns the rows (dicts), one host first; a row with "skipped" when
    redis-server is missing."""
    rows = [_case(tmp, "one host, state_dir (3 processes)", None)]
    try:
        os.makedirs(os.path.join(tmp, "redis"), exist_ok=True)
        redis = testenv.Redis(os.path.join(tmp, "redis"))
    except Exception as e:  # noqa: BLE001 - reported as skipped
        rows.append({"name": "3 hosts on Redis", "skipped": str(e)})
        return rows
    try:
        rows.append(_case(tmp, "3 hosts on Redis", redis))
    finally:
        redis.stop()
    return rows
