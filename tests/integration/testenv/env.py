"""Where things are (the build and source trees, the binaries), the
environment a child gets, ``Skip``, time limits and small file helpers."""

from __future__ import annotations

import os
import shutil
import sys


HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # tests/integration/testenv
DEFAULT_KEY = "sk_test_kembali_0000000000000001"


def top_builddir() -> str:
    """The build tree's top (env ``top_builddir``, relative to the cwd)."""
    return os.path.abspath(os.environ.get("top_builddir") or REPO_ROOT)


def top_srcdir() -> str:
    """The source tree's top (env ``top_srcdir``, relative to the cwd)."""
    return os.path.abspath(os.environ.get("top_srcdir") or REPO_ROOT)


def kembali_bin() -> str:
    return os.environ.get("KEMBALI_BIN") or os.path.join(top_builddir(), "src", "kembali")


def cpu_scale() -> float:
    """How many times slower than a plain build kembali's own work runs in
    this build: 10 under ThreadSanitizer, 3 under AddressSanitizer (their
    runtimes' symbols in the binary), else 1. For the few bounds a test
    puts on kembali's own time between two of its log lines; never for a
    time the schedule sets."""
    global _CPU_SCALE
    if _CPU_SCALE is None:
        with open(kembali_bin(), "rb") as f:
            body = f.read()
        _CPU_SCALE = 10.0 if b"__tsan_init" in body else 3.0 if b"__asan_init" in body else 1.0
    return _CPU_SCALE


_CPU_SCALE = None


def kembali_testing_bin() -> str:
    """kembali built with KEMBALI_TESTING (Makefile.am): it honours
    KEMBALI_TEST_LAYOUT and KEMBALI_TEST_REDIS_SCHEMA, to run two versions
    side by side from one build."""
    return os.environ.get("KEMBALI_TESTING_BIN") or os.path.join(top_builddir(), "tests", "kembali-testing")


def _define(header: str, name: str) -> int:
    import re
    with open(os.path.join(top_srcdir(), "src", header)) as f:
        m = re.search(r"^#define %s (\d+)" % name, f.read(), re.M)
    return int(m.group(1))


def state_layout() -> int:
    """This build's state layout version (ST_VERSION): the state file is
    state_dir/kembali-vN.state."""
    return _define("state_private.h", "ST_VERSION")


def redis_schema() -> int:
    """This build's Redis schema version: its keys are PREFIXvN:{K}..."""
    return _define("state_redis_name.h", "STATE_REDIS_SCHEMA")


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


def _tail(path: str, limit: int = 6000) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        return "(no log: %s)" % e
    if len(data) > limit:
        data = b"...\n" + data[-limit:]
    return data.decode("utf-8", "replace")


def _merge_env(env: dict | None) -> dict:
    merged = dict(os.environ)
    for k, v in (env or {}).items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = str(v)
    return merged


class _LazyTail:
    def __init__(self, path):
        self.path = path

    def __str__(self):
        return _tail(self.path)


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


DEFAULT_TIMEOUT = 120.0


def timeout(seconds: float):
    """Decorator: this test's time limit (default 120 s), after which it
    fails with its stack; a hang detector, not a measure."""
    return pytest.mark.timeout(seconds)


def run(tests) -> None:
    """``python3 test_x.py [pytest args]``: pytest on that file (the
    ``if __name__ == "__main__": testenv.run(globals())`` trailer)."""
    sys.exit(pytest.main([tests["__file__"]] + sys.argv[1:]))
