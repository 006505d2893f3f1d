"""Told by the shop: the admin POST ?format=notify and kembali --notify.
A told status counts as if a read had just returned it: held requests are
answered within 50 ms (measured in kembali's own log), later returns cost no
read, and what is known never moves backwards."""

import json
import subprocess

import harness
import kit
from harness import assert_eq, assert_in

ADMIN = {"KEMBALI_ADMIN": "1"}


def notify(k, id, body, admin=True, query=None, extra=None):
    """POST ?id=ID&format=notify with `body` (a dict as JSON, or bytes)."""
    params = dict(ADMIN if admin else {})
    params["CONTENT_TYPE"] = "application/json"
    params.update(extra or {})
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    q = query if query is not None else "id=%s&format=notify" % id
    return k.get(q, method="POST", extra=params, stdin=data)


def check_recorded(r):
    assert_eq(r.status, 204, "notify answer: %r" % r)
    assert_eq(r.body, b"")
    assert_eq(r.header("content-length"), None, "a 204 has no Content-Length")


def json_status(k, id):
    r = k.get("id=%s&format=json" % id)
    return r.header("kembali-status"), r.json()


def hold(k, id, n):
    """n HTML requests for id in threads, running once kembali holds all of
    them (its held gauge); returns the callable that joins them (answers)."""
    import threading
    out = [None] * n

    def one(i):
        out[i] = k.get("id=" + id, timeout=30)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    harness.wait_for(lambda: k.metrics().get("kembali_held_requests") == n, 10,
                     msg="%d requests held for %s" % (n, id))

    def join():
        for t in ts:
            t.join(30)
        return out
    return join


def reads_after(k, id, t):
    """kembali's reads of id that started after t (s since the epoch)."""
    return [l for l in k.find_log(event="read", id=id) if kit.began(l) > t + 0.001]


def test_told_while_twenty_held(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "pending")  # Kasera would say pending to the end
    join = hold(k, "t1", 20)
    check_recorded(notify(k, "t1", {"status": "succeeded"}))
    answers = join()
    assert_eq([r.header("kembali-status") for r in answers], ["succeeded"] * 20)
    told = k.wait_log(30, event="notify", id="t1")
    assert_eq((told["status"], told["result"], told["http"]), ("succeeded", "recorded", "204"))
    t_told = kit.log_time(told)
    lines = harness.wait_for(lambda: (lambda f: f if len(f) == 20 else None)(
        k.find_log(event="request", id="t1")), 5, msg="20 request lines")
    lat = sorted(round((kit.log_time(l) - t_told) * 1000) for l in lines)
    print("# held answered after the notify (ms, from kembali's log): min %d, median %d, max %d"
          % (lat[0], lat[10], lat[-1]))
    assert lat[-1] <= 50, "held requests answered %r ms after the notify" % lat
    # no read started after the notify, then or for later returns
    for _ in range(5):
        assert_eq(json_status(k, "t1")[0], "succeeded")
        assert_eq(k.get("id=t1").header("kembali-status"), "succeeded")
    assert_eq(reads_after(k, "t1", t_told), [])
    # a read in flight at the notify is logged when it ends, which may be after the answers
    harness.wait_for(lambda: len(sb.reads("t1")) == len(k.find_log(event="read", id="t1")), 10,
                     msg="every read the sandbox saw is in kembali's log once it ended")
    print("# reads at the sandbox: %d before the notify, 0 after" % len(sb.reads("t1")))


def test_told_while_the_read_is_in_flight(tmpdir):
    """Held on kembali's own read, still in flight (Kasera slow): a told
    final status answers them at once; the read's late pending changes
    nothing."""
    sb, k = kit.start(tmpdir)
    sb.put_tx("t11", "pending", responses=[{"delay_ms": 3000}])
    join = hold(k, "t11", 5)
    harness.wait_for(lambda: sb.reads("t11"), 30, msg="the read arrived at the sandbox")
    check_recorded(notify(k, "t11", {"status": "failed"}))
    answers = join()
    assert_eq([r.header("kembali-status") for r in answers], ["failed"] * 5)
    t_told = kit.log_time(k.wait_log(30, event="notify", id="t11"))
    lat = [round((kit.log_time(l) - t_told) * 1000) for l in k.find_log(event="request", id="t11")]
    assert max(lat) <= 50, "answered %r ms after the notify" % lat
    read = k.wait_log(30, event="read", id="t11")  # the slow read ends later...
    assert kit.log_time(read) > t_told, "the read was still in flight at the notify"
    assert_eq(read["status"], "pending")
    assert_eq(json_status(k, "t11")[1], {"id": "t11", "status": "failed", "final": True})  # ...and changes nothing
    assert_eq(len(sb.reads("t11")), 1)


def test_told_before_any_return(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t2", "failed")
    check_recorded(notify(k, "t2", {"status": "succeeded"}))  # the shop's word stands
    assert_eq(k.get("id=t2").header("kembali-status"), "succeeded")
    assert_eq(json_status(k, "t2"), ("succeeded", {"id": "t2", "status": "succeeded", "final": True}))
    # any shop's ids: the one shop is picked as for any request, by host too
    check_recorded(notify(k, "t3", {"status": "canceled"}, extra={"HTTP_HOST": "toko-a.test"}))
    assert_eq(k.get("id=t3").header("kembali-status"), "canceled")
    assert_eq(sb.reads(), [])
    assert_eq(k.find_log(event="read"), [])


def test_told_pending_changes_nothing_else(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t4", "pending")
    check_recorded(notify(k, "t4", {"status": "pending"}))
    assert_eq(sb.reads(), [])
    word, body = json_status(k, "t4")  # known, not final: the one read the pace allows now
    assert_eq((word, body["status"], body["final"]), ("checking", "pending", False))
    assert_eq(len(sb.reads("t4")), 1)


def test_bad_notifies(tmpdir):
    sb, k = kit.start(tmpdir)
    bad = [
        ("id=bad%20id&format=notify", {"status": "succeeded"}, "id="),
        ("format=notify", {"status": "succeeded"}, "id="),
        ("id=t5&format=notify", b"", "empty"),
        ("id=t5&format=notify", b"status=succeeded", "not JSON"),
        ("id=t5&format=notify", b"{\"status\": \"succeeded\"", "not JSON"),
        ("id=t5&format=notify", ["succeeded"], "JSON object"),
        ("id=t5&format=notify", {}, "no \"status\""),
        ("id=t5&format=notify", {"status": 1}, "must be a string"),
        ("id=t5&format=notify", {"status": "paid"}, "one of pending"),
        ("id=t5&format=notify", {"status": "unknown"}, "one of pending"),
        ("id=t5&format=notify", b"{\"status\": \"succeeded\"}" + b" " * 9000, "larger than 8192"),
    ]
    for query, body, reason in bad:
        r = notify(k, "t5", body if isinstance(body, bytes) else json.dumps(body).encode(), query=query)
        assert_eq(r.status, 400, "%s %r: %r" % (query, body, r))
        assert_eq(r.header("kembali-status"), "invalid")
        assert_in("text/plain", r.header("content-type"))
        assert_in(reason, r.text)
    r = notify(k, "t5", {"status": "succeeded"}, extra={"KEMBALI_SHOP": "nope"})
    assert_eq((r.status, r.header("kembali-status")), (404, "unknown_shop"))
    # without KEMBALI_ADMIN=1 a POST is a POST: 405
    for extra in ({}, {"KEMBALI_ADMIN": "0"}, {"KEMBALI_ADMIN": "yes"}):
        r = notify(k, "t5", {"status": "succeeded"}, admin=False, extra=extra)
        assert_eq((r.status, r.header("allow"), r.header("kembali-status")), (405, "GET, HEAD", "invalid"))
    # only POST tells: an admin GET with format=notify is an ordinary GET
    sb.put_tx("t6", "failed")
    r = k.get("id=t6&format=notify", extra=ADMIN)
    assert_eq(r.header("kembali-status"), "failed")
    # nothing was recorded for t5
    sb.put_tx("t5", "pending")
    assert_eq(json_status(k, "t5")[1]["status"], "pending")
    assert_eq(len(sb.reads("t5")), 1)


def test_expired_then_succeeded(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t7", "expired")
    check_recorded(notify(k, "t7", {"status": "expired"}))
    assert_eq(json_status(k, "t7"), ("expired", {"id": "t7", "status": "expired", "final": True}))
    check_recorded(notify(k, "t7", {"status": "succeeded"}))  # a late payment
    assert_eq(json_status(k, "t7"), ("succeeded", {"id": "t7", "status": "succeeded", "final": True}))
    check_recorded(notify(k, "t7", {"status": "expired"}))  # never the reverse
    assert_eq(k.get("id=t7").header("kembali-status"), "succeeded")
    assert_eq(k.wait_log(30, event="notify", id="t7", status="expired", result="kept")["http"], "204")
    assert_eq(sb.reads(), [])


def test_succeeded_then_pending(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t8", "pending")
    check_recorded(notify(k, "t8", {"status": "succeeded"}))
    check_recorded(notify(k, "t8", {"status": "pending"}))  # ignored, not an error
    assert_eq(k.get("id=t8").header("kembali-status"), "succeeded")
    assert_eq(json_status(k, "t8")[1], {"id": "t8", "status": "succeeded", "final": True})
    assert_eq(sb.reads(), [])


def run_notify(k, *args):
    p = subprocess.run([harness.kembali_bin(), "--config", k.config_path, "--notify"] + list(args),
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def test_notify_command_while_held(tmpdir):
    """--notify in another process: the running kembali's held requests are
    answered (the futex in the shared state), and no read is made."""
    import time
    sb, k = kit.start(tmpdir)
    sb.put_tx("t9", "pending")
    join = hold(k, "t9", 10)
    assert_eq(run_notify(k, "toko-a", "t9", "succeeded"), (0, "", ""))
    after = time.time()
    answers = join()
    assert_eq([r.header("kembali-status") for r in answers], ["succeeded"] * 10)
    lines = k.find_log(event="request", id="t9")
    lat = sorted(round((kit.log_time(l) - after) * 1000) for l in lines)
    print("# held answered after --notify exited (ms, kembali's log vs the test's clock): max %d" % lat[-1])
    # the pace goes on while --notify starts (a busy machine can make that
    # take longer than a wait): once it has recorded the status, no read
    assert_eq(reads_after(k, "t9", after), [])
    assert_eq(k.get("id=t9").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("t9")), len(k.find_log(event="read", id="t9")))
    # before any return, with no kembali running at all
    k.stop()
    assert_eq(run_notify(k, "toko-a", "t10", "failed"), (0, "", ""))
    k.start()
    assert_eq(k.get("id=t10").header("kembali-status"), "failed")
    assert_eq(sb.reads("t10"), [])


def test_notify_command_errors(tmpdir):
    sb, k = kit.start(tmpdir)
    for args, reason in ((("nope", "t1", "succeeded"), "shop nope"),
                         (("toko-a", "bad id", "succeeded"), "id bad id"),
                         (("toko-a", "t1", "paid"), "status paid"),
                         (("toko-a", "t1", "unknown"), "status unknown"),
                         (("toko-a", "t1", "SUCCEEDED"), "status SUCCEEDED")):
        rc, out, err = run_notify(k, *args)
        assert_eq((rc, out), (1, ""), "%r: %s" % (args, err))
        assert_in(reason, err)
    p = subprocess.run([harness.kembali_bin(), "--config", k.config_path, "--notify", "toko-a", "t1"],
                       capture_output=True, text=True, timeout=30)
    assert_eq(p.returncode, 2)
    assert_in("--notify needs SHOP ID STATUS", p.stderr)
    p = subprocess.run([harness.kembali_bin(), "--config", "/nonexistent.json", "--notify", "toko-a", "t1",
                        "failed"], capture_output=True, text=True, timeout=30)
    assert_eq(p.returncode, 1)
    assert_in("not usable", p.stderr)
    assert_eq(sb.reads(), [])


if __name__ == "__main__":
    harness.run(globals())
