"""The README's Caddy and Apache mod_proxy_fcgi configurations, as written
(taken from README.md; only the site's address and the socket's path are
the test's), run by the real servers (Debian's caddy; apache2 with
mod_proxy_fcgi) in front of a real kembali: a final page, a JSON answer, a
request held until its read finds the final status, and the shop named by
the configuration's KEMBALI_SHOP."""

import os
import re
import shutil
import socket
import subprocess
import threading

import testenv
import kit
from testenv import assert_eq, assert_in

README_SOCKET = "/run/kembali/kembali.sock"
APACHE = "/usr/sbin/apache2"
MODULES = "/usr/lib/apache2/modules"


def readme():
    with open(os.path.join(testenv.top_srcdir(), "README.md")) as f:
        return f.read()


def readme_caddy():
    """The README's Caddy site block, verbatim."""
    m = re.search(r"^( *)toko-a\.example \{\n.*?^\1\}$", readme(), re.S | re.M)
    assert m, "the README has a Caddy site block for toko-a.example"
    return m.group(0)


def readme_apache():
    """The README's <Location "/kembali"> block for mod_proxy_fcgi, verbatim."""
    m = re.search(r'^( *)<Location "/kembali">\n(?:(?!^\1</Location>).)*?ProxyPass .*?^\1</Location>$',
                  readme(), re.S | re.M)
    assert m, "the README has a mod_proxy_fcgi <Location> block"
    return m.group(0)


def reachable_kembali(tmpdir, user):
    """kit.start's kembali (shop toko-a, hosts toko-a.test) on a socket that
    `user` (a web server's worker, or None for root) can reach."""
    sb, k = kit.start(tmpdir)
    if user is not None:
        for d in {tmpdir, os.path.dirname(k.addr)}:
            os.chmod(d, os.stat(d).st_mode | 0o755)
        os.chmod(k.addr, 0o666)
    return sb, k


def wait_port(proc, port, what, log):
    def up():
        if proc.poll() is not None:
            raise AssertionError("%s exited %s:\n%s" % (what, proc.returncode, log()))
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return True
        except OSError:
            return False
    testenv.wait_for(up, 30, msg=what + " listening")


def check_answers(sb, k, get):
    """What the buyer gets through the server: `get(path, headers)` ->
    (status, headers, body). The shop comes from KEMBALI_SHOP (the Host,
    shop.test, belongs to no shop)."""
    sb.put_tx("p1", "succeeded")
    status, headers, body = get("/kembali?id=p1&status=failed", {})
    assert_eq((status, headers.get("kembali-status")), (200, "succeeded"))
    assert_eq(headers.get("cache-control"), "no-store")
    assert_in(b'data-status="succeeded"', body)
    status, headers, body = get("/kembali?id=p1", {"Accept": "application/json"})
    assert_eq(body.strip(), b'{"id":"p1","status":"succeeded","final":true}')
    status, headers, body = get("/kembali?id=bad%20id", {})
    assert_eq((status, headers.get("kembali-status")), (400, "invalid"))
    # held until the third read finds it failed, through the server's timeout
    kit.pending_then(sb, "p2", 2, "failed")
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", get("/kembali?id=p2", {})))
    th.start()
    th.join(60)
    status, headers, body = out["r"]
    assert_eq((status, headers.get("kembali-status")), (200, "failed"))
    assert_eq(len(sb.reads("p2")), 3)
    held = int(k.wait_log(30, event="request", id="p2")["ms"]) / 1000
    assert held >= 2.2 - 0.003, held
    assert_eq({l["shop"] for l in k.find_log(event="request")}, {"toko-a"})


def connections(k, n, port):
    """FastCGI connections kembali accepted for n answers through the server."""
    before = k.metrics()["kembali_fastcgi_connections_total"]
    for _ in range(n):
        status, headers, _ = testenv.http_get(port, "/kembali?id=p1", {"Host": "shop.test"})
        assert_eq(headers.get("kembali-status"), "succeeded")
    return int(k.metrics()["kembali_fastcgi_connections_total"] - before)


def test_readme_caddy(tmpdir):
    caddy = shutil.which("caddy")
    if caddy is None:
        if os.environ.get("KEMBALI_REQUIRE_SERVERS") == "1":
            raise AssertionError("caddy is not installed")
        raise testenv.Skip("caddy is not installed")
    block = readme_caddy()
    assert_in("unix/" + README_SOCKET, block)
    sb, k = reachable_kembali(tmpdir, None)
    port = testenv.free_port()
    site = block.replace("unix/" + README_SOCKET, "unix/" + k.addr)
    site = site.replace("toko-a.example {", "http://:%d {" % port, 1)  # any host, on the test's port
    conf = os.path.join(tmpdir, "Caddyfile")
    with open(conf, "w") as f:
        f.write("{\n\tadmin off\n\tauto_https off\n\tstorage file_system %s/caddy-data\n}\n%s\n" % (tmpdir, site))
    out = os.path.join(tmpdir, "caddy.log")
    env = dict(os.environ, HOME=tmpdir, XDG_DATA_HOME=tmpdir + "/xdg-data", XDG_CONFIG_HOME=tmpdir + "/xdg-config")
    proc = testenv.spawn([caddy, "run", "--config", conf, "--adapter", "caddyfile"], tmpdir, env=env,
                         stdout=open(out, "wb"), stderr=subprocess.STDOUT)
    wait_port(proc, port, "caddy", lambda: open(out, errors="replace").read())
    check_answers(sb, k, lambda path, h: testenv.http_get(port, path, dict({"Host": "shop.test"}, **h)))
    # Caddy's FastCGI transport: a connection per request (as the README says)
    print("# 20 answers through Caddy: %d FastCGI connections" % connections(k, 20, port))
    # `handle /kembali` is that path only
    status, headers, body = testenv.http_get(port, "/kembali-metrics?format=metrics", {"Host": "shop.test"})
    assert_eq((status, headers.get("kembali-status"), body), (200, None, b""), "Caddy's own empty answer")
    testenv.kill_process(proc)


def test_readme_apache_proxy_fcgi(tmpdir):
    if not os.path.exists(APACHE) or not os.path.exists(MODULES + "/mod_proxy_fcgi.so"):
        if os.environ.get("KEMBALI_REQUIRE_APACHE") == "1":
            raise AssertionError("apache2 with mod_proxy_fcgi is not installed")
        raise testenv.Skip("apache2 with mod_proxy_fcgi is not installed")
    block = readme_apache()
    assert_in("unix:%s|fcgi://" % README_SOCKET, block)
    user = "www-data" if os.geteuid() == 0 else None
    sb, k = reachable_kembali(tmpdir, user)
    port = testenv.free_port()
    os.makedirs(os.path.join(tmpdir, "run"), exist_ok=True)
    error_log = os.path.join(tmpdir, "apache-error.log")
    user_lines = "User %s\nGroup %s\n" % (user, user) if user else ""
    conf = f"""ServerRoot {tmpdir}
ServerName shop.test
Listen 127.0.0.1:{port}
PidFile {tmpdir}/run/httpd.pid
DefaultRuntimeDir {tmpdir}/run
Mutex file:{tmpdir}/run default
ErrorLog {error_log}
LogLevel warn
{user_lines}LoadModule mpm_event_module {MODULES}/mod_mpm_event.so
LoadModule authz_core_module {MODULES}/mod_authz_core.so
LoadModule env_module {MODULES}/mod_env.so
LoadModule proxy_module {MODULES}/mod_proxy.so
LoadModule proxy_fcgi_module {MODULES}/mod_proxy_fcgi.so
{block.replace(README_SOCKET, k.addr)}
"""
    path = os.path.join(tmpdir, "httpd.conf")
    with open(path, "w") as f:
        f.write(conf)
    out = os.path.join(tmpdir, "apache.out")
    proc = testenv.spawn([APACHE, "-d", tmpdir, "-f", path, "-DFOREGROUND"], tmpdir,
                         stdout=open(out, "wb"), stderr=subprocess.STDOUT)

    def log():
        return "".join(open(p, errors="replace").read() for p in (out, error_log) if os.path.exists(p))
    wait_port(proc, port, "apache", log)
    check_answers(sb, k, lambda p, h: testenv.http_get(port, p, dict({"Host": "shop.test"}, **h)))
    # enablereuse=on: Apache keeps its connections to kembali for the next requests
    opened = connections(k, 20, port)
    print("# 20 answers through Apache: %d FastCGI connections" % opened)
    assert opened <= 10, "Apache reused its FastCGI connections (%d opened)" % opened
    testenv.kill_process(proc)


if __name__ == "__main__":
    testenv.run(globals())
