"""Held requests: N concurrent FastCGI requests for pending transactions,
each held by kembali until its deadline (the default schedule: 34 s).

N is spread as buyers spread it: ``shops`` shops (one key each, so their
read budgets do not mix) x transactions per shop x ``tabs`` tabs per
transaction (10,000 = 20 x 20 x 25). Every case gets a fresh sandbox and
kembali (default settings and schedule, read_budget_per_minute 300), so
the peak RSS (VmHWM) is that case's own. The client is this one process:
non-blocking connects (retried while kembali's backlog is full), one
selector for every socket."""

import os
import selectors
import socket
import statistics
import struct
import time

import testenv

HDR = struct.Struct(">BBHHBB")


def shape(n, shops, tabs):
    """(shops, transactions per shop, tabs per transaction) whose product is
    as close to n as these whole numbers allow."""
    txs = max(1, round(n / tabs))
    s = max(1, min(shops, txs))
    return s, max(1, round(txs / s)), tabs


def _ended(buf):
    """Whether buf (FastCGI records from the start) holds an FCGI_END_REQUEST."""
    off = 0
    while len(buf) - off >= 8:
        _, rtype, _, clen, plen, _ = HDR.unpack_from(buf, off)
        if len(buf) - off < 8 + clen + plen:
            return False
        if rtype == testenv.FCGI_END_REQUEST:
            return True
        off += 8 + clen + plen
    return False


def _word(buf):
    i = buf.find(b"Kembali-Status: ")
    return buf[i + 16:buf.find(b"\r", i)].decode("latin-1") if i >= 0 else "?"


def _fds(pid):
    try:
        return len(os.listdir("/proc/%d/fd" % pid))
    except OSError:
        return 0


class _Req:
    __slots__ = ("payload", "sock", "out", "buf", "t0", "took", "word")

    def __init__(self, payload):
        self.payload, self.sock, self.out, self.buf = payload, None, b"", bytearray()
        self.t0 = self.took = self.word = None


def start(d, nshops, bin=None):
    """A sandbox and a kembali (`bin`, or the one built here) with nshops
    shops (shop-I, host shop-I.test, own key, read budget 300), default
    schedule. Returns (sandbox, kembali)."""
    keys = {"s%d" % i: "sk_test_kembali_bench_%04d" % i for i in range(nshops)}
    sb = testenv.Sandbox(d, keys=list(keys.values()))

    def config(k):
        shops = [testenv.make_shop("shop-%d" % i, k.key_path("s%d" % i), read_budget_per_minute=300)
                 for i in range(nshops)]
        return testenv.make_config(sb, shops)

    k = testenv.Kembali(d, config=config, keys=keys, bin=bin)
    k.start()
    return sb, k


def run_case(tmpdir, n, shops=20, tabs=25, timeout=90.0):
    """One case; returns a dict of figures (see bench.py's table)."""
    ns, per, tabs = shape(n, shops, tabs)
    d = os.path.join(tmpdir, "held-%d" % n)
    os.makedirs(d)
    sb, k = start(d, ns)
    try:
        return _load(sb, k, ns, per, tabs, timeout)
    finally:
        k.stop(timeout=40)
        sb.stop()


def _load(sb, k, ns, per, tabs, timeout):
    ids = {}
    for s in range(ns):
        for t in range(per):
            tid = "held-s%d-t%d" % (s, t)
            sb.put_tx(tid, "pending")
            ids[tid] = testenv.fcgi_request_bytes(testenv.cgi_params("id=" + tid, host="shop-%d.test" % s))
    # every transaction's first tab, then every second tab, ...
    reqs = [_Req(p) for _ in range(tabs) for p in ids.values()]
    n = len(reqs)
    rss0 = k.rss_kb()
    sel = selectors.DefaultSelector()
    peak = {"held": 0, "fds": 0}
    last_sample = [0.0]
    done = [0]

    def sample(force=False):
        now = time.monotonic()
        if not force and now - last_sample[0] < 0.5:
            return
        last_sample[0] = now
        peak["fds"] = max(peak["fds"], _fds(k.pid))
        try:
            m = k.metrics(timeout=10)
            peak["held"] = max(peak["held"], int(m.get("kembali_held_requests", 0)))
        except (testenv.FcgiError, AssertionError, OSError):
            pass

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
            if not chunk or _ended(r.buf):
                r.took = time.monotonic() - r.t0
                r.word = _word(r.buf) if _ended(r.buf) else "closed early"
                sel.unregister(r.sock)
                r.sock.close()
                done[0] += 1

    t_start = time.monotonic()
    retries = 0
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
                retries += 1
                pump(0.002)
        r.sock = s
        try:
            r.out = r.payload[s.send(r.payload):]
        except BlockingIOError:
            r.out = r.payload
        sel.register(s, selectors.EVENT_WRITE if r.out else selectors.EVENT_READ, r)
        pump(0)
        sample()
    sent = time.monotonic() - t_start
    deadline = time.monotonic() + timeout
    while done[0] < n and time.monotonic() < deadline:
        pump(0.2)
        if done[0] == 0:
            sample()
    sample(force=True)
    for r in reqs:  # whatever is left did not get an answer in time
        if r.took is None:
            sel.unregister(r.sock)
            r.sock.close()
    hwm = k.peak_rss_kb()
    counts = {}
    for rd in sb.reads():
        if rd.get("id") in ids:
            counts[rd["id"]] = counts.get(rd["id"], 0) + 1
    per_tx = [counts.get(t, 0) for t in ids]
    took = sorted(r.took for r in reqs if r.took is not None)
    words = {}
    for r in reqs:
        w = r.word or "unanswered"
        words[w] = words.get(w, 0) + 1
    return {"n": n, "shape": "%d x %d x %d" % (ns, per, tabs), "sent_s": sent, "retries": retries,
            "held_peak": peak["held"], "fds_peak": peak["fds"], "rss0_kb": rss0, "hwm_kb": hwm,
            "kb_per_req": (hwm - rss0) / n, "took": took, "words": words,
            "reads_per_tx": per_tx, "reads": sum(per_tx)}


def spread(xs):
    """(min, median, max) of xs, or None for no values."""
    return (min(xs), statistics.median(xs), max(xs)) if xs else None
