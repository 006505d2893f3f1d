"""Tenants' files: shops_dir with keys_dir and shop_templates_root, a bad
shop file skipped by name (at start, at SIGHUP, by --check-config), key
file modes, and a process that cannot be dumped."""

import json
import os
import shutil
import signal

import harness
import kit
from harness import assert_eq, assert_in


def tenants(tmpdir, sb):
    """keys_dir with one key per tenant, shops_dir with one file each;
    returns (config dict, shops_dir, keys_dir)."""
    keys = os.path.join(tmpdir, "keys")
    shops = os.path.join(tmpdir, "shops")
    os.makedirs(keys, exist_ok=True)
    os.makedirs(shops, exist_ok=True)
    for name, secret in (("a", kit.KEY), ("b", kit.KEY2)):
        harness.write_secret(os.path.join(keys, name), secret)
    cfg = harness.make_config(sb, [], keys_dir=keys, shops_dir=shops)
    return cfg, shops, keys


def write_shop(shops, fname, shop):
    path = os.path.join(shops, fname)
    harness.write_config_file(path, shop)
    return path


def test_sighup_with_one_broken_shop_file(tmpdir):
    sb = harness.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb)
    write_shop(shops, "a.json", harness.make_shop("toko-a", os.path.join(keys, "a"), name="Toko A v1"))
    write_shop(shops, "b.json", harness.make_shop("toko-b", os.path.join(keys, "b"), name="Toko B v1"))
    k = harness.Kembali(tmpdir, config=cfg)
    k.start()
    sb.put_tx("t1", "succeeded")
    assert_in("Toko A v1", k.get("id=t1", host="toko-a.test").text)
    assert_in("Toko B v1", k.get("id=t1", host="toko-b.test").text)

    # b's tenant makes a typo, a's renames the shop, a new tenant c arrives
    write_shop(shops, "a.json", harness.make_shop("toko-a", os.path.join(keys, "a"), name="Toko A v2"))
    bad = write_shop(shops, "b.json", harness.make_shop("toko-b", os.path.join(keys, "b"), name="Toko B v2",
                                                         colour="red"))
    write_shop(shops, "c.json", harness.make_shop("toko-c", os.path.join(keys, "a"), name="Toko C"))
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

    # a shop file naming another tenant's key through a link out of keys_dir
    outside = os.path.join(tmpdir, "other-tenant.key")
    harness.write_secret(outside, kit.KEY2)
    os.symlink(outside, os.path.join(keys, "sneaky"))
    evil = write_shop(shops, "d.json", harness.make_shop("toko-d", os.path.join(keys, "sneaky")))
    envy = write_shop(shops, "e.json", {"id": "toko-e", "secret_key_env": "HOME"})
    k.signal(signal.SIGHUP)
    line = k.wait_log(30, event="shop_file_skipped", file=evil)
    assert_in("outside keys_dir", line["errors"])
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
    sb = harness.Sandbox(tmpdir, keys=(kit.KEY, kit.KEY2))
    cfg, shops, keys = tenants(tmpdir, sb)
    write_shop(shops, "a.json", harness.make_shop("toko-a", os.path.join(keys, "a")))
    bad = os.path.join(shops, "b.json")
    with open(bad, "w") as f:
        f.write('{"id": "toko-b", "secret_key_file": ')
    k = harness.Kembali(tmpdir, config=cfg)
    k.start()
    line = k.wait_log(30, event="shop_file_skipped", file=bad)
    assert_eq(line["at"], "start")
    sb.put_tx("t1", "failed")
    assert_eq(k.get("id=t1", host="toko-a.test").header("kembali-status"), "failed")


def test_check_config_names_every_bad_shop_file(tmpdir):
    cfg, shops, keys = tenants(tmpdir, None)
    cfg["api_base"] = "http://127.0.0.1:9"
    write_shop(shops, "a.json", harness.make_shop("toko-a", os.path.join(keys, "a")))
    rc, out = harness.Kembali.run_check_config(cfg)
    assert_eq(rc, 0, out)
    b = write_shop(shops, "b.json", harness.make_shop("toko-b", os.path.join(keys, "b"), typo=1))
    harness.write_secret(os.path.join(tmpdir, "k"), kit.KEY2)
    c = write_shop(shops, "c.json", harness.make_shop("toko-c", os.path.join(keys, "..", "keys", "..", "k")))
    d = write_shop(shops, "d.json", harness.make_shop("toko-d", os.path.join(keys, "a"), templates_dir="/etc"))
    rc, out = harness.Kembali.run_check_config(cfg)
    assert_eq(rc, 1, out)
    for path, why in ((b, "typo: unknown key"), (c, "secret_key_file"), (d, "templates_dir")):
        assert_in("%s: %s" % (path, why), out)
    assert_in("outside keys_dir", out)
    assert_in("shop_templates_root", out)
    assert_in("3 shop files would be skipped", out)
    assert_in("shop toko-a", out)
    # shops_dir without keys_dir: the main configuration is not usable
    rc, out = harness.Kembali.run_check_config(dict(cfg, keys_dir=None))
    assert_eq(rc, 1, out)
    assert_in("keys_dir", out)


def test_key_file_modes(tmpdir):
    sb = harness.Sandbox(tmpdir, keys=(kit.KEY,))
    key = os.path.join(tmpdir, "k")
    harness.write_secret(key, kit.KEY)
    cfg = harness.make_config(sb, [harness.make_shop("toko-a", key)])
    for mode, ok in ((0o644, False), (0o660, False), (0o602, False), (0o600, True), (0o640, True)):
        os.chmod(key, mode)
        rc, out = harness.Kembali.run_check_config(cfg)
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
    sb = harness.Sandbox(tmpdir, keys=(kit.KEY,))
    sb.put_tx("t1", "succeeded")
    port = harness.free_port()
    state = os.path.join(tmpdir, "state-nd")
    os.makedirs(state, mode=0o700)
    key = os.path.join(tmpdir, "nd.key")
    harness.write_secret(key, kit.KEY)
    args = []
    bin = harness.kembali_bin()
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            raise harness.Skip("setpriv (util-linux) is needed to run kembali as nobody")
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
    k = harness.Kembali(tmpdir, config=harness.make_config(sb, [harness.make_shop("toko-a", key)], state_dir=state),
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


if __name__ == "__main__":
    harness.run(globals())
