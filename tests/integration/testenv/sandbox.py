"""``Sandbox``: the Kasera stand-in (tests/sandbox/kasera-sandbox) and its
control API."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request

from .env import DEFAULT_KEY, _merge_env, _tail, sandbox_bin
from .procs import _drain, _read_line, kill_process, spawn


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
