"""The operator's kit and the shop's: --log and its reopening, the shipped
logrotate file run by the real logrotate under load, the man page
(mandoc -T lint, and it covers every option and configuration key), and the
example storefront page in a real Chromium, on another origin."""

import glob
import grp
import gzip
import http.server
import os
import pwd
import re
import shutil
import signal
import subprocess
import threading

import testenv
from testenv.env import _merge_env  # noqa: E402
import kit
from testenv import assert_eq, assert_in

SHIP = os.path.join(testenv.top_srcdir(), "contrib", "ship")


def request_lines(text, id):
    return [l for l in testenv.parse_log(text) if l.get("event") == "request" and l.get("id") == id]


def check_whole_lines(path, text):
    """Every line of a log file is one whole key=value line."""
    assert text == "" or text.endswith("\n"), "%s ends inside a line: %r" % (path, text[-200:])
    for line in text.splitlines():
        assert re.match(r"ts=\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z level=\w+ event=\w+", line), \
            "%s: not a whole line: %r" % (path, line)


def test_log_file_reopened_on_usr1_and_hup(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    k = testenv.Kembali(tmpdir, config=lambda k: testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))],
                                                                     schedule_ms=kit.FAST),
                        keys={"a": kit.KEY}, log_file=True)
    k.start()
    sb.put_tx("t1", "succeeded")
    assert_eq(k.get("id=t1").header("kembali-status"), "succeeded")
    k.wait_log(30, event="request", id="t1")
    assert_eq(open(k.stderr_path).read(), "", "with --log nothing goes to standard error")
    assert_eq(os.stat(k.log_path).st_mode & 0o777, 0o640)
    for n, sig in enumerate((signal.SIGUSR1, signal.SIGHUP), 1):
        os.rename(k.log_path, "%s.%d" % (k.log_path, n))
        k.signal(sig)
        testenv.wait_for(lambda: os.path.exists(k.log_path), 30, msg="log reopened after %s" % sig.name)
        assert_eq(k.get("id=t1").header("kembali-status"), "succeeded")
        k.wait_log(30, event="request", id="t1")
    assert_eq(len(request_lines(open(k.log_path + ".1").read(), "t1")), 1)
    assert_eq(len(request_lines(open(k.log_path + ".2").read(), "t1")), 1)
    k.wait_log(30, event="reload")  # SIGHUP reloads too, and says so in the new file
    # a log that cannot be reopened: the old file goes on, saying why
    os.rename(k.log_path, k.log_path + ".3")
    os.mkdir(k.log_path)
    k.signal(signal.SIGUSR1)
    old = k.log_path + ".3"
    testenv.wait_for(lambda: testenv.find_lines(open(old).read(), event="log", level="error"), 5,
                     msg="an error line in the old file")
    assert_eq(k.get("id=t1").header("kembali-status"), "succeeded")
    testenv.wait_for(lambda: request_lines(open(old).read(), "t1"), 30, msg="requests logged on in the old file")
    os.rmdir(k.log_path)
    assert_eq(k.stop(), 0)
    # an unusable --log is a clear error at start
    p = subprocess.run([testenv.kembali_bin(), "--config", k.config_path, "--log", "/nonexistent/dir/k.log",
                        "--listen", os.path.join(tmpdir, "x.sock")], capture_output=True, text=True, timeout=30)
    assert_eq(p.returncode, 1)
    assert_in("--log /nonexistent/dir/k.log", p.stderr)


@testenv.timeout(90)
def test_logrotate_under_load(tmpdir):
    """contrib/ship/kembali.logrotate, run by the real logrotate three times
    while four clients keep kembali busy: every request has its line, whole,
    in one of the files (the current one, .1, and the compressed older ones)."""
    logrotate = shutil.which("logrotate") or "/usr/sbin/logrotate"
    if not os.path.exists(logrotate):
        if os.environ.get("KEMBALI_REQUIRE_SERVERS") == "1":
            raise AssertionError("logrotate is missing and KEMBALI_REQUIRE_SERVERS=1")
        raise testenv.Skip("logrotate is not installed")
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    k = testenv.Kembali(tmpdir, config=lambda k: testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))],
                                                                     schedule_ms=kit.FAST),
                        keys={"a": kit.KEY}, log_file=True)
    k.start()
    with open(os.path.join(SHIP, "kembali.logrotate")) as f:
        conf = f.read()
    for old, new in (("/var/log/kembali/*.log", k.log_path),
                     ("create 0640 kembali adm", "create 0640"),
                     ("pkill -USR1 -x kembali || true", "kill -USR1 %d" % k.pid)):
        assert_in(old, conf, "the shipped logrotate file")
        conf = conf.replace(old, new)
    conf_path = os.path.join(tmpdir, "logrotate.conf")
    with open(conf_path, "w") as f:
        f.write(conf)
    os.chmod(conf_path, 0o644)
    sb.put_tx("t1", "succeeded")
    stop = threading.Event()
    sent = [0] * 4

    def load(i):
        while not stop.is_set():
            r = k.get("id=t1")
            assert_eq(r.header("kembali-status"), "succeeded")
            sent[i] += 1

    threads = [threading.Thread(target=load, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    try:
        for n in range(3):
            # some lines in the current file first, so each rotation moves something
            testenv.wait_for(lambda: len(request_lines(k.log_text(), "t1")) >= 50, 20,
                             msg="requests logged before rotation %d" % (n + 1))
            p = subprocess.run([logrotate, "-f", "-s", os.path.join(tmpdir, "logrotate.state"), conf_path],
                               capture_output=True, text=True, timeout=30)
            assert_eq((p.returncode, p.stdout + p.stderr), (0, ""), "logrotate")
            testenv.wait_for(lambda: os.path.exists(k.log_path), 30, msg="the new log file")
        testenv.wait_for(lambda: len(request_lines(k.log_text(), "t1")) >= 50, 20, msg="requests after rotating")
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    files = sorted(glob.glob(k.log_path + "*"))
    assert_eq([os.path.basename(f) for f in files],
              ["kembali.log", "kembali.log.1", "kembali.log.2.gz", "kembali.log.3.gz"])
    total = 0
    for path in files:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as f:
            text = f.read()
        check_whole_lines(path, text)
        got = len(request_lines(text, "t1"))
        assert got > 0, "%s has no request line" % path
        total += got
    print("# %d requests, %d request lines in %d files" % (sum(sent), total, len(files)))
    assert_eq(total, sum(sent), "request lines across the rotated files vs requests answered")


def test_man_page(tmpdir):
    """kembali(8): no mandoc warning, and it names every option of --help
    and every configuration key kembali accepts."""
    page = os.path.join(SHIP, "kembali.8")
    mandoc = shutil.which("mandoc")
    if mandoc is not None:
        p = subprocess.run([mandoc, "-T", "lint", "-W", "style", page], capture_output=True, text=True, timeout=30)
        # the system's own mandoc.db being out of date is not the page's fault
        out = [l for l in (p.stdout + p.stderr).splitlines() if "mandoc.db" not in l]
        assert_eq(out, [], "mandoc -T lint")
    else:
        man = shutil.which("man")
        if man is None:
            if os.environ.get("KEMBALI_REQUIRE_SERVERS") == "1":
                raise AssertionError("neither mandoc nor man is installed")
            raise testenv.Skip("neither mandoc nor man is installed")
        p = subprocess.run([man, "--warnings", "-l", page], capture_output=True, text=True, timeout=30,
                           env=_merge_env({"MANWIDTH": "80"}))
        assert_eq((p.returncode, p.stderr), (0, ""), "man --warnings")
    src = open(page).read()
    helptext = subprocess.run([testenv.kembali_bin(), "--help"], capture_output=True, text=True, timeout=60).stdout
    for opt in sorted(set(re.findall(r"--[a-z][a-z-]+", helptext))):
        assert_in("Fl -" + opt[2:], src, "option %s in the man page" % opt)
    config_keys = open(os.path.join(testenv.top_srcdir(), "src", "config_keys.c")).read()
    keys = set(re.findall(r'(?:TOP|SHOP)\("(\w+)"\)', config_keys))
    assert len(keys) > 10, keys
    for key in sorted(keys):
        assert_in(".It Cm " + key, src, "configuration key %s in the man page" % key)
    for word in ("SIGTERM", "SIGHUP", "SIGUSR1", "KEMBALI_CONFIG", "FCGI_WEB_SERVER_ADDRS", "LISTEN_FDS",
                 "EXIT STATUS", "fastcgi_keep_conn on", "keepalive", "FcgidInitialEnv", "fastcgi.server",
                 "spawn-fcgi -s", "systemctl"):
        assert_in(word, src)


def connect_as(path, user):
    """Connect to the Unix socket at path as `user` (its uid and groups, a
    fresh process): None when it connected, else the error's name."""
    code = ("import socket, sys\ns = socket.socket(socket.AF_UNIX)\n"
            "try:\n    s.connect(sys.argv[1])\nexcept OSError as e:\n    print(type(e).__name__)\n")
    pw = pwd.getpwnam(user)
    p = subprocess.run(["python3", "-c", code, path], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                       capture_output=True,
                       text=True, timeout=30)
    assert_eq(p.returncode, 0, p.stderr)
    return p.stdout.strip() or None


def test_socket_mode_and_group(tmpdir):
    """--listen's Unix socket: 0660 by default (not the umask's 0755 or
    0777), --socket-mode sets the mode, --socket-group the group, so the web
    server's user connects through its group and nobody else does."""
    if os.geteuid() != 0:
        raise testenv.Skip("needs root (a group to give the socket, a user to connect as)")
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    os.chmod(tmpdir, 0o755)  # www-data must reach the socket's directory

    def start(name, *args):
        k = testenv.Kembali(tmpdir, config=lambda k: testenv.make_config(
            sb, [testenv.make_shop("toko-a", k.key_path("a"))], schedule_ms=kit.FAST),
            keys={"a": kit.KEY}, name=name, args=args)
        os.chmod(os.path.dirname(k.sock_path), 0o755)
        k.umask = 0  # the widest umask, kembali's own: the mode must not come from it
        return k.start()

    sb.put_tx("t1", "succeeded")
    www = grp.getgrnam("www-data").gr_gid
    k = start("plain")
    st = os.stat(k.sock_path)
    assert_eq(oct(st.st_mode & 0o7777), oct(0o660))
    assert_eq(st.st_gid, os.getegid())
    assert_eq(connect_as(k.sock_path, "www-data"), "PermissionError", "not in the socket's group")
    k2 = start("grouped", "--socket-group", "www-data")
    st = os.stat(k2.sock_path)
    assert_eq((oct(st.st_mode & 0o7777), st.st_gid), (oct(0o660), www))
    assert_eq(connect_as(k2.sock_path, "www-data"), None, "www-data connects through its group")
    assert_eq(connect_as(k2.sock_path, "nobody"), "PermissionError")
    assert_eq(k2.get("id=t1").header("kembali-status"), "succeeded")
    k3 = start("private", "--socket-mode", "0600")
    assert_eq(oct(os.stat(k3.sock_path).st_mode & 0o7777), oct(0o600))
    assert_eq(k3.get("id=t1").header("kembali-status"), "succeeded")
    k4 = start("numeric", "--socket-mode", "640", "--socket-group", str(www))
    st = os.stat(k4.sock_path)
    assert_eq((oct(st.st_mode & 0o7777), st.st_gid), (oct(0o640), www))
    assert_eq(connect_as(k4.sock_path, "www-data"), "PermissionError", "0640: the group may not write")
    # bad values and misplaced options: a clear error, exit 1, nothing made
    sock = os.path.join(tmpdir, "bad.sock")
    for args, says in (
            (["--listen", sock, "--socket-mode", "0999"], "--socket-mode 0999"),
            (["--listen", sock, "--socket-mode", "1777"], "--socket-mode 1777"),
            (["--listen", sock, "--socket-mode", "rw-rw----"], "octal"),
            (["--listen", sock, "--socket-mode", ""], "octal"),
            (["--listen", sock, "--socket-group", "no-such-group-kb"], "no such group"),
            (["--socket-mode", "0600"], "only to the Unix socket --listen makes"),
            (["--listen", "127.0.0.1:%d" % testenv.free_port(), "--socket-group", "www-data"],
             "only to the Unix socket --listen makes")):
        p = subprocess.run([testenv.kembali_bin(), "--config", k.config_path] + args, capture_output=True,
                           text=True, timeout=30)
        assert_eq(p.returncode, 1, "%s: %s" % (args, p.stderr))
        assert_in(says, p.stderr)
        assert not os.path.exists(sock), args


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def page_status(dom):
    """The data-status the page set on its <body>."""
    m = re.search(r'<body[^>]*\sdata-status="(\w+)"', dom)
    assert m, dom[:2000]
    return m.group(1)


def serve_dir(path):
    """A static HTTP server for path on 127.0.0.1 (another origin than nginx)."""
    handler = lambda *a, **kw: _Quiet(*a, directory=path, **kw)  # noqa: E731
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


def test_storefront_example_in_chromium(tmpdir):
    """The shipped storefront page on its own origin reads kembali's JSON
    through nginx (cors_origins), shows the final status, and polls only as
    Retry-After says (Chromium's virtual time runs its timers: 20 virtual
    seconds of a pending payment are a handful of polls, not hundreds)."""
    testenv.chromium_or_skip()
    site = os.path.join(tmpdir, "site")
    os.makedirs(site)
    srv = serve_dir(site)
    origin = "http://127.0.0.1:%d" % srv.server_address[1]
    try:
        sb, k = kit.start(tmpdir, shops=lambda k: [
            testenv.make_shop("toko-a", k.key_path("a"), cors_origins=[origin])])
        ng = testenv.Nginx(tmpdir, k)
        with open(os.path.join(SHIP, "storefront.html")) as f:
            page = f.read()
        assert_in('data-kembali="/kembali"', page)
        with open(os.path.join(site, "order.html"), "w") as f:
            f.write(page.replace('data-kembali="/kembali"', 'data-kembali="%s"' % ng.url("/kembali")))
        sb.put_tx("t1", "succeeded")
        dom = testenv.chromium_dump_dom(origin + "/order.html?id=t1", extra_args=["--virtual-time-budget=5000"])
        assert_eq(page_status(dom), "succeeded")
        assert_in("paid, thank you", dom)

        sb.put_tx("t2", "pending")
        dom = testenv.chromium_dump_dom(origin + "/order.html?id=t2", extra_args=["--virtual-time-budget=20000"])
        assert_eq(page_status(dom), "pending")
        polls = [l for l in k.find_log(event="request", id="t2") if l.get("format") == "json"]
        print("# storefront: %d polls of a pending payment in 20 virtual seconds, %d reads"
              % (len(polls), len(sb.reads("t2"))))
        # Retry-After is at least 1 s: at most one poll per virtual second
        assert 1 <= len(polls) <= 21, "%d polls in 20 virtual seconds" % len(polls)
        assert_eq(len(sb.reads("t2")), len(k.find_log(event="read", id="t2")))

        # from an origin kembali does not list, the browser hides the answer
        k2_site = os.path.join(tmpdir, "other")
        os.makedirs(k2_site)
        shutil.copy(os.path.join(site, "order.html"), k2_site)
        other = serve_dir(k2_site)
        try:
            dom = testenv.chromium_dump_dom("http://127.0.0.1:%d/order.html?id=t1" % other.server_address[1],
                                            extra_args=["--virtual-time-budget=3000"])
            assert_eq(page_status(dom), "unknown", "a cross-origin read without cors_origins")
            assert_in("Cannot reach the payment check", dom)
        finally:
            other.shutdown()
    finally:
        srv.shutdown()


if __name__ == "__main__":
    testenv.run(globals())
