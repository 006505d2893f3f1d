"""Throughput of the cached final page through nginx with kept connections.

One nginx (one worker, files in the bench's tmpdir, a private loopback
port) passes each location to one backend over an upstream with
``keepalive 32`` and ``fastcgi_keep_conn on``; ``wrk`` loads one location
at a time for a fixed duration while only that backend runs. Per backend:
requests/s, and the backend's CPU time (utime + stime of every process in
its process group, from /proc) per request.

Backends: kembali (a cached ``succeeded``), the yardstick
(tests/bench/yardstick.c, answering with the very bytes kembali sent), nginx
serving the page's body as a static file (no backend, so no CPU figure),
and PHP-FPM (one static child, a page of the same bytes).

A backend that cannot run here (no wrk, no php-fpm, no nginx, no yardstick
binary) gives a row that says why instead of figures."""

import glob
import os
import re
import shutil
import socket
import subprocess
import time

import testenv

CLK_TCK = os.sysconf("SC_CLK_TCK")


class Skipped(Exception):
    """This backend cannot be measured here; the message says why."""


def group_cpu_s(pgid):
    """CPU seconds (user + system) used so far by the live processes of
    process group ``pgid``, threads included."""
    ticks = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
        except OSError:
            continue
        rest = stat[stat.rfind(")") + 2:].split()  # fields 3.. of proc(5)
        if int(rest[2]) == pgid:
            ticks += int(rest[11]) + int(rest[12])
    return ticks / CLK_TCK


def wait_connectable(path, proc, timeout=10.0, what="backend"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Skipped("%s exited with %s at start" % (what, proc.returncode))
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(path)
            return
        except OSError:
            time.sleep(0.02)
    raise Skipped("%s did not listen on %s within %.0f s" % (what, path, timeout))


# ---------------------------------------------------------------------------
# nginx with kept upstream connections
# ---------------------------------------------------------------------------

class BenchNginx(testenv.Nginx):
    """testenv.Nginx with one upstream per backend (keepalive 32,
    fastcgi_keep_conn on), a static location, and no access log.
    ``upstreams``: {location path: Unix socket path}; ``php``: (location,
    socket, script file) or None; ``static_dir``: served at /static/."""

    def __init__(self, tmpdir, upstreams, php=None, static_dir=None):
        self.upstreams = upstreams
        self.php = php
        self.static_dir = static_dir
        super().__init__(tmpdir, next(iter(upstreams.values())), start=False)
        for path in list(upstreams.values()) + ([php[1]] if php else []):
            d = os.path.dirname(path)
            os.chmod(d, os.stat(d).st_mode | 0o755)

    def conf(self, port):
        t = self.tmpdir
        temp = os.path.join(t, "nginx-temp")
        os.makedirs(temp, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""
        ups, locs = [], []
        for i, (loc, sock) in enumerate(sorted(self.upstreams.items())):
            ups.append("upstream b%d { server unix:%s; keepalive 32; keepalive_requests 1000000; }" % (i, sock))
            locs.append("""location = %s {
            include /etc/nginx/fastcgi_params;
            fastcgi_keep_conn on;
            fastcgi_pass b%d;
            fastcgi_read_timeout 40s;
        }""" % (loc, i))
        if self.php:
            loc, sock, script = self.php
            ups.append("upstream php { server unix:%s; keepalive 32; keepalive_requests 1000000; }" % sock)
            locs.append("""location = %s {
            include /etc/nginx/fastcgi_params;
            fastcgi_param SCRIPT_FILENAME %s;
            fastcgi_keep_conn on;
            fastcgi_pass php;
        }""" % (loc, script))
        if self.static_dir:
            locs.append("location /static/ { alias %s/; }" % self.static_dir)
        nl = "\n    "
        return f"""# written by tests/bench/throughput.py
daemon off;
master_process on;
worker_processes 1;
{user}pid {t}/nginx.pid;
error_log {self.error_log} warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    default_type text/html;
    {nl.join(ups)}
    server {{
        listen 127.0.0.1:{port};
        server_name {self.server_name};
        {nl.join(locs)}
    }}
}}
"""


# ---------------------------------------------------------------------------
# wrk
# ---------------------------------------------------------------------------

def wrk_bin():
    return shutil.which("wrk")


def _count(pattern, text):
    m = re.search(pattern, text)
    return int(m.group(1)) if m else 0


def run_wrk(url, duration, threads, connections):
    """Runs wrk; returns {"requests", "seconds", "rps", "errors", "non2xx", "text"}."""
    duration = max(1, int(round(duration)))  # wrk takes whole seconds
    argv = [wrk_bin(), "-t%d" % threads, "-c%d" % connections, "-d%ds" % duration, url]
    proc = testenv.spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=duration + 30)
    except subprocess.TimeoutExpired:
        testenv.kill_process(proc, 0)
        raise Skipped("wrk did not finish")
    text = out.decode("utf-8", "replace")
    m = re.search(r"(\d+) requests in ([\d.]+)(m?s)", text)
    if proc.returncode != 0 or not m:
        raise Skipped("wrk failed (exit %s): %s" % (proc.returncode, " ".join(text.split())[:200]))
    secs = float(m.group(2)) / (1000 if m.group(3) == "ms" else 1)
    errs = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    return {"requests": int(m.group(1)), "seconds": secs, "rps": int(m.group(1)) / secs,
            "errors": sum(int(x) for x in errs.groups()) if errs else 0,
            "non2xx": _count(r"Non-2xx or 3xx responses: (\d+)", text), "text": text}


# ---------------------------------------------------------------------------
# Backends: each start() returns a process group id whose CPU is counted (or
# None), and stop() ends what it started.
# ---------------------------------------------------------------------------

class Yardstick:
    def __init__(self, tmpdir, response_file):
        self.bin = os.path.join(testenv.top_builddir(), "tests", "bench", "yardstick")
        self.sock = testenv.socket_path(tmpdir, "yardstick.sock")
        self.tmpdir, self.response_file, self.proc = tmpdir, response_file, None

    def start(self):
        if not os.path.exists(self.bin):
            raise Skipped("%s is not built (make tests/bench/yardstick)" % self.bin)
        with open(os.path.join(self.tmpdir, "yardstick.log"), "ab") as log:
            self.proc = testenv.spawn([self.bin, self.sock, self.response_file], self.tmpdir,
                                      stdout=log, stderr=log)
        wait_connectable(self.sock, self.proc, what="yardstick")
        return self.proc.pid

    def stop(self):
        if self.proc:
            testenv.kill_process(self.proc)


def php_fpm_bin():
    """php-fpm, or Debian's versioned php-fpmX.Y (the newest), or None."""
    versioned = sorted(glob.glob("/usr/sbin/php-fpm[0-9]*"))
    return shutil.which("php-fpm") or (versioned[-1] if versioned else None)


class PhpFpm:
    """php-fpm in the foreground with a private pool: pm static, one child,
    on a private Unix socket; the page is ``hello.php`` printing ``body``."""

    def __init__(self, tmpdir, body):
        self.tmpdir = tmpdir
        self.sock = testenv.socket_path(tmpdir, "php-fpm.sock")
        self.script = os.path.join(tmpdir, "hello.php")
        self.body, self.proc = body, None

    def start(self):
        exe = php_fpm_bin()
        if not exe:
            raise Skipped("php-fpm is not installed (Debian: php-fpm)")
        marker = "KEMBALI_BENCH_PAGE"
        with open(self.script, "wb") as f:
            # a nowdoc: the page's bytes verbatim, whatever they contain
            f.write(b"<?php\nheader('Cache-Control: no-store');\necho <<<'" + marker.encode() + b"'\n"
                    + self.body + b"\n" + marker.encode() + b";\n")
        conf = os.path.join(self.tmpdir, "php-fpm.conf")
        root = os.geteuid() == 0
        with open(conf, "w") as f:
            f.write(f"""; written by tests/bench/throughput.py
[global]
pid = {self.tmpdir}/php-fpm.pid
error_log = {self.tmpdir}/php-fpm.log
daemonize = no
[bench]
{"user = root" + chr(10) + "group = root" if root else ""}
listen = {self.sock}
listen.mode = 0666
listen.backlog = 1024
pm = static
pm.max_children = 1
pm.max_requests = 0
""")
        argv = [exe, "-F", "-y", conf] + (["-R"] if root else [])
        with open(os.path.join(self.tmpdir, "php-fpm.stderr"), "ab") as err:
            self.proc = testenv.spawn(argv, self.tmpdir, stdout=err, stderr=err)
        wait_connectable(self.sock, self.proc, what="php-fpm")
        return self.proc.pid

    def stop(self):
        if self.proc:
            testenv.kill_process(self.proc)


class Running:
    """A backend that is already running (kembali): start/stop do nothing."""

    def __init__(self, pgid):
        self.pgid = pgid

    def start(self):
        return self.pgid

    def stop(self):
        pass


class NoBackend:
    def start(self):
        return None

    def stop(self):
        pass


# ---------------------------------------------------------------------------

def capture_page(k, sb, id="bench-1"):
    """Makes ``id`` a cached succeeded and returns kembali's FCGI_STDOUT bytes
    for it (the warm-up request that caches it)."""
    sb.put_tx(id, "succeeded")
    r = k.get("id=" + id)
    if r.header("kembali-status") != "succeeded":
        raise AssertionError("kembali did not answer succeeded for %s: %r" % (id, r))
    r2 = k.get("id=" + id)  # from the cache now
    return r2.stdout, r2.body


class Row:
    """One backend's figures over the rounds: the round with the most
    requests/s is reported (other load on the machine only slows a round
    down), with the CPU per request of that same round."""

    def __init__(self, name, path, backend):
        self.name, self.path, self.backend = name, path, backend
        self.pgid, self.skipped, self.note = None, None, ""
        self.rounds = []  # {"rps", "requests", "cpu_us", "errors", "upstream_errors"}

    def best(self):
        return max(self.rounds, key=lambda r: r["rps"]) if self.rounds else None

    def result(self):
        """{"backend", "rps", "rps_rounds", "requests", "cpu_us", "errors" (wrk's
        socket errors and non-2xx answers, all rounds), "upstream_errors"
        (nginx's, all rounds), "note"}, or {"backend", "skipped"}."""
        if self.skipped or not self.rounds:
            return {"backend": self.name, "skipped": self.skipped or "not measured"}
        b = self.best()
        return {"backend": self.name, "rps": b["rps"], "rps_rounds": [r["rps"] for r in self.rounds],
                "requests": b["requests"], "cpu_us": b["cpu_us"],
                "errors": sum(r["errors"] for r in self.rounds),
                "upstream_errors": sum(r["upstream_errors"] for r in self.rounds), "note": self.note}


def _start(row, ng, expect_body):
    try:
        row.pgid = row.backend.start()
        status, _, body = ng.http_get(row.path)
        if status != 200 or body != expect_body:
            row.note = "answer differs: HTTP %d, %d bytes (want 200, %d)" % (status, len(body), len(expect_body))
    except Skipped as e:
        row.skipped = str(e)
    except OSError as e:
        row.skipped = "no answer through nginx: %s" % e


def _load(row, ng, opts, warmup):
    url = ng.url(row.path)
    try:
        if warmup > 0:
            run_wrk(url, warmup, opts.threads, opts.connections)
        log0 = _error_lines(ng)
        cpu0 = group_cpu_s(row.pgid) if row.pgid else None
        w = run_wrk(url, opts.duration, opts.threads, opts.connections)
        cpu1 = group_cpu_s(row.pgid) if row.pgid else None
    except Skipped as e:
        row.skipped = str(e)
        return
    cpu_us = (cpu1 - cpu0) * 1e6 / w["requests"] if row.pgid and w["requests"] else None
    row.rounds.append({"rps": w["rps"], "requests": w["requests"], "cpu_us": cpu_us,
                       "errors": w["errors"] + w["non2xx"], "upstream_errors": _error_lines(ng) - log0})


def measure(rows, ng, expect_body, opts):
    """Starts every backend, then loads each in turn, ``opts.rounds`` times
    round-robin (so that a slow spell of the machine falls on all of them);
    stops them all. Returns each row's result()."""
    try:
        if not wrk_bin():
            raise Skipped("wrk is not installed (Debian: wrk)")
        if ng is None:
            raise Skipped("nginx is not available")
    except Skipped as e:
        for r in rows:
            r.skipped = str(e)
        return [r.result() for r in rows]
    try:
        for r in rows:
            _start(r, ng, expect_body)
        for i in range(max(1, opts.rounds)):
            for r in rows:
                if not r.skipped:
                    _load(r, ng, opts, opts.warmup if i == 0 else 0)
    finally:
        for r in rows:
            r.backend.stop()
    return [r.result() for r in rows]


def _error_lines(ng):
    """[error] lines in nginx's error log so far: with a backend that closes
    kept connections, nginx logs each reuse that finds it closed (and
    retries the request on a new connection)."""
    try:
        with open(ng.error_log, "rb") as f:
            return f.read().count(b"[error]")
    except OSError:
        return 0


def run(tmpdir, k, sb, opts):
    """The throughput rows, in order: yardstick, kembali, nginx static, PHP-FPM."""
    d = os.path.join(tmpdir, "throughput")
    os.makedirs(d, exist_ok=True)
    os.chmod(d, 0o755)
    stdout, body = capture_page(k, sb)
    response_file = os.path.join(d, "response.cgi")
    with open(response_file, "wb") as f:
        f.write(stdout)
    static = os.path.join(d, "static")
    os.makedirs(static, exist_ok=True)
    with open(os.path.join(static, "page.html"), "wb") as f:
        f.write(body)
    ys, php = Yardstick(d, response_file), PhpFpm(d, body)
    ng = None
    try:
        if os.path.exists(testenv.nginx_bin()):
            ng = BenchNginx(d, {"/kembali": k.addr, "/yardstick": ys.sock},
                            php=("/hello.php", php.sock, php.script), static_dir=static)
            ng.start()
    except AssertionError as e:
        ng = None
        print("nginx did not start: %s" % str(e)[-500:])
    rows = [Row("yardstick (epoll, raw FastCGI)", "/yardstick?id=bench-1", ys),
            Row("kembali (cached succeeded)", "/kembali?id=bench-1", Running(k.pid)),
            Row("nginx static file", "/static/page.html", NoBackend()),
            Row("PHP-FPM hello.php (1 child)", "/hello.php", php)]
    try:
        return measure(rows, ng, body, opts)
    finally:
        if ng:
            ng.stop()
