"""The pace end to end, with real clocks: the default schedule, 20 tabs, a
late joiner, JSON polling, and waking waiters. The rules themselves (every
case of "One pace" and "A held HTML request", late timers, reloads, the
cache's TTLs) are tested with a fake clock in tests/unit/test_hold.c and
test_state.c; these few check that the loop, the clocks and the sockets
carry them out, with margins a busy machine cannot break."""

import threading
import time

import testenv
import kit
from testenv import assert_eq, assert_between

DEFAULT_READS = [0, 1.5, 3.5, 6.5, 11.5, 19.5, 32.5]


@testenv.timeout(90)
def test_default_schedule_read_times(tmpdir):
    """One buyer, a transaction that stays pending: the seed's schedule."""
    sb, k = kit.start(tmpdir, schedule=None)
    sb.put_tx("t-pend", "pending")
    t0 = time.monotonic()
    r = k.get("id=t-pend")
    took = time.monotonic() - t0
    assert_eq(r.header("kembali-status"), "checking")
    starts, times = kit.check_pace(sb, [k], "t-pend", DEFAULT_READS)
    print("# default schedule: reads started at %r, arrived at %r; answered after %.2f s" % (starts, times, took))
    # no read can start before the 34 s deadline after the one at 32.5 s:
    # answered at once. The upper bound by kembali's log (the test's clock
    # also counts its own waits for a CPU); the client cannot have it sooner
    held = int(k.wait_log(30, event="request", id="t-pend")["ms"]) / 1000
    assert_between(held, 32.5, 34.0, "held by kembali")
    assert took >= 32.5, took
    assert "pembayaran sedang diperiksa" in r.text.lower()


def test_final_status_answers_within_half_a_second(tmpdir):
    sb, k = kit.start(tmpdir)
    kit.pending_then(sb, "t1", 2, "succeeded")
    out = kit.parallel([lambda: k.get("id=t1") for _ in range(20)])
    starts, _ = kit.check_pace(sb, [k], "t1", [0, 1.1, 2.2])
    for r in out:
        assert_eq(r.header("kembali-status"), "succeeded")
    assert_eq([r["status"] for r in sb.reads("t1")], ["pending", "pending", "succeeded"])
    # every waiter answered within 0.5 s of the end of the read that found
    # it, and none before; a request that a busy machine delayed past that
    # read is answered from the cache at once. By kembali's own log.
    found = kit.log_time(k.wait_log(30, event="read", id="t1", status="succeeded"))
    answered = [l for l in k.find_log(event="request", id="t1")]
    assert_eq(len(answered), 20)
    waiters = [l for l in answered if kit.began(l) < found]
    late = [l for l in answered if l not in waiters]
    lag = [kit.log_time(l) - found for l in waiters]
    print("# %d waiters answered %.3f to %.3f s after the read that found succeeded ended; %d came later"
          % (len(waiters), min(lag), max(lag), len(late)))
    assert len(waiters) >= 1, "some request waited for the read"
    assert_between(min(lag), -0.002, 0.5, "answers after the read: %r" % lag)
    assert_between(max(lag), -0.002, 0.5, "answers after the read: %r" % lag)
    assert all(int(l["ms"]) < 500 for l in late), "answered from the cache at once: %r" % [l["ms"] for l in late]


def test_twenty_concurrent_cost_one_schedule(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("one", "pending")
    sb.put_tx("many", "pending")
    kit.parallel([lambda: k.get("id=one")] + [lambda: k.get("id=many") for _ in range(20)])
    # 20 requests cost one pace up to the latest one's deadline: what one
    # request costs when they arrive together (a busy machine may spread them)
    one, _ = kit.check_one_pace(sb, [k], "one")
    many, last = kit.check_one_pace(sb, [k], "many")
    print("# reads for 1 request: %d, for 20 concurrent requests: %d (the last deadline %.3f s after the first read)"
          % (len(one), len(many), last))
    assert all(r["http"] == 200 for r in sb.reads("many")), "no read was rejected by Kasera"


def test_late_joiner_follows_the_pace(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "pending")
    first = threading.Thread(target=lambda: k.get("id=t1"))
    first.start()
    k.wait_log(30, event="read", id="t1")
    time.sleep(1.6)
    r = k.get("id=t1")
    first.join()
    # one pace (every wait 1.1 s) that goes on for the joiner until its own
    # deadline, FAST_HOLD (4.8 s) after it arrived, and no further; every
    # time from kembali's log
    starts, deadline = kit.check_one_pace(sb, [k], "t1")
    reads = k.find_log(event="read", id="t1")
    first_start = min(kit.began(l) for l in reads)
    arrived = sorted((kit.began(l) - first_start, l)
                     for l in k.find_log(event="request", id="t1"))
    assert_eq(len(arrived), 2)
    (first_at, _), (joiner_at, joiner) = arrived
    assert first_at <= 0.003, "the first request started the first read: %r" % (arrived,)
    assert joiner_at >= 1.5, "the joiner came at least one wait after the first read: %.3f" % joiner_at
    assert_between(deadline, joiner_at + kit.FAST_HOLD - 0.001, joiner_at + kit.FAST_HOLD + 0.001,
                   "the last deadline is the joiner's")
    print("# late joiner at %.3f s: reads started at %r, its deadline %.3f s" % (joiner_at, starts, deadline))
    assert starts[-1] > first_at + kit.FAST_HOLD, "the joiner kept the pace going past the first request's: %r" % starts
    assert_eq(r.header("kembali-status"), "checking")
    # answered at the end of its last read (no read could start before its
    # deadline): at least 3.7 s after it arrived, by its deadline
    assert_between(int(joiner["ms"]) / 1000, 3.7 - 0.003, kit.FAST_HOLD + 0.1, "the joiner waits its own deadline")


@testenv.timeout(100)
def test_json_polling_every_half_second(tmpdir):
    sb, k = kit.start(tmpdir, schedule=None)
    sb.put_tx("t1", "pending")
    t_end = time.monotonic() + 60
    answers = []
    while time.monotonic() < t_end:
        r = k.get("id=t1&format=json")
        answers.append(r)
        assert_eq(r.header("kembali-status"), "checking")
        assert_eq(r.json()["final"], False)
        assert_eq(r.json()["status"], "pending")
        ra = int(r.header("retry-after"))
        assert_between(ra, 1, 13, "Retry-After")
        time.sleep(0.5)
    times, _ = kit.check_pace(sb, [k], "t1", min_start_gap=1.5)
    print("# JSON polled every 0.5 s for 60 s: %d answers, %d reads started at %r" % (len(answers), len(times), times))
    # A read starts at the first poll that comes once the pace allows one
    # (each wait is the schedule's plus up to one polling interval). Replay
    # the polls as kembali saw them (arrivals from its log, relative to the
    # first read's start) against the schedule: a busy machine may delay
    # polls, but not change which poll must start a read.
    first = min(kit.began(l) for l in k.find_log(event="read", id="t1"))
    polls = sorted(kit.began(l) - first for l in k.find_log(event="request", id="t1"))
    waits = [1.5, 2, 3, 5, 8, 13]
    sends = kit.read_sends([k], "t1")  # each wait runs from the previous read's send
    for i in range(1, len(times) + 1):
        allowed = sends[i - 1] + waits[min(i - 1, len(waits) - 1)]
        if i == len(times):
            assert not [p for p in polls if p >= allowed + 0.005], \
                "a poll came after read %d was allowed at %.3f, but no read: %r" % (i + 1, allowed, times)
            break
        assert times[i] >= allowed - 0.003, "read %d before the pace allowed it: %r" % (i + 1, times)
        # the poll due to start it; one within 5 ms of the moment (log
        # rounding) may have come just before or just after it
        due = [p for p in polls if p >= allowed - 0.005][:2]
        ok = [p for p in due[:2 if due and due[0] < allowed + 0.005 else 1] if -0.003 <= times[i] - p <= 0.35]
        assert ok, "read %d at %.3f, allowed at %.3f, not started by the first poll after: %r" % (
            i + 1, times[i], allowed, due)
    # every answer came fast: a JSON request never waits through the
    # schedule, at most for one read; by kembali's log, which leaves out the
    # test's own threads and connects
    took = kit.answered_in(k, "t1", len(answers))
    assert_eq(len(took), len(answers))
    print("# slowest JSON answer %.0f ms by kembali's log, %.0f ms at the client"
          % (1000 * max(took), 1000 * max(r.elapsed for r in answers)))
    assert max(took) < 1.0, "a JSON answer waited: %.3f s" % max(took)


def test_json_fresh_transaction_one_read(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "canceled")
    sb.put_tx("t2", "pending")
    r = k.get("id=t1", accept="application/json")
    assert_eq(r.json(), {"id": "t1", "status": "canceled", "final": True})
    r = k.get("id=t2", accept="application/json")
    assert_eq(r.json(), {"id": "t2", "status": "pending", "final": False})
    assert_eq(r.header("retry-after"), "2", "1.1 s until the pace allows the next read, rounded up")
    r = k.get("id=t2", accept="application/json")
    assert_eq(len(sb.reads("t2")), 1, "the second JSON request came too early for a read")
    assert_eq(r.json()["status"], "pending")


def test_read_completes_when_its_requester_leaves(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "succeeded", responses=[{"delay_ms": 800}])
    s = testenv.fcgi_send(k.addr, testenv.cgi_params("id=t1"))
    testenv.wait_for(lambda: sb.reads("t1"), 30)  # the read it started is in flight
    s.close()  # the buyer closed the tab
    r = k.get("id=t1")
    assert_eq(r.header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("t1")), 1, "the joiner waited for the read in flight")
    assert min(kit.answered_in(k, "t1", 2)) < 1.0, "the joiner was answered when that read ended"


if __name__ == "__main__":
    testenv.run(globals())
