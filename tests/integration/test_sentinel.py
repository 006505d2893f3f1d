"""Redis Sentinel: kembali hosts find the master by asking real
redis-sentinel processes (Debian's redis-sentinel package), with a real
redis-server master and replica, all on private ports, against the
sandbox. A forced failover moves every host to the new master within 5 s
(judged on kembali's and Sentinel's own logs) while tabs wait, and no
request fails; a Sentinel down among several, or one naming a replica,
does not keep a host off the master; --check-config probes the Sentinels.
Sentinel's own state is waited for by polling it, never by sleeping."""

import datetime
import json
import os
import re
import subprocess
import threading

import testenv
import kit
import test_metrics
from testenv import assert_eq

MASTER = "kembali"
# The metrics with Sentinels only (metrics.c's table, FROM_SENTINEL)
SENTINEL_NAMES = ["kembali_redis_master_changes_total", "kembali_redis_sentinel_asks_total",
                  "kembali_redis_sentinel_failures_total"]


def pair(tmpdir, password=None):
    """A master and its replica (linked: the replica says so in ROLE)."""
    master = testenv.Redis(tmpdir, name="master", password=password)
    args = ["--replicaof", "127.0.0.1", str(master.port)] + (["--masterauth", password] if password else [])
    replica = testenv.Redis(tmpdir, name="replica", password=password, args=args)
    testenv.wait_for(lambda: replica.cmd("ROLE")[3] == "connected", 30, msg="the replica is linked")
    return master, replica


def url(sentinels):
    """redis-sentinel://... naming the Sentinels (objects, or "host:port" strings) in order."""
    return "redis-sentinel://%s/%s" % (",".join(s if isinstance(s, str) else s.hostport() for s in sentinels),
                                       MASTER)


def start_hosts(tmpdir, n, sentinels, master, sentinel_password=None):
    """n hosts (kit.start_hosts) on redis-sentinel://..., with the master's
    password and the Sentinels' when they have them."""
    top = {"redis_password_file": master.password_file()} if master.password else {}
    if sentinel_password is not None:
        top["redis_sentinel_password_file"] = testenv.write_secret(os.path.join(tmpdir, "sentinel.pw"),
                                                                   sentinel_password)
    return kit.start_hosts(tmpdir, n, url(sentinels), top=top)


def nobody_port():
    """A TCP port of 127.0.0.1 where nothing listens."""
    return testenv.free_port()


def left(ks, since=None):
    """Did a host leave Redis (since its counts in `since`)? A reply slower
    than 100 ms (a machine so busy that it starved redis-server) rightly
    sends it on alone; a test of one pace across hosts then says so instead."""
    now = [len(k.find_log(event="redis_left")) for k in ks]
    gone = [k.name for k, n, b in zip(ks, now, since or [0] * len(ks)) if n > b]
    if gone:
        print("# %s left Redis during the test (see their logs): checked as hosts on their own" % gone)
    return now if not gone else None


def switch_time(sentinel, new_port):
    """When Sentinel switched its master to new_port (its log's
    +switch-master line; Sentinel logs local time, to the millisecond)."""
    pat = re.compile(r"(\d+ \w+ \d+ [\d:.]+) [#*] \+switch-master %s \S+ \d+ \S+ %d" % (MASTER, new_port))

    def find():
        m = pat.search(sentinel.log_text())
        return m and datetime.datetime.strptime(m.group(1), "%d %b %Y %H:%M:%S.%f").timestamp()
    return testenv.wait_for(find, 30, msg="Sentinel's +switch-master line; log:\n%s" % sentinel.log_text()[-3000:])


@testenv.timeout(240)
def test_failover_moves_every_host_to_the_new_master(tmpdir):
    master, replica = pair(tmpdir, password="m4ster-pass")
    sen = testenv.Sentinel(tmpdir, master, password="s3ntinel-pass")
    sb, ks = start_hosts(tmpdir, 2, [sen], master, sentinel_password="s3ntinel-pass")
    for k in ks:
        line = k.wait_log(30, event="redis_joined")
        assert_eq((line["redis"], line["port"], line["master"], line["sentinel"]),
                  ("127.0.0.1", str(master.port), MASTER, sen.hostport()))
        assert "m4ster" not in k.log_text() and "s3ntinel" not in k.log_text()
    m = ks[0].metrics()
    assert_eq(m['kembali_redis_master{address="127.0.0.1:%d"}' % master.port], 1)

    # one pace of reads across both hosts before
    sb.put_tx("f1", "pending")
    kit.parallel([lambda k=k: k.get("id=f1", timeout=30) for k in ks for _ in range(2)])
    if left(ks) is not None:
        kit.check_one_pace(sb, ks, "f1")

    # tabs on both hosts wait on f2 while Sentinel fails over
    testenv.wait_for(sen.replicas_ready, 60, msg="Sentinel knows a good replica")
    sb.put_tx("f2", "pending")
    out, lock = [], threading.Lock()

    def tab(k, delay):
        threading.Event().wait(delay)
        r = k.get("id=f2", timeout=30)
        with lock:
            out.append(r)
    threads = [threading.Thread(target=tab, args=(k, d)) for k in ks for d in (0, 1.0, 2.0, 3.0)]
    for t in threads:
        t.start()
    testenv.wait_for(lambda: sb.reads("f2"), 30)

    def failover():
        try:
            return sen.cmd("SENTINEL", "FAILOVER", MASTER) == "OK"
        except testenv.RedisError as e:  # NOGOODSLAVE, INPROG: Sentinel is not ready yet
            print("# SENTINEL FAILOVER: %s" % e)
            return False
    testenv.wait_for(failover, 60, interval=0.5, msg="Sentinel accepts SENTINEL FAILOVER")
    testenv.wait_for(lambda: sen.master_addr() == ("127.0.0.1", replica.port), 60,
                     msg="Sentinel names the replica")
    switched = switch_time(sen, replica.port)
    joined, leaving = [], []
    for k in ks:
        line = k.wait_log(30, event="redis_master_changed")
        leaving.append(round(kit.log_time(k.wait_log(5, event="redis_left")) - switched, 3))
        assert_eq((line["port"], line["from"]), (str(replica.port), "127.0.0.1:%d" % master.port))
        rejoin = k.wait_log(30, event="redis_rejoined", port=str(replica.port))
        joined.append(round(kit.log_time(rejoin) - switched, 3))
    print("# failover: Sentinel switched at %s; each host left the old master %r s later, was on the new "
          "one %r s later" % (datetime.datetime.fromtimestamp(switched).isoformat(timespec="milliseconds"),
                              leaving, joined))
    assert all(j <= 5.0 for j in joined), joined
    for t in threads:
        t.join(60)
    assert_eq(len(out), 8)
    assert all(r.status == 200 and r.header("kembali-status") == "checking" for r in out), \
        [(r.status, r.header("kembali-status")) for r in out]
    for k in ks:  # every request answered, none later than its deadline
        assert all(int(l["ms"]) / 1000 <= kit.FAST_HOLD + 0.5 for l in k.find_log(event="request", id="f2"))
        assert_eq(k.metrics()['kembali_redis_master{address="127.0.0.1:%d"}' % replica.port], 1)
        assert_eq(k.metrics()["kembali_redis_master_changes_total"], 1)

    # and one pace across both hosts after, on the new master
    testenv.wait_for(lambda: all(k.metrics()["kembali_redis_up"] == 1 for k in ks), 30)
    before = left(ks, [1, 1])  # each left the old master once
    sb.put_tx("f3", "pending")
    kit.parallel([lambda k=k: k.get("id=f3", timeout=30) for k in ks for _ in range(2)])
    if before is not None and left(ks, before) is not None:
        kit.check_one_pace(sb, ks, "f3")
    assert replica.keys("kembali:*t:f3"), "f3 is on the new master"


@testenv.timeout(120)
def test_a_sentinel_down_among_several(tmpdir):
    """The first Sentinel listed is stopped (SIGSTOP: it accepts and never
    answers), the second is not there at all; the third names the master.
    Each host joins it, logs each failure once, and stays on the master."""
    master, replica = pair(tmpdir)
    hung = testenv.Sentinel(tmpdir, master, name="hung")
    good = testenv.Sentinel(tmpdir, master, name="good")
    hung.pause()
    gone = "127.0.0.1:%d" % nobody_port()
    sb, ks = start_hosts(tmpdir, 2, [hung, gone, good], master)
    for k in ks:
        line = k.wait_log(30, event="redis_joined")
        assert_eq((line["port"], line["sentinel"]), (str(master.port), good.hostport()))
        assert_eq(k.wait_log(5, event="redis_sentinel_failed", sentinel=hung.hostport())["why"],
                  "no answer within 300 ms")
        assert "refused" in k.wait_log(5, event="redis_sentinel_failed", sentinel=gone)["why"]
    # A busy machine can hold Redis's answer past 100 ms: a host then leaves
    # it (redis_left in its own log) and reads on its own until it rejoins.
    # Such a try says nothing of the master: it is made again, with
    # another id, once both hosts are back (kit.without_a_stall).

    def learnt(attempt):
        tx = "d1" if attempt == 0 else "d1-%d" % attempt
        sb.put_tx(tx, "succeeded")
        return tx, [k.get("id=" + tx).header("kembali-status") for k in ks]
    tx, words = kit.without_a_stall(ks, learnt)
    assert_eq(words, ["succeeded"] * len(ks))
    assert_eq(len(sb.reads(tx)), 1, "the second host learnt %s through the master" % tx)

    # kembali --notify (no loop) asks the Sentinels too, past the two that fail
    def told(attempt):
        tx = "d2" if attempt == 0 else "d2-%d" % attempt
        p = subprocess.run([testenv.kembali_bin(), "--config", ks[0].config_path, "--notify", "toko-a", tx, "failed"],
                           capture_output=True, text=True, timeout=30)
        return tx, p, ks[1].get("id=" + tx).header("kembali-status")
    tx, p, word = kit.without_a_stall(ks, told)
    assert_eq(p.returncode, 0, p.stderr)
    assert_eq(word, "failed")
    assert_eq(sb.reads(tx), [], "h1 learnt %s from the master" % tx)
    for k in ks:  # the page with Sentinels: promtool finds nothing to say, their rows there (test_metrics)
        page = test_metrics.check_page(k, redis=True)
        assert_eq(page['kembali_redis_master{address="127.0.0.1:%d"}' % master.port], 1)
        assert_eq([n for n in SENTINEL_NAMES if n not in page], [], "every Sentinel metric on the page")
    for k in ks:  # the good one is asked first from now on: three checks, no further failure, no leave but stalls
        if k.find_log(event="redis_sentinel_failed", sentinel=good.hostport()):
            print("# %s: the good Sentinel was slower than 300 ms once (a busy machine): not checked" % k.name)
            continue
        m = k.metrics()
        assert_eq(m["kembali_redis_sentinel_failures_total"], 2)
        testenv.wait_for(lambda: k.metrics()["kembali_redis_sentinel_asks_total"] >= m[
            "kembali_redis_sentinel_asks_total"] + 3, 30, msg="three more questions")
        testenv.wait_for(lambda: k.metrics()["kembali_redis_up"] == 1, 15, msg="%s on Redis" % k.name)
        assert_eq(k.metrics()["kembali_redis_sentinel_failures_total"], 2)
        assert_eq(len(k.find_log(event="redis_sentinel_failed")), 2)
        # a reply slower than 100 ms (a busy machine) sends a host off for a
        # second; any other leave would be the Sentinels' doing
        assert_eq([l["why"] for l in k.find_log(event="redis_left") if l["why"] != "slower than 100 ms"], [],
                  "%s left the master" % k.name)


@testenv.timeout(120)
def test_a_sentinel_naming_a_replica_is_not_followed(tmpdir):
    """A Sentinel that names the replica (it monitors it as the master):
    ROLE says slave, the host does not use it, logs it, and asks again,
    the other Sentinel first; it joins the real master."""
    master, replica = pair(tmpdir)
    wrong = testenv.Sentinel(tmpdir, replica, name="wrong", down_after_ms=600000)
    good = testenv.Sentinel(tmpdir, master, name="good", down_after_ms=600000)
    assert_eq(wrong.master_addr(), ("127.0.0.1", replica.port))
    sb, ks = start_hosts(tmpdir, 1, [wrong, good], master)
    k = ks[0]
    line = k.wait_log(30, event="redis_not_master")
    assert_eq((line["port"], line["sentinel"], line["role"]), (str(replica.port), wrong.hostport(), "slave"))
    joined = k.wait_log(30, event="redis_joined")
    assert_eq((joined["port"], joined["sentinel"]), (str(master.port), good.hostport()))
    assert kit.log_time(joined) > kit.log_time(line)
    assert_eq([l for l in k.log_lines() if l.get("event") in ("redis_joined", "redis_rejoined") and
               l.get("port") == str(replica.port)], [], "the replica was never joined")
    sb.put_tx("r1", "succeeded")
    assert_eq(k.get("id=r1").header("kembali-status"), "succeeded")
    testenv.wait_for(lambda: master.keys("kembali:*t:r1"), 10, msg="r1 is on the master")
    # with only that Sentinel: never joined, said once (not at every second's attempt), no request fails
    lone = testenv.Kembali(tmpdir, name="lone", keys={"a": kit.KEY}, config=lambda _: dict(
        json.load(open(k.config_path)), redis=url([wrong]), state_dir=os.path.join(tmpdir, "state-lone")))
    os.makedirs(os.path.join(tmpdir, "state-lone"), mode=0o700)
    lone.start()
    lone.wait_log(30, event="redis_not_master")
    testenv.wait_for(lambda: lone.metrics()["kembali_redis_sentinel_asks_total"] >= 4, 30, msg="four questions")
    assert_eq(len(lone.find_log(event="redis_not_master")), 1)
    assert_eq(lone.find_log(event="redis_joined"), [])
    assert_eq(lone.get("id=r1").header("kembali-status"), "succeeded")


def test_a_sentinel_refusing_the_password(tmpdir):
    """A wrong redis_sentinel_password_file: the host says so once, never
    joins, and answers on its own state."""
    master = testenv.Redis(tmpdir, name="master")
    sen = testenv.Sentinel(tmpdir, master, password="s3ntinel-pass")
    sb, ks = start_hosts(tmpdir, 1, [sen], master, sentinel_password="wr0ng-pass")
    k = ks[0]
    line = k.wait_log(30, event="redis_sentinel_failed")
    assert_eq((line["sentinel"], line["why"]), (sen.hostport(), "the password is refused "
                                                "(redis_sentinel_password_file)"))
    assert "no Sentinel named the master" in k.wait_log(10, event="redis_unreachable")["why"]
    testenv.wait_for(lambda: k.metrics()["kembali_redis_sentinel_failures_total"] >= 3, 30)
    assert_eq(len(k.find_log(event="redis_sentinel_failed")), 1)
    assert_eq(k.find_log(event="redis_joined"), [])
    sb.put_tx("p1", "succeeded")
    assert_eq(k.get("id=p1").header("kembali-status"), "succeeded")
    assert "wr0ng" not in k.log_text() and "s3ntinel" not in k.log_text()


def base_config(tmpdir):
    key = testenv.write_secret(os.path.join(tmpdir, "k"), "sk_test_x")
    os.makedirs(os.path.join(tmpdir, "state"), mode=0o700, exist_ok=True)
    return {"api_base": "http://127.0.0.1:9", "templates_dir": os.path.join(testenv.top_srcdir(), "templates"),
            "state_dir": os.path.join(tmpdir, "state"), "shops": [{"id": "toko-a", "secret_key_file": key}]}


def check(tmpdir, sentinels, master, **extra):
    """kembali --check-config with redis naming `sentinels` (a list, or the URL)."""
    cfg = dict(base_config(tmpdir), redis=sentinels if isinstance(sentinels, str) else url(sentinels))
    if master.password:
        cfg["redis_password_file"] = master.password_file()
    cfg.update(extra)
    return testenv.Kembali.run_check_config(cfg)


def test_check_config_probes_the_sentinels(tmpdir):
    master, replica = pair(tmpdir, password="m4ster-pass")
    sen = testenv.Sentinel(tmpdir, master, password="s3ntinel-pass")
    spw = testenv.write_secret(os.path.join(tmpdir, "sentinel.pw"), "s3ntinel-pass")
    bad = testenv.write_secret(os.path.join(tmpdir, "wrong.pw"), "wr0ng-pass")

    rc, out = check(tmpdir, [sen], master, redis_sentinel_password_file=spw)
    assert_eq(rc, 0, out)
    assert "redis Sentinel %s: master %s is 127.0.0.1:%d" % (sen.hostport(), MASTER, master.port) in out, out
    assert "master %s at 127.0.0.1:%d: ROLE master" % (MASTER, master.port) in out, out

    # one down (nothing listens) before it: a warning, still usable
    gone = "127.0.0.1:%d" % nobody_port()
    rc, out = check(tmpdir, [gone, sen], master, redis_sentinel_password_file=spw)
    assert_eq(rc, 0, out)
    assert "warning: redis Sentinel %s: cannot connect" % gone in out, out
    assert "ROLE master" in out, out

    # all down: a warning (kembali runs on its own state until one answers)
    rc, out = check(tmpdir, [gone], master)
    assert_eq(rc, 0, out)
    assert "no Sentinel named the master" in out, out

    # the Sentinels' password wrong, or missing: an error, the password never shown
    rc, out = check(tmpdir, [sen], master, redis_sentinel_password_file=bad)
    assert_eq(rc, 1, out)
    assert "error: redis Sentinel %s: AUTH refused (the password of redis_sentinel_password_file)" \
        % sen.hostport() in out, out
    assert "wr0ng" not in out and "s3ntinel" not in out and "m4ster" not in out, out
    rc, out = check(tmpdir, [sen], master)
    assert_eq(rc, 1, out)
    assert "give redis_sentinel_password_file" in out, out

    # a master name the Sentinel does not know: an error
    rc, out = check(tmpdir, "redis-sentinel://%s/other" % sen.hostport(), master, redis_sentinel_password_file=spw)
    assert_eq(rc, 1, out)
    assert "does not know the master \"other\"" in out, out

    # the master's own password wrong: an error about redis_password_file
    rc, out = check(tmpdir, [sen], master, redis_sentinel_password_file=spw, redis_password_file=bad)
    assert_eq(rc, 1, out)
    assert "AUTH refused (the password of redis_password_file)" in out, out
    assert "wr0ng" not in out and "m4ster" not in out, out


if __name__ == "__main__":
    testenv.run(globals())
