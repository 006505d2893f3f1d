"""``Redis``: a private redis-server (its own Unix socket and TCP port, never
6379, no persistence), ``Sentinel``, and ``RedisConnection``, a small RESP
client."""

from __future__ import annotations

import hashlib
import hmac
import os
import shutil
import signal
import socket
import subprocess
import time

from .env import Skip, _tail, top_builddir
from .kembali import write_secret
from .procs import free_port, kill_process, socket_path, spawn


REDIS_SERVER = "/usr/bin/redis-server"


def redis_scripts_bin() -> str:
    """tests/unit/redis-scripts: prints each script's text and keys as
    kembali builds them."""
    return os.path.join(top_builddir(), "tests", "unit", "redis-scripts")


def redis_script_text(name: str) -> str:
    """Script `name`'s text as kembali loads it."""
    return subprocess.run([redis_scripts_bin(), name], check=True, capture_output=True, text=True).stdout


_SCRIPT_KEYS: dict = {}


def redis_script_keys(name: str, vprefix: str, k: str, tx, tiers=()) -> list:
    """The keys kembali passes script `name` (state_redis_script_keys) under
    vprefix for key name k, transaction tx and a client's tiers' names."""
    marks = ["@T%d@" % i for i in range(len(tiers))]
    at = (name, vprefix, k, len(tiers))
    if at not in _SCRIPT_KEYS:
        _SCRIPT_KEYS[at] = subprocess.run([redis_scripts_bin(), "keys", name, vprefix, k, "@ID@"] + marks,
                                          check=True, capture_output=True, text=True).stdout.split()
    names = []
    for n in _SCRIPT_KEYS[at]:
        n = n.replace("@ID@", str(tx))
        for mark, t in zip(marks, tiers):
            n = n.replace(mark, t)
        names.append(n)
    return names


def redis_key_name(secret: str) -> str:
    """The name K of an API key's Redis keys, as docs/redis.md documents it:
    the first 16 bytes of HMAC-SHA256(key = the secret, message =
    "kembali-names-v1"), in hex."""
    return hmac.new(secret.encode(), b"kembali-names-v1", hashlib.sha256).digest()[:16].hex()


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
