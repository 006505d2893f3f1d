"""Tenants' files: shops_dir with keys_dir and shop_templates_root
(shops_dir/NAME.json is the shop NAME, its key keys_dir/NAME), a bad shop
file skipped by name (at start, at SIGHUP, by --check-config), hostile
tenants' files (another's id, host or key), size caps, key file modes, and
a process that cannot be dumped."""

import json
import os
import shutil
import signal

import testenv
import kit
from testenv import assert_eq, assert_in


def tenants(tmpdir, sb, names=("toko-a", "toko-b")):
    """keys_dir with one key per tenant (keys_dir/NAME: KEY, KEY2, KEY, ...),
    an empty shops_dir; returns (config dict, shops_dir, keys_dir)."""
    keys = os.path.join(tmpdir, "keys")
    shops = os.path.join(tmpdir, "shops")
    os.makedirs(keys, exist_ok=True)
    os.makedirs(shops, exist_ok=True)
    for i, name in enumerate(names):
        testenv.write_secret(os.path.join(keys, name), (kit.KEY, kit.KEY2)[i % 2])
    cfg = testenv.make_config(sb, [], keys_dir=keys, shops_dir=shops)
    return cfg, shops, keys


def write_shop(shops, fname, shop):
    path = os.path.join(shops, fname)
    testenv.write_config_file(path, shop)
    return path


def tenant(shop_name, keys=None, **kw):
    """A tenant's shop file: testenv.make_shop without id and key (the file's
    name and keys_dir/NAME say them), or, given `keys` (keys_dir), with
    both spelt out as they must be (id NAME, secret_key_file keys/NAME)."""
    shop = testenv.make_shop(shop_name, os.path.join(keys, shop_name) if keys else None, **kw)
    if "id" not in kw and keys is None:
        del shop["id"]
    return shop


def test_sighup_with_one_broken_shop_file(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "toko-b", "toko-c"))
    write_shop(shops, "toko-a.json", testenv.make_shop("toko-a", os.path.join(keys, "toko-a"), name="Toko A v1"))
    write_shop(shops, "toko-b.json", tenant("toko-b", name="Toko B v1"))
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    sb.put_tx("t1", "succeeded")
    assert_in("Toko A v1", k.get("id=t1", host="toko-a.test").text)
    assert_in("Toko B v1", k.get("id=t1", host="toko-b.test").text)

    # b's tenant makes a typo, a's renames the shop, a new tenant c arrives
    write_shop(shops, "toko-a.json", tenant("toko-a", name="Toko A v2"))
    bad = write_shop(shops, "toko-b.json", tenant("toko-b", name="Toko B v2", colour="red"))
    write_shop(shops, "toko-c.json", tenant("toko-c", name="Toko C"))
    k.signal(signal.SIGHUP)
    line = k.wait_log(30, event="shop_file_skipped", file=bad)
    assert_eq(line["level"], "error")
    assert_eq(line["kept"], "previous")
    assert_in("colour", line["errors"])
    k.wait_log(30, event="reload", level="info")
    assert_in("Toko A v2", k.get("id=t1", host="toko-a.test").text, "the others reload")
    assert_in("Toko C", k.get("id=t1", host="toko-c.test").text)
    r = k.get("id=t1", host="toko-b.test")
    assert_eq(r.header("kembali-status"), "succeeded")
    assert_in("Toko B v1", r.text, "the broken shop keeps serving its old version")

    # a tenant's key that is a link to another file; a tenant reading the
    # environment
    outside = os.path.join(tmpdir, "other-tenant.key")
    testenv.write_secret(outside, kit.KEY2)
    os.symlink(outside, os.path.join(keys, "toko-d"))
    evil = write_shop(shops, "toko-d.json", tenant("toko-d"))
    envy = write_shop(shops, "toko-e.json", {"secret_key_env": "HOME"})
    k.signal(signal.SIGHUP)
    line = k.wait_log(30, event="shop_file_skipped", file=evil)
    assert_in("is a symbolic link", line["errors"])
    assert_eq(line["kept"], "none")
    assert_in("secret_key_env", k.wait_log(30, event="shop_file_skipped", file=envy)["errors"])
    assert_eq(k.get("id=t1", host="toko-d.test").header("kembali-status"), "unknown_shop")
    assert kit.KEY2 not in k.log_text()

    # a broken main configuration is still refused as a whole
    k.write_config("{broken")
    k.reload()
    k.wait_log(30, event="reload", level="error")
    assert_in("Toko A v2", k.get("id=t1", host="toko-a.test").text)


def test_start_skips_a_bad_shop_file(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb)
    write_shop(shops, "toko-a.json", tenant("toko-a"))
    bad = os.path.join(shops, "toko-b.json")
    with open(bad, "w") as f:
        f.write('{"id": "toko-b", "secret_key_file": ')
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    line = k.wait_log(30, event="shop_file_skipped", file=bad)
    assert_eq(line["at"], "start")
    sb.put_tx("t1", "failed")
    assert_eq(k.get("id=t1", host="toko-a.test").header("kembali-status"), "failed")


def test_check_config_names_every_bad_shop_file(tmpdir):
    cfg, shops, keys = tenants(tmpdir, None, ("toko-a", "toko-b", "toko-c", "toko-d", "toko-e", "toko-f"))
    cfg["api_base"] = "http://127.0.0.1:9"
    cfg["shops"] = [testenv.make_shop("main", os.path.join(keys, "toko-f"))]
    write_shop(shops, "toko-a.json", tenant("toko-a"))
    rc, out = testenv.Kembali.run_check_config(cfg)
    assert_eq(rc, 0, out)
    b = write_shop(shops, "toko-b.json", tenant("toko-b", typo=1))
    testenv.write_secret(os.path.join(tmpdir, "k"), kit.KEY2)
    c = write_shop(shops, "toko-c.json", testenv.make_shop("toko-c", os.path.join(keys, "..", "keys", "..", "k")))
    d = write_shop(shops, "toko-d.json", tenant("toko-d", templates_dir="/etc"))
    e = write_shop(shops, "toko-e.json", tenant("toko-e", hosts=["main.test"]))
    f = write_shop(shops, "toko-f.json", tenant("toko-f"))
    g = write_shop(shops, "Toko G.json", tenant("toko-g"))
    rc, out = testenv.Kembali.run_check_config(cfg)
    assert_eq(rc, 1, out)
    for path, why in ((b, "typo: unknown key"), (c, "secret_key_file: names"), (d, "templates_dir"),
                      (e, 'hosts: the host "main.test" is served by shop "main"'),
                      (f, 'secret_key_file: %s is the key file of shop "main"' % os.path.join(keys, "toko-f")),
                      (g, "not loaded: a shop file is named NAME.json")):
        assert_in("%s: %s" % (path, why), out)
    assert_in("may only use %s" % os.path.join(keys, "toko-c"), out)
    assert_in("shop_templates_root", out)
    assert_in("6 shop files would be skipped", out)
    assert_in("shop toko-a", out)
    # shops_dir without keys_dir: the main configuration is not usable
    rc, out = testenv.Kembali.run_check_config(dict(cfg, keys_dir=None))
    assert_eq(rc, 1, out)
    assert_in("keys_dir", out)


def test_hostile_files_take_nothing_from_other_tenants(tmpdir):
    """A file sorting first with another tenant's id, host or key file; a
    file naming another tenant's key; a reload where a new file claims a
    host that a shop serves: each is skipped, naming the shop it collided
    with, and the other tenants' buyers keep their own shop (and key)."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "toko-b", "00-evil", "01-thief"))
    write_shop(shops, "toko-a.json", tenant("toko-a", keys, name="Toko A"))
    write_shop(shops, "toko-b.json", tenant("toko-b", keys, name="Toko B", shop_url="https://toko-b.test/"))
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    sb.put_tx("t1", "succeeded")
    assert_in("Toko B", k.get("id=t1", host="toko-b.test").text)

    # the file of the issue: toko-b's id, host and key file, sorting first
    evil = write_shop(shops, "00-evil.json", testenv.make_shop(
        "toko-b", os.path.join(keys, "toko-b"), name="EVIL SHOP", hosts=["toko-b.test"],
        shop_url="https://evil.test/"))
    k.signal(signal.SIGHUP)
    line = k.wait_log(30, event="shop_file_skipped", file=evil)
    assert_in('id: "toko-b" is not the file\'s name', line["errors"])
    assert_in("may only use %s" % os.path.join(keys, "00-evil"), line["errors"])
    k.wait_log(30, event="reload", level="info", skipped="1")

    # its own id and key, toko-b's host: skipped, naming toko-b
    write_shop(shops, "00-evil.json", tenant("00-evil", keys, name="EVIL SHOP", hosts=["toko-b.test"],
                                             shop_url="https://evil.test/"))
    # another tenant's key file, its own host
    thief = write_shop(shops, "01-thief.json", dict(tenant("01-thief", keys, hosts=["thief.test"]),
                                                    secret_key_file=os.path.join(keys, "toko-a")))
    k.signal(signal.SIGHUP)
    line = k.wait_log(30, event="shop_file_skipped", file=thief)
    assert_in("names %s, but the shop file 01-thief.json may only use %s"
              % (os.path.join(keys, "toko-a"), os.path.join(keys, "01-thief")), line["errors"])
    k.wait_log(30, event="reload", level="info", skipped="2")
    line = k.find_log(event="shop_file_skipped", file=evil)[-1]
    assert_eq(line["collides_with"], "toko-b")
    assert_in('the host "toko-b.test" is held by shop "toko-b"', line["errors"])
    assert_eq(line["kept"], "none")
    for _ in range(2):  # and again: the host stays with toko-b
        r = k.get("id=t1", host="toko-b.test")
        assert_eq(r.header("kembali-status"), "succeeded")
        assert_in("Toko B", r.text)
        assert "EVIL" not in r.text and "evil.test" not in r.text, r.text
        assert_eq(k.get("id=t1", host="thief.test").header("kembali-status"), "unknown_shop")
        assert_eq(k.get("id=t1", extra={"KEMBALI_SHOP": "01-thief"}).header("kembali-status"), "unknown_shop")
        k.signal(signal.SIGHUP)
        k.wait_log(30, event="reload", level="info")
    assert kit.KEY not in k.log_text() and kit.KEY2 not in k.log_text()

    # --check-config reads the host registry: the host is toko-b's
    rc, out = testenv.Kembali.run_check_config(k.config_path)
    assert_eq(rc, 1, out)
    assert_in('%s: hosts: the host "toko-b.test" is held by shop "toko-b"' % evil, out)
    assert_in("host toko-b.test: held by toko-b\n", out)


def test_one_tenant_answers_only_its_hosts(tmpdir):
    """With shops_dir, the only shop does not answer every host ("Which shop"
    rule 3): another tenant's host gets unknown_shop, not this shop's page."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a",))
    write_shop(shops, "toko-a.json", tenant("toko-a", keys, name="Toko A"))
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    sb.put_tx("t1", "succeeded")
    r = k.get("id=t1", host="toko-a.test")
    assert_eq(r.header("kembali-status"), "succeeded")
    assert_in("Toko A", r.text)
    for host in ("toko-b.test", "127.0.0.1"):
        r = k.get("id=t1", host=host)
        assert_eq(r.header("kembali-status"), "unknown_shop", host)
        assert "Toko A" not in r.text
    assert_eq(len(sb.reads("t1")), 1, "an unknown shop costs no read")


def test_oversize_name_hosts_and_template_refused(tmpdir):
    """A name over 200 characters, over 32 hosts, a template over 64 KiB, a
    small template repeating a 2 KB shop_url (55 MB a page, on main): each
    file is refused by name (a tenant must not make every page cost
    megabytes), at start and by --check-config."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("fine", "long-name", "many-hosts", "big-page", "amplify"))
    root = os.path.join(tmpdir, "tenant-templates")
    big = os.path.join(root, "big-page", "id")
    os.makedirs(big)
    page = os.path.join(big, "succeeded.html")
    with open(page, "w") as f:
        head = '<html data-status="{{status}}">'
        f.write(head + "x" * (64 * 1024 + 1 - len(head)))
    amp = os.path.join(root, "amplify", "id")
    os.makedirs(amp)
    with open(os.path.join(amp, "succeeded.html"), "w") as f:
        f.write(head + "{{shop_url}}" * 5000)
    cfg["shop_templates_root"] = root
    write_shop(shops, "fine.json", tenant("fine", keys, name="n" * 200, hosts=["h%d.test" % i for i in range(32)]))
    long_name = write_shop(shops, "long-name.json", tenant("long-name", keys, name="n" * 201))
    many = write_shop(shops, "many-hosts.json",
                      tenant("many-hosts", keys, hosts=["m%d.test" % i for i in range(33)]))
    big_page = write_shop(shops, "big-page.json",
                          tenant("big-page", keys, templates_dir=os.path.join(root, "big-page")))
    amplify = write_shop(shops, "amplify.json", tenant("amplify", keys, templates_dir=os.path.join(root, "amplify"),
                                                       shop_url="https://amplify.test/?" + "&" * 2000))
    rc, out = testenv.Kembali.run_check_config(cfg)
    assert_eq(rc, 1, out)
    assert_in("%s: name: is 201 characters long: at most 200" % long_name, out)
    assert_in("%s: hosts: at most 32 hosts" % many, out)
    assert_in("%s: templates_dir: %s: larger than 64 KiB" % (big_page, page), out)
    page_kib = (len(head) + 5000 * len("https://amplify.test/?" + "&amp;" * 2000)) // 1024
    assert_in("%s: templates_dir: the succeeded page would be %d KiB with this shop's name and shop_url: "
              "at most 256 KiB" % (amplify, page_kib), out)
    assert_in("4 shop files would be skipped", out)

    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    for f in (long_name, many, big_page, amplify):
        k.wait_log(30, event="shop_file_skipped", file=f, at="start")
    sb.put_tx("t1", "succeeded")
    assert_eq(k.get("id=t1", host="h31.test").header("kembali-status"), "succeeded")
    for host in ("long-name.test", "m0.test", "big-page.test", "amplify.test"):
        assert_eq(k.get("id=t1", host=host).header("kembali-status"), "unknown_shop", host)
    # exactly 64 KiB is a page like any other
    with open(page, "w") as f:
        f.write(head + "y" * (64 * 1024 - len(head)))
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="reload", level="info", skipped="3")
    r = k.get("id=t1", host="big-page.test")
    assert_eq(r.header("kembali-status"), "succeeded")
    assert_eq(len(r.body), 64 * 1024 - len("{{status}}") + len("succeeded"))
    assert r.text.startswith('<html data-status="succeeded">yyy'), r.text[:60]


def test_key_file_modes(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    key = os.path.join(tmpdir, "k")
    testenv.write_secret(key, kit.KEY)
    cfg = testenv.make_config(sb, [testenv.make_shop("toko-a", key)])
    for mode, ok in ((0o644, False), (0o660, False), (0o602, False), (0o600, True), (0o640, True)):
        os.chmod(key, mode)
        rc, out = testenv.Kembali.run_check_config(cfg)
        assert_eq(rc, 0 if ok else 1, "mode %o: %s" % (mode, out))
        if not ok:
            assert_in(key, out)
            assert_in("mode 0%o" % mode, out)
        assert kit.KEY not in out


def test_not_dumpable(tmpdir):
    """kembali makes itself non-dumpable at start (so keys never land in a
    core file): the kernel then gives /proc/PID to root. Run it as an
    ordinary user (not through --user, which makes any process
    non-dumpable), so only kembali's own prctl can explain a root owner."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    sb.put_tx("t1", "succeeded")
    port = testenv.free_port()
    state = os.path.join(tmpdir, "state-nd")
    os.makedirs(state, mode=0o700)
    key = os.path.join(tmpdir, "nd.key")
    testenv.write_secret(key, kit.KEY)
    args = []
    bin = testenv.kembali_bin()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            raise testenv.Skip("setpriv (util-linux) is needed to run kembali as nobody")
        import pwd
        pw = pwd.getpwnam("nobody")
        for p in (state, key):
            os.chown(p, pw.pw_uid, pw.pw_gid)
        os.chmod(tmpdir, 0o755)
        wrap = os.path.join(tmpdir, "as-nobody")
        with open(wrap, "w") as f:
            f.write('#!/bin/sh\nexec setpriv --reuid=%d --regid=%d --clear-groups %s "$@"\n'
                    % (pw.pw_uid, pw.pw_gid, bin))
        os.chmod(wrap, 0o755)
        bin = wrap
        uid = pw.pw_uid
    else:
        uid = os.geteuid()
    k = testenv.Kembali(tmpdir, config=testenv.make_config(sb, [testenv.make_shop("toko-a", key)], state_dir=state),
                        listen="127.0.0.1:%d" % port, bin=bin, name="nd")
    k.start()
    status = open("/proc/%d/status" % k.pid).read()
    uids = [l for l in status.splitlines() if l.startswith("Uid:")][0].split()[1:]
    assert_eq(set(uids), {str(uid)}, "kembali runs as that user")
    # /proc/PID itself keeps the task's owner (for ps); the files in it go
    # to root when the task is not dumpable
    assert_eq(os.stat("/proc/%d" % k.pid).st_uid, uid)
    for f in ("environ", "stat", "mem"):
        assert_eq(os.stat("/proc/%d/%s" % (k.pid, f)).st_uid, 0,
                  "/proc/PID/%s of a non-dumpable process belongs to root" % f)
    assert_eq(k.get("id=t1").header("kembali-status"), "succeeded")


def shop_key(i):
    return "sk_test_kembali_%016d" % (1000 + i)


def test_a_growing_host_has_room_for_every_key(tmpdir):
    """Room for every key: a host that grew by reloads from 1 to 70 shops
    (the state file made for one, with 64 key slots); 64 guessed ids, one
    on each of the first 64 shops from 64 addresses, read with 64 keys
    within the minute; shop 69's buyer of a paid payment is still read
    and answered succeeded (the table grew at the reload, keeping what it
    held)."""
    sb = testenv.Sandbox(tmpdir, keys=[shop_key(0)])
    names = ["shop%02d" % i for i in range(70)]
    cfg, shops, keys = tenants(tmpdir, sb, ())
    for i, name in enumerate(names):
        testenv.write_secret(os.path.join(keys, name), shop_key(i))
    write_shop(shops, names[0] + ".json", tenant(names[0]))
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    assert_eq(k.metrics()["kembali_state_key_slots"], 64)
    sb.put_tx("paid-00", "succeeded")
    assert_eq(k.get("id=paid-00", host="shop00.test").header("kembali-status"), "succeeded")
    for i, name in enumerate(names[1:], 1):
        sb.add_key(shop_key(i))
        write_shop(shops, name + ".json", tenant(name))
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="reload", level="info", shops=70)
    assert k.metrics()["kembali_state_key_slots"] >= 70, "a slot for every configured key"
    for i in range(64):
        r = k.get("id=guess-%02d-8371&format=json" % i, host="%s.test" % names[i],
                  extra={"REMOTE_ADDR": "198.51.100.%d" % (i + 1)}, timeout=30)
        assert_eq(r.header("kembali-status"), "not_found")
    sb.put_tx("paid-69", "succeeded")
    r = k.get("id=paid-69", host="shop69.test", timeout=60)
    assert_eq(r.header("kembali-status"), "succeeded", "shop 69's buyer is read and answered")
    assert_eq(len(sb.reads("paid-69")), 1)
    assert_eq(k.metrics()["kembali_state_key_full_total"], 0)


if __name__ == "__main__":
    testenv.run(globals())


def test_ten_rejected_keys_leave_the_other_tenants_reading(tmpdir):
    """Ten tenants whose keys Kasera rejects, one request each, against the
    sandbox's own per-IP failed-authentication limiter (10 failures within
    60 s block the IP): kembali makes at most auth_failures_per_minute (5)
    reads that end in 401, the other rejected keys make none (checking, a
    metric and a log line say why), and a healthy tenant's paid buyer is
    answered succeeded, not checking with Retry-After 61."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    keys = os.path.join(tmpdir, "keys")
    shops = os.path.join(tmpdir, "shops")
    os.makedirs(keys)
    os.makedirs(shops)
    bad = ["bad-%d" % i for i in range(10)]
    testenv.write_secret(os.path.join(keys, "toko-a"), kit.KEY)
    write_shop(shops, "toko-a.json", tenant("toko-a"))
    for i, name in enumerate(bad):
        testenv.write_secret(os.path.join(keys, name), "sk_test_rejected_%02d_xxxxxxxxxxxx" % i)
        write_shop(shops, name + ".json", tenant(name))
    cfg = testenv.make_config(sb, [], keys_dir=keys, shops_dir=shops, schedule_ms=kit.FAST)
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    sb.put_tx("t0", "succeeded")  # the healthy key has answered
    assert_eq(k.get("id=t0", host="toko-a.test").header("kembali-status"), "succeeded")

    for name in bad:
        sb.put_tx("x-" + name, "succeeded")
        r = k.get("id=x-" + name, host=name + ".test", timeout=30)
        assert_eq(r.header("kembali-status"), "checking")
    sb.put_tx("paid", "succeeded")
    r = k.get("id=paid", host="toko-a.test", timeout=30)
    assert_eq(r.header("kembali-status"), "succeeded", repr(r))
    assert_eq(r.header("retry-after"), None)
    reads = sb.reads()
    assert_eq(len([r for r in reads if r["http"] == 401]), 5, repr(reads))
    assert_eq(len([r for r in reads if r["http"] == 429]), 0, repr(reads))

    m = k.metrics()
    assert_eq(m.get('kembali_checking_answers_total{reason="auth_allowance"}'), 5, m)
    assert_eq(m.get("kembali_auth_failures_last_minute"), 5, m)
    line = k.wait_log(10, event="auth_allowance_spent")
    assert_eq(line["auth_failures_per_minute"], "5")
    assert len(k.find_log(event="auth_allowance_spent")) == 1  # one line a minute
