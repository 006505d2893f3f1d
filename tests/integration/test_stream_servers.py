"""The streamed page behind every web server the README names: Apache
mod_proxy_fcgi (flushpackets=on), mod_fcgid (FcgidOutputBufferSize 0),
lighttpd (server.stream-response-body), each passing the waiting top on
long before the end; and mod_fcgid with its default output buffer, which
holds the whole answer: the buyer gets the whole, valid page at the end."""

import json
import os
import pwd
import shutil
import signal

import testenv
import kit
import test_apache
import test_servers
from testenv import assert_eq
from test_stream import http_stream, dechunk, last_status


class ApacheWith(test_apache.Apache):
    """test_apache's Apache with our own handler lines."""

    def __init__(self, tmpdir, handler, user=None):
        self.handler_conf = handler
        super().__init__(tmpdir, "", "", user)

    def _handler(self, tmpdir, config_path, binary, cgi):
        return self.handler_conf


def require_apache():
    if not os.path.exists(test_apache.APACHE) or not os.path.exists(test_apache.MODULES + "/mod_fcgid.so"):
        if os.environ.get("KEMBALI_REQUIRE_APACHE") == "1":
            raise AssertionError("apache2 or libapache2-mod-fcgid is not installed")
        raise testenv.Skip("apache2 or libapache2-mod-fcgid is not installed")


def fcgid_setup(tmpdir, buffer_line):
    """kembali under mod_fcgid (as test_apache runs it), with buffer_line."""
    require_apache()
    binary = os.path.join(tmpdir, "kembali")
    shutil.copy(testenv.kembali_bin(), binary)
    templates = os.path.join(tmpdir, "templates")
    shutil.copytree(os.path.join(testenv.top_srcdir(), "templates"), templates)
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    user = "www-data" if os.geteuid() == 0 else None
    keyf = testenv.write_secret(os.path.join(tmpdir, "key-a"), kit.KEY)
    state = os.path.join(tmpdir, "apache-state")
    os.makedirs(state, mode=0o700)
    cfg = testenv.make_config(sb, [testenv.make_shop("toko-a", keyf)], state_dir=state, templates_dir=templates,
                              schedule_ms=kit.FAST)
    cfg_path = os.path.join(tmpdir, "kembali.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    if user:
        pw = pwd.getpwnam(user)
        for p in (state, keyf):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(tmpdir, 0o755)
    for d in ("run", "fcgid"):
        os.makedirs(os.path.join(tmpdir, d), exist_ok=True)
        if user:
            os.chown(os.path.join(tmpdir, d), pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
    M = test_apache.MODULES
    handler = f"""LoadModule fcgid_module {M}/mod_fcgid.so
Mutex flock:{tmpdir}/run fcgid-proctbl fcgid-pipe
FcgidIPCDir {tmpdir}/fcgid
FcgidProcessTableFile {tmpdir}/fcgid/table
FcgidIOTimeout 60
{buffer_line}
FcgidInitialEnv KEMBALI_CONFIG {cfg_path}
ScriptAlias /kembali {binary}
<Location /kembali>
    SetHandler fcgid-script
    Options +ExecCGI
    Require all granted
</Location>
"""
    return sb, ApacheWith(tmpdir, handler, user)


def check_streamed(port, sb, id):
    kit.pending_then(sb, id, 2, "succeeded")  # the result 2.2 s after the first read
    first, end, hd, body = http_stream(port, "/kembali?id=" + id, {"Host": "toko-a.test"})
    if hd.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    assert_eq(hd.get("kembali-status"), "checking")
    assert_eq(last_status(body), "succeeded")
    assert_eq(body.count(b"<html"), 1)
    assert body.rstrip().endswith(b"</html>")
    assert first is not None and first < end - 1.5, "the top came first: at %.3f s, the end at %.3f s" % (first, end)
    return first, end


@testenv.timeout(90)
def test_apache_proxy_fcgi_flushpackets(tmpdir):
    require_apache()
    port = testenv.free_port()
    sb, ks = kit.start_many(tmpdir, 1, listen="127.0.0.1:%d" % port)
    M = test_apache.MODULES
    ap = ApacheWith(tmpdir, f"""LoadModule proxy_module {M}/mod_proxy.so
LoadModule proxy_fcgi_module {M}/mod_proxy_fcgi.so
ProxyPass "/kembali" "fcgi://127.0.0.1:{port}/" flushpackets=on
""")
    try:
        first, end = check_streamed(ap.port, sb, "t1")
        print("# mod_proxy_fcgi flushpackets=on: top at %.3f s, end at %.3f s" % (first, end))
    finally:
        ap.stop()


@testenv.timeout(90)
def test_apache_fcgid_output_buffer_0(tmpdir):
    sb, ap = fcgid_setup(tmpdir, "FcgidOutputBufferSize 0")
    try:
        testenv.wait_for(lambda: ap.get("/kembali?id=bad%20id")[0] == 400, 30, msg="mod_fcgid serving")
        first, end = check_streamed(ap.port, sb, "t1")
        print("# mod_fcgid FcgidOutputBufferSize 0: top at %.3f s, end at %.3f s" % (first, end))
    finally:
        ap.stop()


@testenv.timeout(90)
def test_apache_fcgid_default_buffers_the_whole_page(tmpdir):
    """mod_fcgid's default output buffer: nothing until the end, then the
    whole page, valid, with its final word last."""
    sb, ap = fcgid_setup(tmpdir, "")
    try:
        testenv.wait_for(lambda: ap.get("/kembali?id=bad%20id")[0] == 400, 30, msg="mod_fcgid serving")
        kit.pending_then(sb, "t1", 2, "failed")
        first, end, hd, body = http_stream(ap.port, "/kembali?id=t1", {"Host": "toko-a.test"})
        if hd.get("transfer-encoding") == "chunked":
            body = dechunk(body)
        assert_eq(hd.get("kembali-status"), "checking")
        assert_eq(last_status(body), "failed")
        assert_eq(body.count(b"<html"), 1)
        assert_eq(body.count(b"</html>"), 1)
        assert body.rstrip().endswith(b"</html>")
        assert end - first < 0.5, "buffered to the end: first byte %.3f s, end %.3f s" % (first, end)
    finally:
        ap.stop()


@testenv.timeout(90)
def test_lighttpd_stream_response_body(tmpdir):
    lighttpd = test_servers.require(test_servers.LIGHTTPD)
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    cfg = test_servers.config_file(tmpdir, sb)
    port = testenv.free_port()
    docs = os.path.join(tmpdir, "docs")
    os.makedirs(docs)
    conf = os.path.join(tmpdir, "lighttpd.conf")
    with open(conf, "w") as f:
        f.write('''server.modules = ("mod_fastcgi")
server.document-root = "%(docs)s"
server.bind = "127.0.0.1"
server.port = %(port)d
server.errorlog = "%(tmp)s/lighttpd-error.log"
server.pid-file = "%(tmp)s/lighttpd.pid"
server.stream-response-body = 2
fastcgi.server = ("/kembali" => (( "socket" => "%(sock)s",
  "bin-path" => "%(bin)s", "bin-environment" => ("KEMBALI_CONFIG" => "%(cfg)s"),
  "max-procs" => 1, "check-local" => "disable" )))
''' % {"docs": docs, "port": port, "tmp": tmpdir, "sock": testenv.socket_path(tmpdir, "kembali.sock"),
       "bin": testenv.kembali_bin(), "cfg": cfg})
    with open(os.path.join(tmpdir, "lighttpd.out"), "wb") as out:
        proc = testenv.spawn([lighttpd, "-D", "-f", conf], tmpdir, stdout=out, stderr=out)
    try:
        testenv.wait_for(lambda: test_servers.http_get(port, "/kembali?id=bad%20id")[0] == 400, 30,
                         msg="lighttpd serving")
        first, end = check_streamed(port, sb, "t1")
        print("# lighttpd stream-response-body 2: top at %.3f s, end at %.3f s" % (first, end))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)


if __name__ == "__main__":
    testenv.run(globals())
