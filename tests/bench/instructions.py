"""CPU instructions per cached answer, counted by callgrind.

    python3 tests/bench/instructions.py [--bin KEMBALI] [--templates DIR]
                                        [--compare OTHER_KEMBALI] [--compare-templates DIR]
                                        [--counts 2000,4000] [--top 25] [--keep]
    make bench-instructions                       (from a build directory)

Starts the Kasera sandbox and then, for each count N, one kembali under
``valgrind --tool=callgrind`` (its own state_dir): it answers ``succeeded``
once from the sandbox, then serves N identical requests for that cached
transaction over ONE kept FastCGI connection (FCGI_KEEP_CONN, the params
nginx's stock fastcgi_params sends, as behind nginx with upstream
keepalive), then stops (SIGTERM). Everything but the N requests is the same
in every run, so

    instructions per cached answer = (Ir(N2) - Ir(N1)) / (N2 - N1)

with start-up, the first (uncached) answer and shutdown cancelled. It
prints that figure and the functions whose exclusive Ir per request
differs most from zero (callgrind_annotate of both runs, subtracted): where
the instructions of one cached answer go.

--bin runs another kembali binary (KEMBALI_BIN works too); --compare
measures a second one (an older commit's build) in the same way and lists
the functions by how much they changed between the two; --templates and
--compare-templates give the templates each build expects (default: the
templates folder beside its build directory, else this tree's).
The count is deterministic up to timers that fire while the runs last
(a few hundred instructions per request at most); run twice to see it."""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import testenv  # noqa: E402
from testenv.env import _tail  # noqa: E402
from testenv.fcgi import fcgi_receive, fcgi_request_bytes  # noqa: E402

TX = "instr-1"


def nginx_params(query, host="toko-a.test"):
    """What nginx 1.x sends with its stock fastcgi_params for GET /kembali?query."""
    return {
        "QUERY_STRING": query, "REQUEST_METHOD": "GET", "CONTENT_TYPE": "", "CONTENT_LENGTH": "",
        "SCRIPT_NAME": "/kembali", "REQUEST_URI": "/kembali?" + query, "DOCUMENT_URI": "/kembali",
        "DOCUMENT_ROOT": "/usr/share/nginx/html", "SERVER_PROTOCOL": "HTTP/1.1",
        "REQUEST_SCHEME": "http", "GATEWAY_INTERFACE": "CGI/1.1", "SERVER_SOFTWARE": "nginx/1.22.1",
        "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "40000", "REMOTE_USER": "",
        "SERVER_ADDR": "127.0.0.1", "SERVER_PORT": "8080", "SERVER_NAME": "localhost",
        "REDIRECT_STATUS": "200", "HTTP_HOST": host,
    }


class Callgrinded(testenv.Kembali):
    """kembali started under callgrind, its profile written to ``out``."""

    def __init__(self, tmpdir, out, **kw):
        self.out = out
        super().__init__(tmpdir, **kw)

    def argv(self):
        return ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + self.out] + super().argv()


def run_once(tmp, sb, n, bin, templates):
    """One kembali under callgrind serving n cached answers; returns its profile's path."""
    d = os.path.join(tmp, "n%d" % n)
    os.makedirs(os.path.join(d, "state"))
    out = os.path.join(d, "callgrind.out")

    def config(k):
        shop = testenv.make_shop("toko-a", k.key_path("a"))
        return testenv.make_config(sb, [shop], state_dir=os.path.join(d, "state"), templates_dir=templates)

    k = Callgrinded(d, out, config=config, keys={"a": testenv.DEFAULT_KEY}, bin=bin)
    k.start(timeout=120)
    try:
        first = k.get("id=" + TX, host="toko-a.test", timeout=60)
        if first.header("kembali-status") != "succeeded":
            raise AssertionError("kembali did not answer succeeded: %r" % first)
        req = fcgi_request_bytes(nginx_params("id=" + TX), keep_conn=True)
        s = testenv.fcgi_connect(k.addr, timeout=60)
        try:
            for i in range(n):
                s.sendall(req)
                r = fcgi_receive(s, timeout=60, close=False)
                if r.status != 200 or r.header("kembali-status") != "succeeded":
                    raise AssertionError("request %d: %r" % (i, r))
        finally:
            s.close()
        rc = k.stop(timeout=120)
        if rc != 0:
            raise AssertionError("kembali exited %s; log:\n%s" % (rc, _tail(k.log_path)))
    finally:
        if k.running():
            testenv.kill_process(k.proc)
    return out


def total_ir(path):
    with open(path) as f:
        for line in f:
            if line.startswith("summary:") or line.startswith("totals:"):
                return int(line.split()[1])
    raise AssertionError("no summary line in %s" % path)


def per_function(path):
    """{function: exclusive Ir} from callgrind_annotate."""
    text = subprocess.run(["callgrind_annotate", "--threshold=100", "--inclusive=no", "--auto=no", path],
                          capture_output=True, text=True, check=True).stdout
    out = {}
    for line in text.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\(\s*[\d.]+%\)\s+)?(\S.*?)(?:\s+\[.*\])?$", line)
        if m and ":" in m.group(2):
            name = m.group(2)
            out[name] = out.get(name, 0) + int(m.group(1).replace(",", ""))
    return out


def measure(sb, tmp, tag, bin, templates, n1, n2):
    """(instructions per answer, {function: exclusive Ir per answer}) of one build."""
    d = os.path.join(tmp, tag)
    os.makedirs(d)
    p1 = run_once(d, sb, n1, bin, templates)
    p2 = run_once(d, sb, n2, bin, templates)
    ir1, ir2 = total_ir(p1), total_ir(p2)
    print("%s: %s" % (tag, bin))
    print("  Ir(%d) = %d, Ir(%d) = %d" % (n1, ir1, n2, ir2))
    print("  instructions per cached answer: %.0f" % ((ir2 - ir1) / (n2 - n1)))
    f1, f2 = per_function(p1), per_function(p2)
    return (ir2 - ir1) / (n2 - n1), {k: (f2.get(k, 0) - f1.get(k, 0)) / (n2 - n1) for k in set(f1) | set(f2)}


def short(name):
    """A function's name without its file's directories (the same in two builds)."""
    where, _, fn = name.rpartition(":")
    return "%s:%s" % (os.path.basename(where), fn)


def templates_of(bin, given):
    if given is not None:
        return given
    beside = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(bin))), "templates")
    return beside if os.path.isdir(beside) else os.path.join(testenv.top_srcdir(), "templates")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=None, help="the kembali binary (default: this build's)")
    ap.add_argument("--templates", default=None, help="the templates folder that binary uses")
    ap.add_argument("--compare", default=None, metavar="BIN",
                    help="measure this other kembali binary too and list the functions that changed")
    ap.add_argument("--compare-templates", default=None, help="the templates folder --compare's binary uses")
    ap.add_argument("--counts", default="2000,4000", help="two request counts (default 2000,4000)")
    ap.add_argument("--top", type=int, default=25, help="functions to list (0: none)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (the profiles)")
    opts = ap.parse_args()
    if not shutil.which("valgrind") or not shutil.which("callgrind_annotate"):
        print("skipped: valgrind (callgrind) is not installed")
        return 0
    bin = os.path.abspath(opts.bin or testenv.kembali_bin())
    n1, n2 = (int(x) for x in opts.counts.split(","))
    tmp = tempfile.mkdtemp(prefix="kembali-instr-")
    sb = testenv.Sandbox(tmp)
    try:
        sb.put_tx(TX, "succeeded")
        builds = [("this", bin, templates_of(bin, opts.templates))]
        if opts.compare:
            other = os.path.abspath(opts.compare)
            builds.insert(0, ("other", other, templates_of(other, opts.compare_templates)))
        got = [measure(sb, tmp, tag, b, t, n1, n2) for tag, b, t in builds]
    finally:
        sb.stop()
    if opts.top:
        fns = {}
        for i, (_, per) in enumerate(got):
            for k, v in per.items():
                fns.setdefault(short(k), [0.0] * len(got))[i] += v
        rows = sorted(fns.items(), key=lambda kv: -abs(kv[1][-1] - (kv[1][0] if len(got) > 1 else 0)))
        if len(got) == 1:
            print("exclusive Ir per request, by function:")
            for k, (v,) in rows[:opts.top]:
                print("  %9.1f  %s" % (v, k))
        else:
            print("exclusive Ir per request, by function: other, this, this - other (largest changes first):")
            for k, (a, b) in rows[:opts.top]:
                print("  %9.1f %9.1f %+9.1f  %s" % (a, b, b - a, k))
            print("  %9.0f %9.0f %+9.0f  in all" % (got[0][0], got[1][0], got[1][0] - got[0][0]))
    if opts.keep:
        print("profiles kept in %s" % tmp)
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
