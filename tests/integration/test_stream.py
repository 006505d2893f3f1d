"""The streamed page (docs/answers.md, "While a browser waits"):
a browser's navigation whose answer is not known yet gets the waiting top
at once and the result later, in the same answer; everybody else gets the
single answer as before. FastCGI straight to kembali here, then through a
real nginx (defaults, and gzip on)."""

import os
import re
import signal
import socket
import struct
import time

import testenv
import kit
from testenv import assert_eq, assert_in, assert_between

DOC = {"HTTP_SEC_FETCH_DEST": "document"}


def stream_fcgi(addr, query, extra=None, timeout=60, sock=None, request_id=1, keep_conn=False, on_first=None):
    """Send one request and read its answer record by record: returns
    (parts, t0) with parts a list of (seconds since sent, STDOUT bytes)
    and the END_REQUEST as (t, None). With `sock`, that (kept) connection;
    on_first() is called once the first STDOUT record is in."""
    s = sock or testenv.fcgi_connect(addr)
    s.settimeout(timeout)
    params = testenv.cgi_params(query, extra=extra)
    t0 = time.monotonic()
    s.sendall(testenv.fcgi_request_bytes(params, request_id=request_id, keep_conn=keep_conn))
    buf = b""
    parts = []

    def need(n):
        nonlocal buf
        while len(buf) < n:
            chunk = s.recv(65536)
            if not chunk:
                raise AssertionError("connection closed before END_REQUEST; got %r" % parts[:3])
            buf += chunk
        out, buf = buf[:n], buf[n:]
        return out

    while True:
        _, rtype, rid, clen, plen, _ = struct.unpack(">BBHHBB", need(8))
        content = need(clen + plen)[:clen]
        if rid != request_id:
            continue
        now = time.monotonic() - t0
        if rtype == 6 and clen:  # FCGI_STDOUT
            parts.append((now, content))
            if on_first is not None and len(parts) == 1:
                on_first()
        elif rtype == 3:  # FCGI_END_REQUEST
            parts.append((now, None))
            break
    if sock is None:
        s.close()
    return parts, t0


def head_and_body(data):
    head, _, body = data.partition(b"\r\n\r\n")
    headers = {}
    for line in head.decode().split("\r\n"):
        n, _, v = line.partition(":")
        headers[n.strip().lower()] = v.strip()
    return headers, body


def last_status(body):
    return re.findall(rb'data-status="([a-z_]+)"', body)[-1].decode()


def test_streamed_page_in_two_parts(tmpdir):
    sb, k = kit.start(tmpdir)
    kit.pending_then(sb, "t1", 2, "succeeded")  # reads at 0, 1.1, 2.2 s: the third says succeeded
    parts, _ = stream_fcgi(k.addr, "id=t1", DOC)
    first_t, first = parts[0]
    headers, top = head_and_body(first)
    assert_eq(headers.get("status"), "200 OK")
    assert_eq(headers.get("kembali-status"), "checking")
    assert_eq(headers.get("x-accel-buffering"), "no")
    assert "content-length" not in headers, headers
    assert_in("frame-ancestors 'none'", headers.get("content-security-policy", ""))
    assert_in("default-src 'none'", headers.get("content-security-policy", ""))
    assert "script-src" not in headers.get("content-security-policy", ""), headers
    for h, v in (("cache-control", "no-store"), ("x-content-type-options", "nosniff"),
                 ("referrer-policy", "no-referrer"), ("x-frame-options", "DENY")):
        assert_eq(headers.get(h), v, h)  # the same security headers as a single answer
    assert_in(b'role="status"', top)
    assert_in(b"t1", top)
    assert b"</html>" not in top
    whole = b"".join(p for _, p in parts if p is not None)
    _, body = head_and_body(whole)
    assert_eq(last_status(body), "succeeded")
    assert body.rstrip().endswith(b"</html>")
    assert_in(b"<h1>Pembayaran berhasil</h1>", body)
    # kembali's own clock: the top went out when the first read came back
    # pending, the page ended with the read that found it succeeded
    line = k.wait_log(30, event="request", id="t1")
    assert_eq(line.get("word"), "succeeded")
    assert_eq(line.get("http"), "200")
    assert_between(int(line["streamed_ms"]), 0, 500, "top sent when the first read came back")
    assert_between(int(line["ms"]), 2200 - 3, 2200 + 600, "result with the third read")
    assert parts[-1][0] - first_t >= 1.5, "the top came well before the end: %r" % [(t, len(p or b"")) for t, p in parts]
    assert_eq(len(sb.reads("t1")), 3, "reads unchanged")


def test_no_sec_fetch_dest_gets_the_single_answer(tmpdir):
    """curl, scripts and storefront fetches (no Sec-Fetch-Dest, or another
    destination) wait for the single answer, as before."""
    sb, k = kit.start(tmpdir)
    for id, extra in (("t1", None), ("t2", {"HTTP_SEC_FETCH_DEST": "empty"})):
        kit.pending_then(sb, id, 1, "failed")
        parts, _ = stream_fcgi(k.addr, "id=" + id, extra)
        data = [p for _, p in parts if p is not None]
        headers, body = head_and_body(b"".join(data))
        assert_eq(headers.get("kembali-status"), "failed")
        assert_eq(headers.get("content-length"), str(len(body)))
        assert "x-accel-buffering" not in headers
        line = k.wait_log(30, event="request", id=id)
        assert_eq(line.get("word"), "failed")
        assert_between(int(line["ms"]), 1100 - 3, 1100 + 600, "held to the second read")
        assert "streamed_ms" not in line, line


def test_known_answers_stay_single(tmpdir):
    """A final status found by the first read, a cached one, a 404 and an
    invalid id: one answer, with Content-Length, nothing streamed."""
    sb, k = kit.start(tmpdir)
    sb.put_tx("t-ok", "succeeded")
    for q, word in (("id=t-ok", "succeeded"), ("id=t-ok", "succeeded"), ("id=nope", "not_found"),
                    ("id=bad%20id", "invalid")):
        parts, _ = stream_fcgi(k.addr, q, DOC)
        headers, body = head_and_body(b"".join(p for _, p in parts if p is not None))
        assert_eq(headers.get("kembali-status"), word)
        assert_eq(headers.get("content-length"), str(len(body)))
    for l in k.find_log(event="request"):
        assert "streamed_ms" not in l, l


def test_progressive_false_turns_it_off(tmpdir):
    sb, k = kit.start(tmpdir, shops=lambda k: [testenv.make_shop("toko-a", k.key_path("a"), progressive=False)])
    kit.pending_then(sb, "t1", 1, "canceled")
    parts, _ = stream_fcgi(k.addr, "id=t1", DOC)
    headers, body = head_and_body(b"".join(p for _, p in parts if p is not None))
    assert_eq(headers.get("kembali-status"), "canceled")
    assert_eq(headers.get("content-length"), str(len(body)))
    assert "streamed_ms" not in k.wait_log(30, event="request", id="t1")


def test_first_paint_ms_bounds_a_slow_first_read(tmpdir):
    """The first read takes 2.5 s: the top goes out at first_paint_ms
    (600 here), before anything is known."""
    sb, k = kit.start(tmpdir, top={"first_paint_ms": 600})
    sb.put_tx("t1", "succeeded", responses=[{"http": 200, "delay_ms": 2500,
                                             "body": {"id": "t1", "status": "succeeded"}}])
    parts, _ = stream_fcgi(k.addr, "id=t1", DOC)
    headers, _ = head_and_body(parts[0][1])
    assert_eq(headers.get("kembali-status"), "checking")
    line = k.wait_log(30, event="request", id="t1")
    assert_eq(line.get("word"), "succeeded")
    assert_between(int(line["streamed_ms"]), 600, 600 + 150, "painted at first_paint_ms")
    assert_between(int(line["ms"]), 2500, 3500)


def test_first_paint_ms_0_paints_at_once(tmpdir):
    """first_paint_ms 0: the top goes out as soon as the request is held,
    while its first read (2.5 s here) has said nothing yet; not 20 s later
    with the first comment."""
    sb, k = kit.start(tmpdir, top={"first_paint_ms": 0})
    sb.put_tx("t1", "succeeded", responses=[{"http": 200, "delay_ms": 2500,
                                             "body": {"id": "t1", "status": "succeeded"}}])
    parts, _ = stream_fcgi(k.addr, "id=t1", DOC)
    headers, _ = head_and_body(parts[0][1])
    assert_eq(headers.get("kembali-status"), "checking", "the waiting top first")
    assert parts[0][0] < 1.0, "the top came %.2f s after the request" % parts[0][0]
    line = k.wait_log(30, event="request", id="t1")
    assert_eq(line.get("word"), "succeeded")
    assert_between(int(line["streamed_ms"]), 0, 150, "painted at once")


def test_another_read_in_flight_paints_at_once(tmpdir):
    """A second tab while the first one's read is under way: its top at once."""
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "succeeded", responses=[{"http": 200, "delay_ms": 2000,
                                             "body": {"id": "t1", "status": "pending"}}])
    s1 = testenv.fcgi_send(k.addr, testenv.cgi_params("id=t1", extra=DOC))
    testenv.wait_for(lambda: sb.reads("t1"), 30)
    parts, _ = stream_fcgi(k.addr, "id=t1&tab=2", DOC)
    testenv.fcgi_receive(s1)
    lines = k.find_log(event="request", id="t1")
    assert_eq(len(lines), 2)
    second = [l for l in lines if int(l["streamed_ms"]) < 900]
    assert second, "the second tab painted before first_paint_ms: %r" % lines


def test_sigterm_finishes_a_streamed_page(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "pending")
    # SIGTERM once the top is in: the page is finished with what is known
    parts, _ = stream_fcgi(k.addr, "id=t1", DOC, timeout=10, on_first=lambda: k.proc.send_signal(signal.SIGTERM))
    assert len([p for _, p in parts if p is not None]) >= 2, "the top, then the rest"
    headers, body = head_and_body(b"".join(p for _, p in parts if p is not None))
    assert_eq(headers.get("kembali-status"), "checking")
    assert_eq(last_status(body), "checking")
    assert body.rstrip().endswith(b"</html>")
    assert_eq(body.count(b"<html"), 1)
    assert_eq(k.proc.wait(10), 0)
    assert "streamed_ms" in k.wait_log(10, event="request", id="t1")


def test_a_signed_notify_ends_a_streamed_page(tmpdir):
    """Kasera says pending to the end; once the top is in, a forged notify
    (401) changes nothing and the shop's signed one (204) ends the page
    with its word, within 50 ms in kembali's own log."""
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "pending")
    told = {}

    def tell():
        told["forged"] = kit.notify(k, "t1", {"status": "failed"}, secret="not-the-shop's")
        told["signed"] = kit.notify(k, "t1", {"status": "succeeded"})

    parts, _ = stream_fcgi(k.addr, "id=t1", DOC, timeout=20, on_first=tell)
    assert_eq(told["forged"].status, 401, "forged: %r" % told["forged"])
    assert_eq(told["signed"].status, 204, "signed: %r" % told["signed"])
    data = [p for _, p in parts if p is not None]
    assert len(data) >= 2, "the top, then the result"
    headers, body = head_and_body(b"".join(data))
    assert_eq(headers.get("kembali-status"), "checking")
    assert_eq(last_status(body), "succeeded")
    assert body.rstrip().endswith(b"</html>")
    line = k.wait_log(10, event="request", id="t1")
    assert_eq(line.get("word"), "succeeded")
    assert "streamed_ms" in line, line
    notified = [l for l in k.find_log(event="notify", id="t1") if l.get("http") == "204"]
    assert_eq(len(notified), 1, "one recorded notify")
    lat = round((kit.log_time(line) - kit.log_time(notified[0])) * 1000)
    assert lat <= 50, "the page ended %d ms after the notify" % lat


def test_kept_connection_carries_a_stream_then_more(tmpdir):
    sb, k = kit.start(tmpdir)
    kit.pending_then(sb, "t1", 1, "failed")
    sb.put_tx("t2", "succeeded")
    s = testenv.fcgi_connect(k.addr)
    parts, _ = stream_fcgi(k.addr, "id=t1", DOC, sock=s, request_id=3, keep_conn=True)
    assert len([p for p in parts if p[1] is not None]) >= 2, "in parts"
    assert_eq(last_status(b"".join(p for _, p in parts if p is not None)), "failed")
    parts, _ = stream_fcgi(k.addr, "id=t2", DOC, sock=s, request_id=4, keep_conn=True)
    headers, _ = head_and_body(b"".join(p for _, p in parts if p is not None))
    assert_eq(headers.get("kembali-status"), "succeeded")
    s.close()


@testenv.timeout(90)
def test_comment_every_20_seconds(tmpdir):
    sb, k = kit.start(tmpdir, schedule=[0, 12000, 12000])
    sb.put_tx("t1", "pending")
    parts, _ = stream_fcgi(k.addr, "id=t1", DOC, timeout=80)
    comments = [(t, p) for t, p in parts[1:] if p is not None and p.startswith(b"<!--")]
    assert_eq(len(comments), 1, "one comment in a 25.5 s wait: %r" % [(t, p[:40]) for t, p in parts if p])
    assert_between(comments[0][0] - parts[0][0], 19.5, 21.5, "20 s after the top")
    assert_eq(last_status(b"".join(p for _, p in parts if p is not None)), "checking")


def test_cgi_mode_streams(tmpdir):
    """Started as a CGI program, kembali writes the top to standard output
    before the result."""
    sb, k = kit.start(tmpdir)
    kit.pending_then(sb, "t-cgi", 2, "expired")
    env = dict(os.environ)
    env.update(testenv.cgi_params("id=t-cgi", extra=DOC))
    env["KEMBALI_CONFIG"] = k.config_path
    import subprocess
    p = subprocess.Popen([k.bin], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=env)
    t0 = time.monotonic()
    first = os.read(p.stdout.fileno(), 65536)
    t_first = time.monotonic() - t0
    rest = p.stdout.read()
    t_end = time.monotonic() - t0
    assert_eq(p.wait(10), 0)
    headers, body = head_and_body(first + rest)
    assert_eq(headers.get("kembali-status"), "checking")
    assert_eq(last_status(body), "expired")
    assert t_end - t_first >= 1.5, (t_first, t_end)


# ---- through nginx ----

def http_stream(port, path, headers=None, timeout=60):
    """GET over a raw socket: (seconds to the first body byte, seconds to
    the end, headers, raw body as sent)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    h = {"Host": "shop.test", "Sec-Fetch-Dest": "document", "Connection": "close"}
    h.update(headers or {})
    t0 = time.monotonic()
    s.sendall(("GET %s HTTP/1.1\r\n" % path + "".join("%s: %s\r\n" % kv for kv in h.items()) + "\r\n").encode())
    data = b""
    first = None
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
        if first is None and b"\r\n\r\n" in data and len(data) > data.index(b"\r\n\r\n") + 4:
            first = time.monotonic() - t0
    end = time.monotonic() - t0
    s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    hd = {}
    for line in head.decode().split("\r\n")[1:]:
        n, _, v = line.partition(":")
        hd[n.strip().lower()] = v.strip()
    return first, end, hd, body


def dechunk(body):
    out = b""
    while body:
        size, _, body = body.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out += body[:n]
        body = body[n + 2:]
    return out


def check_nginx_stream(tmpdir, gzip, **nginx):
    sb, k = kit.start(tmpdir)
    ng = testenv.Nginx(tmpdir, k, server_extra="gzip on; gzip_types text/html; gzip_min_length 0;" if gzip else "",
                       **nginx)
    kit.pending_then(sb, "t1", 2, "succeeded")
    first, end, hd, body = http_stream(ng.port, "/kembali?id=t1", {"Accept-Encoding": "gzip"} if gzip else None)
    assert_eq(hd.get("kembali-status"), "checking")
    assert "x-accel-buffering" not in hd, "nginx takes it for itself"
    if hd.get("transfer-encoding") == "chunked":
        body = dechunk(body)
    if gzip:
        assert_eq(hd.get("content-encoding"), "gzip")
        import zlib
        body = zlib.decompress(body, 16 + zlib.MAX_WBITS)
    assert_eq(last_status(body), "succeeded")
    line = k.wait_log(30, event="request", id="t1")
    painted, ended = int(line["streamed_ms"]) / 1000, int(line["ms"]) / 1000
    # the first part reached the client near when kembali wrote it, long
    # before the end (kembali's log gives when it wrote)
    assert first is not None and first < end - 1.5, (first, end)
    print("# through nginx%s: the top reached the client %.0f ms after kembali wrote it (at %.3f s); end at %.3f s"
          % (" with gzip" if gzip else "", (first - painted) * 1000, painted, end))
    assert first - painted < 0.1 + 0.15, "within 100 ms, with room for a busy machine: %.3f s" % (first - painted)
    assert_between(ended - painted, 1.5, 3.0)


def test_nginx_defaults_pass_the_top_at_once(tmpdir):
    check_nginx_stream(tmpdir, gzip=False)


def test_nginx_gzip_passes_the_top_at_once(tmpdir):
    check_nginx_stream(tmpdir, gzip=True)


def test_nginx_kept_connections_unbuffered_pass_the_top_at_once(tmpdir):
    """The README's nginx (upstream keepalive, fastcgi_keep_conn on) with
    fastcgi_buffering off."""
    check_nginx_stream(tmpdir, gzip=False, keepalive=8, location_extra="fastcgi_buffering off;")


@testenv.timeout(120)
def test_chromium_sees_the_waiting_top_then_the_result(tmpdir):
    """Through nginx in a real Chromium at a phone's size: the waiting top
    alone (a screenshot while the answer is still open), then the result
    (a screenshot), the waiting message hidden by CSS, and the live region's
    text read from the accessibility tree. The PNGs stay in the test's
    tmpdir (kept when it fails)."""
    from testenv import cdp
    sb, k = kit.start(tmpdir, schedule=[0, 1500, 1500, 1500, 1500])
    ng = testenv.Nginx(tmpdir, k)
    kit.pending_then(sb, "ref-1001", 3, "succeeded")  # the result 4.5 s after the first read
    br = cdp.Chromium()
    try:
        br.navigate(ng.url("/kembali?id=ref-1001"))
        br.wait_js("!!document.querySelector('.waiting')")
        assert br.js("!document.querySelector('.result')"), "the result is not there yet"
        assert_eq(br.js("document.readyState"), "loading", "the answer is still open")
        br.wait_js("document.fonts.status === 'loaded'")
        waiting = br.screenshot(os.path.join(tmpdir, "waiting.png"))
        print("# screenshot of the waiting top: %s" % waiting)
        assert_eq(br.js("getComputedStyle(document.querySelector('.waiting')).display"), "block")
        assert_eq(br.js("document.querySelector('.waiting').getAttribute('role')"), "status")
        assert_eq(br.js("document.documentElement.dataset.status"), "checking")
        br.wait_js("document.readyState === 'complete'", timeout=30)
        done = br.screenshot(os.path.join(tmpdir, "result.png"))
        print("# screenshot of the result: %s" % done)
        assert_eq(br.js("getComputedStyle(document.querySelector('.waiting')).display"), "none",
                  "the waiting message is hidden once the result is in")
        assert_eq(br.js("[...document.querySelectorAll('[data-status]')].pop().dataset.status"), "succeeded")
        assert_eq(br.js("document.scripts.length"), 0)
        nodes = br.ax_tree()
        live = [n for n in nodes if not n.get("ignored") and (n.get("role") or {}).get("value") in ("alert", "status")]
        assert_eq([(n.get("role") or {}).get("value") for n in live], ["alert"],
                  "one live region left in the tree: the result (the waiting status is hidden)")
        by_id = {n["nodeId"]: n for n in nodes}

        def text(n):
            out = []
            if (n.get("role") or {}).get("value") in ("StaticText", "text"):
                out.append((n.get("name") or {}).get("value", ""))
            for c in n.get("childIds", []):
                if c in by_id:
                    out.append(text(by_id[c]))
            return " ".join(x for x in out if x)

        said = text(live[0])
        print("# the live region says: %s" % said)
        assert_in("Pembayaran berhasil", said)
        assert_in("ref-1001", said)
    finally:
        br.close()
        keep = os.environ.get("KEMBALI_SCREENSHOTS")  # a folder to copy them to, to look at them
        if keep:
            import shutil
            for name in ("waiting.png", "result.png"):
                if os.path.exists(os.path.join(tmpdir, name)):
                    shutil.copy(os.path.join(tmpdir, name), keep)
    assert_eq(k.wait_log(30, event="request", id="ref-1001").get("word"), "succeeded")


def test_a_stream_reader_that_stops_is_cut_off(tmpdir):
    """A client that stops reading a streamed page is disconnected about
    2 s after the socket stopped taking it, as with any answer: its request
    is dropped (gone=yes) long before its deadline, and others are served.
    kembali gets a TCP listening socket with a small SO_SNDBUF (which its
    connections inherit, autotuning off), the top is big (a shop's own
    waiting.html of 40 KB) and the client reads nothing."""
    tpl = os.path.join(tmpdir, "tpl", "id")
    os.makedirs(tpl)
    for w in ("succeeded", "failed", "canceled", "expired", "checking", "not_found", "invalid", "unknown_shop"):
        with open(os.path.join(tpl, w + ".html"), "w") as f:
            f.write('<html data-status="{{status}}"><!--card-->%s<!--/card--></html>\n' % w)
    with open(os.path.join(tpl, "waiting.html"), "w") as f:
        f.write('<html data-status="{{status}}">' + ("<p>" + "w" * 1000 + "</p>\n") * 40 +
                '{{more}}<div data-status="{{status}}">{{card}}</div></html>\n')
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    ls.set_inheritable(True)
    sb, ks = kit.start_many(tmpdir, 1, schedule=[0, 5000, 5000], listen=ls,
                            shops=lambda k: [testenv.make_shop("toko-a", k.key_path("a"),
                                                               templates_dir=os.path.join(tmpdir, "tpl"))])
    k = ks[0]
    sb.put_tx("t1", "pending")
    sb.put_tx("t2", "succeeded")
    stuck = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    stuck.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)
    stuck.connect(ls.getsockname())
    stuck.sendall(testenv.fcgi_request_bytes(testenv.cgi_params("id=t1", extra=DOC)))
    line = k.wait_log(15, event="request", id="t1")
    assert_eq(line.get("gone"), "yes", "the stuck reader's request was dropped")
    assert "streamed_ms" in line, line
    assert_between(int(line["ms"]) - int(line["streamed_ms"]), 1900, 4000, "cut off 2 s after it stopped reading")
    parts, _ = stream_fcgi(k.addr, "id=t2", DOC)
    assert_eq(head_and_body(parts[0][1])[0].get("kembali-status"), "succeeded")
    stuck.close()


if __name__ == "__main__":
    testenv.run(globals())
