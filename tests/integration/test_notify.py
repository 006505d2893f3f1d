"""Told by the shop: the admin POST ?format=notify and kembali --notify.
A told status counts as if a read had just returned it: held requests are
answered within 50 ms (measured in kembali's own log), later returns cost no
read, and what is known never moves backwards. Each POST is signed with the
shop's notify secret (Kembali-Signature); a forged, stale or missing one
changes nothing."""

import json
import subprocess

import testenv
import kit
from testenv import assert_eq, assert_in

ADMIN = {"KEMBALI_ADMIN": "1"}


notify = kit.notify  # signed with toko-a's notify secret unless told otherwise


def check_recorded(r):
    assert_eq(r.status, 204, "notify answer: %r" % r)
    assert_eq(r.body, b"")
    assert_eq(r.header("content-length"), None, "a 204 has no Content-Length")


def json_status(k, id):
    r = k.get("id=%s&format=json" % id)
    return r.header("kembali-status"), r.json()


def hold(k, id, n):
    """n HTML requests for id in threads, running once kembali holds all of
    them (its held gauge); returns the callable that joins them (answers)."""
    import threading
    out = [None] * n

    def one(i):
        out[i] = k.get("id=" + id, timeout=30)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    testenv.wait_for(lambda: k.metrics().get("kembali_held_requests") == n, 10,
                     msg="%d requests held for %s" % (n, id))

    def join():
        for t in ts:
            t.join(30)
        return out
    return join


def reads_after(k, id, t):
    """kembali's reads of id that started after t (s since the epoch)."""
    return [l for l in k.find_log(event="read", id=id) if kit.began(l) > t + 0.001]


def test_told_while_twenty_held(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t1", "pending")  # Kasera would say pending to the end
    join = hold(k, "t1", 20)
    check_recorded(notify(k, "t1", {"status": "succeeded"}))
    answers = join()
    assert_eq([r.header("kembali-status") for r in answers], ["succeeded"] * 20)
    told = k.wait_log(30, event="notify", id="t1")
    assert_eq((told["status"], told["result"], told["http"]), ("succeeded", "recorded", "204"))
    t_told = kit.log_time(told)
    lines = testenv.wait_for(lambda: (lambda f: f if len(f) == 20 else None)(
        k.find_log(event="request", id="t1")), 5, msg="20 request lines")
    lat = sorted(round((kit.log_time(l) - t_told) * 1000) for l in lines)
    print("# held answered after the notify (ms, from kembali's log): min %d, median %d, max %d"
          % (lat[0], lat[10], lat[-1]))
    # kembali's own time between its lines (a sanitizer build is slower)
    assert lat[-1] <= 50 * testenv.cpu_scale(), "held requests answered %r ms after the notify" % lat
    # no read started after the notify, then or for later returns
    for _ in range(5):
        assert_eq(json_status(k, "t1")[0], "succeeded")
        assert_eq(k.get("id=t1").header("kembali-status"), "succeeded")
    assert_eq(reads_after(k, "t1", t_told), [])
    # a read in flight at the notify is logged when it ends, which may be after the answers
    testenv.wait_for(lambda: len(sb.reads("t1")) == len(k.find_log(event="read", id="t1")), 10,
                     msg="every read the sandbox saw is in kembali's log once it ended")
    print("# reads at the sandbox: %d before the notify, 0 after" % len(sb.reads("t1")))


def test_told_while_the_read_is_in_flight(tmpdir):
    """Held on kembali's own read, still in flight (Kasera slow): a told
    final status answers them at once; the read's late pending changes
    nothing."""
    sb, k = kit.start(tmpdir)
    sb.put_tx("t11", "pending", responses=[{"delay_ms": 3000}])
    join = hold(k, "t11", 5)
    testenv.wait_for(lambda: sb.reads("t11"), 30, msg="the read arrived at the sandbox")
    check_recorded(notify(k, "t11", {"status": "failed"}))
    answers = join()
    assert_eq([r.header("kembali-status") for r in answers], ["failed"] * 5)
    t_told = kit.log_time(k.wait_log(30, event="notify", id="t11"))
    lat = [round((kit.log_time(l) - t_told) * 1000) for l in k.find_log(event="request", id="t11")]
    # kembali's own time between its two lines: stepping the watch and
    # answering five pages (a sanitizer build does that work slower)
    print("# answered %r ms after the notify" % lat)
    assert max(lat) <= 50 * testenv.cpu_scale(), "answered %r ms after the notify" % lat
    read = k.wait_log(30, event="read", id="t11")  # the slow read ends later...
    assert kit.log_time(read) > t_told, "the read was still in flight at the notify"
    assert_eq(read["status"], "pending")
    assert_eq(json_status(k, "t11")[1], {"id": "t11", "status": "failed", "final": True})  # ...and changes nothing
    assert_eq(len(sb.reads("t11")), 1)


def test_told_before_any_return(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t2", "failed")
    check_recorded(notify(k, "t2", {"status": "succeeded"}))  # the shop's word stands
    assert_eq(k.get("id=t2").header("kembali-status"), "succeeded")
    assert_eq(json_status(k, "t2"), ("succeeded", {"id": "t2", "status": "succeeded", "final": True}))
    # any shop's ids: the one shop is picked as for any request, by host too
    check_recorded(notify(k, "t3", {"status": "canceled"}, extra={"HTTP_HOST": "toko-a.test"}))
    assert_eq(k.get("id=t3").header("kembali-status"), "canceled")
    assert_eq(sb.reads(), [])
    assert_eq(k.find_log(event="read"), [])


def test_told_pending_changes_nothing_else(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t4", "pending")
    check_recorded(notify(k, "t4", {"status": "pending"}))
    assert_eq(sb.reads(), [])
    word, body = json_status(k, "t4")  # known, not final: the one read the pace allows now
    assert_eq((word, body["status"], body["final"]), ("checking", "pending", False))
    assert_eq(len(sb.reads("t4")), 1)


def test_bad_notifies(tmpdir):
    sb, k = kit.start(tmpdir)
    bad = [
        ("id=bad%20id&format=notify", {"status": "succeeded"}, "id="),
        ("format=notify", {"status": "succeeded"}, "id="),
        ("id=t5&format=notify", b"", "empty"),
        ("id=t5&format=notify", b"status=succeeded", "not JSON"),
        ("id=t5&format=notify", b"{\"status\": \"succeeded\"", "not JSON"),
        ("id=t5&format=notify", ["succeeded"], "JSON object"),
        ("id=t5&format=notify", {}, "no \"status\""),
        ("id=t5&format=notify", {"status": 1}, "must be a string"),
        ("id=t5&format=notify", {"status": "paid"}, "one of pending"),
        ("id=t5&format=notify", {"status": "unknown"}, "one of pending"),
        ("id=t5&format=notify", b"{\"status\": \"succeeded\"}" + b" " * 9000, "larger than 8192"),
    ]
    for query, body, reason in bad:
        r = notify(k, "t5", body if isinstance(body, bytes) else json.dumps(body).encode(), query=query)
        assert_eq(r.status, 400, "%s %r: %r" % (query, body, r))
        assert_eq(r.header("kembali-status"), "invalid")
        assert_in("text/plain", r.header("content-type"))
        assert_in(reason, r.text)
    r = notify(k, "t5", {"status": "succeeded"}, extra={"KEMBALI_SHOP": "nope"})
    assert_eq((r.status, r.header("kembali-status")), (404, "unknown_shop"))
    # without KEMBALI_ADMIN=1 a POST is a POST: 405
    for extra in ({}, {"KEMBALI_ADMIN": "0"}, {"KEMBALI_ADMIN": "yes"}):
        r = notify(k, "t5", {"status": "succeeded"}, admin=False, extra=extra)
        assert_eq((r.status, r.header("allow"), r.header("kembali-status")), (405, "GET, HEAD", "invalid"))
    # only POST tells: an admin GET with format=notify is an ordinary GET
    sb.put_tx("t6", "failed")
    r = k.get("id=t6&format=notify", extra=ADMIN)
    assert_eq(r.header("kembali-status"), "failed")
    # nothing was recorded for t5
    sb.put_tx("t5", "pending")
    assert_eq(json_status(k, "t5")[1]["status"], "pending")
    assert_eq(len(sb.reads("t5")), 1)


def test_expired_then_succeeded(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t7", "expired")
    check_recorded(notify(k, "t7", {"status": "expired"}))
    assert_eq(json_status(k, "t7"), ("expired", {"id": "t7", "status": "expired", "final": True}))
    check_recorded(notify(k, "t7", {"status": "succeeded"}))  # a late payment
    assert_eq(json_status(k, "t7"), ("succeeded", {"id": "t7", "status": "succeeded", "final": True}))
    r = notify(k, "t7", {"status": "expired"})  # never the reverse
    assert_eq(r.status, 409, repr(r))
    assert_in("succeeded is already known", r.text)
    assert_eq(k.get("id=t7").header("kembali-status"), "succeeded")
    line = k.wait_log(30, event="notify_conflict", id="t7", status="expired", result="kept")
    assert_eq((line["level"], line["http"]), ("error", "409"))
    assert_eq(sb.reads(), [])


def test_succeeded_then_pending(tmpdir):
    sb, k = kit.start(tmpdir)
    sb.put_tx("t8", "pending")
    check_recorded(notify(k, "t8", {"status": "succeeded"}))
    check_recorded(notify(k, "t8", {"status": "succeeded"}))  # the same again: harmless
    r = notify(k, "t8", {"status": "pending"})  # a final status is never replaced by pending
    assert_eq(r.status, 409, repr(r))
    assert_eq(k.get("id=t8").header("kembali-status"), "succeeded")
    assert_eq(json_status(k, "t8")[1], {"id": "t8", "status": "succeeded", "final": True})
    assert_eq(sb.reads(), [])


# ---- signed: only the shop's own backend tells ----

def nothing_recorded(sb, k, id, want):
    """What the buyer of id sees is what Kasera says (want), from a read: no
    told status stands for it."""
    assert_eq(k.find_log(event="notify", id=id, result="recorded"), [])
    before = len(sb.reads(id))
    assert_eq(k.get("id=" + id).header("kembali-status"), want)
    return len(sb.reads(id)) - before


def test_forged_stale_missing_signatures(tmpdir):
    """Each refused with 401 and a reason; none changes anything."""
    import time
    sb, k = kit.start(tmpdir)
    sb.put_tx("s1", "succeeded")
    body = b'{"status": "failed"}'
    now = int(time.time())
    good = kit.sign("s1", body)
    cases = [
        ("another secret", kit.sign("s1", body, secret="whsec_guessed"), "signature is wrong"),
        ("another shop's id", kit.sign("s2", body), "signature is wrong"),
        ("another body", kit.sign("s1", b'{"status": "canceled"}'), "signature is wrong"),
        ("t changed after signing", good.replace("t=%d" % now, "t=%d" % (now + 1)), "signature is wrong"),
        ("stale: 301 s old", kit.sign("s1", body, t=now - 301), "more than 300 s"),
        # the window's edges to the second are test_notify_sig's (a fake clock);
        # here a margin covers the test's own clock running ahead of kembali's
        ("from the future", kit.sign("s1", body, t=now + 400), "more than 300 s"),
        ("missing", "", "no Kembali-Signature"),
        ("only t", "t=%d" % now, "must be t=UNIX_SECONDS"),
        ("only v1", good.split(",")[1], "must be t=UNIX_SECONDS"),
        ("upper-case hex", good.upper().replace("T=", "t=").replace("V1=", "v1="), "must be t=UNIX_SECONDS"),
        ("garbage", "Bearer whsec_kembali", "must be t=UNIX_SECONDS"),
    ]
    for what, sig, reason in cases:
        r = notify(k, "s1", body, signature=sig or False)
        assert_eq(r.status, 401, "%s: %r" % (what, r))
        assert_in(reason, r.text, what)
        assert_in("text/plain", r.header("content-type"))
    lines = k.find_log(event="notify", id="s1")
    assert_eq(len(lines), len(cases))
    assert_eq({(l["http"], l["result"]) for l in lines}, {("401", "refused")})
    for l in lines:  # the secret and the expected HMAC are never logged
        assert kit.NOTIFY_SECRET not in l["_raw"]
    assert kit.NOTIFY_SECRET not in k.log_text()
    assert_eq(nothing_recorded(sb, k, "s1", "succeeded"), 1, "the buyer's page came from a read")
    # inside the window (10 s from its edge: the test's clock reads whole
    # seconds, and a busy machine may stall it): accepted
    r = notify(k, "s3", {"status": "canceled"}, t=int(time.time()) - 290)
    check_recorded(r)


def test_a_local_process_cannot_fail_a_paid_buyer(tmpdir):
    """The harm of issue 14: another tenant's code (local, so past the web
    server's allow) posts failed for a paid transaction, without the secret.
    The buyer still sees succeeded, and the real webhook's succeeded that
    follows is recorded."""
    sb, k = kit.start(tmpdir)
    sb.put_tx("paid1", "succeeded")
    for sig in (False, kit.sign("paid1", b'{"status": "failed"}', secret="whsec_tenant_b")):
        r = notify(k, "paid1", {"status": "failed"}, signature=sig)
        assert_eq(r.status, 401, repr(r))
    word, body = json_status(k, "paid1")
    assert_eq((word, body["status"]), ("succeeded", "succeeded"))
    assert_eq(k.get("id=paid1").header("kembali-status"), "succeeded")
    check_recorded(notify(k, "paid1", {"status": "succeeded"}))  # the shop's own webhook
    r = notify(k, "paid1", {"status": "failed"}, signature=False)
    assert_eq(r.status, 401)
    assert_eq(k.get("id=paid1").header("kembali-status"), "succeeded")


def test_shop_without_notify_secret(tmpdir):
    """403: telling is off for it; --notify works as before."""
    sb, k = kit.start(tmpdir, shops=lambda k: [testenv.make_shop("toko-a", k.key_path("a"))])
    sb.put_tx("n1", "pending")
    for sig in (None, False):
        r = notify(k, "n1", {"status": "succeeded"}, signature=sig)
        assert_eq(r.status, 403, repr(r))
        assert_in("no notify secret", r.text)
    assert_eq(json_status(k, "n1")[1]["status"], "pending")
    assert_eq(run_notify(k, "toko-a", "n1", "succeeded"), (0, "", ""))
    assert_eq(k.get("id=n1").header("kembali-status"), "succeeded")


def test_conflict_failed_then_succeeded(tmpdir):
    """409 with a reason; what is known stays; one error line and a metric."""
    sb, k = kit.start(tmpdir)
    sb.put_tx("c1", "pending")
    check_recorded(notify(k, "c1", {"status": "failed"}))
    assert_eq(k.metrics().get("kembali_notify_conflicts_total"), 0)
    r = notify(k, "c1", {"status": "succeeded"})
    assert_eq(r.status, 409, repr(r))
    assert_in("failed is already known for this transaction and succeeded may not replace it", r.text)
    assert_eq(json_status(k, "c1"), ("failed", {"id": "c1", "status": "failed", "final": True}))
    lines = k.find_log(event="notify_conflict")
    assert_eq(len(lines), 1)
    assert_eq((lines[0]["level"], lines[0]["shop"], lines[0]["id"], lines[0]["status"], lines[0]["http"]),
              ("error", "toko-a", "c1", "succeeded", "409"))
    assert_eq(k.find_log(event="notify", id="c1", status="succeeded"), [], "one line, the conflict's")
    assert_eq(k.metrics()["kembali_notify_conflicts_total"], 1)
    page = k.get("format=metrics", extra=ADMIN).text
    assert_in("# HELP kembali_notify_conflicts_total ", page)
    assert_in("# TYPE kembali_notify_conflicts_total counter\n", page)
    # the same status again is harmless; --notify keeps its answer (0: what is known stays)
    check_recorded(notify(k, "c1", {"status": "failed"}))
    assert_eq(run_notify(k, "toko-a", "c1", "succeeded"), (0, "", ""))
    assert_eq(k.get("id=c1").header("kembali-status"), "failed")
    assert_eq(k.metrics()["kembali_notify_conflicts_total"], 1)
    assert_eq(sb.reads(), [])


def test_notify_secret_file_rules(tmpdir):
    """Read like a key file (a readable one is refused by name); for a
    tenant, keys_dir/NAME.notify, and a tenant file naming another file is
    skipped."""
    import os
    sb, k = kit.start(tmpdir)
    loose = os.path.join(tmpdir, "loose.notify")
    testenv.write_secret(loose, "whsec_loose")
    os.chmod(loose, 0o644)
    cfg = testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"), notify_secret_file=loose)])
    bad = os.path.join(tmpdir, "bad.json")
    testenv.write_config_file(bad, cfg)
    p = subprocess.run([testenv.kembali_bin(), "--config", bad, "--check-config"], capture_output=True, text=True,
                       timeout=30)
    assert p.returncode != 0, p
    assert_in("notify_secret_file", p.stderr + p.stdout)
    assert_in("loose.notify has mode 0644", p.stderr + p.stdout)
    assert "whsec_loose" not in p.stderr + p.stdout
    k.stop()

    keys, shops = os.path.join(tmpdir, "keys"), os.path.join(tmpdir, "shops")
    os.makedirs(keys)
    os.makedirs(shops)
    for name, key in (("toko-a", kit.KEY), ("toko-b", kit.KEY2), ("toko-c", kit.KEY2)):
        testenv.write_secret(os.path.join(keys, name), key)  # a tenant's key: keys_dir/NAME
    testenv.write_secret(os.path.join(keys, "toko-a.notify"), "whsec_tenant_a")
    testenv.write_secret(os.path.join(keys, "toko-b.notify"), "whsec_tenant_b")
    testenv.write_config_file(os.path.join(shops, "toko-a.json"), testenv.make_shop("toko-a"))
    # toko-b's file names toko-a's notify secret: skipped
    testenv.write_config_file(os.path.join(shops, "toko-b.json"), testenv.make_shop(
        "toko-b", notify_secret_file=os.path.join(keys, "toko-a.notify")))
    testenv.write_config_file(os.path.join(shops, "toko-c.json"), testenv.make_shop("toko-c"))
    t = testenv.Kembali(tmpdir, name="tenants", config=testenv.make_config(sb, [], keys_dir=keys, shops_dir=shops))
    t.start()
    line = t.wait_log(30, event="shop_file_skipped", file=os.path.join(shops, "toko-b.json"))
    assert_in("toko-b.notify", line["errors"])
    body = b'{"status": "succeeded"}'
    a = dict(HTTP_HOST="toko-a.test")
    r = notify(t, "n1", body, secret="whsec_tenant_a", extra=a)
    check_recorded(r)
    r = notify(t, "n2", body, secret="whsec_tenant_b", extra=a)  # another tenant's secret
    assert_eq(r.status, 401)
    r = notify(t, "n3", body, secret="whsec_tenant_a", extra=dict(HTTP_HOST="toko-c.test"))
    assert_eq(r.status, 403, "toko-c has no keys_dir/toko-c.notify: %r" % r)


def doc_notify_location():
    """docs/answers.md's nginx notify location, verbatim."""
    import os
    import re
    with open(os.path.join(testenv.top_srcdir(), "docs", "answers.md")) as f:
        text = f.read()
    m = re.search(r"^( *)location = /kembali-notify \{.*?^\1\}$", text, re.S | re.M)
    assert m, "docs/answers.md has a location = /kembali-notify block"
    return m.group(0)


def test_documented_notify_location_through_nginx(tmpdir):
    """docs/answers.md's location, as written (its socket path swapped for the
    test's), with a signed POST as docs/answers.md's PHP example makes it."""
    import http.client
    import time
    sb, k = kit.start(tmpdir)
    loc = doc_notify_location()
    assert_in("unix:/run/kembali/kembali.sock", loc)
    # `include fastcgi_params` is relative to nginx's configuration folder: the installed file
    import shutil
    shutil.copy("/etc/nginx/fastcgi_params", tmpdir)
    ng = testenv.Nginx(tmpdir, k, server_extra=loc.replace("unix:/run/kembali/kembali.sock", "unix:" + k.addr))
    sb.put_tx("ng1", "pending")

    def post(body, sig):
        c = http.client.HTTPConnection("127.0.0.1", ng.port, timeout=30)
        try:
            h = {"Host": "shop.test", "Content-Type": "application/json"}
            if sig:
                h["Kembali-Signature"] = sig
            c.request("POST", "/kembali-notify?format=notify&id=ng1", body=body, headers=h)
            r = c.getresponse()
            return r.status, r.read()
        finally:
            c.close()

    body = b'{"status":"failed"}'
    assert_eq(post(body, None)[0], 401)
    assert_eq(post(body, kit.sign("ng1", body, t=int(time.time()) - 301))[0], 401)
    assert_eq(post(body, kit.sign("ng1", body, secret="whsec_guess"))[0], 401)
    assert_eq(json_status(k, "ng1")[1]["status"], "pending")
    status, out = post(body, kit.sign("ng1", body))
    assert_eq((status, out), (204, b""))
    assert_eq(k.get("id=ng1").header("kembali-status"), "failed")
    status, out = post(b'{"status":"succeeded"}', kit.sign("ng1", b'{"status":"succeeded"}'))
    assert_eq(status, 409)
    assert_in(b"failed is already known", out)
    assert_eq(k.get("id=ng1").header("kembali-status"), "failed")


def test_documented_php_webhook_through_nginx(tmpdir):
    """docs/answers.md's PHP webhook handler, verbatim but for its secret's path
    and the web server's port, run by the real php through docs/answers.md's
    nginx location: its signature is the one kembali checks."""
    import os
    import re
    import shutil
    with open(os.path.join(testenv.top_srcdir(), "docs", "answers.md")) as f:
        m = re.search(r"```php\n(<\?php // the webhook handler.*?)```", f.read(), re.S)
    assert m, "docs/answers.md's PHP webhook example"
    php = m.group(1)
    assert_in("hash_hmac('sha256', \"$t.$id.$body\", $secret)", php)
    sb, k = kit.start(tmpdir)
    shutil.copy("/etc/nginx/fastcgi_params", tmpdir)
    ng = testenv.Nginx(tmpdir, k, server_extra=doc_notify_location().replace(
        "unix:/run/kembali/kembali.sock", "unix:" + k.addr))
    php = php.replace("/etc/kembali/keys/toko-a.notify", k.key_path("notify-a"))
    php = php.replace("http://127.0.0.1/kembali-notify", "http://127.0.0.1:%d/kembali-notify" % ng.port)
    script = os.path.join(tmpdir, "webhook.php")
    with open(script, "w") as f:
        f.write("<?php $event = json_decode(getenv('EVENT'), true); ?>\n" + php)
    sb.put_tx("php1", "pending")

    def webhook(kind, id):
        p = subprocess.run(["php", script], env=dict(os.environ, EVENT=json.dumps({"type": kind, "data": {"id": id}})),
                           capture_output=True, text=True, timeout=30)
        assert_eq(p.returncode, 0, p.stderr)

    webhook("payment.paid", "php1")
    line = k.wait_log(30, event="notify", id="php1")
    assert_eq((line["status"], line["result"], line["http"]), ("succeeded", "recorded", "204"))
    assert_eq(k.get("id=php1").header("kembali-status"), "succeeded")
    webhook("payment.expired", "php2")
    assert_eq(k.get("id=php2").header("kembali-status"), "expired")
    assert_eq(sb.reads(), [])


def run_notify(k, *args):
    p = subprocess.run([testenv.kembali_bin(), "--config", k.config_path, "--notify"] + list(args),
                       capture_output=True, text=True, timeout=30)
    return p.returncode, p.stdout, p.stderr


def test_notify_command_while_held(tmpdir):
    """--notify in another process: the running kembali's held requests are
    answered (the futex in the shared state), and no read is made."""
    import time
    sb, k = kit.start(tmpdir, schedule=[0, 10000, 10000])  # held past --notify's start on a busy machine
    sb.put_tx("t9", "pending")
    join = hold(k, "t9", 10)
    assert_eq(run_notify(k, "toko-a", "t9", "succeeded"), (0, "", ""))
    after = time.time()
    answers = join()
    assert_eq([r.header("kembali-status") for r in answers], ["succeeded"] * 10)
    lines = k.find_log(event="request", id="t9")
    lat = sorted(round((kit.log_time(l) - after) * 1000) for l in lines)
    print("# held answered after --notify exited (ms, kembali's log vs the test's clock): max %d" % lat[-1])
    # the pace goes on while --notify starts (a busy machine can make that
    # take longer than a wait): once it has recorded the status, no read
    assert_eq(reads_after(k, "t9", after), [])
    assert_eq(k.get("id=t9").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("t9")), len(k.find_log(event="read", id="t9")))
    # before any return, with no kembali running at all
    k.stop()
    assert_eq(run_notify(k, "toko-a", "t10", "failed"), (0, "", ""))
    k.start()
    assert_eq(k.get("id=t10").header("kembali-status"), "failed")
    assert_eq(sb.reads("t10"), [])


def test_notify_command_errors(tmpdir):
    sb, k = kit.start(tmpdir)
    for args, reason in ((("nope", "t1", "succeeded"), "shop nope"),
                         (("toko-a", "bad id", "succeeded"), "id bad id"),
                         (("toko-a", "t1", "paid"), "status paid"),
                         (("toko-a", "t1", "unknown"), "status unknown"),
                         (("toko-a", "t1", "SUCCEEDED"), "status SUCCEEDED")):
        rc, out, err = run_notify(k, *args)
        assert_eq((rc, out), (1, ""), "%r: %s" % (args, err))
        assert_in(reason, err)
    p = subprocess.run([testenv.kembali_bin(), "--config", k.config_path, "--notify", "toko-a", "t1"],
                       capture_output=True, text=True, timeout=30)
    assert_eq(p.returncode, 2)
    assert_in("--notify needs SHOP ID STATUS", p.stderr)
    p = subprocess.run([testenv.kembali_bin(), "--config", "/nonexistent.json", "--notify", "toko-a", "t1",
                        "failed"], capture_output=True, text=True, timeout=30)
    assert_eq(p.returncode, 1)
    assert_in("not usable", p.stderr)
    assert_eq(sb.reads(), [])


if __name__ == "__main__":
    testenv.run(globals())
