"""SIGUSR2 under load: N held requests (pending transactions, default
schedule), one client asking for a cached answer back to back, then an
upgrade in place. Reports the handover's time (the old process's
event=upgrade line: from the new one's "ready" to its confirmation of the
batch), how long the old one took to exit, and the gap: the longest a new
request waited while it all happened (docs/handover.md)."""

import os
import selectors
import signal
import socket
import threading
import time

import testenv
import held


def _open_held(k, sb, n, nshops):
    """n connections, each with a request held (spread over nshops shops)."""
    per = max(1, n // (nshops * 5))
    ids = []
    for s in range(nshops):
        for t in range(per):
            tid = "up-s%d-t%d" % (s, t)
            sb.put_tx(tid, "pending")
            ids.append((tid, s))
    socks = []
    for i in range(n):
        tid, s = ids[i % len(ids)]
        payload = testenv.fcgi_request_bytes(testenv.cgi_params("id=" + tid, host="shop-%d.test" % s))
        while True:
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                c.connect(k.addr)
                break
            except (BlockingIOError, ConnectionRefusedError, OSError):
                c.close()
                time.sleep(0.005)
        c.sendall(payload)
        socks.append(c)
    testenv.wait_for(lambda: int(k.metrics(timeout=10).get("kembali_held_requests", 0)) >= n, 120,
                     msg="%d requests held" % n)
    return socks


def run_case(tmpdir, n, nshops=20):
    d = os.path.join(tmpdir, "upgrade-%d" % n)
    os.makedirs(d)
    sb, k = held.start(d, nshops)
    new_pid = None
    socks = []
    try:
        sb.put_tx("up-cached", "succeeded")
        k.get("id=up-cached", host="shop-0.test")
        socks = _open_held(k, sb, n, nshops)
        times, errors = [], []
        stop = threading.Event()

        def probe():
            while not stop.is_set():
                t0 = time.monotonic()
                try:
                    r = k.get("id=up-cached", host="shop-0.test", timeout=20)
                    if r.header("kembali-status") != "succeeded":
                        errors.append(r.status)
                except Exception as e:  # noqa: BLE001 - reported
                    errors.append(repr(e))
                times.append(time.monotonic() - t0)

        th = threading.Thread(target=probe)
        th.start()
        time.sleep(0.3)
        t_sig = time.monotonic()
        k.signal(signal.SIGUSR2)
        rc = k.wait(30)
        exit_s = time.monotonic() - t_sig
        time.sleep(0.3)
        stop.set()
        th.join(30)
        line = k.wait_log(10, event="upgrade", msg="handed over to the new process; this one exits once its "
                                                    "reads have ended")
        new_pid = int(k.wait_log(10, event="start", upgraded_from=k.pid)["pid"])
        took = k.wait_log(10, event="handover", **{"from": str(k.pid)})
        return {"n": n, "handed": int(line["handed"]), "ms": int(line["ms"]), "adopt_ms": int(took["ms"]),
                "exit_s": exit_s, "rc": rc, "gap_ms": max(times) * 1000 if times else None,
                "probes": len(times), "errors": len(errors)}
    finally:
        for c in socks:
            c.close()
        if new_pid is not None:
            try:
                os.kill(new_pid, signal.SIGTERM)
                testenv.wait_for(lambda: not os.path.exists("/proc/%d" % new_pid), 30, msg="new process gone")
            except ProcessLookupError:
                pass
        k.stop(timeout=40)
        sb.stop()


def print_table(cases, table):
    print("Upgrade in place (SIGUSR2) with N held requests; a client asks for a cached answer back to back:")
    table(["N held", "handed over", "handover ms", "new one's adopt ms", "old exited after", "gap (longest wait)",
           "new requests", "failed"],
          [["%d" % c["n"], "%d" % c["handed"], "%d" % c["ms"], "%d" % c["adopt_ms"], "%.2f s" % c["exit_s"],
            "%.0f ms" % c["gap_ms"] if c["gap_ms"] is not None else "-", "%d" % c["probes"], "%d" % c["errors"]]
           for c in cases])
    print("  (handover ms: the old process's, from the new one's ready to its confirmation of the batch; the old one "
          "exits once its reads in flight have ended)")
