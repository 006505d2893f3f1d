#!/usr/bin/env python3
"""Self-test of the harness's FastCGI client (testenv/fcgi.py), the one
part of the harness every test's verdict rests on and no real server
checks: it is tested against a small FastCGI responder written here (its
record parsing written apart from the harness's on purpose). The rest of
the harness is exercised by the tests that use it.

    python3 -m pytest tests/integration/test_harness_selftest.py [-k NAME]
"""

import os
import socket
import struct
import sys
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testenv  # noqa: E402
from testenv import assert_between, assert_eq, assert_in  # noqa: E402

BIG = bytes(range(256)) * 400  # 102400 bytes: several STDOUT records
LONG_VALUE = "v" * 70000  # a param longer than one record


# ---------------------------------------------------------------------------
# A FastCGI responder (the application side), independent of testenv
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
    resp = Responder(testenv.socket_path(tmpdir, "app.sock"))
    try:
        params = {"SHORT": "x", "MEDIUM": "m" * 200, "LONG": LONG_VALUE, "EMPTY": "",
                  "N" * 130: "long name", "UTF8": "héllo"}
        r = testenv.fcgi_request(resp.addr, params, stdin=b"body bytes" * 10000, timeout=10)
        req = check_big_response(r, resp)
        assert_eq(req["params"], params, "params decoded by the responder")
        assert_eq(req["stdin"], b"body bytes" * 10000)
        assert req["nparams"] >= 3, "params should span several records, got %d" % req["nparams"]
    finally:
        resp.close()


def test_fcgi_tcp_and_get_params(tmpdir):
    resp = Responder("tcp")
    try:
        r = testenv.get(resp.addr, "id=abc&x=1", accept="application/json",
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
        testenv.get(resp.addr, method="HEAD", host="other.test")
        p = resp.requests[-1]["params"]
        assert_eq((p["REQUEST_METHOD"], p["QUERY_STRING"], p["REQUEST_URI"], p["HTTP_HOST"]),
                  ("HEAD", "", "/kembali", "other.test"))
        assert "HTTP_ACCEPT" not in p
    finally:
        resp.close()


def test_fcgi_lf_headers_default_status(tmpdir):
    resp = Responder(testenv.socket_path(tmpdir, "a.sock"),
                     handler=lambda p, s: b"Content-Type: text/plain\nKembali-Status: checking\n\nline1\r\n\r\nline2")
    try:
        r = testenv.fcgi_request(resp.addr, {"A": "b"})
        assert_eq(r.status, 200)
        assert_eq(r.header("content-type"), "text/plain")
        assert_eq(r.header("kembali-status"), "checking")
        assert_eq(r.body, b"line1\r\n\r\nline2", "the body keeps its own blank lines")
        assert r.headers_complete
    finally:
        resp.close()


def test_fcgi_json_helper(tmpdir):
    resp = Responder(testenv.socket_path(tmpdir, "a.sock"),
                     handler=lambda p, s: b'Status: 404 Not Found\r\nContent-Type: application/json\r\n\r\n'
                                          b'{"id": "x", "status": "unknown", "final": false}')
    try:
        r = testenv.get(resp.addr, "id=x&format=json")
        assert_eq(r.status, 404)
        assert_eq(r.json(), {"id": "x", "status": "unknown", "final": False})
        assert_in("404", repr(r))
    finally:
        resp.close()


def test_fcgi_connection_closed_early(tmpdir):
    resp = Responder(testenv.socket_path(tmpdir, "a.sock"), mode="close_early")
    try:
        try:
            testenv.fcgi_request(resp.addr, {"A": "b"}, timeout=10)
        except testenv.FcgiError as e:
            assert_in("closed before FCGI_END_REQUEST", str(e))
            assert_in("30000 stdout bytes", str(e))
        else:
            raise AssertionError("no FcgiError")
    finally:
        resp.close()


def test_fcgi_timeout_and_refused(tmpdir):
    resp = Responder(testenv.socket_path(tmpdir, "a.sock"), mode="hang")
    try:
        t0 = time.monotonic()
        try:
            testenv.fcgi_request(resp.addr, {"A": "b"}, timeout=0.5)
        except testenv.FcgiTimeout as e:
            assert_in("no FCGI_END_REQUEST within 0.5 s", str(e))
        else:
            raise AssertionError("no FcgiTimeout")
        assert_between(time.monotonic() - t0, 0.4, 30)  # never early; the upper bound a hang detector
    finally:
        resp.close()
    try:
        testenv.fcgi_request(testenv.socket_path(tmpdir, "nothing.sock"), {})
    except testenv.FcgiError as e:
        assert_in("cannot connect", str(e))
    else:
        raise AssertionError("no FcgiError")


def test_fcgi_record_encoding(tmpdir):
    assert_eq(testenv.fcgi_encode_pair("A", "bc"), b"\x01\x02Abc")
    assert_eq(testenv.fcgi_encode_pair("A", "x" * 128)[:6], b"\x01\x80\x00\x00\x80A")
    rec = testenv.fcgi_record(testenv.FCGI_STDIN, b"abc")
    assert_eq(len(rec) % 8, 0)
    assert_eq(rec[:8], b"\x01\x05\x00\x01\x00\x03\x05\x00")
    try:
        testenv.fcgi_record(testenv.FCGI_STDIN, b"x" * 65536)
    except ValueError:
        pass
    else:
        raise AssertionError("an oversized record was accepted")


def test_cgi_parse_without_blank_line(tmpdir):
    r = testenv.Response(b"Status: 502 Bad Gateway\r\nX: y", b"", 0, 0, 0.0)
    assert_eq((r.status, r.header("x"), r.body, r.headers_complete), (502, "y", b"", False))
    r = testenv.Response(b"", b"", 0, 0, 0.0)
    assert_eq((r.status, r.body), (200, b""))
