"""Several kembali processes on one state_dir behave as one: the pace, the
cache, pauses and the budget hold across processes; waiters in one process
wake when another process's read ends; SIGKILL at any moment blocks nobody
for longer than the read timeout plus 1 s; a restarted process joins."""

import json
import os
import signal
import statistics
import subprocess
import threading
import time

import testenv
import kit
from testenv import assert_eq, assert_between, assert_in


@testenv.timeout(100)
def test_eight_processes_ten_requests_one_schedule(tmpdir):
    sb, ks = kit.start_many(tmpdir, 8, schedule=None)
    sb.put_tx("t1", "pending")
    rs = kit.parallel([lambda k=k: k.get("id=t1", timeout=60) for k in ks for _ in range(10)])
    times, last = kit.check_one_pace(sb, ks, "t1", schedule=None)
    print("# 8 processes x 10 requests, one pending transaction: %d reads started at %r, smallest gap %.3f s"
          % (len(times), times, kit.min_gap(times)))
    assert_eq(len(rs), 80)
    assert all(r.header("kembali-status") == "checking" for r in rs)
    # one schedule's 7 reads, unless a busy machine delayed a request past
    # 1.5 s (34 s - 32.5 s): then the one pace goes on for it (13 s later)
    assert_eq(len(times), 7 if last < 45.5 else 8, "one schedule's reads: %r" % times)
    assert all(r["http"] == 200 for r in sb.reads("t1")), "no read was rejected"


def test_many_transactions_across_processes(tmpdir):
    # the pace alone, without the budget's plan (read_planning false): 52
    # requests at once are a rush to the plan, which rightly holds some
    # reads back (test_rules.py covers it); and the key taken by Kasera
    # first: a key it has not taken yet reads 5 at a time
    # (auth_failures_per_minute). Either would stagger the burst's reads by
    # decisions other than the pace this test is about.
    sb, ks = kit.start_many(tmpdir, 4, top={"read_planning": False})
    sb.put_tx("warm", "succeeded")
    assert_eq(ks[0].get("id=warm").header("kembali-status"), "succeeded")
    ids = ["m%d" % i for i in range(12)]
    for t in ids:
        sb.put_tx(t, "pending")
    sb.put_tx("alone", "pending")
    fns = [lambda k=k, t=t: k.get("id=" + t) for t in ids for k in ks]
    fns.append(lambda: ks[0].get("id=alone"))
    kit.parallel(fns)
    # each transaction: one pace across the four processes until its last
    # request's deadline, i.e. what one request costs when they come together
    counts = {t: len(kit.check_one_pace(sb, ks, t)[0]) for t in ids + ["alone"]}
    print("# reads per transaction, 4 processes x 1 request each: %r" % counts)


def test_budget_holds_across_processes(tmpdir):
    sb, ks = kit.start_many(tmpdir, 4, shops=lambda k: [testenv.make_shop("toko-a", k.key_path("a"),
                                                                            read_budget_per_minute=10)])
    for i in range(24):
        sb.put_tx("b%d" % i, "pending")
    # 24 buyers, each from an address of its own, held (HTML): reads of ids
    # never answered still under way count toward the probing defence's 5
    # per address and the key's 404 quarter (a quarter of 10: 2 at once), so
    # a JSON request beyond them would be answered without a read, and how
    # many reach the budget would depend on how fast the first reads come
    # back; held, each reads once there is room, until the budget is spent
    kit.parallel([lambda i=i: ks[i % 4].get("id=b%d" % i, extra={"REMOTE_ADDR": "198.51.100.%d" % (i + 1)},
                                            timeout=30)
                  for i in range(24)])
    assert_eq(len(sb.reads()), 10, "10 reads per minute over every process")


def test_cache_and_pauses_are_shared(tmpdir):
    sb, (a, b) = kit.start_many(tmpdir, 2, shops=lambda k: [
        testenv.make_shop("toko-a", k.key_path("a")), testenv.make_shop("toko-b", k.key_path("b"))])
    sb.put_tx("done", "succeeded")
    assert_eq(a.get("id=done", host="toko-a.test").header("kembali-status"), "succeeded")
    assert_eq(b.get("id=done", host="toko-a.test").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("done")), 1, "the other process answered from the shared cache")
    sb.put_tx("nf1", "pending")
    sb.remove_key(kit.KEY2)
    a.get("id=x1", host="toko-b.test")          # 401 in process a
    r = b.get("id=x2", host="toko-b.test")      # process b does not read with that key
    assert_eq(r.header("kembali-status"), "checking")
    assert kit.answered_in(b, "x2")[0] < 1.0
    assert_eq(sb.reads("x2"), [])
    assert_eq(len(a.find_log(event="key_rejected")) + len(b.find_log(event="key_rejected")), 1)


def test_wake_latency_across_processes(tmpdir):
    """One process waits on a read made by the other: from the end of that
    read (the reader's read log line) to the waiter's answer (its request
    log line). The < 50 ms target is measured by `make bench`; this asserts
    that every wake happens, and promptly."""
    # Without the wake the waiter answers only at its own next step, seconds
    # later with this schedule (5.6 s, measured with the wake taken out).
    sb, (a, b) = kit.start_many(tmpdir, 2, schedule=[0, 5000])
    lat = sorted(kit.wake_latencies(sb, a, b, 20))
    print("# wake latency across processes, read end to answer (ms, log resolution 1 ms): "
          "median %.1f, max %.1f, all %r" % (statistics.median(lat), max(lat), [round(x) for x in lat]))
    # Idle, every wake takes about 1 ms. Under the parallel suite on two
    # cores a wake can wait for a CPU (up to a second on an overloaded
    # machine), so single samples only have to beat the missing wake (5.6 s);
    # a quarter of them within 20 ms rules out a wake that comes late every
    # time (the watcher's 200 ms safety timeout, say) but not CPU starvation.
    assert max(lat) < 2500, lat
    assert lat[len(lat) // 4] < 20, lat


def test_sigkill_mid_read(tmpdir):
    # a's read hangs (the sandbox delays it 10 s) and would time out after
    # 3 s; a is killed before that, while b waits on the read
    sb, (a, b) = kit.start_many(tmpdir, 2, top={"read_timeout_ms": 3000})
    lease = 3.0 + 1.0
    sb.put_tx("t1", "succeeded", responses=[{"delay_ms": 10000}])
    th = threading.Thread(target=lambda: _ignore(lambda: a.get("id=t1", timeout=15)))
    th.start()
    testenv.wait_for(lambda: sb.reads("t1"), 30)
    out = {}
    tb = threading.Thread(target=lambda: out.setdefault("b", b.get("id=t1")))
    tb.start()
    testenv.wait_for(lambda: b.metrics().get("kembali_held_requests") == 1, 30)  # b waits on a's read
    a.proc.send_signal(signal.SIGKILL)  # in the middle of its read
    a.proc.wait(60)
    assert not a.find_log(event="read", id="t1"), "a was killed before its read ended"
    tb.join(60)
    th.join(60)
    r = out["b"]
    assert_eq(r.header("kembali-status"), "succeeded")
    times = kit.read_times(sb, "t1")
    print("# SIGKILL mid-read: the waiting process read again %.2f s after the dead read began, "
          "answered after %.2f s" % (times[1], r.elapsed))
    assert_eq(len(times), 2, times)
    # the dead process's lease: read_timeout_ms 3 s + 1 s from its claim.
    # These are arrivals at the sandbox; the dead read's came after a new
    # connection, which TSan on a busy machine slowed by 104 ms: a looser
    # lower bound, still far above the pace (1.1 s) b would read at without
    # respecting the lease
    assert_between(times[1], lease - 0.5, lease + 1.0, "blocked no longer than the read timeout plus 1 s")
    assert int(b.wait_log(30, event="request", id="t1")["ms"]) / 1000 < lease + 0.5
    # a process started after the crash joins cleanly and shares the cache
    c = testenv.Kembali(tmpdir, config=lambda k: open(b.config_path).read(), keys={"a": kit.KEY}, name="k9")
    c.start()
    assert_eq(c.get("id=t1").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("t1")), 2)


def _ignore(fn):
    try:
        fn()
    except Exception:  # noqa: BLE001 - the process was killed under it
        pass


def test_kill_storm_leaves_state_usable(tmpdir):
    """Processes killed with SIGKILL at random moments while others serve."""
    sb, ks = kit.start_many(tmpdir, 4)
    ids = ["s%d" % i for i in range(30)]
    for i, t in enumerate(ids):
        sb.put_tx(t, "succeeded" if i % 2 else "pending")
    stop = time.monotonic() + 6
    errors = []

    def hammer(k):
        i = 0
        while time.monotonic() < stop:
            try:
                k.get("id=%s&format=json" % ids[i % len(ids)], timeout=30)
            except testenv.FcgiError:
                if k is not ks[0]:
                    errors.append("a live process failed to answer")
            i += 7

    threads = [threading.Thread(target=hammer, args=(k,)) for k in ks]
    for t in threads:
        t.start()
    victim = ks[0]
    for _ in range(5):
        time.sleep(1.0)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(60)
        victim.start()
    for t in threads:
        t.join(30)
    assert_eq(errors, [])
    for k in ks:
        r = k.get("id=s1&format=json")
        assert_eq(r.json()["status"], "succeeded")
    for t in ids:
        times = kit.read_times(sb, t)
        if len(times) > 1:
            assert kit.min_gap(times) >= kit.ARRIVAL_MIN_GAP, (t, times)


def test_restart_keeps_the_shared_state(tmpdir):
    sb, (a,) = kit.start_many(tmpdir, 1)
    sb.put_tx("t1", "canceled")
    a.get("id=t1")
    assert_eq(a.stop(), 0)
    a.start()
    assert_eq(a.get("id=t1").header("kembali-status"), "canceled")
    assert_eq(len(sb.reads("t1")), 1, "the cache outlived the process")


def test_incompatible_state_file_is_replaced(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    cfg = lambda k: testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))], schedule_ms=kit.FAST)
    k = testenv.Kembali(tmpdir, config=cfg, keys={"a": kit.KEY})
    state = os.path.join(tmpdir, "state")
    path = os.path.join(state, "kembali-v%d.state" % testenv.state_layout())  # this layout's name, damaged
    with open(path, "wb") as f:
        f.write(b"kembali state version 0\n" + b"\0" * 5000)
    os.chmod(path, 0o600)
    k.start()  # returns when the socket listens, which comes before the state is opened
    assert_in("replacing it", k.wait_log(30, event="state", level="warn")["msg"])
    sb.put_tx("t1", "succeeded")
    assert_eq(k.get("id=t1").header("kembali-status"), "succeeded")


def test_state_dir_others_can_write_is_refused(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    cfg = lambda k: testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))])
    k = testenv.Kembali(tmpdir, config=cfg, keys={"a": kit.KEY})
    os.chmod(os.path.join(tmpdir, "state"), 0o777)
    try:
        k.start(timeout=60)
    except AssertionError:
        pass
    assert_eq(k.wait(60), 1)
    assert_in("other users", k.log_text())
    rc, out = testenv.Kembali.run_check_config(k.config_path)
    assert_eq(rc, 1)
    assert_in("other users", out)


def test_shared_socket_like_spawn_fcgi(tmpdir):
    sb, ks = kit.start_many(tmpdir, 4, listen="shared")
    sb.put_tx("t1", "pending")
    sb.put_tx("alone", "pending")
    addr = ks[0].addr
    kit.parallel([lambda: testenv.get(addr, "id=t1") for _ in range(20)] + [lambda: testenv.get(addr, "id=alone")])
    served = [len(k.find_log(event="request")) for k in ks]
    # which process accepts a connection is the kernel's choice (one may take
    # them all); together they answer every request and keep one pace
    print("# one socket shared by 4 processes: requests served per process %r" % served)
    assert sum(served) == 21, served
    for t in ("t1", "alone"):
        kit.check_one_pace(sb, ks, t)


def test_full_table_still_answers(tmpdir):
    # one shop, which may take the whole table (the per-key quota has its own test)
    sb, (a,) = kit.start_many(tmpdir, 1, top={"state_slots": 16, "state_slots_per_key": 16})
    ids = ["f%d" % i for i in range(24)]
    for t in ids:
        sb.put_tx(t, "pending")
    rs = kit.parallel([lambda t=t: a.get("id=" + t) for t in ids])
    assert all(r.status == 200 and r.header("kembali-status") == "checking" for r in rs)
    m = a.metrics()
    assert m.get("kembali_state_full_total", 0) >= 8, m
    assert_eq(len({r["id"] for r in sb.reads()}), 16, "only tracked transactions are read")


def test_one_shop_flooded_leaves_room_for_another(tmpdir):
    """state_slots 32, two shops: 40 random ids on shop A's public URL from
    10 addresses (held HTML requests, their reads in flight: entries in
    use) take at most a quarter of the table (state_slots_per_key's
    default); shop B's paid buyer is read and answered succeeded, and B's
    notify (kembali --notify, and the admin POST) is recorded."""
    sb, (k,) = kit.start_many(tmpdir, 1, top={"state_slots": 32}, shops=lambda k: [
        testenv.make_shop("toko-a", k.key_path("a")),
        testenv.make_shop("toko-b", k.key_path("b"), notify_secret_file=k.key_path("notify-a"))])
    flood = ["r%08x" % (0x5eed0000 + 7919 * i) for i in range(40)]
    for t in flood:
        sb.put_tx(t, "pending")  # held to the deadline, read on the schedule
    sb.put_tx("paid-b", "succeeded")
    sb.put_tx("told-b", "pending")
    sb.put_tx("posted-b", "pending")
    out = [None] * len(flood)

    def one(i):
        out[i] = k.get("id=" + flood[i], host="toko-a.test", timeout=30,
                       extra={"REMOTE_ADDR": "198.51.100.%d" % (1 + i % 10)})

    ts = [threading.Thread(target=one, args=(i,)) for i in range(len(flood))]
    for t in ts:
        t.start()
    # every flood request taken in: held, or answered at once
    testenv.wait_for(lambda: k.metrics().get("kembali_held_requests", 0) + len(k.find_log(event="request"))
                     >= len(flood), 20, msg="the flood taken in")
    m = k.metrics()
    held_flood = m.get("kembali_held_requests")
    flood_slots = m.get("kembali_state_entries")
    # shop B, while the flood is held (its entries in use)
    r = k.get("id=paid-b", host="toko-b.test")
    paid = (r.status, r.header("kembali-status"), len(sb.reads("paid-b")))
    p = subprocess.run([testenv.kembali_bin(), "--config", k.config_path, "--notify", "toko-b", "told-b",
                        "succeeded"], capture_output=True, text=True, timeout=30)
    cli = (p.returncode, p.stderr.strip())
    told = k.get("id=told-b", host="toko-b.test").header("kembali-status")
    post = kit.notify(k, "posted-b", {"status": "succeeded"}, extra={"HTTP_HOST": "toko-b.test"})
    posted = k.get("id=posted-b", host="toko-b.test").header("kembali-status")
    m2 = k.metrics()
    for t in ts:
        t.join(30)
    flood_reads = len([x for x in sb.reads() if x["id"] in flood])
    flood_read_ids = len(set(x["id"] for x in sb.reads() if x["id"] in flood))
    print("# flood of 40 ids on toko-a (state_slots 32): slots taken %s, held %s, ids read %d (%d reads), "
          "refused by the quota %s; toko-b: paid buyer %r, --notify %r then %s, POST %d then %s"
          % (flood_slots, held_flood, flood_read_ids, flood_reads, m.get("kembali_state_quota_full_total"), paid,
             cli, told, post.status, posted))
    assert_eq(paid, (200, "succeeded", 1), "toko-b's paid buyer: answer and reads")
    assert_eq(cli, (0, ""), "kembali --notify for toko-b")
    assert_eq(told, "succeeded", "told-b after --notify")
    assert_eq(post.status, 204, "the admin POST notify for toko-b: %r" % post)
    assert_eq(posted, "succeeded", "posted-b after the POST")
    assert_eq(sb.reads("told-b") + sb.reads("posted-b"), [], "told statuses cost no read")
    assert_eq(m.get("kembali_state_slots_per_key"), 8, "the default: a quarter of state_slots")
    assert flood_slots is not None and flood_slots <= 8, "the flood took %r slots" % flood_slots
    assert_eq(flood_read_ids, 8, "only the tracked ids are read")
    # the rest of the flood: checking at once (counted when held and when a read was due)
    assert m.get("kembali_state_quota_full_total", 0) >= len(flood) - 8, m
    assert_eq(m2.get("kembali_state_full_total", 0), 0, "nobody but the flood was refused")
    assert_eq(sum(r is not None and r.status == 200 for r in out), len(flood), "every flood request answered")
    assert_eq(sorted(set(r.header("kembali-status") for r in out)), ["checking"])

if __name__ == "__main__":
    testenv.run(globals())
