"""The integration tests' fixtures and hooks (tests/integration/testenv/fixtures.py)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from testenv.fixtures import *  # noqa: E402,F401,F403 - pytest finds the hooks and fixtures by name
