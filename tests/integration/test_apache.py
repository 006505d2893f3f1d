"""End to end under a real Apache with mod_fcgid (Debian apache2 and
libapache2-mod-fcgid), which sends one request at a time to each kembali
process: ten buyers waiting on one pending transaction means ten processes,
and together they must cost one schedule's reads."""

import json
import os
import pwd
import re
import shutil
import subprocess
import threading

import testenv
import kit
from testenv import assert_eq

APACHE = "/usr/sbin/apache2"
MODULES = "/usr/lib/apache2/modules"


class Apache:
    """apache2 in the foreground, everything in tmpdir; /kembali runs kembali
    under mod_fcgid, or with cgi=True as a plain CGI program (mod_cgid, the
    event MPM's CGI module): one process per request, no FastCGI at all."""

    def __init__(self, tmpdir, config_path, binary, user=None, cgi=False):
        self.tmpdir = tmpdir
        self.port = testenv.free_port()
        self.error_log = os.path.join(tmpdir, "apache-error.log")
        for d in ("run", "fcgid"):
            os.makedirs(os.path.join(tmpdir, d), exist_ok=True)
        user_lines = ""
        if user:
            user_lines = "User %s\nGroup %s\n" % (user, user)
            uid = pwd.getpwnam(user).pw_uid
            gid = pwd.getpwnam(user).pw_gid
            os.chown(os.path.join(tmpdir, "fcgid"), uid, gid)
        conf = f"""ServerRoot {tmpdir}
ServerName shop.test
Listen 127.0.0.1:{self.port}
PidFile {tmpdir}/run/httpd.pid
DefaultRuntimeDir {tmpdir}/run
Mutex file:{tmpdir}/run default
ErrorLog {self.error_log}
LogLevel warn
{user_lines}LoadModule mpm_event_module {MODULES}/mod_mpm_event.so
LoadModule authz_core_module {MODULES}/mod_authz_core.so
LoadModule alias_module {MODULES}/mod_alias.so
{self._handler(tmpdir, config_path, binary, cgi)}"""
        self.conf = os.path.join(tmpdir, "httpd.conf")
        with open(self.conf, "w") as f:
            f.write(conf)
        self.proc = testenv.spawn([APACHE, "-d", tmpdir, "-f", self.conf, "-DFOREGROUND"], tmpdir,
                                  stdout=open(os.path.join(tmpdir, "apache.out"), "wb"),
                                  stderr=subprocess.STDOUT)
        testenv.wait_for(self._up, 30, msg="apache listening")

    @staticmethod
    def _handler(tmpdir, config_path, binary, cgi):
        if cgi:
            return f"""LoadModule cgid_module {MODULES}/mod_cgid.so
LoadModule env_module {MODULES}/mod_env.so
ScriptSock {tmpdir}/run/cgid.sock
SetEnv KEMBALI_CONFIG {config_path}
SetEnv KEMBALI_SHOP toko-a
ScriptAlias /kembali {binary}
<Location /kembali>
    SetHandler cgi-script
    Options +ExecCGI
    Require all granted
</Location>
"""
        # mod_fcgid's locks with flock, not the default fcntl: between the
        # threads of an event MPM child, fcntl's deadlock detection can fail
        # a lock (EDEADLK), and mod_fcgid then exits the child, dropping its
        # requests (seen here: four of ten). The README gives the same line.
        return f"""LoadModule fcgid_module {MODULES}/mod_fcgid.so
Mutex flock:{tmpdir}/run fcgid-proctbl fcgid-pipe
FcgidIPCDir {tmpdir}/fcgid
FcgidProcessTableFile {tmpdir}/fcgid/table
FcgidMaxProcesses 40
FcgidMaxProcessesPerClass 20
FcgidMinProcessesPerClass 0
FcgidSpawnScoreUpLimit 1000
FcgidSpawnScore 1
FcgidTerminationScore 0
FcgidIOTimeout 60
FcgidBusyTimeout 120
FcgidConnectTimeout 10
FcgidMaxRequestsPerProcess 0
FcgidInitialEnv KEMBALI_CONFIG {config_path}
ScriptAlias /kembali {binary}
<Location /kembali>
    SetHandler fcgid-script
    Options +ExecCGI
    Require all granted
</Location>
"""

    def _up(self):
        if self.proc.poll() is not None:
            raise AssertionError("apache exited: " + open(os.path.join(self.tmpdir, "apache.out")).read()
                                 + (open(self.error_log).read() if os.path.exists(self.error_log) else ""))
        try:
            import socket
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def get(self, path, timeout=60):
        return testenv.http_get(self.port, path, {"Host": "shop.test"}, timeout=timeout)

    def log(self):
        return open(self.error_log, errors="replace").read() if os.path.exists(self.error_log) else ""

    def stop(self):
        testenv.kill_process(self.proc)


def setup(tmpdir, schedule, cgi=False):
    if not os.path.exists(APACHE) or not os.path.exists(MODULES + "/mod_fcgid.so"):
        if os.environ.get("KEMBALI_REQUIRE_APACHE") == "1":
            raise AssertionError("apache2 or libapache2-mod-fcgid is not installed")
        raise testenv.Skip("apache2 or libapache2-mod-fcgid is not installed")
    # Apache's user must reach the program and the pages: copy them next to
    # the test's files, whatever the permissions of the checkout's folders.
    binary = os.path.join(tmpdir, "kembali")
    shutil.copy(testenv.kembali_bin(), binary)
    templates = os.path.join(tmpdir, "templates")
    shutil.copytree(os.path.join(testenv.top_srcdir(), "templates"), templates)
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    user = "www-data" if os.geteuid() == 0 else None
    keyf = testenv.write_secret(os.path.join(tmpdir, "key-a"), kit.KEY)
    state = os.path.join(tmpdir, "apache-state")
    os.makedirs(state, mode=0o700)
    cfg = testenv.make_config(sb, [testenv.make_shop("toko-a", keyf)], state_dir=state, templates_dir=templates)
    if schedule is not None:
        cfg["schedule_ms"] = schedule
    cfg_path = os.path.join(tmpdir, "kembali.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    if user:  # the processes run as Apache's user: it owns the state and reads the key
        pw = pwd.getpwnam(user)
        for p in (state, keyf):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(tmpdir, 0o755)
    return sb, Apache(tmpdir, cfg_path, binary, user, cgi=cgi)


@testenv.timeout(110)
def test_ten_concurrent_returns_under_mod_fcgid(tmpdir):
    sb, ap = setup(tmpdir, schedule=None)
    sb.put_tx("t1", "pending")
    results = []
    lock = threading.Lock()

    def buyer():
        r = ap.get("/kembali?id=t1")
        with lock:
            results.append(r)

    ts = [threading.Thread(target=buyer) for _ in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(90)
    log = ap.log()
    pids = set(re.findall(r"event=start version=\S+ pid=(\d+)", log))
    times, last = kit.check_one_pace(sb, [log], "t1", schedule=None)
    print("# mod_fcgid: 10 concurrent returns served by %d kembali processes; %d reads started at %r"
          % (len(pids), len(times), times))
    assert_eq(len(results), 10)
    for status, headers, body in results:
        assert_eq(status, 200)
        assert_eq(headers.get("kembali-status"), "checking")
    assert len(pids) >= 5, "mod_fcgid ran one process per held request: %r\n%s" % (pids, log[-3000:])
    # one schedule's 7 reads, unless a process started so late that its
    # request came 1.5 s after the first: then the one pace goes on for it
    assert_eq(len(times), 7 if last < 45.5 else 8, "one schedule's reads: %r" % times)
    assert "Sanitizer" not in log and "runtime error" not in log, log[-3000:]
    assert ":emerg]" not in log, log[-3000:]
    ap.stop()


def test_final_status_under_mod_fcgid(tmpdir):
    sb, ap = setup(tmpdir, schedule=kit.FAST)
    sb.put_tx("t2", [(0, "pending"), (1500, "succeeded")])
    out = []
    ts = [threading.Thread(target=lambda: out.append(ap.get("/kembali?id=t2"))) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert_eq([h.get("kembali-status") for _, h, _ in out], ["succeeded"] * 4)
    times, _ = kit.check_pace(sb, [ap.log()], "t2", min_start_gap=1.1)
    # one read if the processes started after the payment (slow builds), else a few
    assert 1 <= len(times) <= 4, times
    ap.stop()


def test_ten_concurrent_returns_as_plain_cgi(tmpdir):
    """docs/operations.md, Plain CGI: under Apache's plain CGI every return is its own
    kembali process, started for that request and gone after it. Ten
    concurrent returns on one pending transaction still cost one pace of
    reads (the processes share state_dir), and each answer is the one
    FastCGI gives."""
    sb, ap = setup(tmpdir, schedule=kit.FAST, cgi=True)
    sb.put_tx("t1", "pending")
    results = []
    lock = threading.Lock()

    def buyer():
        r = ap.get("/kembali?id=t1")
        with lock:
            results.append(r)

    ts = [threading.Thread(target=buyer) for _ in range(10)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    log = ap.log()
    assert "Sanitizer" not in log and "runtime error" not in log, log[-3000:]
    requests = re.findall(r"event=request shop=toko-a id=t1 format=html word=(\w+)", log)
    times, last = kit.check_one_pace(sb, [log], "t1", schedule=kit.FAST)
    print("# plain CGI: 10 concurrent returns, %d request lines, %d reads started at %r"
          % (len(requests), len(times), times))
    assert_eq(len(results), 10)
    for status, headers, body in results:
        assert_eq(status, 200)
        assert_eq(headers.get("kembali-status"), "checking")
        assert b'data-status="checking"' in body
    assert_eq(requests, ["checking"] * 10, "one request line per CGI process")
    # the pace is the one of a single request, stretched only by late
    # starters: check_one_pace counted the reads against the last request's
    # deadline (ten CGI processes may start over seconds on a busy machine)
    sb.put_tx("t2", "succeeded")
    status, headers, body = ap.get("/kembali?id=t2")
    assert_eq((status, headers.get("kembali-status")), (200, "succeeded"))
    status, headers, body = ap.get("/kembali?id=t2&format=json")
    assert_eq(json.loads(body), {"id": "t2", "status": "succeeded", "final": True})
    assert_eq(len(sb.reads("t2")), 1, "the second process answered from the shared cache")
    # byte for byte what the same configuration answers over FastCGI
    with open(os.path.join(tmpdir, "kembali.json")) as f:
        cfg = json.load(f)
    cfg["state_dir"] = os.path.join(tmpdir, "fastcgi-state")
    k = testenv.Kembali(tmpdir, config=cfg, name="fastcgi").start()
    for query in ("id=t2", "id=t2&format=json", "id=bad%20id", "id=t2&format=metrics"):
        cgi_status, cgi_headers, cgi_body = ap.get("/kembali?" + query)
        r = k.get(query, extra={"KEMBALI_SHOP": "toko-a"})
        assert_eq(cgi_status, r.status, query)
        assert_eq(cgi_body, r.body, query)
        for name, values in r.headers.items():
            if name not in ("retry-after", "status", "content-length"):  # Apache re-frames the body
                assert_eq(cgi_headers.get(name), values[0], "%s: header %s" % (query, name))
    ap.stop()


if __name__ == "__main__":
    testenv.run(globals())
