"""The pytest side of the harness: hooks and fixtures, imported by
tests/integration/conftest.py (and tests/package/conftest.py).

- ``tmpdir``: each test's own folder under $TMPDIR, as a str (``kb-NAME-*``);
  removed when the test passes or is skipped, kept when it fails (the
  report's "kept tmpdir" section gives its path).
- Every process started through the harness while a test runs is killed
  when it ends (passed, failed or timed out), then its cleanups run.
- A passing test then runs the final checks it registered (e.g.
  ``Kembali.final_check``: SIGTERM gives exit 0, no sanitizer report), which
  may fail it.
- Time limits (pytest-timeout, hang detectors only): ``@testenv.timeout(N)``
  (``env.timeout``),
  else 120 s, each multiplied by $HARNESS_TIMEOUT_SCALE (slow sanitizer
  builds).
"""

import os
import shutil
import tempfile

import pytest

from . import env, procs


def pytest_collection_modifyitems(config, items):
    scale = float(os.environ.get("HARNESS_TIMEOUT_SCALE") or 1)
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = mark.args[0] if mark is not None and mark.args else env.DEFAULT_TIMEOUT
        item.add_marker(pytest.mark.timeout(seconds * scale), append=False)


@pytest.fixture(autouse=True)
def harness_context(request):
    """The running test's procs.TestContext (its folder, processes, checks)."""
    name = request.node.name
    ctx = procs.TestContext(name, tempfile.mkdtemp(prefix="kb-%s-" % name[5:][:24]))
    request.node.harness_ctx = ctx
    procs.begin_test(ctx)
    try:
        yield ctx
    finally:
        procs.end_test(ctx)
        reports = [getattr(request.node, "harness_rep_" + w, None) for w in ("setup", "call")]
        if not any(r is not None and r.failed for r in reports):
            shutil.rmtree(ctx.tmpdir, ignore_errors=True)


@pytest.fixture
def tmpdir(harness_context):
    """This test's folder, a str (kept when the test fails)."""
    return harness_context.tmpdir


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    ctx = getattr(item, "harness_ctx", None)
    if ctx is not None and outcome.excinfo is None:
        with ctx.lock:
            checks = list(ctx.checks)
        for check in checks:
            check()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "harness_rep_" + rep.when, rep)
    ctx = getattr(item, "harness_ctx", None)
    if ctx is not None and rep.failed and rep.when in ("setup", "call"):
        rep.sections.append(("kept tmpdir", ctx.tmpdir))
