"""Processes a test starts: ``spawn`` tracks each for the running test
(``TestContext``, made by conftest.py) so that it is killed when the test
ends; ``kill_process``; short Unix socket paths; free ports."""

from __future__ import annotations

import atexit
import os
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import traceback



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


def proc_status(pid: int, field: str) -> str:
    """Field `field` of /proc/PID/status, as written ("T (stopped)" for
    State, "1234 kB" for VmRSS)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split(":", 1)[1].strip()
    raise AssertionError("%s not in /proc/%d/status" % (field, pid))


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


_UNIX_PATH_MAX = 107
_short_dirs: dict[str, str] = {}


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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
