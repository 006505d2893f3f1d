"""The streamed page under load, behind nginx: N concurrent buyers, each
on a pending transaction of its own that succeeds at a random time (1 to
25 s after it came back), as browsers (Sec-Fetch-Dest: document: the
streamed page) and, as the baseline, without it (the single answer).
Figures: time to the first body byte at the client (p50/p99), time from
the read that found the status (kembali's log) to the end of the page at
the client (p50/p99), reads per transaction, and RSS per request (the
peak VmHWM above kembali's RSS before the load, over N). The client is
this one process, one selector for every socket."""

import os
import random
import selectors
import socket
import statistics
import time

import testenv
import held
import kit


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def _rss_kb(pid, field):
    for line in open("/proc/%d/status" % pid):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


class BigNginx(testenv.Nginx):
    """The harness's nginx with room for a thousand buyers (a client and
    an upstream connection each)."""

    def conf(self, port):
        return super().conf(port).replace("worker_connections 1024;",
                                          "worker_connections 8192; multi_accept on;")


def run_case(tmpdir, n, streamed, shops=10, seed=1):
    d = os.path.join(tmpdir, "streamed-%d-%s" % (n, "doc" if streamed else "single"))
    os.makedirs(d)
    sb, k = held.start(d, shops)
    ng = BigNginx(d, k, keepalive=32)
    rnd = random.Random(seed)
    try:
        base = _rss_kb(k.proc.pid, "VmRSS")
        ids = []
        for i in range(n):
            id = "st-%d" % i
            sb.put_tx(id, [(0, "pending"), (rnd.randint(1000, 25000), "succeeded")])
            ids.append((id, i % shops))
        sel = selectors.DefaultSelector()
        buyers = {}
        left = 0

        def take(timeout):
            """Read what came; the time a byte came is when select saw it."""
            nonlocal left
            for key, _ in sel.select(timeout):
                c, b = key.fileobj, key.data
                try:
                    chunk = c.recv(65536)
                except BlockingIOError:
                    continue
                now = time.monotonic()
                if chunk:
                    b["buf"] += chunk
                    if b["first"] is None:
                        h = b["buf"].find(b"\r\n\r\n")
                        if h >= 0 and len(b["buf"]) > h + 4:
                            b["first"] = now - b["t0"]
                    continue
                b["end"], b["wall_end"] = now - b["t0"], time.time()
                sel.unregister(c)
                c.close()
                left -= 1

        t_start = time.monotonic()
        for id, s in ids:
            c = socket.create_connection(("127.0.0.1", ng.port))
            c.setblocking(False)
            req = ("GET /kembali?id=%s HTTP/1.1\r\nHost: shop-%d.test\r\nConnection: close\r\n%s\r\n"
                   % (id, s, "Sec-Fetch-Dest: document\r\n" if streamed else "")).encode()
            c.sendall(req)
            b = {"id": id, "t0": time.monotonic(), "buf": b"", "first": None, "end": None, "wall_end": None}
            buyers[c] = b
            sel.register(c, selectors.EVENT_READ, b)
            left += 1
            take(0)  # what came meanwhile, so a first byte is timed when it came
        deadline = time.monotonic() + 60
        while left and time.monotonic() < deadline:
            take(1.0)
        peak = _rss_kb(k.proc.pid, "VmHWM")
        sent_in = time.monotonic() - t_start
        found = {}
        for line in k.find_log(event="read", status="succeeded"):
            found.setdefault(line["id"], kit.log_time(line))
        read_to_end = [b["wall_end"] - found[b["id"]] for b in buyers.values()
                       if b["wall_end"] and b["id"] in found]
        reads = {}
        for r in sb.reads():
            reads[r.get("id")] = reads.get(r.get("id"), 0) + 1
        words = {}
        for b in buyers.values():
            w = "none"
            for line in b["buf"].split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
                if line.lower().startswith(b"kembali-status:"):
                    w = line.split(b":", 1)[1].strip().decode()
            last = b["buf"].rsplit(b'data-status="', 1)
            if len(last) == 2:
                w += "/" + last[1].split(b'"', 1)[0].decode()
            words[w] = words.get(w, 0) + 1
        return {
            "n": n, "mode": "streamed" if streamed else "single",
            "ttfb": [b["first"] for b in buyers.values() if b["first"] is not None],
            "read_to_end": read_to_end,
            "reads": [reads.get(id, 0) for id, _ in ids],
            "kb_per_req": (peak - base) / n,
            "words": words, "unfinished": left, "sent_in": sent_in,
        }
    finally:
        ng.stop()
        k.stop(timeout=40)
        sb.stop()


def print_table(cases):
    print("      streamed page behind nginx: N buyers, each on its own transaction succeeding 1-25 s after it came")
    print("      mode       N   first byte s p50 / p99   read->end ms p50 / p99   reads/tx min/med/max   KB/request"
          "   answers (header/last data-status)")
    for c in cases:
        rt = [x * 1000 for x in c["read_to_end"]]
        r = c["reads"]
        print("      %-8s %4d   %9.3f / %-9.3f   %9.1f / %-9.1f   %6d / %d / %d   %10.1f   %s%s" % (
            c["mode"], c["n"], pct(c["ttfb"], 50), pct(c["ttfb"], 99), pct(rt, 50), pct(rt, 99),
            min(r), statistics.median(r), max(r), c["kb_per_req"],
            " ".join("%s=%d" % kv for kv in sorted(c["words"].items())),
            "  UNFINISHED=%d" % c["unfinished"] if c["unfinished"] else ""))
