"""The integration tests' environment, one module per concern; the
package gives every public name of them (``testenv.Kembali``,
``from testenv import assert_eq``), and conftest.py loads fixtures.py:

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

A test file looks like::

    import testenv
    from testenv import assert_eq

    def test_invalid_id(tmpdir):
        with testenv.Sandbox(tmpdir) as sb, testenv.Kembali(tmpdir, ...) as k:
            r = k.get("id=%00")
            assert_eq(r.status, 400)

pytest runs it (conftest.py: ``tmpdir`` is the test's own folder, a str,
kept when it fails; every process started through the harness is killed
when the test ends); ``@testenv.timeout(N)`` sets its time limit.
"""

from testenv.asserts import *  # noqa: F401,F403
from testenv.chromium import *  # noqa: F401,F403
from testenv.env import *  # noqa: F401,F403
from testenv.fcgi import *  # noqa: F401,F403
from testenv.kembali import *  # noqa: F401,F403
from testenv.logs import *  # noqa: F401,F403
from testenv.nginx import *  # noqa: F401,F403
from testenv.procs import *  # noqa: F401,F403
from testenv.redis import *  # noqa: F401,F403
from testenv.sandbox import *  # noqa: F401,F403
from testenv.sdbus import *  # noqa: F401,F403
