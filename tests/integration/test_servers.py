"""The process managers docs/operations.md names, run for real: spawn-fcgi forking
four children on one socket (docs/operations.md's command line), lighttpd spawning
them with max-procs, and systemd's check of contrib's units. Several processes, one state_dir: they must
answer every request and keep one pace per transaction."""

import os
import re
import shutil
import signal
import subprocess
import time

import testenv
import kit
from testenv import assert_eq, assert_in

SPAWN_FCGI = "/usr/bin/spawn-fcgi"
LIGHTTPD = "/usr/sbin/lighttpd"


def require(path):
    if os.path.exists(path):
        return path
    if os.environ.get("KEMBALI_REQUIRE_SERVERS") == "1":
        raise AssertionError("%s is missing and KEMBALI_REQUIRE_SERVERS=1" % path)
    raise testenv.Skip("%s is not installed" % path)


def config_file(tmpdir, sb):
    """A configuration (schedule kit.FAST) and its key file, readable by
    root only: these processes run as the test's user."""
    keyf = testenv.write_secret(os.path.join(tmpdir, "key-a"), kit.KEY)
    state = os.path.join(tmpdir, "state")
    os.makedirs(state, mode=0o700, exist_ok=True)
    cfg = testenv.make_config(sb, [testenv.make_shop("toko-a", keyf)], state_dir=state, schedule_ms=kit.FAST)
    path = os.path.join(tmpdir, "kembali.json")
    testenv.write_config_file(path, cfg)
    return path


def stop_pids(pids, timeout=15):
    """SIGTERM processes that are not our children; wait until they are gone."""
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if os.path.exists("/proc/%d" % p) and
                 open("/proc/%d/stat" % p).read().split(") ")[-1][0] != "Z"]
        time.sleep(0.05)
    for p in alive:
        os.kill(p, signal.SIGKILL)
    assert not alive, "still running %.0f s after SIGTERM: %r" % (timeout, alive)


def check_log(text):
    for mark in testenv.Kembali.SANITIZER_MARKS:
        assert mark not in text, "sanitizer report:\n" + text[-3000:]


@testenv.timeout(60)
def test_spawn_fcgi_four_children(tmpdir):
    """docs/operations.md's line: spawn-fcgi -s SOCKET -F 4 -- ... The children get
    the socket on fd 0 and stdout/stderr on /dev/null, so docs/operations.md wraps
    kembali in sh to keep its log; this runs that wrapper."""
    spawn = require(SPAWN_FCGI)
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    cfg = config_file(tmpdir, sb)
    sock = testenv.socket_path(tmpdir, "kembali.sock")
    log = os.path.join(tmpdir, "kembali.log")
    pidfile = os.path.join(tmpdir, "kembali.pids")
    out = subprocess.run([spawn, "-s", sock, "-F", "4", "-P", pidfile, "--",
                          "/bin/sh", "-c", 'exec "$0" --config "$1" 2>>"$2"', testenv.kembali_bin(), cfg, log],
                         capture_output=True, text=True, timeout=20)
    assert_eq(out.returncode, 0, out.stderr)
    pids = [int(x) for x in open(pidfile).read().split()]
    try:
        assert_eq(len(pids), 4, out.stderr)
        text = lambda: open(log).read() if os.path.exists(log) else ""  # noqa: E731
        testenv.wait_for(lambda: len(testenv.find_lines(text(), level="info", event="start")) == 4, 20,
                         msg="four start lines")
        started = {int(l["pid"]) for l in testenv.find_lines(text(), level="info", event="start")}
        assert_eq(started, set(pids), "the children spawn-fcgi reported are the ones serving")
        sb.put_tx("t1", "pending")
        sb.put_tx("done", "succeeded")
        rs = kit.parallel([lambda: testenv.get(sock, "id=t1") for _ in range(20)] +
                          [lambda: testenv.get(sock, "id=done")])
        assert_eq([r.header("kembali-status") for r in rs], ["checking"] * 20 + ["succeeded"])
        kit.check_one_pace(sb, [text()], "t1")
        assert_eq(len(testenv.find_lines(text(), event="request")), 21)
    finally:
        stop_pids(pids)
    stopped = testenv.find_lines(open(log).read(), event="stop", msg="stopped")
    assert_eq(len(stopped), 4, "each child stopped cleanly on SIGTERM")
    check_log(open(log).read())


def http_get(port, path):
    return testenv.http_get(port, path, {"Host": "toko-a.test"}, timeout=30)


@testenv.timeout(60)
def test_lighttpd_max_procs(tmpdir):
    """docs/operations.md's lighttpd fastcgi.server (bin-path, max-procs 4): lighttpd
    starts four kembali processes on one socket; ten buyers waiting on one
    pending transaction cost one pace, a final status is answered at once."""
    lighttpd = require(LIGHTTPD)
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    cfg = config_file(tmpdir, sb)
    port = testenv.free_port()
    docs = os.path.join(tmpdir, "docs")
    os.makedirs(docs)
    conf = os.path.join(tmpdir, "lighttpd.conf")
    with open(conf, "w") as f:
        f.write('''server.modules = ("mod_fastcgi")
server.document-root = "%(docs)s"
server.bind = "127.0.0.1"
server.port = %(port)d
server.errorlog = "%(tmp)s/lighttpd-error.log"
server.pid-file = "%(tmp)s/lighttpd.pid"
fastcgi.server = ("/kembali" => (( "socket" => "%(sock)s",
  "bin-path" => "%(bin)s", "bin-environment" => ("KEMBALI_CONFIG" => "%(cfg)s"),
  "max-procs" => 4, "check-local" => "disable" )))
''' % {"docs": docs, "port": port, "tmp": tmpdir, "sock": testenv.socket_path(tmpdir, "kembali.sock"),
       "bin": testenv.kembali_bin(), "cfg": cfg})
    out_path = os.path.join(tmpdir, "lighttpd.out")  # the kembali processes' stderr: their log
    with open(out_path, "wb") as out:
        proc = testenv.spawn([lighttpd, "-D", "-f", conf], tmpdir, stdout=out, stderr=out)
    text = lambda: open(out_path).read()  # noqa: E731
    try:
        testenv.wait_for(lambda: len(testenv.find_lines(text(), level="info", event="start")) == 4, 20,
                         msg="four kembali processes started by lighttpd")
        testenv.wait_for(lambda: http_get(port, "/kembali?id=bad%20id")[0] == 400, 30, msg="lighttpd serving")
        sb.put_tx("t1", "pending")
        sb.put_tx("done", "succeeded")
        rs = kit.parallel([lambda: http_get(port, "/kembali?id=t1") for _ in range(10)])
        assert_eq([(st, h.get("kembali-status")) for st, h, _ in rs], [(200, "checking")] * 10)
        assert_in(b"Pembayaran sedang diperiksa", rs[0][2])
        status, headers, body = http_get(port, "/kembali?id=done&format=json")
        assert_eq((status, headers.get("kembali-status")), (200, "succeeded"))
        assert_eq(body.strip(), b'{"id":"done","status":"succeeded","final":true}')
        starts, _ = kit.check_one_pace(sb, [text()], "t1")
        served = {l["pid"] for l in testenv.find_lines(text(), level="info", event="start")}
        print("# lighttpd max-procs 4: %d kembali processes; 10 held requests cost %d reads at %r"
              % (len(served), len(starts), starts))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
    testenv.wait_for(lambda: len(testenv.find_lines(text(), event="stop", msg="stopped")) == 4, 15,
                     msg="each kembali process stopped when lighttpd did")
    check_log(text())


def test_systemd_units_verify(tmpdir):
    """The units make builds from contrib/ship (the build's paths written in)
    pass systemd-analyze verify, with ExecStart pointing at the built binary;
    their exposure by systemd-analyze security --offline goes to the test
    log. Socket activation itself, the LISTEN_FDS hand-over, is tested in
    test_answers."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        raise testenv.Skip("systemd-analyze is not installed")
    built = os.path.join(testenv.top_builddir(), "contrib", "ship", "kembali.service")
    with open(built) as f:
        service = f.read()
    assert not re.search(r"@[a-z]+@", service), "unsubstituted: " + service
    m = re.search(r"^ExecStart=(/\S*/bin)/kembali --config (/\S*)/kembali/kembali.json$", service, re.M)
    assert m, service
    # a restart hands the requests in hand over through the fd store (test_upgrade)
    assert re.search(r"^Type=notify$", service, re.M), service
    assert re.search(r"^FileDescriptorStoreMax=[1-9]\d*$", service, re.M), service
    with open(os.path.join(tmpdir, "kembali.service"), "w") as f:
        f.write(service.replace(m.group(1) + "/kembali", testenv.kembali_bin()))
    shutil.copy(os.path.join(testenv.top_srcdir(), "contrib", "ship", "kembali.socket"), tmpdir)
    # the per-site pair, as the instance site1 (verify takes no template)
    with open(os.path.join(testenv.top_builddir(), "contrib", "ship", "kembali@.service")) as f:
        site = f.read()
    assert not re.search(r"@[a-z]+@", site), "unsubstituted: " + site
    assert_in(m.group(2) + "/kembali/sites/%i.json", site)
    assert re.search(r"^Type=notify$", site, re.M) and re.search(r"^FileDescriptorStoreMax=[1-9]", site, re.M), site
    with open(os.path.join(tmpdir, "kembali@site1.service"), "w") as f:
        f.write(site.replace(m.group(1) + "/kembali", testenv.kembali_bin()))
    shutil.copy(os.path.join(testenv.top_srcdir(), "contrib", "ship", "kembali@.socket"),
                os.path.join(tmpdir, "kembali@site1.socket"))
    # --man=no: Documentation=man:kembali(8) is installed with the program, not yet here
    p = subprocess.run([analyze, "verify", "--man=no"] + [os.path.join(tmpdir, u) for u in (
        "kembali.socket", "kembali.service", "kembali@site1.socket", "kembali@site1.service")],
        capture_output=True, text=True, timeout=60)
    assert_eq((p.returncode, p.stdout + p.stderr), (0, ""))
    p = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", os.path.join(tmpdir, "kembali.service")],
                       capture_output=True, text=True, timeout=60)
    exposure = re.search(r"Overall exposure level for kembali.service: ([\d.]+ \w+)", p.stdout + p.stderr)
    if exposure is None and "offline" in p.stderr:
        print("# systemd-analyze security --offline is not supported here: %s" % p.stderr.strip()[:200])
        return
    assert exposure, p.stdout + p.stderr
    print("# systemd-analyze security --offline=yes: exposure %s" % exposure.group(1))
    assert float(exposure.group(1).split()[0]) <= 3.0, p.stdout
    p = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", os.path.join(tmpdir, "kembali@site1.service")],
                       capture_output=True, text=True, timeout=60)
    exposure = re.search(r"Overall exposure level for kembali@site1.service: ([\d.]+ \w+)", p.stdout + p.stderr)
    assert exposure, p.stdout + p.stderr
    assert float(exposure.group(1).split()[0]) <= 3.0, p.stdout


if __name__ == "__main__":
    testenv.run(globals())
