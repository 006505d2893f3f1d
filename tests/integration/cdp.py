"""Headless Chromium over its DevTools protocol: testenv/cdp.py, under the
name the tests import."""

from testenv.cdp import *  # noqa: F401,F403
