"""Wide, not just deep: N held requests over N distinct transactions (a
hosting box: many shops, each with a few buyers), with a cached probe
every 20 ms beside them.

A case is ``shops`` shops (own key each, read budget 300) x transactions
per shop x ``tabs`` tabs, every buyer its own address. A fresh sandbox and
kembali per case (default settings and schedule: each pending request held
~34 s). While the held requests are sent, held and answered, another
process asks for a transaction whose final status is cached, every 20 ms
on one kept connection, and times each answer: how long a buyer whose
answer is known waits behind everybody who waits.

Per case: the probe's p50 / p99 / max; kembali's CPU (utime + stime) per
read that ended while every request was held (from the last one sent to
32 s after the first, before any deadline: what reads' ends, timers and
wakes cost, without accepting or answering); the peak RSS (VmHWM); the
answers, and how many came later than their deadline (34 s, plus 0.5 s of
the client's own slack). The same probe against the yardstick (nothing
held) is the floor this machine and client give."""

import multiprocessing
import os
import selectors
import socket
import time

import testenv
import held

PROBE_MS = 20
HOLD_S = 34.0      # the default schedule's sum plus 1.5 s
LATE_SLACK_S = 0.5
WINDOW_S = 32.0    # the steady window ends this long after the first request


def _cpu_ticks(pid):
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def _probe_main(addr, params, interval, stop, out):
    """The probe, in its own process (the held client's loop must not
    delay it): one kept connection, a cached answer every `interval` s;
    sends back [(t, seconds)]."""
    got = []
    s = None
    payload = testenv.fcgi_request_bytes(params, keep_conn=True)
    nxt = time.monotonic()
    while not stop.is_set():
        try:
            if s is None:
                s = testenv.fcgi_connect(addr)
            t0 = time.monotonic()
            s.sendall(payload)
            testenv.fcgi_receive(s, timeout=10, close=False)
            got.append((t0, time.monotonic() - t0))
        except (OSError, testenv.FcgiError):
            if s is not None:
                s.close()
            s = None
        nxt += interval
        time.sleep(max(0.0, nxt - time.monotonic()))
    if s is not None:
        s.close()
    out.send(got)
    out.close()


class Probe:
    """The probe process around a block: start(), stop() -> [(t, seconds)]."""

    def __init__(self, addr, params, interval=PROBE_MS / 1000):
        ctx = multiprocessing.get_context("fork")
        self.stop_ev = ctx.Event()
        self.rx, tx = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_probe_main, args=(addr, params, interval, self.stop_ev, tx), daemon=True)
        self.tx = tx

    def start(self):
        self.proc.start()
        self.tx.close()
        return self

    def stop(self):
        self.stop_ev.set()
        got = self.rx.recv() if self.rx.poll(30) else []
        self.proc.join(10)
        return got


def pctl(xs, p):
    """The p-th percentile (nearest rank) of sorted xs, or None."""
    if not xs:
        return None
    i = min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[i]


def probe_figures(samples):
    ms = sorted(x * 1000 for _, x in samples)
    return {"probes": len(ms), "p50": pctl(ms, 50), "p99": pctl(ms, 99), "max": ms[-1] if ms else None}


def start(d, nshops, bin=None):
    """A sandbox and kembali with nshops shops (held.start), and the probe's
    transaction, its final status cached."""
    sb, k = held.start(d, nshops, bin=bin)
    sb.put_tx("probe-1", "succeeded")
    r = k.get("id=probe-1", host="shop-0.test")
    assert r.header("Kembali-Status") == "succeeded", r
    return sb, k


def probe_params():
    return testenv.cgi_params("id=probe-1", host="shop-0.test", extra={"REMOTE_ADDR": "192.0.2.1"})


def run_case(tmpdir, n, shops=100, tabs=1, bin=None, label="", timeout=90.0):
    """One case; returns a dict of figures (see print_table)."""
    ns, per, tabs = held.shape(n, shops, tabs)
    d = os.path.join(tmpdir, "wide-%d-%d%s" % (n, tabs, label))
    os.makedirs(d)
    sb, k = start(d, ns, bin)
    try:
        return _load(sb, k, ns, per, tabs, timeout)
    finally:
        k.stop(timeout=40)
        sb.stop()


def _load(sb, k, ns, per, tabs, timeout):
    ids = []
    payloads = []
    for s in range(ns):
        for t in range(per):
            tid = "wide-s%d-t%d" % (s, t)
            sb.put_tx(tid, "pending")
            ids.append(tid)
            addr = "10.%d.%d.%d" % (len(ids) >> 16 & 255, len(ids) >> 8 & 255, len(ids) & 255)
            payloads.append(testenv.fcgi_request_bytes(testenv.cgi_params(
                "id=" + tid, host="shop-%d.test" % s, extra={"REMOTE_ADDR": addr})))
    reqs = [held._Req(p) for _ in range(tabs) for p in payloads]
    n = len(reqs)
    rss0 = k.rss_kb()
    sel = selectors.DefaultSelector()
    done = [0]

    def pump(wait):
        for key, ev in sel.select(timeout=wait):
            r = key.data
            if ev & selectors.EVENT_WRITE:
                try:
                    r.out = r.out[r.sock.send(r.out):]
                except BlockingIOError:
                    pass
                except OSError:
                    r.out = b""
                if not r.out:
                    sel.modify(r.sock, selectors.EVENT_READ, r)
                continue
            try:
                chunk = r.sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            r.buf += chunk
            if not chunk or held._ended(r.buf):
                r.took = time.monotonic() - r.t0
                r.word = held._word(r.buf) if held._ended(r.buf) else "closed early"
                sel.unregister(r.sock)
                r.sock.close()
                done[0] += 1

    probe = Probe(k.addr, probe_params()).start()
    time.sleep(0.5)
    t_first = time.monotonic()
    for r in reqs:
        r.t0 = time.monotonic()
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(k.addr)
                break
            except BlockingIOError:  # kembali's backlog is full: let it accept
                s.close()
                pump(0.002)
        r.sock = s
        try:
            r.out = r.payload[s.send(r.payload):]
        except BlockingIOError:
            r.out = r.payload
        sel.register(s, selectors.EVENT_WRITE if r.out else selectors.EVENT_READ, r)
        pump(0)
    t_sent = time.monotonic()
    # the steady window: everything sent, nothing due yet
    while time.monotonic() < t_sent + 1.0:
        pump(0.1)
    w0_t, w0_cpu, w0_reads = time.monotonic(), _cpu_ticks(k.pid), len(sb.reads())
    while time.monotonic() < t_first + WINDOW_S:
        pump(0.1)
    w1_t, w1_cpu, w1_reads = time.monotonic(), _cpu_ticks(k.pid), len(sb.reads())
    deadline = time.monotonic() + timeout
    while done[0] < n and time.monotonic() < deadline:
        pump(0.2)
    t_done = time.monotonic()
    samples = probe.stop()
    for r in reqs:
        if r.took is None:
            sel.unregister(r.sock)
            r.sock.close()
    hwm = k.peak_rss_kb()
    tick = os.sysconf("SC_CLK_TCK")
    ended = w1_reads - w0_reads
    took = sorted(r.took for r in reqs if r.took is not None)
    words = {}
    for r in reqs:
        w = r.word or "unanswered"
        words[w] = words.get(w, 0) + 1
    out = {"n": n, "txs": len(ids), "shape": "%d x %d x %d" % (ns, per, tabs), "sent_s": t_sent - t_first,
           "window_s": w1_t - w0_t, "reads_ended": ended,
           "cpu_ms": (w1_cpu - w0_cpu) * 1000 / tick,
           "cpu_us_per_read": (w1_cpu - w0_cpu) * 1e6 / tick / ended if ended else None,
           "reads": len(sb.reads()), "hwm_kb": hwm, "rss0_kb": rss0, "took_max": took[-1] if took else None,
           "late": sum(1 for r in reqs if r.took is None or r.took > HOLD_S + LATE_SLACK_S),
           "words": words, "probe_all": probe_figures(samples),
           "probe_held": probe_figures([x for x in samples if t_sent <= x[0] <= t_done])}
    return out


def yardstick_case(tmpdir):
    """The probe alone against the yardstick for 10 s: the floor."""
    import throughput
    d = os.path.join(tmpdir, "wide-yardstick")
    os.makedirs(d)
    resp = os.path.join(d, "answer")
    with open(resp, "wb") as f:
        f.write(b"Status: 200 OK\r\nContent-Type: text/html\r\nKembali-Status: succeeded\r\n\r\n" + b"x" * 3000)
    ys = throughput.Yardstick(d, resp)
    try:
        ys.start()
    except throughput.Skipped as e:
        return {"skipped": str(e)}
    try:
        p = Probe(ys.sock, probe_params()).start()
        time.sleep(10)
        return {"probe_all": probe_figures(p.stop())}
    finally:
        ys.stop()


def _f(x, fmt="%.1f"):
    return fmt % x if x is not None else "-"


def print_table(rows, table):
    """rows: (name, figures) in order; table: bench.py's table()."""
    print("Wide: held requests over distinct transactions (100 shops, every buyer its own address), "
          "a cached answer asked every %d ms beside them (fresh kembali per case):" % PROBE_MS)
    out = []
    for name, c in rows:
        if "skipped" in c:
            out.append(["%s: skipped: %s" % (name, c["skipped"])])
            continue
        p = c["probe_all"]
        if "n" not in c:
            out.append([name, "-", "-", "%s / %s / %s" % (_f(p["p50"], "%.2f"), _f(p["p99"], "%.2f"), _f(p["max"])),
                        "-", "-", "-", "-", "-"])
            continue
        ph = c["probe_held"]
        out.append([name, "%d" % c["n"], c["shape"],
                    "%s / %s / %s" % (_f(p["p50"], "%.2f"), _f(p["p99"], "%.2f"), _f(p["max"])),
                    "%s / %s / %s" % (_f(ph["p50"], "%.2f"), _f(ph["p99"], "%.2f"), _f(ph["max"])),
                    "%s (%d reads)" % (_f(c["cpu_us_per_read"], "%.0f"), c["reads_ended"]),
                    "%.1f" % (c["hwm_kb"] / 1024), "%.1f / %d" % (c["took_max"] or 0, c["late"]),
                    " ".join("%s=%d" % kv for kv in sorted(c["words"].items()))])
    table(["case", "held", "shops x tx x tabs", "probe ms p50 / p99 / max", "while held", "CPU us / read end",
           "VmHWM MB", "answer max s / late", "answers"], out)
    print("  targets (10,000 distinct): probe p99 < 5 ms, max < 25 ms; CPU per read end flat in N; "
          "none late; VmHWM < 40 MB")
    print("  (probe: from the first held request sent to the last answered; while held: after the last was sent; "
          "CPU: utime+stime over the reads that ended from 1 s after the last was sent to 32 s after the first; "
          "late: answered after %.1f s or not at all)" % (HOLD_S + LATE_SLACK_S))
