"""kembali fault soak: many tabs, four processes, every fault class, kills.

    python3 tests/soak/soak.py [--seconds 1800] [--clients 40] [--seed N] [--keep]
    make soak SOAK_SECONDS=600        (from a build directory; default 1800)

Starts the Kasera sandbox and 4 kembali processes on one state_dir behind one
shared listening socket (as spawn-fcgi hands it over), with 2 shops (toko-a:
read budget 60/min, toko-b: 120/min, each its own key) and a short schedule
(SCHEDULE below, so that episodes are short). Then, for --seconds:

- load: --clients tabs over many transactions that the driver creates as it
  goes (pending then succeeded, failed, canceled or expired; pending for
  ever; a status kembali does not know): held HTML requests, JSON polls that
  follow Retry-After, reloads (the first request abandoned), HEAD, JSON by
  Accept, invalid ids, ids nobody paid for (404 at Kasera, each from another
  buyer's address), an unknown shop, old finished transactions; and one
  prober walking random ids from one address;
- faults: the sandbox's chaos mode (seeded) gives a random share of the reads
  a hang beyond read_timeout_ms, a reset, a 5xx, a malformed or oversized
  body, a 429 with Retry-After in seconds or as an HTTP date, or an
  unverified-account cap; the driver forces, on a timetable, the key-wide
  faults (a key's 429 without Retry-After, the failed-authentication 429),
  revokes toko-b's key until a read gets its 401 (kembali then pauses that key
  for 5 minutes: the checks know it), and takes the API down (connections
  refused) for a few seconds;
- kills: every 15-30 s one of processes k2/k3 (or their successors) gets
  SIGKILL, reads in flight or not, and a new process starts on the same
  socket. k0 and k1 live through the whole run: their RSS and descriptors are
  the ones checked for flatness.

Then it checks (each failure says what broke, with context; the tmpdir with
every log is kept): no crash (every exit is one the soak caused, exit 0 on
SIGTERM, no sanitizer report in any log); no 5xx and every answer consistent
with the transaction (never a final word Kasera did not say); every answer by
its deadline, at the client and in kembali's request log; at the sandbox, no
two reads of one transaction with one key less than MIN_GAP apart, no key
over its budget in any sliding 60 s, and every pause honoured (Retry-After,
the key's 429, the failed-authentication 429, 401, unverified caps); RSS and
descriptors of k0 and k1 flat from the first minute to the last. It prints a
short table of what was sent, answered, injected and killed.

tests/integration/test_soak.py runs the same code for 120 s inside the suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import testenv  # noqa: E402
from testenv.env import _tail  # noqa: E402
from testenv.procs import _all_procs, _kill_all  # noqa: E402
import kit  # noqa: E402

KEY_A, KEY_B = kit.KEY, kit.KEY2
TAIL_A, TAIL_B = KEY_A[-4:], KEY_B[-4:]
SHOPS = {"toko-a": {"key": "a", "tail": TAIL_A, "budget": 60},
         "toko-b": {"key": "b", "tail": TAIL_B, "budget": 120}}
SCHEDULE = [0, 1100, 1100, 2000]
HOLD = sum(SCHEDULE) / 1000 + 1.5          # a held HTML request's deadline (s)
READ_TIMEOUT_MS = 1500
HANG_MS = READ_TIMEOUT_MS + 1000           # a hang outlasts kembali's timeout
LEASE = READ_TIMEOUT_MS / 1000 + 1.0       # a read in flight is waited for this long
# what a busy machine adds (2 cores, the suite running); scaled like every
# harness timeout for slow (sanitizer) builds
MARGIN = 3.0 * float(os.environ.get("HARNESS_TIMEOUT_SCALE") or 1)
DEADLINE = {"html": HOLD, "json": LEASE, "quick": 0.0}
MIN_GAP = 1.1                              # between reads of one transaction, as kembali starts them
ARRIVAL_MIN_GAP = kit.ARRIVAL_MIN_GAP      # the same at the sandbox: Kasera's 1 s window (see check_reads)
ARRIVAL_JITTER = 1.1 - ARRIVAL_MIN_GAP     # how much later than its start a read may arrive (0.1 s)
PAUSE_SLACK = 0.5                          # reads already under way when a pause began
PROCS, STEADY = 4, 2                       # k0..k(STEADY-1) are never killed
RSS_BOUND_KB, FD_BOUND = 2048, 16          # "flat", see check_flat


def sanitized(binary):
    """True when the kembali binary was built with ASan or TSan."""
    try:
        with open(binary, "rb") as f:
            data = f.read()
    except OSError:
        return False
    return b"__asan_init" in data or b"__tsan_init" in data
FINAL = ("succeeded", "failed", "canceled", "expired")
WORDS = FINAL + ("checking", "not_found", "invalid", "unknown_shop")
# chaos weights of the per-read faults; the key-wide ones are forced on a timetable
CHAOS_KINDS = {"hang": 3, "reset": 3, "5xx": 3, "bad_json": 2, "huge": 2, "retry_after": 3,
               "retry_after_date": 2, "unverified_cap": 1, "key_limit": 0, "auth_block": 0}
CHAOS_RATE = 0.3
# what the driver creates: (kind, weight, final status or None, seconds pending before it)
TX_KINDS = [("ok", 35, "succeeded", (0, 5)), ("now", 10, "succeeded", (0, 0)),
            ("fail", 10, "failed", (0, 4)), ("cancel", 8, "canceled", (0, 4)),
            ("exp", 8, "expired", (0, 4)), ("pend", 22, None, None), ("odd", 7, "refunded", (0, 2))]


def budget_peak(times, span, budget):
    """The most of the sorted `times` (s) within any `span`, and (count, time)
    for every one that ends a span holding more than `budget`."""
    j, peak, bad = 0, 0, []
    for i, t in enumerate(times):
        while t - times[j] >= span:
            j += 1
        peak = max(peak, i - j + 1)
        if i - j + 1 > budget:
            bad.append((i - j + 1, t))
    return peak, bad


class Tx:
    def __init__(self, id, shop, kind, final, after, created):
        self.id, self.shop, self.kind, self.final, self.after, self.created = id, shop, kind, final, after, created

    @property
    def final_at(self):  # when the sandbox starts saying the final status (monotonic)
        return None if self.final is None else self.created + self.after


class Proc:
    def __init__(self, k, slot, started):
        self.k, self.slot, self.started = k, slot, started
        self.killed_at = None   # when we sent SIGKILL
        self.stopped = False    # we sent SIGTERM at the end
        self.crash = None       # an exit we did not cause: (when, code)


class Soak:
    def __init__(self, tmpdir, seconds=120.0, clients=40, seed=None, out=None):
        self.tmpdir = tmpdir
        self.seconds = float(seconds)
        self.nclients = clients
        self.seed = seed if seed is not None else random.SystemRandom().randrange(1 << 31)
        self.out = out or (lambda line: print(line, flush=True))
        self.rng = random.Random(self.seed)
        self.lock = threading.Lock()
        self.txs: dict[str, Tx] = {}
        self.recent: list[Tx] = []          # newest last
        self.records: list[dict] = []       # one per request sent
        self.kills: list[float] = []
        self.kill_walls: list[float] = []    # the same, wall clock (kembali's log stamps)
        self.procs: list[Proc] = []
        self.samples: list[tuple] = []      # (t, proc name, rss kB, fds)
        self.events: list[tuple] = []       # (t, what)
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.api_up = threading.Event()
        self.api_up.set()
        self.t0 = None
        self.next_name = 0
        self.helpers: list[threading.Thread] = []  # started by the timetable

    # -- set-up -------------------------------------------------------------
    def note(self, what):
        with self.lock:
            self.events.append((self.now(), what))

    def now(self):
        return time.monotonic() - self.t0 if self.t0 is not None else 0.0

    def config(self, k):
        shops = [testenv.make_shop(s, k.key_path(v["key"]), read_budget_per_minute=v["budget"])
                 for s, v in SHOPS.items()]
        return testenv.make_config(self.sb, shops, schedule_ms=SCHEDULE, read_timeout_ms=READ_TIMEOUT_MS)

    def start_proc(self, slot):
        name = "k%d" % self.next_name
        self.next_name += 1
        k = testenv.Kembali(self.tmpdir, config=self.config, keys={"a": KEY_A, "b": KEY_B}, name=name,
                            listen=self.shared)
        k.start(timeout=30)
        k.wait_log(30, event="start")
        p = Proc(k, slot, self.now())
        with self.lock:
            self.procs.append(p)
        return p

    def live(self):
        with self.lock:
            return [p for p in self.procs if p.killed_at is None and not p.stopped and p.crash is None]

    # -- transactions -------------------------------------------------------
    def new_tx(self, n):
        shop = "toko-a" if self.rng.random() < 0.4 else "toko-b"
        kind, _, final, span = self.rng.choices(TX_KINDS, weights=[w for _, w, _, _ in TX_KINDS])[0]
        after = self.rng.uniform(*span) if span else None
        tx_id = "%s-%s-%d" % (shop[-1], kind, n)
        timeline = [{"after_ms": 0, "status": "pending"}]
        if final is not None:
            timeline.append({"after_ms": int(after * 1000), "status": final})
        created = time.monotonic()
        self.sb.put_tx(tx_id, timeline)
        return Tx(tx_id, shop, kind, final, after or 0.0, created)

    def generator(self):
        n = 0
        while not self.stop.is_set():
            self.api_up.wait(5)
            if not self.api_up.is_set():
                continue
            try:
                tx = self.new_tx(n)
            except Exception:  # noqa: BLE001 - the API went down under the call
                time.sleep(0.2)
                continue
            n += 1
            with self.lock:
                self.txs[tx.id] = tx
                self.recent.append(tx)
                del self.recent[:-40]
            self.stop.wait(self.rng.uniform(0.3, 0.9))

    def pick(self, rng, old=False):
        with self.lock:
            if old:
                cutoff = time.monotonic() - 20
                done = [t for t in self.txs.values() if t.final in FINAL and t.final_at < cutoff]
                return rng.choice(done) if done else None
            if not self.recent:
                return None
            # the newest transactions most: buyers come back as they pay
            i = len(self.recent) - 1 - min(int(rng.expovariate(1 / 8)), len(self.recent) - 1)
            return self.recent[i]

    # -- load ----------------------------------------------------------------
    def request(self, rec, query, method="GET", accept=None, host=None, addr="10.0.0.1", abandon=None):
        """One FastCGI request; fills rec (a dict already in self.records)."""
        extra = {"REMOTE_ADDR": addr}
        params = testenv.cgi_params(query, method, accept, host, extra)
        rec["t_start"] = time.monotonic()
        try:
            s = testenv.fcgi_send(self.sock, params, timeout=30)
            if abandon is not None:  # a reload: the tab goes away before its answer
                time.sleep(abandon)
                s.close()
                rec["abandoned"] = True
                return None
            r = testenv.fcgi_receive(s, timeout=30, started=rec["t_start"])
            rec["status"] = r.status
            rec["word"] = r.header("kembali-status")
            rec["elapsed"] = r.elapsed
            return r
        except testenv.FcgiError as e:
            rec["error"] = str(e)[:300]
            rec["timeout"] = isinstance(e, testenv.FcgiTimeout)
            return None
        finally:
            rec["t_end"] = time.monotonic()

    def rec(self, action, tx=None, id=None, fmt="html", shop=None):
        r = {"action": action, "id": tx.id if tx else id, "tx": tx, "fmt": fmt,
             "shop": tx.shop if tx else shop}
        with self.lock:
            self.records.append(r)
        return r

    def check_answer(self, rec, r):
        """What an answer must be; returns a list of complaints."""
        bad = []
        word, tx = rec.get("word"), rec.get("tx")
        if r.status >= 500:
            bad.append("HTTP %d" % r.status)
        if word not in WORDS:
            bad.append("Kembali-Status %r" % word)
        if r.header("cache-control") != "no-store":
            bad.append("Cache-Control %r" % r.header("cache-control"))
        want_http = {"not_found": 404, "unknown_shop": 404, "invalid": 400}.get(word, 200)
        if r.status != want_http:
            bad.append("HTTP %d with %s" % (r.status, word))
        expect = rec.get("expect")
        if expect is not None and word not in expect:
            bad.append("%s where %r was expected" % (word, expect))
        if tx is not None and word in FINAL:
            if word != tx.final:
                bad.append("%s but Kasera only ever says %s for %s" % (word, tx.final or "pending", tx.id))
            elif rec["t_end"] < tx.final_at:
                bad.append("%s before Kasera said it" % word)
        if tx is not None and word == "not_found":
            bad.append("not_found for a transaction Kasera has")
        if rec["fmt"] == "json" and rec.get("method") != "HEAD":
            try:
                j = json.loads(r.body)
                st, fin = j["status"], j["final"]
                if fin != (st in FINAL) or (fin and word != st) or j["id"] != rec["id"]:
                    bad.append("JSON %r with %s" % (j, word))
                if tx is not None and st in FINAL + ("refunded",) and st != tx.final:
                    bad.append("JSON status %s but Kasera says %s" % (st, tx.final))
                if not fin and word != "invalid" and word != "unknown_shop":
                    ra = r.header("retry-after")
                    if ra is None or not ra.isdigit():
                        bad.append("JSON not final without a whole-seconds Retry-After (%r)" % ra)
                    else:
                        rec["retry_after"] = int(ra)
            except (ValueError, KeyError, TypeError) as e:
                bad.append("JSON body %r: %s" % (r.body[:200], e))
        elif rec.get("method") == "HEAD":
            if r.body:
                bad.append("HEAD with a body")
        elif word and ('data-status="%s"' % word) not in r.text:
            bad.append("HTML without data-status=%s" % word)
        return bad

    def finish(self, rec, r):
        if r is None:
            return
        bad = self.check_answer(rec, r)
        if bad:
            rec["bad"] = bad
            rec["answer"] = repr(r)[:600]

    def client(self, i):
        rng = random.Random(self.seed * 1000 + i)
        addr = "10.1.%d.%d" % (i // 250, i % 250 + 1) if i % 10 else "10.9.9.9"  # some share an office
        actions = [("html", 40), ("json", 18), ("reload", 8), ("head", 5), ("accept_json", 6),
                   ("invalid", 4), ("unknown", 5), ("cached", 8), ("unknown_shop", 1)]
        names, weights = [a for a, _ in actions], [w for _, w in actions]
        while not self.stop.is_set():
            action = rng.choices(names, weights)[0]
            try:
                self.act(rng, action, addr)
            except Exception:  # noqa: BLE001 - a driver bug must be seen, not hang the soak
                with self.lock:
                    self.failures.append("driver error in client %d (%s):\n%s" % (i, action, traceback.format_exc()))
            self.stop.wait(rng.uniform(0.2, 1.5))

    def host(self, tx):
        return tx.shop + ".test"

    def act(self, rng, action, addr):
        if action in ("html", "head", "reload", "json", "accept_json"):
            tx = self.pick(rng)
            if tx is None:
                return
            q = "id=" + tx.id
            if action == "html":
                rec = self.rec("html", tx)
                self.finish(rec, self.request(rec, q, host=self.host(tx), addr=addr,
                                              accept="text/html,application/xhtml+xml,*/*;q=0.8"))
            elif action == "head":
                rec = self.rec("head", tx)
                rec["method"] = "HEAD"
                self.finish(rec, self.request(rec, q, method="HEAD", host=self.host(tx), addr=addr))
            elif action == "reload":
                first = self.rec("reload", tx)
                self.request(first, q, host=self.host(tx), addr=addr, abandon=rng.uniform(0.2, 2.5))
                rec = self.rec("reload", tx)
                self.finish(rec, self.request(rec, q, host=self.host(tx), addr=addr))
            elif action == "accept_json":
                rec = self.rec("accept_json", tx, fmt="json")
                self.finish(rec, self.request(rec, q, host=self.host(tx), addr=addr, accept="application/json"))
            else:  # a storefront polling, as told by Retry-After
                for _ in range(rng.randint(2, 6)):
                    rec = self.rec("json", tx, fmt="json")
                    r = self.request(rec, q + "&format=json", host=self.host(tx), addr=addr)
                    self.finish(rec, r)
                    if r is None or rec.get("word") in FINAL or self.stop.is_set():
                        break
                    self.stop.wait(min(max(rec.get("retry_after", 1), 0.3), 3.0))
        elif action == "cached":
            tx = self.pick(rng, old=True)
            if tx is not None:
                rec = self.rec("cached", tx)
                self.finish(rec, self.request(rec, "id=" + tx.id, host=self.host(tx), addr=addr))
        elif action == "invalid":
            bad_id = rng.choice(["", "x" * 65, "t%201", "%00", "<script>", "id%2F1", "a.b", "a;b"])
            rec = self.rec("invalid", id=bad_id, fmt="quick", shop="toko-a")
            rec["expect"] = ("invalid",)
            self.finish(rec, self.request(rec, "id=" + bad_id, host="toko-a.test", addr=addr))
        elif action == "unknown":
            # a buyer's typo: an id nobody paid for, each from another address
            rec = self.rec("unknown", id="nf-%d" % rng.randrange(1 << 30))
            rec["expect"] = ("not_found", "checking")
            self.finish(rec, self.request(rec, "id=" + rec["id"], host="toko-b.test",
                                          addr="10.200.%d.%d" % (rng.randrange(256), rng.randrange(1, 255))))
        elif action == "unknown_shop":
            rec = self.rec("unknown_shop", id="t1", fmt="quick")
            rec["expect"] = ("unknown_shop",)
            self.finish(rec, self.request(rec, "id=t1", host="nope.test", addr=addr))

    def prober(self):
        rng = random.Random(self.seed + 7)
        while not self.stop.is_set():
            rec = self.rec("probe", id="probe-%d" % rng.randrange(1 << 30), fmt="json", shop="toko-a")
            rec["expect"] = ("not_found", "checking")
            self.finish(rec, self.request(rec, "id=%s&format=json" % rec["id"], host="toko-a.test",
                                          addr="10.66.6.6"))
            self.stop.wait(0.5)

    # -- faults and kills ------------------------------------------------------
    def timetable(self):
        """(t, what, arg): the forced faults, the outage and the revoked key.
        One cycle per 300 s (a short run gets one cycle fitted into it)."""
        d = self.seconds
        ev = [(2.0 + 0.5 * i, "force", (k, None)) for i, (k, w) in enumerate(sorted(CHAOS_KINDS.items())) if w]
        # the key-wide faults are taken by the next read with any key, and
        # the revoked key is one that is reading: a key already paused (its
        # budget spent, a 429, a 401) would make them wait
        if d < 300:
            ev += [(0.15 * d, "force", ("key_limit", None)), (0.30 * d, "outage", min(5.0, 0.05 * d)),
                   (0.50 * d, "revoke", None), (0.75 * d, "force", ("auth_block", None))]
        else:
            for n, c in enumerate(range(0, int(d) - 120, 300)):
                ev += [(c + 30, "force", ("key_limit", None)), (c + 100, "outage", 5.0),
                       (c + 160, "force", ("auth_block", None))]
                if n % 2 == 0:
                    ev.append((c + 240, "revoke", None))
        return sorted(ev, key=lambda e: e[0])

    def faults(self):
        for t, what, arg in self.timetable():
            if self.stop.wait(max(0.0, t - self.now())):
                return
            try:
                if what == "force":
                    self.sb.force_fault(arg[0], arg[1])
                    self.note("forced %s%s" % (arg[0], " (key ..%s)" % arg[1] if arg[1] else ""))
                elif what == "outage":
                    self.outage(arg)
                elif what == "revoke":  # waits for its 401: the timetable goes on meanwhile
                    th = threading.Thread(target=self.revoke, args=(arg,), daemon=True)
                    self.helpers.append(th)
                    th.start()
            except Exception:  # noqa: BLE001
                with self.lock:
                    self.failures.append("driver error in the fault timetable (%s):\n%s" % (what, traceback.format_exc()))

    def outage(self, secs):
        self.api_up.clear()
        self.note("API down for %.1f s" % secs)
        try:
            self.sb.outage(int(secs * 1000))
        except Exception:  # noqa: BLE001 - its own answer may be cut by the outage
            pass
        time.sleep(secs)
        testenv.wait_for(lambda: self.sb.stats(), 15, interval=0.1, msg="the sandbox back after its outage")
        self.note("API back")
        self.api_up.set()

    def revoke(self, key=None):
        """Revokes key (None: the key of a read that came within the last
        2 s) until a read gets its 401 (at most 20 s), then makes it valid
        again: kembali pauses it for 5 minutes from that 401."""
        keys = {KEY_A[-4:]: KEY_A, KEY_B[-4:]: KEY_B}
        try:
            end = time.monotonic() + 60
            while key is None and time.monotonic() < end and not self.stop.is_set():
                before = len(self.sb.reads()) if self.api_up.is_set() else None
                time.sleep(2)
                if before is not None and self.api_up.is_set():
                    fresh = self.sb.reads()[before:]
                    if fresh:
                        key = keys.get(fresh[-1]["key_tail"])
            if key is None:
                return
            tail = key[-4:]
            seen = sum(1 for r in self.sb.reads() if r["http"] == 401)
            self.sb.remove_key(key)
            self.note("key ..%s revoked" % tail)
            end = time.monotonic() + 20
            while time.monotonic() < end and not self.stop.is_set():
                time.sleep(0.5)
                if self.api_up.is_set() and sum(1 for r in self.sb.reads() if r["http"] == 401) > seen:
                    break
            self.api_up.wait(20)
            self.sb.add_key(key)
            self.note("key ..%s valid again" % tail)
        except Exception:  # noqa: BLE001
            with self.lock:
                self.failures.append("driver error revoking a key:\n%s" % traceback.format_exc())

    def killer(self):
        rng = random.Random(self.seed + 3)
        while not self.stop.wait(rng.uniform(15, 30)):
            victims = [p for p in self.live() if p.slot >= STEADY]
            if not victims:
                continue
            p = rng.choice(victims)
            with self.lock:  # before the signal: the sampler must not take this end for a crash
                p.killed_at = self.now()
            try:
                p.k.proc.send_signal(signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.k.proc.wait(10)
            when = time.monotonic()
            with self.lock:
                self.kills.append(when)
                self.kill_walls.append(time.time())
            self.note("SIGKILL %s (pid %d)" % (p.k.name, p.k.pid))
            if self.stop.is_set():
                return
            try:
                q = self.start_proc(p.slot)
                self.note("started %s (pid %d)" % (q.k.name, q.k.pid))
            except Exception:  # noqa: BLE001
                with self.lock:
                    self.failures.append("could not start a process after a kill:\n%s" % traceback.format_exc())

    def sampler(self):
        while not self.stop.wait(2.0):
            self.sample()

    def sample(self):
        t = self.now()
        for p in self.live():
            rc = p.k.proc.poll()
            if rc is not None:
                with self.lock:
                    if p.killed_at is not None:  # the killer's, since live() was read
                        continue
                    p.crash = (t, rc)
                    self.failures.append("%s (pid %d) exited by itself with %s at %.1f s; its log ends:\n%s"
                                         % (p.k.name, p.k.pid, rc, t, _tail(p.k.log_path, 3000)))
                if not self.stop.is_set():
                    try:
                        self.start_proc(p.slot)
                    except Exception:  # noqa: BLE001
                        pass
                continue
            try:
                rss = p.k.rss_kb()
                fds = len(os.listdir("/proc/%d/fd" % p.k.pid))
            except (OSError, AssertionError):
                continue  # it was killed under us
            with self.lock:
                self.samples.append((t, p.k.name, rss, fds))

    # -- the run ---------------------------------------------------------------
    def run(self):
        self.sb = testenv.Sandbox(self.tmpdir, keys=(KEY_A, KEY_B))
        self.sb.chaos(self.seed, rate=CHAOS_RATE, kinds=CHAOS_KINDS, hang_ms=HANG_MS, pad_bytes=100000)
        self.shared = testenv.unix_listen_socket(testenv.socket_path(self.tmpdir, "shared.sock"), backlog=1024)
        self.sock = self.shared.getsockname()
        self.t0 = time.monotonic()
        for slot in range(PROCS):
            self.start_proc(slot)
        self.t0 = time.monotonic()  # the window starts with the load
        for p in self.procs:
            p.started = 0.0
        threads = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.nclients)]
        threads += [threading.Thread(target=f, daemon=True)
                    for f in (self.generator, self.prober, self.faults, self.killer, self.sampler)]
        for t in threads:
            t.start()
        self.stop.wait(self.seconds)
        self.sample()
        self.stop.set()
        for t in threads + self.helpers:
            t.join(40)
        stuck = [t.name for t in threads + self.helpers if t.is_alive()]
        if stuck:
            self.failures.append("threads still running 40 s after the end: %r" % stuck)
        self.api_up.wait(20)
        time.sleep(0.5)
        self.reads = self.sb.reads()
        self.stats = self.sb.stats()
        with open(os.path.join(self.tmpdir, "soak-reads.json"), "w") as f:
            json.dump({"reads": self.reads, "stats": self.stats}, f)
        with open(os.path.join(self.tmpdir, "soak-requests.json"), "w") as f:
            json.dump([{k: (v - self.t0 if k in ("t_start", "t_end") else v) for k, v in r.items() if k != "tx"}
                       for r in self.records], f)
        self.stop_wall = time.time()
        for p in self.live():
            p.stopped = True
            rc = p.k.stop(timeout=15)
            if rc != 0:
                self.failures.append("%s exited %s after SIGTERM; its log ends:\n%s"
                                     % (p.k.name, rc, _tail(p.k.log_path, 3000)))
        self.sb.stop()
        self.check()
        return self

    # -- checks ---------------------------------------------------------------
    def fail(self, what, items, show=8):
        if items:
            self.failures.append("%s: %d\n  %s" % (what, len(items), "\n  ".join(str(i) for i in items[:show])))

    def check(self):
        self.cut_reads = {"kill": 0, "stop": 0}
        self.check_answers()
        self.check_logs()
        self.check_starts()
        self.check_logged()
        self.check_reads()
        self.check_flat()
        self.check_coverage()

    def excused(self, rec):
        """A request cut by a SIGKILL we sent while it was in flight."""
        return any(rec["t_start"] - 0.05 <= k <= rec["t_end"] + 0.2 for k in self.kills)

    def deadline(self, rec):
        fmt = rec["fmt"]
        if rec["action"] == "unknown_shop":
            fmt = "quick"
        return DEADLINE[fmt] + MARGIN

    def check_answers(self):
        wrong, late, lost = [], [], []
        self.cut = 0
        for r in self.records:
            if "t_end" not in r or r.get("abandoned"):
                continue
            if "error" in r:
                if not r.get("timeout") and self.excused(r):
                    self.cut += 1
                else:
                    lost.append("%s %s at %.1f s: %s" % (r["action"], r["id"], r["t_start"] - self.t0, r["error"]))
                continue
            if r.get("bad"):
                wrong.append("%s %s at %.1f s: %s; %s" % (r["action"], r["id"], r["t_start"] - self.t0,
                                                          "; ".join(r["bad"]), r["answer"]))
            if r["elapsed"] > self.deadline(r):
                late.append("%s %s (%s) at %.1f s: %.2f s > %.1f s" % (
                    r["action"], r["id"], r["word"], r["t_start"] - self.t0, r["elapsed"], self.deadline(r)))
        self.fail("answers that broke a rule", wrong)
        self.fail("answers later than their deadline at the client", late)
        self.fail("requests without an answer (no kill of ours in flight)", lost)

    def check_logs(self):
        late, marks = [], []
        self.log_max = {"html": 0, "json": 0}
        for p in self.procs:
            text = p.k.log_text()
            for m in testenv.Kembali.SANITIZER_MARKS:
                if m in text:
                    marks.append("%s: %s" % (p.k.log_path, m))
            for line in testenv.parse_log(text):
                if line.get("event") != "request" or "ms" not in line:
                    continue
                fmt = line.get("format", "html")
                ms = int(line["ms"]) / 1000
                self.log_max[fmt] = max(self.log_max.get(fmt, 0), ms)
                if ms > DEADLINE.get(fmt, HOLD) + MARGIN:
                    late.append("%s: %s" % (p.k.name, line["_raw"]))
        sb_text = self.sb.log_text()
        for m in testenv.Kembali.SANITIZER_MARKS:
            if m in sb_text:
                marks.append("%s: %s" % (self.sb.log_path, m))
        self.fail("request log lines past their deadline", late)
        self.fail("sanitizer reports", marks)

    def budget(self, tail):
        return {v["tail"]: v["budget"] for v in SHOPS.values()}.get(tail, 0)

    def check_logged(self):
        """Every read the sandbox received has its line in a kembali log
        ("every read is logged"), except those of a process killed under
        them, or stopped at the end (SIGTERM abandons reads in flight): its
        arrival then lies within a lease before that kill or stop. A read is
        paired first by Kasera's request_id where kembali logged one (every
        answer that is not a plain 200), else on id, key and time: the
        arrival must lie between the read's start and its end in kembali's
        log, the sandbox's clock put on the logs' by the median offset of
        the reads that pair one to one. (A starved sandbox handles a read
        hundreds of ms after kembali sent it; the interval holds that, a
        window around the send did not.)"""
        key_of = {s: v["tail"] for s, v in SHOPS.items()}
        logged = {}
        by_rid = {}
        for p in self.procs:
            for l in testenv.parse_log(p.k.log_text()):
                if l.get("event") == "read" and "ms" in l:
                    start = kit.began(l)
                    entry = [start, start + int(l.get("sent_ms", 0)) / 1000, kit.log_time(l)]
                    logged.setdefault((l.get("id"), key_of.get(l.get("shop"))), []).append(entry)
                    if l.get("request_id"):
                        by_rid[l["request_id"]] = entry
        got = {}
        for r in self.reads:
            got.setdefault((r["id"], r["key_tail"]), []).append(r)
        offsets = sorted(b[1] - a["t_ms"] / 1000 for k, arr in got.items()
                         if len(logged.get(k, ())) == len(arr)
                         for a, b in zip(arr, sorted(logged[k])))
        if not offsets:
            return
        off = offsets[len(offsets) // 2]
        unpaired = {}
        for k, arr in got.items():
            entries = logged.get(k, [])
            for r in arr:
                e = by_rid.pop(r.get("request_id"), None)
                if e is not None and e in entries:
                    entries.remove(e)
                else:
                    unpaired.setdefault(k, []).append(r["t_ms"] / 1000)
        stray = []
        for k, arr in unpaired.items():
            entries = logged.get(k, [])
            for a in arr:
                wall = a + off
                near = [e for e in entries if e[0] - 0.3 <= wall <= e[2] + 0.3]
                if near:
                    entries.remove(min(near, key=lambda e: abs(e[1] - wall)))
                elif any(kw - LEASE - 0.5 <= wall <= kw + 0.3 for kw in self.kill_walls):
                    self.cut_reads["kill"] += 1
                elif self.stop_wall - LEASE - 0.5 <= wall <= self.stop_wall + 1.0:
                    self.cut_reads["stop"] += 1
                else:
                    stray.append("%s (key ..%s) arrived at %.3f s (sandbox clock), no log line near %s"
                                 % (k[0], k[1], a, time.strftime("%H:%M:%S", time.gmtime(wall))))
        self.fail("reads at the sandbox that no kembali log shows", stray)

    def check_starts(self):
        """The pace as kembali keeps it: from every process's read log lines,
        each read of a transaction (one key) starts at least MIN_GAP after
        the previous one went out (its start plus sent_ms, after connecting),
        3 ms allowed for the millisecond rounding of the two stamps. Reads
        of a process killed under them left no line: the sandbox's view
        (check_reads) covers those."""
        key_of = {s: v["tail"] for s, v in SHOPS.items()}
        by_tx = {}
        for p in self.procs:
            for l in testenv.parse_log(p.k.log_text()):
                if l.get("event") == "read" and "ms" in l:
                    start = kit.began(l)
                    by_tx.setdefault((l.get("id"), key_of.get(l.get("shop"))), []).append(
                        (start, start + int(l.get("sent_ms", 0)) / 1000, p.k.name))
        close, over = [], []
        self.min_start_gap = None
        by_key = {}
        for (tx, tail), rs in by_tx.items():
            by_key.setdefault(tail, []).extend(start for start, _, _ in rs)
        self.log_peak = {}
        for tail, starts in by_key.items():
            peak, bad = budget_peak(sorted(starts), 60.0 - 0.003, self.budget(tail))
            self.log_peak[tail] = peak
            over += ["key ..%s in kembali's logs: %d reads started in the 60 s up to %s (budget %d)"
                     % (tail, n, time.strftime("%H:%M:%S", time.gmtime(t)), self.budget(tail)) for n, t in bad]
        for (tx, tail), rs in by_tx.items():
            rs.sort()
            for a, b in zip(rs, rs[1:]):
                gap = b[0] - a[1]
                self.min_start_gap = gap if self.min_start_gap is None else min(self.min_start_gap, gap)
                if gap < MIN_GAP - 0.003:
                    close.append("%s (key ..%s): a read started %.3f s after the previous one went out "
                                 "(%s, then %s)" % (tx, tail, gap, a[2], b[2]))
        self.fail("reads of one transaction started less than %.1f s apart (kembali's logs)" % MIN_GAP, close)
        self.fail("keys over their read budget in a 60 s span (kembali's logs)", over)

    def check_reads(self):
        """At the sandbox: Kasera's window (arrivals at least ARRIVAL_MIN_GAP
        apart: the pace is kept on starts, check_starts, and an arrival comes
        a few ms after its start, more when the sandbox has to start a thread
        for a new connection, so two reads started 1.100 s apart can arrive
        1.094 s apart), the budget, and the pauses each answer imposes."""
        reads = [r for r in self.reads if r.get("t_ms") is not None]
        by_tx, by_key = {}, {}
        for r in reads:
            by_tx.setdefault((r["id"], r["key_tail"]), []).append(r)
            by_key.setdefault(r["key_tail"], []).append(r)
        close, over, ignored = [], [], []
        self.min_gap = None
        self.arrivals_under = 0
        for (tx, tail), rs in by_tx.items():
            for a, b in zip(rs, rs[1:]):
                gap = (b["t_ms"] - a["t_ms"]) / 1000
                self.min_gap = gap if self.min_gap is None else min(self.min_gap, gap)
                if gap < MIN_GAP:
                    self.arrivals_under += 1
                if gap < ARRIVAL_MIN_GAP:
                    close.append("%s (key ..%s): reads %.3f s apart at %.1f s: %r, %r" % (tx, tail, gap, a["t_ms"] / 1000, a, b))
        # the budget over arrivals: two reads started 60.003 s apart arrived
        # 59.9997 s apart (the first took 3 ms to arrive): spans of 60 s less
        # the jitter an arrival may have (check_starts counts starts exactly)
        self.peak = {}
        for tail, rs in by_key.items():
            peak, bad = budget_peak([r["t_ms"] / 1000 for r in rs], 60.0 - ARRIVAL_JITTER, self.budget(tail))
            self.peak[tail] = peak
            over += ["key ..%s at the sandbox: %d reads in the 60 s before %.1f s (budget %d)"
                     % (tail, n, t, self.budget(tail)) for n, t in bad]
        # pauses: what each answer forbids, and the reads that came anyway
        for r in reads:
            t, tail = r["t_ms"] / 1000, r["key_tail"]
            same_tx = [b for b in by_tx[(r["id"], tail)] if b["t_ms"] > r["t_ms"]]
            if r.get("retry_after_ms") is not None:
                until = t + r["retry_after_ms"] / 1000
                ignored += ["Retry-After %s ms of %s at %.1f s: read at %.3f s" % (r["retry_after_ms"], r["id"], t, b["t_ms"] / 1000)
                            for b in same_tx if b["t_ms"] / 1000 < until - 0.01]
            if r.get("fault") == "unverified_cap":
                ignored += ["unverified cap of %s at %.1f s: read again at %.3f s" % (r["id"], t, b["t_ms"] / 1000)
                            for b in same_tx if b["t_ms"] / 1000 < t + 60]
            pause = None
            if r.get("fault") == "key_limit":
                pause, who = (60, [tail]), "the key's 429"
            elif r.get("fault") == "auth_block":
                pause, who = (60, list(by_key)), "the failed-authentication 429"
            elif r.get("http") == 401:
                pause, who = (300, [tail]), "a 401"
            if pause:
                secs, tails = pause
                for k in tails:
                    ignored += ["%s at %.1f s (key ..%s): read with key ..%s at %.3f s" % (who, t, tail, k, b["t_ms"] / 1000)
                                for b in by_key.get(k, []) if t + PAUSE_SLACK < b["t_ms"] / 1000 < t + secs]
        self.fail("reads of one transaction arriving closer than %.1f s at the sandbox" % ARRIVAL_MIN_GAP, close)
        self.fail("keys over their read budget in a 60 s span", over)
        self.fail("reads the API had paused", ignored)

    def check_flat(self):
        """RSS and descriptors of the processes that lived through the whole
        run: the highest of the last minute may exceed the highest of the
        first by at most RSS_BOUND_KB and FD_BOUND. 2 MB is a few pages of
        malloc arenas moving with the load (a leak of a few hundred bytes per
        request would pass it within minutes, per read within half an hour at
        these rates); 16 descriptors is the API connections curl may keep
        (kept connections come and go with hangs and resets) plus the FastCGI
        connections in hand at one moment beyond those of the first minute."""
        span = min(60.0, self.seconds / 2)
        self.flat = {}
        grew = []
        for p in self.procs:
            if p.slot >= STEADY or p.killed_at is not None or p.crash is not None:
                continue
            mine = [(t, rss, fds) for t, n, rss, fds in self.samples if n == p.k.name]
            first = [s for s in mine if s[0] < span]
            last = [s for s in mine if s[0] >= self.seconds - span]
            if not first or not last:
                grew.append("%s: too few samples (%d, %d)" % (p.k.name, len(first), len(last)))
                continue
            f = (max(s[1] for s in first), max(s[2] for s in first))
            l = (max(s[1] for s in last), max(s[2] for s in last))
            self.flat[p.k.name] = (f, l)
            # a sanitizer's allocator keeps freed memory in quarantine and
            # grows its own tables: RSS says nothing about leaks there (its
            # leak checker does, at exit); descriptors are still judged
            if l[0] > f[0] + RSS_BOUND_KB and not sanitized(p.k.bin):
                grew.append("%s: RSS first minute max %d kB, last minute max %d kB (+%d kB > %d)"
                            % (p.k.name, f[0], l[0], l[0] - f[0], RSS_BOUND_KB))
            if l[1] > f[1] + FD_BOUND:
                grew.append("%s: descriptors first minute max %d, last minute max %d (> +%d)"
                            % (p.k.name, f[1], l[1], FD_BOUND))
        self.fail("long-lived processes that grew", grew)

    def check_coverage(self):
        missing = [k for k, n in self.stats.get("chaos", {}).items() if n == 0]
        if not self.stats.get("outages"):
            missing.append("outage")
        if not any(r.get("http") == 401 for r in self.reads):
            missing.append("401")
        if not self.kills:
            missing.append("kill")
        if missing and self.seconds >= 120:  # shorter runs may end before a fault is taken
            self.failures.append("the soak did not inject: %s" % ", ".join(missing))

    # -- the table ---------------------------------------------------------------
    def report(self):
        w = self.out
        sent = [r for r in self.records if "t_end" in r]
        w("soak: %.0f s, %d clients, %d processes on one socket, seed %d, tmpdir %s"
          % (self.seconds, self.nclients, PROCS, self.seed, self.tmpdir))
        by_action = {}
        for r in sent:
            by_action[r["action"]] = by_action.get(r["action"], 0) + 1
        w("requests sent %d: %s" % (len(sent), ", ".join("%s %d" % kv for kv in sorted(by_action.items()))))
        by_word = {}
        for r in sent:
            key = r.get("word") or ("abandoned by the tab" if r.get("abandoned") else
                                    "cut by a kill" if "error" in r and self.excused(r) else "no answer")
            if r.get("word"):
                key = "%s %d" % (key, r["status"])
            by_word[key] = by_word.get(key, 0) + 1
        w("answered: %s" % ", ".join("%s: %d" % kv for kv in sorted(by_word.items())))
        slow = {}
        for r in sent:
            if "elapsed" in r:
                slow[r["fmt"]] = max(slow.get(r["fmt"], 0), r["elapsed"])
        w("slowest answer at the client: %s; in kembali's log: %s"
          % (", ".join("%s %.2f s (limit %.1f)" % (f, s, DEADLINE[f] + MARGIN) for f, s in sorted(slow.items())),
             ", ".join("%s %.2f s" % kv for kv in sorted(self.log_max.items()))))
        chaos = self.stats.get("chaos", {})
        n401 = sum(1 for r in self.reads if r.get("http") == 401)
        window = sum(1 for r in self.reads if r.get("http") == 429 and not r.get("fault")
                     and r.get("error_code") == "rate_limited" and r.get("retry_after_ms") is not None)
        w("faults injected %d: %s; outages %d; 401s %d (key revoked); the sandbox's own per-transaction 429s %d"
          % (sum(chaos.values()), ", ".join("%s %d" % kv for kv in sorted(chaos.items())),
             self.stats.get("outages", 0), n401, window))
        by_key = {}
        for r in self.reads:
            by_key[r["key_tail"]] = by_key.get(r["key_tail"], 0) + 1
        w("reads at the sandbox %d (%s); most in any 60 s: %s"
          % (len(self.reads), ", ".join("key ..%s %d" % kv for kv in sorted(by_key.items(), key=str)),
             ", ".join("key ..%s %d started, %d arrived (budget %d)"
                       % (v["tail"], self.log_peak.get(v["tail"], 0), self.peak.get(v["tail"], 0), v["budget"])
                       for v in SHOPS.values())))
        w("smallest gap between reads of one transaction: %s from a send to the next start (kembali's logs), "
          "%s between arrivals (the sandbox; %d pairs under %.1f s)"
          % ("%.3f s" % self.min_start_gap if self.min_start_gap is not None else "-",
             "%.3f s" % self.min_gap if self.min_gap is not None else "-", self.arrivals_under, MIN_GAP))
        w("kills %d (SIGKILL), requests cut by them %d, reads cut by them %d (and by the final SIGTERM %d); "
          "processes started %d" % (len(self.kills), self.cut, self.cut_reads["kill"], self.cut_reads["stop"],
                                    len(self.procs)))
        probe = [r for r in self.reads if r["id"].startswith("probe-")]
        w("the prober (one address, random ids every 0.5 s) cost %d reads of toko-a's key" % len(probe))
        for name, (f, l) in sorted(self.flat.items()):
            w("%s (the whole run): RSS first minute max %d kB, last minute max %d kB; fds %d -> %d"
              % (name, f[0], l[0], f[1], l[1]))
        w("timetable: %s" % "; ".join("%.1f s %s" % e for e in self.events))
        if self.failures:
            w("FAILED (%d): tmpdir kept: %s" % (len(self.failures), self.tmpdir))
            for f in self.failures:
                w("- " + f.replace("\n", "\n  "))
        else:
            w("all checks passed")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS") or 1800))
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the tmpdir even when every check passed")
    a = ap.parse_args(argv)
    tmpdir = tempfile.mkdtemp(prefix="kb-soak-")
    s = Soak(tmpdir, a.seconds, a.clients, a.seed)
    try:
        s.run()
    finally:
        _kill_all(list(_all_procs))
    s.report()
    if not s.failures and not a.keep:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return 1 if s.failures else 0


if __name__ == "__main__":
    sys.exit(main())
