"""A headless Chromium driven over its DevTools protocol, with the Python
standard library only (a minimal WebSocket client): screenshots at a
phone's size while a page is still loading, and the accessibility tree."""

import base64
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import time
import urllib.request

from .asserts import wait_for
from .chromium import chromium_or_skip
from .procs import kill_process, spawn


class Chromium:
    def __init__(self, size=(390, 844)):
        exe = chromium_or_skip()
        tmp = tempfile.gettempdir() if len(tempfile.gettempdir()) <= 40 else "/tmp"
        self.profile = tempfile.mkdtemp(prefix="kb-cdp-", dir=tmp)
        self.proc = spawn([exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                           "--no-first-run", "--disable-background-networking", "--hide-scrollbars",
                           "--disable-component-update", "--disable-sync", "--remote-debugging-port=0",
                           "--user-data-dir=" + self.profile, "about:blank"], None,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        port = None
        deadline = time.monotonic() + 30
        err = b""
        while port is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            err += line
            m = re.search(rb"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            if m:
                port = int(m.group(1))
        if port is None:
            self.close()
            raise AssertionError("chromium gave no DevTools port: %r" % err[-2000:])
        pages = json.load(urllib.request.urlopen("http://127.0.0.1:%d/json/list" % port, timeout=10))
        ws = [p for p in pages if p.get("type") == "page"][0]["webSocketDebuggerUrl"]
        self.sock = self._connect(ws)
        self.next_id = 0
        self.call("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=True)
        self.call("Page.enable")

    @staticmethod
    def _connect(url):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", url)
        s = socket.create_connection((m.group(1), int(m.group(2))), timeout=30)
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(("GET %s HTTP/1.1\r\nHost: %s:%s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n"
                   % (m.group(3), m.group(1), m.group(2), key)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            c = s.recv(1)
            if not c:
                raise AssertionError("DevTools WebSocket handshake failed: %r" % head)
            head += c
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise AssertionError("DevTools WebSocket refused: %r" % head)
        return s

    def _recv_exact(self, n):
        b = b""
        while len(b) < n:
            c = self.sock.recv(n - len(b))
            if not c:
                raise AssertionError("DevTools WebSocket closed")
            b += c
        return b

    def _recv(self):
        data = b""
        while True:
            h = self._recv_exact(2)
            fin, op, n = h[0] & 0x80, h[0] & 0x0F, h[1] & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            payload = self._recv_exact(n)
            if op == 8:
                raise AssertionError("DevTools WebSocket closed by chromium")
            if op in (0, 1, 2):
                data += payload
                if fin:
                    return json.loads(data)

    def _send(self, obj):
        payload = json.dumps(obj).encode()
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack(">H", n)
                                if n < 65536 else bytes([0x80 | 127]) + struct.pack(">Q", n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def call(self, method, **params):
        self.next_id += 1
        self._send({"id": self.next_id, "method": method, "params": params})
        while True:
            msg = self._recv()
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise AssertionError("%s: %r" % (method, msg["error"]))
                return msg.get("result", {})

    def navigate(self, url):
        """Start loading url; returns at once (the page may still be loading)."""
        self.call("Page.navigate", url=url)

    def js(self, expr):
        """Evaluate expr (DevTools is not the page: its CSP does not apply)."""
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r.get("result", {}).get("value")

    def wait_js(self, expr, timeout=30):
        return wait_for(lambda: self.js(expr), timeout, interval=0.05, msg=expr)

    def screenshot(self, path):
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def ax_tree(self):
        return self.call("Accessibility.getFullAXTree")["nodes"]

    def close(self):
        try:
            kill_process(self.proc, 0)
        finally:
            shutil.rmtree(self.profile, ignore_errors=True)
