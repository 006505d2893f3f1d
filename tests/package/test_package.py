"""The Debian package, end to end, as root (contrib/test runs it as its own
step, after the plain build's `make check`; not part of `make check`, which
distcheck runs): built with dpkg-buildpackage from a clean copy of HEAD (git
archive: nothing uncommitted gets in), checked by lintian, installed with
apt-get, its files and user checked, the installed kembali started the way
kembali.service and kembali@.service start it (their command lines, user and
state folder, the socket of kembali.socket and kembali@.socket handed over as
systemd does; no systemd needed) against the local Kasera sandbox, answering
through that socket; then purged, leaving nothing of kembali.

Needs: root, git, dpkg-dev, debhelper, lintian, fakeroot (contrib/deps) and
the build's sandbox (top_builddir), pytest (tests/package/conftest.py gives
it the integration tests' fixtures). Run:
    top_builddir=build top_srcdir=. python3 -m pytest tests/package/test_package.py
"""

import glob
import grp
import os
import pwd
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

import testenv  # noqa: E402
import kit  # noqa: E402
from testenv import assert_eq, assert_in  # noqa: E402

PKG = "kembali"
UNITS = "/lib/systemd/system"
CONFIG = "/etc/kembali/kembali.json"
# what an administrator adds (and removes before a purge): not the package's
ADMIN_FILES = ["/etc/kembali/keys", "/etc/kembali/sites"]
# every place the package, its scripts or its units put something
LEFTOVER_GLOBS = ["/etc/kembali", "/etc/logrotate.d/kembali", "/usr/bin/kembali", "/usr/share/kembali",
                  "/usr/share/doc/kembali", "/usr/share/man/man8/kembali.8*", UNITS + "/kembali*",
                  "/usr/lib/tmpfiles.d/kembali*", "/usr/lib/sysusers.d/kembali*", "/var/lib/kembali",
                  "/var/log/kembali", "/run/kembali", "/var/lib/dpkg/info/kembali.*",
                  "/var/lib/systemd/deb-systemd-helper-enabled/**/kembali*",
                  "/var/lib/systemd/deb-systemd-helper-masked/kembali*", "/etc/systemd/system/**/kembali*"]
# the monitoring kit (contrib/monitoring/, docs/runbook.md)
MONITORING = "/usr/share/kembali/monitoring"
MONITORING_FILES = ["kembali.rules.yml", "kembali.rules.test.yml", "kembali.dashboard.json", "runbook.md"]
APT_ENV = dict(os.environ, DEBIAN_FRONTEND="noninteractive")


def sh(argv, timeout=300, ok=True, **kw):
    """Run argv; its output (stdout and stderr together); fail on a nonzero
    exit when ok."""
    p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, **kw)
    if ok and p.returncode != 0:
        raise AssertionError("%s exited %d:\n%s" % (" ".join(argv), p.returncode, p.stdout[-6000:]))
    return p


def installed():
    p = sh(["dpkg-query", "-W", "-f=${Status}", PKG], ok=False)
    return p.returncode == 0 and "installed" in p.stdout and "not-installed" not in p.stdout


def leftovers():
    found = []
    for g in LEFTOVER_GLOBS:
        found += glob.glob(g, recursive=True)
    for db, name in ((pwd.getpwnam, "user"), (grp.getgrnam, "group")):
        try:
            db(PKG)
            found.append("the %s %s" % (name, PKG))
        except KeyError:
            pass
    return found


def purge():
    return sh(["apt-get", "purge", "-y", "-q", PKG], env=APT_ENV).stdout


def build(tmpdir):
    """dpkg-buildpackage -us -uc -b on `git archive HEAD`: the .changes path."""
    src = os.path.join(tmpdir, "src")
    os.makedirs(src)
    archive = subprocess.run(["git", "-C", testenv.top_srcdir(), "archive", "--format=tar", "HEAD"],
                             stdout=subprocess.PIPE, check=True, timeout=60).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True, timeout=60)
    env = dict(os.environ, DEB_BUILD_OPTIONS="parallel=%d" % min(2, os.cpu_count() or 1))
    for v in ("top_builddir", "top_srcdir", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"):
        env.pop(v, None)
    p = sh(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=src, env=env, timeout=600, ok=False)
    with open(os.path.join(tmpdir, "build.log"), "w") as f:
        f.write(p.stdout)
    assert p.returncode == 0, "dpkg-buildpackage failed:\n" + p.stdout[-6000:]
    changes = glob.glob(os.path.join(tmpdir, "%s_*.changes" % PKG))
    assert_eq(len(changes), 1, "one .changes")
    return changes[0]


def lintian(changes):
    """lintian on the .changes (the .deb and the .buildinfo with it): no
    error, no warning. Its whole output (info tags too) goes to the log."""
    p = sh(["lintian", "--fail-on", "error,warning", "--display-info", changes], ok=False)
    out = "\n".join(l for l in p.stdout.splitlines() if "running with root privileges" not in l)
    print("# lintian --fail-on error,warning --display-info %s: exit %d" % (os.path.basename(changes),
                                                                                p.returncode))
    for line in out.splitlines():
        print("#   " + line)
    assert_eq(p.returncode, 0, "lintian:\n" + out)
    assert not re.search(r"^[EW]: ", out, re.M), out


def check_installed():
    files = sh(["dpkg", "-L", PKG]).stdout.split()
    for f in ["/usr/bin/kembali", "/usr/share/kembali/templates/id/succeeded.html",
              "/usr/share/kembali/templates/en/checking.html", "/usr/share/man/man8/kembali.8.gz",
              UNITS + "/kembali.service", UNITS + "/kembali.socket", UNITS + "/kembali@.service",
              UNITS + "/kembali@.socket", "/etc/logrotate.d/kembali", CONFIG, "/usr/lib/sysusers.d/kembali.conf",
              "/usr/lib/tmpfiles.d/kembali.conf"] + [MONITORING + "/" + f for f in MONITORING_FILES]:
        assert_in(f, files)
        assert os.path.isfile(f), f
    # the monitoring kit is whole where it is installed: its rules pass their tests there
    p = sh([testenv.promtool_or_skip(), "test", "rules", "kembali.rules.test.yml"], cwd=MONITORING)
    assert_in("SUCCESS", p.stdout)
    conffiles = sh(["dpkg-query", "-W", "-f=${Conffiles}", PKG]).stdout
    for f in (CONFIG, "/etc/logrotate.d/kembali"):
        assert_in(f + " ", conffiles, "conffiles")
    man = re.sub(".\b", "", sh(["mandoc", "-T", "ascii", "/usr/share/man/man8/kembali.8.gz"]).stdout)
    assert_in("--check-config", man)
    user = pwd.getpwnam(PKG)
    assert user.pw_uid < 1000, "a system user: %r" % (user,)
    assert_eq(grp.getgrgid(user.pw_gid).gr_name, PKG)
    assert_in(user.pw_shell, ("/usr/sbin/nologin", "/sbin/nologin"))
    for d, mode, group in (("/var/lib/kembali", 0o700, PKG), ("/var/log/kembali", 0o750, "adm")):
        st = os.stat(d)
        assert_eq((stat.S_IMODE(st.st_mode), pwd.getpwuid(st.st_uid).pw_name, grp.getgrgid(st.st_gid).gr_name),
                  (mode, PKG, group), d)
    # the example configuration is refused, in plain words, until its key exists
    p = sh(["runuser", "-u", PKG, "--", "kembali", "--check-config"], ok=False)
    assert_eq(p.returncode, 1, p.stdout)
    assert_in("secret_key_file: cannot open /etc/kembali/keys/toko-a: No such file or directory", p.stdout)


def unit(path, instance=None):
    """A unit file's [section] key: [values] (repeated keys in order), with
    %i as `instance`; no other specifier is expected."""
    out, section = {}, None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = line.strip("[]")
                continue
            k, _, v = line.partition("=")
            if instance is not None:
                v = v.replace("%i", instance)
            assert "%" not in v.replace("%%", ""), "an unexpected specifier in %s: %s" % (path, line)
            out.setdefault(section, {}).setdefault(k, []).append(v)
    return out


def start_as_systemd(tmpdir, name, instance=None):
    """What systemd does for NAME.socket and NAME.service (kembali or
    kembali@, as instance): the socket made at ListenStream with its owner,
    group and mode, the StateDirectory made for User, ExecStart run as
    User/Group with UMask, the socket on descriptor 3 and LISTEN_PID/
    LISTEN_FDS. Returns (socket path, process, log path)."""
    suffix = "@" if instance is not None else ""
    sock_u = unit(os.path.join(UNITS, name + suffix + ".socket"), instance)["Socket"]
    svc = unit(os.path.join(UNITS, name + suffix + ".service"), instance)["Service"]
    path = sock_u["ListenStream"][0]
    os.makedirs(os.path.dirname(path), mode=int(sock_u["DirectoryMode"][0], 8), exist_ok=True)
    if os.path.exists(path):
        os.unlink(path)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(128)
    os.chown(path, pwd.getpwnam(sock_u["SocketUser"][0]).pw_uid, grp.getgrnam(sock_u["SocketGroup"][0]).gr_gid)
    os.chmod(path, int(sock_u["SocketMode"][0], 8))
    user, group = svc["User"][0], svc["Group"][0]
    for d in svc.get("StateDirectory", []):
        full = os.path.join("/var/lib", d)
        os.makedirs(full, exist_ok=True)
        os.chown(full, pwd.getpwnam(user).pw_uid, grp.getgrnam(group).gr_gid)
        os.chmod(full, int(svc.get("StateDirectoryMode", ["0755"])[0], 8))
    argv = shlex.split(svc["ExecStart"][0])
    log_path = os.path.join(tmpdir, "%s%s.log" % (name, instance or ""))
    log = open(log_path, "wb")
    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LISTEN_FDS": "1",
           "LISTEN_FDNAMES": os.path.basename(path)}
    # systemd sets LISTEN_PID to the service's own pid: a shell that execs keeps it
    proc = testenv.spawn(["/bin/sh", "-c", 'LISTEN_PID=$$ exec "$@"', "sh"] + argv, tmpdir, env=env,
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, user=user, group=group,
                         extra_groups=[], umask=int(svc["UMask"][0], 8), cwd="/", pass_fds=(3,),
                         preexec_fn=lambda: os.dup2(lsock.fileno(), 3))
    lsock.close()
    return path, proc, log_path


def answer(sock_path, sb, tx, host):
    sb.put_tx(tx, "succeeded")

    def get():
        try:
            return testenv.get(sock_path, "id=" + tx, host=host)
        except testenv.FcgiError:
            return None
    r = testenv.wait_for(get, 30, msg="an answer on " + sock_path)
    assert_eq((r.status, r.header("kembali-status")), (200, "succeeded"), r)
    assert_in(b'data-status="succeeded"', r.stdout)
    assert_eq(len(sb.reads(tx)), 1, "one read of %s, with the shop's key" % tx)


def serve(tmpdir, sb, name, config_path, instance=None):
    """The installed kembali, configured at config_path (the example, as an
    administrator edits it: the key where it says, the sandbox as api_base),
    started as the units do; one real answer through its socket."""
    with open("/usr/share/doc/kembali/examples/kembali.json") as f:
        example = f.read()
    key = "/etc/kembali/keys/%s" % (instance or "toko-a")
    cfg = example.replace('"https://pay.kasera.id"', '"%s"' % sb.base).replace("/etc/kembali/keys/toko-a", key)
    if instance is not None:
        cfg = cfg.replace('"/var/lib/kembali"', '"/var/lib/kembali/%s"' % instance)
    assert_in(sb.base, cfg)
    os.makedirs(os.path.dirname(key), exist_ok=True)
    os.makedirs(os.path.dirname(config_path), exist_ok=True)
    with open(key, "w") as f:
        f.write(kit.KEY + "\n")
    os.chown(key, 0, grp.getgrnam(PKG).gr_gid)
    os.chmod(key, 0o640)
    with open(config_path, "w") as f:
        f.write(cfg)
    path, proc, log_path = start_as_systemd(tmpdir, name, instance)
    st = os.stat(path)
    assert_eq((stat.S_IMODE(st.st_mode), grp.getgrgid(st.st_gid).gr_name), (0o660, "www-data"),
              "the socket: the web server's group only")
    answer(path, sb, "pkg-%s" % (instance or name), "toko-a.example")
    # the state is the unit's StateDirectory, as the configuration says
    state = os.path.join("/var/lib/kembali", instance or "", "kembali-v%d.state" % testenv.state_layout())
    assert_eq(pwd.getpwuid(os.stat(state).st_uid).pw_name, PKG, state)
    p = sh(["runuser", "-u", PKG, "--", "kembali", "--check-config", "--config", config_path], ok=False)
    proc.terminate()
    assert_eq(proc.wait(30), 0, "kembali ended by SIGTERM; log:\n" + open(log_path).read())
    assert_eq((p.returncode, p.stdout.split(" 1 shop")[0]), (0, config_path + ": ok:"),
              "--check-config as the user kembali: " + p.stdout)


@testenv.timeout(600)
def test_package(tmpdir):
    if os.geteuid() != 0:
        raise testenv.Skip("installs a package: run as root")
    for tool in ("dpkg-buildpackage", "lintian", "git", "apt-get", "runuser"):
        if shutil.which(tool) is None:
            raise AssertionError("%s is not installed (contrib/deps installs it)" % tool)
    if installed():
        raise AssertionError("the package kembali is installed here: this test installs and purges its own; "
                             "remove it first (apt-get purge kembali)")
    assert_eq(leftovers(), [], "nothing of kembali before the test")
    changes = build(tmpdir)
    lintian(changes)
    deb = glob.glob(os.path.join(tmpdir, "%s_*.deb" % PKG))
    assert_eq(len(deb), 1, deb)
    try:
        sh(["apt-get", "install", "-y", "-q", "--no-install-recommends", deb[0]], env=APT_ENV)
        check_installed()
        sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
        serve(tmpdir, sb, "kembali", CONFIG)
        serve(tmpdir, sb, "kembali", "/etc/kembali/sites/site1.json", instance="site1")
    finally:
        for d in ADMIN_FILES:  # the administrator's files: theirs to remove
            shutil.rmtree(d, ignore_errors=True)
        out = purge() if installed() else ""
    assert_eq(installed(), False)
    assert_eq(leftovers(), [], "nothing of kembali after apt-get purge:\n" + out)

