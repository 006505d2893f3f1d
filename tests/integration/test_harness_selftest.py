#!/usr/bin/env python3
"""Self-test of the harness (testenv/), without the real kembali or sandbox.

The FastCGI client is tested against a small FastCGI responder written here
(its record parsing is written separately from the harness's on purpose);
Kembali and Sandbox are tested against stand-ins that this same file becomes
when run with --fake-kembali or --fake-sandbox; nginx and chromium are
exercised for real in front of the responder.

    python3 -m pytest tests/integration/test_harness_selftest.py [-k NAME]
"""

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import urllib.request

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import assert_between, assert_eq, assert_in, wait_for  # noqa: E402

BIG = bytes(range(256)) * 400  # 102400 bytes: several STDOUT records
LONG_VALUE = "v" * 70000  # a param longer than one record
SELF = os.path.abspath(__file__)


# ---------------------------------------------------------------------------
# A FastCGI responder (the application side), independent of harness.py
# ---------------------------------------------------------------------------

def _rec(rtype, content=b"", rid=1, pad=None):
    if pad is None:
        pad = (-len(content)) % 8
    return struct.pack(">BBHHBB", 1, rtype, rid, len(content), pad, 0) + content + b"\x00" * pad


def _read_exact(conn, n):
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data


def _decode_pairs(data):
    out, i = {}, 0

    def length():
        nonlocal i
        if data[i] < 128:
            i += 1
            return data[i - 1]
        n = struct.unpack(">I", data[i:i + 4])[0] & 0x7FFFFFFF
        i += 4
        return n

    while i < len(data):
        nl = length()
        vl = length()
        name = data[i:i + nl].decode()
        i += nl
        out[name] = data[i:i + vl].decode()
        i += vl
    return out


def read_request(conn):
    """(begin body, params, stdin, number of PARAMS records) from a client."""
    begin, params, stdin, nparams = None, b"", b"", 0
    params_done = stdin_done = False
    while not (params_done and stdin_done):
        _, rtype, rid, clen, plen, _ = struct.unpack(">BBHHBB", _read_exact(conn, 8))
        assert rid == 1, rid
        assert clen <= 65535
        content = _read_exact(conn, clen + plen)[:clen]
        if rtype == 1:
            begin = content
        elif rtype == 4:
            nparams += 1
            params += content
            params_done = clen == 0
        elif rtype == 5:
            stdin += content
            stdin_done = clen == 0
    return begin, _decode_pairs(params), stdin, nparams


def default_handler(params, stdin):
    head = b"Status: 201 Created\r\nX-A: 1\r\nX-Multi: one\r\nX-Multi: two\r\n\r\nhello"
    return head + BIG


class Responder:
    """Serves FastCGI on ``addr`` (a Unix socket path, or "tcp").

    mode: "normal" (the handler's stdout in several records, a STDERR record,
    END_REQUEST with app status 7), "close_early" (half the output, then
    close), "hang" (never answers)."""

    def __init__(self, addr, mode="normal", handler=default_handler):
        self.mode = mode
        self.handler = handler
        self.requests = []
        if addr == "tcp":
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.bind(("127.0.0.1", 0))
            self.addr = self.sock.getsockname()
        else:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.bind(addr)
            os.chmod(addr, 0o777)
            self.addr = addr
        self.sock.listen(64)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                begin, params, stdin, nparams = read_request(conn)
            except EOFError:
                return  # a readiness probe
            self.requests.append({"begin": begin, "params": params, "stdin": stdin, "nparams": nparams})
            if self.mode == "hang":
                time.sleep(30)
                return
            out = self.handler(params, stdin)
            chunks = [out[i:i + 30000] for i in range(0, len(out), 30000)]
            if self.mode == "close_early":
                conn.sendall(_rec(6, chunks[0]))
                return
            data = b""
            for n, c in enumerate(chunks):
                data += _rec(6, c, pad=3 if n == 1 else None)  # odd padding on purpose
                if n == 0:
                    data += _rec(7, b"warning from app\n")
            data += _rec(6) + _rec(7)
            data += _rec(3, struct.pack(">IB3x", 7, 0))
            conn.sendall(data)

    def close(self):
        self.closed = True
        self.sock.close()


# ---------------------------------------------------------------------------
# FastCGI client tests
# ---------------------------------------------------------------------------

def check_big_response(r, responder):
    assert_eq(r.status, 201, "status")
    assert_eq(r.reason, "Created")
    assert_eq(r.header("x-a"), "1")
    assert_eq(r.header("X-A"), "1")
    assert_eq(r.headers["x-multi"], ["one", "two"])
    assert_eq(r.header("missing"), None)
    assert_eq(len(r.body), 5 + len(BIG))
    assert r.body == b"hello" + BIG, "body differs"
    assert r.text.startswith("hello")
    assert_eq(r.stderr, b"warning from app\n")
    assert_eq(r.app_status, 7)
    assert_eq(r.protocol_status, 0)
    assert_between(r.elapsed, 0, 60)  # a hang detector
    req = responder.requests[-1]
    assert_eq(req["begin"], b"\x00\x01\x00\x00\x00\x00\x00\x00", "BEGIN_REQUEST body: responder, flags 0")
    return req


def test_fcgi_unix_big_params_and_body(tmpdir):
    resp = Responder(harness.socket_path(tmpdir, "app.sock"))
    try:
        params = {"SHORT": "x", "MEDIUM": "m" * 200, "LONG": LONG_VALUE, "EMPTY": "",
                  "N" * 130: "long name", "UTF8": "héllo"}
        r = harness.fcgi_request(resp.addr, params, stdin=b"body bytes" * 10000, timeout=10)
        req = check_big_response(r, resp)
        assert_eq(req["params"], params, "params decoded by the responder")
        assert_eq(req["stdin"], b"body bytes" * 10000)
        assert req["nparams"] >= 3, "params should span several records, got %d" % req["nparams"]
    finally:
        resp.close()


def test_fcgi_tcp_and_get_params(tmpdir):
    resp = Responder("tcp")
    try:
        r = harness.get(resp.addr, "id=abc&x=1", accept="application/json",
                        extra={"KEMBALI_SHOP": "toko-a", "HTTP_ORIGIN": "https://x", "REMOTE_PORT": None})
        check_big_response(r, resp)
        p = resp.requests[-1]["params"]
        expect = {
            "REQUEST_METHOD": "GET", "QUERY_STRING": "id=abc&x=1", "REQUEST_URI": "/kembali?id=abc&x=1",
            "SCRIPT_NAME": "/kembali", "DOCUMENT_URI": "/kembali", "SERVER_NAME": "shop.test",
            "SERVER_PORT": "80", "SERVER_PROTOCOL": "HTTP/1.1", "GATEWAY_INTERFACE": "CGI/1.1",
            "REMOTE_ADDR": "127.0.0.1", "HTTP_HOST": "shop.test", "HTTP_ACCEPT": "application/json",
            "KEMBALI_SHOP": "toko-a", "HTTP_ORIGIN": "https://x",
        }
        assert_eq(p, expect, "CGI params")
        harness.get(resp.addr, method="HEAD", host="other.test")
        p = resp.requests[-1]["params"]
        assert_eq((p["REQUEST_METHOD"], p["QUERY_STRING"], p["REQUEST_URI"], p["HTTP_HOST"]),
                  ("HEAD", "", "/kembali", "other.test"))
        assert "HTTP_ACCEPT" not in p
    finally:
        resp.close()


def test_fcgi_lf_headers_default_status(tmpdir):
    resp = Responder(harness.socket_path(tmpdir, "a.sock"),
                     handler=lambda p, s: b"Content-Type: text/plain\nKembali-Status: checking\n\nline1\r\n\r\nline2")
    try:
        r = harness.fcgi_request(resp.addr, {"A": "b"})
        assert_eq(r.status, 200)
        assert_eq(r.header("content-type"), "text/plain")
        assert_eq(r.header("kembali-status"), "checking")
        assert_eq(r.body, b"line1\r\n\r\nline2", "the body keeps its own blank lines")
        assert r.headers_complete
    finally:
        resp.close()


def test_fcgi_json_helper(tmpdir):
    resp = Responder(harness.socket_path(tmpdir, "a.sock"),
                     handler=lambda p, s: b'Status: 404 Not Found\r\nContent-Type: application/json\r\n\r\n'
                                          b'{"id": "x", "status": "unknown", "final": false}')
    try:
        r = harness.get(resp.addr, "id=x&format=json")
        assert_eq(r.status, 404)
        assert_eq(r.json(), {"id": "x", "status": "unknown", "final": False})
        assert_in("404", repr(r))
    finally:
        resp.close()


def test_fcgi_connection_closed_early(tmpdir):
    resp = Responder(harness.socket_path(tmpdir, "a.sock"), mode="close_early")
    try:
        try:
            harness.fcgi_request(resp.addr, {"A": "b"}, timeout=10)
        except harness.FcgiError as e:
            assert_in("closed before FCGI_END_REQUEST", str(e))
            assert_in("30000 stdout bytes", str(e))
        else:
            raise AssertionError("no FcgiError")
    finally:
        resp.close()


def test_fcgi_timeout_and_refused(tmpdir):
    resp = Responder(harness.socket_path(tmpdir, "a.sock"), mode="hang")
    try:
        t0 = time.monotonic()
        try:
            harness.fcgi_request(resp.addr, {"A": "b"}, timeout=0.5)
        except harness.FcgiTimeout as e:
            assert_in("no FCGI_END_REQUEST within 0.5 s", str(e))
        else:
            raise AssertionError("no FcgiTimeout")
        assert_between(time.monotonic() - t0, 0.4, 30)  # never early; the upper bound a hang detector
    finally:
        resp.close()
    try:
        harness.fcgi_request(harness.socket_path(tmpdir, "nothing.sock"), {})
    except harness.FcgiError as e:
        assert_in("cannot connect", str(e))
    else:
        raise AssertionError("no FcgiError")


def test_fcgi_record_encoding(tmpdir):
    assert_eq(harness.fcgi_encode_pair("A", "bc"), b"\x01\x02Abc")
    assert_eq(harness.fcgi_encode_pair("A", "x" * 128)[:6], b"\x01\x80\x00\x00\x80A")
    rec = harness.fcgi_record(harness.FCGI_STDIN, b"abc")
    assert_eq(len(rec) % 8, 0)
    assert_eq(rec[:8], b"\x01\x05\x00\x01\x00\x03\x05\x00")
    try:
        harness.fcgi_record(harness.FCGI_STDIN, b"x" * 65536)
    except ValueError:
        pass
    else:
        raise AssertionError("an oversized record was accepted")


def test_cgi_parse_without_blank_line(tmpdir):
    r = harness.Response(b"Status: 502 Bad Gateway\r\nX: y", b"", 0, 0, 0.0)
    assert_eq((r.status, r.header("x"), r.body, r.headers_complete), (502, "y", b"", False))
    r = harness.Response(b"", b"", 0, 0, 0.0)
    assert_eq((r.status, r.body), (200, b""))


# ---------------------------------------------------------------------------
# Log lines, metrics, assertions
# ---------------------------------------------------------------------------

def test_log_line_parser(tmpdir):
    line = r'ts=2026-10-10T10:00:00Z level=info event=read shop=toko-a http=429 msg="a \"b\" c\\d\n" retry_after=1 empty= q=""'
    d = harness.parse_log_line(line)
    assert_eq(d["ts"], "2026-10-10T10:00:00Z")
    assert_eq(d["level"], "info")
    assert_eq(d["http"], "429")
    assert_eq(d["msg"], 'a "b" c\\d\n')
    assert_eq(d["retry_after"], "1")
    assert_eq(d["empty"], "")
    assert_eq(d["q"], "")
    assert_eq(d["_raw"], line)
    d = harness.parse_log_line('bare words k=v msg="unterminated \\x41\\u00e9')
    assert_eq({k: v for k, v in d.items() if k != "_raw"}, {"k": "v", "msg": "unterminated Aé"})
    lines = harness.parse_log('a=1\n\n b=2 c="x y"\n')
    assert_eq([{k: v for k, v in l.items() if k != "_raw"} for l in lines], [{"a": "1"}, {"b": "2", "c": "x y"}])
    assert harness._matches(lines[1], {"b": 2, "c": "x y"})
    assert not harness._matches(lines[1], {"b": "3"})


def test_parse_metrics(tmpdir):
    m = harness.parse_metrics('# HELP x y\n# TYPE x counter\nkembali_reads_total{shop="a",http="200"} 3\nup 1\n')
    assert_eq(m, {'kembali_reads_total{shop="a",http="200"}': 3.0, "up": 1.0})


def test_assert_helpers(tmpdir):
    for fn, args, text in ((assert_eq, (1, 2, "ctx"), "ctx: expected 2\n  got      1"),
                           (assert_between, (5, 1, 3), "expected 1 <= x <= 3, got x = 5"),
                           (assert_in, ("z", "abc"), "expected 'z' in 'abc'")):
        try:
            fn(*args)
        except AssertionError as e:
            assert_in(text, str(e))
        else:
            raise AssertionError("%s did not raise" % fn.__name__)
    t0 = time.monotonic()
    assert_eq(wait_for(lambda: time.monotonic() - t0 > 0.1 and "yes", 2), "yes")
    try:
        wait_for(lambda: 1 / 0, 0.1, msg="never")
    except AssertionError as e:
        assert_in("never: timed out after 0.1 s", str(e))
        assert_in("ZeroDivisionError", str(e))
    else:
        raise AssertionError("wait_for did not time out")


# ---------------------------------------------------------------------------
# The fixtures (testenv/fixtures.py), on a test file of their own run by pytest
# ---------------------------------------------------------------------------

def run_pytest(tmpdir, source, *args):
    """pytest on ``source`` (written to <tmpdir>/t_fixtures.py) with the
    harness's fixtures (a conftest.py as tests/package has); its
    CompletedProcess (stdout and stderr as text)."""
    script = os.path.join(tmpdir, "t_fixtures.py")
    with open(script, "w") as f:
        f.write("import harness\n" + source)
    with open(os.path.join(tmpdir, "conftest.py"), "w") as f:
        f.write("from testenv.fixtures import *\n")
    env = dict(os.environ, PYTHONPATH=os.path.dirname(SELF), PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--rootdir", tmpdir, "-v", "-rs", "--durations=0", "--durations-min=0", script] + list(args),
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmpdir)


def test_fixtures_folders_processes_checks_timeouts(tmpdir):
    """A passing test's folder is removed, a failing test's kept (its path in
    the report); every process a test started is killed when it ends, a
    timed-out one's too; a registered final check fails a passing test."""
    seen = os.path.join(tmpdir, "seen")
    p = run_pytest(tmpdir, """
import os
SEEN = %r
def note(what, value):
    with open(SEEN, "a") as f:
        f.write("%%s %%s\\n" %% (what, value))
def test_pass(tmpdir):
    assert isinstance(tmpdir, str) and harness.current_tmpdir() == tmpdir
    note("pass_tmpdir", tmpdir)
def test_skip(tmpdir):
    raise harness.Skip("not here")
def test_fail(tmpdir):
    note("fail_tmpdir", tmpdir)
    note("fail_pid", harness.spawn(["sleep", "60"]).pid)
    harness.assert_eq(1, 2, "deliberate")
@harness.timeout(1.5)
def test_slow():
    p = harness.spawn(["sleep", "60"])
    note("slow_pid", p.pid)
    p.wait()
def test_check_fails_it(tmpdir):
    harness.current_test().checks.append(lambda: harness.assert_eq("checked", "ok", "final check"))
def test_then_gone():
    notes = dict(l.split(" ", 1) for l in open(SEEN).read().splitlines())
    for what in ("fail_pid", "slow_pid"):
        try:
            os.kill(int(notes[what]), 0)
        except ProcessLookupError:
            continue
        raise AssertionError("%%s %%s still runs after its test" %% (what, notes[what]))
""" % seen)
    out = p.stdout + p.stderr
    assert_eq(p.returncode, 1, out)
    assert_in("t_fixtures.py::test_pass PASSED", out)
    assert_in("SKIPPED [1] t_fixtures.py", out)
    assert_in(": not here", out)
    assert_in("t_fixtures.py::test_fail FAILED", out)
    assert_in("AssertionError: deliberate: expected 2", out)
    assert_in("Timeout", out)
    assert_in("p.wait()", out)
    assert_in("final check: expected 'ok'", out)
    assert_in("t_fixtures.py::test_then_gone PASSED", out)
    assert_in("3 failed, 2 passed, 1 skipped", out)
    notes = dict(l.split(" ", 1) for l in open(seen).read().splitlines())
    assert not os.path.exists(notes["pass_tmpdir"]), "a passing test's tmpdir is removed"
    assert os.path.isdir(notes["fail_tmpdir"]), "a failing test's tmpdir is kept"
    assert_in("kept tmpdir", out)
    assert_in(notes["fail_tmpdir"], out)
    harness.shutil.rmtree(notes["fail_tmpdir"], ignore_errors=True)
    for what in ("fail_pid", "slow_pid"):
        try:
            os.kill(int(notes[what]), 0)
        except ProcessLookupError:
            pass
        else:
            raise AssertionError("%s %s still runs: %s" % (what, notes[what], out))
    p = run_pytest(tmpdir, "def test_ok(tmpdir): pass\ndef test_skipped(): raise harness.Skip('x')\n", "-k", "ok")
    assert_eq(p.returncode, 0, p.stdout + p.stderr)
    assert_in("1 passed, 1 deselected", p.stdout)


# ---------------------------------------------------------------------------
# Kembali and Sandbox, against stand-ins (this file with --fake-*)
# ---------------------------------------------------------------------------

def fake_bin(tmpdir, role):
    path = os.path.join(tmpdir, "fake-" + role)
    with open(path, "w") as f:
        f.write('#!/bin/sh\nexec %s %s --fake-%s "$@"\n' % (sys.executable, SELF, role))
    os.chmod(path, 0o755)
    return path


def test_sandbox_control_api(tmpdir):
    with harness.Sandbox(tmpdir, keys=["k1", "k2"], bin=fake_bin(tmpdir, "sandbox")) as sb:
        assert sb.port > 0 and sb.base == "http://127.0.0.1:%d" % sb.port
        st = sb.stats()
        assert_eq(st["argv"], ["--key", "k1", "--key", "k2"])
        sb.put_tx("tx_1", "succeeded")
        sb.put_tx("tx-2", timeline=[(0, "pending"), (3000, "succeeded")], responses=[{"status": 500}])
        assert_eq(sb.stats()["transactions"]["tx_1"], {"timeline": [{"after_ms": 0, "status": "succeeded"}]})
        assert_eq(sb.stats()["transactions"]["tx-2"]["timeline"][1], {"after_ms": 3000, "status": "succeeded"})
        req = urllib.request.Request(sb.base + "/v1/transactions/tx_1", headers={"Authorization": "Bearer k1"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert_eq(json.load(resp)["status"], "succeeded")
        assert_eq(len(sb.reads()), 1)
        assert_eq(sb.reads("tx_1")[0]["id"], "tx_1")
        assert_eq(sb.reads("tx-2"), [])
        sb.add_key("k3")
        sb.remove_key("k1")
        assert_eq(sorted(sb.stats()["keys"]), ["k2", "k3"])
        try:
            sb.remove_key("nope")
        except harness.SandboxError as e:
            assert_in("404", str(e))
        else:
            raise AssertionError("no SandboxError")
        sb.reset()
        assert_eq(sb.reads(), [])
        assert_in("sandbox started", sb.log_text())
    assert_eq(sb.proc.returncode, 0)


def test_sandbox_start_failure(tmpdir):
    try:
        harness.Sandbox(tmpdir, args=["--exit"], bin=fake_bin(tmpdir, "sandbox"))
    except AssertionError as e:
        assert_in("did not print 'listening port=N'", str(e))
        assert_in("exiting as asked", str(e))
    else:
        raise AssertionError("no error")


def test_kembali_lifecycle(tmpdir):
    fake = fake_bin(tmpdir, "kembali")
    with harness.Sandbox(tmpdir, bin=fake_bin(tmpdir, "sandbox")) as sb:
        def config(k):
            return harness.make_config(sb, [harness.make_shop("toko-a", k.key_path("toko-a"))],
                                       schedule_ms=[0, 1100])
        k = harness.Kembali(tmpdir, config=config, keys={"toko-a": "sk_secret"}, bin=fake)
        path = k.key_path("toko-a")
        assert_eq(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        assert_eq(open(path).read(), "sk_secret\n")
        with open(k.config_path) as f:
            cfg = json.load(f)
        assert_eq(cfg["api_base"], sb.base)
        assert_eq(cfg["state_dir"], os.path.join(tmpdir, "state"))
        assert os.path.isdir(cfg["state_dir"])
        assert_eq(cfg["templates_dir"], os.path.join(harness.top_srcdir(), "templates"))
        assert_eq(cfg["shops"][0]["secret_key_file"], path)
        assert_eq(cfg["schedule_ms"], [0, 1100])
        assert_eq(k.addr, harness.socket_path(tmpdir, "kembali.sock"))
        if len(tmpdir) < 80:
            assert_eq(k.addr, os.path.join(tmpdir, "kembali.sock"))
        with k:
            r = k.get("id=abc", accept="application/json", extra={"KEMBALI_SHOP": "toko-a"})
            assert_eq(r.status, 200)
            assert_eq(r.header("kembali-status"), "checking")
            assert_eq(r.json(), {"id": "abc", "status": "unknown", "final": False})
            line = k.wait_log(event="request", id="abc")
            assert_eq(line["shop"], "toko-a")
            assert_eq(line["msg"], 'asked "abc"')
            assert_in("argv=", k.log_text())
            assert_eq(k.find_log(event="start")[0]["listen"], k.addr)
            assert k.rss_kb() > 0
            assert k.peak_rss_kb() >= k.rss_kb() - 1000
            k.reload(dict(cfg, schedule_ms=[0, 1200]))
            k.wait_log(event="reload", schedule="0,1200")
            m = k.metrics()
            assert_eq(m["kembali_requests_total"], 2.0)
            assert_eq(k.stop(), 0)
            assert k.find_log(event="stop")
    code, out = harness.Kembali.run_check_config(cfg, bin=fake)
    assert_eq((code, out.strip().splitlines()[-1]), (0, "configuration ok"))
    code, out = harness.Kembali.run_check_config(b"{not json", bin=fake)
    assert_eq(code, 1, out)
    assert_in("not JSON", out)
    code, out = harness.Kembali.run_check_config(k.config_path, bin=fake)
    assert_eq(code, 0, out)


def test_kembali_fd0_shared_socket(tmpdir):
    fake = fake_bin(tmpdir, "kembali")
    a = harness.Kembali(tmpdir, config={"shops": []}, bin=fake, listen="fd0", name="a")
    with a:
        b = harness.Kembali(tmpdir, config={"shops": []}, bin=fake, listen=a.listen_socket, name="b")
        with b:
            assert_eq(b.addr, a.addr)
            # The socket accepted before either process ran: wait until both serve.
            a.wait_log(event="start")
            b.wait_log(event="start")
            # Which process accepts is the kernel's choice; stop one, then
            # the other, so each must be the one that answers.
            served = []
            for stopped in (a, b):
                os.kill(stopped.pid, signal.SIGSTOP)
                try:
                    served.append(a.get("id=x", timeout=10).header("x-pid"))
                finally:
                    os.kill(stopped.pid, signal.SIGCONT)
            assert_eq(served, [str(b.pid), str(a.pid)], "both processes answer on the shared socket")


def test_kembali_start_failure_shows_log(tmpdir):
    k = harness.Kembali(tmpdir, config={"shops": []}, args=["--exit"], bin=fake_bin(tmpdir, "kembali"))
    try:
        k.start()
    except AssertionError as e:
        assert_in("exited with 3 before accepting", str(e))
        assert_in("exiting as asked", str(e))
    else:
        raise AssertionError("no error")


def test_missing_binaries_are_reported(tmpdir):
    for make in (lambda: harness.Sandbox(tmpdir, bin=os.path.join(tmpdir, "none")),
                 lambda: harness.Kembali(tmpdir, config={}, bin=os.path.join(tmpdir, "none")).start()):
        try:
            make()
        except AssertionError as e:
            assert_in("does not exist", str(e))
        else:
            raise AssertionError("no error")


# ---------------------------------------------------------------------------
# nginx and chromium, for real, in front of the responder
# ---------------------------------------------------------------------------

PAGE = (b'<!doctype html><html lang="en" data-status="checking"><head><meta charset="utf-8">'
        b'<meta name="viewport" content="width=device-width"><title>t</title></head>'
        b'<body><p id="q">QUERY</p><script>document.documentElement.setAttribute("data-js", "ran")</script>'
        b'</body></html>')


def page_handler(params, stdin):
    body = PAGE.replace(b"QUERY", params.get("QUERY_STRING", "").encode())
    return (b"Content-Type: text/html; charset=utf-8\r\nKembali-Status: checking\r\nX-Shop: "
            + params.get("KEMBALI_SHOP", "-").encode() + b"\r\nX-Host: "
            + params.get("HTTP_HOST", "-").encode() + b"\r\n\r\n" + body)


def with_nginx(tmpdir, fn):
    resp = Responder(harness.socket_path(tmpdir, "app.sock"), handler=page_handler)
    try:
        with harness.Nginx(tmpdir, resp.addr, location_extra="fastcgi_param KEMBALI_SHOP toko-a;") as ng:
            return fn(ng, resp)
    finally:
        resp.close()


def test_nginx_in_front_of_fastcgi(tmpdir):
    def check(ng, resp):
        status, headers, body = ng.http_get("/kembali?id=abc")
        assert_eq(status, 200)
        assert_eq(headers["kembali-status"], "checking")
        assert_eq(headers["x-shop"], "toko-a")
        assert_eq(headers["x-host"], "shop.test")
        assert_in(b'<p id="q">id=abc</p>', body)
        p = resp.requests[-1]["params"]
        assert_eq((p["QUERY_STRING"], p["REQUEST_METHOD"], p["KEMBALI_SHOP"]), ("id=abc", "GET", "toko-a"))
        assert_eq(ng.url("/kembali?id=1"), "http://127.0.0.1:%d/kembali?id=1" % ng.port)
        status, headers, body = ng.http_get("/elsewhere")
        assert_eq(status, 404)
        conf = open(ng.conf_path).read()
        assert_in("fastcgi_pass unix:%s;" % resp.addr, conf)
        assert_in("fastcgi_read_timeout 40s;", conf)
        return ng
    ng = with_nginx(tmpdir, check)
    assert ng.proc.poll() is not None, "nginx stopped"


def test_chromium_missing_skips_unless_required(tmpdir):
    missing = os.path.join(tmpdir, "no-chromium")
    try:
        harness.chromium_or_skip(missing, env={})
    except harness.Skip as e:
        assert_in("not installed", str(e))
    else:
        raise AssertionError("no Skip")
    try:
        harness.chromium_or_skip(missing, env={"KEMBALI_REQUIRE_CHROMIUM": "1"})
    except harness.Skip:
        raise AssertionError("Skip although KEMBALI_REQUIRE_CHROMIUM=1") from None
    except AssertionError as e:
        assert_in("KEMBALI_REQUIRE_CHROMIUM=1", str(e))
    else:
        raise AssertionError("no failure")


@harness.timeout(180)
def test_chromium_dump_dom_through_nginx(tmpdir):
    def check(ng, resp):
        dom = harness.chromium_dump_dom(ng.url("/kembali?id=xyz"))
        assert_in('data-status="checking"', dom)
        assert_in('data-js="ran"', dom)
        assert_in('<p id="q">id=xyz</p>', dom)
        png = harness.chromium_screenshot(ng.url("/kembali?id=xyz"), os.path.join(tmpdir, "shot.png"))
        with open(png, "rb") as f:
            head = f.read(24)
        assert_eq(head[:8], b"\x89PNG\r\n\x1a\n")
        width, height = struct.unpack(">II", head[16:24])
        assert_eq((width, height), (390, 844))
    with_nginx(tmpdir, check)


# ---------------------------------------------------------------------------
# Redis: a real redis-server, the RESP client, kit.start_hosts
# ---------------------------------------------------------------------------

def test_redis_start_and_commands(tmpdir):
    r = harness.Redis(tmpdir)
    assert r.port and r.port != 6379
    assert_eq(r.url(), "redis://127.0.0.1:%d" % r.port)
    assert_eq(r.url(db=3), "redis://127.0.0.1:%d/3" % r.port)
    assert_eq(r.unix_url(), "unix://" + r.sock_path)
    assert_eq(r.unix_url(db=2), "unix://%s?db=2" % r.sock_path)
    assert r.sock_path.startswith("/") and stat.S_ISSOCK(os.stat(r.sock_path).st_mode)
    # replies: simple string, bulk string (str or bytes), nil, integer, array, error
    assert_eq(r.cmd("SET", "x", "1"), "OK")
    assert_eq(r.cmd("GET", "x"), "1")
    assert_eq(r.cmd("GET", "x", raw=True), b"1")
    assert_eq(r.cmd("GET", "nothing"), None)
    assert_eq(r.cmd("INCR", "x"), 2)
    assert_eq(r.cmd("INCRBY", "x", 40), 42)
    blob = bytes(range(256))
    assert_eq(r.cmd("SET", "blob", blob), "OK")
    assert_eq(r.cmd("GET", "blob", raw=True), blob)
    assert_eq(r.cmd("RPUSH", "l", "a", "b", "c"), 3)
    assert_eq(r.cmd("LRANGE", "l", 0, -1), ["a", "b", "c"])
    assert_eq(r.cmd("HSET", "h", "f", "v"), 1)
    assert_eq(r.cmd("HGETALL", "h"), ["f", "v"])
    try:
        r.cmd("INCR", "l")
    except harness.RedisError as e:
        assert_in("WRONGTYPE", str(e))
    else:
        raise AssertionError("no RedisError")
    assert_eq(r.keys(), ["blob", "h", "l", "x"])
    assert_eq(r.keys("b*"), ["blob"])
    # other databases
    assert_eq(r.cmd("SET", "in1", "y", db=1), "OK")
    assert_eq(r.keys(db=1), ["in1"])
    assert_eq(r.keys("in*"), [])
    # private, no persistence, in the foreground
    assert_eq(r.cmd("CONFIG", "GET", "save"), ["save", ""])
    assert_eq(r.cmd("CONFIG", "GET", "appendonly"), ["appendonly", "no"])
    assert_eq(r.cmd("CONFIG", "GET", "dir")[1], os.path.realpath(r.dir))
    # TCP too, and a kept connection that pipelines
    with r.client(tcp=True) as c:
        assert_eq(c.cmd("PING"), "PONG")
        c.send("SET", "p", "1")
        c.send("INCR", "p")
        c.send("MULTI")
        c.send("INCR", "p")
        c.send("INCR", "l")
        c.send("EXEC")
        assert_eq([c.reply() for _ in range(5)], ["OK", 2, "OK", "QUEUED", "QUEUED"])
        got = c.reply()
        assert_eq(got[0], 3)
        assert isinstance(got[1], harness.RedisError), got
    assert os.path.getsize(r.log_path) > 0
    assert_eq(r.stop(), 0)
    assert not r.running()


def test_redis_pause_resume(tmpdir):
    r = harness.Redis(tmpdir)
    r.cmd("SET", "k", "v")
    with r.client() as kept:
        r.pause()
        assert r.paused and r.running()
        t0 = time.monotonic()
        for fn in (lambda: kept.cmd("GET", "k", timeout=0.3), lambda: r.cmd("GET", "k", timeout=0.3)):
            try:
                fn()
            except TimeoutError:
                pass
            else:
                raise AssertionError("a paused Redis answered")
        assert_between(time.monotonic() - t0, 0.5, 30)  # never early; above, a hang detector
        r.resume()
        assert not r.paused
        assert_eq(r.cmd("GET", "k"), "v")
        # the kept connection's late reply to its timed-out GET comes first
        kept.sock.settimeout(5)
        assert_eq(kept.reply(), "v")
        assert_eq(kept.cmd("GET", "k"), "v")
    # stop() resumes a paused Redis so that SIGTERM ends it
    r.pause()
    t0 = time.monotonic()
    assert_eq(r.stop(), 0)
    assert time.monotonic() - t0 < 30  # a hang detector (the exit code is the check)


def test_redis_restart_kill_empty(tmpdir):
    r = harness.Redis(tmpdir)
    port, sock, pid = r.port, r.sock_path, r.pid
    r.cmd("SET", "a", "1")
    r.restart()
    assert_eq((r.port, r.sock_path), (port, sock))
    assert r.pid != pid
    assert_eq(r.cmd("GET", "a"), None)
    assert_eq(r.cmd("DBSIZE"), 0)
    r.cmd("SET", "b", "2")
    assert_eq(r.kill(), -signal.SIGKILL)
    assert not r.running()
    try:
        r.cmd("PING", timeout=1)
    except OSError:
        pass
    else:
        raise AssertionError("a killed Redis answered")
    r.restart()  # from killed
    assert_eq((r.port, r.sock_path), (port, sock))
    assert_eq(r.keys(), [])
    with harness.RedisConnection(("127.0.0.1", port)) as c:
        assert_eq(c.cmd("PING"), "PONG")
    assert_eq(r.starts, 3)


def test_redis_password(tmpdir):
    r = harness.Redis(tmpdir, password="pa ss:1")
    assert_eq(r.cmd("PING"), "PONG")
    assert_eq(r.cmd("CONFIG", "GET", "requirepass"), ["requirepass", "pa ss:1"])
    for addr in (r.sock_path, ("127.0.0.1", r.port)):
        with harness.RedisConnection(addr) as c:
            try:
                c.cmd("GET", "x")
            except harness.RedisError as e:
                assert_in("NOAUTH", str(e))
            else:
                raise AssertionError("no NOAUTH")
    try:
        harness.RedisConnection(r.sock_path, password="wrong")
    except harness.RedisError as e:
        assert_in("WRONGPASS", str(e))
    else:
        raise AssertionError("no WRONGPASS")
    path = r.password_file()
    assert_eq(path, os.path.join(tmpdir, "redis.password"))
    assert_eq(stat.S_IMODE(os.stat(path).st_mode), 0o600)
    assert_eq(open(path).read(), "pa ss:1\n")
    r.restart()
    assert_eq(r.cmd("PING"), "PONG")
    try:
        harness.Redis(tmpdir, name="nopw").password_file()
    except AssertionError as e:
        assert_in("no password", str(e))
    else:
        raise AssertionError("a password file without a password")


def test_redis_two_side_by_side(tmpdir):
    a, b = harness.Redis(tmpdir, name="ra"), harness.Redis(tmpdir, name="rb")
    assert a.port != b.port and a.sock_path != b.sock_path
    a.cmd("SET", "only", "a")
    assert_eq(b.keys(), [])


def test_redis_paused_is_killed_at_cleanup(tmpdir):
    """A test that ends with its Redis paused: cleaned up at once (SIGCONT
    with the SIGTERM), not after the SIGKILL grace."""
    pidfile = os.path.join(tmpdir, "pid")
    p = run_pytest(tmpdir, "import os\n"
                           "def test_paused(tmpdir):\n"
                           "    r = harness.Redis(tmpdir)\n"
                           "    open(%r, 'w').write(str(r.pid))\n"
                           "    r.pause()\n"
                           "def test_then_gone():\n"
                           "    try:\n"
                           "        os.kill(int(open(%r).read()), 0)\n"
                           "    except ProcessLookupError:\n"
                           "        return\n"
                           "    raise AssertionError('redis-server still runs after its test')\n" % (pidfile, pidfile))
    assert_eq(p.returncode, 0, p.stdout + p.stderr)
    m = __import__("re").search(r"([\d.]+)s teardown +t_fixtures.py::test_paused", p.stdout)
    assert m, p.stdout
    assert float(m.group(1)) < 2.5, "cleanup waited for the SIGKILL grace: " + p.stdout
    pid = int(open(pidfile).read())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        pass
    else:
        raise AssertionError("redis-server %d still runs" % pid)


def test_redis_missing_skips_unless_required(tmpdir):
    missing = os.path.join(tmpdir, "no-redis-server")
    try:
        harness.redis_server_or_skip(missing, env={})
    except harness.Skip as e:
        assert_in("not installed", str(e))
    else:
        raise AssertionError("no Skip")
    try:
        harness.redis_server_or_skip(missing, env={"KEMBALI_REQUIRE_SERVERS": "1"})
    except harness.Skip:
        raise AssertionError("Skip although KEMBALI_REQUIRE_SERVERS=1") from None
    except AssertionError as e:
        assert_in("KEMBALI_REQUIRE_SERVERS=1", str(e))
    else:
        raise AssertionError("no failure")
    try:
        harness.Redis(tmpdir, bin=missing)
    except (harness.Skip, AssertionError) as e:
        assert_in("no-redis-server", str(e))
    else:
        raise AssertionError("started a missing redis-server")


def test_redis_start_hosts(tmpdir):
    import kit
    r = harness.Redis(tmpdir, password="pw")
    sb = harness.Sandbox(tmpdir, bin=fake_bin(tmpdir, "sandbox"))
    sb2, hosts = kit.start_hosts(tmpdir, 3, r, sb=sb, bin=fake_bin(tmpdir, "kembali"), top={"redis_prefix": "t:"})
    assert sb2 is sb
    assert_eq([k.name for k in hosts], ["h0", "h1", "h2"])
    cfgs = [json.load(open(k.config_path)) for k in hosts]
    assert_eq([c["redis"] for c in cfgs], [r.url()] * 3)
    assert_eq([c["redis_password_file"] for c in cfgs], [r.password_file()] * 3)
    assert_eq([c["redis_prefix"] for c in cfgs], ["t:"] * 3)
    assert_eq([c["schedule_ms"] for c in cfgs], [kit.FAST] * 3)
    dirs = [c["state_dir"] for c in cfgs]
    assert_eq(dirs, [os.path.join(tmpdir, "state-h%d" % i) for i in range(3)])
    assert all(os.path.isdir(d) for d in dirs)
    assert_eq(len({k.addr for k in hosts}), 3)
    for k in hosts:
        assert_eq(k.get("id=x").status, 200)
    # a URL instead of a Redis; top overrides
    other = os.path.join(tmpdir, "other")
    os.mkdir(other)
    _, more = kit.start_hosts(other, 1, "unix:///x.sock", sb=sb, bin=fake_bin(tmpdir, "kembali"),
                              top={"state_dir": os.path.join(other, "mine")}, schedule=None)
    cfg = json.load(open(more[0].config_path))
    assert_eq((cfg["redis"], cfg["state_dir"]), ("unix:///x.sock", os.path.join(other, "mine")))
    assert "redis_password_file" not in cfg and "schedule_ms" not in cfg


# ---------------------------------------------------------------------------
# Stand-ins: this file as a fake kembali or a fake sandbox
# ---------------------------------------------------------------------------

def _log(**kv):
    parts = []
    for k, v in kv.items():
        v = str(v)
        if v == "" or any(c in v for c in ' "\\\n='):
            v = '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
        parts.append("%s=%s" % (k, v))
    sys.stderr.write(" ".join(parts) + "\n")
    sys.stderr.flush()


def fake_kembali(argv):
    opts, i = {}, 0
    while i < len(argv):
        if argv[i] in ("--config", "--listen"):
            opts[argv[i]] = argv[i + 1]
            i += 2
        else:
            opts[argv[i]] = True
            i += 1
    _log(level="info", event="argv", argv=" ".join(argv))
    if "--exit" in opts:
        _log(level="error", msg="exiting as asked")
        sys.exit(3)

    def load():
        with open(opts["--config"]) as f:
            return json.load(f)

    if "--check-config" in opts:
        try:
            load()
        except ValueError as e:
            print("%s: not JSON: %s" % (opts["--config"], e))
            sys.exit(1)
        print("configuration ok")
        sys.exit(0)
    config = load()
    if "--listen" in opts:
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(opts["--listen"])
        lsock.listen(64)
    else:
        lsock = socket.socket(fileno=os.dup(0))
    stop = threading.Event()
    count = [0]
    signal.signal(signal.SIGTERM, lambda *a: stop.set())

    def hup(*a):
        schedule = ",".join(str(x) for x in load().get("schedule_ms", []))
        _log(level="info", event="reload", schedule=schedule)
    signal.signal(signal.SIGHUP, hup)
    _log(level="info", event="start", listen=opts.get("--listen", "fd0"), shops=len(config["shops"]))

    def serve(conn):
        with conn:
            try:
                _, params, _, _ = read_request(conn)
            except EOFError:
                return
            count[0] += 1
            q = dict(kv.partition("=")[::2] for kv in params.get("QUERY_STRING", "").split("&") if kv)
            if q.get("format") == "metrics":
                out = (b"Content-Type: text/plain\r\n\r\n# TYPE kembali_requests_total counter\n"
                       b"kembali_requests_total %d\n" % count[0])
            else:
                _log(level="info", event="request", id=q.get("id", ""), shop=params.get("KEMBALI_SHOP", "-"),
                     msg='asked "%s"' % q.get("id", ""))
                body = json.dumps({"id": q.get("id", ""), "status": "unknown", "final": False}).encode()
                out = (b"Status: 200 OK\r\nContent-Type: application/json\r\nKembali-Status: checking\r\n"
                       b"X-Pid: %d\r\n\r\n" % os.getpid()) + body
            conn.sendall(_rec(6, out) + _rec(6) + _rec(3, struct.pack(">IB3x", 0, 0)))

    lsock.settimeout(0.1)
    while not stop.is_set():
        try:
            conn, _ = lsock.accept()
        except (socket.timeout, InterruptedError):
            continue
        conn.settimeout(None)
        threading.Thread(target=serve, args=(conn,), daemon=True).start()
    _log(level="info", event="stop")
    sys.exit(0)


def fake_sandbox(argv):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    if "--exit" in argv:
        sys.stderr.write("exiting as asked\n")
        sys.exit(2)
    keys = {argv[i + 1] for i, a in enumerate(argv) if a == "--key"}
    txs, reads = {}, []

    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def answer(self, code, obj=None):
            body = json.dumps(obj).encode() if obj is not None else b""
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def body(self):
            n = int(self.headers.get("Content-Length") or 0)
            return json.loads(self.rfile.read(n)) if n else None

        def do_GET(self):
            path, _, query = self.path.partition("?")
            if path == "/_sandbox/reads":
                want = query.partition("id=")[2] if query else None
                return self.answer(200, [r for r in reads if want is None or r["id"] == want])
            if path == "/_sandbox/stats":
                return self.answer(200, {"argv": argv, "keys": sorted(keys), "transactions": txs})
            if path.startswith("/v1/transactions/"):
                tx = path.rsplit("/", 1)[1]
                reads.append({"id": tx})
                if self.headers.get("Authorization", "")[7:] not in keys:
                    return self.answer(401, {"error": {"code": "unauthorized"}})
                if tx not in txs:
                    return self.answer(404, {"error": {"code": "not_found"}})
                return self.answer(200, {"id": tx, "status": txs[tx]["timeline"][0]["status"]})
            self.answer(404)

        def do_PUT(self):
            if self.path.startswith("/_sandbox/transactions/"):
                txs[self.path.rsplit("/", 1)[1]] = self.body()
                return self.answer(200, {"ok": True})
            self.answer(404)

        def do_POST(self):
            if self.path == "/_sandbox/reset":
                txs.clear()
                reads.clear()
                return self.answer(200, {"ok": True})
            if self.path == "/_sandbox/keys":
                keys.add(self.body()["key"])
                return self.answer(200, {"ok": True})
            self.answer(404)

        def do_DELETE(self):
            k = self.path.rsplit("/", 1)[1]
            if self.path.startswith("/_sandbox/keys/") and k in keys:
                keys.discard(k)
                return self.answer(204)
            self.answer(404, {"error": "no such key"})

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    signal.signal(signal.SIGTERM, lambda *a: threading.Thread(target=srv.shutdown).start())
    sys.stderr.write("sandbox started\n")
    sys.stderr.flush()
    print("listening port=%d" % srv.server_address[1], flush=True)
    srv.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--fake-kembali":
        fake_kembali(sys.argv[2:])
    elif len(sys.argv) > 1 and sys.argv[1] == "--fake-sandbox":
        fake_sandbox(sys.argv[2:])
    else:
        harness.run(globals())
