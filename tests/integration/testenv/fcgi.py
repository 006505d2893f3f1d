"""A FastCGI 1.0 client: ``fcgi_request`` (and ``fcgi_send``/``fcgi_receive``
for tests that hold a connection open), ``get`` with the usual CGI params,
and ``Response``."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
import weakref



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
