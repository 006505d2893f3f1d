"""Versions side by side (docs/operations.md): two kembali versions on one
state_dir, or on one Redis, as a rolling restart or a package upgrade with
spawn-fcgi children runs them for a while. The other version is
tests/kembali-testing (this build with KEMBALI_TESTING) told another layout
(KEMBALI_TEST_LAYOUT) or Redis schema (KEMBALI_TEST_REDIS_SCHEMA): what
differs between two releases is the version in the names, which is what
these tests drive."""

import os
import time

import testenv
import kit
from testenv import assert_eq, assert_in


def _kembali(tmpdir, sb, name, top=None, bin=None, env=None, schedule=kit.FAST):
    def config(k):
        extra = dict(top or {}, schedule_ms=schedule)
        return testenv.make_config(sb, [testenv.make_shop("toko-a", k.key_path("a"))], **extra)
    k = testenv.Kembali(tmpdir, config=config, keys={"a": kit.KEY}, name=name, bin=bin, env=env)
    return k.start()


SCHEDULE_START = [0, 1500, 2000, 3000]  # the default schedule's first waits: a hold of 8 s


def _ok(sb, id):
    """The reads of id Kasera answered (another version's read within the
    same second gets the per-transaction 429: two paces)."""
    return [r for r in sb.reads(id) if r["http"] == 200]


def _layout_warnings(k):
    return [l for l in k.find_log(event="state", level="warn") if "another state layout" in l.get("msg", "")]


@testenv.timeout(120)
def test_two_layouts_on_one_state_dir(tmpdir):
    """The new version started beside a live old one (another state layout)
    neither replaces nor changes the old's file: the old keeps its cache
    (its succeeded answers again with no read) and its pace; the new one
    uses its own file and says so once; both answer held requests; once
    the old has stopped, the new one's next start removes the old file."""
    mine = testenv.state_layout()
    old_v = mine - 1
    state = os.path.join(tmpdir, "state")
    old_file = os.path.join(state, "kembali-v%d.state" % old_v)
    new_file = os.path.join(state, "kembali-v%d.state" % mine)
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    old = _kembali(tmpdir, sb, "old", bin=testenv.kembali_testing_bin(), env={"KEMBALI_TEST_LAYOUT": old_v},
                   schedule=SCHEDULE_START)  # room for two paces (rules_tx_limited_wait)
    sb.put_tx("c1", "succeeded")
    assert_eq(old.get("id=c1").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("c1")), 1)
    assert os.path.exists(old_file)
    old_inode = os.stat(old_file).st_ino

    new = _kembali(tmpdir, sb, "new", schedule=SCHEDULE_START)
    sb.put_tx("c2", "canceled")
    assert_eq(new.get("id=c2").header("kembali-status"), "canceled")  # it has opened its state
    w = _layout_warnings(new)
    assert_eq(len(w), 1, "said once: %r" % w)
    assert_eq(w[0]["other_layouts"], str(old_v))
    assert_eq([l for l in new.find_log(event="state") if "replacing" in l.get("msg", "")], [])
    assert_eq(os.stat(old_file).st_ino, old_inode, "the old file is not replaced")
    assert os.path.exists(new_file)
    # the old one's cache is its own and intact: no read
    assert_eq(old.get("id=c1").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("c1")), 1, "the old one's cached succeeded answered without a read")
    # the new one answers from its own pace and cache
    assert_eq(new.get("id=c1").header("kembali-status"), "succeeded")
    assert_eq(len(_ok(sb, "c1")), 2)
    n = len(sb.reads("c1"))
    assert_eq(new.get("id=c1").header("kembali-status"), "succeeded")
    assert_eq(old.get("id=c1").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("c1")), n, "each answers from its own cache")

    # held requests on both sides for one transaction paid at 2.5 s: two
    # paces, never in lockstep; every buyer sees succeeded
    sb.put_tx("p1", [(0, "pending"), (2500, "succeeded")])
    rs = kit.parallel([lambda k=k: k.get("id=p1", timeout=30) for k in (old, new) for _ in range(3)])
    assert_eq([r.header("kembali-status") for r in rs], ["succeeded"] * 6)
    reads = sb.reads("p1")
    print("# two layouts, one transaction: reads %r" % [(round(r["t_ms"]), r["http"]) for r in reads])
    assert_eq(len(_layout_warnings(new)), 1, "said once")

    # the old one stops: the new one's next start removes its file
    assert_eq(old.stop(), 0)
    assert os.path.exists(old_file), "removed at a start, not behind a running process"
    assert_eq(new.stop(), 0)
    new.start()
    assert_eq(new.get("id=c2").header("kembali-status"), "canceled")
    assert not os.path.exists(old_file)
    assert not os.path.exists(os.path.join(state, "kembali-v%d.users" % old_v))
    gone = [l for l in new.find_log(event="state") if "removed the state files" in l.get("msg", "")]
    assert_eq(len(gone), 1, "one line: %r" % gone)
    assert_eq(gone[0]["other_layouts"], str(old_v))
    assert_eq(len(sb.reads("c2")), 1, "the new one's own file kept its cache across the restart")


@testenv.timeout(120)
def test_one_layout_tx_limited_moves_away(tmpdir):
    """Two layouts read one transaction on two separate paces, b's buyer
    0.3 s after a's: Kasera's per-transaction window refuses b's reads
    (429 with Retry-After), and on one schedule b's next read would land
    0.3 s behind a's next for ever (lockstep). From b's second refusal in a
    row its schedule's wait counts from the window's end (rules.h,
    rules_tx_limited_wait): its next read comes a second after a's, so each
    side gets 200s, never only refusals, and neither side's reads start
    less than 1.1 s apart. The default schedule's first steps (a schedule
    of 1.1 s waits leaves no room for two paces at all)."""
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    a = _kembali(tmpdir, sb, "a", bin=testenv.kembali_testing_bin(),
                 env={"KEMBALI_TEST_LAYOUT": testenv.state_layout() - 1}, schedule=SCHEDULE_START)
    b = _kembali(tmpdir, sb, "b", schedule=SCHEDULE_START)
    sb.put_tx("p2", "pending")
    def b_later():
        time.sleep(0.3)  # b's buyer comes 0.3 s after a's: inside a's window, the episode's point (not a race)
        return b.get("id=p2", timeout=30)
    rs = kit.parallel([lambda: a.get("id=p2", timeout=30), b_later])
    assert_eq([r.header("kembali-status") for r in rs], ["checking"] * 2)
    reads = sb.reads("p2")
    print("# two paces on one transaction: %r" % [(round(r["t_ms"]), r["http"]) for r in reads])
    for k in (a, b):
        ok = [l for l in k.find_log(event="read", id="p2") if l.get("http") == "200"]
        assert ok, "%s read p2 with a 200 at least once: %r" % (k.name, k.find_log(event="read", id="p2"))
        starts = kit.read_starts([k], "p2")
        assert kit.min_gap(starts) is None or kit.min_gap(starts) >= 1.1 - 0.003, "%s: reads %r" % (k.name, starts)


@testenv.timeout(120)
def test_two_redis_schemas_keep_their_own_keys(tmpdir):
    """Two hosts of two versions on one Redis (a rolling upgrade): each
    writes only keys of its own schema (PREFIXvN:{K}...), so neither reads
    or damages the other's; each answers; the cost is one more pace per
    transaction while both run."""
    redis = testenv.Redis(tmpdir)
    mine, other = testenv.redis_schema(), testenv.redis_schema() + 1
    sb = testenv.Sandbox(tmpdir, keys=(kit.KEY,))
    hosts = []
    for i, (bin, env) in enumerate([(None, None),
                                    (testenv.kembali_testing_bin(), {"KEMBALI_TEST_REDIS_SCHEMA": other})]):
        state = os.path.join(tmpdir, "state-h%d" % i)
        os.makedirs(state, mode=0o700, exist_ok=True)
        hosts.append(_kembali(tmpdir, sb, "h%d" % i, top={"redis": redis.unix_url(), "state_dir": state}, bin=bin, env=env))
    for k in hosts:
        k.wait_log(30, event="redis_joined")
    sb.put_tx("s1", "succeeded")
    assert_eq(hosts[0].get("id=s1").header("kembali-status"), "succeeded")
    assert_eq(hosts[1].get("id=s1").header("kembali-status"), "succeeded")
    assert_eq(len(_ok(sb, "s1")), 2, "one read per version: each has its own keys")
    n = len(sb.reads("s1"))
    assert_eq(hosts[1].get("id=s1").header("kembali-status"), "succeeded")
    assert_eq(hosts[0].get("id=s1").header("kembali-status"), "succeeded")
    assert_eq(len(sb.reads("s1")), n, "each version's cache answers its own")
    names = sorted(n.decode() if isinstance(n, bytes) else n for n in redis.keys("*"))
    mine_n = [n for n in names if n.startswith("kembali:v%d:{" % mine)]
    other_n = [n for n in names if n.startswith("kembali:v%d:{" % other)]
    assert_eq(sorted(mine_n + other_n), names, "every key carries one of the two schemas")
    assert [n for n in mine_n if n.endswith("}t:s1")], names
    assert [n for n in other_n if n.endswith("}t:s1")], names
    assert_in("succeeded", str(redis.cmd("HGETALL", [n for n in other_n if n.endswith("}t:s1")][0])))
