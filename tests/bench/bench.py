"""kembali benchmarks: print the figures the core issue asks for.

    python3 tests/bench/bench.py [--held N] [--long]

Starts the Kasera sandbox and kembali (default settings, default schedule),
then measures:
  - held requests: N (default 2000) concurrent FastCGI requests for one
    pending transaction, each held up to 34 s: how many were held at once
    (kembali's own gauge), peak RSS, reads made, time until all answered;
  - reads for 20 concurrent requests on a fresh pending transaction;
  - connections opened for 10 sequential reads;
  - cross-process wake latency: two processes on one state_dir, one waiting
    on the other's read (20 samples);
  - with --long: reads made when a JSON answer is polled every 0.5 s for 60 s.
Figures, not pass/fail: the tests assert behaviour, this prints numbers."""

import argparse
import os
import resource
import selectors
import socket
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))
import harness  # noqa: E402
import kit  # noqa: E402


def raise_nofile():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def held(k, sb, n):
    sb.put_tx("held-1", "pending")
    params = harness.cgi_params("id=held-1")
    payload = harness.fcgi_request_bytes(params)
    sel = selectors.DefaultSelector()
    socks = []
    t0 = time.monotonic()
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(k.addr)
        s.sendall(payload)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, bytearray())
        socks.append(s)
    sent = time.monotonic() - t0
    # wait until kembali reports them all held
    peak_held = 0
    for _ in range(200):
        m = k.metrics()
        peak_held = max(peak_held, int(m.get("kembali_held_requests", 0)))
        if peak_held >= n:
            break
        time.sleep(0.05)
    rss_held = k.rss_kb()
    done = 0
    statuses = {}
    deadline = time.monotonic() + 60
    while done < n and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1):
            s, buf = key.fileobj, key.data
            chunk = s.recv(65536)
            if chunk:
                buf += chunk
                continue
            sel.unregister(s)
            s.close()
            done += 1
            i = buf.find(b"Kembali-Status: ")
            word = buf[i + 16:buf.find(b"\r", i)].decode() if i >= 0 else "?"
            statuses[word] = statuses.get(word, 0) + 1
    took = time.monotonic() - t0
    reads = kit.read_times(sb, "held-1")
    print("held requests: %d sent in %.1f s; held at once (kembali gauge): %d; answered: %d %r after %.1f s"
          % (n, sent, peak_held, done, statuses, took))
    print("  RSS while holding them: %.1f MB; peak RSS (VmHWM): %.1f MB" % (rss_held / 1024, k.peak_rss_kb() / 1024))
    print("  reads of that transaction: %d at %r" % (len(reads), reads))


def twenty(k, sb):
    sb.put_tx("twenty-1", "pending")
    ts = [threading.Thread(target=lambda: k.get("id=twenty-1", timeout=60)) for _ in range(20)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    times = kit.read_times(sb, "twenty-1")
    print("20 concurrent requests: %d reads at %r; smallest gap %.3f s" % (len(times), times, kit.min_gap(times)))


def sequential(k, sb):
    def v1():  # connections to /v1/* only (the control API opens its own)
        st = sb.stats()
        return st.get("v1_connections", st.get("connections", 0))
    before = v1()
    for i in range(10):
        sb.put_tx("seq-%d" % i, "succeeded")
    for i in range(10):
        k.get("id=seq-%d&format=json" % i)
    after = v1()
    m = k.metrics()
    print("10 sequential reads: %d new connection(s) seen by the sandbox (kembali counted %d in all)"
          % (after - before, int(m.get("kembali_api_connections_total", 0))))


def polling(k, sb):
    sb.put_tx("poll-1", "pending")
    end = time.monotonic() + 60
    n = 0
    while time.monotonic() < end:
        k.get("id=poll-1&format=json")
        n += 1
        time.sleep(0.5)
    times = kit.read_times(sb, "poll-1")
    print("JSON polled every 0.5 s for 60 s: %d answers, %d reads at %r" % (n, len(times), times))


def wake(tmp):
    """Two processes on one state_dir: from the end of one's read to the
    other's answer, which waited on it."""
    import statistics
    os.makedirs(os.path.join(tmp, "wake"))
    sb, (a, b) = kit.start_many(os.path.join(tmp, "wake"), 2)
    try:
        lat = sorted(kit.wake_latencies(sb, a, b, 20))
        print("wake latency across processes, read end to the waiter's answer (20 samples, 1 ms log "
              "resolution): median %.0f ms, max %.0f ms" % (statistics.median(lat), max(lat)))
    finally:
        for p in (a, b, sb):
            p.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--held", type=int, default=2000)
    ap.add_argument("--long", action="store_true")
    a = ap.parse_args()
    raise_nofile()
    tmp = tempfile.mkdtemp(prefix="kembali-bench-")
    sb, k = kit.start(tmp, schedule=None)
    try:
        print("kembali pid %d, RSS at start %.1f MB" % (k.proc.pid, k.rss_kb() / 1024))
        sequential(k, sb)
        twenty(k, sb)
        held(k, sb, a.held)
        wake(tmp)
        if a.long:
            polling(k, sb)
    finally:
        k.stop()
        sb.stop()


if __name__ == "__main__":
    main()
