"""The integration tests' environment, one module per concern (harness.py
re-exports them all; conftest.py loads fixtures.py):

- env: the build and source trees, the binaries, ``Skip``, time limits
  (``timeout``), the environment a child gets;
- asserts: ``assert_eq``, ``assert_between``, ``assert_in``, ``wait_for``;
- fcgi: a FastCGI 1.0 client (``fcgi_request``, ``get``, ``Response``);
- procs: processes a test starts (``spawn``, killed when it ends), free
  ports, short Unix socket paths;
- logs: kembali's ``key=value`` log lines, Prometheus text;
- sandbox: ``Sandbox``, the Kasera stand-in, and its control API;
- kembali: ``Kembali``, the program under test, its files and log;
- nginx: ``Nginx`` in front of a FastCGI socket, ``http_get``;
- redis: ``Redis``, ``Sentinel`` and a small RESP client;
- sdbus: ``SystemdBus``, a private system bus with a stand-in for systemd's
  manager (the job on a unit: a restart or a stop);
- chromium: headless Chromium's DOM dumps and screenshots; cdp: Chromium
  driven over its DevTools protocol (``from testenv import cdp``);
- fixtures: pytest's hooks and fixtures (a folder per test, processes
  killed, final checks, time limits).
"""
