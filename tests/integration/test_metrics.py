"""The metrics page parses: Prometheus's own `promtool check metrics` (the
Debian package prometheus) finds nothing to say about it, with Redis (a real
redis-server) and without, after enough activity that every counter and
gauge has moved: reads, held requests, a 404, a 405, a notify by
`kembali --notify`. Every metric has one # HELP and one # TYPE."""

import os
import re
import subprocess
import threading

import testenv
import kit
from testenv import assert_eq, assert_in

# The names dashboards and the other tests know (metrics.c's table); each
# must be on the page, with its HELP and TYPE.
NAMES = [
    "kembali_answers_total", "kembali_method_not_allowed_total", "kembali_api_reads_total",
    "kembali_api_reads_started_total", "kembali_api_connections_total", "kembali_held_requests",
    "kembali_held_requests_peak", "kembali_answers_without_wait_total", "kembali_probe_answers_total",
    "kembali_held_cap_answers_total", "kembali_fastcgi_connections", "kembali_fastcgi_connections_total",
    "kembali_state_entries", "kembali_state_slots", "kembali_state_evictions_total", "kembali_state_full_total",
    "kembali_reads_reserved", "kembali_last_chance_reads_total", "kembali_state_recoveries_total",
    "kembali_state_repairs_total", "kembali_state_stale_locks_total", "kembali_state_keys",
    "kembali_state_key_slots", "kembali_state_key_evictions_total", "kembali_state_key_full_total",
    "kembali_clients_blocked", "kembali_client_blocks_total", "kembali_client_full_total",
    "kembali_notify_conflicts_total", "kembali_state_slots_per_key", "kembali_state_quota_full_total",
]
REDIS_NAMES = [
    "kembali_redis_up", "kembali_redis_joins_total", "kembali_redis_leaves_total",
    "kembali_redis_round_trips_total", "kembali_redis_pings_total", "kembali_redis_claims_total",
    "kembali_redis_claims_granted_total", "kembali_redis_messages_total", "kembali_redis_written_back_total",
    "kembali_redis_seeded_total",
]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$")


def promtool(text):
    """`promtool check metrics` on text: (exit status, what it printed)."""
    p = subprocess.run([testenv.promtool_or_skip(), "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def families(text):
    """{name: {"help": n, "type": [types], "samples": n}} of an exposition
    text; a sample line must match the family its TYPE announced last."""
    out = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name, _, rest = line[7:].partition(" ")
            f = out.setdefault(name, {"help": 0, "type": [], "samples": 0})
            if line.startswith("# HELP "):
                f["help"] += 1
            else:
                f["type"].append(rest)
            current = name
            continue
        m = _SAMPLE.match(line)
        assert m, "not a sample line: %r" % line
        assert_eq(m.group(1), current, "sample %r outside its family" % line)
        out[current]["samples"] += 1
    return out


def check_page(k, redis):
    """The page parses (promtool prints nothing) and names every metric,
    each with one HELP and one TYPE; with Redis its metrics too. Returns the
    page's values (testenv.parse_metrics)."""
    r = k.get("format=metrics", extra={"KEMBALI_ADMIN": "1"})
    text = r.text
    rc, said = promtool(text)
    print("# page of %d bytes, %d lines: promtool exit %d%s" % (len(text), text.count("\n"), rc,
                                                            ", said:\n" + said if said else ""))
    assert_eq(said, "", "promtool check metrics says nothing")
    assert_eq(rc, 0)
    fams = families(text)
    for name, f in sorted(fams.items()):
        assert_eq((f["help"], len(f["type"])), (1, 1), "%s: one HELP and one TYPE" % name)
        assert f["samples"] >= 1, name
        assert_eq(f["type"][0] == "counter", name.endswith("_total"), "%s: counters, and only they, end in _total"
                  % name)
    want = NAMES + (REDIS_NAMES if redis else [])
    missing = [n for n in want if n not in fams]
    assert_eq(missing, [], "every metric on the page")
    if not redis:
        assert_eq([n for n in fams if n.startswith("kembali_redis_")], [], "no Redis, no Redis metrics")
    return testenv.parse_metrics(text)


def exercise_and_check(tmpdir, k, sb, redis):
    """Reads, a 404, a 405, held requests answered by `kembali --notify`;
    the page checked while requests are held, and after."""
    sb.put_tx("paid", "succeeded")
    assert_eq(k.get("id=paid").header("kembali-status"), "succeeded")
    assert_eq(k.get("id=paid").header("kembali-status"), "succeeded")  # answered without a read
    assert_eq(k.get("id=nobody-paid").header("kembali-status"), "not_found")
    assert_eq(k.get("id=paid", method="POST").header("kembali-status"), "invalid")
    sb.put_tx("wait", "pending")
    out = [None] * 3

    def one(i):
        out[i] = k.get("id=wait", timeout=30)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    testenv.wait_for(lambda: k.metrics().get("kembali_held_requests") == 3, 30, msg="3 requests held")
    m = check_page(k, redis)
    assert_eq(m["kembali_held_requests"], 3.0)
    p = subprocess.run([testenv.kembali_bin(), "--config", k.config_path, "--notify", "toko-a", "wait", "succeeded"],
                       capture_output=True, text=True, timeout=30)
    assert_eq(p.returncode, 0, p.stderr)
    for t in ts:
        t.join(60)
    assert_eq([r.header("kembali-status") for r in out], ["succeeded"] * 3)
    m = check_page(k, redis)
    assert_eq(m['kembali_answers_total{status="succeeded"}'], 5.0)
    assert_eq(m['kembali_answers_total{status="not_found"}'], 1.0)
    assert_eq(m["kembali_method_not_allowed_total"], 1.0)
    assert m['kembali_api_reads_total{outcome="status"}'] >= 2, m  # paid, and wait's first
    assert_eq(m['kembali_api_reads_total{outcome="not_found"}'], 1.0)
    assert m["kembali_answers_without_wait_total"] >= 1, m
    assert_eq(m["kembali_held_requests"], 0.0)
    assert m["kembali_held_requests_peak"] >= 3, m
    assert m["kembali_fastcgi_connections_total"] >= 8, m
    assert m["kembali_state_entries"] >= 2, m
    if redis:
        # a reply later than 100 ms (a sanitizer build on a busy machine)
        # sends the process to its own state until Redis answers again, and
        # the page says so: it shows 1 once the process has rejoined
        def up_again():
            page = k.metrics()
            return page if page["kembali_redis_up"] == 1.0 else None
        m = testenv.wait_for(up_again, 15, msg="kembali_redis_up 1 again")
        assert m["kembali_redis_joins_total"] >= 1, m
        assert_eq(m["kembali_redis_joins_total"], m["kembali_redis_leaves_total"] + 1, "joins: the first and rejoins")
        assert m["kembali_redis_round_trips_total"] >= 1, m
        assert m["kembali_redis_claims_total"] >= 1, m
        if m["kembali_redis_leaves_total"] == 0:  # away, it hears no message
            assert m["kembali_redis_messages_total"] >= 1, m  # the --notify's message
    return m


# held long enough for the page's checks and `--notify` on a busy machine
# (a sanitizer build, promtool beside it): FAST holds 4.8 s
HOLD_LONG = [0, 10000, 10000]


@testenv.timeout(120)
def test_metrics_page_parses_without_redis(tmpdir):
    sb, k = kit.start(tmpdir, schedule=HOLD_LONG)
    exercise_and_check(tmpdir, k, sb, redis=False)


@testenv.timeout(120)
def test_metrics_page_parses_with_redis(tmpdir):
    redis = testenv.Redis(tmpdir)
    sb, ks = kit.start_hosts(tmpdir, 1, redis, schedule=HOLD_LONG, top={"redis": redis.unix_url()})
    k = ks[0]
    k.wait_log(30, event="redis_joined")
    exercise_and_check(tmpdir, k, sb, redis=True)


def test_missing_promtool_skips_unless_required(tmpdir):
    missing = os.path.join(tmpdir, "no-promtool")
    try:
        testenv.promtool_or_skip(env={"PROMTOOL": missing})
    except testenv.Skip as e:
        assert_in("not installed", str(e))
    else:
        raise AssertionError("no Skip")
    try:
        testenv.promtool_or_skip(env={"PROMTOOL": missing, "KEMBALI_REQUIRE_SERVERS": "1"})
    except testenv.Skip:
        raise AssertionError("Skip although KEMBALI_REQUIRE_SERVERS=1") from None
    except AssertionError as e:
        assert_in("KEMBALI_REQUIRE_SERVERS=1", str(e))
    else:
        raise AssertionError("no failure")


if __name__ == "__main__":
    testenv.run(globals())
