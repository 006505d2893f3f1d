"""``Nginx``: a throwaway nginx in front of a FastCGI socket; ``http_get``."""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import socket
import subprocess
import time

from .env import _tail
from .procs import free_port, kill_process, spawn


def http_get(port: int, path: str, headers: dict | None = None, method: str = "GET",
             timeout: float = 60.0):
    """One HTTP request to 127.0.0.1:port: (status, {lowercase name: value},
    body). Repeated headers are joined with ", "."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        body = resp.read()
        out: dict[str, str] = {}
        for name, value in resp.getheaders():
            n = name.lower()
            out[n] = out[n] + ", " + value if n in out else value
        return resp.status, out, body
    finally:
        conn.close()


def nginx_bin() -> str:
    return shutil.which("nginx") or "/usr/sbin/nginx"


class Nginx:
    """A throwaway nginx (in the foreground, files in ``tmpdir``) passing
    ``location /kembali`` to ``kembali_sock`` (a Unix socket path, a (host,
    port) tuple, or anything with ``.addr``). Started at construction."""

    def __init__(self, tmpdir: str, kembali_sock, location_extra: str = "",
                 server_name: str = "shop.test", server_extra: str = "", start: bool = True,
                 keepalive: int = 0):
        """With keepalive > 0, nginx keeps that many idle FastCGI connections
        (an upstream block with ``keepalive``, ``fastcgi_keep_conn on``), as
        the README recommends."""
        self.tmpdir = tmpdir
        addr = getattr(kembali_sock, "addr", kembali_sock)
        self.upstream = "unix:" + addr if isinstance(addr, str) else "%s:%d" % tuple(addr)
        self.keepalive = keepalive
        self.location_extra = location_extra
        self.server_name = server_name
        self.server_extra = server_extra
        self.conf_path = os.path.join(tmpdir, "nginx.conf")
        self.error_log = os.path.join(tmpdir, "error.log")
        self.access_log = os.path.join(tmpdir, "access.log")
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        # nginx workers must reach the socket: open up its directory and ours.
        for d in {tmpdir, os.path.dirname(addr) if isinstance(addr, str) else ""}:
            if d:
                os.chmod(d, os.stat(d).st_mode | 0o755)
        if start:
            self.start()

    def conf(self, port: int) -> str:
        t = self.tmpdir
        temp = os.path.join(t, "nginx-temp")
        os.makedirs(temp, exist_ok=True)
        user = "user root;\n" if os.geteuid() == 0 else ""
        if self.keepalive:
            upstream = "upstream kembali {{ server {}; keepalive {}; }}".format(self.upstream, self.keepalive)
            passing = "fastcgi_pass kembali;\n            fastcgi_keep_conn on;"
        else:
            upstream = ""
            passing = "fastcgi_pass %s;" % self.upstream
        return f"""# written by tests/integration/testenv/nginx.py
daemon off;
master_process on;
worker_processes 1;
{user}pid {t}/nginx.pid;
error_log {self.error_log} info;
events {{ worker_connections 1024; }}
http {{
    access_log {self.access_log};
    client_body_temp_path {temp}/client_body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
    default_type application/octet-stream;
    {upstream}
    server {{
        listen 127.0.0.1:{port};
        server_name {self.server_name};
        {self.server_extra}
        location /kembali {{
            include /etc/nginx/fastcgi_params;
            {passing}
            fastcgi_read_timeout 40s;
            {self.location_extra}
        }}
    }}
}}
"""

    def start(self, timeout: float = 10.0, attempts: int = 5) -> "Nginx":
        last = ""
        for _ in range(attempts):
            port = free_port()
            with open(self.conf_path, "w") as f:
                f.write(self.conf(port))
            with open(os.path.join(self.tmpdir, "nginx.stderr"), "ab") as err:
                self.proc = spawn([nginx_bin(), "-p", self.tmpdir + "/", "-c", self.conf_path,
                                   "-e", self.error_log], self.tmpdir,
                                  stdout=subprocess.DEVNULL, stderr=err)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                except OSError:
                    time.sleep(0.02)
                    continue
                time.sleep(0.05)  # the port may be someone else's if nginx failed to bind
                if self.proc.poll() is None:
                    self.port = port
                    return self
            last = _tail(self.error_log) + _tail(os.path.join(self.tmpdir, "nginx.stderr"))
            kill_process(self.proc)
            if "in use" not in last:
                break
        raise AssertionError("nginx did not start; error log:\n" + last)

    def url(self, path_and_query: str = "/kembali") -> str:
        return "http://127.0.0.1:%d%s" % (self.port, path_and_query)

    def http_get(self, path: str, headers: dict | None = None, method: str = "GET",
                 timeout: float = 60.0):
        """(status, {lowercase name: value}, body); Host defaults to server_name."""
        return http_get(self.port, path, dict({"Host": self.server_name}, **(headers or {})), method, timeout)

    def error_log_text(self) -> str:
        return _tail(self.error_log, 1 << 30)

    def stop(self, timeout: float = 10.0):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_process(self.proc, 0)
        return self.proc.returncode if self.proc else None

    def __enter__(self):
        if self.proc is None:
            self.start()
        return self

    def __exit__(self, *exc):
        self.stop()
        return False
