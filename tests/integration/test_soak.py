"""The fault soak (tests/soak/soak.py, `make soak` for 30 minutes) for 120 s:
4 processes on one socket under many tabs while the sandbox injects every
fault class and processes are killed; and the sandbox's chaos and outage
calls the soak relies on."""

import http.client
import os
import socket
import sys
import time
import urllib.error
import urllib.request

import testenv
from testenv import assert_eq, assert_in

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "soak"))
import soak  # noqa: E402

KEY = testenv.DEFAULT_KEY


def read(sb, id, key=KEY):
    """One read: (HTTP status, headers, body), or (0, {}, b"") for a dropped connection."""
    req = urllib.request.Request(sb.base + "/v1/transactions/" + id, headers={"Authorization": "Bearer " + key})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()
    except (ConnectionError, http.client.HTTPException):  # a reset
        return 0, {}, b""


def test_sandbox_chaos_forced_faults_and_outage(tmpdir):
    sb = testenv.Sandbox(tmpdir)
    for i in range(12):
        sb.put_tx("c%d" % i, "succeeded")
    # forced faults come first, in order, for the key asked for
    sb.force_fault("auth_block")
    sb.force_fault("key_limit", key_tail=KEY[-4:])
    st, h, body = read(sb, "c0")
    assert_eq(st, 429)
    assert_in(b"authentication attempts", body)
    assert "RateLimit-Reset" not in h and "Retry-After" not in h, h
    st, h, body = read(sb, "c1")
    assert_eq((st, "Retry-After" in h), (429, False))
    # chaos: every read gets one of the kinds asked for, named in the read log
    sb.chaos(5, rate=1.0, kinds=["retry_after_date", "huge", "reset"], hang_ms=100)
    got = [read(sb, "c%d" % i) for i in range(2, 12)]
    faults = [r["fault"] for r in sb.reads()[2:]]
    assert set(faults) <= {"retry_after_date", "huge", "reset"} and len(faults) == 10, faults
    for (st, h, body), r in zip(got, sb.reads()[2:]):
        if r["fault"] == "huge":
            assert_eq((st, len(body) > 65536), (200, True))
        elif r["fault"] == "reset":
            assert_eq(st, 0)
        else:
            assert_eq(st, 429)
            assert_in("GMT", h["Retry-After"])
            assert 1000 <= r["retry_after_ms"] <= 4000, r
    stats = sb.stats()
    assert_eq(sum(stats["chaos"].values()), 12)
    assert_eq(stats["chaos"]["auth_block"], 1)
    try:
        sb.chaos(1, kinds=["nope"])
    except testenv.SandboxError as e:
        assert_in("400", str(e))
    else:
        raise AssertionError("an unknown kind was accepted")
    # the outage: refused, then back on the same port with every read logged so far
    sb.chaos_off()
    sb.outage(1500)
    time.sleep(0.5)
    try:
        socket.create_connection(("127.0.0.1", sb.port), timeout=1).close()
        raise AssertionError("the sandbox still accepts during its outage")
    except ConnectionRefusedError:
        pass
    testenv.wait_for(lambda: sb.stats(), 10, interval=0.1)
    assert_eq(sb.stats()["outages"], 1)
    assert_eq(len(sb.reads()), 12)
    assert_eq(read(sb, "c0")[0], 200)


@testenv.timeout(330)
def test_fault_soak_two_minutes(tmpdir):
    s = soak.Soak(tmpdir, seconds=120, clients=30, out=lambda line: print("# " + line, flush=True))
    try:
        s.run()
    finally:
        s.report()
    assert not s.failures, "the soak failed (see its table above):\n" + "\n".join(s.failures)


if __name__ == "__main__":
    testenv.run(globals())
