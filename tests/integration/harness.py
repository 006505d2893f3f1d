"""The integration tests' harness, as one name: it re-exports the testenv
package, where each concern has its module (see testenv/__init__.py), so
that tests (and tests/soak, tests/bench, tests/package) keep writing
``harness.Kembali``, ``harness.assert_eq`` and so on.

A test file looks like::

    import harness
    from harness import assert_eq

    def test_invalid_id(tmpdir):
        with harness.Sandbox(tmpdir) as sb, harness.Kembali(tmpdir, ...) as k:
            r = k.get("id=%00")
            assert_eq(r.status, 400)

pytest runs it (conftest.py: ``tmpdir`` is the test's own folder, a str,
kept when it fails; every process started through the harness is killed
when the test ends); ``@harness.timeout(N)`` sets its time limit.
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
# what tests/soak and the self-test reach behind the names
from testenv.env import _LazyTail, _merge_env, _tail  # noqa: F401
from testenv.fcgi import _addr_str  # noqa: F401
from testenv.logs import _matches  # noqa: F401
from testenv.procs import _all_procs, _kill_all, _tmpdir_or_new  # noqa: F401
