"""Several hosts on one Redis behave as one: three kembali processes, each
with its own state_dir (three "hosts"), on a real redis-server started for
the test (private socket and port, no persistence), against the sandbox.
The pace, the cache, key pauses and the budget hold across hosts; waiters
on one host wake when another host's read ends; Redis stopped, killed and
restarted: every request is still answered by its deadline, within the
fallback budget, and the hosts coalesce again once it is back."""

import json
import statistics
import subprocess
import threading
import time

import testenv
import kit
from testenv import assert_eq, assert_between


def left_redis(ks):
    """Did any host leave Redis (a reply slower than 100 ms: a machine so
    busy that it starved redis-server)? Then the hosts rightly went on
    alone, and a test of one pace across hosts checks that instead."""
    gone = [k.name for k in ks if k.find_log(event="redis_left")]
    if gone:
        print("# %s left Redis during the test (see their logs): checked as hosts on their own" % gone)
    return bool(gone)


def hosts(tmpdir, n=3, budget=None, top=None, unix=True, two_shops=False):
    """n hosts on one new Redis; shop toko-a (KEY, `budget`), and toko-b
    (KEY2) when two_shops (requests then name their host)."""
    redis = testenv.Redis(tmpdir)
    shop = {} if budget is None else {"read_budget_per_minute": budget}
    sb, ks = kit.start_hosts(tmpdir, n, redis, top=dict(top or {}, redis=redis.unix_url() if unix else redis.url()),
                             shops=lambda k: [testenv.make_shop("toko-a", k.key_path("a"),
                                                                notify_secret_file=k.key_path("notify-a"), **shop)] +
                             ([testenv.make_shop("toko-b", k.key_path("b"))] if two_shops else []))
    for k in ks:
        k.wait_log(30, event="redis_joined")
    return redis, sb, ks


@testenv.timeout(120)
def test_thirty_requests_over_three_hosts_cost_one_schedule(tmpdir):
    redis, sb, ks = hosts(tmpdir)
    sb.put_tx("t1", "pending")
    rs = kit.parallel([lambda k=k: k.get("id=t1", timeout=30) for k in ks for _ in range(10)])
    assert all(r.header("kembali-status") == "checking" for r in rs), [r.header("kembali-status") for r in rs]
    if left_redis(ks):  # Redis was starved past 100 ms: the hosts rightly went on alone (answered, above)
        return
    starts, last = kit.check_one_pace(sb, ks, "t1")
    arrivals = kit.read_times(sb, "t1")
    print("# 30 requests over 3 hosts on one pending transaction: %d reads, arrivals %r, smallest gap %.3f s"
          % (len(arrivals), arrivals, kit.min_gap(arrivals)))
    # one schedule's reads (4 with FAST), more when a busy machine spread the
    # 30 requests over seconds: check_one_pace checked that the reads went
    # on exactly until the last request's deadline, one pace for all
    # check_one_pace: each read started at least 1.1 s after the previous one
    # went out (kembali's logs, every host's), and arrivals kept Kasera's 1 s
    # window (the sandbox's own clock adds a few ms of jitter to 1.1 s)
    print("# smallest gap between read starts: %.3f s" % kit.min_gap(starts))
    readers = [k.name for k in ks if k.find_log(event="read", id="t1")]
    print("# hosts that made reads: %r" % readers)
    assert all(r["http"] == 200 for r in sb.reads("t1")), "no read was rejected by Kasera"


def test_final_status_read_by_one_host_answers_the_others(tmpdir):
    redis, sb, ks = hosts(tmpdir)
    sb.put_tx("done", "succeeded")
    assert_eq(ks[0].get("id=done").header("kembali-status"), "succeeded")
    for k in ks[1:]:
        assert_eq(k.get("id=done").header("kembali-status"), "succeeded")
        assert_eq(k.get("id=done&format=json").json()["status"], "succeeded")
    assert_eq(len(sb.reads("done")), 1, "the other hosts answered from Redis, with no read")
    # once seen, a host answers from its own state: no further round trip
    before = ks[1].metrics()["kembali_redis_round_trips_total"]
    for _ in range(5):
        assert_eq(ks[1].get("id=done").header("kembali-status"), "succeeded")
    assert_eq(ks[1].metrics()["kembali_redis_round_trips_total"], before, "hot answers cost no round trip")


def test_waiters_on_other_hosts_wake_at_the_end_of_the_read(tmpdir):
    """A read made by one host ends; requests held on the other hosts for the
    same transaction are answered from it at once (pub/sub), not at their
    own next step. Latency is measured in `make bench`; here every waiter
    must beat the next step of the schedule by far."""
    redis, sb, ks = hosts(tmpdir, top={"schedule_ms": [0, 5000]})
    lat = []

    def one(i, attempt):  # a host away from Redis reads alone and hears no wake: tried again
        t = "w%d" % i if attempt == 0 else "w%d-%d" % (i, attempt)
        sb.put_tx(t, "succeeded", responses=[{"delay_ms": 400}])
        return t, kit.parallel([lambda k=k, d=d: (time.sleep(d), k.get("id=" + t))[1]
                                for k, d in zip(ks, (0, 0.15, 0.15))])
    for i in range(6):
        t, out = kit.without_a_stall(ks, lambda attempt: one(i, attempt))
        assert all(r.header("kembali-status") == "succeeded" for r in out)
        assert_eq(len(sb.reads(t)), 1, "one read for three hosts")
        reader = [k for k in ks if k.find_log(event="read", id=t)]
        assert_eq(len(reader), 1)
        end = kit.log_time(reader[0].wait_log(30, event="read", id=t))
        for k in ks:
            if k is not reader[0]:
                lat.append((kit.log_time(k.wait_log(30, event="request", id=t)) - end) * 1000)
    print("# cross-host wake, read end to answer (ms): median %.1f, max %.1f" % (statistics.median(lat), max(lat)))
    assert max(lat) < 2500, lat  # without the wake: the next step, 5 s later
    assert sorted(lat)[len(lat) // 4] < 50, lat


def test_budget_is_counted_once_over_every_host(tmpdir):
    redis, sb, ks = hosts(tmpdir, budget=4)
    for i in range(6):
        sb.put_tx("b%d" % i, "pending")
    for i in range(6):
        ks[i % 3].get("id=b%d&format=json" % i)
    # each host alone would allow 4; with Redis down, 4 / 2 each
    assert_eq(len(sb.reads()), 4, "4 reads per minute over every host")


def test_reservations_hold_across_hosts(tmpdir):
    """A budget of 10 reads a minute, one buyer on each of three hosts, each
    payment done 2.8 s after its buyer came back. Each host alone sees
    plenty (one buyer's 4 reads), so its own plan reads on the schedule; 12
    reads do not fit 10. Redis holds the plan across hosts: an early read
    must leave room for every host's reserved last-chance reads, so each
    buyer still gets a read after paying. Without it, the first 9 early
    reads leave one read for three last chances."""
    redis, sb, ks = hosts(tmpdir, budget=10)
    for i in range(3):
        sb.put_tx("fs%d" % i, [(0, "pending"), (2800, "succeeded")])
    rs = kit.parallel([lambda i=i: ks[i].get("id=fs%d" % i, timeout=30) for i in range(3)])
    words = [r.header("kembali-status") for r in rs]
    if left_redis(ks):
        assert all(w in ("succeeded", "checking") for w in words), words
        return
    print("# 3 hosts, budget 10, one buyer each: %r, %d reads" % (words, len(sb.reads())))
    assert_eq(words, ["succeeded"] * 3, "every buyer saw its payment")
    assert len(sb.reads()) <= 10, "the budget held"


def test_key_pause_holds_on_every_host(tmpdir):
    redis, sb, ks = hosts(tmpdir)
    # a 429 without Retry-After (the key's 300/min) pauses the key everywhere
    body = json.dumps({"error": {"code": "rate_limited", "message": "too many requests for this API key",
                                 "request_id": "req_1"}})
    sb.put_tx("p1", "pending", responses=[{"http": 429, "body": body}])
    sb.put_tx("p2", "pending")
    ks[0].get("id=p1&format=json")
    assert_eq(len(sb.reads("p1")), 1)
    kit.wait_key_pause(redis, kit.KEY, "p1", lambda: kit.log_count(ks, "redis_left"))
    words = [k.get("id=p2").header("kembali-status") for k in ks[1:]]
    assert_eq(words, ["checking"] * len(words))
    if left_redis(ks):  # a host away from Redis decides on its own state: it may read p2
        return
    for k in ks[1:]:
        assert kit.answered_in(k, "p2")[-1] < 1.5, "answered at once: no read can start"
    assert_eq(sb.reads("p2"), [], "no host read with the paused key")


def test_notify_reaches_every_host(tmpdir):
    redis, sb, ks = hosts(tmpdir, top={"schedule_ms": [0, 5000, 5000]})
    # a host away from Redis when the message goes out never hears it (it
    # answers at its next step): such a try is made again with another id

    def told(attempt):
        t = "n1" if attempt == 0 else "n1-%d" % attempt
        sb.put_tx(t, "pending")
        out = {}
        threads = [threading.Thread(target=lambda k=k: out.setdefault(k.name, k.get("id=" + t, timeout=20)))
                   for k in ks[1:]]
        for th in threads:
            th.start()
        testenv.wait_for(lambda: all(k.metrics()["kembali_held_requests"] == 1 for k in ks[1:]), 30)
        # the first read has ended (the next is 5 s away): what the notify saves is counted from here
        testenv.wait_for(lambda: any(k.find_log(event="read", id=t) for k in ks), 30)
        reads_before = len(sb.reads(t))
        r = kit.notify(ks[0], t, b'{"status":"succeeded"}')
        for th in threads:
            th.join(60)
        return t, r, out, reads_before
    t, r, out, reads_before = kit.without_a_stall(ks, told)
    assert_eq(r.status, 204, r.text)
    assert all(out[k.name].header("kembali-status") == "succeeded" for k in ks[1:]), out
    # at once (kembali's logs), not at the next step 5 s later
    at = kit.log_time(ks[0].wait_log(30, event="notify", id=t))
    for k in ks[1:]:
        assert kit.log_time(k.wait_log(30, event="request", id=t)) - at < 1.0
    assert_eq(len(sb.reads(t)), reads_before, "the told status cost no read")

    # kembali --notify (a queue worker on any host) reaches held requests too
    def queue_worker(attempt):
        t = "n2" if attempt == 0 else "n2-%d" % attempt
        sb.put_tx(t, "pending")
        out = {}
        th = threading.Thread(target=lambda: out.setdefault(t, ks[2].get("id=" + t, timeout=20)))
        th.start()
        testenv.wait_for(lambda: ks[2].metrics()["kembali_held_requests"] == 1, 30)
        p = subprocess.run([testenv.kembali_bin(), "--config", ks[0].config_path, "--notify", "toko-a", t, "failed"],
                           capture_output=True, text=True, timeout=20)
        th.join(60)
        return p, out[t]
    p, r = kit.without_a_stall(ks, queue_worker)
    assert_eq(p.returncode, 0, p.stderr)
    assert_eq(r.header("kembali-status"), "failed")


def test_notify_conflict_across_hosts(tmpdir):
    """h0 is told failed; h1, which holds no request for it (so its own
    state never heard of it), is then told succeeded: Redis keeps failed and
    h1 answers 409, with its error line and metric; every host's buyer sees
    failed, with no read. (Decided by h1's state alone, succeeded would have
    been recorded there and shown to h1's buyers.)"""
    redis, sb, ks = hosts(tmpdir, n=2)
    sb.put_tx("x1", "pending")
    assert_eq(kit.notify(ks[0], "x1", {"status": "failed"}).status, 204)
    r = kit.notify(ks[1], "x1", {"status": "succeeded"})
    if left_redis(ks):
        return
    assert_eq(r.status, 409, repr(r))
    testenv.assert_in("failed is already known", r.text)
    line = ks[1].wait_log(30, event="notify_conflict", id="x1")
    assert_eq((line["level"], line["status"], line["http"]), ("error", "succeeded", "409"))
    assert_eq(ks[1].metrics()["kembali_notify_conflicts_total"], 1)
    assert_eq(ks[0].metrics()["kembali_notify_conflicts_total"], 0)
    for k in ks:
        assert_eq(k.get("id=x1").header("kembali-status"), "failed")
        assert_eq(k.get("id=x1&format=json").json(), {"id": "x1", "status": "failed", "final": True})
    # the same status again is harmless on any host; a forged one changes nothing
    assert_eq(kit.notify(ks[1], "x1", {"status": "failed"}).status, 204)
    assert_eq(kit.notify(ks[1], "x2", {"status": "failed"}, secret="whsec_guessed").status, 401)
    assert_eq(kit.notify(ks[0], "x2", {"status": "succeeded"}).status, 204)
    assert_eq(ks[1].get("id=x2").header("kembali-status"), "succeeded")
    assert_eq(sb.reads(), [])


def test_an_idle_host_notices_a_stopped_redis(tmpdir):
    """A host that asks Redis nothing (its buyers may wait on another
    host's read) still notices that Redis stopped answering: its PING while
    idle gets no answer within 100 ms. It leaves, says so, and rejoins when
    Redis answers again. (Without the PING it would go on saying it is up.)"""
    redis, sb, ks = hosts(tmpdir, n=2)
    redis.pause()
    for k in ks:
        line = k.wait_log(30, event="redis_left")
        assert_eq(line["why"], "slower than 100 ms")
        assert_eq(k.metrics()["kembali_redis_up"], 0)
    redis.resume()
    for k in ks:
        k.wait_log(30, event="redis_rejoined")
        testenv.wait_for(lambda: k.metrics()["kembali_redis_up"] == 1, 30)
        assert k.metrics()["kembali_redis_pings_total"] > 0
    # the PINGs are no round trips of answers: a cached answer still costs none
    sb.put_tx("i1", "succeeded")
    ks[0].get("id=i1")
    before = ks[0].metrics()["kembali_redis_round_trips_total"]
    for _ in range(3):
        assert_eq(ks[0].get("id=i1").header("kembali-status"), "succeeded")
    assert_eq(ks[0].metrics()["kembali_redis_round_trips_total"], before)


@testenv.timeout(150)
def test_redis_stopped_killed_and_restarted(tmpdir):
    redis, sb, ks = hosts(tmpdir, budget=6, top={"redis_hosts": 3}, two_shops=True)
    # SIGSTOP mid-episode: Redis takes the claims and never answers
    sb.put_tx("s1", "pending")
    out = []
    lock = threading.Lock()

    def ask(k, t):
        r = k.get("id=" + t, host="toko-a.test", timeout=30)
        with lock:
            out.append(r)

    threads = [threading.Thread(target=ask, args=(k, "s1")) for k in ks for _ in range(3)]
    for t in threads:
        t.start()
    testenv.wait_for(lambda: sb.reads("s1"), 30)
    redis.pause()
    for t in threads:
        t.join(40)
    assert_eq(len(out), 9)
    assert all(r.header("kembali-status") == "checking" for r in out), [r.header("kembali-status") for r in out]
    for k in ks:  # by their deadline (the schedule plus 1.5 s), never 5xx
        assert all(ms / 1000 <= kit.FAST_HOLD + 0.5 for ms in
                   [int(l["ms"]) for l in k.find_log(event="request", id="s1")])
        assert k.find_log(event="redis_left"), "%s logs that it left Redis" % k.name
        assert_eq(k.metrics()["kembali_redis_up"], 0)
    # reads within the fallback budget: 6 / 3 hosts = 2 per host per minute
    # (the schedule alone would make 4 on each), the read made through Redis
    # before it stopped included
    per_host = [len(k.find_log(event="read")) for k in ks]
    print("# Redis stopped mid-episode: reads per host %r (fallback budget 2 each), %d in all"
          % (per_host, len(sb.reads())))
    assert all(n <= 2 for n in per_host), per_host
    # SIGKILL, then a new, empty Redis on the same socket: the hosts rejoin
    # (toko-b: another key, whose budget the episode above did not spend)
    redis.kill()
    sb.put_tx("s2", "succeeded")
    assert_eq(ks[0].get("id=s2", host="toko-b.test").header("kembali-status"), "succeeded")  # no Redis at all
    redis.restart()
    for k in ks:
        k.wait_log(15, event="redis_rejoined")
    testenv.wait_for(lambda: all(k.metrics()["kembali_redis_up"] == 1 for k in ks), 30)
    # the final status learnt while Redis was gone was written back
    testenv.wait_for(lambda: redis.keys("kembali:*t:s2"), 30, msg="s2's final status is in the new Redis")
    left = kit.log_count(ks, "redis_left")
    for k in ks[1:]:
        assert_eq(k.get("id=s2", host="toko-b.test").header("kembali-status"), "succeeded")
    if kit.log_count(ks, "redis_left") == left:  # a host away meanwhile reads s2 itself, rightly
        assert_eq(len(sb.reads("s2")), 1, "the other hosts learnt s2 from Redis")
    # coalescing across hosts again, once the new Redis's count of toko-b's
    # reads is whole: s2's read, made while it was gone, came back with the
    # hosts and started a grace (budget.h) in which nothing is granted
    testenv.wait_for(lambda: not redis.keys("kembali:*}g"), 30, msg="the count's grace ends")

    def episode(attempt):
        t = "s3" if attempt == 0 else "s3-%d" % attempt
        sb.put_tx(t, "pending")
        kit.parallel([lambda k=k: k.get("id=" + t, host="toko-b.test", timeout=30) for k in ks for _ in range(3)])
        return t
    kit.check_one_pace(sb, ks, kit.without_a_stall(ks, episode))


@testenv.timeout(150)
def test_write_back_keeps_room_for_every_key(tmpdir):
    """While Redis is gone, one shop is told 1,100 final statuses (more than
    the whole write-back queue, 1,024) and then another shop's buyer pays:
    when Redis is back, the other shop's status is written back too (one
    key holds at most 256 of the queue), and the second host answers it
    from Redis with no read of its own."""
    redis, sb, ks = hosts(tmpdir, n=2, two_shops=True)
    redis.kill()
    ks[0].wait_log(15, event="redis_left")
    told = 1100
    for i in range(told):
        r = kit.notify(ks[0], "f%d" % i, {"status": "failed"}, extra={"HTTP_HOST": "toko-a.test"})
        assert_eq(r.status, 204, r.text)
    sb.put_tx("w1", "succeeded")
    assert_eq(ks[0].get("id=w1", host="toko-b.test").header("kembali-status"), "succeeded")
    redis.restart()
    ks[0].wait_log(15, event="redis_rejoined")
    testenv.wait_for(lambda: redis.keys("kembali:*t:w1"), 30, msg="w1's final status is in the new Redis")
    # counted as Redis answers each write (the last answers may still be on their way)
    testenv.wait_for(lambda: ks[0].metrics()["kembali_redis_written_back_total"] >= 256 + 1, 15,
                     msg="every write answered")
    written = ks[0].metrics()["kembali_redis_written_back_total"]
    print("# %d statuses told to toko-a while Redis was gone: %d written back in all" % (told, written))
    assert_eq(written, 256 + 1)
    ks[1].wait_log(15, event="redis_rejoined")
    assert_eq(ks[1].get("id=w1", host="toko-b.test").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("w1")), 1, "the second host learnt w1 from Redis")


@testenv.timeout(120)
def test_a_write_back_lost_on_the_way_is_sent_again(tmpdir):
    """A final status told while Redis was gone is written back at the
    join; when the connection is lost before its tell is answered (Redis
    holds writes for 1.5 s, past the 100 ms a host waits), it stays queued
    and is written at the next join: it reaches Redis, counted once."""
    redis, sb, ks = hosts(tmpdir, n=1, two_shops=True)
    k = ks[0]
    redis.kill()
    k.wait_log(15, event="redis_left")
    r = kit.notify(k, "wb1", {"status": "succeeded"}, extra={"HTTP_HOST": "toko-a.test"})
    assert_eq(r.status, 204, r.text)
    redis.restart()
    # writes held before the host's join (it tries again each second):
    # PING, ROLE and SCRIPT LOAD go on, the write-back's tell waits
    redis.cmd("CLIENT", "PAUSE", "1500", "WRITE")
    first = k.wait_log(15, event="redis_rejoined")
    assert_eq(first.get("written_back"), "1", first)
    testenv.wait_for(lambda: len(k.find_log(event="redis_rejoined")) >= 2, 15, msg="joined again after the pause")
    lefts = k.find_log(event="redis_left")
    assert len(lefts) >= 2 and lefts[-1]["why"] == "slower than 100 ms", lefts
    testenv.wait_for(lambda: redis.keys("kembali:*t:wb1"), 15, msg="wb1's final status in Redis")
    testenv.wait_for(lambda: k.metrics()["kembali_redis_written_back_total"] >= 1, 15, msg="its write answered")
    assert_eq(k.metrics()["kembali_redis_written_back_total"], 1)


def test_redis_not_there_at_start_then_joined_with_a_password(tmpdir):
    """Redis down when kembali starts: one log line, requests answered on
    the host's own state; once Redis runs (with a password), every host
    joins within the retry second and coalesces through it."""
    redis = testenv.Redis(tmpdir, password="s3cret-redis-pass", start=False)
    sb, ks = kit.start_hosts(tmpdir, 2, redis, top={"redis": redis.unix_url()})
    for k in ks:
        line = k.wait_log(30, event="redis_unreachable")
        assert "s3cret" not in line["_raw"]
    sb.put_tx("u1", "succeeded")
    assert_eq(ks[0].get("id=u1").header("kembali-status"), "succeeded")
    assert_eq(ks[0].metrics()["kembali_redis_up"], 0)
    redis.start()
    for k in ks:
        k.wait_log(30, event="redis_joined")
    # u1 was learnt while Redis was away: written back, then known to host 1
    assert_eq(ks[1].get("id=u1").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("u1")), 1)
    assert len(ks[0].find_log(event="redis_unreachable")) == 1, "logged once, not every second"
    # kembali --notify authenticates on its own connection (db 0: its AUTH
    # reply was once freed twice) and reaches the hosts
    p = subprocess.run([testenv.kembali_bin(), "--config", ks[0].config_path, "--notify", "toko-a", "u2",
                        "canceled"], capture_output=True, text=True, timeout=20)
    assert_eq((p.returncode, p.stderr), (0, ""))
    assert_eq(ks[1].get("id=u2").header("kembali-status"), "canceled")
    # a wrong password: the host stays on its own state, says why, never 5xx
    bad = testenv.Kembali(tmpdir, name="bad", keys={"a": kit.KEY}, config=lambda k: dict(
        __import__("json").load(open(ks[0].config_path)), redis_password_file=k.write_key("pw", "wrong")))
    bad.start()
    line = bad.wait_log(30, event="redis_unreachable")
    assert "refused" in line.get("why", "") or "WRONGPASS" in line.get("why", ""), line
    assert_eq(bad.get("id=u1").header("kembali-status"), "succeeded")


def test_redis_keys_are_hashed_and_expire(tmpdir):
    # over TCP, by a host name when this machine's first address for
    # "localhost" is the one redis-server listens on (resolved in the
    # background, never in the loop)
    import socket
    by_name = socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM)[0][4][0] == "127.0.0.1"
    redis = testenv.Redis(tmpdir)
    url = "redis://localhost:%d" % redis.port if by_name else redis.url()
    sb, ks = kit.start_hosts(tmpdir, 3, redis, top={"redis": url})
    for k in ks:
        k.wait_log(30, event="redis_joined")
    sb.put_tx("k1", "succeeded")
    sb.put_tx("k2", "pending")
    ks[0].get("id=k1")
    ks[1].get("id=k2&format=json")
    keys = redis.keys("*")
    assert keys, "the state is in Redis"
    dump = " ".join(str(k) for k in keys)
    for k in keys:
        name = k.decode() if isinstance(k, bytes) else k
        assert name.startswith("kembali:"), name
        ttl = redis.cmd("PTTL", name)
        # -2: gone since listed (a client's read in flight, f:, is removed
        # when the read's end reaches Redis, which may be after the answer)
        assert ttl > 0 or ttl == -2, "every key expires: %s has %r" % (name, ttl)
        vals = redis.cmd("DUMP", name, raw=True)
        assert kit.KEY.encode() not in (vals or b""), "the secret is in %s" % name
    assert kit.KEY not in dump and kit.KEY[-12:] not in dump, "the secret is not in any key name"


@testenv.timeout(120)
def test_every_host_derives_the_same_key_names_for_good(tmpdir):
    """The names of an API key's keys depend on that key alone: two hosts
    (and kembali --notify) use the documented names, Redis holds nothing
    they are derived from (no salt that could expire or be deleted), and
    after the old salt key is deleted and one host restarts, the two still
    pace one transaction as one (it used to take a new salt: two key spaces
    for one API key, reads 1 ms apart)."""
    redis, sb, ks = hosts(tmpdir, n=2)
    k_a = testenv.redis_key_name(kit.KEY)
    sb.put_tx("s1", "succeeded")
    assert_eq(ks[0].get("id=s1").header("kembali-status"), "succeeded")
    names = [n.decode() if isinstance(n, bytes) else n for n in redis.keys("*")]
    v = "kembali:v%d:" % testenv.redis_schema()  # the schema version in every name
    assert v + "{%s}t:s1" % k_a in names, names
    assert all(n.startswith(v + "{%s}" % k_a) for n in names), names
    assert_eq([n for n in names if "salt" in n], [], "nothing in Redis names the keys")
    for n in names:
        assert redis.cmd("PTTL", n) > 0, "every key expires: %s" % n
    # kembali --notify derives the same names (it connects on its own)
    p = subprocess.run([testenv.kembali_bin(), "--config", ks[1].config_path, "--notify", "toko-a", "s2",
                        "failed"], capture_output=True, text=True, timeout=20)
    assert_eq(p.returncode, 0, p.stderr)
    assert redis.cmd("EXISTS", v + "{%s}t:s2" % k_a) == 1, "the notify's key under the same name"
    assert_eq(ks[0].get("id=s2").header("kembali-status"), "failed")
    # what split the key space before: the salt deleted, one host restarted
    redis.cmd("DEL", "kembali:salt")
    ks[1].stop()
    ks[1].start()
    ks[1].wait_log(30, event="redis_joined")
    testenv.wait_for(lambda: len(ks[1].find_log(event="redis_joined")) == 2, 30, msg="h1 joined again")
    sb.put_tx("t1", "pending")
    rs = kit.parallel([lambda k=k: k.get("id=t1", timeout=30) for k in ks for _ in range(3)])
    assert all(r.header("kembali-status") == "checking" for r in rs), [r.header("kembali-status") for r in rs]
    if left_redis(ks):
        return
    starts, _ = kit.check_one_pace(sb, ks, "t1")
    print("# two hosts, one restarted after the old salt key was deleted: read starts %r" % starts)
    assert_eq(len(redis.keys(v + "{%s}t:t1" % k_a)), 1)


if __name__ == "__main__":
    testenv.run(globals())
