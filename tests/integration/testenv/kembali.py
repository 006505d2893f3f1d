"""``Kembali``: the program under test on a Unix socket in the test's tmpdir,
its key files, configuration and log; ``make_config``, ``make_shop``."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time

from .asserts import wait_for
from .env import _LazyTail, _merge_env, _tail, kembali_bin, top_srcdir
from .fcgi import FcgiError, Response, _addr_str, fcgi_connect, get
from .logs import find_lines, parse_log, parse_metrics
from .procs import _tmpdir_or_new, current_test, kill_process, proc_status, socket_path, spawn


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
        return int(proc_status(self.proc.pid, field).split()[0])

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
