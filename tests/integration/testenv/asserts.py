"""Assertions with readable messages: ``assert_eq``, ``assert_between``,
``assert_in``; ``wait_for``."""

from __future__ import annotations

import time



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
