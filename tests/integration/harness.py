"""Integration-test harness for kembali (Python 3.11 standard library only).

What is here, top to bottom:

- a FastCGI 1.0 client: ``fcgi_request`` (and ``fcgi_send``/``fcgi_receive``
  for tests that hold a connection open), ``get`` for the usual CGI params,
  and ``Response``;
- ``Sandbox``: the Kasera stand-in (tests/sandbox/kasera-sandbox) and its
  control API;
- ``Kembali``: the program under test on a Unix socket in the test's tmpdir,
  its key files, configuration and ``key=value`` log; ``make_config``,
  ``make_shop``;
- ``Nginx``: a throwaway nginx in front of a FastCGI socket;
- ``Redis``: a private redis-server (its own Unix socket and TCP port, never
  6379, no persistence) and ``RedisConnection``, a small RESP client;
- ``chromium_dump_dom`` and ``chromium_screenshot``;
- assertion helpers: ``assert_eq``, ``assert_between``, ``assert_in``,
  ``wait_for``;
- a small parallel test runner: ``run(globals())``, ``Skip``, ``timeout``.

A test file looks like::

    import harness
    from harness import assert_eq

    def test_invalid_id(tmpdir):
        with harness.Sandbox(tmpdir) as sb, harness.Kembali(tmpdir, ...) as k:
            r = k.get("id=%00")
            assert_eq(r.status, 400)

    if __name__ == "__main__":
        harness.run(globals())

Every process started through this module is tracked and killed when the test
that started it ends, whether it passed or not.

Environment: ``top_builddir``, ``top_srcdir`` (default: the repository root
two levels above this file), ``KEMBALI_BIN``, ``SANDBOX_BIN``,
``KEMBALI_REQUIRE_CHROMIUM=1`` (a missing chromium fails instead of skipping),
``KEMBALI_REQUIRE_SERVERS=1`` (so does a missing redis-server or promtool), ``REDIS_SERVER``, ``PROMTOOL``,
``HARNESS_JOBS`` (parallel workers), ``HARNESS_TIMEOUT_SCALE`` (multiplies
every per-test timeout, for slow sanitizer builds). Command-line arguments of
``run`` select tests whose name contains any of them.
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.parse
import urllib.request
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))

DEFAULT_KEY = "sk_test_kembali_0000000000000001"


def top_builddir() -> str:
    """The build tree's top (env ``top_builddir``, relative to the cwd)."""
    return os.path.abspath(os.environ.get("top_builddir") or REPO_ROOT)


def top_srcdir() -> str:
    """The source tree's top (env ``top_srcdir``, relative to the cwd)."""
    return os.path.abspath(os.environ.get("top_srcdir") or REPO_ROOT)


def kembali_bin() -> str:
    return os.environ.get("KEMBALI_BIN") or os.path.join(top_builddir(), "src", "kembali")


def sandbox_bin() -> str:
    return os.environ.get("SANDBOX_BIN") or os.path.join(
        top_builddir(), "tests", "sandbox", "kasera-sandbox")


try:
    import pytest
    Skip = pytest.skip.Exception  # raise Skip("why") in a test: pytest reports it skipped
except ImportError:  # the scripts that are not tests (tests/soak, tests/bench) run without pytest
    pytest = None

    class Skip(Exception):
        """A missing program, for a script that is not run by pytest."""


# ---------------------------------------------------------------------------
# FastCGI client
# ---------------------------------------------------------------------------

FCGI_VERSION_1 = 1
FCGI_BEGIN_REQUEST = 1
FCGI_ABORT_REQUEST = 2
FCGI_END_REQUEST = 3
FCGI_PARAMS = 4
FCGI_STDIN = 5
FCGI_STDOUT = 6
FCGI_STDERR = 7
FCGI_DATA = 8
FCGI_GET_VALUES = 9
FCGI_GET_VALUES_RESULT = 10
FCGI_UNKNOWN_TYPE = 11
FCGI_RESPONDER = 1
FCGI_KEEP_CONN = 1
FCGI_MAX_CONTENT = 65535

PROTOCOL_STATUS = {0: "FCGI_REQUEST_COMPLETE", 1: "FCGI_CANT_MPX_CONN",
                   2: "FCGI_OVERLOADED", 3: "FCGI_UNKNOWN_ROLE"}

_HEADER = struct.Struct(">BBHHBB")


class FcgiError(Exception):
    """The FastCGI exchange failed (connection refused or closed early, bad record)."""


class FcgiTimeout(FcgiError, TimeoutError):
    """No FCGI_END_REQUEST within the timeout."""


def fcgi_record(rtype: int, content: bytes = b"", request_id: int = 1) -> bytes:
    """One record, padded to a multiple of 8 bytes (content <= 65535 bytes)."""
    if len(content) > FCGI_MAX_CONTENT:
        raise ValueError("FastCGI record content longer than 65535 bytes")
    pad = (-len(content)) % 8
    return _HEADER.pack(FCGI_VERSION_1, rtype, request_id, len(content), pad, 0) + content + b"\0" * pad


def _to_bytes(v) -> bytes:
    if isinstance(v, bytes):
        return v
    return str(v).encode("utf-8", "surrogateescape")


def _enc_len(n: int) -> bytes:
    if n < 128:
        return bytes([n])
    if n > 0x7FFFFFFF:
        raise ValueError("FastCGI name or value too long")
    return struct.pack(">I", n | 0x80000000)


def fcgi_encode_pair(name, value) -> bytes:
    """A name-value pair (1-byte lengths below 128, else the 4-byte form)."""
    n, v = _to_bytes(name), _to_bytes(value)
    return _enc_len(len(n)) + _enc_len(len(v)) + n + v


def _stream_records(rtype: int, data: bytes, request_id: int) -> list[bytes]:
    return [fcgi_record(rtype, data[i:i + FCGI_MAX_CONTENT], request_id)
            for i in range(0, len(data), FCGI_MAX_CONTENT)]


def fcgi_params_records(params: dict, request_id: int = 1) -> bytes:
    """FCGI_PARAMS records holding ``params`` (whole pairs per record where a
    pair fits in one), then the empty FCGI_PARAMS that ends the stream.
    A value of None leaves the name out."""
    out: list[bytes] = []
    buf = b""
    for name, value in params.items():
        if value is None:
            continue
        pair = fcgi_encode_pair(name, value)
        if len(buf) + len(pair) > FCGI_MAX_CONTENT and buf:
            out.append(fcgi_record(FCGI_PARAMS, buf, request_id))
            buf = b""
        if len(pair) > FCGI_MAX_CONTENT:
            out.extend(_stream_records(FCGI_PARAMS, pair, request_id))
        else:
            buf += pair
    if buf:
        out.append(fcgi_record(FCGI_PARAMS, buf, request_id))
    out.append(fcgi_record(FCGI_PARAMS, b"", request_id))
    return b"".join(out)


def fcgi_request_bytes(params: dict, stdin: bytes = b"", request_id: int = 1,
                       keep_conn: bool = False) -> bytes:
    """The whole client side of one responder request."""
    begin = struct.pack(">HB5x", FCGI_RESPONDER, FCGI_KEEP_CONN if keep_conn else 0)
    parts = [fcgi_record(FCGI_BEGIN_REQUEST, begin, request_id),
             fcgi_params_records(params, request_id)]
    parts.extend(_stream_records(FCGI_STDIN, stdin, request_id))
    parts.append(fcgi_record(FCGI_STDIN, b"", request_id))
    return b"".join(parts)


def _addr_str(addr) -> str:
    return addr if isinstance(addr, str) else "%s:%s" % tuple(addr)


def fcgi_connect(addr, timeout: float = 10.0) -> socket.socket:
    """A connected socket: ``addr`` is a Unix socket path or (host, port)."""
    if isinstance(addr, (str, bytes, os.PathLike)):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    else:
        s = socket.socket(socket.AF_INET6 if ":" in addr[0] else socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(addr if not isinstance(addr, list) else tuple(addr))
    except OSError as e:
        s.close()
        raise FcgiError("cannot connect to FastCGI at %s: %s" % (_addr_str(addr), e)) from e
    return s


class Response:
    """A parsed CGI response from a FastCGI exchange.

    status (int), reason (str), headers (lowercase name -> list of values),
    header(name), body (bytes), text (str), json(), stderr (bytes),
    stdout (the raw FCGI_STDOUT stream), elapsed (s), app_status,
    protocol_status, headers_complete (False if no blank line ended them).
    """

    def __init__(self, stdout: bytes, stderr: bytes, app_status: int,
                 protocol_status: int, elapsed: float):
        self.stdout = stdout
        self.stderr = stderr
        self.app_status = app_status
        self.protocol_status = protocol_status
        self.elapsed = elapsed
        self.headers: dict[str, list[str]] = {}
        self.header_lines: list[str] = []
        self.headers_complete = False
        pos = 0
        body = b""
        while True:
            nl = stdout.find(b"\n", pos)
            if nl < 0:
                rest = stdout[pos:]
                if rest:
                    self.header_lines.append(rest.decode("latin-1"))
                break
            line = stdout[pos:nl]
            if line.endswith(b"\r"):
                line = line[:-1]
            pos = nl + 1
            if not line:
                self.headers_complete = True
                body = stdout[pos:]
                break
            self.header_lines.append(line.decode("latin-1"))
        for line in self.header_lines:
            name, sep, value = line.partition(":")
            if sep:
                self.headers.setdefault(name.strip().lower(), []).append(value.strip())
        self.body = body
        self.status = 200
        self.reason = "OK"
        st = self.header("status")
        if st is not None:
            code, _, reason = st.partition(" ")
            try:
                self.status = int(code)
            except ValueError:
                raise FcgiError("malformed Status header %r" % st) from None
            self.reason = reason.strip()

    def header(self, name: str, default=None):
        """The first value of header ``name`` (any case), or ``default``."""
        values = self.headers.get(name.lower())
        return values[0] if values else default

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self):
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise AssertionError("response body is not JSON (%s): %r" % (e, self)) from None

    def __repr__(self):
        body = self.body if len(self.body) <= 600 else self.body[:600] + b"..."
        extra = " stderr=%r" % self.stderr[:300] if self.stderr else ""
        return "<Response %d headers=%r body=%r elapsed=%.3fs app_status=%d%s>" % (
            self.status, self.headers, body, self.elapsed, self.app_status, extra)


# socket -> the OSError from sending it, for fcgi_receive's message (weak
# keys: keyed by the socket object, not its descriptor number, which another
# thread's new socket may reuse)
_send_errors = weakref.WeakKeyDictionary()


def fcgi_send(addr, params: dict, stdin: bytes = b"", timeout: float = 60.0,
              request_id: int = 1) -> socket.socket:
    """Connect and send a whole request; returns the socket to read from
    (with ``fcgi_receive``) or to close early (a client that goes away)."""
    s = fcgi_connect(addr, timeout=min(timeout, 10.0))
    s.settimeout(timeout)
    try:
        s.sendall(fcgi_request_bytes(params, stdin, request_id))
    except socket.timeout as e:
        s.close()
        raise FcgiTimeout("timed out sending the request to %s" % _addr_str(addr)) from e
    except OSError as e:
        # The application may have answered and closed early; let
        # fcgi_receive read what it sent.
        _send_errors[s] = e
    return s


def fcgi_receive(s: socket.socket, timeout: float = 60.0, started: float | None = None,
                 request_id: int = 1, close: bool = True) -> Response:
    """Read records until FCGI_END_REQUEST; raise FcgiError if the connection
    closes first, FcgiTimeout if ``timeout`` passes first (counted from
    ``started``, by default now)."""
    if started is None:
        started = time.monotonic()
    deadline = started + timeout
    stdout, stderr = [], []
    buf = b""
    send_err = _send_errors.pop(s, None)

    def fail(msg, cls=FcgiError):
        got = b"".join(stdout)
        detail = "%s (after %.3f s; %d stdout bytes so far: %r; stderr: %r%s)" % (
            msg, time.monotonic() - started, len(got), got[:300], b"".join(stderr)[:300],
            "; sending had failed: %s" % send_err if send_err else "")
        return cls(detail)

    def need(n):
        nonlocal buf
        while len(buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise fail("no FCGI_END_REQUEST within %.1f s" % timeout, FcgiTimeout)
            s.settimeout(left)
            try:
                chunk = s.recv(max(65536, n - len(buf)))
            except socket.timeout:
                raise fail("no FCGI_END_REQUEST within %.1f s" % timeout, FcgiTimeout) from None
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise fail("connection closed before FCGI_END_REQUEST")
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out

    try:
        while True:
            version, rtype, rid, clen, plen, _ = _HEADER.unpack(need(8))
            if version != FCGI_VERSION_1:
                raise fail("record with FastCGI version %d" % version)
            content = need(clen + plen)[:clen]
            if rtype == FCGI_STDOUT and rid == request_id:
                stdout.append(content)
            elif rtype == FCGI_STDERR and rid == request_id:
                stderr.append(content)
            elif rtype == FCGI_END_REQUEST and rid == request_id:
                if clen < 5:
                    raise fail("short FCGI_END_REQUEST body")
                app_status, proto = struct.unpack(">IB", content[:5])
                return Response(b"".join(stdout), b"".join(stderr), app_status, proto,
                                time.monotonic() - started)
            # Anything else (FCGI_UNKNOWN_TYPE, another request id) is ignored.
    finally:
        if close:
            s.close()


def fcgi_request(addr, params: dict, stdin: bytes = b"", timeout: float = 60.0) -> Response:
    """One FastCGI responder request (request id 1, no keep-conn)."""
    started = time.monotonic()
    s = fcgi_send(addr, params, stdin, timeout)
    return fcgi_receive(s, timeout, started)


def cgi_params(query: str = "", method: str = "GET", accept: str | None = None,
               host: str | None = "shop.test", extra: dict | None = None,
               path: str = "/kembali", stdin: bytes = b"") -> dict:
    """The CGI params a web server would send; ``extra`` adds or overrides
    (a value of None removes a param)."""
    params = {
        "REQUEST_METHOD": method,
        "QUERY_STRING": query,
        "REQUEST_URI": path + ("?" + query if query else ""),
        "SCRIPT_NAME": path,
        "DOCUMENT_URI": path,
        "SERVER_NAME": host or "localhost",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "GATEWAY_INTERFACE": "CGI/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "REMOTE_PORT": "54321",
    }
    if host is not None:
        params["HTTP_HOST"] = host
    if accept is not None:
        params["HTTP_ACCEPT"] = accept
    if stdin:
        params["CONTENT_LENGTH"] = str(len(stdin))
    if extra:
        params.update(extra)
    return {k: v for k, v in params.items() if v is not None}


def get(addr, query: str = "", method: str = "GET", accept: str | None = None,
        host: str | None = "shop.test", extra: dict | None = None, **kw) -> Response:
    """A request with the usual CGI params (see ``cgi_params``); ``kw`` goes
    to ``fcgi_request`` (stdin, timeout) or ``cgi_params`` (path)."""
    path = kw.pop("path", "/kembali")
    params = cgi_params(query, method, accept, host, extra, path, kw.get("stdin", b""))
    return fcgi_request(addr, params, **kw)


# ---------------------------------------------------------------------------
# Process tracking (every process a test starts is killed when it ends)
# ---------------------------------------------------------------------------

class TestContext:
    """What one test started: its processes (killed when it ends), cleanups
    (run then) and final checks (run when it passed; they may fail it).
    tests/integration/conftest.py makes one per test."""

    def __init__(self, name: str, tmpdir: str):
        self.name = name
        self.tmpdir = tmpdir
        self.procs: list[subprocess.Popen] = []
        self.cleanups: list = []  # callables run when the test ends
        self.checks: list = []    # callables run when the test passed; may fail it
        self.lock = threading.Lock()


# The running test's context: pytest runs one test at a time in a process
# (pytest-xdist: one per worker process), and threads a test starts share it.
_current: list[TestContext] = []
_all_procs: list[subprocess.Popen] = []
_registry_lock = threading.Lock()


def current_test() -> TestContext | None:
    return _current[-1] if _current else None


def begin_test(ctx: TestContext) -> None:
    """Make ``ctx`` the running test's (conftest.py, at its setup)."""
    _current.append(ctx)


def end_test(ctx: TestContext) -> None:
    """Kill what the test started and run its cleanups (conftest.py, at its teardown)."""
    if ctx in _current:
        _current.remove(ctx)
    with ctx.lock:
        procs = list(ctx.procs)
    _kill_all(procs)
    for cleanup in ctx.cleanups:
        try:
            cleanup()
        except Exception:
            traceback.print_exc()


def current_tmpdir() -> str | None:
    """The running test's tmpdir (None outside a test)."""
    ctx = current_test()
    return ctx.tmpdir if ctx else None


def _tmpdir_or_new(tmpdir: str | None) -> str:
    if tmpdir:
        return tmpdir
    t = current_tmpdir()
    if t:
        return t
    t = tempfile.mkdtemp(prefix="kb-")
    atexit.register(shutil.rmtree, t, True)
    return t


def _track(proc: subprocess.Popen, tmpdir: str | None = None) -> None:
    ctx = current_test()
    with _registry_lock:
        _all_procs.append(proc)
    if ctx is not None:
        with ctx.lock:
            ctx.procs.append(proc)


def spawn(argv: list[str], tmpdir: str | None = None, **popen_kw) -> subprocess.Popen:
    """Popen in a new session (so its whole process group can be killed),
    tracked for the running test."""
    popen_kw.setdefault("stdin", subprocess.DEVNULL)
    for attempt in range(50):
        try:
            proc = subprocess.Popen(argv, start_new_session=True, **popen_kw)
            break
        except OSError as e:
            # ETXTBSY: a script just written by one test thread can still be
            # open in a child another thread forked before its exec; retry.
            if e.errno != 26 or attempt == 49:
                raise
            time.sleep(0.02)
    _track(proc, tmpdir)
    return proc


def kill_process(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM to the process group, SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        # SIGCONT after SIGTERM: a stopped process (Redis.pause) acts on it at once
        for s in (sig, signal.SIGCONT) if sig == signal.SIGTERM else (sig,):
            try:
                os.killpg(proc.pid, s)
            except ProcessLookupError:
                pass
            except PermissionError:
                try:
                    proc.send_signal(s)
                except ProcessLookupError:
                    pass
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _kill_all(procs) -> None:
    running = [p for p in procs if p.poll() is None]
    threads = [threading.Thread(target=kill_process, args=(p,)) for p in running]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


atexit.register(lambda: _kill_all(list(_all_procs)))


# ---------------------------------------------------------------------------
# Sandbox: the Kasera stand-in
# ---------------------------------------------------------------------------

def _read_line(fd: int, timeout: float, proc: subprocess.Popen) -> bytes | None:
    """The first line from ``fd`` within ``timeout`` (None if the process
    exits or the time passes first)."""
    deadline = time.monotonic() + timeout
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        r, _, _ = select.select([fd], [], [], min(left, 0.1))
        if r:
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            data += chunk
        elif proc.poll() is not None:
            return None
    return data


def _tail(path: str, limit: int = 6000) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return "(no log: %s)" % e
    if len(data) > limit:
        data = b"...\n" + data[-limit:]
    return data.decode("utf-8", "replace")


class SandboxError(AssertionError):
    """The sandbox's control API answered with an error."""


class Sandbox:
    """The Kasera stand-in. Started at construction (``start=False`` to delay).

    Arguments default to ``--key K`` for each key in ``keys``. stderr goes to
    ``<tmpdir>/<name>.log``, stdout past the first line to ``<name>.out``.
    """

    def __init__(self, tmpdir: str, keys=(DEFAULT_KEY,), args: list[str] | None = None,
                 env: dict | None = None, bin: str | None = None, start: bool = True,
                 name: str = "sandbox"):
        self.tmpdir = tmpdir
        self.keys = list(keys)
        self.args = list(args) if args is not None else [a for k in self.keys for a in ("--key", k)]
        self.env = env
        self.bin = bin or sandbox_bin()
        self.log_path = os.path.join(tmpdir, name + ".log")
        self.out_path = os.path.join(tmpdir, name + ".out")
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.base: str | None = None
        if start:
            self.start()

    def start(self, timeout: float = 10.0) -> "Sandbox":
        if not os.path.exists(self.bin):
            raise AssertionError("sandbox binary %s does not exist (build it, or set SANDBOX_BIN)" % self.bin)
        env = _merge_env(self.env)
        with open(self.log_path, "ab") as log:
            self.proc = spawn([self.bin] + self.args, self.tmpdir, stdout=subprocess.PIPE,
                              stderr=log, env=env)
        line = _read_line(self.proc.stdout.fileno(), timeout, self.proc)
        m = re.search(rb"listening port=(\d+)", line or b"")
        if not m:
            kill_process(self.proc)
            raise AssertionError("sandbox did not print 'listening port=N' within %.0f s "
                                 "(first line %r, exit %r); log:\n%s"
                                 % (timeout, line, self.proc.returncode, _tail(self.log_path)))
        self.port = int(m.group(1))
        self.base = "http://127.0.0.1:%d" % self.port
        rest = line[line.index(b"\n") + 1:]
        threading.Thread(target=_drain, args=(self.proc.stdout, self.out_path, rest),
                         daemon=True).start()
        return self

    # -- control API ------------------------------------------------------
    def control(self, method: str, path: str, body=None, timeout: float = 10.0):
        """One control request; returns the parsed JSON answer (or None/str)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raise SandboxError("sandbox %s %s -> %d: %s" % (
                method, path, e.code, e.read().decode("utf-8", "replace"))) from None
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def put_tx(self, id: str, timeline=None, responses=None, **more):
        """PUT /_sandbox/transactions/{id}. ``timeline``: a list of
        {"after_ms", "status"} (or (after_ms, status) pairs), or a plain status
        string meaning [{"after_ms": 0, "status": s}]. Keys left None are not sent."""
        if isinstance(timeline, str):
            timeline = [{"after_ms": 0, "status": timeline}]
        elif timeline is not None:
            timeline = [{"after_ms": t[0], "status": t[1]} if isinstance(t, (tuple, list)) else t
                        for t in timeline]
        body = dict(more)
        if timeline is not None:
            body["timeline"] = timeline
        if responses is not None:
            body["responses"] = responses
        return self.control("PUT", "/_sandbox/transactions/" + urllib.parse.quote(id, safe=""), body)

    def reads(self, id: str | None = None) -> list:
        """GET /_sandbox/reads[?id=]: the reads the sandbox received."""
        path = "/_sandbox/reads"
        if id is not None:
            path += "?" + urllib.parse.urlencode({"id": id})
        got = self.control("GET", path)
        if isinstance(got, dict) and "reads" in got:
            got = got["reads"]
        return got or []

    def stats(self) -> dict:
        return self.control("GET", "/_sandbox/stats") or {}

    def reset(self):
        return self.control("POST", "/_sandbox/reset", {})

    def add_key(self, key: str):
        return self.control("POST", "/_sandbox/keys", {"key": key})

    def remove_key(self, key: str):
        return self.control("DELETE", "/_sandbox/keys/" + urllib.parse.quote(key, safe=""))

    def chaos(self, seed: int, rate: float = 1.0, kinds=None, hang_ms=None, pad_bytes=None):
        """PUT /_sandbox/chaos: seeded random faults (``kinds``: a list, or
        {kind: weight}; None = every kind). Keys left None are not sent."""
        body = {"seed": seed, "rate": rate}
        for name, v in (("kinds", kinds), ("hang_ms", hang_ms), ("pad_bytes", pad_bytes)):
            if v is not None:
                body[name] = v
        return self.control("PUT", "/_sandbox/chaos", body)

    def chaos_off(self):
        return self.control("DELETE", "/_sandbox/chaos")

    def force_fault(self, kind: str, key_tail: str | None = None):
        """POST /_sandbox/chaos/force: one fault of ``kind`` for the next read
        (with that key tail, when given)."""
        body = {"kind": kind}
        if key_tail is not None:
            body["key_tail"] = key_tail
        return self.control("POST", "/_sandbox/chaos/force", body)

    def outage(self, ms: int):
        """POST /_sandbox/outage: the API is down for ``ms`` (refusing
        connections, the control API's too), then back with its state."""
        return self.control("POST", "/_sandbox/outage", {"ms": ms})

    def log_text(self) -> str:
        return _tail(self.log_path, 1 << 30)

    # -- lifetime -----------------------------------------------------------
    def stop(self, timeout: float = 10.0):
        """SIGTERM, wait (SIGKILL after ``timeout``); returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_process(self.proc, 0)
        return self.proc.returncode

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


def _drain(stream, path: str, first: bytes = b"") -> None:
    with open(path, "ab") as out:
        if first:
            out.write(first)
            out.flush()
        while True:
            chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.read(65536)
            if not chunk:
                break
            out.write(chunk)
            out.flush()
    stream.close()


def _merge_env(env: dict | None) -> dict:
    merged = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = str(v)
    return merged


# ---------------------------------------------------------------------------
# Log lines: key=value pairs, values optionally "double quoted \"escaped\""
# ---------------------------------------------------------------------------

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "0": "\0"}


def parse_log_line(line: str) -> dict:
    """``a=1 msg="x \\"y\\"" b=`` -> {"a": "1", "msg": 'x "y"', "b": "", "_raw": line}.
    Bare words without ``=`` are ignored; ``\\xHH`` and ``\\uHHHH`` escapes are decoded."""
    out: dict = {"_raw": line}
    i, n = 0, len(line)
    while i < n:
        while i < n and line[i].isspace():
            i += 1
        start = i
        while i < n and not line[i].isspace() and line[i] != "=":
            i += 1
        key = line[start:i]
        if i >= n or line[i] != "=":
            continue  # a bare word
        i += 1
        if i < n and line[i] == '"':
            i += 1
            val = []
            while i < n and line[i] != '"':
                c = line[i]
                if c == "\\" and i + 1 < n:
                    e = line[i + 1]
                    if e in _ESCAPES:
                        val.append(_ESCAPES[e])
                        i += 2
                        continue
                    width = {"x": 2, "u": 4}.get(e)
                    if width and re.fullmatch(r"[0-9a-fA-F]{%d}" % width, line[i + 2:i + 2 + width]):
                        val.append(chr(int(line[i + 2:i + 2 + width], 16)))
                        i += 2 + width
                        continue
                    val.append(e)
                    i += 2
                    continue
                val.append(c)
                i += 1
            i += 1  # the closing quote (or the end of an unterminated value)
            value = "".join(val)
        else:
            start = i
            while i < n and not line[i].isspace():
                i += 1
            value = line[start:i]
        if key:
            out[key] = value
    return out


def parse_log(text: str) -> list[dict]:
    return [parse_log_line(l) for l in text.splitlines() if l.strip()]


def _matches(d: dict, match: dict) -> bool:
    return all(k in d and d[k] == (v if isinstance(v, str) else str(v)) for k, v in match.items())


def find_lines(text: str, **match) -> list[dict]:
    """The log lines of ``text`` whose given keys have the given values."""
    return [d for d in parse_log(text) if _matches(d, match)]


# ---------------------------------------------------------------------------
# kembali
# ---------------------------------------------------------------------------

_UNIX_PATH_MAX = 107


class Kembali:
    """kembali on a Unix socket in ``tmpdir``.

    config: a dict (written as JSON to ``<tmpdir>/<name>.json``), str/bytes
    (written verbatim), a callable taking this Kembali and returning one of
    those (so it can use ``key_path``; key files are written first), or None
    (no ``--config`` given; ``write_config`` later adds it).
    keys: {name: secret}, each written 0600 to ``key_path(name)``.
    listen: "unix" (``--listen <tmpdir>/<name>.sock``), "fd0" (the harness
    binds that socket and hands it over as fd 0, as spawn-fcgi does; see
    ``listen_socket``), a bound listening ``socket.socket`` to hand over as
    fd 0 (several processes may share one), another string (given verbatim
    to ``--listen``), or None (neither). With a socket handed over as fd 0,
    ``start`` cannot tell when the process is ready (the socket accepts from
    the start; requests wait in its backlog): wait for a log line if it matters.
    log_file: kembali writes its log with ``--log <tmpdir>/<name>.log`` (what
    the log helpers read) and its standard output and error go to
    ``<name>.stderr``.
    """

    def __init__(self, tmpdir: str, config=None, keys: dict | None = None, args=(),
                 env: dict | None = None, bin: str | None = None, listen="unix",
                 name: str = "kembali", log_file: bool = False):
        self.tmpdir = tmpdir
        self.log_file = log_file
        self.stderr_path = os.path.join(tmpdir, name + (".stderr" if log_file else ".log"))
        self.name = name
        self.bin = bin or kembali_bin()
        self.args = list(args)
        self.env = env
        self.umask = -1  # the process's umask (-1: inherited); never os.umask(): tests run side by side
        self.listen = listen
        self.config_path = os.path.join(tmpdir, name + ".json")
        self.log_path = os.path.join(tmpdir, name + ".log")
        self.proc: subprocess.Popen | None = None
        self.listen_socket: socket.socket | None = None
        self.sock_path = socket_path(tmpdir, name + ".sock")
        if isinstance(listen, socket.socket):
            self.addr = listen.getsockname()
        elif listen in ("unix", "fd0"):
            self.addr = self.sock_path
        elif isinstance(listen, str):
            self.addr = listen if listen.startswith("/") else _parse_hostport(listen)
        else:
            self.addr = None
        for kname, secret in (keys or {}).items():
            self.write_key(kname, secret)
        self.has_config = config is not None
        if callable(config):
            config = config(self)
        if config is not None:
            self.write_config(config)

    # -- files ----------------------------------------------------------------
    def key_path(self, name: str) -> str:
        return key_path(self.tmpdir, name)

    def write_key(self, name: str, secret: str) -> str:
        """Write (or replace) a key file, mode 0600; returns its path."""
        return write_secret(self.key_path(name), secret)

    def write_config(self, config) -> str:
        """Replace the configuration file atomically (then ``signal(SIGHUP)``
        to make a running kembali reload it)."""
        write_config_file(self.config_path, config)
        self.has_config = True
        return self.config_path

    def reload(self, config=None) -> None:
        if config is not None:
            self.write_config(config)
        self.signal(signal.SIGHUP)

    # -- lifetime -----------------------------------------------------------
    def argv(self) -> list[str]:
        argv = [self.bin]
        if self.has_config:
            argv += ["--config", self.config_path]
        if self.listen == "unix" or (isinstance(self.listen, str) and self.listen != "fd0"):
            argv += ["--listen", self.addr if isinstance(self.addr, str) else self.listen]
        if self.log_file:
            argv += ["--log", self.log_path]
        return argv + self.args

    def start(self, timeout: float = 10.0) -> "Kembali":
        """Launch and wait until it serves: its socket accepts a connection
        and it has logged ``level=info event=start``, which it does once the
        state is open and its threads run. The socket listens before that, so
        a request sent on connect alone could wait in the backlog through a
        slow (sanitizer) start and skew every time a test measures."""
        if not os.path.exists(self.bin):
            raise AssertionError("kembali binary %s does not exist (build it, or set KEMBALI_BIN)" % self.bin)
        stdin = subprocess.DEVNULL
        if self.listen == "fd0":
            if self.listen_socket is None:
                self.listen_socket = unix_listen_socket(self.sock_path)
            stdin = self.listen_socket.fileno()
        elif isinstance(self.listen, socket.socket):
            stdin = self.listen.fileno()
        starts_before = len(self.find_log(level="info", event="start")) if os.path.exists(self.log_path) else 0
        with open(self.stderr_path, "ab") as log:
            self.proc = spawn(self.argv(), self.tmpdir, stdin=stdin, stdout=log, stderr=log,
                              env=_merge_env(self.env), umask=self.umask)
        ctx = current_test()
        if ctx is not None:
            with ctx.lock:
                ctx.checks.append(self.final_check)
        if self.addr is None:
            return self
        deadline = time.monotonic() + timeout
        accepting = False
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("kembali exited with %s before accepting on %s; log:\n%s"
                                     % (self.proc.returncode, _addr_str(self.addr), _tail(self.log_path)))
            if not accepting:
                try:
                    fcgi_connect(self.addr, timeout=1.0).close()
                    accepting = True
                except FcgiError:
                    pass
            if accepting and len(self.find_log(level="info", event="start")) > starts_before:
                return self
            if time.monotonic() > deadline:
                kill_process(self.proc)
                raise AssertionError("kembali did not serve on %s within %.0f s (accepting, then its start "
                                     "line); log:\n%s" % (_addr_str(self.addr), timeout, _tail(self.log_path)))
            time.sleep(0.02)

    SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                       "WARNING: ThreadSanitizer", "SUMMARY: UndefinedBehaviorSanitizer")

    def final_check(self) -> None:
        """At the end of a passing test: stop the process if it still runs
        (SIGTERM must give exit 0) and fail on any sanitizer report in its log."""
        if self.proc is not None and self.proc.poll() is None:
            rc = self.stop(timeout=15)
            if rc != 0:
                raise AssertionError("%s exited %s after SIGTERM; log:\n%s" % (self.name, rc, _tail(self.log_path)))
        text = self.log_text()
        for mark in self.SANITIZER_MARKS:
            if mark in text:
                raise AssertionError("sanitizer report in %s:\n%s" % (self.log_path, _tail(self.log_path)))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 10.0) -> int:
        """Wait for the process to exit by itself; returns the exit code."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError("kembali still running after %.1f s; log:\n%s"
                                 % (timeout, _tail(self.log_path))) from None

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM and wait; returns the exit code (negative: killed by a
        signal). Raises if it does not exit within ``timeout`` (then it is killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_process(self.proc, 0)
                raise AssertionError("kembali did not exit within %.1f s of SIGTERM; log:\n%s"
                                     % (timeout, _tail(self.log_path))) from None
        return self.proc.returncode

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.stop()
        except AssertionError:
            if exc_type is None:
                raise
        return False

    # -- requests -------------------------------------------------------------
    def get(self, query: str = "", **kw) -> Response:
        return get(self.addr, query, **kw)

    def metrics(self, **kw) -> dict:
        """The Prometheus metrics (KEMBALI_ADMIN=1, format=metrics), parsed."""
        extra = dict(kw.pop("extra", None) or {})
        extra.setdefault("KEMBALI_ADMIN", "1")
        r = self.get("format=metrics", extra=extra, **kw)
        if r.status != 200:
            raise AssertionError("metrics request failed: %r" % r)
        return parse_metrics(r.text)

    # -- log --------------------------------------------------------------
    def log_text(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return ""

    def log_lines(self) -> list[dict]:
        """Every log line as a dict of its key=value pairs (plus "_raw")."""
        return parse_log(self.log_text())

    def find_log(self, **match) -> list[dict]:
        """Log lines whose given keys have the given values (compared as str)."""
        return find_lines(self.log_text(), **match)

    def wait_log(self, timeout: float = 10.0, **match) -> dict:
        """The first log line matching ``match``, waiting up to ``timeout``."""
        found = wait_for(lambda: self.find_log(**match), timeout,
                         msg="log line with %r; log:\n%s" % (match, _LazyTail(self.log_path)))
        return found[0]

    # -- memory ---------------------------------------------------------------
    def _proc_status(self, field: str) -> int:
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
        raise AssertionError("%s not in /proc/%d/status" % (field, self.proc.pid))

    def rss_kb(self) -> int:
        return self._proc_status("VmRSS")

    def peak_rss_kb(self) -> int:
        return self._proc_status("VmHWM")

    # -- --check-config ---------------------------------------------------
    @classmethod
    def run_check_config(cls, config, bin: str | None = None, env: dict | None = None,
                         args=(), timeout: float = 30.0) -> tuple[int, str]:
        """Run ``kembali --check-config --config FILE``; returns (exit code,
        stdout+stderr). ``config``: a dict (written as JSON), bytes (written
        verbatim), or a path."""
        if isinstance(config, (str, os.PathLike)):
            path = os.fspath(config)
        else:
            fd, path = tempfile.mkstemp(prefix="check-", suffix=".json", dir=_tmpdir_or_new(None))
            os.close(fd)
            write_config_file(path, config)
        b = bin or kembali_bin()
        if not os.path.exists(b):
            raise AssertionError("kembali binary %s does not exist (build it, or set KEMBALI_BIN)" % b)
        proc = spawn([b, "--check-config", "--config", path] + list(args), None,
                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_merge_env(env))
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_process(proc, 0)
            out, _ = proc.communicate()
            raise AssertionError("kembali --check-config did not finish within %.0f s: %r"
                                 % (timeout, out)) from None
        return proc.returncode, out.decode("utf-8", "replace")


class _LazyTail:
    def __init__(self, path):
        self.path = path

    def __str__(self):
        return _tail(self.path)


_short_dirs: dict[str, str] = {}


def http_get(port: int, path: str, headers: dict | None = None, method: str = "GET",
             timeout: float = 60.0):
    """One HTTP request to 127.0.0.1:port: (status, {lowercase name: value},
    body). Repeated headers are joined with ", "."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        out: dict[str, str] = {}
        for name, value in resp.getheaders():
            n = name.lower()
            out[n] = out[n] + ", " + value if n in out else value
        return resp.status, out, body
    finally:
        conn.close()


def socket_path(tmpdir: str, filename: str) -> str:
    """``<tmpdir>/<filename>``, or, when that is too long for a Unix socket
    (a long $TMPDIR), the same name in a short directory under /tmp that is
    the same for every call with this tmpdir and removed with the test."""
    path = os.path.join(tmpdir, filename)
    if len(os.fsencode(path)) <= _UNIX_PATH_MAX:
        return path
    with _registry_lock:
        short = _short_dirs.get(tmpdir)
        if short is None:
            short = _short_dirs[tmpdir] = tempfile.mkdtemp(prefix="kb-", dir="/tmp")
            os.chmod(short, 0o755)
            ctx = current_test()
            if ctx is not None:
                ctx.cleanups.append(lambda: shutil.rmtree(short, ignore_errors=True))
            else:
                atexit.register(shutil.rmtree, short, True)
    return os.path.join(short, filename)


def _parse_hostport(s: str):
    host, _, port = s.rpartition(":")
    return (host.strip("[]") or "127.0.0.1", int(port))


def key_path(tmpdir: str, name: str) -> str:
    """Where ``Kembali(tmpdir, keys={name: ...})`` writes that key."""
    return os.path.join(tmpdir, name + ".key")


def write_secret(path: str, secret: str) -> str:
    """Write a key file, mode 0600, atomically (a running kembali may be
    reading the same file: it sees the old or the new key, never an empty one)."""
    tmp = "%s.tmp-%d-%d" % (path, os.getpid(), threading.get_ident())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secret + "\n")
    os.replace(tmp, path)
    return path


def write_config_file(path: str, config) -> None:
    if isinstance(config, (bytes, str)):
        data = config.encode() if isinstance(config, str) else config
    else:
        data = (json.dumps(config, indent=2) + "\n").encode()
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def unix_listen_socket(path: str, backlog: int = 128) -> socket.socket:
    """A listening Unix socket at ``path`` (a stale file there is removed),
    inheritable, to hand to a child as fd 0."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(backlog)
    os.chmod(path, 0o777)
    return s


def make_shop(id: str, secret_key_file: str | None = None, **kw) -> dict:
    """A shop entry: hosts ["<id>.test"], name, shop_url; ``kw`` adds or
    overrides keys (a value of None removes one)."""
    shop = {"id": id, "name": id.replace("-", " ").title(), "hosts": [id + ".test"],
            "shop_url": "https://%s.test/" % id}
    if secret_key_file is not None:
        shop["secret_key_file"] = secret_key_file
    shop.update(kw)
    return {k: v for k, v in shop.items() if v is not None}


def make_config(sandbox, shops, **top) -> dict:
    """A configuration: api_base = sandbox.base, state_dir = <tmp>/state
    (created; <tmp> is the sandbox's tmpdir, else the running test's),
    templates_dir = <top_srcdir>/templates, the shops, then ``top`` (a value
    of None removes a key)."""
    tmp = getattr(sandbox, "tmpdir", None) or _tmpdir_or_new(None)
    state = os.path.join(tmp, "state")
    os.makedirs(state, exist_ok=True)
    config = {}
    if sandbox is not None:
        config["api_base"] = sandbox.base
    config["state_dir"] = state
    config["templates_dir"] = os.path.join(top_srcdir(), "templates")
    config["shops"] = list(shops)
    config.update(top)
    return {k: v for k, v in config.items() if v is not None}


_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?)\s+(\S+)")


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {'name{labels}': float} (comments skipped)."""
    out = {}
    for line in text.splitlines():
        m = _METRIC_LINE.match(line)
        if m and not line.startswith("#"):
            try:
                out[m.group(1)] = float(m.group(2))
            except ValueError:
                pass
    return out


# ---------------------------------------------------------------------------
# nginx
# ---------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nginx_bin() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


class Nginx:
    """A throwaway nginx (in the foreground, files in ``tmpdir``) passing
    ``location /kembali`` to ``kembali_sock`` (a Unix socket path, a (host,
    port) tuple, or anything with ``.addr``). Started at construction."""

    def __init__(self, tmpdir: str, kembali_sock, location_extra: str = "",
                 server_name: str = "shop.test", server_extra: str = "", start: bool = True,
                 keepalive: int = 0):
        """With keepalive > 0, nginx keeps that many idle FastCGI connections
        (an upstream block with ``keepalive``, ``fastcgi_keep_conn on``), as
        the README recommends."""
        self.tmpdir = tmpdir
        addr = getattr(kembali_sock, "addr", kembali_sock)
        self.upstream = "unix:" + addr if isinstance(addr, str) else "%s:%d" % tuple(addr)
        self.keepalive = keepalive
        self.location_extra = location_extra
        self.server_name = server_name
        self.server_extra = server_extra
        self.conf_path = os.path.join(tmpdir, "nginx.conf")
        self.error_log = os.path.join(tmpdir, "error.log")
        self.access_log = os.path.join(tmpdir, "access.log")
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        # nginx workers must reach the socket: open up its directory and ours.
        for d in {tmpdir, os.path.dirname(addr) if isinstance(addr, str) else ""}:
            if d:
                os.chmod(d, os.stat(d).st_mode | 0o755)
        if start:
            self.start()

    def conf(self, port: int) -> str:
        t = self.tmpdir
        temp = os.path.join(t, "nginx-temp")
        os.makedirs(temp, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""
        if self.keepalive:
            upstream = "upstream kembali {{ server {}; keepalive {}; }}".format(self.upstream, self.keepalive)
            passing = "fastcgi_pass kembali;\n            fastcgi_keep_conn on;"
        else:
            upstream = ""
            passing = "fastcgi_pass %s;" % self.upstream
        return f"""# written by tests/integration/harness.py
daemon off;
master_process on;
worker_processes 1;
{user}pid {t}/nginx.pid;
error_log {self.error_log} info;
events {{ worker_connections 1024; }}
http {{
    access_log {self.access_log};
    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    default_type application/octet-stream;
    {upstream}
    server {{
        listen 127.0.0.1:{port};
        server_name {self.server_name};
        {self.server_extra}
        location /kembali {{
            include /etc/nginx/fastcgi_params;
            {passing}
            fastcgi_read_timeout 40s;
            {self.location_extra}
        }}
    }}
}}
"""

    def start(self, timeout: float = 10.0, attempts: int = 5) -> "Nginx":
        last = ""
        for _ in range(attempts):
            port = free_port()
            with open(self.conf_path, "w") as f:
                f.write(self.conf(port))
            with open(os.path.join(self.tmpdir, "nginx.stderr"), "ab") as err:
                self.proc = spawn([nginx_bin(), "-p", self.tmpdir + "/", "-c", self.conf_path,
                                   "-e", self.error_log], self.tmpdir,
                                  stdout=subprocess.DEVNULL, stderr=err)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    time.sleep(0.02)
                    continue
                time.sleep(0.05)  # the port may be someone else's if nginx failed to bind
                if self.proc.poll() is None:
                    self.port = port
                    return self
            last = _tail(self.error_log) + _tail(os.path.join(self.tmpdir, "nginx.stderr"))
            kill_process(self.proc)
            if "in use" not in last:
                break
        raise AssertionError("nginx did not start; error log:\n" + last)

    def url(self, path_and_query: str = "/kembali") -> str:
        return "http://127.0.0.1:%d%s" % (self.port, path_and_query)

    def http_get(self, path: str, headers: dict | None = None, method: str = "GET",
                 timeout: float = 60.0):
        """(status, {lowercase name: value}, body); Host defaults to server_name."""
        return http_get(self.port, path, dict({"Host": self.server_name}, **(headers or {})), method, timeout)

    def error_log_text(self) -> str:
        return _tail(self.error_log, 1 << 30)

    def stop(self, timeout: float = 10.0):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_process(self.proc, 0)
        return self.proc.returncode if self.proc else None

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


# ---------------------------------------------------------------------------
# Redis: a private redis-server, and a small RESP client
# ---------------------------------------------------------------------------

REDIS_SERVER = "/usr/bin/redis-server"


class RedisError(Exception):
    """An error reply (``-ERR ...``, ``-WRONGPASS ...``); str(e) is its text."""


def redis_server_or_skip(path: str | None = None, env=None) -> str:
    """The redis-server to run: ``path``, else $REDIS_SERVER, else the one on
    PATH, else /usr/bin/redis-server. Missing: Skip, or a failure when
    KEMBALI_REQUIRE_SERVERS=1 (in ``env``, default os.environ)."""
    env = os.environ if env is None else env
    exe = path or env.get("REDIS_SERVER") or shutil.which("redis-server") or REDIS_SERVER
    if os.path.exists(exe):
        return exe
    if env.get("KEMBALI_REQUIRE_SERVERS") == "1":
        raise AssertionError("%s is missing and KEMBALI_REQUIRE_SERVERS=1" % exe)
    raise Skip("%s is not installed" % exe)


PROMTOOL = "/usr/bin/promtool"


def promtool_or_skip(env=None) -> str:
    """Prometheus's `promtool` (Debian package prometheus): $PROMTOOL, else
    the one on PATH, else /usr/bin/promtool. Missing: Skip, or a failure
    when KEMBALI_REQUIRE_SERVERS=1 (in ``env``, default os.environ), as for
    redis-server."""
    env = os.environ if env is None else env
    exe = env.get("PROMTOOL") or shutil.which("promtool") or PROMTOOL
    if os.path.exists(exe):
        return exe
    if env.get("KEMBALI_REQUIRE_SERVERS") == "1":
        raise AssertionError("%s is missing and KEMBALI_REQUIRE_SERVERS=1" % exe)
    raise Skip("%s is not installed" % exe)


def resp_command(*args) -> bytes:
    """One command as a RESP array of bulk strings (str, bytes, int, float)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, (bytes, bytearray)) else str(a).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), bytes(b)))
    return b"".join(out)


class RedisConnection:
    """One RESP2 connection to ``addr`` (a Unix socket path or (host,
    port)), authenticated with ``password`` and on database ``db`` when
    given. ``cmd(*args)`` sends one command and returns its reply; ``send``
    and ``reply`` pipeline, or follow SUBSCRIBE and MONITOR.

    Replies: a simple string as str, an integer as int, a bulk string as str
    (UTF-8, undecodable bytes kept by surrogateescape) or bytes with
    ``raw=True``, nil as None, an array as a list; an error reply is raised
    as RedisError (inside an array, e.g. EXEC's, it is left in the list).
    Timeouts raise TimeoutError. Usable as a context manager."""

    def __init__(self, addr, password: str | None = None, db: int = 0, timeout: float = 5.0,
                 raw: bool = False):
        self.addr = addr
        self.raw = raw
        self.timeout = timeout
        fam = socket.AF_UNIX if isinstance(addr, str) else socket.AF_INET
        self.sock = socket.socket(fam, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        self.buf = b""
        try:
            self.sock.connect(addr)
            if password is not None:
                self.cmd("AUTH", password)
            if db:
                self.cmd("SELECT", db)
        except BaseException:
            self.sock.close()
            raise

    def send(self, *args) -> None:
        self.sock.sendall(resp_command(*args))

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("redis closed the connection")
        self.buf += chunk

    def _line(self) -> bytes:
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                line, self.buf = self.buf[:i], self.buf[i + 2:]
                return line
            self._fill()

    def _exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _parse(self, raw: bool):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode("utf-8", "surrogateescape")
        if kind == b"-":
            return RedisError(rest.decode("utf-8", "replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = self._exact(n)
            return data if raw else data.decode("utf-8", "surrogateescape")
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._parse(raw) for _ in range(n)]
        raise ConnectionError("not a RESP reply: %r" % line[:80])

    def reply(self, timeout: float | None = None, raw: bool | None = None):
        """The next reply (an error reply raised as RedisError)."""
        self.sock.settimeout(self.timeout if timeout is None else timeout)
        try:
            got = self._parse(self.raw if raw is None else raw)
        finally:
            self.sock.settimeout(self.timeout)
        if isinstance(got, RedisError):
            raise got
        return got

    def cmd(self, *args, raw: bool | None = None, timeout: float | None = None):
        self.send(*args)
        return self.reply(timeout, raw)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class Redis:
    """A private redis-server for one test: a Unix socket in ``tmpdir``
    (``sock_path``; a short directory when tmpdir is too long) and a free TCP
    port on 127.0.0.1 (``port``; never 6379, where a system Redis may be),
    no persistence (``--save ""``, ``--appendonly no``), in the foreground,
    its files in ``<tmpdir>/<name>-data`` and its log in ``<name>.log``,
    ``requirepass`` when ``password`` is given. Started at construction
    (``start=False`` to delay); ready when it answers PING on both. Killed
    with the test like every process the harness starts (a paused one too).

    ``cmd(*args)`` runs one command on a fresh connection (authenticated;
    see RedisConnection for the replies); ``client()`` gives a connection to
    keep. ``url()``/``unix_url()`` are the forms of kembali's ``redis`` key.
    A missing redis-server skips the test (fails with
    KEMBALI_REQUIRE_SERVERS=1)."""

    def __init__(self, tmpdir: str, password: str | None = None, name: str = "redis",
                 bin: str | None = None, args=(), start: bool = True):
        self.bin = redis_server_or_skip(bin)
        self.tmpdir = tmpdir
        self.password = password
        self.name = name
        self.args = list(args)
        self.sock_path = socket_path(tmpdir, name + ".sock")
        self.dir = os.path.join(tmpdir, name + "-data")
        self.log_path = os.path.join(tmpdir, name + ".log")
        self.port: int | None = None
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0
        if start:
            self.start()

    # -- addresses ------------------------------------------------------------
    def url(self, db: int | None = None) -> str:
        """``redis://127.0.0.1:PORT[/DB]``."""
        return "redis://127.0.0.1:%d" % self.port + ("/%d" % db if db else "")

    def unix_url(self, db: int | None = None) -> str:
        """``unix:///PATH[?db=N]``."""
        return "unix://" + self.sock_path + ("?db=%d" % db if db else "")

    @property
    def addr(self):
        return self.sock_path

    def password_file(self, path: str | None = None) -> str:
        """Write the password (mode 0600) to ``path`` (default
        ``<tmpdir>/<name>.password``) for redis_password_file; its path."""
        if self.password is None:
            raise AssertionError("this Redis has no password")
        return write_secret(path or os.path.join(self.tmpdir, self.name + ".password"), self.password)

    # -- lifetime -----------------------------------------------------------
    def argv(self, port: int) -> list[str]:
        argv = [self.bin, "--port", str(port), "--bind", "127.0.0.1",
                "--unixsocket", self.sock_path, "--unixsocketperm", "777",
                "--save", "", "--appendonly", "no", "--daemonize", "no",
                "--dir", self.dir, "--logfile", self.log_path, "--loglevel", "notice"]
        if self.password is not None:
            argv += ["--requirepass", self.password]
        return argv + self.args

    def _ready(self) -> bool:
        for addr in (self.sock_path, ("127.0.0.1", self.port)):
            try:
                with RedisConnection(addr, self.password, timeout=1.0) as c:
                    if c.cmd("PING") != "PONG":
                        return False
            except (OSError, RedisError):
                return False
        return True

    def start(self, timeout: float = 10.0) -> "Redis":
        """Start (again: on the same port and socket, empty)."""
        if self.running():
            raise AssertionError("%s is already running" % self.name)
        os.makedirs(self.dir, exist_ok=True)
        fixed = self.port is not None
        deadline = time.monotonic() + timeout
        last = ""
        for attempt in range(50):
            if not fixed:
                self.port = free_port()
                while self.port == 6379:
                    self.port = free_port()
            try:
                os.unlink(self.sock_path)
            except FileNotFoundError:
                pass
            log_start = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
            self.proc = spawn(self.argv(self.port), self.tmpdir, stdout=subprocess.DEVNULL,
                              stderr=subprocess.STDOUT)
            self.paused = False
            while time.monotonic() < deadline and self.proc.poll() is None:
                if self._ready():
                    self.starts += 1
                    return self
                time.sleep(0.02)
            if self.proc.poll() is None:  # no answer in time
                kill_process(self.proc, 0)
                raise AssertionError("%s did not answer PING within %.0f s; log:\n%s"
                                     % (self.name, timeout, _tail(self.log_path)))
            with open(self.log_path, "rb") as f:
                f.seek(log_start)
                last = f.read().decode("utf-8", "replace")
            # the port was taken meanwhile: another one, or (restart) wait for it
            if "in use" not in last or time.monotonic() >= deadline:
                break
            time.sleep(0.1 if fixed else 0)
        raise AssertionError("%s (%s) did not start on port %s; log:\n%s"
                             % (self.name, self.bin, self.port, last[-4000:]))

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 10.0):
        """SIGTERM (after SIGCONT when paused) and wait (SIGKILL after
        ``timeout``); the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.resume()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_process(self.proc, 0)
        self.paused = False
        return self.proc.returncode

    def kill(self):
        """SIGKILL and wait; the exit code."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.paused = False
        return self.proc.returncode if self.proc else None

    def pause(self) -> None:
        """SIGSTOP: connections still open (the kernel accepts them), nothing answers."""
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def restart(self, timeout: float = 10.0) -> "Redis":
        """Stop (if running) and start again, empty, on the same port and socket."""
        self.stop()
        return self.start(timeout)

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False

    # -- commands -----------------------------------------------------------
    def client(self, tcp: bool = False, db: int = 0, timeout: float = 5.0, raw: bool = False) -> RedisConnection:
        """A new authenticated connection (the Unix socket, or TCP)."""
        addr = ("127.0.0.1", self.port) if tcp else self.sock_path
        return RedisConnection(addr, self.password, db=db, timeout=timeout, raw=raw)

    def cmd(self, *args, raw: bool = False, db: int = 0, timeout: float = 5.0):
        """One command on a fresh connection; its reply (RedisError raised)."""
        with self.client(db=db, timeout=timeout, raw=raw) as c:
            return c.cmd(*args)

    def keys(self, pattern: str = "*", db: int = 0) -> list[str]:
        """The keys matching ``pattern`` (KEYS), sorted."""
        return sorted(self.cmd("KEYS", pattern, db=db))

    def log_text(self) -> str:
        return _tail(self.log_path, 1 << 30)


REDIS_SENTINEL = "/usr/bin/redis-sentinel"


class Sentinel(Redis):
    """A private redis-sentinel (Debian's redis-sentinel package) for one
    test, on a free TCP port of 127.0.0.1 (never 26379), monitoring the
    master ``master_name`` at ``monitor`` (a Redis, or (host, port)) with
    ``quorum``, ``down_after_ms`` and ``failover_timeout_ms``; the master's
    password given to it (auth-pass) when the Redis has one; ``password``
    is the Sentinel's own (requirepass). Its config file (which Sentinel
    rewrites) is ``<tmpdir>/<name>.conf``, its log ``<name>.log``. Started,
    paused, stopped and killed as a Redis. A missing redis-sentinel skips
    the test (fails with KEMBALI_REQUIRE_SERVERS=1)."""

    def __init__(self, tmpdir: str, monitor, master_name: str = "kembali", name: str = "sentinel",
                 quorum: int = 1, down_after_ms: int = 1000, failover_timeout_ms: int = 3000,
                 password: str | None = None, start: bool = True):
        exe = os.environ.get("REDIS_SENTINEL") or shutil.which("redis-sentinel") or REDIS_SENTINEL
        if not os.path.exists(exe):
            if os.environ.get("KEMBALI_REQUIRE_SERVERS") == "1":
                raise AssertionError("%s is missing and KEMBALI_REQUIRE_SERVERS=1" % exe)
            raise Skip("%s is not installed (Debian's redis-sentinel package)" % exe)
        self.monitor = monitor
        self.master_name = master_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        super().__init__(tmpdir, password=password, name=name, bin=exe, start=False)
        self.conf_path = os.path.join(tmpdir, name + ".conf")
        if start:
            self.start()

    def argv(self, port: int) -> list[str]:
        if isinstance(self.monitor, Redis):
            host, mport, mpass = "127.0.0.1", self.monitor.port, self.monitor.password
        else:
            (host, mport), mpass = self.monitor, None
        lines = ["port %d" % port, "bind 127.0.0.1", "protected-mode no", "daemonize no",
                 "dir %s" % self.dir, "logfile %s" % self.log_path, "loglevel notice",
                 "sentinel monitor %s %s %d %d" % (self.master_name, host, mport, self.quorum),
                 "sentinel down-after-milliseconds %s %d" % (self.master_name, self.down_after_ms),
                 "sentinel failover-timeout %s %d" % (self.master_name, self.failover_timeout_ms)]
        if mpass is not None:
            lines.append("sentinel auth-pass %s %s" % (self.master_name, mpass))
        if self.password is not None:
            lines.append("requirepass %s" % self.password)
        # a restart keeps what Sentinel learnt (its rewritten file)
        if not os.path.exists(self.conf_path):
            with open(self.conf_path, "w") as f:
                f.write("\n".join(lines) + "\n")
        else:
            text = open(self.conf_path).read()
            with open(self.conf_path, "w") as f:
                f.write("".join(l + "\n" for l in text.splitlines() if not l.startswith("port ")) +
                        "port %d\n" % port)
        return [self.bin, self.conf_path]

    def _ready(self) -> bool:
        try:
            with RedisConnection(("127.0.0.1", self.port), self.password, timeout=1.0) as c:
                return c.cmd("PING") == "PONG"
        except (OSError, RedisError):
            return False

    def client(self, tcp: bool = True, db: int = 0, timeout: float = 5.0, raw: bool = False) -> RedisConnection:
        return RedisConnection(("127.0.0.1", self.port), self.password, timeout=timeout, raw=raw)

    def hostport(self) -> str:
        """``127.0.0.1:PORT``, as redis-sentinel:// lists it."""
        return "127.0.0.1:%d" % self.port

    def master_addr(self):
        """(host, port) Sentinel names for its master now."""
        got = self.cmd("SENTINEL", "get-master-addr-by-name", self.master_name)
        return (got[0], int(got[1])) if got else None

    def replicas_ready(self, n: int = 1) -> bool:
        """Does Sentinel know n replicas of its master, each linked and not down
        (what SENTINEL FAILOVER needs)?"""
        reps = self.cmd("SENTINEL", "replicas", self.master_name)
        good = 0
        for r in reps:
            d = dict(zip(r[::2], r[1::2]))
            if "s_down" not in d.get("flags", "") and d.get("master-link-status") == "ok":
                good += 1
        return good >= n


# ---------------------------------------------------------------------------
# Chromium
# ---------------------------------------------------------------------------

CHROMIUM = "/usr/bin/chromium"


def chromium_or_skip(path: str = CHROMIUM, env=None) -> str:
    """``path`` if it exists; else Skip, or a failure when
    KEMBALI_REQUIRE_CHROMIUM=1 (in ``env``, default os.environ)."""
    if os.path.exists(path):
        return path
    if (os.environ if env is None else env).get("KEMBALI_REQUIRE_CHROMIUM") == "1":
        raise AssertionError("%s is missing and KEMBALI_REQUIRE_CHROMIUM=1" % path)
    raise Skip("%s is not installed" % path)


def _chromium(args: list[str], timeout: float) -> tuple[int, bytes, bytes]:
    exe = chromium_or_skip()
    # Chromium puts its singleton socket under $TMPDIR: keep that path short.
    tmp = tempfile.gettempdir() if len(tempfile.gettempdir()) <= 40 else "/tmp"
    profile = tempfile.mkdtemp(prefix="kb-chromium-", dir=tmp)
    argv = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync",
            "--user-data-dir=" + profile] + args
    try:
        proc = spawn(argv, None, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                     env=_merge_env({"TMPDIR": tmp}))
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_process(proc, 0)
            out, err = proc.communicate()
            raise AssertionError("chromium did not finish within %.0f s: %s\nstderr:\n%s"
                                 % (timeout, " ".join(args), err.decode("utf-8", "replace")[-3000:])) from None
        return proc.returncode, out, err
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def chromium_dump_dom(url: str, timeout: float = 60, extra_args=()) -> str:
    """The DOM headless chromium serialises after loading ``url``."""
    rc, out, err = _chromium(list(extra_args) + ["--dump-dom", url], timeout)
    if rc != 0 or not out.strip():
        raise AssertionError("chromium --dump-dom %s failed (exit %d); stderr:\n%s"
                             % (url, rc, err.decode("utf-8", "replace")[-3000:]))
    return out.decode("utf-8", "replace")


def chromium_screenshot(url: str, path: str, size=(390, 844), timeout: float = 60,
                        extra_args=()) -> str:
    """A PNG screenshot of ``url`` at ``size`` (CSS pixels) written to ``path``."""
    path = os.path.abspath(path)
    rc, out, err = _chromium(list(extra_args) + [
        "--hide-scrollbars", "--window-size=%d,%d" % tuple(size), "--screenshot=" + path, url], timeout)
    if rc != 0 or not os.path.exists(path) or os.path.getsize(path) == 0:
        raise AssertionError("chromium --screenshot %s failed (exit %d); stderr:\n%s"
                             % (url, rc, err.decode("utf-8", "replace")[-3000:]))
    return path


# ---------------------------------------------------------------------------
# Assertions
# ---------------------------------------------------------------------------

def _short(v, limit: int = 2000) -> str:
    r = repr(v)
    return r if len(r) <= limit else r[:limit] + "... (%d chars)" % len(r)


def _prefix(msg: str) -> str:
    return msg + ": " if msg else ""


def assert_eq(actual, expected, msg: str = ""):
    if actual != expected:
        raise AssertionError("%sexpected %s\n  got      %s" % (_prefix(msg), _short(expected), _short(actual)))


def assert_between(x, lo, hi, msg: str = ""):
    if not (lo <= x <= hi):
        raise AssertionError("%sexpected %s <= x <= %s, got x = %s" % (_prefix(msg), _short(lo), _short(hi), _short(x)))


def assert_in(needle, haystack, msg: str = ""):
    if needle not in haystack:
        raise AssertionError("%sexpected %s in %s" % (_prefix(msg), _short(needle, 300), _short(haystack)))


def wait_for(predicate, timeout: float, interval: float = 0.02, msg: str = ""):
    """Poll ``predicate`` until it returns something truthy (returned); raise
    AssertionError after ``timeout`` seconds with its last value or exception."""
    deadline = time.monotonic() + timeout
    last, last_exc = None, None
    while True:
        try:
            last = predicate()
            last_exc = None
            if last:
                return last
        except Exception as e:  # retried; reported if it is the last outcome
            last_exc = e
        if time.monotonic() >= deadline:
            what = ("last raised %r" % last_exc) if last_exc else ("last value %s" % _short(last, 500))
            raise AssertionError("%stimed out after %.1f s waiting (%s)" % (_prefix(str(msg)), timeout, what))
        time.sleep(interval)


# ---------------------------------------------------------------------------
# Time limits (pytest-timeout: hang detectors; conftest.py sets the default
# and multiplies every limit by $HARNESS_TIMEOUT_SCALE)
# ---------------------------------------------------------------------------

DEFAULT_TIMEOUT = 120.0


def timeout(seconds: float):
    """Decorator: this test's time limit (default 120 s), after which it
    fails with its stack; a hang detector, not a measure."""
    return pytest.mark.timeout(seconds)


def run(tests) -> None:
    """``python3 test_x.py [pytest args]``: pytest on that file (the
    ``if __name__ == "__main__": harness.run(globals())`` trailer)."""
    sys.exit(pytest.main([tests["__file__"]] + sys.argv[1:]))
