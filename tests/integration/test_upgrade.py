"""Restarts and upgrades lose no buyer (docs/handover.md): SIGUSR2 starts the
program file again and hands it the listening socket and every request in
hand; a new process that refuses its configuration leaves the old one
serving. Real processes, the sandbox's timeline (docs/handover.md)."""

import fcntl
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

import testenv
import kit
from testenv import assert_eq
from test_stream import DOC, head_and_body, last_status, stream_fcgi

PAID_AT_MS = 2500  # reads at 0, 1.1, 2.2, 3.3 s: the fourth says succeeded

# FAST's waits, seven reads in 6.6 s: room for the new process's start (a
# second under TSan on a busy machine) and the handover before the last read.
# The held transactions are paid once the new process holds them (pay()), so
# which process reads what does not hang on how fast it started.
SLOW_START = [0] + [1100] * 6


def pay(sb, id):
    """From now on the sandbox says id succeeded. Returns the reads of id it
    had received, which the PUT forgets; the 1 s window stays, so a read too
    soon after them is still refused with a 429."""
    reads = sb.reads(id)
    sb.put_tx(id, "succeeded")
    return reads


def successor(k, old_pid, timeout=15):
    """The start line of the process that took over from old_pid."""
    return k.wait_log(timeout, event="start", upgraded_from=old_pid)


def pid_gone(pid):
    try:
        os.kill(pid, 0)
        return False
    except ProcessLookupError:
        return True


def stop_pid(pid, timeout=15):
    """SIGTERM a process that is not our child; wait until it is gone."""
    if pid_gone(pid):
        return
    os.kill(pid, signal.SIGTERM)
    testenv.wait_for(lambda: pid_gone(pid), timeout, msg="pid %d gone after SIGTERM" % pid)


class Prober:
    """New requests while an upgrade goes on: one at a time, back to back,
    each timed; every one must be answered."""

    def __init__(self, k, query):
        self.k, self.query = k, query
        self.times, self.errors = [], []
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.run)

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = self.k.get(self.query, timeout=10)
                if r.status != 200:
                    self.errors.append(r.status)
            except Exception as e:  # noqa: BLE001 - counted, the test fails on it
                self.errors.append(repr(e))
            self.times.append(time.monotonic() - t0)

    def __enter__(self):
        self.t.start()
        return self

    def __exit__(self, *a):
        self.stop.set()
        self.t.join(20)


def test_sigusr2_hands_over_held_requests(tmpdir):
    sb, k = kit.start(tmpdir, schedule=SLOW_START)
    sb.put_tx("t-plain", "pending")
    sb.put_tx("t-stream", "pending")
    sb.put_tx("t-new", "succeeded")
    old = k.pid

    def plain():
        r = k.get("id=t-plain", timeout=30)
        return r.status, r.header("kembali-status")

    def streamed():
        parts, _ = stream_fcgi(k.addr, "id=t-stream", DOC, timeout=30)
        body = b"".join(p for _, p in parts if p is not None)
        return head_and_body(parts[0][1])[0].get("kembali-status"), last_status(body), len(parts)

    fns = [plain] * 5 + [streamed] * 5
    results = [None] * len(fns)

    def run(i):
        results[i] = fns[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    # held, and the streamed pages' tops sent (the first read came back pending)
    testenv.wait_for(lambda: len(sb.reads("t-plain")) >= 2 and len(sb.reads("t-stream")) >= 2, 10,
                     msg="two reads of each")
    assert k.metrics()["kembali_held_requests"] == 10
    with Prober(k, "id=t-new") as probe:
        t_sig = time.monotonic()
        k.signal(signal.SIGUSR2)
        new = successor(k, old)
        new_pid = int(new["pid"])
        try:
            k.wait_log(15, event="handover", **{"from": str(old)})
            earlier = {id: pay(sb, id) for id in ("t-plain", "t-stream")}
            rc = k.wait(5.5)  # the old one exits by itself, within 5 s of the handover
            exited = time.monotonic() - t_sig
            # an upgrade with no read in flight is over in 0.1 s: the probe
            # asks on until it has asked a few times across and after it
            testenv.wait_for(lambda: len(probe.times) > 5, 10, msg="six new requests answered")
        finally:
            probe.stop.set()
    try:
        for t in threads:
            t.join(30)
        assert_eq(rc, 0, "the old process's exit code")
        assert exited < 6.0, "the old process took %.1f s to exit" % exited
        assert pid_gone(old)
        up = testenv.wait_for(lambda: [x for x in k.find_log(event="upgrade") if "handed" in x], 5,
                              msg="the handover's line")[0]
        # the 10 held, and any probe that was in hand at that moment
        assert int(up["handed"]) >= 10, up
        print("# handover of %s requests in hand (10 held): %s ms; the old process exited %.2f s after SIGUSR2"
              % (up["handed"], up["ms"], exited))
        for i, res in enumerate(results):
            if i < 5:
                assert_eq(res, (200, "succeeded"), "plain request %d, answered by the new process" % i)
            else:
                assert_eq(res[:2], ("checking", "succeeded"), "streamed page %d: its top, then its result" % i)
        # one pace across both processes: the reads as without the upgrade
        for id in ("t-plain", "t-stream"):
            reads = earlier[id] + sb.reads(id)
            assert_eq([r["http"] for r in reads], [200] * len(reads), "no 429 for " + id)
            assert len(reads) <= len(SLOW_START), "%s read %d times: %r" % (id, len(reads), kit.arrivals(reads))
            gap = kit.min_gap(kit.arrivals(reads))
            assert gap is None or gap >= kit.ARRIVAL_MIN_GAP, "%s reads %r" % (id, kit.arrivals(reads))
        # requests arriving meanwhile: every one answered, none waited long
        assert not probe.errors, probe.errors
        assert len(probe.times) > 5
        print("# %d new requests during the upgrade; the longest waited %.0f ms"
              % (len(probe.times), max(probe.times) * 1000))
        assert max(probe.times) < 1.0, max(probe.times)
        # the new one goes on: the cache is kept (no read for a known final)
        n = len(sb.reads("t-plain"))
        r = k.get("id=t-plain")
        assert_eq(r.header("kembali-status"), "succeeded", "from the cache")
        assert_eq(len(sb.reads("t-plain")), n, "no read for a cached final")
    finally:
        stop_pid(new_pid)


@testenv.timeout(60)
def test_sigusr2_twice_in_a_row(tmpdir):
    """Two upgrades in a row (two package upgrades, no restart between):
    the process that took over is upgraded in turn once its predecessor is
    gone, and the held request goes through both, answered once."""
    sb, k = kit.start(tmpdir, schedule=SLOW_START)
    sb.put_tx("t-twice", "pending")
    first = k.pid
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", k.get("id=t-twice", timeout=30)))
    t.start()
    testenv.wait_for(lambda: k.metrics().get("kembali_held_requests") == 1, 10, msg="held")
    k.signal(signal.SIGUSR2)
    second = int(successor(k, first)["pid"])
    try:
        assert_eq(k.wait(10), 0, "the first process's exit code")
        k.wait_log(10, event="handover", **{"from": str(first)})
        os.kill(second, signal.SIGUSR2)
        third = int(successor(k, second)["pid"])
        try:
            testenv.wait_for(lambda: pid_gone(second), 10, msg="the second process gone")
            took = k.wait_log(10, event="handover", **{"from": str(second)})
            assert_eq(took["held"], "1", took)
            pay(sb, "t-twice")
            t.join(30)
            assert_eq((got["r"].status, got["r"].header("kembali-status")), (200, "succeeded"))
            assert not k.find_log(event="upgrade", msg="an upgrade is already under way")
        finally:
            stop_pid(third)
    finally:
        stop_pid(second)


@testenv.timeout(60)
def test_sigusr2_adopts_a_large_batch_in_slices(tmpdir):
    """600 held requests (more than the successor adopts in one turn of its
    loop, UPGRADE_ADOPT_SLICE): the batch is adopted over several turns,
    every request still held and answered once, by the new process, and the
    handover's line counts them all. Held 20 s, so that 600 connections
    and a successor's start fit in the hold on a busy machine; the payment's
    notify, once the new process holds them, answers them."""
    sb, k = kit.start(tmpdir, schedule=[0, 10000, 10000])
    sb.put_tx("t-many", "pending")
    old = k.pid
    payload = testenv.fcgi_request_bytes(testenv.cgi_params("id=t-many"))
    socks = []
    try:
        for _ in range(600):
            c = testenv.fcgi_connect(k.addr, timeout=30)
            c.sendall(payload)
            socks.append(c)
        testenv.wait_for(lambda: k.metrics().get("kembali_held_requests") == 600, 20, msg="600 held")
        k.signal(signal.SIGUSR2)
        new_pid = int(successor(k, old)["pid"])
        try:
            took = k.wait_log(15, event="handover", **{"from": str(old)})
            assert_eq((took["connections"], took["held"]), ("600", "600"), took)
            r = kit.notify(k, "t-many", {"status": "succeeded"})
            assert_eq(r.status, 204, r.text)
            answers = [testenv.fcgi_receive(c, timeout=30) for c in socks]
            assert_eq(sorted(set((r.status, r.header("kembali-status")) for r in answers)), [(200, "succeeded")])
            assert_eq(k.wait(10), 0, "the old process's exit code")
        finally:
            stop_pid(new_pid)
    finally:
        for c in socks:
            c.close()


def test_sigusr2_broken_configuration_keeps_the_old(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t-held", [(0, "pending"), (PAID_AT_MS, "succeeded")])
    sb.put_tx("t-new", "succeeded")
    old = k.pid
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("r", k.get("id=t-held", timeout=30)))
    t.start()
    testenv.wait_for(lambda: len(sb.reads("t-held")) >= 1, 10, msg="the first read")
    with open(k.config_path) as f:
        good = f.read()
    k.write_config("{ not json")
    k.signal(signal.SIGUSR2)
    line = k.wait_log(10, event="upgrade", level="error")
    assert "refused" in line["msg"], line
    assert "configuration" in line.get("errors", ""), line
    assert k.running() and not pid_gone(old)
    assert_eq(k.find_log(event="start", upgraded_from=old), [], "no successor started")
    k.write_config(good)
    assert_eq(k.get("id=t-new").header("kembali-status"), "succeeded", "the old one serves new requests")
    t.join(30)
    assert_eq(got["r"].header("kembali-status"), "succeeded", "the held request, answered by the old one")
    # and a later upgrade, with the configuration fixed, goes through
    k.signal(signal.SIGUSR2)
    new = successor(k, old)
    try:
        assert_eq(k.wait(6), 0, "the old process's exit code")
        assert_eq(k.get("id=t-new").header("kembali-status"), "succeeded", "served by the new one")
    finally:
        stop_pid(int(new["pid"]))


@testenv.timeout(120)
@testenv.timeout(60)
def test_sigusr2_late_confirmation_leaves_each_request_one_process(tmpdir):
    """A later batch's confirmation ('A') comes too late for the old process
    (kembali-testing's KEMBALI_TEST_UPGRADE_LATE_ACK makes it treat it so):
    the old one keeps those requests, shuts the channel and answers them
    itself. The new one must not have touched them: it takes a batch only
    on the old one's 'C', which never came. A later batch: a request still
    arriving when the handover began, whole only after it."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))

    def config(k):
        return testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))], schedule_ms=kit.FAST)
    k = testenv.Kembali(tmpdir, config=config, keys={"a": kit.KEY}, bin=testenv.kembali_testing_bin(),
                        env={"KEMBALI_TEST_UPGRADE_LATE_ACK": "1"}).start()
    old = k.pid
    sb.put_tx("t-held", "pending")
    sb.put_tx("t-late", "pending")
    first = {}
    t = threading.Thread(target=lambda: first.setdefault("r", k.get("id=t-held", timeout=30)))
    t.start()
    testenv.wait_for(lambda: k.metrics().get("kembali_held_requests") == 1, 10, msg="one held")
    whole = testenv.fcgi_request_bytes(testenv.cgi_params("id=t-late"))
    c = testenv.fcgi_connect(k.addr, timeout=30)
    c.sendall(whole[:-8])  # all but the closing empty stdin record: still arriving
    k.signal(signal.SIGUSR2)
    new_pid = int(successor(k, old)["pid"])
    try:
        k.wait_log(15, event="upgrade", handed="1")  # the first batch: the held request
        c.sendall(whole[-8:])  # whole now: a later batch, whose 'A' the old one takes as too late
        k.wait_log(15, event="upgrade", level="error")
        late = testenv.fcgi_receive(c, timeout=30)
        t.join(30)
        assert_eq(late.status, 200)
        assert_eq(late.header("kembali-status"), "checking", "answered by the old process, which reads no more")
        # the new process sees the channel end with the batch not given: it drops it
        k.wait_log(15, event="upgrade", msg="the old process did not say a confirmed batch is ours; "
                                            "it keeps those requests")
        took = [x for x in k.find_log(event="handover") if x.get("from") == str(old)]
        assert_eq([x["connections"] for x in took], ["1"], "the new process adopted the first batch only")
        assert_eq(first["r"].header("kembali-status"), "checking", "the first batch's request, answered by the new one")
    finally:
        c.close()
        stop_pid(new_pid)


def test_sigusr2_to_another_layout_keeps_the_pace_and_cache(tmpdir):
    """An upgrade to a build whose state layout differs: the new process
    opens another state file (kembali-vN.state), so what the requests in
    hand need comes with them in the handover (format 2's snapshot). The
    old process is kembali-testing told the layout before this build's,
    started as a program file that the "package upgrade" then replaces
    with this build, as a package manager replaces /usr/sbin/kembali (SIGUSR2
    starts the path the process was started as)."""
    mine = testenv.state_layout()
    prog = os.path.join(tmpdir, "bin", "kembali")
    os.makedirs(os.path.dirname(prog))
    os.symlink(testenv.kembali_testing_bin(), prog)
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))

    def config(k):
        return testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))], schedule_ms=SLOW_START)
    k = testenv.Kembali(tmpdir, config=config, keys={"a": kit.KEY}, bin=prog,
                        env={"KEMBALI_TEST_LAYOUT": str(mine - 1)}).start()
    old = k.pid
    sb.put_tx("t-cached", "succeeded")
    assert_eq(k.get("id=t-cached").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("t-cached")), 1)
    sb.put_tx("t-held", "pending")  # paid once the new process has taken the requests over
    results = [None] * 4

    def ask(i):
        results[i] = k.get("id=t-held", timeout=30).header("kembali-status")

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    # read twice by the old process, its second read over: the next is due 1.1 s after it
    testenv.wait_for(lambda: len(k.find_log(event="read", id="t-held")) >= 2, 10, msg="two reads of t-held")
    os.replace(_symlink_to(testenv.kembali_bin(), prog + ".new"), prog)  # the package upgrade
    k.signal(signal.SIGUSR2)
    new = successor(k, old)
    new_pid = int(new["pid"])
    try:
        # the old process reads on while the new one starts: the new one's
        # read finds the payment, however many reads the old one made
        k.wait_log(15, event="handover", **{"from": str(old)})
        reads = pay(sb, "t-held")
        assert_eq(k.wait(6), 0, "the old process's exit code")
        for t in threads:
            t.join(30)
        assert_eq(results, ["succeeded"] * len(results), "the held requests, answered by the new process")
        reads += sb.reads("t-held")
        assert_eq([r["http"] for r in reads], [200] * len(reads), "no 429: one pace across the layouts")
        # no read sooner than the schedule allows: each start waits its wait after the previous send
        starts, sends = kit.read_starts([k], "t-held"), kit.read_sends([k], "t-held")
        assert len(reads) <= len(starts) <= len(SLOW_START), "reads of t-held started at %r" % starts
        waits = [w / 1000 for w in SLOW_START[1:]]
        for i, (a, b) in enumerate(zip(sends, starts[1:])):
            assert b - a >= waits[i] - 0.003, "read %d of t-held too soon: sends %r, starts %r" % (i + 2, sends, starts)
        lines = k.log_lines()
        took = [i for i, l in enumerate(lines) if l.get("event") == "handover" and l.get("from") == str(old)]
        assert_eq(len(took), 1, "the new process's handover line")
        after = [l for l in lines[took[0]:] if l.get("event") == "read" and l.get("id") == "t-held"]
        assert after, "no read of t-held by the new process"
        assert_eq(after[-1].get("status"), "succeeded", "the new process's last read")
        assert os.path.exists(os.path.join(tmpdir, "state", "kembali-v%d.state" % mine)), "the new one's own file"
        up = [l for l in k.find_log(event="upgrade") if "handed" in l]
        assert_eq([l.get("facts") for l in up], ["1"], "the cached finals sent (t-cached): %r" % up)
        assert_eq(lines[took[0]].get("facts"), "1", "and taken in")
        # the old process's cached succeeded, answered by the new one with no read
        assert_eq(k.get("id=t-cached").header("kembali-status"), "succeeded")
        assert_eq(len(sb.reads("t-cached")), 1, "no read for a final the old process had cached")
    finally:
        stop_pid(new_pid)


def _symlink_to(target, path):
    os.symlink(target, path)
    return path


class FakeSystemd:
    """The notify socket of a Type=notify service (NOTIFY_SOCKET): a Unix
    datagram socket whose messages, with the descriptors they carry
    (SCM_RIGHTS), the test reads as systemd would; and the start of a
    service as systemd does it: its descriptors on 3, 4, ... with
    LISTEN_FDS, LISTEN_FDNAMES and LISTEN_PID (its own pid)."""

    def __init__(self, tmpdir):
        self.tmpdir = tmpdir
        self.path = testenv.socket_path(tmpdir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.messages = []  # (dict of the message's assignments, [fds])
        self.marks = 0  # sync()'s own messages sent
        self.lock = threading.Lock()
        self.t = threading.Thread(target=self.read, daemon=True)
        self.t.start()

    def read(self):
        while True:
            try:
                msg, fds, _, _ = socket.recv_fds(self.sock, 65536, 16)
            except OSError:
                return
            fields = dict(line.split("=", 1) for line in msg.decode().split("\n") if "=" in line)
            with self.lock:
                self.messages.append((fields, fds))

    def wait(self, timeout=15, n=1, **match):
        """The messages matching `match`, once there are at least n."""
        def found():
            with self.lock:
                got = [m for m in self.messages if all(m[0].get(k) == v for k, v in match.items())]
            return got if len(got) >= n else None
        return testenv.wait_for(found, timeout, msg="notify message %r" % match)

    def sync(self):
        """Return once every message already sent has been read: the
        socket's queue keeps datagrams in order, so a message of our own,
        sent now, is read after them (a process that has exited has sent
        all of its own, but the reading thread may not have read them yet)."""
        with self.lock:
            self.marks += 1
            mark = str(self.marks)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(b"KEMBALI_TEST_SYNC=" + mark.encode(), self.path)
        self.wait(KEMBALI_TEST_SYNC=mark)

    def store(self):
        """The file-descriptor store: name -> fd, as FDSTORE=1 / FDSTOREREMOVE=1
        left it, once every message already sent is read (sync)."""
        self.sync()
        st = {}
        with self.lock:
            for fields, fds in self.messages:
                if fields.get("FDSTORE") == "1" and fds:
                    st[fields["FDNAME"]] = fds[0]
                elif fields.get("FDSTOREREMOVE") == "1":
                    st.pop(fields.get("FDNAME"), None)
        return st

    def start(self, name, cfg, fds, names, bus=None):
        """`bus`: the SystemdBus kembali asks at SIGTERM whether a restart
        or a stop runs; without one, a bus nobody listens on (not known)."""
        log = open(os.path.join(self.tmpdir, name + ".log"), "ab")
        env = dict(os.environ, NOTIFY_SOCKET=self.path, LISTEN_FDS=str(len(fds)), LISTEN_FDNAMES=":".join(names),
                   DBUS_SYSTEM_BUS_ADDRESS=bus.address() if bus is not None
                   else "unix:path=" + os.path.join(self.tmpdir, "no-bus.sock"))
        env.pop("LISTEN_PID", None)

        def place():
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 500) for fd in fds]
            for i, h in enumerate(high):
                os.dup2(h, 3 + i)
        # systemd sets LISTEN_PID to the service's own pid: a shell that execs keeps it
        return testenv.spawn(["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$0" --config "$1"', testenv.kembali_bin(), cfg],
                             self.tmpdir, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env,
                             pass_fds=tuple(range(3, 3 + len(fds))), preexec_fn=place)


def test_systemd_restart_through_the_fd_store(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    sock_path = testenv.socket_path(tmpdir, "kembali.sock")
    lsock = testenv.unix_listen_socket(sock_path)  # kembali.socket's
    keyf = testenv.write_secret(os.path.join(tmpdir, "k"), kit.KEY)
    cfg = os.path.join(tmpdir, "sd.json")
    testenv.write_config_file(cfg, testenv.make_config(sb, [testenv.make_shop("toko-a", keyf)],
                                                       schedule_ms=SLOW_START))
    sd = FakeSystemd(tmpdir)
    bus = testenv.SystemdBus(tmpdir, "restart")
    a = sd.start("a", cfg, [lsock.fileno()], ["kembali.socket"], bus=bus)
    sd.wait(READY="1")
    sb.put_tx("t-plain", "pending")
    sb.put_tx("t-stream", "pending")
    sb.put_tx("t-new", "succeeded")
    sb.put_tx("t-cached", "succeeded")
    assert_eq(testenv.get(sock_path, "id=t-cached").header("kembali-status"), "succeeded")  # read once, cached
    results = {}

    def plain(i):
        results[i] = testenv.get(sock_path, "id=t-plain", timeout=30).header("kembali-status")

    def streamed(i):
        parts, _ = stream_fcgi(sock_path, "id=t-stream", DOC, timeout=30)
        body = b"".join(p for _, p in parts if p is not None)
        results[i] = (head_and_body(parts[0][1])[0].get("kembali-status"), last_status(body))

    threads = [threading.Thread(target=plain if i < 3 else streamed, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    testenv.wait_for(lambda: len(sb.reads("t-plain")) >= 2 and len(sb.reads("t-stream")) >= 2, 10,
                     msg="two reads of each")
    time.sleep(0.2)  # the streamed tops are out (not a race: a top not yet sent goes over as not sent)
    a.send_signal(signal.SIGTERM)  # systemctl restart: the stop
    assert_eq(a.wait(10), 0, "the old process's exit code")
    assert_eq(bus.asked(), [a.pid], "systemd asked which job runs on the stopping process's unit")
    stored = sd.store()
    conns = sorted(n for n in stored if n.startswith("kc-"))
    assert_eq(len(conns), 6, "connections in the store: %r" % stored)
    assert "kembali-handover" in stored, stored
    assert not results, "nobody answered by the stopping process: %r" % results
    # meanwhile a buyer arrives: it waits in the socket's backlog, as under systemd
    late = threading.Thread(target=lambda: results.setdefault("late", testenv.get(sock_path, "id=t-new", timeout=30)))
    late.start()
    # ... and the start: the socket unit's descriptor first, then the store's (in an order of its own)
    names = ["kembali.socket", "kembali-handover"] + conns[::-1]
    b = sd.start("b", cfg, [lsock.fileno()] + [stored[n] for n in names[1:]], names)
    try:
        sd.wait(READY="1", n=2)  # the new process's
        with open(os.path.join(tmpdir, "b.log")) as f:
            assert testenv.find_lines(f.read(), event="handover"), "ready once it holds the requests"
        earlier = {id: pay(sb, id) for id in ("t-plain", "t-stream")}
        for t in threads + [late]:
            t.join(30)
        for i in range(6):
            want = "succeeded" if i < 3 else ("checking", "succeeded")
            assert_eq(results.get(i), want, "held request %d, answered by the new process" % i)
        assert_eq(results["late"].header("kembali-status"), "succeeded", "the request that came meanwhile")
        # the old process's cache is the new one's: answered without a read
        assert_eq(testenv.get(sock_path, "id=t-cached").header("kembali-status"), "succeeded")
        assert_eq(len(sb.reads("t-cached")), 1, "t-cached read again after the restart")
        for id in ("t-plain", "t-stream"):
            reads = earlier[id] + sb.reads(id)
            assert_eq([r["http"] for r in reads], [200] * len(reads), "no 429 for " + id)
            assert len(reads) <= len(SLOW_START), "%s read %d times" % (id, len(reads))
            gap = kit.min_gap(kit.arrivals(reads))
            assert gap is None or gap >= kit.ARRIVAL_MIN_GAP, kit.arrivals(reads)
        with open(os.path.join(tmpdir, "b.log")) as f:
            text = f.read()
        took = testenv.find_lines(text, event="handover", **{"from": "systemd"})
        assert_eq([(l["connections"], l["held"]) for l in took], [("6", "6")], text)
        assert_eq(sd.store(), {}, "the new process emptied the store")
    finally:
        b.send_signal(signal.SIGTERM)
        assert_eq(b.wait(15), 0, "the new process's exit code")


@pytest.mark.parametrize("job", ["stop", None, "unknown-bus"])
@testenv.timeout(60)
def test_systemd_stop_answers_the_held(tmpdir, job):
    """systemctl stop (job "stop") or a SIGTERM sent by hand (no job): no
    next process will take what the store holds, and systemd closes it once
    the unit is down, so the stopping process answers its held buyers
    itself (checking) and stores nothing. When the bus cannot say
    ("unknown-bus": none listens), it stores, as a restart needs."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    sock_path = testenv.socket_path(tmpdir, "kembali.sock")
    lsock = testenv.unix_listen_socket(sock_path)
    keyf = testenv.write_secret(os.path.join(tmpdir, "k"), kit.KEY)
    cfg = os.path.join(tmpdir, "sd.json")
    testenv.write_config_file(cfg, testenv.make_config(sb, [testenv.make_shop("toko-a", keyf)], schedule_ms=kit.FAST))
    sd = FakeSystemd(tmpdir)
    bus = testenv.SystemdBus(tmpdir, job) if job != "unknown-bus" else None
    a = sd.start("a", cfg, [lsock.fileno()], ["kembali.socket"], bus=bus)
    sd.wait(READY="1")
    sb.put_tx("t-held", "pending")
    results = {}

    def ask(i):
        try:
            results[i] = testenv.get(sock_path, "id=t-held", timeout=30).header("kembali-status")
        except Exception as e:  # noqa: BLE001 - compared below
            results[i] = repr(e)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    testenv.wait_for(lambda: testenv.parse_metrics(testenv.get(sock_path, "format=metrics", extra={"KEMBALI_ADMIN": "1"})
                                                   .text).get("kembali_held_requests") == 3, 10, msg="three held")
    a.send_signal(signal.SIGTERM)
    assert_eq(a.wait(10), 0, "the stopping process's exit code")
    with open(os.path.join(tmpdir, "a.log")) as f:
        text = f.read()
    said = testenv.find_lines(text, event="stop", systemd_job=(job or "none") if bus is not None else "unknown")
    assert said, text
    stored = sorted(n for n in sd.store() if n.startswith("kc-"))
    if bus is None:
        assert_eq(len(stored), 3, "not known: stored for a next process")
        for fd in sd.store().values():
            os.close(fd)  # systemd's closing of the store: the held buyers see their connection end
        for t in threads:
            t.join(15)
        return
    for t in threads:
        t.join(15)
    assert_eq(stored, [], "nothing stored for a next process that is not coming")
    assert_eq([results.get(i) for i in range(3)], ["checking"] * 3, "each held buyer answered by the stopping process")
    assert_eq(bus.asked(), [a.pid], "systemd asked about the stopping process's unit")
