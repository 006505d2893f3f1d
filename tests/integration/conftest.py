"""pytest's hooks and fixtures for the integration tests (see
testenv/fixtures.py): every test gets its own folder (``tmpdir``, a str,
kept when the test fails), every process it starts is killed when it ends,
and the final checks it registered run when it passed."""

from testenv.fixtures import *  # noqa: F401,F403 - pytest finds the hooks and fixtures by name
