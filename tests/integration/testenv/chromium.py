"""Headless Chromium: ``chromium_dump_dom`` and ``chromium_screenshot``
(cdp.py drives it over its DevTools protocol)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from .env import Skip, _merge_env
from .procs import kill_process, spawn


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
