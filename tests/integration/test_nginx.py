"""End to end through a real nginx (started here, fastcgi_read_timeout 40 s)
and a real headless Chromium: what a buyer's browser gets."""

import os
import shutil
import threading
import time

import testenv
import kit
from testenv import assert_eq, assert_in, assert_between


def setup(tmpdir, **kw):
    sb, k = kit.start(tmpdir, **kw)
    ng = testenv.Nginx(tmpdir, k)
    return sb, k, ng


def test_final_page_through_nginx(tmpdir):
    sb, k, ng = setup(tmpdir)
    sb.put_tx("t1", "succeeded")
    status, headers, body = ng.http_get("/kembali?id=t1&status=failed")
    assert_eq(status, 200)
    assert_eq(headers.get("kembali-status"), "succeeded")
    assert_eq(headers.get("cache-control"), "no-store")
    assert_in("frame-ancestors 'none'", headers.get("content-security-policy", ""))
    assert_in(b'data-status="succeeded"', body)
    status, headers, body = ng.http_get("/kembali?id=t1", headers={"Accept": "application/json"})
    assert_eq(headers.get("kembali-status"), "succeeded")
    assert_eq(body.strip(), b'{"id":"t1","status":"succeeded","final":true}')
    status, headers, body = ng.http_get("/kembali?id=bad%20id")
    assert_eq(status, 400)
    status, headers, body = ng.http_get("/kembali?id=t1", method="POST")
    assert_eq(status, 405)


def test_held_request_through_nginx(tmpdir):
    sb, k, ng = setup(tmpdir)
    kit.pending_then(sb, "t1", 2, "failed")
    sb.put_tx("t2", "pending")
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("t2", ng.http_get("/kembali?id=t2")))
    th.start()
    t0 = time.monotonic()
    status, headers, body = ng.http_get("/kembali?id=t1")
    took = time.monotonic() - t0
    assert_eq(headers.get("kembali-status"), "failed")
    # held through nginx until the third read (2.2 s after the first) found
    # it failed; kembali's log says how long it held the request
    kit.check_pace(sb, [k], "t1", [0, 1.1, 2.2])
    held = int(k.wait_log(30, event="request", id="t1")["ms"]) / 1000
    assert_between(held, 2.2 - 0.003, 2.2 + 0.5, "held by kembali")
    assert took >= held, (took, held)
    th.join(60)
    assert_eq(out["t2"][1].get("kembali-status"), "checking")
    assert_in(b"Pembayaran sedang diperiksa", out["t2"][2])


@testenv.timeout(90)
def test_default_schedule_through_nginx(tmpdir):
    """A 34 s hold fits nginx's fastcgi_read_timeout of 40 s."""
    sb, k, ng = setup(tmpdir, schedule=None)
    sb.put_tx("t1", "pending")
    t0 = time.monotonic()
    status, headers, body = ng.http_get("/kembali?id=t1", timeout=60)
    took = time.monotonic() - t0
    assert_eq(status, 200)
    assert_eq(headers.get("kembali-status"), "checking")
    # held by kembali (its log) until the last read; the test's own clock
    # only bounds it below (a busy machine stretches it)
    held = int(k.wait_log(30, event="request", id="t1")["ms"]) / 1000
    assert_between(held, 32.4, 34.0, "held by kembali")
    assert took >= 32.4, took
    assert_eq(len(sb.reads("t1")), 7)


def test_chromium_renders_the_page(tmpdir):
    testenv.chromium_or_skip()
    sb, k, ng = setup(tmpdir)
    sb.put_tx("t1", "expired")
    dom = testenv.chromium_dump_dom(ng.url("/kembali?id=t1"))
    assert_in('data-status="expired"', dom)
    assert_in('lang="id"', dom)
    assert_in("t1", dom)
    shot = testenv.chromium_screenshot(ng.url("/kembali?id=t1"), os.path.join(tmpdir, "expired.png"))
    assert os.path.getsize(shot) > 5000, "a screenshot with something on it"
    # the browser made no request other than the page: nothing external, no favicon fetch allowed by CSP
    log = open(ng.access_log).read()
    assert_eq(log.count("GET /kembali"), 2, log)


def test_kept_connections_through_nginx(tmpdir):
    """nginx with fastcgi_keep_conn on and an upstream keepalive (the
    README's setup): 200 answers, cached and held, over a handful of
    FastCGI connections; a buyer who leaves mid-hold costs nobody else."""
    sb, k = kit.start(tmpdir)
    ng = testenv.Nginx(tmpdir, k, keepalive=8)
    sb.put_tx("t-ok", "succeeded")
    kit.pending_then(sb, "t-held", 1, "failed")
    before = k.metrics()["kembali_fastcgi_connections_total"]
    words = []
    lock = threading.Lock()

    def worker(n):
        for i in range(n):
            _, headers, _ = ng.http_get("/kembali?id=t-ok")
            with lock:
                words.append(headers.get("kembali-status"))

    threads = [threading.Thread(target=worker, args=(40,)) for _ in range(4)]
    held = threading.Thread(target=lambda: words.append(ng.http_get("/kembali?id=t-held")[1].get("kembali-status")))
    held.start()
    for t in threads:
        t.start()
    # a buyer closes the tab while held; nginx drops that upstream connection
    import socket as so
    c = so.create_connection(("127.0.0.1", ng.port))
    sb.put_tx("t-gone", "pending")
    c.sendall(b"GET /kembali?id=t-gone HTTP/1.1\r\nHost: shop.test\r\n\r\n")
    testenv.wait_for(lambda: sb.reads("t-gone"), 30)
    c.close()
    for t in threads:
        t.join()
    held.join()
    for _ in range(40):
        words.append(ng.http_get("/kembali?id=t-ok")[1].get("kembali-status"))
    assert_eq(words.count("succeeded"), 200)
    assert_eq(words.count("failed"), 1, "the held request, answered over a kept connection")
    testenv.wait_for(lambda: k.find_log(event="request", id="t-gone"), 30, msg="the gone buyer's request line")
    assert_eq(k.find_log(event="request", id="t-gone")[0].get("gone"), "yes")
    opened = k.metrics()["kembali_fastcgi_connections_total"] - before
    print("# 201 answers through nginx with keepalive 8: %d FastCGI connections" % opened)
    # without keep-conn every answer is a connection; with it, a handful
    assert opened <= 16, "nginx reused its FastCGI connections (%d opened)" % opened


def test_buyer_leaving_drops_the_held_request_over_tcp(tmpdir):
    """kembali on TCP behind nginx (with an upstream keepalive): a buyer who
    closes the tab while held makes nginx close its FastCGI connection;
    kembali drops the request at once (not at the 34 s deadline): no longer
    held, its reserved read given back."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    k = testenv.Kembali(tmpdir, config=lambda k: testenv.make_config(
        sb, [testenv.make_shop("toko-a", k.key_path("a"))]), keys={"a": kit.KEY},
        listen="127.0.0.1:%d" % testenv.free_port()).start()
    ng = testenv.Nginx(tmpdir, k, keepalive=8)
    sb.put_tx("t1", "pending")
    import socket as so
    c = so.create_connection(("127.0.0.1", ng.port))
    c.sendall(b"GET /kembali?id=t1 HTTP/1.1\r\nHost: shop.test\r\n\r\n")
    read = k.wait_log(30, event="read", id="t1")
    m = k.metrics()
    assert_eq((m["kembali_held_requests"], m["kembali_reads_reserved"]), (1, 1))
    c.close()
    gone = k.wait_log(20, event="request", id="t1")
    assert_eq(gone.get("gone"), "yes", gone)
    assert_between(kit.log_time(gone) - kit.log_time(read), 0, 5.0, "dropped soon after the buyer left")
    m = k.metrics()
    assert_eq((m["kembali_held_requests"], m["kembali_reads_reserved"]), (0, 0))


def doc_block(marker):
    """The indented (code) block of docs/monitoring.md holding ``marker``, as text."""
    lines = open(os.path.join(testenv.top_srcdir(), "docs", "monitoring.md")).read().split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("    ") and marker in line)
    lo = at
    while lo > 0 and lines[lo - 1].startswith("    "):
        lo -= 1
    hi = at
    while hi + 1 < len(lines) and lines[hi + 1].startswith("    "):
        hi += 1
    return "\n".join(lines[lo:hi + 1])


def test_documented_metrics_location_through_nginx(tmpdir):
    """docs/monitoring.md's metrics location, verbatim (only its socket path is
    kembali's here): nginx sends QUERY_STRING from `include fastcgi_params`
    and again from the location's own `fastcgi_param`; the last counts, so
    the page is the metrics, not a 404 for a missing id."""
    sb, k = kit.start(tmpdir)
    snippet = doc_block("location = /kembali-metrics")
    assert_in("include fastcgi_params;", snippet)
    assert_in("fastcgi_param QUERY_STRING format=metrics;", snippet)
    doc_sock = "unix:/run/kembali/kembali.sock"
    assert_eq(snippet.count(doc_sock), 1, snippet)
    snippet = snippet.replace(doc_sock, "unix:" + k.addr)
    # `include fastcgi_params` is relative to nginx's configuration directory
    shutil.copy("/etc/nginx/fastcgi_params", os.path.join(tmpdir, "fastcgi_params"))
    ng = testenv.Nginx(tmpdir, k, server_extra=snippet)
    sb.put_tx("t1", "succeeded")
    status, headers, body = ng.http_get("/kembali-metrics")
    assert_eq(status, 200, repr(body[:300]))
    assert_in("text/plain", headers.get("content-type", ""))
    page = testenv.parse_metrics(body.decode())
    assert_in("kembali_fastcgi_connections_total", page)
    # the query the client sends is overridden too: still the metrics
    status, _, body = ng.http_get("/kembali-metrics?id=t1")
    assert_eq(status, 200)
    assert_in(b"kembali_fastcgi_connections_total", body)
    # the shop location beside it still reads the client's query
    status, headers, _ = ng.http_get("/kembali?id=t1")
    assert_eq(headers.get("kembali-status"), "succeeded")


if __name__ == "__main__":
    testenv.run(globals())
