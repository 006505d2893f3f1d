"""Who holds a tenant's host (docs/tenants.md, "Who holds a host": a host belongs to
the shop that held it first), through a real shops_dir with real key
files and the host registry in state_dir: a broken file keeps and claims
its hosts, a restart remembers who held what, two files claiming a host
nobody held both wait (and are named), a host is released by removing the
file or by a version that loads without it; and two shops with different
keys may not share a notify secret."""

import os
import signal

import testenv
import kit
from testenv import assert_eq, assert_in
from test_tenants import tenant, tenants, write_shop


def status(k, host):
    r = k.get("id=t1", host=host)
    return r.header("kembali-status"), r.text


def registry(cfg):
    with open(os.path.join(cfg["state_dir"], "kembali.hosts")) as f:
        return dict(line.split() for line in f.read().splitlines()[1:])


def test_broken_file_never_hands_its_host_to_a_squatter(tmpdir):
    """The victim's key is refused (mode 0644) and evil.json lists the
    victim's host with its own: at start evil does not serve a.example
    (neither file gets it, both are named); after the victim fixes its key
    and kembali reloads, evil still never serves it."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "evil"))
    os.chmod(os.path.join(keys, "toko-a"), 0o644)
    victim = write_shop(shops, "toko-a.json", tenant("toko-a", name="Toko A", hosts=["a.example"]))
    evil = write_shop(shops, "evil.json", tenant("evil", name="EVIL", hosts=["a.example", "evil.example"],
                                                 shop_url="https://phish.example/"))
    sb.put_tx("t1", "succeeded")

    rc, out = testenv.Kembali.run_check_config(cfg)
    assert_eq(rc, 1, out)
    assert_in("%s: secret_key_file" % victim, out)
    assert_in('%s: hosts: the host "a.example" is also claimed by shop "toko-a"' % evil, out)
    assert_in("host a.example: held by nobody, claimed by", out)

    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    line = k.wait_log(30, event="shop_file_skipped", file=evil)
    assert_eq(line["collides_with"], "toko-a")
    assert_eq(line["kept"], "none")
    line = k.wait_log(30, event="shop_file_skipped", file=victim)
    assert_in("mode 0644", line["errors"])
    for host in ("a.example", "evil.example"):
        st, text = status(k, host)
        assert_eq(st, "unknown_shop", host)
        assert "EVIL" not in text and "phish" not in text, text

    # the victim fixes its key: evil still never gets the host
    os.chmod(os.path.join(keys, "toko-a"), 0o600)
    for _ in range(2):
        k.signal(signal.SIGHUP)
        k.wait_log(30, event="reload", level="info")
        st, text = status(k, "a.example")
        assert "EVIL" not in text and "phish" not in text, text
        assert_eq(st, "unknown_shop", "nobody held it: neither file gets it until one gives it up")
    line = k.find_log(event="shop_file_skipped", file=evil, at="reload")[-1]
    assert_in('the host "a.example" is also claimed by shop "toko-a"', line["errors"])

    # evil gives the host up: the victim gets it, evil serves only its own
    write_shop(shops, "evil.json", tenant("evil", name="EVIL", hosts=["evil.example"]))
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="reload", level="info", skipped="0")
    st, text = status(k, "a.example")
    assert_eq(st, "succeeded")
    assert_in("Toko A", text)
    assert_eq(registry(cfg), {"a.example": "toko-a", "evil.example": "evil"})
    # and now that toko-a holds it, evil listing it again takes nothing
    write_shop(shops, "evil.json", tenant("evil", name="EVIL", hosts=["a.example", "evil.example"]))
    os.chmod(os.path.join(keys, "toko-a"), 0o644)  # even with the victim's file broken again
    k.signal(signal.SIGHUP)
    line = k.wait_log(30, event="shop_file_skipped", file=evil, collides_with="toko-a", kept="previous")
    assert_in('the host "a.example" is held by shop "toko-a"', line["errors"])
    k.wait_log(30, event="reload", level="info", skipped="2")
    st, text = status(k, "a.example")
    assert_eq(st, "succeeded")
    assert_in("Toko A", text, "the victim's previous version keeps serving")


def test_restart_remembers_who_held_a_host(tmpdir):
    """toko-b served b.test; while kembali was stopped an intruder's file
    listing b.test was added (sorting first): after the start b.test is
    still toko-b's, and --check-config says so."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-b", "00-intruder"))
    write_shop(shops, "toko-b.json", tenant("toko-b", name="Toko B", hosts=["b.test"]))
    sb.put_tx("t1", "succeeded")
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    assert_in("Toko B", status(k, "b.test")[1])
    assert_eq(k.stop(), 0)

    intruder = write_shop(shops, "00-intruder.json", tenant("00-intruder", name="INTRUDER", hosts=["b.test"]))
    rc, out = testenv.Kembali.run_check_config(cfg)
    assert_eq(rc, 1, out)
    assert_in("host b.test: held by toko-b\n", out)
    assert_in('%s: hosts: the host "b.test" is held by shop "toko-b"' % intruder, out)
    k.start()
    line = k.wait_log(30, event="shop_file_skipped", file=intruder, at="start")
    assert_eq(line["collides_with"], "toko-b")
    st, text = status(k, "b.test")
    assert_eq(st, "succeeded")
    assert_in("Toko B", text)
    assert "INTRUDER" not in text
    assert_eq(registry(cfg), {"b.test": "toko-b"})


def test_two_new_files_on_one_host_both_wait(tmpdir):
    """Two files claiming a host nobody held: neither gets it, each is
    named in the other's line and by --check-config."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "toko-b"))
    a = write_shop(shops, "toko-a.json", tenant("toko-a", hosts=["shared.test", "a.test"]))
    b = write_shop(shops, "toko-b.json", tenant("toko-b", hosts=["shared.test"]))
    sb.put_tx("t1", "succeeded")
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    assert_eq(k.wait_log(30, event="shop_file_skipped", file=a)["collides_with"], "toko-b")
    assert_eq(k.wait_log(30, event="shop_file_skipped", file=b)["collides_with"], "toko-a")
    assert_eq(status(k, "shared.test")[0], "unknown_shop")
    assert_eq(status(k, "a.test")[0], "unknown_shop")
    rc, out = testenv.Kembali.run_check_config(cfg)
    assert_eq(rc, 1, out)
    assert_in("host shared.test: held by nobody, claimed by toko-a and toko-b", out)
    assert_in("host a.test: held by toko-a (its file is skipped", out)
    # a restart changes nothing (nobody held it)
    assert_eq(k.stop(), 0)
    k.start()
    k.wait_log(30, event="shop_file_skipped", file=b, at="start")
    assert_eq(status(k, "shared.test")[0], "unknown_shop")


def test_hosts_released_by_removal_or_by_a_version_without_them(tmpdir):
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "toko-b", "toko-c"))
    a = write_shop(shops, "toko-a.json", tenant("toko-a", name="Toko A", hosts=["one.test", "two.test"]))
    sb.put_tx("t1", "succeeded")
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    b = write_shop(shops, "toko-b.json", tenant("toko-b", name="Toko B", hosts=["one.test"]))
    c = write_shop(shops, "toko-c.json", tenant("toko-c", name="Toko C", hosts=["two.test"]))
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="shop_file_skipped", file=b, collides_with="toko-a")
    k.wait_log(30, event="shop_file_skipped", file=c, collides_with="toko-a")
    k.wait_log(30, event="reload", level="info", skipped="2")

    # a version of toko-a that loads without two.test releases it
    write_shop(shops, "toko-a.json", tenant("toko-a", name="Toko A", hosts=["one.test"]))
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="reload", level="info", skipped="1")
    assert_in("Toko C", status(k, "two.test")[1])
    assert_in("Toko A", status(k, "one.test")[1])
    # a broken version of toko-a releases nothing
    write_shop(shops, "toko-a.json", {"hosts": [], "colour": "red"})
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="shop_file_skipped", file=a, kept="previous")
    k.wait_log(30, event="reload", level="info", skipped="2")
    assert_in("Toko A", status(k, "one.test")[1])
    # removing toko-a's file releases one.test
    os.unlink(a)
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="reload", level="info", skipped="0")
    assert_in("Toko B", status(k, "one.test")[1])
    assert_eq(registry(cfg), {"one.test": "toko-b", "two.test": "toko-c"})


def test_reload_decides_under_the_registry_lock(tmpdir):
    """Processes sharing state_dir decide one at a time: a reload takes the
    registry's lock from reading to writing it. While another holder keeps
    it (here: this test), the reload is refused after a bounded wait and
    the old configuration keeps serving; once released, it goes through."""
    import fcntl
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "toko-b"))
    write_shop(shops, "toko-a.json", tenant("toko-a", name="Toko A", hosts=["a.test"]))
    sb.put_tx("t1", "succeeded")
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    write_shop(shops, "toko-b.json", tenant("toko-b", name="Toko B", hosts=["b.test"]))
    with open(os.path.join(cfg["state_dir"], "kembali.hosts.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        k.signal(signal.SIGHUP)
        line = k.wait_log(30, event="reload", level="error")
        assert_in("another process has held it", line["errors"])
        assert_eq(status(k, "b.test")[0], "unknown_shop")
        assert_eq(registry(cfg), {"a.test": "toko-a"})
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="reload", level="info")
    assert_in("Toko B", status(k, "b.test")[1])
    assert_eq(registry(cfg), {"a.test": "toko-a", "b.test": "toko-b"})


def test_start_as_root_writes_the_registry_as_the_serving_user(tmpdir):
    """Started as root with --user, kembali reads the keys and the registry
    as root but writes the registry only after dropping privileges, so a
    later reload (as that user) can still replace it."""
    if os.geteuid() != 0:
        raise testenv.Skip("needs root (--user)")
    import pwd
    pw = pwd.getpwnam("nobody")
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "toko-b"))
    os.chmod(tmpdir, 0o755)
    os.chown(cfg["state_dir"], pw.pw_uid, pw.pw_gid)
    for name in ("toko-a", "toko-b"):  # root's keys, read before --user drops privileges
        os.chmod(os.path.join(keys, name), 0o600)
    write_shop(shops, "toko-a.json", tenant("toko-a", name="Toko A", hosts=["a.test"]))
    sb.put_tx("t1", "succeeded")
    k = testenv.Kembali(tmpdir, config=cfg, args=["--user", "nobody"])
    k.start()
    assert_in("Toko A", status(k, "a.test")[1])
    reg = os.path.join(cfg["state_dir"], "kembali.hosts")
    assert_eq(os.stat(reg).st_uid, pw.pw_uid)
    assert_eq(registry(cfg), {"a.test": "toko-a"})
    # a reload as nobody replaces it (toko-b's key is root's: its file is
    # skipped, and claims its free host)
    write_shop(shops, "toko-b.json", tenant("toko-b", name="Toko B", hosts=["b.test"]))
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="shop_file_skipped", file=os.path.join(shops, "toko-b.json"))
    k.wait_log(30, event="reload", level="info")
    assert_eq(registry(cfg), {"a.test": "toko-a", "b.test": "toko-b"})
    assert_eq(os.stat(reg).st_uid, pw.pw_uid)


def test_shared_notify_secret_skips_the_second(tmpdir):
    """Two tenants with different keys and one notify secret: the second
    is skipped naming the first, so a notify signed for one is never
    accepted for the other; in `shops` the configuration is refused."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb, ("toko-a", "toko-b"))
    for name in ("toko-a", "toko-b"):
        testenv.write_secret(os.path.join(keys, name + ".notify"), "whsec_shared")
    write_shop(shops, "toko-a.json", tenant("toko-a", name="Toko A"))
    b = write_shop(shops, "toko-b.json", tenant("toko-b", name="Toko B"))
    k = testenv.Kembali(tmpdir, config=cfg)
    k.start()
    line = k.wait_log(30, event="shop_file_skipped", file=b)
    assert_eq(line["collides_with"], "toko-a")
    assert_in('the notify secret is the one of shop "toko-a"', line["errors"])
    assert "whsec_shared" not in k.log_text()
    body = b'{"status": "failed"}'
    r = kit.notify(k, "n1", body, secret="whsec_shared", extra=dict(HTTP_HOST="toko-b.test"))
    assert_eq(r.header("kembali-status"), "unknown_shop")
    assert r.status != 204, r
    r = kit.notify(k, "n1", body, secret="whsec_shared", extra=dict(HTTP_HOST="toko-a.test"))
    assert_eq(r.status, 204)

    # the same key may share it (one shop, two files)
    testenv.write_secret(os.path.join(keys, "toko-b"), kit.KEY)
    k.signal(signal.SIGHUP)
    k.wait_log(30, event="reload", level="info", skipped="0")

    # in `shops`: the configuration is refused, naming both
    main = testenv.make_config(sb, [
        testenv.make_shop("m-a", os.path.join(keys, "toko-a"), notify_secret_file=os.path.join(keys, "toko-a.notify")),
        testenv.make_shop("m-b", os.path.join(keys, "toko-b"), notify_secret_file=os.path.join(keys, "toko-b.notify")),
    ], keys_dir=keys)
    testenv.write_secret(os.path.join(keys, "toko-b"), kit.KEY2)
    rc, out = testenv.Kembali.run_check_config(main)
    assert_eq(rc, 1, out)
    assert_in('shops "m-a" and "m-b" have different keys and one notify secret', out)
    assert "whsec_shared" not in out


if __name__ == "__main__":
    testenv.run(globals())
